// SPDX-License-Identifier: Apache-2.0
// cpu-nbit.c: 4-bit and 8-bit linear / conv2d forward as an int16 GEMM (vpmaddwd: exact int32
// pair sums, no VNNI needed).
//   a = clamp(rne((x + bias_a) / scale_a), lo, hi),  w = clamp(rne(W / scale_w), lo, hi)
//   (I8 weights: the codes, clamped; S4: the codes);  acc[m, o] = sum_{t,c} a_pad(m,t,c) * w[o,t,c]
// with zero padding (n-bit convs always pad with 0, which is the code 0 in the im2col rows).
// Steps: x -> codes NHWC (xq, int16), weight -> code rows (OHWI), im2col rows -> A, tiled GEMM
// with the output transform fused per tile. Where the ISA has an outer-product tile for the layer's
// codes (the AVX-512 levels without VNNI: int16 for 8-bit layers, bytes for 4-bit ones) and the
// layer has enough rows, A and B are interleaved panels (cpu-impl.h: pairs of int16 codes, quads of
// bytes) and the GEMM is blocked over K (outer_gemm below); otherwise plain rows for the
// dot-product tiles. The int16 outer tile's weight panels are not stored whole: B holds the weight
// as rows of int8 codes (an I8 weight whose code rows are contiguous is read in place, nothing
// packed), and outer_gemm widens one block of 32 rows at a time into the interleaved int16 layout
// just before the tiles use it, so the int16 panels (twice the bytes) never go to memory.
#include "cpu/cpu-impl.h"

#include <omp.h>

struct nbit_plan {
    const struct bie_layer_call * c;
    const struct cpu_kernels * kern;
    int lo, hi;
    int64_t Kp, M, N, Mp, Np;
    bool bytes;              // byte panels: a + off (unsigned) times w (signed); else int16 panels
    cpu_outer_tile_fn outer; // the outer-product tile on interleaved panels, or NULL: plain rows
    bool widen;              // the int16 outer tile: B is int8 code rows, widened per block (outer_gemm)
    bool own_a;              // outer tile, many m-tiles: each task packs its activation panels (outer_gemm)
    int64_t esz;             // bytes per code in A: 1 (byte panels) or 2
    int64_t wesz;            // bytes per code in B: 1 (byte panels, widen) or 2
    int off;                 // 8 (4-bit) or 128 (8-bit, only with an exact u8 x s8 tile)
    int16_t * xq;
    void * A;
    void * B;
    const int8_t * wq; // widen: the code rows (B, or the weight itself), row stride ldw bytes
    ptrdiff_t ldw;
    int32_t * sumw; // [Np] sum_k w (4-bit)
    int16_t * rows; // per thread: the stage of a row's or a panel's rows (staged() below)
    struct cpu_epilogue ep;
};

// f32 NCHW x with whole contiguous planes is quantised plane by plane, XQ_PLANES channels of a
// sample at a time (each plane read sequentially, instead of a row of every channel in turn, which
// reads as many streams as channels), into the
// thread's stage of XQ_PLANES planes, then written to NHWC a pixel's run of channels at a time (by
// register transposes where the table has planes_to_rows).
#define XQ_PLANES 32

static bool x_planes(const struct bie_layer_call * c) {
    const int64_t * xs = c->x.stride;
    return c->x.dtype == BIE_DTYPE_F32 && xs[1] != 1 && xs[3] == 1 && (c->g.H == 1 || xs[2] == c->g.W);
}

// int16 elements of a thread's stage for quantize_x.
static size_t x_stage(const struct bie_layer_call * c) {
    const struct bie_geometry * g = &c->g;
    if (!x_planes(c)) return cpu_round_up((size_t)g->W, 32);
    return (size_t)(g->C < XQ_PLANES ? g->C : XQ_PLANES) * cpu_round_up((size_t)(g->H * g->W), 32);
}

static void quantize_x(const struct nbit_plan * pl, const float * bias, int threads, int16_t * tmp_ws) {
    const struct bie_layer_call * c = pl->c;
    const struct bie_geometry * g = &c->g;
    const struct bie_tensor * x = &c->x;
    const int64_t * xs = x->stride;
    const int64_t C = g->C, H = g->H, W = g->W, NH = g->batch * H;
    const float sa = c->scale_a;
    if (x->dtype == BIE_DTYPE_F32 && xs[1] == 1) {
#pragma omp parallel for num_threads(threads)
        for (int64_t nh = 0; nh < NH; nh++)
            for (int64_t w = 0; w < W; w++) {
                const float * src = (const float *)x->data + (nh / H) * xs[0] + (nh % H) * xs[2] + w * xs[3];
                pl->kern->quantize(src, bias, 0.0f, C, sa, pl->lo, pl->hi, pl->xq + (nh * W + w) * C);
            }
    } else if (x_planes(c)) {
        const int64_t HW = H * W, ldt = (int64_t)cpu_round_up((size_t)HW, 32);
        const int64_t groups = (C + XQ_PLANES - 1) / XQ_PLANES;
#pragma omp parallel for num_threads(threads)
        for (int64_t t = 0; t < g->batch * groups; t++) {
            int16_t * tmp = tmp_ws + (size_t)omp_get_thread_num() * x_stage(c);
            const int64_t n = t / groups, c0 = t % groups * XQ_PLANES, cn = C - c0 < XQ_PLANES ? C - c0 : XQ_PLANES;
            for (int64_t j = 0; j < cn; j++)
                pl->kern->quantize((const float *)x->data + n * xs[0] + (c0 + j) * xs[1], NULL,
                                   bias ? bias[c0 + j] : 0.0f, HW, sa, pl->lo, pl->hi, tmp + j * ldt);
            int16_t * dst = pl->xq + n * HW * C + c0;
            int64_t p = 0;
            if (cn == XQ_PLANES && pl->kern->planes_to_rows) {
                p = HW / 16 * 16;
                pl->kern->planes_to_rows(tmp, (size_t)ldt, (size_t)p, dst, (size_t)C);
            }
            for (; p < HW; p++)
                for (int64_t j = 0; j < cn; j++) dst[p * C + j] = tmp[j * ldt + p];
        }
    } else if (x->dtype == BIE_DTYPE_F32 && xs[3] == 1) {
#pragma omp parallel for num_threads(threads)
        for (int64_t nh = 0; nh < NH; nh++) {
            int16_t * tmp = tmp_ws + (size_t)omp_get_thread_num() * cpu_round_up((size_t)W, 32);
            const float * src = (const float *)x->data + (nh / H) * xs[0] + (nh % H) * xs[2];
            int16_t * dst = pl->xq + nh * W * C;
            for (int64_t ch = 0; ch < C; ch++) {
                pl->kern->quantize(src + ch * xs[1], NULL, bias ? bias[ch] : 0.0f, W, sa, pl->lo, pl->hi, tmp);
                for (int64_t w = 0; w < W; w++) dst[w * C + ch] = tmp[w];
            }
        }
    } else {
#pragma omp parallel for num_threads(threads)
        for (int64_t nh = 0; nh < NH; nh++)
            for (int64_t w = 0; w < W; w++) {
                const int64_t off = (nh / H) * xs[0] + (nh % H) * xs[2] + w * xs[3];
                int16_t * d = pl->xq + (nh * W + w) * C;
                for (int64_t ch = 0; ch < C; ch++)
                    d[ch] = (int16_t)cpu_quantize1(cpu_load(x, off + ch * xs[1]) + (bias ? bias[ch] : 0.0f), sa, pl->lo,
                                                   pl->hi);
            }
    }
}

// Row r of Kp codes of esz bytes (bytes or int16 codes) from base.
static void * panel_row(const struct nbit_plan * pl, void * base, int64_t r, int64_t esz) {
    return (uint8_t *)base + r * pl->Kp * esz;
}

// A thread's stage (outer panels): the packed rows of one panel before they are interleaved, after
// a row of Kp int16 codes for byte rows (the codes of one row on their way to bytes).
static void * staged(const struct nbit_plan * pl, int16_t * stage, int64_t r, int64_t esz) {
    return panel_row(pl, esz == 1 ? stage + pl->Kp : stage, r, esz);
}

// The codes of one weight tap (C channels from element offset off, channel stride ws1).
static void weight_codes(const struct nbit_plan * pl, int64_t off, int16_t * d) {
    const struct bie_layer_call * c = pl->c;
    const struct bie_tensor * w = &c->weight;
    const int64_t C = c->g.C, ws1 = w->stride[1];
    if (w->dtype == BIE_DTYPE_F32 && ws1 == 1) {
        pl->kern->quantize((const float *)w->data + off, NULL, 0.0f, C, c->scale_w, pl->lo, pl->hi, d);
    } else if (w->dtype == BIE_DTYPE_I8 && ws1 == 1) {
        const int8_t * src = (const int8_t *)w->data + off;
        const int16_t lo = (int16_t)pl->lo, hi = (int16_t)pl->hi;
        for (int64_t ch = 0; ch < C; ch++) { // branch-free (vectorised by the compiler)
            const int16_t v = src[ch];
            d[ch] = v < lo ? lo : v > hi ? hi : v;
        }
    } else if (w->dtype == BIE_DTYPE_S4 && ws1 == 1 && off % 2 == 0) {
        const uint8_t * src = (const uint8_t *)w->data + off / 2; // element 2i: high nibble of byte i
        for (int64_t i = 0; i < C / 2; i++) {
            d[2 * i] = (int16_t)((int8_t)src[i] >> 4);
            d[2 * i + 1] = (int16_t)((int8_t)(uint8_t)(src[i] << 4) >> 4);
        }
        if (C % 2) d[C - 1] = (int16_t)((int8_t)src[C / 2] >> 4);
    } else {
        const bool is_float = bie_dtype_is_float(w->dtype);
        for (int64_t ch = 0; ch < C; ch++) {
            const float v = cpu_load(w, off + ch * ws1);
            int q;
            if (is_float) q = cpu_quantize1(v, c->scale_w, pl->lo, pl->hi);
            else q = v < (float)pl->lo ? pl->lo : v > (float)pl->hi ? pl->hi : (int)v;
            d[ch] = (int16_t)q;
        }
    }
}

// Each column (output channel) as a row of Kp codes: int16, or signed bytes with their sum (sumw).
static void pack_weights(const struct nbit_plan * pl, int threads) {
    const struct bie_geometry * g = &pl->c->g;
    const int64_t * ws = pl->c->weight.stride;
    const int64_t C = g->C, T = g->kh * g->kw, Kp = pl->Kp, wesz = pl->wesz;
    const bool panels = pl->outer && !pl->widen;
    const int64_t step = panels ? CPU_OUTER_NR : 1; // columns per panel
#pragma omp parallel for num_threads(threads)
    for (int64_t o0 = 0; o0 < pl->Np; o0 += step)
        for (int64_t o = o0; o < o0 + step; o++) {
            int16_t * stage = pl->rows + (size_t)omp_get_thread_num() * (size_t)(step * Kp);
            void * dst = panels ? staged(pl, stage, o - o0, wesz) : panel_row(pl, pl->B, o, wesz);
            int16_t * row = wesz == 1 ? stage : dst; // the int16 codes
            memset(row, 0, (size_t)Kp * sizeof(int16_t));
            for (int64_t t = 0; o < g->O && t < T; t++)
                weight_codes(pl, o * ws[0] + (t / g->kw) * ws[2] + (t % g->kw) * ws[3], row + t * C);
            if (wesz == 1) { // Kp is a local: the byte stores could alias pl, which would keep this scalar
                int8_t * d = dst;
                int32_t sum = 0;
                for (int64_t k = 0; k < Kp; k++) {
                    d[k] = (int8_t)row[k];
                    sum += row[k];
                }
                pl->sumw[o] = sum;
            }
            if (panels && o == o0 + step - 1)
                pl->kern->interleave_nr(staged(pl, stage, 0, wesz), (size_t)(Kp * wesz / 2),
                                        panel_row(pl, pl->B, o0, wesz));
        }
}

// Each output pixel's im2col row of Kp codes: int16, or unsigned bytes code + off.
// pack_panel: rows m0 .. m0+step-1 (a panel of the outer tile, or one row) at base, on the calling thread.
static void pack_panel(const struct nbit_plan * pl, int64_t m0, int64_t step, void * base) {
    const struct bie_geometry * g = &pl->c->g;
    const int64_t P = g->OH * g->OW, C = g->C, T = g->kh * g->kw, Kp = pl->Kp;
    int16_t * stage = pl->rows + (size_t)omp_get_thread_num() * (size_t)((pl->outer ? CPU_OUTER_NR : 1) * Kp);
    for (int64_t m = m0; m < m0 + step; m++) {
        void * dst = pl->outer ? staged(pl, stage, m - m0, pl->esz) : panel_row(pl, base, m - m0, pl->esz);
        int16_t * row = pl->bytes ? stage : dst; // the int16 codes
        if (m >= pl->M) {
            memset(dst, 0, (size_t)(Kp * pl->esz));
        } else {
            const int64_t n = m / P, p = m % P, oh = p / g->OW, ow = p % g->OW;
            for (int64_t t = 0; t < T; t++) {
                const int64_t ih = oh * g->sh - g->ph + (t / g->kw) * g->dh;
                const int64_t iw = ow * g->sw - g->pw + (t % g->kw) * g->dw;
                int16_t * d = row + t * C;
                if (ih < 0 || ih >= g->H || iw < 0 || iw >= g->W) memset(d, 0, (size_t)C * sizeof(int16_t));
                else memcpy(d, pl->xq + ((n * g->H + ih) * g->W + iw) * C, (size_t)C * sizeof(int16_t));
            }
            if (pl->bytes) { // a + off on the K codes, 0 on the row padding (which w also has as 0)
                uint8_t * d = dst;
                const int off = pl->off; // a local: the byte stores could alias pl
                for (int64_t k = 0; k < T * C; k++) d[k] = (uint8_t)(row[k] + off);
                memset(d + T * C, 0, (size_t)(Kp - T * C));
            } else {
                memset(row + T * C, 0, (size_t)(Kp - T * C) * sizeof(int16_t));
            }
        }
    }
    if (pl->outer)
        pl->kern->interleave_mr(staged(pl, stage, 0, pl->esz), (size_t)(Kp * pl->esz), (size_t)(Kp * pl->esz / 4),
                                base);
}

static void pack_activations(const struct nbit_plan * pl, int threads) {
    const int64_t step = pl->outer ? CPU_OUTER_MR : 1; // rows per panel
#pragma omp parallel for num_threads(threads)
    for (int64_t m0 = 0; m0 < pl->Mp; m0 += step) pack_panel(pl, m0, step, panel_row(pl, pl->A, m0, pl->esz));
}

static void finish_tile(void * vpl, int64_t m0, int64_t mc, int64_t n0, int64_t nc, int32_t * acc, size_t ldacc) {
    const struct nbit_plan * pl = vpl;
    if (pl->bytes)
        for (int64_t r = 0; r < mc; r++)
            for (int64_t o = 0; o < nc; o++)
                acc[(size_t)r * ldacc + (size_t)o] -= (int32_t)((uint32_t)pl->off * (uint32_t)pl->sumw[n0 + o]);
    cpu_epilogue_store(&pl->ep, m0, mc, n0, nc, acc, ldacc);
}

// The GEMM on interleaved panels, in tasks of up to OUTER_MT rows by nt columns (one int32 tile
// per task, finished by the epilogue once all of K is in). K runs in blocks of OUTER_KC codes: a
// block of a weight panel (32 columns x OUTER_KC codes: 32 KB of int16, 16 KB of bytes) stays in
// L1 while every activation panel of the task passes over it, so the weights stream from memory
// once per OUTER_MT rows of M. With widen, the int16 block is made from the int8 code rows (16
// KB) right there, in the thread's block buffer after its tile.
// The blocks' int32 sums are added (wrapping, as one long sum would).
#define OUTER_MT 256 // a multiple of CPU_OUTER_MR
#define OUTER_NT 64  // a multiple of CPU_OUTER_NR
#define OUTER_KC 512 // a multiple of 32 (codes per widened block step: 16 pairs)
#define OUTER_TILE ((size_t)OUTER_MT * OUTER_NT * sizeof(int32_t))
#define OUTER_BLOCK ((size_t)CPU_OUTER_NR * OUTER_KC * sizeof(int16_t))

// Per thread: the int32 tile, the widened weight block and, with own_a, the activation panels of
// an m-tile (OUTER_MT rows of Kp codes).
static size_t outer_thread_bytes(const struct nbit_plan * pl) {
    return OUTER_TILE + OUTER_BLOCK + (pl->own_a ? (size_t)(OUTER_MT * pl->Kp * pl->esz) : 0);
}

// Part `part` of `parts` of a block's int8 code rows (nr rows of kn codes from w, row stride ld)
// prefetched into L2 while the block before it is in use, so that widening it does not wait on memory.
static void prefetch_rows(const int8_t * w, ptrdiff_t ld, int64_t nr, int64_t kn, int64_t part, int64_t parts) {
    for (int64_t r = part; r < nr; r += parts) {
        for (int64_t k = 0; k < kn; k += 64) __builtin_prefetch(w + r * ld + k, 0, 2);
        __builtin_prefetch(w + r * ld + kn - 1, 0, 2);
    }
}

// Columns n0 .. n0+nc-1 (nc <= nt) of rows m0 .. m0+mc-1, whose activation panels start at a.
static void outer_columns(const struct nbit_plan * pl, const uint8_t * a, int64_t m0, int64_t mc, int64_t n0,
                          int64_t nc, int64_t nt, int32_t * acc, int16_t * block) {
    const int64_t Kp = pl->Kp, esz = pl->esz, unit = 4 / esz; // codes per 32-bit unit
    for (int64_t k0 = 0; k0 < Kp; k0 += OUTER_KC) {
        const int64_t kn = Kp - k0 < OUTER_KC ? Kp - k0 : OUTER_KC;
        for (int64_t j = 0; j < nc; j += CPU_OUTER_NR) {
            const uint8_t * b = (const uint8_t *)block;
            const int8_t * next = NULL; // widen: the next block of code rows (nrn x knn)
            int64_t nrn = 0, knn = 0;
            if (pl->widen) {
                const int64_t nr = pl->N - n0 - j < CPU_OUTER_NR ? pl->N - n0 - j : CPU_OUTER_NR;
                pl->kern->widen_nr(pl->wq + (n0 + j) * pl->ldw + k0, pl->ldw, (int)nr, (size_t)kn / 2, block);
                const int64_t jn = j + CPU_OUTER_NR < nc ? j + CPU_OUTER_NR : 0, kn0 = jn ? k0 : k0 + kn;
                if (kn0 < Kp) {
                    next = pl->wq + (n0 + jn) * pl->ldw + kn0;
                    nrn = pl->N - n0 - jn < CPU_OUTER_NR ? pl->N - n0 - jn : CPU_OUTER_NR;
                    knn = Kp - kn0 < OUTER_KC ? Kp - kn0 : OUTER_KC;
                }
            } else {
                b = (const uint8_t *)pl->B + ((n0 + j) * Kp + k0 * CPU_OUTER_NR) * esz;
            }
            for (int64_t i = 0; i < mc; i += CPU_OUTER_MR) {
                if (next)
                    prefetch_rows(next, pl->ldw, nrn, knn, i / CPU_OUTER_MR, (mc + CPU_OUTER_MR - 1) / CPU_OUTER_MR);
                pl->outer(a + (i * Kp + k0 * CPU_OUTER_MR) * esz, b, (size_t)(kn / unit), k0 > 0, acc + i * nt + j,
                          (size_t)nt);
            }
        }
    }
    finish_tile((void *)pl, m0, mc, n0, nc, acc, (size_t)nt);
}

// Tasks of one m-tile by nt columns; with own_a, a task is a whole m-tile (every column tile in
// turn against its activation panels, packed first into the thread's buffer, so the panels of a
// long M never go through memory).
static void outer_gemm(const struct nbit_plan * pl, int threads, void * tiles) {
    const int64_t mtiles = (pl->M + OUTER_MT - 1) / OUTER_MT;
    int64_t nt = OUTER_NT;
    if (mtiles * ((pl->N + nt - 1) / nt) < 2 * threads) nt = CPU_OUTER_NR; // small layers: more tasks
    const int64_t ntiles = (pl->N + nt - 1) / nt, tasks = pl->own_a ? mtiles : mtiles * ntiles;
    const bool n_major = pl->N > pl->M; // consecutive tasks share the larger operand's panels
    const int64_t Kp = pl->Kp, esz = pl->esz;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t mt = pl->own_a ? t : n_major ? t % mtiles : t / ntiles;
        const int64_t nt0 = pl->own_a ? 0 : n_major ? t / mtiles : t % ntiles, nt1 = pl->own_a ? ntiles : nt0 + 1;
        const int64_t m0 = mt * OUTER_MT, mc = pl->M - m0 < OUTER_MT ? pl->M - m0 : OUTER_MT;
        uint8_t * ws = (uint8_t *)tiles + (size_t)omp_get_thread_num() * outer_thread_bytes(pl);
        const uint8_t * a = (const uint8_t *)pl->A + m0 * Kp * esz;
        if (pl->own_a) {
            uint8_t * own = ws + OUTER_TILE + OUTER_BLOCK;
            for (int64_t i = 0; i < mc; i += CPU_OUTER_MR) pack_panel(pl, m0 + i, CPU_OUTER_MR, own + i * Kp * esz);
            a = own;
        }
        for (int64_t ntile = nt0; ntile < nt1; ntile++) {
            const int64_t n0 = ntile * nt, nc = pl->N - n0 < nt ? pl->N - n0 : nt;
            outer_columns(pl, a, m0, mc, n0, nc, nt, (int32_t *)ws, (int16_t *)(ws + OUTER_TILE));
        }
    }
}

#define CPU_OUTER_MIN_M 64

enum bie_status bie_cpu_nbit_forward(bie_context_t * ctx, const struct bie_layer_call * c) {
    const struct bie_geometry * g = &c->g;
    struct nbit_plan pl = {.c = c, .kern = bie_cpu_kernels(ctx->isa)};
    const int threads = cpu_threads(ctx);
    pl.lo = bie_quant_lo(c->quant);
    pl.hi = bie_quant_hi(c->quant);
    pl.bytes = c->quant == BIE_QUANT_INT4 || pl.kern->u8s8_exact;
    pl.M = g->batch * g->OH * g->OW;
    pl.esz = pl.bytes ? 1 : 2;
    // The outer-product tile pays for its interleaved weight panel over many rows only: with a few
    // rows the dot-product tile stays.
    if (pl.M >= CPU_OUTER_MIN_M)
        pl.outer = c->quant == BIE_QUANT_INT4 ? pl.kern->u4s4_outer_tile : pl.bytes ? NULL : pl.kern->i16_outer_tile;
    pl.widen = pl.outer && !pl.bytes;
    // Enough m-tiles for every thread: a task packs its own activation panels (outer_gemm).
    pl.own_a = pl.outer && (pl.M + OUTER_MT - 1) / OUTER_MT >= 2 * threads;
    pl.wesz = pl.bytes || pl.widen ? 1 : 2;
    pl.off = c->quant == BIE_QUANT_INT4 ? 8 : 128;
    pl.Kp = (int64_t)cpu_round_up((size_t)g->K, pl.bytes ? CPU_K4_ALIGN : CPU_K16_ALIGN);
    const size_t esz = (size_t)pl.esz;
    pl.N = g->O;
    pl.Mp = (int64_t)cpu_round_up((size_t)pl.M, pl.outer ? CPU_OUTER_MR : CPU_MR);
    pl.Np = (int64_t)cpu_round_up((size_t)pl.N, pl.outer ? CPU_OUTER_NR : 8);
    cpu_epilogue_init(&pl.ep, c, pl.kern);
    // An I8 weight whose K codes per output channel are contiguous (taps of C channels one after
    // the other) and need no padding is read in place: its codes are its values (the 8-bit clamp
    // is the int8 range).
    const struct bie_tensor * w = &c->weight;
    const bool in_place = pl.widen && w->dtype == BIE_DTYPE_I8 && pl.lo == INT8_MIN && pl.hi == INT8_MAX &&
                          g->K == pl.Kp && w->stride[1] == 1 && (g->kw == 1 || w->stride[3] == g->C) &&
                          (g->kh == 1 || w->stride[2] == g->kw * g->C);

    const size_t sz_xq = (size_t)(g->batch * g->H * g->W * g->C) * sizeof(int16_t);
    const size_t sz_tmp = (size_t)threads * x_stage(c) * sizeof(int16_t);
    const size_t sz_a = pl.own_a ? 0 : (size_t)(pl.Mp * pl.Kp) * esz;
    const size_t sz_b = in_place ? 0 : (size_t)(pl.Np * pl.Kp * pl.wesz);
    const size_t sz_sumw = (size_t)pl.Np * sizeof(int32_t);
    // the stage: CPU_OUTER_NR >= CPU_OUTER_MR rows of int16 (>= a row of int16 and the bytes of a panel)
    const size_t rows_per_thread = pl.outer ? CPU_OUTER_NR : pl.bytes ? 1 : 0;
    const size_t sz_rows = (size_t)threads * rows_per_thread * (size_t)pl.Kp * sizeof(int16_t);
    const size_t sz_bias = (size_t)g->C * sizeof(float);
    const size_t sz_tiles = pl.outer ? (size_t)threads * outer_thread_bytes(&pl) : cpu_gemm_workspace(threads);
    const size_t total = cpu_arena_size(sz_xq) + cpu_arena_size(sz_tmp) + cpu_arena_size(sz_a) + cpu_arena_size(sz_b) +
                         cpu_arena_size(sz_bias) + cpu_arena_size(sz_tiles) + cpu_arena_size(sz_sumw) +
                         cpu_arena_size(sz_rows);
    void * ws;
    enum bie_status st = bie_host_workspace(ctx, total, &ws);
    if (st != BIE_STATUS_OK) return st;
    struct cpu_arena ar = {.base = ws, .used = 0, .cap = total};
    pl.xq = cpu_arena_take(&ar, sz_xq);
    int16_t * tmp = cpu_arena_take(&ar, sz_tmp);
    pl.A = cpu_arena_take(&ar, sz_a);
    pl.B = cpu_arena_take(&ar, sz_b);
    float * bias = cpu_arena_take(&ar, sz_bias);
    void * tiles = cpu_arena_take(&ar, sz_tiles);
    pl.sumw = cpu_arena_take(&ar, sz_sumw);
    pl.rows = cpu_arena_take(&ar, sz_rows);

    if (c->bias_a.data) cpu_bias_dense(&c->bias_a, g->C, bias);
    quantize_x(&pl, c->bias_a.data ? bias : NULL, threads, tmp);
    if (in_place) {
        pl.wq = w->data;
        pl.ldw = (ptrdiff_t)w->stride[0];
    } else {
        pack_weights(&pl, threads);
        pl.wq = pl.B;
        pl.ldw = (ptrdiff_t)pl.Kp;
    }
    if (!pl.own_a) pack_activations(&pl, threads);

    if (pl.outer) {
        outer_gemm(&pl, threads, tiles);
        return BIE_STATUS_OK;
    }
    const struct cpu_gemm job = {
        .kern = pl.kern,
        .kind = pl.bytes ? 4 : 16,
        .a = pl.A,
        .b = pl.B,
        .lda = (size_t)pl.Kp,
        .ldb = (size_t)pl.Kp,
        .k = (size_t)pl.Kp,
        .M = pl.M,
        .N = pl.N,
        .finish = finish_tile,
        .finish_ctx = &pl,
    };
    cpu_gemm_run(&job, threads, tiles, true);
    return BIE_STATUS_OK;
}
