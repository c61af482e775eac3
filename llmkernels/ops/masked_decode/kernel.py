"""Split-KV flash-decoding with a per-(batch, kv-head, token) drop mask."""
import torch
import triton
import triton.language as tl

from ..._runtime import num_sms
from ..combine.kernel import combine, pdl_enabled


@triton.jit
def _split_kernel(
    q_ptr, k_ptr, v_ptr, drop_ptr, lens_ptr, o_ptr, lse_ptr,
    Hkv, L, kv_len, chunk, qk_scale,
    s_qb, s_qh, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_mh, s_ml, s_or, s_os, s_lr,
    G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_DROP: tl.constexpr, HAS_LENS: tl.constexpr, USE_GDC: tl.constexpr,
):
    if USE_GDC:  # let the combine kernel launch now; it waits for this grid's writes before reading
        tl.extra.cuda.gdc_launch_dependents()
    split = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // Hkv).to(tl.int64)
    h = (bh % Hkv).to(tl.int64)
    if HAS_LENS:
        length = tl.minimum(tl.maximum(tl.load(lens_ptr + b), 0), L)
    else:
        length = kv_len
    start = split * chunk
    end = tl.minimum(start + chunk, length)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)
    q = tl.load(q_ptr + b * s_qb + (h * G + offs_g)[:, None] * s_qh + offs_d[None, :],
                mask=(offs_g < G)[:, None], other=0.0)
    k_base = k_ptr + b * s_kb + h * s_kh
    v_base = v_ptr + b * s_vb + h * s_vh
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    for n0 in tl.range(start, end, BLOCK_N):
        offs = n0 + offs_n
        keep = offs < end
        if HAS_DROP:
            keep = keep & (tl.load(drop_ptr + b * s_mb + h * s_mh + offs * s_ml, mask=keep, other=1) == 0)
        # dropped rows are never fetched: the predicated load issues no memory traffic for them
        k = tl.load(k_base + offs[:, None].to(tl.int64) * s_kl + offs_d[None, :], mask=keep[:, None], other=0.0)
        v = tl.load(v_base + offs[:, None].to(tl.int64) * s_vl + offs_d[None, :], mask=keep[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(keep[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # all-dropped so far: avoid inf - inf
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    lse = tl.where(l_i > 0, (m_i + tl.log2(l_i)) * 0.6931471805599453, float("-inf"))
    rows = (b * Hkv + h) * G + offs_g
    tl.store(o_ptr + rows[:, None] * s_or + split * s_os + offs_d[None, :], o, mask=(offs_g < G)[:, None])
    tl.store(lse_ptr + rows * s_lr + split, lse, mask=offs_g < G)



# Launch configuration. Split count and pipeline depth are tuned on the first call per shape class (_choose):
# how many programs per SM balance the ramp/tail of one wave against per-split overhead depends on
# B * Hkv, L and the kept fraction, so it is measured rather than guessed (scripts/tune_masked_decode.py).
CONFIG = {"block_n": 128, "num_warps": 4, "num_stages": 2, "waves": 2}
CHOICES = ((1, 3), (2, 2), (3, 2), (4, 2), (6, 2), (8, 2))  # (waves, num_stages) tried on first call
_TUNED = {}


def _plan(B: int, Hkv: int, L: int, device: torch.device, waves: int):
    """Split L so that B * Hkv * splits ~ waves * SMs, with chunks of >= 512 tokens (multiples of 16)."""
    splits = max(1, min(round(waves * num_sms(device) / max(B * Hkv, 1)), triton.cdiv(L, 512)))
    chunk = triton.cdiv(triton.cdiv(max(L, 1), splits), 16) * 16
    return triton.cdiv(max(L, 1), chunk), chunk


def _choose(key, device, launch, cfg, tune: bool):
    """(waves, num_stages): the config's, or on first sight of a shape class on a GPU, the fastest candidate."""
    default = (cfg["waves"], cfg["num_stages"])
    if not tune:
        return default
    if key not in _TUNED:
        if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
            return default  # nothing to time (interpreter), or timing would break the capture
        times = {c: triton.testing.do_bench(lambda: launch(*c), warmup=3, rep=15, return_mode="median") for c in CHOICES}
        _TUNED[key] = min(times, key=times.get)
    return _TUNED[key]


def masked_decode_fwd(q, k, v, drop_mask, kv_lens, kv_len: int, sm_scale: float, out, lse, config=None):
    """q [B, Hq, D] (unit last stride); k, v [B, Hkv, L, D]; writes out [B, Hq, D] and lse [B, Hq] (contiguous).

    config may override CONFIG's keys; giving "waves" skips the first-call tuning of (waves, num_stages).
    """
    assert out.is_contiguous() and lse.is_contiguous()
    cfg = CONFIG if config is None else {**CONFIG, **config}
    B, Hq, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    G = Hq // Hkv
    if B == 0 or Hq == 0:
        return
    block_n = cfg["block_n"] if D <= 128 else cfg["block_n"] // 2  # same tile bytes at D=256
    span = L if kv_lens is not None else kv_len
    drop = drop_mask.view(torch.uint8) if drop_mask is not None else q
    ms = drop_mask.stride() if drop_mask is not None else (0, 0, 0)

    def launch(waves, num_stages):
        splits, chunk = _plan(B, Hkv, span, q.device, waves)
        o_part = torch.empty(B * Hq, splits, D, dtype=torch.float32, device=q.device)
        lse_part = torch.empty(B * Hq, splits, dtype=torch.float32, device=q.device)
        _split_kernel[(splits, B * Hkv)](
            q, k, v, drop, kv_lens if kv_lens is not None else q, o_part, lse_part,
            Hkv, L, kv_len, chunk, sm_scale * 1.4426950408889634,
            q.stride(0), q.stride(1), *k.stride()[:3], *v.stride()[:3], *ms,
            o_part.stride(0), o_part.stride(1), lse_part.stride(0),
            G=G, BLOCK_G=max(16, triton.next_power_of_2(G)), D=D, BLOCK_N=block_n,
            HAS_DROP=drop_mask is not None, HAS_LENS=kv_lens is not None, USE_GDC=pdl_enabled(q.device),
            num_warps=cfg["num_warps"], num_stages=num_stages,
        )
        combine(o_part, lse_part, out.view(B * Hq, D), lse.view(B * Hq))

    key = (q.device.index, q.dtype, B * Hkv, G, D, triton.next_power_of_2(max(span, 1)), drop_mask is not None)
    launch(*_choose(key, q.device, launch, cfg, tune=not (config and "waves" in config)))
