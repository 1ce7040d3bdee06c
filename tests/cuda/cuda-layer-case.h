// SPDX-License-Identifier: Apache-2.0
// cuda-layer-case.h: the random layer cases of test-cuda-layer-forward.c and
// test-cuda-layer-backward.c: a case's shapes, dtypes and layouts (binary, 4-bit, 8-bit; linear and
// conv2d; odd sizes, every padding value, strides, dilations, channels-last and gapped layouts,
// host and device scales), its operands on the host and as device mirrors, and the calls on either
// context.
#pragma once

#include "cuda-test.h"

static bie_context_t *ref_ctx, *cu_ctx;

struct lcase {
    int conv;
    enum bie_quant quant;
    int64_t batch, C, H, W, O, lead2; // linear: x [batch, (lead2,) C]
    struct bie_conv2d_desc cd;
    struct bie_linear_desc ld;
    enum bie_dtype xdt, wdt, ydt, gdt;
    int bias, dev_scales, xkind, ykind;
    int terms;    // the output epilogue's terms (out_mul 1, out_add 2, residual 4, out_bits 8, out_bits_bias 16);
                  // 0: random for float y
    int64_t wpad; // a B1 conv weight's OHWI rows wpad bits further apart than K (0: dense; -1, a
                  // linear weight: one row broadcast, rows 0 bits apart)
    float sa, sw;
    float clamp;  // the forward's x_clamp (0: none)
    int specials; // x and bias_a also hold -0, infinities, NaN and exact or near ties x = -bias_a
    char text[420];
};

static const enum bie_dtype float_dts[3] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16};

static inline void describe(struct lcase * c) {
    snprintf(c->text, sizeof c->text,
             "%s q=%d batch=%lld C=%lld H=%lld W=%lld O=%lld k=%dx%d s=%dx%d p=%dx%d d=%dx%d pad=%d x=%s w=%s "
             "y=%s g=%s bias=%d devscale=%d layouts=%d/%d wpad=%lld sa=%g sw=%g clamp=%g specials=%d",
             c->conv ? "conv" : "linear", (int)c->quant, (long long)c->batch, (long long)c->C, (long long)c->H,
             (long long)c->W, (long long)c->O, c->cd.kernel[0], c->cd.kernel[1], c->cd.stride[0], c->cd.stride[1],
             c->cd.padding[0], c->cd.padding[1], c->cd.dilation[0], c->cd.dilation[1], (int)c->cd.pad_value,
             bie_dtype_name(c->xdt), bie_dtype_name(c->wdt), bie_dtype_name(c->ydt), bie_dtype_name(c->gdt), c->bias,
             c->dev_scales, c->xkind, c->ykind, (long long)c->wpad, (double)c->sa, (double)c->sw, (double)c->clamp,
             c->specials);
}

// The layer kind and shapes of a random case (big: one of the sizes that reach particular GEMM
// tiles and packers, else small random ones).
static inline void case_shape(struct lcase * c, int big) {
    if (big == 1) { // more tiles than SMs, so every CTA of a persistent grid takes several
        c->conv = 0;
        c->batch = 1100;
        c->C = test_rand_int(40, 1200);
        c->O = test_rand_int(0, 1) ? 4100 : 4104; // 4104: 16-byte rows in f16, stored by bulk copies
    } else if (big == 8) {                        // n-bit linear, rows long enough for the packers' vector loops (2048
                                                  // elements a warp step) and their tails
        c->conv = 0;
        c->batch = test_rand_int(1, 300);
        c->C = test_rand_int(2048, 5000);
        c->O = test_rand_int(1, 200);
    } else if (big == 4) { // binary, large: the 128 x 192 tiles with epilogue warps (on
                           // Hopper, 12 tiles per SM or more)
        c->conv = 0;
        c->batch = test_rand_int(6400, 6600);
        c->C = test_rand_int(1, 600);
        c->O = 8 * test_rand_int(768, 790); // (16-byte rows of y: stored by bulk copies, as those tiles need)
    } else if (big == 5) {                  // binary, 256-column tiles (64 x 256 ping-pong tiles on Hopper): more
                                            // 128 x 256 tiles than SMs, too few for the epilogue warps; a third with
                                            // 3 row tiles and 89-90 column tiles (a CTA's tiles in several of them)
        c->conv = 0;
        const int few_rows = test_rand_int(0, 2) == 0;
        c->batch = few_rows ? test_rand_int(129, 192) : test_rand_int(1090, 1300);
        c->C = few_rows ? test_rand_int(1, 600) : test_rand_int(1, 4096);
        c->O = few_rows ? test_rand_int(22600, 23000) : test_rand_int(3600, 4200);
    } else if (big == 7) { // the same tiles with K of 5 or 6 stages of 1024 bits
        c->conv = 0;
        c->batch = test_rand_int(1090, 1300);
        c->C = test_rand_int(4097, 6000);
        c->O = test_rand_int(3600, 4200);
    } else if (big == 6) { // a binary conv whose rows the GEMM gathers, in 256-column tiles
        c->conv = 1;
        c->batch = 2;
        c->C = 32 * test_rand_int(1, 2);
        c->H = c->W = test_rand_int(92, 96);
        c->O = test_rand_int(129, 256);
        for (int i = 0; i < 2; i++) {
            c->cd.kernel[i] = 3;
            c->cd.stride[i] = 1;
            c->cd.padding[i] = 1;
            c->cd.dilation[i] = 1;
        }
        c->cd.groups = 1;
    } else if (big == 9) { // a binary ResNet block's conv, channels-last, with an output epilogue
        c->conv = 1;
        c->batch = test_rand_int(2, 4);
        c->C = 64 * test_rand_int(1, 2);
        c->H = c->W = test_rand_int(8, 16);
        c->O = c->C * test_rand_int(1, 2);
        for (int i = 0; i < 2; i++) {
            c->cd.kernel[i] = 3;
            c->cd.stride[i] = c->O == c->C ? 1 : 2;
            c->cd.padding[i] = 1;
            c->cd.dilation[i] = 1;
        }
        c->cd.groups = 1;
    } else if (big == 2) { // a conv with several row tiles, column tiles and K stages
        c->conv = 1;
        c->batch = test_rand_int(1, 2);
        c->C = test_rand_int(60, 140);
        c->H = test_rand_int(12, 24);
        c->W = test_rand_int(12, 24);
        c->O = test_rand_int(60, 300);
        for (int i = 0; i < 2; i++) {
            c->cd.kernel[i] = 3;
            c->cd.stride[i] = (int32_t)test_rand_int(1, 2);
            c->cd.padding[i] = 1;
            c->cd.dilation[i] = 1;
        }
        c->cd.groups = 1;
    } else if (c->conv || big == 3) {
        c->conv = 1;
        for (;;) {
            c->batch = test_rand_int(1, 3);
            // big == 3: up to 256 channels, so that rows of more than 1024 bits (split across
            // warps by the bit im2col) come up too
            c->C = big == 3 ? 32 * test_rand_int(1, test_rand_int(0, 1) ? 3 : 8) : test_rand_int(1, 40);
            c->H = test_rand_int(1, big == 3 ? 14 : 11);
            c->W = test_rand_int(1, big == 3 ? 14 : 11);
            c->O = test_rand_int(1, big == 3 ? 140 : 45);
            for (int i = 0; i < 2; i++) {
                c->cd.kernel[i] = (int32_t)test_rand_int(1, 3);
                c->cd.stride[i] = (int32_t)test_rand_int(1, 2);
                c->cd.padding[i] = (int32_t)test_rand_int(0, 2);
                c->cd.dilation[i] = (int32_t)test_rand_int(1, 2);
            }
            int64_t oh, ow;
            c->cd.groups = 1;
            if (bie_conv2d_output_size(&c->cd, c->H, c->W, &oh, &ow) == BIE_STATUS_OK) break;
        }
    } else {
        c->batch = test_rand_int(1, 3) == 1 ? test_rand_int(130, 300) : test_rand_int(1, 70);
        c->lead2 = test_rand_int(0, 3) == 0 ? test_rand_int(1, 3) : 0;
        const int64_t kpick = test_rand_int(0, 9);
        c->C = kpick < 2 ? test_rand_int(1000, 2600) : kpick == 2 ? 1024 * test_rand_int(1, 2) : test_rand_int(1, 700);
        c->O = test_rand_int(0, 3) == 0 ? test_rand_int(257, 600) : test_rand_int(1, 200);
    }
}

static inline void random_case(struct lcase * c, int big) {
    memset(c, 0, sizeof *c);
    c->conv = test_rand_int(0, 1);
    static const enum bie_quant qs[3] = {BIE_QUANT_BINARY, BIE_QUANT_INT4, BIE_QUANT_INT8};
    c->quant = big == 8 ? qs[test_rand_int(1, 2)] : big >= 3 ? BIE_QUANT_BINARY : qs[test_rand_int(0, 2)];
    const int bin = c->quant == BIE_QUANT_BINARY;
    case_shape(c, big);
    c->cd.quant = c->quant;
    c->cd.in_channels = c->C;
    c->cd.out_channels = c->O;
    c->cd.pad_value = bin ? (enum bie_pad_value)test_rand_int(0, 2) : BIE_PAD_ZERO;
    c->ld.quant = c->quant;
    c->ld.in_features = c->C;
    c->ld.out_features = c->O;
    c->xdt = float_dts[test_rand_int(0, 2)];
    if (bin && test_rand_int(0, 3) == 0) c->xdt = BIE_DTYPE_B1;
    const int wpick = (int)test_rand_int(0, 4);
    c->wdt = wpick < 3                    ? float_dts[wpick]
             : wpick == 3                 ? BIE_DTYPE_I8
             : bin                        ? BIE_DTYPE_B1
             : c->quant == BIE_QUANT_INT4 ? BIE_DTYPE_S4
                                          : BIE_DTYPE_I8;
    static const enum bie_dtype ydts[5] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16, BIE_DTYPE_I32, BIE_DTYPE_B1};
    c->ydt = ydts[test_rand_int(0, bin ? 4 : 3)];
    c->gdt = float_dts[test_rand_int(0, 2)];
    c->bias = c->xdt != BIE_DTYPE_B1 && test_rand_int(0, 1);
    c->dev_scales = test_rand_int(0, 2) == 0;
    c->xkind = (int)test_rand_int(0, 2);
    c->ykind = (int)test_rand_int(0, 2);
    c->sa = test_rand_float(0.05f, 2.0f);
    c->sw = test_rand_float(0.05f, 2.0f);
    if (test_rand_int(0, 3) == 0) c->sa = c->sw = 1.0f;    // a plain GEMM's
    if (big == 4) c->ydt = float_dts[test_rand_int(0, 2)]; // (float y: the only y those tiles store)
    if (big == 8 && test_rand_int(0, 1))
        c->wdt = c->quant == BIE_QUANT_INT4 ? BIE_DTYPE_S4 : BIE_DTYPE_I8; // (packed codes)
    if (big == 9) {
        c->xdt = float_dts[test_rand_int(0, 2)];
        c->ydt = float_dts[test_rand_int(0, 2)];
        c->xkind = c->ykind = 1;
        c->cd.pad_value = BIE_PAD_ZERO;
        c->terms = (int)test_rand_int(1, 31);
    }
    if (big == 3 || big == 6) { // whole words of channels per pixel: channels-last bits (the word-copy bit
                                // im2col), or floats channels-last or NCHW (packed into such bits first)
        c->xdt = test_rand_int(0, 1) ? BIE_DTYPE_B1 : float_dts[test_rand_int(0, 2)];
        c->xkind = c->xdt == BIE_DTYPE_B1 ? 1 : (int)test_rand_int(0, 1); // floats: NCHW planes too
        c->bias = c->xdt != BIE_DTYPE_B1 && test_rand_int(0, 1);
    }
    // x read through a clamp (a Hardtanh before the layer) in a third of the float-x cases, at a
    // bound inside the values' range so that part of them are clamped
    if (c->xdt != BIE_DTYPE_B1 && test_rand_int(0, 2) == 0) {
        const float range = bin ? 2.0f : c->quant == BIE_QUANT_INT4 ? 10.0f : 150.0f;
        c->clamp = c->sa * range * test_rand_float(0.05f, 0.6f);
    }
    describe(c);
}

// A k x k kernel with stride 1, padding 1 and no dilation.
static inline void square_kernel(struct lcase * c, int32_t k) {
    for (int d = 0; d < 2; d++) {
        c->cd.kernel[d] = k;
        c->cd.stride[d] = 1;
        c->cd.padding[d] = 1;
        c->cd.dilation[d] = 1;
    }
}

// Fills a float operand with values around `scale*range`, with exact zeros, +-scale (the STE mask
// boundary) and rounding ties (k + 0.5)*scale sprinkled in.
static inline void fill_operand(const struct bie_tensor * t, float scale, float range) {
    int64_t idx[BIE_MAX_DIMS] = {0};
    do {
        const int64_t kind = test_rand_int(0, 19);
        double v;
        if (kind == 0) v = 0.0;
        else if (kind == 1) v = test_rand_int(0, 1) ? scale : -scale;
        else if (kind == 2) v = ((double)test_rand_int(-10, 9) + 0.5) * scale;
        else v = test_rand_float(-range, range) * scale;
        if (t->dtype == BIE_DTYPE_I8) v = (double)test_rand_int(-128, 127);
        else if (t->dtype == BIE_DTYPE_S4) v = (double)test_rand_int(-8, 7);
        else if (t->dtype == BIE_DTYPE_B1) v = test_rand_int(0, 1) ? 1 : -1;
        bie_store(t, bie_offset(t, idx), v);
    } while (bie_next_index(t, idx));
}

// Overwrites about one element in eight of x with -0, +-inf or NaN, and about one element in four
// of bias_a with +-inf, NaN, or the negated value of x's first element of its channel (sample 0,
// pixel (0, 0) of a conv; row 0 of a linear layer), exactly or a few f32 ulps off: the sign of
// x + bias_a on both sides of zero, and where the packers' shortcuts could differ from x'.
static inline void fill_specials(const struct lcase * c, struct bie_tensor * x, struct bie_tensor * bias) {
    static const double xs[4] = {-0.0, INFINITY, -INFINITY, NAN};
    int64_t idx[BIE_MAX_DIMS] = {0};
    do {
        if (test_rand_int(0, 7) == 0) bie_store(x, bie_offset(x, idx), xs[test_rand_int(0, 3)]);
    } while (bie_next_index(x, idx));
    for (int64_t ch = 0; ch < c->C; ch++) {
        const int64_t kind = test_rand_int(0, 11);
        if (kind > 5) continue;
        int64_t xi[BIE_MAX_DIMS] = {0}, bi[BIE_MAX_DIMS] = {ch};
        xi[c->conv ? 1 : x->ndim - 1] = ch;
        const float v = (float)bie_load(x, bie_offset(x, xi));
        double b = kind == 0 ? INFINITY : kind == 1 ? -INFINITY : kind == 2 ? NAN : -(double)v;
        if (kind >= 4 && isfinite(v) && v != 0.0f) b = (double)nextafterf(-v, kind == 4 ? -INFINITY : INFINITY);
        bie_store(bias, bie_offset(bias, bi), b);
    }
}

struct operands {
    struct bie_tensor x, bias, w, sa, sw;      // host
    struct bie_tensor dx, dbias, dw, dsa, dsw; // device
};

static inline void make_operands(const struct lcase * c, struct operands * o) {
    const float range = c->quant == BIE_QUANT_BINARY ? 2.0f : c->quant == BIE_QUANT_INT4 ? 10.0f : 150.0f;
    if (c->conv) {
        const int64_t xs[4] = {c->batch, c->C, c->H, c->W};
        o->x = make4(c->xdt, xs, c->xkind);
        const int64_t ws[4] = {c->O, c->C, c->cd.kernel[0], c->cd.kernel[1]};
        if (c->wpad && c->wdt == BIE_DTYPE_B1) { // OHWI rows, wpad bits between them
            const int64_t kw = ws[3], st[4] = {ws[1] * ws[2] * kw + c->wpad, 1, kw * ws[1], ws[1]};
            o->w = test_tensor(BIE_DTYPE_B1, 4, ws, st);
        } else
            o->w = make4(c->wdt, ws, (c->wdt == BIE_DTYPE_B1 || c->wdt == BIE_DTYPE_S4) ? 1 : (int)test_rand_int(0, 2));
    } else {
        const int64_t xs3[3] = {c->batch, c->lead2, c->C}, xs2[2] = {c->batch, c->C};
        o->x = c->lead2 ? test_tensor(c->xdt, 3, xs3, NULL) : test_tensor(c->xdt, 2, xs2, NULL);
        const int64_t ws[2] = {c->O, c->C}, bcast[2] = {0, 1};
        o->w = test_tensor(c->wdt, 2, ws, c->wpad < 0 ? bcast : NULL);
    }
    fill_operand(&o->x, c->sa, range);
    fill_operand(&o->w, c->sw, range);
    const int64_t bs[1] = {c->C};
    o->bias = test_tensor(float_dts[test_rand_int(0, 2)], 1, bs, NULL);
    fill_operand(&o->bias, c->sa * 0.25f, 1.0f);
    if (c->specials) fill_specials(c, &o->x, &o->bias);
    o->sa = test_scalar(c->sa);
    o->sw = test_scalar(c->sw);
    o->dx = cuda_mirror(&o->x);
    o->dw = cuda_mirror(&o->w);
    o->dbias = cuda_mirror(&o->bias);
    o->dsa = c->dev_scales ? cuda_mirror(&o->sa) : o->sa;
    o->dsw = c->dev_scales ? cuda_mirror(&o->sw) : o->sw;
}

static inline void free_operands(const struct lcase * c, struct operands * o) {
    test_tensor_free(&o->x);
    test_tensor_free(&o->w);
    test_tensor_free(&o->bias);
    cuda_tensor_free(&o->dx);
    cuda_tensor_free(&o->dw);
    cuda_tensor_free(&o->dbias);
    if (c->dev_scales) {
        cuda_tensor_free(&o->dsa);
        cuda_tensor_free(&o->dsw);
    }
    test_tensor_free(&o->sa);
    test_tensor_free(&o->sw);
}

// An output-shaped host tensor (y or grad_y) of dtype dt.
static inline struct bie_tensor make_out(const struct lcase * c, enum bie_dtype dt) {
    if (c->conv) {
        int64_t oh, ow;
        bie_conv2d_output_size(&c->cd, c->H, c->W, &oh, &ow);
        const int64_t s[4] = {c->batch, c->O, oh, ow};
        return make4(dt, s, c->ykind);
    }
    const int64_t s3[3] = {c->batch, c->lead2, c->O}, s2[2] = {c->batch, c->O};
    return c->lead2 ? test_tensor(dt, 3, s3, NULL) : test_tensor(dt, 2, s2, NULL);
}

static inline enum bie_status forward(bie_context_t * ctx, const struct lcase * c, struct bie_forward_args * a) {
    return c->conv ? bie_conv2d_forward(ctx, &c->cd, a) : bie_linear_forward(ctx, &c->ld, a);
}
static inline enum bie_status backward(bie_context_t * ctx, const struct lcase * c, struct bie_backward_args * a) {
    return c->conv ? bie_conv2d_backward(ctx, &c->cd, a) : bie_linear_backward(ctx, &c->ld, a);
}
