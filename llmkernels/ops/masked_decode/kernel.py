"""Flash-decoding with a per-(batch, kv-head, token) drop mask: split the keys, merge by log-sum-exp."""
import torch
import triton
import triton.language as tl

from ..._runtime import num_sms
from ..combine.kernel import combine, pdl_enabled, pdl_enter


@triton.jit
def _attend(q, k_base, v_base, m_base, s_kl, s_vl, s_ml, lo, hi, qk_scale,
            BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, HAS_DROP: tl.constexpr):
    """Online softmax of the G query rows over kept tokens [lo, hi): (running max, sum, unnormalised out)."""
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    if HAS_DROP:  # the mask of the next tile is loaded one iteration ahead, so its latency hides behind a tile
        nxt = tl.load(m_base + (lo + offs_n) * s_ml, mask=lo + offs_n < hi, other=1)
    for n0 in tl.range(lo, hi, BLOCK_N):
        offs = n0 + offs_n
        keep = offs < hi
        if HAS_DROP:
            keep = keep & (nxt == 0)
            nxt = tl.load(m_base + (offs + BLOCK_N) * s_ml, mask=offs + BLOCK_N < hi, other=1)
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
    return m_i, l_i, acc


@triton.jit
def _row_part(q_ptr, k_ptr, v_ptr, drop_ptr, lens_ptr, o_ptr, lse_ptr, r, lo, hi, slot, Hkv, L, kv_len, qk_scale,
              s_qb, s_qh, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_mh, s_ml, s_or, s_os, s_lr,
              G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
              HAS_DROP: tl.constexpr, HAS_LENS: tl.constexpr):
    """Attend the G query heads of (batch, kv head) r = b * Hkv + h to tokens [lo, hi) and store the part
    (normalised out, natural-log lse; -inf when nothing is kept) at index `slot` of its rows."""
    b = r // Hkv
    h = r % Hkv
    if HAS_LENS:
        hi = tl.minimum(hi, tl.minimum(tl.maximum(tl.load(lens_ptr + b), 0), L))
    else:
        hi = tl.minimum(hi, kv_len)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + b * s_qb + (h * G + offs_g)[:, None] * s_qh + offs_d[None, :],
                mask=(offs_g < G)[:, None], other=0.0)
    m_i, l_i, acc = _attend(q, k_ptr + b * s_kb + h * s_kh, v_ptr + b * s_vb + h * s_vh,
                            drop_ptr + b * s_mb + h * s_mh, s_kl, s_vl, s_ml, lo, hi, qk_scale,
                            BLOCK_G, D, BLOCK_N, HAS_DROP)
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    lse = tl.where(l_i > 0, (m_i + tl.log2(l_i)) * 0.6931471805599453, float("-inf"))
    rows = r * G + offs_g
    tl.store(o_ptr + rows[:, None] * s_or + slot * s_os + offs_d[None, :], o, mask=(offs_g < G)[:, None])
    tl.store(lse_ptr + rows * s_lr + slot, lse, mask=offs_g < G)


@triton.jit
def _split_kernel(
    q_ptr, k_ptr, v_ptr, drop_ptr, lens_ptr, o_ptr, lse_ptr,
    Hkv, L, kv_len, chunk, qk_scale,
    s_qb, s_qh, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_mh, s_ml, s_or, s_os, s_lr,
    G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_DROP: tl.constexpr, HAS_LENS: tl.constexpr, USE_GDC: tl.constexpr,
):
    """Grid (splits, B * Hkv): program (s, r) takes tokens [s * chunk, (s + 1) * chunk) of row r."""
    pdl_enter(USE_GDC)
    split = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    _row_part(q_ptr, k_ptr, v_ptr, drop_ptr, lens_ptr, o_ptr, lse_ptr, r, split * chunk, split * chunk + chunk,
              split, Hkv, L, kv_len, qk_scale, s_qb, s_qh, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_mh, s_ml,
              s_or, s_os, s_lr, G, BLOCK_G, D, BLOCK_N, HAS_DROP, HAS_LENS)


@triton.jit
def _stream_kernel(
    q_ptr, k_ptr, v_ptr, drop_ptr, lens_ptr, o_ptr, lse_ptr,
    Hkv, L, kv_len, upr, W, P, qk_scale,
    s_qb, s_qh, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_mh, s_ml, s_or, s_os, s_lr,
    G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, UNIT: tl.constexpr,
    S_MAX: tl.constexpr, BLOCK_S: tl.constexpr,
    HAS_DROP: tl.constexpr, HAS_LENS: tl.constexpr, USE_GDC: tl.constexpr,
):
    """Grid (P,): the W = B * Hkv * upr units of UNIT tokens are cut into P equal ranges, one per program, so
    every SM streams the same number of bytes in one wave (no split rounding, no second-wave ramp). A range
    may cross rows: each row segment becomes one part, stored at slot (program - first program of the row)."""
    pdl_enter(USE_GDC)
    p = tl.program_id(0).to(tl.int64)
    u = p * W // P
    u_end = (p + 1) * W // P
    while u < u_end:
        r = u // upr
        row_end = (r + 1) * upr
        seg_end = tl.minimum(u_end, row_end)
        first = ((r * upr + 1) * P - 1) // W  # the program that holds unit r * upr
        _row_part(q_ptr, k_ptr, v_ptr, drop_ptr, lens_ptr, o_ptr, lse_ptr, r, (u - r * upr) * UNIT,
                  (seg_end - r * upr) * UNIT, p - first, Hkv, L, kv_len, qk_scale,
                  s_qb, s_qh, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_mh, s_ml, s_or, s_os, s_lr,
                  G, BLOCK_G, D, BLOCK_N, HAS_DROP, HAS_LENS)
        if seg_end == row_end:  # this program closes row r: mark the row's unused slots empty for the merge
            n_parts = p - first + 1
            offs_s = tl.arange(0, BLOCK_S)
            offs_g = tl.arange(0, BLOCK_G)
            tl.store(lse_ptr + (r * G + offs_g)[:, None] * s_lr + offs_s[None, :], float("-inf"),
                     mask=(offs_g < G)[:, None] & ((offs_s >= n_parts) & (offs_s < S_MAX))[None, :])
        u = seg_end


# Launch configuration. "stream" cuts the work into one equal range per resident program; "split" gives every
# (batch, kv head) the same number of splits, with (waves, num_stages) timed on the first call per shape class
# (how many programs per SM balance ramp/tail against per-split overhead depends on B * Hkv and L).
CONFIG = {"plan": "split", "block_n": 128, "num_warps": 4, "num_stages": 2, "waves": 2, "per_sm": 1, "pdl": True}
CHOICES = ((1, 3), (2, 2), (3, 2), (4, 2), (6, 2), (8, 2))  # (waves, num_stages) tried on first call
UNIT = 16  # tokens: granularity of the stream plan's ranges
_TUNED = {}


def _plan(B: int, Hkv: int, L: int, device: torch.device, waves: int):
    """Split L so that B * Hkv * splits ~ waves * SMs, with chunks of >= 512 tokens (multiples of 16)."""
    splits = max(1, min(round(waves * num_sms(device) / max(B * Hkv, 1)), triton.cdiv(L, 512)))
    chunk = triton.cdiv(triton.cdiv(max(L, 1), splits), 16) * 16
    return triton.cdiv(max(L, 1), chunk), chunk


def stream_plan(rows: int, span: int, device: torch.device, per_sm: int):
    """(units per row, total units W, programs P, most parts of one row) for the stream plan."""
    upr = triton.cdiv(max(span, 1), UNIT)
    W = rows * upr
    P = max(1, min(W, per_sm * num_sms(device)))
    # a row of upr units meets at most ceil(upr / min range) + 1 ranges (and never more than P)
    return upr, W, P, min(P, triton.cdiv(upr, W // P) + 1)


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

    config may override CONFIG's keys; with the split plan, giving "waves" skips the first-call tuning.
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
    args = (q, k, v, drop, kv_lens if kv_lens is not None else q)
    pdl = pdl_enabled(q.device)
    strides = (q.stride(0), q.stride(1), *k.stride()[:3], *v.stride()[:3], *ms)
    meta = dict(G=G, BLOCK_G=max(16, triton.next_power_of_2(G)), D=D, BLOCK_N=block_n,
                HAS_DROP=drop_mask is not None, HAS_LENS=kv_lens is not None, USE_GDC=pdl,
                num_warps=cfg["num_warps"], **({"launch_pdl": True} if pdl and cfg["pdl"] else {}))

    if cfg["plan"] == "stream":
        upr, W, P, s_max = stream_plan(B * Hkv, span, q.device, cfg["per_sm"])
        o_part = torch.empty(B * Hq, s_max, D, dtype=torch.float32, device=q.device)
        lse_part = torch.empty(B * Hq, s_max, dtype=torch.float32, device=q.device)
        _stream_kernel[(P,)](*args, o_part, lse_part, Hkv, L, kv_len, upr, W, P, sm_scale * 1.4426950408889634,
                             *strides, o_part.stride(0), o_part.stride(1), lse_part.stride(0),
                             UNIT=UNIT, S_MAX=s_max, BLOCK_S=triton.next_power_of_2(s_max),
                             num_stages=cfg["num_stages"], **meta)
        combine(o_part, lse_part, out.view(B * Hq, D), lse.view(B * Hq))
        return

    def launch(waves, num_stages):
        splits, chunk = _plan(B, Hkv, span, q.device, waves)
        o_part = torch.empty(B * Hq, splits, D, dtype=torch.float32, device=q.device)
        lse_part = torch.empty(B * Hq, splits, dtype=torch.float32, device=q.device)
        _split_kernel[(splits, B * Hkv)](*args, o_part, lse_part, Hkv, L, kv_len, chunk, sm_scale * 1.4426950408889634,
                                         *strides, o_part.stride(0), o_part.stride(1), lse_part.stride(0),
                                         num_stages=num_stages, **meta)
        combine(o_part, lse_part, out.view(B * Hq, D), lse.view(B * Hq))

    key = (q.device.index, q.dtype, B * Hkv, G, D, triton.next_power_of_2(max(span, 1)), drop_mask is not None)
    launch(*_choose(key, q.device, launch, cfg, tune=not (config and "waves" in config)))
