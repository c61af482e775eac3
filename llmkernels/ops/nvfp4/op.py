"""nvfp4_gemv (GPU MODE layout), nvfp4_linear (weight-only NVFP4 linear) and the NVFP4Linear module."""
from typing import Optional, Union

import torch

from ..._launch import current_device, keep_plan, kept_plan, new_token, run_planned, skey, tkey, tracing
from ..._validate import (check_bool, check_int, check_interpreter_dtype, check_no_self_overlap, check_same_device,
                          check_scale, check_shape, check_tensor)
from .format import BLOCK, SCALE_DTYPES, as_bytes, check_k, nvfp4_quantize, u8
from .gemv import gemv_kept_call, gemv_kept_plan, gemv_launch
from .linear import MAX_FUSED_T, MmaPlan, dequant_launch, linear_launch
from .prefill_wgmma import WgmmaPrefillPlan, wgmma_prefill_launch, wgmma_prefill_usable
from .tiled import TiledPlan, tiled_launch, tiled_usable
from .tiled_layout import dequant_tiled_launch, tile_packed, tile_scales, tileable, untile_packed, untile_scales
from .tiled_prefill import prefill_launch, prefill_usable

_X_DTYPES = (torch.float16, torch.bfloat16)


def _new_out(a: torch.Tensor) -> torch.Tensor:
    M, _, L = a.shape  # [M, 1, L] with L outermost in memory, like the contest's c
    return torch.empty(L, M, 1, dtype=torch.float16, device=a.device).permute(1, 2, 0)


@torch.library.custom_op("llmkernels::nvfp4_gemv", mutates_args=())
def _gemv_op(a: torch.Tensor, b: torch.Tensor, sfa: torch.Tensor, sfb: torch.Tensor, alpha: float,
             static_weights: bool) -> torch.Tensor:
    out = _new_out(a)
    gemv_launch(u8(a), u8(b), u8(sfa), u8(sfb), out, alpha, static_weights=static_weights)
    return out


@_gemv_op.register_fake
def _(a, b, sfa, sfb, alpha, static_weights):
    M, _, L = a.shape
    return a.new_empty((L, M, 1), dtype=torch.float16).permute(1, 2, 0)


@torch.library.custom_op("llmkernels::nvfp4_gemv_out", mutates_args=("out",))
def _gemv_out_op(a: torch.Tensor, b: torch.Tensor, sfa: torch.Tensor, sfb: torch.Tensor, alpha: float,
                 out: torch.Tensor, static_weights: bool) -> None:
    gemv_launch(u8(a), u8(b), u8(sfa), u8(sfb), out, alpha, static_weights=static_weights)


@_gemv_out_op.register_fake
def _(a, b, sfa, sfb, alpha, out, static_weights):
    return None


def _check_gemv(a, b, sfa, sfb, out):
    as_bytes("a", a)
    as_bytes("b", b)
    check_tensor("a", a, ndim=3)
    check_tensor("b", b, ndim=3)
    check_tensor("sfa", sfa, dtypes=SCALE_DTYPES, ndim=3)
    check_tensor("sfb", sfb, dtypes=SCALE_DTYPES, ndim=3)
    M, KH, L = a.shape
    K = 2 * KH
    check_k(K, f"2 * a.shape[1] = {K}")
    if b.shape[0] < 1 or tuple(b.shape[1:]) != (KH, L):
        raise ValueError(f"b must be [N >= 1, K/2={KH}, L={L}] (row 0 is the vector), got {tuple(b.shape)}")
    check_shape("sfa", sfa, (M, K // BLOCK, L), f"[M, K/16, L] with K={K}")
    if sfb.shape[0] < 1 or tuple(sfb.shape[1:]) != (K // BLOCK, L):
        raise ValueError(f"sfb must be [N >= 1, K/16={K // BLOCK}, L={L}], got {tuple(sfb.shape)}")
    if out is not None:
        check_tensor("out", out, dtypes=(torch.float16,), ndim=3)
        check_shape("out", out, (M, 1, L), "[M, 1, L]")
        check_no_self_overlap("out", out)
    check_same_device(a=a, b=b, sfa=sfa, sfb=sfb, out=out)


def nvfp4_gemv(a: torch.Tensor, b: torch.Tensor, sfa: torch.Tensor, sfb: torch.Tensor,
               out: Optional[torch.Tensor] = None, alpha: Optional[float] = None,
               static_weights: bool = False) -> torch.Tensor:
    """Batched NVFP4 matrix-vector product in the GPU MODE `nvfp4_gemv` layout.

    c[m, 0, l] = alpha * sum_k a[m, k, l] * sfa[m, k // 16, l] * b[0, k, l] * sfb[0, k // 16, l]

    Args:
        a: [M, K/2, L] float4_e2m1fn_x2 or uint8, two E2M1 values per byte (value 2i in the low nibble).
            Fast path: unit stride along dim 1 and 8-byte aligned rows (the contest layout); other strides are
            copied once.
        b: [N, K/2, L], same format; N >= 1 and only row 0 is read (the contest pads N to 128).
        sfa: [M, K/16, L] float8_e4m3fn, plain (not swizzled) layout, any strides. sfb: [N', K/16, L], row 0 read.
        out: optional fp16 [M, 1, L] (any strides) written in place and returned.
        alpha: optional float multiplier applied in fp32 before the fp16 rounding.
        static_weights: promise that a and sfa are not written by a kernel that may still be running when this
            one starts (true of model weights loaded once). On Hopper the GEMV then starts while the previous
            kernel on the stream finishes (programmatic dependent launch) and reads its first weight tile
            before waiting for it; b, sfb and out are touched only after the wait. Off by default, because
            weights written by the kernel just before (e.g. a quantize) could otherwise be read stale.
    K must be a multiple of 16 (any M and L). Products and block sums are exact; blocks are accumulated in fp32;
    the result is rounded once to fp16 (overflow gives +-inf; a NaN scale (0x7f/0xff) makes its output NaN).
    """
    key = None if tracing() else (_GEMV, current_device(), tkey(a), tkey(b), tkey(sfa), tkey(sfb), tkey(out),
                                  skey(alpha), skey(static_weights))
    hit = kept_plan(key, (a, b, sfa, sfb, out))
    if hit is None:
        _check_gemv(a, b, sfa, sfb, out)
        al = 1.0 if alpha is None else check_scale("alpha", alpha)
        check_bool("static_weights", static_weights)
        hit = keep_plan(key, lambda: (al, new_token(), gemv_kept_plan(
            a, b, sfa, sfb, out if out is not None else _new_out(a), al, static_weights) if a.is_cuda else None),
            (a, b, sfa, sfb, out))  # where the custom op would only run _gemv: call it
    if hit is not None:
        if hit[2] is not None:
            return _gemv_kept(hit[2], a, b, sfa, sfb, out)
        return run_planned(hit[1], _gemv, a, b, sfa, sfb, out, hit[0], static_weights)
    if out is None:
        return _gemv_op(a, b, sfa, sfb, al, static_weights)
    _gemv_out_op(a, b, sfa, sfb, al, out, static_weights)
    return out


_GEMV = "nvfp4_gemv"  # a checked call's key -> (its alpha, plan token, kept GemvPlan or None)


def _gemv_kept(plan, a, b, sfa, sfb, out):
    if out is None:
        out = _new_out(a)
        gemv_kept_call(plan, a, b, sfa, sfb, out)
        return out
    gemv_kept_call(plan, a, b, sfa, sfb, out)
    torch.autograd.graph.increment_version(out)  # as the dispatcher does for an op that mutates out
    return out


def _gemv(a, b, sfa, sfb, out, alpha: float, static_weights: bool):
    if out is None:
        return gemv_launch(u8(a), u8(b), u8(sfa), u8(sfb), _new_out(a), alpha, static_weights=static_weights)
    gemv_launch(u8(a), u8(b), u8(sfa), u8(sfb), out, alpha, static_weights=static_weights)
    torch.autograd.graph.increment_version(out)  # as the dispatcher does for an op that mutates out
    return out


def custom_kernel(data):
    """GPU MODE `nvfp4_gemv` entry: data = (a, b, sfa, sfb, sfa_permuted, sfb_permuted, c); fills and returns c.

    The permuted (128x4-swizzled) scales are not needed: the plain sfa/sfb are read directly.
    """
    if not isinstance(data, (tuple, list)):
        raise TypeError(f"data must be a tuple (a, b, sfa, sfb, sfa_permuted, sfb_permuted, c), got "
                        f"{type(data).__name__}")
    if len(data) != 7:
        raise ValueError(f"data must hold 7 items (a, b, sfa, sfb, sfa_permuted, sfb_permuted, c), got {len(data)}")
    a, b, sfa, sfb, _, _, c = data
    return nvfp4_gemv(a, b, sfa, sfb, out=c)


# ---- weight-only linear -----------------------------------------------------------------------------

@torch.library.custom_op("llmkernels::nvfp4_linear", mutates_args=())
def _linear_op(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor,
               bias: Optional[torch.Tensor]) -> torch.Tensor:
    return _linear(x, packed, scales, global_scale, bias)


def _linear(x, packed, scales, global_scale, bias):
    """x [T, K] (any row stride, unit last stride), global_scale fp32 [1]; bias made contiguous here."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    bias = bias.contiguous() if bias is not None else None
    T, N = x.shape[0], packed.shape[0]
    w8, s8 = u8(packed), u8(scales)
    if T <= MAX_FUSED_T:
        y = torch.empty(T, N, dtype=x.dtype, device=x.device)
        return linear_launch(x, w8, s8, global_scale, bias, y)
    return _dequant_linear(x, w8, s8, global_scale, bias, False)


def _dequant_linear(x, w8, s8, global_scale, bias, tiled: bool):
    """More than MAX_FUSED_T tokens: W * global_scale dequantized to x's dtype (one rounding), then cuBLAS."""
    w = torch.empty(w8.shape[0], x.shape[1], dtype=x.dtype, device=x.device)
    (dequant_tiled_launch if tiled else dequant_launch)(w8, s8, global_scale, w)
    return torch.nn.functional.linear(x, w, bias.to(x.dtype) if bias is not None else None)


@_linear_op.register_fake
def _(x, packed, scales, global_scale, bias):
    return x.new_empty((x.shape[0], packed.shape[0]))


def nvfp4_linear(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                 global_scale: Union[float, torch.Tensor, None] = None,
                 bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """y = x @ W^T (+ bias) with W = e2m1(packed) * scales * global_scale, the NVFP4 weight of nvfp4_quantize.

    Args:
        x: [..., K] fp16 or bf16 activations (the leading dims are flattened into T tokens).
        packed: [N, K/2] uint8 or float4_e2m1fn_x2; scales: [N, K/16] float8_e4m3fn (plain layout).
        global_scale: a finite positive float, or an fp32 tensor with one element (read on the device, no host
            sync, so its value is not checked: a negative one negates y, a NaN makes y NaN); None = 1.
        bias: optional [N] (any float dtype; added in fp32).
    Returns [..., N] in x's dtype. T <= 16 runs one fused kernel that reads the weights once for all tokens
    (decode in registers, tensor-core dot, fp32 accumulation); larger T dequantizes W * global_scale to x's
    dtype (one rounding; the bias is rounded to x's dtype too) and calls cuBLAS.
    """
    gs_t = global_scale if isinstance(global_scale, torch.Tensor) else None
    key = None if tracing() else (_LINEAR, current_device(), tkey(x), tkey(packed), tkey(scales),
                                  skey(global_scale) if gs_t is None else tkey(gs_t), tkey(bias))
    hit = kept_plan(key, (x, packed, scales, bias, gs_t))
    if hit is not None:
        # (a plan's kernels read the global scale's address only: a 0-d or [1, 1] tensor needs no reshape)
        gs = hit.gs if gs_t is None else gs_t if hit.flat_gs or hit.plan is not None else gs_t.reshape(1)
        x2 = x if hit.flat_x else x.reshape(-1, x.shape[-1])
        if hit.plan is not None:
            y = hit.plan(x2, packed, scales, gs, bias)
        else:
            y = run_planned(hit.token, _linear, x2, packed, scales, gs, bias)
        return y if hit.flat_x else y.reshape(*x.shape[:-1], -1)
    check_tensor("x", x, dtypes=_X_DTYPES)
    if x.dim() < 1:
        raise ValueError("x must have at least one dim [..., K]")
    p = as_bytes("packed", packed)
    check_tensor("packed", p, ndim=2)
    check_tensor("scales", scales, dtypes=SCALE_DTYPES, ndim=2)
    N, KH = p.shape
    K = x.shape[-1]
    if K != 2 * KH:
        raise ValueError(f"x's last dim ({K}) must equal 2 * packed.shape[1] ({2 * KH})")
    check_k(K, f"x.shape[-1] = {K}")
    check_shape("scales", scales, (N, K // BLOCK), "[N, K/16]")
    if global_scale is None or not isinstance(global_scale, torch.Tensor):
        gs_val = 1.0 if global_scale is None else check_scale("global_scale", global_scale)
        if gs_val <= 0:
            raise ValueError(f"global_scale must be a finite positive number, got {gs_val}")
        gs = torch.full((1,), gs_val, dtype=torch.float32, device=x.device)
    else:
        check_tensor("global_scale", global_scale, dtypes=(torch.float32,))
        if global_scale.numel() != 1:
            raise ValueError(f"global_scale must hold one value, got shape {tuple(global_scale.shape)}")
        gs = global_scale.reshape(1)
    if bias is not None:
        check_tensor("bias", bias, dtypes=(torch.float32, torch.float16, torch.bfloat16))
        check_shape("bias", bias, (N,), "[N]")
    check_same_device(x=x, packed=p, scales=scales, global_scale=gs, bias=bias)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    if x2.shape[0] <= MAX_FUSED_T:  # the fused kernel's tl.dot; more tokens go through torch
        check_interpreter_dtype(x=x)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    hit = keep_plan(key, lambda: _LinearPlan(x, x2, packed, scales, gs, gs_t, bias), (x, packed, scales, bias,
                       gs_t))  # where the custom op would only run _linear
    if hit is not None:
        y = hit.plan(x2, packed, scales, gs, bias) if hit.plan is not None else \
            run_planned(hit.token, _linear, x2, packed, scales, gs, bias)
        return y.reshape(*lead, N)
    y = _linear_op(x2, packed, scales, gs, bias.contiguous() if bias is not None else None)
    return y.reshape(*lead, N)


class _LinearPlan:
    """What a checked nvfp4_linear key keeps: a number global scale's fp32 tensor (made once; a tensor's is the
    caller's), whether x and the global scale need no reshape, and the mma plan (else a token for run_planned)."""
    __slots__ = ("gs", "flat_x", "flat_gs", "plan", "token")

    def __init__(self, x, x2, packed, scales, gs, gs_t, bias):
        self.gs = gs if gs_t is None else None
        unit = x.stride(-1) == 1  # then a call's x.reshape(-1, K) is this x2 again (the key fixes shape and strides)
        self.flat_x, self.flat_gs = x.dim() == 2 and unit, gs_t is not None and gs_t.dim() == 1
        w8, s8 = u8(packed), u8(scales)
        self.plan = MmaPlan(x2, w8, s8, bias) if unit and MmaPlan.usable(x2, w8, s8, bias) else None
        self.token = new_token()


_LINEAR = "nvfp4_linear"  # a checked call's key -> _LinearPlan


@torch.library.custom_op("llmkernels::nvfp4_linear_tiled", mutates_args=())
def _linear_tiled_op(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor,
                     bias: Optional[torch.Tensor]) -> torch.Tensor:
    return _linear_tiled(x, packed, scales, global_scale, bias)


def _linear_tiled(x, packed, scales, global_scale, bias):
    """nvfp4_linear's _linear on weights in the tiled layout (see tiled.py): on sm_90+ the tiled kernel for 1-16
    tokens; on sm_90 the Gluon wgmma kernel for 17-2048 (prefill_wgmma.py), on later GPUs the Triton prefill kernel
    for 17-128; the dequantize kernel reading the tiled layout for more tokens; else (other GPUs, the interpreter)
    the plain path on an untiled copy."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    kernel = (tiled_launch if tiled_usable(x) else wgmma_prefill_launch if wgmma_prefill_usable(x)
              else prefill_launch if prefill_usable(x) else None)
    if kernel is not None:
        y = torch.empty(x.shape[0], packed.shape[0], dtype=x.dtype, device=x.device)
        return kernel(x, packed, scales, global_scale, bias, y)
    if x.shape[0] > MAX_FUSED_T:  # prefill: dequantize straight from the tiled layout
        return _dequant_linear(x, u8(packed), u8(scales), global_scale, bias, True)
    return _linear(x, untile_packed(packed), untile_scales(scales), global_scale, bias)


@_linear_tiled_op.register_fake
def _(x, packed, scales, global_scale, bias):
    return x.new_empty((x.shape[0], packed.shape[0]))


class _TiledPlan:
    """What a checked tiled NVFP4Linear call keeps: whether x is its own [T, K], the kept plan (TiledPlan or
    WgmmaPrefillPlan) where one runs, else a token for run_planned."""
    __slots__ = ("flat", "plan", "token")

    def __init__(self, x, x2, N, has_bias):
        self.flat = x.dim() == 2 and x.stride(-1) == 1  # x is its own [T, K] (else reshaped, as on the first call)
        unit = x.stride(-1) == 1
        self.plan = (TiledPlan(x2, (N,), has_bias) if unit and tiled_usable(x2) else
                     WgmmaPrefillPlan(x2, N, has_bias) if unit and wgmma_prefill_usable(x2) else None)
        self.token = new_token()


_TILED = "nvfp4_linear_tiled"  # a checked call's key -> _TiledPlan


def check_tiled_call(m: "NVFP4Linear", x: torch.Tensor) -> torch.Tensor:
    """Every check of a tiled NVFP4Linear's call (x and the module's buffers); x as [T, in_features]."""
    p, s, gs, b = m.packed, m.scales, m.global_scale, m.bias
    check_tensor("x", x, dtypes=_X_DTYPES)
    if x.dim() < 1 or x.shape[-1] != m.in_features:
        raise ValueError(f"x must be [..., in_features={m.in_features}], got {tuple(x.shape)}")
    N, K = m.out_features, m.in_features  # the buffers may have been replaced: the kernel trusts their shapes
    check_shape("packed", p, (N, K // 2), "[out_features, in_features/2]")
    check_shape("scales", s, (N, K // BLOCK), "[out_features, in_features/16]")
    check_shape("global_scale", gs, (1,), "[1]")
    if b is not None:
        check_shape("bias", b, (N,), "[out_features]")
    if not (p.is_contiguous() and s.is_contiguous() and (b is None or b.is_contiguous())):
        raise ValueError("packed, scales and bias must be contiguous (the tiled kernel addresses them as blocks)")
    check_same_device(x=x, packed=p, scales=s, global_scale=gs, bias=b)
    x2 = x.reshape(-1, m.in_features)
    if x2.shape[0] <= MAX_FUSED_T:
        check_interpreter_dtype(x=x)
    return x2


def _tiled_forward(m: "NVFP4Linear", x: torch.Tensor) -> torch.Tensor:
    """NVFP4Linear.forward on its tiled weights: checks once per key (x's and the buffers' shapes, strides, dtypes,
    devices), then a cached plan."""
    p, s, gs, b = m.packed, m.scales, m.global_scale, m.bias
    key = None if tracing() else (_TILED, current_device(), tkey(x), tkey(p), tkey(s), tkey(gs), tkey(b))
    hit = kept_plan(key, (x, p, s, gs, b))
    if hit is not None:
        if hit.plan is not None:
            if hit.flat:
                return hit.plan(x, p, s, gs, b)
            return hit.plan(x.reshape(-1, m.in_features), p, s, gs, b).reshape(*x.shape[:-1], m.out_features)
        y = run_planned(hit.token, _linear_tiled, x.reshape(-1, m.in_features), p, s, gs, b)
        return y.reshape(*x.shape[:-1], m.out_features)
    x2 = check_tiled_call(m, x)
    hit = keep_plan(key, lambda: _TiledPlan(x, x2, m.out_features, b is not None), (x, p, s, gs, b))
    if hit is not None:
        if hit.plan is not None:
            return hit.plan(x2, p, s, gs, b).reshape(*x.shape[:-1], m.out_features)
        return run_planned(hit.token, _linear_tiled, x2, p, s, gs, b).reshape(*x.shape[:-1], m.out_features)
    return _linear_tiled_op(x2, p, s, gs, b).reshape(*x.shape[:-1], m.out_features)


class NVFP4Linear(torch.nn.Module):
    """Inference-only nn.Linear replacement holding an NVFP4 weight (4.5 bits per weight).

    Where out_features % 16 == 0 and in_features % 256 == 0 (`tiled`), the `packed` and `scales` buffers hold the
    tiled layout of tiled.py (the same bytes reordered so the decode kernel's loads are contiguous: 1.12-1.6x the
    plain layout's speed on the H100); state_dict() and load_state_dict() use the plain [N, K/2] / [N, K/16]
    layout of nvfp4_quantize and the checkpoints, and plain_weight() returns it.

    The buffers are weights: on Hopper the tiled decode kernel may load its first weights while the preceding kernel
    on the stream still runs (programmatic dependent launch). Write them (set_weight, load_state_dict, copies) with
    ordinary kernels, not inside a compiled region whose kernels release their dependents early (inductor's
    `triton.enable_pdl`) just before a call.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None):
        super().__init__()
        check_int("in_features", in_features, lo=BLOCK)
        check_int("out_features", out_features, lo=1)
        check_bool("bias", bias)
        if in_features % BLOCK != 0:
            raise ValueError(f"in_features (={in_features}) must be a multiple of {BLOCK}")
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("packed", torch.zeros(out_features, in_features // 2, dtype=torch.uint8, device=device))
        self.register_buffer("scales", torch.zeros(out_features, in_features // BLOCK, dtype=torch.float8_e4m3fn,
                                                   device=device))
        self.register_buffer("global_scale", torch.ones(1, dtype=torch.float32, device=device))
        self.register_buffer("bias", torch.zeros(out_features, device=device) if bias else None)
        self.tiled = tileable(out_features, in_features)
        if self.tiled:
            self.register_state_dict_post_hook(_plain_state)
            self.register_load_state_dict_pre_hook(_tile_state)

    def plain_weight(self):
        """(packed, scales) in the plain layout (copies where the module holds the tiled one)."""
        if self.tiled:
            return untile_packed(self.packed), untile_scales(self.scales)
        return self.packed, self.scales

    def set_weight(self, packed: torch.Tensor, scales: torch.Tensor) -> None:
        """Copy plain-layout packed [N, K/2] (uint8 or float4_e2m1fn_x2) / scales [N, K/16] (float8_e4m3fn) in
        (tiled where the module is)."""
        packed = as_bytes("packed", packed)
        check_tensor("scales", scales, dtypes=SCALE_DTYPES)
        check_shape("packed", packed, tuple(self.packed.shape), "[out_features, in_features/2]")
        check_shape("scales", scales, tuple(self.scales.shape), "[out_features, in_features/16]")
        with torch.no_grad():
            self.packed.copy_(tile_packed(packed) if self.tiled else packed)
            self.scales.copy_(tile_scales(scales) if self.tiled else scales)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, global_scale: Optional[float] = None) -> "NVFP4Linear":
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach()
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, device=w.device)
        packed, scales, gs = nvfp4_quantize(w, global_scale)
        m.set_weight(packed, scales)
        m.global_scale.copy_(gs.reshape(1))
        if linear.bias is not None:
            m.bias = linear.bias.detach().float().clone()
        return m

    group = None  # an NVFP4Group (fused.py) computing this layer together with others of the same input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.group is not None:
            return self.group.forward(self, x)
        return self.forward_alone(x)

    def forward_alone(self, x: torch.Tensor) -> torch.Tensor:
        """This layer's product by itself (its group, if any, aside)."""
        if self.tiled:
            return _tiled_forward(self, x)
        return nvfp4_linear(x, self.packed, self.scales, self.global_scale, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"tiled={self.tiled}")


def _plain_state(module, state_dict, prefix, local_metadata):
    for name, fn in (("packed", untile_packed), ("scales", untile_scales)):
        if prefix + name in state_dict:
            state_dict[prefix + name] = fn(state_dict[prefix + name])


def _tile_state(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
    for name, fn in (("packed", tile_packed), ("scales", tile_scales)):
        t = state_dict.get(prefix + name)
        if isinstance(t, torch.Tensor) and t.shape == getattr(module, name).shape:  # else load_state_dict says why
            state_dict[prefix + name] = fn(t)
