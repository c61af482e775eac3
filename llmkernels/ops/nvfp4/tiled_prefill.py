"""NVFP4 linear prefill (17-128 tokens, sm_90) on the tiled layout: a Triton kernel decoding whole words by
the mma kernel's pair recipe (tiled_layout.py) into a tl.dot."""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..._config import KernelConfig
from ..._launch import launch
from ..._runtime import capability, cdiv, interpreting, num_sms
from .common import e4m3_f32
from .linear import MMA_MAX_T, _reduce_linear
from .tiled_layout import ASM_WORD_BF16, ASM_WORD_F16, _join16, _tiled_words, _u8


@triton.jit
def _word_values(w_ptr, s_ptr, r, kw, N, KW, BN: tl.constexpr, BKW: tl.constexpr, DT: tl.constexpr):
    """Rows r [BN, 1] x words kw [1, BKW] of the tiled layout -> [BN, 16 BKW] in DT: e2m1 x scale x 2^-7 (exact),
    by the mma kernel's pair decode (_asm_word); rows past N read as 0."""
    word, sc = _tiled_words(w_ptr, s_ptr, r, kw, N, KW)
    if DT == tl.bfloat16:
        sc = (e4m3_f32(sc, False) * 6.646139978924579e35).to(DT)  # 2^119
    else:
        sc = (e4m3_f32(sc, False) * 128.0).to(DT)
    p0, p1, p2, p3, p4, p5, p6, p7 = tl.inline_asm_elementwise(
        ASM_WORD_BF16 if DT == tl.bfloat16 else ASM_WORD_F16, "=r,=r,=r,=r,=r,=r,=r,=r,l,h", [word, sc],
        dtype=(tl.int32,) * 8, is_pure=True, pack=1)
    c0, c1 = _halves(p0, DT)
    c2, c3 = _halves(p1, DT)
    c4, c5 = _halves(p2, DT)
    c6, c7 = _halves(p3, DT)
    c8, c9 = _halves(p4, DT)
    c10, c11 = _halves(p5, DT)
    c12, c13 = _halves(p6, DT)
    c14, c15 = _halves(p7, DT)
    return tl.reshape(_join16(c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15), [BN, 16 * BKW])


@triton.jit
def _halves(p, DT: tl.constexpr):
    return (p & 0xFFFF).to(tl.int16).to(DT, bitcast=True), (p >> 16).to(tl.int16).to(DT, bitcast=True)


@triton.jit
def _prefill_kernel(x_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, y_ptr, part_ptr, T, N, KW, per, s_xt, s_yt,
                    BT: tl.constexpr, BN: tl.constexpr, BKW: tl.constexpr, PARTIAL: tl.constexpr,
                    HAS_BIAS: tl.constexpr):
    """y [T, N] = x @ W^T above the mma kernel's 16 tokens: a [BT, BN] tile a program over `per` steps of BKW words
    (split s of the K range), each weight tile decoded in registers from the tiled layout and fed to tl.dot, fp32
    accumulation; PARTIAL: the split's sum to part [S, T, N] (linear._reduce_linear finishes), else times gs (+ the
    fp32 bias), one rounding."""
    DT: tl.constexpr = y_ptr.dtype.element_ty
    r = tl.program_id(0) * BN + tl.arange(0, BN)[:, None]
    t = tl.program_id(1) * BT + tl.arange(0, BT)[None, :]
    split = tl.program_id(2)
    kk = tl.arange(0, 16 * BKW)[:, None]
    acc = tl.zeros([BN, BT], tl.float32)  # y^T: the decoded tile is the dot's left operand, straight from registers
    k_lo = split * per * BKW
    k_hi = tl.minimum(k_lo + per * BKW, KW)
    for k0 in range(k_lo, k_hi, BKW):
        w = _word_values(w_ptr, s_ptr, r, k0 + tl.arange(0, BKW)[None, :], N, KW, BN, BKW, DT)
        xt = tl.load(x_ptr + t.to(tl.int64) * s_xt + 16 * k0 + kk, mask=t < T, other=0.0)  # [16 BKW, BT]
        acc = tl.dot(w, xt, acc)
    acc = acc * 128.0  # the decode's 2^-7 (exact)
    rows = r
    ok = (t < T) & (rows < N)
    if PARTIAL:
        tl.store(part_ptr + (split * T + t.to(tl.int64)) * N + rows, acc, mask=ok)
    else:
        acc = acc * tl.load(gs_ptr)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)
        tl.store(y_ptr + t.to(tl.int64) * s_yt + rows, acc.to(DT), mask=ok)


@dataclass(frozen=True)
class PrefillConfig(KernelConfig):
    """The prefill kernel: BT tokens x BN rows a program (BT 0: 64 up to 64 tokens, else 128), BKW weight words
    (16 K each) a step, splits of K (0: none where the tiles fill the SMs, else enough for 2 programs an SM), warps,
    pipeline stages. Defaults from a sweep on the H100 (notes, linear round 17)."""
    BT: int = 0
    BN: int = 128
    BKW: int = 4
    split: int = 0
    num_warps: int = 8
    num_stages: int = 3


PREFILL_MAX_T = 128  # above: dequantize + cuBLAS is faster (1.2-2.4x the kernel's time at 256-4096 tokens)


def prefill_usable(x: torch.Tensor) -> bool:
    """sm_90+ (mul.rn.bf16x2, the pair decode), 17-128 tokens, unit last stride."""
    if interpreting() or x.device.type != "cuda" or capability(x.device)[0] < 9:
        return False
    return MMA_MAX_T < x.shape[0] <= PREFILL_MAX_T and x.stride(1) == 1


def prefill_launch(x, packed, scales, gs, bias, y, cfg=None):
    """x [T, K] (unit last stride; sm_90), packed / scales in the tiled layout, gs fp32 [1], bias fp32 [N] or None
    -> y [T, N]."""
    c = PrefillConfig.of(cfg)
    T, K = x.shape
    N = packed.shape[0]
    bt = c.BT or (64 if T <= 64 else 128)
    steps = K // 16 // c.BKW
    tiles = cdiv(N, c.BN) * cdiv(T, bt)
    sms = num_sms(x.device)
    split = c.split or (1 if tiles >= sms else max(1, min(cdiv(2 * sms, tiles), steps // 4)))
    per = cdiv(steps, split)
    split = cdiv(steps, per)
    part = torch.empty(split, T, N, dtype=torch.float32, device=x.device) if split > 1 else y
    launch(_prefill_kernel, (cdiv(N, c.BN), cdiv(T, bt), split), x, _u8(packed).view(torch.int64), _u8(scales), gs,
           bias if bias is not None else gs, y, part, T, N, K // 16, per, x.stride(0), y.stride(0), BT=bt, BN=c.BN,
           BKW=c.BKW, PARTIAL=split > 1, HAS_BIAS=bias is not None, num_warps=c.num_warps, num_stages=c.num_stages)
    if split > 1:
        _reduce_linear(part, y, gs, bias)
    return y
