// SPDX-License-Identifier: Apache-2.0
// ref-matmul.c: the reference batched matmul of two activations (Bitorch Engine's BinaryMatMul,
// Q4MatMul, Q8MatMul), the specification of bie_matmul_*. Calls arrive validated (src/ops/matmul.c):
// x [B, M, K], y [B, N, K], out and grad_out [B, M, N].
//
// Codes (f32 math; an operand v with its clip c):
//   binary: code(v) = +1 if v >= 0 else -1 (NaN -> -1)
//   n-bit:  code(v) = clamp(rne(v / c), lo, hi)       lo, hi = -8, 7 or -128, 127 (NaN -> lo)
//   a = code(x) under x_clip, b = code(y) under y_clip
// Forward:
//   acc[b, m, n] = sum_k a[b, m, k] * b[b, n, k]      (exact; wraps modulo 2^32 past int32)
//   out = (float)acc * (x_clip * y_clip) (the product once in f32), rounded to out's dtype; I32: acc
// Backward (g = grad_out; sums in double, each output rounded once):
//   gx[b, m, k] = y_clip * sum_n g[b, m, n] * b[b, n, k]
//   gy[b, n, k] = x_clip * sum_m g[b, m, n] * a[b, m, k]
//   for each operand (v, gv, c, code) in (x, gx, x_clip, a) and (y, gy, y_clip, b), r = v / c (f32):
//     binary: grad_v = gv * 1{|r| <= 1}
//             grad_c = sum(grad_v * code) / sqrt(numel(v))
//     n-bit:  mid = 1{lo <= r <= hi}, grad_v = gv * mid
//             grad_c = sum(gv * (lo*1{r<lo} + hi*1{r>hi} + mid*(rne(r) - r))) / sqrt(numel(v) * hi)
//   (numel over all batches). Each operand's terms are those of the linear layer whose input is
//   that operand and whose weight is the other (ref-layer.c), with the batch's rows summed in.
#include "ref/ref-impl.h"

#include <math.h>

static inline int64_t off3(const struct bie_tensor * t, int64_t b, int64_t i, int64_t j) {
    return b * t->stride[0] + i * t->stride[1] + j * t->stride[2];
}

static int8_t code(enum bie_quant q, float v, float clip) {
    if (q == BIE_QUANT_BINARY) return v >= 0.0f ? 1 : -1;
    return (int8_t)bie_ref_quantize(v, clip, bie_quant_lo(q), bie_quant_hi(q));
}

// Dense codes [B][R][K] of an operand view under its clip.
static void codes(enum bie_quant q, const struct bie_tensor * t, float clip, int8_t * out) {
    int64_t d = 0;
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t r = 0; r < t->shape[1]; r++)
            for (int64_t k = 0; k < t->shape[2]; k++) out[d++] = code(q, (float)bie_load(t, off3(t, b, r, k)), clip);
}

static enum bie_status take(bie_context_t * ctx, size_t bytes, void ** p) {
    return bie_host_workspace(ctx, bytes ? bytes : 1, p);
}

enum bie_status bie_ref_matmul_forward(bie_context_t * ctx, const struct bie_matmul_call * c) {
    if (c->device_type != BIE_DEVICE_CPU || !c->clips_on_host) return BIE_DECLINED;
    const int64_t B = c->B, M = c->M, N = c->N, K = c->K;
    int8_t * a;
    BIE_TRY(take(ctx, (size_t)(B * (M + N) * K), (void **)&a));
    int8_t * bq = a + B * M * K;
    codes(c->quant, &c->x, c->x_clip, a);
    codes(c->quant, &c->y, c->y_clip, bq);
    const float scale = c->x_clip * c->y_clip;
    for (int64_t b = 0; b < B; b++)
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                const int8_t *ar = a + (b * M + m) * K, *br = bq + (b * N + n) * K;
                int64_t acc64 = 0;
                for (int64_t k = 0; k < K; k++) acc64 += (int64_t)ar[k] * br[k];
                const int32_t acc = (int32_t)(uint32_t)(uint64_t)acc64;
                const double v = c->out.dtype == BIE_DTYPE_I32 ? (double)acc : (double)((float)acc * scale);
                bie_store(&c->out, off3(&c->out, b, m, n), v);
            }
    return BIE_STATUS_OK;
}

// The backward of one operand v [B, R, K] (side 0: x, side 1: y) from the other operand's codes
// oc [B][S][K] and its clip; writes grad_v (if asked) and returns grad_c's sum in *clip_sum.
static void operand_backward(const struct bie_matmul_call * c, int side, const int8_t * vc, const int8_t * oc,
                             double * gv, double * clip_sum) {
    const struct bie_tensor *v = side ? &c->y : &c->x, *gout = side ? &c->grad_y : &c->grad_x;
    const int64_t B = c->B, R = side ? c->N : c->M, S = side ? c->M : c->N, K = c->K;
    const float clip = side ? c->y_clip : c->x_clip, other = side ? c->x_clip : c->y_clip;
    for (int64_t i = 0; i < B * R * K; i++) gv[i] = 0.0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t r = 0; r < R; r++)
            for (int64_t s = 0; s < S; s++) {
                const double g =
                    bie_load(&c->grad_out, side ? off3(&c->grad_out, b, s, r) : off3(&c->grad_out, b, r, s));
                const int8_t * orow = oc + (b * S + s) * K;
                double * grow = gv + (b * R + r) * K;
                for (int64_t k = 0; k < K; k++) grow[k] += g * orow[k];
            }
    const bool binary = c->quant == BIE_QUANT_BINARY;
    const double lo = bie_quant_lo(c->quant), hi = bie_quant_hi(c->quant);
    double sum = 0.0;
    int64_t i = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t r = 0; r < R; r++)
            for (int64_t k = 0; k < K; k++, i++) {
                const double g = gv[i] * (double)other;
                const float rr = (float)bie_load(v, off3(v, b, r, k)) / clip; // f32 division
                if (binary) {
                    gv[i] = fabsf(rr) <= 1.0f ? g : 0.0;
                    sum += gv[i] * vc[i];
                } else {
                    const bool mid = rr >= (float)lo && rr <= (float)hi;
                    gv[i] = mid ? g : 0.0;
                    sum += g * (rr < (float)lo   ? lo
                                : rr > (float)hi ? hi
                                : mid            ? (double)bie_rne(rr) - (double)rr
                                                 : 0.0);
                }
                if (gout->data) bie_ref_store_rounded(gout, off3(gout, b, r, k), gv[i]);
            }
    *clip_sum = sum / sqrt((double)(B * R * K) * (binary ? 1.0 : hi));
}

enum bie_status bie_ref_matmul_backward(bie_context_t * ctx, const struct bie_matmul_call * c) {
    if (c->device_type != BIE_DEVICE_CPU || !c->clips_on_host) return BIE_DECLINED;
    const int64_t B = c->B, M = c->M, N = c->N, K = c->K;
    const int64_t nx = B * M * K, ny = B * N * K;
    struct bie_ref_arena ar = {0, false};
    const size_t o_a = bie_ref_arena_take(&ar, (size_t)(nx + ny), 1);
    const size_t o_g = bie_ref_arena_take(&ar, (size_t)(nx > ny ? nx : ny), sizeof(double));
    if (ar.overflow) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "workspace: the reference's size overflows");
    char * base;
    BIE_TRY(take(ctx, ar.size, (void **)&base));
    int8_t *a = (int8_t *)(base + o_a), *bq = a + nx;
    double * gv = (double *)(base + o_g);
    codes(c->quant, &c->x, c->x_clip, a);
    codes(c->quant, &c->y, c->y_clip, bq);
    double sum;
    if (c->grad_x.data || c->grad_x_clip.data) {
        operand_backward(c, 0, a, bq, gv, &sum);
        if (c->grad_x_clip.data) bie_ref_store_rounded(&c->grad_x_clip, 0, sum);
    }
    if (c->grad_y.data || c->grad_y_clip.data) {
        operand_backward(c, 1, bq, a, gv, &sum);
        if (c->grad_y_clip.data) bie_ref_store_rounded(&c->grad_y_clip, 0, sum);
    }
    return BIE_STATUS_OK;
}
