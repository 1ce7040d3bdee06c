// SPDX-License-Identifier: Apache-2.0
// pool.c: the public affine max-pool (bie_affine_maxpool2d_forward and _backward): validation into
// a struct bie_pool_call and dispatch. The math is bie_ref_affine_maxpool2d's and
// bie_ref_affine_maxpool2d_backward's (src/ref/ref-pool.c).
#include "core/checked.h"
#include "ops/op-impl.h"

#include <math.h>
#include <string.h>

// One spatial dimension: out = (in + 2*pad - k) / s + 1 under PyTorch's MaxPool2d rules.
static enum bie_status pool_extent(bie_context_t * ctx, const char * dim, int64_t in, int32_t k, int32_t s, int32_t pad,
                                   int64_t * out) {
    if (k < 1 || s < 1 || pad < 0 || 2 * (int64_t)pad > k)
        BIE_FAIL("desc: kernel_%s = %d, stride_%s = %d, pad_%s = %d: need kernel >= 1, stride >= 1 and "
                 "0 <= 2 * pad <= kernel",
                 dim, (int)k, dim, (int)s, dim, (int)pad);
    int64_t padded;
    if (!bie_add_i64(in, 2 * (int64_t)pad, &padded) || padded < k)
        BIE_FAIL("desc: a window of %d does not fit the input's %lld (padded by %d on each side)", (int)k,
                 (long long)in, (int)pad);
    *out = (padded - k) / s + 1;
    return BIE_STATUS_OK;
}

// A [C] f32 vector on the call's device (or absent).
static enum bie_status channel_vector(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                                      const struct bie_pool_call * c, struct bie_tensor * out) {
    memset(out, 0, sizeof *out);
    if (!t) return BIE_STATUS_OK;
    BIE_TRY(bie_check_tensor(ctx, name, t, true));
    BIE_TRY(bie_op_check_device(ctx, name, t, c->device_type, c->device_index));
    if (t->dtype != BIE_DTYPE_F32) BIE_FAIL("%s: dtype %s must be f32", name, bie_dtype_name(t->dtype));
    BIE_TRY(bie_op_check_shape(ctx, name, t, 1, &c->C));
    *out = *t;
    return BIE_STATUS_OK;
}

// The geometry of desc and of an [N, C, H, W] tensor t (x, or grad_z) into c.
static enum bie_status geometry(bie_context_t * ctx, const struct bie_affine_maxpool2d_desc * d, const char * name,
                                const struct bie_tensor * t, struct bie_pool_call * c) {
    if (isnan(d->lo) || isnan(d->hi) || !(d->lo <= d->hi))
        BIE_FAIL("desc: the clamp [lo, hi] = [%g, %g] must have lo <= hi (no NaN)", (double)d->lo, (double)d->hi);
    if (t->ndim != 4) BIE_FAIL("%s: must be 4-D [N, C, H, W], has %d dims", name, (int)t->ndim);
    c->device_type = t->device_type;
    c->device_index = t->device_index;
    c->kh = d->kernel_h, c->kw = d->kernel_w, c->sh = d->stride_h, c->sw = d->stride_w;
    c->ph = d->pad_h, c->pw = d->pad_w, c->lo = d->lo, c->hi = d->hi;
    c->N = t->shape[0], c->C = t->shape[1], c->H = t->shape[2], c->W = t->shape[3];
    BIE_TRY(pool_extent(ctx, "h", c->H, c->kh, c->sh, c->ph, &c->OH));
    BIE_TRY(pool_extent(ctx, "w", c->W, c->kw, c->sw, c->pw, &c->OW));
    return BIE_STATUS_OK;
}

// argmax: U8 [N, C, OH, OW] on the call's device (an output of the forward, an input of the
// backward), for windows of at most 255 positions.
static enum bie_status argmax_view(bie_context_t * ctx, const struct bie_tensor * t, const struct bie_pool_call * c,
                                   bool input) {
    BIE_TRY(bie_check_tensor(ctx, "argmax", t, input)); // (an output may not repeat elements)
    BIE_TRY(bie_op_check_device(ctx, "argmax", t, c->device_type, c->device_index));
    if (t->dtype != BIE_DTYPE_U8) BIE_FAIL("argmax: dtype %s must be u8", bie_dtype_name(t->dtype));
    if ((int64_t)c->kh * c->kw > 255)
        BIE_FAIL("argmax: a window of %d x %d positions does not fit a byte (at most 255)", (int)c->kh, (int)c->kw);
    const int64_t ys[4] = {c->N, c->C, c->OH, c->OW};
    return bie_op_check_shape(ctx, "argmax", t, 4, ys);
}

static enum bie_status prepare(bie_context_t * ctx, const struct bie_affine_maxpool2d_desc * d,
                               const struct bie_affine_maxpool2d_args * a, struct bie_pool_call * c) {
    memset(c, 0, sizeof *c);
    if (!d) BIE_FAIL("desc: is NULL");
    if (!a) BIE_FAIL("args: is NULL");
    if (!a->x) BIE_FAIL("x: is NULL");
    if (!a->y) BIE_FAIL("y: is NULL");
    BIE_TRY(bie_check_tensor(ctx, "x", a->x, true));
    BIE_TRY(bie_op_check_float(ctx, "x", a->x));
    BIE_TRY(geometry(ctx, d, "x", a->x, c));
    c->x = *a->x;
    const int64_t yshape[4] = {c->N, c->C, c->OH, c->OW};
    BIE_TRY(bie_op_check_grad(ctx, "y", a->y, c->device_type, c->device_index));
    BIE_TRY(bie_op_check_shape(ctx, "y", a->y, 4, yshape));
    c->y = *a->y;
    BIE_TRY(channel_vector(ctx, "mul", a->mul, c, &c->mul));
    BIE_TRY(channel_vector(ctx, "add", a->add, c, &c->add));
    BIE_TRY(channel_vector(ctx, "out_bits_bias", a->out_bits_bias, c, &c->bits_bias));
    if (a->out_bits_bias && !a->out_bits) BIE_FAIL("out_bits_bias: given without out_bits");
    if (a->out_bits) {
        BIE_TRY(bie_check_tensor(ctx, "out_bits", a->out_bits, false));
        BIE_TRY(bie_op_check_device(ctx, "out_bits", a->out_bits, c->device_type, c->device_index));
        if (a->out_bits->dtype != BIE_DTYPE_B1)
            BIE_FAIL("out_bits: dtype %s must be b1", bie_dtype_name(a->out_bits->dtype));
        BIE_TRY(bie_op_check_shape(ctx, "out_bits", a->out_bits, 4, yshape));
        c->out_bits = *a->out_bits;
    }
    if (a->argmax) {
        BIE_TRY(argmax_view(ctx, a->argmax, c, false));
        c->argmax = *a->argmax;
    }
    const struct bie_tensor *outs[3] = {a->y, a->out_bits, a->argmax},
                            *ins[4] = {a->x, a->mul, a->add, a->out_bits_bias};
    static const char *const out_names[3] = {"y", "out_bits", "argmax"}, *const in_names[4] = {"x", "mul", "add",
                                                                                               "out_bits_bias"};
    return bie_check_outputs(ctx, outs, out_names, 3, ins, in_names, 4);
}

static enum bie_status run_slot(bie_context_t * ctx, const struct bie_backend_ops * b, const void * p) {
    return b->affine_maxpool2d ? b->affine_maxpool2d(ctx, p) : BIE_DECLINED;
}

enum bie_status bie_affine_maxpool2d_forward(bie_context_t * ctx, const struct bie_affine_maxpool2d_desc * desc,
                                             const struct bie_affine_maxpool2d_args * args) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    struct bie_pool_call c;
    BIE_TRY(prepare(ctx, desc, args, &c));
    return bie_dispatch(ctx, c.device_type, run_slot, &c, "this affine max-pool");
}

static enum bie_status prepare_backward(bie_context_t * ctx, const struct bie_affine_maxpool2d_desc * d,
                                        const struct bie_affine_maxpool2d_backward_args * a, struct bie_pool_call * c) {
    memset(c, 0, sizeof *c);
    if (!d) BIE_FAIL("desc: is NULL");
    if (!a) BIE_FAIL("args: is NULL");
    if (!a->grad_z) BIE_FAIL("grad_z: is NULL");
    if (!a->grad_y) BIE_FAIL("grad_y: is NULL");
    if (!a->argmax) BIE_FAIL("argmax: is NULL");
    BIE_TRY(bie_check_tensor(ctx, "grad_z", a->grad_z, false));
    BIE_TRY(bie_op_check_float(ctx, "grad_z", a->grad_z));
    BIE_TRY(geometry(ctx, d, "grad_z", a->grad_z, c));
    c->x = *a->grad_z;
    BIE_TRY(argmax_view(ctx, a->argmax, c, true));
    c->argmax = *a->argmax;
    const int64_t ys[4] = {c->N, c->C, c->OH, c->OW};
    BIE_TRY(bie_check_tensor(ctx, "grad_y", a->grad_y, true));
    BIE_TRY(bie_op_check_device(ctx, "grad_y", a->grad_y, c->device_type, c->device_index));
    BIE_TRY(bie_op_check_float(ctx, "grad_y", a->grad_y));
    BIE_TRY(bie_op_check_shape(ctx, "grad_y", a->grad_y, 4, ys));
    c->y = *a->grad_y;
    const struct bie_tensor *outs[1] = {a->grad_z}, *ins[2] = {a->argmax, a->grad_y};
    static const char *const out_names[1] = {"grad_z"}, *const in_names[2] = {"argmax", "grad_y"};
    return bie_check_outputs(ctx, outs, out_names, 1, ins, in_names, 2);
}

static enum bie_status run_backward_slot(bie_context_t * ctx, const struct bie_backend_ops * b, const void * p) {
    return b->affine_maxpool2d_backward ? b->affine_maxpool2d_backward(ctx, p) : BIE_DECLINED;
}

enum bie_status bie_affine_maxpool2d_backward(bie_context_t * ctx, const struct bie_affine_maxpool2d_desc * desc,
                                              const struct bie_affine_maxpool2d_backward_args * args) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    struct bie_pool_call c;
    BIE_TRY(prepare_backward(ctx, desc, args, &c));
    return bie_dispatch(ctx, c.device_type, run_backward_slot, &c, "this affine max-pool backward");
}
