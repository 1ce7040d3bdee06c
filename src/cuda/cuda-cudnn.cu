// SPDX-License-Identifier: Apache-2.0
// cuda-cudnn.cu: the two float convolutions of a conv layer's backward through cuDNN:
//   dgrad: dX = conv_transpose(dY, Wc)   (grad_x before scale_w and the STE mask)
//   wgrad: dW = conv_weight(A, dY)       (grad_W before scale_a)
// with Wc the weight codes (filter KRSC: [O][kh][kw][C], dense), A the activation codes (NHWC,
// dense), dX NHWC dense, dY the caller's grad_y with its own strides; all of one float dtype (the
// codes are exact in f16 and bf16), f32 accumulation, no TF32 for f32 (FMA math only).
// f16 and bf16 go through cuDNN's graph API: per shape, an operation graph of the one convolution,
// its heuristics' engine configurations in order (those with reduced-precision reductions or
// down-converted inputs left out: sums stay f32), the first that finalises as an execution plan,
// and up to GALT deterministic others as alternatives. The first call made outside a CUDA graph
// capture times them all once and keeps the fastest where it beats the first by a clear margin (a
// shape first run inside a capture keeps the first); each call then only binds the data pointers
// (a variant pack) and executes the plan. f32 goes through the convolution API, its algorithm
// measured once per shape (cudnnFind*, no TF32). Both are kept in a small cache per context.
#include "cuda-impl.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if BIE_HAVE_CUDNN
#include <cudnn.h>

namespace {

constexpr int CACHE = 64;                  // shapes kept per context
constexpr size_t ALGO_WS_CAP = 1ull << 30; // largest cuDNN workspace an algorithm may ask for
// The graph API's alternatives to its heuristics' first plan: at most GALT, each asking for no more
// workspace than that plan or GALT_WS, kept when faster than it by GALT_MARGIN (measured once).
constexpr int GALT = 5;
constexpr int64_t GALT_WS = 32ll << 20;
constexpr float GALT_MARGIN = 0.9f;

// An execution plan of the graph API and what it holds on to.
struct gplan {
    cudnnBackendDescriptor_t t[3], conv, op, graph, plan; // (NULL where not made)
    cudnnBackendDescriptor_t alt[GALT];                   // the alternatives still to be timed
    int64_t alt_ws[GALT];
    int nalt;       // (0 once timed, or when there are none)
    int64_t uid[3]; // the tensors' ids, in the order of run()'s pointers
    int64_t ws;     // the plan's workspace
    bool tried, ok;
};

struct entry {
    cudnn_conv_shape key;
    bool used;
    gplan gdata, gfilter; // f16 / bf16: the graph API's plans
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
#define DNN_TRY(ctx, expr, what)                                                                                       \
    do {                                                                                                               \
        cudnnStatus_t s_ = (expr);                                                                                     \
        if (s_ != CUDNN_STATUS_SUCCESS) return fail(ctx, s_, what);                                                    \
    } while (0)

cudnnDataType_t dnn_type(int dt) {
    return dt == BIE_DTYPE_F16 ? CUDNN_DATA_HALF : dt == BIE_DTYPE_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

// Destroys the alternatives not kept.
void gplan_drop_alts(gplan * g) {
    for (int i = 0; i < g->nalt; i++)
        if (g->alt[i]) cudnnBackendDestroyDescriptor(g->alt[i]);
    g->nalt = 0;
}

void gplan_destroy(gplan * g) {
    gplan_drop_alts(g);
    cudnnBackendDescriptor_t * all[7] = {&g->plan, &g->graph, &g->op, &g->conv, &g->t[0], &g->t[1], &g->t[2]};
    for (int i = 0; i < 7; i++)
        if (*all[i]) {
            cudnnBackendDestroyDescriptor(*all[i]);
            *all[i] = NULL;
        }
    g->tried = g->ok = false;
}

// The workspace g's next run needs: its plan's, and while the alternatives wait to be timed on
// that run, the largest of theirs too.
size_t gplan_ws(const gplan & g) {
    int64_t w = g.ws;
    for (int i = 0; i < g.nalt; i++) w = g.alt_ws[i] > w ? g.alt_ws[i] : w;
    return (size_t)w;
}

void destroy_entry(entry * e) {
    if (!e->used) return;
    gplan_destroy(&e->gdata);
    gplan_destroy(&e->gfilter);
    if (e->dy) cudnnDestroyTensorDescriptor(e->dy);
    if (e->dx) cudnnDestroyTensorDescriptor(e->dx);
    if (e->w) cudnnDestroyFilterDescriptor(e->w);
    if (e->conv) cudnnDestroyConvolutionDescriptor(e->conv);
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
    e->used = true;
    if (k.dtype != BIE_DTYPE_F32) return BIE_STATUS_OK; // (the graph API's plans are made on first use)
    DNN_TRY(ctx, cudnnCreateTensorDescriptor(&e->dy), "descriptor");
    DNN_TRY(ctx, cudnnCreateTensorDescriptor(&e->dx), "descriptor");
    DNN_TRY(ctx, cudnnCreateFilterDescriptor(&e->w), "descriptor");
    DNN_TRY(ctx, cudnnCreateConvolutionDescriptor(&e->conv), "descriptor");
    const cudnnDataType_t t = dnn_type(k.dtype);
    DNN_TRY(ctx,
            cudnnSetTensor4dDescriptorEx(e->dy, t, k.n, k.o, k.oh, k.ow, k.gy_stride[0], k.gy_stride[1], k.gy_stride[2],
                                         k.gy_stride[3]),
            "grad_y descriptor");
    DNN_TRY(ctx, cudnnSetTensor4dDescriptor(e->dx, CUDNN_TENSOR_NHWC, t, k.n, k.c, k.h, k.w), "x descriptor");
    DNN_TRY(ctx, cudnnSetFilter4dDescriptor(e->w, t, CUDNN_TENSOR_NHWC, k.o, k.c, k.kh, k.kw), "filter descriptor");
    DNN_TRY(ctx,
            cudnnSetConvolution2dDescriptor(e->conv, k.ph, k.pw, k.sh, k.sw, k.dh, k.dw, CUDNN_CROSS_CORRELATION,
                                            CUDNN_DATA_FLOAT),
            "convolution descriptor");
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
    const P *best = NULL, *det = NULL;
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
    DNN_TRY(ctx,
            cudnnFindConvolutionBackwardDataAlgorithm(h, e->w, e->dy, e->conv, e->dx,
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
    DNN_TRY(ctx,
            cudnnFindConvolutionBackwardFilterAlgorithm(h, e->dx, e->dy, e->conv, e->w,
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

// --- the graph API (f16, bf16) -------------------------------------------------------------------

#define G_TRY(expr)                                                                                                    \
    do {                                                                                                               \
        if ((expr) != CUDNN_STATUS_SUCCESS) return false;                                                              \
    } while (0)

bool set_i64(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, int64_t n, const int64_t * v) {
    return cudnnBackendSetAttribute(d, a, CUDNN_TYPE_INT64, n, v) == CUDNN_STATUS_SUCCESS;
}
bool set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendDescriptor_t v) {
    return cudnnBackendSetAttribute(d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v) == CUDNN_STATUS_SUCCESS;
}

// A tensor [d0, d1, d2, d3] with these strides (16-byte aligned data).
bool g_tensor(cudnnBackendDescriptor_t * t, int64_t uid, cudnnDataType_t dt, const int64_t * dims, const int64_t * st) {
    G_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, t));
    const int64_t align = 16;
    G_TRY(cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt));
    if (!set_i64(*t, CUDNN_ATTR_TENSOR_DIMENSIONS, 4, dims) || !set_i64(*t, CUDNN_ATTR_TENSOR_STRIDES, 4, st) ||
        !set_i64(*t, CUDNN_ATTR_TENSOR_UNIQUE_ID, 1, &uid) || !set_i64(*t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 1, &align))
        return false;
    return cudnnBackendFinalize(*t) == CUDNN_STATUS_SUCCESS;
}

// Whether an engine configuration keeps f32 sums of unconverted inputs (and, deterministic, gives
// the same bits on every run).
bool full_precision(cudnnBackendDescriptor_t cfg, bool deterministic) {
    cudnnBackendDescriptor_t engine;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) != CUDNN_STATUS_SUCCESS) return false;
    int64_t n = 0;
    bool ok = cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                       &engine) == CUDNN_STATUS_SUCCESS;
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    n = 0;
    ok = ok && cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                        CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes) == CUDNN_STATUS_SUCCESS;
    for (int64_t i = 0; ok && i < n; i++)
        if (notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION ||
            notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS ||
            (deterministic && notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC))
            ok = false;
    cudnnBackendDestroyDescriptor(engine);
    return ok;
}

// The plan of one convolution of shape k: data (dgrad: W, dX from dY) or filter (wgrad: dW from X,
// dY); tensors W/dW [o, c, kh, kw] and X/dX [n, c, h, w] dense channels-last, dY with k's strides.
bool g_build(cudnnHandle_t h, const cudnn_conv_shape & k, bool data, gplan * g) {
    const cudnnDataType_t dt = dnn_type(k.dtype);
    const int64_t wd[4] = {k.o, k.c, k.kh, k.kw}, ws[4] = {(int64_t)k.kh * k.kw * k.c, 1, (int64_t)k.kw * k.c, k.c};
    const int64_t xd[4] = {k.n, k.c, k.h, k.w}, xs[4] = {(int64_t)k.h * k.w * k.c, 1, (int64_t)k.w * k.c, k.c};
    const int64_t yd[4] = {k.n, k.o, k.oh, k.ow};
    const int64_t ys[4] = {k.gy_stride[0], k.gy_stride[1], k.gy_stride[2], k.gy_stride[3]};
    g->uid[0] = 1; // the weight (codes, or dW)
    g->uid[1] = 2; // the activations (dX, or the codes X)
    g->uid[2] = 3; // dY
    if (!g_tensor(&g->t[0], 1, dt, wd, ws) || !g_tensor(&g->t[1], 2, dt, xd, xs) || !g_tensor(&g->t[2], 3, dt, yd, ys))
        return false;
    G_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &g->conv));
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    const int64_t nd = 2, dil[2] = {k.dh, k.dw}, str[2] = {k.sh, k.sw}, pad[2] = {k.ph, k.pw};
    G_TRY(cudnnBackendSetAttribute(g->conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp));
    G_TRY(cudnnBackendSetAttribute(g->conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
    if (!set_i64(g->conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, 1, &nd) ||
        !set_i64(g->conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, 2, dil) ||
        !set_i64(g->conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, 2, str) ||
        !set_i64(g->conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, 2, pad) ||
        !set_i64(g->conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, 2, pad))
        return false;
    G_TRY(cudnnBackendFinalize(g->conv));
    const float one = 1.0f, zero = 0.0f;
    if (data) {
        G_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, &g->op));
        if (!set_desc(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, g->conv) ||
            !set_desc(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, g->t[0]) ||
            !set_desc(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, g->t[1]) ||
            !set_desc(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, g->t[2]))
            return false;
        G_TRY(cudnnBackendSetAttribute(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_TYPE_FLOAT, 1,
                                       &one));
        G_TRY(cudnnBackendSetAttribute(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, CUDNN_TYPE_FLOAT, 1,
                                       &zero));
    } else {
        G_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, &g->op));
        if (!set_desc(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, g->conv) ||
            !set_desc(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, g->t[0]) ||
            !set_desc(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, g->t[1]) ||
            !set_desc(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, g->t[2]))
            return false;
        G_TRY(cudnnBackendSetAttribute(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_TYPE_FLOAT, 1,
                                       &one));
        G_TRY(cudnnBackendSetAttribute(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA, CUDNN_TYPE_FLOAT, 1,
                                       &zero));
    }
    G_TRY(cudnnBackendFinalize(g->op));
    G_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &g->graph));
    if (!set_desc(g->graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, g->op)) return false;
    G_TRY(cudnnBackendSetAttribute(g->graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h));
    G_TRY(cudnnBackendFinalize(g->graph));
    // the heuristics' configurations, in their order; the first full-precision one that finalises,
    // then the alternatives
    cudnnBackendDescriptor_t heur;
    G_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur));
    const cudnnBackendHeurMode_t hm = CUDNN_HEUR_MODE_A;
    int64_t n = 0;
    bool ok = set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g->graph) &&
              cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &hm) ==
                  CUDNN_STATUS_SUCCESS &&
              cudnnBackendFinalize(heur) == CUDNN_STATUS_SUCCESS &&
              cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n,
                                       NULL) == CUDNN_STATUS_SUCCESS;
    constexpr int MAXCFG = 32;
    cudnnBackendDescriptor_t cfg[MAXCFG];
    int made = 0;
    if (ok && n > 0) {
        if (n > MAXCFG) n = MAXCFG;
        for (; made < n; made++)
            if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[made]) != CUDNN_STATUS_SUCCESS)
                break;
        int64_t got = 0;
        ok = made == n && cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                                   n, &got, cfg) == CUDNN_STATUS_SUCCESS;
        for (int64_t i = 0; ok && i < got && g->nalt < GALT; i++) {
            if (!full_precision(cfg[i], g->plan != NULL)) continue;
            cudnnBackendDescriptor_t plan;
            if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) != CUDNN_STATUS_SUCCESS)
                break;
            int64_t w = 0, cnt = 0;
            if (cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h) ==
                    CUDNN_STATUS_SUCCESS &&
                set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg[i]) &&
                cudnnBackendFinalize(plan) == CUDNN_STATUS_SUCCESS &&
                cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt,
                                         &w) == CUDNN_STATUS_SUCCESS &&
                w >= 0 && (size_t)w <= ALGO_WS_CAP && (!g->plan || w <= g->ws || w <= GALT_WS)) {
                if (!g->plan) {
                    g->plan = plan;
                    g->ws = w;
                } else {
                    g->alt[g->nalt] = plan;
                    g->alt_ws[g->nalt++] = w;
                }
            } else {
                cudnnBackendDestroyDescriptor(plan);
            }
        }
    }
    for (int i = 0; i < made; i++) cudnnBackendDestroyDescriptor(cfg[i]);
    cudnnBackendDestroyDescriptor(heur);
    return g->plan != NULL;
}

// Executes plan p on (weight side, activation side, dY) pointers and the workspace.
cudnnStatus_t g_exec(cudnnHandle_t h, const gplan * g, cudnnBackendDescriptor_t p, void * w, void * x, const void * dy,
                     void * ws) {
    cudnnBackendDescriptor_t vp;
    cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (s != CUDNN_STATUS_SUCCESS) return s;
    void * ptrs[3] = {w, x, (void *)dy};
    s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, g->uid);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(vp);
    if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendExecute(h, p, vp);
    cudnnBackendDestroyDescriptor(vp);
    return s;
}

// The median time (ms) of 3 executions of plan p after one to warm it, or -1 where one fails.
float g_time(cudnnHandle_t h, cudaStream_t stream, const gplan * g, cudnnBackendDescriptor_t p, void * w, void * x,
             const void * dy, void * ws, cudaEvent_t ev[4]) {
    if (g_exec(h, g, p, w, x, dy, ws) != CUDNN_STATUS_SUCCESS || cudaEventRecord(ev[0], stream) != cudaSuccess)
        return -1.0f;
    for (int r = 1; r < 4; r++)
        if (g_exec(h, g, p, w, x, dy, ws) != CUDNN_STATUS_SUCCESS || cudaEventRecord(ev[r], stream) != cudaSuccess)
            return -1.0f;
    float t[3];
    if (cudaEventSynchronize(ev[3]) != cudaSuccess) return -1.0f;
    for (int r = 0; r < 3; r++)
        if (cudaEventElapsedTime(&t[r], ev[r], ev[r + 1]) != cudaSuccess) return -1.0f;
    const float lo = fminf(t[0], fminf(t[1], t[2])), hi = fmaxf(t[0], fmaxf(t[1], t[2]));
    return t[0] + t[1] + t[2] - lo - hi;
}

// Times g's plan and its alternatives once, on the call's own pointers (each execution writes the
// whole output, so the last, by the plan kept, leaves the call's result), and keeps the fastest
// where it takes under GALT_MARGIN of the plan's time. Inside a capture nothing is timed and the
// plan stays. Errors while timing leave the plan as it was.
void g_measure(cudaStream_t stream, cudnnHandle_t h, gplan * g, void * w, void * x, const void * dy, void * ws) {
    // (the device idle first, so that no work beside the timed runs, such as the other convolution's
    // on a second stream, skews them)
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone ||
        cudaDeviceSynchronize() != cudaSuccess) {
        cudaGetLastError();
        gplan_drop_alts(g);
        return;
    }
    cudaEvent_t ev[4] = {};
    int made = 0;
    while (made < 4 && cudaEventCreate(&ev[made]) == cudaSuccess) made++;
    if (made == 4) {
        const float t0 = g_time(h, stream, g, g->plan, w, x, dy, ws, ev);
        float best = t0 * GALT_MARGIN;
        int pick = -1;
        for (int i = 0; t0 > 0.0f && i < g->nalt; i++) {
            const float t = g_time(h, stream, g, g->alt[i], w, x, dy, ws, ev);
            if (t > 0.0f && t < best) best = t, pick = i;
        }
        if (pick >= 0) {
            cudnnBackendDestroyDescriptor(g->plan);
            g->plan = g->alt[pick];
            g->ws = g->alt_ws[pick];
            g->alt[pick] = NULL;
        }
    }
    cudaGetLastError();
    for (int i = 0; i < made; i++) cudaEventDestroy(ev[i]);
    gplan_drop_alts(g);
}

// Runs plan g on (weight side, activation side, dY) pointers and the workspace, on the handle's
// stream (its first run outside a capture measures the alternatives first).
enum bie_status g_run(bie_context_t * ctx, cudaStream_t stream, cudnnHandle_t h, gplan * g, void * w, void * x,
                      const void * dy, void * ws) {
    if (g->nalt) g_measure(stream, h, g, w, x, dy, ws);
    const cudnnStatus_t s = g_exec(h, g, g->plan, w, x, dy, ws);
    if (s != CUDNN_STATUS_SUCCESS) return fail(ctx, s, "cudnnBackendExecute");
    return BIE_STATUS_OK;
}

// The graph plan of shape k (made on first use); false when cuDNN makes none.
bool g_plan(cudnnHandle_t h, entry * e, bool data) {
    gplan * g = data ? &e->gdata : &e->gfilter;
    if (!g->tried) {
        g->tried = true;
        g->ok = g_build(h, e->key, data, g);
        if (!g->ok) {
            gplan_destroy(g);
            g->tried = true;
        }
    }
    return g->ok;
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
        if (e->used) ctx->cuda->graph_epoch++; // (graphs recorded with its plans are stale)
        destroy_entry(e);
        const enum bie_status s = make_entry(ctx, k, e);
        if (s != BIE_STATUS_OK) {
            destroy_entry(e);
            return s;
        }
    }
    if (k.dtype != BIE_DTYPE_F32) { // the graph API
        const bool okx = !dx || g_plan(*h, e, true), okw = !dw || g_plan(*h, e, false);
        if (!okx || !okw)
            return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "cuda: cuDNN has no %s plan for this conv",
                                 !okx ? "grad_x" : "grad_weight");
        *out = e;
        return BIE_STATUS_OK;
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
                                       size_t * dx_ws, size_t * dw_ws) {
    entry * e;
    cudnnHandle_t h;
    BIE_TRY(lookup(ctx, k, dx, dw, &e, &h));
    const bool graph = k.dtype != BIE_DTYPE_F32;
    *dx_ws = !dx ? 0 : graph ? gplan_ws(e->gdata) : e->data_ws;
    *dw_ws = !dw ? 0 : graph ? gplan_ws(e->gfilter) : e->filter_ws;
    return BIE_STATUS_OK;
}

enum bie_status bie_cudnn_conv_dgrad(bie_context_t * ctx, cudaStream_t s, const cudnn_conv_shape & k,
                                     const void * w_krsc, const void * gy, void * dx_nhwc, void * ws, size_t ws_bytes) {
    entry * e;
    cudnnHandle_t h;
    BIE_TRY(lookup(ctx, k, true, false, &e, &h));
    DNN_TRY(ctx, cudnnSetStream(h, s), "cudnnSetStream");
    if (k.dtype != BIE_DTYPE_F32) return g_run(ctx, s, h, &e->gdata, (void *)w_krsc, dx_nhwc, gy, ws);
    const float one = 1.0f, zero = 0.0f;
    DNN_TRY(ctx, cudnnSetConvolutionMathType(e->conv, e->data_math), "math type");
    DNN_TRY(ctx,
            cudnnConvolutionBackwardData(h, &one, e->w, w_krsc, e->dy, gy, e->conv, e->data_algo, ws, ws_bytes, &zero,
                                         e->dx, dx_nhwc),
            "cudnnConvolutionBackwardData");
    return BIE_STATUS_OK;
}

enum bie_status bie_cudnn_conv_wgrad(bie_context_t * ctx, cudaStream_t s, const cudnn_conv_shape & k,
                                     const void * a_nhwc, const void * gy, void * dw_krsc, void * ws, size_t ws_bytes) {
    entry * e;
    cudnnHandle_t h;
    BIE_TRY(lookup(ctx, k, false, true, &e, &h));
    DNN_TRY(ctx, cudnnSetStream(h, s), "cudnnSetStream");
    if (k.dtype != BIE_DTYPE_F32) return g_run(ctx, s, h, &e->gfilter, dw_krsc, (void *)a_nhwc, gy, ws);
    const float one = 1.0f, zero = 0.0f;
    DNN_TRY(ctx, cudnnSetConvolutionMathType(e->conv, e->filter_math), "math type");
    DNN_TRY(ctx,
            cudnnConvolutionBackwardFilter(h, &one, e->dx, a_nhwc, e->dy, gy, e->conv, e->filter_algo, ws, ws_bytes,
                                           &zero, e->w, dw_krsc),
            "cudnnConvolutionBackwardFilter");
    return BIE_STATUS_OK;
}

#else // built without cuDNN: the conv backward keeps its GEMM route

bool bie_cudnn_present(void) { return false; }
void bie_cudnn_state_destroy(struct bie_cudnn_state *) {}
enum bie_status bie_cudnn_conv_prepare(bie_context_t * ctx, const cudnn_conv_shape &, bool, bool, size_t *, size_t *) {
    return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "cuda: this build has no cuDNN");
}
enum bie_status bie_cudnn_conv_dgrad(bie_context_t * ctx, cudaStream_t, const cudnn_conv_shape &, const void *,
                                     const void *, void *, void *, size_t) {
    return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "cuda: this build has no cuDNN");
}
enum bie_status bie_cudnn_conv_wgrad(bie_context_t * ctx, cudaStream_t, const cudnn_conv_shape &, const void *,
                                     const void *, void *, void *, size_t) {
    return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "cuda: this build has no cuDNN");
}

#endif
