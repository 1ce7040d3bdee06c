// SPDX-License-Identifier: Apache-2.0
// cpu-wq-avx2.c: AVX2 kernels of the weight-only n-bit layer: the f32 path and the dequantiser of
// cpu-wq-simd.h on vectors of 8 columns (AVX2 has no vpdpbusd, so no int8 path here). AVX2 has
// masked loads and stores of 32-bit lanes only: a vector's lanes are given by their count, and a
// partial row of f16 / bf16 statistics is read element by element.
#include "cpu/cpu-wq.h"

#include <immintrin.h>

enum { LANES = 8 };
typedef __m256 vf;
typedef __m256i vi;
typedef int vmask; // the lanes 0 .. vmask-1 (none when <= 0, all when >= 8)

#define AI __attribute__((always_inline)) static inline

AI vmask mask_of(int nc) { return nc; }
AI bool mask_any(vmask m) { return m > 0; }
AI __m256i lane_bits(vmask m) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

AI vi vi_srli(vi a, int n) { return _mm256_srli_epi32(a, n); }
AI vi vi_slli(vi a, int n) { return _mm256_slli_epi32(a, n); }
AI vf vf_set1(float v) { return _mm256_set1_ps(v); }
AI vf vf_fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
AI vf vf_fnmadd(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }

AI vi ld_words(const struct cpu_wq_job * j, int64_t wrow, int64_t n0, vmask m) {
    if (wrow >= j->rows || m <= 0) return _mm256_setzero_si256();
    const int * p = (const int *)(j->qw + wrow * j->N + n0);
    return m >= 8 ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskload_epi32(p, lane_bits(m));
}

AI vf ld_stat(const void * p, enum bie_dtype dt, int64_t off, vmask m) {
    if (m < 8) {
        float t[8] = {0};
        for (int i = 0; i < m; i++)
            t[i] = dt == BIE_DTYPE_F16    ? bie_f16_to_f32(((const uint16_t *)p)[off + i])
                   : dt == BIE_DTYPE_BF16 ? bie_bf16_to_f32(((const uint16_t *)p)[off + i])
                                          : ((const float *)p)[off + i];
        return _mm256_loadu_ps(t);
    }
    switch (dt) {
    case BIE_DTYPE_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + off)));
    case BIE_DTYPE_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + off))), 16));
    default: return _mm256_loadu_ps((const float *)p + off);
    }
}

AI void st_f32(float * p, vmask m, vf v) {
    if (m >= 8) _mm256_storeu_ps(p, v);
    else _mm256_maskstore_ps(p, lane_bits(m), v);
}

#include "cpu/cpu-wq-simd.h"

const struct cpu_wq_kernels bie_cpu_wq_kernels_avx2 = {.lanes = 8, .gemv_f32 = gemv_f32, .dequant = dequant};
