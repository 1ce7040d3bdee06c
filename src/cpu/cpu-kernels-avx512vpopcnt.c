// SPDX-License-Identifier: Apache-2.0
// cpu-kernels-avx512vpopcnt.c: the binary tile with VPOPCNTDQ (Ice Lake and later):
// xor + vpopcntq + add per 64-byte pair on unsplit panels (a 256-bit step for a 32-byte tail),
// 4x4 register block of 64-bit counters.
// The other slots are the AVX-512 ones.
#include "cpu/cpu-impl.h"

#include <immintrin.h>

static void bin_tile_4x4(const uint8_t * a, size_t lda, const uint8_t * b, size_t ldb, size_t kb,
                         int32_t * c, size_t ldc) {
    __m512i acc[CPU_MR][4];
    for (int i = 0; i < CPU_MR; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_si512();
    size_t k = 0;
    for (; k + 64 <= kb; k += 64) {
        __m512i bv[4];
        for (int j = 0; j < 4; j++) bv[j] = _mm512_loadu_si512((const void *)(b + j * ldb + k));
        for (int i = 0; i < CPU_MR; i++) {
            const __m512i av = _mm512_loadu_si512((const void *)(a + i * lda + k));
            for (int j = 0; j < 4; j++)
                acc[i][j] = _mm512_add_epi64(acc[i][j], _mm512_popcnt_epi64(_mm512_xor_si512(av, bv[j])));
        }
    }
    if (k < kb) // a 32-byte tail
        for (int i = 0; i < CPU_MR; i++) {
            const __m256i av = _mm256_loadu_si256((const __m256i *)(a + i * lda + k));
            for (int j = 0; j < 4; j++) {
                const __m256i bv = _mm256_loadu_si256((const __m256i *)(b + j * ldb + k));
                acc[i][j] = _mm512_add_epi64(acc[i][j],
                                             _mm512_zextsi256_si512(_mm256_popcnt_epi64(_mm256_xor_si256(av, bv))));
            }
        }
    for (int i = 0; i < CPU_MR; i++)
        for (int j = 0; j < 4; j++) c[i * ldc + j] = (int32_t)_mm512_reduce_add_epi64(acc[i][j]);
}

const struct cpu_kernels bie_cpu_kernels_avx512vpopcnt = {
    .isa = BIE_CPU_ISA_AVX512_VPOPCNT,
    .bin_nr = 4,
    .bin_split = false,
    .i16_nr = 4,
    .bin_tile = bin_tile_4x4,
    .i16_tile = bie_cpu_i16_tile_4x4__avx512,
    .u4s4_tile = bie_cpu_u4s4_tile_4x4__avx512,
    .sign_bits = bie_cpu_sign_bits__avx512,
    .quantize = bie_cpu_quantize__avx512,
    .nibble_split = NULL, // unsplit panels
};
