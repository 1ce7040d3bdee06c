// SPDX-License-Identifier: Apache-2.0
// plan.c: planned layer calls (bie_plan_*). A plan is a layer call validated and normalised once
// (src/ops/layer.c), with its backend's route and workspace worked out by that backend in plan
// mode (bie_layer_call.plan); executing it checks that the call's tensors are the planned ones but
// for their data pointers (a comparison of their shapes, strides, dtypes and devices), patches the
// pointers (and host scale values) into the normalised call and hands it to the backend.
#include "bie-impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The tensors of a call, in the order of the argument structs: forward x, bias_a, weight, scale_a,
// scale_w, y, out_mul, out_add, residual, out_bits, out_bits_bias; backward x, bias_a, weight,
// scale_a, scale_w, grad_y, grad_x, grad_weight, grad_scale_a, grad_bias_a, x_mask, grad_x_mask,
// grad_x_add.
#define PLAN_TENSORS 13

struct bie_plan {
    bool conv, backward;
    struct bie_layer_call call; // normalised; data pointers replaced on each execution
    int ntensors;
    struct bie_tensor meta[PLAN_TENSORS]; // the planned tensors (data: NULL when absent)
    bool present[PLAN_TENSORS];
    uint8_t align[PLAN_TENSORS]; // data address mod 16 (the routes may depend on it)
    struct bie_plan_info info;
    struct bie_linear_desc lin;
    struct bie_conv2d_desc cnv;
    char text[1024];
};

#define FWD_TENSORS 11
static const char * const fwd_names[FWD_TENSORS] = {"x",       "bias_a",  "weight",   "scale_a",  "scale_w",      "y",
                                                    "out_mul", "out_add", "residual", "out_bits", "out_bits_bias"};
static const char * const bwd_names[PLAN_TENSORS] = {
    "x",           "bias_a",       "weight",      "scale_a", "scale_w",     "grad_y",    "grad_x",
    "grad_weight", "grad_scale_a", "grad_bias_a", "x_mask",  "grad_x_mask", "grad_x_add"};

static void fwd_list(const struct bie_forward_args * a, const struct bie_tensor * t[PLAN_TENSORS]) {
    const struct bie_tensor * l[FWD_TENSORS] = {a->x,       a->bias_a,  a->weight,   a->scale_a,  a->scale_w,      a->y,
                                                a->out_mul, a->out_add, a->residual, a->out_bits, a->out_bits_bias};
    for (int i = 0; i < FWD_TENSORS; i++) t[i] = l[i];
}
static void bwd_list(const struct bie_backward_args * a, const struct bie_tensor * t[PLAN_TENSORS]) {
    const struct bie_tensor * l[PLAN_TENSORS] = {
        a->x,           a->bias_a,       a->weight,      a->scale_a, a->scale_w,     a->grad_y,    a->grad_x,
        a->grad_weight, a->grad_scale_a, a->grad_bias_a, a->x_mask,  a->grad_x_mask, a->grad_x_add};
    for (int i = 0; i < PLAN_TENSORS; i++) t[i] = l[i];
}

// "f16 [128, 64, 56, 56] strides [200704, 1, 3584, 64] cuda:0" into buf.
static void tensor_words(char * buf, size_t n, const struct bie_tensor * t) {
    size_t u = (size_t)snprintf(buf, n, "%s [", bie_dtype_name(t->dtype));
    for (int32_t i = 0; i < t->ndim && u < n; i++)
        u += (size_t)snprintf(buf + u, n - u, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (u < n) u += (size_t)snprintf(buf + u, n - u, "] strides [");
    for (int32_t i = 0; i < t->ndim && u < n; i++)
        u += (size_t)snprintf(buf + u, n - u, "%s%lld", i ? ", " : "", (long long)t->stride[i]);
    if (u < n)
        snprintf(buf + u, n - u, "] %s:%d", t->device_type == BIE_DEVICE_CUDA ? "cuda" : "cpu", (int)t->device_index);
}

static void describe(struct bie_plan * p, const char * const * names) {
    const struct bie_layer_call * c = &p->call;
    const struct bie_geometry * g = &c->g;
    size_t u = (size_t)snprintf(p->text, sizeof p->text, "%s %s %s",
                                c->quant == BIE_QUANT_BINARY ? "binary"
                                : c->quant == BIE_QUANT_INT4 ? "4-bit"
                                                             : "8-bit",
                                p->conv ? "conv2d" : "linear", p->backward ? "backward" : "forward");
    if (p->conv && u < sizeof p->text)
        u +=
            (size_t)snprintf(p->text + u, sizeof p->text - u, " %lldx%lld stride %lldx%lld pad %lldx%lld dil %lldx%lld",
                             (long long)g->kh, (long long)g->kw, (long long)g->sh, (long long)g->sw, (long long)g->ph,
                             (long long)g->pw, (long long)g->dh, (long long)g->dw);
    for (int i = 0; i < p->ntensors && u < sizeof p->text; i++) {
        if (!p->present[i]) continue;
        char w[200];
        tensor_words(w, sizeof w, &p->meta[i]);
        u += (size_t)snprintf(p->text + u, sizeof p->text - u, "; %s %s", names[i], w);
    }
    if (c->x_clamp > 0.0f && u < sizeof p->text)
        u += (size_t)snprintf(p->text + u, sizeof p->text - u, "; x clamped to +-%g", (double)c->x_clamp);
    if (u < sizeof p->text)
        snprintf(p->text + u, sizeof p->text - u, "; route: %s; workspace %zu bytes", p->info.route, p->info.workspace);
}

static enum bie_status make(bie_context_t * ctx, bool conv, bool backward, const struct bie_linear_desc * lin,
                            const struct bie_conv2d_desc * cd, const void * args, bie_plan_t ** out) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    if (!out) BIE_FAIL("out: is NULL");
    *out = NULL;
    struct bie_plan * p = calloc(1, sizeof *p);
    if (!p) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "plan: out of host memory");
    p->conv = conv;
    p->backward = backward;
    if (lin) p->lin = *lin;
    if (cd) p->cnv = *cd;
    enum bie_status s = backward ? bie_layer_prepare_backward(ctx, lin, cd, args, &p->call)
                                 : bie_layer_prepare_forward(ctx, lin, cd, args, &p->call);
    if (s == BIE_STATUS_OK) {
        const struct bie_tensor * t[PLAN_TENSORS] = {NULL};
        if (backward) bwd_list(args, t);
        else fwd_list(args, t);
        p->ntensors = backward ? PLAN_TENSORS : FWD_TENSORS;
        for (int i = 0; i < p->ntensors; i++) {
            p->present[i] = t[i] != NULL;
            if (!t[i]) continue;
            p->meta[i] = *t[i];
            p->align[i] = (uint8_t)((uintptr_t)t[i]->data % 16);
        }
        p->call.plan = &p->info;
        s = bie_layer_run(ctx, &p->call, backward);
        p->call.plan = NULL;
    }
    if (s == BIE_STATUS_OK && p->call.device_type == BIE_DEVICE_CUDA && p->info.workspace)
        s = bie_context_reserve(ctx, BIE_DEVICE_CUDA, p->info.workspace);
    if (s != BIE_STATUS_OK) {
        free(p);
        return s;
    }
    describe(p, backward ? bwd_names : fwd_names);
    *out = p;
    return BIE_STATUS_OK;
}

enum bie_status bie_plan_linear_forward(bie_context_t * ctx, const struct bie_linear_desc * desc,
                                        const struct bie_forward_args * args, bie_plan_t ** out) {
    return make(ctx, false, false, desc, NULL, args, out);
}
enum bie_status bie_plan_conv2d_forward(bie_context_t * ctx, const struct bie_conv2d_desc * desc,
                                        const struct bie_forward_args * args, bie_plan_t ** out) {
    return make(ctx, true, false, NULL, desc, args, out);
}
enum bie_status bie_plan_linear_backward(bie_context_t * ctx, const struct bie_linear_desc * desc,
                                         const struct bie_backward_args * args, bie_plan_t ** out) {
    return make(ctx, false, true, desc, NULL, args, out);
}
enum bie_status bie_plan_conv2d_backward(bie_context_t * ctx, const struct bie_conv2d_desc * desc,
                                         const struct bie_backward_args * args, bie_plan_t ** out) {
    return make(ctx, true, true, NULL, desc, args, out);
}

void bie_plan_destroy(bie_plan_t * plan) { free(plan); }

const char * bie_plan_describe(const bie_plan_t * plan) { return plan ? plan->text : "(no plan)"; }

size_t bie_plan_workspace_size(const bie_plan_t * plan) { return plan ? plan->info.workspace : 0; }

static bool same_view(const struct bie_tensor * a, const struct bie_tensor * b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim || a->device_type != b->device_type ||
        a->device_index != b->device_index)
        return false;
    for (int32_t i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i] || a->stride[i] != b->stride[i]) return false;
    return true;
}

// Each planned tensor view of the normalised call, with the argument that gives its data.
static void patch(struct bie_layer_call * c, bool backward, const struct bie_tensor * const * t) {
    c->x.data = t[0]->data;
    c->bias_a.data = t[1] ? t[1]->data : NULL;
    c->weight.data = t[2]->data;
    c->scale_a_t.data = t[3]->data;
    c->scale_w_t.data = t[4]->data;
    if (!backward) {
        c->y.data = t[5]->data;
        c->out_mul.data = t[6] ? t[6]->data : NULL;
        c->out_add.data = t[7] ? t[7]->data : NULL;
        c->residual.data = t[8] ? t[8]->data : NULL;
        c->out_bits.data = t[9] ? t[9]->data : NULL;
        c->out_bits_bias.data = t[10] ? t[10]->data : NULL;
        return;
    }
    c->grad_y.data = t[5]->data;
    struct bie_tensor * outs[4] = {&c->grad_x, &c->grad_weight, &c->grad_scale_a, &c->grad_bias_a};
    for (int i = 0; i < 4; i++) outs[i]->data = t[6 + i] ? t[6 + i]->data : NULL;
    c->x_mask.data = t[10] ? t[10]->data : NULL;
    c->grad_x_mask.data = t[11] ? t[11]->data : NULL;
    c->grad_x_add.data = t[12] ? t[12]->data : NULL;
}

static enum bie_status execute(bie_context_t * ctx, const bie_plan_t * p, bool backward, const void * args) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    if (!p) BIE_FAIL("plan: is NULL");
    if (!args) BIE_FAIL("args: is NULL");
    if (p->backward != backward) BIE_FAIL("plan: is a %s plan", p->backward ? "backward" : "forward");
    const struct bie_tensor * t[PLAN_TENSORS] = {NULL};
    if (backward) bwd_list(args, t);
    else fwd_list(args, t);
    const char * const * names = backward ? bwd_names : fwd_names;
    bool aligned = true;
    for (int i = 0; i < p->ntensors; i++) {
        if ((t[i] != NULL) != p->present[i])
            BIE_FAIL("%s: was %s when the plan was made", names[i], p->present[i] ? "given" : "NULL");
        if (!t[i]) continue;
        if (!same_view(t[i], &p->meta[i])) {
            char want[200], have[200];
            tensor_words(want, sizeof want, &p->meta[i]);
            tensor_words(have, sizeof have, t[i]);
            BIE_FAIL("%s: is %s, the plan was made for %s", names[i], have, want);
        }
        if (!t[i]->data) BIE_FAIL("%s: data is NULL", names[i]);
        aligned = aligned && (uint8_t)((uintptr_t)t[i]->data % 16) == p->align[i];
    }
    if (!aligned) { // a route may depend on the alignment: the full call chooses again
        if (backward)
            return p->conv ? bie_conv2d_backward(ctx, &p->cnv, args) : bie_linear_backward(ctx, &p->lin, args);
        return p->conv ? bie_conv2d_forward(ctx, &p->cnv, args) : bie_linear_forward(ctx, &p->lin, args);
    }
    // outputs may not share bytes with any other tensor of the call (a property of the pointers)
    if (backward) {
        const struct bie_tensor *outs[4] = {t[6], t[7], t[8], t[9]},
                                *ins[9] = {t[0], t[1], t[2], t[3], t[4], t[5], t[10], t[11], t[12]};
        const char * const on[4] = {names[6], names[7], names[8], names[9]};
        const char * const in[9] = {names[0], names[1],  names[2],  names[3], names[4],
                                    names[5], names[10], names[11], names[12]};
        BIE_TRY(bie_check_outputs(ctx, outs, on, 4, ins, in, 9));
    } else {
        const struct bie_tensor *outs[2] = {t[5], t[9]},
                                *ins[9] = {t[0], t[1], t[2], t[3], t[4], t[6], t[7], t[8], t[10]};
        const char * const on[2] = {names[5], names[9]};
        const char * const in[9] = {names[0], names[1], names[2], names[3], names[4],
                                    names[6], names[7], names[8], names[10]};
        BIE_TRY(bie_check_outputs(ctx, outs, on, 2, ins, in, 9));
    }
    const float clamp =
        backward ? ((const struct bie_backward_args *)args)->x_clamp : ((const struct bie_forward_args *)args)->x_clamp;
    if (clamp != p->call.x_clamp)
        BIE_FAIL("x_clamp: is %g, the plan was made for %g", (double)clamp, (double)p->call.x_clamp);
    struct bie_layer_call c = p->call;
    patch(&c, backward, t);
    if (c.scale_a_t.device_type == BIE_DEVICE_CPU) {
        c.scale_a = bie_load_scalar(t[3]);
        if (!isfinite(c.scale_a) || !(c.scale_a > 0.0f))
            BIE_FAIL("scale_a: = %g must be finite and > 0", (double)c.scale_a);
    }
    if (c.scale_w_t.device_type == BIE_DEVICE_CPU) {
        c.scale_w = bie_load_scalar(t[4]);
        if (!isfinite(c.scale_w) || !(c.scale_w > 0.0f))
            BIE_FAIL("scale_w: = %g must be finite and > 0", (double)c.scale_w);
    }
    if (c.scales_on_host && !isfinite(c.scale_a * c.scale_w))
        BIE_FAIL("scale_a * scale_w: %g * %g overflows f32 (y = acc * (scale_a * scale_w) needs a finite product)",
                 (double)c.scale_a, (double)c.scale_w);
    return bie_layer_run(ctx, &c, backward);
}

enum bie_status bie_plan_forward(bie_context_t * ctx, const bie_plan_t * plan, const struct bie_forward_args * args) {
    return execute(ctx, plan, false, args);
}

enum bie_status bie_plan_backward(bie_context_t * ctx, const bie_plan_t * plan, const struct bie_backward_args * args) {
    return execute(ctx, plan, true, args);
}
