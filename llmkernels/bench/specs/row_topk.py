"""Benchmark cases and peers of row_topk for `llmkernels bench` (its checks: llmkernels.ops.row_topk.spec): the DSA
indexer's top 2048 of a decode step's scores (one row per sequence), against torch.topk (unsorted) as the indexer ran
it. Latency-bound: the floor (the scores read once) is a few microseconds at most, so reports give no % of it."""
import torch

from .. import Case, Impl, OpBench
from ...ops.row_topk.op import row_topk
from ...ops.row_topk.reference import row_topk_ref
from ...ops.row_topk.spec import make_inputs

SHAPES = [(1, 65537, 2048), (1, 131073, 2048), (4, 65537, 2048), (32, 16384, 2048), (1, 4097, 2048), (8, 8193, 2048)]


def _cases(quick):
    return [Case(shape={"R": R, "N": N, "k": k}, timing="graph", bound="latency", bytes=R * N * 4 + R * k * 4,
                 write_bytes=R * k * 4,
                 make_inputs=lambda R=R, N=N, k=k: {**make_inputs(R, N, torch.device("cuda")), "k": k})
            for R, N, k in (SHAPES[:1] if quick else SHAPES)]


def _ours(x):
    return lambda: row_topk(x["x"], x["k"])


def _torch(x):
    return lambda: row_topk_ref(x["x"], x["k"])


def benches():
    return [OpBench("row_topk", _cases, [Impl("llmkernels", _ours), Impl("torch-topk", _torch)])]
