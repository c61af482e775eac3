"""DeepSeek sparse attention (DeepSeek-V3.2, GLM-5) in transformers on llmkernels: patch a model, decode, train.

    python examples/dsa_decode.py                       # a tiny random DeepSeek-V3.2 (CPU: Triton interpreter)
    python examples/dsa_decode.py --arch GlmMoeDsa      # GLM-5's attention (shared-indexer layers)
    python examples/dsa_decode.py --big                 # GPU: V3.2's attention width, 2 layers, a 4K prompt

patch_attention(model) routes every DSA attention module through sparse_mla (absorbed MLA over a latent cache, the
indexer's running top-k); transformers' generate and llmkernels' StaticDecoder then decode with it, and a training
forward can add the DSA indexer loss. The tiny run also checks the patched model's greedy tokens against
transformers' own eager path (they agree unless two logits nearly tie).
"""
import argparse
import time

import torch

from llmkernels.hf import StaticDecoder, indexer_loss, patch_attention, unpatch_attention  # before transformers
import transformers


def build(arch: str, big: bool, device, dtype):
    tiny = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=2, q_lora_rank=48, qk_nope_head_dim=32, v_head_dim=32, index_n_heads=16,
                index_head_dim=64, index_topk=16)
    v32 = dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432, num_hidden_layers=2,
               num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536, qk_nope_head_dim=128,
               v_head_dim=128, index_n_heads=64, index_head_dim=128, index_topk=2048)
    kw = dict(v32 if big else tiny, kv_lora_rank=512, qk_rope_head_dim=64, first_k_dense_replace=2,
              max_position_embeddings=163840)  # dense MLPs: the example is about attention
    if arch == "GlmMoeDsa":
        kw["indexer_types"] = ["full", "shared"]  # layer 1 reuses layer 0's top-k
    cfg = getattr(transformers, arch + "Config")(**kw)
    torch.manual_seed(0)
    with torch.device(device):
        model = getattr(transformers, arch + "ForCausalLM")(cfg).to(dtype).eval()
    model.generation_config.eos_token_id = None
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", choices=["DeepseekV32", "GlmMoeDsa"], default="DeepseekV32")
    ap.add_argument("--big", action="store_true", help="V3.2's attention sizes (a GPU)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float16  # the CPU (Triton interpreter) runs fp16
    model = build(args.arch, args.big, device, dtype)
    prompt = torch.randint(0, model.config.vocab_size, (1, 4096 if args.big else 24), device=device)
    new = 8
    if not args.big:  # transformers' own eager path first, for the comparison
        theirs = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, do_sample=False)
    print("patched:", patch_attention(model))
    ours = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, do_sample=False)
    print("generate:", ours[0, -new:].tolist())
    if not args.big:
        same = int((ours[0, -new:] == theirs[0, -new:]).cumprod(0).sum())
        print(f"transformers' eager path: {theirs[0, -new:].tolist()} ({same} of {new} leading tokens the same)")
    dec = StaticDecoder(model, batch=1, max_len=prompt.shape[1] + new + 1, graph=device == "cuda")
    t0 = time.perf_counter()
    out = dec.generate(prompt, new)
    print(f"StaticDecoder: {out[0, -new:].tolist()} ({time.perf_counter() - t0:.2f} s with the prefill)")
    # training: sparse_mla's backward, and the DSA indexer loss (sparse stage: KL on the selected keys, the
    # indexer's inputs detached, so it trains the indexers alone)
    unpatch_attention(model)
    patch_attention(model, indexer_loss=True)
    model.train()
    ids = prompt[:, :512]
    out = model(ids, labels=ids)
    loss = out.loss + indexer_loss(model)
    loss.backward()
    grads = sum(p.grad is not None for p in model.parameters())
    print(f"train step: lm loss {out.loss.item():.3f}, with the indexer loss {loss.item():.3f}; {grads} parameters "
          f"with gradients")


if __name__ == "__main__":
    main()
