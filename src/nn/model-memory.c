// SPDX-License-Identifier: Apache-2.0
// model-memory.c: how much host memory a model's buffers take at a batch size, and the check of
// that against the context's memory limit (on load and create for one sample, on each forward
// for its batch), so that a small model file cannot make the library allocate gigabytes.
#include "core/checked.h"
#include "model-impl.h"

#include <inttypes.h>

// Floats per sample of the buffers bie_model_forward and bie_model_backward keep (model.c):
// act[i + 1] = layer i's output; in training grad[i + 1] of the same size; an int32 argmax per
// max-pool output; and the largest scratch of one layer: a float conv's im2col columns and output
// ((K + O) * P per sample), or a low-bit layer run as float GEMMs (float_layers: its codes of x
// too). Every count is at most 64 layers of 2^24 values (the architecture's bounds): no overflow.
static int64_t floats_per_sample(const bie_model_t * m, bool training) {
    int64_t keep = 0, scratch = 0;
    for (int64_t i = 0; i < m->n_layers; i++) {
        const struct layer * L = &m->L[i];
        const int64_t out = shape_numel(L->out);
        keep += out * (training ? 2 : 1) + (L->kind == L_POOL ? out : 0);
        if (L->kind == L_CONV || L->kind == L_LINEAR) {
            const int64_t cols = (L->K + L->O) * L->out[1] * L->out[2];
            const int64_t s = L->q == Q_F32 ? cols : training ? 0 : shape_numel(L->in) + cols;
            if (s > scratch) scratch = s;
        }
    }
    return keep + scratch;
}

enum bie_status bie_model_memory(const bie_model_t * m, int64_t batch, int training, size_t * out_bytes) {
    if (!m || !out_bytes || batch < 1) return BIE_STATUS_INVALID_ARGUMENT;
    int64_t floats;
    if (!bie_mul_i64(floats_per_sample(m, training != 0), batch, &floats) ||
        !bie_bytes_of(floats, sizeof(float), out_bytes))
        return BIE_STATUS_INVALID_ARGUMENT;
    return BIE_STATUS_OK;
}

enum bie_status bie_model_check_memory(bie_context_t * ctx, const bie_model_t * m, int64_t batch, bool training,
                                       enum bie_status status) {
    size_t bytes = 0;
    if (bie_model_memory(m, batch, training, &bytes) != BIE_STATUS_OK || bytes > ctx->mem_limit)
        return bie_set_error(ctx, status,
                             "model: %s of %" PRId64 " sample%s needs %zu bytes of activations, more than the "
                             "context's memory limit of %zu (bie_context_set_memory_limit)",
                             training ? "training" : "a batch", batch, batch == 1 ? "" : "s", bytes, ctx->mem_limit);
    return BIE_STATUS_OK;
}
