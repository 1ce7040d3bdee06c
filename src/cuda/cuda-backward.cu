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
// and one fused elementwise pass over x gives the STE mask, grad_x, the scale_a gradient terms
// (docs/semantics.md) and the masked gradient that the per-channel bias_a reduction reads:
//   binary: r = x'/scale_a, mask = 1{|r| <= 1}, grad_x = gx*mask, term = grad_x * sign(x')
//   n-bit : mid = 1{lo <= r <= hi}, grad_x = gx*mid,
//           term = gx * (lo*1{r<lo} + hi*1{r>hi} + mid*(rne(r) - r))
//   grad_scale_a = sum(term) / sqrt(numel(x))  (n-bit: / sqrt(numel(x)*hi))
#include "cuda-impl.cuh"

#include <math.h>

namespace {

size_t align256(size_t v) { return (v + 255) & ~(size_t)255; }

// Writes v as element e of a dense buffer of dtype gdt (F32, F16 or BF16).
__device__ __forceinline__ void st_dense(void * p, int gdt, int64_t e, float v) {
    if (gdt == BIE_DTYPE_F16) ((__half *)p)[e] = __float2half_rn(v);
    else if (gdt == BIE_DTYPE_BF16) ((__nv_bfloat16 *)p)[e] = __float2bfloat16_rn(v);
    else ((float *)p)[e] = v;
}

// G[m][o] = grad_y[n, o, oh, ow] (exact: same dtype).
__global__ void gather_grad_y(struct dview gy, struct dgeom g, int gdt, void * G) {
    const int64_t total = g.batch * g.OH * g.OW * g.O;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = qdiv(e, g.O), o = e - m * g.O;
        const int64_t mq = qdiv(m, g.OW), ow = m - mq * g.OW, n = qdiv(mq, g.OH), oh = mq - n * g.OH;
        st_dense(G, gdt, e, ld_float(gy.data, gy.dtype, dview_off4(gy, n, o, oh, ow)));
    }
}

// Wc[o][k] = weight code at (o, c, i, j), k = (i*kw + j)*C + c.
__global__ void weight_codes(struct dview w, struct dgeom g, int quant, struct dscale sw, int gdt, void * Wc) {
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
        st_dense(Wc, gdt, e, q);
    }
}

__device__ __forceinline__ float x_prime(const struct dview & x, const struct dview & bias, int64_t n, int64_t c,
                                         int64_t h, int64_t w) {
    float v = ld_float(x.data, x.dtype, dview_off4(x, n, c, h, w));
    if (bias.data) v = __fadd_rn(v, ld_float(bias.data, bias.dtype, c * bias.stride[3]));
    return v;
}

// Acol[m][k] = activation code at output row m, position k (pad value outside the image).
__global__ void activation_codes(struct dview x, struct dview bias, struct dgeom g, int quant, struct dscale sa,
                                 int gdt, void * Acol) {
    const float s = ld_scale(sa);
    const int64_t M = g.batch * g.OH * g.OW, total = M * g.K;
    const int lo = qlo(quant), hi = qhi(quant);
    const float pad = quant != BIE_QUANT_BINARY ? 0.0f
                      : g.pad_value == BIE_PAD_PLUS_ONE ? 1.0f : g.pad_value == BIE_PAD_MINUS_ONE ? -1.0f : 0.0f;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = qdiv(e, g.K), k = e - m * g.K;
        const int64_t tap = qdiv(k, g.C), c = k - tap * g.C, i = tap / g.kw, j = tap % g.kw;
        const int64_t mq = qdiv(m, g.OW), ow = m - mq * g.OW, n = qdiv(mq, g.OH), oh = mq - n * g.OH;
        const int64_t h = oh * g.sh - g.ph + i * g.dh, w = ow * g.sw - g.pw + j * g.dw;
        float q = pad;
        if (h >= 0 && h < g.H && w >= 0 && w < g.W) {
            const float v = x_prime(x, bias, n, c, h, w);
            q = quant == BIE_QUANT_BINARY ? (v >= 0.0f ? 1.0f : -1.0f) : (float)quant_code(v, s, lo, hi);
        }
        st_dense(Acol, gdt, e, q);
    }
}

// The same codes for rows whose K elements are contiguous floats (a linear layer's weight and x):
// out[r][k] = code of src[r][k] (+ bias[k] for x), 8 elements per thread with a 16-byte load when
// the row is 16-byte aligned and the 8 lie inside it. Same values as weight_codes /
// activation_codes (a linear layer has one tap, inside the image).
template <typename T>
__global__ void codes_rows(const T * src, int sdt, int64_t row_stride, int64_t rows, int64_t K, struct dview bias,
                           int quant, struct dscale sc, int gdt, void * out) {
    const float s = ld_scale(sc);
    const int lo = qlo(quant), hi = qhi(quant);
    const int64_t chunks = (K + 7) / 8, total = rows * chunks;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = qdiv(e, chunks), k0 = (e - r * chunks) * 8;
        const T * row = src + r * row_stride;
        const bool full = k0 + 8 <= K;
        float q[8];
        if (full && ((uintptr_t)(row + k0) % 16) == 0) load8<T>(row + k0, q);
        else
            for (int i = 0; i < 8; i++) q[i] = k0 + i < K ? ld_float((const char *)row, sdt, k0 + i) : 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float x = q[i];
            if (bias.data && k0 + i < K) x = __fadd_rn(x, ld_float(bias.data, bias.dtype, (k0 + i) * bias.stride[3]));
            q[i] = quant == BIE_QUANT_BINARY ? (x >= 0.0f ? 1.0f : -1.0f) : (float)quant_code(x, s, lo, hi);
        }
        const int64_t o = r * K + k0;
        if (full && vec8_ok(out, gdt, o)) store8((char *)out, gdt, o, q);
        else
            for (int i = 0; i < 8 && k0 + i < K; i++) st_dense(out, gdt, o + i, q[i]);
    }
}

// Launches codes_rows when the rows of t ([rows, K] in its 4-D view: dim 0 rows, dim 1 the K
// contiguous elements, dims 2-3 of extent 1; rows_are_k says the layer's geometry makes them so)
// are contiguous floats; false otherwise.
bool launch_codes_rows(const struct dview & t, bool rows_are_k, int64_t rows, int64_t K, const struct dview & bias,
                       int quant, struct dscale sc, int gdt, void * out, cudaStream_t stream) {
    if (!rows_are_k || (K > 1 && t.stride[1] != 1)) return false;
    const unsigned grid = grid_for(rows * ((K + 7) / 8), 256);
    if (t.dtype == BIE_DTYPE_F32)
        codes_rows<float><<<grid, 256, 0, stream>>>((const float *)t.data, t.dtype, t.stride[0], rows, K, bias, quant, sc, gdt, out);
    else if (t.dtype == BIE_DTYPE_F16)
        codes_rows<__half><<<grid, 256, 0, stream>>>((const __half *)t.data, t.dtype, t.stride[0], rows, K, bias, quant, sc, gdt, out);
    else if (t.dtype == BIE_DTYPE_BF16)
        codes_rows<__nv_bfloat16><<<grid, 256, 0, stream>>>((const __nv_bfloat16 *)t.data, t.dtype, t.stride[0], rows, K, bias,
                                                            quant, sc, gdt, out);
    else
        return false;
    return true;
}

// The STE of one element (header comment): from x' and gx, the masked gradient and the
// scale_a-gradient term.
__device__ __forceinline__ void ste_elem(float xp, float gx, int quant, float s_a, int lo, int hi, float * gxm,
                                         float * term) {
    const float r = __fdiv_rn(xp, s_a);
    if (quant == BIE_QUANT_BINARY) {
        *gxm = fabsf(r) <= 1.0f ? gx : 0.0f;
        *term = xp >= 0.0f ? *gxm : -*gxm;
    } else {
        const bool mid = r >= (float)lo && r <= (float)hi;
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

// The fused STE pass over x (one thread per element of x, row-major over [batch, C, H, W]).
__global__ void ste_pass(struct dview x, struct dview bias, struct dgeom g, int quant, struct dscale sa,
                         struct dscale sw, const float * dcol, struct dview gx_out, int write_gx,
                         float * gxm /* [C][batch*H*W] or NULL */, double * term_sum) {
    const float s_a = ld_scale(sa), s_w = ld_scale(sw);
    const int64_t total = g.batch * g.C * g.H * g.W;
    const int lo = qlo(quant), hi = qhi(quant);
    double acc = 0.0;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t e1 = qdiv(e, g.W), w = e - e1 * g.W, e2 = qdiv(e1, g.H), h = e1 - e2 * g.H, n = qdiv(e2, g.C), c = e2 - n * g.C;
        float sum = 0.0f;
        for (int i = 0; i < g.kh; i++) {
            const int64_t th = h + g.ph - (int64_t)i * g.dh;
            if (th < 0 || th % g.sh) continue;
            const int64_t oh = th / g.sh;
            if (oh >= g.OH) continue;
            for (int j = 0; j < g.kw; j++) {
                const int64_t tw = w + g.pw - (int64_t)j * g.dw;
                if (tw < 0 || tw % g.sw) continue;
                const int64_t ow = tw / g.sw;
                if (ow >= g.OW) continue;
                sum += dcol[((n * g.OH + oh) * g.OW + ow) * g.K + (int64_t)(i * g.kw + j) * g.C + c];
            }
        }
        float gxm_v, term;
        ste_elem(x_prime(x, bias, n, c, h, w), __fmul_rn(sum, s_w), quant, s_a, lo, hi, &gxm_v, &term);
        if (write_gx) st_float(gx_out.data, gx_out.dtype, dview_off4(gx_out, n, c, h, w), gxm_v);
        if (gxm) gxm[c * (g.batch * g.H * g.W) + (n * g.H + h) * g.W + w] = gxm_v;
        acc += (double)term;
    }
    if (term_sum) block_sum_add(acc, term_sum);
}

// The same pass for a linear layer (dgeom_one_position: dCol[n][c] is element (n, c)'s own sum
// over its one tap) whose x has contiguous features: a thread takes 8 consecutive features of a
// row, with 16-byte loads and stores where aligned. Block (32, 8) covers 256 features of a slab of
// `slab` rows; instead of the transposed copy for the per-channel sums, each block writes its
// slab's column sums to colpart[slab index][c] (finished by colpart_sums).
template <typename T>
__global__ void ste_rows(struct dview x, struct dview bias, int64_t rows, int64_t C, int64_t slab, int quant,
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
            const T * xr = (const T *)x.data + r * x.stride[0];
            const float * dr = dcol + r * C;
            const bool full = c0 + 8 <= C;
            float xv[8], dv[8], gv[8];
            if (full && vec8_ok(xr, x.dtype, c0)) load8<T>(xr + c0, xv);
            else
                for (int i = 0; i < 8; i++) xv[i] = c0 + i < C ? ld_float((const char *)xr, x.dtype, c0 + i) : 0.0f;
            if (full && vec8_ok(dr, BIE_DTYPE_F32, c0)) load8<float>(dr + c0, dv);
            else
                for (int i = 0; i < 8; i++) dv[i] = c0 + i < C ? dr[c0 + i] : 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                // as ste_pass: the tap sum starts from 0.0f, x' adds the bias in f32
                const float xp = bias.data ? __fadd_rn(xv[i], b[i]) : xv[i];
                float term;
                ste_elem(xp, __fmul_rn(__fadd_rn(0.0f, dv[i]), s_w), quant, s_a, lo, hi, &gv[i], &term);
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

// grad_bias_a[c] = sum over the slabs of colpart[slab][c].
__global__ void colpart_sums(const double * colpart, int64_t slabs, int64_t C, struct dview out) {
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C; c += (int64_t)gridDim.x * blockDim.x) {
        double t = 0.0;
        for (int64_t s = 0; s < slabs; s++) t += colpart[s * C + c];
        st_float(out.data, out.dtype, c * out.stride[3], (float)t);
    }
}

// grad_bias_a[c] = sum of gxm[c][*] (a block per channel).
__global__ void channel_sums(const float * gxm, int64_t per_channel, struct dview out) {
    const int64_t c = blockIdx.x;
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < per_channel; i += blockDim.x) acc += (double)gxm[c * per_channel + i];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    __shared__ double part[32];
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int i = 0; i < (int)(blockDim.x >> 5); i++) t += part[i];
        st_float(out.data, out.dtype, c * out.stride[3], (float)t);
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

enum bie_status gemm_ex(bie_context_t * ctx, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
                        int64_t k, const void * A, int64_t lda, const void * B, int64_t ldb, float * C, int64_t ldc,
                        cudaDataType_t t, const char * what) {
    cublasHandle_t h;
    BIE_TRY(bie_cuda_cublas(ctx, &h));
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "%s: a dimension exceeds cuBLAS's 32-bit limit", what);
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t st = cublasGemmEx(h, ta, tb, (int)m, (int)n, (int)k, &one, A, t, (int)lda, B, t, (int)ldb, &zero,
                                     C, CUDA_R_32F, (int)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
        return bie_set_error(ctx, BIE_STATUS_DEVICE_ERROR, "cuda: cublasGemmEx (%s): %s", what, cublasGetStatusString(st));
    return BIE_STATUS_OK;
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

    size_t off = 0;
    const size_t oG = off; off = align256(off + (size_t)(M * O) * es);
    const size_t oW = off; off = align256(off + (want_gx ? (size_t)(O * K) * es : 0));
    const size_t col_bytes = (size_t)(M * K) * (want_gx ? 4 : es);
    const size_t oCol = off; off = align256(off + col_bytes);               // dCol (f32), then Acol
    const size_t oR = off; off = align256(off + (want_gw ? (size_t)(O * K) * 4 : 0));
    // The STE pass of a linear layer over contiguous features takes row slabs (ste_rows) and
    // leaves per-slab column sums for grad_bias_a; otherwise a [C][batch*H*W] copy of the masked
    // gradient feeds channel_sums.
    const bool ste_linear = dgeom_one_position(g) && (g.C == 1 || c->x.stride[1] == 1) &&
                            (c->x.dtype == BIE_DTYPE_F32 || c->x.dtype == BIE_DTYPE_F16 || c->x.dtype == BIE_DTYPE_BF16);
    int64_t slab = 64;
    if ((M + slab - 1) / slab > 65535) slab = ((M + 65534) / 65535 + 7) / 8 * 8;
    const int64_t slabs = (M + slab - 1) / slab;
    const size_t gxm_bytes = !c->grad_bias_a.data ? 0 : ste_linear ? (size_t)(slabs * g.C) * 8 : (size_t)xnumel * 4;
    const size_t oGxm = off; off = align256(off + gxm_bytes);
    const size_t oSum = off; off = align256(off + sizeof(double));
    uint8_t * ws;
    BIE_TRY(bie_cuda_workspace(ctx, off, (void **)&ws));
    cudaStream_t s = st->stream;

    struct dview x, bias, gy;
    dview_make(&c->x, &x);
    bias.data = NULL;
    if (c->bias_a.data) dview_make(&c->bias_a, &bias);
    dview_make(&c->grad_y, &gy);
    const struct dscale sa = dscale_make(c, true), sw = dscale_make(c, false);

    // A linear grad_y with dense rows already is G; otherwise gather it.
    const bool g_direct = !c->is_conv && gy.stride[1] == 1 && (M == 1 || gy.stride[0] == O);
    const void * G = g_direct ? (const void *)gy.data : (const void *)(ws + oG);
    if (!g_direct) {
        gather_grad_y<<<grid_for(M * O, 256), 256, 0, s>>>(gy, g, gdt, ws + oG);
        LAUNCHED(ctx, "gather grad_y");
    }

    if (want_gx) {
        struct dview w;
        dview_make(&c->weight, &w);
        struct dview nobias;
        nobias.data = NULL;
        if (!launch_codes_rows(w, g.kh == 1 && g.kw == 1, O, K, nobias, (int)c->quant, sw, gdt, ws + oW, s))
            weight_codes<<<grid_for(O * K, 256), 256, 0, s>>>(w, g, (int)c->quant, sw, gdt, ws + oW);
        LAUNCHED(ctx, "weight codes");
        // dCol (row-major [M][K]) = G [M][O] @ Wc [O][K]: column-major dCol^T = Wc^T G^T.
        BIE_TRY(gemm_ex(ctx, CUBLAS_OP_N, CUBLAS_OP_N, K, M, O, ws + oW, K, G, O, (float *)(ws + oCol), K, ct,
                        "grad_x"));
        struct dview gxo;
        gxo.data = NULL;
        if (c->grad_x.data) dview_make(&c->grad_x, &gxo);
        double * sum = c->grad_scale_a.data ? (double *)(ws + oSum) : NULL;
        if (sum) CU_TRY(ctx, cudaMemsetAsync(sum, 0, sizeof(double), s), "cudaMemsetAsync");
        const bool want_gb = c->grad_bias_a.data != NULL;
        struct dview gb;
        if (want_gb) dview_make(&c->grad_bias_a, &gb);
        const float * dcol = (const float *)(ws + oCol);
        if (ste_linear) {
            double * colpart = want_gb ? (double *)(ws + oGxm) : NULL;
            const dim3 grid((unsigned)((g.C + 255) / 256), (unsigned)slabs), block(32, 8);
            const int q = (int)c->quant, wgx = c->grad_x.data != NULL;
            if (x.dtype == BIE_DTYPE_F32)
                ste_rows<float><<<grid, block, 0, s>>>(x, bias, M, g.C, slab, q, sa, sw, dcol, gxo, wgx, colpart, sum);
            else if (x.dtype == BIE_DTYPE_F16)
                ste_rows<__half><<<grid, block, 0, s>>>(x, bias, M, g.C, slab, q, sa, sw, dcol, gxo, wgx, colpart, sum);
            else
                ste_rows<__nv_bfloat16><<<grid, block, 0, s>>>(x, bias, M, g.C, slab, q, sa, sw, dcol, gxo, wgx, colpart, sum);
            LAUNCHED(ctx, "STE pass (rows)");
            if (want_gb) {
                colpart_sums<<<grid_for(g.C, 256), 256, 0, s>>>(colpart, slabs, g.C, gb);
                LAUNCHED(ctx, "grad_bias_a");
            }
        } else {
            float * gxm = want_gb ? (float *)(ws + oGxm) : NULL;
            unsigned blocks = grid_for(xnumel, 256);
            if (blocks > 4096) blocks = 4096;
            ste_pass<<<blocks, 256, 0, s>>>(x, bias, g, (int)c->quant, sa, sw, dcol, gxo, c->grad_x.data != NULL, gxm, sum);
            LAUNCHED(ctx, "STE pass");
            if (gxm) {
                channel_sums<<<(unsigned)g.C, 256, 0, s>>>(gxm, g.batch * g.H * g.W, gb);
                LAUNCHED(ctx, "grad_bias_a");
            }
        }
        if (sum) {
            struct dview gs;
            dview_make(&c->grad_scale_a, &gs);
            gs.stride[3] = 0;
            const double denom = c->quant == BIE_QUANT_BINARY ? sqrt((double)xnumel)
                                                               : sqrt((double)xnumel * bie_quant_hi(c->quant));
            finish_scale_grad<<<1, 1, 0, s>>>(sum, denom, gs);
            LAUNCHED(ctx, "grad_scale_a");
        }
    }
    if (want_gw) {
        // a linear layer: row m of Acol is row m of x
        if (!launch_codes_rows(x, dgeom_one_position(g), M, K, bias, (int)c->quant, sa, gdt, ws + oCol, s))
            activation_codes<<<grid_for(M * K, 256), 256, 0, s>>>(x, bias, g, (int)c->quant, sa, gdt, ws + oCol);
        LAUNCHED(ctx, "activation codes");
        // R (row-major [O][K]) = G^T @ Acol: column-major R^T [K][O] = Acol^T [K][M] . G [M][O].
        BIE_TRY(gemm_ex(ctx, CUBLAS_OP_N, CUBLAS_OP_T, K, O, M, ws + oCol, K, G, O, (float *)(ws + oR), K, ct,
                        "grad_weight"));
        struct dview gw;
        dview_make(&c->grad_weight, &gw);
        if (g.kh == 1 && g.kw == 1 && (g.C == 1 || gw.stride[1] == 1) &&
            (gw.dtype == BIE_DTYPE_F32 || gw.dtype == BIE_DTYPE_F16 || gw.dtype == BIE_DTYPE_BF16))
            scale_rows<<<grid_for(O * ((K + 7) / 8), 256), 256, 0, s>>>((const float *)(ws + oR), O, K, sa, gw);
        else
            scatter_grad_w<<<grid_for(O * K, 256), 256, 0, s>>>((const float *)(ws + oR), g, sa, gw);
        LAUNCHED(ctx, "scatter grad_weight");
    }
    return BIE_STATUS_OK;
}
