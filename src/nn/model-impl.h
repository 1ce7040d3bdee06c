// SPDX-License-Identifier: Apache-2.0
// model-impl.h: the model's internal structure, shared by model-arch.c (the architecture string),
// model.c (building, training forward and backward, optimizer), model-plan.c (planned inference),
// model-io.c (files, layer info) and float-layers.c (OpenBLAS paths).
#pragma once

#include "bie-impl.h"
#include "nn/graph-ops.h"
#include "nn/nn-kernels.h"

#include <stdbool.h>

enum layer_kind { L_CONV, L_LINEAR, L_BN, L_POOL, L_ACT, L_ADD, L_FLATTEN };

// Bounds on what a model (and so a checkpoint) may hold: the optimizer's step count, and the
// magnitude of every float value (finite, |v| <= BIE_MODEL_MAX_VALUE; Adam's second moment and
// batch norm's running variance >= 0). docs/limits.md.
#define BIE_MODEL_MAX_STEP (INT64_C(1) << 62)
#define BIE_MODEL_MAX_VALUE 1e30f

// Precision of a conv / linear layer: float (OpenBLAS) or one of bie's low-bit layers.
enum layer_q { Q_F32 = 0, Q_B1 = 1, Q_Q4 = 4, Q_Q8 = 8 };

enum pool_kind { POOL_MAX, POOL_AVG, POOL_ADAPTIVE_AVG };

// A trainable array: value, gradient, optimizer state (Adam m, v or Diode m, s).
struct param {
    float * v;
    float * g;
    float * m;
    float * s;
    int64_t n;
};

// The model is a graph of values: value 0 is the model's input, value i + 1 the output of layer
// i. Every layer reads one value (two for add) written before it, so the layers' order is a
// topological order; the last layer's output is the model's output.
struct layer {
    enum layer_kind kind;
    enum layer_q q;
    enum nn_act act;                 // L_ACT (NN_ACT_*), or prelu (prelu_n > 0)
    int32_t n_src;                   // 1, or 2 for add
    int32_t src[2];                  // the values read (0: the model input; i + 1: layer i's output)
    int32_t uses;                    // how many times later layers read this layer's output
    int64_t in[3], out[3];           // C, H, W per sample (in: of src[0])
    int64_t O, C, k, stride, pad, K; // conv / linear geometry (linear: k = 1, C = K = in numel)
    bool has_bias;                   // low-bit conv / linear: a float output bias (in b); float layers always have one
    enum pool_kind pool_kind;
    int32_t pool, pool_stride, pool_pad; // L_POOL: window, stride, padding (adaptive: unused)
    int64_t prelu_n;                     // prelu: 1 or C slopes (in w)
    // float conv / linear: weight [O, K] (K in C, kh, kw order) and bias [O].
    // low-bit: latent weight [O, C, k, k] (f32 in w.v, or int8 in w8 with its gradient in w.g),
    //          bias_a [C], scale_a [1] (0 until initialised), scale_w (fixed), or packed bytes,
    //          and the optional output bias [O] (b).
    // bn: gamma (w), beta (b), running statistics; bn_scale, bn_shift: its inference affine map.
    // prelu: slopes (w).
    struct param w, b, bias_a, scale_a;
    int8_t * w8;
    float scale_w;
    uint8_t * packed;
    size_t packed_bytes;
    float *rmean, *rvar, *smean, *sinvstd, *bn_scale, *bn_shift;
    int32_t * argmax;
    float * wcodes; // float codes of the weight for float_layers mode (built on demand)
};

struct model_plan; // model-plan.c

struct bie_model {
    char * arch;
    int32_t format_version; // the model format version the architecture needs (1 or 2)
    int64_t n_layers;
    struct layer * L;
    int64_t input[3]; // C, H, W of one sample
    enum bie_latent latent;
    bool packed;
    int64_t step; // optimizer steps taken
    uint64_t seed;
    // Training forward and backward: one buffer per value.
    int64_t cap_n;   // batch capacity of the buffers below
    float ** act;    // act[v]: value v (act[0] is the caller's x); act[n_layers]: logits
    float ** grad;   // grad[v]: gradient of value v
    float * gtmp;    // a gradient to add into grad[v] when v has several readers
    bool * grad_set; // backward: grad[v] holds a gradient already
    float * scratch;
    size_t scratch_size;
    int64_t n;          // batch size of the last forward
    bool have_training; // the last forward was a training forward (backward allowed)
    // Inference: plans (model-plan.c), valid while params_version is unchanged.
    uint64_t params_version; // bumped whenever parameters or statistics change
    struct model_plan * plans;
};

// The newest model format version this library reads and writes (docs/model-format.md): 1 is a
// chain of layers, 2 adds named inputs (graphs), the layers of PyTorch's common modules and the
// output bias of low-bit layers. Files carry the version their architecture needs.
#define BIE_MODEL_FORMAT_VERSION 2

#define BN_MOMENTUM 0.1f
#define BN_EPS 1e-5f

// Element counts per sample.
static inline int64_t shape_numel(const int64_t s[3]) { return s[0] * s[1] * s[2]; }

// A parsed architecture string (model-arch.c).
struct arch {
    struct layer * L; // n layers, geometry and graph filled, no parameters allocated
    int64_t n;
    int64_t input[3];
    int32_t version; // the model format version the string needs (1: a chain of version-1 items)
};
// Parses the architecture string; on failure INVALID_ARGUMENT with a message naming the item.
enum bie_status bie_model_parse_arch(bie_context_t * ctx, const char * arch, struct arch * out);
// The name of a layer's kind as in the architecture string ("conv", "maxpool", "gelu", ...).
const char * bie_model_kind_name(const struct layer * L);
// Allocates the parameters of every layer (zeroed; packed layers get packed buffers instead of
// latent weights and no gradients).
enum bie_status bie_model_alloc_params(bie_context_t * ctx, bie_model_t * m, bool packed);
// Creates the structure (parsed architecture, allocated parameters, zeroed) without initialising.
enum bie_status bie_model_create_empty(bie_context_t * ctx, const char * arch, enum bie_latent latent, bool packed,
                                       bie_model_t ** out);
// OK when the model's buffers for `batch` samples (bie_model_memory) fit the context's memory
// limit; else `status` with a message giving both sizes.
enum bie_status bie_model_check_memory(bie_context_t * ctx, const bie_model_t * m, int64_t batch, bool training,
                                       enum bie_status status);
// Scratch memory owned by the model, grown on demand.
enum bie_status bie_model_scratch(bie_context_t * ctx, bie_model_t * m, size_t bytes, void ** out);

// Tensor views of a low-bit layer's operands for n samples of x and y (model.c).
struct qviews {
    struct bie_tensor x, y, w, bias_a, scale_a, scale_w, gx, gw, gsa, gba, gy;
    struct bie_linear_desc ld;
    struct bie_conv2d_desc cd;
};
void bie_model_qviews(struct layer * L, int64_t n, const float * x, float * y, struct qviews * v);
// The forward arguments over those views (no output epilogue).
static inline struct bie_forward_args bie_model_qviews_forward(struct qviews * v) {
    return (struct bie_forward_args){
        .x = &v->x, .bias_a = &v->bias_a, .weight = &v->w, .scale_a = &v->scale_a, .scale_w = &v->scale_w, .y = &v->y};
}
// Float codes of a low-bit layer's weight in [O, K] order (K = c, kh, kw) for float_layers mode:
// +-1 (b1) or the integer codes (q4, q8), built once into L->wcodes.
enum bie_status bie_model_weight_codes(bie_context_t * ctx, struct layer * L);
// Float-layers mode, the input side of a low-bit layer: a = sign(x') (b1) or
// clamp(rne(x'/scale_a), lo, hi) with x' = x + bias_a (per channel for a conv, per feature for a
// linear layer), over n samples.
void bie_model_quantize_input(const struct layer * L, int64_t n, const float * x, float * a);
// Floats of scratch that bie_fconv_forward needs for layer L over n samples.
size_t bie_model_fconv_scratch(const struct layer * L, int64_t n);
// Layer L's geometry through bie_fconv_forward (a linear layer as the k = 1 conv of 1x1 images):
// y = conv(x, w) + bias over n samples (bias may be NULL).
void bie_model_fconv_forward(const struct layer * L, int64_t n, const float * x, const float * w, const float * bias,
                             float * y, float * scratch);
// The low-bit layer's output bias: y[i, o, p] += bias[o] over n samples (no-op without one).
void bie_model_add_output_bias(const struct layer * L, int64_t n, float * y);
// The pooling of layer L (an L_POOL) over a batch of n samples.
struct nn_pool bie_model_pool_args(const struct layer * L, int64_t n);
// Lazy initialisation of a low-bit layer's scale_a from its first input x (n samples).
enum bie_status bie_model_init_scale_a(bie_context_t * ctx, struct layer * L, int64_t n, const float * x);

// The training forward (model-train.c): batch statistics, every value kept for the backward.
enum bie_status bie_model_train_forward(bie_context_t * ctx, bie_model_t * m, const float * x, int64_t n,
                                        const float ** logits);

// Inference (model-plan.c): runs the model's plan for n samples, building it on the first call at
// this batch size (and after any change of the parameters); frees every plan.
enum bie_status bie_model_infer(bie_context_t * ctx, bie_model_t * m, const float * x, int64_t n, bool float_layers,
                                const float ** logits);
void bie_model_plans_free(bie_model_t * m);
// Plans built so far, and the bytes of the activation arena (for tests and benchmarks).
int64_t bie_model_plan_builds(const bie_model_t * m);
size_t bie_model_plan_arena_bytes(const bie_model_t * m);

// Float conv over a batch with OpenBLAS (im2col over the whole batch, one sgemm):
//   y[n, o, p] = bias[o] + sum_k W[o, k] * col[k, n*P + p], padded taps read pad_value.
// scratch must hold (K + O) * n * P floats.
void bie_fconv_forward(int64_t n, int64_t C, int64_t H, int64_t W, int64_t O, int64_t k, int64_t s, int64_t p,
                       float pad_value, const float * x, const float * w, const float * bias, float * y,
                       float * scratch);
// Backward: grad_w = gt col^T, grad_b = row sums of gt, grad_x = col2im(W^T gt) (each may be NULL).
// scratch as for the forward, plus K * n * P floats when grad_x is wanted.
void bie_fconv_backward(int64_t n, int64_t C, int64_t H, int64_t W, int64_t O, int64_t k, int64_t s, int64_t p,
                        const float * x, const float * w, const float * grad_y, float * grad_x, float * grad_w,
                        float * grad_b, float * scratch);
