"""Paged-KV decode with Transformer-XL terms (content bias u, positional bd)."""
from .op import xl_paged_decode

__all__ = ["xl_paged_decode"]
