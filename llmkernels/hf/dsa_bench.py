"""One DeepSeek-V3.2-shaped DSA attention block (indexer included; random bf16 weights, batch 1): llmkernels'
patch_attention against transformers' own eager and SDPA paths, in prefill, decode and training.

    python -m llmkernels.hf.dsa_bench --out DIR            # the V3.2 sizes (an H200: about 3 minutes)
    python -m llmkernels.hf.dsa_bench --quick --out DIR    # a tiny block (CPU works)
    python -m llmkernels.hf.dsa_bench --phases decode --profile   # + our decode step's kernels by time (CUDA)

Records (op "dsa_attention", merged into DIR/<device>.json; impl llmkernels / transformers-eager / transformers-sdpa;
shape phase, S or L, B): ms (median of CUDA-event-timed calls; decode also replayed from one CUDA graph per call),
peak GPU memory, decode's cache bytes per token, an "error" where an implementation ran out of memory; ours also
the time split inside the block (indexer, sparse_mla, the rest: projections) and sparse_mla's % of its floor (its
FLOPs over the selected keys at the bf16 GEMM rate measured in the same run). Training = forward + backward of
sum(out * g) plus the DSA indexer loss (ours: patch_attention(indexer_loss=True); transformers: the same KL objective
written on its eager attention weights and index scores, as a user of its eager path would).
"""
import argparse
import contextlib
import datetime
import functools
import gc
import inspect
import os
import sys
import time

import torch
import triton

from . import dsa
from .bench import random_model
from .patch import patch_attention, unpatch_attention
from .._runtime import capture_step
from ..bench.harness import median_ms

V32 = dict(hidden_size=7168, num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512,
           qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, index_n_heads=64, index_head_dim=128,
           index_topk=2048, num_hidden_layers=1, vocab_size=1024, max_position_embeddings=163840)
TINY = dict(V32, hidden_size=64, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=48, qk_nope_head_dim=32,
            v_head_dim=32, index_n_heads=4, index_topk=8)
FULL = dict(prefill=(4096, 8192, 16384, 65536), decode=(65536,), train=(4096, 8192, 32768),
            theirs_prefill=(4096, 8192, 16384), theirs_train=(4096, 8192), model=(4, 32768))
QUICK = dict(prefill=(24,), decode=(40,), train=(24,), theirs_prefill=(24,), theirs_train=(24,), model=(2, 24))
STD = 0.02


def block(cfg_kw, device, dtype):
    """(attention module, rotary embedding) of a one-layer DeepseekV32 config, random weights."""
    from transformers import DeepseekV32Config
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as m
    cfg = DeepseekV32Config(**cfg_kw)
    cfg._attn_implementation = "eager"
    attn = m.DeepseekV32Attention(cfg, layer_idx=0).to(device, dtype)
    with torch.no_grad():
        for n, p in attn.named_parameters():
            if p.dim() > 1:
                p.normal_(0, STD)
    return attn, m.DeepseekV32RotaryEmbedding(cfg).to(device)


def _cache_kw(attn):
    return "cache" if "cache" in inspect.signature(type(attn).forward).parameters else "past_key_values"


def theirs(attn, impl, x, emb, mask, cache=None):
    """transformers' own DeepseekV32Attention.forward with attn_implementation impl ("eager" / "sdpa")."""
    attn.config._attn_implementation = impl
    return type(attn).forward(attn, x, emb, mask, **{_cache_kw(attn): cache})


def ours(attn, x, emb, cache=None, position_ids=None):
    return dsa._forward(attn, x, emb, None, past_key_values=cache, position_ids=position_ids)


def causal_mask(impl, S, T, device, dtype):
    """The 4-d mask transformers builds for impl: additive (eager) or boolean (SDPA), queries the last S of T."""
    ok = torch.ones(S, T, dtype=torch.bool, device=device).tril(T - S)[None, None]
    if impl == "sdpa":
        return ok
    return torch.zeros(ok.shape, dtype=dtype, device=device).masked_fill_(~ok, torch.finfo(dtype).min)


def graph_ms(fn, reps, device):
    """Median ms of one replay of a CUDA graph holding one fn() call (None off CUDA)."""
    if device.type != "cuda":
        return None
    return median_ms(capture_step(fn).replay, reps, device, warm=3)


@contextlib.contextmanager
def measured(rec, device):
    """Fill rec's peak_mem_gb; an out-of-memory becomes rec["error"] (the run goes on)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        yield
    except torch.OutOfMemoryError as e:
        rec.update(ms=None, error=f"out of memory ({str(e).splitlines()[0][:120]})")
    if device.type == "cuda":
        rec["peak_mem_gb"] = torch.cuda.max_memory_allocated() / 1e9
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()


def _inputs(attn, rope, S, device, dtype, start=0):
    x = torch.randn(1, S, attn.config.hidden_size, device=device, dtype=dtype)
    pos = torch.arange(start, start + S, device=device)[None]
    return x, rope(x, pos), pos


def prefill(attn, rope, S, impl, device, dtype, reps):
    rec = {"shape": {"phase": "prefill", "S": S, "B": 1}, "impl": impl}
    with measured(rec, device), torch.no_grad():
        x, emb, _ = _inputs(attn, rope, S, device, dtype)
        if impl == "llmkernels":
            rec["ms"] = median_ms(lambda: ours(attn, x, emb), reps, device)
            rec.update(split(attn, x, emb, reps, device))
        else:
            mask = causal_mask(impl.split("-")[1], S, S, device, dtype)
            rec["ms"] = median_ms(lambda: theirs(attn, impl.split("-")[1], x, emb, mask), reps, device)
    return rec


def split(attn, x, emb, reps, device):
    """Ours, piece by piece on the same inputs: the indexer's top-k, sparse_mla, and the rest (projections)."""
    B, S, _ = x.shape
    q_resid = attn.q_a_layernorm(attn.q_a_proj(x))
    visible = dsa.Visible(None, None, S, S, x.device)
    topk = dsa.indexer_topk(attn.indexer, x, q_resid, emb, visible)
    ms_index = median_ms(lambda: dsa.indexer_topk(attn.indexer, x, q_resid, emb, dsa.Visible(None, None, S, S,
                                                                                           x.device)), reps, device)
    H = attn.num_heads
    q_abs = torch.randn(S, H, dsa.LATENT + dsa.ROPE, device=x.device, dtype=x.dtype)
    kv = torch.randn(S, 1, dsa.LATENT + dsa.ROPE, device=x.device, dtype=x.dtype)
    idx = topk.reshape(S, -1)
    ms_attn = median_ms(lambda: dsa.sparse_mla(q_abs, kv, idx, attn.scaling), reps, device)
    flops = 2 * int((idx >= 0).sum()) * H * (dsa.LATENT + dsa.ROPE + dsa.LATENT)
    return {"split_ms": {"indexer": ms_index, "sparse_mla": ms_attn}, "sparse_mla_flops": flops}


def _static_cache(cfg, L, device):
    from transformers import StaticCache
    return StaticCache(config=cfg, max_cache_len=L + 1)


def kernel_breakdown(call, device, calls: int = 5, top: int = 14) -> list:
    """[(kernel name, us a call, launches a call)] of `calls` eager calls under torch.profiler (CUDA kernels only),
    the heaviest first and the rest summed as "(others)" (issue 49: where the decode step's time goes)."""
    from torch.profiler import ProfilerActivity, profile
    call()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize(device)
    tot = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            us, n = tot.get(ev.name, (0.0, 0))
            tot[ev.name] = (us + ev.device_time / calls, n + 1 / calls)
    rows = sorted(((k, us, n) for k, (us, n) in tot.items()), key=lambda r: -r[1])
    rest = rows[top:]
    return rows[:top] + ([("(others)", sum(r[1] for r in rest), sum(r[2] for r in rest))] if rest else [])


def decode(attn, rope, L, impl, device, dtype, reps, profile=False):
    """One new token against L cached ones (random cache contents: the time does not depend on them), transformers'
    StaticCache for both (its rows updated in place; each path's own rows, as a one-token probe finds them: the
    per-head keys and values in transformers 5.17, the latent in 5.2x and ours); the lengths reset to L before each
    call."""
    rec = {"shape": {"phase": "decode", "L": L, "B": 1}, "impl": impl}
    with measured(rec, device), torch.no_grad():
        x, emb, pos = _inputs(attn, rope, 1, device, dtype, start=0)
        if impl == "llmkernels":
            run = lambda c, x, emb, pos, mask: ours(attn, x, emb, c, pos)  # noqa: E731
        elif impl == "llmkernels-compiled":  # the block's small elementwise kernels fused by inductor (as
            # StaticDecoder(compile=True) does a model's step); the first calls compile
            fwd = torch.compile(ours, dynamic=False, backend="inductor" if device.type == "cuda" else "aot_eager")
            run = lambda c, x, emb, pos, mask: fwd(attn, x, emb, c, pos)  # noqa: E731
        else:
            run = lambda c, x, emb, pos, mask: theirs(attn, impl.split("-")[1], x, emb, mask, c)  # noqa: E731
        probe = _static_cache(attn.config, 1, device)  # the rows this version of the path caches
        run(probe, x, emb, pos, causal_mask(impl.split("-")[-1], 1, 2, device, dtype))
        cache = _static_cache(attn.config, L, device)
        keys, vals, ikeys = probe.layers[0].keys, probe.layers[0].values, probe.layers[0].indexer_keys
        cache.update(torch.randn(*keys.shape[:2], L, keys.shape[3], device=device, dtype=dtype),
                     torch.randn(*vals.shape[:2], L, vals.shape[3], device=device, dtype=dtype), 0)
        cache.update_indexer(torch.randn(1, L, ikeys.shape[-1], device=device, dtype=dtype), 0)
        del probe
        layer = cache.layers[0]
        x, emb, pos = _inputs(attn, rope, 1, device, dtype, start=L)
        mask = causal_mask(impl.split("-")[-1], 1, L + 1, device, dtype)
        step = lambda: run(cache, x, emb, pos, mask)  # noqa: E731

        def call():
            layer.cumulative_length.fill_(L)
            layer.indexer_cumulative_length.fill_(L)
            return step()
        rec["ms_eager"] = median_ms(call, reps, device, warm=2)
        try:
            rec["ms"], rec["timing"] = graph_ms(call, reps, device), "graph"
        except Exception as e:  # a path that cannot be captured keeps its eager time
            rec["ms"], rec["timing"], rec["graph_error"] = rec["ms_eager"], "eager", f"{type(e).__name__}: {e}"[:200]
        if rec["ms"] is None:
            rec["ms"], rec["timing"] = rec["ms_eager"], "eager"
        nbytes = sum(t.numel() * t.element_size() for t in (layer.keys, layer.values, layer.indexer_keys))
        rec["cache_bytes_per_token"] = nbytes / (L + 1)
        if profile and device.type == "cuda" and impl.startswith("llmkernels"):
            rec["kernels"] = [dict(name=k[:80], us=round(us, 2), launches=round(n, 2))
                              for k, us, n in kernel_breakdown(call, device)]
    return rec


def _dense_indexer_loss(attn, x, emb, weights, topk):
    """The DSA indexer objective from transformers' eager attention weights and its index scores [B, S, T] with
    gradients (its indexer runs under no_grad): KL(heads' attention summed and L1-normalised over the selected keys
    || softmax of the index scores there), summed over tokens."""
    ix = attn.indexer
    q, k = dsa._indexer_qk(ix, x, attn.q_a_layernorm(attn.q_a_proj(x)).detach(), emb)
    scores = torch.relu(torch.matmul(q.float(), k.float().transpose(-1, -2).unsqueeze(1)) * ix.softmax_scale)
    w = dsa._weights_proj(ix, x) * ix.n_heads ** -0.5
    logits = torch.matmul(w.unsqueeze(-2), scores).squeeze(-2).gather(-1, topk.long())
    p = weights.detach().float().sum(1).gather(-1, topk.long())
    p = p / p.sum(-1, keepdim=True)
    return torch.where(p > 0, p * (p.clamp_min(1e-30).log() - torch.log_softmax(logits, -1)), 0).sum()


def train(attn, rope, S, impl, device, dtype, reps):
    rec = {"shape": {"phase": "train", "S": S, "B": 1}, "impl": impl}
    with measured(rec, device):
        attn.train()
        x, emb, _ = _inputs(attn, rope, S, device, dtype)
        x.requires_grad_(True)
        g = torch.randn(1, S, attn.config.hidden_size, device=device, dtype=dtype)
        if impl == "llmkernels":
            def step():
                attn.llmk_indexer_loss = True
                out = ours(attn, x, emb)[0]
                ((out.float() * g).sum() + attn.llmk_loss).backward()
                attn.llmk_loss = None
        else:
            mask = causal_mask("eager", S, S, device, dtype)
            seen = {}
            hook = attn.indexer.register_forward_hook(lambda m, a, out: seen.__setitem__("topk", out))

            def step():
                out, weights = theirs(attn, "eager", x, emb, mask)
                loss = (out.float() * g).sum() + _dense_indexer_loss(attn, x.detach(), emb, weights, seen["topk"])
                loss.backward()
        try:
            rec["ms"] = median_ms(step, reps, device)
        finally:
            attn.eval()
            attn.zero_grad(set_to_none=True)
            if impl != "llmkernels":
                hook.remove()
    return rec


def _model(cfg_kw, layers, device, dtype):
    """A random DeepseekV32ForCausalLM of `layers` layers with dense MLPs (V3.2's dense-layer width)."""
    from transformers import DeepseekV32Config, DeepseekV32ForCausalLM
    cfg = DeepseekV32Config(**dict(cfg_kw, num_hidden_layers=layers, first_k_dense_replace=layers,
                                   vocab_size=129280 if cfg_kw is V32 else 128,
                                   intermediate_size=18432 if cfg_kw is V32 else 96))
    cfg._attn_implementation = "eager"
    model = random_model(DeepseekV32ForCausalLM, cfg, device, dtype)
    model.generation_config.eos_token_id = None
    return model


def model_decode(cfg_kw, layers, L, device, dtype, reps):
    """Greedy decode of a few-layer V3.2-shaped random model at context L: ours through StaticDecoder (prefill of an
    L-token prompt, then one CUDA graph per step), transformers' own forward a token at a time against a StaticCache
    holding L random rows (eager; its lengths reset to L before each step)."""
    from .decode import StaticDecoder
    out = []
    model = _model(cfg_kw, layers, device, dtype)
    for impl in ("llmkernels", "transformers-eager"):
        rec = {"shape": {"phase": "model_decode", "L": L, "B": 1, "layers": layers}, "impl": impl, "op":
               "dsa_attention"}
        with measured(rec, device), torch.no_grad():
            if impl == "llmkernels":
                patch_attention(model)
                dec = StaticDecoder(model, 1, L + reps + 8, graph=device.type == "cuda")
                t0 = time.perf_counter()
                dec.prefill(torch.randint(0, model.config.vocab_size, (1, L), device=device))
                if device.type == "cuda":
                    torch.cuda.synchronize()
                rec["prefill_s"] = time.perf_counter() - t0
                dec.step()  # captures the graph
                rec["ms"] = median_ms(dec.step, reps, device, warm=2)
                rec["timing"] = "graph" if dec.graph else "eager"
                del dec
                unpatch_attention(model)
            else:
                from transformers import StaticCache
                cache = StaticCache(config=model.config, max_cache_len=L + 1)
                ids = torch.randint(0, model.config.vocab_size, (1, 1), device=device)
                kw = {_cache_kw(model.model.layers[0].self_attn): cache}
                model(ids, position_ids=torch.zeros(1, 1, dtype=torch.long, device=device), **kw)  # its row shapes
                for la in cache.layers:
                    k, v = la.keys, la.values
                    la.keys.copy_(torch.randn_like(k))
                    la.values.copy_(torch.randn_like(v))
                    la.indexer_keys.copy_(torch.randn_like(la.indexer_keys))
                pos = torch.full((1, 1), L, dtype=torch.long, device=device)

                def step():
                    for la in cache.layers:
                        la.cumulative_length.fill_(L)
                        la.indexer_cumulative_length.fill_(L)
                    return model(ids, position_ids=pos, **kw).logits
                rec["ms"], rec["timing"] = median_ms(step, reps, device, warm=2), "eager"
                del cache
            rec["tokens_per_s"] = 1e3 / rec["ms"]
        out.append(rec)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmkernels.hf.dsa_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a tiny block, tiny sizes (CPU works)")
    ap.add_argument("--phases", default="prefill,decode,train,model")
    ap.add_argument("--reps", type=int, default=None, help="timed calls per case (default 5; 20 for decode)")
    ap.add_argument("--out", default=None, help="merge records into OUT/<device>.json")
    ap.add_argument("--profile", action="store_true", help="decode: our step's kernels by time (CUDA; printed and "
                    "kept in the records as `kernels`)")
    args = ap.parse_args(argv)
    from ..bench.harness import _git_commit, merge_records
    from ..bench.report import device_slug, dsa_table
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16  # the interpreter's bf16 dot is wrong
    sizes = QUICK if args.quick else FULL
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    attn, rope = block(TINY if args.quick else V32, device, dtype)
    recs = []
    impls = ("llmkernels", "llmkernels-compiled", "transformers-eager", "transformers-sdpa")
    for phase in args.phases.split(","):
        if phase == "model":
            layers, L = sizes["model"]
            recs += model_decode(TINY if args.quick else V32, layers, L, device, dtype, args.reps or 20)
            for r in recs[-2:]:
                log(f"[dsa] model decode {layers} layers, L {L}, {r['impl']}: "
                    + (f"{r['ms']:.3f} ms/token" if r.get("ms") else r.get("error")))
            continue
        for impl in impls:
            if phase == "train" and impl == "transformers-sdpa":
                continue  # SDPA returns no attention weights for the indexer loss
            if impl == "llmkernels-compiled" and phase != "decode":
                continue
            for n in sizes[phase] if impl.startswith("llmkernels") or phase == "decode" else sizes["theirs_" + phase]:
                reps = args.reps or (20 if phase == "decode" else 5)
                rec = dict(prefill=prefill, decode=functools.partial(decode, profile=args.profile),
                           train=train)[phase](attn, rope, n, impl, device, dtype, reps)
                rec["op"] = "dsa_attention"
                recs.append(rec)
                log(f"[dsa] {phase} {n} {impl}: " + (f"{rec['ms']:.3f} ms" if rec.get("ms") else rec.get("error"))
                    + (f", peak {rec['peak_mem_gb']:.1f} GB" if rec.get("peak_mem_gb") else ""))
                for k in rec.get("kernels", ()):
                    log(f"[dsa]     {k['us']:8.2f} us  x{k['launches']:<5g} {k['name']}")
    ceil = {}
    if device.type == "cuda":
        from ..bench.ceilings import copy_bandwidth, gemm_rate, read_bandwidth
        ceil = dict(copy_tbps=copy_bandwidth() / 1e12, read_tbps=read_bandwidth() / 1e12,
                    gemm_tflops=gemm_rate() / 1e12)
    import transformers
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    for r in recs:
        r.update(ceil, device=name, torch=torch.__version__, triton=triton.__version__,
                 transformers=transformers.__version__, date=datetime.date.today().isoformat(),
                 commit=_git_commit(), dtype=str(dtype).removeprefix("torch."), block=V32 if not args.quick else TINY)
        if r.get("sparse_mla_flops") and ceil and r.get("ms"):
            floor = r["sparse_mla_flops"] / (ceil["gemm_tflops"] * 1e12) * 1e3
            r["sparse_mla_pct_of_floor"] = 100 * floor / r["split_ms"]["sparse_mla"]
    print(dsa_table(recs))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"{device_slug(name)}.json")
        merged = merge_records(path, recs)
        log(f"[dsa] records: {path} ({len(recs)} new, {len(merged)} in file)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
