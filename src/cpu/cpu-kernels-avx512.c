// SPDX-License-Identifier: Apache-2.0
// cpu-kernels-avx512.c: AVX-512 F/BW/VL microkernels and packing helpers (no VPOPCNTDQ, no VNNI:
// the Skylake-SP level).
//
// Binary tile: the pshufb nibble lookup on nibble-split panels (cpu-impl.h):
//   popc(a ^ b) = lut[lo(a) ^ lo(b)] + lut[hi(a) ^ hi(b)]
// in outer-product form: a word of A broadcast against the same word of 8 columns per vector, 6
// vector ops per 512 bit-products (2 xor, 2 vpshufb, 2 add) on a 4x16 block (8 byte counters, 8
// lane sums, 4 B registers, the table), no horizontal sums. Byte counters grow by <= 8 per word
// and are summed per lane with vpsadbw every 31 words.
#include "cpu/cpu-impl.h"

#include <immintrin.h>

// 4x16 tile: word w of A row i (lo and hi planes) broadcast against word w of the group's 16
// columns (two vectors of 8 lanes per plane).
static void bin_tile_4x16(const uint8_t * a, size_t lda, const uint8_t * b, size_t kb, int32_t * c, size_t ldc) {
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4));
    const __m512i zero = _mm512_setzero_si512();
    const size_t kw = kb / 8;
    const uint8_t * bh = b + kw * 128; // hi words of the group
    __m512i tot[CPU_MR][2];
    for (int i = 0; i < CPU_MR; i++) tot[i][0] = tot[i][1] = zero;
    size_t w = 0;
    while (w < kw) {
        const size_t wend = kw - w > 31 ? w + 31 : kw;
        __m512i acc[CPU_MR][2];
        for (int i = 0; i < CPU_MR; i++) acc[i][0] = acc[i][1] = zero;
        for (; w < wend; w++) {
            const __m512i bl0 = _mm512_load_si512((const void *)(b + w * 128));
            const __m512i bl1 = _mm512_load_si512((const void *)(b + w * 128 + 64));
            const __m512i bh0 = _mm512_load_si512((const void *)(bh + w * 128));
            const __m512i bh1 = _mm512_load_si512((const void *)(bh + w * 128 + 64));
            for (int i = 0; i < CPU_MR; i++) {
                int64_t lo, hi;
                memcpy(&lo, a + i * lda + w * 8, 8);
                memcpy(&hi, a + i * lda + kb + w * 8, 8);
                const __m512i al = _mm512_set1_epi64(lo), ah = _mm512_set1_epi64(hi);
                acc[i][0] = _mm512_add_epi8(acc[i][0],
                                            _mm512_add_epi8(_mm512_shuffle_epi8(lut, _mm512_xor_si512(al, bl0)),
                                                            _mm512_shuffle_epi8(lut, _mm512_xor_si512(ah, bh0))));
                acc[i][1] = _mm512_add_epi8(acc[i][1],
                                            _mm512_add_epi8(_mm512_shuffle_epi8(lut, _mm512_xor_si512(al, bl1)),
                                                            _mm512_shuffle_epi8(lut, _mm512_xor_si512(ah, bh1))));
            }
        }
        for (int i = 0; i < CPU_MR; i++)
            for (int j = 0; j < 2; j++) tot[i][j] = _mm512_add_epi64(tot[i][j], _mm512_sad_epu8(acc[i][j], zero));
    }
    for (int i = 0; i < CPU_MR; i++)
        for (int j = 0; j < 2; j++) _mm256_storeu_si256((__m256i *)(c + i * ldc + j * 8), _mm512_cvtepi64_epi32(tot[i][j]));
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
        out[i / 8] = (uint8_t)m;
        if (n - i > 8) out[i / 8 + 1] = (uint8_t)(m >> 8);
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

double bie_cpu_mask_binary__avx512(const float * x, const float * bias, float b0, float scale, float * gx,
                                   int64_t n) {
    const __m512 bv0 = _mm512_set1_ps(b0), sv = _mm512_set1_ps(scale), one = _mm512_set1_ps(1.0f);
    const __m512 fz = _mm512_setzero_ps();
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 live = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(live, x + i), bias ? _mm512_maskz_loadu_ps(live, bias + i) : bv0);
        const __m512 r = _mm512_abs_ps(_mm512_div_ps(v, sv));
        const __mmask16 keep = _mm512_mask_cmp_ps_mask(live, r, one, _CMP_LE_OQ);
        const __m512 out = _mm512_maskz_loadu_ps(keep, gx + i);
        _mm512_mask_storeu_ps(gx + i, live, out);
        const __mmask16 neg = _mm512_mask_cmp_ps_mask(live, v, fz, _CMP_NGE_UQ); // not (v >= 0), NaN too
        const __m512 t = _mm512_mask_sub_ps(out, neg, fz, out);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(t)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(t), 1))));
    }
    double lanes[8], lanes1[8];
    _mm512_storeu_pd(lanes, s0);
    _mm512_storeu_pd(lanes1, s1);
    double s = 0.0;
    for (int l = 0; l < 8; l++) s += lanes[l] + lanes1[l];
    return s;
}

static void nibble_split(const uint8_t * in, size_t n, uint8_t * lo, uint8_t * hi) {
    const __m512i m = _mm512_set1_epi8(15);
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const __m512i v = _mm512_loadu_si512((const void *)(in + i));
        _mm512_storeu_si512((void *)(lo + i), _mm512_and_si512(v, m));
        _mm512_storeu_si512((void *)(hi + i), _mm512_and_si512(_mm512_srli_epi16(v, 4), m));
    }
    if (i < n) bie_cpu_kernels_scalar.nibble_split(in + i, n - i, lo + i, hi + i);
}

const struct cpu_kernels bie_cpu_kernels_avx512 = {
    .isa = BIE_CPU_ISA_AVX512,
    .bin_nr = 16,
    .bin_split = true,
    .i16_nr = 4,
    .bin_tile = bin_tile_4x16,
    .i16_tile = bie_cpu_i16_tile_4x4__avx512,
    .u4s4_tile = bie_cpu_u4s4_tile_4x4__avx512,
    .sign_bits = bie_cpu_sign_bits__avx512,
    .quantize = bie_cpu_quantize__avx512,
    .mask_binary = bie_cpu_mask_binary__avx512,
    .nibble_split = nibble_split,
};
