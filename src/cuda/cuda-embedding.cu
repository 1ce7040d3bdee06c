// SPDX-License-Identifier: Apache-2.0
// cuda-embedding.cu: the embedding lookup and its sparse backward on CUDA tensors (the math is
// ref-embedding.c's).
// Forward: a thread per output row i and group of 8 columns: for each index of the row (a bag's
// in order) it decodes 8 codes of the table row from one byte of bits, 4 bytes of nibbles or 8
// codes when the row's codes are contiguous (element by element otherwise), multiplies them by the
// row's scale in f32, adds a bag's values in f32 in index order, and stores the 8 values with one
// 16-byte store (f16 / bf16; two for f32) where the output row allows: the reads are a byte (or a
// few) per 8 outputs, so the kernel moves about what it writes, at memory speed. The results are
// the reference's to the bit. An index outside [0, V) reads as a zero row (the host does not read
// the indices; the CPU path refuses them).
// Backward: a thread per lookup and group of 8 columns adds grad_out * scale into its slot's row
// with float atomics (in any order), into grad_rows itself when it is dense f32 (cleared first),
// else into an f32 buffer in the workspace that one more pass rounds into grad_rows.
#include "cuda-impl.cuh"

#include <string.h>

namespace {

struct emb {
    struct dview idx, inv, table, scale, out, grad; // idx, inv [R, L]; table [V, D]; scale [V]; out, grad [R, D]
    int64_t R, L, V, D, U;
    int quant;
};

__device__ __forceinline__ int64_t ld_index(const struct dview & v, int64_t i, int64_t l) {
    const int64_t off = i * v.stride[2] + l * v.stride[3];
    return v.dtype == BIE_DTYPE_I64 ? ((const int64_t *)v.data)[off] : (int64_t)((const int32_t *)v.data)[off];
}

// The codes of table row r, columns d0 .. d0 + n - 1 (n <= 8), as floats.
__device__ __forceinline__ void row_codes(const struct emb & a, int64_t r, int64_t d0, int n, float s, float * v) {
    const struct dview & t = a.table;
    const int64_t e0 = r * t.stride[2] + d0 * t.stride[3]; // element offset of (r, d0)
    const bool dense = t.stride[3] == 1 || a.D == 1;
    const int lo = qlo(a.quant), hi = qhi(a.quant);
    if (t.dtype == BIE_DTYPE_B1 && dense && (e0 & 7) == 0) {
        const unsigned byte = ((const uint8_t *)t.data)[e0 >> 3];
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = (byte >> j) & 1 ? 1.0f : -1.0f;
        return;
    }
    if (t.dtype == BIE_DTYPE_S4 && dense && (e0 & 1) == 0) {
        const uint8_t * p = (const uint8_t *)t.data + (e0 >> 1);
        for (int j = 0; j < n; j += 2) {
            const unsigned b = p[j >> 1];
            const int h = (int)(b >> 4), l = (int)(b & 15);
            v[j] = (float)(h >= 8 ? h - 16 : h);
            if (j + 1 < 8) v[j + 1] = (float)(l >= 8 ? l - 16 : l);
        }
        return;
    }
    for (int j = 0; j < n; j++) {
        const float x = ld_float(t.data, t.dtype, e0 + j * t.stride[3]);
        float c;
        if (a.quant == BIE_QUANT_BINARY) c = x >= 0.0f ? 1.0f : -1.0f; // B1 reads as +-1; NaN -> -1
        else if (t.dtype == BIE_DTYPE_F32 || t.dtype == BIE_DTYPE_F16 || t.dtype == BIE_DTYPE_BF16)
            c = (float)quant_code(x, s, lo, hi);
        else c = fminf(fmaxf(x, (float)lo), (float)hi);
        v[j] = c;
    }
}

__global__ void embedding_forward(struct emb a) {
    const int64_t G = (a.D + 7) / 8, total = a.R * G;
    const bool has_scale = a.scale.data != NULL;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = qdiv(e, G), g = e - i * G, d0 = g * 8;
        const int n = a.D - d0 < 8 ? (int)(a.D - d0) : 8;
        float acc[8], v[8];
        for (int64_t l = 0; l < a.L; l++) {
            const int64_t r = ld_index(a.idx, i, l);
            if (r >= 0 && r < a.V) {
                const float s = has_scale ? ld_float(a.scale.data, a.scale.dtype, r * a.scale.stride[3]) : 1.0f;
                row_codes(a, r, d0, n, s, v);
#pragma unroll
                for (int j = 0; j < 8; j++) v[j] = has_scale ? __fmul_rn(s, v[j]) : v[j];
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) v[j] = 0.0f;
            }
#pragma unroll
            for (int j = 0; j < 8; j++) acc[j] = l == 0 ? v[j] : __fadd_rn(acc[j], v[j]);
        }
        const int64_t o = i * a.out.stride[2] + d0 * a.out.stride[3];
        if (n == 8 && (a.out.stride[3] == 1 || a.D == 1) && vec8_ok(a.out.data, a.out.dtype, o)) {
            store8(a.out.data, a.out.dtype, o, acc);
        } else {
            for (int j = 0; j < n; j++) st_float(a.out.data, a.out.dtype, o + j * a.out.stride[3], acc[j]);
        }
    }
}

// The common case at memory speed: a binary table of byte-aligned dense rows, one lookup per output
// row (no bag) and dense, 16-byte aligned f16 / bf16 output rows of D % 8 == 0 columns. A warp per
// output row, a lane per 8 columns: one byte of bits in, one 16-byte store of the two values
// s*(+1) and s*(-1) rounded out (the generic kernel's products, a bag of one adding nothing).
template <typename T> __device__ __forceinline__ unsigned short raw16(float v);
template <> __device__ __forceinline__ unsigned short raw16<__half>(float v) {
    return __half_as_ushort(__float2half_rn(v));
}
template <> __device__ __forceinline__ unsigned short raw16<__nv_bfloat16>(float v) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

template <typename T> __global__ void embedding_b1_rows(struct emb a) {
    const int64_t G = a.D >> 3, row_bytes = a.table.stride[2] >> 3, warps = blockDim.x >> 5;
    const int lane = threadIdx.x & 31;
    for (int64_t i = blockIdx.x * warps + (threadIdx.x >> 5); i < a.R; i += (int64_t)gridDim.x * warps) {
        const int64_t r = ld_index(a.idx, i, 0);
        const bool in = r >= 0 && r < a.V;
        const float s = a.scale.data && in ? ld_float(a.scale.data, a.scale.dtype, r * a.scale.stride[3]) : 1.0f;
        // an index outside [0, V) reads as a zero row (+0, as the generic kernel's)
        const unsigned one = in ? raw16<T>(__fmul_rn(s, 1.0f)) : 0u, minus = in ? raw16<T>(__fmul_rn(s, -1.0f)) : 0u;
        const uint8_t * row = (const uint8_t *)a.table.data + (in ? r : 0) * row_bytes;
        uint4 * out = (uint4 *)((T *)a.out.data + i * a.out.stride[2]);
        for (int64_t g = lane; g < G; g += 32) {
            const unsigned byte = in ? row[g] : 0u;
            unsigned w[4];
#pragma unroll
            for (int k = 0; k < 4; k++)
                w[k] = ((byte >> (2 * k)) & 1 ? one : minus) | (((byte >> (2 * k + 1)) & 1 ? one : minus) << 16);
            out[g] = make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
}

// Whether embedding_b1_rows computes call c (see above); wide rows only, so that a warp's lanes
// have columns to work on.
bool b1_rows_route(const struct bie_embedding_call * c) {
    const struct bie_tensor &t = c->table, &o = c->out;
    const int od = (int)o.dtype;
    return c->quant == BIE_QUANT_BINARY && c->L == 1 && t.dtype == BIE_DTYPE_B1 && t.ndim == 2 && t.stride[1] == 1 &&
           t.stride[0] % 8 == 0 && (od == BIE_DTYPE_F16 || od == BIE_DTYPE_BF16) && c->D % 8 == 0 && c->D >= 128 &&
           o.ndim >= 1 && o.stride[o.ndim - 1] == 1 && (o.ndim == 1 || o.stride[o.ndim - 2] % 8 == 0) &&
           (uintptr_t)o.data % 16 == 0;
}

// acc [U][D] (dense f32) += grad_out * scale of every lookup, by its slot.
__global__ void embedding_backward(struct emb a, float * acc) {
    const int64_t G = (a.D + 7) / 8, total = a.R * a.L * G;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t q = qdiv(e, G), g = e - q * G, d0 = g * 8;
        const int64_t i = qdiv(q, a.L), l = q - i * a.L;
        const int64_t r = ld_index(a.idx, i, l);
        const int64_t u = a.inv.data ? ld_index(a.inv, i, l) : r;
        if (u < 0 || u >= a.U || (a.scale.data && (r < 0 || r >= a.V))) continue;
        const float s = a.scale.data ? ld_float(a.scale.data, a.scale.dtype, r * a.scale.stride[3]) : 1.0f;
        const int n = a.D - d0 < 8 ? (int)(a.D - d0) : 8;
        for (int j = 0; j < n; j++) {
            const float gv = ld_float(a.grad.data, a.grad.dtype, i * a.grad.stride[2] + (d0 + j) * a.grad.stride[3]);
            atomicAdd(acc + u * a.D + d0 + j, __fmul_rn(gv, s));
        }
    }
}

// grad_rows [U, D] (any float view) = acc rounded.
__global__ void rows_store(const float * acc, int64_t U, int64_t D, struct dview out) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < U * D; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t u = qdiv(e, D), d = e - u * D;
        st_float(out.data, out.dtype, u * out.stride[2] + d * out.stride[3], acc[e]);
    }
}

struct emb make_emb(const struct bie_embedding_call * c) {
    struct emb a;
    memset(&a, 0, sizeof a);
    dview_make(&c->indices, &a.idx);
    if (c->inverse.data) dview_make(&c->inverse, &a.inv);
    if (c->table.data) dview_make(&c->table, &a.table);
    if (c->scale.data) dview_make(&c->scale, &a.scale);
    if (c->out.data) dview_make(&c->out, &a.out);
    if (c->grad_out.data) dview_make(&c->grad_out, &a.grad);
    a.R = c->R;
    a.L = c->L;
    a.V = c->V;
    a.D = c->D;
    a.U = c->U;
    a.quant = (int)c->quant;
    return a;
}

} // namespace

extern "C" enum bie_status bie_cuda_embedding_forward(bie_context_t * ctx, const struct bie_embedding_call * c) {
    struct bie_cuda_state * st;
    BIE_TRY(bie_cuda_state_get(ctx, c->device_index, &st));
    const struct emb a = make_emb(c);
    if (b1_rows_route(c)) {
        const unsigned grid = grid_for(c->R, 256 / 32);
        if (c->out.dtype == BIE_DTYPE_F16) embedding_b1_rows<__half><<<grid, 256, 0, st->stream>>>(a);
        else embedding_b1_rows<__nv_bfloat16><<<grid, 256, 0, st->stream>>>(a);
    } else {
        embedding_forward<<<grid_for(c->R * ((c->D + 7) / 8), 256), 256, 0, st->stream>>>(a);
    }
    LAUNCHED(ctx, "embedding forward");
    return BIE_STATUS_OK;
}

extern "C" enum bie_status bie_cuda_embedding_backward(bie_context_t * ctx, const struct bie_embedding_call * c) {
    struct bie_cuda_state * st;
    BIE_TRY(bie_cuda_state_get(ctx, c->device_index, &st));
    struct emb a = make_emb(c);
    struct dview gr;
    dview_make(&c->grad_rows, &gr);
    const bool direct =
        c->grad_rows.dtype == BIE_DTYPE_F32 && (c->D == 1 || gr.stride[3] == 1) && (c->U == 1 || gr.stride[2] == c->D);
    float * acc = (float *)gr.data;
    if (!direct) BIE_TRY(bie_cuda_workspace(ctx, (size_t)(c->U * c->D) * sizeof(float), (void **)&acc));
    CU_TRY(ctx, cudaMemsetAsync(acc, 0, (size_t)(c->U * c->D) * sizeof(float), st->stream), "clear grad_rows");
    embedding_backward<<<grid_for(c->R * c->L * ((c->D + 7) / 8), 256), 256, 0, st->stream>>>(a, acc);
    LAUNCHED(ctx, "embedding backward");
    if (!direct) {
        rows_store<<<grid_for(c->U * c->D, 256), 256, 0, st->stream>>>(acc, c->U, c->D, gr);
        LAUNCHED(ctx, "embedding backward store");
    }
    return BIE_STATUS_OK;
}
