"""Small calls of every kernel with garbage indices and table entries, for `compute-sanitizer --tool memcheck` on the
GPU (`scripts/gpu.sh --memcheck` runs it so). Set PYTORCH_NO_CUDA_MEMORY_CACHING=1: each tensor is then its own
allocation, and a read past a tensor's end falls outside every allocation, where memcheck sees it.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 7 \\
        python scripts/memcheck.py [group ...]

Groups (all by default): sparse_mla (every public sparse MLA entry point), sparse_mla_gluon (the sm_90 Gluon
launchers on the split-tail and row-pair paths; skipped elsewhere), sparse_mla_bwd (both modes, Gluon and Triton
second passes), xl_paged_decode (both cache layouts, GQA and MHA paths, checked against the reference),
inkling_decode (lengths, starts, windows and tables out of range), nvfp4_moe (expert indices out of range, both
kernels), masked_decode (kept lists with garbage entries and counts), row_topk (odd rows, -inf / NaN / ties).
Exits 1 when a result is wrong (NaN where none may be, or off the reference); memcheck's own errors set its
--error-exitcode.
"""
import argparse
import os
import sys

import torch

I32_MIN, I32_MAX = -2 ** 31, 2 ** 31 - 1


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def half(dev):
    """bf16 on the GPU; fp16 on the CPU (--device cpu: a dry run through the interpreter, which refuses bf16 dots)."""
    return torch.bfloat16 if dev.type == "cuda" else torch.float16


def sparse_mla(dev) -> int:
    """Every sparse_mla entry point; half the indices garbage (-1, past s_kv, int32 extremes)."""
    from llmkernels import flash_mla_sparse_fwd, indexer_kl_loss, sparse_mla, sparse_mla_attn_dist
    torch.manual_seed(0)
    bad = 0
    for h_q, d_qk, s_kv in [(3, 576, 37), (64, 576, 50), (128, 512, 41), (200, 576, 33)]:
        s_q, topk = 9, 70
        q = torch.randn(s_q, h_q, d_qk, device=dev, dtype=half(dev))
        kv = torch.randn(s_kv, 1, d_qk, device=dev, dtype=half(dev))
        garbage = torch.tensor([-1, s_kv, s_kv + 1, I32_MIN, I32_MAX, -7, 1 << 30, s_kv + 1000], dtype=torch.int32)
        idx = torch.randint(0, s_kv, (s_q, topk), dtype=torch.int32)
        pick = torch.rand(s_q, topk) < 0.5
        idx[pick] = garbage[torch.randint(0, len(garbage), (int(pick.sum()),))]
        idx = idx.to(dev)
        tl = torch.tensor([-5, 0, 3, 70, 1000, 69, I32_MAX, I32_MIN, 33], dtype=torch.int32, device=dev)
        qs = torch.tensor([s_kv - s_q], dtype=torch.int32, device=dev)
        sink = torch.randn(h_q, device=dev)
        o, m, lse = sparse_mla(q, kv, idx, 0.05, attn_sink=sink, topk_length=tl, q_start=qs, k_stride=1)
        sparse_mla(q, kv, idx, 0.05, q_start=3, k_stride=4)
        flash_mla_sparse_fwd(q, kv, idx[:, None], 0.05, 512, sink, tl)
        d = sparse_mla_attn_dist(q, kv, idx, lse, 0.05, q_start=qs, topk_length=tl)
        logits = torch.randn(s_q, topk, device=dev, requires_grad=True)
        indexer_kl_loss(logits, q, kv, idx, lse, 0.05, q_start=qs, topk_length=tl).backward()
        sync(dev)
        ok = not o.isnan().any() and not d.isnan().any() and not logits.grad.isnan().any()
        bad += not ok
        print(f"sparse_mla h_q={h_q} d_qk={d_qk} s_kv={s_kv}: {'ok' if ok else 'NaN in a result'}", flush=True)
    return bad


def sparse_mla_gluon(dev) -> int:
    """The Gluon launchers directly: the forward's split last wave (also at 5 "SMs"), attn_dist's row pairs."""
    from llmkernels.ops.sparse_mla import attn_dist_wgmma as WD
    from llmkernels.ops.sparse_mla import fwd_wgmma as WF
    from llmkernels.ops.sparse_mla.common import prepare
    if dev.type != "cuda" or torch.cuda.get_device_capability(dev) != (9, 0):
        print("sparse_mla_gluon: not an sm_90 GPU, skipped")
        return 0

    def garbage(shape, s_kv):
        junk = torch.randint(I32_MIN, I32_MAX, shape, device=dev, dtype=torch.int64).to(torch.int32)
        junk[:, :4] = torch.tensor([-1, s_kv, I32_MAX, I32_MIN], dtype=torch.int32, device=dev)
        return junk

    def fwd(a, cfg=None):
        s_q, h_q = a.q.shape[:2]
        WF.sparse_mla_fwd_ws_launch(a, torch.empty(s_q, h_q, 512, dtype=a.q.dtype, device=dev),
                                    torch.empty(s_q, h_q, device=dev), torch.empty(s_q, h_q, device=dev), config=cfg)

    def dist(a, lse, cfg=None):
        WD.attn_dist_ws_launch(a, lse, torch.zeros(a.indices.shape, device=dev), config=cfg)

    torch.manual_seed(0)
    s_q, s_kv, topk = 8, 100, 96
    kv = torch.randn(s_kv, 1, 576, dtype=torch.bfloat16, device=dev)
    idx = garbage((s_q, topk), s_kv)
    idx[:, 4:40] = torch.randint(0, s_kv, (s_q, 36), dtype=torch.int32, device=dev)
    for h in (128, 64, 200):
        q = torch.randn(s_q, h, 576, dtype=torch.bfloat16, device=dev)
        a = prepare(q, kv, idx, 0.04, attn_sink=torch.randn(h, device=dev))
        fwd(a)
        idx2 = garbage((s_q, 300), s_kv)  # three pairs: the split path (pieces, merge), also at 5 "SMs"
        idx2[:, 4:200] = torch.randint(0, s_kv, (s_q, 196), dtype=torch.int32, device=dev)
        a2 = prepare(q, kv, idx2, 0.04, attn_sink=torch.randn(h, device=dev))
        fwd(a2)
        fwd(a2, dict(NSM=5))
        dist(a, torch.randn(s_q, h, device=dev) + 30)
        if h <= 64:  # programs over pairs of rows (an odd s_q: the last row alone)
            for n in (s_q, s_q - 1):
                dist(prepare(q[:n], kv, idx[:n], 0.04), torch.randn(n, h, device=dev) + 30, dict(SINGLES=0))
        sync(dev)
        print(f"sparse_mla_gluon h_q={h}: ran", flush=True)
    return 0


def sparse_mla_bwd(dev) -> int:
    """Both modes; topk 150: Gluon first pass + Triton second pass; topk 160 (a multiple of 16, h_q > 32): both
    passes Gluon."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    from test_sparse_mla_bwd import grads, make
    bad = 0
    for h, d, topk, opts in [(128, 576, 150, dict(q_start=torch.tensor([300], dtype=torch.int32, device=dev),
                                                  tlen=True, sink=True)),
                             (16, 512, 150, dict(q_start=250, k_stride=4)), (5, 576, 150, dict()),
                             (128, 576, 160, dict(q_start=309, tlen=True)), (64, 576, 160, dict(q_start=309)),
                             (64, 512, 160, dict())]:
        x = make(24, 333, h, topk, d, half(dev), dev, **opts)
        for det in (False, True):
            g = grads(x, det)
            sync(dev)
            finite = all(torch.isfinite(t).all().item() for t in g)
            bad += not finite
            print(f"sparse_mla_bwd h={h} d={d} topk={topk} det={det}: finite={finite}", flush=True)
    return bad


def xl_paged_decode(dev) -> int:
    """Tables with garbage past the used blocks (huge and negative ids), used blocks with out-of-range ids, a
    context longer than the table span and a bd narrower than the context: nothing may be read out of bounds, and
    the result must match the reference (which skips the same tokens)."""
    from llmkernels.checking import rel_err
    from llmkernels.ops.xl_paged_decode.spec import OUT_TOL, make_inputs, ref, run
    bad = 0
    for layout, H, Hkv in (("nhd", 8, 4), ("legacy", 8, 4), ("nhd", 4, 4), ("legacy", 4, 4)):  # GQA and MHA paths
        for dtype, D, bs in ((torch.float16, 128, 16), (torch.float32, 80, 8)):
            x = make_inputs(4, H, Hkv, D, bs, [70, 5, 0, 40], layout, dtype, dev, bd="contig", table_pad=2,
                            extra_blocks=0, garbage=True)
            nb = x["k_cache"].shape[0]
            x["block_tables"][0, 1] = nb              # just past the last block
            x["block_tables"][0, 3] = -1
            x["block_tables"][3, 0] = 2 ** 31 - 1
            x["context_lens"][1] = 10 ** 6            # clamped to the table span
            x["bd"] = x["bd"][:, :, :36].contiguous()  # narrower than context 70 and 40: clamped to 36
            sync(dev)
            o, lse = run(x, return_lse=True)
            sync(dev)
            err = rel_err(o, ref(x)[0])
            good = err <= OUT_TOL[dtype]
            bad += not good
            print(f"xl_paged_decode {layout} H={H} Hkv={Hkv} {str(dtype)[6:]} D={D} bs={bs}: err {err:.2e} "
                  f"{'ok' if good else 'MISMATCH'}", flush=True)
    return bad


def inkling_decode(dev) -> int:
    """Lengths and starts out of range (negative, past the cache, int32 extremes), windows of 1 and 2^31 - 1, tables
    with garbage ids, a bias band longer than every context: nothing read out of bounds, the reference's result."""
    from llmkernels.checking import rel_err
    from llmkernels.ops.inkling_decode.spec import OUT_TOL, make_inputs, ref, run
    bad = 0
    for layout, window in (("dense", None), ("dense", 1), ("nhd", 2 ** 31 - 1), ("legacy", 7)):
        x = make_inputs(4, 8, 2, 64, [70, 5, 0, 40], 300, layout, torch.float16, dev, window=window,
                        starts=[0, 9, I32_MIN, I32_MAX], block_size=16)
        x["lengths"][1] = I32_MAX if layout == "dense" else 10 ** 6  # clamped to the cache (or table span)
        x["lengths"][2] = -5
        if x["block_tables"] is not None:
            x["block_tables"][0, 1] = x["k"].shape[0]  # just past the last block
            x["block_tables"][3, 0] = I32_MIN
        sync(dev)
        o = run(x, scale=1 / 64)
        sync(dev)
        err = rel_err(o, ref(x, scale=1 / 64)[0])
        good = err <= OUT_TOL[torch.float16]
        bad += not good
        print(f"inkling_decode {layout} window={window}: err {err:.2e} {'ok' if good else 'MISMATCH'}", flush=True)
    return bad


def nvfp4_moe(dev) -> int:
    """Expert indices out of range (negative, E, int extremes): those slots add nothing, nothing read out of bounds."""
    from llmkernels import nvfp4_quantize
    from llmkernels.checking import rel_err
    from llmkernels.ops.nvfp4.moe import _flat, _moe
    from llmkernels.ops.nvfp4.moe_reference import nvfp4_moe_ref
    from llmkernels.ops.nvfp4.tiled_layout import tile_packed, tile_scales
    torch.manual_seed(0)
    E, H, inter, T, k = 4, 256, 256, 3, 4

    def proj(N, K):
        qs = [nvfp4_quantize(torch.randn(N, K, device=dev) * 0.1) for _ in range(E)]
        plain = (torch.stack([q[0] for q in qs]), torch.stack([q[1] for q in qs]),
                 torch.stack([q[2].reshape(()).float() for q in qs]))
        return plain, (torch.stack([tile_packed(q[0]) for q in qs]), torch.stack([tile_scales(q[1]) for q in qs]),
                       plain[2])
    ps = [proj(inter, H), proj(inter, H), proj(H, inter)]
    bad = 0
    for T in (T, 21):  # the decode kernels; past MOE_MAX_T grouped by expert
        x = torch.randn(T, H, device=dev).to(half(dev))
        idx = torch.randint(0, E, (T, k), device=dev)
        idx[:3] = torch.tensor([[0, -1, 3, E], [I32_MIN, 1, I32_MAX, 2], [E + 5, E, -7, 0]], device=dev)
        w = torch.rand(T, k, device=dev).to(half(dev))
        ref = nvfp4_moe_ref(x, idx, w, *(p[0] for p in ps))
        for mma in ((False, True) if dev.type == "cuda" and T <= 16 else (False,)):  # plain and mma-fed kernels
            sync(dev)
            y = _moe(x, idx, w, *_flat(*(p[1] for p in ps)), mma=mma)
            sync(dev)
            err = rel_err(y, ref)
            good = err <= 2e-2
            bad += not good
            print(f"nvfp4_moe garbage indices T={T} mma={mma}: err {err:.2e} {'ok' if good else 'MISMATCH'}",
                  flush=True)
    return bad


def masked_decode(dev) -> int:
    """Kept lists with garbage entries (negative, past dense_from and the cache, int32 extremes), counts outside
    [0, M] (and as prefixes: no lists), rows launched heavy first: nothing read out of bounds, the reference's
    result."""
    from llmkernels import masked_decode as md
    from llmkernels.checking import rel_err
    from llmkernels.ops.masked_decode.kernel import masked_decode_fwd
    from llmkernels.ops.masked_decode.reference import masked_decode_ref
    torch.manual_seed(0)
    B, Hkv, G, L, D, M = 3, 2, 4, 300, 128, 50
    q = torch.randn(B, Hkv * G, D, device=dev).to(half(dev))
    k, v = (torch.randn(B, Hkv, L, D, device=dev).to(half(dev)) for _ in range(2))
    idx = torch.randint(-10, L + 10, (B, Hkv, M), dtype=torch.int32, device=dev)
    idx[0, 0, :3] = torch.tensor([I32_MIN, I32_MAX, L], dtype=torch.int32)
    n = torch.tensor([[M, I32_MAX], [I32_MIN, 3], [0, M - 1]], dtype=torch.int32, device=dev)
    lens = torch.tensor([L, 120, I32_MAX], dtype=torch.int32, device=dev)
    bad = 0
    for dense_from, lists, heavy in ((0, idx, False), (200, idx, True), (L, idx, False), (200, None, False),
                                     (L, None, True)):
        sync(dev)
        if heavy:  # a launch knob: through the launcher
            o = torch.empty_like(q)
            masked_decode_fwd(q, k, v, None, lens, L, D ** -0.5, o, torch.empty(B, Hkv * G, device=dev),
                              config={"heavy_first": True}, kept=(lists, n, dense_from))
        else:
            o, _ = md(q, k, v, kv_len=lens, kept_idx=lists, kept_len=n, dense_from=dense_from)
        sync(dev)
        err = rel_err(o, masked_decode_ref(q, k, v, None, lens, None, lists, n, dense_from)[0])
        good = err <= 2e-2
        bad += not good
        what = "kept lists" if lists is not None else "kept prefixes"
        print(f"masked_decode {what} dense_from={dense_from}{' heavy first' if heavy else ''}: err {err:.2e} "
              f"{'ok' if good else 'MISMATCH'}", flush=True)
    return bad


def row_topk(dev) -> int:
    """Rows of odd lengths (a last block partly past the row), -inf / NaN / tied rows, k = N, and shapes whose plans
    differ call to call (the per-stream scratch's rows and counts move): nothing out of bounds, torch.topk's
    values."""
    from llmkernels import row_topk as rt
    from llmkernels.ops.row_topk.reference import row_topk_ref
    from llmkernels.ops.row_topk.spec import chosen
    torch.manual_seed(0)
    bad = 0
    for R, N, k in ((1, 65537, 2048), (3, 1025, 1025), (7, 3001, 5), (1, 1, 1), (2, 20000, 4096)):
        x = torch.randn(R, N, device=dev)
        x[0, ::7] = float("-inf")
        if R > 1:
            x[1] = 0.0
            x[-1, :N // 2] = float("nan")
        sync(dev)
        p = rt(x, k)
        sync(dev)
        good = torch.equal(chosen(x, p).nan_to_num(3e38), chosen(x, row_topk_ref(x, k)).nan_to_num(3e38))
        bad += not good
        print(f"row_topk R={R} N={N} k={k}: {'ok' if good else 'MISMATCH'}", flush=True)
    return bad


GROUPS = {"sparse_mla": sparse_mla, "sparse_mla_gluon": sparse_mla_gluon, "sparse_mla_bwd": sparse_mla_bwd,
          "xl_paged_decode": xl_paged_decode, "inkling_decode": inkling_decode, "nvfp4_moe": nvfp4_moe,
          "masked_decode": masked_decode, "row_topk": row_topk}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("groups", nargs="*", metavar="group", help=f"one of {', '.join(GROUPS)} (default: all)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu: a dry run of the cases through the "
                    "Triton interpreter (fp16 for bf16; slow: meant for one group)")
    args = ap.parse_args()
    unknown = set(args.groups) - set(GROUPS)
    if unknown:
        ap.error(f"unknown group(s) {sorted(unknown)}; known: {', '.join(GROUPS)}")
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("memcheck.py needs a CUDA GPU (or --device cpu for a dry run)")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import llmkernels  # noqa: F401  (on a CPU: the interpreter, set up before triton loads)
    bad = sum(GROUPS[g](dev) for g in args.groups or GROUPS)
    print(f"memcheck script: {'all ok' if not bad else f'{bad} wrong'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
