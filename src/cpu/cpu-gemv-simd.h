// SPDX-License-Identifier: Apache-2.0
// cpu-gemv-simd.h: the loops of the SIMD matrix-vector kernels (contract in cpu-gemv.h), written
// once over the integer vectors of the file that includes it: cpu-gemv-avx2.c (32 bytes) and,
// through cpu-gemv-avx512.h, cpu-gemv-avx512.c and cpu-gemv-avx512vpopcnt.c (64 bytes). Include it
// only from those, after they have defined
//   vi, GEMV_VB               the vector type and its bytes (an enum constant)
//   vi vload(p), vloadu(p)    a 64-byte aligned load (activations) and an unaligned one (weights)
//   vi vload_tail(p, n)       the n < GEMV_VB bytes at p, zero bytes after them (never read past p + n)
//   vi popc_sad(x)            the set bits of each byte of x, summed into its 64-bit lanes
//   s4_nibbles(w, &hi, &lo)   the unsigned nibbles (x & 15) ^ 8 = x + 8 of the high and low halves of
//                             w's bytes (past the row: zero bytes, nibbles 8, against zero codes)
//   vi maddubs(u, s)          unsigned by signed bytes, adjacent pairs summed into int16 (vpmaddubsw)
//   vi madd(a, b)             int16 by int16, adjacent pairs summed into int32 (vpmaddwd)
//   vi widen_lo(w), widen_hi(w), widen_load(p): the low and high half of w and the half vector at p
//                             (aligned), their int8 codes sign-extended to int16
// and, after including it, gemv_store (declared below). Everything here is inlined into the kernels, with the row counts made constants there.
#pragma once

#include "cpu/cpu-gemv.h"

#define GEMV_INLINE static inline __attribute__((always_inline))

// Weight rows per group. The rows of a group are read one after the other, each in one pass, so
// that the weight is one sequential stream (on Zen 4, a weight streamed from DRAM is read at 98%
// of the read bandwidth this way, at 57% with the rows of a group read in step), into
// accumulators of their own that are summed together at the end of the group (one reduction per
// GEMV_R rows).
#define GEMV_R 4

// Stores the sums of a row group: c[i*ldc + q] = sum(v[q][i]) - bias[i] (wrapping; bias NULL: none)
// for i < M, q < r (r is GEMV_R or 1). Defined by the includer, after this file.
GEMV_INLINE void gemv_store(const int M, const int r, vi v[GEMV_R][CPU_GEMV_MR], const uint32_t * bias, int32_t * c,
                            size_t ldc);

// The lanes of a vector as 64-, 32- and 16-bit integers (GCC's vector arithmetic on them compiles
// to the ISA's vpaddq / vpaddd / vpaddw).
typedef int64_t gemv_v64 __attribute__((vector_size(sizeof(vi))));
typedef int32_t gemv_v32 __attribute__((vector_size(sizeof(vi))));
typedef int16_t gemv_v16 __attribute__((vector_size(sizeof(vi))));
GEMV_INLINE vi add64(vi a, vi b) { return (vi)((gemv_v64)a + (gemv_v64)b); }
GEMV_INLINE vi add32(vi a, vi b) { return (vi)((gemv_v32)a + (gemv_v32)b); }
GEMV_INLINE vi add16(vi a, vi b) { return (vi)((gemv_v16)a + (gemv_v16)b); }
GEMV_INLINE vi vzero(void) { return (vi)(gemv_v64){0}; }

// Zeroes a group's accumulators (acc[q][i]: weight row q, activation row i).
GEMV_INLINE void gemv_zero(vi acc[GEMV_R][CPU_GEMV_MR]) {
    for (int q = 0; q < GEMV_R; q++)
        for (int i = 0; i < CPU_GEMV_MR; i++) acc[q][i] = vzero();
}

// A step of a kernel: acc[i] += the terms of the GEMV_VB weight bytes wv (bytes t .. of a row; past
// kb they read as 0) with activation row i, for i < M.
typedef void (*gemv_step_fn)(const int M, const uint8_t * a, size_t lda, size_t kb, size_t t, vi wv, vi * acc);

// The steps over bytes t0 .. t1 of weight row wq (whole vectors, then the last part through
// vload_tail), into acc. The step is inlined.
GEMV_INLINE void gemv_row(const int M, const uint8_t * a, size_t lda, size_t kb, const uint8_t * wq, size_t t0,
                          size_t t1, vi * acc, gemv_step_fn step) {
    size_t t = t0;
    for (; t + GEMV_VB <= t1; t += GEMV_VB) step(M, a, lda, kb, t, vloadu(wq + t), acc);
    if (t < t1) step(M, a, lda, kb, t, vload_tail(wq + t, t1 - t), acc);
}

// A group of r weight rows from row j (r is GEMV_R or 1), each row in one pass of steps, then its
// sums stored (gemv_store, with bias).
GEMV_INLINE void gemv_group(const int M, const int r, int64_t j, const uint8_t * a, size_t lda, const uint32_t * bias,
                            const uint8_t * w, size_t ldw, size_t kb, int32_t * c, size_t ldc, gemv_step_fn step) {
    vi acc[GEMV_R][CPU_GEMV_MR];
    gemv_zero(acc);
    for (int q = 0; q < r; q++) gemv_row(M, a, lda, kb, w + (size_t)(j + q) * ldw, 0, kb, acc[q], step);
    gemv_store(M, r, acc, bias, c + j, ldc);
}

// The biases b * asum[i] of the unsigned-by-signed kernels (cpu-gemv.h), wrapping.
GEMV_INLINE void gemv_bias(int m, const int32_t * asum, uint32_t b, uint32_t * out) {
    for (int i = 0; i < m; i++) out[i] = b * (uint32_t)asum[i];
}

// Binary: popc(a ^ w) by popc_sad. The 64-bit lanes hold counts below 2^32: gemv_store sums them
// as int32 lanes (the high halves are 0).
GEMV_INLINE void gemv_b1_step(const int M, const uint8_t * a, size_t lda, size_t kb, size_t t, vi wv, vi * acc) {
    (void)kb;
    for (int i = 0; i < M; i++) acc[i] = add64(acc[i], popc_sad(vload(a + (size_t)i * lda + t) ^ wv));
}

// 4-bit: the unsigned nibbles x + 8 times the signed activation codes by vpmaddubsw: each pair sum
// is at most 2 * 15 * 8 = 240 in magnitude, so two per vector add at most 480 to an int16 lane and
// 64 steps stay below 32767; the lanes are widened (vpmaddwd with ones) and summed every 64 steps
// (GEMV_S4_BLOCK bytes of a row). The caller takes the bias 8 * asum off.
#define GEMV_S4_BLOCK (64 * GEMV_VB)

GEMV_INLINE void gemv_s4_step(const int M, const uint8_t * a, size_t lda, size_t kb, size_t t, vi wv, vi * acc) {
    const size_t kp = cpu_round_up(kb, CPU_GEMV_ALIGN);
    vi hi, lo;
    s4_nibbles(wv, &hi, &lo);
    for (int i = 0; i < M; i++) {
        const vi ae = vload(a + (size_t)i * lda + t), ao = vload(a + (size_t)i * lda + kp + t);
        acc[i] = add16(acc[i], add16(maddubs(hi, ae), maddubs(lo, ao)));
    }
}

GEMV_INLINE void gemv_s4_group(const int M, const int r, int64_t j, const int8_t * a, size_t lda, const uint32_t * bias,
                               const uint8_t * w, size_t ldw, size_t kb, int32_t * c, size_t ldc) {
    const vi ones = (vi)((gemv_v16){0} + 1);
    vi acc[GEMV_R][CPU_GEMV_MR];
    gemv_zero(acc);
    for (int q = 0; q < r; q++)
        for (size_t t0 = 0; t0 < kb; t0 += GEMV_S4_BLOCK) {
            const size_t t1 = kb - t0 > GEMV_S4_BLOCK ? t0 + GEMV_S4_BLOCK : kb;
            vi a16[CPU_GEMV_MR];
            for (int i = 0; i < CPU_GEMV_MR; i++) a16[i] = vzero();
            gemv_row(M, (const uint8_t *)a, lda, kb, w + (size_t)(j + q) * ldw, t0, t1, a16, gemv_s4_step);
            for (int i = 0; i < M; i++) acc[q][i] = add32(acc[q][i], madd(a16[i], ones));
        }
    gemv_store(M, r, acc, bias, c + j, ldc);
}

// 8-bit: codes sign-extended to int16 and vpmaddwd, exact int32 pair sums.
GEMV_INLINE void gemv_s8_step(const int M, const uint8_t * a, size_t lda, size_t kb, size_t t, vi wv, vi * acc) {
    (void)kb;
    const vi w0 = widen_lo(wv), w1 = widen_hi(wv);
    for (int i = 0; i < M; i++) {
        const uint8_t * ai = a + (size_t)i * lda + t;
        acc[i] = add32(acc[i], add32(madd(widen_load(ai), w0), madd(widen_load(ai + GEMV_VB / 2), w1)));
    }
}
