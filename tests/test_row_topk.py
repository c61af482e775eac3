"""row_topk (ops/row_topk): the positions of each row's k largest fp32 values against torch.topk (the chosen values
compared, ties may pick other positions); ties go to the lowest positions, NaN ranks highest, -inf is never chosen,
the result is the same every call (the per-stream scratch is re-armed), strided rows, errors, torch.compile /
opcheck; CUDA-graph replay and the DSA decode shape on the GPU."""
import pytest
import torch

from llmkernels import row_topk
from llmkernels.ops.row_topk.reference import row_topk_ref
from llmkernels.ops.row_topk.spec import chosen, make_inputs


def _same_choice(x, pos, k):
    """pos holds distinct positions of the values torch.topk chooses, -1 after the last (fewer above -inf)."""
    ref = row_topk_ref(x, k)
    assert pos.shape == ref.shape and pos.dtype == torch.int32
    assert torch.equal(chosen(x, pos).nan_to_num(3e38), chosen(x, ref).nan_to_num(3e38))
    for r in range(x.shape[0]):
        n = int((ref[r] >= 0).sum())
        assert len(set(pos[r, :n].tolist())) == n and bool((pos[r, n:] == -1).all())


@pytest.mark.parametrize("R, N, k", [(1, 3000, 200), (3, 5000, 64), (2, 700, 700), (1, 2049, 2048), (5, 1, 1),
                                     (2, 1025, 1), (1, 9000, 4097)])
def test_matches_topk(device, R, N, k):
    x = make_inputs(R, N, device)["x"]
    _same_choice(x, row_topk(x, k), k)


def test_ties_lowest_positions_and_same_every_call(device):
    x = make_inputs(2, 4000, device, ties=True)["x"]
    x[0, :3900] = 0  # row 0: under 100 values above 0, so the choice runs into the zeros
    a, b = row_topk(x, 300), row_topk(x, 300)
    assert torch.equal(a, b)
    _same_choice(x, a, 300)
    zeros = a[0][x[0].gather(0, a[0].long()) == 0]
    assert torch.equal(zeros, torch.arange(len(zeros), device=device, dtype=torch.int32))  # lowest first
    above = a[1][x[1].gather(0, a[1].long()) > x[1].gather(0, a[1].long()).min()]
    assert bool((above[1:] > above[:-1]).all())  # those above the k-th: ascending positions


def test_nan_inf_and_short_rows(device):
    x = make_inputs(4, 3000, device)["x"]
    x[0, 100:] = float("-inf")  # 100 values for k 150: all of them, then -1
    x[1, [5, 77]] = float("nan")  # NaN ranks highest
    x[2] = float("-inf")
    x[3, :] = 2.5
    x[3, 17] = 3.0
    p = row_topk(x, 150)
    _same_choice(x, p, 150)
    assert sorted(p[0, :100].tolist()) == list(range(100)) and bool((p[0, 100:] == -1).all())
    assert {5, 77} <= set(p[1].tolist()) and bool((p[2] == -1).all())
    assert p[3].tolist() == [17] + [i for i in range(150) if i != 17]  # then the lowest positions of 2.5


def test_strided_rows_and_extremes(device):
    x = make_inputs(4, 6000, device)["x"][::2, 1000:4000]
    _same_choice(x, row_topk(x, 77), 77)
    y = torch.randn(2, 5000, device=device) * 1e-3 + 1.0  # one first digit: the choice is in the later digits
    y[1] = -torch.rand(5000, device=device)  # all negative
    y[1, 9] = -0.0
    y[1, 10] = 0.0
    _same_choice(y, row_topk(y, 1000), 1000)


def test_errors(device):
    x = torch.randn(2, 10, device=device)
    with pytest.raises(TypeError, match="x"):
        row_topk(x.half(), 2)
    with pytest.raises(ValueError, match="x"):
        row_topk(x[0], 2)
    with pytest.raises(ValueError, match="unit stride"):
        row_topk(x.t(), 1)
    with pytest.raises(ValueError, match="k must be <= 10"):
        row_topk(x, 11)
    with pytest.raises(ValueError, match="k must be >= 1"):
        row_topk(x, 0)
    with pytest.raises(TypeError, match="k"):
        row_topk(x, 2.0)
    with pytest.raises(ValueError, match="no columns"):
        row_topk(x[:, :0], 1)


def test_compile_and_opcheck(device):
    x = make_inputs(3, 2100, device)["x"]
    f = torch.compile(lambda x: row_topk(x, 50), fullgraph=True, backend="aot_eager")
    assert torch.equal(f(x), row_topk(x, 50))
    torch.library.opcheck(torch.ops.llmkernels.row_topk.default, (x, 50))


@pytest.mark.gpu
def test_cuda_graph_replay_decode_row():
    x = make_inputs(1, 65537, "cuda")["x"]
    row_topk(x, 2048)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        p = row_topk(x, 2048)
    for ties in (False, True):
        x.copy_(make_inputs(1, 65537, "cuda", ties=ties)["x"])
        g.replay()
        _same_choice(x, p, 2048)
        assert torch.equal(p, row_topk(x, 2048))


def test_shares_the_split_scratch_and_leaves_it_zero(device):
    # eager calls take the decode kernels' per-stream scratch: its counters are all zero again after each call (the
    # split kernels' merges rely on it), whatever rows / plan the calls had; empty_cache frees it
    from llmkernels import empty_cache
    from llmkernels.ops.combine.kernel import split_scratch
    empty_cache()
    for R, N, k in ((3, 5000, 64), (1, 9000, 700), (6, 1500, 1500)):
        x = make_inputs(R, N, device, ties=R == 6)["x"]
        _same_choice(x, row_topk(x, k), k)
        assert int(split_scratch(device, 0, 0)[1].abs().sum()) == 0
    empty_cache()
