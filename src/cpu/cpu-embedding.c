// SPDX-License-Identifier: Apache-2.0
// cpu-embedding.c: the embedding lookup and its sparse backward on the CPU backend (the math is
// ref-embedding.c's). Forward: output rows on OpenMP threads; each row's table row is decoded into
// f32 values a byte at a time where its codes are contiguous (8 bits, 2 nibbles or 1 code per
// byte), added in index order for a bag, and stored once in out's dtype: the same numbers as the
// reference, to the bit. Backward: the columns of grad_rows split over threads, each adding every
// lookup's grad_out * scale into an f32 buffer in index order (deterministic whatever the thread
// count), then one rounding to grad_rows' dtype.
#include "cpu/cpu-impl.h"

#include <omp.h>
#include <pthread.h>

static inline int64_t index_at(const struct bie_tensor * t, int64_t i, int64_t l) {
    const int64_t off = i * t->stride[0] + l * t->stride[1];
    return t->dtype == BIE_DTYPE_I64 ? ((const int64_t *)t->data)[off] : ((const int32_t *)t->data)[off];
}

static inline float scale_of(const struct bie_embedding_call * c, int64_t r) {
    return c->scale.data ? cpu_load(&c->scale, r * c->scale.stride[0]) : 1.0f;
}

// sign_patterns[b][j] = +1 if bit j of b is set, else -1 (filled once).
static float sign_patterns[256][8];
static void fill_sign_patterns(void) {
    for (int b = 0; b < 256; b++)
        for (int j = 0; j < 8; j++) sign_patterns[b][j] = (b >> j) & 1 ? 1.0f : -1.0f;
}

// dst[d] = value(r, d) for d < D (ref-embedding.c).
static void decode_row(const struct bie_embedding_call * c, int64_t r, float * dst) {
    const struct bie_tensor * t = &c->table;
    const bool has_scale = c->scale.data != NULL;
    const float s = scale_of(c, r);
    const int64_t D = c->D, base = r * t->stride[0];
    const int lo = bie_quant_lo(c->quant), hi = bie_quant_hi(c->quant);
    const bool dense = D == 1 || t->stride[1] == 1;
    const float m = has_scale ? s : 1.0f; // (m * code without a scale is the code itself, exactly)
    if (t->dtype == BIE_DTYPE_B1 && dense && base % 8 == 0) {
        // a byte's 8 codes from a table of +-1 patterns, times the scale (exact: s * +-1 = +-s)
        const uint8_t * p = (const uint8_t *)t->data + base / 8;
        int64_t d = 0;
        for (; d + 8 <= D; d += 8) {
            const float * pat = sign_patterns[p[d >> 3]];
            for (int j = 0; j < 8; j++) dst[d + j] = pat[j] * m;
        }
        for (; d < D; d++) dst[d] = ((p[d >> 3] >> (d & 7)) & 1 ? 1.0f : -1.0f) * m;
        return;
    }
    if (t->dtype == BIE_DTYPE_S4 && dense && base % 2 == 0) { // (4-bit codes: no clamp needed)
        const uint8_t * p = (const uint8_t *)t->data + base / 2;
        int64_t d = 0;
        for (; d + 2 <= D; d += 2) { // high nibble first; (v ^ 8) - 8 sign-extends a nibble
            const int b = p[d >> 1];
            dst[d] = m * (float)(((b >> 4) ^ 8) - 8);
            dst[d + 1] = m * (float)(((b & 15) ^ 8) - 8);
        }
        if (d < D) dst[d] = m * (float)(((p[d >> 1] >> 4) ^ 8) - 8);
        return;
    }
    if (t->dtype == BIE_DTYPE_I8 && dense) {
        const int8_t * p = (const int8_t *)t->data + base;
        if (c->quant == BIE_QUANT_BINARY) {
            for (int64_t d = 0; d < D; d++) dst[d] = m * (p[d] >= 0 ? 1.0f : -1.0f);
        } else {
            for (int64_t d = 0; d < D; d++) {
                const int v = p[d], code = v < lo ? lo : v > hi ? hi : v;
                dst[d] = m * (float)code;
            }
        }
        return;
    }
    if (t->dtype == BIE_DTYPE_F32 && dense) {
        const float * p = (const float *)t->data + base;
        for (int64_t d = 0; d < D; d++) {
            const int code = c->quant == BIE_QUANT_BINARY ? (p[d] >= 0.0f ? 1 : -1) : cpu_quantize1(p[d], s, lo, hi);
            dst[d] = has_scale ? s * (float)code : (float)code;
        }
        return;
    }
    for (int64_t d = 0; d < D; d++) { // any other view: element by element
        const float v = cpu_load(t, base + d * t->stride[1]);
        int code;
        if (c->quant == BIE_QUANT_BINARY) code = v >= 0.0f ? 1 : -1; // (B1 loads as +-1)
        else if (bie_dtype_is_float(t->dtype)) code = cpu_quantize1(v, s, lo, hi);
        else code = v < (float)lo ? lo : v > (float)hi ? hi : (int)v;
        dst[d] = has_scale ? s * (float)code : (float)code;
    }
}

// Writes n f32 values to a float view from element offset off, elements `stride` apart.
static void store_row(const struct bie_tensor * t, int64_t off, int64_t stride, const float * v, int64_t n) {
    if (t->dtype == BIE_DTYPE_F32) {
        float * p = (float *)t->data + off;
        for (int64_t d = 0; d < n; d++) p[d * stride] = v[d];
    } else {
        uint16_t * p = (uint16_t *)t->data + off;
        const bool h = t->dtype == BIE_DTYPE_F16;
        for (int64_t d = 0; d < n; d++) p[d * stride] = h ? bie_f32_to_f16(v[d]) : bie_f32_to_bf16(v[d]);
    }
}

enum bie_status bie_cpu_embedding_forward(bie_context_t * ctx, const struct bie_embedding_call * c) {
    if (c->device_type != BIE_DEVICE_CPU) return BIE_DECLINED;
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fill_sign_patterns);
    const int threads = cpu_threads(ctx);
    const size_t row = cpu_arena_size((size_t)c->D * sizeof(float));
    uint8_t * ws;
    BIE_TRY(bie_host_workspace(ctx, 2 * row * (size_t)threads, (void **)&ws));
    // a lookup into dense f32 rows is decoded in place
    const bool direct = !c->bag && c->out.dtype == BIE_DTYPE_F32 && (c->D == 1 || c->out.stride[1] == 1);
    if (direct) {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t i = 0; i < c->R; i++)
            decode_row(c, index_at(&c->indices, i, 0), (float *)c->out.data + i * c->out.stride[0]);
        return BIE_STATUS_OK;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < c->R; i++) {
        float *v = (float *)(ws + 2 * row * (size_t)omp_get_thread_num()), *acc = (float *)((uint8_t *)v + row);
        for (int64_t l = 0; l < c->L; l++) {
            decode_row(c, index_at(&c->indices, i, l), l == 0 ? acc : v);
            if (l > 0)
                for (int64_t d = 0; d < c->D; d++) acc[d] += v[d];
        }
        store_row(&c->out, i * c->out.stride[0], c->out.stride[1], acc, c->D);
    }
    return BIE_STATUS_OK;
}

enum bie_status bie_cpu_embedding_backward(bie_context_t * ctx, const struct bie_embedding_call * c) {
    if (c->device_type != BIE_DEVICE_CPU) return BIE_DECLINED;
    const int threads = cpu_threads(ctx);
    size_t bytes;
    if (__builtin_mul_overflow((size_t)c->U * (size_t)c->D, sizeof(float), &bytes))
        return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "workspace: grad_rows is too large");
    float * acc;
    BIE_TRY(bie_host_workspace(ctx, bytes, (void **)&acc));
    const int64_t chunk = 64; // columns per task
    const int64_t tasks = (c->D + chunk - 1) / chunk;
    const struct bie_tensor * g = &c->grad_out;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t d0 = t * chunk, d1 = d0 + chunk < c->D ? d0 + chunk : c->D;
        for (int64_t u = 0; u < c->U; u++)
            for (int64_t d = d0; d < d1; d++) acc[u * c->D + d] = 0.0f;
        for (int64_t i = 0; i < c->R; i++)
            for (int64_t l = 0; l < c->L; l++) {
                const int64_t r = index_at(&c->indices, i, l);
                const int64_t u = c->inverse.data ? index_at(&c->inverse, i, l) : r;
                const float s = scale_of(c, r);
                float * a = acc + u * c->D;
                const int64_t go = i * g->stride[0];
                if (g->dtype == BIE_DTYPE_F32)
                    for (int64_t d = d0; d < d1; d++) a[d] += ((const float *)g->data)[go + d * g->stride[1]] * s;
                else
                    for (int64_t d = d0; d < d1; d++) a[d] += cpu_load(g, go + d * g->stride[1]) * s;
            }
        for (int64_t u = 0; u < c->U; u++)
            store_row(&c->grad_rows, u * c->grad_rows.stride[0] + d0 * c->grad_rows.stride[1], c->grad_rows.stride[1],
                      acc + u * c->D + d0, d1 - d0);
    }
    return BIE_STATUS_OK;
}
