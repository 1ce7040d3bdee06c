// SPDX-License-Identifier: Apache-2.0
// cpu-pack.c: the public bie_pack / bie_unpack on views with contiguous rows (innermost stride 1,
// rows starting on whole bytes): f32 -> B1 / S4 / I8 with the vectorised sign and quantisation
// helpers, and B1 / S4 / I8 -> f32. Same results as the reference (src/ref/ref-pack.c):
//   B1: bit = (v >= 0);  S4 / I8: clamp(rne(v / scale), lo, hi) (NaN -> lo);  unpack: value * scale.
// Bits and nibbles of a row's last byte that lie past the row are kept. Other views are declined
// (the reference handles them). Also bie_binarize_ste on rows (its comment below).
#include "cpu/cpu-impl.h"

#include <math.h>
#include <omp.h>

// Element offset of the first element of row r (rows: all dims but the last, row-major order).
static void rows_of(const struct bie_tensor * t, int64_t r, int64_t * off) {
    int64_t o = 0;
    for (int32_t i = t->ndim - 2; i >= 0; i--) {
        o += (r % t->shape[i]) * t->stride[i];
        r /= t->shape[i];
    }
    *off = o;
}

// Rows start on whole bytes: every leading stride (of a dim longer than 1) is a multiple of `per`.
static bool byte_rows(const struct bie_tensor * t, int64_t per) {
    if (t->ndim < 1 || t->stride[t->ndim - 1] != 1) return false;
    for (int32_t i = 0; i + 1 < t->ndim; i++)
        if (t->shape[i] > 1 && t->stride[i] % per) return false;
    return true;
}

// The bits (x[i] + b0 >= 0) of a row of n elements into the bytes at d, LSB first; the bits of
// the last byte past the row keep their content.
static void put_sign_bits(const struct cpu_kernels * k, const float * x, float b0, int64_t n, uint8_t * d) {
    const int64_t full = n / 8;
    k->sign_bits(x, NULL, b0, full * 8, d);
    if (n % 8) {
        uint8_t last;
        k->sign_bits(x + full * 8, NULL, b0, n % 8, &last);
        const uint8_t keep = (uint8_t)(0xffu << (n % 8));
        d[full] = (uint8_t)((d[full] & keep) | last);
    }
}

enum bie_status bie_cpu_pack(bie_context_t * ctx, const struct bie_tensor * src, float scale,
                             const struct bie_tensor * dst) {
    if (src->device_type != BIE_DEVICE_CPU || src->dtype != BIE_DTYPE_F32 || src->ndim < 1 ||
        src->stride[src->ndim - 1] != 1)
        return BIE_DECLINED;
    const int64_t per = dst->dtype == BIE_DTYPE_B1 ? 8 : dst->dtype == BIE_DTYPE_S4 ? 2 : 1;
    if (!byte_rows(dst, per)) return BIE_DECLINED;
    const struct cpu_kernels * k = bie_cpu_kernels(ctx->isa);
    const int64_t cols = src->shape[src->ndim - 1], rows = bie_tensor_numel(src) / cols;
    const int threads = cpu_threads(ctx);
    int16_t * tmp = NULL;
    if (dst->dtype != BIE_DTYPE_B1) {
        void * ws;
        const size_t per_thread = cpu_round_up((size_t)cols * sizeof(int16_t), 64);
        enum bie_status st = bie_host_workspace(ctx, per_thread * (size_t)threads, &ws);
        if (st != BIE_STATUS_OK) return st;
        tmp = ws;
    }
    const int lo = dst->dtype == BIE_DTYPE_S4 ? -8 : -128, hi = dst->dtype == BIE_DTYPE_S4 ? 7 : 127;
#pragma omp parallel for num_threads(threads)
    for (int64_t r = 0; r < rows; r++) {
        int64_t so, doff;
        rows_of(src, r, &so);
        rows_of(dst, r, &doff);
        const float * x = (const float *)src->data + so;
        if (dst->dtype == BIE_DTYPE_B1) {
            put_sign_bits(k, x, 0.0f, cols, (uint8_t *)dst->data + doff / 8);
            continue;
        }
        int16_t * q = tmp + (size_t)omp_get_thread_num() * (cpu_round_up((size_t)cols * sizeof(int16_t), 64) / 2);
        k->quantize(x, NULL, 0.0f, cols, scale, lo, hi, q);
        if (dst->dtype == BIE_DTYPE_I8) {
            int8_t * d = (int8_t *)dst->data + doff;
            for (int64_t i = 0; i < cols; i++) d[i] = (int8_t)q[i];
        } else { // S4: element 2i in the high nibble of byte i
            uint8_t * d = (uint8_t *)dst->data + doff / 2;
            for (int64_t i = 0; i < cols / 2; i++) d[i] = (uint8_t)((q[2 * i] & 15) << 4 | (q[2 * i + 1] & 15));
            if (cols % 2) d[cols / 2] = (uint8_t)((q[cols - 1] & 15) << 4 | (d[cols / 2] & 15));
        }
    }
    return BIE_STATUS_OK;
}

enum bie_status bie_cpu_unpack(bie_context_t * ctx, const struct bie_tensor * src, float scale,
                               const struct bie_tensor * dst) {
    if (src->device_type != BIE_DEVICE_CPU || dst->dtype != BIE_DTYPE_F32 || dst->ndim < 1 ||
        dst->stride[dst->ndim - 1] != 1)
        return BIE_DECLINED;
    const int64_t per = src->dtype == BIE_DTYPE_B1 ? 8 : src->dtype == BIE_DTYPE_S4 ? 2 : 1;
    if (!byte_rows(src, per)) return BIE_DECLINED;
    const int64_t cols = src->shape[src->ndim - 1], rows = bie_tensor_numel(src) / cols;
#pragma omp parallel for num_threads(cpu_threads(ctx))
    for (int64_t r = 0; r < rows; r++) {
        int64_t so, doff;
        rows_of(src, r, &so);
        rows_of(dst, r, &doff);
        float * y = (float *)dst->data + doff;
        if (src->dtype == BIE_DTYPE_B1) {
            const uint8_t * s = (const uint8_t *)src->data + so / 8;
            for (int64_t i = 0; i < cols; i++) y[i] = ((s[i / 8] >> (i % 8)) & 1 ? 1.0f : -1.0f) * scale;
        } else if (src->dtype == BIE_DTYPE_S4) {
            const uint8_t * s = (const uint8_t *)src->data + so / 2;
            for (int64_t i = 0; i < cols; i++) {
                const uint8_t byte = s[i / 2];
                y[i] = (float)(i % 2 ? (int8_t)(uint8_t)(byte << 4) >> 4 : (int8_t)byte >> 4) * scale;
            }
        } else {
            const int8_t * s = (const int8_t *)src->data + so;
            for (int64_t i = 0; i < cols; i++) y[i] = (float)s[i] * scale;
        }
    }
    return BIE_STATUS_OK;
}

// bie_binarize_ste on rows of x [M, K] (the call's [M, K, 1, 1] views) into bit rows that start on
// whole bytes (other outputs are declined), with x' = x + bias_a in f32 (a dense f32 row without
// bias_a is read in place; others are converted into a per-thread row first):
//   bits = sign_bits(x')                  (x' >= 0)
//   mask = sign_bits(-|x'|, b0 = scale_a) (scale_a - |x'| >= 0, i.e. |x'| <= scale_a, which for a
//                                          finite scale_a > 0 is |x'/scale_a| <= 1: docs/decisions.md)
static bool bit_rows(const struct bie_tensor * t, int64_t M, int64_t K) {
    return (K == 1 || t->stride[1] == 1) && (M == 1 || t->stride[0] % 8 == 0);
}

enum bie_status bie_cpu_binarize_ste(bie_context_t * ctx, const struct bie_layer_call * c,
                                     const struct bie_ste_out * o) {
    if (c->device_type != BIE_DEVICE_CPU || !c->scales_on_host) return BIE_DECLINED;
    if (o->clamp > 0.0f) return BIE_DECLINED; // (bie_binarize_ste_clamped: the reference)
    const struct bie_tensor *bits = o->bits, *mask = o->mask;
    const int64_t M = c->g.batch, K = c->g.K;
    if ((bits && !bit_rows(bits, M, K)) || (mask && !bit_rows(mask, M, K))) return BIE_DECLINED;
    const struct cpu_kernels * k = bie_cpu_kernels(ctx->isa);
    const int threads = cpu_threads(ctx);
    const int64_t * xs = c->x.stride;
    const bool in_place = c->x.dtype == BIE_DTYPE_F32 && (K == 1 || xs[1] == 1) && !c->bias_a.data;
    const size_t row = cpu_round_up((size_t)K, 16); // floats: bias_a, then per thread x' and -|x'|
    float * ws;
    BIE_TRY(bie_host_workspace(ctx, row * sizeof(float) * (1 + 2 * (size_t)threads), (void **)&ws));
    float * bias = ws;
    cpu_bias_dense(&c->bias_a, K, bias);
#pragma omp parallel for num_threads(threads)
    for (int64_t m = 0; m < M; m++) {
        float *buf = ws + (1 + 2 * (size_t)omp_get_thread_num()) * row, *neg = buf + row;
        const float * xp = in_place ? (const float *)c->x.data + m * xs[0] : buf;
        if (!in_place)
            for (int64_t i = 0; i < K; i++) buf[i] = cpu_load(&c->x, m * xs[0] + i * xs[1]) + bias[i];
        if (bits) put_sign_bits(k, xp, 0.0f, K, (uint8_t *)bits->data + m * bits->stride[0] / 8);
        if (!mask) continue;
        for (int64_t i = 0; i < K; i++) neg[i] = -fabsf(xp[i]);
        put_sign_bits(k, neg, c->scale_a, K, (uint8_t *)mask->data + m * mask->stride[0] / 8);
    }
    return BIE_STATUS_OK;
}
