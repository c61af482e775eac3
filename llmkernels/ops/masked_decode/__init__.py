"""Single-token GQA decode with a per-token drop mask or kept lists (dropped tokens are never read)."""
from .op import kept_lists, masked_decode

__all__ = ["masked_decode", "kept_lists"]
