"""llmkernels.distributed: CPU with gloo (spawned processes, Triton interpreter, fp16) and 2 GPUs with NCCL.

Each world size is spawned once (module fixture); the workers run every case, catching errors per case, and save
their results; the tests compare them with single-process results computed here from the same seeded inputs."""
import json
import os
import socket
import subprocess
import sys
import zlib

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from llmkernels import indexer_kl_loss, masked_decode, sparse_mla, sparse_mla_bwd, xl_paged_decode
from llmkernels.checking import rel_err
from llmkernels.distributed import (context_parallel_decode, context_parallel_xl_paged_decode, tp_indexer_kl_loss,
                                    tp_sparse_mla, tp_sparse_mla_bwd)
from llmkernels.distributed import _comm
from llmkernels.distributed.decode import _local_int
from llmkernels.ops.combine.kernel import combine
from llmkernels.ops.masked_decode.kernel import masked_decode_fwd
from llmkernels.ops.masked_decode.reference import masked_decode_ref
from llmkernels.ops.masked_decode.spec import LSE_TOL, OUT_TOL
from llmkernels.ops.xl_paged_decode.kernel import xl_paged_decode_fwd
from llmkernels.ops.xl_paged_decode.reference import xl_paged_decode_ref

F16 = torch.float16
B, HKV, G, D = 2, 2, 2, 64
# two fp16 results that are each their fp32 value rounded once differ by at most one fp16 ulp (2^-10 relative)
ONE_ULP = 2.0 ** -10


# ---- spawning ------------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, target, outdir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        res = globals()[target](rank, world)
    finally:
        dist.destroy_process_group()
    torch.save(res, os.path.join(outdir, f"rank{rank}.pt"))
    # done: skip the interpreter's teardown, where gloo's threads sometimes abort the process ("terminate called
    # without an active exception", SIGABRT) after every result was written (seen in CI runs on 2026-11-28)
    sys.stdout.flush()
    os._exit(0)


def _spawn(world, target, tmpdir):
    mp.spawn(_entry, args=(world, _free_port(), target, str(tmpdir)), nprocs=world, join=True)
    return [torch.load(os.path.join(str(tmpdir), f"rank{r}.pt")) for r in range(world)]


def _catch(fn):
    try:
        return fn()
    except Exception as e:  # recorded, compared by the tests
        return ("error", type(e).__name__, str(e))


# ---- context-parallel masked_decode cases -------------------------------------------------------------------

def _cp_cases(world):
    """name -> dict(lens: shard lengths, mask: drop fraction, kv_len: builder(T, lens) -> global kv_len, page)."""
    un = {2: [29, 7], 3: [20, 0, 13]}[world]
    return {
        "even": dict(lens=[16] * world),
        "empty_shard": dict(lens={2: [25, 0], 3: [0, 12, 9]}[world], mask=0.2),
        "uneven_mask_lens": dict(lens=un, mask=0.3,
                                 kv_len=lambda T, ls: torch.tensor([T, ls[0] - 3], dtype=torch.int32)),
        "int64_lens_clamped": dict(lens={2: [10, 30], 3: [10, 14, 9]}[world], mask=0.2,
                                   kv_len=lambda T, ls: torch.tensor([-3, 2 ** 40], dtype=torch.int64)),
        "int_len": dict(lens=un, kv_len=lambda T, ls: ls[0] + 2),
        "all_dropped": dict(lens=un, mask=0.5, all_dropped=True),
        "interleave": dict(lens=None, total=37, page=4, mask=0.2,
                           kv_len=lambda T, ls: torch.tensor([T, 13], dtype=torch.int32)),
        "lowp_exchange": dict(lens=un, mask=0.3, exchange=F16,
                              kv_len=lambda T, ls: torch.tensor([T - 2, ls[0] + 1], dtype=torch.int32)),
        "q4d_explicit_offset": dict(lens=un, q4d=True, no_validate=True,
                                    kv_len=lambda T, ls: torch.tensor([T - 1, ls[0] + 1], dtype=torch.int32)),
    }


def _rank_tokens(c, world):
    """Global token positions held by each rank (in local order) and the total T."""
    if c.get("page"):
        T, P = c["total"], c["page"]
        return [[t for t in range(T) if (t // P) % world == r] for r in range(world)], T
    offs = [sum(c["lens"][:r]) for r in range(world + 1)]
    return [list(range(offs[r], offs[r + 1])) for r in range(world)], offs[-1]


def _cp_full(name, c, world):
    """The seeded full inputs: q, k, v, drop over all T tokens, and the global kv_len."""
    toks, T = _rank_tokens(c, world)
    g = torch.Generator().manual_seed(zlib.crc32(f"{name}/{world}".encode()))
    q = torch.randn(B, HKV * G, D, generator=g).to(F16)
    k = torch.randn(B, HKV, T, D, generator=g).to(F16)
    v = torch.randn(B, HKV, T, D, generator=g).to(F16)
    drop = torch.rand(B, HKV, T, generator=g) < c.get("mask", 0.0)
    if c.get("all_dropped"):
        drop[0] = True  # sequence 0: every token of every rank
        drop[1, 1, toks[0]] = True  # sequence 1, kv head 1: rank 0's tokens only
    kv_len = c["kv_len"](T, [len(t) for t in toks]) if "kv_len" in c else None
    return q, k, v, (drop if "mask" in c else None), kv_len, toks, T


def _shard(x, toks_r):
    return None if x is None else x[:, :, toks_r]


def cp_worker(rank, world):
    calls = []
    real = _comm.gather_meta
    _comm.gather_meta = lambda *a: calls.append(1) or real(*a)  # counts the metadata checks
    res = {}
    for name, c in _cp_cases(world).items():
        q, k, v, drop, kv_len, toks, T = _cp_full(name, c, world)
        kw = dict(drop_mask=_shard(drop, toks[rank]), kv_len=kv_len, interleave=c.get("page", 0),
                  exchange_dtype=c.get("exchange"))
        if c.get("q4d"):
            q = q.unsqueeze(2)
        if c.get("no_validate"):
            kw.update(validate=False, kv_offset=toks[rank][0] if toks[rank] else sum(c["lens"][:rank]))
        res[name] = _catch(lambda: context_parallel_decode(q, _shard(k, toks[rank]), _shard(v, toks[rank]), **kw))
    before = len(calls)
    name, c = "even", _cp_cases(world)["even"]
    q, k, v, _, _, toks, _ = _cp_full(name, c, world)
    again = context_parallel_decode(q, _shard(k, toks[rank]), _shard(v, toks[rank]))
    res["even_again"] = (again, len(calls) - before)  # same shapes: no second metadata check
    solos = [dist.new_group([r]) for r in range(world)]  # every rank creates every group
    q, k, v, drop, kv_len, _, _ = _cp_full("uneven_mask_lens", _cp_cases(world)["uneven_mask_lens"], world)
    res["solo"] = [_catch(lambda: context_parallel_decode(q, k, v, drop, kv_len=n, group=solos[rank]))
                   for n in (kv_len, kv_len.long(), 11, None)]
    res.update(_error_cases(rank, world))
    res.update(_xl_worker(rank, world))
    res.update(_tp_worker(rank, world))
    return res


def _composed(q, k, v, drop, kv_len, toks, world, page, part_dtype=None):
    """What the ranks must produce bit for bit: each shard's part (fp32, or part_dtype) as the worker computes it,
    merged in rank order by the same combine kernel."""
    Bq, Hq, Dq = q.shape
    parts_o = torch.empty(world, Bq * Hq, Dq, dtype=part_dtype or torch.float32)
    parts_l = torch.empty(world, Bq * Hq)
    for r in range(world):
        L = len(toks[r])
        off = sum(len(t) for t in toks[:r])  # contiguous layout (unused with pages)
        if isinstance(kv_len, torch.Tensor):
            lens = torch.tensor([_local_int(int(n), off, L, r, world, page) for n in kv_len], dtype=torch.int32)
            span = L
        else:
            lens, span = None, (L if kv_len is None else _local_int(kv_len, off, L, r, world, page))
        masked_decode_fwd(q, _shard(k, toks[r]), _shard(v, toks[r]), _shard(drop, toks[r]), lens, span, Dq ** -0.5,
                          parts_o[r].view(Bq, Hq, Dq), parts_l[r].view(Bq, Hq))
    out = torch.empty(Bq, Hq, Dq, dtype=q.dtype)
    lse = torch.empty(Bq, Hq)
    combine(parts_o.transpose(0, 1), parts_l.transpose(0, 1), out.view(-1, Dq), lse.view(-1))
    return out, lse


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"world{w}")
def spawned(request, tmp_path_factory):
    if torch.cuda.is_available():  # CPU tensors need the Triton interpreter, which is off where a GPU is
        pytest.skip("CPU (gloo) cases run on CPU-only machines; the GPU machine runs test_gpu_two_ranks")
    world = request.param
    return world, _spawn(world, "cp_worker", tmp_path_factory.mktemp(f"w{world}"))


@pytest.mark.parametrize("name", ["even", "empty_shard", "uneven_mask_lens", "int64_lens_clamped", "int_len",
                                  "all_dropped", "interleave", "lowp_exchange", "q4d_explicit_offset"])
def test_cp_decode_matches_one_process(spawned, name):
    world, res = spawned
    c = _cp_cases(world)[name]
    q, k, v, drop, kv_len, toks, T = _cp_full(name, c, world)
    outs = [r[name] for r in res]
    assert not isinstance(outs[0][0], str), outs[0]
    if c.get("q4d"):
        assert outs[0][0].shape == (B, HKV * G, 1, D)
        outs = [(o.squeeze(2), lse) for o, lse in outs]
    for o, lse in outs[1:]:  # every rank: the same bits
        assert torch.equal(o, outs[0][0]) and torch.equal(lse, outs[0][1])
    out, lse = outs[0]
    co, cl = _composed(q, k, v, drop, kv_len, toks, world, c.get("page", 0), c.get("exchange"))
    assert torch.equal(out, co) and torch.equal(lse, cl)  # fixed merge order: bitwise
    ref_len = kv_len.clamp(0, T) if isinstance(kv_len, torch.Tensor) else kv_len
    ro, rl = masked_decode_ref(q, k, v, drop, ref_len)
    assert rel_err(out, ro) <= OUT_TOL[F16] and rel_err(lse, rl) <= LSE_TOL  # masked_decode's own tolerances
    so, sl = masked_decode(q, k, v, drop, kv_len=ref_len)  # one process over the whole cache
    # fp32 parts: the merge order of fp32 additions only (lse stays fp32); fp16 parts are each rounded once more
    assert rel_err(out, so) <= ONE_ULP * (2 if c.get("exchange") else 1) and rel_err(lse, sl) <= 1e-6
    empty = torch.isneginf(rl)
    assert torch.equal(torch.isneginf(lse), empty) and not torch.isnan(out).any()
    assert torch.all(out[empty] == 0)
    if c.get("all_dropped"):
        assert empty[0].all() and not empty[1].any()


def test_metadata_checked_once(spawned):
    world, res = spawned
    for r in res:
        again, checks = r["even_again"]
        assert checks == 0 and torch.equal(again[0], r["even"][0])


def test_group_of_one_is_masked_decode(spawned):
    world, res = spawned
    q, k, v, drop, kv_len, _, _ = _cp_full("uneven_mask_lens", _cp_cases(world)["uneven_mask_lens"], world)
    for got, n in zip(res[0]["solo"], (kv_len, kv_len.long(), 11, None)):
        assert not isinstance(got[0], str), got
        want = masked_decode(q, k, v, drop, kv_len=n)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# ---- errors -------------------------------------------------------------------------------------------------

def _error_cases(rank, world):
    """Each case: every rank calls with one argument differing on the last rank; every rank must raise."""
    g = torch.Generator().manual_seed(7)
    last = rank == world - 1

    def call(hq=4, hkv=2, d=64, b=2, dtype=F16, scale=None, kv_len=None, L=9, xdt=None):
        q = torch.randn(b, hq, d, generator=g).to(dtype)
        k = torch.randn(b, hkv, L, d, generator=g).to(dtype)
        return _catch(lambda: context_parallel_decode(q, k, k, kv_len=kv_len, sm_scale=scale, exchange_dtype=xdt))

    def xl(dtype):
        q = torch.randn(2, 4, 64, generator=g).to(dtype)
        kc = torch.randn(3, 8, 2, 64, generator=g).to(dtype)
        t = torch.zeros(2, 1, dtype=torch.int32)
        return _catch(lambda: context_parallel_xl_paged_decode(q, kc, kc, t, torch.ones(2, dtype=torch.int32)))

    def tp(s_kv):
        q = torch.randn(3, 2, 576, generator=g).to(F16)
        kv = torch.randn(s_kv, 576, generator=g).to(F16)
        idx = torch.zeros(3, 5, dtype=torch.int32)
        return _catch(lambda: tp_sparse_mla(q, kv, idx, 0.1))

    return {
        "err_hq": call(hq=8 if last else 4),
        "err_hkv": call(hq=4, hkv=1 if last else 2),
        "err_d": call(d=128 if last else 64),
        "err_batch": call(b=3 if last else 2),
        "err_scale": call(scale=0.5 if last else 0.25),
        "err_kv_kind": call(kv_len=5 if last else None),
        "err_exchange": call(xdt=F16 if last else None),
        "err_local_bf16": call(dtype=torch.bfloat16 if last else F16),  # refused on the interpreter, last rank only
        "err_xl_dtype": xl(torch.float32 if last else F16),
        "err_tp_s_kv": tp(31 if last else 30),
        "err_offsets_overlap": _catch(lambda: context_parallel_decode(
            torch.randn(2, 4, 64).to(F16), torch.randn(2, 2, 9, 64).to(F16), torch.randn(2, 2, 9, 64).to(F16),
            kv_len=5, kv_offset=4 * rank)),
        "err_no_offset": _catch(lambda: context_parallel_decode(
            torch.randn(2, 4, 64).to(F16), torch.randn(2, 2, 9, 64).to(F16), torch.randn(2, 2, 9, 64).to(F16),
            kv_len=5, validate=False)),
    }


ERRORS = {  # case -> (error type on every rank (or on the offending rank, then the others'), words in the message)
    "err_hq": ("ValueError", "q: rank"), "err_hkv": ("ValueError", "k_shard: rank"),
    "err_d": ("ValueError", "q: rank"), "err_batch": ("ValueError", "q: rank"),
    "err_scale": ("ValueError", "sm_scale: rank"), "err_kv_kind": ("ValueError", "kv_len: rank"),
    "err_exchange": ("TypeError", "exchange_dtype: rank"),
    "err_local_bf16": ("TypeError|RuntimeError", "bfloat16|rejected its arguments"),
    "err_xl_dtype": ("TypeError", "q: rank"), "err_tp_s_kv": ("ValueError", "kv: rank"),
    "err_offsets_overlap": ("ValueError", "kv_offset"), "err_no_offset": ("ValueError", "kv_offset"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_mismatched_shards_raise_on_every_rank(spawned, case):
    world, res = spawned
    types, words = ERRORS[case]
    for r in res:
        got = r[case]
        assert isinstance(got, tuple) and got[0] == "error", got
        assert got[1] in types.split("|"), got
        assert any(w in got[2] for w in words.split("|")), got
    if case == "err_local_bf16":  # the offending rank says why, the others that it refused
        assert res[-1][case][1] == "TypeError" and all(r[case][1] == "RuntimeError" for r in res[:-1])


def test_group_errors():
    q = torch.randn(2, 4, 64).to(F16)
    k = torch.randn(2, 2, 8, 64).to(F16)
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="group: torch.distributed is not initialised"):
        context_parallel_decode(q, k, k)
    with pytest.raises(ValueError, match="group: torch.distributed is not initialised"):
        tp_sparse_mla(torch.randn(3, 2, 576).to(F16), torch.randn(8, 576).to(F16),
                      torch.zeros(3, 4, dtype=torch.int32), 0.1)


# ---- context-parallel xl_paged_decode -------------------------------------------------------------------------

XL = dict(S=2, H=4, Hkv=2, D=64, bs=8, ctx=[37, 20])


def _xl_split(world):
    """Per sequence, the [lo, hi) of its tokens on each rank (uneven, some empty)."""
    return {2: [[(0, 25), (25, 37)], [(0, 20), (20, 20)]],
            3: [[(0, 10), (10, 10), (10, 37)], [(0, 7), (7, 20), (20, 20)]]}[world]


def _xl_full():
    g = torch.Generator().manual_seed(11)
    S, H, Hkv, Dx = XL["S"], XL["H"], XL["Hkv"], XL["D"]
    q = torch.randn(S, H, Dx, generator=g).to(F16)
    k = torch.randn(S, max(XL["ctx"]), Hkv, Dx, generator=g).to(F16)  # token j of sequence s: k[s, j]
    v = torch.randn(S, max(XL["ctx"]), Hkv, Dx, generator=g).to(F16)
    u = torch.randn(H, Dx, generator=g).to(F16)
    bd = torch.randn(S, H, max(XL["ctx"]), generator=g).to(F16)
    return q, k, v, u, bd


def _xl_paged(k, v, bd, spans, seed):
    """A paged NHD cache holding tokens [lo, hi) of each sequence, blocks in shuffled order; local bd."""
    bs, S = XL["bs"], XL["S"]
    nblk = [-(-(hi - lo) // bs) for lo, hi in spans]
    total = sum(nblk) + 2
    perm = torch.randperm(total, generator=torch.Generator().manual_seed(seed))
    kc = torch.zeros(total, bs, XL["Hkv"], XL["D"], dtype=F16)
    vc = torch.zeros_like(kc)
    table = torch.full((S, max(max(nblk), 1)), 7, dtype=torch.int32)  # past the used blocks: never read
    bdl = torch.zeros(S, XL["H"], max(max(hi - lo for lo, hi in spans), 1), dtype=F16)
    nxt = 0
    for s, (lo, hi) in enumerate(spans):
        for b in range(nblk[s]):
            blk = int(perm[nxt])
            nxt += 1
            table[s, b] = blk
            a, e = lo + b * bs, min(lo + (b + 1) * bs, hi)
            kc[blk, :e - a], vc[blk, :e - a] = k[s, a:e], v[s, a:e]
        bdl[s, :, :hi - lo] = bd[s, :, lo:hi]
    lens = torch.tensor([hi - lo for lo, hi in spans], dtype=torch.int32)
    return kc, vc, table, lens, bdl


def _xl_worker(rank, world):
    q, k, v, u, bd = _xl_full()
    spans = [_xl_split(world)[s][rank] for s in range(XL["S"])]
    kc, vc, t, lens, bdl = _xl_paged(k, v, bd, spans, seed=rank)
    return {"xl": _catch(lambda: context_parallel_xl_paged_decode(q, kc, vc, t, lens, u=u, bd=bdl))}


def test_cp_xl_paged_decode_matches_one_process(spawned):
    world, res = spawned
    q, k, v, u, bd = _xl_full()
    outs = [r["xl"] for r in res]
    assert not isinstance(outs[0][0], str), outs[0]
    for o, lse in outs[1:]:
        assert torch.equal(o, outs[0][0]) and torch.equal(lse, outs[0][1])
    parts = []
    for r in range(world):  # bitwise: each rank's fp32 part, merged in rank order
        kc, vc, t, lens, bdl = _xl_paged(k, v, bd, [_xl_split(world)[s][r] for s in range(XL["S"])], seed=r)
        po, pl = torch.empty(XL["S"], XL["H"], XL["D"]), torch.empty(XL["S"], XL["H"])
        xl_paged_decode_fwd(q, kc, vc, t, lens, u, bdl, XL["D"] ** -0.5, po, pl)
        parts.append((po.view(-1, XL["D"]), pl.view(-1)))
    co, cl = torch.empty_like(q), torch.empty(XL["S"], XL["H"])
    combine(torch.stack([p[0] for p in parts], 1), torch.stack([p[1] for p in parts], 1), co.view(-1, XL["D"]),
            cl.view(-1))
    assert torch.equal(outs[0][0], co) and torch.equal(outs[0][1], cl)
    kc, vc, t, lens, bdl = _xl_paged(k, v, bd, [(0, n) for n in XL["ctx"]], seed=99)  # the whole context
    so, sl = xl_paged_decode(q, kc, vc, t, lens, u=u, bd=bdl, return_lse=True)
    ro, rl = xl_paged_decode_ref(q, kc, vc, t, lens, u=u, bd=bdl)
    assert rel_err(outs[0][0], so) <= ONE_ULP and rel_err(outs[0][1], sl) <= 1e-6
    assert rel_err(outs[0][0], ro) <= 2e-3 and rel_err(outs[0][1], rl) <= 1e-3  # xl_paged_decode's fp16 tolerances


# ---- tensor-parallel sparse MLA -------------------------------------------------------------------------------

TP = dict(s_q=4, s_kv=30, topk=20, scale=0.07, q_start=26)


def _tp_heads(world):
    return {2: [[0, 1, 2], [3]], 3: [[0, 1], [2, 3], [4]]}[world]


def _tp_full(world):
    g = torch.Generator().manual_seed(5)
    h = sum(len(x) for x in _tp_heads(world))
    q = torch.randn(TP["s_q"], h, 576, generator=g).to(F16)
    kv = torch.randn(TP["s_kv"], 1, 576, generator=g).to(F16)
    sink = torch.randn(h, generator=g)
    idx = torch.randint(-3, TP["s_kv"] + 3, (TP["s_q"], TP["topk"]), generator=g, dtype=torch.int32)
    w = torch.randn(TP["s_q"], h, 512, generator=g)
    wl = torch.randn(TP["s_q"], h, generator=g)
    il = torch.randn(TP["s_q"], TP["topk"], generator=g)
    return q, kv, sink, idx, w, wl, il


def _tp_step(q, kv, sink, idx, w, wl, il, fwd, kl):
    """(out, lse, loss, kl, grads of q, kv, sink, index_logits) of one training step."""
    q, kv, sink, il = (t.clone().requires_grad_() for t in (q, kv, sink, il))
    out, _, lse = fwd(q, kv, idx, TP["scale"], attn_sink=sink, q_start=TP["q_start"])
    fin = torch.isfinite(lse)
    loss = (out.float() * w).sum() + torch.where(fin, lse * wl, torch.zeros_like(lse)).sum()
    kl_loss = kl(il, q, kv, idx, lse.detach(), TP["scale"], q_start=TP["q_start"])
    (loss + kl_loss).backward()
    return out.detach(), lse.detach(), loss.detach(), kl_loss.detach(), q.grad, kv.grad, sink.grad, il.grad


def _tp_worker(rank, world):
    q, kv, sink, idx, w, wl, il = _tp_full(world)
    hs = _tp_heads(world)[rank]
    step = _catch(lambda: _tp_step(q[:, hs], kv, sink[hs], idx, w[:, hs], wl[:, hs], il, tp_sparse_mla,
                                   tp_indexer_kl_loss))
    out, _, lse = sparse_mla(q[:, hs], kv, idx, TP["scale"], attn_sink=sink[hs], q_start=TP["q_start"])
    bwd = _catch(lambda: tp_sparse_mla_bwd(q[:, hs], kv, out, w[:, hs].to(F16), idx, lse, TP["scale"],
                                           attn_sink=sink[hs], q_start=TP["q_start"]))
    return {"tp_step": step, "tp_bwd": bwd}


def test_tp_sparse_mla_loss_and_grads(spawned):
    world, res = spawned
    q, kv, sink, idx, w, wl, il = _tp_full(world)
    full = _tp_step(q, kv, sink, idx, w, wl, il, sparse_mla, indexer_kl_loss)
    fo, fl, floss, fkl, fdq, fdkv, fds, fdil = full
    heads = _tp_heads(world)
    steps = [r["tp_step"] for r in res]
    assert not isinstance(steps[0][0], str), steps[0]
    for hs, (o, lse, loss, kl, dq, dkv, ds, dil) in zip(heads, steps):
        # the heads of a shard run the same per-head arithmetic as in the full call
        assert torch.equal(o, fo[:, hs]) and torch.equal(lse, fl[:, hs])
        assert rel_err(dq, fdq[:, hs]) <= 1e-3  # dkv-independent, but the kernel's atomics order may differ
        assert rel_err(ds, fds[hs]) <= 1e-5
        # kl: the all-reduced distribution is the full one up to fp32 summation order over heads (~1e-7)
        assert abs(kl.item() - fkl.item()) <= 1e-5 * max(1.0, abs(fkl.item()))
        assert rel_err(dil, fdil) <= 1e-5
        # dkv: fp32 sums over heads in another order, rounded once to fp16 (both): within one fp16 ulp
        assert dkv.shape == fdkv.shape and rel_err(dkv, fdkv) <= ONE_ULP
    for r in steps[1:]:
        assert torch.equal(r[5], steps[0][5]) and torch.equal(r[3], steps[0][3])  # every rank: the same dkv, kl
    assert abs(sum(s[2].item() for s in steps) - floss.item()) <= 1e-4 * abs(floss.item())
    bdq, bdkv, bds = sparse_mla_bwd(q, kv, fo, w.to(F16), idx, fl, TP["scale"], attn_sink=sink,
                                    q_start=TP["q_start"])
    for hs, r in zip(heads, res):
        dq, dkv, ds = r["tp_bwd"]
        assert rel_err(dq, bdq[:, hs]) <= 1e-3 and rel_err(ds, bds[hs]) <= 1e-5
        assert rel_err(dkv, bdkv) <= ONE_ULP


# ---- the benchmark script at tiny sizes (gloo) ------------------------------------------------------------------

def test_bench_tiny(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), TRITON_INTERPRET="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "llmkernels.distributed.bench", "--tiny", "--out", str(tmp_path)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    recs = json.load(open(tmp_path / "cp_decode.json"))["records"]
    worlds = sorted({r["shape"]["world"] for r in recs})
    assert worlds == [1, 2] and all(r["op"] == "cp_decode" and r["impl"] == "llmkernels" for r in recs)
    assert all(set(r["shape"]) == {"B", "Hkv", "Hq", "L", "D", "world"} and r["device"] for r in recs)
    assert "cp_decode" in p.stdout and "world" in p.stdout  # the table
    two = [r for r in recs if r["shape"]["world"] == 2]
    assert two and all(0 < r["decode_only_min_ms"] <= r["decode_only_ms"] for r in two)  # the ranks' decode spread


def test_gpu_check_script_dry_run_on_cpu():
    """The 2-GPU check script itself (its plumbing, at small sizes in fp16): device time is not spent on its bugs."""
    if torch.cuda.is_available():
        pytest.skip("the GPU machine runs the script for real (test_gpu_two_ranks)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), TRITON_INTERPRET="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(os.path.dirname(__file__), "distributed_gpu_check.py")]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "gpu_check: all passed" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]


# ---- GPUs (NCCL) ----------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_gpu_two_ranks(tmp_path):
    """The GPU checks (eager, bf16, CUDA-graph capture of the whole step) run as their own torchrun job."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), NCCL_NVLS_ENABLE="0")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(os.path.dirname(__file__), "distributed_gpu_check.py")]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert "gpu_check: all passed" in p.stdout
