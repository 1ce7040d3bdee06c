// SPDX-License-Identifier: Apache-2.0
// op-check.c: the argument checks of op-impl.h.
#include "ops/op-impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char * device_name(enum bie_device_type t) { return t == BIE_DEVICE_CUDA ? "cuda" : "cpu"; }

enum bie_status bie_op_check_device(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                                    enum bie_device_type type, int32_t index) {
    if (t->device_type != type || t->device_index != index)
        BIE_FAIL("%s: is on %s:%d, the call's other tensors on %s:%d", name, device_name(t->device_type),
                 (int)t->device_index, device_name(type), (int)index);
    return BIE_STATUS_OK;
}

enum bie_status bie_op_check_float(bie_context_t * ctx, const char * name, const struct bie_tensor * t) {
    if (!bie_dtype_is_float(t->dtype))
        BIE_FAIL("%s: dtype %s is not supported (use f32, f16 or bf16)", name, bie_dtype_name(t->dtype));
    return BIE_STATUS_OK;
}

enum bie_status bie_op_check_scale(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                                   enum bie_device_type type, int32_t index, float * value, bool * on_host) {
    if (!t) BIE_FAIL("%s: is NULL", name);
    BIE_TRY(bie_check_tensor(ctx, name, t, true));
    if (bie_tensor_numel(t) != 1)
        BIE_FAIL("%s: must hold exactly one element, has %lld", name, (long long)bie_tensor_numel(t));
    BIE_TRY(bie_op_check_float(ctx, name, t));
    if (t->device_type == BIE_DEVICE_CPU) {
        *value = bie_load_scalar(t);
        if (!isfinite(*value) || !(*value > 0.0f)) BIE_FAIL("%s: = %g must be finite and > 0", name, (double)*value);
        return BIE_STATUS_OK;
    }
    BIE_TRY(bie_op_check_device(ctx, name, t, type, index));
    *on_host = false;
    return BIE_STATUS_OK;
}

enum bie_status bie_op_check_grad(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                                  enum bie_device_type type, int32_t index) {
    BIE_TRY(bie_check_tensor(ctx, name, t, false));
    BIE_TRY(bie_op_check_device(ctx, name, t, type, index));
    return bie_op_check_float(ctx, name, t);
}

enum bie_status bie_op_merge_leading(bie_context_t * ctx, const char * name, const struct bie_tensor * t, int32_t lead,
                                     struct bie_tensor * out) {
    // The innermost leading dim that is not 1 sets the stride; each one further out must continue it.
    int64_t stride = -1, extent = 1, n = 1;
    for (int32_t i = lead - 1; i >= 0; i--) {
        n *= t->shape[i];
        if (t->shape[i] == 1) continue;
        if (stride < 0) stride = t->stride[i];
        else if (t->stride[i] != stride * extent)
            BIE_FAIL("%s: its leading dimensions cannot be merged without a copy (make them contiguous)", name);
        extent *= t->shape[i];
    }
    *out = *t;
    out->ndim = 1 + t->ndim - lead;
    out->shape[0] = n;
    out->stride[0] = stride < 0 ? 0 : stride;
    for (int32_t i = 1; i < out->ndim; i++) {
        out->shape[i] = t->shape[lead + i - 1];
        out->stride[i] = t->stride[lead + i - 1];
    }
    for (int32_t i = out->ndim; i < BIE_MAX_DIMS; i++) out->shape[i] = out->stride[i] = 0;
    return BIE_STATUS_OK;
}

enum bie_status bie_op_check_shape(bie_context_t * ctx, const char * name, const struct bie_tensor * t, int32_t ndim,
                                   const int64_t * shape) {
    bool ok = t->ndim == ndim;
    for (int32_t i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (ok) return BIE_STATUS_OK;
    char want[200] = "", have[200] = "";
    for (int32_t i = 0; i < ndim; i++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? ", " : "", (long long)shape[i]);
    for (int32_t i = 0; i < t->ndim; i++)
        snprintf(have + strlen(have), sizeof have - strlen(have), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    BIE_FAIL("%s: shape [%s] does not match the expected [%s]", name, have, want);
}
