// SPDX-License-Identifier: Apache-2.0
// cpu-wq.h: the CPU kernels of the weight-only n-bit layer (cpu-wq.c drives them; one file per ISA,
// cpu-wq-avx2.c and cpu-wq-avx512.c, compiled with its own flags).
//
// The kernels read the qweight words as they are (GPTQ's layout, bie.h): a vector holds one word
// row of `lanes` consecutive columns. The K packed rows are taken in blocks of 32 rows; a block of
// b-bit codes is exactly b word rows of every column (32*b bits), starting at word row blk_word[j].
// A block decodes into 8 "quads" per lane: 4 bytes, each one code, as vpdpbusd reads them. Which
// row of the block sits in byte t of quad i depends only on b (cpu_wq_order), and is chosen so
// that decoding takes a shift and a mask per quad:
//   b = 8: quad i = word i                     bytes t = rows 4i + t
//   b = 4: quad 2w+h = (word w >> 4h) & 0x0F0F0F0F        rows 8w + 2t + h
//   b = 2: quad 4w+s = (word w >> 2s) & 0x03030303        rows 16w + s + 4t
//   other: codes in row order (quad i = rows 4i .. 4i+3), extracted one by one
// The activations are laid out in the same order per block (cpu-wq.c), so each quad meets its own
// four activations. Groups hold whole blocks (group_size a multiple of 32, or one group).
#pragma once

#include "wq-impl.h"

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

// Row (0..31) of its block held by byte t of quad i (p = 4*i + t) for b-bit codes.
static inline int cpu_wq_order(int b, int p) {
    const int i = p / 4, t = p % 4;
    if (b == 4) return 8 * (i / 2) + 2 * t + (i % 2);
    if (b == 2) return 16 * (i / 4) + (i % 4) + 4 * t;
    return p;
}

struct cpu_wq_job {
    const uint32_t * qw; // [rows][N]
    int64_t N, rows, nblk;
    const int64_t * blk_word;   // [nblk] first word row of each block
    const int32_t * blk_group;  // [nblk]
    const int32_t * group_bits; // [G]
    enum bie_wq_zero zero;
    const void * scales;
    const void * zeros; // NULL for SYM
    enum bie_dtype sdtype, zdtype;
    int64_t G;
    // Activations, [M][ldx] per row, block j at 32*j in the block's order: f32 (float path) or int8
    // with one f32 scale per block (xd [M][nblk]); xsum [M][G]: each group's sum of the activations
    // (int8 path: of xd * xq).
    const float * xa;
    const int8_t * xq;
    const float * xd;
    const float * xsum;
    size_t ldx;
};

// Vectors of columns that a gemv call takes at most.
#define CPU_WQ_WIDE_VECS 64

struct cpu_wq_kernels {
    int lanes; // columns per vector
    // out[i*ldo + l] = sum_r x[m0+i][r] * W[r, n0+l] for i < mr (1..4), l < nc (nc <= CPU_WQ_WIDE_VECS
    // * lanes), f32 sums in block order (no bias). gemv_i8 (NULL where the CPU lacks VNNI) reads xq, xd.
    void (*gemv_f32)(const struct cpu_wq_job * j, int64_t n0, int nc, int64_t m0, int mr, float * out, size_t ldo);
    void (*gemv_i8)(const struct cpu_wq_job * j, int64_t n0, int nc, int64_t m0, int mr, float * out, size_t ldo);
    // w[(r - 32*b0)*ldw + l] = W[r, n0+l] for the rows r < rmax of blocks b0 .. b1-1, l < nc (f32).
    void (*dequant)(const struct cpu_wq_job * j, int64_t n0, int nc, int64_t b0, int64_t b1, int64_t rmax, float * w,
                    size_t ldw);
};

extern const struct cpu_wq_kernels bie_cpu_wq_kernels_avx2;
extern const struct cpu_wq_kernels bie_cpu_wq_kernels_avx512;
// bie_cpu_wq_kernels_avx512 with gemv_i8 set (CPUs with AVX512-VNNI).
extern const struct cpu_wq_kernels bie_cpu_wq_kernels_avx512_vnni;
