// SPDX-License-Identifier: Apache-2.0
// pool-ops.c: max, average and adaptive average pooling of the graph model, forward and backward
// (the math is in graph-ops.h). Threads split the (image, channel) planes; a plane is computed by
// one thread in a fixed order, so results do not depend on the thread count.
#include "nn/graph-ops.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

void nn_pool_geometry(struct nn_pool * g) {
    g->oh = (g->h + 2 * (int64_t)g->p - g->k) / g->s + 1;
    g->ow = (g->w + 2 * (int64_t)g->p - g->k) / g->s + 1;
}

// The image taps of output (oy, ox)'s window: rows [y0, y1), columns [x0, x1), and whether the
// window lies inside the image (no clipping).
struct rect {
    int64_t y0, y1, x0, x1;
    bool inside;
};
static inline struct rect window(const struct nn_pool * g, int64_t oy, int64_t ox) {
    const int64_t sy = oy * g->s - g->p, sx = ox * g->s - g->p;
    const struct rect r = {sy < 0 ? 0 : sy, sy + g->k < g->h ? sy + g->k : g->h, sx < 0 ? 0 : sx,
                           sx + g->k < g->w ? sx + g->k : g->w,
                           sy >= 0 && sx >= 0 && sy + g->k <= g->h && sx + g->k <= g->w};
    return r;
}

// The sum of plane xp (w columns) over r's taps, in row order.
static inline double rect_sum(const float * xp, int64_t w, struct rect r) {
    double sum = 0;
    for (int64_t iy = r.y0; iy < r.y1; iy++)
        for (int64_t ix = r.x0; ix < r.x1; ix++) sum += xp[iy * w + ix];
    return sum;
}

// v added to every tap of r in plane gx (w columns).
static inline void rect_add(float * gx, int64_t w, struct rect r, float v) {
    for (int64_t iy = r.y0; iy < r.y1; iy++)
        for (int64_t ix = r.x0; ix < r.x1; ix++) gx[iy * w + ix] += v;
}

static inline int64_t rect_area(struct rect r) { return (r.y1 - r.y0) * (r.x1 - r.x0); }

// Max over output (oy, ox)'s window (value and winner, the first-wins rule with NaN winning).
static inline float window_max(const struct nn_pool * g, const float * xp, int64_t oy, int64_t ox, int64_t * best) {
    const struct rect r = window(g, oy, ox);
    int64_t at = r.y0 * g->w + r.x0;
    float bv = xp[at];
    for (int64_t iy = r.y0; iy < r.y1; iy++)
        for (int64_t ix = r.x0; ix < r.x1; ix++) {
            const float v = xp[iy * g->w + ix];
            if (v > bv || (isnan(v) && !isnan(bv))) {
                bv = v;
                at = iy * g->w + ix;
            }
        }
    *best = at;
    return bv;
}

// One plane of max pooling without winners. K and S are g->k and g->s, passed apart so that the
// callers below can make them constants: the windows that lie inside the image then run as one
// loop over the columns that the compiler vectorizes, with the maximum taken without branches
// ((v > m || v is NaN) gives the value of the first-wins rule: a NaN anywhere gives NaN); the
// border windows go through window_max.
static inline __attribute__((always_inline)) void max_plane(const struct nn_pool * g, const int32_t K, const int32_t S,
                                                            const float * xp, float * yp) {
    const int64_t W = g->w, P = g->p, OW = g->ow;
    // Columns whose windows lie inside the image: ox in [oxa, oxb).
    const int64_t oxa = (P + S - 1) / S, last = W + P - K >= 0 ? (W + P - K) / S + 1 : 0;
    const int64_t oxb = last < OW ? (last > oxa ? last : oxa) : OW;
    for (int64_t oy = 0; oy < g->oh; oy++) {
        const int64_t sy = oy * S - P;
        float * yr = yp + oy * OW;
        int64_t best;
        if (sy < 0 || sy + K > g->h) {
            for (int64_t ox = 0; ox < OW; ox++) yr[ox] = window_max(g, xp, oy, ox, &best);
            continue;
        }
        for (int64_t ox = 0; ox < oxa; ox++) yr[ox] = window_max(g, xp, oy, ox, &best);
        const float * row = xp + sy * W - P;
        for (int64_t ox = oxa; ox < oxb; ox++) {
            const float * t = row + ox * S;
            float m = t[0];
            for (int32_t a = 0; a < K; a++)
                for (int32_t b = 0; b < K; b++) {
                    const float v = t[a * W + b];
                    m = (v > m || v != v) ? v : m;
                }
            yr[ox] = m;
        }
        for (int64_t ox = oxb; ox < OW; ox++) yr[ox] = window_max(g, xp, oy, ox, &best);
    }
}

void nn_maxpool_forward(const struct nn_pool * g, const float * x, float * y, int32_t * argmax) {
    const int64_t planes = g->n * g->c, hw = g->h * g->w, ohw = g->oh * g->ow;
    NN_PARALLEL_FOR(planes * ohw * g->k * g->k, pl, planes, {
        const float * xp = x + pl * hw;
        float * yp = y + pl * ohw;
        if (argmax) { // training: the winners too
            for (int64_t oy = 0; oy < g->oh; oy++)
                for (int64_t ox = 0; ox < g->ow; ox++) {
                    int64_t best;
                    yp[oy * g->ow + ox] = window_max(g, xp, oy, ox, &best);
                    argmax[pl * ohw + oy * g->ow + ox] = (int32_t)best;
                }
        } else if (g->k == 2 && g->s == 2) { // the common windows, with constant loops
            max_plane(g, 2, 2, xp, yp);
        } else if (g->k == 3 && g->s == 2) {
            max_plane(g, 3, 2, xp, yp);
        } else if (g->k == 3 && g->s == 1) {
            max_plane(g, 3, 1, xp, yp);
        } else {
            max_plane(g, g->k, g->s, xp, yp);
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
        for (int64_t oy = 0; oy < g->oh; oy++)
            for (int64_t ox = 0; ox < g->ow; ox++)
                y[pl * ohw + oy * g->ow + ox] = (float)(rect_sum(xp, g->w, window(g, oy, ox)) / div);
    });
}

void nn_avgpool_backward(const struct nn_pool * g, const float * grad_y, float * grad_x) {
    const int64_t planes = g->n * g->c, hw = g->h * g->w, ohw = g->oh * g->ow;
    const float inv = 1.0f / ((float)g->k * (float)g->k);
    NN_PARALLEL_FOR(planes * (hw + ohw * g->k * g->k), pl, planes, {
        float * gx = grad_x + pl * hw;
        memset(gx, 0, sizeof(float) * (size_t)hw);
        for (int64_t oy = 0; oy < g->oh; oy++)
            for (int64_t ox = 0; ox < g->ow; ox++)
                rect_add(gx, g->w, window(g, oy, ox), grad_y[pl * ohw + oy * g->ow + ox] * inv);
    });
}

// The adaptive window of output (oy, ox) of an h x w plane pooled to oh x ow: along each axis,
// output o of `out` over `len` inputs takes [o * len / out, ceil((o + 1) * len / out)).
static inline struct rect adaptive_window(int64_t oy, int64_t ox, int64_t h, int64_t w, int64_t oh, int64_t ow) {
    const struct rect r = {(oy * h) / oh, ((oy + 1) * h + oh - 1) / oh, (ox * w) / ow, ((ox + 1) * w + ow - 1) / ow,
                           true};
    return r;
}

void nn_adaptive_avgpool_forward(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow, const float * x,
                                 float * y) {
    const int64_t planes = n * c;
    NN_PARALLEL_FOR(planes * h * w, pl, planes, {
        const float * xp = x + pl * h * w;
        for (int64_t oy = 0; oy < oh; oy++)
            for (int64_t ox = 0; ox < ow; ox++) {
                const struct rect r = adaptive_window(oy, ox, h, w, oh, ow);
                y[(pl * oh + oy) * ow + ox] = (float)(rect_sum(xp, w, r) / (double)rect_area(r));
            }
    });
}

void nn_adaptive_avgpool_backward(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow,
                                  const float * grad_y, float * grad_x) {
    const int64_t planes = n * c;
    NN_PARALLEL_FOR(planes * h * w, pl, planes, {
        float * gx = grad_x + pl * h * w;
        memset(gx, 0, sizeof(float) * (size_t)(h * w));
        for (int64_t oy = 0; oy < oh; oy++)
            for (int64_t ox = 0; ox < ow; ox++) {
                const struct rect r = adaptive_window(oy, ox, h, w, oh, ow);
                rect_add(gx, w, r, grad_y[(pl * oh + oy) * ow + ox] / (float)rect_area(r));
            }
    });
}
