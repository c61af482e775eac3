"""DeepSeek sparse attention models (DeepSeek-V3.2, GLM-5) in transformers through llmkernels.hf.patch_attention:
absorbed MLA on sparse_mla over a latent cache, the indexer's running top-k, against transformers' own eager path.
Tiny random models (kv_lora_rank 512 + rope 64, the kernel's row; index_topk smaller than the sequence). Whole-model
comparisons use dense MLP layers: an expert router's discrete choice flips between DTYPE and the fp32 reference on a
near-tie and moves the logits by O(1); attention in MoE layers is compared module by module
(test_attention_in_moe_layers)."""
import copy
import inspect

import pytest
import torch
from conftest import import_extra

transformers = import_extra("transformers", "hf")

from llmkernels.hf import dsa, patch_attention, unpatch_attention  # noqa: E402

CUDA = torch.cuda.is_available()
DTYPE = torch.bfloat16 if CUDA else torch.float16  # the CPU interpreter multiplies bf16 wrongly: fp16 there
ROUND = 2.0 ** -8 if DTYPE == torch.bfloat16 else 2.0 ** -11
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4, num_experts_per_tok=2,
            n_shared_experts=1, first_k_dense_replace=2, q_lora_rank=48, kv_lora_rank=512, qk_rope_head_dim=64,
            qk_nope_head_dim=32, v_head_dim=32, index_n_heads=4, index_head_dim=128, index_topk=8,
            max_position_embeddings=256, n_group=1, topk_group=1, attn_implementation="eager")


def _model(device, arch="DeepseekV32", **over):
    cfg = getattr(transformers, arch + "Config")(**dict(TINY, **over))
    model = getattr(transformers, arch + "ForCausalLM")(cfg).to(device, DTYPE).eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0  # generate runs every step
    with torch.no_grad():
        for n, p in model.named_parameters():
            if not n.endswith("norm.weight") and p.dim() > 1:
                p.normal_(0, 0.1)
    return model


@pytest.fixture
def recorded(monkeypatch):
    """Every indexer_topk result of the patched model, per layer, in call order."""
    calls = {}
    orig = dsa.indexer_topk

    def record(indexer, *a, **k):
        out = orig(indexer, *a, **k)
        calls.setdefault(indexer.layer_idx, []).append(out.clone())
        return out
    monkeypatch.setattr(dsa, "indexer_topk", record)
    return calls


def _eager_fp32(model, selections):
    """transformers' eager path in fp32 on the model's weights, each indexer forced to return the selections the
    patched model made (so both attend to the same keys; a -1 becomes a repeat of the row's largest index)."""
    ref = copy.deepcopy(model).float()
    unpatch_attention(ref)
    for mod in ref.modules():
        if type(mod).__name__.endswith("Indexer") and mod.layer_idx in selections:
            queue = [torch.where(s >= 0, s, s.amax(-1, keepdim=True)) for s in selections[mod.layer_idx]]
            mod.forward = lambda *a, _q=queue, **k: _q.pop(0)
    return ref


def _logits(model, ids, **kw):
    with torch.no_grad():
        return model(ids, **kw).logits.float()


# Tolerance: the patched model runs in DTYPE (absorbed weights, sparse_mla's fp32 softmax) against the fp32 eager path
# on the same weights and keys; through 2 layers its logits land within 1e-3 of the largest one in fp16 (~2 ROUND,
# CPU runs), so 20 ROUND leaves margin while a wrong absorption, scale or key set moves them by O(1) of it. (The
# eager path in fp16 itself lands 4e-2 off fp32 here: its softmax and products round in fp16.)
def _close(out, ref, tol=20 * ROUND):
    err, scale = (out - ref).abs().max().item(), ref.abs().max().item()
    assert err <= tol * scale, f"max |diff| {err:.3e} > {tol} * max |ref| {scale:.3e}"


@pytest.mark.parametrize("arch, over", [("DeepseekV32", {}),
                                        ("GlmMoeDsa", dict(indexer_types=["full", "shared"]))])
def test_prefill_matches_eager(device, recorded, arch, over):
    model = _model(device, arch, **over)
    ids = torch.randint(0, TINY["vocab_size"], (2, 21), device=device)
    names = patch_attention(model)
    assert names == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    assert patch_attention(model) == names  # idempotent
    ours = _logits(model, ids)
    assert sorted(recorded) == ([0] if over else [0, 1])  # a shared layer reuses the previous full layer's top-k
    assert all(s.shape == (2, 21, 8) for calls in recorded.values() for s in calls)
    assert (recorded[0][-1][:, :7] == -1).any() and (recorded[0][-1][:, 8:] >= 0).all()  # < 8 keys early on
    _close(ours, _logits(_eager_fp32(model, dict(recorded)), ids))
    assert unpatch_attention(model) == names and unpatch_attention(model) == []


def _indexer_inputs(device, arch, B, S):
    """Layer 0's attention of a tiny model and its indexer's inputs for random hidden states at positions 0..S-1:
    (attn, x, pos, (cos, sin), q_resid)."""
    model = _model(device, arch)
    attn = model.model.layers[0].self_attn
    x = torch.randn(B, S, TINY["hidden_size"], device=device, dtype=DTYPE)
    pos = torch.arange(S, device=device)[None].expand(B, S)
    return attn, x, pos, model.model.rotary_emb(x, pos), attn.q_a_layernorm(attn.q_a_proj(x))


def _index_scores(indexer, x, q_resid, emb, valid):
    """transformers' index scores [B, S, T] (its DeepseekV32Indexer.forward up to the top-k), -inf where not valid."""
    B, S, _ = x.shape
    nh, hd, rope = indexer.n_heads, indexer.head_dim, indexer.qk_rope_head_dim
    q_rot, q_pass = indexer.wq_b(q_resid).view(B, S, nh, hd).split([rope, hd - rope], -1)
    k_rot, k_pass = indexer.k_norm(indexer.wk(x)).unsqueeze(2).split([rope, hd - rope], -1)
    q_rot, k_rot = dsa._fn(indexer, dsa.INDEXER_ROPE[type(indexer).__name__])(q_rot, k_rot, *emb, unsqueeze_dim=2)
    q, k = torch.cat([q_rot, q_pass], -1), torch.cat([k_rot, k_pass], -1).squeeze(2)
    scores = torch.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * indexer.softmax_scale)
    w = indexer.weights_proj(x).float() * nh ** -0.5
    return torch.matmul(w.unsqueeze(-2), scores).squeeze(-2).masked_fill(~valid, float("-inf"))


@pytest.mark.parametrize("arch", ["DeepseekV32", "GlmMoeDsa"])
@pytest.mark.parametrize("chunks", ["merged", "one"])
def test_indexer_matches_transformers(device, arch, chunks):
    """The running top-k picks keys whose scores are transformers' top-k scores, from the same inputs (merged: a small
    chunk_bytes, one query row at a time against 10-key chunks, so the running top-k merges; one: every row's keys
    in one chunk, taken by row_topk as decode rows are). Equal scores (several keys at 0, the ReLU's) may be broken
    differently: the selected scores are compared, and keys above the k-th."""
    B, S = 2, 19
    attn, x, pos, emb, q_resid = _indexer_inputs(device, arch, B, S)
    valid = torch.ones(S, S, dtype=torch.bool, device=device).tril()[None].expand(B, S, S).clone()
    valid[1, :, :3] = False  # the second sequence left-padded by 3
    theirs = attn.indexer(x, q_resid, emb, valid, pos)
    ours = dsa.indexer_topk(attn.indexer, x, q_resid, emb, valid,
                            chunk_bytes=4 * B * 10 if chunks == "merged" else dsa.CHUNK_BYTES)
    scores = _index_scores(attn.indexer, x, q_resid, emb, valid)
    for b in range(B):
        for s in range(S):
            n = min(int(valid[b, s].sum()), 8)
            mine = ours[b, s][ours[b, s] >= 0].long()
            assert mine.numel() == n and (ours[b, s] >= -1).all(), (b, s)  # -1s anywhere in the row
            if n:
                want = scores[b, s, theirs[b, s, :n].long()]
                assert torch.equal(scores[b, s, mine].sort().values, want.sort().values), (b, s)
                above = (scores[b, s] > want.min()).nonzero().flatten()
                assert set(above.tolist()) <= set(mine.tolist()), (b, s)


@pytest.mark.parametrize("arch, over", [("DeepseekV32", {}),
                                        ("GlmMoeDsa", dict(indexer_types=["full", "shared"]))])
def test_greedy_decode_matches_eager(device, recorded, arch, over):
    """generate (a DynamicCache holding the latent rows): the fp32 eager path, fed the same tokens one step at a time
    with the same keys each step (a step's top-k may break a tie at score 0 otherwise than a full prefill would),
    gives logits within the tolerance, and every new token is their argmax (or within the tolerance of it)."""
    model = _model(device, arch, **over)
    ids = torch.randint(0, TINY["vocab_size"], (1, 12), device=device)
    patch_attention(model)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
                         output_logits=True, return_dict_in_generate=True)
    ours = torch.stack([g[0].float() for g in out.logits])  # [16, V]
    assert len(recorded[0]) == 16 and recorded[0][1].shape == (1, 1, 8)  # the prompt, then one call a new token
    ref_model = _eager_fp32(model, dict(recorded))
    name = "cache" if "cache" in inspect.signature(ref_model.forward).parameters else "past_key_values"  # 5.2x
    cache = transformers.DynamicCache(config=ref_model.config)
    ref, step = [], ids
    with torch.no_grad():
        for t in range(16):
            ref.append(ref_model(step, **{name: cache}).logits[0, -1].float())
            step = out.sequences[:, 12 + t:13 + t]
    ref = torch.stack(ref)
    _close(ours, ref)
    new = out.sequences[0, 12:]
    picked = ref.gather(-1, new[:, None].long()).squeeze(-1)
    assert (picked >= ref.amax(-1) - 20 * ROUND * ref.abs().max()).all()
    cache = transformers.DynamicCache(config=model.config)
    model(ids, **{name: cache})
    assert cache.layers[0].keys.shape[1:] == (1, 12, 576) and cache.layers[0].values.shape[-1] == 0  # latent rows


@pytest.mark.parametrize("arch", ["DeepseekV32", "GlmMoeDsa"])
def test_attention_in_moe_layers(device, recorded, arch):
    """The attention of an MoE layer (3 layers, experts from layer 1), on the same hidden states, positions and
    cache, against the eager fp32 attention on the same keys."""
    model = _model(device, arch, num_hidden_layers=3, first_k_dense_replace=1)
    attn = model.model.layers[2].self_attn
    assert type(model.model.layers[2].mlp).__name__.endswith("MoE")
    B, S = 2, 17
    x = torch.randn(B, S, TINY["hidden_size"], device=device, dtype=DTYPE)
    pos = torch.arange(S, device=device)[None].expand(B, S)
    emb = model.model.rotary_emb(x, pos)
    mask = torch.full((S, S), torch.finfo(DTYPE).min, device=device, dtype=DTYPE).triu(1)[None, None].expand(B, 1, S, S)
    patch_attention(model)
    ours = attn(x, emb, mask.clone())[0].float()
    ref_model = _eager_fp32(model, dict(recorded))
    ref_attn = ref_model.model.layers[2].self_attn
    ref = ref_attn(x.float(), tuple(e.float() for e in emb), mask.float().clamp_min(torch.finfo(torch.float32).min))
    _close(ours, ref[0].float())


def _grads(model, names):
    return {n: p.grad.float() for n, p in model.named_parameters() if any(k in n for k in names)}


def test_training_matches_eager(device, recorded):
    """Gradients of every attention parameter through sparse_mla's backward (indexer aside) against the fp32 eager
    path on the same keys: within 0.2 % (fp16, CPU runs); 20 ROUND leaves 5x."""
    model = _model(device).train()
    ids = torch.randint(0, TINY["vocab_size"], (2, 21), device=device)
    patch_attention(model)
    model(ids).logits.float().logsumexp(-1).mean().backward()
    ref = _eager_fp32(model, dict(recorded)).train()
    ref.zero_grad()
    ref(ids).logits.float().logsumexp(-1).mean().backward()
    attn = ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj")
    ours, theirs = _grads(model, attn), _grads(ref, attn)
    assert len(ours) == 14
    for n in ours:
        _close(ours[n], theirs[n])
    assert all(p.grad is None for n, p in model.named_parameters() if ".indexer." in n)  # the LM loss: no indexer


@pytest.mark.parametrize("arch", ["DeepseekV32", "GlmMoeDsa"])
def test_indexer_loss(device, recorded, arch):
    """patch_attention(indexer_loss=True): each indexer layer's KL(main attention over its selected keys, summed over
    heads, L1-normalised || softmax of its scores there), summed over tokens, against the same objective from the fp32
    eager path's attention weights and transformers' index scores; its gradient reaches the indexer alone."""
    model = _model(device, arch).train()
    ids = torch.randint(0, TINY["vocab_size"], (2, 21), device=device)
    patch_attention(model, indexer_loss=True)
    model(ids)
    loss = dsa.indexer_loss(model)
    with pytest.raises(RuntimeError, match="no indexer loss to read"):
        dsa.indexer_loss(model)  # read once
    loss.backward()
    assert all(p.grad is None for n, p in model.named_parameters() if ".indexer." not in n)
    ref = _eager_fp32(model, dict(recorded)).train()
    seen = {}
    for i, layer in enumerate(ref.model.layers):
        layer.self_attn.register_forward_hook(lambda mod, a, kw, out, i=i: seen.__setitem__(i, (kw, out[1])),
                                              with_kwargs=True)
    ref(ids)
    want = 0
    for i, (kw, weights) in seen.items():
        attn = ref.model.layers[i].self_attn
        x, emb = kw["hidden_states"].detach(), kw["position_embeddings"]
        idx = recorded[i][0].long()
        p = weights.float().sum(1).gather(-1, idx.clamp_min(0)).masked_fill(idx < 0, 0)
        p = p / p.sum(-1, keepdim=True)
        valid = kw["attention_mask"][:, 0] == 0
        scores = _index_scores(attn.indexer, x, attn.q_a_layernorm(attn.q_a_proj(x)), emb, valid)
        logq = torch.log_softmax(scores.gather(-1, idx.clamp_min(0)).masked_fill(idx < 0, float("-inf")), -1)
        want = want + torch.where(p > 0, p * (p.log() - logq), torch.zeros_like(p)).sum()
    want.backward()
    assert abs(loss.item() - want.item()) <= 20 * ROUND * abs(want.item())
    # the indexer's gradients are not compared element-wise with the fp32 path: its ReLU kinks (scores near 0) flip
    # between fp16 and fp32 inputs (seen off by up to 40 % on some seeds); they are finite and nonzero
    grads = _grads(model, (".indexer.",))
    assert grads and all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads.values())


def test_patch_errors():
    with pytest.raises(ValueError, match="has no attention module llmkernels knows"):
        patch_attention(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    with pytest.raises(ValueError, match="kv_lora_rank=256"):
        patch_attention(_model("cpu", kv_lora_rank=256))
    with pytest.raises(TypeError, match="indexer_loss must be a bool"):
        patch_attention(_model("cpu"), indexer_loss=1)
    model = _model("cpu", attention_dropout=0.1).train()
    patch_attention(model)
    with pytest.raises(ValueError, match="attention_dropout=0.1"):
        model(torch.zeros(1, 3, dtype=torch.long))


@pytest.mark.parametrize("arch, over", [("DeepseekV32", {}),
                                        ("GlmMoeDsa", dict(indexer_types=["full", "shared"]))])
def test_static_decoder(device, arch, over):
    """StaticDecoder on a patched model (transformers' StaticCache of latent rows and indexer keys, the rows past the
    written ones never selected; one CUDA graph a step on the GPU, compiled there): the same tokens as generate on
    the same model, for two prompts of different lengths through one decoder (its cache reset between). 16 indexer
    heads: keys tied at score 0 (which a top-k over the static cache's longer rows may break otherwise) are rare."""
    from llmkernels.hf import StaticDecoder
    model = _model(device, arch, index_n_heads=16, **over)
    patch_attention(model)
    dec = StaticDecoder(model, batch=2, max_len=40, graph=CUDA, compile=CUDA)
    for n in (12, 5):
        ids = torch.randint(0, TINY["vocab_size"], (2, n), device=device)
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)
        out = dec.generate(ids, 10)
        if not torch.equal(out, ref.sequences):  # a GPU graph may round otherwise: then only at a near-tie
            logits = torch.stack(ref.logits, 1).float()  # [2, 10, V]
            t = (out[:, n:] != ref.sequences[:, n:]).any(0).nonzero()[0, 0].item()
            assert torch.equal(out[:, :n + t], ref.sequences[:, :n + t])
            top = logits[:, t].topk(2).values
            assert ((top[:, 0] - top[:, 1]) <= 20 * ROUND * logits.abs().max()).any(), t
    assert dec._counts is not None and dec._counts.numel() == (2 * 2 if arch == "DeepseekV32" else 2 + 1) + 1


def test_padded_batch(device):
    """generate on a left-padded batch: each sequence's logits and tokens as when it runs alone (the 4-d mask keeps
    the indexer off the padding; positions from the mask). 16 indexer heads: a key scores exactly 0 (a tie the
    top-k may break either way, moving the logits by O(1)) only where all 16 ReLUs are 0."""
    model = _model(device, index_n_heads=16)
    patch_attention(model)
    a = torch.randint(1, TINY["vocab_size"], (1, 12), device=device)
    b = torch.randint(1, TINY["vocab_size"], (1, 7), device=device)
    ids = torch.cat([a, torch.cat([torch.zeros(1, 5, dtype=torch.long, device=device), b], 1)])
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    kw = dict(max_new_tokens=8, do_sample=False, output_logits=True, return_dict_in_generate=True)
    out = model.generate(ids, attention_mask=mask, **kw)
    for row, alone in ((0, a), (1, b)):
        seq = torch.cat([alone, out.sequences[row:row + 1, 12:]], 1)  # its prompt and the batch's new tokens
        ref = _logits(model, seq)[0, alone.shape[1] - 1:-1]  # [8, V]: the logits each new token was picked from
        ours = torch.stack(out.logits)[:, row].float()
        _close(ours, ref)
        picked = ref.gather(-1, out.sequences[row, 12:, None]).squeeze(-1)
        assert (picked >= ref.amax(-1) - 20 * ROUND * ref.abs().max()).all()


def test_nvfp4_composes(device, recorded, monkeypatch):
    """quantize_ then patch_attention (kv_b_proj NVFP4: its dequantized weight absorbed once, refreshed when the
    weight changes): logits as the same model with each NVFP4Linear replaced by an nn.Linear of its dequantized
    weight, patched too (the linears' own rounding between: the tolerance above). The dense copy replays the NVFP4
    model's indexer selections: the two round differently, and a bf16 near-tie in a top-k flips a key (O(1) moves)."""
    from llmkernels.hf import quantize_
    from llmkernels.ops.nvfp4.format import nvfp4_dequantize
    model = quantize_(_model(device))
    dense = copy.deepcopy(model)
    for name, mod in list(dense.named_modules()):
        if type(mod).__name__ == "NVFP4Linear":
            lin = torch.nn.Linear(mod.in_features, mod.out_features, bias=False, device=device, dtype=DTYPE)
            lin.weight.data = nvfp4_dequantize(*mod.plain_weight(), mod.global_scale, dtype=DTYPE)
            dense.set_submodule(name, lin)
    assert type(model.model.layers[0].self_attn.kv_b_proj).__name__ == "NVFP4Linear"
    ids = torch.randint(0, TINY["vocab_size"], (2, 21), device=device)
    patch_attention(model)
    patch_attention(dense)
    out = _logits(model, ids)
    queues = {layer: list(calls) for layer, calls in recorded.items()}
    monkeypatch.setattr(dsa, "indexer_topk", lambda indexer, *a, **k: queues[indexer.layer_idx].pop(0))
    _close(out, _logits(dense, ids))
    assert not any(queues.values())
    monkeypatch.undo()
    kv_b = model.model.layers[0].self_attn.kv_b_proj
    key = kv_b._llmk_dense[0]
    kv_b.set_weight(*(t.clone() for t in kv_b.plain_weight()))  # same values, new buffers: absorbed again
    _logits(model, ids)
    assert kv_b._llmk_dense[0] != key


def test_indexer_visible_by_position(device):
    """Without a mask (SDPA without padding, StaticDecoder), the keys a query sees come from its position, chunk by
    chunk, and key chunks past a query tile's last position are skipped: the same top-k as from the dense causal
    mask (one query row a tile, 10-key chunks), for positions given or implied."""
    B, S = 2, 23
    attn, x, pos, emb, q_resid = _indexer_inputs(device, "DeepseekV32", B, S)
    dense = torch.ones(S, S, dtype=torch.bool, device=device).tril()[None].expand(B, S, S)
    run = lambda valid: dsa.indexer_topk(attn.indexer, x, q_resid, emb, valid, chunk_bytes=4 * B * 10)  # noqa
    scores = _index_scores(attn.indexer, x, q_resid, emb, dense)
    # the scores of the picked keys, sorted: keys tied at 0 (the ReLU) may be picked otherwise by a top-k over other
    # columns (the skipped chunks), so the keys themselves are not compared
    picked = lambda sel: torch.where(sel >= 0, scores.gather(-1, sel.clamp_min(0).long()),  # noqa: E731
                                     float("-inf")).sort(-1).values
    want = picked(run(dense))
    assert torch.equal(picked(run(dsa.Visible(None, pos, S, S, device))), want)
    assert torch.equal(picked(run(dsa.Visible(None, None, S, S, device))), want)


def test_one_token_prompt(device, recorded):
    """A prompt of one token (the indexer sees one key; top-k 8 holds seven -1s), then 4 greedy steps: the fp32
    eager path on the same keys gives the same logits."""
    model = _model(device)
    ids = torch.randint(0, TINY["vocab_size"], (1, 1), device=device)
    patch_attention(model)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                         output_logits=True, return_dict_in_generate=True)
    assert (recorded[0][0] >= 0).sum() == 1
    ref_model = _eager_fp32(model, dict(recorded))
    name = "cache" if "cache" in inspect.signature(ref_model.forward).parameters else "past_key_values"
    cache, ref, step = transformers.DynamicCache(config=ref_model.config), [], ids
    with torch.no_grad():
        for t in range(4):
            ref.append(ref_model(step, **{name: cache}).logits[0, -1].float())
            step = out.sequences[:, 1 + t:2 + t]
    _close(torch.stack([g[0].float() for g in out.logits]), torch.stack(ref))


def test_visible_bounds_once_per_mask(monkeypatch, device):
    """The layers of one forward share transformers' mask: its per-row bounds are computed (one host sync) once, not
    per layer; a new mask, or the same one written in place, computes them again."""
    calls = []
    orig = torch.cummax
    monkeypatch.setattr(dsa.torch, "cummax", lambda *a, **k: calls.append(1) or orig(*a, **k))
    S = T = 12
    mask = torch.ones(1, 1, S, T, dtype=torch.bool, device=device).tril()
    want = [dsa.Visible(mask, None, S, T, device).last(s) for s in range(1, S + 1)]
    assert want == list(range(S)) and len(calls) == 1
    assert dsa.Visible(mask, None, S, T, device).last(S) == S - 1 and len(calls) == 1  # another layer: memo
    mask[..., 0] = False  # written in place: its version changed
    dsa.Visible(mask, None, S, T, device).last(S)
    assert len(calls) == 2
    dsa.Visible(mask.clone(), None, S, T, device).last(S)  # another tensor
    assert len(calls) == 3
