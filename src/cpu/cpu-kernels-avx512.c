// SPDX-License-Identifier: Apache-2.0
// cpu-kernels-avx512.c: AVX-512 F/BW/VL microkernels and packing helpers (no VPOPCNTDQ, no VNNI:
// the Skylake-SP level).
//
// Binary tile: the pshufb nibble lookup on nibble-split panels (cpu-impl.h):
//   popc(a ^ b) = lut[lo(a) ^ lo(b)] + lut[hi(a) ^ hi(b)]
// 6 vector ops per 64-byte pair (2 xor, 2 vpshufb, 2 add) on a 4x4 register block (16 byte
// counters + 8 B registers + the table). Byte counters grow by <= 8 per step and are flushed with
// vpsadbw every 31 steps.
#include "cpu/cpu-impl.h"

#include <immintrin.h>

void bie_cpu_bin_tile_4x4__avx512(const uint8_t * a, size_t lda, const uint8_t * b, size_t ldb,
                                  size_t kb, int32_t * c, size_t ldc) {
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4));
    const __m512i zero = _mm512_setzero_si512();
    __m512i tot[CPU_MR][4];
    for (int i = 0; i < CPU_MR; i++)
        for (int j = 0; j < 4; j++) tot[i][j] = zero;
    const size_t k64 = kb / 64 * 64;
    size_t k = 0;
    while (k < k64) {
        const size_t kend = k64 - k > 31 * 64 ? k + 31 * 64 : k64;
        __m512i acc[CPU_MR][4];
        for (int i = 0; i < CPU_MR; i++)
            for (int j = 0; j < 4; j++) acc[i][j] = zero;
        for (; k < kend; k += 64) {
            __m512i bl[4], bh[4];
            for (int j = 0; j < 4; j++) {
                bl[j] = _mm512_loadu_si512((const void *)(b + j * ldb + k));
                bh[j] = _mm512_loadu_si512((const void *)(b + j * ldb + kb + k));
            }
            for (int i = 0; i < CPU_MR; i++) {
                const __m512i al = _mm512_loadu_si512((const void *)(a + i * lda + k));
                const __m512i ah = _mm512_loadu_si512((const void *)(a + i * lda + kb + k));
                for (int j = 0; j < 4; j++)
                    acc[i][j] = _mm512_add_epi8(
                        acc[i][j], _mm512_add_epi8(_mm512_shuffle_epi8(lut, _mm512_xor_si512(al, bl[j])),
                                                   _mm512_shuffle_epi8(lut, _mm512_xor_si512(ah, bh[j]))));
            }
        }
        for (int i = 0; i < CPU_MR; i++)
            for (int j = 0; j < 4; j++) tot[i][j] = _mm512_add_epi64(tot[i][j], _mm512_sad_epu8(acc[i][j], zero));
    }
    if (k < kb) { // a 32-byte tail, in 256-bit halves of the same arithmetic
        const __m256i lut256 = _mm512_castsi512_si256(lut), z256 = _mm256_setzero_si256();
        for (int i = 0; i < CPU_MR; i++) {
            const __m256i al = _mm256_loadu_si256((const __m256i *)(a + i * lda + k));
            const __m256i ah = _mm256_loadu_si256((const __m256i *)(a + i * lda + kb + k));
            for (int j = 0; j < 4; j++) {
                const __m256i bl = _mm256_loadu_si256((const __m256i *)(b + j * ldb + k));
                const __m256i bh = _mm256_loadu_si256((const __m256i *)(b + j * ldb + kb + k));
                const __m256i cnt = _mm256_add_epi8(_mm256_shuffle_epi8(lut256, _mm256_xor_si256(al, bl)),
                                                    _mm256_shuffle_epi8(lut256, _mm256_xor_si256(ah, bh)));
                tot[i][j] = _mm512_add_epi64(tot[i][j], _mm512_zextsi256_si512(_mm256_sad_epu8(cnt, z256)));
            }
        }
    }
    for (int i = 0; i < CPU_MR; i++)
        for (int j = 0; j < 4; j++) c[i * ldc + j] = (int32_t)_mm512_reduce_add_epi64(tot[i][j]);
}

// 4x4 tile of int16 dot products with vpmaddwd (exact int32 pair sums).
void bie_cpu_i16_tile_4x4__avx512(const int16_t * a, size_t lda, const int16_t * b, size_t ldb,
                                  size_t k, int32_t * c, size_t ldc) {
    __m512i acc[CPU_MR][4];
    for (int i = 0; i < CPU_MR; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_si512();
    for (size_t p = 0; p < k; p += 32) {
        __m512i bv[4];
        for (int j = 0; j < 4; j++) bv[j] = _mm512_load_si512((const void *)(b + j * ldb + p));
        for (int i = 0; i < CPU_MR; i++) {
            const __m512i av = _mm512_load_si512((const void *)(a + i * lda + p));
            for (int j = 0; j < 4; j++) acc[i][j] = _mm512_add_epi32(acc[i][j], _mm512_madd_epi16(av, bv[j]));
        }
    }
    for (int i = 0; i < CPU_MR; i++)
        for (int j = 0; j < 4; j++) c[i * ldc + j] = _mm512_reduce_add_epi32(acc[i][j]);
}

// 4x4 tile of the 4-bit GEMM: vpmaddubsw (unsigned a in [0, 15] times signed w in [-8, 7], pair
// sums <= 240 in magnitude) into int16 counters, widened with vpmaddwd every 128 steps.
void bie_cpu_u4s4_tile_4x4__avx512(const uint8_t * a, size_t lda, const int8_t * b, size_t ldb, size_t k,
                                   int32_t * c, size_t ldc) {
    const __m512i ones = _mm512_set1_epi16(1);
    __m512i tot[CPU_MR][4];
    for (int i = 0; i < CPU_MR; i++)
        for (int j = 0; j < 4; j++) tot[i][j] = _mm512_setzero_si512();
    size_t p = 0;
    while (p < k) {
        const size_t pend = k - p > 128 * 64 ? p + 128 * 64 : k;
        __m512i acc[CPU_MR][4];
        for (int i = 0; i < CPU_MR; i++)
            for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_si512();
        for (; p < pend; p += 64) {
            __m512i bv[4];
            for (int j = 0; j < 4; j++) bv[j] = _mm512_load_si512((const void *)(b + j * ldb + p));
            for (int i = 0; i < CPU_MR; i++) {
                const __m512i av = _mm512_load_si512((const void *)(a + i * lda + p));
                for (int j = 0; j < 4; j++) acc[i][j] = _mm512_add_epi16(acc[i][j], _mm512_maddubs_epi16(av, bv[j]));
            }
        }
        for (int i = 0; i < CPU_MR; i++)
            for (int j = 0; j < 4; j++) tot[i][j] = _mm512_add_epi32(tot[i][j], _mm512_madd_epi16(acc[i][j], ones));
    }
    for (int i = 0; i < CPU_MR; i++)
        for (int j = 0; j < 4; j++) c[i * ldc + j] = _mm512_reduce_add_epi32(tot[i][j]);
}

void bie_cpu_sign_bits__avx512(const float * x, const float * bias, float b0, int64_t n, uint8_t * out) {
    const __m512 bv0 = _mm512_set1_ps(b0), fz = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 live = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 bv = bias ? _mm512_maskz_loadu_ps(live, bias + i) : bv0;
        const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(live, x + i), bv);
        const __mmask16 m = _mm512_mask_cmp_ps_mask(live, v, fz, _CMP_GE_OQ);
        memcpy(out + i / 8, &m, n - i > 8 ? 2 : 1);
    }
}

void bie_cpu_quantize__avx512(const float * x, const float * bias, float b0, int64_t n, float scale,
                              int lo, int hi, int16_t * out) {
    const __m512 bv0 = _mm512_set1_ps(b0), sv = _mm512_set1_ps(scale);
    const __m512 lov = _mm512_set1_ps((float)lo), hiv = _mm512_set1_ps((float)hi);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 live = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 bv = bias ? _mm512_maskz_loadu_ps(live, bias + i) : bv0;
        __m512 r = _mm512_div_ps(_mm512_add_ps(_mm512_maskz_loadu_ps(live, x + i), bv), sv);
        r = _mm512_roundscale_ps(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm512_min_ps(_mm512_max_ps(r, lov), hiv); // max(NaN, lo) = lo
        _mm256_mask_storeu_epi16(out + i, live, _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(r)));
    }
}

static void nibble_split(const uint8_t * in, size_t n, uint8_t * lo, uint8_t * hi) {
    const __m512i m = _mm512_set1_epi8(15);
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const __m512i v = _mm512_loadu_si512((const void *)(in + i));
        _mm512_storeu_si512((void *)(lo + i), _mm512_and_si512(v, m));
        _mm512_storeu_si512((void *)(hi + i), _mm512_and_si512(_mm512_srli_epi16(v, 4), m));
    }
    if (i < n) { // 32-byte tail
        const __m256i v = _mm256_loadu_si256((const __m256i *)(in + i)), m32 = _mm512_castsi512_si256(m);
        _mm256_storeu_si256((__m256i *)(lo + i), _mm256_and_si256(v, m32));
        _mm256_storeu_si256((__m256i *)(hi + i), _mm256_and_si256(_mm256_srli_epi16(v, 4), m32));
    }
}

const struct cpu_kernels bie_cpu_kernels_avx512 = {
    .isa = BIE_CPU_ISA_AVX512,
    .bin_nr = 4,
    .bin_split = true,
    .i16_nr = 4,
    .bin_tile = bie_cpu_bin_tile_4x4__avx512,
    .i16_tile = bie_cpu_i16_tile_4x4__avx512,
    .u4s4_tile = bie_cpu_u4s4_tile_4x4__avx512,
    .sign_bits = bie_cpu_sign_bits__avx512,
    .quantize = bie_cpu_quantize__avx512,
    .nibble_split = nibble_split,
};
