// SPDX-License-Identifier: Apache-2.0
// cpu-kernels-avx512vpopcnt.c: the binary tile with VPOPCNTDQ (Ice Lake and later):
// a word of A broadcast, xor + vpopcntq + add against the same word of 8 columns per vector, on a
// 4x16 block of 64-bit counters (unsplit panels).
// The other slots are the AVX-512 ones.
#include "cpu/cpu-impl.h"

#include <immintrin.h>

static void bin_tile_4x16(const uint8_t * a, size_t lda, const uint8_t * b, size_t kb, int32_t * c, size_t ldc) {
    __m512i acc[CPU_MR][2];
    for (int i = 0; i < CPU_MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_si512();
    for (size_t w = 0; w < kb / 8; w++) {
        const __m512i b0 = _mm512_load_si512((const void *)(b + w * 128));
        const __m512i b1 = _mm512_load_si512((const void *)(b + w * 128 + 64));
        for (int i = 0; i < CPU_MR; i++) {
            int64_t v;
            memcpy(&v, a + i * lda + w * 8, 8);
            const __m512i av = _mm512_set1_epi64(v);
            acc[i][0] = _mm512_add_epi64(acc[i][0], _mm512_popcnt_epi64(_mm512_xor_si512(av, b0)));
            acc[i][1] = _mm512_add_epi64(acc[i][1], _mm512_popcnt_epi64(_mm512_xor_si512(av, b1)));
        }
    }
    for (int i = 0; i < CPU_MR; i++)
        for (int j = 0; j < 2; j++)
            _mm256_storeu_si256((__m256i *)(c + i * ldc + j * 8), _mm512_cvtepi64_epi32(acc[i][j]));
}

// With AVX512-VNNI (every VPOPCNTDQ CPU so far also has it; checked at run time): the byte tile with
// vpdpbusd, one fused multiply-add of unsigned x signed byte quads per 512 bits into wrapping int32
// sums, exact for any bytes; so both 4-bit and 8-bit layers use it (the int16 tile is not used).
__attribute__((target("avx512vnni"))) static void u4s4_tile_4x4_vnni(const uint8_t * a, size_t lda, const int8_t * b,
                                                                     size_t ldb, size_t k, int32_t * c, size_t ldc) {
    __m512i acc[CPU_MR][4];
    for (int i = 0; i < CPU_MR; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_si512();
    for (size_t p = 0; p < k; p += 64) {
        __m512i bv[4];
        for (int j = 0; j < 4; j++) bv[j] = _mm512_load_si512((const void *)(b + j * ldb + p));
        for (int i = 0; i < CPU_MR; i++) {
            const __m512i av = _mm512_load_si512((const void *)(a + i * lda + p));
            for (int j = 0; j < 4; j++) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], av, bv[j]);
        }
    }
    for (int i = 0; i < CPU_MR; i++)
        for (int j = 0; j < 4; j++) c[i * ldc + j] = _mm512_reduce_add_epi32(acc[i][j]);
}

const struct cpu_kernels bie_cpu_kernels_avx512vpopcnt_vnni = {
    .isa = BIE_CPU_ISA_AVX512_VNNI,
    .bin = {.nr = 16, .split = false, .tile = bin_tile_4x16},
    .u8s8_exact = true, // vpdpbusd: no int16 intermediate, so the 8-bit layers use the byte tile
    .u4s4_tile = u4s4_tile_4x4_vnni,
    .nibble_split = NULL, // unsplit panels
    BIE_CPU_AVX512_SHARED,
};

const struct cpu_kernels bie_cpu_kernels_avx512vpopcnt = {
    .isa = BIE_CPU_ISA_AVX512_VPOPCNT,
    .bin = {.nr = 16, .split = false, .tile = bin_tile_4x16},
    .u4s4_tile = bie_cpu_u4s4_tile_4x4__avx512,
    .nibble_split = NULL, // unsplit panels
    BIE_CPU_AVX512_SHARED,
    BIE_CPU_AVX512_OUTER,
};
