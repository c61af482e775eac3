"""Argument checks and canonical form shared by the sparse MLA forward, attention distribution and backward."""
from dataclasses import dataclass, replace
from typing import NamedTuple, Optional, Union

import torch
import triton
import triton.language as tl

from ..._config import KernelConfig
from ..._constants import LN2, LN2_C, LOG2E, LOG2E_C  # noqa: F401  (re-exported to the sparse MLA modules)
from ..._launch import skey, tkey
from ..._validate import (check_int, check_interpreter_dtype, check_same_device, check_scale, check_tensor,
                          check_unit_last_stride)


@triton.jit
def row_finish(m2, l, sink_ptr, offs_h, hmask, HAS_SINK: tl.constexpr, SINK_IN_LSE: tl.constexpr):
    """(empty, lse2, denom) of rows whose log2-scaled logits have max m2 and sum of exp2(s - m2) l: out = O / denom,
    lse2 the log2-sum-exp2 (with the sink's share when SINK_IN_LSE); meaningless where empty (nothing valid).
    A NaN logit makes l, and so lse2 and denom, NaN."""
    empty = (m2 == float("-inf")) & (l == 0)  # all-NaN logits: max -inf on the GPU (max drops NaN), l NaN
    l_safe = tl.where(empty, 1.0, l)
    lse2 = m2 + tl.log2(l_safe)
    denom = l_safe
    if HAS_SINK:
        d = tl.load(sink_ptr + offs_h, mask=hmask, other=0.0) * LOG2E_C - lse2  # +-inf at worst on non-empty rows
        sp = tl.maximum(d, 0.0) + tl.log2(1.0 + tl.exp2(-tl.abs(d)))  # log2(1 + 2^d) without overflow
        denom = l_safe * tl.exp2(sp)  # = sum p + exp(sink - m); +inf sink -> out 0
        if SINK_IN_LSE:
            lse2 = lse2 + sp
    return empty, lse2, denom


@triton.jit
def nan_max(m, l):
    """max_logits as stored: the running max m, NaN where the sum l is (the GPU's max drops NaN logits; their exp2
    makes l NaN). l * 0 is 0 for every finite l, and l is finite unless a logit was NaN."""
    return m + l * 0.0


DTYPES = (torch.bfloat16, torch.float16)  # bf16 is the model's dtype; fp16 also runs (and is what CPU tests use)
D_QK = (576, 512)
D_V = 512


@dataclass(frozen=True)
class TileConfig(KernelConfig):
    """The portable Triton forward / attn_dist kernels: head block, kv rows a tile, warps, pipeline depth, and index
    prefetch one tile ahead (fwd.fwd_config / attn_dist.dist_config pick them)."""
    BLOCK_H: int = 64
    BLOCK_N: int = 64
    num_warps: int = 4
    num_stages: int = 2
    PREFETCH: bool = False

    def kernel_kwargs(self) -> dict:
        return dict(BLOCK_N=self.BLOCK_N, num_warps=self.num_warps, num_stages=self.num_stages,
                    PREFETCH=self.PREFETCH)


@dataclass
class SparseArgs:
    q: torch.Tensor                 # [s_q, h_q, d_qk], unit last stride
    kv: torch.Tensor                # [s_kv, d_qk], unit last stride (the single latent head squeezed)
    indices: torch.Tensor           # [s_q, topk] int32, unit last stride
    sm_scale: float
    d_v: int
    attn_sink: Optional[torch.Tensor]    # [h_q] fp32 contiguous
    topk_length: Optional[torch.Tensor]  # [s_q] int32 contiguous
    causal: bool
    q_start_int: int                      # used when causal and q_start_t is None
    q_start_t: Optional[torch.Tensor]     # int32 [1] on the device (no host sync), when given as a tensor
    k_stride: int


def prepare(q, kv, indices, sm_scale, d_v: int = D_V, attn_sink=None, topk_length=None,
            q_start: Union[None, int, torch.Tensor] = None, k_stride: int = 1) -> SparseArgs:
    check_tensor("q", q, dtypes=DTYPES, ndim=3)
    check_tensor("kv", kv, ndim=(2, 3))
    if kv.dtype != q.dtype:
        raise TypeError(f"kv must have q's dtype {q.dtype}, got {kv.dtype}")
    s_q, h_q, d_qk = q.shape
    if d_qk not in D_QK:
        raise ValueError(f"q's last dim d_qk must be one of {D_QK}, got {d_qk}")
    if kv.dim() == 3:
        if kv.shape[1] != 1:
            raise ValueError(f"kv must be [s_kv, 1, d_qk] (one latent head), got shape {tuple(kv.shape)}")
        kv = kv[:, 0]
    if kv.shape[1] != d_qk:
        raise ValueError(f"kv's last dim must equal q's d_qk={d_qk}, got {kv.shape[1]}")
    if sm_scale is None:
        raise TypeError("sm_scale is required (DeepSeek's scale is not d_qk ** -0.5)")
    sm_scale = check_scale("sm_scale", sm_scale)
    d_v = check_int("d_v", d_v)
    if d_v != D_V:
        raise ValueError(f"d_v must be {D_V} (V is the first 512 dims of kv), got {d_v}")
    check_tensor("indices", indices, dtypes=(torch.int32,), ndim=(2, 3))
    if indices.dim() == 3:
        if indices.shape[1] != 1:
            raise ValueError(f"indices must be [s_q, topk] or [s_q, 1, topk], got shape {tuple(indices.shape)}")
        indices = indices[:, 0]
    if indices.shape[0] != s_q:
        raise ValueError(f"indices must have s_q={s_q} rows, got shape {tuple(indices.shape)}")
    if indices.shape[1] < 1:
        raise ValueError("indices must hold topk >= 1 entries per row")
    for name, t in (("q", q), ("kv", kv), ("indices", indices)):
        check_unit_last_stride(name, t)
    if attn_sink is not None:
        check_tensor("attn_sink", attn_sink, dtypes=(torch.float32,), ndim=1)
        if attn_sink.shape[0] != h_q:
            raise ValueError(f"attn_sink must be [h_q={h_q}], got shape {tuple(attn_sink.shape)}")
        attn_sink = attn_sink.contiguous()
    if topk_length is not None:
        check_tensor("topk_length", topk_length, dtypes=(torch.int32,), ndim=1)
        if topk_length.shape[0] != s_q:
            raise ValueError(f"topk_length must be [s_q={s_q}], got shape {tuple(topk_length.shape)}")
        topk_length = topk_length.contiguous()
    k_stride = check_int("k_stride", k_stride, lo=1, hi=2**31 - 1)
    q_start_t, q_start_int = None, 0
    if isinstance(q_start, torch.Tensor):
        check_tensor("q_start", q_start, dtypes=(torch.int32,))
        if q_start.numel() != 1:
            raise ValueError(f"q_start must be an int or a one-element int32 tensor, got shape {tuple(q_start.shape)}")
        q_start_t = q_start.reshape(1)
    elif q_start is not None:
        # from s_kv * k_stride on, every row's causal limit is >= s_kv - 1: the same as that value, and it fits int64
        q_start_int = min(check_int("q_start", q_start, lo=0), kv.shape[0] * k_stride)
    check_same_device(q=q, kv=kv, indices=indices, attn_sink=attn_sink, topk_length=topk_length, q_start=q_start_t)
    check_interpreter_dtype(q=q)
    return SparseArgs(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, q_start is not None,
                      q_start_int, q_start_t, k_stride)


def call_key(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, q_start, k_stride) -> tuple:
    """The plan key parts of prepare's raw arguments (the op's key adds its site and the device): a call with this key
    passed the same checks."""
    qs = tkey(q_start) if isinstance(q_start, torch.Tensor) else skey(q_start)
    return (tkey(q), tkey(kv), tkey(indices), skey(sm_scale), skey(d_v), tkey(attn_sink), tkey(topk_length), qs,
            skey(k_stride))


def bare(a: SparseArgs) -> SparseArgs:
    """A checked call's canonical scalars, without its tensors (a cache must not keep them alive)."""
    return replace(a, q=None, kv=None, indices=None, attn_sink=None, topk_length=None, q_start_t=None)


class Checked(NamedTuple):
    """What a direct call of a checked key keeps (the ops' plan caches): the canonical scalars (bare), the plan token
    (_launch.run_planned), a kept plan or None, and whether the caller's raw tensors may stand for the canonical ones
    (rebind_is_view)."""
    args: SparseArgs
    token: int
    plan: object
    raw_ok: bool

    def raw_plan(self):
        """The kept plan, where it may run on the caller's raw tensors now (its kernels kept), else None."""
        return self.plan if self.plan is not None and self.raw_ok and self.plan.direct() else None


def rebind_is_view(attn_sink, topk_length) -> bool:
    """rebind makes no copy: its canonical tensors are views of the raw ones at the same addresses (which is all a
    kept kernel reads)."""
    return all(t is None or t.is_contiguous() for t in (attn_sink, topk_length))


def rebind(a: SparseArgs, q, kv, indices, attn_sink, topk_length, q_start) -> SparseArgs:
    """prepare's result for raw arguments whose call_key equals that of the call `a` came from (no checks)."""
    return SparseArgs(q, kv[:, 0] if kv.dim() == 3 else kv, indices[:, 0] if indices.dim() == 3 else indices,
                      a.sm_scale, a.d_v, attn_sink.contiguous() if attn_sink is not None else None,
                      topk_length.contiguous() if topk_length is not None else None, a.causal, a.q_start_int,
                      q_start.reshape(1) if isinstance(q_start, torch.Tensor) else None, a.k_stride)


def row_ptrs(indices, topk_length, q_start_t) -> tuple:
    """(topk_length, q_start tensor) as kernel pointers: an absent one becomes indices, a placeholder never read
    (the kernels' flags say which are present)."""
    return (topk_length if topk_length is not None else indices, q_start_t if q_start_t is not None else indices)


def row_args(a: SparseArgs, n_hb: int) -> tuple:
    """Arguments every forward / attn_dist kernel takes after its tensors: (topk_length, q_start tensor, s_kv, h_q,
    topk, n_hb, sm_scale * log2(e), q_start int, k_stride); see row_ptrs."""
    return (*row_ptrs(a.indices, a.topk_length, a.q_start_t),
            a.kv.shape[0], a.q.shape[1], a.indices.shape[1], n_hb, a.sm_scale * LOG2E, a.q_start_int, a.k_stride)


def row_flags(a: SparseArgs) -> dict:
    return dict(HAS_TLEN=a.topk_length is not None, CAUSAL=a.causal, QS_TENSOR=a.q_start_t is not None)


def sink_arg(a: SparseArgs):
    return a.attn_sink if a.attn_sink is not None else a.indices


def column_parts(d_v: int, d_qk: int, dc: int) -> list:
    """The backward's second-pass launches: (first column, chunk width, chunks, has V) for the V columns in chunks
    of dc, then the rope columns as one chunk (K role only)."""
    return [(0, dc, d_v // dc, True)] + ([(d_v, d_qk - d_v, 1, False)] if d_qk > d_v else [])

