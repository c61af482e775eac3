"""moe_topk: a mixture-of-experts router's softmax, top-k and renormalisation in one launch."""
from .op import moe_topk

__all__ = ["moe_topk"]
