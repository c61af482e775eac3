"""Inkling (transformers' InklingForCausalLM) on llmkernels: patch a model, generate, decode with StaticDecoder.

    python examples/inkling_decode.py            # a tiny random Inkling text model (CPU: Triton interpreter)
    python examples/inkling_decode.py --big      # GPU: a small Inkling-shaped model (12 layers), a 4K prompt

patch_attention(model) routes every InklingAttention through llmkernels: decode steps on inkling_decode (the compact
relative bias and the sliding window read in the kernel), prefill on FlexAttention reading the compact bias. The
run checks the patched model's greedy tokens against transformers' own eager path, then decodes with StaticDecoder.
"""
import argparse
import time

import torch

from llmkernels.hf import StaticDecoder, patch_attention, unpatch_attention  # before transformers
import transformers
from transformers.models.inkling.configuration_inkling import InklingTextConfig

TINY = dict(vocab_size=256, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, swa_num_attention_heads=4, swa_num_key_value_heads=1, swa_head_dim=64, sliding_window_size=8,
            d_rel=4, rel_extent=16, log_scaling_n_floor=4, layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding"],
            intermediate_size=96, initializer_range=0.2)
SMALL = dict(vocab_size=32000, hidden_size=2048, num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=2,
             head_dim=128, swa_num_attention_heads=16, swa_num_key_value_heads=4, swa_head_dim=128,
             sliding_window_size=512, d_rel=16, rel_extent=1024, log_scaling_n_floor=4096, intermediate_size=5632)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--big", action="store_true", help="GPU: a small Inkling-shaped model and a 4K prompt")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    if args.big and not cuda:
        raise SystemExit("--big needs a CUDA GPU")
    kw = SMALL if args.big else TINY
    dtype = torch.bfloat16 if args.big else torch.float32
    cfg = InklingTextConfig(**kw, mlp_layer_types=["dense"] * kw["num_hidden_layers"])  # dense MLPs: attention only
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    device = "cuda" if cuda else "cpu"
    model = transformers.InklingForCausalLM(cfg).to(device, dtype).eval()
    model.generation_config.eos_token_id = None
    T, new = (4096, 64) if args.big else (24, 12)
    ids = torch.randint(1, cfg.vocab_size, (2, T), device=device)
    with torch.no_grad():
        want = None if args.big else model.generate(ids, max_new_tokens=new, do_sample=False)  # transformers' own
        print("patched:", patch_attention(model))
        got = model.generate(ids, max_new_tokens=new, do_sample=False)
        if want is not None:
            print("greedy tokens equal to transformers' eager path:", torch.equal(got, want))
        dec = StaticDecoder(model, batch=2, max_len=T + new + 1, graph=cuda)
        t0 = time.perf_counter()
        out = dec.generate(ids, new)
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        print(f"StaticDecoder ({'CUDA graphs' if cuda else 'eager, CPU'}): {new} tokens x 2 sequences in {dt:.2f} s "
              f"(prefill included); tokens equal to generate's: {torch.equal(out, got)}")
    unpatch_attention(model)


if __name__ == "__main__":
    main()
