// SPDX-License-Identifier: Apache-2.0
// test-cpu-forward.c: the optimised CPU backend's forward against the reference backend, at every
// ISA level this machine has (contexts capped with max_isa): binary, 4-bit and 8-bit linear and
// conv2d layers on random shapes (odd K, M, N, C, O; every kernel/stride/pad/dilation/pad value),
// every x / weight / y dtype, contiguous, channels-last, packed and strided views. Every output is
// a deterministic function of the integer accumulators, so the whole output buffer (gaps included)
// must be byte-identical. Thread counts 1 and 2 must give identical bytes too.
#include "test-cpu-common.h"

// The last two reach the long-row binary tiles (>= 256 bytes; 2100: 4 blocks of 8 words and a tail
// word; 16400: more than 31 blocks, so the byte counters are folded on the way).
static const int64_t k_list[] = {1, 7, 8, 9, 31, 33, 63, 64, 65, 127, 129, 511, 513, 1000, 2100, 16400};
#define NK ((int)(sizeof k_list / sizeof k_list[0]))

static enum bie_dtype pick(const enum bie_dtype * d, int n) { return d[test_rand_int(0, n - 1)]; }

static void fill_w(const struct cpu_test_layer * fc) {
    if (fc->w.dtype == BIE_DTYPE_I8) test_fill_uniform(&fc->w, -128, 128);
    else if (fc->w.dtype == BIE_DTYPE_S4) test_fill_uniform(&fc->w, -8, 8);
    else test_fill_uniform(&fc->w, -1, 1);
}

static enum bie_dtype pick_w(enum bie_quant q) {
    static const enum bie_dtype bin[] = {BIE_DTYPE_F32, BIE_DTYPE_F32, BIE_DTYPE_I8,
                                         BIE_DTYPE_B1,  BIE_DTYPE_B1,  BIE_DTYPE_F16};
    static const enum bie_dtype n4[] = {BIE_DTYPE_F32, BIE_DTYPE_I8, BIE_DTYPE_S4, BIE_DTYPE_S4, BIE_DTYPE_BF16};
    static const enum bie_dtype n8[] = {BIE_DTYPE_F32, BIE_DTYPE_F32, BIE_DTYPE_I8, BIE_DTYPE_F16};
    return q == BIE_QUANT_BINARY ? pick(bin, 6) : q == BIE_QUANT_INT4 ? pick(n4, 5) : pick(n8, 4);
}

static enum bie_dtype pick_x(enum bie_quant q) {
    static const enum bie_dtype d[] = {BIE_DTYPE_F32, BIE_DTYPE_F32,  BIE_DTYPE_F32,
                                       BIE_DTYPE_F16, BIE_DTYPE_BF16, BIE_DTYPE_B1};
    enum bie_dtype r = pick(d, 6);
    return (r == BIE_DTYPE_B1 && q != BIE_QUANT_BINARY) ? BIE_DTYPE_F32 : r;
}

static enum bie_dtype pick_y(enum bie_quant q) {
    static const enum bie_dtype d[] = {BIE_DTYPE_F32, BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16,
                                       BIE_DTYPE_I32, BIE_DTYPE_B1,  BIE_DTYPE_B1};
    enum bie_dtype r = pick(d, 7);
    return (r == BIE_DTYPE_B1 && q != BIE_QUANT_BINARY) ? BIE_DTYPE_I32 : r;
}

static enum bie_quant pick_q(void) {
    static const enum bie_quant q[] = {BIE_QUANT_BINARY, BIE_QUANT_BINARY, BIE_QUANT_INT4, BIE_QUANT_INT8};
    return q[test_rand_int(0, 3)];
}

static void make_common(struct cpu_test_layer * fc) {
    if (fc->x.dtype == BIE_DTYPE_B1) test_fill_uniform(&fc->x, -1, 1);
    else test_fill_uniform(&fc->x, -2, 2);
    fill_w(fc);
    const int64_t C = fc->conv ? fc->cd.in_channels : fc->lin.in_features;
    fc->has_bias = fc->x.dtype != BIE_DTYPE_B1 && test_rand_int(0, 1);
    if (fc->has_bias) {
        fc->bias = test_tensor(test_rand_int(0, 3) ? BIE_DTYPE_F32 : BIE_DTYPE_F16, 1, &C, NULL);
        test_fill_uniform(&fc->bias, -0.5f, 0.5f);
    }
    fc->sa = test_scalar(test_rand_float(0.05f, 0.4f));
    fc->sw = test_scalar(test_rand_float(0.005f, 0.2f));
    if (fc->x.dtype != BIE_DTYPE_B1 && test_rand_int(0, 2) == 0) fc->clamp = test_rand_float(0.1f, 1.5f); // (x in +-2)
    cpu_test_garbage(&fc->y);
}

// q and K are random when 0.
static void make_linear(struct cpu_test_layer * fc, enum bie_quant q, int64_t K) {
    memset(fc, 0, sizeof *fc);
    fc->q = q ? q : pick_q();
    if (!K) K = test_pick(k_list, NK);
    const int64_t M = test_rand_int(0, 5) ? test_rand_int(1, 40) : test_rand_int(41, 140);
    const int64_t N = test_rand_int(0, 5) ? test_rand_int(1, 40) : test_rand_int(41, 140);
    fc->lin = (struct bie_linear_desc){.quant = fc->q, .in_features = K, .out_features = N};
    const enum bie_dtype xd = pick_x(fc->q), wd = pick_w(fc->q), yd = pick_y(fc->q);
    const bool xg = test_rand_int(0, 3) == 0, wg = test_rand_int(0, 3) == 0, yg = test_rand_int(0, 3) == 0;
    fc->x = cpu_test_view2(xd, M, K, xg);
    fc->w = cpu_test_view2(wd, N, K, wg);
    fc->y = cpu_test_view2(yd, M, N, yg);
    make_common(fc);
    snprintf(fc->what, sizeof fc->what, "linear q%d M=%lld K=%lld N=%lld x %s%s w %s%s y %s%s bias %d", (int)fc->q,
             (long long)M, (long long)K, (long long)N, bie_dtype_name(xd), xg ? "(gap)" : "", bie_dtype_name(wd),
             wg ? "(gap)" : "", bie_dtype_name(yd), yg ? "(gap)" : "", (int)fc->has_bias);
}

static const int nchw[4] = {0, 1, 2, 3}, nhwc[4] = {0, 2, 3, 1}, odd[4] = {1, 0, 3, 2};

static void make_conv(struct cpu_test_layer * fc, bool small) {
    memset(fc, 0, sizeof *fc);
    fc->q = pick_q();
    static const int64_t cs[] = {1, 3, 8, 13, 32, 64, 65, 130};
    struct bie_conv2d_desc * d = &fc->cd;
    d->quant = fc->q;
    d->in_channels = small ? test_rand_int(1, 9) : test_pick(cs, 8);
    d->out_channels = test_rand_int(0, 3) ? test_rand_int(1, 40) : 64;
    static const int ks[] = {1, 1, 2, 3, 3, 5};
    int64_t N, H, W, OH, OW;
    cpu_test_conv_geometry(d, ks, 6, 13, &N, &H, &W, &OH, &OW);
    const enum bie_dtype xd = pick_x(fc->q), wd = pick_w(fc->q), yd = pick_y(fc->q);
    const int lx = (int)test_rand_int(0, 4), lw = (int)test_rand_int(0, 4), ly = (int)test_rand_int(0, 4);
    // x: NCHW, channels-last (B1 x is channels-last when fast), odd; weight: OIHW / OHWI / odd.
    const int * ox = lx == 0 ? odd : (xd == BIE_DTYPE_B1 || lx >= 3) ? nhwc : nchw;
    const int * ow_ = lw == 0 ? odd : (wd == BIE_DTYPE_B1 || wd == BIE_DTYPE_S4) ? nhwc : lw >= 3 ? nhwc : nchw;
    const int * oy = ly == 0 ? odd : (yd == BIE_DTYPE_B1 || ly >= 3) ? nhwc : nchw;
    const int64_t xs[4] = {N, d->in_channels, H, W};
    const int64_t wsh[4] = {d->out_channels, d->in_channels, d->kernel[0], d->kernel[1]};
    const int64_t ysh[4] = {N, d->out_channels, OH, OW};
    fc->conv = true;
    fc->x = cpu_test_view4(xd, xs, ox);
    fc->w = cpu_test_view4(wd, wsh, ow_);
    fc->y = cpu_test_view4(yd, ysh, oy);
    make_common(fc);
    snprintf(fc->what, sizeof fc->what,
             "conv q%d N=%lld C=%lld H=%lld W=%lld O=%lld k=%dx%d s=%dx%d p=%dx%d d=%dx%d pad=%d "
             "x %s/%d w %s/%d y %s/%d bias %d",
             (int)fc->q, (long long)N, (long long)d->in_channels, (long long)H, (long long)W,
             (long long)d->out_channels, d->kernel[0], d->kernel[1], d->stride[0], d->stride[1], d->padding[0],
             d->padding[1], d->dilation[0], d->dilation[1], (int)d->pad_value, bie_dtype_name(xd), lx,
             bie_dtype_name(wd), lw, bie_dtype_name(yd), ly, (int)fc->has_bias);
}

// 8-bit layers whose I8 weight the int16 outer tile reads in place (at least 64 rows, K a multiple
// of 32, contiguous code rows; with a gap after every row half the time, which is still in place):
// K within one block of 512 codes, across blocks and with a short last block; N around the
// 32-column block (fewer columns than a block: zero rows). Convs: OHWI I8 weights with C*kh*kw a
// multiple of 32, and one OIHW case (not in place: packed rows). Every fourth linear case has more
// than 4 m-tiles of 256 rows (the tasks pack their own activation panels at 2 threads too; at 1
// thread from 2 m-tiles), and every eighth one is 4-bit (the byte outer tile).
static void make_outer(struct cpu_test_layer * fc, int i) {
    static const int64_t ks[] = {32, 64, 512, 544, 1024, 1056, 2080};
    static const int64_t ns[] = {1, 7, 31, 32, 33, 64, 65, 100};
    memset(fc, 0, sizeof *fc);
    fc->q = i % 8 == 5 ? BIE_QUANT_INT4 : BIE_QUANT_INT8;
    const enum bie_dtype yd = pick_y(fc->q);
    if (i % 4 != 3) {
        const int64_t M = i % 4 == 1 ? test_rand_int(1025, 1200) : test_rand_int(64, 300);
        const int64_t K = test_pick(ks, 7), N = test_pick(ns, 8);
        const bool xg = test_rand_int(0, 1), wg = test_rand_int(0, 1);
        fc->lin = (struct bie_linear_desc){.quant = fc->q, .in_features = K, .out_features = N};
        fc->x = cpu_test_view2(BIE_DTYPE_F32, M, K, xg);
        fc->w = cpu_test_view2(fc->q == BIE_QUANT_INT4 ? BIE_DTYPE_S4 : BIE_DTYPE_I8, N, K, wg);
        fc->y = cpu_test_view2(yd, M, N, false);
        snprintf(fc->what, sizeof fc->what, "outer-tile linear q%d M=%lld K=%lld N=%lld x gap %d w gap %d y %s",
                 (int)fc->q, (long long)M, (long long)K, (long long)N, (int)xg, (int)wg, bie_dtype_name(yd));
    } else {
        static const int64_t cs[] = {32, 64, 96};
        struct bie_conv2d_desc * d = &fc->cd;
        const int k = (int)test_rand_int(1, 3);
        *d = (struct bie_conv2d_desc){.quant = fc->q,
                                      .in_channels = test_pick(cs, 3),
                                      .out_channels = test_pick(ns, 8),
                                      .kernel = {k, k},
                                      .stride = {1, 1},
                                      .padding = {k / 2, k / 2},
                                      .dilation = {1, 1},
                                      .groups = 1};
        const int64_t N = test_rand_int(1, 2), H = test_rand_int(8, 12), W = test_rand_int(8, 12);
        int64_t OH, OW;
        bie_conv2d_output_size(d, H, W, &OH, &OW);
        const int64_t xs[4] = {N, d->in_channels, H, W}, wsh[4] = {d->out_channels, d->in_channels, k, k};
        const int64_t ysh[4] = {N, d->out_channels, OH, OW};
        const bool ohwi = test_rand_int(0, 3) != 0;
        fc->conv = true;
        fc->x = cpu_test_view4(BIE_DTYPE_F32, xs, nhwc);
        fc->w = cpu_test_view4(BIE_DTYPE_I8, wsh, ohwi ? nhwc : nchw);
        fc->y = cpu_test_view4(yd, ysh, nchw);
        snprintf(fc->what, sizeof fc->what, "outer-tile conv N=%lld C=%lld H=%lld W=%lld O=%lld k=%d w %s y %s",
                 (long long)N, (long long)d->in_channels, (long long)H, (long long)W, (long long)d->out_channels, k,
                 ohwi ? "OHWI" : "OIHW", bie_dtype_name(yd));
    }
    make_common(fc);
}

static void free_case(struct cpu_test_layer * fc) {
    test_tensor_free(&fc->x);
    test_tensor_free(&fc->w);
    test_tensor_free(&fc->y);
    test_tensor_free(&fc->sa);
    test_tensor_free(&fc->sw);
    if (fc->has_bias) test_tensor_free(&fc->bias);
}

static void check_case(struct cpu_test_layer * fc, bie_context_t * ref, bie_context_t ** cpu, int nlev,
                       bie_context_t * cpu1) {
    struct bie_tensor yr = cpu_test_clone(&fc->y);
    const enum bie_status sr = cpu_test_layer_forward(ref, fc, &yr);
    CHECK(sr == BIE_STATUS_OK, "ref: %s (%s clamp %g)", bie_context_last_error(ref), fc->what, (double)fc->clamp);
    const size_t nb = cpu_test_nbytes(&fc->y);
    for (int l = 0; l < nlev + 1; l++) {
        bie_context_t * ctx = l < nlev ? cpu[l] : cpu1;
        struct bie_tensor yc = cpu_test_clone(&fc->y);
        const enum bie_status sc = cpu_test_layer_forward(ctx, fc, &yc);
        CHECK(sc == BIE_STATUS_OK, "cpu: %s (%s clamp %g)", bie_context_last_error(ctx), fc->what, (double)fc->clamp);
        size_t first = nb;
        for (size_t i = 0; i < nb && first == nb; i++)
            if (((uint8_t *)yc.data)[i] != ((uint8_t *)yr.data)[i]) first = i;
        CHECK(first == nb, "isa %s threads %d: first differing byte %zu of %zu (%s clamp %g)",
              bie_cpu_isa_name(bie_context_cpu_isa(ctx)), l < nlev ? 2 : 1, first, nb, fc->what, (double)fc->clamp);
        test_tensor_free(&yc);
    }
    test_tensor_free(&yr);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    struct cpu_test_ctxs c;
    cpu_test_ctxs_make(&c, 2);

    // Every K of the list at least once per quant, then random linear cases.
    for (int qi = 0; qi < 3; qi++)
        for (int ki = 0; ki < NK; ki++) {
            struct cpu_test_layer fc;
            make_linear(&fc, qi == 0 ? BIE_QUANT_BINARY : qi == 1 ? BIE_QUANT_INT4 : BIE_QUANT_INT8, k_list[ki]);
            check_case(&fc, c.ref, c.cpu, c.nlev, c.cpu1);
            free_case(&fc);
        }
    const int nlin = c.quick ? 20 : 400, nconv = c.quick ? 30 : 600;
    for (int i = 0; i < nlin; i++) {
        struct cpu_test_layer fc;
        make_linear(&fc, 0, 0);
        check_case(&fc, c.ref, c.cpu, c.nlev, c.cpu1);
        free_case(&fc);
    }
    for (int i = 0; i < nconv; i++) {
        struct cpu_test_layer fc;
        make_conv(&fc, i % 3 == 0);
        check_case(&fc, c.ref, c.cpu, c.nlev, c.cpu1);
        free_case(&fc);
    }
    for (int i = 0; i < (c.quick ? 8 : 40); i++) {
        struct cpu_test_layer fc;
        make_outer(&fc, i);
        check_case(&fc, c.ref, c.cpu, c.nlev, c.cpu1);
        free_case(&fc);
    }
    cpu_test_ctxs_free(&c);
    return test_finish("test-cpu-forward");
}
