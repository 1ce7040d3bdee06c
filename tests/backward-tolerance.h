// SPDX-License-Identifier: Apache-2.0
// backward-tolerance.h: the tolerance of a fast backward's float gradients against the reference's
// (tests/test-cpu-backward.c and the layer fuzzer, fuzz/lib/layer-case.c).
//
// Every float output is a sum of n terms. A backend may add them in f32 in its own order (error <=
// n*eps*sum|terms|, eps = 2^-24 per rounding, Higham's gamma_n); the weight w*scale_w is rounded
// once (eps*|term| each) and the output once; the reference sums in double. With gmax = max|grad_y|
// and the codes bounded by lo (1 binary, 8 for 4-bit, 128 for 8-bit):
//   grad_x[.]   n = O*kh*kw terms g*w*scale_w:     tol_x = (n+2)*eps * n*gmax*lo*scale_w
//   grad_W[.]   n = N*OH*OW terms g*a_pad*scale_a: tol_w = (n+2)*eps * n*gmax*lo*scale_a
//   grad_bias_a[c] sums N*H*W grad_x values:       tol_b = N*H*W*tol_x
//   grad_scale_a sums numel(x) grad_x*d (|d| <= lo) / sqrt(numel(x)*(1 or hi)):
//                                                  tol_s = numel(x)*tol_x*lo / denominator
// each plus the output's own rounding (relative: 2^-24 f32, 2^-11 f16, 2^-8 bf16).
#pragma once

#include "bie-impl.h"

#include <math.h>

struct backward_tolerance {
    double x, w, b, s;
};

// n_x: terms of a grad_x element (O*kh*kw); n_w: of a grad_W element (N*OH*OW); n_b: grad_x values
// per channel (N*H*W); nx: elements of x.
static inline struct backward_tolerance backward_tolerance(enum bie_quant q, double gmax, double scale_a,
                                                           double scale_w, double n_x, double n_w, double n_b,
                                                           double nx) {
    const double eps = 0x1p-24;
    const double lo = q == BIE_QUANT_BINARY ? 1 : q == BIE_QUANT_INT4 ? 8 : 128;
    const double hi = q == BIE_QUANT_BINARY ? 1 : q == BIE_QUANT_INT4 ? 7 : 127;
    struct backward_tolerance t;
    t.x = (n_x + 2) * eps * n_x * gmax * lo * scale_w;
    t.w = (n_w + 2) * eps * n_w * gmax * lo * scale_a;
    t.b = n_b * t.x;
    t.s = nx * t.x * lo / sqrt(nx * hi);
    return t;
}

// A backend that rounds the sums grad_x and R (before their scales) to a dtype of relative
// rounding u on the way (the CUDA conv backward's cuDNN route rounds them to grad_y's dtype;
// docs/semantics.md) adds u * max|sum| to each: u * n*gmax*lo*scale to grad_x and grad_W, and
// through grad_x, n_b and numel(x)*lo/denominator times that to grad_bias_a and grad_scale_a.
static inline struct backward_tolerance backward_tolerance_rounded(enum bie_quant q, struct backward_tolerance t,
                                                                   double u, double gmax, double scale_a,
                                                                   double scale_w, double n_x, double n_w, double n_b,
                                                                   double nx) {
    const double lo = q == BIE_QUANT_BINARY ? 1 : q == BIE_QUANT_INT4 ? 8 : 128;
    const double hi = q == BIE_QUANT_BINARY ? 1 : q == BIE_QUANT_INT4 ? 7 : 127;
    const double ex = u * n_x * gmax * lo * scale_w;
    t.x += ex;
    t.w += u * n_w * gmax * lo * scale_a;
    t.b += n_b * ex;
    t.s += nx * ex * lo / sqrt(nx * hi);
    return t;
}

// The relative rounding of an output dtype.
static inline double backward_rounding(enum bie_dtype d) {
    return d == BIE_DTYPE_BF16 ? 0x1p-8 : d == BIE_DTYPE_F16 ? 0x1p-11 : 0x1p-24;
}

// max |element| of a view.
static inline double tensor_max_abs(const struct bie_tensor * t) {
    double m = 0;
    int64_t idx[BIE_MAX_DIMS] = {0};
    do {
        const double v = fabs(bie_load(t, bie_offset(t, idx)));
        if (v > m) m = v;
    } while (bie_next_index(t, idx));
    return m;
}
