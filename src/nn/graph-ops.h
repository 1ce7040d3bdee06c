// SPDX-License-Identifier: Apache-2.0
// graph-ops.h: the float operations that the graph model adds to nn-ops.c's building blocks:
// pooling with any window, stride and padding, adaptive average pooling, the activations of
// PyTorch's common modules (including PReLU), residual adds and the per-channel affine map of
// batch norm in inference. Dense f32 NCHW arrays on the CPU (hw = 1 for flat features).
//
// These are internal: the model validates every geometry once, when it parses the architecture,
// so they take no context, check nothing and return nothing. Each is plain C with its math in
// the comment above it; threads split planes or elements (OpenMP), and only above NN_PAR_MIN
// elements of work, so a batch-1 call on a small layer never pays for waking a thread team. Every
// reduction runs in a fixed order inside one thread: results do not depend on the thread count.
#pragma once

#include "bie-train.h"

#include <stdbool.h>
#include <stdint.h>

// Work (elements touched) below which a call runs on the calling thread alone.
#define NN_PAR_MIN 32768

// for (int64_t i = 0; i < count; i++) { body }, split over the OpenMP threads when `work`
// reaches NN_PAR_MIN, else on the calling thread without entering a parallel region at all
// (libgomp allocates a team even for an if(0) region, and waking threads costs microseconds).
#define NN_PARALLEL_FOR(work, i, count, ...)                                                                           \
    do {                                                                                                               \
        const int64_t nn_count_ = (count);                                                                             \
        if ((work) >= NN_PAR_MIN) {                                                                                    \
            _Pragma("omp parallel for schedule(static)") for (int64_t i = 0; i < nn_count_; i++) __VA_ARGS__           \
        } else {                                                                                                       \
            for (int64_t i = 0; i < nn_count_; i++) __VA_ARGS__                                                        \
        }                                                                                                              \
    } while (0)

// --- pooling --------------------------------------------------------------------------------------

// A pooling window over x [n, c, h, w]: a k x k window moved by stride s over the input padded by
// p on every side (floor mode): oh = (h + 2p - k)/s + 1, ow likewise. Output y [n, c, oh, ow].
// Output (oy, ox) covers the input rows iy = oy*s - p + a and columns ix = ox*s - p + b, a, b in
// [0, k); taps outside the image are padding.
struct nn_pool {
    int64_t n, c, h, w, oh, ow;
    int32_t k, s, p;
};

// Fills oh and ow from the rest (the caller has checked h + 2p >= k, w + 2p >= k).
void nn_pool_geometry(struct nn_pool * g);

// Max pooling (padding taps are -inf, so they never win; the architecture keeps p <= k/2, so
// every window holds an image tap):
//   y[i, j, oy, ox] = max over the window's image taps of x[i, j, iy, ix]
// Ties go to the first tap in row-major window order; a NaN wins over numbers (PyTorch's
// rule). argmax (may be NULL) gets the winner's index iy*w + ix inside its plane.
void nn_maxpool_forward(const struct nn_pool * g, const float * x, float * y, int32_t * argmax);
// grad_x[i, j, t] = sum of grad_y[i, j, o] over the outputs o whose argmax is t (windows may
// overlap when s < k).
void nn_maxpool_backward(const struct nn_pool * g, const float * grad_y, const int32_t * argmax, float * grad_x);

// Average pooling that counts padding taps as zeros (PyTorch's count_include_pad = True):
//   y[i, j, oy, ox] = (sum over the window's image taps of x[i, j, iy, ix]) / (k*k)
// summed in double, rounded once.
void nn_avgpool_forward(const struct nn_pool * g, const float * x, float * y);
// grad_x[i, j, iy, ix] = sum over the windows holding (iy, ix) of grad_y[i, j, oy, ox] / (k*k).
void nn_avgpool_backward(const struct nn_pool * g, const float * grad_y, float * grad_x);

// Adaptive average pooling x [n, c, h, w] -> y [n, c, oh, ow] (PyTorch's AdaptiveAvgPool2d):
// output row oy averages the input rows [floor(oy*h/oh), ceil((oy+1)*h/oh)), likewise columns:
//   y[i, j, oy, ox] = (sum over the window of x) / (window rows * window columns)
// summed in double, rounded once. oh = ow = 1 is global average pooling.
void nn_adaptive_avgpool_forward(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow, const float * x,
                                 float * y);
// grad_x[i, j, iy, ix] = sum over the windows holding (iy, ix) of grad_y / (that window's size).
void nn_adaptive_avgpool_backward(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow,
                                  const float * grad_y, float * grad_x);

// --- activations ------------------------------------------------------------------------------------

// The element-wise activations of the model. The first three share bie_activation's values and
// meaning (bie_activation_forward); the others are PyTorch's modules of the same name.
enum nn_act {
    NN_ACT_RELU = BIE_ACT_RELU,         // max(x, 0)
    NN_ACT_SIGN = BIE_ACT_SIGN,         // +1 if x >= 0 else -1
    NN_ACT_HARDTANH = BIE_ACT_HARDTANH, // clamp(x, -1, 1)
    NN_ACT_TANH,                        // tanh(x)
    NN_ACT_GELU,                        // x * Phi(x) = x/2 * (1 + erf(x/sqrt(2)))
    NN_ACT_GELU_TANH,                   // x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
    NN_ACT_SILU,                        // x * sigmoid(x) = x / (1 + exp(-x))
};

// y[i] = act(x[i]) over count elements (y may be x).
void nn_act_forward(enum nn_act act, int64_t count, const float * x, float * y);
// grad_x[i] = grad_y[i] * act'(x[i]) (grad_x may be grad_y), with
//   relu: 1{x > 0}; sign, hardtanh: 1{|x| <= 1} (straight-through); tanh: 1 - tanh(x)^2;
//   gelu: Phi(x) + x*phi(x), phi(x) = exp(-x^2/2)/sqrt(2 pi);
//   gelu_tanh: with u = sqrt(2/pi)(x + 0.044715 x^3), t = tanh(u):
//              (1 + t)/2 + x/2 * (1 - t^2) * sqrt(2/pi) * (1 + 3*0.044715 x^2);
//   silu: with s = sigmoid(x): s * (1 + x*(1 - s)).
void nn_act_backward(enum nn_act act, int64_t count, const float * x, const float * grad_y, float * grad_x);

// PReLU over x [n, c, hw] with one slope (n_slope = 1) or one per channel (n_slope = c):
//   y = x if x > 0 else slope[j] * x          (j = the channel, or 0)
void nn_prelu_forward(int64_t n, int64_t c, int64_t hw, const float * slope, int64_t n_slope, const float * x,
                      float * y);
// grad_x = grad_y * (x > 0 ? 1 : slope[j])  (grad_x may be NULL);
// grad_slope[j] = sum over the elements of slope j with x <= 0 of grad_y * x (summed in double).
void nn_prelu_backward(int64_t n, int64_t c, int64_t hw, const float * slope, int64_t n_slope, const float * x,
                       const float * grad_y, float * grad_x, float * grad_slope);

// --- element-wise arithmetic ------------------------------------------------------------------------

// y[i] = a[i] + b[i] (y may be a or b).
void nn_add(int64_t count, const float * a, const float * b, float * y);
// y[i] += x[i].
void nn_accumulate(int64_t count, const float * x, float * y);
// Batch norm in inference as a per-channel affine map over x [n, c, hw] (y may be x):
//   y[i, j, p] = x[i, j, p] * scale[j] + shift[j]
// with scale = gamma / sqrt(running_var + eps) and shift = beta - running_mean * scale, computed
// as bie_batchnorm_forward computes them (so the result is bit-identical to its eval mode).
void nn_channel_affine(int64_t n, int64_t c, int64_t hw, const float * scale, const float * shift, const float * x,
                       float * y);
// The scale and shift above from gamma, beta and the running statistics.
void nn_batchnorm_affine(int64_t c, const float * gamma, const float * beta, const float * running_mean,
                         const float * running_var, float eps, float * scale, float * shift);
