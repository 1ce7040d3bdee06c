// SPDX-License-Identifier: Apache-2.0
// json.h: a small strict JSON (RFC 8259) parser for headers of untrusted files.
//
// Strict means: one value with optional surrounding whitespace and nothing else; no trailing
// commas, comments, NaN/Infinity, leading zeros or '+' signs; strings must be valid UTF-8 with
// no raw control characters, escapes must be complete (surrogates paired) and may not encode
// U+0000 (names are C strings); object keys must be unique (checked with a hash map: linear time
// for any number of keys). Nesting is limited to BIE_JSON_MAX_DEPTH so a hostile file cannot
// exhaust the stack, and the number of values to BIE_JSON_MAX_VALUES.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BIE_JSON_MAX_DEPTH 32
// At most this many values (each element of an array or member of an object counts once), so that
// a hostile header's parsed tree stays small (about 100 bytes a value) whatever its length.
#define BIE_JSON_MAX_VALUES (1 << 19)

enum bie_json_type {
    BIE_JSON_NULL,
    BIE_JSON_BOOL,
    BIE_JSON_NUMBER,
    BIE_JSON_STRING,
    BIE_JSON_ARRAY,
    BIE_JSON_OBJECT,
};

struct bie_json {
    enum bie_json_type type;
    bool boolean;
    bool is_int;     // a number written without fraction or exponent that fits in int64
    int64_t integer; // its value when is_int
    double number;
    char * str; // STRING: decoded, NUL-terminated (no interior NUL)
    size_t len;
    char * key;              // the key of an object member, else NULL
    struct bie_json * items; // ARRAY / OBJECT members, in file order
    size_t count;
};

// Parses text[0..size). On failure returns false and writes a message (with the byte offset)
// to err. The tree is freed with bie_json_free.
bool bie_json_parse(const char * text, size_t size, struct bie_json * out, char * err, size_t err_size);
void bie_json_free(struct bie_json * j);

// True when s[0..n) is valid UTF-8 (RFC 3629: no overlong forms, no surrogates, at most U+10FFFF).
bool bie_json_utf8_valid(const char * s, size_t n);

// The member of an object named key, or NULL.
const struct bie_json * bie_json_get(const struct bie_json * obj, const char * key);
