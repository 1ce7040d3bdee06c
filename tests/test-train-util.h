// SPDX-License-Identifier: Apache-2.0
// test-train-util.h: for the model tests: a checked bie_model_create, the loss of a batch of
// logits (as bie_model_forward returns them) through the public bie_softmax_cross_entropy, the
// model calls through tensor views, a learnable random batch and training steps on it.
#pragma once

#include "bie-train.h"
#include "test-util.h"

// A model test's start: test_init, *quick when BIE_TEST_QUICK is set, and the environment's context
// (test_env_context).
static inline bie_context_t * test_model_start(int argc, char ** argv, bool * quick) {
    test_init(argc, argv);
    *quick = getenv("BIE_TEST_QUICK") != NULL;
    return test_env_context();
}

// bie_model_create, checked: the model, or NULL (a failed check) when it could not be made.
static inline bie_model_t * test_model_create(bie_context_t * ctx, const char * arch, enum bie_latent latent,
                                              uint64_t seed) {
    bie_model_t * m = NULL;
    CHECK_OK(ctx, bie_model_create(ctx, arch, latent, seed, &m));
    return m;
}

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

// A learnable batch: labels y [n] in [0, classes) and inputs x [n, in] with class-dependent means.
static inline void test_random_batch(float * x, uint8_t * y, int64_t n, int64_t in, int classes) {
    for (int64_t i = 0; i < n; i++) {
        y[i] = (uint8_t)test_rand_int(0, classes - 1);
        for (int64_t j = 0; j < in; j++)
            x[i * in + j] = test_rand_float(-1, 1) + ((j * 7 + y[i] * 3) % 5 == 0 ? 1.5f : -0.3f);
    }
}

// steps training steps (forward, cross-entropy, backward, optimiser step at learning rate lr) on
// one batch; returns the loss of the last.
static inline double test_train_steps(bie_context_t * ctx, bie_model_t * m, const float * x, const uint8_t * y,
                                      int64_t n, int steps, float lr) {
    const int64_t k = bie_model_num_outputs(m);
    float * g = malloc(sizeof(float) * (size_t)(n * k));
    double loss = 0;
    for (int s = 0; s < steps; s++) {
        const float * logits;
        CHECK_OK(ctx, test_forward(ctx, m, x, n, 1, 0, &logits));
        CHECK_OK(ctx, test_xent(ctx, n, k, logits, y, &loss, g, NULL));
        CHECK_OK(ctx, test_backward(ctx, m, n, g));
        CHECK_OK(ctx, test_step(ctx, m, lr, 0.0f, 0.05f));
    }
    free(g);
    return loss;
}
