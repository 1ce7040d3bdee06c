// SPDX-License-Identifier: Apache-2.0
// ref-pack.c: reference packing, unpacking and reductions, element by element on any view.
//   pack   B1: bit = (v >= 0);  S4: q = clamp(rne(v / scale), -8, 7);  I8: clamp(rne(v / scale), -128, 127)
//          (an i8 source is clamped as it is, without scale)
//   unpack dst = value * scale, value = +-1 (B1) or the integer code (S4, I8)
//   binarize_ste (x [M, K]): x' = f32(x) + f32(bias_a[k]);
//          bits = (x' >= 0);  mask = (|x' / scale_a| <= 1), f32 division;  NaN -> 0 in both
//          clamped (t > 0): x' = clamp(f32(x), -t, t) + f32(bias_a[k]) (NaN stays NaN), and
//          clamp_mask = (|f32(x)| < t), NaN -> 0
#include "ref/ref-impl.h"

#include <math.h>

static double quantize(double v, float scale, int lo, int hi, bool integer_src) {
    const float r = integer_src ? (float)v : bie_rne((float)v / scale);
    return fmin(fmax(r, lo), hi); // NaN becomes lo (fmax ignores NaN)
}

enum bie_status bie_ref_pack(bie_context_t * ctx, const struct bie_tensor * src, float scale,
                             const struct bie_tensor * dst) {
    (void)ctx;
    const bool int_src = src->dtype == BIE_DTYPE_I8;
    int64_t idx[BIE_MAX_DIMS] = {0};
    do {
        const double v = bie_load(src, bie_offset(src, idx));
        double q;
        switch (dst->dtype) {
        case BIE_DTYPE_B1: q = v >= 0 ? 1 : -1; break;
        case BIE_DTYPE_S4: q = quantize(v, scale, -8, 7, int_src); break;
        default: q = quantize(v, scale, -128, 127, int_src); break;
        }
        bie_store(dst, bie_offset(dst, idx), q);
    } while (bie_next_index(src, idx));
    return BIE_STATUS_OK;
}

enum bie_status bie_ref_unpack(bie_context_t * ctx, const struct bie_tensor * src, float scale,
                               const struct bie_tensor * dst) {
    (void)ctx;
    int64_t idx[BIE_MAX_DIMS] = {0};
    do {
        const double v = bie_load(src, bie_offset(src, idx));
        bie_store(dst, bie_offset(dst, idx), dst->dtype == BIE_DTYPE_I8 ? v : (double)((float)v * scale));
    } while (bie_next_index(src, idx));
    return BIE_STATUS_OK;
}

enum bie_status bie_ref_reduce(bie_context_t * ctx, const struct bie_tensor * x, double * sum_abs, double * sum) {
    (void)ctx;
    double sa = 0.0, s = 0.0;
    int64_t idx[BIE_MAX_DIMS] = {0};
    do {
        const double v = bie_load(x, bie_offset(x, idx));
        sa += fabs(v);
        s += v;
    } while (bie_next_index(x, idx));
    *sum_abs = sa;
    *sum = s;
    return BIE_STATUS_OK;
}

enum bie_status bie_ref_binarize_ste(bie_context_t * ctx, const struct bie_layer_call * call,
                                     const struct bie_ste_out * o) {
    (void)ctx;
    if (call->device_type != BIE_DEVICE_CPU) return BIE_DECLINED;
    const int64_t M = call->g.batch, K = call->g.K;
    const struct bie_tensor *bits = o->bits, *mask = o->mask, *cmask = o->clamp_mask, *x = &call->x;
    const float t = o->clamp;
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) {
            const float a = (float)bie_load(x, m * x->stride[0] + k * x->stride[1]);
            const float b = call->bias_a.data ? (float)bie_load(&call->bias_a, k * call->bias_a.stride[0]) : 0.0f;
            const float v = (t > 0.0f ? bie_clamp_sym(a, t) : a) + b; // x' (of the clamped x)
            if (cmask) bie_store(cmask, m * cmask->stride[0] + k * cmask->stride[1], fabsf(a) < t ? 1 : -1);
            if (bits) bie_store(bits, m * bits->stride[0] + k * bits->stride[1], v >= 0.0f ? 1 : -1);
            if (mask)
                bie_store(mask, m * mask->stride[0] + k * mask->stride[1],
                          bie_ref_ste_passes(v, call->scale_a) ? 1 : -1);
        }
    return BIE_STATUS_OK;
}
