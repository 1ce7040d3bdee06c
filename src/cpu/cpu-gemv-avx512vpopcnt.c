// SPDX-License-Identifier: Apache-2.0
// cpu-gemv-avx512vpopcnt.c: matrix-vector kernels with VPOPCNTDQ (Ice Lake, Zen 4 and later),
// and the n-bit ones with AVX512-VNNI (checked at run time; every VPOPCNTDQ CPU so far has it).
// Contract in cpu-gemv.h.
//
// Binary: per 64 bytes of a weight row, one load, then per activation row one load (L1) and xor +
// vpopcntd + add: 3 vector ops per 512 bit-products, so that a weight streamed from DRAM is read at
// the read bandwidth (from L3 the arithmetic and the stream take about as long at M = 1). The int32
// lanes of the rows' accumulators are summed once per group of GEMV_R rows (gemv_hsum4).
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

GEMV_INLINE void b1_step(const int M, const uint8_t * a, size_t lda, size_t kb, size_t t, __m512i wv, __m512i * acc) {
    (void)kb;
    for (int i = 0; i < M; i++) {
        const __m512i av = _mm512_load_si512((const void *)(a + (size_t)i * lda + t));
        acc[i] = _mm512_add_epi32(acc[i], _mm512_popcnt_epi32(_mm512_xor_si512(av, wv)));
    }
}

// One activation row of at most B1_AREG vectors, held in registers while the weight rows stream
// past it: per 64 bytes of weight one load, xor, vpopcntd and add (no load of the activation).
// The unrolled steps test u against the row's vector count (the same for every row: predicted).
#define B1_AREG 8

GEMV_INLINE void b1_m1_group(const int r, int64_t j, const __m512i * av, const uint8_t * w, size_t ldw, size_t kb,
                             int32_t * c) {
    const size_t nf = kb / 64;
    const __mmask64 tail = gemv_bytes(kb % 64);
    __m512i acc[GEMV_R][CPU_GEMV_MR];
    gemv_zero(acc);
    for (int q = 0; q < r; q++) {
        const uint8_t * wq = w + (size_t)(j + q) * ldw;
        __m512i s = _mm512_setzero_si512();
        for (size_t u = 0; u < B1_AREG; u++) {
            const void * p = wq + 64 * u;
            if (u < nf) s = _mm512_add_epi32(s, _mm512_popcnt_epi32(_mm512_xor_si512(av[u], _mm512_loadu_si512(p))));
            else if (u == nf && tail)
                s = _mm512_add_epi32(s, _mm512_popcnt_epi32(_mm512_xor_si512(av[u], _mm512_maskz_loadu_epi8(tail, p))));
        }
        acc[q][0] = s;
    }
    gemv_store(1, r, acc, NULL, c + j, 0);
}

static void b1(const uint8_t * a, size_t lda, int m, const uint8_t * w, size_t ldw, int64_t n, size_t kb, int32_t * c,
               size_t ldc) {
    if (m == 1 && kb <= B1_AREG * 64) {
        __m512i av[B1_AREG];
        for (size_t u = 0; u < B1_AREG; u++)
            av[u] = u * 64 < kb ? _mm512_load_si512((const void *)(a + 64 * u)) : _mm512_setzero_si512();
        int64_t j = 0;
        for (; j + GEMV_R <= n; j += GEMV_R) b1_m1_group(GEMV_R, j, av, w, ldw, kb, c);
        for (; j < n; j++) b1_m1_group(1, j, av, w, ldw, kb, c);
        return;
    }
    CPU_GEMV_FOR_GROUPS(gemv_group, GEMV_R, m, n, a, lda, NULL, w, ldw, kb, c, ldc, b1_step);
}

#define VNNI __attribute__((target("avx512vnni")))

VNNI GEMV_INLINE void s4_step(const int M, const uint8_t * a, size_t lda, size_t kb, size_t t, __m512i wv,
                              __m512i * acc) {
    const size_t kp = cpu_round_up(kb, CPU_GEMV_ALIGN);
    __m512i hi, lo; // past kb: zero bytes, nibbles 8, against zero codes
    s4_nibbles(wv, &hi, &lo);
    for (int i = 0; i < M; i++) {
        const __m512i ae = _mm512_load_si512((const void *)(a + (size_t)i * lda + t));
        const __m512i ao = _mm512_load_si512((const void *)(a + (size_t)i * lda + kp + t));
        acc[i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc[i], hi, ae), lo, ao);
    }
}

VNNI static void s4_vnni(const int8_t * a, size_t lda, const int32_t * asum, int m, const uint8_t * w, size_t ldw,
                         int64_t n, size_t kb, int32_t * c, size_t ldc) {
    uint32_t bias[CPU_GEMV_MR];
    gemv_bias(m, asum, 8, bias);
    CPU_GEMV_FOR_GROUPS(gemv_group, GEMV_R, m, n, (const uint8_t *)a, lda, bias, w, ldw, kb, c, ldc, s4_step);
}

VNNI GEMV_INLINE void s8_step(const int M, const uint8_t * a, size_t lda, size_t kb, size_t t, __m512i wv,
                              __m512i * acc) {
    (void)kb;
    const __m512i u = _mm512_xor_si512(wv, _mm512_set1_epi8((char)0x80)); // w + 128, unsigned
    for (int i = 0; i < M; i++)
        acc[i] = _mm512_dpbusd_epi32(acc[i], u, _mm512_load_si512((const void *)(a + (size_t)i * lda + t)));
}

VNNI static void s8_vnni(const int8_t * a, size_t lda, const int32_t * asum, int m, const int8_t * w, size_t ldw,
                         int64_t n, size_t k, int32_t * c, size_t ldc) {
    uint32_t bias[CPU_GEMV_MR];
    gemv_bias(m, asum, 128, bias);
    CPU_GEMV_FOR_GROUPS(gemv_group, GEMV_R, m, n, (const uint8_t *)a, lda, bias, (const uint8_t *)w, ldw, k, c, ldc,
                        s8_step);
}

const struct cpu_gemv_kernels bie_cpu_gemv_avx512vpopcnt = {
    .name = "avx512vpopcnt", .b1 = b1, .s4 = bie_cpu_gemv_s4__avx512, .s8 = bie_cpu_gemv_s8__avx512};
const struct cpu_gemv_kernels bie_cpu_gemv_avx512vpopcnt_vnni = {
    .name = "avx512vpopcnt+vnni", .b1 = b1, .s4 = s4_vnni, .s8 = s8_vnni};
