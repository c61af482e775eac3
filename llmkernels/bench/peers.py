"""Peer implementations shared by several ops' benchmarks (each optional: skipped with a reason when missing)."""
import functools
from typing import Optional

import torch


def flex_available() -> Optional[str]:
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    except ImportError as e:
        return f"FlexAttention not in this torch ({e})"
    return None


@functools.lru_cache(maxsize=None)
def compiled_flex():
    """torch.compile'd flex_attention, built once per process (the eager one materialises the scores)."""
    from torch.nn.attention.flex_attention import flex_attention
    return torch.compile(flex_attention, dynamic=False)
