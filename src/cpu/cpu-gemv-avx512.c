// SPDX-License-Identifier: Apache-2.0
// cpu-gemv-avx512.c: matrix-vector kernels with AVX-512 F/BW/VL (the Skylake-SP level: no
// VPOPCNTDQ, no VNNI): cpu-gemv-simd.h's loops on the vectors of cpu-gemv-avx512.h. Contract in
// cpu-gemv.h.
//
// Binary: popc(a ^ w) by the nibble lookup and vpsadbw, per 64 bytes of a weight row and activation
// row. 4-bit: the unsigned nibbles x + 8 of the weights (vpternlogd) times the signed activation
// codes by vpmaddubsw, widened every 64 steps (4096 bytes of a row); the bias 8 * asum is taken off.
// 8-bit: codes sign-extended to int16 (vpmovsxbw) and vpmaddwd: exact int32 pair sums.
#include "cpu/cpu-gemv-avx512.h"

static void b1(const uint8_t * a, size_t lda, int m, const uint8_t * w, size_t ldw, int64_t n, size_t kb, int32_t * c,
               size_t ldc) {
    CPU_GEMV_FOR_GROUPS(gemv_group, GEMV_R, m, n, a, lda, NULL, w, ldw, kb, c, ldc, gemv_b1_step);
}

void bie_cpu_gemv_s4__avx512(const int8_t * a, size_t lda, const int32_t * asum, int m, const uint8_t * w, size_t ldw,
                             int64_t n, size_t kb, int32_t * c, size_t ldc) {
    uint32_t bias[CPU_GEMV_MR];
    gemv_bias(m, asum, 8, bias);
    CPU_GEMV_FOR_GROUPS(gemv_s4_group, GEMV_R, m, n, a, lda, bias, w, ldw, kb, c, ldc);
}

void bie_cpu_gemv_s8__avx512(const int8_t * a, size_t lda, const int32_t * asum, int m, const int8_t * w, size_t ldw,
                             int64_t n, size_t k, int32_t * c, size_t ldc) {
    (void)asum;
    CPU_GEMV_FOR_GROUPS(gemv_group, GEMV_R, m, n, (const uint8_t *)a, lda, NULL, (const uint8_t *)w, ldw, k, c, ldc,
                        gemv_s8_step);
}

const struct cpu_gemv_kernels bie_cpu_gemv_avx512 = {
    .name = "avx512", .b1 = b1, .s4 = bie_cpu_gemv_s4__avx512, .s8 = bie_cpu_gemv_s8__avx512};
