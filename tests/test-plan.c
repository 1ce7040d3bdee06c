// SPDX-License-Identifier: Apache-2.0
// test-plan.c: planned layer calls (bie_plan_*) on the reference and the CPU backend:
//   (a) a plan executed on fresh tensors of the planned views gives, byte for byte, the output of
//       the entry point on the same tensors: linear and conv, binary / 4-bit / 8-bit, forward and
//       backward, random odd shapes, dense and strided views, host scales whose values change
//       between executions;
//   (b) the description names the layer, every tensor and the route;
//   (c) bad executions: a view that differs from the plan (shape, stride, dtype), a tensor absent
//       that was planned or given that was not, a NULL data pointer, a forward plan run as a
//       backward, a non-finite host scale: INVALID_ARGUMENT naming it, nothing written; a data
//       pointer of another alignment takes the entry point and gives its result.
// A failure prints the seed (BIE_TEST_SEED replays it) and the case.
#include "small-layer.h"

static enum bie_status bwd(bie_context_t * ctx, const struct small_layer * l, const struct bie_backward_args * a) {
    return l->conv ? bie_conv2d_backward(ctx, &l->cd, a) : bie_linear_backward(ctx, &l->ld, a);
}
static enum bie_status plan_bwd(bie_context_t * ctx, const struct small_layer * l, const struct bie_backward_args * a,
                                bie_plan_t ** p) {
    return l->conv ? bie_plan_conv2d_backward(ctx, &l->cd, a, p) : bie_plan_linear_backward(ctx, &l->ld, a, p);
}

// (a), (b) One layer: a forward and a backward plan, each executed on two sets of fresh tensors.
static void test_layer(bie_context_t * ctx) {
    struct small_layer l;
    small_layer_random(&l);
    const bool strided = test_rand_int(0, 1);
    const int64_t C = l.xs[1];
    struct bie_tensor x = small_layer_operand(&l, l.xs, BIE_DTYPE_F32, strided),
                      w = small_layer_operand(&l, l.ws, BIE_DTYPE_F32, false);
    struct bie_tensor b = test_tensor(BIE_DTYPE_F32, 1, &C, NULL),
                      y = small_layer_operand(&l, l.ys, BIE_DTYPE_F32, strided);
    struct bie_tensor y2 = cpu_test_clone(&y), g = small_layer_operand(&l, l.ys, BIE_DTYPE_F32, false);
    struct bie_tensor gx = small_layer_operand(&l, l.xs, BIE_DTYPE_F32, false),
                      gw = small_layer_operand(&l, l.ws, BIE_DTYPE_F32, false);
    struct bie_tensor gs = test_scalar(0.0f), gb = test_tensor(BIE_DTYPE_F32, 1, &C, NULL);
    struct bie_tensor gx2 = cpu_test_clone(&gx), gw2 = cpu_test_clone(&gw), gs2 = cpu_test_clone(&gs),
                      gb2 = cpu_test_clone(&gb);
    struct bie_tensor sa = test_scalar(0.5f), sw = test_scalar(0.25f);
    struct bie_forward_args fa = {.x = &x, .bias_a = &b, .weight = &w, .scale_a = &sa, .scale_w = &sw, .y = &y},
                            fa2 = fa;
    fa2.y = &y2;
    struct bie_backward_args ba = {&x, &b, &w, &sa, &sw, &g, &gx, &gw, &gs, &gb, NULL, NULL, NULL, 0.0f}, ba2 = ba;
    ba2.grad_x = &gx2;
    ba2.grad_weight = &gw2;
    ba2.grad_scale_a = &gs2;
    ba2.grad_bias_a = &gb2;
    bie_plan_t *pf = NULL, *pb = NULL;
    CHECK_OK(ctx, small_layer_plan_forward(ctx, &l, &fa, &pf));
    CHECK_OK(ctx, plan_bwd(ctx, &l, &ba, &pb));
    if (!pf || !pb) {
        bie_plan_destroy(pf);
        bie_plan_destroy(pb);
        return;
    }
    const char * d = bie_plan_describe(pf);
    CHECK(strstr(d, l.conv ? "conv2d forward" : "linear forward") && strstr(d, "route:") && strstr(d, "weight f32"),
          "description \"%s\" on %s", d, l.text);
    // the CPU backend's backward route: its GEMMs and where grad_weight goes
    const char * db = bie_plan_describe(pb);
    CHECK(!strstr(db, "route: cpu,") || (strstr(db, "; backward by ") && strstr(db, "; grad_weight ")),
          "backward description \"%s\" on %s", db, l.text);
    for (int round = 0; round < 2; round++) {
        test_fill_uniform(&x, -2.0f, 2.0f);
        test_fill_uniform(&w, -1.0f, 1.0f);
        test_fill_uniform(&b, -0.2f, 0.2f);
        test_fill_uniform(&g, -1.0f, 1.0f);
        *(float *)sa.data = test_rand_float(0.1f, 1.0f); // host scales: read on each execution
        *(float *)sw.data = test_rand_float(0.1f, 1.0f);
        cpu_test_garbage(&y);
        memcpy(y2.data, y.data, cpu_test_nbytes(&y));
        CHECK_OK(ctx, small_layer_forward(ctx, &l, &fa));
        CHECK_OK(ctx, bie_plan_forward(ctx, pf, &fa2));
        CHECK(memcmp(y.data, y2.data, cpu_test_nbytes(&y)) == 0, "planned forward differs on %s", l.text);
        CHECK_OK(ctx, bwd(ctx, &l, &ba));
        CHECK_OK(ctx, bie_plan_backward(ctx, pb, &ba2));
        const struct bie_tensor *r[4] = {&gx, &gw, &gs, &gb}, *p[4] = {&gx2, &gw2, &gs2, &gb2};
        for (int i = 0; i < 4; i++)
            CHECK(memcmp(r[i]->data, p[i]->data, cpu_test_nbytes(r[i])) == 0,
                  "planned backward gradient %d differs on %s", i, l.text);
    }
    // (c) bad executions write nothing
    cpu_test_garbage(&y2);
    struct bie_tensor keep = cpu_test_clone(&y2);
    struct bie_forward_args bad = fa2;
    struct bie_tensor xw = x;
    xw.shape[0] += 1;
    bad.x = &xw;
    TEST_EXPECT_STATUS(ctx, bie_plan_forward(ctx, pf, &bad), BIE_STATUS_INVALID_ARGUMENT, "x");
    xw = x;
    xw.stride[l.nd - 1] += 1;
    TEST_EXPECT_STATUS(ctx, bie_plan_forward(ctx, pf, &bad), BIE_STATUS_INVALID_ARGUMENT, "x");
    xw = x;
    xw.dtype = BIE_DTYPE_F16;
    TEST_EXPECT_STATUS(ctx, bie_plan_forward(ctx, pf, &bad), BIE_STATUS_INVALID_ARGUMENT, "x");
    xw = x;
    xw.data = NULL;
    TEST_EXPECT_STATUS(ctx, bie_plan_forward(ctx, pf, &bad), BIE_STATUS_INVALID_ARGUMENT, "x");
    bad = fa2;
    bad.bias_a = NULL;
    TEST_EXPECT_STATUS(ctx, bie_plan_forward(ctx, pf, &bad), BIE_STATUS_INVALID_ARGUMENT, "bias_a");
    *(float *)sa.data = NAN;
    TEST_EXPECT_STATUS(ctx, bie_plan_forward(ctx, pf, &fa2), BIE_STATUS_INVALID_ARGUMENT, "scale_a");
    *(float *)sa.data = 0.5f;
    TEST_EXPECT_STATUS(ctx, bie_plan_backward(ctx, pf, &ba2), BIE_STATUS_INVALID_ARGUMENT, "plan");
    struct bie_backward_args bb = ba2;
    bb.x_mask = &x;
    TEST_EXPECT_STATUS(ctx, bie_plan_backward(ctx, pb, &bb), BIE_STATUS_INVALID_ARGUMENT, "x_mask");
    CHECK(memcmp(keep.data, y2.data, cpu_test_nbytes(&y2)) == 0, "a failed execution wrote y on %s", l.text);
    // another alignment: the entry point's route and result
    struct bie_tensor xs = test_tensor(BIE_DTYPE_F32, l.nd, l.xs, x.stride);
    size_t xb = cpu_test_nbytes(&x);
    char * shifted = calloc(1, xb + 64);
    memcpy(shifted + 4, x.data, xb);
    free(xs.data);
    xs.data = shifted + 4;
    bad = fa2;
    bad.x = &xs;
    cpu_test_garbage(&y);
    memcpy(y2.data, y.data, cpu_test_nbytes(&y)); // (gaps between y's elements alike)
    CHECK_OK(ctx, small_layer_forward(ctx, &l, &fa));
    CHECK_OK(ctx, bie_plan_forward(ctx, pf, &bad));
    CHECK(memcmp(y.data, y2.data, cpu_test_nbytes(&y)) == 0, "forward from a shifted x differs on %s", l.text);
    free(shifted);
    bie_plan_destroy(pf);
    bie_plan_destroy(pb);
    struct bie_tensor * ts[] = {&x, &w, &b, &y, &y2, &g, &gx, &gw, &gs, &gb, &gx2, &gw2, &gs2, &gb2, &sa, &sw, &keep};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) test_tensor_free(ts[i]);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    bie_context_t * ctxs[2] = {cpu_test_ctx(BIE_BACKEND_REF, BIE_CPU_ISA_BEST, 1),
                               cpu_test_ctx(BIE_BACKEND_CPU, BIE_CPU_ISA_BEST, 2)};
    for (int c = 0; c < 2; c++)
        for (int i = 0; i < (cpu_test_quick() ? 15 : 80); i++) test_layer(ctxs[c]);
    bie_plan_destroy(NULL);
    CHECK(strcmp(bie_plan_describe(NULL), "(no plan)") == 0, "describe(NULL)");
    for (int c = 0; c < 2; c++) bie_context_destroy(ctxs[c]);
    return test_finish("test-plan");
}
