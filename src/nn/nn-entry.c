// SPDX-License-Identifier: Apache-2.0
// nn-entry.c: the public entry points of the float building blocks and optimizers (bie-train.h):
// each checks its tensor views (dtype, shape against the others, CPU, dense row-major, outputs
// overlapping nothing they may not) and runs the kernel of nn-ops.c or optim.c on their data.
#include "bie-cuda-plugin.h"
#include "bie-impl.h"
#include "nn/nn-kernels.h"
#include "ops/op-impl.h"

#include <stdbool.h>
#include <string.h>

enum bie_status bie_nn_check_dense(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                                   enum bie_dtype dtype) {
    BIE_TRY(bie_check_tensor(ctx, name, t, false));
    if (t->dtype != dtype) BIE_FAIL("%s: dtype %s, expected %s", name, bie_dtype_name(t->dtype), bie_dtype_name(dtype));
    if (t->device_type != BIE_DEVICE_CPU) BIE_FAIL("%s: must be a CPU tensor", name);
    int64_t expect = 1;
    for (int32_t i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] > 1 && t->stride[i] != expect)
            BIE_FAIL("%s: stride[%d] = %lld, expected %lld: only dense row-major views are supported", name, (int)i,
                     (long long)t->stride[i], (long long)expect);
        expect *= t->shape[i];
    }
    return BIE_STATUS_OK;
}

static bool same_shape(const struct bie_tensor * a, const struct bie_tensor * b) {
    if (a->ndim != b->ndim) return false;
    for (int32_t i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

// t is dense of dtype with like's shape (like already checked).
static enum bie_status check_like(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                                  enum bie_dtype dtype, const char * like_name, const struct bie_tensor * like) {
    BIE_TRY(bie_nn_check_dense(ctx, name, t, dtype));
    if (!same_shape(t, like)) BIE_FAIL("%s: its shape must be %s's", name, like_name);
    return BIE_STATUS_OK;
}

enum bie_status bie_nn_check_shape(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                                   enum bie_dtype dtype, int32_t ndim, const int64_t * shape) {
    BIE_TRY(bie_nn_check_dense(ctx, name, t, dtype));
    bool ok = t->ndim == ndim;
    for (int32_t i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        if (ndim == 1) BIE_FAIL("%s: must be 1-D [%lld]", name, (long long)shape[0]);
        if (ndim == 2) BIE_FAIL("%s: must be [%lld, %lld]", name, (long long)shape[0], (long long)shape[1]);
        BIE_FAIL("%s: must be [%lld, %lld, %lld, %lld]", name, (long long)shape[0], (long long)shape[1],
                 (long long)shape[2], (long long)shape[3]);
    }
    return BIE_STATUS_OK;
}

// x [n, c, ...] of a batch norm: n, c and hw (the product of the rest).
static enum bie_status bn_dims(bie_context_t * ctx, const struct bie_tensor * x, int64_t * n, int64_t * c,
                               int64_t * hw) {
    BIE_TRY(bie_nn_check_dense(ctx, "x", x, BIE_DTYPE_F32));
    if (x->ndim < 2) BIE_FAIL("x: must be [n, c, ...] (ndim %d)", (int)x->ndim);
    *n = x->shape[0];
    *c = x->shape[1];
    *hw = 1;
    for (int32_t i = 2; i < x->ndim; i++) *hw *= x->shape[i]; // bounded by the checked numel
    return BIE_STATUS_OK;
}

// --- batch norm on CUDA tensors (src/cuda/cuda-batchnorm.cu) ---

// t well formed on x's device: an output with no repeated elements, an input of any strides.
static enum bie_status bn_on_device(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                                    const struct bie_tensor * x, bool output) {
    if (output) return bie_op_check_grad(ctx, name, t, x->device_type, x->device_index);
    BIE_TRY(bie_check_tensor(ctx, name, t, true));
    return bie_op_check_device(ctx, name, t, x->device_type, x->device_index);
}

// t (NULL: absent, *out zeroed) as the [N, C, H, W] view of a CUDA batch norm: f32, f16 or bf16 on
// x's device, of x's shape (2 to 4 dimensions, the missing ones of extent 1).
static enum bie_status bn_view4(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                                const struct bie_tensor * x, bool output, struct bie_tensor * out) {
    memset(out, 0, sizeof *out);
    if (!t) return BIE_STATUS_OK;
    BIE_TRY(bn_on_device(ctx, name, t, x, output));
    BIE_TRY(bie_op_check_float(ctx, name, t));
    if (t->ndim < 2 || t->ndim > 4)
        BIE_FAIL("%s: must be [n, c], [n, c, l] or [n, c, h, w] on CUDA (ndim %d)", name, (int)t->ndim);
    if (!same_shape(t, x)) BIE_FAIL("%s: its shape must be x's", name);
    *out = *t;
    for (int32_t i = t->ndim; i < 4; i++) {
        out->shape[i] = 1;
        out->stride[i] = 0;
    }
    out->ndim = 4;
    return BIE_STATUS_OK;
}

// A [C] vector of a CUDA batch norm on x's device: f32 (f32_only) or f32 / f16 / bf16; an absent
// one is refused when required, else *out is zeroed.
static enum bie_status bn_vector(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                                 const struct bie_tensor * x, bool output, bool f32_only, bool required,
                                 struct bie_tensor * out) {
    memset(out, 0, sizeof *out);
    if (!t) {
        if (required) BIE_FAIL("%s: is NULL", name);
        return BIE_STATUS_OK;
    }
    BIE_TRY(bn_on_device(ctx, name, t, x, output));
    if (f32_only && t->dtype != BIE_DTYPE_F32) BIE_FAIL("%s: dtype %s must be f32", name, bie_dtype_name(t->dtype));
    BIE_TRY(bie_op_check_float(ctx, name, t));
    BIE_TRY(bie_op_check_shape(ctx, name, t, 1, &x->shape[1]));
    *out = *t;
    return BIE_STATUS_OK;
}

// The batch counter of a training call (num_batches; NULL: none): one I64 element on x's device.
static enum bie_status bn_counter(bie_context_t * ctx, const struct bie_tensor * t, const struct bie_tensor * x) {
    if (!t) return BIE_STATUS_OK;
    BIE_TRY(bie_check_tensor(ctx, "num_batches", t, false));
    BIE_TRY(bie_op_check_device(ctx, "num_batches", t, x->device_type, x->device_index));
    if (t->dtype != BIE_DTYPE_I64) BIE_FAIL("num_batches: dtype %s must be i64", bie_dtype_name(t->dtype));
    if (bie_tensor_numel(t) != 1)
        BIE_FAIL("num_batches: must hold one element (has %lld)", (long long)bie_tensor_numel(t));
    return BIE_STATUS_OK;
}

// No output of a batch norm forward overlaps another or an input.
static enum bie_status bn_forward_overlaps(bie_context_t * ctx, const struct bie_batchnorm_args * a) {
    const struct bie_tensor * outs[] = {a->y,          a->running_mean, a->running_var,
                                        a->saved_mean, a->saved_invstd, a->num_batches};
    const char * out_names[] = {"y", "running_mean", "running_var", "saved_mean", "saved_invstd", "num_batches"};
    const struct bie_tensor * ins[] = {a->x, a->gamma, a->beta, a->residual};
    const char * in_names[] = {"x", "gamma", "beta", "residual"};
    return bie_check_outputs(ctx, outs, out_names, 6, ins, in_names, 4);
}

static enum bie_status bn_forward_cuda(bie_context_t * ctx, const struct bie_batchnorm_desc * d,
                                       const struct bie_batchnorm_args * a) {
    struct bie_bn_call c;
    memset(&c, 0, sizeof c);
    const struct bie_tensor * x = a->x;
    if (!a->y && !d->training) BIE_FAIL("y: is NULL (only a training call may leave it out)");
    BIE_TRY(bn_view4(ctx, "x", x, x, false, &c.x));
    BIE_TRY(bn_view4(ctx, "y", a->y, x, true, &c.y));
    BIE_TRY(bn_view4(ctx, "residual", a->residual, x, false, &c.residual));
    BIE_TRY(bn_vector(ctx, "gamma", a->gamma, x, false, false, true, &c.gamma));
    BIE_TRY(bn_vector(ctx, "beta", a->beta, x, false, false, true, &c.beta));
    BIE_TRY(bn_vector(ctx, "running_mean", a->running_mean, x, true, false, true, &c.running_mean));
    BIE_TRY(bn_vector(ctx, "running_var", a->running_var, x, true, false, true, &c.running_var));
    BIE_TRY(bn_vector(ctx, "saved_mean", a->saved_mean, x, true, true, d->training, &c.saved_mean));
    BIE_TRY(bn_vector(ctx, "saved_invstd", a->saved_invstd, x, true, true, d->training, &c.saved_invstd));
    BIE_TRY(bn_counter(ctx, a->num_batches, x));
    if (!(d->eps > 0)) BIE_FAIL("desc: eps must be > 0");
    if (!(d->momentum >= 0 && d->momentum <= 1)) BIE_FAIL("desc: momentum must be in [0, 1]");
    c.N = c.x.shape[0], c.C = c.x.shape[1], c.H = c.x.shape[2], c.W = c.x.shape[3];
    c.momentum = d->momentum, c.eps = d->eps, c.training = d->training != 0;
    c.device_index = x->device_index;
    c.num_batches = d->training && a->num_batches ? (int64_t *)a->num_batches->data : NULL;
    BIE_TRY(bn_forward_overlaps(ctx, a));
    const struct bie_cuda_plugin * p;
    BIE_TRY(bie_cuda_plugin_get(ctx, "x", &p));
    return p->batchnorm_forward(ctx, &c);
}

static enum bie_status bn_backward_cuda(bie_context_t * ctx, const struct bie_batchnorm_backward_args * a) {
    struct bie_bn_call c;
    memset(&c, 0, sizeof c);
    const struct bie_tensor * x = a->x;
    if (!a->grad_y) BIE_FAIL("grad_y: is NULL");
    BIE_TRY(bn_view4(ctx, "x", x, x, false, &c.x));
    BIE_TRY(bn_view4(ctx, "grad_y", a->grad_y, x, false, &c.grad_y));
    BIE_TRY(bn_view4(ctx, "grad_x", a->grad_x, x, true, &c.grad_x));
    BIE_TRY(bn_vector(ctx, "gamma", a->gamma, x, false, false, true, &c.gamma));
    BIE_TRY(bn_vector(ctx, "saved_mean", a->saved_mean, x, false, true, true, &c.saved_mean));
    BIE_TRY(bn_vector(ctx, "saved_invstd", a->saved_invstd, x, false, true, true, &c.saved_invstd));
    BIE_TRY(bn_vector(ctx, "grad_gamma", a->grad_gamma, x, true, false, true, &c.grad_gamma));
    BIE_TRY(bn_vector(ctx, "grad_beta", a->grad_beta, x, true, false, true, &c.grad_beta));
    c.N = c.x.shape[0], c.C = c.x.shape[1], c.H = c.x.shape[2], c.W = c.x.shape[3];
    c.device_index = x->device_index;
    const struct bie_tensor * outs[] = {a->grad_x, a->grad_gamma, a->grad_beta};
    const char * out_names[] = {"grad_x", "grad_gamma", "grad_beta"};
    const struct bie_tensor * ins[] = {x, a->gamma, a->saved_mean, a->saved_invstd, a->grad_y};
    const char * in_names[] = {"x", "gamma", "saved_mean", "saved_invstd", "grad_y"};
    BIE_TRY(bie_check_outputs(ctx, outs, out_names, 3, ins, in_names, 5));
    const struct bie_cuda_plugin * p;
    BIE_TRY(bie_cuda_plugin_get(ctx, "x", &p));
    return p->batchnorm_backward(ctx, &c);
}

static bool on_cuda(const struct bie_tensor * x) { return x && x->device_type == BIE_DEVICE_CUDA; }

enum bie_status bie_batchnorm_forward(bie_context_t * ctx, const struct bie_batchnorm_desc * desc,
                                      const struct bie_batchnorm_args * a) {
    BIE_ENTER(ctx);
    if (!desc || !a) BIE_FAIL("desc, args: must not be NULL");
    if (on_cuda(a->x)) return bn_forward_cuda(ctx, desc, a);
    int64_t n = 0, c = 0, hw = 0;
    BIE_TRY(bn_dims(ctx, a->x, &n, &c, &hw));
    BIE_TRY(bie_nn_check_shape(ctx, "gamma", a->gamma, BIE_DTYPE_F32, 1, &c));
    BIE_TRY(bie_nn_check_shape(ctx, "beta", a->beta, BIE_DTYPE_F32, 1, &c));
    BIE_TRY(bie_nn_check_shape(ctx, "running_mean", a->running_mean, BIE_DTYPE_F32, 1, &c));
    BIE_TRY(bie_nn_check_shape(ctx, "running_var", a->running_var, BIE_DTYPE_F32, 1, &c));
    if (desc->training || a->saved_mean)
        BIE_TRY(bie_nn_check_shape(ctx, "saved_mean", a->saved_mean, BIE_DTYPE_F32, 1, &c));
    if (desc->training || a->saved_invstd)
        BIE_TRY(bie_nn_check_shape(ctx, "saved_invstd", a->saved_invstd, BIE_DTYPE_F32, 1, &c));
    if (a->y || !desc->training) BIE_TRY(check_like(ctx, "y", a->y, BIE_DTYPE_F32, "x", a->x));
    if (a->residual) BIE_TRY(check_like(ctx, "residual", a->residual, BIE_DTYPE_F32, "x", a->x));
    BIE_TRY(bn_counter(ctx, a->num_batches, a->x));
    BIE_TRY(bn_forward_overlaps(ctx, a));
    BIE_TRY(bie_nn_batchnorm_forward(ctx, n, c, hw, a->x->data, a->gamma->data, a->beta->data, a->running_mean->data,
                                     a->running_var->data, desc->momentum, desc->eps, desc->training,
                                     a->saved_mean ? a->saved_mean->data : NULL,
                                     a->saved_invstd ? a->saved_invstd->data : NULL,
                                     a->residual ? a->residual->data : NULL, a->y ? a->y->data : NULL));
    if (desc->training && a->num_batches) *(int64_t *)a->num_batches->data += 1;
    return BIE_STATUS_OK;
}

enum bie_status bie_batchnorm_backward(bie_context_t * ctx, const struct bie_batchnorm_backward_args * a) {
    BIE_ENTER(ctx);
    if (!a) BIE_FAIL("args: must not be NULL");
    if (on_cuda(a->x)) return bn_backward_cuda(ctx, a);
    int64_t n = 0, c = 0, hw = 0;
    BIE_TRY(bn_dims(ctx, a->x, &n, &c, &hw));
    BIE_TRY(bie_nn_check_shape(ctx, "gamma", a->gamma, BIE_DTYPE_F32, 1, &c));
    BIE_TRY(bie_nn_check_shape(ctx, "saved_mean", a->saved_mean, BIE_DTYPE_F32, 1, &c));
    BIE_TRY(bie_nn_check_shape(ctx, "saved_invstd", a->saved_invstd, BIE_DTYPE_F32, 1, &c));
    BIE_TRY(check_like(ctx, "grad_y", a->grad_y, BIE_DTYPE_F32, "x", a->x));
    if (a->grad_x) BIE_TRY(check_like(ctx, "grad_x", a->grad_x, BIE_DTYPE_F32, "x", a->x));
    BIE_TRY(bie_nn_check_shape(ctx, "grad_gamma", a->grad_gamma, BIE_DTYPE_F32, 1, &c));
    BIE_TRY(bie_nn_check_shape(ctx, "grad_beta", a->grad_beta, BIE_DTYPE_F32, 1, &c));
    const struct bie_tensor * outs[] = {a->grad_x, a->grad_gamma, a->grad_beta};
    const char * out_names[] = {"grad_x", "grad_gamma", "grad_beta"};
    const struct bie_tensor * ins[] = {a->x, a->gamma, a->saved_mean, a->saved_invstd, a->grad_y};
    const char * in_names[] = {"x", "gamma", "saved_mean", "saved_invstd", "grad_y"};
    BIE_TRY(bie_check_outputs(ctx, outs, out_names, 3, ins, in_names, 5));
    return bie_nn_batchnorm_backward(ctx, n, c, hw, a->x->data, a->gamma->data, a->saved_mean->data,
                                     a->saved_invstd->data, a->grad_y->data, a->grad_x ? a->grad_x->data : NULL,
                                     a->grad_gamma->data, a->grad_beta->data);
}

// x (or grad_x) [n, c, h, w] and k: the pooled shape [n, c, h/k, w/k].
static enum bie_status pool_dims(bie_context_t * ctx, const char * name, const struct bie_tensor * x,
                                 const struct bie_maxpool2d_desc * desc, int64_t pooled[4]) {
    BIE_TRY(bie_nn_check_dense(ctx, name, x, BIE_DTYPE_F32));
    if (x->ndim != 4) BIE_FAIL("%s: must be [n, c, h, w] (ndim %d)", name, (int)x->ndim);
    if (bie_tensor_numel(x) > INT32_MAX) BIE_FAIL("%s: more than 2^31 elements (argmax is int32)", name);
    const int32_t k = desc->k;
    if (k < 1 || k > x->shape[2] || k > x->shape[3])
        BIE_FAIL("desc.k: = %d must be in [1, min(h, w)] = [1, %lld]", (int)k,
                 (long long)(x->shape[2] < x->shape[3] ? x->shape[2] : x->shape[3]));
    pooled[0] = x->shape[0];
    pooled[1] = x->shape[1];
    pooled[2] = x->shape[2] / k;
    pooled[3] = x->shape[3] / k;
    return BIE_STATUS_OK;
}

enum bie_status bie_maxpool2d_forward(bie_context_t * ctx, const struct bie_maxpool2d_desc * desc,
                                      const struct bie_maxpool2d_args * a) {
    BIE_ENTER(ctx);
    if (!desc || !a) BIE_FAIL("desc, args: must not be NULL");
    int64_t ys[4] = {0};
    BIE_TRY(pool_dims(ctx, "x", a->x, desc, ys));
    BIE_TRY(bie_nn_check_shape(ctx, "y", a->y, BIE_DTYPE_F32, 4, ys));
    if (a->argmax) BIE_TRY(bie_nn_check_shape(ctx, "argmax", a->argmax, BIE_DTYPE_I32, 4, ys));
    const struct bie_tensor * outs[] = {a->y, a->argmax};
    const char * out_names[] = {"y", "argmax"};
    const struct bie_tensor * ins[] = {a->x};
    const char * in_names[] = {"x"};
    BIE_TRY(bie_check_outputs(ctx, outs, out_names, 2, ins, in_names, 1));
    const int64_t * s = a->x->shape;
    return bie_nn_maxpool2d_forward(ctx, s[0], s[1], s[2], s[3], desc->k, a->x->data, a->y->data,
                                    a->argmax ? a->argmax->data : NULL);
}

enum bie_status bie_maxpool2d_backward(bie_context_t * ctx, const struct bie_maxpool2d_desc * desc,
                                       const struct bie_maxpool2d_backward_args * a) {
    BIE_ENTER(ctx);
    if (!desc || !a) BIE_FAIL("desc, args: must not be NULL");
    int64_t ys[4] = {0};
    BIE_TRY(pool_dims(ctx, "grad_x", a->grad_x, desc, ys));
    BIE_TRY(bie_nn_check_shape(ctx, "grad_y", a->grad_y, BIE_DTYPE_F32, 4, ys));
    BIE_TRY(bie_nn_check_shape(ctx, "argmax", a->argmax, BIE_DTYPE_I32, 4, ys));
    const struct bie_tensor * outs[] = {a->grad_x};
    const char * out_names[] = {"grad_x"};
    const struct bie_tensor * ins[] = {a->grad_y, a->argmax};
    const char * in_names[] = {"grad_y", "argmax"};
    BIE_TRY(bie_check_outputs(ctx, outs, out_names, 1, ins, in_names, 2));
    const int64_t * s = a->grad_x->shape;
    return bie_nn_maxpool2d_backward(ctx, s[0], s[1], s[2], s[3], desc->k, a->grad_y->data, a->argmax->data,
                                     a->grad_x->data);
}

// An elementwise output `out` of in's shape: in place (the same data) or overlapping no input.
static enum bie_status check_elementwise_out(bie_context_t * ctx, const char * out_name, const struct bie_tensor * out,
                                             const char * in_name, const struct bie_tensor * in,
                                             const char * other_name, const struct bie_tensor * other) {
    BIE_TRY(check_like(ctx, out_name, out, BIE_DTYPE_F32, in_name, in));
    const struct bie_tensor * outs[] = {out};
    const struct bie_tensor * ins[] = {in, other};
    const char * in_names[] = {in_name, other_name};
    const bool in_place = out->data == in->data; // same shape, both dense: element i reads before it writes
    if (in_place) {
        ins[0] = other;
        in_names[0] = other_name;
    }
    return bie_check_outputs(ctx, outs, &out_name, 1, ins, in_names, (in_place ? 0 : 1) + (other ? 1 : 0));
}

enum bie_status bie_activation_forward(bie_context_t * ctx, enum bie_activation act,
                                       const struct bie_activation_args * a) {
    BIE_ENTER(ctx);
    if (!a) BIE_FAIL("args: must not be NULL");
    BIE_TRY(bie_nn_check_dense(ctx, "x", a->x, BIE_DTYPE_F32));
    BIE_TRY(check_elementwise_out(ctx, "y", a->y, "x", a->x, NULL, NULL));
    return bie_nn_activation_forward(ctx, act, bie_tensor_numel(a->x), a->x->data, a->y->data);
}

enum bie_status bie_activation_backward(bie_context_t * ctx, enum bie_activation act,
                                        const struct bie_activation_backward_args * a) {
    BIE_ENTER(ctx);
    if (!a) BIE_FAIL("args: must not be NULL");
    BIE_TRY(bie_nn_check_dense(ctx, "x", a->x, BIE_DTYPE_F32));
    BIE_TRY(check_like(ctx, "grad_y", a->grad_y, BIE_DTYPE_F32, "x", a->x));
    BIE_TRY(check_elementwise_out(ctx, "grad_x", a->grad_x, "grad_y", a->grad_y, "x", a->x));
    return bie_nn_activation_backward(ctx, act, bie_tensor_numel(a->x), a->x->data, a->grad_y->data, a->grad_x->data);
}

enum bie_status bie_softmax_cross_entropy(bie_context_t * ctx, const struct bie_softmax_cross_entropy_args * a) {
    BIE_ENTER(ctx);
    if (!a) BIE_FAIL("args: must not be NULL");
    BIE_TRY(bie_nn_check_dense(ctx, "logits", a->logits, BIE_DTYPE_F32));
    if (a->logits->ndim != 2) BIE_FAIL("logits: must be [n, classes] (ndim %d)", (int)a->logits->ndim);
    BIE_TRY(bie_nn_check_shape(ctx, "labels", a->labels, BIE_DTYPE_U8, 1, a->logits->shape));
    if (a->grad_logits) BIE_TRY(check_like(ctx, "grad_logits", a->grad_logits, BIE_DTYPE_F32, "logits", a->logits));
    const struct bie_tensor * outs[] = {a->grad_logits};
    const char * out_names[] = {"grad_logits"};
    const struct bie_tensor * ins[] = {a->logits, a->labels};
    const char * in_names[] = {"logits", "labels"};
    BIE_TRY(bie_check_outputs(ctx, outs, out_names, 1, ins, in_names, 2));
    return bie_nn_softmax_cross_entropy(ctx, a->logits->shape[0], a->logits->shape[1], a->logits->data, a->labels->data,
                                        a->loss, a->grad_logits ? a->grad_logits->data : NULL, a->correct);
}

// An optimizer's state: p (updated, of p_dtype), grad and the two state tensors (f32, p's shape).
static enum bie_status check_state(bie_context_t * ctx, const char * const names[4], struct bie_tensor * p,
                                   enum bie_dtype p_dtype, const struct bie_tensor * grad, struct bie_tensor * m,
                                   struct bie_tensor * v) {
    BIE_TRY(bie_nn_check_dense(ctx, names[0], p, p_dtype));
    BIE_TRY(check_like(ctx, names[1], grad, BIE_DTYPE_F32, names[0], p));
    BIE_TRY(check_like(ctx, names[2], m, BIE_DTYPE_F32, names[0], p));
    BIE_TRY(check_like(ctx, names[3], v, BIE_DTYPE_F32, names[0], p));
    const struct bie_tensor * outs[] = {p, m, v};
    const char * out_names[] = {names[0], names[2], names[3]};
    const struct bie_tensor * ins[] = {grad};
    return bie_check_outputs(ctx, outs, out_names, 3, ins, &names[1], 1);
}

enum bie_status bie_adam_step(bie_context_t * ctx, const struct bie_adam_params * params,
                              const struct bie_adam_args * a) {
    BIE_ENTER(ctx);
    if (!params || !a) BIE_FAIL("params, args: must not be NULL");
    static const char * const names[4] = {"p", "grad", "m", "v"};
    BIE_TRY(check_state(ctx, names, a->p, BIE_DTYPE_F32, a->grad, a->m, a->v));
    return bie_nn_adam_step(ctx, params, a->step, bie_tensor_numel(a->p), a->p->data, a->grad->data, a->m->data,
                            a->v->data);
}

enum bie_status bie_diode_init(bie_context_t * ctx, const struct bie_diode_init_args * a) {
    BIE_ENTER(ctx);
    if (!a) BIE_FAIL("args: must not be NULL");
    BIE_TRY(bie_nn_check_dense(ctx, "w", a->w, BIE_DTYPE_I8));
    BIE_TRY(check_like(ctx, "m", a->m, BIE_DTYPE_F32, "w", a->w));
    BIE_TRY(check_like(ctx, "s", a->s, BIE_DTYPE_F32, "w", a->w));
    const struct bie_tensor * outs[] = {a->m, a->s};
    const char * out_names[] = {"m", "s"};
    const struct bie_tensor * ins[] = {a->w};
    const char * in_names[] = {"w"};
    BIE_TRY(bie_check_outputs(ctx, outs, out_names, 2, ins, in_names, 1));
    return bie_nn_diode_init(ctx, bie_tensor_numel(a->w), a->w->data, a->seed, a->m->data, a->s->data);
}

enum bie_status bie_diode_step(bie_context_t * ctx, const struct bie_diode_params * params,
                               const struct bie_diode_args * a) {
    BIE_ENTER(ctx);
    if (!params || !a) BIE_FAIL("params, args: must not be NULL");
    static const char * const names[4] = {"w", "grad", "m", "s"};
    BIE_TRY(check_state(ctx, names, a->w, BIE_DTYPE_I8, a->grad, a->m, a->s));
    return bie_nn_diode_step(ctx, params, bie_tensor_numel(a->w), a->w->data, a->grad->data, a->m->data, a->s->data,
                             a->flips);
}
