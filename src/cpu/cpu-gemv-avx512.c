// SPDX-License-Identifier: Apache-2.0
// cpu-gemv-avx512.c: matrix-vector kernels with AVX-512 F/BW/VL (the Skylake-SP level: no
// VPOPCNTDQ, no VNNI). Contract in cpu-gemv.h.
//
// Binary: popc(a ^ w) by the nibble lookup (two vpshufb on the low and high nibbles of each byte),
// the byte counts summed into 64-bit lanes with vpsadbw, per 64 bytes of a weight row and
// activation row.
// 4-bit: the unsigned nibbles (x & 15) ^ 8 = x + 8 of the weights (vpternlogd) times the signed
// activation codes by vpmaddubsw: each pair sum is at most 2 * 15 * 8 = 240 in magnitude, so two per
// 64 bytes add at most 480 to an int16 lane and 64 such steps stay below 32767; the lanes are widened
// (vpmaddwd with ones) and summed every 64 steps (4096 bytes of a row). The bias 8 * asum is taken off.
// 8-bit: codes sign-extended to int16 (vpmovsxbw) and vpmaddwd: exact int32 pair sums.
#include "cpu/cpu-gemv-avx512.h"

GEMV_INLINE __m512i popc_sad(__m512i x) {
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4));
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i cnt = _mm512_add_epi8(_mm512_shuffle_epi8(lut, _mm512_and_si512(x, m4)),
                                        _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(x, 4), m4)));
    return _mm512_sad_epu8(cnt, _mm512_setzero_si512());
}

GEMV_INLINE void b1_step(const int M, const uint8_t * a, size_t lda, size_t kb, size_t t, __m512i wv, __m512i * acc) {
    (void)kb;
    for (int i = 0; i < M; i++) {
        const __m512i av = _mm512_load_si512((const void *)(a + (size_t)i * lda + t));
        acc[i] = _mm512_add_epi64(acc[i], popc_sad(_mm512_xor_si512(av, wv)));
    }
}

// The 64-bit lanes hold counts below 2^32: summed as int32 lanes (the high halves are 0).
static void b1(const uint8_t * a, size_t lda, int m, const uint8_t * w, size_t ldw, int64_t n, size_t kb, int32_t * c,
               size_t ldc) {
    CPU_GEMV_FOR_GROUPS(gemv_group, GEMV_R, m, n, a, lda, NULL, w, ldw, kb, c, ldc, b1_step);
}

#define S4_BLOCK 4096 // bytes of a weight row per int16 block (64 steps of 64)

GEMV_INLINE void s4_step(const int M, const int8_t * a, size_t lda, size_t kp, size_t t, __m512i wv, __m512i * acc) {
    const __m512i m15 = _mm512_set1_epi8(15), b8 = _mm512_set1_epi8(8);
    const __m512i hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(wv, 4), m15, b8, 0x6A); // (a & b) ^ c
    const __m512i lo = _mm512_ternarylogic_epi32(wv, m15, b8, 0x6A);
    for (int i = 0; i < M; i++) {
        const __m512i ae = _mm512_load_si512((const void *)(a + (size_t)i * lda + t));
        const __m512i ao = _mm512_load_si512((const void *)(a + (size_t)i * lda + kp + t));
        acc[i] = _mm512_add_epi16(acc[i], _mm512_add_epi16(_mm512_maddubs_epi16(hi, ae), _mm512_maddubs_epi16(lo, ao)));
    }
}

GEMV_INLINE void s4_group(const int M, const int r, int64_t j, const int8_t * a, size_t lda, const uint32_t * bias,
                          const uint8_t * w, size_t ldw, size_t kb, int32_t * c, size_t ldc) {
    const size_t kp = cpu_round_up(kb, CPU_GEMV_ALIGN);
    const __m512i ones = _mm512_set1_epi16(1);
    __m512i acc[GEMV_R][CPU_GEMV_MR];
    gemv_zero(acc);
    for (int q = 0; q < r; q++) {
        const uint8_t * wq = w + (size_t)(j + q) * ldw;
        for (size_t t0 = 0; t0 < kb; t0 += S4_BLOCK) {
            const size_t t1 = kb - t0 > S4_BLOCK ? t0 + S4_BLOCK : kb;
            __m512i a16[CPU_GEMV_MR];
            for (int i = 0; i < CPU_GEMV_MR; i++) a16[i] = _mm512_setzero_si512();
            size_t t = t0;
            for (; t + 64 <= t1; t += 64) s4_step(M, a, lda, kp, t, _mm512_loadu_si512((const void *)(wq + t)), a16);
            if (t < t1) // the masked weight bytes read as 0, nibbles 8, against zero activations
                s4_step(M, a, lda, kp, t, _mm512_maskz_loadu_epi8(gemv_bytes(t1 - t), (const void *)(wq + t)), a16);
            for (int i = 0; i < M; i++) acc[q][i] = _mm512_add_epi32(acc[q][i], _mm512_madd_epi16(a16[i], ones));
        }
    }
    gemv_store(M, r, acc, bias, false, c + j, ldc);
}

void bie_cpu_gemv_s4__avx512(const int8_t * a, size_t lda, const int32_t * asum, int m, const uint8_t * w, size_t ldw,
                             int64_t n, size_t kb, int32_t * c, size_t ldc) {
    uint32_t bias[CPU_GEMV_MR];
    gemv_bias(m, asum, 8, bias);
    CPU_GEMV_FOR_GROUPS(s4_group, GEMV_R, m, n, a, lda, bias, w, ldw, kb, c, ldc);
}

// The two 32-byte halves of 64 weight bytes, sign-extended to int16.
GEMV_INLINE void s8_step(const int M, const uint8_t * a, size_t lda, size_t kb, size_t t, __m512i wv, __m512i * acc) {
    (void)kb;
    const __m512i w0 = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(wv));
    const __m512i w1 = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(wv, 1));
    for (int i = 0; i < M; i++) {
        const uint8_t * ai = a + (size_t)i * lda + t;
        const __m512i a0 = _mm512_cvtepi8_epi16(_mm256_load_si256((const __m256i *)ai));
        const __m512i a1 = _mm512_cvtepi8_epi16(_mm256_load_si256((const __m256i *)(ai + 32)));
        acc[i] = _mm512_add_epi32(acc[i], _mm512_add_epi32(_mm512_madd_epi16(a0, w0), _mm512_madd_epi16(a1, w1)));
    }
}

void bie_cpu_gemv_s8__avx512(const int8_t * a, size_t lda, const int32_t * asum, int m, const int8_t * w, size_t ldw,
                             int64_t n, size_t k, int32_t * c, size_t ldc) {
    (void)asum;
    CPU_GEMV_FOR_GROUPS(gemv_group, GEMV_R, m, n, (const uint8_t *)a, lda, NULL, (const uint8_t *)w, ldw, k, c, ldc,
                        s8_step);
}

const struct cpu_gemv_kernels bie_cpu_gemv_avx512 = {
    .name = "avx512", .b1 = b1, .s4 = bie_cpu_gemv_s4__avx512, .s8 = bie_cpu_gemv_s8__avx512};
