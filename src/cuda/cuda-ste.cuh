// SPDX-License-Identifier: Apache-2.0
// cuda-ste.cuh: the straight-through estimator's pass test on the device, shared by the backward's
// passes (cuda-backward.cu) and bie_binarize_ste (cuda-forward.cu), which saves it as mask bits
// for a backward from the sign bits: both must decide every element alike.
#pragma once

#include "cuda-impl.cuh"

// Whether the STE passes the gradient of the element x' (r = x'/scale_a, rounded to nearest;
// binary: |r| <= 1, n-bit: lo <= r <= hi). A binary layer with 0 < scale_a < inf needs no
// division: |r| <= 1 exactly when |x'| <= scale_a: a quotient in (1, 1 + 2^-24] (rounded to 1)
// would need a float x' in (s, s (1 + 2^-24)], but with s = m 2^e (m < 2^24 an integer) the next
// float above s is s + 2^e, beyond it. (NaN x' fails both tests.)
__device__ __forceinline__ bool ste_division_free(int quant, float s_a) {
    return quant == BIE_QUANT_BINARY && s_a > 0.0f && s_a < INFINITY;
}
__device__ __forceinline__ bool ste_passes_r(float r, int quant, int lo, int hi) { // from r itself
    return quant == BIE_QUANT_BINARY ? fabsf(r) <= 1.0f : r >= (float)lo && r <= (float)hi;
}
__device__ __forceinline__ bool ste_passes(float xp, float s_a, int quant, int lo, int hi) {
    if (ste_division_free(quant, s_a)) return fabsf(xp) <= s_a;
    return ste_passes_r(__fdiv_rn(xp, s_a), quant, lo, hi);
}
// The binary test for 8 values, bit e for value e; bin_s = ste_division_free(BINARY, s_a), worked
// out once per thread.
__device__ __forceinline__ uint32_t ste_pass_bits8(const float * v, float s_a, bool bin_s) {
    uint32_t b = 0;
    if (bin_s)
#pragma unroll
        for (int e = 0; e < 8; e++) b |= (fabsf(v[e]) <= s_a ? 1u : 0u) << e;
    else
#pragma unroll
        for (int e = 0; e < 8; e++) b |= (ste_passes_r(__fdiv_rn(v[e], s_a), BIE_QUANT_BINARY, 0, 0) ? 1u : 0u) << e;
    return b;
}
