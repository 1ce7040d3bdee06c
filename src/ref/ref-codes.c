// SPDX-License-Identifier: Apache-2.0
// ref-codes.c: what the reference layers share: turning the user's views into dense code arrays
// (one pass of bie_load per element), the tap geometry of a conv patch, and stores that round
// once. The math is written in ref-layer.c.
#include "ref/ref-impl.h"

#include <math.h>
#include <string.h>

int bie_ref_quantize(float v, float scale, int lo, int hi) {
    const float r = bie_rne(v / scale);                // f32 division, round half to even
    return (int)fminf(fmaxf(r, (float)lo), (float)hi); // fmaxf(NaN, lo) = lo
}

// Offset of element (i0, i1, i2, i3) of a 4-D view.
static inline int64_t off4(const struct bie_tensor * t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2] + i3 * t->stride[3];
}

void bie_ref_x_shifted(const struct bie_layer_call * call, float * xp) {
    const struct bie_tensor * x = &call->x;
    const struct bie_geometry * g = &call->g;
    const float t = call->x_clamp;
    int64_t d = 0;
    for (int64_t n = 0; n < g->batch; n++)
        for (int64_t c = 0; c < g->C; c++) {
            const float b = call->bias_a.data ? (float)bie_load(&call->bias_a, c * call->bias_a.stride[0]) : 0.0f;
            for (int64_t h = 0; h < g->H; h++)
                for (int64_t w = 0; w < g->W; w++) {
                    float v = (float)bie_load(x, off4(x, n, c, h, w));
                    if (t > 0.0f) v = bie_clamp_sym(v, t);
                    xp[d++] = v + b;
                }
        }
}

void bie_ref_clamp_gate(const struct bie_layer_call * call) {
    const struct bie_tensor *x = &call->x, *gx = &call->grad_x;
    const struct bie_geometry * gm = &call->g;
    for (int64_t n = 0; n < gm->batch; n++)
        for (int64_t c = 0; c < gm->C; c++)
            for (int64_t h = 0; h < gm->H; h++)
                for (int64_t w = 0; w < gm->W; w++)
                    if (!(fabsf((float)bie_load(x, off4(x, n, c, h, w))) < call->x_clamp))
                        bie_store(gx, off4(gx, n, c, h, w), 0.0);
}

void bie_ref_grad_x_add(const struct bie_layer_call * call) {
    const struct bie_tensor *gx = &call->grad_x, *ad = &call->grad_x_add;
    const struct bie_geometry * gm = &call->g;
    for (int64_t n = 0; n < gm->batch; n++)
        for (int64_t c = 0; c < gm->C; c++)
            for (int64_t h = 0; h < gm->H; h++)
                for (int64_t w = 0; w < gm->W; w++) {
                    const int64_t o = off4(gx, n, c, h, w);
                    bie_store(gx, o, (double)((float)bie_load(gx, o) + (float)bie_load(ad, off4(ad, n, c, h, w))));
                }
}

void bie_ref_bits4(const struct bie_tensor * t, int8_t * out) {
    int64_t d = 0;
    for (int64_t i0 = 0; i0 < t->shape[0]; i0++)
        for (int64_t i1 = 0; i1 < t->shape[1]; i1++)
            for (int64_t i2 = 0; i2 < t->shape[2]; i2++)
                for (int64_t i3 = 0; i3 < t->shape[3]; i3++) out[d++] = (int8_t)bie_load(t, off4(t, i0, i1, i2, i3));
}

void bie_ref_x_codes(const struct bie_layer_call * call, const float * xp, int8_t * a) {
    const struct bie_geometry * g = &call->g;
    const int64_t numel = g->batch * g->C * g->H * g->W;
    if (!xp) { // B1 input: the bits are the codes
        bie_ref_bits4(&call->x, a);
        return;
    }
    if (call->quant == BIE_QUANT_BINARY) {
        for (int64_t i = 0; i < numel; i++) a[i] = xp[i] >= 0.0f ? 1 : -1; // NaN -> -1
        return;
    }
    const int lo = bie_quant_lo(call->quant), hi = bie_quant_hi(call->quant);
    for (int64_t i = 0; i < numel; i++) a[i] = (int8_t)bie_ref_quantize(xp[i], call->scale_a, lo, hi);
}

void bie_ref_w_codes(const struct bie_layer_call * call, int8_t * wc) {
    const struct bie_tensor * wt = &call->weight;
    const struct bie_geometry * g = &call->g;
    const bool binary = call->quant == BIE_QUANT_BINARY;
    const int lo = bie_quant_lo(call->quant), hi = bie_quant_hi(call->quant);
    int64_t d = 0;
    for (int64_t o = 0; o < g->O; o++)
        for (int64_t c = 0; c < g->C; c++)
            for (int64_t i = 0; i < g->kh; i++)
                for (int64_t j = 0; j < g->kw; j++) {
                    const double v = bie_load(wt, off4(wt, o, c, i, j));
                    int code;
                    if (binary) code = v >= 0.0 ? 1 : -1; // float: sign (NaN -> -1); I8: v >= 0; B1: the bit
                    else if (bie_dtype_is_float(wt->dtype)) code = bie_ref_quantize((float)v, call->scale_w, lo, hi);
                    else code = (int)fmin(fmax(v, lo), hi); // I8 codes clamped; S4 codes as they are
                    wc[d++] = (int8_t)code;
                }
}

void bie_ref_patch(const struct bie_geometry * g, const int8_t * a, int64_t n, int64_t oh, int64_t ow, int64_t * idx,
                   int8_t * val) {
    const int8_t pad = g->pad_value == BIE_PAD_MINUS_ONE ? -1 : g->pad_value == BIE_PAD_PLUS_ONE ? 1 : 0;
    int64_t k = 0;
    for (int64_t c = 0; c < g->C; c++)
        for (int64_t i = 0; i < g->kh; i++) {
            const int64_t h = oh * g->sh - g->ph + i * g->dh;
            for (int64_t j = 0; j < g->kw; j++, k++) {
                const int64_t w = ow * g->sw - g->pw + j * g->dw;
                if (h < 0 || h >= g->H || w < 0 || w >= g->W) {
                    idx[k] = -1;
                    val[k] = pad;
                } else {
                    idx[k] = ((n * g->C + c) * g->H + h) * g->W + w;
                    val[k] = a[idx[k]];
                }
            }
        }
}

void bie_ref_load4(const struct bie_tensor * t, double * dense) {
    int64_t d = 0;
    for (int64_t i0 = 0; i0 < t->shape[0]; i0++)
        for (int64_t i1 = 0; i1 < t->shape[1]; i1++)
            for (int64_t i2 = 0; i2 < t->shape[2]; i2++)
                for (int64_t i3 = 0; i3 < t->shape[3]; i3++) dense[d++] = bie_load(t, off4(t, i0, i1, i2, i3));
}

void bie_ref_store4(const struct bie_tensor * t, const double * dense) {
    int64_t d = 0;
    for (int64_t i0 = 0; i0 < t->shape[0]; i0++)
        for (int64_t i1 = 0; i1 < t->shape[1]; i1++)
            for (int64_t i2 = 0; i2 < t->shape[2]; i2++)
                for (int64_t i3 = 0; i3 < t->shape[3]; i3++)
                    bie_ref_store_rounded(t, off4(t, i0, i1, i2, i3), dense[d++]);
}

// Round to odd from double to f32: the truncated f32 value with its last bit forced to 1 when the
// conversion is inexact. A round-to-odd value with at least two more bits than the final format
// rounds (RNE) to that format exactly as v itself would (f32 keeps 13 more bits than f16 and 16
// more than bf16, and covers both exponent ranges).
static float round_to_odd_f32(double v) {
    float f = (float)v;
    if ((double)f == v || isnan(v)) return f;
    if (fabs((double)f) > fabs(v)) f = nextafterf(f, 0.0f); // truncate toward zero
    uint32_t u;
    memcpy(&u, &f, 4);
    u |= 1u;
    memcpy(&f, &u, 4);
    return f;
}

void bie_ref_store_rounded(const struct bie_tensor * t, int64_t off, double v) {
    if (t->dtype == BIE_DTYPE_F16 || t->dtype == BIE_DTYPE_BF16) v = round_to_odd_f32(v);
    bie_store(t, off, v);
}

size_t bie_ref_arena_take(struct bie_ref_arena * a, size_t count, size_t elem_size) {
    size_t bytes, off = a->size;
    if (__builtin_mul_overflow(count, elem_size, &bytes) || __builtin_add_overflow(bytes, (size_t)63, &bytes) ||
        __builtin_add_overflow(a->size, bytes & ~(size_t)63, &a->size))
        a->overflow = true;
    return off;
}
