// SPDX-License-Identifier: Apache-2.0
// pool-cases.h: random cases of the affine max-pool (bie_affine_maxpool2d_forward) shared by its
// CPU and CUDA tests: odd shapes, windows, strides and paddings; NCHW, channels-last and strided
// views of every float dtype; with and without the affine map, the clamp and the bits; inputs
// with rounding ties, signed zeros, infinities and NaN. Results must equal the reference's
// element by element (y) and bit by bit (out_bits).
#pragma once

#include "op-cases.h"

struct pcase {
    int64_t N, C, H, W, OH, OW;
    struct bie_affine_maxpool2d_desc d;
    enum bie_dtype xd, yd, gd, zd; // gd, zd: grad_y's and grad_z's (the backward, with argmax)
    int xl, yl, bl, gl, zl;        // layouts (pool_tensor); bl < 0: no out_bits; argmax's is yl
    bool mul, add, bb, am;         // am: argmax and the backward
    char what[320];
};

// A 4-D [n, c, h, w] tensor: layout 0 NCHW dense, 1 channels-last dense, 2 channels-last with 8
// unused elements after each pixel, 3 NCHW with every element 2 apart.
static inline struct bie_tensor pool_tensor(enum bie_dtype d, const int64_t * s, int layout) {
    int64_t st[4];
    if (layout == 0 || layout == 3) {
        const int64_t e = layout == 3 ? 2 : 1;
        st[3] = e, st[2] = e * s[3], st[1] = e * s[3] * s[2], st[0] = e * s[3] * s[2] * s[1];
    } else {
        const int64_t pix = s[1] + (layout == 2 ? 8 : 0);
        st[1] = 1, st[3] = pix, st[2] = pix * s[3], st[0] = pix * s[3] * s[2];
    }
    return test_tensor(d, 4, s, st);
}

// c->what from the case's fields (again after a test changes them).
static inline void pool_describe(struct pcase * c) {
    const struct bie_affine_maxpool2d_desc * d = &c->d;
    snprintf(c->what, sizeof c->what,
             "N %lld C %lld H %lld W %lld k %dx%d s %dx%d p %dx%d clamp [%g, %g] x %s/%d y %s/%d bits %d mul %d "
             "add %d bias %d argmax %d grad_y %s/%d grad_z %s/%d",
             (long long)c->N, (long long)c->C, (long long)c->H, (long long)c->W, (int)d->kernel_h, (int)d->kernel_w,
             (int)d->stride_h, (int)d->stride_w, (int)d->pad_h, (int)d->pad_w, (double)d->lo, (double)d->hi,
             bie_dtype_name(c->xd), c->xl, bie_dtype_name(c->yd), c->yl, c->bl, (int)c->mul, (int)c->add, (int)c->bb,
             (int)c->am, bie_dtype_name(c->gd), c->gl, bie_dtype_name(c->zd), c->zl);
}

static inline void pool_random_case(struct pcase * c) {
    static const int64_t cs[] = {1, 3, 8, 16, 24, 64, 9, 40};
    memset(c, 0, sizeof *c);
    c->N = test_rand_int(1, 3);
    c->C = test_pick(cs, 8);
    c->H = test_rand_int(1, 17);
    c->W = test_rand_int(1, 17);
    struct bie_affine_maxpool2d_desc * d = &c->d;
    d->kernel_h = (int32_t)test_rand_int(1, c->H < 4 ? c->H : 4);
    d->kernel_w = (int32_t)test_rand_int(1, c->W < 4 ? c->W : 4);
    d->stride_h = (int32_t)test_rand_int(1, 3);
    d->stride_w = (int32_t)test_rand_int(1, 3);
    d->pad_h = (int32_t)test_rand_int(0, d->kernel_h / 2);
    d->pad_w = (int32_t)test_rand_int(0, d->kernel_w / 2);
    const int clamp = (int)test_rand_int(0, 2);
    d->lo = clamp == 0 ? -INFINITY : clamp == 1 ? 0.0f : -1.0f;
    d->hi = clamp == 0 ? INFINITY : clamp == 1 ? INFINITY : 1.0f;
    c->OH = (c->H + 2 * d->pad_h - d->kernel_h) / d->stride_h + 1;
    c->OW = (c->W + 2 * d->pad_w - d->kernel_w) / d->stride_w + 1;
    c->xd = floats[test_rand_int(0, 2)];
    c->yd = test_rand_int(0, 2) ? c->xd : floats[test_rand_int(0, 2)];
    c->xl = (int)test_rand_int(0, 3);
    c->yl = test_rand_int(0, 2) ? c->xl : (int)test_rand_int(0, 3);
    c->bl = (int)test_rand_int(-1, 1);
    c->mul = test_rand_int(0, 3) != 0;
    c->add = test_rand_int(0, 3) != 0;
    c->bb = c->bl >= 0 && test_rand_int(0, 1);
    c->am = test_rand_int(0, 1);
    c->gd = floats[test_rand_int(0, 2)];
    c->zd = test_rand_int(0, 1) ? c->gd : floats[test_rand_int(0, 2)];
    c->gl = (int)test_rand_int(0, 3);
    c->zl = test_rand_int(0, 1) ? c->xl : (int)test_rand_int(0, 3);
    pool_describe(c);
}

// The reference's argmax against its own y (the x it names maps to y, up to a zero's sign; 255 only
// where the clamp stops) and its backward against the sums (grad_z adds up to the grad_y of the
// outputs whose argmax is not 255, within the rounding of grad_z's dtype).
static inline void pool_check_spec(const struct pcase * c, const struct bie_tensor * x, const struct bie_tensor * y,
                                   const struct bie_tensor * am, const struct bie_tensor * mul,
                                   const struct bie_tensor * add, const struct bie_tensor * gy,
                                   const struct bie_tensor * gz) {
    int64_t bad = 0;
    double sum_y = 0, abs_y = 0, sum_z = 0;
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t ch = 0; ch < c->C; ch++)
            for (int64_t i = 0; i < c->OH; i++)
                for (int64_t j = 0; j < c->OW; j++) {
                    const int64_t at[4] = {n, ch, i, j};
                    const int k = (int)bie_load(am, bie_offset(am, at));
                    const double g = bie_load(gy, bie_offset(gy, at));
                    if (k == 255) continue;
                    sum_y += g, abs_y += fabs(g);
                    const int64_t h = i * c->d.stride_h - c->d.pad_h + k / c->d.kernel_w,
                                  w = j * c->d.stride_w - c->d.pad_w + k % c->d.kernel_w;
                    const int64_t xa[4] = {n, ch, h, w};
                    if (h < 0 || h >= c->H || w < 0 || w >= c->W || k >= c->d.kernel_h * c->d.kernel_w) {
                        bad++;
                        continue;
                    }
                    float v = (float)bie_load(x, bie_offset(x, xa));
                    if (c->mul) v = v * ((const float *)mul->data)[ch];
                    if (c->add) v = v + ((const float *)add->data)[ch];
                    v = v < c->d.lo ? c->d.lo : v > c->d.hi ? c->d.hi : v;
                    struct bie_tensor one = test_tensor(c->yd, 0, NULL, NULL);
                    bie_store(&one, 0, v);
                    const double want = bie_load(&one, 0), got = bie_load(y, bie_offset(y, at));
                    test_tensor_free(&one);
                    if (!(want == got || (isnan(want) && isnan(got)))) bad++;
                }
    int64_t idx[BIE_MAX_DIMS] = {0};
    do sum_z += bie_load(gz, bie_offset(gz, idx));
    while (bie_next_index(gz, idx));
    CHECK(bad == 0, "reference: %lld argmax entries do not name the x of their y (%s)", (long long)bad, c->what);
    const double tol = (c->zd == BIE_DTYPE_BF16 ? 1e-2 : 2e-3) * abs_y + 1e-6;
    CHECK(fabs(sum_z - sum_y) <= tol, "reference: grad_z sums to %g, grad_y of the argmax to %g (%s)", sum_z, sum_y,
          c->what);
}

// Uniform values in [-2, 2) with one in sixteen replaced by 0, -0, 0.5 (a tie under the maps
// below), +-inf or (one in 256) NaN.
static inline void pool_fill(const struct bie_tensor * t) {
    int64_t idx[BIE_MAX_DIMS] = {0};
    do {
        double v = test_rand_float(-2.0f, 2.0f);
        const int64_t r = test_rand_int(0, 255);
        if (r == 0) v = NAN;
        else if (r < 16) v = (double[]){0.0, -0.0, 0.5, INFINITY, -INFINITY}[r % 5];
        bie_store(t, bie_offset(t, idx), v);
    } while (bie_next_index(t, idx));
}

// A [C] f32 vector of values in [lo, hi) (or NULL data when absent).
static inline struct bie_tensor pool_vector(int64_t C, bool present, float lo, float hi) {
    struct bie_tensor t = test_tensor(BIE_DTYPE_F32, 1, &C, NULL);
    if (present) test_fill_uniform(&t, lo, hi);
    else test_tensor_free(&t);
    return t;
}

// Elements of a and b (same shape) that differ: in value, in the sign of a zero, or one NaN only.
static inline int64_t pool_mismatches(const struct bie_tensor * a, const struct bie_tensor * b) {
    int64_t bad = 0, idx[BIE_MAX_DIMS] = {0};
    do {
        const double x = bie_load(a, bie_offset(a, idx)), y = bie_load(b, bie_offset(b, idx));
        if (isnan(x) || isnan(y) ? !(isnan(x) && isnan(y)) : x != y || signbit(x) != signbit(y)) bad++;
    } while (bie_next_index(a, idx));
    return bad;
}

// One case on ctx (tensors moved by dev) against the reference context ref.
static inline void pool_check_case(const struct pcase * c, bie_context_t * ref, bie_context_t * ctx, const char * name,
                                   const struct op_device * dev) {
    const int64_t xs[4] = {c->N, c->C, c->H, c->W}, ys[4] = {c->N, c->C, c->OH, c->OW};
    struct bie_tensor x = pool_tensor(c->xd, xs, c->xl), y_ref = pool_tensor(c->yd, ys, c->yl),
                      y = pool_tensor(c->yd, ys, c->yl);
    struct bie_tensor bits_ref = {0}, bits = {0};
    if (c->bl >= 0) {
        bits_ref = pool_tensor(BIE_DTYPE_B1, ys, c->bl);
        bits = pool_tensor(BIE_DTYPE_B1, ys, c->bl);
    }
    pool_fill(&x);
    struct bie_tensor mul = pool_vector(c->C, c->mul, -1.5f, 1.5f), add = pool_vector(c->C, c->add, -1.0f, 1.0f),
                      bb = pool_vector(c->C, c->bb, -1.0f, 1.0f);
    struct bie_tensor am_ref = {0}, am = {0}, gy = {0}, gz_ref = {0}, gz = {0};
    if (c->am) {
        am_ref = pool_tensor(BIE_DTYPE_U8, ys, c->yl), am = pool_tensor(BIE_DTYPE_U8, ys, c->yl);
        gy = pool_tensor(c->gd, ys, c->gl);
        test_fill_uniform(&gy, -1.0f, 1.0f);
        gz_ref = pool_tensor(c->zd, xs, c->zl), gz = pool_tensor(c->zd, xs, c->zl);
    }
    struct bie_affine_maxpool2d_args a = {&x,
                                          c->mul ? &mul : NULL,
                                          c->add ? &add : NULL,
                                          &y_ref,
                                          c->bl >= 0 ? &bits_ref : NULL,
                                          c->bb ? &bb : NULL,
                                          c->am ? &am_ref : NULL};
    CHECK_OK(ref, bie_affine_maxpool2d_forward(ref, &c->d, &a));
    const struct bie_affine_maxpool2d_backward_args b = {&am_ref, &gy, &gz_ref};
    if (c->am) {
        CHECK_OK(ref, bie_affine_maxpool2d_backward(ref, &c->d, &b));
        pool_check_spec(c, &x, &y_ref, &am_ref, &mul, &add, &gy, &gz_ref);
    }
    struct bie_tensor dx = dev->put(&x), dy = dev->put(&y), dmul = c->mul ? dev->put(&mul) : mul,
                      dadd = c->add ? dev->put(&add) : add, dbb = c->bb ? dev->put(&bb) : bb,
                      dbits = c->bl >= 0 ? dev->put(&bits) : bits, dam = c->am ? dev->put(&am) : am;
    struct bie_affine_maxpool2d_args da = {&dx,
                                           c->mul ? &dmul : NULL,
                                           c->add ? &dadd : NULL,
                                           &dy,
                                           c->bl >= 0 ? &dbits : NULL,
                                           c->bb ? &dbb : NULL,
                                           c->am ? &dam : NULL};
    const enum bie_status s = bie_affine_maxpool2d_forward(ctx, &c->d, &da);
    CHECK(s == BIE_STATUS_OK, "%s: %s: %s (%s)", name, c->what, bie_status_string(s), bie_context_last_error(ctx));
    if (s == BIE_STATUS_OK) {
        dev->get(&y, &dy);
        const int64_t bad = pool_mismatches(&y, &y_ref);
        CHECK(bad == 0, "%s: %s: %lld of y's elements differ from the reference", name, c->what, (long long)bad);
        if (c->bl >= 0) {
            dev->get(&bits, &dbits);
            const int64_t badb = pool_mismatches(&bits, &bits_ref);
            CHECK(badb == 0, "%s: %s: %lld bits differ from the reference", name, c->what, (long long)badb);
        }
    }
    if (s == BIE_STATUS_OK && c->am) {
        dev->get(&am, &dam);
        const int64_t bada = pool_mismatches(&am, &am_ref);
        CHECK(bada == 0, "%s: %s: %lld argmax entries differ from the reference", name, c->what, (long long)bada);
        struct bie_tensor dgy = dev->put(&gy), dgz = dev->put(&gz);
        const struct bie_affine_maxpool2d_backward_args db = {&dam, &dgy, &dgz};
        const enum bie_status sb = bie_affine_maxpool2d_backward(ctx, &c->d, &db);
        CHECK(sb == BIE_STATUS_OK, "%s: backward: %s: %s (%s)", name, c->what, bie_status_string(sb),
              bie_context_last_error(ctx));
        if (sb == BIE_STATUS_OK) {
            dev->get(&gz, &dgz);
            const int64_t badz = pool_mismatches(&gz, &gz_ref);
            CHECK(badz == 0, "%s: backward: %s: %lld of grad_z's elements differ from the reference", name, c->what,
                  (long long)badz);
        }
        dev->drop(&dgy), dev->drop(&dgz);
    }
    if (c->am) dev->drop(&dam);
    struct bie_tensor * owned_am[5] = {&am_ref, &am, &gy, &gz_ref, &gz};
    for (int i = 0; i < 5; i++)
        if (owned_am[i]->data) test_tensor_free(owned_am[i]);
    dev->drop(&dx), dev->drop(&dy);
    if (c->mul) dev->drop(&dmul);
    if (c->add) dev->drop(&dadd);
    if (c->bb) dev->drop(&dbb);
    if (c->bl >= 0) dev->drop(&dbits);
    struct bie_tensor * owned[8] = {&x, &y_ref, &y, &bits_ref, &bits, &mul, &add, &bb};
    for (int i = 0; i < 8; i++) test_tensor_free(owned[i]);
}
