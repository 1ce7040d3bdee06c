// SPDX-License-Identifier: Apache-2.0
// cpu-gemv-avx512.h: what the AVX-512 matrix-vector kernels (cpu-gemv-avx512.c and
// cpu-gemv-avx512vpopcnt.c, both built with AVX-512 F/BW/VL/DQ) share: horizontal sums of a row
// group's accumulators, tail masks, and the loop over weight rows. Include it only from those files.
#pragma once

#include "cpu/cpu-gemv.h"

#include <immintrin.h>

#define GEMV_INLINE static inline __attribute__((always_inline))

// Weight rows per group. The rows of a group are read one after the other, each in one pass, so
// that the weight is one sequential stream (on Zen 4, a weight streamed from DRAM is read at 98%
// of the read bandwidth this way, at 57% with the rows of a group read in step), into
// accumulators of their own that are summed together at the end of the group (gemv_hsum4: one
// reduction per 4 rows).
#define GEMV_R 4

// Zeroes a group's accumulators (acc[q][i]: weight row q, activation row i).
#define gemv_zero(acc)                                                                                                 \
    do {                                                                                                               \
        for (int q_ = 0; q_ < GEMV_R; q_++)                                                                            \
            for (int i_ = 0; i_ < CPU_GEMV_MR; i_++) (acc)[q_][i_] = _mm512_setzero_si512();                           \
    } while (0)

// The first n bytes of a vector (n < 64).
GEMV_INLINE __mmask64 gemv_bytes(size_t n) { return ((__mmask64)1 << n) - 1; }

// Lane j of the result = the sum of the 16 int32 lanes of v_j (j < 4).
GEMV_INLINE __m128i gemv_hsum4(__m512i v0, __m512i v1, __m512i v2, __m512i v3) {
    const __m256i y0 = _mm256_add_epi32(_mm512_castsi512_si256(v0), _mm512_extracti64x4_epi64(v0, 1));
    const __m256i y1 = _mm256_add_epi32(_mm512_castsi512_si256(v1), _mm512_extracti64x4_epi64(v1, 1));
    const __m256i y2 = _mm256_add_epi32(_mm512_castsi512_si256(v2), _mm512_extracti64x4_epi64(v2, 1));
    const __m256i y3 = _mm256_add_epi32(_mm512_castsi512_si256(v3), _mm512_extracti64x4_epi64(v3, 1));
    // hadd(hadd(y0, y1), hadd(y2, y3)): per 128-bit half, the four vectors' sums of that half.
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(y0, y1), _mm256_hadd_epi32(y2, y3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// Stores the sums of a row group: c[i*ldc + q] = (acc ? c[i*ldc + q] : 0) + sum(v[q][i]) - bias[i]
// (wrapping), for i < m, q < r (r is GEMV_R or 1).
GEMV_INLINE void gemv_store(int m, int r, __m512i v[GEMV_R][CPU_GEMV_MR], const uint32_t * bias, bool acc, int32_t * c,
                            size_t ldc) {
    for (int i = 0; i < m; i++) {
        int32_t * ci = c + (size_t)i * ldc;
        const uint32_t b = bias ? bias[i] : 0u;
        if (r == GEMV_R) {
            __m128i s = _mm_sub_epi32(gemv_hsum4(v[0][i], v[1][i], v[2][i], v[3][i]), _mm_set1_epi32((int)b));
            if (acc) s = _mm_add_epi32(s, _mm_loadu_si128((const __m128i *)ci));
            _mm_storeu_si128((__m128i *)ci, s);
        } else {
            const uint32_t s = (uint32_t)_mm512_reduce_add_epi32(v[0][i]) - b;
            ci[0] = (int32_t)(s + (acc ? (uint32_t)ci[0] : 0u));
        }
    }
}

// A step of a kernel: acc[i] += the terms of the 64 weight bytes wv (bytes t .. t+63 of a row; past
// kb they read as 0) with activation row i, for i < M.
typedef void (*gemv_step_fn)(const int M, const uint8_t * a, size_t lda, size_t kb, size_t t, __m512i wv,
                             __m512i * acc);

// A group of r weight rows from row j (r is GEMV_R or 1), each row in one pass of steps (the last
// one on a masked load), then its sums stored (gemv_store, with bias). The step is inlined.
GEMV_INLINE void gemv_group(const int M, const int r, int64_t j, const uint8_t * a, size_t lda, const uint32_t * bias,
                            const uint8_t * w, size_t ldw, size_t kb, int32_t * c, size_t ldc, gemv_step_fn step) {
    __m512i acc[GEMV_R][CPU_GEMV_MR];
    gemv_zero(acc);
    for (int q = 0; q < r; q++) {
        const uint8_t * wq = w + (size_t)(j + q) * ldw;
        size_t t = 0;
        for (; t + 64 <= kb; t += 64) step(M, a, lda, kb, t, _mm512_loadu_si512((const void *)(wq + t)), acc[q]);
        if (t < kb) step(M, a, lda, kb, t, _mm512_maskz_loadu_epi8(gemv_bytes(kb - t), (const void *)(wq + t)), acc[q]);
    }
    gemv_store(M, r, acc, bias, false, c + j, ldc);
}

// The biases b * asum[i] of the unsigned-by-signed kernels (cpu-gemv.h), wrapping.
GEMV_INLINE void gemv_bias(int m, const int32_t * asum, uint32_t b, uint32_t * out) {
    for (int i = 0; i < m; i++) out[i] = b * (uint32_t)asum[i];
}
