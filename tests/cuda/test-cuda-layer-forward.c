// SPDX-License-Identifier: Apache-2.0
// test-cuda-layer-forward.c: every layer forward (binary, 4-bit, 8-bit; linear and conv2d) on CUDA
// tensors against the plain-C reference on host copies of the same operands (cuda-layer-case.h
// makes the random cases): bit-identical y of every dtype (f32/f16/bf16 = (float)acc*(sa*sw)
// rounded RNE, I32, B1) over the whole byte span of y, so untouched gaps and padding bits must
// match too (y is poisoned identically on both sides first). A failure prints the seed and the case.
#include "cuda-layer-case.h"

static void test_forward(const struct lcase * c) {
    struct operands o;
    make_operands(c, &o);
    struct bie_tensor y_ref = make_out(c, c->ydt), y_cu = y_ref; // one view, two buffers
    fill_poison(&y_ref);
    y_cu.data = malloc(tensor_span(&y_ref) + 64);
    memcpy(y_cu.data, y_ref.data, tensor_span(&y_ref));
    struct bie_tensor dy = cuda_mirror(&y_cu);
    struct bie_forward_args ar = {
        .x = &o.x, .bias_a = c->bias ? &o.bias : NULL, .weight = &o.w, .scale_a = &o.sa, .scale_w = &o.sw, .y = &y_ref};
    struct bie_forward_args ac = {.x = &o.dx,
                                  .bias_a = c->bias ? &o.dbias : NULL,
                                  .weight = &o.dw,
                                  .scale_a = &o.dsa,
                                  .scale_w = &o.dsw,
                                  .y = &dy};
    // The output epilogue on a float y (bits 0-4 of terms: out_mul, out_add, residual, out_bits,
    // out_bits_bias), each term in about half of the cases; out_bits poisoned alike on both sides.
    const int64_t O = c->O;
    struct bie_tensor mul = test_tensor(BIE_DTYPE_F32, 1, &O, NULL), add = test_tensor(BIE_DTYPE_F32, 1, &O, NULL);
    struct bie_tensor res = make_out(c, c->ydt);
    test_fill_uniform(&mul, -2.0f, 2.0f);
    test_fill_uniform(&add, -3.0f, 3.0f);
    test_fill_uniform(&res, -4.0f, 4.0f);
    struct bie_tensor bb = test_tensor(BIE_DTYPE_F32, 1, &O, NULL), bits_ref = make_out(c, BIE_DTYPE_B1);
    test_fill_uniform(&bb, -4.0f, 4.0f);
    fill_poison(&bits_ref);
    struct bie_tensor bits_cu = bits_ref;
    bits_cu.data = malloc(tensor_span(&bits_ref) + 64);
    memcpy(bits_cu.data, bits_ref.data, tensor_span(&bits_ref));
    struct bie_tensor dmul = cuda_mirror(&mul), dadd = cuda_mirror(&add), dres = cuda_mirror(&res);
    struct bie_tensor dbb = cuda_mirror(&bb), dbits = cuda_mirror(&bits_cu);
    ar.x_clamp = ac.x_clamp = c->clamp;
    int terms = c->terms ? c->terms : bie_dtype_is_float(c->ydt) ? (int)test_rand_int(0, 31) : 0;
    if ((terms & 24) == 16) terms |= 8;
    if (terms & 8) ar.out_bits = &bits_ref, ac.out_bits = &dbits;
    if (terms & 16) ar.out_bits_bias = &bb, ac.out_bits_bias = &dbb;
    if (terms & 1) ar.out_mul = &mul, ac.out_mul = &dmul;
    if (terms & 2) ar.out_add = &add, ac.out_add = &dadd;
    if (terms & 4) ar.residual = &res, ac.residual = &dres;
    if (c->terms) { // the route names the epilogue
        bie_plan_t * p = NULL;
        CHECK_OK(cu_ctx, c->conv ? bie_plan_conv2d_forward(cu_ctx, &c->cd, &ac, &p)
                                 : bie_plan_linear_forward(cu_ctx, &c->ld, &ac, &p));
        CHECK(p && strstr(bie_plan_describe(p), "output epilogue"), "route \"%s\" on %s", bie_plan_describe(p),
              c->text);
        bie_plan_destroy(p);
    }
    enum bie_status sr = forward(ref_ctx, c, &ar);
    enum bie_status sc = forward(cu_ctx, c, &ac);
    CHECK(sr == BIE_STATUS_OK, "reference forward failed (%s) on %s epilogue=%d", bie_context_last_error(ref_ctx),
          c->text, terms);
    CHECK(sc == BIE_STATUS_OK, "cuda forward failed (%s) on %s epilogue=%d", bie_context_last_error(cu_ctx), c->text,
          terms);
    if (sr == BIE_STATUS_OK && sc == BIE_STATUS_OK) {
        CHECK(bie_context_cuda_synchronize(cu_ctx) == BIE_STATUS_OK, "sync: %s", bie_context_last_error(cu_ctx));
        cuda_fetch(&y_cu, &dy);
        const int same = memcmp(y_cu.data, y_ref.data, tensor_span(&y_ref)) == 0;
        char where[512] = "";
        const long long bad = same ? 0 : (long long)count_mismatch(&y_cu, &y_ref, where, sizeof where);
        CHECK(same, "forward y differs from the reference (%lld of %lld elements; %s) on %s epilogue=%d", bad,
              (long long)bie_tensor_numel(&y_ref), where, c->text, terms);
        cuda_fetch(&bits_cu, &dbits);
        CHECK(memcmp(bits_cu.data, bits_ref.data, tensor_span(&bits_ref)) == 0,
              "out_bits differ from the reference on %s epilogue=%d", c->text, terms);
    }
    cuda_tensor_free(&dbb);
    cuda_tensor_free(&dbits);
    test_tensor_free(&bb);
    test_tensor_free(&bits_ref);
    test_tensor_free(&bits_cu);
    cuda_tensor_free(&dmul);
    cuda_tensor_free(&dadd);
    cuda_tensor_free(&dres);
    test_tensor_free(&mul);
    test_tensor_free(&add);
    test_tensor_free(&res);
    cuda_tensor_free(&dy);
    test_tensor_free(&y_ref);
    test_tensor_free(&y_cu);
    free_operands(c, &o);
}

// Every output kind of the tiled GEMMs in one process, in an order that once exposed two kernel
// variants sharing a shared-memory-limit slot: tile widths 64 and 128 (O = 48, 100, 296; rows of
// 96, 200 and 592 bytes in f16, so both the bulk-store and the row-store epilogues run),
// each pad value (zero padding adds the border correction) and each y dtype, on a binary conv of
// 288 output rows (x NCHW or channels-last, 64 channels), then the same through the n-bit path.
static void test_all_outputs(void) {
    static const enum bie_dtype ydts[5] = {BIE_DTYPE_B1, BIE_DTYPE_I32, BIE_DTYPE_F16, BIE_DTYPE_BF16, BIE_DTYPE_F32};
    static const int64_t os[3] = {48, 100, 296};
    for (int q = 0; q < 2; q++)
        for (int oi = 0; oi < 3; oi++)
            for (int pv = 0; pv < (q ? 1 : 3); pv++)
                for (int yi = q; yi < 5; yi++) {
                    struct lcase c;
                    random_case(&c, 2);
                    c.quant = c.cd.quant = q ? BIE_QUANT_INT8 : BIE_QUANT_BINARY;
                    c.batch = 2;
                    c.C = c.cd.in_channels = 64; // whole words of channels: the pixel packers
                    c.xkind = (int)test_rand_int(0, 1);
                    c.H = c.W = 12;
                    c.O = c.cd.out_channels = os[oi];
                    square_kernel(&c, 3);
                    c.cd.pad_value = (enum bie_pad_value)pv;
                    c.ydt = ydts[yi];
                    c.ykind = 1; // channels-last: the fast epilogue
                    c.wdt = BIE_DTYPE_F32;
                    if (c.xdt == BIE_DTYPE_B1 && q) c.xdt = BIE_DTYPE_F32;
                    describe(&c);
                    test_forward(&c);
                }
}

// The caller's stream is used, and the status of a bad device pointer is a DEVICE_ERROR, not a crash.
static void test_stream(void) {
    cudaStream_t s;
    CUDA_OK(cudaStreamCreate(&s));
    CHECK_OK(cu_ctx, bie_context_set_cuda_stream(cu_ctx, s));
    CHECK(bie_context_cuda_stream(cu_ctx) == (void *)s, "stream getter returns the stream set");
    struct lcase c;
    random_case(&c, 0);
    test_forward(&c);
    CHECK_OK(cu_ctx, bie_context_set_cuda_stream(cu_ctx, NULL));
    CUDA_OK(cudaStreamDestroy(s));
}

// count random cases of random_case(&c, big), forward only.
static void forward_cases(int count, int big) {
    for (int i = 0; i < count; i++) {
        struct lcase c;
        random_case(&c, big);
        test_forward(&c);
    }
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    cuda_test_require_gpu("test-cuda-layer-forward");
    cuda_test_contexts(&ref_ctx, &cu_ctx);
    const int n = cuda_test_quick() ? 20 : 150;
    forward_cases(n, 0);
    forward_cases(cuda_test_quick() ? 2 : 8, 8);  // n-bit linear, long rows
    forward_cases(cuda_test_quick() ? 0 : 4, 1);  // the widest tiles
    forward_cases(cuda_test_quick() ? 1 : 6, 4);  // large binary GEMMs
    forward_cases(cuda_test_quick() ? 1 : 6, 5);  // binary, 256-column tiles
    forward_cases(cuda_test_quick() ? 1 : 2, 7);  // the same with K of 5 or 6 stages
    forward_cases(cuda_test_quick() ? 1 : 2, 6);  // binary convs gathered in 256-column tiles
    forward_cases(cuda_test_quick() ? 6 : 40, 9); // ResNet block convs with an output epilogue
    for (int i = 0; i < 8; i++) { // 4-bit and 8-bit ResNet block convs (channels-last f16 / bf16 pixel codes), most
                                  // behind a clamp of x (a Hardtanh folded into the call)
        struct lcase c;
        random_case(&c, 9);
        c.quant = c.cd.quant = c.ld.quant = i % 2 ? BIE_QUANT_INT8 : BIE_QUANT_INT4;
        if (c.wdt == BIE_DTYPE_B1) c.wdt = c.quant == BIE_QUANT_INT4 ? BIE_DTYPE_S4 : BIE_DTYPE_I8;
        c.xdt = i < 4 ? BIE_DTYPE_F16 : BIE_DTYPE_BF16;
        c.clamp = i % 4 == 3 ? 0.0f : c.sa * test_rand_float(0.5f, 4.0f);
        describe(&c);
        test_forward(&c);
    }
    for (int i = 0; i < 12; i++) { // binary layers whose x and bias_a hold special values and ties (fill_specials),
        // without a clamp (the packers' sign thresholds) and with one: long linear rows (M > 32: rows packed with
        // their popcounts, a warp a row), and channels-last conv pixels packed 32 to a row (2*H*W a multiple of 32)
        struct lcase c;
        do random_case(&c, i % 2 ? 0 : 6);
        while (c.quant != BIE_QUANT_BINARY || c.xdt == BIE_DTYPE_B1);
        if (i % 2) {
            c.conv = 0;
            c.lead2 = 0;
            c.batch = test_rand_int(33, 130);
            c.C = c.ld.in_features = i % 4 == 1 ? 8 * test_rand_int(256, 600) : test_rand_int(2048, 4800);
            c.O = c.ld.out_features = test_rand_int(1, 70);
        } else {
            c.C = c.cd.in_channels = 64 * test_rand_int(1, 4);
            c.H = c.W = 4 * test_rand_int(10, 12);
            c.O = c.cd.out_channels = test_rand_int(1, 64);
            c.xkind = 1;
            c.cd.pad_value = BIE_PAD_ZERO;
        }
        c.bias = 1;
        c.clamp = i % 3 == 2 ? c.sa * test_rand_float(0.5f, 2.0f) : 0.0f;
        c.specials = 1;
        if (c.ydt == BIE_DTYPE_B1) c.ydt = BIE_DTYPE_I32;
        describe(&c);
        test_forward(&c);
    }
    forward_cases(cuda_test_quick() ? 2 : 10, 2); // larger convolutions
    forward_cases(cuda_test_quick() ? 3 : 36, 3); // binary convs, C % 32 == 0
    for (int i = 0; i < 2; i++) {                 // zero-padded binary conv, B1 weight read in place (K = 1024 bits)
        struct lcase c;
        random_case(&c, 3);
        c.C = c.cd.in_channels = 256;
        for (int d = 0; d < 2; d++) {
            c.cd.kernel[d] = 2;
            c.cd.padding[d] = 1;
        }
        c.cd.pad_value = BIE_PAD_ZERO;
        c.wdt = BIE_DTYPE_B1;
        describe(&c);
        test_forward(&c);
    }
    for (int i = 0; i < 3; i++) { // a binary linear layer's B1 weight of one row broadcast (stride 0), K % 8 == 0
        struct lcase c;
        do random_case(&c, 0);
        while (c.conv || c.quant != BIE_QUANT_BINARY);
        c.C = c.ld.in_features = 8 * test_rand_int(1, 40);
        c.wdt = BIE_DTYPE_B1;
        c.wpad = -1;
        describe(&c);
        test_forward(&c);
    }
    for (int i = 0; i < 5; i++) { // gathered rows (tiles of 64, 128 or 256 columns as O falls), a B1 weight
        // copied by weight_terms (C = 128: 1152-bit rows, dense or 1216 bits apart; C = 64; C = 96
        // with rows 896 bits apart), -1 and zero padding
        struct lcase c;
        random_case(&c, 3);
        c.batch = 2;
        c.C = c.cd.in_channels = i < 3 ? 128 : i == 3 ? 64 : 96;
        c.ld.in_features = c.C; // (as random_case keeps them)
        c.H = c.W = 12;
        square_kernel(&c, 3);
        c.cd.pad_value = i % 2 ? BIE_PAD_ZERO : BIE_PAD_MINUS_ONE;
        c.wdt = BIE_DTYPE_B1;
        c.wpad = i == 2 ? 64 : i == 4 ? 32 : 0;
        describe(&c);
        test_forward(&c);
    }
    { // zero padding with a 111 x 111 kernel: 12321 taps, 394,272 bits of K
        struct lcase c;
        random_case(&c, 3);
        c.batch = 1;
        c.C = c.cd.in_channels = 32;
        c.O = c.cd.out_channels = test_rand_int(1, 20);
        c.ld.in_features = c.C; // (as random_case keeps them)
        c.ld.out_features = c.O;
        c.H = c.W = 111;
        square_kernel(&c, 111);
        c.cd.pad_value = BIE_PAD_ZERO;
        describe(&c);
        test_forward(&c);
    }
    test_all_outputs();
    for (int i = 0; i < 6; i++) { // few rows (the split-K GEMM) with a B1 y that it packs itself: linear layers,
                                  // then a one-sample conv of 5 x 5 output pixels (channels-last y)
        struct lcase c;
        do random_case(&c, 0);
        while (c.conv != (i >= 3));
        c.quant = c.cd.quant = c.ld.quant = BIE_QUANT_BINARY;
        if (c.wdt == BIE_DTYPE_S4) c.wdt = BIE_DTYPE_B1;
        c.batch = c.conv ? 1 : test_rand_int(1, 32);
        c.lead2 = 0;
        c.O = c.cd.out_channels = c.ld.out_features = 8 * test_rand_int(1, 40);
        c.ydt = BIE_DTYPE_B1;
        if (c.conv) {
            c.H = c.W = 5;
            square_kernel(&c, 3);
            c.cd.pad_value = BIE_PAD_MINUS_ONE;
            c.ykind = 1;
        }
        describe(&c);
        test_forward(&c);
    }
    test_stream();
    bie_context_destroy(ref_ctx);
    bie_context_destroy(cu_ctx);
    return test_finish("test-cuda-layer-forward");
}
