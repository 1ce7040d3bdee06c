// SPDX-License-Identifier: Apache-2.0
// test-oracle.h: random layer cases and an independent double-precision oracle of the layer
// contract, shared by test-oracle.c (forward) and test-grad.c (backward).
//
// The oracle is written from the equations of docs/semantics.md, not from src/ref: it works on
// dense double arrays of the +-1 / integer codes, convolves them as floats (no bit packing), and
// computes grad_x by gathering (for each input element, the outputs that read it) where the
// reference scatters.
#pragma once

#include "test-util.h"

static inline bool test_quick(void) {
    const char * q = getenv("BIE_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

// --- tensor layouts ------------------------------------------------------------------------------

enum layout { LAYOUT_DENSE, LAYOUT_PERMUTED, LAYOUT_GAPPED, LAYOUT_COUNT };
static const char * const layout_names[] = {"dense", "permuted", "gapped"};

// A CPU tensor of any rank with the given memory layout: dense row-major; its dims stored in the
// order `perm` (perm[j] = logical dim stored j-th; NULL = random; {0,2,3,1} on a 4-D tensor is
// channels-last); or row-major with gaps between rows and a doubled innermost stride now and then.
static inline struct bie_tensor make_view(enum bie_dtype dtype, int32_t ndim, const int64_t * shape, enum layout kind,
                                          const int32_t * perm) {
    if (kind == LAYOUT_PERMUTED && ndim > 1) {
        int32_t p[BIE_MAX_DIMS], inv[BIE_MAX_DIMS];
        for (int32_t i = 0; i < ndim; i++) p[i] = perm ? perm[i] : i;
        if (!perm)
            for (int32_t i = ndim - 1; i > 0; i--) {
                const int32_t j = (int32_t)test_rand_int(0, i), tmp = p[i];
                p[i] = p[j];
                p[j] = tmp;
            }
        int64_t ps[BIE_MAX_DIMS];
        for (int32_t i = 0; i < ndim; i++) {
            ps[i] = shape[p[i]];
            inv[p[i]] = i;
        }
        struct bie_tensor t = test_tensor(dtype, ndim, ps, NULL);
        bie_tensor_permute(&t, inv);
        return t;
    }
    if (kind == LAYOUT_GAPPED && ndim > 0) {
        int64_t st[BIE_MAX_DIMS];
        st[ndim - 1] = test_rand_int(1, 2);
        for (int32_t i = ndim - 2; i >= 0; i--) st[i] = st[i + 1] * shape[i + 1] + test_rand_int(0, 3);
        return test_tensor(dtype, ndim, shape, st);
    }
    return test_tensor(dtype, ndim, shape, NULL);
}

// A linear-layer tensor [lead..., F] whose leading dims flatten into rows: dense; rows spaced with
// gaps (innermost stride 1 or 2); or transposed (element (m, f) at m + f*M).
static inline struct bie_tensor make_linear(enum bie_dtype dtype, int nlead, const int64_t * lead, int64_t F,
                                            int kind) {
    int64_t shape[BIE_MAX_DIMS], st[BIE_MAX_DIMS], M = 1;
    for (int i = 0; i < nlead; i++) {
        shape[i] = lead[i];
        M *= lead[i];
    }
    shape[nlead] = F;
    if (kind == 0) return test_tensor(dtype, nlead + 1, shape, NULL);
    int64_t row;
    if (kind == 1) {
        st[nlead] = test_rand_int(1, 2);
        row = F * st[nlead] + test_rand_int(0, 3);
    } else {
        st[nlead] = M;
        row = 1;
    }
    for (int i = nlead - 1; i >= 0; i--) {
        st[i] = row;
        row *= lead[i];
    }
    return test_tensor(dtype, nlead + 1, shape, st);
}

// Every element of t, as double, in logical row-major order (malloc'ed).
static inline double * dense_load(const struct bie_tensor * t) {
    const int64_t n = bie_tensor_numel(t);
    double * d = malloc(sizeof(double) * (size_t)n);
    if (!d) exit(2);
    int64_t idx[BIE_MAX_DIMS] = {0}, i = 0;
    do d[i++] = bie_load(t, bie_offset(t, idx));
    while (bie_next_index(t, idx));
    return d;
}

// Writes dense values (logical row-major order) into t.
static inline void dense_store(const struct bie_tensor * t, const double * d) {
    int64_t idx[BIE_MAX_DIMS] = {0}, i = 0;
    do bie_store(t, bie_offset(t, idx), d[i++]);
    while (bie_next_index(t, idx));
}

static inline void fill_with(const struct bie_tensor * t, double (*gen)(void * arg), void * arg) {
    int64_t idx[BIE_MAX_DIMS] = {0};
    do bie_store(t, bie_offset(t, idx), gen(arg));
    while (bie_next_index(t, idx));
}

// --- a random layer case -----------------------------------------------------------------------

struct layer_case {
    enum bie_quant quant;
    bool conv;
    struct bie_linear_desc lin;
    struct bie_conv2d_desc cd;
    // Geometry; a linear layer is N = M rows, C = K, O = out features, all spatial sizes 1.
    int64_t N, C, H, W, O, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw;
    int pad; // -1, 0 or +1: the value of a padded tap (binary), 0 (n-bit)
    int nlead;
    int64_t lead[2]; // linear: leading dims of x (nlead of them)
    int lin_kind;    // linear: layout kind of x
    struct bie_tensor x, bias, w, sa, sw_t;
    bool has_bias;
    float sa_v, sw_v;
    double *xd, *bd, *wd; // dense copies of x, bias_a (zeros when absent), weight
    char desc[400];
};

static inline int lc_lo(const struct layer_case * c) {
    return c->quant == BIE_QUANT_BINARY ? -1 : c->quant == BIE_QUANT_INT4 ? -8 : -128;
}
static inline int lc_hi(const struct layer_case * c) {
    return c->quant == BIE_QUANT_BINARY ? 1 : c->quant == BIE_QUANT_INT4 ? 7 : 127;
}
static inline int64_t lc_K(const struct layer_case * c) { return c->C * c->kh * c->kw; }
static inline int64_t lc_xnumel(const struct layer_case * c) { return c->N * c->C * c->H * c->W; }
static inline int64_t lc_ynumel(const struct layer_case * c) { return c->N * c->O * c->OH * c->OW; }

struct gen_arg {
    const struct layer_case * c;
    bool ties; // values on the half-integer grid of the scale (exercises round-half-to-even)
    int kind;  // 0 x, 1 float weight, 2 int8 weight, 3 packed weight, 4 bias
};

static inline double gen_value(void * p) {
    const struct gen_arg * g = p;
    const struct layer_case * c = g->c;
    const bool bin = c->quant == BIE_QUANT_BINARY;
    const double hi = lc_hi(c);
    switch (g->kind) {
    case 0: {
        if (test_rand_int(0, 15) == 0) return test_rand_int(0, 1) ? 0.0 : -0.0; // sign(0) = +1
        if (g->ties) return (double)test_rand_int(-(int64_t)(2 * hi + 6), (int64_t)(2 * hi + 6)) * 0.5 * c->sa_v;
        return test_rand_float(-1.0f, 1.0f) * (bin ? 1.6 : hi + 4) * c->sa_v;
    }
    case 1: {
        if (test_rand_int(0, 15) == 0) return 0.0;
        if (g->ties) return (double)test_rand_int(-(int64_t)(2 * hi + 6), (int64_t)(2 * hi + 6)) * 0.5 * c->sw_v;
        return test_rand_float(-1.0f, 1.0f) * (bin ? 1.0 : hi + 4) * c->sw_v;
    }
    case 2: return bin ? (double)test_rand_int(-127, 127) : (double)test_rand_int(-128, 127);
    case 3: return bin ? (test_rand_int(0, 1) ? 1.0 : -1.0) : (double)test_rand_int(-8, 7);
    default: return test_rand_float(-0.5f, 0.5f) * c->sa_v;
    }
}

static inline float rand_scale(bool pow2) {
    if (pow2) return ldexpf(1.0f, (int)test_rand_int(-4, 1));
    return test_rand_float(0.05f, 2.0f);
}

static const enum bie_dtype float_dtypes[3] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16};

// A scalar scale tensor of a random float dtype; returns the value the library will read.
static inline struct bie_tensor make_scale(float v, float * out_v) {
    const enum bie_dtype d = float_dtypes[test_rand_int(0, 2)];
    struct bie_tensor t = test_tensor(d, 0, NULL, NULL);
    bie_store(&t, 0, v);
    *out_v = (float)bie_load(&t, 0);
    return t;
}

// Options of a random case. dtypes < 0 are drawn at random.
struct case_opts {
    bool conv;
    int quant;    // 0: random
    int x_dtype;  // -1 random (B1 allowed for binary unless float_x)
    int w_dtype;  // -1 random
    bool float_x; // x must be float (backward)
    bool float_w; // weight must be float (finite differences of grad_W)
    int64_t max_k_linear;
};

static inline enum bie_dtype pick_w_dtype(enum bie_quant q) {
    const int r = (int)test_rand_int(0, 5);
    if (r < 3) return float_dtypes[r];
    if (r == 3 || (r == 5 && q == BIE_QUANT_INT8)) return BIE_DTYPE_I8;
    return q == BIE_QUANT_BINARY ? BIE_DTYPE_B1 : q == BIE_QUANT_INT4 ? BIE_DTYPE_S4 : BIE_DTYPE_I8;
}

// A linear case's shapes and views (x of xd, the weight of wd, in random layouts named in
// *xlayout and *wlayout).
static inline void case_linear(struct layer_case * c, const struct case_opts * o, enum bie_dtype xd, enum bie_dtype wd,
                               const char ** xlayout, const char ** wlayout) {
    static const int64_t ks[9] = {1, 7, 8, 9, 31, 33, 127, 129, 1000};
    int64_t K;
    do K = test_pick(ks, 9);
    while (o->max_k_linear && K > o->max_k_linear);
    c->C = K;
    c->O = 2 * test_rand_int(0, 9) + 1;
    c->nlead = (int)test_rand_int(0, 2);
    c->N = 1;
    for (int i = 0; i < c->nlead; i++) {
        c->lead[i] = 2 * test_rand_int(0, 3) + 1;
        c->N *= c->lead[i];
    }
    c->H = c->W = c->OH = c->OW = c->kh = c->kw = c->sh = c->sw = c->dh = c->dw = 1;
    c->lin = (struct bie_linear_desc){c->quant, K, c->O};
    c->lin_kind = (int)test_rand_int(0, 2);
    c->x = make_linear(xd, c->nlead, c->lead, K, c->lin_kind);
    *xlayout = c->lin_kind == 0 ? "dense" : c->lin_kind == 1 ? "row-gapped" : "transposed";
    const int64_t wshape[2] = {c->O, K};
    const enum layout wl = (enum layout)test_rand_int(0, LAYOUT_COUNT - 1);
    c->w = make_view(wd, 2, wshape, wl, NULL);
    *wlayout = layout_names[wl];
}

static inline void case_random(struct layer_case * c, const struct case_opts * o) {
    memset(c, 0, sizeof *c);
    static const enum bie_quant quants[3] = {BIE_QUANT_BINARY, BIE_QUANT_INT4, BIE_QUANT_INT8};
    c->quant = o->quant ? (enum bie_quant)o->quant : quants[test_rand_int(0, 2)];
    c->conv = o->conv;
    const bool bin = c->quant == BIE_QUANT_BINARY;
    const bool ties = test_rand_int(0, 3) == 0;
    float sa = rand_scale(ties), sw = rand_scale(ties);
    c->sa = make_scale(sa, &c->sa_v);
    c->sw_t = make_scale(sw, &c->sw_v);
    enum bie_dtype xd = o->x_dtype >= 0 ? (enum bie_dtype)o->x_dtype : float_dtypes[test_rand_int(0, 2)];
    if (o->x_dtype < 0 && bin && !o->float_x && test_rand_int(0, 4) == 0) xd = BIE_DTYPE_B1;
    enum bie_dtype wd = o->w_dtype >= 0 ? (enum bie_dtype)o->w_dtype
                        : o->float_w    ? float_dtypes[test_rand_int(0, 2)]
                                        : pick_w_dtype(c->quant);
    c->has_bias = xd != BIE_DTYPE_B1 && test_rand_int(0, 1);
    const char * xlayout;
    const char * wlayout;
    if (!c->conv) {
        case_linear(c, o, xd, wd, &xlayout, &wlayout);
    } else {
        static const int64_t kernels[6][2] = {{1, 1}, {3, 3}, {5, 5}, {7, 7}, {3, 1}, {1, 5}};
        const int kk = (int)test_rand_int(0, 5);
        c->kh = kernels[kk][0];
        c->kw = kernels[kk][1];
        c->N = test_rand_int(1, 3);
        const bool wide = test_rand_int(0, 9) == 0; // patches of several 64-bit words per tap row
        c->C = wide ? test_rand_int(60, 130) : test_rand_int(1, 13);
        c->O = wide ? test_rand_int(12, 40) : test_rand_int(1, 11);
        c->sh = test_rand_int(1, 3);
        c->sw = test_rand_int(1, 3);
        c->ph = test_rand_int(0, 3);
        c->pw = test_rand_int(0, 3);
        c->dh = test_rand_int(1, 2);
        c->dw = test_rand_int(1, 2);
        const int64_t eh = c->dh * (c->kh - 1) + 1, ew = c->dw * (c->kw - 1) + 1;
        c->H = test_rand_int(eh - 2 * c->ph > 1 ? eh - 2 * c->ph : 1, eh + 6);
        c->W = test_rand_int(ew - 2 * c->pw > 1 ? ew - 2 * c->pw : 1, ew + 6);
        c->OH = (c->H + 2 * c->ph - eh) / c->sh + 1;
        c->OW = (c->W + 2 * c->pw - ew) / c->sw + 1;
        const int pv = bin ? (int)test_rand_int(0, 2) : 0;
        c->pad = pv == 1 ? -1 : pv == 2 ? 1 : 0;
        c->cd = (struct bie_conv2d_desc){.quant = c->quant,
                                         .in_channels = c->C,
                                         .out_channels = c->O,
                                         .kernel = {(int32_t)c->kh, (int32_t)c->kw},
                                         .stride = {(int32_t)c->sh, (int32_t)c->sw},
                                         .padding = {(int32_t)c->ph, (int32_t)c->pw},
                                         .dilation = {(int32_t)c->dh, (int32_t)c->dw},
                                         .groups = 1,
                                         .pad_value = (enum bie_pad_value)pv};
        const int64_t xshape[4] = {c->N, c->C, c->H, c->W};
        static const int32_t nhwc[4] = {0, 2, 3, 1};
        const int xl = (int)test_rand_int(0, 4); // dense, channels-last, permuted, gapped, broadcast batch
        if (xl == 1) c->x = make_view(xd, 4, xshape, LAYOUT_PERMUTED, nhwc);
        else if (xl == 4) {
            int64_t st[4] = {0, c->H * c->W, c->W, 1};
            c->x = test_tensor(xd, 4, xshape, st);
        } else
            c->x = make_view(xd, 4, xshape, xl == 0 ? LAYOUT_DENSE : xl == 2 ? LAYOUT_PERMUTED : LAYOUT_GAPPED, NULL);
        static const char * const xl_names[5] = {"dense", "channels-last", "permuted", "gapped", "broadcast-batch"};
        xlayout = xl_names[xl];
        const int64_t wshape[4] = {c->O, c->C, c->kh, c->kw};
        const int wl = (int)test_rand_int(0, 3); // dense OIHW, OHWI (channels fastest), permuted, gapped
        if (wl == 1) c->w = make_view(wd, 4, wshape, LAYOUT_PERMUTED, nhwc);
        else c->w = make_view(wd, 4, wshape, wl == 0 ? LAYOUT_DENSE : wl == 2 ? LAYOUT_PERMUTED : LAYOUT_GAPPED, NULL);
        static const char * const wl_names[4] = {"OIHW", "OHWI", "permuted", "gapped"};
        wlayout = wl_names[wl];
    }
    struct gen_arg ga = {c, ties, 0};
    fill_with(&c->x, gen_value, &ga);
    ga.kind = bie_dtype_is_float(wd) ? 1 : wd == BIE_DTYPE_I8 ? 2 : 3;
    fill_with(&c->w, gen_value, &ga);
    c->bd = calloc((size_t)c->C, sizeof(double));
    if (!c->bd) exit(2);
    if (c->has_bias) {
        const enum layout bl = test_rand_int(0, 1) ? LAYOUT_DENSE : LAYOUT_GAPPED;
        c->bias = make_view(float_dtypes[test_rand_int(0, 2)], 1, &c->C, bl, NULL);
        ga.kind = 4;
        fill_with(&c->bias, gen_value, &ga);
        free(c->bd);
        c->bd = dense_load(&c->bias);
    }
    c->xd = dense_load(&c->x);
    c->wd = dense_load(&c->w);
    if (c->conv)
        snprintf(
            c->desc, sizeof c->desc,
            "%d-bit conv N=%lld C=%lld H=%lld W=%lld O=%lld k=%lldx%lld s=%lld,%lld p=%lld,%lld d=%lld,%lld pad=%d "
            "x=%s(%s) w=%s(%s) bias=%s sa=%g sw=%g%s",
            (int)c->quant, (long long)c->N, (long long)c->C, (long long)c->H, (long long)c->W, (long long)c->O,
            (long long)c->kh, (long long)c->kw, (long long)c->sh, (long long)c->sw, (long long)c->ph, (long long)c->pw,
            (long long)c->dh, (long long)c->dw, c->pad, bie_dtype_name(xd), xlayout, bie_dtype_name(wd), wlayout,
            c->has_bias ? "yes" : "no", (double)c->sa_v, (double)c->sw_v, ties ? " ties" : "");
    else
        snprintf(c->desc, sizeof c->desc,
                 "%d-bit linear x rank %d (M=%lld) K=%lld N=%lld x=%s(%s) w=%s(%s) bias=%s sa=%g sw=%g%s",
                 (int)c->quant, c->nlead + 1, (long long)c->N, (long long)c->C, (long long)c->O, bie_dtype_name(xd),
                 xlayout, bie_dtype_name(wd), wlayout, c->has_bias ? "yes" : "no", (double)c->sa_v, (double)c->sw_v,
                 ties ? " ties" : "");
}

static inline void case_free(struct layer_case * c) {
    test_tensor_free(&c->x);
    test_tensor_free(&c->w);
    test_tensor_free(&c->sa);
    test_tensor_free(&c->sw_t);
    if (c->has_bias) test_tensor_free(&c->bias);
    free(c->xd);
    free(c->bd);
    free(c->wd);
}

// A y-shaped tensor (y or grad_y) of dtype d in a random layout.
static inline struct bie_tensor case_make_out(const struct layer_case * c, enum bie_dtype d) {
    if (!c->conv) return make_linear(d, c->nlead, c->lead, c->O, (int)test_rand_int(0, 2));
    const int64_t shape[4] = {c->N, c->O, c->OH, c->OW};
    return make_view(d, 4, shape, (enum layout)test_rand_int(0, LAYOUT_COUNT - 1), NULL);
}

// An x-shaped (grad_x) or weight-shaped (grad_weight) tensor in a random layout.
static inline struct bie_tensor case_make_like_x(const struct layer_case * c, enum bie_dtype d) {
    if (!c->conv) return make_linear(d, c->nlead, c->lead, c->C, (int)test_rand_int(0, 2));
    const int64_t shape[4] = {c->N, c->C, c->H, c->W};
    return make_view(d, 4, shape, (enum layout)test_rand_int(0, LAYOUT_COUNT - 1), NULL);
}
static inline struct bie_tensor case_make_like_w(const struct layer_case * c, enum bie_dtype d) {
    const int64_t shape[4] = {c->O, c->C, c->kh, c->kw};
    return make_view(d, c->conv ? 4 : 2, shape, (enum layout)test_rand_int(0, LAYOUT_COUNT - 1), NULL);
}

// --- the oracle ----------------------------------------------------------------------------------

// x' in f32 (NaN for a B1 x, which has no x').
static inline float oracle_xprime(const struct layer_case * c, int64_t i) {
    if (c->x.dtype == BIE_DTYPE_B1) return NAN;
    const int64_t ch = (i / (c->H * c->W)) % c->C;
    const float x = (float)c->xd[i], b = (float)c->bd[ch];
    return x + b;
}

// Integer code of a value q = clamp(round-half-even(v), lo, hi), NaN -> lo.
static inline double oracle_clamp_round(double v, int lo, int hi) {
    if (isnan(v)) return lo;
    const double r = nearbyint(v); // default rounding mode: half to even
    return r < lo ? lo : r > hi ? hi : r;
}

// Activation codes, dense [N][C][H][W].
static inline double * oracle_a(const struct layer_case * c) {
    const int64_t n = lc_xnumel(c);
    double * a = malloc(sizeof(double) * (size_t)n);
    if (!a) exit(2);
    for (int64_t i = 0; i < n; i++) {
        if (c->x.dtype == BIE_DTYPE_B1) a[i] = c->xd[i];
        else if (c->quant == BIE_QUANT_BINARY) a[i] = oracle_xprime(c, i) >= 0.0f ? 1.0 : -1.0;
        else a[i] = oracle_clamp_round((double)(oracle_xprime(c, i) / c->sa_v), lc_lo(c), lc_hi(c));
    }
    return a;
}

// Weight codes, dense [O][C][kh][kw].
static inline double * oracle_w(const struct layer_case * c) {
    const int64_t n = c->O * lc_K(c);
    double * w = malloc(sizeof(double) * (size_t)n);
    if (!w) exit(2);
    const enum bie_dtype d = c->w.dtype;
    for (int64_t i = 0; i < n; i++) {
        const double v = c->wd[i];
        if (c->quant == BIE_QUANT_BINARY) w[i] = d == BIE_DTYPE_B1 ? v : v >= 0.0 ? 1.0 : -1.0;
        else if (bie_dtype_is_float(d)) w[i] = oracle_clamp_round((double)((float)v / c->sw_v), lc_lo(c), lc_hi(c));
        else w[i] = oracle_clamp_round(v, lc_lo(c), lc_hi(c));
    }
    return w;
}

// a_pad at (n, ch, h, w): the code inside the image, the pad value outside it.
static inline double oracle_apad(const struct layer_case * c, const double * a, int64_t n, int64_t ch, int64_t h,
                                 int64_t w) {
    if (h < 0 || h >= c->H || w < 0 || w >= c->W) return c->pad;
    return a[((n * c->C + ch) * c->H + h) * c->W + w];
}

// The float cross-correlation of an activation-like array `act` (dense x-shaped, the pad value
// `pad` outside the image) with a weight-like array `wt` [O][C][kh][kw]: dense y-shaped output.
static inline void oracle_conv(const struct layer_case * c, const double * act, double pad, const double * wt,
                               double * out) {
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t o = 0; o < c->O; o++)
            for (int64_t oh = 0; oh < c->OH; oh++)
                for (int64_t ow = 0; ow < c->OW; ow++) {
                    double s = 0.0;
                    for (int64_t ch = 0; ch < c->C; ch++)
                        for (int64_t i = 0; i < c->kh; i++)
                            for (int64_t j = 0; j < c->kw; j++) {
                                const int64_t h = oh * c->sh - c->ph + i * c->dh, w = ow * c->sw - c->pw + j * c->dw;
                                const double av = (h < 0 || h >= c->H || w < 0 || w >= c->W)
                                                      ? pad
                                                      : act[((n * c->C + ch) * c->H + h) * c->W + w];
                                s += av * wt[((o * c->C + ch) * c->kh + i) * c->kw + j];
                            }
                    out[((n * c->O + o) * c->OH + oh) * c->OW + ow] = s;
                }
}

// acc, dense [N][O][OH][OW] (exact: integers far below 2^53).
static inline double * oracle_acc(const struct layer_case * c) {
    double * a = oracle_a(c);
    double * w = oracle_w(c);
    double * acc = malloc(sizeof(double) * (size_t)lc_ynumel(c));
    if (!acc) exit(2);
    oracle_conv(c, a, c->pad, w, acc);
    free(a);
    free(w);
    return acc;
}

// Rounds an f32 value to dtype d (RNE) and returns it as double.
static inline double round_to(enum bie_dtype d, float v) {
    if (d == BIE_DTYPE_F16) return bie_f16_to_f32(bie_f32_to_f16(v));
    if (d == BIE_DTYPE_BF16) return bie_bf16_to_f32(bie_f32_to_bf16(v));
    return v;
}

// The expected y element of dtype d for an accumulation acc.
static inline double oracle_y(const struct layer_case * c, enum bie_dtype d, double acc) {
    if (d == BIE_DTYPE_I32) return acc;
    if (d == BIE_DTYPE_B1) return acc >= 0 ? 1.0 : -1.0;
    const float s = c->sa_v * c->sw_v;
    return round_to(d, (float)acc * s);
}

// The gradients of the contract, in double (unrounded), from dense grad_y g.
struct oracle_grads {
    double * gx;  // grad_x (masked), x-shaped
    double * gxu; // gx before the mask
    double * gw;  // grad_W, weight-shaped
    double * gb;  // grad_bias_a [C]
    double gs;    // grad_scale_a
    // magnitudes for tolerances: sums of |terms| of each output
    double * gx_abs;
    double * gw_abs;
    double gs_abs;
};

static inline void oracle_grads_free(struct oracle_grads * r) {
    free(r->gx);
    free(r->gxu);
    free(r->gw);
    free(r->gb);
    free(r->gx_abs);
    free(r->gw_abs);
}

static inline void oracle_backward(const struct layer_case * c, const double * g, struct oracle_grads * r) {
    const int64_t nx = lc_xnumel(c), nw = c->O * lc_K(c);
    double * a = oracle_a(c);
    double * w = oracle_w(c);
    r->gx = calloc((size_t)nx, sizeof(double));
    r->gxu = calloc((size_t)nx, sizeof(double));
    r->gx_abs = calloc((size_t)nx, sizeof(double));
    r->gw = calloc((size_t)nw, sizeof(double));
    r->gw_abs = calloc((size_t)nw, sizeof(double));
    r->gb = calloc((size_t)c->C, sizeof(double));
    if (!r->gx || !r->gxu || !r->gx_abs || !r->gw || !r->gw_abs || !r->gb) exit(2);
    // gx by gathering: input (h, w) is read by tap (i, j) of output (oh, ow) when
    // oh*sh = h + ph - i*dh and ow*sw = w + pw - j*dw.
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t ch = 0; ch < c->C; ch++)
            for (int64_t h = 0; h < c->H; h++)
                for (int64_t x = 0; x < c->W; x++) {
                    double s = 0.0, sa = 0.0;
                    for (int64_t i = 0; i < c->kh; i++) {
                        const int64_t th = h + c->ph - i * c->dh;
                        if (th < 0 || th % c->sh || th / c->sh >= c->OH) continue;
                        for (int64_t j = 0; j < c->kw; j++) {
                            const int64_t tw = x + c->pw - j * c->dw;
                            if (tw < 0 || tw % c->sw || tw / c->sw >= c->OW) continue;
                            for (int64_t o = 0; o < c->O; o++) {
                                const double t = g[((n * c->O + o) * c->OH + th / c->sh) * c->OW + tw / c->sw] *
                                                 w[((o * c->C + ch) * c->kh + i) * c->kw + j];
                                s += t;
                                sa += fabs(t);
                            }
                        }
                    }
                    const int64_t id = ((n * c->C + ch) * c->H + h) * c->W + x;
                    r->gxu[id] = s * c->sw_v;
                    r->gx_abs[id] = sa * c->sw_v;
                }
    // grad_W: correlate grad_y with the padded codes.
    for (int64_t o = 0; o < c->O; o++)
        for (int64_t ch = 0; ch < c->C; ch++)
            for (int64_t i = 0; i < c->kh; i++)
                for (int64_t j = 0; j < c->kw; j++) {
                    double s = 0.0, sa = 0.0;
                    for (int64_t n = 0; n < c->N; n++)
                        for (int64_t oh = 0; oh < c->OH; oh++)
                            for (int64_t ow = 0; ow < c->OW; ow++) {
                                const double t = g[((n * c->O + o) * c->OH + oh) * c->OW + ow] *
                                                 oracle_apad(c, a, n, ch, oh * c->sh - c->ph + i * c->dh,
                                                             ow * c->sw - c->pw + j * c->dw);
                                s += t;
                                sa += fabs(t);
                            }
                    const int64_t id = ((o * c->C + ch) * c->kh + i) * c->kw + j;
                    r->gw[id] = s * c->sa_v;
                    r->gw_abs[id] = sa * c->sa_v;
                }
    // Masks, grad_scale_a, grad_bias_a.
    const double lo = lc_lo(c), hi = lc_hi(c);
    double gs = 0.0, gs_abs = 0.0;
    for (int64_t id = 0; id < nx; id++) {
        const float rf = oracle_xprime(c, id) / c->sa_v;
        const double rr = rf;
        double t;
        if (c->quant == BIE_QUANT_BINARY) {
            r->gx[id] = fabs(rr) <= 1.0 ? r->gxu[id] : 0.0;
            t = r->gx[id] * a[id];
        } else {
            const bool mid = rr >= lo && rr <= hi;
            r->gx[id] = mid ? r->gxu[id] : 0.0;
            const double f = rr < lo ? lo : rr > hi ? hi : nearbyint(rr) - rr;
            t = r->gxu[id] * f;
        }
        gs += t;
        gs_abs += fabs(t);
        r->gb[(id / (c->H * c->W)) % c->C] += r->gx[id];
    }
    const double denom = sqrt((double)nx * (c->quant == BIE_QUANT_BINARY ? 1.0 : hi));
    r->gs = gs / denom;
    r->gs_abs = gs_abs / denom;
    free(a);
    free(w);
}

// Unit roundoff (half an ulp, relative) of a float dtype.
static inline double unit_roundoff(enum bie_dtype d) {
    return d == BIE_DTYPE_F16 ? 0x1p-11 : d == BIE_DTYPE_BF16 ? 0x1p-8 : d == BIE_DTYPE_F64 ? 0x1p-53 : 0x1p-24;
}
// Smallest positive (subnormal) step of a float dtype: the absolute part of one rounding.
static inline double min_step(enum bie_dtype d) {
    return d == BIE_DTYPE_F16 ? 0x1p-24 : d == BIE_DTYPE_F64 ? 0x1p-1074 : 0x1p-149;
}
