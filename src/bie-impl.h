// SPDX-License-Identifier: Apache-2.0
// bie-impl.h: internal types shared by the core, the op layer and the backends.
//
// Flow of a layer call: src/ops validates the public arguments once (shapes, dtypes, strides,
// devices, scales) and normalises them into a struct bie_layer_call, in which a linear layer
// is a 1x1 convolution over 1x1 images (x [M, K] becomes the 4-D view [M, K, 1, 1]). It then
// hands the call to a backend (struct bie_backend_ops). Backends never re-validate; they may return
// BIE_DECLINED to hand the call to the next backend (CPU -> reference).
#pragma once

#include "bie.h"
#include "bie-train.h"

#include <stdarg.h>
#include <stdbool.h>

// Internal status: "this backend has no kernel for this case, try the next one". Never public.
#define BIE_DECLINED ((enum bie_status)(-1))

#define BIE_ERROR_CAP 512

// Returns from the calling function with the status of expr unless it is BIE_STATUS_OK.
#define BIE_TRY(expr)                                                                                                  \
    do {                                                                                                               \
        enum bie_status bie_try_status_ = (expr);                                                                      \
        if (bie_try_status_ != BIE_STATUS_OK) return bie_try_status_;                                                  \
    } while (0)

// Returns BIE_STATUS_INVALID_ARGUMENT with a printf-style message; needs `ctx` in scope.
#define BIE_FAIL(...) return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, __VA_ARGS__)

// The status FORMAT_ERROR with a printf-style message, as an expression (the readers of untrusted
// files); needs `ctx` in scope.
#define BIE_FORMAT_ERROR(...) bie_set_error(ctx, BIE_STATUS_FORMAT_ERROR, __VA_ARGS__)

struct bie_cuda_state; // owned by src/cuda (the CUDA plugin)

struct bie_context {
    struct bie_context_params params;
    enum bie_cpu_isa isa;     // after capping by params and BIE_CPU_ISA
    enum bie_cpu_isa isa_cap; // params.max_isa capped by BIE_CPU_ISA (the machine's level aside)
    char error[BIE_ERROR_CAP];
    void * host_ws; // host workspace, grown on demand, 64-byte aligned
    size_t host_ws_size;
    struct bie_cuda_state * cuda; // NULL until the first CUDA call
    size_t mem_limit;             // bie_context_set_memory_limit: most bytes of one workspace or model's activations
    size_t ws_reserved;           // bie_context_reserve's bytes: host workspace up to this size outlives a call
    uintptr_t user;               // the thread inside a public call on this context, or 0 (__atomic builtins)
    int depth;                    // how deeply that thread's public calls nest
};

// Host workspace beyond this size (or beyond what bie_context_reserve asked for) is freed when the
// outermost public call that needed it returns.
#define BIE_WORKSPACE_KEEP ((size_t)256 << 20)

// --- one thread at a time per context ---------------------------------------------------------------
// Every public function taking a context starts with BIE_ENTER(ctx) (after its NULL check): it
// marks the context as used by the calling thread until the function returns (nested public calls
// by the same thread are fine) and clears the context's message. A call from another thread
// meanwhile is refused with INVALID_ARGUMENT and a message of its own, which bie_context_last_error
// returns on the refused thread without touching the owner's message (a context is not thread-safe;
// sharing one gave wrong results before). When the outermost call returns, workspace beyond
// BIE_WORKSPACE_KEEP is released.
struct bie_ctx_guard {
    bie_context_t * ctx;
};
bool bie_ctx_enter(bie_context_t * ctx);
void bie_ctx_leave_guard(struct bie_ctx_guard * g);
enum bie_status bie_ctx_busy(const bie_context_t * ctx);
#define BIE_ENTER(c)                                                                                                   \
    __attribute__((cleanup(bie_ctx_leave_guard))) struct bie_ctx_guard bie_guard_ = {(c)};                             \
    if (bie_guard_.ctx && !bie_ctx_enter(bie_guard_.ctx)) {                                                            \
        bie_guard_.ctx = NULL;                                                                                         \
        return bie_ctx_busy(c);                                                                                        \
    }

// The CPU threads a context's calls use: its num_threads, or OpenMP's default (also for ctx NULL),
// at most BIE_MAX_THREADS.
int bie_context_threads(const bie_context_t * ctx);

// Sets the context's message (printf-style) and returns status. ctx may be NULL.
enum bie_status bie_set_error(bie_context_t * ctx, enum bie_status status, const char * fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void bie_clear_error(bie_context_t * ctx);

// Host workspace of at least `bytes` bytes (64-byte aligned), owned by the context and valid until
// the next call that asks for workspace. Grows (reallocates) when too small; OUT_OF_MEMORY above the
// context's memory limit.
enum bie_status bie_host_workspace(bie_context_t * ctx, size_t bytes, void ** out);

// --- dtypes -------------------------------------------------------------------------------------

bool bie_dtype_valid(enum bie_dtype dtype);
bool bie_dtype_is_float(enum bie_dtype dtype); // f32, f16, bf16 (f64 is accepted by tests only)
// Bits per element (1, 4, 8, 16, 32, 64).
int bie_dtype_bits(enum bie_dtype dtype);

float bie_f16_to_f32(uint16_t h);
uint16_t bie_f32_to_f16(float f); // round to nearest even
float bie_bf16_to_f32(uint16_t h);
uint16_t bie_f32_to_bf16(float f); // round to nearest even, NaN kept quiet

// Round half to even on floats (same result as rintf under the default rounding mode, and as
// CUDA's __float2int_rn / torch.round).
static inline float bie_rne(float v) { return __builtin_rintf(v); }

// Functions that CUDA code takes too (src/cuda compiles this header with nvcc).
#ifdef __CUDACC__
#define BIE_HOST_DEVICE __host__ __device__
#else
#define BIE_HOST_DEVICE
#endif

// The weight scale of bie_weight_scale_init from mean|W| (its formula: src/ops/protocol.c), the one
// form of it that the CPU path and the CUDA kernel both take.
static inline BIE_HOST_DEVICE double bie_weight_scale_of(enum bie_quant q, double mean_abs) {
    if (q == BIE_QUANT_BINARY) return mean_abs;
    if (q == BIE_QUANT_INT4) {
        const double v = 2.0 * mean_abs / 5.6345;
        return v > 1e-5 ? v : 1e-5;
    }
    return 2.0 * mean_abs / 11.269;
}

// min(max(v, -t), t) with a NaN v kept NaN, for t > 0: the clamp of an nn.Hardtanh(-t, t) before a
// layer (bie_forward_args.x_clamp, bie_binarize_ste_clamped).
static inline float bie_clamp_sym(float v, float t) { return v < -t ? -t : v > t ? t : v; }

// --- element access on any view (slow; for the reference and validation) -----------------------

// Offset in elements of a multi-index.
static inline int64_t bie_offset(const struct bie_tensor * t, const int64_t * idx) {
    int64_t off = 0;
    for (int32_t i = 0; i < t->ndim; i++) off += idx[i] * t->stride[i];
    return off;
}
// Reads element `off` of a float, I8, U8, I32 tensor as double; of a B1 tensor as +1/-1; of an S4
// tensor as its integer code.
double bie_load(const struct bie_tensor * t, int64_t off);
// Writes `v` to element `off`, rounding to the dtype (floats: RNE; integers: v must be integral
// and in range; B1: bit = v >= 0; S4: the low 4 bits of the integer v).
void bie_store(const struct bie_tensor * t, int64_t off, double v);
// Reads a host scalar tensor (numel 1) as float.
float bie_load_scalar(const struct bie_tensor * t);

// --- validation helpers -------------------------------------------------------------------------

// Checks that t is a well-formed view: data non-NULL, valid dtype, ndim, shapes > 0, strides >= 0
// (0 only if allow_broadcast), no int64 overflow. `name` is used in the message.
enum bie_status bie_check_tensor(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                                 bool allow_broadcast);

// Refuses outputs (NULL entries and data == NULL skipped) whose elements overlap each other, or
// whose bytes overlap another output's or an input's, with a message naming both.
enum bie_status bie_check_outputs(bie_context_t * ctx, const struct bie_tensor * const * outs,
                                  const char * const * out_names, int n_out, const struct bie_tensor * const * ins,
                                  const char * const * in_names, int n_in);

// --- normalised layer call ----------------------------------------------------------------------

// Geometry of a layer call; a linear layer is a conv with H = W = kh = kw = 1.
struct bie_geometry {
    int64_t batch;     // N (conv) or M (linear, all leading dims flattened)
    int64_t C, H, W;   // input channels / features and spatial size
    int64_t O, OH, OW; // output channels / features and spatial size
    int64_t kh, kw, sh, sw, ph, pw, dh, dw;
    int64_t K; // C * kh * kw: the reduction length
    enum bie_pad_value pad_value;
};

// What a backend reports of a call it is asked to plan (bie_layer_call.plan set): it chooses its
// route, sizes its workspace and describes both, without running anything.
struct bie_plan_info {
    size_t workspace; // device (CUDA) or host bytes the calls will take
    char route[512];  // the backend and its route, in words
};

struct bie_layer_call {
    enum bie_quant quant;
    bool is_conv;
    struct bie_geometry g;
    // 4-D views: x [batch, C, H, W]; weight [O, C, kh, kw]; y / grad_y [batch, O, OH, OW].
    // bias_a / grad_bias_a are 1-D [C]. Absent tensors have data == NULL. x_mask (backward of a
    // binary linear layer whose x is saved B1 bits) is x-shaped B1: 1 where the STE passes;
    // grad_x_mask (with x_mask) x-shaped B1: 0 where grad_x is 0; grad_x_add x-shaped float, added
    // to grad_x last (bie_backward_args).
    struct bie_tensor x, bias_a, weight, y, x_mask, grad_x_mask, grad_x_add;
    struct bie_tensor grad_y, grad_x, grad_weight, grad_bias_a, grad_scale_a;
    // The forward's epilogue (bie_forward_args): out_mul / out_add / out_bits_bias 1-D [O] f32,
    // residual and out_bits (B1) 4-D views shaped like y; absent terms have data == NULL.
    struct bie_tensor out_mul, out_add, residual, out_bits, out_bits_bias;
    // Scales: the user's scalar tensors, and their values when they live on the host.
    struct bie_tensor scale_a_t, scale_w_t;
    bool scales_on_host;
    // A clamp of x before bias_a (bie_forward_args / bie_backward_args.x_clamp): t > 0, or 0.
    float x_clamp;
    float scale_a, scale_w;
    enum bie_device_type device_type;
    int32_t device_index;
    struct bie_plan_info * plan; // non-NULL: plan the call (fill *plan), run nothing
};

// Whether a forward call has an epilogue term (out_mul, out_add, residual or out_bits).
static inline bool bie_layer_has_epilogue(const struct bie_layer_call * c) {
    return c->out_mul.data || c->out_add.data || c->residual.data || c->out_bits.data;
}

// src/ops/layer.c: a layer call validated and normalised (as the public entry points do), and run
// on its backend; shared with the plans (src/ops/plan.c).
enum bie_status bie_layer_prepare_forward(bie_context_t * ctx, const struct bie_linear_desc * lin,
                                          const struct bie_conv2d_desc * conv, const struct bie_forward_args * a,
                                          struct bie_layer_call * c);
enum bie_status bie_layer_prepare_backward(bie_context_t * ctx, const struct bie_linear_desc * lin,
                                           const struct bie_conv2d_desc * conv, const struct bie_backward_args * a,
                                           struct bie_layer_call * c);
enum bie_status bie_layer_run(bie_context_t * ctx, const struct bie_layer_call * c, bool backward);

// Quantization range of an n-bit layer: lo, hi (hi is also the LSQ factor's Qp).
static inline int bie_quant_lo(enum bie_quant q) { return q == BIE_QUANT_INT4 ? -8 : -128; }
static inline int bie_quant_hi(enum bie_quant q) { return q == BIE_QUANT_INT4 ? 7 : 127; }

// --- batched matmul and embedding calls (validated by src/ops/matmul.c and embedding.c) ---------

// A bie_matmul_* call: 3-D views x [B, M, K], y [B, N, K], out and grad_out [B, M, N], grad_x
// [B, M, K], grad_y [B, N, K] (absent tensors have data == NULL); the clips as the layers' scales.
struct bie_matmul_call {
    enum bie_quant quant;
    int64_t B, M, N, K;
    struct bie_tensor x, y, out, grad_out, grad_x, grad_y, grad_x_clip, grad_y_clip;
    struct bie_tensor x_clip_t, y_clip_t;
    bool clips_on_host;
    float x_clip, y_clip;
    enum bie_device_type device_type;
    int32_t device_index;
};

// Batch b of a matmul as a linear layer call (every tensor a view into the matmul's; grad_scale_a
// absent). side 0: x [M, K] against the weight y [N, K] (scale_a = x_clip, scale_w = y_clip; the
// layer's y = out, grad_y = grad_out, grad_x = grad_x). side 1: y [N, K] against the weight x
// (scale_a = y_clip, scale_w = x_clip; grad_y = grad_out transposed, grad_x = grad_y). The
// layer's backward of side 0 gives grad_x, of side 1 grad_y, each with its clip's partial sum as
// grad_scale_a (over the batch's numel instead of the whole tensor's).
void bie_matmul_layer_call(const struct bie_matmul_call * mc, int64_t b, int side, struct bie_layer_call * out);

// A bie_embedding_* call: indices and inverse as 2-D views [R, L] (bag: the bags [R] of L indices;
// else R = all indices, L = 1); table [V, D]; scale [V] (absent: data NULL); out and grad_out
// [R, D]; grad_rows [U, D].
struct bie_embedding_call {
    enum bie_quant quant;
    bool bag;
    int64_t R, L, V, D, U;
    struct bie_tensor indices, inverse, table, scale, out, grad_out, grad_rows;
    enum bie_device_type device_type;
    int32_t device_index;
};

// A bie_affine_maxpool2d_forward call: x [N, C, H, W], y, out_bits and argmax [N, C, OH, OW]
// (out_bits, argmax absent: data NULL), mul, add and bits_bias [C] f32 (absent: data NULL). A
// bie_affine_maxpool2d_backward call: argmax and y (grad_y) [N, C, OH, OW], x (grad_z, written)
// [N, C, H, W].
struct bie_pool_call {
    int32_t kh, kw, sh, sw, ph, pw;
    float lo, hi;
    int64_t N, C, H, W, OH, OW;
    struct bie_tensor x, mul, add, y, out_bits, bits_bias, argmax;
    enum bie_device_type device_type;
    int32_t device_index;
};

// A bie_batchnorm_forward / _backward call on CUDA tensors: x and its likes as [N, C, H, W] views
// (x [N, C] as [N, C, 1, 1], [N, C, L] as [N, C, L, 1]; absent: data NULL), the [C] vectors as 1-D
// views (absent: data NULL). The forward reads x, residual, gamma, beta, running_* and writes y,
// running_* and saved_* (and adds 1 to num_batches); the backward reads x, grad_y, gamma, saved_*
// and writes grad_x, grad_gamma and grad_beta.
struct bie_bn_call {
    int64_t N, C, H, W;
    float momentum, eps;
    int32_t training;
    struct bie_tensor x, y, residual, grad_y, grad_x;
    struct bie_tensor gamma, beta, running_mean, running_var, saved_mean, saved_invstd, grad_gamma, grad_beta;
    int64_t * num_batches; // the forward's batch counter, added 1 to (training only), or NULL
    int32_t device_index;
};

// A backend. Every slot may be NULL (= declined). Slots receive validated arguments.
// The function types of the slots below. A backend declares its slot functions with them
// (`bie_layer_slot bie_ref_layer_forward, bie_ref_layer_backward;`), so that each signature is
// written once.
typedef enum bie_status bie_layer_slot(bie_context_t * ctx, const struct bie_layer_call * call);
typedef enum bie_status bie_pack_slot(bie_context_t * ctx, const struct bie_tensor * src, float scale,
                                      const struct bie_tensor * dst);
typedef enum bie_status bie_reduce_slot(bie_context_t * ctx, const struct bie_tensor * x, double * sum_abs,
                                        double * sum);
// out (one f32, f16 or bf16 element on w's device) = bie_weight_scale_of(quant, mean|w|), rounded to
// f32 and then to out's dtype, queued on the device without waiting for it.
typedef enum bie_status bie_scale_slot(bie_context_t * ctx, enum bie_quant quant, const struct bie_tensor * w,
                                       const struct bie_tensor * out);
// bie_binarize_ste's outputs (each a [M, K, 1, 1] B1 view or NULL) and its clamp (0: none; else x
// is clamped to [-clamp, clamp] first and clamp_mask gets 1{|x| < clamp}: bie_binarize_ste_clamped).
struct bie_ste_out {
    const struct bie_tensor *bits, *mask, *clamp_mask;
    float clamp;
};
typedef enum bie_status bie_ste_slot(bie_context_t * ctx, const struct bie_layer_call * call,
                                     const struct bie_ste_out * out);
typedef enum bie_status bie_matmul_slot(bie_context_t * ctx, const struct bie_matmul_call * call);
typedef enum bie_status bie_embedding_slot(bie_context_t * ctx, const struct bie_embedding_call * call);
typedef enum bie_status bie_pool_slot(bie_context_t * ctx, const struct bie_pool_call * call);

struct bie_backend_ops {
    const char * name;
    bie_layer_slot * layer_forward;
    bie_layer_slot * layer_backward;
    // dst = pack(src / scale) per bie_pack (scale 1 when the user gave none).
    bie_pack_slot * pack;
    bie_pack_slot * unpack;
    // bie_binarize_ste: call is the x side of a binary linear layer (x [M, K, 1, 1], bias_a, scale_a,
    // device; g.batch = M, g.C = g.K = K; no scale_a, read as 0, only when mask is NULL); bits and
    // mask are [M, K, 1, 1] B1 views or NULL.
    bie_ste_slot * binarize_ste;
    bie_matmul_slot * matmul_forward;
    bie_matmul_slot * matmul_backward;
    bie_embedding_slot * embedding_forward;
    bie_embedding_slot * embedding_backward;
    // The optional slots (NULL: the reference does it).
    // Sums over all elements: *sum_abs = sum|x|, *sum = sum x (in double).
    bie_reduce_slot * reduce;
    // bie_weight_scale_init into a tensor on the device (see bie_scale_slot).
    bie_scale_slot * weight_scale;
    bie_pool_slot * affine_maxpool2d;
    bie_pool_slot * affine_maxpool2d_backward;
};
// The slots every backend has, in the struct's order (C++ takes designated initializers in order
// only), filled from its functions named <p>_<slot> (bie_ref_pack, ...); a table adds the optional
// ones after them by name.
#define BIE_BACKEND_SLOTS(p)                                                                                           \
    .layer_forward = p##_layer_forward, .layer_backward = p##_layer_backward, .pack = p##_pack, .unpack = p##_unpack,  \
    .binarize_ste = p##_binarize_ste, .matmul_forward = p##_matmul_forward, .matmul_backward = p##_matmul_backward,    \
    .embedding_forward = p##_embedding_forward, .embedding_backward = p##_embedding_backward

// Runs a validated call on the backends its device may use: CUDA tensors on the CUDA backend only
// (UNSUPPORTED when it declines or the build has none); CPU tensors on the CPU backend, then the
// reference where it declines (the reference only, for a BIE_BACKEND_REF context). run(ctx, b, job)
// calls backend b's slot for job (BIE_DECLINED when b has none); `what` names the call in the
// messages ("this binary matmul forward"). Clears the context's message on success.
typedef enum bie_status (*bie_slot_runner)(bie_context_t * ctx, const struct bie_backend_ops * b, const void * job);
enum bie_status bie_dispatch(bie_context_t * ctx, enum bie_device_type device, bie_slot_runner run, const void * job,
                             const char * what);

extern const struct bie_backend_ops bie_ref_backend;
extern const struct bie_backend_ops bie_cpu_backend;
// The CUDA backend's slots are reached through its plugin's table (bie-cuda-plugin.h).

// CPU ISA detection (src/core/cpu-isa.c).
enum bie_cpu_isa bie_cpu_isa_cap_from_env(enum bie_cpu_isa isa);
// Whether kernels may use AVX512-VNNI under the cap `cap` (a context's isa_cap): the machine has it
// and the cap is BIE_CPU_ISA_AVX512_VNNI or above. (Some AVX-512 machines have it without the
// VPOPCNT level: the weight-quantised layers use it there, under the AVX512 level.)
bool bie_cpu_has_vnni(enum bie_cpu_isa cap);

// Advances a multi-index over t's shape (row-major order); false once it wraps to all zeros.
// Start with idx all zeros; a 0-dim tensor yields exactly one index.
static inline bool bie_next_index(const struct bie_tensor * t, int64_t * idx) {
    for (int32_t i = t->ndim - 1; i >= 0; i--) {
        if (++idx[i] < t->shape[i]) return true;
        idx[i] = 0;
    }
    return false;
}
