"""Split-KV paged decode with Transformer-XL relative-position terms: scale * ((q + u) . k + bd)."""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..._constants import LN2_C, LOG2E, LOG2E_C
from ..._launch import cached_plan, current_device, tkey
from ..._config import KernelConfig
from ..._runtime import cdiv, next_pow2, num_sms
from ..._pdl import pdl_enabled, pdl_enter
from ..combine.kernel import SplitParts, merge_if_last, softmax_step


@triton.jit
def _legacy_k_tile(k_base, kv_blk, off, tok_ok, s_kb, D: tl.constexpr, BLOCK_D: tl.constexpr, BS: tl.constexpr,
                   KX: tl.constexpr):
    """Legacy K [nb, Hkv, D/KX, BS, KX] loaded in memory order as [D/KX, BLOCK_N, KX]: per (block, head) the slab
    [D/KX][BS][KX] is contiguous, so consecutive tokens of one KX-chunk (whole runs of BS * 16 bytes) sit on
    consecutive lanes. kv_blk / off / tok_ok: per-token block id, offset in the block, load mask."""
    NC: tl.constexpr = BLOCK_D // KX
    offs_c = tl.arange(0, NC)
    offs_e = tl.arange(0, KX)
    k_off = (kv_blk[None, :, None] * s_kb + offs_c[:, None, None] * (BS * KX) + off[None, :, None] * KX
             + offs_e[None, None, :])
    return tl.load(k_base + k_off, mask=(offs_c < D // KX)[:, None, None] & tok_ok[None, :, None], other=0.0)


@triton.jit
def _tile(n0, end, lo, qpos, rel_e, m_i, l_i, acc, q, k_base, v_base, tbl_base, bd_base, num_blocks, qk_scale, s_kb,
          s_kt, s_vb, s_vt, s_tb, s_bt, gmask, offs_d, dmask, D: tl.constexpr, BLOCK_D: tl.constexpr, BS: tl.constexpr,
          BSUB: tl.constexpr, BLOCK_N: tl.constexpr, KX: tl.constexpr, LEGACY: tl.constexpr, HAS_BD: tl.constexpr,
          DOT_PREC: tl.constexpr, TAIL: tl.constexpr, PAGED: tl.constexpr = True, REL: tl.constexpr = False,
          HAS_LO: tl.constexpr = False):
    """One tile of BLOCK_N tokens (runs of BSUB tokens, each inside one cache block) into the online softmax.
    TAIL: the tile may end inside a run (context end); otherwise every token of a live run is < end.
    HAS_LO: tokens below lo are not attended (a window, left padding). REL / PAGED: see the kernel."""
    offs_n = tl.arange(0, BLOCK_N)
    tok = n0 + offs_n
    live = n0 + (offs_n // BSUB) * BSUB < end  # runs past the context: their table entries are never read
    if PAGED:
        blk = _table(n0, end, tbl_base, s_tb, BS, BSUB, BLOCK_N)
        live = live & (blk >= 0) & (blk < num_blocks)  # out-of-range ids: never read, tokens skipped
        kv_blk1 = tl.where(live, blk, 0).to(tl.int64)
        off1 = tok % BS
    else:  # one sequence's cache [L, D] rows: k_base / v_base are the sequence's
        kv_blk1 = tl.zeros([BLOCK_N], tl.int64)
        off1 = tok
    valid = live & (tok < end) if TAIL else live
    if HAS_LO:
        valid = valid & (tok >= lo)
    kv_blk = kv_blk1[:, None]
    off = off1[:, None]
    kmask = valid[:, None] & dmask[None, :]
    if LEGACY:  # k [nb, Hkv, D/KX, BS, KX], each (block, head) slab contiguous: KX-wide runs along d
        k_off = (offs_d[None, :] // KX) * (BS * KX) + off * KX + offs_d[None, :] % KX
    else:  # NHD [nb, BS, Hkv, D]
        k_off = off * s_kt + offs_d[None, :]
    kt = tl.trans(tl.load(k_base + kv_blk * s_kb + k_off, mask=kmask, other=0.0))
    if LEGACY:
        # v [nb, Hkv, D, BS] is contiguous along tokens: per d, a run is BSUB consecutive elements starting at
        # a multiple of BSUB (the host checks the block/head strides). The table lookup hides this from the
        # compiler, so say it, and mask whole runs to keep the loads 16 bytes wide (a used, in-range block is
        # read whole); in the tail tile, slots past the context (maybe never written: NaN) are zeroed.
        v_off = kv_blk * s_vb + offs_d[None, :] * BS + off
        v_off = tl.max_contiguous(tl.multiple_of(v_off, [BSUB, 1]), [BSUB, 1])
        v = tl.load(v_base + v_off, mask=tl.max_constancy(live, [BSUB])[:, None] & dmask[None, :], other=0.0)
        if TAIL or HAS_LO:
            v = tl.where(valid[:, None], v, 0.0)
    else:
        v = tl.load(v_base + kv_blk * s_vb + off * s_vt + offs_d[None, :], mask=kmask, other=0.0)
    sc = tl.dot(q, kt, input_precision=DOT_PREC)
    if REL:  # compact relative bias outside the scale: scale * q.k + rel[qpos - tok] inside the band
        dist = qpos - tok
        b = tl.load(bd_base + dist[None, :] * s_bt, mask=gmask[:, None] & (valid & (dist < rel_e))[None, :], other=0.0)
        sc = tl.where(valid[None, :], sc * qk_scale + b.to(tl.float32) * LOG2E_C, float("-inf"))
    else:
        if HAS_BD:  # positional term, inside the scale: scale * (ac + bd)
            sc += tl.load(bd_base + tok[None, :] * s_bt, mask=gmask[:, None] & valid[None, :],
                          other=0.0).to(tl.float32)
        sc = tl.where(valid[None, :], sc * qk_scale, float("-inf"))
    p, alpha, m_new, l_i = softmax_step(sc, m_i, l_i, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
    return m_new, l_i, acc


@triton.jit
def _table(n0, end, tbl_base, s_tb, BS: tl.constexpr, BSUB: tl.constexpr, BLOCK_N: tl.constexpr):
    """Block ids of tile n0's tokens; runs starting at or past end are not read (-1)."""
    offs_n = tl.arange(0, BLOCK_N)
    live = n0 + (offs_n // BSUB) * BSUB < end
    return tl.load(tbl_base + ((n0 + offs_n) // BS) * s_tb, mask=live, other=-1)


@triton.jit
def _tile_mha(n0, end, lo, qpos, rel_e, blk, m_i, l_i, acc, q, k_base, v_base, tbl_base, bd_base, num_blocks, qk_scale,
              s_kb, s_kt, s_vb, s_vt, s_tb, s_bt, offs_d, dmask, D: tl.constexpr, BLOCK_D: tl.constexpr,
              BS: tl.constexpr, BSUB: tl.constexpr, BLOCK_N: tl.constexpr, KX: tl.constexpr, LEGACY: tl.constexpr,
              HAS_BD: tl.constexpr, TAIL: tl.constexpr, HAVE_BLK: tl.constexpr, PAGED: tl.constexpr = True,
              REL: tl.constexpr = False, HAS_LO: tl.constexpr = False):
    """G == 1: one head per program, so no padded dot. Scores and P.V as fp32 multiply + reductions on the K and
    V tiles in their memory order (no shared-memory transposition): q [BLOCK_D] fp32, m_i and l_i scalars,
    acc [BLOCK_D]. Same masking contract as _tile (whole live runs loaded; the tail zeroes V past the context).
    HAVE_BLK: blk holds this tile's table entries (_table, loaded one tile ahead); else they are loaded here."""
    offs_n = tl.arange(0, BLOCK_N)
    tok = n0 + offs_n
    live = n0 + (offs_n // BSUB) * BSUB < end  # runs past the context: their table entries are never read
    if PAGED:
        if not HAVE_BLK:
            blk = _table(n0, end, tbl_base, s_tb, BS, BSUB, BLOCK_N)
        live = live & (blk >= 0) & (blk < num_blocks)  # out-of-range ids: never read, tokens skipped
        kv_blk = tl.where(live, blk, 0).to(tl.int64)
        off = tok % BS
    else:
        kv_blk = tl.zeros([BLOCK_N], tl.int64)
        off = tok
    valid = live & (tok < end) if TAIL else live
    if HAS_LO:
        valid = valid & (tok >= lo)
    lrun = tl.max_constancy(live, [BSUB])
    if LEGACY:
        k = _legacy_k_tile(k_base, kv_blk, off, lrun, s_kb, D, BLOCK_D, BS, KX)
        q3 = tl.reshape(q, (BLOCK_D // KX, KX))[:, None, :]
        sc = tl.sum(tl.sum(k.to(tl.float32) * q3, axis=2), axis=0)
    else:  # NHD [nb, BS, Hkv, D]: rows of D contiguous
        k = tl.load(k_base + kv_blk[:, None] * s_kb + off[:, None] * s_kt + offs_d[None, :],
                    mask=lrun[:, None] & dmask[None, :], other=0.0)
        sc = tl.sum(k.to(tl.float32) * q[None, :], axis=1)
    if REL:  # compact relative bias outside the scale (see _tile)
        dist = qpos - tok
        b = tl.load(bd_base + dist * s_bt, mask=valid & (dist < rel_e), other=0.0).to(tl.float32)
        sc = tl.where(valid, sc * qk_scale + b * LOG2E_C, float("-inf"))
    else:
        if HAS_BD:  # positional term, inside the scale: scale * (ac + bd)
            sc += tl.load(bd_base + tok * s_bt, mask=valid, other=0.0).to(tl.float32)
        sc = tl.where(valid, sc * qk_scale, float("-inf"))  # also drops K slots past the context (maybe NaN)
    p, alpha, m_new, l_i = softmax_step(sc, m_i, l_i, 0)
    if LEGACY:  # v [nb, Hkv, D, BS]: per d a run of BSUB contiguous tokens starting at a multiple of BSUB
        v_off = kv_blk[None, :] * s_vb + offs_d[:, None] * BS + off[None, :]
        v_off = tl.max_contiguous(tl.multiple_of(v_off, [1, BSUB]), [1, BSUB])
        v = tl.load(v_base + v_off, mask=dmask[:, None] & lrun[None, :], other=0.0)
        if TAIL or HAS_LO:  # slots past the context (or below lo) may hold NaN (0 * NaN = NaN): zero them
            v = tl.where(valid[None, :], v, 0.0)
        pv = tl.sum(v.to(tl.float32) * p[None, :], axis=1)
    else:
        v = tl.load(v_base + kv_blk[:, None] * s_vb + off[:, None] * s_vt + offs_d[None, :],
                    mask=lrun[:, None] & dmask[None, :], other=0.0)
        if TAIL or HAS_LO:
            v = tl.where(valid[:, None], v, 0.0)
        pv = tl.sum(v.to(tl.float32) * p[:, None], axis=0)
    acc = acc * alpha + pv
    return m_new, l_i, acc


@triton.jit
def _xl_decode_split_kernel(
    q_ptr, u_ptr, bd_ptr, k_ptr, v_ptr, tbl_ptr, lens_ptr, starts_ptr, o_ptr, lse_ptr, cnt_ptr, out_ptr, lse_out_ptr,
    Hkv, num_blocks, max_len, chunk, qk_scale,
    s_qs, s_qh, s_us, s_uh, s_bs, s_bh, s_bt,
    s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_ts, s_tb, s_or, s_os, s_lr, window, rel_e,
    G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BS: tl.constexpr, BSUB: tl.constexpr, BLOCK_N: tl.constexpr, KX: tl.constexpr, LEGACY: tl.constexpr,
    HAS_U: tl.constexpr, HAS_BD: tl.constexpr, DOT_PREC: tl.constexpr, MHA_REDUCE: tl.constexpr,
    PREFETCH_TBL: tl.constexpr, USE_GDC: tl.constexpr,
    FUSED: tl.constexpr = False, MB_S: tl.constexpr = 1, MB_D: tl.constexpr = 1, MB_ONE: tl.constexpr = True,
    TRIGGER: tl.constexpr = True, PAGED: tl.constexpr = True, REL: tl.constexpr = False,
    HAS_WINDOW: tl.constexpr = False, HAS_STARTS: tl.constexpr = False,
):
    """Grid (splits, S * Hkv): the G heads of kv head hk of sequence s over tokens [base + split * chunk, + chunk),
    stored as a part (with one split: out / lse). FUSED: the last program of the row merges (see masked_decode's
    kernel). PAGED False: k / v are [S, Hkv, L, D] (s_kb / s_vb the sequence strides), no table. REL: bd is a
    compact bias [S, H, rel_e] (s_bt its distance stride): the query sits at position length - 1 and token t gets
    bd[length - 1 - t] inside the band, outside the scale. Tokens below lo = max(starts[s], length - window) are not
    attended (HAS_STARTS, HAS_WINDOW) and not read below base, lo rounded down to BLOCK_N."""
    pdl_enter(USE_GDC, TRIGGER)
    split = tl.program_id(0)
    sh = tl.program_id(1)
    s = (sh // Hkv).to(tl.int64)
    hk = (sh % Hkv).to(tl.int64)
    length = tl.minimum(tl.maximum(tl.load(lens_ptr + s), 0), max_len)
    lo = 0
    if HAS_STARTS:
        lo = tl.minimum(tl.maximum(tl.load(starts_ptr + s), 0), length)
    if HAS_WINDOW:
        lo = tl.maximum(lo, length - window)
    qpos = length - 1
    start = lo // BLOCK_N * BLOCK_N + split * chunk
    end = tl.minimum(start + chunk, length)
    full_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N
    TAIL_N: tl.constexpr = 16
    HAS_LO: tl.constexpr = HAS_STARTS or HAS_WINDOW

    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    k_base = k_ptr + hk * s_kh
    v_base = v_ptr + hk * s_vh
    if not PAGED:
        k_base += s * s_kb
        v_base += s * s_vb
    tbl_base = tbl_ptr + s * s_ts
    if MHA_REDUCE:  # G == 1: (q + u) stays fp32; scalar softmax state
        q = tl.load(q_ptr + s * s_qs + hk * s_qh + offs_d, mask=dmask, other=0.0).to(tl.float32)
        if HAS_U:
            q += tl.load(u_ptr + s * s_us + hk * s_uh + offs_d, mask=dmask, other=0.0).to(tl.float32)
        bd_base = bd_ptr + s * s_bs + hk * s_bh
        m_i = tl.full((), float("-inf"), tl.float32)
        l_i = tl.full((), 0.0, tl.float32)
        acc = tl.zeros([BLOCK_D], tl.float32)
        if PREFETCH_TBL:  # the next tile's block ids are loaded one iteration ahead (the K/V loads wait on them)
            blk = _table(start, full_end, tbl_base, s_tb, BS, BSUB, BLOCK_N)
            for n0 in tl.range(start, full_end, BLOCK_N):
                n0 = tl.multiple_of(n0, BLOCK_N)
                blk_next = _table(n0 + BLOCK_N, full_end, tbl_base, s_tb, BS, BSUB, BLOCK_N)
                m_i, l_i, acc = _tile_mha(n0, end, lo, qpos, rel_e, blk, m_i, l_i, acc, q, k_base, v_base, tbl_base,
                                          bd_base, num_blocks, qk_scale, s_kb, s_kt, s_vb, s_vt, s_tb, s_bt, offs_d,
                                          dmask, D, BLOCK_D, BS, BSUB, BLOCK_N, KX, LEGACY, HAS_BD, False, True,
                                          PAGED, REL, HAS_LO)
                blk = blk_next
        else:
            for n0 in tl.range(start, full_end, BLOCK_N):
                n0 = tl.multiple_of(n0, BLOCK_N)
                m_i, l_i, acc = _tile_mha(n0, end, lo, qpos, rel_e, 0, m_i, l_i, acc, q, k_base, v_base, tbl_base,
                                          bd_base, num_blocks, qk_scale, s_kb, s_kt, s_vb, s_vt, s_tb, s_bt, offs_d,
                                          dmask, D, BLOCK_D, BS, BSUB, BLOCK_N, KX, LEGACY, HAS_BD, False, False,
                                          PAGED, REL, HAS_LO)
        for n0 in tl.range(full_end, end, TAIL_N):
            m_i, l_i, acc = _tile_mha(tl.multiple_of(n0, TAIL_N), end, lo, qpos, rel_e, 0, m_i, l_i, acc, q, k_base,
                                      v_base, tbl_base, bd_base, num_blocks, qk_scale, s_kb, s_kt, s_vb, s_vt, s_tb,
                                      s_bt, offs_d, dmask, D, BLOCK_D, BS, min(BSUB, TAIL_N), TAIL_N, KX, LEGACY,
                                      HAS_BD, True, False, PAGED, REL, HAS_LO)
        o = acc / tl.where(l_i == 0, 1.0, l_i)  # l == 0: nothing attended; NaN l (a NaN logit) stays NaN
        lse = tl.where(l_i == 0, float("-inf"), (m_i + tl.log2(l_i)) * LN2_C)
        row = s * Hkv + hk
        tl.store(o_ptr + row * s_or + split * s_os + offs_d, o, mask=dmask)
        tl.store(lse_ptr + row * s_lr + split, lse)
    else:
        offs_g = tl.arange(0, BLOCK_G)
        heads = hk * G + offs_g
        gmask = offs_g < G
        qmask = gmask[:, None] & dmask[None, :]
        q = tl.load(q_ptr + s * s_qs + heads[:, None] * s_qh + offs_d[None, :], mask=qmask, other=0.0).to(tl.float32)
        if HAS_U:  # content bias: (q + u) . k, rounded once to the cache dtype for the tensor-core dot
            q += tl.load(u_ptr + s * s_us + heads[:, None] * s_uh + offs_d[None, :], mask=qmask,
                         other=0.0).to(tl.float32)
        q = q.to(k_ptr.dtype.element_ty)
        bd_base = bd_ptr + s * s_bs + heads[:, None] * s_bh

        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for n0 in tl.range(start, full_end, BLOCK_N):
            n0 = tl.multiple_of(n0, BLOCK_N)  # start is a multiple of chunk, itself a multiple of BLOCK_N
            m_i, l_i, acc = _tile(n0, end, lo, qpos, rel_e, m_i, l_i, acc, q, k_base, v_base, tbl_base, bd_base,
                                  num_blocks, qk_scale, s_kb, s_kt, s_vb, s_vt, s_tb, s_bt, gmask, offs_d, dmask,
                                  D, BLOCK_D, BS, BSUB, BLOCK_N, KX, LEGACY, HAS_BD, DOT_PREC, False,
                                  PAGED, REL, HAS_LO)
        # the last, partial tile, in 16-token steps (a small loop: the main loop's registers stay as they are)
        for n0 in tl.range(full_end, end, TAIL_N):
            m_i, l_i, acc = _tile(tl.multiple_of(n0, TAIL_N), end, lo, qpos, rel_e, m_i, l_i, acc, q, k_base, v_base,
                                  tbl_base, bd_base, num_blocks, qk_scale, s_kb, s_kt, s_vb, s_vt, s_tb, s_bt, gmask,
                                  offs_d, dmask, D, BLOCK_D, BS, min(BSUB, TAIL_N), TAIL_N, KX, LEGACY,
                                  HAS_BD, DOT_PREC, True, PAGED, REL, HAS_LO)
        o = acc / tl.where(l_i == 0, 1.0, l_i)[:, None]
        lse = tl.where(l_i == 0, float("-inf"), (m_i + tl.log2(l_i)) * LN2_C)
        rows = (s * Hkv + hk) * G + offs_g
        tl.store(o_ptr + rows[:, None] * s_or + split * s_os + offs_d[None, :], o, mask=qmask)
        tl.store(lse_ptr + rows * s_lr + split, lse, mask=gmask)
    if FUSED:
        merge_if_last(cnt_ptr, sh, o_ptr, lse_ptr, out_ptr, lse_out_ptr, sh * G, tl.num_programs(0), D, s_os, s_or,
                      s_lr, G, MB_S, MB_D, MB_ONE)


@dataclass(frozen=True)
class XLConfig(KernelConfig):
    """Launch knobs (default_config picks them per head dim, dtype and layout). Variant knobs (v4 candidates,
    selectable for a device sweep; the defaults are v2's measured path):
      mha_path: "dot" (the GQA group padded to 16 rows for tl.dot) or "reduce" (G == 1 only: fp32 multiply +
        reductions on K and V tiles in memory order, no padded dot); ignored when G > 1.
      prefetch_table: reduce path only: load the next tile's block ids one iteration ahead (Triton does not
        cp.async-pipeline loads that feed no dot, so the table -> K/V latency chain is otherwise exposed).
    fuse_merge: eager calls merge the parts in the split kernel while G x splits <= this (masked_decode's knob) and
      the call reads < FUSE_MAX_BYTES of K and V."""
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    programs_per_sm: int = 16
    mha_path: str = "dot"
    prefetch_table: bool = False
    pdl: bool = True
    fuse_merge: int = 64
    min_tiles: int = 4  # a split's chunk holds at least this many tiles
    maxnreg: int = 0  # > 0: the split kernel's register cap (more programs resident an SM; sweeps)

    def __post_init__(self):
        if self.mha_path not in ("dot", "reduce"):
            raise ValueError(f"unknown variant mha_path={self.mha_path!r}")


def default_config(D: int, esize: int, legacy: bool = False, G: int = 1) -> XLConfig:
    """16 KiB K (and V) tiles, 4 warps (fp32: 8, else its IEEE dot spills), 2 stages (fp16 D=128: 119-128
    registers, 4 programs per SM); split until ~16 programs per SM so the last wave is a small part of the run.
    legacy and G pick the measured per-layout overrides of LAYOUT_DEFAULTS."""
    block_n = max(16, min(64, 16384 // (next_pow2(D) * esize)))
    cfg = XLConfig(block_n=block_n, num_warps=8 if esize == 4 else 4)
    return cfg.with_(LAYOUT_DEFAULTS.get(("legacy" if legacy else "nhd", "mha" if G == 1 else "gqa")))


# Overrides of default_config per (layout, "mha" (G == 1) / "gqa" (G > 1)), from the device sweeps of
# xl_legacy_sweep.py (benchmarks/notes/xl_paged_decode.md, "v4 measured"): legacy MHA reads K and V in memory order
# with the reduce path, one 16-token tile per iteration, 2 warps, 32 programs per SM (occupancy hides the latency
# that the missing cp.async pipeline leaves): 92.0 / 92.2 % of the floor against v2's 74 / 76 %. Eager calls merge
# at most 32 parts in the split kernel: its 2 warps hold a 64-part [64, 128] fp32 tile at 128 registers a thread, and
# the last program's merge made an eager 4 x 32K call 386 us against 269 us with the merge launch (H200).
FUSE_MAX_BYTES = 1 << 30  # eager calls reading this much K and V leave the merge to a merge launch (XLPlan)
LAYOUT_DEFAULTS = {("legacy", "mha"): {"mha_path": "reduce", "prefetch_table": True, "programs_per_sm": 32,
                                        "block_n": 16, "num_warps": 2, "fuse_merge": 32}}


def rel_overrides(rows: int, span: int, window: int, block_n: int) -> dict:
    """inkling_decode's launch knobs by regime (rows = S * Hkv, span = the tokens a row may read, block_n the
    default's 16 KiB tile), from the H200 sweep of benchmarks/notes/inkling.md (bf16, D 128: default tiles of 64):
    one or two rows (a tensor-parallel shard at batch 1) are latency-bound: tiles twice as long; a few rows or a short
    window: 3 stages, unsplit chunks down to a tile; many tokens over fewer than 128 rows, or any window: tiles half
    as long, 3 stages, ~2 programs an SM (the default's finer splits read 53 % of the floor at B 1, Hkv 8, 64K,
    these 85 %); many long rows keep the default (90-96 %)."""
    if rows <= 2:
        return dict(block_n=2 * block_n, num_stages=3 if span >= 32768 else 2, min_tiles=4 if span >= 32768 else 1)
    if rows * span >= 65536 and (window or rows < 128):
        return dict(block_n=max(16, block_n // 2), num_stages=3, programs_per_sm=2)
    if rows * span < 65536:
        return dict(num_stages=3, min_tiles=1)
    return {}


def _plan(S: int, Hkv: int, span: int, device: torch.device, block_n: int, programs_per_sm: int, min_tiles: int = 4):
    """Split the table span so that S * Hkv * splits comes to the target without passing it (rounding up ran a
    partial second wave: xl legacy 64 x 4K 87 -> 92 % of floor rounded down, H200), chunks of >= min_tiles tiles."""
    target = programs_per_sm * num_sms(device)
    splits = max(1, min(target // max(S * Hkv, 1), cdiv(span, min_tiles * block_n)))
    chunk = cdiv(cdiv(max(span, 1), splits), block_n) * block_n
    return cdiv(max(span, 1), chunk), chunk


class XLPlan:
    """The launches of one xl_paged_decode (or inkling_decode) call shape (the split kernel; its merge: SplitParts),
    everything but the tensors fixed.

    q [S, H, D] unit last stride; u None, [S, H, D] or [H, D]; bd None or [S, H, >= 1] any strides; k/v caches in
    either paged layout (see op.py), or with block_tables None [S, Hkv, L, D] (unit last stride); block_tables
    [S, max_blocks] int32; context_lens [S] int32 contiguous; out [S, H, D] and lse [S, H] contiguous.
    rel: bd is inkling_decode's compact bias [S, H, E] (E = bd.shape[-1]); window (0: none) and starts (whether a
    starts tensor comes): the keys attended (see the kernel)."""

    def __init__(self, q, k_cache, v_cache, block_tables, u, bd, scale: float, config=None, rel: bool = False,
                 window: int = 0, starts: bool = False):
        S, H, D = q.shape
        paged = block_tables is not None
        legacy = k_cache.dim() == 5
        Hkv = k_cache.shape[1] if legacy or not paged else k_cache.shape[2]
        self.empty = S == 0 or H == 0
        if self.empty:
            return
        G = H // Hkv
        cfg = default_config(D, q.element_size(), legacy, G)
        if paged:
            bs = k_cache.shape[3] if legacy else k_cache.shape[1]
            max_len = block_tables.shape[1] * bs
        else:
            bs, max_len = None, k_cache.shape[2]
        if bd is not None and not rel:
            max_len = min(max_len, bd.shape[-1])
        if rel:
            cfg = cfg.with_(rel_overrides(S * Hkv, min(max_len, window) if window else max_len, window, cfg.block_n))
        cfg = cfg.with_(config)
        block_n = cfg.block_n
        bs = bs or block_n
        pdl = pdl_enabled(q.device)  # split kernel waits on its predecessor and releases the merge (see combine)
        span = min(max_len, window + block_n) if window else max_len  # lo rounds down to a tile
        splits, chunk = _plan(S, Hkv, span, q.device, block_n, cfg.programs_per_sm, cfg.min_tiles)
        us = (0, 0) if u is None else ((0, u.stride(0)) if u.dim() == 2 else (u.stride(0), u.stride(1)))
        bds = (0, 0, 0) if bd is None else tuple(bd.stride())
        if legacy:
            ks = (k_cache.stride(0), k_cache.stride(1), 0)
            vs = (v_cache.stride(0), v_cache.stride(1), 0)
        elif paged:
            ks = (k_cache.stride(0), k_cache.stride(2), k_cache.stride(1))
            vs = (v_cache.stride(0), v_cache.stride(2), v_cache.stride(1))
        else:  # [S, Hkv, L, D]: the sequence stride in the block's place
            ks, vs = k_cache.stride()[:3], v_cache.stride()[:3]
        tbs = block_tables.stride() if paged else (0, 0)
        # past ~1 GiB of K and V a merge launch costs < 1 % and the merging variant ran 2.5-7 % slower (H200, nhd)
        fuse = G * splits <= cfg.fuse_merge and 2 * S * Hkv * span * D * q.element_size() < FUSE_MAX_BYTES
        self.parts = SplitParts(S * H, splits, D, S * Hkv, fuse, q.device)
        self.ints = (Hkv, k_cache.shape[0], max_len, chunk, scale * LOG2E, q.stride(0), q.stride(1),
                     *us, *bds, *ks, *vs, *tbs, *self.parts.strides, window, bd.shape[-1] if rel else 0)
        consts = dict(
            G=G, BLOCK_G=max(16, next_pow2(G)), D=D, BLOCK_D=next_pow2(D),
            BS=bs, BSUB=min(bs, block_n), BLOCK_N=block_n, KX=k_cache.shape[4] if legacy else 1, LEGACY=legacy,
            HAS_U=u is not None, HAS_BD=bd is not None, DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32",
            MHA_REDUCE=G == 1 and cfg.mha_path == "reduce",
            PREFETCH_TBL=bool(cfg.prefetch_table) and paged, USE_GDC=pdl, num_warps=cfg.num_warps,
            **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}),
            num_stages=cfg.num_stages, PAGED=paged, REL=rel, HAS_WINDOW=window > 0, HAS_STARTS=starts,
            **({"launch_pdl": True} if pdl and cfg.pdl else {}))
        self.split, self.fused = self.parts.launches(_xl_decode_split_kernel, (splits, S * Hkv), consts)

    def __call__(self, q, k_cache, v_cache, block_tables, context_lens, u, bd, out, lse, starts=None) -> None:
        if self.empty:
            return
        go, fused = self.parts.pick(self.split, self.fused, q.device)
        self.parts.launch(go, fused, (q, u if u is not None else q, bd if bd is not None else q, k_cache, v_cache,
                                      block_tables if block_tables is not None else context_lens, context_lens,
                                      starts if starts is not None else context_lens), self.ints, out, lse, q)


_PLANS = "xl_paged_decode.plan"


def xl_plan(q, k_cache, v_cache, block_tables, context_lens, u, bd, scale: float, rel: bool = False,
            window: int = 0, starts: bool = False) -> XLPlan:
    """The cached plan for these (already checked) arguments (rel / window / starts: inkling_decode's, see XLPlan)."""
    return cached_plan((_PLANS, current_device(), tkey(q), tkey(k_cache), tkey(v_cache), tkey(block_tables),
                        tkey(context_lens), tkey(u), tkey(bd), scale, rel, window, starts),
                       lambda: XLPlan(q, k_cache, v_cache, block_tables, u, bd, scale, rel=rel, window=window,
                                      starts=starts))


def xl_paged_decode_fwd(q, k_cache, v_cache, block_tables, context_lens, u, bd, scale: float, out, lse,
                        config=None):
    """Launch on validated inputs; writes out [S, H, D] (contiguous) and lse [S, H] fp32. config (tests, sweeps)
    overrides launch keys and bypasses the plan cache."""
    plan = XLPlan(q, k_cache, v_cache, block_tables, u, bd, scale, config) if config else \
        xl_plan(q, k_cache, v_cache, block_tables, context_lens, u, bd, scale)
    plan(q, k_cache, v_cache, block_tables, context_lens, u, bd, out, lse)
