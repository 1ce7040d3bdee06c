// SPDX-License-Identifier: Apache-2.0
// cuda-wq.cuh: what the weight-only n-bit layer's CUDA files share (cuda-wq.cu: dispatch, the
// generic decode, prefill and backward; cuda-wq-decode.cu: the mma decode kernel): the device views
// of the weight and of x', the workspace allocator, and the mma decode path's entry points.
#pragma once

#include <type_traits>

#include "cuda/cuda-impl.cuh"

extern "C" {
#include "wq-impl.h"
}

#define WQ_MAX_DECODE_M 16 // rows of the generic decode (wq_simt_kernel)
#define WQ_MMA_MAX_M 32    // rows of the mma decode kernel

struct wq_dev {
    const uint32_t * qw;
    int64_t K, N, rows, G, gs;
    int bits;              // uniform bits, or 0
    const int32_t * gbits; // device [G] (mixed)
    const int64_t * gword; // device [G+1] (mixed)
    int zero;
    const char * scales;
    const char * zeros;
    int sdt, zdt;
};

__device__ __forceinline__ uint32_t wq_code(const wq_dev & w, int64_t r, int64_t n) {
    const int64_t g = qdiv(r, w.gs);
    const int b = w.bits ? w.bits : w.gbits[g];
    const int64_t bit = w.bits ? r * b : w.gword[g] * 32 + (r - g * w.gs) * b;
    const int64_t wi = bit >> 5;
    const int sh = (int)(bit & 31);
    uint64_t v = w.qw[wi * w.N + n];
    if (sh + b > 32 && wi + 1 < w.rows) v |= (uint64_t)w.qw[(wi + 1) * w.N + n] << 32;
    return (uint32_t)(v >> sh) & ((1u << b) - 1u);
}

// The weight of code q in a group of scale s and zero z (2^(b-1) for SYM): s*(q - z), or s*q - z
// for OFFSET; and the group's correction c of y += s * sum(x'*q) - c * sum(x'): s*z, or z for
// OFFSET. f32 operations as in wq-impl.h (these files are built without FMA contraction).
__device__ __forceinline__ float wq_weight(int zero, float s, float z, float q) {
    return zero == BIE_WQ_ZERO_OFFSET ? s * q - z : s * (q - z);
}
__device__ __forceinline__ float wq_correction(int zero, float s, float z) {
    return zero == BIE_WQ_ZERO_OFFSET ? z : s * z;
}

// The zero of group g, column n (2^(b-1) for SYM).
__device__ __forceinline__ float wq_zero(const wq_dev & w, int64_t g, int64_t n, int b) {
    return w.zero == BIE_WQ_ZERO_SYM ? (float)(1 << (b - 1)) : ld_float(w.zeros, w.zdt, g * w.N + n);
}

// W[r, n].
__device__ __forceinline__ float wq_value(const wq_dev & w, int64_t r, int64_t n) {
    const int64_t g = qdiv(r, w.gs);
    const int b = w.bits ? w.bits : w.gbits[g];
    return wq_weight(w.zero, ld_float(w.scales, w.sdt, g * w.N + n), wq_zero(w, g, n, b), (float)wq_code(w, r, n));
}

struct wq_x {
    dview x; // [M, K] 2-D view (4-D right-aligned)
    const int32_t * perm;
    const char * cs;
    int csdt;
};

// x'[m, r] = x[m, k] * channel_scale[k] (where given) with k = perm[r] (where given, clamped: a bad
// perm never reads out of bounds), or k = r. wq_xload's X: x's element type where the caller knows it.
__device__ __forceinline__ int64_t wq_xcol(const wq_x & a, int64_t r, int64_t K) {
    const int64_t k = a.perm ? (int64_t)a.perm[r] : r;
    return k < 0 ? 0 : k >= K ? K - 1 : k;
}
template <typename X = void> __device__ __forceinline__ float wq_xload(const wq_x & a, int64_t m, int64_t k) {
    const int64_t off = m * a.x.stride[2] + k * a.x.stride[3];
    if constexpr (std::is_void<X>::value) return ld_float(a.x.data, a.x.dtype, off);
    else return to_f32(((const X *)a.x.data)[off]);
}
__device__ __forceinline__ float wq_xscaled(const wq_x & a, int64_t k, float v) {
    return a.cs ? v * ld_float(a.cs, a.csdt, k) : v;
}
__device__ __forceinline__ float wq_xprime(const wq_x & a, int64_t m, int64_t r, int64_t K) {
    const int64_t k = wq_xcol(a, r, K);
    return wq_xscaled(a, k, wq_xload(a, m, k));
}

inline unsigned blocks_for(int64_t n, int per) { return (unsigned)((n + per - 1) / per); }

// Bump allocator over the context's device workspace (256-byte pieces).
struct wq_ws {
    char * base;
    size_t used;
};
inline void * take(wq_ws & a, size_t bytes) {
    void * p = a.base + a.used;
    a.used += (bytes + 255) / 256 * 256;
    return p;
}

inline wq_x x_of(const struct bie_wq_call * c, const struct bie_tensor * x) {
    wq_x a;
    dview_make(x, &a.x);
    a.perm = (const int32_t *)c->perm.data;
    a.cs = (const char *)c->channel_scale.data;
    a.csdt = c->channel_scale.data ? (int)c->channel_scale.dtype : 0;
    return a;
}

// The mma decode path (cuda-wq-decode.cu): whether it takes the call (M <= 32, f16/bf16 x, uniform
// 2/4/8 bits, N % 4 == 0, groups of whole chunks), its split of the K range into S ranges of cps
// chunks, and the call itself (x' staging where it takes it, then the kernel writing part[S][M][N]).
bool wq_mma_ok(const struct bie_wq_call * c);
void wq_mma_plan(bie_context_t * ctx, const struct bie_wq_call * c, int64_t * S, int64_t * cps);
enum bie_status wq_decode_mma(bie_context_t * ctx, const struct bie_wq_call * c, wq_ws & a, const wq_dev & w, int64_t S,
                              int64_t cps, float * part);
