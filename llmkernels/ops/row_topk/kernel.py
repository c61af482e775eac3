"""row_topk's radix select: every value's order key (a uint32 that sorts like the fp32, NaN highest) is read in
three digits, 11 / 11 / 10 bits. Pass 1 counts the rows' first digits; pass 2 the second digits of the values whose
first is the threshold's (the digit where the count from the top reaches k); pass 3 the third within the first two.
Then the threshold key T and how many values equal to it are still needed are known: pass 4 counts each program's
values above T and equal to it, pass 5 writes the positions at offsets from those counts (so the result is the same
every call: the positions above T in ascending order, then the lowest ones equal to T). Many programs share a row
(counts by atomics); each finds the threshold digits itself from the counts so far (a cumulative sum over the
bins), so a pass is one launch. The last program of a row to finish pass 5 zeroes the row's counts for the next
call."""
import triton
import triton.language as tl

from ..._launch import Launch

NB1, NB2, NB3 = tl.constexpr(2048), tl.constexpr(2048), tl.constexpr(1024)  # digits: key bits 31..21, 20..10, 9..0
SCR = tl.constexpr(2048 + 2048 + 1024 + 1)  # int32 a row: the three digits' counts, arrivals (zero between calls)


@triton.jit
def _order_key(x):
    """uint32 keys that order like fp32 x, NaN above +inf (as torch.topk ranks them)."""
    u = x.to(tl.uint32, bitcast=True)
    key = tl.where((u >> 31) != 0, u ^ 0xFFFFFFFF, u | 0x80000000)  # (not ~u: the interpreter fails on it)
    return tl.where(x != x, 0xFFFFFFFF, key)


@triton.jit
def _threshold(h_ptr, NB: tl.constexpr, need):
    """(b, still needed): the largest digit b whose values at digits >= b number at least `need`, and need less
    the values above b; b = -1 when fewer than need values were counted."""
    i = tl.arange(0, NB)
    h = tl.load(h_ptr + i)
    suffix = tl.sum(h, 0) - tl.cumsum(h, 0) + h
    b = tl.max(tl.where(suffix >= need, i, -1), 0)
    return b, need - tl.sum(tl.where(i > b, h, 0), 0)


@triton.jit
def _row_topk_kernel(x_ptr, out_ptr, scr_ptr, cnt_ptr, N, K, chunk, sx, so,
                     PASS: tl.constexpr, NBIN: tl.constexpr, PP: tl.constexpr, BLOCK: tl.constexpr):
    p, r = tl.program_id(0), tl.program_id(1)
    P = tl.num_programs(0)
    row = x_ptr + r.to(tl.int64) * sx
    orow = out_ptr + r.to(tl.int64) * so
    h1 = scr_ptr + r * SCR
    h2 = h1 + NB1
    h3 = h2 + NB2
    arrivals = h3 + NB3
    counts = cnt_ptr + r * 2 * P  # [P, 2]: each program's values above T and equal to it (pass 4)
    lo = p * chunk
    hi = tl.minimum(N, lo + chunk)
    b1, n1, b2, n2 = 0, K, 0, K
    if PASS >= 2:
        b1, n1 = _threshold(h1, NB1, K)
    if PASS >= 3:
        b2, n2 = _threshold(h2, NB2, n1)
    if PASS <= 3:
        acc = tl.zeros([NBIN], tl.int32)
        for s in range(lo, hi, BLOCK):
            o = s + tl.arange(0, BLOCK)
            x = tl.load(row + o, mask=o < hi, other=float("-inf"))
            key = _order_key(x)
            ok = x != float("-inf")  # (masked lanes too): -inf is never chosen
            if PASS == 1:
                acc += tl.histogram((key >> 21).to(tl.int32), NBIN, mask=ok)
            elif PASS == 2:
                acc += tl.histogram(((key >> 10) & 2047).to(tl.int32), NBIN,
                                    mask=ok & ((key >> 21).to(tl.int32) == b1))
            else:
                acc += tl.histogram((key & 1023).to(tl.int32), NBIN,
                                    mask=ok & ((key >> 10).to(tl.int32) == b1 * 2048 + b2))
        h = h1 if PASS == 1 else (h2 if PASS == 2 else h3)
        bins = tl.arange(0, NBIN)
        tl.atomic_add(h + bins, acc, mask=acc > 0, sem="relaxed")
    else:
        b3, n3 = _threshold(h3, NB3, n2)
        every = b1 < 0  # fewer than K values above -inf: all of them, then -1
        t = (b1.to(tl.uint32) << 21) | (b2.to(tl.uint32) << 10) | b3.to(tl.uint32)
        n_gt, n_eq = 0, 0
        if PASS == 5:  # offsets: the earlier programs' counts
            q = tl.arange(0, PP)
            n_gt = tl.sum(tl.load(counts + 2 * q, mask=q < p, other=0), 0)
            n_eq = tl.sum(tl.load(counts + 2 * q + 1, mask=q < p, other=0), 0)
        for s in range(lo, hi, BLOCK):
            o = s + tl.arange(0, BLOCK)
            x = tl.load(row + o, mask=o < hi, other=float("-inf"))
            key = _order_key(x)
            ok = x != float("-inf")
            g = (ok & ((key > t) | every)).to(tl.int32)
            e = (ok & (key == t) & (b1 >= 0)).to(tl.int32)
            if PASS == 5:
                tl.store(orow + n_gt + tl.cumsum(g, 0) - g, o, mask=g > 0)
                rank = n_eq + tl.cumsum(e, 0) - e
                tl.store(orow + (K - n3) + rank, o, mask=(e > 0) & (rank < n3))
            n_gt += tl.sum(g, 0)
            n_eq += tl.sum(e, 0)
        if PASS == 4:
            tl.store(counts + 2 * p, n_gt)
            tl.store(counts + 2 * p + 1, n_eq)
        else:
            if every & (p == 0):  # the K - n1 values took slots 0 .. K - n1 - 1
                for s in range(0, K, BLOCK):
                    o = s + tl.arange(0, BLOCK)
                    tl.store(orow + o, tl.full([BLOCK], -1, tl.int32), mask=(o >= K - n1) & (o < K))
            if tl.atomic_add(arrivals, 1, sem="acq_rel") == P - 1:  # the row's last program: zero its counts
                for s in range(0, SCR, BLOCK):
                    o = s + tl.arange(0, BLOCK)
                    tl.store(h1 + o, tl.zeros([BLOCK], tl.int32), mask=o < SCR)


def plan(R: int, N: int, sms: int, block: int = 1024) -> tuple:
    """(programs a row, columns a program): ~4 waves of programs over all rows, a block of columns at least each."""
    per_row = max(1, min(triton.cdiv(N, block), triton.cdiv(4 * sms, max(R, 1))))
    chunk = triton.cdiv(triton.cdiv(N, per_row), block) * block
    return triton.cdiv(N, chunk), chunk


class RowTopkPlan:
    """The five launches of one call shape (R rows of N, x's row stride, k): P programs a row of `chunk` columns
    (plan). Called with x, out [R, k] int32 (contiguous), scratch (>= R * SCR int32 zeros, zero again when the last
    pass ends) and counts (>= 2 * R * P int32); n_scratch / n_counts say how many."""

    def __init__(self, R: int, N: int, k: int, sx: int, sms: int, block: int = 1024):
        P, chunk = plan(R, N, sms, block)
        self.n_scratch, self.n_counts, self.ints = R * SCR.value, 2 * R * P, (N, k, chunk, sx, k)
        self.launches = [Launch(_row_topk_kernel, (P, R), PASS=ps, NBIN=nbin, PP=triton.next_power_of_2(P),
                                BLOCK=block, num_warps=4)
                         for ps, nbin in ((1, NB1.value), (2, NB2.value), (3, NB3.value), (4, 16), (5, 16))]

    def __call__(self, x, out, scratch, counts) -> None:
        for go in self.launches:
            go(x, out, scratch, counts, *self.ints)
