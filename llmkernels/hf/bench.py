"""End-to-end greedy decode of Llama- and Qwen3-MoE-shaped transformers models (random weights): bf16 against NVFP4.

    python -m llmkernels.hf.bench --model llama-3.1-8b-shaped --out DIR    # or llama-3.3-70b-shaped, all
    python -m llmkernels.hf.bench --quick --out DIR                        # tiny model, 1-2 steps (CPU works)

For each model, format (bf16 where it fits, nvfp4) and batch, one prompt is prefilled, then decode steps run eager
and from one CUDA graph per step (StaticDecoder). Records (op "e2e_decode", the harness's record format, merged into
DIR/<device>.json): ms per decode step, tokens/s, peak GPU memory, and floor_ms = bytes read per step (every weight
once, the embedding rows of the batch, the valid KV cache) / read bandwidth measured in the same run. The 8B's
NVFP4 form is quantize_ of its bf16 form; the 70B's packed weights are drawn directly as random codes and scales.
Mixture-of-experts models (qwen3-30b-a3b-shaped, qwen3-235b-a22b-shaped, the latter built directly in NVFP4): the
floor counts only the experts a step reads: the distinct experts among a batch's tokens under the model's own
routing, measured on the prefill (per prompt position, the batch's tokens there; ExpertCounter; records carry
active_experts), k per token at batch 1.
"""
import argparse
import datetime
import gc
import os
import sys
import time
import traceback

import torch
import triton

from ..ops.nvfp4.op import NVFP4Linear
from .decode import StaticDecoder
from .fuse import fuse_projections
from .load import buffers_to, check_materialized, params_on_meta, replace_linears, set_tensor
from .moe import Experts, is_fused_experts, unfuse_experts
from .save import quantize_

_LLAMA3 = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=128256, num_key_value_heads=8,
               head_dim=128, hidden_act="silu", max_position_embeddings=131072, rms_norm_eps=1e-5,
               rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
               attention_bias=False, mlp_bias=False, tie_word_embeddings=False, bos_token_id=128000,
               eos_token_id=128001)
# the sizes of meta-llama/Llama-3.1-8B and Llama-3.3-70B-Instruct's config.json
MODELS = {
    "llama-3.1-8b-shaped": dict(_LLAMA3, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                num_attention_heads=32),
    "llama-3.3-70b-shaped": dict(_LLAMA3, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                 num_attention_heads=64),
    "tiny": dict(_LLAMA3, vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=64, bos_token_id=1, eos_token_id=2),
}
_QWEN3_MOE = dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], vocab_size=151936, head_dim=128,
                  num_key_value_heads=4, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                  decoder_sparse_step=1, mlp_only_layers=[], hidden_act="silu", max_position_embeddings=40960,
                  rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False, bos_token_id=151643,
                  eos_token_id=151645)
# the sizes of Qwen/Qwen3-30B-A3B and Qwen3-235B-A22B's config.json (issue 47)
MODELS.update({
    "qwen3-30b-a3b-shaped": dict(_QWEN3_MOE, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                                 num_hidden_layers=48, num_attention_heads=32),
    "qwen3-235b-a22b-shaped": dict(_QWEN3_MOE, hidden_size=4096, intermediate_size=12288,
                                   moe_intermediate_size=1536, num_hidden_layers=94, num_attention_heads=64),
    "tiny-moe": dict(_QWEN3_MOE, vocab_size=512, hidden_size=256, intermediate_size=256, moe_intermediate_size=256,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=64, num_experts=4,
                     num_experts_per_tok=2, bos_token_id=1, eos_token_id=2),
})
DIRECT_NVFP4 = ("llama-3.3-70b-shaped", "qwen3-235b-a22b-shaped")  # never materialised in bf16
DEFAULT_MODELS = ("llama-3.1-8b-shaped", "llama-3.3-70b-shaped")  # --model all
STD = 0.02  # weight scale of the random models


def random_model(model_cls, config, device, dtype):
    """model_cls(config) built straight on device in dtype (its own random initialisation), in eval mode."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return model_cls(config).eval()
    finally:
        torch.set_default_dtype(prev)


def build(name: str, device, dtype, direct_nvfp4: bool):
    """A random model of MODELS[name] on device; with direct_nvfp4 its linears (not lm_head) are NVFP4Linear with
    random E2M1 codes, e4m3 scales in [0.5, 1] and a global scale giving weights of rms ~STD."""
    from transformers import AutoConfig, AutoModelForCausalLM
    kw = dict(MODELS[name])
    config = AutoConfig.for_model(kw.pop("model_type"), **kw)
    with params_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    if direct_nvfp4:
        unfuse_experts(model, materialize=False)  # MoE: one linear per expert and projection (hf.moe)
        shapes = {n: (m.out_features, m.in_features, m.bias is not None) for n, m in model.named_modules()
                  if isinstance(m, torch.nn.Linear) and n != "lm_head"}
        replace_linears(model, shapes)
        # E2M1 codes uniform over 16 values have rms 2.93; scales average 0.75
        gs = torch.full((1,), STD / (2.93 * 0.75), dtype=torch.float32, device=device)
        for n, (N, K, _) in shapes.items():
            set_tensor(model, f"{n}.packed", torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=device))
            set_tensor(model, f"{n}.scales", torch.randint(0x30, 0x39, (N, K // 16), dtype=torch.uint8,
                                                           device=device).view(torch.float8_e4m3fn))
            set_tensor(model, f"{n}.global_scale", gs.clone())
        fuse_projections(model)
    for n, p in list(model.named_parameters()):
        t = torch.empty(p.shape, dtype=dtype, device=device)
        set_tensor(model, n, t.fill_(1.0) if n.endswith("norm.weight") else t.normal_(0.0, STD))
    buffers_to(model, device)
    if torch.device(device).type != "meta":  # (meta: the tests' host-sync check)
        check_materialized(model)
    return model.eval()


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def read_bytes(model, batch: int, active=None) -> int:
    """Bytes one decode step reads from the weights: every parameter and buffer once, but only `batch` rows of the
    input embedding (a gather), and of a mixture-of-experts layer only its active experts: `active` of them (the mean
    distinct experts a step's tokens choose, as measured by ExpertCounter), else their expectation under uniform
    routing (see the module's doc)."""
    emb = model.get_input_embeddings().weight
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        key = id(t) if t.device.type == "meta" else t.data_ptr()  # meta tensors all have address 0
        if key in seen or t is emb:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    k = getattr(model.config, "num_experts_per_tok", 0)
    for mod in model.modules():
        if isinstance(mod, Experts) or is_fused_experts(mod):
            whole = _nbytes(list(mod.parameters()) + list(mod.buffers()))
            E = mod.num_experts if isinstance(mod, Experts) else mod.gate_up_proj.shape[0]
            n = active if active is not None and batch else E * (1 - (1 - 1 / E) ** (batch * k)) if batch else E
            total += whole * n / E - whole
    return int(total + batch * emb.shape[1] * emb.element_size())


class ExpertCounter:
    """During an eager prefill of `batch` sequences of equal length: per MoE layer and prompt position, the distinct
    experts the batch's tokens at that position choose (what one decode step of that batch reads under the model's
    own routing); mean() over positions and layers, None for a model without MoE layers."""

    def __init__(self, model, batch: int):
        self.batch, self.counts = batch, []
        self.hooks = [m.register_forward_pre_hook(self._hook, with_kwargs=True) for m in model.modules()
                      if isinstance(m, Experts) or is_fused_experts(m)]

    def _hook(self, mod, args, kwargs):
        idx = args[1] if len(args) > 1 else kwargs["top_k_index"]
        k = idx.shape[-1]
        s = idx.reshape(self.batch, -1, k).transpose(0, 1).reshape(-1, self.batch * k).sort(-1).values
        self.counts.append((1 + (s[:, 1:] != s[:, :-1]).sum(-1)).float().mean())

    def mean(self):
        for h in self.hooks:
            h.remove()
        return float(torch.stack(self.counts).mean()) if self.counts else None


def kv_bytes(config, batch: int, kv_len: float, elem: int) -> float:
    return 2 * config.num_hidden_layers * batch * config.num_key_value_heads * config.head_dim * kv_len * elem


def _bandwidths(device) -> tuple:
    """(copy rate (read + write), read rate) in bytes/s of this device: llmkernels.bench.ceilings on CUDA; on the
    CPU a 64 MiB copy for both."""
    if device.type == "cuda":
        from ..bench.ceilings import copy_bandwidth, read_bandwidth
        return copy_bandwidth(), read_bandwidth()
    src = torch.rand(16 << 20)
    dst = torch.empty_like(src)
    t0 = time.perf_counter()
    for _ in range(5):
        dst.copy_(src)
    rate = 2 * 5 * src.numel() * 4 / (time.perf_counter() - t0)
    return rate, rate


def _timed(dec: StaticDecoder, steps: int, device) -> float:
    """ms per decode step over `steps` steps (after the caller's warm-up)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            dec.step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / steps
    t0 = time.perf_counter()
    for _ in range(steps):
        dec.step()
    return (time.perf_counter() - t0) * 1e3 / steps


def run_batch(model, name: str, fmt: str, batch: int, args, device, read_bps: float, log) -> list:
    """Prefill, then eager steps and (CUDA) graph steps at one batch size: (shape, ms, bytes, extra) per mode."""
    graph = device.type == "cuda" and not args.no_graph
    warm = 2
    max_len = args.prompt_len + 4 + 2 * warm + args.eager_steps + (args.steps if graph else 0)
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    dec = StaticDecoder(model, batch, max_len, graph=False, compile=args.compile or False)
    prompt = torch.randint(0, model.config.vocab_size, (batch, args.prompt_len), device=device)
    counter = ExpertCounter(model, batch)
    dec.prefill(prompt)
    active = counter.mean()
    modes = [(False, args.eager_steps)] + ([(True, args.steps)] if graph else [])
    out = []
    for use_graph, steps in modes:
        dec.graph = use_graph
        try:
            for _ in range(warm):  # the first graph step captures the graph
                dec.step()
            kv0 = dec.length + 1  # valid cache positions read by the next step
            ms = _timed(dec, steps, device)
        except Exception as e:  # a failed capture must not lose the eager records
            log(f"[e2e] {name} {fmt} batch={batch} graph={use_graph} failed: {type(e).__name__}: {e}")
            if device.type == "cuda":
                torch.cuda.synchronize()
            continue
        kv_mean = kv0 + (steps - 1) / 2
        elem = model.get_input_embeddings().weight.element_size()
        nbytes = read_bytes(model, batch, active) + kv_bytes(model.config, batch, kv_mean, elem)
        shape = {"model": name, "batch": batch, "format": fmt, "graph": use_graph}
        if args.compile:
            shape["compile"] = args.compile
        out.append((shape, ms, nbytes, {"context": kv_mean, "timing": "graph" if use_graph else "eager",
                                        **({"active_experts": active} if active is not None else {})}))
        log(f"[e2e] {name} {fmt} batch={batch} graph={use_graph} compile={args.compile}: {ms:.3f} ms/step"
            f", {batch * 1e3 / ms:.1f} tok/s, "
            f"{100 * nbytes / read_bps / (ms * 1e-3):.1f} % of floor")
    peak = torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else None
    for _, _, _, extra in out:
        extra["peak_mem_gb"] = peak
    del dec
    return out


def _records(timed, bps: tuple, gemm: float, device, commit: str, args, model_info: dict) -> list:
    import transformers
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    date = datetime.date.today().isoformat()
    recs = []
    for shape, ms, nbytes, extra in timed:
        floor_ms = nbytes / bps[1] * 1e3  # the step reads its bytes (its writes, a cache row a layer, are few)
        recs.append({
            "op": "e2e_decode", "impl": "llmkernels", "shape": shape, "ms": ms, "floor_ms": floor_ms,
            "pct_of_floor": 100.0 * floor_ms / ms, "tflops": None, "gbps": nbytes / (ms * 1e-3) / 1e9,
            "bound": "memory", "timing": extra["timing"], "copy_tbps": bps[0] / 1e12,
            "read_tbps": bps[1] / 1e12, "gemm_tflops": gemm,
            "device": name, "torch": torch.__version__, "triton": triton.__version__, "date": date,
            "commit": commit, "tokens_per_s": shape["batch"] * 1e3 / ms, "peak_mem_gb": extra["peak_mem_gb"],
            "bytes_per_step": nbytes, "context": extra["context"], "prompt_len": args.prompt_len,
            "transformers": transformers.__version__, **model_info[(shape["model"], shape["format"])]})
    return recs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmkernels.hf.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=[*MODELS, "all"], help="'all' (default): the 8B and the 70B")
    ap.add_argument("--batches", help="default 1,4,16")
    ap.add_argument("--formats", default="bf16,nvfp4", help="bf16 is skipped where it does not fit")
    ap.add_argument("--prompt-len", type=int, help="default 512")
    ap.add_argument("--steps", type=int, help="timed CUDA-graph steps (default 64)")
    ap.add_argument("--eager-steps", type=int, help="default 8")
    ap.add_argument("--no-graph", action="store_true")
    ap.add_argument("--compile", nargs="?", const="inductor", default=None,
                    help="the decode step under torch.compile (default backend inductor); records gain shape key "
                         "'compile'")
    ap.add_argument("--quick", action="store_true", help="defaults: the tiny model, batches 1 and 2, a few steps")
    ap.add_argument("--out", default=None, help="merge records into OUT/<device>.json")
    args = ap.parse_args(argv)
    defaults = (dict(model="tiny", batches="1,2", prompt_len=8, steps=2, eager_steps=1) if args.quick else
                dict(model="all", batches="1,4,16", prompt_len=512, steps=64, eager_steps=8))
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    from ..bench.harness import _git_commit, merge_records
    from ..bench.report import device_slug
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    names = list(DEFAULT_MODELS) if args.model == "all" else [args.model]
    batches = [int(b) for b in args.batches.split(",")]
    formats = args.formats.split(",")
    if not set(formats) <= {"bf16", "nvfp4"}:
        ap.error(f"--formats takes bf16 and/or nvfp4, got {args.formats!r}")
    # fp16 on the CPU: the Triton interpreter's bf16 dot is wrong (nvfp4_linear refuses it there)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    dense = "bf16" if dtype == torch.bfloat16 else "fp16"  # the record's format of the unquantized model
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    bps = _bandwidths(device)
    log(f"[e2e] {device}: copy {bps[0] / 1e12:.3f} TB/s, read {bps[1] / 1e12:.3f} TB/s")
    timed, model_info = [], {}
    for name in names:
        direct = name in DIRECT_NVFP4
        todo = [f for f in ("bf16", "nvfp4") if f in formats]  # bf16 first: nvfp4 may be its quantize_
        if direct and "bf16" in todo:
            log(f"[e2e] {name}: bf16 skipped (about {_bf16_gb(name):.0f} GB of weights does not fit)")
            todo.remove("bf16")
        model = None
        for fmt in todo:
            t0 = time.perf_counter()
            if model is None:
                model = build(name, device, dtype, direct_nvfp4=direct)
            if fmt == "nvfp4" and not any(isinstance(m, NVFP4Linear) for m in model.modules()):
                quantize_(model)
            wbytes = read_bytes(model, 0)
            fmt = dense if fmt == "bf16" else fmt
            model_info[(name, fmt)] = {"weights_gb": wbytes / 1e9}
            log(f"[e2e] {name} {fmt}: weights {wbytes / 1e9:.2f} GB, ready in {time.perf_counter() - t0:.1f} s")
            for b in batches:
                try:
                    timed += run_batch(model, name, fmt, b, args, device, bps[1], log)
                except Exception as e:  # out of memory, ...: keep the other configurations' records
                    log(f"[e2e] {name} {fmt} batch={b} failed: {type(e).__name__}: {str(e)[:300]}")
                    traceback.print_exc()
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    gemm = None
    if device.type == "cuda":  # after the decode timings: the GEMM ceiling runs at the power cap
        from ..bench.ceilings import gemm_rate
        gemm = gemm_rate() / 1e12
    recs = _records(timed, bps, gemm, device, _git_commit(), args, model_info)
    for r in recs:
        s, peak = r["shape"], r["peak_mem_gb"]
        print(f"{s['model']:<22} {s['format']:<6} B={s['batch']:<3} graph={str(s['graph']):<5} "
              f"{'compile=' + s['compile'] + ' ' if 'compile' in s else ''}"
              f"{r['ms']:9.3f} ms/step {r['tokens_per_s']:9.1f} tok/s {r['pct_of_floor']:6.1f} % of floor"
              + ("" if peak is None else f"  peak {peak:.1f} GB"))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        slug = device_slug(recs[0]["device"]) if recs else "none"
        path = os.path.join(args.out, f"{slug}.json")
        merged = merge_records(path, recs)
        log(f"[e2e] records: {path} ({len(recs)} new, {len(merged)} in file)")
    return 0 if recs else 1


def _bf16_gb(name: str) -> float:
    c = MODELS[name]
    h, i, L, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    if "num_experts" in c:  # every layer sparse: E experts of moe_intermediate_size
        i = c["num_experts"] * c["moe_intermediate_size"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    return 2 * (L * (2 * h * q + 2 * h * kv + 3 * h * i) + 2 * v * h) / 1e9


if __name__ == "__main__":
    sys.exit(main())
