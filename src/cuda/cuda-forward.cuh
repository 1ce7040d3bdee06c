// SPDX-License-Identifier: Apache-2.0
// cuda-forward.cuh: what the parts of the CUDA forward pass share (cuda-forward.cu gives the row
// layout of the GEMM operands): the packers' source (pack_src) and their launchers
// (cuda-pack-rows.cu: element by element and contiguous rows; cuda-pack-pixels.cu: pixels, im2col
// and the gather of x's rows by the GEMM), the row popcounts, and the weight-side terms of a
// zero-padded binary conv (cuda-conv-terms.cu).
#pragma once

#include "cuda-impl.cuh"
#include "cuda-ste.cuh"

struct pack_src {
    struct dview t;    // x [batch, C, H, W] or weight [O, C, kh, kw]
    struct dview bias; // [C] or data NULL
    struct dgeom g;
    int is_weight;
    int quant;
    struct dscale s;      // scale_a for x, scale_w for the weight
    uint32_t bias_period; // 0, or: rows hold several pixels, element k takes bias[k % bias_period]
};
// The packer source of a layer call's x (is_weight 0; bias_a, if any, added to x first).
static inline pack_src x_source(const struct bie_layer_call * c) {
    pack_src px;
    px.bias_period = 0;
    dview_make(&c->x, &px.t);
    px.bias.data = NULL;
    if (c->bias_a.data) dview_make(&c->bias_a, &px.bias);
    px.g = dgeom_make(c->g);
    px.is_weight = 0;
    px.quant = (int)c->quant;
    px.s = dscale_make(c, true);
    return px;
}

// bie_binarize_ste's outputs, written by pack_contiguous_rows<T, true, BIAS> (STE) instead of GEMM rows:
// rows of exactly K bits that start on whole bytes, `_ld` bytes apart, the sign bits in `bits` and
// the STE's pass bits in `mask` (either NULL: not written; binary x' only). The bits of a row's
// last byte that lie past K keep their content.
struct ste_out {
    uint8_t *bits, *mask;
    int64_t bits_ld, mask_ld;
};

// --- cuda-pack-rows.cu ----------------------------------------------------------------------------

// Launches pack_contiguous_rows for a float p.t (rows p.t.stride[0] elements apart); false for
// other dtypes. so: bie_binarize_ste's outputs instead of the GEMM rows `out` (NULL: none).
bool launch_contiguous(bie_context_t * ctx, const pack_src & p, int64_t rows, int64_t kbytes, uint8_t * out, int * pop,
                       cudaStream_t stream, const ste_out * so = NULL);
// Queues pack_rows (any view, element by element) or pack_int_rows (contiguous I8/S4 weight rows).
void launch_pack_rows(const pack_src & p, int64_t rows, int64_t kbytes, uint8_t * out, int * pop, cudaStream_t stream);
void launch_pack_int_rows(const pack_src & p, int64_t rows, int64_t kbytes, uint8_t * out, cudaStream_t stream);

// --- cuda-pack-pixels.cu --------------------------------------------------------------------------

// pop[r] = popc of the first K bits of row r, for the rows of one or two bit matrices in one
// launch (rows ld bytes apart, 4-byte aligned; bits past K may hold anything, as in a B1 weight
// used in place). A warp counts a row, 16 bytes per lane when the rows are 16-byte aligned. The
// counts are only epilogue terms, so a GEMM queued next may start under this kernel
// (griddep_launch_dependents; see gemm_epilogue.terms_last).
struct popc_rows {
    const uint8_t * p;
    int64_t rows, ld;
    int * pop;
};
constexpr popc_rows NO_ROWS = {NULL, 0, 0, NULL};
// Queues row_popcounts over one matrix (b.rows == 0) or two.
enum bie_status launch_row_popcounts(bie_context_t * ctx, cudaStream_t s, popc_rows a, popc_rows b, int64_t K,
                                     const char * what);
// A conv's float x goes first to pixel rows in a scratch buffer of pixel_scratch_bytes, whose
// implicit-GEMM rows are then copied, instead of the per-element pack_rows. Binary, with whole
// words of channels (C % 32 == 0): NHWC bits (C/8 bytes per pixel), copied as words by
// im2col_words; dense channels-last x (PIX_ROWS) is packed by pack_contiguous_rows over pixels,
// dense (h, w) planes (PIX_PLANES) by plane_bits. n-bit, any layout (PIX_CODES): int8 codes (C
// bytes per pixel) by bie_cuda_pixel_rows, copied by bie_cuda_im2col.
enum pixel_kind { PIX_NONE, PIX_ROWS, PIX_PLANES, PIX_CODES };
pixel_kind float_pixels(const pack_src & p);
bool ohwi_rows(const int64_t * st, int64_t C, int64_t kh, int64_t kw);
bool b1_weight_rows(const pack_src & p, int64_t rows);
size_t pixel_scratch_bytes(const pack_src & p);
bool word_pixels(const pack_src & p);
bool gatherable(const pack_src & p);
bool gather_fits(const pack_src & p);
enum bie_status gather_source(bie_context_t * ctx, cudaStream_t stream, const pack_src & p, uint8_t * scratch,
                              gemm_gather * gs);
enum bie_status pack_any(bie_context_t * ctx, cudaStream_t stream, const pack_src & p, int64_t rows, int64_t kbytes,
                         uint8_t * out, int * pop, uint8_t * scratch);

// --- cuda-conv-terms.cu ---------------------------------------------------------------------------

// The weight side of a zero-padded binary conv, in one launch, a block per output channel o of
// the B1 weight rows `w` (OHWI bit order, `ld` bytes apart; bits past K may hold anything):
//   copy (optional): row o into the GEMM operand, kbytes long, zeros past its K/8 bytes (K % 8 == 0);
//   tappop[o][t] = popc of the row over bits [t*C, (t+1)*C) (in shared memory when there are at most
//     WT_SMEM_TAPS taps, else in tappop);
//   colpop[o] (optional) = popc of its first K bits, the sum over its taps;
//   tapcorr[p][o] = 2 * the sum of tappop[o][t] over the taps t = (i, j) that lie outside the image
//     for the pixels of border class p (a tap is outside when its row or its column is);
//   colcls[p][o] = BIE_DOT_BIAS - 2 popc(row) + tapcorr[p][o] (gemm_epilogue.colcls; rows of
//     colcls_ld ints, block o also clears columns N + o, N + o + N, ... below colcls_ld);
//   pixcls (optional) = gemm_epilogue.pixcls, the blocks taking the output pixels in turn.
// (One launch rather than one each for the row copy and its clearing, the row popcounts, the tap
// popcounts and the corrections: each would be a few microseconds of almost no work.)
constexpr int WT_SMEM_TAPS = 2048, WT_SMEM_ROW = 4096; // (bytes of a weight row staged in shared memory)
struct weight_terms_args {
    const uint8_t * w;
    int64_t ld;
    uint8_t * copy; // NULL: no copy
    int64_t kbytes;
    int *tappop, *colpop, *tapcorr, *colcls; // (tappop: NULL for at most WT_SMEM_TAPS taps)
    int colcls_ld;
    int2 * pixcls; // NULL: not written
    struct dgeom g;
    int border[4]; // top, bottom, left, right class counts (border_counts)
};
// Queues weight_terms (N blocks); under_prev: as a programmatic dependent launch of the kernel
// queued before it (sm_90 and later).
enum bie_status launch_weight_terms(bie_context_t * ctx, const weight_terms_args & a, int64_t N, int taps, int64_t K,
                                    bool under_prev);
// How many of the O output rows (or columns) have taps before the image (*lo: o*s - p < 0) and
// how many have taps past its end (*hi: o*s - p + (k-1)*d >= I); the others have none.
void border_counts(int64_t O, int64_t I, int64_t s, int64_t p, int64_t k, int64_t d, int * lo, int * hi);
