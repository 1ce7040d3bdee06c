// SPDX-License-Identifier: Apache-2.0
// cpu-backend.c: the optimised CPU backend's table. Slots that are NULL or return BIE_DECLINED
// fall back to the reference. Forward calls on host tensors with host scales always run here
// (every view is handled; unusual ones through slower element-wise packing).
#include "cpu/cpu-gemv.h"
#include "ref/ref-impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// A call with x_clamp runs on a dense f32 copy of the clamped x (one pass over x, in x's channel
// order: channels-last stays channels-last), then as a call without the clamp: the same x' (the
// clamp is exact in f32, and f32(x) of the copy is the clamped value). A backward then applies the
// clamp's derivative, 1{|x| < t}, to grad_x, after the sums of the call without the clamp, and then
// its grad_x_add.
enum bie_status bie_cpu_clamped(bie_context_t * ctx, const struct bie_layer_call * call, bool backward) {
    const struct bie_geometry * g = &call->g;
    struct bie_layer_call c = *call;
    c.x_clamp = 0.0f;
    c.grad_x_add.data = NULL; // (added after the gate)
    struct bie_tensor * x = &c.x;
    const int64_t N = g->batch, C = g->C, H = g->H, W = g->W;
    const bool nhwc = C > 1 && call->x.stride[1] == 1;
    const int64_t st[4] = {C * H * W, nhwc ? 1 : H * W, nhwc ? W * C : W, nhwc ? C : 1};
    x->dtype = BIE_DTYPE_F32;
    for (int i = 0; i < 4; i++) x->stride[i] = st[i];
    enum bie_status (*const run)(bie_context_t *, const struct bie_layer_call *) =
        backward ? bie_cpu_layer_backward : bie_cpu_layer_forward;
    if (call->plan) {
        x->data = NULL;
        const enum bie_status s = run(ctx, &c);
        const size_t n = strlen(call->plan->route);
        snprintf(call->plan->route + n, sizeof call->plan->route - n, ", x clamped into an f32 copy first");
        return s;
    }
    float * h = aligned_alloc(64, ((size_t)(N * C * H * W) * sizeof(float) + 63) / 64 * 64);
    if (!h) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "x_clamp: out of host memory for the clamped x");
    const float t = call->x_clamp;
    const struct bie_tensor * src = &call->x;
    for (int64_t n = 0; n < N; n++)
        for (int64_t ci = 0; ci < C; ci++)
            for (int64_t hi = 0; hi < H; hi++)
                for (int64_t wi = 0; wi < W; wi++) {
                    const float v = (float)bie_load(src, n * src->stride[0] + ci * src->stride[1] +
                                                             hi * src->stride[2] + wi * src->stride[3]);
                    h[n * st[0] + ci * st[1] + hi * st[2] + wi * st[3]] = bie_clamp_sym(v, t);
                }
    x->data = h;
    const enum bie_status s = run(ctx, &c);
    if (s == BIE_STATUS_OK && backward && call->grad_x.data) bie_ref_clamp_gate(call);
    if (s == BIE_STATUS_OK && backward && call->grad_x_add.data) bie_ref_grad_x_add(call);
    free(h);
    return s;
}

enum bie_status bie_cpu_layer_forward(bie_context_t * ctx, const struct bie_layer_call * call) {
    if (call->device_type != BIE_DEVICE_CPU || !call->scales_on_host) return BIE_DECLINED;
    if (call->x_clamp > 0.0f) return bie_cpu_clamped(ctx, call, false);
    if (call->plan) { // a planned forward's route names the matrix-vector path when it takes the call
        const enum bie_status s = bie_cpu_plan(ctx, call);
        if (s == BIE_STATUS_OK && bie_cpu_gemv_applies(call)) {
            const size_t n = strlen(call->plan->route);
            snprintf(call->plan->route + n, sizeof call->plan->route - n, ", matrix-vector");
        }
        return s;
    }
    enum bie_status s;
    if (bie_cpu_gemv_applies(call)) s = bie_cpu_gemv_forward(ctx, call); // M <= 8: matrix-vector
    else if (call->quant == BIE_QUANT_BINARY) s = bie_cpu_binary_forward(ctx, call);
    else s = bie_cpu_nbit_forward(ctx, call);
    if (s == BIE_STATUS_OK) bie_ref_layer_epilogue(call); // (memory-bound: one pass over y)
    return s;
}

const struct bie_backend_ops bie_cpu_backend = {
    .name = "cpu",
    BIE_BACKEND_SLOTS(bie_cpu),
};
