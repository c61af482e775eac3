"""llmkernels.hf: NVFP4 checkpoints (ModelOpt, compressed-tensors) in transformers. Tiny Llamas, fp16 on the CPU."""
import json
import os

import pytest
import torch

from conftest import import_extra  # noqa: E402

transformers = import_extra("transformers", "hf")
import_extra("safetensors", "hf")
from safetensors.torch import load_file, save_file  # noqa: E402

from llmkernels import nvfp4_dequantize  # noqa: E402
from llmkernels.hf import StaticDecoder, load_nvfp4, quantize_, save_nvfp4  # noqa: E402
from llmkernels.hf import load as hf_load  # noqa: E402
from llmkernels.ops.nvfp4.op import NVFP4Linear  # noqa: E402

CUDA = torch.cuda.is_available()
DTYPE = torch.bfloat16 if CUDA else torch.float16  # the CPU interpreter multiplies bf16 wrongly: fp16 there
ROUND = 2.0 ** -8 if DTYPE == torch.bfloat16 else 2.0 ** -11  # DTYPE's relative rounding step
# K = 64 (q/k/v/o, gate/up) and 128 (down); head_dim 16 (the loader tests use SDPA)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=64, architectures=["LlamaForCausalLM"], bos_token_id=1,
            eos_token_id=2)


def _tiny_model(device, **over):
    """A random Llama built as load_nvfp4 builds one (from_config in DTYPE: the rotary buffer stays fp32)."""
    return _arch_model(device, "LlamaForCausalLM", **over)


def _arch_model(device, arch, std=0.1, **over):
    """A random tiny model of a transformers architecture ("Qwen2ForCausalLM", ...): TINY's sizes, weights ~N(0, std)
    (norms 1)."""
    cfg = getattr(transformers, arch.replace("ForCausalLM", "Config"))(**dict(TINY, architectures=[arch], **over))
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=DTYPE, attn_implementation="sdpa")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if not n.endswith("norm.weight"):
                p.normal_(0, std)
    return model.to(device).eval()


def _logits(model, ids):
    with torch.no_grad():
        return model(ids.to(model.device)).logits.float()


def _ref_logits(path, dequant, device):
    """The checkpoint's model with dense weights: every quantized layer's weight = dequant(tensors, prefix) (fp32,
    then rounded once to DTYPE), the other tensors as stored."""
    cfg = transformers.AutoConfig.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=DTYPE, attn_implementation="sdpa")
    sd = load_file(os.path.join(path, "model.safetensors"))
    state = {}
    for name, p in model.state_dict().items():
        prefix = name.rsplit(".", 1)[0]
        quantized = name.endswith(".weight") and f"{prefix}.weight_scale" in sd
        state[name] = dequant(sd, prefix) if quantized else sd[name]
    model.load_state_dict({k: v.to(DTYPE) for k, v in state.items()})
    return model.to(device).eval()


def _ours_dequant(fmt):
    def deq(sd, p):
        if fmt == "modelopt":
            return nvfp4_dequantize(sd[f"{p}.weight"], sd[f"{p}.weight_scale"], sd[f"{p}.weight_scale_2"].float())
        return nvfp4_dequantize(sd[f"{p}.weight_packed"], sd[f"{p}.weight_scale"],
                                1.0 / sd[f"{p}.weight_global_scale"].float())
    return deq


# Tolerance of the logit comparisons: the reference holds each dequantized weight rounded to DTYPE and runs in
# DTYPE like ours, whose weights stay exact in fp32 inside the kernel (one rounding of each output). Through 2 layers
# and lm_head the logits then differ by 1.2e-3 to 2.4e-3 of their largest magnitude in fp16 (2.5 to 5 ROUND,
# measured over 8 CPU runs); 20 ROUND leaves 4x of margin (bf16 on the GPU: the same count of its 8x coarser steps),
# while a wrong nibble order, block-scale layout or global-scale convention changes the weights themselves, so the
# logits by O(1) of that magnitude.
def _close(out, ref, tol=20 * ROUND):
    err = (out - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert err <= tol * scale, f"max |diff| {err:.3e} > {tol} * max |ref| {scale:.3e}"


# ---- checkpoints from the formats' own producer libraries ---------------------------------------------------------

def test_compressed_tensors_producer_checkpoint(tmp_path, device):
    ct = import_extra("compressed_tensors", "hf-test")
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme, apply_quantization_config
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from compressed_tensors.quantization.quant_scheme import NVFP4
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

    # llm-compressor 0.14's flow with compressed-tensors alone: attach the NVFP4 (W4A4) scheme, calibrate the weight
    # scales with compressed-tensors' own functions (one global scale per q / k / v and gate / up set, from the
    # set's absmax, as its fused observers do: observers/helpers.py FUSED_LAYER_NAMES), compress, save
    model = _tiny_model("cpu")
    dense = {n: m.weight.detach().clone() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    scheme = QuantizationScheme(targets=["Linear"], **NVFP4)
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    for name, mod in model.named_modules():
        if hasattr(mod, "quantization_scheme"):
            w = mod.weight.data.float()
            parent, _, leaf = name.rpartition(".")
            group = next((g for g in VLLM_FUSED if leaf in g), (leaf,))
            absmax = max(dense[f"{parent}.{x}"].float().abs().max() for x in group)
            g = generate_gparam(-absmax.reshape(1), absmax.reshape(1))
            blocks = w.unflatten(-1, (-1, 16))
            s, _ = calculate_qparams(blocks.amin(-1), blocks.amax(-1), mod.quantization_scheme.weights, global_scale=g)
            mod.weight_global_scale.data.copy_(g)
            mod.weight_scale.data.copy_(s)
            mod.input_global_scale.data.fill_(1.0)  # a calibrated activation scale: ignored by the loader
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(tmp_path)
    compressor.update_config(str(tmp_path))
    assert json.load(open(tmp_path / "config.json"))["quantization_config"]["format"] == "nvfp4-pack-quantized"
    assert any(k.endswith(".input_global_scale") for k in load_file(str(tmp_path / "model.safetensors")))

    def ct_dequant(sd, p):  # compressed-tensors' own unpacking and dequantization, in fp32
        packed = sd[f"{p}.weight_packed"]
        q = unpack_fp4_from_uint8(packed, packed.shape[0], packed.shape[1] * 2, dtype=torch.float32)
        return dequantize(q, sd[f"{p}.weight_scale"].float(), args=scheme.weights,
                          global_scale=sd[f"{p}.weight_global_scale"], dtype=torch.float32)

    ours = load_nvfp4(tmp_path, device=device, dtype=DTYPE)
    assert isinstance(ours.model.layers[0].self_attn.q_proj, NVFP4Linear)
    assert isinstance(ours.lm_head, torch.nn.Linear) and not isinstance(ours.lm_head, NVFP4Linear)
    ids = torch.randint(0, TINY["vocab_size"], (2, 8))
    _close(_logits(ours, ids), _logits(_ref_logits(str(tmp_path), ct_dequant, device), ids))
    assert ct.__version__
    # vLLM reads the producer's checkpoint as its own, and ours of the same weights no worse; the global scales
    # agree to within one fp32 rounding (llm-compressor stores 2688 / amax, llmkernels 1 / (amax / 2688))
    theirs = load_file(str(tmp_path / "model.safetensors"))
    assert _vllm_weight_err(theirs, "compressed-tensors") == 0.0
    again = _tiny_model("cpu")
    again.load_state_dict(_tiny_state(dense, again))
    save_nvfp4(quantize_(again), tmp_path / "ours", format="compressed-tensors")
    mine = load_file(str(tmp_path / "ours" / "model.safetensors"))
    assert _vllm_weight_err(mine, "compressed-tensors") <= _vllm_weight_err(theirs, "compressed-tensors")
    for p in _quantized_names(theirs, "compressed-tensors"):
        a, b = mine[f"{p}.weight_global_scale"], theirs[f"{p}.weight_global_scale"]
        assert torch.allclose(a, b, rtol=2.4e-7, atol=0), p


def _tiny_state(dense, model):
    """model's state_dict with the nn.Linear weights of `dense` (name -> weight) in place."""
    sd = model.state_dict()
    sd.update({f"{n}.weight": w for n, w in dense.items()})
    return sd


def test_modelopt_producer_checkpoint(tmp_path, device):
    import_extra("modelopt", "optional", pip="pip install nvidia-modelopt")
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    model = _tiny_model("cpu")
    dense = {n: m.weight.detach().clone() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    ids = torch.randint(0, TINY["vocab_size"], (2, 8))
    mtq.quantize(model, mtq.NVFP4_DEFAULT_CFG, lambda m: m(ids))  # W4A4: the export also holds input_scale
    export_hf_checkpoint(model, export_dir=str(tmp_path))
    sd = load_file(str(tmp_path / "model.safetensors"))
    assert any(k.endswith(".input_scale") for k in sd)

    def mo_dequant(sd, p):  # ModelOpt's own dequantization
        packed = sd[f"{p}.weight"]
        qt = NVFP4QTensor(torch.Size((packed.shape[0], packed.shape[1] * 2)), torch.float32, packed)
        return qt.dequantize(torch.float32, scale=sd[f"{p}.weight_scale"], double_scale=sd[f"{p}.weight_scale_2"],
                             block_sizes={-1: 16})

    p = "model.layers.1.mlp.down_proj"
    # the same convention: equal up to the order of the two fp32 products (ModelOpt: e2m1 * (scale * g))
    assert torch.allclose(mo_dequant(sd, p), _ours_dequant("modelopt")(sd, p), rtol=2.5e-7, atol=0)
    ours = load_nvfp4(tmp_path, device=device, dtype=DTYPE)
    _close(_logits(ours, ids), _logits(_ref_logits(str(tmp_path), mo_dequant, device), ids))
    # ModelOpt's export shares weight_scale_2 over q / k / v and gate / up (preprocess_linear_fusion): vLLM reads
    # it as its own, and quantize_ + save_nvfp4 of the same weights write the same global scales
    assert _vllm_weight_err(sd, "modelopt") == 0.0
    for i in range(TINY["num_hidden_layers"]):
        assert len({_bits(sd[f"model.layers.{i}.self_attn.{n}.weight_scale_2"]) for n in VLLM_FUSED[0]}) == 1
    again = _tiny_model("cpu")
    again.load_state_dict(_tiny_state(dense, again))
    save_nvfp4(quantize_(again), tmp_path / "ours", format="modelopt")
    mine = load_file(str(tmp_path / "ours" / "model.safetensors"))
    for p in _quantized_names(sd, "modelopt"):
        assert torch.equal(mine[f"{p}.weight_scale_2"], sd[f"{p}.weight_scale_2"]), p


# ---- quantize_ -> save_nvfp4 -> load_nvfp4 ------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["modelopt", "compressed-tensors"])
def test_roundtrip_tiled_layout(tmp_path, device, fmt):
    # every linear of this model is tileable (out % 16, in % 256): NVFP4Linear holds the tiled layout in memory, the
    # checkpoint the plain one; the loaded model is the reference model on the checkpoint's dequantized weights
    model = quantize_(_tiny_model(device, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                                  num_key_value_heads=2))
    quant = {n: m for n, m in model.named_modules() if isinstance(m, NVFP4Linear)}
    assert len(quant) == 14 and all(m.tiled for m in quant.values())
    save_nvfp4(model, tmp_path, format=fmt)
    sd = load_file(str(tmp_path / "model.safetensors"))
    packed_name = "weight" if fmt == "modelopt" else "weight_packed"
    for name, mod in quant.items():  # the file holds the plain layout
        assert torch.equal(sd[f"{name}.{packed_name}"].to(mod.packed.device), mod.plain_weight()[0])
    loaded = load_nvfp4(tmp_path, device=device, dtype=DTYPE)
    for name, mod in quant.items():
        assert torch.equal(loaded.get_submodule(name).packed, mod.packed)  # tiled again, the same bytes
    ids = torch.randint(0, TINY["vocab_size"], (2, 8))
    _close(_logits(loaded, ids), _logits(_ref_logits(str(tmp_path), _ours_dequant(fmt), device), ids))


@pytest.mark.parametrize("fmt", ["modelopt", "compressed-tensors"])
def test_roundtrip(tmp_path, device, fmt):
    model = quantize_(_tiny_model(device, attention_bias=True))  # q/k/v/o with a bias
    ids = torch.randint(0, TINY["vocab_size"], (2, 8))
    before = _logits(model, ids)
    save_nvfp4(model, tmp_path, format=fmt, max_shard_bytes=20_000)  # several shards + index
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert (tmp_path / "hf_quant_config.json").exists() == (fmt == "modelopt")
    loaded = load_nvfp4(tmp_path, device=device, dtype=DTYPE)
    for name, mod in model.named_modules():
        if isinstance(mod, NVFP4Linear):
            new = loaded.get_submodule(name)
            assert torch.equal(new.packed, mod.packed)
            assert torch.equal(new.scales.view(torch.uint8), mod.scales.view(torch.uint8))
            # compressed-tensors stores 1 / g: g comes back within one fp32 rounding of each division
            assert torch.allclose(new.global_scale, mod.global_scale, rtol=3e-7, atol=0)
            if mod.bias is None:
                assert new.bias is None
            else:  # saved in the model's dtype, as the formats do
                assert torch.equal(new.bias, mod.bias.to(DTYPE).float())
    after = _logits(loaded, ids)
    if fmt == "modelopt":
        assert torch.equal(after, before)
    else:  # g within an fp32 rounding: at most a flipped DTYPE rounding here and there
        _close(after, before, tol=2 * ROUND)


@pytest.mark.parametrize("arch, fmt, extra", [
    ("Qwen2ForCausalLM", "compressed-tensors", dict(tie_word_embeddings=True)),  # q/k/v biases, tied lm_head
    ("Qwen3ForCausalLM", "modelopt", dict(head_dim=16)),                          # q_norm / k_norm
    ("MistralForCausalLM", "modelopt", dict(sliding_window=None)),
])
def test_architectures(tmp_path, device, arch, fmt, extra):
    model = quantize_(_arch_model(device, arch, **extra))
    ids = torch.randint(0, TINY["vocab_size"], (1, 6))
    before = _logits(model, ids)
    save_nvfp4(model, tmp_path, format=fmt)
    loaded = load_nvfp4(tmp_path, device=device, dtype=DTYPE)
    assert type(loaded).__name__ == arch
    if extra.get("tie_word_embeddings"):
        assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    # compressed-tensors stores 1 / g (g back within an fp32 rounding): as in test_roundtrip
    _close(_logits(loaded, ids), before, tol=2 * ROUND)


@pytest.mark.parametrize("arch, extra", [
    ("LlamaForCausalLM", {}), ("Qwen2ForCausalLM", {}),  # Qwen2: q/k/v biases
    ("Qwen3ForCausalLM", dict(head_dim=64)), ("MistralForCausalLM", dict(sliding_window=None)),
])
def test_fused_projections(tmp_path, device, monkeypatch, arch, extra):
    """quantize_ / load_nvfp4 group each layer's q / k / v and gate / up (tiled sizes: in_features % 256): same
    logits (the CPU's stacked call is each part's own product: equal; the GPU's stacked kernel sums in another
    order: within _close), same checkpoint."""
    from llmkernels.hf.fuse import fuse_projections, unfuse_projections
    from llmkernels.ops.nvfp4.fused import NVFP4Group
    if not CUDA:  # the stacked path on the CPU too
        monkeypatch.setattr(NVFP4Group, "_usable", staticmethod(lambda x: True))
    model = quantize_(_arch_model(device, arch, std=0.05, hidden_size=256, intermediate_size=512, **extra))
    layer = model.model.layers[0]
    assert layer.self_attn.k_proj.group is layer.self_attn.q_proj.group is not None
    assert layer.mlp.up_proj.group is layer.mlp.gate_proj.group is not None and layer.mlp.down_proj.group is None
    assert "forward" in vars(layer.mlp)  # gate, up and the SiLU in one call
    ids = torch.randint(0, TINY["vocab_size"], (1, 6))
    fused = _logits(model, ids)
    unfuse_projections(model)
    assert layer.self_attn.q_proj.group is None
    assert "forward" not in vars(layer.mlp)
    alone = _logits(model, ids)
    if CUDA:
        _close(fused, alone)
    else:
        assert torch.equal(fused, alone)
    assert fuse_projections(model) == 2 * TINY["num_hidden_layers"]
    save_nvfp4(model, tmp_path)
    loaded = load_nvfp4(tmp_path, device=device, dtype=DTYPE)
    assert loaded.model.layers[1].mlp.gate_proj.group is not None
    assert load_nvfp4(tmp_path, device=device, dtype=DTYPE, fuse=False).model.layers[1].mlp.gate_proj.group is None
    with pytest.raises(TypeError, match="fuse must be a bool"):
        load_nvfp4(tmp_path, device=device, dtype=DTYPE, fuse=1)
    with pytest.raises(TypeError, match="fuse must be a bool"):
        quantize_(model, fuse="yes")
    assert torch.equal(_logits(loaded, ids), fused)


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM"])  # Qwen2: q / k / v biases
def test_stacked_dense_projections(tmp_path, device, arch):
    """fuse_projections on a dense model: q / k / v and gate / up as one GEMM over stacked weights (views: no memory
    added, names and state_dict unchanged); same logits as each layer alone (a column's sum is the same product: close
    within DTYPE's rounding), under torch.compile and StaticDecoder too; each layer alone under grad or once the model
    is converted (the stack dropped); saving writes each tensor on its own."""
    from llmkernels.hf.fuse import LinearStack, fuse_projections, unfuse_projections
    model = _arch_model(device, arch, hidden_size=128, num_attention_heads=2, num_key_value_heads=1)  # D 64
    ids = torch.randint(0, TINY["vocab_size"], (2, 6), device=device)
    alone = _logits(model, ids)
    names = list(model.state_dict())
    assert fuse_projections(model) == 2 * TINY["num_hidden_layers"]
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert isinstance(attn.q_proj.group, LinearStack) and attn.v_proj.group is attn.q_proj.group
    assert attn.k_proj.weight.data_ptr() == attn.q_proj.weight.data_ptr() + attn.q_proj.weight.numel() * 2
    assert list(model.state_dict()) == names and "forward" in vars(mlp)
    _close(_logits(model, ids), alone)
    compiled = torch.compile(lambda i: model(i).logits.float(), backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        _close(compiled(ids), alone)
    out = StaticDecoder(model, batch=2, max_len=16, graph=False).generate(ids, 3)
    _check_picks(model, out, 6, 3)
    with pytest.raises(TypeError, match="nn.Linear"):
        LinearStack([attn.o_proj])
    with pytest.raises(ValueError, match="ungrouped"):
        LinearStack([attn.q_proj, attn.k_proj])
    model.model.layers[1].mlp.gate_proj.weight.requires_grad_(True)  # grad: each layer alone, gradients flow
    y = model.model.layers[1].mlp(torch.randn(3, 128, device=device, dtype=DTYPE))
    y.float().sum().backward()
    assert model.model.layers[1].mlp.gate_proj.weight.grad is not None
    model.float()  # converted: the parts are new tensors, the stack is dropped on the next call
    _close(_logits(model, ids), alone)
    assert attn.q_proj.group.weight is None
    unfuse_projections(model)
    assert "group" not in vars(attn.q_proj) and "forward" not in vars(mlp) and "forward" not in vars(attn.q_proj)
    model = _arch_model(device, arch, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                        num_key_value_heads=1)  # stacked, then quantized (the tiled layout: K % 256)
    fuse_projections(model)
    quantize_(model, fuse=False)  # the MLPs' SiLU forward without a group: each layer alone
    ref = _logits(model, ids)
    fuse_projections(model)
    _close(_logits(model, ids), ref)
    save_nvfp4(model, tmp_path)


def test_saved_compressed_tensors_reads_in_compressed_tensors(tmp_path):
    import_extra("compressed_tensors", "hf-test")
    model = quantize_(_tiny_model("cpu"))
    save_nvfp4(model, tmp_path, format="compressed-tensors")
    # transformers' own compressed-tensors loader; it decompresses (to bf16) on the first forward
    ct_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    ct_model(torch.randint(0, TINY["vocab_size"], (1, 4)))
    for name, mod in model.named_modules():
        if isinstance(mod, NVFP4Linear):
            w = nvfp4_dequantize(*mod.plain_weight(), mod.global_scale)
            theirs = ct_model.get_submodule(name).weight.float()
            assert torch.allclose(theirs, w, rtol=2 ** -8, atol=0), name  # their bf16 rounding


def test_saved_modelopt_reads_in_modelopt(tmp_path):
    import_extra("modelopt", "optional", pip="pip install nvidia-modelopt")
    from modelopt.torch.quantization.qtensor import NVFP4QTensor
    model = quantize_(_tiny_model("cpu"))
    save_nvfp4(model, tmp_path, format="modelopt")
    hf_quant = json.load(open(tmp_path / "hf_quant_config.json"))["quantization"]
    assert hf_quant["quant_algo"] == "W4A16_NVFP4" and hf_quant["exclude_modules"] == ["lm_head"]
    sd = load_file(str(tmp_path / "model.safetensors"))
    for name, mod in model.named_modules():
        if isinstance(mod, NVFP4Linear):
            packed = sd[f"{name}.weight"]
            qt = NVFP4QTensor(torch.Size((packed.shape[0], packed.shape[1] * 2)), torch.float32, packed)
            w = qt.dequantize(torch.float32, scale=sd[f"{name}.weight_scale"],
                              double_scale=sd[f"{name}.weight_scale_2"], block_sizes={-1: 16})
            ours = nvfp4_dequantize(*mod.plain_weight(), mod.global_scale)
            assert torch.allclose(w, ours, rtol=2.5e-7, atol=0), name  # e2m1 * (scale * g) vs (e2m1 * scale) * g


def test_quantize_skip_and_errors(tmp_path):
    model = quantize_(_tiny_model("cpu"), skip=("*.mlp.down_proj",))
    assert not isinstance(model.model.layers[1].mlp.down_proj, NVFP4Linear)
    assert isinstance(model.model.layers[1].mlp.up_proj, NVFP4Linear)
    assert not isinstance(model.lm_head, NVFP4Linear)  # the output embedding stays dense whatever skip says
    save_nvfp4(model, tmp_path)
    assert "model.layers.1.mlp.down_proj" in json.load(open(tmp_path / "hf_quant_config.json"))["quantization"][
        "exclude_modules"]
    assert not isinstance(load_nvfp4(tmp_path, device="cpu", dtype=DTYPE).model.layers[1].mlp.down_proj,
                          NVFP4Linear)
    assert isinstance(quantize_(_tiny_model("cpu"), quantize_lm_head=True).lm_head, NVFP4Linear)
    with pytest.raises(ValueError, match="down_proj: in_features=72"):
        quantize_(_tiny_model("cpu", intermediate_size=72))
    with pytest.raises(ValueError, match="no NVFP4Linear"):
        save_nvfp4(_tiny_model("cpu"), tmp_path / "x")
    with pytest.raises(ValueError, match="format must be one of"):
        save_nvfp4(model, tmp_path / "y", format="gguf")
    with pytest.raises(TypeError, match="max_shard_bytes must be an int"):
        save_nvfp4(model, tmp_path / "y", max_shard_bytes=1e9)
    with pytest.raises(TypeError, match="transformers model"):
        save_nvfp4(torch.nn.Sequential(NVFP4Linear(32, 16)), tmp_path / "z")
    assert not (tmp_path / "y").exists() and not (tmp_path / "z").exists()  # refused before any file is written
    # a bare layer: not replaced in place (it used to gain a child named '')
    with pytest.raises(TypeError, match="NVFP4Linear.from_linear"):
        quantize_(torch.nn.Linear(32, 16))
    with pytest.raises(ValueError, match="nothing to quantize.*already quantized"):
        quantize_(quantize_(_tiny_model("cpu")))
    with pytest.raises(ValueError, match="nothing to quantize"):
        quantize_(_tiny_model("cpu"), skip=("model.*",))
    with pytest.raises(ValueError, match=r"skip pattern 'down_proj' matches no nn.Linear.*such as 'model.layers"):
        quantize_(_tiny_model("cpu"), skip=("down_proj",))  # whole names: "*.down_proj"
    with pytest.raises(TypeError, match="skip must be fnmatch patterns"):
        quantize_(_tiny_model("cpu"), skip=(3,))
    with pytest.raises(TypeError, match=r"q_proj.weight is torch.float32.*cast the model first"):
        quantize_(_tiny_model("cpu").float())
    with pytest.raises(ValueError, match=r"q_proj, .*k_proj, .*v_proj share one global scale.*only"):
        quantize_(_tiny_model("cpu"), skip=("*.k_proj",))  # engines load q / k / v as one layer
    with pytest.raises(ValueError, match="tied to the input embedding"):
        quantize_(_arch_model("cpu", "Qwen2ForCausalLM", tie_word_embeddings=True), quantize_lm_head=True)
    with pytest.raises(TypeError, match="quantize_lm_head must be a bool"):
        quantize_(_tiny_model("cpu"), quantize_lm_head="yes")


@pytest.mark.skipif(CUDA, reason="the errors of a machine without CUDA")
def test_load_refuses_what_cannot_run_here(good):
    with pytest.raises(ValueError, match="device is 'cuda' but CUDA is not available here: pass device='cpu'"):
        load_nvfp4(good["modelopt"])  # the default device
    with pytest.raises(TypeError, match="bfloat16 on the CPU.*pass dtype=torch.float16"):
        load_nvfp4(good["modelopt"], device="cpu", dtype=torch.bfloat16)


def test_load_dtype_and_path_errors(good, tmp_path):
    with pytest.raises(TypeError, match="dtype must be torch.float16 or torch.bfloat16"):
        load_nvfp4(good["modelopt"], device="cpu", dtype=torch.float32)
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_nvfp4(tmp_path, device="cpu", dtype=DTYPE)


def test_decoder_argument_errors():
    model = quantize_(_tiny_model("cpu"))
    with pytest.raises(ValueError, match="batch must be >= 1"):
        StaticDecoder(model, batch=0, max_len=8)
    with pytest.raises(TypeError, match="graph must be a bool"):
        StaticDecoder(model, batch=1, max_len=8, graph="no")
    with pytest.raises(ValueError, match="new_tokens must be >= 1"):
        StaticDecoder(model, batch=1, max_len=8, graph=False).generate(torch.ones(1, 2, dtype=torch.long), 0)


def test_example_refuses_zero_new_tokens():
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "nvfp4_decode.py")
    r = subprocess.run([sys.executable, script, "--new-tokens", "0"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--new-tokens: must be at least 1, got 0" in r.stderr, r.stderr[-500:]


# ---- one global scale per q / k / v and gate / up: what engines that fuse them read ------------------------------

# vLLM's packed_modules_mapping for Llama, Qwen2 / 3 and Mistral: each tuple loads into ONE layer (qkv_proj,
# gate_up_proj), which keeps one global scale, taken in process_weights_after_loading as ModelOpt
# (ModelOptNvFp4LinearMethod, its Marlin path too) weight_scale_2.max(), compressed-tensors (CompressedTensorsW4A16Fp4)
# 1 / weight_global_scale.max()
VLLM_FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
GLOBAL = {"modelopt": "weight_scale_2", "compressed-tensors": "weight_global_scale"}


def _vllm_dequant(fmt):
    """dequant(sd, prefix) as vLLM reads the layer: its own codes and block scales, its fused layer's one scale."""
    def deq(sd, p):
        parent, _, leaf = p.rpartition(".")
        parts = next((g for g in VLLM_FUSED if leaf in g), (leaf,))
        stored = torch.stack([sd[f"{parent}.{x}.{GLOBAL[fmt]}"].float().reshape(()) for x in parts]).max()
        g = stored if fmt == "modelopt" else 1.0 / stored
        packed = sd[f"{p}.weight" if fmt == "modelopt" else f"{p}.weight_packed"]
        return nvfp4_dequantize(packed, sd[f"{p}.weight_scale"], g)
    return deq


def _quantized_names(sd, fmt):
    return [k[: -len(GLOBAL[fmt]) - 1] for k in sd if k.endswith("." + GLOBAL[fmt])]


def _vllm_weight_err(sd, fmt) -> float:
    """The largest relative error over the layers of vLLM's reading of sd against the format's own per-layer one."""
    own, vllm = _ours_dequant(fmt), _vllm_dequant(fmt)
    return max(((vllm(sd, p) - own(sd, p)).norm() / own(sd, p).norm()).item() for p in _quantized_names(sd, fmt))


def _bits(t):
    return t.float().reshape(()).view(torch.int32).item()


@pytest.mark.parametrize("fmt", ["modelopt", "compressed-tensors"])
def test_fused_engines_read_saved_checkpoints_exactly(tmp_path, device, fmt):
    from llmkernels.ops.nvfp4.format import default_global_scale
    model = _tiny_model(device)
    # control: each layer's own scale, as quantize_ used to (k's weights halved: a scale 2x off the others')
    qkv = [getattr(model.model.layers[0].self_attn, n) for n in VLLM_FUSED[0]]
    alone = []
    for n, m in zip(VLLM_FUSED[0], qkv):
        lin = torch.nn.Linear(m.in_features, m.out_features, bias=False, device=device, dtype=DTYPE)
        with torch.no_grad():
            lin.weight.copy_(m.weight * (0.5 if n == "k_proj" else 1.0))
        alone.append(NVFP4Linear.from_linear(lin))
    amax = {n: m.weight.float().abs().amax() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    quantize_(model)
    save_nvfp4(model, tmp_path, format=fmt)
    sd = load_file(str(tmp_path / "model.safetensors"))
    for i in range(TINY["num_hidden_layers"]):  # one global scale per set, bit for bit, from the set's largest
        for block, names in (("self_attn", VLLM_FUSED[0]), ("mlp", VLLM_FUSED[1])):  # amax; o / down their own
            full = [f"model.layers.{i}.{block}.{n}" for n in names]
            g = default_global_scale(torch.stack([amax[n] for n in full]).amax())
            assert {_bits(sd[f"{n}.{GLOBAL[fmt]}"]) for n in full} == {_bits(g if fmt == "modelopt" else 1 / g)}
        for n in (f"model.layers.{i}.self_attn.o_proj", f"model.layers.{i}.mlp.down_proj"):
            g = default_global_scale(amax[n])
            assert _bits(sd[f"{n}.{GLOBAL[fmt]}"]) == _bits(g if fmt == "modelopt" else 1 / g), n
    # vLLM's reading is the checkpoint's own, weight for weight, so the logits are too
    assert _vllm_weight_err(sd, fmt) == 0.0
    ids = torch.randint(0, TINY["vocab_size"], (2, 8))
    ours = _logits(load_nvfp4(tmp_path, device=device, dtype=DTYPE), ids)
    _close(ours, _logits(_ref_logits(str(tmp_path), _vllm_dequant(fmt), device), ids))
    # the control: three scales read as one put a layer's weights far off (k's by ~2x)
    sd_alone = {f"a.{n}.{GLOBAL[fmt]}": (m.global_scale.reshape(()) if fmt == "modelopt" else 1 / m.global_scale)
                for n, m in zip(VLLM_FUSED[0], alone)}
    for n, m in zip(VLLM_FUSED[0], alone):
        packed, scales = m.plain_weight()
        sd_alone.update({f"a.{n}.{'weight' if fmt == 'modelopt' else 'weight_packed'}": packed,
                         f"a.{n}.weight_scale": scales})
    assert _vllm_weight_err(sd_alone, fmt) > 0.3


@pytest.mark.parametrize("fmt", ["modelopt", "compressed-tensors"])
def test_save_requantizes_sets_with_different_scales(tmp_path, device, fmt):
    """A model whose q / k / v were quantized one by one (a checkpoint that did not share the scale, an older
    llmkernels) is saved with one scale for the set: the member with the largest amax keeps its bytes, the others
    are requantized from their exact fp32 weights, within one FP4 rounding of them."""
    model = _tiny_model(device)
    attn = model.model.layers[1].self_attn
    with torch.no_grad():  # distinct largest values, so distinct scales (random bf16 ones tied in ~3 % of seeds)
        attn.k_proj.weight.mul_(1.5)
        attn.v_proj.weight.mul_(0.7)
    alone = {n: NVFP4Linear.from_linear(getattr(attn, n)) for n in VLLM_FUSED[0]}
    quantize_(model, fuse=False)
    for n, m in alone.items():
        setattr(attn, n, m)
    with pytest.warns(UserWarning, match=r"layers.1.self_attn.q_proj, .*v_proj hold different global scales"):
        save_nvfp4(model, tmp_path, format=fmt)
    sd = load_file(str(tmp_path / "model.safetensors"))
    assert _vllm_weight_err(sd, fmt) == 0.0
    assert len({_bits(sd[f"model.layers.1.self_attn.{n}.{GLOBAL[fmt]}"]) for n in alone}) == 1
    top = max(alone, key=lambda n: alone[n].global_scale.item())
    packed_key = "weight" if fmt == "modelopt" else "weight_packed"
    for n, m in alone.items():
        w = nvfp4_dequantize(*m.plain_weight(), m.global_scale)
        saved = _ours_dequant(fmt)(sd, f"model.layers.1.self_attn.{n}").to(w.device)
        if n == top:
            assert torch.equal(sd[f"model.layers.1.self_attn.{n}.{packed_key}"].to(w.device), m.plain_weight()[0])
        # E2M1 steps are at most 1/3 of a value (4 -> 6), each rounding at most half of one: 0.17 of the block's
        # largest value; relative to the whole weight (rms ~ 0.4 of the largest) well under that
        assert ((saved - w).norm() / w.norm()).item() < 0.17, n
    assert isinstance(attn.q_proj, NVFP4Linear) and attn.q_proj is alone["q_proj"]  # the model itself unchanged


# ---- bad checkpoints: a clear error before any weight is placed ----------------------------------------------------

@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A valid checkpoint of each format (the same quantized model)."""
    torch.manual_seed(0)
    model = quantize_(_tiny_model("cpu"))
    out = {}
    for fmt in ("modelopt", "compressed-tensors"):
        out[fmt] = tmp_path_factory.mktemp(fmt)
        save_nvfp4(model, out[fmt], format=fmt)
    return out


L0 = "model.layers.0.self_attn.q_proj"


def _edit_tensors(path, fn):
    f = os.path.join(path, "model.safetensors")
    sd = load_file(f)
    fn(sd)
    save_file(sd, f)


def _edit_json(path, name, fn):
    with open(os.path.join(path, name)) as f:
        d = json.load(f)
    fn(d)
    with open(os.path.join(path, name), "w") as f:
        json.dump(d, f)


def _write(path, name, text):
    with open(os.path.join(path, name), "w") as f:
        f.write(text)


def _truncate(path, name, keep):
    f = os.path.join(path, name)
    os.truncate(f, int(os.path.getsize(f) * keep))


def _set(sd, name, value):
    sd[name] = value


def _scale_byte(sd, name, byte):
    s = sd[name].view(torch.uint8).clone()
    s[3, 1] = byte
    sd[name] = s.view(torch.float8_e4m3fn)


BAD = {  # name: (format, edit(path), exception, message)
    "missing": ("modelopt", lambda p: _edit_tensors(p, lambda sd: sd.pop(f"{L0}.weight_scale")),
                ValueError, f"{L0}.weight_scale is missing"),
    "unexpected": ("modelopt", lambda p: _edit_tensors(p, lambda sd: _set(sd, "model.layers.0.extra", torch.ones(2))),
                   ValueError, "unexpected tensor model.layers.0.extra"),
    "ct-name-in-modelopt": ("modelopt", lambda p: _edit_tensors(
        p, lambda sd: _set(sd, f"{L0}.weight_packed", sd.pop(f"{L0}.weight"))), ValueError, f"{L0}.weight_packed"),
    "dtype": ("modelopt", lambda p: _edit_tensors(
        p, lambda sd: _set(sd, f"{L0}.weight_scale", sd[f"{L0}.weight_scale"].half())), TypeError, "expected F8_E4M3"),
    "shape": ("compressed-tensors", lambda p: _edit_tensors(
        p, lambda sd: _set(sd, f"{L0}.weight_packed", sd[f"{L0}.weight_packed"][:, :-1].contiguous())),
        ValueError, r"weight_packed.*shape \[64, 31\]; expected \[64, 32\]"),
    "dense-shape": ("modelopt", lambda p: _edit_tensors(
        p, lambda sd: _set(sd, "model.norm.weight", torch.ones(65, dtype=DTYPE))), ValueError, "model.norm.weight"),
    "group-size": ("modelopt", lambda p: _edit_json(
        p, "config.json", lambda d: d["quantization_config"]["config_groups"]["group_0"]["weights"].update(
            group_size=32)), ValueError, "group_size is 32"),
    "hf-quant-group-size": ("modelopt", lambda p: (
        _edit_json(p, "config.json", lambda d: d.pop("quantization_config")),
        _edit_json(p, "hf_quant_config.json", lambda d: d["quantization"].update(group_size=32))),
        ValueError, "hf_quant_config.json.*group_size is 32"),
    "quant-algo": ("modelopt", lambda p: _edit_json(
        p, "config.json", lambda d: d["quantization_config"].update(quant_algo="FP8")),
        ValueError, "quant_algo is 'FP8'"),
    "ct-group-size": ("compressed-tensors", lambda p: _edit_json(
        p, "config.json", lambda d: d["quantization_config"]["config_groups"]["group_0"]["weights"].update(
            group_size=32)), ValueError, "group_size is 32"),
    "ct-format": ("compressed-tensors", lambda p: _edit_json(
        p, "config.json", lambda d: (d["quantization_config"].update(format="float-quantized"),
                                     d["quantization_config"]["config_groups"]["group_0"].pop("format"))),
        ValueError, "format is 'float-quantized'"),
    "k-not-16": ("modelopt", lambda p: _edit_json(p, "config.json", lambda d: d.update(intermediate_size=72)),
                 ValueError, "in_features K=72 is not a multiple of 16"),
    "global-nan": ("modelopt", lambda p: _edit_tensors(
        p, lambda sd: _set(sd, f"{L0}.weight_scale_2", torch.tensor(float("nan")))), ValueError,
        f"{L0}.weight_scale_2 is nan"),
    "global-inf": ("compressed-tensors", lambda p: _edit_tensors(
        p, lambda sd: _set(sd, f"{L0}.weight_global_scale", torch.tensor([float("inf")]))), ValueError,
        f"{L0}.weight_global_scale is inf"),
    "global-negative": ("modelopt", lambda p: _edit_tensors(
        p, lambda sd: _set(sd, f"{L0}.weight_scale_2", torch.tensor(-0.5))), ValueError, "is -0.5"),
    "global-zero": ("compressed-tensors", lambda p: _edit_tensors(
        p, lambda sd: _set(sd, f"{L0}.weight_global_scale", torch.tensor([0.0]))), ValueError, "is 0.0"),
    "block-nan": ("modelopt", lambda p: _edit_tensors(p, lambda sd: _scale_byte(sd, f"{L0}.weight_scale", 0x7F)),
                  ValueError, rf"{L0}.weight_scale holds NaN at \[3, 1\]"),
    "block-negative": ("compressed-tensors", lambda p: _edit_tensors(
        p, lambda sd: _scale_byte(sd, f"{L0}.weight_scale", 0xB8)), ValueError, "holds a negative value at"),
    "config-not-json": ("modelopt", lambda p: _write(p, "config.json", '{"model_type": "llama",'),
                        ValueError, r"config.json is not valid JSON"),
    "config-a-list": ("modelopt", lambda p: _write(p, "config.json", "[1, 2]"),
                      ValueError, r"config.json: expected a JSON object, got list"),
    "quant-config-a-list": ("compressed-tensors", lambda p: _edit_json(
        p, "config.json", lambda d: d.update(quantization_config=[d["quantization_config"]])),
        ValueError, "config.json: quantization_config: expected a JSON object, got list"),
    "ct-groups-a-list": ("compressed-tensors", lambda p: _edit_json(
        p, "config.json", lambda d: d["quantization_config"].update(config_groups=["group_0"])),
        ValueError, "quantization_config.config_groups: expected a JSON object, got list"),
    "ct-ignore-not-names": ("compressed-tensors", lambda p: _edit_json(
        p, "config.json", lambda d: d["quantization_config"].update(ignore="lm_head")),
        ValueError, "quantization_config.ignore: expected a JSON list, got str"),
    "hf-quant-not-json": ("modelopt", lambda p: (
        _edit_json(p, "config.json", lambda d: d.pop("quantization_config")),
        _write(p, "hf_quant_config.json", "{quantization")), ValueError, r"hf_quant_config.json is not valid JSON"),
    "index-a-list": ("modelopt", lambda p: _write(p, "model.safetensors.index.json", "[]"),
                     ValueError, r"model.safetensors.index.json: expected a JSON object, got list"),
    "truncated-safetensors": ("compressed-tensors", lambda p: _truncate(p, "model.safetensors", 0.5),
                              ValueError, r"model.safetensors is not a readable safetensors file"),
    "not-safetensors": ("modelopt", lambda p: _write(p, "model.safetensors", "hello"),
                        ValueError, r"model.safetensors is not a readable safetensors file"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_checkpoint(good, tmp_path, monkeypatch, case):
    import shutil
    fmt, edit, exc, msg = BAD[case]
    path = tmp_path / "ckpt"
    shutil.copytree(good[fmt], path)
    edit(str(path))
    placed = []
    monkeypatch.setattr(hf_load, "set_tensor", lambda *a: placed.append(a))
    with pytest.raises(exc, match=msg):
        load_nvfp4(path, device="cpu", dtype=DTYPE)
    assert not placed  # refused before any weight was read into the model


# ---- decoding --------------------------------------------------------------------------------------------------

def test_static_decoder_matches_full_forward(device):
    """StaticDecoder (masked_decode attention over the static cache) picks the argmax of a full forward of the
    sequence so far; the model's own attention is left as it was. head_dim 64: masked_decode's smallest."""
    # dense linears keep this fast on the CPU interpreter (NVFP4 layers in the decoder: the two tests below)
    model = _tiny_model(device, hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
    ids = torch.randint(0, TINY["vocab_size"], (2, 7), device=device)
    dec = StaticDecoder(model, batch=2, max_len=16, graph=False)
    out = dec.generate(ids, 3)
    assert model.config._attn_implementation == "sdpa"
    # the layers' cache lengths share one tensor with pos (one add a step), and stay what transformers' would be
    layers = dec.cache.layers
    assert all("update" in vars(la) for la in layers) and dec._counts is not None
    assert [int(la.cumulative_length) for la in layers] == [dec.length] * len(layers) == [int(dec.pos)] * len(layers)
    assert int(dec.cache.get_seq_length()) == dec.length == 9
    dec.prefill(ids[:, :5])  # a new prompt resets them
    assert [int(la.cumulative_length) for la in layers] == [5] * len(layers) and int(dec.pos) == 5
    for i in range(3):
        logits = _logits(model, out[:, :7 + i])[:, -1]
        top2 = logits.topk(2).values
        # a near-tie (within the rounding of the two attention paths, as _close's tolerance) may pick either token
        picked = logits.gather(1, out[:, 7 + i:8 + i])[:, 0]
        tie = 20 * ROUND * logits.abs().amax(-1)
        assert bool(((picked == top2[:, 0]) | (top2[:, 0] - picked <= tie)).all()), i


@pytest.mark.parametrize("V", [5, 1024, 3000])
def test_greedy_is_argmax(V):
    """StaticDecoder's two-step argmax: the first index of the maximum, as torch.argmax (ties, NaN, all -inf)."""
    from llmkernels.hf.decode import greedy
    x = torch.randn(5, V).round()  # ties
    x[1, V // 2] = x[1, V // 3] = float("nan")
    x[2] = float("-inf")
    x[3, -1] = 100.0  # in the padded last chunk
    for f in (greedy, torch.compile(greedy, fullgraph=True)):
        assert torch.equal(f(x), x.argmax(-1))
    for bad, kw in ((x[0], {}), (x[:, :0], {}), (x, {"chunk": 0}), (x, {"chunk": 2.0})):
        with pytest.raises(ValueError, match="logits must|chunk must"):
            greedy(bad, **kw)


def _check_picks(model, out, T, steps):
    """Each decoded token is the argmax of a full forward of the sequence so far, up to a near-tie (the rounding
    of the two attention paths, as _close's tolerance)."""
    for i in range(steps):
        logits = _logits(model, out[:, :T + i])[:, -1]
        top = logits.topk(1).values[:, 0]
        picked = logits.gather(1, out[:, T + i:T + i + 1])[:, 0]
        assert bool(((picked == top) | (top - picked <= 20 * ROUND * logits.abs().amax(-1))).all()), i


def test_static_decoder_compiled(device):
    """compile= puts the decode step's forward under torch.compile (here the aot_eager backend: dynamo's capture of
    the model with masked_decode's custom op, no code generation); same picks, prefill eager; a bad value refused."""
    model = _tiny_model(device, hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
    ids = torch.randint(0, TINY["vocab_size"], (2, 7), device=device)
    out = StaticDecoder(model, batch=2, max_len=16, graph=False, compile="aot_eager").generate(ids, 3)
    _check_picks(model, out, 7, 3)
    with pytest.raises(TypeError, match="compile"):
        StaticDecoder(model, batch=2, max_len=16, compile=1)


@pytest.mark.skipif(CUDA, reason="meta tensors pass the ops' device checks only under the CPU interpreter")
def test_decode_step_has_no_host_sync():
    """The decode step runs on the meta device (every tensor without data): any .item(), bool() or .tolist() of a
    device value on the way, which would break CUDA-graph capture, raises there."""
    from llmkernels.hf.bench import build
    model = build("tiny", torch.device("meta"), torch.float16, direct_nvfp4=True)
    dec = StaticDecoder(model, batch=2, max_len=16, graph=False)
    dec.prefill(torch.zeros(2, 5, dtype=torch.long, device="meta"))
    assert dec.step().device.type == "meta"


def test_bench_quick(tmp_path):
    from llmkernels.hf import bench
    assert bench.main(["--quick", "--batches", "1", "--formats", "nvfp4", "--out", str(tmp_path)]) == 0
    (f,) = tmp_path.glob("*.json")
    recs = json.load(open(f))["records"]
    assert {r["op"] for r in recs} == {"e2e_decode"}
    for r in recs:
        assert set(r["shape"]) == {"model", "batch", "format", "graph"} and r["shape"]["format"] == "nvfp4"
        assert r["ms"] > 0 and r["floor_ms"] > 0 and r["tokens_per_s"] > 0
    assert bench.main(["--quick", "--batches", "1", "--formats", "nvfp4", "--no-graph", "--compile", "aot_eager",
                       "--out", str(tmp_path)]) == 0
    recs = [r for r in json.load(open(f))["records"] if "compile" in r["shape"]]
    assert len(recs) == 1 and recs[0]["shape"]["compile"] == "aot_eager" and not recs[0]["shape"]["graph"]


@pytest.mark.gpu
def test_graph_decode_matches_eager():
    model = quantize_(_tiny_model("cuda", hidden_size=256, num_attention_heads=2, num_key_value_heads=1))
    ids = torch.randint(0, TINY["vocab_size"], (4, 9), device="cuda")
    eager = StaticDecoder(model, batch=4, max_len=32, graph=False).generate(ids, 8)
    graph = StaticDecoder(model, batch=4, max_len=32, graph=True).generate(ids, 8)
    assert torch.equal(eager, graph)
    # inductor's fusions round differently from the eager ops: the picks, up to near-ties
    _check_picks(model, StaticDecoder(model, batch=4, max_len=32, graph=True, compile=True).generate(ids, 8), 9, 8)
