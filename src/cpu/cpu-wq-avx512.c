// SPDX-License-Identifier: Apache-2.0
// cpu-wq-avx512.c: AVX-512 kernels of the weight-only n-bit layer (cpu-wq.h has the layout).
// A vector holds one word row of 16 columns. The products run in the block order of cpu_wq_order:
//   f32 path:  acc += f32(code) * x  per row of the block, then per group
//              y += s * acc - c * xsum   (c = s*z, s*2^(b-1) or z by the zero form)
//   int8 path: acc_i32 = sum of vpdpbusd(quad codes, 4 int8 activations) over the block,
//              acc += f32(acc_i32) * xd (the block's activation scale), then per group as above.
// Up to four rows of x share every decoded block; with fewer rows a call covers more columns
// (rows * vectors <= 4), so that each task streams 64 (one row) or 32 columns' words together.
#include "cpu/cpu-wq.h"

#include <immintrin.h>

#define AI __attribute__((always_inline)) static inline
#define PF_BLOCKS 4 // blocks ahead whose words are prefetched

AI __mmask16 lane_mask(int nc) { return nc >= 16 ? (__mmask16)0xFFFF : nc <= 0 ? 0 : (__mmask16)((1u << nc) - 1u); }

AI __m512i ld_words(const struct cpu_wq_job * j, int64_t wrow, int64_t n0, __mmask16 mk) {
    if (wrow >= j->rows || !mk) return _mm512_setzero_si512();
    return _mm512_maskz_loadu_epi32(mk, j->qw + wrow * j->N + n0);
}

// 16 statistics (scales or zeros) of group g from columns n0.. as f32.
AI __m512 ld_stat(const void * p, enum bie_dtype dt, int64_t off, __mmask16 mk) {
    switch (dt) {
    case BIE_DTYPE_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, (const uint16_t *)p + off));
    case BIE_DTYPE_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, (const uint16_t *)p + off)), 16));
    default: return _mm512_maskz_loadu_ps(mk, (const float *)p + off);
    }
}

// Codes of b bits in row order: value v of the block at stream bit v*b (b constant after inlining).
AI void decode_generic(const __m512i * w, const int b, __m512i * q) {
    const __m512i m = _mm512_set1_epi32((1 << b) - 1);
    for (int i = 0; i < 8; i++) q[i] = _mm512_setzero_si512();
    for (int v = 0; v < 32; v++) {
        const int bit = v * b, wi = bit >> 5, sh = bit & 31;
        __m512i c = _mm512_srli_epi32(w[wi], (unsigned)sh);
        if (sh + b > 32) c = _mm512_or_si512(c, _mm512_slli_epi32(w[wi + 1], (unsigned)(32 - sh)));
        q[v >> 2] = _mm512_or_si512(q[v >> 2], _mm512_slli_epi32(_mm512_and_si512(c, m), (unsigned)(8 * (v & 3))));
    }
}

// The 8 quads of block blk for the 16 columns n0.. (cpu-wq.h).
AI void decode(const struct cpu_wq_job * j, int64_t blk, int b, int64_t n0, __mmask16 mk, __m512i * q) {
    const int64_t w0 = j->blk_word[blk];
    __m512i w[8];
    for (int i = 0; i < 8; i++) w[i] = i < b ? ld_words(j, w0 + i, n0, mk) : _mm512_setzero_si512();
    switch (b) {
    case 8:
        for (int i = 0; i < 8; i++) q[i] = w[i];
        break;
    case 4: {
        const __m512i m = _mm512_set1_epi32(0x0F0F0F0F);
        for (int i = 0; i < 4; i++) {
            q[2 * i] = _mm512_and_si512(w[i], m);
            q[2 * i + 1] = _mm512_and_si512(_mm512_srli_epi32(w[i], 4), m);
        }
        break;
    }
    case 2: {
        const __m512i m = _mm512_set1_epi32(0x03030303);
        for (int i = 0; i < 2; i++)
            for (int s = 0; s < 4; s++) q[4 * i + s] = _mm512_and_si512(_mm512_srli_epi32(w[i], (unsigned)(2 * s)), m);
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
    if (blk >= j->nblk) return;
    const int64_t w0 = j->blk_word[blk];
    for (int i = 0; i < b; i++)
        if (w0 + i < j->rows) _mm_prefetch((const char *)(j->qw + (w0 + i) * j->N + n0), _MM_HINT_T0);
}

// Byte t of every lane of quad q as f32.
AI __m512 byte_f32(__m512i q, int t) {
    const __m512i v = t == 3 ? _mm512_srli_epi32(q, 24)
                             : _mm512_and_si512(_mm512_srli_epi32(q, (unsigned)(8 * t)), _mm512_set1_epi32(0xFF));
    return _mm512_cvtepi32_ps(v);
}

// y[r][v] += s*acc - c*xsum[r][g]; acc = 0 (the end of group g).
AI void flush(const struct cpu_wq_job * j, int64_t g, int64_t m0, const int MR, const int V, int64_t n0, int nc,
              __m512 * acc, __m512 * y) {
    const int b = j->group_bits[g];
    for (int v = 0; v < V; v++) {
        const __mmask16 mk = lane_mask(nc - 16 * v);
        const __m512 s = ld_stat(j->scales, j->sdtype, g * j->N + n0 + 16 * v, mk);
        __m512 c;
        if (j->zero == BIE_WQ_ZERO_SYM) c = _mm512_mul_ps(s, _mm512_set1_ps((float)(1 << (b - 1))));
        else if (j->zero == BIE_WQ_ZERO_CODE)
            c = _mm512_mul_ps(s, ld_stat(j->zeros, j->zdtype, g * j->N + n0 + 16 * v, mk));
        else c = ld_stat(j->zeros, j->zdtype, g * j->N + n0 + 16 * v, mk);
        for (int r = 0; r < MR; r++) {
            __m512 * a = &acc[r * V + v];
            y[r * V + v] = _mm512_fmadd_ps(s, *a, y[r * V + v]);
            y[r * V + v] = _mm512_fnmadd_ps(c, _mm512_set1_ps(j->xsum[(m0 + r) * j->G + g]), y[r * V + v]);
            *a = _mm512_setzero_ps();
        }
    }
}

AI void store_out(const __m512 * y, const int MR, const int V, int nc, float * out, size_t ldo) {
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < V; v++) {
            const __mmask16 mk = lane_mask(nc - 16 * v);
            if (mk) _mm512_mask_storeu_ps(out + r * ldo + 16 * v, mk, y[r * V + v]);
        }
}

// f32 path for MR rows and V vectors of columns (MR*V <= 4).
AI void gemv_f32_t(const struct cpu_wq_job * j, int64_t n0, int nc, int64_t m0, const int MR, const int V, float * out,
                   size_t ldo) {
    __m512 acc[4], y[4];
    for (int i = 0; i < MR * V; i++) acc[i] = y[i] = _mm512_setzero_ps();
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
                prefetch_block(j, blk + PF_BLOCKS, j->group_bits[j->blk_group[blk + PF_BLOCKS]], n0 + 16 * v);
            __m512i q[8];
            decode(j, blk, b, n0 + 16 * v, lane_mask(nc - 16 * v), q);
            for (int i = 0; i < 8; i++)
                for (int t = 0; t < 4; t++) {
                    const __m512 f = byte_f32(q[i], t);
                    for (int r = 0; r < MR; r++)
                        acc[r * V + v] = _mm512_fmadd_ps(f, _mm512_set1_ps(xb[r * j->ldx + 4 * i + t]), acc[r * V + v]);
                }
        }
    }
    flush(j, g, m0, MR, V, n0, nc, acc, y);
    store_out(y, MR, V, nc, out, ldo);
}

static void gemv_f32(const struct cpu_wq_job * j, int64_t n0, int nc, int64_t m0, int mr, float * out, size_t ldo) {
    const int w = 16 * (mr == 1 ? 4 : mr == 2 ? 2 : 1); // columns per call of the template
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

static inline int32_t ld32(const int8_t * p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

// int8 path (AVX512-VNNI) for MR rows and V vectors of columns (MR*V <= 4).
__attribute__((target("avx512vnni"))) AI void gemv_i8_t(const struct cpu_wq_job * j, int64_t n0, int nc, int64_t m0,
                                                        const int MR, const int V, float * out, size_t ldo) {
    __m512 acc[4], y[4];
    for (int i = 0; i < MR * V; i++) acc[i] = y[i] = _mm512_setzero_ps();
    int64_t g = j->blk_group[0];
    for (int64_t blk = 0; blk < j->nblk; blk++) {
        if (j->blk_group[blk] != g) {
            flush(j, g, m0, MR, V, n0, nc, acc, y);
            g = j->blk_group[blk];
        }
        const int b = j->group_bits[g];
        const int8_t * xb = j->xq + 32 * blk + m0 * j->ldx;
        for (int v = 0; v < V; v++) {
            if (blk + PF_BLOCKS < j->nblk)
                prefetch_block(j, blk + PF_BLOCKS, j->group_bits[j->blk_group[blk + PF_BLOCKS]], n0 + 16 * v);
            __m512i q[8];
            decode(j, blk, b, n0 + 16 * v, lane_mask(nc - 16 * v), q);
            __m512i ai[4];
            for (int r = 0; r < MR; r++) ai[r] = _mm512_setzero_si512();
            for (int i = 0; i < 8; i++)
                for (int r = 0; r < MR; r++)
                    ai[r] = _mm512_dpbusd_epi32(ai[r], q[i], _mm512_set1_epi32(ld32(xb + r * j->ldx + 4 * i)));
            for (int r = 0; r < MR; r++)
                acc[r * V + v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[r]),
                                                 _mm512_set1_ps(j->xd[(m0 + r) * j->nblk + blk]), acc[r * V + v]);
        }
    }
    flush(j, g, m0, MR, V, n0, nc, acc, y);
    store_out(y, MR, V, nc, out, ldo);
}

__attribute__((target("avx512vnni"))) static void gemv_i8(const struct cpu_wq_job * j, int64_t n0, int nc, int64_t m0,
                                                          int mr, float * out, size_t ldo) {
    const int w = 16 * (mr == 1 ? 4 : mr == 2 ? 2 : 1); // columns per call of the template
    for (int c = 0; c < nc; c += w) {
        const int cn = nc - c < w ? nc - c : w;
        switch (mr) {
        case 1: gemv_i8_t(j, n0 + c, cn, m0, 1, 4, out + c, ldo); break;
        case 2: gemv_i8_t(j, n0 + c, cn, m0, 2, 2, out + c, ldo); break;
        case 3: gemv_i8_t(j, n0 + c, cn, m0, 3, 1, out + c, ldo); break;
        default: gemv_i8_t(j, n0 + c, cn, m0, 4, 1, out + c, ldo); break;
        }
    }
}

static void dequant(const struct cpu_wq_job * j, int64_t n0, int nc, int64_t b0, int64_t b1, int64_t rmax, float * w,
                    size_t ldw) {
    for (int c = 0; c < nc; c += 16) {
        const __mmask16 mk = lane_mask(nc - c);
        for (int64_t blk = b0; blk < b1; blk++) {
            const int64_t g = j->blk_group[blk];
            const int b = j->group_bits[g];
            const __m512 s = ld_stat(j->scales, j->sdtype, g * j->N + n0 + c, mk);
            const __m512 z = j->zero == BIE_WQ_ZERO_SYM ? _mm512_set1_ps((float)(1 << (b - 1)))
                                                        : ld_stat(j->zeros, j->zdtype, g * j->N + n0 + c, mk);
            __m512i q[8];
            decode(j, blk, b, n0 + c, mk, q);
            for (int p = 0; p < 32; p++) {
                const int64_t r = 32 * blk + cpu_wq_order(b, p);
                if (r >= rmax) continue;
                const __m512 f = byte_f32(q[p / 4], p % 4);
                const __m512 v = j->zero == BIE_WQ_ZERO_OFFSET ? _mm512_sub_ps(_mm512_mul_ps(s, f), z)
                                                               : _mm512_mul_ps(s, _mm512_sub_ps(f, z));
                _mm512_mask_storeu_ps(w + (r - 32 * b0) * (int64_t)ldw + c, mk, v);
            }
        }
    }
}

const struct cpu_wq_kernels bie_cpu_wq_kernels_avx512 = {.lanes = 16, .gemv_f32 = gemv_f32, .dequant = dequant};
const struct cpu_wq_kernels bie_cpu_wq_kernels_avx512_vnni = {
    .lanes = 16, .gemv_f32 = gemv_f32, .gemv_i8 = gemv_i8, .dequant = dequant};
