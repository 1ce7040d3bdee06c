// SPDX-License-Identifier: Apache-2.0
// ref-layer.c: the reference forward and backward of every layer (binary, 4-bit, 8-bit; linear
// and conv2d). This file is the specification; docs/semantics.md explains it in prose.
//
// Every call arrives normalised (src/ops/layer.c): x [N, C, H, W], weight [O, C, kh, kw],
// y and grad_y [N, O, OH, OW]; a linear layer is the case H = W = kh = kw = 1.
// Below, k runs over the taps (c, i, j) of a patch, K = C*kh*kw, and
//   h(oh, i) = oh*sh - ph + i*dh,   w(ow, j) = ow*sw - pw + j*dw.
//
// Codes (all float math in f32):
//   x'      = f32(x) + f32(bias_a[c])                        (bias_a absent: 0)
//             with x_clamp = t > 0: x' = min(max(f32(x), -t), t) + f32(bias_a[c])
//             (NaN stays NaN)
//   binary: a = +1 if x' >= 0 else -1 (NaN -> -1); B1 x: a = its bits
//           w = +1 if W >= 0 else -1 (float W; I8 latent W: v >= 0; B1 W: the bit)
//   n-bit:  a = clamp(rne(x'/scale_a), lo, hi)     lo, hi = -8, 7 (4-bit) or -128, 127 (8-bit)
//           w = clamp(rne(W/scale_w), lo, hi) for float W; I8 W: clamp(W, lo, hi); S4 W: W
//           (rne = round half to even; NaN -> lo)
// Padding: a_pad(n, c, h, w) = a(n, c, h, w) inside the image; outside it the pad value:
//           0 (BIE_PAD_ZERO, always for n-bit), -1 (BIE_PAD_MINUS_ONE), +1 (BIE_PAD_PLUS_ONE).
//
// Forward:
//   acc[n,o,oh,ow] = sum_k a_pad(n, c, h(oh,i), w(ow,j)) * w[o,c,i,j]          (exact integer)
//     binary: computed on packed bits, acc = popc(v) - 2*popc((a XOR w) AND v), where the bit
//             of a +-1 code is (code > 0) and v marks the valid taps (all taps for pad -1/+1;
//             taps inside the image for pad 0). The padding bits past K are 0 in v.
//     n-bit:  integer multiply-accumulate.
//     (a sum that leaves the int32 range wraps modulo 2^32, as in every int32 accumulator)
//   y = (float)acc * (scale_a * scale_w), the scale product once in f32, rounded to y's dtype;
//   y I32 = acc;  y B1 = (acc >= 0) (binary layers only).
//
// Backward (the straight-through surrogate; g = grad_y; sums in double, each output rounded
// once to its dtype):
//   gx[n,c,h,w]   = scale_w * sum over (o, oh, ow, i, j) with h(oh,i) = h, w(ow,j) = w of
//                   g[n,o,oh,ow] * w[o,c,i,j]
//   r             = x'/scale_a (f32 division)
//   binary: grad_x       = gx * 1{|r| <= 1}
//           grad_scale_a = sum(grad_x * a) / sqrt(numel(x))
//           (a B1 x saved by bie_binarize_ste: a = its bits and 1{|r| <= 1} = its x_mask, the
//           same numbers, as its x' was binarized by the same tests)
//   n-bit:  mid          = 1{lo <= r <= hi}
//           grad_x       = gx * mid
//           grad_scale_a = sum(gx * (lo*1{r < lo} + hi*1{r > hi} + mid*(rne(r) - r)))
//                          / sqrt(numel(x) * hi)          (LSQ; the clip terms use the unmasked gx)
//   grad_W[o,c,i,j] = scale_a * sum over (n, oh, ow) of g[n,o,oh,ow] * a_pad(n, c, h(oh,i), w(ow,j))
//                   (padded taps count with their pad value)
//   grad_bias_a[c]  = sum over (n, h, w) of grad_x[n,c,h,w]
//   then, with grad_x_mask (a B1 x only): grad_x = grad_x * grad_x_mask, and with x_clamp = t:
//   grad_x = grad_x * 1{|f32(x)| < t} (the clamp's derivative; grad_scale_a and grad_bias_a are
//   taken before either); with grad_x_add, last: grad_x = round(f32(round(grad_x)) +
//   f32(grad_x_add)) (the sum an add after the call makes)
// The surrogate behind these: binary y(x) = conv(scale_a*clip(x'/scale_a, -1, 1), w*scale_w)
// for grad_x (and the same with sign for grad_scale_a), y linear in the float weight W for
// grad_W (straight through the sign / rounding); n-bit y(x) = conv(scale_a*clip(x'/scale_a, lo,
// hi), w*scale_w) with the LSQ derivative of scale_a*clamp(rne(x'/scale_a)) for scale_a.
#include "ref/ref-impl.h"

#include <stdio.h>

#include <math.h>

#define WORD_BITS 64

// A planned workspace; each pointer is NULL when not needed.
struct ref_ws {
    float * xp;       // x' (float x only)
    int8_t * a;       // activation codes, x-shaped
    int8_t * mask;    // backward from saved bits: x_mask as +-1, x-shaped
    int8_t * gate;    // backward from saved bits: grad_x_mask as +-1, x-shaped
    int8_t * w;       // weight codes [O][K]
    int64_t * idx;    // one patch: dense x index or -1
    int8_t * val;     // one patch: a_pad
    uint64_t * wbits; // binary forward: weight rows, ceil(K/64) words each
    uint64_t * abits; // binary forward: one patch's bits
    uint64_t * vbits; // binary forward: one patch's valid taps
    double * y;       // forward: y-shaped output values; backward: grad_y
    double * gx;      // backward: gx, x-shaped
    double * gw;      // backward: grad_W sums [O][K]
};

static inline int64_t x_numel(const struct bie_geometry * g) { return g->batch * g->C * g->H * g->W; }
static inline int64_t y_numel(const struct bie_geometry * g) { return g->batch * g->O * g->OH * g->OW; }

// Plans and takes one workspace holding the arrays whose `want_*` flag is set.
static enum bie_status take_workspace(bie_context_t * ctx, const struct bie_layer_call * call, bool backward,
                                      bool want_gx, bool want_gw, struct ref_ws * ws) {
    const struct bie_geometry * g = &call->g;
    const bool binary_fwd = !backward && call->quant == BIE_QUANT_BINARY;
    const size_t kwords = (size_t)((g->K + WORD_BITS - 1) / WORD_BITS);
    const bool float_x = call->x.dtype != BIE_DTYPE_B1;
    struct bie_ref_arena ar = {0, false};
    const size_t o_xp = bie_ref_arena_take(&ar, float_x ? (size_t)x_numel(g) : 0, sizeof(float));
    const size_t o_a = bie_ref_arena_take(&ar, (size_t)x_numel(g), 1);
    const size_t o_m = bie_ref_arena_take(&ar, call->x_mask.data ? (size_t)x_numel(g) : 0, 1);
    const size_t o_gm = bie_ref_arena_take(&ar, call->grad_x_mask.data ? (size_t)x_numel(g) : 0, 1);
    const size_t o_w = bie_ref_arena_take(&ar, (size_t)(g->O * g->K), 1);
    const size_t o_idx = bie_ref_arena_take(&ar, (size_t)g->K, sizeof(int64_t));
    const size_t o_val = bie_ref_arena_take(&ar, (size_t)g->K, 1);
    const size_t o_wb = bie_ref_arena_take(&ar, binary_fwd ? (size_t)g->O * kwords : 0, sizeof(uint64_t));
    const size_t o_ab = bie_ref_arena_take(&ar, binary_fwd ? kwords : 0, sizeof(uint64_t));
    const size_t o_vb = bie_ref_arena_take(&ar, binary_fwd ? kwords : 0, sizeof(uint64_t));
    const size_t o_y = bie_ref_arena_take(&ar, (size_t)y_numel(g), sizeof(double));
    const size_t o_gx = bie_ref_arena_take(&ar, want_gx ? (size_t)x_numel(g) : 0, sizeof(double));
    const size_t o_gw = bie_ref_arena_take(&ar, want_gw ? (size_t)(g->O * g->K) : 0, sizeof(double));
    if (ar.overflow)
        return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY,
                             "workspace: the reference's workspace size overflows size_t");
    void * base;
    enum bie_status s = bie_host_workspace(ctx, ar.size, &base);
    if (s != BIE_STATUS_OK) return s;
    char * b = base;
    ws->xp = float_x ? (float *)(b + o_xp) : NULL;
    ws->a = (int8_t *)(b + o_a);
    ws->mask = call->x_mask.data ? (int8_t *)(b + o_m) : NULL;
    ws->gate = call->grad_x_mask.data ? (int8_t *)(b + o_gm) : NULL;
    ws->w = (int8_t *)(b + o_w);
    ws->idx = (int64_t *)(b + o_idx);
    ws->val = (int8_t *)(b + o_val);
    ws->wbits = binary_fwd ? (uint64_t *)(b + o_wb) : NULL;
    ws->abits = binary_fwd ? (uint64_t *)(b + o_ab) : NULL;
    ws->vbits = binary_fwd ? (uint64_t *)(b + o_vb) : NULL;
    ws->y = (double *)(b + o_y);
    ws->gx = want_gx ? (double *)(b + o_gx) : NULL;
    ws->gw = want_gw ? (double *)(b + o_gw) : NULL;
    return BIE_STATUS_OK;
}

// Loads x' (float x), the activation codes, the saved STE mask (B1 x) and the weight codes.
static void load_codes(const struct bie_layer_call * call, struct ref_ws * ws) {
    if (ws->xp) bie_ref_x_shifted(call, ws->xp);
    if (ws->mask) bie_ref_bits4(&call->x_mask, ws->mask);
    if (ws->gate) bie_ref_bits4(&call->grad_x_mask, ws->gate);
    bie_ref_x_codes(call, ws->xp, ws->a);
    bie_ref_w_codes(call, ws->w);
}

// Packs K codes (+-1, or 0 for an invalid tap) into bits (code > 0) and, when valid is non-NULL,
// a validity mask (code != 0). Bit k lives in word k/64, bit k%64; bits past K are 0.
static void pack_bits(const int8_t * codes, int64_t K, uint64_t * bits, uint64_t * valid) {
    const int64_t words = (K + WORD_BITS - 1) / WORD_BITS;
    for (int64_t q = 0; q < words; q++) {
        bits[q] = 0;
        if (valid) valid[q] = 0;
    }
    for (int64_t k = 0; k < K; k++) {
        const uint64_t m = (uint64_t)1 << (k % WORD_BITS);
        if (codes[k] > 0) bits[k / WORD_BITS] |= m;
        if (valid && codes[k] != 0) valid[k / WORD_BITS] |= m;
    }
}

// Binary dot product of a patch with weight row `wrow`: sum over valid taps of (+-1)(+-1)
// = (valid taps) - 2 * (valid taps where the bits differ).
static int64_t binary_dot(const uint64_t * abits, const uint64_t * vbits, const uint64_t * wrow, int64_t words) {
    int64_t valid = 0, differ = 0;
    for (int64_t q = 0; q < words; q++) {
        valid += __builtin_popcountll(vbits[q]);
        differ += __builtin_popcountll((abits[q] ^ wrow[q]) & vbits[q]);
    }
    return valid - 2 * differ;
}

static inline int32_t wrap_i32(int64_t v) { return (int32_t)(uint32_t)(uint64_t)v; }

// A planned call (call->plan): the reference sizes its workspace when it runs.
static enum bie_status plan_ref(struct bie_plan_info * plan) {
    plan->workspace = 0;
    snprintf(plan->route, sizeof plan->route, "reference (plain C, one thread)");
    return BIE_STATUS_OK;
}

enum bie_status bie_ref_layer_forward(bie_context_t * ctx, const struct bie_layer_call * call) {
    if (call->device_type != BIE_DEVICE_CPU) return BIE_DECLINED;
    if (call->plan) return plan_ref(call->plan);
    const struct bie_geometry * g = &call->g;
    struct ref_ws ws;
    enum bie_status s = take_workspace(ctx, call, false, false, false, &ws);
    if (s != BIE_STATUS_OK) return s;
    load_codes(call, &ws);
    const bool binary = call->quant == BIE_QUANT_BINARY;
    const int64_t K = g->K, words = (K + WORD_BITS - 1) / WORD_BITS;
    if (binary)
        for (int64_t o = 0; o < g->O; o++) pack_bits(ws.w + o * K, K, ws.wbits + o * words, NULL);
    const enum bie_dtype yd = call->y.dtype;
    const float scale = call->scale_a * call->scale_w; // once, in f32
    for (int64_t n = 0; n < g->batch; n++)
        for (int64_t oh = 0; oh < g->OH; oh++)
            for (int64_t ow = 0; ow < g->OW; ow++) {
                bie_ref_patch(g, ws.a, n, oh, ow, ws.idx, ws.val);
                if (binary) pack_bits(ws.val, K, ws.abits, ws.vbits);
                for (int64_t o = 0; o < g->O; o++) {
                    int64_t acc64 = 0;
                    if (binary) {
                        acc64 = binary_dot(ws.abits, ws.vbits, ws.wbits + o * words, words);
                    } else {
                        const int8_t * wrow = ws.w + o * K;
                        for (int64_t k = 0; k < K; k++) acc64 += (int64_t)ws.val[k] * wrow[k];
                    }
                    const int32_t acc = wrap_i32(acc64);
                    double v;
                    if (yd == BIE_DTYPE_I32) v = acc;
                    else if (yd == BIE_DTYPE_B1) v = acc >= 0 ? 1.0 : -1.0;
                    else v = (double)((float)acc * scale);
                    ws.y[((n * g->O + o) * g->OH + oh) * g->OW + ow] = v;
                }
            }
    bie_ref_store4(&call->y, ws.y);
    bie_ref_layer_epilogue(call);
    return BIE_STATUS_OK;
}

void bie_ref_layer_epilogue(const struct bie_layer_call * call) {
    if (!bie_layer_has_epilogue(call)) return;
    const struct bie_tensor *y = &call->y, *r = &call->residual;
    const float * mul = call->out_mul.data;
    const float * add = call->out_add.data;
    const float * bb = call->out_bits_bias.data;
    const struct bie_tensor * bits = &call->out_bits;
    const int64_t ms = call->out_mul.stride[0], as = call->out_add.stride[0], bs = call->out_bits_bias.stride[0];
    const bool update = mul || add || r->data; // (else y is only read, for the bits)
    for (int64_t n = 0; n < y->shape[0]; n++)
        for (int64_t o = 0; o < y->shape[1]; o++)
            for (int64_t h = 0; h < y->shape[2]; h++)
                for (int64_t w = 0; w < y->shape[3]; w++) {
                    const int64_t oy = n * y->stride[0] + o * y->stride[1] + h * y->stride[2] + w * y->stride[3];
                    if (update) {
                        float t = (float)bie_load(y, oy);
                        if (mul) t = t * mul[o * ms];
                        if (add) t = t + add[o * as];
                        if (r->data)
                            t = t + (float)bie_load(r, n * r->stride[0] + o * r->stride[1] + h * r->stride[2] +
                                                           w * r->stride[3]);
                        bie_store(y, oy, t);
                    }
                    if (!bits->data) continue;
                    const float v = (float)bie_load(y, oy); // (B1: bit = v >= 0, so NaN gives 0)
                    bie_store(bits,
                              n * bits->stride[0] + o * bits->stride[1] + h * bits->stride[2] + w * bits->stride[3],
                              bb ? v + bb[o * bs] : v);
                }
}

enum bie_status bie_ref_layer_backward(bie_context_t * ctx, const struct bie_layer_call * call) {
    if (call->device_type != BIE_DEVICE_CPU) return BIE_DECLINED;
    if (call->plan) return plan_ref(call->plan);
    const struct bie_geometry * g = &call->g;
    const bool want_gx = call->grad_x.data || call->grad_scale_a.data || call->grad_bias_a.data;
    const bool want_gw = call->grad_weight.data != NULL;
    if (!want_gx && !want_gw) return BIE_STATUS_OK; // nothing requested
    struct ref_ws ws;
    enum bie_status s = take_workspace(ctx, call, true, want_gx, want_gw, &ws);
    if (s != BIE_STATUS_OK) return s;
    load_codes(call, &ws);
    bie_ref_load4(&call->grad_y, ws.y);
    const int64_t K = g->K, nx = x_numel(g);
    if (want_gx)
        for (int64_t i = 0; i < nx; i++) ws.gx[i] = 0.0;
    if (want_gw)
        for (int64_t i = 0; i < g->O * K; i++) ws.gw[i] = 0.0;

    // The sums over taps: gx (without scale_w) and grad_W (without scale_a).
    for (int64_t n = 0; n < g->batch; n++)
        for (int64_t oh = 0; oh < g->OH; oh++)
            for (int64_t ow = 0; ow < g->OW; ow++) {
                bie_ref_patch(g, ws.a, n, oh, ow, ws.idx, ws.val);
                for (int64_t o = 0; o < g->O; o++) {
                    const double gy = ws.y[((n * g->O + o) * g->OH + oh) * g->OW + ow];
                    const int8_t * wrow = ws.w + o * K;
                    if (want_gx)
                        for (int64_t k = 0; k < K; k++)
                            if (ws.idx[k] >= 0) ws.gx[ws.idx[k]] += gy * wrow[k];
                    if (want_gw) {
                        double * gwrow = ws.gw + o * K;
                        for (int64_t k = 0; k < K; k++) gwrow[k] += gy * ws.val[k];
                    }
                }
            }

    if (want_gw) {
        for (int64_t i = 0; i < g->O * K; i++) ws.gw[i] *= (double)call->scale_a;
        bie_ref_store4(&call->grad_weight, ws.gw);
    }
    if (!want_gx) return BIE_STATUS_OK;

    // Masks and the scale gradient; ws.gx becomes grad_x in place.
    const bool binary = call->quant == BIE_QUANT_BINARY;
    const double lo = bie_quant_lo(call->quant), hi = bie_quant_hi(call->quant);
    double scale_sum = 0.0;
    for (int64_t i = 0; i < nx; i++) {
        const double gxi = ws.gx[i] * (double)call->scale_w;
        if (binary) { // the mask saved with a B1 x holds the same test of its x'
            const bool pass = ws.mask ? ws.mask[i] > 0 : bie_ref_ste_passes(ws.xp[i], call->scale_a);
            ws.gx[i] = pass ? gxi : 0.0;
            scale_sum += ws.gx[i] * ws.a[i];
        } else {
            const float r = ws.xp[i] / call->scale_a; // f32 division
            const bool mid = r >= (float)lo && r <= (float)hi;
            ws.gx[i] = mid ? gxi : 0.0;
            const double d = r < (float)lo ? lo : r > (float)hi ? hi : mid ? (double)bie_rne(r) - (double)r : 0.0;
            scale_sum += gxi * d;
        }
    }
    if (call->grad_scale_a.data) {
        const double denom = sqrt((double)nx * (binary ? 1.0 : hi));
        bie_ref_store_rounded(&call->grad_scale_a, 0, scale_sum / denom);
    }
    if (call->grad_bias_a.data) {
        const int64_t hw = g->H * g->W;
        for (int64_t c = 0; c < g->C; c++) {
            double sum = 0.0;
            for (int64_t n = 0; n < g->batch; n++) {
                const double * p = ws.gx + (n * g->C + c) * hw;
                for (int64_t i = 0; i < hw; i++) sum += p[i];
            }
            bie_ref_store_rounded(&call->grad_bias_a, c * call->grad_bias_a.stride[0], sum);
        }
    }
    if (ws.gate)
        for (int64_t i = 0; i < nx; i++)
            if (ws.gate[i] <= 0) ws.gx[i] = 0.0;
    if (call->grad_x.data) bie_ref_store4(&call->grad_x, ws.gx);
    if (call->grad_x.data && call->x_clamp > 0.0f) bie_ref_clamp_gate(call);
    if (call->grad_x_add.data) bie_ref_grad_x_add(call);
    return BIE_STATUS_OK;
}
