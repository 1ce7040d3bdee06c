// SPDX-License-Identifier: Apache-2.0
// cuda-layout.cu: layer tensors moved into the dense layouts of the implicit-GEMM convs, with
// coalesced reads and writes whatever the layout of the source (NCHW, channels-last, strided):
//   pixel rows  P[p][c] = f(t[n, c, h, w]),  p = (n*H + h)*W + w
//               f = the value itself, or the activation code of x' = f32(x) + f32(bias_a[c])
//               (x first clamped to +-x_clamp when the scale carries one):
//               binary +-1 (x' >= 0 -> +1, NaN -> -1), n-bit clamp(rne(x'/scale_a), lo, hi)
//   im2col      A[m][k] = P[pixel that tap t of output position m reads][c],  k = t*C + c < K,
//               the pad value where the tap lies outside the image, 0 for K <= k < ld
#include <type_traits>

#include "cuda-impl.cuh"

namespace {

constexpr int TILE = 32; // a pixel_rows block moves 32 pixels x 32 channels

// A kernel's activation quantisation: its quant (0: none, the values pass as they are), scale_a
// (read once, only when there is a quant) and the code range. code(x') is the activation code:
// binary +-1 with x' >= 0 -> +1 (NaN -> -1), n-bit clamp(rne(x'/sc)).
struct act_quant {
    int quant;
    float sc, inv; // (inv: the reciprocal quant_code_r takes)
    float t;       // x's clamp bound (clamp_bound), applied before bias_a
    int lo, hi;
    __device__ __forceinline__ int code(float v) const {
        return quant == BIE_QUANT_BINARY ? (v >= 0.0f ? 1 : -1) : quant_code_r(v, sc, inv, lo, hi);
    }
};
__device__ __forceinline__ act_quant act_quant_of(int quant, struct dscale s) {
    const float sc = quant ? ld_scale(s) : 1.0f;
    return act_quant{quant, sc, __frcp_rn(sc), clamp_bound(s), qlo(quant), qhi(quant)};
}

// Offset of element (p, c) in the rows: p * C + c when they are dense, else sample n's rows start
// out_ld elements after sample n-1's.
__device__ __forceinline__ int64_t row_off(int64_t p, int64_t c, int64_t HW, int64_t C, int64_t out_ld) {
    if (out_ld == HW * C) return p * C + c; // no division per element
    const int64_t n = qdiv(p, HW);
    return n * out_ld + (p - n * HW) * C + c;
}

// The tiles of PT pixels x TILE channels over P pixels (the whole batch) and C channels, strided
// over the grid's blocks: body(p0, c0) with each tile's first pixel and channel.
template <int PT, typename Body> __device__ __forceinline__ void for_tiles(int64_t P, int64_t C, Body body) {
    const int64_t ptiles = (P + PT - 1) / PT, tiles = ptiles * ((C + TILE - 1) / TILE);
    for (int64_t b = blockIdx.x; b < tiles; b += gridDim.x) body((b % ptiles) * PT, (b / ptiles) * TILE);
}

// Block (32, 8), a tile per iteration: pixels p0 .. p0+31 (counted over the whole batch) x
// channels c0 .. c0+31. The tile is read along the pixels when they are contiguous in t
// (along_pixels: NCHW planes; a lane's pixel offset is worked out once per tile), else along the
// channels (a warp's pixel is the same for all lanes), and written along the channels; sample n's
// rows start at out + n * out_ld.
template <typename T>
__global__ void pixel_rows(struct dview t, struct dview bias, int64_t HW, int64_t W, int64_t C, int quant,
                           struct dscale s, int along_pixels, int64_t out_ld, T * out) {
    __shared__ float tile[TILE][TILE + 1]; // [pixel][channel]
    const act_quant aq = act_quant_of(quant, s);
    const int64_t P = t.shape[0] * HW;
    const int lane = threadIdx.x, ty = threadIdx.y;
    for_tiles<TILE>(P, C, [&](int64_t p0, int64_t c0) {
        int64_t lane_off = 0; // along_pixels: offset of pixel p0 + lane at channel 0
        if (along_pixels && p0 + lane < P) {
            const int64_t p = p0 + lane, n = qdiv(p, HW), q = p - n * HW, h = qdiv(q, W);
            lane_off = n * t.stride[0] + h * t.stride[2] + (q - h * W) * t.stride[3];
        }
        float v[TILE / 8];
#pragma unroll
        for (int k = 0; k < TILE / 8; k++) { // the loads first, all in flight at once
            const int r = ty + 8 * k, pi = along_pixels ? lane : r, ci = along_pixels ? r : lane;
            const int64_t p = p0 + pi, c = c0 + ci;
            v[k] = 0.0f;
            if (p >= P || c >= C) continue;
            int64_t off;
            if (along_pixels) {
                off = lane_off + c * t.stride[1];
            } else {
                const int64_t n = qdiv(p, HW), q = p - n * HW, h = qdiv(q, W);
                off = n * t.stride[0] + c * t.stride[1] + h * t.stride[2] + (q - h * W) * t.stride[3];
            }
            v[k] = ld_float(t.data, t.dtype, off);
            if (quant) v[k] = clamp_in(v[k], aq.t);
            if (quant && bias.data) v[k] = __fadd_rn(v[k], ld_float(bias.data, bias.dtype, c * bias.stride[3]));
        }
#pragma unroll
        for (int k = 0; k < TILE / 8; k++) {
            const int r = ty + 8 * k, pi = along_pixels ? lane : r, ci = along_pixels ? r : lane;
            float q = v[k];
            if (quant) q = aq.code(q);
            tile[pi][ci] = q;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE / 8; k++) {
            const int r = ty + 8 * k;
            const int64_t p = p0 + r, c = c0 + lane;
            if (p >= P || c >= C) continue;
            const int64_t o = row_off(p, c, HW, C, out_ld);
            out[o] = from_f32<T>(tile[r][lane]);
        }
        __syncthreads();
    });
}

// The activation codes of a dense channels-last t (element (n, c, h, w) at ((n*H + h)*W + w)*C + c,
// C % 8 == 0, 16-byte aligned), which lies in pixel-row order already: groups of 8 elements, read
// as one or two 16-byte vectors and written as 8 bytes, PIX_U groups a thread with their loads
// issued first. BIAS: bias (C <= PIX_BIAS_C) is staged in shared memory as f32 first; CLAMP: x is
// clamped first (the scale's clamp). Same values as pixel_rows.
constexpr int PIX_U = 2;
constexpr int PIX_BIAS_C = 4096;
template <typename TI, bool BIAS, bool CLAMP>
__global__ void pixel_codes_nhwc(const TI * t, struct dview bias, int64_t n8, int64_t C, int quant, struct dscale s,
                                 int8_t * out) {
    __shared__ __align__(16) float sb[BIAS ? PIX_BIAS_C : 4];
    if (BIAS) {
        for (int c = threadIdx.x; c < C; c += blockDim.x) sb[c] = ld_float(bias.data, bias.dtype, c * bias.stride[3]);
        __syncthreads();
    }
    const act_quant aq = act_quant_of(quant, s);
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    const int64_t cmask = (C & (C - 1)) == 0 ? C - 1 : 0; // (a channel index without a division)
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += PIX_U * step) {
        raw8<TI> r[PIX_U];
#pragma unroll
        for (int u = 0; u < PIX_U; u++)
            if (i + u * step < n8) r[u] = raw8_load<TI>(t + 8 * (i + u * step));
#pragma unroll
        for (int u = 0; u < PIX_U; u++) {
            const int64_t g = i + u * step;
            if (g >= n8) break;
            float v[8];
            raw8_floats<TI>(r[u], v);
            if (CLAMP)
#pragma unroll
                for (int k = 0; k < 8; k++) v[k] = clamp_in(v[k], aq.t);
            if (BIAS) {
                const float4 * b = (const float4 *)(sb + (cmask ? (8 * g) & cmask : qmod(8 * g, C)));
                const float4 b0 = b[0], b1 = b[1];
                const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
                for (int k = 0; k < 8; k++) v[k] = __fadd_rn(v[k], bv[k]);
            }
            uint2 w;
            if (quant == BIE_QUANT_BINARY) {
                uint32_t u[2] = {0, 0};
#pragma unroll
                for (int k = 0; k < 8; k++) u[k / 4] |= (uint32_t)(uint8_t)(int8_t)aq.code(v[k]) << (8 * (k % 4));
                w = make_uint2(u[0], u[1]);
            } else {
                w = quant_codes8_r(v, aq.sc, aq.inv, aq.lo, aq.hi);
            }
            *(uint2 *)(out + 8 * g) = w;
        }
    }
}
template <typename TI>
void launch_pixel_codes(const TI * t, const struct dview & bias, int64_t n8, int64_t C, int quant, struct dscale s,
                        int8_t * out, unsigned grid, cudaStream_t st) {
    auto kern = s.clamp > 0.0f ? (bias.data ? pixel_codes_nhwc<TI, true, true> : pixel_codes_nhwc<TI, false, true>)
                               : (bias.data ? pixel_codes_nhwc<TI, true, false> : pixel_codes_nhwc<TI, false, false>);
    kern<<<grid, 256, 0, st>>>(t, bias, n8, C, quant, s, out);
}

// Two f16 / bf16 / f32 elements at element offset off (even) of p, as f32.
__device__ __forceinline__ float2 ld_pair(const char * p, int dtype, int64_t off) {
    if (dtype == BIE_DTYPE_F32) return *(const float2 *)((const float *)p + off);
    const uint32_t u = *(const uint32_t *)((const uint16_t *)p + off);
    if (dtype == BIE_DTYPE_F16) return __half22float2(*(const __half2 *)&u);
    return __bfloat1622float2(*(const __nv_bfloat162 *)&u);
}

template <typename T> struct pair_of;
template <> struct pair_of<float> { typedef float2 type; };
template <> struct pair_of<__half> { typedef __half2 type; };
template <> struct pair_of<__nv_bfloat16> { typedef __nv_bfloat162 type; };
template <> struct pair_of<int8_t> { typedef char2 type; };
template <typename T> __device__ __forceinline__ void st_pair(T * p, float a, float b) {
    typename pair_of<T>::type v;
    T * e = (T *)&v;
    e[0] = from_f32<T>(a);
    e[1] = from_f32<T>(b);
    *(typename pair_of<T>::type *)p = v;
}

// pixel_rows for NCHW planes of an even number of f16 / bf16 / f32 pixels, with even sample and
// channel strides and a base aligned to two elements (the caller checks): tiles of 64 pixels x 32
// channels, each lane reading two neighbouring pixels of a channel at once (they lie in one
// sample, since HW is even) and writing two neighbouring channels of a pixel at once where C is
// even and the rows and base are aligned for it (pair_out), so that a warp moves 128-byte lines instead of
// 64-byte ones. Same values as pixel_rows.
template <typename T>
__global__ void pixel_rows_pairs(struct dview t, struct dview bias, int64_t HW, int64_t C, int quant, struct dscale s,
                                 int64_t out_ld, int pair_out, T * out) {
    constexpr int PT = 2 * TILE;         // pixels per tile
    __shared__ float tile[PT][TILE + 1]; // [pixel][channel]
    const act_quant aq = act_quant_of(quant, s);
    const int64_t P = t.shape[0] * HW;
    const int lane = threadIdx.x, ty = threadIdx.y;
    for_tiles<PT>(P, C, [&](int64_t p0, int64_t c0) {
        const int64_t pl = p0 + 2 * lane; // this lane's first pixel (even, so pl + 1 is in the same sample)
        int64_t lane_off = 0;
        if (pl < P) {
            const int64_t n = qdiv(pl, HW);
            lane_off = n * t.stride[0] + (pl - n * HW);
        }
        float2 v[TILE / 8];
#pragma unroll
        for (int k = 0; k < TILE / 8; k++) { // the loads first, all in flight at once
            const int64_t c = c0 + ty + 8 * k;
            v[k] = make_float2(0.0f, 0.0f);
            if (pl >= P || c >= C) continue;
            const int64_t off = lane_off + c * t.stride[1];
            if (pl + 1 < P) v[k] = ld_pair(t.data, t.dtype, off);
            else v[k].x = ld_float(t.data, t.dtype, off);
        }
#pragma unroll
        for (int k = 0; k < TILE / 8; k++) {
            const int r = ty + 8 * k;
            float a = v[k].x, q = v[k].y;
            if (quant) {
                const int64_t c = c0 + r;
                a = clamp_in(a, aq.t);
                q = clamp_in(q, aq.t);
                if (bias.data && c < C) {
                    const float bv = ld_float(bias.data, bias.dtype, c * bias.stride[3]);
                    a = __fadd_rn(a, bv);
                    q = __fadd_rn(q, bv);
                }
                a = aq.code(a);
                q = aq.code(q);
            }
            tile[2 * lane][r] = a;
            tile[2 * lane + 1][r] = q;
        }
        __syncthreads();
        // lane j % 16 writes channels c0 + 2(j % 16) and the next one of pixel row 2ty + j/16 + 16k
        const int cj = 2 * (lane & 15);
        const int64_t c = c0 + cj;
#pragma unroll
        for (int k = 0; k < PT / 16; k++) {
            const int r = 2 * ty + (lane >> 4) + 16 * k;
            const int64_t p = p0 + r;
            if (p >= P || c >= C) continue;
            const int64_t o = row_off(p, c, HW, C, out_ld);
            if (pair_out) {
                st_pair<T>(out + o, tile[r][cj], tile[r][cj + 1]);
            } else {
                out[o] = from_f32<T>(tile[r][cj]);
                if (c + 1 < C) out[o + 1] = from_f32<T>(tile[r][cj + 1]);
            }
        }
        __syncthreads();
    });
}

// pixel_rows of 2-byte values as they are (no quant, the output of t's dtype), from dense NCHW
// planes into rows of C % 8 == 0 channels, both 16-byte aligned: a block moves a tile of 64
// channels x 128 pixels through shared memory, reading each channel's pixels V at a time (V = 8:
// 16-byte loads, HW % 8 == 0; V = 4: 8-byte loads, HW % 4 == 0; either way a load stays inside one
// sample) and writing each pixel's channels 8 at a time (16-byte stores). A channel's 16-byte
// chunks of 8 pixels sit in shared memory at chunk positions XORed with the channel's eighth
// within the tile (c / 8 % 8), so that the eight channels a write gathers, and the chunks a load
// puts, fall in different banks. Same values as pixel_rows.
constexpr int CP_C = 64, CP_P = 128, CP_THREADS = 256;

template <int V>
__global__ void __launch_bounds__(CP_THREADS)
    pixel_rows_copy16(const uint16_t * __restrict__ t, int64_t HW, int64_t C, int64_t sn, int64_t sc, int64_t P,
                      int64_t out_ld, uint16_t * __restrict__ out) {
    using vec = typename std::conditional<V == 8, uint4, uint2>::type;
    constexpr int PER_ROW = CP_P / V;                      // loads per channel of the tile
    constexpr int LOADS = CP_C * PER_ROW / CP_THREADS;     // loads per thread
    constexpr int STORES = CP_P * (CP_C / 8) / CP_THREADS; // 16-byte stores per thread
    __shared__ __align__(16) uint16_t tile[CP_C][CP_P];    // [channel][swizzled pixel]
    const int64_t ptiles = (P + CP_P - 1) / CP_P;
    const int64_t p0 = (blockIdx.x % ptiles) * CP_P, c0 = (blockIdx.x / ptiles) * CP_C;
    vec v[LOADS];
#pragma unroll
    for (int k = 0; k < LOADS; k++) { // the loads first, all in flight at once
        const int i = threadIdx.x + CP_THREADS * k, r = i / PER_ROW;
        const int64_t p = p0 + (i % PER_ROW) * V, c = c0 + r;
        v[k] = vec{};
        if (p < P && c < C) {
            const int64_t n = qdiv(p, HW);
            v[k] = *(const vec *)(t + n * sn + c * sc + (p - n * HW));
        }
    }
#pragma unroll
    for (int k = 0; k < LOADS; k++) {
        const int i = threadIdx.x + CP_THREADS * k, r = i / PER_ROW, e = (i % PER_ROW) * V;
        const int pos = (((e >> 3) ^ (r >> 3)) << 3) | (e & 7);
        *(vec *)&tile[r][pos] = v[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < STORES; k++) {
        const int i = threadIdx.x + CP_THREADS * k, pl = i >> 3, oc = i & 7;
        const int64_t p = p0 + pl, c = c0 + 8 * oc;
        if (p >= P || c >= C) continue;
        const int pos = (((pl >> 3) ^ oc) << 3) | (pl & 7);
        uint32_t w[4];
#pragma unroll
        for (int j = 0; j < 4; j++) w[j] = tile[8 * oc + 2 * j][pos] | (uint32_t)tile[8 * oc + 2 * j + 1][pos] << 16;
        *(uint4 *)(out + row_off(p, c, HW, C, out_ld)) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

// The blocks of pixel_rows_copy16 for P pixels of C channels (0: nothing to copy).
static int64_t copy16_blocks(int64_t P, int64_t C) { return (P + CP_P - 1) / CP_P * ((C + CP_C - 1) / CP_C); }

template <int V>
void launch_pixel_rows_copy16(const struct dview & t, int64_t HW, int64_t C, int64_t sn, int64_t out_ld, void * out,
                              cudaStream_t s) {
    const int64_t P = t.shape[0] * HW, blocks = copy16_blocks(P, C);
    if (blocks == 0) return;
    pixel_rows_copy16<V><<<(unsigned)blocks, CP_THREADS, 0, s>>>((const uint16_t *)t.data, HW, C, sn, t.stride[1], P,
                                                                 out_ld, (uint16_t *)out);
}

// A warp per row of A, units of U (a whole number of units per pixel row of P, cu, and per row of
// A, ldu) one per lane; the row's (n, oh, ow) is worked out once.
template <typename U>
__global__ void im2col_units(const U * P, struct dgeom g, int64_t cu, int64_t ldu, int64_t rows, U pad, U * out) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    const int64_t filled = (int64_t)g.kh * g.kw * cu;
    U zero;
    memset(&zero, 0, sizeof(zero));
    for (int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; row < rows; row += warps) {
        const int64_t mq = qdiv(row, g.OW), ow = row - mq * g.OW, n = qdiv(mq, g.OH), oh = mq - n * g.OH;
        U * dst = out + row * ldu;
        for (int64_t u = lane; u < ldu; u += 32) {
            U v = zero;
            if (u < filled) {
                const int64_t tap = qdiv(u, cu), cc = u - tap * cu;
                const int i = (int)tap / g.kw, j = (int)tap - i * g.kw;
                const int64_t h = oh * g.sh - g.ph + (int64_t)i * g.dh, w = ow * g.sw - g.pw + (int64_t)j * g.dw;
                v = h >= 0 && h < g.H && w >= 0 && w < g.W ? P[((n * g.H + h) * g.W + w) * cu + cc] : pad;
            }
            dst[u] = v;
        }
    }
}

template <typename U>
void launch_im2col(const void * P, const struct dgeom & g, int64_t cu, int64_t ldu, int64_t rows,
                   const unsigned char * pad16, void * out, cudaStream_t s) {
    U pad;
    memcpy(&pad, pad16, sizeof(U));
    im2col_units<U><<<grid_for(rows, 8), 256, 0, s>>>((const U *)P, g, cu, ldu, rows, pad, (U *)out);
}

} // namespace

bool bie_cuda_along_pixels(const struct dview & t) {
    const int64_t step = t.shape[3] > 1 ? t.stride[3] : t.shape[2] > 1 ? t.stride[2] : t.stride[0];
    return step == 1;
}

enum bie_status bie_cuda_pixel_rows(bie_context_t * ctx, cudaStream_t s, const struct dview & t,
                                    const struct dview & bias, int quant, struct dscale sc, int out_dtype,
                                    int64_t out_ld, void * out) {
    const int64_t HW = t.shape[2] * t.shape[3], W = t.shape[3], C = t.shape[1];
    if (out_ld == 0) out_ld = HW * C;
    const int64_t tiles = (t.shape[0] * HW + TILE - 1) / TILE * ((C + TILE - 1) / TILE);
    const unsigned grid = (unsigned)(tiles < 16384 ? (tiles < 1 ? 1 : tiles) : 16384);
    const dim3 block(32, 8);
    const int ap = bie_cuda_along_pixels(t);
    const int es = bie_dtype_is_float((enum bie_dtype)t.dtype) ? bie_dtype_bits((enum bie_dtype)t.dtype) / 8 : 0;
    const bool dense_planes = t.stride[3] == 1 && (t.shape[2] == 1 || t.stride[2] == t.shape[3]);
    const int64_t N = t.shape[0], H = t.shape[2];
    const bool dense_nhwc = t.stride[1] == 1 && (W == 1 || t.stride[3] == C) && (H == 1 || t.stride[2] == W * C) &&
                            (N == 1 || t.stride[0] == HW * C);
    if (quant && out_dtype == BIE_DTYPE_I8 && es && dense_nhwc && out_ld == HW * C && C % 8 == 0 &&
        (!bias.data || C <= PIX_BIAS_C) && (uintptr_t)t.data % 16 == 0 && (uintptr_t)out % 8 == 0) {
        const int64_t n8 = N * HW * C / 8;
        const unsigned g8 = grid_for((n8 + PIX_U - 1) / PIX_U, 256);
        if (t.dtype == BIE_DTYPE_F16)
            launch_pixel_codes((const __half *)t.data, bias, n8, C, quant, sc, (int8_t *)out, g8, s);
        else if (t.dtype == BIE_DTYPE_BF16)
            launch_pixel_codes((const __nv_bfloat16 *)t.data, bias, n8, C, quant, sc, (int8_t *)out, g8, s);
        else launch_pixel_codes((const float *)t.data, bias, n8, C, quant, sc, (int8_t *)out, g8, s);
        return bie_cuda_check_launch(ctx, "pixel codes (channels-last)");
    }
    const int64_t sn = N > 1 ? t.stride[0] : 0;
    if (!quant && es == 2 && out_dtype == t.dtype && dense_planes && C % 8 == 0 && HW % 4 == 0 && sn % 4 == 0 &&
        t.stride[1] % 4 == 0 && out_ld % 8 == 0 && (uintptr_t)t.data % 8 == 0 && (uintptr_t)out % 16 == 0 &&
        copy16_blocks(N * HW, C) <= INT32_MAX) {
        if (HW % 8 == 0 && sn % 8 == 0 && t.stride[1] % 8 == 0 && (uintptr_t)t.data % 16 == 0)
            launch_pixel_rows_copy16<8>(t, HW, C, sn, out_ld, out, s);
        else launch_pixel_rows_copy16<4>(t, HW, C, sn, out_ld, out, s);
        return bie_cuda_check_launch(ctx, "pixel rows (16-byte copy)");
    }
    if (es && dense_planes && HW % 2 == 0 && t.stride[0] % 2 == 0 && t.stride[1] % 2 == 0 &&
        (uintptr_t)t.data % (2 * es) == 0) {
        const int os = bie_dtype_bits((enum bie_dtype)out_dtype) / 8;
        const int po = C % 2 == 0 && out_ld % 2 == 0 && (uintptr_t)out % (2 * os) == 0;
        const int64_t ptiles2 = (t.shape[0] * HW + 2 * TILE - 1) / (2 * TILE) * ((C + TILE - 1) / TILE);
        const unsigned g2 = (unsigned)(ptiles2 < 16384 ? (ptiles2 < 1 ? 1 : ptiles2) : 16384);
        switch (out_dtype) {
        case BIE_DTYPE_F32:
            pixel_rows_pairs<float><<<g2, block, 0, s>>>(t, bias, HW, C, quant, sc, out_ld, po, (float *)out);
            break;
        case BIE_DTYPE_F16:
            pixel_rows_pairs<__half><<<g2, block, 0, s>>>(t, bias, HW, C, quant, sc, out_ld, po, (__half *)out);
            break;
        case BIE_DTYPE_BF16:
            pixel_rows_pairs<__nv_bfloat16>
                <<<g2, block, 0, s>>>(t, bias, HW, C, quant, sc, out_ld, po, (__nv_bfloat16 *)out);
            break;
        case BIE_DTYPE_I8:
            pixel_rows_pairs<int8_t><<<g2, block, 0, s>>>(t, bias, HW, C, quant, sc, out_ld, po, (int8_t *)out);
            break;
        default: return bie_set_error(ctx, BIE_STATUS_INTERNAL, "pixel rows: output dtype %d", out_dtype);
        }
        return bie_cuda_check_launch(ctx, "pixel rows (pairs)");
    }
    switch (out_dtype) {
    case BIE_DTYPE_F32:
        pixel_rows<float><<<grid, block, 0, s>>>(t, bias, HW, W, C, quant, sc, ap, out_ld, (float *)out);
        break;
    case BIE_DTYPE_F16:
        pixel_rows<__half><<<grid, block, 0, s>>>(t, bias, HW, W, C, quant, sc, ap, out_ld, (__half *)out);
        break;
    case BIE_DTYPE_BF16:
        pixel_rows<__nv_bfloat16>
            <<<grid, block, 0, s>>>(t, bias, HW, W, C, quant, sc, ap, out_ld, (__nv_bfloat16 *)out);
        break;
    case BIE_DTYPE_I8:
        pixel_rows<int8_t><<<grid, block, 0, s>>>(t, bias, HW, W, C, quant, sc, ap, out_ld, (int8_t *)out);
        break;
    default: return bie_set_error(ctx, BIE_STATUS_INTERNAL, "pixel rows: output dtype %d", out_dtype);
    }
    return bie_cuda_check_launch(ctx, "pixel rows");
}

enum bie_status bie_cuda_im2col(bie_context_t * ctx, cudaStream_t s, const void * P, int es, uint32_t pad_bits,
                                const struct dgeom & g, int64_t ld, void * out) {
    // the widest unit (16, 8, 4, 2 or 1 bytes) that divides a pixel row, a row of A and both addresses
    const int64_t pb = g.C * es, rb = ld * es;
    const uintptr_t addr = (uintptr_t)P | (uintptr_t)out;
    int ub = 16;
    while (ub > 1 && (pb % ub || rb % ub || addr % ub)) ub /= 2;
    if (ub < es) ub = es;
    unsigned char pad16[16];
    for (int i = 0; i < 16; i++) pad16[i] = (unsigned char)(pad_bits >> (8 * (i % es)));
    const int64_t cu = pb / ub, ldu = rb / ub, rows = g.batch * g.OH * g.OW;
    switch (ub) {
    case 16: launch_im2col<uint4>(P, g, cu, ldu, rows, pad16, out, s); break;
    case 8: launch_im2col<uint2>(P, g, cu, ldu, rows, pad16, out, s); break;
    case 4: launch_im2col<uint32_t>(P, g, cu, ldu, rows, pad16, out, s); break;
    case 2: launch_im2col<uint16_t>(P, g, cu, ldu, rows, pad16, out, s); break;
    default: launch_im2col<uint8_t>(P, g, cu, ldu, rows, pad16, out, s); break;
    }
    return bie_cuda_check_launch(ctx, "im2col");
}
