// SPDX-License-Identifier: Apache-2.0
// bench-cuda-host.c: the host cost of a CUDA layer call (bie bench's "plan-host" rows): the wall
// time the calling thread spends in one call, which bounds how fast a network of small layers can
// run. Small layers (their kernels finish well within the host's time), 100 calls queued without
// synchronising (fewer launches than the driver's queue holds, so that no call waits for the GPU),
// median over 21 such runs of the time per call. The planned call (bie_plan_forward) is measured
// against the entry point that validates and routes every call (bie_conv2d_forward /
// bie_linear_forward); the ratio is entry-point time / planned time.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "bie-cuda.h"
#include "bie.h"

#define HOST_CALLS 100
#define HOST_RUNS 21

static void host_fail(const char * what, const char * why) {
    fprintf(stderr, "bench-cuda: %s: %s\n", what, why);
    exit(1);
}
#define HK(ctx, expr)                                                                                                  \
    do {                                                                                                               \
        if ((expr) != BIE_STATUS_OK) host_fail(#expr, bie_context_last_error(ctx));                                    \
    } while (0)
#define HC(expr)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (expr);                                                                                       \
        if (e_ != cudaSuccess) host_fail(#expr, cudaGetErrorString(e_));                                               \
    } while (0)

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

static int cmp_double(const void * a, const void * b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// Median microseconds per call of call(ctx, arg) over HOST_RUNS runs of HOST_CALLS calls.
static double host_us(bie_context_t * ctx, enum bie_status (*call)(bie_context_t *, void *), void * arg) {
    for (int i = 0; i < 20; i++) HK(ctx, call(ctx, arg));
    HK(ctx, bie_context_cuda_synchronize(ctx));
    double t[HOST_RUNS];
    for (int r = 0; r < HOST_RUNS; r++) {
        const double t0 = now_us();
        for (int i = 0; i < HOST_CALLS; i++) call(ctx, arg);
        t[r] = (now_us() - t0) / HOST_CALLS;
        HK(ctx, bie_context_cuda_synchronize(ctx));
    }
    qsort(t, HOST_RUNS, sizeof t[0], cmp_double);
    return t[HOST_RUNS / 2];
}

struct host_case {
    int conv;
    struct bie_conv2d_desc cd;
    struct bie_linear_desc ld;
    struct bie_forward_args a;
    bie_plan_t * plan;
};

static enum bie_status call_direct(bie_context_t * ctx, void * arg) {
    struct host_case * h = arg;
    return h->conv ? bie_conv2d_forward(ctx, &h->cd, &h->a) : bie_linear_forward(ctx, &h->ld, &h->a);
}
static enum bie_status call_planned(bie_context_t * ctx, void * arg) {
    struct host_case * h = arg;
    return bie_plan_forward(ctx, h->plan, &h->a);
}

static void * dev_zeros(size_t bytes) {
    void * p;
    HC(cudaMalloc(&p, bytes));
    HC(cudaMemset(p, 0x35, bytes)); // (a fixed, non-zero pattern: f16 0.3 and mixed bits)
    return p;
}

static struct bie_tensor on_device(void * p, enum bie_dtype dt, int nd, const int64_t * shape) {
    struct bie_tensor t;
    bie_tensor_make(&t, p, dt, nd, shape);
    t.device_type = BIE_DEVICE_CUDA;
    return t;
}

// One row: a binary layer with f16 x (channels-last for the conv), a packed weight and device scales.
static void host_row(bie_context_t * ctx, int conv, int json, const char * info) {
    struct host_case h;
    memset(&h, 0, sizeof h);
    h.conv = conv;
    const int64_t N = 1, C = 64, HW = 8, O = 64, M = 16, K = 1024;
    struct bie_tensor x, w, y, sa, sw;
    float * scales = dev_zeros(8);
    const float one[2] = {0.5f, 0.25f};
    HC(cudaMemcpy(scales, one, sizeof one, cudaMemcpyHostToDevice));
    char shape[64];
    if (conv) {
        const int64_t xs[4] = {N, HW, HW, C}, ws[4] = {O, 3, 3, C}, ys[4] = {N, HW, HW, O};
        const int32_t to_nchw[4] = {0, 3, 1, 2};
        x = on_device(dev_zeros((size_t)(N * HW * HW * C) * 2), BIE_DTYPE_F16, 4, xs);
        w = on_device(dev_zeros((size_t)(O * 9 * C / 8)), BIE_DTYPE_B1, 4, ws);
        y = on_device(dev_zeros((size_t)(N * HW * HW * O) * 2), BIE_DTYPE_F16, 4, ys);
        bie_tensor_permute(&x, to_nchw);
        bie_tensor_permute(&w, to_nchw);
        bie_tensor_permute(&y, to_nchw);
        h.cd = (struct bie_conv2d_desc){BIE_QUANT_BINARY, C, O, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, BIE_PAD_ZERO};
        snprintf(shape, sizeof shape, "N%lld C%lld %lldx%lld 3x3", (long long)N, (long long)C, (long long)HW,
                 (long long)HW);
    } else {
        const int64_t xs[2] = {M, K}, ws[2] = {K, K}, ys[2] = {M, K};
        x = on_device(dev_zeros((size_t)(M * K) * 2), BIE_DTYPE_F16, 2, xs);
        w = on_device(dev_zeros((size_t)(K * K / 8)), BIE_DTYPE_B1, 2, ws);
        y = on_device(dev_zeros((size_t)(M * K) * 2), BIE_DTYPE_F16, 2, ys);
        h.ld = (struct bie_linear_desc){BIE_QUANT_BINARY, K, K};
        snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)M, (long long)K, (long long)K);
    }
    sa = on_device(scales, BIE_DTYPE_F32, 0, NULL);
    sw = on_device(scales + 1, BIE_DTYPE_F32, 0, NULL);
    h.a = (struct bie_forward_args){.x = &x, .weight = &w, .scale_a = &sa, .scale_w = &sw, .y = &y};
    if (conv) HK(ctx, bie_plan_conv2d_forward(ctx, &h.cd, &h.a, &h.plan));
    else HK(ctx, bie_plan_linear_forward(ctx, &h.ld, &h.a, &h.plan));
    const double direct = host_us(ctx, call_direct, &h), planned = host_us(ctx, call_planned, &h);
    const char * name = conv ? "plan-host binary conv f16" : "plan-host binary linear f16";
    if (json) {
        printf("{\"case\": \"%s %s\", \"backend\": \"cuda\", \"threads\": 0, \"bie_ms\": %.6f, \"baseline\": "
               "\"entry point\", \"baseline_ms\": %.6f, \"speedup\": %.4f, \"unit\": \"host time per call\", %s}\n",
               name, shape, planned * 1e-3, direct * 1e-3, direct / planned, info);
    } else {
        printf("%-28s %-26s planned %6.2f us  entry point %6.2f us  ratio %5.2fx (host time per call)\n", name, shape,
               planned, direct, direct / planned);
        printf("  plan: %s\n", bie_plan_describe(h.plan));
    }
    fflush(stdout);
    bie_plan_destroy(h.plan);
    HC(cudaFree(x.data));
    HC(cudaFree(w.data));
    HC(cudaFree(y.data));
    HC(cudaFree(scales));
}

void bench_cuda_host_rows(bie_context_t * ctx, int json, const char * info) {
    host_row(ctx, 1, json, info);
    host_row(ctx, 0, json, info);
}
