// SPDX-License-Identifier: Apache-2.0
// test-matmul.c: the batched matmul of two activations (bie_matmul_*): the CPU backend at every ISA
// level against the reference on random odd shapes, leading dims and layouts (dense, gapped rows,
// y stored transposed as [..., K, N]); the reference against the linear layer it restates
// (batch b is the layer with input x[b] and weight y[b]) and against a case worked by hand; and
// every bad argument.
//   forward: identical to the reference, element by element (out f32/f16/bf16 = (float)acc *
//            (x_clip*y_clip) rounded, or I32 acc), zeros / ties / clip boundaries in the inputs;
//   backward: within the derived bound of test-cpu-backward.c: each grad element sums n terms
//            (n = N for grad_x, M for grad_y) of |g| <= 1 times a code (<= cmax) times the other
//            clip, summed in f32 by sgemm: tol = (n+2)*2^-24*n*cmax*clip + one rounding of the
//            dtype; the clip gradients add B partials, each rounded to f32 once more.
#include "test-cpu-common.h"

struct mcase {
    enum bie_quant q;
    int lead;             // leading dims (0..2)
    int64_t ls[2], B, M, N, K;
    int xl, yl;           // layouts: 0 dense, 1 gapped rows, 2 stored transposed
    enum bie_dtype xd, yd, od, gd;
    float xc, yc;
    char what[256];
};

// A [lead..., R, C] tensor in layout 0/1/2 (2: memory [lead..., C, R], the last two dims swapped).
static struct bie_tensor operand(const struct mcase * c, enum bie_dtype d, int64_t R, int64_t C, int layout) {
    int64_t shape[4];
    int nd = 0;
    for (int i = 0; i < c->lead; i++) shape[nd++] = c->ls[i];
    const int64_t inner = layout == 2 ? R : C, outer = layout == 2 ? C : R;
    const int64_t pitch = layout == 1 ? inner + 3 : inner;
    shape[nd++] = outer;
    shape[nd++] = inner;
    int64_t st[4];
    st[nd - 1] = 1;
    st[nd - 2] = pitch;
    for (int i = nd - 3; i >= 0; i--) st[i] = st[i + 1] * shape[i + 1];
    struct bie_tensor t = test_tensor(d, nd, shape, st);
    if (layout == 2) {
        int32_t perm[4];
        for (int i = 0; i < nd; i++) perm[i] = i;
        perm[nd - 2] = nd - 1;
        perm[nd - 1] = nd - 2;
        bie_tensor_permute(&t, perm);
    }
    return t;
}

// Uniform values with one in eight replaced by a zero, a rounding tie or a clip boundary.
static void fill(const struct mcase * c, const struct bie_tensor * t, float clip) {
    test_fill_uniform(t, -2.5f, 2.5f);
    int64_t idx[BIE_MAX_DIMS] = {0};
    const float hi = c->q == BIE_QUANT_BINARY ? 1.0f : (float)bie_quant_hi(c->q);
    do {
        if (test_rand_int(0, 7)) continue;
        float v;
        switch (test_rand_int(0, 4)) {
        case 0: v = 0.0f; break;
        case 1: v = clip * ((float)test_rand_int(-3, 3) + 0.5f); break; // a tie of rne(v / clip)
        case 2: v = clip * hi; break;                                    // on the clip boundary
        case 3: v = -clip * hi; break;
        default: v = -0.0f; break;
        }
        bie_store(t, bie_offset(t, idx), v);
    } while (bie_next_index(t, idx));
}

static const enum bie_dtype floats[3] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16};

static void random_case(struct mcase * c) {
    static const int64_t ks[] = {1, 3, 7, 8, 9, 31, 64, 65, 129, 200, 513};
    static const enum bie_quant qs[] = {BIE_QUANT_BINARY, BIE_QUANT_INT4, BIE_QUANT_INT8};
    memset(c, 0, sizeof *c);
    c->q = qs[test_rand_int(0, 2)];
    c->lead = (int)test_rand_int(0, 2);
    c->B = 1;
    for (int i = 0; i < c->lead; i++) c->B *= (c->ls[i] = test_rand_int(1, 3));
    c->M = test_rand_int(1, 37);
    c->N = test_rand_int(1, 37);
    c->K = test_pick(ks, 11);
    c->xl = (int)test_rand_int(0, 2);
    c->yl = (int)test_rand_int(0, 2);
    c->xd = floats[test_rand_int(0, 2)];
    c->yd = floats[test_rand_int(0, 2)];
    c->od = test_rand_int(0, 3) == 0 ? BIE_DTYPE_I32 : floats[test_rand_int(0, 2)];
    c->gd = floats[test_rand_int(0, 2)];
    c->xc = c->q == BIE_QUANT_BINARY ? test_rand_float(0.4f, 1.5f) : test_rand_float(0.01f, 0.3f);
    c->yc = c->q == BIE_QUANT_BINARY ? test_rand_float(0.4f, 1.5f) : test_rand_float(0.01f, 0.3f);
    snprintf(c->what, sizeof c->what, "q%d lead %d (B %lld) M %lld N %lld K %lld layouts %d/%d x %s y %s out %s g %s",
             (int)c->q, c->lead, (long long)c->B, (long long)c->M, (long long)c->N, (long long)c->K, c->xl, c->yl,
             bie_dtype_name(c->xd), bie_dtype_name(c->yd), bie_dtype_name(c->od), bie_dtype_name(c->gd));
}

static int64_t mismatches(const struct bie_tensor * a, const struct bie_tensor * b) {
    int64_t bad = 0, idx[BIE_MAX_DIMS] = {0};
    do {
        const double x = bie_load(a, bie_offset(a, idx)), y = bie_load(b, bie_offset(b, idx));
        if (x != y || signbit(x) != signbit(y)) bad++;
    } while (bie_next_index(a, idx));
    return bad;
}

static double rel_round(enum bie_dtype d) { return d == BIE_DTYPE_BF16 ? 0x1p-8 : d == BIE_DTYPE_F16 ? 0x1p-11 : 0x1p-24; }

// max over elements of |got - ref| - (tol + rel*|ref|) (> 0: out of bounds).
static double excess(const struct bie_tensor * got, const struct bie_tensor * ref, double tol) {
    double worst = -1.0;
    int64_t idx[BIE_MAX_DIMS] = {0};
    do {
        const double g = bie_load(got, bie_offset(got, idx)), r = bie_load(ref, bie_offset(ref, idx));
        const double e = fabs(g - r) - (tol + rel_round(got->dtype) * fabs(r));
        if (e > worst || isnan(e)) worst = isnan(e) ? INFINITY : e;
    } while (bie_next_index(got, idx));
    return worst;
}

static void run_case(bie_context_t * ref, bie_context_t * const * cpus, int ncpu, bool backward) {
    struct mcase c;
    random_case(&c);
    struct bie_tensor x = operand(&c, c.xd, c.M, c.K, c.xl), y = operand(&c, c.yd, c.N, c.K, c.yl);
    fill(&c, &x, c.xc);
    fill(&c, &y, c.yc);
    struct bie_tensor xc = test_scalar(c.xc), yc = test_scalar(c.yc);
    const struct bie_matmul_desc d = {c.q};
    if (!backward) {
        struct bie_tensor o_ref = operand(&c, c.od, c.M, c.N, (int)test_rand_int(0, 2));
        struct bie_matmul_args a = {&x, &y, &xc, &yc, &o_ref};
        CHECK_OK(ref, bie_matmul_forward(ref, &d, &a));
        for (int i = 0; i < ncpu; i++) {
            struct bie_tensor o = operand(&c, c.od, c.M, c.N, (int)test_rand_int(0, 2));
            a.out = &o;
            CHECK_OK(cpus[i], bie_matmul_forward(cpus[i], &d, &a));
            const int64_t bad = mismatches(&o, &o_ref);
            CHECK(bad == 0, "%lld elements differ from the reference (isa %s): %s", (long long)bad,
                  bie_cpu_isa_name(bie_context_cpu_isa(cpus[i])), c.what);
            test_tensor_free(&o);
        }
        test_tensor_free(&o_ref);
    } else {
        struct bie_tensor g = operand(&c, c.gd, c.M, c.N, (int)test_rand_int(0, 2));
        test_fill_uniform(&g, -1, 1);
        struct bie_tensor gx_r = operand(&c, BIE_DTYPE_F32, c.M, c.K, 0), gy_r = operand(&c, BIE_DTYPE_F32, c.N, c.K, 0);
        struct bie_tensor gxc_r = test_scalar(0), gyc_r = test_scalar(0);
        struct bie_matmul_backward_args a = {&x, &y, &xc, &yc, &g, &gx_r, &gy_r, &gxc_r, &gyc_r};
        CHECK_OK(ref, bie_matmul_backward(ref, &d, &a));
        const double cmax = c.q == BIE_QUANT_BINARY ? 1.0 : -bie_quant_lo(c.q);
        const double tol_x = (double)(c.N + 2) * 0x1p-24 * (double)c.N * cmax * c.yc;
        const double tol_y = (double)(c.M + 2) * 0x1p-24 * (double)c.M * cmax * c.xc;
        const double dmax = c.q == BIE_QUANT_BINARY ? 1.0 : cmax;
        const double nxk = (double)(c.B * c.M * c.K), nyk = (double)(c.B * c.N * c.K);
        const double den = c.q == BIE_QUANT_BINARY ? 1.0 : bie_quant_hi(c.q);
        const double tol_xc = nxk * tol_x * dmax / sqrt(nxk * den) + (double)c.B * 0x1p-23 * fabs(bie_load_scalar(&gxc_r));
        const double tol_yc = nyk * tol_y * dmax / sqrt(nyk * den) + (double)c.B * 0x1p-23 * fabs(bie_load_scalar(&gyc_r));
        for (int i = 0; i < ncpu; i++) {
            const enum bie_dtype gxd = floats[test_rand_int(0, 2)], gyd = floats[test_rand_int(0, 2)];
            struct bie_tensor gx = operand(&c, gxd, c.M, c.K, (int)test_rand_int(0, 2));
            struct bie_tensor gy = operand(&c, gyd, c.N, c.K, (int)test_rand_int(0, 2));
            struct bie_tensor gxc = test_scalar(0), gyc = test_scalar(0);
            // sometimes only one operand's gradients
            const int which = (int)test_rand_int(0, 3);
            struct bie_matmul_backward_args b = {&x, &y, &xc, &yc, &g, which == 1 ? NULL : &gx, which == 2 ? NULL : &gy,
                                                 which == 1 ? NULL : &gxc, which == 2 ? NULL : &gyc};
            CHECK_OK(cpus[i], bie_matmul_backward(cpus[i], &d, &b));
            const char * isa = bie_cpu_isa_name(bie_context_cpu_isa(cpus[i]));
            if (which != 1) {
                const double e = excess(&gx, &gx_r, tol_x);
                CHECK(e <= 0, "grad_x off by %g over the bound (isa %s, grad_x %s): %s", e, isa, bie_dtype_name(gxd), c.what);
                const double ex = fabs(bie_load_scalar(&gxc) - bie_load_scalar(&gxc_r));
                CHECK(ex <= tol_xc, "grad_x_clip %g vs %g (bound %g, isa %s): %s", (double)bie_load_scalar(&gxc),
                      (double)bie_load_scalar(&gxc_r), tol_xc, isa, c.what);
            }
            if (which != 2) {
                const double e = excess(&gy, &gy_r, tol_y);
                CHECK(e <= 0, "grad_y off by %g over the bound (isa %s, grad_y %s): %s", e, isa, bie_dtype_name(gyd), c.what);
                const double ey = fabs(bie_load_scalar(&gyc) - bie_load_scalar(&gyc_r));
                CHECK(ey <= tol_yc, "grad_y_clip %g vs %g (bound %g, isa %s): %s", (double)bie_load_scalar(&gyc),
                      (double)bie_load_scalar(&gyc_r), tol_yc, isa, c.what);
            }
            test_tensor_free(&gx);
            test_tensor_free(&gy);
            test_tensor_free(&gxc);
            test_tensor_free(&gyc);
        }
        test_tensor_free(&g);
        test_tensor_free(&gx_r);
        test_tensor_free(&gy_r);
        test_tensor_free(&gxc_r);
        test_tensor_free(&gyc_r);
    }
    test_tensor_free(&x);
    test_tensor_free(&y);
    test_tensor_free(&xc);
    test_tensor_free(&yc);
}

// The reference matmul of batch b is the reference linear layer with input x[b] and weight y[b]:
// the same I32 accumulations, and the same grad_x.
static void check_against_layer(bie_context_t * ref) {
    for (int iter = 0; iter < 20; iter++) {
        struct mcase c;
        random_case(&c);
        c.lead = 1;
        c.ls[0] = c.B = test_rand_int(1, 3);
        c.od = BIE_DTYPE_I32;
        struct bie_tensor x = operand(&c, c.xd, c.M, c.K, 0), y = operand(&c, c.yd, c.N, c.K, 0);
        fill(&c, &x, c.xc);
        fill(&c, &y, c.yc);
        struct bie_tensor xc = test_scalar(c.xc), yc = test_scalar(c.yc);
        struct bie_tensor o = operand(&c, BIE_DTYPE_I32, c.M, c.N, 0), g = operand(&c, BIE_DTYPE_F32, c.M, c.N, 0);
        struct bie_tensor gx = operand(&c, BIE_DTYPE_F32, c.M, c.K, 0);
        test_fill_uniform(&g, -1, 1);
        const struct bie_matmul_desc d = {c.q};
        struct bie_matmul_args a = {&x, &y, &xc, &yc, &o};
        CHECK_OK(ref, bie_matmul_forward(ref, &d, &a));
        struct bie_matmul_backward_args ba = {&x, &y, &xc, &yc, &g, &gx, NULL, NULL, NULL};
        CHECK_OK(ref, bie_matmul_backward(ref, &d, &ba));
        for (int64_t b = 0; b < c.B; b++) {
            struct bie_tensor xb = x, yb = y, ob = o, gb = g, gxb = gx;
            struct bie_tensor * v[5] = {&xb, &yb, &ob, &gb, &gxb};
            for (int i = 0; i < 5; i++) {
                v[i]->data = (char *)v[i]->data + b * v[i]->stride[0] * (bie_dtype_bits(v[i]->dtype) / 8);
                v[i]->ndim = 2;
                for (int k = 0; k < 2; k++) {
                    v[i]->shape[k] = v[i]->shape[k + 1];
                    v[i]->stride[k] = v[i]->stride[k + 1];
                }
            }
            struct bie_tensor lo = test_tensor(BIE_DTYPE_I32, 2, ob.shape, NULL);
            struct bie_tensor lgx = test_tensor(BIE_DTYPE_F32, 2, gxb.shape, NULL);
            const struct bie_linear_desc ld = {c.q, c.K, c.N};
            const struct bie_forward_args fa = {&xb, NULL, &yb, &xc, &yc, &lo};
            CHECK_OK(ref, bie_linear_forward(ref, &ld, &fa));
            CHECK(mismatches(&lo, &ob) == 0, "batch %lld: the matmul's acc differs from the linear layer's: %s",
                  (long long)b, c.what);
            const struct bie_backward_args la = {&xb, NULL, &yb, &xc, &yc, &gb, &lgx, NULL, NULL, NULL, NULL};
            CHECK_OK(ref, bie_linear_backward(ref, &ld, &la));
            CHECK(excess(&gxb, &lgx, 0x1p-40) <= 0, "batch %lld: grad_x differs from the linear layer's: %s",
                  (long long)b, c.what);
            test_tensor_free(&lo);
            test_tensor_free(&lgx);
        }
        struct bie_tensor * all[8] = {&x, &y, &xc, &yc, &o, &g, &gx, NULL};
        for (int i = 0; all[i]; i++) test_tensor_free(all[i]);
    }
}

// x = [[0.5, -1, 0]], y = [[1, 1, 1], [-0.2, 0.3, -3]] (binary, clips 2 and 0.5):
//   a = [+1, -1, +1], b = [[+1, +1, +1], [-1, +1, -1]], acc = [1, -3], out = acc * 1.
// Backward with g = [[1, 2]]: gx = 0.5 * (1*b0 + 2*b1) = [-0.5, 1.5, -0.5]; |x/2| <= 1 everywhere;
//   grad_x_clip = (-0.5 + -1.5 + -0.5) / sqrt(3); gy = 2 * g^T a = [[2, -2, 2], [4, -4, 4]], masked
//   by |y/0.5| <= 1: [[0, 0, 0], [4, -4, 0]]; grad_y_clip = (-4 - 4) / sqrt(6).
static void check_by_hand(bie_context_t * ctx) {
    float xv[3] = {0.5f, -1.0f, 0.0f}, yv[6] = {1, 1, 1, -0.2f, 0.3f, -3}, ov[2], gv[2] = {1, 2}, gxv[3], gyv[6];
    float xcv = 2.0f, ycv = 0.5f, gxc, gyc;
    struct bie_tensor x, y, o, g, gx, gy, xc, yc, txc, tyc;
    bie_tensor_make(&x, xv, BIE_DTYPE_F32, 2, (int64_t[]){1, 3});
    bie_tensor_make(&y, yv, BIE_DTYPE_F32, 2, (int64_t[]){2, 3});
    bie_tensor_make(&o, ov, BIE_DTYPE_F32, 2, (int64_t[]){1, 2});
    bie_tensor_make(&g, gv, BIE_DTYPE_F32, 2, (int64_t[]){1, 2});
    bie_tensor_make(&gx, gxv, BIE_DTYPE_F32, 2, (int64_t[]){1, 3});
    bie_tensor_make(&gy, gyv, BIE_DTYPE_F32, 2, (int64_t[]){2, 3});
    bie_tensor_make(&xc, &xcv, BIE_DTYPE_F32, 0, NULL);
    bie_tensor_make(&yc, &ycv, BIE_DTYPE_F32, 0, NULL);
    bie_tensor_make(&txc, &gxc, BIE_DTYPE_F32, 0, NULL);
    bie_tensor_make(&tyc, &gyc, BIE_DTYPE_F32, 0, NULL);
    const struct bie_matmul_desc d = {BIE_QUANT_BINARY};
    const struct bie_matmul_args a = {&x, &y, &xc, &yc, &o};
    CHECK_OK(ctx, bie_matmul_forward(ctx, &d, &a));
    CHECK(ov[0] == 1.0f && ov[1] == -3.0f, "by hand: out = [%g, %g], want [1, -3]", ov[0], ov[1]);
    const struct bie_matmul_backward_args b = {&x, &y, &xc, &yc, &g, &gx, &gy, &txc, &tyc};
    CHECK_OK(ctx, bie_matmul_backward(ctx, &d, &b));
    const float wx[3] = {-0.5f, 1.5f, -0.5f}, wy[6] = {0, 0, 0, 4, -4, 0};
    for (int i = 0; i < 3; i++) CHECK(gxv[i] == wx[i], "by hand: grad_x[%d] = %g, want %g", i, gxv[i], wx[i]);
    for (int i = 0; i < 6; i++) CHECK(gyv[i] == wy[i], "by hand: grad_y[%d] = %g, want %g", i, gyv[i], wy[i]);
    CHECK(fabs(gxc + 2.5 / sqrt(3.0)) < 1e-6, "by hand: grad_x_clip = %g, want %g", gxc, -2.5 / sqrt(3.0));
    CHECK(fabs(gyc + 8.0 / sqrt(6.0)) < 1e-6, "by hand: grad_y_clip = %g, want %g", gyc, -8.0 / sqrt(6.0));
}

static void check_errors(bie_context_t * ctx) {
    float buf[64] = {0}, one = 1.0f, zero = 0.0f;
    struct bie_tensor x, y, o, xc, yc, bad_c, y3, yk, o3, xi, g;
    bie_tensor_make(&x, buf, BIE_DTYPE_F32, 3, (int64_t[]){2, 3, 4});
    bie_tensor_make(&y, buf, BIE_DTYPE_F32, 3, (int64_t[]){2, 5, 4});
    bie_tensor_make(&o, buf, BIE_DTYPE_F32, 3, (int64_t[]){2, 3, 5});
    bie_tensor_make(&xc, &one, BIE_DTYPE_F32, 0, NULL);
    bie_tensor_make(&yc, &one, BIE_DTYPE_F32, 0, NULL);
    bie_tensor_make(&bad_c, &zero, BIE_DTYPE_F32, 0, NULL);
    bie_tensor_make(&y3, buf, BIE_DTYPE_F32, 3, (int64_t[]){3, 5, 4});
    bie_tensor_make(&yk, buf, BIE_DTYPE_F32, 3, (int64_t[]){2, 5, 3});
    bie_tensor_make(&o3, buf, BIE_DTYPE_F32, 3, (int64_t[]){2, 3, 4});
    bie_tensor_make(&xi, buf, BIE_DTYPE_I32, 3, (int64_t[]){2, 3, 4});
    bie_tensor_make(&g, buf, BIE_DTYPE_F32, 3, (int64_t[]){2, 3, 5});
    struct bie_tensor x1 = x;
    x1.ndim = 1;
    struct bie_tensor xs = x; // leading dims that do not merge: batch stride not a multiple of rows
    xs.ndim = 4;
    xs.shape[0] = 2; xs.shape[1] = 2; xs.shape[2] = 3; xs.shape[3] = 2;
    xs.stride[0] = 5; xs.stride[1] = 13; xs.stride[2] = 2; xs.stride[3] = 1;
    const struct bie_matmul_desc d = {BIE_QUANT_BINARY}, dq = {(enum bie_quant)3};
    struct bie_matmul_args a;
#define MM(X, Y, XC, YC, O) (a = (struct bie_matmul_args){X, Y, XC, YC, O}, bie_matmul_forward(ctx, &d, &a))
    TEST_EXPECT_STATUS(ctx, bie_matmul_forward(ctx, &dq, &(struct bie_matmul_args){&x, &y, &xc, &yc, &o}),
                       BIE_STATUS_INVALID_ARGUMENT, "quant");
    TEST_EXPECT_STATUS(ctx, bie_matmul_forward(ctx, NULL, &(struct bie_matmul_args){&x, &y, &xc, &yc, &o}),
                       BIE_STATUS_INVALID_ARGUMENT, "desc");
    TEST_EXPECT_STATUS(ctx, bie_matmul_forward(ctx, &d, NULL), BIE_STATUS_INVALID_ARGUMENT, "args");
    TEST_EXPECT_STATUS(ctx, MM(NULL, &y, &xc, &yc, &o), BIE_STATUS_INVALID_ARGUMENT, "x");
    TEST_EXPECT_STATUS(ctx, MM(&x, NULL, &xc, &yc, &o), BIE_STATUS_INVALID_ARGUMENT, "y");
    TEST_EXPECT_STATUS(ctx, MM(&x, &y, &xc, &yc, NULL), BIE_STATUS_INVALID_ARGUMENT, "out");
    TEST_EXPECT_STATUS(ctx, MM(&x, &y, NULL, &yc, &o), BIE_STATUS_INVALID_ARGUMENT, "x_clip");
    TEST_EXPECT_STATUS(ctx, MM(&x, &y, &xc, &bad_c, &o), BIE_STATUS_INVALID_ARGUMENT, "y_clip");
    TEST_EXPECT_STATUS(ctx, MM(&x1, &y, &xc, &yc, &o), BIE_STATUS_INVALID_ARGUMENT, "x");
    TEST_EXPECT_STATUS(ctx, MM(&x, &y3, &xc, &yc, &o), BIE_STATUS_INVALID_ARGUMENT, "leading");
    TEST_EXPECT_STATUS(ctx, MM(&x, &yk, &xc, &yc, &o), BIE_STATUS_INVALID_ARGUMENT, "K");
    TEST_EXPECT_STATUS(ctx, MM(&x, &y, &xc, &yc, &o3), BIE_STATUS_INVALID_ARGUMENT, "out");
    TEST_EXPECT_STATUS(ctx, MM(&xi, &y, &xc, &yc, &o), BIE_STATUS_INVALID_ARGUMENT, "x");
    TEST_EXPECT_STATUS(ctx, MM(&x, &y, &xc, &yc, &xi), BIE_STATUS_INVALID_ARGUMENT, "out");
    TEST_EXPECT_STATUS(ctx, MM(&xs, &y, &xc, &yc, &o), BIE_STATUS_INVALID_ARGUMENT, "merged");
    struct bie_tensor ob = o; // a broadcast output
    ob.stride[0] = 0;
    TEST_EXPECT_STATUS(ctx, MM(&x, &y, &xc, &yc, &ob), BIE_STATUS_INVALID_ARGUMENT, "out");
#undef MM
    struct bie_matmul_backward_args b = {&x, &y, &xc, &yc, NULL, NULL, NULL, NULL, NULL};
    TEST_EXPECT_STATUS(ctx, bie_matmul_backward(ctx, &d, &b), BIE_STATUS_INVALID_ARGUMENT, "grad_out");
    b.grad_out = &g;
    b.grad_x = &o; // wrong shape
    TEST_EXPECT_STATUS(ctx, bie_matmul_backward(ctx, &d, &b), BIE_STATUS_INVALID_ARGUMENT, "grad_x");
    b.grad_x = NULL;
    b.grad_y_clip = &x; // not a scalar
    TEST_EXPECT_STATUS(ctx, bie_matmul_backward(ctx, &d, &b), BIE_STATUS_INVALID_ARGUMENT, "grad_y_clip");
    b.grad_y_clip = NULL;
    CHECK_OK(ctx, bie_matmul_backward(ctx, &d, &b)); // nothing asked: nothing done
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    enum bie_cpu_isa levels[4];
    const int n = cpu_test_levels(levels);
    bie_context_t * cpus[4];
    for (int i = 0; i < n; i++) cpus[i] = cpu_test_ctx(BIE_BACKEND_CPU, levels[i], (int)test_rand_int(1, 3));
    bie_context_t * ref = cpu_test_ctx(BIE_BACKEND_REF, BIE_CPU_ISA_BEST, 1);
    check_by_hand(ref);
    check_by_hand(cpus[n - 1]);
    check_against_layer(ref);
    check_errors(ref);
    const int iters = cpu_test_quick() ? 25 : 120;
    for (int i = 0; i < iters; i++) run_case(ref, cpus, n, false);
    for (int i = 0; i < iters; i++) run_case(ref, cpus, n, true);
    for (int i = 0; i < n; i++) bie_context_destroy(cpus[i]);
    bie_context_destroy(ref);
    return test_finish("test-matmul");
}
