// SPDX-License-Identifier: Apache-2.0
// cpu-gemv-avx2.c: matrix-vector kernels with AVX2 (contract in cpu-gemv.h): the loops of
// cpu-gemv-simd.h on 256-bit vectors: binary by the nibble lookup and vpsadbw, 4-bit by vpmaddubsw
// on the unsigned nibbles x + 8 (the bias 8 * asum taken off), 8-bit by vpmovsxbw and vpmaddwd.
// There are no masked byte loads: the last partial vector of a weight row is copied into a zeroed
// buffer first.
#include "cpu/cpu-gemv.h"

#include <immintrin.h>
#include <string.h>

typedef __m256i vi;
enum { GEMV_VB = 32 };

#define INL static inline __attribute__((always_inline))

INL vi vload(const void * p) { return _mm256_load_si256((const __m256i *)p); }
INL vi vloadu(const void * p) { return _mm256_loadu_si256((const __m256i *)p); }
INL vi vload_tail(const void * p, size_t n) {
    uint8_t buf[32] = {0};
    memcpy(buf, p, n);
    return _mm256_loadu_si256((const __m256i *)buf);
}

INL vi popc_sad(vi x) {
    const __m256i lut = _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4, 0, 1, 1, 2, 1, 2, 2, 3, 1, 2,
                                         2, 3, 2, 3, 3, 4);
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m256i cnt = _mm256_add_epi8(_mm256_shuffle_epi8(lut, _mm256_and_si256(x, m4)),
                                        _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(x, 4), m4)));
    return _mm256_sad_epu8(cnt, _mm256_setzero_si256());
}

INL void s4_nibbles(vi wv, vi * hi, vi * lo) {
    const __m256i m15 = _mm256_set1_epi8(15), b8 = _mm256_set1_epi8(8);
    *hi = _mm256_xor_si256(_mm256_and_si256(_mm256_srli_epi16(wv, 4), m15), b8);
    *lo = _mm256_xor_si256(_mm256_and_si256(wv, m15), b8);
}
INL vi maddubs(vi u, vi s) { return _mm256_maddubs_epi16(u, s); }
INL vi madd(vi a, vi b) { return _mm256_madd_epi16(a, b); }

INL vi widen_lo(vi w) { return _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w)); }
INL vi widen_hi(vi w) { return _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1)); }
INL vi widen_load(const void * p) { return _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i *)p)); }

#include "cpu/cpu-gemv-simd.h"

// Lane j of the result = the sum of the 8 int32 lanes of y_j.
INL __m128i hsum4(__m256i y0, __m256i y1, __m256i y2, __m256i y3) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(y0, y1), _mm256_hadd_epi32(y2, y3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

GEMV_INLINE void gemv_store(const int M, const int r, vi v[GEMV_R][CPU_GEMV_MR], const uint32_t * bias, int32_t * c,
                            size_t ldc) {
    const __m256i z = _mm256_setzero_si256();
    for (int i = 0; i < M; i++) {
        uint32_t s[4];
        _mm_storeu_si128((__m128i *)s, hsum4(v[0][i], r > 1 ? v[1][i] : z, r > 2 ? v[2][i] : z, r > 3 ? v[3][i] : z));
        for (int q = 0; q < r; q++) c[(size_t)i * ldc + (size_t)q] = (int32_t)(s[q] - (bias ? bias[i] : 0u));
    }
}

static void b1(const uint8_t * a, size_t lda, int m, const uint8_t * w, size_t ldw, int64_t n, size_t kb, int32_t * c,
               size_t ldc) {
    CPU_GEMV_FOR_GROUPS(gemv_group, GEMV_R, m, n, a, lda, NULL, w, ldw, kb, c, ldc, gemv_b1_step);
}

static void s4(const int8_t * a, size_t lda, const int32_t * asum, int m, const uint8_t * w, size_t ldw, int64_t n,
               size_t kb, int32_t * c, size_t ldc) {
    uint32_t bias[CPU_GEMV_MR];
    gemv_bias(m, asum, 8, bias);
    CPU_GEMV_FOR_GROUPS(gemv_s4_group, GEMV_R, m, n, a, lda, bias, w, ldw, kb, c, ldc);
}

static void s8(const int8_t * a, size_t lda, const int32_t * asum, int m, const int8_t * w, size_t ldw, int64_t n,
               size_t k, int32_t * c, size_t ldc) {
    (void)asum;
    CPU_GEMV_FOR_GROUPS(gemv_group, GEMV_R, m, n, (const uint8_t *)a, lda, NULL, (const uint8_t *)w, ldw, k, c, ldc,
                        gemv_s8_step);
}

const struct cpu_gemv_kernels bie_cpu_gemv_avx2 = {.name = "avx2", .b1 = b1, .s4 = s4, .s8 = s8};
