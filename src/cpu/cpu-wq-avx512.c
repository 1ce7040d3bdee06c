// SPDX-License-Identifier: Apache-2.0
// cpu-wq-avx512.c: AVX-512 kernels of the weight-only n-bit layer (cpu-wq.h has the layout): the
// f32 path and the dequantiser of cpu-wq-simd.h on vectors of 16 columns under lane masks (codes of
// up to 4 bits made f32 by a 16-entry permute), and the int8 path (AVX512-VNNI), whose blocks are
// summed by vpdpbusd.
#include "cpu/cpu-wq.h"

#include <immintrin.h>

enum { LANES = 16 };
typedef __m512 vf;
typedef __m512i vi;
typedef __mmask16 vmask;

#define AI __attribute__((always_inline)) static inline

AI vmask mask_of(int nc) { return nc >= 16 ? (__mmask16)0xFFFF : nc <= 0 ? 0 : (__mmask16)((1u << nc) - 1u); }
AI bool mask_any(vmask m) { return m != 0; }

AI vi vi_srli(vi a, int n) { return _mm512_srli_epi32(a, (unsigned)n); }
AI vi vi_slli(vi a, int n) { return _mm512_slli_epi32(a, (unsigned)n); }
AI vf vf_set1(float v) { return _mm512_set1_ps(v); }
AI vf vf_fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
AI vf vf_fnmadd(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }

AI vi ld_words(const struct cpu_wq_job * j, int64_t wrow, int64_t n0, vmask m) {
    if (wrow >= j->rows || !m) return _mm512_setzero_si512();
    return _mm512_maskz_loadu_epi32(m, j->qw + wrow * j->N + n0);
}

AI vf ld_stat(const void * p, enum bie_dtype dt, int64_t off, vmask m) {
    switch (dt) {
    case BIE_DTYPE_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + off));
    case BIE_DTYPE_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + off)), 16));
    default: return _mm512_maskz_loadu_ps(m, (const float *)p + off);
    }
}

AI void st_f32(float * p, vmask m, vf v) { _mm512_mask_storeu_ps(p, m, v); }

#define WQ_LUT16 1
AI vf lut16_f32(vi a) {
    return _mm512_permutexvar_ps(a, _mm512_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 9.0f, 10.0f,
                                                   11.0f, 12.0f, 13.0f, 14.0f, 15.0f));
}

#include "cpu/cpu-wq-simd.h"

static inline int32_t ld32(const int8_t * p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

// The int8 path's block: per row, the block's 32 int8 activations against its quads by vpdpbusd,
// then acc += f32(sum) * the block's activation scale. The even and odd quads go to two sums (two
// chains of dependent vpdpbusd half as long; the int32 sums are exact in any order).
__attribute__((target("avx512vnni"))) AI void i8_block(const struct cpu_wq_job * j, int64_t blk, int b, int64_t m0,
                                                       const int MR, const int V, const int v, const vi * q, vf * acc) {
    (void)b;
    const int8_t * xb = j->xq + 32 * blk + m0 * j->ldx;
    __m512i ai[4][2];
    for (int r = 0; r < MR; r++) ai[r][0] = ai[r][1] = _mm512_setzero_si512();
    for (int i = 0; i < 8; i++)
        for (int r = 0; r < MR; r++)
            ai[r][i & 1] = _mm512_dpbusd_epi32(ai[r][i & 1], q[i], _mm512_set1_epi32(ld32(xb + r * j->ldx + 4 * i)));
    for (int r = 0; r < MR; r++)
        acc[r * V + v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(ai[r][0], ai[r][1])),
                                         _mm512_set1_ps(j->xd[(m0 + r) * j->nblk + blk]), acc[r * V + v]);
}

__attribute__((target("avx512vnni"))) static void gemv_i8(const struct cpu_wq_job * j, int64_t n0, int nc, int64_t m0,
                                                          int mr, float * out, size_t ldo) {
    gemv_tiles(j, n0, nc, m0, mr, out, ldo, i8_block, false);
}

const struct cpu_wq_kernels bie_cpu_wq_kernels_avx512 = {.lanes = 16, .gemv_f32 = gemv_f32, .dequant = dequant};
const struct cpu_wq_kernels bie_cpu_wq_kernels_avx512_vnni = {
    .lanes = 16, .gemv_f32 = gemv_f32, .gemv_i8 = gemv_i8, .dequant = dequant};
