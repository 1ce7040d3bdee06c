// SPDX-License-Identifier: Apache-2.0
// model-arch.c: the architecture string (docs/model-format.md has the grammar): one layer per
// ';'-separated item, words separated by blanks. Every layer reads the previous item's output
// unless it names its input(s) with "@J" (layer J's output) or "@input" (the model's input), which
// makes the model a graph (residual adds). The parser fills each layer's geometry and graph, and
// checks every shape, so the forward and backward passes never meet a shape they did not expect.
#include "model-impl.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LAYERS 1024
#define MAX_ARCH_CHARS 65536
#define MAX_WORDS 12

// Splits item into at most MAX_WORDS whitespace-separated words (item is modified); returns
// MAX_WORDS + 1 when there are more.
static int split_words(char * item, char ** words) {
    int n = 0;
    char * p = item;
    while (*p) {
        while (*p && isspace((unsigned char)*p)) p++;
        if (!*p) break;
        if (n == MAX_WORDS) return MAX_WORDS + 1;
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

static const struct {
    const char * name;
    enum nn_act act;
    int32_t version;
} acts[] = {
    {"relu", NN_ACT_RELU, 1}, {"sign", NN_ACT_SIGN, 1}, {"hardtanh", NN_ACT_HARDTANH, 1},
    {"tanh", NN_ACT_TANH, 2}, {"gelu", NN_ACT_GELU, 2}, {"gelu_tanh", NN_ACT_GELU_TANH, 2},
    {"silu", NN_ACT_SILU, 2},
};

const char * bie_model_kind_name(const struct layer * L) {
    switch (L->kind) {
    case L_CONV: return "conv";
    case L_LINEAR: return "linear";
    case L_BN: return "bn";
    case L_POOL:
        return L->pool_kind == POOL_MAX ? "maxpool" : L->pool_kind == POOL_AVG ? "avgpool" : "adaptive_avgpool";
    case L_ADD: return "add";
    case L_FLATTEN: return "flatten";
    case L_ACT:
        if (L->prelu_n) return "prelu";
        for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++)
            if (acts[i].act == L->act) return acts[i].name;
    }
    return "?";
}

// "conv Q OUT K [STRIDE [PAD]] [bias]" (layer li, of input shape in) into L; PAD defaults to K/2
// ("same" for odd K at stride 1).
static enum bie_status parse_conv(bie_context_t * ctx, long long li, char ** w, int nw, const int64_t * in,
                                  struct layer * L) {
    int64_t o, k, s = 1, p;
    L->has_bias = nw > 4 && !strcmp(w[nw - 1], "bias");
    nw -= L->has_bias;
    if (nw < 4 || nw > 6 || !parse_q(w[1], &L->q) || !parse_int(w[2], 1, 65536, &o) || !parse_int(w[3], 1, 15, &k))
        BIE_FAIL("arch: layer %lld: expected \"conv f32|b1|q4|q8 OUT K [STRIDE [PAD]] [bias]\"", li);
    p = k / 2;
    if (nw > 4 && !parse_int(w[4], 1, 8, &s)) BIE_FAIL("arch: layer %lld: stride must be in [1, 8]", li);
    if (nw > 5 && !parse_int(w[5], 0, k, &p)) BIE_FAIL("arch: layer %lld: padding must be in [0, K]", li);
    if (in[1] + 2 * p < k || in[2] + 2 * p < k)
        BIE_FAIL("arch: layer %lld: a %lldx%lld kernel does not fit the %lldx%lld input", li, (long long)k,
                 (long long)k, (long long)in[1], (long long)in[2]);
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
    return BIE_STATUS_OK;
}

// One item: the words w[0..nw) without the "@" words, whose values are in src[0..ns). shapes[v]
// is the per-sample shape of value v. *version is raised to what the item needs.
static enum bie_status parse_item(bie_context_t * ctx, int64_t idx, char ** w, int nw, const int32_t * src, int ns,
                                  const int64_t (*shapes)[3], struct layer * L, int32_t * version) {
    memset(L, 0, sizeof *L);
    const char * kind = w[0];
    const long long li = (long long)idx;
    const bool is_add = !strcmp(kind, "add");
    if (ns > (is_add ? 2 : 1))
        BIE_FAIL("arch: layer %lld: \"%s\" reads %s input", li, kind, is_add ? "at most two \"@\"" : "one");
    if (ns > 0) *version = 2;
    // The inputs: the previous layer's output (value idx) unless named; "add @J" adds the
    // previous layer's output and layer J's.
    L->n_src = is_add ? 2 : 1;
    L->src[0] = ns == L->n_src ? src[0] : (int32_t)idx;
    L->src[1] = !is_add ? 0 : ns == 2 ? src[1] : ns == 1 ? src[0] : (int32_t)idx;
    const int64_t * in = shapes[L->src[0]];
    memcpy(L->in, in, sizeof L->in);
    memcpy(L->out, in, sizeof L->out);
    if (!strcmp(kind, "conv")) {
        BIE_TRY(parse_conv(ctx, li, w, nw, in, L));
    } else if (!strcmp(kind, "linear")) {
        int64_t o;
        L->has_bias = nw == 4 && !strcmp(w[3], "bias");
        if (nw != 3 + L->has_bias || !parse_q(w[1], &L->q) || !parse_int(w[2], 1, 65536, &o))
            BIE_FAIL("arch: layer %lld: expected \"linear f32|b1|q4|q8 OUT [bias]\"", li);
        L->kind = L_LINEAR;
        L->O = o;
        L->C = L->K = shape_numel(in);
        L->k = L->stride = 1;
        L->out[0] = o;
        L->out[1] = L->out[2] = 1;
    } else if (!strcmp(kind, "bn")) {
        if (nw != 1) BIE_FAIL("arch: layer %lld: \"bn\" takes no arguments", li);
        L->kind = L_BN;
    } else if (!strcmp(kind, "maxpool") || !strcmp(kind, "avgpool")) {
        // maxpool|avgpool K [STRIDE [PAD]]: stride K and no padding by default
        int64_t k, s, p = 0;
        const bool avg = kind[0] == 'a';
        if (nw < 2 || nw > 4 || !parse_int(w[1], 1, 16, &k))
            BIE_FAIL("arch: layer %lld: expected \"%s K [STRIDE [PAD]]\" with K in [1, 16]", li, kind);
        s = k;
        if (nw > 2 && !parse_int(w[2], 1, 16, &s)) BIE_FAIL("arch: layer %lld: stride must be in [1, 16]", li);
        if (nw > 3 && !parse_int(w[3], 0, k / 2, &p)) BIE_FAIL("arch: layer %lld: padding must be in [0, K/2]", li);
        if (in[1] + 2 * p < k || in[2] + 2 * p < k)
            BIE_FAIL("arch: layer %lld: a %lldx%lld window does not fit the %lldx%lld input", li, (long long)k,
                     (long long)k, (long long)in[1], (long long)in[2]);
        if (avg || nw > 2) *version = 2;
        L->kind = L_POOL;
        L->pool_kind = avg ? POOL_AVG : POOL_MAX;
        L->pool = (int32_t)k;
        L->pool_stride = (int32_t)s;
        L->pool_pad = (int32_t)p;
        L->out[1] = (in[1] + 2 * p - k) / s + 1;
        L->out[2] = (in[2] + 2 * p - k) / s + 1;
    } else if (!strcmp(kind, "adaptive_avgpool")) {
        // adaptive_avgpool OH [OW]
        int64_t oh, ow;
        if (nw < 2 || nw > 3 || !parse_int(w[1], 1, 4096, &oh) || (nw == 3 && !parse_int(w[2], 1, 4096, &ow)))
            BIE_FAIL("arch: layer %lld: expected \"adaptive_avgpool OH [OW]\"", li);
        if (nw == 2) ow = oh;
        if (oh > in[1] || ow > in[2])
            BIE_FAIL("arch: layer %lld: an adaptive pool to %lldx%lld of a %lldx%lld input", li, (long long)oh,
                     (long long)ow, (long long)in[1], (long long)in[2]);
        *version = 2;
        L->kind = L_POOL;
        L->pool_kind = POOL_ADAPTIVE_AVG;
        L->out[1] = oh;
        L->out[2] = ow;
    } else if (!strcmp(kind, "flatten")) {
        if (nw != 1) BIE_FAIL("arch: layer %lld: \"flatten\" takes no arguments", li);
        *version = 2;
        L->kind = L_FLATTEN;
        L->out[0] = shape_numel(in);
        L->out[1] = L->out[2] = 1;
    } else if (!strcmp(kind, "prelu")) {
        int64_t n;
        if (nw != 2 || !parse_int(w[1], 1, INT64_C(1) << 24, &n) || (n != 1 && n != in[0]))
            BIE_FAIL("arch: layer %lld: expected \"prelu N\" with N = 1 or the %lld channels", li, (long long)in[0]);
        *version = 2;
        L->kind = L_ACT;
        L->prelu_n = n;
    } else if (is_add) {
        if (nw != 1 || ns < 1) BIE_FAIL("arch: layer %lld: expected \"add @J\" or \"add @I @J\"", li);
        const int64_t * b = shapes[L->src[1]];
        if (b[0] != in[0] || b[1] != in[1] || b[2] != in[2])
            BIE_FAIL("arch: layer %lld: adds a %lldx%lldx%lld value to a %lldx%lldx%lld one", li, (long long)in[0],
                     (long long)in[1], (long long)in[2], (long long)b[0], (long long)b[1], (long long)b[2]);
        *version = 2;
        L->kind = L_ADD;
    } else {
        size_t a = 0;
        while (a < sizeof acts / sizeof acts[0] && strcmp(kind, acts[a].name) != 0) a++;
        if (a == sizeof acts / sizeof acts[0]) BIE_FAIL("arch: layer %lld: unknown layer \"%.20s\"", li, kind);
        if (nw != 1) BIE_FAIL("arch: layer %lld: \"%s\" takes no arguments", li, kind);
        if (acts[a].version > *version) *version = acts[a].version;
        L->kind = L_ACT;
        L->act = acts[a].act;
    }
    if (L->has_bias) {
        if (L->q == Q_F32) BIE_FAIL("arch: layer %lld: a f32 layer always has its bias (drop the word \"bias\")", li);
        *version = 2;
    }
    if (shape_numel(L->out) > (1 << 24)) BIE_FAIL("arch: layer %lld: output larger than 2^24 values per sample", li);
    if (L->kind == L_CONV || L->kind == L_LINEAR) {
        if (L->O * L->K > (INT64_C(1) << 28)) BIE_FAIL("arch: layer %lld: weight larger than 2^28 values", li);
    }
    return BIE_STATUS_OK;
}

// "@input" -> 0, "@J" -> J + 1 for a layer J before layer idx.
static enum bie_status parse_source(bie_context_t * ctx, int64_t idx, const char * word, int32_t * out) {
    int64_t j;
    if (!strcmp(word, "@input")) {
        *out = 0;
        return BIE_STATUS_OK;
    }
    if (!parse_int(word + 1, 0, MAX_LAYERS, &j) || j >= idx)
        BIE_FAIL("arch: layer %lld: \"%.20s\" names no earlier layer (\"@J\" with J < %lld, or \"@input\")",
                 (long long)idx, word, (long long)idx);
    *out = (int32_t)(j + 1);
    return BIE_STATUS_OK;
}

static enum bie_status parse_items(bie_context_t * ctx, char * copy, struct arch * a, int64_t (*shapes)[3]) {
    bool have_input = false;
    char * save = NULL;
    for (char * item = strtok_r(copy, ";", &save); item; item = strtok_r(NULL, ";", &save)) {
        char * w[MAX_WORDS + 1];
        const int nw = split_words(item, w);
        if (nw == 0) continue;
        if (nw > MAX_WORDS) BIE_FAIL("arch: too many words in an item");
        if (!have_input) {
            if (strcmp(w[0], "input") != 0 || nw != 4 || !parse_int(w[1], 1, 4096, &a->input[0]) ||
                !parse_int(w[2], 1, 4096, &a->input[1]) || !parse_int(w[3], 1, 4096, &a->input[2]) ||
                shape_numel(a->input) > (1 << 24))
                BIE_FAIL("arch: must start with \"input C H W\" (each in [1, 4096], at most 2^24 values)");
            memcpy(shapes[0], a->input, sizeof shapes[0]);
            have_input = true;
            continue;
        }
        if (a->n == MAX_LAYERS) BIE_FAIL("arch: more than %d layers", MAX_LAYERS);
        char * words[MAX_WORDS];
        int32_t src[MAX_WORDS];
        int nk = 0, ns = 0;
        for (int i = 0; i < nw; i++) {
            if (w[i][0] != '@') {
                words[nk++] = w[i];
            } else if (i == 0) {
                BIE_FAIL("arch: layer %lld: an item starts with its kind, not \"%.20s\"", (long long)a->n, w[i]);
            } else {
                BIE_TRY(parse_source(ctx, a->n, w[i], &src[ns]));
                ns++;
            }
        }
        struct layer * L = &a->L[a->n];
        BIE_TRY(parse_item(ctx, a->n, words, nk, src, ns, (const int64_t(*)[3])shapes, L, &a->version));
        memcpy(shapes[a->n + 1], L->out, sizeof shapes[0]);
        a->n++;
    }
    if (!have_input || a->n == 0) BIE_FAIL("arch: no layers");
    // Every layer's output but the last is read by a later layer: a dead branch would have no
    // gradient and no purpose.
    for (int64_t i = 0; i < a->n; i++)
        for (int j = 0; j < a->L[i].n_src; j++)
            if (a->L[i].src[j] > 0) a->L[a->L[i].src[j] - 1].uses++;
    for (int64_t i = 0; i + 1 < a->n; i++)
        if (a->L[i].uses == 0) BIE_FAIL("arch: layer %lld: its output is never read", (long long)i);
    return BIE_STATUS_OK;
}

enum bie_status bie_model_parse_arch(bie_context_t * ctx, const char * arch, struct arch * out) {
    memset(out, 0, sizeof *out);
    if (!arch) BIE_FAIL("arch: is NULL");
    if (strlen(arch) > MAX_ARCH_CHARS) BIE_FAIL("arch: longer than %d characters", MAX_ARCH_CHARS);
    // Layers cannot outnumber the items: count the separators to size the arrays.
    int64_t items = 1;
    for (const char * p = arch; *p; p++) items += *p == ';';
    if (items > MAX_LAYERS + 1) items = MAX_LAYERS + 1;
    char * copy = strdup(arch);
    struct layer * layers = calloc((size_t)items, sizeof *layers);
    int64_t(*shapes)[3] = calloc((size_t)items + 1, sizeof *shapes);
    if (!copy || !layers || !shapes) {
        free(copy);
        free(layers);
        free(shapes);
        return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    out->L = layers;
    out->version = 1;
    const enum bie_status s = parse_items(ctx, copy, out, shapes);
    free(copy);
    free(shapes);
    if (s != BIE_STATUS_OK) {
        free(layers);
        memset(out, 0, sizeof *out);
    }
    return s;
}
