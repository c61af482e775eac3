"""Small @triton.jit helpers shared by several ops."""
import triton
import triton.language as tl


@triton.jit
def prefetch_l2(ptrs, ok):
    """Fire-and-forget prefetch of the lines at ptrs (where ok) into L2: no registers held, nothing waits on it.

    L2 is the GPU's point of coherence, so this is safe even before griddepcontrol.wait (a later write by the
    preceding kernel lands in L2 and is what the loads after the wait see). GPU only (inline PTX)."""
    tl.inline_asm_elementwise("{\n.reg .pred p;\nsetp.ne.b32 p, $2, 0;\n@p prefetch.global.L2 [$1];\nmov.u32 $0, 0;\n}",
                              "=r,l,r", [ptrs, ok.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
