"""Cached launch plans (llmkernels/_launch.py) are never reused across a change that matters.

Each op is called in turn with variants that share most properties with the call before (so a stale plan would be
found if the key missed something): another shape, dtype, stride, 16-byte alignment or scalar. Every result must
match the fp32 reference, and a bad input after a good call with the same shapes must still raise.
"""
import pytest
import torch

from llmkernels import (merge_attention_states, masked_decode, nvfp4_gemv, nvfp4_linear, nvfp4_quantize,
                        sparse_mla, sparse_mla_attn_dist, sparse_mla_bwd)
from llmkernels.checking import rel_err
from llmkernels.ops.combine.reference import merge_attention_states_ref
from llmkernels.ops.masked_decode.reference import masked_decode_ref
from llmkernels.ops.nvfp4.format import nvfp4_dequantize
from llmkernels.ops.nvfp4.reference import nvfp4_gemv_ref
from llmkernels.ops.nvfp4.spec import make_inputs as gemv_inputs
from llmkernels.ops.sparse_mla.reference import sparse_mla_attn_dist_ref, sparse_mla_fwd_ref
from llmkernels.ops.xl_paged_decode.spec import make_inputs as xl_inputs, ref as xl_ref, run as xl_run

TOL = 1e-2  # fp16 inputs (bf16 on the GPU for the sparse MLA ops), fp32 accumulation; a stale plan is far off


def _low(device):
    return torch.bfloat16 if device.type == "cuda" else torch.float16


def _shifted(t):
    """The same values in a view whose data pointer is 2 bytes past a 16-byte boundary."""
    buf = torch.empty(t.numel() + 8, dtype=t.dtype, device=t.device)
    v = buf[1:1 + t.numel()].view(t.shape)
    v.copy_(t)
    return v


def test_masked_decode(device):
    dt = _low(device)

    def case(B, Hkv, G, L, D, drop=True, lens=None, k_view=False, shift=False, dtype=dt):
        q = torch.randn(B, Hkv * G, D, device=device).to(dtype)
        big = torch.randn(B, Hkv, L + 9, D, device=device).to(dtype)
        k = big[:, :, 3:3 + L] if k_view else big[:, :, :L].contiguous()
        v = torch.randn(B, Hkv, L, D, device=device).to(dtype)
        q = _shifted(q) if shift else q
        dm = torch.rand(B, Hkv, L, device=device) < 0.4 if drop else None
        out, lse = masked_decode(q, k, v, dm, kv_len=lens)
        ro, rl = masked_decode_ref(q, k, v, dm, lens)
        assert rel_err(out, ro) <= TOL and rel_err(lse, rl) <= TOL

    case(2, 2, 2, 70, 64)
    case(2, 2, 2, 71, 64)                                   # shape
    case(2, 2, 2, 70, 64, drop=False)                       # an optional tensor absent
    case(2, 2, 2, 70, 64, k_view=True)                      # stride
    case(2, 2, 2, 70, 64, shift=True)                       # alignment
    case(2, 2, 2, 70, 64, lens=30)                          # a scalar
    case(2, 2, 2, 70, 64, lens=torch.tensor([5, 70], dtype=torch.int32, device=device))
    case(2, 2, 2, 70, 64, lens=torch.tensor([5, 2 ** 32 + 3], dtype=torch.int64, device=device))  # dtype
    case(2, 2, 2, 70, 128)                                  # head dim
    q = torch.randn(2, 4, 64, device=device).to(dt)
    k = torch.randn(2, 2, 70, 64, device=device).to(dt)
    masked_decode(q, k, k, kv_len=30)
    with pytest.raises(ValueError, match="kv_len must be in"):
        masked_decode(q, k, k, kv_len=71)
    with pytest.raises(TypeError, match="kv_len must be None, an int"):
        masked_decode(q, k, k, kv_len=30.0)


def test_merge_attention_states(device):
    def case(S, R, D, dtype=torch.float16, ldtype=torch.float32, as_list=False):
        outs = torch.randn(S, R, D, device=device).to(dtype)
        lses = torch.randn(S, R, device=device).to(ldtype)
        lses[0, 0] = float("inf")
        o, l = merge_attention_states(list(outs) if as_list else outs, list(lses) if as_list else lses)
        ro, rl = merge_attention_states_ref(outs, lses)
        assert o.dtype == dtype and rel_err(o, ro) <= TOL and rel_err(l, rl) <= TOL

    case(2, 5, 32)
    case(3, 5, 32)                                          # parts
    case(2, 5, 32, dtype=torch.float32)                     # dtype
    case(2, 5, 32, ldtype=torch.float16)
    case(2, 5, 32, as_list=True)                            # two parts in place (no stack)
    case(2, 7, 32, as_list=True)                            # shape
    case(2, 7, 32, ldtype=torch.float16, as_list=True)      # lse dtype
    case(2, 7, 48, dtype=torch.bfloat16, as_list=True)      # D and out dtype
    case(3, 7, 48, as_list=True)                            # three parts (stacked)
    with pytest.raises(ValueError, match="lses must have shape"):
        merge_attention_states(torch.randn(2, 5, 32, device=device), torch.randn(2, 4, device=device))


def test_xl_paged_decode(device):
    def case(layout, dtype, ctx, u="head", bd="strided", D=64):
        x = xl_inputs(3, 4, 2, D, 16, ctx, layout, dtype, device, u=u, bd=bd)
        o, lse = xl_run(x, return_lse=True)
        ro, rl = xl_ref(x)
        assert rel_err(o, ro) <= TOL and rel_err(lse, rl) <= TOL

    case("nhd", torch.float16, [37, 1, 0])
    case("nhd", torch.float16, [37, 1, 0], bd="contig")    # stride
    case("nhd", torch.float32, [37, 1, 0])                 # dtype
    case("legacy", torch.float16, [37, 1, 0])              # layout
    case("nhd", torch.float16, [50, 20, 3], u=None)         # shape, optional tensor
    case("nhd", torch.float16, [37, 1, 0], D=128)


def _mla(device, s_q=3, s_kv=40, h_q=16, topk=24):
    q = torch.randn(s_q, h_q, 576, device=device).to(_low(device))
    kv = torch.randn(s_kv, 1, 576, device=device).to(_low(device))
    idx = torch.randint(-2, s_kv + 2, (s_q, topk), dtype=torch.int32, device=device)
    return q, kv, idx


def test_sparse_mla(device):
    def case(q, kv, idx, **kw):
        got = sparse_mla(q, kv, idx, 0.07, **kw)
        ref = sparse_mla_fwd_ref(q, kv, idx, 0.07, **kw)
        assert all(rel_err(g, r) <= TOL for g, r in zip(got, ref))
        lse = got[2]
        assert rel_err(sparse_mla_attn_dist(q, kv, idx, lse, 0.07, q_start=kw.get("q_start")),
                       sparse_mla_attn_dist_ref(q, kv, idx, lse, 0.07, q_start=kw.get("q_start"))) <= TOL

    q, kv, idx = _mla(device)
    case(q, kv, idx)
    case(*_mla(device, topk=25))                            # shape
    case(q, kv, idx, q_start=37)                            # a scalar
    case(q, kv, idx, q_start=30)
    case(q, kv, idx, q_start=torch.tensor([30], dtype=torch.int32, device=device))
    case(q, kv[:, 0], idx)                                  # kv's rank
    case(_shifted(q), kv, idx)                              # alignment
    wide = torch.randn(3, 16, 600, device=device).to(q.dtype)
    wide[..., :576] = q
    case(wide[..., :576], kv, idx)                          # stride
    case(q, kv, idx, attn_sink=torch.randn(16, device=device))
    with pytest.raises(ValueError, match="q_start must be >= 0"):
        sparse_mla(q, kv, idx, 0.07, q_start=-1)


def test_sparse_mla_bwd(device):
    def case(q, kv, idx, **kw):
        out, _, lse = sparse_mla(q, kv, idx, 0.07, **kw)
        dout = torch.randn_like(out)
        dq, dkv = sparse_mla_bwd(q, kv, out, dout, idx, lse, 0.07, **kw)
        qr, kvr = q.float().requires_grad_(), kv.float().requires_grad_()
        sparse_mla_fwd_ref(qr, kvr, idx, 0.07, **kw)[0].backward(dout.float())
        # fp16 inputs, P rounded to fp16 before dV / dP: a few units of fp16 rounding (test_sparse_mla_bwd.py)
        assert rel_err(dq, qr.grad) <= 2e-2 and rel_err(dkv, kvr.grad) <= 2e-2

    q, kv, idx = _mla(device)
    case(q, kv, idx)
    case(q, kv, idx, q_start=35)
    case(*_mla(device, s_q=4))


def test_nvfp4(device):
    def linear(T, K, N, dtype=torch.float16, gs=None, bias=None, x_view=False):
        w = torch.randn(N, K, device=device)
        p, s, g = nvfp4_quantize(w)
        x = torch.randn(T, K + 8 if x_view else K, device=device).to(dtype)
        x = x[:, :K] if x_view else x
        gs = g if gs is None else gs
        y = nvfp4_linear(x, p, s, gs, bias)
        ref = x.float() @ nvfp4_dequantize(p, s, gs).t() + (bias.float() if bias is not None else 0)
        assert rel_err(y, ref) <= TOL

    linear(3, 64, 24)
    linear(3, 64, 24, gs=0.5)                               # a number (its fp32 tensor is kept with the plan)
    linear(3, 64, 24, gs=0.25)
    linear(3, 64, 24, gs=torch.tensor(0.5, device=device))
    linear(3, 64, 24, x_view=True)                          # stride
    linear(3, 64, 24, bias=torch.randn(24, device=device))  # optional tensor
    linear(20, 64, 24, dtype=torch.bfloat16)                # shape and dtype (T > 16: dequantize + matmul)
    with pytest.raises(ValueError, match="global_scale must be"):
        linear(3, 64, 24, gs=-0.5)

    def gemv(M, K, L, out=False):
        x = gemv_inputs(M, K, L, device, n_pad=1)
        c = nvfp4_gemv(x["a"], x["b"], x["sfa"], x["sfb"], out=x["c"] if out else None)
        assert rel_err(c, nvfp4_gemv_ref(x["a"], x["b"], x["sfa"], x["sfb"])) <= 2e-3

    gemv(8, 64, 1)
    gemv(8, 64, 2)
    gemv(8, 64, 2, out=True)
    gemv(9, 32, 2)


def test_repeated_calls_with_fresh_data(device):
    """The same key three times with fresh values: on sm_90 the second and third calls take the kept plans on the raw
    tensors (3-d kv and indices, a q_start tensor, a sink, topk_length), which must read this call's data."""
    dt = _low(device)
    for _ in range(3):
        q, kv, idx = _mla(device, s_q=5, h_q=64, topk=32)
        idx3 = idx[:, None]
        kw = dict(attn_sink=torch.randn(64, device=device),
                  q_start=torch.tensor([30], dtype=torch.int32, device=device),
                  topk_length=torch.tensor([32, 7, 0, 20, 31], dtype=torch.int32, device=device))
        got = sparse_mla(q, kv, idx3, 0.07, **kw)
        ref = sparse_mla_fwd_ref(q, kv, idx, 0.07, **kw)
        assert all(rel_err(g, r) <= TOL for g, r in zip(got, ref))
        dist_kw = dict(q_start=kw["q_start"], topk_length=kw["topk_length"])
        assert rel_err(sparse_mla_attn_dist(q, kv, idx3, got[2], 0.07, **dist_kw),
                       sparse_mla_attn_dist_ref(q, kv, idx, got[2], 0.07, **dist_kw)) <= TOL
        dout = torch.randn_like(got[0])
        dq, dkv, dsink = sparse_mla_bwd(q, kv, got[0], dout, idx3, got[2], 0.07, **kw)
        qr, kvr = q.float().requires_grad_(), kv.float().requires_grad_()
        sink = kw["attn_sink"].clone().requires_grad_()
        sparse_mla_fwd_ref(qr, kvr, idx, 0.07, **dict(kw, attn_sink=sink))[0].backward(dout.float())
        assert dkv.shape == kv.shape and dkv.dtype == kv.dtype
        assert rel_err(dq, qr.grad) <= 2e-2 and rel_err(dkv, kvr.grad) <= 2e-2 and rel_err(dsink, sink.grad) <= 2e-2
        dq32, dkv32, dsink32 = sparse_mla_bwd(q, kv, got[0], dout, idx3, got[2], 0.07, dkv_dtype=torch.float32, **kw)
        assert dkv32.shape == kv.shape and dkv32.dtype == torch.float32
        assert rel_err(dq32, qr.grad) <= 2e-2 and rel_err(dkv32, kvr.grad) <= 2e-2
        assert rel_err(dsink32, sink.grad) <= 2e-2
        w = torch.randn(48, 64, device=device)
        p, s, g = nvfp4_quantize(w)
        x = torch.randn(2, 64, device=device).to(dt)
        assert rel_err(nvfp4_linear(x, p, s, g), x.float() @ nvfp4_dequantize(p, s, g).t()) <= TOL
        xg = gemv_inputs(16, 64, 1, device, n_pad=1)
        c = nvfp4_gemv(xg["a"], xg["b"], xg["sfa"], xg["sfb"], out=xg["c"])
        assert c is xg["c"] and rel_err(c, nvfp4_gemv_ref(xg["a"], xg["b"], xg["sfa"], xg["sfb"])) <= 2e-3


def test_dsa_indexer_and_moe_topk(device):
    """The indexer ops and moe_topk on the one plan cache: positions [1, S] expanded over B on every call (kept in
    the plan), key_end and scalars in the key, a bad input after a good call of the same shapes still raises."""
    from llmkernels import dsa_index_scores, dsa_topk_logits, moe_topk
    from llmkernels.ops.dsa_indexer.reference import dsa_index_scores_ref, dsa_topk_logits_ref
    from llmkernels.ops.moe_topk.reference import moe_topk_ref
    for B, S, T, end, pos_rows, scale in ((2, 3, 40, None, 1, 0.1), (2, 3, 40, None, 1, 0.1), (2, 3, 40, 30, 1, 0.1),
                                          (2, 3, 40, 30, 2, 0.1), (2, 3, 40, 30, 2, 0.2)):
        q = torch.randn(B, S, 4, 32, device=device).half()
        k = torch.randn(B, T, 32, device=device).half()
        w = torch.randn(B, S, 4, device=device)
        pos = (torch.arange(S, device=device) + 20)[None].repeat(pos_rows, 1)
        out, ref = dsa_index_scores(q, k, w, scale, pos, 0, end), dsa_index_scores_ref(q, k, w, scale, pos, 0, end)
        fin = torch.isfinite(ref)
        assert torch.equal(fin, torch.isfinite(out)) and rel_err(out[fin], ref[fin]) <= 1e-4
        idx = torch.randint(-1, T, (B, S, 5), device=device, dtype=torch.int32)
        assert rel_err(dsa_topk_logits(q, k, w, idx, scale), dsa_topk_logits_ref(q, k, w, idx, scale)) <= 1e-4
    with pytest.raises(ValueError, match="key_end"):
        dsa_index_scores(q, k, w, 0.2, pos, 0, T + 1)
    with pytest.raises(ValueError, match="sm_scale"):
        dsa_topk_logits(q, k, w, idx, -0.2)
    for k_top in (2, 2, 3):
        x = torch.randn(5, 16, device=device)
        got, ref = moe_topk(x, k_top), moe_topk_ref(x, k_top)
        assert torch.equal(got[1], ref[1]) and rel_err(got[0], ref[0]) <= 1e-5
    with pytest.raises(ValueError, match="k must be"):
        moe_topk(x, 17)


def test_one_plan_cache_for_every_op(device):
    """Checked calls of different ops land in the one cache, each under its own site."""
    from llmkernels import _launch, moe_topk
    x = torch.randn(3, 8, device=device)
    moe_topk(x, 2)
    q = torch.randn(1, 4, 64, device=device).half()
    k = torch.randn(1, 2, 40, 64, device=device).half()
    masked_decode(q, k, k)
    sites = {key[0] for key in _launch._PLANS}
    assert {"moe_topk", "masked_decode", "masked_decode.plan"} <= sites
