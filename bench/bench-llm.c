// SPDX-License-Identifier: Apache-2.0
// bench-llm.c: `bie bench --llm`: the weight-only n-bit layer (bie_wq_linear_forward) at LLaMA-7B
// and 70B layer shapes (K x N = 4096x4096, 4096x11008, 11008x4096, 8192x28672) and M = 1, 4, 16,
// 256, 4096 rows, against OpenBLAS on the f32 weight (sgemv for M = 1, sgemm otherwise), each row
// with bie's achieved weight bandwidth (qweight + scales + zeros bytes / time) and its ratio to the
// machine's memory bandwidth, measured in the same run by a copy benchmark (read + write bytes of
// a 512 MiB copy on every thread / time). Medians of --repeat runs (3 for the M = 4096 rows) after
// a warm-up. Options as bench.h (--case matches "KxN" or "M=..", --threads, --repeat, --json);
// --backend cuda runs bench-llm-cuda.c's GPU rows instead.
#include "bench.h"

#include "bie.h"

#include <cblas.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const int64_t LLM_SHAPES[][2] = {{4096, 4096}, {4096, 11008}, {11008, 4096}, {8192, 28672}};
static const int64_t LLM_ROWS[] = {1, 4, 16, 256, 4096};

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}
static int cmp_d(const void * a, const void * b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double * t, int n) {
    qsort(t, (size_t)n, sizeof t[0], cmp_d);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static void * xalloc(size_t bytes) {
    void * p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "bie bench: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

// GB/s of a parallel copy of 512 MiB (bytes read + written), median of 5; *read_gbs: of a parallel
// sum over 512 MiB (bytes read).
static double copy_gbs(int threads, double * read_gbs) {
    const size_t n = (size_t)512 << 20;
    char *a = xalloc(n), *b = xalloc(n);
    memset(a, 1, n);
    memset(b, 2, n);
    double t[5];
    for (int i = 0; i < 6; i++) {
        const double t0 = now_ms();
#pragma omp parallel for num_threads(threads)
        for (int c = 0; c < 512; c++) memcpy(b + (size_t)c * (1 << 20), a + (size_t)c * (1 << 20), 1 << 20);
        if (i) t[i - 1] = now_ms() - t0;
    }
    const double copy = 2.0 * (double)n / (median(t, 5) * 1e6);
    uint64_t sink = 0; // (what the reads sum to, so that they are not optimised away)
    for (int i = 0; i < 6; i++) {
        const double t0 = now_ms();
        uint64_t sum = 0;
#pragma omp parallel for reduction(+ : sum) num_threads(threads)
        for (size_t w = 0; w < n / 8; w++) sum += ((const uint64_t *)a)[w];
        sink += sum;
        if (i) t[i - 1] = now_ms() - t0;
    }
    *read_gbs = (double)n / (median(t, 5) * 1e6);
    if (sink == 1) fprintf(stderr, "bench: %llu\n", (unsigned long long)sink); // (never: bytes are 1)
    free(a);
    free(b);
    return copy;
}

struct llm_case {
    bie_context_t * ctx;
    struct bie_wq_desc d;
    struct bie_wq_weight w;
    struct bie_tensor qw[16], sc, zr, x, y;
    float *xf, *wf[16], *yf;
    int64_t M, K, N;
    int nq, nf, iq, jf; // weight copies (rotated so that every call streams from memory) and the next one
};

static int run_bie(struct llm_case * c) {
    c->w.qweight = &c->qw[c->iq++ % c->nq];
    const enum bie_status s = bie_wq_linear_forward(c->ctx, &c->d, &c->w, &c->x, &c->y);
    if (s != BIE_STATUS_OK) fprintf(stderr, "bie bench: %s\n", bie_context_last_error(c->ctx));
    return s != BIE_STATUS_OK;
}
static void run_blas(struct llm_case * c) {
    const float * wf = c->wf[c->jf++ % c->nf];
    if (c->M == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)c->N, (int)c->K, 1.0f, wf, (int)c->K, c->xf, 1, 0.0f, c->yf, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)c->M, (int)c->N, (int)c->K, 1.0f, c->xf, (int)c->K,
                    wf, (int)c->K, 0.0f, c->yf, (int)c->N);
}

static double time_side(struct llm_case * c, bool bie, int reps) {
    double t[64];
    if (reps > 64) reps = 64;
    for (int i = 0; i <= reps; i++) {
        const double t0 = now_ms();
        if (bie) {
            if (run_bie(c)) return -1.0;
        } else {
            run_blas(c);
        }
        if (i) t[i - 1] = now_ms() - t0;
    }
    return median(t, reps);
}

static int llm_row(const struct bench_options * o, int threads, int64_t K, int64_t N, int64_t M, int bits,
                   enum bie_wq_act act, double copy_gbs) {
    struct llm_case c;
    memset(&c, 0, sizeof c);
    c.M = M, c.K = K, c.N = N;
    struct bie_context_params p;
    bie_context_params_default(&p);
    p.backend = BIE_BACKEND_CPU;
    p.num_threads = threads;
    if (bie_context_create(&p, &c.ctx) != BIE_STATUS_OK) return 1;
    openblas_set_num_threads(threads);
    const int gs = 128;
    c.d = (struct bie_wq_desc){
        .in_features = K, .out_features = N, .bits = bits, .group_size = gs, .zero = BIE_WQ_ZERO_CODE, .act = act};
    int64_t rows = 0;
    bie_wq_qweight_rows(&c.d, NULL, &rows);
    const int64_t G = (K + gs - 1) / gs;
    const size_t qbytes = (size_t)(rows * N) * 4, fbytes = (size_t)(N * K) * 4, flush = (size_t)256 << 20;
    c.nq = (int)((flush + qbytes - 1) / qbytes);
    c.nf = (int)((flush + fbytes - 1) / fbytes);
    c.nq = c.nq > 16 ? 16 : c.nq;
    c.nf = c.nf > 16 ? 16 : c.nf;
    for (int i = 0; i < c.nq; i++) {
        bie_tensor_make(&c.qw[i], xalloc(qbytes), BIE_DTYPE_I32, 2, (int64_t[]){rows, N});
        for (int64_t e = 0; e < rows * N; e++) ((uint32_t *)c.qw[i].data)[e] = rnd();
    }
    bie_tensor_make(&c.sc, xalloc((size_t)(G * N) * 2), BIE_DTYPE_F16, 2, (int64_t[]){G, N});
    bie_tensor_make(&c.zr, xalloc((size_t)(G * N) * 2), BIE_DTYPE_F16, 2, (int64_t[]){G, N});
    for (int64_t i = 0; i < G * N; i++) {
        ((uint16_t *)c.sc.data)[i] = 0x2000 + (uint16_t)(rnd() & 0x3ff); // ~0.008
        ((uint16_t *)c.zr.data)[i] = 0x4800;                             // 8.0
    }
    c.w = (struct bie_wq_weight){.qweight = &c.qw[0], .scales = &c.sc, .zeros = &c.zr};
    c.xf = xalloc((size_t)(M * K) * 4);
    c.yf = xalloc((size_t)(M * N) * 4);
    for (int64_t i = 0; i < M * K; i++) c.xf[i] = (float)(rnd() % 2001) * 1e-3f - 1.0f;
    for (int f = 0; f < c.nf; f++) {
        float * wf = c.wf[f] = xalloc(fbytes);
#pragma omp parallel for num_threads(threads)
        for (int64_t i = 0; i < N * K; i++) wf[i] = (float)((i * 2654435761u) % 2001) * 1e-5f - 0.01f;
    }
    bie_tensor_make(&c.x, c.xf, BIE_DTYPE_F32, 2, (int64_t[]){M, K});
    bie_tensor_make(&c.y, xalloc((size_t)(M * N) * 4), BIE_DTYPE_F32, 2, (int64_t[]){M, N});
    const int reps = M >= 4096 ? (o->repeat < 3 ? o->repeat : 3) : o->repeat;
    const double bie_ms = time_side(&c, true, reps);
    const double blas_ms = time_side(&c, false, reps);
    const double wbytes = (double)qbytes + (double)(G * N) * 4;
    const double gbs = bie_ms > 0 ? wbytes / (bie_ms * 1e6) : 0.0;
    char name[96];
    snprintf(name, sizeof name, "wq%d-g128%s %lldx%lld M=%lld", bits, act == BIE_WQ_ACT_INT8 ? "-i8" : "", (long long)K,
             (long long)N, (long long)M);
    const char * base = M == 1 ? "openblas-sgemv" : "openblas-sgemm";
    if (o->json)
        printf("{\"case\": \"%s\", \"backend\": \"cpu\", \"threads\": %d, \"bie_ms\": %.4f, \"baseline\": \"%s\", "
               "\"baseline_ms\": %.4f, \"speedup\": %.3f, \"gbs\": %.2f, \"copy_gbs\": %.2f, \"bw_ratio\": %.3f, "
               "\"gops\": %.2f, \"repeat\": %d, %s}\n",
               name, threads, bie_ms, base, blas_ms, blas_ms / bie_ms, gbs, copy_gbs, gbs / copy_gbs,
               2.0 * (double)(M * N * K) / (bie_ms * 1e6), reps, bench_cpu_run_info());
    else
        printf("%-36s %3d %10.3f  %-15s %10.3f %7.2fx %8.1f %6.0f%% %9.1f\n", name, threads, bie_ms, base, blas_ms,
               blas_ms / bie_ms, gbs, 100.0 * gbs / copy_gbs, 2.0 * (double)(M * N * K) / (bie_ms * 1e6));
    fflush(stdout);
    for (int i = 0; i < c.nq; i++) free(c.qw[i].data);
    for (int f = 0; f < c.nf; f++) free(c.wf[f]);
    free(c.sc.data);
    free(c.zr.data);
    free(c.xf);
    free(c.yf);
    free(c.y.data);
    bie_context_destroy(c.ctx);
    return bie_ms < 0;
}

int bench_llm_main(const struct bench_options * o, int argc, char ** argv) {
    if (!strcmp(o->backend, "cuda")) {
        if (bench_llm_cuda_main) return bench_llm_cuda_main(o, argc, argv);
        return bench_run_cuda_program(argc, argv); // (the bie program: its GPU rows are bie_bench_cuda's)
    }
    const int threads = o->threads > 0 ? o->threads : omp_get_num_procs();
    double rd = 0.0;
    const double cp = copy_gbs(threads, &rd);
    // The machine's bandwidth: the larger of the copy's (read + write) and a read-only sum's rates,
    // so that the ratios below are not flattered by a slow copy.
    const double copy = cp > rd ? cp : rd;
    if (!o->json) {
        printf("memory bandwidth (%d threads): copy %.1f GB/s (read + write), read %.1f GB/s; rows use %.1f\n", threads,
               cp, rd, copy);
        printf("%-36s %3s %10s  %-15s %10s %8s %8s %7s %9s\n", "case", "thr", "bie_ms", "baseline", "base_ms",
               "speedup", "GB/s", "of copy", "gops");
    }
    int failed = 0;
    for (size_t s = 0; s < sizeof LLM_SHAPES / sizeof LLM_SHAPES[0]; s++)
        for (size_t m = 0; m < sizeof LLM_ROWS / sizeof LLM_ROWS[0]; m++)
            for (int v = 0; v < 3; v++) { // 4-bit f32 path, 4-bit int8 path, 2-bit
                const int64_t M = LLM_ROWS[m];
                if (v > 0 && M > 16) continue; // the int8 path and 2-bit rows: decode shapes
                char key[64];
                snprintf(key, sizeof key, "%lldx%lld M=%lld %s", (long long)LLM_SHAPES[s][0],
                         (long long)LLM_SHAPES[s][1], (long long)M,
                         v == 0   ? "wq4"
                         : v == 1 ? "wq4-i8"
                                  : "wq2");
                if (o->filter && !strstr(key, o->filter)) continue;
                failed |= llm_row(o, threads, LLM_SHAPES[s][0], LLM_SHAPES[s][1], M, v == 2 ? 2 : 4,
                                  v == 1 ? BIE_WQ_ACT_INT8 : BIE_WQ_ACT_FLOAT, copy);
            }
    return failed;
}
