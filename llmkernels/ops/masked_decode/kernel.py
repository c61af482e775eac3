"""Flash-decoding with a per-(batch, kv-head, token) drop mask: split the keys, merge by log-sum-exp."""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..._constants import LN2_C, LOG2E
from ..._launch import cached_plan, current_device, tkey
from ..._config import KernelConfig
from ..._runtime import cdiv, next_pow2, num_sms
from ..._pdl import pdl_enabled, pdl_enter
from ..combine.kernel import SplitParts, merge_if_last, softmax_step


@triton.jit
def _attend(q, k_base, v_base, m_base, s_kl, s_vl, s_ml, lo, hi, step, qk_scale,
            BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, HAS_DROP: tl.constexpr,
            n_list=0, dense_from=0, length=0, INDEXED: tl.constexpr = False, LIST_AHEAD: tl.constexpr = True,
            PREFIX: tl.constexpr = False):
    """Online softmax of the G query rows over the kept tokens of the tiles at lo, lo + step, ... below hi:
    (running max, sum, unnormalised out). INDEXED: the tiles run over a row of n_list listed positions (m_base, the
    list; those outside [0, min(dense_from, length)) skipped) followed by the positions dense_from .. length - 1;
    LIST_AHEAD: a tile's list entries loaded one iteration ahead (else in the iteration, left to the pipeliner);
    PREFIX: the list is 0 .. n_list - 1 (a compacted row: contiguous tiles, no list read)."""
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    if HAS_DROP:  # the mask of the next tile is loaded one iteration ahead, so its latency hides behind a tile
        nxt = tl.load(m_base + (lo + offs_n) * s_ml, mask=lo + offs_n < hi, other=1)
    if INDEXED:  # likewise the next tile's listed positions
        lim = tl.minimum(dense_from, length)
        if LIST_AHEAD and not PREFIX:
            nxt = tl.load(m_base + (lo + offs_n) * s_ml, mask=lo + offs_n < n_list, other=-1)
    for n0 in tl.range(lo, hi, step):
        offs = n0 + offs_n
        keep = offs < hi
        if HAS_DROP:
            keep = keep & (nxt == 0)
            nxt = tl.load(m_base + (offs + step) * s_ml, mask=offs + step < hi, other=1)
        if INDEXED:
            listed = offs < n_list
            if PREFIX:
                ent = offs
            elif LIST_AHEAD:
                ent = nxt
            else:
                ent = tl.load(m_base + offs * s_ml, mask=listed, other=-1)
            pos = tl.where(listed, ent, dense_from + (offs - n_list))
            keep = keep & tl.where(listed, (pos >= 0) & (pos < lim), pos < length)
            if LIST_AHEAD and not PREFIX:
                nxt = tl.load(m_base + (offs + step) * s_ml, mask=offs + step < n_list, other=-1)
            offs = pos
        # dropped rows are never fetched: the predicated load issues no memory traffic for them
        k = tl.load(k_base + offs[:, None].to(tl.int64) * s_kl + offs_d[None, :], mask=keep[:, None], other=0.0)
        v = tl.load(v_base + offs[:, None].to(tl.int64) * s_vl + offs_d[None, :], mask=keep[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(keep[None, :], s, float("-inf"))
        p, alpha, m_i, l_i = softmax_step(s, m_i, l_i, 1)  # all dropped so far: m stays -inf
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_i, l_i, acc


@triton.jit
def row_part(q_ptr, k_ptr, v_ptr, drop_ptr, o_ptr, lse_ptr, b, h, r, split, lo, hi, step, qk_scale,
             s_qb, s_qh, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_mh, s_ml, s_or, s_os, s_lr,
             G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, HAS_DROP: tl.constexpr,
             n_list=0, dense_from=0, length=0, INDEXED: tl.constexpr = False, LIST_AHEAD: tl.constexpr = True,
             PREFIX: tl.constexpr = False):
    """The G query heads of kv head h of sequence b (row r) over the tiles lo, lo + step, ... below hi: stores the
    part in slot `split` (normalised out; lse, -inf if nothing was kept). INDEXED: drop_ptr holds the lists (see
    _attend)."""
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + b * s_qb + (h * G + offs_g)[:, None] * s_qh + offs_d[None, :],
                mask=(offs_g < G)[:, None], other=0.0)
    m_i, l_i, acc = _attend(q, k_ptr + b * s_kb + h * s_kh, v_ptr + b * s_vb + h * s_vh,
                            drop_ptr + b * s_mb + h * s_mh, s_kl, s_vl, s_ml, lo, hi, step, qk_scale,
                            BLOCK_G, D, BLOCK_N, HAS_DROP, n_list, dense_from, length, INDEXED, LIST_AHEAD, PREFIX)
    # l == 0 only when nothing was kept; a NaN logit makes l NaN, and NaN flows into out and lse (not "empty")
    o = acc / tl.where(l_i == 0, 1.0, l_i)[:, None]
    lse = tl.where(l_i == 0, float("-inf"), (m_i + tl.log2(l_i)) * LN2_C)
    rows = r * G + offs_g
    tl.store(o_ptr + rows[:, None] * s_or + split * s_os + offs_d[None, :], o, mask=(offs_g < G)[:, None])
    tl.store(lse_ptr + rows * s_lr + split, lse, mask=offs_g < G)


@triton.jit
def _balanced_slot(klen_ptr, lens_ptr, Hkv, L, kv_len, chunk, dense_from, S, R, HAS_LENS: tl.constexpr,
                   BALANCE: tl.constexpr, TARGET: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    """BALANCE: this program's (row, split, the row's share of its S slots, whether it reads). A row's share: its
    tokens (listed entries + positions past dense_from) over all rows' in TARGET programs, rounded up (1) or down
    (2), between 1 and S; the 1-D grid holds every row's share in turn (at most TARGET + R programs: those past the
    sum read nothing). The slots past a row's share are marked empty by its readers (empty_slots)."""
    p = tl.program_id(0)
    rr = tl.arange(0, BLOCK_R)
    valid = rr < R
    n = tl.minimum(tl.maximum(tl.load(klen_ptr + rr, mask=valid, other=0), 0), chunk)
    if HAS_LENS:
        ln = tl.minimum(tl.maximum(tl.load(lens_ptr + rr // Hkv, mask=valid, other=0), 0), L).to(tl.int32)
    else:
        ln = kv_len
    tok = tl.where(valid, n + tl.maximum(ln - dense_from, 0), 0)
    per = tl.maximum(tl.cdiv(tl.sum(tok, 0), TARGET), BLOCK_N)  # tokens a program
    mine = tl.cdiv(tok, per) if BALANCE == 1 else tok // per
    mine = tl.where(valid, tl.minimum(tl.maximum(mine, 1), S), 0)
    cum = tl.cumsum(mine, 0)
    r = tl.sum((cum <= p).to(tl.int32), 0)
    first = tl.sum(tl.where(rr == r, cum - mine, 0), 0)
    m_r = tl.sum(tl.where(rr == r, mine, 0), 0)
    return r, p - first, m_r, p < tl.sum(mine, 0)


@triton.jit
def empty_slots(lse_ptr, r, split, mine, S, s_lr, G: tl.constexpr, BLOCK_G: tl.constexpr):
    """A balanced reader's share of marking its row's slots past `mine` empty (lse -inf: the merge gives a part of
    zero weight nothing, whatever its out holds): slots split + mine, split + 2 mine, ... below S."""
    offs_g = tl.arange(0, BLOCK_G)
    rows = r * G + offs_g
    for e in range(split + mine, S, mine):
        tl.store(lse_ptr + rows * s_lr + e, float("-inf"), mask=offs_g < G)


@triton.jit
def _masked_decode_split_kernel(
    q_ptr, k_ptr, v_ptr, drop_ptr, lens_ptr, o_ptr, lse_ptr, cnt_ptr, out_ptr, lse_out_ptr,
    Hkv, L, kv_len, chunk, qk_scale,
    s_qb, s_qh, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_mh, s_ml, s_or, s_os, s_lr, klen_ptr, dense_from,
    n_parts, n_rows, G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_DROP: tl.constexpr, HAS_LENS: tl.constexpr, USE_GDC: tl.constexpr, INTERLEAVE: tl.constexpr,
    FUSED: tl.constexpr = False, MB_S: tl.constexpr = 1, MB_D: tl.constexpr = 1, MB_ONE: tl.constexpr = True,
    TRIGGER: tl.constexpr = True, INDEXED: tl.constexpr = False, LIST_AHEAD: tl.constexpr = True,
    PREFIX: tl.constexpr = False, HEAVY_FIRST: tl.constexpr = False, BLOCK_R: tl.constexpr = 1,
    BALANCE: tl.constexpr = 0, TARGET: tl.constexpr = 1,
):
    """Grid (splits, B * Hkv): program (s, b * Hkv + h) attends the G query heads of kv head h of sequence b to
    tiles s, s + S, ... of the row (INTERLEAVE; S splits) or to tokens [s * chunk, (s + 1) * chunk), and stores
    that part (normalised out; lse, -inf if empty); with one split, o / lse are out and lse. FUSED: the row's last
    program merges its parts into out_ptr / lse_out_ptr (merge_if_last with counters cnt_ptr; MB_*: its blocks).
    INDEXED (interleaved): the row is its kept list (drop_ptr, klen_ptr[r] entries of at most `chunk`) followed by
    the positions dense_from .. length - 1; klen_ptr and dense_from are None otherwise. HEAVY_FIRST (INDEXED, rows
    <= BLOCK_R): grid row i takes the row of the i-th largest count (ties by index), so that the longest rows start
    first and the short ones fill the tail (a press's per-head budgets differ). BALANCE (INDEXED, rows <= BLOCK_R;
    HEAVY_FIRST then unused; a 1-D grid, n_parts slots a row of n_rows): a row takes as many of its slots as its share
    of all rows' tokens over TARGET programs (_balanced_slot), programs of about equal work whether the rows are
    even (few splits each) or not (the long rows many); its readers mark the other slots empty."""
    pdl_enter(USE_GDC, TRIGGER)
    split = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    arrivals = tl.num_programs(0)
    if BALANCE:
        r, split, mine, active = _balanced_slot(klen_ptr, lens_ptr, Hkv, L, kv_len, chunk, dense_from, n_parts,
                                                n_rows, HAS_LENS, BALANCE, TARGET, BLOCK_N, BLOCK_R)
        if not active:
            return
        r = r.to(tl.int64)
        arrivals = mine
    elif HEAVY_FIRST:
        rr = tl.arange(0, BLOCK_R)
        n_all = tl.minimum(tl.maximum(tl.load(klen_ptr + rr, mask=rr < tl.num_programs(1), other=-1), -1), chunk)
        ahead = (n_all[None, :] > n_all[:, None]) | ((n_all[None, :] == n_all[:, None]) & (rr[None, :] < rr[:, None]))
        rank = tl.sum(ahead.to(tl.int32), 1)
        r = tl.sum(tl.where(rank == r, rr, 0), 0).to(tl.int64)
    b = r // Hkv
    h = r % Hkv
    if HAS_LENS:
        length = tl.minimum(tl.maximum(tl.load(lens_ptr + b), 0), L).to(tl.int32)  # int32 or int64 lengths
    else:
        length = kv_len
    n_list = 0
    if INDEXED:
        n_list = tl.minimum(tl.maximum(tl.load(klen_ptr + r), 0), chunk).to(tl.int32)
        lo = split * BLOCK_N
        hi = n_list + tl.maximum(length - dense_from, 0)
        step = tl.num_programs(0) * BLOCK_N
        if BALANCE:
            step = mine * BLOCK_N
    elif INTERLEAVE:  # the splits of a row take its tiles in turn: they read neighbouring tiles at the same time
        lo = split * BLOCK_N
        hi = length
        step = tl.num_programs(0) * BLOCK_N
    else:
        lo = split * chunk
        hi = tl.minimum(split * chunk + chunk, length)
        step = BLOCK_N
    row_part(q_ptr, k_ptr, v_ptr, drop_ptr, o_ptr, lse_ptr, b, h, r, split, lo, hi, step, qk_scale,
             s_qb, s_qh, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_mh, s_ml, s_or, s_os, s_lr,
             G, BLOCK_G, D, BLOCK_N, HAS_DROP, n_list, dense_from, length, INDEXED, LIST_AHEAD, PREFIX)
    if BALANCE:
        empty_slots(lse_ptr, r, split, mine, n_parts, s_lr, G, BLOCK_G)
    if FUSED:  # (balanced: the row's readers arrive; the merge reads its n_parts slots)
        merge_if_last(cnt_ptr, r, o_ptr, lse_ptr, out_ptr, lse_out_ptr, r * G, n_parts, D, s_os, s_or, s_lr, G,
                      MB_S, MB_D, MB_ONE, arrivals)


# Launch configuration (benchmarks/notes/masked_decode.md, sweep rounds 1-3 and 8 on the H100): B * Hkv * splits ~
# 2 programs per SM, all resident in one wave. With a drop mask, 64-token tiles in a 3-stage pipeline (two tiles in
# flight per program) keep enough bytes in flight when rows are dropped; with no mask, 128-token tiles in one
# buffer stream ~1.5 % faster. Interleaved: the splits of a row take its tiles in turn (split s: tiles s, s + S, ...)
# rather than one contiguous chunk each, so a row's programs read neighbouring tiles at the same time (round 8).
@dataclass(frozen=True)
class DecodeConfig(KernelConfig):
    """block_n keys per tile (halved at D=256: same tile bytes), waves of programs over the SMs the split aims at,
    pdl (programmatic dependent launch of the split kernel where the GPU has it), interleave (splits take tiles in
    turn rather than one chunk each), fuse_merge (eager calls: the split kernel merges its own parts while heads per
    kv head x splits <= this; more would leave one program merging many rows after the others are done)."""
    block_n: int = 128
    num_warps: int = 4
    num_stages: int = 2
    waves: int = 2
    pdl: bool = True
    interleave: bool = True
    fuse_merge: int = 64
    list_ahead: bool = True  # kept lists: a tile's entries loaded one iteration ahead (else left to the pipeliner)
    heavy_first: bool = False  # kept lists / prefixes: rows launched longest first (<= 256 rows)
    row_splits: int = 0  # > 0: aim at this many splits a row, `waves` (at least) to 16 waves, instead of `waves`
    balance: int = 0  # lists / prefixes: each row's splits its share of ~balance_waves waves, 1 rounded up, 2 down
    balance_waves: float = 2.0
    balance_cap: float = 4.0  # a row's slots: at most this many times the mean share (its readers mark unused ones)


CONFIG = DecodeConfig()
MASKED_CONFIG = DecodeConfig(block_n=64, num_stages=3)
# Kept lists and compacted prefixes (H200 sweeps, benchmarks/notes/kvpress.md): rows of unequal length (a press's
# per-head budgets) want short programs the SMs balance, ~32 splits a row at B 4-8 (16 waves at 64 rows), while few
# rows want few waves (B 1: the merge of many short splits dominates). Lists: 64-row gathered tiles in 2 stages
# (0.54-0.64 of dense at half kept uniform, 3 stages 0.67-0.75); prefixes stream contiguous tiles in 3.
LISTED_CONFIG = DecodeConfig(block_n=64, num_stages=2, waves=4, row_splits=32)
PREFIX_CONFIG = DecodeConfig(block_n=64, num_stages=3, waves=2, row_splits=32)
# Few rows (B 1: 8 KV heads): each row's splits follow its count (H200, .dev/bal_sweep.py, 1 x 128K at ~half kept,
# budgets even / spread 0.02-1, of dense: prefixes 0.59 / 0.57 (rule) -> 0.53 / 0.56 in 2 waves rounded up; lists
# 0.87 / 0.60 -> 0.62 / 0.60 in 3 waves rounded down: 3 waves' shares rounded up overflow into a fourth at even
# rows). At B 8 (64 rows) balancing lost to the row_splits rule in every case (prefixes 0.54-0.55 -> 0.56-0.61).
BALANCED_ROWS = 16
PREFIX_BALANCE, LISTED_BALANCE = dict(balance=1, balance_waves=2.0), dict(balance=2, balance_waves=3.0)


MIN_CHUNK = 128  # tokens a split: 512 left short caches under-split (B=1, Hkv 8, L 554: 9.5 -> 5.6 us a call)


def _plan(B: int, Hkv: int, L: int, device: torch.device, waves: float, row_splits: int = 0):
    """Split L so that B * Hkv * splits ~ waves * SMs (row_splits > 0: ~row_splits a row, between waves and 16
    waves), with chunks of >= MIN_CHUNK tokens (multiples of 16)."""
    rows, sms = max(B * Hkv, 1), num_sms(device)
    if row_splits:
        waves = min(16.0, max(waves, row_splits * rows / sms))
    # rounded down: one program too many starts a second wave (round(3 * 132 / 8) = 50 splits = 400 > 396 slots)
    splits = max(1, min(int(waves * sms / rows + 1e-6), cdiv(L, MIN_CHUNK)))
    chunk = cdiv(cdiv(max(L, 1), splits), 16) * 16
    return cdiv(max(L, 1), chunk), chunk


class DecodePlan:
    """The launches of one masked_decode call shape: the split kernel and how its parts are merged (SplitParts),
    everything but the tensors fixed.

    q [B, Hq, D] (unit last stride); k, v [B, Hkv, L, D]; drop_mask bool or None; kv_lens int32/int64 [B] contiguous
    or None; out [B, Hq, D] and lse [B, Hq] contiguous; listed: (kept_idx int32 [B, Hkv, M], dense_from int) or
    None (the kept lists in place of a mask; kept_len int32 [B, Hkv] contiguous at the call). config may override
    the keys of CONFIG (no mask) / MASKED_CONFIG (a drop mask) / LISTED_CONFIG (kept lists) / PREFIX_CONFIG (kept
    prefixes)."""

    def __init__(self, q, k, v, drop_mask, kv_lens, kv_len: int, sm_scale: float, config=None, listed=None):
        base = (PREFIX_CONFIG if listed[0] is None else LISTED_CONFIG) if listed is not None else \
            CONFIG if drop_mask is None else MASKED_CONFIG
        B, Hq, D = q.shape
        Hkv, L = k.shape[1], k.shape[2]
        if listed is not None and B * Hkv <= BALANCED_ROWS:
            base = base.with_(PREFIX_BALANCE if listed[0] is None else LISTED_BALANCE)
        cfg = base.with_(config)
        self.empty = B == 0 or Hq == 0
        block_n = cfg.block_n if D <= 128 else cfg.block_n // 2  # same tile bytes at D=256
        span = L if kv_lens is not None else kv_len
        if listed is not None:  # a row: at most M listed positions, then those from dense_from on
            M = listed[0].shape[2] if listed[0] is not None else listed[1]  # a prefix list: at most dense_from
            span = M + max(span - listed[1], 0)
        splits, chunk = _plan(B, Hkv, span, q.device, cfg.waves, cfg.row_splits if listed is not None else 0)
        balance = cfg.balance if listed is not None and B * Hkv <= 1024 else 0
        target = max(1, int(cfg.balance_waves * num_sms(q.device)))
        if balance:  # room for a row balance_cap x the mean share; the merge reads no more empty parts than that
            splits = max(1, min(splits, cdiv(int(cfg.balance_cap * target), B * Hkv)))
        ms = drop_mask.stride() if drop_mask is not None else \
            listed[0].stride() if listed is not None and listed[0] is not None else (0, 0, 0)
        if listed is not None:
            chunk = M  # the lists' length (INDEXED reads `chunk` as it)
        pdl = pdl_enabled(q.device)
        G = Hq // Hkv
        self.parts = SplitParts(B * Hq, splits, D, B * Hkv, G * splits <= cfg.fuse_merge, q.device)
        self.ints = (Hkv, L, kv_len, chunk, sm_scale * LOG2E, q.stride(0), q.stride(1), *k.stride()[:3],
                     *v.stride()[:3], *ms, *self.parts.strides)
        self.dense_from = listed[1] if listed is not None else None
        consts = dict(G=G, BLOCK_G=max(16, next_pow2(G)), D=D, BLOCK_N=block_n, HAS_DROP=drop_mask is not None,
                      HAS_LENS=kv_lens is not None, USE_GDC=pdl, INTERLEAVE=cfg.interleave or listed is not None,
                      num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                      **({"INDEXED": True, "LIST_AHEAD": cfg.list_ahead, "PREFIX": listed[0] is None}
                         if listed is not None else {}),
                      **({"HEAVY_FIRST": cfg.heavy_first and B * Hkv <= 256, "BLOCK_R": next_pow2(B * Hkv),
                          "BALANCE": balance, "TARGET": target}
                         if listed is not None and (cfg.heavy_first and B * Hkv <= 256 or balance) else {}),
                      **({"launch_pdl": True} if pdl and cfg.pdl else {}))
        grid = (min(splits * B * Hkv, target + B * Hkv),) if balance else (splits, B * Hkv)  # (_balanced_slot)
        self.split, self.fused = self.parts.launches(_masked_decode_split_kernel, grid, consts)
        self.counts = (splits, B * Hkv)

    def __call__(self, q, k, v, drop_mask, kv_lens, out, lse, kept_idx=None, kept_len=None) -> None:
        if self.empty:
            return
        go, fused = self.parts.pick(self.split, self.fused, q.device)
        mask = drop_mask if kept_idx is None else kept_idx  # (the listed path reads the lists where the mask goes)
        if drop_mask is not None and not go.direct():  # a kept kernel reads the bools as their bytes; Triton's
            mask = mask.view(torch.uint8)  # path types them as uint8
        self.parts.launch(go, fused, (q, k, v, mask if mask is not None else q, kv_lens if kv_lens is not None else q),
                          self.ints, out, lse, q, (kept_len, self.dense_from, *self.counts))


_PLANS = "masked_decode.plan"


def decode_plan(q, k, v, drop_mask, kv_lens, kv_len: int, sm_scale: float, listed=None) -> DecodePlan:
    """The cached plan for these (already checked) arguments; listed: (kept_idx, dense_from) or None."""
    return cached_plan((_PLANS, current_device(), tkey(q), tkey(k), tkey(v), tkey(drop_mask), tkey(kv_lens), kv_len,
                        sm_scale, (tkey(listed[0]), listed[1]) if listed is not None else None),
                       lambda: DecodePlan(q, k, v, drop_mask, kv_lens, kv_len, sm_scale, listed=listed))


def masked_decode_fwd(q, k, v, drop_mask, kv_lens, kv_len: int, sm_scale: float, out, lse, config=None,
                      kept=None):
    """q [B, Hq, D] (unit last stride); k, v [B, Hkv, L, D]; writes out [B, Hq, D] and lse [B, Hq] (contiguous);
    kept: (kept_idx, kept_len, dense_from) or None. config (tests, sweeps) overrides launch keys and bypasses the
    plan cache."""
    assert out.is_contiguous() and lse.is_contiguous()
    listed = (kept[0], kept[2]) if kept is not None else None
    plan = DecodePlan(q, k, v, drop_mask, kv_lens, kv_len, sm_scale, config, listed) if config else \
        decode_plan(q, k, v, drop_mask, kv_lens, kv_len, sm_scale, listed)
    plan(q, k, v, drop_mask, kv_lens, out, lse, *(kept[:2] if kept is not None else ()))
