"""kvpress's head-wise KV-cache compression decoding on llmkernels.masked_decode (the dropped tokens are never read).

    pip install -e ".[kvpress]"          # kvpress 0.5.5 (it installs transformers < 5.3)
    python examples/kvpress_decode.py    # a tiny random Llama (CPU: Triton interpreter; a GPU if there is one)

Runs AdaKVPress (KnormPress scores, half the cache dropped, per KV head) through kvpress's own path (fake keys),
through llmkernels.kvpress's generate adapter (masked_decode reading the press's kept tokens as lists, a
GrowingCache) and through PressDecoder (fixed buffers; one CUDA graph a step on a GPU), and prints all three.
"""
import sys

import torch

try:  # llmkernels first: on a CPU it sets up the Triton interpreter before anything imports triton
    from llmkernels.kvpress import GrowingCache, PressDecoder, masked_decode_attention
    from llmkernels.hf.fuse import fuse_projections
    import kvpress
except ImportError as e:
    print(f"this example needs kvpress ({e}): pip install -e \".[kvpress]\"")
    sys.exit(0)
import transformers


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float16  # the CPU (Triton interpreter) runs fp16
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    cfg._attn_implementation = "sdpa"  # kvpress's head-wise presses refuse eager
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(device, dtype).eval()
    model.generation_config.eos_token_id = None
    ids = torch.randint(0, cfg.vocab_size, (1, 64), device=device)
    press = kvpress.AdaKVPress(kvpress.KnormPress(compression_ratio=0.5))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    with press(model):
        theirs = model.generate(ids, **kw)
    with press(model), masked_decode_attention(model):
        ours = model.generate(ids, past_key_values=GrowingCache(config=model.config), **kw)
    _, _, kept_len, dense_from = model.model.layers[0].self_attn._llmk_kept
    print(f"layer 0's KV heads keep {kept_len.squeeze(0).tolist()} of the first {dense_from} cache tokens")
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad(), press(model):
        logits = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
    fuse_projections(model)  # q / k / v and gate / up as one GEMM each for the decoder's steps
    graphed = PressDecoder(model, cache, logits[:, -1].argmax(-1), max_new_tokens=8).generate(8)
    print("kvpress (fake keys):   ", theirs[0, 64:].tolist())
    print("llmkernels (generate): ", ours[0, 64:].tolist())
    print("llmkernels (decoder):  ", graphed[0].tolist())


if __name__ == "__main__":
    main()
