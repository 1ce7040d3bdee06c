// SPDX-License-Identifier: Apache-2.0
// test-train-util.h: the loss of a batch of logits (as bie_model_forward returns them) through the
// public bie_softmax_cross_entropy, for the model tests.
#pragma once

#include "bie-train.h"
#include "test-util.h"

// loss, grad (float [n, k]) and correct may be NULL.
static inline enum bie_status test_xent(bie_context_t * ctx, int64_t n, int64_t k, const float * logits,
                                        const uint8_t * labels, double * loss, float * grad, int64_t * correct) {
    struct bie_tensor tz = TEST_VIEW(logits, BIE_DTYPE_F32, n, k), tl = TEST_VIEW(labels, BIE_DTYPE_U8, n);
    struct bie_tensor tg = grad ? TEST_VIEW(grad, BIE_DTYPE_F32, n, k) : tz;
    const struct bie_softmax_cross_entropy_args a = {&tz, &tl, grad ? &tg : NULL, loss, correct};
    return bie_softmax_cross_entropy(ctx, &a);
}

// bie_model_forward of x [n, inputs] into a buffer of this file (valid until the next call; one
// thread at a time): *logits points at its [n, outputs] logits.
static float test_logits_buf[1 << 16];
static inline enum bie_status test_forward(bie_context_t * ctx, bie_model_t * m, const float * x, int64_t n,
                                           int training, int float_layers, const float ** logits) {
    const int64_t k = bie_model_num_outputs(m);
    if (n < 1 || n * k > (int64_t)(sizeof test_logits_buf / sizeof(float))) {
        fprintf(stderr, "test_forward: n %lld too large for the test's logits buffer\n", (long long)n);
        exit(2);
    }
    struct bie_tensor tx = TEST_VIEW(x, BIE_DTYPE_F32, n, bie_model_num_inputs(m)),
                      tz = TEST_VIEW(test_logits_buf, BIE_DTYPE_F32, n, k);
    *logits = test_logits_buf;
    return bie_model_forward(ctx, m, &(struct bie_model_forward_desc){training, float_layers},
                             &(struct bie_model_forward_args){&tx, &tz});
}

// bie_model_backward with grad [n, outputs] (n of the last training forward).
static inline enum bie_status test_backward(bie_context_t * ctx, bie_model_t * m, int64_t n, const float * grad) {
    struct bie_tensor tg = TEST_VIEW(grad, BIE_DTYPE_F32, n, bie_model_num_outputs(m));
    return bie_model_backward(ctx, m, &(struct bie_model_backward_args){&tg});
}

static inline enum bie_status test_step(bie_context_t * ctx, bie_model_t * m, float lr, float weight_decay,
                                        float diode_lr) {
    return bie_model_step(ctx, m, &(struct bie_model_step_desc){lr, weight_decay, diode_lr});
}
