// SPDX-License-Identifier: Apache-2.0
// protocol.c: Bitorch Engine's layer protocol as plain functions: lazy activation-scale
// initialisation, weight scales, and the int8 latent weight of prepare_params().
//
//   activation scale: binary 2*mean|x| (4*mean|x| when not symmetric); n-bit 2*mean|x|/11.269
//   weight scale:     binary mean|W|; 4-bit max(2*mean|W|/5.6345, 1e-5); 8-bit 2*mean|W|/11.269
//   latent int8:      c = W - mean(W); q = rne(c * 127 / max|c|); q == 0 -> sign(c)
// Sums are taken in double, in element order (a weight scale computed on its CUDA device: in a fixed
// tree), and rounded once to f32.
#include "bie-cuda-plugin.h"

#include <math.h>

// What an input of the scales is: a well-formed view of floats.
static enum bie_status check_input(bie_context_t * ctx, const char * name, const struct bie_tensor * x) {
    BIE_TRY(bie_check_tensor(ctx, name, x, true));
    if (!bie_dtype_is_float(x->dtype))
        BIE_FAIL("%s: dtype %s is not supported (use f32, f16 or bf16)", name, bie_dtype_name(x->dtype));
    return BIE_STATUS_OK;
}

// The CUDA backend's views of these tensors hold up to 4 dimensions (refused with the argument's
// name before any device is touched).
#define CUDA_MAX_DIMS 4
static enum bie_status check_cuda_dims(bie_context_t * ctx, const char * name, const struct bie_tensor * t) {
    if (t->device_type == BIE_DEVICE_CUDA && t->ndim > CUDA_MAX_DIMS)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "%s: a CUDA tensor of %d dimensions (at most %d here)", name,
                             t->ndim, CUDA_MAX_DIMS);
    return BIE_STATUS_OK;
}

// What out_scale is on either device: one f32, f16 or bf16 element.
static enum bie_status check_out_scale(bie_context_t * ctx, const struct bie_tensor * out) {
    BIE_TRY(bie_check_tensor(ctx, "out_scale", out, false));
    if (bie_tensor_numel(out) != 1) BIE_FAIL("out_scale: must hold exactly one element");
    if (!bie_dtype_is_float(out->dtype)) BIE_FAIL("out_scale: must be f32, f16 or bf16");
    return BIE_STATUS_OK;
}

static enum bie_status sums(bie_context_t * ctx, const char * name, const struct bie_tensor * x, double * sum_abs,
                            double * sum) {
    BIE_TRY(check_input(ctx, name, x));
    BIE_TRY(check_cuda_dims(ctx, name, x));
    const struct bie_backend_ops * b = &bie_ref_backend;
    if (x->device_type == BIE_DEVICE_CUDA) {
        const struct bie_cuda_plugin * cuda;
        BIE_TRY(bie_cuda_plugin_get(ctx, name, &cuda));
        b = &cuda->backend;
    }
    if (!b->reduce) return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "%s: no reduction on this device", name);
    BIE_TRY(b->reduce(ctx, x, sum_abs, sum));
    if (!isfinite(*sum_abs)) BIE_FAIL("%s: holds a value that is not finite", name);
    return BIE_STATUS_OK;
}

static enum bie_status store_scale(bie_context_t * ctx, struct bie_tensor * out, double v) {
    BIE_TRY(check_out_scale(ctx, out));
    if (out->device_type != BIE_DEVICE_CPU) BIE_FAIL("out_scale: must be a CPU tensor");
    bie_store(out, 0, (double)(float)v);
    bie_clear_error(ctx);
    return BIE_STATUS_OK;
}

static bool quant_valid(enum bie_quant q) {
    return q == BIE_QUANT_BINARY || q == BIE_QUANT_INT4 || q == BIE_QUANT_INT8;
}

enum bie_status bie_activation_scale_init(bie_context_t * ctx, enum bie_quant quant, int symmetric,
                                          const struct bie_tensor * x, struct bie_tensor * out_scale) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    if (!quant_valid(quant)) BIE_FAIL("quant: = %d must be 1, 4 or 8", (int)quant);
    double sa, s;
    BIE_TRY(sums(ctx, "x", x, &sa, &s));
    const double mean_abs = sa / (double)bie_tensor_numel(x);
    double v = quant == BIE_QUANT_BINARY ? (symmetric ? 2.0 : 4.0) * mean_abs : 2.0 * mean_abs / 11.269;
    if (!(v > 0.0)) BIE_FAIL("x: is all zeros, so no scale can be derived from it");
    return store_scale(ctx, out_scale, v);
}

// The weight scale into out_scale on w's CUDA device, queued there (no host wait, so no check of
// the value: an all-zero w gives what the formula gives).
static enum bie_status weight_scale_on_device(bie_context_t * ctx, enum bie_quant quant, const struct bie_tensor * w,
                                              const struct bie_tensor * out) {
    BIE_TRY(check_input(ctx, "w", w));
    BIE_TRY(check_out_scale(ctx, out));
    if (w->device_type != BIE_DEVICE_CUDA || out->device_index != w->device_index)
        BIE_FAIL("out_scale: a CUDA out_scale must be on the device of w");
    BIE_TRY(check_cuda_dims(ctx, "w", w));
    BIE_TRY(check_cuda_dims(ctx, "out_scale", out));
    const struct bie_cuda_plugin * cuda;
    BIE_TRY(bie_cuda_plugin_get(ctx, "w", &cuda));
    if (!cuda->backend.weight_scale)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "w: this CUDA backend has no weight scale");
    BIE_TRY(cuda->backend.weight_scale(ctx, quant, w, out));
    bie_clear_error(ctx);
    return BIE_STATUS_OK;
}

enum bie_status bie_weight_scale_init(bie_context_t * ctx, enum bie_quant quant, const struct bie_tensor * w,
                                      struct bie_tensor * out_scale) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    if (!quant_valid(quant)) BIE_FAIL("quant: = %d must be 1, 4 or 8", (int)quant);
    if (out_scale && out_scale->device_type == BIE_DEVICE_CUDA) return weight_scale_on_device(ctx, quant, w, out_scale);
    double sa, s;
    BIE_TRY(sums(ctx, "w", w, &sa, &s));
    const double v = bie_weight_scale_of(quant, sa / (double)bie_tensor_numel(w));
    if (!(v > 0.0)) BIE_FAIL("w: is all zeros, so no scale can be derived from it");
    return store_scale(ctx, out_scale, v);
}

enum bie_status bie_weight_to_latent_int8(bie_context_t * ctx, const struct bie_tensor * w,
                                          struct bie_tensor * out_i8) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    double sa, s;
    BIE_TRY(sums(ctx, "w", w, &sa, &s));
    BIE_TRY(bie_check_tensor(ctx, "out_i8", out_i8, false));
    if (out_i8->dtype != BIE_DTYPE_I8) BIE_FAIL("out_i8: dtype must be i8, is %s", bie_dtype_name(out_i8->dtype));
    if (w->device_type != BIE_DEVICE_CPU || out_i8->device_type != BIE_DEVICE_CPU)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "w: the int8 latent weight is computed on the CPU only");
    if (out_i8->ndim != w->ndim) BIE_FAIL("out_i8: must have the shape of w");
    for (int32_t i = 0; i < w->ndim; i++)
        if (out_i8->shape[i] != w->shape[i]) BIE_FAIL("out_i8: must have the shape of w");
    const float mean = (float)(s / (double)bie_tensor_numel(w));
    int64_t idx[BIE_MAX_DIMS] = {0};
    float amax = 0.0f;
    do {
        const float c = (float)bie_load(w, bie_offset(w, idx)) - mean;
        amax = fmaxf(amax, fabsf(c));
    } while (bie_next_index(w, idx));
    const float factor = amax > 0.0f ? 127.0f / amax : 0.0f;
    do {
        const float c = (float)bie_load(w, bie_offset(w, idx)) - mean;
        float q = fminf(fmaxf(bie_rne(c * factor), -127.0f), 127.0f);
        if (q == 0.0f) q = c >= 0.0f ? 1.0f : -1.0f;
        bie_store(out_i8, bie_offset(out_i8, idx), q);
    } while (bie_next_index(w, idx));
    return BIE_STATUS_OK;
}
