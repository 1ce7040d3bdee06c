// SPDX-License-Identifier: Apache-2.0
// cpu-wq-simd.h: the kernels of the weight-only n-bit layer (cpu-wq.h has the layout), written once
// over the vectors of the file that includes it: cpu-wq-avx2.c (8 columns a vector) and
// cpu-wq-avx512.c (16). Include it only from those files, after they have defined
//   LANES                  columns per vector (an enum constant)
//   vf, vi, vmask          f32 and int32 vectors, and the lanes of a vector that hold columns
//   vmask mask_of(nc)      the first nc lanes (none for nc <= 0, all for nc >= LANES)
//   bool mask_any(m)       whether m holds a lane
//   vi ld_words(j, wrow, n0, m), vf ld_stat(p, dtype, off, m): a word row of qweight and a row of
//                          scales or zeros from column n0 (off) on, 0 outside m
//   void st_f32(p, m, v)   stores the lanes m of v at p
//   vi vi_srli(a, n), vi_slli(a, n): the 32-bit lanes shifted right (logical) and left by n
//   vf vf_set1(x), vf_fmadd(a, b, c), vf_fnmadd(a, b, c): a broadcast, a*b + c and c - a*b, fused
// and, where the ISA has a 16-entry permute of f32 lanes, WQ_LUT16 defined and
//   vf lut16_f32(a)        the f32 value of the low 4 bits of each lane of a
// (the other integer operations and the f32 products are GCC's vector arithmetic, which compiles to
// the ISA's own instructions). Each function here is inlined into the ISA's kernels,
// with the bits, rows and vectors made constants there.
//
// The products run in the block order of cpu_wq_order:
//   f32 path:  acc += f32(code) * x  per row of the block (its even and odd quads summed apart), then
//              per group
//              y += s * acc - c * xsum   (c = s*z, s*2^(b-1) or z by the zero form)
//   int8 path (cpu-wq-avx512.c): acc_i32 = sum of vpdpbusd(quad codes, 4 int8 activations) over the
//              block, acc += f32(acc_i32) * xd (the block's activation scale), then per group as above.
// Up to four rows of x share every decoded block; a call takes every vector of its columns in a
// block before the next block, so that each word row is read as one run of the call's columns.
#pragma once

#define WQ_INLINE __attribute__((always_inline)) static inline
#define WQ_PF_BLOCKS 4 // blocks ahead whose words are prefetched

// The lanes of vi as unsigned and signed 32-bit integers.
typedef uint32_t wq_u32 __attribute__((vector_size(sizeof(vi))));
typedef int32_t wq_i32 __attribute__((vector_size(sizeof(vi))));
WQ_INLINE vi vi_zero(void) { return (vi)(wq_u32){0}; }
WQ_INLINE vi vi_set1(uint32_t v) { return (vi)((wq_u32){0} + v); }
WQ_INLINE vf vi_to_f32(vi a) { return __builtin_convertvector((wq_i32)a, vf); }
WQ_INLINE vf vf_zero(void) { return (vf){0}; }

// Codes of b bits in row order: value v of the block at stream bit v*b (b constant after inlining).
WQ_INLINE void decode_generic(const vi * w, const int b, vi * q) {
    const vi m = vi_set1((1 << b) - 1);
    for (int i = 0; i < 8; i++) q[i] = vi_zero();
    for (int v = 0; v < 32; v++) {
        const int bit = v * b, wi = bit >> 5, sh = bit & 31;
        vi c = vi_srli(w[wi], sh);
        if (sh + b > 32) c |= vi_slli(w[wi + 1], 32 - sh);
        q[v >> 2] |= vi_slli(c & m, 8 * (v & 3));
    }
}

// The 8 quads of block blk for the LANES columns n0.. (lanes m). low4: the reader takes only the low 4
// bits of each byte (byte_f32 of codes of up to 4 bits through WQ_LUT16), so 4-bit codes need no mask.
WQ_INLINE void decode(const struct cpu_wq_job * j, int64_t blk, int b, int64_t n0, vmask m, vi * q, const bool low4) {
    const int64_t w0 = j->blk_word[blk];
    vi w[8];
    for (int i = 0; i < 8; i++) w[i] = i < b ? ld_words(j, w0 + i, n0, m) : vi_zero();
    switch (b) {
    case 8:
        for (int i = 0; i < 8; i++) q[i] = w[i];
        break;
    case 4: {
        const vi m4 = vi_set1(0x0F0F0F0F);
        for (int i = 0; i < 4; i++) {
            q[2 * i] = w[i];
            q[2 * i + 1] = vi_srli(w[i], 4);
            if (!low4) {
                q[2 * i] &= m4;
                q[2 * i + 1] &= m4;
            }
        }
        break;
    }
    case 2: {
        const vi m2 = vi_set1(0x03030303);
        for (int i = 0; i < 2; i++)
            for (int s = 0; s < 4; s++) q[4 * i + s] = vi_srli(w[i], 2 * s) & m2;
        break;
    }
    case 1: decode_generic(w, 1, q); break;
    case 3: decode_generic(w, 3, q); break;
    case 5: decode_generic(w, 5, q); break;
    case 6: decode_generic(w, 6, q); break;
    default: decode_generic(w, 7, q); break;
    }
}

WQ_INLINE void prefetch_block(const struct cpu_wq_job * j, int64_t blk, int b, int64_t n0) {
    if (blk >= j->nblk) return;
    const int64_t w0 = j->blk_word[blk];
    for (int i = 0; i < b; i++)
        if (w0 + i < j->rows) _mm_prefetch((const char *)(j->qw + (w0 + i) * j->N + n0), _MM_HINT_T0);
}

// Byte t of every lane of quad q as f32; small: the codes are of at most 4 bits, in the low 4 bits
// of each byte (the bits above may hold others, decode's low4), whose value is then the low 4 bits
// of the lane shifted by 8t (one permute instead of a mask and a conversion).
WQ_INLINE vf byte_f32(vi q, int t, bool small) {
#ifdef WQ_LUT16
    if (small) return lut16_f32(t ? vi_srli(q, 8 * t) : q);
#else
    (void)small;
#endif
    return vi_to_f32(t == 3 ? vi_srli(q, 24) : (vi)(vi_srli(q, 8 * t) & vi_set1(0xFF)));
}

// Whether the f32 readers of codes (byte_f32) take only the low 4 bits of each byte of a quad.
#ifdef WQ_LUT16
#define WQ_LOW4 true
#else
#define WQ_LOW4 false
#endif

// y[r][v] += s*acc - c*xsum[r][g]; acc = 0 (the end of group g). Vectors without columns are left.
WQ_INLINE void flush(const struct cpu_wq_job * j, int64_t g, int64_t m0, const int MR, const int V, int64_t n0, int nc,
                     vf * acc, vf * y) {
    const int b = j->group_bits[g];
    for (int v = 0; v < V; v++) {
        const vmask m = mask_of(nc - LANES * v);
        if (!mask_any(m)) continue;
        const vf s = ld_stat(j->scales, j->sdtype, g * j->N + n0 + LANES * v, m);
        vf c;
        if (j->zero == BIE_WQ_ZERO_SYM) c = s * vf_set1((float)(1 << (b - 1)));
        else if (j->zero == BIE_WQ_ZERO_CODE) c = s * ld_stat(j->zeros, j->zdtype, g * j->N + n0 + LANES * v, m);
        else c = ld_stat(j->zeros, j->zdtype, g * j->N + n0 + LANES * v, m);
        for (int r = 0; r < MR; r++) {
            vf * a = &acc[r * V + v];
            y[r * V + v] = vf_fmadd(s, *a, y[r * V + v]);
            y[r * V + v] = vf_fnmadd(c, vf_set1(j->xsum[(m0 + r) * j->G + g]), y[r * V + v]);
            *a = vf_zero();
        }
    }
}

// A block's products for vector v of the columns: acc[r*V + v] += the block's quads q (codes of b
// bits) against rows m0 + r of the activations, r < MR (the f32 or the int8 path).
typedef void (*wq_block_fn)(const struct cpu_wq_job * j, int64_t blk, int b, int64_t m0, const int MR, const int V,
                            const int v, const vi * q, vf * acc);

// (The f32 path sums a block's even and odd quads apart and then adds the two: two chains of
// dependent FMAs half as long.)
WQ_INLINE void f32_block_codes(const struct cpu_wq_job * j, int64_t blk, const bool small, int64_t m0, const int MR,
                               const int V, const int v, const vi * q, vf * acc) {
    const float * xb = j->xa + 32 * blk + m0 * j->ldx;
    vf p[4][2];
    for (int r = 0; r < MR; r++) p[r][0] = p[r][1] = vf_zero();
    for (int i = 0; i < 8; i++)
        for (int t = 0; t < 4; t++) {
            const vf f = byte_f32(q[i], t, small);
            for (int r = 0; r < MR; r++) p[r][i & 1] = vf_fmadd(f, vf_set1(xb[r * j->ldx + 4 * i + t]), p[r][i & 1]);
        }
    for (int r = 0; r < MR; r++) acc[r * V + v] += p[r][0] + p[r][1];
}
WQ_INLINE void f32_block(const struct cpu_wq_job * j, int64_t blk, int b, int64_t m0, const int MR, const int V,
                         const int v, const vi * q, vf * acc) {
    if (b <= 4) f32_block_codes(j, blk, true, m0, MR, V, v, q, acc);
    else f32_block_codes(j, blk, false, m0, MR, V, v, q, acc);
}

// Rows m0 .. m0+MR-1 of x against the columns n0 .. n0+nc (up to CPU_WQ_WIDE_VECS vectors) block by
// block, every vector of a block before the next block: each word row is read as one run of nc words,
// with the sums of the rows and vectors in memory (L1 and L2) instead of registers.
WQ_INLINE void gemv_t(const struct cpu_wq_job * j, int64_t n0, int nc, int64_t m0, const int MR, float * out,
                      size_t ldo, wq_block_fn block, const bool low4) {
    vf acc[4 * CPU_WQ_WIDE_VECS], y[4 * CPU_WQ_WIDE_VECS];
    const int nv = (nc + LANES - 1) / LANES;
    for (int i = 0; i < MR * nv; i++) acc[i] = y[i] = vf_zero();
    int64_t g = j->blk_group[0];
    for (int64_t blk = 0; blk < j->nblk; blk++) {
        if (j->blk_group[blk] != g) {
            flush(j, g, m0, MR, nv, n0, nc, acc, y);
            g = j->blk_group[blk];
        }
        const int b = j->group_bits[g];
        const int64_t pf = blk + WQ_PF_BLOCKS;
        const int pb = pf < j->nblk ? j->group_bits[j->blk_group[pf]] : 0;
        for (int v = 0; v < nv; v++) {
            if (pb) prefetch_block(j, pf, pb, n0 + LANES * v);
            vi q[8];
            decode(j, blk, b, n0 + LANES * v, mask_of(nc - LANES * v), q, low4);
            block(j, blk, b, m0, MR, nv, v, q, acc);
        }
    }
    flush(j, g, m0, MR, nv, n0, nc, acc, y);
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < nv; v++) {
            const vmask m = mask_of(nc - LANES * v);
            if (mask_any(m)) st_f32(out + r * ldo + LANES * v, m, y[r * nv + v]);
        }
}

// The columns n0 .. n0+nc of rows m0 .. m0+mr (mr 1..4) through gemv_t (MR a constant there).
WQ_INLINE void gemv_tiles(const struct cpu_wq_job * j, int64_t n0, int nc, int64_t m0, int mr, float * out, size_t ldo,
                          wq_block_fn block, const bool low4) {
    switch (mr) {
    case 1: gemv_t(j, n0, nc, m0, 1, out, ldo, block, low4); break;
    case 2: gemv_t(j, n0, nc, m0, 2, out, ldo, block, low4); break;
    case 3: gemv_t(j, n0, nc, m0, 3, out, ldo, block, low4); break;
    default: gemv_t(j, n0, nc, m0, 4, out, ldo, block, low4); break;
    }
}

static void gemv_f32(const struct cpu_wq_job * j, int64_t n0, int nc, int64_t m0, int mr, float * out, size_t ldo) {
    gemv_tiles(j, n0, nc, m0, mr, out, ldo, f32_block, WQ_LOW4);
}

static void dequant(const struct cpu_wq_job * j, int64_t n0, int nc, int64_t b0, int64_t b1, int64_t rmax, float * w,
                    size_t ldw) {
    for (int c = 0; c < nc; c += LANES) {
        const vmask m = mask_of(nc - c);
        for (int64_t blk = b0; blk < b1; blk++) {
            const int64_t g = j->blk_group[blk];
            const int b = j->group_bits[g];
            const vf s = ld_stat(j->scales, j->sdtype, g * j->N + n0 + c, m);
            const vf z = j->zero == BIE_WQ_ZERO_SYM ? vf_set1((float)(1 << (b - 1)))
                                                    : ld_stat(j->zeros, j->zdtype, g * j->N + n0 + c, m);
            vi q[8];
            decode(j, blk, b, n0 + c, m, q, WQ_LOW4);
            for (int p = 0; p < 32; p++) {
                const int64_t r = 32 * blk + cpu_wq_order(b, p);
                if (r >= rmax) continue;
                const vf f = byte_f32(q[p / 4], p % 4, b <= 4);
                const vf v = j->zero == BIE_WQ_ZERO_OFFSET ? s * f - z : s * (f - z);
                st_f32(w + (r - 32 * b0) * (int64_t)ldw + c, m, v);
            }
        }
    }
}
