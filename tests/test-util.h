// SPDX-License-Identifier: Apache-2.0
// test-util.h: the tiny test harness shared by every test program: a seeded RNG, checks that
// count failures and print what failed, and helpers to allocate tensors.
//
// The seed comes from BIE_TEST_SEED (default 12345) and is printed on every failure, so a failing
// case can be replayed exactly.
#pragma once

#include "bie-impl.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failures = 0;
static int test_checks = 0;
static uint64_t test_seed = 12345;
static uint64_t test_rng_state = 12345;

static inline void test_init(int argc, char ** argv) {
    (void)argc;
    (void)argv;
    const char * s = getenv("BIE_TEST_SEED");
    if (s && *s) test_seed = strtoull(s, NULL, 10);
    test_rng_state = test_seed;
}

// splitmix64
static inline uint64_t test_rand_u64(void) {
    uint64_t z = (test_rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
// Uniform integer in [lo, hi].
static inline int64_t test_rand_int(int64_t lo, int64_t hi) {
    return lo + (int64_t)(test_rand_u64() % (uint64_t)(hi - lo + 1));
}
// Uniform float in [lo, hi).
static inline float test_rand_float(float lo, float hi) {
    return lo + (hi - lo) * (float)((test_rand_u64() >> 40) * 0x1p-24);
}
static inline int64_t test_pick(const int64_t * values, int n) { return values[test_rand_int(0, n - 1)]; }

// The tests' small conv: binary, C -> O channels, 3x3, stride 1, padding 1, dilation 1.
static inline struct bie_conv2d_desc test_conv3x3(int64_t c, int64_t o, enum bie_pad_value pad) {
    struct bie_conv2d_desc d = {.quant = BIE_QUANT_BINARY, .in_channels = c, .out_channels = o, .groups = 1};
    d.kernel[0] = d.kernel[1] = 3;
    d.stride[0] = d.stride[1] = d.padding[0] = d.padding[1] = d.dilation[0] = d.dilation[1] = 1;
    d.pad_value = pad;
    return d;
}

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        test_checks++;                                                                                                 \
        if (!(cond)) {                                                                                                 \
            test_failures++;                                                                                           \
            if (test_failures <= 30) {                                                                                 \
                fprintf(stderr, "FAIL %s:%d (seed %" PRIu64 "): %s: ", __FILE__, __LINE__, test_seed, #cond);          \
                fprintf(stderr, __VA_ARGS__);                                                                          \
                fprintf(stderr, "\n");                                                                                 \
            }                                                                                                          \
        }                                                                                                              \
    } while (0)

#define CHECK_OK(ctx, expr)                                                                                            \
    do {                                                                                                               \
        enum bie_status st_ = (expr);                                                                                  \
        CHECK(st_ == BIE_STATUS_OK, "%s -> %s: %s", #expr, bie_status_string(st_), bie_context_last_error(ctx));       \
    } while (0)

// Checks that `call` returns want_status with a message on ctx naming `name`.
#define TEST_EXPECT_STATUS(ctx, call, want_status, name)                                                               \
    do {                                                                                                               \
        const enum bie_status s_ = (call);                                                                             \
        const char * m_ = bie_context_last_error(ctx);                                                                 \
        CHECK(s_ == (want_status) && strstr(m_, (name)) != NULL, "%s: got %s \"%s\", want %s naming \"%s\"", #call,    \
              bie_status_string(s_), m_, bie_status_string(want_status), (name));                                      \
    } while (0)

// A context on the given backend (BIE_BACKEND_REF: the plain-C reference); exits 2 if it cannot be
// made.
static inline bie_context_t * test_new_context(enum bie_backend backend) {
    struct bie_context_params p;
    bie_context_params_default(&p);
    p.backend = backend;
    bie_context_t * ctx = NULL;
    if (bie_context_create(&p, &ctx) != BIE_STATUS_OK) {
        fprintf(stderr, "cannot create a context on backend %d\n", (int)backend);
        exit(2);
    }
    return ctx;
}

// The default context, moved to the reference backend when BIE_TEST_BACKEND_REF is set (a test
// run over the reference); exits 2 if it cannot be made.
static inline bie_context_t * test_env_context(void) {
    bie_context_t * ctx = test_new_context(BIE_BACKEND_AUTO);
    if (getenv("BIE_TEST_BACKEND_REF")) bie_context_set_backend(ctx, BIE_BACKEND_REF);
    return ctx;
}

// Prints the summary line and returns the process exit code.
static inline int test_finish(const char * name) {
    printf("%s: %d checks, seed %" PRIu64 "\n", name, test_checks, test_seed);
    printf("%d passed, %d failed\n", test_checks - test_failures, test_failures);
    return test_failures ? 1 : 0;
}

// A CPU tensor owning its buffer (free with test_tensor_free). Dense row-major (sub-byte rows
// padded to bytes), or with the given element strides when `stride` is non-NULL.
static inline struct bie_tensor test_tensor(enum bie_dtype dtype, int32_t ndim, const int64_t * shape,
                                            const int64_t * stride) {
    struct bie_tensor t;
    if (bie_tensor_make(&t, NULL, dtype, ndim, shape) != BIE_STATUS_OK) {
        fprintf(stderr, "test_tensor: bad shape\n");
        exit(2);
    }
    if (stride) memcpy(t.stride, stride, sizeof(int64_t) * (size_t)ndim);
    size_t bytes = 0;
    bie_tensor_nbytes(&t, &bytes);
    t.data = calloc(1, bytes + 64);
    if (!t.data) exit(2);
    return t;
}
// A [M, K] (nd = 2) or [B, T, K] (nd = 3) tensor whose leading dims flatten into rows (as a linear
// layer's x needs), in layout 0 (dense rows), 1 (a gap after every row: 3 elements, or 8 bits for
// B1) or 2 (elements 3 apart, rows 3K + 5 apart).
static inline struct bie_tensor test_tensor_rows(enum bie_dtype d, int nd, const int64_t * shape, int layout) {
    const int64_t K = shape[nd - 1];
    const int64_t dense = d == BIE_DTYPE_B1 ? 8 * ((K + 7) / 8) : K, gap = d == BIE_DTYPE_B1 ? 8 : 3;
    const int64_t pitch = layout == 0 ? dense : layout == 1 ? dense + gap : 3 * K + 5;
    if (nd != 2 && nd != 3) {
        fprintf(stderr, "test_tensor_rows: %d dims (2 or 3 only)\n", nd);
        exit(2);
    }
    int64_t st[3];
    st[nd - 1] = layout == 2 ? 3 : 1;
    st[nd - 2] = pitch;
    if (nd == 3) st[0] = pitch * shape[1];
    return test_tensor(d, nd, shape, st);
}
static inline void test_tensor_free(struct bie_tensor * t) {
    free(t->data);
    t->data = NULL;
}
// Fills every element with uniform values in [lo, hi) (rounded to the dtype).
static inline void test_fill_uniform(const struct bie_tensor * t, float lo, float hi) {
    int64_t idx[BIE_MAX_DIMS] = {0};
    do {
        double v = test_rand_float(lo, hi);
        if (t->dtype == BIE_DTYPE_I8 || t->dtype == BIE_DTYPE_S4 || t->dtype == BIE_DTYPE_I32) v = floor(v);
        bie_store(t, bie_offset(t, idx), v);
    } while (bie_next_index(t, idx));
}
// A scalar f32 tensor holding v (owning its buffer).
static inline struct bie_tensor test_scalar(float v) {
    struct bie_tensor t = test_tensor(BIE_DTYPE_F32, 0, NULL, NULL);
    ((float *)t.data)[0] = v;
    return t;
}

// A dense row-major CPU view of existing memory: TEST_VIEW(data, dtype, d0, d1, ...).
static inline struct bie_tensor test_view(const void * data, enum bie_dtype dtype, int32_t ndim,
                                          const int64_t * shape) {
    struct bie_tensor t;
    if (bie_tensor_make(&t, (void *)(uintptr_t)data, dtype, ndim, shape) != BIE_STATUS_OK) {
        fprintf(stderr, "test_view: bad shape\n");
        exit(2);
    }
    return t;
}
#define TEST_VIEW(data, dtype, ...)                                                                                    \
    test_view((data), (dtype), (int32_t)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),                          \
              (const int64_t[]){__VA_ARGS__})
