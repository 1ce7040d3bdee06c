// SPDX-License-Identifier: Apache-2.0
// nn-kernels.h: the float building blocks and optimizer steps on dense f32 arrays (nn-ops.c,
// optim.c). The public entry points of bie-train.h check their tensor views and call these
// (nn-entry.c, with the view checks below, which the model's entry points share); the model calls
// them directly on its own buffers. The math of each is written above the public declaration in
// bie-train.h; these check only counts and NULLs.
#pragma once

#include "bie-impl.h"

enum bie_status bie_nn_batchnorm_forward(bie_context_t * ctx, int64_t n, int64_t c, int64_t hw, const float * x,
                                         const float * gamma, const float * beta, float * running_mean,
                                         float * running_var, float momentum, float eps, int training,
                                         float * saved_mean, float * saved_invstd, const float * residual,
                                         float * y); // residual may be NULL
// grad_x may be NULL.
enum bie_status bie_nn_batchnorm_backward(bie_context_t * ctx, int64_t n, int64_t c, int64_t hw, const float * x,
                                          const float * gamma, const float * saved_mean, const float * saved_invstd,
                                          const float * grad_y, float * grad_x, float * grad_gamma, float * grad_beta);
// argmax may be NULL.
enum bie_status bie_nn_maxpool2d_forward(bie_context_t * ctx, int64_t n, int64_t c, int64_t h, int64_t w, int32_t k,
                                         const float * x, float * y, int32_t * argmax);
enum bie_status bie_nn_maxpool2d_backward(bie_context_t * ctx, int64_t n, int64_t c, int64_t h, int64_t w, int32_t k,
                                          const float * grad_y, const int32_t * argmax, float * grad_x);
// y may alias x, grad_x grad_y.
enum bie_status bie_nn_activation_forward(bie_context_t * ctx, enum bie_activation act, int64_t count, const float * x,
                                          float * y);
enum bie_status bie_nn_activation_backward(bie_context_t * ctx, enum bie_activation act, int64_t count, const float * x,
                                           const float * grad_y, float * grad_x);
// loss, grad_logits and correct may be NULL.
enum bie_status bie_nn_softmax_cross_entropy(bie_context_t * ctx, int64_t n, int64_t classes, const float * logits,
                                             const uint8_t * labels, double * loss, float * grad_logits,
                                             int64_t * correct);
enum bie_status bie_nn_adam_step(bie_context_t * ctx, const struct bie_adam_params * params, int64_t step,
                                 int64_t count, float * p, const float * grad, float * m, float * v);
enum bie_status bie_nn_diode_init(bie_context_t * ctx, int64_t count, const int8_t * w, uint64_t seed, float * m,
                                  float * s);
// flips may be NULL.
enum bie_status bie_nn_diode_step(bie_context_t * ctx, const struct bie_diode_params * params, int64_t count,
                                  int8_t * w, const float * grad, float * m, float * s, int64_t * flips);

// t is a well-formed, dense row-major CPU view of dtype (strided and broadcast views are refused:
// the kernels walk flat arrays). Messages name `name`.
enum bie_status bie_nn_check_dense(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                                   enum bie_dtype dtype);
// The same, with ndim (1, 2 or 4) dims equal to shape.
enum bie_status bie_nn_check_shape(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                                   enum bie_dtype dtype, int32_t ndim, const int64_t * shape);
