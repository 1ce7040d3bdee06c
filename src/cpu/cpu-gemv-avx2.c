// SPDX-License-Identifier: Apache-2.0
// cpu-gemv-avx2.c: matrix-vector kernels with AVX2 (contract in cpu-gemv.h). The same steps as the
// AVX-512 kernels (cpu-gemv-avx512.c) on 256-bit vectors: binary by the nibble lookup and vpsadbw,
// 4-bit by vpmaddubsw on the unsigned nibbles x + 8 (int16 lanes widened every 64 steps of 32
// bytes, the bias 8 * asum taken off), 8-bit by vpmovsxbw and vpmaddwd.
// With 16 vector registers a group is 4 weight rows against one activation row, or 2 against 2;
// the activation rows of a call are taken in such blocks, the weight rows of the block staying in
// L1 between them. There are no masked loads: the last partial vector of a weight row is copied
// into a zeroed buffer first.
#include "cpu/cpu-gemv.h"

#include <immintrin.h>

#define INL static inline __attribute__((always_inline))
#define RMAX 4

// Lane j of the result = the sum of the 8 int32 lanes of y_j.
INL __m128i hsum4(__m256i y0, __m256i y1, __m256i y2, __m256i y3) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(y0, y1), _mm256_hadd_epi32(y2, y3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// c[i*ldc + j] = (acc ? c : 0) + sum(v[i][j]) - bias[i] for i < M, j < r (wrapping).
INL void store(const int M, const int r, __m256i v[2][RMAX], const uint32_t * bias, bool acc, int32_t * c, size_t ldc) {
    for (int i = 0; i < M; i++) {
        const __m256i z = _mm256_setzero_si256();
        uint32_t s[4];
        _mm_storeu_si128((__m128i *)s, hsum4(v[i][0], r > 1 ? v[i][1] : z, r > 2 ? v[i][2] : z, r > 3 ? v[i][3] : z));
        for (int q = 0; q < r; q++) {
            int32_t * d = c + (size_t)i * ldc + q;
            *d = (int32_t)(s[q] - (bias ? bias[i] : 0u) + (acc ? (uint32_t)*d : 0u));
        }
    }
}

// The weight vectors at byte t of r rows: whole loads, or the last n (< 32) bytes through a buffer.
INL void load_w(const int r, const uint8_t * wj, size_t ldw, size_t t, size_t n, __m256i * wv) {
    for (int q = 0; q < r; q++) {
        if (n >= 32) {
            wv[q] = _mm256_loadu_si256((const __m256i *)(wj + (size_t)q * ldw + t));
        } else {
            uint8_t buf[32] = {0};
            memcpy(buf, wj + (size_t)q * ldw + t, n);
            wv[q] = _mm256_loadu_si256((const __m256i *)buf);
        }
    }
}

// Calls group(M, r, i0, j) over n weight rows for the m activation rows: blocks of 2 rows against
// pairs of weight rows, a last single row against groups of 4.
#define FOR_GROUPS(group, m, n, ...)                                                               \
    do {                                                                                           \
        int i0_ = 0;                                                                               \
        for (; i0_ + 2 <= (m); i0_ += 2) {                                                         \
            int64_t j_ = 0;                                                                        \
            for (; j_ + 2 <= (n); j_ += 2) group(2, 2, i0_, j_, __VA_ARGS__);                      \
            for (; j_ < (n); j_++) group(2, 1, i0_, j_, __VA_ARGS__);                              \
        }                                                                                          \
        if (i0_ < (m)) {                                                                           \
            int64_t j_ = 0;                                                                        \
            for (; j_ + 4 <= (n); j_ += 4) group(1, 4, i0_, j_, __VA_ARGS__);                      \
            for (; j_ < (n); j_++) group(1, 1, i0_, j_, __VA_ARGS__);                              \
        }                                                                                          \
    } while (0)

INL __m256i popc_sad(__m256i x) {
    const __m256i lut = _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4, 0, 1, 1, 2, 1, 2, 2, 3, 1, 2,
                                         2, 3, 2, 3, 3, 4);
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m256i cnt = _mm256_add_epi8(_mm256_shuffle_epi8(lut, _mm256_and_si256(x, m4)),
                                        _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(x, 4), m4)));
    return _mm256_sad_epu8(cnt, _mm256_setzero_si256());
}

// The 64-bit lanes hold counts below 2^32: summed as int32 lanes (the high halves are 0).
INL void b1_group(const int M, const int r, int i0, int64_t j, const uint8_t * a, size_t lda, const uint8_t * w,
                  size_t ldw, size_t kb, int32_t * c, size_t ldc) {
    const uint8_t * wj = w + (size_t)j * ldw;
    a += (size_t)i0 * lda;
    __m256i acc[2][RMAX], wv[RMAX];
    for (int i = 0; i < 2; i++)
        for (int q = 0; q < RMAX; q++) acc[i][q] = _mm256_setzero_si256();
    for (size_t t = 0; t < kb; t += 32) {
        load_w(r, wj, ldw, t, kb - t, wv);
        for (int i = 0; i < M; i++) {
            const __m256i av = _mm256_load_si256((const __m256i *)(a + (size_t)i * lda + t));
            for (int q = 0; q < r; q++) acc[i][q] = _mm256_add_epi64(acc[i][q], popc_sad(_mm256_xor_si256(av, wv[q])));
        }
    }
    store(M, r, acc, NULL, false, c + (size_t)i0 * ldc + (size_t)j, ldc);
}

static void b1(const uint8_t * a, size_t lda, int m, const uint8_t * w, size_t ldw, int64_t n, size_t kb,
               int32_t * c, size_t ldc) {
    FOR_GROUPS(b1_group, m, n, a, lda, w, ldw, kb, c, ldc);
}

#define S4_BLOCK 2048 // bytes of a weight row per int16 block (64 steps of 32)

INL void s4_group(const int M, const int r, int i0, int64_t j, const int8_t * a, size_t lda, const uint32_t * bias,
                  const uint8_t * w, size_t ldw, size_t kb, int32_t * c, size_t ldc) {
    const uint8_t * wj = w + (size_t)j * ldw;
    a += (size_t)i0 * lda;
    const size_t kp = cpu_round_up(kb, CPU_GEMV_ALIGN);
    const __m256i m15 = _mm256_set1_epi8(15), b8 = _mm256_set1_epi8(8), ones = _mm256_set1_epi16(1);
    __m256i acc[2][RMAX], wv[RMAX];
    for (size_t t0 = 0; t0 == 0 || t0 < kb; t0 += S4_BLOCK) { // once at least: kb may be 0
        const size_t t1 = kb - t0 > S4_BLOCK ? t0 + S4_BLOCK : kb;
        for (int i = 0; i < 2; i++)
            for (int q = 0; q < RMAX; q++) acc[i][q] = _mm256_setzero_si256();
        for (size_t t = t0; t < t1; t += 32) {
            load_w(r, wj, ldw, t, t1 - t, wv); // past the row: zero bytes, nibbles 8, against zero codes
            __m256i hi[RMAX], lo[RMAX];
            for (int q = 0; q < r; q++) {
                hi[q] = _mm256_xor_si256(_mm256_and_si256(_mm256_srli_epi16(wv[q], 4), m15), b8);
                lo[q] = _mm256_xor_si256(_mm256_and_si256(wv[q], m15), b8);
            }
            for (int i = 0; i < M; i++) {
                const __m256i ae = _mm256_load_si256((const __m256i *)(a + (size_t)i * lda + t));
                const __m256i ao = _mm256_load_si256((const __m256i *)(a + (size_t)i * lda + kp + t));
                for (int q = 0; q < r; q++)
                    acc[i][q] = _mm256_add_epi16(acc[i][q], _mm256_add_epi16(_mm256_maddubs_epi16(hi[q], ae),
                                                                             _mm256_maddubs_epi16(lo[q], ao)));
            }
        }
        for (int i = 0; i < M; i++)
            for (int q = 0; q < r; q++) acc[i][q] = _mm256_madd_epi16(acc[i][q], ones);
        store(M, r, acc, t0 == 0 ? bias + i0 : NULL, t0 > 0, c + (size_t)i0 * ldc + (size_t)j, ldc);
    }
}

static void s4(const int8_t * a, size_t lda, const int32_t * asum, int m, const uint8_t * w, size_t ldw, int64_t n,
               size_t kb, int32_t * c, size_t ldc) {
    uint32_t bias[CPU_GEMV_MR];
    for (int i = 0; i < m; i++) bias[i] = 8u * (uint32_t)asum[i];
    FOR_GROUPS(s4_group, m, n, a, lda, bias, w, ldw, kb, c, ldc);
}

INL void s8_group(const int M, const int r, int i0, int64_t j, const int8_t * a, size_t lda, const int8_t * w,
                  size_t ldw, size_t k, int32_t * c, size_t ldc) {
    const int8_t * wj = w + (size_t)j * ldw;
    a += (size_t)i0 * lda;
    __m256i acc[2][RMAX], wv[RMAX];
    for (int i = 0; i < 2; i++)
        for (int q = 0; q < RMAX; q++) acc[i][q] = _mm256_setzero_si256();
    for (size_t t = 0; t < k; t += 32) {
        load_w(r, (const uint8_t *)wj, ldw, t, k - t, wv);
        for (int h = 0; h < 2; h++) { // the two 16-byte halves, sign-extended to int16
            for (int i = 0; i < M; i++) {
                const __m256i a16 = _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i *)(a + (size_t)i * lda + t + 16 * h)));
                for (int q = 0; q < r; q++) {
                    const __m256i w16 = _mm256_cvtepi8_epi16(h ? _mm256_extracti128_si256(wv[q], 1) : _mm256_castsi256_si128(wv[q]));
                    acc[i][q] = _mm256_add_epi32(acc[i][q], _mm256_madd_epi16(a16, w16));
                }
            }
        }
    }
    store(M, r, acc, NULL, false, c + (size_t)i0 * ldc + (size_t)j, ldc);
}

static void s8(const int8_t * a, size_t lda, const int32_t * asum, int m, const int8_t * w, size_t ldw, int64_t n,
               size_t k, int32_t * c, size_t ldc) {
    (void)asum;
    FOR_GROUPS(s8_group, m, n, a, lda, w, ldw, k, c, ldc);
}

const struct cpu_gemv_kernels bie_cpu_gemv_avx2 = {.name = "avx2", .b1 = b1, .s4 = s4, .s8 = s8};
