"""NVFP4 mixture-of-experts checkpoints in transformers (llmkernels.hf.moe): tiny random Qwen3-MoE and Mixtral models,
quantized, saved in both producers' layouts (one quantized linear per expert and projection, under the original
checkpoints' names), loaded back with the experts kept NVFP4, against transformers' own model holding the dequantized
weights in its fused 3-D expert parameters."""
import os
import pickle

import pytest
import torch

from conftest import import_extra

transformers = import_extra("transformers", "hf")
import_extra("safetensors", "hf")
from safetensors.torch import load_file  # noqa: E402

from llmkernels import nvfp4_dequantize  # noqa: E402
from llmkernels.hf import StaticDecoder, load_nvfp4, quantize_, save_nvfp4  # noqa: E402
from llmkernels.hf.moe import Experts, ExpertMLP, unfuse_experts  # noqa: E402
from llmkernels.ops.nvfp4.op import NVFP4Linear  # noqa: E402

CUDA = torch.cuda.is_available()
DTYPE = torch.bfloat16 if CUDA else torch.float16  # the CPU interpreter multiplies bf16 wrongly
ROUND = 2.0 ** -8 if DTYPE == torch.bfloat16 else 2.0 ** -11
BASE = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)
ARCHS = {  # arch -> (config extras, checkpoint name of layer 0's expert 1 gate / up / down projections)
    "Qwen3Moe": (dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16),
                 ("model.layers.0.mlp.experts.1.gate_proj", "model.layers.0.mlp.experts.1.up_proj",
                  "model.layers.0.mlp.experts.1.down_proj")),
    "Mixtral": (dict(num_local_experts=4, num_experts_per_tok=2),
                ("model.layers.0.block_sparse_moe.experts.1.w1", "model.layers.0.block_sparse_moe.experts.1.w3",
                 "model.layers.0.block_sparse_moe.experts.1.w2")),
    # MLA attention, a shared expert, the grouped router (one group here); every layer MoE
    "DeepseekV3": (dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                        first_k_dense_replace=0, n_group=1, topk_group=1, q_lora_rank=32, kv_lora_rank=32,
                        qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, num_key_value_heads=4),
                   ("model.layers.0.mlp.experts.1.gate_proj", "model.layers.0.mlp.experts.1.up_proj",
                    "model.layers.0.mlp.experts.1.down_proj")),
    # DeepSeek-V3.2: V3's layout plus the DSA indexer (its weights_proj kept dense: transformers' own indexer reads
    # its .weight; hf.patch_attention's takes it NVFP4)
    "DeepseekV32": (dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                         first_k_dense_replace=0, n_group=1, topk_group=1, q_lora_rank=32, kv_lora_rank=32,
                         qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, num_key_value_heads=4,
                         index_n_heads=4, index_head_dim=32, index_topk=4),
                    ("model.layers.0.mlp.experts.1.gate_proj", "model.layers.0.mlp.experts.1.up_proj",
                     "model.layers.0.mlp.experts.1.down_proj")),
}
FORMAT_NAMES = {"modelopt": ("weight", "weight_scale", "weight_scale_2"),
                "compressed-tensors": ("weight_packed", "weight_scale", "weight_global_scale")}


def _model(arch, **extra):
    cfg = getattr(transformers, arch + "Config")(**{**BASE, **ARCHS[arch][0], **extra},
                                                 architectures=[arch + "ForCausalLM"])
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=DTYPE, attn_implementation="sdpa")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if not n.endswith("norm.weight"):
                p.normal_(0, 0.1)
    return model.eval()


def _deq(sd, prefix, fmt):
    packed, scale, g = (sd[f"{prefix}.{n}"] for n in FORMAT_NAMES[fmt])
    return nvfp4_dequantize(packed, scale, (1.0 / g.float()) if fmt == "compressed-tensors" else g.float())


def _reference(path, arch, fmt, device):
    """transformers' own model of the checkpoint, its fused experts holding the dequantized per-expert weights (and
    every other quantized linear dequantized), in DTYPE."""
    cfg = transformers.AutoConfig.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=DTYPE, attn_implementation="sdpa")
    sd = load_file(os.path.join(path, "model.safetensors"))
    block = "block_sparse_moe" if arch == "Mixtral" else "mlp"
    gate, up, down = (n.rsplit(".", 1)[1] for n in ARCHS[arch][1])
    state = {}
    for name, p in model.state_dict().items():
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            layer = name.split(".experts.")[0].replace(".mlp", f".{block}")
            E = p.shape[0]
            if name.endswith("gate_up_proj"):
                w = [torch.cat([_deq(sd, f"{layer}.experts.{e}.{gate}", fmt),
                                _deq(sd, f"{layer}.experts.{e}.{up}", fmt)]) for e in range(E)]
            else:
                w = [_deq(sd, f"{layer}.experts.{e}.{down}", fmt) for e in range(E)]
            state[name] = torch.stack(w)
            continue
        ck = name.replace(".mlp.", f".{block}.") if arch == "Mixtral" else name
        prefix = ck.rsplit(".", 1)[0]
        if name.endswith(".weight") and f"{prefix}.weight_scale" in sd:
            state[name] = _deq(sd, prefix, fmt)
        else:
            state[name] = sd[ck] if ck in sd else sd[name]
    model.load_state_dict({k: v.to(DTYPE) for k, v in state.items()})
    return model.to(device).eval()


def _assert_logits_match(ours, reference, device):
    """ours' logits within 20 DTYPE steps of the reference's (which holds each dequantized weight rounded to DTYPE:
    test_hf's tolerance and why), on inputs where both models make the same discrete choices (experts, DSA keys):
    with a choice flipped by rounding at a near-tie the logits move by O(1); with the same choices they are continuous
    in the weights. A model choosing differently on 50 fresh draws fails."""
    for _ in range(50):
        ids = torch.randint(0, BASE["vocab_size"], (2, 7), device=device)
        with torch.no_grad():
            ref, theirs = _choices(reference, ids)
            out, mine = _choices(ours, ids)
        if len(mine) == len(theirs) and all(torch.equal(a, b) for a, b in zip(mine, theirs)):
            break
    else:
        raise AssertionError("ours and the reference chose different experts or keys on 50 draws")
    err, scale = (out - ref).abs().max().item(), ref.abs().max().item()
    assert err <= 20 * ROUND * scale, (err, scale)


class _Topk(torch.overrides.TorchFunctionMode):
    """The chosen indices of each torch.topk while inside a DSA indexer (self.inside), each row's set sorted; keys
    masked to -inf count as -1 (whichever were taken, they add nothing)."""

    def __init__(self):
        super().__init__()
        self.inside, self.picks = False, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.inside and func in (torch.Tensor.topk, torch.topk):
            chosen = out[1].masked_fill(out[0] == float("-inf"), -1)
            self.picks.append(chosen.sort(dim=-1).values.cpu())
        return out


def _choices(model, ids):
    """model's logits on ids and every discrete choice it made, in call order: each router's experts (its output's
    indices, transformers' routers and hf.moe's fused ones alike), each DSA indexer's keys."""
    routed, keys = [], _Topk()

    def inside(flag):
        return lambda *_: setattr(keys, "inside", flag)

    hooks = []
    for m in model.modules():
        name = type(m).__name__
        if name.lower().endswith("topkrouter"):
            hooks.append(m.register_forward_hook(lambda m, a, out: routed.append(out[2].sort(dim=-1).values.cpu())))
        elif name.endswith("Indexer"):
            hooks += [m.register_forward_pre_hook(inside(True)), m.register_forward_hook(inside(False))]
    try:
        with keys:
            logits = model(ids).logits.float()
    finally:
        for h in hooks:
            h.remove()
    assert routed, "no router ran"
    return logits, routed + keys.picks


@pytest.mark.parametrize("fmt", ["modelopt", "compressed-tensors"])
@pytest.mark.parametrize("arch", ["Qwen3Moe", "Mixtral", "DeepseekV3", "DeepseekV32"])
def test_moe_checkpoint_roundtrip(tmp_path, device, arch, fmt):
    model = _model(arch)
    quantize_(model, skip=["*.indexer.weights_proj"] if arch == "DeepseekV32" else ())
    experts = model.model.layers[0].mlp.experts
    assert isinstance(experts, Experts) and len(experts) == 4
    assert all(isinstance(getattr(ex, n), NVFP4Linear) for ex in experts for n in ex.names)
    save_nvfp4(model, tmp_path, format=fmt)
    sd = load_file(str(tmp_path / "model.safetensors"))
    for proj in ARCHS[arch][1]:  # the producers' per-expert names and tensors
        assert all(f"{proj}.{n}" in sd for n in FORMAT_NAMES[fmt]), proj
    gate, up = ARCHS[arch][1][:2]  # one expert's gate / up share a global scale (engines fuse them: w13)
    g = FORMAT_NAMES[fmt][2]
    assert torch.equal(sd[f"{gate}.{g}"], sd[f"{up}.{g}"])
    assert not any("gate_up_proj" in k for k in sd)
    ours = load_nvfp4(tmp_path, device=device, dtype=DTYPE)
    ex = ours.model.layers[1].mlp.experts
    assert isinstance(ex, Experts) and isinstance(ex[3], ExpertMLP)
    assert all(isinstance(getattr(e, n), NVFP4Linear) for e in ex for n in e.names)  # never densified
    reference = _reference(str(tmp_path), arch, fmt, device)
    _assert_logits_match(ours, reference, device)


@pytest.mark.parametrize("arch", ["Qwen3Moe", "Mixtral"])
def test_modelopt_producer_checkpoint(tmp_path, device, arch):
    """A checkpoint ModelOpt itself writes (mtq.quantize NVFP4 + export_hf_checkpoint of transformers' fused experts:
    one quantized linear per expert under the original names, Mixtral's block_sparse_moe.w1 / w3 / w2): its
    dequantization is ModelOpt's own, and load_nvfp4 keeps the experts NVFP4 with transformers' logits."""
    import_extra("modelopt", "optional", pip="pip install nvidia-modelopt")
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint
    from modelopt.torch.quantization.qtensor import NVFP4QTensor
    cfg = getattr(transformers, arch + "Config")(**{**BASE, **ARCHS[arch][0]}, architectures=[arch + "ForCausalLM"])
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if not n.endswith("norm.weight"):
                p.normal_(0, 0.1)
    calib = torch.randint(0, BASE["vocab_size"], (2, 8))
    mtq.quantize(model, mtq.NVFP4_DEFAULT_CFG, lambda m: m(calib))
    export_hf_checkpoint(model, export_dir=str(tmp_path))
    sd = load_file(str(tmp_path / "model.safetensors"))
    gate, up, down = ARCHS[arch][1]
    assert torch.equal(sd[f"{gate}.weight_scale_2"], sd[f"{up}.weight_scale_2"])  # gate / up share it (w13)
    packed = sd[f"{down}.weight"]
    qt = NVFP4QTensor(torch.Size((packed.shape[0], packed.shape[1] * 2)), torch.float32, packed)
    theirs = qt.dequantize(torch.float32, scale=sd[f"{down}.weight_scale"], double_scale=sd[f"{down}.weight_scale_2"],
                           block_sizes={-1: 16})
    assert torch.allclose(theirs, _deq(sd, down, "modelopt"), rtol=2.5e-7, atol=0)  # the same convention
    ours = load_nvfp4(tmp_path, device=device, dtype=DTYPE)
    assert all(isinstance(getattr(e, n), NVFP4Linear) for e in ours.model.layers[0].mlp.experts for n in e.names)
    reference = _reference(str(tmp_path), arch, "modelopt", device)
    _assert_logits_match(ours, reference, device)


def test_unsupported_moe_family_is_an_error(monkeypatch):
    model = _model("Qwen3Moe")
    monkeypatch.setattr(model.config, "model_type", "olmoe")
    with pytest.raises(ValueError, match="model type 'olmoe' are not supported yet"):
        unfuse_experts(model, materialize=True)
    with pytest.raises(ValueError, match="not supported yet"):
        quantize_(model)


@pytest.mark.parametrize("arch", ["Qwen3Moe", "Mixtral", "DeepseekV3", "DeepseekV32"])
def test_fused_routers_match_transformers(device, arch, monkeypatch):
    """fuse_routers (moe_topk in the router's forward; unfuse_experts calls it) returns transformers' logits,
    weights (dtype included) and indices, and the same router-weight gradient; parameters and state_dict stay; a
    transformers before 5.17 (whose routers returned probabilities as logits) is left alone."""
    from llmkernels.hf import moe
    from llmkernels.hf.moe import fuse_routers
    deepseek = arch.startswith("Deepseek")
    model = _model(arch, **(dict(n_group=2, topk_group=1) if deepseek else {})).to(device)  # groups of 2 experts
    router = model.model.layers[0].mlp.gate
    if deepseek:
        router.e_score_correction_bias.normal_(0, 0.1)
    h = torch.randn(7, BASE["hidden_size"], device=device, dtype=DTYPE)
    g = torch.randn(7, router.top_k, device=device)

    def run():  # the router's outputs, DeepSeek's unsorted top-k as sets, and d weight of a loss on the weights
        router.weight.grad = None
        logits, w, i = router(h)
        w, i = w.gather(1, i.argsort(-1)), i.sort(-1).values
        (w.float() * g).sum().backward()
        return logits.detach(), w.detach(), i, router.weight.grad.float()

    ref = run()
    keys = list(model.state_dict())
    assert fuse_routers(model) == BASE["num_hidden_layers"] and fuse_routers(model) == 0
    out = run()
    assert type(router).__name__.startswith("Fused") and list(model.state_dict()) == keys
    assert torch.equal(out[0], ref[0]) and torch.equal(out[2], ref[2]) and out[1].dtype == ref[1].dtype
    torch.testing.assert_close(out[1].float(), ref[1].float(), rtol=ROUND, atol=0)  # fp32 weights (Qwen's in DTYPE)
    torch.testing.assert_close(out[3], ref[3], rtol=4 * ROUND, atol=4 * ROUND * ref[3].abs().max().item())
    name = type(router).__name__  # a whole saved model (pickle) loads back, here and in a process that never fused
    monkeypatch.delitem(vars(moe), name)
    assert type(pickle.loads(pickle.dumps(router))).__name__ == name
    monkeypatch.setattr(moe, "ROUTER_LOGITS_SINCE", (99, 0))  # an older transformers
    assert fuse_routers(_model(arch)) == 0


def test_unfused_experts_match_transformers():
    """Experts (per-expert linears, dense) computes what transformers' fused experts module computes."""
    model = _model("Qwen3Moe")
    ids = torch.randint(0, BASE["vocab_size"], (2, 9))
    dev = "cuda" if CUDA else "cpu"
    model.to(dev)
    with torch.no_grad():
        ref = model(ids.to(dev)).logits.float()
        assert unfuse_experts(model, materialize=True) == 2 and unfuse_experts(model, materialize=True) == 0
        out = model(ids.to(dev)).logits.float()
    assert (out - ref).abs().max().item() <= 4 * ROUND * ref.abs().max().item()


@pytest.mark.gpu
def test_static_decoder_graphs_for_moe():
    """Graphs where routing stays on the device (transformers' grouped_mm experts; tiled NVFP4 experts), refused
    where the host reads it (transformers' eager loop; dense or untiled hf.moe.Experts)."""
    model = _model("Qwen3Moe", head_dim=64).cuda()  # a head dim masked_decode runs
    ids = torch.randint(0, BASE["vocab_size"], (1, 5), device="cuda")
    model.set_experts_implementation("eager")
    with pytest.raises(ValueError, match="routes its tokens on the host"):
        StaticDecoder(model, batch=1, max_len=32)
    eager = StaticDecoder(model, batch=1, max_len=32, graph=False).generate(ids, 6)  # eager steps work
    assert eager.shape == (1, 11) and torch.equal(eager[:, :5], ids)
    model.set_experts_implementation("grouped_mm")  # graph replay = eager steps of the same implementation
    assert torch.equal(StaticDecoder(model, batch=1, max_len=32).generate(ids, 6),
                       StaticDecoder(model, batch=1, max_len=32, graph=False).generate(ids, 6))
    unfuse_experts(model, materialize=True)
    with pytest.raises(ValueError, match="routes its tokens on the host"):
        StaticDecoder(model, batch=1, max_len=32)
    quantize_(model)  # hidden 64: not tiled
    with pytest.raises(ValueError, match="routes its tokens on the host"):
        StaticDecoder(model, batch=1, max_len=32)


def _tiled_experts(E=3, H=256, inter=256):
    """An Experts layer of E NVFP4 experts with tiled shapes (in_features % 256), from random dense weights."""
    dev = "cuda" if CUDA else "cpu"
    experts = [ExpertMLP(("gate_proj", "up_proj", "down_proj"), H, inter, torch.nn.SiLU(), dev, DTYPE)
               for _ in range(E)]
    layer = Experts(experts, H, inter)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.05)
        for ex in layer:
            for n in ex.names:
                setattr(ex, n, NVFP4Linear.from_linear(getattr(ex, n)))
    return layer.eval()


def test_grouped_experts_match_one_by_one():
    """An Experts layer of tiled NVFP4 experts runs nvfp4_moe (device routing); at decode sizes it matches
    the one-by-one path on the same experts (whose gate / up / down outputs round to DTYPE each, the grouped
    kernel's down sums in fp32): within a few DTYPE steps. Dropped slots (index E) add nothing; after the first
    grouped call the experts' buffers are views of the stacks, so the module (and its state_dict) are unchanged."""
    layer = _tiled_experts()
    assert layer.grouped_capable()
    dev = layer[0].gate_proj.packed.device
    x = torch.randn(3, 256, device=dev).to(DTYPE)
    idx = torch.tensor([[0, 2], [1, 3], [2, 2]], device=dev)  # 3 = E: a dropped slot
    w = torch.rand(3, 2, device=dev).to(DTYPE)
    sd = {k: v.clone() for k, v in layer.state_dict().items()}
    with torch.no_grad():
        layer_loop = Experts(list(layer), 256, 256)
        ref = _loop(layer_loop, x, idx, w)
        out = layer(x, idx, w)
    assert layer._stacks is not None and layer[1].up_proj.packed.data_ptr() == layer._stacks[1][0][1].data_ptr()
    assert all(torch.equal(v, sd[k]) for k, v in layer.state_dict().items())
    err, scale = (out.float() - ref.float()).abs().max().item(), ref.float().abs().max().item()
    assert err <= 8 * ROUND * scale, (err, scale)


def _loop(layer, x, idx, w):
    """Experts' one-by-one path (dense or untiled experts take it)."""
    return layer.one_by_one(x, idx, w)


def test_grouped_prefill_matches_one_by_one():
    """Past MOE_MAX_T tokens (MMA_MAX_T on sm_90) nvfp4_moe groups the pairs by expert (one weight read per tile of
    an expert's tokens): the same as the one-by-one path, with a dropped slot and an expert no token chose."""
    layer = _tiled_experts(E=4)
    dev = layer[0].gate_proj.packed.device
    T = 160 if CUDA else 40
    x = torch.randn(T, 256, device=dev).to(DTYPE)
    idx = torch.randint(0, 3, (T, 2), device=dev)  # expert 3 unused
    idx[5, 1] = 4  # = E: dropped
    w = torch.rand(T, 2, device=dev).to(DTYPE)
    with torch.no_grad():
        ref = _loop(layer, x, idx, w)
        out = layer(x, idx, w)
    err, scale = (out.float() - ref.float()).abs().max().item(), ref.float().abs().max().item()
    assert err <= 8 * ROUND * scale, (err, scale)


def test_moe_attention_projections_grouped(monkeypatch, device):
    """quantize_ groups a MoE model's q / k / v (tiled sizes) as it does a dense model's; the experts stay ungrouped
    (their layer's own path); the CPU's stacked call equals the parts' own products."""
    from llmkernels.hf.fuse import unfuse_projections
    from llmkernels.ops.nvfp4.fused import NVFP4Group
    if not CUDA:  # the stacked path on the CPU too
        monkeypatch.setattr(NVFP4Group, "_usable", staticmethod(lambda x: True))
    for arch in ("Qwen3Moe", "Mixtral"):
        extra = dict(hidden_size=256, head_dim=64) if arch == "Qwen3Moe" else dict(hidden_size=256)
        cfg = getattr(transformers, arch + "Config")(**{**BASE, **ARCHS[arch][0], **extra,
                                                        "architectures": [arch + "ForCausalLM"]})
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=DTYPE, attn_implementation="sdpa")
        quantize_(model.to(device).eval())
        attn = model.model.layers[0].self_attn
        assert attn.q_proj.group is attn.k_proj.group is attn.v_proj.group is not None, arch
        assert all(getattr(ex, n).group is None for ex in model.model.layers[0].mlp.experts for n in ex.names)
        ids = torch.randint(0, BASE["vocab_size"], (1, 5), device=device)
        with torch.no_grad():
            fused = model(ids).logits.float()
            unfuse_projections(model)
            assert attn.q_proj.group is None
            alone = model(ids).logits.float()
        if CUDA:  # the GPU's stacked kernel sums in another order
            assert (fused - alone).abs().max().item() <= 20 * ROUND * alone.abs().max().item()
        else:
            assert torch.equal(fused, alone)


def test_grouped_check_follows_module_edits():
    """Experts re-checks whether it may run the grouped kernel after an expert's linear is replaced (a dense one:
    the one-by-one path), not on every call."""
    layer = _tiled_experts()
    assert layer._grouped()
    layer[1].up_proj = torch.nn.Linear(256, 256, bias=False, device=layer[0].gate_proj.packed.device, dtype=DTYPE)
    assert not layer._grouped()


def test_grouped_experts_compile_without_graph_breaks():
    """StaticDecoder(compile=True) traces Experts.forward: after an eager call made the stacks (the prefill), the
    compiled call reads them without a graph break and equals the eager one."""
    import torch._dynamo
    layer = _tiled_experts()
    dev = layer[0].gate_proj.packed.device
    x = torch.randn(2, 256, device=dev).to(DTYPE)
    idx = torch.tensor([[0, 1], [2, 0]], device=dev)
    w = torch.rand(2, 2, device=dev).to(DTYPE)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with torch.no_grad():
        ref = layer(x, idx, w)
        out = torch.compile(lambda a, b, c: layer(a, b, c), backend="aot_eager")(x, idx, w)
    assert torch.equal(out, ref)
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
