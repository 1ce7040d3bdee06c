// SPDX-License-Identifier: Apache-2.0
// model-impl.h: the sequential model's internal structure, shared by model.c (building, forward,
// backward, optimizer), model-io.c (files, layer info) and float-layers.c (OpenBLAS paths).
#pragma once

#include "bie-impl.h"

#include <stdbool.h>

enum layer_kind { L_CONV, L_LINEAR, L_BN, L_POOL, L_ACT };

// Bounds on what a model (and so a checkpoint) may hold: the optimizer's step count, and the
// magnitude of every float value (finite, |v| <= BIE_MODEL_MAX_VALUE; Adam's second moment and
// batch norm's running variance >= 0). docs/limits.md.
#define BIE_MODEL_MAX_STEP (INT64_C(1) << 62)
#define BIE_MODEL_MAX_VALUE 1e30f

// Precision of a conv / linear layer: float (OpenBLAS) or one of bie's low-bit layers.
enum layer_q { Q_F32 = 0, Q_B1 = 1, Q_Q4 = 4, Q_Q8 = 8 };

// A trainable array: value, gradient, optimizer state (Adam m, v or Diode m, s).
struct param {
    float * v;
    float * g;
    float * m;
    float * s;
    int64_t n;
};

struct layer {
    enum layer_kind kind;
    enum layer_q q;
    enum bie_activation act;
    int64_t in[3], out[3]; // C, H, W per sample
    int64_t O, C, k, stride, pad, K; // conv / linear geometry (linear: k = 1, C = K = in numel)
    int32_t pool;
    // float conv / linear: weight [O, K] (K in C, kh, kw order) and bias [O].
    // low-bit: latent weight [O, C, k, k] (f32 in w.v, or int8 in w8 with its gradient in w.g),
    //          bias_a [C], scale_a [1] (0 until initialised), scale_w (fixed), or packed bytes.
    // bn: gamma (w), beta (b), running statistics.
    struct param w, b, bias_a, scale_a;
    int8_t * w8;
    float scale_w;
    uint8_t * packed;
    size_t packed_bytes;
    float * rmean, * rvar, * smean, * sinvstd;
    int32_t * argmax;
    float * wcodes; // float codes of the weight for float_layers mode (built on demand)
};

struct bie_model {
    char * arch;
    int64_t n_layers;
    struct layer * L;
    enum bie_latent latent;
    bool packed;
    int64_t step; // optimizer steps taken
    uint64_t seed;
    int64_t cap_n; // batch capacity of the buffers below
    float ** act;  // act[i]: input of layer i (act[0] is the caller's x); act[n_layers]: logits
    float ** grad; // grad[i]: gradient of act[i]
    float * scratch;
    size_t scratch_size;
    int64_t n;          // batch size of the last forward
    bool have_training; // the last forward was a training forward (backward allowed)
};

// Element counts per sample.
static inline int64_t shape_numel(const int64_t s[3]) { return s[0] * s[1] * s[2]; }

// Parses the architecture and fills the geometry of every layer (no allocation of parameters).
enum bie_status bie_model_parse_arch(bie_context_t * ctx, const char * arch, struct layer ** out_layers,
                                     int64_t * out_n);
// Allocates the parameters of every layer (zeroed; packed layers get packed buffers instead of
// latent weights and no gradients).
enum bie_status bie_model_alloc_params(bie_context_t * ctx, bie_model_t * m, bool packed);
// OK when the model's buffers for `batch` samples (bie_model_memory) fit the context's memory
// limit; else `status` with a message giving both sizes.
enum bie_status bie_model_check_memory(bie_context_t * ctx, const bie_model_t * m, int64_t batch, bool training,
                                       enum bie_status status);
// Scratch memory owned by the model, grown on demand.
enum bie_status bie_model_scratch(bie_context_t * ctx, bie_model_t * m, size_t bytes, void ** out);

// Float conv over a batch with OpenBLAS (im2col over the whole batch, one sgemm):
//   y[n, o, p] = bias[o] + sum_k W[o, k] * col[k, n*P + p], padded taps read pad_value.
// scratch must hold (K + O) * n * P floats.
void bie_fconv_forward(int64_t n, int64_t C, int64_t H, int64_t W, int64_t O, int64_t k, int64_t s,
                       int64_t p, float pad_value, const float * x, const float * w, const float * bias,
                       float * y, float * scratch);
// Backward: grad_w = gt col^T, grad_b = row sums of gt, grad_x = col2im(W^T gt) (each may be NULL).
// scratch as for the forward, plus K * n * P floats when grad_x is wanted.
void bie_fconv_backward(int64_t n, int64_t C, int64_t H, int64_t W, int64_t O, int64_t k, int64_t s,
                        int64_t p, const float * x, const float * w, const float * grad_y, float * grad_x,
                        float * grad_w, float * grad_b, float * scratch);
