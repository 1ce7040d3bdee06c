// SPDX-License-Identifier: Apache-2.0
// optim.c: Adam (for float parameters and float latent weights) and Diode (the sign-flip rule for
// int8 latent binary weights, Bitorch Engine's DiodeMix).
#include "bie-impl.h"
#include "nn/nn-kernels.h"

#include <math.h>

void bie_adam_params_default(struct bie_adam_params * p) {
    if (!p) return;
    p->lr = 1e-3f;
    p->beta1 = 0.9f;
    p->beta2 = 0.999f;
    p->eps = 1e-8f;
    p->weight_decay = 0.0f;
    p->clip = 0.0f;
}

enum bie_status bie_nn_adam_step(bie_context_t * ctx, const struct bie_adam_params * a, int64_t step, int64_t count,
                                 float * p, const float * grad, float * m, float * v) {
    BIE_ENTER(ctx);
    if (!a) BIE_FAIL("params: is NULL");
    if (step < 1) BIE_FAIL("step: = %lld must be >= 1", (long long)step);
    if (count < 0 || (count && (!p || !grad || !m || !v))) BIE_FAIL("p, grad, m, v: must not be NULL");
    if (!(a->beta1 >= 0 && a->beta1 < 1 && a->beta2 >= 0 && a->beta2 < 1 && a->eps > 0 && isfinite(a->lr)))
        BIE_FAIL("params: need 0 <= beta1, beta2 < 1, eps > 0 and a finite lr");
    // Bias corrections folded into the step size: lr_t = lr * sqrt(1-b2^t) / (1-b1^t),
    // eps_t = eps * sqrt(1-b2^t) (the same update as dividing m and v by their corrections).
    const double bc1 = 1.0 - pow(a->beta1, (double)step), bc2 = 1.0 - pow(a->beta2, (double)step);
    const float lr_t = (float)(a->lr * sqrt(bc2) / bc1), eps_t = (float)(a->eps * sqrt(bc2));
    const float b1 = a->beta1, b2 = a->beta2, wd = a->lr * a->weight_decay, clip = a->clip;
#pragma omp parallel for schedule(static) num_threads(bie_context_threads(ctx))
    for (int64_t i = 0; i < count; i++) {
        const float g = grad[i];
        m[i] = b1 * m[i] + (1 - b1) * g;
        v[i] = b2 * v[i] + (1 - b2) * g * g;
        float w = p[i] - lr_t * m[i] / (sqrtf(v[i]) + eps_t);
        w -= wd * p[i];
        if (clip > 0) w = fminf(fmaxf(w, -clip), clip);
        p[i] = w;
    }
    return BIE_STATUS_OK;
}

void bie_diode_params_default(struct bie_diode_params * p) {
    if (!p) return;
    p->lr = 1e-3f;
    p->beta1 = 0.99f;
    p->beta2 = 0.9999f;
}

static uint64_t splitmix64(uint64_t * state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

enum bie_status bie_nn_diode_init(bie_context_t * ctx, int64_t count, const int8_t * w, uint64_t seed, float * m,
                                  float * s) {
    BIE_ENTER(ctx);
    if (count < 0 || (count && (!w || !m || !s))) BIE_FAIL("w, m, s: must not be NULL");
    uint64_t st = seed;
    for (int64_t i = 0; i < count; i++) {
        const float u = (float)((splitmix64(&st) >> 40) * 0x1p-24) * 1e-3f;
        m[i] = 0.0f;
        s[i] = w[i] >= 0 ? -u : u;
    }
    return BIE_STATUS_OK;
}

enum bie_status bie_nn_diode_step(bie_context_t * ctx, const struct bie_diode_params * a, int64_t count, int8_t * w,
                                  const float * grad, float * m, float * s, int64_t * flips) {
    BIE_ENTER(ctx);
    if (!a) BIE_FAIL("params: is NULL");
    if (count < 0 || (count && (!w || !grad || !m || !s))) BIE_FAIL("w, grad, m, s: must not be NULL");
    if (!(a->beta1 >= 0 && a->beta1 < 1 && a->beta2 >= 0 && a->beta2 < 1 && isfinite(a->lr)))
        BIE_FAIL("params: need 0 <= beta1, beta2 < 1 and a finite lr");
    const float b1 = a->beta1, b2 = a->beta2, lr = a->lr;
    int64_t flipped = 0;
#pragma omp parallel for schedule(static) num_threads(bie_context_threads(ctx)) reduction(+ : flipped)
    for (int64_t i = 0; i < count; i++) {
        m[i] = b1 * m[i] + (1 - b1) * grad[i];
        const float sm = m[i] > 0 ? 1.0f : m[i] < 0 ? -1.0f : 0.0f; // torch.sign
        s[i] = b2 * s[i] + (1 - b2) * sm * lr;
        const int u = s[i] > 0 ? -1 : 1; // u = -sign(s), and +1 where s = 0
        const int sw = w[i] >= 0 ? 1 : -1;
        if (u != sw) {
            // -(-128) does not fit in int8; latent weights are in [-127, 127] (narrow range).
            w[i] = (int8_t)(w[i] == -128 ? 127 : -w[i]);
            flipped++;
        }
    }
    if (flips) *flips = flipped;
    return BIE_STATUS_OK;
}
