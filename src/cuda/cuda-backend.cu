// SPDX-License-Identifier: Apache-2.0
// cuda-backend.cu: the CUDA backend's table (the plugin's entry point, src/bie-cuda-plugin.h), its
// per-context state (the caller's stream, one device workspace grown only when a larger shape
// arrives, the cuBLAS handle), device queries, error mapping and the stream functions behind
// include/bie-cuda.h.
//
// No entry point assumes a GPU: with no driver or device every call returns a status
// (UNSUPPORTED), never crashes. Work is queued on the context's stream; nothing synchronises the
// device except bie_context_reserve growing the workspace and the reductions that return host
// values (they synchronise the stream only).
#include "cuda-impl.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "bie-cuda-plugin.h"
}

extern "C" {

int bie_cuda_device_count(char * why, size_t cap) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError(); // clear the sticky "no driver" error
        if (why && cap)
            snprintf(why, cap, "no CUDA device: cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e),
                     cudaGetErrorName(e));
        return 0;
    }
    if (n == 0 && why && cap) snprintf(why, cap, "no CUDA device: the driver reports none");
    return n;
}

void bie_cuda_state_destroy(struct bie_cuda_state * state) {
    if (!state) return;
    if (state->cublas) cublasDestroy(state->cublas);
    bie_cudnn_state_destroy(state->cudnn);
    if (state->workspace) cudaFree(state->workspace);
    if (state->aux) cudaFree(state->aux);
    for (int i = 0; i < state->retired_count; i++) cudaFree(state->retired[i]);
    free(state->retired);
    if (state->recording) {
        cudaGraph_t g = NULL;
        if (cudaStreamEndCapture(state->record_stream, &g) == cudaSuccess && g) cudaGraphDestroy(g);
        cudaGetLastError();
    }
    if (state->record_stream) cudaStreamDestroy(state->record_stream);
    if (state->side) cudaStreamDestroy(state->side);
    if (state->fork_ev) cudaEventDestroy(state->fork_ev);
    if (state->join_ev) cudaEventDestroy(state->join_ev);
    free(state);
}

// Whether the state's stream is capturing into a CUDA graph now.
static bool capturing(const struct bie_cuda_state * s) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(s->stream, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone;
}

// Gives up an arena that is growing: freed (cudaFree waits for the work still using it), or, when a
// captured graph may still use it (*captured), kept in the retired list until the state goes.
static enum bie_status drop_arena(bie_context_t * ctx, void ** arena, size_t * size, bool * captured) {
    struct bie_cuda_state * s = ctx->cuda;
    if (*arena && *captured) {
        void ** r = (void **)realloc(s->retired, (size_t)(s->retired_count + 1) * sizeof *r);
        if (!r) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "cuda: the list of retired arenas");
        s->retired = r;
        s->retired[s->retired_count++] = *arena;
    } else if (*arena) {
        CU_TRY(ctx, cudaFree(*arena), "cudaFree(workspace)");
    }
    *arena = NULL;
    *size = 0;
    *captured = false;
    return BIE_STATUS_OK;
}

static enum bie_status ensure_state(bie_context_t * ctx) {
    if (ctx->cuda) return BIE_STATUS_OK;
    char why[256];
    if (bie_cuda_device_count(why, sizeof why) == 0)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "device: %s", why);
    ctx->cuda = (struct bie_cuda_state *)calloc(1, sizeof *ctx->cuda);
    if (!ctx->cuda) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "cuda: out of host memory");
    static unsigned long long ids = 0;
    ctx->cuda->id = __atomic_add_fetch(&ids, 1, __ATOMIC_RELAXED);
    cudaGetDevice(&ctx->cuda->device);
    return BIE_STATUS_OK;
}

} // extern "C"

enum bie_status bie_cuda_fork(bie_context_t * ctx, cudaStream_t * side) {
    struct bie_cuda_state * s = ctx->cuda;
    int dev = -1;
    CU_TRY(ctx, cudaGetDevice(&dev), "cudaGetDevice");
    if (s->side && s->side_device != dev) { // (made on another device: made again here)
        cudaStreamDestroy(s->side);
        s->side = NULL;
    }
    if (!s->side) { // (events left by a failed start, or of another device, go first)
        if (s->fork_ev) cudaEventDestroy(s->fork_ev);
        if (s->join_ev) cudaEventDestroy(s->join_ev);
        s->fork_ev = s->join_ev = NULL;
        CU_TRY(ctx, cudaEventCreateWithFlags(&s->fork_ev, cudaEventDisableTiming), "cudaEventCreate");
        CU_TRY(ctx, cudaEventCreateWithFlags(&s->join_ev, cudaEventDisableTiming), "cudaEventCreate");
        CU_TRY(ctx, cudaStreamCreateWithFlags(&s->side, cudaStreamNonBlocking), "cudaStreamCreate");
        s->side_device = dev;
    }
    CU_TRY(ctx, cudaEventRecord(s->fork_ev, s->stream), "cudaEventRecord");
    CU_TRY(ctx, cudaStreamWaitEvent(s->side, s->fork_ev, 0), "cudaStreamWaitEvent");
    *side = s->side;
    return BIE_STATUS_OK;
}

enum bie_status bie_cuda_join(bie_context_t * ctx) {
    struct bie_cuda_state * s = ctx->cuda;
    CU_TRY(ctx, cudaEventRecord(s->join_ev, s->side), "cudaEventRecord");
    CU_TRY(ctx, cudaStreamWaitEvent(s->stream, s->join_ev, 0), "cudaStreamWaitEvent");
    return BIE_STATUS_OK;
}

enum bie_status bie_cuda_fail(bie_context_t * ctx, cudaError_t e, const char * what) {
    cudaGetLastError(); // clear a non-sticky error so the next call starts clean
    return bie_set_error(ctx, BIE_STATUS_DEVICE_ERROR, "cuda: %s: %s (%s)", what, cudaGetErrorString(e),
                         cudaGetErrorName(e));
}

int bie_cuda_cc(bie_context_t * ctx) {
    struct bie_cuda_state * st = ctx->cuda;
    if (st->cc == 0) { // first use on this device: read it once
        int major = 0, minor = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, st->device) != cudaSuccess ||
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, st->device) != cudaSuccess) {
            cudaGetLastError();
            major = minor = 0;
        }
        st->cc = major * 10 + minor;
        const char * force = getenv("BIE_CUDA_GEMM");
        st->force_mma = force && strcmp(force, "mma") == 0;
        const char * bwd = getenv("BIE_CUDA_CONV_BACKWARD");
        st->force_gemm_backward = bwd && strcmp(bwd, "gemm") == 0;
        const char * wq = getenv("BIE_CUDA_WQ");
        st->force_wq_passes = wq && strcmp(wq, "passes") == 0;
        st->force_wq_xs = wq && strcmp(wq, "xs") == 0;
    }
    return st->cc;
}

int bie_cuda_sm_count(bie_context_t * ctx) {
    struct bie_cuda_state * st = ctx->cuda;
    if (!st->sm_count &&
        cudaDeviceGetAttribute(&st->sm_count, cudaDevAttrMultiProcessorCount, st->device) != cudaSuccess) {
        cudaGetLastError();
        st->sm_count = 0; // (read again next time)
    }
    return st->sm_count;
}

enum bie_status bie_cuda_check_launch(bie_context_t * ctx, const char * what) {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? BIE_STATUS_OK : bie_cuda_fail(ctx, e, what);
}

enum bie_status bie_cuda_state_get(bie_context_t * ctx, int device_index, struct bie_cuda_state ** out) {
    BIE_TRY(ensure_state(ctx));
    int cur = -1;
    CU_TRY(ctx, cudaGetDevice(&cur), "cudaGetDevice");
    if (cur != device_index) CU_TRY(ctx, cudaSetDevice(device_index), "cudaSetDevice");
    if (ctx->cuda->workspace && ctx->cuda->device != device_index)
        return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT,
                             "x: is on cuda:%d but this context's workspace is on cuda:%d (use one "
                             "context per device)",
                             device_index, ctx->cuda->device);
    if (ctx->cuda->device != device_index) { // per-device facts are read again
        ctx->cuda->sm_count = 0;
        ctx->cuda->gemm_smem_set = 0;
        ctx->cuda->wgmma_smem_set = 0;
        ctx->cuda->cc = 0;
    }
    ctx->cuda->device = device_index;
    *out = ctx->cuda;
    return BIE_STATUS_OK;
}

enum bie_status bie_cuda_workspace(bie_context_t * ctx, size_t bytes, void ** out) {
    BIE_TRY(ensure_state(ctx));
    struct bie_cuda_state * s = ctx->cuda;
    if (bytes == 0) bytes = 256;
    if (s->workspace_size < bytes) {
        // Grow by at least 1/4 so a slowly growing sequence of shapes reallocates rarely.
        size_t want = bytes + bytes / 4;
        want = (want + 0xFFFFF) & ~(size_t)0xFFFFF;
        BIE_TRY(drop_arena(ctx, &s->workspace, &s->workspace_size, &s->workspace_captured));
        void * p = NULL;
        cudaError_t e = cudaMalloc(&p, want);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "cuda: cudaMalloc(%zu) for the workspace: %s", want,
                                 cudaGetErrorString(e));
        }
        s->workspace = p;
        s->workspace_size = want;
    }
    if (!s->workspace_captured && capturing(s)) s->workspace_captured = true;
    *out = s->workspace;
    return BIE_STATUS_OK;
}

enum bie_status bie_cuda_aux(bie_context_t * ctx, size_t bytes, void ** out) {
    BIE_TRY(ensure_state(ctx));
    struct bie_cuda_state * s = ctx->cuda;
    if (s->aux_size < bytes) {
        const size_t want = (bytes + 0xFFFF) & ~(size_t)0xFFFF;
        BIE_TRY(drop_arena(ctx, &s->aux, &s->aux_size, &s->aux_captured));
        cudaError_t e = cudaMalloc(&s->aux, want);
        if (e != cudaSuccess) {
            cudaGetLastError();
            s->aux = NULL;
            return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "cuda: cudaMalloc(%zu) for the aux arena: %s", want,
                                 cudaGetErrorString(e));
        }
        s->aux_size = want;
    }
    if (!s->aux_captured && capturing(s)) s->aux_captured = true;
    *out = s->aux;
    return BIE_STATUS_OK;
}

static enum bie_status reserve(bie_context_t * ctx, size_t bytes) {
    void * p;
    return bie_cuda_workspace(ctx, bytes, &p);
}

enum bie_status bie_cuda_cublas(bie_context_t * ctx, cublasHandle_t * out) {
    BIE_TRY(ensure_state(ctx));
    struct bie_cuda_state * s = ctx->cuda;
    if (!s->cublas) {
        cublasStatus_t st = cublasCreate(&s->cublas);
        if (st != CUBLAS_STATUS_SUCCESS) {
            s->cublas = NULL;
            return bie_set_error(ctx, BIE_STATUS_DEVICE_ERROR, "cuda: cublasCreate: %s", cublasGetStatusString(st));
        }
        // Exact f32 GEMMs: no TF32 down-conversion unless the caller's f16/bf16 operands ask for it.
        cublasSetMathMode(s->cublas, CUBLAS_PEDANTIC_MATH);
    }
    cublasStatus_t st = cublasSetStream(s->cublas, s->stream);
    if (st != CUBLAS_STATUS_SUCCESS)
        return bie_set_error(ctx, BIE_STATUS_DEVICE_ERROR, "cuda: cublasSetStream: %s", cublasGetStatusString(st));
    *out = s->cublas;
    return BIE_STATUS_OK;
}

// The functions of include/bie-cuda.h, reached through the table (libbie checked ctx).

static enum bie_status set_stream(bie_context_t * ctx, void * stream) {
    BIE_TRY(ensure_state(ctx));
    if (ctx->cuda->recording) { // (the stream the calls go to again after bie_cuda_record_end)
        ctx->cuda->record_user = (cudaStream_t)stream;
        return BIE_STATUS_OK;
    }
    // The workspace is ordered by the stream: before other work may reuse it, what the old stream
    // still has queued must be done. A stream being captured into a CUDA graph runs nothing now
    // (and a synchronisation would end its capture): the graph's replays are the caller's to order.
    cudaStreamCaptureStatus to = cudaStreamCaptureStatusNone, from = cudaStreamCaptureStatusNone;
    if (ctx->cuda->workspace && (cudaStream_t)stream != ctx->cuda->stream) {
        CU_TRY(ctx, cudaStreamIsCapturing((cudaStream_t)stream, &to), "cudaStreamIsCapturing");
        CU_TRY(ctx, cudaStreamIsCapturing(ctx->cuda->stream, &from), "cudaStreamIsCapturing");
        if (to == cudaStreamCaptureStatusNone && from == cudaStreamCaptureStatusNone)
            CU_TRY(ctx, cudaStreamSynchronize(ctx->cuda->stream), "cudaStreamSynchronize (old stream)");
    }
    ctx->cuda->stream = (cudaStream_t)stream;
    return BIE_STATUS_OK;
}

static void * stream(const bie_context_t * ctx) { return (void *)ctx->cuda->stream; }

static enum bie_status synchronize(bie_context_t * ctx) {
    CU_TRY(ctx, cudaStreamSynchronize(ctx->cuda->stream), "cudaStreamSynchronize");
    return BIE_STATUS_OK;
}

// Recorded calls (include/bie-cuda.h): a stream capture, in this thread's mode, on a stream of the
// context's own (the caller's may be the legacy default stream, which cannot capture), instantiated
// at the end; a replay is one graph launch on the caller's stream.
struct bie_cuda_graph {
    cudaGraphExec_t exec;
    unsigned long long state, epoch; // the recording state's id and graph_epoch
};

static enum bie_status record_begin(bie_context_t * ctx) {
    BIE_TRY(ensure_state(ctx));
    struct bie_cuda_state * s = ctx->cuda;
    if (s->recording) return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "cuda: already recording");
    if (capturing(s))
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "cuda: the context's stream is being captured already");
    int dev = -1;
    CU_TRY(ctx, cudaGetDevice(&dev), "cudaGetDevice");
    if (s->record_stream && s->record_device != dev) {
        CU_TRY(ctx, cudaStreamDestroy(s->record_stream), "cudaStreamDestroy");
        s->record_stream = NULL;
    }
    if (!s->record_stream) {
        CU_TRY(ctx, cudaStreamCreateWithFlags(&s->record_stream, cudaStreamNonBlocking), "cudaStreamCreate");
        s->record_device = dev;
    }
    CU_TRY(ctx, cudaStreamBeginCapture(s->record_stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    s->record_user = s->stream;
    s->stream = s->record_stream;
    s->recording = true;
    return BIE_STATUS_OK;
}

static enum bie_status record_end(bie_context_t * ctx, struct bie_cuda_graph ** out) {
    struct bie_cuda_state * s = ctx->cuda;
    if (!s->recording) return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "cuda: record_end without record_begin");
    s->stream = s->record_user;
    s->recording = false;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(s->record_stream, &g);
    if (e != cudaSuccess || !g) {
        cudaGetLastError();
        if (g) cudaGraphDestroy(g);
        return bie_cuda_fail(ctx, e != cudaSuccess ? e : cudaErrorStreamCaptureInvalidated, "cudaStreamEndCapture");
    }
    if (!out) {
        cudaGraphDestroy(g);
        return BIE_STATUS_OK;
    }
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return bie_cuda_fail(ctx, e, "cudaGraphInstantiate");
    }
    *out = (struct bie_cuda_graph *)malloc(sizeof **out);
    if (!*out) {
        cudaGraphExecDestroy(exec);
        return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "cuda: out of host memory");
    }
    (*out)->exec = exec;
    (*out)->state = s->id;
    (*out)->epoch = s->graph_epoch;
    return BIE_STATUS_OK;
}

static enum bie_status replay(bie_context_t * ctx, const struct bie_cuda_graph * g) {
    BIE_TRY(ensure_state(ctx));
    if (g->state != ctx->cuda->id || g->epoch != ctx->cuda->graph_epoch)
        return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "cuda: graph: %s (record it again)",
                             g->state != ctx->cuda->id ? "recorded with another context"
                                                       : "stale: a library plan it used was released");
    if (capturing(ctx->cuda))
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "cuda: the context's stream is being captured");
    CU_TRY(ctx, cudaGraphLaunch(g->exec, ctx->cuda->stream), "cudaGraphLaunch");
    return BIE_STATUS_OK;
}

static void graph_destroy(struct bie_cuda_graph * g) {
    cudaGraphExecDestroy(g->exec);
    free(g);
}

extern "C" {

// Slots (defined in the other files of src/cuda).
bie_layer_slot bie_cuda_layer_forward, bie_cuda_layer_backward;
bie_pack_slot bie_cuda_pack, bie_cuda_unpack;
bie_reduce_slot bie_cuda_reduce;
bie_scale_slot bie_cuda_weight_scale;
bie_ste_slot bie_cuda_binarize_ste;
bie_matmul_slot bie_cuda_matmul_forward, bie_cuda_matmul_backward;
bie_embedding_slot bie_cuda_embedding_forward, bie_cuda_embedding_backward;
bie_pool_slot bie_cuda_affine_maxpool2d, bie_cuda_affine_maxpool2d_backward;
enum bie_status bie_cuda_batchnorm_forward(bie_context_t * ctx, const struct bie_bn_call * c);
enum bie_status bie_cuda_batchnorm_backward(bie_context_t * ctx, const struct bie_bn_call * c);

// The table libbie reaches the backend through (src/bie-cuda-plugin.h). A new entry point is one
// line here and one in struct bie_cuda_plugin.
static const struct bie_cuda_plugin table = {
    .abi = BIE_CUDA_PLUGIN_ABI,
    .size = sizeof(struct bie_cuda_plugin),
    .layout = BIE_CUDA_PLUGIN_LAYOUT,
    .version = BIE_VERSION_STRING,
    .backend =
        {
            .name = "cuda",
            BIE_BACKEND_SLOTS(bie_cuda),
            .reduce = bie_cuda_reduce,
            .weight_scale = bie_cuda_weight_scale,
            .affine_maxpool2d = bie_cuda_affine_maxpool2d,
            .affine_maxpool2d_backward = bie_cuda_affine_maxpool2d_backward,
        },
    .device_count = bie_cuda_device_count,
    .state_destroy = bie_cuda_state_destroy,
    .reserve = reserve,
    .set_stream = set_stream,
    .stream = stream,
    .synchronize = synchronize,
    .record_begin = record_begin,
    .record_end = record_end,
    .replay = replay,
    .graph_destroy = graph_destroy,
    .wq_forward = bie_cuda_wq_forward,
    .wq_backward = bie_cuda_wq_backward,
    .wq_dequantize = bie_cuda_wq_dequantize,
    .batchnorm_forward = bie_cuda_batchnorm_forward,
    .batchnorm_backward = bie_cuda_batchnorm_backward,
};

// The plugin's one exported symbol, and the same table for programs that link these objects.
__attribute__((visibility("default"))) const struct bie_cuda_plugin * BIE_CUDA_PLUGIN_ENTRY(void) { return &table; }
const struct bie_cuda_plugin * BIE_CUDA_LINKED_ENTRY(void) { return &table; }
}
