// SPDX-License-Identifier: Apache-2.0
// ref-layer.c: placeholder until the reference layers land.
#include "ref/ref-impl.h"

enum bie_status bie_ref_layer_forward(bie_context_t * ctx, const struct bie_layer_call * call) {
    (void)call;
    return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "reference forward not written yet");
}

enum bie_status bie_ref_layer_backward(bie_context_t * ctx, const struct bie_layer_call * call) {
    (void)call;
    return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "reference backward not written yet");
}
