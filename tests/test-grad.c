// SPDX-License-Identifier: Apache-2.0
// test-grad.c: the reference backward of every layer.
//  1. Against the oracle's written formulas (test-oracle.h, double precision; grad_x gathered
//     where the reference scatters) on random cases with random subsets of the gradients
//     requested, every gradient dtype and layout. Tolerance per output, derived: one rounding to
//     the gradient's dtype (unit roundoff u_d times |value|, plus the dtype's smallest step) plus
//     the reordering error of double sums (n_terms * 2^-52 * sum of |terms|).
//  2. Finite differences of the straight-through surrogate, as directional derivatives (the
//     surrogate is piecewise linear, so a central difference is exact away from its kinks):
//       grad_x, grad_bias_a: L(x) = <g, conv(scale_a*clip(x'/scale_a, lo, hi), w*scale_w)>
//                            (binary: lo, hi = -1, 1), directions only on elements at least a
//                            margin away from the kinks
//       grad_W:              L(W) = <g, conv(a_pad*scale_a, W)> (y linear in the float weight;
//                            padded taps with their pad value)
//       n-bit grad_scale_a:  L(s) = <g, conv(xhat(s), w*scale_w)> with the LSQ surrogate
//                            xhat(s) = s*lo | s*hi | x' + s*(rne(r0) - r0), r0 = x'/scale_a,
//                            divided by sqrt(numel(x)*hi)
//  3. A hand-computed binary conv whose grad_weight reads padded taps (pad -1 and +1).
#include "test-oracle.h"

static bie_context_t * ctx;

static enum bie_status backward(const struct layer_case * c, const struct bie_tensor * gy, struct bie_tensor * gx,
                                struct bie_tensor * gw, struct bie_tensor * gs, struct bie_tensor * gb) {
    const struct bie_backward_args a = {
        &c->x, c->has_bias ? &c->bias : NULL, &c->w, &c->sa, &c->sw_t, gy, gx, gw, gs, gb, NULL, NULL, NULL, 0.0f};
    return c->conv ? bie_conv2d_backward(ctx, &c->cd, &a) : bie_linear_backward(ctx, &c->lin, &a);
}

static void fill_nan(const struct bie_tensor * t) {
    int64_t idx[BIE_MAX_DIMS] = {0};
    do bie_store(t, bie_offset(t, idx), NAN);
    while (bie_next_index(t, idx));
}

// Compares a gradient tensor with oracle values; abs[i] is the sum of |terms| of element i.
static void compare(const struct layer_case * c, const char * name, const struct bie_tensor * t, const double * want,
                    const double * abs, int64_t n_terms) {
    double * got = dense_load(t);
    const int64_t n = bie_tensor_numel(t);
    const double u = unit_roundoff(t->dtype), step = min_step(t->dtype);
    int64_t bad = 0, first = -1;
    double first_tol = 0;
    for (int64_t i = 0; i < n; i++) {
        const double tol = u * fabs(want[i]) + step + (double)n_terms * 0x1p-52 * abs[i];
        if (!(fabs(got[i] - want[i]) <= tol)) {
            if (first < 0) {
                first = i;
                first_tol = tol;
            }
            bad++;
        }
    }
    CHECK(bad == 0, "%s %s (%s): %lld of %lld differ; first at %lld: got %.9g, oracle %.9g, tolerance %.3g", c->desc,
          name, bie_dtype_name(t->dtype), (long long)bad, (long long)n, (long long)first, first >= 0 ? got[first] : 0.0,
          first >= 0 ? want[first] : 0.0, first_tol);
    free(got);
}

// The requested gradients of a case, allocated in random dtypes and layouts, prefilled with NaN
// so that an element the backward forgot to write shows up.
struct grads {
    struct bie_tensor gx, gw, gs, gb;
    bool has[4]; // gx, gw, gs, gb
};

static void grads_make(const struct layer_case * c, struct grads * t, bool all, bool f32_only) {
    memset(t, 0, sizeof *t);
    for (int i = 0; i < 4; i++) t->has[i] = all || test_rand_int(0, 3) != 0;
    enum bie_dtype d[4];
    for (int i = 0; i < 4; i++) d[i] = f32_only ? BIE_DTYPE_F32 : float_dtypes[test_rand_int(0, 2)];
    if (t->has[0]) t->gx = case_make_like_x(c, d[0]);
    if (t->has[1]) t->gw = case_make_like_w(c, d[1]);
    if (t->has[2]) t->gs = test_tensor(d[2], 0, NULL, NULL);
    if (t->has[3]) t->gb = make_view(d[3], 1, &c->C, test_rand_int(0, 1) ? LAYOUT_DENSE : LAYOUT_GAPPED, NULL);
    struct bie_tensor * all_t[4] = {&t->gx, &t->gw, &t->gs, &t->gb};
    for (int i = 0; i < 4; i++)
        if (t->has[i]) fill_nan(all_t[i]);
}

static void grads_free(struct grads * t) {
    struct bie_tensor * all_t[4] = {&t->gx, &t->gw, &t->gs, &t->gb};
    for (int i = 0; i < 4; i++)
        if (t->has[i]) test_tensor_free(all_t[i]);
}

static enum bie_status run_backward(const struct layer_case * c, const struct bie_tensor * gy, struct grads * t) {
    return backward(c, gy, t->has[0] ? &t->gx : NULL, t->has[1] ? &t->gw : NULL, t->has[2] ? &t->gs : NULL,
                    t->has[3] ? &t->gb : NULL);
}

// Total number of products in the backward sums: bounds the length of every summation chain.
static int64_t n_products(const struct layer_case * c) { return lc_ynumel(c) * lc_K(c) + lc_xnumel(c); }

static void run_formula_case(bool conv) {
    struct layer_case c;
    const struct case_opts o = {.conv = conv, .x_dtype = -1, .w_dtype = -1, .float_x = true};
    case_random(&c, &o);
    struct bie_tensor gy = case_make_out(&c, float_dtypes[test_rand_int(0, 2)]);
    test_fill_uniform(&gy, -1.0f, 1.0f);
    double * g = dense_load(&gy);
    struct oracle_grads r;
    oracle_backward(&c, g, &r);
    struct grads t;
    grads_make(&c, &t, false, false);
    const enum bie_status st = run_backward(&c, &gy, &t);
    CHECK(st == BIE_STATUS_OK, "%s: %s: %s", c.desc, bie_status_string(st), bie_context_last_error(ctx));
    if (st == BIE_STATUS_OK) {
        const int64_t T = n_products(&c), nx = lc_xnumel(&c);
        double * gx_abs = malloc(sizeof(double) * (size_t)nx);
        double * gb_abs = calloc((size_t)c.C, sizeof(double));
        if (!gx_abs || !gb_abs) exit(2);
        for (int64_t i = 0; i < nx; i++) {
            gx_abs[i] = r.gx[i] != 0.0 ? r.gx_abs[i] : 0.0;
            gb_abs[(i / (c.H * c.W)) % c.C] += gx_abs[i];
        }
        if (t.has[0]) compare(&c, "grad_x", &t.gx, r.gx, gx_abs, T);
        if (t.has[1]) compare(&c, "grad_weight", &t.gw, r.gw, r.gw_abs, T);
        if (t.has[2]) compare(&c, "grad_scale_a", &t.gs, &r.gs, &r.gs_abs, T);
        if (t.has[3]) compare(&c, "grad_bias_a", &t.gb, r.gb, gb_abs, T);
        free(gx_abs);
        free(gb_abs);
    }
    grads_free(&t);
    oracle_grads_free(&r);
    free(g);
    test_tensor_free(&gy);
    case_free(&c);
}

// --- finite differences of the surrogate ----------------------------------------------------------

// <g, conv(act, wt)> and the sum of |terms| (for the tolerance).
static double inner(const struct layer_case * c, const double * g, const double * act, double pad, const double * wt,
                    double * abs_out) {
    const int64_t ny = lc_ynumel(c), nx = lc_xnumel(c), nw = c->O * lc_K(c);
    double * y = malloc(sizeof(double) * (size_t)ny);
    double * aa = malloc(sizeof(double) * (size_t)nx);
    double * wa = malloc(sizeof(double) * (size_t)nw);
    if (!y || !aa || !wa) exit(2);
    oracle_conv(c, act, pad, wt, y);
    double s = 0.0;
    for (int64_t i = 0; i < ny; i++) s += g[i] * y[i];
    if (abs_out) {
        for (int64_t i = 0; i < nx; i++) aa[i] = fabs(act[i]);
        for (int64_t i = 0; i < nw; i++) wa[i] = fabs(wt[i]);
        oracle_conv(c, aa, fabs(pad), wa, y);
        double sa = 0.0;
        for (int64_t i = 0; i < ny; i++) sa += fabs(g[i]) * y[i];
        *abs_out = sa;
    }
    free(y);
    free(aa);
    free(wa);
    return s;
}

// One directional-derivative check: fd from two evaluations 2*eps apart against `analytic`
// (a sum of f32-rounded gradients times the direction, whose magnitude is `analytic_abs`).
static void check_fd(const struct layer_case * c, const char * what, double l_plus, double l_minus, double eps,
                     double l_abs, double analytic, double analytic_abs) {
    const double fd = (l_plus - l_minus) / (2.0 * eps);
    const double T = (double)(lc_ynumel(c) * lc_K(c) + lc_xnumel(c));
    const double tol = 0x1p-23 * analytic_abs + 2.0 * T * 0x1p-52 * l_abs / eps + 1e-300;
    CHECK(fabs(fd - analytic) <= tol, "%s: %s: finite difference %.12g, backward %.12g, tolerance %.3g", c->desc, what,
          fd, analytic, tol);
}

// n-bit grad_scale_a: L(s) = <g, conv(xhat(s), w*sw)>, the LSQ surrogate (xp: x', r0: x'/scale_a as
// the layer rounds it; act and wt: scratch of x's and the weight's sizes).
static void check_fd_scale(const struct layer_case * c, const double * g, const double * w, const double * xp,
                           const double * r0, double * act, double * wt, double gs) {
    const int64_t nx = lc_xnumel(c), nw = c->O * lc_K(c);
    const double sa = c->sa_v, lo = lc_lo(c), hi = lc_hi(c), epss = 1e-3 * sa;
    double l_abs, lp, lm;
    for (int64_t i = 0; i < nw; i++) wt[i] = w[i] * c->sw_v;
    for (int s = 0; s < 2; s++) {
        const double sc = sa + (s ? -epss : epss);
        for (int64_t i = 0; i < nx; i++)
            act[i] = r0[i] < lo ? sc * lo : r0[i] > hi ? sc * hi : xp[i] + sc * (nearbyint(r0[i]) - r0[i]);
        *(s ? &lm : &lp) = inner(c, g, act, 0.0, wt, &l_abs);
    }
    const double k = sqrt((double)nx * hi);
    check_fd(c, "grad_scale_a", lp, lm, epss, l_abs, gs * k, fabs(gs * k));
}

static void run_fd_case(bool conv) {
    struct layer_case c;
    const struct case_opts o = {
        .conv = conv, .x_dtype = -1, .w_dtype = -1, .float_x = true, .float_w = true, .max_k_linear = 129};
    case_random(&c, &o);
    const bool bin = c.quant == BIE_QUANT_BINARY;
    const int64_t nx = lc_xnumel(&c), nw = c.O * lc_K(&c);
    struct bie_tensor gy = case_make_out(&c, BIE_DTYPE_F32);
    test_fill_uniform(&gy, -1.0f, 1.0f);
    double * g = dense_load(&gy);
    struct grads t;
    grads_make(&c, &t, true, true);
    const enum bie_status st = run_backward(&c, &gy, &t);
    CHECK(st == BIE_STATUS_OK, "%s: %s: %s", c.desc, bie_status_string(st), bie_context_last_error(ctx));
    if (st != BIE_STATUS_OK) goto done;
    double * gx = dense_load(&t.gx);
    double * gw = dense_load(&t.gw);
    double * gb = dense_load(&t.gb);
    const double gs = bie_load(&t.gs, 0);
    double * w = oracle_w(&c);
    double * a = oracle_a(&c);
    double * xp = malloc(sizeof(double) * (size_t)nx);
    double * r0 = malloc(sizeof(double) * (size_t)nx);
    double * v = malloc(sizeof(double) * (size_t)nx);
    double * act = malloc(sizeof(double) * (size_t)nx);
    double * wv = malloc(sizeof(double) * (size_t)nw);
    double * wt = malloc(sizeof(double) * (size_t)nw);
    double * u = calloc((size_t)c.C, sizeof(double));
    if (!xp || !r0 || !v || !act || !wv || !wt || !u) exit(2);
    const double sa = c.sa_v, lo = bin ? -1 : lc_lo(&c), hi = bin ? 1 : lc_hi(&c), margin = 0.05;
    for (int64_t i = 0; i < nx; i++) {
        xp[i] = oracle_xprime(&c, i);
        r0[i] = (float)((float)xp[i] / c.sa_v);
    }
    for (int64_t i = 0; i < nw; i++) wt[i] = w[i] * c.sw_v; // w * scale_w

    // grad_x and grad_bias_a: L(x) = <g, conv(sa*clip((x' + t*v)/sa, lo, hi), w*sw)>
    bool * channel_ok = malloc((size_t)c.C);
    if (!channel_ok) exit(2);
    for (int64_t ch = 0; ch < c.C; ch++) channel_ok[ch] = true;
    double an = 0.0, an_abs = 0.0;
    for (int64_t i = 0; i < nx; i++) {
        const bool far = fabs(r0[i] - lo) > margin && fabs(r0[i] - hi) > margin;
        v[i] = far ? test_rand_float(-1.0f, 1.0f) : 0.0;
        if (!far) channel_ok[(i / (c.H * c.W)) % c.C] = false;
        an += v[i] * gx[i];
        an_abs += fabs(v[i] * gx[i]);
    }
    const double eps = 0.5 * margin * sa;
    double l_abs, lp, lm;
    for (int s = 0; s < 2; s++) {
        const double tt = s ? -eps : eps;
        for (int64_t i = 0; i < nx; i++) {
            const double q = (xp[i] + tt * v[i]) / sa;
            act[i] = sa * (q < lo ? lo : q > hi ? hi : q);
        }
        *(s ? &lm : &lp) = inner(&c, g, act, 0.0, wt, &l_abs);
    }
    check_fd(&c, "grad_x", lp, lm, eps, l_abs, an, an_abs);
    an = an_abs = 0.0;
    for (int64_t ch = 0; ch < c.C; ch++) {
        u[ch] = channel_ok[ch] ? test_rand_float(-1.0f, 1.0f) : 0.0;
        an += u[ch] * gb[ch];
        an_abs += fabs(u[ch] * gb[ch]);
    }
    for (int s = 0; s < 2; s++) {
        const double tt = s ? -eps : eps;
        for (int64_t i = 0; i < nx; i++) {
            const double q = (xp[i] + tt * u[(i / (c.H * c.W)) % c.C]) / sa;
            act[i] = sa * (q < lo ? lo : q > hi ? hi : q);
        }
        *(s ? &lm : &lp) = inner(&c, g, act, 0.0, wt, &l_abs);
    }
    check_fd(&c, "grad_bias_a", lp, lm, eps, l_abs, an, an_abs);

    // grad_W: L(W) = <g, conv(a_pad*sa, W + t*v)>
    an = an_abs = 0.0;
    for (int64_t i = 0; i < nw; i++) {
        wv[i] = test_rand_float(-1.0f, 1.0f);
        an += wv[i] * gw[i];
        an_abs += fabs(wv[i] * gw[i]);
    }
    for (int64_t i = 0; i < nx; i++) act[i] = a[i] * sa;
    const double epsw = 0.25;
    for (int s = 0; s < 2; s++) {
        for (int64_t i = 0; i < nw; i++) wt[i] = c.wd[i] + (s ? -epsw : epsw) * wv[i];
        *(s ? &lm : &lp) = inner(&c, g, act, c.pad * sa, wt, &l_abs);
    }
    check_fd(&c, "grad_weight", lp, lm, epsw, l_abs, an, an_abs);

    if (!bin) check_fd_scale(&c, g, w, xp, r0, act, wt, gs);
    free(gx);
    free(gw);
    free(gb);
    free(w);
    free(a);
    free(xp);
    free(r0);
    free(v);
    free(act);
    free(wv);
    free(wt);
    free(u);
    free(channel_ok);
done:
    grads_free(&t);
    free(g);
    test_tensor_free(&gy);
    case_free(&c);
}

// --- hand-computed: padded taps in grad_weight --------------------------------------------------

// A 1x1 image x = 0.5 (a = +1), a 3x3 kernel of 0.3 (w = +1), padding 1, one output, g = 2:
//   grad_W = scale_a * g * a_pad = 2 * [p p p; p 1 p; p p p], p the pad value;
//   grad_x = g * w[centre] * scale_w = 1 (|0.5/1| <= 1); grad_scale_a = 1 * 1 / sqrt(1); grad_bias_a = 1.
static void test_hand_padded_taps(void) {
    const int64_t xshape[4] = {1, 1, 1, 1}, wshape[4] = {1, 1, 3, 3}, bshape[1] = {1};
    struct bie_tensor x = test_tensor(BIE_DTYPE_F32, 4, xshape, NULL), w = test_tensor(BIE_DTYPE_F32, 4, wshape, NULL);
    struct bie_tensor gy = test_tensor(BIE_DTYPE_F32, 4, xshape, NULL),
                      gx = test_tensor(BIE_DTYPE_F32, 4, xshape, NULL);
    struct bie_tensor gw = test_tensor(BIE_DTYPE_F32, 4, wshape, NULL),
                      gb = test_tensor(BIE_DTYPE_F32, 1, bshape, NULL);
    struct bie_tensor sa = test_scalar(1.0f), sw = test_scalar(0.5f), gs = test_scalar(0.0f);
    ((float *)x.data)[0] = 0.5f;
    ((float *)gy.data)[0] = 2.0f;
    for (int i = 0; i < 9; i++) ((float *)w.data)[i] = 0.3f;
    for (int p = 0; p < 3; p++) {
        const struct bie_conv2d_desc d = test_conv3x3(1, 1, (enum bie_pad_value)p);
        const struct bie_backward_args a = {&x, NULL, &w, &sa, &sw, &gy, &gx, &gw, &gs, &gb, NULL, NULL, NULL, 0.0f};
        CHECK_OK(ctx, bie_conv2d_backward(ctx, &d, &a));
        const float pv = p == 0 ? 0.0f : p == 1 ? -1.0f : 1.0f;
        for (int i = 0; i < 9; i++) {
            const float want = 2.0f * (i == 4 ? 1.0f : pv);
            CHECK(((float *)gw.data)[i] == want, "pad value %d: grad_weight[%d] = %g, want %g", p, i,
                  (double)((float *)gw.data)[i], (double)want);
        }
        CHECK(((float *)gx.data)[0] == 1.0f && ((float *)gs.data)[0] == 1.0f && ((float *)gb.data)[0] == 1.0f,
              "pad value %d: grad_x %g grad_scale_a %g grad_bias_a %g, want 1 1 1", p, (double)((float *)gx.data)[0],
              (double)((float *)gs.data)[0], (double)((float *)gb.data)[0]);
    }
    // Outside the clip range the input gradient vanishes: |1.5 / 1| > 1.
    ((float *)x.data)[0] = 1.5f;
    const struct bie_conv2d_desc d = test_conv3x3(1, 1, BIE_PAD_ZERO);
    const struct bie_backward_args a = {&x, NULL, &w, &sa, &sw, &gy, &gx, NULL, &gs, NULL, NULL, NULL, NULL, 0.0f};
    CHECK_OK(ctx, bie_conv2d_backward(ctx, &d, &a));
    CHECK(((float *)gx.data)[0] == 0.0f && ((float *)gs.data)[0] == 0.0f, "clipped: grad_x %g grad_scale_a %g",
          (double)((float *)gx.data)[0], (double)((float *)gs.data)[0]);
    struct bie_tensor * ts[9] = {&x, &w, &gy, &gx, &gw, &gb, &sa, &sw, &gs};
    for (int i = 0; i < 9; i++) test_tensor_free(ts[i]);
}

// 4-bit LSQ scale gradient by hand: x = [0.4, 3.3, 9, -20] with scale_a 1, one output with
// w = 1 (I8) and g = 1, scale_w 1: gx = 1 everywhere;
//   r = x: 0.4 (mid, rne - r = -0.4), 3.3 (mid, -0.3), 9 (> 7: 7), -20 (< -8: -8)
//   grad_scale_a = (-0.4 - 0.3 + 7 - 8) / sqrt(4 * 7);  grad_x = [1, 1, 0, 0].
static void test_hand_lsq(void) {
    const int64_t xshape[2] = {1, 4}, wshape[2] = {1, 4}, yshape[2] = {1, 1};
    struct bie_tensor x = test_tensor(BIE_DTYPE_F32, 2, xshape, NULL), w = test_tensor(BIE_DTYPE_I8, 2, wshape, NULL);
    struct bie_tensor gy = test_tensor(BIE_DTYPE_F32, 2, yshape, NULL),
                      gx = test_tensor(BIE_DTYPE_F32, 2, xshape, NULL);
    struct bie_tensor sa = test_scalar(1.0f), sw = test_scalar(1.0f), gs = test_scalar(0.0f);
    const float xs[4] = {0.4f, 3.3f, 9.0f, -20.0f};
    memcpy(x.data, xs, sizeof xs);
    for (int i = 0; i < 4; i++) ((int8_t *)w.data)[i] = 1;
    ((float *)gy.data)[0] = 1.0f;
    const struct bie_linear_desc d = {BIE_QUANT_INT4, 4, 1};
    const struct bie_backward_args a = {&x, NULL, &w, &sa, &sw, &gy, &gx, NULL, &gs, NULL, NULL, NULL, NULL, 0.0f};
    CHECK_OK(ctx, bie_linear_backward(ctx, &d, &a));
    const double want = ((0.0 - (double)0.4f) + (3.0 - (double)3.3f) + 7.0 - 8.0) / sqrt(28.0);
    CHECK(((float *)gs.data)[0] == (float)want, "LSQ grad_scale_a %.9g, want %.9g", (double)((float *)gs.data)[0],
          want);
    const float wantx[4] = {1, 1, 0, 0};
    for (int i = 0; i < 4; i++)
        CHECK(((float *)gx.data)[i] == wantx[i], "LSQ grad_x[%d] = %g, want %g", i, (double)((float *)gx.data)[i],
              (double)wantx[i]);
    struct bie_tensor * ts[7] = {&x, &w, &gy, &gx, &sa, &sw, &gs};
    for (int i = 0; i < 7; i++) test_tensor_free(ts[i]);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    ctx = test_new_context(BIE_BACKEND_REF);
    test_hand_padded_taps();
    test_hand_lsq();
    const bool quick = test_quick();
    for (int i = 0; i < (quick ? 60 : 300); i++) run_formula_case(false);
    for (int i = 0; i < (quick ? 100 : 600); i++) run_formula_case(true);
    for (int i = 0; i < (quick ? 30 : 150); i++) run_fd_case(false);
    for (int i = 0; i < (quick ? 40 : 250); i++) run_fd_case(true);
    bie_context_destroy(ctx);
    return test_finish("test-grad");
}
