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

size_t align256(size_t v) { return (v + 255) & ~(size_t)255; }

// bie_binarize_ste on views the packer does not take: for element e = m*K + k of x [M, K] (p.t's
// [M, K, 1, 1] view), the codes of its sign bit and of its STE pass bit (1 or 0; either array may
// be NULL), for bie_cuda_store_packed.
__global__ void ste_codes(pack_src p, int64_t n, int8_t * bits, int8_t * mask) {
    const float s = ld_scale(p.s);
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = qdiv(e, p.g.K), k = e - m * p.g.K;
        float v = ld_float(p.t.data, p.t.dtype, m * p.t.stride[0] + k * p.t.stride[1]);
        if (p.bias.data) v = __fadd_rn(v, ld_float(p.bias.data, p.bias.dtype, k * p.bias.stride[3]));
        if (bits) bits[e] = v >= 0.0f ? 1 : 0;
        if (mask) mask[e] = ste_passes(v, s, BIE_QUANT_BINARY, 0, 0) ? 1 : 0;
    }
}

// Whether a B1 [M, K, 1, 1] view has rows that start on whole bytes, with contiguous bits.
bool byte_rows(const struct dview & v, int64_t M, int64_t K) {
    return (K == 1 || v.stride[1] == 1) && (M == 1 || v.stride[0] % 8 == 0);
}

} // namespace

extern "C" enum bie_status bie_cuda_layer_forward(bie_context_t * ctx, const struct bie_layer_call * c) {
    struct bie_cuda_state * st;
    BIE_TRY(bie_cuda_state_get(ctx, c->device_index, &st));
    const struct bie_geometry & g = c->g;
    const bool binary = c->quant == BIE_QUANT_BINARY;
    const int taps = (int)(g.kh * g.kw);
    const bool zero_pad_fix = binary && c->is_conv && g.pad_value == BIE_PAD_ZERO && (g.ph > 0 || g.pw > 0);
    const int64_t M = g.batch * g.OH * g.OW, N = g.O;
    if (c->is_conv && (g.H + 2 * g.ph > INT32_MAX || g.W + 2 * g.pw > INT32_MAX)) // (the kernels' pixel coordinates)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "x: a padded height or width past 2^31 on CUDA");
    const int64_t kb_raw = binary ? (g.K + 7) / 8 : g.K;
    const int64_t kbytes = (kb_raw + 127) / 128 * 128;
    const bool b1_out = c->y.dtype == BIE_DTYPE_B1;
    const int64_t ynumel = M * N;
    // A B1 weight whose rows already are the GEMM's rows (k = (i*kw + j)*C + c contiguous, LSB
    // first, row starts 16-byte aligned and at least kbytes apart, K filling the kbytes of every
    // row so that no read passes the tensor's last element) is read in place: bits past K may
    // hold anything, but the activation rows have zeros there, so popc(a & w) ignores them;
    // popc(w) is taken over the first K bits only.
    const struct bie_tensor & wt = c->weight;
    const int64_t wrow = wt.stride[0];
    const bool w_direct = binary && wt.dtype == BIE_DTYPE_B1 && ohwi_rows(wt.stride, g.C, g.kh, g.kw) &&
                          (g.K + 7) / 8 == kbytes && (N == 1 || (wrow % 128 == 0 && wrow / 8 >= kbytes)) &&
                          ((uintptr_t)wt.data % 16) == 0;
    const int64_t ldb = w_direct && N > 1 ? wrow / 8 : kbytes;
    // A B1 x of a linear layer is read in place when K fills its rows' bytes exactly (no bits past
    // K at all, so neither operand's padding can meet the other's) and its rows are 16-byte
    // aligned, kbytes apart.
    const struct bie_tensor & xt = c->x;
    const bool x_direct = binary && !c->is_conv && xt.dtype == BIE_DTYPE_B1 && g.K == kbytes * 8 &&
                          xt.stride[1] == 1 && (M == 1 || xt.stride[0] == kbytes * 8) && ((uintptr_t)xt.data % 16) == 0;

    pack_src px;
    px.bias_period = 0;
    dview_make(&c->x, &px.t);
    px.bias.data = NULL;
    if (c->bias_a.data) dview_make(&c->bias_a, &px.bias);
    px.g = dgeom_make(g);
    px.is_weight = 0;
    px.quant = (int)c->quant;
    px.s = dscale_make(c, true);
    pack_src pw = px;
    dview_make(&c->weight, &pw.t);
    pw.bias.data = NULL;
    pw.is_weight = 1;
    pw.s = dscale_make(c, false);

    const bool pixels = !x_direct && float_pixels(px) != PIX_NONE; // x packed pixel by pixel first
    // A binary conv on the wgmma route whose x is (or is packed into) NHWC words: the GEMM gathers
    // its rows from x itself (gemm_gather), so they are not written out, when one column tile
    // covers N (each row is then gathered once; with several column tiles the rows are written
    // once by the bit im2col and read by each, which costs less).
    const bool gather = binary && c->is_conv && !x_direct && !dgeom_one_position(px.g) && gatherable(px) &&
                        gather_fits(px) && bie_cuda_gemm_takes_wgmma(ctx, M, zero_pad_fix) &&
                        N <= bie_cuda_wgmma_tile_n(ctx, M, N, kbytes, true);
    // The GEMM counts the gathered rows' popcounts itself (its 64-column tiles), or
    // bie_cuda_conv_rowpop counts them first (rowterms).
    const bool gemm_rows = gather && bie_cuda_wgmma_counts_rows(ctx, M, N, kbytes), rowterms = gather && !gemm_rows;
    size_t off = 0;
    const size_t oPix = off; off = align256(off + (pixels ? pixel_scratch_bytes(px) : 0));
    const size_t oA = off; off = align256(off + (x_direct || gather ? 0 : (size_t)(M * kbytes)));
    const size_t oB = off; off = align256(off + (w_direct ? 0 : (size_t)(N * kbytes)));
    const size_t oRow = off; off = align256(off + (gemm_rows ? 0 : (size_t)M * 4));
    const size_t oRowterm = off; off = align256(off + (rowterms && zero_pad_fix ? (size_t)M * 8 : 0));
    const size_t oCol = off; off = align256(off + (size_t)N * 4);
    int border[4] = {0, 0, 0, 0}; // zero padding: border class counts (top, bottom, left, right)
    if (zero_pad_fix) {
        border_counts(g.OH, g.H, g.sh, g.ph, g.kh, g.dh, &border[0], &border[1]);
        border_counts(g.OW, g.W, g.sw, g.pw, g.kw, g.dw, &border[2], &border[3]);
    }
    const int64_t classes = (int64_t)(1 + border[0] + border[1]) * (1 + border[2] + border[3]);
    const size_t oTap = off; off = align256(off + (zero_pad_fix && taps > WT_SMEM_TAPS ? (size_t)(N * taps) * 4 : 0));
    const size_t oCorr = off; off = align256(off + (zero_pad_fix ? (size_t)(classes * N) * 4 : 0));
    const size_t oCls = off; off = align256(off + (zero_pad_fix ? (size_t)(classes * BIE_COLCLS_LD(N)) * 4 : 0));
    const size_t oPixcls = off; off = align256(off + (gemm_rows && zero_pad_fix ? (size_t)(g.OH * g.OW) * 8 : 0));
    // A B1 y: the GEMM packs the bits itself where it can, else writes sign codes for the packer.
    gemm_epilogue ep;
    ep.binary = binary;
    ep.g = px.g;
    dview_make(&c->y, &ep.y);
    const bool sign_codes = b1_out && !bie_cuda_gemm_packs_bits(ctx, M, N, zero_pad_fix, ep);
    const size_t oSign = off; off = align256(off + (sign_codes ? (size_t)ynumel : 0));
    if (c->plan) { // the route in words (the GEMM as bie_cuda_gemm picks it)
        const bool zp = zero_pad_fix;
        const char * gemm = bie_cuda_gemm_counts_popcounts(M, zp) ? "few-rows split-K (mma.sync)"
                            : bie_cuda_gemm_takes_wgmma(ctx, M, zp) ? "wgmma" : "mma.sync";
        snprintf(c->plan->route, sizeof c->plan->route,
                 "cuda:%d, %s GEMM %lld x %lld x %lld bytes; x: %s; weight: %s; row popcounts: %s%s; y: %s",
                 (int)c->device_index, gemm, (long long)M, (long long)N, (long long)kbytes,
                 x_direct ? "B1 rows read in place"
                 : gather ? (pixels ? "packed into NHWC bit pixels, rows gathered by the GEMM"
                                    : "NHWC bit pixels gathered by the GEMM in place")
                 : pixels ? "packed into pixels, then im2col rows" : "packed into GEMM rows",
                 w_direct ? "B1 rows read in place"
                 : zp && b1_weight_rows(pw, N) ? "B1 rows copied with the border terms" : "packed into GEMM rows",
                 gemm_rows ? "counted by the GEMM" : rowterms ? "row terms kernel"
                 : bie_cuda_gemm_counts_popcounts(M, zp) ? "by the GEMM" : "by the packers",
                 zp ? "; zero padding by border classes" : "",
                 b1_out ? (sign_codes ? "sign codes, then packed" : "B1 packed by the GEMM") : bie_dtype_name(c->y.dtype));
        c->plan->workspace = off;
        return BIE_STATUS_OK;
    }
    uint8_t * ws;
    BIE_TRY(bie_cuda_workspace(ctx, off, (void **)&ws));

    int * rowpop = (int *)(ws + oRow), * colpop = (int *)(ws + oCol),
        * tappop = taps > WT_SMEM_TAPS ? (int *)(ws + oTap) : NULL, // (else weight_terms keeps them in shared memory)
        * tapcorr = (int *)(ws + oCorr), * colcls = (int *)(ws + oCls);
    // the zero-padding terms of gathered rows: per row (rowterms) or per pixel (gemm_rows)
    int2 * const rowterm_p = rowterms && zero_pad_fix ? (int2 *)(ws + oRowterm) : NULL,
         * const pixcls_p = gemm_rows && zero_pad_fix ? (int2 *)(ws + oPixcls) : NULL;
    const uint8_t * Am = x_direct ? (const uint8_t *)xt.data : ws + oA;
    const bool gemm_counts = bie_cuda_gemm_counts_popcounts(M, zero_pad_fix); // the GEMM counts the bits itself
    const uint8_t * Bm = w_direct ? (const uint8_t *)wt.data : ws + oB;
    // The weight side of a zero-padded conv is one weight_terms launch: when it also copies packed
    // B1 rows into the operand (then nothing else packs the weight), first for a gathering GEMM,
    // else right after the packer of x and beside it (terms_under_x: a programmatic dependent
    // launch that waits for that kernel before it ends, so that the two overlap); else last, after
    // the weight is packed, taking
    // popc(w) too when the weight is read in place.
    const bool w_rows_copied = zero_pad_fix && !w_direct && b1_weight_rows(pw, N);
    const bool terms_first = w_rows_copied && gather, terms_under_x = w_rows_copied && !gather && !x_direct;
    // conv_rowterms starts under that weight_terms (x needs no packing between them)
    const bool rowpop_under_copy = rowterms && terms_first && word_pixels(px);
    weight_terms_args wt_args = {w_rows_copied ? (const uint8_t *)wt.data : Bm,
                                 w_rows_copied ? (N == 1 ? g.K / 8 : pw.t.stride[0] / 8) : ldb,
                                 w_rows_copied ? ws + oB : NULL,
                                 kbytes,
                                 tappop,
                                 w_rows_copied || (w_direct && !gemm_counts) ? colpop : NULL,
                                 tapcorr,
                                 colcls,
                                 (int)BIE_COLCLS_LD(N),
                                 pixcls_p,
                                 px.g,
                                 {border[0], border[1], border[2], border[3]}};
    if (zero_pad_fix && classes * BIE_COLCLS_LD(N) > INT32_MAX) // (the epilogue's 32-bit offsets in colcls)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "zero padding: border classes x output channels past 2^31");
    // Operands read in place only need their popcounts: those of both are counted in one launch,
    // after any packing.
    const popc_rows xrows = {Am, x_direct && !gemm_counts ? M : 0, kbytes, rowpop};
    const popc_rows wrows = {Bm, w_direct && !gemm_counts && !zero_pad_fix ? N : 0, ldb, colpop};
    if (terms_first) BIE_TRY(launch_weight_terms(ctx, wt_args, N, taps, g.K, false));
    gemm_gather gs;
    // (the few-rows GEMM counts the row popcounts itself: the packers skip them)
    if (!x_direct && !gather)
        BIE_TRY(pack_any(ctx, st->stream, px, M, kbytes, ws + oA, gemm_counts ? NULL : rowpop, pixels ? ws + oPix : NULL));
    if (terms_under_x) BIE_TRY(launch_weight_terms(ctx, wt_args, N, taps, g.K, true));
    if (!w_direct && !w_rows_copied) BIE_TRY(pack_any(ctx, st->stream, pw, N, kbytes, ws + oB, colpop, NULL));
    if (gather) { // after the weight, so that the last kernel before the GEMM writes terms only
        BIE_TRY(gather_source(ctx, st->stream, px, ws + oPix, &gs));
        // (right after weight_terms, when x needs no packing, it may start under that kernel)
        if (rowterms) BIE_TRY(bie_cuda_conv_rowpop(ctx, gs, px.g, rowpop, rowterm_p, border, rowpop_under_copy));
    }
    if (xrows.rows || wrows.rows)
        BIE_TRY(launch_row_popcounts(ctx, st->stream, xrows.rows ? xrows : wrows, xrows.rows ? wrows : NO_ROWS, g.K,
                                     "operand popcounts"));
    if (zero_pad_fix && !w_rows_copied) BIE_TRY(launch_weight_terms(ctx, wt_args, N, taps, g.K, false));

    ep.rowpop = gemm_rows ? NULL : rowpop;
    ep.colpop = colpop;
    ep.tapcorr = zero_pad_fix ? tapcorr : NULL;
    ep.colcls = zero_pad_fix ? colcls : NULL;
    ep.colcls_ld = (int)BIE_COLCLS_LD(N);
    ep.rowterms = rowterm_p;
    ep.pixcls = pixcls_p;
    for (int i = 0; i < 4; i++) ep.border[i] = border[i];
    ep.sa = px.s;
    ep.sw = pw.s;
    ep.sign = sign_codes ? (int8_t *)(ws + oSign) : NULL;
    ep.ldb = ldb;
    // The last kernel before the GEMM wrote terms only: the tap tables (of a weight packed before),
    // the popcounts of an operand read in place (which are counted after any packing), or the row
    // popcounts of gathered rows. A GEMM that counts its gathered rows itself may instead follow
    // the kernel that packed or copied one of its operands (weight_terms, which lets its dependents
    // start at once, or a packer); the row popcounts may have started under a weight_terms that
    // copied the weight; and a weight_terms that copies it may follow the packer of x. Then the
    // GEMM's producer waits for the kernel before it.
    ep.terms_last = (zero_pad_fix && !w_rows_copied) || xrows.rows || wrows.rows || rowterms;
    ep.operands_last = gemm_rows ? !ep.terms_last : rowpop_under_copy || terms_under_x;
    BIE_TRY(bie_cuda_gemm(ctx, Am, Bm, M, N, kbytes, ep, gather ? &gs : NULL));
    if (sign_codes) BIE_TRY(bie_cuda_store_packed(ctx, ep.sign, ep.y));
    return BIE_STATUS_OK;
}

// bie_binarize_ste (bie-impl.h's binarize_ste slot): contiguous float rows of x into byte-aligned
// bit rows go through pack_contiguous_rows, which reads x once with 16-byte loads and writes the
// sign bits and the STE mask bits in the same pass; other views through per-element codes and the
// packed writer.
extern "C" enum bie_status bie_cuda_binarize_ste(bie_context_t * ctx, const struct bie_layer_call * c,
                                                 const struct bie_tensor * bits, const struct bie_tensor * mask) {
    struct bie_cuda_state * st;
    BIE_TRY(bie_cuda_state_get(ctx, c->device_index, &st));
    const int64_t M = c->g.batch, K = c->g.K;
    pack_src p;
    p.bias_period = 0;
    dview_make(&c->x, &p.t);
    p.bias.data = NULL;
    if (c->bias_a.data) dview_make(&c->bias_a, &p.bias);
    p.g = dgeom_make(c->g);
    p.is_weight = 0;
    p.quant = BIE_QUANT_BINARY;
    p.s = dscale_make(c, true);
    struct dview vb, vm;
    vb.data = vm.data = NULL;
    if (bits) dview_make(bits, &vb);
    if (mask) dview_make(mask, &vm);
    if ((K == 1 || p.t.stride[1] == 1) && (!bits || byte_rows(vb, M, K)) && (!mask || byte_rows(vm, M, K))) {
        // Short rows without gaps (a conv's channels-last pixels) are taken `per` at a time as one
        // row, so that a warp's lanes all have whole 8-element groups (bias_a by the element's feature).
        int64_t per = 1;
        const bool dense = M > 1 && K % 8 == 0 && p.t.stride[0] == K && (!bits || vb.stride[0] == K) &&
                           (!mask || vm.stride[0] == K);
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
        if (launch_contiguous(p, rows, 0, NULL, NULL, st->stream, &so)) {
            LAUNCHED(ctx, "binarize_ste");
            return BIE_STATUS_OK;
        }
    }
    int8_t * codes;
    BIE_TRY(bie_cuda_workspace(ctx, 2 * (size_t)(M * K), (void **)&codes));
    ste_codes<<<grid_for(M * K, 256), 256, 0, st->stream>>>(p, M * K, bits ? codes : NULL, mask ? codes + M * K : NULL);
    LAUNCHED(ctx, "binarize_ste codes");
    if (bits) BIE_TRY(bie_cuda_store_packed(ctx, codes, vb));
    if (mask) BIE_TRY(bie_cuda_store_packed(ctx, codes + M * K, vm));
    return BIE_STATUS_OK;
}
