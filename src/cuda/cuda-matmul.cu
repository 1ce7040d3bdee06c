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
// alone. Nothing synchronises the host. Forwards of many small batches take one pass of operand
// words (sign bits or int8 codes) per operand and one of their products instead
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

// Many small products (attention's heads): one launch per step for all batches instead of a
// layer call per batch. Operand words of the [B*R, K] operands (padding past K: 0 in both):
//   binary: bit j of word w = 1{v >= 0} of element 32w + j (NaN -> 0, i.e. -1), a warp per word;
//   n-bit : byte j of word w = the int8 code clamp(rne(v/clip), lo, hi) of element 4w + j.
template <bool BINARY>
__global__ void operand_words(struct dview v, int64_t R, int64_t K, int64_t kw, int64_t words, struct dscale clip,
                              int quant, uint32_t * out) {
    if (BINARY) {
        const int lane = threadIdx.x & 31;
        for (int64_t wi = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; wi < words;
             wi += ((int64_t)gridDim.x * blockDim.x) >> 5) {
            const int64_t row = qdiv(wi, kw), w = wi - row * kw, b = qdiv(row, R), r = row - b * R, k = 32 * w + lane;
            const bool one =
                k < K && ld_float(v.data, v.dtype, b * v.stride[1] + r * v.stride[2] + k * v.stride[3]) >= 0.0f;
            const uint32_t word = __ballot_sync(0xffffffffu, one);
            if (lane == 0) out[wi] = word;
        }
        return;
    }
    const float s = ld_scale(clip);
    const int lo = qlo(quant), hi = qhi(quant);
    for (int64_t wi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; wi < words;
         wi += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = qdiv(wi, kw), w = wi - row * kw, b = qdiv(row, R), r = row - b * R;
        uint32_t word = 0;
        for (int j = 0; j < 4; j++) {
            const int64_t k = 4 * w + j;
            const int code =
                k < K ? quant_code(ld_float(v.data, v.dtype, b * v.stride[1] + r * v.stride[2] + k * v.stride[3]), s,
                                   lo, hi)
                      : 0;
            word |= (uint32_t)(uint8_t)(int8_t)code << (8 * j);
        }
        out[wi] = word;
    }
}

constexpr int MM_ROWS = 32;         // x rows a word_products block takes per step
constexpr int MM_TILE_WORDS = 8192; // y words a word_products block stages in shared memory (32 KB)
constexpr int MM_MAX_KW = 1024;     // the longest operand rows word_products takes (the tile holds 7 of them)

// out[b, m, n] = acc * (x_clip * y_clip), acc = sum_k a*b: binary K - 2 popc(a_bits ^ b_bits)
// (the padding bits agree), n-bit the dp4a sums of the code words; exact in int32. An I32 out
// takes acc. A block stages a tile of nt rows of y[b] in shared memory, rows kw + 1 words apart (an
// odd pitch: lanes on different rows read different banks), then takes MM_ROWS rows of x[b] at a
// time, a thread per output, n fastest (the lanes of a warp share their x row: one broadcast read).
template <bool BINARY>
__global__ void word_products(const uint32_t * xw, const uint32_t * yw, int64_t B, int64_t M, int64_t N, int64_t K,
                              int kw, int nt, struct dscale sa, struct dscale sb, struct dview out) {
    __shared__ uint32_t ys[MM_TILE_WORDS];
    const float s = __fmul_rn(ld_scale(sa), ld_scale(sb));
    const int64_t n0 = (int64_t)blockIdx.x * nt;
    const int rows = (int)(N - n0 < nt ? N - n0 : nt), ld = kw + 1;
    for (int64_t b = blockIdx.z; b < B; b += gridDim.z) {
        const uint32_t * src = yw + (b * N + n0) * kw;
        __syncthreads(); // (the previous batch's tile is no longer read)
        for (int i = threadIdx.x; i < rows * kw; i += blockDim.x) ys[(i / kw) * ld + i % kw] = src[i];
        __syncthreads();
        for (int64_t m0 = (int64_t)blockIdx.y * MM_ROWS; m0 < M; m0 += (int64_t)gridDim.y * MM_ROWS) {
            const int mrows = (int)(M - m0 < MM_ROWS ? M - m0 : MM_ROWS);
            for (int e = threadIdx.x; e < mrows * rows; e += blockDim.x) {
                const int mi = e / rows, ni = e - mi * rows;
                const uint32_t *xr = xw + (b * M + m0 + mi) * kw, *yr = ys + ni * ld;
                int32_t acc = 0;
                if (BINARY) {
                    int diff = 0;
                    for (int w = 0; w < kw; w++) diff += __popc(xr[w] ^ yr[w]);
                    acc = (int32_t)(K - 2 * (int64_t)diff);
                } else {
                    for (int w = 0; w < kw; w++) acc = __dp4a((int)xr[w], (int)yr[w], acc);
                }
                const int64_t off = b * out.stride[1] + (m0 + mi) * out.stride[2] + (n0 + ni) * out.stride[3];
                if (out.dtype == BIE_DTYPE_I32) ((int32_t *)out.data)[off] = acc;
                else st_float(out.data, out.dtype, off, __fmul_rn((float)acc, s));
            }
        }
    }
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
    const int64_t kw = words_per_row(mc), xn = mc->B * mc->M * kw, yn = mc->B * mc->N * kw;
    void * ws;
    BIE_TRY(bie_cuda_workspace(ctx, (size_t)(xn + yn) * sizeof(uint32_t), &ws));
    uint32_t *xw = (uint32_t *)ws, *yw = xw + xn;
    struct dview x, y, out;
    dview_make(&mc->x, &x);
    dview_make(&mc->y, &y);
    dview_make(&mc->out, &out);
    struct bie_layer_call lc;
    bie_matmul_layer_call(mc, 0, 0, &lc);
    const struct dscale sx = dscale_make(&lc, true), sy = dscale_make(&lc, false);
    const int per = BINARY ? 32 : 1; // threads per word
    operand_words<BINARY>
        <<<grid_for(per * xn, 256), 256, 0, st->stream>>>(x, mc->M, mc->K, kw, xn, sx, (int)mc->quant, xw);
    LAUNCHED(ctx, "matmul operand words (x)");
    operand_words<BINARY>
        <<<grid_for(per * yn, 256), 256, 0, st->stream>>>(y, mc->N, mc->K, kw, yn, sy, (int)mc->quant, yw);
    LAUNCHED(ctx, "matmul operand words (y)");
    const int nt = (int)(mc->N < MM_TILE_WORDS / (kw + 1) ? mc->N : MM_TILE_WORDS / (kw + 1));
    const int64_t ntiles = (mc->N + nt - 1) / nt, mtiles = (mc->M + MM_ROWS - 1) / MM_ROWS;
    const dim3 grid((unsigned)ntiles, (unsigned)(mtiles < 65535 ? mtiles : 65535),
                    (unsigned)(mc->B < 65535 ? mc->B : 65535));
    word_products<BINARY><<<grid, 256, 0, st->stream>>>(xw, yw, mc->B, mc->M, mc->N, mc->K, (int)kw, nt, sx, sy, out);
    LAUNCHED(ctx, "matmul word products");
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
        pack_src p;
        memset(&p, 0, sizeof p);
        dview_make(&lc.x, &p.t);
        p.g = dgeom_make(lc.g);
        p.quant = (int)lc.quant;
        p.s = dscale_make(&lc, true);
        BIE_TRY(pack_any(ctx, ctx->cuda->stream, p, lc.g.batch, kbytes, out + b * lc.g.batch * kbytes, NULL, NULL));
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
