// SPDX-License-Identifier: Apache-2.0
// bench-cuda.c: the CUDA cases of `bie bench` (built only with the CUDA backend). Each case times
// libbie and the baseline a user would otherwise pick in the same process: cuBLAS fp16 (and int8)
// GEMMs, cuDNN fp16 NHWC convolution (when cuDNN was found at build time). Inputs rotate over
// enough copies to exceed the L2 cache; warm-up first; medians of the repeats. Each side is timed
// two ways:
//   graph: a run of consecutive calls captured once in a CUDA graph and replayed, CUDA events
//     around each replay, divided by the calls in it: what the GPU spends per call when the host
//     keeps it fed (launch gaps shrunk, as in a training step or a captured inference graph);
//   call: CUDA events around one call on an idle stream, the host's part of the call and the
//     launch latency included (what one isolated call costs).
// Each side is credited with the lower of its two medians (best_ms); ratios are baseline time /
// libbie time.
//
// Entry point: bie_bench_cuda_main(argc, argv), run by `bie bench --backend cuda` (options: --quick,
// --json, --case S: the rows whose group (binary-gemm|binary-conv|int4-linear|train-step|plan-host|
// binary-matmul|embedding) or own name contains S (--case binary-conv, --case "binary-conv b1->b1");
// --shape S: the rows whose shape contains S ("4096x4096x4096", "C64 "); --call-only: no graph
// replays, e.g. under a profiler; --rows M: binary-gemm only at M rows; others are ignored). With
// -DBIE_BENCH_CUDA_MAIN it is the program bie_bench_cuda, which `bie bench --backend cuda` runs (the
// bie program itself links no CUDA library).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench-cuda.h"
#ifdef BIE_HAVE_CUDNN
#include <cudnn.h>
#endif

// --- cuBLAS baselines (row-major C[M][N] = A[M][K] . B[N][K]^T, i.e. TN in column-major) --------

struct gemm_state {
    int64_t M, N, K;
    void *A[MAX_ROTATIONS], *B[MAX_ROTATIONS], *C[MAX_ROTATIONS];
    int i8;
};

static void run_cublas(void * st, int r) {
    struct gemm_state * s = st;
    if (s->i8) {
        const int32_t one = 1, zero = 0;
        CB(cublasGemmEx(g_blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)s->N, (int)s->M, (int)s->K, &one, s->B[r], CUDA_R_8I,
                        (int)s->K, s->A[r], CUDA_R_8I, (int)s->K, &zero, s->C[r], CUDA_R_32I, (int)s->N,
                        CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT));
    } else {
        const float one = 1.0f, zero = 0.0f;
        CB(cublasGemmEx(g_blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)s->N, (int)s->M, (int)s->K, &one, s->B[r], CUDA_R_16F,
                        (int)s->K, s->A[r], CUDA_R_16F, (int)s->K, &zero, s->C[r], CUDA_R_16F, (int)s->N,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
}

static struct timing time_cublas(int64_t M, int64_t N, int64_t K, int i8) {
    struct gemm_state s = {M, N, K, {0}, {0}, {0}, i8};
    const size_t es = i8 ? 1 : 2;
    const int rots = rotations((size_t)(M * K + N * K) * es + (size_t)(M * N) * (i8 ? 4 : 2));
    for (int r = 0; r < rots; r++) {
        s.A[r] = i8 ? dev_alloc_random((size_t)(M * K)) : dev_half_random((size_t)(M * K));
        s.B[r] = i8 ? dev_alloc_random((size_t)(N * K)) : dev_half_random((size_t)(N * K));
        CK(cudaMalloc(&s.C[r], (size_t)(M * N) * (i8 ? 4 : 2)));
    }
    const struct timing ms = time_ms(run_cublas, &s, rots);
    for (int r = 0; r < rots; r++) {
        cudaFree(s.A[r]);
        cudaFree(s.B[r]);
        cudaFree(s.C[r]);
    }
    return ms;
}

// --- libbie layers ------------------------------------------------------------------------------

// What a linear layer's timed call does: the forward only, a training step from the float x, or a
// training step from the bits saved by bie_binarize_ste and the weight packed once. Options:
// LAYER_BIAS gives the layer a bias_a; LAYER_STOPS sets scale_a to 0.5 instead of 1, so that the
// STE stops the elements of |x| > 0.5, an eighth of dev_half_random's (none at 1); LAYER_Y_BITS
// makes y the signs of the results, packed (B1: the next binary layer's input), instead of f16.
enum { STEP_FORWARD, STEP_TRAIN, STEP_TRAIN_SAVED_BITS };
enum { LAYER_BIAS = 1, LAYER_STOPS = 2, LAYER_Y_BITS = 4 };

struct layer_state {
    bie_context_t * ctx;
    int conv;
    struct bie_linear_desc ld;
    struct bie_conv2d_desc cd;
    struct bie_tensor x[MAX_ROTATIONS], w[MAX_ROTATIONS], y[MAX_ROTATIONS], sa, sw;
    struct bie_tensor g[MAX_ROTATIONS], gx[MAX_ROTATIONS], gw[MAX_ROTATIONS];         // training step
    struct bie_tensor bits[MAX_ROTATIONS], mask[MAX_ROTATIONS], wbits[MAX_ROTATIONS]; // saved-bits step
    struct bie_tensor bias;                                                           // bias_a, or data NULL
    int train;                                                                        // STEP_*
};

// STEP_TRAIN: forward(x, W), backward(x, W). STEP_TRAIN_SAVED_BITS: bits, mask = bie_binarize_ste(x)
// (x read once), wbits = bie_pack(W) (W read once), forward(bits, wbits), backward(bits, x_mask =
// mask, wbits).
static void run_layer(void * st, int r) {
    struct layer_state * s = st;
    const int saved = s->train == STEP_TRAIN_SAVED_BITS;
    if (saved) {
        BK(s->ctx,
           bie_binarize_ste(s->ctx, &s->x[r], s->bias.data ? &s->bias : NULL, &s->sa, &s->bits[r], &s->mask[r]));
        BK(s->ctx, bie_pack(s->ctx, &s->w[r], NULL, &s->wbits[r]));
    }
    const struct bie_tensor *x = saved ? &s->bits[r] : &s->x[r], *w = saved ? &s->wbits[r] : &s->w[r];
    const struct bie_tensor * bias = s->bias.data && !saved ? &s->bias : NULL;
    struct bie_forward_args a = {
        .x = x, .bias_a = bias, .weight = w, .scale_a = &s->sa, .scale_w = &s->sw, .y = &s->y[r]};
    BK(s->ctx, s->conv ? bie_conv2d_forward(s->ctx, &s->cd, &a) : bie_linear_forward(s->ctx, &s->ld, &a));
    if (s->train != STEP_FORWARD) {
        struct bie_backward_args b = {
            x,    bias, w,   &s->sa, &s->sw, &s->g[r], &s->gx[r], &s->gw[r], NULL, NULL, saved ? &s->mask[r] : NULL,
            NULL, NULL, 0.0f};
        BK(s->ctx, bie_linear_backward(s->ctx, &s->ld, &b));
    }
}

static float g_one = 1.0f, g_half = 0.5f;

static void layer_init(struct layer_state * s, bie_context_t * ctx) {
    memset(s, 0, sizeof *s);
    s->ctx = ctx;
    s->sa = dev_tensor(NULL, BIE_DTYPE_F32, 0, NULL);
    s->sa.data = &g_one;
    s->sa.device_type = BIE_DEVICE_CPU;
    s->sw = s->sa;
}

static void layer_free(struct layer_state * s, int rots) {
    cudaFree(s->bias.data);
    for (int r = 0; r < rots; r++) {
        cudaFree(s->x[r].data);
        cudaFree(s->w[r].data);
        cudaFree(s->y[r].data);
        if (s->train != STEP_FORWARD) {
            cudaFree(s->g[r].data);
            cudaFree(s->gx[r].data);
            cudaFree(s->gw[r].data);
        }
        if (s->train == STEP_TRAIN_SAVED_BITS) {
            cudaFree(s->bits[r].data);
            cudaFree(s->mask[r].data);
            cudaFree(s->wbits[r].data);
        }
    }
}

// Binary or 4-bit linear: x [M, K] (xdt), weight [N, K] (wdt), y [M, N] f16 (or B1), bias_a [K] f16 with
// LAYER_BIAS (added to x in the packer, or in bie_binarize_ste for the saved bits); train: STEP_*,
// with grad_y, grad_x and grad_weight f16 for the training steps; opt: LAYER_* bits.
static struct timing time_linear(bie_context_t * ctx, enum bie_quant q, enum bie_dtype xdt, enum bie_dtype wdt,
                                 int64_t M, int64_t N, int64_t K, int train, int opt) {
    struct layer_state s;
    layer_init(&s, ctx);
    s.ld.quant = q;
    s.ld.in_features = K;
    s.ld.out_features = N;
    s.train = train;
    if (opt & LAYER_STOPS) s.sa.data = &g_half;
    const int64_t xs[2] = {M, K}, ws[2] = {N, K}, ys[2] = {M, N};
    const enum bie_dtype ydt = opt & LAYER_Y_BITS ? BIE_DTYPE_B1 : BIE_DTYPE_F16;
    const size_t xb = dense_bytes(xdt, 2, xs), wb = dense_bytes(wdt, 2, ws), yb = dense_bytes(ydt, 2, ys);
    const int rots = rotations(xb + wb + yb);
    const int64_t bs[1] = {K};
    if (opt & LAYER_BIAS) s.bias = dev_tensor(dev_half_random((size_t)K), BIE_DTYPE_F16, 1, bs);
    for (int r = 0; r < rots; r++) {
        void * xd = xdt == BIE_DTYPE_F16 ? dev_half_random((size_t)(M * K)) : dev_alloc_random(xb);
        void * wd = wdt == BIE_DTYPE_F16 ? dev_half_random((size_t)(N * K)) : dev_alloc_random(wb);
        void * yd;
        CK(cudaMalloc(&yd, yb));
        s.x[r] = dev_tensor(xd, xdt, 2, xs);
        s.w[r] = dev_tensor(wd, wdt, 2, ws);
        s.y[r] = dev_tensor(yd, ydt, 2, ys);
        if (train != STEP_FORWARD) {
            s.g[r] = dev_tensor(dev_half_random((size_t)(M * N)), BIE_DTYPE_F16, 2, ys);
            void *gx, *gw;
            CK(cudaMalloc(&gx, (size_t)(M * K) * 2));
            CK(cudaMalloc(&gw, (size_t)(N * K) * 2));
            s.gx[r] = dev_tensor(gx, BIE_DTYPE_F16, 2, xs);
            s.gw[r] = dev_tensor(gw, BIE_DTYPE_F16, 2, ws);
        }
        if (train == STEP_TRAIN_SAVED_BITS) { // 2 bits per element of x kept for the backward, W's bits
            void *bits, *mask, *wbits;
            const size_t bb = dense_bytes(BIE_DTYPE_B1, 2, xs), wbb = dense_bytes(BIE_DTYPE_B1, 2, ws);
            CK(cudaMalloc(&bits, bb));
            CK(cudaMalloc(&mask, bb));
            CK(cudaMalloc(&wbits, wbb));
            s.bits[r] = dev_tensor(bits, BIE_DTYPE_B1, 2, xs);
            s.mask[r] = dev_tensor(mask, BIE_DTYPE_B1, 2, xs);
            s.wbits[r] = dev_tensor(wbits, BIE_DTYPE_B1, 2, ws);
        }
    }
    const struct timing ms = time_ms(run_layer, &s, rots);
    layer_free(&s, rots);
    return ms;
}

// fp16 dense training step: y = x W^T, gx = g W, gW = g^T x (three cuBLAS GEMMs).
struct dense_step {
    int64_t M, N, K;
    void *x[4], *w[4], *y[4], *g[4], *gx[4], *gw[4];
};
static void run_dense_step(void * st, int r) {
    struct dense_step * s = st;
    const float one = 1.0f, zero = 0.0f;
    const int M = (int)s->M, N = (int)s->N, K = (int)s->K;
    CB(cublasGemmEx(g_blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, s->w[r], CUDA_R_16F, K, s->x[r], CUDA_R_16F, K,
                    &zero, s->y[r], CUDA_R_16F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    CB(cublasGemmEx(g_blas, CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, &one, s->w[r], CUDA_R_16F, K, s->g[r], CUDA_R_16F, N,
                    &zero, s->gx[r], CUDA_R_16F, K, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    CB(cublasGemmEx(g_blas, CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, &one, s->x[r], CUDA_R_16F, K, s->g[r], CUDA_R_16F, N,
                    &zero, s->gw[r], CUDA_R_16F, K, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
static struct timing time_dense_step(int64_t M, int64_t N, int64_t K) {
    struct dense_step s = {M, N, K, {0}, {0}, {0}, {0}, {0}, {0}};
    const int rots = 2;
    for (int r = 0; r < rots; r++) {
        s.x[r] = dev_half_random((size_t)(M * K));
        s.w[r] = dev_half_random((size_t)(N * K));
        s.g[r] = dev_half_random((size_t)(M * N));
        CK(cudaMalloc(&s.y[r], (size_t)(M * N) * 2));
        CK(cudaMalloc(&s.gx[r], (size_t)(M * K) * 2));
        CK(cudaMalloc(&s.gw[r], (size_t)(N * K) * 2));
    }
    const struct timing ms = time_ms(run_dense_step, &s, rots);
    for (int r = 0; r < rots; r++) {
        cudaFree(s.x[r]);
        cudaFree(s.w[r]);
        cudaFree(s.g[r]);
        cudaFree(s.y[r]);
        cudaFree(s.gx[r]);
        cudaFree(s.gw[r]);
    }
    return ms;
}

// Binary conv2d, channels-last: x [N, C, H, W] as NHWC bits (or f16; x_nchw: f16 in NCHW, as
// PyTorch passes it by default), weight OHWI bits, y NHWC.
static struct timing time_conv(bie_context_t * ctx, int64_t N, int64_t C, int64_t H, int64_t O, enum bie_dtype xdt,
                               enum bie_dtype ydt, int x_nchw) {
    struct layer_state s;
    layer_init(&s, ctx);
    s.conv = 1;
    struct bie_conv2d_desc d = {BIE_QUANT_BINARY, C, O, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, BIE_PAD_ZERO};
    s.cd = d;
    const int64_t xs[4] = {N, H, H, C}, xs_nchw[4] = {N, C, H, H}, ws[4] = {O, 3, 3, C}, ys[4] = {N, H, H, O};
    const int32_t perm[4] = {0, 3, 1, 2};
    const size_t xb = dense_bytes(xdt, 4, xs), wb = dense_bytes(BIE_DTYPE_B1, 4, ws), yb = dense_bytes(ydt, 4, ys);
    const int rots = rotations(xb + wb + yb);
    for (int r = 0; r < rots; r++) {
        void * yd;
        CK(cudaMalloc(&yd, yb));
        s.x[r] = dev_tensor(xdt == BIE_DTYPE_F16 ? dev_half_random(xb / 2) : dev_alloc_random(xb), xdt, 4,
                            x_nchw ? xs_nchw : xs);
        s.w[r] = dev_tensor(dev_alloc_random(wb), BIE_DTYPE_B1, 4, ws);
        s.y[r] = dev_tensor(yd, ydt, 4, ys);
        if (!x_nchw) bie_tensor_permute(&s.x[r], perm);
        bie_tensor_permute(&s.w[r], perm);
        bie_tensor_permute(&s.y[r], perm);
    }
    const struct timing ms = time_ms(run_layer, &s, rots);
    layer_free(&s, rots);
    return ms;
}

#ifdef BIE_HAVE_CUDNN
struct cudnn_state {
    cudnnHandle_t h;
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    cudnnConvolutionFwdAlgo_t algo;
    void * ws;
    size_t ws_size;
    void *x[MAX_ROTATIONS], *w[MAX_ROTATIONS], *y[MAX_ROTATIONS];
};
static void run_cudnn(void * st, int r) {
    struct cudnn_state * s = st;
    const float one = 1.0f, zero = 0.0f;
    cudnnStatus_t e = cudnnConvolutionForward(s->h, &one, s->xd, s->x[r], s->wd, s->w[r], s->cd, s->algo, s->ws,
                                              s->ws_size, &zero, s->yd, s->y[r]);
    if (e != CUDNN_STATUS_SUCCESS) fail("cudnnConvolutionForward", cudnnGetErrorString(e));
}
static struct timing time_cudnn(int64_t N, int64_t C, int64_t H, int64_t O) {
    struct cudnn_state s;
    memset(&s, 0, sizeof s);
    const struct timing none = {-1.0, -1.0};
    if (cudnnCreate(&s.h) != CUDNN_STATUS_SUCCESS) return none;
    cudnnSetStream(s.h, g_stream);
    cudnnCreateTensorDescriptor(&s.xd);
    cudnnCreateTensorDescriptor(&s.yd);
    cudnnCreateFilterDescriptor(&s.wd);
    cudnnCreateConvolutionDescriptor(&s.cd);
    cudnnSetTensor4dDescriptor(s.xd, CUDNN_TENSOR_NHWC, CUDNN_DATA_HALF, (int)N, (int)C, (int)H, (int)H);
    cudnnSetTensor4dDescriptor(s.yd, CUDNN_TENSOR_NHWC, CUDNN_DATA_HALF, (int)N, (int)O, (int)H, (int)H);
    cudnnSetFilter4dDescriptor(s.wd, CUDNN_DATA_HALF, CUDNN_TENSOR_NHWC, (int)O, (int)C, 3, 3);
    cudnnSetConvolution2dDescriptor(s.cd, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT);
    cudnnSetConvolutionMathType(s.cd, CUDNN_TENSOR_OP_MATH);
    cudnnConvolutionFwdAlgoPerf_t perf[8];
    int got = 0;
    if (cudnnGetConvolutionForwardAlgorithm_v7(s.h, s.xd, s.wd, s.cd, s.yd, 8, &got, perf) != CUDNN_STATUS_SUCCESS ||
        !got)
        return none;
    s.algo = perf[0].algo;
    s.ws_size = perf[0].memory;
    if (s.ws_size) CK(cudaMalloc(&s.ws, s.ws_size));
    const size_t xb = (size_t)(N * C * H * H) * 2, wb = (size_t)(O * C * 9) * 2, yb = (size_t)(N * O * H * H) * 2;
    const int rots = rotations(xb + wb + yb);
    for (int r = 0; r < rots; r++) {
        s.x[r] = dev_half_random(xb / 2);
        s.w[r] = dev_half_random(wb / 2);
        CK(cudaMalloc(&s.y[r], yb));
    }
    const struct timing ms = time_ms(run_cudnn, &s, rots);
    for (int r = 0; r < rots; r++) {
        cudaFree(s.x[r]);
        cudaFree(s.w[r]);
        cudaFree(s.y[r]);
    }
    if (s.ws) cudaFree(s.ws);
    cudnnDestroy(s.h);
    return ms;
}
#else
static struct timing time_cudnn(int64_t N, int64_t C, int64_t H, int64_t O) {
    (void)N, (void)C, (void)H, (void)O;
    const struct timing none = {-1.0, -1.0}; // no cuDNN in this build: no baseline
    return none;
}
#endif

// --- binary-matmul: bie_matmul_forward, f16 x [B, M, K], y [B, N, K] -> f16, against cuBLAS's fp16
// strided-batched GEMM; embedding: L rows of a packed table [V, D] into f16 against a device copy
// of the output's bytes (which reads and writes them; the lookup's "TOPS" column is TB/s written).
struct op_state {
    bie_context_t * ctx;
    int64_t B, M, N, K;
    struct bie_tensor a, b, out, c1, c2; // matmul: x, y, out, x_clip, y_clip; embedding: indices, table, out
    void *src, *dst;                     // the baselines' operands
    size_t bytes;
    int quant;
};

static void run_matmul(void * st, int r) {
    (void)r;
    struct op_state * s = st;
    const struct bie_matmul_desc d = {(enum bie_quant)s->quant};
    const struct bie_matmul_args a = {&s->a, &s->b, &s->c1, &s->c2, &s->out};
    BK(s->ctx, bie_matmul_forward(s->ctx, &d, &a));
}

static void run_batched_cublas(void * st, int r) {
    (void)r;
    struct op_state * s = st;
    const float one = 1.0f, zero = 0.0f;
    CB(cublasGemmStridedBatchedEx(g_blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)s->N, (int)s->M, (int)s->K, &one, s->b.data,
                                  CUDA_R_16F, (int)s->K, s->N * s->K, s->a.data, CUDA_R_16F, (int)s->K, s->M * s->K,
                                  &zero, s->dst, CUDA_R_16F, (int)s->N, s->M * s->N, (int)s->B, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
}

static void run_embedding(void * st, int r) {
    (void)r;
    struct op_state * s = st;
    const struct bie_embedding_desc d = {BIE_QUANT_BINARY, 0};
    const struct bie_embedding_args a = {&s->a, &s->b, NULL, &s->out};
    BK(s->ctx, bie_embedding_forward(s->ctx, &d, &a));
}

static void run_copy(void * st, int r) {
    (void)r;
    struct op_state * s = st;
    CK(cudaMemcpyAsync(s->dst, s->src, s->bytes, cudaMemcpyDeviceToDevice, g_stream));
}

static void op_matmul_rows(bie_context_t * ctx, int64_t B, int64_t M, int64_t N, int64_t K) {
    char shape[64];
    snprintf(shape, sizeof shape, "%lldx%lldx%lldx%lld", (long long)B, (long long)M, (long long)N, (long long)K);
    const char * names[2] = {"binary-matmul f16", "q8-matmul f16"};
    if (!want_row("binary-matmul", names[0], shape) && !want_row("binary-matmul", names[1], shape)) return;
    struct op_state s = {ctx, B, M, N, K, {0}, {0}, {0}, {0}, {0}, NULL, NULL, 0, BIE_QUANT_BINARY};
    const int64_t xs[3] = {B, M, K}, ys[3] = {B, N, K}, os[3] = {B, M, N};
    s.a = dev_tensor(dev_half_random((size_t)(B * M * K)), BIE_DTYPE_F16, 3, xs);
    s.b = dev_tensor(dev_half_random((size_t)(B * N * K)), BIE_DTYPE_F16, 3, ys);
    CK(cudaMalloc(&s.dst, (size_t)(B * M * N) * 2));
    s.out = dev_tensor(s.dst, BIE_DTYPE_F16, 3, os);
    bie_tensor_make(&s.c1, &g_half, BIE_DTYPE_F32, 0, NULL); // host clips
    bie_tensor_make(&s.c2, &g_half, BIE_DTYPE_F32, 0, NULL);
    const struct timing base = time_ms(run_batched_cublas, &s, 1);
    for (int i = 0; i < 2; i++) {
        s.quant = i ? BIE_QUANT_INT8 : BIE_QUANT_BINARY;
        if (want_row("binary-matmul", names[i], shape))
            print_row(names[i], shape, time_ms(run_matmul, &s, 1), "cublas-fp16", base, 2.0 * B * M * N * K);
    }
    cudaFree(s.a.data);
    cudaFree(s.b.data);
    cudaFree(s.dst);
}

static void op_embedding_row(bie_context_t * ctx, int64_t V, int64_t D, int64_t L) {
    char shape[64];
    snprintf(shape, sizeof shape, "V%lld D%lld L%lld", (long long)V, (long long)D, (long long)L);
    if (!want_row("embedding", "embedding b1->f16", shape)) return;
    struct op_state s = {ctx, 0, 0, 0, 0, {0}, {0}, {0}, {0}, {0}, NULL, NULL, (size_t)(L * D) * 2, BIE_QUANT_BINARY};
    int64_t * h = malloc((size_t)L * sizeof(int64_t));
    uint64_t r = 0x853c49e6748fea9bull;
    for (int64_t i = 0; i < L; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (int64_t)((r >> 33) % (uint64_t)V);
    }
    void * idx;
    CK(cudaMalloc(&idx, (size_t)L * sizeof(int64_t)));
    CK(cudaMemcpy(idx, h, (size_t)L * sizeof(int64_t), cudaMemcpyHostToDevice));
    free(h);
    const int64_t is[1] = {L}, ts[2] = {V, D}, os[2] = {L, D};
    s.a = dev_tensor(idx, BIE_DTYPE_I64, 1, is);
    s.b = dev_tensor(NULL, BIE_DTYPE_B1, 2, ts);
    size_t tb;
    bie_tensor_nbytes(&s.b, &tb);
    s.b.data = dev_alloc_random(tb);
    CK(cudaMalloc(&s.dst, s.bytes));
    CK(cudaMalloc(&s.src, s.bytes));
    s.out = dev_tensor(s.dst, BIE_DTYPE_F16, 2, os);
    const struct timing base = time_ms(run_copy, &s, 1);
    print_row("embedding b1->f16", shape, time_ms(run_embedding, &s, 1), "copy-of-out", base, (double)s.bytes);
    cudaFree(idx);
    cudaFree(s.b.data);
    cudaFree(s.dst);
    cudaFree(s.src);
}

// binary-gemm rows at three shapes (rows_only: only those of that M).
static void gemm_rows(bie_context_t * ctx, long long rows_only) {
    char shape[64];
    const int64_t sizes[3][3] = {{8192, 8192, 8192}, {4096, 4096, 4096}, {16, 4096, 4096}};
    // The rows of each shape: the B1 x with f16 or B1 y, and the f16 x packed in the call.
    const struct {
        const char * name;
        enum bie_dtype xdt;
        int opt;
    } rows[4] = {
        {"binary-gemm b1->f16", BIE_DTYPE_B1, 0},
        {"binary-gemm b1->b1", BIE_DTYPE_B1, LAYER_Y_BITS},
        {"binary-linear f16", BIE_DTYPE_F16, 0},
        {"binary-linear f16+bias_a", BIE_DTYPE_F16, LAYER_BIAS},
    };
    for (int i = 0; i < 3; i++) {
        const int64_t M = sizes[i][0], N = sizes[i][1], K = sizes[i][2];
        snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)M, (long long)N, (long long)K);
        int any = 0;
        for (int j = 0; j < 4; j++) any |= want_row("binary-gemm", rows[j].name, shape);
        if ((rows_only && M != rows_only) || !any) continue;
        const struct timing base = time_cublas(M, N, K, 0);
        const double ops = 2.0 * (double)M * (double)N * (double)K;
        for (int j = 0; j < 4; j++)
            if (want_row("binary-gemm", rows[j].name, shape))
                print_row(
                    rows[j].name, shape,
                    time_linear(ctx, BIE_QUANT_BINARY, rows[j].xdt, BIE_DTYPE_B1, M, N, K, STEP_FORWARD, rows[j].opt),
                    "cublas-fp16", base, ops);
    }
}

// binary-conv rows at the ResNet-18 layers.
static void conv_rows(bie_context_t * ctx) {
    char shape[64];
    const int64_t layers[4][2] = {{64, 56}, {128, 28}, {256, 14}, {512, 7}};
    const int64_t Nb = g_quick ? 32 : 128;
    // The rows of each layer: x as NHWC bits or f16 (channels-last, or NCHW), y f16 or bits.
    const struct {
        const char * name;
        enum bie_dtype xdt, ydt;
        int nchw;
    } rows[4] = {
        {"binary-conv b1->f16", BIE_DTYPE_B1, BIE_DTYPE_F16, 0},
        {"binary-conv b1->b1", BIE_DTYPE_B1, BIE_DTYPE_B1, 0},
        {"binary-conv f16->f16", BIE_DTYPE_F16, BIE_DTYPE_F16, 0},
        {"binary-conv f16nchw->f16", BIE_DTYPE_F16, BIE_DTYPE_F16, 1},
    };
    for (int i = 0; i < 4; i++) {
        const int64_t C = layers[i][0], H = layers[i][1];
        snprintf(shape, sizeof shape, "N%lld C%lld %lldx%lld 3x3", (long long)Nb, (long long)C, (long long)H,
                 (long long)H);
        int any = 0;
        for (int j = 0; j < 4; j++) any |= want_row("binary-conv", rows[j].name, shape);
        if (!any) continue;
        const struct timing base = time_cudnn(Nb, C, H, C);
        const double ops = 2.0 * (double)Nb * H * H * C * C * 9;
        for (int j = 0; j < 4; j++)
            if (want_row("binary-conv", rows[j].name, shape))
                print_row(rows[j].name, shape, time_conv(ctx, Nb, C, H, C, rows[j].xdt, rows[j].ydt, rows[j].nchw),
                          "cudnn-fp16", base, ops);
    }
}

// The int4-linear row, against cuBLAS's fp16 and int8 GEMMs.
static void int4_rows(bie_context_t * ctx) {
    if (!want_row("int4-linear", "int4-linear f16 x,s4 w", "8192x8192x8192")) return;
    const int64_t M = 8192, N = 8192, K = 8192;
    const struct timing b16 = time_cublas(M, N, K, 0), b8 = time_cublas(M, N, K, 1);
    const double ops = 2.0 * (double)M * N * K;
    const struct timing t = time_linear(ctx, BIE_QUANT_INT4, BIE_DTYPE_F16, BIE_DTYPE_S4, M, N, K, STEP_FORWARD, 0);
    print_row("int4-linear f16 x,s4 w", "8192x8192x8192", t, "cublas-fp16", b16, ops);
    print_row("int4-linear f16 x,s4 w", "8192x8192x8192", t, "cublas-int8", b8, ops);
}

// train-step rows.
static void train_step_rows(bie_context_t * ctx) {
    // The step from the float x, and the same step reading x and W once: bie_binarize_ste(x) ->
    // bits, mask (2 bits per element kept instead of x) and bie_pack(W) -> W's bits, then the
    // forward from the bits and the backward from the bits and mask. Each with nothing stopped
    // by the STE and with an eighth of the elements stopped (their grad_x cleared).
    const int64_t M = 8192, N = 4096, K = 4096;
    const char * shape_s = "8192x4096x4096 fwd+bwd";
    const char * names[4] = {"binary-train-step f16", "binary-train-step f16 stops", "binary-train-step bits",
                             "binary-train-step bits stops"};
    int any = 0;
    for (int i = 0; i < 4; i++) any |= want_row("train-step", names[i], shape_s);
    const struct timing base = any ? time_dense_step(M, N, K) : (struct timing){0};
    for (int i = 0; i < 4; i++) {
        if (!want_row("train-step", names[i], shape_s)) continue;
        const struct timing t = time_linear(ctx, BIE_QUANT_BINARY, BIE_DTYPE_F16, BIE_DTYPE_F16, M, N, K,
                                            i < 2 ? STEP_TRAIN : STEP_TRAIN_SAVED_BITS, i % 2 ? LAYER_STOPS : 0);
        print_row(names[i], shape_s, t, "cublas-fp16x3", base, 6.0 * M * N * K);
    }
}

int bie_bench_cuda_main(int argc, char ** argv) {
    long long rows_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) g_quick = 1;
        else if (!strcmp(argv[i], "--json")) g_json = 1;
        else if (!strcmp(argv[i], "--call-only")) g_call_only = 1;
        else if (!strcmp(argv[i], "--case") && i + 1 < argc) g_case = argv[++i];
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc) g_shape = argv[++i];
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows_only = atoll(argv[++i]);
    }
    if (!bie_backend_available(BIE_BACKEND_CUDA)) {
        printf("bench cuda: skipped: no CUDA device is available\n");
        return 0;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    if (!g_json) // (--json: only the rows, each naming the device)
        printf("bench cuda: %s, %d SMs, L2 %d MB; medians of CUDA-event timings per call, graph replays and "
               "isolated calls; each side's lower median; ratio = baseline / bie\n",
               prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    CK(cudaStreamCreate(&g_stream));
    CB(cublasCreate(&g_blas));
    CB(cublasSetStream(g_blas, g_stream));
    // The workspace cuBLAS recommends on Hopper (32 MiB), set once so that its kernel choice is the
    // same inside a graph capture as outside (as PyTorch sets it).
    void * blas_ws;
    CK(cudaMalloc(&blas_ws, (size_t)32 << 20));
    CB(cublasSetWorkspace(g_blas, blas_ws, (size_t)32 << 20));
    bie_context_t * ctx;
    if (bie_context_create(NULL, &ctx) != BIE_STATUS_OK) return 1;
    BK(ctx, bie_context_set_cuda_stream(ctx, g_stream));
    gemm_rows(ctx, rows_only);
    conv_rows(ctx);
    int4_rows(ctx);
    train_step_rows(ctx);
    if (want_row("plan-host", "plan-host", "")) {
        bench_cuda_host_rows(ctx, g_json, g_json ? json_run_info() : "");
        g_rows++;
    }
    op_matmul_rows(ctx, 8, 4096, 4096, 4096);
    op_matmul_rows(ctx, 384, 128, 128, 64); // attention scores: 32 x 12 heads, 128 tokens, 64 per head
    op_embedding_row(ctx, 50257, 1024, 65536);
    bie_context_destroy(ctx);
    cublasDestroy(g_blas);
    cudaFree(blas_ws);
    cudaStreamDestroy(g_stream);
    if (!g_rows) {
        fprintf(stderr,
                "bench cuda: no row matches --case '%s' --shape '%s' (groups: binary-gemm, binary-conv, "
                "int4-linear, train-step, plan-host, binary-matmul, embedding)\n",
                g_case ? g_case : "", g_shape ? g_shape : "");
        return 2;
    }
    return 0;
}

#ifdef BIE_BENCH_CUDA_MAIN
// The program bie_bench_cuda: these cases, or with --llm the GPU rows of `bie bench --llm` (the bie
// program runs it for both, since it links no CUDA library).
int main(int argc, char ** argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--llm")) return bie_bench_main(argc, argv);
    return bie_bench_cuda_main(argc, argv);
}
#endif
