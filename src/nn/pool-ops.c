// SPDX-License-Identifier: Apache-2.0
// pool-ops.c: max, average and adaptive average pooling of the graph model, forward and backward
// (the math is in graph-ops.h). Threads split the (image, channel) planes; a plane is computed by
// one thread in a fixed order, so results do not depend on the thread count.
#include "nn/graph-ops.h"

#include <math.h>
#include <string.h>

void nn_pool_geometry(struct nn_pool * g) {
    g->oh = (g->h + 2 * (int64_t)g->p - g->k) / g->s + 1;
    g->ow = (g->w + 2 * (int64_t)g->p - g->k) / g->s + 1;
}

// The image taps of output (oy, ox)'s window: rows [y0, y1), columns [x0, x1).
struct rect {
    int64_t y0, y1, x0, x1;
};
static inline struct rect window(const struct nn_pool * g, int64_t o) {
    const int64_t sy = (o / g->ow) * g->s - g->p, sx = (o % g->ow) * g->s - g->p;
    const struct rect r = {sy < 0 ? 0 : sy, sy + g->k < g->h ? sy + g->k : g->h, sx < 0 ? 0 : sx,
                           sx + g->k < g->w ? sx + g->k : g->w};
    return r;
}

void nn_maxpool_forward(const struct nn_pool * g, const float * x, float * y, int32_t * argmax) {
    const int64_t planes = g->n * g->c, hw = g->h * g->w, ohw = g->oh * g->ow;
    NN_PARALLEL_FOR(planes * ohw * g->k * g->k, pl, planes, {
        const float * xp = x + pl * hw;
        for (int64_t o = 0; o < ohw; o++) {
            const struct rect r = window(g, o);
            int64_t best = r.y0 * g->w + r.x0;
            float bv = xp[best];
            for (int64_t iy = r.y0; iy < r.y1; iy++)
                for (int64_t ix = r.x0; ix < r.x1; ix++) {
                    const float v = xp[iy * g->w + ix];
                    if (v > bv || (isnan(v) && !isnan(bv))) {
                        bv = v;
                        best = iy * g->w + ix;
                    }
                }
            y[pl * ohw + o] = bv;
            if (argmax) argmax[pl * ohw + o] = (int32_t)best;
        }
    });
}

void nn_maxpool_backward(const struct nn_pool * g, const float * grad_y, const int32_t * argmax, float * grad_x) {
    const int64_t planes = g->n * g->c, hw = g->h * g->w, ohw = g->oh * g->ow;
    NN_PARALLEL_FOR(planes * (hw + ohw), pl, planes, {
        float * gx = grad_x + pl * hw;
        memset(gx, 0, sizeof(float) * (size_t)hw);
        for (int64_t o = pl * ohw; o < (pl + 1) * ohw; o++) gx[argmax[o]] += grad_y[o];
    });
}

void nn_avgpool_forward(const struct nn_pool * g, const float * x, float * y) {
    const int64_t planes = g->n * g->c, hw = g->h * g->w, ohw = g->oh * g->ow;
    const double div = (double)g->k * g->k;
    NN_PARALLEL_FOR(planes * ohw * g->k * g->k, pl, planes, {
        const float * xp = x + pl * hw;
        for (int64_t o = 0; o < ohw; o++) {
            const struct rect r = window(g, o);
            double sum = 0;
            for (int64_t iy = r.y0; iy < r.y1; iy++)
                for (int64_t ix = r.x0; ix < r.x1; ix++) sum += xp[iy * g->w + ix];
            y[pl * ohw + o] = (float)(sum / div);
        }
    });
}

void nn_avgpool_backward(const struct nn_pool * g, const float * grad_y, float * grad_x) {
    const int64_t planes = g->n * g->c, hw = g->h * g->w, ohw = g->oh * g->ow;
    const float inv = 1.0f / ((float)g->k * (float)g->k);
    NN_PARALLEL_FOR(planes * (hw + ohw * g->k * g->k), pl, planes, {
        float * gx = grad_x + pl * hw;
        memset(gx, 0, sizeof(float) * (size_t)hw);
        for (int64_t o = 0; o < ohw; o++) {
            const struct rect r = window(g, o);
            const float v = grad_y[pl * ohw + o] * inv;
            for (int64_t iy = r.y0; iy < r.y1; iy++)
                for (int64_t ix = r.x0; ix < r.x1; ix++) gx[iy * g->w + ix] += v;
        }
    });
}

// Adaptive window of output o over an axis of len inputs and out outputs: [lo, hi).
static inline void adaptive_window(int64_t o, int64_t len, int64_t out, int64_t * lo, int64_t * hi) {
    *lo = (o * len) / out;
    *hi = ((o + 1) * len + out - 1) / out;
}

void nn_adaptive_avgpool_forward(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow,
                                 const float * x, float * y) {
    const int64_t planes = n * c;
    NN_PARALLEL_FOR(planes * h * w, pl, planes, {
        const float * xp = x + pl * h * w;
        for (int64_t oy = 0; oy < oh; oy++) {
            int64_t y0, y1;
            adaptive_window(oy, h, oh, &y0, &y1);
            for (int64_t ox = 0; ox < ow; ox++) {
                int64_t x0, x1;
                adaptive_window(ox, w, ow, &x0, &x1);
                double sum = 0;
                for (int64_t iy = y0; iy < y1; iy++)
                    for (int64_t ix = x0; ix < x1; ix++) sum += xp[iy * w + ix];
                y[(pl * oh + oy) * ow + ox] = (float)(sum / (double)((y1 - y0) * (x1 - x0)));
            }
        }
    });
}

void nn_adaptive_avgpool_backward(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow,
                                  const float * grad_y, float * grad_x) {
    const int64_t planes = n * c;
    NN_PARALLEL_FOR(planes * h * w, pl, planes, {
        float * gx = grad_x + pl * h * w;
        memset(gx, 0, sizeof(float) * (size_t)(h * w));
        for (int64_t oy = 0; oy < oh; oy++) {
            int64_t y0, y1;
            adaptive_window(oy, h, oh, &y0, &y1);
            for (int64_t ox = 0; ox < ow; ox++) {
                int64_t x0, x1;
                adaptive_window(ox, w, ow, &x0, &x1);
                const float v = grad_y[(pl * oh + oy) * ow + ox] / (float)((y1 - y0) * (x1 - x0));
                for (int64_t iy = y0; iy < y1; iy++)
                    for (int64_t ix = x0; ix < x1; ix++) gx[iy * w + ix] += v;
            }
        }
    });
}
