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
#include "cuda-impl.cuh"
#include "cuda-ste.cuh"

#include <math.h>
#include <string.h>

#include <algorithm>
#include <type_traits>

namespace {

size_t align256(size_t v) { return (v + 255) & ~(size_t)255; }

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

// The element type of a pass over saved bits: a byte holds the sign bits of 8 consecutive
// elements of x (bit e for element e), and the STE mask's byte beside it their pass bits.
struct sbits {
    uint8_t b;
};
template <typename T> constexpr bool is_sbits = std::is_same<T, sbits>::value;

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
// Replaces the chunk's floats by their codes (bias added first; not when codes is false); returns
// (MASK) the bits of the elements the STE stops. FULL: all 8 lie inside the row (no bounds tests).
// bin_s: ste_division_free(quant, s), worked out once per thread (the STE test is then |x'| <= s).
template <bool MASK, bool FULL>
__device__ __forceinline__ unsigned chunk_codes(float * q, int64_t k0, int64_t K, const struct dview & bias, int quant,
                                                float s, int lo, int hi, bool codes, bool bin_s) {
    const int n = FULL || K - k0 >= 8 ? 8 : (int)(K - k0);
    if (bias.data)
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (FULL || i < n) q[i] = __fadd_rn(q[i], ld_float(bias.data, bias.dtype, (k0 + i) * bias.stride[3]));
    unsigned stop = 0;
    if (MASK) {
        if (bin_s)
            stop = ~ste_pass_bits8(q, s, true) & 0xffu;
        else
#pragma unroll
            for (int i = 0; i < 8; i++) stop |= ste_passes(q[i], s, quant, lo, hi) ? 0u : 1u << i;
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
template <bool MASK>
__device__ __forceinline__ unsigned chunk_bits(float * q, uint32_t sign, uint32_t pass, int n) {
#pragma unroll
    for (int i = 0; i < 8; i++) q[i] = (sign >> i) & 1u ? 1.0f : -1.0f;
    return MASK ? ~pass & ((1u << n) - 1u) : 0u;
}
// Chunk k0 of a row one chunk at a time (row: its first element; prow: the mask row of saved bits,
// read for MASK): as chunk_codes after chunk_load, or as chunk_bits.
template <bool MASK, typename T>
__device__ __forceinline__ unsigned chunk_any(const T * row, const uint8_t * prow, int sdt, int64_t k0, int64_t K,
                                              const struct dview & bias, int quant, float s, int lo, int hi,
                                              bool codes, bool bin_s, float * q) {
    if constexpr (is_sbits<T>) {
        return chunk_bits<MASK>(q, row[k0 / 8].b, MASK ? prow[k0 / 8] : 0u, K - k0 < 8 ? (int)(K - k0) : 8);
    } else {
        chunk_load<T>(row, sdt, k0, K, q);
        return chunk_codes<MASK, false>(q, k0, K, bias, quant, s, lo, hi, codes, bin_s);
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

// Rows of fewer than 256 elements: a thread per chunk (five blocks a multiprocessor: at six, with
// 40 registers, it spills).
template <bool MASK, typename T>
__global__ void __launch_bounds__(256, 5)
    codes_rows(const T * src, int sdt, int64_t row_stride, int64_t rows, int64_t K, struct dview bias, int quant,
               struct dscale sc, int gdt, void * out, void * gx, int64_t gx_ld, const uint8_t * pass, int64_t pass_ld) {
    const float s = ld_scale(sc);
    const int lo = qlo(quant), hi = qhi(quant);
    const bool bin_s = ste_division_free(quant, s);
    const int64_t chunks = (K + 7) / 8, total = rows * chunks;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = qdiv(e, chunks), k0 = (e - r * chunks) * 8;
        float q[8];
        const unsigned stop = chunk_any<MASK, T>(src + r * row_stride, pass ? pass + r * pass_ld : NULL, sdt, k0, K, bias,
                                                 quant, s, lo, hi, out != NULL, bin_s, q);
        chunk_store<MASK>(q, stop, r, k0, K, gdt, out, gx, gx_ld);
    }
}

// Rows of 256 elements or more: a warp per row, each lane with 64 bytes of loads in flight (4
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
    const float s = ld_scale(sc);
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
                    const unsigned stop = chunk_codes<MASK, true>(q, k0, K, bias, quant, s, lo, hi, out != NULL, bin_s);
                    chunk_store<MASK>(q, stop, r, k0, K, gdt, out, gx, gx_ld);
                }
            }
        }
        for (int64_t c = vec + lane; c < chunks; c += 32) {
            float q[8];
            const unsigned stop = chunk_any<MASK, T>(row, prow, sdt, c * 8, K, bias, quant, s, lo, hi, out != NULL, bin_s, q);
            chunk_store<MASK>(q, stop, r, c * 8, K, gdt, out, gx, gx_ld);
        }
    }
}

// Launches codes_rows when the rows of t ([rows, K] in its 4-D view: dim 0 rows, dim 1 the K
// contiguous elements, dims 2-3 of extent 1; rows_are_k says the layer's geometry makes them so)
// are contiguous floats, or bits in rows that start on whole bytes; false otherwise.
bool codes_rows_ok(const struct dview & t, bool rows_are_k, int64_t K) {
    if (!rows_are_k || !(K == 1 || t.stride[1] == 1)) return false;
    return t.dtype == BIE_DTYPE_B1 ? t.stride[0] % 8 == 0 : bie_dtype_is_float((enum bie_dtype)t.dtype);
}
// The pass with or without the mask, as two instances (the mask's code in a kernel that has no
// mask to apply would cost it registers, and time). Saved bits: row strides in bytes.
template <typename T>
void launch_codes(cudaStream_t stream, const struct dview & t, const struct dview & pass, int64_t rows, int64_t K,
                  const struct dview & bias, int quant, struct dscale sc, int gdt, void * out, void * gx,
                  int64_t gx_ld) {
    const bool warp = K >= 256;
    auto kern = warp ? (gx ? codes_rows_warp<true, T> : codes_rows_warp<false, T>)
                     : (gx ? codes_rows<true, T> : codes_rows<false, T>);
    const unsigned grid = grid_for(warp ? rows * 32 : rows * ((K + 7) / 8), 256);
    const int64_t ld = is_sbits<T> ? t.stride[0] / 8 : t.stride[0];
    const uint8_t * pp = is_sbits<T> && gx ? (const uint8_t *)pass.data : NULL;
    kern<<<grid, 256, 0, stream>>>((const T *)t.data, t.dtype, ld, rows, K, bias, quant, sc, gdt, out, gx, gx_ld, pp,
                                   pp ? pass.stride[0] / 8 : 0);
}
// pass: for t of saved bits and a gx to mask, the saved mask (rows like t's); else unused.
bool launch_codes_rows(const struct dview & t, const struct dview & pass, bool rows_are_k, int64_t rows, int64_t K,
                       const struct dview & bias, int quant, struct dscale sc, int gdt, void * out, cudaStream_t stream,
                       void * gx = NULL, int64_t gx_ld = 0) {
    if (!codes_rows_ok(t, rows_are_k, K)) return false;
    if (t.dtype == BIE_DTYPE_F32)
        launch_codes<float>(stream, t, pass, rows, K, bias, quant, sc, gdt, out, gx, gx_ld);
    else if (t.dtype == BIE_DTYPE_F16)
        launch_codes<__half>(stream, t, pass, rows, K, bias, quant, sc, gdt, out, gx, gx_ld);
    else if (t.dtype == BIE_DTYPE_BF16)
        launch_codes<__nv_bfloat16>(stream, t, pass, rows, K, bias, quant, sc, gdt, out, gx, gx_ld);
    else if (t.dtype == BIE_DTYPE_B1)
        launch_codes<sbits>(stream, t, pass, rows, K, bias, quant, sc, gdt, out, gx, gx_ld);
    else
        return false;
    return true;
}

// The binary STE of one element from its sign bit and its pass test: the masked gradient and the
// scale_a-gradient term (saved bits give both tests as bits).
__device__ __forceinline__ void ste_elem_binary(bool sign, bool pass, float gx, float * gxm, float * term) {
    *gxm = pass ? gx : 0.0f;
    *term = sign ? *gxm : -*gxm;
}
// The STE of one element (header comment): from x' and gx, the masked gradient and the
// scale_a-gradient term.
__device__ __forceinline__ void ste_elem(float xp, float gx, int quant, float s_a, int lo, int hi, float * gxm,
                                         float * term) {
    if (quant == BIE_QUANT_BINARY) {
        ste_elem_binary(xp >= 0.0f, ste_passes(xp, s_a, quant, lo, hi), gx, gxm, term);
    } else { // (one division: the test and the term both take r)
        const float r = __fdiv_rn(xp, s_a);
        const bool mid = ste_passes_r(r, quant, lo, hi);
        *gxm = mid ? gx : 0.0f;
        const float f = r < (float)lo ? (float)lo : r > (float)hi ? (float)hi : mid ? rintf(r) - r : 0.0f;
        *term = gx * f;
    }
}

// Adds a block's double to *sum (blockDim.x a multiple of 32, at most 1024 threads).
__device__ void block_sum_add(double acc, double * sum) {
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    __shared__ double part[32];
    const int tid = threadIdx.y * blockDim.x + threadIdx.x, nt = blockDim.x * blockDim.y;
    if ((tid & 31) == 0) part[tid >> 5] = acc;
    __syncthreads();
    if (tid == 0) {
        double t = 0.0;
        for (int i = 0; i < nt / 32; i++) t += part[i];
        atomicAdd(sum, t);
    }
}

// Output index that tap offset k (of dilation dil) of input coordinate x feeds, or -1:
// x = o*stride - pad + k*dil for o in [0, OX).
__device__ __forceinline__ int out_index(int x, int pad, int k, int dil, int stride, int OX) {
    const int t = x + pad - k * dil;
    if (t < 0) return -1;
    const int o = stride == 1 ? t : t / stride;
    return o * stride == t && o < OX ? o : -1;
}

// Element off of view v as f32: typed for float, __half and __nv_bfloat16, by v's dtype for void.
template <typename T> __device__ __forceinline__ float ld_as(const struct dview & v, int64_t off) {
    return to_f32(((const T *)v.data)[off]);
}
template <> __device__ __forceinline__ float ld_as<void>(const struct dview & v, int64_t off) {
    return ld_float(v.data, v.dtype, off);
}

constexpr int STE_TAPS = 9; // taps of a pixel whose dCol loads are issued together (a 3x3 kernel's at once)

// The fused STE pass over x, any geometry, by tiles of 32 pixels (p = (n*H + h)*W + w over the
// batch) x 32 channels, block (32, 8): the tap sums gx = sum of dCol over the taps that read
// (h, w) are gathered along the channels (rows of dCol are channel-contiguous), a thread's 4
// pixels x NT taps of loads in flight at once, into shared memory; x, grad_x and gxm are then
// visited along the pixels when those are contiguous in x (NCHW), else along the channels. A
// block keeps one channel tile (the grid is a multiple of the channel tiles) and leaves its
// channels' sums of the masked gradient in colpart[blockIdx.x / ctiles][c], for grad_bias_a
// (colpart_sums). NT = 0: dCol has one tap per pixel at stride 1 without padding, so gx of pixel p
// is dCol[p][c] (a 1x1 conv's dCol, or the grad_x GEMM of a stride-1 conv); T: x's element type
// (float, __half, __nv_bfloat16; void: any, by its dtype).
template <int NT, typename T>
__global__ void __launch_bounds__(256, NT == STE_TAPS ? 2 : 3) ste_tiles(struct dview x, struct dview bias, struct dgeom g, int quant, struct dscale sa,
                          struct dscale sw, const float * dcol, struct dview gx_out, int write_gx, int along_pixels,
                          double * colpart /* or NULL */, double * term_sum) {
    constexpr int NL = NT > 0 ? NT : 1; // loads per pixel in flight
    __shared__ float tile[32][33]; // [pixel][channel]
    __shared__ double csum[8][33];
    const float s_a = ld_scale(sa), s_w = ld_scale(sw);
    const int lo = qlo(quant), hi = qhi(quant), taps = g.kh * g.kw;
    const int64_t HW = g.H * g.W, P = g.batch * HW, ptiles = (P + 31) / 32, ctiles = (g.C + 31) / 32;
    const int lane = threadIdx.x, ty = threadIdx.y;
    const int64_t c0 = (blockIdx.x % ctiles) * 32;
    // cacc[k]: the thread's running sum of channel c0 + lane (along channels: k = 0 only) or of
    // channel c0 + ty + 8k over its lane's pixels (along pixels, summed over the lanes at the end)
    double acc = 0.0, cacc[4] = {0.0, 0.0, 0.0, 0.0};
    float bv[4]; // bias_a of the thread's channels, which stay fixed
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int64_t cc = c0 + (along_pixels ? ty + 8 * k : lane);
        bv[k] = bias.data && cc < g.C ? ld_float(bias.data, bias.dtype, cc * bias.stride[3]) : 0.0f;
    }
    for (int64_t pt = blockIdx.x / ctiles; pt < ptiles; pt += gridDim.x / ctiles) {
        const int64_t p0 = pt * 32;
        // tap sums of pixels p0 + ty + 8k at channel c0 + lane
        float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f}; // taps in order (i, then j); a skipped tap adds +0, which changes no sum
        if (NT == 0) {
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int64_t p = p0 + ty + 8 * k, c = c0 + lane;
                sum[k] = p < P && c < g.C ? __fadd_rn(0.0f, __ldg(dcol + p * g.C + c)) : 0.0f;
            }
        } else {
            const int64_t c = c0 + lane;
            int h[4], w[4];
            const float * base[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int64_t p = p0 + ty + 8 * k;
                const bool in = p < P && c < g.C;
                const int64_t n = in ? qdiv(p, HW) : 0, q = p - n * HW;
                h[k] = in ? (int)qdiv(q, g.W) : -(1 << 29); // outside: no tap reaches it
                w[k] = in ? (int)(q - (int64_t)h[k] * g.W) : 0;
                base[k] = dcol + n * g.OH * g.OW * g.K + c;
            }
            for (int t0 = 0; t0 < taps; t0 += NL) {
                float v[4][NL];
#pragma unroll
                for (int u = 0; u < NL; u++) {
                    const int t = t0 + u, i = t / g.kw, j = t - i * g.kw;
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        const int oh = t < taps ? out_index(h[k], g.ph, i, g.dh, g.sh, (int)g.OH) : -1;
                        const int ow = oh >= 0 ? out_index(w[k], g.pw, j, g.dw, g.sw, (int)g.OW) : -1;
                        v[k][u] = ow >= 0 ? __ldg(base[k] + ((int64_t)oh * g.OW + ow) * g.K + (int64_t)t * g.C) : 0.0f;
                    }
                }
#pragma unroll
                for (int k = 0; k < 4; k++)
#pragma unroll
                    for (int u = 0; u < NL; u++) sum[k] += v[k][u];
            }
        }
#pragma unroll
        for (int k = 0; k < 4; k++) tile[ty + 8 * k][lane] = sum[k];
        __syncthreads();
        // element k of this thread: pixel p0 + lane and channel c0 + ty + 8k along the pixels,
        // else pixel p0 + ty + 8k and channel c0 + lane; the offsets of x and grad_x split into a
        // pixel part and a channel part
        int64_t xo[4], go[4];
        float xv[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if (along_pixels && k > 0) {
                xo[k] = xo[0];
                go[k] = go[0];
                continue;
            }
            const int64_t p = p0 + (along_pixels ? lane : ty + 8 * k);
            const int64_t n = p < P ? qdiv(p, HW) : 0, q = p - n * HW, hh = p < P ? qdiv(q, g.W) : 0, ww = q - hh * g.W;
            xo[k] = p < P ? n * x.stride[0] + hh * x.stride[2] + ww * x.stride[3] : -1;
            go[k] = write_gx ? n * gx_out.stride[0] + hh * gx_out.stride[2] + ww * gx_out.stride[3] : 0;
        }
#pragma unroll
        for (int k = 0; k < 4; k++) { // x first, all 4 loads in flight
            const int64_t cc = c0 + (along_pixels ? ty + 8 * k : lane);
            xv[k] = xo[k] >= 0 && cc < g.C ? ld_as<T>(x, xo[k] + cc * x.stride[1]) : 0.0f;
            if (bias.data) xv[k] = __fadd_rn(xv[k], bv[k]);
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int r = ty + 8 * k, pi = along_pixels ? lane : r, ci = along_pixels ? r : lane;
            const int64_t cc = c0 + ci;
            float gxm_v = 0.0f, term = 0.0f;
            if (xo[k] >= 0 && cc < g.C) {
                ste_elem(xv[k], __fmul_rn(tile[pi][ci], s_w), quant, s_a, lo, hi, &gxm_v, &term);
                if (write_gx) st_float(gx_out.data, gx_out.dtype, go[k] + cc * gx_out.stride[1], gxm_v);
            }
            acc += (double)term;
            cacc[along_pixels ? k : 0] += (double)gxm_v;
        }
        __syncthreads();
    }
    if (colpart) { // this block's sums of its channels, in a fixed order
        if (along_pixels) { // thread (lane, ty) holds channels ty + 8k: summed over the lanes
#pragma unroll
            for (int k = 0; k < 4; k++) {
                double t = cacc[k];
                for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
                if (lane == 0) csum[0][ty + 8 * k] = t;
            }
            __syncthreads();
            if (ty == 0 && c0 + lane < g.C) colpart[(blockIdx.x / ctiles) * g.C + c0 + lane] = csum[0][lane];
        } else { // every warp holds channel c0 + lane: summed over the warps
            csum[ty][lane] = cacc[0];
            __syncthreads();
            if (ty == 0 && c0 + lane < g.C) {
                double t = 0.0;
                for (int y = 0; y < (int)blockDim.y; y++) t += csum[y][lane];
                colpart[(blockIdx.x / ctiles) * g.C + c0 + lane] = t;
            }
        }
    }
    if (term_sum) block_sum_add(acc, term_sum);
}

// ste_tiles for dCol's shape: several taps per pixel, one at a stride or with padding, or
// dCol[p][c] itself (a 1x1, stride-1 conv without padding).
template <typename T>
void launch_ste_tiles(unsigned grid, cudaStream_t s, struct dview x, struct dview bias, struct dgeom g, int quant,
                      struct dscale sa, struct dscale sw, const float * dcol, struct dview gxo, int wgx, int ap,
                      double * colpart, double * sum) {
    const bool dense = g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0 && g.OH == g.H && g.OW == g.W;
    const int mode = g.kh * g.kw > 1 ? 2 : dense ? 0 : 1;
    if (mode == 0) ste_tiles<0, T><<<grid, dim3(32, 8), 0, s>>>(x, bias, g, quant, sa, sw, dcol, gxo, wgx, ap, colpart, sum);
    else if (mode == 1) ste_tiles<1, T><<<grid, dim3(32, 8), 0, s>>>(x, bias, g, quant, sa, sw, dcol, gxo, wgx, ap, colpart, sum);
    else ste_tiles<STE_TAPS, T><<<grid, dim3(32, 8), 0, s>>>(x, bias, g, quant, sa, sw, dcol, gxo, wgx, ap, colpart, sum);
}

// The same pass for a linear layer (dgeom_one_position: dCol[n][c] is element (n, c)'s own sum
// over its one tap) whose x has contiguous features: a thread takes 8 consecutive features of a
// row, with 16-byte loads and stores where aligned. Block (32, 8) covers 256 features of a slab of
// `slab` rows; instead of the transposed copy for the per-channel sums, each block writes its
// slab's column sums to colpart[slab index][c] (finished by colpart_sums). T = sbits: x is saved
// sign bits and xm the saved mask, both in rows that start on whole bytes (a byte of each per
// thread and row), and each element's gradient and term are those of the x' they came from.
// Three blocks a multiprocessor: unbounded, the float instances take 136-139 registers, one block
// of eight warps a multiprocessor (at four blocks they spill).
template <typename T>
__global__ void __launch_bounds__(256, 3)
    ste_rows(struct dview x, struct dview xm, struct dview bias, int64_t rows, int64_t C, int64_t slab, int quant,
             struct dscale sa, struct dscale sw, const float * dcol, struct dview gx_out, int write_gx,
             double * colpart, double * term_sum) {
    const float s_a = ld_scale(sa), s_w = ld_scale(sw);
    const int lo = qlo(quant), hi = qhi(quant);
    const int64_t c0 = ((int64_t)blockIdx.x * 32 + threadIdx.x) * 8;
    const int64_t r0 = (int64_t)blockIdx.y * slab, r1 = r0 + slab < rows ? r0 + slab : rows;
    float b[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        b[i] = bias.data && c0 + i < C ? ld_float(bias.data, bias.dtype, (c0 + i) * bias.stride[3]) : 0.0f;
    double csum[8] = {0, 0, 0, 0, 0, 0, 0, 0}, acc = 0.0;
    if (c0 < C)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
            const float * dr = dcol + r * C;
            const bool full = c0 + 8 <= C;
            float xv[8], dv[8], gv[8];
            uint32_t sign = 0, pass = 0; // saved bits
            if constexpr (is_sbits<T>) {
                sign = ((const uint8_t *)x.data)[r * (x.stride[0] / 8) + c0 / 8];
                pass = ((const uint8_t *)xm.data)[r * (xm.stride[0] / 8) + c0 / 8];
            } else {
                const T * xr = (const T *)x.data + r * x.stride[0];
                if (full && vec8_ok(xr, x.dtype, c0)) load8<T>(xr + c0, xv);
                else
                    for (int i = 0; i < 8; i++) xv[i] = c0 + i < C ? ld_float((const char *)xr, x.dtype, c0 + i) : 0.0f;
            }
            if (full && vec8_ok(dr, BIE_DTYPE_F32, c0)) load8<float>(dr + c0, dv);
            else
                for (int i = 0; i < 8; i++) dv[i] = c0 + i < C ? dr[c0 + i] : 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                // as ste_pass: the tap sum starts from 0.0f, x' adds the bias in f32
                const float gxi = __fmul_rn(__fadd_rn(0.0f, dv[i]), s_w);
                float term;
                if constexpr (is_sbits<T>) {
                    ste_elem_binary((sign >> i) & 1u, (pass >> i) & 1u, gxi, &gv[i], &term);
                } else {
                    const float xp = bias.data ? __fadd_rn(xv[i], b[i]) : xv[i];
                    ste_elem(xp, gxi, quant, s_a, lo, hi, &gv[i], &term);
                }
                if (c0 + i < C) {
                    csum[i] += (double)gv[i];
                    acc += (double)term;
                }
            }
            if (!write_gx) continue;
            const int64_t go = r * gx_out.stride[0] + c0 * gx_out.stride[1];
            if (full && gx_out.stride[1] == 1 && vec8_ok(gx_out.data, gx_out.dtype, go)) store8(gx_out.data, gx_out.dtype, go, gv);
            else
                for (int i = 0; i < 8 && c0 + i < C; i++) st_float(gx_out.data, gx_out.dtype, go + i * gx_out.stride[1], gv[i]);
        }
    if (colpart) {
        __shared__ double cs[8][32 * 8];
#pragma unroll
        for (int i = 0; i < 8; i++) cs[threadIdx.y][threadIdx.x * 8 + i] = csum[i];
        __syncthreads();
        for (int j = threadIdx.y * 32 + threadIdx.x; j < 256; j += 256) {
            const int64_t c = (int64_t)blockIdx.x * 256 + j;
            double t = 0.0;
            for (int y = 0; y < 8; y++) t += cs[y][j];
            if (c < C) colpart[blockIdx.y * C + c] = t;
        }
    }
    if (term_sum) block_sum_add(acc, term_sum);
}

// grad_bias_a[c] = sum over the rows of colpart[row][c]: block (32, 32) per 32 channels, row r
// summed by warp r % 32, the 32 partial sums added in a fixed order.
__global__ void colpart_sums(const double * colpart, int64_t rows, int64_t C, struct dview out) {
    __shared__ double part[32][33];
    const int64_t c = (int64_t)blockIdx.x * 32 + threadIdx.x;
    double t = 0.0;
    if (c < C)
        for (int64_t r = threadIdx.y; r < rows; r += blockDim.y) t += colpart[r * C + c];
    part[threadIdx.y][threadIdx.x] = t;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        double sum = 0.0;
        for (int y = 0; y < (int)blockDim.y; y++) sum += part[y][threadIdx.x];
        st_float(out.data, out.dtype, c * out.stride[3], (float)sum);
    }
}

__global__ void finish_scale_grad(const double * term_sum, double denom, struct dview out) {
    st_float(out.data, out.dtype, 0, (float)(*term_sum / denom));
}

// The same for a 1x1 kernel (k = c) whose grad_W has contiguous features: 8 per thread, 16-byte
// loads and stores where aligned.
__global__ void scale_rows(const float * R, int64_t O, int64_t K, struct dscale sa, struct dview gw) {
    const float s = ld_scale(sa);
    const int64_t chunks = (K + 7) / 8;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < O * chunks; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = qdiv(e, chunks), k0 = (e - o * chunks) * 8;
        const float * src = R + o * K;
        float v[8];
        const bool full = k0 + 8 <= K;
        if (full && vec8_ok(src, BIE_DTYPE_F32, k0)) load8<float>(src + k0, v);
        else
            for (int i = 0; i < 8; i++) v[i] = k0 + i < K ? src[k0 + i] : 0.0f;
        for (int i = 0; i < 8; i++) v[i] = __fmul_rn(v[i], s);
        const int64_t go = o * gw.stride[0] + k0;
        if (full && vec8_ok(gw.data, gw.dtype, go)) store8(gw.data, gw.dtype, go, v);
        else
            for (int i = 0; i < 8 && k0 + i < K; i++) st_float(gw.data, gw.dtype, go + i, v[i]);
    }
}

// grad_W[o,c,i,j] = scale_a * R[o][(i*kw+j)*C + c].
__global__ void scatter_grad_w(const float * R, struct dgeom g, struct dscale sa, struct dview gw) {
    const float s = ld_scale(sa);
    const int64_t total = g.O * g.K;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = qdiv(e, g.K), k = e - o * g.K, tap = qdiv(k, g.C), c = k - tap * g.C;
        st_float(gw.data, gw.dtype, dview_off4(gw, o, c, tap / g.kw, tap % g.kw), __fmul_rn(R[e], s));
    }
}

struct dview bias_none() {
    struct dview v;
    v.data = NULL;
    return v;
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
        return bie_set_error(ctx, BIE_STATUS_DEVICE_ERROR, "cuda: cublasGemmEx (%s): %s", what, cublasGetStatusString(st));
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

} // namespace

extern "C" enum bie_status bie_cuda_layer_backward(bie_context_t * ctx, const struct bie_layer_call * c) {
    struct bie_cuda_state * st;
    BIE_TRY(bie_cuda_state_get(ctx, c->device_index, &st));
    const struct bie_geometry & geo = c->g;
    const struct dgeom g = dgeom_make(geo);
    const int64_t M = g.batch * g.OH * g.OW, O = g.O, K = g.K;
    const int64_t xnumel = g.batch * g.C * g.H * g.W;
    const int gdt = c->grad_y.dtype; // GEMM operand dtype: grad_y's (codes are exact in all three)
    const cudaDataType_t ct = gdt == BIE_DTYPE_F16 ? CUDA_R_16F : gdt == BIE_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    const size_t es = gdt == BIE_DTYPE_F32 ? 4 : 2;
    const bool want_gx = c->grad_x.data || c->grad_scale_a.data || c->grad_bias_a.data;
    const bool want_gw = c->grad_weight.data != NULL;
    if (!want_gx && !want_gw) return BIE_STATUS_OK;

    // grad_x of a stride-1 conv with several taps is computed as a convolution of grad_y (the
    // transposed conv): Gcol [x pixels][t*O + o] = grad_y at the output position that tap t of
    // the pixel feeds (0 where none), and Gx [x pixels][C] = Gcol @ Wt, Wt[t*O + o][c] = Wc[o][t*C + c].
    // Its operand (taps*O half-size elements per x pixel) is half the f32 dCol [M][K] of the
    // general path (dCol = G @ Wc, whose tap sums the STE pass gathers), and the STE pass reads
    // one f32 per element instead of taps.
    const int taps = g.kh * g.kw;
    const int64_t xpix = xnumel / g.C;
    const bool gx_conv = want_gx && !dgeom_one_position(g) && taps > 1 && g.sh == 1 && g.sw == 1;
    // The STE pass of a linear layer over contiguous features takes row slabs (ste_rows), any
    // other layer tiles of pixels x channels (ste_tiles, `groups` blocks per channel tile); both
    // leave partial channel sums of the masked gradient (a row per slab or group) for grad_bias_a.
    // Saved bits (a B1 x, with x_mask for grad_x) are read by the row passes only.
    struct dview x, xm, bias, gy;
    dview_make(&c->x, &x);
    xm.data = NULL;
    if (c->x_mask.data) dview_make(&c->x_mask, &xm);
    const bool saved = x.dtype == BIE_DTYPE_B1;
    const bool ste_linear = codes_rows_ok(x, dgeom_one_position(g), K) && (!xm.data || codes_rows_ok(xm, true, K));
    if (saved && want_gx && !ste_linear)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "x, x_mask: CUDA reads saved bits in rows that start on "
                             "whole bytes with contiguous features (as bie_tensor_make lays them out)");
    // Gradients written by their GEMMs: when grad_x (of a linear layer) or grad_weight (of a 1x1
    // kernel) has dense rows of grad_y's dtype, its GEMM writes it with the scale as alpha (the
    // f32 product scale * sum rounded once, as the reference rounds it), so neither dCol nor R
    // goes through memory in f32. grad_x goes so only when neither grad_scale_a nor grad_bias_a is
    // asked for (they sum the unrounded masked gradient); its STE mask is then applied in place by
    // the pass that writes the activation codes, which reads x anyway. A gradient that shares
    // bytes with what is read after its GEMM writes it keeps the path through the workspace.
    struct dview gxo, gwo;
    gxo.data = gwo.data = NULL;
    if (c->grad_x.data) dview_make(&c->grad_x, &gxo);
    if (want_gw) dview_make(&c->grad_weight, &gwo);
    const int64_t gx_ld = M == 1 ? K : gxo.stride[0], gw_ld = O == 1 ? K : gwo.stride[0];
    const bool gx_direct = gxo.data && !c->grad_scale_a.data && !c->grad_bias_a.data && ste_linear &&
                           gxo.dtype == gdt && (K == 1 || gxo.stride[1] == 1) && gx_ld >= K &&
                           !spans_overlap(c->grad_x, c->x) && !spans_overlap(c->grad_x, c->grad_y) &&
                           !spans_overlap(c->grad_x, c->bias_a) && !spans_overlap(c->grad_x, c->scale_a_t) &&
                           !spans_overlap(c->grad_x, c->x_mask);
    const bool gw_direct = want_gw && g.kh == 1 && g.kw == 1 && gwo.dtype == gdt && (K == 1 || gwo.stride[1] == 1) &&
                           gw_ld >= K && !spans_overlap(c->grad_weight, c->grad_y);
    size_t off = 0;
    const size_t oG = off; off = align256(off + (size_t)(M * O) * es);
    const size_t oW = off; off = align256(off + (want_gx ? (size_t)(O * K) * es : 0));
    const size_t gcol_bytes = align256((size_t)(xpix * taps * O) * es);
    const size_t gx_bytes = gx_conv ? gcol_bytes + (size_t)xnumel * 4 : want_gx && !gx_direct ? (size_t)(M * K) * 4 : 0;
    const size_t col_bytes = std::max(gx_bytes, want_gw ? (size_t)(M * K) * es : (size_t)0);
    const size_t oCol = off; off = align256(off + col_bytes); // dCol (f32) or Gcol + Gx, then Acol
    const size_t oR = off; off = align256(off + (want_gw && !gw_direct ? (size_t)(O * K) * 4 : 0));
    const size_t oScal = off; off = align256(off + 4 * sizeof(float)); // gemm_scalars
    int64_t slab = 64;
    if ((M + slab - 1) / slab > 65535) slab = ((M + 65534) / 65535 + 7) / 8 * 8;
    const int64_t slabs = (M + slab - 1) / slab;
    const int64_t ctiles = (g.C + 31) / 32, ptiles = (xnumel / g.C + 31) / 32;
    const int64_t groups = std::max<int64_t>(1, std::min<int64_t>(ptiles, 2048 / ctiles));
    const int64_t part_rows = ste_linear ? slabs : groups;
    const size_t oPart = off; off = align256(off + (c->grad_bias_a.data ? (size_t)(part_rows * g.C) * 8 : 0));
    const size_t oSum = off; off = align256(off + sizeof(double));
    // activation codes as pixel rows first (then im2col) unless x's rows are the GEMM's rows
    const bool acol_pixels = want_gw && !codes_rows_ok(x, dgeom_one_position(g), K);
    const size_t oPix = off; off = align256(off + (acol_pixels ? (size_t)xnumel * es : 0));
    uint8_t * ws;
    BIE_TRY(bie_cuda_workspace(ctx, off, (void **)&ws));
    cudaStream_t s = st->stream;

    bias.data = NULL;
    if (c->bias_a.data) dview_make(&c->bias_a, &bias);
    dview_make(&c->grad_y, &gy);
    const struct dscale sa = dscale_make(c, true), sw = dscale_make(c, false);
    float * scal = (float *)(ws + oScal);
    if ((gx_direct && sw.ptr) || (gw_direct && sa.ptr)) {
        gemm_scalars<<<1, 1, 0, s>>>(sw, sa, scal);
        LAUNCHED(ctx, "GEMM scalars");
    }
    // an f32 buffer of the workspace (ld elements), or a gradient written directly with its scale
    auto f32_dst = [](void * p, int64_t ld) { return gemm_dst{p, CUDA_R_32F, ld, 1.0f, NULL}; };
    const gemm_dst gx_dst = {gxo.data, ct, gx_ld, sw.value, sw.ptr ? scal : NULL};
    const gemm_dst gw_dst = {gwo.data, ct, gw_ld, sa.value, sa.ptr ? scal + 2 : NULL};

    // A linear grad_y with dense rows already is G; otherwise gather it.
    const bool g_direct = !c->is_conv && gy.stride[1] == 1 && (M == 1 || gy.stride[0] == O);
    const void * G = g_direct ? (const void *)gy.data : (const void *)(ws + oG);
    if (!g_direct) BIE_TRY(bie_cuda_pixel_rows(ctx, s, gy, bias_none(), 0, sa, gdt, 0, ws + oG));

    struct dgeom gs = g; // the geometry the STE pass gathers tap sums with
    if (want_gx) {
        struct dview w;
        dview_make(&c->weight, &w);
        if (gx_conv) {
            weight_codes<<<grid_for(O * K, 256), 256, 0, s>>>(w, g, (int)c->quant, sw, gdt, 1, ws + oW);
            LAUNCHED(ctx, "weight codes");
            // grad_y's pixels are the image and x's the output positions: x pixel h reads grad_y
            // row h + ph - i*dh through tap i
            struct dgeom gt = g;
            gt.C = O; gt.H = g.OH; gt.W = g.OW; gt.O = g.C; gt.OH = g.H; gt.OW = g.W; gt.K = taps * O;
            gt.ph = -g.ph; gt.pw = -g.pw; gt.dh = -g.dh; gt.dw = -g.dw;
            BIE_TRY(bie_cuda_im2col(ctx, s, G, (int)es, 0u, gt, gt.K, ws + oCol));
            // Gx (row-major [xpix][C]) = Gcol [xpix][taps*O] @ Wt: column-major Gx^T = Wt^T Gcol^T.
            BIE_TRY(gemm_ex(ctx, CUBLAS_OP_N, CUBLAS_OP_N, g.C, xpix, gt.K, ws + oW, g.C, ws + oCol, gt.K,
                            f32_dst(ws + oCol + gcol_bytes, g.C), ct, "grad_x"));
            // Gx is a dCol of one tap per pixel: a 1x1, stride-1 conv without padding
            gs.kh = gs.kw = gs.sh = gs.sw = gs.dh = gs.dw = 1;
            gs.ph = gs.pw = 0;
            gs.OH = g.H; gs.OW = g.W; gs.K = g.C;
        } else {
            if (!launch_codes_rows(w, bias_none(), g.kh == 1 && g.kw == 1, O, K, bias_none(), (int)c->quant, sw, gdt,
                                   ws + oW, s))
                weight_codes<<<grid_for(O * K, 256), 256, 0, s>>>(w, g, (int)c->quant, sw, gdt, 0, ws + oW);
            LAUNCHED(ctx, "weight codes");
            // dCol (row-major [M][K]) = G [M][O] @ Wc [O][K]: column-major dCol^T = Wc^T G^T; or
            // (gx_direct) grad_x = scale_w * dCol, masked later
            BIE_TRY(gemm_ex(ctx, CUBLAS_OP_N, CUBLAS_OP_N, K, M, O, ws + oW, K, G, O,
                            gx_direct ? gx_dst : f32_dst(ws + oCol, K), ct, "grad_x"));
        }
    }
    if (want_gx && !gx_direct) {
        double * sum = c->grad_scale_a.data ? (double *)(ws + oSum) : NULL;
        if (sum) CU_TRY(ctx, cudaMemsetAsync(sum, 0, sizeof(double), s), "cudaMemsetAsync");
        const bool want_gb = c->grad_bias_a.data != NULL;
        struct dview gb;
        if (want_gb) dview_make(&c->grad_bias_a, &gb);
        const float * dcol = (const float *)(ws + oCol + (gx_conv ? gcol_bytes : 0));
        double * colpart = want_gb ? (double *)(ws + oPart) : NULL;
        if (ste_linear) {
            const dim3 grid((unsigned)((g.C + 255) / 256), (unsigned)slabs), block(32, 8);
            const int q = (int)c->quant, wgx = c->grad_x.data != NULL;
            if (x.dtype == BIE_DTYPE_F32)
                ste_rows<float><<<grid, block, 0, s>>>(x, xm, bias, M, g.C, slab, q, sa, sw, dcol, gxo, wgx, colpart, sum);
            else if (x.dtype == BIE_DTYPE_F16)
                ste_rows<__half><<<grid, block, 0, s>>>(x, xm, bias, M, g.C, slab, q, sa, sw, dcol, gxo, wgx, colpart, sum);
            else if (x.dtype == BIE_DTYPE_BF16)
                ste_rows<__nv_bfloat16><<<grid, block, 0, s>>>(x, xm, bias, M, g.C, slab, q, sa, sw, dcol, gxo, wgx, colpart,
                                                               sum);
            else
                ste_rows<sbits><<<grid, block, 0, s>>>(x, xm, bias, M, g.C, slab, q, sa, sw, dcol, gxo, wgx, colpart, sum);
            LAUNCHED(ctx, "STE pass (rows)");
        } else {
            const unsigned grid = (unsigned)(groups * ctiles);
            const int wgx = c->grad_x.data != NULL, ap = bie_cuda_along_pixels(x);
            const int q = (int)c->quant;
            if (x.dtype == BIE_DTYPE_F32)
                launch_ste_tiles<float>(grid, s, x, bias, gs, q, sa, sw, dcol, gxo, wgx, ap, colpart, sum);
            else if (x.dtype == BIE_DTYPE_F16)
                launch_ste_tiles<__half>(grid, s, x, bias, gs, q, sa, sw, dcol, gxo, wgx, ap, colpart, sum);
            else if (x.dtype == BIE_DTYPE_BF16)
                launch_ste_tiles<__nv_bfloat16>(grid, s, x, bias, gs, q, sa, sw, dcol, gxo, wgx, ap, colpart, sum);
            else
                launch_ste_tiles<void>(grid, s, x, bias, gs, q, sa, sw, dcol, gxo, wgx, ap, colpart, sum);
            LAUNCHED(ctx, "STE pass");
        }
        if (want_gb) {
            colpart_sums<<<(unsigned)ctiles, dim3(32, 32), 0, s>>>(colpart, part_rows, g.C, gb);
            LAUNCHED(ctx, "grad_bias_a");
        }
        if (sum) {
            struct dview gsa;
            dview_make(&c->grad_scale_a, &gsa);
            gsa.stride[3] = 0;
            const double denom = c->quant == BIE_QUANT_BINARY ? sqrt((double)xnumel)
                                                               : sqrt((double)xnumel * bie_quant_hi(c->quant));
            finish_scale_grad<<<1, 1, 0, s>>>(sum, denom, gsa);
            LAUNCHED(ctx, "grad_scale_a");
        }
    }
    // the STE mask of a grad_x that its GEMM wrote: applied by the pass of the activation codes
    void * const mask_gx = gx_direct ? gxo.data : NULL;
    if (want_gw) {
        // a linear layer: row m of Acol is row m of x
        if (acol_pixels) {
            BIE_TRY(bie_cuda_pixel_rows(ctx, s, x, bias, (int)c->quant, sa, gdt, 0, ws + oPix));
            const float pad = c->quant != BIE_QUANT_BINARY ? 0.0f
                              : g.pad_value == BIE_PAD_PLUS_ONE ? 1.0f : g.pad_value == BIE_PAD_MINUS_ONE ? -1.0f : 0.0f;
            BIE_TRY(bie_cuda_im2col(ctx, s, ws + oPix, (int)es, element_bits(pad, gdt), g, K, ws + oCol));
        } else {
            launch_codes_rows(x, xm, true, M, K, bias, (int)c->quant, sa, gdt, ws + oCol, s, mask_gx, gx_ld);
            LAUNCHED(ctx, mask_gx ? "activation codes and STE mask" : "activation codes");
        }
        // R (row-major [O][K]) = G^T @ Acol: column-major R^T [K][O] = Acol^T [K][M] . G [M][O];
        // grad_W = scale_a * R, written by the GEMM itself when gw_direct
        BIE_TRY(gemm_ex(ctx, CUBLAS_OP_N, CUBLAS_OP_T, K, O, M, ws + oCol, K, G, O,
                        gw_direct ? gw_dst : f32_dst(ws + oR, K), ct, "grad_weight"));
        if (!gw_direct) {
            if (g.kh == 1 && g.kw == 1 && (g.C == 1 || gwo.stride[1] == 1) &&
                bie_dtype_is_float((enum bie_dtype)gwo.dtype))
                scale_rows<<<grid_for(O * ((K + 7) / 8), 256), 256, 0, s>>>((const float *)(ws + oR), O, K, sa, gwo);
            else
                scatter_grad_w<<<grid_for(O * K, 256), 256, 0, s>>>((const float *)(ws + oR), g, sa, gwo);
            LAUNCHED(ctx, "scatter grad_weight");
        }
    } else if (mask_gx) {
        launch_codes_rows(x, xm, true, M, K, bias, (int)c->quant, sa, gdt, NULL, s, mask_gx, gx_ld);
        LAUNCHED(ctx, "STE mask");
    }
    return BIE_STATUS_OK;
}
