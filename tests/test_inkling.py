"""Inkling (transformers' InklingForCausalLM) through llmkernels.hf.patch_attention: decode on inkling_decode, prefill
on FlexAttention with the compact bias, against transformers' own eager path. A tiny random text model with a
sliding and a full layer (window 8 and rel_extent 16, both shorter than the contexts), the log-position temperature
on, dense MLPs (an expert router's host-side expert loop would keep the decode step out of a CUDA graph); fp32, so
greedy tokens must match exactly and logits within fp32 rounding of the softmax and products (1e-4 of the largest)."""
import pytest
import torch
from conftest import import_extra

transformers = import_extra("transformers", "hf")
pytest.importorskip("transformers.models.inkling", reason="transformers without Inkling (5.17+)")

import llmkernels.hf.inkling as ink  # noqa: E402
from llmkernels.hf import StaticDecoder, patch_attention, unpatch_attention  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TINY = dict(vocab_size=128, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, swa_num_attention_heads=4, swa_num_key_value_heads=1, swa_head_dim=64, sliding_window_size=8,
            d_rel=4, rel_extent=16, log_scaling_n_floor=4, layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding"],
            mlp_layer_types=["dense"] * 3, intermediate_size=96, pad_token_id=0, initializer_range=0.2)


def _model(dtype=torch.float32, attn="eager", **over):
    from transformers.models.inkling.configuration_inkling import InklingTextConfig
    torch.manual_seed(0)
    cfg = InklingTextConfig(**dict(TINY, **over))
    cfg._attn_implementation = attn
    model = transformers.InklingForCausalLM(cfg).to(DEV, dtype).eval()
    model.generation_config.eos_token_id = None  # every step runs
    return model


def _ids(B=2, T=21):
    return torch.randint(1, 128, (B, T), generator=torch.Generator().manual_seed(1)).to(DEV)


def _close(out, ref, tol=1e-4):
    err, scale = (out - ref).abs().max().item(), ref.abs().max().item()
    assert err <= tol * scale, f"max |diff| {err:.3e} > {tol} * max |ref| {scale:.3e}"


@pytest.fixture
def counted(monkeypatch):
    """How often the patched layers ran each path."""
    calls = {"prefill": 0, "decode": 0}
    for name, key in (("_prefill", "prefill"), ("inkling_decode", "decode")):
        orig = getattr(ink, name)

        def wrap(*a, _o=orig, _k=key, **k):
            calls[_k] += 1
            return _o(*a, **k)
        monkeypatch.setattr(ink, name, wrap)
    return calls


@torch.no_grad()
def test_prefill_and_greedy_decode_match_transformers(counted):
    model, ids = _model(), _ids()
    ref = model(ids).logits
    gen_ref = model.generate(ids, max_new_tokens=16, do_sample=False, output_logits=True, return_dict_in_generate=True)
    names = patch_attention(model)
    assert names == [f"model.layers.{i}.self_attn" for i in range(3)] and patch_attention(model) == names
    _close(model(ids).logits, ref)
    gen = model.generate(ids, max_new_tokens=16, do_sample=False, output_logits=True, return_dict_in_generate=True)
    assert torch.equal(gen.sequences, gen_ref.sequences)
    _close(torch.stack(gen.logits), torch.stack(gen_ref.logits))
    assert counted == {"prefill": 6, "decode": 45}  # two prefills of 3 layers; 15 decode steps of 3
    assert unpatch_attention(model) == names and unpatch_attention(model) == []
    assert torch.equal(model(ids).logits, ref)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@torch.no_grad()
def test_left_padded_generate(attn):
    """Left padding: the pad keys are skipped (starts from transformers' mask) in decode, masked in prefill."""
    model, ids = _model(attn=attn), _ids()
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    patch_attention(model)
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False), ref)


@torch.no_grad()
def test_static_decoder_matches_generate():
    model, ids = _model(), _ids()
    ref = model.generate(ids, max_new_tokens=16, do_sample=False)
    patch_attention(model)
    dec = StaticDecoder(model, batch=2, max_len=48, graph=DEV == "cuda")
    assert torch.equal(dec.generate(ids, 16), ref)
    assert {type(la).__name__ for la in dec.cache.layers} == {"LinearAttentionAndStaticFullAttentionLayer"}


@torch.no_grad()
def test_errors():
    model = _model()
    with pytest.raises(ValueError, match="no attention module llmkernels knows"):
        patch_attention(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    with pytest.raises(ValueError, match="head_dim=48"):
        patch_attention(_model(head_dim=48, swa_head_dim=48))
    patch_attention(model)
    ids = _ids()
    holes = torch.ones_like(ids)
    holes[0, 3] = 0  # a hidden key between visible ones: not left padding
    with pytest.raises(ValueError, match="only left padding"):
        model.generate(ids, attention_mask=holes, max_new_tokens=2, do_sample=False)
    model.train()
    with torch.enable_grad(), pytest.raises(ValueError, match="for inference"):
        model(ids)


@pytest.mark.gpu
@torch.no_grad()
def test_gpu_bf16_static_decoder_graph():
    """bf16: logits near transformers' fp32 eager path on the same weights (bf16 rounding through 3 layers), and the
    graph-replayed StaticDecoder emits the tokens of the patched model's own generate; compile is refused on CUDA
    (inductor failed to lower the step on torch 2.11: a clear error, not its traceback)."""
    model, ids = _model(torch.bfloat16), _ids(T=40)
    ref = model.float()(ids).logits
    model.bfloat16()
    patch_attention(model)
    _close(model(ids).logits.float(), ref, tol=3e-2)
    want = model.generate(ids, max_new_tokens=24, do_sample=False)
    dec = StaticDecoder(model, batch=2, max_len=80, graph=True)
    assert torch.equal(dec.generate(ids, 24), want)
    with pytest.raises(ValueError, match="compile is not supported for a patched Inkling"):
        StaticDecoder(model, batch=2, max_len=80, compile=True)
