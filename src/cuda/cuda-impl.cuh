// SPDX-License-Identifier: Apache-2.0
// cuda-impl.cuh: what the CUDA backend's files share: the per-context state (stream, workspace,
// cuBLAS handle), error mapping, the by-value tensor view that kernels take, and device-side
// element access with the numerical contract's conversions (f16/bf16 round to nearest even,
// f32 division and rintf for quantisation; every .cu is built without FMA contraction).
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

extern "C" {
#include "bie-impl.h"
}

struct bie_cuda_state {
    void * workspace; // device arena, grown only when a larger call arrives
    size_t workspace_size;
    cudaStream_t stream;               // the caller's stream (NULL = legacy default stream)
    cublasHandle_t cublas;             // created on first use, bound to `stream` before every use
    int device;                        // ordinal the workspace lives on
    int sm_count;                      // of `device` (0: not read yet)
    unsigned gemm_smem_set;            // GEMM kernels whose shared-memory limit was raised (bit per config)
    unsigned long long wgmma_smem_set; // the same for the wgmma GEMM kernels
    int cc;                            // compute capability of `device` as major*10 + minor (0: not read yet)
    bool force_mma;                    // BIE_CUDA_GEMM=mma was set when cc was read: no wgmma
    bool force_gemm_backward;          // BIE_CUDA_CONV_BACKWARD=gemm was set then: convs' backward without cuDNN
    bool force_wq_passes;              // BIE_CUDA_WQ=passes was set then: weight-only M > 16 in decode passes
    bool force_wq_xs;                  // BIE_CUDA_WQ=xs: the decode kernel's x' always from wq_xs_kernel
    struct bie_cudnn_state * cudnn;    // cuDNN handle and per-shape algorithms (cuda-cudnn.cu), or NULL
    void * aux;                        // a device arena that outlives the layer calls inside an op
    size_t aux_size;                   // (the batched matmul's packed operands and partial sums; bie_cuda_aux)
    // Arenas handed to work captured into a CUDA graph: the graph keeps their addresses, so an arena
    // that grows while captured is retired (kept until the state goes) instead of freed.
    bool workspace_captured, aux_captured;
    void ** retired;
    int retired_count;
    // bie_cuda_record_begin .. _end: the context's calls go to record_stream (created on the device
    // record_device on first use), which captures them; `stream` is the caller's again at the end.
    cudaStream_t record_stream, record_user;
    int record_device;
    // bie_cuda_fork / _join: the side stream on side_device and the events of a fork and a join.
    cudaStream_t side;
    int side_device;
    cudaEvent_t fork_ev, join_ev;
    bool recording;
    // What a recorded graph checks before a replay: the state it was recorded with (a number no
    // other state takes) and the epoch, which goes up when something a graph may use is released
    // (a cuDNN plan leaving its cache).
    unsigned long long id, graph_epoch;
};

// The shape of a conv backward as cuDNN is asked it (cuda-cudnn.cu): x [n, c, h, w], weight
// [o, c, kh, kw], grad_y [n, o, oh, ow] with grad_y's strides, one float dtype (BIE_DTYPE_*).
struct cudnn_conv_shape {
    int n, c, h, w, o, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, dtype;
    int gy_stride[4];
};
struct bie_cudnn_state;
// Whether this build has cuDNN.
bool bie_cudnn_present(void);
void bie_cudnn_state_destroy(struct bie_cudnn_state * d);
// Finds (first use of a shape) the algorithms asked for; *dx_ws, *dw_ws: the cuDNN workspaces that
// the dgrad and the wgrad need (0 for one not asked for).
enum bie_status bie_cudnn_conv_prepare(bie_context_t * ctx, const cudnn_conv_shape & k, bool dx, bool dw,
                                       size_t * dx_ws, size_t * dw_ws);
// dx [n][h][w][c] = conv_transpose(grad_y, w [o][kh][kw][c]) (dense NHWC and KRSC, k.dtype), on stream s.
enum bie_status bie_cudnn_conv_dgrad(bie_context_t * ctx, cudaStream_t s, const cudnn_conv_shape & k,
                                     const void * w_krsc, const void * gy, void * dx_nhwc, void * ws, size_t ws_bytes);
// dw [o][kh][kw][c] = the weight gradient of conv(a [n][h][w][c], .) under grad_y, on stream s.
enum bie_status bie_cudnn_conv_wgrad(bie_context_t * ctx, cudaStream_t s, const cudnn_conv_shape & k,
                                     const void * a_nhwc, const void * gy, void * dw_krsc, void * ws, size_t ws_bytes);

// Work beside the context's stream: bie_cuda_fork makes the state's side stream (created on first
// use, on the current device) wait for what is queued on the context's stream so far, and
// bie_cuda_join makes the context's stream wait for what is queued on the side stream. Both are
// event records and waits, so they are captured into CUDA graphs as a fork and a join.
enum bie_status bie_cuda_fork(bie_context_t * ctx, cudaStream_t * side);
enum bie_status bie_cuda_join(bie_context_t * ctx);
// Ensures ctx->cuda exists and the current device is usable; DEVICE_ERROR/UNSUPPORTED otherwise.
enum bie_status bie_cuda_state_get(bie_context_t * ctx, int device_index, struct bie_cuda_state ** out);
// Device workspace of at least `bytes` (256-byte aligned), valid until the next call that asks.
enum bie_status bie_cuda_workspace(bie_context_t * ctx, size_t bytes, void ** out);
// Device memory of at least `bytes` that the layer calls made inside one op leave alone (they use
// the workspace), valid until the next call that asks for it; grown like the workspace.
enum bie_status bie_cuda_aux(bie_context_t * ctx, size_t bytes, void ** out);
// Maps a CUDA error to DEVICE_ERROR with the CUDA message; what names the failing step.
enum bie_status bie_cuda_fail(bie_context_t * ctx, cudaError_t e, const char * what);
// The compute capability of the context's device as major*10 + minor (read once; 0 if unknown);
// also reads BIE_CUDA_GEMM into force_mma, BIE_CUDA_CONV_BACKWARD into force_gemm_backward and
// BIE_CUDA_WQ into force_wq_passes and force_wq_xs.
int bie_cuda_cc(bie_context_t * ctx);
// The multiprocessor count of the context's device (read once; 0 if it cannot be read).
int bie_cuda_sm_count(bie_context_t * ctx);
// A launch configuration of grid x block threads with smem bytes of dynamic shared memory on the
// context's stream; pdl: as a programmatic dependent launch (the attribute goes in *attr, which
// must outlive the launch).
static inline cudaLaunchConfig_t bie_cuda_launch_config(bie_context_t * ctx, dim3 grid, dim3 block, size_t smem,
                                                        bool pdl, cudaLaunchAttribute * attr) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = ctx->cuda->stream;
    attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr->val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    return cfg;
}
// A forward's output epilogue (out_mul, out_add, residual, out_bits; cuda-epilogue-pass.cu) as one
// pass over the y that the layer's GEMM wrote; nothing when the call has none. Where
// bie_cuda_epilogue_dense says no and out_bits is asked for, codes is device scratch of one byte
// per element of y (the bits go through bie_cuda_store_packed).
bool bie_cuda_epilogue_dense(const struct bie_layer_call * c);
enum bie_status bie_cuda_layer_epilogue(bie_context_t * ctx, const struct bie_layer_call * c, int8_t * codes);
// Checks the last launch (cudaGetLastError) and maps it.
enum bie_status bie_cuda_check_launch(bie_context_t * ctx, const char * what);
enum bie_status bie_cuda_cublas(bie_context_t * ctx, cublasHandle_t * out);

#define CU_TRY(ctx, expr, what)                                                                                        \
    do {                                                                                                               \
        cudaError_t e_ = (expr);                                                                                       \
        if (e_ != cudaSuccess) return bie_cuda_fail(ctx, e_, what);                                                    \
    } while (0)
#define LAUNCHED(ctx, what) BIE_TRY(bie_cuda_check_launch(ctx, what))

// A tensor view passed to kernels by value (up to 4 dims, right-aligned: a view of ndim < 4 fills
// the LAST dims and the leading ones have shape 1, stride 0). Offsets are in elements (bits for B1,
// nibbles for S4).
struct dview {
    char * data;
    int dtype;
    int ndim;
    int64_t shape[4];
    int64_t stride[4];
};

// A workspace laid out as consecutive regions of size[i] bytes (0: absent), each 256-byte aligned
// (the layers' routes list their regions in a table): sets off[i] and returns the total.
static inline size_t ws_layout(const size_t * size, size_t * off, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        off[i] = total;
        total = (total + size[i] + 255) & ~(size_t)255;
    }
    return total;
}

// Converts a host-side view (ndim <= 4) into a kernel view; false if ndim > 4.
static inline bool dview_make(const struct bie_tensor * t, struct dview * v) {
    if (t->ndim > 4) return false;
    v->data = (char *)t->data;
    v->dtype = (int)t->dtype;
    v->ndim = t->ndim;
    const int lead = 4 - t->ndim;
    for (int i = 0; i < 4; i++) {
        v->shape[i] = i < lead ? 1 : t->shape[i - lead];
        v->stride[i] = i < lead ? 0 : t->stride[i - lead];
    }
    return true;
}

// A scalar scale: either a host value or a device scalar tensor read inside the kernel.
struct dscale {
    const void * ptr; // NULL: use value
    int dtype;
    float value;
    float clamp; // scale_a only: x is read through a clamp to [-clamp, clamp] (x_clamp); 0: none
};

static inline struct dscale dscale_make(const struct bie_layer_call * c, bool is_a) {
    struct dscale s;
    const struct bie_tensor * t = is_a ? &c->scale_a_t : &c->scale_w_t;
    s.ptr = c->scales_on_host ? NULL : t->data;
    s.dtype = (int)t->dtype;
    s.value = is_a ? c->scale_a : c->scale_w;
    if (!c->scales_on_host && t->device_type == BIE_DEVICE_CPU) s.ptr = NULL; // mixed: host value
    s.clamp = is_a ? c->x_clamp : 0.0f;
    return s;
}

__device__ __forceinline__ float ld_float(const char * p, int dtype, int64_t off) {
    switch (dtype) {
    case BIE_DTYPE_F32: return ((const float *)p)[off];
    case BIE_DTYPE_F16: return __half2float(((const __half *)p)[off]);
    case BIE_DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[off]);
    case BIE_DTYPE_I8: return (float)((const int8_t *)p)[off];
    case BIE_DTYPE_U8: return (float)((const uint8_t *)p)[off];
    case BIE_DTYPE_I32: return (float)((const int32_t *)p)[off];
    case BIE_DTYPE_B1: return (((const uint8_t *)p)[off >> 3] >> (off & 7)) & 1 ? 1.0f : -1.0f;
    case BIE_DTYPE_S4: {
        const uint8_t b = ((const uint8_t *)p)[off >> 1];
        const int nib = (off & 1) ? (b & 15) : (b >> 4);
        return (float)(nib >= 8 ? nib - 16 : nib);
    }
    default: return 0.0f;
    }
}

// Writes a float to a float / I32 element, rounding to nearest even.
__device__ __forceinline__ void st_float(char * p, int dtype, int64_t off, float v) {
    switch (dtype) {
    case BIE_DTYPE_F32: ((float *)p)[off] = v; break;
    case BIE_DTYPE_F16: ((__half *)p)[off] = __float2half_rn(v); break;
    case BIE_DTYPE_BF16: ((__nv_bfloat16 *)p)[off] = __float2bfloat16_rn(v); break;
    case BIE_DTYPE_I8: ((int8_t *)p)[off] = (int8_t)__float2int_rn(v); break;
    case BIE_DTYPE_I32: ((int32_t *)p)[off] = __float2int_rn(v); break;
    default: break;
    }
}

// Typed element conversions (float, __half, __nv_bfloat16; int8_t codes on the way out), rounding to
// nearest even, for kernels templated on the element type.
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ int8_t from_f32<int8_t>(float v) { return (int8_t)__float2int_rn(v); }

// 8 consecutive floats of type T (float, __half, __nv_bfloat16) as one or two 16-byte loads bring
// them (raw8_load: p 16-byte aligned). Kernels that keep several loads in flight load raw8s first
// and convert them after (raw8_floats); load8 does both at once.
template <typename T> struct raw8 { uint4 u[sizeof(T) / 2]; };
template <typename T> __device__ __forceinline__ raw8<T> raw8_load(const T * p) {
    raw8<T> r;
#pragma unroll
    for (int i = 0; i < (int)(sizeof(T) / 2); i++) r.u[i] = ((const uint4 *)p)[i];
    return r;
}
__device__ __forceinline__ float2 to_float2(__half2 h) { return __half22float2(h); }
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 h) { return __bfloat1622float2(h); }
// 8 two-byte floats (pairs of type T2) of a 16-byte vector as f32.
template <typename T2> __device__ __forceinline__ void floats8_pairs(const uint4 & u, float * v) {
    const T2 * h = (const T2 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 f = to_float2(h[i]);
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
    }
}
template <typename T> __device__ __forceinline__ void raw8_floats(const raw8<T> & r, float * v);
template <> __device__ __forceinline__ void raw8_floats<float>(const raw8<float> & r, float * v) {
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = ((const float *)r.u)[i];
}
template <> __device__ __forceinline__ void raw8_floats<__half>(const raw8<__half> & r, float * v) {
    floats8_pairs<__half2>(r.u[0], v);
}
template <> __device__ __forceinline__ void raw8_floats<__nv_bfloat16>(const raw8<__nv_bfloat16> & r, float * v) {
    floats8_pairs<__nv_bfloat162>(r.u[0], v);
}
template <typename T> __device__ __forceinline__ void load8(const T * p, float * v) {
    raw8_floats<T>(raw8_load<T>(p), v);
}

// Stores 8 floats as elements off .. off+7 of a dense F32, F16 or BF16 buffer (rounding to
// nearest even) with 16-byte stores; the caller checks that the address is 16-byte aligned.
__device__ __forceinline__ void store8(char * p, int dtype, int64_t off, const float * v) {
    if (dtype == BIE_DTYPE_F32) {
        ((float4 *)((float *)p + off))[0] = make_float4(v[0], v[1], v[2], v[3]);
        ((float4 *)((float *)p + off))[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else if (dtype == BIE_DTYPE_F16) {
        __half2 h[4];
        for (int i = 0; i < 4; i++) h[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
        *(uint4 *)((__half *)p + off) = *(const uint4 *)h;
    } else {
        __nv_bfloat162 h[4];
        for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
        *(uint4 *)((__nv_bfloat16 *)p + off) = *(const uint4 *)h;
    }
}
// 8 elements of a float buffer p of dtype dt, from element off, st elements apart (a vector load
// when they are contiguous and aligned).
__device__ __forceinline__ void load8_at(const void * p, int dt, int64_t off, int64_t st, float * f) {
    if (st == 1) {
        const float * f32 = (const float *)p + off;
        const __half * f16 = (const __half *)p + off;
        const __nv_bfloat16 * b16 = (const __nv_bfloat16 *)p + off;
        if (dt == BIE_DTYPE_F32 && (uintptr_t)f32 % 16 == 0) return load8<float>(f32, f);
        if (dt == BIE_DTYPE_F16 && (uintptr_t)f16 % 16 == 0) return load8<__half>(f16, f);
        if (dt == BIE_DTYPE_BF16 && (uintptr_t)b16 % 16 == 0) return load8<__nv_bfloat16>(b16, f);
    }
#pragma unroll
    for (int e = 0; e < 8; e++) f[e] = ld_float((const char *)p, dt, off + e * st);
}
// bias_a's 8 elements from element k0.
__device__ __forceinline__ void bias8(const struct dview & b, int64_t k0, float * f) {
    load8_at(b.data, b.dtype, k0 * b.stride[3], b.stride[3], f);
}
// v rounded to the precision of dtype dt (f16, bf16; f32 as it is), as f32.
__device__ __forceinline__ float round_as(int dt, float v) {
    if (dt == BIE_DTYPE_F16) return __half2float(__float2half_rn(v));
    if (dt == BIE_DTYPE_BF16) return __bfloat162float(__float2bfloat16_rn(v));
    return v;
}
// Whether 8 elements at element offset off of a buffer of dtype dt can go through store8/load8.
__device__ __forceinline__ bool vec8_ok(const void * p, int dt, int64_t off) {
    const int es = dt == BIE_DTYPE_F32 ? 4 : dt == BIE_DTYPE_F16 || dt == BIE_DTYPE_BF16 ? 2 : 0;
    return es && (((uintptr_t)p + (uintptr_t)(off * es)) % 16) == 0;
}

// popc of the bits of v (words w0 .. w0+3 of a bit row) that lie below bit K.
__device__ __forceinline__ int popc_below(const uint4 & v, int64_t w0, int64_t K) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    int n = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t left = K - (w0 + i) * 32;
        n += left >= 32 ? __popc(w[i]) : left > 0 ? __popc(w[i] & ((1u << left) - 1u)) : 0;
    }
    return n;
}
__device__ __forceinline__ int popc4(const uint4 & v) { return __popc(v.x) + __popc(v.y) + __popc(v.z) + __popc(v.w); }

// Programmatic dependent launch (sm_90): a kernel that only writes a GEMM's epilogue terms lets
// the GEMM launched after it (with cudaLaunchAttributeProgrammaticStreamSerialization) start at
// once; the GEMM waits for it (griddep_wait) just before it first reads those terms. Both are
// no-ops below sm_90 and in launches without the attribute.
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Asks the L2 cache to fetch `bytes` bytes (a multiple of 16) at p (16-byte aligned) from global
// memory, without waiting (sm_90; nothing below).
__device__ __forceinline__ void prefetch_l2(const void * p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
#else
    (void)p, (void)bytes;
#endif
}

__device__ __forceinline__ float ld_scale(struct dscale s) {
    return s.ptr ? ld_float((const char *)s.ptr, s.dtype, 0) : s.value;
}
// The bound of x's clamp (dscale.clamp), +inf when there is none.
__device__ __forceinline__ float clamp_bound(struct dscale s) {
    return s.clamp > 0.0f ? s.clamp : __int_as_float(0x7f800000);
}
// min(max(v, -t), t) with a NaN v kept NaN (max.NaN, min.NaN; bie_clamp_sym on the host); t = +inf
// leaves every v as it is.
__device__ __forceinline__ float clamp_in(float v, float t) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(v), "f"(-t));
    asm("min.NaN.f32 %0, %0, %1;" : "+f"(r) : "f"(t));
    return r;
}
// The clamp's derivative at v, 1{|v| < t}: 0 at +-t, past them and for a NaN v.
__device__ __forceinline__ bool clamp_open(float v, float t) { return fabsf(v) < t; }

__host__ __device__ __forceinline__ int qlo(int quant) { return quant == BIE_QUANT_INT4 ? -8 : -128; }
__host__ __device__ __forceinline__ int qhi(int quant) { return quant == BIE_QUANT_INT4 ? 7 : 127; }

// rne(x) as an int for |x| <= 2^22: adding 1.5 * 2^23 leaves rne(x) in the low mantissa bits (one
// FADD and an integer subtract, where rintf and a float-to-int conversion would take the slower
// conversion pipe).
constexpr float RNE_MAGIC = 12582912.0f; // 1.5 * 2^23
__device__ __forceinline__ int rne_int(float x) { return __float_as_int(__fadd_rn(x, RNE_MAGIC)) - 0x4B400000; }

// n-bit quantisation of the contract: clamp(rne(v / s), lo, hi), NaN -> lo, with v / s the
// correctly rounded quotient q. (The bounds are integers, so clamping q first rounds to the same
// code; fmaxf turns NaN into lo.)
__device__ __forceinline__ int quant_code(float v, float s, int lo, int hi) {
    return rne_int(fminf(fmaxf(__fdiv_rn(v, s), (float)lo), (float)hi));
}
// The same codes with inv = __frcp_rn(s), worked out once by the caller (the reciprocal costs what
// the division does: per element it saves nothing). t = v * inv carries two roundings of relative
// size 2^-24, so |t - q| < 2^-22 |t|; the integers nearest t and q differ only when a half-integer
// lies that close to t. Where none lies within 2^-20 |t| of it, rne(t) is rne(q) and the division
// is not needed. t is clamped first (as q is above): a clamped t is an integer, far from any
// half-integer, and its code is the bound that q's code is clamped to as well.
// quant_code_r's fast step: the bits of t + RNE_MAGIC for t = clamp(v * inv, lo, hi) (rne(t) in the
// low mantissa bits), and in *near whether t lies within 2^-20 |t| of a half-integer (or inv is
// infinite: s so small that 0 * inv would be NaN), where the division must decide instead.
__device__ __forceinline__ uint32_t rne_scaled(float v, float inv, int lo, int hi, bool * near) {
    const float t = fminf(fmaxf(__fmul_rn(v, inv), (float)lo), (float)hi);
    const float m = __fadd_rn(t, RNE_MAGIC), r = __fsub_rn(m, RNE_MAGIC); // r = rne(t), exactly
    *near = !(fabsf(fabsf(t - r) - 0.5f) > fabsf(t) * 0x1p-20f) || !(fabsf(inv) <= FLT_MAX);
    return __float_as_uint(m);
}
__device__ __forceinline__ int quant_code_r(float v, float s, float inv, int lo, int hi) {
    bool near;
    const uint32_t m = rne_scaled(v, inv, lo, hi, &near);
    return near ? quant_code(v, s, lo, hi) : (int)m - 0x4B400000;
}

// The codes of 8 values as quant_code_r gives them, packed as bytes (element k in byte k % 4 of
// word k / 4). A group with any value near a half-integer takes the divisions for all 8; a code's
// byte is the low byte of rne_scaled's bits.
__device__ __forceinline__ uint2 quant_codes8_r(const float * v, float s, float inv, int lo, int hi) {
    uint32_t m[8];
    bool near = false;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        bool nk;
        m[k] = rne_scaled(v[k], inv, lo, hi, &nk);
        near |= nk;
    }
    if (near) {
#pragma unroll
        for (int k = 0; k < 8; k++) m[k] = (uint32_t)quant_code(v[k], s, lo, hi);
    }
    return make_uint2(__byte_perm(__byte_perm(m[0], m[1], 0x0040), __byte_perm(m[2], m[3], 0x0040), 0x5410),
                      __byte_perm(__byte_perm(m[4], m[5], 0x0040), __byte_perm(m[6], m[7], 0x0040), 0x5410));
}

// Index division with 32-bit hardware arithmetic whenever both operands fit (64-bit division is a
// long software sequence on the GPU).
__device__ __forceinline__ int64_t qdiv(int64_t a, int64_t b) {
    return ((a | b) >> 32) ? a / b : (int64_t)((uint32_t)a / (uint32_t)b);
}
__device__ __forceinline__ int64_t qmod(int64_t a, int64_t b) {
    return ((a | b) >> 32) ? a % b : (int64_t)((uint32_t)a % (uint32_t)b);
}

__device__ __forceinline__ int64_t dview_off4(const struct dview & v, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return i0 * v.stride[0] + i1 * v.stride[1] + i2 * v.stride[2] + i3 * v.stride[3];
}

// Multi-index (row-major over the view's shape) of the linear element number e.
__device__ __forceinline__ int64_t dview_off_linear(const struct dview & v, int64_t e) {
    int64_t off = 0;
    for (int d = 3; d >= 0; d--) {
        if (v.shape[d] == 1) continue;
        const int64_t q = qdiv(e, v.shape[d]);
        off += (e - q * v.shape[d]) * v.stride[d];
        e = q;
    }
    return off;
}

// Drops the dimensions of extent 1 (the row-major element order is unchanged) and right-aligns
// the rest, so that dim 3 is the innermost dimension that matters.
static inline struct dview dview_squeeze(const struct dview & v) {
    struct dview r = v;
    int k = 3;
    for (int d = 3; d >= 0; d--)
        if (v.shape[d] != 1) {
            r.shape[k] = v.shape[d];
            r.stride[k] = v.stride[d];
            k--;
        }
    for (; k >= 0; k--) {
        r.shape[k] = 1;
        r.stride[k] = 0;
    }
    return r;
}

// The per-channel f32 terms of a pass over a layer's output: [C] vectors with their strides (data
// NULL: absent): a scale, an offset and the bias of the sign bits written for a binary layer.
struct channel_terms {
    const float *mul, *add, *bb;
    int64_t ms, as, bs;
    // The sign bit of a stored value yv of channel c: yv + bb[c] >= 0 (NaN: 0); bit_of with bb[c]
    // already read (bbc; any value when bb is absent).
    __device__ __forceinline__ bool bit_of(float yv, float bbc) const { return (bb ? __fadd_rn(yv, bbc) : yv) >= 0.0f; }
    __device__ __forceinline__ bool bit(int64_t c, float yv) const {
        return bit_of(yv, bb ? __ldg(bb + c * bs) : 0.0f);
    }
};
// v[k] = p[(c0 + k) * stride] for k < 8 (p NULL: absent, v = dflt), with two 16-byte loads where p
// is dense and aligned there.
__device__ __forceinline__ void load_channels8(const float * p, int64_t stride, int64_t c0, float dflt, float * v) {
    if (!p) {
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = dflt;
    } else if (stride == 1 && (uintptr_t)(p + c0) % 16 == 0) {
        const float4 a = __ldg((const float4 *)(p + c0)), b = __ldg((const float4 *)(p + c0) + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = __ldg(p + (c0 + k) * stride);
    }
}
static inline channel_terms channel_terms_of(const struct bie_tensor & mul, const struct bie_tensor & add,
                                             const struct bie_tensor & bb) {
    return {(const float *)mul.data, (const float *)add.data, (const float *)bb.data,
            mul.stride[0],           add.stride[0],           bb.stride[0]};
}

// Whether a 4-D view [n, c, h, w] is dense with the channels innermost (element (n, c, h, w) at
// ((n*h + h')*w + w')*c + c'), ignoring the strides of size-1 dims.
static inline bool bie_cuda_channels_last(const struct bie_tensor & v) {
    const int order[4] = {1, 3, 2, 0}; // innermost first
    int64_t want = 1;
    for (int k = 0; k < 4; k++) {
        const int d = order[k];
        if (v.shape[d] != 1 && v.stride[d] != want) return false;
        want *= v.shape[d];
    }
    return true;
}

static inline int64_t dview_numel(const struct dview & v) { return v.shape[0] * v.shape[1] * v.shape[2] * v.shape[3]; }

static inline unsigned grid_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b > 65536 * 8) b = 65536 * 8; // grid-stride loops cover the rest
    return (unsigned)(b < 1 ? 1 : b);
}

// --- packed writes --------------------------------------------------------------------------------

// Writes n elements of a packed (B1 / S4) view from per-element codes `codes` (int8, in the view's
// row-major element order; B1: nonzero = bit 1). Every byte is written by one thread.
enum bie_status bie_cuda_store_packed(bie_context_t * ctx, const int8_t * codes, const struct dview & dst);

// --- kernels shared by forward and backward -----------------------------------------------------

// Layer geometry as kernels see it (from struct bie_geometry).
struct dgeom {
    int64_t batch, C, H, W, O, OH, OW, K;
    int kh, kw, sh, sw, ph, pw, dh, dw;
    int pad_value;
};

// A linear layer seen as a conv: one output position per sample from one tap inside a 1x1 image,
// so row n of the implicit-GEMM activations is sample n's C features.
__host__ __device__ __forceinline__ bool dgeom_one_position(const struct dgeom & g) {
    return g.kh == 1 && g.kw == 1 && g.H == 1 && g.W == 1 && g.OH == 1 && g.OW == 1 && g.ph == 0 && g.pw == 0;
}

static inline struct dgeom dgeom_make(const struct bie_geometry & g) {
    struct dgeom d;
    d.batch = g.batch;
    d.C = g.C;
    d.H = g.H;
    d.W = g.W;
    d.O = g.O;
    d.OH = g.OH;
    d.OW = g.OW;
    d.K = g.K;
    d.kh = (int)g.kh;
    d.kw = (int)g.kw;
    d.sh = (int)g.sh;
    d.sw = (int)g.sw;
    d.ph = (int)g.ph;
    d.pw = (int)g.pw;
    d.dh = (int)g.dh;
    d.dw = (int)g.dw;
    d.pad_value = (int)g.pad_value;
    return d;
}

// Layout moves for the implicit-GEMM convs (cuda-layout.cu), reads and writes coalesced for any
// source layout. Pixel rows: out[p][c] (p = (n*H + h)*W + w, dense; out_dtype F32, F16, BF16 or
// I8) = t[n, c, h, w] (t a 4-D view [batch, C, H, W] of any dtype) when quant is 0, else its
// activation code under quant (x' = t + bias[c] when bias.data; binary +-1, n-bit
// clamp(rne(x'/scale), lo, hi)). Sample n's rows start at out + n * out_ld elements (0: dense,
// H*W*C; a weight [O, C, kh, kw] so becomes the rows [o][tap][c] of a padded GEMM operand).
enum bie_status bie_cuda_pixel_rows(bie_context_t * ctx, cudaStream_t s, const struct dview & t,
                                    const struct dview & bias, int quant, struct dscale scale, int out_dtype,
                                    int64_t out_ld, void * out);
// Whether consecutive pixels (w, then h, then n) of t are adjacent elements (NCHW-like planes).
bool bie_cuda_along_pixels(const struct dview & t);
// Implicit-GEMM rows from pixel rows P (elements of es bytes, C per pixel): out[m][k] for the
// rows m of g's output positions, k = (i*kw + j)*C + c < K the element its tap reads, pad_bits
// (an element's bit pattern) for taps outside the image, 0 for K <= k < ld.
enum bie_status bie_cuda_im2col(bie_context_t * ctx, cudaStream_t s, const void * P, int es, uint32_t pad_bits,
                                const struct dgeom & g, int64_t ld, void * out);

// Border classes of zero padding: output row oh (of OH) is class 0 when none of its taps lies
// above or below the image, else 1 + oh for the first `top` rows and 1 + top + (oh - (OH - bottom))
// for the last `bottom` ones; output columns likewise; a pixel's class is ch * (1 + left + right) + cw.
__host__ __device__ __forceinline__ int border_class(int o, int O, int top, int bottom) {
    return o < top ? 1 + o : o >= O - bottom ? 1 + top + (o - (O - bottom)) : 0;
}

// The zero-padding terms of output pixel (oh, ow): K over its taps inside the image (C * valid
// kernel rows * valid kernel columns; a tap's validity is per dimension) and its border class,
// for the class counts border[4] (top, bottom, left, right). 32-bit arithmetic: tap coordinates
// lie in [-p, H + p), and the host refuses H + 2p >= 2^31.
__device__ __forceinline__ void zero_pad_terms(const struct dgeom & g, const int * border, int oh, int ow,
                                               int64_t * kterm, int * cls) {
    const int h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
    int vh = 0, vw = 0;
    for (int i = 0; i < g.kh; i++) vh += (unsigned)(h0 + i * g.dh) < (unsigned)g.H;
    for (int j = 0; j < g.kw; j++) vw += (unsigned)(w0 + j * g.dw) < (unsigned)g.W;
    *kterm = g.C * (vh * vw);
    *cls = border_class(oh, (int)g.OH, border[0], border[1]) * (1 + border[2] + border[3]) +
           border_class(ow, (int)g.OW, border[2], border[3]);
}

// The bits of the float 1.5 * 2^23: an integer p with |p| < 2^22 added to them gives the bits of
// the float 1.5 * 2^23 + p (the wgmma epilogue's exact int-to-float step, cuda-wgmma-epilogue.cuh).
#define BIE_DOT_BIAS 0x4B400000
// Row length of gemm_epilogue.colcls: N rounded up to the widest wgmma tile (256 columns).
#define BIE_COLCLS_LD(N) (((N) + 255) / 256 * 256)

// GEMM on packed operands: C[m][n] = sum over the row's bytes of A[m] . B[n], where rows are
// `kbytes` bytes (a multiple of 128). binary = 1: bits with AND-popcount (acc = popc(a & b));
// binary = 0: int8 codes. The epilogue turns acc into y.
struct gemm_epilogue {
    int binary;
    const int * rowpop; // [M] popc(a row) (binary)
    const int * colpop; // [N] popc(w row) (binary)
    // Zero-padded binary conv (else tapcorr is NULL): tapcorr[p][n] = 2 * popc of weight row n over
    // the taps outside the image for the rows of border class p (border_class below), with the
    // class counts of the output rows (top, bottom) and columns (left, right) that have such taps.
    const int * tapcorr;
    int border[4];
    // The same with the column terms of the wgmma epilogue folded in (set with tapcorr):
    // colcls[p * colcls_ld + n] = BIE_DOT_BIAS - 2 popc(w row n) + tapcorr[p][n] for every class p
    // (class 0: tapcorr 0), zeros for N <= n < colcls_ld (BIE_COLCLS_LD(N)), so that a tile's
    // epilogue reads a row's terms for its class without a bounds check or a border branch.
    const int * colcls;
    int colcls_ld;
    // Zero padding with gathered rows (else NULL), for the fast epilogue: from bie_cuda_conv_rowpop,
    // per row, {K over its valid taps - 2 popc(row), its border class}; or, when the GEMM counts the
    // rows itself (bie_cuda_wgmma_counts_rows), pixcls[oh * OW + ow] = {K over the taps of output
    // pixel (oh, ow) inside the image, its border class}, for any sample's rows.
    const int2 *rowterms, *pixcls;
    struct dgeom g;
    struct dscale sa, sw;
    struct dview y; // [batch, O, OH, OW]; y.dtype B1 -> write sign codes to `sign` instead
    int8_t * sign;  // [M][N] codes of (acc >= 0) for a B1 y
    int64_t ldb;    // bytes between rows of B (>= kbytes, a multiple of 16)
    // 1: the last kernel queued before the GEMM wrote only rowpop, colpop, rowterms, pixcls or the
    // tap tables (all else it reads is complete), so the wgmma GEMM may start under it as a
    // programmatic dependent launch. operands_last, 1: that kernel wrote something the GEMM's
    // producer loads, or started under one that did (and waits for it): the GEMM may still start
    // under it, and its producer waits for it before the first load.
    int terms_last, operands_last;
};
// The bits between consecutive rows m of y (its pixels' stride, or for one output position its
// samples'): where bie_cuda_wgmma_packs_bits holds, row m starts at bit m times this.
__host__ __device__ inline int64_t y_row_pitch(const struct gemm_epilogue & ep) {
    return ep.g.OW > 1 ? ep.y.stride[3] : ep.g.OH > 1 ? ep.y.stride[2] : ep.y.stride[0];
}
// Division of n < 2^31 by a divisor d in [1, 2^30] fixed for a kernel, as a multiply-high and a
// shift (fast_div_make on the host, fast_div on the device): with l = ceil(log2 d) and p = 31 + l,
// mul = ceil(2^p / d) fits 32 bits and n / d = umulhi(n, mul) >> (p - 32), since the rounding
// error n (mul d - 2^p) / (d 2^p) < 2^-l <= 1/d cannot carry the quotient past the next integer.
struct fast_divisor {
    uint32_t d, mul, shift;
};
static inline struct fast_divisor fast_div_make(uint32_t d) {
    struct fast_divisor f = {d, 0, 0};
    int l = 0;
    while (((uint64_t)1 << l) < d) l++;
    if (d > 1) {
        f.mul = (uint32_t)((((uint64_t)1 << (31 + l)) + d - 1) / d);
        f.shift = (uint32_t)(l - 1);
    }
    return f;
}
__device__ __forceinline__ uint32_t fast_div(uint32_t n, const struct fast_divisor & f) {
    return f.d == 1 ? n : __umulhi(n, f.mul) >> f.shift;
}
// The activation rows of a conv gathered by the GEMM itself, instead of read from A: x as NHWC
// pixels in whole 32-bit words of channels (binary: bits, C % 32 == 0; n-bit: int8 codes, C % 4 ==
// 0; w0, w2, w3: the words between samples, rows and pixels; wpt and kwords: the words of one tap
// and of a whole row of K), taps outside the image read as zero words (zero or -1 padding, not
// +1; an n-bit code 0). The wgmma GEMM copies each stage's rows from x with asynchronous copies of
// `piece` bytes (16, 8 or 4: what the channel words and strides allow), so the rows never go
// through memory. A binary conv's row popcounts come from bie_cuda_conv_rowpop, or from the GEMM
// itself where bie_cuda_wgmma_counts_rows says so (ep.rowpop is then not read).
struct gemm_gather {
    const uint32_t * x;
    int64_t w0, w2, w3;
    int wpt, kwords, piece;
    struct fast_divisor div_ow, div_oh; // by OW and by OH (output pixel m -> n, oh, ow)
};
// Whether the GEMM of M rows (taps: with the zero-padding table) takes the wgmma route, the only
// one that gathers.
bool bie_cuda_gemm_takes_wgmma(bie_context_t * ctx, int64_t M, bool taps);
// rowpop[m] = popc of implicit-GEMM row m as the gather reads it (the sum over the row's taps
// inside the image of their pixels' popcounts), in one launch on the context's stream. With zero
// padding (rowterms not NULL) it also writes gemm_epilogue.rowterms, for `border` (the class counts
// top, bottom, left, right). after_terms: the kernel queued just before wrote weight_terms' tables
// only, which this one does not read, so it is a programmatic dependent launch under it.
enum bie_status bie_cuda_conv_rowpop(bie_context_t * ctx, const struct gemm_gather & gs, const struct dgeom & g,
                                     int * rowpop, int2 * rowterms, const int * border, bool after_terms);
// Whether the wgmma GEMM of M x N with rows of kbytes counts the popcounts of gathered rows itself
// (its 64-column tiles do; see ones_operand in cuda-wgmma-tiles.cuh).
bool bie_cuda_wgmma_counts_rows(bie_context_t * ctx, int64_t M, int64_t N, int64_t kbytes);
// gs: NULL, or the gathered activations (A unused; wgmma route only).
enum bie_status bie_cuda_gemm(bie_context_t * ctx, const uint8_t * A, const uint8_t * B, int64_t M, int64_t N,
                              int64_t kbytes, const struct gemm_epilogue & ep, const struct gemm_gather * gs = NULL);
// Calls of at most SMALL_M_MAX rows (and no zero-padding correction) run the few-rows GEMM
// (cuda-gemm-small.cu), which counts the binary popcounts itself: ep.rowpop and ep.colpop may be
// NULL for them.
#define SMALL_M_MAX 32
static inline bool bie_cuda_gemm_counts_popcounts(int64_t M, bool taps) { return M <= SMALL_M_MAX && !taps; }
enum bie_status bie_cuda_gemm_small(bie_context_t * ctx, const uint8_t * A, const uint8_t * B, int64_t M, int64_t N,
                                    int64_t kbytes, const struct gemm_epilogue & ep);
// Whether bie_cuda_gemm writes a B1 y itself (through the wgmma epilogue: rows of y a whole number
// of bytes apart with contiguous features, N % 8 == 0), judged from ep.y, ep.g and ep.binary and
// whether the call will have the zero-padding table (taps): then ep.sign must be NULL; otherwise
// the caller passes ep.sign and packs the codes with bie_cuda_store_packed.
bool bie_cuda_gemm_packs_bits(bie_context_t * ctx, int64_t M, int64_t N, bool taps, const struct gemm_epilogue & ep);
bool bie_cuda_wgmma_packs_bits(const struct gemm_epilogue & ep, int64_t N);
// The same GEMM through sm_90a warpgroup MMA (cuda-wgmma.cu and cuda-wgmma-*.cuh); bie_cuda_gemm uses it when
// bie_cuda_wgmma_usable says the device is a Hopper GPU (compute capability 9.0) and the driver
// can encode tensor maps. BIE_CUDA_GEMM=mma in the environment (read once per context and device)
// forces the mma.sync kernel.
bool bie_cuda_wgmma_usable(bie_context_t * ctx);
// The width (columns of y) of the wgmma GEMM's tiles for M x N with rows of kbytes: 64, 128,
// 192 (binary, used when y suits them, else 256) or 256.
int bie_cuda_wgmma_tile_n(bie_context_t * ctx, int64_t M, int64_t N, int64_t kbytes, bool binary);
enum bie_status bie_cuda_gemm_wgmma(bie_context_t * ctx, const uint8_t * A, const uint8_t * B, int64_t M, int64_t N,
                                    int64_t kbytes, const struct gemm_epilogue & ep, const struct gemm_gather * gs);
