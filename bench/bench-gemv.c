// SPDX-License-Identifier: Apache-2.0
// bench-gemv.c: the `gemv` cases of `bie bench`: a linear layer with M <= 8 rows (x f32, weight
// packed: B1, S4 or I8, y f32), whose time is that of streaming its packed weight, timed against a
// plain read of the same bytes (the memory bandwidth, measured in the same run on the same threads).
// Two rows per case:
//   NAME       the weight stays where the previous call left it (in the caches when it fits);
//              the read is of the same buffer.
//   NAME-cold  every call uses the next of as many copies of the weight as fill BENCH_COLD_BYTES
//              (far beyond the last-level cache), so each call streams its weight from DRAM; the
//              reads go through the same copies (each call and read on a copy the other did not
//              touch last).
// The speedup column is then read_ms / bie_ms: the fraction of the read bandwidth the layer reaches
// (1.0 = as fast as reading its weight and nothing else).
#include "bench.h"

#include "bie.h"

#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BENCH_COLD_BYTES ((size_t)512 << 20)

typedef long long v8i __attribute__((vector_size(64)));

// XOR of every 64-byte block of [p, p + n) (n a multiple of 256), a read the compiler cannot drop.
__attribute__((target_clones("avx512f", "avx2", "default"))) static long long read_bytes(const uint8_t * p, size_t n) {
    v8i a = {0}, b = {0}, c = {0}, d = {0};
    for (size_t i = 0; i < n; i += 256) {
        v8i x, y, z, w;
        memcpy(&x, p + i, 64);
        memcpy(&y, p + i + 64, 64);
        memcpy(&z, p + i + 128, 64);
        memcpy(&w, p + i + 192, 64);
        a ^= x;
        b ^= y;
        c ^= z;
        d ^= w;
    }
    const v8i s = a ^ b ^ c ^ d;
    long long r = 0;
    for (int i = 0; i < 8; i++) r ^= s[i];
    return r;
}

struct gemv_state {
    bie_context_t * ctx;
    struct bie_linear_desc lin;
    struct bie_tensor x, w, y, sa, sw;
    uint8_t * copies; // ncopy weights of wbytes (padded to wstride) back to back
    size_t wbytes, wstride;
    int ncopy, next, threads;
    volatile long long sink;
};

static int bie_call(void * v) {
    struct gemv_state * s = v;
    struct bie_tensor w = s->w;
    w.data = s->copies + (size_t)s->next * s->wstride;
    s->next = (s->next + 1) % s->ncopy;
    struct bie_forward_args a = {.x = &s->x, .weight = &w, .scale_a = &s->sa, .scale_w = &s->sw, .y = &s->y};
    const enum bie_status st = bie_linear_forward(s->ctx, &s->lin, &a);
    if (st != BIE_STATUS_OK) fprintf(stderr, "bie bench: %s\n", bie_context_last_error(s->ctx));
    return st != BIE_STATUS_OK;
}

static int read_call(void * v) {
    struct gemv_state * s = v;
    const uint8_t * p = s->copies + (size_t)s->next * s->wstride;
    s->next = (s->next + 1) % s->ncopy;
    const size_t n = s->wstride, per = (n / (size_t)s->threads + 255) / 256 * 256;
    long long r = 0;
#pragma omp parallel for num_threads(s->threads) reduction(^ : r)
    for (int t = 0; t < s->threads; t++) {
        const size_t b = (size_t)t * per, e = b + per < n ? b + per : n;
        if (b < e) r ^= read_bytes(p + b, e - b);
    }
    s->sink = r;
    return 0;
}

// Medians of the layer and of the read, timed alternately (a layer call, then a read of the next
// copy, repeat times, after one warm-up of each), so that both see the same state of a busy machine.
static void interleaved(struct gemv_state * s, int repeat, double * bie_ms, double * read_ms) {
    enum { MAXREP = 256 };
    double tb[MAXREP], tr[MAXREP];
    if (repeat > MAXREP) repeat = MAXREP;
    *bie_ms = *read_ms = -1.0;
    if (bie_call(s)) return;
    read_call(s);
    for (int i = 0; i < repeat; i++) {
        double t0 = bench_now_ms();
        if (bie_call(s)) return;
        tb[i] = bench_now_ms() - t0;
        t0 = bench_now_ms();
        read_call(s);
        tr[i] = bench_now_ms() - t0;
    }
    *bie_ms = bench_median(tb, repeat);
    *read_ms = bench_median(tr, repeat);
}

int bench_gemv_case(const struct bench_options * opt, const char * name, int quant, int64_t M, int64_t K, int64_t N,
                    int threads) {
    struct gemv_state s;
    memset(&s, 0, sizeof s);
    s.threads = threads;
    if (!(s.ctx = bench_context(opt, threads))) return 1;
    const int64_t xs[2] = {M, K}, ys[2] = {M, N}, ws[2] = {N, K};
    s.lin = (struct bie_linear_desc){.quant = (enum bie_quant)quant, .in_features = K, .out_features = N};
    const enum bie_dtype wd = quant == 1 ? BIE_DTYPE_B1 : quant == 4 ? BIE_DTYPE_S4 : BIE_DTYPE_I8;
    bie_tensor_make(&s.x, NULL, BIE_DTYPE_F32, 2, xs);
    bie_tensor_make(&s.y, NULL, BIE_DTYPE_F32, 2, ys);
    bie_tensor_make(&s.w, NULL, wd, 2, ws);
    bie_tensor_make(&s.sa, NULL, BIE_DTYPE_F32, 0, NULL);
    bie_tensor_make(&s.sw, NULL, BIE_DTYPE_F32, 0, NULL);
    bie_tensor_nbytes(&s.w, &s.wbytes);
    s.wstride = (s.wbytes + 255) / 256 * 256;
    const int cold_copies = (int)(BENCH_COLD_BYTES / s.wstride) + 1;
    float * xf = malloc(sizeof(float) * (size_t)(M * K));
    float * wf = malloc(sizeof(float) * (size_t)(N * K));
    s.x.data = xf;
    s.y.data = malloc(sizeof(float) * (size_t)(M * N));
    s.copies = aligned_alloc(64, s.wstride * (size_t)cold_copies);
    float sa = quant == 1 ? 1.0f : 0.05f, sw = quant == 1 ? 0.02f : 0.01f;
    s.sa.data = &sa;
    s.sw.data = &sw;
    if (!xf || !wf || !s.y.data || !s.copies) {
        fprintf(stderr, "bie bench: out of memory\n");
        return 1;
    }
    uint64_t rng = 0x2545f4914f6cdd1dull; // uniform in [-1, 1)
    for (int64_t i = 0; i < M * K + N * K; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        const float v = (float)(rng >> 40) * 0x1p-23f - 1.0f;
        if (i < M * K) xf[i] = v;
        else wf[i - M * K] = v;
    }
    struct bie_tensor wsrc;
    bie_tensor_make(&wsrc, wf, BIE_DTYPE_F32, 2, ws);
    memset(s.copies, 0, s.wstride);
    s.w.data = s.copies;
    int failed = bie_pack(s.ctx, &wsrc, quant == 1 ? NULL : &s.sw, &s.w) != BIE_STATUS_OK;
    for (int c = 1; c < cold_copies; c++) memcpy(s.copies + (size_t)c * s.wstride, s.copies, s.wstride);
    free(wf);

    char rname[96];
    for (int cold = 0; cold < 2 && !failed; cold++) {
        s.ncopy = cold ? cold_copies : 1;
        struct bench_result r = {.name = rname,
                                 .backend = opt->backend,
                                 .threads = threads,
                                 .ops = 2.0 * (double)M * (double)N * (double)K,
                                 .baseline = "read-same-bytes"};
        snprintf(rname, sizeof rname, "%s%s", name, cold ? "-cold" : "");
        usleep(100000);
        s.next = 0;
        interleaved(&s, opt->repeat, &r.bie_ms, &r.baseline_ms);
        failed = r.bie_ms < 0;
        if (!failed) {
            bench_print(opt, &r);
            if (!opt->json)
                printf("  %s: weight %zu bytes, bie %.1f GB/s, read %.1f GB/s (%.0f%%)\n", rname, s.wbytes,
                       (double)s.wbytes / (r.bie_ms * 1e6), (double)s.wstride / (r.baseline_ms * 1e6),
                       100.0 * ((double)s.wbytes / r.bie_ms) / ((double)s.wstride / r.baseline_ms));
        }
    }
    free(xf);
    free(s.y.data);
    free(s.copies);
    bie_context_destroy(s.ctx);
    return failed;
}
