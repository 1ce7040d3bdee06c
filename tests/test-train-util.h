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
