// SPDX-License-Identifier: Apache-2.0
// cuda-pack-rows.cu: the forward pass's packers that write GEMM rows element by element
// (cuda-forward.cu gives the row layout): any view (pack_rows), contiguous float rows
// (pack_contiguous_rows, which also writes bie_binarize_ste's bits) and contiguous integer weight
// rows (pack_int_rows).
#include "cuda-forward.cuh"

namespace {

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
    float v = clamp_in(ld_float(p.t.data, p.t.dtype, off), clamp_bound(p.s)); // (x's clamp, if any)
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
// x' of 8 elements starting at element k0 of a row (0 past K): the floats (clamped, with x's
// clamp) plus bias_a.
template <typename T>
__device__ __forceinline__ void xprime8(const pack_src & p, const T * row, int64_t k0, bool vec, float * v) {
    if (vec) load8<T>(row + k0, v);
    else
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = k0 + e < p.g.K ? ld_float((const char *)row, p.t.dtype, k0 + e) : 0.0f;
    const float t = clamp_bound(p.s);
#pragma unroll
    for (int e = 0; e < 8; e++) v[e] = clamp_in(v[e], t);
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
    for (int e = 0; e < 8; e++)
        q[e] = k0 + e >= p.g.K ? 0 : binary ? (v[e] >= 0.0f ? 1 : 0) : quant_code(v[e], s, lo, hi);
}
// Bit e = (element e >= threshold e) of 8 elements, for the sign bits (thresholds +0: x >= 0, so
// -0 -> 1 and NaN -> 0, as in elem_code) and for the sign thresholds below: f32 compared one by
// one; two-byte floats in pairs (HSET2, the thresholds as 4 pairs too), then the pairs' bits
// interleaved.
__device__ __forceinline__ uint32_t ge_bits_f32(const float * v, const float * t) {
    uint32_t b = 0;
#pragma unroll
    for (int e = 0; e < 8; e++) b |= (v[e] >= t[e] ? 1u : 0u) << e;
    return b;
}
__device__ __forceinline__ uint32_t sign_bits_f32(const float * v) {
    const float zero[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    return ge_bits_f32(v, zero);
}
template <typename T2> __device__ __forceinline__ uint32_t ge_bits8_pairs(const uint4 & u, const uint4 & t) {
    const T2 *h = (const T2 *)&u, *th = (const T2 *)&t;
    uint32_t acc = 0; // element 2i at bit 2i, element 2i+1 at bit 16 + 2i
#pragma unroll
    for (int i = 0; i < 4; i++) acc |= (__hge2_mask(h[i], th[i]) & 0x00010001u) << (2 * i);
    return (acc & 0x55u) | ((acc >> 15) & 0xAAu);
}
template <typename T> __device__ __forceinline__ uint32_t sign_bits8(const raw8<T> & r);
template <> __device__ __forceinline__ uint32_t sign_bits8<float>(const raw8<float> & r) {
    return sign_bits_f32((const float *)r.u);
}
template <> __device__ __forceinline__ uint32_t sign_bits8<__half>(const raw8<__half> & r) {
    return ge_bits8_pairs<__half2>(r.u[0], make_uint4(0u, 0u, 0u, 0u)); // (+0 pairs)
}
template <> __device__ __forceinline__ uint32_t sign_bits8<__nv_bfloat16>(const raw8<__nv_bfloat16> & r) {
    return ge_bits8_pairs<__nv_bfloat162>(r.u[0], make_uint4(0u, 0u, 0u, 0u));
}
// The sign bits of x' = x + b (f32, as group_xprime adds them) from x alone: for an x of type T,
// x + b >= 0 exactly when x >= thr(b), thr(b) = -b rounded up to T (a nonzero exact f32 sum keeps
// its sign, an exact zero is +0), for finite b; b = +inf passes every x but -inf and NaN (thr: T's
// lowest finite value), b = -inf none (thr: NaN), and a NaN b none (thr: NaN). The packer without
// a clamp keeps a table of thr per bias element (BIAS_TABLE_BYTES at most) in shared memory.
#define BIAS_TABLE_BYTES (48 * 1024)
template <typename T> __device__ __forceinline__ T sign_threshold(float b);
template <> __device__ __forceinline__ __half sign_threshold<__half>(float b) {
    if (isinf(b)) return __ushort_as_half(b > 0.0f ? (unsigned short)0xFBFF : (unsigned short)0x7E00);
    return __float2half_ru(-b);
}
template <> __device__ __forceinline__ __nv_bfloat16 sign_threshold<__nv_bfloat16>(float b) {
    if (isinf(b)) return __ushort_as_bfloat16(b > 0.0f ? (unsigned short)0xFF7F : (unsigned short)0x7FC0);
    return __float2bfloat16_ru(-b);
}
template <> __device__ __forceinline__ float sign_threshold<float>(float b) {
    if (isinf(b)) return b > 0.0f ? -FLT_MAX : __int_as_float(0x7fc00000);
    return -b;
}
// The sign bits of x + b of 8 loaded elements from their thresholds thr[0..7] (16-byte aligned).
template <typename T> __device__ __forceinline__ uint32_t sign_bits8_thr(const raw8<T> & r, const T * thr);
template <> __device__ __forceinline__ uint32_t sign_bits8_thr<float>(const raw8<float> & r, const float * thr) {
    const float4 t0 = ((const float4 *)thr)[0], t1 = ((const float4 *)thr)[1];
    const float t[8] = {t0.x, t0.y, t0.z, t0.w, t1.x, t1.y, t1.z, t1.w};
    return ge_bits_f32((const float *)r.u, t);
}
template <> __device__ __forceinline__ uint32_t sign_bits8_thr<__half>(const raw8<__half> & r, const __half * thr) {
    return ge_bits8_pairs<__half2>(r.u[0], *(const uint4 *)thr);
}
template <>
__device__ __forceinline__ uint32_t sign_bits8_thr<__nv_bfloat16>(const raw8<__nv_bfloat16> & r,
                                                                  const __nv_bfloat16 * thr) {
    return ge_bits8_pairs<__nv_bfloat162>(r.u[0], *(const uint4 *)thr);
}
// Stores byte j of a bit row (row NULL: nothing) whose first n bits (n < 8 only in the row's last
// byte) belong to the row; the others keep their content.
__device__ __forceinline__ void put_bits8(uint8_t * row, int64_t j, uint32_t byte, int n) {
    if (!row) return;
    row[j] = n >= 8 ? (uint8_t)byte : (uint8_t)((row[j] & (0xffu << n)) | (byte & ((1u << n) - 1u)));
}
// Groups of 8 elements a lane of the packer loads at once (16-byte vectors): 4 of f32, 8 of a 2-byte
// type, but 4 in the STE form of a 2-byte type, whose kernel (pack_ste_rows) then fits four blocks a
// multiprocessor: with 8 loads a lane and its heavier work per group only two fit, too few warps
// to keep the memory busy.
template <typename T, bool STE> __host__ __device__ constexpr int pack_pu() { return sizeof(T) == 4 || STE ? 4 : 8; }
// The whole groups of a row that pack_contiguous_rows takes PU at a time: groups j, j + 32, ...
// below j1 (a lane's share) while PU of them lie inside K, their loads issued before any store
// (which the compiler may not move them past), so that a row is a few round trips. f(g, raw)
// takes group g's 8 loaded elements. Returns the first group left.
template <typename T, int PU, typename F>
__device__ __forceinline__ int64_t vector_groups(const T * src, int64_t j, int64_t j1, int64_t K, F && f) {
    for (; (j + 32 * (PU - 1)) * 8 + 8 <= K && j + 32 * (PU - 1) < j1; j += 32 * PU) {
        raw8<T> v[PU];
#pragma unroll
        for (int u = 0; u < PU; u++) v[u] = raw8_load<T>(src + (j + 32 * u) * 8);
#pragma unroll
        for (int u = 0; u < PU; u++) f(j + 32 * u, v[u]);
    }
    return j;
}
// x' = x + bias_a of group g's 8 loaded elements (x itself without BIAS), x through its clamp.
template <typename T, bool BIAS>
__device__ __forceinline__ void group_xprime(const pack_src & p, int64_t g, const raw8<T> & r, float * f) {
    const float t = clamp_bound(p.s);
    if constexpr (BIAS) { // (bias_a's loads issued first: the conversion runs while they are in flight)
        float b[8];
        bias8(p.bias, bias_index(p, g * 8), b); // (a period is a multiple of 8: the 8 share a pixel)
        raw8_floats<T>(r, f);
#pragma unroll
        for (int e = 0; e < 8; e++) f[e] = __fadd_rn(clamp_in(f[e], t), b[e]);
    } else {
        raw8_floats<T>(r, f);
#pragma unroll
        for (int e = 0; e < 8; e++) f[e] = clamp_in(f[e], t);
    }
}
// The sign groups of a row (vector_groups): writes the sign bytes (and, STE, the pass bytes) or
// adds their popcounts to cnt.
template <typename T, bool STE, bool BIAS>
__device__ __forceinline__ int64_t sign_groups(const pack_src & p, const T * src, int64_t j, int64_t j1, int64_t K,
                                               float s, bool bin_s, uint8_t * dst, uint8_t * mdst, int & cnt) {
    return vector_groups<T, pack_pu<T, STE>()>(src, j, j1, K, [&](int64_t g, const raw8<T> & r) {
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
    const float inv = __frcp_rn(s);
    return vector_groups<T, pack_pu<T, false>()>(src, j, j1, K, [&](int64_t g, const raw8<T> & r) {
        float f[8];
        group_xprime<T, BIAS>(p, g, r, f);
        ((uint2 *)dst)[g] = quant_codes8_r(f, s, inv, lo, hi);
    });
}
// The sign groups of a row as sign_groups<T, false, true> gives them, from the thresholds of the
// bias elements (thr, `period` of them: group g takes thr[(8g) % period]) instead of x' itself:
// vector_groups takes the groups in order, 32 apart, so the table index advances by a step instead
// of being divided anew.
template <typename T>
__device__ __forceinline__ int64_t table_groups(const T * src, int64_t j, int64_t j1, int64_t K, const T * thr,
                                                uint32_t period, uint8_t * dst, int & cnt) {
    const uint32_t step = 256u % period; // 32 groups of 8 elements
    uint32_t idx = (uint32_t)qmod(j * 8, period);
    return vector_groups<T, pack_pu<T, false>()>(src, j, j1, K, [&](int64_t g, const raw8<T> & r) {
        const uint32_t byte = sign_bits8_thr<T>(r, thr + idx);
        dst[g] = (uint8_t)byte;
        cnt += __popc(byte);
        idx += step;
        idx = idx >= period ? idx - period : idx;
    });
}
// The packer's body, in the kernels below.
template <typename T, bool STE, bool BIAS>
__device__ __forceinline__ void contiguous_rows(pack_src p, int64_t rows, int64_t kbytes, uint8_t * out, int * pop,
                                                int64_t seg_groups, ste_out so, uint32_t table) {
    griddep_launch_dependents(); // a few-rows GEMM after it starts at once (and waits for it)
    // table > 0 (binary, bias_a, no clamp, not STE): the sign thresholds of bias elements [0, table)
    extern __shared__ __align__(16) unsigned char pack_smem[];
    T * thr = (T *)pack_smem;
    if constexpr (BIAS && !STE)
        if (table) { // 8 elements a thread at a time (one vector load of bias_a where it is dense)
            for (uint32_t i = 8 * threadIdx.x; i < table; i += 8 * blockDim.x) {
                float b[8];
                bias8(p.bias, i, b);
#pragma unroll
                for (int e = 0; e < 8; e++) thr[i + e] = sign_threshold<T>(b[e]);
            }
            __syncthreads();
        }
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
        if constexpr (BIAS && !STE)
            if (table && aligned) j = table_groups<T>(src, j, j1, K, thr, table, dst, cnt);
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
            } else put_codes8(dst, j, q);
        }
        if (binary && pop) {
            for (int o = 16; o > 0; o >>= 1) cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
            if (lane == 0) pop[row] = cnt;
        }
    }
}
template <typename T, bool STE, bool BIAS>
__global__ void pack_contiguous_rows(pack_src p, int64_t rows, int64_t kbytes, uint8_t * out, int * pop,
                                     int64_t seg_groups, ste_out so, uint32_t table) {
    contiguous_rows<T, STE, BIAS>(p, rows, kbytes, out, pop, seg_groups, so, table);
}
// The STE form of a 2-byte x, four blocks a multiprocessor (pack_pu).
template <typename T, bool BIAS>
__global__ void __launch_bounds__(256, 4) pack_ste_rows(pack_src p, int64_t rows, int64_t kbytes, uint8_t * out,
                                                        int * pop, int64_t seg_groups, ste_out so, uint32_t table) {
    contiguous_rows<T, true, BIAS>(p, rows, kbytes, out, pop, seg_groups, so, table);
}
// The grid of `blocks` blocks of kern (256 threads, smem bytes) capped at one wave: the blocks that
// the device's sms multiprocessors hold at once. The runtime is asked only for a grid larger than
// sms; where it cannot say, the grid stays (and its error is cleared, so that the launch check
// after the kernel does not take it for the kernel's).
static unsigned one_wave_grid(const void * kern, size_t smem, int64_t blocks, int sms) {
    int per_sm = 0;
    if (sms <= 0 || blocks <= sms) return (unsigned)blocks;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, 256, smem) != cudaSuccess) {
        (void)cudaGetLastError();
        return (unsigned)blocks;
    }
    const int64_t wave = (int64_t)sms * per_sm;
    return (unsigned)(wave > 0 && wave < blocks ? wave : blocks);
}
template <typename T, bool STE>
void launch_contiguous_kernel(const pack_src & p, int64_t rows, int64_t kbytes, uint8_t * out, int * pop,
                              int64_t groups, const ste_out & so, int sms, cudaStream_t stream) {
    // a warp's segment of a row (see launch_contiguous); a round: its lanes' pack_pu loads
    const int64_t round = 32 * pack_pu<T, STE>();
    const int64_t seg = pop ? groups : groups >= round && rows * groups >= 64 * round ? round : 32;
    const int64_t blocks = grid_for(rows * ((groups + seg - 1) / seg), 8);
    void (*kern)(pack_src, int64_t, int64_t, uint8_t *, int *, int64_t, ste_out, uint32_t);
    if constexpr (STE && sizeof(T) == 2) kern = p.bias.data ? pack_ste_rows<T, true> : pack_ste_rows<T, false>;
    else kern = p.bias.data ? pack_contiguous_rows<T, STE, true> : pack_contiguous_rows<T, STE, false>;
    // the thresholds' table: binary sign bits of x + bias_a without a clamp, a table of one period
    // (pixels' channels) or of a row's K elements that fits
    const int64_t n = p.bias_period ? (int64_t)p.bias_period : p.g.K;
    const bool table = !STE && p.bias.data && p.quant == BIE_QUANT_BINARY && !(p.s.clamp > 0.0f) && n % 8 == 0 &&
                       n * (int64_t)sizeof(T) <= BIAS_TABLE_BYTES;
    const size_t smem = table ? (size_t)n * sizeof(T) : 0;
    // with a table, at most one wave of blocks, striding over the segments: each block fills its
    // table once
    const unsigned grid = table ? one_wave_grid((const void *)kern, smem, blocks, sms) : (unsigned)blocks;
    kern<<<grid, 256, smem, stream>>>(p, rows, kbytes, out, pop, seg, so, table ? (uint32_t)n : 0u);
}
template <bool STE>
bool launch_contiguous_as(const pack_src & p, int64_t rows, int64_t kbytes, uint8_t * out, int * pop, int64_t groups,
                          const ste_out & so, int sms, cudaStream_t stream) {
    if (p.t.dtype == BIE_DTYPE_F32)
        launch_contiguous_kernel<float, STE>(p, rows, kbytes, out, pop, groups, so, sms, stream);
    else if (p.t.dtype == BIE_DTYPE_F16)
        launch_contiguous_kernel<__half, STE>(p, rows, kbytes, out, pop, groups, so, sms, stream);
    else if (p.t.dtype == BIE_DTYPE_BF16)
        launch_contiguous_kernel<__nv_bfloat16, STE>(p, rows, kbytes, out, pop, groups, so, sms, stream);
    else return false;
    return true;
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

} // namespace

// (launch_contiguous: see cuda-forward.cuh.) Without row popcounts to count (pop NULL: the few-rows
// GEMM counts them, or pixels are packed), rows are split into segments a warp: of 32 groups when
// there is little work (16 rows of 4096 elements take 256 warps instead of 16, each lane waiting
// for one load, not sixteen in turn), else of one round of vector_groups (its PU loads a lane in
// flight together; whole rows of thousands of groups would leave too few warps, each waiting for
// round after round).
bool launch_contiguous(bie_context_t * ctx, const pack_src & p, int64_t rows, int64_t kbytes, uint8_t * out, int * pop,
                       cudaStream_t stream, const ste_out * so) {
    const int sms = bie_cuda_sm_count(ctx);
    const int64_t groups = so ? (p.g.K + 7) / 8 : p.quant == BIE_QUANT_BINARY ? kbytes : kbytes / 8;
    if (so) return launch_contiguous_as<true>(p, rows, kbytes, out, pop, groups, *so, sms, stream);
    return launch_contiguous_as<false>(p, rows, kbytes, out, pop, groups, ste_out{NULL, NULL, 0, 0}, sms, stream);
}

void launch_pack_rows(const pack_src & p, int64_t rows, int64_t kbytes, uint8_t * out, int * pop, cudaStream_t stream) {
    pack_rows<<<grid_for(rows, 8), 256, 0, stream>>>(p, rows, kbytes, out, pop);
}

void launch_pack_int_rows(const pack_src & p, int64_t rows, int64_t kbytes, uint8_t * out, cudaStream_t stream) {
    pack_int_rows<<<grid_for(rows, 8), 256, 0, stream>>>(p, rows, kbytes, out);
}
