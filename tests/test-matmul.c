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
#include "op-cases.h"

// The reference matmul of batch b is the reference linear layer with input x[b] and weight y[b]:
// the same I32 accumulations, and the same grad_x.
static void check_against_layer(bie_context_t * ref) {
    for (int iter = 0; iter < 20; iter++) {
        struct mcase c;
        matmul_random_case(&c);
        c.lead = 1;
        c.ls[0] = c.B = test_rand_int(1, 3);
        c.od = BIE_DTYPE_I32;
        struct bie_tensor x = operand(&c, c.xd, c.M, c.K, 0), y = operand(&c, c.yd, c.N, c.K, 0);
        matmul_fill(&c, &x, c.xc);
        matmul_fill(&c, &y, c.yc);
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
            const struct bie_forward_args fa = {.x = &xb, .weight = &yb, .scale_a = &xc, .scale_w = &yc, .y = &lo};
            CHECK_OK(ref, bie_linear_forward(ref, &ld, &fa));
            CHECK(mismatches(&lo, &ob) == 0, "batch %lld: the matmul's acc differs from the linear layer's: %s",
                  (long long)b, c.what);
            const struct bie_backward_args la = {&xb,  NULL, &yb,  &xc,  &yc,  &gb,  &lgx,
                                                 NULL, NULL, NULL, NULL, NULL, NULL, 0.0f};
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
    xs.shape[0] = 2;
    xs.shape[1] = 2;
    xs.shape[2] = 3;
    xs.shape[3] = 2;
    xs.stride[0] = 5;
    xs.stride[1] = 13;
    xs.stride[2] = 2;
    xs.stride[3] = 1;
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
    enum bie_cpu_isa levels[CPU_TEST_LEVELS];
    const int n = cpu_test_levels(levels);
    bie_context_t * cpus[CPU_TEST_LEVELS];
    for (int i = 0; i < n; i++) cpus[i] = cpu_test_ctx(BIE_BACKEND_CPU, levels[i], (int)test_rand_int(1, 3));
    bie_context_t * ref = cpu_test_ctx(BIE_BACKEND_REF, BIE_CPU_ISA_BEST, 1);
    check_by_hand(ref);
    check_by_hand(cpus[n - 1]);
    check_against_layer(ref);
    check_errors(ref);
    const char * names[CPU_TEST_LEVELS];
    for (int i = 0; i < n; i++) names[i] = bie_cpu_isa_name(levels[i]);
    const int iters = cpu_test_quick() ? 25 : 120;
    for (int i = 0; i < 2 * iters; i++) {
        struct mcase c;
        matmul_random_case(&c);
        matmul_check_case(&c, ref, cpus, names, n, i >= iters, &op_host);
    }
    for (int i = 0; i < n; i++) bie_context_destroy(cpus[i]);
    bie_context_destroy(ref);
    return test_finish("test-matmul");
}
