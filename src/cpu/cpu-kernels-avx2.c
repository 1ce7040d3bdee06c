// SPDX-License-Identifier: Apache-2.0
// cpu-kernels-avx2.c: AVX2 microkernels and packing helpers (compiled with the AVX2 flags only).
//
// Binary tile: popcount(a XOR b) by the pshufb nibble lookup (Mula, Kurz & Lemire 2018) on
// nibble-split panels: popc(a ^ b) = lut[lo(a) ^ lo(b)] + lut[hi(a) ^ hi(b)], in outer-product
// form (a word of A broadcast against a word of 4 columns per vector). Byte counters grow by <= 8
// per word, so they are summed per 64-bit lane with vpsadbw every 31 words (31 * 8 = 248 < 256).
#include "cpu/cpu-impl.h"

#include <immintrin.h>

static inline int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

// 4x8 tile: word w of A row i (lo and hi nibble planes) is broadcast against word w of the
// group's 8 columns (two vectors of 4 lanes per plane).
static void bin_tile_4x8(const uint8_t * a, size_t lda, const uint8_t * b, size_t kb, int32_t * c, size_t ldc) {
    const __m256i lut = _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4, 0, 1, 1, 2, 1, 2, 2, 3, 1, 2,
                                         2, 3, 2, 3, 3, 4);
    const __m256i zero = _mm256_setzero_si256();
    const size_t kw = kb / 8;
    const uint8_t * bh = b + kw * 64; // hi words of the group
    __m256i tot[CPU_MR][2];
    for (int i = 0; i < CPU_MR; i++) tot[i][0] = tot[i][1] = zero;
    size_t w = 0;
    while (w < kw) {
        const size_t wend = kw - w > 31 ? w + 31 : kw;
        __m256i acc[CPU_MR][2];
        for (int i = 0; i < CPU_MR; i++) acc[i][0] = acc[i][1] = zero;
        for (; w < wend; w++) {
            const __m256i bl0 = _mm256_load_si256((const __m256i *)(b + w * 64));
            const __m256i bl1 = _mm256_load_si256((const __m256i *)(b + w * 64 + 32));
            const __m256i bh0 = _mm256_load_si256((const __m256i *)(bh + w * 64));
            const __m256i bh1 = _mm256_load_si256((const __m256i *)(bh + w * 64 + 32));
            for (int i = 0; i < CPU_MR; i++) {
                int64_t lo, hi;
                memcpy(&lo, a + i * lda + w * 8, 8);
                memcpy(&hi, a + i * lda + kb + w * 8, 8);
                const __m256i al = _mm256_set1_epi64x(lo), ah = _mm256_set1_epi64x(hi);
                acc[i][0] =
                    _mm256_add_epi8(acc[i][0], _mm256_add_epi8(_mm256_shuffle_epi8(lut, _mm256_xor_si256(al, bl0)),
                                                               _mm256_shuffle_epi8(lut, _mm256_xor_si256(ah, bh0))));
                acc[i][1] =
                    _mm256_add_epi8(acc[i][1], _mm256_add_epi8(_mm256_shuffle_epi8(lut, _mm256_xor_si256(al, bl1)),
                                                               _mm256_shuffle_epi8(lut, _mm256_xor_si256(ah, bh1))));
            }
        }
        for (int i = 0; i < CPU_MR; i++)
            for (int j = 0; j < 2; j++) tot[i][j] = _mm256_add_epi64(tot[i][j], _mm256_sad_epu8(acc[i][j], zero));
    }
    for (int i = 0; i < CPU_MR; i++)
        for (int j = 0; j < 2; j++) {
            int64_t v[4];
            memcpy(v, &tot[i][j], sizeof v);
            for (int l = 0; l < 4; l++) c[i * ldc + j * 4 + l] = (int32_t)v[l];
        }
}

// 4x2 tile of int16 dot products: vpmaddwd gives exact int32 pair sums (no saturation).
static void i16_tile_4x2(const int16_t * a, size_t lda, const int16_t * b, size_t ldb, size_t k, int32_t * c,
                         size_t ldc) {
    __m256i acc[CPU_MR][2];
    for (int i = 0; i < CPU_MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
    for (size_t p = 0; p < k; p += 16) {
        const __m256i b0 = _mm256_load_si256((const __m256i *)(b + p));
        const __m256i b1 = _mm256_load_si256((const __m256i *)(b + ldb + p));
        for (int i = 0; i < CPU_MR; i++) {
            const __m256i av = _mm256_load_si256((const __m256i *)(a + i * lda + p));
            acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(av, b0));
            acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(av, b1));
        }
    }
    for (int i = 0; i < CPU_MR; i++)
        for (int j = 0; j < 2; j++) c[i * ldc + j] = hsum_epi32(acc[i][j]);
}

// 4x2 tile of the 4-bit GEMM: vpmaddubsw (unsigned a in [0, 15] times signed w in [-8, 7]; a pair
// sums to at most 240 in magnitude, no saturation) into int16 counters, widened with vpmaddwd
// every 128 steps (128 * 240 < 32768).
static void u4s4_tile_4x2(const uint8_t * a, size_t lda, const int8_t * b, size_t ldb, size_t k, int32_t * c,
                          size_t ldc) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i tot[CPU_MR][2];
    for (int i = 0; i < CPU_MR; i++) tot[i][0] = tot[i][1] = _mm256_setzero_si256();
    size_t p = 0;
    while (p < k) {
        const size_t pend = k - p > 128 * 32 ? p + 128 * 32 : k;
        __m256i acc[CPU_MR][2];
        for (int i = 0; i < CPU_MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
        for (; p < pend; p += 32) {
            const __m256i b0 = _mm256_load_si256((const __m256i *)(b + p));
            const __m256i b1 = _mm256_load_si256((const __m256i *)(b + ldb + p));
            for (int i = 0; i < CPU_MR; i++) {
                const __m256i av = _mm256_load_si256((const __m256i *)(a + i * lda + p));
                acc[i][0] = _mm256_add_epi16(acc[i][0], _mm256_maddubs_epi16(av, b0));
                acc[i][1] = _mm256_add_epi16(acc[i][1], _mm256_maddubs_epi16(av, b1));
            }
        }
        for (int i = 0; i < CPU_MR; i++)
            for (int j = 0; j < 2; j++) tot[i][j] = _mm256_add_epi32(tot[i][j], _mm256_madd_epi16(acc[i][j], ones));
    }
    for (int i = 0; i < CPU_MR; i++)
        for (int j = 0; j < 2; j++) c[i * ldc + j] = hsum_epi32(tot[i][j]);
}

static void sign_bits(const float * x, const float * bias, float b0, int64_t n, uint8_t * out) {
    const __m256 bv0 = _mm256_set1_ps(b0), fz = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 bv = bias ? _mm256_loadu_ps(bias + i) : bv0;
        const __m256 v = _mm256_add_ps(_mm256_loadu_ps(x + i), bv);
        out[i / 8] = (uint8_t)_mm256_movemask_ps(_mm256_cmp_ps(v, fz, _CMP_GE_OQ));
    }
    if (i < n) bie_cpu_kernels_scalar.sign_bits(x + i, bias ? bias + i : NULL, b0, n - i, out + i / 8);
}

static void quantize(const float * x, const float * bias, float b0, int64_t n, float scale, int lo, int hi,
                     int16_t * out) {
    const __m256 bv0 = _mm256_set1_ps(b0), sv = _mm256_set1_ps(scale);
    const __m256 lov = _mm256_set1_ps((float)lo), hiv = _mm256_set1_ps((float)hi);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 bv = bias ? _mm256_loadu_ps(bias + i) : bv0;
        __m256 r = _mm256_div_ps(_mm256_add_ps(_mm256_loadu_ps(x + i), bv), sv);
        r = _mm256_round_ps(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm256_min_ps(_mm256_max_ps(r, lov), hiv); // max(NaN, lo) = lo
        const __m256i q = _mm256_cvtps_epi32(r);
        _mm_storeu_si128((__m128i *)(out + i),
                         _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)));
    }
    if (i < n) bie_cpu_kernels_scalar.quantize(x + i, bias ? bias + i : NULL, b0, n - i, scale, lo, hi, out + i);
}

static double mask_binary(const float * x, const float * bias, float b0, float scale, float * gx, int64_t n) {
    const __m256 bv0 = _mm256_set1_ps(b0), sv = _mm256_set1_ps(scale), one = _mm256_set1_ps(1.0f);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), fz = _mm256_setzero_ps();
    const __m256 signbit = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_add_ps(_mm256_loadu_ps(x + i), bias ? _mm256_loadu_ps(bias + i) : bv0);
        const __m256 r = _mm256_and_ps(_mm256_div_ps(v, sv), absmask);
        const __m256 out = _mm256_and_ps(_mm256_loadu_ps(gx + i), _mm256_cmp_ps(r, one, _CMP_LE_OQ));
        _mm256_storeu_ps(gx + i, out);
        // out * sign(v): flip the sign where v >= 0 is false
        const __m256 t = _mm256_xor_ps(out, _mm256_andnot_ps(_mm256_cmp_ps(v, fz, _CMP_GE_OQ), signbit));
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(t)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(t, 1)));
    }
    double lanes[4], lanes1[4];
    _mm256_storeu_pd(lanes, s0);
    _mm256_storeu_pd(lanes1, s1);
    double s = 0.0;
    for (int l = 0; l < 4; l++) s += lanes[l] + lanes1[l];
    if (i < n) s += bie_cpu_kernels_scalar.mask_binary(x + i, bias ? bias + i : NULL, b0, scale, gx + i, n - i);
    return s;
}

static void nibble_split(const uint8_t * in, size_t n, uint8_t * lo, uint8_t * hi) {
    const __m256i m = _mm256_set1_epi8(15);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(in + i));
        _mm256_storeu_si256((__m256i *)(lo + i), _mm256_and_si256(v, m));
        _mm256_storeu_si256((__m256i *)(hi + i), _mm256_and_si256(_mm256_srli_epi16(v, 4), m));
    }
    if (i < n) bie_cpu_kernels_scalar.nibble_split(in + i, n - i, lo + i, hi + i);
}

const struct cpu_kernels bie_cpu_kernels_avx2 = {
    .isa = BIE_CPU_ISA_AVX2,
    .bin = {.nr = 8, .split = true, .tile = bin_tile_4x8},
    .i16_nr = 2,
    .i16_tile = i16_tile_4x2,
    .u4s4_tile = u4s4_tile_4x2,
    .sign_bits = sign_bits,
    .quantize = quantize,
    .mask_binary = mask_binary,
    .nibble_split = nibble_split,
    .store_cols_f32 = bie_cpu_store_cols_f32__scalar,
};
