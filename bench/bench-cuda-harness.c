// SPDX-License-Identifier: Apache-2.0
// bench-cuda-harness.c: what every CUDA case of `bie bench` (bench-cuda.c) is timed and printed
// with: the failure checks, the stream and cuBLAS handle, the two timings of a call (graph replays
// and isolated calls, bench-cuda.c says how they are read), random device inputs rotated over more
// than the L2 cache, and the rows (text or --json) with their --case/--shape selection.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench-cuda.h"
#ifdef BIE_HAVE_CUDNN
#include <cudnn.h>
#endif

int g_capturing = 0, g_capture_failed = 0;
void fail(const char * what, const char * why) {
    if (g_capturing) {
        g_capture_failed = 1;
        return;
    }
    fprintf(stderr, "bench-cuda: %s: %s\n", what, why);
    exit(1);
}
int g_quick = 0, g_json = 0, g_call_only = 0;
const char *g_case = NULL, *g_shape = NULL;
cudaStream_t g_stream;
cublasHandle_t g_blas;
int g_rows;
static const size_t ROTATE_BYTES = (size_t)160 << 20; // > L2 (50-60 MB on H100/H200)

static int cmp_float(const void * a, const void * b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static double median_of(float * t, int n) {
    qsort(t, (size_t)n, sizeof(float), cmp_float);
    return t[n / 2];
}

// Device time per call: `per` consecutive calls (rotating over the input sets) captured into one
// graph, whose replays are timed; -1 when the capture or a replay failed.
static double time_graph_ms(run_fn fn, void * state, int rots, int reps, cudaEvent_t a, cudaEvent_t b) {
    const int per = rots < 8 ? 8 : rots;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    g_capturing = 1;
    g_capture_failed = 0;
    if (cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeRelaxed) != cudaSuccess) g_capture_failed = 1;
    else {
        for (int i = 0; i < per && !g_capture_failed; i++) fn(state, i % rots);
        if (cudaStreamEndCapture(g_stream, &graph) != cudaSuccess) g_capture_failed = 1;
    }
    g_capturing = 0;
    if (!g_capture_failed && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) g_capture_failed = 1;
    float t[64];
    for (int i = 0; i < 2 + reps && !g_capture_failed; i++) { // two warm-up replays
        if (cudaEventRecord(a, g_stream) != cudaSuccess || cudaGraphLaunch(exec, g_stream) != cudaSuccess ||
            cudaEventRecord(b, g_stream) != cudaSuccess || cudaEventSynchronize(b) != cudaSuccess) {
            g_capture_failed = 1;
            break;
        }
        if (i >= 2) CK(cudaEventElapsedTime(&t[i - 2], a, b));
    }
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (g_capture_failed) {
        cudaGetLastError(); // clear the error the failed capture left
        fprintf(stderr, "bench-cuda: graph capture failed; call timing only\n");
        return -1.0;
    }
    return median_of(t, reps) / per;
}

// Both timings of one call of fn, rotating over `rots` input sets.
struct timing time_ms(run_fn fn, void * state, int rots) {
    const int warm = g_quick ? 2 : 5, reps = g_quick ? 5 : 21;
    for (int i = 0; i < warm; i++) fn(state, i % rots);
    CK(cudaStreamSynchronize(g_stream));
    float t[64];
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(a, g_stream));
        fn(state, (warm + i) % rots);
        CK(cudaEventRecord(b, g_stream));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&t[i], a, b));
    }
    CK(cudaGetLastError());
    struct timing r;
    r.call_ms = median_of(t, reps);
    r.ms = g_call_only ? -1.0 : time_graph_ms(fn, state, rots, reps, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return r;
}

void * dev_alloc_random(size_t bytes) {
    void * p;
    CK(cudaMalloc(&p, bytes));
    // random bytes through a host buffer in chunks (bits / int8 / halves in a sane range)
    const size_t chunk = (size_t)16 << 20;
    unsigned char * h = malloc(chunk);
    uint64_t s = 0x9e3779b97f4a7c15ull ^ bytes;
    for (size_t off = 0; off < bytes; off += chunk) {
        const size_t n = bytes - off < chunk ? bytes - off : chunk;
        for (size_t i = 0; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            h[i] = (unsigned char)(s >> 56);
        }
        CK(cudaMemcpy((char *)p + off, h, n, cudaMemcpyHostToDevice));
    }
    free(h);
    return p;
}

// Random f16 values of either sign with magnitudes in [2^-8, 1) (built from their bit fields).
void * dev_half_random(size_t n) {
    uint16_t * h = malloc(n * sizeof(uint16_t));
    uint64_t s = 0x2545F4914F6CDD1Dull ^ n;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const unsigned sign = (unsigned)(s >> 63), exp = 7 + (unsigned)((s >> 40) % 8),
                       man = (unsigned)(s >> 20) & 0x3ff;
        h[i] = (uint16_t)(sign << 15 | exp << 10 | man);
    }
    void * p;
    CK(cudaMalloc(&p, n * sizeof(uint16_t)));
    CK(cudaMemcpy(p, h, n * sizeof(uint16_t), cudaMemcpyHostToDevice));
    free(h);
    return p;
}

// Input sets to rotate over so that together they exceed the L2 cache (a 2 MB binary weight
// needs 80 of them).
int rotations(size_t bytes_per_set) {
    int r = (int)(ROTATE_BYTES / (bytes_per_set ? bytes_per_set : 1)) + 1;
    return r < 1 ? 1 : r > MAX_ROTATIONS ? MAX_ROTATIONS : r;
}

size_t dense_bytes(enum bie_dtype dt, int nd, const int64_t * shape) {
    struct bie_tensor t;
    size_t n = 0;
    bie_tensor_make(&t, NULL, dt, nd, shape);
    bie_tensor_nbytes(&t, &n);
    return n;
}

struct bie_tensor dev_tensor(void * data, enum bie_dtype dt, int nd, const int64_t * shape) {
    struct bie_tensor t;
    bie_tensor_make(&t, data, dt, nd, shape);
    t.device_type = BIE_DEVICE_CUDA;
    t.device_index = 0;
    return t;
}

// A side's time per call: the lower of its two medians (a side without a graph time: its call
// time). Graph replays are the lower one for bie and cuDNN (whose calls spend much of their time on
// the host), while cuBLAS's large GEMMs run a few percent slower in a run of graph replays than
// one at a time, so each side is credited with its better figure.
double best_ms(struct timing t) { return t.ms > 0 && t.ms < t.call_ms ? t.ms : t.call_ms; }

// What every --json row also names, made once: the GPU's name, the CUDA runtime's, cuBLAS's and
// (where built with it) cuDNN's versions, bie's version and the UTC date of the run.
const char * json_run_info(void) {
    static char info[512];
    if (info[0]) return info;
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    char name[sizeof prop.name];
    bench_json_text(name, sizeof name, prop.name);
    int rt = 0, blas = 0;
    CK(cudaRuntimeGetVersion(&rt));
    CB(cublasGetVersion(g_blas, &blas));
    char dnn[32] = "none";
#ifdef BIE_HAVE_CUDNN
    const size_t v = cudnnGetVersion();
    snprintf(dnn, sizeof dnn, "%zu.%zu.%zu", v / 10000, v / 100 % 100, v % 100);
#endif
    char date[16];
    bench_utc_date(date, sizeof date);
    snprintf(info, sizeof info,
             "\"device\": \"%s\", \"cuda\": \"%d.%d\", \"cublas\": \"%d.%d.%d\", \"cudnn\": \"%s\", "
             "\"bie_version\": \"%s\", \"date\": \"%s\"",
             name, rt / 1000, rt % 1000 / 10, blas / 10000, blas / 100 % 100, blas % 100, dnn, bie_version_string(),
             date);
    return info;
}

// One row: each side's best time per call and their ratio (the figure the targets are read
// against), then the device times (graph replays, "-" where the calls could not be captured) and
// the isolated-call times.
void print_row(const char * name, const char * shape, struct timing bie, const char * base_name, struct timing base,
               double ops) {
    g_rows++;
    const double ms = best_ms(bie), base_ms = best_ms(base);
    const double ratio = base_ms > 0 && ms > 0 ? base_ms / ms : 0.0;
    if (g_json) {
        printf("{\"case\": \"%s %s\", \"backend\": \"cuda\", \"threads\": 0, \"bie_ms\": %.6f, \"baseline\": \"%s\", "
               "\"baseline_ms\": %.6f, \"speedup\": %.4f, \"gops\": %.1f, \"bie_graph_ms\": %.6f, "
               "\"baseline_graph_ms\": %.6f, \"bie_call_ms\": %.6f, \"baseline_call_ms\": %.6f, %s}\n",
               name, shape, ms, base_name, base_ms, ratio, ops / (ms * 1e-3) / 1e9, bie.ms, base.ms, bie.call_ms,
               base.call_ms, json_run_info());
        fflush(stdout);
        return;
    }
    char g1[16] = "-", g2[16] = "-";
    if (bie.ms > 0) snprintf(g1, sizeof g1, "%.4f", bie.ms);
    if (base.ms > 0) snprintf(g2, sizeof g2, "%.4f", base.ms);
    printf("%-28s %-26s bie %9.4f ms  %-13s %9.4f ms  ratio %6.2fx %8.1f TOPS | graph %s / %s, call %.4f / %.4f ms\n",
           name, shape, ms, base_name, base_ms, ratio, ops / (ms * 1e-3) / 1e12, g1, g2, bie.call_ms, base.call_ms);
    fflush(stdout);
}

// Whether a row of group runs: --case names the group (or part of it) or part of the row's name,
// and the row's shape contains --shape.
int want_row(const char * group, const char * name, const char * shape) {
    return (!g_case || strstr(group, g_case) || strstr(name, g_case)) && (!g_shape || strstr(shape, g_shape));
}
