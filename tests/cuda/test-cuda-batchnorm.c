// SPDX-License-Identifier: Apache-2.0
// test-cuda-batchnorm.c: bie_batchnorm_forward and _backward on CUDA tensors against the CPU
// functions (the reference, dense f32) on f32 copies of the same operands:
//   x, y, residual, grad_y, grad_x f32 / f16 / bf16, each NCHW, channels-last or with gaps
//   between rows and images, or [N, C]; gamma, beta and the running statistics f32 or f16; channel counts
//   that take the vectorised route (8k, up to 2048) and others; means far from zero against the
//   spread (the statistics' shift); training and eval;
//   forward: y within a rounding of its dtype (plus an f32 bound), saved_* and running_* within
//   f32 bounds; a second call gives the same bits;
//   backward: grad_x within a rounding of its dtype, grad_gamma and grad_beta within the bound of
//   f32 sums of their terms;
//   bad views and vectors: INVALID_ARGUMENT naming the argument;
//   a training forward recorded (bie_cuda_record_begin) and replayed equals a direct call, and adds 1
//   to the batch counter (num_batches) at each run, none at the recording.
#include "cuda-test.h"

// ulp-sized relative bound of a dtype's rounding.
static double unit(enum bie_dtype d) { return d == BIE_DTYPE_F16 ? 0x1p-10 : d == BIE_DTYPE_BF16 ? 0x1p-7 : 0x1p-20; }

// A dense f32 copy of t (same shape).
static struct bie_tensor f32_copy(const struct bie_tensor * t) {
    struct bie_tensor r = test_tensor(BIE_DTYPE_F32, t->ndim, t->shape, NULL);
    int64_t idx[BIE_MAX_DIMS] = {0};
    do bie_store(&r, bie_offset(&r, idx), bie_load(t, bie_offset(t, idx)));
    while (bie_next_index(t, idx));
    return r;
}

// An activation-shaped host tensor: [N, C] (kind 3) or make4's NCHW / channels-last / gapped.
static struct bie_tensor act(enum bie_dtype dt, const int64_t * shape, int kind) {
    return kind == 3 ? test_tensor(dt, 2, shape, NULL) : make4(dt, shape, kind);
}

// The largest |a - b| / (rel * |b| + abs) over the elements (> 1: out of bounds), its index in *at.
static double worst(const struct bie_tensor * a, const struct bie_tensor * b, double rel, double abs_, int64_t * at) {
    double w = 0.0;
    int64_t idx[BIE_MAX_DIMS] = {0}, k = 0;
    *at = -1;
    do {
        const double x = bie_load(a, bie_offset(a, idx)), y = bie_load(b, bie_offset(b, idx));
        const double r = isnan(x) || isnan(y) ? INFINITY : fabs(x - y) / (rel * fabs(y) + abs_);
        if (r > w) w = r, *at = k;
        k++;
    } while (bie_next_index(a, idx));
    return w;
}

struct bcase {
    int64_t shape[4];
    int kind, rkind, gkind; // x's layout (and y's), the residual's (-1: none), grad_y's and grad_x's
    enum bie_dtype xd, yd, rd, pd;
    int training;
    float offset, spread;
    char what[256];
};

static void random_case(struct bcase * c, int i) {
    static const int64_t cs[] = {1, 3, 8, 16, 24, 64, 72, 136, 512, 2048, 2056};
    static const enum bie_dtype fl[] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16};
    c->shape[0] = test_rand_int(1, 5);
    c->shape[1] = test_pick(cs, 11);
    c->shape[2] = test_rand_int(1, 9);
    c->shape[3] = test_rand_int(1, 9);
    c->kind = (int)test_rand_int(0, 3);
    if (i % 3 == 0) c->kind = 1; // channels-last: the vectorised route
    c->xd = fl[test_rand_int(0, 2)];
    c->yd = test_rand_int(0, 3) ? c->xd : fl[test_rand_int(0, 2)];
    c->rkind = test_rand_int(0, 2) ? -1 : test_rand_int(0, 1) ? c->kind : (int)test_rand_int(0, 2);
    if (c->kind == 3 && c->rkind >= 0) c->rkind = 3;
    c->rd = test_rand_int(0, 1) ? c->xd : fl[test_rand_int(0, 2)];
    c->gkind = test_rand_int(0, 1) ? c->kind : c->kind == 3 ? 3 : (int)test_rand_int(0, 2);
    c->pd = test_rand_int(0, 1) ? BIE_DTYPE_F32 : BIE_DTYPE_F16;
    c->training = test_rand_int(0, 4) != 0;
    c->offset = test_rand_int(0, 2) ? 0.0f : test_rand_float(-60.0f, 60.0f);
    c->spread = test_rand_float(0.05f, 4.0f);
    if (i % 17 == 5) { // a ResNet stage's size: many blocks of rows
        c->shape[0] = 4, c->shape[1] = 64, c->shape[2] = c->shape[3] = 56;
        c->kind = c->rkind = c->gkind = 1;
        c->yd = c->rd = c->xd = BIE_DTYPE_F16;
    }
    snprintf(c->what, sizeof c->what,
             "x [%lld, %lld, %lld, %lld] layout %d %s, y %s, residual layout %d %s, grad layout %d, params %s, "
             "training %d, offset %g spread %g",
             (long long)c->shape[0], (long long)c->shape[1], (long long)c->shape[2], (long long)c->shape[3], c->kind,
             bie_dtype_name(c->xd), bie_dtype_name(c->yd), c->rkind, bie_dtype_name(c->rd), c->gkind,
             bie_dtype_name(c->pd), c->training, (double)c->offset, (double)c->spread);
}

// A [C] vector of dtype d with values in [lo, hi), and its f32 copy in *f.
static struct bie_tensor vec(enum bie_dtype d, int64_t C, float lo, float hi, struct bie_tensor * f) {
    struct bie_tensor t = test_tensor(d, 1, &C, NULL);
    test_fill_uniform(&t, lo, hi);
    *f = f32_copy(&t);
    return t;
}

static void check_case(bie_context_t * ref, bie_context_t * cu, const struct bcase * c) {
    const int64_t C = c->shape[1];
    const int64_t m = c->shape[0] * (c->kind == 3 ? 1 : c->shape[2] * c->shape[3]);
    struct bie_tensor x = act(c->xd, c->shape, c->kind), y = act(c->yd, c->shape, c->kind);
    struct bie_tensor r = c->rkind >= 0 ? act(c->rd, c->shape, c->rkind) : (struct bie_tensor){0};
    test_fill_uniform(&x, c->offset - c->spread, c->offset + c->spread);
    if (r.data) test_fill_uniform(&r, -2.0f, 2.0f);
    fill_poison(&y);
    struct bie_tensor gf, bf, rmf, rvf;
    struct bie_tensor g = vec(c->pd, C, 0.5f, 1.5f, &gf), b = vec(c->pd, C, -1.0f, 1.0f, &bf);
    struct bie_tensor rm = vec(c->pd, C, -1.0f, 1.0f, &rmf), rv = vec(c->pd, C, 0.5f, 2.0f, &rvf);
    struct bie_tensor sm = test_tensor(BIE_DTYPE_F32, 1, &C, NULL), si = test_tensor(BIE_DTYPE_F32, 1, &C, NULL);
    struct bie_tensor smf = test_tensor(BIE_DTYPE_F32, 1, &C, NULL), sif = test_tensor(BIE_DTYPE_F32, 1, &C, NULL);
    // the reference on f32 copies
    struct bie_tensor xf = f32_copy(&x), rf = r.data ? f32_copy(&r) : (struct bie_tensor){0};
    struct bie_tensor yf = test_tensor(BIE_DTYPE_F32, x.ndim, x.shape, NULL);
    const struct bie_batchnorm_desc d = {0.1f, 1e-5f, c->training};
    CHECK_OK(ref, bie_batchnorm_forward(ref, &d,
                                        &(struct bie_batchnorm_args){&xf, &gf, &bf, &rmf, &rvf, &smf, &sif, &yf,
                                                                     r.data ? &rf : NULL, NULL}));
    // CUDA, twice (the same bits)
    struct bie_tensor dx = cuda_mirror(&x), dy = cuda_mirror(&y), dr = r.data ? cuda_mirror(&r) : r;
    struct bie_tensor dg = cuda_mirror(&g), db = cuda_mirror(&b), dsm = cuda_mirror(&sm), dsi = cuda_mirror(&si);
    struct bie_tensor y2 = test_tensor(y.dtype, y.ndim, y.shape, y.stride);
    for (int pass = 0; pass < 2; pass++) {
        struct bie_tensor drm = cuda_mirror(&rm), drv = cuda_mirror(&rv);
        CHECK_OK(cu, bie_batchnorm_forward(cu, &d,
                                           &(struct bie_batchnorm_args){&dx, &dg, &db, &drm, &drv, &dsm, &dsi, &dy,
                                                                        r.data ? &dr : NULL, NULL}));
        CUDA_OK(cudaDeviceSynchronize());
        if (pass == 1) {
            cuda_fetch(&y2, &dy);
            CHECK(memcmp(y.data, y2.data, tensor_span(&y)) == 0, "forward: a second call differs (%s, seed %llu)",
                  c->what, (unsigned long long)test_seed);
        } else {
            cuda_fetch(&y, &dy);
            cuda_fetch(&rm, &drm);
            cuda_fetch(&rv, &drv);
        }
        cuda_tensor_free(&drm);
        cuda_tensor_free(&drv);
    }
    cuda_fetch(&sm, &dsm);
    cuda_fetch(&si, &dsi);
    int64_t at;
    // y: its rounding to y's dtype; the reference's x * a + b in f32 against fma(x - mean, a, beta)
    // (a = gamma invstd, up to amax; |x| up to |offset| + spread); the statistics' sums
    double amax = 0.0;
    for (int64_t k = 0; k < C; k++) {
        const double inv = c->training ? bie_load(&sif, k) : 1.0 / sqrt(bie_load(&rvf, k) + 1e-5);
        amax = fmax(amax, fabs(bie_load(&gf, k)) * inv);
    }
    const double xmax = fabs((double)c->offset) + c->spread, scale = xmax / c->spread;
    double w = worst(&y, &yf, unit(c->yd), 4e-7 * amax * xmax + 2e-6 * amax * c->spread + 4e-5 + unit(c->yd), &at);
    CHECK(w <= 1.0, "forward y: %.3g of the bound at element %lld (%s, seed %llu)", w, (long long)at, c->what,
          (unsigned long long)test_seed);
    if (c->training) {
        // the statistics: mean within f32 sums of the spread, invstd within 1e-4
        w = worst(&sm, &smf, 1e-6, 1e-5 * c->spread, &at);
        CHECK(w <= 1.0, "saved_mean: %.3g of the bound at %lld (%s, seed %llu)", w, (long long)at, c->what,
              (unsigned long long)test_seed);
        w = worst(&si, &sif, 1e-4, 0.0, &at);
        CHECK(w <= 1.0, "saved_invstd: %.3g of the bound at %lld (%s, seed %llu)", w, (long long)at, c->what,
              (unsigned long long)test_seed);
    }
    w = worst(&rm, &rmf, 2 * unit(c->pd), 2e-6 * (1 + fabs((double)c->offset) + c->spread), &at);
    CHECK(w <= 1.0, "running_mean: %.3g of the bound at %lld (%s, seed %llu)", w, (long long)at, c->what,
          (unsigned long long)test_seed);
    w = worst(&rv, &rvf, 2 * unit(c->pd) + 1e-4, 1e-6, &at);
    CHECK(w <= 1.0, "running_var: %.3g of the bound at %lld (%s, seed %llu)", w, (long long)at, c->what,
          (unsigned long long)test_seed);

    if (c->training) { // backward from the saved statistics of the CUDA forward (both sides)
        struct bie_tensor gy = act(c->xd, c->shape, c->gkind), gx = act(c->xd, c->shape, c->gkind);
        test_fill_uniform(&gy, -1.0f, 1.0f);
        fill_poison(&gx);
        struct bie_tensor gyf = f32_copy(&gy), gxf = test_tensor(BIE_DTYPE_F32, x.ndim, x.shape, NULL);
        struct bie_tensor ggf = test_tensor(BIE_DTYPE_F32, 1, &C, NULL), gbf = test_tensor(BIE_DTYPE_F32, 1, &C, NULL);
        struct bie_tensor gg = test_tensor(c->pd, 1, &C, NULL), gb = test_tensor(c->pd, 1, &C, NULL);
        CHECK_OK(ref, bie_batchnorm_backward(
                          ref, &(struct bie_batchnorm_backward_args){&xf, &gf, &sm, &si, &gyf, &gxf, &ggf, &gbf}));
        struct bie_tensor dgy = cuda_mirror(&gy), dgx = cuda_mirror(&gx), dgg = cuda_mirror(&gg),
                          dgb = cuda_mirror(&gb);
        CHECK_OK(cu, bie_batchnorm_backward(
                         cu, &(struct bie_batchnorm_backward_args){&dx, &dg, &dsm, &dsi, &dgy, &dgx, &dgg, &dgb}));
        CUDA_OK(cudaDeviceSynchronize());
        cuda_fetch(&gx, &dgx);
        cuda_fetch(&gg, &dgg);
        cuda_fetch(&gb, &dgb);
        // bounds: f32 sums of m terms of |g| <= 1 and |g xhat| (xhat up to about 2 sqrt(3))
        const double sg = 1e-6 * (double)m + unit(c->pd), sx = 4e-6 * (double)m;
        w = worst(&gb, &gbf, unit(c->pd), sg, &at);
        CHECK(w <= 1.0, "grad_beta: %.3g of the bound at %lld (%s, seed %llu)", w, (long long)at, c->what,
              (unsigned long long)test_seed);
        w = worst(&gg, &ggf, unit(c->pd), sx + unit(c->pd), &at);
        CHECK(w <= 1.0, "grad_gamma: %.3g of the bound at %lld (%s, seed %llu)", w, (long long)at, c->what,
              (unsigned long long)test_seed);
        // grad_x = c1 g + c2 (x - mean) + c3, each term up to gamma invstd (1.5 / spread-ish)
        double mag = 0.0;
        for (int64_t k = 0; k < C; k++) {
            const double a = fabs(bie_load(&gf, k) * bie_load(&si, k));
            if (a > mag) mag = a;
        }
        w = worst(&gx, &gxf, unit(c->xd), mag * (4 * unit(c->xd) + 1e-5 * (scale + 4)), &at);
        CHECK(w <= 1.0, "grad_x: %.3g of the bound at %lld (%s, seed %llu)", w, (long long)at, c->what,
              (unsigned long long)test_seed);
        struct bie_tensor * frees[] = {&gy, &gx, &gyf, &gxf, &ggf, &gbf, &gg, &gb};
        for (int k = 0; k < 8; k++) test_tensor_free(frees[k]);
        cuda_tensor_free(&dgy);
        cuda_tensor_free(&dgx);
        cuda_tensor_free(&dgg);
        cuda_tensor_free(&dgb);
    }
    struct bie_tensor * frees[] = {&x, &y, &y2, &g, &b, &rm, &rv, &sm, &si, &smf, &sif, &xf, &yf, &gf, &bf, &rmf, &rvf};
    for (int k = 0; k < 17; k++) test_tensor_free(frees[k]);
    if (r.data) {
        test_tensor_free(&r);
        test_tensor_free(&rf);
        cuda_tensor_free(&dr);
    }
    struct bie_tensor * dfrees[] = {&dx, &dy, &dg, &db, &dsm, &dsi};
    for (int k = 0; k < 6; k++) cuda_tensor_free(dfrees[k]);
}

// Views and vectors the CUDA batch norm refuses, each naming its argument.
// Recorded calls (bie_cuda_record_begin, _end, bie_cuda_replay): a training forward recorded runs
// nothing; its replay, after x took other values in place, gives the bits (y, statistics, running
// statistics) of a direct call on the new values; the entry points refuse what they cannot do.
static void check_replay(bie_context_t * cu) {
    const int64_t shape[4] = {3, 24, 5, 7}, C = 24;
    struct bie_tensor x = make4(BIE_DTYPE_F16, shape, 1), y = make4(BIE_DTYPE_F16, shape, 1);
    struct bie_tensor y2 = make4(BIE_DTYPE_F16, shape, 1), f[4];
    struct bie_tensor g = vec(BIE_DTYPE_F32, C, 0.5f, 1.5f, &f[0]), b = vec(BIE_DTYPE_F32, C, -1.0f, 1.0f, &f[1]);
    struct bie_tensor rm = vec(BIE_DTYPE_F32, C, -1.0f, 1.0f, &f[2]), rv = vec(BIE_DTYPE_F32, C, 0.5f, 2.0f, &f[3]);
    struct bie_tensor got[3] = {test_tensor(BIE_DTYPE_F32, 1, &C, NULL), test_tensor(BIE_DTYPE_F32, 1, &C, NULL),
                                test_tensor(BIE_DTYPE_F32, 1, &C, NULL)};
    struct bie_tensor want[3] = {test_tensor(BIE_DTYPE_F32, 1, &C, NULL), test_tensor(BIE_DTYPE_F32, 1, &C, NULL),
                                 test_tensor(BIE_DTYPE_F32, 1, &C, NULL)};
    test_fill_uniform(&x, -2.0f, 3.0f);
    memset(y.data, 0, tensor_span(&y));
    struct bie_tensor dx = cuda_mirror(&x), dy = cuda_mirror(&y), dg = cuda_mirror(&g), db = cuda_mirror(&b);
    struct bie_tensor drm = cuda_mirror(&rm), drv = cuda_mirror(&rv), dsm = cuda_mirror(&got[0]),
                      dsi = cuda_mirror(&got[1]);
    int64_t count = 7;
    struct bie_tensor hnb = test_view(&count, BIE_DTYPE_I64, 1, (const int64_t[]){1}), dnb = cuda_mirror(&hnb);
    const struct bie_batchnorm_desc d = {0.1f, 1e-5f, 1};
    struct bie_batchnorm_args a = {&dx, &dg, &db, &drm, &drv, &dsm, &dsi, &dy, NULL, &dnb};
    CHECK_OK(cu, bie_batchnorm_forward(cu, &d, &a)); // (first use: nothing left to set up while recording)
    CUDA_OK(cudaMemset(dy.data, 0, tensor_span(&y)));
    CUDA_OK(cudaMemcpy(drm.data, rm.data, tensor_span(&rm), cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize());
    bie_cuda_graph_t * graph = NULL;
    CHECK_OK(cu, bie_cuda_record_begin(cu));
    TEST_EXPECT_STATUS(cu, bie_cuda_record_begin(cu), BIE_STATUS_INVALID_ARGUMENT, "already recording");
    CHECK_OK(cu, bie_batchnorm_forward(cu, &d, &a));
    CHECK_OK(cu, bie_cuda_record_end(cu, &graph));
    CHECK(graph != NULL, "replay: no graph");
    CUDA_OK(cudaDeviceSynchronize());
    cuda_fetch(&y2, &dy);
    cuda_fetch(&got[2], &drm);
    CHECK(memcmp(y2.data, y.data, tensor_span(&y)) == 0 && memcmp(got[2].data, rm.data, tensor_span(&rm)) == 0,
          "replay: recording ran the call");
    test_fill_uniform(&x, -1.0f, 5.0f); // new values in place: the replay reads them
    CUDA_OK(cudaMemcpy(dx.data, x.data, tensor_span(&x), cudaMemcpyHostToDevice));
    CHECK_OK(cu, bie_cuda_replay(cu, graph));
    CUDA_OK(cudaDeviceSynchronize());
    cuda_fetch(&y2, &dy);
    cuda_fetch(&got[0], &dsm);
    cuda_fetch(&got[2], &drm);
    CUDA_OK(cudaMemcpy(drm.data, rm.data, tensor_span(&rm), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(drv.data, rv.data, tensor_span(&rv), cudaMemcpyHostToDevice));
    CHECK_OK(cu, bie_batchnorm_forward(cu, &d, &a));
    CUDA_OK(cudaDeviceSynchronize());
    cuda_fetch(&y, &dy);
    cuda_fetch(&want[0], &dsm);
    cuda_fetch(&want[2], &drm);
    CHECK(memcmp(y2.data, y.data, tensor_span(&y)) == 0, "replay: y differs from a direct call's");
    CHECK(memcmp(got[0].data, want[0].data, tensor_span(&want[0])) == 0, "replay: saved_mean differs");
    CHECK(memcmp(got[2].data, want[2].data, tensor_span(&want[2])) == 0, "replay: running_mean differs");
    cuda_fetch(&hnb, &dnb);
    CHECK(count == 10, "replay: the batch counter is %lld after a call, a recording, a replay and a call (not 10)",
          (long long)count);
    bie_context_t * other = test_new_context(BIE_BACKEND_AUTO);
    CHECK_OK(other, bie_batchnorm_forward(other, &d, &a)); // (its CUDA state exists)
    TEST_EXPECT_STATUS(other, bie_cuda_replay(other, graph), BIE_STATUS_INVALID_ARGUMENT, "another context");
    CUDA_OK(cudaDeviceSynchronize());
    bie_context_destroy(other);
    bie_cuda_graph_destroy(graph);
    // refusals: no recording to end, no graph; a call refused while recording returns its error,
    // the recording is dropped, and the context's calls go to the caller's stream again
    graph = (bie_cuda_graph_t *)(uintptr_t)0x10;
    TEST_EXPECT_STATUS(cu, bie_cuda_record_end(cu, &graph), BIE_STATUS_INVALID_ARGUMENT, "without record_begin");
    CHECK(graph == NULL, "record_end: *out set on failure");
    TEST_EXPECT_STATUS(cu, bie_cuda_replay(cu, NULL), BIE_STATUS_INVALID_ARGUMENT, "no graph");
    CHECK_OK(cu, bie_cuda_record_begin(cu));
    struct bie_batchnorm_args bad = a;
    bad.gamma = &dx;
    TEST_EXPECT_STATUS(cu, bie_batchnorm_forward(cu, &d, &bad), BIE_STATUS_INVALID_ARGUMENT, "gamma");
    CHECK_OK(cu, bie_cuda_record_end(cu, NULL));
    CHECK_OK(cu, bie_batchnorm_forward(cu, &d, &a)); // (the context's stream is the caller's again)
    CUDA_OK(cudaDeviceSynchronize());
    struct bie_tensor * all[] = {&dx, &dy, &dg, &db, &drm, &drv, &dsm, &dsi, &dnb};
    for (int k = 0; k < 9; k++) cuda_tensor_free(all[k]);
    struct bie_tensor * host[] = {&x,    &y,    &y2,     &g,      &b,      &rm,      &rv,      &f[0],   &f[1],
                                  &f[2], &f[3], &got[0], &got[1], &got[2], &want[0], &want[1], &want[2]};
    for (int k = 0; k < 17; k++) test_tensor_free(host[k]);
}

static void check_refusals(bie_context_t * cu) {
    const int64_t shape[4] = {2, 16, 3, 5}, C = 16;
    struct bie_tensor x = make4(BIE_DTYPE_F16, shape, 1), y = make4(BIE_DTYPE_F16, shape, 1);
    struct bie_tensor v = test_tensor(BIE_DTYPE_F32, 1, &C, NULL), v16 = test_tensor(BIE_DTYPE_F16, 1, &C, NULL);
    struct bie_tensor dx = cuda_mirror(&x), dy = cuda_mirror(&y), dv[6], dv16 = cuda_mirror(&v16);
    for (int k = 0; k < 6; k++) dv[k] = cuda_mirror(&v);
    const struct bie_batchnorm_desc d = {0.1f, 1e-5f, 1};
    struct bie_batchnorm_args ok = {&dx, &dv[0], &dv[1], &dv[2], &dv[3], &dv[4], &dv[5], &dy, NULL, NULL};
    CHECK_OK(cu, bie_batchnorm_forward(cu, &d, &ok));
    struct bie_tensor five = dx; // 5-D
    five.ndim = 5;
    five.shape[4] = 1;
    five.stride[4] = 1;
    struct bie_batchnorm_args a = ok;
    a.x = &five;
    TEST_EXPECT_STATUS(cu, bie_batchnorm_forward(cu, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "x: must be");
    a = ok;
    a.saved_mean = &dv16;
    TEST_EXPECT_STATUS(cu, bie_batchnorm_forward(cu, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "saved_mean: dtype");
    a = ok;
    a.residual = &x; // on the host
    TEST_EXPECT_STATUS(cu, bie_batchnorm_forward(cu, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "residual");
    a = ok;
    a.y = &dx; // y overlaps x
    TEST_EXPECT_STATUS(cu, bie_batchnorm_forward(cu, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "y: overlaps");
    a = ok;
    a.num_batches = &dv[0]; // f32 [C]
    TEST_EXPECT_STATUS(cu, bie_batchnorm_forward(cu, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "num_batches");
    int64_t count = 0;
    struct bie_tensor hnb = test_view(&count, BIE_DTYPE_I64, 1, (const int64_t[]){1});
    a.num_batches = &hnb; // on the host
    TEST_EXPECT_STATUS(cu, bie_batchnorm_forward(cu, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "num_batches");
    a = ok;
    a.saved_mean = NULL;
    TEST_EXPECT_STATUS(cu, bie_batchnorm_forward(cu, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "saved_mean: is NULL");
    const struct bie_batchnorm_desc bad_eps = {0.1f, 0.0f, 1};
    TEST_EXPECT_STATUS(cu, bie_batchnorm_forward(cu, &bad_eps, &ok), BIE_STATUS_INVALID_ARGUMENT, "eps");
    struct bie_tensor short_v = dv[0];
    short_v.shape[0] = C - 1;
    a = ok;
    a.gamma = &short_v;
    TEST_EXPECT_STATUS(cu, bie_batchnorm_forward(cu, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "gamma");
    TEST_EXPECT_STATUS(cu,
                       bie_batchnorm_backward(cu, &(struct bie_batchnorm_backward_args){&dx, &dv[0], &dv[4], &dv[5],
                                                                                        NULL, &dy, &dv[1], &dv[2]}),
                       BIE_STATUS_INVALID_ARGUMENT, "grad_y: is NULL");
    TEST_EXPECT_STATUS(cu,
                       bie_batchnorm_backward(cu, &(struct bie_batchnorm_backward_args){&dx, &dv[0], &dv[4], &dv[5],
                                                                                        &dy, &dy, &dv[1], &dv[2]}),
                       BIE_STATUS_INVALID_ARGUMENT, "grad_x: overlaps");
    test_tensor_free(&x);
    test_tensor_free(&y);
    test_tensor_free(&v);
    test_tensor_free(&v16);
    cuda_tensor_free(&dx);
    cuda_tensor_free(&dy);
    cuda_tensor_free(&dv16);
    for (int k = 0; k < 6; k++) cuda_tensor_free(&dv[k]);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    cuda_test_require_gpu("test-cuda-batchnorm");
    bie_context_t *ref, *cu;
    cuda_test_contexts(&ref, &cu);
    const int iters = cuda_test_quick() ? 60 : 300;
    for (int i = 0; i < iters; i++) {
        struct bcase c;
        random_case(&c, i);
        check_case(ref, cu, &c);
    }
    check_refusals(cu);
    check_replay(cu);
    bie_context_destroy(ref);
    bie_context_destroy(cu);
    return test_finish("test-cuda-batchnorm");
}
