// SPDX-License-Identifier: Apache-2.0
// cpu-backward.c: backward of every layer through OpenBLAS sgemm (the float GEMMs of the
// straight-through estimator), with the masks and reductions fused into one pass over x.
//
// With codes a (x-shaped: +-1 or n-bit codes), weight codes w [O][K] (K = C*kh*kw in (c, i, j)
// order, as the weight) and g = grad_y:
//   linear (x [M][K]):  gx     = g[M][O] @ (w*scale_w)[O][K]                 (sgemm NN)
//                       grad_W = scale_a * g^T[O][M] @ a[M][K]               (sgemm TN)
//                       (blocks of K columns on OpenMP threads; for binary layers on AVX-512
//                       both are float-by-sign GEMMs over bits instead, cpu-signgemm.c)
//   conv, in tasks of a few samples on OpenMP threads:
//                       col[K][n*P] = im2col of a_pad (P = OH*OW; pads at their value),
//                       G[O][n*P] = g of those samples,
//                       part_t = scale_a * G @ col^T                         (sgemm NT)
//                       dcol    = (w*scale_w)^T @ G;  gx = col2im(dcol)      (sgemm TN)
//                       grad_W = the sum of the parts in task order
// Then one pass over x computes r = x'/scale_a, grad_x = gx * mask and per-row / per-plane
// double partials of grad_scale_a, added in a fixed order, and grad_bias_a sums each channel on
// one thread: the result does not depend on the thread count. A binary linear layer's x may be the
// bits saved by bie_binarize_ste (with x_mask): its codes are the bits, its mask the saved one, and
// the pass sums in the same order as for the float x, so every gradient is the same to the bit.
//
// Every sgemm runs on its OpenMP thread only (cpu_sgemm_1t, cpu-sgemm.h): OpenBLAS's process-wide
// thread count is neither read nor changed, and results do not depend on it.
//
// When f32 overflows (grad_y or a scale near FLT_MAX), the GEMMs' infinities cannot give the
// reference's double sums (an inf * 0 or inf - inf makes NaN where the reference has a finite or
// -inf result): the call then goes to the reference backend. Every partial sum of grad_W is at most
// scale_a * |code| * (terms) * max|grad_y|, and of gx scale_w * |code| * (terms) * max|grad_y|; only
// when these bounds reach FLT_MAX / 4 (or max|grad_y| is not finite) is grad_W checked for a
// non-finite value after the GEMMs, and grad_x's through its grad_scale_a partials (always).
//
// Accuracy: sgemm sums in f32 (in its own order) where the reference sums in double, so float
// outputs differ from it by at most about n*eps_f32*sum|terms| (n terms per output; see
// tests/test-cpu-backward.c; the float-by-sign GEMM rounds each 4-term table entry, scaled, once
// and then adds n/4 entries, within the same bound), while every mask and code is computed exactly
// as in the reference.
#include "cpu/cpu-impl.h"
#include "cpu/cpu-sgemm.h"
#include "ref/ref-impl.h"

#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

int64_t bie_cpu_bwd_task_pixels = 2048;
int64_t bie_cpu_bwd_wave_max = 16;

static void store_float(const struct bie_tensor * t, int64_t off, float v) {
    switch (t->dtype) {
    case BIE_DTYPE_F32: ((float *)t->data)[off] = v; break;
    case BIE_DTYPE_F16: ((uint16_t *)t->data)[off] = bie_f32_to_f16(v); break;
    case BIE_DTYPE_BF16: ((uint16_t *)t->data)[off] = bie_f32_to_bf16(v); break;
    default: bie_store(t, off, v); break;
    }
}

struct bwd {
    const struct bie_layer_call * c;
    const struct bie_geometry * g;
    int threads;
    const struct cpu_kernels * kern;
    bool binary;
    int lo, hi;
    float * bias;            // dense [C]
    float * acode;           // dense NCHW codes of x (when grad_weight is wanted)
    float * wf;              // [O][K] w * scale_w (when gx is wanted)
    uint32_t *a_idx, *w_idx; // instead of acode and wf on the sign-GEMM path: their sign-index blocks
    float * gx;              // dense NCHW
    float * xrow;            // per thread: a row of x' for the binary linear mask pass (ste_row)
};

static inline float x_prime(const struct bwd * b, int64_t off, int64_t ch) {
    return cpu_load(&b->c->x, off) + b->bias[ch];
}

static inline float code_of(const struct bwd * b, float xp) {
    if (b->binary) return xp >= 0.0f ? 1.0f : -1.0f;
    return (float)cpu_quantize1(xp, b->c->scale_a, b->lo, b->hi);
}

static void make_codes(const struct bwd * b) {
    const struct bie_geometry * g = b->g;
    const int64_t * xs = b->c->x.stride;
    if (!b->c->is_conv && b->c->x.dtype == BIE_DTYPE_F32 && xs[1] == 1) {
#pragma omp parallel for num_threads(b->threads)
        for (int64_t n = 0; n < g->batch; n++) {
            const float * src = (const float *)b->c->x.data + n * xs[0];
            float * d = b->acode + n * g->C;
            if (b->binary)
                for (int64_t ch = 0; ch < g->C; ch++) d[ch] = src[ch] + b->bias[ch] >= 0.0f ? 1.0f : -1.0f;
            else
                for (int64_t ch = 0; ch < g->C; ch++) d[ch] = code_of(b, src[ch] + b->bias[ch]);
        }
        return;
    }
    const int64_t planes = g->batch * g->C, HW = g->H * g->W;
    const bool fast = b->c->x.dtype == BIE_DTYPE_F32 && (g->W == 1 || xs[3] == 1) && (g->H == 1 || xs[2] == g->W);
#pragma omp parallel for num_threads(b->threads)
    for (int64_t pl = 0; pl < planes; pl++) {
        const int64_t n = pl / g->C, ch = pl % g->C;
        float * d = b->acode + pl * HW;
        if (fast) {
            const float * xp = (const float *)b->c->x.data + n * xs[0] + ch * xs[1];
            const float bias = b->bias[ch];
            if (b->binary)
                for (int64_t e = 0; e < HW; e++) d[e] = xp[e] + bias >= 0.0f ? 1.0f : -1.0f;
            else
                for (int64_t e = 0; e < HW; e++) d[e] = code_of(b, xp[e] + bias);
            continue;
        }
        for (int64_t h = 0; h < g->H; h++)
            for (int64_t w = 0; w < g->W; w++)
                d[h * g->W + w] = code_of(b, x_prime(b, n * xs[0] + ch * xs[1] + h * xs[2] + w * xs[3], ch));
    }
}

// True when element (c, i, j) of every weight row sits at offset c*kh*kw + i*kw + j.
static bool weight_rows_dense(const struct bie_geometry * g, const int64_t * ws) {
    return (g->C == 1 || ws[1] == g->kh * g->kw) && (g->kh == 1 || ws[2] == g->kw) && (g->kw == 1 || ws[3] == 1);
}

static void make_wf(const struct bwd * b) {
    const struct bie_geometry * g = b->g;
    const struct bie_tensor * w = &b->c->weight;
    const int64_t * ws = w->stride;
    const bool is_float = bie_dtype_is_float(w->dtype);
    const float sw = b->c->scale_w;
    if (w->dtype == BIE_DTYPE_F32 && weight_rows_dense(g, ws)) {
        const int64_t K = g->K;
#pragma omp parallel for num_threads(b->threads)
        for (int64_t o = 0; o < g->O; o++) {
            const float * src = (const float *)w->data + o * ws[0];
            float * d = b->wf + o * K;
            if (b->binary) {
                for (int64_t k = 0; k < K; k++) d[k] = src[k] >= 0.0f ? sw : -sw;
            } else {
                for (int64_t k = 0; k < K; k++) d[k] = (float)cpu_quantize1(src[k], sw, b->lo, b->hi) * sw;
            }
        }
        return;
    }
#pragma omp parallel for num_threads(b->threads)
    for (int64_t o = 0; o < g->O; o++)
        for (int64_t ch = 0; ch < g->C; ch++)
            for (int64_t i = 0; i < g->kh; i++)
                for (int64_t j = 0; j < g->kw; j++) {
                    const float v = cpu_load(w, o * ws[0] + ch * ws[1] + i * ws[2] + j * ws[3]);
                    float q;
                    if (b->binary) q = v >= 0.0f ? 1.0f : -1.0f;
                    else if (is_float) q = (float)cpu_quantize1(v, sw, b->lo, b->hi);
                    else q = v < (float)b->lo ? (float)b->lo : v > (float)b->hi ? (float)b->hi : v;
                    b->wf[((o * g->C + ch) * g->kh + i) * g->kw + j] = q * sw;
                }
}

// G[o][nl*P + p] = grad_y[n0 + nl, o, p] for nl < nb.
static void gather_g(const struct bwd * b, int64_t n0, int64_t nb, float * G, int nt) {
    const struct bie_geometry * g = b->g;
    const struct bie_tensor * gy = &b->c->grad_y;
    const int64_t * s = gy->stride;
    const int64_t P = g->OH * g->OW, ld = nb * P;
    const bool rows = gy->dtype == BIE_DTYPE_F32 && s[3] == 1 && s[2] == g->OW;
#pragma omp parallel for num_threads(nt) if (nt > 1)
    for (int64_t t = 0; t < g->O * nb; t++) {
        const int64_t o = t / nb, nl = t % nb;
        float * d = G + o * ld + nl * P;
        const int64_t base = (n0 + nl) * s[0] + o * s[1];
        if (rows) {
            memcpy(d, (const float *)gy->data + base, (size_t)P * sizeof(float));
        } else {
            for (int64_t p = 0; p < P; p++) d[p] = cpu_load(gy, base + (p / g->OW) * s[2] + (p % g->OW) * s[3]);
        }
    }
}

// Output columns ow whose input column iw = ow*sw - pw + j*dw lies inside [0, W): [*lo, *hi).
static void valid_range(int64_t out, int64_t in, int64_t s, int64_t p, int64_t off, int64_t * lo, int64_t * hi) {
    // iw >= 0  <=>  ow >= ceil((p - off) / s);   iw < in  <=>  ow <= floor((in - 1 + p - off) / s)
    const int64_t a = p - off, b = in - 1 + p - off;
    int64_t l = a <= 0 ? 0 : (a + s - 1) / s;
    int64_t h = b < 0 ? 0 : b / s + 1;
    if (h > out) h = out;
    if (l > h) l = h;
    *lo = l;
    *hi = h;
}

// col[k][nl*P + p] = a_pad at tap k = (c, i, j) of output pixel p of sample n0 + nl (one thread).
static void im2col(const struct bwd * b, int64_t n0, int64_t nb, float * col) {
    const struct bie_geometry * g = b->g;
    const int64_t P = g->OH * g->OW, ld = nb * P;
    const float pad = !b->binary                          ? 0.0f
                      : g->pad_value == BIE_PAD_MINUS_ONE ? -1.0f
                      : g->pad_value == BIE_PAD_PLUS_ONE  ? 1.0f
                                                          : 0.0f;
    for (int64_t k = 0; k < g->K; k++) {
        const int64_t ch = k / (g->kh * g->kw), i = (k / g->kw) % g->kh, j = k % g->kw;
        int64_t lo, hi;
        valid_range(g->OW, g->W, g->sw, g->pw, j * g->dw, &lo, &hi);
        for (int64_t nl = 0; nl < nb; nl++) {
            const float * src = b->acode + ((n0 + nl) * g->C + ch) * g->H * g->W;
            float * d = col + k * ld + nl * P;
            for (int64_t oh = 0; oh < g->OH; oh++, d += g->OW) {
                const int64_t ih = oh * g->sh - g->ph + i * g->dh;
                if (ih < 0 || ih >= g->H) {
                    for (int64_t ow = 0; ow < g->OW; ow++) d[ow] = pad;
                    continue;
                }
                const int64_t base = ih * g->W - g->pw + j * g->dw; // + ow*sw: inside the row for lo <= ow < hi
                for (int64_t ow = 0; ow < lo; ow++) d[ow] = pad;
                for (int64_t ow = lo; ow < hi; ow++) d[ow] = src[base + ow * g->sw];
                for (int64_t ow = hi; ow < g->OW; ow++) d[ow] = pad;
            }
        }
    }
}

// gx[n0 + nl, c] = sum over taps of dcol (one thread).
static void col2im(const struct bwd * b, int64_t n0, int64_t nb, const float * dcol) {
    const struct bie_geometry * g = b->g;
    const int64_t P = g->OH * g->OW, ld = nb * P;
    for (int64_t t = 0; t < nb * g->C; t++) {
        const int64_t nl = t / g->C, ch = t % g->C;
        float * dst = b->gx + ((n0 + nl) * g->C + ch) * g->H * g->W;
        memset(dst, 0, (size_t)(g->H * g->W) * sizeof(float));
        for (int64_t i = 0; i < g->kh; i++)
            for (int64_t j = 0; j < g->kw; j++) {
                int64_t lo, hi;
                valid_range(g->OW, g->W, g->sw, g->pw, j * g->dw, &lo, &hi);
                const float * src = dcol + ((ch * g->kh + i) * g->kw + j) * ld + nl * P;
                for (int64_t oh = 0; oh < g->OH; oh++) {
                    const int64_t ih = oh * g->sh - g->ph + i * g->dh;
                    if (ih < 0 || ih >= g->H) continue;
                    const int64_t base = ih * g->W - g->pw + j * g->dw;
                    const float * sr = src + oh * g->OW;
                    for (int64_t ow = lo; ow < hi; ow++) dst[base + ow * g->sw] += sr[ow];
                }
            }
    }
}

// max |grad_y| (NaN or inf when grad_y holds one): a maximum, so the same whatever the threads.
static double grad_y_max_abs(const struct bwd * b) {
    const struct bie_tensor * gy = &b->c->grad_y;
    const struct bie_geometry * g = b->g;
    const int64_t * s = gy->stride;
    const int64_t rows = g->batch * g->O, P = g->OH * g->OW;
    const bool dense = gy->dtype == BIE_DTYPE_F32 && (g->OW == 1 || s[3] == 1) && (g->OH == 1 || s[2] == g->OW);
    float m = 0.0f; // fmaxf ignores NaN: a NaN or inf shows in the plain sum beside it
    float inf_or_nan = 0.0f;
#pragma omp parallel for num_threads(b->threads) reduction(max : m) reduction(+ : inf_or_nan)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t base = (r / g->O) * s[0] + (r % g->O) * s[1];
        float rm = 0.0f, rs = 0.0f;
        if (dense) {
            const float * row = (const float *)gy->data + base;
            for (int64_t p = 0; p < P; p++) {
                rm = fmaxf(rm, fabsf(row[p]));
                rs += row[p] * 0.0f; // 0, or NaN for an inf or NaN element
            }
        } else {
            for (int64_t oh = 0; oh < g->OH; oh++)
                for (int64_t ow = 0; ow < g->OW; ow++) {
                    const float v = cpu_load(gy, base + oh * s[2] + ow * s[3]);
                    rm = fmaxf(rm, fabsf(v));
                    rs += v * 0.0f;
                }
        }
        m = fmaxf(m, rm);
        inf_or_nan += rs;
    }
    return inf_or_nan == 0.0f ? (double)m : INFINITY;
}

static bool all_finite(const float * p, int64_t rows, int64_t cols, int64_t ld) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < cols; k++)
            if (!isfinite(p[r * ld + k])) return false;
    return true;
}

// One element of the final pass: returns grad_x and adds its grad_scale_a term to *ssum.
static inline float mask_one(const struct bwd * b, float xp, float gxi, double * ssum) {
    const float r = xp / b->c->scale_a;
    if (b->binary) {
        const float out = fabsf(r) <= 1.0f ? gxi : 0.0f;
        *ssum += (double)out * (xp >= 0.0f ? 1.0 : -1.0);
        return out;
    }
    const float lo = (float)b->lo, hi = (float)b->hi;
    const bool mid = r >= lo && r <= hi;
    const double d = r < lo ? lo : r > hi ? hi : mid ? (double)bie_rne(r) - (double)r : 0.0;
    *ssum += (double)gxi * d;
    return mid ? gxi : 0.0f;
}

// Row n of a binary linear layer's x as x' values that mask_binary decides as it would x' itself, in
// row (C floats): x' = x + bias_a for a float x; for saved bits (a B1 x and its x_mask), a value
// with that sign bit and that STE test: 0 (bit 1, passes), +inf (bit 1, stopped), -scale_a (bit 0,
// passes: |-scale_a / scale_a| = 1), -inf (bit 0, stopped).
static const float * ste_row(const struct bwd * b, int64_t n, float * row) {
    const struct bie_layer_call * c = b->c;
    const int64_t * xs = c->x.stride;
    const int64_t * ms = c->x_mask.stride;
    if (!c->x_mask.data) {
        for (int64_t ch = 0; ch < b->g->C; ch++) row[ch] = x_prime(b, n * xs[0] + ch * xs[1], ch);
        return row;
    }
    const float value[4] = {-INFINITY, -c->scale_a, INFINITY, 0.0f};                // [sign bit * 2 + pass bit]
    if (xs[1] == 1 && ms[1] == 1 && (n * xs[0]) % 8 == 0 && (n * ms[0]) % 8 == 0) { // rows on whole bytes
        const uint8_t * sb = (const uint8_t *)c->x.data + n * xs[0] / 8;
        const uint8_t * pb = (const uint8_t *)c->x_mask.data + n * ms[0] / 8;
        for (int64_t ch = 0; ch < b->g->C; ch++)
            row[ch] = value[((sb[ch >> 3] >> (ch & 7)) & 1u) * 2 + ((pb[ch >> 3] >> (ch & 7)) & 1u)];
        return row;
    }
    for (int64_t ch = 0; ch < b->g->C; ch++)
        row[ch] = value[(cpu_load(&c->x, n * xs[0] + ch * xs[1]) > 0.0f) * 2 +
                        (cpu_load(&c->x_mask, n * ms[0] + ch * ms[1]) > 0.0f)];
    return row;
}

// Pass 1: b->gx becomes grad_x (masked, in place; stored to grad_x too) and part_s[seg] gets the
// grad_scale_a partial of each segment (a row of a linear x, an (n, c) plane of a conv x).
static void finish_gx(const struct bwd * b, double * part_s) {
    const struct bie_layer_call * c = b->c;
    const struct bie_geometry * g = b->g;
    const int64_t * xs = c->x.stride;
    const int64_t * gs = c->grad_x.stride;
    if (!c->is_conv) {
        const bool x_rows = c->x.dtype == BIE_DTYPE_F32 && xs[1] == 1; // x' = the row + bias, read in place
        const bool gx_rows = c->grad_x.dtype == BIE_DTYPE_F32 && gs[1] == 1;
#pragma omp parallel for num_threads(b->threads)
        for (int64_t n = 0; n < g->batch; n++) {
            float * gxp = b->gx + n * g->C;
            double ssum = 0.0;
            if (b->binary) { // every x (float or saved bits) through the one vector pass, in its order
                const float * xr = x_rows ? (const float *)c->x.data + n * xs[0]
                                          : ste_row(b, n, b->xrow + (size_t)omp_get_thread_num() * (size_t)g->C);
                ssum = b->kern->mask_binary(xr, x_rows ? b->bias : NULL, 0.0f, c->scale_a, gxp, g->C);
            } else if (x_rows) {
                const float * xr = (const float *)c->x.data + n * xs[0];
                double lanes[8] = {0};
                for (int64_t ch = 0; ch < g->C; ch++)
                    gxp[ch] = mask_one(b, xr[ch] + b->bias[ch], gxp[ch], &lanes[ch & 7]);
                for (int l = 0; l < 8; l++) ssum += lanes[l];
            } else {
                for (int64_t ch = 0; ch < g->C; ch++)
                    gxp[ch] = mask_one(b, x_prime(b, n * xs[0] + ch * xs[1], ch), gxp[ch], &ssum);
            }
            const int64_t * ms = c->grad_x_mask.stride; // (grad_x_mask: saved bits only, after the sums)
            if (c->grad_x.data && c->grad_x_mask.data)
                for (int64_t ch = 0; ch < g->C; ch++)
                    store_float(&c->grad_x, n * gs[0] + ch * gs[1],
                                cpu_load(&c->grad_x_mask, n * ms[0] + ch * ms[1]) > 0.0f ? gxp[ch] : 0.0f);
            else if (c->grad_x.data && gx_rows)
                memcpy((float *)c->grad_x.data + n * gs[0], gxp, (size_t)g->C * sizeof(float));
            else if (c->grad_x.data)
                for (int64_t ch = 0; ch < g->C; ch++) store_float(&c->grad_x, n * gs[0] + ch * gs[1], gxp[ch]);
            part_s[n] = ssum;
        }
        return;
    }
    const int64_t planes = g->batch * g->C, HW = g->H * g->W;
    // Dense f32 planes (NCHW-like x and grad_x): plain pointer loops.
    const bool fast = c->x.dtype == BIE_DTYPE_F32 && (g->W == 1 || xs[3] == 1) && (g->H == 1 || xs[2] == g->W) &&
                      (!c->grad_x.data ||
                       (c->grad_x.dtype == BIE_DTYPE_F32 && (g->W == 1 || gs[3] == 1) && (g->H == 1 || gs[2] == g->W)));
#pragma omp parallel for num_threads(b->threads)
    for (int64_t pl = 0; pl < planes; pl++) {
        const int64_t n = pl / g->C, ch = pl % g->C;
        float * gxp = b->gx + pl * HW;
        double ssum = 0.0;
        if (fast) {
            const float * xp = (const float *)c->x.data + n * xs[0] + ch * xs[1];
            const float bias = b->bias[ch];
            if (b->binary) {
                ssum = b->kern->mask_binary(xp, NULL, bias, c->scale_a, gxp, HW);
            } else {
                double lanes[8] = {0}; // 8 independent sums (a fixed order)
                for (int64_t e = 0; e < HW; e++) gxp[e] = mask_one(b, xp[e] + bias, gxp[e], &lanes[e & 7]);
                for (int l = 0; l < 8; l++) ssum += lanes[l];
            }
            if (c->grad_x.data)
                memcpy((float *)c->grad_x.data + n * gs[0] + ch * gs[1], gxp, (size_t)HW * sizeof(float));
            part_s[pl] = ssum;
            continue;
        }
        for (int64_t h = 0; h < g->H; h++)
            for (int64_t w = 0; w < g->W; w++) {
                float * v = gxp + h * g->W + w;
                *v = mask_one(b, x_prime(b, n * xs[0] + ch * xs[1] + h * xs[2] + w * xs[3], ch), *v, &ssum);
                if (c->grad_x.data) store_float(&c->grad_x, n * gs[0] + ch * gs[1] + h * gs[2] + w * gs[3], *v);
            }
        part_s[pl] = ssum;
    }
}

// Pass 2: grad_bias_a[c] = sum over n, then h, w of grad_x, each channel summed by one thread in a
// fixed order.
static void bias_grad(const struct bwd * b) {
    const struct bie_layer_call * c = b->c;
    const struct bie_geometry * g = b->g;
    const int64_t hw = g->H * g->W;
#pragma omp parallel for num_threads(b->threads)
    for (int64_t ch = 0; ch < g->C; ch++) {
        double s = 0.0;
        for (int64_t n = 0; n < g->batch; n++) {
            const float * p = b->gx + (n * g->C + ch) * hw;
            for (int64_t i = 0; i < hw; i++) s += p[i];
        }
        store_float(&c->grad_bias_a, ch * c->grad_bias_a.stride[0], (float)s);
    }
}

// A linear layer's two GEMMs through sgemm, over fixed blocks of LIN_KB columns of K, each block
// on one OpenMP thread (cpu_sgemm_1t), so that every output is the same sum whatever the thread
// count (a threaded OpenBLAS sgemm picks other blockings for other thread counts, and its results
// move with them). g is grad_y as [M][O] rows ldg apart, or (g_om) its transpose G [O][M]:
//   grad_x (gx, before the mask) = grad_y @ wf      grad_W = scale_a * grad_y^T @ acode
#define LIN_KB 256
static void linear_sgemms(const struct bwd * b, const float * g, int ldg, bool g_om, float * gw, int ldgw) {
    const struct bie_layer_call * c = b->c;
    const int M = (int)b->g->batch, O = (int)b->g->O, K = (int)b->g->K;
    const bool want_gw = c->grad_weight.data != NULL;
    const bool want_gx = c->grad_x.data || c->grad_scale_a.data || c->grad_bias_a.data;
    const CBLAS_TRANSPOSE tx = g_om ? CblasTrans : CblasNoTrans, tw = g_om ? CblasNoTrans : CblasTrans;
#pragma omp parallel for schedule(dynamic, 1) num_threads(b->threads)
    for (int k0 = 0; k0 < K; k0 += LIN_KB) {
        const int kb = K - k0 < LIN_KB ? K - k0 : LIN_KB;
        if (want_gx) cpu_sgemm_1t(tx, CblasNoTrans, M, kb, O, 1.0f, g, ldg, b->wf + k0, K, 0.0f, b->gx + k0, K);
        if (want_gw)
            cpu_sgemm_1t(tw, CblasNoTrans, O, kb, M, c->scale_a, g, ldg, b->acode + k0, K, 0.0f, gw + k0, ldgw);
    }
}

// The conv's GEMMs, in tasks of nb samples on OpenMP threads, each running its sgemms on its own
// thread (cpu_sgemm_1t: one threading runtime, OpenBLAS's threads never compete with OpenMP's):
//   task t: G_t = grad_y of its samples [O][cols]; col_t = im2col [K][cols];
//           part_t = scale_a * G_t @ col_t^T;  dcol_t = (w*scale_w)^T @ G_t;  gx = col2im(dcol_t)
//   grad_W = sum of part_t in task order (waves of `wave` tasks).
static void conv_tasks(const struct bwd * b, int64_t nb, int64_t wave, float * work, float * parts, float * gw,
                       int ldgw) {
    const struct bie_layer_call * c = b->c;
    const struct bie_geometry * g = b->g;
    const int64_t K = g->K, O = g->O, P = g->OH * g->OW;
    const int64_t ntask = (g->batch + nb - 1) / nb;
    const size_t per_thread = cpu_round_up((size_t)((O + K) * nb * P) * sizeof(float), 64) / sizeof(float);
    const bool want_gw = c->grad_weight.data != NULL;
    const bool want_gx = c->grad_x.data || c->grad_scale_a.data || c->grad_bias_a.data;
    for (int64_t w0 = 0; w0 < ntask; w0 += wave) {
        const int64_t w1 = w0 + wave < ntask ? w0 + wave : ntask;
#pragma omp parallel for schedule(dynamic, 1) num_threads(b->threads)
        for (int64_t t = w0; t < w1; t++) {
            float * G = work + (size_t)omp_get_thread_num() * per_thread;
            float * col = G + O * nb * P;
            const int64_t n0 = t * nb, cnt = g->batch - n0 < nb ? g->batch - n0 : nb;
            const int cols = (int)(cnt * P);
            gather_g(b, n0, cnt, G, 1);
            if (want_gw) {
                im2col(b, n0, cnt, col);
                cpu_sgemm_1t(CblasNoTrans, CblasTrans, (int)O, (int)K, cols, c->scale_a, G, cols, col, cols, 0.0f,
                             parts + (size_t)(t - w0) * (size_t)(O * K), (int)K);
            }
            if (want_gx) {
                cpu_sgemm_1t(CblasTrans, CblasNoTrans, (int)K, cols, (int)O, 1.0f, b->wf, (int)K, G, cols, 0.0f, col,
                             cols);
                col2im(b, n0, cnt, col);
            }
        }
        if (!want_gw) continue;
#pragma omp parallel for num_threads(b->threads)
        for (int64_t o = 0; o < O; o++)
            for (int64_t k = 0; k < K; k++) {
                float v = w0 == 0 ? 0.0f : gw[o * ldgw + k];
                for (int64_t t = 0; t < w1 - w0; t++) v += parts[(size_t)t * (size_t)(O * K) + (size_t)(o * K + k)];
                gw[o * ldgw + k] = v;
            }
    }
}

// The binary linear GEMMs as float-by-sign GEMMs (cpu-signgemm.c) over the sign-index blocks of
// a = sign(x + bias_a) [M][K] (b->a_idx) and of sign(W) [O][K] (b->w_idx):
//   grad_x = scale_w * grad_y @ sign(W),   grad_W = scale_a * grad_y^T @ a
// read grad_y(m, o) = F[m*fm + o*fo] from grad_y's dense rows (g_rows) or from the gathered G [O][M].
static void linear_sign_gemms(const struct bwd * b, bool g_rows, float * work, float * gw, int ldgw, void * tab) {
    const struct bie_layer_call * c = b->c;
    const int64_t M = b->g->batch, O = b->g->O, K = b->g->K;
    const bool want_gw = c->grad_weight.data != NULL;
    const bool want_gx = c->grad_x.data || c->grad_scale_a.data || c->grad_bias_a.data;
    uint32_t *ia = b->a_idx, *iw = b->w_idx;
    if (want_gw) cpu_signgemm_idx(b->kern, &c->x, M, K, c->x.stride[0], c->x.stride[1], b->bias, b->threads, ia);
    if (want_gx)
        cpu_signgemm_idx(b->kern, &c->weight, O, K, c->weight.stride[0], c->weight.stride[1], NULL, b->threads, iw);
    const float * F = c->grad_y.data;
    ptrdiff_t fm = M == 1 ? (ptrdiff_t)O : (ptrdiff_t)c->grad_y.stride[0], fo = 1;
    if (!g_rows) {
        gather_g(b, 0, M, work, b->threads);
        F = work;
        fm = 1;
        fo = (ptrdiff_t)M;
    }
    if (want_gx) {
        const struct cpu_signgemm job = {.f = F,
                                         .rs = fm,
                                         .cs = fo,
                                         .R = M,
                                         .J = O,
                                         .K = K,
                                         .alpha = c->scale_w,
                                         .idx = iw,
                                         .c = b->gx,
                                         .ldc = (size_t)K};
        cpu_signgemm_run(b->kern, &job, b->threads, tab);
    }
    if (want_gw) {
        const struct cpu_signgemm job = {.f = F,
                                         .rs = fo,
                                         .cs = fm,
                                         .R = O,
                                         .J = M,
                                         .K = K,
                                         .alpha = c->scale_a,
                                         .idx = ia,
                                         .c = gw,
                                         .ldc = (size_t)ldgw};
        cpu_signgemm_run(b->kern, &job, b->threads, tab);
    }
}

// The regions of the backward's host workspace, in order (0 bytes: not used by the route).
enum bwd_region {
    R_BIAS,  // bias_a, dense [C]
    R_ACODE, // activation codes (sgemm route, grad_weight wanted)
    R_WF,    // w * scale_w (sgemm route, grad_x wanted)
    R_GX,    // gx, dense NCHW
    R_WORK,  // per-thread work buffers (conv: G and col per task; linear: G = grad_y^T unless g_rows)
    R_PARTS, // grad_W partials of a wave of conv tasks
    R_GW,    // grad_W [O][K] unless written in place
    R_PART,  // grad_scale_a partials, one per segment
    R_TAB,   // the sign GEMMs' tables
    R_AIDX,  // sign-index blocks of x + bias_a
    R_WIDX,  // and of the weight
    R_XROW,  // per thread: a row of x' (binary linear mask pass)
    R_REGIONS
};

// A backward call's route on the CPU, chosen before anything runs (bwd_route_make).
struct bwd_route {
    bool want_gx, want_gw, linear;
    bool sign_gemm;         // both GEMMs as float-by-sign GEMMs (cpu-signgemm.c)
    bool gw_direct;         // grad_W straight into grad_weight
    bool g_rows;            // a linear grad_y of dense f32 rows is G itself
    int64_t nb, wave, nseg; // conv tasks of nb samples, grad_W partials of `wave` tasks at a time; STE segments
    size_t size[R_REGIONS], total;
};

static void bwd_route_make(const struct bwd * b, struct bwd_route * r) {
    const struct bie_layer_call * c = b->c;
    const struct bie_geometry * g = b->g;
    r->want_gx = c->grad_x.data || c->grad_scale_a.data || c->grad_bias_a.data;
    r->want_gw = c->grad_weight.data != NULL;
    const bool want_gx = r->want_gx, want_gw = r->want_gw;
    const int64_t K = g->K, O = g->O, P = g->OH * g->OW, nx = g->batch * g->C * g->H * g->W;
    const bool linear = r->linear = !c->is_conv;
    // Binary linear layers on a kernel table that has it: both GEMMs as float-by-sign GEMMs
    // (cpu-signgemm.c) over sign bits of the weight and of x + bias_a, instead of sgemm over f32
    // +-1 matrices.
    const bool sign_gemm = r->sign_gemm = linear && b->binary && b->kern->fsign_tile;
    // Conv tasks: `nb` samples each (about 2048 output pixels, and a [K][nb*P] column matrix of at most
    // 4 Mi floats); grad_W partials of `wave` tasks at a time (at most 64 MiB), added in task order.
    // Both depend on the shape only, so the result does not depend on the thread count.
    int64_t nb = (bie_cpu_bwd_task_pixels + P - 1) / P;
    if (nb * K * P > ((int64_t)4 << 20)) nb = ((int64_t)4 << 20) / (K * P);
    if (nb < 1) nb = 1;
    if (nb > g->batch) nb = g->batch;
    const int64_t ntask = (g->batch + nb - 1) / nb;
    int64_t wave = ((int64_t)64 << 20) / (int64_t)sizeof(float) / (O * K);
    if (wave > bie_cpu_bwd_wave_max) wave = bie_cpu_bwd_wave_max;
    if (wave < 1) wave = 1;
    if (wave > ntask) wave = ntask;
    r->nb = nb;
    r->wave = wave;
    const int nthr = b->threads;
    // grad_W straight into grad_weight when it is a dense f32 [O][K] row block. A single row's
    // stride[0] is never used (a legal view may have any, e.g. 1 for PyTorch's empty(K, 1).T):
    // then the rows are K apart.
    const int64_t * gws = c->grad_weight.stride;
    r->gw_direct = want_gw && c->grad_weight.dtype == BIE_DTYPE_F32 && (O == 1 || gws[0] >= K) && gws[0] <= INT32_MAX &&
                   (linear ? gws[1] == 1 : (gws[3] == 1 && gws[2] == g->kw && gws[1] == g->kh * g->kw));
    r->g_rows = linear && c->grad_y.dtype == BIE_DTYPE_F32 && c->grad_y.stride[1] == 1 &&
                (g->batch == 1 || c->grad_y.stride[0] >= O);
    r->nseg = linear ? g->batch : g->batch * g->C;
    const size_t f = sizeof(float);
    size_t * z = r->size;
    z[R_BIAS] = (size_t)g->C * f;
    z[R_ACODE] = want_gw && !sign_gemm ? (size_t)nx * f : 0;
    z[R_WF] = want_gx && !sign_gemm ? (size_t)(O * K) * f : 0;
    z[R_GX] = want_gx ? (size_t)nx * f : 0;
    z[R_WORK] = linear ? (r->g_rows ? 0 : (size_t)(O * g->batch) * f)
                       : (size_t)nthr * cpu_round_up((size_t)((O + K) * nb * P) * f, 64);
    z[R_PARTS] = !linear && want_gw ? (size_t)(wave * O * K) * f : 0;
    z[R_GW] = want_gw && !r->gw_direct ? (size_t)(O * K) * f : 0;
    z[R_PART] = want_gx ? (size_t)r->nseg * sizeof(double) : 0;
    z[R_TAB] = sign_gemm ? cpu_signgemm_workspace(nthr) : 0;
    z[R_AIDX] = want_gw && sign_gemm ? cpu_signgemm_idx_bytes(g->batch, K) : 0;
    z[R_WIDX] = want_gx && sign_gemm ? cpu_signgemm_idx_bytes(O, K) : 0;
    z[R_XROW] = want_gx && linear && b->binary ? (size_t)nthr * (size_t)g->C * f : 0;
    r->total = 0;
    for (int i = 0; i < R_REGIONS; i++) r->total += cpu_arena_size(z[i]);
}

// The route in words, after bie_cpu_plan's backend words, for bie_plan_describe.
static enum bie_status bwd_route_describe(bie_context_t * ctx, const struct bie_layer_call * c,
                                          const struct bwd_route * r) {
    const enum bie_status st = bie_cpu_plan(ctx, c);
    if (st != BIE_STATUS_OK) return st;
    size_t n = strlen(c->plan->route);
    n += (size_t)snprintf(c->plan->route + n, sizeof c->plan->route - n, "; backward by %s GEMMs",
                          r->sign_gemm ? "float-by-sign" : "sgemm");
    if (!r->linear && n < sizeof c->plan->route)
        n += (size_t)snprintf(c->plan->route + n, sizeof c->plan->route - n,
                              ", conv tasks of %lld samples, grad_weight partials of %lld tasks at a time",
                              (long long)r->nb, (long long)r->wave);
    if (n < sizeof c->plan->route)
        snprintf(c->plan->route + n, sizeof c->plan->route - n, "; grad_weight %s",
                 !r->want_gw    ? "not asked"
                 : r->gw_direct ? "written in place"
                                : "scattered");
    c->plan->workspace = r->total;
    return BIE_STATUS_OK;
}

// grad_W's bound check and scatter, then grad_x's mask pass and the scale_a and bias_a gradients.
static enum bie_status bwd_finish(const struct bwd * b, const struct bwd_route * r, const float * gw, int ldgw,
                                  double * part_s) {
    const struct bie_layer_call * c = b->c;
    const struct bie_geometry * g = b->g;
    const int64_t K = g->K, O = g->O, P = g->OH * g->OW, nx = g->batch * g->C * g->H * g->W;
    if (r->want_gw) { // the bound of every grad_W partial sum (see the top of this file)
        const double code = b->binary ? 1.0 : -(double)b->lo, terms = (double)(g->batch * P);
        const double bound = (double)c->scale_a * code * terms * grad_y_max_abs(b);
        if (!(bound < FLT_MAX / 4) && !all_finite(gw, O, K, ldgw)) return BIE_DECLINED;
    }
    if (r->want_gw && !r->gw_direct) {
        const int64_t * s = c->grad_weight.stride;
        for (int64_t o = 0; o < O; o++)
            for (int64_t k = 0; k < K; k++) {
                const int64_t ch = k / (g->kh * g->kw), i = (k / g->kw) % g->kh, j = k % g->kw;
                store_float(&c->grad_weight, o * s[0] + ch * s[1] + i * s[2] + j * s[3], gw[o * K + k]);
            }
    }
    if (!r->want_gx) return BIE_STATUS_OK;
    finish_gx(b, part_s);
    for (int64_t i = 0; i < r->nseg; i++)
        if (!isfinite(part_s[i])) return BIE_DECLINED; // f32 overflowed: the reference's double sums
    if (c->grad_scale_a.data) {
        double s = 0.0;
        for (int64_t i = 0; i < r->nseg; i++) s += part_s[i];
        store_float(&c->grad_scale_a, 0, (float)(s / sqrt((double)nx * (b->binary ? 1.0 : b->hi))));
    }
    if (c->grad_bias_a.data) bias_grad(b);
    return BIE_STATUS_OK;
}

enum bie_status bie_cpu_layer_backward(bie_context_t * ctx, const struct bie_layer_call * c) {
    if (c->device_type != BIE_DEVICE_CPU || !c->scales_on_host) return BIE_DECLINED;
    if (c->is_conv && c->x.dtype == BIE_DTYPE_B1) return BIE_DECLINED; // saved bits of a conv: the reference
    if (c->x_clamp > 0.0f) return bie_cpu_clamped(ctx, c, true);
    const struct bie_geometry * g = &c->g;
    struct bwd b = {.c = c,
                    .g = g,
                    .kern = bie_cpu_kernels(ctx->isa),
                    .threads = cpu_threads(ctx),
                    .binary = c->quant == BIE_QUANT_BINARY,
                    .lo = bie_quant_lo(c->quant),
                    .hi = bie_quant_hi(c->quant)};
    struct bwd_route r;
    bwd_route_make(&b, &r);
    if (c->plan) return bwd_route_describe(ctx, c, &r);
    if (!r.want_gx && !r.want_gw) return BIE_STATUS_OK;
    void * ws;
    const enum bie_status st = bie_host_workspace(ctx, r.total, &ws);
    if (st != BIE_STATUS_OK) return st;
    struct cpu_arena ar = {.base = ws, .used = 0, .cap = r.total};
    void * reg[R_REGIONS];
    for (int i = 0; i < R_REGIONS; i++) reg[i] = cpu_arena_take(&ar, r.size[i]);
    b.bias = reg[R_BIAS];
    b.acode = reg[R_ACODE];
    b.wf = reg[R_WF];
    b.gx = reg[R_GX];
    b.a_idx = reg[R_AIDX];
    b.w_idx = reg[R_WIDX];
    b.xrow = reg[R_XROW];
    float * work = reg[R_WORK];
    float * gw = r.gw_direct ? (float *)c->grad_weight.data : reg[R_GW];
    const int ldgw = r.gw_direct && g->O > 1 ? (int)c->grad_weight.stride[0] : (int)g->K;

    cpu_bias_dense(&c->bias_a, g->C, b.bias);
    if (r.want_gw && !r.sign_gemm) make_codes(&b);
    if (r.want_gx && !r.sign_gemm) make_wf(&b);
    if (r.sign_gemm) {
        linear_sign_gemms(&b, r.g_rows, work, gw, ldgw, reg[R_TAB]);
    } else if (!r.linear) {
        conv_tasks(&b, r.nb, r.wave, work, reg[R_PARTS], gw, ldgw);
    } else if (r.g_rows) { // grad_y is a dense-row f32 [M][O]
        linear_sgemms(&b, c->grad_y.data, (int)(g->batch == 1 ? g->O : c->grad_y.stride[0]), false, gw, ldgw);
    } else { // G = grad_y^T as a dense [O][M]
        gather_g(&b, 0, g->batch, work, b.threads);
        linear_sgemms(&b, work, (int)g->batch, true, gw, ldgw);
    }
    const enum bie_status s = bwd_finish(&b, &r, gw, ldgw, reg[R_PART]);
    if (s == BIE_STATUS_OK && c->grad_x_add.data) bie_ref_grad_x_add(c); // (memory-bound: one pass)
    return s;
}
