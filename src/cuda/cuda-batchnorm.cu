// SPDX-License-Identifier: Apache-2.0
// cuda-batchnorm.cu: bie_batchnorm_forward and _backward on CUDA tensors, the math of
// bie_nn_batchnorm_forward / _backward (src/nn/nn-ops.c) in three passes each:
//   forward:  partial sums of d = x - x[0, c, 0, 0] and d^2 per block and channel (training only);
//             a per-channel finish: mean = x[0, c, 0, 0] + sum d / m, var = sum d^2 / m -
//             (sum d / m)^2, saved_*, the running statistics and a = gamma * invstd (from the
//             running statistics in eval mode); then y = round_y(fma(x - mean, a, beta) + residual)
//   backward: partial sums of g and g * (x - mean) per block and channel; a per-channel finish:
//             grad_beta = sum g, grad_gamma = invstd * sum g (x - mean), and the terms of
//             grad_x = c1 g + c2 (x - mean) + c3 with c1 = gamma invstd, k = c1 / m,
//             c2 = -k grad_gamma invstd, c3 = -k grad_beta (the reference's k (m g - ...) expanded)
// Partial sums are f32 within a block and added in double across blocks, in a fixed order (a warp
// per channel, lanes in a fixed tree), so every call gives the same bits. Dense rows of channels
// (channels-last [N, H, W, C], or [N, C]) with 8k channels, one dtype and 16-byte alignment take 8
// channels a thread with 16-byte loads, each thread keeping its channels' terms in registers;
// other views take one element a thread.
#include "cuda-impl.cuh"

namespace {

constexpr int BN_THREADS = 256;

// An [N, C, H, W] view by its strides, and a [C] vector (data NULL: absent).
struct bn_view {
    char * data;
    int dtype;
    int64_t sn, sc, sh, sw;
};
struct bn_vec {
    char * data;
    int dtype;
    int64_t st;
    __device__ float get(int64_t c, float dflt) const { return data ? ld_float(data, dtype, c * st) : dflt; }
    __device__ void put(int64_t c, float v) const {
        if (data) st_float(data, dtype, c * st, v);
    }
};
struct bn_vectors {
    bn_vec gamma, beta, rmean, rvar, smean, sinvstd, ggamma, gbeta;
};

template <typename T> __host__ __device__ constexpr int dtype_of();
template <> __host__ __device__ constexpr int dtype_of<float>() { return BIE_DTYPE_F32; }
template <> __host__ __device__ constexpr int dtype_of<__half>() { return BIE_DTYPE_F16; }
template <> __host__ __device__ constexpr int dtype_of<__nv_bfloat16>() { return BIE_DTYPE_BF16; }

bn_view view_of(const struct bie_tensor & t) {
    return {(char *)t.data, (int)t.dtype, t.stride[0], t.stride[1], t.stride[2], t.stride[3]};
}
bn_vec vec_of(const struct bie_tensor & t) { return {(char *)t.data, (int)t.dtype, t.data ? t.stride[0] : 0}; }

// Element (n, c, p) of a view, p = h W + w the pixel within an image.
__device__ __forceinline__ int64_t off3(const bn_view & v, int64_t W, int64_t n, int64_t c, int64_t p) {
    const int64_t h = qdiv(p, W);
    return n * v.sn + c * v.sc + h * v.sh + (p - h * W) * v.sw;
}
__device__ __forceinline__ float ld3(const bn_view & v, int64_t W, int64_t n, int64_t c, int64_t p) {
    return ld_float(v.data, v.dtype, off3(v, W, n, c, p));
}

// The shift of channel c's sums: x[0, c, 0, 0] in the forward, the saved mean in the backward.
template <bool BWD> __device__ __forceinline__ float shift_of(const bn_view & x, const bn_vec & smean, int64_t c) {
    return BWD ? smean.get(c, 0.0f) : ld_float(x.data, x.dtype, c * x.sc);
}
// One element into the partial sums: (d, d^2) with d = x - k, or (g, g (x - k)).
template <bool BWD> __device__ __forceinline__ void accumulate(float & s1, float & s2, float x, float g, float k) {
    const float d = x - k;
    if (BWD) {
        s1 += g;
        s2 = __fmaf_rn(g, d, s2);
    } else {
        s1 += d;
        s2 = __fmaf_rn(d, d, s2);
    }
}

// Dense rows [R, C] (C = 8 G): thread t sums 8 channels from column 8 (t % G) over the rows
// t / G, t / G + RS, ... (RS = 256 / G) of block b's rows [b rpb, (b + 1) rpb); the block then
// adds its RS partial sums of each channel in order into part[b][c].
template <typename T, bool BWD>
__global__ void __launch_bounds__(BN_THREADS)
    sums_rows(const T * x, const T * g, bn_view xv, bn_vec smean, int64_t R, int C, int64_t rpb, float2 * part) {
    extern __shared__ float2 sh[]; // [RS][C]
    const int G = C / 8, RS = BN_THREADS / G;
    const int t = threadIdx.x, r = t / G, c0 = (t % G) * 8;
    if (r < RS) {
        float s1[8] = {}, s2[8] = {}, k[8];
#pragma unroll
        for (int e = 0; e < 8; e++) k[e] = shift_of<BWD>(xv, smean, c0 + e);
        const int64_t row1 = min(R, (int64_t)(blockIdx.x + 1) * rpb);
#pragma unroll 4
        for (int64_t row = blockIdx.x * rpb + r; row < row1; row += RS) {
            float v[8], gv[8] = {};
            load8<T>(x + row * C + c0, v);
            if (BWD) load8<T>(g + row * C + c0, gv);
#pragma unroll
            for (int e = 0; e < 8; e++) accumulate<BWD>(s1[e], s2[e], v[e], gv[e], k[e]);
        }
#pragma unroll
        for (int e = 0; e < 8; e++) sh[r * C + c0 + e] = make_float2(s1[e], s2[e]);
    }
    __syncthreads();
    for (int c = t; c < C; c += BN_THREADS) {
        float a = 0.0f, b = 0.0f;
        for (int i = 0; i < RS; i++) {
            a += sh[i * C + c].x;
            b += sh[i * C + c].y;
        }
        part[(int64_t)blockIdx.x * C + c] = make_float2(a, b);
    }
}

// Any views: block (c, p) sums channel c's elements e = n HW + q in [p per, (p + 1) per), a thread
// every 256th, then a tree over the block into part[p][c].
template <bool BWD>
__global__ void __launch_bounds__(BN_THREADS) sums_any(bn_view xv, bn_view gv, bn_vec smean, int64_t C, int64_t N,
                                                       int64_t HW, int64_t W, int64_t per, float2 * part) {
    __shared__ float2 sh[BN_THREADS];
    const int64_t c = blockIdx.x, e1 = min(N * HW, (int64_t)(blockIdx.y + 1) * per);
    const float k = shift_of<BWD>(xv, smean, c);
    float s1 = 0.0f, s2 = 0.0f;
    for (int64_t e = blockIdx.y * per + threadIdx.x; e < e1; e += BN_THREADS) {
        const int64_t n = qdiv(e, HW), q = e - n * HW;
        accumulate<BWD>(s1, s2, ld3(xv, W, n, c, q), BWD ? ld3(gv, W, n, c, q) : 0.0f, k);
    }
    sh[threadIdx.x] = make_float2(s1, s2);
    __syncthreads();
    for (int w = BN_THREADS / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w)
            sh[threadIdx.x] =
                make_float2(sh[threadIdx.x].x + sh[threadIdx.x + w].x, sh[threadIdx.x].y + sh[threadIdx.x + w].y);
        __syncthreads();
    }
    if (threadIdx.x == 0) part[(int64_t)blockIdx.y * C + c] = sh[0];
}

// The P partial sums of channel c in double, by the warp of channel c: lane l adds blocks l, l + 32,
// ..., then the lanes' sums meet in a fixed tree (every lane gets the totals).
__device__ __forceinline__ void total(const float2 * part, int P, int64_t C, int64_t c, double & a, double & b) {
    const int lane = threadIdx.x % 32;
    a = 0.0;
    b = 0.0;
    for (int p = lane; p < P; p += 32) {
        const float2 v = part[(int64_t)p * C + c];
        a += v.x;
        b += v.y;
    }
    for (int o = 16; o > 0; o /= 2) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
}

constexpr int FINISH_WARPS = BN_THREADS / 32;

// Forward finish, a warp per channel: statistics, saved_*, running_*, and coef[c] = (a, beta, mean);
// channel 0's warp adds 1 to the batch counter nb (training; nb may be NULL).
__global__ void __launch_bounds__(BN_THREADS)
    finish_forward(const float2 * part, int P, int64_t C, int64_t m, bn_view xv, bn_vectors v, float momentum,
                   float eps, int training, long long * nb, float4 * coef) {
    const int64_t c = blockIdx.x * (int64_t)FINISH_WARPS + threadIdx.x / 32;
    if (c >= C) return;
    double mean, var;
    if (training) {
        double s1, s2;
        total(part, P, C, c, s1, s2);
        const double d = s1 / (double)m;
        mean = (double)shift_of<false>(xv, v.smean, c) + d;
        var = fmax(s2 / (double)m - d * d, 0.0);
    } else {
        mean = v.rmean.get(c, 0.0f);
        var = v.rvar.get(c, 0.0f);
    }
    if (threadIdx.x % 32) return;
    if (training && nb && c == 0) *nb += 1;
    if (training) {
        const float rm = v.rmean.get(c, 0.0f), rv = v.rvar.get(c, 0.0f);
        const double unbiased = m > 1 ? var * (double)m / (double)(m - 1) : var;
        v.rmean.put(c, rm + momentum * ((float)mean - rm));
        v.rvar.put(c, rv + momentum * ((float)unbiased - rv));
    }
    const float invstd = (float)(1.0 / sqrt(var + (double)eps));
    if (training) {
        v.smean.put(c, (float)mean);
        v.sinvstd.put(c, invstd);
    }
    coef[c] = make_float4(v.gamma.get(c, 1.0f) * invstd, v.beta.get(c, 0.0f), (float)mean, 0.0f);
}

// Backward finish, a warp per channel: grad_beta, grad_gamma and coef[c] = (c1, c2, c3, mean).
__global__ void __launch_bounds__(BN_THREADS)
    finish_backward(const float2 * part, int P, int64_t C, int64_t m, bn_vectors v, float4 * coef) {
    const int64_t c = blockIdx.x * (int64_t)FINISH_WARPS + threadIdx.x / 32;
    if (c >= C) return;
    double sg, sgd;
    total(part, P, C, c, sg, sgd);
    if (threadIdx.x % 32) return;
    const float mean = v.smean.get(c, 0.0f), invstd = v.sinvstd.get(c, 0.0f);
    const float ggamma = (float)(sgd * (double)invstd), gbeta = (float)sg;
    v.gbeta.put(c, gbeta);
    v.ggamma.put(c, ggamma);
    const float c1 = v.gamma.get(c, 1.0f) * invstd, k = c1 / (float)m;
    coef[c] = make_float4(c1, -k * ggamma * invstd, -k * gbeta, mean);
}

// The dense-rows passes run blocks of a multiple of G = C / 8 threads and grids of whole blocks,
// so that thread t always has the 8 channels from 8 (t % G) and reads their terms once; 8 blocks a
// multiprocessor, so that a thread handles many vectors for one read of its terms.
inline int rows_block(int G) { return G * (BN_THREADS / G); }
inline unsigned rows_grid(bie_context_t * ctx, int64_t n8, int bt) {
    const int64_t most = 8 * (int64_t)(bie_cuda_sm_count(ctx) > 0 ? bie_cuda_sm_count(ctx) : 132);
    const int64_t b = (n8 + bt - 1) / bt;
    return (unsigned)(b < most ? b : most);
}

// y = round(fma(x - mean, a, beta) + residual) on dense rows, 8 channels a thread (n8 = R C / 8
// vectors).
template <typename T>
__global__ void __launch_bounds__(BN_THREADS)
    apply_rows(const T * x, const T * res, T * y, int64_t n8, int G, const float4 * coef) {
    const int c0 = (int)(threadIdx.x % G) * 8;
    float4 k[8];
#pragma unroll
    for (int e = 0; e < 8; e++) k[e] = coef[c0 + e];
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
        float v[8], r[8] = {};
        load8<T>(x + i * 8, v);
        if (res) load8<T>(res + i * 8, r);
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = __fmaf_rn(v[e] - k[e].z, k[e].x, k[e].y) + r[e];
        store8((char *)y, dtype_of<T>(), i * 8, v);
    }
}

// grad_x = round(c1 g + c2 (x - mean) + c3) on dense rows, 8 channels a thread.
template <typename T>
__global__ void __launch_bounds__(BN_THREADS)
    grad_rows(const T * x, const T * g, T * gx, int64_t n8, int G, const float4 * coef) {
    const int c0 = (int)(threadIdx.x % G) * 8;
    float4 k[8];
#pragma unroll
    for (int e = 0; e < 8; e++) k[e] = coef[c0 + e];
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
        float v[8], gv[8];
        load8<T>(x + i * 8, v);
        load8<T>(g + i * 8, gv);
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = __fmaf_rn(k[e].y, v[e] - k[e].w, __fmaf_rn(k[e].x, gv[e], k[e].z));
        store8((char *)gx, dtype_of<T>(), i * 8, v);
    }
}

// The same two maps on any views, one element a thread in [N, C, H, W] order.
__global__ void apply_any(bn_view xv, bn_view rv, bn_view yv, int64_t C, int64_t HW, int64_t W, int64_t n,
                          const float4 * coef) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t q = qdiv(e, HW), p = e - q * HW, b = qdiv(q, C), c = q - b * C;
        const float4 k = coef[c];
        const float r = rv.data ? ld3(rv, W, b, c, p) : 0.0f;
        st_float(yv.data, yv.dtype, off3(yv, W, b, c, p), __fmaf_rn(ld3(xv, W, b, c, p) - k.z, k.x, k.y) + r);
    }
}
__global__ void grad_any(bn_view xv, bn_view gv, bn_view dv, int64_t C, int64_t HW, int64_t W, int64_t n,
                         const float4 * coef) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t q = qdiv(e, HW), p = e - q * HW, b = qdiv(q, C), c = q - b * C;
        const float4 k = coef[c];
        const float v = __fmaf_rn(k.y, ld3(xv, W, b, c, p) - k.w, __fmaf_rn(k.x, ld3(gv, W, b, c, p), k.z));
        st_float(dv.data, dv.dtype, off3(dv, W, b, c, p), v);
    }
}

// Whether t (absent: yes) is dense rows of channels (channels-last [N, H, W, C]) of dtype dt at a
// 16-byte aligned address.
bool dense_rows(const struct bie_bn_call * c, const struct bie_tensor & t, enum bie_dtype dt) {
    if (!t.data) return true;
    const int64_t C = c->C, W = c->W, H = c->H;
    return t.dtype == dt && (uintptr_t)t.data % 16 == 0 && (C == 1 || t.stride[1] == 1) &&
           (W == 1 || t.stride[3] == C) && (H == 1 || t.stride[2] == W * C) && (c->N == 1 || t.stride[0] == H * W * C);
}
// The vectorised route: every view dense rows of x's dtype, 8k channels, at most 256 groups of 8.
bool rows_route(const struct bie_bn_call * c, const struct bie_tensor * const * ts, int n) {
    if (c->C % 8 || c->C > 8 * BN_THREADS) return false;
    for (int i = 0; i < n; i++)
        if (!dense_rows(c, *ts[i], c->x.dtype)) return false;
    return true;
}

bn_vectors vectors_of(const struct bie_bn_call * c) {
    return {vec_of(c->gamma),      vec_of(c->beta),         vec_of(c->running_mean), vec_of(c->running_var),
            vec_of(c->saved_mean), vec_of(c->saved_invstd), vec_of(c->grad_gamma),   vec_of(c->grad_beta)};
}

// The most partial sums a call makes per channel (the workspace holds that many rows of C).
int max_parts(bie_context_t * ctx) {
    const int sm = bie_cuda_sm_count(ctx);
    return 4 * (sm > 0 ? sm : 132);
}

template <typename T, bool BWD>
void launch_sums_rows(const struct bie_bn_call * c, const struct bie_tensor & g, int P, int64_t rpb, float2 * part,
                      cudaStream_t s) {
    const int G = (int)(c->C / 8), RS = BN_THREADS / G;
    const size_t smem = (size_t)RS * (size_t)c->C * sizeof(float2);
    sums_rows<T, BWD><<<P, BN_THREADS, smem, s>>>((const T *)c->x.data, (const T *)g.data, view_of(c->x),
                                                  vec_of(c->saved_mean), c->N * c->H * c->W, (int)c->C, rpb, part);
}

// The partial sums of a call (forward: of x; backward: of grad_y and x) into part[P][C], P in *P:
// blocks of about 8 rows a thread on dense rows, else blocks of about 8 elements a thread per channel,
// at most max_parts blocks in all.
template <bool BWD>
enum bie_status sums(bie_context_t * ctx, const struct bie_bn_call * c, bool rows, float2 * part, int * P) {
    const cudaStream_t s = ctx->cuda->stream;
    const int64_t m = c->N * c->H * c->W, cap = max_parts(ctx);
    if (rows) {
        const int RS = BN_THREADS / (int)(c->C / 8);
        int64_t p = (m + RS * 8 - 1) / (RS * 8);
        p = p < 1 ? 1 : p > cap ? cap : p;
        const int64_t rpb = (m + p - 1) / p;
        *P = (int)((m + rpb - 1) / rpb);
        const struct bie_tensor & g = c->grad_y;
        if (c->x.dtype == BIE_DTYPE_F16) launch_sums_rows<__half, BWD>(c, g, *P, rpb, part, s);
        else if (c->x.dtype == BIE_DTYPE_BF16) launch_sums_rows<__nv_bfloat16, BWD>(c, g, *P, rpb, part, s);
        else launch_sums_rows<float, BWD>(c, g, *P, rpb, part, s);
    } else {
        int64_t p = (m + BN_THREADS * 8 - 1) / (BN_THREADS * 8), most = cap / c->C;
        most = most < 1 ? 1 : most > 65535 ? 65535 : most;
        p = p < 1 ? 1 : p > most ? most : p;
        const int64_t per = (m + p - 1) / p;
        *P = (int)((m + per - 1) / per);
        sums_any<BWD><<<dim3((unsigned)c->C, (unsigned)*P), BN_THREADS, 0, s>>>(
            view_of(c->x), view_of(c->grad_y), vec_of(c->saved_mean), c->C, c->N, c->H * c->W, c->W, per, part);
    }
    LAUNCHED(ctx, BWD ? "batch norm backward sums" : "batch norm statistics");
    return BIE_STATUS_OK;
}

// Workspace: the partial sums (max_parts x C float2) and the per-channel terms (C float4).
enum bie_status workspace(bie_context_t * ctx, int64_t C, float2 ** part, float4 ** coef) {
    size_t size[2] = {(size_t)max_parts(ctx) * (size_t)C * sizeof(float2), (size_t)C * sizeof(float4)}, off[2];
    char * ws;
    BIE_TRY(bie_cuda_workspace(ctx, ws_layout(size, off, 2), (void **)&ws));
    *part = (float2 *)(ws + off[0]);
    *coef = (float4 *)(ws + off[1]);
    return BIE_STATUS_OK;
}

template <typename T>
void launch_apply_rows(bie_context_t * ctx, const struct bie_bn_call * c, const float4 * coef, cudaStream_t s) {
    const int64_t n8 = c->N * c->H * c->W * c->C / 8;
    const int G = (int)(c->C / 8), bt = rows_block(G);
    apply_rows<T><<<rows_grid(ctx, n8, bt), bt, 0, s>>>((const T *)c->x.data, (const T *)c->residual.data,
                                                        (T *)c->y.data, n8, G, coef);
}
template <typename T>
void launch_grad_rows(bie_context_t * ctx, const struct bie_bn_call * c, const float4 * coef, cudaStream_t s) {
    const int64_t n8 = c->N * c->H * c->W * c->C / 8;
    const int G = (int)(c->C / 8), bt = rows_block(G);
    grad_rows<T><<<rows_grid(ctx, n8, bt), bt, 0, s>>>((const T *)c->x.data, (const T *)c->grad_y.data,
                                                       (T *)c->grad_x.data, n8, G, coef);
}

} // namespace

extern "C" enum bie_status bie_cuda_batchnorm_forward(bie_context_t * ctx, const struct bie_bn_call * c) {
    struct bie_cuda_state * st;
    BIE_TRY(bie_cuda_state_get(ctx, c->device_index, &st));
    float2 * part;
    float4 * coef;
    BIE_TRY(workspace(ctx, c->C, &part, &coef));
    const struct bie_tensor * views[3] = {&c->x, &c->y, &c->residual};
    const bool rows = rows_route(c, views, 3);
    int P = 0;
    if (c->training) BIE_TRY(sums<false>(ctx, c, rows, part, &P));
    finish_forward<<<grid_for(c->C, FINISH_WARPS), BN_THREADS, 0, st->stream>>>(
        part, P, c->C, c->N * c->H * c->W, view_of(c->x), vectors_of(c), c->momentum, c->eps, c->training,
        (long long *)c->num_batches, coef);
    LAUNCHED(ctx, "batch norm statistics");
    if (!c->y.data) return BIE_STATUS_OK; // (the statistics only)
    if (rows) {
        if (c->x.dtype == BIE_DTYPE_F16) launch_apply_rows<__half>(ctx, c, coef, st->stream);
        else if (c->x.dtype == BIE_DTYPE_BF16) launch_apply_rows<__nv_bfloat16>(ctx, c, coef, st->stream);
        else launch_apply_rows<float>(ctx, c, coef, st->stream);
    } else {
        const int64_t n = c->N * c->C * c->H * c->W;
        apply_any<<<grid_for(n, BN_THREADS), BN_THREADS, 0, st->stream>>>(
            view_of(c->x), view_of(c->residual), view_of(c->y), c->C, c->H * c->W, c->W, n, coef);
    }
    LAUNCHED(ctx, "batch norm");
    return BIE_STATUS_OK;
}

extern "C" enum bie_status bie_cuda_batchnorm_backward(bie_context_t * ctx, const struct bie_bn_call * c) {
    struct bie_cuda_state * st;
    BIE_TRY(bie_cuda_state_get(ctx, c->device_index, &st));
    float2 * part;
    float4 * coef;
    BIE_TRY(workspace(ctx, c->C, &part, &coef));
    const struct bie_tensor * views[3] = {&c->x, &c->grad_y, &c->grad_x};
    const bool rows = rows_route(c, views, 3);
    int P = 0;
    BIE_TRY(sums<true>(ctx, c, rows, part, &P));
    finish_backward<<<grid_for(c->C, FINISH_WARPS), BN_THREADS, 0, st->stream>>>(part, P, c->C, c->N * c->H * c->W,
                                                                                 vectors_of(c), coef);
    LAUNCHED(ctx, "batch norm backward");
    if (!c->grad_x.data) return BIE_STATUS_OK;
    if (rows) {
        if (c->x.dtype == BIE_DTYPE_F16) launch_grad_rows<__half>(ctx, c, coef, st->stream);
        else if (c->x.dtype == BIE_DTYPE_BF16) launch_grad_rows<__nv_bfloat16>(ctx, c, coef, st->stream);
        else launch_grad_rows<float>(ctx, c, coef, st->stream);
    } else {
        const int64_t n = c->N * c->C * c->H * c->W;
        grad_any<<<grid_for(n, BN_THREADS), BN_THREADS, 0, st->stream>>>(
            view_of(c->x), view_of(c->grad_y), view_of(c->grad_x), c->C, c->H * c->W, c->W, n, coef);
    }
    LAUNCHED(ctx, "batch norm backward");
    return BIE_STATUS_OK;
}
