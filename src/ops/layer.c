// SPDX-License-Identifier: Apache-2.0
// layer.c: the public linear and conv2d entry points, and bie_binarize_ste (the x side of a binary
// linear layer, saved for its backward). Validates every argument once, normalises the call (a
// linear layer becomes a 1x1 conv over 1x1 images) and dispatches it to a backend.
#include "bie-cuda-plugin.h"
#include "core/checked.h"
#include "ops/op-impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char * quant_name(enum bie_quant q) {
    return q == BIE_QUANT_BINARY ? "binary" : q == BIE_QUANT_INT4 ? "4-bit" : "8-bit";
}

static bool quant_valid(enum bie_quant q) {
    return q == BIE_QUANT_BINARY || q == BIE_QUANT_INT4 || q == BIE_QUANT_INT8;
}

// A 4-D view of `in`'s data with the given shape and strides.
static void view4(struct bie_tensor * out, const struct bie_tensor * in, const int64_t shape[4],
                  const int64_t stride[4]) {
    *out = *in;
    out->ndim = 4;
    for (int i = 0; i < 4; i++) {
        out->shape[i] = shape[i];
        out->stride[i] = stride[i];
    }
    for (int i = 4; i < BIE_MAX_DIMS; i++) out->shape[i] = out->stride[i] = 0;
}

static enum bie_status check_device(bie_context_t * ctx, struct bie_layer_call * c, const char * name,
                                    const struct bie_tensor * t) {
    if (t->device_type != c->device_type || t->device_index != c->device_index)
        BIE_FAIL("%s: is on %s:%d but x is on %s:%d", name, t->device_type == BIE_DEVICE_CUDA ? "cuda" : "cpu",
                 (int)t->device_index, c->device_type == BIE_DEVICE_CUDA ? "cuda" : "cpu", (int)c->device_index);
    return BIE_STATUS_OK;
}

// bie_op_check_scale's checks, on t's own device (so that its device check passes; a NULL t fails
// before it), then the layer's device check, whose message names x as the tensor to match.
static enum bie_status check_scale(bie_context_t * ctx, struct bie_layer_call * c, const char * name,
                                   const struct bie_tensor * t, struct bie_tensor * dst, float * value) {
    bool on_host = true;
    BIE_TRY(bie_op_check_scale(ctx, name, t, t ? t->device_type : BIE_DEVICE_CPU, t ? t->device_index : 0, value,
                               &on_host));
    if (!on_host) {
        BIE_TRY(check_device(ctx, c, name, t));
        c->scales_on_host = false;
    }
    *dst = *t;
    return BIE_STATUS_OK;
}

// Collapses the leading dims of a linear-layer tensor [..., F] into [M, F]: returns the row
// stride, or -1 when the leading dims are not evenly strided (not flattenable without a copy).
static int64_t row_stride(const struct bie_tensor * t) {
    int64_t stride = -1, extent = 1; // stride of the innermost non-trivial leading dim
    for (int32_t i = t->ndim - 2; i >= 0; i--) {
        if (t->shape[i] == 1) continue;
        if (stride < 0) stride = t->stride[i];
        else if (t->stride[i] != stride * extent) return -1;
        extent *= t->shape[i];
    }
    return stride < 0 ? 0 : stride;
}

static enum bie_status linear_view(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                                   const struct bie_tensor * like_x, int64_t features, struct bie_tensor * out) {
    if (t->ndim < 1) BIE_FAIL("%s: must have at least one dimension", name);
    if (t->shape[t->ndim - 1] != features)
        BIE_FAIL("%s: last dimension is %lld, expected %lld", name, (long long)t->shape[t->ndim - 1],
                 (long long)features);
    if (like_x) { // same leading shape as x
        bool ok = like_x->ndim == t->ndim;
        for (int32_t i = 0; ok && i < t->ndim - 1; i++) ok = like_x->shape[i] == t->shape[i];
        if (!ok) BIE_FAIL("%s: leading dimensions must equal those of x", name);
    }
    const int64_t rs = row_stride(t);
    if (rs < 0) BIE_FAIL("%s: leading dimensions cannot be flattened without a copy (make them contiguous)", name);
    const int64_t m = bie_tensor_numel(t) / features;
    const int64_t shape[4] = {m, features, 1, 1}, stride[4] = {rs, t->stride[t->ndim - 1], 0, 0};
    view4(out, t, shape, stride);
    return BIE_STATUS_OK;
}

static enum bie_status check_weight_dtype(bie_context_t * ctx, enum bie_quant q, const struct bie_tensor * w) {
    const enum bie_dtype d = w->dtype;
    if (bie_dtype_is_float(d) || d == BIE_DTYPE_I8) return BIE_STATUS_OK;
    if (d == BIE_DTYPE_B1 && q == BIE_QUANT_BINARY) return BIE_STATUS_OK;
    if (d == BIE_DTYPE_S4 && q == BIE_QUANT_INT4) return BIE_STATUS_OK;
    BIE_FAIL("weight: dtype %s is not supported by a %s layer", bie_dtype_name(d), quant_name(q));
}

// Common part of forward and backward for both layer kinds. `lin` or `conv` is non-NULL.
static enum bie_status prepare(bie_context_t * ctx, const struct bie_linear_desc * lin,
                               const struct bie_conv2d_desc * conv, const struct bie_tensor * x,
                               const struct bie_tensor * bias_a, const struct bie_tensor * weight,
                               const struct bie_tensor * scale_a, const struct bie_tensor * scale_w,
                               struct bie_layer_call * c) {
    memset(c, 0, sizeof *c);
    c->quant = lin ? lin->quant : conv->quant;
    c->is_conv = conv != NULL;
    if (!quant_valid(c->quant)) BIE_FAIL("desc: quant = %d must be 1, 4 or 8", (int)c->quant);
    BIE_TRY(bie_check_tensor(ctx, "x", x, true));
    BIE_TRY(bie_check_tensor(ctx, "weight", weight, true));
    c->device_type = x->device_type;
    c->device_index = x->device_index;
    c->scales_on_host = true;
    BIE_TRY(check_device(ctx, c, "weight", weight));
    if (x->dtype == BIE_DTYPE_B1) {
        if (c->quant != BIE_QUANT_BINARY) BIE_FAIL("x: a b1 input needs a binary layer");
        if (bias_a) BIE_FAIL("bias_a: must be NULL when x is already binarized (b1)");
    } else {
        BIE_TRY(bie_op_check_float(ctx, "x", x));
    }
    BIE_TRY(check_weight_dtype(ctx, c->quant, weight));
    struct bie_geometry * g = &c->g;
    if (lin) {
        if (lin->in_features <= 0 || lin->out_features <= 0)
            BIE_FAIL("desc: in_features = %lld and out_features = %lld must be positive", (long long)lin->in_features,
                     (long long)lin->out_features);
        BIE_TRY(linear_view(ctx, "x", x, NULL, lin->in_features, &c->x));
        const int64_t wshape[2] = {lin->out_features, lin->in_features};
        BIE_TRY(bie_op_check_shape(ctx, "weight", weight, 2, wshape));
        const int64_t s[4] = {lin->out_features, lin->in_features, 1, 1};
        const int64_t st[4] = {weight->stride[0], weight->stride[1], 0, 0};
        view4(&c->weight, weight, s, st);
        g->batch = c->x.shape[0];
        g->C = lin->in_features;
        g->O = lin->out_features;
        g->H = g->W = g->OH = g->OW = g->kh = g->kw = g->sh = g->sw = g->dh = g->dw = 1;
        g->ph = g->pw = 0;
        g->pad_value = BIE_PAD_ZERO;
    } else {
        if (conv->in_channels <= 0 || conv->out_channels <= 0)
            BIE_FAIL("desc: in_channels = %lld and out_channels = %lld must be positive", (long long)conv->in_channels,
                     (long long)conv->out_channels);
        if (conv->groups != 1)
            return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "desc: groups = %d (only 1 is supported)",
                                 (int)conv->groups);
        if ((unsigned)conv->pad_value > (unsigned)BIE_PAD_PLUS_ONE)
            BIE_FAIL("desc: pad_value = %d is not a bie_pad_value", (int)conv->pad_value);
        if (conv->pad_value != BIE_PAD_ZERO && c->quant != BIE_QUANT_BINARY)
            BIE_FAIL("desc: pad_value must be BIE_PAD_ZERO for a %s conv", quant_name(c->quant));
        if (x->ndim != 4) BIE_FAIL("x: a conv2d input must be 4-D [N, C, H, W], has %d dims", (int)x->ndim);
        if (x->shape[1] != conv->in_channels)
            BIE_FAIL("x: has %lld channels, desc.in_channels is %lld", (long long)x->shape[1],
                     (long long)conv->in_channels);
        int64_t oh, ow;
        BIE_TRY(bie_conv2d_output_size(conv, x->shape[2], x->shape[3], &oh, &ow) == BIE_STATUS_OK
                    ? BIE_STATUS_OK
                    : bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT,
                                    "desc: kernel/stride/padding/dilation are invalid for a %lldx%lld input",
                                    (long long)x->shape[2], (long long)x->shape[3]));
        const int64_t wshape[4] = {conv->out_channels, conv->in_channels, conv->kernel[0], conv->kernel[1]};
        BIE_TRY(bie_op_check_shape(ctx, "weight", weight, 4, wshape));
        c->x = *x;
        c->weight = *weight;
        g->batch = x->shape[0];
        g->C = conv->in_channels;
        g->H = x->shape[2];
        g->W = x->shape[3];
        g->O = conv->out_channels;
        g->OH = oh;
        g->OW = ow;
        g->kh = conv->kernel[0];
        g->kw = conv->kernel[1];
        g->sh = conv->stride[0];
        g->sw = conv->stride[1];
        g->ph = conv->padding[0];
        g->pw = conv->padding[1];
        g->dh = conv->dilation[0];
        g->dw = conv->dilation[1];
        g->pad_value = conv->pad_value;
    }
    if (__builtin_mul_overflow(g->C, g->kh * g->kw, &g->K) || g->K > INT32_MAX / 4)
        BIE_FAIL("desc: the reduction length C*kh*kw is too large for 32-bit accumulation");
    if (bias_a) {
        BIE_TRY(bie_check_tensor(ctx, "bias_a", bias_a, true));
        BIE_TRY(check_device(ctx, c, "bias_a", bias_a));
        BIE_TRY(bie_op_check_float(ctx, "bias_a", bias_a));
        BIE_TRY(bie_op_check_shape(ctx, "bias_a", bias_a, 1, &g->C));
        c->bias_a = *bias_a;
    }
    BIE_TRY(check_scale(ctx, c, "scale_a", scale_a, &c->scale_a_t, &c->scale_a));
    BIE_TRY(check_scale(ctx, c, "scale_w", scale_w, &c->scale_w_t, &c->scale_w));
    return BIE_STATUS_OK;
}

// Checks an output-shaped tensor (y or grad_y) and stores its 4-D view.
static enum bie_status out_view(bie_context_t * ctx, struct bie_layer_call * c, const char * name,
                                const struct bie_tensor * t, const struct bie_tensor * x, struct bie_tensor * out,
                                bool is_output) {
    BIE_TRY(bie_check_tensor(ctx, name, t, !is_output));
    BIE_TRY(check_device(ctx, c, name, t));
    if (c->is_conv) {
        const int64_t shape[4] = {c->g.batch, c->g.O, c->g.OH, c->g.OW};
        BIE_TRY(bie_op_check_shape(ctx, name, t, 4, shape));
        *out = *t;
    } else {
        BIE_TRY(linear_view(ctx, name, t, x, c->g.O, out));
    }
    return BIE_STATUS_OK;
}

// What a backend is asked to do with a validated call.
enum job_kind { JOB_FORWARD, JOB_BACKWARD, JOB_BINARIZE_STE };
struct job {
    enum job_kind kind;
    const struct bie_layer_call * c;
    const struct bie_ste_out * ste; // JOB_BINARIZE_STE's outputs and clamp
};

// Backend b's slot for the job, or BIE_DECLINED when it has none.
static enum bie_status run_slot(bie_context_t * ctx, const struct bie_backend_ops * b, const void * job) {
    const struct job * j = job;
    if (j->kind == JOB_FORWARD) return b->layer_forward ? b->layer_forward(ctx, j->c) : BIE_DECLINED;
    if (j->kind == JOB_BACKWARD) return b->layer_backward ? b->layer_backward(ctx, j->c) : BIE_DECLINED;
    return b->binarize_ste ? b->binarize_ste(ctx, j->c, j->ste) : BIE_DECLINED;
}

// The job on its backends (bie_dispatch), named in messages as "this binary linear forward" or
// "bie_binarize_ste".
static enum bie_status dispatch(bie_context_t * ctx, const struct job * j) {
    char what[64];
    if (j->kind == JOB_BINARIZE_STE)
        snprintf(what, sizeof what, j->ste->clamp > 0.0f ? "bie_binarize_ste_clamped" : "bie_binarize_ste");
    else
        snprintf(what, sizeof what, "this %s %s %s", quant_name(j->c->quant), j->c->is_conv ? "conv2d" : "linear",
                 j->kind == JOB_BACKWARD ? "backward" : "forward");
    return bie_dispatch(ctx, j->c->device_type, run_slot, j, what);
}

// The forward's optional epilogue terms (bie_forward_args), into the call.
static enum bie_status epilogue_check(bie_context_t * ctx, struct bie_layer_call * c,
                                      const struct bie_forward_args * a) {
    if (!a->out_mul && !a->out_add && !a->residual && !a->out_bits && !a->out_bits_bias) return BIE_STATUS_OK;
    if (!bie_dtype_is_float(a->y->dtype))
        BIE_FAIL("y: is %s; an epilogue (out_mul, out_add, residual, out_bits) needs an f32, f16 or bf16 y",
                 bie_dtype_name(a->y->dtype));
    if (a->out_bits_bias && !a->out_bits) BIE_FAIL("out_bits_bias: given without out_bits");
    const struct bie_tensor * v[3] = {a->out_mul, a->out_add, a->out_bits_bias};
    static const char * const names[3] = {"out_mul", "out_add", "out_bits_bias"};
    struct bie_tensor * dst[3] = {&c->out_mul, &c->out_add, &c->out_bits_bias};
    for (int i = 0; i < 3; i++) {
        if (!v[i]) continue;
        BIE_TRY(bie_check_tensor(ctx, names[i], v[i], true));
        BIE_TRY(check_device(ctx, c, names[i], v[i]));
        if (v[i]->dtype != BIE_DTYPE_F32) BIE_FAIL("%s: dtype %s must be f32", names[i], bie_dtype_name(v[i]->dtype));
        BIE_TRY(bie_op_check_shape(ctx, names[i], v[i], 1, &c->g.O));
        *dst[i] = *v[i];
    }
    if (a->residual) {
        BIE_TRY(out_view(ctx, c, "residual", a->residual, a->x, &c->residual, false));
        if (a->residual->dtype != a->y->dtype)
            BIE_FAIL("residual: dtype %s must be y's (%s)", bie_dtype_name(a->residual->dtype),
                     bie_dtype_name(a->y->dtype));
    }
    if (a->out_bits) {
        BIE_TRY(out_view(ctx, c, "out_bits", a->out_bits, a->x, &c->out_bits, true));
        if (a->out_bits->dtype != BIE_DTYPE_B1)
            BIE_FAIL("out_bits: dtype %s must be b1", bie_dtype_name(a->out_bits->dtype));
    }
    return BIE_STATUS_OK;
}

// x_clamp (forward and backward args): t finite and > 0 with a float x, or 0; kept as the call's.
static enum bie_status clamp_check(bie_context_t * ctx, struct bie_layer_call * c, float t,
                                   const struct bie_tensor * x) {
    if (t == 0.0f) return BIE_STATUS_OK;
    if (!isfinite(t) || !(t > 0.0f)) BIE_FAIL("x_clamp: = %g must be 0 (no clamp) or finite and > 0", (double)t);
    if (x->dtype == BIE_DTYPE_B1) BIE_FAIL("x_clamp: x is b1 (already binarized); a clamp needs a float x");
    c->x_clamp = t;
    return BIE_STATUS_OK;
}

enum bie_status bie_layer_prepare_forward(bie_context_t * ctx, const struct bie_linear_desc * lin,
                                          const struct bie_conv2d_desc * conv, const struct bie_forward_args * a,
                                          struct bie_layer_call * c) {
    if (!(lin || conv)) BIE_FAIL("desc: is NULL");
    if (!a) BIE_FAIL("args: is NULL");
    BIE_TRY(prepare(ctx, lin, conv, a->x, a->bias_a, a->weight, a->scale_a, a->scale_w, c));
    BIE_TRY(out_view(ctx, c, "y", a->y, a->x, &c->y, true));
    const enum bie_dtype yd = a->y->dtype;
    if (!(bie_dtype_is_float(yd) || yd == BIE_DTYPE_I32 || (yd == BIE_DTYPE_B1 && c->quant == BIE_QUANT_BINARY)))
        BIE_FAIL("y: dtype %s is not supported (f32, f16, bf16, i32%s)", bie_dtype_name(yd),
                 c->quant == BIE_QUANT_BINARY ? " or b1" : "");
    if (c->scales_on_host && !isfinite(c->scale_a * c->scale_w))
        BIE_FAIL("scale_a * scale_w: %g * %g overflows f32 (y = acc * (scale_a * scale_w) needs a finite product)",
                 (double)c->scale_a, (double)c->scale_w);
    BIE_TRY(epilogue_check(ctx, c, a));
    BIE_TRY(clamp_check(ctx, c, a->x_clamp, a->x));
    const struct bie_tensor *outs[2] = {a->y, a->out_bits},
                            *ins[9] = {a->x,       a->bias_a,  a->weight,   a->scale_a,      a->scale_w,
                                       a->out_mul, a->out_add, a->residual, a->out_bits_bias};
    static const char *const out_names[2] = {"y", "out_bits"}, *const in_names[9] = {
                                                                   "x",       "bias_a",   "weight",
                                                                   "scale_a", "scale_w",  "out_mul",
                                                                   "out_add", "residual", "out_bits_bias"};
    return bie_check_outputs(ctx, outs, out_names, 2, ins, in_names, 9);
}

enum bie_status bie_layer_run(bie_context_t * ctx, const struct bie_layer_call * c, bool backward) {
    const struct job j = {backward ? JOB_BACKWARD : JOB_FORWARD, c, NULL};
    return dispatch(ctx, &j);
}

static enum bie_status forward(bie_context_t * ctx, const struct bie_linear_desc * lin,
                               const struct bie_conv2d_desc * conv, const struct bie_forward_args * a) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    struct bie_layer_call c;
    BIE_TRY(bie_layer_prepare_forward(ctx, lin, conv, a, &c));
    return bie_layer_run(ctx, &c, false);
}

// Checks a gradient output: a well-formed, dense-enough float tensor on the call's device.
static enum bie_status grad_check(bie_context_t * ctx, struct bie_layer_call * c, const char * name,
                                  const struct bie_tensor * t) {
    BIE_TRY(bie_check_tensor(ctx, name, t, false));
    BIE_TRY(check_device(ctx, c, name, t));
    return bie_op_check_float(ctx, name, t);
}

// A float tensor shaped like x (grad_x, grad_x_add), checked and stored as the call's view of it.
static enum bie_status x_shaped_grad(bie_context_t * ctx, struct bie_layer_call * c, const char * name,
                                     const struct bie_tensor * t, const struct bie_tensor * x,
                                     struct bie_tensor * out) {
    BIE_TRY(grad_check(ctx, c, name, t));
    if (!c->is_conv) return linear_view(ctx, name, t, x, c->g.C, out);
    BIE_TRY(bie_op_check_shape(ctx, name, t, 4, x->shape));
    *out = *t;
    return BIE_STATUS_OK;
}

// A B1 tensor shaped like x (x_mask, grad_x_mask), checked and stored as the call's view of it.
static enum bie_status b1_like_x(bie_context_t * ctx, struct bie_layer_call * c, const char * name,
                                 const struct bie_tensor * t, const struct bie_tensor * x, struct bie_tensor * out) {
    BIE_TRY(bie_check_tensor(ctx, name, t, true));
    BIE_TRY(check_device(ctx, c, name, t));
    if (t->dtype != BIE_DTYPE_B1) BIE_FAIL("%s: dtype %s is not b1", name, bie_dtype_name(t->dtype));
    if (c->is_conv) {
        BIE_TRY(bie_op_check_shape(ctx, name, t, 4, x->shape));
        *out = *t;
        return BIE_STATUS_OK;
    }
    return linear_view(ctx, name, t, x, c->g.C, out);
}

// The backward's rule for a B1 x (the bits of bie_binarize_ste; prepare() takes it for a binary
// layer without bias_a): x_mask, shaped like x, is required whenever the STE mask is needed.
static enum bie_status saved_bits(bie_context_t * ctx, struct bie_layer_call * c, const struct bie_backward_args * a) {
    if (a->x->dtype != BIE_DTYPE_B1) {
        if (a->x_mask) BIE_FAIL("x_mask: must be NULL when x is float (the mask goes with saved b1 bits)");
        if (a->grad_x_mask) BIE_FAIL("grad_x_mask: must be NULL when x is float (it goes with saved b1 bits)");
        return BIE_STATUS_OK;
    }
    if (a->grad_x_mask) BIE_TRY(b1_like_x(ctx, c, "grad_x_mask", a->grad_x_mask, a->x, &c->grad_x_mask));
    if (!a->x_mask) {
        if (a->grad_x || a->grad_scale_a || a->grad_bias_a)
            BIE_FAIL("x_mask: is required with a b1 x when grad_x, grad_scale_a or grad_bias_a is asked for");
        return BIE_STATUS_OK;
    }
    return b1_like_x(ctx, c, "x_mask", a->x_mask, a->x, &c->x_mask);
}

enum bie_status bie_layer_prepare_backward(bie_context_t * ctx, const struct bie_linear_desc * lin,
                                           const struct bie_conv2d_desc * conv, const struct bie_backward_args * a,
                                           struct bie_layer_call * cp) {
    if (!(lin || conv)) BIE_FAIL("desc: is NULL");
    if (!a) BIE_FAIL("args: is NULL");
    struct bie_layer_call c;
    BIE_TRY(prepare(ctx, lin, conv, a->x, a->bias_a, a->weight, a->scale_a, a->scale_w, &c));
    BIE_TRY(saved_bits(ctx, &c, a));
    BIE_TRY(clamp_check(ctx, &c, a->x_clamp, a->x));
    BIE_TRY(out_view(ctx, &c, "grad_y", a->grad_y, a->x, &c.grad_y, false));
    BIE_TRY(bie_op_check_float(ctx, "grad_y", a->grad_y));
    if (a->grad_x) BIE_TRY(x_shaped_grad(ctx, &c, "grad_x", a->grad_x, a->x, &c.grad_x));
    if (a->grad_x_add) {
        if (!a->grad_x) BIE_FAIL("grad_x_add: is added to grad_x, which is NULL");
        BIE_TRY(x_shaped_grad(ctx, &c, "grad_x_add", a->grad_x_add, a->x, &c.grad_x_add));
    }
    if (a->grad_weight) {
        BIE_TRY(grad_check(ctx, &c, "grad_weight", a->grad_weight));
        BIE_TRY(bie_op_check_shape(ctx, "grad_weight", a->grad_weight, a->weight->ndim, a->weight->shape));
        const int64_t s[4] = {c.g.O, c.g.C, 1, 1};
        const int64_t st[4] = {a->grad_weight->stride[0], a->grad_weight->stride[1], 0, 0};
        if (c.is_conv) c.grad_weight = *a->grad_weight;
        else view4(&c.grad_weight, a->grad_weight, s, st);
    }
    if (a->grad_bias_a) {
        BIE_TRY(grad_check(ctx, &c, "grad_bias_a", a->grad_bias_a));
        BIE_TRY(bie_op_check_shape(ctx, "grad_bias_a", a->grad_bias_a, 1, &c.g.C));
        c.grad_bias_a = *a->grad_bias_a;
    }
    if (a->grad_scale_a) {
        BIE_TRY(grad_check(ctx, &c, "grad_scale_a", a->grad_scale_a));
        if (bie_tensor_numel(a->grad_scale_a) != 1) BIE_FAIL("grad_scale_a: must hold exactly one element");
        c.grad_scale_a = *a->grad_scale_a;
    }
    const struct bie_tensor * outs[4] = {a->grad_x, a->grad_weight, a->grad_scale_a, a->grad_bias_a};
    const struct bie_tensor * ins[9] = {a->x,      a->bias_a, a->weight,      a->scale_a,   a->scale_w,
                                        a->grad_y, a->x_mask, a->grad_x_mask, a->grad_x_add};
    static const char * const out_names[4] = {"grad_x", "grad_weight", "grad_scale_a", "grad_bias_a"};
    static const char * const in_names[9] = {"x",      "bias_a", "weight",      "scale_a",   "scale_w",
                                             "grad_y", "x_mask", "grad_x_mask", "grad_x_add"};
    BIE_TRY(bie_check_outputs(ctx, outs, out_names, 4, ins, in_names, 9));
    *cp = c;
    return BIE_STATUS_OK;
}

static enum bie_status backward(bie_context_t * ctx, const struct bie_linear_desc * lin,
                                const struct bie_conv2d_desc * conv, const struct bie_backward_args * a) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    struct bie_layer_call c;
    BIE_TRY(bie_layer_prepare_backward(ctx, lin, conv, a, &c));
    return bie_layer_run(ctx, &c, true);
}

enum bie_status bie_linear_forward(bie_context_t * ctx, const struct bie_linear_desc * desc,
                                   const struct bie_forward_args * args) {
    return forward(ctx, desc, NULL, args);
}

enum bie_status bie_linear_backward(bie_context_t * ctx, const struct bie_linear_desc * desc,
                                    const struct bie_backward_args * args) {
    return backward(ctx, desc, NULL, args);
}

enum bie_status bie_conv2d_forward(bie_context_t * ctx, const struct bie_conv2d_desc * desc,
                                   const struct bie_forward_args * args) {
    return forward(ctx, NULL, desc, args);
}

enum bie_status bie_conv2d_backward(bie_context_t * ctx, const struct bie_conv2d_desc * desc,
                                    const struct bie_backward_args * args) {
    return backward(ctx, NULL, desc, args);
}

// bie_binarize_ste (clamped false: clamp and clamp_mask unused) and bie_binarize_ste_clamped.
static enum bie_status binarize(bie_context_t * ctx, const struct bie_tensor * x, bool clamped, float clamp,
                                const struct bie_tensor * bias_a, const struct bie_tensor * scale_a,
                                struct bie_tensor * bits, struct bie_tensor * mask, struct bie_tensor * clamp_mask) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    if (!bits && !mask && !clamp_mask)
        BIE_FAIL(clamped ? "bits, mask, clamp_mask: all are NULL (ask for at least one)"
                         : "bits, mask: both are NULL (ask for at least one)");
    if (clamped && !(isfinite(clamp) && clamp > 0.0f)) BIE_FAIL("clamp: %g must be finite and > 0", (double)clamp);
    if (mask && !scale_a) BIE_FAIL("scale_a: is NULL but the mask needs it");
    // the x side of a binary linear layer call, checked as the layer checks it
    struct bie_layer_call c;
    memset(&c, 0, sizeof c);
    c.quant = BIE_QUANT_BINARY;
    BIE_TRY(bie_check_tensor(ctx, "x", x, true));
    BIE_TRY(bie_op_check_float(ctx, "x", x));
    c.device_type = x->device_type;
    c.device_index = x->device_index;
    c.scales_on_host = true;
    if (x->ndim < 1) BIE_FAIL("x: must have at least one dimension");
    const int64_t K = x->shape[x->ndim - 1];
    BIE_TRY(linear_view(ctx, "x", x, NULL, K, &c.x));
    struct bie_geometry * g = &c.g;
    g->batch = c.x.shape[0];
    g->C = g->K = K;
    g->H = g->W = g->OH = g->OW = g->kh = g->kw = g->sh = g->sw = g->dh = g->dw = 1;
    if (bias_a) {
        BIE_TRY(bie_check_tensor(ctx, "bias_a", bias_a, true));
        BIE_TRY(check_device(ctx, &c, "bias_a", bias_a));
        BIE_TRY(bie_op_check_float(ctx, "bias_a", bias_a));
        BIE_TRY(bie_op_check_shape(ctx, "bias_a", bias_a, 1, &K));
        c.bias_a = *bias_a;
    }
    if (scale_a) BIE_TRY(check_scale(ctx, &c, "scale_a", scale_a, &c.scale_a_t, &c.scale_a));
    struct bie_tensor * outs[3] = {bits, mask, clamp_mask};
    struct bie_tensor views[3] = {{0}, {0}, {0}};
    const char * names[3] = {"bits", "mask", "clamp_mask"};
    for (int i = 0; i < 3; i++) {
        if (!outs[i]) continue;
        BIE_TRY(bie_check_tensor(ctx, names[i], outs[i], false));
        BIE_TRY(check_device(ctx, &c, names[i], outs[i]));
        if (outs[i]->dtype != BIE_DTYPE_B1)
            BIE_FAIL("%s: dtype %s is not b1", names[i], bie_dtype_name(outs[i]->dtype));
        BIE_TRY(linear_view(ctx, names[i], outs[i], x, K, &views[i]));
    }
    const struct bie_tensor * ins[3] = {x, bias_a, scale_a};
    static const char * const in_names[3] = {"x", "bias_a", "scale_a"};
    BIE_TRY(bie_check_outputs(ctx, (const struct bie_tensor * const *)outs, names, 3, ins, in_names, 3));
    const struct bie_ste_out o = {bits ? &views[0] : NULL, mask ? &views[1] : NULL, clamp_mask ? &views[2] : NULL,
                                  clamped ? clamp : 0.0f};
    const struct job j = {JOB_BINARIZE_STE, &c, &o};
    return dispatch(ctx, &j);
}

enum bie_status bie_binarize_ste(bie_context_t * ctx, const struct bie_tensor * x, const struct bie_tensor * bias_a,
                                 const struct bie_tensor * scale_a, struct bie_tensor * bits,
                                 struct bie_tensor * mask) {
    return binarize(ctx, x, false, 0.0f, bias_a, scale_a, bits, mask, NULL);
}

enum bie_status bie_binarize_ste_clamped(bie_context_t * ctx, const struct bie_tensor * x, float clamp,
                                         const struct bie_tensor * bias_a, const struct bie_tensor * scale_a,
                                         struct bie_tensor * bits, struct bie_tensor * mask,
                                         struct bie_tensor * clamp_mask) {
    return binarize(ctx, x, true, clamp, bias_a, scale_a, bits, mask, clamp_mask);
}

enum bie_status bie_conv2d_output_size(const struct bie_conv2d_desc * d, int64_t h, int64_t w, int64_t * out_h,
                                       int64_t * out_w) {
    if (!d || !out_h || !out_w || h <= 0 || w <= 0) return BIE_STATUS_INVALID_ARGUMENT;
    for (int i = 0; i < 2; i++)
        if (d->kernel[i] < 1 || d->stride[i] < 1 || d->padding[i] < 0 || d->dilation[i] < 1)
            return BIE_STATUS_INVALID_ARGUMENT;
    const int64_t eh = (int64_t)d->dilation[0] * (d->kernel[0] - 1) + 1;
    const int64_t ew = (int64_t)d->dilation[1] * (d->kernel[1] - 1) + 1;
    int64_t ph, pw; // the padded input (checked: h and w may be anything up to INT64_MAX)
    if (!bie_add_i64(h, 2 * (int64_t)d->padding[0], &ph) || !bie_add_i64(w, 2 * (int64_t)d->padding[1], &pw))
        return BIE_STATUS_INVALID_ARGUMENT;
    if (ph < eh || pw < ew) return BIE_STATUS_INVALID_ARGUMENT;
    *out_h = (ph - eh) / d->stride[0] + 1;
    *out_w = (pw - ew) / d->stride[1] + 1;
    return BIE_STATUS_OK;
}
