"""FP8 (e4m3fn) quantisation pieces shared by the kernels that can emit FP8."""

from __future__ import annotations

import triton
import triton.language as tl

from kernels._common import FP8_E4M3_MAX, FP8_MIN_AMAX

# Globals a jitted function reads must be constexpr.
FP8_MAX = tl.constexpr(FP8_E4M3_MAX)
MIN_AMAX = tl.constexpr(FP8_MIN_AMAX)


@triton.jit
def round_to_e4m3(v):  # type: ignore[no-untyped-def]
    """Round float32 values (already clamped to +-448) to the nearest e4m3fn value, ties to even.

    Only used under Triton's CPU interpreter: its float32 -> fp8 conversion drops the carry when
    rounding up crosses a power of two (31.6 becomes 16, not 32). After this rounding the value
    is exactly representable, so the interpreter's conversion has nothing left to round. On a
    GPU the hardware conversion already rounds correctly and this function is not compiled in.
    """
    bits = v.to(tl.int32, bitcast=True)
    # Keep 3 of float32's 23 mantissa bits: add just under half an e4m3 ulp plus the lowest
    # kept bit (ties to even), then clear the dropped bits. A carry moves into the exponent,
    # which is exactly the step the interpreter misses.
    rounded = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000
    normal = rounded.to(tl.float32, bitcast=True)
    # Below 2^-6 e4m3 is subnormal with a fixed step of 2^-9; adding and removing 1.5 * 2^23
    # rounds v * 512 to an integer, ties to even, in float32 arithmetic.
    sub = ((v * 512.0 + 12582912.0) - 12582912.0) / 512.0
    return tl.where(tl.abs(v) < 0.015625, sub, normal)
