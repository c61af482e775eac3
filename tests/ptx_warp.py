"""A tiny interpreter of the PTX subset that the inline-asm kernels use, run over a whole warp in lock step, so
tests can check fragment layouts and byte tricks on a CPU. Instructions: mov.b32 / mov.b64 {lo, hi}, shr.b32,
shl.b32, xor.b32, and.b32, or.b32, sub.u32, add.u32, prmt.b32 (default mode) and
mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 (fragments as in the PTX ISA's m16n8k32 .s8 tables)."""
import re

M32 = 0xFFFFFFFF


def _prmt(a, b, c):
    """PTX prmt.b32 default mode: byte i of d is byte (sel_i & 7) of {b, a} (a = bytes 0-3), or, when bit 3 of
    sel_i is set, that byte's msb replicated."""
    src = (a & M32) | ((b & M32) << 32)
    d = 0
    for i in range(4):
        sel = (c >> (4 * i)) & 0xF
        byte = (src >> (8 * (sel & 7))) & 0xFF
        if sel & 8:
            byte = 0xFF if byte & 0x80 else 0
        d |= byte << (8 * i)
    return d


def _s8(word, i):
    v = (word >> (8 * i)) & 0xFF
    return v - 256 if v >= 128 else v


def _mma_m16n8k32_s8(a_regs, b_regs, c_regs):
    """a_regs[lane] 4 words, b_regs[lane] 2 words, c_regs[lane] 4 int32 -> d_regs[lane] 4 int32."""
    A = [[0] * 32 for _ in range(16)]
    B = [[0] * 8 for _ in range(32)]
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i in range(16):  # a_i: row g for i in 0-3, 8-11, else g + 8; col 4t + (i & 3) (+16 for i >= 8)
            row = g if (i < 4 or 8 <= i < 12) else g + 8
            col = 4 * t + (i & 3) + (16 if i >= 8 else 0)
            A[row][col] = _s8(a_regs[lane][i // 4], i % 4)
        for i in range(8):  # b_i: row 4t + (i & 3) (+16 for i >= 4), col g
            B[4 * t + (i & 3) + (16 if i >= 4 else 0)][g] = _s8(b_regs[lane][i // 4], i % 4)
    out = []
    for lane in range(32):
        g, t = lane // 4, lane % 4
        d = []
        for i in range(4):  # c_i: row g (i < 2) or g + 8, col 2t + (i & 1)
            row, col = (g if i < 2 else g + 8), 2 * t + (i & 1)
            d.append((c_regs[lane][i] + sum(A[row][k] * B[k][col] for k in range(32))) & M32)
        out.append(d)
    return out


def run_warp(asm: str, operands):
    """Run `asm` (the text given to tl.inline_asm_elementwise) for 32 lanes. operands[lane] maps each $n that is
    an input to its value (64-bit values for 'l' operands); returns the final values of every $n per lane."""
    body = asm.strip()
    assert body[0] == "{" and body[-1] == "}"
    stmts = [s.strip() for s in body[1:-1].replace("\n", " ").split(";") if s.strip()]
    regs = [dict(operands[lane]) for lane in range(32)]

    def names(decl):  # ".reg .b32 a, b<3>" -> declared names
        out = []
        for n in decl.split(","):
            n = n.strip()
            m = re.fullmatch(r"(\w+)<(\d+)>", n)
            out += [f"{m.group(1)}{i}" for i in range(int(m.group(2)))] if m else [n]
        return out

    def val(r, x):
        x = x.strip()
        if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", x):
            return int(x, 0) & M32
        return r[x]

    for st in stmts:
        op, _, rest = st.partition(" ")
        args = [a.strip() for a in re.split(r",(?![^{]*})", rest)]
        if op == ".reg":
            continue
        if op.startswith("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"):
            lists = [[x.strip() for x in a.strip("{} ").split(",")] for a in args]
            d = _mma_m16n8k32_s8([[val(regs[ln], x) for x in lists[1]] for ln in range(32)],
                                 [[val(regs[ln], x) for x in lists[2]] for ln in range(32)],
                                 [[val(regs[ln], x) for x in lists[3]] for ln in range(32)])
            for ln in range(32):
                for name, v in zip(lists[0], d[ln]):
                    regs[ln][name] = v
            continue
        for r in regs:
            if op == "mov.b64":
                lo, hi = [x.strip() for x in args[0].strip("{} ").split(",")]
                v = r[args[1]]
                r[lo], r[hi] = v & M32, (v >> 32) & M32
            elif op in ("mov.b32", "mov.u32"):
                r[args[0]] = val(r, args[1])
            elif op in ("shr.b32", "shr.u32"):
                r[args[0]] = val(r, args[1]) >> val(r, args[2])
            elif op == "shl.b32":
                r[args[0]] = (val(r, args[1]) << val(r, args[2])) & M32
            elif op == "xor.b32":
                r[args[0]] = val(r, args[1]) ^ val(r, args[2])
            elif op == "and.b32":
                r[args[0]] = val(r, args[1]) & val(r, args[2])
            elif op == "or.b32":
                r[args[0]] = val(r, args[1]) | val(r, args[2])
            elif op == "sub.u32":
                r[args[0]] = (val(r, args[1]) - val(r, args[2])) & M32
            elif op == "add.u32":
                r[args[0]] = (val(r, args[1]) + val(r, args[2])) & M32
            elif op == "prmt.b32":
                r[args[0]] = _prmt(val(r, args[1]), val(r, args[2]), val(r, args[3]))
            else:
                raise NotImplementedError(op)
    return regs
