// SPDX-License-Identifier: Apache-2.0
// cuda-epilogue.cuh: the layer epilogue that both tensor-core GEMMs (cuda-gemm.cu, mma.sync;
// cuda-wgmma-kernel.cuh, sm_90a wgmma) apply to their raw accumulators: the binary dot product from
// AND-popcounts (with the zero-padding correction of convolutions), the scale, and the store to y
// in its dtype and layout. The formulas are written out in cuda-gemm.cu's header comment.
#pragma once

#include "cuda-impl.cuh"

namespace {

// Row facts needed by the epilogue: output coordinates and the zero-padding correction.
struct row_info {
    int64_t nb, oh, ow;
    int rowpop;
    int64_t kterm; // number of valid positions (K, or C*|V| for zero padding)
    int border;    // border class of the pixel (zero padding only; 0: no tap outside the image)
    bool valid;
};

__device__ __forceinline__ row_info make_row(const gemm_epilogue & ep, int64_t m, int64_t M) {
    row_info r;
    r.valid = m < M;
    if (!r.valid) return r;
    const struct dgeom & g = ep.g;
    if (g.OH == 1 && g.OW == 1) { // linear: no division
        r.nb = m;
        r.oh = r.ow = 0;
    } else { // 32-bit divisions (M < 2^31 is checked on the host)
        const uint32_t mm = (uint32_t)m, ow = (uint32_t)g.OW, oh = (uint32_t)g.OH;
        r.ow = mm % ow;
        r.oh = (mm / ow) % oh;
        r.nb = mm / (ow * oh);
    }
    r.rowpop = ep.binary && ep.rowpop ? ep.rowpop[m] : 0; // (a GEMM that counts them itself passes NULL)
    r.kterm = g.K;
    r.border = 0;
    if (ep.tapcorr) zero_pad_terms(g, ep.border, (int)r.oh, (int)r.ow, &r.kterm, &r.border);
    return r;
}

// The +-1 dot product from acc = popc(a & w) and the two popcounts (colterm: popc(w) over the
// row's valid taps).
__device__ __forceinline__ int dot_from_terms(int acc, int rowpop, int colterm, int64_t kterm) {
    return 4 * acc - 2 * rowpop - 2 * colterm + (int)kterm;
}

// The layer's integer result from the GEMM's acc (binary: the +-1 dot product from AND-popcounts).
__device__ __forceinline__ int binary_dot(const gemm_epilogue & ep, const row_info & r, int64_t n, int acc) {
    if (!ep.binary) return acc;
    const int corr = r.border ? ep.tapcorr[r.border * ep.g.O + n] : 0; // adds back 2 popc(w) off the image
    return dot_from_terms(acc, r.rowpop, ep.colpop[n], r.kterm) + corr;
}

// Stores one finished dot product (any y layout; B1 y: its sign code for the packed writer).
__device__ __forceinline__ void store_dot(const gemm_epilogue & ep, const row_info & r, int64_t n, int dot,
                                          float scale) {
    const struct dview & y = ep.y;
    if (y.dtype == BIE_DTYPE_B1) {
        ep.sign[((r.nb * ep.g.O + n) * ep.g.OH + r.oh) * ep.g.OW + r.ow] = dot >= 0 ? 1 : 0;
        return;
    }
    const int64_t off = dview_off4(y, r.nb, n, r.oh, r.ow);
    if (y.dtype == BIE_DTYPE_I32) ((int32_t *)y.data)[off] = dot;
    else st_float(y.data, y.dtype, off, __fmul_rn(__int2float_rn(dot), scale));
}

// Stores the finished dot products of columns n and n+1 (two: n+1 < N) of one row: as a pair of
// f16/bf16 (one 4-byte store) when y's features are contiguous and aligned, else one by one.
__device__ __forceinline__ void store_pair(const gemm_epilogue & ep, const row_info & r, int64_t n, int d0, int d1,
                                           bool two, float scale) {
    const struct dview & y = ep.y;
    if (y.dtype == BIE_DTYPE_B1 || (y.stride[1] != 1 && ep.g.O > 1)) { // element by element
        store_dot(ep, r, n, d0, scale);
        if (two) store_dot(ep, r, n + 1, d1, scale);
        return;
    }
    const int64_t off = r.nb * y.stride[0] + r.oh * y.stride[2] + r.ow * y.stride[3] + n;
    if (y.dtype == BIE_DTYPE_I32) {
        ((int32_t *)y.data)[off] = d0;
        if (two) ((int32_t *)y.data)[off + 1] = d1;
        return;
    }
    const bool pair = two && (off & 1) == 0 && (((uintptr_t)y.data) & 3) == 0;
    const float v0 = __fmul_rn(__int2float_rn(d0), scale), v1 = __fmul_rn(__int2float_rn(d1), scale);
    if (y.dtype == BIE_DTYPE_F16 && pair) {
        *(__half2 *)((__half *)y.data + off) = __halves2half2(__float2half_rn(v0), __float2half_rn(v1));
    } else if (y.dtype == BIE_DTYPE_BF16 && pair) {
        *(__nv_bfloat162 *)((__nv_bfloat16 *)y.data + off) =
            __halves2bfloat162(__float2bfloat16_rn(v0), __float2bfloat16_rn(v1));
    } else {
        st_float(y.data, y.dtype, off, v0);
        if (two) st_float(y.data, y.dtype, off + 1, v1);
    }
}

} // namespace
