// SPDX-License-Identifier: Apache-2.0
// test-nn-graph-ops.c: the graph model's float operations (src/nn/graph-ops.h) against plain
// double-precision oracles written from their definitions: pooling with random windows, strides
// and padding, adaptive average pooling, the activations and PReLU with their gradients (against
// central finite differences of the double oracle), adds, and batch norm's inference affine map
// (bit-identical to bie_batchnorm_forward in eval mode). Shapes are random; a failure prints the
// seed (BIE_TEST_SEED replays it) and the shape.
#include "bie-train.h"
#include "test-util.h"
#include "nn/graph-ops.h"

static void fill(float * x, int64_t n, float lo, float hi) {
    for (int64_t i = 0; i < n; i++) x[i] = test_rand_float(lo, hi);
}

static bool close_to(double got, double want, double rel, double abs_tol) {
    return fabs(got - want) <= abs_tol + rel * fabs(want);
}

static struct nn_pool random_pool(void) {
    struct nn_pool g;
    g.n = test_rand_int(1, 3);
    g.c = test_rand_int(1, 4);
    g.k = (int32_t)test_rand_int(1, 4);
    g.s = (int32_t)test_rand_int(1, 3);
    g.p = (int32_t)test_rand_int(0, g.k / 2);
    g.h = test_rand_int(g.k > 2 * g.p ? g.k - 2 * g.p : 1, 9);
    g.w = test_rand_int(g.k > 2 * g.p ? g.k - 2 * g.p : 1, 9);
    nn_pool_geometry(&g);
    return g;
}

// The window of output (oy, ox) from the definition: rows oy*s - p + a for a in [0, k).
static bool in_window(const struct nn_pool * g, int64_t oy, int64_t ox, int64_t iy, int64_t ix) {
    const int64_t a = iy - (oy * g->s - g->p), b = ix - (ox * g->s - g->p);
    return a >= 0 && a < g->k && b >= 0 && b < g->k;
}

static void test_pools(void) {
    const struct nn_pool g = random_pool();
    const int64_t hw = g.h * g.w, ohw = g.oh * g.ow, nx = g.n * g.c * hw, ny = g.n * g.c * ohw;
    float *x = malloc(sizeof(float) * nx), *y = malloc(sizeof(float) * ny), *gy = malloc(sizeof(float) * ny),
          *gx = malloc(sizeof(float) * nx);
    int32_t * am = malloc(sizeof(int32_t) * ny);
    double * want_gx = malloc(sizeof(double) * nx);
    fill(x, nx, -3, 3);
    fill(gy, ny, -1, 1);
    if (test_rand_int(0, 3) == 0) x[test_rand_int(0, nx - 1)] = x[test_rand_int(0, nx - 1)]; // a tie, sometimes
    // Max pooling also sees NaN (which wins) in a copy, sometimes.
    float *xm = malloc(sizeof(float) * nx), *y2 = malloc(sizeof(float) * ny);
    memcpy(xm, x, sizeof(float) * nx);
    if (test_rand_int(0, 2) == 0) xm[test_rand_int(0, nx - 1)] = NAN;
    // (oh, ow) from the definition, floor mode
    CHECK(g.oh == (g.h + 2 * g.p - g.k) / g.s + 1 && g.oh >= 1, "oh %lld", (long long)g.oh);
    const char * what[2] = {"max", "avg"};
    for (int kind = 0; kind < 2; kind++) {
        const float * in = kind == 0 ? xm : x;
        if (kind == 0) {
            nn_maxpool_forward(&g, in, y2, NULL); // inference: the value alone, on another path
            nn_maxpool_forward(&g, in, y, am);
        } else {
            nn_avgpool_forward(&g, in, y);
        }
        for (int64_t i = 0; i < nx; i++) want_gx[i] = 0;
        for (int64_t pl = 0; pl < g.n * g.c; pl++)
            for (int64_t oy = 0; oy < g.oh; oy++)
                for (int64_t ox = 0; ox < g.ow; ox++) {
                    double best = -INFINITY, sum = 0;
                    int64_t at = -1;
                    for (int64_t iy = 0; iy < g.h; iy++)
                        for (int64_t ix = 0; ix < g.w; ix++) {
                            if (!in_window(&g, oy, ox, iy, ix)) continue;
                            const double v = in[pl * hw + iy * g.w + ix];
                            sum += v;
                            // NaN wins over numbers; the first of equals (or NaNs) wins
                            if (isnan(v) ? !isnan(best) : !isnan(best) && v > best) best = v, at = iy * g.w + ix;
                        }
                    const int64_t o = pl * ohw + oy * g.ow + ox;
                    if (kind == 0) {
                        const bool same =
                            isnan(best) ? isnan(y[o]) && isnan(y2[o]) : y[o] == (float)best && y2[o] == y[o];
                        CHECK(
                            at >= 0 && same && am[o] == at,
                            "maxpool y[%lld] = %g (argmax %d), want %g (%lld); n %lld c %lld %lldx%lld k %d s %d p %d",
                            (long long)o, y[o], am[o], best, (long long)at, (long long)g.n, (long long)g.c,
                            (long long)g.h, (long long)g.w, g.k, g.s, g.p);
                        if (at >= 0) want_gx[pl * hw + at] += gy[o];
                    } else {
                        const double want = sum / (g.k * g.k);
                        CHECK(close_to(y[o], want, 1e-6, 1e-7),
                              "avgpool y[%lld] = %g, want %g; %lldx%lld k %d s %d p %d", (long long)o, y[o], want,
                              (long long)g.h, (long long)g.w, g.k, g.s, g.p);
                        for (int64_t iy = 0; iy < g.h; iy++)
                            for (int64_t ix = 0; ix < g.w; ix++)
                                if (in_window(&g, oy, ox, iy, ix))
                                    want_gx[pl * hw + iy * g.w + ix] += gy[o] / (g.k * g.k);
                    }
                }
        if (kind == 0) nn_maxpool_backward(&g, gy, am, gx);
        else nn_avgpool_backward(&g, gy, gx);
        for (int64_t i = 0; i < nx; i++)
            CHECK(close_to(gx[i], want_gx[i], 1e-5, 1e-6),
                  "%spool grad_x[%lld] = %g, want %g; %lldx%lld k %d s %d p %d", what[kind], (long long)i, gx[i],
                  want_gx[i], (long long)g.h, (long long)g.w, g.k, g.s, g.p);
    }
    free(x);
    free(xm);
    free(y);
    free(y2);
    free(gy);
    free(gx);
    free(am);
    free(want_gx);
}

static void test_adaptive(void) {
    // PyTorch's documented windows for 7 -> 3: [0, 3), [2, 5), [4, 7).
    {
        float x[7], y[3], gx[7], gy[3] = {3, 3, 3};
        for (int i = 0; i < 7; i++) x[i] = (float)i;
        nn_adaptive_avgpool_forward(1, 1, 1, 7, 1, 3, x, y);
        CHECK(y[0] == 1.0f && y[1] == 3.0f && y[2] == 5.0f, "7 -> 3: %g %g %g", y[0], y[1], y[2]);
        nn_adaptive_avgpool_backward(1, 1, 1, 7, 1, 3, gy, gx);
        const float want[7] = {1, 1, 2, 1, 2, 1, 1};
        for (int i = 0; i < 7; i++) CHECK(gx[i] == want[i], "7 -> 3: grad_x[%d] = %g, want %g", i, gx[i], want[i]);
    }
    const int64_t n = test_rand_int(1, 3), c = test_rand_int(1, 4), h = test_rand_int(1, 11), w = test_rand_int(1, 11);
    const int64_t oh = test_rand_int(1, h), ow = test_rand_int(1, w), nx = n * c * h * w, ny = n * c * oh * ow;
    float *x = malloc(sizeof(float) * nx), *y = malloc(sizeof(float) * ny), *gy = malloc(sizeof(float) * ny),
          *gx = malloc(sizeof(float) * nx);
    double * want_gx = calloc((size_t)nx, sizeof(double));
    fill(x, nx, -2, 2);
    fill(gy, ny, -1, 1);
    nn_adaptive_avgpool_forward(n, c, h, w, oh, ow, x, y);
    nn_adaptive_avgpool_backward(n, c, h, w, oh, ow, gy, gx);
    for (int64_t pl = 0; pl < n * c; pl++)
        for (int64_t oy = 0; oy < oh; oy++)
            for (int64_t ox = 0; ox < ow; ox++) {
                const int64_t y0 = (int64_t)floor((double)oy * h / oh), y1 = (int64_t)ceil((double)(oy + 1) * h / oh);
                const int64_t x0 = (int64_t)floor((double)ox * w / ow), x1 = (int64_t)ceil((double)(ox + 1) * w / ow);
                double sum = 0;
                for (int64_t iy = y0; iy < y1; iy++)
                    for (int64_t ix = x0; ix < x1; ix++) sum += x[(pl * h + iy) * w + ix];
                const double cnt = (double)((y1 - y0) * (x1 - x0));
                const int64_t o = (pl * oh + oy) * ow + ox;
                CHECK(close_to(y[o], sum / cnt, 1e-6, 1e-7), "adaptive y[%lld] = %g, want %g; %lldx%lld -> %lldx%lld",
                      (long long)o, y[o], sum / cnt, (long long)h, (long long)w, (long long)oh, (long long)ow);
                for (int64_t iy = y0; iy < y1; iy++)
                    for (int64_t ix = x0; ix < x1; ix++) want_gx[(pl * h + iy) * w + ix] += gy[o] / cnt;
            }
    for (int64_t i = 0; i < nx; i++)
        CHECK(close_to(gx[i], want_gx[i], 1e-5, 1e-6), "adaptive grad_x[%lld] = %g, want %g; %lldx%lld -> %lldx%lld",
              (long long)i, gx[i], want_gx[i], (long long)h, (long long)w, (long long)oh, (long long)ow);
    free(x);
    free(y);
    free(gy);
    free(gx);
    free(want_gx);
}

// The activations in double, from their definitions.
static double act_oracle(enum nn_act a, double v) {
    switch (a) {
    case NN_ACT_RELU: return v > 0 ? v : 0;
    case NN_ACT_SIGN: return v >= 0 ? 1 : -1;
    case NN_ACT_HARDTANH: return v < -1 ? -1 : v > 1 ? 1 : v;
    case NN_ACT_TANH: return tanh(v);
    case NN_ACT_GELU: return 0.5 * v * (1 + erf(v / sqrt(2.0)));
    case NN_ACT_GELU_TANH: return 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    case NN_ACT_SILU: return v / (1 + exp(-v));
    }
    return NAN;
}

static void test_activations(void) {
    const char * names[] = {"relu", "sign", "hardtanh", "tanh", "gelu", "gelu_tanh", "silu"};
    const int64_t count = test_rand_int(1, 300);
    float *x = malloc(sizeof(float) * (count + 8)), *y = malloc(sizeof(float) * (count + 8)),
          *gy = malloc(sizeof(float) * (count + 8)), *gx = malloc(sizeof(float) * (count + 8));
    fill(x, count, -4, 4);
    const float special[8] = {0.0f, -0.0f, 1.0f, -1.0f, 30.0f, -30.0f, 100.0f, -100.0f};
    memcpy(x + count, special, sizeof special);
    const int64_t total = count + 8;
    fill(gy, total, -1, 1);
    for (int a = NN_ACT_RELU; a <= NN_ACT_SILU; a++) {
        const enum nn_act act = (enum nn_act)a;
        nn_act_forward(act, total, x, y);
        nn_act_backward(act, total, x, gy, gx);
        for (int64_t i = 0; i < total; i++) {
            const double v = x[i], want = act_oracle(act, v);
            CHECK(close_to(y[i], want, 4e-6, 4e-7), "%s(%.9g) = %.9g, want %.9g", names[a], v, y[i], want);
            // Derivative: the straight-through ones by definition, the smooth ones by central
            // differences of the double oracle (away from the kinks of relu and hardtanh).
            double d;
            if (act == NN_ACT_SIGN || act == NN_ACT_HARDTANH) d = fabs(v) <= 1 ? 1 : 0;
            else if (act == NN_ACT_RELU) d = v > 0 ? 1 : 0;
            else d = (act_oracle(act, v + 1e-5) - act_oracle(act, v - 1e-5)) / 2e-5;
            CHECK(close_to(gx[i], gy[i] * d, 1e-4, 1e-6), "%s'(%.9g): grad_x = %.9g, want %.9g", names[a], v, gx[i],
                  gy[i] * d);
            CHECK(isfinite(y[i]) && isfinite(gx[i]), "%s(%.9g) is not finite", names[a], v);
        }
        // In place: y may be x.
        float * z = malloc(sizeof(float) * total);
        memcpy(z, x, sizeof(float) * total);
        nn_act_forward(act, total, z, z);
        CHECK(memcmp(z, y, sizeof(float) * total) == 0, "%s in place differs", names[a]);
        free(z);
    }
    free(x);
    free(y);
    free(gy);
    free(gx);
}

static void test_prelu(void) {
    const int64_t n = test_rand_int(1, 3), c = test_rand_int(1, 5), hw = test_rand_int(1, 7), N = n * c * hw;
    const int64_t n_slope = test_rand_int(0, 1) ? c : 1;
    float slope[5], gs[5], *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N),
                           *gy = malloc(sizeof(float) * N), *gx = malloc(sizeof(float) * N);
    fill(slope, n_slope, -0.5f, 0.8f);
    fill(x, N, -2, 2);
    x[0] = 0.0f;
    fill(gy, N, -1, 1);
    nn_prelu_forward(n, c, hw, slope, n_slope, x, y);
    nn_prelu_backward(n, c, hw, slope, n_slope, x, gy, gx, gs);
    double want_gs[5] = {0};
    for (int64_t i = 0; i < N; i++) {
        const int64_t j = n_slope == 1 ? 0 : (i / hw) % c;
        const double a = slope[j], want = x[i] > 0 ? x[i] : a * x[i], d = x[i] > 0 ? 1 : a;
        CHECK(y[i] == (float)want, "prelu(%g) = %g, want %g (slope %g)", x[i], y[i], want, a);
        CHECK(close_to(gx[i], gy[i] * d, 1e-6, 1e-7), "prelu grad_x[%lld] = %g, want %g", (long long)i, gx[i],
              gy[i] * d);
        if (!(x[i] > 0)) want_gs[j] += (double)gy[i] * x[i];
    }
    for (int64_t j = 0; j < n_slope; j++)
        CHECK(close_to(gs[j], want_gs[j], 1e-5, 1e-6), "prelu grad_slope[%lld] = %g, want %g (n %lld c %lld hw %lld)",
              (long long)j, gs[j], want_gs[j], (long long)n, (long long)c, (long long)hw);
    nn_prelu_backward(n, c, hw, slope, n_slope, x, gy, NULL, gs); // grad_x is optional
    free(x);
    free(y);
    free(gy);
    free(gx);
}

static void test_add_affine(bie_context_t * ctx) {
    const int64_t n = test_rand_int(1, 4), c = test_rand_int(1, 6), hw = test_rand_int(1, 9), N = n * c * hw;
    float *a = malloc(sizeof(float) * N), *b = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N),
          *z = malloc(sizeof(float) * N);
    fill(a, N, -2, 2);
    fill(b, N, -2, 2);
    nn_add(N, a, b, y);
    for (int64_t i = 0; i < N; i++) CHECK(y[i] == a[i] + b[i], "add[%lld]", (long long)i);
    memcpy(z, y, sizeof(float) * N);
    nn_accumulate(N, a, z);
    for (int64_t i = 0; i < N; i++) CHECK(z[i] == y[i] + a[i], "accumulate[%lld]", (long long)i);
    float gamma[6], beta[6], rm[6], rv[6], scale[6], shift[6];
    fill(gamma, c, 0.5f, 1.5f);
    fill(beta, c, -1, 1);
    fill(rm, c, -1, 1);
    fill(rv, c, 0.1f, 3);
    struct bie_tensor tx = TEST_VIEW(a, BIE_DTYPE_F32, n, c, hw), ty = TEST_VIEW(y, BIE_DTYPE_F32, n, c, hw),
                      tgamma = TEST_VIEW(gamma, BIE_DTYPE_F32, c), tbeta = TEST_VIEW(beta, BIE_DTYPE_F32, c),
                      trm = TEST_VIEW(rm, BIE_DTYPE_F32, c), trv = TEST_VIEW(rv, BIE_DTYPE_F32, c);
    CHECK_OK(ctx, bie_batchnorm_forward(
                      ctx, &(struct bie_batchnorm_desc){0.1f, 1e-5f, 0},
                      &(struct bie_batchnorm_args){&tx, &tgamma, &tbeta, &trm, &trv, NULL, NULL, &ty, NULL, NULL}));
    nn_batchnorm_affine(c, gamma, beta, rm, rv, 1e-5f, scale, shift);
    nn_channel_affine(n, c, hw, scale, shift, a, z);
    CHECK(memcmp(y, z, sizeof(float) * N) == 0,
          "batch norm affine differs from bie_batchnorm_forward (n %lld c %lld hw %lld)", (long long)n, (long long)c,
          (long long)hw);
    free(a);
    free(b);
    free(y);
    free(z);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    bie_context_t * ctx = NULL;
    bie_context_create(NULL, &ctx);
    for (int r = 0; r < 40; r++) {
        test_pools();
        test_adaptive();
        test_prelu();
        test_add_affine(ctx);
    }
    for (int r = 0; r < 5; r++) test_activations();
    bie_context_destroy(ctx);
    return test_finish("test-nn-graph-ops");
}
