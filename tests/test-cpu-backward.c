// SPDX-License-Identifier: Apache-2.0
// test-cpu-backward.c: the CPU backend's backward (sgemm-based) against the reference backend on
// random binary / 4-bit / 8-bit linear and conv2d layers (odd shapes, every kernel, stride, pad,
// dilation and pad value, contiguous / channels-last / strided views).
//
// Tolerance: backward-tolerance.h derives it; masks and codes are computed exactly as in the
// reference, so masked-out elements must be exactly zero.
#include "backward-tolerance.h"
#include "test-cpu-common.h"

#include "cpu/cpu-impl.h"

static const int64_t k_list[] = {1, 7, 8, 9, 31, 33, 63, 64, 65, 127, 129, 511, 513, 1000};

struct bcase {
    enum bie_quant q;
    bool conv;
    struct bie_linear_desc lin;
    struct bie_conv2d_desc cd;
    struct bie_tensor x, bias, w, sa, sw, gy, gx, gw, gs, gb;
    bool has_bias;
    float clamp; // x_clamp (0: none)
    int64_t n_x_terms, n_w_terms, n_b_terms, nx;
    char what[320];
};

static void fill_case(struct bcase * bc, enum bie_dtype wd) {
    test_fill_uniform(&bc->x, -2, 2);
    if (wd == BIE_DTYPE_I8) test_fill_uniform(&bc->w, -128, 128);
    else if (wd == BIE_DTYPE_S4) test_fill_uniform(&bc->w, -8, 8);
    else test_fill_uniform(&bc->w, -1, 1);
    test_fill_uniform(&bc->gy, -1, 1);
    const int64_t C = bc->conv ? bc->cd.in_channels : bc->lin.in_features;
    bc->has_bias = test_rand_int(0, 1);
    if (bc->has_bias) {
        bc->bias = test_tensor(BIE_DTYPE_F32, 1, &C, NULL);
        test_fill_uniform(&bc->bias, -0.3f, 0.3f);
    }
    bc->sa = test_scalar(bc->q == BIE_QUANT_BINARY ? test_rand_float(0.3f, 1.5f) : test_rand_float(0.02f, 0.3f));
    bc->sw = test_scalar(test_rand_float(0.01f, 0.2f));
    bc->gs = test_tensor(BIE_DTYPE_F32, 0, NULL, NULL);
    bc->gb = test_tensor(BIE_DTYPE_F32, 1, &C, NULL);
    bc->clamp = test_rand_int(0, 2) == 0 ? test_rand_float(0.5f, 1.5f) : 0.0f; // (x in [-2, 2])
}

static enum bie_dtype pick_w(enum bie_quant q) {
    const int r = (int)test_rand_int(0, 3);
    if (r == 0) return BIE_DTYPE_I8;
    if (r == 1 && q == BIE_QUANT_BINARY) return BIE_DTYPE_B1;
    if (r == 1 && q == BIE_QUANT_INT4) return BIE_DTYPE_S4;
    return BIE_DTYPE_F32;
}

static enum bie_dtype pick_g(void) {
    const int r = (int)test_rand_int(0, 5);
    return r == 0 ? BIE_DTYPE_BF16 : r == 1 ? BIE_DTYPE_F16 : BIE_DTYPE_F32;
}

// A linear case with K inputs and M rows, N outputs (random in [1, 45] when 0).
static void make_linear(struct bcase * bc, enum bie_quant q, int64_t K, int64_t M, int64_t N) {
    memset(bc, 0, sizeof *bc);
    bc->q = q;
    if (!M) M = test_rand_int(1, 45);
    if (!N) N = test_rand_int(1, 45);
    bc->lin = (struct bie_linear_desc){.quant = q, .in_features = K, .out_features = N};
    const enum bie_dtype wd = pick_w(q), gxd = pick_g(), gwd = pick_g();
    const bool gap = test_rand_int(0, 3) == 0;
    bc->x = cpu_test_view2(BIE_DTYPE_F32, M, K, gap);
    bc->w = cpu_test_view2(wd, N, K, false);
    bc->gy = cpu_test_view2(BIE_DTYPE_F32, M, N, gap);
    bc->gx = cpu_test_view2(gxd, M, K, false);
    bc->gw = cpu_test_view2(gwd, N, K, gap);
    bc->n_x_terms = N;
    bc->n_w_terms = M;
    bc->n_b_terms = M;
    bc->nx = M * K;
    fill_case(bc, wd);
    snprintf(bc->what, sizeof bc->what, "linear q%d M=%lld K=%lld N=%lld w %s gx %s gw %s gap %d bias %d clamp %g",
             (int)q, (long long)M, (long long)K, (long long)N, bie_dtype_name(wd), bie_dtype_name(gxd),
             bie_dtype_name(gwd), (int)gap, (int)bc->has_bias, (double)bc->clamp);
}

static void make_conv(struct bcase * bc, enum bie_quant q) {
    memset(bc, 0, sizeof *bc);
    bc->q = q;
    struct bie_conv2d_desc * d = &bc->cd;
    static const int64_t cs[] = {1, 3, 8, 13, 32, 33};
    d->quant = q;
    d->in_channels = test_pick(cs, 6);
    d->out_channels = test_rand_int(1, 24);
    static const int ks[] = {1, 2, 3, 3, 5};
    int64_t N, H, W, OH, OW;
    cpu_test_conv_geometry(d, ks, 5, 11, &N, &H, &W, &OH, &OW);
    static const int nchw[4] = {0, 1, 2, 3}, nhwc[4] = {0, 2, 3, 1}, odd[4] = {1, 0, 3, 2};
    const int lx = (int)test_rand_int(0, 2), lg = (int)test_rand_int(0, 2);
    const int * ox = lx == 0 ? nchw : lx == 1 ? nhwc : odd;
    const int * og = lg == 0 ? nchw : lg == 1 ? nhwc : odd;
    const enum bie_dtype wd = pick_w(q), gxd = pick_g(), gwd = pick_g();
    const int64_t xs[4] = {N, d->in_channels, H, W};
    const int64_t wsh[4] = {d->out_channels, d->in_channels, d->kernel[0], d->kernel[1]};
    const int64_t ysh[4] = {N, d->out_channels, OH, OW};
    bc->conv = true;
    bc->x = cpu_test_view4(BIE_DTYPE_F32, xs, ox);
    bc->w = cpu_test_view4(wd, wsh, (wd == BIE_DTYPE_B1 || wd == BIE_DTYPE_S4) ? nhwc : nchw);
    bc->gy = cpu_test_view4(BIE_DTYPE_F32, ysh, og);
    bc->gx = cpu_test_view4(gxd, xs, ox);
    bc->gw = cpu_test_view4(gwd, wsh, lg == 2 ? odd : nchw);
    bc->n_x_terms = d->out_channels * d->kernel[0] * d->kernel[1];
    bc->n_w_terms = N * OH * OW;
    bc->n_b_terms = N * H * W;
    bc->nx = N * d->in_channels * H * W;
    fill_case(bc, wd);
    snprintf(bc->what, sizeof bc->what,
             "conv q%d N=%lld C=%lld H=%lld W=%lld O=%lld k=%dx%d s=%dx%d p=%dx%d d=%dx%d pad=%d w %s x/%d g/%d "
             "gx %s gw %s bias %d clamp %g",
             (int)q, (long long)N, (long long)d->in_channels, (long long)H, (long long)W, (long long)d->out_channels,
             d->kernel[0], d->kernel[1], d->stride[0], d->stride[1], d->padding[0], d->padding[1], d->dilation[0],
             d->dilation[1], (int)d->pad_value, bie_dtype_name(wd), lx, lg, bie_dtype_name(gxd), bie_dtype_name(gwd),
             (int)bc->has_bias, (double)bc->clamp);
}

static void free_case(struct bcase * bc) {
    struct bie_tensor * ts[] = {&bc->x, &bc->w, &bc->sa, &bc->sw, &bc->gy, &bc->gx, &bc->gw, &bc->gs, &bc->gb};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) test_tensor_free(ts[i]);
    if (bc->has_bias) test_tensor_free(&bc->bias);
}

struct outs {
    struct bie_tensor gx, gw, gs, gb;
};

static enum bie_status run(bie_context_t * ctx, struct bcase * bc, struct outs * o) {
    o->gx = cpu_test_clone(&bc->gx);
    o->gw = cpu_test_clone(&bc->gw);
    o->gs = cpu_test_clone(&bc->gs);
    o->gb = cpu_test_clone(&bc->gb);
    struct bie_backward_args a = {.x = &bc->x,
                                  .bias_a = bc->has_bias ? &bc->bias : NULL,
                                  .weight = &bc->w,
                                  .scale_a = &bc->sa,
                                  .scale_w = &bc->sw,
                                  .grad_y = &bc->gy,
                                  .grad_x = &o->gx,
                                  .grad_weight = &o->gw,
                                  .grad_scale_a = &o->gs,
                                  .grad_bias_a = &o->gb,
                                  .x_clamp = bc->clamp};
    return bc->conv ? bie_conv2d_backward(ctx, &bc->cd, &a) : bie_linear_backward(ctx, &bc->lin, &a);
}

static void free_outs(struct outs * o) {
    test_tensor_free(&o->gx);
    test_tensor_free(&o->gw);
    test_tensor_free(&o->gs);
    test_tensor_free(&o->gb);
}

// Compares every element of a and b (same views) within tol + the output rounding; returns the
// number of mismatches (the first few are printed).
static int compare(const char * name, const struct bie_tensor * a, const struct bie_tensor * b, double tol,
                   const char * what) {
    int bad = 0;
    int64_t idx[BIE_MAX_DIMS] = {0};
    do {
        const int64_t off = bie_offset(a, idx);
        const double va = bie_load(a, off), vb = bie_load(b, off);
        const double t = tol + 2.0 * backward_rounding(a->dtype) * fabs(vb);
        if (!(fabs(va - vb) <= t)) {
            if (bad < 3)
                fprintf(stderr, "  %s[off %lld]: cpu %.9g ref %.9g tol %.3g (%s)\n", name, (long long)off, va, vb, t,
                        what);
            bad++;
        }
    } while (bie_next_index(a, idx));
    return bad;
}

static bool same_bytes(const struct outs * a, const struct outs * b) {
    return memcmp(a->gx.data, b->gx.data, cpu_test_nbytes(&a->gx)) == 0 &&
           memcmp(a->gw.data, b->gw.data, cpu_test_nbytes(&a->gw)) == 0 &&
           memcmp(a->gs.data, b->gs.data, cpu_test_nbytes(&a->gs)) == 0 &&
           memcmp(a->gb.data, b->gb.data, cpu_test_nbytes(&a->gb)) == 0;
}

static void check_case(struct bcase * bc, bie_context_t * ref, bie_context_t ** cpu2, int nlev, bie_context_t * cpu1) {
    struct outs r, c1;
    const enum bie_status sr = run(ref, bc, &r);
    CHECK(sr == BIE_STATUS_OK, "ref: %s (%s)", bie_context_last_error(ref), bc->what);
    const enum bie_status s1 = run(cpu1, bc, &c1);
    CHECK(s1 == BIE_STATUS_OK, "cpu: %s (%s)", bie_context_last_error(cpu1), bc->what);
    const struct backward_tolerance tol =
        backward_tolerance(bc->q, tensor_max_abs(&bc->gy), bie_load_scalar(&bc->sa), bie_load_scalar(&bc->sw),
                           (double)bc->n_x_terms, (double)bc->n_w_terms, (double)bc->n_b_terms, (double)bc->nx);
    for (int l = 0; l < nlev; l++) {
        struct outs c2;
        const enum bie_status s2 = run(cpu2[l], bc, &c2);
        CHECK(s2 == BIE_STATUS_OK, "cpu: %s (%s)", bie_context_last_error(cpu2[l]), bc->what);
        int bad = compare("grad_x", &c2.gx, &r.gx, tol.x, bc->what);
        bad += compare("grad_weight", &c2.gw, &r.gw, tol.w, bc->what);
        bad += compare("grad_bias_a", &c2.gb, &r.gb, tol.b, bc->what);
        bad += compare("grad_scale_a", &c2.gs, &r.gs, tol.s, bc->what);
        CHECK(bad == 0, "isa %s: %d gradient values outside the tolerance (%s)",
              bie_cpu_isa_name(bie_context_cpu_isa(cpu2[l])), bad, bc->what);
        // The best level at 2 threads against 1 thread: byte-identical.
        if (l == nlev - 1) CHECK(same_bytes(&c1, &c2), "1 and 2 threads differ (%s)", bc->what);
        free_outs(&c2);
    }
    free_outs(&r);
    free_outs(&c1);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    struct cpu_test_ctxs c;
    cpu_test_ctxs_make(&c, 2);
    static const enum bie_quant qs[3] = {BIE_QUANT_BINARY, BIE_QUANT_INT4, BIE_QUANT_INT8};
    for (int qi = 0; qi < 3; qi++)
        for (int ki = 0; ki < 14; ki++) {
            if (c.quick && ki % 3) continue;
            struct bcase bc;
            make_linear(&bc, qs[qi], k_list[ki], 0, 0);
            check_case(&bc, c.ref, c.cpu, c.nlev, c.cpu1);
            free_case(&bc);
        }
    // Larger binary linear layers: the float-by-sign GEMM's several blocks of 512 reduction rows
    // (N for grad_x, M for grad_W), split column ranges, partial row blocks.
    static const int64_t big[][3] = {{3, 1100, 700}, {530, 5, 129}, {70, 600, 513}, {1, 1025, 65}};
    for (int i = 0; i < 4; i++) {
        if (c.quick && i % 2) continue;
        struct bcase bc;
        make_linear(&bc, BIE_QUANT_BINARY, big[i][2], big[i][0], big[i][1]);
        check_case(&bc, c.ref, c.cpu, c.nlev, c.cpu1);
        free_case(&bc);
    }
    const int nconv = c.quick ? 20 : 400;
    for (int i = 0; i < nconv; i++) {
        // Every other case in many small tasks and waves of grad_W partials.
        bie_cpu_bwd_task_pixels = i % 2 ? 2048 : test_rand_int(1, 64);
        bie_cpu_bwd_wave_max = i % 2 ? 16 : test_rand_int(1, 3);
        struct bcase bc;
        make_conv(&bc, qs[i % 3]);
        check_case(&bc, c.ref, c.cpu, c.nlev, c.cpu1);
        free_case(&bc);
    }
    cpu_test_ctxs_free(&c);
    return test_finish("test-cpu-backward");
}
