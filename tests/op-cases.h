// SPDX-License-Identifier: Apache-2.0
// op-cases.h: random cases of the batched matmul and the embedding shared by their CPU and CUDA
// tests: odd shapes, leading dims and layouts, inputs with zeros, rounding ties and clip
// boundaries, tables of every form; and the comparisons (identical values; within a bound).
#pragma once

#include "test-util.h"

struct mcase {
    enum bie_quant q;
    int lead; // leading dims (0..2)
    int64_t ls[2], B, M, N, K;
    int xl, yl; // layouts: 0 dense, 1 gapped rows, 2 stored transposed
    enum bie_dtype xd, yd, od, gd;
    float xc, yc;
    char what[256];
};

// A [lead..., R, C] tensor in layout 0/1/2 (2: memory [lead..., C, R], the last two dims swapped).
static inline struct bie_tensor operand(const struct mcase * c, enum bie_dtype d, int64_t R, int64_t C, int layout) {
    int64_t shape[4];
    int nd = 0;
    for (int i = 0; i < c->lead; i++) shape[nd++] = c->ls[i];
    const int64_t inner = layout == 2 ? R : C, outer = layout == 2 ? C : R;
    const int64_t pitch = layout == 1 ? inner + 3 : inner;
    shape[nd++] = outer;
    shape[nd++] = inner;
    int64_t st[4];
    st[nd - 1] = 1;
    st[nd - 2] = pitch;
    for (int i = nd - 3; i >= 0; i--) st[i] = st[i + 1] * shape[i + 1];
    struct bie_tensor t = test_tensor(d, nd, shape, st);
    if (layout == 2) {
        int32_t perm[4];
        for (int i = 0; i < nd; i++) perm[i] = i;
        perm[nd - 2] = nd - 1;
        perm[nd - 1] = nd - 2;
        bie_tensor_permute(&t, perm);
    }
    return t;
}

// Uniform values with one in eight replaced by a zero, a rounding tie or a clip boundary.
static inline void matmul_fill(const struct mcase * c, const struct bie_tensor * t, float clip) {
    test_fill_uniform(t, -2.5f, 2.5f);
    int64_t idx[BIE_MAX_DIMS] = {0};
    const float hi = c->q == BIE_QUANT_BINARY ? 1.0f : (float)bie_quant_hi(c->q);
    do {
        if (test_rand_int(0, 7)) continue;
        float v;
        switch (test_rand_int(0, 4)) {
        case 0: v = 0.0f; break;
        case 1: v = clip * ((float)test_rand_int(-3, 3) + 0.5f); break; // a tie of rne(v / clip)
        case 2: v = clip * hi; break;                                   // on the clip boundary
        case 3: v = -clip * hi; break;
        default: v = -0.0f; break;
        }
        bie_store(t, bie_offset(t, idx), v);
    } while (bie_next_index(t, idx));
}

static const enum bie_dtype floats[3] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16};

static inline void matmul_describe(struct mcase * c) {
    snprintf(c->what, sizeof c->what, "q%d lead %d (B %lld) M %lld N %lld K %lld layouts %d/%d x %s y %s out %s g %s",
             (int)c->q, c->lead, (long long)c->B, (long long)c->M, (long long)c->N, (long long)c->K, c->xl, c->yl,
             bie_dtype_name(c->xd), bie_dtype_name(c->yd), bie_dtype_name(c->od), bie_dtype_name(c->gd));
}

static inline void matmul_random_case(struct mcase * c) {
    static const int64_t ks[] = {1, 3, 7, 8, 9, 31, 64, 65, 129, 200, 513};
    static const enum bie_quant qs[] = {BIE_QUANT_BINARY, BIE_QUANT_INT4, BIE_QUANT_INT8};
    memset(c, 0, sizeof *c);
    c->q = qs[test_rand_int(0, 2)];
    c->lead = (int)test_rand_int(0, 2);
    c->B = 1;
    for (int i = 0; i < c->lead; i++) c->B *= (c->ls[i] = test_rand_int(1, 3));
    c->M = test_rand_int(1, 37);
    c->N = test_rand_int(1, 37);
    c->K = test_pick(ks, 11);
    c->xl = (int)test_rand_int(0, 2);
    c->yl = (int)test_rand_int(0, 2);
    c->xd = floats[test_rand_int(0, 2)];
    c->yd = floats[test_rand_int(0, 2)];
    c->od = test_rand_int(0, 3) == 0 ? BIE_DTYPE_I32 : floats[test_rand_int(0, 2)];
    c->gd = floats[test_rand_int(0, 2)];
    c->xc = c->q == BIE_QUANT_BINARY ? test_rand_float(0.4f, 1.5f) : test_rand_float(0.01f, 0.3f);
    c->yc = c->q == BIE_QUANT_BINARY ? test_rand_float(0.4f, 1.5f) : test_rand_float(0.01f, 0.3f);
    matmul_describe(c);
}

struct ecase {
    enum bie_quant q;
    bool bag, has_scale, use_inverse;
    int64_t V, D, nd, ishape[3], U;
    enum bie_dtype td, id, od;
    int tlayout; // 0 dense rows, 1 gapped rows, 2 (b1/s4) rows packed back to back
    char what[256];
};

static inline void embedding_random_case(struct ecase * c) {
    static const enum bie_quant qs[3] = {BIE_QUANT_BINARY, BIE_QUANT_INT4, BIE_QUANT_INT8};
    static const int64_t ds[] = {1, 3, 7, 8, 9, 16, 31, 33, 64, 100, 129};
    memset(c, 0, sizeof *c);
    c->q = qs[test_rand_int(0, 2)];
    c->bag = test_rand_int(0, 3) == 0;
    c->V = test_rand_int(1, 40);
    c->D = test_pick(ds, 11);
    const int r = (int)test_rand_int(0, 3);
    if (c->q == BIE_QUANT_BINARY) c->td = r == 0 ? BIE_DTYPE_I8 : r == 1 ? floats[test_rand_int(0, 2)] : BIE_DTYPE_B1;
    else if (c->q == BIE_QUANT_INT4)
        c->td = r == 0 ? BIE_DTYPE_I8 : r == 1 ? floats[test_rand_int(0, 2)] : BIE_DTYPE_S4;
    else c->td = r <= 1 ? BIE_DTYPE_I8 : floats[test_rand_int(0, 2)];
    c->has_scale = bie_dtype_is_float(c->td) && c->q != BIE_QUANT_BINARY ? true : test_rand_int(0, 2) != 0;
    c->id = test_rand_int(0, 1) ? BIE_DTYPE_I64 : BIE_DTYPE_I32;
    c->od = floats[test_rand_int(0, 2)];
    c->nd = test_rand_int(1, 3);
    for (int i = 0; i < c->nd; i++) c->ishape[i] = test_rand_int(1, 6);
    c->tlayout = (int)test_rand_int(0, c->td == BIE_DTYPE_B1 || c->td == BIE_DTYPE_S4 ? 2 : 1);
    c->use_inverse = test_rand_int(0, 1);
    snprintf(c->what, sizeof c->what,
             "q%d bag %d V %lld D %lld table %s layout %d scale %d idx %s nd %d [%lld %lld %lld] out %s inv %d",
             (int)c->q, (int)c->bag, (long long)c->V, (long long)c->D, bie_dtype_name(c->td), c->tlayout,
             (int)c->has_scale, bie_dtype_name(c->id), (int)c->nd, (long long)c->ishape[0],
             (long long)(c->nd > 1 ? c->ishape[1] : 0), (long long)(c->nd > 2 ? c->ishape[2] : 0),
             bie_dtype_name(c->od), (int)c->use_inverse);
}

static inline struct bie_tensor make_table(const struct ecase * c) {
    const int64_t shape[2] = {c->V, c->D};
    struct bie_tensor t = test_tensor(c->td, 2, shape, NULL);
    if (c->tlayout != 0) {
        free(t.data);
        t.stride[0] = c->tlayout == 1 ? t.stride[0] + (c->td == BIE_DTYPE_B1   ? 8
                                                       : c->td == BIE_DTYPE_S4 ? 2
                                                                               : 3)
                                      : c->D;
        t.data = calloc(1, (size_t)(c->V * t.stride[0] * bie_dtype_bits(c->td) + 7) / 8 + 64);
    }
    if (c->td == BIE_DTYPE_I8) test_fill_uniform(&t, -130, 130);
    else if (c->td == BIE_DTYPE_S4) test_fill_uniform(&t, -8, 8);
    else test_fill_uniform(&t, -1, 1);
    return t;
}

// out-shaped [lead..., D] float tensor, dense or with a gap after each row.
static inline struct bie_tensor make_out(const struct ecase * c, enum bie_dtype d, bool gap) {
    int64_t shape[4];
    const int lead = c->bag ? (int)c->nd - 1 : (int)c->nd;
    for (int i = 0; i < lead; i++) shape[i] = c->ishape[i];
    shape[lead] = c->D;
    struct bie_tensor t = test_tensor(d, lead + 1, shape, NULL);
    if (gap) {
        free(t.data);
        t.stride[lead] = 1;
        int64_t s = c->D + 5;
        for (int i = lead - 1; i >= 0; i--) {
            t.stride[i] = s;
            s *= shape[i];
        }
        t.data = calloc(1, (size_t)s * 4 + 64);
    }
    return t;
}

static inline int64_t mismatches(const struct bie_tensor * a, const struct bie_tensor * b) {
    int64_t bad = 0, idx[BIE_MAX_DIMS] = {0};
    do {
        const double x = bie_load(a, bie_offset(a, idx)), y = bie_load(b, bie_offset(b, idx));
        if (x != y || signbit(x) != signbit(y)) bad++;
    } while (bie_next_index(a, idx));
    return bad;
}

static inline double rel_round(enum bie_dtype d) {
    return d == BIE_DTYPE_BF16 ? 0x1p-8 : d == BIE_DTYPE_F16 ? 0x1p-11 : 0x1p-24;
}

// max over elements of |got - ref| - (tol + rel*|ref|) (> 0: out of bounds).
static inline double excess(const struct bie_tensor * got, const struct bie_tensor * ref, double tol) {
    double worst = -1.0;
    int64_t idx[BIE_MAX_DIMS] = {0};
    do {
        const double g = bie_load(got, bie_offset(got, idx)), r = bie_load(ref, bie_offset(ref, idx));
        const double e = fabs(g - r) - (tol + rel_round(got->dtype) * fabs(r));
        if (e > worst || isnan(e)) worst = isnan(e) ? INFINITY : e;
    } while (bie_next_index(got, idx));
    return worst;
}

// How a test moves tensors to the device of the context under test and back: put gives a copy on
// the device (the CPU: the same view), get copies a device result into its host tensor, drop frees
// a copy. clips: whether scales may be put on the device too (the CPU backend takes host scales).
struct op_device {
    struct bie_tensor (*put)(const struct bie_tensor * host);
    void (*get)(struct bie_tensor * host, const struct bie_tensor * dev);
    void (*drop)(struct bie_tensor * dev);
    bool clips;
};

static inline struct bie_tensor op_host_put(const struct bie_tensor * h) { return *h; }
static inline void op_host_get(struct bie_tensor * h, const struct bie_tensor * d) { (void)h, (void)d; }
static inline void op_host_drop(struct bie_tensor * d) { (void)d; }
static const struct op_device op_host = {op_host_put, op_host_get, op_host_drop, false};

// The bounds of the matmul backward (test-matmul.c's header): per element of grad_x / grad_y, and
// of the clip gradients (gxc, gyc: the reference's values).
static inline void matmul_bounds(const struct mcase * c, double gxc, double gyc, double * tol) {
    const double cmax = c->q == BIE_QUANT_BINARY ? 1.0 : -bie_quant_lo(c->q);
    tol[0] = (double)(c->N + 2) * 0x1p-24 * (double)c->N * cmax * c->yc;
    tol[1] = (double)(c->M + 2) * 0x1p-24 * (double)c->M * cmax * c->xc;
    const double dmax = c->q == BIE_QUANT_BINARY ? 1.0 : cmax;
    const double nxk = (double)(c->B * c->M * c->K), nyk = (double)(c->B * c->N * c->K);
    const double den = c->q == BIE_QUANT_BINARY ? 1.0 : bie_quant_hi(c->q);
    tol[2] = nxk * tol[0] * dmax / sqrt(nxk * den) + (double)(c->B + 1) * 0x1p-23 * fabs(gxc);
    tol[3] = nyk * tol[1] * dmax / sqrt(nyk * den) + (double)(c->B + 1) * 0x1p-23 * fabs(gyc);
}

// One random matmul case (c: its shapes, already drawn) run on every context of ctxs (names[i]
// says which) against the reference: the forward must match it element by element, the backward
// stay within matmul_bounds.
static inline void matmul_check_case(const struct mcase * cp, bie_context_t * ref, bie_context_t * const * ctxs,
                                     const char * const * names, int nctx, bool backward,
                                     const struct op_device * dev) {
    const struct mcase c = *cp;
    struct bie_tensor x = operand(&c, c.xd, c.M, c.K, c.xl), y = operand(&c, c.yd, c.N, c.K, c.yl);
    matmul_fill(&c, &x, c.xc);
    matmul_fill(&c, &y, c.yc);
    struct bie_tensor xc = test_scalar(c.xc), yc = test_scalar(c.yc);
    struct bie_tensor dx = dev->put(&x), dy = dev->put(&y);
    const bool dev_clips = dev->clips && test_rand_int(0, 1);
    struct bie_tensor dxc = dev_clips ? dev->put(&xc) : xc, dyc = dev_clips ? dev->put(&yc) : yc;
    const struct bie_matmul_desc d = {c.q};
    if (!backward) {
        struct bie_tensor o_ref = operand(&c, c.od, c.M, c.N, 0);
        struct bie_matmul_args a = {&x, &y, &xc, &yc, &o_ref};
        CHECK_OK(ref, bie_matmul_forward(ref, &d, &a));
        for (int i = 0; i < nctx; i++) {
            struct bie_tensor o = operand(&c, c.od, c.M, c.N, (int)test_rand_int(0, 2)), dout = dev->put(&o);
            a = (struct bie_matmul_args){&dx, &dy, &dxc, &dyc, &dout};
            CHECK_OK(ctxs[i], bie_matmul_forward(ctxs[i], &d, &a));
            dev->get(&o, &dout);
            const int64_t bad = mismatches(&o, &o_ref);
            CHECK(bad == 0, "forward: %lld elements differ from the reference (%s, device clips %d): %s",
                  (long long)bad, names[i], (int)dev_clips, c.what);
            dev->drop(&dout);
            test_tensor_free(&o);
        }
        test_tensor_free(&o_ref);
    } else {
        struct bie_tensor g = operand(&c, c.gd, c.M, c.N, (int)test_rand_int(0, 2));
        test_fill_uniform(&g, -1, 1);
        struct bie_tensor dg = dev->put(&g);
        struct bie_tensor gx_r = operand(&c, BIE_DTYPE_F32, c.M, c.K, 0),
                          gy_r = operand(&c, BIE_DTYPE_F32, c.N, c.K, 0);
        struct bie_tensor gxc_r = test_scalar(0), gyc_r = test_scalar(0);
        struct bie_matmul_backward_args a = {&x, &y, &xc, &yc, &g, &gx_r, &gy_r, &gxc_r, &gyc_r};
        CHECK_OK(ref, bie_matmul_backward(ref, &d, &a));
        double tol[4];
        matmul_bounds(&c, bie_load_scalar(&gxc_r), bie_load_scalar(&gyc_r), tol);
        for (int i = 0; i < nctx; i++) {
            const enum bie_dtype gxd = floats[test_rand_int(0, 2)], gyd = floats[test_rand_int(0, 2)];
            struct bie_tensor gx = operand(&c, gxd, c.M, c.K, (int)test_rand_int(0, 2));
            struct bie_tensor gy = operand(&c, gyd, c.N, c.K, (int)test_rand_int(0, 2));
            struct bie_tensor gxc = test_scalar(0), gyc = test_scalar(0);
            struct bie_tensor dgx = dev->put(&gx), dgy = dev->put(&gy);
            struct bie_tensor dgxc = dev->clips ? dev->put(&gxc) : gxc, dgyc = dev->clips ? dev->put(&gyc) : gyc;
            const int which = (int)test_rand_int(0, 3); // 1: y's gradients only, 2: x's only
            struct bie_matmul_backward_args b = {&dx,
                                                 &dy,
                                                 &dxc,
                                                 &dyc,
                                                 &dg,
                                                 which == 1 ? NULL : &dgx,
                                                 which == 2 ? NULL : &dgy,
                                                 which == 1 ? NULL : &dgxc,
                                                 which == 2 ? NULL : &dgyc};
            CHECK_OK(ctxs[i], bie_matmul_backward(ctxs[i], &d, &b));
            dev->get(&gx, &dgx);
            dev->get(&gy, &dgy);
            if (dev->clips) {
                dev->get(&gxc, &dgxc);
                dev->get(&gyc, &dgyc);
            }
            if (which != 1) {
                const double e = excess(&gx, &gx_r, tol[0]);
                CHECK(e <= 0, "grad_x off by %g over the bound (%s, grad_x %s): %s", e, names[i], bie_dtype_name(gxd),
                      c.what);
                const double ex = fabs(bie_load_scalar(&gxc) - bie_load_scalar(&gxc_r));
                CHECK(ex <= tol[2], "grad_x_clip %g vs %g (bound %g, %s): %s", (double)bie_load_scalar(&gxc),
                      (double)bie_load_scalar(&gxc_r), tol[2], names[i], c.what);
            }
            if (which != 2) {
                const double e = excess(&gy, &gy_r, tol[1]);
                CHECK(e <= 0, "grad_y off by %g over the bound (%s, grad_y %s): %s", e, names[i], bie_dtype_name(gyd),
                      c.what);
                const double ey = fabs(bie_load_scalar(&gyc) - bie_load_scalar(&gyc_r));
                CHECK(ey <= tol[3], "grad_y_clip %g vs %g (bound %g, %s): %s", (double)bie_load_scalar(&gyc),
                      (double)bie_load_scalar(&gyc_r), tol[3], names[i], c.what);
            }
            struct bie_tensor * devs[4] = {&dgx, &dgy, &dgxc, &dgyc};
            for (int k = 0; k < (dev->clips ? 4 : 2); k++) dev->drop(devs[k]);
            struct bie_tensor * hosts[4] = {&gx, &gy, &gxc, &gyc};
            for (int k = 0; k < 4; k++) test_tensor_free(hosts[k]);
        }
        dev->drop(&dg);
        struct bie_tensor * hosts[5] = {&g, &gx_r, &gy_r, &gxc_r, &gyc_r};
        for (int k = 0; k < 5; k++) test_tensor_free(hosts[k]);
    }
    dev->drop(&dx);
    dev->drop(&dy);
    if (dev_clips) {
        dev->drop(&dxc);
        dev->drop(&dyc);
    }
    struct bie_tensor * hosts[4] = {&x, &y, &xc, &yc};
    for (int k = 0; k < 4; k++) test_tensor_free(hosts[k]);
}

// An embedding case on ctx against the reference: the forward identical, the backward
// within (n+1)*2^-24*n*smax per element (n lookups of the slot) plus one rounding, unreached rows 0.
static inline void embedding_check(bie_context_t * ref, bie_context_t * ctx, const char * name,
                                   const struct op_device * dev, struct ecase c) {
    struct bie_tensor table = make_table(&c);
    struct bie_tensor idx = test_tensor(c.id, (int32_t)c.nd, c.ishape, NULL);
    const int64_t n = bie_tensor_numel(&idx);
    const int64_t used = test_rand_int(1, c.V); // a few rows only: rows repeat, some are never read
    for (int64_t i = 0; i < n; i++) bie_store(&idx, i, (double)test_rand_int(0, used - 1));
    struct bie_tensor scale = {0};
    float smax = 1.0f;
    if (c.has_scale) {
        scale = test_tensor(floats[test_rand_int(0, 2)], 1, &c.V, NULL);
        test_fill_uniform(&scale, 0.05f, 2.0f);
        if (test_rand_int(0, 2) == 0) bie_store(&scale, 0, 0.0); // a padding row
        smax = 2.0f;
    }
    struct bie_tensor dtable = dev->put(&table), didx = dev->put(&idx), dscale = c.has_scale ? dev->put(&scale) : scale;
    const struct bie_embedding_desc d = {c.q, c.bag};
    struct bie_tensor o_ref = make_out(&c, c.od, false), o = make_out(&c, c.od, test_rand_int(0, 1));
    struct bie_tensor dout = dev->put(&o);
    struct bie_embedding_args a = {&idx, &table, c.has_scale ? &scale : NULL, &o_ref};
    CHECK_OK(ref, bie_embedding_forward(ref, &d, &a));
    a = (struct bie_embedding_args){&didx, &dtable, c.has_scale ? &dscale : NULL, &dout};
    CHECK_OK(ctx, bie_embedding_forward(ctx, &d, &a));
    dev->get(&o, &dout);
    const int64_t bad = mismatches(&o, &o_ref);
    CHECK(bad == 0, "embedding forward: %lld elements differ from the reference (%s): %s", (long long)bad, name,
          c.what);

    // backward: slots of the distinct rows (an inverse), or the dense gradient
    struct bie_tensor g = make_out(&c, floats[test_rand_int(0, 2)], test_rand_int(0, 1));
    test_fill_uniform(&g, -1, 1);
    struct bie_tensor inv = {0};
    int64_t U = c.V, count[64] = {0}, slot_of[64];
    for (int64_t r = 0; r < 64; r++) slot_of[r] = -1;
    if (c.use_inverse) {
        inv = test_tensor(c.id == BIE_DTYPE_I64 ? BIE_DTYPE_I32 : BIE_DTYPE_I64, (int32_t)c.nd, c.ishape, NULL);
        U = 0;
        for (int64_t i = 0; i < n; i++) {
            const int64_t r = (int64_t)bie_load(&idx, i);
            if (slot_of[r] < 0) slot_of[r] = U++;
            bie_store(&inv, i, (double)slot_of[r]);
        }
    }
    for (int64_t i = 0; i < n; i++) {
        const int64_t r = (int64_t)bie_load(&idx, i);
        count[c.use_inverse ? slot_of[r] : r]++;
    }
    const int64_t gshape[2] = {U, c.D};
    const enum bie_dtype gd = floats[test_rand_int(0, 2)];
    struct bie_tensor gr_ref = test_tensor(BIE_DTYPE_F32, 2, gshape, NULL), gr = test_tensor(gd, 2, gshape, NULL);
    size_t gbytes = 0;
    bie_tensor_nbytes(&gr, &gbytes);
    memset(gr.data, 0x55, gbytes); // poison: every element must be written
    struct bie_tensor dg = dev->put(&g), dinv = c.use_inverse ? dev->put(&inv) : inv, dgr = dev->put(&gr);
    struct bie_embedding_backward_args b = {&idx, c.use_inverse ? &inv : NULL, c.has_scale ? &scale : NULL, &g,
                                            &gr_ref};
    CHECK_OK(ref, bie_embedding_backward(ref, &d, &b));
    b = (struct bie_embedding_backward_args){&didx, c.use_inverse ? &dinv : NULL, c.has_scale ? &dscale : NULL, &dg,
                                             &dgr};
    CHECK_OK(ctx, bie_embedding_backward(ctx, &d, &b));
    dev->get(&gr, &dgr);
    for (int64_t u = 0; u < U; u++)
        for (int64_t k = 0; k < c.D; k++) {
            const double got = bie_load(&gr, u * gr.stride[0] + k), want = bie_load(&gr_ref, u * gr_ref.stride[0] + k);
            const double nt = (double)count[u];
            const double tol = (nt + 1) * 0x1p-24 * nt * smax + rel_round(gd) * fabs(want);
            CHECK(fabs(got - want) <= tol && (count[u] || got == 0.0),
                  "embedding backward: grad_rows[%lld, %lld] = %g, want %g (%lld lookups, %s): %s", (long long)u,
                  (long long)k, got, want, (long long)count[u], name, c.what);
        }
    struct bie_tensor * devs[] = {&dtable, &didx, &dout, &dg, &dgr};
    for (size_t i = 0; i < sizeof devs / sizeof devs[0]; i++) dev->drop(devs[i]);
    if (c.has_scale) dev->drop(&dscale);
    if (c.use_inverse) dev->drop(&dinv);
    struct bie_tensor * all[] = {&table, &idx, &scale, &o_ref, &o, &g, &inv, &gr_ref, &gr};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) test_tensor_free(all[i]);
}

static inline void embedding_check_case(bie_context_t * ref, bie_context_t * ctx, const char * name,
                                        const struct op_device * dev) {
    struct ecase c;
    embedding_random_case(&c);
    embedding_check(ref, ctx, name, dev, c);
}
