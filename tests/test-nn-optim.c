// SPDX-License-Identifier: Apache-2.0
// test-nn-optim.c: Adam against a double-precision transcription of its update, and Diode's
// sign-flip rule (Bitorch Engine's DiodeMix for int8 latent binary weights) step by step.
#include "bie-train.h"
#include "test-util.h"

static void test_adam(bie_context_t * ctx) {
    const int64_t n = test_rand_int(1, 300);
    float *p = malloc(sizeof(float) * n), *g = malloc(sizeof(float) * n), *m = calloc(n, sizeof(float)),
          *v = calloc(n, sizeof(float));
    double *pd = malloc(sizeof(double) * n), *md = calloc(n, sizeof(double)), *vd = calloc(n, sizeof(double));
    struct bie_adam_params a;
    bie_adam_params_default(&a);
    a.lr = test_rand_float(1e-4f, 1e-2f);
    a.weight_decay = test_rand_int(0, 1) ? 0.01f : 0.0f;
    a.clip = test_rand_int(0, 1) ? 0.05f : 0.0f;
    for (int64_t i = 0; i < n; i++) pd[i] = p[i] = test_rand_float(-0.06f, 0.06f);
    const int steps = 20;
    struct bie_tensor tp = TEST_VIEW(p, BIE_DTYPE_F32, n), tg = TEST_VIEW(g, BIE_DTYPE_F32, n),
                      tm = TEST_VIEW(m, BIE_DTYPE_F32, n), tv = TEST_VIEW(v, BIE_DTYPE_F32, n);
    for (int t = 1; t <= steps; t++) {
        for (int64_t i = 0; i < n; i++) g[i] = test_rand_float(-1, 1);
        CHECK_OK(ctx, bie_adam_step(ctx, &a, &(struct bie_adam_args){t, &tp, &tg, &tm, &tv}));
        for (int64_t i = 0; i < n; i++) {
            md[i] = a.beta1 * md[i] + (1 - a.beta1) * g[i];
            vd[i] = a.beta2 * vd[i] + (1 - a.beta2) * (double)g[i] * g[i];
            const double mh = md[i] / (1 - pow(a.beta1, t)), vh = vd[i] / (1 - pow(a.beta2, t));
            double w = pd[i] - a.lr * mh / (sqrt(vh) + a.eps) - a.lr * a.weight_decay * pd[i];
            if (a.clip > 0) w = fmin(fmax(w, -a.clip), a.clip);
            pd[i] = w;
        }
    }
    // Each step moves p by at most ~lr; f32 rounding of m, v and p adds a few ulps of lr per step.
    const double tol = steps * 1e-5 * a.lr + 1e-7;
    for (int64_t i = 0; i < n; i++)
        CHECK(fabs(p[i] - pd[i]) < tol, "adam p[%lld] = %.9g, want %.9g (lr %g wd %g clip %g)", (long long)i, p[i],
              pd[i], a.lr, a.weight_decay, a.clip);
    TEST_EXPECT_STATUS(ctx, bie_adam_step(ctx, &a, &(struct bie_adam_args){0, &tp, &tg, &tm, &tv}),
                       BIE_STATUS_INVALID_ARGUMENT, "step");
    free(p);
    free(g);
    free(m);
    free(v);
    free(pd);
    free(md);
    free(vd);
}

static void test_diode(bie_context_t * ctx) {
    const int64_t n = test_rand_int(1, 500);
    int8_t *w = malloc((size_t)n), *w0 = malloc((size_t)n);
    float *m = malloc(sizeof(float) * n), *s = malloc(sizeof(float) * n), *g = malloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) {
        w[i] = (int8_t)test_rand_int(-127, 127);
        w0[i] = w[i];
    }
    struct bie_tensor tw = TEST_VIEW(w, BIE_DTYPE_I8, n), tm = TEST_VIEW(m, BIE_DTYPE_F32, n),
                      ts = TEST_VIEW(s, BIE_DTYPE_F32, n), tg = TEST_VIEW(g, BIE_DTYPE_F32, n);
    CHECK_OK(ctx, bie_diode_init(ctx, &(struct bie_diode_init_args){test_seed, &tw, &tm, &ts}));
    for (int64_t i = 0; i < n; i++) {
        CHECK(m[i] == 0.0f, "diode init m[%lld] = %g", (long long)i, m[i]);
        // s = -sign(w) * u, u in [0, 1e-3): opposite sign to w (or zero).
        CHECK(fabsf(s[i]) < 1e-3f && (w[i] >= 0 ? s[i] <= 0 : s[i] >= 0), "diode init s[%lld] = %g for w %d",
              (long long)i, s[i], w[i]);
    }
    struct bie_diode_params p;
    bie_diode_params_default(&p);
    p.lr = 0.05f;
    // A constant gradient of sign +1 drives s up, so u = -sign(s) eventually becomes -1: every
    // weight ends negative, with its magnitude unchanged; weights already negative never flip.
    for (int64_t i = 0; i < n; i++) g[i] = (float)test_rand_float(0.1f, 1.0f);
    int64_t total_flips = 0;
    for (int step = 0; step < 3000; step++) {
        int64_t flips;
        CHECK_OK(ctx, bie_diode_step(ctx, &p, &(struct bie_diode_args){&tw, &tg, &tm, &ts, &flips}));
        total_flips += flips;
    }
    int64_t positive_before = 0, zeros = 0;
    for (int64_t i = 0; i < n; i++) {
        positive_before += w0[i] > 0;
        zeros += w0[i] == 0;
        const int want = w0[i] > 0 ? -w0[i] : w0[i]; // negation keeps the magnitude; -0 = 0
        CHECK(w[i] == want, "diode w[%lld] = %d from %d under a positive gradient, want %d", (long long)i, w[i], w0[i],
              want);
    }
    // A zero weight counts as +1 but negation leaves it 0, so it "flips" on every step once s > 0.
    if (zeros == 0)
        CHECK(total_flips == positive_before, "flips %lld, want %lld", (long long)total_flips,
              (long long)positive_before);
    // One step by hand: m, s updates and the rule u = -sign(s) (+1 at s = 0).
    int8_t w1[4] = {5, -5, 7, -7};
    float m1[4] = {0.0f, 0.0f, 0.0f, 0.0f}, s1[4] = {-1e-9f, 1e-9f, 1e-9f, -1e-9f}, g1[4] = {1, -1, -1, 1};
    struct bie_diode_params q = {1.0f, 0.5f, 0.5f};
    int64_t f1;
    struct bie_tensor tw1 = TEST_VIEW(w1, BIE_DTYPE_I8, 4), tm1 = TEST_VIEW(m1, BIE_DTYPE_F32, 4),
                      ts1 = TEST_VIEW(s1, BIE_DTYPE_F32, 4), tg1 = TEST_VIEW(g1, BIE_DTYPE_F32, 4);
    CHECK_OK(ctx, bie_diode_step(ctx, &q, &(struct bie_diode_args){&tw1, &tg1, &tm1, &ts1, &f1}));
    // m = 0.5*g; s = 0.5*s + 0.5*sign(m): s ~ +0.5, -0.5, -0.5, +0.5 -> u = -1, +1, +1, -1.
    CHECK(m1[0] == 0.5f && m1[1] == -0.5f, "diode m = %g %g", m1[0], m1[1]);
    CHECK(w1[0] == -5 && w1[1] == 5 && w1[2] == 7 && w1[3] == -7 && f1 == 2,
          "diode one step: w = %d %d %d %d, flips %lld", w1[0], w1[1], w1[2], w1[3], (long long)f1);
    free(w);
    free(w0);
    free(m);
    free(s);
    free(g);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    bie_context_t * ctx = NULL;
    bie_context_create(NULL, &ctx);
    const int reps = getenv("BIE_TEST_QUICK") ? 3 : 20;
    for (int r = 0; r < reps; r++) {
        test_adam(ctx);
        test_diode(ctx);
    }
    bie_context_destroy(ctx);
    return test_finish("test-nn-optim");
}
