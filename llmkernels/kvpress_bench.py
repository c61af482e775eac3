"""Decode steps of a Llama-3.1-8B-shaped model (random bf16 weights) under a kvpress head-wise press: llmkernels'
masked_decode path against kvpress's own, the same model without a press, and transformers' own attention.

    python -m llmkernels.kvpress_bench --out DIR           # batch 1 at 128K, batch 8 at 32K; AdaKV 0.5 and 0.75
    python -m llmkernels.kvpress_bench --quick             # a tiny model (CPU works)
    python -m llmkernels.kvpress_bench --compile --out DIR # the decoders' steps under torch.compile too

One prefill per (context, batch, ratio) under the press (kvpress's AdaKVPress over KnormPress), then each impl decodes
from that cache, steps timed with CUDA events (median; --compile: the three PressDecoder impls again with
compile=True, named "<impl>-compiled", the eager impls not repeated): `llmkernels` (PressDecoder: the press's kept
tokens as
masked_decode's kept lists, fixed buffers, one CUDA graph a step; on the CPU eager; the model's q / k / v and gate / up
as one GEMM each, hf.fuse_projections, as for the other two decoders), `llmkernels-compact` (the same,
each row's kept tokens moved to its front: buffers as wide as the longest row; `cache_gb` the decoder's buffers),
`no-press` (the same decoder with nothing dropped), `llmkernels-eager` (masked_decode_attention's eager steps on
a GrowingCache, the lists), `kvpress` (kvpress 0.5.5's fake keys, SDPA, transformers' DynamicCache, eager: its path
cannot be captured) and `transformers` (no press, SDPA, DynamicCache, eager). Records op "kvpress_decode" with
"timing" graph or eager; each also carries attn_ms, one layer's decode attention on the same cache alone, replayed
from a CUDA graph (the kept lists; compact: each row's kept prefix of the compacted cache; none for no-press;
attn_mask_ms: the same tokens as a drop mask).
"""
import argparse
import datetime
import gc
import os
import sys
import time

import torch
import triton

from .bench.harness import _graph_time_ms, median_ms

LLAMA_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
                max_position_embeddings=131072 + 64)
TINY = dict(vocab_size=256, hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, max_position_embeddings=256)


def run(model, press_cls, ratio, context, batch, device, steps=5, warm=2, log=print, compile=False):
    import kvpress
    from transformers import DynamicCache
    from .hf.fuse import fuse_projections, unfuse_projections
    from .kvpress import GrowingCache, PressDecoder, compacted, drop_mask, kept, masked_decode_attention
    from .ops.masked_decode.op import masked_decode
    attns = [la.self_attn for la in model.model.layers]
    ids = torch.randint(0, model.config.vocab_size, (batch, context), device=device)
    press = press_cls(kvpress.KnormPress(compression_ratio=ratio))
    cache = DynamicCache(config=model.config)
    t0 = time.perf_counter()
    with torch.no_grad(), press(model):
        out = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    indices = [a.masked_key_indices for a in attns]
    log(f"[kvpress] prefill B={batch} L={context} ratio={ratio}: {time.perf_counter() - t0:.1f} s")
    nxt = out.logits[:, -1:].argmax(-1)
    del out
    shape = {"model": "llama-3.1-8b-shaped" if model.config.hidden_size == 4096 else "tiny", "press": "AdaKV-Knorm",
             "ratio": ratio, "context": context, "batch": batch}
    recs, attn = [], {}
    k, v = cache.layers[0].keys, cache.layers[0].values
    q = torch.randn(batch, model.config.num_attention_heads, 1, k.shape[-1], device=device, dtype=k.dtype)
    attns[0].masked_key_indices = indices[0]
    kl = kept(attns[0], k)  # one layer's attention alone: the lists, the same tokens as a mask, nothing dropped
    dm = drop_mask(attns[0], k)
    # one call's GPU time: replayed from a CUDA graph (an eager call's events would also hold its host launch)
    one = (lambda f: _graph_time_ms([f])) if device.type == "cuda" else (lambda f: median_ms(f, 20, device))
    attn["llmkernels"] = one(lambda: masked_decode(q, k, v, kept_idx=kl[0], kept_len=kl[1], dense_from=kl[2]))
    attn_mask_ms = one(lambda: masked_decode(q, k, v, drop_mask=dm))
    attn["no-press"] = one(lambda: masked_decode(q, k, v))
    width = int(kl[1].max())  # compact: each row's kept tokens at its front, read as a prefix (no list)
    kc, vc = compacted(k, v, kl[0], width)
    attn["llmkernels-compact"] = one(lambda: masked_decode(q, kc, vc, kept_len=kl[1], dense_from=width))
    kc = vc = None  # (the timed lambda is done with them)
    attn["llmkernels-eager"] = attn["llmkernels"]
    kept_frac = 1.0 - float(dm.float().mean())
    decoders = [(i, False) for i in ("llmkernels", "llmkernels-compact", "no-press")]
    if compile:
        decoders += [(i, True) for i, _ in decoders]
    fuse_projections(model)  # the decoders' q / k / v and gate / up as one GEMM each (8 tokens: ~0.5 ms a step)
    for impl, compiled in decoders:  # fixed buffers first: the eager impls' copy after
        for a, idx in zip(attns, indices):
            a.masked_key_indices = idx if impl != "no-press" else None
        dec = PressDecoder(model, cache, nxt.view(-1), max_new_tokens=warm + steps + 2,
                           compact=impl == "llmkernels-compact", compile=compiled)
        impl += "-compiled" if compiled else ""
        for _ in range(warm):  # the first step captures the graph (CUDA)
            dec.step()
        ms = median_ms(dec.step, steps, device, warm=0)
        gb = sum(t.numel() * t.element_size() for la in dec.cache.layers for t in (la.keys, la.values)) / 1e9
        recs.append(dict(impl=impl, ms=ms, timing="graph" if dec.graph else "eager", cache_gb=gb,
                         projections="stacked"))
        del dec
        if compiled:  # the compiled step's code holds the decoder's buffers (~34 GB at 32K x 8) until reset
            torch._dynamo.reset()
        _freed(device, log, impl)
    unfuse_projections(model)  # (kvpress's and transformers' own paths as they run)
    grow = GrowingCache(config=model.config)  # the eager adapter's: the same rows, with headroom
    for mine, la in zip(grow.layers, cache.layers):
        mine.update(la.keys, la.values)
    for impl in ("llmkernels-eager", "kvpress", "transformers"):
        ours = impl == "llmkernels-eager"
        for a, idx in zip(attns, indices):
            a.masked_key_indices = idx if impl != "transformers" else None
            a.__dict__.pop("_llmk_kept", None)
        pos = torch.full((batch, 1), context, device=device)
        kv = grow if ours else cache

        def step():
            with torch.no_grad():
                model(nxt, past_key_values=kv, position_ids=pos, use_cache=True, logits_to_keep=1)
            pos.add_(1)
        with (masked_decode_attention(model) if ours else _Null()):
            for _ in range(warm):
                step()
            ms = median_ms(step, steps, device, warm=0)
        kv.crop(context)
        recs.append(dict(impl=impl, ms=ms, timing="eager"))
        if ours:  # the adapter's copy of the cache (as large as the cache) is not needed by the peers
            kv = grow = None
        _freed(device, log, impl)
    for a in attns:
        a.masked_key_indices = None
        a.__dict__.pop("_llmk_kept", None)
    for r in recs:
        r.update(op="kvpress_decode", shape=dict(shape), kept=kept_frac,
                 attn_ms=attn.get(r["impl"].removesuffix("-compiled")))
        if r["impl"] == "llmkernels":
            r["attn_mask_ms"] = attn_mask_ms
        log(f"[kvpress] {r['impl']:<16} B={batch} L={context} ratio={ratio}: {r['ms']:.2f} ms a step "
            f"({r['timing']}); one layer's attention {r['attn_ms'] * 1e3 if r['attn_ms'] else float('nan'):.1f} us "
            f"(kept {kept_frac:.2f})")
    return recs


def _freed(device, log, impl: str) -> None:
    """Collect what the last impl left, and say how much memory the run still holds (the cases at 32K x 8 come
    within a few GB of an H200's 141)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        log(f"[kvpress] after {impl}: {torch.cuda.memory_allocated(device) / 1e9:.1f} GB held")


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmkernels.kvpress_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--compile", action="store_true", help="the PressDecoder impls under torch.compile too")
    ap.add_argument("--case", action="append", default=None, metavar="CONTEXTxBATCH",
                    help="only these cases (e.g. 32768x8; repeatable); default: 32768x8 and 131072x1")
    ap.add_argument("--ratio", action="append", type=float, default=None, help="only these ratios (default 0.5, 0.75)")
    args = ap.parse_args(argv)
    import kvpress
    import transformers
    from .bench.harness import _git_commit, merge_records
    from .bench.report import device_slug
    from .hf.bench import random_model
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    cfg = transformers.LlamaConfig(**(TINY if args.quick else LLAMA_8B))
    cfg._attn_implementation = "sdpa"
    model = random_model(transformers.LlamaForCausalLM, cfg, device, dtype)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    cases = [(64, 2)] if args.quick else [(32768, 8), (131072, 1)]
    if args.case:
        try:
            cases = [tuple(int(v) for v in c.lower().split("x")) for c in args.case]
        except ValueError:
            ap.error(f"--case takes CONTEXTxBATCH (e.g. 32768x8), got {args.case}")
        if any(len(c) != 2 or min(c) < 1 for c in cases):
            ap.error(f"--case takes CONTEXTxBATCH with both >= 1, got {args.case}")
    ceil = {}
    if device.type == "cuda":
        from .bench.ceilings import copy_bandwidth, read_bandwidth
        ceil = dict(copy_tbps=copy_bandwidth() / 1e12, read_tbps=read_bandwidth() / 1e12)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    from importlib.metadata import version
    recs = []
    for context, batch in cases:
        for ratio in args.ratio or (0.5, 0.75):
            new = run(model, kvpress.AdaKVPress, ratio, context, batch, device, log=log, compile=args.compile)
            for r in new:
                r.update(ceil, device=name, torch=torch.__version__, triton=triton.__version__,
                         kvpress=version("kvpress"), transformers=transformers.__version__,
                         date=datetime.date.today().isoformat(), commit=_git_commit(), dtype=str(dtype)[6:])
            recs += new
            if args.out:  # after each case: a run cut short keeps what it measured
                os.makedirs(args.out, exist_ok=True)
                merge_records(os.path.join(args.out, f"{device_slug(name)}.json"), new)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    from .bench.report import kvpress_table
    print(kvpress_table(recs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
