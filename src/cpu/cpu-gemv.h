// SPDX-License-Identifier: Apache-2.0
// cpu-gemv.h: the matrix-vector path of the CPU forward (cpu-gemv.c) and its kernels, one table
// per ISA (cpu-gemv-scalar.c, -avx2.c, -avx512.c, -avx512vpopcnt.c, each compiled with its flags).
//
// A linear layer (or a plain 1x1 convolution) with at most CPU_GEMV_MAX_M rows of activations
// reads its weight rows where they lie, in the public packed formats (docs/formats.md: B1 rows of
// ceil(K/8) bytes, S4 rows of ceil(K/2) bytes with element 2t in the high nibble of byte t, I8
// rows of K codes), once, at memory speed: no panel is packed. The few activation rows are
// prepared once per call into the form below (a few KB that stay in L1), every thread takes a
// contiguous range of weight rows, and the kernels stream those rows against up to CPU_GEMV_MR
// activation rows at once (for more, a block of rows goes through the kernel again while it is
// in the caches), so the weights come from memory once whatever M is.
//
// Kernel contract (all kernels, every ISA): m <= CPU_GEMV_MR activation rows a_i = a + i*lda (bytes),
// 64-byte aligned, each zero from its last valid byte up to the next multiple of 64 (the kernels
// read the activations in whole vectors); n weight rows w_j = w + j*ldw (bytes), of which exactly
// the bytes named below are read (never past them: the rows are the caller's tensor); the results go
// to c[i*ldc + j] for i < m, j < n. Integer sums wrap modulo 2^32, as every integer path of bie.
//
//   b1: c = popc(a_i XOR w_j) over kb bytes (every bit of those bytes counts).
//   s4: a_i holds the even codes a_i[t] = x[2t] then the odd ones a_i[kp + t] = x[2t+1] (int8 in
//       [-8, 7]; kp = round_up(kb, 64)); c = sum_{t < kb} hi(w_j[t]) * x[2t] + lo(w_j[t]) * x[2t+1],
//       hi / lo the signed high / low nibble; asum[i] = sum_{t < kb} x[2t] + x[2t+1].
//   s8: c = sum_{t < k} w_j[t] * a_i[t] (int8 codes); asum[i] = sum_{t < k} a_i[t].
// The sums of the activation codes let a kernel multiply unsigned bytes by signed ones (vpmaddubsw,
// vpdpbusd) with the weights made unsigned by a bias: sum (w + b) * a = sum w * a + b * asum.
#pragma once

#include "cpu/cpu-impl.h"

#define CPU_GEMV_MAX_M 8 // the largest M (rows of activations) the matrix-vector path takes
#define CPU_GEMV_MR 4    // activation rows per kernel call
#define CPU_GEMV_ALIGN 64

typedef void (*cpu_gemv_b1_fn)(const uint8_t * a, size_t lda, int m, const uint8_t * w, size_t ldw, int64_t n,
                               size_t kb, int32_t * c, size_t ldc);
typedef void (*cpu_gemv_s4_fn)(const int8_t * a, size_t lda, const int32_t * asum, int m, const uint8_t * w, size_t ldw,
                               int64_t n, size_t kb, int32_t * c, size_t ldc);
typedef void (*cpu_gemv_s8_fn)(const int8_t * a, size_t lda, const int32_t * asum, int m, const int8_t * w, size_t ldw,
                               int64_t n, size_t k, int32_t * c, size_t ldc);

struct cpu_gemv_kernels {
    const char * name;
    cpu_gemv_b1_fn b1;
    cpu_gemv_s4_fn s4;
    cpu_gemv_s8_fn s8;
};

extern const struct cpu_gemv_kernels bie_cpu_gemv_scalar;
extern const struct cpu_gemv_kernels bie_cpu_gemv_avx2;
extern const struct cpu_gemv_kernels bie_cpu_gemv_avx512;
extern const struct cpu_gemv_kernels bie_cpu_gemv_avx512vpopcnt;
extern const struct cpu_gemv_kernels bie_cpu_gemv_avx512vpopcnt_vnni; // n-bit kernels with AVX512-VNNI

// For the SIMD kernels: calls group(M, r, j, ...) for the groups of n weight rows (j = 0, R, 2R, ...
// with r = R, then single rows with r = 1), M the compile-time count (1 .. CPU_GEMV_MR) of
// activation rows that m selects, so that the group's loops over them unroll.
#define CPU_GEMV_GROUPS_(group, R, M, n, ...)                                                                          \
    do {                                                                                                               \
        int64_t j_ = 0;                                                                                                \
        for (; j_ + (R) <= (n); j_ += (R)) group(M, R, j_, __VA_ARGS__);                                               \
        for (; j_ < (n); j_++) group(M, 1, j_, __VA_ARGS__);                                                           \
    } while (0)
#define CPU_GEMV_FOR_GROUPS(group, R, m, n, ...)                                                                       \
    do {                                                                                                               \
        switch (m) {                                                                                                   \
        case 1: CPU_GEMV_GROUPS_(group, R, 1, n, __VA_ARGS__); break;                                                  \
        case 2: CPU_GEMV_GROUPS_(group, R, 2, n, __VA_ARGS__); break;                                                  \
        case 3: CPU_GEMV_GROUPS_(group, R, 3, n, __VA_ARGS__); break;                                                  \
        default: CPU_GEMV_GROUPS_(group, R, 4, n, __VA_ARGS__);                                                        \
        }                                                                                                              \
    } while (0)

// The kernels for a context's kernel table (its ISA level; VNNI where that table uses it).
const struct cpu_gemv_kernels * bie_cpu_gemv_kernels(const struct cpu_kernels * kern);

// True when the call is a matrix-vector product this path takes: plain 1x1 geometry (linear layers
// are), batch*H*W <= CPU_GEMV_MAX_M, and a weight in its packed row form (B1, S4 or I8 rows with the
// channels contiguous) or f32 rows (quantized a block of rows at a time as they are streamed).
bool bie_cpu_gemv_applies(const struct bie_layer_call * call);
// Threads share the weight rows only when each gets at least this many bytes of them (waking a
// thread costs more than streaming less). A shape-only constant; tests lower it to run the splits.
extern size_t bie_cpu_gemv_bytes_per_thread;
enum bie_status bie_cpu_gemv_forward(bie_context_t * ctx, const struct bie_layer_call * call);
