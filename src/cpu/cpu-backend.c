// SPDX-License-Identifier: Apache-2.0
// cpu-backend.c: the optimised CPU backend's table. Slots that are NULL or return BIE_DECLINED
// fall back to the reference. Forward calls on host tensors with host scales always run here
// (every view is handled; unusual ones through slower element-wise packing).
#include "cpu/cpu-gemv.h"
#include "ref/ref-impl.h"

#include <stdio.h>
#include <string.h>

static enum bie_status bie_cpu_layer_forward(bie_context_t * ctx, const struct bie_layer_call * call) {
    if (call->device_type != BIE_DEVICE_CPU || !call->scales_on_host) return BIE_DECLINED;
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
