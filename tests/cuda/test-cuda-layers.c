// SPDX-License-Identifier: Apache-2.0
// test-cuda-layers.c: every layer (binary, 4-bit, 8-bit; linear and conv2d; forward and backward)
// on CUDA tensors against the plain-C reference on host copies of the same operands.
//   forward: bit-identical (y of every dtype: f32/f16/bf16 = (float)acc*(sa*sw) rounded RNE, I32,
//            B1) over the whole byte span of y, so untouched gaps and padding bits must match too
//            (y is poisoned identically on both sides first)
//   backward: floats within a tolerance derived from f32 accumulation and the output dtype:
//            max|got - ref| <= tol(dtype) * max|ref|, tol = 1e-4 (f32), 2^-9 (f16), 2^-6 (bf16)
// Shapes are random and odd (any M, N, K, C, O, every padding value, strides, dilations), with
// channels-last and gapped layouts, host and device scales, and zeros / ties / mask boundaries in
// the inputs. A failure prints the seed and the case.
//   bie_binarize_ste: bits and mask bit-identical to the reference over their whole byte spans
//            (poisoned alike first: the bits between elements must keep their content);
//   saved bits: the binary linear backward from (bits, x_mask) within the tolerance of the
//            reference's backward from the float x, and (on CUDA) identical to the backward from
//            the float x in grad_x, grad_weight and grad_bias_a (grad_scale_a: within a few ulps,
//            since its blocks' partial sums meet in double atomic adds, in any order); the forward
//            from the bits identical to the forward from the float x.
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
    char text[400];
};

static const enum bie_dtype float_dts[3] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16};

static void describe(struct lcase * c) {
    snprintf(c->text, sizeof c->text,
             "%s q=%d batch=%lld C=%lld H=%lld W=%lld O=%lld k=%dx%d s=%dx%d p=%dx%d d=%dx%d pad=%d x=%s w=%s "
             "y=%s g=%s bias=%d devscale=%d layouts=%d/%d wpad=%lld sa=%g sw=%g",
             c->conv ? "conv" : "linear", (int)c->quant, (long long)c->batch, (long long)c->C, (long long)c->H,
             (long long)c->W, (long long)c->O, c->cd.kernel[0], c->cd.kernel[1], c->cd.stride[0], c->cd.stride[1],
             c->cd.padding[0], c->cd.padding[1], c->cd.dilation[0], c->cd.dilation[1], (int)c->cd.pad_value,
             bie_dtype_name(c->xdt), bie_dtype_name(c->wdt), bie_dtype_name(c->ydt), bie_dtype_name(c->gdt), c->bias,
             c->dev_scales, c->xkind, c->ykind, (long long)c->wpad, (double)c->sa, (double)c->sw);
}

static void random_case(struct lcase * c, int big) {
    memset(c, 0, sizeof *c);
    c->conv = test_rand_int(0, 1);
    static const enum bie_quant qs[3] = {BIE_QUANT_BINARY, BIE_QUANT_INT4, BIE_QUANT_INT8};
    c->quant = big == 8 ? qs[test_rand_int(1, 2)] : big >= 3 ? BIE_QUANT_BINARY : qs[test_rand_int(0, 2)];
    const int bin = c->quant == BIE_QUANT_BINARY;
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
    describe(c);
}

// Fills a float operand with values around `scale*range`, with exact zeros, +-scale (the STE mask
// boundary) and rounding ties (k + 0.5)*scale sprinkled in.
static void fill_operand(const struct bie_tensor * t, float scale, float range) {
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

struct operands {
    struct bie_tensor x, bias, w, sa, sw;      // host
    struct bie_tensor dx, dbias, dw, dsa, dsw; // device
};

static void make_operands(const struct lcase * c, struct operands * o) {
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
    o->sa = test_scalar(c->sa);
    o->sw = test_scalar(c->sw);
    o->dx = cuda_mirror(&o->x);
    o->dw = cuda_mirror(&o->w);
    o->dbias = cuda_mirror(&o->bias);
    o->dsa = c->dev_scales ? cuda_mirror(&o->sa) : o->sa;
    o->dsw = c->dev_scales ? cuda_mirror(&o->sw) : o->sw;
}

static void free_operands(const struct lcase * c, struct operands * o) {
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
static struct bie_tensor make_out(const struct lcase * c, enum bie_dtype dt) {
    if (c->conv) {
        int64_t oh, ow;
        bie_conv2d_output_size(&c->cd, c->H, c->W, &oh, &ow);
        const int64_t s[4] = {c->batch, c->O, oh, ow};
        return make4(dt, s, c->ykind);
    }
    const int64_t s3[3] = {c->batch, c->lead2, c->O}, s2[2] = {c->batch, c->O};
    return c->lead2 ? test_tensor(dt, 3, s3, NULL) : test_tensor(dt, 2, s2, NULL);
}

static enum bie_status forward(bie_context_t * ctx, const struct lcase * c, struct bie_forward_args * a) {
    return c->conv ? bie_conv2d_forward(ctx, &c->cd, a) : bie_linear_forward(ctx, &c->ld, a);
}
static enum bie_status backward(bie_context_t * ctx, const struct lcase * c, struct bie_backward_args * a) {
    return c->conv ? bie_conv2d_backward(ctx, &c->cd, a) : bie_linear_backward(ctx, &c->ld, a);
}

static void test_forward(const struct lcase * c) {
    struct operands o;
    make_operands(c, &o);
    struct bie_tensor y_ref = make_out(c, c->ydt), y_cu = y_ref; // one view, two buffers
    fill_poison(&y_ref);
    y_cu.data = malloc(tensor_span(&y_ref) + 64);
    memcpy(y_cu.data, y_ref.data, tensor_span(&y_ref));
    struct bie_tensor dy = cuda_mirror(&y_cu);
    struct bie_forward_args ar = {
        .x = &o.x, .bias_a = c->bias ? &o.bias : NULL, .weight = &o.w, .scale_a = &o.sa, .scale_w = &o.sw, .y = &y_ref};
    struct bie_forward_args ac = {.x = &o.dx,
                                  .bias_a = c->bias ? &o.dbias : NULL,
                                  .weight = &o.dw,
                                  .scale_a = &o.dsa,
                                  .scale_w = &o.dsw,
                                  .y = &dy};
    // The output epilogue on a float y (bits 0-4 of terms: out_mul, out_add, residual, out_bits,
    // out_bits_bias), each term in about half of the cases; out_bits poisoned alike on both sides.
    const int64_t O = c->O;
    struct bie_tensor mul = test_tensor(BIE_DTYPE_F32, 1, &O, NULL), add = test_tensor(BIE_DTYPE_F32, 1, &O, NULL);
    struct bie_tensor res = make_out(c, c->ydt);
    test_fill_uniform(&mul, -2.0f, 2.0f);
    test_fill_uniform(&add, -3.0f, 3.0f);
    test_fill_uniform(&res, -4.0f, 4.0f);
    struct bie_tensor bb = test_tensor(BIE_DTYPE_F32, 1, &O, NULL), bits_ref = make_out(c, BIE_DTYPE_B1);
    test_fill_uniform(&bb, -4.0f, 4.0f);
    fill_poison(&bits_ref);
    struct bie_tensor bits_cu = bits_ref;
    bits_cu.data = malloc(tensor_span(&bits_ref) + 64);
    memcpy(bits_cu.data, bits_ref.data, tensor_span(&bits_ref));
    struct bie_tensor dmul = cuda_mirror(&mul), dadd = cuda_mirror(&add), dres = cuda_mirror(&res);
    struct bie_tensor dbb = cuda_mirror(&bb), dbits = cuda_mirror(&bits_cu);
    int terms = c->terms ? c->terms : bie_dtype_is_float(c->ydt) ? (int)test_rand_int(0, 31) : 0;
    if ((terms & 24) == 16) terms |= 8;
    if (terms & 8) ar.out_bits = &bits_ref, ac.out_bits = &dbits;
    if (terms & 16) ar.out_bits_bias = &bb, ac.out_bits_bias = &dbb;
    if (terms & 1) ar.out_mul = &mul, ac.out_mul = &dmul;
    if (terms & 2) ar.out_add = &add, ac.out_add = &dadd;
    if (terms & 4) ar.residual = &res, ac.residual = &dres;
    if (c->terms) { // the route names the epilogue
        bie_plan_t * p = NULL;
        CHECK_OK(cu_ctx, c->conv ? bie_plan_conv2d_forward(cu_ctx, &c->cd, &ac, &p)
                                 : bie_plan_linear_forward(cu_ctx, &c->ld, &ac, &p));
        CHECK(p && strstr(bie_plan_describe(p), "output epilogue"), "route \"%s\" on %s", bie_plan_describe(p),
              c->text);
        bie_plan_destroy(p);
    }
    enum bie_status sr = forward(ref_ctx, c, &ar);
    enum bie_status sc = forward(cu_ctx, c, &ac);
    CHECK(sr == BIE_STATUS_OK, "reference forward failed (%s) on %s epilogue=%d", bie_context_last_error(ref_ctx),
          c->text, terms);
    CHECK(sc == BIE_STATUS_OK, "cuda forward failed (%s) on %s epilogue=%d", bie_context_last_error(cu_ctx), c->text,
          terms);
    if (sr == BIE_STATUS_OK && sc == BIE_STATUS_OK) {
        CHECK(bie_context_cuda_synchronize(cu_ctx) == BIE_STATUS_OK, "sync: %s", bie_context_last_error(cu_ctx));
        cuda_fetch(&y_cu, &dy);
        const int same = memcmp(y_cu.data, y_ref.data, tensor_span(&y_ref)) == 0;
        char where[512] = "";
        const long long bad = same ? 0 : (long long)count_mismatch(&y_cu, &y_ref, where, sizeof where);
        CHECK(same, "forward y differs from the reference (%lld of %lld elements; %s) on %s epilogue=%d", bad,
              (long long)bie_tensor_numel(&y_ref), where, c->text, terms);
        cuda_fetch(&bits_cu, &dbits);
        CHECK(memcmp(bits_cu.data, bits_ref.data, tensor_span(&bits_ref)) == 0,
              "out_bits differ from the reference on %s epilogue=%d", c->text, terms);
    }
    cuda_tensor_free(&dbb);
    cuda_tensor_free(&dbits);
    test_tensor_free(&bb);
    test_tensor_free(&bits_ref);
    test_tensor_free(&bits_cu);
    cuda_tensor_free(&dmul);
    cuda_tensor_free(&dadd);
    cuda_tensor_free(&dres);
    test_tensor_free(&mul);
    test_tensor_free(&add);
    test_tensor_free(&res);
    cuda_tensor_free(&dy);
    test_tensor_free(&y_ref);
    test_tensor_free(&y_cu);
    free_operands(c, &o);
}

static double tol_for(enum bie_dtype dt) { return dt == BIE_DTYPE_F32 ? 1e-4 : dt == BIE_DTYPE_F16 ? 0x1p-9 : 0x1p-6; }

static void compare_grad(const char * name, const struct bie_tensor * got, const struct bie_tensor * ref,
                         const struct lcase * c) {
    double diff, mag;
    max_diff(got, ref, &diff, &mag);
    const double tol = tol_for(got->dtype) * (mag > 1e-30 ? mag : 1e-30);
    CHECK(diff <= tol, "%s: max|got-ref| = %g > %g (max|ref| = %g) on %s", name, diff, tol, mag, c->text);
}

// The saved-bits checks of a binary linear case: y from the bits (B1 x) is y from the float x, and
// the backward from the bits (args ab, whose gradients the caller fetched into got[]) is the
// backward from the float x on CUDA (grad_scale_a within a few ulps).
static void same_as_float(const struct lcase * c, const struct operands * o, const struct bie_backward_args * ab,
                          struct bie_tensor * const got[4]) {
    struct bie_tensor y = make_out(c, c->ydt);
    struct bie_tensor dyf = cuda_mirror(&y), dyb = cuda_mirror(&y), yb = y;
    yb.data = malloc(tensor_span(&y) + 64);
    struct bie_forward_args af = {.x = &o->dx,
                                  .bias_a = c->bias ? &o->dbias : NULL,
                                  .weight = &o->dw,
                                  .scale_a = &o->dsa,
                                  .scale_w = &o->dsw,
                                  .y = &dyf};
    struct bie_forward_args fb = af;
    fb.x = ab->x;
    fb.bias_a = NULL;
    fb.y = &dyb;
    CHECK_OK(cu_ctx, forward(cu_ctx, c, &af));
    CHECK_OK(cu_ctx, forward(cu_ctx, c, &fb));
    // the float x's gradients into fresh device buffers of the same views
    struct bie_tensor * const dgot[4] = {ab->grad_x, ab->grad_weight, ab->grad_scale_a, ab->grad_bias_a};
    struct bie_tensor dg[4], host[4];
    struct bie_backward_args bf = *ab;
    bf.x = &o->dx;
    bf.bias_a = c->bias ? &o->dbias : NULL;
    bf.x_mask = NULL;
    struct bie_tensor ** slots[4] = {&bf.grad_x, &bf.grad_weight, &bf.grad_scale_a, &bf.grad_bias_a};
    for (int i = 0; i < 4; i++) {
        if (!dgot[i]) continue;
        host[i] = *got[i];
        host[i].data = calloc(1, tensor_span(got[i]) + 64);
        dg[i] = cuda_mirror(&host[i]);
        *slots[i] = &dg[i];
    }
    CHECK_OK(cu_ctx, backward(cu_ctx, c, &bf));
    CHECK(bie_context_cuda_synchronize(cu_ctx) == BIE_STATUS_OK, "sync: %s", bie_context_last_error(cu_ctx));
    cuda_fetch(&y, &dyf);
    cuda_fetch(&yb, &dyb);
    CHECK(memcmp(y.data, yb.data, tensor_span(&y)) == 0, "forward from the saved bits differs from the float x's on %s",
          c->text);
    const char * names[4] = {"grad_x", "grad_weight", "grad_scale_a", "grad_bias_a"};
    for (int i = 0; i < 4; i++) {
        if (!dgot[i]) continue;
        cuda_fetch(&host[i], &dg[i]);
        if (i == 2) { // within one unit in the last place of its dtype
            const double a = bie_load(&host[i], 0), b = bie_load(got[i], 0);
            const enum bie_dtype dt = got[i]->dtype;
            const double ulp = dt == BIE_DTYPE_F32 ? 0x1p-23 : dt == BIE_DTYPE_F16 ? 0x1p-10 : 0x1p-7;
            CHECK(fabs(a - b) <= ulp * fabs(a), "grad_scale_a from the saved bits %g, from the float x %g on %s", b, a,
                  c->text);
        } else {
            char where[512] = "";
            const int same = memcmp(host[i].data, got[i]->data, tensor_span(got[i])) == 0;
            if (!same) count_mismatch(got[i], &host[i], where, sizeof where);
            CHECK(same, "%s from the saved bits differs from the float x's (%s) on %s", names[i], where, c->text);
        }
        cuda_tensor_free(&dg[i]);
        test_tensor_free(&host[i]);
    }
    cuda_tensor_free(&dyf);
    cuda_tensor_free(&dyb);
    test_tensor_free(&y);
    test_tensor_free(&yb);
}

// The backward on CUDA against the reference's from the float x. saved: the case is made a binary
// linear layer with a float x and the CUDA side runs from the bits and STE mask that
// bie_binarize_ste saves on the device (bias_a NULL; no mask when only grad_weight is asked for);
// saved == 2: grad_x alone or with grad_weight, of grad_y's dtype (its GEMM writes it, and the
// codes pass then clears the elements the saved mask stops).
// saved: x as the bits and mask of bie_binarize_ste; in_place: grad_x of grad_y's dtype and no
// scale or bias gradient, so that the STE mask is applied to grad_x in place.
static void test_backward(struct lcase * c, int saved, int in_place) {
    if (c->xdt == BIE_DTYPE_B1) c->xdt = BIE_DTYPE_F32;
    if (c->ydt == BIE_DTYPE_B1 || c->ydt == BIE_DTYPE_I32) c->ydt = BIE_DTYPE_F32;
    if (saved) {
        c->quant = c->ld.quant = c->cd.quant = BIE_QUANT_BINARY;
        if (c->wdt == BIE_DTYPE_S4) c->wdt = BIE_DTYPE_B1;
        c->sa = (float)test_rand_int(4, 40) / 16.0f; // x in [-2 sa, 2 sa]: the mask stops about half
    }
    describe(c);
    if (saved) {
        const size_t n = strlen(c->text);
        snprintf(c->text + n, sizeof c->text - n, " (cuda from saved bits)");
    }
    struct operands o;
    make_operands(c, &o);
    // (bits and mask rows dense or with a gap after each: both start on whole bytes)
    struct bie_tensor bits = {0}, mask = {0}, dbits = {0}, dmask = {0};
    if (saved) {
        bits = test_tensor_rows(BIE_DTYPE_B1, o.x.ndim, o.x.shape, (int)test_rand_int(0, 1));
        mask = test_tensor_rows(BIE_DTYPE_B1, o.x.ndim, o.x.shape, (int)test_rand_int(0, 1));
        dbits = cuda_mirror(&bits);
        dmask = cuda_mirror(&mask);
        CHECK_OK(cu_ctx, bie_binarize_ste(cu_ctx, &o.dx, c->bias ? &o.dbias : NULL, &o.dsa, &dbits, &dmask));
    }
    struct bie_tensor g = make_out(c, c->gdt);
    fill_operand(&g, 1.0f, 1.0f);
    struct bie_tensor dg = cuda_mirror(&g);
    // grad_x and grad_weight of grad_y's dtype half the time: the GEMMs write those directly
    const int same = in_place || test_rand_int(0, 1);
    const enum bie_dtype gxdt = same ? c->gdt : float_dts[test_rand_int(0, 2)];
    const enum bie_dtype gwdt = same ? c->gdt : float_dts[test_rand_int(0, 2)];
    const enum bie_dtype gbdt = float_dts[test_rand_int(0, 2)], gsdt = float_dts[test_rand_int(0, 2)];
    struct bie_tensor gx_r, gx_c;
    if (c->conv) {
        gx_r = make4(gxdt, o.x.shape, (int)test_rand_int(0, 2));
    } else {
        gx_r = test_tensor(gxdt, o.x.ndim, o.x.shape, NULL);
    }
    gx_c = gx_r;
    gx_c.data = malloc(tensor_span(&gx_r) + 64);
    struct bie_tensor gw_r = test_tensor(gwdt, o.w.ndim, o.w.shape, NULL), gw_c = gw_r;
    gw_c.data = malloc(tensor_span(&gw_r) + 64);
    const int64_t bs[1] = {c->C};
    struct bie_tensor gb_r = test_tensor(gbdt, 1, bs, NULL), gb_c = gb_r;
    gb_c.data = malloc(tensor_span(&gb_r) + 64);
    struct bie_tensor gs_r = test_tensor(gsdt, 0, NULL, NULL), gs_c = gs_r;
    gs_c.data = malloc(16);
    struct bie_tensor dgx = cuda_mirror(&gx_r), dgw = cuda_mirror(&gw_r), dgb = cuda_mirror(&gb_r),
                      dgs = cuda_mirror(&gs_r);
    // which gradients are asked for: all four, grad_weight only, or grad_x with or without
    // grad_weight (with neither scale nor bias gradient the STE mask is applied in place)
    const int want = in_place ? (int)test_rand_int(1, 2) : (int)test_rand_int(0, 5), only_w = want == 0,
              no_sums = want == 1 || want == 2;
    struct bie_backward_args ar = {&o.x, c->bias ? &o.bias : NULL, &o.w, &o.sa, &o.sw, &g, &gx_r, &gw_r, &gs_r, &gb_r,
                                   NULL};
    struct bie_backward_args ac = {&o.dx,
                                   c->bias ? &o.dbias : NULL,
                                   &o.dw,
                                   &o.dsa,
                                   &o.dsw,
                                   &dg,
                                   only_w ? NULL : &dgx,
                                   want == 2 ? NULL : &dgw,
                                   only_w || no_sums ? NULL : &dgs,
                                   only_w || no_sums ? NULL : &dgb,
                                   NULL};
    if (saved) {
        ac.x = &dbits;
        ac.bias_a = NULL;
        ac.x_mask = only_w ? NULL : &dmask;
    }
    enum bie_status sr = backward(ref_ctx, c, &ar);
    enum bie_status sc = backward(cu_ctx, c, &ac);
    CHECK(sr == BIE_STATUS_OK, "reference backward failed (%s) on %s", bie_context_last_error(ref_ctx), c->text);
    CHECK(sc == BIE_STATUS_OK, "cuda backward failed (%s) on %s", bie_context_last_error(cu_ctx), c->text);
    if (sr == BIE_STATUS_OK && sc == BIE_STATUS_OK) {
        CHECK(bie_context_cuda_synchronize(cu_ctx) == BIE_STATUS_OK, "sync: %s", bie_context_last_error(cu_ctx));
        if (want != 2) {
            cuda_fetch(&gw_c, &dgw);
            compare_grad("grad_weight", &gw_c, &gw_r, c);
        }
        if (!only_w) {
            cuda_fetch(&gx_c, &dgx);
            compare_grad("grad_x", &gx_c, &gx_r, c);
        }
        if (!only_w && !no_sums) {
            cuda_fetch(&gb_c, &dgb);
            cuda_fetch(&gs_c, &dgs);
            compare_grad("grad_bias_a", &gb_c, &gb_r, c);
            // grad_scale_a sums numel(x) terms, each bounded by max|gx| * hi: the f32 products and
            // double sums differ from the reference by rounding of the terms only.
            double d, m, dx, mx;
            max_diff(&gs_c, &gs_r, &d, &m);
            max_diff(&gx_c, &gx_r, &dx, &mx);
            const double hi = c->quant == BIE_QUANT_BINARY ? 1 : c->quant == BIE_QUANT_INT4 ? 7 : 127;
            const double n = (double)bie_tensor_numel(&o.x);
            const double tol = tol_for(gsdt) * m + 1e-5 * sqrt(n) * (mx + 1e-6) * hi * 4;
            CHECK(d <= tol, "grad_scale_a: |got-ref| = %g > %g (ref %g) on %s", d, tol, m, c->text);
        }
        struct bie_tensor * const got[4] = {&gx_c, &gw_c, &gs_c, &gb_c};
        if (saved) same_as_float(c, &o, &ac, got);
    }
    cuda_tensor_free(&dbits);
    cuda_tensor_free(&dmask);
    test_tensor_free(&bits);
    test_tensor_free(&mask);
    cuda_tensor_free(&dg);
    cuda_tensor_free(&dgx);
    cuda_tensor_free(&dgw);
    cuda_tensor_free(&dgb);
    cuda_tensor_free(&dgs);
    test_tensor_free(&g);
    test_tensor_free(&gx_r);
    test_tensor_free(&gx_c);
    test_tensor_free(&gw_r);
    test_tensor_free(&gw_c);
    test_tensor_free(&gb_r);
    test_tensor_free(&gb_c);
    test_tensor_free(&gs_r);
    test_tensor_free(&gs_c);
    free_operands(c, &o);
}

// bie_binarize_ste on CUDA against the reference: f32/f16/bf16 x of 2 or 3 dims in any layout
// (dense, gapped rows, strided elements: test_tensor_rows), with and without bias_a, host or device
// scale_a, bits and mask in any layout (rows that start on whole bytes take the forward's packer,
// others the per-element path), either output alone. big: more than 1024 rows of more than 2048
// features, so that the packer runs whole rows a warp with all its loads in flight.
static void test_binarize(int big) {
    const int nd = !big && test_rand_int(0, 3) == 0 ? 3 : 2;
    int64_t shape[3] = {0, 0, 0};
    if (big) {
        shape[0] = test_rand_int(1025, 1100);
        shape[1] = test_rand_int(0, 1) ? 8 * test_rand_int(257, 330) : test_rand_int(2049, 2600);
    } else {
        shape[0] = test_rand_int(1, 70);
        if (nd == 3) shape[1] = test_rand_int(1, 5);
        shape[nd - 1] = test_rand_int(0, 2) ? test_rand_int(1, 80) : test_rand_int(250, 700);
    }
    const int64_t K = shape[nd - 1];
    const enum bie_dtype xd = float_dts[test_rand_int(0, 2)];
    const int xl = big ? 0 : (int)test_rand_int(0, 2), bl = (int)test_rand_int(0, 2), ml = (int)test_rand_int(0, 2);
    const int bias = test_rand_int(0, 1), dev_scale = test_rand_int(0, 1), want_bits = test_rand_int(0, 3) != 0;
    const int want_mask = !want_bits || test_rand_int(0, 3) != 0;
    const float sa = (float)test_rand_int(4, 40) / 16.0f;
    char text[240];
    snprintf(text, sizeof text,
             "binarize_ste x %s [%lld, %lld, %lld] (%d-D) layouts x/bits/mask %d/%d/%d bias %d "
             "devscale %d scale %g bits %d mask %d",
             bie_dtype_name(xd), (long long)shape[0], (long long)shape[1], (long long)shape[2], nd, xl, bl, ml, bias,
             dev_scale, (double)sa, want_bits, want_mask);
    struct bie_tensor x = test_tensor_rows(xd, nd, shape, xl),
                      b = test_tensor(float_dts[test_rand_int(0, 2)], 1, &K, NULL);
    fill_operand(&x, sa, 2.0f);
    fill_operand(&b, sa * 0.25f, 1.0f);
    struct bie_tensor s = test_scalar(sa), ds = dev_scale ? cuda_mirror(&s) : s;
    struct bie_tensor rb = test_tensor_rows(BIE_DTYPE_B1, nd, shape, bl),
                      rm = test_tensor_rows(BIE_DTYPE_B1, nd, shape, ml);
    fill_poison(&rb);
    fill_poison(&rm);
    struct bie_tensor cb = rb, cm = rm;
    cb.data = malloc(tensor_span(&rb) + 64);
    cm.data = malloc(tensor_span(&rm) + 64);
    struct bie_tensor dx = cuda_mirror(&x), db = cuda_mirror(&b), dbits = cuda_mirror(&rb), dmask = cuda_mirror(&rm);
    const enum bie_status sr =
        bie_binarize_ste(ref_ctx, &x, bias ? &b : NULL, &s, want_bits ? &rb : NULL, want_mask ? &rm : NULL);
    const enum bie_status sc =
        bie_binarize_ste(cu_ctx, &dx, bias ? &db : NULL, &ds, want_bits ? &dbits : NULL, want_mask ? &dmask : NULL);
    CHECK(sr == BIE_STATUS_OK, "reference failed (%s) on %s", bie_context_last_error(ref_ctx), text);
    CHECK(sc == BIE_STATUS_OK, "cuda failed (%s) on %s", bie_context_last_error(cu_ctx), text);
    if (sr == BIE_STATUS_OK && sc == BIE_STATUS_OK) {
        CHECK(bie_context_cuda_synchronize(cu_ctx) == BIE_STATUS_OK, "sync: %s", bie_context_last_error(cu_ctx));
        cuda_fetch(&cb, &dbits);
        cuda_fetch(&cm, &dmask);
        const struct bie_tensor *got[2] = {&cb, &cm}, *ref[2] = {&rb, &rm};
        for (int i = 0; i < 2; i++) {
            const int same = memcmp(got[i]->data, ref[i]->data, tensor_span(ref[i])) == 0;
            char where[512] = "";
            if (!same) count_mismatch(got[i], ref[i], where, sizeof where);
            CHECK(same, "%s differs from the reference (%s) on %s", i ? "mask" : "bits", where, text);
        }
    }
    cuda_tensor_free(&dx);
    cuda_tensor_free(&db);
    cuda_tensor_free(&dbits);
    cuda_tensor_free(&dmask);
    if (dev_scale) cuda_tensor_free(&ds);
    struct bie_tensor * ts[] = {&x, &b, &s, &rb, &rm, &cb, &cm};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) test_tensor_free(ts[i]);
}

// Saved bits in rows that do not start on whole bytes: grad_weight alone (the codes through the
// pixel-row path) matches the reference; grad_x is UNSUPPORTED on CUDA, with a message.
static void test_saved_layouts(void) {
    const int64_t M = test_rand_int(2, 40), K = test_rand_int(2, 300), N = test_rand_int(1, 60); // (K = 1: any stride)
    const int64_t xs[2] = {M, K}, ws[2] = {N, K}, ys[2] = {M, N};
    struct bie_tensor x = test_tensor(BIE_DTYPE_F32, 2, xs, NULL), w = test_tensor(BIE_DTYPE_F32, 2, ws, NULL);
    struct bie_tensor g = test_tensor(BIE_DTYPE_F32, 2, ys, NULL), s = test_scalar(0.75f);
    struct bie_tensor bits = test_tensor_rows(BIE_DTYPE_B1, 2, xs, 2), mask = test_tensor_rows(BIE_DTYPE_B1, 2, xs, 2);
    struct bie_tensor gw_r = test_tensor(BIE_DTYPE_F32, 2, ws, NULL), gw_c = gw_r,
                      gx = test_tensor(BIE_DTYPE_F32, 2, xs, NULL);
    gw_c.data = malloc(tensor_span(&gw_r) + 64);
    fill_operand(&x, 0.75f, 2.0f);
    fill_operand(&w, 1.0f, 1.0f);
    fill_operand(&g, 1.0f, 1.0f);
    struct bie_tensor dx = cuda_mirror(&x), dw = cuda_mirror(&w), dg = cuda_mirror(&g), dbits = cuda_mirror(&bits);
    struct bie_tensor dmask = cuda_mirror(&mask), dgw = cuda_mirror(&gw_r), dgx = cuda_mirror(&gx);
    char text[120];
    snprintf(text, sizeof text, "saved bits with strided elements M=%lld K=%lld N=%lld", (long long)M, (long long)K,
             (long long)N);
    const struct bie_linear_desc d = {BIE_QUANT_BINARY, K, N};
    CHECK_OK(cu_ctx, bie_binarize_ste(cu_ctx, &dx, NULL, &s, &dbits, &dmask));
    struct bie_backward_args ar = {&x, NULL, &w, &s, &s, &g, NULL, &gw_r, NULL, NULL, NULL};
    struct bie_backward_args ac = {&dbits, NULL, &dw, &s, &s, &dg, NULL, &dgw, NULL, NULL, NULL};
    CHECK_OK(ref_ctx, bie_linear_backward(ref_ctx, &d, &ar));
    CHECK_OK(cu_ctx, bie_linear_backward(cu_ctx, &d, &ac));
    CHECK(bie_context_cuda_synchronize(cu_ctx) == BIE_STATUS_OK, "sync: %s", bie_context_last_error(cu_ctx));
    cuda_fetch(&gw_c, &dgw);
    struct lcase c;
    memset(&c, 0, sizeof c);
    snprintf(c.text, sizeof c.text, "%s", text);
    compare_grad("grad_weight", &gw_c, &gw_r, &c);
    ac.grad_x = &dgx;
    ac.x_mask = &dmask;
    const enum bie_status st = bie_linear_backward(cu_ctx, &d, &ac);
    CHECK(st == BIE_STATUS_UNSUPPORTED && strstr(bie_context_last_error(cu_ctx), "x_mask"),
          "grad_x from strided saved bits: got %s \"%s\", want unsupported naming x_mask (%s)", bie_status_string(st),
          bie_context_last_error(cu_ctx), text);
    struct bie_tensor * dev[] = {&dx, &dw, &dg, &dbits, &dmask, &dgw, &dgx};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) cuda_tensor_free(dev[i]);
    struct bie_tensor * host[] = {&x, &w, &g, &s, &bits, &mask, &gw_r, &gw_c, &gx};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) test_tensor_free(host[i]);
}

// Every output kind of the tiled GEMMs in one process, in an order that once exposed two kernel
// variants sharing a shared-memory-limit slot: tile widths 64 and 128 (O = 48, 100, 296; rows of
// 96, 200 and 592 bytes in f16, so both the bulk-store and the row-store epilogues run),
// each pad value (zero padding adds the border correction) and each y dtype, on a binary conv of
// 288 output rows (x NCHW or channels-last, 64 channels), then the same through the n-bit path.
static void test_all_outputs(void) {
    static const enum bie_dtype ydts[5] = {BIE_DTYPE_B1, BIE_DTYPE_I32, BIE_DTYPE_F16, BIE_DTYPE_BF16, BIE_DTYPE_F32};
    static const int64_t os[3] = {48, 100, 296};
    for (int q = 0; q < 2; q++)
        for (int oi = 0; oi < 3; oi++)
            for (int pv = 0; pv < (q ? 1 : 3); pv++)
                for (int yi = q; yi < 5; yi++) {
                    struct lcase c;
                    random_case(&c, 2);
                    c.quant = c.cd.quant = q ? BIE_QUANT_INT8 : BIE_QUANT_BINARY;
                    c.batch = 2;
                    c.C = c.cd.in_channels = 64; // whole words of channels: the pixel packers
                    c.xkind = (int)test_rand_int(0, 1);
                    c.H = c.W = 12;
                    c.O = c.cd.out_channels = os[oi];
                    for (int i = 0; i < 2; i++) {
                        c.cd.kernel[i] = 3;
                        c.cd.stride[i] = 1;
                        c.cd.padding[i] = 1;
                        c.cd.dilation[i] = 1;
                    }
                    c.cd.pad_value = (enum bie_pad_value)pv;
                    c.ydt = ydts[yi];
                    c.ykind = 1; // channels-last: the fast epilogue
                    c.wdt = BIE_DTYPE_F32;
                    if (c.xdt == BIE_DTYPE_B1 && q) c.xdt = BIE_DTYPE_F32;
                    describe(&c);
                    test_forward(&c);
                }
}

// A k x k kernel with stride 1, padding 1 and no dilation.
static void square_kernel(struct lcase * c, int32_t k) {
    for (int d = 0; d < 2; d++) {
        c->cd.kernel[d] = k;
        c->cd.stride[d] = 1;
        c->cd.padding[d] = 1;
        c->cd.dilation[d] = 1;
    }
}

// The caller's stream is used, and the status of a bad device pointer is a DEVICE_ERROR, not a crash.
static void test_stream(void) {
    cudaStream_t s;
    CUDA_OK(cudaStreamCreate(&s));
    CHECK_OK(cu_ctx, bie_context_set_cuda_stream(cu_ctx, s));
    CHECK(bie_context_cuda_stream(cu_ctx) == (void *)s, "stream getter returns the stream set");
    struct lcase c;
    random_case(&c, 0);
    test_forward(&c);
    CHECK_OK(cu_ctx, bie_context_set_cuda_stream(cu_ctx, NULL));
    CUDA_OK(cudaStreamDestroy(s));
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    cuda_test_require_gpu("test-cuda-layers");
    cuda_test_contexts(&ref_ctx, &cu_ctx);
    const int n = cuda_test_quick() ? 20 : 150;
    for (int i = 0; i < n; i++) {
        struct lcase c;
        random_case(&c, 0);
        test_forward(&c);
    }
    for (int i = 0; i < (cuda_test_quick() ? 2 : 8); i++) { // n-bit linear, long rows
        struct lcase c;
        random_case(&c, 8);
        test_forward(&c);
    }
    for (int i = 0; i < (cuda_test_quick() ? 0 : 4); i++) { // the widest tiles
        struct lcase c;
        random_case(&c, 1);
        test_forward(&c);
    }
    for (int i = 0; i < (cuda_test_quick() ? 1 : 6); i++) { // large binary GEMMs
        struct lcase c;
        random_case(&c, 4);
        test_forward(&c);
    }
    for (int i = 0; i < (cuda_test_quick() ? 1 : 6); i++) { // binary, 256-column tiles
        struct lcase c;
        random_case(&c, 5);
        test_forward(&c);
    }
    for (int i = 0; i < (cuda_test_quick() ? 1 : 2); i++) { // the same with K of 5 or 6 stages
        struct lcase c;
        random_case(&c, 7);
        test_forward(&c);
    }
    for (int i = 0; i < (cuda_test_quick() ? 1 : 2); i++) { // binary convs gathered in 256-column tiles
        struct lcase c;
        random_case(&c, 6);
        test_forward(&c);
    }
    for (int i = 0; i < (cuda_test_quick() ? 6 : 40); i++) { // ResNet block convs with an output epilogue
        struct lcase c;
        random_case(&c, 9);
        test_forward(&c);
    }
    for (int i = 0; i < (cuda_test_quick() ? 2 : 10); i++) { // larger convolutions
        struct lcase c;
        random_case(&c, 2);
        test_forward(&c);
    }
    for (int i = 0; i < (cuda_test_quick() ? 3 : 36); i++) { // binary convs, C % 32 == 0
        struct lcase c;
        random_case(&c, 3);
        test_forward(&c);
    }
    for (int i = 0; i < 2; i++) { // zero-padded binary conv, B1 weight read in place (K = 1024 bits)
        struct lcase c;
        random_case(&c, 3);
        c.C = c.cd.in_channels = 256;
        for (int d = 0; d < 2; d++) {
            c.cd.kernel[d] = 2;
            c.cd.padding[d] = 1;
        }
        c.cd.pad_value = BIE_PAD_ZERO;
        c.wdt = BIE_DTYPE_B1;
        describe(&c);
        test_forward(&c);
    }
    for (int i = 0; i < 3; i++) { // a binary linear layer's B1 weight of one row broadcast (stride 0), K % 8 == 0
        struct lcase c;
        do random_case(&c, 0);
        while (c.conv || c.quant != BIE_QUANT_BINARY);
        c.C = c.ld.in_features = 8 * test_rand_int(1, 40);
        c.wdt = BIE_DTYPE_B1;
        c.wpad = -1;
        describe(&c);
        test_forward(&c);
    }
    for (int i = 0; i < 5; i++) { // gathered rows (tiles of 64, 128 or 256 columns as O falls), a B1 weight
        // copied by weight_terms (C = 128: 1152-bit rows, dense or 1216 bits apart; C = 64; C = 96
        // with rows 896 bits apart), -1 and zero padding
        struct lcase c;
        random_case(&c, 3);
        c.batch = 2;
        c.C = c.cd.in_channels = i < 3 ? 128 : i == 3 ? 64 : 96;
        c.ld.in_features = c.C; // (as random_case keeps them)
        c.H = c.W = 12;
        square_kernel(&c, 3);
        c.cd.pad_value = i % 2 ? BIE_PAD_ZERO : BIE_PAD_MINUS_ONE;
        c.wdt = BIE_DTYPE_B1;
        c.wpad = i == 2 ? 64 : i == 4 ? 32 : 0;
        describe(&c);
        test_forward(&c);
    }
    { // zero padding with a 111 x 111 kernel: 12321 taps, 394,272 bits of K
        struct lcase c;
        random_case(&c, 3);
        c.batch = 1;
        c.C = c.cd.in_channels = 32;
        c.O = c.cd.out_channels = test_rand_int(1, 20);
        c.ld.in_features = c.C; // (as random_case keeps them)
        c.ld.out_features = c.O;
        c.H = c.W = 111;
        square_kernel(&c, 111);
        c.cd.pad_value = BIE_PAD_ZERO;
        describe(&c);
        test_forward(&c);
    }
    test_all_outputs();
    for (int i = 0; i < 6; i++) { // few rows (the split-K GEMM) with a B1 y that it packs itself: linear layers,
                                  // then a one-sample conv of 5 x 5 output pixels (channels-last y)
        struct lcase c;
        do random_case(&c, 0);
        while (c.conv != (i >= 3));
        c.quant = c.cd.quant = c.ld.quant = BIE_QUANT_BINARY;
        if (c.wdt == BIE_DTYPE_S4) c.wdt = BIE_DTYPE_B1;
        c.batch = c.conv ? 1 : test_rand_int(1, 32);
        c.lead2 = 0;
        c.O = c.cd.out_channels = c.ld.out_features = 8 * test_rand_int(1, 40);
        c.ydt = BIE_DTYPE_B1;
        if (c.conv) {
            c.H = c.W = 5;
            square_kernel(&c, 3);
            c.cd.pad_value = BIE_PAD_MINUS_ONE;
            c.ykind = 1;
        }
        describe(&c);
        test_forward(&c);
    }
    for (int i = 0; i < n / 2; i++) {
        struct lcase c;
        random_case(&c, 0);
        test_backward(&c, 0, 0);
    }
    for (int i = 0; i < (cuda_test_quick() ? 1 : 6); i++) { // larger convolutions: several tiles of the STE pass
        struct lcase c;
        random_case(&c, i % 2 ? 2 : 3);
        test_backward(&c, 0, 0);
    }
    // the backward from the bits that bie_binarize_ste saves
    for (int i = 0; i < n / 2; i++) test_binarize(0);
    for (int i = 0; i < (cuda_test_quick() ? 1 : 4); i++) test_binarize(1);
    for (int i = 0; i < n / 2; i++) {
        struct lcase c;
        do random_case(&c, 0);
        while (c.conv);
        test_backward(&c, 1, 0);
    }
    for (int i = 0; i < (cuda_test_quick() ? 1 : 4); i++) { // wide rows: the warp-per-row passes
        struct lcase c;
        do random_case(&c, 0);
        while (c.conv);
        c.C = c.ld.in_features = c.cd.in_channels = test_rand_int(256, 2600);
        test_backward(&c, 1, 0);
    }
    for (int i = 0; i < (cuda_test_quick() ? 2 : 6); i++) { // grad_x masked in place, by whole 16-byte chunks
        struct lcase c;
        do random_case(&c, 0);
        while (c.conv);
        c.C = c.ld.in_features = c.cd.in_channels = 128 * test_rand_int(1, 12);
        test_backward(&c, 1, 1);
    }
    for (int i = 0; i < (cuda_test_quick() ? 2 : 6); i++) { // the same from the float x
        struct lcase c;
        do random_case(&c, 0);
        while (c.conv);
        c.C = c.ld.in_features = c.cd.in_channels = 128 * test_rand_int(1, 12);
        test_backward(&c, 0, 1);
    }
    for (int i = 0; i < 3; i++) test_saved_layouts();
    test_stream();
    bie_context_destroy(ref_ctx);
    bie_context_destroy(cu_ctx);
    return test_finish("test-cuda-layers");
}
