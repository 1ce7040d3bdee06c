// SPDX-License-Identifier: Apache-2.0
// cpu-common.c: kernel table selection, thread count, element loads, and the tiled integer GEMM
// driver shared by the binary and n-bit operators.
#include "cpu/cpu-impl.h"

#include <stdio.h>

#include <omp.h>

const struct cpu_kernels * bie_cpu_kernels(enum bie_cpu_isa isa) {
    if (isa > bie_cpu_isa_detected()) isa = bie_cpu_isa_detected();
    switch (isa) {
    case BIE_CPU_ISA_AVX512_VNNI: return &bie_cpu_kernels_avx512vpopcnt_vnni;
    case BIE_CPU_ISA_AVX512_VPOPCNT: return &bie_cpu_kernels_avx512vpopcnt;
    case BIE_CPU_ISA_AVX512: return &bie_cpu_kernels_avx512;
    case BIE_CPU_ISA_AVX2: return &bie_cpu_kernels_avx2;
    default: return &bie_cpu_kernels_scalar;
    }
}

int cpu_threads(const bie_context_t * ctx) { return bie_context_threads(ctx); }

float cpu_load(const struct bie_tensor * t, int64_t off) {
    switch (t->dtype) {
    case BIE_DTYPE_F32: return ((const float *)t->data)[off];
    case BIE_DTYPE_F16: return bie_f16_to_f32(((const uint16_t *)t->data)[off]);
    case BIE_DTYPE_BF16: return bie_bf16_to_f32(((const uint16_t *)t->data)[off]);
    case BIE_DTYPE_I8: return (float)((const int8_t *)t->data)[off];
    case BIE_DTYPE_I32: return (float)((const int32_t *)t->data)[off];
    case BIE_DTYPE_B1: return (((const uint8_t *)t->data)[off >> 3] >> (off & 7)) & 1 ? 1.0f : -1.0f;
    case BIE_DTYPE_S4: {
        const uint8_t byte = ((const uint8_t *)t->data)[off >> 1];
        const int nib = (off & 1) ? (byte & 15) : (byte >> 4);
        return (float)(nib >= 8 ? nib - 16 : nib);
    }
    default: return (float)bie_load(t, off);
    }
}

void cpu_bias_dense(const struct bie_tensor * bias, int64_t C, float * out) {
    for (int64_t c = 0; c < C; c++) out[c] = bias && bias->data ? cpu_load(bias, c * bias->stride[0]) : 0.0f;
}

// Tile sizes of the GEMM driver: MB rows (a multiple of CPU_MR) by at most NB_MAX columns (a
// multiple of 16: whole B groups of every binary kernel, and whole bytes of a B1 output).
#define MB 64
#define NB_MAX 256
#define KC_BYTES 4096 // n-bit K block per row (a multiple of 64)

size_t cpu_gemm_workspace(int threads) { return (size_t)threads * MB * NB_MAX * sizeof(int32_t); }

// How cpu_gemm_run cuts the output into tiles.
struct tiling {
    int nr;
    int64_t mtiles, ntiles, nb;
    size_t esz;
    bool n_major;
    void * tile_ws;
};

// Tile t of the job, on the accumulator block of thread `thread`.
static void gemm_tile(const struct cpu_gemm * job, const struct tiling * g, int64_t t, int thread) {
    const int nr = g->nr;
    const int64_t mtiles = g->mtiles, ntiles = g->ntiles, nb = g->nb;
    const size_t esz = g->esz;
    const bool n_major = g->n_major;
    const int64_t mt = n_major ? t % mtiles : t / ntiles, ntile = n_major ? t / mtiles : t % ntiles;
    const int64_t m0 = mt * MB, n0 = ntile * nb;
    const int64_t mc = job->M - m0 < MB ? job->M - m0 : MB;
    const int64_t nc = job->N - n0 < nb ? job->N - n0 : nb;
    int32_t * acc = (int32_t *)g->tile_ws + (size_t)thread * MB * NB_MAX;
    const size_t ldacc = (size_t)nb; // a narrow tile stays in L1 for the epilogue's column reads
    if (job->kind == 1) {
        for (int64_t j = 0; j < nc; j += nr) {
            const uint8_t * bp = (const uint8_t *)job->b + (size_t)(n0 + j) * job->ldb;
            for (int64_t i = 0; i < mc; i += CPU_MR)
                job->bin->tile((const uint8_t *)job->a + (size_t)(m0 + i) * job->lda, job->lda, bp, job->k,
                               acc + (size_t)i * ldacc + (size_t)j, ldacc);
        }
    } else {
        // n-bit: K in blocks of KC_BYTES per row, so that a kernel's A and B rows stay in L1;
        // the blocks' int32 sums are added (wrapping, as one long sum would).
        const size_t kc = KC_BYTES / esz;
        for (size_t k0 = 0; k0 < job->k; k0 += kc) {
            const size_t kn = job->k - k0 < kc ? job->k - k0 : kc;
            for (int64_t j = 0; j < nc; j += nr) {
                const uint8_t * bp = (const uint8_t *)job->b + ((size_t)(n0 + j) * job->ldb + k0) * esz;
                for (int64_t i = 0; i < mc; i += CPU_MR) {
                    const uint8_t * ap = (const uint8_t *)job->a + ((size_t)(m0 + i) * job->lda + k0) * esz;
                    int32_t part[CPU_MR * 4];
                    if (job->kind == 4) job->kern->u4s4_tile(ap, job->lda, (const int8_t *)bp, job->ldb, kn, part, 4);
                    else job->kern->i16_tile((const int16_t *)ap, job->lda, (const int16_t *)bp, job->ldb, kn, part, 4);
                    for (int r = 0; r < CPU_MR; r++)
                        for (int q = 0; q < nr; q++) {
                            uint32_t * d = (uint32_t *)(acc + (size_t)(i + r) * ldacc + (size_t)(j + q));
                            *d = (k0 == 0 ? 0u : *d) + (uint32_t)part[r * 4 + q];
                        }
                }
            }
        }
    }
    job->finish(job->finish_ctx, m0, mc, n0, nc, acc, ldacc);
}

void cpu_gemm_run(const struct cpu_gemm * job, int threads, void * tile_ws, bool parallel_stores) {
    const int nr = job->kind == 1 ? job->bin->nr : job->kern->i16_nr;
    const int64_t mtiles = (job->M + MB - 1) / MB;
    int64_t nb = (int64_t)cpu_round_up((size_t)job->N, 16);
    if (nb > NB_MAX) nb = NB_MAX;
    // Enough tiles for every thread (small M: split N finer, down to 16 columns).
    while (nb > 16 && mtiles * ((job->N + nb - 1) / nb) < 2 * threads) nb = (int64_t)cpu_round_up((size_t)nb / 2, 16);
    const int64_t ntiles = (job->N + nb - 1) / nb;
    const int64_t tiles = mtiles * ntiles;
    if (!parallel_stores) threads = 1;
    if (threads > tiles) threads = (int)tiles;
    // Consecutive tiles share the block of the larger operand, which then streams from memory once.
    const struct tiling g = {nr,
                             mtiles,
                             ntiles,
                             nb,
                             job->kind == 16 ? sizeof(int16_t) : 1,
                             (size_t)job->N * job->ldb > (size_t)job->M * job->lda,
                             tile_ws};
    if (threads > 1) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
        for (int64_t t = 0; t < tiles; t++) gemm_tile(job, &g, t, omp_get_thread_num());
    } else { // no parallel region: libgomp would allocate a team of one on every call
        for (int64_t t = 0; t < tiles; t++) gemm_tile(job, &g, t, 0);
    }
}

enum bie_status bie_cpu_plan(bie_context_t * ctx, const struct bie_layer_call * call) {
    call->plan->workspace = 0;
    snprintf(call->plan->route, sizeof call->plan->route, "cpu, %s kernels, %d threads", bie_cpu_isa_name(ctx->isa),
             cpu_threads(ctx));
    return BIE_STATUS_OK;
}
