// SPDX-License-Identifier: Apache-2.0
// test-cuda-conv-bits.c: the backward of a binary conv from the bits and STE mask that
// bie_binarize_ste saves of its channels-last input (x viewed as [N, H, W, C]), on CUDA:
//   - every gradient within the float tolerance of the reference's backward from the float x
//     (max|got - ref| <= tol(dtype) * max|ref|; tol = 1e-4 f32, 2^-9 f16, 2^-6 bf16; grad_scale_a,
//     a sum of terms +-grad_x / sqrt(numel(x)) that cancel, within tol * sum|grad_x| / sqrt(numel(x)));
//   - equal to the CUDA backward from the float x: grad_x, grad_weight and grad_bias_a identical,
//     grad_scale_a within one unit in the last place (its blocks meet in double atomic adds);
//   - the forward from the bits identical to the forward from the float x;
//   - with random grad_x_mask bits: grad_x gated exactly (the ungated value or 0), grad_weight and
//     grad_bias_a identical, grad_scale_a within one unit in the last place;
// bie_binarize_ste_clamped on CUDA against the reference, byte for byte (rows of 8k channels: the
// one-pass kernel; others: the per-element codes; values at +-t, beyond it and NaN);
// and the conv backward of every layer kind on its cuDNN route (the default) against its GEMM route
// (BIE_CUDA_CONV_BACKWARD=gemm in a second context), within the same tolerance. Random odd
// shapes, strides, padding and dilation; host or device scales. A failure prints the seed and case.
#include "cuda-test.h"

#include <math.h>

static bie_context_t *ref_ctx, *cu_ctx;
static const enum bie_dtype float_dts[3] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16};

static double tol_for(enum bie_dtype dt) { return dt == BIE_DTYPE_F32 ? 1e-4 : dt == BIE_DTYPE_F16 ? 0x1p-9 : 0x1p-6; }

static void close_to(const char * name, const struct bie_tensor * got, const struct bie_tensor * ref,
                     const char * text) {
    double d, m;
    max_diff(got, ref, &d, &m);
    const double tol = tol_for(got->dtype) * (m > 1e-30 ? m : 1e-30);
    CHECK(d <= tol, "%s: max|got-ref| = %g > %g (max|ref| = %g) on %s", name, d, tol, m, text);
}

// sum |t| over the elements of a host tensor.
static double sum_abs(const struct bie_tensor * t) {
    int64_t idx[BIE_MAX_DIMS] = {0};
    double s = 0.0;
    do s += fabs(bie_load(t, bie_offset(t, idx)));
    while (bie_next_index(t, idx));
    return s;
}

struct conv_case {
    struct bie_conv2d_desc d;
    int64_t N, C, H, W, OH, OW;
    enum bie_dtype xdt, gdt;
    int bias, dev_scales;
    float sa, sw;
    char text[300];
};

// A random conv. saved: shapes that cuDNN's NHWC plans take (channels in multiples of 8; the saved
// bits' only route), no dilation, an f16 or bf16 grad_y (the binding saves bits only then).
static int random_conv(struct conv_case * c, enum bie_quant q, int saved) {
    memset(c, 0, sizeof *c);
    c->N = test_rand_int(1, 4);
    c->C = saved ? 8 * test_rand_int(1, 12) : test_rand_int(0, 2) ? 32 * test_rand_int(1, 3) : test_rand_int(1, 70);
    c->H = test_rand_int(1, 12);
    c->W = test_rand_int(1, 12);
    const int64_t O = saved ? 8 * test_rand_int(1, 5) : test_rand_int(1, 40);
    c->d = (struct bie_conv2d_desc){q, c->C, O, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, BIE_PAD_ZERO};
    if (test_rand_int(0, 2) == 0)
        for (int i = 0; i < 2; i++) {
            c->d.kernel[i] = (int32_t)test_rand_int(1, 4);
            c->d.stride[i] = (int32_t)test_rand_int(1, 2);
            c->d.padding[i] = (int32_t)test_rand_int(0, 2);
            c->d.dilation[i] = (int32_t)(saved ? 1 : test_rand_int(1, 2));
        }
    if (bie_conv2d_output_size(&c->d, c->H, c->W, &c->OH, &c->OW) != BIE_STATUS_OK) return 0;
    c->xdt = float_dts[test_rand_int(0, 2)];
    c->gdt = saved ? float_dts[test_rand_int(1, 2)] : float_dts[test_rand_int(0, 2)]; // (saved: cuDNN's graph API)
    c->bias = (int)test_rand_int(0, 1);
    c->dev_scales = (int)test_rand_int(0, 1);
    c->sa = (float)test_rand_int(4, 40) / 16.0f;
    c->sw = test_rand_float(0.02f, 0.3f);
    snprintf(c->text, sizeof c->text,
             "q=%d N=%lld C=%lld %lldx%lld O=%lld k=%dx%d s=%dx%d p=%dx%d d=%dx%d x=%s g=%s "
             "bias=%d devscale=%d sa=%g",
             (int)q, (long long)c->N, (long long)c->C, (long long)c->H, (long long)c->W, (long long)O, c->d.kernel[0],
             c->d.kernel[1], c->d.stride[0], c->d.stride[1], c->d.padding[0], c->d.padding[1], c->d.dilation[0],
             c->d.dilation[1], bie_dtype_name(c->xdt), bie_dtype_name(c->gdt), c->bias, c->dev_scales, (double)c->sa);
    return 1;
}

// The operands of a case: host tensors and their device mirrors.
struct ops {
    struct bie_tensor x, w, bias, g, sa, sw;
    struct bie_tensor dx, dw, dbias, dg, dsa, dsw;
};

static void make_ops(const struct conv_case * c, struct ops * o) {
    const int64_t xs[4] = {c->N, c->C, c->H, c->W}, ws[4] = {c->d.out_channels, c->C, c->d.kernel[0], c->d.kernel[1]};
    const int64_t gs[4] = {c->N, c->d.out_channels, c->OH, c->OW}, bs[1] = {c->C};
    o->x = make4(c->xdt, xs, 1); // channels-last
    o->w = make4(float_dts[test_rand_int(0, 2)], ws, (int)test_rand_int(0, 1));
    o->bias = test_tensor(BIE_DTYPE_F32, 1, bs, NULL);
    o->g = make4(c->gdt, gs, (int)test_rand_int(0, 2));
    const float range = c->d.quant == BIE_QUANT_BINARY ? 2.0f : c->d.quant == BIE_QUANT_INT4 ? 10.0f : 150.0f;
    test_fill_uniform(&o->x, -range * c->sa, range * c->sa);
    test_fill_uniform(&o->w, -range * c->sw, range * c->sw);
    test_fill_uniform(&o->bias, -0.25f * c->sa, 0.25f * c->sa);
    test_fill_uniform(&o->g, -1.0f, 1.0f);
    o->sa = test_scalar(c->sa);
    o->sw = test_scalar(c->sw);
    o->dx = cuda_mirror(&o->x);
    o->dw = cuda_mirror(&o->w);
    o->dbias = cuda_mirror(&o->bias);
    o->dg = cuda_mirror(&o->g);
    o->dsa = c->dev_scales ? cuda_mirror(&o->sa) : o->sa;
    o->dsw = c->dev_scales ? cuda_mirror(&o->sw) : o->sw;
}

static void free_ops(const struct conv_case * c, struct ops * o) {
    struct bie_tensor * host[] = {&o->x, &o->w, &o->bias, &o->g, &o->sa, &o->sw};
    struct bie_tensor * dev[] = {&o->dx, &o->dw, &o->dbias, &o->dg};
    for (size_t i = 0; i < 6; i++) test_tensor_free(host[i]);
    for (size_t i = 0; i < 4; i++) cuda_tensor_free(dev[i]);
    if (c->dev_scales) {
        cuda_tensor_free(&o->dsa);
        cuda_tensor_free(&o->dsw);
    }
}

// Gradient outputs: host tensors (gx channels-last like x) and their device twins.
struct grads {
    struct bie_tensor h[4], d[4];
};
static const char * const gnames[4] = {"grad_x", "grad_weight", "grad_scale_a", "grad_bias_a"};

// A random float dtype; with within: one no more precise than grad_y's dtype gdt (bf16 < f16 < f32),
// as the cuDNN route computes in gdt.
static enum bie_dtype grad_dtype(enum bie_dtype gdt, int within) {
    if (!within) return float_dts[test_rand_int(0, 2)];
    const enum bie_dtype ok[3] = {BIE_DTYPE_BF16, BIE_DTYPE_F16, BIE_DTYPE_F32};
    const int n = gdt == BIE_DTYPE_BF16 ? 1 : gdt == BIE_DTYPE_F16 ? 2 : 3;
    return ok[test_rand_int(0, n - 1)];
}

static void make_grads(const struct conv_case * c, const struct ops * o, struct grads * g, int within) {
    const int64_t bs[1] = {c->C};
    g->h[0] = make4(grad_dtype(c->gdt, within), o->x.shape, 1);
    g->h[1] = test_tensor(grad_dtype(c->gdt, within), 4, o->w.shape, NULL);
    g->h[2] = test_tensor(grad_dtype(c->gdt, within), 0, NULL, NULL);
    g->h[3] = test_tensor(grad_dtype(c->gdt, within), 1, bs, NULL);
    for (int i = 0; i < 4; i++) {
        fill_poison(&g->h[i]);
        g->d[i] = cuda_mirror(&g->h[i]);
    }
}
static void like_grads(const struct grads * p, struct grads * g) {
    for (int i = 0; i < 4; i++) {
        g->h[i] = p->h[i];
        g->h[i].data = malloc(tensor_span(&p->h[i]) + 64);
        memcpy(g->h[i].data, p->h[i].data, tensor_span(&p->h[i]));
        g->d[i] = cuda_mirror(&g->h[i]);
    }
}
static void fetch_grads(struct grads * g) {
    CHECK(bie_context_cuda_synchronize(cu_ctx) == BIE_STATUS_OK, "sync: %s", bie_context_last_error(cu_ctx));
    for (int i = 0; i < 4; i++) cuda_fetch(&g->h[i], &g->d[i]);
}
static void free_grads(struct grads * g) {
    for (int i = 0; i < 4; i++) {
        test_tensor_free(&g->h[i]);
        cuda_tensor_free(&g->d[i]);
    }
}
static struct bie_backward_args grad_args(const struct ops * o, struct grads * g, int device, const bool want[4]) {
    struct bie_tensor * t = device ? g->d : g->h;
    struct bie_backward_args a = {device ? &o->dx : &o->x,
                                  NULL,
                                  device ? &o->dw : &o->w,
                                  device ? &o->dsa : &o->sa,
                                  device ? &o->dsw : &o->sw,
                                  device ? &o->dg : &o->g,
                                  want[0] ? &t[0] : NULL,
                                  want[1] ? &t[1] : NULL,
                                  want[2] ? &t[2] : NULL,
                                  want[3] ? &t[3] : NULL,
                                  NULL,
                                  NULL,
                                  NULL,
                                  0.0f};
    return a;
}

// grad_scale_a a and b within one unit in the last place of dtype dt.
static bool within_ulp(double a, double b, enum bie_dtype dt) {
    const double ulp = dt == BIE_DTYPE_F32 ? 0x1p-23 : dt == BIE_DTYPE_F16 ? 0x1p-10 : 0x1p-7;
    return fabs(a - b) <= ulp * fabs(a);
}

// The call ab (from saved bits, with grad_x) again with random grad_x_mask bits (laid out as the
// host bits `like`, [N, H, W, C]): against its gradients sb, grad_x is gated, the others unchanged.
static void test_gated(const struct conv_case * c, const struct bie_backward_args * ab, const struct grads * sb,
                       const struct bie_tensor * like) {
    struct bie_tensor gate = *like;
    gate.data = malloc(tensor_span(like) + 16);
    for (size_t i = 0; i < tensor_span(like); i++) ((uint8_t *)gate.data)[i] = (uint8_t)test_rand_int(0, 255);
    struct bie_tensor dgate = cuda_mirror(&gate);
    const int32_t to_nchw[4] = {0, 3, 1, 2};
    bie_tensor_permute(&gate, to_nchw);
    bie_tensor_permute(&dgate, to_nchw);
    struct grads gd;
    like_grads(sb, &gd);
    struct bie_backward_args ag = *ab;
    struct bie_tensor * outs[4] = {&gd.d[0], &gd.d[1], &gd.d[2], &gd.d[3]};
    ag.grad_x = outs[0];
    ag.grad_weight = ab->grad_weight ? outs[1] : NULL;
    ag.grad_scale_a = ab->grad_scale_a ? outs[2] : NULL;
    ag.grad_bias_a = ab->grad_bias_a ? outs[3] : NULL;
    ag.grad_x_mask = &dgate;
    CHECK_OK(cu_ctx, bie_conv2d_backward(cu_ctx, &c->d, &ag));
    fetch_grads(&gd);
    if (ab->grad_weight)
        CHECK(memcmp(sb->h[1].data, gd.h[1].data, tensor_span(&sb->h[1])) == 0,
              "grad_weight changed by grad_x_mask on %s", c->text);
    if (ab->grad_bias_a)
        CHECK(memcmp(sb->h[3].data, gd.h[3].data, tensor_span(&sb->h[3])) == 0,
              "grad_bias_a changed by grad_x_mask on %s", c->text);
    if (ab->grad_scale_a)
        CHECK(within_ulp(bie_load(&sb->h[2], 0), bie_load(&gd.h[2], 0), sb->h[2].dtype),
              "grad_scale_a changed by grad_x_mask on %s", c->text);
    int64_t idx[BIE_MAX_DIMS] = {0};
    int bad = 0;
    do {
        const double want =
            bie_load(&gate, bie_offset(&gate, idx)) > 0 ? bie_load(&sb->h[0], bie_offset(&sb->h[0], idx)) : 0.0;
        bad += bie_load(&gd.h[0], bie_offset(&gd.h[0], idx)) != want;
    } while (bie_next_index(&gd.h[0], idx));
    CHECK(bad == 0, "%d elements of the gated grad_x differ on %s", bad, c->text);
    free_grads(&gd);
    free(gate.data);
    cuda_tensor_free(&dgate);
}

// The backward of a binary conv from saved bits, against the reference and the float x on CUDA.
static void test_saved(void) {
    struct conv_case c;
    if (!random_conv(&c, BIE_QUANT_BINARY, 1)) return;
    struct ops o;
    make_ops(&c, &o);
    // the bits and mask of the [N, H, W, C] view, and their NCHW views
    const int64_t nhwc[4] = {c.N, c.H, c.W, c.C};
    const int32_t to_nchw[4] = {0, 3, 1, 2};
    struct bie_tensor bits = test_tensor(BIE_DTYPE_B1, 4, nhwc, NULL), mask = test_tensor(BIE_DTYPE_B1, 4, nhwc, NULL);
    struct bie_tensor dbits = cuda_mirror(&bits), dmask = cuda_mirror(&mask), xrows = o.dx;
    const int32_t to_nhwc[4] = {0, 2, 3, 1};
    bie_tensor_permute(&xrows, to_nhwc);
    CHECK_OK(cu_ctx, bie_binarize_ste(cu_ctx, &xrows, c.bias ? &o.dbias : NULL, &o.dsa, &dbits, &dmask));
    bie_tensor_permute(&dbits, to_nchw);
    bie_tensor_permute(&dmask, to_nchw);
    const int wsel = (int)test_rand_int(0, 2); // all four, grad_weight only (no mask), grad_x only
    const bool want[4] = {wsel != 1, wsel != 2, wsel == 0, wsel == 0};
    struct grads ref, fl, sb;
    make_grads(&c, &o, &ref, 1);
    like_grads(&ref, &fl);
    like_grads(&ref, &sb);
    struct bie_backward_args ar = grad_args(&o, &ref, 0, want), af = grad_args(&o, &fl, 1, want),
                             ab = grad_args(&o, &sb, 1, want);
    ar.bias_a = c.bias ? &o.bias : NULL;
    af.bias_a = c.bias ? &o.dbias : NULL;
    ab.x = &dbits;
    ab.x_mask = wsel == 1 ? NULL : &dmask;
    CHECK_OK(ref_ctx, bie_conv2d_backward(ref_ctx, &c.d, &ar));
    CHECK_OK(cu_ctx, bie_conv2d_backward(cu_ctx, &c.d, &af));
    CHECK_OK(cu_ctx, bie_conv2d_backward(cu_ctx, &c.d, &ab));
    fetch_grads(&fl);
    fetch_grads(&sb);
    for (int i = 0; i < 4; i++) {
        if (!want[i]) continue;
        if (i == 2) { // (grad_x is wanted with grad_scale_a)
            const double d = fabs(bie_load(&sb.h[2], 0) - bie_load(&ref.h[2], 0));
            const double tol = fmax(tol_for(sb.h[2].dtype), tol_for(c.gdt)); // (cuDNN computes in grad_y's dtype)
            const double bound = tol * sum_abs(&ref.h[0]) / sqrt((double)(c.N * c.C * c.H * c.W));
            CHECK(d <= bound, "grad_scale_a: |got-ref| = %g > %g on %s", d, bound, c.text);
        } else {
            close_to(gnames[i], &sb.h[i], &ref.h[i], c.text);
        }
        if (i == 2) {
            const double a = bie_load(&fl.h[2], 0), b = bie_load(&sb.h[2], 0);
            CHECK(within_ulp(a, b, fl.h[2].dtype), "grad_scale_a from the bits %g, from the float x %g on %s", b, a,
                  c.text);
        } else {
            CHECK(memcmp(fl.h[i].data, sb.h[i].data, tensor_span(&fl.h[i])) == 0,
                  "%s from the saved bits differs from the float x's on %s", gnames[i], c.text);
        }
    }
    if (want[0]) test_gated(&c, &ab, &sb, &bits);
    // the forward from the bits is the forward from the float x
    const int64_t ys[4] = {c.N, c.d.out_channels, c.OH, c.OW};
    struct bie_tensor y = make4(c.xdt, ys, 1), y2 = make4(c.xdt, ys, 1);
    fill_poison(&y);
    memcpy(y2.data, y.data, tensor_span(&y));
    struct bie_tensor dy = cuda_mirror(&y), dy2 = cuda_mirror(&y2);
    struct bie_forward_args fx = {.x = &o.dx,
                                  .bias_a = c.bias ? &o.dbias : NULL,
                                  .weight = &o.dw,
                                  .scale_a = &o.dsa,
                                  .scale_w = &o.dsw,
                                  .y = &dy};
    struct bie_forward_args fb = {.x = &dbits, .weight = &o.dw, .scale_a = &o.dsa, .scale_w = &o.dsw, .y = &dy2};
    CHECK_OK(cu_ctx, bie_conv2d_forward(cu_ctx, &c.d, &fx));
    CHECK_OK(cu_ctx, bie_conv2d_forward(cu_ctx, &c.d, &fb));
    CHECK(bie_context_cuda_synchronize(cu_ctx) == BIE_STATUS_OK, "sync: %s", bie_context_last_error(cu_ctx));
    cuda_fetch(&y, &dy);
    cuda_fetch(&y2, &dy2);
    CHECK(memcmp(y.data, y2.data, tensor_span(&y)) == 0, "forward from the saved bits differs on %s", c.text);
    struct bie_tensor * ts[] = {&bits, &mask, &y, &y2};
    for (size_t i = 0; i < 4; i++) test_tensor_free(ts[i]);
    struct bie_tensor * ds[] = {&dbits, &dmask, &dy, &dy2};
    for (size_t i = 0; i < 4; i++) cuda_tensor_free(ds[i]);
    free_grads(&ref);
    free_grads(&fl);
    free_grads(&sb);
    free_ops(&c, &o);
}

// bie_binarize_ste_clamped of pixel rows x [P, C] on CUDA against the reference, every byte of the
// three outputs (which start as zeros on both sides).
static void test_clamped_binarize(void) {
    const int64_t P = test_rand_int(1, 300), C = test_rand_int(0, 1) ? 8 * test_rand_int(1, 12) : test_rand_int(1, 70);
    const enum bie_dtype xd = float_dts[test_rand_int(0, 2)];
    const float t = (float)test_rand_int(4, 24) / 16.0f, s = (float)test_rand_int(4, 40) / 16.0f;
    const int has_bias = (int)test_rand_int(0, 1), dev_scale = (int)test_rand_int(0, 1);
    const int64_t xs[2] = {P, C};
    struct bie_tensor x = test_tensor(xd, 2, xs, NULL), bias = test_tensor(BIE_DTYPE_F32, 1, &C, NULL);
    int64_t idx[BIE_MAX_DIMS] = {0};
    do {
        const int64_t kind = test_rand_int(0, 49);
        const double v = kind == 0   ? NAN
                         : kind <= 6 ? (test_rand_int(0, 1) ? t : -t)
                                     : test_rand_float(-2.0f, 2.0f) * t;
        bie_store(&x, bie_offset(&x, idx), v);
    } while (bie_next_index(&x, idx));
    test_fill_uniform(&bias, -0.3f * t, 0.3f * t);
    struct bie_tensor sa = test_scalar(s), h[3], d[3];
    for (int i = 0; i < 3; i++) {
        h[i] = test_tensor(BIE_DTYPE_B1, 2, xs, NULL);
        memset(h[i].data, 0, tensor_span(&h[i]));
        d[i] = cuda_mirror(&h[i]);
    }
    struct bie_tensor dx = cuda_mirror(&x), dbias = cuda_mirror(&bias), dsa = dev_scale ? cuda_mirror(&sa) : sa;
    char text[160];
    snprintf(text, sizeof text, "P=%lld C=%lld x=%s t=%g scale_a=%g bias=%d devscale=%d", (long long)P, (long long)C,
             bie_dtype_name(xd), (double)t, (double)s, has_bias, dev_scale);
    CHECK_OK(ref_ctx, bie_binarize_ste_clamped(ref_ctx, &x, t, has_bias ? &bias : NULL, &sa, &h[0], &h[1], &h[2]));
    CHECK_OK(cu_ctx, bie_binarize_ste_clamped(cu_ctx, &dx, t, has_bias ? &dbias : NULL, &dsa, &d[0], &d[1], &d[2]));
    CHECK(bie_context_cuda_synchronize(cu_ctx) == BIE_STATUS_OK, "sync: %s", bie_context_last_error(cu_ctx));
    static const char * const names[3] = {"bits", "mask", "clamp_mask"};
    for (int i = 0; i < 3; i++) {
        struct bie_tensor got = h[i];
        got.data = malloc(tensor_span(&h[i]) + 16);
        cuda_fetch(&got, &d[i]);
        CHECK(memcmp(got.data, h[i].data, tensor_span(&h[i])) == 0, "%s differs from the reference on %s", names[i],
              text);
        free(got.data);
        test_tensor_free(&h[i]);
        cuda_tensor_free(&d[i]);
    }
    struct bie_tensor * ht[] = {&x, &bias, &sa};
    for (size_t i = 0; i < 3; i++) test_tensor_free(ht[i]);
    cuda_tensor_free(&dx);
    cuda_tensor_free(&dbias);
    if (dev_scale) cuda_tensor_free(&dsa);
}

// The cuDNN route of every layer kind against the GEMM route (gemm_ctx) and the reference.
static void test_routes(bie_context_t * gemm_ctx) {
    static const enum bie_quant qs[3] = {BIE_QUANT_BINARY, BIE_QUANT_INT4, BIE_QUANT_INT8};
    struct conv_case c;
    if (!random_conv(&c, qs[test_rand_int(0, 2)], 0)) return;
    struct ops o;
    make_ops(&c, &o);
    const bool want[4] = {true, true, true, true};
    struct grads ref, a, b;
    make_grads(&c, &o, &ref, 0);
    like_grads(&ref, &a);
    like_grads(&ref, &b);
    struct bie_backward_args ar = grad_args(&o, &ref, 0, want), aa = grad_args(&o, &a, 1, want),
                             ab = grad_args(&o, &b, 1, want);
    ar.bias_a = c.bias ? &o.bias : NULL;
    aa.bias_a = ab.bias_a = c.bias ? &o.dbias : NULL;
    CHECK_OK(ref_ctx, bie_conv2d_backward(ref_ctx, &c.d, &ar));
    CHECK_OK(cu_ctx, bie_conv2d_backward(cu_ctx, &c.d, &aa));
    CHECK_OK(gemm_ctx, bie_conv2d_backward(gemm_ctx, &c.d, &ab));
    CHECK(bie_context_cuda_synchronize(gemm_ctx) == BIE_STATUS_OK, "sync: %s", bie_context_last_error(gemm_ctx));
    fetch_grads(&a);
    fetch_grads(&b);
    for (int i = 0; i < 4; i++) {
        if (i == 2) continue; // (grad_scale_a: test-cuda-layer-backward holds both routes to the reference)
        char what[340];
        snprintf(what, sizeof what, "%s (cuDNN route)", c.text);
        close_to(gnames[i], &a.h[i], &ref.h[i], what);
        snprintf(what, sizeof what, "%s (GEMM route)", c.text);
        close_to(gnames[i], &b.h[i], &ref.h[i], what);
    }
    free_grads(&ref);
    free_grads(&a);
    free_grads(&b);
    free_ops(&c, &o);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    cuda_test_require_gpu("test-cuda-conv-bits");
    cuda_test_contexts(&ref_ctx, &cu_ctx);
    const int n = cuda_test_quick() ? 12 : 80;
    for (int i = 0; i < n; i++) test_saved(); // (cu_ctx meets the device first, without the variable)
    for (int i = 0; i < n; i++) test_clamped_binarize();
    setenv("BIE_CUDA_CONV_BACKWARD", "gemm", 1); // read by a context when it first meets the device
    bie_context_t * gemm_ctx = test_new_context(BIE_BACKEND_AUTO);
    for (int i = 0; i < n; i++) test_routes(gemm_ctx);
    unsetenv("BIE_CUDA_CONV_BACKWARD");
    bie_context_destroy(gemm_ctx);
    bie_context_destroy(cu_ctx);
    bie_context_destroy(ref_ctx);
    return test_finish("test-cuda-conv-bits");
}
