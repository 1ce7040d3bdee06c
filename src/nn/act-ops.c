// SPDX-License-Identifier: Apache-2.0
// act-ops.c: the element-wise operations of the graph model: activations (with PReLU), residual
// adds and batch norm's inference affine map, forward and backward (the math is in graph-ops.h).
#include "nn/graph-ops.h"

#include <math.h>

#define SQRT_2_OVER_PI 0.7978845608028654
#define INV_SQRT_2PI 0.3989422804014327
#define GELU_C 0.044715f

static inline float act1(enum nn_act act, float v) {
    switch (act) {
    case NN_ACT_RELU: return v > 0 ? v : 0.0f;
    case NN_ACT_SIGN: return v >= 0 ? 1.0f : -1.0f;
    case NN_ACT_HARDTANH: return fminf(fmaxf(v, -1.0f), 1.0f);
    case NN_ACT_TANH: return tanhf(v);
    case NN_ACT_GELU: return 0.5f * v * (1.0f + erff(v * (float)M_SQRT1_2));
    case NN_ACT_GELU_TANH: return 0.5f * v * (1.0f + tanhf((float)SQRT_2_OVER_PI * (v + GELU_C * v * v * v)));
    case NN_ACT_SILU: return v / (1.0f + expf(-v));
    }
    return v;
}

// act'(v), the factor of the gradient.
static inline float dact1(enum nn_act act, float v) {
    switch (act) {
    case NN_ACT_RELU: return v > 0 ? 1.0f : 0.0f;
    case NN_ACT_SIGN:
    case NN_ACT_HARDTANH: return fabsf(v) <= 1.0f ? 1.0f : 0.0f;
    case NN_ACT_TANH: {
        const float t = tanhf(v);
        return 1.0f - t * t;
    }
    case NN_ACT_GELU: return 0.5f * (1.0f + erff(v * (float)M_SQRT1_2)) + v * (float)INV_SQRT_2PI * expf(-0.5f * v * v);
    case NN_ACT_GELU_TANH: {
        const float t = tanhf((float)SQRT_2_OVER_PI * (v + GELU_C * v * v * v));
        return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * (float)SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_C * v * v);
    }
    case NN_ACT_SILU: {
        const float s = 1.0f / (1.0f + expf(-v));
        return s * (1.0f + v * (1.0f - s));
    }
    }
    return 1.0f;
}

void nn_act_forward(enum nn_act act, int64_t count, const float * x, float * y) {
    NN_PARALLEL_FOR(count, i, count, { y[i] = act1(act, x[i]); });
}

void nn_act_backward(enum nn_act act, int64_t count, const float * x, const float * grad_y, float * grad_x) {
    NN_PARALLEL_FOR(count, i, count, { grad_x[i] = grad_y[i] * dact1(act, x[i]); });
}

void nn_prelu_forward(int64_t n, int64_t c, int64_t hw, const float * slope, int64_t n_slope, const float * x,
                      float * y) {
    const int64_t planes = n * c;
    NN_PARALLEL_FOR(planes * hw, pl, planes, {
        const float a = slope[n_slope == 1 ? 0 : pl % c];
        const float * xp = x + pl * hw;
        float * yp = y + pl * hw;
        for (int64_t p = 0; p < hw; p++) yp[p] = xp[p] > 0 ? xp[p] : a * xp[p];
    });
}

void nn_prelu_backward(int64_t n, int64_t c, int64_t hw, const float * slope, int64_t n_slope, const float * x,
                       const float * grad_y, float * grad_x, float * grad_slope) {
    if (grad_x) {
        const int64_t planes = n * c;
        NN_PARALLEL_FOR(planes * hw, pl, planes, {
            const float a = slope[n_slope == 1 ? 0 : pl % c];
            const float *xp = x + pl * hw, *gp = grad_y + pl * hw;
            float * gx = grad_x + pl * hw;
            for (int64_t p = 0; p < hw; p++) gx[p] = xp[p] > 0 ? gp[p] : a * gp[p];
        });
    }
    if (n_slope == 1) { // one sum, in a fixed order
        double s = 0;
        for (int64_t i = 0; i < n * c * hw; i++)
            if (!(x[i] > 0)) s += (double)grad_y[i] * x[i];
        grad_slope[0] = (float)s;
        return;
    }
    NN_PARALLEL_FOR(n * c * hw, j, c, {
        double s = 0;
        for (int64_t i = 0; i < n; i++) {
            const float *xp = x + (i * c + j) * hw, *gp = grad_y + (i * c + j) * hw;
            for (int64_t p = 0; p < hw; p++)
                if (!(xp[p] > 0)) s += (double)gp[p] * xp[p];
        }
        grad_slope[j] = (float)s;
    });
}

void nn_add(int64_t count, const float * a, const float * b, float * y) {
    NN_PARALLEL_FOR(count, i, count, { y[i] = a[i] + b[i]; });
}

void nn_accumulate(int64_t count, const float * x, float * y) {
    NN_PARALLEL_FOR(count, i, count, { y[i] += x[i]; });
}

void nn_channel_affine(int64_t n, int64_t c, int64_t hw, const float * scale, const float * shift, const float * x,
                       float * y) {
    const int64_t planes = n * c;
    NN_PARALLEL_FOR(planes * hw, pl, planes, {
        const float a = scale[pl % c], b = shift[pl % c];
        const float * xp = x + pl * hw;
        float * yp = y + pl * hw;
        for (int64_t p = 0; p < hw; p++) yp[p] = xp[p] * a + b;
    });
}

void nn_batchnorm_affine(int64_t c, const float * gamma, const float * beta, const float * running_mean,
                         const float * running_var, float eps, float * scale, float * shift) {
    for (int64_t j = 0; j < c; j++) {
        const float invstd = (float)(1.0 / sqrt((double)running_var[j] + (double)eps));
        scale[j] = gamma[j] * invstd;
        shift[j] = beta[j] - running_mean[j] * scale[j];
    }
}
