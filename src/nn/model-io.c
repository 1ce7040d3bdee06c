// SPDX-License-Identifier: Apache-2.0
// model-io.c: model files (safetensors, docs/model-format.md) and per-layer size information.
//
// Tensor names are "layers.<i>.<field>" with <i> the layer's index in the architecture:
//   float conv/linear: weight (F32 [O, C, kh, kw] or [O, K]), bias (F32 [O])
//   low-bit layers:    bias_a (F32 [C]), scale_a, scale_w (F32 [1]), the optional output bias
//                      (F32 [O]) and the weight:
//     packed files: weight_b1 (U8 [O, kh, kw, ceil(C/8)]: bits LSB first, channels fastest, OHWI),
//                   weight_s4 (U8 [O, kh, kw, ceil(C/2)]: nibbles, even element in the high nibble),
//                   weight_q8 (I8 [O, kh, kw, C]: codes); a linear layer has kh = kw = 1, C = K
//     checkpoints:  weight (F32 [O, C, kh, kw] latent) or weight_latent_i8 (I8, Diode)
//   bn: gamma, beta, running_mean, running_var (F32 [C]); prelu: weight (F32 [1] or [C])
// Checkpoints add "<tensor>.opt_m" and "<tensor>.opt_v" (Adam moments, or Diode's m and s) for
// every trained tensor. __metadata__ holds bie.format ("packed" or "checkpoint"), bie.version,
// bie.format_version (the model format version the architecture needs; absent means 1),
// bie.arch, bie.latent, bie.step, bie.seed, and, per packed weight, "<name>" = "b1 [O,C,kh,kw]
// ohwi" (the logical shape and order).
#include "model-impl.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// One tensor of a model file: where its bytes live in memory (value, and optimizer state).
struct entry {
    char name[96];
    enum bie_dtype dtype;
    int32_t ndim;
    int64_t shape[4];
    void * data;
    size_t nbytes;
    float *opt_m, *opt_v;                // checkpoints only; NULL when the tensor is not trained
    char logical[96];                    // packed weights: their logical shape, for the metadata
    enum { ANY, NONNEG, POSITIVE } rule; // its values: any (finite) value, >= 0 or > 0
    bool diode;                          // opt_m, opt_v are Diode's m and s (s has either sign), not Adam's m and v
};

struct entries {
    struct entry * e;
    size_t n, cap;
    bool oom;
};

static struct entry * add(struct entries * es, int64_t layer, const char * field, enum bie_dtype dt, int32_t ndim,
                          const int64_t * shape, void * data, size_t elem) {
    if (es->n == es->cap) {
        size_t nc = es->cap ? es->cap * 2 : 32;
        struct entry * ne = realloc(es->e, nc * sizeof *ne);
        if (!ne) {
            es->oom = true;
            return NULL;
        }
        es->e = ne;
        es->cap = nc;
    }
    struct entry * e = &es->e[es->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "layers.%" PRId64 ".%s", layer, field);
    e->dtype = dt;
    e->ndim = ndim;
    size_t numel = 1;
    for (int32_t i = 0; i < ndim; i++) {
        e->shape[i] = shape[i];
        numel *= (size_t)shape[i];
    }
    e->data = data;
    e->nbytes = numel * elem;
    return e;
}

static struct entry * add_param(struct entries * es, int64_t layer, const char * field, struct param * p, int32_t ndim,
                                const int64_t * shape, bool with_opt) {
    struct entry * e = add(es, layer, field, BIE_DTYPE_F32, ndim, shape, p->v, sizeof(float));
    if (e && with_opt && p->m) {
        e->opt_m = p->m;
        e->opt_v = p->s;
    }
    return e;
}

// Lists the tensors of a model file of the given kind, pointing into the model's buffers.
static void list_entries(bie_model_t * m, enum bie_model_file kind, struct entries * es) {
    const bool ck = kind == BIE_MODEL_FILE_CHECKPOINT;
    for (int64_t i = 0; i < m->n_layers; i++) {
        struct layer * L = &m->L[i];
        const int64_t one[1] = {1};
        if (L->kind == L_BN) {
            const int64_t c[1] = {L->in[0]};
            add_param(es, i, "gamma", &L->w, 1, c, ck);
            add_param(es, i, "beta", &L->b, 1, c, ck);
            add(es, i, "running_mean", BIE_DTYPE_F32, 1, c, L->rmean, sizeof(float));
            struct entry * rv = add(es, i, "running_var", BIE_DTYPE_F32, 1, c, L->rvar, sizeof(float));
            if (rv) rv->rule = NONNEG;
            continue;
        }
        if (L->kind == L_ACT && L->prelu_n) {
            const int64_t sl[1] = {L->prelu_n};
            add_param(es, i, "weight", &L->w, 1, sl, ck);
            continue;
        }
        if (L->kind != L_CONV && L->kind != L_LINEAR) continue;
        const bool conv = L->kind == L_CONV;
        const int64_t w4[4] = {L->O, L->C, L->k, L->k}, w2[2] = {L->O, L->K}, o1[1] = {L->O};
        if (L->q == Q_F32) {
            add_param(es, i, "weight", &L->w, conv ? 4 : 2, conv ? w4 : w2, ck);
            add_param(es, i, "bias", &L->b, 1, o1, ck);
            continue;
        }
        const int64_t c1[1] = {L->C};
        add_param(es, i, "bias_a", &L->bias_a, 1, c1, ck);
        struct entry * sa = add_param(es, i, "scale_a", &L->scale_a, 1, one, ck);
        if (sa) sa->rule = ck ? NONNEG : POSITIVE; // 0 until the first batch initialises it
        struct entry * sw = add(es, i, "scale_w", BIE_DTYPE_F32, 1, one, &L->scale_w, sizeof(float));
        if (sw) sw->rule = POSITIVE;
        if (kind == BIE_MODEL_FILE_PACKED) {
            const int64_t per = L->q == Q_B1 ? (L->C + 7) / 8 : L->q == Q_Q4 ? (L->C + 1) / 2 : L->C;
            const int64_t shape[4] = {L->O, L->k, L->k, per};
            const char * f = L->q == Q_B1 ? "weight_b1" : L->q == Q_Q4 ? "weight_s4" : "weight_q8";
            struct entry * e = add(es, i, f, L->q == Q_Q8 ? BIE_DTYPE_I8 : BIE_DTYPE_U8, 4, shape, L->packed, 1);
            if (e)
                snprintf(e->logical, sizeof e->logical, "%s [%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 "] ohwi",
                         L->q == Q_B1   ? "b1"
                         : L->q == Q_Q4 ? "s4"
                                        : "i8",
                         L->O, L->C, L->k, L->k);
        } else if (L->q == Q_B1 && m->latent == BIE_LATENT_INT8) {
            struct entry * e = add(es, i, "weight_latent_i8", BIE_DTYPE_I8, conv ? 4 : 2, conv ? w4 : w2, L->w8, 1);
            if (e) {
                e->opt_m = L->w.m;
                e->opt_v = L->w.s;
                e->diode = true;
            }
        } else {
            add_param(es, i, "weight", &L->w, conv ? 4 : 2, conv ? w4 : w2, true);
        }
        if (L->has_bias) add_param(es, i, "bias", &L->b, 1, o1, ck);
    }
}

// Bytes of the tensor values a file of this kind holds for the architecture: exact for a packed
// file, a lower bound for a checkpoint (without the optimizer state). Nothing is allocated but
// the list. Returns false when out of memory.
static bool file_bytes(const struct arch * a, enum bie_latent latent, enum bie_model_file kind, uint64_t * out) {
    bie_model_t shape_only = {.L = a->L, .n_layers = a->n, .latent = latent};
    struct entries es = {0};
    list_entries(&shape_only, kind, &es);
    uint64_t total = 0;
    for (size_t i = 0; i < es.n; i++) total += es.e[i].nbytes;
    free(es.e);
    *out = total;
    return !es.oom;
}

// Packs the low-bit weights of a trained model into a packed twin's buffers.
static enum bie_status pack_into(bie_context_t * ctx, const bie_model_t * m, bie_model_t * p) {
    for (int64_t i = 0; i < m->n_layers; i++) {
        const struct layer * L = &m->L[i];
        struct layer * P = &p->L[i];
        if ((L->kind != L_CONV && L->kind != L_LINEAR) || L->q == Q_F32) continue;
        const int64_t w4[4] = {L->O, L->C, L->k, L->k};
        struct bie_tensor src, dst, sw;
        if (L->w8) bie_tensor_make(&src, L->w8, BIE_DTYPE_I8, 4, w4);
        else bie_tensor_make(&src, L->w.v, BIE_DTYPE_F32, 4, w4);
        const enum bie_dtype dt = L->q == Q_B1 ? BIE_DTYPE_B1 : L->q == Q_Q4 ? BIE_DTYPE_S4 : BIE_DTYPE_I8;
        const int64_t ohwi[4] = {L->O, L->k, L->k, L->C};
        bie_tensor_make(&dst, P->packed, dt, 4, ohwi);
        const int32_t perm[4] = {0, 3, 1, 2};
        bie_tensor_permute(&dst, perm);
        bie_tensor_make(&sw, (void *)&L->scale_w, BIE_DTYPE_F32, 0, NULL);
        BIE_TRY(bie_pack(ctx, &src, L->q == Q_B1 || L->w8 ? NULL : &sw, &dst));
    }
    return BIE_STATUS_OK;
}

// Copies every float parameter and statistic of m into p (same architecture).
static void copy_floats(const bie_model_t * m, bie_model_t * p) {
    for (int64_t i = 0; i < m->n_layers; i++) {
        const struct layer * L = &m->L[i];
        struct layer * P = &p->L[i];
        const struct param * src[4] = {&L->w, &L->b, &L->bias_a, &L->scale_a};
        struct param * dst[4] = {&P->w, &P->b, &P->bias_a, &P->scale_a};
        for (int j = 0; j < 4; j++)
            if (src[j]->v && dst[j]->v) memcpy(dst[j]->v, src[j]->v, sizeof(float) * (size_t)src[j]->n);
        if (L->kind == L_BN) {
            memcpy(P->rmean, L->rmean, sizeof(float) * (size_t)L->in[0]);
            memcpy(P->rvar, L->rvar, sizeof(float) * (size_t)L->in[0]);
        }
        P->scale_w = L->scale_w;
    }
}

// n floats of tensor `name` (suffix appended): finite, |v| <= BIE_MODEL_MAX_VALUE, and >= 0 or > 0
// as the rule says. Else `status` naming the first value that is not.
static enum bie_status check_floats(bie_context_t * ctx, enum bie_status status, const char * name, const char * suffix,
                                    const float * v, size_t n, int rule) {
    for (size_t i = 0; i < n; i++) {
        const float x = v[i];
        const char * why = !isfinite(x)                      ? "is not finite"
                           : fabsf(x) > BIE_MODEL_MAX_VALUE  ? "exceeds 1e30 in magnitude"
                           : rule == NONNEG && x < 0.0f      ? "is negative"
                           : rule == POSITIVE && !(x > 0.0f) ? "must be > 0 (a scale_a of 0: the layer never ran)"
                                                             : NULL;
        if (why) return bie_set_error(ctx, status, "%s%s[%zu] = %g %s", name, suffix, i, (double)x, why);
    }
    return BIE_STATUS_OK;
}

// Every float a model file of this kind holds (docs/limits.md): the values, and in checkpoints
// the optimizer state (Adam's second moment >= 0).
static enum bie_status check_values(bie_context_t * ctx, const struct entries * es, bool ck, enum bie_status status) {
    for (size_t i = 0; i < es->n; i++) {
        const struct entry * e = &es->e[i];
        const size_t n = e->dtype == BIE_DTYPE_F32 ? e->nbytes / sizeof(float) : e->nbytes;
        if (e->dtype == BIE_DTYPE_F32) BIE_TRY(check_floats(ctx, status, e->name, "", e->data, n, e->rule));
        if (!ck || !e->opt_m) continue;
        BIE_TRY(check_floats(ctx, status, e->name, ".opt_m", e->opt_m, n, ANY));
        BIE_TRY(check_floats(ctx, status, e->name, ".opt_v", e->opt_v, n, e->diode ? ANY : NONNEG));
    }
    return BIE_STATUS_OK;
}

static enum bie_status save_entries(bie_context_t * ctx, bie_model_t * m, const char * path, enum bie_model_file kind,
                                    const char * const * meta, size_t n_meta) {
    struct entries es = {0};
    list_entries(m, kind, &es);
    // What the loader would refuse is not written (a huge moment was saved, then refused on load).
    const enum bie_status vs =
        es.oom ? BIE_STATUS_OK : check_values(ctx, &es, kind == BIE_MODEL_FILE_CHECKPOINT, BIE_STATUS_INVALID_ARGUMENT);
    if (vs != BIE_STATUS_OK) {
        char msg[BIE_ERROR_CAP];
        snprintf(msg, sizeof msg, "%s", bie_context_last_error(ctx));
        free(es.e);
        return bie_set_error(ctx, vs, "model: %s; the model was not saved", msg);
    }
    const bool ck = kind == BIE_MODEL_FILE_CHECKPOINT;
    size_t n_t = 0, n_logical = 0;
    for (size_t i = 0; i < es.n; i++) {
        n_t += 1 + (ck && es.e[i].opt_m ? 2 : 0);
        n_logical += es.e[i].logical[0] != 0;
    }
    struct bie_st_tensor * t = calloc(n_t + 1, sizeof *t);
    char(*names)[112] = calloc(n_t + 1, sizeof *names);
    const size_t total_meta = 7 + n_logical + n_meta;
    const char ** mv = calloc(2 * total_meta + 1, sizeof *mv);
    char step[32], seed[32], fversion[16];
    if (es.oom || !t || !names || !mv) {
        free(es.e);
        free(t);
        free(names);
        free(mv);
        return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    size_t k = 0;
    for (size_t i = 0; i < es.n; i++) {
        const struct entry * e = &es.e[i];
        const char * suffix[3] = {"", ".opt_m", ".opt_v"};
        void * data[3] = {e->data, e->opt_m, e->opt_v};
        for (int j = 0; j < (ck && e->opt_m ? 3 : 1); j++) {
            snprintf(names[k], sizeof names[k], "%s%s", e->name, suffix[j]);
            t[k].name = names[k];
            t[k].dtype = j ? BIE_DTYPE_F32 : e->dtype;
            t[k].ndim = e->ndim;
            memcpy(t[k].shape, e->shape, sizeof e->shape);
            t[k].data = data[j];
            t[k].nbytes = j ? e->nbytes * (e->dtype == BIE_DTYPE_F32 ? 1 : 4) : e->nbytes; // state is f32
            k++;
        }
    }
    snprintf(fversion, sizeof fversion, "%d", (int)m->format_version);
    snprintf(step, sizeof step, "%" PRId64, m->step);
    snprintf(seed, sizeof seed, "%" PRIu64, m->seed);
    size_t q = 0;
    mv[q++] = "bie.format";
    mv[q++] = ck ? "checkpoint" : "packed";
    mv[q++] = "bie.version";
    mv[q++] = bie_version_string();
    mv[q++] = "bie.format_version";
    mv[q++] = fversion;
    mv[q++] = "bie.arch";
    mv[q++] = m->arch;
    mv[q++] = "bie.latent";
    mv[q++] = m->latent == BIE_LATENT_INT8 ? "int8" : "f32";
    mv[q++] = "bie.step";
    mv[q++] = step;
    mv[q++] = "bie.seed";
    mv[q++] = seed;
    for (size_t i = 0; i < es.n; i++)
        if (es.e[i].logical[0]) {
            mv[q++] = es.e[i].name; // the key "<name>" ... its value the logical shape
            mv[q++] = es.e[i].logical;
        }
    for (size_t i = 0; i < 2 * n_meta; i++) mv[q++] = meta[i];
    enum bie_status s = bie_safetensors_write(ctx, path, t, k, mv, q / 2);
    free(es.e);
    free(t);
    free(names);
    free(mv);
    return s;
}

enum bie_status bie_model_save(bie_context_t * ctx, const bie_model_t * m, const char * path, enum bie_model_file kind,
                               const char * const * meta, size_t n_meta) {
    BIE_ENTER(ctx);
    if (!m || !path) BIE_FAIL("model, path: must not be NULL");
    if (n_meta && !meta) BIE_FAIL("meta: is NULL");
    if (kind != BIE_MODEL_FILE_PACKED && kind != BIE_MODEL_FILE_CHECKPOINT)
        BIE_FAIL("kind: unknown value %d", (int)kind);
    for (size_t i = 0; i < n_meta; i++)
        if (meta[2 * i] && strncmp(meta[2 * i], "bie.", 4) == 0) BIE_FAIL("meta: key \"%s\" is reserved", meta[2 * i]);
    if (m->packed && kind == BIE_MODEL_FILE_CHECKPOINT) BIE_FAIL("model: a packed model has no checkpoint");
    if (m->packed || kind == BIE_MODEL_FILE_CHECKPOINT)
        return save_entries(ctx, (bie_model_t *)m, path, kind, meta, n_meta);
    // Export: build the packed twin, then save it.
    bie_model_t * p = NULL;
    BIE_TRY(bie_model_create_empty(ctx, m->arch, m->latent, true, &p));
    p->step = m->step;
    p->seed = m->seed;
    copy_floats(m, p);
    enum bie_status s = pack_into(ctx, m, p);
    if (s == BIE_STATUS_OK) s = save_entries(ctx, p, path, kind, meta, n_meta);
    bie_model_destroy(p);
    return s;
}

static bool parse_u64(const char * s, uint64_t * out) {
    if (!s || !*s) return false;
    uint64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (UINT64_MAX - 9) / 10) return false;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *out = v;
    return true;
}

enum bie_status bie_model_from_safetensors(bie_context_t * ctx, const bie_safetensors_t * st, bie_model_t ** out) {
    BIE_ENTER(ctx);
    if (!st || !out) BIE_FAIL("st, out: must not be NULL");
    *out = NULL;
    const char * format = bie_safetensors_metadata(st, "bie.format");
    const char * arch = bie_safetensors_metadata(st, "bie.arch");
    const char * latent = bie_safetensors_metadata(st, "bie.latent");
    if (!format || !arch || !latent)
        return BIE_FORMAT_ERROR("not a bie model: __metadata__ lacks bie.format, bie.arch or bie.latent");
    const bool packed = !strcmp(format, "packed");
    if (!packed && strcmp(format, "checkpoint") != 0)
        return BIE_FORMAT_ERROR("bie.format \"%.40s\" is neither packed nor checkpoint", format);
    enum bie_latent lat;
    if (!strcmp(latent, "f32")) lat = BIE_LATENT_F32;
    else if (!strcmp(latent, "int8")) lat = BIE_LATENT_INT8;
    else return BIE_FORMAT_ERROR("bie.latent \"%.40s\" is neither f32 nor int8", latent);
    uint64_t step = 0, seed = 0;
    if (!parse_u64(bie_safetensors_metadata(st, "bie.step"), &step) ||
        !parse_u64(bie_safetensors_metadata(st, "bie.seed"), &seed))
        return BIE_FORMAT_ERROR("bie.step or bie.seed is missing or not an unsigned integer");
    if (step > (uint64_t)BIE_MODEL_MAX_STEP) return BIE_FORMAT_ERROR("bie.step = %" PRIu64 " exceeds 2^62", step);
    // The format version: files without one are version 1 (a chain of layers).
    const char * fv = bie_safetensors_metadata(st, "bie.format_version");
    uint64_t version = 1;
    if (fv && (!parse_u64(fv, &version) || version < 1))
        return BIE_FORMAT_ERROR("bie.format_version \"%.20s\" is not a version number", fv);
    if (version > BIE_MODEL_FORMAT_VERSION)
        return BIE_FORMAT_ERROR("the model format version is %" PRIu64 "; this library reads versions up to %d",
                                version, BIE_MODEL_FORMAT_VERSION);
    struct arch a;
    if (bie_model_parse_arch(ctx, arch, &a) != BIE_STATUS_OK) {
        char msg[BIE_ERROR_CAP];
        snprintf(msg, sizeof msg, "%s", bie_context_last_error(ctx));
        return BIE_FORMAT_ERROR("bad bie.arch: %s", msg);
    }
    // Before allocating anything: the file must hold the tensors the architecture declares, so a
    // tiny hostile file cannot make us allocate gigabytes.
    uint64_t need = 0, have = 0;
    const bool sized = file_bytes(&a, lat, packed ? BIE_MODEL_FILE_PACKED : BIE_MODEL_FILE_CHECKPOINT, &need);
    const int32_t arch_version = a.version;
    free(a.L);
    if (!sized) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
    if ((uint64_t)arch_version > version)
        return BIE_FORMAT_ERROR("bie.arch needs model format version %d, the file says %" PRIu64, (int)arch_version,
                                version);
    for (size_t i = 0; i < bie_safetensors_count(st); i++) have += bie_safetensors_at(st, i)->nbytes;
    if (need > have)
        return BIE_FORMAT_ERROR("the architecture needs at least %" PRIu64 " bytes of tensors, the file holds %" PRIu64,
                                need, have);
    bie_model_t * m = NULL;
    enum bie_status s = bie_model_create_empty(ctx, arch, lat, packed, &m);
    if (s != BIE_STATUS_OK) {
        if (s == BIE_STATUS_INVALID_ARGUMENT) {
            char msg[BIE_ERROR_CAP];
            snprintf(msg, sizeof msg, "%s", bie_context_last_error(ctx));
            s = BIE_FORMAT_ERROR("bad bie.arch: %s", msg);
        }
        return s;
    }
    m->step = (int64_t)step;
    m->seed = seed;
    s = bie_model_check_memory(ctx, m, 1, false, BIE_STATUS_FORMAT_ERROR);
    if (s != BIE_STATUS_OK) {
        bie_model_destroy(m);
        return s;
    }
    struct entries es = {0};
    list_entries(m, packed ? BIE_MODEL_FILE_PACKED : BIE_MODEL_FILE_CHECKPOINT, &es);
    if (es.oom) s = bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
    size_t expected = 0;
    for (size_t i = 0; s == BIE_STATUS_OK && i < es.n; i++) {
        const struct entry * e = &es.e[i];
        for (int j = 0; s == BIE_STATUS_OK && j < (!packed && e->opt_m ? 3 : 1); j++) {
            char name[112];
            snprintf(name, sizeof name, "%s%s", e->name, j == 0 ? "" : j == 1 ? ".opt_m" : ".opt_v");
            const struct bie_st_tensor * t = bie_safetensors_find(st, name);
            expected++;
            if (!t) {
                s = BIE_FORMAT_ERROR("tensor \"%s\" is missing", name);
                break;
            }
            const enum bie_dtype want = j ? BIE_DTYPE_F32 : e->dtype;
            const size_t want_bytes = j ? e->nbytes * (e->dtype == BIE_DTYPE_F32 ? 1 : 4) : e->nbytes;
            bool ok = t->dtype == want && t->ndim == e->ndim && t->nbytes == want_bytes;
            for (int32_t d = 0; ok && d < e->ndim; d++) ok = t->shape[d] == e->shape[d];
            if (!ok) {
                s = BIE_FORMAT_ERROR(
                    "tensor \"%s\": dtype %s or shape does not match the architecture (want %s, %zu bytes)", name,
                    bie_dtype_name(t->dtype), bie_dtype_name(want), want_bytes);
                break;
            }
            memcpy(j == 0 ? e->data : j == 1 ? (void *)e->opt_m : (void *)e->opt_v, t->data, t->nbytes);
        }
    }
    if (s == BIE_STATUS_OK && bie_safetensors_count(st) != expected)
        s = BIE_FORMAT_ERROR("the file holds %zu tensors, the architecture expects %zu", bie_safetensors_count(st),
                             expected);
    // Values the layers or the optimizer would turn into NaN, and values the layers would reject
    // later, are rejected here, with the tensor's name.
    if (s == BIE_STATUS_OK) s = check_values(ctx, &es, !packed, BIE_STATUS_FORMAT_ERROR);
    free(es.e);
    if (s != BIE_STATUS_OK) {
        bie_model_destroy(m);
        return s;
    }
    *out = m;
    return BIE_STATUS_OK;
}

enum bie_status bie_model_load(bie_context_t * ctx, const char * path, bie_model_t ** out,
                               bie_safetensors_t ** out_st) {
    BIE_ENTER(ctx);
    if (!path || !out) BIE_FAIL("path, out: must not be NULL");
    *out = NULL;
    if (out_st) *out_st = NULL;
    bie_safetensors_t * st = NULL;
    BIE_TRY(bie_safetensors_read(ctx, path, &st));
    enum bie_status s = bie_model_from_safetensors(ctx, st, out);
    if (s != BIE_STATUS_OK) {
        char msg[BIE_ERROR_CAP];
        snprintf(msg, sizeof msg, "%s", bie_context_last_error(ctx));
        bie_set_error(ctx, s, "%s: %s", path, msg);
        bie_safetensors_free(st);
        return s;
    }
    if (out_st) *out_st = st;
    else bie_safetensors_free(st);
    return BIE_STATUS_OK;
}

enum bie_status bie_model_layer_info(const bie_model_t * m, int64_t i, struct bie_model_layer_info * out) {
    if (!m || !out || i < 0 || i >= m->n_layers) return BIE_STATUS_INVALID_ARGUMENT;
    const struct layer * L = &m->L[i];
    memset(out, 0, sizeof *out);
    out->kind = bie_model_kind_name(L);
    out->quant = "";
    memcpy(out->in_shape, L->in, sizeof L->in);
    memcpy(out->out_shape, L->out, sizeof L->out);
    if (L->kind == L_BN) {
        out->params = 4 * L->in[0];
        out->bytes = out->float_bytes = 4 * out->params;
    } else if (L->kind == L_ACT && L->prelu_n) {
        out->params = L->prelu_n;
        out->bytes = out->float_bytes = 4 * out->params;
    } else if (L->kind == L_CONV || L->kind == L_LINEAR) {
        const int64_t nw = L->O * L->K;
        out->quant = L->q == Q_F32 ? "f32" : L->q == Q_B1 ? "b1" : L->q == Q_Q4 ? "q4" : "q8";
        if (L->q == Q_F32) {
            out->params = nw + L->O;
            out->bytes = 4 * out->params;
        } else {
            const int64_t floats = L->C + 2 + (L->has_bias ? L->O : 0);
            out->params = nw + floats;
            const int64_t wbytes = L->packed ? (int64_t)L->packed_bytes : L->w8 ? nw : 4 * nw;
            out->bytes = wbytes + 4 * floats;
        }
        out->float_bytes = 4 * out->params;
    }
    return BIE_STATUS_OK;
}
