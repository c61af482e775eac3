"""On the GPU: how fast can the L2 absorb the backward's dKV reductions? Each program adds [64 rows, 128 fp32]
tiles into random rows of an L2-resident [8192, 576] fp32 buffer (the second pass's pattern: 4096 query rows x
2048 distinct indices x 512 columns = 17.2 GB), with 16-, 8- and 4-byte reductions, against a gather-read of the
same rows. Usage: python scripts/red_ceiling.py"""
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _red_kernel(dst, idx_ptr, n_tiles, s_im, s_d, VEC: gl.constexpr, DC: gl.constexpr, BN: gl.constexpr,
                READ: gl.constexpr, W: gl.constexpr):
    c = gl.program_id(0)
    r = gl.program_id(1)
    lay: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [W, 1], [1, 0])
    cols = c * DC + gl.arange(0, DC, layout=gl.SliceLayout(0, lay))
    rows = gl.arange(0, BN, layout=gl.SliceLayout(1, lay))
    vals = gl.full([BN, DC], 1.0, gl.float32, lay)
    acc = gl.zeros([BN, DC], gl.float32, lay)
    for t in range(n_tiles):
        ids = gl.load(idx_ptr + r * s_im + t * BN + rows)
        ptrs = dst + ids.to(gl.int64)[:, None] * s_d + cols[None, :]
        if READ:
            acc += gl.load(ptrs)
        else:
            gl.atomic_add(ptrs, vals, sem="relaxed")
    if READ:
        gl.store(dst + (r % 64 * BN + rows).to(gl.int64)[:, None] * s_d + cols[None, :], acc)


def main():
    dev = torch.device("cuda")
    s_q, s_kv, topk, d = 4096, 8192, 2048, 576
    idx = torch.rand(s_q, s_kv, device=dev).argsort(dim=1)[:, :topk].to(torch.int32).contiguous()
    dst = torch.zeros(s_kv, d, device=dev)
    vol = s_q * topk * 512 * 4
    print(f"{torch.cuda.get_device_name()}: {vol / 1e9:.1f} GB of fp32 row pieces per call")
    for read in (False, True):
        for vec in (4, 2, 1):
            if read and vec != 4:
                continue
            for warps in (4, 8):
                f = lambda: _red_kernel[(4, s_q)](dst, idx, topk // 64, idx.stride(0), dst.stride(0), VEC=vec,  # noqa
                                                  DC=128, BN=64, READ=read, W=warps, num_warps=warps)
                f()
                ms = triton.testing.do_bench(f, warmup=10, rep=100)
                print(f"{'read  ' if read else 'reduce'} {4 * vec:>2}-byte {warps} warps: {ms:7.3f} ms "
                      f"{vol / ms / 1e9:5.2f} TB/s", flush=True)


if __name__ == "__main__":
    main()
