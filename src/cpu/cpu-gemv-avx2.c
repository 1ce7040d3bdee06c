// SPDX-License-Identifier: Apache-2.0
// cpu-gemv-avx2.c: matrix-vector kernels with AVX2 (contract in cpu-gemv.h). The same steps as the
// AVX-512 kernels (cpu-gemv-avx512.c) on 256-bit vectors: binary by the nibble lookup and vpsadbw,
// 4-bit by vpmaddubsw on the unsigned nibbles x + 8 (int16 lanes widened every 64 steps of 32
// bytes, the bias 8 * asum taken off), 8-bit by vpmovsxbw and vpmaddwd.
// There are no masked loads: the last partial vector of a weight row is copied into a zeroed
// buffer first.
#include "cpu/cpu-gemv.h"

#include <immintrin.h>

#define INL static inline __attribute__((always_inline))
#define R 4 // weight rows per group (read one after the other: one sequential stream, as cpu-gemv-avx512.h)

// Lane j of the result = the sum of the 8 int32 lanes of y_j.
INL __m128i hsum4(__m256i y0, __m256i y1, __m256i y2, __m256i y3) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(y0, y1), _mm256_hadd_epi32(y2, y3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// c[i*ldc + q] = sum(v[q][i]) - bias[i] for i < M, q < r (wrapping).
INL void store(const int M, const int r, __m256i v[R][CPU_GEMV_MR], const uint32_t * bias, int32_t * c, size_t ldc) {
    const __m256i z = _mm256_setzero_si256();
    for (int i = 0; i < M; i++) {
        uint32_t s[4];
        _mm_storeu_si128((__m128i *)s, hsum4(v[0][i], r > 1 ? v[1][i] : z, r > 2 ? v[2][i] : z, r > 3 ? v[3][i] : z));
        for (int q = 0; q < r; q++) c[(size_t)i * ldc + (size_t)q] = (int32_t)(s[q] - (bias ? bias[i] : 0u));
    }
}

INL void zero(__m256i acc[R][CPU_GEMV_MR]) {
    for (int q = 0; q < R; q++)
        for (int i = 0; i < CPU_GEMV_MR; i++) acc[q][i] = _mm256_setzero_si256();
}

// The 32 weight bytes at wq + t: a whole load, or the last n (< 32) bytes through a zeroed buffer.
INL __m256i load_w(const uint8_t * wq, size_t t, size_t n) {
    if (n >= 32) return _mm256_loadu_si256((const __m256i *)(wq + t));
    uint8_t buf[32] = {0};
    memcpy(buf, wq + t, n);
    return _mm256_loadu_si256((const __m256i *)buf);
}

INL __m256i popc_sad(__m256i x) {
    const __m256i lut = _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4, 0, 1, 1, 2, 1, 2, 2, 3, 1, 2,
                                         2, 3, 2, 3, 3, 4);
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m256i cnt = _mm256_add_epi8(_mm256_shuffle_epi8(lut, _mm256_and_si256(x, m4)),
                                        _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(x, 4), m4)));
    return _mm256_sad_epu8(cnt, _mm256_setzero_si256());
}

// A step: acc[i] += the terms of the 32 weight bytes wv (bytes t .. t+31 of a row; past kb they read
// as 0) with activation row i, for i < M.
typedef void (*step_fn)(const int M, const uint8_t * a, size_t lda, size_t t, __m256i wv, __m256i * acc);

// A group of r weight rows from row j, each row in one pass of steps, then its sums stored.
INL void group(const int M, const int r, int64_t j, const uint8_t * a, size_t lda, const uint32_t * bias,
               const uint8_t * w, size_t ldw, size_t kb, int32_t * c, size_t ldc, step_fn step) {
    __m256i acc[R][CPU_GEMV_MR];
    zero(acc);
    for (int q = 0; q < r; q++) {
        const uint8_t * wq = w + (size_t)(j + q) * ldw;
        for (size_t t = 0; t < kb; t += 32) step(M, a, lda, t, load_w(wq, t, kb - t), acc[q]);
    }
    store(M, r, acc, bias, c + j, ldc);
}

// The 64-bit lanes hold counts below 2^32: summed as int32 lanes (the high halves are 0).
INL void b1_step(const int M, const uint8_t * a, size_t lda, size_t t, __m256i wv, __m256i * acc) {
    for (int i = 0; i < M; i++) {
        const __m256i av = _mm256_load_si256((const __m256i *)(a + (size_t)i * lda + t));
        acc[i] = _mm256_add_epi64(acc[i], popc_sad(_mm256_xor_si256(av, wv)));
    }
}

static void b1(const uint8_t * a, size_t lda, int m, const uint8_t * w, size_t ldw, int64_t n, size_t kb, int32_t * c,
               size_t ldc) {
    CPU_GEMV_FOR_GROUPS(group, R, m, n, a, lda, NULL, w, ldw, kb, c, ldc, b1_step);
}

#define S4_BLOCK 2048 // bytes of a weight row per int16 block (64 steps of 32)

INL void s4_group(const int M, const int r, int64_t j, const int8_t * a, size_t lda, const uint32_t * bias,
                  const uint8_t * w, size_t ldw, size_t kb, int32_t * c, size_t ldc) {
    const size_t kp = cpu_round_up(kb, CPU_GEMV_ALIGN);
    const __m256i m15 = _mm256_set1_epi8(15), b8 = _mm256_set1_epi8(8), ones = _mm256_set1_epi16(1);
    __m256i acc[R][CPU_GEMV_MR];
    zero(acc);
    for (int q = 0; q < r; q++) {
        const uint8_t * wq = w + (size_t)(j + q) * ldw;
        for (size_t t0 = 0; t0 < kb; t0 += S4_BLOCK) {
            const size_t t1 = kb - t0 > S4_BLOCK ? t0 + S4_BLOCK : kb;
            __m256i a16[CPU_GEMV_MR];
            for (int i = 0; i < CPU_GEMV_MR; i++) a16[i] = _mm256_setzero_si256();
            for (size_t t = t0; t < t1; t += 32) {
                const __m256i wv = load_w(wq, t, t1 - t); // past the row: zero bytes, nibbles 8, zero codes
                const __m256i hi = _mm256_xor_si256(_mm256_and_si256(_mm256_srli_epi16(wv, 4), m15), b8);
                const __m256i lo = _mm256_xor_si256(_mm256_and_si256(wv, m15), b8);
                for (int i = 0; i < M; i++) {
                    const __m256i ae = _mm256_load_si256((const __m256i *)(a + (size_t)i * lda + t));
                    const __m256i ao = _mm256_load_si256((const __m256i *)(a + (size_t)i * lda + kp + t));
                    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(hi, ae), _mm256_maddubs_epi16(lo, ao));
                    a16[i] = _mm256_add_epi16(a16[i], p);
                }
            }
            for (int i = 0; i < M; i++) acc[q][i] = _mm256_add_epi32(acc[q][i], _mm256_madd_epi16(a16[i], ones));
        }
    }
    store(M, r, acc, bias, c + j, ldc);
}

static void s4(const int8_t * a, size_t lda, const int32_t * asum, int m, const uint8_t * w, size_t ldw, int64_t n,
               size_t kb, int32_t * c, size_t ldc) {
    uint32_t bias[CPU_GEMV_MR];
    for (int i = 0; i < m; i++) bias[i] = 8u * (uint32_t)asum[i];
    CPU_GEMV_FOR_GROUPS(s4_group, R, m, n, a, lda, bias, w, ldw, kb, c, ldc);
}

// The two 16-byte halves of 32 weight bytes, sign-extended to int16.
INL void s8_step(const int M, const uint8_t * a, size_t lda, size_t t, __m256i wv, __m256i * acc) {
    const __m256i w0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(wv));
    const __m256i w1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(wv, 1));
    for (int i = 0; i < M; i++) {
        const uint8_t * ai = a + (size_t)i * lda + t;
        const __m256i a0 = _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i *)ai));
        const __m256i a1 = _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i *)(ai + 16)));
        acc[i] = _mm256_add_epi32(acc[i], _mm256_add_epi32(_mm256_madd_epi16(a0, w0), _mm256_madd_epi16(a1, w1)));
    }
}

static void s8(const int8_t * a, size_t lda, const int32_t * asum, int m, const int8_t * w, size_t ldw, int64_t n,
               size_t k, int32_t * c, size_t ldc) {
    (void)asum;
    CPU_GEMV_FOR_GROUPS(group, R, m, n, (const uint8_t *)a, lda, NULL, (const uint8_t *)w, ldw, k, c, ldc, s8_step);
}

const struct cpu_gemv_kernels bie_cpu_gemv_avx2 = {.name = "avx2", .b1 = b1, .s4 = s4, .s8 = s8};
