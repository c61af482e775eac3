"""The ceilings every floor is measured against, taken on the spot in the same run: device-memory copy, read and
write rates (a memory-bound op's floor: bytes read at the read rate + bytes written at the write rate) and the bf16
GEMM rate (a compute-bound op's)."""
import functools

import torch
import triton
import triton.language as tl


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


@triton.jit
def _read_kernel(x_ptr, out_ptr, n, chunk, BLOCK: tl.constexpr, UNROLL: tl.constexpr, CHUNKED: tl.constexpr):
    """Each program sums its share of x into one word, in steps of UNROLL independent loads of BLOCK int32 words
    (16 bytes a thread each), all issued before they are added: grid-stride steps, or (CHUNKED) one contiguous
    chunk of `chunk` words a program, as a split decode kernel streams its part of a cache."""
    pid, nprog = tl.program_id(0), tl.num_programs(0)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    if CHUNKED:
        lo, step = pid * chunk, BLOCK * UNROLL
        hi = tl.minimum(lo + chunk, n)
    else:
        lo, step = pid * BLOCK * UNROLL, nprog * BLOCK * UNROLL
        hi = n
    for start in range(lo, hi, step):
        for u in tl.static_range(UNROLL):
            offs = start + u * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < hi, other=0)
    tl.store(out_ptr + pid, tl.sum(acc))


# (programs per SM, BLOCK, UNROLL, warps, chunked). H200s, grid-stride: 4.30-4.43 TB/s from 8 programs an SM up on
# one machine (bb1f2e3, f1dfa24; masked_decode streamed its 1M-token cache at 4.51 there), 4.50-4.53 on another
# (77f31fe), where contiguous chunks per program read 4.43-4.49 at best and 1.2-3.7 with fewer than 8 programs an SM
READ_CONFIGS = ((16, 1024, 1, 4, False), (8, 1024, 4, 4, False), (4, 2048, 4, 8, False), (8, 2048, 2, 8, False),
                (2, 1024, 4, 4, True), (4, 1024, 4, 4, True), (8, 1024, 2, 4, True), (4, 2048, 2, 8, True))


@functools.lru_cache(maxsize=None)
def read_bandwidth(nbytes: int = 2 << 30) -> float:
    """Device-memory read rate in bytes/s: a read-only stream over nbytes of random words (far beyond L2), the
    best of READ_CONFIGS (a read streams faster than a copy, which reads and writes in equal parts)."""
    ms = _read_ms(nbytes)
    torch.cuda.empty_cache()  # the buffer went with _read_ms's frame
    return nbytes / (ms * 1e-3)


def _read_ms(nbytes: int) -> float:
    x = torch.randint(-2 ** 31, 2 ** 31 - 1, (nbytes // 4,), dtype=torch.int32, device="cuda")
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    best = float("inf")
    for waves, block, unroll, warps, chunked in READ_CONFIGS:
        go = read_launch(x, waves * sms, block, unroll, warps, chunked)
        best = min(best, triton.testing.do_bench(go, warmup=25, rep=150, return_mode="median"))
    return best


def read_launch(x: torch.Tensor, programs: int, block: int, unroll: int, warps: int, chunked: bool):
    """A zero-argument call of _read_kernel over x (int32) with `programs` programs."""
    out = torch.empty(programs, dtype=torch.int32, device=x.device)
    chunk = -(-x.numel() // (programs * block * unroll)) * block * unroll  # whole steps a program
    return functools.partial(_read_kernel[(programs,)], x, out, x.numel(), chunk, BLOCK=block, UNROLL=unroll,
                             CHUNKED=chunked, num_warps=warps)


@functools.lru_cache(maxsize=None)
def write_bandwidth(nbytes: int = 2 << 30) -> float:
    """Device-memory write rate in bytes/s: fill_ of nbytes with a nonzero value."""
    ms = _write_ms(nbytes)
    torch.cuda.empty_cache()
    return nbytes / (ms * 1e-3)


def _write_ms(nbytes: int) -> float:
    dst = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda")
    return triton.testing.do_bench(lambda: dst.fill_(1.5), warmup=25, rep=150, return_mode="median")


def memory_floor_ms(read_bytes: float, write_bytes: float, read_bps: float, write_bps: float) -> float:
    """The least time to move those bytes: reads at the read rate, writes at the write rate."""
    return (read_bytes / read_bps + write_bytes / write_bps) * 1e3


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
    return {"copy_tbps": copy_bandwidth() / 1e12, "read_tbps": read_bandwidth() / 1e12,
            "write_tbps": write_bandwidth() / 1e12, "gemm_tflops": gemm_rate() / 1e12}
