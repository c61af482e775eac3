from .op import dsa_index_scores  # noqa: F401
