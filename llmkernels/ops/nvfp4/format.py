"""NVFP4 storage format: E2M1 values two per byte, one float8_e4m3fn scale per 16 values, fp32 global scale.

x ~ e2m1 * block_scale * global_scale. Byte i of a row holds element 2i in its LOW nibble and 2i+1 in its
high nibble. Codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6 and codes 8..15 their negatives (bit 3 is the sign).
All helpers here are plain PyTorch and run on any device.
"""
from typing import Tuple, Union

import torch

from ..._validate import check_int, check_same_device, check_tensor

BLOCK = 16  # values per scale
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
PACKED_DTYPES = (torch.uint8, torch.float4_e2m1fn_x2)
SCALE_DTYPES = (torch.float8_e4m3fn,)
# rounding thresholds on |x| between neighbouring E2M1 magnitudes; ties go to the even code (mantissa bit 0):
# (threshold, True when a tie rounds up)
_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def u8(t: torch.Tensor) -> torch.Tensor:
    """The uint8 view of one-byte data (packed E2M1, e4m3 scales), unchecked."""
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def as_bytes(name: str, t: torch.Tensor) -> torch.Tensor:
    """The uint8 view of packed E2M1 data (accepts uint8 or float4_e2m1fn_x2)."""
    check_tensor(name, t, dtypes=PACKED_DTYPES)
    return u8(t)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> fp32 [..., K]: element 2i from the low nibble of byte i, 2i+1 from the high one."""
    p = as_bytes("packed", packed)
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=p.device)
    codes = torch.stack([p & 0xF, p >> 4], dim=-1).long()  # [..., K/2, 2]: (low, high)
    return lut[codes].flatten(-2)


def quantize_e2m1(x: torch.Tensor) -> torch.Tensor:
    """fp32 values already divided by their scale -> E2M1 codes (int64, 0..15): nearest, ties to even, saturating."""
    mag = x.abs()
    code = torch.zeros_like(mag, dtype=torch.int64)
    for t, tie_up in _THRESHOLDS:
        code += (mag >= t) if tie_up else (mag > t)
    return code | (((x < 0) & (code > 0)).long() << 3)  # no negative zero: -0.1 -> +0


def _global_scale(value, name: str, t: torch.Tensor) -> torch.Tensor:
    """A user's global_scale (a real number or a one-element floating tensor on t's device) as fp32 0-d there."""
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point() or value.numel() != 1:
            raise ValueError(f"global_scale must be a number or a one-element floating tensor, got a {value.dtype} "
                             f"tensor of shape {tuple(value.shape)}")
        check_same_device(kernel=False, **{"global_scale": value, name: t})
        return value.to(torch.float32).reshape(())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"global_scale must be a number or a one-element floating tensor, got {type(value).__name__}")
    return torch.tensor(float(value), dtype=torch.float32, device=t.device)


def check_global_scale(gs: torch.Tensor) -> None:
    """The rule every nvfp4 function applies to a global scale it can read on the host: finite and positive."""
    v = float(gs)
    if not (0 < v < float("inf")):
        raise ValueError(f"global_scale must be a finite positive number, got {v}")


def check_k(K: int, what: str) -> None:
    if K % BLOCK != 0 or K == 0:
        raise ValueError(f"K (={what}) must be a positive multiple of {BLOCK} (one scale per {BLOCK} values)")


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """int codes [..., K] (K even) -> uint8 [..., K/2] with element 2i in the low nibble."""
    c = codes.to(torch.uint8).unflatten(-1, (-1, 2))
    return c[..., 0] | (c[..., 1] << 4)


def default_global_scale(amax: torch.Tensor) -> torch.Tensor:
    """nvfp4_quantize's global scale for weights whose largest magnitude is amax (fp32 0-d): amax / (6 * 448), so
    the largest block scale lands at the top of the e4m3 range (1 where amax is 0)."""
    return torch.where(amax > 0, amax / (E2M1_MAX * E4M3_MAX), torch.ones_like(amax))


def nvfp4_quantize(w: torch.Tensor, global_scale: Union[None, float, torch.Tensor] = None
                   ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize w [N, K] (fp32/bf16/fp16, K a multiple of 16) to NVFP4.

    Returns (packed uint8 [N, K/2], scales float8_e4m3fn [N, K/16], global_scale fp32 0-d tensor) with
    w ~ e2m1 * scale * global_scale. By default global_scale = amax(|w|) / (6 * 448), so the largest block
    scale lands at the top of the e4m3 range; each block scale is amax(block) / (6 * global_scale) rounded to
    e4m3 (nearest), and each value is rounded to the nearest E2M1 value of w / (scale * global_scale) (ties to
    even, saturating at +-6). Blocks whose scale rounds to 0 quantize to 0. w must be finite, K > 0, and a given
    global_scale finite and positive.
    """
    check_tensor("w", w, dtypes=(torch.float32, torch.bfloat16, torch.float16), ndim=2)
    N, K = w.shape
    check_k(K, f"w.shape[1] = {K}")
    wf = w.float()
    if not bool(torch.isfinite(wf).all()):
        raise ValueError("w must be finite (no NaN or inf)")
    if global_scale is None:
        gs = default_global_scale(wf.abs().amax() if wf.numel() else wf.new_zeros(()))
    else:
        gs = _global_scale(global_scale, "w", w)
        check_global_scale(gs)
    blocks = wf.reshape(N, K // BLOCK, BLOCK)
    bscale = (blocks.abs().amax(-1) / (E2M1_MAX * gs)).clamp(max=E4M3_MAX)
    scales = bscale.to(torch.float8_e4m3fn)
    denom = scales.float() * gs
    q = torch.where(denom[..., None] > 0, blocks / torch.where(denom > 0, denom, 1.0)[..., None], 0.0)
    packed = pack_codes(quantize_e2m1(q).reshape(N, K))
    return packed, scales, gs.float()


def nvfp4_dequantize(packed: torch.Tensor, scales: torch.Tensor,
                     global_scale: Union[None, float, torch.Tensor] = None,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """packed [N, K/2] (uint8 or float4_e2m1fn_x2), scales [N, K/16] float8_e4m3fn -> [N, K] in dtype.

    Computed in fp32 (e2m1 * scale is exact there) times global_scale (finite and positive), then rounded once to
    dtype. K must be a positive multiple of 16.
    """
    p = as_bytes("packed", packed)
    check_tensor("packed", p, ndim=2)
    check_tensor("scales", scales, dtypes=SCALE_DTYPES, ndim=2)
    N, K = p.shape[0], 2 * p.shape[1]
    check_k(K, f"2 * packed.shape[1] = {K}")
    if tuple(scales.shape) != (N, K // BLOCK):
        raise ValueError(f"scales must have shape {(N, K // BLOCK)} (one per {BLOCK} values of packed), "
                         f"got {tuple(scales.shape)}")
    check_same_device(kernel=False, packed=p, scales=scales)  # pure torch: any device
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    gs = None if global_scale is None else _global_scale(global_scale, "packed", p)
    if gs is not None:
        check_global_scale(gs)  # a host sync for a device tensor; this function is pure torch anyway
    vals = unpack_e2m1(p).reshape(N, K // BLOCK, BLOCK) * scales.float()[..., None]
    if gs is not None:
        vals = vals * gs
    return vals.reshape(N, K).to(dtype)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """[R, C] scales -> the cuBLASLt/CUTLASS 128x4 swizzled layout, flattened (zero padded up to multiples of 128
    rows and 4 columns).

    Tile (i, j) of 128 rows x 4 columns is stored contiguously (tiles row-major); inside a tile, row r and
    column c sit at (r % 32) * 16 + (r // 32) * 4 + c. This is the layout torch._scaled_mm takes for NVFP4.
    """
    check_tensor("scales", scales, ndim=2)
    R, C = scales.shape
    Rp, Cp = _ceil(R, 128) * 128, _ceil(C, 4) * 4
    s = scales.view(torch.uint8) if scales.element_size() == 1 else scales
    padded = s.new_zeros(Rp, Cp)
    padded[:R, :C] = s
    blocks = padded.view(Rp // 128, 4, 32, Cp // 4, 4).permute(0, 3, 2, 1, 4)  # (ri, cj, r32, r4, c)
    out = blocks.reshape(-1)
    return out.view(scales.dtype) if s is not scales else out


def from_blocked(blocked: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of to_blocked: the flat swizzled scales -> [rows, cols]."""
    check_tensor("blocked", blocked)
    rows, cols = check_int("rows", rows, lo=0), check_int("cols", cols, lo=0)
    Rp, Cp = _ceil(rows, 128) * 128, _ceil(cols, 4) * 4
    if blocked.numel() != Rp * Cp:
        raise ValueError(f"blocked must hold {Rp * Cp} scales for a [{rows}, {cols}] matrix (padded to "
                         f"[{Rp}, {Cp}]), got {blocked.numel()}")
    b = blocked.reshape(-1)
    s = b.view(torch.uint8) if b.element_size() == 1 else b
    full = s.view(Rp // 128, Cp // 4, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(Rp, Cp)
    out = full[:rows, :cols].contiguous()
    return out.view(blocked.dtype) if s is not b else out

