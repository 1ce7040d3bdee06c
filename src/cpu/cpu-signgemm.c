// SPDX-License-Identifier: Apache-2.0
// cpu-signgemm.c: the float-by-sign GEMM of the binary linear backward (cpu-impl.h states it):
//   grad_x = grad_y @ (sign(W) * scale_w)  and  grad_W = scale_a * grad_y^T @ sign(x + bias_a)
// are float matrices times +-1 matrices. Instead of building the +-1 matrix in f32 for sgemm, S
// stays in bits (one bit per element, 1/32 of the f32 matrix) and the kernel (fsign_tile,
// cpu-kernels-avx512.c) looks 4 rows of S up at once in a 16-entry table of the signed sums of 4
// values of F: one vpermps and one add per 4 multiply-adds of 16 columns, about twice an FMA's rate.
//
// Blocking: a task owns CPU_MR rows of the output and a range of columns; for every block of
// SG_JC rows j it builds the CPU_MR x SG_JC/4 tables (32 KiB, L1) and runs the tile over its
// columns in steps of 64, adding to the outputs (the first block stores). Each output is one sum in
// order j, whatever the task split and the thread count.
#include "cpu/cpu-impl.h"

#include <omp.h>

#define SG_JC 512 // rows j per table block (a multiple of 32)
#define SG_TAB_FLOATS (CPU_MR * SG_JC / 4 * 16)

void cpu_signgemm_idx(const struct cpu_kernels * kern, const struct bie_tensor * t, int64_t J, int64_t K, int64_t s0,
                      int64_t s1, const float * bias, int threads, uint32_t * idx) {
    const size_t ids = cpu_signgemm_ids(K);
    const bool fast = t->dtype == BIE_DTYPE_F32 && s1 == 1;
    // a B1 t in rows of whole bytes: a packed weight, or saved bits of x (bias_a is in them; the
    // bias here is then zero)
    const bool bits = t->dtype == BIE_DTYPE_B1 && s1 == 1 && s0 % 8 == 0;
    const int64_t blocks = (J + 31) / 32;
#pragma omp parallel for num_threads(threads)
    for (int64_t jb = 0; jb < blocks; jb++) { // one thread per block of 32 rows: no shared words
        uint32_t * d = idx + (size_t)jb * ids;
        memset(d, 0, ids * sizeof(uint32_t));
        for (int64_t j = jb * 32; j < J && j < jb * 32 + 32; j++) {
            const int bit = (int)(j % 32);
            if (fast) {
                kern->sign_idx((const float *)t->data + j * s0, bias, K, bit, d);
                continue;
            }
            if (bits) {
                const uint8_t * r = (const uint8_t *)t->data + j * s0 / 8;
                for (int64_t k = 0; k < K; k++) d[k] |= (uint32_t)((r[k >> 3] >> (k & 7)) & 1u) << bit;
                continue;
            }
            for (int64_t k = 0; k < K; k++)
                d[k] |= (uint32_t)(cpu_load(t, j * s0 + k * s1) + (bias ? bias[k] : 0.0f) >= 0.0f) << bit;
        }
    }
}

size_t cpu_signgemm_workspace(int threads) { return (size_t)threads * SG_TAB_FLOATS * sizeof(float); }

void cpu_signgemm_run(const struct cpu_kernels * kern, const struct cpu_signgemm * job, int threads, void * ws) {
    const size_t ids = cpu_signgemm_ids(job->K);
    const int64_t rblocks = (job->R + CPU_MR - 1) / CPU_MR;
    // Column ranges: whole rows unless there are too few row blocks to keep the threads busy.
    int64_t kc = (int64_t)cpu_round_up((size_t)job->K, 64);
    while (kc > 256 && rblocks * ((job->K + kc - 1) / kc) < 4 * threads) kc = (int64_t)cpu_round_up((size_t)kc / 2, 64);
    const int64_t kblocks = (job->K + kc - 1) / kc, tasks = rblocks * kblocks;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t r0 = (t / kblocks) * CPU_MR, k0 = (t % kblocks) * kc;
        const int mr = (int)(job->R - r0 < CPU_MR ? job->R - r0 : CPU_MR);
        const int64_t k1 = job->K - k0 < kc ? job->K : k0 + kc;
        float * tab = (float *)ws + (size_t)omp_get_thread_num() * SG_TAB_FLOATS;
        float * c = job->c + (size_t)r0 * job->ldc;
        int64_t j0 = 0;
        do { // at least once: J = 0 stores zeros
            const int64_t jn = job->J - j0 < SG_JC ? job->J - j0 : SG_JC;
            const int64_t nq = (int64_t)cpu_round_up((size_t)jn, 32) / 4;
            kern->sign_tables(job->f + r0 * job->rs + j0 * job->cs, job->rs, job->cs, mr, jn, nq, job->alpha, tab);
            const uint32_t * ix = job->idx + (size_t)(j0 / 32) * ids;
            for (int64_t k = k0; k < k1; k += 64)
                kern->fsign_tile(tab, nq, ix + k, ids, mr, k1 - k < 64 ? k1 - k : 64, j0 > 0, c + k, job->ldc);
            j0 += SG_JC;
        } while (j0 < job->J);
    }
}
