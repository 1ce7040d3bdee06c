// SPDX-License-Identifier: Apache-2.0
// cpu-matmul.c: the batched matmul of two activations on the CPU backend. Batch b is a binary /
// n-bit linear layer whose input is x[b] and whose weight is y[b] (bie_matmul_layer_call), so each
// batch runs the layers' packed GEMMs: both operands packed into panels (y[b] as a float weight,
// quantized on the fly), the register-blocked microkernels and the fused epilogue writing out[b].
// The backward runs each operand's side as that layer's backward (grad_x with its STE mask and
// the clip's partial sum), the y side with grad_out[b] transposed; the clip gradients are the
// batches' partials added in double, in batch order, and divided by sqrt(B) (each partial
// divides by the square root of its batch's numel, the whole gradient by that of all batches').
#include "cpu/cpu-impl.h"
#include "ref/ref-impl.h"

#include <math.h>

enum bie_status bie_cpu_matmul_forward(bie_context_t * ctx, const struct bie_matmul_call * mc) {
    if (mc->device_type != BIE_DEVICE_CPU || !mc->clips_on_host) return BIE_DECLINED;
    for (int64_t b = 0; b < mc->B; b++) {
        struct bie_layer_call lc;
        bie_matmul_layer_call(mc, b, 0, &lc);
        enum bie_status s =
            mc->quant == BIE_QUANT_BINARY ? bie_cpu_binary_forward(ctx, &lc) : bie_cpu_nbit_forward(ctx, &lc);
        if (s == BIE_DECLINED) s = bie_ref_layer_forward(ctx, &lc);
        BIE_TRY(s);
    }
    return BIE_STATUS_OK;
}

enum bie_status bie_cpu_matmul_backward(bie_context_t * ctx, const struct bie_matmul_call * mc) {
    if (mc->device_type != BIE_DEVICE_CPU || !mc->clips_on_host) return BIE_DECLINED;
    const struct bie_tensor *grads[2] = {&mc->grad_x, &mc->grad_y}, *clips[2] = {&mc->grad_x_clip, &mc->grad_y_clip};
    for (int side = 0; side < 2; side++) {
        if (!grads[side]->data && !clips[side]->data) continue;
        float part = 0.0f;
        struct bie_tensor pt;
        bie_tensor_make(&pt, &part, BIE_DTYPE_F32, 0, NULL);
        double sum = 0.0;
        for (int64_t b = 0; b < mc->B; b++) {
            struct bie_layer_call lc;
            bie_matmul_layer_call(mc, b, side, &lc);
            if (clips[side]->data) lc.grad_scale_a = pt;
            enum bie_status s = bie_cpu_layer_backward(ctx, &lc);
            if (s == BIE_DECLINED) s = bie_ref_layer_backward(ctx, &lc);
            BIE_TRY(s);
            sum += part;
        }
        if (clips[side]->data) bie_ref_store_rounded(clips[side], 0, sum / sqrt((double)mc->B));
    }
    return BIE_STATUS_OK;
}
