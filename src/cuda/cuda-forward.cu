// SPDX-License-Identifier: Apache-2.0
// cuda-forward.cu: the forward pass of every layer on CUDA tensors: operands are packed into the
// workspace (activations binarized or quantized and laid out as implicit-GEMM rows; weights
// likewise), then the tensor-core GEMM (cuda-gemm.cu) runs with the epilogue fused.
//
// Row layout (both operands): row m of A is output position (n, oh, ow) of the conv (a linear
// layer is a conv with 1x1 images), row o of B is output channel o; position k of a row is
// (tap t = i*kw + j, channel c) with k = t*C + c (channels fastest, NHWC order). Rows are padded
// with zeros to a multiple of 128 bytes.
//   binary: bit = (x' >= 0) with x' = f32(x) + f32(bias_a[c]) (NaN -> 0), a B1 x is copied as is;
//           a tap outside the image holds the pad value's bit (PLUS_ONE -> 1, MINUS_ONE -> 0,
//           ZERO -> 0 and the GEMM epilogue removes the tap, see cuda-gemm.cu); rowpop = popc(row)
//   n-bit:  int8 code clamp(rne(x'/scale_a), lo, hi) (NaN -> lo), 0 outside the image;
//           weights clamp(rne(W/scale_w)), an I8 weight clamped, an S4 weight as its code.
// Also bie_binarize_ste (at the end): the packer of a linear layer's float rows writes, in the same
// pass over x, the sign bits and the STE mask bits that the backward takes instead of x.
#include "cuda-impl.cuh"
#include "cuda-ste.cuh"

#include <stdio.h>

namespace {

struct pack_src {
    struct dview t;    // x [batch, C, H, W] or weight [O, C, kh, kw]
    struct dview bias; // [C] or data NULL
    struct dgeom g;
    int is_weight;
    int quant;
    struct dscale s;   // scale_a for x, scale_w for the weight
    uint32_t bias_period; // 0, or: rows hold several pixels, element k takes bias[k % bias_period]
};

// bias_a's element for element k of a row (the pixel's channel when rows hold several pixels).
__device__ __forceinline__ int64_t bias_index(const pack_src & p, int64_t k) {
    return p.bias_period ? (int64_t)((uint32_t)k % p.bias_period) : k;
}

// Where the elements of one tap of a row live: the offset of (row, c = 0, tap) and whether the tap
// lies inside the image (always for weights).
__device__ __forceinline__ bool tap_base(const pack_src & p, int64_t r0, int64_t r1, int64_t r2, int tap,
                                         int64_t * base) {
    const struct dgeom & g = p.g;
    const int i = tap / g.kw, j = tap % g.kw;
    if (p.is_weight) {
        *base = r0 * p.t.stride[0] + i * p.t.stride[2] + j * p.t.stride[3];
        return true;
    }
    const int64_t h = r1 * g.sh - g.ph + (int64_t)i * g.dh, w = r2 * g.sw - g.pw + (int64_t)j * g.dw;
    *base = r0 * p.t.stride[0] + h * p.t.stride[2] + w * p.t.stride[3];
    return h >= 0 && h < g.H && w >= 0 && w < g.W;
}

// The code of one element inside the image (or of the weight): a bit, or an int8 code.
__device__ __forceinline__ int elem_code(const pack_src & p, float s, int64_t off, int c) {
    float v = ld_float(p.t.data, p.t.dtype, off);
    if (p.bias.data) v = __fadd_rn(v, ld_float(p.bias.data, p.bias.dtype, c * p.bias.stride[3]));
    if (p.quant == BIE_QUANT_BINARY) return v >= 0.0f ? 1 : 0; // B1: ld_float gives +-1
    const int lo = qlo(p.quant), hi = qhi(p.quant);
    if (p.t.dtype == BIE_DTYPE_I8 || p.t.dtype == BIE_DTYPE_S4) return (int)fminf(fmaxf(v, (float)lo), (float)hi);
    return quant_code(v, s, lo, hi);
}

// A warp per row, 32 consecutive positions k at a time, one per lane (coalesced reads when the
// channels are contiguous): binary bits are gathered into a word by a warp ballot; int8 codes
// into words of 4 by two shuffles. Each lane walks its (tap, channel) position incrementally.
__global__ void pack_rows(pack_src p, int64_t rows, int64_t kbytes, uint8_t * out, int * pop) {
    const float s = ld_scale(p.s);
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    const int K = (int)p.g.K, C = (int)p.g.C;
    const int64_t sc = p.t.stride[1];
    const bool binary = p.quant == BIE_QUANT_BINARY;
    const int pad_code = binary && p.g.pad_value == BIE_PAD_PLUS_ONE ? 1 : 0;
    const int64_t chunks = binary ? kbytes / 4 : kbytes / 32; // 32 positions each
    for (int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; row < rows; row += warps) {
        int64_t r0 = row, r1 = 0, r2 = 0;
        if (!p.is_weight && (p.g.OH > 1 || p.g.OW > 1)) {
            const uint32_t rr = (uint32_t)row, OW = (uint32_t)p.g.OW, OH = (uint32_t)p.g.OH;
            r2 = rr % OW;
            r1 = (rr / OW) % OH;
            r0 = rr / (OW * OH);
        }
        uint32_t * dst = (uint32_t *)(out + row * kbytes);
        int k = lane, tap = lane / C, c = lane % C, cnt = 0;
        int64_t base = 0;
        bool inside = k < K && tap_base(p, r0, r1, r2, tap, &base);
        for (int64_t ch = 0; ch < chunks; ch++) {
            const int q = k >= K ? 0 : inside ? elem_code(p, s, base + c * sc, c) : pad_code;
            if (binary) {
                const uint32_t word = __ballot_sync(0xffffffffu, q != 0);
                if (lane == 0) {
                    dst[ch] = word;
                    cnt += __popc(word);
                }
            } else {
                uint32_t v = (uint32_t)q & 0xffu;
                v |= __shfl_down_sync(0xffffffffu, v, 1) << 8;
                v |= __shfl_down_sync(0xffffffffu, v, 2) << 16;
                if ((lane & 3) == 0) dst[ch * 8 + (lane >> 2)] = v;
            }
            k += 32;
            c += 32;
            if (c >= C) {
                while (c >= C) {
                    c -= C;
                    tap++;
                }
                if (k < K) inside = tap_base(p, r0, r1, r2, tap, &base);
            }
        }
        if (binary && pop && lane == 0) pop[row] = cnt;
    }
}

// The same packing for rows whose K elements are contiguous floats (a linear layer's x and
// weight, the common case): a warp per row, each lane turning 8 consecutive elements into one byte
// of bits (binary) or 8 int8 codes per step, so that a warp's loads are 32 consecutive 16-byte
// vectors (when the row is 16-byte aligned; element by element at the row's end). pack_rows, one
// element per lane per step, and a lane per 32 elements (a 64-byte stride between lanes) both
// leave much of the memory bandwidth unused.
// bias_a's 8 elements from element k0 (a vector load when they are contiguous and aligned).
__device__ __forceinline__ void bias8(const struct dview & b, int64_t k0, float * f) {
    const int64_t st = b.stride[3];
    if (st == 1) {
        const float * f32 = (const float *)b.data + k0;
        const __half * f16 = (const __half *)b.data + k0;
        const __nv_bfloat16 * b16 = (const __nv_bfloat16 *)b.data + k0;
        if (b.dtype == BIE_DTYPE_F32 && (uintptr_t)f32 % 16 == 0) return load8<float>(f32, f);
        if (b.dtype == BIE_DTYPE_F16 && (uintptr_t)f16 % 16 == 0) return load8<__half>(f16, f);
        if (b.dtype == BIE_DTYPE_BF16 && (uintptr_t)b16 % 16 == 0) return load8<__nv_bfloat16>(b16, f);
    }
#pragma unroll
    for (int e = 0; e < 8; e++) f[e] = ld_float(b.data, b.dtype, (k0 + e) * st);
}
// x' of 8 elements starting at element k0 of a row (0 past K): the floats plus bias_a.
template <typename T>
__device__ __forceinline__ void xprime8(const pack_src & p, const T * row, int64_t k0, bool vec, float * v) {
    if (vec) load8<T>(row + k0, v);
    else
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = k0 + e < p.g.K ? ld_float((const char *)row, p.t.dtype, k0 + e) : 0.0f;
    if (p.bias.data)
#pragma unroll
        for (int e = 0; e < 8; e++)
            if (k0 + e < p.g.K)
                v[e] = __fadd_rn(v[e], ld_float(p.bias.data, p.bias.dtype, bias_index(p, k0 + e) * p.bias.stride[3]));
}
// Codes of 8 elements starting at element k0 of a row (0 past K), as in elem_code.
template <typename T>
__device__ __forceinline__ void codes8(const pack_src & p, const T * row, int64_t k0, bool vec, float s, int * q) {
    float v[8];
    xprime8<T>(p, row, k0, vec, v);
    const bool binary = p.quant == BIE_QUANT_BINARY;
    const int lo = qlo(p.quant), hi = qhi(p.quant);
#pragma unroll
    for (int e = 0; e < 8; e++) q[e] = k0 + e >= p.g.K ? 0 : binary ? (v[e] >= 0.0f ? 1 : 0) : quant_code(v[e], s, lo, hi);
}

// The sign bits (x >= 0, so -0 -> 1 and NaN -> 0, as in elem_code) of 8 loaded elements, bit e
// for element e: two-byte floats compared in pairs (HSET2), then the pairs' bits interleaved.
__device__ __forceinline__ uint32_t sign_bits_f32(const float * v) {
    uint32_t b = 0;
#pragma unroll
    for (int e = 0; e < 8; e++) b |= (v[e] >= 0.0f ? 1u : 0u) << e;
    return b;
}
template <typename T> __device__ __forceinline__ uint32_t sign_bits8(const raw8<T> & r);
template <> __device__ __forceinline__ uint32_t sign_bits8<float>(const raw8<float> & r) {
    return sign_bits_f32((const float *)r.u);
}
template <typename T2> __device__ __forceinline__ uint32_t sign_bits8_pairs(const uint4 & u, T2 zero) {
    const T2 * h = (const T2 *)&u;
    uint32_t acc = 0; // element 2i at bit 2i, element 2i+1 at bit 16 + 2i
#pragma unroll
    for (int i = 0; i < 4; i++) acc |= (__hge2_mask(h[i], zero) & 0x00010001u) << (2 * i);
    return (acc & 0x55u) | ((acc >> 15) & 0xAAu);
}
template <> __device__ __forceinline__ uint32_t sign_bits8<__half>(const raw8<__half> & r) {
    return sign_bits8_pairs<__half2>(r.u[0], __float2half2_rn(0.0f));
}
template <> __device__ __forceinline__ uint32_t sign_bits8<__nv_bfloat16>(const raw8<__nv_bfloat16> & r) {
    return sign_bits8_pairs<__nv_bfloat162>(r.u[0], __float2bfloat162_rn(0.0f));
}

// bie_binarize_ste's outputs, written by pack_contiguous_rows<T, true, BIAS> (STE) instead of GEMM rows:
// rows of exactly K bits that start on whole bytes, `_ld` bytes apart, the sign bits in `bits` and
// the STE's pass bits in `mask` (either NULL: not written; binary x' only). The bits of a row's
// last byte that lie past K keep their content.
struct ste_out {
    uint8_t * bits, * mask;
    int64_t bits_ld, mask_ld;
};
// Stores byte j of a bit row (row NULL: nothing) whose first n bits (n < 8 only in the row's last
// byte) belong to the row; the others keep their content.
__device__ __forceinline__ void put_bits8(uint8_t * row, int64_t j, uint32_t byte, int n) {
    if (!row) return;
    row[j] = n >= 8 ? (uint8_t)byte : (uint8_t)((row[j] & (0xffu << n)) | (byte & ((1u << n) - 1u)));
}

// The whole groups of a row that pack_contiguous_rows takes PU at a time: groups j, j + 32, ...
// below j1 (a lane's share) while PU of them lie inside K, their loads issued before any store
// (which the compiler may not move them past), so that a row is a few round trips. f(g, raw)
// takes group g's 8 loaded elements. Returns the first group left.
template <typename T, typename F>
__device__ __forceinline__ int64_t vector_groups(const T * src, int64_t j, int64_t j1, int64_t K, F && f) {
    constexpr int PU = sizeof(T) == 4 ? 4 : 8;
    for (; (j + 32 * (PU - 1)) * 8 + 8 <= K && j + 32 * (PU - 1) < j1; j += 32 * PU) {
        raw8<T> v[PU];
#pragma unroll
        for (int u = 0; u < PU; u++) v[u] = raw8_load<T>(src + (j + 32 * u) * 8);
#pragma unroll
        for (int u = 0; u < PU; u++) f(j + 32 * u, v[u]);
    }
    return j;
}

// x' = x + bias_a of group g's 8 loaded elements (x itself without BIAS).
template <typename T, bool BIAS>
__device__ __forceinline__ void group_xprime(const pack_src & p, int64_t g, const raw8<T> & r, float * f) {
    if constexpr (BIAS) { // (bias_a's loads issued first: the conversion runs while they are in flight)
        float b[8];
        bias8(p.bias, bias_index(p, g * 8), b); // (a period is a multiple of 8: the 8 share a pixel)
        raw8_floats<T>(r, f);
#pragma unroll
        for (int e = 0; e < 8; e++) f[e] = __fadd_rn(f[e], b[e]);
    } else {
        raw8_floats<T>(r, f);
    }
}

// The sign groups of a row (vector_groups): writes the sign bytes (and, STE, the pass bytes) or
// adds their popcounts to cnt.
template <typename T, bool STE, bool BIAS>
__device__ __forceinline__ int64_t sign_groups(const pack_src & p, const T * src, int64_t j, int64_t j1, int64_t K,
                                               float s, bool bin_s, uint8_t * dst, uint8_t * mdst, int & cnt) {
    return vector_groups<T>(src, j, j1, K, [&](int64_t g, const raw8<T> & r) {
        float f[8];
        uint32_t byte;
        if constexpr (BIAS) {
            group_xprime<T, true>(p, g, r, f);
            byte = sign_bits_f32(f);
        } else {
            byte = sign_bits8<T>(r);
        }
        if constexpr (STE) { // (whole groups: no bits past K)
            put_bits8(dst, g, byte, 8);
            if (!mdst) return;
            if constexpr (!BIAS) raw8_floats<T>(r, f);
            mdst[g] = (uint8_t)ste_pass_bits8(f, s, bin_s);
        } else {
            dst[g] = (uint8_t)byte;
            cnt += __popc(byte);
        }
    });
}

// Group j's 8 int8 codes, stored as the j-th 8 bytes of a GEMM row.
__device__ __forceinline__ void put_codes8(uint8_t * row, int64_t j, const int * q) {
    const uint32_t w0 = (q[0] & 0xff) | (q[1] & 0xff) << 8 | (q[2] & 0xff) << 16 | (uint32_t)(q[3] & 0xff) << 24;
    const uint32_t w1 = (q[4] & 0xff) | (q[5] & 0xff) << 8 | (q[6] & 0xff) << 16 | (uint32_t)(q[7] & 0xff) << 24;
    ((uint2 *)row)[j] = make_uint2(w0, w1);
}

// The n-bit code groups of a row (vector_groups), as in elem_code.
template <typename T, bool BIAS>
__device__ __forceinline__ int64_t code_groups(const pack_src & p, const T * src, int64_t j, int64_t j1, int64_t K,
                                               float s, uint8_t * dst) {
    const int lo = qlo(p.quant), hi = qhi(p.quant);
    return vector_groups<T>(src, j, j1, K, [&](int64_t g, const raw8<T> & r) {
        float f[8];
        int q[8];
        group_xprime<T, BIAS>(p, g, r, f);
#pragma unroll
        for (int e = 0; e < 8; e++) q[e] = quant_code(f[e], s, lo, hi);
        put_codes8(dst, g, q);
    });
}

template <typename T, bool STE, bool BIAS>
__global__ void pack_contiguous_rows(pack_src p, int64_t rows, int64_t kbytes, uint8_t * out, int * pop,
                                     int64_t seg_groups, ste_out so) {
    griddep_launch_dependents(); // a few-rows GEMM after it starts at once (and waits for it)
    const float s = ld_scale(p.s);
    const bool bin_s = STE && ste_division_free(BIE_QUANT_BINARY, s);
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    const bool binary = p.quant == BIE_QUANT_BINARY;
    // groups of 8 elements per row: the GEMM row's (zeros past K), or (STE) the row's own
    const int64_t K = p.g.K, groups = STE ? (K + 7) / 8 : binary ? kbytes : kbytes / 8;
    // A warp per (row, segment of seg_groups groups); several segments per row only without pop.
    const int64_t segs = (groups + seg_groups - 1) / seg_groups;
    for (int64_t u = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; u < rows * segs; u += warps) {
        const int64_t row = u / segs, j0 = u % segs * seg_groups, j1 = min(groups, j0 + seg_groups);
        const T * src = (const T *)p.t.data + row * p.t.stride[0];
        const bool aligned = ((uintptr_t)src % 16) == 0;
        uint8_t * dst = !STE ? out + row * kbytes : so.bits ? so.bits + row * so.bits_ld : NULL;
        uint8_t * mdst = STE && so.mask ? so.mask + row * so.mask_ld : NULL;
        int cnt = 0;
        int64_t j = j0 + lane;
        // The common case, raw vectors PU groups a lane (vector_groups): their signs (with bias_a,
        // of x' = x + bias_a), or their n-bit codes.
        if (binary && aligned) j = sign_groups<T, STE, BIAS>(p, src, j, j1, K, s, bin_s, dst, mdst, cnt);
        if constexpr (!STE)
            if (!binary && aligned) j = code_groups<T, BIAS>(p, src, j, j1, K, s, dst);
        for (; j < j1; j += 32) {
            int q[8];
            const int64_t k0 = j * 8;
            const bool vec = aligned && k0 + 8 <= K;
            if constexpr (STE) { // the rest: a row not 16-byte aligned, its last groups
                const int n = K - k0 < 8 ? (int)(K - k0) : 8;
                float v[8];
                xprime8<T>(p, src, k0, vec, v);
                put_bits8(dst, j, sign_bits_f32(v), n);
                if (mdst) put_bits8(mdst, j, ste_pass_bits8(v, s, bin_s), n);
                continue;
            }
            if (binary && vec && !p.bias.data) { // (the rest of the common case)
                const uint32_t byte = sign_bits8<T>(raw8_load<T>(src + k0));
                dst[j] = (uint8_t)byte;
                cnt += __popc(byte);
                continue;
            }
            codes8<T>(p, src, k0, vec, s, q);
            if (binary) {
                uint32_t byte = 0;
#pragma unroll
                for (int e = 0; e < 8; e++) byte |= (uint32_t)q[e] << e;
                dst[j] = (uint8_t)byte;
                cnt += __popc(byte);
            } else
                put_codes8(dst, j, q);
        }
        if (binary && pop) {
            for (int o = 16; o > 0; o >>= 1) cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
            if (lane == 0) pop[row] = cnt;
        }
    }
}

template <typename T, bool STE>
void launch_contiguous_kernel(const pack_src & p, unsigned grid, int64_t rows, int64_t kbytes, uint8_t * out, int * pop,
                              int64_t seg, const ste_out & so, cudaStream_t stream) {
    auto kern = p.bias.data ? pack_contiguous_rows<T, STE, true> : pack_contiguous_rows<T, STE, false>;
    kern<<<grid, 256, 0, stream>>>(p, rows, kbytes, out, pop, seg, so);
}
template <bool STE>
bool launch_contiguous_as(const pack_src & p, unsigned grid, int64_t rows, int64_t kbytes, uint8_t * out, int * pop,
                          int64_t seg, const ste_out & so, cudaStream_t stream) {
    if (p.t.dtype == BIE_DTYPE_F32)
        launch_contiguous_kernel<float, STE>(p, grid, rows, kbytes, out, pop, seg, so, stream);
    else if (p.t.dtype == BIE_DTYPE_F16)
        launch_contiguous_kernel<__half, STE>(p, grid, rows, kbytes, out, pop, seg, so, stream);
    else if (p.t.dtype == BIE_DTYPE_BF16)
        launch_contiguous_kernel<__nv_bfloat16, STE>(p, grid, rows, kbytes, out, pop, seg, so, stream);
    else
        return false;
    return true;
}
// Launches pack_contiguous_rows for a float p.t (rows p.t.stride[0] elements apart); false for
// other dtypes. so: bie_binarize_ste's outputs instead of the GEMM rows `out` (NULL: none).
// Without row popcounts to count (pop NULL: the few-rows GEMM counts them), few rows are split into
// segments of 32 groups a warp, so that 16 rows of 4096 elements take 256 warps instead of 16
// (each lane then waits for one load, not sixteen in turn).
bool launch_contiguous(const pack_src & p, int64_t rows, int64_t kbytes, uint8_t * out, int * pop, cudaStream_t stream,
                       const ste_out * so = NULL) {
    const int64_t groups = so ? (p.g.K + 7) / 8 : p.quant == BIE_QUANT_BINARY ? kbytes : kbytes / 8;
    const int64_t seg = !pop && rows < 1024 ? 32 : groups;
    const unsigned grid = grid_for(rows * ((groups + seg - 1) / seg), 8);
    if (so) return launch_contiguous_as<true>(p, grid, rows, kbytes, out, pop, seg, *so, stream);
    return launch_contiguous_as<false>(p, grid, rows, kbytes, out, pop, seg, ste_out{NULL, NULL, 0, 0}, stream);
}

// Run r of an integer weight row in an aligned row: 16 I8 codes (16 bytes) or 16 S4 nibbles (8
// bytes, in .x and .y).
__device__ __forceinline__ uint4 int_run(const uint8_t * bytes, int64_t r, bool s4) {
    if (!s4) return ((const uint4 *)bytes)[r];
    const uint2 h = ((const uint2 *)bytes)[r];
    return make_uint4(h.x, h.y, 0u, 0u);
}
// The 16 codes of a run of an integer weight row: I8 codes (v, 16 bytes) or S4 nibbles (v.x and
// v.y, 8 bytes, element 2i in the high nibble of byte i).
__device__ __forceinline__ void int_codes16(const uint4 & v, bool s4, int * q) {
    if (s4) {
#pragma unroll
        for (int e = 0; e < 16; e++) {
            const uint32_t word = e < 8 ? v.x : v.y, b = (word >> (8 * ((e % 8) / 2))) & 0xffu;
            const int nib = (e & 1) ? (int)(b & 15u) : (int)(b >> 4);
            q[e] = nib >= 8 ? nib - 16 : nib;
        }
    } else {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 16; e++) q[e] = (int)(int8_t)(w[e / 4] >> (8 * (e % 4)));
    }
}
// Run r of a GEMM row: 16 codes clamped to [lo, hi].
__device__ __forceinline__ void put_codes16(uint8_t * row, int64_t r, const int * q, int lo, int hi) {
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int e = 0; e < 16; e++) w[e / 4] |= (uint32_t)(min(max(q[e], lo), hi) & 0xff) << (8 * (e % 4));
    ((uint4 *)row)[r] = make_uint4(w[0], w[1], w[2], w[3]);
}

// Integer weights (I8 codes, or S4 nibbles with element 2i in the high nibble) whose rows are
// contiguous: a warp per row, 16 codes per lane and run, clamped to the layer's range as in
// elem_code. Runs inside an aligned row are read as 16-byte (I8) or 8-byte (S4) vectors, U runs a
// lane at a time with their loads issued first (one run at a time, each lane would wait for each
// load in turn).
__global__ void pack_int_rows(pack_src p, int64_t rows, int64_t kbytes, uint8_t * out) {
    constexpr int U = 4;
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    const int64_t K = p.g.K, runs = kbytes / 16;
    const bool s4 = p.t.dtype == BIE_DTYPE_S4;
    const int lo = qlo(p.quant), hi = qhi(p.quant);
    for (int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; row < rows; row += warps) {
        const int64_t e0 = row * p.t.stride[0]; // element (nibble for S4) offset of the row
        const uint8_t * bytes = (const uint8_t *)p.t.data + (s4 ? e0 / 2 : e0);
        uint8_t * dst = out + row * kbytes;
        const bool aligned = (!s4 || e0 % 2 == 0) && ((uintptr_t)bytes % (s4 ? 8 : 16)) == 0;
        int64_t r = lane;
        if (aligned)
            for (; (r + 32 * (U - 1)) * 16 + 16 <= K; r += 32 * U) {
                uint4 v[U];
#pragma unroll
                for (int u = 0; u < U; u++) v[u] = int_run(bytes, r + 32 * u, s4);
#pragma unroll
                for (int u = 0; u < U; u++) {
                    int q[16];
                    int_codes16(v[u], s4, q);
                    put_codes16(dst, r + 32 * u, q, lo, hi);
                }
            }
        for (; r < runs; r += 32) { // the rest: a row not aligned, its last runs, the padding
            int q[16];
            if (aligned && r * 16 + 16 <= K) {
                int_codes16(int_run(bytes, r, s4), s4, q);
            } else {
#pragma unroll
                for (int e = 0; e < 16; e++) {
                    const int64_t k = r * 16 + e;
                    q[e] = k < K ? (int)ld_float(p.t.data, p.t.dtype, e0 + k) : 0;
                }
            }
            put_codes16(dst, r, q, lo, hi);
        }
    }
}

// Implicit-GEMM rows of a binary conv whose x is B1 with whole 32-bit words of channels per pixel
// (C % 32 == 0, channels contiguous, word-aligned pixels: NHWC bits): a tap's C bits are C/32
// words of x, copied as they are (pad taps: all ones for PLUS_ONE, else zeros). A warp takes 8
// consecutive rows (output pixels, stepping ow, oh, n without divisions), a word per lane; what a
// lane's word is (tap offsets and channel word, or row padding) is worked out once for the 8 rows,
// whose loads are then in flight together, so a row costs a load, a store and a popcount per word.
// (Recomputing the position per word and row is bound by instruction issue; rows one after
// another wait for each row's loads in turn.)
constexpr int IW_ROWS = 8;   // consecutive rows per warp
struct word_pos {
    int dh, dw, cw; // tap's row and column offset from (oh*sh, ow*sw); channel word; cw < 0: row padding
};
__device__ __forceinline__ word_pos word_position(const struct dgeom & g, int w) {
    const int wpt = (int)(g.C / 32), tap = w / wpt;
    word_pos q;
    if (tap >= g.kh * g.kw) {
        q.dh = q.dw = 0;
        q.cw = -1;
        return q;
    }
    const int i = tap / g.kw, j = tap - i * g.kw;
    q.dh = i * g.dh - g.ph;
    q.dw = j * g.dw - g.pw;
    q.cw = w - tap * wpt;
    return q;
}
__device__ __forceinline__ uint32_t word_at(const uint32_t * x, const struct dgeom & g, int64_t xb, int64_t hb,
                                            int64_t wb, int64_t w2, int64_t w3, const word_pos & q, uint32_t pad) {
    if (q.cw < 0) return 0u;
    const int64_t h = hb + q.dh, w = wb + q.dw;
    return h >= 0 && h < g.H && w >= 0 && w < g.W ? __ldg(x + xb + h * w2 + w * w3 + q.cw) : pad;
}
// Rows with more than 32 words are split across warps (a warp per 8 rows and 32-word chunk) when
// whole rows per warp would leave the GPU short of warps (few rows, long rows: C = 512 at N = 128
// gives 784 warps of five chunks each); the chunks' popcounts then meet by atomic adds in `pop`,
// which the caller clears first.
__global__ void __launch_bounds__(256, 3) im2col_words(const uint32_t * x, struct dgeom g, int64_t w0, int64_t w2, int64_t w3, int64_t rows,
                             int64_t kbytes, uint32_t * out, int * pop, int split) {
    griddep_launch_dependents(); // (weight_terms may run beside it: it waits for it before it ends)
    const int lane = threadIdx.x & 31;
    const int64_t warp0 = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    const int words = (int)(kbytes / 4);
    const int chunks = split ? (words + 31) / 32 : 1; // work units per group of rows
    const int64_t units = (rows + IW_ROWS - 1) / IW_ROWS * chunks;
    const uint32_t pad = g.pad_value == BIE_PAD_PLUS_ONE ? 0xffffffffu : 0u;
    for (int64_t u = warp0; u < units; u += warps) {
        const int64_t r0 = u / chunks * IW_ROWS;
        const int wbeg = split ? (int)(u % chunks) * 32 : 0, wend = split ? min(wbeg + 32, words) : words;
        // The group's rows: their sample and top-left input pixel (stepping ow, oh, n).
        int64_t xb[IW_ROWS];
        int hb[IW_ROWS], wb[IW_ROWS]; // (padded input coordinates fit in 32 bits: checked on the host)
        {
            const uint32_t rr = (uint32_t)r0, OW = (uint32_t)g.OW, OH = (uint32_t)g.OH;
            int ow = (int)(rr % OW), oh = (int)((rr / OW) % OH);
            int64_t n = rr / (OW * OH);
#pragma unroll
            for (int r = 0; r < IW_ROWS; r++) {
                xb[r] = n * w0;
                hb[r] = oh * (int)g.sh;
                wb[r] = ow * (int)g.sw;
                if (++ow == g.OW) {
                    ow = 0;
                    if (++oh == g.OH) {
                        oh = 0;
                        n++;
                    }
                }
            }
        }
        const int nr = rows - r0 < IW_ROWS ? (int)(rows - r0) : IW_ROWS;
        int cnt[IW_ROWS];
#pragma unroll
        for (int r = 0; r < IW_ROWS; r++) cnt[r] = 0;
        // A word position at a time (worked out once for the group), the loads of all the group's
        // rows first (in flight together), then their stores.
        for (int wc = wbeg; wc < wend; wc += 32) {
            const int w = wc + lane;
            const word_pos q = word_position(g, w);
            uint32_t v[IW_ROWS];
#pragma unroll
            for (int r = 0; r < IW_ROWS; r++) v[r] = w < wend && r < nr ? word_at(x, g, xb[r], hb[r], wb[r], w2, w3, q, pad) : 0u;
#pragma unroll
            for (int r = 0; r < IW_ROWS; r++)
                if (w < wend && r < nr) {
                    out[(r0 + r) * words + w] = v[r];
                    cnt[r] += __popc(v[r]);
                }
        }
#pragma unroll
        for (int r = 0; r < IW_ROWS; r++) {
            const int c = (int)__reduce_add_sync(0xffffffffu, (unsigned)cnt[r]);
            if (lane == 0 && r < nr && pop) {
                if (split) atomicAdd(pop + r0 + r, c);
                else pop[r0 + r] = c;
            }
        }
    }
}

// Queues im2col_words over NHWC words of x (w0, w2, w3: the word strides of a sample, a row and a
// pixel), splitting long rows when whole rows per warp would give fewer than ~32 warps per SM.
enum bie_status launch_im2col_words(bie_context_t * ctx, cudaStream_t stream, const uint32_t * x, const struct dgeom & g,
                                    int64_t w0, int64_t w2, int64_t w3, int64_t rows, int64_t kbytes, uint32_t * out,
                                    int * pop) {
    const int sms = bie_cuda_sm_count(ctx);
    const int64_t groups = (rows + IW_ROWS - 1) / IW_ROWS, chunks = (kbytes / 4 + 31) / 32;
    const int split = chunks > 1 && groups < (int64_t)sms * 32;
    if (split && pop) CU_TRY(ctx, cudaMemsetAsync(pop, 0, (size_t)rows * sizeof(int), stream), "clear row popcounts");
    im2col_words<<<grid_for(groups * (split ? chunks : 1), 8), 256, 0, stream>>>(x, g, w0, w2, w3, rows, kbytes, out,
                                                                                 pop, split);
    LAUNCHED(ctx, "pack activations");
    return BIE_STATUS_OK;
}

// NHWC sign bits (bit = x' >= 0, as in elem_code) from a float x whose (h, w) planes are dense
// (NCHW and the like), C % 32 == 0: a warp takes 32 channels x 32 consecutive pixels of a sample;
// lane j reads channel c0 + j at the 32 pixels (contiguous), and 32 ballots transpose the block:
// ballot q holds the 32 channel bits of pixel q, which lane q keeps and stores as word c0/32 of
// the pixel. Sample n's words start at out + n * row_words (H*W*C/32 for dense NHWC bits; a weight
// [O, C, kh, kw] is a batch of O samples of kh x kw pixels, its rows kbytes apart).
template <typename T>
__global__ void plane_bits(pack_src p, int64_t row_words, uint32_t * out) {
    const struct dgeom & g = p.g;
    const int lane = threadIdx.x & 31;
    const int64_t HW = g.H * g.W, pblocks = (HW + 31) / 32, cwords = g.C / 32, blocks = g.batch * cwords * pblocks;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t b = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; b < blocks; b += warps) {
        const int64_t pb = b % pblocks, t = b / pblocks, cw = t % cwords, n = t / cwords;
        const int64_t c = cw * 32 + lane, p0 = pb * 32;
        const T * src = (const T *)p.t.data + n * p.t.stride[0] + c * p.t.stride[1] + p0;
        const float bias = p.bias.data ? ld_float(p.bias.data, p.bias.dtype, c * p.bias.stride[3]) : 0.0f;
        float v[32];
        if (p0 + 32 <= HW && ((uintptr_t)src % 16) == 0) {
#pragma unroll
            for (int q = 0; q < 32; q += 8) load8<T>(src + q, v + q);
        } else { // the plane's end, or planes not 16-byte aligned (e.g. 14x14 halves)
#pragma unroll
            for (int q = 0; q < 32; q++) v[q] = p0 + q < HW ? to_f32(src[q]) : 0.0f;
        }
        uint32_t mine = 0;
#pragma unroll
        for (int q = 0; q < 32; q++) {
            const float x = p.bias.data ? __fadd_rn(v[q], bias) : v[q];
            const uint32_t word = __ballot_sync(0xffffffffu, x >= 0.0f);
            if (lane == q) mine = word;
        }
        if (p0 + lane < HW) out[n * row_words + (p0 + lane) * cwords + cw] = mine;
    }
}

// pop[r] = popc of the first K bits of row r, for the rows of one or two bit matrices in one
// launch (rows ld bytes apart, 4-byte aligned; bits past K may hold anything, as in a B1 weight
// used in place). A warp counts a row, 16 bytes per lane when the rows are 16-byte aligned. The
// counts are only epilogue terms, so a GEMM queued next may start under this kernel
// (griddep_launch_dependents; see gemm_epilogue.terms_last).
struct popc_rows {
    const uint8_t * p;
    int64_t rows, ld;
    int * pop;
};
__global__ void row_popcounts(popc_rows a, popc_rows b, int64_t K) {
    griddep_launch_dependents();
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t e = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; e < a.rows + b.rows; e += warps) {
        const bool first = e < a.rows;
        const int64_t row = first ? e : e - a.rows, ld = first ? a.ld : b.ld;
        const uint8_t * r = (first ? a.p : b.p) + row * ld;
        int cnt = 0;
        if ((((uintptr_t)r) & 15) == 0) {
            for (int64_t vi = lane; vi * 128 < K; vi += 32) cnt += popc_below(((const uint4 *)r)[vi], vi * 4, K);
        } else {
            for (int64_t wi = lane; wi * 32 < K; wi += 32) {
                uint32_t v = ((const uint32_t *)r)[wi];
                const int64_t left = K - wi * 32;
                if (left < 32) v &= (1u << left) - 1u;
                cnt += __popc(v);
            }
        }
        for (int o = 16; o > 0; o >>= 1) cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
        if (lane == 0) (first ? a.pop : b.pop)[row] = cnt;
    }
}

// Queues row_popcounts over one matrix (b.rows == 0) or two.
enum bie_status launch_row_popcounts(bie_context_t * ctx, cudaStream_t s, popc_rows a, popc_rows b, int64_t K,
                                     const char * what) {
    row_popcounts<<<grid_for(a.rows + b.rows, 8), 256, 0, s>>>(a, b, K);
    LAUNCHED(ctx, what);
    return BIE_STATUS_OK;
}
const popc_rows NO_ROWS = {NULL, 0, 0, NULL};

void launch_plane_bits(const pack_src & p, int64_t row_words, uint32_t * out, cudaStream_t stream) {
    const struct dgeom & g = p.g;
    const unsigned pg = grid_for(g.batch * (g.C / 32) * ((g.H * g.W + 31) / 32), 8);
    if (p.t.dtype == BIE_DTYPE_F32) plane_bits<float><<<pg, 256, 0, stream>>>(p, row_words, out);
    else if (p.t.dtype == BIE_DTYPE_F16) plane_bits<__half><<<pg, 256, 0, stream>>>(p, row_words, out);
    else plane_bits<__nv_bfloat16><<<pg, 256, 0, stream>>>(p, row_words, out);
}

// A conv's float x goes first to pixel rows in a scratch buffer of pixel_scratch_bytes, whose
// implicit-GEMM rows are then copied, instead of the per-element pack_rows. Binary, with whole
// words of channels (C % 32 == 0): NHWC bits (C/8 bytes per pixel), copied as words by
// im2col_words; dense channels-last x (PIX_ROWS) is packed by pack_contiguous_rows over pixels,
// dense (h, w) planes (PIX_PLANES) by plane_bits. n-bit, any layout (PIX_CODES): int8 codes (C
// bytes per pixel) by bie_cuda_pixel_rows, copied by bie_cuda_im2col.
enum pixel_kind { PIX_NONE, PIX_ROWS, PIX_PLANES, PIX_CODES };
pixel_kind float_pixels(const pack_src & p) {
    const struct dgeom & g = p.g;
    const int64_t * st = p.t.stride;
    const bool fl = bie_dtype_is_float((enum bie_dtype)p.t.dtype);
    if (p.is_weight || !fl || dgeom_one_position(g)) return PIX_NONE;
    if (p.quant != BIE_QUANT_BINARY) return PIX_CODES;
    if (g.C % 32) return PIX_NONE;
    if (st[1] == 1 && st[2] == g.W * st[3] && (g.batch == 1 || st[0] == g.H * st[2])) return PIX_ROWS;
    if (st[3] == 1 && (g.H == 1 || st[2] == g.W)) return PIX_PLANES;
    return PIX_NONE;
}
// Whether the K elements of each row of a weight [O, C, kh, kw] with these strides are contiguous
// in the GEMM's order k = (i*kw + j)*C + c (OHWI).
bool ohwi_rows(const int64_t * st, int64_t C, int64_t kh, int64_t kw) {
    return (C == 1 || st[1] == 1) && (kw == 1 || st[3] == C) && (kh == 1 || st[2] == C * kw);
}

// A float conv weight whose (kh, kw) planes are dense (OIHW and the like) with kh*kw > 1, whose
// rows the pixel movers can write: any C for n-bit codes, C % 32 == 0 for bits (rows of words);
// also an 8-bit layer's I8 codes in such planes (no clamp needed: the codes are the full range).
bool planar_weight(const pack_src & p) {
    const struct dgeom & g = p.g;
    const int64_t * st = p.t.stride;
    const bool fl = bie_dtype_is_float((enum bie_dtype)p.t.dtype);
    const bool codes = p.t.dtype == BIE_DTYPE_I8 && p.quant == BIE_QUANT_INT8; // copied as they are
    return p.is_weight && (fl || codes) && g.kh * g.kw > 1 && st[3] == 1 && st[2] == g.kw &&
           (p.quant != BIE_QUANT_BINARY || g.C % 32 == 0);
}
// Whether p is a B1 weight whose rows are the GEMM's rows in whole bytes (OHWI bit order, K % 8
// == 0, rows a whole number of bytes apart): copied into the operand as bytes.
bool b1_weight_rows(const pack_src & p, int64_t rows) {
    const int64_t * st = p.t.stride;
    // (rows that overlap, e.g. one row broadcast with stride 0, have no pitch to copy with)
    return p.is_weight && p.t.dtype == BIE_DTYPE_B1 && ohwi_rows(st, p.g.C, p.g.kh, p.g.kw) && p.g.K % 8 == 0 &&
           (rows == 1 || (st[0] % 8 == 0 && st[0] >= p.g.K));
}
size_t pixel_scratch_bytes(const pack_src & p) {
    return (size_t)(p.g.batch * p.g.H * p.g.W * (p.quant == BIE_QUANT_BINARY ? p.g.C / 8 : p.g.C));
}

// A float x (PIX_ROWS or PIX_PLANES) into dense NHWC bits in scratch (pixel_scratch_bytes(p)).
enum bie_status pack_pixel_bits(bie_context_t * ctx, cudaStream_t stream, const pack_src & p, pixel_kind pk,
                                uint8_t * scratch) {
    const struct dgeom & g = p.g;
    const int64_t * st = p.t.stride;
    if (pk == PIX_ROWS) {
        // rows of `per` pixels (whole warps busy even for few channels; bias_a by the element's
        // channel), up to 32 when the pixels have no gaps, as many as divide their number
        const int64_t pixels = g.batch * g.H * g.W;
        int64_t per = 1;
        if (st[3] == g.C)
            while (per < 32 && pixels % (2 * per) == 0) per *= 2;
        pack_src pp = p;
        pp.g.K = g.C * per;
        pp.t.stride[0] = st[3] * per;
        pp.bias_period = per > 1 && p.bias.data ? (uint32_t)g.C : 0;
        launch_contiguous(pp, pixels / per, g.C * per / 8, scratch, NULL, stream);
    } else {
        launch_plane_bits(p, g.H * g.W * (g.C / 32), (uint32_t *)scratch, stream);
    }
    LAUNCHED(ctx, "pack activation pixels");
    return BIE_STATUS_OK;
}

// Whether x is B1 in whole 32-bit words of channels per pixel (NHWC bits, C % 32 == 0), word-aligned.
bool word_pixels(const pack_src & p) {
    const int64_t * st = p.t.stride;
    return !p.is_weight && p.quant == BIE_QUANT_BINARY && p.t.dtype == BIE_DTYPE_B1 && p.g.C % 32 == 0 && st[1] == 1 &&
           st[0] % 32 == 0 && st[2] % 32 == 0 && st[3] % 32 == 0 && ((uintptr_t)p.t.data % 4) == 0;
}

// Whether the GEMM can gather x's implicit-GEMM rows itself (gemm_gather): NHWC words in place,
// or float pixels that pack_pixel_bits turns into them.
bool gatherable(const pack_src & p) {
    return p.g.pad_value != BIE_PAD_PLUS_ONE && (word_pixels(p) || float_pixels(p) == PIX_ROWS ||
                                                 float_pixels(p) == PIX_PLANES);
}

// Sets up the gather of x's rows (gatherable(p)): float pixels are packed into scratch first.
enum bie_status gather_source(bie_context_t * ctx, cudaStream_t stream, const pack_src & p, uint8_t * scratch,
                              gemm_gather * gs) {
    const struct dgeom & g = p.g;
    const int64_t pw = g.C / 32;
    if (word_pixels(p)) {
        const int64_t * st = p.t.stride;
        gs->x = (const uint32_t *)p.t.data;
        gs->w0 = st[0] / 32;
        gs->w2 = st[2] / 32;
        gs->w3 = st[3] / 32;
    } else {
        BIE_TRY(pack_pixel_bits(ctx, stream, p, float_pixels(p), scratch));
        gs->x = (const uint32_t *)scratch;
        gs->w0 = g.H * g.W * pw;
        gs->w2 = g.W * pw;
        gs->w3 = pw;
    }
    // The widest copy that stays inside a tap and is aligned at every pixel.
    auto fits = [&](int words) {
        return pw % words == 0 && gs->w0 % words == 0 && gs->w2 % words == 0 && gs->w3 % words == 0 &&
               (uintptr_t)gs->x % (4 * words) == 0;
    };
    gs->piece = fits(4) ? 16 : fits(2) ? 8 : 4;
    gs->div_ow = fast_div_make((uint32_t)g.OW); // (gather_fits keeps them below 2^30, M below 2^31)
    gs->div_oh = fast_div_make((uint32_t)g.OH);
    return BIE_STATUS_OK;
}

// Whether x's words fit the gathering producer's 32-bit offsets.
bool gather_fits(const pack_src & p) {
    const int64_t * st = p.t.stride;
    const int64_t words = word_pixels(p) ? p.g.batch * (st[0] / 32) : p.g.batch * p.g.H * p.g.W * (p.g.C / 32);
    return words < INT32_MAX && p.g.H * p.g.sh < INT32_MAX / 2 && p.g.W * p.g.sw < INT32_MAX / 2 &&
           p.g.batch * p.g.OH * p.g.OW < INT32_MAX && p.g.OH < (1 << 30) && p.g.OW < (1 << 30); // (fast_div)
}

// Packs rows with pack_contiguous_rows when their K elements are contiguous floats (the weight of
// a 1x1 kernel; the x of a linear layer, i.e. one output position per image and its one tap
// inside), else with pack_rows (scratch: pixel_scratch_bytes(p) bytes when float_pixels(p)).
enum bie_status pack_any(bie_context_t * ctx, cudaStream_t stream, const pack_src & p, int64_t rows, int64_t kbytes,
                         uint8_t * out, int * pop, uint8_t * scratch) {
    const struct dgeom & g = p.g;
    // rows of K contiguous elements in the GEMM's order: a 1x1 weight or a linear x, and any
    // weight in OHWI order (a channels-last conv weight)
    const bool contiguous = (g.kh == 1 && g.kw == 1 && (p.is_weight || dgeom_one_position(g)) &&
                             (g.C == 1 || p.t.stride[1] == 1)) ||
                            (p.is_weight && ohwi_rows(p.t.stride, g.C, g.kh, g.kw));
    const unsigned grid = grid_for(rows, 8);
    const int64_t * st = p.t.stride;
    const pixel_kind pk = scratch ? float_pixels(p) : PIX_NONE;
    if (b1_weight_rows(p, rows)) {
        // packed bits (bie_pack_weight's OHWI rows): whole bytes, copied into the operand's rows
        if (kbytes * 8 > g.K) CU_TRY(ctx, cudaMemsetAsync(out, 0, (size_t)(rows * kbytes), stream), "clear weight rows");
        CU_TRY(ctx, cudaMemcpy2DAsync(out, (size_t)kbytes, p.t.data, (size_t)(rows == 1 ? g.K / 8 : st[0] / 8),
                                      (size_t)(g.K / 8), (size_t)rows, cudaMemcpyDeviceToDevice, stream),
               "copy weight rows");
        return launch_row_popcounts(ctx, stream, {out, rows, kbytes, pop}, NO_ROWS, g.K, "weight popcounts");
    }
    if (planar_weight(p)) {
        // [O, C, kh, kw] as a batch of O samples of C channels x kh*kw pixels: the pixel movers
        // write rows [o][tap][c] straight into the operand; its padding past K is zeroed first
        pack_src pp = p;
        pp.g.batch = rows;
        pp.g.H = g.kh;
        pp.g.W = g.kw;
        if (kbytes * (p.quant == BIE_QUANT_BINARY ? 8 : 1) > g.K)
            CU_TRY(ctx, cudaMemsetAsync(out, 0, (size_t)(rows * kbytes), stream), "clear weight rows");
        if (p.quant != BIE_QUANT_BINARY)
            return bie_cuda_pixel_rows(ctx, stream, p.t, p.bias, p.t.dtype == BIE_DTYPE_I8 ? 0 : p.quant, p.s,
                                       BIE_DTYPE_I8, kbytes, out);
        launch_plane_bits(pp, kbytes / 4, (uint32_t *)out, stream);
        LAUNCHED(ctx, "pack weight");
        return launch_row_popcounts(ctx, stream, {out, rows, kbytes, pop}, NO_ROWS, g.K, "weight popcounts");
    }
    if (pk == PIX_CODES) {
        BIE_TRY(bie_cuda_pixel_rows(ctx, stream, p.t, p.bias, p.quant, p.s, BIE_DTYPE_I8, 0, scratch));
        return bie_cuda_im2col(ctx, stream, scratch, 1, 0u, g, kbytes, out);
    }
    if (pk != PIX_NONE) {
        BIE_TRY(pack_pixel_bits(ctx, stream, p, pk, scratch));
        const int64_t pw = g.C / 32; // words per pixel
        return launch_im2col_words(ctx, stream, (const uint32_t *)scratch, g, g.H * g.W * pw, g.W * pw, pw, rows, kbytes,
                                   (uint32_t *)out, pop);
    }
    if (word_pixels(p))
        return launch_im2col_words(ctx, stream, (const uint32_t *)p.t.data, g, st[0] / 32, st[2] / 32, st[3] / 32, rows,
                                   kbytes, (uint32_t *)out, pop);
    if (contiguous && launch_contiguous(p, rows, kbytes, out, pop, stream)) {
    } else if (contiguous && p.is_weight && p.quant != BIE_QUANT_BINARY &&
             (p.t.dtype == BIE_DTYPE_I8 || p.t.dtype == BIE_DTYPE_S4))
        pack_int_rows<<<grid, 256, 0, stream>>>(p, rows, kbytes, out);
    else
        pack_rows<<<grid, 256, 0, stream>>>(p, rows, kbytes, out, pop);
    LAUNCHED(ctx, p.is_weight ? "pack weight" : "pack activations");
    return BIE_STATUS_OK;
}

// rowpop[m] = popc of implicit-GEMM row m as the gather reads it: the sum, over the taps of output
// pixel m inside the image, of the popcounts of that pixel's C/32 words of NHWC x (taps outside
// read as zero words), read V words at a time (V = gs.piece / 4, what the words' alignment allows;
// 32-bit offsets: the host gathers only x of fewer than 2^31 words). With zero padding it also
// writes rowterms[m] = {K over the valid taps - 2 rowpop[m], the border class} for the class counts
// `border`. It writes epilogue terms only, so the GEMM queued next may start under it; queued right
// after weight_terms (whose tables it does not read) it may itself start under that kernel, and
// waits for it before it ends, so that a GEMM that waits for it has both. (One launch costs less
// than pixel popcounts and row sums in two; summing the pixel popcounts in the GEMM's epilogue
// costs more than both: 9 loads per row on each tile's path.)
struct border_counts4 {
    int v[4]; // top, bottom, left, right
};
template <int V>
__global__ void conv_rowterms(gemm_gather gs, struct dgeom g, int * rowpop, int2 * rowterms, border_counts4 border) {
    griddep_launch_dependents();
    const int M = (int)(g.batch * g.OH * g.OW), H = (int)g.H, W = (int)g.W, taps = g.kh * g.kw;
    const int pw = (int)(g.C / 32), w0 = (int)gs.w0, w2 = (int)gs.w2, w3 = (int)gs.w3;
    for (int m = blockIdx.x * blockDim.x + threadIdx.x; m < M; m += gridDim.x * blockDim.x) {
        const uint32_t nhw = fast_div((uint32_t)m, gs.div_ow), n = fast_div(nhw, gs.div_oh);
        const int ow = m - (int)nhw * (int)g.OW, oh = (int)nhw - (int)n * (int)g.OH;
        const int h0 = oh * g.sh - g.ph, wl = ow * g.sw - g.pw;
        const uint32_t * xs = gs.x + n * w0;
        int cnt = 0;
        // TB taps at a time, every load issued (a tap outside the image reads the sample's first
        // pixel and counts nothing), so that their latencies overlap: loops that skipped the
        // taps outside issued one load after another.
        constexpr int TB = 9;
        int i = 0, j = 0; // the tap (i, j) of t0 + u
        for (int t0 = 0; t0 < taps; t0 += TB) {
            const uint32_t * px[TB];
            bool in[TB];
#pragma unroll
            for (int u = 0; u < TB; u++) {
                const int h = h0 + i * g.dh, w = wl + j * g.dw;
                in[u] = t0 + u < taps && (unsigned)h < (unsigned)H && (unsigned)w < (unsigned)W;
                px[u] = in[u] ? xs + h * w2 + w * w3 : xs;
                if (++j == g.kw) {
                    j = 0;
                    i++;
                }
            }
            for (int q = 0; q < pw; q += V) {
                int c[TB];
#pragma unroll
                for (int u = 0; u < TB; u++) {
                    if (V == 4) c[u] = popc4(__ldg((const uint4 *)(px[u] + q)));
                    else if (V == 2) {
                        const uint2 v = __ldg((const uint2 *)(px[u] + q));
                        c[u] = __popc(v.x) + __popc(v.y);
                    } else c[u] = __popc(__ldg(px[u] + q));
                }
#pragma unroll
                for (int u = 0; u < TB; u++) cnt += in[u] ? c[u] : 0;
            }
        }
        rowpop[m] = cnt; // (the element-wise epilogue paths read it even with rowterms)
        if (!rowterms) continue;
        int64_t kterm;
        int cls;
        zero_pad_terms(g, border.v, oh, ow, &kterm, &cls);
        rowterms[m] = make_int2((int)kterm - 2 * cnt, cls);
    }
    griddep_wait();
}

// A representative output row (or column) of border class c (border_class in cuda-impl.cuh), or
// -1 for class 0 (no tap outside the image in that dimension).
__device__ __forceinline__ int64_t class_example(int c, int64_t O, int lo, int hi) {
    return c == 0 ? -1 : c <= lo ? c - 1 : O - hi + (c - 1 - lo);
}

// The weight side of a zero-padded binary conv, in one launch, a block per output channel o of
// the B1 weight rows `w` (OHWI bit order, `ld` bytes apart; bits past K may hold anything):
//   copy (optional): row o into the GEMM operand, kbytes long, zeros past its K/8 bytes (K % 8 == 0);
//   tappop[o][t] = popc of the row over bits [t*C, (t+1)*C) (in shared memory when there are at most
//     WT_SMEM_TAPS taps, else in tappop);
//   colpop[o] (optional) = popc of its first K bits, the sum over its taps;
//   tapcorr[p][o] = 2 * the sum of tappop[o][t] over the taps t = (i, j) that lie outside the image
//     for the pixels of border class p (a tap is outside when its row or its column is);
//   colcls[p][o] = BIE_DOT_BIAS - 2 popc(row) + tapcorr[p][o] (gemm_epilogue.colcls; rows of
//     colcls_ld ints, block o also clears columns N + o, N + o + N, ... below colcls_ld);
//   pixcls (optional) = gemm_epilogue.pixcls, the blocks taking the output pixels in turn.
// (One launch rather than one each for the row copy and its clearing, the row popcounts, the tap
// popcounts and the corrections: each would be a few microseconds of almost no work.)
constexpr int WT_SMEM_TAPS = 2048, WT_SMEM_ROW = 4096; // (bytes of a weight row staged in shared memory)
__host__ __device__ bool weight_terms_stages_row(int64_t K) { return (K + 7) / 8 <= WT_SMEM_ROW; }
size_t weight_terms_smem(int64_t taps, int64_t K) {
    return (size_t)(32 + (taps <= WT_SMEM_TAPS ? taps : 0)) * sizeof(int) +
           (weight_terms_stages_row(K) ? (size_t)((K + 7) / 8) : 0);
}
struct weight_terms_args {
    const uint8_t * w;
    int64_t ld;
    uint8_t * copy; // NULL: no copy
    int64_t kbytes;
    int * tappop, * colpop, * tapcorr, * colcls; // (tappop: NULL for at most WT_SMEM_TAPS taps)
    int colcls_ld;
    int2 * pixcls; // NULL: not written
    struct dgeom g;
    int border[4]; // top, bottom, left, right class counts (border_counts)
};
__global__ void weight_terms(weight_terms_args a) {
    griddep_launch_dependents(); // (a GEMM queued right after it waits for it before its epilogue)
    const struct dgeom & g = a.g;
    const int64_t o = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int taps = (int)(g.kh * g.kw);
    const uint8_t * row = a.w + o * a.ld;
    // The launch sizes the shared memory (weight_terms_smem): the warps' sums, the tap popcounts
    // (up to WT_SMEM_TAPS taps, else in tappop), then the row's bytes (rows of up to WT_SMEM_ROW
    // bytes). (Sized by the launch rather than as a fixed array, so that the block stays small
    // enough to run beside the packer of x that it starts under.)
    extern __shared__ int wt_smem[];
    const int ntp = taps <= WT_SMEM_TAPS ? taps : 0;
    int * const wsum = wt_smem, * const tp = ntp ? wt_smem + 32 : a.tappop + o * taps;
    // The row's bytes that hold K, loaded at once: staged in shared memory, where the tap loop
    // below reads them, and copied into the operand (K % 8 == 0 there) from the same loads. (Read
    // by the tap loop from global memory, a load after each tap's sum, they would be three
    // latencies in a row per warp for 9 taps and 4 warps.)
    const int64_t kv = (g.K + 7) / 8;
    const bool staged = weight_terms_stages_row(g.K);
    uint8_t * const srow = (uint8_t *)(wt_smem + 32 + ntp);
    const int64_t nb = a.copy ? a.kbytes : staged ? kv : 0;
    for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) {
        const uint8_t v = b < kv ? row[b] : 0;
        if (a.copy) a.copy[o * a.kbytes + b] = v;
        if (staged && b < kv) srow[b] = v;
    }
    if (staged) {
        __syncthreads();
        row = srow;
    }
    // The tap popcounts, a warp per tap and a byte per lane (the bytes at the ends of the range
    // masked), kept where the sums below read them.
    int part = 0; // this warp's share of popc(row): the sum over its taps
    for (int t = warp; t < taps; t += warps) {
        const int64_t k0 = t * g.C, k1 = k0 + g.C;
        int cnt = 0;
        for (int64_t byte = k0 / 8 + lane; byte * 8 < k1; byte += 32) {
            unsigned v = row[byte];
            if (byte * 8 < k0) v &= 0xffu << (k0 - byte * 8);
            if (byte * 8 + 8 > k1) v &= 0xffu >> (byte * 8 + 8 - k1);
            cnt += __popc(v);
        }
        cnt = (int)__reduce_add_sync(0xffffffffu, (unsigned)cnt);
        if (lane == 0) tp[t] = cnt;
        part += cnt;
    }
    if (lane == 0) wsum[warp] = part;
    __syncthreads(); // (the block's global writes are visible to the block after the barrier)
    int total = 0; // popc of the row's first K bits
    for (int w = 0; w < warps; w++) total += wsum[w];
    if (a.colpop && threadIdx.x == 0) a.colpop[o] = total;
    if (a.pixcls)
        for (int64_t p = o * blockDim.x + threadIdx.x; p < g.OH * g.OW; p += (int64_t)gridDim.x * blockDim.x) {
            int64_t kterm;
            int cls;
            zero_pad_terms(g, a.border, (int)(p / g.OW), (int)(p % g.OW), &kterm, &cls);
            a.pixcls[p] = make_int2((int)kterm, cls); // (read by the fast epilogue only: K < 2^21)
        }
    const int cwn = 1 + a.border[2] + a.border[3], classes = (1 + a.border[0] + a.border[1]) * cwn;
    for (int p = threadIdx.x; p < classes; p += blockDim.x) {
        int * const cls_row = a.colcls + (int64_t)p * a.colcls_ld;
        for (int64_t col = g.O + o; col < a.colcls_ld; col += g.O) cls_row[col] = 0;
        const int64_t oh = class_example(p / cwn, g.OH, a.border[0], a.border[1]),
                      ow = class_example(p % cwn, g.OW, a.border[2], a.border[3]);
        int sum = 0;
        for (int i = 0; i < g.kh; i++) {
            const int64_t h = oh * g.sh - g.ph + (int64_t)i * g.dh;
            const bool h_out = oh >= 0 && (h < 0 || h >= g.H);
            for (int j = 0; j < g.kw; j++) {
                const int64_t w = ow * g.sw - g.pw + (int64_t)j * g.dw;
                if (h_out || (ow >= 0 && (w < 0 || w >= g.W))) sum += tp[i * g.kw + j];
            }
        }
        a.tapcorr[(int64_t)p * g.O + o] = 2 * sum;
        cls_row[o] = BIE_DOT_BIAS - 2 * total + 2 * sum;
    }
    // Started under the packer of x (terms_under_x in bie_cuda_layer_forward), it ends after that
    // kernel, so that a GEMM waiting for it has both operands.
    griddep_wait();
}

// How many of the O output rows (or columns) have taps before the image (*lo: o*s - p < 0) and
// how many have taps past its end (*hi: o*s - p + (k-1)*d >= I); the others have none.
void border_counts(int64_t O, int64_t I, int64_t s, int64_t p, int64_t k, int64_t d, int * lo, int * hi) {
    const int64_t first_inside = (p + s - 1) / s, past = I + p - (k - 1) * d;
    const int64_t first_past = past <= 0 ? 0 : (past + s - 1) / s;
    *lo = (int)(first_inside < O ? first_inside : O);
    *hi = (int)(O - (first_past < O ? first_past : O));
}

size_t align256(size_t v) { return (v + 255) & ~(size_t)255; }

// bie_binarize_ste on views the packer does not take: for element e = m*K + k of x [M, K] (p.t's
// [M, K, 1, 1] view), the codes of its sign bit and of its STE pass bit (1 or 0; either array may
// be NULL), for bie_cuda_store_packed.
__global__ void ste_codes(pack_src p, int64_t n, int8_t * bits, int8_t * mask) {
    const float s = ld_scale(p.s);
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = qdiv(e, p.g.K), k = e - m * p.g.K;
        float v = ld_float(p.t.data, p.t.dtype, m * p.t.stride[0] + k * p.t.stride[1]);
        if (p.bias.data) v = __fadd_rn(v, ld_float(p.bias.data, p.bias.dtype, k * p.bias.stride[3]));
        if (bits) bits[e] = v >= 0.0f ? 1 : 0;
        if (mask) mask[e] = ste_passes(v, s, BIE_QUANT_BINARY, 0, 0) ? 1 : 0;
    }
}

// Whether a B1 [M, K, 1, 1] view has rows that start on whole bytes, with contiguous bits.
bool byte_rows(const struct dview & v, int64_t M, int64_t K) {
    return (K == 1 || v.stride[1] == 1) && (M == 1 || v.stride[0] % 8 == 0);
}

} // namespace

enum bie_status bie_cuda_conv_rowpop(bie_context_t * ctx, const gemm_gather & gs, const struct dgeom & g, int * rowpop,
                                     int2 * rowterms, const int * border, bool after_terms) {
    border_counts4 b = {{0, 0, 0, 0}};
    for (int i = 0; rowterms && i < 4; i++) b.v[i] = border[i];
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg =
        bie_cuda_launch_config(ctx, dim3(grid_for(g.batch * g.OH * g.OW, 256)), dim3(256), 0, after_terms, &attr);
    const auto kern = gs.piece == 16 ? conv_rowterms<4> : gs.piece == 8 ? conv_rowterms<2> : conv_rowterms<1>;
    CU_TRY(ctx, cudaLaunchKernelEx(&cfg, kern, gs, g, rowpop, rowterms, b), "row popcounts launch");
    LAUNCHED(ctx, "row popcounts");
    return BIE_STATUS_OK;
}

extern "C" enum bie_status bie_cuda_layer_forward(bie_context_t * ctx, const struct bie_layer_call * c) {
    struct bie_cuda_state * st;
    BIE_TRY(bie_cuda_state_get(ctx, c->device_index, &st));
    const struct bie_geometry & g = c->g;
    const bool binary = c->quant == BIE_QUANT_BINARY;
    const int taps = (int)(g.kh * g.kw);
    const bool zero_pad_fix = binary && c->is_conv && g.pad_value == BIE_PAD_ZERO && (g.ph > 0 || g.pw > 0);
    const int64_t M = g.batch * g.OH * g.OW, N = g.O;
    if (c->is_conv && (g.H + 2 * g.ph > INT32_MAX || g.W + 2 * g.pw > INT32_MAX)) // (the kernels' pixel coordinates)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "x: a padded height or width past 2^31 on CUDA");
    const int64_t kb_raw = binary ? (g.K + 7) / 8 : g.K;
    const int64_t kbytes = (kb_raw + 127) / 128 * 128;
    const bool b1_out = c->y.dtype == BIE_DTYPE_B1;
    const int64_t ynumel = M * N;
    // A B1 weight whose rows already are the GEMM's rows (k = (i*kw + j)*C + c contiguous, LSB
    // first, row starts 16-byte aligned and at least kbytes apart, K filling the kbytes of every
    // row so that no read passes the tensor's last element) is read in place: bits past K may
    // hold anything, but the activation rows have zeros there, so popc(a & w) ignores them;
    // popc(w) is taken over the first K bits only.
    const struct bie_tensor & wt = c->weight;
    const int64_t wrow = wt.stride[0];
    const bool w_direct = binary && wt.dtype == BIE_DTYPE_B1 && ohwi_rows(wt.stride, g.C, g.kh, g.kw) &&
                          (g.K + 7) / 8 == kbytes && (N == 1 || (wrow % 128 == 0 && wrow / 8 >= kbytes)) &&
                          ((uintptr_t)wt.data % 16) == 0;
    const int64_t ldb = w_direct && N > 1 ? wrow / 8 : kbytes;
    // A B1 x of a linear layer is read in place when K fills its rows' bytes exactly (no bits past
    // K at all, so neither operand's padding can meet the other's) and its rows are 16-byte
    // aligned, kbytes apart.
    const struct bie_tensor & xt = c->x;
    const bool x_direct = binary && !c->is_conv && xt.dtype == BIE_DTYPE_B1 && g.K == kbytes * 8 &&
                          xt.stride[1] == 1 && (M == 1 || xt.stride[0] == kbytes * 8) && ((uintptr_t)xt.data % 16) == 0;

    pack_src px;
    px.bias_period = 0;
    dview_make(&c->x, &px.t);
    px.bias.data = NULL;
    if (c->bias_a.data) dview_make(&c->bias_a, &px.bias);
    px.g = dgeom_make(g);
    px.is_weight = 0;
    px.quant = (int)c->quant;
    px.s = dscale_make(c, true);
    pack_src pw = px;
    dview_make(&c->weight, &pw.t);
    pw.bias.data = NULL;
    pw.is_weight = 1;
    pw.s = dscale_make(c, false);

    const bool pixels = !x_direct && float_pixels(px) != PIX_NONE; // x packed pixel by pixel first
    // A binary conv on the wgmma route whose x is (or is packed into) NHWC words: the GEMM gathers
    // its rows from x itself (gemm_gather), so they are not written out, when one column tile
    // covers N (each row is then gathered once; with several column tiles the rows are written
    // once by the bit im2col and read by each, which costs less).
    const bool gather = binary && c->is_conv && !x_direct && !dgeom_one_position(px.g) && gatherable(px) &&
                        gather_fits(px) && bie_cuda_gemm_takes_wgmma(ctx, M, zero_pad_fix) &&
                        N <= bie_cuda_wgmma_tile_n(ctx, M, N, kbytes, true);
    // The GEMM counts the gathered rows' popcounts itself (its 64-column tiles), or
    // bie_cuda_conv_rowpop counts them first (rowterms).
    const bool gemm_rows = gather && bie_cuda_wgmma_counts_rows(ctx, M, N, kbytes), rowterms = gather && !gemm_rows;
    size_t off = 0;
    const size_t oPix = off; off = align256(off + (pixels ? pixel_scratch_bytes(px) : 0));
    const size_t oA = off; off = align256(off + (x_direct || gather ? 0 : (size_t)(M * kbytes)));
    const size_t oB = off; off = align256(off + (w_direct ? 0 : (size_t)(N * kbytes)));
    const size_t oRow = off; off = align256(off + (gemm_rows ? 0 : (size_t)M * 4));
    const size_t oRowterm = off; off = align256(off + (rowterms && zero_pad_fix ? (size_t)M * 8 : 0));
    const size_t oCol = off; off = align256(off + (size_t)N * 4);
    int border[4] = {0, 0, 0, 0}; // zero padding: border class counts (top, bottom, left, right)
    if (zero_pad_fix) {
        border_counts(g.OH, g.H, g.sh, g.ph, g.kh, g.dh, &border[0], &border[1]);
        border_counts(g.OW, g.W, g.sw, g.pw, g.kw, g.dw, &border[2], &border[3]);
    }
    const int64_t classes = (int64_t)(1 + border[0] + border[1]) * (1 + border[2] + border[3]);
    const size_t oTap = off; off = align256(off + (zero_pad_fix && taps > WT_SMEM_TAPS ? (size_t)(N * taps) * 4 : 0));
    const size_t oCorr = off; off = align256(off + (zero_pad_fix ? (size_t)(classes * N) * 4 : 0));
    const size_t oCls = off; off = align256(off + (zero_pad_fix ? (size_t)(classes * BIE_COLCLS_LD(N)) * 4 : 0));
    const size_t oPixcls = off; off = align256(off + (gemm_rows && zero_pad_fix ? (size_t)(g.OH * g.OW) * 8 : 0));
    // A B1 y: the GEMM packs the bits itself where it can, else writes sign codes for the packer.
    gemm_epilogue ep;
    ep.binary = binary;
    ep.g = px.g;
    dview_make(&c->y, &ep.y);
    const bool sign_codes = b1_out && !bie_cuda_gemm_packs_bits(ctx, M, N, zero_pad_fix, ep);
    const size_t oSign = off; off = align256(off + (sign_codes ? (size_t)ynumel : 0));
    if (c->plan) { // the route in words (the GEMM as bie_cuda_gemm picks it)
        const bool zp = zero_pad_fix;
        const char * gemm = bie_cuda_gemm_counts_popcounts(M, zp) ? "few-rows split-K (mma.sync)"
                            : bie_cuda_gemm_takes_wgmma(ctx, M, zp) ? "wgmma" : "mma.sync";
        snprintf(c->plan->route, sizeof c->plan->route,
                 "cuda:%d, %s GEMM %lld x %lld x %lld bytes; x: %s; weight: %s; row popcounts: %s%s; y: %s",
                 (int)c->device_index, gemm, (long long)M, (long long)N, (long long)kbytes,
                 x_direct ? "B1 rows read in place"
                 : gather ? (pixels ? "packed into NHWC bit pixels, rows gathered by the GEMM"
                                    : "NHWC bit pixels gathered by the GEMM in place")
                 : pixels ? "packed into pixels, then im2col rows" : "packed into GEMM rows",
                 w_direct ? "B1 rows read in place"
                 : zp && b1_weight_rows(pw, N) ? "B1 rows copied with the border terms" : "packed into GEMM rows",
                 gemm_rows ? "counted by the GEMM" : rowterms ? "row terms kernel"
                 : bie_cuda_gemm_counts_popcounts(M, zp) ? "by the GEMM" : "by the packers",
                 zp ? "; zero padding by border classes" : "",
                 b1_out ? (sign_codes ? "sign codes, then packed" : "B1 packed by the GEMM") : bie_dtype_name(c->y.dtype));
        c->plan->workspace = off;
        return BIE_STATUS_OK;
    }
    uint8_t * ws;
    BIE_TRY(bie_cuda_workspace(ctx, off, (void **)&ws));

    int * rowpop = (int *)(ws + oRow), * colpop = (int *)(ws + oCol),
        * tappop = taps > WT_SMEM_TAPS ? (int *)(ws + oTap) : NULL, // (else weight_terms keeps them in shared memory)
        * tapcorr = (int *)(ws + oCorr), * colcls = (int *)(ws + oCls);
    // the zero-padding terms of gathered rows: per row (rowterms) or per pixel (gemm_rows)
    int2 * const rowterm_p = rowterms && zero_pad_fix ? (int2 *)(ws + oRowterm) : NULL,
         * const pixcls_p = gemm_rows && zero_pad_fix ? (int2 *)(ws + oPixcls) : NULL;
    const uint8_t * Am = x_direct ? (const uint8_t *)xt.data : ws + oA;
    const bool gemm_counts = bie_cuda_gemm_counts_popcounts(M, zero_pad_fix); // the GEMM counts the bits itself
    const uint8_t * Bm = w_direct ? (const uint8_t *)wt.data : ws + oB;
    // The weight side of a zero-padded conv is one weight_terms launch: when it also copies packed
    // B1 rows into the operand (then nothing else packs the weight), first for a gathering GEMM,
    // else right after the packer of x and beside it (terms_under_x: a programmatic dependent
    // launch that waits for that kernel before it ends, so that the two overlap); else last, after
    // the weight is packed, taking
    // popc(w) too when the weight is read in place.
    const bool w_rows_copied = zero_pad_fix && !w_direct && b1_weight_rows(pw, N);
    const bool terms_first = w_rows_copied && gather, terms_under_x = w_rows_copied && !gather && !x_direct;
    // conv_rowterms starts under that weight_terms (x needs no packing between them)
    const bool rowpop_under_copy = rowterms && terms_first && word_pixels(px);
    weight_terms_args wt_args = {w_rows_copied ? (const uint8_t *)wt.data : Bm,
                                 w_rows_copied ? (N == 1 ? g.K / 8 : pw.t.stride[0] / 8) : ldb,
                                 w_rows_copied ? ws + oB : NULL,
                                 kbytes,
                                 tappop,
                                 w_rows_copied || (w_direct && !gemm_counts) ? colpop : NULL,
                                 tapcorr,
                                 colcls,
                                 (int)BIE_COLCLS_LD(N),
                                 pixcls_p,
                                 px.g,
                                 {border[0], border[1], border[2], border[3]}};
    if (zero_pad_fix && classes * BIE_COLCLS_LD(N) > INT32_MAX) // (the epilogue's 32-bit offsets in colcls)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "zero padding: border classes x output channels past 2^31");
    auto launch_weight_terms = [&](bool under_prev) -> enum bie_status {
        cudaLaunchAttribute attr;
        const cudaLaunchConfig_t cfg =
            bie_cuda_launch_config(ctx, dim3((unsigned)N), dim3(128), weight_terms_smem(taps, g.K),
                                   under_prev && bie_cuda_cc(ctx) >= 90, &attr);
        CU_TRY(ctx, cudaLaunchKernelEx(&cfg, weight_terms, wt_args), "weight terms launch");
        LAUNCHED(ctx, "weight terms");
        return BIE_STATUS_OK;
    };
    // Operands read in place only need their popcounts: those of both are counted in one launch,
    // after any packing.
    const popc_rows xrows = {Am, x_direct && !gemm_counts ? M : 0, kbytes, rowpop};
    const popc_rows wrows = {Bm, w_direct && !gemm_counts && !zero_pad_fix ? N : 0, ldb, colpop};
    if (terms_first) BIE_TRY(launch_weight_terms(false));
    gemm_gather gs;
    // (the few-rows GEMM counts the row popcounts itself: the packers skip them)
    if (!x_direct && !gather)
        BIE_TRY(pack_any(ctx, st->stream, px, M, kbytes, ws + oA, gemm_counts ? NULL : rowpop, pixels ? ws + oPix : NULL));
    if (terms_under_x) BIE_TRY(launch_weight_terms(true));
    if (!w_direct && !w_rows_copied) BIE_TRY(pack_any(ctx, st->stream, pw, N, kbytes, ws + oB, colpop, NULL));
    if (gather) { // after the weight, so that the last kernel before the GEMM writes terms only
        BIE_TRY(gather_source(ctx, st->stream, px, ws + oPix, &gs));
        // (right after weight_terms, when x needs no packing, it may start under that kernel)
        if (rowterms) BIE_TRY(bie_cuda_conv_rowpop(ctx, gs, px.g, rowpop, rowterm_p, border, rowpop_under_copy));
    }
    if (xrows.rows || wrows.rows)
        BIE_TRY(launch_row_popcounts(ctx, st->stream, xrows.rows ? xrows : wrows, xrows.rows ? wrows : NO_ROWS, g.K,
                                     "operand popcounts"));
    if (zero_pad_fix && !w_rows_copied) BIE_TRY(launch_weight_terms(false));

    ep.rowpop = gemm_rows ? NULL : rowpop;
    ep.colpop = colpop;
    ep.tapcorr = zero_pad_fix ? tapcorr : NULL;
    ep.colcls = zero_pad_fix ? colcls : NULL;
    ep.colcls_ld = (int)BIE_COLCLS_LD(N);
    ep.rowterms = rowterm_p;
    ep.pixcls = pixcls_p;
    for (int i = 0; i < 4; i++) ep.border[i] = border[i];
    ep.sa = px.s;
    ep.sw = pw.s;
    ep.sign = sign_codes ? (int8_t *)(ws + oSign) : NULL;
    ep.ldb = ldb;
    // The last kernel before the GEMM wrote terms only: the tap tables (of a weight packed before),
    // the popcounts of an operand read in place (which are counted after any packing), or the row
    // popcounts of gathered rows. A GEMM that counts its gathered rows itself may instead follow
    // the kernel that packed or copied one of its operands (weight_terms, which lets its dependents
    // start at once, or a packer); the row popcounts may have started under a weight_terms that
    // copied the weight; and a weight_terms that copies it may follow the packer of x. Then the
    // GEMM's producer waits for the kernel before it.
    ep.terms_last = (zero_pad_fix && !w_rows_copied) || xrows.rows || wrows.rows || rowterms;
    ep.operands_last = gemm_rows ? !ep.terms_last : rowpop_under_copy || terms_under_x;
    BIE_TRY(bie_cuda_gemm(ctx, Am, Bm, M, N, kbytes, ep, gather ? &gs : NULL));
    if (sign_codes) BIE_TRY(bie_cuda_store_packed(ctx, ep.sign, ep.y));
    return BIE_STATUS_OK;
}

// bie_binarize_ste (bie-impl.h's binarize_ste slot): contiguous float rows of x into byte-aligned
// bit rows go through pack_contiguous_rows, which reads x once with 16-byte loads and writes the
// sign bits and the STE mask bits in the same pass; other views through per-element codes and the
// packed writer.
extern "C" enum bie_status bie_cuda_binarize_ste(bie_context_t * ctx, const struct bie_layer_call * c,
                                                 const struct bie_tensor * bits, const struct bie_tensor * mask) {
    struct bie_cuda_state * st;
    BIE_TRY(bie_cuda_state_get(ctx, c->device_index, &st));
    const int64_t M = c->g.batch, K = c->g.K;
    pack_src p;
    p.bias_period = 0;
    dview_make(&c->x, &p.t);
    p.bias.data = NULL;
    if (c->bias_a.data) dview_make(&c->bias_a, &p.bias);
    p.g = dgeom_make(c->g);
    p.is_weight = 0;
    p.quant = BIE_QUANT_BINARY;
    p.s = dscale_make(c, true);
    struct dview vb, vm;
    vb.data = vm.data = NULL;
    if (bits) dview_make(bits, &vb);
    if (mask) dview_make(mask, &vm);
    if ((K == 1 || p.t.stride[1] == 1) && (!bits || byte_rows(vb, M, K)) && (!mask || byte_rows(vm, M, K))) {
        // Short rows without gaps (a conv's channels-last pixels) are taken `per` at a time as one
        // row, so that a warp's lanes all have whole 8-element groups (bias_a by the element's feature).
        int64_t per = 1;
        const bool dense = M > 1 && K % 8 == 0 && p.t.stride[0] == K && (!bits || vb.stride[0] == K) &&
                           (!mask || vm.stride[0] == K);
        if (dense)
            while (per < 32 && K * per < 2048 && M % (2 * per) == 0) per *= 2;
        const int64_t rows = M / per;
        if (per > 1) {
            p.g.K = K * per;
            p.t.stride[0] = K * per;
            p.bias_period = p.bias.data ? (uint32_t)K : 0;
        }
        const ste_out so = {(uint8_t *)vb.data, (uint8_t *)vm.data, bits && rows > 1 ? vb.stride[0] * per / 8 : 0,
                            mask && rows > 1 ? vm.stride[0] * per / 8 : 0};
        if (launch_contiguous(p, rows, 0, NULL, NULL, st->stream, &so)) {
            LAUNCHED(ctx, "binarize_ste");
            return BIE_STATUS_OK;
        }
    }
    int8_t * codes;
    BIE_TRY(bie_cuda_workspace(ctx, 2 * (size_t)(M * K), (void **)&codes));
    ste_codes<<<grid_for(M * K, 256), 256, 0, st->stream>>>(p, M * K, bits ? codes : NULL, mask ? codes + M * K : NULL);
    LAUNCHED(ctx, "binarize_ste codes");
    if (bits) BIE_TRY(bie_cuda_store_packed(ctx, codes, vb));
    if (mask) BIE_TRY(bie_cuda_store_packed(ctx, codes + M * K, vm));
    return BIE_STATUS_OK;
}
