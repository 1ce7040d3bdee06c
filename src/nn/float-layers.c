// SPDX-License-Identifier: Apache-2.0
// float-layers.c: the float conv of the model (first layer; low-bit layers in float_layers mode),
// as im2col over the whole batch and one OpenBLAS sgemm per pass. A linear layer is the k = 1 case
// over 1x1 images. Threads come from OpenBLAS (sgemm) and OpenMP (im2col, col2im), split over
// independent rows, so results do not depend on the OpenMP thread count; the forward's loops stay
// on the calling thread for small work (NN_PARALLEL_FOR), as a batch-1 inference needs.
#include "model-impl.h"

#include <cblas.h>
#include <string.h>

static int64_t out_dim(int64_t h, int64_t k, int64_t s, int64_t p) { return (h + 2 * p - k) / s + 1; }

// col[kk, i*P + q] for kk = (c, a, b), q = (oy, ox): the input tap or pad_value.
static void im2col(int64_t n, int64_t C, int64_t H, int64_t W, int64_t k, int64_t s, int64_t p, float pad_value,
                   const float * x, float * col) {
    const int64_t OH = out_dim(H, k, s, p), OW = out_dim(W, k, s, p), P = OH * OW, K = C * k * k;
    NN_PARALLEL_FOR(K * n * P, t, K * n, {
        const int64_t kk = t / n, i = t % n;
        const int64_t c = kk / (k * k), a = (kk / k) % k, b = kk % k;
        const float * xp = x + (i * C + c) * H * W;
        float * cp = col + kk * n * P + i * P;
        for (int64_t oy = 0; oy < OH; oy++) {
            const int64_t iy = oy * s - p + a;
            for (int64_t ox = 0; ox < OW; ox++) {
                const int64_t ix = ox * s - p + b;
                cp[oy * OW + ox] = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? xp[iy * W + ix] : pad_value;
            }
        }
    });
}

void bie_fconv_forward(int64_t n, int64_t C, int64_t H, int64_t W, int64_t O, int64_t k, int64_t s, int64_t p,
                       float pad_value, const float * x, const float * w, const float * bias, float * y,
                       float * scratch) {
    const int64_t OH = out_dim(H, k, s, p), OW = out_dim(W, k, s, p), P = OH * OW, K = C * k * k;
    if (k == 1 && s == 1 && p == 0 && H == 1 && W == 1) { // linear: y = x W^T + b
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)O, (int)K, 1.0f, x, (int)K, w, (int)K, 0.0f,
                    y, (int)O);
        if (bias)
            NN_PARALLEL_FOR(n * O, i, n, {
                for (int64_t o = 0; o < O; o++) y[i * O + o] += bias[o];
            });
        return;
    }
    float *col = scratch, *out = scratch + K * n * P;
    im2col(n, C, H, W, k, s, p, pad_value, x, col);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)O, (int)(n * P), (int)K, 1.0f, w, (int)K, col,
                (int)(n * P), 0.0f, out, (int)(n * P));
    NN_PARALLEL_FOR(n * O * P, t, n * O, {
        const int64_t i = t / O, o = t % O;
        const float b = bias ? bias[o] : 0.0f;
        const float * src = out + o * n * P + i * P;
        float * dst = y + (i * O + o) * P;
        for (int64_t q = 0; q < P; q++) dst[q] = src[q] + b;
    });
}

void bie_fconv_backward(int64_t n, int64_t C, int64_t H, int64_t W, int64_t O, int64_t k, int64_t s, int64_t p,
                        const float * x, const float * w, const float * grad_y, float * grad_x, float * grad_w,
                        float * grad_b, float * scratch) {
    const int64_t OH = out_dim(H, k, s, p), OW = out_dim(W, k, s, p), P = OH * OW, K = C * k * k;
    if (k == 1 && s == 1 && p == 0 && H == 1 && W == 1) {
        if (grad_w)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)O, (int)K, (int)n, 1.0f, grad_y, (int)O, x,
                        (int)K, 0.0f, grad_w, (int)K);
        if (grad_x)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)K, (int)O, 1.0f, grad_y, (int)O, w,
                        (int)K, 0.0f, grad_x, (int)K);
        if (grad_b)
            for (int64_t o = 0; o < O; o++) {
                double sum = 0;
                for (int64_t i = 0; i < n; i++) sum += grad_y[i * O + o];
                grad_b[o] = (float)sum;
            }
        return;
    }
    float *col = scratch, *gt = scratch + K * n * P;
    im2col(n, C, H, W, k, s, p, 0.0f, x, col);
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t i = 0; i < n; i++)
        for (int64_t o = 0; o < O; o++)
            memcpy(gt + o * n * P + i * P, grad_y + (i * O + o) * P, sizeof(float) * (size_t)P);
    if (grad_w)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)O, (int)K, (int)(n * P), 1.0f, gt, (int)(n * P), col,
                    (int)(n * P), 0.0f, grad_w, (int)K);
    if (grad_b)
#pragma omp parallel for schedule(static)
        for (int64_t o = 0; o < O; o++) {
            double sum = 0;
            for (int64_t q = 0; q < n * P; q++) sum += gt[o * n * P + q];
            grad_b[o] = (float)sum;
        }
    if (grad_x) {
        float * gcol = col; // col is no longer needed
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)K, (int)(n * P), (int)O, 1.0f, w, (int)K, gt,
                    (int)(n * P), 0.0f, gcol, (int)(n * P));
        // col2im: each (image, channel) plane gathers from its own taps; no write conflicts.
#pragma omp parallel for collapse(2) schedule(static)
        for (int64_t i = 0; i < n; i++)
            for (int64_t c = 0; c < C; c++) {
                float * gx = grad_x + (i * C + c) * H * W;
                memset(gx, 0, sizeof(float) * (size_t)(H * W));
                for (int64_t a = 0; a < k; a++)
                    for (int64_t b = 0; b < k; b++) {
                        const float * cp = gcol + ((c * k + a) * k + b) * n * P + i * P;
                        for (int64_t oy = 0; oy < OH; oy++) {
                            const int64_t iy = oy * s - p + a;
                            if (iy < 0 || iy >= H) continue;
                            for (int64_t ox = 0; ox < OW; ox++) {
                                const int64_t ix = ox * s - p + b;
                                if (ix >= 0 && ix < W) gx[iy * W + ix] += cp[oy * OW + ox];
                            }
                        }
                    }
            }
    }
}
