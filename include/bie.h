// SPDX-License-Identifier: Apache-2.0
// bie.h: the public C API of libbie, a C engine for low-bit (binary, 4-bit, 8-bit) linear and
// conv2d layers, forward and backward, on CPUs and (optionally) NVIDIA GPUs: contexts, tensors,
// layers and packing. The training module (model files, data files, float building blocks,
// optimizers and models) is declared in bie-train.h.
//
// Conventions that hold for every function below:
// - Every function returns enum bie_status (BIE_STATUS_OK = 0) unless it is a pure query.
//   On failure a readable message naming the argument is left in the context
//   (bie_context_last_error). The library never aborts, exits or prints.
// - Tensors are non-owning views (struct bie_tensor). Logical order follows PyTorch: NCHW
//   activations, [out, in] and [O, C, kh, kw] weights. Strides are in ELEMENTS, so a
//   channels-last tensor is an NCHW view with stride[1] == 1.
// - Packed dtypes are addressed by element too: a BIE_DTYPE_B1 tensor is an array of bits
//   (element offset e lives in bit e % 8 of byte e / 8, least-significant bit first) and a
//   BIE_DTYPE_S4 tensor an array of 4-bit two's-complement nibbles (element offset e lives in
//   byte e / 2, in the HIGH nibble when e is even). The public interchange formats
//   (docs/formats.md) are such views with rows padded to whole bytes.
// - A context is not thread-safe: use one context per thread (a context may move between threads
//   between calls). A call made while another thread is inside a call on the same context is
//   refused with INVALID_ARGUMENT (its message is readable from the refused thread).
// - Numerical contract (docs/semantics.md): sign(v) = +1 if v >= 0 else -1; integer
//   accumulations are exact and identical on every backend; rounding to integers is
//   round-half-to-even; float outputs are (float)acc * (scale_a * scale_w) rounded to the
//   output dtype.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define BIE_API __declspec(dllexport)
#else
#define BIE_API __attribute__((visibility("default")))
#endif

#define BIE_VERSION_MAJOR 0
#define BIE_VERSION_MINOR 1
#define BIE_VERSION_PATCH 0
#define BIE_VERSION_STRING "0.1.0"

#define BIE_MAX_DIMS 8

//
// Status, dtypes, devices
//

enum bie_status {
    BIE_STATUS_OK = 0,
    BIE_STATUS_INVALID_ARGUMENT = 1, // NULL pointer, bad shape/stride/dtype/scale, buffer too small
    BIE_STATUS_UNSUPPORTED = 2,      // valid request, no implementation on this build/backend
    BIE_STATUS_OUT_OF_MEMORY = 3,
    BIE_STATUS_DEVICE_ERROR = 4, // a CUDA call failed (message holds the CUDA error)
    BIE_STATUS_IO_ERROR = 5,     // a file could not be opened, read or written
    BIE_STATUS_FORMAT_ERROR = 6, // a file is corrupt, truncated or of the wrong kind
    BIE_STATUS_INTERNAL = 7,     // a bug in bie: please report it
};

// Static English name of a status ("ok", "invalid argument", ...). Never NULL.
BIE_API const char * bie_status_string(enum bie_status status);

enum bie_dtype {
    BIE_DTYPE_F32 = 0,
    BIE_DTYPE_F16 = 1,  // IEEE binary16
    BIE_DTYPE_BF16 = 2, // bfloat16
    BIE_DTYPE_I8 = 3,
    BIE_DTYPE_U8 = 4, // raw bytes
    BIE_DTYPE_I32 = 5,
    BIE_DTYPE_B1 = 6, // packed bits, 1 <-> +1, 0 <-> -1, LSB first
    BIE_DTYPE_S4 = 7, // packed 4-bit two's complement, even element in the high nibble
    BIE_DTYPE_F64 = 8,
    BIE_DTYPE_I64 = 9, // indices (bie_embedding_*) only
};

// Static name of a dtype ("f32", "b1", ...); "?" for an unknown value.
BIE_API const char * bie_dtype_name(enum bie_dtype dtype);

enum bie_device_type {
    BIE_DEVICE_CPU = 0,
    BIE_DEVICE_CUDA = 1,
};

// A non-owning tensor view. shape[i] > 0 for i < ndim (ndim may be 0: a scalar).
// stride[i] is in elements (bits for B1, nibbles for S4) and may be any non-negative value;
// a stride of 0 (broadcast) is accepted for inputs only.
struct bie_tensor {
    void * data;
    enum bie_dtype dtype;
    int32_t ndim;
    int64_t shape[BIE_MAX_DIMS];
    int64_t stride[BIE_MAX_DIMS];
    enum bie_device_type device_type;
    int32_t device_index; // CUDA device ordinal; 0 for the CPU
};

// Fills *t as a dense row-major CPU view of `data`. For B1 and S4 the innermost dimension is
// padded to whole bytes: stride[ndim-2] = 8*ceil(shape[ndim-1]/8) bits (B1) or
// 2*ceil(shape[ndim-1]/2) nibbles (S4). This is the public packed interchange format.
// Returns INVALID_ARGUMENT for ndim outside [0, BIE_MAX_DIMS], a shape <= 0 or an overflow.
BIE_API enum bie_status bie_tensor_make(struct bie_tensor * t, void * data, enum bie_dtype dtype, int32_t ndim,
                                        const int64_t * shape);

// Reorders the dimensions of a view in place: new dim i is old dim perm[i].
// Example: bie_tensor_make(shape = {N, H, W, C}) then perm {0, 3, 1, 2} gives the NCHW view of
// channels-last memory.
BIE_API enum bie_status bie_tensor_permute(struct bie_tensor * t, const int32_t * perm);

// Bytes spanned by the view (from data to one past its last element, rounded up to a byte).
BIE_API enum bie_status bie_tensor_nbytes(const struct bie_tensor * t, size_t * out_bytes);

// Number of elements (product of the shape; 1 for a scalar); -1 when the product overflows int64 or
// a dimension is negative.
BIE_API int64_t bie_tensor_numel(const struct bie_tensor * t);

//
// Context
//

enum bie_backend {
    BIE_BACKEND_AUTO = 0, // CUDA tensors -> CUDA backend; CPU tensors -> optimised CPU backend
    BIE_BACKEND_REF = 1,  // plain-C reference for CPU tensors (the specification; slow)
    BIE_BACKEND_CPU = 2,  // optimised CPU backend (falls back to the reference where it has no kernel)
    BIE_BACKEND_CUDA = 3,
};

// Caps the CPU instruction set used by the optimised CPU backend. The environment variable
// BIE_CPU_ISA=NAME (a level's name, bie_cpu_isa_name) caps it too (the lower of the two wins).
// The levels are ordered, each with the instructions of the ones below it. Later versions may add
// levels between the last one and BIE_CPU_ISA_BEST (and name them): a program that lets its user
// choose one should take the name and convert it with bie_cpu_isa_from_name rather than list the
// values itself.
enum bie_cpu_isa {
    BIE_CPU_ISA_SCALAR = 0,
    BIE_CPU_ISA_AVX2 = 1,
    BIE_CPU_ISA_AVX512 = 2,         // AVX-512 F/BW/VL ("avx512")
    BIE_CPU_ISA_AVX512_VPOPCNT = 3, // plus VPOPCNTDQ and BITALG ("avx512vpopcnt")
    BIE_CPU_ISA_AVX512_VNNI = 4,    // plus AVX512-VNNI, the n-bit dot products on bytes ("avx512vnni")
    BIE_CPU_ISA_BEST = 100,
};

struct bie_context_params {
    enum bie_backend backend; // BIE_BACKEND_AUTO by default
    int32_t num_threads;      // CPU threads; <= 0: OpenMP's default; at most BIE_MAX_THREADS
    enum bie_cpu_isa max_isa; // BIE_CPU_ISA_BEST by default
};

typedef struct bie_context bie_context_t;

// Defaults: AUTO backend, OpenMP's thread count, best ISA.
BIE_API void bie_context_params_default(struct bie_context_params * params);

// Creates a context. params may be NULL (defaults). On failure *out_ctx is NULL.
BIE_API enum bie_status bie_context_create(const struct bie_context_params * params, bie_context_t ** out_ctx);

// Frees the context and its workspaces. NULL is accepted.
BIE_API void bie_context_destroy(bie_context_t * ctx);

// The message of the last failed call on this context ("" after a success). Valid until the next
// call on the context. Never NULL; accepts NULL (returns a static message).
BIE_API const char * bie_context_last_error(const bie_context_t * ctx);

BIE_API enum bie_status bie_context_set_backend(bie_context_t * ctx, enum bie_backend backend);
BIE_API enum bie_status bie_context_set_num_threads(bie_context_t * ctx, int32_t num_threads);

// The ISA the CPU backend of this context uses after capping, and its name.
BIE_API enum bie_cpu_isa bie_context_cpu_isa(const bie_context_t * ctx);
BIE_API const char * bie_cpu_isa_name(enum bie_cpu_isa isa);
// The level named `name` ("scalar", "avx2", ..., "best"; see bie_cpu_isa_name) into *out;
// BIE_STATUS_INVALID_ARGUMENT for a name that names none (*out unchanged).
BIE_API enum bie_status bie_cpu_isa_from_name(const char * name, enum bie_cpu_isa * out);

// Reserves workspace so later calls with shapes up to this size do not allocate.
BIE_API enum bie_status bie_context_reserve(bie_context_t * ctx, enum bie_device_type device, size_t bytes);

// The most CPU threads a context uses: a larger num_threads is INVALID_ARGUMENT, and OpenMP's
// default is capped to it. (OpenMP ends the process when it cannot create the threads it was asked
// for, so the count is bounded before it gets there.)
#define BIE_MAX_THREADS 1024

// The memory limit of a new context: 4 GiB.
#define BIE_DEFAULT_MEMORY_LIMIT ((size_t)4 << 30)

// Caps the host memory of one call's workspace, and of the activations (and gradients) of one model
// run with this context (bie_model_memory). A call that would need more returns OUT_OF_MEMORY
// naming both sizes; a model file whose activations for a single sample exceed the limit is
// refused on load. bytes = 0 restores BIE_DEFAULT_MEMORY_LIMIT. docs/limits.md lists every limit.
BIE_API enum bie_status bie_context_set_memory_limit(bie_context_t * ctx, size_t bytes);
BIE_API size_t bie_context_memory_limit(const bie_context_t * ctx);

// Frees the context's host workspace now (later calls allocate again). Host workspace larger than
// 256 MiB, or than bie_context_reserve asked for, is also freed when the call that needed it returns.
BIE_API enum bie_status bie_context_release_workspace(bie_context_t * ctx);

//
// Version and capabilities
//

// Library version; any pointer may be NULL.
BIE_API void bie_version(int * major, int * minor, int * patch);
BIE_API const char * bie_version_string(void);

// 1 if the backend can run here, else 0. CUDA needs the CUDA plugin (libbie-cuda.so, opened at
// run time: libbie itself links no CUDA library), the CUDA libraries it links, and a GPU.
BIE_API int bie_backend_available(enum bie_backend backend);

// Why bie_backend_available(backend) is 0, in words (the plugin is not installed; a CUDA library
// is missing, as the dynamic loader put it; no CUDA device), or NULL when the backend is
// available. The string is static. BIE_CUDA_PLUGIN=PATH makes libbie open that plugin file only.
BIE_API const char * bie_backend_unavailable_reason(enum bie_backend backend);

// The best CPU ISA that this machine and build support (before any cap).
BIE_API enum bie_cpu_isa bie_cpu_isa_detected(void);

//
// Layers
//
// Shared notation (docs/semantics.md has the full equations):
//   x' = x + bias_a (bias_a broadcast along the feature / channel axis; computed in f32)
//   binary:  a = sign(x'),                     w = sign(W)
//   n-bit :  a = clamp(rne(x'/scale_a), lo, hi), w = clamp(rne(W/scale_w), lo, hi)
//            (4-bit: [-8, 7]; 8-bit: [-128, 127])
//   acc = integer dot product / cross-correlation of a and w (exact, int32)
//   y   = (float)acc * (scale_a * scale_w), rounded to y's dtype
//

enum bie_quant {
    BIE_QUANT_BINARY = 1,
    BIE_QUANT_INT4 = 4,
    BIE_QUANT_INT8 = 8,
};

// Value used for the spatial padding of a binary conv (n-bit convs always pad with 0).
enum bie_pad_value {
    BIE_PAD_ZERO = 0,      // padded taps contribute 0: the float conv of the +-1 tensors
    BIE_PAD_MINUS_ONE = 1, // padded taps are -1 (Bitorch Engine's CPU conv)
    BIE_PAD_PLUS_ONE = 2,  // padded taps are +1
};

struct bie_linear_desc {
    enum bie_quant quant;
    int64_t in_features;  // K
    int64_t out_features; // N
};

struct bie_conv2d_desc {
    enum bie_quant quant;
    int64_t in_channels;  // C
    int64_t out_channels; // O
    int32_t kernel[2];    // kh, kw
    int32_t stride[2];    // >= 1
    int32_t padding[2];   // >= 0
    int32_t dilation[2];  // >= 1
    int32_t groups;       // must be 1
    enum bie_pad_value pad_value;
};

// Forward arguments. Linear: x is [..., K] (any rank >= 1, flattened to [M, K]); y is
// [..., N] with the same leading shape. Conv: x is [N, C, H, W], y is [N, O, Ho, Wo] with
// Ho = (H + 2*ph - dh*(kh-1) - 1)/sh + 1 (likewise Wo).
//   x      : f32, f16 or bf16; or B1 for binary layers (already binarized; bias_a must be NULL)
//   bias_a : [K] or [C] float, or NULL
//   weight : [N, K] or [O, C, kh, kw]: f32/f16/bf16 (quantized on the fly), I8 (binary: int8
//            latent weight, its sign is used; n-bit: the integer codes, clamped), or packed
//            (B1 for binary, S4 for 4-bit)
//   scale_a, scale_w: scalars (numel 1) of f32/f16/bf16, finite and > 0
//   y      : f32/f16/bf16 (scaled), I32 (raw acc, unscaled) or, for binary layers, B1
//            (sign(acc) packed: the input of the next binary layer without a float round trip)
// Optional output epilogue (each term NULL when unused; with any term y must be f32/f16/bf16): a
// per-feature affine map and a residual, applied in the same call (an inference BatchNorm folded
// into the layer, then the shortcut of a residual block). With v the scaled output above, rounded
// to y's dtype as it would be stored without the epilogue,
//   y[.., o, ..] = round_y(((f32(v) * out_mul[o]) + out_add[o]) + f32(residual[.., o, ..]))
// each f32 product and sum rounded on its own, the step of a NULL term skipped.
//   out_mul, out_add : [N] / [O] f32
//   residual         : shaped like y, of y's dtype, any strides; may not share bytes with y
// Optional sign bits of the output (the input of a following binary layer, packed in the same
// pass; y must be f32/f16/bf16): out_bits (B1, shaped like y) gets, for every element,
//   bit = f32(y) + f32(out_bits_bias[o]) >= 0       (out_bits_bias NULL: f32(y) >= 0; NaN: 0)
// with y as stored (after any epilogue): the bits that layer would make of y with that bias_a.
//   out_bits_bias    : [N] / [O] f32, or NULL
// Optional clamp of a float x (an nn.Hardtanh(-t, t) before the layer, applied in the same pass):
// with x_clamp = t (finite, > 0) every element of x is read as
//   min(max(f32(x), -t), t)                         (NaN stays NaN)
// before bias_a is added; 0 leaves x as it is. Not with a B1 x.
struct bie_forward_args {
    const struct bie_tensor * x;
    const struct bie_tensor * bias_a;
    const struct bie_tensor * weight;
    const struct bie_tensor * scale_a;
    const struct bie_tensor * scale_w;
    struct bie_tensor * y;
    const struct bie_tensor * out_mul;
    const struct bie_tensor * out_add;
    const struct bie_tensor * residual;
    struct bie_tensor * out_bits;
    const struct bie_tensor * out_bits_bias;
    float x_clamp;
};

// Backward arguments: the same x, bias_a, weight and scales as the forward, grad_y shaped like y
// (float), and the gradients to write (each may be NULL; each is overwritten, not accumulated):
//   grad_x       like x (float)
//   grad_weight  [N, K] / [O, C, kh, kw] float
//   grad_scale_a scalar float
//   grad_bias_a  [K] / [C] float (the sum of grad_x over all other axes)
// x is float, or (binary linear layers only) the B1 bits that bie_binarize_ste saved from it: then
// bias_a must be NULL (it is in the bits already) and x_mask, the STE mask saved with them (B1,
// shaped like x), is required whenever grad_x, grad_scale_a or grad_bias_a is asked for
// (grad_weight alone needs the bits only). Every gradient is then the same number, to the bit, as
// from the float x on the same backend. With a float x, x_mask must be NULL. (CUDA reads bits and
// x_mask for grad_x in rows that start on whole bytes, as bie_tensor_make lays them out; other
// views are UNSUPPORTED there.)
// grad_x_mask (optional, B1 shaped like x, with a B1 x only) gates grad_x alone: where its bit is 0,
// grad_x is 0, while grad_scale_a and grad_bias_a stay those of the layer. It is the 0/1 derivative
// of an elementwise activation that ran before the layer and whose output the bits were taken of
// (a Hardtanh's 1{lo < x < hi}), so that grad_x is the gradient of the activation's input.
// grad_x_add (optional, float, shaped like x, with grad_x) is a gradient x receives from elsewhere
// (a shortcut around the layer), added last: grad_x = round(f32(round(grad_x)) + f32(grad_x_add)) in
// grad_x's dtype, the sum an add after the call would give. It may not overlap grad_x.
// x_clamp = t (finite, > 0; a float x only) is the forward's: x is read as min(max(f32(x), -t), t)
// (NaN stays NaN) before bias_a, and grad_x is the gradient of x itself, the clamp's derivative
// 1{|x| < t} (0 at +-t and for NaN) applied to it after grad_scale_a and grad_bias_a are taken,
// as grad_x_mask is; 0 leaves x as it is.
struct bie_backward_args {
    const struct bie_tensor * x;
    const struct bie_tensor * bias_a;
    const struct bie_tensor * weight;
    const struct bie_tensor * scale_a;
    const struct bie_tensor * scale_w;
    const struct bie_tensor * grad_y;
    struct bie_tensor * grad_x;
    struct bie_tensor * grad_weight;
    struct bie_tensor * grad_scale_a;
    struct bie_tensor * grad_bias_a;
    const struct bie_tensor * x_mask;
    const struct bie_tensor * grad_x_mask;
    const struct bie_tensor * grad_x_add;
    float x_clamp;
};

// Binary, 4-bit or 8-bit linear layer, forward: y = scale_a*scale_w * (a . w^T).
BIE_API enum bie_status bie_linear_forward(bie_context_t * ctx, const struct bie_linear_desc * desc,
                                           const struct bie_forward_args * args);

// Backward of bie_linear_forward (straight-through estimator; docs/semantics.md):
//   binary: grad_x = (g @ (w*scale_w)) * 1{|x'/scale_a| <= 1}
//           grad_W = g^T @ (a*scale_a)
//           grad_scale_a = sum(grad_x * a) / sqrt(numel(x))
//   n-bit : r = x'/scale_a, mid = 1{lo <= r <= hi}, gx = g @ (w*scale_w)
//           grad_x = gx * mid,  grad_W = g^T @ (a*scale_a)
//           grad_scale_a = sum(gx * (lo*1{r<lo} + hi*1{r>hi} + mid*(rne(r)-r))) / sqrt(numel(x)*hi)
BIE_API enum bie_status bie_linear_backward(bie_context_t * ctx, const struct bie_linear_desc * desc,
                                            const struct bie_backward_args * args);

// What the backward of a binary linear layer needs from its input, in 2 bits per element instead
// of x itself (a training step then reads x once: bits feeds bie_linear_forward as a B1 x, and
// bits with mask feed bie_linear_backward as x and x_mask):
//   x'      = f32(x) + f32(bias_a[k])            (bias_a NULL: x' = f32(x))
//   bits[i] = x'[i] >= 0                         (the sign bits the forward packs; NaN -> 0)
//   mask[i] = |x'[i] / scale_a| <= 1             (the STE's pass test, f32 division; NaN -> 0)
// x is f32, f16 or bf16 [..., K] with the features on the last axis (the linear layout); bias_a
// is [K] or NULL; bits and mask are B1 tensors shaped like x (either may be NULL, not both; each
// element's bit is written, the other bits of its bytes keep their content); scale_a is a scalar
// as in the layer calls (it may be NULL when mask is NULL).
BIE_API enum bie_status bie_binarize_ste(bie_context_t * ctx, const struct bie_tensor * x,
                                         const struct bie_tensor * bias_a, const struct bie_tensor * scale_a,
                                         struct bie_tensor * bits, struct bie_tensor * mask);

// bie_binarize_ste of a clamp of x, for a binary layer behind an elementwise clamp to [-clamp,
// clamp] (an nn.Hardtanh), in one pass over x:
//   h             = min(max(f32(x), -clamp), clamp)  (NaN stays NaN)
//   bits, mask    = bie_binarize_ste of h             (x' = h + f32(bias_a[k]))
//   clamp_mask[i] = |f32(x[i])| < clamp               (the clamp's derivative; NaN -> 0)
// clamp is finite and > 0; clamp_mask is a B1 tensor shaped like x, as bits and mask are; any of
// the three may be NULL, not all. clamp_mask is what the layer's backward takes as grad_x_mask.
BIE_API enum bie_status bie_binarize_ste_clamped(bie_context_t * ctx, const struct bie_tensor * x, float clamp,
                                                 const struct bie_tensor * bias_a, const struct bie_tensor * scale_a,
                                                 struct bie_tensor * bits, struct bie_tensor * mask,
                                                 struct bie_tensor * clamp_mask);

// Binary, 4-bit or 8-bit conv2d (cross-correlation, as PyTorch), forward.
BIE_API enum bie_status bie_conv2d_forward(bie_context_t * ctx, const struct bie_conv2d_desc * desc,
                                           const struct bie_forward_args * args);

// Backward of bie_conv2d_forward: the exact gradients of the forward under the same
// surrogate as the linear layer (padded taps contribute to grad_weight with their pad value).
BIE_API enum bie_status bie_conv2d_backward(bie_context_t * ctx, const struct bie_conv2d_desc * desc,
                                            const struct bie_backward_args * args);

// Output spatial size of a conv; INVALID_ARGUMENT if it would be < 1.
BIE_API enum bie_status bie_conv2d_output_size(const struct bie_conv2d_desc * desc, int64_t h, int64_t w,
                                               int64_t * out_h, int64_t * out_w);

//
// Planned layer calls
//
// A plan is made once per layer, shape, dtype, layout and device: it validates the call as the
// entry points above do, chooses the backend and its route, and sizes the workspace (a CUDA plan
// grows its context's device workspace to it, so that executions never allocate). Executing it
// takes arguments that differ from the planned ones only in their data pointers and the values of
// host scales: the views are compared with the plan's (INVALID_ARGUMENT names the first that
// differs), and the call goes straight to the planned route. A plan holds no context state: any
// context of the same device may execute it, from any thread (one context per thread, as always).
// A data pointer whose alignment (address mod 16) differs from the planned one is accepted and
// takes the full entry point, which chooses its route again.

typedef struct bie_plan bie_plan_t;

// Plans a call with the arguments of a representative call (their data is not read).
BIE_API enum bie_status bie_plan_linear_forward(bie_context_t * ctx, const struct bie_linear_desc * desc,
                                                const struct bie_forward_args * args, bie_plan_t ** out);
BIE_API enum bie_status bie_plan_conv2d_forward(bie_context_t * ctx, const struct bie_conv2d_desc * desc,
                                                const struct bie_forward_args * args, bie_plan_t ** out);
BIE_API enum bie_status bie_plan_linear_backward(bie_context_t * ctx, const struct bie_linear_desc * desc,
                                                 const struct bie_backward_args * args, bie_plan_t ** out);
BIE_API enum bie_status bie_plan_conv2d_backward(bie_context_t * ctx, const struct bie_conv2d_desc * desc,
                                                 const struct bie_backward_args * args, bie_plan_t ** out);

// Executes a forward (backward) plan: the same result as the planned entry point on these args.
BIE_API enum bie_status bie_plan_forward(bie_context_t * ctx, const bie_plan_t * plan,
                                         const struct bie_forward_args * args);
BIE_API enum bie_status bie_plan_backward(bie_context_t * ctx, const bie_plan_t * plan,
                                          const struct bie_backward_args * args);

// The plan in words: the layer, each tensor (dtype, shape, strides, device), the backend and its
// route, and the workspace. Valid until the plan is destroyed; never NULL.
BIE_API const char * bie_plan_describe(const bie_plan_t * plan);
// Bytes of workspace the plan's executions take on its device.
BIE_API size_t bie_plan_workspace_size(const bie_plan_t * plan);
// Frees the plan. NULL is accepted.
BIE_API void bie_plan_destroy(bie_plan_t * plan);

//
// Packing and quantization utilities (any device the context's build supports)
//

// Converts src to the packed/quantized dtype of dst (shapes must be equal):
//   dst B1: bit = (src >= 0); src float or I8; scale must be NULL
//   dst S4: q = clamp(rne(src/scale), -8, 7); src float (scale NULL means 1) or I8 (clamped,
//           scale must be NULL)
//   dst I8: q = clamp(rne(src/scale), -128, 127); src float (scale NULL means 1)
BIE_API enum bie_status bie_pack(bie_context_t * ctx, const struct bie_tensor * src, const struct bie_tensor * scale,
                                 struct bie_tensor * dst);

// The inverse: dst (f32/f16/bf16/I8, same shape) = value * scale, where value is +-1 (B1) or
// the integer code (S4, I8); scale NULL means 1; an I8 dst needs scale NULL.
BIE_API enum bie_status bie_unpack(bie_context_t * ctx, const struct bie_tensor * src, const struct bie_tensor * scale,
                                   struct bie_tensor * dst);

//
// Layer protocol helpers (Bitorch Engine's prepare_params / lazy scale initialisation)
//

// Initial activation scale from the first input x (before bias_a), written to the scalar
// out_scale: binary 2*mean|x| (4*mean|x| when symmetric == 0); 4/8-bit 2*mean|x|/11.269.
BIE_API enum bie_status bie_activation_scale_init(bie_context_t * ctx, enum bie_quant quant, int symmetric,
                                                  const struct bie_tensor * x, struct bie_tensor * out_scale);

// Weight scale: binary mean|W|; 4-bit max(2*mean|W|/5.6345, 1e-5); 8-bit 2*mean|W|/11.269, summed in
// double and rounded to f32, then to out_scale's dtype (one f32, f16 or bf16 element). out_scale is
// a CPU tensor (a CUDA w is read back: the call waits for its device), or, for a CUDA w, one on w's
// device: the scale is then computed there, queued on the context's stream without a wait (a
// training step takes it each time its weight changes, and bie_cuda_record_begin can record it),
// and the same w gives the same bits each time; an all-zero or non-finite w is refused only with a
// CPU out_scale (on the device it gives what the formula gives).
BIE_API enum bie_status bie_weight_scale_init(bie_context_t * ctx, enum bie_quant quant, const struct bie_tensor * w,
                                              struct bie_tensor * out_scale);

// int8 latent binary weight (prepare_params): c = W - mean(W); q = rne(c * 127 / max|c|)
// (symmetric, max-abs); q == 0 becomes sign(c) (+1 for c >= 0). All-zero c gives all +1.
BIE_API enum bie_status bie_weight_to_latent_int8(bie_context_t * ctx, const struct bie_tensor * w,
                                                  struct bie_tensor * out_i8);

//
// Batched matmul of two activations, and embeddings with packed tables (Bitorch Engine's
// BinaryMatMul, Q4MatMul and Q8MatMul; BinaryEmbeddingCuda and BinaryEmbeddingBag; n-bit tables)
//

// Batched matmul of two activations, as Bitorch Engine's *MatMul modules define it:
//   x [..., M, K], y [..., N, K] (the same leading dims, flattened into B batches; at least 2
//   dims each), out [..., M, N]:
//   a = codes of x under x_clip, b = codes of y under y_clip (the layers' activation codes:
//       binary sign(v) (sign(0) = +1, NaN -> -1); n-bit clamp(rne(v/clip), lo, hi))
//   acc[.., m, n] = sum_k a[.., m, k] * b[.., n, k]     (exact, int32)
//   out = (float)acc * (x_clip * y_clip), rounded to out's dtype; I32 out: acc
// i.e. torch.matmul(x, y.transpose(-1, -2)) of the quantized operands. A y held as [..., K, N]
// is passed as its transposed view (strides swapped). x and y are f32, f16 or bf16 of any
// strides whose leading dims flatten into one batch dimension; x_clip and y_clip are scalars as
// the layers' scale_a (host or device).
struct bie_matmul_desc {
    enum bie_quant quant;
};

struct bie_matmul_args {
    const struct bie_tensor * x;
    const struct bie_tensor * y;
    const struct bie_tensor * x_clip;
    const struct bie_tensor * y_clip;
    struct bie_tensor * out;
};

// Backward (the layers' straight-through estimator applied to each operand; g = grad_out;
// each output optional, overwritten; sums in double in the reference):
//   gx = y_clip * g @ b,   gy = x_clip * g^T @ a          (per batch)
//   binary: grad_x = gx * 1{|x/x_clip| <= 1}, grad_x_clip = sum(grad_x * a) / sqrt(numel(x))
//   n-bit : r = x/x_clip, mid = 1{lo <= r <= hi}, grad_x = gx * mid,
//           grad_x_clip = sum(gx * (lo*1{r<lo} + hi*1{r>hi} + mid*(rne(r) - r))) / sqrt(numel(x)*hi)
//   and the same for y with gy, y_clip and b. numel counts all batches.
struct bie_matmul_backward_args {
    const struct bie_tensor * x;
    const struct bie_tensor * y;
    const struct bie_tensor * x_clip;
    const struct bie_tensor * y_clip;
    const struct bie_tensor * grad_out;
    struct bie_tensor * grad_x;      // like x (float)
    struct bie_tensor * grad_y;      // like y (float)
    struct bie_tensor * grad_x_clip; // scalar float
    struct bie_tensor * grad_y_clip; // scalar float
};

BIE_API enum bie_status bie_matmul_forward(bie_context_t * ctx, const struct bie_matmul_desc * desc,
                                           const struct bie_matmul_args * args);
BIE_API enum bie_status bie_matmul_backward(bie_context_t * ctx, const struct bie_matmul_desc * desc,
                                            const struct bie_matmul_backward_args * args);

// Embedding lookup from a table of V rows of D codes (docs/formats.md: the same row formats as
// the layers' weights):
//   table  [V, D]: B1 bits (binary), S4 nibbles (4-bit), I8 (8-bit codes, clamped; binary: an
//          int8 latent table, its sign), or float (quantized on the fly: binary sign, n-bit
//          clamp(rne(v / scale[r]), lo, hi))
//   scale  [V] float per-row scales, or NULL (all 1; a float n-bit table needs them); any value
//          (a zero scale gives a zero row, as a padding row has)
//   value(r, d) = scale[r] * code(table[r, d])
// and for each index i of indices [...] (I32 or I64, each in [0, V)):
//   bag == 0: out[..., d] = value(indices[...], d)                         out [..., D]
//   bag != 0: out[..., d] = sum over the last index dimension l of value(indices[..., l], d)
//             (Bitorch Engine's BinaryEmbeddingBag votes with the sign of this sum)  out [..., D]
// out is f32, f16 or bf16, the value (or the bag's sum, in f32 in index order) rounded once. An
// index outside [0, V) is INVALID_ARGUMENT on the CPU; on CUDA (which does not read the indices
// on the host) its row reads as zeros.
struct bie_embedding_desc {
    enum bie_quant quant;
    int32_t bag;
};

struct bie_embedding_args {
    const struct bie_tensor * indices;
    const struct bie_tensor * table;
    const struct bie_tensor * scale;
    struct bie_tensor * out;
};

// Backward, sparse: the gradient of the rows the indices read, one row per distinct index.
//   slot[i] = inverse[i] (inverse: like indices, I32 or I64, in [0, U)), or indices[i] when
//   inverse is NULL (then U = V: a dense gradient)
//   grad_rows[u, d] = sum over lookups i with slot[i] = u of grad_out[i', d] * s[i]
// with i' = i without its last index (bag) or i itself, and s[i] = scale[indices[i]] (scale NULL:
// 1): the straight-through gradient of value(r, d) with respect to a latent table entry (binary:
// scale * sign(W) ~ scale * W; n-bit: pass scale NULL, scale * clamp(rne(W/scale)) ~ W).
// grad_rows [U, D] float is overwritten (rows no lookup reaches become 0). The CPU sums in index
// order; CUDA adds with float atomics (any order).
struct bie_embedding_backward_args {
    const struct bie_tensor * indices;
    const struct bie_tensor * inverse;
    const struct bie_tensor * scale;
    const struct bie_tensor * grad_out;
    struct bie_tensor * grad_rows;
};

BIE_API enum bie_status bie_embedding_forward(bie_context_t * ctx, const struct bie_embedding_desc * desc,
                                              const struct bie_embedding_args * args);
BIE_API enum bie_status bie_embedding_backward(bie_context_t * ctx, const struct bie_embedding_desc * desc,
                                               const struct bie_embedding_backward_args * args);

//
// The float pass between a float conv and a low-bit layer (a network's stem)
//

// Max-pooling of a per-channel affine map and clamp: the folded BatchNorm, the ReLU (or Hardtanh)
// and the MaxPool2d that follow a float conv, in one pass over its output, and the bits that a
// binary layer reading y would make of it. x [N, C, H, W], y [N, C, OH, OW]. The map is monotone
// in x, so it is applied once per output, to the window's largest x (smallest where mul[c] < 0):
//   s             = -1 where mul[c] < 0, else +1
//   m[n, c, i, j] = s * (the largest (s * f32(x[n, c, h, w])) + 0 over h in [i*stride_h - pad_h,
//                   .. + kernel_h), w in [j*stride_w - pad_w, .. + kernel_w), inside x; NaN wins)
//   y[n, c, i, j] = round_y(clamp((m * mul[c]) + add[c], lo, hi))
//                   (f32 operations; an absent mul or add is skipped; the clamp keeps NaN)
//   out_bits[n, c, i, j] = f32(y[n, c, i, j]) + out_bits_bias[c] >= 0   (NaN: 0; no bias: f32(y) >= 0)
// (+ 0 counts a zero x as +0, so that m does not depend on the order of the window's values.)
// This is max_pool2d(clamp(x * mul + add, lo, hi)) up to the sign of a zero and an infinite x under a
// zero mul. OH = (H + 2*pad_h - kernel_h) / stride_h + 1 (floor), OW likewise: PyTorch's MaxPool2d
// without dilation and ceil_mode, which needs kernel >= 1, stride >= 1, 0 <= 2*pad <= kernel and an
// output of at least one row and column. lo <= hi (-INFINITY / INFINITY for no clamp, 0 / INFINITY
// for a ReLU). x and y are f32, f16 or bf16 (y's dtype may differ from x's) of any strides on one
// device; mul, add and out_bits_bias [C] f32; out_bits B1 shaped like y.
struct bie_affine_maxpool2d_desc {
    int32_t kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w;
    float lo, hi;
};

// For training, argmax (U8 shaped like y) gets, per output, the position in its window of the x it
// came from, (h - (i*stride_h - pad_h)) * kernel_w + (w - (j*stride_w - pad_w)), the first in the
// window's row-major order whose s * x + 0 is the largest (NaN wins); or 255 where the clamp stops
// the gradient: a finite lo that f32(y) is not above, or a finite hi that it is not below (a NaN y
// with either). Windows of more than 255 positions cannot have one.
struct bie_affine_maxpool2d_args {
    const struct bie_tensor * x;
    const struct bie_tensor * mul; // or NULL
    const struct bie_tensor * add; // or NULL
    struct bie_tensor * y;
    struct bie_tensor * out_bits;            // or NULL
    const struct bie_tensor * out_bits_bias; // or NULL (needs out_bits)
    struct bie_tensor * argmax;              // or NULL
};

BIE_API enum bie_status bie_affine_maxpool2d_forward(bie_context_t * ctx, const struct bie_affine_maxpool2d_desc * desc,
                                                     const struct bie_affine_maxpool2d_args * args);

// The backward of the forward above to z = x * mul[c] + add[c] (the map before its clamp; the
// caller applies the map's own derivative, a BatchNorm's backward for instance), from its argmax:
//   grad_z[n, c, h, w] = round(sum of f32(grad_y[n, c, i, j]) over the outputs (i, j) whose window
//                        holds (h, w) and whose argmax names it, in increasing i, then j; 0 if none)
// argmax and grad_y [N, C, OH, OW] (grad_y f32, f16 or bf16), grad_z [N, C, H, W] (f32, f16 or
// bf16), any strides, on one device; desc as in the forward (lo and hi unused).
struct bie_affine_maxpool2d_backward_args {
    const struct bie_tensor * argmax;
    const struct bie_tensor * grad_y;
    struct bie_tensor * grad_z;
};

BIE_API enum bie_status bie_affine_maxpool2d_backward(bie_context_t * ctx,
                                                      const struct bie_affine_maxpool2d_desc * desc,
                                                      const struct bie_affine_maxpool2d_backward_args * args);

//
// ABI layout of the public structs, for bindings that declare them by hand (Python's ctypes)
//

// *offset and *size of field `field` of struct `name` (without "struct "), e.g.
// ("bie_tensor", "shape"); field NULL gives sizeof the struct (*offset = 0). Every struct of this
// header that the API passes by pointer is listed. INVALID_ARGUMENT for an unknown name.
BIE_API enum bie_status bie_abi_layout(const char * name, const char * field, int64_t * offset, int64_t * size);
// --- weight-only n-bit linear layers (LLM weights: GPTQ, Bitorch Engine's MPQ / MBWQ) -------------
// A layer whose weight holds n-bit codes (1..8 bits) with a float scale and zero point per group of
// input rows and output column, under float activations (docs/formats.md "Weight-only n-bit"; the
// equations are in docs/semantics.md). The K input rows of the weight are stored in "packed row"
// order: packed row r reads input feature perm[r] (perm NULL: r), and rows r in
// [g*group_size, (g+1)*group_size) form group g. For packed row r of group g, column n:
//   q       = the r-th code of column n (below), an unsigned integer in [0, 2^b - 1], b = bits of g
//   W[r, n] = s * (q - z)            BIE_WQ_ZERO_CODE   (GPTQ; z an integer code, or any float)
//           = s * (q - 2^(b-1))      BIE_WQ_ZERO_SYM    (symmetric: no zeros tensor)
//           = s * q - z              BIE_WQ_ZERO_OFFSET (Bitorch Engine's GBA / MBWQ "scale*q - zero")
//   with s = scales[g, n], z = zeros[g, n], each operation an f32 operation.
//   y[m, n] = bias[n] + sum_r x'[m, r] * W[r, n],  x'[m, r] = x[m, perm[r]] * channel_scale[perm[r]]
// Codes: qweight is I32 [rows, N]; column n's codes form one little-endian bit stream read down the
// column (word i of the column holds stream bits 32i .. 32i+31, least-significant bit first).
// Uniform bits b: code r at stream bit r*b (GPTQ's packing, for 3 bits too), rows = ceil(K*b/32).
// Mixed bits (bits = 0, group_bits[g] per group; group_size*b a multiple of 32): group g starts at
// word row sum_{h<g} ceil(n_h*b_h/32) (n_h = rows of group h) and holds its codes as a stream from
// there, Bitorch Engine's MBWQ / exl2 layer layout.

enum bie_wq_zero {
    BIE_WQ_ZERO_SYM = 0,
    BIE_WQ_ZERO_CODE = 1,
    BIE_WQ_ZERO_OFFSET = 2,
};

// How the CPU backend may treat activations (other backends ignore it).
enum bie_wq_act {
    BIE_WQ_ACT_FLOAT = 0, // f32 arithmetic on x (the reference's values up to f32 rounding)
    BIE_WQ_ACT_INT8 = 1,  // x quantised per 32 packed rows to int8 (scale max|x|/127), integer dot
                          // products (AVX512-VNNI): faster, with the activation rounding error
};

struct bie_wq_desc {
    int64_t in_features;  // K
    int64_t out_features; // N
    int32_t bits;         // 1..8 for every group, or 0: group_bits holds each group's
    int32_t group_size;   // rows per group, >= 1 (K or more: one group per column)
    enum bie_wq_zero zero;
    enum bie_wq_act act;
};

// The weight's tensors (dense row-major; on the device of x, except group_bits, always on the host).
//   qweight       I32 [rows, N]
//   scales        f32/f16/bf16 [G, N], G = ceil(K / group_size)
//   zeros         f32/f16/bf16 [G, N] (CODE and OFFSET), NULL for SYM
//   group_bits    I32 [G] host tensor, values in 1..8, when desc.bits == 0; else NULL
//   perm          I32 [K], a permutation of 0..K-1 (act-order), or NULL
//   channel_scale f32/f16/bf16 [K] (input feature scale, exl2), or NULL
//   bias          f32/f16/bf16 [N], or NULL
struct bie_wq_weight {
    const struct bie_tensor * qweight;
    const struct bie_tensor * scales;
    const struct bie_tensor * zeros;
    const struct bie_tensor * group_bits;
    const struct bie_tensor * perm;
    const struct bie_tensor * channel_scale;
    const struct bie_tensor * bias;
};

// Word rows of qweight for this layer (group_bits: the host array of G values when desc.bits == 0).
BIE_API enum bie_status bie_wq_qweight_rows(const struct bie_wq_desc * desc, const int32_t * group_bits,
                                            int64_t * out_rows);

// Forward: x [..., K] f32/f16/bf16 (any strides whose leading dims flatten), y [..., N] f32/f16/bf16.
BIE_API enum bie_status bie_wq_linear_forward(bie_context_t * ctx, const struct bie_wq_desc * desc,
                                              const struct bie_wq_weight * weight, const struct bie_tensor * x,
                                              struct bie_tensor * y);

// Backward (each output may be NULL; each is overwritten):
//   grad_x[m, perm[r]] = channel_scale[perm[r]] * sum_n grad_y[m, n] * W[r, n]    (like x; the QLoRA case)
//   grad_w[r, n]       = sum_m x'[m, r] * grad_y[m, n]   f32 [K, N] in packed row order: the weight
//                        gradient that Bitorch Engine hands its optimizer as privileged_grad
// x is needed only for grad_w (may be NULL otherwise).
BIE_API enum bie_status bie_wq_linear_backward(bie_context_t * ctx, const struct bie_wq_desc * desc,
                                               const struct bie_wq_weight * weight, const struct bie_tensor * x,
                                               const struct bie_tensor * grad_y, struct bie_tensor * grad_x,
                                               struct bie_tensor * grad_w);

// w [K, N] (f32/f16/bf16, packed row order) = W as defined above (perm, channel_scale and bias unused).
BIE_API enum bie_status bie_wq_dequantize(bie_context_t * ctx, const struct bie_wq_desc * desc,
                                          const struct bie_wq_weight * weight, struct bie_tensor * w);

// Codes <-> qweight: codes is I32 [K, N] (values in [0, 2^b - 1], packed row order; host tensors).
// bie_wq_pack writes every word of qweight (stream bits past the last code are 0).
BIE_API enum bie_status bie_wq_pack(bie_context_t * ctx, const struct bie_wq_desc * desc,
                                    const struct bie_tensor * group_bits, const struct bie_tensor * codes,
                                    struct bie_tensor * qweight);
BIE_API enum bie_status bie_wq_unpack(bie_context_t * ctx, const struct bie_wq_desc * desc,
                                      const struct bie_tensor * group_bits, const struct bie_tensor * qweight,
                                      struct bie_tensor * codes);

// Round-to-nearest quantisation of a float weight w [K, N] (host, packed row order) into weight's
// qweight, scales and zeros (host tensors, written), per group and column, GPTQ's quantiser:
//   lo = min(min w, 0), hi = max(max w, 0); SYM: hi = max(-lo, hi) and lo = -hi where lo < 0;
//   lo = hi = 0 -> lo = -1, hi = 1
//   s = (hi - lo) / (2^b - 1); z = rne(-lo / s) (CODE) or 2^(b-1) (SYM)
//   q = clamp(rne(w / s) + z, 0, 2^b - 1)
// OFFSET stores zeros = s * z (so that s*q - zeros is the same weight). f32 arithmetic; scales and
// zeros are rounded to their dtype first and the codes computed with the rounded values.
BIE_API enum bie_status bie_wq_quantize(bie_context_t * ctx, const struct bie_wq_desc * desc,
                                        const struct bie_tensor * w, const struct bie_wq_weight * weight);

#ifdef __cplusplus
}
#endif
