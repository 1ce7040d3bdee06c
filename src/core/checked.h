// SPDX-License-Identifier: Apache-2.0
// checked.h: size arithmetic that reports overflow instead of wrapping (signed overflow is
// undefined behaviour in C; unsigned overflow silently gives a small size). Every function
// returns true and writes the exact result, or returns false (and leaves *out unspecified) when
// the result does not fit. Used wherever a size comes from a caller or a file: tensor views,
// output sizes, model shapes, pools, allocations.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

static inline bool bie_add_i64(int64_t a, int64_t b, int64_t * out) { return !__builtin_add_overflow(a, b, out); }
static inline bool bie_sub_i64(int64_t a, int64_t b, int64_t * out) { return !__builtin_sub_overflow(a, b, out); }
static inline bool bie_mul_i64(int64_t a, int64_t b, int64_t * out) { return !__builtin_mul_overflow(a, b, out); }
static inline bool bie_add_size(size_t a, size_t b, size_t * out) { return !__builtin_add_overflow(a, b, out); }
static inline bool bie_mul_size(size_t a, size_t b, size_t * out) { return !__builtin_mul_overflow(a, b, out); }

// The product of n values, each >= 0 (false on overflow or a negative value).
static inline bool bie_prod_i64(const int64_t * v, int n, int64_t * out) {
    int64_t p = 1;
    for (int i = 0; i < n; i++)
        if (v[i] < 0 || !bie_mul_i64(p, v[i], &p)) return false;
    *out = p;
    return true;
}

// count elements of elem_size bytes as a byte count (false when count < 0 or it overflows).
static inline bool bie_bytes_of(int64_t count, size_t elem_size, size_t * out) {
    if (count < 0 || (uint64_t)count > SIZE_MAX) return false;
    return bie_mul_size((size_t)count, elem_size, out);
}

// ceil(a / b) * b for a >= 0, b > 0.
static inline bool bie_round_up_i64(int64_t a, int64_t b, int64_t * out) {
    int64_t t;
    if (a < 0 || b <= 0 || !bie_add_i64(a, b - 1, &t)) return false;
    *out = t / b * b;
    return true;
}
