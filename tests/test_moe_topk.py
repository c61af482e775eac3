"""moe_topk (ops/moe_topk): a router's softmax / top-k / renormalisation and DeepSeek-V3's grouped sigmoid routing
against the fp32 reference (torch's ops, as transformers' routers run them); ties, NaN rows, strides, errors,
torch.compile / opcheck; CUDA-graph replay on the GPU. The fused routers of hf.moe are tested in test_hf_moe.py."""
import pytest
import torch

from llmkernels import moe_topk
from llmkernels.ops.moe_topk.reference import moe_topk_ref


def _logits(T, E, dtype, device):
    # distinct probabilities well apart (no near-tie for rounding to flip): a random permutation of the values
    # (j - E / 2) / 32, exact in bf16 for E <= 512 and in fp16 for E <= 1024 (exp(1/32) - 1 >> fp32's step)
    return ((torch.stack([torch.randperm(E) for _ in range(T)]).float() - E // 2) / 32).to(device, dtype)


@pytest.mark.parametrize("T, E, k, renormalize, dtype", [
    (1, 128, 8, True, torch.float16), (5, 60, 6, False, torch.float32), (3, 256, 8, True, torch.bfloat16),
    (17, 8, 2, True, torch.float32), (2, 1000, 32, True, torch.float16), (4, 7, 7, False, torch.float16)])
def test_matches_reference(device, T, E, k, renormalize, dtype):
    x = _logits(T, E, dtype, device)
    w, i = moe_topk(x, k, renormalize, scale=1.5)
    rw, ri = moe_topk_ref(x, k, renormalize, scale=1.5)
    assert w.dtype == torch.float32 and i.dtype == torch.int64 and w.shape == i.shape == (T, k)
    assert torch.equal(i, ri)
    # fp32 softmax on both sides; exp2-based exp and the sums' order differ by a few fp32 steps
    torch.testing.assert_close(w, rw, rtol=1e-5, atol=1e-7)


def test_strided_logits_and_ties(device):
    x = _logits(6, 40, torch.float32, device).t().contiguous().t()  # column-major
    assert torch.equal(moe_topk(x, 4)[1], moe_topk_ref(x, 4)[1])
    x = _logits(3, 64, torch.float32, device)[:, ::2]  # every other expert
    assert torch.equal(moe_topk(x, 4)[1], moe_topk_ref(x, 4)[1])
    w, i = moe_topk(torch.zeros(2, 8, device=device), 3)  # all equal: lowest index first, weights 1/3
    assert i.tolist() == [[0, 1, 2]] * 2 and torch.allclose(w, torch.full_like(w, 1 / 3))


def test_nan_rows_stay_nan(device):
    x = _logits(4, 16, torch.float32, device)
    x[1, 3], x[2, 5] = float("nan"), float("inf")
    w, i = moe_topk(x, 4)
    assert torch.isnan(w[1:3]).all() and not torch.isnan(w[[0, 3]]).any()
    assert ((i >= 0) & (i < 16)).all() and i[1].tolist() == [0, 1, 2, 3]  # valid experts, so the NaN reaches y
    assert torch.equal(i[[0, 3]], moe_topk_ref(x[[0, 3]], 4)[1])


def test_empty_and_errors(device):
    w, i = moe_topk(torch.randn(0, 8, device=device), 2)
    assert w.shape == i.shape == (0, 2)
    x = torch.randn(3, 8, device=device)
    with pytest.raises(TypeError, match="logits"):
        moe_topk(x.long(), 2)
    with pytest.raises(ValueError, match="logits"):
        moe_topk(x[0], 2)
    with pytest.raises(ValueError, match="experts"):
        moe_topk(torch.randn(1, 1025, device=device), 2)
    with pytest.raises(ValueError, match="k must be <= 8"):
        moe_topk(x, 9)
    with pytest.raises(ValueError, match="k must be >= 1"):
        moe_topk(x, 0)
    with pytest.raises(TypeError, match="k must be an int"):
        moe_topk(x, True)
    with pytest.raises(TypeError, match="renormalize"):
        moe_topk(x, 2, renormalize=1)


def _sets(w, i):  # DeepSeek's top-k is unsorted: compare (index, weight) sets
    order = i.argsort(dim=-1)
    return w.gather(1, order), i.gather(1, order)


@pytest.mark.parametrize("T, E, k, n_group, topk_group, renormalize, bias, scale", [
    (3, 256, 8, 8, 4, True, True, 2.5), (2, 160, 8, 8, 3, True, True, 1.5), (4, 64, 6, 1, 1, True, True, 1.0),
    (5, 12, 3, 3, 2, False, False, 1.0), (1, 384, 8, 1, 1, True, True, 2.827)])
def test_sigmoid_grouped_matches_reference(device, T, E, k, n_group, topk_group, renormalize, bias, scale):
    """DeepSeek-V3 / GLM routing: random logits and biases (fp32 on both sides: a near-tie within ~1e-7 is
    improbable), groups of a size that is not a power of 2 (160 / 8), no groups, no bias."""
    x = torch.randn(T, E, device=device)
    b = torch.randn(E, device=device) * 0.1 if bias else None
    w, i = moe_topk(x, k, renormalize, scoring="sigmoid", bias=b, n_group=n_group, topk_group=topk_group,
                    scale=scale)
    (w, i), (rw, ri) = _sets(w, i), _sets(*moe_topk_ref(x, k, renormalize, "sigmoid", b, n_group, topk_group, scale))
    assert torch.equal(i, ri)
    torch.testing.assert_close(w, rw, rtol=1e-5, atol=1e-7)
    if n_group > 1:  # every choice from topk_group groups
        assert max(len(set(row)) for row in (i // (E // n_group)).tolist()) <= topk_group
    x[0, 1] = float("nan")
    w, i = moe_topk(x, k, renormalize, scoring="sigmoid", bias=b, n_group=n_group, topk_group=topk_group)
    assert torch.isnan(w[0]).all() and i[0].tolist() == list(range(k))


def test_sigmoid_errors(device):
    x = torch.randn(2, 64, device=device)
    with pytest.raises(ValueError, match="go with scoring='sigmoid'"):
        moe_topk(x, 4, bias=torch.zeros(64, device=device))
    with pytest.raises(ValueError, match="scoring"):
        moe_topk(x, 4, scoring="relu")
    with pytest.raises(ValueError, match="n_group must divide"):
        moe_topk(x, 4, scoring="sigmoid", n_group=3)
    with pytest.raises(ValueError, match="topk_group must be <= 4"):
        moe_topk(x, 4, scoring="sigmoid", n_group=4, topk_group=5)
    with pytest.raises(ValueError, match="k must be <= 16"):
        moe_topk(x, 17, scoring="sigmoid", n_group=8, topk_group=2)
    with pytest.raises(ValueError, match="at least 2 experts"):
        moe_topk(x, 4, scoring="sigmoid", n_group=64, topk_group=4)
    with pytest.raises(ValueError, match="bias must have one value per expert"):
        moe_topk(x, 4, scoring="sigmoid", bias=torch.zeros(63, device=device))
    with pytest.raises(TypeError, match="bias"):
        moe_topk(x, 4, scoring="sigmoid", bias=torch.zeros(64, device=device, dtype=torch.long))
    with pytest.raises(ValueError, match="scale must be finite"):
        moe_topk(x, 4, scale=float("nan"))
    moe_topk(x, 4, scoring="sigmoid", n_group=1)  # checked once: a bool equal to it (True == 1) still is an error
    with pytest.raises(TypeError, match="n_group must be an int"):
        moe_topk(x, 4, scoring="sigmoid", n_group=True)


@pytest.mark.parametrize("scoring, renormalize", [("softmax", True), ("softmax", False), ("sigmoid", True),
                                                   ("sigmoid", False)])
def test_gradient_matches_torch(device, scoring, renormalize):
    """d logits of the weights, as autograd through transformers' ops (the reference) gives them."""
    E, k = 64, 6
    kw = dict(n_group=4, topk_group=2, scale=2.5) if scoring == "sigmoid" else dict(scale=1.0)
    x = (torch.randn(5, E, device=device) if scoring == "sigmoid" else _logits(5, E, torch.float32, device))
    b = torch.randn(E, device=device) * 0.1 if scoring == "sigmoid" else None
    g = torch.randn(5, k, device=device)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    w, i = moe_topk(xa, k, renormalize, scoring=scoring, bias=b, **kw)
    rw, ri = moe_topk_ref(xb, k, renormalize, scoring, b, kw.get("n_group", 1), kw.get("topk_group", 1), kw["scale"])
    (w, i), (rw, ri) = _sets(w, i), _sets(rw, ri)
    assert torch.equal(i, ri)
    (w * g).sum().backward()
    (rw * g).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-5, atol=1e-7)


def test_compile_and_opcheck(device):
    x = _logits(3, 32, torch.float16, device)
    f = torch.compile(lambda x: moe_topk(x, 4), fullgraph=True, backend="aot_eager")
    assert torch.equal(f(x)[1], moe_topk_ref(x, 4)[1])
    torch.library.opcheck(torch.ops.llmkernels.moe_topk.default, (x, 4, True, "softmax", None, 1, 1, 1.0))
    b = torch.randn(32, device=device)
    torch.library.opcheck(torch.ops.llmkernels.moe_topk.default, (x, 4, True, "sigmoid", b, 4, 2, 2.5))
    g = torch.compile(lambda x, b: moe_topk(x, 4, scoring="sigmoid", bias=b, n_group=4, topk_group=2),
                      fullgraph=True, backend="aot_eager")
    assert torch.equal(_sets(*g(x, b))[1], _sets(*moe_topk_ref(x, 4, True, "sigmoid", b, 4, 2))[1])


@pytest.mark.gpu
def test_cuda_graph_replay():
    x = _logits(4, 128, torch.bfloat16, "cuda")
    moe_topk(x, 8)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        w, i = moe_topk(x, 8)
    x.copy_(_logits(4, 128, torch.bfloat16, "cuda"))
    g.replay()
    rw, ri = moe_topk_ref(x, 8)
    assert torch.equal(i, ri) and torch.allclose(w, rw, rtol=1e-5, atol=1e-7)
