"""Greedy decode of a small Inkling-shaped random text model at a long context: llmkernels (patch_attention, then
StaticDecoder's CUDA-graph steps; and the patched model's eager steps on transformers' DynamicCache) beside
transformers' own path (its eager attention with the dense bias, DynamicCache), batch 1.

    python -m llmkernels.hf.inkling_bench --out DIR          # 12 layers (10 sliding, 2 full), hidden 2048, L 32768
    python -m llmkernels.hf.inkling_bench --quick --out DIR  # tiny (CPU works)

Records (op "inkling_model_decode", merged into DIR/<device>.json; shape L, B, layers): ms per decode step (median of
CUDA-event-timed steps), tokens_per_s, the prefill's seconds (ours: FlexAttention). The DynamicCache that
transformers' steps start from is filled by the patched model's prefill of the same prompt (its own eager prefill
of 32K tokens would hold [heads, 32K, 32K] scores).
"""
import argparse
import datetime
import os
import sys
import time

import torch
import triton

from ..bench.harness import median_ms
from .bench import random_model
from .decode import StaticDecoder
from .patch import patch_attention, unpatch_attention

# a quarter of Inkling's attention width (64 -> 16 query heads; full layers 8 -> 2 kv heads, sliding 16 -> 4), its
# head dim, window, band and layer pattern ((i + 1) % 6: sliding), dense MLPs
SMALL = dict(vocab_size=32000, hidden_size=2048, num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=2,
             head_dim=128, swa_num_attention_heads=16, swa_num_key_value_heads=4, swa_head_dim=128,
             sliding_window_size=512, d_rel=16, rel_extent=1024, log_scaling_n_floor=4096, intermediate_size=5632,
             mlp_layer_types=["dense"] * 12)
TINY = dict(vocab_size=128, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, swa_num_attention_heads=4, swa_num_key_value_heads=1, swa_head_dim=64, sliding_window_size=8,
            d_rel=4, rel_extent=16, log_scaling_n_floor=4, layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding"],
            mlp_layer_types=["dense"] * 3, intermediate_size=96)


def _model(cfg_kw, device, dtype):
    from transformers import InklingForCausalLM
    from transformers.models.inkling.configuration_inkling import InklingTextConfig
    cfg = InklingTextConfig(**cfg_kw)
    cfg._attn_implementation = "eager"
    model = random_model(InklingForCausalLM, cfg, device, dtype)
    for m in model.modules():  # transformers keeps the short convolutions in fp32
        if type(m).__name__ == "InklingShortConvolution":
            m.float()
    return model


def run(cfg_kw, L, reps, device, dtype):
    model = _model(cfg_kw, device, dtype)
    ids = torch.randint(1, model.config.vocab_size, (1, L), device=device)
    shape = {"L": L, "B": 1, "layers": model.config.num_hidden_layers, "hidden": model.config.hidden_size}
    recs = []
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with torch.no_grad():
        patch_attention(model)
        dec = StaticDecoder(model, 1, L + reps + 16, graph=device.type == "cuda")
        t0 = time.perf_counter()
        dec.prefill(ids)
        sync()
        rec = {"impl": "llmkernels", "prefill_s": time.perf_counter() - t0,
               "timing": "graph" if dec.graph else "eager"}
        dec.step()  # captures the graph
        rec["ms"] = median_ms(dec.step, reps, device, warm=2)
        recs.append(rec)
        del dec
        for impl in ("llmkernels-eager", "transformers-eager"):
            patch_attention(model)  # the prompt's DynamicCache, both paths (see the module's doc)
            t0 = time.perf_counter()
            out = model(ids, use_cache=True, logits_to_keep=1)
            sync()
            prefill_s = time.perf_counter() - t0
            cache, nxt = out.cache if hasattr(out, "cache") else out.past_key_values, out.logits[:, -1:].argmax(-1)
            if impl == "transformers-eager":
                unpatch_attention(model)
            kw = {"cache" if "cache" in out else "past_key_values": cache}

            def step():
                nonlocal nxt
                nxt = model(nxt, use_cache=True, **kw).logits[:, -1:].argmax(-1)
            recs.append({"impl": impl, "ms": median_ms(step, reps, device, warm=2), "timing": "eager",
                         **({"prefill_s": prefill_s} if impl == "llmkernels-eager" else {})})
            del cache, out
    unpatch_attention(model)
    for r in recs:
        r.update(op="inkling_model_decode", shape=shape, tokens_per_s=1e3 / r["ms"])
    return recs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmkernels.hf.inkling_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a tiny model and context (CPU works)")
    ap.add_argument("--L", type=int, default=None, help="context length (default 32768; quick 40)")
    ap.add_argument("--reps", type=int, default=None, help="timed decode steps (default 30; quick 3)")
    ap.add_argument("--out", default=None, help="merge records into OUT/<device>.json")
    args = ap.parse_args(argv)
    from ..bench.harness import _git_commit, merge_records
    from ..bench.report import device_slug
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    L = args.L or (40 if args.quick else 32768)
    recs = run(TINY if args.quick else SMALL, L, args.reps or (3 if args.quick else 30), device, dtype)
    import transformers
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    for r in recs:
        r.update(device=name, torch=torch.__version__, triton=triton.__version__, commit=_git_commit(),
                 transformers=transformers.__version__, date=datetime.date.today().isoformat(),
                 dtype=str(dtype).removeprefix("torch."), model=TINY if args.quick else SMALL)
    base = next(r["ms"] for r in recs if r["impl"] == "transformers-eager")
    print(f"{'impl':<20}{'timing':<8}{'ms/token':>10}{'tokens/s':>10}{'vs transformers':>17}{'prefill s':>11}")
    for r in recs:
        pre = f"{r['prefill_s']:>11.2f}" if "prefill_s" in r else ""
        print(f"{r['impl']:<20}{r['timing']:<8}{r['ms']:>10.3f}{r['tokens_per_s']:>10.1f}{base / r['ms']:>16.2f}x{pre}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"{device_slug(name)}.json")
        merged = merge_records(path, recs)
        print(f"[inkling] records: {path} ({len(recs)} new, {len(merged)} in file)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
