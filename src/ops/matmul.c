// SPDX-License-Identifier: Apache-2.0
// matmul.c: the public batched matmul of two activations (bie_matmul_forward / _backward):
// validation into a struct bie_matmul_call, dispatch, and the view of one batch as a linear layer
// call (bie_matmul_layer_call), through which the fast backends reuse the layers' kernels.
#include "ops/op-impl.h"

#include <stdio.h>
#include <string.h>

static const char * quant_name(enum bie_quant q) {
    return q == BIE_QUANT_BINARY ? "binary" : q == BIE_QUANT_INT4 ? "4-bit" : "8-bit";
}

// An operand [..., R, K] (x or y): float, at least 2 dims, leading dims merged into [B, R, K].
static enum bie_status operand(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                               struct bie_matmul_call * c, struct bie_tensor * out) {
    if (!t) BIE_FAIL("%s: is NULL", name);
    BIE_TRY(bie_check_tensor(ctx, name, t, true));
    BIE_TRY(bie_op_check_device(ctx, name, t, c->device_type, c->device_index));
    BIE_TRY(bie_op_check_float(ctx, name, t));
    if (t->ndim < 2) BIE_FAIL("%s: must have at least 2 dimensions [..., rows, K], has %d", name, (int)t->ndim);
    return bie_op_merge_leading(ctx, name, t, t->ndim - 2, out);
}

// A tensor shaped like `like` (x, y or out: its leading dims, then rows x cols), merged to 3-D.
static enum bie_status like_view(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                                 const struct bie_tensor * like, int64_t rows, int64_t cols, struct bie_tensor * out) {
    int64_t shape[BIE_MAX_DIMS];
    memcpy(shape, like->shape, sizeof shape);
    shape[like->ndim - 2] = rows;
    shape[like->ndim - 1] = cols;
    BIE_TRY(bie_op_check_shape(ctx, name, t, like->ndim, shape));
    return bie_op_merge_leading(ctx, name, t, t->ndim - 2, out);
}

static enum bie_status prepare(bie_context_t * ctx, const struct bie_matmul_desc * desc, const struct bie_tensor * x,
                               const struct bie_tensor * y, const struct bie_tensor * x_clip,
                               const struct bie_tensor * y_clip, struct bie_matmul_call * c) {
    memset(c, 0, sizeof *c);
    if (!desc) BIE_FAIL("desc: is NULL");
    c->quant = desc->quant;
    if (c->quant != BIE_QUANT_BINARY && c->quant != BIE_QUANT_INT4 && c->quant != BIE_QUANT_INT8)
        BIE_FAIL("desc: quant = %d must be 1, 4 or 8", (int)c->quant);
    if (!x) BIE_FAIL("x: is NULL");
    BIE_TRY(bie_check_tensor(ctx, "x", x, true));
    c->device_type = x->device_type;
    c->device_index = x->device_index;
    BIE_TRY(operand(ctx, "x", x, c, &c->x));
    BIE_TRY(operand(ctx, "y", y, c, &c->y));
    bool same = x->ndim == y->ndim;
    for (int32_t i = 0; same && i < x->ndim - 2; i++) same = x->shape[i] == y->shape[i];
    if (!same) BIE_FAIL("y: its leading dimensions must equal x's (no broadcasting)");
    if (x->shape[x->ndim - 1] != y->shape[y->ndim - 1])
        BIE_FAIL("y: last dimension is %lld, x's is %lld (both are K: out = x @ y^T)", (long long)y->shape[y->ndim - 1],
                 (long long)x->shape[x->ndim - 1]);
    c->B = c->x.shape[0];
    c->M = c->x.shape[1];
    c->N = c->y.shape[1];
    c->K = c->x.shape[2];
    if (c->K > INT32_MAX / 4) BIE_FAIL("x: K = %lld is too large for 32-bit accumulation", (long long)c->K);
    c->clips_on_host = true;
    BIE_TRY(bie_op_check_scale(ctx, "x_clip", x_clip, c->device_type, c->device_index, &c->x_clip, &c->clips_on_host));
    BIE_TRY(bie_op_check_scale(ctx, "y_clip", y_clip, c->device_type, c->device_index, &c->y_clip, &c->clips_on_host));
    c->x_clip_t = *x_clip;
    c->y_clip_t = *y_clip;
    return BIE_STATUS_OK;
}

struct job {
    const struct bie_matmul_call * c;
    bool backward;
};

static enum bie_status run_slot(bie_context_t * ctx, const struct bie_backend_ops * b, const void * p) {
    const struct job * j = p;
    enum bie_status (*f)(bie_context_t *, const struct bie_matmul_call *) =
        j->backward ? b->matmul_backward : b->matmul_forward;
    return f ? f(ctx, j->c) : BIE_DECLINED;
}

static enum bie_status dispatch(bie_context_t * ctx, const struct bie_matmul_call * c, bool backward) {
    char what[64];
    snprintf(what, sizeof what, "this %s matmul %s", quant_name(c->quant), backward ? "backward" : "forward");
    const struct job j = {c, backward};
    return bie_dispatch(ctx, c->device_type, run_slot, &j, what);
}

enum bie_status bie_matmul_forward(bie_context_t * ctx, const struct bie_matmul_desc * desc,
                                   const struct bie_matmul_args * a) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    if (!a) BIE_FAIL("args: is NULL");
    struct bie_matmul_call c;
    BIE_TRY(prepare(ctx, desc, a->x, a->y, a->x_clip, a->y_clip, &c));
    if (!a->out) BIE_FAIL("out: is NULL");
    BIE_TRY(bie_check_tensor(ctx, "out", a->out, false));
    BIE_TRY(bie_op_check_device(ctx, "out", a->out, c.device_type, c.device_index));
    if (!bie_dtype_is_float(a->out->dtype) && a->out->dtype != BIE_DTYPE_I32)
        BIE_FAIL("out: dtype %s is not supported (f32, f16, bf16 or i32)", bie_dtype_name(a->out->dtype));
    BIE_TRY(like_view(ctx, "out", a->out, a->x, c.M, c.N, &c.out));
    return dispatch(ctx, &c, false);
}

enum bie_status bie_matmul_backward(bie_context_t * ctx, const struct bie_matmul_desc * desc,
                                    const struct bie_matmul_backward_args * a) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    if (!a) BIE_FAIL("args: is NULL");
    struct bie_matmul_call c;
    BIE_TRY(prepare(ctx, desc, a->x, a->y, a->x_clip, a->y_clip, &c));
    if (!a->grad_out) BIE_FAIL("grad_out: is NULL");
    BIE_TRY(bie_check_tensor(ctx, "grad_out", a->grad_out, true));
    BIE_TRY(bie_op_check_device(ctx, "grad_out", a->grad_out, c.device_type, c.device_index));
    BIE_TRY(bie_op_check_float(ctx, "grad_out", a->grad_out));
    BIE_TRY(like_view(ctx, "grad_out", a->grad_out, a->x, c.M, c.N, &c.grad_out));
    if (a->grad_x) {
        BIE_TRY(bie_op_check_grad(ctx, "grad_x", a->grad_x, c.device_type, c.device_index));
        BIE_TRY(like_view(ctx, "grad_x", a->grad_x, a->x, c.M, c.K, &c.grad_x));
    }
    if (a->grad_y) {
        BIE_TRY(bie_op_check_grad(ctx, "grad_y", a->grad_y, c.device_type, c.device_index));
        BIE_TRY(like_view(ctx, "grad_y", a->grad_y, a->y, c.N, c.K, &c.grad_y));
    }
    struct bie_tensor * clips[2] = {a->grad_x_clip, a->grad_y_clip};
    struct bie_tensor * dst[2] = {&c.grad_x_clip, &c.grad_y_clip};
    const char * names[2] = {"grad_x_clip", "grad_y_clip"};
    for (int i = 0; i < 2; i++) {
        if (!clips[i]) continue;
        BIE_TRY(bie_op_check_grad(ctx, names[i], clips[i], c.device_type, c.device_index));
        if (bie_tensor_numel(clips[i]) != 1) BIE_FAIL("%s: must hold exactly one element", names[i]);
        *dst[i] = *clips[i];
    }
    if (!c.grad_x.data && !c.grad_y.data && !c.grad_x_clip.data && !c.grad_y_clip.data) return BIE_STATUS_OK;
    return dispatch(ctx, &c, true);
}

// Element `off` of a byte-addressed dtype (float, I32) as a pointer.
static void * at(const struct bie_tensor * t, int64_t off) {
    return (char *)t->data + off * (bie_dtype_bits(t->dtype) / 8);
}

// Batch b of a 3-D view [B, R, C] as the 4-D [R, C, 1, 1] view of a linear layer (transposed:
// [C, R, 1, 1]); an absent tensor stays absent.
static void slice(const struct bie_tensor * t, int64_t b, bool transposed, struct bie_tensor * out) {
    memset(out, 0, sizeof *out);
    if (!t->data) return;
    *out = *t;
    out->data = at(t, b * t->stride[0]);
    out->ndim = 4;
    const int r = transposed ? 2 : 1, cc = transposed ? 1 : 2;
    out->shape[0] = t->shape[r];
    out->stride[0] = t->stride[r];
    out->shape[1] = t->shape[cc];
    out->stride[1] = t->stride[cc];
    out->shape[2] = out->shape[3] = 1;
    out->stride[2] = out->stride[3] = 0;
}

void bie_matmul_layer_call(const struct bie_matmul_call * mc, int64_t b, int side, struct bie_layer_call * lc) {
    memset(lc, 0, sizeof *lc);
    lc->quant = mc->quant;
    lc->is_conv = false;
    struct bie_geometry * g = &lc->g;
    g->batch = side ? mc->N : mc->M;
    g->C = g->K = mc->K;
    g->O = side ? mc->M : mc->N;
    g->H = g->W = g->OH = g->OW = g->kh = g->kw = g->sh = g->sw = g->dh = g->dw = 1;
    g->pad_value = BIE_PAD_ZERO;
    slice(side ? &mc->y : &mc->x, b, false, &lc->x);
    slice(side ? &mc->x : &mc->y, b, false, &lc->weight);
    if (!side) slice(&mc->out, b, false, &lc->y);
    slice(&mc->grad_out, b, side != 0, &lc->grad_y);
    slice(side ? &mc->grad_y : &mc->grad_x, b, false, &lc->grad_x);
    lc->scale_a_t = side ? mc->y_clip_t : mc->x_clip_t;
    lc->scale_w_t = side ? mc->x_clip_t : mc->y_clip_t;
    lc->scale_a = side ? mc->y_clip : mc->x_clip;
    lc->scale_w = side ? mc->x_clip : mc->y_clip;
    lc->scales_on_host = mc->clips_on_host;
    lc->device_type = mc->device_type;
    lc->device_index = mc->device_index;
}
