// SPDX-License-Identifier: Apache-2.0
// test-saved-bits.c: bie_binarize_ste and the binary linear backward from the bits it saves, on
// the reference and on the CPU backend (every ISA level of this machine, 1 and 2 threads):
//   (a) bits and mask against a plain loop (x' = f32(x) + f32(bias_a), bit x' >= 0, mask
//       |x'/scale_a| <= 1 in f32) on random odd shapes, f32/f16/bf16 x, with and without bias_a,
//       and in half the cases bie_binarize_ste_clamped (the loop on clamp(x, -t, t), and the clamp
//       mask |x| < t; t often the scale, so that x holds +-t itself),
//       dense, gapped, 3-D and strided views of x and of the outputs, with x values on the mask's
//       boundary, zeros, -0, NaN and inf; the outputs start as random bytes, so the bits between
//       and after rows must keep their content (the whole byte span is compared);
//   (b) the backward from (bits, mask) with bias_a NULL equals, byte for byte, the backward from
//       the float x (and its bias_a) on the same context, for every gradient, with scale_a values
//       that make the mask stop a fraction of the elements;
//   (c) the same for a binary conv: from the bits and mask of its channels-last x (binarize_ste of
//       the [N, H, W, C] view), every gradient equals the float x's on the reference (the CPU
//       backend hands a conv's saved bits to the reference);
//   (d) bad inputs return the documented status and name the argument; failed calls write nothing;
//   (e) grad_x_mask (linear and conv, from saved bits): grad_x is the ungated one where the gate's
//       bit is 1 and 0 where it is 0, and grad_weight, grad_scale_a and grad_bias_a are unchanged.
// A failure prints the seed (BIE_TEST_SEED replays it) and the case.
#include "test-cpu-common.h"

static const int64_t k_list[] = {1, 7, 8, 9, 31, 33, 63, 64, 65, 127, 129, 255, 513, 1000};
static const enum bie_dtype float_dts[3] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16};

// x values around scale: its boundary +-scale (exact in every float dtype: scale is k/16), zeros,
// -0, rarely NaN and +-inf (when `odd`), and uniform values in [-2*scale, 2*scale).
static void fill_x(const struct bie_tensor * x, float scale, bool odd) {
    int64_t idx[BIE_MAX_DIMS] = {0};
    do {
        const int64_t kind = test_rand_int(0, 39);
        double v;
        if (kind == 0) v = 0.0;
        else if (kind == 1) v = -0.0;
        else if (kind <= 4) v = test_rand_int(0, 1) ? scale : -scale;
        else if (kind == 5 && odd) v = NAN;
        else if (kind == 6 && odd) v = test_rand_int(0, 1) ? INFINITY : -INFINITY;
        else v = test_rand_float(-2.0f, 2.0f) * scale;
        bie_store(x, bie_offset(x, idx), v);
    } while (bie_next_index(x, idx));
}

static float pick_scale(void) { return (float)test_rand_int(4, 24) / 16.0f; }

// The plain loop: the expected bits and mask, written element by element into eb and em.
static void expect_bits(const struct bie_tensor * x, const struct bie_tensor * bias, float s, struct bie_tensor * eb,
                        struct bie_tensor * em) {
    int64_t idx[BIE_MAX_DIMS] = {0};
    do {
        const int64_t k = idx[x->ndim - 1];
        const float b = bias ? (float)bie_load(bias, k * bias->stride[0]) : 0.0f;
        const float v = (float)bie_load(x, bie_offset(x, idx)) + b;
        bie_store(eb, bie_offset(eb, idx), v >= 0.0f ? 1 : -1);
        bie_store(em, bie_offset(em, idx), fabsf(v / s) <= 1.0f ? 1 : -1);
    } while (bie_next_index(x, idx));
}

// (a) One random case of bie_binarize_ste on every context.
// x clamped to [-t, t] in its own dtype (t = k/16: exact in every float dtype; NaN stays), and the
// expected clamp mask |x| < t into ec.
static struct bie_tensor clamped_copy(const struct bie_tensor * x, float t, struct bie_tensor * ec) {
    struct bie_tensor h = cpu_test_clone(x);
    int64_t idx[BIE_MAX_DIMS] = {0};
    do {
        const double v = bie_load(x, bie_offset(x, idx));
        bie_store(&h, bie_offset(&h, idx), isnan(v) ? v : fmin(fmax(v, -t), t));
        bie_store(ec, bie_offset(ec, idx), fabs(v) < t ? 1 : -1);
    } while (bie_next_index(x, idx));
    return h;
}

static void test_binarize(bie_context_t ** ctxs, int nctx) {
    const int nd = test_rand_int(0, 3) == 0 ? 3 : 2;
    const int64_t K = test_pick(k_list, 14);
    int64_t shape[3] = {0, 0, 0};
    if (nd == 3) {
        shape[0] = test_rand_int(1, 4);
        shape[1] = test_rand_int(1, 9);
    } else {
        shape[0] = test_rand_int(1, 40);
    }
    shape[nd - 1] = K;
    const enum bie_dtype xd = float_dts[test_rand_int(0, 2)];
    const int xl = (int)test_rand_int(0, 2), bl = (int)test_rand_int(0, 2), ml = (int)test_rand_int(0, 2);
    const bool has_bias = test_rand_int(0, 1), want_bits = test_rand_int(0, 3) != 0;
    const bool want_mask = !want_bits || test_rand_int(0, 3) != 0;
    const float s = pick_scale();
    const bool clamped = test_rand_int(0, 1);
    const float t = test_rand_int(0, 1) ? s : pick_scale();
    const int cl = (int)test_rand_int(0, 2);
    struct bie_tensor x = test_tensor_rows(xd, nd, shape, xl);
    fill_x(&x, s, true);
    struct bie_tensor bias = test_tensor(float_dts[test_rand_int(0, 2)], 1, &K, NULL);
    test_fill_uniform(&bias, -0.5f * s, 0.5f * s);
    struct bie_tensor sa = test_scalar(s);
    struct bie_tensor eb = test_tensor_rows(BIE_DTYPE_B1, nd, shape, bl),
                      em = test_tensor_rows(BIE_DTYPE_B1, nd, shape, ml);
    cpu_test_garbage(&eb);
    cpu_test_garbage(&em);
    struct bie_tensor b0 = cpu_test_clone(&eb), m0 = cpu_test_clone(&em); // the garbage, for each run
    struct bie_tensor ec = test_tensor_rows(BIE_DTYPE_B1, nd, shape, cl);
    cpu_test_garbage(&ec);
    struct bie_tensor c0 = cpu_test_clone(&ec);
    struct bie_tensor h = clamped_copy(&x, t, &ec);
    expect_bits(clamped ? &h : &x, has_bias ? &bias : NULL, s, &eb, &em);
    if (!want_bits) memcpy(eb.data, b0.data, cpu_test_nbytes(&eb));
    if (!want_mask) memcpy(em.data, m0.data, cpu_test_nbytes(&em));
    char what[200];
    snprintf(what, sizeof what,
             "x %s shape [%lld, %lld, %lld] (%d-D) layouts x/bits/mask/clamp mask %d/%d/%d/%d bias %d scale %g "
             "bits %d mask %d clamp %g",
             bie_dtype_name(xd), (long long)shape[0], (long long)shape[1], (long long)shape[2], nd, xl, bl, ml, cl,
             (int)has_bias, (double)s, (int)want_bits, (int)want_mask, clamped ? (double)t : 0.0);
    for (int i = 0; i < nctx; i++) {
        struct bie_tensor gb = cpu_test_clone(&b0), gm = cpu_test_clone(&m0), gc = cpu_test_clone(&c0);
        const enum bie_status st =
            clamped ? bie_binarize_ste_clamped(ctxs[i], &x, t, has_bias ? &bias : NULL, want_mask ? &sa : NULL,
                                               want_bits ? &gb : NULL, want_mask ? &gm : NULL, &gc)
                    : bie_binarize_ste(ctxs[i], &x, has_bias ? &bias : NULL, want_mask ? &sa : NULL,
                                       want_bits ? &gb : NULL, want_mask ? &gm : NULL);
        CHECK(st == BIE_STATUS_OK, "context %d: %s (%s)", i, bie_context_last_error(ctxs[i]), what);
        CHECK(memcmp(gb.data, eb.data, cpu_test_nbytes(&eb)) == 0, "context %d: bits differ from the plain loop (%s)",
              i, what);
        CHECK(memcmp(gm.data, em.data, cpu_test_nbytes(&em)) == 0, "context %d: mask differs from the plain loop (%s)",
              i, what);
        CHECK(!clamped || memcmp(gc.data, ec.data, cpu_test_nbytes(&ec)) == 0,
              "context %d: clamp mask differs from the plain loop (%s)", i, what);
        test_tensor_free(&gb);
        test_tensor_free(&gm);
        test_tensor_free(&gc);
    }
    struct bie_tensor * ts[] = {&x, &bias, &sa, &eb, &em, &b0, &m0, &ec, &c0, &h};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) test_tensor_free(ts[i]);
}

// (b) A linear layer's backward from its float x and from the saved bits, on one context.
struct grads {
    struct bie_tensor gx, gw, gs, gb;
};

// Random bytes in every gradient's buffer (what a call that writes them must overwrite).
static void grads_garbage(struct grads * g) {
    cpu_test_garbage(&g->gx);
    cpu_test_garbage(&g->gw);
    cpu_test_garbage(&g->gs);
    cpu_test_garbage(&g->gb);
}

// Backward arguments that ask for the gradients `want` selects (0: all four; 1: grad_x and the
// sums, no grad_weight; 2: grad_weight alone; 3: all four), into g; x_mask NULL.
static struct bie_backward_args want_args(const struct bie_tensor * x, const struct bie_tensor * bias,
                                          const struct bie_tensor * w, const struct bie_tensor * sa,
                                          const struct bie_tensor * sw, const struct bie_tensor * gy, struct grads * g,
                                          int want) {
    const bool gx = want != 2, gw = want != 1, sums = want == 0 || want == 3;
    return (struct bie_backward_args){x,
                                      bias,
                                      w,
                                      sa,
                                      sw,
                                      gy,
                                      gx ? &g->gx : NULL,
                                      gw ? &g->gw : NULL,
                                      sums ? &g->gs : NULL,
                                      sums ? &g->gb : NULL,
                                      NULL,
                                      NULL,
                                      NULL,
                                      0.0f};
}

// Context i's gradients from the bits (got) are, byte for byte, those from the float x (want).
static void same_grads(const struct grads * want, const struct grads * got, int i, const char * what) {
    static const char * const names[4] = {"grad_x", "grad_weight", "grad_scale_a", "grad_bias_a"};
    const struct bie_tensor *tf[4] = {&want->gx, &want->gw, &want->gs, &want->gb},
                            *tb[4] = {&got->gx, &got->gw, &got->gs, &got->gb};
    for (int t = 0; t < 4; t++)
        CHECK(memcmp(tf[t]->data, tb[t]->data, cpu_test_nbytes(tf[t])) == 0,
              "context %d: %s from the saved bits differs from the float x's (%s)", i, names[t], what);
}

static void grads_like(const struct grads * proto, struct grads * g);
static void grads_free(struct grads * g);

// (e) The same call as ab with random gate bits (shaped and laid out like the mask mv) as
// grad_x_mask, on ctx: against b, the gradients of ab, grad_x is gated and the others are equal.
static void check_gated(bie_context_t * ctx, const struct bie_linear_desc * ld, const struct bie_conv2d_desc * cd,
                        struct bie_backward_args ab, const struct bie_tensor * mv, const struct grads * b,
                        const struct grads * proto, int i, const char * what) {
    if (!ab.grad_x) return;
    struct bie_tensor gate = cpu_test_clone(mv);
    cpu_test_garbage(&gate);
    struct grads c;
    grads_like(proto, &c);
    ab.grad_x = &c.gx;
    ab.grad_weight = ab.grad_weight ? &c.gw : NULL;
    ab.grad_scale_a = ab.grad_scale_a ? &c.gs : NULL;
    ab.grad_bias_a = ab.grad_bias_a ? &c.gb : NULL;
    ab.grad_x_mask = &gate;
    CHECK_OK(ctx, cd ? bie_conv2d_backward(ctx, cd, &ab) : bie_linear_backward(ctx, ld, &ab));
    const struct bie_tensor *tb[3] = {&b->gw, &b->gs, &b->gb}, *tc[3] = {&c.gw, &c.gs, &c.gb};
    const bool asked[3] = {ab.grad_weight != NULL, ab.grad_scale_a != NULL, ab.grad_bias_a != NULL};
    static const char * const names[3] = {"grad_weight", "grad_scale_a", "grad_bias_a"};
    for (int t = 0; t < 3; t++)
        CHECK(!asked[t] || memcmp(tb[t]->data, tc[t]->data, cpu_test_nbytes(tb[t])) == 0,
              "context %d: %s changed by grad_x_mask (%s)", i, names[t], what);
    int64_t idx[BIE_MAX_DIMS] = {0};
    int bad = 0;
    do {
        const double want =
            bie_load(&gate, bie_offset(&gate, idx)) > 0 ? bie_load(&b->gx, bie_offset(&b->gx, idx)) : 0.0;
        bad += bie_load(&c.gx, bie_offset(&c.gx, idx)) != want;
    } while (bie_next_index(&c.gx, idx));
    CHECK(bad == 0, "context %d: %d elements of the gated grad_x differ (%s)", i, bad, what);
    grads_free(&c);
    test_tensor_free(&gate);
}

static void grads_like(const struct grads * proto, struct grads * g) {
    g->gx = cpu_test_clone(&proto->gx);
    g->gw = cpu_test_clone(&proto->gw);
    g->gs = cpu_test_clone(&proto->gs);
    g->gb = cpu_test_clone(&proto->gb);
}

static void grads_free(struct grads * g) {
    test_tensor_free(&g->gx);
    test_tensor_free(&g->gw);
    test_tensor_free(&g->gs);
    test_tensor_free(&g->gb);
}

static void test_backward(bie_context_t ** ctxs, int nctx, int64_t M, int64_t K, int64_t N) {
    const enum bie_dtype xd = float_dts[test_rand_int(0, 2)];
    static const enum bie_dtype wds[4] = {BIE_DTYPE_F32, BIE_DTYPE_F32, BIE_DTYPE_I8, BIE_DTYPE_B1};
    const enum bie_dtype wd = wds[test_rand_int(0, 3)];
    const bool has_bias = test_rand_int(0, 1), gap = test_rand_int(0, 2) == 0;
    // which gradients: all four, grad_x only, grad_weight only (no mask needed), or grad_x with the sums
    const int want = (int)test_rand_int(0, 3);
    const float s = pick_scale();
    const int64_t xs[2] = {M, K};
    struct bie_tensor x = test_tensor_rows(xd, 2, xs, gap ? 1 : 0);
    fill_x(&x, s, false);
    struct bie_tensor bias = test_tensor(BIE_DTYPE_F32, 1, &K, NULL);
    test_fill_uniform(&bias, -0.5f * s, 0.5f * s);
    struct bie_tensor w = cpu_test_view2(wd, N, K, false), gy = cpu_test_view2(BIE_DTYPE_F32, M, N, gap);
    test_fill_uniform(&w, wd == BIE_DTYPE_I8 ? -128.0f : -1.0f, wd == BIE_DTYPE_I8 ? 128.0f : 1.0f);
    test_fill_uniform(&gy, -1.0f, 1.0f);
    struct bie_tensor sa = test_scalar(s), sw = test_scalar(test_rand_float(0.01f, 0.2f));
    struct bie_tensor bits = test_tensor(BIE_DTYPE_B1, 2, xs, NULL), mask = cpu_test_view2(BIE_DTYPE_B1, M, K, gap);
    struct grads proto;
    proto.gx = cpu_test_view2(float_dts[test_rand_int(0, 2)], M, K, gap);
    proto.gw = cpu_test_view2(float_dts[test_rand_int(0, 2)], N, K, false);
    proto.gs = test_tensor(float_dts[test_rand_int(0, 2)], 0, NULL, NULL);
    proto.gb = test_tensor(float_dts[test_rand_int(0, 2)], 1, &K, NULL);
    grads_garbage(&proto);
    char what[200];
    snprintf(what, sizeof what, "linear M=%lld K=%lld N=%lld x %s w %s gap %d bias %d scale_a %g want %d", (long long)M,
             (long long)K, (long long)N, bie_dtype_name(xd), bie_dtype_name(wd), (int)gap, (int)has_bias, (double)s,
             want);
    for (int i = 0; i < nctx; i++) {
        bie_context_t * ctx = ctxs[i];
        CHECK_OK(ctx, bie_binarize_ste(ctx, &x, has_bias ? &bias : NULL, &sa, &bits, &mask));
        struct grads f, b;
        grads_like(&proto, &f);
        grads_like(&proto, &b);
        struct bie_backward_args af = want_args(&x, has_bias ? &bias : NULL, &w, &sa, &sw, &gy, &f, want),
                                 ab = want_args(&bits, NULL, &w, &sa, &sw, &gy, &b, want);
        ab.x_mask = want == 2 ? NULL : &mask;
        const struct bie_linear_desc d = {BIE_QUANT_BINARY, K, N};
        CHECK_OK(ctx, bie_linear_backward(ctx, &d, &af));
        CHECK_OK(ctx, bie_linear_backward(ctx, &d, &ab));
        same_grads(&f, &b, i, what);
        check_gated(ctx, &d, NULL, ab, &mask, &b, &proto, i, what);
        grads_free(&f);
        grads_free(&b);
    }
    struct bie_tensor * ts[] = {&x, &bias, &w, &gy, &sa, &sw, &bits, &mask};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) test_tensor_free(ts[i]);
    grads_free(&proto);
}

// (c) A binary conv's backward from the bits and mask of its channels-last x: each context's
// result equals, byte for byte, the reference's from the float x.
static void test_backward_conv(bie_context_t ** ctxs, int nctx) {
    const enum bie_dtype xd = float_dts[test_rand_int(0, 2)];
    const int64_t N = test_rand_int(1, 3), C = test_rand_int(1, 40), H = test_rand_int(1, 7), W = test_rand_int(1, 7);
    const int64_t O = test_rand_int(1, 9);
    struct bie_conv2d_desc d = {BIE_QUANT_BINARY, C, O, {1, 1}, {1, 1}, {0, 0}, {1, 1}, 1, BIE_PAD_ZERO};
    for (int i = 0; i < 2; i++) {
        d.kernel[i] = (int32_t)test_rand_int(1, 3);
        d.stride[i] = (int32_t)test_rand_int(1, 2);
        d.padding[i] = (int32_t)test_rand_int(0, 1);
        d.dilation[i] = (int32_t)test_rand_int(1, 2);
    }
    int64_t OH, OW;
    if (bie_conv2d_output_size(&d, H, W, &OH, &OW) != BIE_STATUS_OK) return; // (a kernel larger than the image)
    const bool has_bias = test_rand_int(0, 1);
    const int want = (int)test_rand_int(0, 3);
    const float s = pick_scale();
    const int32_t to_nchw[4] = {0, 3, 1, 2};
    const int64_t nhwc[4] = {N, H, W, C}, xs[4] = {N, C, H, W}, ws[4] = {O, C, d.kernel[0], d.kernel[1]};
    const int64_t ys[4] = {N, O, OH, OW};
    struct bie_tensor x = test_tensor(xd, 4, nhwc, NULL), bits = test_tensor(BIE_DTYPE_B1, 4, nhwc, NULL),
                      mask = test_tensor(BIE_DTYPE_B1, 4, nhwc, NULL);
    fill_x(&x, s, false);
    struct bie_tensor bias = test_tensor(BIE_DTYPE_F32, 1, &C, NULL), w = test_tensor(BIE_DTYPE_F32, 4, ws, NULL),
                      gy = test_tensor(BIE_DTYPE_F32, 4, ys, NULL);
    test_fill_uniform(&bias, -0.5f * s, 0.5f * s);
    test_fill_uniform(&w, -1.0f, 1.0f);
    test_fill_uniform(&gy, -1.0f, 1.0f);
    struct bie_tensor sa = test_scalar(s), sw = test_scalar(test_rand_float(0.01f, 0.2f));
    CHECK_OK(ctxs[0], bie_binarize_ste(ctxs[0], &x, has_bias ? &bias : NULL, &sa, &bits, &mask));
    struct bie_tensor xv = x, bv = bits, mv = mask; // the NCHW views of the channels-last buffers
    bie_tensor_permute(&xv, to_nchw);
    bie_tensor_permute(&bv, to_nchw);
    bie_tensor_permute(&mv, to_nchw);
    struct grads proto, ref;
    proto.gx = test_tensor(float_dts[test_rand_int(0, 2)], 4, xs, NULL);
    proto.gw = test_tensor(float_dts[test_rand_int(0, 2)], 4, ws, NULL);
    proto.gs = test_tensor(float_dts[test_rand_int(0, 2)], 0, NULL, NULL);
    proto.gb = test_tensor(float_dts[test_rand_int(0, 2)], 1, &C, NULL);
    grads_garbage(&proto);
    grads_like(&proto, &ref);
    const struct bie_backward_args af = want_args(&xv, has_bias ? &bias : NULL, &w, &sa, &sw, &gy, &ref, want);
    CHECK_OK(ctxs[0], bie_conv2d_backward(ctxs[0], &d, &af));
    char what[240];
    snprintf(what, sizeof what,
             "conv N=%lld C=%lld %lldx%lld O=%lld k %dx%d s %dx%d p %dx%d d %dx%d x %s bias %d want %d", (long long)N,
             (long long)C, (long long)H, (long long)W, (long long)O, d.kernel[0], d.kernel[1], d.stride[0], d.stride[1],
             d.padding[0], d.padding[1], d.dilation[0], d.dilation[1], bie_dtype_name(xd), (int)has_bias, want);
    for (int i = 0; i < nctx; i++) {
        struct grads b;
        grads_like(&proto, &b);
        struct bie_backward_args ab = want_args(&bv, NULL, &w, &sa, &sw, &gy, &b, want);
        ab.x_mask = want == 2 ? NULL : &mv;
        CHECK_OK(ctxs[i], bie_conv2d_backward(ctxs[i], &d, &ab));
        same_grads(&ref, &b, i, what);
        check_gated(ctxs[i], NULL, &d, ab, &mv, &b, &proto, i, what);
        grads_free(&b);
    }
    grads_free(&ref);
    grads_free(&proto);
    struct bie_tensor * ts[] = {&x, &bits, &mask, &bias, &w, &gy, &sa, &sw};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) test_tensor_free(ts[i]);
}

// (d) Bad inputs.
#define EXPECT(ctx, call, want_status, name) TEST_EXPECT_STATUS(ctx, call, want_status, name)

static void test_errors(bie_context_t * ctx) {
    const int64_t M = 3, K = 5, N = 4, xs[2] = {M, K}, ws[2] = {N, K}, ys[2] = {M, N};
    struct bie_tensor x = test_tensor(BIE_DTYPE_F32, 2, xs, NULL), w = test_tensor(BIE_DTYPE_F32, 2, ws, NULL);
    struct bie_tensor gy = test_tensor(BIE_DTYPE_F32, 2, ys, NULL), gx = test_tensor(BIE_DTYPE_F32, 2, xs, NULL);
    struct bie_tensor gw = test_tensor(BIE_DTYPE_F32, 2, ws, NULL), gs = test_scalar(0.0f);
    struct bie_tensor gb = test_tensor(BIE_DTYPE_F32, 1, &K, NULL), bias = test_tensor(BIE_DTYPE_F32, 1, &K, NULL);
    struct bie_tensor bits = test_tensor(BIE_DTYPE_B1, 2, xs, NULL), mask = test_tensor(BIE_DTYPE_B1, 2, xs, NULL);
    struct bie_tensor sa = test_scalar(0.5f), sw = test_scalar(0.25f);
    test_fill_uniform(&x, -1, 1);
    test_fill_uniform(&w, -1, 1);
    test_fill_uniform(&gy, -1, 1);
    const struct bie_linear_desc d = {BIE_QUANT_BINARY, K, N};
    CHECK_OK(ctx, bie_binarize_ste(ctx, &x, &bias, &sa, &bits, &mask));

    // bie_binarize_ste
    CHECK(bie_binarize_ste(NULL, &x, NULL, &sa, &bits, &mask) == BIE_STATUS_INVALID_ARGUMENT, "NULL ctx");
    EXPECT(ctx, bie_binarize_ste(ctx, &x, NULL, &sa, NULL, NULL), BIE_STATUS_INVALID_ARGUMENT, "bits");
    EXPECT(ctx, bie_binarize_ste(ctx, NULL, NULL, &sa, &bits, &mask), BIE_STATUS_INVALID_ARGUMENT, "x");
    EXPECT(ctx, bie_binarize_ste(ctx, &x, NULL, NULL, &bits, &mask), BIE_STATUS_INVALID_ARGUMENT, "scale_a");
    CHECK_OK(ctx, bie_binarize_ste(ctx, &x, NULL, NULL, &bits, NULL)); // the bits need no scale
    EXPECT(ctx, bie_binarize_ste(ctx, &bits, NULL, &sa, &bits, &mask), BIE_STATUS_INVALID_ARGUMENT, "x");
    struct bie_tensor bad_sa = test_scalar(0.0f);
    const float bad[4] = {0.0f, -1.0f, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
        ((float *)bad_sa.data)[0] = bad[i];
        EXPECT(ctx, bie_binarize_ste(ctx, &x, NULL, &bad_sa, &bits, &mask), BIE_STATUS_INVALID_ARGUMENT, "scale_a");
    }
    const int64_t two = 2, K1 = K + 1, xs1[2] = {M, K + 1}, xs2[2] = {M + 1, K}, xs3[3] = {1, M, K};
    struct bie_tensor sa2 = test_tensor(BIE_DTYPE_F32, 1, &two, NULL), bias1 = test_tensor(BIE_DTYPE_F32, 1, &K1, NULL);
    ((float *)sa2.data)[0] = ((float *)sa2.data)[1] = 0.5f;
    EXPECT(ctx, bie_binarize_ste(ctx, &x, NULL, &sa2, &bits, &mask), BIE_STATUS_INVALID_ARGUMENT, "scale_a");
    EXPECT(ctx, bie_binarize_ste(ctx, &x, &bias1, &sa, &bits, &mask), BIE_STATUS_INVALID_ARGUMENT, "bias_a");
    struct bie_tensor wide = test_tensor(BIE_DTYPE_B1, 2, xs1, NULL), tall = test_tensor(BIE_DTYPE_B1, 2, xs2, NULL);
    struct bie_tensor deep = test_tensor(BIE_DTYPE_B1, 3, xs3, NULL), f32 = test_tensor(BIE_DTYPE_F32, 2, xs, NULL);
    // the outputs of a failed call keep their bytes
    cpu_test_garbage(&bits);
    struct bie_tensor keep = cpu_test_clone(&bits);
    EXPECT(ctx, bie_binarize_ste(ctx, &x, NULL, &sa, &bits, &wide), BIE_STATUS_INVALID_ARGUMENT, "mask");
    EXPECT(ctx, bie_binarize_ste(ctx, &x, NULL, &sa, &bits, &tall), BIE_STATUS_INVALID_ARGUMENT, "mask");
    EXPECT(ctx, bie_binarize_ste(ctx, &x, NULL, &sa, &bits, &deep), BIE_STATUS_INVALID_ARGUMENT, "mask");
    EXPECT(ctx, bie_binarize_ste(ctx, &x, NULL, &sa, &bits, &f32), BIE_STATUS_INVALID_ARGUMENT, "mask");
    EXPECT(ctx, bie_binarize_ste(ctx, &x, NULL, &sa, &wide, &mask), BIE_STATUS_INVALID_ARGUMENT, "bits");
    EXPECT(ctx, bie_binarize_ste(ctx, &x, NULL, &sa, &f32, NULL), BIE_STATUS_INVALID_ARGUMENT, "bits");
    mask.device_type = BIE_DEVICE_CUDA;
    EXPECT(ctx, bie_binarize_ste(ctx, &x, NULL, &sa, &bits, &mask), BIE_STATUS_INVALID_ARGUMENT, "mask");
    mask.device_type = BIE_DEVICE_CPU;
    CHECK(memcmp(keep.data, bits.data, cpu_test_nbytes(&bits)) == 0, "bits written by a failed call");
    CHECK_OK(ctx, bie_binarize_ste(ctx, &x, NULL, &sa, &bits, &mask));

    // bie_binarize_ste_clamped: a finite clamp > 0, a b1 clamp_mask shaped like x
    const float bad_clamps[4] = {0.0f, -1.0f, NAN, INFINITY};
    for (int i = 0; i < 4; i++)
        EXPECT(ctx, bie_binarize_ste_clamped(ctx, &x, bad_clamps[i], NULL, &sa, &bits, &mask, NULL),
               BIE_STATUS_INVALID_ARGUMENT, "clamp");
    EXPECT(ctx, bie_binarize_ste_clamped(ctx, &x, 1.0f, NULL, &sa, NULL, NULL, NULL), BIE_STATUS_INVALID_ARGUMENT,
           "clamp_mask");
    EXPECT(ctx, bie_binarize_ste_clamped(ctx, &x, 1.0f, NULL, &sa, &bits, &mask, &wide), BIE_STATUS_INVALID_ARGUMENT,
           "clamp_mask");
    EXPECT(ctx, bie_binarize_ste_clamped(ctx, &x, 1.0f, NULL, &sa, &bits, &mask, &f32), BIE_STATUS_INVALID_ARGUMENT,
           "clamp_mask");
    CHECK_OK(ctx, bie_binarize_ste(ctx, &x, NULL, &sa, &bits, &mask));

    // the backward's rules for a b1 x
    struct bie_backward_args a = {&bits, NULL, &w, &sa, &sw, &gy, &gx, &gw, &gs, &gb, &mask, NULL, NULL, 0.0f};
    CHECK_OK(ctx, bie_linear_backward(ctx, &d, &a));
    // grad_x_mask: b1, shaped like x, with a b1 x only
    const struct bie_tensor * bad_gates[4] = {&wide, &tall, &deep, &f32};
    for (int i = 0; i < 4; i++) {
        a.grad_x_mask = bad_gates[i];
        EXPECT(ctx, bie_linear_backward(ctx, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "grad_x_mask");
    }
    a.grad_x_mask = &mask;
    CHECK_OK(ctx, bie_linear_backward(ctx, &d, &a));
    a.x = &x;
    a.x_mask = NULL;
    EXPECT(ctx, bie_linear_backward(ctx, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "grad_x_mask");
    a = (struct bie_backward_args){&bits, NULL, &w, &sa, &sw, &gy, &gx, &gw, &gs, &gb, &mask, NULL, NULL, 0.0f};
    a.x_mask = NULL; // grad_x, grad_scale_a or grad_bias_a need the mask
    EXPECT(ctx, bie_linear_backward(ctx, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "x_mask");
    a.grad_x = NULL;
    a.grad_bias_a = NULL;
    EXPECT(ctx, bie_linear_backward(ctx, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "x_mask");
    a.grad_scale_a = NULL;
    a.grad_bias_a = &gb;
    EXPECT(ctx, bie_linear_backward(ctx, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "x_mask");
    a.grad_bias_a = NULL;
    CHECK_OK(ctx, bie_linear_backward(ctx, &d, &a)); // grad_weight alone: the bits suffice
    a = (struct bie_backward_args){&bits, &bias, &w, &sa, &sw, &gy, &gx, &gw, &gs, &gb, &mask, NULL, NULL, 0.0f};
    EXPECT(ctx, bie_linear_backward(ctx, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "bias_a");
    a.bias_a = NULL;
    a.x = &x; // a mask with a float x
    EXPECT(ctx, bie_linear_backward(ctx, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "x_mask");
    a.x = &bits;
    const struct bie_tensor * bad_masks[4] = {&wide, &tall, &deep, &f32};
    for (int i = 0; i < 4; i++) {
        a.x_mask = bad_masks[i];
        EXPECT(ctx, bie_linear_backward(ctx, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "x_mask");
    }
    a.x_mask = &mask;
    mask.device_type = BIE_DEVICE_CUDA;
    EXPECT(ctx, bie_linear_backward(ctx, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "x_mask");
    mask.device_type = BIE_DEVICE_CPU;
    void * mask_data = mask.data;
    mask.data = NULL;
    EXPECT(ctx, bie_linear_backward(ctx, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "x_mask");
    mask.data = mask_data;
    for (int q = 4; q <= 8; q += 4) { // n-bit layers take no b1 x
        const struct bie_linear_desc dn = {(enum bie_quant)q, K, N};
        EXPECT(ctx, bie_linear_backward(ctx, &dn, &a), BIE_STATUS_INVALID_ARGUMENT, "x");
    }
    // convs: the mask is shaped like x
    const int64_t cx[4] = {2, 3, 4, 4}, cw[4] = {2, 3, 1, 1}, cy[4] = {2, 2, 4, 4}, cm[4] = {2, 3, 4, 3};
    struct bie_tensor cbits = test_tensor(BIE_DTYPE_B1, 4, cx, NULL), cmask = test_tensor(BIE_DTYPE_B1, 4, cm, NULL);
    struct bie_tensor cwt = test_tensor(BIE_DTYPE_F32, 4, cw, NULL), cgy = test_tensor(BIE_DTYPE_F32, 4, cy, NULL);
    struct bie_tensor cgx = test_tensor(BIE_DTYPE_F32, 4, cx, NULL);
    const struct bie_conv2d_desc cd = {BIE_QUANT_BINARY, 3, 2, {1, 1}, {1, 1}, {0, 0}, {1, 1}, 1, BIE_PAD_ZERO};
    struct bie_backward_args ca = {&cbits, NULL, &cwt, &sa,    &sw,  &cgy, &cgx,
                                   NULL,   NULL, NULL, &cmask, NULL, NULL, 0.0f};
    EXPECT(ctx, bie_conv2d_backward(ctx, &cd, &ca), BIE_STATUS_INVALID_ARGUMENT, "x_mask");
    ca.x_mask = NULL;
    EXPECT(ctx, bie_conv2d_backward(ctx, &cd, &ca), BIE_STATUS_INVALID_ARGUMENT, "x_mask");

    struct bie_tensor * ts[] = {&x,    &w,    &gy,    &gx,     &gw,  &gs,    &gb,   &bias, &bits,
                                &mask, &sa,   &sw,    &bad_sa, &sa2, &bias1, &wide, &tall, &deep,
                                &f32,  &keep, &cbits, &cmask,  &cwt, &cgy,   &cgx};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) test_tensor_free(ts[i]);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    enum bie_cpu_isa levels[CPU_TEST_LEVELS];
    const int nlev = cpu_test_levels(levels);
    bie_context_t * ctxs[CPU_TEST_LEVELS + 2];
    int nctx = 0;
    ctxs[nctx++] = cpu_test_ctx(BIE_BACKEND_REF, BIE_CPU_ISA_BEST, 1);
    for (int l = 0; l < nlev; l++) ctxs[nctx++] = cpu_test_ctx(BIE_BACKEND_CPU, levels[l], 2);
    ctxs[nctx++] = cpu_test_ctx(BIE_BACKEND_CPU, BIE_CPU_ISA_BEST, 1);
    const bool quick = cpu_test_quick();
    for (int i = 0; i < (quick ? 40 : 600); i++) test_binarize(ctxs, nctx);
    for (int i = 0; i < (quick ? 20 : 300); i++)
        test_backward(ctxs, nctx, test_rand_int(0, 3) ? test_rand_int(1, 45) : test_rand_int(46, 200),
                      test_pick(k_list, 14), test_rand_int(1, 45));
    // larger layers: several 512-row blocks of the float-by-sign GEMMs, split column ranges
    static const int64_t big[][3] = {{3, 1100, 700}, {530, 129, 5}, {70, 513, 600}};
    for (int i = 0; i < (quick ? 1 : 3); i++) test_backward(ctxs, nctx, big[i][0], big[i][1], big[i][2]);
    for (int i = 0; i < (quick ? 20 : 200); i++) test_backward_conv(ctxs, nctx);
    test_errors(ctxs[0]);
    test_errors(ctxs[nctx - 1]);
    for (int i = 0; i < nctx; i++) bie_context_destroy(ctxs[i]);
    return test_finish("test-saved-bits");
}
