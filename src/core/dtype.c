// SPDX-License-Identifier: Apache-2.0
// dtype.c: dtype traits, f16/bf16 conversions and element access on any view.
#include "bie-impl.h"

#include <math.h>
#include <string.h>

bool bie_dtype_valid(enum bie_dtype dtype) { return (unsigned)dtype <= (unsigned)BIE_DTYPE_I64; }

bool bie_dtype_is_float(enum bie_dtype dtype) {
    return dtype == BIE_DTYPE_F32 || dtype == BIE_DTYPE_F16 || dtype == BIE_DTYPE_BF16;
}

int bie_dtype_bits(enum bie_dtype dtype) {
    switch (dtype) {
    case BIE_DTYPE_B1: return 1;
    case BIE_DTYPE_S4: return 4;
    case BIE_DTYPE_I8:
    case BIE_DTYPE_U8: return 8;
    case BIE_DTYPE_F16:
    case BIE_DTYPE_BF16: return 16;
    case BIE_DTYPE_F32:
    case BIE_DTYPE_I32: return 32;
    case BIE_DTYPE_F64:
    case BIE_DTYPE_I64: return 64;
    }
    return 0;
}

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float bie_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13)); // inf / nan
    if (exp == 0) {
        if (man == 0) return bits_f32(sign);
        // subnormal: value = man * 2^-24
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t bie_f32_to_f16(float f) {
    const uint32_t u = f32_bits(f);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    const uint32_t au = u & 0x7fffffffu;
    if (au >= 0x7f800000u) // inf or nan (nan stays a quiet nan)
        return (uint16_t)(sign | 0x7c00 | (au > 0x7f800000u ? 0x200 | ((au >> 13) & 0x3ff) : 0));
    if (au >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); // rounds to >= 65520: inf
    if (au < 0x38800000u) {                                  // below the smallest normal 2^-14
        // subnormal or zero: round |f| / 2^-24 to nearest even integer
        const float a = bits_f32(au);
        const float q = __builtin_rintf(a * 0x1p24f);
        return (uint16_t)(sign | (uint16_t)q);
    }
    // normal: drop 13 mantissa bits with round-to-nearest-even (carry may bump the exponent)
    uint32_t r = au - 0x38000000u; // rebias 127 -> 15
    r += 0xfffu + ((r >> 13) & 1);
    return (uint16_t)(sign | (r >> 13));
}

float bie_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t bie_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); // quiet nan
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

double bie_load(const struct bie_tensor * t, int64_t off) {
    const unsigned char * p = t->data;
    switch (t->dtype) {
    case BIE_DTYPE_F32: return ((const float *)p)[off];
    case BIE_DTYPE_F64: return ((const double *)p)[off];
    case BIE_DTYPE_F16: return bie_f16_to_f32(((const uint16_t *)p)[off]);
    case BIE_DTYPE_BF16: return bie_bf16_to_f32(((const uint16_t *)p)[off]);
    case BIE_DTYPE_I8: return ((const int8_t *)p)[off];
    case BIE_DTYPE_U8: return p[off];
    case BIE_DTYPE_I32: return ((const int32_t *)p)[off];
    case BIE_DTYPE_I64: return (double)((const int64_t *)p)[off];
    case BIE_DTYPE_B1: return (p[off >> 3] >> (off & 7)) & 1 ? 1.0 : -1.0;
    case BIE_DTYPE_S4: {
        const int nib = (off & 1) ? p[off >> 1] & 0xf : p[off >> 1] >> 4;
        return nib >= 8 ? nib - 16 : nib;
    }
    }
    return 0.0;
}

void bie_store(const struct bie_tensor * t, int64_t off, double v) {
    unsigned char * p = t->data;
    switch (t->dtype) {
    case BIE_DTYPE_F32: ((float *)p)[off] = (float)v; break;
    case BIE_DTYPE_F64: ((double *)p)[off] = v; break;
    case BIE_DTYPE_F16: ((uint16_t *)p)[off] = bie_f32_to_f16((float)v); break;
    case BIE_DTYPE_BF16: ((uint16_t *)p)[off] = bie_f32_to_bf16((float)v); break;
    case BIE_DTYPE_I8: ((int8_t *)p)[off] = (int8_t)v; break;
    case BIE_DTYPE_U8: p[off] = (unsigned char)v; break;
    case BIE_DTYPE_I32: ((int32_t *)p)[off] = (int32_t)v; break;
    case BIE_DTYPE_I64: ((int64_t *)p)[off] = (int64_t)v; break;
    case BIE_DTYPE_B1:
        if (v >= 0) p[off >> 3] |= (unsigned char)(1u << (off & 7));
        else p[off >> 3] &= (unsigned char)~(1u << (off & 7));
        break;
    case BIE_DTYPE_S4: {
        const unsigned nib = (unsigned)((int)v & 0xf);
        unsigned char * b = &p[off >> 1];
        *b = (off & 1) ? (unsigned char)((*b & 0xf0) | nib) : (unsigned char)((*b & 0x0f) | (nib << 4));
        break;
    }
    }
}

float bie_load_scalar(const struct bie_tensor * t) { return (float)bie_load(t, 0); }
