// SPDX-License-Identifier: Apache-2.0
// cpu-gemv-avx512.h: what the AVX-512 matrix-vector kernels (cpu-gemv-avx512.c and
// cpu-gemv-avx512vpopcnt.c, both built with AVX-512 F/BW/VL/DQ) share: horizontal sums of a row
// group's accumulators, tail masks, and the loop over weight rows. Include it only from those files.
#pragma once

#include "cpu/cpu-gemv.h"

#include <immintrin.h>

#define GEMV_INLINE static inline __attribute__((always_inline))

// Weight rows per group: each weight vector is loaded once and used against every activation row.
#define GEMV_R 4

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

// Stores the sums of a row group: c[i*ldc + j] = (acc ? c[i*ldc + j] : 0) + sum(v[i][j]) - bias[i]
// (wrapping), for i < m, j < r (r is GEMV_R or 1).
GEMV_INLINE void gemv_store(int m, int r, __m512i v[CPU_GEMV_MR][GEMV_R], const uint32_t * bias, bool acc,
                            int32_t * c, size_t ldc) {
    for (int i = 0; i < m; i++) {
        int32_t * ci = c + (size_t)i * ldc;
        const uint32_t b = bias ? bias[i] : 0u;
        if (r == GEMV_R) {
            __m128i s = _mm_sub_epi32(gemv_hsum4(v[i][0], v[i][1], v[i][2], v[i][3]), _mm_set1_epi32((int)b));
            if (acc) s = _mm_add_epi32(s, _mm_loadu_si128((const __m128i *)ci));
            _mm_storeu_si128((__m128i *)ci, s);
        } else {
            const uint32_t s = (uint32_t)_mm512_reduce_add_epi32(v[i][0]) - b;
            ci[0] = (int32_t)(s + (acc ? (uint32_t)ci[0] : 0u));
        }
    }
}

// The biases b * asum[i] of the unsigned-by-signed kernels (cpu-gemv.h), wrapping.
GEMV_INLINE void gemv_bias(int m, const int32_t * asum, uint32_t b, uint32_t * out) {
    for (int i = 0; i < m; i++) out[i] = b * (uint32_t)asum[i];
}

// Calls group(M, r, j) for the row groups j of n weight rows (groups of GEMV_R, then single rows)
// with M the compile-time count of activation rows (1 .. CPU_GEMV_MR) that m selects.
#define GEMV_FOR_GROUPS(group, m, n, ...)                                                          \
    do {                                                                                           \
        int64_t j_ = 0;                                                                            \
        switch (m) {                                                                               \
        case 1:                                                                                    \
            for (; j_ + GEMV_R <= (n); j_ += GEMV_R) group(1, GEMV_R, j_, __VA_ARGS__);            \
            for (; j_ < (n); j_++) group(1, 1, j_, __VA_ARGS__);                                   \
            break;                                                                                 \
        case 2:                                                                                    \
            for (; j_ + GEMV_R <= (n); j_ += GEMV_R) group(2, GEMV_R, j_, __VA_ARGS__);            \
            for (; j_ < (n); j_++) group(2, 1, j_, __VA_ARGS__);                                   \
            break;                                                                                 \
        case 3:                                                                                    \
            for (; j_ + GEMV_R <= (n); j_ += GEMV_R) group(3, GEMV_R, j_, __VA_ARGS__);            \
            for (; j_ < (n); j_++) group(3, 1, j_, __VA_ARGS__);                                   \
            break;                                                                                 \
        default:                                                                                   \
            for (; j_ + GEMV_R <= (n); j_ += GEMV_R) group(4, GEMV_R, j_, __VA_ARGS__);            \
            for (; j_ < (n); j_++) group(4, 1, j_, __VA_ARGS__);                                   \
        }                                                                                          \
    } while (0)
