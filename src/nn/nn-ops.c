// SPDX-License-Identifier: Apache-2.0
// nn-ops.c: the float building blocks between low-bit layers: batch norm, max-pooling,
// activations and softmax cross-entropy, on dense f32 CPU arrays. Every reduction runs in a fixed
// order inside one thread (threads split channels or rows), so results do not depend on the
// thread count.
#include "bie-impl.h"
#include "nn/nn-kernels.h"
#include "core/checked.h"

#include <float.h>
#include <math.h>
#include <string.h>

// Batch norm, per channel j over the m = n*hw values x[i, j, p]:
//   training: mean = sum x / m, var = sum (x - mean)^2 / m (in double);
//             running_mean += momentum*(mean - running_mean);
//             running_var  += momentum*(var*m/(m-1) - running_var)
//   y = (x - mean) / sqrt(var + eps) * gamma + beta  (+ residual, when not NULL), computed as
//   x * a + b with a = gamma * invstd, b = beta - mean * a (f32)
enum bie_status bie_nn_batchnorm_forward(bie_context_t * ctx, int64_t n, int64_t c, int64_t hw, const float * x,
                                         const float * gamma, const float * beta, float * running_mean,
                                         float * running_var, float momentum, float eps, int training,
                                         float * saved_mean, float * saved_invstd, const float * residual, float * y) {
    BIE_ENTER(ctx);
    if (n <= 0 || c <= 0 || hw <= 0)
        BIE_FAIL("n, c, hw: must be > 0 (got %lld, %lld, %lld)", (long long)n, (long long)c, (long long)hw);
    if (!x || !gamma || !beta || !running_mean || !running_var || (!y && !training))
        BIE_FAIL("x, gamma, beta, running stats, y: must not be NULL (y may be in training)");
    if (training && (!saved_mean || !saved_invstd)) BIE_FAIL("saved_mean, saved_invstd: needed in training");
    if (!(eps > 0)) BIE_FAIL("eps: must be > 0");
    int64_t m, elements;
    if (!bie_mul_i64(n, hw, &m) || !bie_mul_i64(m, c, &elements)) BIE_FAIL("n, c, hw: n*c*hw overflows int64");
#pragma omp parallel for schedule(static) num_threads(bie_context_threads(ctx))
    for (int64_t j = 0; j < c; j++) {
        double mean, var;
        if (training) {
            double s = 0;
            for (int64_t i = 0; i < n; i++) {
                const float * xp = x + (i * c + j) * hw;
                for (int64_t p = 0; p < hw; p++) s += xp[p];
            }
            mean = s / (double)m;
            double q = 0;
            for (int64_t i = 0; i < n; i++) {
                const float * xp = x + (i * c + j) * hw;
                for (int64_t p = 0; p < hw; p++) {
                    const double d = xp[p] - mean;
                    q += d * d;
                }
            }
            var = q / (double)m;
            running_mean[j] += momentum * ((float)mean - running_mean[j]);
            const double unbiased = m > 1 ? var * (double)m / (double)(m - 1) : var;
            running_var[j] += momentum * ((float)unbiased - running_var[j]);
        } else {
            mean = running_mean[j];
            var = running_var[j];
        }
        const float invstd = (float)(1.0 / sqrt(var + (double)eps));
        if (training) {
            saved_mean[j] = (float)mean;
            saved_invstd[j] = invstd;
        }
        const float a = gamma[j] * invstd, b = beta[j] - (float)mean * a;
        for (int64_t i = 0; y && i < n; i++) {
            const float * xp = x + (i * c + j) * hw;
            float * yp = y + (i * c + j) * hw;
            if (residual) {
                const float * rp = residual + (i * c + j) * hw;
                for (int64_t p = 0; p < hw; p++) yp[p] = (xp[p] * a + b) + rp[p];
            } else
                for (int64_t p = 0; p < hw; p++) yp[p] = xp[p] * a + b;
        }
    }
    return BIE_STATUS_OK;
}

enum bie_status bie_nn_batchnorm_backward(bie_context_t * ctx, int64_t n, int64_t c, int64_t hw, const float * x,
                                          const float * gamma, const float * saved_mean, const float * saved_invstd,
                                          const float * grad_y, float * grad_x, float * grad_gamma, float * grad_beta) {
    BIE_ENTER(ctx);
    if (n <= 0 || c <= 0 || hw <= 0) BIE_FAIL("n, c, hw: must be > 0");
    if (!x || !gamma || !saved_mean || !saved_invstd || !grad_y || !grad_gamma || !grad_beta)
        BIE_FAIL("x, gamma, saved statistics, grad_y, grad_gamma, grad_beta: must not be NULL");
    int64_t m, elements;
    if (!bie_mul_i64(n, hw, &m) || !bie_mul_i64(m, c, &elements)) BIE_FAIL("n, c, hw: n*c*hw overflows int64");
#pragma omp parallel for schedule(static) num_threads(bie_context_threads(ctx))
    for (int64_t j = 0; j < c; j++) {
        const float mean = saved_mean[j], invstd = saved_invstd[j];
        double sg = 0, sgx = 0;
        for (int64_t i = 0; i < n; i++) {
            const float *xp = x + (i * c + j) * hw, *gp = grad_y + (i * c + j) * hw;
            for (int64_t p = 0; p < hw; p++) {
                sg += gp[p];
                sgx += (double)gp[p] * ((xp[p] - mean) * invstd);
            }
        }
        grad_beta[j] = (float)sg;
        grad_gamma[j] = (float)sgx;
        if (!grad_x) continue;
        const float k = gamma[j] * invstd / (float)m, fsg = (float)sg, fsgx = (float)sgx, fm = (float)m;
        for (int64_t i = 0; i < n; i++) {
            const float *xp = x + (i * c + j) * hw, *gp = grad_y + (i * c + j) * hw;
            float * gx = grad_x + (i * c + j) * hw;
            for (int64_t p = 0; p < hw; p++) gx[p] = k * (fm * gp[p] - fsg - (xp[p] - mean) * invstd * fsgx);
        }
    }
    return BIE_STATUS_OK;
}

static enum bie_status check_pool(bie_context_t * ctx, int64_t n, int64_t c, int64_t h, int64_t w, int32_t k) {
    if (n <= 0 || c <= 0 || h <= 0 || w <= 0) BIE_FAIL("n, c, h, w: must be > 0");
    if (k < 1 || k > h || k > w) BIE_FAIL("k: = %d must be in [1, min(h, w)]", (int)k);
    const int64_t dims[4] = {n, c, h, w};
    int64_t numel;
    if (!bie_prod_i64(dims, 4, &numel) || numel > INT32_MAX) BIE_FAIL("x: more than 2^31 elements (argmax is int32)");
    return BIE_STATUS_OK;
}

// y[i, j, oy, ox] = max over the window x[i, j, oy*k + a, ox*k + b], a, b in [0, k).
enum bie_status bie_nn_maxpool2d_forward(bie_context_t * ctx, int64_t n, int64_t c, int64_t h, int64_t w, int32_t k,
                                         const float * x, float * y, int32_t * argmax) {
    BIE_ENTER(ctx);
    enum bie_status s = check_pool(ctx, n, c, h, w, k);
    if (s != BIE_STATUS_OK) return s;
    if (!x || !y) BIE_FAIL("x, y: must not be NULL");
    const int64_t oh = h / k, ow = w / k;
#pragma omp parallel for schedule(static) num_threads(bie_context_threads(ctx))
    for (int64_t plane = 0; plane < n * c; plane++) {
        const float * xp = x + plane * h * w;
        if (k == 2) { // the common case, without the inner loops: same order, same ties
            for (int64_t oy = 0; oy < oh; oy++)
                for (int64_t ox = 0; ox < ow; ox++) {
                    const int64_t at0 = (2 * oy) * w + 2 * ox, at[4] = {at0, at0 + 1, at0 + w, at0 + w + 1};
                    int64_t best = at0;
                    float bv = xp[at0];
                    for (int t = 1; t < 4; t++)
                        if (xp[at[t]] > bv || (xp[at[t]] != xp[at[t]] && bv == bv)) {
                            bv = xp[at[t]];
                            best = at[t];
                        }
                    const int64_t o = plane * oh * ow + oy * ow + ox;
                    y[o] = bv;
                    if (argmax) argmax[o] = (int32_t)(plane * h * w + best);
                }
            continue;
        }
        for (int64_t oy = 0; oy < oh; oy++)
            for (int64_t ox = 0; ox < ow; ox++) {
                int64_t best = (oy * k) * w + ox * k;
                float bv = xp[best];
                for (int32_t a = 0; a < k; a++)
                    for (int32_t b = 0; b < k; b++) {
                        const int64_t at = (oy * k + a) * w + ox * k + b;
                        if (xp[at] > bv || (isnan(xp[at]) && !isnan(bv))) {
                            bv = xp[at];
                            best = at;
                        }
                    }
                const int64_t o = plane * oh * ow + oy * ow + ox;
                y[o] = bv;
                if (argmax) argmax[o] = (int32_t)(plane * h * w + best);
            }
    }
    return BIE_STATUS_OK;
}

enum bie_status bie_nn_maxpool2d_backward(bie_context_t * ctx, int64_t n, int64_t c, int64_t h, int64_t w, int32_t k,
                                          const float * grad_y, const int32_t * argmax, float * grad_x) {
    BIE_ENTER(ctx);
    enum bie_status s = check_pool(ctx, n, c, h, w, k);
    if (s != BIE_STATUS_OK) return s;
    if (!grad_y || !argmax || !grad_x) BIE_FAIL("grad_y, argmax, grad_x: must not be NULL");
    const int64_t oh = h / k, ow = w / k;
    // Windows do not overlap and each plane's argmax stays in its plane: planes are independent.
#pragma omp parallel for schedule(static) num_threads(bie_context_threads(ctx))
    for (int64_t plane = 0; plane < n * c; plane++) {
        memset(grad_x + plane * h * w, 0, sizeof(float) * (size_t)(h * w));
        for (int64_t o = plane * oh * ow; o < (plane + 1) * oh * ow; o++) {
            const int64_t at = argmax[o];
            if (at >= plane * h * w && at < (plane + 1) * h * w) grad_x[at] += grad_y[o];
        }
    }
    return BIE_STATUS_OK;
}

enum bie_status bie_nn_activation_forward(bie_context_t * ctx, enum bie_activation act, int64_t count, const float * x,
                                          float * y) {
    BIE_ENTER(ctx);
    if (count < 0 || (count && (!x || !y))) BIE_FAIL("x, y: must not be NULL");
    if (act != BIE_ACT_RELU && act != BIE_ACT_SIGN && act != BIE_ACT_HARDTANH)
        BIE_FAIL("act: unknown activation %d", (int)act);
#pragma omp parallel for schedule(static) num_threads(bie_context_threads(ctx))
    for (int64_t i = 0; i < count; i++) {
        const float v = x[i];
        y[i] = act == BIE_ACT_RELU   ? (v > 0 ? v : 0.0f)
               : act == BIE_ACT_SIGN ? (v >= 0 ? 1.0f : -1.0f)
                                     : fminf(fmaxf(v, -1.0f), 1.0f);
    }
    return BIE_STATUS_OK;
}

enum bie_status bie_nn_activation_backward(bie_context_t * ctx, enum bie_activation act, int64_t count, const float * x,
                                           const float * grad_y, float * grad_x) {
    BIE_ENTER(ctx);
    if (count < 0 || (count && (!x || !grad_y || !grad_x))) BIE_FAIL("x, grad_y, grad_x: must not be NULL");
    if (act != BIE_ACT_RELU && act != BIE_ACT_SIGN && act != BIE_ACT_HARDTANH)
        BIE_FAIL("act: unknown activation %d", (int)act);
#pragma omp parallel for schedule(static) num_threads(bie_context_threads(ctx))
    for (int64_t i = 0; i < count; i++) {
        const float v = x[i];
        const bool pass = act == BIE_ACT_RELU ? v > 0 : fabsf(v) <= 1.0f;
        grad_x[i] = pass ? grad_y[i] : 0.0f;
    }
    return BIE_STATUS_OK;
}

enum bie_status bie_nn_softmax_cross_entropy(bie_context_t * ctx, int64_t n, int64_t classes, const float * logits,
                                             const uint8_t * labels, double * loss, float * grad_logits,
                                             int64_t * correct) {
    BIE_ENTER(ctx);
    int64_t elements;
    if (n <= 0 || classes <= 0) BIE_FAIL("n, classes: must be > 0");
    if (!bie_mul_i64(n, classes, &elements)) BIE_FAIL("n, classes: n*classes overflows int64");
    if (!logits || !labels) BIE_FAIL("logits, labels: must not be NULL");
    for (int64_t i = 0; i < n; i++)
        if (labels[i] >= classes)
            BIE_FAIL("labels[%lld] = %d is not in [0, %lld)", (long long)i, labels[i], (long long)classes);
    double total = 0;
    int64_t right = 0;
    for (int64_t i = 0; i < n; i++) {
        const float * z = logits + i * classes;
        int64_t arg = 0;
        for (int64_t j = 1; j < classes; j++)
            if (z[j] > z[arg]) arg = j;
        right += arg == labels[i];
        const double zmax = z[arg];
        double sum = 0;
        for (int64_t j = 0; j < classes; j++) sum += exp((double)z[j] - zmax);
        total += log(sum) - ((double)z[labels[i]] - zmax);
        if (grad_logits)
            for (int64_t j = 0; j < classes; j++)
                grad_logits[i * classes + j] =
                    (float)((exp((double)z[j] - zmax) / sum - (j == labels[i] ? 1.0 : 0.0)) / (double)n);
    }
    if (loss) *loss = total / (double)n;
    if (correct) *correct = right;
    return BIE_STATUS_OK;
}
