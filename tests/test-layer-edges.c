// SPDX-License-Identifier: Apache-2.0
// test-layer-edges.c: layer calls at the edges of the contract, each against the reference
// backend or against the documented refusal:
// - a [1, K] grad_weight whose stride[0] is smaller than K (legal: a size-1 dimension's stride is
//   never used; PyTorch's torch.empty(K, 1).T has it) at every ISA level and quantization;
// - f32 overflow inside the CPU backward (grad_y near FLT_MAX, scale_a near FLT_MAX): grad_scale_a,
//   grad_bias_a and grad_weight are the reference's numbers (-inf, 0, 3e38), never NaN;
// - output views that overlap themselves, each other or an input are refused;
// - scale_a * scale_w must be finite: 3e38 * 3e38 is refused instead of giving 0 * inf = NaN;
// - x_clamp: a call with it equals the call on a copy of x clamped by hand (NaN, +-t and values
//   past t included), the backward's grad_x then gated by 1{|x| < t}, at every quantization and
//   backend; bad bounds, a B1 x and a plan executed with another bound are refused;
// - grad_x_add: the backward with it equals the backward without it and an f32 add rounded to
//   grad_x's dtype (f16 here), at every quantization and backend; without grad_x, or overlapping
//   it, it is refused.
#include "test-cpu-common.h"

static const enum bie_quant k_quants[3] = {BIE_QUANT_BINARY, BIE_QUANT_INT4, BIE_QUANT_INT8};

// Linear backward with a [1, K] grad_weight view of stride {1, 1}: every ISA level equals the
// reference to the rounding of sgemm (K terms of one product each: exact here, one term per sum).
static void test_row_grad_weight(bie_context_t * ref, bie_context_t ** cpu, int nlev) {
    static const int64_t ks[] = {1, 5, 64, 333};
    for (int qi = 0; qi < 3; qi++)
        for (int ki = 0; ki < 4; ki++) {
            const int64_t K = ks[ki], M = 3;
            const struct bie_linear_desc d = {k_quants[qi], K, 1};
            struct bie_tensor x = cpu_test_view2(BIE_DTYPE_F32, M, K, false);
            struct bie_tensor w = cpu_test_view2(BIE_DTYPE_F32, 1, K, false);
            struct bie_tensor gy = cpu_test_view2(BIE_DTYPE_F32, M, 1, false);
            test_fill_uniform(&x, -1, 1);
            test_fill_uniform(&w, -1, 1);
            test_fill_uniform(&gy, -1, 1);
            struct bie_tensor sa = test_scalar(k_quants[qi] == BIE_QUANT_BINARY ? 1.0f : 0.1f), sw = test_scalar(0.05f);
            const int64_t gshape[2] = {1, K}, gstride[2] = {1, 1};
            struct bie_tensor gw_ref = test_tensor(BIE_DTYPE_F32, 2, gshape, gstride);
            struct bie_backward_args a = {
                .x = &x, .weight = &w, .scale_a = &sa, .scale_w = &sw, .grad_y = &gy, .grad_weight = &gw_ref};
            CHECK_OK(ref, bie_linear_backward(ref, &d, &a));
            for (int l = 0; l < nlev; l++) {
                struct bie_tensor gw = test_tensor(BIE_DTYPE_F32, 2, gshape, gstride);
                for (int64_t k = 0; k < K; k++) ((float *)gw.data)[k] = NAN; // must be overwritten
                a.grad_weight = &gw;
                CHECK_OK(cpu[l], bie_linear_backward(cpu[l], &d, &a));
                int bad = 0;
                for (int64_t k = 0; k < K; k++) {
                    const float c = ((float *)gw.data)[k], r = ((float *)gw_ref.data)[k];
                    if (!(fabsf(c - r) <= 1e-6f * (1.0f + fabsf(r)))) bad++;
                }
                CHECK(bad == 0, "q%d K=%lld isa %s: %d of %lld grad_weight values differ from the reference",
                      (int)k_quants[qi], (long long)K, bie_cpu_isa_name(bie_context_cpu_isa(cpu[l])), bad,
                      (long long)K);
                test_tensor_free(&gw);
            }
            struct bie_tensor * ts[] = {&x, &w, &gy, &sa, &sw, &gw_ref};
            for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) test_tensor_free(ts[i]);
        }
}

// grad_y near FLT_MAX makes the f32 GEMM of grad_x overflow. The reference sums in double:
//   binary, x = [0.5, -0.5, -0.5], w = +1, scale_w = 2, grad_y = [3e38, 3e38]:
//   gx = 1.2e39 each (inf in f32); grad_scale_a = 1.2e39 * (1 - 1 - 1) = -1.2e39 -> -inf.
//   8-bit, x' / scale_a integral (d = rne(r) - r = 0): gx * 0 adds 0, not inf * 0.
static void test_overflow_grad_scale(bie_context_t * ref, bie_context_t ** cpu, int nlev) {
    for (int qi = 0; qi < 3; qi++) {
        const int64_t K = 3, N = 2;
        const struct bie_linear_desc d = {k_quants[qi], K, N};
        const int64_t xs[2] = {1, K}, ws[2] = {N, K}, ys[2] = {1, N};
        struct bie_tensor x = test_tensor(BIE_DTYPE_F32, 2, xs, NULL), w = test_tensor(BIE_DTYPE_F32, 2, ws, NULL);
        struct bie_tensor gy = test_tensor(BIE_DTYPE_F32, 2, ys, NULL);
        const bool bin = k_quants[qi] == BIE_QUANT_BINARY;
        const float xv[3] = {0.5f, -0.5f, -0.5f}, xq[3] = {1.0f, -2.0f, 3.0f};
        for (int64_t k = 0; k < K; k++) ((float *)x.data)[k] = bin ? xv[k] : xq[k];
        for (int64_t i = 0; i < N * K; i++) ((float *)w.data)[i] = bin ? 1.0f : 7.0f;
        for (int64_t i = 0; i < N; i++) ((float *)gy.data)[i] = 3e38f;
        struct bie_tensor sa = test_scalar(1.0f), sw = test_scalar(bin ? 2.0f : 1.0f);
        struct bie_tensor gs_ref = test_scalar(0), gb_ref = test_tensor(BIE_DTYPE_F32, 1, &K, NULL);
        struct bie_backward_args a = {.x = &x,
                                      .weight = &w,
                                      .scale_a = &sa,
                                      .scale_w = &sw,
                                      .grad_y = &gy,
                                      .grad_scale_a = &gs_ref,
                                      .grad_bias_a = &gb_ref};
        CHECK_OK(ref, bie_linear_backward(ref, &d, &a));
        const float rs = ((float *)gs_ref.data)[0];
        CHECK(!isnan(rs), "q%d: the reference's grad_scale_a is NaN", (int)k_quants[qi]);
        for (int l = 0; l < nlev; l++) {
            struct bie_tensor gs = test_scalar(0), gb = test_tensor(BIE_DTYPE_F32, 1, &K, NULL);
            a.grad_scale_a = &gs;
            a.grad_bias_a = &gb;
            CHECK_OK(cpu[l], bie_linear_backward(cpu[l], &d, &a));
            const float cs = ((float *)gs.data)[0];
            CHECK(cs == rs || (isnan(cs) && isnan(rs)), "q%d isa %s: grad_scale_a %g, the reference %g",
                  (int)k_quants[qi], bie_cpu_isa_name(bie_context_cpu_isa(cpu[l])), (double)cs, (double)rs);
            CHECK(memcmp(gb.data, gb_ref.data, sizeof(float) * (size_t)K) == 0,
                  "q%d isa %s: grad_bias_a differs from the reference", (int)k_quants[qi],
                  bie_cpu_isa_name(bie_context_cpu_isa(cpu[l])));
            test_tensor_free(&gs);
            test_tensor_free(&gb);
        }
        struct bie_tensor * ts[] = {&x, &w, &gy, &sa, &sw, &gs_ref, &gb_ref};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) test_tensor_free(ts[i]);
    }
}

// grad_W = scale_a * sum_m g[m, o] * a[m, k] with scale_a = 3e38 and g = [3, 3, 3, 3, -3, -3, -3,
// -3, 1]: the exact sum is 3e38, finite; a backend that scales partial sums before adding them (the
// float-by-sign GEMM scales sums of 4 rows: 12 * 3e38 = inf, then inf - inf) must not give NaN.
// Every backend must give the reference's value.
static void test_overflow_grad_weight(bie_context_t * ref, bie_context_t ** cpu, int nlev) {
    const int64_t M = 9, K = 5, N = 1;
    const struct bie_linear_desc d = {BIE_QUANT_BINARY, K, N};
    const int64_t xs[2] = {M, K}, ws[2] = {N, K}, ys[2] = {M, N};
    struct bie_tensor x = test_tensor(BIE_DTYPE_F32, 2, xs, NULL), w = test_tensor(BIE_DTYPE_F32, 2, ws, NULL);
    struct bie_tensor gy = test_tensor(BIE_DTYPE_F32, 2, ys, NULL);
    for (int64_t i = 0; i < M * K; i++) ((float *)x.data)[i] = 0.5f; // every code +1
    for (int64_t i = 0; i < N * K; i++) ((float *)w.data)[i] = 1.0f;
    const float g[9] = {3.0f, 3.0f, 3.0f, 3.0f, -3.0f, -3.0f, -3.0f, -3.0f, 1.0f};
    memcpy(gy.data, g, sizeof g);
    struct bie_tensor sa = test_scalar(3e38f), sw = test_scalar(1.0f);
    struct bie_tensor gw_ref = test_tensor(BIE_DTYPE_F32, 2, ws, NULL);
    struct bie_backward_args a = {
        .x = &x, .weight = &w, .scale_a = &sa, .scale_w = &sw, .grad_y = &gy, .grad_weight = &gw_ref};
    CHECK_OK(ref, bie_linear_backward(ref, &d, &a));
    CHECK(((float *)gw_ref.data)[0] == 3e38f, "the reference's grad_weight %g", (double)((float *)gw_ref.data)[0]);
    for (int l = 0; l < nlev; l++) {
        struct bie_tensor gw = test_tensor(BIE_DTYPE_F32, 2, ws, NULL);
        a.grad_weight = &gw;
        CHECK_OK(cpu[l], bie_linear_backward(cpu[l], &d, &a));
        CHECK(memcmp(gw.data, gw_ref.data, sizeof(float) * (size_t)K) == 0,
              "isa %s: grad_weight[0] %g, the reference %g", bie_cpu_isa_name(bie_context_cpu_isa(cpu[l])),
              (double)((float *)gw.data)[0], (double)((float *)gw_ref.data)[0]);
        test_tensor_free(&gw);
    }
    struct bie_tensor * ts[] = {&x, &w, &gy, &sa, &sw, &gw_ref};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) test_tensor_free(ts[i]);
}

// Outputs that share memory with themselves, each other or an input are INVALID_ARGUMENT.
static void test_overlapping_outputs(bie_context_t * ctx) {
    const int64_t M = 4, K = 8, N = 3;
    const struct bie_linear_desc d = {BIE_QUANT_BINARY, K, N};
    // Every buffer holds M*K floats, so that a wrongly accepted call stays inside it.
    struct bie_tensor x = cpu_test_view2(BIE_DTYPE_F32, M, K, false), w = cpu_test_view2(BIE_DTYPE_F32, M, K, false);
    struct bie_tensor y = cpu_test_view2(BIE_DTYPE_F32, M, K, false), gy = cpu_test_view2(BIE_DTYPE_F32, M, K, false);
    w.shape[0] = N;
    y.shape[1] = gy.shape[1] = N;
    y.stride[0] = gy.stride[0] = N;
    test_fill_uniform(&x, -1, 1);
    test_fill_uniform(&w, -1, 1);
    test_fill_uniform(&gy, -1, 1);
    struct bie_tensor sa = test_scalar(1.0f), sw = test_scalar(0.5f);
    // y written over x
    struct bie_tensor yx = y;
    yx.data = x.data;
    struct bie_forward_args fa = {.x = &x, .weight = &w, .scale_a = &sa, .scale_w = &sw, .y = &yx};
    TEST_EXPECT_STATUS(ctx, bie_linear_forward(ctx, &d, &fa), BIE_STATUS_INVALID_ARGUMENT, "overlap");
    // y whose rows overlap each other (stride[0] = 1 < N)
    struct bie_tensor yo = y;
    yo.stride[0] = 1;
    fa.y = &yo;
    TEST_EXPECT_STATUS(ctx, bie_linear_forward(ctx, &d, &fa), BIE_STATUS_INVALID_ARGUMENT, "overlap");
    fa.y = &y;
    CHECK_OK(ctx, bie_linear_forward(ctx, &d, &fa));
    // grad_weight with overlapping rows
    struct bie_tensor gw = cpu_test_view2(BIE_DTYPE_F32, M, K, false), gx = cpu_test_view2(BIE_DTYPE_F32, M, K, false);
    gw.shape[0] = N;
    struct bie_tensor gwo = gw;
    gwo.stride[0] = 2;
    struct bie_backward_args ba = {
        .x = &x, .weight = &w, .scale_a = &sa, .scale_w = &sw, .grad_y = &gy, .grad_x = &gx, .grad_weight = &gwo};
    TEST_EXPECT_STATUS(ctx, bie_linear_backward(ctx, &d, &ba), BIE_STATUS_INVALID_ARGUMENT, "grad_weight");
    // grad_x sharing its buffer with grad_weight
    struct bie_tensor gxw = gx;
    gxw.data = gw.data;
    ba.grad_weight = &gw;
    ba.grad_x = &gxw;
    TEST_EXPECT_STATUS(ctx, bie_linear_backward(ctx, &d, &ba), BIE_STATUS_INVALID_ARGUMENT, "overlap");
    // grad_x written over grad_y (an input)
    struct bie_tensor gxy = gy;
    gxy.shape[1] = K;
    gxy.stride[0] = K;
    gxy.data = gy.data;
    ba.grad_x = &gxy;
    TEST_EXPECT_STATUS(ctx, bie_linear_backward(ctx, &d, &ba), BIE_STATUS_INVALID_ARGUMENT, "overlap");
    ba.grad_x = &gx;
    CHECK_OK(ctx, bie_linear_backward(ctx, &d, &ba));
    // bie_pack's dst over its src
    struct bie_tensor bits = cpu_test_view2(BIE_DTYPE_B1, N, K, false), bo = bits;
    bo.data = w.data;
    TEST_EXPECT_STATUS(ctx, bie_pack(ctx, &w, NULL, &bo), BIE_STATUS_INVALID_ARGUMENT, "overlap");
    CHECK_OK(ctx, bie_pack(ctx, &w, NULL, &bits));
    // broadcast (stride 0) outputs are refused as before; broadcast inputs stay legal
    struct bie_tensor * ts[] = {&x, &w, &y, &gy, &sa, &sw, &gw, &gx, &bits};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) test_tensor_free(ts[i]);
}

// y = (float)acc * (scale_a * scale_w): a product that overflows f32 is refused (acc = 0 would give
// 0 * inf = NaN, every other acc +-inf).
static void test_scale_product(bie_context_t * ctx) {
    const int64_t K = 2, N = 1;
    const struct bie_linear_desc d = {BIE_QUANT_BINARY, K, N};
    struct bie_tensor x = cpu_test_view2(BIE_DTYPE_F32, 1, K, false), w = cpu_test_view2(BIE_DTYPE_F32, N, K, false);
    struct bie_tensor y = cpu_test_view2(BIE_DTYPE_F32, 1, N, false);
    ((float *)x.data)[0] = 1.0f;
    ((float *)x.data)[1] = -1.0f;
    ((float *)w.data)[0] = ((float *)w.data)[1] = 1.0f; // acc = 1 - 1 = 0
    struct bie_tensor sa = test_scalar(3e38f), sw = test_scalar(3e38f);
    struct bie_forward_args a = {.x = &x, .weight = &w, .scale_a = &sa, .scale_w = &sw, .y = &y};
    ((float *)y.data)[0] = 42.0f;
    TEST_EXPECT_STATUS(ctx, bie_linear_forward(ctx, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "scale_a * scale_w");
    ((float *)sw.data)[0] = 1.0f;
    CHECK_OK(ctx, bie_linear_forward(ctx, &d, &a));
    CHECK(((float *)y.data)[0] == 0.0f, "acc 0 with a finite product gives %g", (double)((float *)y.data)[0]);
    struct bie_tensor * ts[] = {&x, &w, &y, &sa, &sw};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) test_tensor_free(ts[i]);
}

static enum bie_status run_forward(bie_context_t * ctx, const bie_plan_t * p, const void * a) {
    return bie_plan_forward(ctx, p, (const struct bie_forward_args *)a);
}
static enum bie_status run_backward(bie_context_t * ctx, const bie_plan_t * p, const void * a) {
    return bie_plan_backward(ctx, p, (const struct bie_backward_args *)a);
}
// A plan made with the x_clamp *clamp of args: its description names the clamp, an execution with
// another bound is refused and one with its own runs; then the plan is destroyed.
static void check_clamp_plan(bie_context_t * ctx, bie_plan_t * plan,
                             enum bie_status (*run)(bie_context_t *, const bie_plan_t *, const void *),
                             const void * args, float * clamp, float other) {
    CHECK(plan && strstr(bie_plan_describe(plan), "x clamped to +-"), "plan \"%s\" names the clamp",
          plan ? bie_plan_describe(plan) : "");
    const float t = *clamp;
    *clamp = other;
    TEST_EXPECT_STATUS(ctx, run(ctx, plan, args), BIE_STATUS_INVALID_ARGUMENT, "x_clamp");
    *clamp = t;
    CHECK_OK(ctx, run(ctx, plan, args));
    bie_plan_destroy(plan);
}

// The backward of d with x_clamp = t on x against the backward on h (x clamped by hand) whose grad_x
// is zeroed where !(|x| < t), to the bit; bad bounds and a plan run with another bound refused.
static void check_clamped_backward(bie_context_t * ctx, const struct bie_conv2d_desc * d, struct bie_tensor * x,
                                   struct bie_tensor * h, struct bie_tensor * w, struct bie_tensor * bias,
                                   struct bie_tensor * sa, struct bie_tensor * sw, float t) {
    static const int nchw[4] = {0, 1, 2, 3};
    const int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3], O = w->shape[0];
    const int64_t ys[4] = {N, O, H, W};
    struct bie_tensor gy = cpu_test_view4(BIE_DTYPE_F32, ys, nchw), g[2][4];
    test_fill_uniform(&gy, -1, 1);
    for (int k = 0; k < 2; k++) {
        g[k][0] = cpu_test_view4(BIE_DTYPE_F32, x->shape, nchw);
        g[k][1] = cpu_test_view4(BIE_DTYPE_F32, w->shape, nchw);
        g[k][2] = test_scalar(0.0f);
        g[k][3] = test_tensor(BIE_DTYPE_F32, 1, &C, NULL);
    }
    struct bie_backward_args a = {.x = x,
                                  .bias_a = bias,
                                  .weight = w,
                                  .scale_a = sa,
                                  .scale_w = sw,
                                  .grad_y = &gy,
                                  .grad_x = &g[0][0],
                                  .grad_weight = &g[0][1],
                                  .grad_scale_a = &g[0][2],
                                  .grad_bias_a = &g[0][3],
                                  .x_clamp = t};
    CHECK_OK(ctx, bie_conv2d_backward(ctx, d, &a));
    struct bie_backward_args b = a;
    b.x = h;
    b.x_clamp = 0.0f;
    b.grad_x = &g[1][0];
    b.grad_weight = &g[1][1];
    b.grad_scale_a = &g[1][2];
    b.grad_bias_a = &g[1][3];
    CHECK_OK(ctx, bie_conv2d_backward(ctx, d, &b));
    const float * xv = (const float *)x->data;
    for (int64_t i = 0; i < N * C * H * W; i++)
        if (!(fabsf(xv[i]) < t)) ((float *)g[1][0].data)[i] = 0.0f;
    static const char * const names[4] = {"grad_x", "grad_weight", "grad_scale_a", "grad_bias_a"};
    for (int k = 0; k < 4; k++)
        CHECK(memcmp(g[0][k].data, g[1][k].data, (size_t)bie_tensor_numel(&g[0][k]) * sizeof(float)) == 0,
              "isa %s q%d: %s with x_clamp %g differs from that of the clamped copy, gated",
              bie_cpu_isa_name(bie_context_cpu_isa(ctx)), (int)d->quant, names[k], (double)t);
    static const float bad[3] = {-1.0f, INFINITY, NAN};
    for (int i = 0; i < 3; i++) {
        a.x_clamp = bad[i];
        TEST_EXPECT_STATUS(ctx, bie_conv2d_backward(ctx, d, &a), BIE_STATUS_INVALID_ARGUMENT, "x_clamp");
    }
    a.x_clamp = t;
    bie_plan_t * plan = NULL;
    CHECK_OK(ctx, bie_plan_conv2d_backward(ctx, d, &a, &plan));
    check_clamp_plan(ctx, plan, run_backward, &a, &a.x_clamp, 0.0f);
    test_tensor_free(&gy);
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 4; j++) test_tensor_free(&g[k][j]);
}

// y of a 4-bit, 8-bit or binary conv (3x3, padding 1, bias_a) with x_clamp = t against the same
// call without it on h = min(max(x, -t), t) (NaN kept), on ctx, and the backward's gradients
// against the backward on h with grad_x zeroed where !(|x| < t); then the refusals.
static void test_x_clamp(bie_context_t * ctx) {
    const float t = 0.75f;
    for (int qi = 0; qi < 3; qi++) {
        const int64_t N = 2, C = 5, H = 4, W = 3, O = 3;
        const struct bie_conv2d_desc d = {k_quants[qi], C, O, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, BIE_PAD_ZERO};
        static const int nchw[4] = {0, 1, 2, 3};
        const int64_t xs[4] = {N, C, H, W}, ws[4] = {O, C, 3, 3}, ys[4] = {N, O, H, W};
        struct bie_tensor x = cpu_test_view4(BIE_DTYPE_F32, xs, nchw), h = cpu_test_view4(BIE_DTYPE_F32, xs, nchw);
        struct bie_tensor w = cpu_test_view4(BIE_DTYPE_F32, ws, nchw);
        struct bie_tensor y0 = cpu_test_view4(BIE_DTYPE_F32, ys, nchw), y1 = cpu_test_view4(BIE_DTYPE_F32, ys, nchw);
        struct bie_tensor bias = test_tensor(BIE_DTYPE_F32, 1, &C, NULL);
        test_fill_uniform(&x, -2, 2);
        test_fill_uniform(&w, -1, 1);
        test_fill_uniform(&bias, -0.5f, 0.5f);
        float * xv = (float *)x.data;
        xv[0] = NAN;
        xv[1] = t;
        xv[2] = -t;
        xv[3] = 5.0f;
        xv[4] = -5.0f;
        for (int64_t i = 0; i < N * C * H * W; i++)
            ((float *)h.data)[i] = isnan(xv[i]) ? xv[i] : fminf(fmaxf(xv[i], -t), t);
        struct bie_tensor sa = test_scalar(0.1f), sw = test_scalar(0.05f);
        struct bie_forward_args a = {.x = &x, .bias_a = &bias, .weight = &w, .scale_a = &sa, .scale_w = &sw, .y = &y0};
        a.x_clamp = t;
        CHECK_OK(ctx, bie_conv2d_forward(ctx, &d, &a));
        struct bie_forward_args b = a;
        b.x = &h;
        b.y = &y1;
        b.x_clamp = 0.0f;
        CHECK_OK(ctx, bie_conv2d_forward(ctx, &d, &b));
        CHECK(memcmp(y0.data, y1.data, (size_t)(N * O * H * W) * sizeof(float)) == 0,
              "isa %s q%d: y with x_clamp %g differs from y of the clamped copy",
              bie_cpu_isa_name(bie_context_cpu_isa(ctx)), (int)k_quants[qi], (double)t);
        static const float bad[4] = {-1.0f, INFINITY, NAN, -0.0f};
        for (int i = 0; i < 3; i++) {
            a.x_clamp = bad[i];
            TEST_EXPECT_STATUS(ctx, bie_conv2d_forward(ctx, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "x_clamp");
        }
        check_clamped_backward(ctx, &d, &x, &h, &w, &bias, &sa, &sw, t);
        a.x_clamp = bad[3]; // -0 is 0: no clamp
        CHECK_OK(ctx, bie_conv2d_forward(ctx, &d, &a));
        a.x_clamp = t;
        bie_plan_t * plan = NULL;
        CHECK_OK(ctx, bie_plan_conv2d_forward(ctx, &d, &a, &plan));
        check_clamp_plan(ctx, plan, run_forward, &a, &a.x_clamp, 0.5f);
        struct bie_tensor * all[] = {&x, &h, &w, &y0, &y1, &bias, &sa, &sw};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) test_tensor_free(all[i]);
    }
    // a B1 x is binarized already
    const int64_t K = 16, M = 2, N = 3;
    const struct bie_linear_desc d = {BIE_QUANT_BINARY, K, N};
    struct bie_tensor xb = cpu_test_view2(BIE_DTYPE_B1, M, K, false), w = cpu_test_view2(BIE_DTYPE_F32, N, K, false);
    struct bie_tensor y = cpu_test_view2(BIE_DTYPE_F32, M, N, false);
    test_fill_uniform(&xb, -1, 1);
    test_fill_uniform(&w, -1, 1);
    struct bie_tensor sa = test_scalar(1.0f), sw = test_scalar(1.0f);
    struct bie_forward_args a = {.x = &xb, .weight = &w, .scale_a = &sa, .scale_w = &sw, .y = &y, .x_clamp = 1.0f};
    TEST_EXPECT_STATUS(ctx, bie_linear_forward(ctx, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "x_clamp");
    struct bie_tensor * all[] = {&xb, &w, &y, &sa, &sw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) test_tensor_free(all[i]);
}

// grad_x (f16) of a 4-bit, 8-bit or binary conv (3x3, padding 1, bias_a, channels-last x) with
// grad_x_add against the same call without it, then round(f32(grad_x) + f32(grad_x_add)) by hand;
// then the refusals.
static void test_grad_x_add(bie_context_t * ctx) {
    for (int qi = 0; qi < 3; qi++) {
        const int64_t N = 2, C = 6, H = 4, W = 5, O = 3;
        const struct bie_conv2d_desc d = {k_quants[qi], C, O, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, BIE_PAD_ZERO};
        static const int nchw[4] = {0, 1, 2, 3}, nhwc[4] = {0, 2, 3, 1};
        const int64_t xs[4] = {N, C, H, W}, ws[4] = {O, C, 3, 3}, ys[4] = {N, O, H, W};
        struct bie_tensor x = cpu_test_view4(BIE_DTYPE_F32, xs, nhwc), w = cpu_test_view4(BIE_DTYPE_F32, ws, nchw);
        struct bie_tensor gy = cpu_test_view4(BIE_DTYPE_F32, ys, nchw), add = cpu_test_view4(BIE_DTYPE_F16, xs, nchw);
        struct bie_tensor g0 = cpu_test_view4(BIE_DTYPE_F16, xs, nhwc), g1 = cpu_test_view4(BIE_DTYPE_F16, xs, nhwc);
        struct bie_tensor bias = test_tensor(BIE_DTYPE_F32, 1, &C, NULL);
        test_fill_uniform(&x, -2, 2);
        test_fill_uniform(&w, -1, 1);
        test_fill_uniform(&gy, -1, 1);
        test_fill_uniform(&add, -1, 1);
        test_fill_uniform(&bias, -0.5f, 0.5f);
        struct bie_tensor sa = test_scalar(k_quants[qi] == BIE_QUANT_BINARY ? 1.0f : 0.1f), sw = test_scalar(0.05f);
        struct bie_backward_args a = {.x = &x,
                                      .bias_a = &bias,
                                      .weight = &w,
                                      .scale_a = &sa,
                                      .scale_w = &sw,
                                      .grad_y = &gy,
                                      .grad_x = &g0,
                                      .grad_x_add = &add};
        CHECK_OK(ctx, bie_conv2d_backward(ctx, &d, &a));
        struct bie_backward_args b = a;
        b.grad_x = &g1;
        b.grad_x_add = NULL;
        CHECK_OK(ctx, bie_conv2d_backward(ctx, &d, &b));
        int bad = 0;
        int64_t idx[BIE_MAX_DIMS] = {0};
        do {
            const int64_t o = bie_offset(&g1, idx);
            bie_store(&g1, o, (double)((float)bie_load(&g1, o) + (float)bie_load(&add, bie_offset(&add, idx))));
            bad += bie_load(&g0, bie_offset(&g0, idx)) != bie_load(&g1, o);
        } while (bie_next_index(&g1, idx));
        CHECK(bad == 0, "isa %s q%d: grad_x with grad_x_add differs from grad_x + grad_x_add at %d elements",
              bie_cpu_isa_name(bie_context_cpu_isa(ctx)), (int)k_quants[qi], bad);
        b.grad_x = NULL;
        b.grad_x_add = &add;
        TEST_EXPECT_STATUS(ctx, bie_conv2d_backward(ctx, &d, &b), BIE_STATUS_INVALID_ARGUMENT, "grad_x_add");
        a.grad_x_add = &g0; // (grad_x itself)
        TEST_EXPECT_STATUS(ctx, bie_conv2d_backward(ctx, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "grad_x");
        struct bie_tensor * all[] = {&x, &w, &gy, &add, &g0, &g1, &bias, &sa, &sw};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) test_tensor_free(all[i]);
    }
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    bie_context_t *ref, *cpu[CPU_TEST_LEVELS];
    const int nlev = cpu_test_contexts(&ref, cpu, 2);
    test_row_grad_weight(ref, cpu, nlev);
    test_overflow_grad_scale(ref, cpu, nlev);
    test_overflow_grad_weight(ref, cpu, nlev);
    for (int l = 0; l < nlev; l++) test_overlapping_outputs(cpu[l]);
    test_overlapping_outputs(ref);
    test_scale_product(cpu[nlev - 1]);
    test_scale_product(ref);
    for (int l = 0; l < nlev; l++) test_x_clamp(cpu[l]);
    test_x_clamp(ref);
    for (int l = 0; l < nlev; l++) test_grad_x_add(cpu[l]);
    test_grad_x_add(ref);
    bie_context_destroy(ref);
    for (int l = 0; l < nlev; l++) bie_context_destroy(cpu[l]);
    return test_finish("test-layer-edges");
}
