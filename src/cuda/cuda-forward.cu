// SPDX-License-Identifier: Apache-2.0
// cuda-forward.cu: the forward pass of every layer on CUDA tensors: operands are packed into the
// workspace (activations binarized or quantized and laid out as implicit-GEMM rows; weights
// likewise), then the tensor-core GEMM (cuda-gemm.cu) runs with the epilogue fused.
//
// Row layout (both operands): row m of A is output position (n, oh, ow) of the conv (a linear
// layer is a conv with 1x1 images), row o of B is output channel o; position k of a row is
// (tap t = i*kw + j, channel c) with k = t*C + c (channels fastest, NHWC order). Rows are padded
// with zeros to a multiple of 128 bytes.
//   binary: bit = (x' >= 0) with x' = f32(x) + f32(bias_a[c]) (NaN -> 0), a B1 x is copied as is;
//           a tap outside the image holds the pad value's bit (PLUS_ONE -> 1, MINUS_ONE -> 0,
//           ZERO -> 0 and the GEMM epilogue removes the tap, see cuda-gemm.cu); rowpop = popc(row)
//   n-bit:  int8 code clamp(rne(x'/scale_a), lo, hi) (NaN -> lo), 0 outside the image;
//           weights clamp(rne(W/scale_w)), an I8 weight clamped, an S4 weight as its code.
// Also bie_binarize_ste (at the end): the packer of a linear layer's float rows writes, in the same
// pass over x, the sign bits and the STE mask bits that the backward takes instead of x.
//
// The packers are in cuda-pack-rows.cu and cuda-pack-pixels.cu, the conv terms in
// cuda-conv-terms.cu (cuda-forward.cuh declares what they share).
#include "cuda-forward.cuh"

#include <stdio.h>

namespace {

// bie_binarize_ste on views the packer does not take: for element e = m*K + k of x [M, K] (p.t's
// [M, K, 1, 1] view), the codes of its sign bit and of its STE pass bit (1 or 0; either array may
// be NULL), for bie_cuda_store_packed.
// With a clamp t > 0 (bie_binarize_ste_clamped) x' is that of clamp(x, -t, t), and cmask gets the
// codes of 1{|x| < t}.

__global__ void ste_codes(pack_src p, int64_t n, float t, int8_t * bits, int8_t * mask, int8_t * cmask) {
    const float s = ld_scale(p.s);
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = qdiv(e, p.g.K), k = e - m * p.g.K;
        const float a = ld_float(p.t.data, p.t.dtype, m * p.t.stride[0] + k * p.t.stride[1]);
        float v = t > 0.0f ? clamp_in(a, t) : a;
        if (p.bias.data) v = __fadd_rn(v, ld_float(p.bias.data, p.bias.dtype, k * p.bias.stride[3]));
        if (bits) bits[e] = v >= 0.0f ? 1 : 0;
        if (mask) mask[e] = ste_passes(v, s, BIE_QUANT_BINARY, 0, 0) ? 1 : 0;
        if (cmask) cmask[e] = clamp_open(a, t) ? 1 : 0;
    }
}

// bie_binarize_ste_clamped on dense rows (x [M, K] rows K apart, K % 8 == 0, 16-byte aligned; each
// output's bytes dense in the same order): a thread per 8 elements reads them once and writes one
// byte of each output, with ste_codes' arithmetic. BIN_S: ste_division_free(BINARY, scale_a), the
// STE test without a division (ste_clamped8 takes the loop of its scale as a whole, so that no
// element computes the quotient where none is needed).
template <typename T, bool BIN_S>
__device__ __forceinline__ void ste_clamped8_loop(const T * x, int64_t n8, int64_t K, const struct dview & bias,
                                                  float s, float t, uint8_t * bits, uint8_t * mask, uint8_t * cmask) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
        float a[8], bv[8], v[8];
        load8<T>(x + 8 * i, a);
        if (bias.data) bias8(bias, qmod(8 * i, K), bv);
        uint32_t b = 0, c = 0;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            v[e] = clamp_in(a[e], t);
            if (bias.data) v[e] = __fadd_rn(v[e], bv[e]);
            b |= (v[e] >= 0.0f ? 1u : 0u) << e;
            c |= (clamp_open(a[e], t) ? 1u : 0u) << e;
        }
        if (bits) bits[i] = (uint8_t)b;
        if (mask) mask[i] = (uint8_t)ste_pass_bits8(v, s, BIN_S);
        if (cmask) cmask[i] = (uint8_t)c;
    }
}
template <typename T>
__global__ void ste_clamped8(const T * x, int64_t n8, int64_t K, struct dview bias, struct dscale sa, float t,
                             uint8_t * bits, uint8_t * mask, uint8_t * cmask) {
    const float s = ld_scale(sa);
    if (ste_division_free(BIE_QUANT_BINARY, s)) ste_clamped8_loop<T, true>(x, n8, K, bias, s, t, bits, mask, cmask);
    else ste_clamped8_loop<T, false>(x, n8, K, bias, s, t, bits, mask, cmask);
}

// Whether a B1 [M, K, 1, 1] view has rows that start on whole bytes, with contiguous bits.
bool byte_rows(const struct dview & v, int64_t M, int64_t K) {
    return (K == 1 || v.stride[1] == 1) && (M == 1 || v.stride[0] % 8 == 0);
}

// The regions of a forward call's workspace, in order (0 bytes: not used by the route).
enum fwd_region {
    W_PIX,     // x packed into pixels first (pixel_scratch_bytes)
    W_A,       // A: x's GEMM rows
    W_B,       // B: the weight's GEMM rows
    W_ROW,     // rowpop
    W_ROWTERM, // the zero-padding terms of rows gathered and counted by bie_cuda_conv_rowpop
    W_COL,     // colpop
    W_TAP,     // weight_terms' tap popcounts (more taps than it keeps in shared memory)
    W_CORR,    // tapcorr
    W_CLS,     // colcls
    W_PIXCLS,  // the zero-padding terms of the pixels of rows the GEMM counts itself
    W_SIGN,    // a B1 y as sign codes, then packed
    W_BITS,    // the output epilogue's out_bits as codes, then packed (views the epilogue pass cannot write)
    W_REGIONS
};

// A forward call's route, chosen before anything runs (fwd_route_make): how each operand reaches
// the GEMM, who counts the popcounts, the zero-padding terms, the kernels' order and the workspace.
struct fwd_route {
    bool binary, zero_pad_fix; // zero_pad_fix: a zero-padded binary conv (border classes)
    int taps;
    int64_t M, N, kbytes, ldb; // ldb: bytes between the weight operand's rows
    bool x_direct, w_direct;   // B1 rows read in place (x of a linear layer, the weight)
    bool pixels;               // x packed pixel by pixel first
    bool gather;               // x's rows gathered by the GEMM (gemm_gather)
    bool gemm_rows, rowterms;  // gathered rows counted by the GEMM / by bie_cuda_conv_rowpop first
    bool gemm_counts;          // the few-rows GEMM counts the popcounts itself
    bool w_rows_copied;        // weight_terms copies packed B1 weight rows into the operand
    bool terms_first, terms_under_x, rowpop_under_copy; // the order of the weight_terms launch
    bool sign_codes;                                    // a B1 y the GEMM cannot pack: sign codes, then packed
    bool bits_codes;                                    // out_bits through codes (W_BITS)
    int border[4];                                      // zero padding: border class counts (top, bottom, left, right)
    int64_t classes;
    pack_src px, pw;
    gemm_epilogue ep; // binary, g and y; the rest is set when the route runs
    size_t size[W_REGIONS], off[W_REGIONS], total;
};

// Whether the B1 weight's rows already are the GEMM's rows (k = (i*kw + j)*C + c contiguous, LSB
// first, row starts 16-byte aligned and at least kbytes apart, K filling the kbytes of every row so
// that no read passes the tensor's last element): it is read in place. Bits past K may hold
// anything, but the activation rows have zeros there, so popc(a & w) ignores them; popc(w) is
// taken over the first K bits only.
bool weight_in_place(const struct bie_layer_call * c, int64_t N, int64_t kbytes) {
    const struct bie_geometry & g = c->g;
    const struct bie_tensor & wt = c->weight;
    const int64_t wrow = wt.stride[0];
    return c->quant == BIE_QUANT_BINARY && wt.dtype == BIE_DTYPE_B1 && ohwi_rows(wt.stride, g.C, g.kh, g.kw) &&
           (g.K + 7) / 8 == kbytes && (N == 1 || (wrow % 128 == 0 && wrow / 8 >= kbytes)) &&
           ((uintptr_t)wt.data % 16) == 0;
}
// Whether a B1 x of a linear layer is read in place: K fills its rows' bytes exactly (no bits past
// K at all, so neither operand's padding can meet the other's) and its rows are 16-byte aligned,
// kbytes apart.
bool x_in_place(const struct bie_layer_call * c, int64_t M, int64_t kbytes) {
    const struct bie_tensor & xt = c->x;
    return c->quant == BIE_QUANT_BINARY && !c->is_conv && xt.dtype == BIE_DTYPE_B1 && c->g.K == kbytes * 8 &&
           xt.stride[1] == 1 && (M == 1 || xt.stride[0] == kbytes * 8) && ((uintptr_t)xt.data % 16) == 0;
}

// The weight's packer source, from x's (x_source).
pack_src weight_source(const struct bie_layer_call * c, const pack_src & px) {
    pack_src pw = px;
    dview_make(&c->weight, &pw.t);
    pw.bias.data = NULL;
    pw.is_weight = 1;
    pw.s = dscale_make(c, false);
    return pw;
}

// The workspace's regions of route r.
void fwd_workspace(fwd_route * r) {
    const int64_t M = r->M, N = r->N;
    const bool zp = r->zero_pad_fix;
    size_t * z = r->size;
    z[W_PIX] = r->pixels ? pixel_scratch_bytes(r->px) : 0;
    z[W_A] = r->x_direct || r->gather ? 0 : (size_t)(M * r->kbytes);
    z[W_B] = r->w_direct ? 0 : (size_t)(N * r->kbytes);
    z[W_ROW] = r->gemm_rows ? 0 : (size_t)M * 4;
    z[W_ROWTERM] = r->rowterms && zp ? (size_t)M * 8 : 0;
    z[W_COL] = (size_t)N * 4;
    z[W_TAP] = zp && r->taps > WT_SMEM_TAPS ? (size_t)(N * r->taps) * 4 : 0;
    z[W_CORR] = zp ? (size_t)(r->classes * N) * 4 : 0;
    z[W_CLS] = zp ? (size_t)(r->classes * BIE_COLCLS_LD(N)) * 4 : 0;
    z[W_PIXCLS] = r->gemm_rows && zp ? (size_t)(r->ep.g.OH * r->ep.g.OW) * 8 : 0;
    z[W_SIGN] = r->sign_codes ? (size_t)(M * N) : 0;
    z[W_BITS] = r->bits_codes ? (size_t)(M * N) : 0;
    r->total = ws_layout(z, r->off, W_REGIONS);
}

// Chooses the route of a forward call (see fwd_route).
enum bie_status fwd_route_make(bie_context_t * ctx, const struct bie_layer_call * c, fwd_route * r) {
    const struct bie_geometry & g = c->g;
    r->binary = c->quant == BIE_QUANT_BINARY;
    r->taps = (int)(g.kh * g.kw);
    r->zero_pad_fix = r->binary && c->is_conv && g.pad_value == BIE_PAD_ZERO && (g.ph > 0 || g.pw > 0);
    const int64_t M = r->M = g.batch * g.OH * g.OW, N = r->N = g.O;
    if (c->is_conv && (g.H + 2 * g.ph > INT32_MAX || g.W + 2 * g.pw > INT32_MAX)) // (the kernels' pixel coordinates)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "x: a padded height or width past 2^31 on CUDA");
    const int64_t kb_raw = r->binary ? (g.K + 7) / 8 : g.K;
    const int64_t kbytes = r->kbytes = (kb_raw + 127) / 128 * 128;
    r->w_direct = weight_in_place(c, N, kbytes);
    r->ldb = r->w_direct && N > 1 ? c->weight.stride[0] / 8 : kbytes;
    r->x_direct = x_in_place(c, M, kbytes);
    r->px = x_source(c);
    r->pw = weight_source(c, r->px);
    const bool zp = r->zero_pad_fix;
    r->pixels = !r->x_direct && float_pixels(r->px) != PIX_NONE;
    // A conv on the wgmma route whose x is (or is packed into) NHWC words: the GEMM gathers its
    // rows from x itself (gemm_gather), so they are not written out. A binary conv does so when one
    // column tile covers N (each row is then gathered once; with several column tiles the rows are
    // written once by the bit im2col and read by each, which costs less); an n-bit conv always (its
    // im2col rows hold a byte a tap and channel: kh*kw times the pixels' bytes, written and read
    // once each, against pixels that stay in L2 between the column tiles' reads).
    r->gather = c->is_conv && !r->x_direct && !dgeom_one_position(r->px.g) && gatherable(r->px) && gather_fits(r->px) &&
                bie_cuda_gemm_takes_wgmma(ctx, M, zp) &&
                (!r->binary || N <= bie_cuda_wgmma_tile_n(ctx, M, N, kbytes, true));
    // The GEMM counts a binary conv's gathered rows' popcounts itself (its 64-column tiles), or
    // bie_cuda_conv_rowpop counts them first (rowterms).
    r->gemm_rows = r->gather && r->binary && bie_cuda_wgmma_counts_rows(ctx, M, N, kbytes);
    r->rowterms = r->gather && r->binary && !r->gemm_rows;
    r->gemm_counts = bie_cuda_gemm_counts_popcounts(M, zp);
    for (int i = 0; i < 4; i++) r->border[i] = 0;
    if (zp) {
        border_counts(g.OH, g.H, g.sh, g.ph, g.kh, g.dh, &r->border[0], &r->border[1]);
        border_counts(g.OW, g.W, g.sw, g.pw, g.kw, g.dw, &r->border[2], &r->border[3]);
    }
    r->classes = (int64_t)(1 + r->border[0] + r->border[1]) * (1 + r->border[2] + r->border[3]);
    // The weight side of a zero-padded conv is one weight_terms launch: when it also copies packed
    // B1 rows into the operand (then nothing else packs the weight), first for a gathering GEMM,
    // else right after the packer of x and beside it (terms_under_x: a programmatic dependent
    // launch that waits for that kernel before it ends, so that the two overlap); else last, after
    // the weight is packed, taking popc(w) too when the weight is read in place.
    r->w_rows_copied = zp && !r->w_direct && b1_weight_rows(r->pw, N);
    r->terms_first = r->w_rows_copied && r->gather;
    r->terms_under_x = r->w_rows_copied && !r->gather && !r->x_direct;
    // conv_rowterms starts under that weight_terms (x needs no packing between them)
    r->rowpop_under_copy = r->rowterms && r->terms_first && word_pixels(r->px);
    // A B1 y: the GEMM packs the bits itself where it can, else writes sign codes for the packer.
    r->ep.binary = r->binary;
    r->ep.g = r->px.g;
    dview_make(&c->y, &r->ep.y);
    r->sign_codes = c->y.dtype == BIE_DTYPE_B1 && !bie_cuda_gemm_packs_bits(ctx, M, N, zp, r->ep);
    r->bits_codes = c->out_bits.data && !bie_cuda_epilogue_dense(c);
    fwd_workspace(r);
    return BIE_STATUS_OK;
}

// The route in words (the GEMM as bie_cuda_gemm picks it), for bie_plan_describe.
void fwd_route_describe(bie_context_t * ctx, const struct bie_layer_call * c, const fwd_route & r) {
    const bool zp = r.zero_pad_fix;
    const char * gemm = r.gemm_counts                             ? "few-rows split-K (mma.sync)"
                        : bie_cuda_gemm_takes_wgmma(ctx, r.M, zp) ? "wgmma"
                                                                  : "mma.sync";
    const char * x = r.x_direct ? "B1 rows read in place"
                     : r.gather ? (!r.binary  ? "packed into NHWC int8 pixels, rows gathered by the GEMM"
                                   : r.pixels ? "packed into NHWC bit pixels, rows gathered by the GEMM"
                                              : "NHWC bit pixels gathered by the GEMM in place")
                     : r.pixels ? "packed into pixels, then im2col rows"
                                : "packed into GEMM rows";
    const char * w = r.w_direct                        ? "B1 rows read in place"
                     : zp && b1_weight_rows(r.pw, r.N) ? "B1 rows copied with the border terms"
                                                       : "packed into GEMM rows";
    const char * pops = r.gemm_rows     ? "counted by the GEMM"
                        : r.rowterms    ? "row terms kernel"
                        : r.gemm_counts ? "by the GEMM"
                                        : "by the packers";
    const char * y = c->y.dtype != BIE_DTYPE_B1 ? bie_dtype_name(c->y.dtype)
                     : r.sign_codes             ? "sign codes, then packed"
                                                : "B1 packed by the GEMM";
    const char * epi = bie_layer_has_epilogue(c) ? "; output epilogue: one pass after the GEMM" : "";
    snprintf(c->plan->route, sizeof c->plan->route,
             "cuda:%d, %s GEMM %lld x %lld x %lld bytes; x: %s; weight: %s; row popcounts: %s%s; y: %s%s",
             (int)c->device_index, gemm, (long long)r.M, (long long)r.N, (long long)r.kbytes, x, w, pops,
             zp ? "; zero padding by border classes" : "", y, epi);
    c->plan->workspace = r.total;
}

// Packs the operands and makes the epilogue's terms, in the route's order; fills ep's terms.
enum bie_status fwd_operands(bie_context_t * ctx, const struct bie_layer_call * c, fwd_route & r, uint8_t * ws,
                             cudaStream_t stream, gemm_gather * gs, const uint8_t ** Am, const uint8_t ** Bm) {
    const struct bie_geometry & g = c->g;
    const int64_t M = r.M, N = r.N, kbytes = r.kbytes;
    const bool zp = r.zero_pad_fix;
    int *rowpop = (int *)(ws + r.off[W_ROW]), *colpop = (int *)(ws + r.off[W_COL]),
        *tappop = r.taps > WT_SMEM_TAPS ? (int *)(ws + r.off[W_TAP])
                                        : NULL, // (else weight_terms keeps them in shared memory)
            *tapcorr = (int *)(ws + r.off[W_CORR]), *colcls = (int *)(ws + r.off[W_CLS]);
    // the zero-padding terms of gathered rows: per row (rowterms) or per pixel (gemm_rows)
    int2 *const rowterm_p = r.rowterms && zp ? (int2 *)(ws + r.off[W_ROWTERM]) : NULL,
                *const pixcls_p = r.gemm_rows && zp ? (int2 *)(ws + r.off[W_PIXCLS]) : NULL;
    *Am = r.x_direct ? (const uint8_t *)c->x.data : ws + r.off[W_A];
    *Bm = r.w_direct ? (const uint8_t *)c->weight.data : ws + r.off[W_B];
    weight_terms_args wt_args = {r.w_rows_copied ? (const uint8_t *)c->weight.data : *Bm,
                                 r.w_rows_copied ? (N == 1 ? g.K / 8 : r.pw.t.stride[0] / 8) : r.ldb,
                                 r.w_rows_copied ? ws + r.off[W_B] : NULL,
                                 kbytes,
                                 tappop,
                                 r.w_rows_copied || (r.w_direct && !r.gemm_counts) ? colpop : NULL,
                                 tapcorr,
                                 colcls,
                                 (int)BIE_COLCLS_LD(N),
                                 pixcls_p,
                                 r.px.g,
                                 {r.border[0], r.border[1], r.border[2], r.border[3]}};
    // Operands read in place only need their popcounts: those of both are counted in one launch,
    // after any packing.
    const popc_rows xrows = {*Am, r.x_direct && !r.gemm_counts ? M : 0, kbytes, rowpop};
    const popc_rows wrows = {*Bm, r.w_direct && !r.gemm_counts && !zp ? N : 0, r.ldb, colpop};
    if (r.terms_first) BIE_TRY(launch_weight_terms(ctx, wt_args, N, r.taps, g.K, false));
    // (the few-rows GEMM counts the row popcounts itself: the packers skip them)
    if (!r.x_direct && !r.gather)
        BIE_TRY(pack_any(ctx, stream, r.px, M, kbytes, ws + r.off[W_A], r.gemm_counts ? NULL : rowpop,
                         r.pixels ? ws + r.off[W_PIX] : NULL));
    if (r.terms_under_x) BIE_TRY(launch_weight_terms(ctx, wt_args, N, r.taps, g.K, true));
    if (!r.w_direct && !r.w_rows_copied) BIE_TRY(pack_any(ctx, stream, r.pw, N, kbytes, ws + r.off[W_B], colpop, NULL));
    if (r.gather) { // after the weight, so that the last kernel before the GEMM writes terms only
        BIE_TRY(gather_source(ctx, stream, r.px, ws + r.off[W_PIX], gs));
        // (right after weight_terms, when x needs no packing, it may start under that kernel)
        if (r.rowterms)
            BIE_TRY(bie_cuda_conv_rowpop(ctx, *gs, r.px.g, rowpop, rowterm_p, r.border, r.rowpop_under_copy));
    }
    if (xrows.rows || wrows.rows)
        BIE_TRY(launch_row_popcounts(ctx, stream, xrows.rows ? xrows : wrows, xrows.rows ? wrows : NO_ROWS, g.K,
                                     "operand popcounts"));
    if (zp && !r.w_rows_copied) BIE_TRY(launch_weight_terms(ctx, wt_args, N, r.taps, g.K, false));

    gemm_epilogue & ep = r.ep;
    ep.rowpop = r.gemm_rows ? NULL : rowpop;
    ep.colpop = colpop;
    ep.tapcorr = zp ? tapcorr : NULL;
    ep.colcls = zp ? colcls : NULL;
    ep.colcls_ld = (int)BIE_COLCLS_LD(N);
    ep.rowterms = rowterm_p;
    ep.pixcls = pixcls_p;
    for (int i = 0; i < 4; i++) ep.border[i] = r.border[i];
    ep.sa = r.px.s;
    ep.sw = r.pw.s;
    ep.sign = r.sign_codes ? (int8_t *)(ws + r.off[W_SIGN]) : NULL;
    ep.ldb = r.ldb;
    // The last kernel before the GEMM wrote terms only: the tap tables (of a weight packed before),
    // the popcounts of an operand read in place (which are counted after any packing), or the row
    // popcounts of gathered rows. A GEMM that counts its gathered rows itself may instead follow
    // the kernel that packed or copied one of its operands (weight_terms, which lets its dependents
    // start at once, or a packer); the row popcounts may have started under a weight_terms that
    // copied the weight; a weight_terms that copies it may follow the packer of x; and an n-bit
    // conv's gathering GEMM follows the packer of its pixels. Then the GEMM's producer waits for
    // the kernel before it.
    ep.terms_last = (zp && !r.w_rows_copied) || xrows.rows || wrows.rows || r.rowterms;
    ep.operands_last = r.gemm_rows ? !ep.terms_last : r.rowpop_under_copy || r.terms_under_x || (r.gather && !r.binary);
    return BIE_STATUS_OK;
}

} // namespace

extern "C" enum bie_status bie_cuda_layer_forward(bie_context_t * ctx, const struct bie_layer_call * c) {
    struct bie_cuda_state * st;
    BIE_TRY(bie_cuda_state_get(ctx, c->device_index, &st));
    fwd_route r;
    BIE_TRY(fwd_route_make(ctx, c, &r));
    if (c->plan) {
        fwd_route_describe(ctx, c, r);
        return BIE_STATUS_OK;
    }
    uint8_t * ws;
    BIE_TRY(bie_cuda_workspace(ctx, r.total, (void **)&ws));
    if (r.zero_pad_fix && r.classes * BIE_COLCLS_LD(r.N) > INT32_MAX) // (the epilogue's 32-bit offsets in colcls)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "zero padding: border classes x output channels past 2^31");
    gemm_gather gs;
    const uint8_t *Am, *Bm;
    BIE_TRY(fwd_operands(ctx, c, r, ws, st->stream, &gs, &Am, &Bm));
    BIE_TRY(bie_cuda_gemm(ctx, Am, Bm, r.M, r.N, r.kbytes, r.ep, r.gather ? &gs : NULL));
    if (r.sign_codes) BIE_TRY(bie_cuda_store_packed(ctx, r.ep.sign, r.ep.y));
    return bie_cuda_layer_epilogue(ctx, c, (int8_t *)(ws + r.off[W_BITS]));
}

// The clamped form (bie_binarize_ste_clamped): ste_clamped8 on dense rows, else ste_codes.
static enum bie_status binarize_clamped(bie_context_t * ctx, cudaStream_t stream, const struct bie_layer_call * c,
                                        const pack_src & p, const struct bie_ste_out * o) {
    const int64_t M = c->g.batch, K = c->g.K;
    const struct bie_tensor * outs[3] = {o->bits, o->mask, o->clamp_mask};
    struct dview v[3];
    bool dense =
        K % 8 == 0 && (p.t.stride[1] == 1 || K == 1) && (M == 1 || p.t.stride[0] == K) && (uintptr_t)p.t.data % 16 == 0;
    for (int i = 0; i < 3; i++) {
        v[i].data = NULL;
        if (!outs[i]) continue;
        dview_make(outs[i], &v[i]);
        dense = dense && byte_rows(v[i], M, K) && (M == 1 || v[i].stride[0] == K);
    }
    if (dense) {
        const int64_t n8 = M * K / 8;
        uint8_t *b = (uint8_t *)v[0].data, *m = (uint8_t *)v[1].data, *cm = (uint8_t *)v[2].data;
        const unsigned grid = grid_for(n8, 256);
        if (p.t.dtype == BIE_DTYPE_F16)
            ste_clamped8<__half>
                <<<grid, 256, 0, stream>>>((const __half *)p.t.data, n8, K, p.bias, p.s, o->clamp, b, m, cm);
        else if (p.t.dtype == BIE_DTYPE_BF16)
            ste_clamped8<__nv_bfloat16>
                <<<grid, 256, 0, stream>>>((const __nv_bfloat16 *)p.t.data, n8, K, p.bias, p.s, o->clamp, b, m, cm);
        else
            ste_clamped8<float>
                <<<grid, 256, 0, stream>>>((const float *)p.t.data, n8, K, p.bias, p.s, o->clamp, b, m, cm);
        LAUNCHED(ctx, "binarize_ste (clamped)");
        return BIE_STATUS_OK;
    }
    int8_t * codes;
    BIE_TRY(bie_cuda_workspace(ctx, 3 * (size_t)(M * K), (void **)&codes));
    int8_t * cc[3];
    for (int i = 0; i < 3; i++) cc[i] = outs[i] ? codes + i * M * K : NULL;
    ste_codes<<<grid_for(M * K, 256), 256, 0, stream>>>(p, M * K, o->clamp, cc[0], cc[1], cc[2]);
    LAUNCHED(ctx, "binarize_ste codes (clamped)");
    for (int i = 0; i < 3; i++)
        if (outs[i]) BIE_TRY(bie_cuda_store_packed(ctx, cc[i], v[i]));
    return BIE_STATUS_OK;
}

// bie_binarize_ste (bie-impl.h's binarize_ste slot): contiguous float rows of x into byte-aligned
// bit rows go through pack_contiguous_rows, which reads x once with 16-byte loads and writes the
// sign bits and the STE mask bits in the same pass; other views through per-element codes and the
// packed writer; the clamped form through binarize_clamped.
extern "C" enum bie_status bie_cuda_binarize_ste(bie_context_t * ctx, const struct bie_layer_call * c,
                                                 const struct bie_ste_out * o) {
    struct bie_cuda_state * st;
    BIE_TRY(bie_cuda_state_get(ctx, c->device_index, &st));
    const int64_t M = c->g.batch, K = c->g.K;
    pack_src p = x_source(c);
    p.quant = BIE_QUANT_BINARY;
    if (o->clamp > 0.0f) return binarize_clamped(ctx, st->stream, c, p, o);
    const struct bie_tensor *bits = o->bits, *mask = o->mask;
    struct dview vb, vm;
    vb.data = vm.data = NULL;
    if (bits) dview_make(bits, &vb);
    if (mask) dview_make(mask, &vm);
    if ((K == 1 || p.t.stride[1] == 1) && (!bits || byte_rows(vb, M, K)) && (!mask || byte_rows(vm, M, K))) {
        // Short rows without gaps (a conv's channels-last pixels) are taken `per` at a time as one
        // row, so that a warp's lanes all have whole 8-element groups (bias_a by the element's feature).
        int64_t per = 1;
        const bool dense =
            M > 1 && K % 8 == 0 && p.t.stride[0] == K && (!bits || vb.stride[0] == K) && (!mask || vm.stride[0] == K);
        if (dense)
            while (per < 32 && K * per < 2048 && M % (2 * per) == 0) per *= 2;
        const int64_t rows = M / per;
        if (per > 1) {
            p.g.K = K * per;
            p.t.stride[0] = K * per;
            p.bias_period = p.bias.data ? (uint32_t)K : 0;
        }
        const ste_out so = {(uint8_t *)vb.data, (uint8_t *)vm.data, bits && rows > 1 ? vb.stride[0] * per / 8 : 0,
                            mask && rows > 1 ? vm.stride[0] * per / 8 : 0};
        if (launch_contiguous(ctx, p, rows, 0, NULL, NULL, st->stream, &so)) {
            LAUNCHED(ctx, "binarize_ste");
            return BIE_STATUS_OK;
        }
    }
    int8_t * codes;
    BIE_TRY(bie_cuda_workspace(ctx, 2 * (size_t)(M * K), (void **)&codes));
    ste_codes<<<grid_for(M * K, 256), 256, 0, st->stream>>>(p, M * K, 0.0f, bits ? codes : NULL,
                                                            mask ? codes + M * K : NULL, NULL);
    LAUNCHED(ctx, "binarize_ste codes");
    if (bits) BIE_TRY(bie_cuda_store_packed(ctx, codes, vb));
    if (mask) BIE_TRY(bie_cuda_store_packed(ctx, codes + M * K, vm));
    return BIE_STATUS_OK;
}
