// SPDX-License-Identifier: Apache-2.0
// cpu-sgemm.h: OpenBLAS sgemm on the calling thread only, whatever OpenBLAS's thread count.
//
// The CPU backward runs its float GEMMs on bie's own OpenMP threads (one block of the product per
// thread, in an order fixed by the shape), so each OpenBLAS call must stay on its calling thread.
// OpenBLAS 0.3.21 (Debian 12) has no per-call thread count (openblas_set_num_threads_local came
// later) and openblas_set_num_threads is process-wide, so the product is cut into blocks that
// OpenBLAS always runs single-threaded: its interface runs a GEMM on one thread when
// m * n * k <= 65536 * GEMM_MULTITHREAD_THRESHOLD (4 in every build we know) = 2^18. Blocks of
// the reduction are added into C in increasing k order, so every output is one fixed sum: the
// result depends on the shape only, never on OpenBLAS's or OpenMP's thread count
// (docs/decisions.md).
#pragma once

#include <cblas.h>

// C = alpha * op(A) @ op(B) + beta * C, row-major, exactly as cblas_sgemm (op = transpose when
// ta / tb is CblasTrans; C is m x n, the reduction k long), run on the calling thread.
void cpu_sgemm_1t(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const float * a, int lda,
                  const float * b, int ldb, float beta, float * c, int ldc);
