// SPDX-License-Identifier: Apache-2.0
// tensor.c: building and checking tensor views.
#include "bie-impl.h"
#include "core/checked.h"

#include <stdlib.h>
#include <string.h>

static bool mul_ok(int64_t a, int64_t b, int64_t * out) { return bie_mul_i64(a, b, out); }

enum bie_status bie_tensor_make(struct bie_tensor * t, void * data, enum bie_dtype dtype, int32_t ndim,
                                const int64_t * shape) {
    if (!t || (ndim > 0 && !shape)) return BIE_STATUS_INVALID_ARGUMENT;
    if (ndim < 0 || ndim > BIE_MAX_DIMS || !bie_dtype_valid(dtype)) return BIE_STATUS_INVALID_ARGUMENT;
    memset(t, 0, sizeof *t);
    t->data = data;
    t->dtype = dtype;
    t->ndim = ndim;
    t->device_type = BIE_DEVICE_CPU;
    int64_t stride = 1;
    for (int32_t i = ndim - 1; i >= 0; i--) {
        if (shape[i] <= 0) return BIE_STATUS_INVALID_ARGUMENT;
        t->shape[i] = shape[i];
        t->stride[i] = stride;
        int64_t extent = shape[i];
        if (i == ndim - 1) { // pad the innermost rows of sub-byte dtypes to whole bytes
            const int per_byte = 8 / (bie_dtype_bits(dtype) < 8 ? bie_dtype_bits(dtype) : 8);
            if (per_byte > 1 && !bie_round_up_i64(extent, per_byte, &extent)) return BIE_STATUS_INVALID_ARGUMENT;
        }
        if (!mul_ok(stride, extent, &stride)) return BIE_STATUS_INVALID_ARGUMENT;
    }
    return BIE_STATUS_OK;
}

enum bie_status bie_tensor_permute(struct bie_tensor * t, const int32_t * perm) {
    if (!t || (t->ndim > 0 && !perm) || t->ndim < 0 || t->ndim > BIE_MAX_DIMS) return BIE_STATUS_INVALID_ARGUMENT;
    int64_t shape[BIE_MAX_DIMS], stride[BIE_MAX_DIMS];
    bool seen[BIE_MAX_DIMS] = {false};
    for (int32_t i = 0; i < t->ndim; i++) {
        if (perm[i] < 0 || perm[i] >= t->ndim || seen[perm[i]]) return BIE_STATUS_INVALID_ARGUMENT;
        seen[perm[i]] = true;
        shape[i] = t->shape[perm[i]];
        stride[i] = t->stride[perm[i]];
    }
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)t->ndim);
    memcpy(t->stride, stride, sizeof(int64_t) * (size_t)t->ndim);
    return BIE_STATUS_OK;
}

int64_t bie_tensor_numel(const struct bie_tensor * t) {
    if (!t || t->ndim < 0 || t->ndim > BIE_MAX_DIMS) return 0;
    int64_t n;
    return bie_prod_i64(t->shape, t->ndim, &n) ? n : -1;
}

// Largest element offset + 1, or -1 on overflow or a negative shape or stride.
static int64_t span_elements(const struct bie_tensor * t) {
    int64_t last = 0;
    for (int32_t i = 0; i < t->ndim; i++) {
        int64_t step;
        if (t->shape[i] < 1 || t->stride[i] < 0 || !mul_ok(t->shape[i] - 1, t->stride[i], &step) ||
            !bie_add_i64(last, step, &last))
            return -1;
    }
    return bie_add_i64(last, 1, &last) ? last : -1;
}

enum bie_status bie_tensor_nbytes(const struct bie_tensor * t, size_t * out_bytes) {
    if (!t || !out_bytes || t->ndim < 0 || t->ndim > BIE_MAX_DIMS || !bie_dtype_valid(t->dtype))
        return BIE_STATUS_INVALID_ARGUMENT;
    const int64_t span = span_elements(t);
    if (span < 0) return BIE_STATUS_INVALID_ARGUMENT;
    const int bits = bie_dtype_bits(t->dtype);
    int64_t total_bits;
    if (!mul_ok(span, bits, &total_bits) || !bie_add_i64(total_bits, 7, &total_bits) ||
        (uint64_t)(total_bits / 8) > SIZE_MAX)
        return BIE_STATUS_INVALID_ARGUMENT;
    *out_bytes = (size_t)(total_bits / 8);
    return BIE_STATUS_OK;
}

enum bie_status bie_check_tensor(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                                 bool allow_broadcast) {
    if (!t) return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "%s: is NULL", name);
    if (!t->data) return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "%s: data is NULL", name);
    if (!bie_dtype_valid(t->dtype))
        return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "%s: unknown dtype %d", name, (int)t->dtype);
    if (t->ndim < 0 || t->ndim > BIE_MAX_DIMS)
        return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "%s: ndim %d is outside [0, %d]", name, (int)t->ndim,
                             BIE_MAX_DIMS);
    if (t->device_type != BIE_DEVICE_CPU && t->device_type != BIE_DEVICE_CUDA)
        return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "%s: unknown device type %d", name, (int)t->device_type);
    int64_t numel = 1;
    for (int32_t i = 0; i < t->ndim; i++) {
        if (t->shape[i] <= 0)
            return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "%s: shape[%d] = %lld must be positive", name,
                                 (int)i, (long long)t->shape[i]);
        if (t->stride[i] < 0 || (t->stride[i] == 0 && !allow_broadcast && t->shape[i] > 1))
            return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "%s: stride[%d] = %lld must be %s", name, (int)i,
                                 (long long)t->stride[i], allow_broadcast ? ">= 0" : "> 0");
        if (!mul_ok(numel, t->shape[i], &numel))
            return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "%s: element count overflows", name);
    }
    size_t bytes;
    if (bie_tensor_nbytes(t, &bytes) != BIE_STATUS_OK || span_elements(t) > INT64_MAX / 64)
        return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "%s: extent overflows", name);
    return BIE_STATUS_OK;
}

// --- overlap of outputs -------------------------------------------------------------------------

// True when two elements of t may share memory: with its dimensions of size > 1 sorted by stride,
// each stride must exceed the largest offset the smaller ones reach (the usual sufficient test;
// a layout that interleaves dimensions without sharing elements is refused too).
static bool self_overlaps(const struct bie_tensor * t) {
    int64_t st[BIE_MAX_DIMS], sh[BIE_MAX_DIMS];
    int n = 0;
    for (int32_t i = 0; i < t->ndim; i++)
        if (t->shape[i] > 1) {
            int j = n++;
            while (j > 0 && st[j - 1] > t->stride[i]) { // insertion sort by stride
                st[j] = st[j - 1];
                sh[j] = sh[j - 1];
                j--;
            }
            st[j] = t->stride[i];
            sh[j] = t->shape[i];
        }
    int64_t reach = 0; // the largest offset of the dimensions so far
    for (int i = 0; i < n; i++) {
        int64_t step;
        if (st[i] <= reach || !mul_ok(sh[i] - 1, st[i], &step) || !bie_add_i64(reach, step, &reach)) return true;
    }
    return false;
}

// The bytes [*lo, *hi) that t's elements touch (a checked tensor: its span fits).
static void byte_range(const struct bie_tensor * t, uintptr_t * lo, uintptr_t * hi) {
    size_t bytes = 0;
    bie_tensor_nbytes(t, &bytes);
    *lo = (uintptr_t)t->data;
    *hi = *lo + bytes;
}

enum bie_status bie_check_outputs(bie_context_t * ctx, const struct bie_tensor * const * outs,
                                  const char * const * out_names, int n_out, const struct bie_tensor * const * ins,
                                  const char * const * in_names, int n_in) {
    for (int i = 0; i < n_out; i++) {
        if (!outs[i] || !outs[i]->data) continue;
        if (self_overlaps(outs[i]))
            return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT,
                                 "%s: its elements overlap in memory (strides too small for its shape); an output "
                                 "needs a distinct place for every element",
                                 out_names[i]);
        uintptr_t lo, hi;
        byte_range(outs[i], &lo, &hi);
        for (int j = 0; j < n_out + n_in; j++) {
            const bool is_out = j < n_out;
            const struct bie_tensor * o = is_out ? outs[j] : ins[j - n_out];
            if (j == i || !o || !o->data || o->device_type != outs[i]->device_type) continue;
            uintptr_t olo, ohi;
            byte_range(o, &olo, &ohi);
            if (lo < ohi && olo < hi)
                return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT,
                                     "%s: overlaps the memory of %s %s (outputs may not share memory with each other "
                                     "or with an input)",
                                     out_names[i], is_out ? "the output" : "the input",
                                     is_out ? out_names[j] : in_names[j - n_out]);
        }
    }
    return BIE_STATUS_OK;
}
