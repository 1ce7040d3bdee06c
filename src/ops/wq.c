// SPDX-License-Identifier: Apache-2.0
// wq.c: the public weight-only n-bit layer calls (bie.h): validation, normalisation into a struct
// bie_wq_call (wq-impl.h) and dispatch (CUDA tensors -> CUDA; CPU -> optimised CPU -> reference).
#include "bie-cuda-plugin.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum bie_status bie_wq_qweight_rows(const struct bie_wq_desc * desc, const int32_t * group_bits, int64_t * out_rows) {
    if (!desc || !out_rows) return BIE_STATUS_INVALID_ARGUMENT;
    const int64_t K = desc->in_features;
    if (K <= 0 || desc->group_size <= 0 || desc->bits < 0 || desc->bits > 8) return BIE_STATUS_INVALID_ARGUMENT;
    if (desc->bits) {
        *out_rows = (K * desc->bits + 31) / 32;
        return BIE_STATUS_OK;
    }
    if (!group_bits) return BIE_STATUS_INVALID_ARGUMENT;
    const int64_t gs = desc->group_size < K ? desc->group_size : K, G = (K + gs - 1) / gs;
    int64_t rows = 0;
    for (int64_t g = 0; g < G; g++) {
        const int b = group_bits[g];
        if (b < 1 || b > 8) return BIE_STATUS_INVALID_ARGUMENT;
        const int64_t n = K - g * gs < gs ? K - g * gs : gs;
        rows += (n * b + 31) / 32;
    }
    *out_rows = rows;
    return BIE_STATUS_OK;
}

// Collapses the leading dims of t [..., F] into a 2-D view [M, F]; false when they do not flatten.
static bool view2(const struct bie_tensor * t, struct bie_tensor * out) {
    int64_t stride = -1, extent = 1;
    for (int32_t i = t->ndim - 2; i >= 0; i--) {
        if (t->shape[i] == 1) continue;
        if (stride < 0) stride = t->stride[i];
        else if (t->stride[i] != stride * extent) return false;
        extent *= t->shape[i];
    }
    const int64_t F = t->shape[t->ndim - 1];
    *out = *t;
    out->ndim = 2;
    out->shape[0] = bie_tensor_numel(t) / F;
    out->shape[1] = F;
    out->stride[0] = stride < 0 ? F : stride;
    out->stride[1] = t->stride[t->ndim - 1];
    return true;
}

static bool is_dense(const struct bie_tensor * t) {
    int64_t s = 1;
    for (int32_t i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] > 1 && t->stride[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

// A weight tensor: present (or absent when allowed), dense, of the given shape (n dims), float or I32.
static enum bie_status weight_tensor(bie_context_t * ctx, const char * name, const struct bie_tensor * t, bool required,
                                     bool is_float, int nd, int64_t d0, int64_t d1, const struct bie_wq_call * c,
                                     bool host, struct bie_tensor * out) {
    memset(out, 0, sizeof *out);
    if (!t) {
        if (required) BIE_FAIL("%s: is required here", name);
        return BIE_STATUS_OK;
    }
    BIE_TRY(bie_check_tensor(ctx, name, t, false));
    if (is_float ? !bie_dtype_is_float(t->dtype) : t->dtype != BIE_DTYPE_I32)
        BIE_FAIL("%s: dtype %s, expected %s", name, bie_dtype_name(t->dtype), is_float ? "f32, f16 or bf16" : "i32");
    if (t->ndim != nd || t->shape[0] != d0 || (nd == 2 && t->shape[1] != d1)) {
        if (nd == 2) BIE_FAIL("%s: must have shape [%lld, %lld]", name, (long long)d0, (long long)d1);
        BIE_FAIL("%s: must have shape [%lld]", name, (long long)d0);
    }
    if (!is_dense(t)) BIE_FAIL("%s: must be dense (row-major, contiguous)", name);
    if (host ? t->device_type != BIE_DEVICE_CPU
             : (t->device_type != c->device_type || t->device_index != c->device_index))
        BIE_FAIL("%s: must be on %s", name, host ? "the host (a CPU tensor)" : "the device of x");
    *out = *t;
    return BIE_STATUS_OK;
}

static enum bie_status act_view(bie_context_t * ctx, const char * name, const struct bie_tensor * t, int64_t F,
                                const struct bie_wq_call * c, int64_t M, struct bie_tensor * out) {
    BIE_TRY(bie_check_tensor(ctx, name, t, false));
    if (!bie_dtype_is_float(t->dtype) || t->dtype == BIE_DTYPE_F64)
        BIE_FAIL("%s: dtype %s, expected f32, f16 or bf16", name, bie_dtype_name(t->dtype));
    if (t->ndim < 1 || t->shape[t->ndim - 1] != F) BIE_FAIL("%s: last dimension must be %lld", name, (long long)F);
    if (t->device_type != c->device_type || t->device_index != c->device_index)
        BIE_FAIL("%s: must be on the device of the weight", name);
    if (!view2(t, out))
        BIE_FAIL("%s: leading dimensions cannot be flattened without a copy (make them contiguous)", name);
    if (M >= 0 && out->shape[0] != M)
        BIE_FAIL("%s: has %lld rows, expected %lld", name, (long long)out->shape[0], (long long)M);
    return BIE_STATUS_OK;
}

// Validates desc, qweight and group_bits; fills c's layout (*owned: the arrays to free).
static enum bie_status layout(bie_context_t * ctx, const struct bie_wq_desc * desc, const struct bie_tensor * qweight,
                              const struct bie_tensor * group_bits, struct bie_wq_call * c, void ** owned) {
    memset(c, 0, sizeof *c);
    if (!desc) BIE_FAIL("desc: is NULL");
    const int64_t K = desc->in_features, N = desc->out_features;
    if (K <= 0 || N <= 0) BIE_FAIL("desc: in_features and out_features must be positive");
    if (K > ((int64_t)1 << 31) / 8 || N > INT32_MAX) BIE_FAIL("desc: in_features or out_features too large");
    if (desc->bits < 0 || desc->bits > 8) BIE_FAIL("desc: bits = %d must be in 1..8, or 0 for group_bits", desc->bits);
    if (desc->group_size <= 0) BIE_FAIL("desc: group_size = %d must be positive", desc->group_size);
    if (desc->zero != BIE_WQ_ZERO_SYM && desc->zero != BIE_WQ_ZERO_CODE && desc->zero != BIE_WQ_ZERO_OFFSET)
        BIE_FAIL("desc: unknown zero mode %d", (int)desc->zero);
    if (desc->act != BIE_WQ_ACT_FLOAT && desc->act != BIE_WQ_ACT_INT8)
        BIE_FAIL("desc: unknown act mode %d", (int)desc->act);
    c->K = K;
    c->N = N;
    c->bits = desc->bits;
    c->gs = desc->group_size < K ? desc->group_size : K;
    c->G = (K + c->gs - 1) / c->gs;
    c->zero = desc->zero;
    c->act = desc->act;
    if (!qweight) BIE_FAIL("qweight: is NULL");
    BIE_TRY(bie_check_tensor(ctx, "qweight", qweight, false));
    c->device_type = qweight->device_type;
    c->device_index = qweight->device_index;
    int32_t * bits = malloc((size_t)c->G * sizeof(int32_t));
    int64_t * word = malloc((size_t)(c->G + 1) * sizeof(int64_t));
    owned[0] = bits;
    owned[1] = word;
    if (!bits || !word)
        return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "weight: out of memory for the group table");
    c->group_bits = bits;
    c->group_word = word;
    if (desc->bits) {
        if (group_bits) BIE_FAIL("group_bits: must be NULL when desc.bits is set");
        for (int64_t g = 0; g < c->G; g++) {
            bits[g] = desc->bits;
            word[g] = g * c->gs * desc->bits / 32;
        }
        c->rows = (K * desc->bits + 31) / 32;
    } else {
        struct bie_tensor gb;
        BIE_TRY(weight_tensor(ctx, "group_bits", group_bits, true, false, 1, c->G, 0, c, true, &gb));
        int64_t w = 0;
        for (int64_t g = 0; g < c->G; g++) {
            const int32_t b = ((const int32_t *)gb.data)[g];
            if (b < 1 || b > 8) BIE_FAIL("group_bits: [%lld] = %d must be in 1..8", (long long)g, (int)b);
            const int64_t n = K - g * c->gs < c->gs ? K - g * c->gs : c->gs;
            if (n == desc->group_size && (c->gs * b) % 32 != 0)
                BIE_FAIL("group_bits: group_size * bits must be a multiple of 32 (group %lld: %lld * %d)", (long long)g,
                         (long long)c->gs, (int)b);
            bits[g] = b;
            word[g] = w;
            w += (n * b + 31) / 32;
        }
        c->rows = w;
    }
    word[c->G] = c->rows;
    return weight_tensor(ctx, "qweight", qweight, true, false, 2, c->rows, N, c, false, &c->qweight);
}

// Validates desc and weight; fills c's weight part and layout (*owned: the arrays to free).
static enum bie_status prepare(bie_context_t * ctx, const struct bie_wq_desc * desc, const struct bie_wq_weight * wt,
                               struct bie_wq_call * c, void ** owned) {
    if (!wt) BIE_FAIL("weight: is NULL");
    BIE_TRY(layout(ctx, desc, wt->qweight, wt->group_bits, c, owned));
    const int64_t K = c->K, N = c->N;
    BIE_TRY(weight_tensor(ctx, "scales", wt->scales, true, true, 2, c->G, N, c, false, &c->scales));
    const bool need_zeros = desc->zero != BIE_WQ_ZERO_SYM;
    if (!need_zeros && wt->zeros) BIE_FAIL("zeros: must be NULL for BIE_WQ_ZERO_SYM");
    BIE_TRY(weight_tensor(ctx, "zeros", wt->zeros, need_zeros, true, 2, c->G, N, c, false, &c->zeros));
    BIE_TRY(weight_tensor(ctx, "perm", wt->perm, false, false, 1, K, 0, c, false, &c->perm));
    BIE_TRY(weight_tensor(ctx, "channel_scale", wt->channel_scale, false, true, 1, K, 0, c, false, &c->channel_scale));
    BIE_TRY(weight_tensor(ctx, "bias", wt->bias, false, true, 1, N, 0, c, false, &c->bias));
    if (c->perm.data && c->device_type == BIE_DEVICE_CPU) {
        // A permutation: every index once (CUDA kernels clamp instead of checking).
        uint8_t * seen = calloc((size_t)K, 1);
        if (!seen) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "perm: out of memory");
        const int32_t * p = c->perm.data;
        for (int64_t r = 0; r < K; r++) {
            if (p[r] < 0 || p[r] >= K || seen[p[r]]) {
                free(seen);
                BIE_FAIL("perm: [%lld] = %d: not a permutation of 0..%lld", (long long)r, (int)p[r],
                         (long long)(K - 1));
            }
            seen[p[r]] = 1;
        }
        free(seen);
    }
    return BIE_STATUS_OK;
}

static void release(void ** owned) {
    free(owned[0]);
    free(owned[1]);
}

typedef enum bie_status (*wq_fn)(bie_context_t *, const struct bie_wq_call *);

// CUDA weights go to the CUDA plugin's backward (or forward) entry; CPU ones to the CPU backend,
// then the reference.
static enum bie_status dispatch(bie_context_t * ctx, const struct bie_wq_call * c, bool backward, wq_fn cpu,
                                wq_fn ref) {
    enum bie_status s = BIE_DECLINED;
    if (c->device_type == BIE_DEVICE_CUDA) {
        const struct bie_cuda_plugin * cuda;
        BIE_TRY(bie_cuda_plugin_get(ctx, "qweight", &cuda));
        s = (backward ? cuda->wq_backward : cuda->wq_forward)(ctx, c);
    } else {
        if (ctx->params.backend != BIE_BACKEND_REF) s = cpu(ctx, c);
        if (s == BIE_DECLINED) s = ref(ctx, c);
    }
    if (s == BIE_DECLINED) s = bie_set_error(ctx, BIE_STATUS_INTERNAL, "wq: no backend took the call");
    if (s == BIE_STATUS_OK) bie_clear_error(ctx);
    return s;
}

enum bie_status bie_wq_linear_forward(bie_context_t * ctx, const struct bie_wq_desc * desc,
                                      const struct bie_wq_weight * weight, const struct bie_tensor * x,
                                      struct bie_tensor * y) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    struct bie_wq_call c;
    void * owned[2] = {NULL, NULL};
    enum bie_status s = prepare(ctx, desc, weight, &c, owned);
    if (s == BIE_STATUS_OK) s = act_view(ctx, "x", x, c.K, &c, -1, &c.x);
    if (s == BIE_STATUS_OK) {
        c.M = c.x.shape[0];
        if (!y) s = bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "y: is NULL");
        else s = act_view(ctx, "y", y, c.N, &c, c.M, &c.y);
    }
    if (s == BIE_STATUS_OK) s = dispatch(ctx, &c, false, bie_cpu_wq_forward, bie_ref_wq_forward);
    release(owned);
    return s;
}

enum bie_status bie_wq_linear_backward(bie_context_t * ctx, const struct bie_wq_desc * desc,
                                       const struct bie_wq_weight * weight, const struct bie_tensor * x,
                                       const struct bie_tensor * grad_y, struct bie_tensor * grad_x,
                                       struct bie_tensor * grad_w) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    struct bie_wq_call c;
    void * owned[2] = {NULL, NULL};
    enum bie_status s = prepare(ctx, desc, weight, &c, owned);
    if (s == BIE_STATUS_OK) s = act_view(ctx, "grad_y", grad_y, c.N, &c, -1, &c.grad_y);
    if (s == BIE_STATUS_OK) c.M = c.grad_y.shape[0];
    if (s == BIE_STATUS_OK && grad_x) s = act_view(ctx, "grad_x", grad_x, c.K, &c, c.M, &c.grad_x);
    if (s == BIE_STATUS_OK && grad_w) {
        if (!x) s = bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "x: is required for grad_w");
        else s = act_view(ctx, "x", x, c.K, &c, c.M, &c.x);
        if (s == BIE_STATUS_OK) {
            s = bie_check_tensor(ctx, "grad_w", grad_w, false);
            if (s == BIE_STATUS_OK && (grad_w->dtype != BIE_DTYPE_F32 || grad_w->ndim != 2 || grad_w->shape[0] != c.K ||
                                       grad_w->shape[1] != c.N || !is_dense(grad_w)))
                s = bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "grad_w: must be a dense f32 [%lld, %lld] tensor",
                                  (long long)c.K, (long long)c.N);
            if (s == BIE_STATUS_OK && (grad_w->device_type != c.device_type || grad_w->device_index != c.device_index))
                s = bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "grad_w: must be on the device of the weight");
            if (s == BIE_STATUS_OK) c.grad_w = *grad_w;
        }
    }
    if (s == BIE_STATUS_OK && !grad_x && !grad_w)
        s = bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "grad_x, grad_w: at least one is needed");
    if (s == BIE_STATUS_OK) s = dispatch(ctx, &c, true, bie_cpu_wq_backward, bie_ref_wq_backward);
    release(owned);
    return s;
}

enum bie_status bie_wq_dequantize(bie_context_t * ctx, const struct bie_wq_desc * desc,
                                  const struct bie_wq_weight * weight, struct bie_tensor * w) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    struct bie_wq_call c;
    void * owned[2] = {NULL, NULL};
    enum bie_status s = prepare(ctx, desc, weight, &c, owned);
    if (s == BIE_STATUS_OK) s = bie_check_tensor(ctx, "w", w, false);
    if (s == BIE_STATUS_OK && (!bie_dtype_is_float(w->dtype) || w->dtype == BIE_DTYPE_F64 || w->ndim != 2 ||
                               w->shape[0] != c.K || w->shape[1] != c.N))
        s = bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "w: must be an f32/f16/bf16 [%lld, %lld] tensor",
                          (long long)c.K, (long long)c.N);
    if (s == BIE_STATUS_OK && (w->device_type != c.device_type || w->device_index != c.device_index))
        s = bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "w: must be on the device of the weight");
    if (s == BIE_STATUS_OK) {
        s = BIE_DECLINED;
        if (c.device_type == BIE_DEVICE_CUDA) {
            const struct bie_cuda_plugin * cuda;
            s = bie_cuda_plugin_get(ctx, "qweight", &cuda);
            if (s == BIE_STATUS_OK) s = cuda->wq_dequantize(ctx, &c, w);
        } else {
            if (ctx->params.backend != BIE_BACKEND_REF) s = bie_cpu_wq_dequantize(ctx, &c, w);
            if (s == BIE_DECLINED) s = bie_ref_wq_dequantize(ctx, &c, w);
        }
        if (s == BIE_STATUS_OK) bie_clear_error(ctx);
    }
    release(owned);
    return s;
}

// Layout of pack/unpack (host tensors only).
static enum bie_status codes_layout(bie_context_t * ctx, const struct bie_wq_desc * desc, const struct bie_tensor * gb,
                                    const struct bie_tensor * qweight, struct bie_wq_call * c, void ** owned) {
    BIE_TRY(layout(ctx, desc, qweight, gb, c, owned));
    if (qweight->device_type != BIE_DEVICE_CPU) BIE_FAIL("qweight: must be a CPU tensor");
    return BIE_STATUS_OK;
}

static enum bie_status codes_tensor(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                                    const struct bie_wq_call * c) {
    BIE_TRY(bie_check_tensor(ctx, name, t, false));
    if (t->dtype != BIE_DTYPE_I32 || t->ndim != 2 || t->shape[0] != c->K || t->shape[1] != c->N || !is_dense(t) ||
        t->device_type != BIE_DEVICE_CPU)
        BIE_FAIL("%s: must be a dense i32 [%lld, %lld] CPU tensor", name, (long long)c->K, (long long)c->N);
    return BIE_STATUS_OK;
}

// bie_wq_pack (pack = true: codes -> qweight) and bie_wq_unpack (qweight -> codes).
static enum bie_status codes_call(bie_context_t * ctx, const struct bie_wq_desc * desc,
                                  const struct bie_tensor * group_bits, const struct bie_tensor * codes,
                                  const struct bie_tensor * qweight, bool pack) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    if (!qweight) BIE_FAIL("qweight: is NULL");
    struct bie_wq_call c;
    void * owned[2] = {NULL, NULL};
    enum bie_status s = codes_layout(ctx, desc, group_bits, qweight, &c, owned);
    if (s == BIE_STATUS_OK) s = codes_tensor(ctx, "codes", codes, &c);
    int32_t * q = s == BIE_STATUS_OK ? codes->data : NULL;
    uint32_t * out = s == BIE_STATUS_OK ? qweight->data : NULL;
    if (s == BIE_STATUS_OK && pack) memset(out, 0, (size_t)(c.rows * c.N) * sizeof(uint32_t));
    for (int64_t r = 0; s == BIE_STATUS_OK && r < c.K; r++) {
        const int64_t g = r / c.gs;
        const int b = c.group_bits[g];
        const int64_t bit = c.bits ? r * b : c.group_word[g] * 32 + (r - g * c.gs) * b;
        for (int64_t n = 0; n < c.N && s == BIE_STATUS_OK; n++) {
            if (!pack) {
                q[r * c.N + n] = (int32_t)bie_wq_code(&c, out, r, n);
                continue;
            }
            const int32_t v = q[r * c.N + n];
            if (v < 0 || v >= (1 << b)) {
                s = bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "codes: [%lld, %lld] = %d is outside [0, %d]",
                                  (long long)r, (long long)n, (int)v, (1 << b) - 1);
                break;
            }
            const uint64_t u = (uint64_t)(uint32_t)v << (bit & 31);
            out[(bit >> 5) * c.N + n] |= (uint32_t)u;
            if (u >> 32) out[((bit >> 5) + 1) * c.N + n] |= (uint32_t)(u >> 32);
        }
    }
    if (s == BIE_STATUS_OK) bie_clear_error(ctx);
    release(owned);
    return s;
}

enum bie_status bie_wq_pack(bie_context_t * ctx, const struct bie_wq_desc * desc, const struct bie_tensor * group_bits,
                            const struct bie_tensor * codes, struct bie_tensor * qweight) {
    return codes_call(ctx, desc, group_bits, codes, qweight, true);
}

enum bie_status bie_wq_unpack(bie_context_t * ctx, const struct bie_wq_desc * desc,
                              const struct bie_tensor * group_bits, const struct bie_tensor * qweight,
                              struct bie_tensor * codes) {
    return codes_call(ctx, desc, group_bits, codes, qweight, false);
}

// Rounds v to the dtype of t and back (the value a kernel will read).
static float rounded(const struct bie_tensor * t, float v) {
    switch (t->dtype) {
    case BIE_DTYPE_F16: return bie_f16_to_f32(bie_f32_to_f16(v));
    case BIE_DTYPE_BF16: return bie_bf16_to_f32(bie_f32_to_bf16(v));
    default: return v;
    }
}

enum bie_status bie_wq_quantize(bie_context_t * ctx, const struct bie_wq_desc * desc, const struct bie_tensor * w,
                                const struct bie_wq_weight * weight) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    struct bie_wq_call c;
    void * owned[2] = {NULL, NULL};
    enum bie_status s = prepare(ctx, desc, weight, &c, owned);
    if (s == BIE_STATUS_OK && c.device_type != BIE_DEVICE_CPU)
        s = bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "qweight: must be a CPU tensor");
    if (s == BIE_STATUS_OK) s = bie_check_tensor(ctx, "w", w, false);
    if (s == BIE_STATUS_OK && (!bie_dtype_is_float(w->dtype) || w->ndim != 2 || w->shape[0] != c.K ||
                               w->shape[1] != c.N || w->device_type != BIE_DEVICE_CPU))
        s = bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "w: must be a float [%lld, %lld] CPU tensor",
                          (long long)c.K, (long long)c.N);
    if (s != BIE_STATUS_OK) {
        release(owned);
        return s;
    }
    uint32_t * qw = c.qweight.data;
    memset(qw, 0, (size_t)(c.rows * c.N) * sizeof(uint32_t));
    for (int64_t g = 0; g < c.G; g++) {
        const int b = c.group_bits[g];
        const int maxq = (1 << b) - 1;
        const int64_t r0 = g * c.gs, r1 = r0 + c.gs < c.K ? r0 + c.gs : c.K;
        for (int64_t n = 0; n < c.N; n++) {
            float lo = 0.0f, hi = 0.0f;
            for (int64_t r = r0; r < r1; r++) {
                const float v = (float)bie_load(w, r * w->stride[0] + n * w->stride[1]);
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
            }
            if (c.zero == BIE_WQ_ZERO_SYM) {
                hi = -lo > hi ? -lo : hi;
                if (lo < 0.0f) lo = -hi;
            }
            if (lo == 0.0f && hi == 0.0f) {
                lo = -1.0f;
                hi = 1.0f;
            }
            const float sc = rounded(&c.scales, (hi - lo) / (float)maxq);
            const float z = c.zero == BIE_WQ_ZERO_SYM ? (float)(1 << (b - 1)) : bie_rne(-lo / sc);
            bie_store(&c.scales, g * c.N + n, sc);
            if (c.zeros.data) bie_store(&c.zeros, g * c.N + n, c.zero == BIE_WQ_ZERO_OFFSET ? sc * z : z);
            for (int64_t r = r0; r < r1; r++) {
                const float v = (float)bie_load(w, r * w->stride[0] + n * w->stride[1]);
                float q = bie_rne(v / sc) + z;
                q = !(q > 0.0f) ? 0.0f : q > (float)maxq ? (float)maxq : q; // NaN -> 0
                const int64_t bit = c.bits ? r * b : c.group_word[g] * 32 + (r - r0) * b;
                const uint64_t u = (uint64_t)(uint32_t)q << (bit & 31);
                qw[(bit >> 5) * c.N + n] |= (uint32_t)u;
                if (u >> 32) qw[((bit >> 5) + 1) * c.N + n] |= (uint32_t)(u >> 32);
            }
        }
    }
    bie_clear_error(ctx);
    release(owned);
    return BIE_STATUS_OK;
}
