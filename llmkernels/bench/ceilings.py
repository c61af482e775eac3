"""The two ceilings every floor is measured against, taken on the spot in the same run."""
import functools

import torch
import triton


@functools.lru_cache(maxsize=None)
def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy rate in bytes/s, counting bytes read plus bytes written."""
    ms = _copy_ms(nbytes)
    torch.cuda.empty_cache()  # the buffers went with _copy_ms's frame
    return 2 * nbytes / (ms * 1e-3)


def _copy_ms(nbytes: int) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda").uniform_()
    dst = torch.empty_like(src)
    return triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")


@functools.lru_cache(maxsize=None)
def gemm_rate(n: int = 8192) -> float:
    """bf16 matrix-product rate in FLOP/s on random data."""
    ms = _gemm_ms(n)
    torch.cuda.empty_cache()  # the operands went with _gemm_ms's frame
    return 2 * n ** 3 / (ms * 1e-3)


def _gemm_ms(n: int) -> float:
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    return triton.testing.do_bench(lambda: a @ b, warmup=100, rep=500, return_mode="median")


def ceilings() -> dict:
    return {"copy_tbps": copy_bandwidth() / 1e12, "gemm_tflops": gemm_rate() / 1e12}
