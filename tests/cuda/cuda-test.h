// SPDX-License-Identifier: Apache-2.0
// cuda-test.h: helpers of the CUDA tests: skip cleanly without a GPU, mirror host tensors on the
// device (same strides, same bytes) and bring them back, and random layer operands in several
// memory layouts. Results are compared with a second context that uses the plain-C reference
// backend on the host copies.
#pragma once

#include "test-util.h"

#include <cuda_runtime.h>

#include "bie-cuda.h"

static inline bool cuda_test_quick(void) {
    const char * q = getenv("BIE_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

// Exits 0 with a line saying so when no CUDA device can be used.
static inline void cuda_test_require_gpu(const char * name) {
    if (!bie_backend_available(BIE_BACKEND_CUDA)) {
        printf("%s: skipped: no CUDA device is available\n", name);
        exit(0);
    }
}

// A context on the reference backend (the host copies' results) and one on the default (CUDA) one.
static inline void cuda_test_contexts(bie_context_t ** ref, bie_context_t ** cu) {
    *ref = test_new_context(BIE_BACKEND_REF);
    *cu = test_new_context(BIE_BACKEND_AUTO);
}

#define CUDA_OK(expr)                                                                                                  \
    do {                                                                                                               \
        cudaError_t e_ = (expr);                                                                                       \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_));                     \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static inline size_t tensor_span(const struct bie_tensor * t) {
    size_t b = 0;
    bie_tensor_nbytes(t, &b);
    return b;
}

// A device copy of host tensor h (same view, same bytes). Free with cuda_tensor_free.
static inline struct bie_tensor cuda_mirror(const struct bie_tensor * h) {
    struct bie_tensor d = *h;
    const size_t n = tensor_span(h);
    CUDA_OK(cudaMalloc(&d.data, n + 16));
    CUDA_OK(cudaMemcpy(d.data, h->data, n, cudaMemcpyHostToDevice));
    d.device_type = BIE_DEVICE_CUDA;
    d.device_index = 0;
    return d;
}
static inline void cuda_fetch(struct bie_tensor * h, const struct bie_tensor * d) {
    CUDA_OK(cudaMemcpy(h->data, d->data, tensor_span(h), cudaMemcpyDeviceToHost));
}
static inline void cuda_tensor_free(struct bie_tensor * d) {
    if (d->data) CUDA_OK(cudaFree(d->data));
    d->data = NULL;
}

// Fills every byte of t's span with random bits (poison: outputs must overwrite what they own,
// and keep the bits of packed bytes that belong to no element).
static inline void fill_poison(const struct bie_tensor * t) {
    const size_t n = tensor_span(t);
    for (size_t i = 0; i < n; i++) ((uint8_t *)t->data)[i] = (uint8_t)test_rand_u64();
}

// A 4-D [d0, d1, d2, d3] host tensor: dense NCHW (kind 0), channels-last (kind 1: dim 1 fastest),
// or with gaps between rows (kind 2).
static inline struct bie_tensor make4(enum bie_dtype dt, const int64_t * shape, int kind) {
    if (kind == 1) {
        const int64_t s[4] = {shape[0], shape[2], shape[3], shape[1]};
        struct bie_tensor t = test_tensor(dt, 4, s, NULL);
        const int32_t perm[4] = {0, 3, 1, 2};
        bie_tensor_permute(&t, perm);
        return t;
    }
    if (kind == 2 && dt != BIE_DTYPE_B1 && dt != BIE_DTYPE_S4) {
        int64_t st[4];
        st[3] = 1;
        for (int i = 2; i >= 0; i--) st[i] = st[i + 1] * shape[i + 1] + test_rand_int(0, 3);
        return test_tensor(dt, 4, shape, st);
    }
    return test_tensor(dt, 4, shape, NULL);
}

// Max |a - b| over all elements, and max |b| (for relative tolerances).
static inline void max_diff(const struct bie_tensor * a, const struct bie_tensor * b, double * diff, double * mag) {
    *diff = 0.0;
    *mag = 0.0;
    int64_t idx[BIE_MAX_DIMS] = {0};
    do {
        const double x = bie_load(a, bie_offset(a, idx)), y = bie_load(b, bie_offset(b, idx));
        const double d = isnan(x) || isnan(y) ? INFINITY : fabs(x - y);
        if (d > *diff) *diff = d;
        if (fabs(y) > *mag) *mag = fabs(y);
    } while (bie_next_index(a, idx));
}

// Writes index idx of an ndim-dimensional tensor as "[i,j,...]" into s (n bytes, truncated).
static inline void format_index(char * s, size_t n, const int64_t * idx, int ndim) {
    size_t len = (size_t)snprintf(s, n, "[");
    for (int d = 0; d < ndim && len < n; d++)
        len += (size_t)snprintf(s + len, n - len, "%s%lld", d ? "," : "", (long long)idx[d]);
    if (len < n) snprintf(s + len, n - len, "]");
}

// The elements where a and b (one shape) differ by value: how many, and the first and the last of
// them (index, a's value, b's value) written to `where`.
static inline int64_t count_mismatch(const struct bie_tensor * a, const struct bie_tensor * b, char * where, size_t n) {
    int64_t bad = 0;
    int64_t idx[BIE_MAX_DIMS] = {0}, first[BIE_MAX_DIMS] = {0}, last[BIE_MAX_DIMS] = {0};
    double fv[2] = {0, 0}, lv[2] = {0, 0};
    do {
        const double x = bie_load(a, bie_offset(a, idx)), y = bie_load(b, bie_offset(b, idx));
        if (!(x == y || (isnan(x) && isnan(y)))) {
            memcpy(bad ? last : first, idx, sizeof idx);
            double * v = bad ? lv : fv;
            v[0] = x;
            v[1] = y;
            bad++;
        }
    } while (bie_next_index(a, idx));
    char f[192], l[192];
    format_index(f, sizeof f, first, a->ndim);
    format_index(l, sizeof l, last, a->ndim);
    if (bad == 0) snprintf(where, n, "no element differs by value: signed zeros or the bytes between elements");
    else if (bad == 1) snprintf(where, n, "at %s %g vs %g", f, fv[0], fv[1]);
    else snprintf(where, n, "first %s %g vs %g, last %s %g vs %g", f, fv[0], fv[1], l, lv[0], lv[1]);
    return bad;
}
