"""Single-token GQA decode with a per-token drop mask (dropped tokens are never read)."""
from .op import masked_decode

__all__ = ["masked_decode"]
