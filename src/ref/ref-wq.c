// SPDX-License-Identifier: Apache-2.0
// ref-wq.c: the plain-C reference of the weight-only n-bit linear layer (the specification).
//
//   q(r, n)  = code r of column n's bit stream (wq-impl.h bie_wq_code; layout in bie.h)
//   W[r, n]  = s*(q - z) | s*(q - 2^(b-1)) | s*q - z   (CODE | SYM | OFFSET), f32 operations,
//              s = scales[g, n], z = zeros[g, n], g = r / group_size, b = bits of g
//   x'[m, r] = f32(x[m, perm[r]]) * f32(channel_scale[perm[r]])     (f32 product; absent: x)
//   y[m, n]  = round_to_dtype((float)(sum_r (double)x'[m, r] * W[r, n]) + bias[n])
//   grad_x[m, perm[r]] = round_to_dtype((float)(sum_n (double)grad_y[m, n] * W[r, n]) * channel_scale[perm[r]])
//   grad_w[r, n]       = (float)(sum_m (double)x'[m, r] * grad_y[m, n])
// Sums run in double in index order, so the reference has one rounding per output (plus the f32
// ones written above); faster backends differ by their f32 summation, within the tolerance the
// tests derive from the same terms.
#include "wq-impl.h"

#include <stdlib.h>

static float wvalue(const struct bie_wq_call * c, int64_t r, int64_t n) {
    const int64_t g = r / c->gs;
    const uint32_t q = bie_wq_code(c, c->qweight.data, r, n);
    const float s = (float)bie_load(&c->scales, g * c->N + n);
    const float z = c->zeros.data ? (float)bie_load(&c->zeros, g * c->N + n) : 0.0f;
    return bie_wq_weight_value(c->zero, c->group_bits[g], q, s, z);
}

static int64_t feature(const struct bie_wq_call * c, int64_t r) {
    return c->perm.data ? ((const int32_t *)c->perm.data)[r] : r;
}

static float channel_scale(const struct bie_wq_call * c, int64_t k) {
    return c->channel_scale.data ? (float)bie_load(&c->channel_scale, k) : 1.0f;
}

// W as a dense f32 [K, N] array (malloc'd), or NULL when out of memory.
static float * dense_weight(const struct bie_wq_call * c) {
    float * w = malloc((size_t)(c->K * c->N) * sizeof(float));
    if (!w) return NULL;
    for (int64_t r = 0; r < c->K; r++)
        for (int64_t n = 0; n < c->N; n++) w[r * c->N + n] = wvalue(c, r, n);
    return w;
}

static float xprime(const struct bie_wq_call * c, int64_t m, int64_t r) {
    const int64_t k = feature(c, r);
    const float v = (float)bie_load(&c->x, m * c->x.stride[0] + k * c->x.stride[1]);
    return c->channel_scale.data ? v * channel_scale(c, k) : v;
}

enum bie_status bie_ref_wq_forward(bie_context_t * ctx, const struct bie_wq_call * c) {
    float * w = dense_weight(c);
    if (!w) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "ref: out of memory for the weight");
    for (int64_t m = 0; m < c->M; m++)
        for (int64_t n = 0; n < c->N; n++) {
            double acc = 0.0;
            for (int64_t r = 0; r < c->K; r++) acc += (double)xprime(c, m, r) * w[r * c->N + n];
            float v = (float)acc;
            if (c->bias.data) v += (float)bie_load(&c->bias, n);
            bie_store(&c->y, m * c->y.stride[0] + n * c->y.stride[1], v);
        }
    free(w);
    return BIE_STATUS_OK;
}

enum bie_status bie_ref_wq_backward(bie_context_t * ctx, const struct bie_wq_call * c) {
    const struct bie_tensor * g = &c->grad_y;
    if (c->grad_x.data) {
        float * w = dense_weight(c);
        if (!w) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "ref: out of memory for the weight");
        for (int64_t m = 0; m < c->M; m++)
            for (int64_t r = 0; r < c->K; r++) {
                double acc = 0.0;
                for (int64_t n = 0; n < c->N; n++)
                    acc += (double)(float)bie_load(g, m * g->stride[0] + n * g->stride[1]) * w[r * c->N + n];
                const int64_t k = feature(c, r);
                float v = (float)acc;
                if (c->channel_scale.data) v *= channel_scale(c, k);
                bie_store(&c->grad_x, m * c->grad_x.stride[0] + k * c->grad_x.stride[1], v);
            }
        free(w);
    }
    if (c->grad_w.data)
        for (int64_t r = 0; r < c->K; r++)
            for (int64_t n = 0; n < c->N; n++) {
                double acc = 0.0;
                for (int64_t m = 0; m < c->M; m++)
                    acc += (double)xprime(c, m, r) * (float)bie_load(g, m * g->stride[0] + n * g->stride[1]);
                ((float *)c->grad_w.data)[r * c->N + n] = (float)acc;
            }
    return BIE_STATUS_OK;
}

enum bie_status bie_ref_wq_dequantize(bie_context_t * ctx, const struct bie_wq_call * c, const struct bie_tensor * w) {
    (void)ctx;
    for (int64_t r = 0; r < c->K; r++)
        for (int64_t n = 0; n < c->N; n++) bie_store(w, r * w->stride[0] + n * w->stride[1], wvalue(c, r, n));
    return BIE_STATUS_OK;
}
