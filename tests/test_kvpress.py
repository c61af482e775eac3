"""llmkernels.kvpress: kvpress's head-wise presses decoding on masked_decode, against kvpress's own fake-key path on
the same model (tiny random Llama and Qwen3, kvpress 0.5.5 and the transformers it installs: .ci/run runs this file in
an environment of its own)."""
import pytest
import torch
from conftest import import_extra

kvpress = import_extra("kvpress", "kvpress")
import transformers  # noqa: E402

from llmkernels.kvpress import GrowingCache, PressDecoder, masked_decode_attention  # noqa: E402

CUDA = torch.cuda.is_available()
DTYPE = torch.bfloat16 if CUDA else torch.float16  # the CPU interpreter multiplies bf16 wrongly: fp16 there
ROUND = 2.0 ** -8 if DTYPE == torch.bfloat16 else 2.0 ** -11
PROMPT, NEW = 48, 8


def _model(device, arch="Llama", head_dim=64):
    kw = dict(vocab_size=128, hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=256)
    cfg = getattr(transformers, arch + "Config")(**kw)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = getattr(transformers, arch + "ForCausalLM")(cfg).to(device, DTYPE).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
    return model


def _presses(ratio):
    return {
        "AdaKV": lambda: kvpress.AdaKVPress(kvpress.KnormPress(compression_ratio=ratio)),
        "CriticalAdaKV": lambda: kvpress.CriticalAdaKVPress(kvpress.KnormPress(compression_ratio=ratio)),
        # evicts during decoding too: scores below the threshold leave once out of the 8-token window
        "DMS": lambda: kvpress.DMSPress(kvpress.RandomPress(seed=0), threshold=ratio, sliding_window_size=8,
                                        decoding=True),
    }


def _generate(model, ids, press=None, ours=False, mask=None, cache=None, lists=True):
    kw = dict(max_new_tokens=NEW, do_sample=False, output_logits=True, return_dict_in_generate=True,
              attention_mask=torch.ones_like(ids) if mask is None else mask, past_key_values=cache)
    with (press(model) if press is not None else _null()), \
            (masked_decode_attention(model, lists=lists) if ours else _null()):
        out = model.generate(ids, **kw)
    return out.sequences, torch.stack(out.logits, 1).float()  # [B, NEW, V]


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


# Tolerance: both paths compute the same attention (kvpress's fake keys get weight exp(-1e5 scale) = 0 exactly in
# the softmax); they differ by masked_decode's fp32 online softmax against SDPA's, a few DTYPE roundings of the
# logits through 2 layers (~1e-3 of the largest in fp16); 20 ROUND leaves margin while a wrong dropped set moves the
# logits by O(1) of the largest (see the no-press control).
def _close(out, ref, tol=20 * ROUND):
    err, scale = (out - ref).abs().max().item(), ref.abs().max().item()
    assert err <= tol * scale, f"max |diff| {err:.3e} > {tol} * max |ref| {scale:.3e}"


def _same_tokens(seq, ref_seq, ref_logits):
    """Equal, or first different where kvpress's own logits nearly tie (a rounding may pick either)."""
    if torch.equal(seq, ref_seq):
        return
    t = (seq[:, PROMPT:] != ref_seq[:, PROMPT:]).any(0).nonzero()[0, 0].item()
    top = ref_logits[:, t].topk(2).values
    assert ((top[:, 0] - top[:, 1]) <= 20 * ROUND * ref_logits.abs().max()).any(), t


@pytest.mark.parametrize("arch", ["Llama", "Qwen3"])
@pytest.mark.parametrize("name", ["AdaKV", "CriticalAdaKV", "DMS"])
@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75])
@pytest.mark.parametrize("lists", [True, False], ids=["lists", "mask"])
def test_matches_kvpress(device, arch, name, ratio, lists):
    model = _model(device, arch)
    # kvpress 0.5.5's CriticalAdaKVPress sums its head budgets over the batch (a topk past the row at batch 2)
    ids = torch.randint(1, 128, (1 if name == "CriticalAdaKV" else 2, PROMPT), device=device)
    press = _presses(ratio)[name]
    ref_seq, ref = _generate(model, ids, press())
    seq, ours = _generate(model, ids, press(), ours=True, cache=GrowingCache(config=model.config), lists=lists)
    _close(ours, ref)
    _same_tokens(seq, ref_seq, ref)
    _, plain = _generate(model, ids)
    assert (plain - ref).abs().max() > 40 * ROUND * ref.abs().max()  # the press changed the logits
    assert model.config._attn_implementation == "sdpa"  # restored


def test_drop_mask_is_the_press_indices(device):
    """After generate, each layer's drop mask holds exactly kvpress's (batch, head, position) indices, and its new
    tokens are kept; DMS's indices grow during decoding and the mask follows them."""
    model = _model(device)
    ids = torch.randint(1, 128, (2, PROMPT), device=device)
    for press in (_presses(0.5)["AdaKV"](), _presses(0.5)["DMS"]()):
        _generate(model, ids, lambda m: press(m), ours=True, lists=False)
        for layer in model.model.layers:
            attn = layer.self_attn
            built, final = attn._llmk_drop[0], attn.masked_key_indices  # DMS may add indices after the last step
            assert all(torch.equal(f[:len(x)], x) for f, x in zip(final, built))
            b, h, s = (t.to(device) for t in built)
            want = torch.zeros(2, 2, PROMPT + NEW - 1, dtype=torch.bool, device=device)
            want[b, h, s] = True
            assert torch.equal(attn._llmk_drop[1][:, :, :PROMPT + NEW - 1], want)
    assert int(want[:, :, PROMPT - 8:].sum()) > 0  # DMS evicted, while decoding, tokens its window held at prefill


def test_kept_lists_are_the_press_indices(device):
    """With lists (the default), each layer's kept lists hold exactly the positions below dense_from that kvpress's
    indices leave, each once, in order; later positions are the generated tokens (kept)."""
    model = _model(device)
    ids = torch.randint(1, 128, (2, PROMPT), device=device)
    for press in (_presses(0.5)["AdaKV"](), _presses(0.5)["DMS"]()):
        _generate(model, ids, lambda m: press(m), ours=True)
        for layer in model.model.layers:
            idx, kept_idx, kept_len, dense_from = layer.self_attn._llmk_kept
            assert PROMPT <= dense_from <= PROMPT + NEW - 1
            drop = torch.zeros(2, 2, dense_from, dtype=torch.bool, device=device)
            b, h, s = (t.to(device) for t in idx)
            drop[b, h, s] = True
            for bb in range(2):
                for hh in range(2):
                    got = kept_idx[bb, hh, :kept_len[bb, hh]]
                    assert torch.equal(got.long(), (~drop[bb, hh]).nonzero().flatten())


@pytest.mark.parametrize("padded, compact", [(False, False), (True, False), (False, True), (True, True)])
def test_press_decoder(device, padded, compact):
    """PressDecoder (fixed buffers, the kept lists built once; eager steps here, CUDA graphs on a GPU) decodes the
    tokens generate does under masked_decode_attention after the same press."""
    model = _model(device)
    ids = torch.randint(1, 128, (2, PROMPT), device=device)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :7] = 0
    press = _presses(0.5)["AdaKV"]
    ref_seq, ref = _generate(model, ids, press(), ours=True, mask=mask)
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad(), press()(model):
        logits = model(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                       past_key_values=cache, use_cache=True, logits_to_keep=1).logits
    dec = PressDecoder(model, cache, logits[:, -1].argmax(-1), max_new_tokens=NEW, attention_mask=mask,
                       compact=compact)
    width = dec.cache.layers[0].keys.shape[2] - NEW
    assert width < PROMPT if compact else width == PROMPT  # half the prompt dropped per head, some heads keep more
    seq = dec.generate(NEW)
    _same_tokens(torch.cat([ids, seq], 1), ref_seq, ref)
    assert dec.length == width + NEW - 1
    if padded == compact:  # q / k / v and gate / up stacked (hf.fuse_projections): generate's tokens again
        from llmkernels.hf.fuse import fuse_projections, unfuse_projections
        assert fuse_projections(model) == 2 * model.config.num_hidden_layers
        cache2 = transformers.DynamicCache(config=model.config)
        with torch.no_grad(), press()(model):
            logits2 = model(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                            past_key_values=cache2, use_cache=True, logits_to_keep=1).logits
        seq2 = PressDecoder(model, cache2, logits2[:, -1].argmax(-1), max_new_tokens=NEW, attention_mask=mask,
                            compact=compact).generate(NEW)
        unfuse_projections(model)
        _same_tokens(torch.cat([ids, seq2], 1), ref_seq, ref)
    with pytest.raises(RuntimeError, match="cache is full"):
        for _ in range(2):
            dec.step()
    with pytest.raises(ValueError, match="first must hold one token"):
        PressDecoder(model, cache, logits[:1, -1].argmax(-1), max_new_tokens=4)
    with pytest.raises(TypeError, match="compile must be"):
        PressDecoder(model, cache, logits[:, -1].argmax(-1), max_new_tokens=4, compile=1)


@pytest.mark.parametrize("compact", [False, True])
def test_press_decoder_compiled(device, compact):
    """PressDecoder(compile=True): the step's forward under torch.compile (inductor; CUDA graphs on a GPU) decodes
    the tokens of the uncompiled decoder after the same press and prefill."""
    model = _model(device)
    ids = torch.randint(1, 128, (2, PROMPT), device=device)
    press = _presses(0.5)["AdaKV"]
    runs = []
    for compile in (False, True):
        cache = transformers.DynamicCache(config=model.config)
        with torch.no_grad(), press()(model):
            logits = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        dec = PressDecoder(model, cache, logits[:, -1].argmax(-1), max_new_tokens=8, compact=compact,
                           compile=compile)
        runs.append(dec.generate(8))
    torch._dynamo.reset()
    assert torch.equal(runs[0], runs[1])


def test_ratio_zero_is_no_press(device):
    model = _model(device)
    ids = torch.randint(1, 128, (2, PROMPT), device=device)
    seq, ours = _generate(model, ids, lambda m: kvpress.AdaKVPress(kvpress.KnormPress(compression_ratio=0.0))(m),
                          ours=True)
    ref_seq, ref = _generate(model, ids)
    _close(ours, ref)
    _same_tokens(seq, ref_seq, ref)


def test_padded_batch_and_fallback(device):
    """A left-padded batch (the padding dropped with the press's tokens), and a head dim masked_decode does not
    take (32: kvpress's own path runs): both as kvpress."""
    model = _model(device)
    ids = torch.randint(1, 128, (2, PROMPT), device=device)
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    press = _presses(0.5)["AdaKV"]
    ref_seq, ref = _generate(model, ids, press(), mask=mask)
    seq, ours = _generate(model, ids, press(), ours=True, mask=mask)
    _close(ours, ref)
    _same_tokens(seq, ref_seq, ref)
    small = _model(device, head_dim=32)
    ref_seq, ref = _generate(small, ids, press())
    seq, ours = _generate(small, ids, press(), ours=True)
    assert torch.equal(seq, ref_seq) and torch.equal(ours, ref)


def test_errors():
    with pytest.raises(ValueError, match="takes a transformers model"):
        with masked_decode_attention(torch.nn.Linear(2, 2)):
            pass


def test_growing_cache(device):
    """GrowingCache: the same tokens and logits as a DynamicCache (kvpress's path and ours), a decode step writes in
    place (the buffers stay), a crop then an update overwrites past the crop, and a replaced tensor is re-buffered."""
    model = _model(device)
    ids = torch.randint(1, 128, (2, PROMPT), device=device)
    press = _presses(0.5)["AdaKV"]
    for ours in (False, True):
        ref_seq, ref = _generate(model, ids, press(), ours=ours)
        cache = GrowingCache(config=model.config)
        seq, out = _generate(model, ids, press(), ours=ours, cache=cache)
        assert torch.equal(seq, ref_seq) and torch.equal(out, ref)
    layer = cache.layers[0]
    buf, L = layer._kbuf, layer.keys.shape[-2]
    assert L == PROMPT + NEW - 1 and layer.keys.data_ptr() == buf.data_ptr()
    k, v = torch.randn_like(layer.keys[..., :1, :]), torch.randn_like(layer.values[..., :1, :])
    cache.crop(L - 3)
    keys, _ = layer.update(k, v)
    assert layer._kbuf is buf and keys.shape[-2] == L - 2 and torch.equal(keys[..., -1:, :], k)
    layer.keys, layer.values = layer.keys.clone(), layer.values.clone()  # as a pruning press assigns them
    keys, values = layer.update(k, v)
    assert layer._kbuf is not buf and keys.shape[-2] == L - 1 and torch.equal(values[..., -1:, :], v)
