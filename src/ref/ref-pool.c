// SPDX-License-Identifier: Apache-2.0
// ref-pool.c: the reference affine max-pool, the specification of bie_affine_maxpool2d_forward and
// _backward.
// A call arrives validated (src/ops/pool.c): x [N, C, H, W], y and out_bits [N, C, OH, OW], mul,
// add and bits_bias [C] f32 or absent. For each channel c, with f32 operations rounded one by one:
//   s               = -1 where mul[c] < 0, else +1
//   m               = s * (the largest (s * f32(x)) + 0 over the window; NaN wins)
//   y[n, c, i, j]   = round_y(clamp((m * mul[c]) + add[c], lo, hi))   (the clamp keeps NaN)
//   bit[n, c, i, j] = f32(y[n, c, i, j]) + bits_bias[c] >= 0           (NaN: 0)
// where the window of (i, j) is h in [i*sh - ph, i*sh - ph + kh), w in [j*sw - pw, j*sw - pw + kw),
// positions inside x only. (+ 0 turns -0 into +0, so that the largest value is one number whatever
// the order; bie.h: this is the pool of the clamped affine map, the map being monotone.)
#include "ref/ref-impl.h"

#include <math.h>

static inline int64_t off4(const struct bie_tensor * t, int64_t a, int64_t b, int64_t c, int64_t d) {
    return a * t->stride[0] + b * t->stride[1] + c * t->stride[2] + d * t->stride[3];
}

// clamp((v * mul[c]) + add[c], lo, hi).
static float affine_clamp(const struct bie_pool_call * p, int64_t c, float v) {
    if (p->mul.data) v = v * ((const float *)p->mul.data)[c * p->mul.stride[0]];
    if (p->add.data) v = v + ((const float *)p->add.data)[c * p->add.stride[0]];
    return v < p->lo ? p->lo : v > p->hi ? p->hi : v;
}

enum bie_status bie_ref_affine_maxpool2d(bie_context_t * ctx, const struct bie_pool_call * p) {
    (void)ctx;
    if (p->device_type != BIE_DEVICE_CPU) return BIE_DECLINED;
    for (int64_t n = 0; n < p->N; n++)
        for (int64_t c = 0; c < p->C; c++)
            for (int64_t i = 0; i < p->OH; i++)
                for (int64_t j = 0; j < p->OW; j++) {
                    const float sg =
                        p->mul.data && ((const float *)p->mul.data)[c * p->mul.stride[0]] < 0.0f ? -1.0f : 1.0f;
                    float m = -INFINITY;
                    int pos = -1; // the window position of m (argmax)
                    for (int64_t h = i * p->sh - p->ph; h < i * p->sh - p->ph + p->kh; h++)
                        for (int64_t w = j * p->sw - p->pw; w < j * p->sw - p->pw + p->kw; w++) {
                            if (h < 0 || h >= p->H || w < 0 || w >= p->W) continue;
                            const float v = sg * (float)bie_load(&p->x, off4(&p->x, n, c, h, w)) + 0.0f;
                            if (pos < 0 || (!isnan(m) && (isnan(v) || v > m))) {
                                m = v;
                                pos = (int)((h - (i * p->sh - p->ph)) * p->kw + (w - (j * p->sw - p->pw)));
                            }
                        }
                    m = sg * m;
                    const int64_t oy = off4(&p->y, n, c, i, j);
                    bie_store(&p->y, oy, affine_clamp(p, c, m));
                    const float v = (float)bie_load(&p->y, oy); // (the stored y)
                    if (p->argmax.data) {
                        const bool stop = (p->lo > -INFINITY && !(v > p->lo)) || (p->hi < INFINITY && !(v < p->hi));
                        bie_store(&p->argmax, off4(&p->argmax, n, c, i, j), stop ? 255 : pos);
                    }
                    if (!p->out_bits.data) continue;
                    const float bb =
                        p->bits_bias.data ? ((const float *)p->bits_bias.data)[c * p->bits_bias.stride[0]] : 0.0f;
                    bie_store(&p->out_bits, off4(&p->out_bits, n, c, i, j), p->bits_bias.data ? v + bb : v);
                }
    return BIE_STATUS_OK;
}

// grad_z[n, c, h, w] = round(sum of f32(grad_y[n, c, i, j]) over the windows (i, j) that hold
// (h, w) and whose argmax names it, i then j increasing) (bie.h: bie_affine_maxpool2d_backward).
// The windows holding row h are i in [ceil((h + ph - kh + 1) / sh), floor((h + ph) / sh)].
enum bie_status bie_ref_affine_maxpool2d_backward(bie_context_t * ctx, const struct bie_pool_call * p) {
    (void)ctx;
    if (p->device_type != BIE_DEVICE_CPU) return BIE_DECLINED;
    for (int64_t n = 0; n < p->N; n++)
        for (int64_t c = 0; c < p->C; c++)
            for (int64_t h = 0; h < p->H; h++)
                for (int64_t w = 0; w < p->W; w++) {
                    const int64_t ti = h + p->ph - p->kh + 1, tj = w + p->pw - p->kw + 1;
                    const int64_t i0 = ti <= 0 ? 0 : (ti + p->sh - 1) / p->sh,
                                  j0 = tj <= 0 ? 0 : (tj + p->sw - 1) / p->sw;
                    const int64_t i1 = (h + p->ph) / p->sh, j1 = (w + p->pw) / p->sw;
                    float s = 0.0f;
                    for (int64_t i = i0; i <= i1 && i < p->OH; i++)
                        for (int64_t j = j0; j <= j1 && j < p->OW; j++) {
                            const int64_t k = (h - (i * p->sh - p->ph)) * p->kw + (w - (j * p->sw - p->pw));
                            if ((int64_t)bie_load(&p->argmax, off4(&p->argmax, n, c, i, j)) == k)
                                s += (float)bie_load(&p->y, off4(&p->y, n, c, i, j));
                        }
                    bie_store(&p->x, off4(&p->x, n, c, h, w), s);
                }
    return BIE_STATUS_OK;
}
