// SPDX-License-Identifier: Apache-2.0
// json.c: the strict JSON parser of json.h (recursive descent, depth-limited).
#include "json.h"
#include "io/strmap.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct parser {
    const char * s;
    size_t n, pos;
    char * err;
    size_t err_size;
    bool failed;
    size_t values; // parsed so far (at most BIE_JSON_MAX_VALUES)
};

static bool fail(struct parser * p, const char * fmt, ...) {
    if (!p->failed) {
        char msg[200];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        snprintf(p->err, p->err_size, "JSON error at byte %zu: %s", p->pos, msg);
        p->failed = true;
    }
    return false;
}

static void skip_ws(struct parser * p) {
    while (p->pos < p->n) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static bool literal(struct parser * p, const char * word) {
    size_t l = strlen(word);
    if (p->n - p->pos < l || memcmp(p->s + p->pos, word, l) != 0) return fail(p, "invalid literal");
    p->pos += l;
    return true;
}

static int hex4(struct parser * p, uint32_t * out) {
    if (p->n - p->pos < 4) return fail(p, "truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p->s[p->pos + (size_t)i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return fail(p, "bad hex digit in \\u escape");
    }
    p->pos += 4;
    *out = v;
    return true;
}

static size_t put_utf8(char * d, uint32_t cp) {
    if (cp < 0x80) {
        d[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        d[0] = (char)(0xC0 | (cp >> 6));
        d[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        d[0] = (char)(0xE0 | (cp >> 12));
        d[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        d[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    d[0] = (char)(0xF0 | (cp >> 18));
    d[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    d[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    d[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

// Length of the valid UTF-8 sequence at s[0..n) (RFC 3629: no overlongs, no surrogates, <= U+10FFFF),
// or 0 if invalid.
static size_t utf8_len(const unsigned char * s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t l;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0) {
        l = 2;
        cp = c & 0x1F;
        min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        l = 3;
        cp = c & 0x0F;
        min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        l = 4;
        cp = c & 0x07;
        min = 0x10000;
    } else return 0;
    if (n < l) return 0;
    for (size_t i = 1; i < l; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return l;
}

// Parses a string starting at the opening quote into a malloc'd NUL-terminated buffer.
static bool parse_string(struct parser * p, char ** out, size_t * out_len) {
    p->pos++; // opening quote
    // The decoded string is never longer than the encoded one.
    size_t start = p->pos, end = start;
    while (end < p->n && p->s[end] != '"') end += (p->s[end] == '\\' && end + 1 < p->n) ? 2 : 1;
    if (end >= p->n) return fail(p, "unterminated string");
    char * d = malloc(end - start + 1);
    if (!d) return fail(p, "out of memory");
    size_t k = 0;
    while (p->s[p->pos] != '"') {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c < 0x20) {
            free(d);
            return fail(p, "control character in string");
        }
        if (c == '\\') {
            p->pos++;
            char e = p->s[p->pos++];
            switch (e) {
            case '"': d[k++] = '"'; break;
            case '\\': d[k++] = '\\'; break;
            case '/': d[k++] = '/'; break;
            case 'b': d[k++] = '\b'; break;
            case 'f': d[k++] = '\f'; break;
            case 'n': d[k++] = '\n'; break;
            case 'r': d[k++] = '\r'; break;
            case 't': d[k++] = '\t'; break;
            case 'u': {
                uint32_t cp;
                if (!hex4(p, &cp)) {
                    free(d);
                    return false;
                }
                if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    free(d);
                    return fail(p, "lone low surrogate");
                }
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    uint32_t lo;
                    if (p->n - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
                        free(d);
                        return fail(p, "unpaired high surrogate");
                    }
                    p->pos += 2;
                    if (!hex4(p, &lo)) {
                        free(d);
                        return false;
                    }
                    if (lo < 0xDC00 || lo > 0xDFFF) {
                        free(d);
                        return fail(p, "bad low surrogate");
                    }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                if (cp == 0) {
                    free(d);
                    return fail(p, "\\u0000 is not allowed");
                }
                // An escape of <= 6 (or 12) bytes decodes to <= 3 (or 4) bytes: fits in place.
                k += put_utf8(d + k, cp);
                break;
            }
            default:
                free(d);
                p->pos--;
                return fail(p, "invalid escape");
            }
            continue;
        }
        size_t l = utf8_len((const unsigned char *)p->s + p->pos, p->n - p->pos);
        if (l == 0) {
            free(d);
            return fail(p, "invalid UTF-8 in string");
        }
        memcpy(d + k, p->s + p->pos, l);
        k += l;
        p->pos += l;
    }
    p->pos++; // closing quote
    d[k] = '\0';
    *out = d;
    *out_len = k;
    return true;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static bool parse_number(struct parser * p, struct bie_json * j) {
    size_t start = p->pos;
    bool integral = true;
    if (p->s[p->pos] == '-') p->pos++;
    if (p->pos >= p->n || !is_digit(p->s[p->pos])) return fail(p, "invalid number");
    if (p->s[p->pos] == '0') {
        p->pos++;
        if (p->pos < p->n && is_digit(p->s[p->pos])) return fail(p, "leading zero in number");
    } else {
        while (p->pos < p->n && is_digit(p->s[p->pos])) p->pos++;
    }
    if (p->pos < p->n && p->s[p->pos] == '.') {
        integral = false;
        p->pos++;
        if (p->pos >= p->n || !is_digit(p->s[p->pos])) return fail(p, "digit expected after '.'");
        while (p->pos < p->n && is_digit(p->s[p->pos])) p->pos++;
    }
    if (p->pos < p->n && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
        integral = false;
        p->pos++;
        if (p->pos < p->n && (p->s[p->pos] == '+' || p->s[p->pos] == '-')) p->pos++;
        if (p->pos >= p->n || !is_digit(p->s[p->pos])) return fail(p, "digit expected in exponent");
        while (p->pos < p->n && is_digit(p->s[p->pos])) p->pos++;
    }
    size_t len = p->pos - start;
    char buf[64];
    if (len >= sizeof buf) { // too long to be an int64: keep only the (approximate) double
        j->type = BIE_JSON_NUMBER;
        j->number = integral ? (p->s[start] == '-' ? -1e300 : 1e300) : 0.0;
        j->is_int = false;
        if (!integral) {
            char * tmp = malloc(len + 1);
            if (!tmp) return fail(p, "out of memory");
            memcpy(tmp, p->s + start, len);
            tmp[len] = '\0';
            j->number = strtod(tmp, NULL);
            free(tmp);
        }
        return true;
    }
    memcpy(buf, p->s + start, len);
    buf[len] = '\0';
    j->type = BIE_JSON_NUMBER;
    j->number = strtod(buf, NULL);
    j->is_int = false;
    if (integral) {
        // Exact int64 parse with overflow detection.
        const char * q = buf;
        bool neg = *q == '-';
        if (neg) q++;
        uint64_t v = 0;
        bool ok = true;
        for (; *q; q++) {
            uint64_t d = (uint64_t)(*q - '0');
            if (v > (UINT64_MAX - d) / 10) {
                ok = false;
                break;
            }
            v = v * 10 + d;
        }
        if (ok && (neg ? v <= (uint64_t)INT64_MAX + 1 : v <= (uint64_t)INT64_MAX)) {
            j->is_int = true;
            j->integer = neg ? (int64_t)(0 - v) : (int64_t)v;
        }
    }
    return true;
}

static bool parse_value(struct parser * p, struct bie_json * j, int depth);

static bool push_item(struct parser * p, struct bie_json * j, size_t * cap) {
    if (j->count == *cap) {
        size_t nc = *cap ? *cap * 2 : 4;
        struct bie_json * ni = realloc(j->items, nc * sizeof *ni);
        if (!ni) return fail(p, "out of memory");
        j->items = ni;
        *cap = nc;
    }
    memset(&j->items[j->count], 0, sizeof j->items[0]);
    j->count++;
    return true;
}

// The key of the last member of object j against the earlier ones: compared one by one in small
// objects, through a hash map (filled on the ninth member) in larger ones.
static bool unique_key(struct parser * p, const struct bie_json * j, struct bie_strmap * map) {
    const char * key = j->items[j->count - 1].key;
    if (j->count <= 8) {
        for (size_t i = 0; i + 1 < j->count; i++)
            if (strcmp(j->items[i].key, key) == 0) return fail(p, "duplicate key \"%.60s\"", key);
        return true;
    }
    if (map->count == 0)
        for (size_t i = 0; i + 1 < j->count; i++)
            if (!bie_strmap_put(map, j->items[i].key, i, NULL)) return fail(p, "out of memory");
    bool found;
    if (!bie_strmap_put(map, key, j->count - 1, &found)) return fail(p, "out of memory");
    return found ? fail(p, "duplicate key \"%.60s\"", key) : true;
}

static bool parse_members(struct parser * p, struct bie_json * j, int depth, bool object, struct bie_strmap * map);

static bool parse_container(struct parser * p, struct bie_json * j, int depth, bool object) {
    struct bie_strmap map = {0};
    const bool ok = parse_members(p, j, depth, object, &map);
    bie_strmap_free(&map);
    return ok;
}

static bool parse_members(struct parser * p, struct bie_json * j, int depth, bool object, struct bie_strmap * map) {
    j->type = object ? BIE_JSON_OBJECT : BIE_JSON_ARRAY;
    if (depth >= BIE_JSON_MAX_DEPTH) return fail(p, "nesting deeper than %d", BIE_JSON_MAX_DEPTH);
    p->pos++;
    skip_ws(p);
    char close = object ? '}' : ']';
    if (p->pos < p->n && p->s[p->pos] == close) {
        p->pos++;
        return true;
    }
    size_t cap = 0;
    for (;;) {
        skip_ws(p);
        if (!push_item(p, j, &cap)) return false;
        struct bie_json * it = &j->items[j->count - 1];
        if (object) {
            if (p->pos >= p->n || p->s[p->pos] != '"') return fail(p, "object key expected");
            size_t kl;
            if (!parse_string(p, &it->key, &kl) || !unique_key(p, j, map)) return false;
            skip_ws(p);
            if (p->pos >= p->n || p->s[p->pos] != ':') return fail(p, "':' expected");
            p->pos++;
            skip_ws(p);
        }
        if (!parse_value(p, it, depth + 1)) return false;
        skip_ws(p);
        if (p->pos >= p->n) return fail(p, "unterminated %s", object ? "object" : "array");
        if (p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->s[p->pos] == close) {
            p->pos++;
            return true;
        }
        return fail(p, "',' or '%c' expected", close);
    }
}

static bool parse_value(struct parser * p, struct bie_json * j, int depth) {
    if (p->pos >= p->n) return fail(p, "value expected");
    if (++p->values > BIE_JSON_MAX_VALUES) return fail(p, "more than %d values", BIE_JSON_MAX_VALUES);
    switch (p->s[p->pos]) {
    case '{': return parse_container(p, j, depth, true);
    case '[': return parse_container(p, j, depth, false);
    case '"': j->type = BIE_JSON_STRING; return parse_string(p, &j->str, &j->len);
    case 't':
        j->type = BIE_JSON_BOOL;
        j->boolean = true;
        return literal(p, "true");
    case 'f':
        j->type = BIE_JSON_BOOL;
        j->boolean = false;
        return literal(p, "false");
    case 'n': j->type = BIE_JSON_NULL; return literal(p, "null");
    default: return parse_number(p, j);
    }
}

void bie_json_free(struct bie_json * j) {
    if (!j) return;
    for (size_t i = 0; i < j->count; i++) bie_json_free(&j->items[i]);
    free(j->items);
    free(j->str);
    free(j->key);
    memset(j, 0, sizeof *j);
}

bool bie_json_parse(const char * text, size_t size, struct bie_json * out, char * err, size_t err_size) {
    struct parser p = {text, size, 0, err, err_size, false, 0};
    memset(out, 0, sizeof *out);
    skip_ws(&p);
    bool ok = parse_value(&p, out, 0);
    if (ok) {
        skip_ws(&p);
        if (p.pos != p.n) ok = fail(&p, "trailing characters after the value");
    }
    if (!ok) bie_json_free(out);
    return ok;
}

bool bie_json_utf8_valid(const char * s, size_t n) {
    for (size_t i = 0; i < n;) {
        const size_t l = utf8_len((const unsigned char *)s + i, n - i);
        if (l == 0) return false;
        i += l;
    }
    return true;
}

const struct bie_json * bie_json_get(const struct bie_json * obj, const char * key) {
    if (!obj || obj->type != BIE_JSON_OBJECT) return NULL;
    for (size_t i = 0; i < obj->count; i++)
        if (strcmp(obj->items[i].key, key) == 0) return &obj->items[i];
    return NULL;
}
