// SPDX-License-Identifier: Apache-2.0
// cuda-pack.cu: bie_pack / bie_unpack / the scale-init reductions on CUDA tensors, and the packed
// (B1 / S4) writer that the layers reuse for a B1 output.
//   pack   B1: bit = (v >= 0);  S4: q = clamp(rne(v / scale), -8, 7);  I8: clamp(rne(v / scale), -128, 127)
//          (an i8 source is clamped as it is, without scale)
//   unpack dst = value * scale, value = +-1 (B1) or the integer code (S4, I8)
//   reduce sum|x| and sum x in double
//   weight scale  out = bie_weight_scale_of(quant, sum|w| / numel), the sum in double in a fixed order
// Packed destinations: several elements share a byte, so each destination byte is written by
// exactly one thread (read-modify-write, keeping bits that belong to no element). That needs rows
// that start on a byte: the innermost stride is 1 and every other stride a multiple of the
// elements per byte; other views go through a one-thread kernel (correct, slow, rare).
#include "cuda-impl.cuh"

// Elementwise codes of src in row-major element order: B1 0/1, S4/I8 the clamped code.
__global__ void codes_kernel(struct dview src, float scale, int dst_dtype, int8_t * codes, int64_t n) {
    const bool int_src = src.dtype == BIE_DTYPE_I8;
    const float inv = __frcp_rn(scale);
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const float v = ld_float(src.data, src.dtype, dview_off_linear(src, e));
        int8_t q;
        if (dst_dtype == BIE_DTYPE_B1) {
            q = v >= 0.0f ? 1 : 0;
        } else {
            const int lo = dst_dtype == BIE_DTYPE_S4 ? -8 : -128, hi = dst_dtype == BIE_DTYPE_S4 ? 7 : 127;
            q = (int8_t)(int_src ? (int)fminf(fmaxf(v, (float)lo), (float)hi) : quant_code_r(v, scale, inv, lo, hi));
        }
        codes[e] = q;
    }
}

// One thread per destination byte of row-aligned packed rows; the code of element (i0, i1, i2, col)
// is codes[i0*cst[0] + i1*cst[1] + i2*cst[2] + col*cst[3]].
__global__ void store_packed_rows(const int8_t * codes, struct dview dst, int64_t cst0, int64_t cst1, int64_t cst2,
                                  int64_t cst3, int64_t rows, int64_t row_bytes) {
    const int per = dst.dtype == BIE_DTYPE_B1 ? 8 : 2; // elements per byte
    const int64_t L = dst.shape[3];
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < rows * row_bytes;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = t / row_bytes, j = t % row_bytes;
        const int64_t i2 = r % dst.shape[2], i1 = (r / dst.shape[2]) % dst.shape[1],
                      i0 = r / (dst.shape[2] * dst.shape[1]);
        const int64_t base = i0 * dst.stride[0] + i1 * dst.stride[1] + i2 * dst.stride[2]; // multiple of per
        const int64_t cbase = i0 * cst0 + i1 * cst1 + i2 * cst2;
        uint8_t * p = (uint8_t *)dst.data + base / per + j;
        unsigned b = *p;
        for (int k = 0; k < per; k++) {
            const int64_t col = j * per + k;
            if (col >= L) break;
            const int q = codes[cbase + col * cst3];
            if (per == 8) {
                b = (b & ~(1u << k)) | ((q ? 1u : 0u) << k);
            } else { // element 2i in the high nibble
                const int sh = k == 0 ? 4 : 0;
                b = (b & ~(15u << sh)) | (((unsigned)q & 15u) << sh);
            }
        }
        *p = (uint8_t)b;
    }
}

__global__ void store_packed_serial(const int8_t * codes, struct dview dst, int64_t n) {
    for (int64_t e = 0; e < n; e++) {
        const int64_t off = dview_off_linear(dst, e);
        const int q = codes[e];
        if (dst.dtype == BIE_DTYPE_B1) {
            uint8_t * p = (uint8_t *)dst.data + (off >> 3);
            *p = (uint8_t)((*p & ~(1u << (off & 7))) | ((q ? 1u : 0u) << (off & 7)));
        } else if (dst.dtype == BIE_DTYPE_S4) {
            uint8_t * p = (uint8_t *)dst.data + (off >> 1);
            const int sh = (off & 1) ? 0 : 4;
            *p = (uint8_t)((*p & ~(15u << sh)) | (((unsigned)q & 15u) << sh));
        } else {
            ((int8_t *)dst.data)[off] = (int8_t)q;
        }
    }
}

__global__ void store_i8(const int8_t * codes, struct dview dst, int64_t n) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x)
        ((int8_t *)dst.data)[dview_off_linear(dst, e)] = codes[e];
}

enum bie_status bie_cuda_store_packed(bie_context_t * ctx, const int8_t * codes, const struct dview & dst_in) {
    cudaStream_t st = ctx->cuda->stream;
    const struct dview dst = dview_squeeze(dst_in);
    const int64_t n = dview_numel(dst);
    if (dst.dtype == BIE_DTYPE_I8) {
        store_i8<<<grid_for(n, 256), 256, 0, st>>>(codes, dst, n);
        LAUNCHED(ctx, "store i8");
        return BIE_STATUS_OK;
    }
    const int per = dst.dtype == BIE_DTYPE_B1 ? 8 : 2;
    // Row-major strides of the codes, then the dimension of stride 1 (if any) moved innermost.
    struct dview v = dst;
    int64_t cst[4];
    cst[3] = 1;
    for (int d = 2; d >= 0; d--) cst[d] = cst[d + 1] * v.shape[d + 1];
    if (v.stride[3] != 1)
        for (int d = 0; d < 3; d++)
            if (v.stride[d] == 1 && v.shape[d] > 1) {
                int64_t t;
                t = v.shape[d], v.shape[d] = v.shape[3], v.shape[3] = t;
                t = v.stride[d], v.stride[d] = v.stride[3], v.stride[3] = t;
                t = cst[d], cst[d] = cst[3], cst[3] = t;
                break;
            }
    bool rows_ok = v.stride[3] == 1 || v.shape[3] == 1;
    for (int d = 0; d < 3; d++) rows_ok = rows_ok && (v.shape[d] == 1 || v.stride[d] % per == 0);
    if (rows_ok) {
        const int64_t rows = v.shape[0] * v.shape[1] * v.shape[2];
        const int64_t row_bytes = (v.shape[3] + per - 1) / per;
        store_packed_rows<<<grid_for(rows * row_bytes, 256), 256, 0, st>>>(codes, v, cst[0], cst[1], cst[2], cst[3],
                                                                           rows, row_bytes);
    } else {
        store_packed_serial<<<1, 1, 0, st>>>(codes, dst, n);
    }
    LAUNCHED(ctx, "store packed");
    return BIE_STATUS_OK;
}

// What a pack, unpack or reduce call runs on: src's device state (its stream), the views of src and dst,
// and src's element count.
struct pack_call {
    struct bie_cuda_state * s;
    struct dview src, dst;
    int64_t n;
};

// (names: the two tensors' names in the caller's messages)
static enum bie_status pack_call_make(bie_context_t * ctx, const struct bie_tensor * src, const struct bie_tensor * dst,
                                      const char * const names[2], struct pack_call * c) {
    BIE_TRY(bie_cuda_state_get(ctx, src->device_index, &c->s));
    const char * bad = !dview_make(src, &c->src) ? names[0] : !dview_make(dst, &c->dst) ? names[1] : NULL;
    if (bad) return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "%s: CUDA takes tensors of up to 4 dimensions", bad);
    c->n = dview_numel(c->src);
    return BIE_STATUS_OK;
}
static const char * const SRC_DST[2] = {"src", "dst"};

extern "C" enum bie_status bie_cuda_pack(bie_context_t * ctx, const struct bie_tensor * src, float scale,
                                         const struct bie_tensor * dst) {
    struct pack_call c;
    BIE_TRY(pack_call_make(ctx, src, dst, SRC_DST, &c));
    void * ws;
    BIE_TRY(bie_cuda_workspace(ctx, (size_t)c.n, &ws));
    codes_kernel<<<grid_for(c.n, 256), 256, 0, c.s->stream>>>(c.src, scale, c.dst.dtype, (int8_t *)ws, c.n);
    LAUNCHED(ctx, "pack");
    return bie_cuda_store_packed(ctx, (const int8_t *)ws, c.dst);
}

__global__ void unpack_kernel(struct dview src, float scale, struct dview dst, int64_t n) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const float v = ld_float(src.data, src.dtype, dview_off_linear(src, e));
        st_float(dst.data, dst.dtype, dview_off_linear(dst, e), dst.dtype == BIE_DTYPE_I8 ? v : __fmul_rn(v, scale));
    }
}

extern "C" enum bie_status bie_cuda_unpack(bie_context_t * ctx, const struct bie_tensor * src, float scale,
                                           const struct bie_tensor * dst) {
    struct pack_call c;
    BIE_TRY(pack_call_make(ctx, src, dst, SRC_DST, &c));
    unpack_kernel<<<grid_for(c.n, 256), 256, 0, c.s->stream>>>(c.src, scale, c.dst, c.n);
    LAUNCHED(ctx, "unpack");
    return BIE_STATUS_OK;
}

// The sum of a double over a block of 256 threads, in a fixed order (a shuffle tree in each warp,
// then the warps' sums in order); the result in thread 0.
__device__ double block_sum256(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __shared__ double part[8];
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    __syncthreads(); // (part may still be read from a previous use)
    if (l == 0) part[w] = v;
    __syncthreads();
    double a = 0.0;
    if (threadIdx.x == 0)
        for (int i = 0; i < 8; i++) a += part[i];
    return a;
}

// A thread's sums in double over its elements of x in grid-stride order: sa = sum |v|, and where
// SUM, s = sum v.
template <bool SUM> __device__ void stride_sums(struct dview x, int64_t n, double & sa, double & s) {
    sa = s = 0.0;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const double v = (double)ld_float(x.data, x.dtype, dview_off_linear(x, e));
        sa += fabs(v);
        if (SUM) s += v;
    }
}

// Block sums in double, then one atomicAdd per block into out[0] (sum|x|) and out[1] (sum x).
__global__ void __launch_bounds__(256) reduce_kernel(struct dview x, int64_t n, double * out) {
    double sa, s;
    stride_sums<true>(x, n, sa, s);
    sa = block_sum256(sa);
    s = block_sum256(s);
    if (threadIdx.x == 0) {
        atomicAdd(&out[0], sa);
        atomicAdd(&out[1], s);
    }
}

// part[b] = sum|w| over block b's elements (grid-stride order, then block_sum256).
__global__ void __launch_bounds__(256) abs_sums_kernel(struct dview w, int64_t n, double * part) {
    double sa, s;
    stride_sums<false>(w, n, sa, s);
    sa = block_sum256(sa);
    if (threadIdx.x == 0) part[blockIdx.x] = sa;
}

// One block: out = the weight scale of the mean of the nparts block sums (added in a fixed order).
__global__ void __launch_bounds__(256)
    weight_scale_kernel(const double * part, int nparts, int64_t n, int quant, struct dview out) {
    double s = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += part[i];
    s = block_sum256(s);
    if (threadIdx.x == 0)
        st_float(out.data, out.dtype, 0, (float)bie_weight_scale_of((enum bie_quant)quant, s / (double)n));
}

extern "C" enum bie_status bie_cuda_reduce(bie_context_t * ctx, const struct bie_tensor * x, double * sum_abs,
                                           double * sum) {
    struct pack_call c; // (x as both views)
    static const char * const names[2] = {"x", "x"};
    BIE_TRY(pack_call_make(ctx, x, x, names, &c));
    struct bie_cuda_state * s = c.s;
    void * ws;
    BIE_TRY(bie_cuda_workspace(ctx, 2 * sizeof(double), &ws));
    CU_TRY(ctx, cudaMemsetAsync(ws, 0, 2 * sizeof(double), s->stream), "cudaMemsetAsync");
    unsigned blocks = grid_for(c.n, 256);
    if (blocks > 2048) blocks = 2048;
    reduce_kernel<<<blocks, 256, 0, s->stream>>>(c.src, c.n, (double *)ws);
    LAUNCHED(ctx, "reduce");
    double h[2];
    CU_TRY(ctx, cudaMemcpyAsync(h, ws, sizeof h, cudaMemcpyDeviceToHost, s->stream), "cudaMemcpyAsync");
    CU_TRY(ctx, cudaStreamSynchronize(s->stream), "cudaStreamSynchronize");
    *sum_abs = h[0];
    *sum = h[1];
    return BIE_STATUS_OK;
}

#define SCALE_BLOCKS 256 // abs_sums_kernel's blocks at most (a function of numel(w) only: the same bits each call)

extern "C" enum bie_status bie_cuda_weight_scale(bie_context_t * ctx, enum bie_quant quant, const struct bie_tensor * w,
                                                 const struct bie_tensor * out) {
    struct pack_call c;
    static const char * const names[2] = {"w", "out"};
    BIE_TRY(pack_call_make(ctx, w, out, names, &c));
    void * ws;
    BIE_TRY(bie_cuda_workspace(ctx, SCALE_BLOCKS * sizeof(double), &ws));
    unsigned blocks = grid_for(c.n, 256 * 8);
    if (blocks > SCALE_BLOCKS) blocks = SCALE_BLOCKS;
    abs_sums_kernel<<<blocks, 256, 0, c.s->stream>>>(c.src, c.n, (double *)ws);
    LAUNCHED(ctx, "weight scale sums");
    weight_scale_kernel<<<1, 256, 0, c.s->stream>>>((const double *)ws, (int)blocks, c.n, (int)quant, c.dst);
    LAUNCHED(ctx, "weight scale");
    return BIE_STATUS_OK;
}
