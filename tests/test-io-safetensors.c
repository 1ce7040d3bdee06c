// SPDX-License-Identifier: Apache-2.0
// test-io-safetensors.c: the safetensors writer and reader round trip, and the reader rejects
// every kind of hostile header: bad lengths, bad JSON, bad dtypes, shapes and offsets, overlaps,
// holes, duplicates, non-string metadata. Plus the strict JSON parser's corner cases.
#include "bie-train.h"
#include "test-util.h"
#include "io/json.h"

#include <unistd.h>

// Builds a file image: 8-byte length, the header text, then data_size bytes of data.
static size_t image(uint8_t * out, const char * header, size_t data_size) {
    const size_t hl = strlen(header);
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(out + 8, header, hl);
    for (size_t i = 0; i < data_size; i++) out[8 + hl + i] = (uint8_t)i;
    return 8 + hl + data_size;
}

static enum bie_status parse_header(bie_context_t * ctx, const char * header, size_t data_size) {
    static uint8_t buf[1 << 16];
    const size_t n = image(buf, header, data_size);
    bie_safetensors_t * st = NULL;
    enum bie_status s = bie_safetensors_parse(ctx, buf, n, &st);
    CHECK((s == BIE_STATUS_OK) == (st != NULL), "out set on failure");
    bie_safetensors_free(st);
    return s;
}

static void test_round_trip(bie_context_t * ctx) {
    char path[] = "bie-test-st-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    close(fd);
    float a[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
    int8_t b[5] = {-128, -1, 0, 1, 127};
    uint8_t c[3] = {0xff, 0x01, 0x80};
    struct bie_st_tensor t[3] = {
        {"layer.a", BIE_DTYPE_F32, 2, {2, 3}, a, sizeof a},
        {"b \"quoted\"\n", BIE_DTYPE_I8, 1, {5}, b, sizeof b},
        {"c", BIE_DTYPE_U8, 3, {1, 3, 1}, c, sizeof c},
    };
    const char * meta[] = {"arch", "input 1 28 28; bn", "version", "0.1.0 \\ \x01"};
    CHECK_OK(ctx, bie_safetensors_write(ctx, path, t, 3, meta, 2));
    bie_safetensors_t * st = NULL;
    CHECK_OK(ctx, bie_safetensors_read(ctx, path, &st));
    if (st) {
        CHECK(bie_safetensors_count(st) == 3, "count %zu", bie_safetensors_count(st));
        for (int i = 0; i < 3; i++) {
            const struct bie_st_tensor * r = bie_safetensors_find(st, t[i].name);
            CHECK(r != NULL, "tensor %s missing", t[i].name);
            if (!r) continue;
            CHECK(r->dtype == t[i].dtype && r->ndim == t[i].ndim && r->nbytes == t[i].nbytes &&
                      memcmp(r->data, t[i].data, t[i].nbytes) == 0,
                  "tensor %s differs after the round trip", t[i].name);
            for (int d = 0; d < t[i].ndim; d++) CHECK(r->shape[d] == t[i].shape[d], "%s shape[%d]", t[i].name, d);
        }
        CHECK(bie_safetensors_metadata(st, "arch") && !strcmp(bie_safetensors_metadata(st, "arch"), meta[1]), "arch");
        CHECK(bie_safetensors_metadata(st, "version") && !strcmp(bie_safetensors_metadata(st, "version"), meta[3]),
              "escaped metadata");
        CHECK(bie_safetensors_metadata(st, "nope") == NULL, "missing key found");
        CHECK(bie_safetensors_find(st, "nope") == NULL, "missing tensor found");
    }
    bie_safetensors_free(st);
    // The data section starts 8-byte aligned.
    uint8_t * bytes;
    FILE * f = fopen(path, "rb");
    uint8_t len[8] = {0};
    CHECK(f && fread(len, 1, 8, f) == 8, "reread");
    if (f) fclose(f);
    (void)bytes;
    CHECK((len[0] % 8) == 0, "header length %d is not a multiple of 8", len[0]);
    // Duplicate names and the reserved name are refused by the writer.
    struct bie_st_tensor dup[2] = {t[0], t[0]};
    CHECK(bie_safetensors_write(ctx, path, dup, 2, NULL, 0) == BIE_STATUS_INVALID_ARGUMENT, "duplicate names written");
    struct bie_st_tensor bad = t[0];
    bad.nbytes = 5;
    CHECK(bie_safetensors_write(ctx, path, &bad, 1, NULL, 0) == BIE_STATUS_INVALID_ARGUMENT, "wrong nbytes written");
    unlink(path);
    CHECK(bie_safetensors_read(ctx, path, &st) == BIE_STATUS_IO_ERROR, "missing file not an I/O error");
    CHECK(strstr(bie_context_last_error(ctx), path) != NULL, "message does not name the file: %s",
          bie_context_last_error(ctx));
}

static void test_hostile(bie_context_t * ctx) {
    const enum bie_status F = BIE_STATUS_FORMAT_ERROR, OK = BIE_STATUS_OK;
    struct {
        const char * header;
        size_t data;
        enum bie_status want;
    } cases[] = {
        {"{}", 0, OK},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, OK},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},\"__metadata__\":{\"k\":\"v\"}}", 4, OK},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, OK},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 7, F},   // data truncated
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 9, F},   // trailing hole
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, F},   // shape/size mismatch
        {"{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, F},   // unknown dtype
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, F},  // negative dim
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, F}, // non-integer dim
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, F},   // reversed offsets
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, F},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, F},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8, F},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
         6, F}, // overlap
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]}}",
         5, F}, // hole
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
         2, F}, // duplicate
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,0]}}", 0, F}, // overflow
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, F},           // > 8 dims
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,99999999999999999999]}}", 1, F},
        {"{\"__metadata__\":{\"k\":1}}", 0, F},
        {"{\"__metadata__\":[]}", 0, F},
        {"[]", 0, F},
        {"{\"a\":1}", 0, F},
        {"{", 0, F},
        {"{} x", 0, F},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},}", 8, F}, // trailing comma
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const enum bie_status s = parse_header(ctx, cases[i].header, cases[i].data);
        CHECK(s == cases[i].want, "case %zu (%s, %zu data bytes): %s, want %s: %s", i, cases[i].header, cases[i].data,
              bie_status_string(s), bie_status_string(cases[i].want), bie_context_last_error(ctx));
    }
    // Header lengths that exceed the file or the bound, and short files.
    uint8_t buf[16] = {0};
    bie_safetensors_t * st = NULL;
    CHECK(bie_safetensors_parse(ctx, buf, 7, &st) == F, "7-byte file accepted");
    buf[0] = 9;
    CHECK(bie_safetensors_parse(ctx, buf, 16, &st) == F, "header past the end accepted");
    memset(buf, 0xff, 8);
    CHECK(bie_safetensors_parse(ctx, buf, 16, &st) == F, "2^64-1 header length accepted");
    CHECK(strstr(bie_context_last_error(ctx), "header length") != NULL, "message: %s", bie_context_last_error(ctx));
}

static bool json_ok(const char * s) {
    struct bie_json j;
    char err[200];
    bool ok = bie_json_parse(s, strlen(s), &j, err, sizeof err);
    if (ok) bie_json_free(&j);
    return ok;
}

static void test_json(void) {
    const char * good[] = {"0",
                           "-0",
                           "1.5e+3",
                           "-12.25E-2",
                           "\"a\\u00e9\\ud83d\\ude00\\n\"",
                           "[]",
                           "{}",
                           " [1, [2, {\"a\": null}], true, false] ",
                           "\"\xc3\xa9\xf0\x9f\x98\x80\"",
                           "9223372036854775807"};
    const char * bad[] = {
        "",
        " ",
        "01",
        "+1",
        "1.",
        ".5",
        "1e",
        "-",
        "NaN",
        "Infinity",
        "[1,]",
        "{\"a\":1,}",
        "{a:1}",
        "\"\\x\"",
        "\"\\u12\"",
        "\"\\ud800\"",
        "\"\\udc00\"",
        "\"\\u0000\"",
        "\"a\x01\"",
        "\"\xc0\xaf\"",
        "\"\xed\xa0\x80\"",
        "\"\xf4\x90\x80\x80\"",
        "\"abc",
        "[1 2]",
        "tru",
        "nul",
        "{\"a\":1,\"a\":2}",
        "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
        "1 2"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        CHECK(json_ok(good[i]), "valid JSON rejected: %s", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(!json_ok(bad[i]), "invalid JSON accepted: %s", bad[i]);
    struct bie_json j;
    char err[200];
    const char * s = "{\"k\":\"a\\u00e9\",\"n\":-9223372036854775808,\"big\":18446744073709551616}";
    CHECK(bie_json_parse(s, strlen(s), &j, err, sizeof err), "parse: %s", err);
    const struct bie_json *k = bie_json_get(&j, "k"), *n = bie_json_get(&j, "n"), *big = bie_json_get(&j, "big");
    CHECK(k && !strcmp(k->str, "a\xc3\xa9"), "decoded string");
    CHECK(n && n->is_int && n->integer == INT64_MIN, "int64 min");
    CHECK(big && !big->is_int, "2^64 must not be an int64");
    bie_json_free(&j);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    bie_context_t * ctx = NULL;
    bie_context_create(NULL, &ctx);
    test_round_trip(ctx);
    test_hostile(ctx);
    test_json();
    bie_context_destroy(ctx);
    return test_finish("test-io-safetensors");
}
