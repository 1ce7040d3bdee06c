// SPDX-License-Identifier: Apache-2.0
// cpu-wq.c: the CPU operator of the weight-only n-bit layer (kernels in cpu-wq-<isa>.c).
//
// Forward, M <= WQ_GEMV_MAX_M rows (decode): the activations x' are laid out per 32-row block in
// the kernels' order (cpu-wq.h) with each group's sum, and every task streams the words of its
// columns (up to CPU_WQ_WIDE_VECS vectors, each word row as one run) once for up to four rows of x
// at a time, straight from qweight (no copy of the weight):
//   y[m, n] = sum_g (s[g, n] * sum_{r in g} x'[m, r] q[r, n] - c[g, n] * sum_{r in g} x'[m, r])
// with c = s*z (CODE), s*2^(b-1) (SYM) or z (OFFSET): W's value, summed by groups. BIE_WQ_ACT_INT8
// (on CPUs with AVX512-VNNI) rounds each block of x' to int8 with scale max|x'|/127 first.
// Forward, more rows (prefill), and the backward: the weight is dequantised to f32 in panels (256
// columns, or 256 rows for grad_x) and OpenBLAS multiplies them, each panel a one-thread sgemm on
// an OpenMP thread (so every output is the same sum whatever the thread count).
// Declined (to the reference): the scalar ISA, and groups that are not whole 32-row blocks.
#include "cpu/cpu-impl.h"
#include "cpu/cpu-sgemm.h"
#include "cpu/cpu-wq.h"

#include <math.h>
#include <omp.h>

#define WQ_GEMV_MAX_M 16 // rows of x up to which the forward streams the codes
#define WQ_PANEL 256     // columns (forward) or rows (backward) of a dequantised panel

static const struct cpu_wq_kernels * wq_kernels(const bie_context_t * ctx) {
    enum bie_cpu_isa isa = ctx->isa;
    if (isa > bie_cpu_isa_detected()) isa = bie_cpu_isa_detected();
    if (isa >= BIE_CPU_ISA_AVX512)
        return bie_cpu_has_vnni(ctx->isa_cap) ? &bie_cpu_wq_kernels_avx512_vnni : &bie_cpu_wq_kernels_avx512;
    return isa >= BIE_CPU_ISA_AVX2 ? &bie_cpu_wq_kernels_avx2 : NULL;
}

// The call's 32-row blocks (job tables in the arena); false when groups are not whole blocks.
static bool fast_layout(const struct bie_wq_call * c) { return c->G == 1 || c->gs % 32 == 0; }

static void job_init(const struct bie_wq_call * c, struct cpu_arena * a, struct cpu_wq_job * j) {
    memset(j, 0, sizeof *j);
    j->qw = c->qweight.data;
    j->N = c->N;
    j->rows = c->rows;
    j->nblk = (c->K + 31) / 32;
    j->group_bits = c->group_bits;
    j->zero = c->zero;
    j->scales = c->scales.data;
    j->sdtype = c->scales.dtype;
    j->zeros = c->zeros.data;
    j->zdtype = c->zeros.data ? c->zeros.dtype : BIE_DTYPE_F32;
    j->G = c->G;
    int64_t * word = cpu_arena_take(a, (size_t)j->nblk * sizeof(int64_t));
    int32_t * group = cpu_arena_take(a, (size_t)j->nblk * sizeof(int32_t));
    const int64_t bpg = c->G == 1 ? j->nblk : c->gs / 32; // blocks per group
    for (int64_t b = 0; b < j->nblk; b++) {
        const int64_t g = b / bpg;
        group[b] = (int32_t)g;
        word[b] = c->group_word[g] + (b - g * bpg) * c->group_bits[g];
    }
    j->blk_word = word;
    j->blk_group = group;
}

static size_t job_bytes(const struct bie_wq_call * c) {
    const size_t nblk = (size_t)(c->K + 31) / 32;
    return cpu_arena_size(nblk * sizeof(int64_t)) + cpu_arena_size(nblk * sizeof(int32_t));
}

// x'[m, r] = x[m, perm[r]] * channel_scale[perm[r]] (f32) of a 2-D view t.
static inline float xprime(const struct bie_wq_call * c, const struct bie_tensor * t, int64_t m, int64_t r) {
    const int64_t k = c->perm.data ? ((const int32_t *)c->perm.data)[r] : r;
    const float v = cpu_load(t, m * t->stride[0] + k * t->stride[1]);
    return c->channel_scale.data ? v * cpu_load(&c->channel_scale, k) : v;
}

// Writes v (+ bias[n]) to element (m, n) of a 2-D float view.
static inline void store_out(const struct bie_tensor * t, int64_t m, int64_t n, float v) {
    const int64_t off = m * t->stride[0] + n * t->stride[1];
    switch (t->dtype) {
    case BIE_DTYPE_F32: ((float *)t->data)[off] = v; break;
    case BIE_DTYPE_F16: ((uint16_t *)t->data)[off] = bie_f32_to_f16(v); break;
    default: ((uint16_t *)t->data)[off] = bie_f32_to_bf16(v); break;
    }
}

static void store_rows(const struct bie_wq_call * c, const float * v, size_t ldv, int64_t m0, int64_t mr, int64_t n0,
                       int64_t nc) {
    for (int64_t i = 0; i < mr; i++)
        for (int64_t l = 0; l < nc; l++) {
            float o = v[i * (int64_t)ldv + l];
            if (c->bias.data) o += cpu_load(&c->bias, n0 + l);
            store_out(&c->y, m0 + i, n0 + l, o);
        }
}

// The activations of the decode path (cpu_wq_job): blocks in their kernel order, group sums, and
// for the int8 path the int8 codes with one scale per block.
static void prepare_x(const struct bie_wq_call * c, struct cpu_wq_job * j, bool i8, float * xa, int8_t * xq, float * xd,
                      float * xsum, int threads) {
    const int64_t Kp = j->nblk * 32;
#pragma omp parallel for num_threads(threads)
    for (int64_t m = 0; m < c->M; m++) {
        float * row = xa + m * Kp;
        for (int64_t blk = 0; blk < j->nblk; blk++) {
            const int b = c->group_bits[j->blk_group[blk]];
            for (int p = 0; p < 32; p++) {
                const int64_t r = 32 * blk + cpu_wq_order(b, p);
                row[32 * blk + p] = r < c->K ? xprime(c, &c->x, m, r) : 0.0f;
            }
        }
        for (int64_t g = 0; g < c->G; g++) xsum[m * c->G + g] = 0.0f;
        if (!i8) {
            for (int64_t blk = 0, g = -1; blk < j->nblk; blk++) {
                if (j->blk_group[blk] != g) g = j->blk_group[blk];
                double s = 0.0;
                for (int p = 0; p < 32; p++) s += row[32 * blk + p];
                xsum[m * c->G + g] += (float)s;
            }
            continue;
        }
        for (int64_t blk = 0; blk < j->nblk; blk++) {
            const float * xb = row + 32 * blk;
            float amax = 0.0f;
            for (int p = 0; p < 32; p++) amax = fabsf(xb[p]) > amax ? fabsf(xb[p]) : amax;
            const float d = amax / 127.0f;
            int32_t sq = 0;
            for (int p = 0; p < 32; p++) {
                float q = d > 0.0f ? bie_rne(xb[p] / d) : 0.0f;
                q = !(q >= -127.0f) ? -127.0f : q > 127.0f ? 127.0f : q; // NaN -> -127
                xq[m * Kp + 32 * blk + p] = (int8_t)q;
                sq += (int32_t)q;
            }
            xd[m * j->nblk + blk] = d;
            xsum[m * c->G + j->blk_group[blk]] += d * (float)sq;
        }
    }
}

static enum bie_status forward_gemv(bie_context_t * ctx, const struct bie_wq_call * c, const struct cpu_wq_kernels * k,
                                    int threads) {
    const bool i8 = c->act == BIE_WQ_ACT_INT8 && k->gemv_i8;
    const int64_t nblk = (c->K + 31) / 32, Kp = nblk * 32;
    // Columns per task: a multiple of 4 vectors, up to CPU_WQ_WIDE_VECS (the longer a task's runs of
    // each word row, the better the memory streams), with as many tasks for every thread.
    const int64_t wmax = (int64_t)CPU_WQ_WIDE_VECS * k->lanes, quantum = 4 * k->lanes;
    const int64_t per = (c->N + (int64_t)threads * wmax - 1) / ((int64_t)threads * wmax); // tasks a thread
    int64_t tw64 = (c->N + threads * per - 1) / (threads * per);
    tw64 = (tw64 + quantum - 1) / quantum * quantum;
    const int tw = (int)(tw64 > wmax ? wmax : tw64);
    const size_t bytes = job_bytes(c) + cpu_arena_size((size_t)(c->M * Kp) * sizeof(float)) +
                         cpu_arena_size((size_t)(c->M * Kp)) + cpu_arena_size((size_t)(c->M * nblk) * sizeof(float)) +
                         cpu_arena_size((size_t)(c->M * c->G) * sizeof(float)) +
                         (size_t)threads * cpu_arena_size((size_t)(4 * tw) * sizeof(float));
    void * ws;
    BIE_TRY(bie_host_workspace(ctx, bytes, &ws));
    struct cpu_arena a = {ws, 0, bytes};
    struct cpu_wq_job j;
    job_init(c, &a, &j);
    float * xa = cpu_arena_take(&a, (size_t)(c->M * Kp) * sizeof(float));
    int8_t * xq = cpu_arena_take(&a, (size_t)(c->M * Kp));
    float * xd = cpu_arena_take(&a, (size_t)(c->M * nblk) * sizeof(float));
    float * xsum = cpu_arena_take(&a, (size_t)(c->M * c->G) * sizeof(float));
    float * tiles = cpu_arena_take(&a, (size_t)threads * cpu_arena_size((size_t)(4 * tw) * sizeof(float)));
    prepare_x(c, &j, i8, xa, xq, xd, xsum, threads);
    j.xa = xa;
    j.xq = xq;
    j.xd = xd;
    j.xsum = xsum;
    j.ldx = (size_t)Kp;
    const int64_t ntiles = (c->N + tw - 1) / tw;
    const size_t tstride = cpu_arena_size((size_t)(4 * tw) * sizeof(float)) / sizeof(float);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < ntiles; t++) {
        float * out = tiles + (size_t)omp_get_thread_num() * tstride;
        const int64_t n0 = t * tw;
        const int nc = (int)(c->N - n0 < tw ? c->N - n0 : tw);
        for (int64_t m0 = 0; m0 < c->M; m0 += 4) {
            const int mr = (int)(c->M - m0 < 4 ? c->M - m0 : 4);
            (i8 ? k->gemv_i8 : k->gemv_f32)(&j, n0, nc, m0, mr, out, (size_t)tw);
            store_rows(c, out, (size_t)tw, m0, mr, n0, nc);
        }
    }
    return BIE_STATUS_OK;
}

// x' in row order as a dense f32 [M][K] array.
static void dense_x(const struct bie_wq_call * c, float * xa, int threads) {
#pragma omp parallel for num_threads(threads)
    for (int64_t m = 0; m < c->M; m++)
        for (int64_t r = 0; r < c->K; r++) xa[m * c->K + r] = xprime(c, &c->x, m, r);
}

static enum bie_status forward_sgemm(bie_context_t * ctx, const struct bie_wq_call * c, const struct cpu_wq_kernels * k,
                                     int threads) {
    const int64_t npanel = (c->N + WQ_PANEL - 1) / WQ_PANEL;
    if (threads > npanel) threads = (int)npanel;
    const size_t per = cpu_arena_size((size_t)(c->K * WQ_PANEL) * sizeof(float)) +
                       cpu_arena_size((size_t)(c->M * WQ_PANEL) * sizeof(float));
    const size_t bytes = job_bytes(c) + cpu_arena_size((size_t)(c->M * c->K) * sizeof(float)) + (size_t)threads * per;
    void * ws;
    BIE_TRY(bie_host_workspace(ctx, bytes, &ws));
    struct cpu_arena a = {ws, 0, bytes};
    struct cpu_wq_job j;
    job_init(c, &a, &j);
    float * xa = cpu_arena_take(&a, (size_t)(c->M * c->K) * sizeof(float));
    uint8_t * bufs = cpu_arena_take(&a, (size_t)threads * per);
    dense_x(c, xa, threads);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t p = 0; p < npanel; p++) {
        float * wp = (float *)(bufs + (size_t)omp_get_thread_num() * per);
        float * yp = (float *)((uint8_t *)wp + cpu_arena_size((size_t)(c->K * WQ_PANEL) * sizeof(float)));
        const int64_t n0 = p * WQ_PANEL, nb = c->N - n0 < WQ_PANEL ? c->N - n0 : WQ_PANEL;
        k->dequant(&j, n0, (int)nb, 0, j.nblk, c->K, wp, WQ_PANEL);
        cpu_sgemm_1t(CblasNoTrans, CblasNoTrans, (int)c->M, (int)nb, (int)c->K, 1.0f, xa, (int)c->K, wp, WQ_PANEL, 0.0f,
                     yp, WQ_PANEL);
        store_rows(c, yp, WQ_PANEL, 0, c->M, n0, nb);
    }
    return BIE_STATUS_OK;
}

enum bie_status bie_cpu_wq_forward(bie_context_t * ctx, const struct bie_wq_call * c) {
    const struct cpu_wq_kernels * k = wq_kernels(ctx);
    if (!k || !fast_layout(c)) return BIE_DECLINED;
    const int threads = cpu_threads(ctx);
    return c->M <= WQ_GEMV_MAX_M ? forward_gemv(ctx, c, k, threads) : forward_sgemm(ctx, c, k, threads);
}

enum bie_status bie_cpu_wq_backward(bie_context_t * ctx, const struct bie_wq_call * c) {
    const struct cpu_wq_kernels * k = wq_kernels(ctx);
    if (!k || !fast_layout(c)) return BIE_DECLINED;
    int threads = cpu_threads(ctx);
    const int64_t M = c->M, K = c->K, N = c->N;
    const int64_t nkb = (K + WQ_PANEL - 1) / WQ_PANEL;
    if (threads > nkb) threads = (int)nkb;
    const bool gx = c->grad_x.data != NULL, gw = c->grad_w.data != NULL;
    const size_t per = gx ? cpu_arena_size((size_t)(WQ_PANEL * N) * sizeof(float)) : 0;
    const size_t bytes = job_bytes(c) + cpu_arena_size((size_t)(M * N) * sizeof(float)) +
                         cpu_arena_size((size_t)(M * K) * sizeof(float)) + (size_t)threads * per;
    void * ws;
    BIE_TRY(bie_host_workspace(ctx, bytes, &ws));
    struct cpu_arena a = {ws, 0, bytes};
    struct cpu_wq_job j;
    job_init(c, &a, &j);
    float * g = cpu_arena_take(&a, (size_t)(M * N) * sizeof(float));
    float * xk = cpu_arena_take(&a, (size_t)(M * K) * sizeof(float)); // x' (grad_w) or grad_x in row order
    uint8_t * bufs = cpu_arena_take(&a, (size_t)threads * per);
#pragma omp parallel for num_threads(threads)
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++)
            g[m * N + n] = cpu_load(&c->grad_y, m * c->grad_y.stride[0] + n * c->grad_y.stride[1]);
    if (gw) {
        dense_x(c, xk, threads);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
        for (int64_t b = 0; b < nkb; b++) {
            const int64_t k0 = b * WQ_PANEL, kb = K - k0 < WQ_PANEL ? K - k0 : WQ_PANEL;
            cpu_sgemm_1t(CblasTrans, CblasNoTrans, (int)kb, (int)N, (int)M, 1.0f, xk + k0, (int)K, g, (int)N, 0.0f,
                         (float *)c->grad_w.data + k0 * N, (int)N);
        }
    }
    if (gx) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
        for (int64_t b = 0; b < nkb; b++) {
            float * wp = (float *)(bufs + (size_t)omp_get_thread_num() * per);
            const int64_t k0 = b * WQ_PANEL, kb = K - k0 < WQ_PANEL ? K - k0 : WQ_PANEL;
            k->dequant(&j, 0, (int)N, k0 / 32, (k0 + kb + 31) / 32, K, wp, (size_t)N);
            cpu_sgemm_1t(CblasNoTrans, CblasTrans, (int)M, (int)kb, (int)N, 1.0f, g, (int)N, wp, (int)N, 0.0f, xk + k0,
                         (int)K);
        }
        const struct bie_tensor * t = &c->grad_x;
#pragma omp parallel for num_threads(threads)
        for (int64_t m = 0; m < M; m++)
            for (int64_t r = 0; r < K; r++) {
                const int64_t kk = c->perm.data ? ((const int32_t *)c->perm.data)[r] : r;
                float v = xk[m * K + r];
                if (c->channel_scale.data) v *= cpu_load(&c->channel_scale, kk);
                const int64_t off = m * t->stride[0] + kk * t->stride[1];
                if (t->dtype == BIE_DTYPE_F32) ((float *)t->data)[off] = v;
                else ((uint16_t *)t->data)[off] = t->dtype == BIE_DTYPE_F16 ? bie_f32_to_f16(v) : bie_f32_to_bf16(v);
            }
    }
    return BIE_STATUS_OK;
}

enum bie_status bie_cpu_wq_dequantize(bie_context_t * ctx, const struct bie_wq_call * c, const struct bie_tensor * w) {
    const struct cpu_wq_kernels * k = wq_kernels(ctx);
    if (!k || !fast_layout(c) || w->dtype != BIE_DTYPE_F32 || w->stride[1] != 1 || w->stride[0] != c->N)
        return BIE_DECLINED;
    const int threads = cpu_threads(ctx);
    void * ws;
    BIE_TRY(bie_host_workspace(ctx, job_bytes(c), &ws));
    struct cpu_arena a = {ws, 0, job_bytes(c)};
    struct cpu_wq_job j;
    job_init(c, &a, &j);
    const int tw = 4 * k->lanes;
    const int64_t ntiles = (c->N + tw - 1) / tw;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < ntiles; t++) {
        const int64_t n0 = t * tw;
        k->dequant(&j, n0, (int)(c->N - n0 < tw ? c->N - n0 : tw), 0, j.nblk, c->K, (float *)w->data + n0,
                   (size_t)c->N);
    }
    return BIE_STATUS_OK;
}
