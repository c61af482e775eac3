"""row_topk: the positions of the k largest values of each fp32 row (a radix select over many programs a row)."""
from .op import row_topk

__all__ = ["row_topk"]
