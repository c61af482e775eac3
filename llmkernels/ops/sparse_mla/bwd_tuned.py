"""Block configs of the sparse MLA backward by head block of the Triton passes (the v2 sweep,
benchmarks/notes/sparse_mla_bwd.md)."""
TUNED = {
    128: {'p_bh': 64, 'p_bn': 32, 'p_warps': 4, 'p_stages': 3,
          'g_bh': 128, 'g_bn': 64, 'g_dc': 64, 'g_warps': 4, 'g_stages': 3, 'hints': False},
    64: {'p_bh': 64, 'p_bn': 32, 'p_warps': 4, 'p_stages': 3,
         'g_bh': 64, 'g_bn': 64, 'g_dc': 128, 'g_warps': 4, 'g_stages': 3, 'hints': False},
}
