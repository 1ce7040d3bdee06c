// SPDX-License-Identifier: Apache-2.0
// bie-train.h: libbie's training module: the model file format (safetensors) and the IDX data
// files, the float building blocks between low-bit layers, the optimizers and models. The
// conventions of bie.h (statuses, messages in the context, one context per thread) hold here too.
#pragma once

#include "bie.h"

#ifdef __cplusplus
extern "C" {
#endif

//
// Training module (src/nn, src/io)
//
// What a C program needs to train a small low-bit network with the layers above and ship it:
// readers and writers of the model file format (safetensors) and of the IDX data files of the
// MNIST family, the float building blocks between low-bit layers (batch norm, max-pooling,
// activations, softmax cross-entropy), the optimizers (Adam, Diode) and a model (a graph of
// layers) that ties them together. Float tensors here are dense row-major f32 CPU views (NCHW for
// images).
// docs/model-format.md describes the model files.
//

// --- safetensors --------------------------------------------------------------------------------
// Every file is treated as hostile: the header length is bounded (BIE_SAFETENSORS_MAX_HEADER),
// the JSON header is parsed strictly, every tensor's dtype, shape and data_offsets are checked
// against each other and against the file, and the tensors must tile the data section exactly
// (no overlap, no hole), as the format requires. Dtypes read and written: F32, F16, BF16, F64,
// I32, I8, U8. A safetensors file has no sub-byte dtype: packed bits and nibbles are stored as U8.

#define BIE_SAFETENSORS_MAX_HEADER (100u << 20)
// bie_safetensors_read refuses larger files (from their size, before reading).
#define BIE_SAFETENSORS_MAX_FILE ((size_t)4 << 30)

struct bie_st_tensor {
    const char * name;
    enum bie_dtype dtype;
    int32_t ndim;
    int64_t shape[BIE_MAX_DIMS]; // a dimension may be 0 (an empty tensor)
    const void * data;           // nbytes bytes, not necessarily aligned (copy with memcpy)
    size_t nbytes;
};

typedef struct bie_safetensors bie_safetensors_t;

// Parses a file image held in memory (the bytes are copied). FORMAT_ERROR names what is wrong.
BIE_API enum bie_status bie_safetensors_parse(bie_context_t * ctx, const void * bytes, size_t size,
                                              bie_safetensors_t ** out);
// Reads and parses the file at path: a regular file of at most BIE_SAFETENSORS_MAX_FILE bytes. Its
// header is read and checked before its data section (a bad file costs no more memory than its
// header). Parsing is linear in the header's length. Messages name the file.
BIE_API enum bie_status bie_safetensors_read(bie_context_t * ctx, const char * path, bie_safetensors_t ** out);
BIE_API void bie_safetensors_free(bie_safetensors_t * st);
BIE_API size_t bie_safetensors_count(const bie_safetensors_t * st);
// The i-th tensor in data order, or NULL when i is out of range.
BIE_API const struct bie_st_tensor * bie_safetensors_at(const bie_safetensors_t * st, size_t i);
// The tensor named name, or NULL.
BIE_API const struct bie_st_tensor * bie_safetensors_find(const bie_safetensors_t * st, const char * name);
// The __metadata__ value of key, or NULL.
BIE_API const char * bie_safetensors_metadata(const bie_safetensors_t * st, const char * key);
// Number of __metadata__ entries, and the i-th (key and value; NULL when out of range).
BIE_API size_t bie_safetensors_metadata_count(const bie_safetensors_t * st);
BIE_API const char * bie_safetensors_metadata_at(const bie_safetensors_t * st, size_t i, const char ** value);

// Writes n tensors (in this order; names unique, not "__metadata__") and the metadata (n_meta
// key/value string pairs: meta[2i] = key, meta[2i+1] = value; keys unique; names, keys and values
// valid UTF-8, as the reader requires) to path atomically: a temporary file next to path
// ("<path>.tmp.<pid>.<suffix>"), flushed to disk, renamed over path, and the directory flushed.
// Temporary files that writers killed meanwhile left behind are removed first. The file gets
// 0666 less the umask (a replaced file keeps its mode); the process umask is never changed.
BIE_API enum bie_status bie_safetensors_write(bie_context_t * ctx, const char * path,
                                              const struct bie_st_tensor * tensors, size_t n, const char * const * meta,
                                              size_t n_meta);

// --- IDX files (MNIST, Fashion-MNIST) ------------------------------------------------------------
// An IDX file: magic 0x00 0x00 type ndim, then ndim big-endian uint32 dimensions, then the
// elements. Only unsigned bytes (type 0x08) are read. Files may be gzip-compressed (detected by
// their magic). The header is checked first, and the data size it declares (at most
// BIE_IDX_MAX_BYTES) is all the memory the data takes: a gzip stream is inflated no further, and a
// bad header is refused before the data is inflated or read. The element count must match the rest
// of the file exactly: a truncated or padded file is a FORMAT_ERROR. Only regular files are read.

#define BIE_IDX_MAX_BYTES (1u << 30)

struct bie_idx {
    uint8_t * data; // owned (free with bie_idx_free)
    int32_t ndim;   // 1..4
    int64_t shape[4];
};

// Parses an IDX image (raw or gzip) held in memory; `name` is used in messages.
BIE_API enum bie_status bie_idx_parse(bie_context_t * ctx, const void * bytes, size_t size, const char * name,
                                      struct bie_idx * out);
BIE_API enum bie_status bie_idx_read(bie_context_t * ctx, const char * path, struct bie_idx * out);
BIE_API void bie_idx_free(struct bie_idx * idx);

// --- float building blocks (f32, CPU, OpenMP over channels / images; batch norm on CUDA too) -----
// Tensors are bie_tensor views: f32 (labels U8, argmax I32, Diode weights I8) on the CPU, dense
// row-major (contiguous; a strided or broadcast view is INVALID_ARGUMENT naming it; batch norm takes
// CUDA tensors of other forms, below). Outputs may
// not overlap each other or an input, except where a function says so. Every shape is checked
// against the others; a message names the argument that is wrong.

// Batch norm over x [n, c, ...] (hw = the product of the dimensions after c; x may be [n, c]
// after a linear layer), per channel:
//   training: mean, var = batch statistics (biased var); running = (1-momentum)*running +
//             momentum*stat (running_var takes the unbiased var); writes saved_mean and
//             saved_invstd = 1/sqrt(var + eps) for the backward
//   eval:     mean, var = running statistics
//   y = (x - mean) * invstd * gamma + beta  (+ residual, when given: a residual block's shortcut)
// On CUDA tensors (all on one device) the two functions also take what a PyTorch network holds:
// x, y, residual, grad_y and grad_x f32, f16 or bf16 (computed in f32, each output rounded once)
// of 2 to 4 dimensions and any strides (NCHW and channels-last alike);
// gamma, beta, running_*, grad_gamma and grad_beta [c] of f32, f16 or bf16; saved_* [c] f32.
// Their sums are in f32 within a block and in double across blocks, in a fixed order, so a call
// gives the same bits every time; the forward sums each channel's x less its first element, which
// keeps the variance accurate where the mean is large against the spread.
struct bie_batchnorm_desc {
    float momentum;   // training only: the running statistics' update rate (0.1 in PyTorch)
    float eps;        // > 0 (1e-5 in PyTorch)
    int32_t training; // != 0: batch statistics, running statistics updated, saved_* written
};
struct bie_batchnorm_args {
    const struct bie_tensor * x;        // [n, c, ...]
    const struct bie_tensor * gamma;    // [c]
    const struct bie_tensor * beta;     // [c]
    struct bie_tensor * running_mean;   // [c], read (eval) or updated (training)
    struct bie_tensor * running_var;    // [c]
    struct bie_tensor * saved_mean;     // [c], written in training (may be NULL in eval)
    struct bie_tensor * saved_invstd;   // [c], likewise
    struct bie_tensor * y;              // like x (NULL in training: the statistics only)
    const struct bie_tensor * residual; // like x, or NULL
    struct bie_tensor * num_batches;    // I64, one element on x's device, or NULL: a training call adds 1
                                        // (PyTorch's num_batches_tracked)
};
BIE_API enum bie_status bie_batchnorm_forward(bie_context_t * ctx, const struct bie_batchnorm_desc * desc,
                                              const struct bie_batchnorm_args * args);
// Backward of training-mode batch norm: with xh = (x - mean)*invstd and m = n*hw,
//   grad_beta = sum gy; grad_gamma = sum gy*xh;
//   grad_x = gamma*invstd/m * (m*gy - grad_beta - xh*grad_gamma)   (grad_x may be NULL)
struct bie_batchnorm_backward_args {
    const struct bie_tensor * x;            // [n, c, ...]
    const struct bie_tensor * gamma;        // [c]
    const struct bie_tensor * saved_mean;   // [c], from the training forward
    const struct bie_tensor * saved_invstd; // [c]
    const struct bie_tensor * grad_y;       // like x
    struct bie_tensor * grad_x;             // like x, or NULL
    struct bie_tensor * grad_gamma;         // [c]
    struct bie_tensor * grad_beta;          // [c]
};
BIE_API enum bie_status bie_batchnorm_backward(bie_context_t * ctx, const struct bie_batchnorm_backward_args * args);

// Max-pooling with a k x k window and stride k (no padding; trailing rows/columns that do not
// fill a window are dropped): x [n, c, h, w] -> y [n, c, h/k, w/k], 1 <= k <= min(h, w), x of at
// most 2^31 elements. argmax (I32, y's shape; may be NULL) gets the index in x of each output's
// maximum (the first one on ties; NaN wins).
struct bie_maxpool2d_desc {
    int32_t k;
};
struct bie_maxpool2d_args {
    const struct bie_tensor * x; // [n, c, h, w]
    struct bie_tensor * y;       // [n, c, h/k, w/k]
    struct bie_tensor * argmax;  // I32 [n, c, h/k, w/k], or NULL
};
BIE_API enum bie_status bie_maxpool2d_forward(bie_context_t * ctx, const struct bie_maxpool2d_desc * desc,
                                              const struct bie_maxpool2d_args * args);
// grad_x = 0 except grad_x[argmax[i]] = grad_y[i].
struct bie_maxpool2d_backward_args {
    const struct bie_tensor * grad_y; // [n, c, h/k, w/k]
    const struct bie_tensor * argmax; // I32, grad_y's shape, from the forward
    struct bie_tensor * grad_x;       // [n, c, h, w]
};
BIE_API enum bie_status bie_maxpool2d_backward(bie_context_t * ctx, const struct bie_maxpool2d_desc * desc,
                                               const struct bie_maxpool2d_backward_args * args);

enum bie_activation {
    BIE_ACT_RELU = 0,     // max(x, 0); gradient 1{x > 0}
    BIE_ACT_SIGN = 1,     // +1 if x >= 0 else -1; straight-through gradient 1{|x| <= 1}
    BIE_ACT_HARDTANH = 2, // clamp(x, -1, 1); gradient 1{|x| <= 1}
};
// y = act(x) elementwise, any shape (y's shape is x's); backward: grad_x = grad_y * act'(x).
// y may be x itself (the same data and shape), and grad_x grad_y; other overlaps are refused.
struct bie_activation_args {
    const struct bie_tensor * x;
    struct bie_tensor * y;
};
BIE_API enum bie_status bie_activation_forward(bie_context_t * ctx, enum bie_activation act,
                                               const struct bie_activation_args * args);
struct bie_activation_backward_args {
    const struct bie_tensor * x;
    const struct bie_tensor * grad_y; // x's shape
    struct bie_tensor * grad_x;       // x's shape
};
BIE_API enum bie_status bie_activation_backward(bie_context_t * ctx, enum bie_activation act,
                                                const struct bie_activation_backward_args * args);

// Softmax cross-entropy of logits [n, classes] against integer labels, averaged over n:
//   p = softmax(logits) (max-subtracted, in double); loss = -mean log p[label];
//   grad_logits = (p - onehot(label)) / n (may be NULL); *correct (may be NULL) counts the rows
//   whose first maximal logit is the label. Labels outside [0, classes) are INVALID_ARGUMENT.
struct bie_softmax_cross_entropy_args {
    const struct bie_tensor * logits; // [n, classes]
    const struct bie_tensor * labels; // U8 [n]
    struct bie_tensor * grad_logits;  // [n, classes], or NULL
    double * loss;                    // or NULL
    int64_t * correct;                // or NULL
};
BIE_API enum bie_status bie_softmax_cross_entropy(bie_context_t * ctx,
                                                  const struct bie_softmax_cross_entropy_args * args);

// --- optimizers -------------------------------------------------------------------------------------
// Parameters, gradients and optimizer state are views of one shape (any), dense f32 CPU tensors
// (Diode's weights I8); the state is updated in place and may not overlap the rest.

struct bie_adam_params {
    float lr;           // learning rate of this step (a schedule is the caller's business)
    float beta1, beta2; // 0.9, 0.999
    float eps;          // 1e-8
    float weight_decay; // decoupled (AdamW): p -= lr*weight_decay*p; 0 for none
    float clip;         // > 0: clamp p to [-clip, clip] after the step (latent binary weights)
};
BIE_API void bie_adam_params_default(struct bie_adam_params * p);

// One Adam step (step >= 1 is the step count for the bias corrections):
//   m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
//   p -= lr * (m/(1-b1^step)) / (sqrt(v/(1-b2^step)) + eps);  then weight decay and clip
struct bie_adam_args {
    int64_t step;                   // >= 1
    struct bie_tensor * p;          // the parameters, updated
    const struct bie_tensor * grad; // p's shape
    struct bie_tensor * m;          // p's shape, the first moment, updated
    struct bie_tensor * v;          // p's shape, the second moment, updated
};
BIE_API enum bie_status bie_adam_step(bie_context_t * ctx, const struct bie_adam_params * params,
                                      const struct bie_adam_args * args);

struct bie_diode_params {
    float lr;           // the magnitude of the sign step fed into s
    float beta1, beta2; // Bitorch Engine's defaults: 0.99, 0.9999
};
BIE_API void bie_diode_params_default(struct bie_diode_params * p);

// Diode state initialisation for int8 latent binary weights w: m = 0,
// s = -sign(w) * u with u uniform in [0, 1e-3) from `seed` (splitmix64, one draw per element).
struct bie_diode_init_args {
    uint64_t seed;
    const struct bie_tensor * w; // I8
    struct bie_tensor * m;       // w's shape
    struct bie_tensor * s;       // w's shape
};
BIE_API enum bie_status bie_diode_init(bie_context_t * ctx, const struct bie_diode_init_args * args);
// One Diode step (Bitorch Engine's DiodeMix for binary weights, reference section 9):
//   m = b1*m + (1-b1)*g;  s = b2*s + (1-b2)*sign(m)*lr;  u = -sign(s) (u = +1 where s = 0)
//   w = -w wherever u != sign(w)   (magnitudes never change; the flip count goes to *flips)
struct bie_diode_args {
    struct bie_tensor * w;          // I8, updated
    const struct bie_tensor * grad; // w's shape
    struct bie_tensor * m;          // w's shape, updated
    struct bie_tensor * s;          // w's shape, updated
    int64_t * flips;                // or NULL
};
BIE_API enum bie_status bie_diode_step(bie_context_t * ctx, const struct bie_diode_params * params,
                                       const struct bie_diode_args * args);

// --- model -----------------------------------------------------------------------------------------
// A model is a graph of layers described by an architecture string, one layer per ';'-separated
// item, each reading the previous item's output or the inputs it names ("@J": layer J's output,
// "@input"); docs/model-format.md has the grammar:
//   input C H W                          the input shape (first item)
//   conv Q OUT K [STRIDE [PAD]] [bias]   Q: f32 (float, OpenBLAS), b1, q4 or q8 (bie's layers)
//   linear Q OUT [bias]                  flattens its input
//   bn | maxpool K [S [P]] | avgpool K [S [P]] | adaptive_avgpool OH [OW] | flatten
//   relu | sign | hardtanh | tanh | gelu | gelu_tanh | silu | prelu N | add @J [@I]
// Inference (training = 0) runs from plans: the first call at a batch size validates every layer
// and fixes its route and buffers; later calls at that size allocate nothing and check only the
// views of x and logits.
// Float layers have a weight and a bias; low-bit layers have a latent weight (f32, or int8 with
// the Diode optimizer), bias_a, scale_a (lazily initialised from the first training batch and
// learned) and scale_w (initialised from the weight, then fixed); bn has gamma, beta and running
// statistics. A model loaded from a packed file holds packed weights and can only run forward.

typedef struct bie_model bie_model_t;

enum bie_latent {
    BIE_LATENT_F32 = 0,  // float latent weights trained with Adam (clipped to [-1, 1] for b1)
    BIE_LATENT_INT8 = 1, // int8 latent weights of b1 layers trained with Diode
};

struct bie_model_layer_info {
    const char * kind;   // the item's kind as in the architecture: "conv", "linear", "bn", "add", ...
    const char * quant;  // "f32", "b1", "q4", "q8", or "" for layers without weights
    int64_t in_shape[3]; // C, H, W of the input (per sample)
    int64_t out_shape[3];
    int64_t params;      // number of parameters (weights, biases, scales, bn parameters and statistics)
    int64_t bytes;       // bytes they take in the model's current form (packed if packed)
    int64_t float_bytes; // bytes they would take as float32
};

// Builds a model from an architecture string; weights are initialised from seed.
BIE_API enum bie_status bie_model_create(bie_context_t * ctx, const char * arch, enum bie_latent latent, uint64_t seed,
                                         bie_model_t ** out);
BIE_API void bie_model_destroy(bie_model_t * model);
BIE_API const char * bie_model_arch(const bie_model_t * model);
BIE_API int bie_model_is_packed(const bie_model_t * model);
BIE_API int64_t bie_model_num_layers(const bie_model_t * model);
BIE_API enum bie_status bie_model_layer_info(const bie_model_t * model, int64_t i, struct bie_model_layer_info * out);
// Number of outputs per sample (classes) and inputs per sample (C*H*W).
BIE_API int64_t bie_model_num_outputs(const bie_model_t * model);
BIE_API int64_t bie_model_num_inputs(const bie_model_t * model);
// Bytes of host memory the model's own buffers take for a batch of `batch` samples: every layer's
// output (and, training != 0, its gradient), max-pooling indexes and the largest scratch of one
// float layer. (Each layer call's workspace comes on top, from the context.) bie_model_forward
// refuses a batch whose memory exceeds the context's memory limit (OUT_OF_MEMORY, before any
// allocation), and bie_model_load / bie_model_create refuse a model whose one sample does.
BIE_API enum bie_status bie_model_memory(const bie_model_t * model, int64_t batch, int training, size_t * out_bytes);

// Forward pass over x [n, C, H, W] (or [n, C*H*W]), a dense f32 CPU view with 1 <= n <= 2^20,
// into logits [n, outputs] (dense f32 CPU, overlapping nothing of x). A training forward keeps x's
// data for the backward: it must stay unchanged until bie_model_backward.
struct bie_model_forward_desc {
    int32_t training;     // != 0: batch statistics, and keeps what the backward needs
    int32_t float_layers; // != 0 (inference only): the low-bit layers as float GEMMs over the
                          // dequantized codes (OpenBLAS; the same result, for speed comparisons)
};
struct bie_model_forward_args {
    const struct bie_tensor * x;
    struct bie_tensor * logits;
};
BIE_API enum bie_status bie_model_forward(bie_context_t * ctx, bie_model_t * model,
                                          const struct bie_model_forward_desc * desc,
                                          const struct bie_model_forward_args * args);
// Backward of the last training forward: computes every parameter's gradient from grad_logits
// (dense f32 CPU [n, outputs], n that forward's).
struct bie_model_backward_args {
    const struct bie_tensor * grad_logits;
};
BIE_API enum bie_status bie_model_backward(bie_context_t * ctx, bie_model_t * model,
                                           const struct bie_model_backward_args * args);
// One optimizer step on every parameter: Adam with learning rate lr (weight_decay applies to the
// float layers' weights; bias_a and scale_a, which duplicate batch norm's beta and gamma, use
// lr/10; float latent weights are clipped to [-1, 1] for b1 layers, to the quantizer's range for
// q4/q8), or Diode with diode_lr for int8 latent weights.
struct bie_model_step_desc {
    float lr;
    float weight_decay;
    float diode_lr;
};
BIE_API enum bie_status bie_model_step(bie_context_t * ctx, bie_model_t * model,
                                       const struct bie_model_step_desc * desc);

enum bie_model_file {
    BIE_MODEL_FILE_PACKED = 0,     // inference: packed low-bit weights, scales, bn, float layers
    BIE_MODEL_FILE_CHECKPOINT = 1, // training: latent weights and optimizer state too
};
// Saves the model atomically as safetensors; meta adds n_meta key/value pairs to __metadata__.
BIE_API enum bie_status bie_model_save(bie_context_t * ctx, const bie_model_t * model, const char * path,
                                       enum bie_model_file kind, const char * const * meta, size_t n_meta);
// Loads a packed model or a checkpoint (validating every tensor against the architecture).
// *out_st (may be NULL) receives the parsed file so the caller can read its metadata.
BIE_API enum bie_status bie_model_load(bie_context_t * ctx, const char * path, bie_model_t ** out,
                                       bie_safetensors_t ** out_st);
// The same from a parsed file.
BIE_API enum bie_status bie_model_from_safetensors(bie_context_t * ctx, const bie_safetensors_t * st,
                                                   bie_model_t ** out);

#ifdef __cplusplus
}
#endif
