"""Benchmark cases and peers of xl_paged_decode for `llmkernels bench` (its checks: llmkernels.ops.xl_paged_decode)."""
import torch

from .. import Case, Impl, OpBench
from ..peers import compiled_flex, flex_available
from ...ops.xl_paged_decode.reference import cache_as_nhd
from ...ops.xl_paged_decode.spec import make_inputs, run, ref


H, HKV, D, BS = 16, 16, 128, 16  # MHA like the Conformer / Transformer-XL models
SHAPES = [(64, 4096), (4, 32768)]


def _bytes(S, L, esize=2):
    kv = 2 * S * L * HKV * D * esize  # every attended K and V row once
    bd = S * H * L * esize
    return int(kv + bd + 2 * S * H * D * esize + H * D * esize + S * (L // BS) * 4 + S * 4)  # + q, out, u, table, lens


def _cases(quick):
    cases = []
    for S, L in SHAPES:
        for layout in ("nhd", "legacy"):
            mk = lambda S=S, L=L, layout=layout: make_inputs(  # noqa: E731
                S, H, HKV, D, BS, L, layout, torch.float16, "cuda", u="head", bd="contig", extra_blocks=0,
                garbage=False, table_pad=0)
            cases.append(Case(shape={"num_seqs": S, "context": L, "H": H, "Hkv": HKV, "D": D, "block_size": BS,
                                     "layout": layout, "dtype": "fp16"},
                              make_inputs=mk, bytes=_bytes(S, L), flops=4 * S * H * L * D, write_bytes=S * H * D * 2))
    return cases


def _ours(x):
    return lambda: run(x)


def _eager(x):
    return lambda: ref(x)


def _flex(x):
    """FlexAttention on the cache gathered to dense [S, Hkv, L, D] (outside the timing); bd via score_mod."""
    flex = compiled_flex()
    k, v = cache_as_nhd(x["k_cache"], x["v_cache"])
    S, Hq, Dh = x["q"].shape
    bs = k.shape[1]
    L = int(x["context_lens"].max())
    idx = x["block_tables"].long()[:, : L // bs]
    kd = k[idx].reshape(S, L, k.shape[2], Dh).transpose(1, 2).contiguous()
    vd = v[idx].reshape(S, L, v.shape[2], Dh).transpose(1, 2).contiguous()
    scale = Dh ** -0.5
    bds = (x["bd"].float() * scale).contiguous()  # flex scales q.k before score_mod; bd needs the same scale

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + bds[b, h, kv_idx]

    q, u = x["q"], x["u"]
    return lambda: flex((q + u)[:, :, None, :], kd, vd, score_mod=score_mod, scale=scale,
                                  enable_gqa=Hq != kd.shape[1])


def benches():
    return [OpBench("xl_paged_decode", _cases, [
        Impl("llmkernels", _ours),
        Impl("torch-eager", _eager, max_bytes=3 << 30),
        Impl("flex-attention-dense", _flex, flex_available),
    ])]
