"""Checks of inkling_decode: inputs, tolerances, check(device) (benchmarks: bench.specs.inkling_decode)."""
import torch

from ...checking import generator, result
from ..xl_paged_decode.spec import LSE_TOL, OUT_TOL, make_inputs as paged_inputs
from .op import inkling_decode
from .reference import inkling_decode_ref

# xl_paged_decode's tolerances: the same kernel and roundings (q, P to the cache dtype; the bias adds in fp32)
__all__ = ["OUT_TOL", "LSE_TOL", "make_inputs", "run", "ref", "check"]


def make_inputs(S, H, Hkv, D, lengths, E, layout="dense", dtype=torch.float16, device="cpu", window=None,
                starts=None, L=None, block_size=16, seed=None, strided=True):
    """Random inkling_decode inputs. lengths: S ints (or one for all); E: rel_extent; layout "dense" (transformers'
    [S, Hkv, L, D], L = max length + 3 unless given; strided: k / v views of a wider cache, rel_bias a strided view)
    or xl_paged_decode's "nhd" / "legacy" paged layouts (shuffled blocks, garbage past the used ones). starts: None
    or S ints."""
    device = torch.device(device)
    g = generator(device, seed)
    lengths = [lengths] * S if isinstance(lengths, int) else list(lengths)
    rand = lambda *shape: torch.randn(*shape, device=device, generator=g).to(dtype)  # noqa: E731
    if layout == "dense":
        L = max(lengths + [0]) + 3 if L is None else L
        if strided:  # heads interleaved with a second cache (as a fused kv buffer), L padded
            k = rand(S, L + 2, 2 * Hkv, D).transpose(1, 2)[:, :Hkv, :L]
            v = rand(S, L + 2, 2 * Hkv, D).transpose(1, 2)[:, Hkv:, :L]
        else:
            k, v = rand(S, Hkv, L, D), rand(S, Hkv, L, D)
        x = {"q": rand(S, H, D), "k": k, "v": v, "block_tables": None}
    else:
        p = paged_inputs(S, H, Hkv, D, block_size, lengths, layout, dtype, device, u=None, bd=None, seed=seed)
        x = {"q": p["q"], "k": p["k_cache"], "v": p["v_cache"], "block_tables": p["block_tables"]}
    x["rel_bias"] = rand(S, E + 3, H).transpose(1, 2)[:, :, :E] if strided else rand(S, H, E)
    x["lengths"] = torch.tensor(lengths, dtype=torch.int32, device=device)
    x["starts"] = None if starts is None else torch.tensor(starts, dtype=torch.int32, device=device)
    x["window"] = window
    return x


def _args(x):
    return (x["q"], x["k"], x["v"], x["rel_bias"], x["lengths"], x["block_tables"], x["window"], x["starts"])


def run(x, **kw):
    return inkling_decode(*_args(x), **kw)


def ref(x, **kw):
    return inkling_decode_ref(*_args(x), **kw)


def check(device):
    out = []
    dtypes = [torch.float16, torch.float32] if device.type == "cpu" else [torch.float16, torch.bfloat16, torch.float32]
    cases = [  # S, H, Hkv, D, lengths, E, layout, window, starts
        (3, 4, 2, 64, [37, 1, 0], 16, "dense", None, None),
        (2, 8, 1, 128, [70, 33], 1024, "dense", 24, [0, 5]),
        (2, 4, 4, 64, [50, 21], 8, "nhd", 16, None),
        (2, 4, 2, 128, [40, 9], 32, "legacy", None, [3, 0]),
    ]
    for dtype in dtypes:
        for S, H, Hkv, D, lens, E, layout, window, starts in cases:
            x = make_inputs(S, H, Hkv, D, lens, E, layout, dtype, device, window=window, starts=starts)
            o, lse = run(x, scale=1.0 / D, return_lse=True)
            ro, rl = ref(x, scale=1.0 / D)
            case = f"S={S} H={H} Hkv={Hkv} D={D} E={E} {layout} window={window} starts={starts} {str(dtype)[6:]}"
            out.append(result("inkling_decode", case + " out", o, ro, OUT_TOL[dtype]))
            out.append(result("inkling_decode", case + " lse", lse, rl, LSE_TOL[dtype]))
    return out
