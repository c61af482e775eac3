from .op import dsa_index_scores, dsa_topk_logits  # noqa: F401
