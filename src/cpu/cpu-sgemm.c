// SPDX-License-Identifier: Apache-2.0
// cpu-sgemm.c: cpu_sgemm_1t (cpu-sgemm.h): OpenBLAS sgemm in blocks it runs on the calling thread.
#include "cpu/cpu-sgemm.h"

// OpenBLAS's single-thread bound on m * n * k (cpu-sgemm.h), and the block edges under it: cubes of
// 64 pack the fewest panel elements per multiply-add the bound allows (docs/decisions.md has their
// speed); a short reduction gives its share of the budget to wider blocks.
#define SGEMM_1T_MNK (1 << 18)
#define SGEMM_1T_EDGE 64

void cpu_sgemm_1t(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const float * a, int lda,
                  const float * b, int ldb, float beta, float * c, int ldc) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0 || (long long)m * n * k <= SGEMM_1T_MNK) {
        cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    const int kb = k < SGEMM_1T_EDGE ? k : SGEMM_1T_EDGE;
    const int mb = m < SGEMM_1T_EDGE ? m : SGEMM_1T_EDGE;
    int nb = SGEMM_1T_MNK / (kb * mb);
    if (nb > n) nb = n;
    const int ta_t = ta == CblasTrans, tb_t = tb == CblasTrans;
    for (int i = 0; i < m; i += mb) {
        const int mi = m - i < mb ? m - i : mb;
        for (int j = 0; j < n; j += nb) {
            const int nj = n - j < nb ? n - j : nb;
            float * cb = c + (long)i * ldc + j;
            for (int p = 0; p < k; p += kb) {
                const int kp = k - p < kb ? k - p : kb;
                // op(A)[i.., p..]: A is m x k (lda) or, transposed, k x m
                const float * ab = ta_t ? a + (long)p * lda + i : a + (long)i * lda + p;
                // op(B)[p.., j..]: B is k x n (ldb) or, transposed, n x k
                const float * bb = tb_t ? b + (long)j * ldb + p : b + (long)p * ldb + j;
                cblas_sgemm(CblasRowMajor, ta, tb, mi, nj, kp, alpha, ab, lda, bb, ldb, p ? 1.0f : beta, cb, ldc);
            }
        }
    }
}
