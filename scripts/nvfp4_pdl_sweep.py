"""nvfp4_gemv v3 candidates on the GPU: programmatic dependent launch (PDL), persistent grid, layouts.

Run from the repo root: `python scripts/nvfp4_pdl_sweep.py [budget_seconds]` (PYTHONPATH = repo root).
1. Probes whether PDL works eagerly and inside a captured CUDA graph (globaltimer stamps: the dependent
   kernel's entry must precede the primary's end, and its griddepcontrol.wait must return after it).
2. Per shape (3 contest + 3 Llama): every variant on fresh full-range random inputs against the fp32 reference
   (and bit for bit against the current plan), then timed like the harness (graph replay of back-to-back calls,
   inputs rotated beyond 3x L2), plus a read-only stream over the same bytes (without and with PDL).
Prints one row per (variant, shape): us, % of floor, rel err, bitwise-equal; full output also under $OUT.
A failing variant prints its error and the sweep goes on; past the budget the remaining rows are skipped.
"""
import json
import math
import os
import sys
import time
import traceback

import torch
import triton
import triton.language as tl

from llmkernels.bench.ceilings import copy_bandwidth
from llmkernels.bench.harness import _graph_time_ms
from llmkernels.checking import rel_err
from llmkernels.ops.nvfp4_gemv.kernel import gemv_launch, gemv_plan, gemv_tile
from llmkernels.ops.nvfp4_gemv.reference import nvfp4_gemv_ref
from llmkernels.ops.nvfp4_gemv.spec import GEMV_SHAPES, GEMV_TOL, gemv_bytes, make_inputs

PROBE = os.environ.get("NVFP4_PROBE")  # timing-only probes (wrong results): how much does the ALU work cost?
if PROBE:
    from llmkernels.ops.nvfp4_gemv import kernel as _K
    if PROBE in ("half", "both"):  # a decode without the negative lanes: 3 of 5 instructions per 4 weights gone
        _a = "{\n.reg .b32 qlo, qhi, ql16, qh16, qk0, qk1, qt, qacc;\n" + _K._SPLIT % "$1" + _K._LUT + "mov.b32 qacc, 0;\n"
        for _g, _q in enumerate(_K._SEL):
            _a += f"prmt.b32 qt, qk0, qk1, {_q};\ndp4a.s32.s32 qacc, qt, ${2 + _g}, qacc;\n"
        _K.ASM_A = tl.constexpr(_a + "mov.b32 $0, qacc;\n}")
    if PROBE in ("nob", "both"):  # b used as it is (no decode)
        _K.ASM_B = tl.constexpr("{\nmov.b64 {$0, $1}, $8;\nmov.b64 {$2, $3}, $8;\nmov.b64 {$4, $5}, $8;\n"
                                "mov.b64 {$6, $7}, $8;\n}")
if os.environ.get("NVFP4_LUT") == "imm":  # A/B control: the table word as an immediate (ptxas copies it per prmt)
    from llmkernels.ops.nvfp4_gemv import kernel as _K
    _K.ASM_A, _K.ASM_B = _K.ASM_A_IMM, _K.ASM_B_IMM
if os.environ.get("NVFP4_DEC") == "two":  # candidate: +2b only, the negative lanes summed apart and subtracted
    from llmkernels.ops.nvfp4_gemv import kernel as _K
    _b = "{\n.reg .b32 qlo, qhi, ql16, qh16, qk0, qk1, qm, qp, qn, qs, qu;\n" + _K._SPLIT % "$8" + _K._LUT
    _b += "mov.b32 qm, 0x80808080;\n"
    _a = ("{\n.reg .b32 qlo, qhi, ql16, qh16, qk0, qk1, qs, qt, qacc, qneg;\n" + _K._SPLIT % "$1" + _K._LUT +
          "mov.b32 qacc, 0;\nmov.b32 qneg, 0;\n")
    for _g, _q in enumerate(_K._SEL):
        _b += (f"prmt.b32 qp, qk0, qk1, {_q};\nxor.b32 qs, {_q}, 0x8888;\nprmt.b32 qn, qk0, qk1, qs;\n"
               f"sub.u32 qu, qm, qn;\nxor.b32 qu, qu, qm;\nor.b32 ${_g}, qp, qu;\nmov.b32 ${_g + 4}, 0;\n")
        _a += (f"prmt.b32 qt, qk0, qk1, {_q};\ndp4a.s32.s32 qacc, qt, ${2 + _g}, qacc;\n"
               f"xor.b32 qs, {_q}, 0x8888;\nprmt.b32 qt, qk0, qk1, qs;\ndp4a.s32.s32 qneg, qt, ${2 + _g}, qneg;\n")
    _K.ASM_A, _K.ASM_B = tl.constexpr(_a + "sub.s32 $0, qacc, qneg;\n}"), tl.constexpr(_b + "}")
T0 = time.monotonic()
BUDGET = float(sys.argv[1]) if len(sys.argv) > 1 else 140.0
OUT = os.environ.get("OUT")
LOG = []


def log(s=""):
    print(s, flush=True)
    LOG.append(s)


# ---- 1. does PDL work (eager and in a graph)? ------------------------------------------------------------

@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _probe_primary(ts, spin_ns, TRIGGER: tl.constexpr):
    if TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    t0 = _now()
    t = t0
    while t - t0 < spin_ns:
        t = _now()
    tl.store(ts, t)  # the primary's end


@triton.jit
def _probe_dependent(ts):
    tl.store(ts + 1, _now())  # entry, before the wait
    tl.extra.cuda.gdc_wait()
    tl.store(ts + 2, _now())  # after the wait


def pdl_probe():
    res = {}
    ts = torch.zeros(3, dtype=torch.int64, device="cuda")

    def pair():
        _probe_primary[(1,)](ts, 50_000, TRIGGER=True, num_warps=1)
        _probe_dependent[(1,)](ts, num_warps=1, launch_pdl=True)

    for mode in ("eager", "graph"):
        try:
            pair()  # compile
            torch.cuda.synchronize()
            ts.zero_()
            if mode == "eager":
                pair()
            else:
                g = torch.cuda.CUDAGraph()
                s = torch.cuda.Stream()
                with torch.cuda.stream(s):
                    with torch.cuda.graph(g):
                        pair()
                torch.cuda.synchronize()
                ts.zero_()
                g.replay()
            torch.cuda.synchronize()
            end, entry, after = ts.tolist()
            res[mode] = dict(overlap=entry < end, wait_ok=after >= end, entry_minus_end_us=(entry - end) / 1e3)
        except Exception as e:  # noqa: BLE001
            res[mode] = dict(error=f"{type(e).__name__}: {str(e)[:300]}")
    return res


# ---- read-only reference ---------------------------------------------------------------------------------

@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def _read_kernel(p, out, n, BLOCK: tl.constexpr, USE_GDC: tl.constexpr):
    """Read-only stream (xor-reduce of int64 words): what any kernel reading these bytes can reach."""
    if USE_GDC:
        tl.extra.cuda.gdc_launch_dependents()
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(p + offs, mask=offs < n, other=0)
    r = tl.reduce(v, 0, _xor)
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    tl.store(out + tl.program_id(0), r)


def read_call(x, pdl):
    words = torch.cat([x["a"].view(torch.uint8).permute(2, 0, 1).reshape(-1),
                       x["sfa"].view(torch.uint8).permute(2, 0, 1).reshape(-1)])
    words = words[: words.numel() // 8 * 8].view(torch.int64)
    out = torch.empty(triton.cdiv(words.numel(), 2048), dtype=torch.int64, device="cuda")
    kw = {"launch_pdl": True} if pdl else {}
    return lambda: _read_kernel[(out.numel(),)](words, out, words.numel(), BLOCK=2048, USE_GDC=pdl, num_warps=4,
                                                **kw)


# ---- variants ----------------------------------------------------------------------------------------------

def _lay(BB, R, nw, **kw):
    return dict(BM=gemv_tile(BB, R, nw), BB=BB, num_warps=nw, split=1, num_stages=1, **kw)


STATIC = dict(pdl=True, pre=1, trigger="entry")


def tile_variants(plan, KB, M, L):
    """VARIANTS=tiles: programs of several K tiles under static-weights PDL, the first tile loaded before the wait
    and, with prefetch, the next one issued before the preloaded tile decodes (round 8 in the notes)."""
    static = gemv_plan(M, KB, L, torch.device("cuda"), True)
    v = [("plan", dict(plan)), ("static", static)]
    for BB, R, nw, pf in ((64, 4, 1, False), (64, 4, 1, True), (64, 4, 2, True), (64, 2, 2, True), (32, 4, 1, True),
                          (128, 4, 2, True), (64, 2, 1, True), (static["BB"], 4, static["num_warps"], True)):
        if BB < 2 * KB:
            v.append((f"BB{BB} R{R} {nw}w{' pf' if pf else ''} static", _lay(BB, R, nw, prefetch=pf, **STATIC)))
    return v


def tile2_variants(plan, KB, M, L):
    """VARIANTS=tiles2: one-warp programs around BB 64 R 4 (round 8)."""
    return [("plan", dict(plan)), ("static", gemv_plan(M, KB, L, torch.device("cuda"), True)),
            ("BB64 R4 1w static", _lay(64, 4, 1, **STATIC)),
            ("BB64 R4 1w pre2 static", _lay(64, 4, 1, **{**STATIC, "pre": 2})),
            ("BB64 R8 1w static", _lay(64, 8, 1, **STATIC)),
            ("BB64 R4 1w wait static", _lay(64, 4, 1, **{**STATIC, "trigger": "wait"})),
            ("BB128 R4 1w static", _lay(128, 4, 1, **STATIC)),
            ("BB32 R4 1w static", _lay(32, 4, 1, **STATIC)),
            ("BB64 R4 1w", _lay(64, 4, 1)),
            ("BB128 R4 1w", _lay(128, 4, 1))]


def l2_variants(plan, KB, M, L):
    """VARIANTS=l2: b / sfb prefetched into L2 before griddepcontrol.wait (cfg l2; round 10 of the notes, whose runs also
    timed weight prefetches into L2, since removed: they lost 7-13 points)."""
    static = gemv_plan(M, KB, L, torch.device("cuda"), True)
    no_l2 = {**static, "l2": False}
    pdl0 = {**plan, "pdl": True, "pre": 0, "trigger": "entry"}
    return [("plan", dict(plan)), ("static", static), ("static no l2", no_l2),
            ("static l2 pf", {**static, "prefetch": True}),
            ("static #2", static), ("static no l2 #2", no_l2),  # repeated: the spread within one run
            ("plan pdl pre0", pdl0), ("plan pdl pre0 l2", {**pdl0, "l2": True})]


def _static(M, KB, L):
    return gemv_plan(M, KB, L, torch.device("cuda"), True)


def probe_variants(plan, KB, M, L):
    """VARIANTS=probe: the static and default plans (with NVFP4_PROBE / NVFP4_LUT / NVFP4_DEC: A/B of the decode)."""
    return [("static", _static(M, KB, L)), ("plan", dict(plan))]


def mr_variants(plan, KB, M, L):
    """VARIANTS=mr: the static plan capped at 48 registers (round 11)."""
    return probe_variants(plan, KB, M, L) + [("static mr48", {**_static(M, KB, L), "maxnreg": 48})]


def even_variants(plan, KB, M, L):
    """VARIANTS=even: unmasked (even) against masked loads in the static and default plans (round 11)."""
    static = _static(M, KB, L)
    return [("static", static), ("static even", {**static, "even": True}), ("static masked", {**static, "even": False}),
            ("plan", dict(plan)), ("plan even", {**plan, "even": True}), ("static #2", static)]


def variants(plan, KB):
    """(name, cfg or None for the plan itself); every key is documented in gemv_plan."""
    nw = plan["num_warps"]
    pdl = lambda pre, trig, **kw: {**plan, "pdl": True, "pre": pre, "trigger": trig, **kw}  # noqa: E731
    v = [("plan", dict(plan)),
         ("pdl none pre0", pdl(0, "none")),       # launch latency only: starts when the last program exits
         ("pdl entry pre0", pdl(0, "entry")),     # early start, nothing before the wait
         ("pdl entry pre1", pdl(1, "entry")),     # early start, first weight tile before the wait
         ("pdl entry pre2", pdl(2, "entry")),
         ("pdl last pre1", pdl(1, "last_load")),  # next call may start once every program issued its last load
         ("pdl wait pre1", pdl(1, "wait")),
         (f"persist{32 // nw}", {**plan, "persistent": 32 // nw}),
         (f"persist{32 // nw} pdl entry pre1", pdl(1, "entry", persistent=32 // nw))]
    if KB >= 128:  # other layouts under PDL (fewer, bigger programs)
        for R, BB, w in ((8, 128, 2), (4, 256, 4), (8, 256, 4)):
            if BB > 2 * KB or (BB == plan["BB"] and w == nw and gemv_tile(BB, R, w) == plan["BM"]):
                continue
            lay = _lay(BB, R, w)
            v.append((f"R{R} BB{BB} {w}w", lay))
            v.append((f"R{R} BB{BB} {w}w pdl entry pre1", {**lay, "pdl": True, "pre": 1, "trigger": "entry"}))
    return v


CHOICES = {"tiles": tile_variants, "tiles2": tile2_variants, "l2": l2_variants, "probe": probe_variants,
           "mr": mr_variants, "even": even_variants}


def main():
    dev = torch.device("cuda")
    bw = copy_bandwidth()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    log(f"{torch.cuda.get_device_name(0)}; torch {torch.__version__}; triton {triton.__version__}; "
        f"copy {bw / 1e12:.3f} TB/s; L2 {l2 / 2**20:.0f} MiB")
    probe = pdl_probe()
    log(f"PDL probe (dependent entry must precede the primary's end; wait must return after it): {probe}")
    if not all(p.get("overlap") for p in probe.values()):
        log("WARNING: PDL did not overlap in every mode: the pdl rows below may measure plain launches")
    rows = []
    choice = os.environ.get("VARIANTS")  # unset: the v3 candidates; "tiles" / "tiles2": round 8's layouts
    shapes = GEMV_SHAPES[:{"tiles": 3, "tiles2": 5}.get(choice, len(GEMV_SHAPES))]
    if choice in ("probe", "mr", "even"):
        shapes = [GEMV_SHAPES[2], GEMV_SHAPES[0], GEMV_SHAPES[1]]
    if choice == "l2":  # the (7168, 2048, 4) shape first: the one short of the goal
        shapes = [GEMV_SHAPES[2], GEMV_SHAPES[0], GEMV_SHAPES[1]] + list(GEMV_SHAPES[3:])
    for M, K, L in shapes:
        nbytes = gemv_bytes(M, K, L)
        floor_us = nbytes / bw * 1e6
        sets = min(max(1, math.ceil(3 * l2 / nbytes)), 32)
        xs = [make_inputs(M, K, L, dev) for _ in range(sets)]  # fresh full-range random bytes
        ref = nvfp4_gemv_ref(xs[0]["a"], xs[0]["b"], xs[0]["sfa"], xs[0]["sfb"])
        plan = gemv_plan(M, K // 16, L, dev)
        base_out = None
        log(f"-- M={M} K={K} L={L}: floor {floor_us:.2f} us, {sets} input sets, plan {plan}")
        pick = CHOICES.get(choice, lambda plan, KB, M, L: variants(plan, KB))(plan, K // 16, M, L)
        todo = pick + [("read-only", "read"), ("read-only pdl", "read-pdl")]
        for name, cfg in todo:
            if time.monotonic() - T0 > BUDGET:
                log(f"   {name:<30} skipped (budget {BUDGET:.0f} s spent)")
                continue
            name_seen = sum(r["variant"] == name and (r["M"], r["K"], r["L"]) == (M, K, L) for r in rows)
            name = name + " #2" * bool(name_seen)
            try:
                if isinstance(cfg, str):
                    fns = [read_call(x, cfg == "read-pdl") for x in xs]
                    err, same = float("nan"), None
                else:
                    fns = []
                    for x in xs:
                        a, b, sa, sb = (x[k].view(torch.uint8) for k in ("a", "b", "sfa", "sfb"))
                        fns.append(lambda a=a, b=b, sa=sa, sb=sb, c=x["c"], cfg=cfg:
                                   gemv_launch(a, b, sa, sb, c, 1.0, cfg=cfg))
                    out = torch.full_like(xs[0]["c"], float("nan"))
                    a, b, sa, sb = (xs[0][k].view(torch.uint8) for k in ("a", "b", "sfa", "sfb"))
                    gemv_launch(a, b, sa, sb, out, 1.0, cfg=cfg)
                    torch.cuda.synchronize()
                    err = rel_err(out, ref)
                    if base_out is None:
                        base_out = out
                    same = bool(torch.equal(out, base_out))
                    if not err <= GEMV_TOL and not PROBE:
                        raise RuntimeError(f"rel err {err:.2e} > {GEMV_TOL}")
                ms = _graph_time_ms(fns, calls=32, reps=15)
                us = ms * 1e3
                pct = 100 * floor_us / us
                rows.append(dict(variant=name, M=M, K=K, L=L, us=us, pct=pct, err=err, bitwise=same, cfg=str(cfg)))
                log(f"   {name:<30} {us:8.2f} us {pct:6.1f} %  err {err:.1e}  bitwise {same}")
            except Exception as e:  # noqa: BLE001
                log(f"   {name:<30} FAILED {type(e).__name__}: {str(e)[:400]}")
                LOG.append(traceback.format_exc())
                rows.append(dict(variant=name, M=M, K=K, L=L, error=f"{type(e).__name__}: {e}"[:400]))
                torch.cuda.synchronize()
        del xs, ref, base_out
        torch.cuda.empty_cache()
    # compact table: variant x shape (% of floor)
    names = list(dict.fromkeys(r["variant"] for r in rows))
    log("\n% of floor (us) per shape:")
    log(f"{'variant':<30}" + "".join(f"{f'{M}x{K}x{L}':>22}" for M, K, L in shapes))
    for n in names:
        cells = []
        for M, K, L in shapes:
            r = [r for r in rows if r["variant"] == n and (r["M"], r["K"], r["L"]) == (M, K, L)]
            cells.append("-" if not r else ("FAIL" if "error" in r[0] else f"{r[0]['pct']:.1f}% ({r[0]['us']:.2f})"))
        log(f"{n:<30}" + "".join(f"{c:>22}" for c in cells))
    log(f"total {time.monotonic() - T0:.0f} s")
    if OUT:
        os.makedirs(OUT, exist_ok=True)
        with open(os.path.join(OUT, "nvfp4_pdl_sweep.txt"), "w") as f:
            f.write("\n".join(LOG) + "\n")
        with open(os.path.join(OUT, "nvfp4_pdl_sweep.json"), "w") as f:
            json.dump(dict(probe=probe, copy_bw=bw, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
