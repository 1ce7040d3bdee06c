// SPDX-License-Identifier: Apache-2.0
// ref-embedding.c: the reference embedding lookup and its sparse backward, the specification of
// bie_embedding_*. Calls arrive validated (src/ops/embedding.c): indices [R, L] (a bag of L per
// output row, or L = 1), table [V, D], scale [V] or absent, out and grad_out [R, D], grad_rows [U, D].
//
// Codes of table entry (r, d) (f32 math):
//   B1: +1 if the bit is set else -1      S4: the nibble's code
//   I8: binary v >= 0 ? +1 : -1; n-bit clamp(v, lo, hi)
//   float: binary v >= 0 ? +1 : -1 (NaN -> -1); n-bit clamp(rne(v / scale[r]), lo, hi) (NaN -> lo)
//   value(r, d) = scale[r] * code (f32 product; scale absent: the code)
// Forward:   out[i, d] = value(indices[i, 0], d)                    (L = 1)
//            out[i, d] = sum over l = 0 .. L-1, in order, of value(indices[i, l], d) in f32   (bag)
//            rounded once to out's dtype.
// Backward:  slot(i, l) = inverse[i, l], or indices[i, l] without an inverse (U = V)
//            grad_rows[u, d] = sum over (i, l) with slot(i, l) = u of grad_out[i, d] * s(i, l)
//            s(i, l) = scale[indices[i, l]] (scale absent: 1); sums in double, rounded once;
//            rows no lookup reaches are 0.
#include "ref/ref-impl.h"

#include <math.h>

static inline int64_t off2(const struct bie_tensor * t, int64_t i, int64_t j) {
    return i * t->stride[0] + j * t->stride[1];
}

static float value(const struct bie_embedding_call * c, int64_t r, int64_t d) {
    const struct bie_tensor * t = &c->table;
    const double v = bie_load(t, off2(t, r, d));
    const float s = c->scale.data ? (float)bie_load(&c->scale, r * c->scale.stride[0]) : 1.0f;
    const int lo = bie_quant_lo(c->quant), hi = bie_quant_hi(c->quant);
    int code;
    if (c->quant == BIE_QUANT_BINARY) code = v >= 0.0 ? 1 : -1; // B1 loads as +-1; NaN -> -1
    else if (bie_dtype_is_float(t->dtype)) code = bie_ref_quantize((float)v, s, lo, hi);
    else code = (int)fmin(fmax(v, lo), hi); // I8 clamped; S4 as it is
    return c->scale.data ? s * (float)code : (float)code;
}

static int64_t load_index(const struct bie_tensor * t, int64_t i, int64_t l) {
    return (int64_t)bie_load(t, off2(t, i, l));
}

enum bie_status bie_ref_embedding_forward(bie_context_t * ctx, const struct bie_embedding_call * c) {
    (void)ctx;
    if (c->device_type != BIE_DEVICE_CPU) return BIE_DECLINED;
    for (int64_t i = 0; i < c->R; i++)
        for (int64_t d = 0; d < c->D; d++) {
            float acc = 0.0f;
            for (int64_t l = 0; l < c->L; l++) {
                const float v = value(c, load_index(&c->indices, i, l), d);
                acc = l == 0 ? v : acc + v;
            }
            bie_store(&c->out, off2(&c->out, i, d), acc);
        }
    return BIE_STATUS_OK;
}

enum bie_status bie_ref_embedding_backward(bie_context_t * ctx, const struct bie_embedding_call * c) {
    if (c->device_type != BIE_DEVICE_CPU) return BIE_DECLINED;
    double * acc;
    size_t bytes;
    if (__builtin_mul_overflow((size_t)(c->U * c->D), sizeof(double), &bytes))
        return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "workspace: grad_rows is too large");
    BIE_TRY(bie_host_workspace(ctx, bytes, (void **)&acc));
    for (int64_t i = 0; i < c->U * c->D; i++) acc[i] = 0.0;
    for (int64_t i = 0; i < c->R; i++)
        for (int64_t l = 0; l < c->L; l++) {
            const int64_t r = load_index(&c->indices, i, l);
            const int64_t u = c->inverse.data ? load_index(&c->inverse, i, l) : r;
            const double s = c->scale.data ? bie_load(&c->scale, r * c->scale.stride[0]) : 1.0;
            for (int64_t d = 0; d < c->D; d++)
                acc[u * c->D + d] += bie_load(&c->grad_out, off2(&c->grad_out, i, d)) * s;
        }
    for (int64_t u = 0; u < c->U; u++)
        for (int64_t d = 0; d < c->D; d++)
            bie_ref_store_rounded(&c->grad_rows, off2(&c->grad_rows, u, d), acc[u * c->D + d]);
    return BIE_STATUS_OK;
}
