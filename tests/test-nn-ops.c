// SPDX-License-Identifier: Apache-2.0
// test-nn-ops.c: batch norm, max-pooling, activations and softmax cross-entropy against plain
// double-precision oracles, and their gradients against central finite differences.
#include "bie-train.h"
#include "test-util.h"

// Float tolerance of a result computed in f32 from O(1) inputs through sums of m terms:
// a few ulps per term, relative to the magnitude: 8 * m * FLT_EPSILON.
static double tol_sum(int64_t m) { return 8.0 * (double)m * 1.1920929e-7; }

static void fill(float * x, int64_t n, float lo, float hi) {
    for (int64_t i = 0; i < n; i++) x[i] = test_rand_float(lo, hi);
}

// Mean and (biased) variance of channel j of x [n, c, hw], in double.
static void channel_stats(int64_t n, int64_t c, int64_t hw, const double * x, int64_t j, double * mean, double * var) {
    const int64_t m = n * hw;
    double s = 0, v = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t p = 0; p < hw; p++) s += x[(i * c + j) * hw + p];
    s /= (double)m;
    for (int64_t i = 0; i < n; i++)
        for (int64_t p = 0; p < hw; p++) v += pow(x[(i * c + j) * hw + p] - s, 2);
    *mean = s;
    *var = v / (double)m;
}

// sum(gy * batchnorm(x)) in double with batch statistics (the training forward).
static double bn_loss(int64_t n, int64_t c, int64_t hw, const double * x, const float * gamma, const float * beta,
                      const float * gy) {
    double L = 0;
    for (int64_t j = 0; j < c; j++) {
        double mean, var;
        channel_stats(n, c, hw, x, j, &mean, &var);
        for (int64_t i = 0; i < n; i++)
            for (int64_t p = 0; p < hw; p++) {
                const int64_t at = (i * c + j) * hw + p;
                L += (double)gy[at] * ((x[at] - mean) / sqrt(var + 1e-5) * gamma[j] + beta[j]);
            }
    }
    return L;
}

static void test_batchnorm(bie_context_t * ctx) {
    const int64_t n = test_rand_int(1, 5) + 1, c = test_rand_int(1, 6), hw = test_rand_int(1, 9);
    const int64_t N = n * c * hw;
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N), *gy = malloc(sizeof(float) * N),
          *gx = malloc(sizeof(float) * N);
    float gamma[8], beta[8], rm[8], rv[8], sm[8], si[8], gg[8], gb[8];
    fill(x, N, -2, 3);
    fill(gy, N, -1, 1);
    fill(gamma, c, 0.5f, 1.5f);
    fill(beta, c, -1, 1);
    for (int64_t j = 0; j < c; j++) {
        rm[j] = 0.5f;
        rv[j] = 2.0f;
    }
    struct bie_tensor tx = TEST_VIEW(x, BIE_DTYPE_F32, n, c, hw), ty = TEST_VIEW(y, BIE_DTYPE_F32, n, c, hw),
                      tgy = TEST_VIEW(gy, BIE_DTYPE_F32, n, c, hw), tgx = TEST_VIEW(gx, BIE_DTYPE_F32, n, c, hw);
    struct bie_tensor tgamma = TEST_VIEW(gamma, BIE_DTYPE_F32, c), tbeta = TEST_VIEW(beta, BIE_DTYPE_F32, c),
                      trm = TEST_VIEW(rm, BIE_DTYPE_F32, c), trv = TEST_VIEW(rv, BIE_DTYPE_F32, c),
                      tsm = TEST_VIEW(sm, BIE_DTYPE_F32, c), tsi = TEST_VIEW(si, BIE_DTYPE_F32, c),
                      tgg = TEST_VIEW(gg, BIE_DTYPE_F32, c), tgb = TEST_VIEW(gb, BIE_DTYPE_F32, c);
    const struct bie_batchnorm_desc train = {0.1f, 1e-5f, 1}, eval = {0.1f, 1e-5f, 0};
    const struct bie_batchnorm_args fa = {&tx, &tgamma, &tbeta, &trm, &trv, &tsm, &tsi, &ty, NULL, NULL};
    CHECK_OK(ctx, bie_batchnorm_forward(ctx, &train, &fa));
    const int64_t m = n * hw;
    double * xd = malloc(sizeof(double) * N);
    for (int64_t i = 0; i < N; i++) xd[i] = x[i];
    for (int64_t j = 0; j < c; j++) {
        double mean, var;
        channel_stats(n, c, hw, xd, j, &mean, &var);
        CHECK(fabs(rm[j] - (0.9 * 0.5 + 0.1 * mean)) < 1e-5, "running_mean[%lld] = %g (n %lld c %lld hw %lld)",
              (long long)j, rm[j], (long long)n, (long long)c, (long long)hw);
        CHECK(fabs(rv[j] - (0.9 * 2.0 + 0.1 * var * m / (m - 1))) < 1e-5, "running_var[%lld] = %g", (long long)j,
              rv[j]);
        for (int64_t i = 0; i < n; i++)
            for (int64_t p = 0; p < hw; p++) {
                const int64_t at = (i * c + j) * hw + p;
                const double want = (x[at] - mean) / sqrt(var + 1e-5) * gamma[j] + beta[j];
                CHECK(fabs(y[at] - want) < 1e-4 * (1 + fabs(want)), "y[%lld] = %g, want %g", (long long)at, y[at],
                      want);
            }
    }
    // Gradients against central finite differences of L = sum(gy * y), with the forward
    // evaluated in double (bn_loss) so the difference quotient is not swamped by f32 rounding.
    const struct bie_batchnorm_backward_args ba = {&tx, &tgamma, &tsm, &tsi, &tgy, &tgx, &tgg, &tgb};
    CHECK_OK(ctx, bie_batchnorm_backward(ctx, &ba));
    const double h = 1e-5;
    for (int trial = 0; trial < 6; trial++) {
        const int64_t at = test_rand_int(0, N - 1);
        xd[at] = x[at] + h;
        const double lp = bn_loss(n, c, hw, xd, gamma, beta, gy);
        xd[at] = x[at] - h;
        const double lm = bn_loss(n, c, hw, xd, gamma, beta, gy);
        xd[at] = x[at];
        const double fd = (lp - lm) / (2 * h);
        // Truncation O(h^2) and double rounding O(1e-16/h) are far below the f32 backward's
        // rounding over m terms: tol_sum(m) relative to the terms' magnitude (|gy| <= 1, xh ~ 1).
        CHECK(fabs(gx[at] - fd) < 1e-3 + 4 * tol_sum(m) * (1 + fabs(fd)) * gamma[(at / hw) % c] * si[(at / hw) % c],
              "grad_x[%lld] = %g, finite difference %g (n %lld c %lld hw %lld)", (long long)at, gx[at], fd,
              (long long)n, (long long)c, (long long)hw);
    }
    free(xd);
    for (int64_t j = 0; j < c; j++) {
        double sb = 0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t p = 0; p < hw; p++) sb += gy[(i * c + j) * hw + p];
        CHECK(fabs(gb[j] - sb) < tol_sum(m), "grad_beta[%lld] = %g, want %g", (long long)j, gb[j], sb);
    }
    // Eval mode uses the running statistics.
    const struct bie_batchnorm_args ea = {&tx, &tgamma, &tbeta, &trm, &trv, NULL, NULL, &ty, NULL, NULL};
    CHECK_OK(ctx, bie_batchnorm_forward(ctx, &eval, &ea));
    const double want0 = (x[0] - rm[0]) / sqrt(rv[0] + 1e-5) * gamma[0] + beta[0];
    CHECK(fabs(y[0] - want0) < 1e-4 * (1 + fabs(want0)), "eval y[0] = %g, want %g", y[0], want0);
    // A residual is added to the normalised value: y + residual to the bit (one f32 addition).
    float * yr = malloc(sizeof(float) * N);
    struct bie_tensor tyr = TEST_VIEW(yr, BIE_DTYPE_F32, n, c, hw);
    const struct bie_batchnorm_args ra = {&tx, &tgamma, &tbeta, &trm, &trv, NULL, NULL, &tyr, &tgy, NULL};
    CHECK_OK(ctx, bie_batchnorm_forward(ctx, &eval, &ra));
    for (int64_t i = 0; i < N; i++)
        CHECK(yr[i] == y[i] + gy[i], "y with residual [%lld] = %g, want %g + %g", (long long)i, yr[i], y[i], gy[i]);
    free(yr);
    free(x);
    free(y);
    free(gy);
    free(gx);
}

static void test_maxpool(bie_context_t * ctx) {
    const int64_t n = test_rand_int(1, 3), c = test_rand_int(1, 4), h = test_rand_int(2, 9), w = test_rand_int(2, 9);
    const int32_t k = (int32_t)test_rand_int(1, h < w ? h : w);
    const int64_t oh = h / k, ow = w / k, N = n * c * h * w, M = n * c * oh * ow;
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * M), *gy = malloc(sizeof(float) * M),
          *gx = malloc(sizeof(float) * N);
    int32_t * am = malloc(sizeof(int32_t) * M);
    for (int64_t i = 0; i < N; i++) x[i] = (float)test_rand_int(-4, 4); // ties happen
    fill(gy, M, -1, 1);
    struct bie_tensor tx = TEST_VIEW(x, BIE_DTYPE_F32, n, c, h, w), ty = TEST_VIEW(y, BIE_DTYPE_F32, n, c, oh, ow),
                      tgy = TEST_VIEW(gy, BIE_DTYPE_F32, n, c, oh, ow), tgx = TEST_VIEW(gx, BIE_DTYPE_F32, n, c, h, w),
                      tam = TEST_VIEW(am, BIE_DTYPE_I32, n, c, oh, ow);
    const struct bie_maxpool2d_desc desc = {k};
    const struct bie_maxpool2d_args fa = {&tx, &ty, &tam};
    const struct bie_maxpool2d_backward_args ba = {&tgy, &tam, &tgx};
    CHECK_OK(ctx, bie_maxpool2d_forward(ctx, &desc, &fa));
    CHECK_OK(ctx, bie_maxpool2d_backward(ctx, &desc, &ba));
    double * want_gx = calloc((size_t)N, sizeof(double));
    for (int64_t pl = 0; pl < n * c; pl++)
        for (int64_t oy = 0; oy < oh; oy++)
            for (int64_t ox = 0; ox < ow; ox++) {
                int64_t best = -1;
                for (int a = 0; a < k; a++)
                    for (int b = 0; b < k; b++) {
                        const int64_t at = pl * h * w + (oy * k + a) * w + ox * k + b;
                        if (best < 0 || x[at] > x[best]) best = at;
                    }
                const int64_t o = pl * oh * ow + oy * ow + ox;
                CHECK(y[o] == x[best] && am[o] == best,
                      "pool y[%lld] = %g argmax %d, want %g at %lld (k %d, %lldx%lld)", (long long)o, y[o], am[o],
                      x[best], (long long)best, k, (long long)h, (long long)w);
                want_gx[best] += gy[o];
            }
    for (int64_t i = 0; i < N; i++) CHECK(gx[i] == (float)want_gx[i], "pool grad_x[%lld] = %g", (long long)i, gx[i]);
    const struct bie_maxpool2d_desc big = {(int32_t)(h + w)};
    TEST_EXPECT_STATUS(ctx, bie_maxpool2d_forward(ctx, &big, &fa), BIE_STATUS_INVALID_ARGUMENT, "desc.k");
    free(x);
    free(y);
    free(gy);
    free(gx);
    free(am);
    free(want_gx);
}

static void test_activations(bie_context_t * ctx) {
    const float x[7] = {-2.0f, -1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 3.0f};
    const float want_y[3][7] = {{0, 0, 0, 0, 0.5f, 1, 3}, {-1, -1, -1, 1, 1, 1, 1}, {-1, -1, -0.5f, 0, 0.5f, 1, 1}};
    const float want_g[3][7] = {{0, 0, 0, 0, 1, 1, 1}, {0, 1, 1, 1, 1, 1, 0}, {0, 1, 1, 1, 1, 1, 0}};
    const float ones[7] = {1, 1, 1, 1, 1, 1, 1};
    for (int a = 0; a < 3; a++) {
        float y[7], g[7];
        struct bie_tensor tx = TEST_VIEW(x, BIE_DTYPE_F32, 7), ty = TEST_VIEW(y, BIE_DTYPE_F32, 7),
                          to = TEST_VIEW(ones, BIE_DTYPE_F32, 7), tg = TEST_VIEW(g, BIE_DTYPE_F32, 7);
        CHECK_OK(ctx, bie_activation_forward(ctx, (enum bie_activation)a, &(struct bie_activation_args){&tx, &ty}));
        CHECK_OK(ctx, bie_activation_backward(ctx, (enum bie_activation)a,
                                              &(struct bie_activation_backward_args){&tx, &to, &tg}));
        for (int i = 0; i < 7; i++) {
            CHECK(y[i] == want_y[a][i], "act %d y(%g) = %g, want %g", a, x[i], y[i], want_y[a][i]);
            CHECK(g[i] == want_g[a][i], "act %d grad(%g) = %g, want %g", a, x[i], g[i], want_g[a][i]);
        }
    }
    float y[7];
    struct bie_tensor tx = TEST_VIEW(x, BIE_DTYPE_F32, 7), ty = TEST_VIEW(y, BIE_DTYPE_F32, 7);
    const struct bie_activation_args fa = {&tx, &ty};
    TEST_EXPECT_STATUS(ctx, bie_activation_forward(ctx, (enum bie_activation)7, &fa), BIE_STATUS_INVALID_ARGUMENT,
                       "act");
}

static void test_softmax_xent(bie_context_t * ctx) {
    const int64_t n = test_rand_int(1, 8), k = test_rand_int(2, 12);
    float *z = malloc(sizeof(float) * n * k), *g = malloc(sizeof(float) * n * k);
    uint8_t * lab = malloc((size_t)n);
    fill(z, n * k, -30, 30); // large logits: the max-subtraction must keep exp finite
    for (int64_t i = 0; i < n; i++) lab[i] = (uint8_t)test_rand_int(0, k - 1);
    double loss;
    int64_t correct;
    struct bie_tensor tz = TEST_VIEW(z, BIE_DTYPE_F32, n, k), tg = TEST_VIEW(g, BIE_DTYPE_F32, n, k),
                      tl = TEST_VIEW(lab, BIE_DTYPE_U8, n);
    const struct bie_softmax_cross_entropy_args sa = {&tz, &tl, &tg, &loss, &correct};
    CHECK_OK(ctx, bie_softmax_cross_entropy(ctx, &sa));
    double want = 0;
    int64_t want_c = 0;
    for (int64_t i = 0; i < n; i++) {
        double mx = -1e300, s = 0;
        int64_t arg = 0;
        for (int64_t j = 0; j < k; j++)
            if (z[i * k + j] > mx) {
                mx = z[i * k + j];
                arg = j;
            }
        for (int64_t j = 0; j < k; j++) s += exp(z[i * k + j] - mx);
        want += -(z[i * k + lab[i]] - mx - log(s));
        want_c += arg == lab[i];
        double gsum = 0;
        for (int64_t j = 0; j < k; j++) {
            const double p = exp(z[i * k + j] - mx) / s, wg = (p - (j == lab[i])) / (double)n;
            CHECK(fabs(g[i * k + j] - wg) < 1e-6, "grad[%lld,%lld] = %g, want %g", (long long)i, (long long)j,
                  g[i * k + j], wg);
            gsum += g[i * k + j];
        }
        CHECK(fabs(gsum) < 1e-6, "row %lld of the gradient sums to %g, not 0", (long long)i, gsum);
    }
    want /= (double)n;
    CHECK(fabs(loss - want) < 1e-9 * (1 + want), "loss = %.12g, want %.12g", loss, want);
    CHECK(correct == want_c, "correct = %lld, want %lld", (long long)correct, (long long)want_c);
    lab[0] = (uint8_t)k;
    TEST_EXPECT_STATUS(ctx, bie_softmax_cross_entropy(ctx, &sa), BIE_STATUS_INVALID_ARGUMENT, "labels[0]");
    lab[0] = 0;
    free(z);
    free(g);
    free(lab);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    bie_context_t * ctx = NULL;
    bie_context_create(NULL, &ctx);
    const int reps = getenv("BIE_TEST_QUICK") ? 5 : 40;
    for (int r = 0; r < reps; r++) {
        test_batchnorm(ctx);
        test_maxpool(ctx);
        test_softmax_xent(ctx);
    }
    test_activations(ctx);
    bie_context_destroy(ctx);
    return test_finish("test-nn-ops");
}
