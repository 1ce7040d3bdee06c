// SPDX-License-Identifier: Apache-2.0
// cuda-ste.cuh: the straight-through estimator's pass test on the device, shared by the backward's
// passes (cuda-backward.cu) and bie_binarize_ste (cuda-forward.cu, cuda-pack-rows.cu), which
// saves it as mask bits for a backward from the sign bits: both must decide every element alike.
#pragma once

#include "cuda-impl.cuh"

#include <type_traits>

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

// The element type of a pass over saved bits: a byte holds the sign bits of 8 consecutive
// elements of x (bit e for element e), and the STE mask's byte beside it their pass bits.
struct sbits {
    uint8_t b;
};
template <typename T> constexpr bool is_sbits = std::is_same<T, sbits>::value;

// The fused STE pass of the backward (cuda-ste-pass.cu): from dCol, the tap sums of grad_x's GEMM or
// convolution (before scale_w), it writes grad_x (masked), grad_scale_a and grad_bias_a.
//   rows:  x, xm (saved bits' mask) and gx are [rows, C] 4-D views whose dims 0 and 1 are the rows
//          and their contiguous features; dCol is dense [rows][C]; g.batch = rows, g.C = C.
//   tiles: x and gx are [batch, C, H, W] views of any strides (float x only); dCol holds the tap
//          sums of g's geometry (rows (n, oh, ow), columns (i*kw + j)*C + c); an f16/bf16 dCol
//          only as one tap per pixel (a 1x1, stride-1 geometry over x's own pixels, dense NHWC).
struct ste_pass_job {
    struct dview x, xm, bias; // bias [C] or data NULL; xm: data NULL unless x is B1
    struct dview gm;          // grad_x_mask (rows, with saved bits: gates grad_x alone), or data NULL
    struct dgeom g;
    int quant;
    struct dscale sa, sw;
    const void * dcol;
    int dcol_dtype;       // F32, F16 or BF16
    struct dview gx;      // grad_x, or data NULL (not written)
    struct dview gadd;    // grad_x_add (viewed as gx is), added to grad_x last, or data NULL
    struct dview gb, gsa; // grad_bias_a [C] and grad_scale_a, or data NULL (not wanted)
    int64_t xnumel;
    bool rows;
};
// Device workspace the pass needs (its partial sums).
size_t bie_cuda_ste_pass_workspace(const ste_pass_job & j);
enum bie_status bie_cuda_ste_pass(bie_context_t * ctx, cudaStream_t s, const ste_pass_job & j, void * ws);
