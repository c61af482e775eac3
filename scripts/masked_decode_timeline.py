"""Where does the fixed cost of masked_decode at B=1 go? Per-program %globaltimer stamps inside CUDA-graph replay.

Usage (device, repo root, PYTHONPATH=.): python scripts/masked_decode_timeline.py [--dynamic] [--steal] [--hybrid]
Without flags: the shipped kernel only; the flags add the variants of benchmarks/notes/masked_decode_timeline_run*.txt
(findings in benchmarks/notes/masked_decode.md, round 6). Copies of the split kernel and of the merge stamp entry,
return from griddepcontrol.wait and exit of every program; one call in the middle of a graph of back-to-back calls is
printed relative to its first split program's entry. A read-only kernel over the same K/V bytes is timed beside it.
Output also goes to $OUT/masked_decode_timeline.txt.
"""
import sys

import torch
import triton
import triton.language as tl

from llmkernels.bench.ceilings import copy_bandwidth
from llmkernels.bench.harness import _graph_time_ms
from llmkernels.ops.combine.kernel import combine_blocks, merge_row, pdl_enter
from llmkernels.ops.masked_decode.kernel import CONFIG, MASKED_CONFIG, _attend, _plan, masked_decode_fwd, row_part
from llmkernels.ops.masked_decode.steal_gluon import steal_launch
from llmkernels.ops.masked_decode.spec import HKV, HQ, D, _bytes, make_inputs

from _say import teller  # noqa: E402  (scripts/ is on sys.path when run as a script)

say = teller("masked_decode_timeline.txt")


@triton.jit
def _now(x):
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [x], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _smid(x):
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _stamp(t_ptr, slot, i, x):
    tl.store(t_ptr + slot * 4 + i, _now(x))


@triton.jit
def _enter(t_ptr, slot, x):
    """Stamp 0 at entry, pdl_enter, stamp 1 when the wait returns."""
    _stamp(t_ptr, slot, 0, x)
    pdl_enter(True)
    _stamp(t_ptr, slot, 1, x)


@triton.jit
def _split_timed(q_ptr, k_ptr, v_ptr, drop_ptr, o_ptr, lse_ptr, t_ptr, Hkv, kv_len, chunk, qk_scale,
                 s_qb, s_qh, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_mh, s_ml, s_or, s_os, s_lr,
                 G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                 HAS_DROP: tl.constexpr, READ_ONLY: tl.constexpr):
    split = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    slot = r * tl.num_programs(0) + split
    _enter(t_ptr, slot, split)
    tl.store(t_ptr + slot * 4 + 3, _smid(split).to(tl.int64))
    b = r // Hkv
    h = r % Hkv
    lo = split * chunk
    hi = tl.minimum(lo + chunk, kv_len)
    if READ_ONLY:
        offs_d = tl.arange(0, D)
        acc = tl.zeros([BLOCK_N, D], tl.int16)
        offs_n = tl.arange(0, BLOCK_N)
        for n0 in tl.range(lo, hi, BLOCK_N):
            offs = n0 + offs_n
            ok = offs < hi
            kk = tl.load(k_ptr + b * s_kb + h * s_kh + offs[:, None].to(tl.int64) * s_kl + offs_d[None, :],
                         mask=ok[:, None], other=0.0)
            vv = tl.load(v_ptr + b * s_vb + h * s_vh + offs[:, None].to(tl.int64) * s_vl + offs_d[None, :],
                         mask=ok[:, None], other=0.0)
            acc ^= kk.to(tl.int16, bitcast=True) ^ vv.to(tl.int16, bitcast=True)
        tl.store(lse_ptr + r * s_lr + split, tl.sum(tl.sum(acc.to(tl.int32), axis=1), axis=0).to(tl.float32))
    else:
        row_part(q_ptr, k_ptr, v_ptr, drop_ptr, o_ptr, lse_ptr, b, h, r, split, lo, hi, BLOCK_N, qk_scale,
                 s_qb, s_qh, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_mh, s_ml, s_or, s_os, s_lr,
                 G, BLOCK_G, D, BLOCK_N, HAS_DROP)
    _stamp(t_ptr, slot, 2, split)


@triton.jit
def _split_dyn(q_ptr, k_ptr, v_ptr, drop_ptr, o_ptr, lse_ptr, t_ptr, ctr_ptr, Hkv, kv_len, chunk, n_chunks, total,
               qk_scale, s_qb, s_qh, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_mh, s_ml, s_or, s_os, s_lr,
               G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
               HAS_DROP: tl.constexpr):
    """Persistent programs take chunks (row, split) from a counter: the fast SMs take more of them."""
    pid = tl.program_id(0)
    _enter(t_ptr, pid, pid)
    c = tl.atomic_add(ctr_ptr, 1)
    done = 0
    while c < total:
        nxt = tl.atomic_add(ctr_ptr, 1)  # the next grab's round trip overlaps this chunk
        r = (c // n_chunks).to(tl.int64)
        split = c % n_chunks
        b = r // Hkv
        h = r % Hkv
        lo = split * chunk
        hi = tl.minimum(lo + chunk, kv_len)
        row_part(q_ptr, k_ptr, v_ptr, drop_ptr, o_ptr, lse_ptr, b, h, r, split, lo, hi, BLOCK_N, qk_scale,
                 s_qb, s_qh, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_mh, s_ml, s_or, s_os, s_lr,
                 G, BLOCK_G, D, BLOCK_N, HAS_DROP)
        c = nxt
        done += 1
    fin = tl.atomic_add(ctr_ptr + 1, 1)
    if fin == tl.num_programs(0) - 1:  # every grab of this call is done: reset for the next call
        tl.store(ctr_ptr, 0)
        tl.store(ctr_ptr + 1, 0)
    _stamp(t_ptr, pid, 2, pid)
    tl.store(t_ptr + pid * 4 + 3, done.to(tl.int64))


@triton.jit
def _grab(ctr):
    return tl.atomic_add(ctr, 1, sem="relaxed")


@triton.jit
def _tile_ptrs(t, base, s_l, BLOCK_N: tl.constexpr, D: tl.constexpr):
    offs = t * BLOCK_N + tl.arange(0, BLOCK_N)
    return base + offs[:, None].to(tl.int64) * s_l + tl.arange(0, D)[None, :], offs


@triton.jit
def _mask_vals(mb, s_ml, t, hi, BLOCK_N: tl.constexpr, HAS_DROP: tl.constexpr):
    offs = t * BLOCK_N + tl.arange(0, BLOCK_N)
    if HAS_DROP:
        return tl.load(mb + offs * s_ml, mask=offs < hi, other=1).to(tl.int8)
    return (offs >= hi).to(tl.int8)


@triton.jit
def _kv(kb, vb, s_kl, s_vl, t, m, BLOCK_N: tl.constexpr, D: tl.constexpr):
    offs = t * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = (m == 0)[:, None]
    k = tl.load(kb + offs[:, None].to(tl.int64) * s_kl + tl.arange(0, D)[None, :], mask=keep, other=0.0)
    v = tl.load(vb + offs[:, None].to(tl.int64) * s_vl + tl.arange(0, D)[None, :], mask=keep, other=0.0)
    return k, v


@triton.jit
def _split_steal(q_ptr, k_ptr, v_ptr, drop_ptr, o_ptr, lse_ptr, t_ptr, ctr_ptr, Hkv, kv_len, cap, static_pct, qk_scale,
                 s_qb, s_qh, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_mh, s_ml, s_or, s_os, s_lr,
                 G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                 HAS_DROP: tl.constexpr):
    """Programs (s, row) take tiles of their row from the row's counter, one at a time: fast SMs take more.
    Tile i+1's K/V loads (registers) are in flight while tile i is computed; its mask and index a step earlier."""
    split = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    slot = r * tl.num_programs(0) + split
    _enter(t_ptr, slot, split)
    b = r // Hkv
    h = r % Hkv
    hi = kv_len
    n_tiles = tl.cdiv(hi, BLOCK_N)
    ctr = ctr_ptr + r * 2
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, D)
    kb = k_ptr + b * s_kb + h * s_kh
    vb = v_ptr + b * s_vb + h * s_vh
    mb = drop_ptr + b * s_mb + h * s_mh
    q = tl.load(q_ptr + b * s_qb + (h * G + offs_g)[:, None] * s_qh + offs_d[None, :],
                mask=(offs_g < G)[:, None], other=0.0)
    # static part: tiles [split * c, (split + 1) * c) through the cp.async-pipelined loop; the rest is a pool
    c = (n_tiles * static_pct) // (100 * tl.num_programs(0))
    base = c * tl.num_programs(0)
    m_i, l_i, acc = _attend(q, kb, vb, mb, s_kl, s_vl, s_ml, split * c * BLOCK_N, (split + 1) * c * BLOCK_N, BLOCK_N,
                            qk_scale,
                            BLOCK_G, D, BLOCK_N, HAS_DROP)
    t0 = base + _grab(ctr)
    t1 = base + _grab(ctr)
    t2 = base + _grab(ctr)
    # mask values travel as int8 (dropped = 1; past the end = 1); K/V of a tile load once its mask is in
    m0 = _mask_vals(mb, s_ml, t0, hi, BLOCK_N, HAS_DROP)
    k0, v0 = _kv(kb, vb, s_kl, s_vl, t0, m0, BLOCK_N, D)
    m1 = _mask_vals(mb, s_ml, t1, hi, BLOCK_N, HAS_DROP)
    n_done = 0
    # a for loop with a guard, not a while loop: triton 3.6 crashes carrying loaded tensors through scf.while.
    # At most `cap` tiles per program; grabs stop 3 before it, so every grabbed tile is processed.
    for it in range(0, cap):
        if t0 < n_tiles:
            if it < cap - 3:
                t3 = base + _grab(ctr)
            else:
                t3 = n_tiles
            k1, v1 = _kv(kb, vb, s_kl, s_vl, t1, m1, BLOCK_N, D)
            m2 = _mask_vals(mb, s_ml, t2, hi, BLOCK_N, HAS_DROP)
            keep0 = m0 == 0
            s = tl.dot(q, tl.trans(k0)) * qk_scale
            s = tl.where(keep0[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_safe[:, None])
            alpha = tl.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v0.dtype), v0)
            m_i = m_new
            t0 = t1
            k0 = k1
            v0 = v1
            m0 = m1
            t1 = t2
            m1 = m2
            t2 = t3
            n_done += 1
    fin = tl.atomic_add(ctr + 1, 1, sem="acq_rel")
    if fin == tl.num_programs(0) - 1:  # the row's last program: every grab is done; reset for the next call
        tl.store(ctr, 0)
        tl.store(ctr + 1, 0)
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    lse = tl.where(l_i > 0, (m_i + tl.log2(l_i)) * 0.6931471805599453, float("-inf"))
    rows = r * G + offs_g
    tl.store(o_ptr + rows[:, None] * s_or + split * s_os + offs_d[None, :], o, mask=(offs_g < G)[:, None])
    tl.store(lse_ptr + rows * s_lr + split, lse, mask=offs_g < G)
    _stamp(t_ptr, slot, 2, split)
    tl.store(t_ptr + slot * 4 + 3, n_done.to(tl.int64))


@triton.jit
def _combine_timed(o_ptr, lse_ptr, out_ptr, lse_out_ptr, t_ptr, S, D, stride_os, stride_or, stride_ls, stride_lr,
                   stride_out_r, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, ONE_SHOT: tl.constexpr):
    row = tl.program_id(0)
    _enter(t_ptr, row, row)
    merge_row(o_ptr, lse_ptr, out_ptr, lse_out_ptr, row.to(tl.int64), S, D, stride_os, stride_or, stride_ls,
              stride_lr, stride_out_r, True, BLOCK_S, BLOCK_D, ONE_SHOT)
    _stamp(t_ptr, row, 2, row)


CTR = None


def plan(B, L, cfg):
    if "dyn" in cfg:
        chunk = cfg["dyn"][0]
        return triton.cdiv(L, chunk), chunk
    return _plan(B, HKV, L, torch.device("cuda"), cfg["waves"])


def programs(B, L, cfg):
    return cfg["dyn"][1] * 132 if "dyn" in cfg else plan(B, L, cfg)[0] * B * HKV


def timed_call(x, L, cfg, out, lse, t_split, t_comb, read_only=False, merge=True):
    q, k, v, drop = x["q"], x["k"], x["v"], x["drop"]
    B, Hq, Dh = q.shape
    G = Hq // HKV
    splits, chunk = plan(B, L, cfg)
    o_part = torch.empty(B * Hq, splits, Dh, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(B * Hq, splits, dtype=torch.float32, device=q.device)
    ms = drop.stride() if drop is not None else (0, 0, 0)
    if "gluon" in cfg:
        steal_launch(q, k, v, drop, None, L, Dh ** -0.5 * 1.4426950408889634, o_part, lse_part, CTR, True,
                     cfg["gluon"])
    elif "steal" in cfg:
        _split_steal[(splits, B * HKV)](
            q, k, v, drop.view(torch.uint8) if drop is not None else q, o_part, lse_part, t_split, CTR, HKV, L,
            2 * triton.cdiv(triton.cdiv(L, cfg["block_n"]), splits) + 4, cfg["steal"], Dh ** -0.5 * 1.4426950408889634,
            q.stride(0), q.stride(1), *k.stride()[:3], *v.stride()[:3], *ms,
            o_part.stride(0), o_part.stride(1), lse_part.stride(0),
            G=G, BLOCK_G=16, D=Dh, BLOCK_N=cfg["block_n"], HAS_DROP=drop is not None,
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], launch_pdl=True)
    elif "dyn" in cfg:
        _split_dyn[(cfg["dyn"][1] * 132,)](
            q, k, v, drop.view(torch.uint8) if drop is not None else q, o_part, lse_part, t_split, CTR, HKV, L, chunk,
            splits, splits * B * HKV, Dh ** -0.5 * 1.4426950408889634, q.stride(0), q.stride(1), *k.stride()[:3],
            *v.stride()[:3], *ms, o_part.stride(0), o_part.stride(1), lse_part.stride(0),
            G=G, BLOCK_G=16, D=Dh, BLOCK_N=cfg["block_n"], HAS_DROP=drop is not None,
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], launch_pdl=True)
    else:
        _split_timed[(splits, B * HKV)](
            q, k, v, drop.view(torch.uint8) if drop is not None else q, o_part, lse_part, t_split, HKV, L, chunk,
            Dh ** -0.5 * 1.4426950408889634, q.stride(0), q.stride(1), *k.stride()[:3], *v.stride()[:3], *ms,
            o_part.stride(0), o_part.stride(1), lse_part.stride(0),
            G=G, BLOCK_G=16, D=Dh, BLOCK_N=cfg["block_n"], HAS_DROP=drop is not None, READ_ONLY=read_only,
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], launch_pdl=True)
    if merge:
        bs, bd, one = combine_blocks(splits, Dh)
        _combine_timed[(B * Hq,)](o_part, lse_part, out.view(B * Hq, Dh), lse.view(-1), t_comb, splits, Dh,
                                  o_part.stride(1), o_part.stride(0), lse_part.stride(1), lse_part.stride(0), Dh,
                                  BLOCK_S=bs, BLOCK_D=bd, ONE_SHOT=one, num_warps=4, launch_pdl=True)
    return splits


def pct(t, p):
    t = t.sort().values
    return t[min(len(t) - 1, int(p * (len(t) - 1) + 0.5))].item()


def timeline(name, x, L, cfg, floor_us, read_only=False, merge=True, calls=12):
    B = x["q"].shape[0]
    out = torch.empty_like(x["q"])
    lse = torch.empty(x["q"].shape[:2], device="cuda")
    splits, _ = plan(B, L, cfg)
    P = programs(B, L, cfg)
    ts = [torch.zeros(P, 4, dtype=torch.int64, device="cuda") for _ in range(calls)]
    tc = [torch.zeros(B * HQ, 4, dtype=torch.int64, device="cuda") for _ in range(calls)]
    fns = [lambda i=i: timed_call(x, L, cfg, out, lse, ts[i], tc[i], read_only, merge) for i in range(calls)]
    ms = _graph_time_ms(fns, calls=calls, reps=10)  # the last replay's stamps stay in ts / tc
    torch.cuda.synchronize()
    if "gluon" in cfg:  # the library kernel carries no stamps: the merge's only
        c = calls // 2
        m = tc[c].double() / 1e3
        t0 = tc[c - 1][:, 2].double().max().item() / 1e3
        say(f"\n== {name}: {ms * 1e3:.1f} us/call = {100 * floor_us / (ms * 1e3):.1f}% of the dense floor; after the "
            f"previous merge ends: merge's wait returns {m[:, 1].min().item() - t0:.2f}, merge ends "
            f"{m[:, 2].max().item() - t0:.2f}")
        ro = torch.empty_like(out)
        rl = torch.empty_like(lse)
        masked_decode_fwd(x["q"], x["k"], x["v"], x["drop"], None, L, D ** -0.5, ro, rl)
        say(f"   max |out - library| {(out.float() - ro.float()).abs().max().item():.2e}, "
            f"lse {(lse - rl).abs().max().item():.2e}; counters back to 0: {bool((CTR == 0).all())}")
        return
    say(f"\n== {name}: {ms * 1e3:.1f} us/call = {100 * floor_us / (ms * 1e3):.1f}% of the dense floor; "
        f"{P} programs on {len(set(ts[0][:, 3].tolist()))} SMs")
    for c in (calls // 2, calls // 2 + 1):
        s, m = ts[c].double() / 1e3, tc[c].double() / 1e3
        t0 = s[:, 0].min().item()
        prev_end = (tc[c - 1][:, 2].double().max().item() / 1e3 - t0) if merge else \
            (ts[c - 1][:, 2].double().max().item() / 1e3 - t0)
        nxt = ts[c + 1][:, 1].double().min().item() / 1e3 - t0
        dur = s[:, 2] - s[:, 1]
        say(f" call {c}: prev call end {prev_end:+.2f}; split entry {0:.2f}..{s[:, 0].max().item() - t0:.2f}, "
            f"wait returns {s[:, 1].min().item() - t0:.2f}..{s[:, 1].max().item() - t0:.2f}, ends "
            f"min {s[:, 2].min().item() - t0:.2f} p10 {pct(s[:, 2], .1) - t0:.2f} p50 {pct(s[:, 2], .5) - t0:.2f} "
            f"p90 {pct(s[:, 2], .9) - t0:.2f} max {s[:, 2].max().item() - t0:.2f}; program time p50 "
            f"{pct(dur, .5):.2f} (min {dur.min().item():.2f} max {dur.max().item():.2f})")
        if merge:
            say(f"   merge entry {m[:, 0].min().item() - t0:.2f}..{m[:, 0].max().item() - t0:.2f}, wait returns "
                f"{m[:, 1].min().item() - t0:.2f}..{m[:, 1].max().item() - t0:.2f}, ends max "
                f"{m[:, 2].max().item() - t0:.2f}; next call's first wait return {nxt:.2f}")
        else:
            say(f"   next call's first wait return {nxt:.2f}")
    # the slowest and fastest programs' SMs: is the tail a few SMs or everyone?
    s = ts[calls // 2].double() / 1e3
    order = s[:, 2].argsort()
    if "dyn" in cfg or "steal" in cfg:
        n = ts[calls // 2][:, 3].double()
        say(f"   chunks per program: min {int(n.min())} max {int(n.max())} mean {n.mean().item():.2f}")
    else:
        say("   last 6 programs (split, row, sm, end-start):",
            [(int(i) % splits, int(i) // splits, int(ts[calls // 2][i, 3].item()), round((s[i, 2] - s[i, 1]).item(), 2))
             for i in order[-6:]])
    if merge and not read_only:  # the timed variants must match the library
        ro = torch.empty_like(out)
        rl = torch.empty_like(lse)
        masked_decode_fwd(x["q"], x["k"], x["v"], x["drop"], None, L, D ** -0.5, ro, rl)
        say(f"   max |out - library| {(out.float() - ro.float()).abs().max().item():.2e}, "
            f"lse {(lse - rl).abs().max().item():.2e}")


def main():
    global CTR
    CTR = torch.zeros(1024, dtype=torch.int32, device="cuda")
    bw = copy_bandwidth()
    say(f"copy {bw / 1e12:.3f} TB/s")
    L = 65536
    for B in (1, 2, 8):
        x = make_inputs(B, HKV, HQ, L, D, torch.float16, torch.device("cuda"), kept=1.0)
        floor_us = _bytes(B, L, 1.0) / bw * 1e6
        out = torch.empty_like(x["q"])
        lse = torch.empty(x["q"].shape[:2], device="cuda")
        lib = _graph_time_ms([lambda: masked_decode_fwd(x["q"], x["k"], x["v"], x["drop"], None, L, D ** -0.5, out,
                                                        lse)], calls=12, reps=10)
        say(f"\n##### B={B} L={L} dense, floor {floor_us:.1f} us; library call {lib * 1e3:.1f} us = "
            f"{100 * floor_us / (lib * 1e3):.1f}%")
        timeline("masked 64/3 (shipped)", x, L, MASKED_CONFIG, floor_us)
        variants = []
        if "--dynamic" in sys.argv:  # run 2: persistent programs taking whole chunks from one counter
            variants += [(f"dynamic chunk {c} x {n}/SM", dict(MASKED_CONFIG, dyn=(c, n)))
                         for c, n in ((512, 2), (1024, 2), (256, 2), (512, 3))]
        if "--steal" in sys.argv:  # run 3: every tile from the row's counter, K/V prefetched in registers
            variants += [(f"steal {bn} {w}w", dict(MASKED_CONFIG, steal=0, num_stages=1, block_n=bn, num_warps=w))
                         for bn, w in ((64, 4), (128, 8), (32, 4))]
        if "--gluon" in sys.argv:  # run 5: the Gluon work-stealing kernel (llmkernels/ops/masked_decode/steal_gluon.py)
            variants += [(f"gluon steal {w} waves, {st} stages", dict(MASKED_CONFIG, waves=w, gluon=dict(
                BLOCK_N=64, STAGES=st, PROD_REGS=56, maxnreg=128 if w == 2 else 255))) for w, st in ((2, 3), (1, 6))]
        if "--hybrid" in sys.argv:  # run 4: a static prefix through the pipelined loop, then the steal loop
            variants += [(f"hybrid {pct}% static, 64 4w", dict(MASKED_CONFIG, steal=pct)) for pct in (0, 70, 80, 88)]
        for name, cfg in variants:
            timeline(name, x, L, cfg, floor_us)
        xs = make_inputs(B, HKV, HQ, L, D, torch.float16, torch.device("cuda"), kept=0.5)
        timeline("kept 0.5: masked 64/3 (shipped)", xs, L, MASKED_CONFIG, floor_us)
        for name, cfg in variants:
            timeline("kept 0.5: " + name, xs, L, cfg, floor_us)
        if B == 1:
            timeline("read-only 128/2 grid, no merge", x, L, CONFIG, floor_us, read_only=True, merge=False)
        del x, xs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
