// SPDX-License-Identifier: Apache-2.0
// safetensors.c: a hostile-file-safe reader and an atomic writer of the safetensors format:
//   [u64 little-endian N][N bytes of JSON header][data section]
// The header is an object whose members are tensors {"dtype", "shape", "data_offsets": [b, e]}
// (offsets relative to the data section) plus an optional "__metadata__" object of strings.
#include "io-util.h"
#include "io/strmap.h"
#include "json.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct bie_safetensors {
    uint8_t * bytes; // the whole file (only its length and header while the header is checked)
    size_t size;
    struct bie_st_tensor * tensors; // sorted by data offset
    size_t count;
    char ** meta; // key, value, key, value...
    size_t n_meta;
    struct bie_strmap by_name, by_key; // tensor names -> index, metadata keys -> index
};

static const struct {
    const char * name;
    enum bie_dtype dtype;
    size_t size;
} k_dtypes[] = {
    {"F32", BIE_DTYPE_F32, 4}, {"F16", BIE_DTYPE_F16, 2}, {"BF16", BIE_DTYPE_BF16, 2}, {"F64", BIE_DTYPE_F64, 8},
    {"I32", BIE_DTYPE_I32, 4}, {"I8", BIE_DTYPE_I8, 1},   {"U8", BIE_DTYPE_U8, 1},
};

static int dtype_index(enum bie_dtype d) {
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (k_dtypes[i].dtype == d) return (int)i;
    return -1;
}

void bie_safetensors_free(bie_safetensors_t * st) {
    if (!st) return;
    for (size_t i = 0; i < st->count; i++) free((char *)st->tensors[i].name);
    for (size_t i = 0; i < 2 * st->n_meta; i++) free(st->meta[i]);
    free(st->tensors);
    free(st->meta);
    free(st->bytes);
    bie_strmap_free(&st->by_name);
    bie_strmap_free(&st->by_key);
    free(st);
}

// A tensor of the header and where its data begins in the data section.
struct placed {
    struct bie_st_tensor t;
    uint64_t begin;
};

static int cmp_begin(const void * a, const void * b) {
    const struct placed *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->t.nbytes < y->t.nbytes ? -1 : x->t.nbytes > y->t.nbytes;
}

static enum bie_status parse_tensor(bie_context_t * ctx, const struct bie_json * j, uint64_t data_size,
                                    struct placed * pl) {
    struct bie_st_tensor * t = &pl->t;
    const char * name = j->key;
    if (j->type != BIE_JSON_OBJECT) return BIE_FORMAT_ERROR("tensor \"%.80s\": not an object", name);
    if (j->count != 3)
        return BIE_FORMAT_ERROR("tensor \"%.80s\": must have exactly dtype, shape and data_offsets", name);
    const struct bie_json *jd = bie_json_get(j, "dtype"), *js = bie_json_get(j, "shape"),
                          *jo = bie_json_get(j, "data_offsets");
    if (!jd || !js || !jo)
        return BIE_FORMAT_ERROR("tensor \"%.80s\": must have exactly dtype, shape and data_offsets", name);
    if (jd->type != BIE_JSON_STRING) return BIE_FORMAT_ERROR("tensor \"%.80s\": dtype is not a string", name);
    int di = -1;
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (strcmp(jd->str, k_dtypes[i].name) == 0) di = (int)i;
    if (di < 0) return BIE_FORMAT_ERROR("tensor \"%.80s\": unsupported dtype \"%.20s\"", name, jd->str);
    if (js->type != BIE_JSON_ARRAY) return BIE_FORMAT_ERROR("tensor \"%.80s\": shape is not an array", name);
    if (js->count > BIE_MAX_DIMS)
        return BIE_FORMAT_ERROR("tensor \"%.80s\": more than %d dimensions", name, BIE_MAX_DIMS);
    uint64_t numel = 1;
    t->ndim = (int32_t)js->count;
    for (size_t i = 0; i < js->count; i++) {
        const struct bie_json * e = &js->items[i];
        if (e->type != BIE_JSON_NUMBER || !e->is_int || e->integer < 0 || e->integer > (INT64_C(1) << 40))
            return BIE_FORMAT_ERROR("tensor \"%.80s\": shape[%zu] is not an integer in [0, 2^40]", name, i);
        t->shape[i] = e->integer;
        if (e->integer != 0 && numel > UINT64_MAX / (uint64_t)e->integer)
            return BIE_FORMAT_ERROR("tensor \"%.80s\": shape overflows", name);
        numel *= (uint64_t)e->integer;
    }
    if (numel > UINT64_MAX / k_dtypes[di].size) return BIE_FORMAT_ERROR("tensor \"%.80s\": shape overflows", name);
    const uint64_t nbytes = numel * k_dtypes[di].size;
    if (jo->type != BIE_JSON_ARRAY || jo->count != 2)
        return BIE_FORMAT_ERROR("tensor \"%.80s\": data_offsets is not [begin, end]", name);
    for (int i = 0; i < 2; i++)
        if (jo->items[i].type != BIE_JSON_NUMBER || !jo->items[i].is_int || jo->items[i].integer < 0)
            return BIE_FORMAT_ERROR("tensor \"%.80s\": data_offsets[%d] is not a non-negative integer", name, i);
    const uint64_t b = (uint64_t)jo->items[0].integer, e = (uint64_t)jo->items[1].integer;
    if (b > e || e > data_size)
        return BIE_FORMAT_ERROR("tensor \"%.80s\": data_offsets [%" PRIu64 ", %" PRIu64
                                "] outside the data section of %" PRIu64 " bytes",
                                name, b, e, data_size);
    if (e - b != nbytes)
        return BIE_FORMAT_ERROR("tensor \"%.80s\": data_offsets span %" PRIu64
                                " bytes but dtype %s and shape need %" PRIu64,
                                name, e - b, k_dtypes[di].name, nbytes);
    t->dtype = k_dtypes[di].dtype;
    pl->begin = b;
    t->nbytes = (size_t)nbytes;
    t->name = strdup(name);
    if (!t->name) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
    return BIE_STATUS_OK;
}

// Checks the header in st->bytes (the length and header; st->size is the whole file's size)
// against the file and fills st's tensors and metadata; the tensors' data pointers are set by
// bind_data once the data section is in st->bytes too.
static enum bie_status parse_owned(bie_context_t * ctx, bie_safetensors_t * st) {
    if (st->size < 8) return BIE_FORMAT_ERROR("file of %zu bytes is too short for a safetensors header", st->size);
    const uint64_t hlen = bie_load_le64(st->bytes);
    if (hlen > BIE_SAFETENSORS_MAX_HEADER)
        return BIE_FORMAT_ERROR("header length %" PRIu64 " exceeds the limit of %u bytes", hlen,
                                BIE_SAFETENSORS_MAX_HEADER);
    if (hlen > st->size - 8)
        return BIE_FORMAT_ERROR("header length %" PRIu64 " exceeds the file (%zu bytes after the length)", hlen,
                                st->size - 8);
    if (hlen < 2) return BIE_FORMAT_ERROR("header of %" PRIu64 " bytes cannot hold a JSON object", hlen);
    char err[256];
    struct bie_json root;
    if (!bie_json_parse((const char *)st->bytes + 8, (size_t)hlen, &root, err, sizeof err))
        return BIE_FORMAT_ERROR("header: %s", err);
    enum bie_status s = BIE_STATUS_OK;
    const uint64_t data_size = st->size - 8 - hlen;
    struct placed * pl = NULL;
    if (root.type != BIE_JSON_OBJECT) {
        s = BIE_FORMAT_ERROR("header is not a JSON object");
        goto done;
    }
    st->tensors = calloc(root.count ? root.count : 1, sizeof *st->tensors);
    pl = calloc(root.count ? root.count : 1, sizeof *pl);
    if (!st->tensors || !pl) {
        s = bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < root.count; i++) {
        const struct bie_json * m = &root.items[i];
        if (strcmp(m->key, "__metadata__") == 0) {
            if (m->type != BIE_JSON_OBJECT) {
                s = BIE_FORMAT_ERROR("__metadata__ is not an object");
                goto done;
            }
            st->meta = calloc(2 * m->count + 1, sizeof(char *));
            if (!st->meta) {
                s = bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
                goto done;
            }
            for (size_t k = 0; k < m->count; k++) {
                if (m->items[k].type != BIE_JSON_STRING) {
                    s = BIE_FORMAT_ERROR("__metadata__ value of \"%.80s\" is not a string", m->items[k].key);
                    goto done;
                }
                st->meta[2 * k] = strdup(m->items[k].key);
                st->meta[2 * k + 1] = strdup(m->items[k].str);
                st->n_meta = k + 1;
                if (!st->meta[2 * k] || !st->meta[2 * k + 1]) {
                    s = bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
                    goto done;
                }
            }
            continue;
        }
        s = parse_tensor(ctx, m, data_size, &pl[st->count]);
        st->tensors[st->count] = pl[st->count].t; // (its name is freed with st from here on)
        if (s != BIE_STATUS_OK) goto done;
        st->count++;
    }
    // The tensors must tile the data section: sorted by offset, each begins where the last ended.
    qsort(pl, st->count, sizeof *pl, cmp_begin);
    for (size_t i = 0; i < st->count; i++) st->tensors[i] = pl[i].t;
    uint64_t at = 0;
    for (size_t i = 0; i < st->count; i++) {
        const uint64_t b = pl[i].begin;
        if (b != at) {
            s = BIE_FORMAT_ERROR("tensor \"%.80s\" %s (data_offsets begin at %" PRIu64 ", expected %" PRIu64 ")",
                                 st->tensors[i].name, b < at ? "overlaps another tensor" : "leaves a hole before it", b,
                                 at);
            goto done;
        }
        at = b + st->tensors[i].nbytes;
    }
    if (at != data_size)
        s = BIE_FORMAT_ERROR("the data section has %" PRIu64 " bytes but the tensors cover %" PRIu64, data_size, at);
    // Lookups by name in constant time (the JSON parser already refused duplicate keys).
    for (size_t i = 0; s == BIE_STATUS_OK && i < st->count; i++)
        if (!bie_strmap_put(&st->by_name, st->tensors[i].name, i, NULL))
            s = bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; s == BIE_STATUS_OK && i < st->n_meta; i++)
        if (!bie_strmap_put(&st->by_key, st->meta[2 * i], i, NULL))
            s = bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
done:
    free(pl);
    bie_json_free(&root);
    return s;
}

// Points each tensor at its bytes: the tensors tile the data section in order (parse_owned checked).
static void bind_data(bie_safetensors_t * st) {
    uint8_t * at = st->bytes + 8 + bie_load_le64(st->bytes);
    for (size_t i = 0; i < st->count; i++) {
        st->tensors[i].data = at;
        at += st->tensors[i].nbytes;
    }
}

enum bie_status bie_safetensors_parse(bie_context_t * ctx, const void * bytes, size_t size, bie_safetensors_t ** out) {
    BIE_ENTER(ctx);
    if (!out) return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "out: is NULL");
    *out = NULL;
    if (!bytes && size) return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "bytes: is NULL");
    bie_safetensors_t * st = calloc(1, sizeof *st);
    if (!st) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
    st->bytes = malloc(size ? size : 1);
    if (!st->bytes) {
        free(st);
        return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    if (size) memcpy(st->bytes, bytes, size);
    st->size = size;
    enum bie_status s = parse_owned(ctx, st);
    if (s == BIE_STATUS_OK) bind_data(st);
    if (s != BIE_STATUS_OK) {
        bie_safetensors_free(st);
        return s;
    }
    *out = st;
    return BIE_STATUS_OK;
}

enum bie_status bie_safetensors_read(bie_context_t * ctx, const char * path, bie_safetensors_t ** out) {
    BIE_ENTER(ctx);
    if (!out || !path) return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "path/out: is NULL");
    *out = NULL;
    bie_safetensors_t * st = calloc(1, sizeof *st);
    if (!st) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
    // The size is checked first; then only the length and the header are read, and the data section
    // once the header has been checked against the file: a bad file costs no more than its header.
    int fd = -1;
    enum bie_status s = bie_file_open_read(ctx, path, BIE_SAFETENSORS_MAX_FILE, &fd, &st->size);
    uint8_t len[8] = {0};
    uint64_t hlen = 0;
    if (s == BIE_STATUS_OK && st->size >= 8) {
        s = bie_file_read_at(ctx, path, fd, len, 8, 0);
        hlen = bie_load_le64(len);
    }
    // The length and header only, in a buffer of their size (a bad length is parse_owned's to report).
    const size_t head = 8 + (hlen <= BIE_SAFETENSORS_MAX_HEADER && hlen <= st->size - 8 ? (size_t)hlen : 0);
    if (s == BIE_STATUS_OK) {
        st->bytes = malloc(head);
        if (!st->bytes) s = bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
        else memcpy(st->bytes, len, 8);
    }
    if (s == BIE_STATUS_OK && head > 8) s = bie_file_read_at(ctx, path, fd, st->bytes + 8, head - 8, 8);
    if (s == BIE_STATUS_OK) s = parse_owned(ctx, st);
    if (s == BIE_STATUS_OK) { // a valid header: now the data section
        uint8_t * all = realloc(st->bytes, st->size);
        if (!all) s = bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "%s: out of memory for %zu bytes", path, st->size);
        else st->bytes = all;
    }
    if (s == BIE_STATUS_OK) s = bie_file_read_at(ctx, path, fd, st->bytes + head, st->size - head, head);
    if (s == BIE_STATUS_OK) bind_data(st);
    if (fd >= 0) close(fd);
    if (s != BIE_STATUS_OK) {
        if (s == BIE_STATUS_FORMAT_ERROR && ctx && strncmp(ctx->error, path, strlen(path)) != 0) {
            char msg[BIE_ERROR_CAP];
            snprintf(msg, sizeof msg, "%s", ctx->error);
            bie_set_error(ctx, s, "%s: not a valid safetensors file: %s", path, msg);
        }
        bie_safetensors_free(st);
        return s;
    }
    *out = st;
    return BIE_STATUS_OK;
}

size_t bie_safetensors_count(const bie_safetensors_t * st) { return st ? st->count : 0; }

const struct bie_st_tensor * bie_safetensors_at(const bie_safetensors_t * st, size_t i) {
    return st && i < st->count ? &st->tensors[i] : NULL;
}

const struct bie_st_tensor * bie_safetensors_find(const bie_safetensors_t * st, const char * name) {
    size_t i;
    return st && name && bie_strmap_get(&st->by_name, name, &i) ? &st->tensors[i] : NULL;
}

const char * bie_safetensors_metadata(const bie_safetensors_t * st, const char * key) {
    size_t i;
    return st && key && bie_strmap_get(&st->by_key, key, &i) ? st->meta[2 * i + 1] : NULL;
}

size_t bie_safetensors_metadata_count(const bie_safetensors_t * st) { return st ? st->n_meta : 0; }

const char * bie_safetensors_metadata_at(const bie_safetensors_t * st, size_t i, const char ** value) {
    if (!st || i >= st->n_meta) {
        if (value) *value = NULL;
        return NULL;
    }
    if (value) *value = st->meta[2 * i + 1];
    return st->meta[2 * i];
}

// --- writer ---------------------------------------------------------------------------------------

struct sbuf {
    char * p;
    size_t len, cap;
    bool oom;
};

static void sb_put(struct sbuf * b, const char * s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t nc = (b->len + n + 1) * 2;
        char * np = realloc(b->p, nc);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}
static void sb_str(struct sbuf * b, const char * s) { sb_put(b, s, strlen(s)); }

// A JSON string literal: quotes, backslashes and control characters escaped.
static void sb_json_string(struct sbuf * b, const char * s) {
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            sb_put(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_put(b, esc, 6);
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static bool utf8(const char * s) { return bie_json_utf8_valid(s, strlen(s)); }

// Metadata entries and tensor names: not NULL, valid UTF-8, unique (each kind on its own).
static enum bie_status check_names(bie_context_t * ctx, const struct bie_st_tensor * tensors, size_t n,
                                   const char * const * meta, size_t n_meta) {
    struct bie_strmap seen = {0};
    enum bie_status s = BIE_STATUS_OK;
    bool dup = false;
    for (size_t i = 0; s == BIE_STATUS_OK && i < n_meta; i++) {
        if (!meta[2 * i] || !meta[2 * i + 1])
            s = bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "meta: entry %zu is NULL", i);
        else if (!utf8(meta[2 * i]) || !utf8(meta[2 * i + 1]))
            s = bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "meta: entry %zu (\"%.40s\") is not valid UTF-8", i,
                              meta[2 * i]);
        else if (!bie_strmap_put(&seen, meta[2 * i], i, &dup))
            s = bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
        else if (dup)
            s = bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "meta: key \"%.80s\" appears twice", meta[2 * i]);
    }
    bie_strmap_free(&seen);
    for (size_t i = 0; s == BIE_STATUS_OK && i < n; i++) {
        const char * name = tensors[i].name;
        if (!name) s = bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "tensors[%zu]: name is NULL", i);
        else if (!utf8(name))
            s = bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "tensors[%zu]: name is not valid UTF-8", i);
        else if (!bie_strmap_put(&seen, name, i, &dup))
            s = bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
        else if (dup)
            s = bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "tensors[%zu]: name \"%.80s\" appears twice", i, name);
    }
    bie_strmap_free(&seen);
    return s;
}

enum bie_status bie_safetensors_write(bie_context_t * ctx, const char * path, const struct bie_st_tensor * tensors,
                                      size_t n, const char * const * meta, size_t n_meta) {
    BIE_ENTER(ctx);
    if (!path || (n && !tensors) || (n_meta && !meta))
        return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "path/tensors/meta: is NULL");
    // What the reader would refuse is refused here: keys and names are unique, valid UTF-8 strings.
    BIE_TRY(check_names(ctx, tensors, n, meta, n_meta));
    struct sbuf b = {0};
    sb_str(&b, "{");
    if (n_meta) {
        sb_str(&b, "\"__metadata__\":{");
        for (size_t i = 0; i < n_meta; i++) {
            if (i) sb_str(&b, ",");
            sb_json_string(&b, meta[2 * i]);
            sb_str(&b, ":");
            sb_json_string(&b, meta[2 * i + 1]);
        }
        sb_str(&b, "}");
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const struct bie_st_tensor * t = &tensors[i];
        int di = dtype_index(t->dtype);
        uint64_t numel = 1;
        bool bad = di < 0 || !t->name || strcmp(t->name, "__metadata__") == 0 || t->ndim < 0 ||
                   t->ndim > BIE_MAX_DIMS || (t->nbytes && !t->data);
        for (int32_t d = 0; !bad && d < t->ndim; d++) // the reader's bounds: each in [0, 2^40], no overflow
            bad = t->shape[d] < 0 || t->shape[d] > (INT64_C(1) << 40) ||
                  __builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel);
        uint64_t bytes = 0;
        if (!bad) bad = __builtin_mul_overflow(numel, (uint64_t)k_dtypes[di].size, &bytes) || bytes != t->nbytes;
        if (bad) {
            free(b.p);
            return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT,
                                 "tensors[%zu] (\"%.80s\"): bad name, dtype, shape or size", i,
                                 t->name ? t->name : "(null)");
        }
        char num[64];
        sb_str(&b, (n_meta || i) ? "," : "");
        sb_json_string(&b, t->name);
        sb_str(&b, ":{\"dtype\":\"");
        sb_str(&b, k_dtypes[di].name);
        sb_str(&b, "\",\"shape\":[");
        for (int32_t d = 0; d < t->ndim; d++) {
            snprintf(num, sizeof num, "%s%" PRId64, d ? "," : "", t->shape[d]);
            sb_str(&b, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, off + t->nbytes);
        sb_str(&b, num);
        off += t->nbytes;
    }
    sb_str(&b, "}");
    while (b.len % 8) sb_str(&b, " "); // the data section starts 8-byte aligned
    if (b.oom) {
        free(b.p);
        return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    uint8_t lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (uint8_t)((uint64_t)b.len >> (8 * i));
    const void ** parts = malloc((n + 2) * sizeof *parts);
    size_t * sizes = malloc((n + 2) * sizeof *sizes);
    if (!parts || !sizes) {
        free(parts);
        free(sizes);
        free(b.p);
        return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    parts[0] = lenbuf;
    sizes[0] = 8;
    parts[1] = b.p;
    sizes[1] = b.len;
    for (size_t i = 0; i < n; i++) {
        parts[2 + i] = tensors[i].data;
        sizes[2 + i] = tensors[i].nbytes;
    }
    enum bie_status s = bie_write_file_atomic(ctx, path, n + 2, parts, sizes);
    free(parts);
    free(sizes);
    free(b.p);
    return s;
}
