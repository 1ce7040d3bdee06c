// SPDX-License-Identifier: Apache-2.0
// embedding.c: the public embedding lookup and its sparse backward (bie_embedding_forward /
// _backward): validation into a struct bie_embedding_call and dispatch. On the CPU the indices
// (and the inverse) are range-checked here; CUDA reads them on the device only.
#include "ops/op-impl.h"

#include <stdio.h>
#include <string.h>

static bool index_dtype(enum bie_dtype d) { return d == BIE_DTYPE_I32 || d == BIE_DTYPE_I64; }

// indices-shaped I32/I64 tensor as [R, L].
static enum bie_status index_view(bie_context_t * ctx, const char * name, const struct bie_tensor * t, bool bag,
                                  struct bie_embedding_call * c, struct bie_tensor * out) {
    BIE_TRY(bie_check_tensor(ctx, name, t, true));
    BIE_TRY(bie_op_check_device(ctx, name, t, c->device_type, c->device_index));
    if (!index_dtype(t->dtype)) BIE_FAIL("%s: dtype %s is not supported (i32 or i64)", name, bie_dtype_name(t->dtype));
    if (bag && t->ndim < 1) BIE_FAIL("%s: a bag needs at least one dimension (its last one holds a bag)", name);
    if (bag) return bie_op_merge_leading(ctx, name, t, t->ndim - 1, out);
    struct bie_tensor flat;
    BIE_TRY(bie_op_merge_leading(ctx, name, t, t->ndim, &flat)); // [numel]
    *out = flat;
    out->ndim = 2;
    out->shape[1] = 1;
    out->stride[1] = 0;
    return BIE_STATUS_OK;
}

// Every index of t [R, L] in [0, n) (CPU tensors only).
static enum bie_status check_range(bie_context_t * ctx, const char * name, const struct bie_tensor * t, int64_t n) {
    if (t->device_type != BIE_DEVICE_CPU) return BIE_STATUS_OK;
    for (int64_t i = 0; i < t->shape[0]; i++)
        for (int64_t l = 0; l < t->shape[1]; l++) {
            const int64_t off = i * t->stride[0] + l * t->stride[1];
            const int64_t v =
                t->dtype == BIE_DTYPE_I64 ? ((const int64_t *)t->data)[off] : ((const int32_t *)t->data)[off];
            if (v < 0 || v >= n)
                BIE_FAIL("%s: element %lld is %lld, outside [0, %lld)", name, (long long)(i * t->shape[1] + l),
                         (long long)v, (long long)n);
        }
    return BIE_STATUS_OK;
}

// The indices-shaped output (out, grad_out): the indices' shape (a bag: without its last dim) and D.
static enum bie_status out_view(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                                const struct bie_tensor * indices, struct bie_embedding_call * c,
                                struct bie_tensor * out) {
    const int32_t lead = c->bag ? indices->ndim - 1 : indices->ndim;
    int64_t shape[BIE_MAX_DIMS];
    if (lead + 1 > BIE_MAX_DIMS) BIE_FAIL("indices: too many dimensions for an output of one more");
    memcpy(shape, indices->shape, sizeof(int64_t) * (size_t)lead);
    shape[lead] = c->D;
    BIE_TRY(bie_op_check_shape(ctx, name, t, lead + 1, shape));
    return bie_op_merge_leading(ctx, name, t, lead, out);
}

static enum bie_status prepare(bie_context_t * ctx, const struct bie_embedding_desc * desc,
                               const struct bie_tensor * indices, const struct bie_tensor * table,
                               const struct bie_tensor * scale, struct bie_embedding_call * c) {
    memset(c, 0, sizeof *c);
    if (!desc) BIE_FAIL("desc: is NULL");
    c->quant = desc->quant;
    c->bag = desc->bag != 0;
    if (c->quant != BIE_QUANT_BINARY && c->quant != BIE_QUANT_INT4 && c->quant != BIE_QUANT_INT8)
        BIE_FAIL("desc: quant = %d must be 1, 4 or 8", (int)c->quant);
    if (!indices) BIE_FAIL("indices: is NULL");
    if (!table) BIE_FAIL("table: is NULL");
    BIE_TRY(bie_check_tensor(ctx, "indices", indices, true));
    c->device_type = indices->device_type;
    c->device_index = indices->device_index;
    BIE_TRY(index_view(ctx, "indices", indices, c->bag, c, &c->indices));
    c->R = c->indices.shape[0];
    c->L = c->indices.shape[1];
    BIE_TRY(bie_check_tensor(ctx, "table", table, true));
    BIE_TRY(bie_op_check_device(ctx, "table", table, c->device_type, c->device_index));
    if (table->ndim != 2) BIE_FAIL("table: must be 2-D [num_embeddings, embedding_dim], has %d dims", (int)table->ndim);
    const enum bie_dtype td = table->dtype;
    const bool ok = bie_dtype_is_float(td) || td == BIE_DTYPE_I8 ||
                    (td == BIE_DTYPE_B1 && c->quant == BIE_QUANT_BINARY) ||
                    (td == BIE_DTYPE_S4 && c->quant == BIE_QUANT_INT4);
    if (!ok)
        BIE_FAIL("table: dtype %s is not a %s table (%s, i8 or float)", bie_dtype_name(td),
                 c->quant == BIE_QUANT_BINARY ? "binary"
                 : c->quant == BIE_QUANT_INT4 ? "4-bit"
                                              : "8-bit",
                 c->quant == BIE_QUANT_BINARY ? "b1"
                 : c->quant == BIE_QUANT_INT4 ? "s4"
                                              : "i8");
    c->table = *table;
    c->V = table->shape[0];
    c->D = table->shape[1];
    if (scale) {
        BIE_TRY(bie_check_tensor(ctx, "scale", scale, true));
        BIE_TRY(bie_op_check_device(ctx, "scale", scale, c->device_type, c->device_index));
        BIE_TRY(bie_op_check_float(ctx, "scale", scale));
        BIE_TRY(bie_op_check_shape(ctx, "scale", scale, 1, &c->V));
        c->scale = *scale;
    } else if (bie_dtype_is_float(td) && c->quant != BIE_QUANT_BINARY) {
        BIE_FAIL("scale: is NULL, but a float table of an n-bit embedding is quantized with its per-row scales");
    }
    return check_range(ctx, "indices", &c->indices, c->V);
}

struct job {
    const struct bie_embedding_call * c;
    bool backward;
};

static enum bie_status run_slot(bie_context_t * ctx, const struct bie_backend_ops * b, const void * p) {
    const struct job * j = p;
    enum bie_status (*f)(bie_context_t *, const struct bie_embedding_call *) =
        j->backward ? b->embedding_backward : b->embedding_forward;
    return f ? f(ctx, j->c) : BIE_DECLINED;
}

static enum bie_status dispatch(bie_context_t * ctx, const struct bie_embedding_call * c, bool backward) {
    char what[64];
    snprintf(what, sizeof what, "this %s embedding%s %s",
             c->quant == BIE_QUANT_BINARY ? "binary"
             : c->quant == BIE_QUANT_INT4 ? "4-bit"
                                          : "8-bit",
             c->bag ? " bag" : "", backward ? "backward" : "forward");
    const struct job j = {c, backward};
    return bie_dispatch(ctx, c->device_type, run_slot, &j, what);
}

enum bie_status bie_embedding_forward(bie_context_t * ctx, const struct bie_embedding_desc * desc,
                                      const struct bie_embedding_args * a) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    if (!a) BIE_FAIL("args: is NULL");
    struct bie_embedding_call c;
    BIE_TRY(prepare(ctx, desc, a->indices, a->table, a->scale, &c));
    if (!a->out) BIE_FAIL("out: is NULL");
    BIE_TRY(bie_op_check_grad(ctx, "out", a->out, c.device_type, c.device_index));
    BIE_TRY(out_view(ctx, "out", a->out, a->indices, &c, &c.out));
    return dispatch(ctx, &c, false);
}

enum bie_status bie_embedding_backward(bie_context_t * ctx, const struct bie_embedding_desc * desc,
                                       const struct bie_embedding_backward_args * a) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    if (!a) BIE_FAIL("args: is NULL");
    // The backward reads no table: validate the indices against the rows of grad_rows' dense case.
    if (!a->grad_rows) BIE_FAIL("grad_rows: is NULL");
    BIE_TRY(bie_check_tensor(ctx, "grad_rows", a->grad_rows, false));
    if (a->grad_rows->ndim != 2)
        BIE_FAIL("grad_rows: must be 2-D [rows, embedding_dim], has %d dims", (int)a->grad_rows->ndim);
    struct bie_embedding_call c;
    memset(&c, 0, sizeof c);
    if (!desc) BIE_FAIL("desc: is NULL");
    if (!a->indices) BIE_FAIL("indices: is NULL");
    BIE_TRY(bie_check_tensor(ctx, "indices", a->indices, true));
    c.quant = desc->quant;
    c.bag = desc->bag != 0;
    if (c.quant != BIE_QUANT_BINARY && c.quant != BIE_QUANT_INT4 && c.quant != BIE_QUANT_INT8)
        BIE_FAIL("desc: quant = %d must be 1, 4 or 8", (int)c.quant);
    c.device_type = a->indices->device_type;
    c.device_index = a->indices->device_index;
    BIE_TRY(bie_op_check_grad(ctx, "grad_rows", a->grad_rows, c.device_type, c.device_index));
    c.grad_rows = *a->grad_rows;
    c.U = a->grad_rows->shape[0];
    c.D = a->grad_rows->shape[1];
    BIE_TRY(index_view(ctx, "indices", a->indices, c.bag, &c, &c.indices));
    c.R = c.indices.shape[0];
    c.L = c.indices.shape[1];
    if (a->scale) {
        BIE_TRY(bie_check_tensor(ctx, "scale", a->scale, true));
        BIE_TRY(bie_op_check_device(ctx, "scale", a->scale, c.device_type, c.device_index));
        BIE_TRY(bie_op_check_float(ctx, "scale", a->scale));
        if (a->scale->ndim != 1) BIE_FAIL("scale: must be 1-D [num_embeddings]");
        c.scale = *a->scale;
        c.V = a->scale->shape[0];
    } else {
        c.V = a->inverse ? INT64_MAX : c.U;
    }
    if (a->inverse) {
        BIE_TRY(bie_check_tensor(ctx, "inverse", a->inverse, true));
        BIE_TRY(bie_op_check_shape(ctx, "inverse", a->inverse, a->indices->ndim, a->indices->shape));
        BIE_TRY(index_view(ctx, "inverse", a->inverse, c.bag, &c, &c.inverse));
        BIE_TRY(check_range(ctx, "inverse", &c.inverse, c.U));
    } else if (a->scale && c.V != c.U) {
        BIE_FAIL("grad_rows: has %lld rows; without an inverse it is the dense gradient of all %lld rows",
                 (long long)c.U, (long long)c.V);
    }
    BIE_TRY(check_range(ctx, "indices", &c.indices, c.V));
    if (!a->grad_out) BIE_FAIL("grad_out: is NULL");
    BIE_TRY(bie_check_tensor(ctx, "grad_out", a->grad_out, true));
    BIE_TRY(bie_op_check_device(ctx, "grad_out", a->grad_out, c.device_type, c.device_index));
    BIE_TRY(bie_op_check_float(ctx, "grad_out", a->grad_out));
    BIE_TRY(out_view(ctx, "grad_out", a->grad_out, a->indices, &c, &c.grad_out));
    return dispatch(ctx, &c, true);
}
