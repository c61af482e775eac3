"""Grouped NVFP4Linear layers (ops/nvfp4_gemv/fused.py): one tiled-kernel call for q / k / v or gate / up. The CPU
tests drive the grouping through the op's portable path (the stacked call on the CPU is each part's own product);
the GPU tests check the stacked kernel against the fp32 reference."""
import pytest
import torch

from llmkernels import NVFP4Linear
from llmkernels.checking import graph_replay, rel_err
from llmkernels.ops.nvfp4 import fused
from llmkernels.ops.nvfp4.fused import NVFP4Group, group_linears, ungroup_linears
from llmkernels.ops.nvfp4.reference import nvfp4_linear_ref
from llmkernels.ops.nvfp4.spec import LINEAR_TOL, random_scales
from llmkernels.ops.nvfp4.tiled import MMA_MAX_T


def _layer(N, K, dev, bias, gs):
    m = NVFP4Linear(K, N, bias=bias, device=dev)
    m.set_weight(torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=dev),
                 random_scales((N, K // 16), dev, 0x08, 0x60))
    m.global_scale.fill_(gs)
    if bias:
        m.bias.normal_()
    return m


def _parts(Ns, K, dev, bias=False):
    return [_layer(N, K, dev, bias, 0.25 + 0.5 * i) for i, N in enumerate(Ns)]  # a global scale per part


def _ref(m, x):
    packed, scales = m.plain_weight()
    return nvfp4_linear_ref(x, packed, scales, m.global_scale, m.bias)


@pytest.fixture
def stacked(monkeypatch, device):
    """Counts the group's stacked computations: "eager" (NVFP4Group._stacked, where a call stacks the parts) and
    "run" (the op's _parts, what a compiled graph runs). On the CPU the groups take their stacked path too (there
    each part's product, concatenated); on a GPU the tiled kernel's."""
    if device.type == "cpu":
        monkeypatch.setattr(NVFP4Group, "_usable", staticmethod(lambda x: isinstance(x, torch.Tensor) and x.dim() > 0))
    calls = {"eager": 0, "run": 0}
    parts, stacked_ = fused._parts, NVFP4Group._stacked

    def count(kind, f):
        def wrapped(*a, **k):
            if not torch.compiler.is_compiling():
                calls[kind] += 1
            return f(*a, **k)
        return wrapped
    monkeypatch.setattr(fused, "_parts", count("run", parts))
    monkeypatch.setattr(NVFP4Group, "_stacked", count("eager", stacked_))
    return calls


def _same(out, ref):
    """Equal on the CPU (the stacked call is each part's own product there); on a GPU the stacked kernel sums in
    another order than each part's own call: within the linear's tolerance."""
    if out.device.type == "cpu":
        return torch.equal(out, ref)
    return out.shape == ref.shape and rel_err(out, ref) <= LINEAR_TOL[out.dtype]


def test_group_checks_parts():
    a, b = _parts((16, 32), 256, "cpu")
    with pytest.raises(TypeError, match="NVFP4Linear"):
        group_linears(a, torch.nn.Linear(256, 16))
    with pytest.raises(TypeError, match="2 or 3"):
        group_linears(a)
    with pytest.raises(ValueError, match="in_features"):
        group_linears(a, _layer(16, 512, "cpu", False, 1.0))
    with pytest.raises(ValueError, match="bias"):
        group_linears(a, _layer(16, 256, "cpu", True, 1.0))
    with pytest.raises(ValueError, match="tiled"):
        group_linears(a, _layer(24, 256, "cpu", False, 1.0))  # 24 rows: not tileable
    group_linears(a, b)
    with pytest.raises(ValueError, match="ungrouped"):
        group_linears(b, _layer(16, 256, "cpu", False, 1.0))
    ungroup_linears(a, b)
    assert a.group is None and b.group is None


def test_group_falls_back_where_the_kernel_cannot_run(device):
    # more tokens than the stacked kernel takes (and, on the CPU, the interpreter): each part alone, values unchanged
    parts = _parts((16, 32, 48), 256, device, bias=True)
    x = torch.randn(MMA_MAX_T + 1, 256, device=device).half()
    alone = [m(x) for m in parts]
    group_linears(*parts)
    for m, y in zip(parts, alone):
        assert torch.equal(m(x), y)


def test_group_stacked_call_eager(stacked, device):
    parts = _parts((16, 32, 48), 256, device, bias=True)
    x = torch.randn(2, 1, 256, device=device).half()
    alone = [m(x) for m in parts]
    group_linears(*parts)
    ys = [m(x) for m in parts]
    assert stacked["eager"] == 1  # one stacked call for the three
    assert all(_same(y, a) for y, a in zip(ys, alone)) and ys[0].shape == (2, 1, 16)
    assert ys[1].untyped_storage().data_ptr() == ys[0].untyped_storage().data_ptr()
    # a different input object, or the same one changed in place, is computed afresh
    parts[0](x)
    x.mul_(2)
    assert _same(parts[1](x), parts[1].forward_alone(x)) and stacked["eager"] == 3
    parts[2](x.clone())
    assert stacked["eager"] == 4
    # bad input gets the module's own errors
    with pytest.raises(ValueError, match="in_features"):
        parts[0](torch.randn(2, 128, device=device).half())
    with pytest.raises(TypeError):
        parts[0](torch.randn(2, 256, device=device).int())


def test_group_under_compile(stacked, device):
    parts = _parts((16, 32), 256, device)
    group_linears(*parts)

    def f(x):
        return parts[0](x).float().sum(-1) + parts[1](x).float().sum(-1)

    x = torch.randn(3, 256, device=device).half()
    want = f(x)
    got = torch.compile(f, fullgraph=True)(x)
    assert torch.equal(got, want) if device.type == "cpu" else rel_err(got, want) <= 1e-5  # one call, the same one
    stacked["run"] = 0
    torch.compile(f, fullgraph=True)(x)
    assert stacked["run"] == 1
    assert parts[0].group.stash is None


def test_group_state_dict_unchanged():
    parts = _parts((16, 32), 256, "cpu")
    before = [m.state_dict() for m in parts]
    group_linears(*parts)
    for m, sd in zip(parts, before):
        after = m.state_dict()
        assert after.keys() == sd.keys() and all(torch.equal(after[k], sd[k]) for k in sd)


def _silu_mul_ref(gate, up, x):
    return torch.nn.functional.silu(_ref(gate, x)) * _ref(up, x)


def test_silu_mul(stacked, device):
    gate, up = _parts((32, 32), 256, device, bias=True)
    x = torch.randn(2, 1, 256, device=device).half()
    want = torch.nn.functional.silu(gate(x)) * up(x)
    g = group_linears(gate, up)
    stacked["eager"] = 0
    assert _same(g.silu_mul(x), want) and stacked["eager"] == 1
    assert _same(torch.compile(g.silu_mul, fullgraph=True)(x), want)
    ungroup_linears(gate, up)
    for parts in (_parts((32, 16), 256, device), _parts((16, 16, 16), 256, device)):
        with pytest.raises(ValueError, match="2 parts with the same out_features"):
            group_linears(*parts).silu_mul(x)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T,N,K,bias", [(1, 14336, 4096, False), (3, 48, 512, True), (8, 1040, 4352, False),
                                        (9, 96, 1024, True), (16, 14336, 4096, False), (5, 16, 256, True)])
def test_gpu_silu_mul_kernel(dtype, T, N, K, bias):
    """The GLU epilogue against silu(gate) * up of the fp32 references: one rounding of a product of two values each
    within the linear's accumulation error, so the linear's tolerance (odd block counts: 1040 rows = 65 blocks).
    Global scales 2^-8, 2^-7 keep the products (~1e6 at _parts' scales) within fp16's range."""
    dev = torch.device("cuda")
    gate, up = _parts((N, N), K, dev, bias)
    gate.global_scale.fill_(2 ** -8)
    up.global_scale.fill_(2 ** -7)
    xs = torch.randn(T, K + 64, device=dev).to(dtype)[:, :K]  # strided rows
    ref = _silu_mul_ref(gate, up, xs)
    y = group_linears(gate, up).silu_mul(xs)
    assert y.shape == (T, N) and y.dtype == dtype
    assert rel_err(y, ref) <= LINEAR_TOL[dtype]


@pytest.mark.gpu
def test_gpu_silu_mul_nan_graph_compile():
    dev = torch.device("cuda")
    gate, up = _parts((64, 64), 512, dev, bias=True)
    s = up.plain_weight()[1].view(torch.uint8).clone()
    s[3, 5] = 0x7F  # e4m3 NaN: up's row 3
    up.set_weight(up.plain_weight()[0], s.view(torch.float8_e4m3fn))
    g = group_linears(gate, up)
    x = torch.randn(4, 512, device=dev).bfloat16()
    y = g.silu_mul(x)
    assert torch.isnan(y[:, 3]).all() and torch.isnan(y).sum() == 4
    x[2, 100] = float("nan")
    assert torch.isnan(g.silu_mul(x)[2]).all()
    x = torch.randn(1, 1, 512, device=dev).bfloat16()
    gate.global_scale.fill_(2.0)
    up.set_weight(gate.plain_weight()[0], gate.plain_weight()[1])
    y0 = g.silu_mul(x)
    assert rel_err(y0, _silu_mul_ref(gate, up, x.view(1, 512)).view(1, 1, -1)) <= LINEAR_TOL[torch.bfloat16]
    assert torch.equal(graph_replay(lambda: g.silu_mul(x)), y0)
    assert torch.equal(torch.compile(g.silu_mul, fullgraph=True)(x), y0)
    xp = torch.randn(40, 512, device=dev).bfloat16()  # 17+ tokens: each part alone, torch's silu
    assert torch.equal(g.silu_mul(xp), torch.nn.functional.silu(gate.forward_alone(xp)) * up.forward_alone(xp))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T,Ns,K,bias", [(1, (4096, 1024, 1024), 4096, False), (3, (48, 16), 512, True),
                                         (8, (14336, 14336), 4096, False), (9, (96, 32, 32), 1024, True),
                                         (16, (1040, 256), 4352, False), (5, (16, 16, 16), 256, True)])
def test_gpu_stacked_kernel(dtype, T, Ns, K, bias):
    dev = torch.device("cuda")
    parts = _parts(Ns, K, dev, bias)
    xs = torch.randn(T, K + 64, device=dev).to(dtype)[:, :K]  # strided rows
    refs = [_ref(m, xs) for m in parts]
    group_linears(*parts)
    ys = [m(xs) for m in parts]
    for y, r in zip(ys, refs):
        assert rel_err(y, r) <= LINEAR_TOL[dtype]
    assert ys[-1].untyped_storage().data_ptr() == ys[0].untyped_storage().data_ptr()  # one call


@pytest.mark.gpu
def test_gpu_stacked_nan_stays_in_its_part():
    dev = torch.device("cuda")
    parts = _parts((32, 16, 16), 512, dev)
    s = parts[1].plain_weight()[1].view(torch.uint8).clone()
    s[3, 5] = 0x7F  # e4m3 NaN: part 1's row 3
    parts[1].set_weight(parts[1].plain_weight()[0], s.view(torch.float8_e4m3fn))
    parts[2].global_scale.fill_(float("nan"))
    group_linears(*parts)
    x = torch.randn(4, 512, device=dev).bfloat16()
    x2 = x.clone()
    x2[2, 100] = float("nan")
    y0, y1, y2 = (m(x) for m in parts)
    assert not torch.isnan(y0).any() and torch.isnan(y1[:, 3]).all() and torch.isnan(y2).all()
    assert torch.isnan(y1).sum() == 4
    assert torch.isnan(parts[0](x2)[2]).all()


@pytest.mark.gpu
def test_gpu_stacked_graph_and_compile():
    dev = torch.device("cuda")
    parts = _parts((512, 128, 128), 1024, dev, bias=True)
    group_linears(*parts)
    x = torch.randn(1, 1, 1024, device=dev).bfloat16()

    def f(x):
        return torch.cat([m(x) for m in parts], -1)

    y0 = f(x)
    assert rel_err(y0, torch.cat([_ref(m, x.view(1, 1024)) for m in parts], -1).view(1, 1, -1)) \
        <= LINEAR_TOL[torch.bfloat16]
    assert torch.equal(graph_replay(lambda: f(x)), y0)
    assert torch.equal(torch.compile(f, fullgraph=True)(x), y0)
    # 17+ tokens: each part alone (prefill kernel), values as before grouping
    xp = torch.randn(40, 1024, device=dev).bfloat16()
    ungrouped = [m.forward_alone(xp) for m in parts]
    assert all(torch.equal(m(xp), y) for m, y in zip(parts, ungrouped))
