// SPDX-License-Identifier: Apache-2.0
// cpu-gemv-avx512.h: what the AVX-512 matrix-vector kernels (cpu-gemv-avx512.c and
// cpu-gemv-avx512vpopcnt.c, both built with AVX-512 F/BW/VL/DQ) share: the vector operations that
// cpu-gemv-simd.h's loops are written over (a row's last partial vector read by a masked load),
// and the sums of a row group's accumulators. Include it only from those files.
#pragma once

#include "cpu/cpu-gemv.h"

#include <immintrin.h>

typedef __m512i vi;
enum { GEMV_VB = 64 };

// The first n bytes of a vector (n < 64).
static inline __mmask64 gemv_bytes(size_t n) { return ((__mmask64)1 << n) - 1; }

static inline __attribute__((always_inline)) vi vload(const void * p) { return _mm512_load_si512(p); }
static inline __attribute__((always_inline)) vi vloadu(const void * p) { return _mm512_loadu_si512(p); }
static inline __attribute__((always_inline)) vi vload_tail(const void * p, size_t n) {
    return _mm512_maskz_loadu_epi8(gemv_bytes(n), p);
}

// Binary: popc by the nibble lookup (two vpshufb on the low and high nibbles of each byte), the
// byte counts summed into 64-bit lanes with vpsadbw.
static inline __attribute__((always_inline)) vi popc_sad(vi x) {
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4));
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i cnt = _mm512_add_epi8(_mm512_shuffle_epi8(lut, _mm512_and_si512(x, m4)),
                                        _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(x, 4), m4)));
    return _mm512_sad_epu8(cnt, _mm512_setzero_si512());
}

// 4-bit: the unsigned nibbles (x & 15) ^ 8 of the high and low halves of the weight bytes, one
// vpternlogd each.
static inline __attribute__((always_inline)) void s4_nibbles(vi wv, vi * hi, vi * lo) {
    const __m512i m15 = _mm512_set1_epi8(15), b8 = _mm512_set1_epi8(8);
    *hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(wv, 4), m15, b8, 0x6A); // (a & b) ^ c
    *lo = _mm512_ternarylogic_epi32(wv, m15, b8, 0x6A);
}
static inline __attribute__((always_inline)) vi maddubs(vi u, vi s) { return _mm512_maddubs_epi16(u, s); }
static inline __attribute__((always_inline)) vi madd(vi a, vi b) { return _mm512_madd_epi16(a, b); }

// 8-bit: the two 32-byte halves of 64 weight bytes, and 32 activation codes, sign-extended to int16.
static inline __attribute__((always_inline)) vi widen_lo(vi w) {
    return _mm512_cvtepi8_epi16(_mm512_castsi512_si256(w));
}
static inline __attribute__((always_inline)) vi widen_hi(vi w) {
    return _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(w, 1));
}
static inline __attribute__((always_inline)) vi widen_load(const void * p) {
    return _mm512_cvtepi8_epi16(_mm256_load_si256((const __m256i *)p));
}

#include "cpu/cpu-gemv-simd.h"

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

GEMV_INLINE void gemv_store(const int M, const int r, vi v[GEMV_R][CPU_GEMV_MR], const uint32_t * bias, int32_t * c,
                            size_t ldc) {
    for (int i = 0; i < M; i++) {
        int32_t * ci = c + (size_t)i * ldc;
        const uint32_t b = bias ? bias[i] : 0u;
        if (r == GEMV_R) {
            _mm_storeu_si128((__m128i *)ci,
                             _mm_sub_epi32(gemv_hsum4(v[0][i], v[1][i], v[2][i], v[3][i]), _mm_set1_epi32((int)b)));
        } else {
            ci[0] = (int32_t)((uint32_t)_mm512_reduce_add_epi32(v[0][i]) - b);
        }
    }
}
