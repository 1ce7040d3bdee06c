// SPDX-License-Identifier: Apache-2.0
// cpu-wq-avx2.c: AVX2 kernels of the weight-only n-bit layer: the f32 path and the dequantiser of
// cpu-wq-avx512.c on vectors of 8 columns (AVX2 has no vpdpbusd, so no int8 path here). The
// arithmetic is the same, in the same order; only the vector width differs.
#include "cpu/cpu-wq.h"

#include <immintrin.h>

#define AI __attribute__((always_inline)) static inline
#define PF_BLOCKS 4

AI __m256i lane_mask(int nc) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(nc), idx);
}

AI __m256i ld_words(const struct cpu_wq_job * j, int64_t wrow, int64_t n0, int nc) {
    if (wrow >= j->rows || nc <= 0) return _mm256_setzero_si256();
    const int * p = (const int *)(j->qw + wrow * j->N + n0);
    return nc >= 8 ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskload_epi32(p, lane_mask(nc));
}

AI __m256 ld_stat(const void * p, enum bie_dtype dt, int64_t off, int nc) {
    if (nc < 8) {
        float t[8] = {0};
        for (int i = 0; i < nc; i++)
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

AI void decode_generic(const __m256i * w, const int b, __m256i * q) {
    const __m256i m = _mm256_set1_epi32((1 << b) - 1);
    for (int i = 0; i < 8; i++) q[i] = _mm256_setzero_si256();
    for (int v = 0; v < 32; v++) {
        const int bit = v * b, wi = bit >> 5, sh = bit & 31;
        __m256i c = _mm256_srli_epi32(w[wi], sh);
        if (sh + b > 32) c = _mm256_or_si256(c, _mm256_slli_epi32(w[wi + 1], 32 - sh));
        q[v >> 2] = _mm256_or_si256(q[v >> 2], _mm256_slli_epi32(_mm256_and_si256(c, m), 8 * (v & 3)));
    }
}

AI void decode(const struct cpu_wq_job * j, int64_t blk, int b, int64_t n0, int nc, __m256i * q) {
    const int64_t w0 = j->blk_word[blk];
    __m256i w[8];
    for (int i = 0; i < 8; i++) w[i] = i < b ? ld_words(j, w0 + i, n0, nc) : _mm256_setzero_si256();
    switch (b) {
    case 8:
        for (int i = 0; i < 8; i++) q[i] = w[i];
        break;
    case 4: {
        const __m256i m = _mm256_set1_epi32(0x0F0F0F0F);
        for (int i = 0; i < 4; i++) {
            q[2 * i] = _mm256_and_si256(w[i], m);
            q[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi32(w[i], 4), m);
        }
        break;
    }
    case 2: {
        const __m256i m = _mm256_set1_epi32(0x03030303);
        for (int i = 0; i < 2; i++)
            for (int s = 0; s < 4; s++) q[4 * i + s] = _mm256_and_si256(_mm256_srli_epi32(w[i], 2 * s), m);
        break;
    }
    case 1: decode_generic(w, 1, q); break;
    case 3: decode_generic(w, 3, q); break;
    case 5: decode_generic(w, 5, q); break;
    case 6: decode_generic(w, 6, q); break;
    default: decode_generic(w, 7, q); break;
    }
}

AI void prefetch_block(const struct cpu_wq_job * j, int64_t blk, int b, int64_t n0) {
    const int64_t w0 = j->blk_word[blk];
    for (int i = 0; i < b; i++)
        if (w0 + i < j->rows) _mm_prefetch((const char *)(j->qw + (w0 + i) * j->N + n0), _MM_HINT_T0);
}

AI __m256 byte_f32(__m256i q, int t) {
    const __m256i v =
        t == 3 ? _mm256_srli_epi32(q, 24) : _mm256_and_si256(_mm256_srli_epi32(q, 8 * t), _mm256_set1_epi32(0xFF));
    return _mm256_cvtepi32_ps(v);
}

AI void flush(const struct cpu_wq_job * j, int64_t g, int64_t m0, const int MR, const int V, int64_t n0, int nc,
              __m256 * acc, __m256 * y) {
    const int b = j->group_bits[g];
    for (int v = 0; v < V; v++) {
        const int cn = nc - 8 * v;
        if (cn <= 0) continue;
        const __m256 s = ld_stat(j->scales, j->sdtype, g * j->N + n0 + 8 * v, cn);
        __m256 c;
        if (j->zero == BIE_WQ_ZERO_SYM) c = _mm256_mul_ps(s, _mm256_set1_ps((float)(1 << (b - 1))));
        else if (j->zero == BIE_WQ_ZERO_CODE)
            c = _mm256_mul_ps(s, ld_stat(j->zeros, j->zdtype, g * j->N + n0 + 8 * v, cn));
        else c = ld_stat(j->zeros, j->zdtype, g * j->N + n0 + 8 * v, cn);
        for (int r = 0; r < MR; r++) {
            __m256 * a = &acc[r * V + v];
            y[r * V + v] = _mm256_fmadd_ps(s, *a, y[r * V + v]);
            y[r * V + v] = _mm256_fnmadd_ps(c, _mm256_set1_ps(j->xsum[(m0 + r) * j->G + g]), y[r * V + v]);
            *a = _mm256_setzero_ps();
        }
    }
}

AI void gemv_f32_t(const struct cpu_wq_job * j, int64_t n0, int nc, int64_t m0, const int MR, const int V, float * out,
                   size_t ldo) {
    __m256 acc[4], y[4];
    for (int i = 0; i < MR * V; i++) acc[i] = y[i] = _mm256_setzero_ps();
    int64_t g = j->blk_group[0];
    for (int64_t blk = 0; blk < j->nblk; blk++) {
        if (j->blk_group[blk] != g) {
            flush(j, g, m0, MR, V, n0, nc, acc, y);
            g = j->blk_group[blk];
        }
        const int b = j->group_bits[g];
        const float * xb = j->xa + 32 * blk + m0 * j->ldx;
        for (int v = 0; v < V; v++) {
            if (blk + PF_BLOCKS < j->nblk)
                prefetch_block(j, blk + PF_BLOCKS, j->group_bits[j->blk_group[blk + PF_BLOCKS]], n0 + 8 * v);
            __m256i q[8];
            decode(j, blk, b, n0 + 8 * v, nc - 8 * v, q);
            for (int i = 0; i < 8; i++)
                for (int t = 0; t < 4; t++) {
                    const __m256 f = byte_f32(q[i], t);
                    for (int r = 0; r < MR; r++)
                        acc[r * V + v] = _mm256_fmadd_ps(f, _mm256_set1_ps(xb[r * j->ldx + 4 * i + t]), acc[r * V + v]);
                }
        }
    }
    flush(j, g, m0, MR, V, n0, nc, acc, y);
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < V; v++) {
            const int cn = nc - 8 * v;
            if (cn >= 8) _mm256_storeu_ps(out + r * ldo + 8 * v, y[r * V + v]);
            else if (cn > 0) _mm256_maskstore_ps(out + r * ldo + 8 * v, lane_mask(cn), y[r * V + v]);
        }
}

static void gemv_f32(const struct cpu_wq_job * j, int64_t n0, int nc, int64_t m0, int mr, float * out, size_t ldo) {
    const int w = 8 * (mr == 1 ? 4 : mr == 2 ? 2 : 1); // columns per call of the template
    for (int c = 0; c < nc; c += w) {
        const int cn = nc - c < w ? nc - c : w;
        switch (mr) {
        case 1: gemv_f32_t(j, n0 + c, cn, m0, 1, 4, out + c, ldo); break;
        case 2: gemv_f32_t(j, n0 + c, cn, m0, 2, 2, out + c, ldo); break;
        case 3: gemv_f32_t(j, n0 + c, cn, m0, 3, 1, out + c, ldo); break;
        default: gemv_f32_t(j, n0 + c, cn, m0, 4, 1, out + c, ldo); break;
        }
    }
}

static void dequant(const struct cpu_wq_job * j, int64_t n0, int nc, int64_t b0, int64_t b1, int64_t rmax, float * w,
                    size_t ldw) {
    for (int c = 0; c < nc; c += 8) {
        const int cn = nc - c;
        const __m256i mk = lane_mask(cn);
        for (int64_t blk = b0; blk < b1; blk++) {
            const int64_t g = j->blk_group[blk];
            const int b = j->group_bits[g];
            const __m256 s = ld_stat(j->scales, j->sdtype, g * j->N + n0 + c, cn);
            const __m256 z = j->zero == BIE_WQ_ZERO_SYM ? _mm256_set1_ps((float)(1 << (b - 1)))
                                                        : ld_stat(j->zeros, j->zdtype, g * j->N + n0 + c, cn);
            __m256i q[8];
            decode(j, blk, b, n0 + c, cn, q);
            for (int p = 0; p < 32; p++) {
                const int64_t r = 32 * blk + cpu_wq_order(b, p);
                if (r >= rmax) continue;
                const __m256 f = byte_f32(q[p / 4], p % 4);
                const __m256 v = j->zero == BIE_WQ_ZERO_OFFSET ? _mm256_sub_ps(_mm256_mul_ps(s, f), z)
                                                               : _mm256_mul_ps(s, _mm256_sub_ps(f, z));
                float * d = w + (r - 32 * b0) * (int64_t)ldw + c;
                if (cn >= 8) _mm256_storeu_ps(d, v);
                else _mm256_maskstore_ps(d, mk, v);
            }
        }
    }
}

const struct cpu_wq_kernels bie_cpu_wq_kernels_avx2 = {.lanes = 8, .gemv_f32 = gemv_f32, .dequant = dequant};
