// SPDX-License-Identifier: Apache-2.0
// cuda-cudnn.cu: the two float convolutions of a conv layer's backward through cuDNN:
//   dgrad: dX = conv_transpose(dY, Wc)   (grad_x before scale_w and the STE mask)
//   wgrad: dW = conv_weight(A, dY)       (grad_W before scale_a)
// with Wc the weight codes (filter KRSC: [O][kh][kw][C], dense), A the activation codes (NHWC,
// dense), dX NHWC dense, dY the caller's grad_y with its own strides; all of one float dtype (the
// codes are exact in f16 and bf16), f32 accumulation, no TF32 for f32 (FMA math only).
// cuDNN's algorithms are chosen once per shape by measuring them (cudnnFind*, which synchronises
// the device and allocates its own scratch: a first call of a shape, never a repeated one), and
// kept with their descriptors in a small cache per context.
#include "cuda-impl.cuh"

#include <stdlib.h>
#include <string.h>

#if BIE_HAVE_CUDNN
#include <cudnn.h>

namespace {

constexpr int CACHE = 64;               // shapes kept per context
constexpr size_t ALGO_WS_CAP = 1ull << 30; // largest cuDNN workspace an algorithm may ask for

struct entry {
    cudnn_conv_shape key;
    bool used;
    cudnnTensorDescriptor_t dy, dx;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    bool data_found, filter_found; // measured (an algorithm, or none: data_none / filter_none)
    bool data_none, filter_none;
    cudnnConvolutionBwdDataAlgo_t data_algo;
    cudnnConvolutionBwdFilterAlgo_t filter_algo;
    cudnnMathType_t data_math, filter_math;
    size_t data_ws, filter_ws;
};

} // namespace

struct bie_cudnn_state {
    cudnnHandle_t handle;
    entry e[CACHE];
    int next; // round-robin eviction
};

namespace {

enum bie_status fail(bie_context_t * ctx, cudnnStatus_t s, const char * what) {
    return bie_set_error(ctx, BIE_STATUS_DEVICE_ERROR, "cuda: cuDNN %s: %s", what, cudnnGetErrorString(s));
}
#define DNN_TRY(ctx, expr, what)                                                                   \
    do {                                                                                           \
        cudnnStatus_t s_ = (expr);                                                                 \
        if (s_ != CUDNN_STATUS_SUCCESS) return fail(ctx, s_, what);                                \
    } while (0)

cudnnDataType_t dnn_type(int dt) {
    return dt == BIE_DTYPE_F16 ? CUDNN_DATA_HALF : dt == BIE_DTYPE_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

void destroy_entry(entry * e) {
    if (!e->used) return;
    cudnnDestroyTensorDescriptor(e->dy);
    cudnnDestroyTensorDescriptor(e->dx);
    cudnnDestroyFilterDescriptor(e->w);
    cudnnDestroyConvolutionDescriptor(e->conv);
    e->used = false;
}

enum bie_status state_of(bie_context_t * ctx, bie_cudnn_state ** out) {
    struct bie_cuda_state * st = ctx->cuda;
    if (!st->cudnn) {
        bie_cudnn_state * d = (bie_cudnn_state *)calloc(1, sizeof *d);
        if (!d) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "cuda: out of host memory");
        const cudnnStatus_t s = cudnnCreate(&d->handle);
        if (s != CUDNN_STATUS_SUCCESS) {
            free(d);
            return fail(ctx, s, "cudnnCreate");
        }
        st->cudnn = d;
    }
    DNN_TRY(ctx, cudnnSetStream(st->cudnn->handle, st->stream), "cudnnSetStream");
    *out = st->cudnn;
    return BIE_STATUS_OK;
}

enum bie_status make_entry(bie_context_t * ctx, const cudnn_conv_shape & k, entry * e) {
    memset(e, 0, sizeof *e);
    e->key = k;
    DNN_TRY(ctx, cudnnCreateTensorDescriptor(&e->dy), "descriptor");
    DNN_TRY(ctx, cudnnCreateTensorDescriptor(&e->dx), "descriptor");
    DNN_TRY(ctx, cudnnCreateFilterDescriptor(&e->w), "descriptor");
    DNN_TRY(ctx, cudnnCreateConvolutionDescriptor(&e->conv), "descriptor");
    e->used = true;
    const cudnnDataType_t t = dnn_type(k.dtype);
    DNN_TRY(ctx, cudnnSetTensor4dDescriptorEx(e->dy, t, k.n, k.o, k.oh, k.ow, k.gy_stride[0], k.gy_stride[1],
                                              k.gy_stride[2], k.gy_stride[3]), "grad_y descriptor");
    DNN_TRY(ctx, cudnnSetTensor4dDescriptor(e->dx, CUDNN_TENSOR_NHWC, t, k.n, k.c, k.h, k.w), "x descriptor");
    DNN_TRY(ctx, cudnnSetFilter4dDescriptor(e->w, t, CUDNN_TENSOR_NHWC, k.o, k.c, k.kh, k.kw), "filter descriptor");
    DNN_TRY(ctx, cudnnSetConvolution2dDescriptor(e->conv, k.ph, k.pw, k.sh, k.sw, k.dh, k.dw, CUDNN_CROSS_CORRELATION,
                                                 CUDNN_DATA_FLOAT), "convolution descriptor");
    DNN_TRY(ctx, cudnnSetConvolutionMathType(e->conv, k.dtype == BIE_DTYPE_F32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH),
            "math type");
    return BIE_STATUS_OK;
}

// Whether a measured algorithm may be used: it ran, fits the workspace cap and (f32) is no TF32.
template <typename P> bool usable(const P & p, int dtype) {
    return p.status == CUDNN_STATUS_SUCCESS && p.memory <= ALGO_WS_CAP &&
           (dtype != BIE_DTYPE_F32 || p.mathType == CUDNN_FMA_MATH);
}
// The fastest usable algorithm, a deterministic one when it is at most 10% slower.
template <typename P> const P * pick(const P * p, int n, int dtype) {
    const P * best = NULL, * det = NULL;
    for (int i = 0; i < n; i++) {
        if (!usable(p[i], dtype)) continue;
        if (!best || p[i].time < best->time) best = &p[i];
        if (p[i].determinism == CUDNN_DETERMINISTIC && (!det || p[i].time < det->time)) det = &p[i];
    }
    return det && best && det->time <= best->time * 1.1f ? det : best;
}

enum bie_status find_data(bie_context_t * ctx, cudnnHandle_t h, entry * e) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int n = 0;
    DNN_TRY(ctx, cudnnFindConvolutionBackwardDataAlgorithm(h, e->w, e->dy, e->conv, e->dx,
                                                           CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf),
            "cudnnFindConvolutionBackwardDataAlgorithm");
    const cudnnConvolutionBwdDataAlgoPerf_t * p = pick(perf, n, e->key.dtype);
    e->data_found = true;
    e->data_none = p == NULL;
    if (!p) return BIE_STATUS_OK;
    e->data_algo = p->algo;
    e->data_math = p->mathType;
    e->data_ws = p->memory;
    e->data_found = true;
    return BIE_STATUS_OK;
}

enum bie_status find_filter(bie_context_t * ctx, cudnnHandle_t h, entry * e) {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int n = 0;
    DNN_TRY(ctx, cudnnFindConvolutionBackwardFilterAlgorithm(h, e->dx, e->dy, e->conv, e->w,
                                                             CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf),
            "cudnnFindConvolutionBackwardFilterAlgorithm");
    const cudnnConvolutionBwdFilterAlgoPerf_t * p = pick(perf, n, e->key.dtype);
    e->filter_found = true;
    e->filter_none = p == NULL;
    if (!p) return BIE_STATUS_OK;
    e->filter_algo = p->algo;
    e->filter_math = p->mathType;
    e->filter_ws = p->memory;
    e->filter_found = true;
    return BIE_STATUS_OK;
}

// The cache entry of shape k with the algorithms asked for found (measured on first use).
enum bie_status lookup(bie_context_t * ctx, const cudnn_conv_shape & k, bool dx, bool dw, entry ** out,
                       cudnnHandle_t * h) {
    bie_cudnn_state * d;
    BIE_TRY(state_of(ctx, &d));
    *h = d->handle;
    entry * e = NULL;
    for (int i = 0; i < CACHE && !e; i++)
        if (d->e[i].used && memcmp(&d->e[i].key, &k, sizeof k) == 0) e = &d->e[i];
    if (!e) {
        e = &d->e[d->next];
        d->next = (d->next + 1) % CACHE;
        destroy_entry(e);
        const enum bie_status s = make_entry(ctx, k, e);
        if (s != BIE_STATUS_OK) {
            destroy_entry(e);
            return s;
        }
    }
    if (dx && !e->data_found) BIE_TRY(find_data(ctx, *h, e));
    if (dw && !e->filter_found) BIE_TRY(find_filter(ctx, *h, e));
    if ((dx && e->data_none) || (dw && e->filter_none))
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "cuda: cuDNN has no %s algorithm for this conv",
                             dx && e->data_none ? "grad_x" : "grad_weight");
    *out = e;
    return BIE_STATUS_OK;
}

} // namespace

bool bie_cudnn_present(void) { return true; }

void bie_cudnn_state_destroy(struct bie_cudnn_state * d) {
    if (!d) return;
    for (int i = 0; i < CACHE; i++) destroy_entry(&d->e[i]);
    cudnnDestroy(d->handle);
    free(d);
}

enum bie_status bie_cudnn_conv_prepare(bie_context_t * ctx, const cudnn_conv_shape & k, bool dx, bool dw,
                                       size_t * ws_bytes) {
    entry * e;
    cudnnHandle_t h;
    BIE_TRY(lookup(ctx, k, dx, dw, &e, &h));
    const size_t a = dx ? e->data_ws : 0, b = dw ? e->filter_ws : 0;
    *ws_bytes = a > b ? a : b;
    return BIE_STATUS_OK;
}

enum bie_status bie_cudnn_conv_dgrad(bie_context_t * ctx, const cudnn_conv_shape & k, const void * w_krsc,
                                     const void * gy, void * dx_nhwc, void * ws, size_t ws_bytes) {
    entry * e;
    cudnnHandle_t h;
    BIE_TRY(lookup(ctx, k, true, false, &e, &h));
    const float one = 1.0f, zero = 0.0f;
    DNN_TRY(ctx, cudnnSetConvolutionMathType(e->conv, e->data_math), "math type");
    DNN_TRY(ctx, cudnnConvolutionBackwardData(h, &one, e->w, w_krsc, e->dy, gy, e->conv, e->data_algo, ws, ws_bytes,
                                              &zero, e->dx, dx_nhwc), "cudnnConvolutionBackwardData");
    return BIE_STATUS_OK;
}

enum bie_status bie_cudnn_conv_wgrad(bie_context_t * ctx, const cudnn_conv_shape & k, const void * a_nhwc,
                                     const void * gy, void * dw_krsc, void * ws, size_t ws_bytes) {
    entry * e;
    cudnnHandle_t h;
    BIE_TRY(lookup(ctx, k, false, true, &e, &h));
    const float one = 1.0f, zero = 0.0f;
    DNN_TRY(ctx, cudnnSetConvolutionMathType(e->conv, e->filter_math), "math type");
    DNN_TRY(ctx, cudnnConvolutionBackwardFilter(h, &one, e->dx, a_nhwc, e->dy, gy, e->conv, e->filter_algo, ws,
                                                ws_bytes, &zero, e->w, dw_krsc), "cudnnConvolutionBackwardFilter");
    return BIE_STATUS_OK;
}

#else // built without cuDNN: the conv backward keeps its GEMM route

bool bie_cudnn_present(void) { return false; }
void bie_cudnn_state_destroy(struct bie_cudnn_state *) {}
enum bie_status bie_cudnn_conv_prepare(bie_context_t * ctx, const cudnn_conv_shape &, bool, bool, size_t *) {
    return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "cuda: this build has no cuDNN");
}
enum bie_status bie_cudnn_conv_dgrad(bie_context_t * ctx, const cudnn_conv_shape &, const void *, const void *, void *,
                                     void *, size_t) {
    return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "cuda: this build has no cuDNN");
}
enum bie_status bie_cudnn_conv_wgrad(bie_context_t * ctx, const cudnn_conv_shape &, const void *, const void *, void *,
                                     void *, size_t) {
    return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "cuda: this build has no cuDNN");
}

#endif
