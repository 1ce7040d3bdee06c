// SPDX-License-Identifier: Apache-2.0
// fuzz-bytes.h: decisions read from a fuzzer's input bytes. Every read is defined however short the
// input (zeros once it runs out), so any input is a valid case and libFuzzer's mutations of the
// bytes become mutations of the case.
#pragma once

#include <stddef.h>
#include <stdint.h>

struct fz {
    const uint8_t * p;
    size_t n, i;
};

static inline uint8_t fz_byte(struct fz * f) { return f->i < f->n ? f->p[f->i++] : 0; }

static inline uint32_t fz_u32(struct fz * f) {
    uint32_t v = 0;
    for (int b = 0; b < 4; b++) v |= (uint32_t)fz_byte(f) << (8 * b);
    return v;
}

// A value in [lo, hi] (hi - lo < 2^32) from 1 byte when the range fits in one, else 4.
static inline int64_t fz_range(struct fz * f, int64_t lo, int64_t hi) {
    const uint64_t span = (uint64_t)(hi - lo) + 1;
    const uint64_t v = span <= 256 ? fz_byte(f) : fz_u32(f);
    return lo + (int64_t)(v % span);
}

// True with probability about 1 / n (never once the input is used up: the common path).
static inline int fz_one_in(struct fz * f, int n) { return f->i < f->n && fz_byte(f) % n == 0; }

// A float: mostly in [-scale, scale], sometimes a special value (NaN, +-inf, +-0, huge, tiny).
static inline float fz_float(struct fz * f, float scale, int specials) {
    const uint8_t k = fz_byte(f);
    if (specials && k >= 250) {
        static const float s[6] = {__builtin_nanf(""), __builtin_inff(), -__builtin_inff(), -0.0f, 3e38f, 1e-42f};
        return s[k - 250];
    }
    const uint8_t h = fz_byte(f);
    return ((float)((k << 8) | h) / 32768.0f - 1.0f) * scale;
}
