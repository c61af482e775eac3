"""A NaN in any input propagates to the outputs as in the fp32 reference; it never becomes an "empty row".

Each test puts a NaN where the op reads it (a query, a kept key or value, a partial lse, an indexed kv row) and
one where the op must not read it (a dropped token, an unindexed kv row), then checks that the NaN pattern of
every output equals the reference's and that the finite entries match it. CPU: interpreter (its max propagates
NaN); GPU: the compiled kernels (max.f32 drops NaN, so these tests pin the other path).
"""
import pytest
import torch

from llmkernels import (indexer_kl_loss, masked_decode, merge_attention_states, nvfp4_linear, nvfp4_quantize,
                        sparse_mla, sparse_mla_attn_dist, sparse_mla_bwd, xl_paged_decode)
from llmkernels.checking import rel_err
from llmkernels.ops.combine.reference import merge_attention_states_ref
from llmkernels.ops.masked_decode.reference import masked_decode_ref
from llmkernels.ops.nvfp4.format import nvfp4_dequantize
from llmkernels.ops.sparse_mla.common import prepare
from llmkernels.ops.sparse_mla.reference import (indexer_kl_loss_ref, sparse_mla_attn_dist_ref,
                                                 sparse_mla_fwd_ref)
from llmkernels.ops.xl_paged_decode.spec import make_inputs as xl_inputs, ref as xl_ref

NAN = float("nan")
TOL = 2e-2  # fp16 inputs, fp32 accumulation: the finite entries only need to show they are the same function


def _dtype(device):
    return torch.bfloat16 if device.type == "cuda" else torch.float16


def _same(got, ref, name):
    """Same NaN pattern, and the finite entries agree with the reference."""
    assert torch.equal(got.isnan(), ref.isnan()), f"{name}: NaN at {got.isnan().nonzero().tolist()}, " \
                                                  f"reference at {ref.isnan().nonzero().tolist()}"
    ok = ~ref.isnan()
    assert rel_err(got[ok], ref[ok]) <= TOL, (name, rel_err(got[ok], ref[ok]))


@pytest.mark.parametrize("where", ["q", "k", "v", "dropped_k", "all_q"])
def test_masked_decode(device, where):
    dt = _dtype(device)
    B, Hq, Hkv, L, D = 3, 4, 2, 45, 64
    q = torch.randn(B, Hq, D, device=device).to(dt)
    k = torch.randn(B, Hkv, L, D, device=device).to(dt)
    v = torch.randn(B, Hkv, L, D, device=device).to(dt)
    drop = torch.rand(B, Hkv, L, device=device) < 0.3
    drop[2, 1] = True  # an empty row beside the NaN ones: it must stay out 0 / lse -inf
    drop[0, 0, 7] = False
    drop[1, 1, 3] = True
    {"q": lambda: q[0, 1].__setitem__(5, NAN), "k": lambda: k[0, 0, 7].__setitem__(2, NAN),
     "v": lambda: v[0, 0, 7].__setitem__(9, NAN), "dropped_k": lambda: k[1, 1, 3].__setitem__(0, NAN),
     "all_q": lambda: q[1].fill_(NAN)}[where]()
    out, lse = masked_decode(q, k, v, drop_mask=drop)
    ro, rl = masked_decode_ref(q, k, v, drop_mask=drop)
    assert ro.isnan().any() == (where != "dropped_k")
    _same(out.float(), ro, "out")
    _same(lse, rl, "lse")
    assert torch.all(out[2, 2:] == 0) and torch.all(lse[2, 2:] == -float("inf"))


@pytest.mark.parametrize("where", ["lse", "out", "all_lse"])
def test_merge_attention_states(device, where):
    S, R, D = 3, 5, 32
    outs = torch.randn(S, R, D, device=device)
    lses = torch.randn(S, R, device=device)
    lses[:, 4] = -float("inf")  # a row no part saw
    {"lse": lambda: lses[1].__setitem__(2, NAN), "out": lambda: outs[0, 3].__setitem__(7, NAN),
     "all_lse": lambda: lses[:, 1].fill_(NAN)}[where]()
    out, lse = merge_attention_states(outs, lses)
    ro, rl = merge_attention_states_ref(outs, lses)
    assert ro.isnan().any()
    _same(out, ro, "out")
    _same(lse, rl, "lse")
    assert torch.all(out[4] == 0) and lse[4] == -float("inf")


@pytest.mark.parametrize("where", ["q", "k", "v", "u", "bd", "past_context"])
@pytest.mark.parametrize("layout", ["nhd", "legacy"])
def test_xl_paged_decode(device, where, layout):
    dt = torch.float16
    x = xl_inputs(3, 4, 2, 64, 16, [37, 20, 0], layout, dt, device, u="seq", bd="contig")
    k, v = x["k_cache"], x["v_cache"]
    blk0, blk1 = int(x["block_tables"][0, 0]), int(x["block_tables"][1, 1])  # attended: seq 0 slot 2, seq 1 slot 3
    if where == "q":
        x["q"][0, 1, 4] = NAN
    elif where == "u":
        x["u"][1, 3, 0] = NAN
    elif where == "bd":
        x["bd"][0, 2, 5] = NAN
    elif where == "past_context":
        x["bd"][1, 0, 30] = NAN  # token 30 of a 20-token context: never attended
    elif layout == "nhd":
        (k if where == "k" else v)[blk0, 2, 1, 3] = NAN
    elif where == "k":  # legacy k [nb, Hkv, D/x, bs, x]
        k[blk1, 0, 1, 3, 2] = NAN
    else:  # legacy v [nb, Hkv, D, bs]
        v[blk1, 0, 5, 3] = NAN
    out, lse = xl_paged_decode(x["q"], k, v, x["block_tables"], x["context_lens"], u=x["u"], bd=x["bd"],
                               return_lse=True)
    ro, rl = xl_ref(x)
    assert ro.isnan().any() == (where != "past_context")
    _same(out.float(), ro, "out")
    _same(lse, rl, "lse")
    assert torch.all(lse[2] == -float("inf"))  # the empty sequence stays empty


def _mla_inputs(device, s_q=4, s_kv=50, h_q=16, topk=40):
    dt = _dtype(device)
    q = torch.randn(s_q, h_q, 576, device=device).to(dt)
    kv = torch.randn(s_kv, 1, 576, device=device).to(dt)
    idx = torch.randint(0, s_kv, (s_q, topk), dtype=torch.int32, device=device)
    idx[3] = -1  # a row with no valid index: out 0, max_logits -inf, lse +inf
    return q, kv, idx


def _poke(q, kv, idx, where):
    if where == "q":
        q[0, 2, 100] = NAN
    elif where == "q_row":  # every logit of a row NaN: the GPU's max stays -inf, the row must not look empty
        q[1].fill_(NAN)
    elif where == "kv":  # a kv row that row 2 lists: every head of row 2
        kv[int(idx[2, 5]), 0, 300] = NAN
    else:  # "unlisted": a kv row no row lists is never read
        listed = set(idx[:3].flatten().tolist())
        kv[next(t for t in range(kv.shape[0]) if t not in listed), 0, 0] = NAN


@pytest.mark.parametrize("where", ["q", "q_row", "kv", "unlisted"])
def test_sparse_mla(device, where):
    q, kv, idx = _mla_inputs(device, s_kv=200)
    _poke(q, kv, idx, where)
    got = sparse_mla(q, kv, idx, 0.05)
    ref = sparse_mla_fwd_ref(q, kv, idx, 0.05)
    assert ref[0].isnan().any() == (where != "unlisted")
    for g, r, name in zip(got, ref, ("out", "max_logits", "lse")):
        _same(g.float(), r, name)
    o, m, l = got
    assert torch.all(o[3] == 0) and torch.all(m[3] == -float("inf")) and torch.all(l[3] == float("inf"))


@pytest.mark.gpu
@pytest.mark.parametrize("tail", [0, 1])
@pytest.mark.parametrize("where", ["q_row", "kv"])
def test_sparse_mla_wgmma_paths(where, tail):
    """The sm_90 kernel's unsplit epilogue (TAIL 0) and its split last wave + merge (TAIL 1)."""
    from llmkernels.ops.sparse_mla.wgmma_common import wgmma_usable
    from llmkernels.ops.sparse_mla.fwd_wgmma import sparse_mla_fwd_ws_launch
    q, kv, idx = _mla_inputs(torch.device("cuda"), s_q=8, s_kv=2000, h_q=64, topk=512)
    _poke(q, kv, idx, where)
    a = prepare(q, kv, idx, 0.05)
    if not wgmma_usable(a):
        pytest.skip("not an sm_90 device")
    got = [torch.full((8, 64, 512), NAN, dtype=q.dtype, device="cuda")] + \
          [torch.full((8, 64), NAN, device="cuda") for _ in range(2)]
    sparse_mla_fwd_ws_launch(a, *got, config={"TAIL": tail})
    for g, r, name in zip(got, sparse_mla_fwd_ref(q, kv, idx, 0.05), ("out", "max_logits", "lse")):
        _same(g.float(), r, name)


@pytest.mark.parametrize("where", ["kv", "lse", "unlisted"])
def test_attn_dist_and_kl_loss(device, where):
    q, kv, idx = _mla_inputs(device, s_kv=200)
    _, _, lse = sparse_mla(q, kv, idx, 0.05)
    if where == "lse":
        lse[1, 4] = NAN
    else:
        _poke(q, kv, idx, where)
    dist = sparse_mla_attn_dist(q, kv, idx, lse, 0.05)
    ref = sparse_mla_attn_dist_ref(q, kv, idx, lse, 0.05)
    assert ref.isnan().any() == (where != "unlisted")
    _same(dist, ref, "attn_dist")
    logits = torch.randn(idx.shape, device=device)
    loss = indexer_kl_loss(logits, q, kv, idx, lse, 0.05)
    assert loss.isnan() == indexer_kl_loss_ref(logits, q, kv, idx, lse, 0.05).isnan() == (where != "unlisted")


@pytest.mark.parametrize("where", ["dout", "kv"])
def test_sparse_mla_bwd(device, where):
    q, kv, idx = _mla_inputs(device, s_kv=200)
    out, _, lse = sparse_mla(q, kv, idx, 0.05)
    dout = torch.randn_like(out)
    if where == "dout":
        dout[0, 3, 11] = NAN  # row 0, head 3: its dq row and the kv rows row 0 lists
    else:
        _poke(q, kv, idx, "kv")
        out, _, lse = sparse_mla(q, kv, idx, 0.05)
    dq, dkv = sparse_mla_bwd(q, kv, out, dout, idx, lse, 0.05)
    qr, kvr = q.float().requires_grad_(), kv.float().requires_grad_()
    ro, _, _ = sparse_mla_fwd_ref(qr, kvr, idx, 0.05)
    ro.backward(dout.float())
    assert qr.grad.isnan().any() and kvr.grad.isnan().any()
    _same(dq.float(), qr.grad, "dq")
    _same(dkv.float(), kvr.grad, "dkv")


def test_nvfp4_linear(device):
    dt = torch.float16
    packed, scales, gs = nvfp4_quantize(torch.randn(24, 64, device=device))
    x = torch.randn(3, 64, device=device).to(dt)
    x[1, 10] = NAN
    for xi in (x, torch.cat([x] * 7)):  # the fused kernel (T <= 16) and the dequantize + matmul path
        y = nvfp4_linear(xi, packed, scales, gs)
        ref = xi.float() @ nvfp4_dequantize(packed, scales, gs).t()
        _same(y.float(), ref, "y")
        assert y[1].isnan().all() and not y[0].isnan().any()
