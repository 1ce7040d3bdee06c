// SPDX-License-Identifier: Apache-2.0
// cuda-wq.cu: the CUDA backend of the weight-only n-bit layer (wq-impl.h; equations in bie.h and
// src/ref/ref-wq.c).
//
// Decode (M <= 32 rows), f16/bf16 x, uniform 2/4/8 bits, N % 4 == 0, groups of whole chunks: the
// mma kernel of cuda-wq-decode.cu.
// Everything else with M <= 16 (3, 5, 6, 7 bits, mixed bits, f32 x, odd N): wq_simt_kernel, one
// column per thread, W computed per element exactly as the reference does.
// M > 32 where the mma kernel takes the call and a few passes of 32 rows through it cost less than
// the prefill (decode_passes: large weights, small M): those passes.
// Else (prefill) and grad_x: the weight is dequantised to x's dtype in panels
// (wq_dequant_words for uniform 2/4/8 bits in groups of whole words, else wq_dequant_kernel) and
// cuBLAS multiplies (f32 accumulation); grad_w = x'^T g is one cuBLAS GEMM.
#include <string.h>

#include <type_traits>

#include "cuda/cuda-wq.cuh"

// --- x' for the kernels -----------------------------------------------------------------------------

// xo[m][r] = x'[m, r] as To (dense [M][K]).
template <typename To> __global__ void wq_xdense_kernel(wq_x a, int64_t M, int64_t K, To * xo) {
    const int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= M * K) return;
    xo[id] = from_f32<To>(wq_xprime(a, id / K, id % K, K));
}

// --- the generic decode kernel ----------------------------------------------------------------------

// grid (ceil(N/128), S); thread = column, K range [y*rps, ...): part[y][m][n] = sum x'[m, r] W[r, n].
__global__ void __launch_bounds__(128) wq_simt_kernel(wq_dev w, const float * xf, int M, int64_t rps, float * part) {
    const int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= w.N) return;
    const int64_t r0 = (int64_t)blockIdx.y * rps, r1 = r0 + rps < w.K ? r0 + rps : w.K;
    float acc[WQ_MAX_DECODE_M];
#pragma unroll
    for (int m = 0; m < WQ_MAX_DECODE_M; m++) acc[m] = 0.0f;
    for (int64_t r = r0; r < r1; r++) {
        const float v = wq_value(w, r, n);
#pragma unroll
        for (int m = 0; m < WQ_MAX_DECODE_M; m++)
            if (m < M) acc[m] += xf[m * w.K + r] * v;
    }
    float * p = part + (int64_t)blockIdx.y * M * w.N;
    for (int m = 0; m < M; m++) p[m * w.N + n] = acc[m];
}

// y[m, n] = sum over splits of part (in split order) + bias[n].
__global__ void wq_reduce_kernel(const float * part, int S, int64_t M, int64_t N, dview bias, dview y) {
    griddep_wait(); // the partial sums are written (launched as a programmatic dependent)
    const int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= M * N) return;
    float v = 0.0f;
    for (int s = 0; s < S; s++) v += part[s * M * N + id];
    const int64_t m = id / N, n = id % N;
    if (bias.data) v += ld_float(bias.data, bias.dtype, n * bias.stride[3]);
    st_float(y.data, y.dtype, m * y.stride[2] + n * y.stride[3], v);
}

// --- dequantisation ---------------------------------------------------------------------------------

// w_out[(r - r0) * ldo + (n - n0)] = W[r, n] for r0 <= r < r1, n0 <= n < n1 (To: f32/f16/bf16).
template <typename To>
__global__ void wq_dequant_kernel(wq_dev w, int64_t r0, int64_t r1, int64_t n0, int64_t n1, To * out, int64_t ldo) {
    const int64_t nn = n1 - n0, id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (r1 - r0) * nn) return;
    const int64_t r = r0 + id / nn, n = n0 + id % nn;
    out[(r - r0) * ldo + (n - n0)] = from_f32<To>(wq_value(w, r, n));
}

// C (1 or 4) values of To from f32, stored at p: one store of C * sizeof(To) bytes (p aligned to it).
template <typename To, int C> __device__ __forceinline__ void st_values(To * p, const float (&v)[C]) {
    if constexpr (C == 1) {
        *p = from_f32<To>(v[0]);
    } else {
        static_assert(C == 4, "four values a store");
        if constexpr (std::is_same<To, float>::value) {
            *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
        } else {
            const To t[4] = {from_f32<To>(v[0]), from_f32<To>(v[1]), from_f32<To>(v[2]), from_f32<To>(v[3])};
            uint2 u;
            memcpy(&u, t, sizeof u);
            *(uint2 *)p = u;
        }
    }
}

// The same for uniform 2, 4 or 8 bits with groups of whole words (r0 a word's first row): a thread
// takes C adjacent columns of a word row (C = 4: one 16-byte load of their words, where N, n0 and
// ldo are multiples of 4 and out is aligned for C values), reads their groups' scales and zeros once
// and writes their 32/b rows, C values a store, coalesced over the columns. A code q becomes a float
// exactly as the bits of 2^23 + q less 2^23.
// grid (ceil((n1 - n0) / (256 * C)), word rows, strided).
template <typename To, int B, int C>
__global__ void __launch_bounds__(256)
    wq_dequant_words(wq_dev w, int64_t r0, int64_t r1, int64_t n0, int64_t n1, To * out, int64_t ldo) {
    constexpr int V = 32 / B;
    constexpr uint32_t mask = (1u << B) - 1u;
    const int64_t n = n0 + ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * C;
    if (n >= n1) return;
    for (int64_t i = r0 / V + blockIdx.y; i * V < r1; i += gridDim.y) {
        uint32_t word[C];
        if constexpr (C == 4) {
            const uint4 q4 = *(const uint4 *)(w.qw + i * w.N + n);
            word[0] = q4.x, word[1] = q4.y, word[2] = q4.z, word[3] = q4.w;
        } else {
            word[0] = w.qw[i * w.N + n];
        }
        const int64_t g = qdiv(i * V, w.gs), e = g * w.N + n;
        float s[C], z[C];
#pragma unroll
        for (int c = 0; c < C; c++) {
            s[c] = ld_float(w.scales, w.sdt, e + c);
            z[c] = wq_zero(w, g, n + c, B);
        }
        To * o = out + (i * V - r0) * ldo + (n - n0);
#pragma unroll
        for (int v = 0; v < V; v++) {
            if (i * V + v >= r1) break;
            float y[C];
#pragma unroll
            for (int c = 0; c < C; c++) {
                const float q = __uint_as_float(0x4B000000u | ((word[c] >> (B * v)) & mask)) - 8388608.0f;
                y[c] = wq_weight(w.zero, s[c], z[c], q);
            }
            st_values<To, C>(o + v * ldo, y);
        }
    }
}

// y[m, n] = bias[n] (the C operand of a GEMM with beta = 1).
template <typename T> __global__ void wq_bias_fill_kernel(dview bias, int64_t M, int64_t N, T * y, int64_t ldy) {
    const int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= M * N) return;
    y[(id / N) * ldy + id % N] = from_f32<T>(ld_float(bias.data, bias.dtype, (id % N) * bias.stride[3]));
}

// y (any view) = ybuf (f32 [M][N]) + bias.
__global__ void wq_store_kernel(const float * ybuf, int64_t M, int64_t N, dview bias, dview y) {
    const int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= M * N) return;
    float v = ybuf[id];
    if (bias.data) v += ld_float(bias.data, bias.dtype, (id % N) * bias.stride[3]);
    st_float(y.data, y.dtype, (id / N) * y.stride[2] + (id % N) * y.stride[3], v);
}

// grad_x[m, perm[r]] = gxr[m][r] * channel_scale[perm[r]].
__global__ void wq_scatter_kernel(const float * gxr, int64_t M, int64_t K, wq_x a, dview gx) {
    const int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= M * K) return;
    const int64_t m = id / K, r = id % K;
    int64_t k = a.perm ? (int64_t)a.perm[r] : r;
    k = k < 0 ? 0 : k >= K ? K - 1 : k;
    float v = gxr[id];
    if (a.cs) v *= ld_float(a.cs, a.csdt, k);
    st_float(gx.data, gx.dtype, m * gx.stride[2] + k * gx.stride[3], v);
}

// --- host side ----------------------------------------------------------------------------------------

static wq_dev dev_of(const struct bie_wq_call * c, const int32_t * gbits, const int64_t * gword) {
    wq_dev w;
    w.qw = (const uint32_t *)c->qweight.data;
    w.K = c->K;
    w.N = c->N;
    w.rows = c->rows;
    w.G = c->G;
    w.gs = c->gs;
    w.bits = c->bits;
    w.gbits = gbits;
    w.gword = gword;
    w.zero = (int)c->zero;
    w.scales = (const char *)c->scales.data;
    w.zeros = (const char *)c->zeros.data;
    w.sdt = (int)c->scales.dtype;
    w.zdt = c->zeros.data ? (int)c->zeros.dtype : (int)BIE_DTYPE_F32;
    return w;
}

static dview view_or_null(const struct bie_tensor * t) {
    dview v;
    memset(&v, 0, sizeof v);
    if (t->data) dview_make(t, &v);
    return v;
}

// The device copies of the group table (mixed bits only), carved from the workspace.
static enum bie_status upload_groups(bie_context_t * ctx, const struct bie_wq_call * c, wq_ws & a, int32_t ** gb,
                                     int64_t ** gw) {
    *gb = NULL;
    *gw = NULL;
    if (c->bits) return BIE_STATUS_OK;
    if (ctx->cuda->recording) // (a replay would read the host tables again, as they are then)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "wq: a mixed-bits call copies host tables: not recorded");
    *gb = (int32_t *)take(a, (size_t)c->G * sizeof(int32_t));
    *gw = (int64_t *)take(a, (size_t)(c->G + 1) * sizeof(int64_t));
    CU_TRY(
        ctx,
        cudaMemcpyAsync(*gb, c->group_bits, (size_t)c->G * sizeof(int32_t), cudaMemcpyHostToDevice, ctx->cuda->stream),
        "wq: group bits");
    CU_TRY(ctx,
           cudaMemcpyAsync(*gw, c->group_word, (size_t)(c->G + 1) * sizeof(int64_t), cudaMemcpyHostToDevice,
                           ctx->cuda->stream),
           "wq: group words");
    return BIE_STATUS_OK;
}
static size_t groups_bytes(const struct bie_wq_call * c) {
    return c->bits ? 0 : ((size_t)c->G * 4 + 255) / 256 * 256 + ((size_t)(c->G + 1) * 8 + 255) / 256 * 256;
}

// Splits of the K range so that about 24 warps per multiprocessor are busy.
static int64_t splits(bie_context_t * ctx, int64_t col_warps, int64_t units) {
    const int sm = bie_cuda_sm_count(ctx) > 0 ? bie_cuda_sm_count(ctx) : 132;
    int64_t s = (24 * (int64_t)sm + col_warps - 1) / col_warps;
    if (s > units) s = units;
    return s < 1 ? 1 : s;
}

// The decode split: S K ranges of `per` chunks (mma) or rows (SIMT) each.
static void decode_plan(bie_context_t * ctx, const struct bie_wq_call * c, int64_t * S, int64_t * per) {
    if (wq_mma_ok(c)) return wq_mma_plan(ctx, c, S, per);
    const int64_t s0 = splits(ctx, (c->N + 31) / 32, (c->K + 15) / 16);
    const int64_t rps = (c->K + s0 - 1) / s0;
    *per = rps;
    *S = (c->K + rps - 1) / rps;
}

// The decode's workspace: the groups, x' and its chunk sums (mma) or x in f32 (SIMT), the partial sums.
static size_t decode_bytes(const struct bie_wq_call * c, int64_t S) {
    const size_t kp = (size_t)(c->K + 127);
    return groups_bytes(c) + (size_t)c->M * kp * 8 + (size_t)(c->M * c->K) * 4 + (size_t)S * c->M * c->N * 4 + 4096;
}

static cudaDataType cuda_type(enum bie_dtype d) {
    return d == BIE_DTYPE_F16 ? CUDA_R_16F : d == BIE_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

// cuBLAS math for a GEMM on dt operands: the default (tensor cores) for f16/bf16; f32 keeps the
// context's pedantic mode (no TF32), which bie_cuda_cublas sets and every use here restores.
static void math_for(cublasHandle_t h, enum bie_dtype dt) {
    cublasSetMathMode(h, dt == BIE_DTYPE_F32 ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH);
}

static enum bie_status cublas_ok(bie_context_t * ctx, cublasStatus_t st, const char * what) {
    if (st == CUBLAS_STATUS_SUCCESS) return BIE_STATUS_OK;
    if (ctx->cuda->cublas) cublasSetMathMode(ctx->cuda->cublas, CUBLAS_PEDANTIC_MATH);
    return bie_set_error(ctx, BIE_STATUS_DEVICE_ERROR, "cuda: %s: %s", what, cublasGetStatusString(st));
}

template <typename T, int C>
static enum bie_status launch_dequant_words(bie_context_t * ctx, dim3 grid, int b, const wq_dev & w, int64_t r0,
                                            int64_t r1, int64_t n0, int64_t n1, T * out, int64_t ldo) {
    cudaStream_t st = ctx->cuda->stream;
    if (b == 2) wq_dequant_words<T, 2, C><<<grid, 256, 0, st>>>(w, r0, r1, n0, n1, out, ldo);
    else if (b == 4) wq_dequant_words<T, 4, C><<<grid, 256, 0, st>>>(w, r0, r1, n0, n1, out, ldo);
    else wq_dequant_words<T, 8, C><<<grid, 256, 0, st>>>(w, r0, r1, n0, n1, out, ldo);
    LAUNCHED(ctx, "wq_dequant_words");
    return BIE_STATUS_OK;
}

template <typename T>
static enum bie_status launch_dequant(bie_context_t * ctx, const wq_dev & w, int64_t r0, int64_t r1, int64_t n0,
                                      int64_t n1, void * out, int64_t ldo) {
    const int b = w.bits, V = b ? 32 / b : 1;
    if ((b == 2 || b == 4 || b == 8) && (w.G == 1 || w.gs % V == 0) && r0 % V == 0) {
        const int64_t i0 = r0 / V, i1 = (r1 + V - 1) / V;
        const bool quads = w.N % 4 == 0 && n0 % 4 == 0 && (n1 - n0) % 4 == 0 && ldo % 4 == 0 &&
                           (uintptr_t)w.qw % 16 == 0 && (uintptr_t)out % (4 * sizeof(T)) == 0;
        const dim3 grid(blocks_for(n1 - n0, quads ? 1024 : 256), (unsigned)(i1 - i0 < 65535 ? i1 - i0 : 65535));
        if (quads) return launch_dequant_words<T, 4>(ctx, grid, b, w, r0, r1, n0, n1, (T *)out, ldo);
        return launch_dequant_words<T, 1>(ctx, grid, b, w, r0, r1, n0, n1, (T *)out, ldo);
    }
    wq_dequant_kernel<T>
        <<<blocks_for((r1 - r0) * (n1 - n0), 256), 256, 0, ctx->cuda->stream>>>(w, r0, r1, n0, n1, (T *)out, ldo);
    LAUNCHED(ctx, "wq_dequant_kernel");
    return BIE_STATUS_OK;
}
static enum bie_status dequant_as(bie_context_t * ctx, enum bie_dtype dt, const wq_dev & w, int64_t r0, int64_t r1,
                                  int64_t n0, int64_t n1, void * out, int64_t ldo) {
    if (dt == BIE_DTYPE_F16) return launch_dequant<__half>(ctx, w, r0, r1, n0, n1, out, ldo);
    if (dt == BIE_DTYPE_BF16) return launch_dequant<__nv_bfloat16>(ctx, w, r0, r1, n0, n1, out, ldo);
    return launch_dequant<float>(ctx, w, r0, r1, n0, n1, out, ldo);
}

static size_t esize(enum bie_dtype d) { return d == BIE_DTYPE_F32 ? 4 : 2; }

// x' as a dense [M][K] buffer of dtype dt (x itself when it is one already).
static enum bie_status dense_x(bie_context_t * ctx, const struct bie_wq_call * c, enum bie_dtype dt, wq_ws & a,
                               const void ** out) {
    const struct bie_tensor * x = &c->x;
    if (!c->perm.data && !c->channel_scale.data && x->dtype == dt && x->stride[1] == 1 && x->stride[0] == c->K) {
        *out = x->data;
        return BIE_STATUS_OK;
    }
    void * p = take(a, (size_t)(c->M * c->K) * esize(dt));
    const unsigned nb = blocks_for(c->M * c->K, 256);
    const wq_x xa = x_of(c, x);
    if (dt == BIE_DTYPE_F16) wq_xdense_kernel<__half><<<nb, 256, 0, ctx->cuda->stream>>>(xa, c->M, c->K, (__half *)p);
    else if (dt == BIE_DTYPE_BF16)
        wq_xdense_kernel<__nv_bfloat16><<<nb, 256, 0, ctx->cuda->stream>>>(xa, c->M, c->K, (__nv_bfloat16 *)p);
    else wq_xdense_kernel<float><<<nb, 256, 0, ctx->cuda->stream>>>(xa, c->M, c->K, (float *)p);
    LAUNCHED(ctx, "wq_xdense_kernel");
    *out = p;
    return BIE_STATUS_OK;
}

#define WQ_PANEL_BYTES ((size_t)64 << 20) // dequantised weight panel (prefill)

// The width of the panels that split `total` columns (rows) of `unit` bytes each: as few panels of
// at most WQ_PANEL_BYTES as cover them, equally wide in multiples of 256 (one narrow last panel
// would run a GEMM too thin for the tensor cores).
static int64_t panel_width(int64_t total, size_t unit) {
    int64_t most = (int64_t)(WQ_PANEL_BYTES / unit) / 256 * 256;
    if (most < 256) most = 256;
    const int64_t panels = (total + most - 1) / most, w = ((total + panels - 1) / panels + 255) / 256 * 256;
    return w < total ? w : total;
}

static enum bie_status forward_gemm(bie_context_t * ctx, const struct bie_wq_call * c, const wq_dev & w, wq_ws & a) {
    const enum bie_dtype dt = c->x.dtype;
    const size_t es = esize(dt);
    const struct bie_tensor * y = &c->y;
    const bool direct = y->dtype == dt && y->stride[1] == 1 && y->stride[0] == c->N;
    const void * xd;
    BIE_TRY(dense_x(ctx, c, dt, a, &xd));
    const int64_t np = panel_width(c->N, es * (size_t)c->K);
    void * wp = take(a, (size_t)c->K * np * es);
    float * ybuf = direct ? NULL : (float *)take(a, (size_t)(c->M * c->N) * 4);
    cublasHandle_t h;
    BIE_TRY(bie_cuda_cublas(ctx, &h));
    const dview bias = view_or_null(&c->bias);
    const bool fill = direct && c->bias.data;
    if (fill) {
        const unsigned nb = blocks_for(c->M * c->N, 256);
        if (dt == BIE_DTYPE_F16)
            wq_bias_fill_kernel<__half><<<nb, 256, 0, ctx->cuda->stream>>>(bias, c->M, c->N, (__half *)y->data, c->N);
        else if (dt == BIE_DTYPE_BF16)
            wq_bias_fill_kernel<__nv_bfloat16>
                <<<nb, 256, 0, ctx->cuda->stream>>>(bias, c->M, c->N, (__nv_bfloat16 *)y->data, c->N);
        else wq_bias_fill_kernel<float><<<nb, 256, 0, ctx->cuda->stream>>>(bias, c->M, c->N, (float *)y->data, c->N);
        LAUNCHED(ctx, "wq_bias_fill_kernel");
    }
    const float one = 1.0f, beta = fill ? 1.0f : 0.0f;
    math_for(h, dt);
    for (int64_t n0 = 0; n0 < c->N; n0 += np) {
        const int64_t nb = c->N - n0 < np ? c->N - n0 : np;
        BIE_TRY(dequant_as(ctx, dt, w, 0, c->K, n0, n0 + nb, wp, nb));
        // Column-major view: y^T[N, M] = W^T[N, K] x'^T[K, M].
        void * yp = direct ? (void *)((char *)y->data + (size_t)n0 * es) : (void *)(ybuf + n0);
        BIE_TRY(cublas_ok(ctx,
                          cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)nb, (int)c->M, (int)c->K, &one, wp,
                                       cuda_type(dt), (int)nb, xd, cuda_type(dt), (int)c->K, &beta, yp,
                                       direct ? cuda_type(dt) : CUDA_R_32F, (int)c->N, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT),
                          "cublasGemmEx (wq forward)"));
    }
    math_for(h, BIE_DTYPE_F32);
    if (!direct) {
        dview yv;
        dview_make(y, &yv);
        wq_store_kernel<<<blocks_for(c->M * c->N, 256), 256, 0, ctx->cuda->stream>>>(ybuf, c->M, c->N, bias, yv);
        LAUNCHED(ctx, "wq_store_kernel");
    }
    return BIE_STATUS_OK;
}

static size_t gemm_bytes(const struct bie_wq_call * c, enum bie_dtype dt) {
    const size_t es = esize(dt);
    return groups_bytes(c) + (size_t)(c->M * c->K) * es + WQ_PANEL_BYTES + (size_t)c->K * 256 * es +
           (size_t)(c->M * c->N) * 4 + 4096;
}

// Passes of WQ_MMA_MAX_M rows through the decode kernel that cost less than the prefill path
// for this call (0 where the decode kernel does not take it). Both are counted in bytes moved at the
// device's copy rate: a pass of 32 rows costs about three times the codes' bytes (its mma work, more
// than the codes' reads, sets its pace) and a fixed cost (its launches, the blocks' prologues, the
// split's partial sums) of about WQ_PASS_FIXED_BYTES; the prefill reads the codes, writes the weight
// in x's dtype, reads it back and cuBLAS reads it again. On an H200 this picks the faster path at
// each LLaMA shape of bench-llm-cuda.c at M = 64 and 256. BIE_CUDA_WQ=passes (read once per
// context, bie_cuda_cc) takes the passes wherever the kernel does, for the tests.
#define WQ_PASS_FIXED_BYTES (40.0 * (1 << 20))
static int64_t decode_passes(bie_context_t * ctx, const struct bie_wq_call * c) {
    struct bie_wq_call p = *c;
    p.M = WQ_MMA_MAX_M;
    if (!wq_mma_ok(&p)) return 0;
    bie_cuda_cc(ctx);
    if (ctx->cuda->force_wq_passes) return INT64_MAX;
    const double q = (double)c->rows * (double)c->N * 4.0, w = (double)c->K * (double)c->N * (double)esize(c->x.dtype);
    return (int64_t)((q + 3.0 * w) / (3.0 * q + WQ_PASS_FIXED_BYTES));
}

// Rows m0 .. m0+rows-1 of the 2-D view t.
static struct bie_tensor row_slice(const struct bie_tensor * t, int64_t m0, int64_t rows) {
    struct bie_tensor r = *t;
    r.data = (char *)t->data + m0 * t->stride[0] * (bie_dtype_bits(t->dtype) / 8);
    r.shape[0] = rows;
    return r;
}

extern "C" enum bie_status bie_cuda_wq_forward(bie_context_t * ctx, const struct bie_wq_call * c) {
    struct bie_cuda_state * st;
    BIE_TRY(bie_cuda_state_get(ctx, c->device_index, &st));
    if (c->M > WQ_MMA_MAX_M && (c->M + WQ_MMA_MAX_M - 1) / WQ_MMA_MAX_M <= decode_passes(ctx, c)) {
        for (int64_t m0 = 0; m0 < c->M; m0 += WQ_MMA_MAX_M) {
            struct bie_wq_call p = *c;
            p.M = c->M - m0 < WQ_MMA_MAX_M ? c->M - m0 : WQ_MMA_MAX_M;
            p.x = row_slice(&c->x, m0, p.M);
            p.y = row_slice(&c->y, m0, p.M);
            BIE_TRY(bie_cuda_wq_forward(ctx, &p));
        }
        return BIE_STATUS_OK;
    }
    const bool decode = c->M <= WQ_MAX_DECODE_M || wq_mma_ok(c);
    int64_t S = 1, per = 1;
    if (decode) decode_plan(ctx, c, &S, &per);
    void * ws;
    BIE_TRY(bie_cuda_workspace(ctx, decode ? decode_bytes(c, S) : gemm_bytes(c, c->x.dtype), &ws));
    wq_ws a = {(char *)ws, 0};
    int32_t * gb;
    int64_t * gw;
    BIE_TRY(upload_groups(ctx, c, a, &gb, &gw));
    const wq_dev w = dev_of(c, gb, gw);
    if (!decode) return forward_gemm(ctx, c, w, a);
    float * part = (float *)take(a, (size_t)S * c->M * c->N * 4);
    if (wq_mma_ok(c)) {
        BIE_TRY(wq_decode_mma(ctx, c, a, w, S, per, part));
    } else {
        const void * xf;
        BIE_TRY(dense_x(ctx, c, BIE_DTYPE_F32, a, &xf));
        wq_simt_kernel<<<dim3(blocks_for(c->N, 128), (unsigned)S), 128, 0, ctx->cuda->stream>>>(w, (const float *)xf,
                                                                                                (int)c->M, per, part);
        LAUNCHED(ctx, "wq_simt_kernel");
    }
    dview yv;
    dview_make(&c->y, &yv);
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg =
        bie_cuda_launch_config(ctx, dim3(blocks_for(c->M * c->N, 256)), dim3(256), 0, bie_cuda_cc(ctx) >= 90, &attr);
    CU_TRY(
        ctx,
        cudaLaunchKernelEx(&cfg, wq_reduce_kernel, (const float *)part, (int)S, c->M, c->N, view_or_null(&c->bias), yv),
        "wq_reduce_kernel launch");
    LAUNCHED(ctx, "wq_reduce_kernel");
    return BIE_STATUS_OK;
}

// A dense [rows][cols] buffer of dt holding the 2-D view t (t itself when it is one).
static enum bie_status dense_of(bie_context_t * ctx, const struct bie_tensor * t, enum bie_dtype dt, wq_ws & a,
                                const void ** out) {
    const int64_t R = t->shape[0], C = t->shape[1];
    if (t->dtype == dt && t->stride[1] == 1 && t->stride[0] == C) {
        *out = t->data;
        return BIE_STATUS_OK;
    }
    struct bie_wq_call tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.x = *t;
    tmp.M = R;
    tmp.K = C;
    return dense_x(ctx, &tmp, dt, a, out);
}

extern "C" enum bie_status bie_cuda_wq_backward(bie_context_t * ctx, const struct bie_wq_call * c) {
    struct bie_cuda_state * st;
    BIE_TRY(bie_cuda_state_get(ctx, c->device_index, &st));
    // Operands of the GEMMs in one dtype: f16/bf16 when grad_y is (x then too), else f32.
    const enum bie_dtype dt = c->grad_y.dtype;
    const size_t es = esize(dt);
    const int64_t M = c->M, K = c->K, N = c->N;
    const int64_t kp = panel_width(K, es * (size_t)N);
    const size_t bytes = groups_bytes(c) + (size_t)(M * N) * es + (size_t)(M * K) * es + (size_t)(M * K) * 4 +
                         (size_t)kp * N * es + 8192;
    void * ws;
    BIE_TRY(bie_cuda_workspace(ctx, bytes, &ws));
    wq_ws a = {(char *)ws, 0};
    int32_t * gb;
    int64_t * gw;
    BIE_TRY(upload_groups(ctx, c, a, &gb, &gw));
    const wq_dev w = dev_of(c, gb, gw);
    cublasHandle_t h;
    BIE_TRY(bie_cuda_cublas(ctx, &h));
    const void * g;
    BIE_TRY(dense_of(ctx, &c->grad_y, dt, a, &g));
    const float one = 1.0f, zero = 0.0f;
    math_for(h, dt);
    if (c->grad_w.data) {
        // grad_w^T[N, K] (column-major) = g^T[N, M] x'[M, K]
        struct bie_wq_call cx = *c;
        const void * xd;
        BIE_TRY(dense_x(ctx, &cx, dt, a, &xd));
        BIE_TRY(cublas_ok(ctx,
                          cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, (int)N, (int)K, (int)M, &one, g, cuda_type(dt),
                                       (int)N, xd, cuda_type(dt), (int)K, &zero, c->grad_w.data, CUDA_R_32F, (int)N,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                          "cublasGemmEx (wq grad_w)"));
    }
    if (c->grad_x.data) {
        float * gxr = (float *)take(a, (size_t)(M * K) * 4);
        void * wp = take(a, (size_t)kp * N * es);
        for (int64_t k0 = 0; k0 < K; k0 += kp) {
            const int64_t kb = K - k0 < kp ? K - k0 : kp;
            BIE_TRY(dequant_as(ctx, dt, w, k0, k0 + kb, 0, N, wp, N));
            // gxr^T[K, M] rows k0.. (column-major, ld K) = W_panel[kb, N] g^T[N, M]
            BIE_TRY(cublas_ok(ctx,
                              cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)kb, (int)M, (int)N, &one, wp,
                                           cuda_type(dt), (int)N, g, cuda_type(dt), (int)N, &zero, gxr + k0, CUDA_R_32F,
                                           (int)K, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                              "cublasGemmEx (wq grad_x)"));
        }
        dview gxv;
        dview_make(&c->grad_x, &gxv);
        wq_scatter_kernel<<<blocks_for(M * K, 256), 256, 0, ctx->cuda->stream>>>(gxr, M, K, x_of(c, &c->x), gxv);
        LAUNCHED(ctx, "wq_scatter_kernel");
    }
    math_for(h, BIE_DTYPE_F32);
    return BIE_STATUS_OK;
}

extern "C" enum bie_status bie_cuda_wq_dequantize(bie_context_t * ctx, const struct bie_wq_call * c,
                                                  const struct bie_tensor * wt) {
    struct bie_cuda_state * st;
    BIE_TRY(bie_cuda_state_get(ctx, c->device_index, &st));
    void * ws;
    BIE_TRY(bie_cuda_workspace(ctx, groups_bytes(c) + 1024, &ws));
    wq_ws a = {(char *)ws, 0};
    int32_t * gb;
    int64_t * gw;
    BIE_TRY(upload_groups(ctx, c, a, &gb, &gw));
    const wq_dev w = dev_of(c, gb, gw);
    if (wt->stride[1] != 1)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "cuda: w: dequantize writes rows with unit column stride");
    return dequant_as(ctx, wt->dtype, w, 0, c->K, 0, c->N, wt->data, wt->stride[0]);
}
