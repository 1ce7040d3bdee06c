// SPDX-License-Identifier: Apache-2.0
// wq-impl.h: internals of the weight-only n-bit layers (bie.h "weight-only n-bit linear layers").
//
// src/ops/wq.c validates the public arguments once and normalises them into a struct bie_wq_call:
// x / y / grad_y / grad_x are 2-D views [M, K] or [M, N] (leading dims flattened), the weight's
// tensors are dense, and the group layout is resolved on the host (bits and first word row of every
// group). Backends then run without re-validating: the reference (src/ref/ref-wq.c, the
// specification), the CPU kernels (src/cpu/cpu-wq*.c) and CUDA (src/cuda/cuda-wq*.cu). A backend may
// return BIE_DECLINED (CPU -> reference).
#pragma once

#include "bie-impl.h"

struct bie_wq_call {
    int64_t M, K, N, G, rows; // rows of x, features, groups, word rows of qweight
    int32_t bits;             // uniform bits, or 0 (mixed: see group_bits)
    int64_t gs;               // rows per group, min(group_size, K)
    enum bie_wq_zero zero;
    enum bie_wq_act act;
    // Host arrays of G entries: each group's bits and first word row (group_word[G] = rows).
    const int32_t * group_bits;
    const int64_t * group_word;
    // Dense weight tensors (data NULL when absent).
    struct bie_tensor qweight, scales, zeros, perm, channel_scale, bias;
    // 2-D views (data NULL when absent): x, grad_x [M, K]; y, grad_y [M, N]; grad_w [K, N].
    struct bie_tensor x, y, grad_y, grad_x, grad_w;
    enum bie_device_type device_type;
    int32_t device_index;
};

// The code of packed row r, column n (any layout the call describes).
static inline uint32_t bie_wq_code(const struct bie_wq_call * c, const uint32_t * qw, int64_t r, int64_t n) {
    const int64_t g = r / c->gs;
    const int b = c->group_bits[g];
    const int64_t bit = c->bits ? r * b : (c->group_word[g] * 32 + (r - g * c->gs) * b);
    const int64_t w = bit >> 5, sh = bit & 31;
    uint64_t v = qw[w * c->N + n];
    if (sh + b > 32 && w + 1 < c->rows) v |= (uint64_t)qw[(w + 1) * c->N + n] << 32;
    return (uint32_t)(v >> sh) & ((1u << b) - 1u);
}

// W[r, n] of the call's zero form, f32 operations (bie.h): s * (q - z), s * (q - 2^(b-1)), s*q - z.
static inline float bie_wq_weight_value(enum bie_wq_zero zero, int bits, uint32_t q, float s, float z) {
    switch (zero) {
    case BIE_WQ_ZERO_SYM: return s * ((float)q - (float)(1 << (bits - 1)));
    case BIE_WQ_ZERO_CODE: return s * ((float)q - z);
    default: return s * (float)q - z;
    }
}

// Reference (src/ref/ref-wq.c).
enum bie_status bie_ref_wq_forward(bie_context_t * ctx, const struct bie_wq_call * c);
enum bie_status bie_ref_wq_backward(bie_context_t * ctx, const struct bie_wq_call * c);
// w [K, N] view (any float dtype) = W.
enum bie_status bie_ref_wq_dequantize(bie_context_t * ctx, const struct bie_wq_call * c, const struct bie_tensor * w);

// CPU (src/cpu/cpu-wq.c).
enum bie_status bie_cpu_wq_forward(bie_context_t * ctx, const struct bie_wq_call * c);
enum bie_status bie_cpu_wq_backward(bie_context_t * ctx, const struct bie_wq_call * c);
enum bie_status bie_cpu_wq_dequantize(bie_context_t * ctx, const struct bie_wq_call * c, const struct bie_tensor * w);

#ifdef BIE_HAVE_CUDA
// CUDA (src/cuda/cuda-wq*.cu): every case of a valid call (no fallback).
enum bie_status bie_cuda_wq_forward(bie_context_t * ctx, const struct bie_wq_call * c);
enum bie_status bie_cuda_wq_backward(bie_context_t * ctx, const struct bie_wq_call * c);
enum bie_status bie_cuda_wq_dequantize(bie_context_t * ctx, const struct bie_wq_call * c, const struct bie_tensor * w);
#endif
