// SPDX-License-Identifier: Apache-2.0
// cpu-gemv-avx512vpopcnt.c: matrix-vector kernels with VPOPCNTDQ (Ice Lake, Zen 4 and later),
// and the n-bit ones with AVX512-VNNI (checked at run time; every VPOPCNTDQ CPU so far has it).
// Contract in cpu-gemv.h.
//
// Binary: per 64 bytes of a group of GEMV_R weight rows, one load of each row, then per activation
// row one load (L1) and per weight row xor + vpopcntd + add: 3 vector ops per 512 bit-products,
// so a core outruns its share of memory bandwidth and the loop runs at the speed of the weight
// stream. The int32 lanes of a row's accumulator are summed once per row group (gemv_hsum4).
// 4-bit: the signed nibbles h, l of a weight byte become the unsigned h ^ 8 = h + 8 and l + 8 (one
// vpternlogd each: (x & 15) ^ 8), and vpdpbusd multiplies them by the signed activation codes
// (even codes against the high nibbles, odd codes against the low ones): sum (h + 8) * a = sum h * a
// + 8 * asum. 8-bit: w ^ 0x80 = w + 128 unsigned, then vpdpbusd the same way with 128 * asum.
#include "cpu/cpu-gemv-avx512.h"

// The avx512 table's n-bit kernels (cpu-gemv-avx512.c), for CPUs without VNNI.
void bie_cpu_gemv_s4__avx512(const int8_t * a, size_t lda, const int32_t * asum, int m, const uint8_t * w, size_t ldw,
                             int64_t n, size_t kb, int32_t * c, size_t ldc);
void bie_cpu_gemv_s8__avx512(const int8_t * a, size_t lda, const int32_t * asum, int m, const int8_t * w, size_t ldw,
                             int64_t n, size_t k, int32_t * c, size_t ldc);

GEMV_INLINE void b1_step(const int M, const int r, const uint8_t * a, size_t lda, size_t t, const __m512i * wv,
                         __m512i acc[CPU_GEMV_MR][GEMV_R]) {
    for (int i = 0; i < M; i++) {
        const __m512i av = _mm512_load_si512((const void *)(a + (size_t)i * lda + t));
        for (int q = 0; q < r; q++)
            acc[i][q] = _mm512_add_epi32(acc[i][q], _mm512_popcnt_epi32(_mm512_xor_si512(av, wv[q])));
    }
}

GEMV_INLINE void b1_group(const int M, const int r, int64_t j, const uint8_t * a, size_t lda, const uint8_t * w,
                          size_t ldw, size_t kb, int32_t * c, size_t ldc) {
    const uint8_t * wj = w + (size_t)j * ldw;
    __m512i acc[CPU_GEMV_MR][GEMV_R], wv[GEMV_R];
    for (int i = 0; i < CPU_GEMV_MR; i++)
        for (int q = 0; q < GEMV_R; q++) acc[i][q] = _mm512_setzero_si512();
    size_t t = 0;
    for (; t + 64 <= kb; t += 64) {
        for (int q = 0; q < r; q++) wv[q] = _mm512_loadu_si512((const void *)(wj + (size_t)q * ldw + t));
        b1_step(M, r, a, lda, t, wv, acc);
    }
    if (t < kb) {
        const __mmask64 k = gemv_bytes(kb - t);
        for (int q = 0; q < r; q++) wv[q] = _mm512_maskz_loadu_epi8(k, (const void *)(wj + (size_t)q * ldw + t));
        b1_step(M, r, a, lda, t, wv, acc);
    }
    gemv_store(M, r, acc, NULL, false, c + j, ldc);
}

static void b1(const uint8_t * a, size_t lda, int m, const uint8_t * w, size_t ldw, int64_t n, size_t kb,
               int32_t * c, size_t ldc) {
    GEMV_FOR_GROUPS(b1_group, m, n, a, lda, w, ldw, kb, c, ldc);
}

#define VNNI __attribute__((target("avx512vnni")))

// 4-bit: the unsigned nibbles (x & 15) ^ 8 of the high and low halves of 64 weight bytes.
GEMV_INLINE void s4_nibbles(__m512i wv, __m512i * hi, __m512i * lo) {
    const __m512i m15 = _mm512_set1_epi8(15), b8 = _mm512_set1_epi8(8);
    *hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(wv, 4), m15, b8, 0x6A); // (a & b) ^ c
    *lo = _mm512_ternarylogic_epi32(wv, m15, b8, 0x6A);
}

VNNI GEMV_INLINE void s4_step(const int M, const int r, const int8_t * a, size_t lda, size_t kp, size_t t,
                              const __m512i * wv, __m512i acc[CPU_GEMV_MR][GEMV_R]) {
    __m512i hi[GEMV_R], lo[GEMV_R];
    for (int q = 0; q < r; q++) s4_nibbles(wv[q], &hi[q], &lo[q]);
    for (int i = 0; i < M; i++) {
        const __m512i ae = _mm512_load_si512((const void *)(a + (size_t)i * lda + t));
        const __m512i ao = _mm512_load_si512((const void *)(a + (size_t)i * lda + kp + t));
        for (int q = 0; q < r; q++) acc[i][q] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc[i][q], hi[q], ae), lo[q], ao);
    }
}

VNNI GEMV_INLINE void s4_group(const int M, const int r, int64_t j, const int8_t * a, size_t lda, const uint32_t * bias,
                               const uint8_t * w, size_t ldw, size_t kb, int32_t * c, size_t ldc) {
    const uint8_t * wj = w + (size_t)j * ldw;
    const size_t kp = cpu_round_up(kb, CPU_GEMV_ALIGN);
    __m512i acc[CPU_GEMV_MR][GEMV_R], wv[GEMV_R];
    for (int i = 0; i < CPU_GEMV_MR; i++)
        for (int q = 0; q < GEMV_R; q++) acc[i][q] = _mm512_setzero_si512();
    size_t t = 0;
    for (; t + 64 <= kb; t += 64) {
        for (int q = 0; q < r; q++) wv[q] = _mm512_loadu_si512((const void *)(wj + (size_t)q * ldw + t));
        s4_step(M, r, a, lda, kp, t, wv, acc);
    }
    if (t < kb) { // the masked weight bytes read as 0, nibbles 8, against zero activations
        const __mmask64 k = gemv_bytes(kb - t);
        for (int q = 0; q < r; q++) wv[q] = _mm512_maskz_loadu_epi8(k, (const void *)(wj + (size_t)q * ldw + t));
        s4_step(M, r, a, lda, kp, t, wv, acc);
    }
    gemv_store(M, r, acc, bias, false, c + j, ldc);
}

VNNI static void s4_vnni(const int8_t * a, size_t lda, const int32_t * asum, int m, const uint8_t * w, size_t ldw,
                         int64_t n, size_t kb, int32_t * c, size_t ldc) {
    uint32_t bias[CPU_GEMV_MR];
    gemv_bias(m, asum, 8, bias);
    GEMV_FOR_GROUPS(s4_group, m, n, a, lda, bias, w, ldw, kb, c, ldc);
}

VNNI GEMV_INLINE void s8_step(const int M, const int r, const int8_t * a, size_t lda, size_t t, const __m512i * wv,
                              __m512i acc[CPU_GEMV_MR][GEMV_R]) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512i u[GEMV_R];
    for (int q = 0; q < r; q++) u[q] = _mm512_xor_si512(wv[q], flip);
    for (int i = 0; i < M; i++) {
        const __m512i av = _mm512_load_si512((const void *)(a + (size_t)i * lda + t));
        for (int q = 0; q < r; q++) acc[i][q] = _mm512_dpbusd_epi32(acc[i][q], u[q], av);
    }
}

VNNI GEMV_INLINE void s8_group(const int M, const int r, int64_t j, const int8_t * a, size_t lda, const uint32_t * bias,
                               const int8_t * w, size_t ldw, size_t k, int32_t * c, size_t ldc) {
    const int8_t * wj = w + (size_t)j * ldw;
    __m512i acc[CPU_GEMV_MR][GEMV_R], wv[GEMV_R];
    for (int i = 0; i < CPU_GEMV_MR; i++)
        for (int q = 0; q < GEMV_R; q++) acc[i][q] = _mm512_setzero_si512();
    size_t t = 0;
    for (; t + 64 <= k; t += 64) {
        for (int q = 0; q < r; q++) wv[q] = _mm512_loadu_si512((const void *)(wj + (size_t)q * ldw + t));
        s8_step(M, r, a, lda, t, wv, acc);
    }
    if (t < k) {
        const __mmask64 km = gemv_bytes(k - t);
        for (int q = 0; q < r; q++) wv[q] = _mm512_maskz_loadu_epi8(km, (const void *)(wj + (size_t)q * ldw + t));
        s8_step(M, r, a, lda, t, wv, acc);
    }
    gemv_store(M, r, acc, bias, false, c + j, ldc);
}

VNNI static void s8_vnni(const int8_t * a, size_t lda, const int32_t * asum, int m, const int8_t * w, size_t ldw,
                         int64_t n, size_t k, int32_t * c, size_t ldc) {
    uint32_t bias[CPU_GEMV_MR];
    gemv_bias(m, asum, 128, bias);
    GEMV_FOR_GROUPS(s8_group, m, n, a, lda, bias, w, ldw, k, c, ldc);
}

const struct cpu_gemv_kernels bie_cpu_gemv_avx512vpopcnt = {
    .name = "avx512vpopcnt", .b1 = b1, .s4 = bie_cpu_gemv_s4__avx512, .s8 = bie_cpu_gemv_s8__avx512};
const struct cpu_gemv_kernels bie_cpu_gemv_avx512vpopcnt_vnni = {
    .name = "avx512vpopcnt+vnni", .b1 = b1, .s4 = s4_vnni, .s8 = s8_vnni};
