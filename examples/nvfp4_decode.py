"""Run an NVFP4 checkpoint with llmkernels: load it into transformers, then decode greedily.

    python examples/nvfp4_decode.py --checkpoint DIR --prompt "The capital of France is"   # a real checkpoint
    python examples/nvfp4_decode.py                # no checkpoint: make one from a random Llama, then run it
    python examples/nvfp4_decode.py --moe          # ... from a random Qwen3-MoE (a GPU: minutes on the CPU)

DIR is a ModelOpt or compressed-tensors NVFP4 export (config.json, safetensors, and a tokenizer for text).
Without --checkpoint the script builds a random Llama (Llama-3.1-8B-shaped on a GPU, a tiny one on the CPU, where
the kernels run through the Triton interpreter), or with --moe a Qwen3-MoE (Qwen3-30B-A3B-shaped on a GPU, a tiny one
on the CPU), quantizes it with quantize_, writes it with save_nvfp4 and loads it back with load_nvfp4: the same path
a downloaded checkpoint takes (a MoE checkpoint holds one NVFP4 linear per expert and projection, as ModelOpt and
llm-compressor write them; its decode steps run the grouped expert kernel, routing on the device).
"""
import argparse
import os
import tempfile
import time

import torch

from llmkernels.hf import StaticDecoder, load_nvfp4, quantize_, save_nvfp4
from llmkernels.hf.bench import build


def make_checkpoint(path: str, name: str, device, dtype, fmt: str) -> None:
    model = build(name, device, dtype, direct_nvfp4=False)  # random bf16 weights
    quantize_(model)                                       # every nn.Linear but lm_head -> NVFP4Linear
    save_nvfp4(model, path, format=fmt)
    del model


def positive_int(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", help="an NVFP4 checkpoint directory (default: make one from random weights)")
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--new-tokens", type=positive_int, default=None,
                    help="tokens to generate (default 64 on a GPU, 4 on the CPU)")
    ap.add_argument("--format", default="modelopt", choices=["modelopt", "compressed-tensors"],
                    help="the format of the checkpoint made without --checkpoint")
    ap.add_argument("--moe", action="store_true", help="without --checkpoint: a mixture-of-experts model")
    ap.add_argument("--no-graph", action="store_true", help="decode eagerly instead of one CUDA graph per step")
    ap.add_argument("--compile", action="store_true",
                    help="the decode step under torch.compile (GPU; compiled on the first step: ~50 s for an 8B)")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float16  # the CPU interpreter's bf16 dot is wrong: fp16 there
    new_tokens = args.new_tokens if args.new_tokens is not None else (64 if cuda else 4)

    with tempfile.TemporaryDirectory() as tmp:
        path = args.checkpoint
        if path is None:
            path = os.path.join(tmp, "nvfp4")
            name = ("qwen3-30b-a3b-shaped" if cuda else "tiny-moe") if args.moe else \
                ("llama-3.1-8b-shaped" if cuda else "tiny")
            t0 = time.perf_counter()
            make_checkpoint(path, name, device, dtype, args.format)
            print(f"wrote a random {name} NVFP4 checkpoint ({args.format}) in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        model = load_nvfp4(path, device=device, dtype=dtype)
        print(f"loaded in {time.perf_counter() - t0:.1f} s" +
              (f", {torch.cuda.memory_allocated() / 1e9:.1f} GB on the GPU" if cuda else ""))

        tokenizer = None
        if os.path.exists(os.path.join(path, "tokenizer_config.json")):
            from transformers import AutoTokenizer
            tokenizer = AutoTokenizer.from_pretrained(path)
            ids = tokenizer(args.prompt, return_tensors="pt").input_ids
        else:  # random weights and no tokenizer: random token ids
            ids = torch.randint(0, model.config.vocab_size, (1, 16))

        dec = StaticDecoder(model, batch=1, max_len=ids.shape[1] + new_tokens + 1, graph=not args.no_graph,
                            compile=args.compile)
        dec.prefill(ids.to(device))
        dec.step()  # first step: compiles the kernels (and the step with --compile; captures the CUDA graph)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = dec.generate(ids, new_tokens)  # generate restarts from the prompt
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        print(f"{new_tokens} tokens in {dt:.2f} s ({new_tokens / dt:.1f} tokens/s, prefill included)")
        new = out[0, ids.shape[1]:].tolist()
        print(tokenizer.decode(new) if tokenizer is not None else f"token ids: {new}")


if __name__ == "__main__":
    main()
