// SPDX-License-Identifier: Apache-2.0
// model.c: the model's parameters, initialisation, the helpers that run its low-bit layers, the
// forward entry point and the optimizer step. The training forward and backward are in
// model-train.c, planned inference in model-plan.c, the architecture string in model-arch.c.
// Low-bit layers go through bie's layer calls; float layers through OpenBLAS (float-layers.c);
// batch norm, pooling and activations through nn-ops.c and graph-ops.h.
#include "model-impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AUX_LR_FACTOR 0.1f // learning rate of bias_a and scale_a relative to the weights'

// --- parameters ---------------------------------------------------------------------------------

static bool param_alloc(struct param * p, int64_t n, bool grad) {
    p->n = n;
    p->v = calloc((size_t)n, sizeof(float));
    if (grad) {
        p->g = calloc((size_t)n, sizeof(float));
        p->m = calloc((size_t)n, sizeof(float));
        p->s = calloc((size_t)n, sizeof(float));
    }
    return p->v && (!grad || (p->g && p->m && p->s));
}

static void param_free(struct param * p) {
    free(p->v);
    free(p->g);
    free(p->m);
    free(p->s);
    memset(p, 0, sizeof *p);
}

// Bytes of a packed low-bit weight in OHWI order with rows of C padded to whole bytes (linear:
// [O, K]): b1 ceil(C/8), q4 ceil(C/2), q8 C bytes per (o, kh, kw).
static size_t packed_size(const struct layer * L) {
    const int64_t per = L->q == Q_B1 ? (L->C + 7) / 8 : L->q == Q_Q4 ? (L->C + 1) / 2 : L->C;
    return (size_t)(L->O * L->k * L->k * per);
}

enum bie_status bie_model_alloc_params(bie_context_t * ctx, bie_model_t * m, bool packed) {
    bool ok = true;
    const bool train = !packed;
    for (int64_t i = 0; i < m->n_layers; i++) {
        struct layer * L = &m->L[i];
        if (L->kind == L_CONV || L->kind == L_LINEAR) {
            if (L->q == Q_F32) {
                ok = ok && param_alloc(&L->w, L->O * L->K, train) && param_alloc(&L->b, L->O, train);
                continue;
            }
            ok = ok && param_alloc(&L->bias_a, L->C, train) && param_alloc(&L->scale_a, 1, train);
            if (L->has_bias) ok = ok && param_alloc(&L->b, L->O, train);
            if (packed) {
                L->packed_bytes = packed_size(L);
                L->packed = calloc(L->packed_bytes, 1);
                ok = ok && L->packed;
            } else if (L->q == Q_B1 && m->latent == BIE_LATENT_INT8) {
                L->w8 = calloc((size_t)(L->O * L->K), 1);
                ok = ok && L->w8 && param_alloc(&L->w, L->O * L->K, true);
                if (ok) { // int8 latent: no float value, only the gradient and Diode state
                    free(L->w.v);
                    L->w.v = NULL;
                }
            } else {
                ok = ok && param_alloc(&L->w, L->O * L->K, true);
            }
        } else if (L->kind == L_BN) {
            const size_t c = (size_t)L->in[0];
            ok = ok && param_alloc(&L->w, L->in[0], train) && param_alloc(&L->b, L->in[0], train);
            L->rmean = calloc(c, sizeof(float));
            L->rvar = calloc(c, sizeof(float));
            L->smean = calloc(c, sizeof(float));
            L->sinvstd = calloc(c, sizeof(float));
            L->bn_scale = calloc(c, sizeof(float));
            L->bn_shift = calloc(c, sizeof(float));
            ok = ok && L->rmean && L->rvar && L->smean && L->sinvstd && L->bn_scale && L->bn_shift;
        } else if (L->kind == L_ACT && L->prelu_n) {
            ok = ok && param_alloc(&L->w, L->prelu_n, train);
        }
    }
    if (!ok) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "model: out of memory for the parameters");
    m->packed = packed;
    return BIE_STATUS_OK;
}

enum bie_status bie_model_scratch(bie_context_t * ctx, bie_model_t * m, size_t bytes, void ** out) {
    if (bytes > m->scratch_size) {
        free(m->scratch);
        m->scratch = malloc(bytes);
        m->scratch_size = m->scratch ? bytes : 0;
        if (!m->scratch) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "model: out of memory for scratch");
    }
    *out = m->scratch;
    return BIE_STATUS_OK;
}

static uint64_t splitmix64(uint64_t * state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float uniform(uint64_t * st, float bound) {
    return ((float)((splitmix64(st) >> 40) * 0x1p-24) * 2.0f - 1.0f) * bound;
}

// PyTorch's default initialisation: weight and bias uniform in +-1/sqrt(fan_in); bn gamma 1,
// beta 0, running var 1; PReLU slopes 0.25. Low-bit layers then derive scale_w (and the int8
// latent weight); their optional output bias starts at 0 (as bie's PyTorch layers do). Only the
// float and latent weights draw from the seed's stream, in layer order.
static enum bie_status init_params(bie_context_t * ctx, bie_model_t * m) {
    uint64_t st = m->seed;
    for (int64_t i = 0; i < m->n_layers; i++) {
        struct layer * L = &m->L[i];
        if (L->kind == L_BN) {
            for (int64_t j = 0; j < L->in[0]; j++) {
                L->w.v[j] = 1.0f;
                L->rvar[j] = 1.0f;
            }
            continue;
        }
        if (L->kind == L_ACT && L->prelu_n) {
            for (int64_t j = 0; j < L->prelu_n; j++) L->w.v[j] = 0.25f;
            continue;
        }
        if (L->kind != L_CONV && L->kind != L_LINEAR) continue;
        const float bound = 1.0f / sqrtf((float)L->K);
        float * w = L->w.v ? L->w.v : L->w.g; // int8 latent: draw into the gradient buffer first
        for (int64_t j = 0; j < L->O * L->K; j++) w[j] = uniform(&st, bound);
        if (L->q == Q_F32) {
            for (int64_t j = 0; j < L->O; j++) L->b.v[j] = uniform(&st, bound);
            continue;
        }
        struct bie_tensor wt, sw;
        const int64_t shape[2] = {L->O, L->K};
        bie_tensor_make(&wt, w, BIE_DTYPE_F32, 2, shape);
        bie_tensor_make(&sw, &L->scale_w, BIE_DTYPE_F32, 0, NULL);
        const enum bie_quant q = (enum bie_quant)L->q;
        BIE_TRY(bie_weight_scale_init(ctx, q, &wt, &sw));
        if (L->w8) {
            struct bie_tensor w8;
            bie_tensor_make(&w8, L->w8, BIE_DTYPE_I8, 2, shape);
            BIE_TRY(bie_weight_to_latent_int8(ctx, &wt, &w8));
            BIE_TRY(bie_nn_diode_init(ctx, L->O * L->K, L->w8, splitmix64(&st), L->w.m, L->w.s));
            memset(L->w.g, 0, sizeof(float) * (size_t)(L->O * L->K));
        }
    }
    return BIE_STATUS_OK;
}

static void free_layers(bie_model_t * m) {
    for (int64_t i = 0; m->L && i < m->n_layers; i++) {
        struct layer * L = &m->L[i];
        param_free(&L->w);
        param_free(&L->b);
        param_free(&L->bias_a);
        param_free(&L->scale_a);
        free(L->w8);
        free(L->packed);
        free(L->rmean);
        free(L->rvar);
        free(L->smean);
        free(L->sinvstd);
        free(L->bn_scale);
        free(L->bn_shift);
        free(L->argmax);
        free(L->wcodes);
    }
    free(m->L);
    m->L = NULL;
}

void bie_model_destroy(bie_model_t * m) {
    if (!m) return;
    if (m->act)
        for (int64_t v = 1; v <= m->n_layers; v++) free(m->act[v]);
    if (m->grad)
        for (int64_t v = 0; v <= m->n_layers; v++) free(m->grad[v]);
    free_layers(m);
    bie_model_plans_free(m);
    free(m->act);
    free(m->grad);
    free(m->gtmp);
    free(m->grad_set);
    free(m->scratch);
    free(m->arch);
    free(m);
}

enum bie_status bie_model_create_empty(bie_context_t * ctx, const char * arch, enum bie_latent latent, bool packed,
                                       bie_model_t ** out) {
    *out = NULL;
    if (latent != BIE_LATENT_F32 && latent != BIE_LATENT_INT8) BIE_FAIL("latent: unknown value %d", (int)latent);
    bie_model_t * m = calloc(1, sizeof *m);
    if (!m) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
    m->latent = latent;
    struct arch a;
    enum bie_status s = bie_model_parse_arch(ctx, arch, &a);
    if (s == BIE_STATUS_OK) {
        m->L = a.L;
        m->n_layers = a.n;
        memcpy(m->input, a.input, sizeof m->input);
        m->format_version = a.version;
        m->arch = strdup(arch);
        m->act = calloc((size_t)m->n_layers + 1, sizeof(float *));
        m->grad = calloc((size_t)m->n_layers + 1, sizeof(float *));
        m->grad_set = calloc((size_t)m->n_layers + 1, sizeof(bool));
        if (!m->arch || !m->act || !m->grad || !m->grad_set)
            s = bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    if (s == BIE_STATUS_OK) s = bie_model_alloc_params(ctx, m, packed);
    if (s != BIE_STATUS_OK) {
        bie_model_destroy(m);
        return s;
    }
    *out = m;
    return BIE_STATUS_OK;
}

enum bie_status bie_model_create(bie_context_t * ctx, const char * arch, enum bie_latent latent, uint64_t seed,
                                 bie_model_t ** out) {
    BIE_ENTER(ctx);
    if (!out) BIE_FAIL("out: is NULL");
    BIE_TRY(bie_model_create_empty(ctx, arch, latent, false, out));
    (*out)->seed = seed;
    enum bie_status s = bie_model_check_memory(ctx, *out, 1, false, BIE_STATUS_INVALID_ARGUMENT);
    if (s == BIE_STATUS_OK) s = init_params(ctx, *out);
    if (s != BIE_STATUS_OK) {
        bie_model_destroy(*out);
        *out = NULL;
    }
    return s;
}

const char * bie_model_arch(const bie_model_t * m) { return m ? m->arch : ""; }
int bie_model_is_packed(const bie_model_t * m) { return m && m->packed; }
int64_t bie_model_num_layers(const bie_model_t * m) { return m ? m->n_layers : 0; }
int64_t bie_model_num_outputs(const bie_model_t * m) {
    return m && m->n_layers ? shape_numel(m->L[m->n_layers - 1].out) : 0;
}
int64_t bie_model_num_inputs(const bie_model_t * m) { return m && m->n_layers ? shape_numel(m->input) : 0; }

// --- low-bit layer helpers ----------------------------------------------------------------------

void bie_model_qviews(struct layer * L, int64_t n, const float * x, float * y, struct qviews * v) {
    memset(v, 0, sizeof *v);
    const bool conv = L->kind == L_CONV;
    const int64_t xs[4] = {n, L->in[0], L->in[1], L->in[2]}, ys[4] = {n, L->out[0], L->out[1], L->out[2]};
    const int64_t xl[2] = {n, L->K}, yl[2] = {n, L->O};
    bie_tensor_make(&v->x, (void *)x, BIE_DTYPE_F32, 2 + 2 * conv, conv ? xs : xl);
    bie_tensor_make(&v->y, y, BIE_DTYPE_F32, 2 + 2 * conv, conv ? ys : yl);
    const int64_t w4[4] = {L->O, L->C, L->k, L->k}, w2[2] = {L->O, L->K};
    if (L->packed) {
        const enum bie_dtype dt = L->q == Q_B1 ? BIE_DTYPE_B1 : L->q == Q_Q4 ? BIE_DTYPE_S4 : BIE_DTYPE_I8;
        const int64_t ohwi[4] = {L->O, L->k, L->k, L->C};
        bie_tensor_make(&v->w, L->packed, dt, 4, ohwi);
        const int32_t perm[4] = {0, 3, 1, 2};
        bie_tensor_permute(&v->w, perm);
        if (!conv) { // [O, 1, 1, K] -> [O, K]
            v->w.ndim = 2;
            v->w.shape[1] = L->K;
            v->w.stride[1] = 1;
        }
    } else if (L->w8) {
        bie_tensor_make(&v->w, L->w8, BIE_DTYPE_I8, 2 + 2 * conv, conv ? w4 : w2);
    } else {
        bie_tensor_make(&v->w, L->w.v, BIE_DTYPE_F32, 2 + 2 * conv, conv ? w4 : w2);
    }
    const int64_t c1[1] = {L->C};
    bie_tensor_make(&v->bias_a, L->bias_a.v, BIE_DTYPE_F32, 1, c1);
    bie_tensor_make(&v->scale_a, L->scale_a.v, BIE_DTYPE_F32, 0, NULL);
    bie_tensor_make(&v->scale_w, &L->scale_w, BIE_DTYPE_F32, 0, NULL);
    v->ld.quant = (enum bie_quant)L->q;
    v->ld.in_features = L->K;
    v->ld.out_features = L->O;
    v->cd.quant = (enum bie_quant)L->q;
    v->cd.in_channels = L->C;
    v->cd.out_channels = L->O;
    v->cd.kernel[0] = v->cd.kernel[1] = (int32_t)L->k;
    v->cd.stride[0] = v->cd.stride[1] = (int32_t)L->stride;
    v->cd.padding[0] = v->cd.padding[1] = (int32_t)L->pad;
    v->cd.dilation[0] = v->cd.dilation[1] = 1;
    v->cd.groups = 1;
    v->cd.pad_value = BIE_PAD_ZERO;
}

enum bie_status bie_model_weight_codes(bie_context_t * ctx, struct layer * L) {
    if (L->wcodes) return BIE_STATUS_OK;
    L->wcodes = malloc(sizeof(float) * (size_t)(L->O * L->K));
    if (!L->wcodes) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
    struct qviews v;
    bie_model_qviews(L, 1, NULL, NULL, &v);
    struct bie_tensor dst = v.w;
    const bool conv = L->kind == L_CONV;
    const int64_t w4[4] = {L->O, L->C, L->k, L->k}, w2[2] = {L->O, L->K};
    bie_tensor_make(&dst, L->wcodes, BIE_DTYPE_F32, 2 + 2 * conv, conv ? w4 : w2);
    if (v.w.dtype == BIE_DTYPE_F32) { // latent float weight: quantize first
        const int64_t shape[2] = {L->O, L->K};
        struct bie_tensor codes, sw;
        const enum bie_dtype dt = L->q == Q_B1 ? BIE_DTYPE_B1 : L->q == Q_Q4 ? BIE_DTYPE_S4 : BIE_DTYPE_I8;
        size_t bytes = 0;
        bie_tensor_make(&codes, NULL, dt, 2, shape);
        bie_tensor_nbytes(&codes, &bytes);
        codes.data = malloc(bytes + 1);
        if (!codes.data) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
        struct bie_tensor src = v.w;
        bie_tensor_make(&src, L->w.v, BIE_DTYPE_F32, 2, shape);
        bie_tensor_make(&sw, &L->scale_w, BIE_DTYPE_F32, 0, NULL);
        bie_tensor_make(&dst, L->wcodes, BIE_DTYPE_F32, 2, shape);
        enum bie_status s = bie_pack(ctx, &src, L->q == Q_B1 ? NULL : &sw, &codes);
        if (s == BIE_STATUS_OK) s = bie_unpack(ctx, &codes, NULL, &dst);
        free(codes.data);
        return s;
    }
    if (v.w.dtype == BIE_DTYPE_I8 && L->q != Q_B1) { // q8 codes: clamp happens in the layer; i8 is in range
        return bie_unpack(ctx, &v.w, NULL, &dst);
    }
    if (v.w.dtype == BIE_DTYPE_I8) { // b1 int8 latent: its sign
        for (int64_t j = 0; j < L->O * L->K; j++) L->wcodes[j] = L->w8[j] >= 0 ? 1.0f : -1.0f;
        return BIE_STATUS_OK;
    }
    return bie_unpack(ctx, &v.w, NULL, &dst);
}

void bie_model_quantize_input(const struct layer * L, int64_t n, const float * x, float * a) {
    const int64_t in_n = shape_numel(L->in);
    const float sa = L->scale_a.v[0];
    const int lo = L->q == Q_Q4 ? -8 : -128, hi = L->q == Q_Q4 ? 7 : 127;
    // bias_a is per channel for a conv, per input feature (all of C*H*W) for a linear layer.
    const int64_t hw = L->kind == L_CONV ? L->in[1] * L->in[2] : 1, nc = L->C;
    NN_PARALLEL_FOR(n * in_n, i, n * in_n, {
        const float xp = x[i] + L->bias_a.v[(i / hw) % nc];
        a[i] = L->q == Q_B1 ? (xp >= 0 ? 1.0f : -1.0f) : fminf(fmaxf(bie_rne(xp / sa), (float)lo), (float)hi);
    });
}

size_t bie_model_fconv_scratch(const struct layer * L, int64_t n) {
    return (size_t)((L->K + L->O) * n * L->out[1] * L->out[2]);
}

void bie_model_fconv_forward(const struct layer * L, int64_t n, const float * x, const float * w, const float * bias,
                             float * y, float * scratch) {
    if (L->kind == L_LINEAR) bie_fconv_forward(n, L->K, 1, 1, L->O, 1, 1, 0, 0.0f, x, w, bias, y, scratch);
    else bie_fconv_forward(n, L->C, L->in[1], L->in[2], L->O, L->k, L->stride, L->pad, 0.0f, x, w, bias, y, scratch);
}

void bie_model_add_output_bias(const struct layer * L, int64_t n, float * y) {
    if (!L->has_bias) return;
    const int64_t P = L->out[1] * L->out[2];
    NN_PARALLEL_FOR(n * L->O * P, r, n * L->O, {
        const float b = L->b.v[r % L->O];
        for (int64_t p = 0; p < P; p++) y[r * P + p] += b;
    });
}

enum bie_status bie_model_init_scale_a(bie_context_t * ctx, struct layer * L, int64_t n, const float * x) {
    struct qviews v;
    bie_model_qviews(L, n, x, NULL, &v);
    return bie_activation_scale_init(ctx, (enum bie_quant)L->q, 1, &v.x, &v.scale_a);
}

// --- forward ------------------------------------------------------------------------------------

// x [n, C, H, W] or [n, C*H*W] of the model's input: n.
static enum bie_status check_input(bie_context_t * ctx, const bie_model_t * m, const struct bie_tensor * x,
                                   int64_t * n) {
    BIE_TRY(bie_nn_check_dense(ctx, "x", x, BIE_DTYPE_F32));
    const int64_t * in = m->input;
    const bool ok = (x->ndim == 4 && x->shape[1] == in[0] && x->shape[2] == in[1] && x->shape[3] == in[2]) ||
                    (x->ndim == 2 && x->shape[1] == bie_model_num_inputs(m));
    if (!ok)
        BIE_FAIL("x: must be [n, %lld, %lld, %lld] or [n, %lld] (the model's input)", (long long)in[0],
                 (long long)in[1], (long long)in[2], (long long)bie_model_num_inputs(m));
    *n = x->shape[0];
    if (*n > (1 << 20)) BIE_FAIL("x: n = %lld must be in [1, 2^20]", (long long)*n);
    return BIE_STATUS_OK;
}

enum bie_status bie_model_forward(bie_context_t * ctx, bie_model_t * m, const struct bie_model_forward_desc * desc,
                                  const struct bie_model_forward_args * a) {
    BIE_ENTER(ctx);
    if (!m || !desc || !a) BIE_FAIL("model, desc, args: must not be NULL");
    int64_t n = 0;
    BIE_TRY(check_input(ctx, m, a->x, &n));
    const int64_t k = bie_model_num_outputs(m);
    BIE_TRY(bie_nn_check_shape(ctx, "logits", a->logits, BIE_DTYPE_F32, 2, (const int64_t[]){n, k}));
    const struct bie_tensor * outs[] = {a->logits};
    const char * out_names[] = {"logits"};
    const struct bie_tensor * ins[] = {a->x};
    const char * in_names[] = {"x"};
    BIE_TRY(bie_check_outputs(ctx, outs, out_names, 1, ins, in_names, 1));
    if (desc->training && m->packed) BIE_FAIL("model: a packed model can only run inference (training = 0)");
    if (desc->training && desc->float_layers) BIE_FAIL("desc.float_layers: only for inference");
    BIE_TRY(bie_model_check_memory(ctx, m, n, desc->training, BIE_STATUS_OUT_OF_MEMORY));
    m->have_training = false;
    const float * logits = NULL;
    if (!desc->training) BIE_TRY(bie_model_infer(ctx, m, a->x->data, n, desc->float_layers != 0, &logits));
    else BIE_TRY(bie_model_train_forward(ctx, m, a->x->data, n, &logits));
    memcpy(a->logits->data, logits, sizeof(float) * (size_t)(n * k));
    return BIE_STATUS_OK;
}

enum bie_status bie_model_step(bie_context_t * ctx, bie_model_t * m, const struct bie_model_step_desc * desc) {
    BIE_ENTER(ctx);
    if (!m || !desc) BIE_FAIL("model, desc: must not be NULL");
    const float lr = desc->lr, weight_decay = desc->weight_decay, diode_lr = desc->diode_lr;
    if (m->packed) BIE_FAIL("model: a packed model cannot be trained");
    if (m->step >= BIE_MODEL_MAX_STEP) BIE_FAIL("model: step count %lld is at its bound 2^62", (long long)m->step);
    m->step++;
    m->params_version++;
    struct bie_adam_params ap;
    bie_adam_params_default(&ap);
    ap.lr = lr;
    struct bie_diode_params dp;
    bie_diode_params_default(&dp);
    dp.lr = diode_lr;
    for (int64_t i = 0; i < m->n_layers; i++) {
        struct layer * L = &m->L[i];
        free(L->wcodes); // weights change: float codes are rebuilt on demand
        L->wcodes = NULL;
        if (L->kind == L_BN || ((L->kind == L_CONV || L->kind == L_LINEAR) && L->q == Q_F32)) {
            ap.weight_decay = L->kind == L_BN ? 0.0f : weight_decay;
            ap.clip = 0;
            BIE_TRY(bie_nn_adam_step(ctx, &ap, m->step, L->w.n, L->w.v, L->w.g, L->w.m, L->w.s));
            ap.weight_decay = 0;
            BIE_TRY(bie_nn_adam_step(ctx, &ap, m->step, L->b.n, L->b.v, L->b.g, L->b.m, L->b.s));
        } else if (L->kind == L_CONV || L->kind == L_LINEAR) {
            // bias_a and scale_a duplicate the preceding batch norm's beta and gamma (the pair only
            // moves the threshold and the STE window): a tenth of the rate keeps Adam from driving
            // the threshold out of the data's range, where the window would close for good.
            struct bie_adam_params aux = ap;
            aux.lr = ap.lr * AUX_LR_FACTOR;
            aux.weight_decay = 0;
            aux.clip = 0;
            BIE_TRY(
                bie_nn_adam_step(ctx, &aux, m->step, L->bias_a.n, L->bias_a.v, L->bias_a.g, L->bias_a.m, L->bias_a.s));
            BIE_TRY(bie_nn_adam_step(ctx, &aux, m->step, 1, L->scale_a.v, L->scale_a.g, L->scale_a.m, L->scale_a.s));
            if (!(L->scale_a.v[0] > 1e-6f)) L->scale_a.v[0] = 1e-6f; // the layer needs scale_a > 0
            if (L->w8) {
                BIE_TRY(bie_nn_diode_step(ctx, &dp, L->w.n, L->w8, L->w.g, L->w.m, L->w.s, NULL));
            } else {
                // Latent binary weights live in [-1, 1] (BinaryConnect); n-bit latents in the
                // quantizer's range, so they cannot drift far past the clamp.
                const float range = L->q == Q_B1 ? 1.0f : L->scale_w * (L->q == Q_Q4 ? 8.0f : 128.0f);
                ap.clip = range;
                BIE_TRY(bie_nn_adam_step(ctx, &ap, m->step, L->w.n, L->w.v, L->w.g, L->w.m, L->w.s));
            }
            if (L->has_bias) { // the output bias: plain Adam, like a float layer's bias
                struct bie_adam_params bp = aux;
                bp.lr = ap.lr;
                BIE_TRY(bie_nn_adam_step(ctx, &bp, m->step, L->b.n, L->b.v, L->b.g, L->b.m, L->b.s));
            }
        } else if (L->kind == L_ACT && L->prelu_n) { // PReLU slopes: Adam without weight decay
            ap.weight_decay = 0;
            ap.clip = 0;
            BIE_TRY(bie_nn_adam_step(ctx, &ap, m->step, L->w.n, L->w.v, L->w.g, L->w.m, L->w.s));
        }
    }
    return BIE_STATUS_OK;
}
