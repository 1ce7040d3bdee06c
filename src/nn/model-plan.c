// SPDX-License-Identifier: Apache-2.0
// model-plan.c: inference (bie_model_forward with training = 0) from plans.
//
// Memory is planned once per model: every value of the graph gets a slot of an arena, and a slot
// is reused as soon as the last reader of its value has run, so activation memory is that of the
// widest cut of the graph, not the sum of all layers. Element-wise layers (activations, batch
// norm, adds) write over an input that nobody reads afterwards, and flatten is no operation at
// all: its value is its input's slot. The arena holds `cap` samples; a larger batch re-plans.
//
// Work is planned once per (batch size, float_layers), on the first call at that size: each
// layer's route and operands are fixed (a low-bit layer's call is validated and normalised into a
// struct bie_layer_call, batch norm's running statistics become a per-channel affine map, float
// layers get their scratch), and later calls only run the steps: no allocation, no validation,
// no decision. A few plans are kept (the last batch of an epoch is usually smaller). Plans are
// rebuilt after the parameters change (a training forward or an optimizer step bumps
// params_version).
#include "model-impl.h"

#include <stdlib.h>
#include <string.h>

#define MAX_PLANS 4
#define ALIGN_FLOATS 16 // slots start on 64-byte boundaries

enum route {
    R_QCALL,  // a low-bit layer through its planned layer call (+ output bias)
    R_QFLOAT, // a low-bit layer as a float GEMM over its codes (float_layers mode)
    R_FCONV,  // a float conv or linear layer (im2col + OpenBLAS)
    R_AFFINE, // batch norm in inference: x * scale + shift per channel
    R_MAXPOOL,
    R_AVGPOOL,
    R_ADAPTIVE, // adaptive average pooling
    R_ACT,
    R_PRELU,
    R_ADD,
    R_COPY, // flatten of the model's input (whose buffer is the caller's)
};

struct step {
    enum route route;
    struct layer * L;
    const float * in[2]; // the inputs; NULL: the model's input x of the call
    float * out;
    int64_t count; // elements of the input over the batch (element-wise routes)
    struct nn_pool pool;
    struct bie_layer_call call; // R_QCALL
};

struct plan {
    int64_t n;
    bool float_layers;
    bool valid;
    uint64_t version; // the model's params_version when it was built
    uint64_t last_used;
    int32_t n_steps;
    struct step * steps; // room for n_layers steps
    const float * out;   // the logits
};

struct model_plan {
    // Memory plan (independent of the batch size): the slot of each value (-1: the model input)
    // and each slot's floats per sample.
    int32_t * slot_of;
    int64_t * slot_floats;
    int32_t n_slots;
    // The arena for cap samples, and the float layers' scratch.
    int64_t cap;
    float * arena;
    size_t * slot_off;
    float * scratch;
    uint64_t clock;
    int64_t builds; // plans built (for tests)
    struct plan p[MAX_PLANS];
};

static int64_t value_floats(const bie_model_t * m, int32_t v) {
    return v == 0 ? shape_numel(m->input) : shape_numel(m->L[v - 1].out);
}

static bool elementwise(const struct layer * L) { return L->kind == L_ACT || L->kind == L_BN || L->kind == L_ADD; }

// Assigns a slot to every value, in layer order, reusing the slots of values already read for the
// last time. refs[s] counts the reads still to come of the value slot s holds.
static bool plan_memory(const bie_model_t * m, struct model_plan * mp) {
    const int32_t nv = (int32_t)m->n_layers + 1;
    int32_t * refs = calloc((size_t)nv, sizeof *refs);
    bool * is_free = calloc((size_t)nv, sizeof *is_free);
    if (!refs || !is_free) {
        free(refs);
        free(is_free);
        return false;
    }
    mp->slot_of[0] = -1;
    for (int32_t v = 1; v < nv; v++) {
        const struct layer * L = &m->L[v - 1];
        const int32_t uses = v == nv - 1 ? 1 : L->uses; // the logits are kept
        int32_t chosen = -1;
        if (L->kind == L_FLATTEN && L->src[0] != 0) { // the same floats under another shape
            chosen = mp->slot_of[L->src[0]];
            refs[chosen] += uses - 1;
            mp->slot_of[v] = chosen;
            continue;
        }
        if (elementwise(L))
            for (int j = 0; j < L->n_src && chosen < 0; j++) {
                if (L->src[j] == 0) continue;
                const int32_t s = mp->slot_of[L->src[j]];
                int reads = 0;
                for (int t = 0; t < L->n_src; t++) reads += L->src[t] != 0 && mp->slot_of[L->src[t]] == s;
                if (refs[s] == reads) chosen = s; // written over in place: nobody reads it later
            }
        if (chosen < 0) {
            // The smallest free slot that fits, else the largest free one (grown), else a new one.
            const int64_t need = value_floats(m, v);
            int32_t fit = -1, big = -1;
            for (int32_t s = 0; s < mp->n_slots; s++) {
                if (!is_free[s]) continue;
                if (mp->slot_floats[s] >= need && (fit < 0 || mp->slot_floats[s] < mp->slot_floats[fit])) fit = s;
                if (big < 0 || mp->slot_floats[s] > mp->slot_floats[big]) big = s;
            }
            chosen = fit >= 0 ? fit : big >= 0 ? big : mp->n_slots++;
            if (mp->slot_floats[chosen] < need) mp->slot_floats[chosen] = need;
            is_free[chosen] = false;
            refs[chosen] = 0;
        }
        for (int j = 0; j < L->n_src; j++) { // this layer's reads are done
            if (L->src[j] == 0) continue;
            const int32_t s = mp->slot_of[L->src[j]];
            if (--refs[s] == 0 && s != chosen) is_free[s] = true;
        }
        refs[chosen] += uses;
        mp->slot_of[v] = chosen;
    }
    free(refs);
    free(is_free);
    return true;
}

void bie_model_plans_free(bie_model_t * m) {
    struct model_plan * mp = m->plans;
    if (!mp) return;
    for (int i = 0; i < MAX_PLANS; i++) free(mp->p[i].steps);
    free(mp->slot_of);
    free(mp->slot_floats);
    free(mp->slot_off);
    free(mp->arena);
    free(mp->scratch);
    free(mp);
    m->plans = NULL;
}

static enum bie_status oom(bie_context_t * ctx) {
    return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "model: out of memory for the inference plan");
}

static enum bie_status create_plans(bie_context_t * ctx, bie_model_t * m) {
    struct model_plan * mp = calloc(1, sizeof *mp);
    if (!mp) return oom(ctx);
    m->plans = mp;
    const size_t nv = (size_t)m->n_layers + 1;
    mp->slot_of = calloc(nv, sizeof *mp->slot_of);
    mp->slot_floats = calloc(nv, sizeof *mp->slot_floats);
    mp->slot_off = calloc(nv, sizeof *mp->slot_off);
    bool ok = mp->slot_of && mp->slot_floats && mp->slot_off;
    for (int i = 0; ok && i < MAX_PLANS; i++) ok = (mp->p[i].steps = calloc((size_t)m->n_layers, sizeof(struct step)));
    if (!ok || !plan_memory(m, mp)) {
        bie_model_plans_free(m);
        return oom(ctx);
    }
    return BIE_STATUS_OK;
}

// Floats of scratch that layer L's route needs for n samples.
static size_t scratch_floats(const struct layer * L, int64_t n, bool float_layers) {
    if (L->kind != L_CONV && L->kind != L_LINEAR) return 0;
    if (L->q == Q_F32) return bie_model_fconv_scratch(L, n);
    return float_layers ? (size_t)(n * shape_numel(L->in)) + bie_model_fconv_scratch(L, n) : 0;
}

// The arena and the scratch for cap samples (every plan is rebuilt on the next call).
static enum bie_status ensure_arena(bie_context_t * ctx, bie_model_t * m, int64_t cap) {
    struct model_plan * mp = m->plans;
    if (cap <= mp->cap) return BIE_STATUS_OK;
    free(mp->arena);
    free(mp->scratch);
    mp->arena = mp->scratch = NULL;
    mp->cap = 0;
    for (int i = 0; i < MAX_PLANS; i++) mp->p[i].valid = false;
    size_t total = 0, scratch = 0;
    for (int32_t s = 0; s < mp->n_slots; s++) {
        mp->slot_off[s] = total;
        total += ((size_t)(mp->slot_floats[s] * cap) + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS;
    }
    for (int64_t i = 0; i < m->n_layers; i++) {
        const size_t a = scratch_floats(&m->L[i], cap, false), b = scratch_floats(&m->L[i], cap, true);
        scratch = a > scratch ? a : scratch;
        scratch = b > scratch ? b : scratch;
    }
    mp->arena = aligned_alloc(64, sizeof(float) * (total ? total : ALIGN_FLOATS));
    mp->scratch = malloc(sizeof(float) * (scratch ? scratch : 1));
    if (!mp->arena || !mp->scratch) return oom(ctx);
    mp->cap = cap;
    return BIE_STATUS_OK;
}

static float * value_ptr(const struct model_plan * mp, int32_t v) {
    return v == 0 ? NULL : mp->arena + mp->slot_off[mp->slot_of[v]];
}

// Fixes layer L's route and operands for plan p. x is the call's input (the operand of layers
// that read the model input, for validation); the layer's inputs are computed already.
static enum bie_status build_step(bie_context_t * ctx, bie_model_t * m, const struct plan * p, struct layer * L,
                                  const float * x, struct step * s) {
    const struct model_plan * mp = m->plans;
    const int64_t n = p->n, i = L - m->L;
    memset(s, 0, sizeof *s);
    s->L = L;
    for (int j = 0; j < L->n_src; j++) s->in[j] = value_ptr(mp, L->src[j]);
    s->out = value_ptr(mp, (int32_t)i + 1);
    s->count = n * shape_numel(L->in);
    switch (L->kind) {
    case L_CONV:
    case L_LINEAR: {
        if (L->q == Q_F32) {
            s->route = R_FCONV;
            break;
        }
        const float * in = s->in[0] ? s->in[0] : x;
        if (L->scale_a.v[0] == 0.0f) BIE_TRY(bie_model_init_scale_a(ctx, L, n, in)); // a model never trained
        if (p->float_layers) {
            s->route = R_QFLOAT;
            BIE_TRY(bie_model_weight_codes(ctx, L));
        } else {
            s->route = R_QCALL;
            struct qviews v;
            bie_model_qviews(L, n, in, s->out, &v);
            const struct bie_forward_args a = bie_model_qviews_forward(&v);
            BIE_TRY(bie_layer_prepare_forward(ctx, L->kind == L_LINEAR ? &v.ld : NULL, L->kind == L_CONV ? &v.cd : NULL,
                                              &a, &s->call));
        }
        break;
    }
    case L_BN:
        s->route = R_AFFINE;
        nn_batchnorm_affine(L->in[0], L->w.v, L->b.v, L->rmean, L->rvar, BN_EPS, L->bn_scale, L->bn_shift);
        break;
    case L_POOL:
        s->route = L->pool_kind == POOL_MAX ? R_MAXPOOL : L->pool_kind == POOL_AVG ? R_AVGPOOL : R_ADAPTIVE;
        s->pool = bie_model_pool_args(L, n);
        break;
    case L_ACT: s->route = L->prelu_n ? R_PRELU : R_ACT; break;
    case L_ADD: s->route = R_ADD; break;
    case L_FLATTEN:
        s->route = R_COPY; // only reached for the model input: other flattens have no step
        break;
    }
    return BIE_STATUS_OK;
}

// Runs one step over the batch of plan p; x is the call's input.
static enum bie_status run_step(bie_context_t * ctx, const struct model_plan * mp, struct step * s, int64_t n,
                                const float * x) {
    const struct layer * L = s->L;
    const float * a = s->in[0] ? s->in[0] : x;
    float * y = s->out;
    switch (s->route) {
    case R_QCALL:
        s->call.x.data = (void *)a;
        BIE_TRY(bie_layer_run(ctx, &s->call, false));
        bie_model_add_output_bias(L, n, y);
        break;
    case R_QFLOAT: {
        // a = codes of x', then y = (W_codes * a) * (scale_a * scale_w): integer-valued sums in f32
        // are exact below 2^24, so this is the low-bit layer's result through OpenBLAS.
        float *codes = mp->scratch, *rest = codes + n * shape_numel(L->in);
        bie_model_quantize_input(L, n, a, codes);
        bie_model_fconv_forward(L, n, codes, L->wcodes, NULL, y, rest);
        const float scale = L->scale_a.v[0] * L->scale_w;
        const int64_t total = n * shape_numel(L->out);
        NN_PARALLEL_FOR(total, i, total, { y[i] *= scale; });
        bie_model_add_output_bias(L, n, y);
        break;
    }
    case R_FCONV: bie_model_fconv_forward(L, n, a, L->w.v, L->b.v, y, mp->scratch); break;
    case R_AFFINE: nn_channel_affine(n, L->in[0], L->in[1] * L->in[2], L->bn_scale, L->bn_shift, a, y); break;
    case R_MAXPOOL: nn_maxpool_forward(&s->pool, a, y, NULL); break;
    case R_AVGPOOL: nn_avgpool_forward(&s->pool, a, y); break;
    case R_ADAPTIVE: nn_adaptive_avgpool_forward(n, L->in[0], L->in[1], L->in[2], L->out[1], L->out[2], a, y); break;
    case R_ACT: nn_act_forward(L->act, s->count, a, y); break;
    case R_PRELU: nn_prelu_forward(n, L->in[0], L->in[1] * L->in[2], L->w.v, L->prelu_n, a, y); break;
    case R_ADD: nn_add(s->count, a, s->in[1] ? s->in[1] : x, y); break;
    case R_COPY: memcpy(y, a, sizeof(float) * (size_t)s->count); break;
    }
    return BIE_STATUS_OK;
}

// The plan for (n, float_layers): a valid one, or the slot to build it in (*fresh).
static struct plan * find_plan(bie_model_t * m, int64_t n, bool float_layers, bool * fresh) {
    struct model_plan * mp = m->plans;
    struct plan * victim = &mp->p[0];
    for (int i = 0; i < MAX_PLANS; i++) {
        struct plan * p = &mp->p[i];
        const bool live = p->valid && p->version == m->params_version;
        if (live && p->n == n && p->float_layers == float_layers) {
            *fresh = false;
            return p;
        }
        if (!live) victim = p;
        else if (victim->valid && victim->version == m->params_version && p->last_used < victim->last_used) victim = p;
    }
    *fresh = true;
    victim->valid = false;
    victim->n = n;
    victim->float_layers = float_layers;
    victim->version = m->params_version;
    victim->n_steps = 0;
    return victim;
}

// Builds plan p while running it: each step is planned once its inputs exist.
static enum bie_status build_and_run(bie_context_t * ctx, bie_model_t * m, struct plan * p, const float * x) {
    struct model_plan * mp = m->plans;
    for (int64_t i = 0; i < m->n_layers; i++) {
        struct layer * L = &m->L[i];
        if (L->kind == L_FLATTEN && L->src[0] != 0) continue; // its value is its input's slot
        struct step * s = &p->steps[p->n_steps];
        BIE_TRY(build_step(ctx, m, p, L, x, s));
        p->n_steps++;
        BIE_TRY(run_step(ctx, mp, s, p->n, x));
    }
    p->out = value_ptr(mp, (int32_t)m->n_layers);
    p->valid = true;
    mp->builds++;
    return BIE_STATUS_OK;
}

enum bie_status bie_model_infer(bie_context_t * ctx, bie_model_t * m, const float * x, int64_t n, bool float_layers,
                                const float ** logits) {
    if (!m->plans) BIE_TRY(create_plans(ctx, m));
    struct model_plan * mp = m->plans;
    if (n > mp->cap) BIE_TRY(ensure_arena(ctx, m, n));
    bool fresh;
    struct plan * p = find_plan(m, n, float_layers, &fresh);
    p->last_used = ++mp->clock;
    if (fresh) {
        BIE_TRY(build_and_run(ctx, m, p, x));
    } else {
        for (int32_t i = 0; i < p->n_steps; i++) BIE_TRY(run_step(ctx, mp, &p->steps[i], n, x));
    }
    *logits = p->out;
    return BIE_STATUS_OK;
}

int64_t bie_model_plan_builds(const bie_model_t * m) { return m->plans ? m->plans->builds : 0; }

size_t bie_model_plan_arena_bytes(const bie_model_t * m) {
    const struct model_plan * mp = m->plans;
    if (!mp || !mp->cap) return 0;
    size_t total = 0;
    for (int32_t s = 0; s < mp->n_slots; s++) total += sizeof(float) * (size_t)(mp->slot_floats[s] * mp->cap);
    return total;
}
