// SPDX-License-Identifier: Apache-2.0
// cuda-backward-cudnn.cu: the backward of convs through cuDNN's convolutions (cuda-cudnn.cu), on
// the same codes and STE pass as the GEMM route of cuda-backward.cu.
#include "cuda-backward.cuh"

#include <stdio.h>
#include <string.h>

namespace {

// Whether the [N, C, H, W] view t is dense pixel rows (any channel layout would not do: the
// channels contiguous, the pixels (n, h, w) evenly strided, on whole bytes for B1): then *rows is
// its [N*H*W, C] view (dims 0 and 1; dims 2 and 3 of extent 1).
bool pixel_rows_view(const struct dview & t, struct dview * rows) {
    const int64_t N = t.shape[0], C = t.shape[1], H = t.shape[2], W = t.shape[3];
    const int64_t * st = t.stride;
    if (C > 1 && st[1] != 1) return false;
    const int64_t ps = W > 1 ? st[3] : H > 1 ? st[2] : N > 1 ? st[0] : C;
    if ((W > 1 && st[3] != ps) || (H > 1 && st[2] != W * ps) || (N > 1 && st[0] != H * W * ps) || ps < C) return false;
    if (t.dtype == BIE_DTYPE_B1 && ps % 8 != 0) return false;
    *rows = t;
    rows->shape[0] = N * H * W;
    rows->shape[1] = C;
    rows->shape[2] = rows->shape[3] = 1;
    rows->stride[0] = ps;
    rows->stride[1] = 1;
    rows->stride[2] = rows->stride[3] = 0;
    return true;
}
// The [O, K] rows view of a weight whose K = (i*kw + j)*C + c elements are contiguous (OHWI).
bool weight_rows_view(const struct dview & w, const struct dgeom & g, struct dview * rows) {
    const int64_t * st = w.stride;
    if (!((g.C == 1 || st[1] == 1) && (g.kw == 1 || st[3] == g.C) && (g.kh == 1 || st[2] == g.C * g.kw))) return false;
    *rows = w;
    rows->shape[0] = g.O;
    rows->shape[1] = g.K;
    rows->shape[2] = rows->shape[3] = 1;
    rows->stride[0] = g.O == 1 ? g.K : st[0];
    rows->stride[1] = 1;
    rows->stride[2] = rows->stride[3] = 0;
    return true;
}
bool fits_int(int64_t v) { return v >= 0 && v < INT32_MAX; }
// The significand bits of a float dtype, as an order: bf16 < f16 < f32.
int precision_rank(enum bie_dtype dt) { return dt == BIE_DTYPE_BF16 ? 1 : dt == BIE_DTYPE_F16 ? 2 : 3; }

} // namespace

// Whether the conv backward goes through cuDNN: a built-in cuDNN, a conv that is not a GEMM of
// one position per image, zero padding (binary layers with pad -1 or +1 keep the GEMM route, whose
// im2col writes the pad value), a float grad_y whose precision each gradient asked for is within
// (cuDNN's convolutions round to it; the GEMM route keeps f32 sums), and sizes within cuDNN's
// 32-bit arguments. Shapes for which cuDNN has no algorithm go back to the GEMM route too.
// BIE_CUDA_CONV_BACKWARD=gemm (read with the device's facts) keeps every conv on the GEMM route.
bool cudnn_route(bie_context_t * ctx, const struct bie_layer_call * c) {
    const struct bie_geometry & g = c->g;
    bie_cuda_cc(ctx); // (reads force_gemm_backward with the device's facts)
    if (!bie_cudnn_present() || !c->is_conv || ctx->cuda->force_gemm_backward) return false;
    if (g.kh == 1 && g.kw == 1 && g.H == 1 && g.W == 1 && g.OH == 1 && g.OW == 1 && g.ph == 0 && g.pw == 0)
        return false;
    if (c->quant == BIE_QUANT_BINARY && g.pad_value != BIE_PAD_ZERO && (g.ph > 0 || g.pw > 0)) return false;
    if (!bie_dtype_is_float(c->grad_y.dtype)) return false;
    // cuDNN's outputs come in grad_y's dtype: no gradient may ask for more precision than that
    const int rank = precision_rank(c->grad_y.dtype);
    const struct bie_tensor * outs[4] = {&c->grad_x, &c->grad_weight, &c->grad_scale_a, &c->grad_bias_a};
    for (int i = 0; i < 4; i++)
        if (outs[i]->data && precision_rank(outs[i]->dtype) > rank) return false;
    const int64_t * gs = c->grad_y.stride;
    return fits_int(g.batch * g.C * g.H * g.W) && fits_int(g.batch * g.O * g.OH * g.OW) && fits_int(g.O * g.K) &&
           fits_int(gs[0]) && fits_int(gs[1]) && fits_int(gs[2]) && fits_int(gs[3]) && g.ph < INT32_MAX &&
           g.pw < INT32_MAX;
}
// The conv backward through cuDNN's two float convolutions (cuda-cudnn.cu), on operands of grad_y's
// dtype (the codes are exact in it):
//   Wc [O][kh][kw][C] = weight codes;  dX = conv_transpose(grad_y, Wc)   (NHWC, dense)
//   then the STE pass over x with one tap sum per pixel: gx = scale_w * dX (as the GEMM route)
//   A [N][H][W][C] = activation codes;  dW = conv_weight(A, grad_y);  grad_W = scale_a * dW
// x is float, or (binary) the sign bits of bie_binarize_ste with their mask (pixel rows on whole bytes).
// With both gradients asked for, grad_weight's part runs on the context's side stream
// (bie_cuda_fork), beside grad_x's on stream s.
enum bie_status backward_cudnn(bie_context_t * ctx, const struct bie_layer_call * c, cudaStream_t s) {
    const struct dgeom g = dgeom_make(c->g);
    const int gdt = c->grad_y.dtype;
    const size_t es = gdt == BIE_DTYPE_F32 ? 4 : 2;
    const bool want_gx = c->grad_x.data || c->grad_scale_a.data || c->grad_bias_a.data;
    const bool want_gw = c->grad_weight.data != NULL;
    const int64_t xpix = g.batch * g.H * g.W, xnumel = xpix * g.C, O = g.O, K = g.K;
    struct dview x = {}, xm = {}, gm = {}, bias = {}, gy = {}, gxo = {}, w = {}, gwo = {}, xr = {}, xmr = {}, gmr = {},
                 gxr = {}, ga = {}, gar = {};
    dview_make(&c->x, &x);
    dview_make(&c->grad_y, &gy);
    dview_make(&c->weight, &w);
    xm.data = gm.data = bias.data = gxo.data = gwo.data = NULL;
    if (c->x_mask.data) dview_make(&c->x_mask, &xm);
    if (c->grad_x_mask.data) dview_make(&c->grad_x_mask, &gm);
    if (c->bias_a.data) dview_make(&c->bias_a, &bias);
    if (c->grad_x.data) dview_make(&c->grad_x, &gxo);
    if (c->grad_x_add.data) dview_make(&c->grad_x_add, &ga);
    if (want_gw) dview_make(&c->grad_weight, &gwo);
    const bool saved = x.dtype == BIE_DTYPE_B1;
    const bool x_rows = pixel_rows_view(x, &xr) && (!xm.data || pixel_rows_view(xm, &xmr));
    if (!xm.data) xmr = xm;
    if (!gm.data) gmr = gm;
    if (!ga.data) gar = ga;
    const bool rows = x_rows && (!gxo.data || pixel_rows_view(gxo, &gxr)) && (!gm.data || pixel_rows_view(gm, &gmr)) &&
                      (!ga.data || pixel_rows_view(ga, &gar));
    if (saved && want_gx && !rows)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED,
                             "x, x_mask, grad_x_mask, grad_x, grad_x_add: CUDA reads saved bits of a conv as "
                             "channels-last pixel rows on whole bytes, with a channels-last grad_x (and grad_x_add)");
    if (saved && want_gw && !x_rows)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED,
                             "x: CUDA reads saved bits of a conv as channels-last pixel "
                             "rows on whole bytes");
    // grad_y as it is when dense NHWC, or dense NCHW read by one of the two convolutions; else
    // (broadcast, gapped, misaligned, or NCHW read by both, which would each turn it into NHWC
    // first) copied into dense NHWC once
    const int64_t * ys = gy.stride;
    const int64_t P = g.OH * g.OW;
    const bool nchw = ys[3] == 1 && ys[2] == g.OW && ys[1] == P && ys[0] == g.O * P;
    const bool nhwc = ys[1] == 1 && ys[3] == g.O && ys[2] == g.OW * g.O && ys[0] == P * g.O;
    const bool in_place = nhwc || (nchw && !(want_gx && want_gw));
    const bool gy_copy = !in_place || ((uintptr_t)gy.data % 16) != 0; // (cuDNN's plans take 16-byte alignment)
    const int64_t ynumel = g.batch * g.O * P;
    cudnn_conv_shape k = {(int)g.batch,
                          (int)g.C,
                          (int)g.H,
                          (int)g.W,
                          (int)g.O,
                          (int)g.OH,
                          (int)g.OW,
                          g.kh,
                          g.kw,
                          g.sh,
                          g.sw,
                          g.ph,
                          g.pw,
                          g.dh,
                          g.dw,
                          gdt,
                          {(int)ys[0], (int)ys[1], (int)ys[2], (int)ys[3]}};
    if (gy_copy) {
        const int nhwc_st[4] = {(int)(P * g.O), 1, (int)(g.OW * g.O), (int)g.O};
        memcpy(k.gy_stride, nhwc_st, sizeof nhwc_st);
    }
    size_t dnn_x = 0, dnn_w = 0; // the two convolutions' cuDNN workspaces
    const enum bie_status found = bie_cudnn_conv_prepare(ctx, k, want_gx, want_gw, &dnn_x, &dnn_w);
    if (found == BIE_STATUS_UNSUPPORTED && !saved) return BIE_DECLINED; // (no algorithm: the GEMM route)
    BIE_TRY(found);

    const struct dscale sa = dscale_make(c, true), sw = dscale_make(c, false);
    ste_pass_job pj;
    pj.rows = rows;
    pj.x = rows ? xr : x;
    pj.xm = xmr;
    pj.gm = gmr;
    pj.bias = bias;
    pj.g = g; // tiles: one tap sum per pixel of x (a 1x1, stride-1 geometry over x's pixels)
    pj.g.kh = pj.g.kw = pj.g.sh = pj.g.sw = pj.g.dh = pj.g.dw = 1;
    pj.g.ph = pj.g.pw = 0;
    pj.g.OH = g.H;
    pj.g.OW = g.W;
    pj.g.K = g.C;
    if (rows) { // rows: the pixels are the rows
        pj.g.batch = xpix;
        pj.g.H = pj.g.W = pj.g.OH = pj.g.OW = 1;
    }
    pj.quant = (int)c->quant;
    pj.sa = sa;
    pj.sw = sw;
    pj.dcol_dtype = gdt;
    pj.gx = rows && gxo.data ? gxr : gxo;
    pj.gadd = rows ? gar : ga;
    pj.xnumel = xnumel;
    pj.gb.data = pj.gsa.data = NULL;
    if (c->grad_bias_a.data) dview_make(&c->grad_bias_a, &pj.gb);
    if (c->grad_scale_a.data) dview_make(&c->grad_scale_a, &pj.gsa);

    // The workspace: weight codes, dX, activation codes, dW, the two convolutions' cuDNN workspaces,
    // the STE pass's, grad_y copied.
    enum { D_WC, D_DX, D_A, D_DW, D_DNNX, D_DNNW, D_PASS, D_GY, D_REGIONS };
    const size_t size[D_REGIONS] = {want_gx ? (size_t)(O * K) * es : 0,
                                    want_gx ? (size_t)xnumel * es : 0,
                                    want_gw ? (size_t)xnumel * es : 0,
                                    want_gw ? (size_t)(O * K) * es : 0,
                                    dnn_x,
                                    dnn_w,
                                    want_gx ? bie_cuda_ste_pass_workspace(pj) : 0,
                                    gy_copy ? (size_t)ynumel * es : 0};
    size_t o[D_REGIONS];
    const size_t off = ws_layout(size, o, D_REGIONS);
    const size_t oWc = o[D_WC], oDX = o[D_DX], oA = o[D_A], oDW = o[D_DW], oDnnX = o[D_DNNX], oDnnW = o[D_DNNW],
                 oPass = o[D_PASS], oGy = o[D_GY];
    const bool both = want_gx && want_gw; // (grad_weight's work then runs beside grad_x's, on a second stream)
    if (c->plan) {
        snprintf(c->plan->route, sizeof c->plan->route,
                 "cuda:%d, cuDNN convolutions in %s (grad_x: %s; grad_weight: %s%s); STE pass by %s; x %s; grad_y %s",
                 (int)c->device_index, bie_dtype_name((enum bie_dtype)gdt), want_gx ? "dgrad" : "not asked",
                 want_gw ? "wgrad" : "not asked", both ? ", beside grad_x" : "", rows ? "pixel rows" : "tiles",
                 saved ? "from saved bits and mask" : bie_dtype_name((enum bie_dtype)x.dtype),
                 gy_copy ? "copied to dense NHWC"
                 : nhwc  ? "NHWC"
                         : "NCHW");
        c->plan->workspace = off;
        return BIE_STATUS_OK;
    }
    uint8_t * ws;
    BIE_TRY(bie_cuda_workspace(ctx, off, (void **)&ws));
    const void * gyd = gy.data;
    if (gy_copy) {
        BIE_TRY(bie_cuda_pixel_rows(ctx, s, gy, bias_none(), 0, sa, gdt, 0, ws + oGy));
        gyd = ws + oGy;
    }

    // grad_weight's codes, convolution and scaling (on stream t)
    auto grad_w = [&](cudaStream_t t) -> bie_status {
        if (!(x_rows && launch_codes_rows(xr, xmr, true, xpix, g.C, saved ? bias_none() : bias, (int)c->quant, sa, gdt,
                                          ws + oA, t)))
            BIE_TRY(bie_cuda_pixel_rows(ctx, t, x, bias, (int)c->quant, sa, gdt, 0, ws + oA));
        LAUNCHED(ctx, "activation codes");
        BIE_TRY(bie_cudnn_conv_wgrad(ctx, t, k, ws + oA, gyd, ws + oDW, ws + oDnnW, dnn_w));
        launch_grad_w(t, gdt, ws + oDW, g, sa, gwo);
        LAUNCHED(ctx, "scale grad_weight");
        return BIE_STATUS_OK;
    };
    // grad_x's codes, convolution and STE pass (on stream s)
    auto grad_x = [&]() -> bie_status {
        struct dview wr;
        const bool w_rows = weight_rows_view(w, g, &wr);
        if (!(w_rows && (bie_dtype_is_float((enum bie_dtype)w.dtype) || w.dtype == BIE_DTYPE_B1) &&
              launch_codes_rows(wr, bias_none(), true, O, K, bias_none(), (int)c->quant, sw, gdt, ws + oWc, s)))
            launch_weight_codes(s, w, g, (int)c->quant, sw, gdt, 0, ws + oWc);
        LAUNCHED(ctx, "weight codes");
        BIE_TRY(bie_cudnn_conv_dgrad(ctx, s, k, ws + oWc, gyd, ws + oDX, ws + oDnnX, dnn_x));
        pj.dcol = ws + oDX;
        return bie_cuda_ste_pass(ctx, s, pj, ws + oPass);
    };
    if (!both) return want_gx ? grad_x() : want_gw ? grad_w(s) : BIE_STATUS_OK;
    // Both: grad_weight's work forks to the side stream, and the caller's stream joins it at the end
    // (joined even after an error, so that a capture stays whole).
    cudaStream_t side;
    BIE_TRY(bie_cuda_fork(ctx, &side));
    const enum bie_status sw_st = grad_w(side), sx_st = grad_x(), sj = bie_cuda_join(ctx);
    return sw_st != BIE_STATUS_OK ? sw_st : sx_st != BIE_STATUS_OK ? sx_st : sj;
}
