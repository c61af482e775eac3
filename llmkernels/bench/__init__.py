"""One benchmark harness for every op: timing, L2-cold inputs, floors, peers, records, plots."""
from .harness import Case, Impl, OpBench, run_op_bench

__all__ = ["Case", "Impl", "OpBench", "run_op_bench"]
