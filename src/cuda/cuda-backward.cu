// SPDX-License-Identifier: Apache-2.0
// cuda-backward.cu: the backward pass of every layer on CUDA tensors. The gradient GEMMs carry the
// real-valued grad_y, so they run through cuBLAS (cublasGemmEx, f32 accumulation) on operands of
// grad_y's dtype: f16 and bf16 hold the +-1 and n-bit codes exactly (|code| <= 128), so no
// precision is lost beyond f32 accumulation; an f32 grad_y uses exact f32 GEMMs (no TF32).
// The conv is an implicit GEMM over rows (n, oh, ow) and columns k = (i*kw + j)*C + c:
//   G    [M][O]  = grad_y                      (M = batch*OH*OW)
//   dCol [M][K]  = G @ Wc,  Wc [O][K] = weight codes (+-1, or clamp(rne(W/scale_w)))
//   gx[n,c,h,w]  = scale_w * sum over the taps (i,j) that read (h,w) of dCol[(n,oh,ow)][(i,j,c)]
//   R    [O][K]  = G^T @ Acol, Acol = activation codes with the pad value on padded taps
//   grad_W[o,c,i,j] = scale_a * R[o][(i,j,c)]
// A stride-1 conv with several taps gets the tap sums straight from one GEMM over grad_y's
// im2col instead (the transposed conv; see gx_conv below): gx = scale_w * Gx[(n,h,w)][c].
// G and Acol are built through dense pixel rows (cuda-layout.cu: coalesced whatever the layout
// of grad_y and x). Then one fused pass over x, by tiles of pixels x channels, gathers the tap
// sums and gives the STE mask, grad_x, the scale_a gradient terms (docs/semantics.md) and the
// masked gradient that the per-channel bias_a reduction reads:
//   binary: r = x'/scale_a, mask = 1{|r| <= 1}, grad_x = gx*mask, term = grad_x * sign(x')
//   n-bit : mid = 1{lo <= r <= hi}, grad_x = gx*mid,
//           term = gx * (lo*1{r<lo} + hi*1{r>hi} + mid*(rne(r) - r))
//   grad_scale_a = sum(term) / sqrt(numel(x))  (n-bit: / sqrt(numel(x)*hi))
// A linear layer's grad_x (when neither sum above is asked for) and a 1x1 kernel's grad_W skip the
// f32 buffers when they have dense rows of grad_y's dtype: their GEMMs write them directly, with
// the scale as cuBLAS's alpha, and grad_x then gets its STE mask in place (gx_direct, gw_direct).
// A binary linear layer's x may be the sign bits saved by bie_binarize_ste, with the STE mask's
// bits (x_mask): the passes over x then read those 2 bits per element instead (element type sbits),
// and every number is the one the float x gives (the same tests made them; cuda-ste.cuh).
#include "cuda-backward.cuh"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <type_traits>

namespace {

// Writes v as element e of a dense buffer of dtype gdt (F32, F16 or BF16).
__device__ __forceinline__ void st_dense(void * p, int gdt, int64_t e, float v) {
    if (gdt == BIE_DTYPE_F16) ((__half *)p)[e] = __float2half_rn(v);
    else if (gdt == BIE_DTYPE_BF16) ((__nv_bfloat16 *)p)[e] = __float2bfloat16_rn(v);
    else ((float *)p)[e] = v;
}
// Wc[o][k] = weight code at (o, c, i, j), k = (i*kw + j)*C + c; tap_major: Wc[t][o][c] instead
// (t = i*kw + j), the weight of grad_x as a convolution of grad_y.
__global__ void weight_codes(struct dview w, struct dgeom g, int quant, struct dscale sw, int gdt, int tap_major,
                             void * Wc) {
    const float s = ld_scale(sw);
    const int64_t total = g.O * g.K;
    const int lo = qlo(quant), hi = qhi(quant);
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = qdiv(e, g.K), k = e - o * g.K;
        const int64_t tap = qdiv(k, g.C), c = k - tap * g.C;
        const float v = ld_float(w.data, w.dtype, dview_off4(w, o, c, tap / g.kw, tap % g.kw));
        float q;
        if (quant == BIE_QUANT_BINARY) q = v >= 0.0f ? 1.0f : -1.0f;
        else if (w.dtype == BIE_DTYPE_I8 || w.dtype == BIE_DTYPE_S4) q = fminf(fmaxf(v, (float)lo), (float)hi);
        else q = (float)quant_code(v, s, lo, hi);
        st_dense(Wc, gdt, tap_major ? (tap * g.O + o) * g.C + c : e, q);
    }
}
// The codes for rows whose K elements are contiguous floats (a linear layer's weight and x), or
// saved sign bits in rows that start on whole bytes (T = sbits): out[r][k] = code of src[r][k]
// (+ bias[k] for x; +-1 from a bit). Same values as weight_codes and the activation codes of
// bie_cuda_pixel_rows (a linear layer has one tap, inside the image). With MASK, the pass also
// applies the STE mask to a grad_x (gx: x's rows, dtype gdt, row stride gx_ld) that already holds
// scale_w * dCol: the elements the STE stops (by the test of x', or by the saved mask's bits in
// `pass`, rows pass_ld bytes apart) are set to 0, the others left alone; out may then be NULL (no
// codes wanted). A chunk is 8 elements k0 .. k0+7 of row r, loaded with one 16-byte vector when
// the row is 16-byte aligned and the 8 lie inside it (saved bits: one byte, and one of the mask).

// The chunk's elements as floats (0 past K).
template <typename T>
__device__ __forceinline__ void chunk_load(const T * row, int sdt, int64_t k0, int64_t K, float * q) {
    if (k0 + 8 <= K && ((uintptr_t)(row + k0) % 16) == 0) load8<T>(row + k0, q);
    else
        for (int i = 0; i < 8; i++) q[i] = k0 + i < K ? ld_float((const char *)row, sdt, k0 + i) : 0.0f;
}
// Replaces the chunk's floats by their codes (clamped to +-t first where t > 0 (x_clamp), bias
// added then; not when codes is false); returns (MASK) the bits of the elements the STE stops, or
// whose clamp's derivative 1{|x| < t} is 0. FULL: all 8 lie inside the row (no bounds tests).
// bin_s: ste_division_free(quant, s), worked out once per thread (the STE test is then |x'| <= s).
template <bool MASK, bool FULL>
__device__ __forceinline__ unsigned chunk_codes(float * q, int64_t k0, int64_t K, const struct dview & bias, int quant,
                                                float s, int lo, int hi, bool codes, bool bin_s, float t) {
    const int n = FULL || K - k0 >= 8 ? 8 : (int)(K - k0);
    unsigned gate = 0;
    if (t > 0.0f)
#pragma unroll
        for (int i = 0; i < 8; i++) {
            if (MASK && !clamp_open(q[i], t)) gate |= 1u << i;
            q[i] = clamp_in(q[i], t);
        }
    if (bias.data)
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (FULL || i < n) q[i] = __fadd_rn(q[i], ld_float(bias.data, bias.dtype, (k0 + i) * bias.stride[3]));
    unsigned stop = 0;
    if (MASK) {
        if (bin_s) stop = ~ste_pass_bits8(q, s, true) & 0xffu;
        else
#pragma unroll
            for (int i = 0; i < 8; i++) stop |= ste_passes(q[i], s, quant, lo, hi) ? 0u : 1u << i;
        stop |= gate;
        if (!FULL) stop &= (1u << n) - 1;
    }
    if (codes && quant == BIE_QUANT_BINARY)
#pragma unroll
        for (int i = 0; i < 8; i++) q[i] = q[i] >= 0.0f ? 1.0f : -1.0f;
    else if (codes)
#pragma unroll
        for (int i = 0; i < 8; i++) q[i] = (float)quant_code(q[i], s, lo, hi);
    return stop;
}
// A chunk of saved bits: the codes (+-1) in q and, for MASK, the bits of the elements that the saved
// mask stops (n: the chunk's elements inside the row).
template <bool MASK> __device__ __forceinline__ unsigned chunk_bits(float * q, uint32_t sign, uint32_t pass, int n) {
#pragma unroll
    for (int i = 0; i < 8; i++) q[i] = (sign >> i) & 1u ? 1.0f : -1.0f;
    return MASK ? ~pass & ((1u << n) - 1u) : 0u;
}
// Chunk k0 of a row one chunk at a time (row: its first element; prow: the mask row of saved bits,
// read for MASK): as chunk_codes after chunk_load, or as chunk_bits.
template <bool MASK, typename T>
__device__ __forceinline__ unsigned chunk_any(const T * row, const uint8_t * prow, int sdt, int64_t k0, int64_t K,
                                              const struct dview & bias, int quant, float s, int lo, int hi, bool codes,
                                              bool bin_s, float t, float * q) {
    if constexpr (is_sbits<T>) {
        return chunk_bits<MASK>(q, row[k0 / 8].b, MASK ? prow[k0 / 8] : 0u, K - k0 < 8 ? (int)(K - k0) : 8);
    } else {
        chunk_load<T>(row, sdt, k0, K, q);
        return chunk_codes<MASK, false>(q, k0, K, bias, quant, s, lo, hi, codes, bin_s, t);
    }
}
// Clears the elements of grad_x's row r, chunk k0, whose bits are set in stop. A whole, 16-byte
// aligned chunk is rewritten by 16-byte words (2-byte elements: one; f32: two) rather than element
// by element. Out of line: inlined, it made the masked codes kernels spill.
__device__ __noinline__ void clear_stopped(void * gx, int gdt, int64_t gx_ld, int64_t r, int64_t k0, int64_t K,
                                           unsigned stop) {
    const int es = gdt == BIE_DTYPE_F32 ? 4 : 2;
    uint8_t * const p = (uint8_t *)gx + (r * gx_ld + k0) * es;
    if (k0 + 8 > K || (uintptr_t)p % 16 != 0) {
        for (int i = 0; stop >> i; i++)
            if ((stop >> i) & 1u) st_dense(gx, gdt, r * gx_ld + k0 + i, 0.0f);
        return;
    }
    for (int h = 0; h < es / 2; h++) {
        uint4 v = ((const uint4 *)p)[h];
        uint32_t * u = (uint32_t *)&v;
#pragma unroll
        for (int j = 0; j < 4; j++) { // word j: elements 2j, 2j + 1 (2-byte) or 4h + j (f32)
            const uint32_t lo = es == 2 ? 2 * j : 4 * h + j;
            u[j] &= es == 2 ? ((stop >> lo) & 1u ? 0xffff0000u : ~0u) & ((stop >> (lo + 1)) & 1u ? 0xffffu : ~0u)
                            : ((stop >> lo) & 1u ? 0u : ~0u);
        }
        ((uint4 *)p)[h] = v;
    }
}
// Zeroes the stopped elements of grad_x's row r (MASK) and stores the codes (when out is given).
template <bool MASK>
__device__ __forceinline__ void chunk_store(const float * q, unsigned stop, int64_t r, int64_t k0, int64_t K, int gdt,
                                            void * out, void * gx, int64_t gx_ld) {
    if (MASK && stop) clear_stopped(gx, gdt, gx_ld, r, k0, K, stop);
    if (!out) return;
    const int64_t o = r * K + k0;
    if (k0 + 8 <= K && vec8_ok(out, gdt, o)) store8((char *)out, gdt, o, q);
    else
        for (int i = 0; i < 8 && k0 + i < K; i++) st_dense(out, gdt, o + i, q[i]);
}
// Rows of fewer than 256 elements, or few rows: a thread per chunk (five blocks a multiprocessor:
// at six, with 40 registers, it spills).
template <bool MASK, typename T>
__global__ void __launch_bounds__(256, 5)
    codes_rows(const T * src, int sdt, int64_t row_stride, int64_t rows, int64_t K, struct dview bias, int quant,
               struct dscale sc, int gdt, void * out, void * gx, int64_t gx_ld, const uint8_t * pass, int64_t pass_ld) {
    const float s = ld_scale(sc), t = sc.clamp;
    const int lo = qlo(quant), hi = qhi(quant);
    const bool bin_s = ste_division_free(quant, s);
    const int64_t chunks = (K + 7) / 8, total = rows * chunks;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = qdiv(e, chunks), k0 = (e - r * chunks) * 8;
        float q[8];
        const unsigned stop = chunk_any<MASK, T>(src + r * row_stride, pass ? pass + r * pass_ld : NULL, sdt, k0, K,
                                                 bias, quant, s, lo, hi, out != NULL, bin_s, t, q);
        chunk_store<MASK>(q, stop, r, k0, K, gdt, out, gx, gx_ld);
    }
}
// Many rows of 256 elements or more: a warp per row, each lane with 64 bytes of loads in flight (4
// chunks of f16/bf16, 2 of f32) before its first store, no division, and whole chunks without
// bounds tests: on such rows the thread-per-chunk kernel above is bound by instruction issue, not
// by memory. Over saved bits
// (T = sbits) a lane has 8 chunks' bytes (and their mask bytes) in flight: 2 bits read per
// element, 16 bits of f16 code written.
template <bool MASK, typename T>
__global__ void __launch_bounds__(256, 4)
    codes_rows_warp(const T * src, int sdt, int64_t row_stride, int64_t rows, int64_t K, struct dview bias, int quant,
                    struct dscale sc, int gdt, void * out, void * gx, int64_t gx_ld, const uint8_t * pass,
                    int64_t pass_ld) {
    constexpr int U = is_sbits<T> ? 8 : 8 / sizeof(T);
    const float s = ld_scale(sc), t = sc.clamp;
    const int lo = qlo(quant), hi = qhi(quant);
    const bool bin_s = ste_division_free(quant, s);
    const int lane = threadIdx.x & 31;
    const int64_t chunks = (K + 7) / 8, warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t r = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
        const T * row = src + r * row_stride;
        const uint8_t * prow = pass ? pass + r * pass_ld : NULL;
        // the chunks loaded as vectors (bytes of saved bits), then the rest (a row not 16-byte
        // aligned, a part chunk)
        const int64_t vec = is_sbits<T> || ((uintptr_t)row % 16) == 0 ? K / 8 : 0;
        for (int64_t c0 = lane; c0 < vec; c0 += 32 * U) {
            if constexpr (is_sbits<T>) {
                uint32_t sign[U], pb[U];
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (c0 + 32 * u < vec) {
                        sign[u] = row[c0 + 32 * u].b;
                        pb[u] = MASK ? prow[c0 + 32 * u] : 0u;
                    }
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if (c0 + 32 * u >= vec) break;
                    float q[8];
                    const unsigned stop = chunk_bits<MASK>(q, sign[u], pb[u], 8);
                    chunk_store<MASK>(q, stop, r, (c0 + 32 * u) * 8, K, gdt, out, gx, gx_ld);
                }
            } else {
                raw8<T> raw[U];
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (c0 + 32 * u < vec) raw[u] = raw8_load<T>(row + (c0 + 32 * u) * 8);
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if (c0 + 32 * u >= vec) break;
                    const int64_t k0 = (c0 + 32 * u) * 8;
                    float q[8];
                    raw8_floats<T>(raw[u], q);
                    const unsigned stop =
                        chunk_codes<MASK, true>(q, k0, K, bias, quant, s, lo, hi, out != NULL, bin_s, t);
                    chunk_store<MASK>(q, stop, r, k0, K, gdt, out, gx, gx_ld);
                }
            }
        }
        for (int64_t c = vec + lane; c < chunks; c += 32) {
            float q[8];
            const unsigned stop =
                chunk_any<MASK, T>(row, prow, sdt, c * 8, K, bias, quant, s, lo, hi, out != NULL, bin_s, t, q);
            chunk_store<MASK>(q, stop, r, c * 8, K, gdt, out, gx, gx_ld);
        }
    }
}
// Saved sign bits in dense rows (K % 8 == 0, rows K bits apart) to their +-1 codes in a dense
// [rows][K] of gdt, without a mask: a flat map, a byte of bits (8 codes, one 16-byte or two
// 16-byte stores) per thread and step, the codes' bits made from the sign bits directly. ONE: 1.0's
// bit pattern in the code type (a sign bit set gives -1.0).
template <typename O, uint32_t ONE> __global__ void bit_codes_flat(const uint8_t * bits, int64_t nbytes, O * out) {
    constexpr int H = sizeof(O) == 2 ? 16 : 32; // a code's bits (a 32-bit word holds 32 / H codes)
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nbytes; i += (int64_t)gridDim.x * blockDim.x) {
        const uint32_t neg = ~(uint32_t)bits[i]; // bit e set: code e is -1
        uint32_t w[8 * H / 32];
#pragma unroll
        for (int j = 0; j < 8 * H / 32; j++) {
            w[j] = H == 16 ? (ONE | ONE << 16) | ((neg >> (2 * j)) & 1u) << 15 | ((neg >> (2 * j + 1)) & 1u) << 31
                           : ONE | ((neg >> j) & 1u) << 31;
        }
        uint4 * o = (uint4 *)(out + 8 * i);
#pragma unroll
        for (int q = 0; q < 8 * H / 128; q++) o[q] = make_uint4(w[4 * q], w[4 * q + 1], w[4 * q + 2], w[4 * q + 3]);
    }
}
// bit_codes_flat for gdt (F16, BF16, F32; else false, nothing queued), out 16-byte aligned.
bool launch_bit_codes_flat(cudaStream_t stream, const uint8_t * bits, int64_t nbytes, int gdt, void * out) {
    if ((uintptr_t)out % 16 != 0) return false;
    const unsigned grid = grid_for(nbytes, 256);
    if (gdt == BIE_DTYPE_F16) bit_codes_flat<__half, 0x3C00u><<<grid, 256, 0, stream>>>(bits, nbytes, (__half *)out);
    else if (gdt == BIE_DTYPE_BF16)
        bit_codes_flat<__nv_bfloat16, 0x3F80u><<<grid, 256, 0, stream>>>(bits, nbytes, (__nv_bfloat16 *)out);
    else if (gdt == BIE_DTYPE_F32)
        bit_codes_flat<float, 0x3F800000u><<<grid, 256, 0, stream>>>(bits, nbytes, (float *)out);
    else return false;
    return true;
}
// The pass with or without the mask, as two instances (the mask's code in a kernel that has no
// mask to apply would cost it registers, and time). Saved bits: row strides in bytes.
template <typename T>
void launch_codes(cudaStream_t stream, const struct dview & t, const struct dview & pass, int64_t rows, int64_t K,
                  const struct dview & bias, int quant, struct dscale sc, int gdt, void * out, void * gx,
                  int64_t gx_ld) {
    // (a warp per row only where the rows give the GPU enough warps, 2048 of them, about 16 a
    // multiprocessor: on a weight's few hundred rows the warps each wait for their row's loads in turn)
    const bool warp = K >= 256 && rows >= 2048;
    auto kern = warp ? (gx ? codes_rows_warp<true, T> : codes_rows_warp<false, T>)
                     : (gx ? codes_rows<true, T> : codes_rows<false, T>);
    const unsigned grid = grid_for(warp ? rows * 32 : rows * ((K + 7) / 8), 256);
    const int64_t ld = is_sbits<T> ? t.stride[0] / 8 : t.stride[0];
    const uint8_t * pp = is_sbits<T> && gx ? (const uint8_t *)pass.data : NULL;
    kern<<<grid, 256, 0, stream>>>((const T *)t.data, t.dtype, ld, rows, K, bias, quant, sc, gdt, out, gx, gx_ld, pp,
                                   pp ? pass.stride[0] / 8 : 0);
}
// grad_W[o, k] = scale_a * R[o][k] where grad_W's features are R's order (a 1x1 kernel, k = c, or
// an OHWI grad_W, k = (i*kw + j)*C + c, each row contiguous): 8 per thread, 16-byte loads and
// stores where aligned.
template <typename D> __global__ void scale_rows(const D * R, int64_t O, int64_t K, struct dscale sa, struct dview gw) {
    const float s = ld_scale(sa);
    const int64_t chunks = (K + 7) / 8;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < O * chunks;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = qdiv(e, chunks), k0 = (e - o * chunks) * 8;
        const D * src = R + o * K;
        float v[8];
        const bool full = k0 + 8 <= K;
        if (full && ((uintptr_t)(src + k0) % 16) == 0) load8<D>(src + k0, v);
        else
            for (int i = 0; i < 8; i++) v[i] = k0 + i < K ? to_f32(src[k0 + i]) : 0.0f;
        for (int i = 0; i < 8; i++) v[i] = __fmul_rn(v[i], s);
        const int64_t go = o * gw.stride[0] + k0;
        if (full && vec8_ok(gw.data, gw.dtype, go)) store8(gw.data, gw.dtype, go, v);
        else
            for (int i = 0; i < 8 && k0 + i < K; i++) st_float(gw.data, gw.dtype, go + i, v[i]);
    }
}
// grad_W[o,c,i,j] = scale_a * R[o][(i*kw+j)*C + c], any strides: a thread per (o, c) and its taps,
// each read from a row of R that the warp's consecutive channels read together.
template <typename D> __global__ void scatter_grad_w(const D * R, struct dgeom g, struct dscale sa, struct dview gw) {
    const float s = ld_scale(sa);
    const int64_t total = g.O * g.C;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = qdiv(e, g.C), c = e - o * g.C;
        const D * src = R + o * g.K + c;
        const int64_t base = o * gw.stride[0] + c * gw.stride[1];
        for (int i = 0; i < g.kh; i++)
            for (int j = 0; j < g.kw; j++)
                st_float(gw.data, gw.dtype, base + i * gw.stride[2] + j * gw.stride[3],
                         __fmul_rn(to_f32(src[(int64_t)(i * g.kw + j) * g.C]), s));
    }
}
// grad_W[o,c,i,j] = scale_a * R[o][(i*kw+j)*C + c] into a dense OIHW grad_W (each o's [C][taps]
// contiguous): per o, R's [taps][C] transposed through shared memory, a block per (o, 64
// channels) reading its taps' rows of R and writing its channels' taps as one contiguous run.
template <typename D>
__global__ void transpose_grad_w(const D * R, int64_t C, int taps, struct dscale sa, struct dview gw) {
    extern __shared__ float tile[]; // [taps][65] (65: a warp's reads of a column spread over the banks)
    const float s = ld_scale(sa);
    const int64_t o = blockIdx.y, c0 = (int64_t)blockIdx.x * 64;
    const int nc = C - c0 < 64 ? (int)(C - c0) : 64;
    const D * src = R + o * taps * C + c0;
    for (int q = threadIdx.x; q < taps * 64; q += blockDim.x) {
        const int t = q / 64, c = q % 64;
        if (c < nc) tile[t * 65 + c] = __fmul_rn(to_f32(src[(int64_t)t * C + c]), s);
    }
    __syncthreads();
    const int64_t base = o * gw.stride[0] + c0 * taps;
    for (int q = threadIdx.x; q < nc * taps; q += blockDim.x) {
        const int c = q / taps, t = q - c * taps;
        st_float(gw.data, gw.dtype, base + q, tile[t * 65 + c]);
    }
}
// The bit pattern of v as an element of dtype dt (F32, F16 or BF16; v = 0 or +-1, exact in all).
uint32_t element_bits(float v, int dt) {
    uint32_t f;
    memcpy(&f, &v, 4);
    return dt == BIE_DTYPE_F32 ? f : dt == BIE_DTYPE_BF16 ? f >> 16 : v == 0.0f ? 0u : v > 0.0f ? 0x3c00u : 0xbc00u;
}
// Where a gradient GEMM writes, D = alpha * op(A) op(B): column-major C of dtype ct and leading
// dimension ldc; alpha on the host, or (alpha_dev non-NULL) alpha_dev[0] = alpha and alpha_dev[1]
// = 0 on the device, written by an earlier kernel of the stream.
struct gemm_dst {
    void * C;
    cudaDataType_t ct;
    int64_t ldc;
    float alpha;
    const float * alpha_dev;
};
// d.C [m][n] = alpha * op(A) op(B), operands of dtype t, f32 accumulation.
enum bie_status gemm_ex(bie_context_t * ctx, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
                        int64_t k, const void * A, int64_t lda, const void * B, int64_t ldb, const struct gemm_dst & d,
                        cudaDataType_t t, const char * what) {
    cublasHandle_t h;
    BIE_TRY(bie_cuda_cublas(ctx, &h));
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX || d.ldc > INT32_MAX)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "%s: a dimension exceeds cuBLAS's 32-bit limit", what);
    const float zero = 0.0f;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (d.alpha_dev) st = cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE);
    if (st == CUBLAS_STATUS_SUCCESS) {
        st = cublasGemmEx(h, ta, tb, (int)m, (int)n, (int)k, d.alpha_dev ? d.alpha_dev : &d.alpha, A, t, (int)lda, B, t,
                          (int)ldb, d.alpha_dev ? d.alpha_dev + 1 : &zero, d.C, d.ct, (int)d.ldc, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT);
        if (d.alpha_dev) {
            const cublasStatus_t back = cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST);
            if (st == CUBLAS_STATUS_SUCCESS) st = back;
        }
    }
    if (st != CUBLAS_STATUS_SUCCESS)
        return bie_set_error(ctx, BIE_STATUS_DEVICE_ERROR, "cuda: cublasGemmEx (%s): %s", what,
                             cublasGetStatusString(st));
    return BIE_STATUS_OK;
}
// Whether the bytes of tensors a and b (b may be absent: data NULL) overlap.
bool spans_overlap(const struct bie_tensor & a, const struct bie_tensor & b) {
    if (!a.data || !b.data) return false;
    size_t na, nb;
    if (bie_tensor_nbytes(&a, &na) != BIE_STATUS_OK || bie_tensor_nbytes(&b, &nb) != BIE_STATUS_OK) return true;
    const uintptr_t pa = (uintptr_t)a.data, pb = (uintptr_t)b.data;
    return pa < pb + nb && pb < pa + na;
}
// {scale_w, 0, scale_a, 0}: the alphas of the GEMMs that write grad_x and grad_weight directly
// when the scales are device tensors.
__global__ void gemm_scalars(struct dscale sw, struct dscale sa, float * out) {
    out[0] = ld_scale(sw);
    out[1] = 0.0f;
    out[2] = ld_scale(sa);
    out[3] = 0.0f;
}
// The regions of the GEMM route's workspace, in order (0 bytes: not used by the route).
enum bwd_region {
    B_G,    // G = grad_y as dense rows [M][O] (unless grad_y already is)
    B_W,    // the weight codes
    B_COL,  // dCol (f32) or Gcol + Gx (transposed conv), then Acol
    B_R,    // R = G^T Acol (f32), unless grad_weight is written by its GEMM
    B_SCAL, // gemm_scalars
    B_PASS, // the STE pass's partial sums
    B_PIX,  // activation codes as pixel rows (then im2col)
    B_REGIONS
};
// The GEMM route of a backward call, chosen before anything runs (bwd_route_make).
struct bwd_route {
    struct dgeom g;
    int64_t M, O, K, xnumel, xpix;
    int taps, gdt; // gdt: the GEMM operands' dtype, grad_y's (codes are exact in all three)
    cudaDataType_t ct;
    size_t es; // its element size
    bool want_gx, want_gw;
    bool gx_conv;              // grad_x as a transposed conv of grad_y (stride 1, several taps)
    bool ste_linear;           // the STE pass over x's rows (else by tiles of pixels x channels)
    bool gx_direct, gw_direct; // gradients written by their GEMMs with the scale as alpha
    bool acol_pixels;          // activation codes as pixel rows first, then im2col
    int64_t gx_ld, gw_ld;
    struct dview x, xm, gm, gxo, gwo; // gm: grad_x_mask (data NULL when absent)
    size_t gcol_bytes;
    ste_pass_job pj;
    size_t size[B_REGIONS], off[B_REGIONS], total;
};
// The workspace's regions of route r.
void bwd_workspace(bwd_route * r) {
    const int64_t M = r->M, O = r->O, K = r->K;
    const size_t es = r->es;
    size_t * z = r->size;
    z[B_G] = (size_t)(M * O) * es;
    z[B_W] = r->want_gx ? (size_t)(O * K) * es : 0;
    r->gcol_bytes = (((size_t)(r->xpix * r->taps * O) * es) + 255) & ~(size_t)255;
    const size_t gx_bytes = r->gx_conv                    ? r->gcol_bytes + (size_t)r->xnumel * 4
                            : r->want_gx && !r->gx_direct ? (size_t)(M * K) * 4
                                                          : 0;
    z[B_COL] = std::max(gx_bytes, r->want_gw ? (size_t)(M * K) * es : (size_t)0);
    z[B_R] = r->want_gw && !r->gw_direct ? (size_t)(O * K) * 4 : 0;
    z[B_SCAL] = 4 * sizeof(float);
    z[B_PASS] = r->want_gx ? bie_cuda_ste_pass_workspace(r->pj) : 0;
    z[B_PIX] = r->acol_pixels ? (size_t)r->xnumel * es : 0;
    r->total = ws_layout(z, r->off, B_REGIONS);
}
// Chooses the GEMM route of a backward call (see bwd_route).
enum bie_status bwd_route_make(bie_context_t * ctx, const struct bie_layer_call * c, bwd_route * r) {
    const struct dgeom g = r->g = dgeom_make(c->g);
    const int64_t M = r->M = g.batch * g.OH * g.OW, O = r->O = g.O, K = r->K = g.K;
    r->xnumel = g.batch * g.C * g.H * g.W;
    r->gdt = c->grad_y.dtype;
    r->ct = r->gdt == BIE_DTYPE_F16 ? CUDA_R_16F : r->gdt == BIE_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    r->es = r->gdt == BIE_DTYPE_F32 ? 4 : 2;
    r->want_gx = c->grad_x.data || c->grad_scale_a.data || c->grad_bias_a.data;
    r->want_gw = c->grad_weight.data != NULL;
    // grad_x of a stride-1 conv with several taps is computed as a convolution of grad_y (the
    // transposed conv): Gcol [x pixels][t*O + o] = grad_y at the output position that tap t of
    // the pixel feeds (0 where none), and Gx [x pixels][C] = Gcol @ Wt, Wt[t*O + o][c] = Wc[o][t*C + c].
    // Its operand (taps*O half-size elements per x pixel) is half the f32 dCol [M][K] of the
    // general path (dCol = G @ Wc, whose tap sums the STE pass gathers), and the STE pass reads
    // one f32 per element instead of taps.
    r->taps = g.kh * g.kw;
    r->xpix = r->xnumel / g.C;
    r->gx_conv = r->want_gx && !dgeom_one_position(g) && r->taps > 1 && g.sh == 1 && g.sw == 1;
    // The STE pass of a linear layer over contiguous features takes row slabs (ste_rows), any
    // other layer tiles of pixels x channels (ste_tiles, `groups` blocks per channel tile); both
    // leave partial channel sums of the masked gradient (a row per slab or group) for grad_bias_a.
    // Saved bits (a B1 x, with x_mask for grad_x) are read by the row passes only.
    dview_make(&c->x, &r->x);
    r->xm.data = r->gm.data = NULL;
    if (c->x_mask.data) dview_make(&c->x_mask, &r->xm);
    if (c->grad_x_mask.data) dview_make(&c->grad_x_mask, &r->gm);
    const bool saved = r->x.dtype == BIE_DTYPE_B1;
    r->ste_linear = codes_rows_ok(r->x, dgeom_one_position(g), K) && (!r->xm.data || codes_rows_ok(r->xm, true, K)) &&
                    (!r->gm.data || codes_rows_ok(r->gm, true, K));
    if (saved && r->want_gx && !r->ste_linear)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED,
                             "x, x_mask, grad_x_mask: CUDA reads saved bits in rows that start on "
                             "whole bytes with contiguous features (as bie_tensor_make lays them out)");
    // Gradients written by their GEMMs: when grad_x (of a linear layer) or grad_weight (of a 1x1
    // kernel) has dense rows of grad_y's dtype, its GEMM writes it with the scale as alpha (the
    // f32 product scale * sum rounded once, as the reference rounds it), so neither dCol nor R
    // goes through memory in f32. grad_x goes so only when neither grad_scale_a nor grad_bias_a is
    // asked for (they sum the unrounded masked gradient); its STE mask is then applied in place by
    // the pass that writes the activation codes, which reads x anyway. A gradient that shares
    // bytes with what is read after its GEMM writes it keeps the path through the workspace.
    r->gxo.data = r->gwo.data = NULL;
    if (c->grad_x.data) dview_make(&c->grad_x, &r->gxo);
    if (r->want_gw) dview_make(&c->grad_weight, &r->gwo);
    r->gx_ld = M == 1 ? K : r->gxo.stride[0];
    r->gw_ld = O == 1 ? K : r->gwo.stride[0];
    r->gx_direct = r->gxo.data && !c->grad_scale_a.data && !c->grad_bias_a.data && !r->gm.data && !c->grad_x_add.data &&
                   r->ste_linear && r->gxo.dtype == r->gdt && (K == 1 || r->gxo.stride[1] == 1) && r->gx_ld >= K &&
                   !spans_overlap(c->grad_x, c->x) && !spans_overlap(c->grad_x, c->grad_y) &&
                   !spans_overlap(c->grad_x, c->bias_a) && !spans_overlap(c->grad_x, c->scale_a_t) &&
                   !spans_overlap(c->grad_x, c->x_mask);
    r->gw_direct = r->want_gw && g.kh == 1 && g.kw == 1 && r->gwo.dtype == r->gdt &&
                   (K == 1 || r->gwo.stride[1] == 1) && r->gw_ld >= K && !spans_overlap(c->grad_weight, c->grad_y);
    // the STE pass (its partial sums): over x's rows for a linear layer, else by tiles of x
    ste_pass_job & pj = r->pj;
    pj.rows = r->ste_linear;
    pj.g = g;
    pj.xnumel = r->xnumel;
    pj.gb.data = pj.gsa.data = NULL;
    if (c->grad_bias_a.data) dview_make(&c->grad_bias_a, &pj.gb);
    if (c->grad_scale_a.data) dview_make(&c->grad_scale_a, &pj.gsa);
    // activation codes as pixel rows first (then im2col) unless x's rows are the GEMM's rows
    r->acol_pixels = r->want_gw && !codes_rows_ok(r->x, dgeom_one_position(g), K);
    bwd_workspace(r);
    return BIE_STATUS_OK;
}
void bwd_route_describe(const struct bie_layer_call * c, const bwd_route & r) {
    snprintf(c->plan->route, sizeof c->plan->route,
             "cuda:%d, cuBLAS GEMMs in %s (grad_x: %s; grad_weight: %s); STE pass by %s", (int)c->device_index,
             bie_dtype_name((enum bie_dtype)r.gdt),
             !r.want_gx    ? "not asked"
             : r.gx_conv   ? "transposed conv over im2col of grad_y"
             : r.gx_direct ? "written by the GEMM, masked in place"
                           : "dCol GEMM",
             !r.want_gw      ? "not asked"
             : r.gw_direct   ? "written by the GEMM"
             : r.acol_pixels ? "im2col of codes"
                             : "codes rows",
             r.ste_linear ? "rows" : "tiles");
    c->plan->workspace = r.total;
}
// The operands and scales that the route's steps share once the workspace is there.
struct bwd_run {
    uint8_t * ws;
    cudaStream_t s;
    struct dview bias;
    struct dscale sa, sw;
    const void * G;
    gemm_dst gx_dst, gw_dst;
};
// an f32 buffer of the workspace (ld elements), or a gradient written directly with its scale
gemm_dst f32_dst(void * p, int64_t ld) { return gemm_dst{p, CUDA_R_32F, ld, 1.0f, NULL}; }
// grad_x: the weight codes, dCol (or Gx, by the transposed conv) by cuBLAS, then the STE pass
// (unless grad_x is written by its GEMM, masked later).
enum bie_status bwd_grad_x(bie_context_t * ctx, const struct bie_layer_call * c, bwd_route & r, const bwd_run & u) {
    const struct dgeom & g = r.g;
    const int64_t M = r.M, O = r.O, K = r.K;
    uint8_t * const ws = u.ws;
    const cudaStream_t s = u.s;
    struct dgeom gs = g; // the geometry the STE pass gathers tap sums with
    struct dview w;
    dview_make(&c->weight, &w);
    if (r.gx_conv) {
        weight_codes<<<grid_for(O * K, 256), 256, 0, s>>>(w, g, (int)c->quant, u.sw, r.gdt, 1, ws + r.off[B_W]);
        LAUNCHED(ctx, "weight codes");
        // grad_y's pixels are the image and x's the output positions: x pixel h reads grad_y
        // row h + ph - i*dh through tap i
        struct dgeom gt = g;
        gt.C = O;
        gt.H = g.OH;
        gt.W = g.OW;
        gt.O = g.C;
        gt.OH = g.H;
        gt.OW = g.W;
        gt.K = r.taps * O;
        gt.ph = -g.ph;
        gt.pw = -g.pw;
        gt.dh = -g.dh;
        gt.dw = -g.dw;
        BIE_TRY(bie_cuda_im2col(ctx, s, u.G, (int)r.es, 0u, gt, gt.K, ws + r.off[B_COL]));
        // Gx (row-major [xpix][C]) = Gcol [xpix][taps*O] @ Wt: column-major Gx^T = Wt^T Gcol^T.
        BIE_TRY(gemm_ex(ctx, CUBLAS_OP_N, CUBLAS_OP_N, g.C, r.xpix, gt.K, ws + r.off[B_W], g.C, ws + r.off[B_COL], gt.K,
                        f32_dst(ws + r.off[B_COL] + r.gcol_bytes, g.C), r.ct, "grad_x"));
        // Gx is a dCol of one tap per pixel: a 1x1, stride-1 conv without padding
        gs.kh = gs.kw = gs.sh = gs.sw = gs.dh = gs.dw = 1;
        gs.ph = gs.pw = 0;
        gs.OH = g.H;
        gs.OW = g.W;
        gs.K = g.C;
    } else {
        if (!launch_codes_rows(w, bias_none(), g.kh == 1 && g.kw == 1, O, K, bias_none(), (int)c->quant, u.sw, r.gdt,
                               ws + r.off[B_W], s))
            weight_codes<<<grid_for(O * K, 256), 256, 0, s>>>(w, g, (int)c->quant, u.sw, r.gdt, 0, ws + r.off[B_W]);
        LAUNCHED(ctx, "weight codes");
        // dCol (row-major [M][K]) = G [M][O] @ Wc [O][K]: column-major dCol^T = Wc^T G^T; or
        // (gx_direct) grad_x = scale_w * dCol, masked later
        BIE_TRY(gemm_ex(ctx, CUBLAS_OP_N, CUBLAS_OP_N, K, M, O, ws + r.off[B_W], K, u.G, O,
                        r.gx_direct ? u.gx_dst : f32_dst(ws + r.off[B_COL], K), r.ct, "grad_x"));
    }
    if (r.gx_direct) return BIE_STATUS_OK;
    ste_pass_job & pj = r.pj;
    pj.x = r.x;
    pj.xm = r.xm;
    pj.gm = r.gm;
    pj.bias = u.bias;
    if (!r.ste_linear) pj.g = gs;
    pj.quant = (int)c->quant;
    pj.sa = u.sa;
    pj.sw = u.sw;
    pj.dcol = ws + r.off[B_COL] + (r.gx_conv ? r.gcol_bytes : 0);
    pj.dcol_dtype = BIE_DTYPE_F32;
    pj.gx = r.gxo;
    pj.gadd.data = NULL;
    if (c->grad_x_add.data) dview_make(&c->grad_x_add, &pj.gadd);
    return bie_cuda_ste_pass(ctx, s, pj, ws + r.off[B_PASS]);
}
// grad_weight: the activation codes (Acol), R = G^T Acol by cuBLAS, scaled into grad_weight
// (unless its GEMM writes it). mask_gx: a grad_x that its GEMM wrote, masked by the codes' pass.
enum bie_status bwd_grad_w(bie_context_t * ctx, const struct bie_layer_call * c, const bwd_route & r, const bwd_run & u,
                           void * mask_gx) {
    const struct dgeom & g = r.g;
    const int64_t M = r.M, O = r.O, K = r.K;
    uint8_t * const ws = u.ws;
    const cudaStream_t s = u.s;
    // a linear layer: row m of Acol is row m of x
    if (r.acol_pixels) {
        BIE_TRY(bie_cuda_pixel_rows(ctx, s, r.x, u.bias, (int)c->quant, u.sa, r.gdt, 0, ws + r.off[B_PIX]));
        const float pad = c->quant != BIE_QUANT_BINARY       ? 0.0f
                          : g.pad_value == BIE_PAD_PLUS_ONE  ? 1.0f
                          : g.pad_value == BIE_PAD_MINUS_ONE ? -1.0f
                                                             : 0.0f;
        BIE_TRY(
            bie_cuda_im2col(ctx, s, ws + r.off[B_PIX], (int)r.es, element_bits(pad, r.gdt), g, K, ws + r.off[B_COL]));
    } else {
        launch_codes_rows(r.x, r.xm, true, M, K, u.bias, (int)c->quant, u.sa, r.gdt, ws + r.off[B_COL], s, mask_gx,
                          r.gx_ld);
        LAUNCHED(ctx, mask_gx ? "activation codes and STE mask" : "activation codes");
    }
    // R (row-major [O][K]) = G^T @ Acol: column-major R^T [K][O] = Acol^T [K][M] . G [M][O];
    // grad_W = scale_a * R, written by the GEMM itself when gw_direct
    BIE_TRY(gemm_ex(ctx, CUBLAS_OP_N, CUBLAS_OP_T, K, O, M, ws + r.off[B_COL], K, u.G, O,
                    r.gw_direct ? u.gw_dst : f32_dst(ws + r.off[B_R], K), r.ct, "grad_weight"));
    if (r.gw_direct) return BIE_STATUS_OK;
    const struct dview & gwo = r.gwo;
    launch_grad_w(s, BIE_DTYPE_F32, ws + r.off[B_R], g, u.sa, gwo);
    LAUNCHED(ctx, "grad_weight");
    return BIE_STATUS_OK;
}

} // namespace

// Launches codes_rows when the rows of t ([rows, K] in its 4-D view: dim 0 rows, dim 1 the K
// contiguous elements, dims 2-3 of extent 1; rows_are_k says the layer's geometry makes them so)
// are contiguous floats, or bits in rows that start on whole bytes; false otherwise.
bool codes_rows_ok(const struct dview & t, bool rows_are_k, int64_t K) {
    if (!rows_are_k || !(K == 1 || t.stride[1] == 1)) return false;
    return t.dtype == BIE_DTYPE_B1 ? t.stride[0] % 8 == 0 : bie_dtype_is_float((enum bie_dtype)t.dtype);
}
// pass: for t of saved bits and a gx to mask, the saved mask (rows like t's); else unused.
bool launch_codes_rows(const struct dview & t, const struct dview & pass, bool rows_are_k, int64_t rows, int64_t K,
                       const struct dview & bias, int quant, struct dscale sc, int gdt, void * out, cudaStream_t stream,
                       void * gx, int64_t gx_ld) {
    if (!codes_rows_ok(t, rows_are_k, K)) return false;
    if (t.dtype == BIE_DTYPE_F32) launch_codes<float>(stream, t, pass, rows, K, bias, quant, sc, gdt, out, gx, gx_ld);
    else if (t.dtype == BIE_DTYPE_F16)
        launch_codes<__half>(stream, t, pass, rows, K, bias, quant, sc, gdt, out, gx, gx_ld);
    else if (t.dtype == BIE_DTYPE_BF16)
        launch_codes<__nv_bfloat16>(stream, t, pass, rows, K, bias, quant, sc, gdt, out, gx, gx_ld);
    else if (t.dtype == BIE_DTYPE_B1) {
        // (saved bits without a mask in dense rows: one flat map)
        const bool flat = !gx && out && K % 8 == 0 && (rows == 1 || t.stride[0] == K);
        if (!(flat && launch_bit_codes_flat(stream, (const uint8_t *)t.data, rows * K / 8, gdt, out)))
            launch_codes<sbits>(stream, t, pass, rows, K, bias, quant, sc, gdt, out, gx, gx_ld);
    } else return false;
    return true;
}
struct dview bias_none() {
    struct dview v;
    v.data = NULL;
    return v;
}

void launch_weight_codes(cudaStream_t s, const struct dview & w, const struct dgeom & g, int quant, struct dscale sw,
                         int gdt, int tap_major, void * Wc) {
    weight_codes<<<grid_for(g.O * g.K, 256), 256, 0, s>>>(w, g, quant, sw, gdt, tap_major, Wc);
}

template <typename D>
void launch_grad_w_as(cudaStream_t s, const D * R, const struct dgeom & g, struct dscale sa, const struct dview & gw) {
    const int taps = g.kh * g.kw;
    // grad_W in R's own order (OHWI, rows contiguous), or dense OIHW
    const bool rows = (g.C == 1 || gw.stride[1] == 1) && (g.kw == 1 || gw.stride[3] == g.C) &&
                      (g.kh == 1 || gw.stride[2] == g.kw * g.C);
    const bool oihw = (g.C == 1 || gw.stride[1] == taps) && (g.kh == 1 || gw.stride[2] == g.kw) &&
                      (g.kw == 1 || gw.stride[3] == 1) && taps <= 64 && g.O <= 65535;
    if (rows) scale_rows<D><<<grid_for(g.O * ((g.K + 7) / 8), 256), 256, 0, s>>>(R, g.O, g.K, sa, gw);
    else if (oihw)
        transpose_grad_w<D>
            <<<dim3((unsigned)((g.C + 63) / 64), (unsigned)g.O), 256, (size_t)taps * 65 * sizeof(float), s>>>(
                R, g.C, taps, sa, gw);
    else scatter_grad_w<D><<<grid_for(g.O * g.C, 256), 256, 0, s>>>(R, g, sa, gw);
}
void launch_grad_w(cudaStream_t s, int dt, const void * R, const struct dgeom & g, struct dscale sa,
                   const struct dview & gw) {
    if (dt == BIE_DTYPE_F16) launch_grad_w_as(s, (const __half *)R, g, sa, gw);
    else if (dt == BIE_DTYPE_BF16) launch_grad_w_as(s, (const __nv_bfloat16 *)R, g, sa, gw);
    else launch_grad_w_as(s, (const float *)R, g, sa, gw);
}

extern "C" enum bie_status bie_cuda_layer_backward(bie_context_t * ctx, const struct bie_layer_call * c) {
    struct bie_cuda_state * st;
    BIE_TRY(bie_cuda_state_get(ctx, c->device_index, &st));
    const bool want_gx = c->grad_x.data || c->grad_scale_a.data || c->grad_bias_a.data;
    const bool want_gw = c->grad_weight.data != NULL;
    if (!want_gx && !want_gw) return BIE_STATUS_OK;
    if (cudnn_route(ctx, c)) {
        const enum bie_status s = backward_cudnn(ctx, c, st->stream);
        if (s != BIE_DECLINED) return s;
        bie_clear_error(ctx);
    }
    if (c->is_conv && c->x.dtype == BIE_DTYPE_B1)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED,
                             "x: the backward of a conv from saved bits needs cuDNN and "
                             "zero padding on CUDA");
    bwd_route r;
    BIE_TRY(bwd_route_make(ctx, c, &r));
    if (c->plan) {
        bwd_route_describe(c, r);
        return BIE_STATUS_OK;
    }
    bwd_run u;
    BIE_TRY(bie_cuda_workspace(ctx, r.total, (void **)&u.ws));
    u.s = st->stream;
    u.bias.data = NULL;
    if (c->bias_a.data) dview_make(&c->bias_a, &u.bias);
    struct dview gy;
    dview_make(&c->grad_y, &gy);
    u.sa = dscale_make(c, true), u.sw = dscale_make(c, false);
    float * scal = (float *)(u.ws + r.off[B_SCAL]);
    if ((r.gx_direct && u.sw.ptr) || (r.gw_direct && u.sa.ptr)) {
        gemm_scalars<<<1, 1, 0, u.s>>>(u.sw, u.sa, scal);
        LAUNCHED(ctx, "GEMM scalars");
    }
    u.gx_dst = {r.gxo.data, r.ct, r.gx_ld, u.sw.value, u.sw.ptr ? scal : NULL};
    u.gw_dst = {r.gwo.data, r.ct, r.gw_ld, u.sa.value, u.sa.ptr ? scal + 2 : NULL};
    // A linear grad_y with dense rows already is G; otherwise gather it.
    const bool g_direct = !c->is_conv && gy.stride[1] == 1 && (r.M == 1 || gy.stride[0] == r.O);
    u.G = g_direct ? (const void *)gy.data : (const void *)(u.ws + r.off[B_G]);
    if (!g_direct) BIE_TRY(bie_cuda_pixel_rows(ctx, u.s, gy, bias_none(), 0, u.sa, r.gdt, 0, u.ws + r.off[B_G]));
    if (want_gx) BIE_TRY(bwd_grad_x(ctx, c, r, u));
    // the STE mask of a grad_x that its GEMM wrote: applied by the pass of the activation codes
    void * const mask_gx = r.gx_direct ? r.gxo.data : NULL;
    if (want_gw) {
        BIE_TRY(bwd_grad_w(ctx, c, r, u, mask_gx));
    } else if (mask_gx) {
        launch_codes_rows(r.x, r.xm, true, r.M, r.K, u.bias, (int)c->quant, u.sa, r.gdt, NULL, u.s, mask_gx, r.gx_ld);
        LAUNCHED(ctx, "STE mask");
    }
    return BIE_STATUS_OK;
}
