// SPDX-License-Identifier: Apache-2.0
// model.c: the sequential model: architecture parsing, initialisation, forward, backward and the
// optimizer step. Low-bit layers go through bie's public layer API; float layers through OpenBLAS
// (float-layers.c); batch norm, pooling and activations through nn-ops.c.
#include "model-impl.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LAYERS 64
#define BN_MOMENTUM 0.1f
#define BN_EPS 1e-5f
#define AUX_LR_FACTOR 0.1f // learning rate of bias_a and scale_a relative to the weights'

// --- architecture -------------------------------------------------------------------------------

// Splits item into at most 8 whitespace-separated words (item is modified).
static int split_words(char * item, char ** words) {
    int n = 0;
    char * p = item;
    while (*p) {
        while (*p && isspace((unsigned char)*p)) p++;
        if (!*p) break;
        if (n == 8) return 9;
        words[n++] = p;
        while (*p && !isspace((unsigned char)*p)) p++;
        if (*p) *p++ = '\0';
    }
    return n;
}

static bool parse_int(const char * s, int64_t lo, int64_t hi, int64_t * out) {
    if (!*s) return false;
    int64_t v = 0;
    for (const char * p = s; *p; p++) {
        if (*p < '0' || *p > '9') return false;
        v = v * 10 + (*p - '0');
        if (v > hi) return false;
    }
    if (v < lo) return false;
    *out = v;
    return true;
}

static bool parse_q(const char * s, enum layer_q * q) {
    if (!strcmp(s, "f32")) *q = Q_F32;
    else if (!strcmp(s, "b1")) *q = Q_B1;
    else if (!strcmp(s, "q4")) *q = Q_Q4;
    else if (!strcmp(s, "q8")) *q = Q_Q8;
    else return false;
    return true;
}

static enum bie_status parse_item(bie_context_t * ctx, int64_t idx, char ** w, int nw, const int64_t in[3],
                                  struct layer * L) {
    memset(L, 0, sizeof *L);
    memcpy(L->in, in, sizeof L->in);
    memcpy(L->out, in, sizeof L->out);
    const char * kind = w[0];
    if (!strcmp(kind, "conv")) {
        // conv Q OUT K [STRIDE [PAD]]; PAD defaults to K/2 ("same" for odd K at stride 1)
        int64_t o, k, s = 1, p;
        if (nw < 4 || nw > 6 || !parse_q(w[1], &L->q) || !parse_int(w[2], 1, 65536, &o) ||
            !parse_int(w[3], 1, 15, &k))
            BIE_FAIL("arch: layer %lld: expected \"conv f32|b1|q4|q8 OUT K [STRIDE [PAD]]\"", (long long)idx);
        p = k / 2;
        if (nw > 4 && !parse_int(w[4], 1, 8, &s)) BIE_FAIL("arch: layer %lld: stride must be in [1, 8]", (long long)idx);
        if (nw > 5 && !parse_int(w[5], 0, k, &p)) BIE_FAIL("arch: layer %lld: padding must be in [0, K]", (long long)idx);
        if (in[1] + 2 * p < k || in[2] + 2 * p < k)
            BIE_FAIL("arch: layer %lld: a %lldx%lld kernel does not fit the %lldx%lld input", (long long)idx,
                 (long long)k, (long long)k, (long long)in[1], (long long)in[2]);
        L->kind = L_CONV;
        L->O = o;
        L->C = in[0];
        L->k = k;
        L->stride = s;
        L->pad = p;
        L->K = in[0] * k * k;
        L->out[0] = o;
        L->out[1] = (in[1] + 2 * p - k) / s + 1;
        L->out[2] = (in[2] + 2 * p - k) / s + 1;
    } else if (!strcmp(kind, "linear")) {
        int64_t o;
        if (nw != 3 || !parse_q(w[1], &L->q) || !parse_int(w[2], 1, 65536, &o))
            BIE_FAIL("arch: layer %lld: expected \"linear f32|b1|q4|q8 OUT\"", (long long)idx);
        L->kind = L_LINEAR;
        L->O = o;
        L->C = L->K = shape_numel(in);
        L->k = L->stride = 1;
        L->out[0] = o;
        L->out[1] = L->out[2] = 1;
    } else if (!strcmp(kind, "bn")) {
        if (nw != 1) BIE_FAIL("arch: layer %lld: \"bn\" takes no arguments", (long long)idx);
        L->kind = L_BN;
    } else if (!strcmp(kind, "maxpool")) {
        int64_t k;
        if (nw != 2 || !parse_int(w[1], 1, 16, &k) || k > in[1] || k > in[2])
            BIE_FAIL("arch: layer %lld: expected \"maxpool K\" with K <= the input's height and width", (long long)idx);
        L->kind = L_POOL;
        L->pool = (int32_t)k;
        L->out[1] = in[1] / k;
        L->out[2] = in[2] / k;
    } else if (!strcmp(kind, "relu") || !strcmp(kind, "sign") || !strcmp(kind, "hardtanh")) {
        if (nw != 1) BIE_FAIL("arch: layer %lld: \"%s\" takes no arguments", (long long)idx, kind);
        L->kind = L_ACT;
        L->act = !strcmp(kind, "relu") ? BIE_ACT_RELU : !strcmp(kind, "sign") ? BIE_ACT_SIGN : BIE_ACT_HARDTANH;
    } else {
        BIE_FAIL("arch: layer %lld: unknown layer \"%.20s\"", (long long)idx, kind);
    }
    if (shape_numel(L->out) > (1 << 24)) BIE_FAIL("arch: layer %lld: output larger than 2^24 values per sample", (long long)idx);
    if (L->kind == L_CONV || L->kind == L_LINEAR) {
        if (L->O * L->K > (INT64_C(1) << 28)) BIE_FAIL("arch: layer %lld: weight larger than 2^28 values", (long long)idx);
    }
    return BIE_STATUS_OK;
}

enum bie_status bie_model_parse_arch(bie_context_t * ctx, const char * arch, struct layer ** out_layers,
                                     int64_t * out_n) {
    *out_layers = NULL;
    *out_n = 0;
    if (!arch) BIE_FAIL("arch: is NULL");
    const size_t len = strlen(arch);
    if (len > 4096) BIE_FAIL("arch: longer than 4096 characters");
    char * copy = strdup(arch);
    struct layer * layers = calloc(MAX_LAYERS, sizeof *layers);
    if (!copy || !layers) {
        free(copy);
        free(layers);
        return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    enum bie_status s = BIE_STATUS_OK;
    int64_t shape[3] = {0, 0, 0}, n = 0;
    bool have_input = false;
    char * save = NULL;
    for (char * item = strtok_r(copy, ";", &save); item; item = strtok_r(NULL, ";", &save)) {
        char * w[9];
        int nw = split_words(item, w);
        if (nw == 0) continue;
        if (nw > 8) {
            s = bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "arch: too many words in an item");
            break;
        }
        if (!have_input) {
            if (strcmp(w[0], "input") != 0 || nw != 4 || !parse_int(w[1], 1, 4096, &shape[0]) ||
                !parse_int(w[2], 1, 4096, &shape[1]) || !parse_int(w[3], 1, 4096, &shape[2]) ||
                shape_numel(shape) > (1 << 24)) {
                s = bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT,
                                  "arch: must start with \"input C H W\" (each in [1, 4096], at most 2^24 values)");
                break;
            }
            have_input = true;
            continue;
        }
        if (n == MAX_LAYERS) {
            s = bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "arch: more than %d layers", MAX_LAYERS);
            break;
        }
        s = parse_item(ctx, n, w, nw, shape, &layers[n]);
        if (s != BIE_STATUS_OK) break;
        memcpy(shape, layers[n].out, sizeof shape);
        n++;
    }
    free(copy);
    if (s == BIE_STATUS_OK && (!have_input || n == 0)) s = bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "arch: no layers");
    if (s != BIE_STATUS_OK) {
        free(layers);
        return s;
    }
    *out_layers = layers;
    *out_n = n;
    return BIE_STATUS_OK;
}

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
    for (int64_t i = 0; i < m->n_layers; i++) {
        struct layer * L = &m->L[i];
        const bool train = !packed;
        if (L->kind == L_CONV || L->kind == L_LINEAR) {
            if (L->q == Q_F32) {
                ok = ok && param_alloc(&L->w, L->O * L->K, train) && param_alloc(&L->b, L->O, train);
            } else {
                ok = ok && param_alloc(&L->bias_a, L->C, train) && param_alloc(&L->scale_a, 1, train);
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
            }
        } else if (L->kind == L_BN) {
            const int64_t c = L->in[0];
            ok = ok && param_alloc(&L->w, c, train) && param_alloc(&L->b, c, train);
            L->rmean = calloc((size_t)c, sizeof(float));
            L->rvar = calloc((size_t)c, sizeof(float));
            L->smean = calloc((size_t)c, sizeof(float));
            L->sinvstd = calloc((size_t)c, sizeof(float));
            ok = ok && L->rmean && L->rvar && L->smean && L->sinvstd;
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
// beta 0, running var 1. Low-bit layers then derive scale_w (and the int8 latent weight).
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
            BIE_TRY(bie_diode_init(ctx, L->O * L->K, L->w8, splitmix64(&st), L->w.m, L->w.s));
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
        free(L->argmax);
        free(L->wcodes);
    }
    free(m->L);
    m->L = NULL;
}

void bie_model_destroy(bie_model_t * m) {
    if (!m) return;
    free_layers(m);
    if (m->act)
        for (int64_t i = 1; i <= m->n_layers; i++) free(m->act[i]);
    if (m->grad)
        for (int64_t i = 0; i <= m->n_layers; i++) free(m->grad[i]);
    free(m->act);
    free(m->grad);
    free(m->scratch);
    free(m->arch);
    free(m);
}

// Creates the structure (parsed architecture, allocated parameters, zeroed) without initialising.
enum bie_status bie_model_create_empty(bie_context_t * ctx, const char * arch, enum bie_latent latent,
                                       bool packed, bie_model_t ** out);
enum bie_status bie_model_create_empty(bie_context_t * ctx, const char * arch, enum bie_latent latent,
                                       bool packed, bie_model_t ** out) {
    *out = NULL;
    if (latent != BIE_LATENT_F32 && latent != BIE_LATENT_INT8) BIE_FAIL("latent: unknown value %d", (int)latent);
    bie_model_t * m = calloc(1, sizeof *m);
    if (!m) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
    m->latent = latent;
    enum bie_status s = bie_model_parse_arch(ctx, arch, &m->L, &m->n_layers);
    if (s == BIE_STATUS_OK) {
        m->arch = strdup(arch);
        m->act = calloc((size_t)m->n_layers + 1, sizeof(float *));
        m->grad = calloc((size_t)m->n_layers + 1, sizeof(float *));
        if (!m->arch || !m->act || !m->grad) s = bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
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
int64_t bie_model_num_inputs(const bie_model_t * m) { return m && m->n_layers ? shape_numel(m->L[0].in) : 0; }

// --- forward / backward -------------------------------------------------------------------------

static enum bie_status ensure_buffers(bie_context_t * ctx, bie_model_t * m, int64_t n, bool training) {
    if (n > m->cap_n) {
        for (int64_t i = 1; i <= m->n_layers; i++) {
            free(m->act[i]);
            m->act[i] = malloc(sizeof(float) * (size_t)(n * shape_numel(m->L[i - 1].out)));
            if (!m->act[i]) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "model: out of memory for activations");
        }
        for (int64_t i = 0; i <= m->n_layers; i++) {
            free(m->grad[i]);
            m->grad[i] = NULL;
        }
        for (int64_t i = 0; i < m->n_layers; i++) {
            free(m->L[i].argmax);
            m->L[i].argmax = NULL;
        }
        m->cap_n = n;
    }
    for (int64_t i = 0; i < m->n_layers; i++) {
        struct layer * L = &m->L[i];
        if (L->kind == L_POOL && !L->argmax) {
            L->argmax = malloc(sizeof(int32_t) * (size_t)(m->cap_n * shape_numel(L->out)));
            if (!L->argmax) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "model: out of memory");
        }
    }
    if (training)
        for (int64_t i = 1; i <= m->n_layers; i++)
            if (!m->grad[i]) {
                m->grad[i] = malloc(sizeof(float) * (size_t)(m->cap_n * shape_numel(m->L[i - 1].out)));
                if (!m->grad[i]) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "model: out of memory for gradients");
            }
    return BIE_STATUS_OK;
}

// Tensor views of a low-bit layer's operands.
struct qviews {
    struct bie_tensor x, y, w, bias_a, scale_a, scale_w, gx, gw, gsa, gba, gy;
    struct bie_linear_desc ld;
    struct bie_conv2d_desc cd;
};

static void make_views(const struct layer * L, float * scale_w, int64_t n, const float * x, float * y,
                       struct qviews * v) {
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
    bie_tensor_make(&v->scale_w, scale_w, BIE_DTYPE_F32, 0, NULL);
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

// Float codes of a low-bit layer's weight in [O, K] order (K = c, kh, kw), for float_layers mode:
// +-1 (b1) or the integer codes (q4, q8). The layer's output is then sgemm(...) * scale_a*scale_w.
static enum bie_status weight_codes(bie_context_t * ctx, struct layer * L) {
    if (L->wcodes) return BIE_STATUS_OK;
    L->wcodes = malloc(sizeof(float) * (size_t)(L->O * L->K));
    if (!L->wcodes) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
    struct qviews v;
    make_views(L, &L->scale_w, 1, NULL, NULL, &v);
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

// A low-bit layer run as a float GEMM: a = codes of x' (sign or clamp(rne(x'/scale_a))), then
// y = (W_codes * a) * (scale_a * scale_w). Integer-valued sums in f32 are exact below 2^24.
static enum bie_status qlayer_forward_float(bie_context_t * ctx, bie_model_t * m, struct layer * L, int64_t n,
                                            const float * x, float * y) {
    BIE_TRY(weight_codes(ctx, L));
    const int64_t in_n = shape_numel(L->in), P = L->out[1] * L->out[2];
    const size_t need = sizeof(float) * (size_t)(n * in_n + (L->K + L->O) * n * P);
    void * sp = NULL;
    BIE_TRY(bie_model_scratch(ctx, m, need, &sp));
    float * a = sp, * scratch = a + n * in_n;
    const float sa = L->scale_a.v[0];
    const int lo = L->q == Q_Q4 ? -8 : -128, hi = L->q == Q_Q4 ? 7 : 127;
    // bias_a is per channel for a conv, per input feature (all of C*H*W) for a linear layer.
    const int64_t hw = L->kind == L_CONV ? L->in[1] * L->in[2] : 1, nc = L->C;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n * in_n; i++) {
        const float xp = x[i] + L->bias_a.v[(i / hw) % nc];
        a[i] = L->q == Q_B1 ? (xp >= 0 ? 1.0f : -1.0f) : fminf(fmaxf(bie_rne(xp / sa), (float)lo), (float)hi);
    }
    const float scale = sa * L->scale_w;
    if (L->kind == L_LINEAR)
        bie_fconv_forward(n, L->K, 1, 1, L->O, 1, 1, 0, 0.0f, a, L->wcodes, NULL, y, scratch);
    else
        bie_fconv_forward(n, L->C, L->in[1], L->in[2], L->O, L->k, L->stride, L->pad, 0.0f, a, L->wcodes, NULL, y,
                          scratch);
    const int64_t total = n * shape_numel(L->out);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < total; i++) y[i] *= scale;
    return BIE_STATUS_OK;
}

static size_t fconv_scratch(const struct layer * L, int64_t n) {
    return sizeof(float) * (size_t)((L->K + L->O) * n * L->out[1] * L->out[2]);
}

enum bie_status bie_model_forward(bie_context_t * ctx, bie_model_t * m, const float * x, int64_t n, int training,
                                  int float_layers, const float ** logits) {
    BIE_ENTER(ctx);
    if (!m || !x || !logits) BIE_FAIL("model, x, logits: must not be NULL");
    if (n < 1 || n > (1 << 20)) BIE_FAIL("n: = %lld must be in [1, 2^20]", (long long)n);
    if (training && m->packed) BIE_FAIL("model: a packed model can only run inference (training = 0)");
    if (training && float_layers) BIE_FAIL("float_layers: only for inference");
    BIE_TRY(bie_model_check_memory(ctx, m, n, training, BIE_STATUS_OUT_OF_MEMORY));
    BIE_TRY(ensure_buffers(ctx, m, n, training));
    m->act[0] = (float *)x;
    m->n = n;
    m->have_training = false;
    for (int64_t i = 0; i < m->n_layers; i++) {
        struct layer * L = &m->L[i];
        const float * in = m->act[i];
        float * out = m->act[i + 1];
        switch (L->kind) {
        case L_CONV:
        case L_LINEAR:
            if (L->q == Q_F32) {
                void * sp = NULL;
                BIE_TRY(bie_model_scratch(ctx, m, fconv_scratch(L, n), &sp));
                if (L->kind == L_LINEAR)
                    bie_fconv_forward(n, L->K, 1, 1, L->O, 1, 1, 0, 0.0f, in, L->w.v, L->b.v, out, sp);
                else
                    bie_fconv_forward(n, L->C, L->in[1], L->in[2], L->O, L->k, L->stride, L->pad, 0.0f, in, L->w.v,
                                      L->b.v, out, sp);
                break;
            }
            if (L->scale_a.v[0] == 0.0f) { // lazy initialisation from the first batch
                struct qviews v;
                make_views(L, &L->scale_w, n, in, out, &v);
                BIE_TRY(bie_activation_scale_init(ctx, (enum bie_quant)L->q, 1, &v.x, &v.scale_a));
            }
            if (float_layers) {
                BIE_TRY(qlayer_forward_float(ctx, m, L, n, in, out));
            } else {
                struct qviews v;
                make_views(L, &L->scale_w, n, in, out, &v);
                struct bie_forward_args a = {&v.x, &v.bias_a, &v.w, &v.scale_a, &v.scale_w, &v.y};
                BIE_TRY(L->kind == L_CONV ? bie_conv2d_forward(ctx, &v.cd, &a) : bie_linear_forward(ctx, &v.ld, &a));
            }
            break;
        case L_BN:
            BIE_TRY(bie_batchnorm_forward(ctx, n, L->in[0], L->in[1] * L->in[2], in, L->w.v, L->b.v, L->rmean, L->rvar,
                                      BN_MOMENTUM, BN_EPS, training, L->smean, L->sinvstd, out));
            break;
        case L_POOL:
            BIE_TRY(bie_maxpool2d_forward(ctx, n, L->in[0], L->in[1], L->in[2], L->pool, in, out, L->argmax));
            break;
        case L_ACT:
            BIE_TRY(bie_activation_forward(ctx, L->act, n * shape_numel(L->in), in, out));
            break;
        }
    }
    m->have_training = training != 0;
    *logits = m->act[m->n_layers];
    return BIE_STATUS_OK;
}

enum bie_status bie_model_backward(bie_context_t * ctx, bie_model_t * m, const float * grad_logits) {
    BIE_ENTER(ctx);
    if (!m || !grad_logits) BIE_FAIL("model, grad_logits: must not be NULL");
    if (!m->have_training) BIE_FAIL("model: backward needs a training forward first");
    const int64_t n = m->n;
    memcpy(m->grad[m->n_layers], grad_logits, sizeof(float) * (size_t)(n * bie_model_num_outputs(m)));
    for (int64_t i = m->n_layers - 1; i >= 0; i--) {
        struct layer * L = &m->L[i];
        const float * in = m->act[i], * gy = m->grad[i + 1];
        float * gx = i > 0 ? m->grad[i] : NULL;
        switch (L->kind) {
        case L_CONV:
        case L_LINEAR:
            if (L->q == Q_F32) {
                void * sp = NULL;
                BIE_TRY(bie_model_scratch(ctx, m, fconv_scratch(L, n), &sp));
                if (L->kind == L_LINEAR)
                    bie_fconv_backward(n, L->K, 1, 1, L->O, 1, 1, 0, in, L->w.v, gy, gx, L->w.g, L->b.g, sp);
                else
                    bie_fconv_backward(n, L->C, L->in[1], L->in[2], L->O, L->k, L->stride, L->pad, in, L->w.v, gy,
                                       gx, L->w.g, L->b.g, sp);
            } else {
                struct qviews v;
                make_views(L, &L->scale_w, n, in, NULL, &v);
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
                struct bie_backward_args a = {&v.x, &v.bias_a, &v.w, &v.scale_a, &v.scale_w, &v.gy,
                                              gx ? &v.gx : NULL, &v.gw, &v.gsa, &v.gba, NULL};
                BIE_TRY(conv ? bie_conv2d_backward(ctx, &v.cd, &a) : bie_linear_backward(ctx, &v.ld, &a));
            }
            break;
        case L_BN:
            BIE_TRY(bie_batchnorm_backward(ctx, n, L->in[0], L->in[1] * L->in[2], in, L->w.v, L->smean, L->sinvstd, gy,
                                       gx, L->w.g, L->b.g));
            break;
        case L_POOL:
            if (gx) BIE_TRY(bie_maxpool2d_backward(ctx, n, L->in[0], L->in[1], L->in[2], L->pool, gy, L->argmax, gx));
            break;
        case L_ACT:
            if (gx) BIE_TRY(bie_activation_backward(ctx, L->act, n * shape_numel(L->in), in, gy, gx));
            break;
        }
    }
    return BIE_STATUS_OK;
}

enum bie_status bie_model_step(bie_context_t * ctx, bie_model_t * m, float lr, float weight_decay, float diode_lr) {
    BIE_ENTER(ctx);
    if (!m) BIE_FAIL("model: is NULL");
    if (m->packed) BIE_FAIL("model: a packed model cannot be trained");
    if (m->step >= BIE_MODEL_MAX_STEP) BIE_FAIL("model: step count %lld is at its bound 2^62", (long long)m->step);
    m->step++;
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
            BIE_TRY(bie_adam_step(ctx, &ap, m->step, L->w.n, L->w.v, L->w.g, L->w.m, L->w.s));
            ap.weight_decay = 0;
            BIE_TRY(bie_adam_step(ctx, &ap, m->step, L->b.n, L->b.v, L->b.g, L->b.m, L->b.s));
        } else if (L->kind == L_CONV || L->kind == L_LINEAR) {
            // bias_a and scale_a duplicate the preceding batch norm's beta and gamma (the pair only
            // moves the threshold and the STE window): a tenth of the rate keeps Adam from driving
            // the threshold out of the data's range, where the window would close for good.
            struct bie_adam_params aux = ap;
            aux.lr = ap.lr * AUX_LR_FACTOR;
            aux.weight_decay = 0;
            aux.clip = 0;
            BIE_TRY(bie_adam_step(ctx, &aux, m->step, L->bias_a.n, L->bias_a.v, L->bias_a.g, L->bias_a.m, L->bias_a.s));
            BIE_TRY(bie_adam_step(ctx, &aux, m->step, 1, L->scale_a.v, L->scale_a.g, L->scale_a.m, L->scale_a.s));
            if (!(L->scale_a.v[0] > 1e-6f)) L->scale_a.v[0] = 1e-6f; // the layer needs scale_a > 0
            if (L->w8) {
                BIE_TRY(bie_diode_step(ctx, &dp, L->w.n, L->w8, L->w.g, L->w.m, L->w.s, NULL));
            } else {
                // Latent binary weights live in [-1, 1] (BinaryConnect); n-bit latents in the
                // quantizer's range, so they cannot drift far past the clamp.
                const float range = L->q == Q_B1 ? 1.0f : L->scale_w * (L->q == Q_Q4 ? 8.0f : 128.0f);
                ap.clip = range;
                BIE_TRY(bie_adam_step(ctx, &ap, m->step, L->w.n, L->w.v, L->w.g, L->w.m, L->w.s));
            }
        }
    }
    return BIE_STATUS_OK;
}
