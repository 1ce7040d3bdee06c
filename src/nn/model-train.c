// SPDX-License-Identifier: Apache-2.0
// model-train.c: the training forward (batch statistics; every value kept) and the backward over
// the model's graph. Values are computed in layer order; the backward walks the layers in reverse
// and sums the gradients of a value read by several layers (a residual branch point): the first
// reader to finish writes grad[v], the others add into it.
#include "model-impl.h"

#include <stdlib.h>
#include <string.h>

// Elements of value v over n samples.
static int64_t value_count(const bie_model_t * m, int32_t v, int64_t n) {
    return n * (v == 0 ? shape_numel(m->input) : shape_numel(m->L[v - 1].out));
}

// One buffer per value and per value's gradient for n samples, the max-pool winners, and the
// gradient that several readers add up.
static enum bie_status ensure_buffers(bie_context_t * ctx, bie_model_t * m, int64_t n) {
    if (n > m->cap_n) {
        for (int64_t v = 1; v <= m->n_layers; v++) {
            free(m->act[v]);
            free(m->grad[v]);
            m->act[v] = m->grad[v] = NULL;
        }
        for (int64_t i = 0; i < m->n_layers; i++) {
            free(m->L[i].argmax);
            m->L[i].argmax = NULL;
        }
        free(m->gtmp);
        m->gtmp = NULL;
        m->cap_n = n;
    }
    int64_t most = 0;
    for (int32_t v = 1; v <= m->n_layers; v++) {
        const int64_t count = value_count(m, v, m->cap_n);
        most = count > most ? count : most;
        if (!m->act[v]) m->act[v] = malloc(sizeof(float) * (size_t)count);
        if (!m->grad[v]) m->grad[v] = malloc(sizeof(float) * (size_t)count);
        if (!m->act[v] || !m->grad[v])
            return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "model: out of memory for activations");
        struct layer * L = &m->L[v - 1];
        if (L->kind == L_POOL && L->pool_kind == POOL_MAX && !L->argmax) {
            L->argmax = malloc(sizeof(int32_t) * (size_t)count);
            if (!L->argmax) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "model: out of memory");
        }
    }
    if (!m->gtmp) m->gtmp = malloc(sizeof(float) * (size_t)most);
    if (!m->gtmp) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "model: out of memory for gradients");
    return BIE_STATUS_OK;
}

struct nn_pool bie_model_pool_args(const struct layer * L, int64_t n) {
    struct nn_pool g = {.n = n,
                        .c = L->in[0],
                        .h = L->in[1],
                        .w = L->in[2],
                        .oh = L->out[1],
                        .ow = L->out[2],
                        .k = L->pool,
                        .s = L->pool_stride,
                        .p = L->pool_pad};
    return g;
}

// A float (Q_F32) conv or linear layer's forward, in the model's scratch.
static enum bie_status fconv_forward(bie_context_t * ctx, bie_model_t * m, const struct layer * L, int64_t n,
                                     const float * in, float * out) {
    void * sp = NULL;
    BIE_TRY(bie_model_scratch(ctx, m, sizeof(float) * bie_model_fconv_scratch(L, n), &sp));
    bie_model_fconv_forward(L, n, in, L->w.v, L->b.v, out, sp);
    return BIE_STATUS_OK;
}

// A quantised conv or linear layer's forward through the public entry points (scale_a set from
// the first batch).
static enum bie_status qlayer_forward(bie_context_t * ctx, struct layer * L, int64_t n, const float * in, float * out) {
    if (L->scale_a.v[0] == 0.0f) BIE_TRY(bie_model_init_scale_a(ctx, L, n, in));
    struct qviews v;
    bie_model_qviews(L, n, in, out, &v);
    struct bie_forward_args a = bie_model_qviews_forward(&v);
    BIE_TRY(L->kind == L_CONV ? bie_conv2d_forward(ctx, &v.cd, &a) : bie_linear_forward(ctx, &v.ld, &a));
    bie_model_add_output_bias(L, n, out);
    return BIE_STATUS_OK;
}

static enum bie_status layer_forward(bie_context_t * ctx, bie_model_t * m, struct layer * L, int64_t n,
                                     const float * in, float * out) {
    const int64_t count = n * shape_numel(L->in);
    switch (L->kind) {
    case L_CONV:
    case L_LINEAR: return L->q == Q_F32 ? fconv_forward(ctx, m, L, n, in, out) : qlayer_forward(ctx, L, n, in, out);
    case L_BN:
        return bie_nn_batchnorm_forward(ctx, n, L->in[0], L->in[1] * L->in[2], in, L->w.v, L->b.v, L->rmean, L->rvar,
                                        BN_MOMENTUM, BN_EPS, 1, L->smean, L->sinvstd, NULL, out);
    case L_POOL:
        if (L->pool_kind == POOL_ADAPTIVE_AVG) {
            nn_adaptive_avgpool_forward(n, L->in[0], L->in[1], L->in[2], L->out[1], L->out[2], in, out);
        } else {
            const struct nn_pool g = bie_model_pool_args(L, n);
            if (L->pool_kind == POOL_MAX) nn_maxpool_forward(&g, in, out, L->argmax);
            else nn_avgpool_forward(&g, in, out);
        }
        return BIE_STATUS_OK;
    case L_ACT:
        if (L->prelu_n) nn_prelu_forward(n, L->in[0], L->in[1] * L->in[2], L->w.v, L->prelu_n, in, out);
        else nn_act_forward(L->act, count, in, out);
        return BIE_STATUS_OK;
    case L_ADD: nn_add(count, in, m->act[L->src[1]], out); return BIE_STATUS_OK;
    case L_FLATTEN: memcpy(out, in, sizeof(float) * (size_t)count); return BIE_STATUS_OK;
    }
    return bie_set_error(ctx, BIE_STATUS_INTERNAL, "model: layer kind %d", (int)L->kind);
}

enum bie_status bie_model_train_forward(bie_context_t * ctx, bie_model_t * m, const float * x, int64_t n,
                                        const float ** logits) {
    BIE_TRY(ensure_buffers(ctx, m, n));
    m->act[0] = (float *)x;
    m->n = n;
    m->params_version++; // batch statistics and lazily initialised scales change
    for (int64_t i = 0; i < m->n_layers; i++)
        BIE_TRY(layer_forward(ctx, m, &m->L[i], n, m->act[m->L[i].src[0]], m->act[i + 1]));
    m->have_training = true;
    *logits = m->act[m->n_layers];
    return BIE_STATUS_OK;
}

// Where the gradient of value v is written: grad[v] while nothing is there, else gtmp (then added
// in by grad_done); NULL for the model's input, whose gradient nobody asks for.
static float * grad_target(bie_model_t * m, int32_t v) { return v == 0 ? NULL : m->grad_set[v] ? m->gtmp : m->grad[v]; }

static void grad_done(bie_model_t * m, int32_t v, int64_t count) {
    if (v == 0) return;
    if (m->grad_set[v]) nn_accumulate(count, m->gtmp, m->grad[v]);
    m->grad_set[v] = true;
}

// The low-bit layer's gradients (x, latent weight, scale_a, bias_a, output bias).
static enum bie_status qlayer_backward(bie_context_t * ctx, struct layer * L, int64_t n, const float * in,
                                       const float * gy, float * gx) {
    struct qviews v;
    bie_model_qviews(L, n, in, NULL, &v);
    const bool conv = L->kind == L_CONV;
    const int64_t ys[4] = {n, L->out[0], L->out[1], L->out[2]}, yl[2] = {n, L->O};
    const int64_t w4[4] = {L->O, L->C, L->k, L->k}, w2[2] = {L->O, L->K}, c1[1] = {L->C};
    bie_tensor_make(&v.gy, (void *)gy, BIE_DTYPE_F32, 2 + 2 * conv, conv ? ys : yl);
    if (gx) {
        v.gx = v.x;
        v.gx.data = gx;
    }
    bie_tensor_make(&v.gw, L->w.g, BIE_DTYPE_F32, 2 + 2 * conv, conv ? w4 : w2);
    bie_tensor_make(&v.gsa, L->scale_a.g, BIE_DTYPE_F32, 0, NULL);
    bie_tensor_make(&v.gba, L->bias_a.g, BIE_DTYPE_F32, 1, c1);
    struct bie_backward_args a = {&v.x,  &v.bias_a, &v.w,   &v.scale_a, &v.scale_w, &v.gy, gx ? &v.gx : NULL,
                                  &v.gw, &v.gsa,    &v.gba, NULL,       NULL,       NULL,  0.0f};
    BIE_TRY(conv ? bie_conv2d_backward(ctx, &v.cd, &a) : bie_linear_backward(ctx, &v.ld, &a));
    if (L->has_bias) { // grad_bias[o] = sum over samples and pixels of grad_y[i, o, p]
        const int64_t P = L->out[1] * L->out[2];
        NN_PARALLEL_FOR(n * L->O * P, o, L->O, {
            double s = 0;
            for (int64_t i = 0; i < n; i++)
                for (int64_t p = 0; p < P; p++) s += gy[(i * L->O + o) * P + p];
            L->b.g[o] = (float)s;
        });
    }
    return BIE_STATUS_OK;
}

// A float (Q_F32) conv or linear layer's backward (a linear layer is the k = 1 conv of 1x1 images),
// in the model's scratch.
static enum bie_status fconv_backward(bie_context_t * ctx, bie_model_t * m, const struct layer * L, int64_t n,
                                      const float * in, const float * gy, float * gx) {
    void * sp = NULL;
    BIE_TRY(bie_model_scratch(ctx, m, sizeof(float) * bie_model_fconv_scratch(L, n), &sp));
    const bool lin = L->kind == L_LINEAR;
    bie_fconv_backward(n, lin ? L->K : L->C, lin ? 1 : L->in[1], lin ? 1 : L->in[2], L->O, L->k, L->stride, L->pad, in,
                       L->w.v, gy, gx, L->w.g, L->b.g, sp);
    return BIE_STATUS_OK;
}

static enum bie_status layer_backward(bie_context_t * ctx, bie_model_t * m, struct layer * L, int64_t n,
                                      const float * in, const float * gy) {
    const int64_t count = n * shape_numel(L->in);
    if (L->kind == L_ADD) { // both inputs get grad_y
        for (int j = 0; j < 2; j++) {
            float * gx = grad_target(m, L->src[j]);
            if (!gx) continue;
            memcpy(gx, gy, sizeof(float) * (size_t)count);
            grad_done(m, L->src[j], count);
        }
        return BIE_STATUS_OK;
    }
    float * gx = grad_target(m, L->src[0]);
    switch (L->kind) {
    case L_CONV:
    case L_LINEAR:
        BIE_TRY(L->q == Q_F32 ? fconv_backward(ctx, m, L, n, in, gy, gx) : qlayer_backward(ctx, L, n, in, gy, gx));
        break;
    case L_BN:
        BIE_TRY(bie_nn_batchnorm_backward(ctx, n, L->in[0], L->in[1] * L->in[2], in, L->w.v, L->smean, L->sinvstd, gy,
                                          gx, L->w.g, L->b.g));
        break;
    case L_POOL:
        if (!gx) break;
        if (L->pool_kind == POOL_ADAPTIVE_AVG) {
            nn_adaptive_avgpool_backward(n, L->in[0], L->in[1], L->in[2], L->out[1], L->out[2], gy, gx);
        } else {
            const struct nn_pool g = bie_model_pool_args(L, n);
            if (L->pool_kind == POOL_MAX) nn_maxpool_backward(&g, gy, L->argmax, gx);
            else nn_avgpool_backward(&g, gy, gx);
        }
        break;
    case L_ACT:
        if (L->prelu_n) nn_prelu_backward(n, L->in[0], L->in[1] * L->in[2], L->w.v, L->prelu_n, in, gy, gx, L->w.g);
        else if (gx) nn_act_backward(L->act, count, in, gy, gx);
        break;
    case L_FLATTEN:
        if (gx) memcpy(gx, gy, sizeof(float) * (size_t)count);
        break;
    case L_ADD: break;
    }
    grad_done(m, L->src[0], count);
    return BIE_STATUS_OK;
}

enum bie_status bie_model_backward(bie_context_t * ctx, bie_model_t * m, const struct bie_model_backward_args * a) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    if (!m || !a) BIE_FAIL("model, args: must not be NULL");
    if (!m->have_training) BIE_FAIL("model: backward needs a training forward first");
    const int64_t n = m->n, k = bie_model_num_outputs(m);
    BIE_TRY(bie_nn_check_shape(ctx, "grad_logits", a->grad_logits, BIE_DTYPE_F32, 2, (const int64_t[]){n, k}));
    memset(m->grad_set, 0, sizeof(bool) * (size_t)(m->n_layers + 1));
    memcpy(m->grad[m->n_layers], a->grad_logits->data, sizeof(float) * (size_t)(n * k));
    m->grad_set[m->n_layers] = true;
    for (int64_t i = m->n_layers - 1; i >= 0; i--) {
        struct layer * L = &m->L[i];
        BIE_TRY(layer_backward(ctx, m, L, n, m->act[L->src[0]], m->grad[i + 1]));
    }
    return BIE_STATUS_OK;
}
