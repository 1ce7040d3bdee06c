// SPDX-License-Identifier: Apache-2.0
// layer-case.c: decoding, running and checking one case of the layer fuzzer (layer-case.h).
#include "layer-case.h"

#include "fuzz-bytes.h"
#include "../../tests/backward-tolerance.h"
#include "bie-impl.h" // element access on any view (bie_load, bie_store, bie_next_index)

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <float.h>
#include <string.h>

#ifdef FUZZ_CUDA
#include "bie-cuda.h"

#include <cuda_runtime_api.h>
#endif

// Roles of the tensors of a case (which ones a call uses depends on the op).
enum role {
    R_X,
    R_BIAS,
    R_W,
    R_SA,
    R_SW,
    R_Y,
    R_GY,
    R_GX,
    R_GW,
    R_GS,
    R_GB,
    R_MASK,
    R_BITS,
    R_OMUL,
    R_OADD,
    R_RES,
    R_OBITS,
    R_OBB, // the forward's output epilogue
    R_COUNT
};
static const char * const k_role[R_COUNT] = {"x",           "bias_a",   "weight",       "scale_a",     "scale_w",
                                             "y",           "grad_y",   "grad_x",       "grad_weight", "grad_scale_a",
                                             "grad_bias_a", "mask",     "bits",         "out_mul",     "out_add",
                                             "residual",    "out_bits", "out_bits_bias"};
enum op { OP_LIN_FWD, OP_LIN_BWD, OP_CONV_FWD, OP_CONV_BWD, OP_BINARIZE, OP_PACK, OP_UNPACK, OP_POOL, OP_COUNT };
static const char * const k_op[OP_COUNT] = {"linear forward",  "linear backward", "conv2d forward",
                                            "conv2d backward", "binarize_ste",    "pack",
                                            "unpack",          "affine max-pool"};

struct ft {
    bool present, output;
    struct bie_tensor t; // the view passed (t.data is buf, or what the case made of it)
    uint8_t * buf;       // host buffer of `bytes` bytes (the view's span and some slack)
    size_t bytes;
    uint8_t * init; // its content before the call
};

struct fcase {
    enum op op;
    struct bie_linear_desc lin;
    struct bie_conv2d_desc conv;
    struct bie_affine_maxpool2d_desc pool;
    struct ft r[R_COUNT];
    bool specials; // data holds NaN, infinities, huge and tiny values (forward-like calls only)
    char what[768];
};

// --- building views ----------------------------------------------------------------------------------

static uint64_t rng_next(uint64_t * s) { // splitmix64
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static bool is_float(enum bie_dtype d) { return d == BIE_DTYPE_F32 || d == BIE_DTYPE_F16 || d == BIE_DTYPE_BF16; }

static enum bie_dtype pick(struct fz * f, const enum bie_dtype * ds, int n) {
    if (fz_one_in(f, 40)) return (enum bie_dtype)fz_range(f, 0, 9); // any value, 9 is no dtype
    return ds[fz_range(f, 0, n - 1)];
}

// Fills the whole buffer: floats of the dtype (special values when asked), or random bytes.
static void fill(struct ft * t, uint64_t * rng, bool specials, float scale) {
    const enum bie_dtype d = t->t.dtype;
    if (!is_float(d) || !t->bytes) {
        for (size_t i = 0; i < t->bytes; i++) t->buf[i] = (uint8_t)rng_next(rng);
        return;
    }
    struct bie_tensor flat;
    const int64_t n = (int64_t)(t->bytes / (d == BIE_DTYPE_F32 ? 4 : 2));
    bie_tensor_make(&flat, t->buf, d, 1, &n);
    for (int64_t i = 0; i < n; i++) {
        const uint64_t r = rng_next(rng);
        double v = ((double)(r >> 11) * 0x1p-53 * 2.0 - 1.0) * scale;
        if (specials && (r & 63) == 0) {
            static const double s[6] = {NAN, INFINITY, -INFINITY, -0.0, 3e38, 1e-42};
            v = s[(r >> 6) % 6];
        }
        bie_store(&flat, i, v);
    }
}

// A view of shape[nd] and dtype d in a random layout: dense, a gap after one dimension's stride,
// dimensions stored in a permuted order, or (inputs) a broadcast dimension of stride 0. Sub-byte
// dtypes pad their innermost stored dimension to whole bytes, as bie_tensor_make does.
static void make_view(struct fz * f, struct ft * t, enum bie_dtype d, int nd, const int64_t * shape, bool output,
                      uint64_t * rng, bool specials, float scale) {
    memset(t, 0, sizeof *t);
    t->present = true;
    t->output = output;
    t->t.dtype = d;
    t->t.ndim = nd;
    int order[BIE_MAX_DIMS];
    for (int i = 0; i < nd; i++) order[i] = i;
    const int layout = (int)fz_range(f, 0, 7);
    if (layout == 2 && nd > 1) // permuted storage order
        for (int i = nd - 1; i > 0; i--) {
            const int j = (int)fz_range(f, 0, i), tmp = order[i];
            order[i] = order[j];
            order[j] = tmp;
        }
    const int bits = bie_dtype_valid(d) ? bie_dtype_bits(d) : 8;
    int64_t stride = 1;
    for (int i = nd - 1; i >= 0; i--) {
        const int dim = order[i];
        t->t.shape[dim] = shape[dim];
        t->t.stride[dim] = stride;
        int64_t extent = shape[dim] > 0 ? shape[dim] : 1;
        if (i == nd - 1 && bits < 8) extent = (extent + 8 / bits - 1) / (8 / bits) * (8 / bits);
        if (layout == 1 && i == nd - 1) extent += bits < 8 ? 8 : 3;                 // a gap after each innermost row
        if (extent > (INT64_C(1) << 24) || stride > (INT64_C(1) << 30)) extent = 1; // shapes are small here
        stride *= extent;
    }
    if (layout == 3 && !output && nd > 0) t->t.stride[fz_range(f, 0, nd - 1)] = 0; // broadcast
    size_t bytes = 0;
    const bool fits = bie_tensor_nbytes(&t->t, &bytes) == BIE_STATUS_OK && bytes <= ((size_t)64 << 20);
    if (!fits) bytes = 0;
    t->bytes = bytes + 16;
    t->buf = malloc(t->bytes);
    t->t.data = fits ? t->buf : NULL; // a view its buffer cannot hold goes as NULL data (refused)
    fill(t, rng, specials, scale);
    if (output) {
        t->init = malloc(t->bytes);
        memcpy(t->init, t->buf, t->bytes);
    }
}

// A scalar (ndim 0, or [1]) of a float dtype holding v (sometimes a bad value).
static void make_scale(struct fz * f, struct ft * t, uint64_t * rng, float v) {
    static const enum bie_dtype fl[3] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16};
    const int64_t one = 1;
    make_view(f, t, pick(f, fl, 3), (int)fz_range(f, 0, 1), &one, false, rng, false, 1.0f);
    if (fz_one_in(f, 24)) {
        static const float bad[6] = {0.0f, -1.0f, NAN, INFINITY, 3e38f, 1e-30f};
        v = bad[fz_range(f, 0, 5)];
    }
    if (is_float(t->t.dtype)) bie_store(&t->t, 0, v); // other dtypes keep their random bytes
}

// Sometimes breaks one field of a view so that the library must refuse it without touching the
// data (a legal but larger view of the same buffer would be the caller's error, not the library's:
// the values here are all refused by the contract: sizes <= 0, negative strides, extents past
// 2^57 elements, ranks outside [0, 8], unknown dtypes and devices, NULL data).
static void corrupt(struct fz * f, struct ft * t) {
    if (!t->present || !fz_one_in(f, 30)) return;
    struct bie_tensor * v = &t->t;
    const int which = (int)fz_range(f, 0, 7), d = v->ndim > 0 ? (int)fz_range(f, 0, v->ndim - 1) : 0;
    static const int64_t bad[5] = {0, -1, INT64_MAX, INT64_C(1) << 62, INT64_MIN};
    int64_t b = bad[fz_range(f, 0, 4)];
    if (which == 1 && b == 0) b = -1; // a stride of 0 is a legal broadcast of an input
    switch (which) {
    case 0:
        if (v->ndim > 0) v->shape[d] = b;
        break;
    case 1:
        if (v->ndim > 0) v->stride[d] = b;
        break;
    case 2: v->ndim = fz_one_in(f, 2) ? -1 : BIE_MAX_DIMS + 1; break;
    case 3: v->dtype = (enum bie_dtype)fz_range(f, 9, 255); break;
    case 4: v->device_type = (enum bie_device_type)fz_range(f, 2, 9); break;
    case 5: v->data = NULL; break;
    case 6: v->ndim = v->ndim > 0 ? v->ndim - 1 : 1; break; // a wrong rank
    default:
        if (v->ndim > 0) v->shape[d] += 1;
        break; // a wrong size (its buffer is the old one's)
    }
    // A wrong size with a buffer of the old size: give the buffer room for the new view, so that
    // a library that accepts it (a finding only if it should not) does not run past it.
    if (which == 7 && v->ndim > 0) {
        size_t bytes = 0;
        if (bie_tensor_nbytes(v, &bytes) == BIE_STATUS_OK && bytes + 16 > t->bytes && bytes < ((size_t)64 << 20)) {
            t->buf = realloc(t->buf, bytes + 16);
            memset(t->buf + t->bytes, 0, bytes + 16 - t->bytes);
            if (t->init) {
                t->init = realloc(t->init, bytes + 16);
                memset(t->init + t->bytes, 0, bytes + 16 - t->bytes);
            }
            t->bytes = bytes + 16;
            v->data = t->buf;
        }
    }
}

// --- decoding a case -----------------------------------------------------------------------------------

static const enum bie_dtype k_float[3] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16};

static enum bie_quant pick_quant(struct fz * f) {
    if (fz_one_in(f, 50)) return (enum bie_quant)fz_range(f, 0, 9);
    static const enum bie_quant q[3] = {BIE_QUANT_BINARY, BIE_QUANT_INT4, BIE_QUANT_INT8};
    return q[fz_range(f, 0, 2)];
}

static enum bie_dtype weight_dtype(struct fz * f, enum bie_quant q) {
    const enum bie_dtype w[5] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_I8,
                                 q == BIE_QUANT_BINARY ? BIE_DTYPE_B1
                                 : q == BIE_QUANT_INT4 ? BIE_DTYPE_S4
                                                       : BIE_DTYPE_BF16,
                                 BIE_DTYPE_F32};
    return pick(f, w, 5);
}

static void describe(struct fcase * c) {
    int len = snprintf(c->what, sizeof c->what, "%s quant %d", k_op[c->op], (int)c->lin.quant);
    if (c->op == OP_CONV_FWD || c->op == OP_CONV_BWD)
        len += snprintf(c->what + len, sizeof c->what - (size_t)len,
                        " C=%lld O=%lld k=%dx%d s=%dx%d p=%dx%d d=%dx%d g=%d pad=%d", (long long)c->conv.in_channels,
                        (long long)c->conv.out_channels, c->conv.kernel[0], c->conv.kernel[1], c->conv.stride[0],
                        c->conv.stride[1], c->conv.padding[0], c->conv.padding[1], c->conv.dilation[0],
                        c->conv.dilation[1], c->conv.groups, (int)c->conv.pad_value);
    else if (c->op <= OP_LIN_BWD)
        len += snprintf(c->what + len, sizeof c->what - (size_t)len, " K=%lld N=%lld", (long long)c->lin.in_features,
                        (long long)c->lin.out_features);
    else if (c->op == OP_POOL)
        len += snprintf(c->what + len, sizeof c->what - (size_t)len, " k=%dx%d s=%dx%d p=%dx%d clamp [%g, %g]",
                        c->pool.kernel_h, c->pool.kernel_w, c->pool.stride_h, c->pool.stride_w, c->pool.pad_h,
                        c->pool.pad_w, (double)c->pool.lo, (double)c->pool.hi);
    for (int r = 0; r < R_COUNT && len < (int)sizeof c->what - 80; r++) {
        const struct bie_tensor * t = &c->r[r].t;
        if (!c->r[r].present) continue;
        len += snprintf(c->what + len, sizeof c->what - (size_t)len, "; %s %s%s [", k_role[r], bie_dtype_name(t->dtype),
                        t->data ? "" : " (data NULL)");
        for (int i = 0; i < t->ndim && i < BIE_MAX_DIMS && len < (int)sizeof c->what - 40; i++)
            len += snprintf(c->what + len, sizeof c->what - (size_t)len, "%s%lld:%lld", i ? " " : "",
                            (long long)t->shape[i], (long long)t->stride[i]);
        len += snprintf(c->what + len, sizeof c->what - (size_t)len, "]");
    }
}

// Sometimes a forward's output epilogue (bie_forward_args): out_mul, out_add, a residual like y,
// out_bits and out_bits_bias, each in about half of those cases (no special values: NaN payloads
// are not part of the contract).
static void decode_epilogue(struct fz * f, struct fcase * c, int nd, const int64_t * ys, int64_t n_out,
                            uint64_t * rng) {
    if (!fz_one_in(f, 3)) return;
    static const enum bie_dtype k_f32[1] = {BIE_DTYPE_F32};
    const enum bie_dtype yd = c->r[R_Y].t.dtype;
    if (fz_one_in(f, 2)) make_view(f, &c->r[R_OMUL], pick(f, k_f32, 1), 1, &n_out, false, rng, false, 2.0f);
    if (fz_one_in(f, 2)) make_view(f, &c->r[R_OADD], pick(f, k_f32, 1), 1, &n_out, false, rng, false, 2.0f);
    if (fz_one_in(f, 2))
        make_view(f, &c->r[R_RES], is_float(yd) && !fz_one_in(f, 10) ? yd : pick(f, k_float, 3), nd, ys, false, rng,
                  false, 4.0f);
    if (fz_one_in(f, 2)) {
        make_view(f, &c->r[R_OBITS], BIE_DTYPE_B1, nd, ys, true, rng, false, 1.0f);
        if (fz_one_in(f, 2)) make_view(f, &c->r[R_OBB], pick(f, k_f32, 1), 1, &n_out, false, rng, false, 2.0f);
    }
}

// x and the layer tensors of a linear call: x [..., K] (1, 2 or 3 dims), weight [N, K].
static void decode_linear(struct fz * f, struct fcase * c, uint64_t * rng, bool backward) {
    const enum bie_quant q = pick_quant(f);
    int64_t K = fz_range(f, 1, fz_one_in(f, 8) ? 2200 : 80), N = fz_range(f, 1, 24);
    const int nd = (int)fz_range(f, 1, 3);
    int64_t lead[2] = {fz_range(f, 1, 12), fz_range(f, 1, 4)}, xs[3], ys[3];
    for (int i = 0; i < nd - 1; i++) xs[i] = ys[i] = lead[i];
    xs[nd - 1] = K;
    ys[nd - 1] = N;
    c->lin = (struct bie_linear_desc){q, K, N};
    const bool bits_x = q == BIE_QUANT_BINARY && fz_one_in(f, 5);
    const enum bie_dtype xd = bits_x ? BIE_DTYPE_B1 : pick(f, k_float, 3);
    make_view(f, &c->r[R_X], xd, nd, xs, false, rng, c->specials, 2.0f);
    if (!bits_x && fz_one_in(f, 2))
        make_view(f, &c->r[R_BIAS], pick(f, k_float, 3), 1, &K, false, rng, c->specials, 0.3f);
    const int64_t wsh[2] = {N, K};
    const enum bie_dtype wd = weight_dtype(f, q);
    make_view(f, &c->r[R_W], wd, 2, wsh, false, rng, c->specials, wd == BIE_DTYPE_I8 ? 200.0f : 1.0f);
    make_scale(f, &c->r[R_SA], rng, q == BIE_QUANT_BINARY ? 1.0f : 0.1f);
    make_scale(f, &c->r[R_SW], rng, 0.05f);
    if (!backward) {
        const enum bie_dtype yds[5] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16, BIE_DTYPE_I32,
                                       q == BIE_QUANT_BINARY ? BIE_DTYPE_B1 : BIE_DTYPE_F32};
        make_view(f, &c->r[R_Y], pick(f, yds, 5), nd, ys, true, rng, false, 1.0f);
        decode_epilogue(f, c, nd, ys, N, rng);
        return;
    }
    make_view(f, &c->r[R_GY], pick(f, k_float, 3), nd, ys, false, rng, false, 1.0f);
    if (!fz_one_in(f, 4)) make_view(f, &c->r[R_GX], pick(f, k_float, 3), nd, xs, true, rng, false, 1.0f);
    if (!fz_one_in(f, 4)) make_view(f, &c->r[R_GW], pick(f, k_float, 3), 2, wsh, true, rng, false, 1.0f);
    const int64_t one = 1;
    if (!fz_one_in(f, 4))
        make_view(f, &c->r[R_GS], pick(f, k_float, 3), (int)fz_range(f, 0, 1), &one, true, rng, false, 1.0f);
    if (!fz_one_in(f, 4)) make_view(f, &c->r[R_GB], pick(f, k_float, 3), 1, &K, true, rng, false, 1.0f);
    if (bits_x && !fz_one_in(f, 6)) make_view(f, &c->r[R_MASK], BIE_DTYPE_B1, nd, xs, false, rng, false, 1.0f);
}

static void decode_conv(struct fz * f, struct fcase * c, uint64_t * rng, bool backward) {
    struct bie_conv2d_desc * d = &c->conv;
    d->quant = pick_quant(f);
    d->in_channels = fz_range(f, 1, fz_one_in(f, 6) ? 70 : 12);
    d->out_channels = fz_range(f, 1, 12);
    for (int i = 0; i < 2; i++) {
        d->kernel[i] = (int32_t)fz_range(f, 1, 5);
        d->stride[i] = (int32_t)fz_range(f, 1, 3);
        d->padding[i] = (int32_t)fz_range(f, 0, 2);
        d->dilation[i] = (int32_t)fz_range(f, 1, 2);
    }
    d->groups = fz_one_in(f, 40) ? 2 : 1;
    d->pad_value = d->quant == BIE_QUANT_BINARY ? (enum bie_pad_value)fz_range(f, 0, 2) : BIE_PAD_ZERO;
    if (fz_one_in(f, 30)) { // a broken descriptor: values the contract refuses (a legal huge padding
        // would make a huge output, which the case's buffers do not hold)
        static const int32_t bad[4][3] = {
            {0, -1, INT32_MAX}, {0, -1, INT32_MIN}, {-1, INT32_MIN, -2}, {0, -1, INT32_MAX}};
        int32_t * fld[4] = {&d->kernel[0], &d->stride[1], &d->padding[0], &d->dilation[1]};
        const int which = (int)fz_range(f, 0, 3);
        *fld[which] = bad[which][fz_range(f, 0, 2)];
    }
    c->lin.quant = d->quant;
    const int64_t N = fz_range(f, 1, 3), H = fz_range(f, 1, 10), W = fz_range(f, 1, 10);
    int64_t OH = 1, OW = 1;
    bie_conv2d_output_size(d, H, W, &OH, &OW); // an invalid geometry keeps 1x1: the call must refuse it
    const int64_t xs[4] = {N, d->in_channels, H, W}, ys[4] = {N, d->out_channels, OH, OW};
    const int64_t ws[4] = {d->out_channels, d->in_channels, d->kernel[0] > 0 && d->kernel[0] < 64 ? d->kernel[0] : 1,
                           d->kernel[1] > 0 && d->kernel[1] < 64 ? d->kernel[1] : 1};
    make_view(f, &c->r[R_X], pick(f, k_float, 3), 4, xs, false, rng, c->specials, 2.0f);
    if (fz_one_in(f, 2))
        make_view(f, &c->r[R_BIAS], pick(f, k_float, 3), 1, &d->in_channels, false, rng, c->specials, 0.3f);
    const enum bie_dtype wd = weight_dtype(f, d->quant);
    make_view(f, &c->r[R_W], wd, 4, ws, false, rng, c->specials, wd == BIE_DTYPE_I8 ? 200.0f : 1.0f);
    make_scale(f, &c->r[R_SA], rng, d->quant == BIE_QUANT_BINARY ? 1.0f : 0.1f);
    make_scale(f, &c->r[R_SW], rng, 0.05f);
    if (!backward) {
        const enum bie_dtype yds[5] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16, BIE_DTYPE_I32,
                                       d->quant == BIE_QUANT_BINARY ? BIE_DTYPE_B1 : BIE_DTYPE_F32};
        make_view(f, &c->r[R_Y], pick(f, yds, 5), 4, ys, true, rng, false, 1.0f);
        decode_epilogue(f, c, 4, ys, d->out_channels, rng);
        return;
    }
    make_view(f, &c->r[R_GY], pick(f, k_float, 3), 4, ys, false, rng, false, 1.0f);
    if (!fz_one_in(f, 4)) make_view(f, &c->r[R_GX], pick(f, k_float, 3), 4, xs, true, rng, false, 1.0f);
    if (!fz_one_in(f, 4)) make_view(f, &c->r[R_GW], pick(f, k_float, 3), 4, ws, true, rng, false, 1.0f);
    const int64_t one = 1;
    if (!fz_one_in(f, 4)) make_view(f, &c->r[R_GS], pick(f, k_float, 3), 0, &one, true, rng, false, 1.0f);
    if (!fz_one_in(f, 4)) make_view(f, &c->r[R_GB], pick(f, k_float, 3), 1, &d->in_channels, true, rng, false, 1.0f);
}

static void decode_other(struct fz * f, struct fcase * c, uint64_t * rng) {
    const int nd = (int)fz_range(f, 1, 3);
    int64_t shape[3];
    for (int i = 0; i < nd; i++) shape[i] = fz_range(f, 1, i == nd - 1 ? 90 : 9);
    if (c->op == OP_BINARIZE) {
        make_view(f, &c->r[R_X], pick(f, k_float, 3), nd, shape, false, rng, c->specials, 2.0f);
        if (fz_one_in(f, 2))
            make_view(f, &c->r[R_BIAS], pick(f, k_float, 3), 1, &shape[nd - 1], false, rng, c->specials, 0.3f);
        make_scale(f, &c->r[R_SA], rng, 1.0f);
        if (!fz_one_in(f, 4)) make_view(f, &c->r[R_BITS], BIE_DTYPE_B1, nd, shape, true, rng, false, 1.0f);
        if (!fz_one_in(f, 4)) make_view(f, &c->r[R_MASK], BIE_DTYPE_B1, nd, shape, true, rng, false, 1.0f);
        return;
    }
    static const enum bie_dtype packed[3] = {BIE_DTYPE_B1, BIE_DTYPE_S4, BIE_DTYPE_I8};
    static const enum bie_dtype plain[4] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16, BIE_DTYPE_I8};
    const bool pack = c->op == OP_PACK;
    const enum bie_dtype sd = pack ? pick(f, plain, 4) : pick(f, packed, 3),
                         dd = pack ? pick(f, packed, 3) : pick(f, plain, 4);
    make_view(f, &c->r[R_X], sd, nd, shape, false, rng, c->specials, sd == BIE_DTYPE_I8 ? 200.0f : 3.0f);
    make_view(f, &c->r[R_Y], dd, nd, shape, true, rng, false, 1.0f);
    if (fz_one_in(f, 2)) make_scale(f, &c->r[R_SA], rng, 0.25f);
}

// bie_affine_maxpool2d_forward: x [N, C, H, W] with mul, add and bits_bias [C] and y, out_bits
// [N, C, OH, OW], sometimes a window, stride, padding or clamp the contract refuses. No special
// values in x (NaN payloads are not part of the contract; the CUDA tests check NaN's handling).
static void decode_pool(struct fz * f, struct fcase * c, uint64_t * rng) {
    struct bie_affine_maxpool2d_desc * d = &c->pool;
    const int64_t N = fz_range(f, 1, 3), C = fz_range(f, 1, fz_one_in(f, 4) ? 40 : 9), H = fz_range(f, 1, 12),
                  W = fz_range(f, 1, 12);
    d->kernel_h = (int32_t)fz_range(f, 1, 4), d->kernel_w = (int32_t)fz_range(f, 1, 4);
    d->stride_h = (int32_t)fz_range(f, 1, 3), d->stride_w = (int32_t)fz_range(f, 1, 3);
    d->pad_h = (int32_t)fz_range(f, 0, d->kernel_h / 2), d->pad_w = (int32_t)fz_range(f, 0, d->kernel_w / 2);
    static const float clamps[4][2] = {{-INFINITY, INFINITY}, {0.0f, INFINITY}, {-1.0f, 1.0f}, {0.5f, 0.5f}};
    const int k = (int)fz_range(f, 0, 3);
    d->lo = clamps[k][0], d->hi = clamps[k][1];
    if (fz_one_in(f, 30)) { // a broken descriptor
        static const int32_t bad[3] = {0, -1, INT32_MAX};
        int32_t * fld[4] = {&d->kernel_h, &d->stride_w, &d->pad_h, &d->kernel_w};
        *fld[fz_range(f, 0, 3)] = bad[fz_range(f, 0, 2)];
        if (fz_one_in(f, 2)) d->lo = fz_one_in(f, 2) ? NAN : 2.0f;
    }
    int64_t OH = 1, OW = 1; // an invalid geometry keeps 1x1: the call must refuse it
    if (d->kernel_h >= 1 && d->stride_h >= 1 && d->pad_h >= 0 && 2 * (int64_t)d->pad_h <= d->kernel_h &&
        H + 2 * d->pad_h >= d->kernel_h)
        OH = (H + 2 * d->pad_h - d->kernel_h) / d->stride_h + 1;
    if (d->kernel_w >= 1 && d->stride_w >= 1 && d->pad_w >= 0 && 2 * (int64_t)d->pad_w <= d->kernel_w &&
        W + 2 * d->pad_w >= d->kernel_w)
        OW = (W + 2 * d->pad_w - d->kernel_w) / d->stride_w + 1;
    const int64_t xs[4] = {N, C, H, W}, ys[4] = {N, C, OH, OW};
    static const enum bie_dtype k_f32[1] = {BIE_DTYPE_F32};
    make_view(f, &c->r[R_X], pick(f, k_float, 3), 4, xs, false, rng, false, 2.0f);
    make_view(f, &c->r[R_Y], pick(f, k_float, 3), 4, ys, true, rng, false, 1.0f);
    if (fz_one_in(f, 2)) make_view(f, &c->r[R_OMUL], pick(f, k_f32, 1), 1, &C, false, rng, false, 2.0f);
    if (fz_one_in(f, 2)) make_view(f, &c->r[R_OADD], pick(f, k_f32, 1), 1, &C, false, rng, false, 2.0f);
    if (fz_one_in(f, 2)) {
        make_view(f, &c->r[R_OBITS], BIE_DTYPE_B1, 4, ys, true, rng, false, 1.0f);
        if (fz_one_in(f, 2)) make_view(f, &c->r[R_OBB], pick(f, k_f32, 1), 1, &C, false, rng, false, 2.0f);
    }
}

static void decode(struct fz * f, struct fcase * c) {
    memset(c, 0, sizeof *c);
    uint64_t rng = fz_u32(f) | (uint64_t)fz_u32(f) << 32;
    c->op = (enum op)fz_range(f, 0, OP_COUNT - 1);
    const bool backward = c->op == OP_LIN_BWD || c->op == OP_CONV_BWD;
    c->specials = !backward && fz_one_in(f, 3);
    if (c->op <= OP_LIN_BWD) decode_linear(f, c, &rng, backward);
    else if (c->op <= OP_CONV_BWD) decode_conv(f, c, &rng, backward);
    else if (c->op == OP_POOL) decode_pool(f, c, &rng);
    else decode_other(f, c, &rng);
    for (int r = 0; r < R_COUNT; r++) corrupt(f, &c->r[r]);
    // Sometimes an output written over an input's or another output's memory: must be refused.
    if (fz_one_in(f, 25)) {
        const int out = (int)fz_range(f, R_Y, R_COUNT - 1), in = (int)fz_range(f, 0, R_COUNT - 1);
        if (c->r[out].present && c->r[in].present && out != in && c->r[in].bytes >= c->r[out].bytes)
            c->r[out].t.data = c->r[in].t.data;
    }
    // Sometimes a NULL argument (required or optional).
    if (fz_one_in(f, 25)) c->r[fz_range(f, 0, R_COUNT - 1)].present = false;
    describe(c);
}

static void free_case(struct fcase * c) {
    for (int r = 0; r < R_COUNT; r++) {
        free(c->r[r].buf);
        free(c->r[r].init);
    }
}

// --- running ------------------------------------------------------------------------------------------

static struct bie_tensor * arg(struct fcase * c, enum role r) { return c->r[r].present ? &c->r[r].t : NULL; }

static enum bie_status call(bie_context_t * ctx, struct fcase * c) {
    const struct bie_forward_args fa = {.x = arg(c, R_X),
                                        .bias_a = arg(c, R_BIAS),
                                        .weight = arg(c, R_W),
                                        .scale_a = arg(c, R_SA),
                                        .scale_w = arg(c, R_SW),
                                        .y = arg(c, R_Y),
                                        .out_mul = arg(c, R_OMUL),
                                        .out_add = arg(c, R_OADD),
                                        .residual = arg(c, R_RES),
                                        .out_bits = arg(c, R_OBITS),
                                        .out_bits_bias = arg(c, R_OBB)};
    const struct bie_backward_args ba = {arg(c, R_X),    arg(c, R_BIAS), arg(c, R_W),  arg(c, R_SA), arg(c, R_SW),
                                         arg(c, R_GY),   arg(c, R_GX),   arg(c, R_GW), arg(c, R_GS), arg(c, R_GB),
                                         arg(c, R_MASK), NULL,           NULL,         0.0f};
    switch (c->op) {
    case OP_LIN_FWD: return bie_linear_forward(ctx, &c->lin, &fa);
    case OP_LIN_BWD: return bie_linear_backward(ctx, &c->lin, &ba);
    case OP_CONV_FWD: return bie_conv2d_forward(ctx, &c->conv, &fa);
    case OP_CONV_BWD: return bie_conv2d_backward(ctx, &c->conv, &ba);
    case OP_BINARIZE:
        return bie_binarize_ste(ctx, arg(c, R_X), arg(c, R_BIAS), arg(c, R_SA), arg(c, R_BITS), arg(c, R_MASK));
    case OP_PACK: return bie_pack(ctx, arg(c, R_X), arg(c, R_SA), arg(c, R_Y));
    case OP_UNPACK: return bie_unpack(ctx, arg(c, R_X), arg(c, R_SA), arg(c, R_Y));
    case OP_POOL: {
        const struct bie_affine_maxpool2d_args pa = {
            arg(c, R_X), arg(c, R_OMUL), arg(c, R_OADD), arg(c, R_Y), arg(c, R_OBITS), arg(c, R_OBB), NULL};
        return bie_affine_maxpool2d_forward(ctx, &c->pool, &pa);
    }
    case OP_COUNT: break;
    }
    return BIE_STATUS_INTERNAL;
}

#ifdef FUZZ_CUDA
// A scale the library checks on the host (finite, > 0, a finite product): only such scales go to
// the device, where they are not checked (docs/semantics.md), so that both backends see one call.
static bool scale_ok(const struct ft * t) {
    if (!t->present || !t->t.data || !is_float(t->t.dtype) || t->t.ndim < 0 || t->t.ndim > 1) return false;
    const double v = bie_load(&t->t, 0);
    return isfinite(v) && v > 0;
}

// The call with every tensor (a layer's valid scales too, half of the time) in device memory
// (bie_pack's scale is a host value by its contract): buffers copied in,
// outputs copied back into the host buffers. A view that aliases another's buffer aliases the
// device copy of it.
static enum bie_status call_cuda(bie_context_t * ctx, struct fcase * c, bool device_scales) {
    device_scales = device_scales && c->op <= OP_CONV_BWD && scale_ok(&c->r[R_SA]) && scale_ok(&c->r[R_SW]) &&
                    isfinite((float)bie_load(&c->r[R_SA].t, 0) * (float)bie_load(&c->r[R_SW].t, 0));
    void * dev[R_COUNT] = {0};
    struct bie_tensor keep[R_COUNT];
    enum bie_status s = BIE_STATUS_OK;
    for (int r = 0; r < R_COUNT; r++) {
        keep[r] = c->r[r].t;
        // (a view the case gave a bad device type keeps it: the call must refuse it on either backend)
        if (!c->r[r].present || !c->r[r].buf || c->r[r].t.device_type != BIE_DEVICE_CPU ||
            ((r == R_SA || r == R_SW) && !device_scales))
            continue;
        if (cudaMalloc(&dev[r], c->r[r].bytes) != cudaSuccess ||
            cudaMemcpy(dev[r], c->r[r].buf, c->r[r].bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
            s = BIE_STATUS_DEVICE_ERROR;
            break;
        }
    }
    // Each view goes where its data is: a view of a buffer that was copied (its own, or another's
    // that it aliases) becomes a device view of the copy; a view of a buffer left on the host (a
    // host scale) stays a host view, even when its own buffer was copied.
    for (int o = 0; s == BIE_STATUS_OK && o < R_COUNT; o++) {
        if (!c->r[o].present || keep[o].device_type != BIE_DEVICE_CPU) continue;
        for (int r = 0; r < R_COUNT; r++)
            if (c->r[r].buf && keep[o].data == c->r[r].buf) {
                if (dev[r]) {
                    c->r[o].t.data = dev[r];
                    c->r[o].t.device_type = BIE_DEVICE_CUDA;
                    c->r[o].t.device_index = 0;
                }
                break;
            }
    }
    if (s == BIE_STATUS_OK) {
        s = call(ctx, c);
        if (bie_context_cuda_synchronize(ctx) != BIE_STATUS_OK) s = BIE_STATUS_DEVICE_ERROR;
    }
    for (int r = 0; r < R_COUNT; r++) {
        if (dev[r] && c->r[r].output) cudaMemcpy(c->r[r].buf, dev[r], c->r[r].bytes, cudaMemcpyDeviceToHost);
        cudaFree(dev[r]);
        c->r[r].t = keep[r];
    }
    return s;
}
#endif

// --- checking -----------------------------------------------------------------------------------------

static void finding(const struct fcase * c, const char * backend, const char * fmt, const char * detail) {
    fprintf(stderr, "\nbie layer fuzzer: %s: ", backend);
    fprintf(stderr, fmt, detail);
    fprintf(stderr, "\n  case: %s\n", c->what);
    abort();
}

// Byte i of out's buffer is covered by one of the view's elements (>= 16-bit float dtypes only).
static void covered(const struct bie_tensor * t, uint8_t * mark) {
    const int eb = bie_dtype_bits(t->dtype) / 8;
    int64_t idx[BIE_MAX_DIMS] = {0};
    do {
        memset(mark + bie_offset(t, idx) * eb, 1, (size_t)eb);
    } while (bie_next_index(t, idx));
}

// The gradients of a backend (got) against the reference's (want), within the tolerance of
// tests/backward-tolerance.h, and the bytes around them untouched.
static void check_backward(const struct fcase * c, const char * backend, uint8_t * const * got,
                           uint8_t * const * want) {
    const bool conv = c->op == OP_CONV_BWD;
    const struct bie_tensor *x = &c->r[R_X].t, *gy = &c->r[R_GY].t;
    int64_t nx = 1, ny = 1;
    for (int i = 0; i < x->ndim; i++) nx *= x->shape[i];
    for (int i = 0; i < gy->ndim; i++) ny *= gy->shape[i];
    const int64_t O = conv ? c->conv.out_channels : c->lin.out_features;
    const int64_t C = conv ? c->conv.in_channels : c->lin.in_features;
    const double n_x = conv ? (double)(O * c->conv.kernel[0] * c->conv.kernel[1]) : (double)O;
    const double gmax = tensor_max_abs(gy), sa = bie_load(&c->r[R_SA].t, 0), sw = bie_load(&c->r[R_SW].t, 0);
    struct backward_tolerance t =
        backward_tolerance(c->lin.quant, gmax, sa, sw, n_x, (double)(ny / O), (double)(nx / C), (double)nx);
    // CUDA's conv backward may round its sums to grad_y's dtype when no gradient is more precise
    // (the cuDNN route; which route a call takes is the backend's choice)
    const bool cuda = !strcmp(backend, "cuda");
    bool rounded = conv && cuda && (gy->dtype == BIE_DTYPE_F16 || gy->dtype == BIE_DTYPE_BF16);
    for (int r = R_GX; rounded && r <= R_GB; r++)
        if (c->r[r].present && backward_rounding(c->r[r].t.dtype) < backward_rounding(gy->dtype)) rounded = false;
    if (rounded)
        t = backward_tolerance_rounded(c->lin.quant, t, backward_rounding(gy->dtype), gmax, sa, sw, n_x,
                                       (double)(ny / O), (double)(nx / C), (double)nx);
    const double tol[R_COUNT] = {[R_GX] = t.x, [R_GW] = t.w, [R_GB] = t.b, [R_GS] = t.s};
    // The bound of each output's sum of |terms| (grad_scale_a's before its division): where it passes
    // FLT_MAX, an f32 partial sum may overflow.
    const double lo = c->lin.quant == BIE_QUANT_BINARY ? 1 : c->lin.quant == BIE_QUANT_INT4 ? 8 : 128;
    const double s_x = n_x * gmax * lo * sw;
    const double sums[R_COUNT] = {[R_GX] = s_x,
                                  [R_GW] = (double)(ny / O) * gmax * lo * sa,
                                  [R_GB] = (double)(nx / C) * s_x,
                                  [R_GS] = (double)nx * s_x * lo};
    for (int r = R_GX; r <= R_GB; r++) {
        if (!c->r[r].present || !got[r]) continue;
        struct bie_tensor g = c->r[r].t, w = c->r[r].t;
        g.data = got[r];
        w.data = want[r];
        const double rel = backward_rounding(g.dtype);
        int64_t idx[BIE_MAX_DIMS] = {0};
        do {
            const int64_t off = bie_offset(&g, idx);
            const double a = bie_load(&g, off), b = bie_load(&w, off);
            // (on CUDA, not finite where the reference's is not, or where the sums may pass FLT_MAX:
            // the f32 partial sums overflowed, and which infinity or NaN comes out depends on the
            // order of the terms; docs/semantics.md)
            const bool overflowed = cuda && !isfinite(a) && (!isfinite(b) || sums[r] >= FLT_MAX);
            if (a != b && !(fabs(a - b) <= tol[r] + 2.0 * rel * fabs(b) + 1e-30) && !(isnan(a) && isnan(b)) &&
                !overflowed) {
                char d[160];
                snprintf(d, sizeof d, "%s[%lld] = %.9g, the reference %.9g (tolerance %.3g)", k_role[r], (long long)off,
                         a, b, tol[r]);
                finding(c, backend, "%s", d);
            }
        } while (bie_next_index(&g, idx));
        uint8_t * mark = calloc(c->r[r].bytes, 1);
        covered(&g, mark);
        for (size_t i = 0; i < c->r[r].bytes; i++)
            if (!mark[i] && got[r][i] != c->r[r].init[i])
                finding(c, backend, "wrote outside the view of %s", k_role[r]);
        free(mark);
    }
}

bool fuzz_backends_init(struct fuzz_backends * b, bool with_cuda) {
    memset(b, 0, sizeof *b);
    struct bie_context_params p;
    bie_context_params_default(&p);
    p.backend = BIE_BACKEND_REF;
    p.num_threads = 1;
    if (bie_context_create(&p, &b->ctx[0]) != BIE_STATUS_OK) return false;
    b->name[b->n++] = "ref";
    static const char * const isa_names[5] = {"cpu/scalar", "cpu/avx2", "cpu/avx512", "cpu/avx512vpopcnt",
                                              "cpu/avx512vnni"};
    for (int i = BIE_CPU_ISA_SCALAR; i <= (int)bie_cpu_isa_detected() && i <= BIE_CPU_ISA_AVX512_VNNI; i++) {
        p.backend = BIE_BACKEND_CPU;
        p.max_isa = (enum bie_cpu_isa)i;
        p.num_threads = i == (int)bie_cpu_isa_detected() ? 2 : 1;
        if (bie_context_create(&p, &b->ctx[b->n]) != BIE_STATUS_OK) return false;
        b->name[b->n++] = isa_names[i];
    }
    if (with_cuda) {
        bie_context_params_default(&p);
        p.backend = BIE_BACKEND_CUDA;
        if (bie_context_create(&p, &b->ctx[b->n]) != BIE_STATUS_OK) return false;
        b->cuda[b->n] = true;
        b->name[b->n++] = "cuda";
    }
    return true;
}

void fuzz_backends_free(struct fuzz_backends * b) {
    for (int i = 0; i < b->n; i++) bie_context_destroy(b->ctx[i]);
    memset(b, 0, sizeof *b);
}

int fuzz_layer_case(const struct fuzz_backends * b, const uint8_t * data, size_t size) {
    struct fz f = {data, size, 0};
    struct fcase c;
    decode(&f, &c);
    static int verbose = -1; // BIE_FUZZ_VERBOSE=1: print each case before running it
    if (verbose < 0) verbose = getenv("BIE_FUZZ_VERBOSE") != NULL;
    if (verbose) fprintf(stderr, "case: %s\n", c.what);
    const bool backward = c.op == OP_LIN_BWD || c.op == OP_CONV_BWD;
    uint8_t * want[R_COUNT] = {0};
    enum bie_status ref_status = BIE_STATUS_OK;
    char ref_error[BIE_ERROR_CAP] = "";
    for (int i = 0; i < b->n; i++) {
        for (int r = 0; r < R_COUNT; r++)
            if (c.r[r].init) memcpy(c.r[r].buf, c.r[r].init, c.r[r].bytes);
        enum bie_status s;
#ifdef FUZZ_CUDA
        s = b->cuda[i] ? call_cuda(b->ctx[i], &c, size > 0 && (data[0] & 1)) : call(b->ctx[i], &c);
#else
        s = call(b->ctx[i], &c);
#endif
        if (i == 0) {
            ref_status = s;
            snprintf(ref_error, sizeof ref_error, "%s", bie_context_last_error(b->ctx[0]));
            for (int r = 0; r < R_COUNT; r++)
                if (c.r[r].output && s == BIE_STATUS_OK) {
                    want[r] = malloc(c.r[r].bytes);
                    memcpy(want[r], c.r[r].buf, c.r[r].bytes);
                }
            continue;
        }
        if (b->cuda[i] && s == BIE_STATUS_UNSUPPORTED) continue; // documented gaps of the CUDA backend
        if (s != ref_status) {
            char d[2 * BIE_ERROR_CAP + 64];
            snprintf(d, sizeof d, "status %s (\"%s\"), the reference %s (\"%s\")", bie_status_string(s),
                     bie_context_last_error(b->ctx[i]), bie_status_string(ref_status), ref_error);
            finding(&c, b->name[i], "%s", d);
        }
        if (s != BIE_STATUS_OK) continue;
        if (backward) {
            uint8_t * got[R_COUNT] = {0};
            for (int r = 0; r < R_COUNT; r++) got[r] = c.r[r].output ? c.r[r].buf : NULL;
            check_backward(&c, b->name[i], got, want);
            continue;
        }
        for (int r = 0; r < R_COUNT; r++)
            if (c.r[r].output && c.r[r].present && memcmp(c.r[r].buf, want[r], c.r[r].bytes) != 0)
                finding(&c, b->name[i], "%s differs from the reference's (the whole buffer must be identical)",
                        k_role[r]);
    }
    if (verbose) fprintf(stderr, "  -> %s %s\n", bie_status_string(ref_status), bie_context_last_error(b->ctx[0]));
    for (int r = 0; r < R_COUNT; r++) free(want[r]);
    free_case(&c);
    return ref_status == BIE_STATUS_OK;
}
