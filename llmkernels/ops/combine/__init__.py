"""The split-KV log-sum-exp merge shared by every split op (kernel.combine), and its public face."""
from .op import merge_attention_states

__all__ = ["merge_attention_states"]
