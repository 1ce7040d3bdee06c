// SPDX-License-Identifier: Apache-2.0
// test-nn-args.c: the tensor views of the float building blocks and optimizers (bie-train.h) are
// checked before anything runs: NULL arguments, wrong dtypes, shapes that disagree, strided views,
// CUDA tensors and outputs overlapping inputs are INVALID_ARGUMENT with a message naming the
// argument, and the outputs are left untouched. The model's entry points check their views too.
#include "bie-train.h"
#include "test-util.h"

#define N 2
#define C 3
#define HW 4

static float x[N * C * HW], y[N * C * HW], gy[N * C * HW], gx[N * C * HW];
static float gamma_[C] = {1, 1, 1}, beta_[C], rm[C], rv[C] = {1, 1, 1}, sm[C], si[C], gg[C], gb[C];
static int64_t nb[2] = {41, 0};

// Runs call, which must fail naming `name`, and checks that y still holds its sentinel.
#define REFUSED(call, name)                                                                                            \
    do {                                                                                                               \
        y[0] = 12345.0f;                                                                                               \
        TEST_EXPECT_STATUS(ctx, call, BIE_STATUS_INVALID_ARGUMENT, name);                                              \
        CHECK(y[0] == 12345.0f, "%s wrote its output before refusing", #call);                                         \
    } while (0)

static void test_batchnorm_args(bie_context_t * ctx) {
    struct bie_tensor tx = TEST_VIEW(x, BIE_DTYPE_F32, N, C, HW), ty = TEST_VIEW(y, BIE_DTYPE_F32, N, C, HW);
    struct bie_tensor tgm = TEST_VIEW(gamma_, BIE_DTYPE_F32, C), tbt = TEST_VIEW(beta_, BIE_DTYPE_F32, C),
                      trm = TEST_VIEW(rm, BIE_DTYPE_F32, C), trv = TEST_VIEW(rv, BIE_DTYPE_F32, C),
                      tsm = TEST_VIEW(sm, BIE_DTYPE_F32, C), tsi = TEST_VIEW(si, BIE_DTYPE_F32, C);
    const struct bie_batchnorm_desc d = {0.1f, 1e-5f, 1};
    const struct bie_batchnorm_args ok = {&tx, &tgm, &tbt, &trm, &trv, &tsm, &tsi, &ty, NULL, NULL};
    CHECK_OK(ctx, bie_batchnorm_forward(ctx, &d, &ok));
    struct bie_batchnorm_args a = ok;
    REFUSED(bie_batchnorm_forward(ctx, NULL, &ok), "desc");
    REFUSED(bie_batchnorm_forward(ctx, &d, NULL), "args");
    a.gamma = NULL;
    REFUSED(bie_batchnorm_forward(ctx, &d, &a), "gamma");
    a = ok;
    a.saved_mean = NULL; // needed in training
    REFUSED(bie_batchnorm_forward(ctx, &d, &a), "saved_mean");
    struct bie_tensor bad = TEST_VIEW(beta_, BIE_DTYPE_F32, C - 1); // one channel short
    a = ok;
    a.beta = &bad;
    REFUSED(bie_batchnorm_forward(ctx, &d, &a), "beta");
    struct bie_tensor yi = TEST_VIEW(y, BIE_DTYPE_I32, N, C, HW); // wrong dtype
    a = ok;
    a.y = &yi;
    REFUSED(bie_batchnorm_forward(ctx, &d, &a), "y");
    struct bie_tensor ys = TEST_VIEW(y, BIE_DTYPE_F32, N, C, HW / 2); // [N, C, 2] with stride 2: strided
    ys.stride[0] = C * HW;
    ys.stride[1] = HW;
    ys.stride[2] = 2;
    struct bie_tensor xs = ys;
    xs.data = x;
    a = ok;
    a.x = &xs;
    REFUSED(bie_batchnorm_forward(ctx, &d, &a), "dense");
    struct bie_tensor yc = ty; // a CUDA tensor
    yc.device_type = BIE_DEVICE_CUDA;
    a = ok;
    a.y = &yc;
    REFUSED(bie_batchnorm_forward(ctx, &d, &a), "CPU");
    struct bie_tensor xa = TEST_VIEW(y, BIE_DTYPE_F32, N, C, HW); // y overlaps x: refused
    a = ok;
    a.x = &xa;
    REFUSED(bie_batchnorm_forward(ctx, &d, &a), "x");
    a = ok;
    a.running_var = &trm; // two outputs on one buffer
    REFUSED(bie_batchnorm_forward(ctx, &d, &a), "running_mean");
    struct bie_tensor t1 = TEST_VIEW(x, BIE_DTYPE_F32, N * C * HW); // ndim 1: no channel dimension
    a = ok;
    a.x = &t1;
    REFUSED(bie_batchnorm_forward(ctx, &d, &a), "[n, c, ...]");
    // the batch counter: a training call adds 1, an eval call leaves it; one I64 element only
    struct bie_tensor tnb = TEST_VIEW(nb, BIE_DTYPE_I64, 1), tnb2 = TEST_VIEW(nb, BIE_DTYPE_I64, 2),
                      tnbi = TEST_VIEW(nb, BIE_DTYPE_I32, 1);
    a = ok;
    a.num_batches = &tnb;
    CHECK_OK(ctx, bie_batchnorm_forward(ctx, &d, &a));
    CHECK(nb[0] == 42, "batch norm: the training call's counter is %lld, not 42", (long long)nb[0]);
    const struct bie_batchnorm_desc eval = {0.1f, 1e-5f, 0};
    CHECK_OK(ctx, bie_batchnorm_forward(ctx, &eval, &a));
    CHECK(nb[0] == 42, "batch norm: an eval call changed the counter to %lld", (long long)nb[0]);
    a.num_batches = &tnb2;
    REFUSED(bie_batchnorm_forward(ctx, &d, &a), "num_batches: must hold one element");
    a.num_batches = &tnbi;
    REFUSED(bie_batchnorm_forward(ctx, &d, &a), "num_batches: dtype");
    CHECK(nb[0] == 42, "batch norm: a refused call changed the counter to %lld", (long long)nb[0]);

    struct bie_tensor tgy = TEST_VIEW(gy, BIE_DTYPE_F32, N, C, HW), tgx = TEST_VIEW(gx, BIE_DTYPE_F32, N, C, HW),
                      tgg = TEST_VIEW(gg, BIE_DTYPE_F32, C), tgb = TEST_VIEW(gb, BIE_DTYPE_F32, C);
    const struct bie_batchnorm_backward_args bok = {&tx, &tgm, &tsm, &tsi, &tgy, &tgx, &tgg, &tgb};
    CHECK_OK(ctx, bie_batchnorm_backward(ctx, &bok));
    struct bie_batchnorm_backward_args b = bok;
    b.grad_x = NULL; // optional
    CHECK_OK(ctx, bie_batchnorm_backward(ctx, &b));
    b = bok;
    b.grad_gamma = NULL;
    TEST_EXPECT_STATUS(ctx, bie_batchnorm_backward(ctx, &b), BIE_STATUS_INVALID_ARGUMENT, "grad_gamma");
    b = bok;
    b.grad_x = &tgy; // overwrites grad_y
    TEST_EXPECT_STATUS(ctx, bie_batchnorm_backward(ctx, &b), BIE_STATUS_INVALID_ARGUMENT, "grad_x");
    b = bok;
    b.grad_y = &ty; // [N, C, HW] of another buffer is fine; a shape that differs is not
    CHECK_OK(ctx, bie_batchnorm_backward(ctx, &b));
    b.grad_y = &t1;
    TEST_EXPECT_STATUS(ctx, bie_batchnorm_backward(ctx, &b), BIE_STATUS_INVALID_ARGUMENT, "grad_y");
}

static void test_pool_act_xent_args(bie_context_t * ctx) {
    int32_t am[N * C * HW];
    struct bie_tensor tx = TEST_VIEW(x, BIE_DTYPE_F32, N, C, 2, 2), ty = TEST_VIEW(y, BIE_DTYPE_F32, N, C, 1, 1),
                      ta = TEST_VIEW(am, BIE_DTYPE_I32, N, C, 1, 1), tgx = TEST_VIEW(gx, BIE_DTYPE_F32, N, C, 2, 2);
    const struct bie_maxpool2d_desc d = {2};
    const struct bie_maxpool2d_args ok = {&tx, &ty, &ta};
    CHECK_OK(ctx, bie_maxpool2d_forward(ctx, &d, &ok));
    struct bie_maxpool2d_args a = ok;
    struct bie_tensor ya = TEST_VIEW(y, BIE_DTYPE_F32, N, C, 2, 1); // h/k rows: 1, not 2
    a.y = &ya;
    REFUSED(bie_maxpool2d_forward(ctx, &d, &a), "y");
    struct bie_tensor af = TEST_VIEW(am, BIE_DTYPE_F32, N, C, 1, 1); // argmax must be I32
    a = ok;
    a.argmax = &af;
    REFUSED(bie_maxpool2d_forward(ctx, &d, &a), "argmax");
    struct bie_tensor ay = ta; // argmax on y's memory
    ay.data = y;
    a = ok;
    a.argmax = &ay;
    REFUSED(bie_maxpool2d_forward(ctx, &d, &a), "argmax");
    REFUSED(bie_maxpool2d_forward(ctx, &(struct bie_maxpool2d_desc){0}, &ok), "desc.k");
    struct bie_tensor tgy = TEST_VIEW(gy, BIE_DTYPE_F32, N, C, 1, 1);
    CHECK_OK(ctx, bie_maxpool2d_backward(ctx, &d, &(struct bie_maxpool2d_backward_args){&tgy, &ta, &tgx}));
    TEST_EXPECT_STATUS(ctx, bie_maxpool2d_backward(ctx, &d, &(struct bie_maxpool2d_backward_args){&tgy, NULL, &tgx}),
                       BIE_STATUS_INVALID_ARGUMENT, "argmax");

    // Activations: in place is allowed, a shifted overlap is not.
    struct bie_tensor ex = TEST_VIEW(x, BIE_DTYPE_F32, 8), ey = TEST_VIEW(y, BIE_DTYPE_F32, 8),
                      ex1 = TEST_VIEW(x + 1, BIE_DTYPE_F32, 8), e7 = TEST_VIEW(y, BIE_DTYPE_F32, 7);
    CHECK_OK(ctx, bie_activation_forward(ctx, BIE_ACT_RELU, &(struct bie_activation_args){&ex, &ex}));
    TEST_EXPECT_STATUS(ctx, bie_activation_forward(ctx, BIE_ACT_RELU, &(struct bie_activation_args){&ex, &ex1}),
                       BIE_STATUS_INVALID_ARGUMENT, "y");
    REFUSED(bie_activation_forward(ctx, BIE_ACT_RELU, &(struct bie_activation_args){&ex, &e7}), "y");
    REFUSED(bie_activation_forward(ctx, BIE_ACT_RELU, &(struct bie_activation_args){NULL, &ey}), "x");
    struct bie_tensor eg = TEST_VIEW(gy, BIE_DTYPE_F32, 8);
    CHECK_OK(ctx, bie_activation_backward(ctx, BIE_ACT_SIGN, &(struct bie_activation_backward_args){&ex, &eg, &eg}));
    REFUSED(bie_activation_backward(ctx, BIE_ACT_SIGN, &(struct bie_activation_backward_args){&ey, &eg, &ey}),
            "grad_x");

    // Softmax cross-entropy: labels are U8 [n].
    uint8_t lab[N] = {0, 1};
    double loss;
    struct bie_tensor z = TEST_VIEW(x, BIE_DTYPE_F32, N, C), l = TEST_VIEW(lab, BIE_DTYPE_U8, N),
                      li = TEST_VIEW(lab, BIE_DTYPE_I8, N), l1 = TEST_VIEW(lab, BIE_DTYPE_U8, 1),
                      g = TEST_VIEW(y, BIE_DTYPE_F32, N, C), gz = TEST_VIEW(x, BIE_DTYPE_F32, N, C);
    CHECK_OK(ctx, bie_softmax_cross_entropy(ctx, &(struct bie_softmax_cross_entropy_args){&z, &l, &g, &loss, NULL}));
    REFUSED(bie_softmax_cross_entropy(ctx, &(struct bie_softmax_cross_entropy_args){&z, &li, &g, &loss, NULL}),
            "labels");
    REFUSED(bie_softmax_cross_entropy(ctx, &(struct bie_softmax_cross_entropy_args){&z, &l1, &g, &loss, NULL}),
            "labels");
    TEST_EXPECT_STATUS(
        ctx, bie_softmax_cross_entropy(ctx, &(struct bie_softmax_cross_entropy_args){&z, &l, &gz, &loss, NULL}),
        BIE_STATUS_INVALID_ARGUMENT, "grad_logits");
}

static void test_optim_args(bie_context_t * ctx) {
    float p[6] = {0}, g[6] = {0}, m[6] = {0}, v[6] = {0};
    int8_t w[6] = {1, -1, 2, -2, 3, -3};
    struct bie_tensor tp = TEST_VIEW(p, BIE_DTYPE_F32, 2, 3), tg = TEST_VIEW(g, BIE_DTYPE_F32, 2, 3),
                      tm = TEST_VIEW(m, BIE_DTYPE_F32, 2, 3), tv = TEST_VIEW(v, BIE_DTYPE_F32, 2, 3),
                      t32 = TEST_VIEW(v, BIE_DTYPE_F32, 3, 2), tw = TEST_VIEW(w, BIE_DTYPE_I8, 2, 3);
    struct bie_adam_params ap;
    bie_adam_params_default(&ap);
    CHECK_OK(ctx, bie_adam_step(ctx, &ap, &(struct bie_adam_args){1, &tp, &tg, &tm, &tv}));
    TEST_EXPECT_STATUS(ctx, bie_adam_step(ctx, NULL, &(struct bie_adam_args){1, &tp, &tg, &tm, &tv}),
                       BIE_STATUS_INVALID_ARGUMENT, "params");
    TEST_EXPECT_STATUS(ctx, bie_adam_step(ctx, &ap, &(struct bie_adam_args){1, &tp, &tg, &tm, &t32}),
                       BIE_STATUS_INVALID_ARGUMENT, "v");
    TEST_EXPECT_STATUS(ctx, bie_adam_step(ctx, &ap, &(struct bie_adam_args){1, &tp, &tg, &tm, &tm}),
                       BIE_STATUS_INVALID_ARGUMENT, "m");
    TEST_EXPECT_STATUS(ctx, bie_adam_step(ctx, &ap, &(struct bie_adam_args){1, &tg, &tg, &tm, &tv}),
                       BIE_STATUS_INVALID_ARGUMENT, "grad");
    TEST_EXPECT_STATUS(ctx, bie_adam_step(ctx, &ap, &(struct bie_adam_args){1, &tw, &tg, &tm, &tv}),
                       BIE_STATUS_INVALID_ARGUMENT, "p");
    CHECK_OK(ctx, bie_diode_init(ctx, &(struct bie_diode_init_args){7, &tw, &tm, &tv}));
    TEST_EXPECT_STATUS(ctx, bie_diode_init(ctx, &(struct bie_diode_init_args){7, &tp, &tm, &tv}),
                       BIE_STATUS_INVALID_ARGUMENT, "w");
    TEST_EXPECT_STATUS(ctx, bie_diode_init(ctx, &(struct bie_diode_init_args){7, &tw, &tm, NULL}),
                       BIE_STATUS_INVALID_ARGUMENT, "s");
    struct bie_diode_params dp;
    bie_diode_params_default(&dp);
    int64_t flips = -1;
    CHECK_OK(ctx, bie_diode_step(ctx, &dp, &(struct bie_diode_args){&tw, &tg, &tm, &tv, &flips}));
    CHECK(flips == 0, "a zero gradient flipped %lld weights", (long long)flips);
    TEST_EXPECT_STATUS(ctx, bie_diode_step(ctx, &dp, &(struct bie_diode_args){&tw, &tg, &tg, &tv, NULL}),
                       BIE_STATUS_INVALID_ARGUMENT, "m");
}

// The model's entry points: x [n, C, H, W] or [n, C*H*W], logits [n, outputs], grad_logits of the
// last training forward's n.
static void test_model_args(bie_context_t * ctx) {
    bie_model_t * m = NULL;
    CHECK_OK(ctx, bie_model_create(ctx, "input 2 2 2; flatten; linear b1 4; bn; linear f32 3", BIE_LATENT_F32, 1, &m));
    if (!m) return;
    float mx[2 * 8], lz[2 * 3], lg[2 * 3] = {0.1f, -0.1f, 0, 0, 0.2f, -0.2f};
    for (int i = 0; i < 16; i++) mx[i] = (float)(i % 5) - 2.0f;
    struct bie_tensor x4 = TEST_VIEW(mx, BIE_DTYPE_F32, 2, 2, 2, 2), x2 = TEST_VIEW(mx, BIE_DTYPE_F32, 2, 8),
                      z = TEST_VIEW(lz, BIE_DTYPE_F32, 2, 3), g = TEST_VIEW(lg, BIE_DTYPE_F32, 2, 3);
    const struct bie_model_forward_desc train = {1, 0}, infer = {0, 0};
    CHECK_OK(ctx, bie_model_forward(ctx, m, &train, &(struct bie_model_forward_args){&x4, &z}));
    CHECK_OK(ctx, bie_model_backward(ctx, m, &(struct bie_model_backward_args){&g}));
    CHECK_OK(ctx, bie_model_step(ctx, m, &(struct bie_model_step_desc){0.01f, 0, 0.05f}));
    CHECK_OK(ctx, bie_model_forward(ctx, m, &infer, &(struct bie_model_forward_args){&x2, &z}));
    struct bie_tensor x3 = TEST_VIEW(mx, BIE_DTYPE_F32, 2, 2, 4); // neither [n, C, H, W] nor [n, C*H*W]
    TEST_EXPECT_STATUS(ctx, bie_model_forward(ctx, m, &infer, &(struct bie_model_forward_args){&x3, &z}),
                       BIE_STATUS_INVALID_ARGUMENT, "x");
    struct bie_tensor xw = TEST_VIEW(mx, BIE_DTYPE_F32, 2, 2, 2, 3); // another input shape
    TEST_EXPECT_STATUS(ctx, bie_model_forward(ctx, m, &infer, &(struct bie_model_forward_args){&xw, &z}),
                       BIE_STATUS_INVALID_ARGUMENT, "x");
    struct bie_tensor z1 = TEST_VIEW(lz, BIE_DTYPE_F32, 1, 3), zi = TEST_VIEW(lz, BIE_DTYPE_I32, 2, 3);
    TEST_EXPECT_STATUS(ctx, bie_model_forward(ctx, m, &infer, &(struct bie_model_forward_args){&x2, &z1}),
                       BIE_STATUS_INVALID_ARGUMENT, "logits");
    TEST_EXPECT_STATUS(ctx, bie_model_forward(ctx, m, &infer, &(struct bie_model_forward_args){&x2, &zi}),
                       BIE_STATUS_INVALID_ARGUMENT, "logits");
    TEST_EXPECT_STATUS(ctx, bie_model_forward(ctx, m, &infer, &(struct bie_model_forward_args){&x2, NULL}),
                       BIE_STATUS_INVALID_ARGUMENT, "logits");
    struct bie_tensor zx = TEST_VIEW(mx, BIE_DTYPE_F32, 2, 3); // logits over x
    TEST_EXPECT_STATUS(ctx, bie_model_forward(ctx, m, &infer, &(struct bie_model_forward_args){&x2, &zx}),
                       BIE_STATUS_INVALID_ARGUMENT, "logits");
    TEST_EXPECT_STATUS(ctx, bie_model_forward(ctx, m, NULL, &(struct bie_model_forward_args){&x2, &z}),
                       BIE_STATUS_INVALID_ARGUMENT, "desc");
    CHECK_OK(ctx, bie_model_forward(ctx, m, &train, &(struct bie_model_forward_args){&x2, &z}));
    TEST_EXPECT_STATUS(ctx, bie_model_backward(ctx, m, &(struct bie_model_backward_args){&z1}),
                       BIE_STATUS_INVALID_ARGUMENT, "grad_logits");
    TEST_EXPECT_STATUS(ctx, bie_model_backward(ctx, m, NULL), BIE_STATUS_INVALID_ARGUMENT, "args");
    TEST_EXPECT_STATUS(ctx, bie_model_step(ctx, m, NULL), BIE_STATUS_INVALID_ARGUMENT, "desc");
    bie_model_destroy(m);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    bie_context_t * ctx = NULL;
    CHECK_OK(ctx, bie_context_create(NULL, &ctx));
    for (int i = 0; i < N * C * HW; i++) x[i] = (float)(i % 7) - 3.0f;
    test_batchnorm_args(ctx);
    test_pool_act_xent_args(ctx);
    test_optim_args(ctx);
    test_model_args(ctx);
    bie_context_destroy(ctx);
    return test_finish("test-nn-args");
}
