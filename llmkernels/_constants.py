"""Constants shared by the kernels and their host code (one place: written out elsewhere they drift)."""
import triton.language as tl

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E), the kernels' softmax runs in base 2
LN2 = 0.6931471805599453    # ln(2): log(x) = log2(x) * LN2
LOG2E_C = tl.constexpr(LOG2E)  # kernels (Triton and Gluon) may only read constexpr globals
LN2_C = tl.constexpr(LN2)
