// SPDX-License-Identifier: Apache-2.0
// small-layer.h: a random small layer call (linear or 3x3 conv, binary / 4-bit / 8-bit, odd
// sizes) and its operands in dense, strided or channels-last views, for the tests of planned calls
// (test-plan.c) and of the output epilogue (test-epilogue.c).
#pragma once

#include "test-cpu-common.h"

static const enum bie_quant small_layer_quants[3] = {BIE_QUANT_BINARY, BIE_QUANT_INT4, BIE_QUANT_INT8};

struct small_layer {
    int conv;
    struct bie_linear_desc ld;
    struct bie_conv2d_desc cd;
    int64_t xs[4], ws[4], ys[4];
    int nd;
    char text[200];
};

static inline void small_layer_random(struct small_layer * l) {
    memset(l, 0, sizeof *l);
    l->conv = (int)test_rand_int(0, 1);
    const enum bie_quant q = small_layer_quants[test_rand_int(0, 2)];
    const int64_t C = test_rand_int(1, 40), O = test_rand_int(1, 20);
    if (l->conv) {
        l->cd = (struct bie_conv2d_desc){q, C, O, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, BIE_PAD_ZERO};
        const int64_t H = test_rand_int(3, 9), W = test_rand_int(3, 9);
        l->cd.stride[0] = (int32_t)test_rand_int(1, 2);
        int64_t oh, ow;
        bie_conv2d_output_size(&l->cd, H, W, &oh, &ow);
        const int64_t N = test_rand_int(1, 3);
        const int64_t xs[4] = {N, C, H, W}, ws[4] = {O, C, 3, 3}, ys[4] = {N, O, oh, ow};
        memcpy(l->xs, xs, sizeof xs);
        memcpy(l->ws, ws, sizeof ws);
        memcpy(l->ys, ys, sizeof ys);
        l->nd = 4;
    } else {
        l->ld = (struct bie_linear_desc){q, C, O};
        const int64_t M = test_rand_int(1, 30);
        l->xs[0] = M;
        l->xs[1] = C;
        l->ws[0] = O;
        l->ws[1] = C;
        l->ys[0] = M;
        l->ys[1] = O;
        l->nd = 2;
    }
    snprintf(l->text, sizeof l->text, "%s q=%d x [%lld, %lld, ...] O=%lld", l->conv ? "conv" : "linear", (int)q,
             (long long)l->xs[0], (long long)l->xs[1], (long long)O);
}

static inline enum bie_status small_layer_forward(bie_context_t * ctx, const struct small_layer * l,
                                                  const struct bie_forward_args * a) {
    return l->conv ? bie_conv2d_forward(ctx, &l->cd, a) : bie_linear_forward(ctx, &l->ld, a);
}
static inline enum bie_status small_layer_plan_forward(bie_context_t * ctx, const struct small_layer * l,
                                                       const struct bie_forward_args * a, bie_plan_t ** p) {
    return l->conv ? bie_plan_conv2d_forward(ctx, &l->cd, a, p) : bie_plan_linear_forward(ctx, &l->ld, a, p);
}

// A view of `shape`, dense (layout 0), strided with gaps (1) or, for a conv, channels-last (2);
// B1 views are dense or channels-last.
static inline struct bie_tensor small_layer_operand(const struct small_layer * l, const int64_t * shape,
                                                    enum bie_dtype dt, int layout) {
    if (layout == 2 && l->nd == 4) {
        static const int cl[4] = {0, 2, 3, 1};
        return cpu_test_view4(dt, shape, cl);
    }
    if (layout == 0 || dt == BIE_DTYPE_B1) return test_tensor(dt, l->nd, shape, NULL);
    int64_t st[4];
    st[l->nd - 1] = 2;
    for (int i = l->nd - 2; i >= 0; i--) st[i] = st[i + 1] * shape[i + 1] + 3;
    return test_tensor(dt, l->nd, shape, st);
}
