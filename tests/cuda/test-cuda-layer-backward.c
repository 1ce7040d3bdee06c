// SPDX-License-Identifier: Apache-2.0
// test-cuda-layer-backward.c: every layer backward (binary, 4-bit, 8-bit; linear and conv2d) on
// CUDA tensors against the plain-C reference on host copies of the same operands (cuda-layer-case.h
// makes the random cases): floats within a tolerance derived from f32 accumulation and the output
// dtype: max|got - ref| <= tol(dtype) * max|ref|, tol = 1e-4 (f32), 2^-9 (f16), 2^-6 (bf16).
//   bie_binarize_ste: bits and mask bit-identical to the reference over their whole byte spans
//            (poisoned alike first: the bits between elements must keep their content);
//   saved bits: the binary linear backward from (bits, x_mask) within the tolerance of the
//            reference's backward from the float x, and (on CUDA) identical to the backward from
//            the float x in grad_x, grad_weight and grad_bias_a (grad_scale_a: within a few ulps,
//            since its blocks' partial sums meet in double atomic adds, in any order); the forward
//            from the bits identical to the forward from the float x.
#include "cuda-layer-case.h"

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

// grad_scale_a sums numel(x) terms, each bounded by max|gx| * hi: the f32 products and double
// sums differ from the reference by rounding of the terms only.
static void compare_grad_scale(const struct lcase * c, int64_t numel_x, const struct bie_tensor * gs_c,
                               const struct bie_tensor * gs_r, const struct bie_tensor * gx_c,
                               const struct bie_tensor * gx_r) {
    double d, m, dx, mx;
    max_diff(gs_c, gs_r, &d, &m);
    max_diff(gx_c, gx_r, &dx, &mx);
    const double hi = c->quant == BIE_QUANT_BINARY ? 1 : c->quant == BIE_QUANT_INT4 ? 7 : 127;
    const double tol = tol_for(gs_r->dtype) * m + 1e-5 * sqrt((double)numel_x) * (mx + 1e-6) * hi * 4;
    CHECK(d <= tol, "grad_scale_a: |got-ref| = %g > %g (ref %g) on %s", d, tol, m, c->text);
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
        c->clamp = 0.0f;                             // (bits are binarized already)
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
    // a conv's grad_weight in any layout (OIHW, OHWI: rows in the GEMM's own order, strided)
    const int gw_kind = c->conv ? (int)test_rand_int(0, 2) : 0;
    struct bie_tensor gw_r = c->conv ? make4(gwdt, o.w.shape, gw_kind) : test_tensor(gwdt, o.w.ndim, o.w.shape, NULL),
                      gw_c = gw_r;
    if (c->conv) {
        const size_t n = strlen(c->text);
        snprintf(c->text + n, sizeof c->text - n, " grad_weight layout %d", gw_kind);
    }
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
    struct bie_backward_args ar = {
        &o.x, c->bias ? &o.bias : NULL, &o.w, &o.sa, &o.sw, &g, &gx_r, &gw_r, &gs_r, &gb_r, NULL, NULL, NULL, 0.0f};
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
                                   NULL,
                                   NULL,
                                   NULL,
                                   0.0f};
    ar.x_clamp = ac.x_clamp = c->clamp; // (x read through a clamp, grad_x gated by its derivative)
    // a shortcut's gradient added to grad_x last, in a third of the cases that ask for grad_x
    struct bie_tensor add = {0}, dadd = {0};
    if (!only_w && test_rand_int(0, 2) == 0) {
        const enum bie_dtype adt = float_dts[test_rand_int(0, 2)];
        add = c->conv ? make4(adt, o.x.shape, (int)test_rand_int(0, 2)) : test_tensor(adt, o.x.ndim, o.x.shape, NULL);
        test_fill_uniform(&add, -1, 1);
        dadd = cuda_mirror(&add);
        ar.grad_x_add = &add;
        ac.grad_x_add = &dadd;
        const size_t n = strlen(c->text);
        snprintf(c->text + n, sizeof c->text - n, " grad_x_add %s", bie_dtype_name(adt));
    }
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
            compare_grad_scale(c, bie_tensor_numel(&o.x), &gs_c, &gs_r, &gx_c, &gx_r);
        }
        struct bie_tensor * const got[4] = {&gx_c, &gw_c, &gs_c, &gb_c};
        if (saved) same_as_float(c, &o, &ac, got);
    }
    cuda_tensor_free(&dbits);
    cuda_tensor_free(&dmask);
    if (add.data) {
        test_tensor_free(&add);
        cuda_tensor_free(&dadd);
    }
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
    struct bie_backward_args ar = {&x, NULL, &w, &s, &s, &g, NULL, &gw_r, NULL, NULL, NULL, NULL, NULL, 0.0f};
    struct bie_backward_args ac = {&dbits, NULL, &dw, &s, &s, &dg, NULL, &dgw, NULL, NULL, NULL, NULL, NULL, 0.0f};
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

int main(int argc, char ** argv) {
    test_init(argc, argv);
    cuda_test_require_gpu("test-cuda-layer-backward");
    cuda_test_contexts(&ref_ctx, &cu_ctx);
    const int n = cuda_test_quick() ? 20 : 150;
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
    // convs whose dense NCHW f16 / bf16 grad_y is copied to pixel rows by 16- or 8-byte vectors:
    // O % 8 == 0, OH * OW % 8 == 0 or % 4 == 0 (sizes past a 64 x 128 tile and short of one)
    for (int i = 0; i < (cuda_test_quick() ? 2 : 8); i++) {
        struct lcase c;
        random_case(&c, 2);
        c.O = c.cd.out_channels = 8 * test_rand_int(1, 40);
        c.H = 4 * test_rand_int(1, 6) + (i % 2 ? 0 : 2); // stride 1: OH * OW % 8 == 0 or % 4 == 0
        c.W = i % 2 ? test_rand_int(1, 24) : c.H;
        c.cd.stride[0] = c.cd.stride[1] = 1;
        c.gdt = test_rand_int(0, 1) ? BIE_DTYPE_F16 : BIE_DTYPE_BF16;
        c.ykind = 0;
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
    for (int i = 0; i < (cuda_test_quick() ? 2 : 4); i++) { // wide rows, and (many of them) the warp-per-row passes
        struct lcase c;
        do random_case(&c, 0);
        while (c.conv);
        c.C = c.ld.in_features = c.cd.in_channels = test_rand_int(256, i % 2 ? 600 : 2600);
        if (i % 2) c.batch = test_rand_int(8192, 8500), c.lead2 = 0;
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
    bie_context_destroy(ref_ctx);
    bie_context_destroy(cu_ctx);
    return test_finish("test-cuda-layer-backward");
}
