"""Compile every shipped kernel for sm_90 on a machine WITHOUT a GPU; report registers, spills, shared memory and
instruction counts per configuration, and dump the SASS (and IR) to compare two trees.

The configurations call the ops' own launchers (plans, heuristics) on CPU stand-in tensors as an H100 would run them:
132 SMs, capability (9, 0), programmatic dependent launch on, the Gluon sparse MLA kernels where `wgmma_usable`'s
alignment checks pass; names ending in "triton" take the portable Triton kernels (other GPUs). Shapes are small:
the compiled code depends on dtypes, constexprs and the 16-divisibility of ints, not on the sizes.

    python scripts/sass_dump.py [--list] [--only SUBSTR ...] [--out DIR [--ir]]
    python scripts/sass_dump.py --diff DIR_A DIR_B     # same SASS per configuration? (kernel names masked)

A kernel edit meant to change nothing: dump before (`git stash`, or a worktree of the base commit: run the worktree's
own scripts/sass_dump.py, which imports the tree it lies in whatever PYTHONPATH says) and after, then --diff;
identical SASS is identical behaviour. --out writes DIR/<config>.<n>.sass per launched kernel (n: launch order; the
kernel's name on the first line), and with --ir its .ttgir and .ptx.
"""
import argparse
import os
import re
import sys

import sm90_offline as O  # noqa: I100  (installs the sm_90 stand-in driver before llmkernels loads triton)
import torch

import llmkernels  # noqa: F401, E402
from llmkernels.ops.combine import kernel as CB  # noqa: E402
from llmkernels.ops.masked_decode import kernel as MD  # noqa: E402
from llmkernels.ops.nvfp4 import gemv as NG  # noqa: E402
from llmkernels.ops.nvfp4 import linear as NL  # noqa: E402
from llmkernels.ops.nvfp4 import tiled as NT  # noqa: E402
from llmkernels.ops.nvfp4 import tiled_layout as NTL  # noqa: E402
from llmkernels.ops.nvfp4 import tiled_prefill as NTP  # noqa: E402
from llmkernels.ops.nvfp4 import prefill_wgmma as NW  # noqa: E402
from llmkernels.ops.sparse_mla import attn_dist as SD  # noqa: E402
from llmkernels.ops.sparse_mla import wgmma_common as W  # noqa: E402
from llmkernels.ops.sparse_mla import bwd as SB  # noqa: E402
from llmkernels.ops.sparse_mla import common  # noqa: E402
from llmkernels.ops.sparse_mla import fwd as SF  # noqa: E402
from llmkernels.ops.xl_paged_decode import kernel as XL  # noqa: E402
from llmkernels.distributed import decode as CP  # noqa: E402

H100_SMS = 132
CUDA = torch.device("cuda", 0)
_GLUON = [True]  # wgmma_usable's answer beyond its alignment checks (False: the portable Triton kernels)


def _as_h100():
    """Answer the device queries of every llmkernels module as an H100 would (see the module doc)."""
    def usable(a):
        return _GLUON[0] and W.rows_16b(a.q, (0, 1)) and W.rows_16b(a.kv, (0,))
    for name, m in list(sys.modules.items()):
        if not name.startswith("llmkernels"):
            continue
        for attr, fn in (("num_sms", lambda device: H100_SMS), ("pdl_enabled", lambda device: True),
                         ("capability", lambda device: (9, 0)), ("wgmma_usable", usable)):
            if hasattr(m, attr):
                setattr(m, attr, fn)
    common.check_same_device = lambda **kw: None


_CAPTURED = []


def e(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype)


# --- configurations: name -> function that makes the launches ---------------------------------------------------

def masked_decode(B, Hkv, Hq, L, D, dtype, drop=False, lens=False, listed=False, config=None):
    def go():
        q, k, v = e(B, Hq, D, dtype=dtype), e(B, Hkv, L, D, dtype=dtype), e(B, Hkv, L, D, dtype=dtype)
        mask = torch.zeros(B, Hkv, L, dtype=torch.bool) if drop else None
        kl = torch.zeros(B, dtype=torch.int32) if lens else None
        kept = (torch.zeros(B, Hkv, L, dtype=torch.int32) if listed != "prefix" else None,
                torch.zeros(B, Hkv, dtype=torch.int32), L - 7) if listed else None
        MD.masked_decode_fwd(q, k, v, mask, kl, L, D ** -0.5, e(B, Hq, D, dtype=dtype), e(B, Hq, dtype=torch.float32),
                             config=config, kept=kept)
    return go


def combine(R, S, D, dtype):
    return lambda: CB.combine(e(R, S, D, dtype=torch.float32), e(R, S, dtype=torch.float32), e(R, D, dtype=dtype),
                              e(R, dtype=torch.float32))


def xl(layout, dtype=torch.float16, D=128, bs=16, H=16, Hkv=16, bd=True, u=True):
    def go():
        esize = torch.tensor([], dtype=dtype).element_size()
        S, nb, x = 2, 64, 16 // esize
        q = e(S, H, D, dtype=dtype)
        if layout == "legacy":
            kc, vc = e(nb, Hkv, D // x, bs, x, dtype=dtype), e(nb, Hkv, D, bs, dtype=dtype)
        else:
            kc, vc = e(nb, bs, Hkv, D, dtype=dtype), e(nb, bs, Hkv, D, dtype=dtype)
        bt = torch.zeros(S, 32, dtype=torch.int32)
        XL.xl_paged_decode_fwd(q, kc, vc, bt, torch.zeros(S, dtype=torch.int32), e(H, D, dtype=dtype) if u else None,
                               e(S, H, 32 * bs, dtype=dtype) if bd else None, 0.1, e(S, H, D, dtype=dtype),
                               e(S, H, dtype=torch.float32))
    return go


def inkling(layout, dtype=torch.bfloat16, D=128, H=64, Hkv=8, E=1024, window=None, starts=False, bs=16):
    """inkling_decode's plans (the xl split kernel's REL / window / dense-layout variants)."""
    def go():
        S = 2
        q = e(S, H, D, dtype=dtype)
        if layout == "dense":
            kc, vc, bt = e(S, Hkv, 4096, D, dtype=dtype), e(S, Hkv, 4096, D, dtype=dtype), None
        else:
            kc, vc, bt = e(64, bs, Hkv, D, dtype=dtype), e(64, bs, Hkv, D, dtype=dtype), torch.zeros(S, 32,
                                                                                                   dtype=torch.int32)
        plan = XL.XLPlan(q, kc, vc, bt, None, e(S, H, E, dtype=dtype), 1 / D, rel=True, window=window or 0,
                         starts=starts)
        lens = torch.zeros(S, dtype=torch.int32)
        plan(q, kc, vc, bt, lens, None, e(S, H, E, dtype=dtype), e(S, H, D, dtype=dtype),
             e(S, H, dtype=torch.float32), lens if starts else None)
    return go


def _run_topk(logits, k, renormalize, *rest):
    from llmkernels.ops.moe_topk.op import _run
    _run(logits, k, renormalize, *rest)


def _run_row_topk(R, N, k):
    from llmkernels.ops.row_topk.kernel import RowTopkPlan
    p = RowTopkPlan(R, N, k, N, 132)
    p(e(R, N, dtype=torch.float32), e(R, k, dtype=torch.int32), e(p.n_scratch, dtype=torch.int32),
      e(p.n_counts, dtype=torch.int32))


def moe(T, E, H, inter, k, dtype=torch.bfloat16, mma=True, tiles=False):
    """nvfp4_moe: the grouped NVFP4 experts (two launches): the mma kernels (sm_90; tiles: 8 pairs of an expert an
    mma), or the plain Triton ones."""
    from llmkernels.ops.nvfp4.moe import _moe
    from llmkernels.ops.nvfp4.moe_tiled import moe_tiled, moe_tiled_pairs
    u8 = torch.uint8

    def proj(N, K):
        return e(E, N, K // 2, dtype=u8), e(E, N, K // 16, dtype=u8), e(E, dtype=torch.float32)

    def go():
        x, idx, w = e(T, H, dtype=dtype), torch.zeros(T, k, dtype=torch.int64), e(T, k, dtype=dtype)
        ws = (*proj(inter, H), *proj(inter, H), *proj(H, inter))
        if tiles:
            moe_tiled_pairs(x, idx, w, *ws)
        elif mma:
            moe_tiled(x, idx, w, *ws, e(T, H, dtype=dtype), e(T * k, inter, dtype=dtype))
        else:
            _moe(x, idx, w, *ws, mma=False)
    return go


def gemv(M, K, L, static):
    def go():
        u8 = torch.uint8
        NG.gemv_launch(e(M, K // 2, L, dtype=u8), e(1, K // 2, L, dtype=u8), e(M, K // 16, L, dtype=u8),
                       e(1, K // 16, L, dtype=u8), e(M, 1, L), 1.0, static_weights=static)
    return go


def linear(T, N, K, dtype, kernel, bias=False):
    def go():
        x, w, s = e(T, K, dtype=dtype), e(N, K // 2, dtype=torch.uint8), e(N, K // 16, dtype=torch.uint8)
        gs, b, y = e(1, dtype=torch.float32), e(N, dtype=torch.float32) if bias else None, e(T, N, dtype=dtype)
        if kernel == "mma":  # what linear_launch picks on sm_90 for T <= 16 (its check reads x.device)
            NL.linear_mma_launch(x, w, s, gs, b, y)
        elif kernel == "tiled":  # NVFP4Linear's kernel on its tiled layout
            NT.tiled_launch(x, w, s, gs, b, y)
        elif kernel.startswith("parts"):  # grouped layers (q / k / v: 3 parts, gate / up: 2) of N rows each
            n = int(kernel[-1])
            NT.tiled_launch(x, w, s, gs, b, e(T, n * N, dtype=dtype), parts=[(w, s, gs, b)] * (n - 1))
        elif kernel == "glu":  # gate / up of N rows each, silu(gate) * up in the epilogue
            NT.tiled_launch(x, w, s, gs, b, y, parts=[(w, s, gs, b)], glu=True)
        elif kernel == "prefill":  # NVFP4Linear above 16 tokens
            NTP.prefill_launch(x, w, s, gs, b, y)
        elif kernel.startswith("wgmma"):  # the Gluon prefill kernel (above 128 tokens); "wgmma BT": its token tile
            NW.wgmma_prefill_launch(x, w, s, gs, b, y, cfg={"BT": int(kernel[6:])} if kernel[6:] else None)
        elif kernel == "dequant":
            NL.dequant_launch(w, s, gs, e(N, K, dtype=dtype))
        elif kernel == "dequant tiled":
            NTL.dequant_tiled_launch(w, s, gs, e(N, K, dtype=dtype))
        else:  # the dot kernel, with the inline-PTX decode sm_90 uses for fp16 and bf16
            NL.linear_launch(x, w, s, gs, b, y, cfg={"kernel": "dot"}, use_asm=True)
    return go


def _sparse(h_q, d_qk, s_q=4, topk=128, sink=False, tlen=False, qs_tensor=False):
    s_kv = s_q + 64
    q = e(s_q, h_q, d_qk, dtype=torch.bfloat16)
    kv = e(s_kv, 1, d_qk, dtype=torch.bfloat16)
    qs = torch.zeros(1, dtype=torch.int32) if qs_tensor else s_kv - s_q
    return common.prepare(q, kv, torch.zeros(s_q, topk, dtype=torch.int32), 0.1, q_start=qs,
                          attn_sink=torch.zeros(h_q) if sink else None,
                          topk_length=torch.zeros(s_q, dtype=torch.int32) if tlen else None)


def mla_fwd(h_q, d_qk, gluon=True, **kw):
    def go():
        _GLUON[0] = gluon
        a = _sparse(h_q, d_qk, **kw)
        s_q = a.q.shape[0]
        SF.sparse_mla_fwd_launch(a, e(s_q, h_q, 512, dtype=torch.bfloat16), e(s_q, h_q, dtype=torch.float32),
                                 e(s_q, h_q, dtype=torch.float32))
    return go


def mla_dist(h_q, d_qk, gluon=True, **kw):
    def go():
        _GLUON[0] = gluon
        a = _sparse(h_q, d_qk, **kw)
        s_q, topk = a.indices.shape
        SD.attn_dist_launch(a, e(s_q, h_q, dtype=torch.float32), e(s_q, topk, dtype=torch.float32))
    return go


def mla_bwd(h_q, d_qk, deterministic=False, gluon=True, dlse=False, **kw):
    def go():
        _GLUON[0] = gluon
        a = _sparse(h_q, d_qk, **kw)
        s_q = a.q.shape[0]
        o = e(s_q, h_q, 512, dtype=torch.bfloat16)
        lse = e(s_q, h_q, dtype=torch.float32)
        SB.sparse_mla_bwd_launch(a, o, e(s_q, h_q, 512, dtype=torch.bfloat16), lse, lse if dlse else None,
                                 torch.empty_like(a.q), deterministic=deterministic)
    return go


def local_lens(interleave):
    return lambda: CP._local_lens_kernel[(1,)](torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int32),
                                               3, 0, 100, 0, 2, 16 if interleave else 0, INTERLEAVE=interleave,
                                               BLOCK=128)


f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32
CONFIGS = {
    "masked_decode dense fp16 D128 G4": masked_decode(1, 8, 32, 4096, 128, f16),
    "masked_decode drop+lens fp16 D128 G4": masked_decode(2, 8, 32, 4096, 128, f16, drop=True, lens=True),
    "masked_decode drop bf16 D64 G8": masked_decode(4, 2, 16, 1000, 64, bf16, drop=True),
    "masked_decode dense bf16 D256 G1": masked_decode(2, 4, 4, 2048, 256, bf16, lens=True),
    "masked_decode listed bf16 D128 G4": masked_decode(8, 8, 32, 4096, 128, bf16, listed=True),
    "masked_decode listed+lens fp16 D64 G8": masked_decode(2, 2, 16, 1000, 64, f16, lens=True, listed=True),
    "masked_decode prefix bf16 D128 G4": masked_decode(8, 8, 32, 4096, 128, bf16, listed="prefix"),
    "masked_decode prefix bf16 D128 G4 heavy first": masked_decode(8, 8, 32, 4096, 128, bf16, listed="prefix",
                                                                   config={"heavy_first": True}),
    "masked_decode listed bf16 D128 G4 entries in the loop": masked_decode(8, 8, 32, 4096, 128, bf16, listed=True,
                                                                           config={"list_ahead": False}),
    "masked_decode prefix bf16 D128 G4 dense tiles": masked_decode(8, 8, 32, 4096, 128, bf16, listed="prefix",
                                                                   config={"block_n": 128, "num_stages": 2}),
    "masked_decode dense bf16 D128 G4 B8": masked_decode(8, 8, 32, 4096, 128, bf16),
    "masked_decode prefix bf16 D128 G4 B1 balanced": masked_decode(1, 8, 32, 4096, 128, bf16, listed="prefix"),
    "masked_decode listed+lens bf16 D128 G4 B1 balanced": masked_decode(1, 8, 32, 4096, 128, bf16, lens=True,
                                                                        listed=True),
    "masked_decode prefix bf16 D128 G4 B1 balanced merging": masked_decode(1, 8, 32, 4096, 128, bf16, listed="prefix",
                                                                           config={"fuse_merge": 1 << 20}),
    "combine fp32 parts S40 D128 bf16": combine(64, 40, 128, bf16),
    "combine fp32 parts S300 D512 fp16": combine(16, 300, 512, f16),
    "xl nhd fp16 D128 bs16 MHA": xl("nhd"),
    "xl legacy fp16 D128 bs16 MHA": xl("legacy"),
    "xl nhd fp16 D128 bs16 G8": xl("nhd", H=16, Hkv=2),
    "xl legacy fp16 D128 bs16 G8": xl("legacy", H=16, Hkv=2),
    "xl legacy fp16 D80 bs16 MHA": xl("legacy", D=80),
    "xl nhd bf16 D256 bs8 MHA no-u no-bd": xl("nhd", dtype=bf16, D=256, bs=8, u=False, bd=False),
    "xl legacy fp32 D96 bs256 G2": xl("legacy", dtype=f32, D=96, bs=256, H=8, Hkv=4),
    "inkling dense bf16 D128 G8": inkling("dense"),
    "inkling dense bf16 D128 G4 window starts": inkling("dense", Hkv=16, E=512, window=512, starts=True),
    "inkling dense fp16 D64 MHA": inkling("dense", dtype=f16, D=64, H=4, Hkv=4, E=7),
    "inkling nhd fp32 D256 G2 window": inkling("nhd", dtype=f32, D=256, H=4, Hkv=2, window=300),
    "moe bf16 T1 E128 H2048 I768 k8": moe(1, 128, 2048, 768, 8),
    "moe fp16 T16 E8 H4096 I1536 k2": moe(16, 8, 4096, 1536, 2, torch.float16),
    "moe bf16 T4 E64 H7168 I2048 k6": moe(4, 64, 7168, 2048, 6),  # slots padded to 8 warps
    "moe triton bf16 T1 E128 H2048 I768 k8": moe(1, 128, 2048, 768, 8, mma=False),
    "moe grouped bf16 T512 E128 H2048 I768 k8": moe(512, 128, 2048, 768, 8, mma=False),  # prefill: by expert
    "moe mma tiles bf16 T512 E128 H2048 I768 k8": moe(512, 128, 2048, 768, 8, tiles=True),
    "moe mma tiles fp16 T256 E128 H4096 I1536 k8": moe(256, 128, 4096, 1536, 8, torch.float16, tiles=True),
    "moe mma tiles bf16 T8 E4 H4096 I1536 k2": moe(8, 4, 4096, 1536, 2, tiles=True),  # K split over 2 warps
    "moe triton fp16 T16 E8 H4096 I1536 k2": moe(16, 8, 4096, 1536, 2, torch.float16, mma=False),
    "moe_topk bf16 T1 E128 k8": lambda: _run_topk(e(1, 128, dtype=torch.bfloat16), 8, True),
    "row_topk R1 N65537 k2048": lambda: _run_row_topk(1, 65537, 2048),
    "moe_topk fp32 T16 E1024 k32": lambda: _run_topk(e(16, 1024, dtype=torch.float32), 32, False),
    "moe_topk sigmoid fp32 T1 E256 k8 groups 8/4": lambda: _run_topk(e(1, 256, dtype=torch.float32), 8, True,
                                                                     "sigmoid", e(256, dtype=torch.float32), 8, 4, 2.5),
    "gemv 7168x16384 L1": gemv(7168, 16384, 1, False),
    "gemv 7168x16384 L1 static": gemv(7168, 16384, 1, True),
    "gemv 4096x7168 L8": gemv(4096, 7168, 8, False),
    "gemv 4096x7168 L8 static": gemv(4096, 7168, 8, True),
    "gemv 7168x2048 L4": gemv(7168, 2048, 4, False),
    "gemv 7168x2048 L4 static": gemv(7168, 2048, 4, True),
    "gemv 4096x4096 L1 static": gemv(4096, 4096, 1, True),
    "gemv 256x16384 L1 (split K)": gemv(256, 16384, 1, False),
    "linear mma T1 14336x4096 bf16": linear(1, 14336, 4096, bf16, "mma"),
    "linear mma T16 4096x4096 fp16 bias": linear(16, 4096, 4096, f16, "mma", bias=True),
    "linear mma T4 8192x28672 bf16 l2": linear(4, 8192, 28672, bf16, "mma"),  # a program streams >= 96 words a row
    "linear dot T1 4096x4096 bf16": linear(1, 4096, 4096, bf16, "dot"),
    "linear dot T16 4096x14336 fp16 bias": linear(16, 4096, 14336, f16, "dot", bias=True),
    "linear dequant bf16": linear(32, 256, 512, bf16, "dequant"),
    "linear dequant tiled bf16": linear(32, 256, 512, bf16, "dequant tiled"),
    "linear tiled T1 4096x4096 bf16": linear(1, 4096, 4096, bf16, "tiled"),
    "linear prefill T64 4096x4096 bf16": linear(64, 4096, 4096, bf16, "prefill"),
    "linear prefill T512 28672x4096 fp16 bias": linear(512, 28672, 4096, torch.float16, "prefill", bias=True),
    "linear prefill wgmma T512 28672x4096 bf16": linear(512, 28672, 4096, bf16, "wgmma"),
    "linear prefill wgmma T200 4096x4096 bf16 BT64": linear(200, 4096, 4096, bf16, "wgmma 64"),
    "linear prefill wgmma T300 4096x14336 fp16 bias split": linear(300, 4096, 14336, f16, "wgmma 128", bias=True),
    "linear tiled T16 8192x28672 fp16 bias": linear(16, 8192, 28672, f16, "tiled", bias=True),
    "linear tiled parts3 T1 2048x4096 bf16": linear(1, 2048, 4096, bf16, "parts3"),
    "linear tiled parts2 T16 14336x4096 fp16 bias": linear(16, 14336, 4096, f16, "parts2", bias=True),
    "linear tiled glu T1 14336x4096 bf16": linear(1, 14336, 4096, bf16, "glu"),
    "linear tiled glu T16 1024x4096 fp16 bias": linear(16, 1024, 4096, f16, "glu", bias=True),
    "sparse_mla fwd h128 d576 sink": mla_fwd(128, 576, sink=True),
    "sparse_mla fwd h64 d576 tlen qs-tensor": mla_fwd(64, 576, tlen=True, qs_tensor=True),
    "sparse_mla fwd h128 d512": mla_fwd(128, 512),
    "sparse_mla fwd h16 d576 split tail": mla_fwd(16, 576, s_q=40, topk=1024),
    "sparse_mla attn_dist h128 d576": mla_dist(128, 576),
    "sparse_mla attn_dist h64 d576 row pairs": mla_dist(64, 576, s_q=140),
    "sparse_mla attn_dist h128 d512 tlen": mla_dist(128, 512, tlen=True),
    "sparse_mla attn_dist h256 d576 (Triton on sm_90)": mla_dist(256, 576),
    "sparse_mla bwd h128 d576 dlse": mla_bwd(128, 576, dlse=True),
    "sparse_mla bwd h128 d512 deterministic": mla_bwd(128, 512, deterministic=True),
    "sparse_mla bwd h64 d576 deterministic tlen": mla_bwd(64, 576, deterministic=True, tlen=True),
    "sparse_mla bwd h16 d576 (Triton 2nd pass)": mla_bwd(16, 576),
    "sparse_mla fwd h128 d576 sink triton": mla_fwd(128, 576, gluon=False, sink=True),
    "sparse_mla fwd h16 d512 triton": mla_fwd(16, 512, gluon=False),
    "sparse_mla attn_dist h128 d576 triton": mla_dist(128, 576, gluon=False),
    "sparse_mla attn_dist h32 d512 tlen triton": mla_dist(32, 512, gluon=False, tlen=True),
    "sparse_mla bwd h128 d576 triton": mla_bwd(128, 576, gluon=False),
    "sparse_mla bwd h32 d512 deterministic triton": mla_bwd(32, 512, gluon=False, deterministic=True),
    "distributed local lens": local_lens(False),
    "distributed local lens interleaved": local_lens(True),
}


def slug(name):
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")


def report(name, kernel, k):
    sass, res = O.sass(k)
    regs, stack = O.regs_stack(res)
    instr, hgmma, ldgsts, ldl = (len(re.findall(p, sass)) for p in (r"/\*[0-9a-f]{4,}\*/ ", "HGMMA", "LDGSTS", "LDL"))
    print(f"{name[:46]:<46} {kernel[:22]:<22} regs {regs:>3} stack {stack:>3} smem {k.metadata.shared:>6} "
          f"instr {instr:>5} HGMMA {hgmma:>3} LDGSTS {ldgsts:>3} LDL {ldl:>2}", flush=True)
    return sass


def dump(only, out, ir):
    _as_h100()
    O.compile_only(_CAPTURED)
    for name, go in CONFIGS.items():
        if only and not any(s in name for s in only):
            continue
        _CAPTURED.clear()
        go()
        for i, (kernel, k) in enumerate(_CAPTURED):
            sass = report(name, kernel, k)
            if out:
                base = os.path.join(out, f"{slug(name)}.{i}")
                with open(base + ".sass", "w") as f:
                    f.write(f"// kernel: {kernel}\n{sass}")
                for ext in ("ttgir", "ptx") if ir else ():
                    with open(f"{base}.{ext}", "w") as f:
                        f.write(k.asm[ext])


def _masked(path):
    text = open(path).read()
    first, _, rest = text.partition("\n")
    name = first.removeprefix("// kernel: ")
    return re.sub(rf"\b{re.escape(name)}\b", "KERNEL", rest)


def diff(a, b) -> int:
    """Compare two --out directories' SASS file by file, kernel names masked. Returns the number that differ."""
    fa = {f for f in os.listdir(a) if f.endswith(".sass")}
    fb = {f for f in os.listdir(b) if f.endswith(".sass")}
    bad = 0
    for f in sorted(fa ^ fb):
        print(f"only in {a if f in fa else b}: {f}")
        bad += 1
    same = 0
    for f in sorted(fa & fb):
        if _masked(os.path.join(a, f)) == _masked(os.path.join(b, f)):
            same += 1
        else:
            print(f"differs: {f}")
            bad += 1
    print(f"{same} identical, {bad} different or missing")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=[], help="configurations whose name contains one of these")
    ap.add_argument("--out", help="write <config>.<n>.sass (kernel name on line 1) here")
    ap.add_argument("--ir", action="store_true", help="with --out: the .ttgir and .ptx as well")
    ap.add_argument("--list", action="store_true", help="print the configuration names and exit")
    ap.add_argument("--diff", nargs=2, metavar=("DIR_A", "DIR_B"), help="compare two --out directories")
    args = ap.parse_args()
    if args.list:
        print("\n".join(CONFIGS))
    elif args.diff:
        sys.exit(1 if diff(*args.diff) else 0)
    else:
        if args.out:
            os.makedirs(args.out, exist_ok=True)
        dump(args.only, args.out, args.ir)


if __name__ == "__main__":
    main()
