// SPDX-License-Identifier: Apache-2.0
// test-cpu-common.h: shared helpers of the CPU backend tests (tests/test-cpu-*.c): contexts per
// ISA level, random views in the layouts the fast paths take (contiguous, channels-last, packed)
// and in odd ones (strided), and byte comparisons.
#pragma once

#include "test-util.h"

static inline bool cpu_test_quick(void) {
    const char * q = getenv("BIE_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

static inline bie_context_t * cpu_test_ctx(enum bie_backend backend, enum bie_cpu_isa isa, int threads) {
    struct bie_context_params p;
    bie_context_params_default(&p);
    p.backend = backend;
    p.max_isa = isa;
    p.num_threads = threads;
    bie_context_t * ctx = NULL;
    if (bie_context_create(&p, &ctx) != BIE_STATUS_OK) {
        fprintf(stderr, "cannot create a context\n");
        exit(2);
    }
    return ctx;
}

// The ISA levels that the tests know, BIE_CPU_ISA_SCALAR .. BIE_CPU_ISA_AVX512_VNNI.
#define CPU_TEST_LEVELS (BIE_CPU_ISA_AVX512_VNNI + 1)

// Runs body once per ISA level up to the detected one; prints which levels ran and were skipped.
static inline int cpu_test_levels(enum bie_cpu_isa * out) {
    const enum bie_cpu_isa det = bie_cpu_isa_detected();
    int n = 0;
    for (int i = BIE_CPU_ISA_SCALAR; i < CPU_TEST_LEVELS; i++) {
        if (i <= (int)det) {
            out[n++] = (enum bie_cpu_isa)i;
            printf("isa %s: tested\n", bie_cpu_isa_name((enum bie_cpu_isa)i));
        } else {
            printf("isa %s: skipped (not on this machine)\n", bie_cpu_isa_name((enum bie_cpu_isa)i));
        }
    }
    return n;
}

// The reference context (one thread) and one CPU context per ISA level this machine has, each
// with `threads` threads; returns the number of levels (printing which ran, as cpu_test_levels).
static inline int cpu_test_contexts(bie_context_t ** ref, bie_context_t ** cpu, int threads) {
    enum bie_cpu_isa levels[CPU_TEST_LEVELS];
    const int nlev = cpu_test_levels(levels);
    *ref = cpu_test_ctx(BIE_BACKEND_REF, BIE_CPU_ISA_BEST, 1);
    for (int l = 0; l < nlev; l++) cpu[l] = cpu_test_ctx(BIE_BACKEND_CPU, levels[l], threads);
    return nlev;
}

// A linear or conv2d layer case of the CPU forward tests: its descriptors, operands, an output of
// the shape and dtype it writes, and its description for the messages.
struct cpu_test_layer {
    enum bie_quant q;
    bool conv;
    struct bie_linear_desc lin;
    struct bie_conv2d_desc cd;
    struct bie_tensor x, bias, w, sa, sw, y;
    bool has_bias;
    float clamp; // x_clamp (0: none)
    char what[320];
};

// The case's forward on ctx into y (bias_a when the case has one).
static inline enum bie_status cpu_test_layer_forward(bie_context_t * ctx, const struct cpu_test_layer * c,
                                                     struct bie_tensor * y) {
    struct bie_forward_args a = {.x = &c->x,
                                 .bias_a = c->has_bias ? &c->bias : NULL,
                                 .weight = &c->w,
                                 .scale_a = &c->sa,
                                 .scale_w = &c->sw,
                                 .y = y,
                                 .x_clamp = c->clamp};
    return c->conv ? bie_conv2d_forward(ctx, &c->cd, &a) : bie_linear_forward(ctx, &c->lin, &a);
}

// The contexts of the layer comparisons: the reference (one thread), one CPU context per ISA level
// this machine has with `threads` threads (cpu_test_contexts) and one at the best level with one
// thread; quick: BIE_TEST_QUICK asks for fewer cases.
struct cpu_test_ctxs {
    bie_context_t *ref, *cpu[CPU_TEST_LEVELS], *cpu1;
    int nlev;
    bool quick;
};

static inline void cpu_test_ctxs_make(struct cpu_test_ctxs * c, int threads) {
    c->nlev = cpu_test_contexts(&c->ref, c->cpu, threads);
    c->cpu1 = cpu_test_ctx(BIE_BACKEND_CPU, BIE_CPU_ISA_BEST, 1);
    c->quick = cpu_test_quick();
}

static inline void cpu_test_ctxs_free(struct cpu_test_ctxs * c) {
    for (int l = 0; l < c->nlev; l++) bie_context_destroy(c->cpu[l]);
    bie_context_destroy(c->cpu1);
    bie_context_destroy(c->ref);
}

// Random geometry of a conv case with d->quant set: kernel sizes from ks[0 .. nk), strides 1-3,
// paddings 0-2, dilation 2 one time in four, one group, any pad value for a binary layer (zero
// otherwise); then a batch *N of 1-3 and an image of up to hw x hw pixels, raised to where the
// dilated window less the padding fits once; *OH x *OW is the output.
static inline void cpu_test_conv_geometry(struct bie_conv2d_desc * d, const int * ks, int nk, int64_t hw, int64_t * N,
                                          int64_t * H, int64_t * W, int64_t * OH, int64_t * OW) {
    for (int i = 0; i < 2; i++) {
        d->kernel[i] = ks[test_rand_int(0, nk - 1)];
        d->stride[i] = (int)test_rand_int(1, 3);
        d->padding[i] = (int)test_rand_int(0, 2);
        d->dilation[i] = test_rand_int(0, 3) ? 1 : 2;
    }
    d->groups = 1;
    d->pad_value = d->quant == BIE_QUANT_BINARY ? (enum bie_pad_value)test_rand_int(0, 2) : BIE_PAD_ZERO;
    *N = test_rand_int(1, 3);
    *H = test_rand_int(1, hw);
    *W = test_rand_int(1, hw);
    const int64_t eh = (int64_t)d->dilation[0] * (d->kernel[0] - 1) + 1 - 2 * d->padding[0];
    const int64_t ew = (int64_t)d->dilation[1] * (d->kernel[1] - 1) + 1 - 2 * d->padding[1];
    if (*H < eh) *H = eh;
    if (*W < ew) *W = ew;
    bie_conv2d_output_size(d, *H, *W, OH, OW);
}

// A 4-D [d0, d1, d2, d3] view whose memory order is `order` (a permutation of 0..3: the dims from
// slowest to fastest), e.g. {0, 2, 3, 1} for channels-last. Sub-byte dtypes pad the innermost
// stored dim to whole bytes (the packed interchange layout).
static inline struct bie_tensor cpu_test_view4(enum bie_dtype d, const int64_t shape[4], const int order[4]) {
    int64_t stored[4];
    for (int i = 0; i < 4; i++) stored[i] = shape[order[i]];
    struct bie_tensor t = test_tensor(d, 4, stored, NULL);
    int32_t inv[4];
    for (int i = 0; i < 4; i++) inv[order[i]] = i;
    struct bie_tensor v = t;
    for (int i = 0; i < 4; i++) {
        v.shape[i] = t.shape[inv[i]];
        v.stride[i] = t.stride[inv[i]];
    }
    return v;
}

// A 2-D [rows, cols] view, contiguous, or with a gap after every row when `gap` (row stride
// cols + 3, or for sub-byte dtypes one extra byte).
static inline struct bie_tensor cpu_test_view2(enum bie_dtype d, int64_t rows, int64_t cols, bool gap) {
    const int64_t shape[2] = {rows, cols};
    struct bie_tensor t = test_tensor(d, 2, shape, NULL);
    if (gap) {
        free(t.data);
        const int64_t extra = d == BIE_DTYPE_B1 ? 8 : d == BIE_DTYPE_S4 ? 2 : 3;
        t.stride[0] += extra;
        size_t bytes = 0;
        bie_tensor_nbytes(&t, &bytes);
        t.data = calloc(1, bytes + 64);
    }
    return t;
}

static inline size_t cpu_test_nbytes(const struct bie_tensor * t) {
    size_t b = 0;
    bie_tensor_nbytes(t, &b);
    return b;
}

// Fills the whole buffer behind t (padding included) with random bytes.
static inline void cpu_test_garbage(const struct bie_tensor * t) {
    uint8_t * p = t->data;
    for (size_t i = 0; i < cpu_test_nbytes(t); i++) p[i] = (uint8_t)test_rand_u64();
}

// A copy of t with its own buffer (same strides).
static inline struct bie_tensor cpu_test_clone(const struct bie_tensor * t) {
    struct bie_tensor c = *t;
    const size_t b = cpu_test_nbytes(t);
    c.data = malloc(b + 64);
    memcpy(c.data, t->data, b);
    return c;
}
