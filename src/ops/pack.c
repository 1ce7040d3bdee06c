// SPDX-License-Identifier: Apache-2.0
// pack.c: public packing / quantization utilities (bie_pack, bie_unpack): validation and dispatch.
#include "bie-cuda-plugin.h"

#include <math.h>
#include <stdio.h>

static bool is_packed(enum bie_dtype d) { return d == BIE_DTYPE_B1 || d == BIE_DTYPE_S4 || d == BIE_DTYPE_I8; }

static enum bie_status common(bie_context_t * ctx, const struct bie_tensor * src, const struct bie_tensor * scale,
                              const struct bie_tensor * dst, float * scale_value) {
    BIE_TRY(bie_check_tensor(ctx, "src", src, true));
    BIE_TRY(bie_check_tensor(ctx, "dst", dst, false));
    if (src->ndim != dst->ndim) BIE_FAIL("dst: has %d dims, src has %d", (int)dst->ndim, (int)src->ndim);
    for (int32_t i = 0; i < src->ndim; i++)
        if (src->shape[i] != dst->shape[i])
            BIE_FAIL("dst: shape[%d] = %lld differs from src's %lld", (int)i, (long long)dst->shape[i],
                     (long long)src->shape[i]);
    if (src->device_type != dst->device_type || src->device_index != dst->device_index)
        BIE_FAIL("dst: must be on the same device as src");
    *scale_value = 1.0f;
    if (scale) {
        BIE_TRY(bie_check_tensor(ctx, "scale", scale, true));
        if (bie_tensor_numel(scale) != 1) BIE_FAIL("scale: must hold exactly one element");
        if (!bie_dtype_is_float(scale->dtype)) BIE_FAIL("scale: must be f32, f16 or bf16");
        if (scale->device_type != BIE_DEVICE_CPU) BIE_FAIL("scale: must be a CPU tensor");
        *scale_value = bie_load_scalar(scale);
        if (!isfinite(*scale_value) || !(*scale_value > 0.0f))
            BIE_FAIL("scale: = %g must be finite and > 0", (double)*scale_value);
    }
    const struct bie_tensor * ins[2] = {src, scale};
    static const char *const dst_name[1] = {"dst"}, *const in_names[2] = {"src", "scale"};
    return bie_check_outputs(ctx, &dst, dst_name, 1, ins, in_names, 2);
}

// A pack or unpack job (bie_dispatch runs it on the backends that have the slot).
struct pack_job {
    const struct bie_tensor *src, *dst;
    float scale;
    bool unpack;
};
static enum bie_status run_slot(bie_context_t * ctx, const struct bie_backend_ops * b, const void * job) {
    const struct pack_job * j = job;
    enum bie_status (*f)(bie_context_t *, const struct bie_tensor *, float, const struct bie_tensor *) =
        j->unpack ? b->unpack : b->pack;
    return f ? f(ctx, j->src, j->scale, j->dst) : BIE_DECLINED;
}

static enum bie_status run(bie_context_t * ctx, const struct bie_tensor * src, float scale,
                           const struct bie_tensor * dst, bool unpack) {
    char what[64];
    snprintf(what, sizeof what, "%s %s -> %s", unpack ? "unpack" : "pack", bie_dtype_name(src->dtype),
             bie_dtype_name(dst->dtype));
    const struct pack_job j = {src, dst, scale, unpack};
    return bie_dispatch(ctx, src->device_type, run_slot, &j, what);
}

enum bie_status bie_pack(bie_context_t * ctx, const struct bie_tensor * src, const struct bie_tensor * scale,
                         struct bie_tensor * dst) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    float sv = 1.0f;
    BIE_TRY(common(ctx, src, scale, dst, &sv));
    const bool src_float = bie_dtype_is_float(src->dtype);
    switch (dst->dtype) {
    case BIE_DTYPE_B1:
        if (!src_float && src->dtype != BIE_DTYPE_I8)
            BIE_FAIL("src: dtype %s cannot be packed to b1", bie_dtype_name(src->dtype));
        if (scale) BIE_FAIL("scale: must be NULL when packing to b1");
        break;
    case BIE_DTYPE_S4:
        if (!src_float && src->dtype != BIE_DTYPE_I8)
            BIE_FAIL("src: dtype %s cannot be packed to s4", bie_dtype_name(src->dtype));
        if (src->dtype == BIE_DTYPE_I8 && scale) BIE_FAIL("scale: must be NULL for an i8 src");
        break;
    case BIE_DTYPE_I8:
        if (!src_float) BIE_FAIL("src: must be f32, f16 or bf16 to quantize to i8");
        break;
    default: BIE_FAIL("dst: dtype %s is not a packed dtype (b1, s4, i8)", bie_dtype_name(dst->dtype));
    }
    // Float rows to bits on a GPU: bit = (src >= 0) is bie_binarize_ste's sign bit without bias_a,
    // and its packer reads src once with 16-byte loads (the general pack kernel makes codes, then
    // packs them). Views it does not take go the general way.
    if (dst->dtype == BIE_DTYPE_B1 && src_float && src->device_type == BIE_DEVICE_CUDA && src->ndim >= 1) {
        if (bie_binarize_ste(ctx, src, NULL, NULL, dst, NULL) == BIE_STATUS_OK) return BIE_STATUS_OK;
        bie_clear_error(ctx);
    }
    return run(ctx, src, sv, dst, false);
}

enum bie_status bie_unpack(bie_context_t * ctx, const struct bie_tensor * src, const struct bie_tensor * scale,
                           struct bie_tensor * dst) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    float sv = 1.0f;
    BIE_TRY(common(ctx, src, scale, dst, &sv));
    if (!is_packed(src->dtype))
        BIE_FAIL("src: dtype %s is not a packed dtype (b1, s4, i8)", bie_dtype_name(src->dtype));
    if (dst->dtype == BIE_DTYPE_I8) {
        if (scale) BIE_FAIL("scale: must be NULL when unpacking to i8");
    } else if (!bie_dtype_is_float(dst->dtype)) {
        BIE_FAIL("dst: dtype %s is not supported (f32, f16, bf16, i8)", bie_dtype_name(dst->dtype));
    }
    return run(ctx, src, sv, dst, true);
}
