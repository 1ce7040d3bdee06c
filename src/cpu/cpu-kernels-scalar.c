// SPDX-License-Identifier: Apache-2.0
// cpu-kernels-scalar.c: portable microkernels and packing helpers (no ISA flags): the fallback
// table, and the reference that the SIMD tables are tested against (tests/test-cpu-*.c).
#include "cpu/cpu-impl.h"

#include <math.h>

static inline uint64_t load64(const uint8_t * p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

// 4x4 tile of popcount(a_i XOR b_j) (unsplit panels; B group: 4 interleaved columns).
static void bin_tile_4x4(const uint8_t * a, size_t lda, const uint8_t * b, size_t kb, int32_t * c, size_t ldc) {
    uint64_t s[CPU_MR][4] = {{0}};
    for (size_t w = 0; w < kb / 8; w++) {
        uint64_t bv[4];
        for (int j = 0; j < 4; j++) bv[j] = load64(b + (w * 4 + (size_t)j) * 8);
        for (int i = 0; i < CPU_MR; i++) {
            const uint64_t av = load64(a + i * lda + w * 8);
            for (int j = 0; j < 4; j++) s[i][j] += (uint64_t)__builtin_popcountll(av ^ bv[j]);
        }
    }
    for (int i = 0; i < CPU_MR; i++)
        for (int j = 0; j < 4; j++) c[i * ldc + j] = (int32_t)s[i][j];
}

// 4x4 tile of int16 dot products (wrapping int32 sums, as the SIMD kernels).
static void i16_tile_4x4(const int16_t * a, size_t lda, const int16_t * b, size_t ldb, size_t k, int32_t * c,
                         size_t ldc) {
    uint32_t s[CPU_MR][4] = {{0}};
    for (size_t p = 0; p < k; p++) {
        int32_t bv[4];
        for (int j = 0; j < 4; j++) bv[j] = b[j * ldb + p];
        for (int i = 0; i < CPU_MR; i++) {
            const int32_t av = a[i * lda + p];
            for (int j = 0; j < 4; j++) s[i][j] += (uint32_t)(av * bv[j]);
        }
    }
    for (int i = 0; i < CPU_MR; i++)
        for (int j = 0; j < 4; j++) c[i * ldc + j] = (int32_t)s[i][j];
}

// 4x4 tile of unsigned x signed byte dot products.
static void u4s4_tile_4x4(const uint8_t * a, size_t lda, const int8_t * b, size_t ldb, size_t k, int32_t * c,
                          size_t ldc) {
    uint32_t s[CPU_MR][4] = {{0}};
    for (size_t p = 0; p < k; p++)
        for (int i = 0; i < CPU_MR; i++)
            for (int j = 0; j < 4; j++) s[i][j] += (uint32_t)((int32_t)a[i * lda + p] * b[j * ldb + p]);
    for (int i = 0; i < CPU_MR; i++)
        for (int j = 0; j < 4; j++) c[i * ldc + j] = (int32_t)s[i][j];
}

static void sign_bits(const float * x, const float * bias, float b0, int64_t n, uint8_t * out) {
    for (int64_t i0 = 0; i0 < n; i0 += 8) {
        unsigned byte = 0;
        for (int64_t i = i0; i < n && i < i0 + 8; i++)
            byte |= (unsigned)(x[i] + (bias ? bias[i] : b0) >= 0.0f) << (i - i0);
        out[i0 / 8] = (uint8_t)byte;
    }
}

static void quantize(const float * x, const float * bias, float b0, int64_t n, float scale, int lo, int hi,
                     int16_t * out) {
    for (int64_t i = 0; i < n; i++) out[i] = (int16_t)cpu_quantize1(x[i] + (bias ? bias[i] : b0), scale, lo, hi);
}

static double mask_binary(const float * x, const float * bias, float b0, float scale, float * gx, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i] + (bias ? bias[i] : b0);
        gx[i] = fabsf(v / scale) <= 1.0f ? gx[i] : 0.0f;
        s += (double)gx[i] * (v >= 0.0f ? 1.0 : -1.0);
    }
    return s;
}

static void nibble_split(const uint8_t * in, size_t n, uint8_t * lo, uint8_t * hi) {
    for (size_t i = 0; i < n; i++) {
        lo[i] = in[i] & 15;
        hi[i] = in[i] >> 4;
    }
}

void bie_cpu_store_cols_f32__scalar(const int32_t * acc, size_t ldacc, int64_t rows, int64_t cols, float s, float * dst,
                                    size_t ldd, bool stream) {
    (void)stream;
    for (int64_t o = 0; o < cols; o++)
        for (int64_t r = 0; r < rows; r++)
            dst[(size_t)o * ldd + (size_t)r] = (float)acc[(size_t)r * ldacc + (size_t)o] * s;
}

const struct cpu_kernels bie_cpu_kernels_scalar = {
    .isa = BIE_CPU_ISA_SCALAR,
    .bin = {.nr = 4, .split = false, .tile = bin_tile_4x4},
    .i16_nr = 4,
    .i16_tile = i16_tile_4x4,
    .u4s4_tile = u4s4_tile_4x4,
    .sign_bits = sign_bits,
    .quantize = quantize,
    .mask_binary = mask_binary,
    .nibble_split = nibble_split,
    .store_cols_f32 = bie_cpu_store_cols_f32__scalar,
};
