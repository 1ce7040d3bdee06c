// SPDX-License-Identifier: Apache-2.0
// cuda-matmul.cu: the batched matmul of two activations on CUDA tensors. Batch b is the linear layer
// whose input is x[b] and whose weight is y[b] (bie_matmul_layer_call), so each batch runs the
// layers' forward: x[b] and y[b] packed to bit rows (binary) or int8 code rows by the layers'
// packers, then the tensor-core GEMM (binary: AND-popcount, on Hopper through wgmma) with the scale
// epilogue fused, writing out[b] in its dtype. The backward runs each operand's side as that
// layer's backward (cuBLAS GEMMs of grad_out with the other operand's codes, then the fused STE
// pass), the y side with grad_out[b] transposed. Each side's clip gradient is the batches' partial
// sums (each over its batch's numel) added in double in batch order and divided by sqrt(B), from
// partials kept in the context's aux arena, which the layer calls (they use the workspace) leave
// alone. Nothing synchronises the host. Forwards of many small batches run one kernel instead, which
// stages both operands' words (sign bits or int8 codes) in shared memory and takes their products
// (forward_small_batches). Binary forwards of several larger batches pack each operand's sign bits
// for all batches in one pass, so that the layer calls read bits (forward_packed_batches).
#include "cuda-forward.cuh"

#include <math.h>

extern "C" {
enum bie_status bie_cuda_layer_forward(bie_context_t * ctx, const struct bie_layer_call * call);
enum bie_status bie_cuda_layer_backward(bie_context_t * ctx, const struct bie_layer_call * call);
}

namespace {

// out (a scalar of F32, F16 or BF16) = sum(part[0 .. n)) / sqrt(n), the sum in double in a fixed
// order: lane j adds elements j, j + 32, ... and the lanes meet in a fixed tree.
__global__ void clip_total(const float * part, int64_t n, struct dview out) {
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += 32) s += (double)part[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if (threadIdx.x == 0) st_float(out.data, out.dtype, 0, (float)(s / sqrt((double)n)));
}

// Many small products (attention's heads): one launch for all batches instead of a layer call per
// batch. A block takes mt rows of x[b] and nt rows of y[b] and stages them in shared memory as
// operand words (padding past K: 0 in both), rows ld words apart (ld odd: lanes on different rows
// read different banks):
//   binary: bit j of word w = 1{v >= 0} of element 32w + j (NaN -> 0, i.e. -1);
//   n-bit : byte j of word w = the int8 code clamp(rne(v/clip), lo, hi) of element 4w + j.
// A thread stages E elements (a byte of bits, or a word of codes): with one 16- or 8-byte load
// when the operand's rows are dense 16-bit values on whole E-element units (vec), else element by
// element. Then each warp takes MM_RG rows of x at a time, each lane a column of y and its MM_RG
// outputs:
//   out[b, m, n] = acc * (x_clip * y_clip), acc = sum_k a*b: binary K - 2 popc(a_bits ^ b_bits)
//   (the padding bits agree), n-bit the dp4a sums of the code words; exact in int32. An I32 out
//   takes acc.
constexpr int MM_SMEM_WORDS = 12288; // operand words a block stages (48 KB)
constexpr int MM_MAX_KW = 1024;      // the longest rows it takes (the block still holds 11 of them)
constexpr int MM_RG = 4;             // x rows a warp takes together

template <bool BINARY> struct mm_unit {
    static constexpr int E = BINARY ? 8 : 4; // elements a thread stages at once
};

// The unit of the first n of E values v (n <= 0: padding, 0): their sign bits, bit j for value j
// (binary), or their int8 codes, byte j for value j (n-bit).
template <bool BINARY> __device__ __forceinline__ uint32_t unit_bits(const float * v, int n, float s, int lo, int hi) {
    uint32_t u = 0;
#pragma unroll
    for (int j = 0; j < mm_unit<BINARY>::E; j++) {
        if (j >= n) break;
        if (BINARY) u |= (v[j] >= 0.0f ? 1u : 0u) << j;
        else u |= (uint32_t)(uint8_t)(int8_t)quant_code(v[j], s, lo, hi) << (8 * j);
    }
    return u;
}

// Rows r0 .. r0 + rows of batch b of the [B, R, K] operand v into s, as the header says.
template <bool BINARY>
__device__ void stage_rows(const struct dview & v, int64_t b, int64_t r0, int rows, int64_t K, int kw, int ld, bool vec,
                           float clip, int lo, int hi, uint32_t * s) {
    constexpr int E = mm_unit<BINARY>::E;
    const int units = BINARY ? 4 * kw : kw; // per row
    for (int i = threadIdx.x; i < rows * units; i += blockDim.x) {
        const int r = i / units, u = i - r * units;
        const int64_t k0 = (int64_t)u * E, base = b * v.stride[1] + (r0 + r) * v.stride[2];
        const int n = K - k0 < E ? (int)(K - k0) : E; // (<= 0: padding)
        float f[E];
        if (vec && n == E) {
            const char * p = v.data + 2 * (base + k0);
            uint16_t h[E];
            if (E == 8) *(uint4 *)h = *(const uint4 *)p;
            else *(uint2 *)h = *(const uint2 *)p;
#pragma unroll
            for (int j = 0; j < E; j++)
                f[j] = v.dtype == BIE_DTYPE_F16 ? __half2float(__ushort_as_half(h[j]))
                                                : __bfloat162float(__ushort_as_bfloat16(h[j]));
        } else {
            for (int j = 0; j < n; j++) f[j] = ld_float(v.data, v.dtype, base + (k0 + j) * v.stride[3]);
        }
        const uint32_t bits = unit_bits<BINARY>(f, n, clip, lo, hi);
        if (BINARY) ((uint8_t *)(s + r * ld))[u] = (uint8_t)bits;
        else s[r * ld + u] = bits;
    }
}

template <bool BINARY>
__global__ void __launch_bounds__(256)
    small_products(struct dview x, struct dview y, int64_t B, int64_t M, int64_t N, int64_t K, int kw, int mt, int nt,
                   bool xvec, bool yvec, struct dscale sa, struct dscale sb, int quant, struct dview out) {
    extern __shared__ uint32_t sm[];
    const int ld = kw | 1;
    uint32_t *xs = sm, *ys = sm + mt * ld;
    const float ca = ld_scale(sa), cb = ld_scale(sb), s = __fmul_rn(ca, cb);
    const int lo = qlo(quant), hi = qhi(quant);
    const int64_t n0 = (int64_t)blockIdx.x * nt;
    const int nr = (int)(N - n0 < nt ? N - n0 : nt);
    for (int64_t b = blockIdx.z; b < B; b += gridDim.z)
        for (int64_t m0 = (int64_t)blockIdx.y * mt; m0 < M; m0 += (int64_t)gridDim.y * mt) {
            const int mr = (int)(M - m0 < mt ? M - m0 : mt);
            __syncthreads(); // (the last tiles are no longer read)
            stage_rows<BINARY>(x, b, m0, mr, K, kw, ld, xvec, ca, lo, hi, xs);
            stage_rows<BINARY>(y, b, n0, nr, K, kw, ld, yvec, cb, lo, hi, ys);
            __syncthreads();
            // warp: groups of MM_RG rows (each x word read once for the group's columns), lane: columns
            const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
            for (int mg = warp * MM_RG; mg < mr; mg += warps * MM_RG) {
                int64_t row[MM_RG]; // out offsets of the group's rows (-1: past the tile)
#pragma unroll
                for (int q = 0; q < MM_RG; q++)
                    row[q] = mg + q < mr ? b * out.stride[1] + (m0 + mg + q) * out.stride[2] : -1;
                const uint32_t * xr[MM_RG]; // the group's x rows (past mr: its first row, unused)
#pragma unroll
                for (int q = 0; q < MM_RG; q++) xr[q] = xs + (mg + q < mr ? mg + q : mg) * ld;
                for (int ni = lane; ni < nr; ni += 32) {
                    const uint32_t * yr = ys + ni * ld;
                    int32_t acc[MM_RG] = {};
                    for (int w = 0; w < kw; w++) {
                        const uint32_t yw = yr[w];
#pragma unroll
                        for (int q = 0; q < MM_RG; q++)
                            acc[q] = BINARY ? acc[q] + __popc(xr[q][w] ^ yw) : __dp4a((int)xr[q][w], (int)yw, acc[q]);
                    }
                    const int64_t col = (n0 + ni) * out.stride[3];
#pragma unroll
                    for (int q = 0; q < MM_RG; q++) {
                        if (row[q] < 0) break;
                        const int32_t v = BINARY ? (int32_t)(K - 2 * (int64_t)acc[q]) : acc[q];
                        if (out.dtype == BIE_DTYPE_I32) ((int32_t *)out.data)[row[q] + col] = v;
                        else st_float(out.data, out.dtype, row[q] + col, __fmul_rn((float)v, s));
                    }
                }
            }
        }
}

// Whether small_products may load E-element units of v ([B, R, K]) as one vector: dense 16-bit
// rows whose every unit starts 2E-byte aligned.
bool vec_rows(const struct dview & v, int64_t K, int E) {
    return (v.dtype == BIE_DTYPE_F16 || v.dtype == BIE_DTYPE_BF16) && (K == 1 || v.stride[3] == 1) && K % E == 0 &&
           v.stride[1] % E == 0 && v.stride[2] % E == 0 && (uintptr_t)v.data % (2 * E) == 0;
}

int64_t words_per_row(const struct bie_matmul_call * mc) {
    return mc->quant == BIE_QUANT_BINARY ? (mc->K + 31) / 32 : (mc->K + 3) / 4;
}

// Whether the batched word products run this matmul's forward: several batches of a few
// operations each (per batch at most 2^21 word products, rows of at most MM_MAX_KW words), where a
// layer call per batch costs more in launches than its work.
bool small_batches(const struct bie_matmul_call * mc) {
    return mc->B > 1 && mc->M * mc->N * words_per_row(mc) <= ((int64_t)1 << 21) && words_per_row(mc) <= MM_MAX_KW &&
           mc->x.ndim == 3 && mc->y.ndim == 3 && mc->out.ndim == 3;
}

template <bool BINARY> enum bie_status forward_small_batches(bie_context_t * ctx, const struct bie_matmul_call * mc) {
    struct bie_cuda_state * st;
    BIE_TRY(bie_cuda_state_get(ctx, mc->device_index, &st));
    const int kw = (int)words_per_row(mc), ld = kw | 1, budget = MM_SMEM_WORDS / ld; // rows the block holds
    int mt = budget / 2 < 64 ? budget / 2 : 64; // x rows: up to 64, half the budget at most
    if (mc->M < mt) mt = (int)mc->M;
    const int nt = (int)(mc->N < budget - mt ? mc->N : budget - mt);
    struct dview x, y, out;
    dview_make(&mc->x, &x);
    dview_make(&mc->y, &y);
    dview_make(&mc->out, &out);
    struct bie_layer_call lc;
    bie_matmul_layer_call(mc, 0, 0, &lc);
    const struct dscale sx = dscale_make(&lc, true), sy = dscale_make(&lc, false);
    const int E = mm_unit<BINARY>::E;
    const int64_t ntiles = (mc->N + nt - 1) / nt, mtiles = (mc->M + mt - 1) / mt;
    const dim3 grid((unsigned)ntiles, (unsigned)(mtiles < 65535 ? mtiles : 65535),
                    (unsigned)(mc->B < 65535 ? mc->B : 65535));
    small_products<BINARY><<<grid, 256, (size_t)(mt + nt) * ld * 4, st->stream>>>(
        x, y, mc->B, mc->M, mc->N, mc->K, kw, mt, nt, vec_rows(x, mc->K, E), vec_rows(y, mc->K, E), sx, sy,
        (int)mc->quant, out);
    LAUNCHED(ctx, "matmul small products");
    return BIE_STATUS_OK;
}

// Whether an operand [B, R, K] has its rows evenly spaced across the batches (one [B*R, K] matrix).
bool merged_rows(const struct bie_tensor & t) { return t.shape[0] == 1 || t.stride[0] == t.shape[1] * t.stride[1]; }

// The B1 view [R, K, 1, 1] of R packed rows, kbytes apart, at p.
struct bie_tensor bit_rows(uint8_t * p, int64_t R, int64_t K, int64_t kbytes, const struct bie_matmul_call * mc) {
    struct bie_tensor t;
    memset(&t, 0, sizeof t);
    t.data = p;
    t.dtype = BIE_DTYPE_B1;
    t.ndim = 4;
    t.shape[0] = R;
    t.shape[1] = K;
    t.shape[2] = t.shape[3] = 1;
    t.stride[0] = kbytes * 8;
    t.stride[1] = 1;
    t.device_type = mc->device_type;
    t.device_index = mc->device_index;
    return t;
}

// Packs side's operand (0: x, 1: y) of every batch into GEMM rows of kbytes (bit = 1{v >= 0},
// NaN -> 0, zeros past K), the layers' packer taking the rows of each batch as a linear layer's x,
// or those of all batches at once when they are evenly spaced.
enum bie_status pack_operand(bie_context_t * ctx, const struct bie_matmul_call * mc, int side, int64_t kbytes,
                             uint8_t * out) {
    const bool merged = merged_rows(side ? mc->y : mc->x);
    for (int64_t b = 0; b < (merged ? 1 : mc->B); b++) {
        struct bie_layer_call lc;
        bie_matmul_layer_call(mc, b, side, &lc);
        if (merged) {
            lc.g.batch *= mc->B;
            lc.x.shape[0] *= mc->B;
        }
        BIE_TRY(pack_any(ctx, ctx->cuda->stream, x_source(&lc), lc.g.batch, kbytes, out + b * lc.g.batch * kbytes, NULL,
                         NULL));
    }
    return BIE_STATUS_OK;
}

enum bie_status forward_packed_batches(bie_context_t * ctx, const struct bie_matmul_call * mc) {
    const int64_t kbytes = ((mc->K + 7) / 8 + 127) / 128 * 128, xr = mc->B * mc->M, yr = mc->B * mc->N;
    uint8_t * bits;
    BIE_TRY(bie_cuda_aux(ctx, (size_t)((xr + yr) * kbytes), (void **)&bits));
    uint8_t *xb = bits, *yb = bits + xr * kbytes;
    BIE_TRY(pack_operand(ctx, mc, 0, kbytes, xb));
    BIE_TRY(pack_operand(ctx, mc, 1, kbytes, yb));
    for (int64_t b = 0; b < mc->B; b++) {
        struct bie_layer_call lc;
        bie_matmul_layer_call(mc, b, 0, &lc);
        lc.x = bit_rows(xb + b * mc->M * kbytes, mc->M, mc->K, kbytes, mc);
        lc.weight = bit_rows(yb + b * mc->N * kbytes, mc->N, mc->K, kbytes, mc);
        BIE_TRY(bie_cuda_layer_forward(ctx, &lc));
    }
    return BIE_STATUS_OK;
}

} // namespace

extern "C" enum bie_status bie_cuda_matmul_forward(bie_context_t * ctx, const struct bie_matmul_call * mc) {
    if (small_batches(mc))
        return mc->quant == BIE_QUANT_BINARY ? forward_small_batches<true>(ctx, mc)
                                             : forward_small_batches<false>(ctx, mc);
    if (mc->quant == BIE_QUANT_BINARY && mc->B > 1) return forward_packed_batches(ctx, mc);
    for (int64_t b = 0; b < mc->B; b++) {
        struct bie_layer_call lc;
        bie_matmul_layer_call(mc, b, 0, &lc);
        BIE_TRY(bie_cuda_layer_forward(ctx, &lc));
    }
    return BIE_STATUS_OK;
}

extern "C" enum bie_status bie_cuda_matmul_backward(bie_context_t * ctx, const struct bie_matmul_call * mc) {
    struct bie_cuda_state * st;
    BIE_TRY(bie_cuda_state_get(ctx, mc->device_index, &st));
    const struct bie_tensor *grads[2] = {&mc->grad_x, &mc->grad_y}, *clips[2] = {&mc->grad_x_clip, &mc->grad_y_clip};
    float * part = NULL;
    if (clips[0]->data || clips[1]->data) BIE_TRY(bie_cuda_aux(ctx, 2 * (size_t)mc->B * sizeof(float), (void **)&part));
    for (int side = 0; side < 2; side++) {
        if (!grads[side]->data && !clips[side]->data) continue;
        for (int64_t b = 0; b < mc->B; b++) {
            struct bie_layer_call lc;
            bie_matmul_layer_call(mc, b, side, &lc);
            if (clips[side]->data) {
                bie_tensor_make(&lc.grad_scale_a, part + side * mc->B + b, BIE_DTYPE_F32, 0, NULL);
                lc.grad_scale_a.device_type = BIE_DEVICE_CUDA;
                lc.grad_scale_a.device_index = mc->device_index;
            }
            BIE_TRY(bie_cuda_layer_backward(ctx, &lc));
        }
        if (clips[side]->data) {
            struct dview out;
            dview_make(clips[side], &out);
            clip_total<<<1, 32, 0, st->stream>>>(part + side * mc->B, mc->B, out);
            LAUNCHED(ctx, "matmul clip gradient");
        }
    }
    return BIE_STATUS_OK;
}
