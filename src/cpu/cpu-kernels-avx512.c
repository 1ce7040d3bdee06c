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
//
// Long rows (>= 256 bytes) use a Harley-Seal tile instead (Mula, Kurz & Lemire 2018): the XOR
// words of 8 steps go through a tree of carry-save adders (vpternlogq: sum = a^b^c, carry =
// majority) into per-bit counters of weight 1, 2 and 4 (ones, twos, fours) and one vector of weight
// 8 whose popcount (the nibble lookup) is the only one per 8 words: 29 vector ops per 8 words of
// 512 bit-products instead of 48, on unsplit panels.
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
                acc[i][0] =
                    _mm512_add_epi8(acc[i][0], _mm512_add_epi8(_mm512_shuffle_epi8(lut, _mm512_xor_si512(al, bl0)),
                                                               _mm512_shuffle_epi8(lut, _mm512_xor_si512(ah, bh0))));
                acc[i][1] =
                    _mm512_add_epi8(acc[i][1], _mm512_add_epi8(_mm512_shuffle_epi8(lut, _mm512_xor_si512(al, bl1)),
                                                               _mm512_shuffle_epi8(lut, _mm512_xor_si512(ah, bh1))));
            }
        }
        for (int i = 0; i < CPU_MR; i++)
            for (int j = 0; j < 2; j++) tot[i][j] = _mm512_add_epi64(tot[i][j], _mm512_sad_epu8(acc[i][j], zero));
    }
    for (int i = 0; i < CPU_MR; i++)
        for (int j = 0; j < 2; j++)
            _mm256_storeu_si256((__m256i *)(c + i * ldc + j * 8), _mm512_cvtepi64_epi32(tot[i][j]));
}

// Bytes of popcounts of v (each <= 8) by the nibble lookup.
static inline __m512i popc_bytes(__m512i v, __m512i lut) {
    const __m512i m4 = _mm512_set1_epi8(15);
    return _mm512_add_epi8(_mm512_shuffle_epi8(lut, _mm512_and_si512(v, m4)),
                           _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4)));
}

// Carry-save adder: *hi = carry (majority), *lo = sum (parity) of a, b, c, bit by bit.
static inline void csa(__m512i * hi, __m512i * lo, __m512i a, __m512i b, __m512i c) {
    *hi = _mm512_ternarylogic_epi64(a, b, c, 0xE8);
    *lo = _mm512_ternarylogic_epi64(a, b, c, 0x96);
}

// 4x8 Harley-Seal tile on unsplit panels (a group of 8 columns: one vector per word). Per row, the
// count so far is 8*E + 4*popc(fours) + 2*popc(twos) + popc(ones) + (tail words), lane by lane,
// with E the byte sums of popc(eights) (<= 8 per block, folded into 64-bit lanes every 31 blocks).
static void bin_tile_4x8_hs(const uint8_t * a, size_t lda, const uint8_t * b, size_t kb, int32_t * c, size_t ldc) {
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4));
    const __m512i zero = _mm512_setzero_si512();
    const size_t kw = kb / 8;
    __m512i ones[CPU_MR], twos[CPU_MR], fours[CPU_MR], e8[CPU_MR], tot[CPU_MR];
    for (int i = 0; i < CPU_MR; i++) ones[i] = twos[i] = fours[i] = e8[i] = tot[i] = zero;
    size_t w = 0;
    for (int blocks = 0; w + 8 <= kw; w += 8) {
        __m512i bv[8];
        for (int t = 0; t < 8; t++) bv[t] = _mm512_load_si512((const void *)(b + (w + t) * 64));
        for (int i = 0; i < CPU_MR; i++) {
            __m512i x[8];
            for (int t = 0; t < 8; t++) {
                int64_t v;
                memcpy(&v, a + i * lda + (w + t) * 8, 8);
                x[t] = _mm512_xor_si512(_mm512_set1_epi64(v), bv[t]);
            }
            __m512i c0, c1, c2, c3, f0, f1, e;
            csa(&c0, &ones[i], ones[i], x[0], x[1]);
            csa(&c1, &ones[i], ones[i], x[2], x[3]);
            csa(&f0, &twos[i], twos[i], c0, c1);
            csa(&c2, &ones[i], ones[i], x[4], x[5]);
            csa(&c3, &ones[i], ones[i], x[6], x[7]);
            csa(&f1, &twos[i], twos[i], c2, c3);
            csa(&e, &fours[i], fours[i], f0, f1);
            e8[i] = _mm512_add_epi8(e8[i], popc_bytes(e, lut));
        }
        if (++blocks == 31) {
            blocks = 0;
            for (int i = 0; i < CPU_MR; i++) {
                tot[i] = _mm512_add_epi64(tot[i], _mm512_slli_epi64(_mm512_sad_epu8(e8[i], zero), 3));
                e8[i] = zero;
            }
        }
    }
    for (int i = 0; i < CPU_MR; i++) {
        // bytes: popc(ones) + 2*popc(twos) + 4*popc(fours) <= 56, plus <= 7 tail words <= 56
        const __m512i p2 = popc_bytes(twos[i], lut);
        __m512i s =
            _mm512_add_epi8(popc_bytes(ones[i], lut),
                            _mm512_add_epi8(_mm512_add_epi8(p2, p2), _mm512_slli_epi16(popc_bytes(fours[i], lut), 2)));
        for (size_t t = w; t < kw; t++) {
            int64_t v;
            memcpy(&v, a + i * lda + t * 8, 8);
            s = _mm512_add_epi8(
                s,
                popc_bytes(_mm512_xor_si512(_mm512_set1_epi64(v), _mm512_load_si512((const void *)(b + t * 64))), lut));
        }
        tot[i] = _mm512_add_epi64(
            tot[i], _mm512_add_epi64(_mm512_slli_epi64(_mm512_sad_epu8(e8[i], zero), 3), _mm512_sad_epu8(s, zero)));
        _mm256_storeu_si256((__m256i *)(c + i * ldc), _mm512_cvtepi64_epi32(tot[i]));
    }
}

// 4x4 tile of int16 dot products with vpmaddwd (exact int32 pair sums).
void bie_cpu_i16_tile_4x4__avx512(const int16_t * a, size_t lda, const int16_t * b, size_t ldb, size_t k, int32_t * c,
                                  size_t ldc) {
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

// Adds (accumulate) or stores the tile's int32 lanes to c.
static inline void outer_store(const __m512i acc[CPU_OUTER_MR][CPU_OUTER_NR / 16], bool accumulate, int32_t * c,
                               size_t ldc) {
    for (int i = 0; i < CPU_OUTER_MR; i++)
        for (int j = 0; j < CPU_OUTER_NR / 16; j++) {
            int32_t * d = c + i * ldc + 16 * j;
            const __m512i v = accumulate ? _mm512_add_epi32(acc[i][j], _mm512_loadu_si512((const void *)d)) : acc[i][j];
            _mm512_storeu_si512((void *)d, v);
        }
}

// CPU_OUTER_MR x CPU_OUTER_NR outer-product tile on pair-interleaved panels (cpu-impl.h): per pair
// of k, the two codes of row i broadcast as one 32-bit value against the pairs of 16 columns per
// vector; vpmaddwd gives a0*b0 + a1*b1 per lane (exact) and vpaddd adds it to the tile's int32
// lanes, 16 accumulators, no horizontal sums.
// Per pair of k: 2 vector loads, 8 broadcast loads, 16 vpmaddwd and 16 vpaddd, i.e. 32 products
// per 2 ops on the two 512-bit ports, which is also the bound of any exact 8-bit product there
// without VNNI (an FMA does 16 products per op). The loop is written in assembly: from the same
// code in intrinsics GCC 12 keeps the 8 broadcasts and 16 products of a pair live at once, runs out
// of the 32 zmm registers and adds 16 register moves and a spill per pair.
#define I16_ROW(i, acc0, acc1)                                                                                         \
    "vpbroadcastd " #i "*4(%[a]), %%zmm2\n\t"                                                                          \
    "vpmaddwd %%zmm0, %%zmm2, %%zmm3\n\t"                                                                              \
    "vpmaddwd %%zmm1, %%zmm2, %%zmm4\n\t"                                                                              \
    "vpaddd %%zmm3, %%zmm" #acc0 ", %%zmm" #acc0 "\n\t"                                                                \
    "vpaddd %%zmm4, %%zmm" #acc1 ", %%zmm" #acc1 "\n\t"
#define I16_ZERO(r) "vpxord %%zmm" #r ", %%zmm" #r ", %%zmm" #r "\n\t"
#define I16_SAVE(r) "vmovdqu64 %%zmm" #r ", (" #r " - 16) * 64(%[o])\n\t"
#define I16_EACH(f) f(16) f(17) f(18) f(19) f(20) f(21) f(22) f(23) f(24) f(25) f(26) f(27) f(28) f(29) f(30) f(31)

void bie_cpu_i16_outer_tile__avx512(const void * va, const void * vb, size_t kp, bool accumulate, int32_t * c,
                                    size_t ldc) {
    _Static_assert(CPU_OUTER_MR == 8 && CPU_OUTER_NR == 32, "the loop below is written for an 8x32 tile");
    const uint8_t * a = va;
    const uint8_t * b = vb;
    const uint8_t * bend = b + kp * CPU_OUTER_NR * 4; // kp > 0
    __m512i acc[CPU_OUTER_MR][CPU_OUTER_NR / 16];     // row i, vector j in zmm(16 + 2i + j)
    __asm__ volatile(I16_EACH(I16_ZERO) "1:\n\t"
                                        "vmovdqa64 (%[b]), %%zmm0\n\t"
                                        "vmovdqa64 64(%[b]), %%zmm1\n\t" I16_ROW(0, 16, 17) I16_ROW(1, 18, 19)
                                            I16_ROW(2, 20, 21) I16_ROW(3, 22, 23) I16_ROW(4, 24, 25) I16_ROW(5, 26, 27)
                                                I16_ROW(6, 28, 29) I16_ROW(7, 30, 31) "add $32, %[a]\n\t"
                                                                                      "sub $-128, %[b]\n\t"
                                                                                      "cmp %[b], %[bend]\n\t"
                                                                                      "jne 1b\n\t" I16_EACH(I16_SAVE)
                     : [a] "+r"(a), [b] "+r"(b)
                     : [bend] "r"(bend), [o] "r"(acc)
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21",
                       "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31",
                       "memory", "cc");
    outer_store(acc, accumulate, c, ldc);
}

// The same outer-product tile for the 4-bit GEMM on quad-interleaved byte panels (cpu-impl.h): per
// quad of k, the 4 codes of row i (unsigned, [0, 15]) broadcast as one 32-bit value against the
// quads of 16 columns (signed, [-8, 7]) per vector; vpmaddubsw gives the two pair sums per lane
// (each <= 240 in magnitude, so not saturated) and vpaddw adds them to int16 counters. 128 quads
// add at most 128 * 240 = 30720 < 32767 per counter, so the counters are widened (vpmaddwd with
// ones: exact) and added to the int32 tile every 128 quads.
void bie_cpu_u4s4_outer_tile__avx512(const void * va, const void * vb, size_t kq, bool accumulate, int32_t * c,
                                     size_t ldc) {
    enum { MR = CPU_OUTER_MR, NV = CPU_OUTER_NR / 16, QMAX = 128 };
    const uint8_t * a = va;
    const uint8_t * b = vb;
    const __m512i ones = _mm512_set1_epi16(1);
    for (size_t q = 0; q < kq;) {
        const size_t qend = kq - q > QMAX ? q + QMAX : kq;
        __m512i acc[MR][NV];
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NV; j++) acc[i][j] = _mm512_setzero_si512();
        for (; q < qend; q++) {
            __m512i bv[NV];
            for (int j = 0; j < NV; j++) bv[j] = _mm512_load_si512((const void *)(b + (q * NV + j) * 64));
            for (int i = 0; i < MR; i++) {
                int32_t quad;
                memcpy(&quad, a + (q * MR + i) * 4, sizeof quad);
                const __m512i av = _mm512_set1_epi32(quad);
                for (int j = 0; j < NV; j++) acc[i][j] = _mm512_add_epi16(acc[i][j], _mm512_maddubs_epi16(av, bv[j]));
            }
        }
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NV; j++) acc[i][j] = _mm512_madd_epi16(acc[i][j], ones);
        outer_store(acc, accumulate, c, ldc);
        accumulate = true;
    }
}

// 4x4 tile of the 4-bit GEMM: vpmaddubsw (unsigned a in [0, 15] times signed w in [-8, 7], pair
// sums <= 240 in magnitude) into int16 counters, widened with vpmaddwd every 128 steps.
void bie_cpu_u4s4_tile_4x4__avx512(const uint8_t * a, size_t lda, const int8_t * b, size_t ldb, size_t k, int32_t * c,
                                   size_t ldc) {
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

void bie_cpu_quantize__avx512(const float * x, const float * bias, float b0, int64_t n, float scale, int lo, int hi,
                              int16_t * out) {
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

double bie_cpu_mask_binary__avx512(const float * x, const float * bias, float b0, float scale, float * gx, int64_t n) {
    const __m512 bv0 = _mm512_set1_ps(b0), sv = _mm512_set1_ps(scale), one = _mm512_set1_ps(1.0f);
    const __m512 fz = _mm512_setzero_ps();
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 live = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v =
            _mm512_add_ps(_mm512_maskz_loadu_ps(live, x + i), bias ? _mm512_maskz_loadu_ps(live, bias + i) : bv0);
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

// Float-by-sign GEMM (cpu-signgemm.c). The sign bits of 4 consecutive rows j of S at column k
// form a nibble e, and sum_b f[4q+b] * S[4q+b][k] is entry e of a 16-float table made once per
// (row of F, chunk q): vpermps looks up 16 columns at once, so one permute and one add do the work
// of 4 FMAs. idx[k] holds the nibbles of 8 chunks (32 rows j); shifting it by 4 exposes the next
// one (vpermps reads only the low 4 bits of each lane).
void bie_cpu_sign_idx__avx512(const float * src, const float * bias, int64_t n, int t, uint32_t * dst) {
    const __m512i bit = _mm512_set1_epi32((int)(1u << t));
    const __m512 fz = _mm512_setzero_ps();
    for (int64_t k = 0; k < n; k += 16) {
        const __mmask16 live = n - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - k)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(live, src + k);
        if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(live, bias + k));
        const __mmask16 ge = _mm512_mask_cmp_ps_mask(live, v, fz, _CMP_GE_OQ);
        const __m512i d = _mm512_maskz_loadu_epi32(live, dst + k);
        _mm512_mask_storeu_epi32(dst + k, live, _mm512_mask_or_epi32(d, ge, d, bit));
    }
}

void bie_cpu_sign_tables__avx512(const float * f, ptrdiff_t rs, ptrdiff_t cs, int mr, int64_t jn, int64_t nq,
                                 float alpha, float * tab) {
    const __m512i e = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i one = _mm512_set1_epi32(1);
    __m512i flip[4]; // the sign bit in lanes e whose bit b is 0
    for (int b = 0; b < 4; b++)
        flip[b] = _mm512_slli_epi32(_mm512_andnot_si512(_mm512_srli_epi32(e, (unsigned)b), one), 31);
    const __m512 av = _mm512_set1_ps(alpha);
    for (int i = 0; i < CPU_MR; i++)
        for (int64_t q = 0; q < nq; q++) {
            float v[4];
            for (int b = 0; b < 4; b++) {
                const int64_t j = 4 * q + b;
                v[b] = i < mr && j < jn ? f[i * rs + j * cs] : 0.0f;
            }
            __m512 t = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_set1_ps(v[0])), flip[0]));
            for (int b = 1; b < 4; b++)
                t = _mm512_add_ps(
                    t, _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_set1_ps(v[b])), flip[b])));
            _mm512_store_ps(tab + (i * nq + q) * 16, _mm512_mul_ps(t, av));
        }
}

// CPU_MR rows by 4 vectors of 16 columns: 16 accumulators, 4 index vectors, one table register.
void bie_cpu_fsign_tile__avx512(const float * tab, int64_t nq, const uint32_t * idx, size_t ids, int mr, int64_t nk,
                                bool acc, float * c, size_t ldc) {
    __mmask16 km[4];
    for (int v = 0; v < 4; v++) {
        const int64_t rem = nk - 16 * v;
        km[v] = rem >= 16 ? (__mmask16)0xffff : rem <= 0 ? (__mmask16)0 : (__mmask16)((1u << rem) - 1);
    }
    __m512 s[CPU_MR][4];
    for (int i = 0; i < CPU_MR; i++)
        for (int v = 0; v < 4; v++)
            s[i][v] = acc && i < mr ? _mm512_maskz_loadu_ps(km[v], c + i * ldc + 16 * v) : _mm512_setzero_ps();
    for (int64_t qb = 0; qb < nq / 8; qb++) {
        __m512i ix[4];
        for (int v = 0; v < 4; v++) ix[v] = _mm512_loadu_si512((const void *)(idx + (size_t)qb * ids + 16 * v));
        const float * t = tab + qb * 8 * 16;
        for (int q = 0; q < 8; q++) {
            for (int i = 0; i < CPU_MR; i++) {
                const __m512 tv = _mm512_load_ps(t + (i * nq + q) * 16);
                for (int v = 0; v < 4; v++) s[i][v] = _mm512_add_ps(s[i][v], _mm512_permutexvar_ps(ix[v], tv));
            }
            for (int v = 0; v < 4; v++) ix[v] = _mm512_srli_epi32(ix[v], 4);
        }
    }
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < 4; v++) _mm512_mask_storeu_ps(c + i * ldc + 16 * v, km[v], s[i][v]);
}

// After the transpose below, column o of the block is in register (o & 12) | (o & 1) << 1 | (o >> 1 & 1):
// the 64-bit interleave leaves the middle two of every 4 columns swapped.
static inline int perm16(int o) { return (o & 12) | (o & 1) << 1 | (o >> 1 & 1); }

// Transposes 16 rows of 16 lanes in registers (32-bit, 64-bit and 128-bit interleaves): lane o of
// v[r] ends in lane r of v[perm16(o)].
static inline void transpose16(__m512 v[16]) {
    __m512 t[16];
    for (int r = 0; r < 16; r += 2) {
        t[r] = _mm512_unpacklo_ps(v[r], v[r + 1]);
        t[r + 1] = _mm512_unpackhi_ps(v[r], v[r + 1]);
    }
    for (int r = 0; r < 16; r += 4)
        for (int q = 0; q < 2; q++) {
            v[r + q] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[r + q]), _mm512_castps_pd(t[r + 2 + q])));
            v[r + 2 + q] =
                _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[r + q]), _mm512_castps_pd(t[r + 2 + q])));
        }
    for (int r = 0; r < 16; r += 8)
        for (int q = 0; q < 4; q++) {
            t[r + q] = _mm512_shuffle_f32x4(v[r + q], v[r + 4 + q], 0x88);
            t[r + 4 + q] = _mm512_shuffle_f32x4(v[r + q], v[r + 4 + q], 0xdd);
        }
    for (int q = 0; q < 8; q++) {
        v[q] = _mm512_shuffle_f32x4(t[q], t[q + 8], 0x88);
        v[q + 8] = _mm512_shuffle_f32x4(t[q], t[q + 8], 0xdd);
    }
}

// The weight panel (CPU_OUTER_NR rows, cpu-impl.h) by 16x16 transposes of 32-bit pairs.
void bie_cpu_interleave_nr__avx512(const int16_t * rows, size_t kp, int16_t * panel) {
    const size_t np = kp / 2;
    size_t p = 0;
    for (; p + 16 <= np; p += 16)
        for (int r0 = 0; r0 < CPU_OUTER_NR; r0 += 16) {
            __m512 v[16];
            for (int r = 0; r < 16; r++) v[r] = _mm512_loadu_ps((const void *)(rows + (size_t)(r0 + r) * kp + 2 * p));
            transpose16(v);
            for (int o = 0; o < 16; o++)
                _mm512_storeu_ps((void *)(panel + ((p + (size_t)o) * CPU_OUTER_NR + (size_t)r0) * 2), v[perm16(o)]);
        }
    for (; p < np; p++)
        for (int r = 0; r < CPU_OUTER_NR; r++)
            memcpy(panel + (p * CPU_OUTER_NR + (size_t)r) * 2, rows + (size_t)r * kp + 2 * p, 2 * sizeof(int16_t));
}

// 16x16 blocks: 16 rows of acc (masked to the columns left), converted and scaled, transposed in
// registers (transpose16), and stored as 16 runs of 16 pixels (masked to the rows left).
void bie_cpu_store_cols_f32__avx512(const int32_t * acc, size_t ldacc, int64_t rows, int64_t cols, float s, float * dst,
                                    size_t ldd, bool stream) {
    const __m512 sv = _mm512_set1_ps(s);
    for (int64_t r0 = 0; r0 < rows; r0 += 16) {
        const int64_t rn = rows - r0 < 16 ? rows - r0 : 16;
        const __mmask16 rmask = (__mmask16)((1u << rn) - 1);
        for (int64_t o0 = 0; o0 < cols; o0 += 16) {
            const int64_t on = cols - o0 < 16 ? cols - o0 : 16;
            const __mmask16 omask = (__mmask16)((1u << on) - 1);
            __m512 v[16];
            for (int r = 0; r < 16; r++)
                v[r] = r < rn ? _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(
                                                  omask, acc + (size_t)(r0 + r) * ldacc + (size_t)o0)),
                                              sv)
                              : _mm512_setzero_ps();
            transpose16(v);
            for (int o = 0; o < on; o++) {
                float * d = dst + (size_t)(o0 + o) * ldd + (size_t)r0;
                if (stream && rn == 16 && ((uintptr_t)d & 63) == 0) _mm512_stream_ps(d, v[perm16(o)]);
                else _mm512_mask_storeu_ps(d, rmask, v[perm16(o)]);
            }
        }
    }
    if (stream) _mm_sfence();
}

// The activation panel of the outer tiles (cpu-impl.h) by 8x16 transposes of 32-bit units: after
// 32-bit then 64-bit interleaves, a[j] (rows 0-3) and b[j] (rows 4-7) hold unit 4L + j of their rows
// in 128-bit lane L; units 2o and 2o+1 of all 8 rows (o = 2L + j/2) are then lanes L of a[j],
// b[j], a[j+1], b[j+1], gathered by two 128-bit shuffles.
void bie_cpu_interleave_mr__avx512(const void * rows, size_t rb, size_t n, void * panel) {
    _Static_assert(CPU_OUTER_MR == 8, "8 rows per panel");
    const uint8_t * src = rows;
    uint32_t * dst = panel;
    for (size_t u = 0; u < n; u += 16) {
        __m512i v[8], t[8], a[4], b[4];
        for (int r = 0; r < 8; r++) v[r] = _mm512_loadu_si512((const void *)(src + r * rb + 4 * u));
        for (int q = 0; q < 4; q++) {
            t[2 * q] = _mm512_unpacklo_epi32(v[2 * q], v[2 * q + 1]);
            t[2 * q + 1] = _mm512_unpackhi_epi32(v[2 * q], v[2 * q + 1]);
        }
        for (int h = 0; h < 2; h++) {
            a[2 * h] = _mm512_unpacklo_epi64(t[h], t[h + 2]);
            a[2 * h + 1] = _mm512_unpackhi_epi64(t[h], t[h + 2]);
            b[2 * h] = _mm512_unpacklo_epi64(t[h + 4], t[h + 6]);
            b[2 * h + 1] = _mm512_unpackhi_epi64(t[h + 4], t[h + 6]);
        }
        for (int j = 0; j < 4; j += 2) {
            const __m512i x0 = _mm512_shuffle_i32x4(a[j], b[j], _MM_SHUFFLE(1, 0, 1, 0));
            const __m512i z0 = _mm512_shuffle_i32x4(a[j + 1], b[j + 1], _MM_SHUFFLE(1, 0, 1, 0));
            const __m512i x1 = _mm512_shuffle_i32x4(a[j], b[j], _MM_SHUFFLE(3, 2, 3, 2));
            const __m512i z1 = _mm512_shuffle_i32x4(a[j + 1], b[j + 1], _MM_SHUFFLE(3, 2, 3, 2));
            const __m512i o[4] = {_mm512_shuffle_i32x4(x0, z0, _MM_SHUFFLE(2, 0, 2, 0)),  // L = 0
                                  _mm512_shuffle_i32x4(x0, z0, _MM_SHUFFLE(3, 1, 3, 1)),  // L = 1
                                  _mm512_shuffle_i32x4(x1, z1, _MM_SHUFFLE(2, 0, 2, 0)),  // L = 2
                                  _mm512_shuffle_i32x4(x1, z1, _MM_SHUFFLE(3, 1, 3, 1))}; // L = 3
            for (int L = 0; L < 4; L++) _mm512_storeu_si512((void *)(dst + (u + 4 * L + j) * 8), o[L]);
        }
    }
}

// 16 channel pairs as 32-bit units (c2q | c2q+1 << 16) of 16 pixels, transposed in registers.
void bie_cpu_planes_to_rows__avx512(const int16_t * src, size_t lds, size_t np, int16_t * dst, size_t ldd) {
    for (size_t p0 = 0; p0 < np; p0 += 16) {
        __m512 v[16];
        for (int q = 0; q < 16; q++) {
            const __m512i lo =
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(src + 2 * (size_t)q * lds + p0)));
            const __m512i hi =
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(src + (2 * (size_t)q + 1) * lds + p0)));
            v[q] = _mm512_castsi512_ps(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
        transpose16(v);
        for (int p = 0; p < 16; p++) _mm512_storeu_ps((void *)(dst + (p0 + (size_t)p) * ldd), v[perm16(p)]);
    }
}

// The int16 weight block of the outer tile from int8 code rows (cpu-impl.h): 16 rows of 32 codes
// sign-extended to 16 pairs per vector, then the 16x16 transpose of pairs.
void bie_cpu_widen_nr__avx512(const int8_t * rows, ptrdiff_t ld, int nr, size_t n, int16_t * panel) {
    for (size_t p = 0; p < n; p += 16)
        for (int r0 = 0; r0 < CPU_OUTER_NR; r0 += 16) {
            __m512 v[16];
            for (int r = 0; r < 16; r++)
                v[r] = r0 + r < nr ? _mm512_castsi512_ps(_mm512_cvtepi8_epi16(
                                         _mm256_loadu_si256((const void *)(rows + (r0 + r) * ld + 2 * (ptrdiff_t)p))))
                                   : _mm512_setzero_ps();
            transpose16(v);
            for (int o = 0; o < 16; o++)
                _mm512_store_ps((void *)(panel + ((p + (size_t)o) * CPU_OUTER_NR + (size_t)r0) * 2), v[perm16(o)]);
        }
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
    .bin = {.nr = 16, .split = true, .tile = bin_tile_4x16},
    .bin_long = {.nr = 8, .split = false, .tile = bin_tile_4x8_hs},
    .bin_long_kb = 256, // below about 24 words a row the lookup tile is as fast or faster
    .u4s4_tile = bie_cpu_u4s4_tile_4x4__avx512,
    .nibble_split = nibble_split,
    BIE_CPU_AVX512_SHARED,
    BIE_CPU_AVX512_OUTER,
};
