"""Decode with a compact banded relative-position bias and an optional sliding window (Inkling's attention)."""
from .op import inkling_decode

__all__ = ["inkling_decode"]
