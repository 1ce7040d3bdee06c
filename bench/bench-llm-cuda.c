// SPDX-License-Identifier: Apache-2.0
// bench-llm-cuda.c: the GPU rows of `bie bench --llm --backend cuda` (built only with the CUDA
// backend): bie_wq_linear_forward on f16 activations (4-bit g128 GPTQ form at every M; 2-bit g128
// at M <= 16) against cuBLAS fp16 (cublasGemmEx, f16 in and out, f32 accumulation, tensor cores)
// on the same shapes, in the same process. Each side runs a CUDA graph of consecutive calls over
// enough copies of its weight to exceed the L2 cache (so every call streams its weight from DRAM),
// replayed after a warm-up; the time per call is the median replay time / calls. Achieved GB/s
// counts bie's weight bytes (qweight + scales + zeros) and cuBLAS's (the f16 weight); the memory
// bandwidth is a device-to-device copy of 1 GiB measured in the same run (read + write bytes).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "bie-cuda.h"
#include "bie.h"

#define CK(expr)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (expr);                                                                                       \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "bench-llm-cuda: %s: %s\n", #expr, cudaGetErrorString(e_));                                \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static const int64_t SHAPES[][2] = {{4096, 4096}, {4096, 11008}, {11008, 4096}, {8192, 28672}};
static const int64_t ROWS[] = {1, 4, 16, 32, 64, 256, 4096};
#define L2_FLUSH_BYTES ((size_t)160 << 20) // weights rotated until a graph touches this much

static int cmp_f(const void * a, const void * b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static cudaStream_t g_stream;

typedef int (*call_fn)(void * state, int copy);

// Median ms per call of a graph of `calls` calls (copy i % copies), 7 replays after 2 warm-ups.
static double graph_ms(call_fn fn, void * state, int copies, int calls) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
    int bad = 0;
    for (int i = 0; i < calls; i++) bad |= fn(state, i % copies);
    CK(cudaStreamEndCapture(g_stream, &g));
    if (bad) return -1.0;
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float t[9];
    for (int r = 0; r < 9; r++) {
        CK(cudaEventRecord(a, g_stream));
        CK(cudaGraphLaunch(ge, g_stream));
        CK(cudaEventRecord(b, g_stream));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&t[r], a, b));
    }
    qsort(t + 2, 7, sizeof(float), cmp_f);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return (double)t[2 + 3] / calls;
}

static void * dalloc(size_t bytes) {
    void * p;
    CK(cudaMalloc(&p, bytes));
    CK(cudaMemset(p, 0, bytes));
    return p;
}

struct wq_state {
    bie_context_t * ctx;
    struct bie_wq_desc d;
    struct bie_tensor qw[64], sc, zr, x, y;
};
static int wq_call(void * v, int copy) {
    struct wq_state * s = v;
    struct bie_wq_weight w = {.qweight = &s->qw[copy], .scales = &s->sc, .zeros = &s->zr};
    const enum bie_status st = bie_wq_linear_forward(s->ctx, &s->d, &w, &s->x, &s->y);
    if (st != BIE_STATUS_OK) fprintf(stderr, "bench-llm-cuda: %s\n", bie_context_last_error(s->ctx));
    return st != BIE_STATUS_OK;
}

struct blas_state {
    cublasHandle_t h;
    void * w[64];
    void *x, *y;
    int64_t M, K, N;
};
static int blas_call(void * v, int copy) {
    struct blas_state * s = v;
    const float one = 1.0f, zero = 0.0f;
    // y[M, N] = x[M, K] W^T with W [N, K] row-major (nn.Linear's layout): column-major y^T = W x^T.
    return cublasGemmEx(s->h, CUBLAS_OP_T, CUBLAS_OP_N, (int)s->N, (int)s->M, (int)s->K, &one, s->w[copy], CUDA_R_16F,
                        (int)s->K, s->x, CUDA_R_16F, (int)s->K, &zero, s->y, CUDA_R_16F, (int)s->N, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS;
}

static double copy_gbs(void) {
    const size_t n = (size_t)1 << 30;
    void *a = dalloc(n), *b = dalloc(n);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float t[7];
    for (int i = 0; i < 8; i++) {
        CK(cudaEventRecord(e0, g_stream));
        CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, g_stream));
        CK(cudaEventRecord(e1, g_stream));
        CK(cudaEventSynchronize(e1));
        if (i) CK(cudaEventElapsedTime(&t[i - 1], e0, e1));
    }
    qsort(t, 7, sizeof(float), cmp_f);
    CK(cudaFree(a));
    CK(cudaFree(b));
    return 2.0 * (double)n / ((double)t[3] * 1e6);
}

static int row(const struct bench_options * o, bie_context_t * ctx, cublasHandle_t h, int64_t K, int64_t N, int64_t M,
               int bits, double copy) {
    const int gs = 128;
    struct wq_state s;
    memset(&s, 0, sizeof s);
    s.ctx = ctx;
    s.d = (struct bie_wq_desc){
        .in_features = K, .out_features = N, .bits = bits, .group_size = gs, .zero = BIE_WQ_ZERO_CODE};
    int64_t rows = 0;
    bie_wq_qweight_rows(&s.d, NULL, &rows);
    const int64_t G = (K + gs - 1) / gs;
    const size_t qbytes = (size_t)(rows * N) * 4, fbytes = (size_t)(N * K) * 2;
    const int qcopies = (int)((L2_FLUSH_BYTES + qbytes - 1) / qbytes),
              fcopies = (int)((L2_FLUSH_BYTES + fbytes - 1) / fbytes);
    uint32_t * host = malloc(qbytes);
    for (size_t i = 0; i < qbytes / 4; i++) host[i] = (uint32_t)(i * 2654435761u) ^ 0x5a5a5a5au;
    for (int c = 0; c < qcopies; c++) {
        bie_tensor_make(&s.qw[c], dalloc(qbytes), BIE_DTYPE_I32, 2, (int64_t[]){rows, N});
        s.qw[c].device_type = BIE_DEVICE_CUDA;
        CK(cudaMemcpy(s.qw[c].data, host, qbytes, cudaMemcpyHostToDevice));
    }
    free(host);
    uint16_t * st = malloc((size_t)(G * N) * 2);
    for (int64_t i = 0; i < G * N; i++) st[i] = 0x2000; // scales 2^-7
    bie_tensor_make(&s.sc, dalloc((size_t)(G * N) * 2), BIE_DTYPE_F16, 2, (int64_t[]){G, N});
    bie_tensor_make(&s.zr, dalloc((size_t)(G * N) * 2), BIE_DTYPE_F16, 2, (int64_t[]){G, N});
    CK(cudaMemcpy(s.sc.data, st, (size_t)(G * N) * 2, cudaMemcpyHostToDevice));
    for (int64_t i = 0; i < G * N; i++) st[i] = 0x4800; // zeros 8
    CK(cudaMemcpy(s.zr.data, st, (size_t)(G * N) * 2, cudaMemcpyHostToDevice));
    free(st);
    s.sc.device_type = s.zr.device_type = BIE_DEVICE_CUDA;
    bie_tensor_make(&s.x, dalloc((size_t)(M * K) * 2), BIE_DTYPE_F16, 2, (int64_t[]){M, K});
    bie_tensor_make(&s.y, dalloc((size_t)(M * N) * 2), BIE_DTYPE_F16, 2, (int64_t[]){M, N});
    s.x.device_type = s.y.device_type = BIE_DEVICE_CUDA;
    struct blas_state b = {.h = h, .x = s.x.data, .y = s.y.data, .M = M, .K = K, .N = N};
    for (int c = 0; c < fcopies; c++) b.w[c] = dalloc(fbytes);
    const int calls = M >= 256 ? 4 : 20;
    if (wq_call(&s, 0)) return 1; // first call outside the graph: workspace and kernel attributes
    CK(cudaStreamSynchronize(g_stream));
    const double t_bie = graph_ms(wq_call, &s, qcopies, calls > qcopies ? calls : qcopies);
    const double t_blas = graph_ms(blas_call, &b, fcopies, calls > fcopies ? calls : fcopies);
    const double wbytes = (double)qbytes + 4.0 * (double)(G * N);
    const double gbs = wbytes / (t_bie * 1e6), gbs_blas = (double)fbytes / (t_blas * 1e6);
    char name[96];
    snprintf(name, sizeof name, "wq%d-g128 %lldx%lld M=%lld", bits, (long long)K, (long long)N, (long long)M);
    if (o->json) {
        struct cudaDeviceProp prop;
        CK(cudaGetDeviceProperties(&prop, 0));
        char dev[sizeof prop.name], date[16];
        bench_json_text(dev, sizeof dev, prop.name);
        bench_utc_date(date, sizeof date);
        int rt = 0;
        CK(cudaRuntimeGetVersion(&rt));
        printf(
            "{\"case\": \"%s\", \"backend\": \"cuda\", \"bie_ms\": %.5f, \"baseline\": \"cublas-fp16\", "
            "\"baseline_ms\": %.5f, \"speedup\": %.3f, \"gbs\": %.1f, \"baseline_gbs\": %.1f, \"copy_gbs\": %.1f, "
            "\"bw_ratio\": %.3f, \"device\": \"%s\", \"cuda\": \"%d.%d\", \"bie_version\": \"%s\", \"date\": \"%s\"}\n",
            name, t_bie, t_blas, t_blas / t_bie, gbs, gbs_blas, copy, gbs / copy, dev, rt / 1000, rt % 1000 / 10,
            bie_version_string(), date);
    } else
        printf("%-32s %10.4f  %-12s %10.4f %7.2fx %8.0f %6.0f%% %8.0f\n", name, t_bie, "cublas-fp16", t_blas,
               t_blas / t_bie, gbs, 100.0 * gbs / copy, gbs_blas);
    fflush(stdout);
    for (int c = 0; c < qcopies; c++) CK(cudaFree(s.qw[c].data));
    for (int c = 0; c < fcopies; c++) CK(cudaFree(b.w[c]));
    CK(cudaFree(s.sc.data));
    CK(cudaFree(s.zr.data));
    CK(cudaFree(s.x.data));
    CK(cudaFree(s.y.data));
    return t_bie < 0 || t_blas < 0;
}

int bench_llm_cuda_main(const struct bench_options * o, int argc, char ** argv) {
    (void)argc;
    (void)argv;
    if (!bie_backend_available(BIE_BACKEND_CUDA)) {
        fprintf(stderr, "bie bench: no CUDA device\n");
        return 2;
    }
    CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    bie_context_t * ctx;
    if (bie_context_create(NULL, &ctx) != BIE_STATUS_OK) return 1;
    bie_context_set_cuda_stream(ctx, g_stream);
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
    cublasSetStream(h, g_stream);
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const double copy = copy_gbs();
    if (!o->json) {
        printf("%s: device copy bandwidth (read + write) %.0f GB/s\n", prop.name, copy);
        printf("%-32s %10s  %-12s %10s %8s %8s %7s %8s\n", "case", "bie_ms", "baseline", "base_ms", "speedup", "GB/s",
               "of copy", "base GB/s");
    }
    int failed = 0;
    for (size_t si = 0; si < sizeof SHAPES / sizeof SHAPES[0]; si++)
        for (size_t mi = 0; mi < sizeof ROWS / sizeof ROWS[0]; mi++)
            for (int bits = 4; bits >= 2; bits -= 2) {
                const int64_t M = ROWS[mi];
                if (bits == 2 && M > 16) continue;
                char key[64];
                snprintf(key, sizeof key, "%lldx%lld M=%lld wq%d", (long long)SHAPES[si][0], (long long)SHAPES[si][1],
                         (long long)M, bits);
                if (o->filter && !strstr(key, o->filter)) continue;
                failed |= row(o, ctx, h, SHAPES[si][0], SHAPES[si][1], M, bits, copy);
            }
    cublasDestroy(h);
    bie_context_destroy(ctx);
    return failed;
}
