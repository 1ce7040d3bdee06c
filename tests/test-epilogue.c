// SPDX-License-Identifier: Apache-2.0
// test-epilogue.c: the layers' output epilogue (bie_forward_args out_mul, out_add, residual) on the
// reference and the CPU backend:
//   (a) y with the epilogue is, to the bit, the layer's y without it, then per element
//       round_y(((f32(y) * out_mul[o]) + out_add[o]) + f32(residual)) with each term present or
//       absent, and out_bits the bits of f32(y) + out_bits_bias[o] >= 0 (bias or none): linear and
//       conv, binary / 4-bit / 8-bit, y f32 / f16 / bf16, dense and strided views, the residual in
//       another layout than y, the bits channels-last or dense;
//   (b) the CPU backend's y equals the reference's, byte for byte, and a planned call's the entry
//       point's;
//   (c) bad epilogues: a y that is not float, out_mul / out_add not f32 or not [O], a residual of
//       another dtype or shape, a residual sharing y's bytes, out_bits not B1, out_bits_bias
//       without out_bits, a plan executed without its residual: INVALID_ARGUMENT naming the
//       tensor, nothing written.
// A failure prints the seed (BIE_TEST_SEED replays it) and the case.
#include "small-layer.h"

static const enum bie_dtype ydts[3] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16};

struct ecase {
    struct small_layer l;
    int terms; // out_mul 1, out_add 2, residual 4, out_bits 8, out_bits_bias 16
    enum bie_dtype ydt;
    int64_t O;
    char text[300];
};

static void random_case(struct ecase * e) {
    small_layer_random(&e->l);
    e->O = e->l.ys[1];
    e->ydt = ydts[test_rand_int(0, 2)];
    e->terms = (int)test_rand_int(1, 31);
    if ((e->terms & 24) == 16) e->terms |= 8;
    snprintf(e->text, sizeof e->text, "%s y=%s terms=%d", e->l.text, bie_dtype_name(e->ydt), e->terms);
}

// (a), (b) One case on the reference (ctx[0]) and the CPU backend (ctx[1]).
static void test_case(bie_context_t * const ctx[2]) {
    struct ecase e;
    random_case(&e);
    const int ylay = (int)test_rand_int(0, 2), rlay = (int)test_rand_int(0, 2);
    struct bie_tensor x = small_layer_operand(&e.l, e.l.xs, BIE_DTYPE_F32, 0),
                      w = small_layer_operand(&e.l, e.l.ws, BIE_DTYPE_F32, 0);
    struct bie_tensor y0 = small_layer_operand(&e.l, e.l.ys, e.ydt, ylay),
                      res = small_layer_operand(&e.l, e.l.ys, e.ydt, rlay);
    struct bie_tensor mul = test_tensor(BIE_DTYPE_F32, 1, &e.O, NULL), add = test_tensor(BIE_DTYPE_F32, 1, &e.O, NULL);
    struct bie_tensor sa = test_scalar(test_rand_float(0.1f, 1.0f)), sw = test_scalar(test_rand_float(0.1f, 1.0f));
    struct bie_tensor bb = test_tensor(BIE_DTYPE_F32, 1, &e.O, NULL);
    struct bie_tensor b0 = small_layer_operand(&e.l, e.l.ys, BIE_DTYPE_B1, test_rand_int(0, 1) ? 2 : 0);
    test_fill_uniform(&bb, -4.0f, 4.0f);
    cpu_test_garbage(&b0);
    struct bie_tensor b1 = cpu_test_clone(&b0), b2 = cpu_test_clone(&b0), b3 = cpu_test_clone(&b0);
    test_fill_uniform(&x, -2.0f, 2.0f);
    test_fill_uniform(&w, -1.0f, 1.0f);
    test_fill_uniform(&res, -8.0f, 8.0f);
    test_fill_uniform(&mul, -3.0f, 3.0f);
    test_fill_uniform(&add, -5.0f, 5.0f);
    cpu_test_garbage(&y0);
    struct bie_tensor y1 = cpu_test_clone(&y0), y2 = cpu_test_clone(&y0), y3 = cpu_test_clone(&y0);
    // the layer without the epilogue, then the epilogue by hand
    struct bie_forward_args a = {.x = &x, .weight = &w, .scale_a = &sa, .scale_w = &sw, .y = &y0};
    CHECK_OK(ctx[0], small_layer_forward(ctx[0], &e.l, &a));
    int64_t idx[BIE_MAX_DIMS] = {0};
    do {
        const int64_t o = idx[1], off = bie_offset(&y0, idx);
        float t = (float)bie_load(&y0, off);
        if (e.terms & 1) t = t * ((const float *)mul.data)[o];
        if (e.terms & 2) t = t + ((const float *)add.data)[o];
        if (e.terms & 4) t = t + (float)bie_load(&res, bie_offset(&res, idx));
        bie_store(&y0, off, t);
        const float v = (float)bie_load(&y0, off);
        if (e.terms & 8) bie_store(&b0, bie_offset(&b0, idx), (e.terms & 16) ? v + ((const float *)bb.data)[o] : v);
    } while (bie_next_index(&y0, idx));
    a.out_mul = e.terms & 1 ? &mul : NULL;
    a.out_add = e.terms & 2 ? &add : NULL;
    a.residual = e.terms & 4 ? &res : NULL;
    a.out_bits_bias = e.terms & 16 ? &bb : NULL;
    struct bie_tensor *ys[3] = {&y1, &y2, &y3}, *bs[3] = {&b1, &b2, &b3};
    for (int c = 0; c < 2; c++) {
        a.y = ys[c];
        a.out_bits = e.terms & 8 ? bs[c] : NULL;
        CHECK_OK(ctx[c], small_layer_forward(ctx[c], &e.l, &a));
        CHECK(memcmp(ys[c]->data, y0.data, cpu_test_nbytes(&y0)) == 0, "%s: y differs from the layer + epilogue on %s",
              c ? "cpu" : "reference", e.text);
        CHECK(memcmp(bs[c]->data, b0.data, cpu_test_nbytes(&b0)) == 0, "%s: out_bits differ on %s",
              c ? "cpu" : "reference", e.text);
    }
    a.out_bits = e.terms & 8 ? &b3 : NULL;
    bie_plan_t * p = NULL;
    a.y = &y3;
    CHECK_OK(ctx[1], e.l.conv ? bie_plan_conv2d_forward(ctx[1], &e.l.cd, &a, &p)
                              : bie_plan_linear_forward(ctx[1], &e.l.ld, &a, &p));
    if (p) {
        CHECK_OK(ctx[1], bie_plan_forward(ctx[1], p, &a));
        CHECK(memcmp(y3.data, y0.data, cpu_test_nbytes(&y0)) == 0, "planned y differs on %s", e.text);
        CHECK(memcmp(b3.data, b0.data, cpu_test_nbytes(&b0)) == 0, "planned out_bits differ on %s", e.text);
        // (c) a plan executed without its residual (or with one it was not made for)
        struct bie_forward_args b = a;
        b.residual = a.residual ? NULL : &res;
        TEST_EXPECT_STATUS(ctx[1], bie_plan_forward(ctx[1], p, &b), BIE_STATUS_INVALID_ARGUMENT, "residual");
        bie_plan_destroy(p);
    }
    struct bie_tensor * ts[] = {&x, &w, &y0, &y1, &y2, &y3, &res, &mul, &add, &sa, &sw, &bb, &b0, &b1, &b2, &b3};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) test_tensor_free(ts[i]);
}

// (c) Bad epilogues, each rejected before anything is written.
static void test_errors(bie_context_t * ctx) {
    const int64_t xs[2] = {4, 16}, ws[2] = {8, 16}, ys[2] = {4, 8}, O = 8, O2 = 7;
    const struct bie_linear_desc d = {BIE_QUANT_BINARY, 16, 8};
    struct bie_tensor x = test_tensor(BIE_DTYPE_F32, 2, xs, NULL), w = test_tensor(BIE_DTYPE_F32, 2, ws, NULL);
    struct bie_tensor y = test_tensor(BIE_DTYPE_F16, 2, ys, NULL), yi = test_tensor(BIE_DTYPE_I32, 2, ys, NULL);
    struct bie_tensor res = test_tensor(BIE_DTYPE_F16, 2, ys, NULL), res32 = test_tensor(BIE_DTYPE_F32, 2, ys, NULL);
    struct bie_tensor mul = test_tensor(BIE_DTYPE_F32, 1, &O, NULL), mul16 = test_tensor(BIE_DTYPE_F16, 1, &O, NULL);
    struct bie_tensor mul7 = test_tensor(BIE_DTYPE_F32, 1, &O2, NULL);
    struct bie_tensor sa = test_scalar(0.5f), sw = test_scalar(0.25f);
    test_fill_uniform(&x, -1.0f, 1.0f);
    test_fill_uniform(&w, -1.0f, 1.0f);
    cpu_test_garbage(&y);
    struct bie_tensor keep = cpu_test_clone(&y);
    struct bie_forward_args a = {.x = &x, .weight = &w, .scale_a = &sa, .scale_w = &sw, .y = &yi, .out_mul = &mul};
    TEST_EXPECT_STATUS(ctx, bie_linear_forward(ctx, &d, &a), BIE_STATUS_INVALID_ARGUMENT, "y");
    // each bad term alone (the field it goes in, out_mul 0 .. out_bits_bias 4, and the name the
    // error gives)
    struct bie_tensor rs = res, alias = y;
    rs.shape[0] = 3;
    const struct {
        int field;
        struct bie_tensor * t;
        const char * name;
    } bad[7] = {{0, &mul16, "out_mul"},  {1, &mul7, "out_add"}, {2, &res32, "residual"},   {2, &rs, "residual"},
                {2, &alias, "residual"}, {3, &res, "out_bits"}, {4, &mul, "out_bits_bias"}};
    for (int i = 0; i < 7; i++) {
        struct bie_forward_args b = {.x = &x, .weight = &w, .scale_a = &sa, .scale_w = &sw, .y = &y};
        if (bad[i].field == 0) b.out_mul = bad[i].t;
        else if (bad[i].field == 1) b.out_add = bad[i].t;
        else if (bad[i].field == 2) b.residual = bad[i].t;
        else if (bad[i].field == 3) b.out_bits = bad[i].t;
        else b.out_bits_bias = bad[i].t;
        TEST_EXPECT_STATUS(ctx, bie_linear_forward(ctx, &d, &b), BIE_STATUS_INVALID_ARGUMENT, bad[i].name);
    }
    CHECK(memcmp(keep.data, y.data, cpu_test_nbytes(&y)) == 0, "a rejected epilogue wrote y");
    a.y = &y;
    a.out_mul = NULL;
    a.residual = &res;
    test_fill_uniform(&res, -1.0f, 1.0f);
    CHECK_OK(ctx, bie_linear_forward(ctx, &d, &a));
    struct bie_tensor * ts[] = {&x, &w, &y, &yi, &res, &res32, &mul, &mul16, &mul7, &sa, &sw, &keep};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) test_tensor_free(ts[i]);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    bie_context_t * const ctx[2] = {cpu_test_ctx(BIE_BACKEND_REF, BIE_CPU_ISA_BEST, 1),
                                    cpu_test_ctx(BIE_BACKEND_CPU, BIE_CPU_ISA_BEST, 2)};
    for (int i = 0; i < (cpu_test_quick() ? 40 : 300); i++) test_case(ctx);
    test_errors(ctx[0]);
    test_errors(ctx[1]);
    for (int c = 0; c < 2; c++) bie_context_destroy(ctx[c]);
    return test_finish("test-epilogue");
}
