"""dsa_index_scores (the DSA indexer's scores of a key chunk) and dsa_topk_logits (its scores at the selected keys,
differentiable) against their fp32 references."""
import pytest
import torch

from llmkernels import dsa_index_scores, dsa_topk_logits
from llmkernels.ops.dsa_indexer.reference import dsa_index_scores_ref, dsa_topk_logits_ref

CUDA = torch.cuda.is_available()
DTYPES = [torch.float16, torch.bfloat16] if CUDA else [torch.float16]  # the interpreter's bf16 dot is wrong


def _inputs(B, S, T, H, D, dtype, device, g=None):
    q = torch.randn(B, S, H, D, device=device, dtype=dtype)
    k = torch.randn(B, T, D, device=device, dtype=dtype)
    w = torch.randn(B, S, H, device=device)
    return q, k, w


# Tolerance: fp16 / bf16 products are exact in fp32; the kernel sums D products and H heads in fp32 in another order
# than the reference's fp32 einsums: ~sqrt(D H) fp32 roundings of the largest partial sums, under 1e-5 of the largest
# score here; a wrong head, weight, scale or key is O(1) of it.
def _check(out, ref):
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(out)) and torch.equal(ref[~fin], out[~fin])
    if fin.any():
        scale = ref[fin].abs().max().item()
        assert (out[fin] - ref[fin]).abs().max().item() <= 1e-5 * max(scale, 1.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B, S, T, H, D, causal, keys", [
    (2, 5, 37, 4, 32, True, (0, 37)), (1, 1, 300, 64, 128, True, (0, 300)), (2, 19, 19, 3, 16, False, (3, 17)),
    (1, 33, 70, 16, 64, True, (5, 68)), (3, 7, 129, 64, 128, True, (128, 129)), (1, 2, 40, 128, 64, True, (0, 0))])
def test_matches_reference(device, dtype, B, S, T, H, D, causal, keys):
    q, k, w = _inputs(B, S, T, H, D, dtype, device)
    pos = (torch.arange(S, device=device) + T - S)[None] if causal else None
    if causal and B > 1:  # per-sequence positions: the second sequence one token shorter
        pos = torch.stack([pos[0] - b for b in range(B)])
    out = dsa_index_scores(q, k, w, 0.09, pos, *keys)
    assert out.shape == (B, S, keys[1] - keys[0]) and out.dtype == torch.float32
    _check(out, dsa_index_scores_ref(q, k, w, 0.09, pos, *keys))


def test_views_broadcast_positions_nan(device):
    """q as a view (heads strided), k a slice of a longer cache, positions [1, S] for every sequence; NaN in a key
    gives NaN in that key's column only, NaN in a weight that query's row."""
    B, S, T, H, D = 2, 6, 50, 8, 32
    q = torch.randn(B, S, 2 * H, D, device=device, dtype=torch.float16)[:, :, ::2]
    k = torch.randn(B, T + 9, D, device=device, dtype=torch.float16)[:, 3:T + 3]
    w = torch.randn(B, S, H, device=device)
    pos = torch.arange(S, device=device, dtype=torch.int32)[None] + T - S
    _check(dsa_index_scores(q, k, w, 0.1, pos), dsa_index_scores_ref(q, k, w, 0.1, pos))
    k[1, 10], w[0, 2, 3] = float("nan"), float("nan")
    out = dsa_index_scores(q, k, w, 0.1)
    assert out[1, :, 10].isnan().all() and out[0, 2].isnan().all()
    assert not out[1, :, :10].isnan().any() and not out[0, 3:].isnan().any()


def test_errors(device):
    q, k, w = _inputs(1, 3, 10, 4, 32, torch.float16, device)
    for args, err, msg in [
        ((q.float(), k, w), TypeError, "q must have dtype"), ((q, k.half().to(torch.bfloat16), w), TypeError,
                                                                 "k must have q's dtype"),
        ((q, k[:, :, :16], w), ValueError, "k must be"), ((q, k, w[:, :, :3]), ValueError, "weights must be"),
        ((q[..., :24], k[..., :24], w), ValueError, "power of two"), ((q, k, w.half()), TypeError, "weights"),
    ]:
        with pytest.raises(err, match=msg):
            dsa_index_scores(*args, 0.1)
    with pytest.raises(ValueError, match="key_end"):
        dsa_index_scores(q, k, w, 0.1, key_end=11)
    with pytest.raises(ValueError, match="key_start"):
        dsa_index_scores(q, k, w, 0.1, key_start=-1)
    with pytest.raises(ValueError, match="sm_scale"):
        dsa_index_scores(q, k, w, 0.0)
    with pytest.raises(ValueError, match="positions must be"):
        dsa_index_scores(q, k, w, 0.1, torch.zeros(1, 4, dtype=torch.long, device=device))
    with pytest.raises(TypeError, match="positions"):
        dsa_index_scores(q, k, w, 0.1, torch.zeros(1, 3, device=device))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="torch.compile and CUDA graphs need a GPU")
def test_compile_and_graph():
    q, k, w = _inputs(1, 1, 4096, 64, 128, torch.bfloat16, "cuda")
    pos = torch.full((1, 1), 3000, device="cuda")
    want = dsa_index_scores(q, k, w, 0.1, pos)
    f = torch.compile(lambda q, k, w, p: dsa_index_scores(q, k, w, 0.1, p).topk(16).indices, fullgraph=True)
    assert torch.equal(f(q, k, w, pos), want.topk(16).indices)
    out = torch.empty_like(want)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out.copy_(dsa_index_scores(q, k, w, 0.1, pos))
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out.copy_(dsa_index_scores(q, k, w, 0.1, pos))
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B, S, T, H, D, K", [(2, 5, 37, 4, 32, 7), (1, 3, 300, 64, 128, 130), (2, 4, 19, 3, 16, 5)])
def test_topk_logits_and_gradients(device, dtype, B, S, T, H, D, K):
    """Logits and the gradients of q, k and weights against autograd through the fp32 reference, indices with -1,
    out-of-range and repeated keys (k's gradient summed over them). Tolerance: the logits as above; the backward
    multiplies in the input dtype (the per-key gradient rounded to it, as flash attention's backward rounds dS):
    4 of its roundings of the largest gradient."""
    q, k, w = _inputs(B, S, T, H, D, dtype, device)
    q, k, w = (t.requires_grad_() for t in (q, k, w))
    idx = torch.randint(-1, T + 2, (B, S, K), dtype=torch.int32, device=device)
    idx[:, :, 0] = idx[:, :, 1]  # a repeat
    out, ref = dsa_topk_logits(q, k, w, idx, 0.1), dsa_topk_logits_ref(q, k, w, idx, 0.1)
    _check(out, ref)
    assert (out[(idx < 0) | (idx >= T)] == 0).all()
    g = torch.randn_like(ref)
    ours, theirs = torch.autograd.grad(out, (q, k, w), g), torch.autograd.grad(ref, (q, k, w), g)
    eps = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    for name, a, b in zip("qkw", ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert (a.float() - b.float()).abs().max() <= 4 * eps * b.float().abs().max(), name


def test_topk_logits_errors(device):
    q, k, w = _inputs(1, 3, 10, 4, 32, torch.float16, device)
    idx = torch.zeros(1, 3, 4, dtype=torch.int32, device=device)
    with pytest.raises(TypeError, match="indices must have dtype"):
        dsa_topk_logits(q, k, w, idx.long(), 0.1)
    with pytest.raises(ValueError, match="indices must be"):
        dsa_topk_logits(q, k, w, idx[:, :2], 0.1)
    with pytest.raises(ValueError, match="weights must be"):
        dsa_topk_logits(q, k, w[:, :2], idx, 0.1)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="torch.compile needs a GPU here")
def test_topk_logits_compiled_backward():
    q, k, w = _inputs(1, 64, 512, 64, 128, torch.bfloat16, "cuda")
    idx = torch.randint(-1, 512, (1, 64, 256), dtype=torch.int32, device="cuda")
    g = torch.randn(1, 64, 256, device="cuda")

    def grads(fn):
        qq, kk, ww = (t.clone().requires_grad_() for t in (q, k, w))
        (fn(qq, kk, ww, idx) * g).sum().backward()
        return qq.grad, kk.grad, ww.grad
    eager = grads(lambda *a: dsa_topk_logits(*a, 0.1))
    compiled = grads(torch.compile(lambda *a: dsa_topk_logits(*a, 0.1), fullgraph=True))
    for a, b in zip(eager, compiled):  # k's gradient is added atomically: equal up to the order of its sums
        assert (a.float() - b.float()).abs().max() <= 2.0 ** -7 * b.float().abs().max()
