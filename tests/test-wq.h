// SPDX-License-Identifier: Apache-2.0
// test-wq.h: random weight-only n-bit layers for the tests (tests/test-wq.c, tests/cuda/test-cuda-wq.c):
// codes packed by an independent packer written from the layout's definition, random scales, zeros,
// act-order permutations, channel scales and biases, and the magnitude bounds from which the tests
// derive their tolerances.
#pragma once

#include "test-util.h"

static const double U32 = 1.0 / (1 << 24); // unit roundoff of f32

struct layer {
    struct bie_wq_desc d;
    int64_t M, G, rows;
    int32_t * bits;  // [G]
    int32_t * codes; // [K][N]
    struct bie_tensor qweight, scales, zeros, gbits, perm, cs, bias;
    struct bie_wq_weight w;
};

// The independent packer: codes of packed row r at stream bit r*b (uniform) or from the group's
// first word row (mixed), LSB first, 32-bit words down each column.
static inline void pack_codes(const struct layer * L, uint32_t * qw) {
    const int64_t K = L->d.in_features, N = L->d.out_features, gs = L->d.group_size < K ? L->d.group_size : K;
    memset(qw, 0, (size_t)(L->rows * N) * 4);
    int64_t gword = 0;
    for (int64_t g = 0; g < L->G; g++) {
        const int b = L->bits[g];
        const int64_t r0 = g * gs, r1 = r0 + gs < K ? r0 + gs : K;
        for (int64_t r = r0; r < r1; r++)
            for (int64_t n = 0; n < N; n++) {
                const int64_t bit = L->d.bits ? r * b : gword * 32 + (r - r0) * b;
                for (int i = 0; i < b; i++)
                    if ((L->codes[r * N + n] >> i) & 1) qw[((bit + i) / 32) * N + n] |= 1u << ((bit + i) % 32);
            }
        gword += ((r1 - r0) * b + 31) / 32;
    }
}

static inline enum bie_dtype pick_float(void) {
    const int64_t v[] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16};
    return (enum bie_dtype)test_pick(v, 3);
}

// A random layer in *out (its weight view points into *out).
static inline void make_layer(struct layer * out, int64_t M, int64_t K, int64_t N, int bits, int gsz,
                              enum bie_wq_zero zero, bool perm, bool cs, bool bias) {
    struct layer L;
    memset(&L, 0, sizeof L);
    L.d = (struct bie_wq_desc){.in_features = K, .out_features = N, .bits = bits, .group_size = gsz, .zero = zero};
    L.M = M;
    const int64_t gs = gsz < K ? gsz : K;
    L.G = (K + gs - 1) / gs;
    L.bits = malloc((size_t)L.G * 4);
    for (int64_t g = 0; g < L.G; g++) {
        const int64_t mixed[] = {2, 3, 4, 8};
        L.bits[g] = bits ? bits : (int32_t)test_pick(mixed, 4);
    }
    CHECK(bie_wq_qweight_rows(&L.d, L.bits, &L.rows) == BIE_STATUS_OK, "rows");
    L.codes = malloc((size_t)(K * N) * 4);
    for (int64_t r = 0; r < K; r++)
        for (int64_t n = 0; n < N; n++) L.codes[r * N + n] = (int32_t)test_rand_int(0, (1 << L.bits[r / gs]) - 1);
    L.qweight = test_tensor(BIE_DTYPE_I32, 2, (int64_t[]){L.rows, N}, NULL);
    pack_codes(&L, L.qweight.data);
    L.scales = test_tensor(pick_float(), 2, (int64_t[]){L.G, N}, NULL);
    test_fill_uniform(&L.scales, 0.004f, 0.05f);
    if (zero != BIE_WQ_ZERO_SYM) {
        L.zeros = test_tensor(pick_float(), 2, (int64_t[]){L.G, N}, NULL);
        int64_t idx[2] = {0, 0};
        do {
            const int b = L.bits[0];
            double z = zero == BIE_WQ_ZERO_CODE ? (double)test_rand_int(0, (1 << b) - 1) : test_rand_float(-0.2f, 0.2f);
            if (zero == BIE_WQ_ZERO_CODE && test_rand_int(0, 7) == 0) z += 0.5; // non-integer zeros are legal too
            bie_store(&L.zeros, bie_offset(&L.zeros, idx), z);
        } while (bie_next_index(&L.zeros, idx));
    }
    if (!bits) {
        L.gbits = test_tensor(BIE_DTYPE_I32, 1, (int64_t[]){L.G}, NULL);
        memcpy(L.gbits.data, L.bits, (size_t)L.G * 4);
    }
    if (perm) {
        L.perm = test_tensor(BIE_DTYPE_I32, 1, (int64_t[]){K}, NULL);
        int32_t * p = L.perm.data;
        for (int64_t i = 0; i < K; i++) p[i] = (int32_t)i;
        for (int64_t i = K - 1; i > 0; i--) {
            const int64_t j = test_rand_int(0, i);
            const int32_t t = p[i];
            p[i] = p[j];
            p[j] = t;
        }
    }
    if (cs) {
        L.cs = test_tensor(pick_float(), 1, (int64_t[]){K}, NULL);
        test_fill_uniform(&L.cs, 0.5f, 2.0f);
    }
    if (bias) {
        L.bias = test_tensor(pick_float(), 1, (int64_t[]){N}, NULL);
        test_fill_uniform(&L.bias, -1.0f, 1.0f);
    }
    *out = L;
    out->w.qweight = &out->qweight;
    out->w.scales = &out->scales;
    out->w.zeros = L.zeros.data ? &out->zeros : NULL;
    out->w.group_bits = L.gbits.data ? &out->gbits : NULL;
    out->w.perm = L.perm.data ? &out->perm : NULL;
    out->w.channel_scale = L.cs.data ? &out->cs : NULL;
    out->w.bias = L.bias.data ? &out->bias : NULL;
}

static inline void free_layer(struct layer * L) {
    free(L->bits);
    free(L->codes);
    struct bie_tensor * ts[] = {&L->qweight, &L->scales, &L->zeros, &L->gbits, &L->perm, &L->cs, &L->bias};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) test_tensor_free(ts[i]);
}

// |s|*|q| + |c|: the magnitude bound of W[r, n]'s two terms (c = s*z, s*2^(b-1) or z).
static inline double wbound(const struct layer * L, int64_t r, int64_t n) {
    const int64_t K = L->d.in_features, N = L->d.out_features, gs = L->d.group_size < K ? L->d.group_size : K;
    const int64_t g = r / gs;
    const double s = fabs(bie_load(&L->scales, g * N + n)), q = L->codes[r * N + n];
    const double z = L->zeros.data ? fabs(bie_load(&L->zeros, g * N + n)) : (double)(1 << (L->bits[g] - 1));
    return s * q + (L->d.zero == BIE_WQ_ZERO_OFFSET ? z : s * z);
}

static inline double eps_of(enum bie_dtype d) {
    return d == BIE_DTYPE_F16 ? 1.0 / 1024 : d == BIE_DTYPE_BF16 ? 1.0 / 128 : U32 * 2;
}

// x'[m, r] as the layer reads it.
static inline double xprime(const struct layer * L, const struct bie_tensor * x, int64_t m, int64_t r) {
    const int64_t k = L->perm.data ? ((int32_t *)L->perm.data)[r] : r;
    float v = (float)bie_load(x, m * x->stride[x->ndim - 2] + k * x->stride[x->ndim - 1]);
    if (L->cs.data) v *= (float)bie_load(&L->cs, k);
    return v;
}
