// SPDX-License-Identifier: Apache-2.0
// test-wq.c: the weight-only n-bit layer (bie.h "weight-only n-bit linear layers").
//   - the packed layout against an independent packer written from the definition (a column's codes
//     as one LSB-first bit stream; mixed groups word-aligned), and GPTQ's own 3-bit packing pattern;
//   - bie_wq_pack / bie_wq_unpack round trips; bie_wq_quantize (RTN) against its equations;
//   - forward, backward (grad_x, grad_w) and dequantize of every CPU ISA level (and the int8
//     activation path) against the reference on random odd shapes, all zero forms, group sizes,
//     bit widths (mixed too), act-order permutations, channel scales, bias and f32/f16/bf16 tensors,
//     within tolerances derived from the terms of each sum;
//   - errors: bad descriptors, shapes, dtypes, permutations, group bits.
#include "test-wq.h"

static const char * ctx_name(int i) {
    static const char * names[] = {"avx2", "avx512", "best", "best+int8"};
    return names[i];
}

static void check_forward(bie_context_t * ref, bie_context_t ** cpu, struct layer * L) {
    const int64_t M = L->M, K = L->d.in_features, N = L->d.out_features;
    struct bie_tensor x = test_tensor_rows(pick_float(), 2, (int64_t[]){M, K}, (int)test_rand_int(0, 2));
    test_fill_uniform(&x, -1.0f, 1.0f);
    const enum bie_dtype yd = pick_float();
    struct bie_tensor yr = test_tensor(yd, 2, (int64_t[]){M, N}, NULL), y = test_tensor(yd, 2, (int64_t[]){M, N}, NULL);
    CHECK_OK(ref, bie_wq_linear_forward(ref, &L->d, &L->w, &x, &yr));
    for (int ci = 0; ci < 4; ci++) {
        struct bie_wq_desc d = L->d;
        d.act = ci == 3 ? BIE_WQ_ACT_INT8 : BIE_WQ_ACT_FLOAT;
        const bool i8 =
            ci == 3 && M <= 16 && bie_cpu_isa_detected() >= BIE_CPU_ISA_AVX512 && __builtin_cpu_supports("avx512vnni");
        memset(y.data, 0xFF, (size_t)(M * N) * 4 / (yd == BIE_DTYPE_F32 ? 1 : 2));
        CHECK_OK(cpu[ci], bie_wq_linear_forward(cpu[ci], &d, &L->w, &x, &y));
        int bad = 0;
        for (int64_t m = 0; m < M && bad < 3; m++) {
            double amax[16] = {0}; // each 32-row block's max |x'|: the int8 path's scale * 127
            for (int64_t r = 0; r < K; r++) amax[r / 32] = fmax(amax[r / 32], fabs(xprime(L, &x, m, r)));
            for (int64_t n = 0; n < N && bad < 3; n++) {
                double B = 0.0, Bq = 0.0;
                for (int64_t r = 0; r < K; r++) {
                    const double wb = wbound(L, r, n), xv = fabs(xprime(L, &x, m, r));
                    B += xv * wb;
                    if (i8) Bq += wb * amax[r / 32] / 127.0 * 0.5001;
                }
                const double want = bie_load(&yr, m * N + n), got = bie_load(&y, m * N + n);
                const double tol = (double)(K + L->G + 8) * U32 * B + Bq + eps_of(yd) * (fabs(want) + 2.0 * Bq) + 1e-30;
                if (!(fabs(got - want) <= tol)) {
                    bad++;
                    CHECK(
                        false,
                        "%s forward M=%lld K=%lld N=%lld bits=%d gs=%d zero=%d: y[%lld,%lld] = %.9g, ref %.9g (tol %.3g)",
                        ctx_name(ci), (long long)M, (long long)K, (long long)N, L->d.bits, L->d.group_size,
                        (int)L->d.zero, (long long)m, (long long)n, got, want, tol);
                }
            }
        }
        CHECK(bad == 0, "%s forward: %d outputs off", ctx_name(ci), bad);
    }
    test_tensor_free(&x);
    test_tensor_free(&y);
    test_tensor_free(&yr);
}

static void check_backward(bie_context_t * ref, bie_context_t ** cpu, struct layer * L) {
    const int64_t M = L->M, K = L->d.in_features, N = L->d.out_features;
    struct bie_tensor x = test_tensor(pick_float(), 2, (int64_t[]){M, K}, NULL);
    struct bie_tensor g = test_tensor_rows(pick_float(), 2, (int64_t[]){M, N}, (int)test_rand_int(0, 2));
    test_fill_uniform(&x, -1.0f, 1.0f);
    test_fill_uniform(&g, -1.0f, 1.0f);
    const enum bie_dtype gd = pick_float();
    struct bie_tensor gxr = test_tensor(gd, 2, (int64_t[]){M, K}, NULL),
                      gx = test_tensor(gd, 2, (int64_t[]){M, K}, NULL);
    struct bie_tensor gwr = test_tensor(BIE_DTYPE_F32, 2, (int64_t[]){K, N}, NULL);
    struct bie_tensor gw = test_tensor(BIE_DTYPE_F32, 2, (int64_t[]){K, N}, NULL);
    CHECK_OK(ref, bie_wq_linear_backward(ref, &L->d, &L->w, &x, &g, &gxr, &gwr));
    for (int ci = 0; ci < 3; ci++) {
        CHECK_OK(cpu[ci], bie_wq_linear_backward(cpu[ci], &L->d, &L->w, &x, &g, &gx, &gw));
        int bad = 0;
        for (int64_t m = 0; m < M && bad < 3; m++)
            for (int64_t r = 0; r < K && bad < 3; r++) {
                const int64_t k = L->perm.data ? ((int32_t *)L->perm.data)[r] : r;
                const double csv = L->cs.data ? fabs(bie_load(&L->cs, k)) : 1.0;
                double B = 0.0;
                for (int64_t n = 0; n < N; n++)
                    B += fabs(bie_load(&g, m * g.stride[0] + n * g.stride[1])) * wbound(L, r, n);
                const double want = bie_load(&gxr, m * K + k), got = bie_load(&gx, m * K + k);
                const double tol = (double)(N + 8) * U32 * B * csv + eps_of(gd) * fabs(want) + 1e-30;
                if (!(fabs(got - want) <= tol)) {
                    bad++;
                    CHECK(false, "%s grad_x M=%lld K=%lld N=%lld bits=%d: [%lld,%lld] = %.9g, ref %.9g (tol %.3g)",
                          ctx_name(ci), (long long)M, (long long)K, (long long)N, L->d.bits, (long long)m, (long long)k,
                          got, want, tol);
                }
            }
        for (int64_t r = 0; r < K && bad < 6; r++)
            for (int64_t n = 0; n < N && bad < 6; n++) {
                double B = 0.0;
                for (int64_t m = 0; m < M; m++)
                    B += fabs(xprime(L, &x, m, r) * bie_load(&g, m * g.stride[0] + n * g.stride[1]));
                const double want = ((float *)gwr.data)[r * N + n], got = ((float *)gw.data)[r * N + n];
                if (!(fabs(got - want) <= (double)(M + 8) * U32 * B + 1e-30)) {
                    bad++;
                    CHECK(false, "%s grad_w M=%lld K=%lld N=%lld: [%lld,%lld] = %.9g, ref %.9g", ctx_name(ci),
                          (long long)M, (long long)K, (long long)N, (long long)r, (long long)n, got, want);
                }
            }
    }
    struct bie_tensor * ts[] = {&x, &g, &gxr, &gx, &gwr, &gw};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) test_tensor_free(ts[i]);
}

static void check_dequant_and_codes(bie_context_t * ref, bie_context_t ** cpu, struct layer * L) {
    const int64_t K = L->d.in_features, N = L->d.out_features;
    struct bie_tensor wr = test_tensor(BIE_DTYPE_F32, 2, (int64_t[]){K, N}, NULL),
                      w = test_tensor(BIE_DTYPE_F32, 2, (int64_t[]){K, N}, NULL);
    CHECK_OK(ref, bie_wq_dequantize(ref, &L->d, &L->w, &wr));
    for (int ci = 0; ci < 3; ci++) {
        CHECK_OK(cpu[ci], bie_wq_dequantize(cpu[ci], &L->d, &L->w, &w));
        int bad = 0;
        for (int64_t i = 0; i < K * N && bad < 3; i++) {
            const double a = ((float *)w.data)[i], b = ((float *)wr.data)[i];
            // one rounding apart at most (s*q - z may be fused into one FMA)
            if (!(fabs(a - b) <= 2.0 * U32 * wbound(L, i / N, i % N))) {
                bad++;
                CHECK(false, "%s dequantize K=%lld N=%lld bits=%d: [%lld] = %.9g, ref %.9g", ctx_name(ci), (long long)K,
                      (long long)N, L->d.bits, (long long)i, a, b);
            }
        }
    }
    // Codes: bie_wq_unpack reads back the codes; bie_wq_pack rebuilds the same words.
    struct bie_tensor codes = test_tensor(BIE_DTYPE_I32, 2, (int64_t[]){K, N}, NULL);
    struct bie_tensor qw = test_tensor(BIE_DTYPE_I32, 2, (int64_t[]){L->rows, N}, NULL);
    const struct bie_tensor * gb = L->d.bits ? NULL : &L->gbits;
    CHECK_OK(ref, bie_wq_unpack(ref, &L->d, gb, &L->qweight, &codes));
    CHECK(memcmp(codes.data, L->codes, (size_t)(K * N) * 4) == 0, "unpack K=%lld N=%lld bits=%d", (long long)K,
          (long long)N, L->d.bits);
    CHECK_OK(ref, bie_wq_pack(ref, &L->d, gb, &codes, &qw));
    CHECK(memcmp(qw.data, L->qweight.data, (size_t)(L->rows * N) * 4) == 0, "pack K=%lld N=%lld bits=%d", (long long)K,
          (long long)N, L->d.bits);
    test_tensor_free(&codes);
    test_tensor_free(&qw);
    test_tensor_free(&w);
    test_tensor_free(&wr);
}

// GPTQ's 3-bit packing, as its pack loop writes it: 10 codes, one split across words, 10, one split, 10.
static void check_gptq_3bit(bie_context_t * ctx) {
    const int64_t K = 64, N = 3;
    struct layer L;
    make_layer(&L, 1, K, N, 3, 64, BIE_WQ_ZERO_CODE, false, false, false);
    uint32_t want[6 * 3] = {0};
    for (int64_t n = 0; n < N; n++)
        for (int64_t blk = 0; blk < K / 32; blk++) {
            const int32_t * q = L.codes + blk * 32 * N + n;
            uint32_t * w = want + blk * 3 * N + n;
            int i = 0;
            for (int j = 0; j < 10; j++) w[0] |= (uint32_t)q[(i + j) * N] << (3 * j);
            i += 10;
            w[0] |= (uint32_t)q[i * N] << 30;
            w[N] |= ((uint32_t)q[i * N] >> 2) & 1;
            i++;
            for (int j = 0; j < 10; j++) w[N] |= (uint32_t)q[(i + j) * N] << (3 * j + 1);
            i += 10;
            w[N] |= (uint32_t)q[i * N] << 31;
            w[2 * N] |= ((uint32_t)q[i * N] >> 1) & 3;
            i++;
            for (int j = 0; j < 10; j++) w[2 * N] |= (uint32_t)q[(i + j) * N] << (3 * j + 2);
        }
    CHECK(L.rows == 6, "3-bit rows %lld", (long long)L.rows);
    CHECK(memcmp(want, L.qweight.data, sizeof want) == 0, "GPTQ 3-bit packing differs from the bit stream");
    struct bie_tensor codes = test_tensor(BIE_DTYPE_I32, 2, (int64_t[]){K, N}, NULL);
    memcpy(L.qweight.data, want, sizeof want);
    CHECK_OK(ctx, bie_wq_unpack(ctx, &L.d, NULL, &L.qweight, &codes));
    CHECK(memcmp(codes.data, L.codes, (size_t)(K * N) * 4) == 0, "GPTQ 3-bit codes");
    test_tensor_free(&codes);
    free_layer(&L);
}

// RTN: every code in range, zeros as the equations say, and |W - w| <= s/2 where w is in range.
static void check_quantize(bie_context_t * ctx) {
    for (int it = 0; it < 12; it++) {
        const int64_t K = test_rand_int(1, 200), N = test_rand_int(1, 40);
        const int64_t bl[] = {2, 3, 4, 8, 0}, gl[] = {32, 64, 128, 7, 100000};
        const int bits = (int)test_pick(bl, 5), gsz = (int)test_pick(gl, bits ? 5 : 3);
        const enum bie_wq_zero zero = (enum bie_wq_zero)test_rand_int(0, 2);
        struct layer L;
        make_layer(&L, 1, K, N, bits, gsz, zero, false, false, false);
        struct bie_tensor w = test_tensor(BIE_DTYPE_F32, 2, (int64_t[]){K, N}, NULL),
                          wq = test_tensor(BIE_DTYPE_F32, 2, (int64_t[]){K, N}, NULL);
        test_fill_uniform(&w, -0.3f, 0.3f);
        if (it == 0) memset(w.data, 0, (size_t)(K * N) * 4); // all-zero groups take [-1, 1]
        CHECK_OK(ctx, bie_wq_quantize(ctx, &L.d, &w, &L.w));
        CHECK_OK(ctx, bie_wq_dequantize(ctx, &L.d, &L.w, &wq));
        const int64_t gs = gsz < K ? gsz : K;
        int bad = 0;
        for (int64_t r = 0; r < K && bad < 3; r++)
            for (int64_t n = 0; n < N && bad < 3; n++) {
                const double s = bie_load(&L.scales, (r / gs) * N + n);
                const double err = fabs(((float *)wq.data)[r * N + n] - ((float *)w.data)[r * N + n]);
                // the rounding of s and z to their dtype moves the grid by up to 2^b times that rounding
                const double slack = s *
                                     (eps_of(L.scales.dtype) + eps_of(L.zeros.data ? L.zeros.dtype : BIE_DTYPE_F32)) *
                                     (double)(1 << L.bits[r / gs]);
                if (!(err <= 0.5 * s + slack + 1e-7)) {
                    bad++;
                    CHECK(false, "quantize K=%lld N=%lld bits=%d gs=%d zero=%d: [%lld,%lld] err %.3g > s/2 = %.3g",
                          (long long)K, (long long)N, bits, gsz, (int)zero, (long long)r, (long long)n, err, 0.5 * s);
                }
            }
        test_tensor_free(&w);
        test_tensor_free(&wq);
        free_layer(&L);
    }
}

static void check_errors(bie_context_t * ctx) {
    struct layer L;
    make_layer(&L, 2, 64, 8, 4, 32, BIE_WQ_ZERO_CODE, true, false, false);
    struct bie_tensor x = test_tensor(BIE_DTYPE_F32, 2, (int64_t[]){2, 64}, NULL),
                      y = test_tensor(BIE_DTYPE_F32, 2, (int64_t[]){2, 8}, NULL);
    struct bie_wq_desc d = L.d;
    d.bits = 9;
    TEST_EXPECT_STATUS(ctx, bie_wq_linear_forward(ctx, &d, &L.w, &x, &y), BIE_STATUS_INVALID_ARGUMENT, "bits");
    d = L.d;
    d.group_size = 0;
    TEST_EXPECT_STATUS(ctx, bie_wq_linear_forward(ctx, &d, &L.w, &x, &y), BIE_STATUS_INVALID_ARGUMENT, "group_size");
    d = L.d;
    d.zero = BIE_WQ_ZERO_SYM;
    TEST_EXPECT_STATUS(ctx, bie_wq_linear_forward(ctx, &d, &L.w, &x, &y), BIE_STATUS_INVALID_ARGUMENT, "zeros");
    d = L.d;
    d.in_features = 65;
    TEST_EXPECT_STATUS(ctx, bie_wq_linear_forward(ctx, &d, &L.w, &x, &y), BIE_STATUS_INVALID_ARGUMENT, "qweight");
    struct bie_wq_weight w = L.w;
    w.scales = NULL;
    TEST_EXPECT_STATUS(ctx, bie_wq_linear_forward(ctx, &L.d, &w, &x, &y), BIE_STATUS_INVALID_ARGUMENT, "scales");
    ((int32_t *)L.perm.data)[3] = ((int32_t *)L.perm.data)[4];
    TEST_EXPECT_STATUS(ctx, bie_wq_linear_forward(ctx, &L.d, &L.w, &x, &y), BIE_STATUS_INVALID_ARGUMENT, "perm");
    w = L.w;
    w.perm = NULL;
    struct bie_tensor y2 = test_tensor(BIE_DTYPE_F32, 2, (int64_t[]){3, 8}, NULL);
    TEST_EXPECT_STATUS(ctx, bie_wq_linear_forward(ctx, &L.d, &w, &x, &y2), BIE_STATUS_INVALID_ARGUMENT, "y");
    struct bie_tensor xi = x;
    xi.dtype = BIE_DTYPE_I32;
    TEST_EXPECT_STATUS(ctx, bie_wq_linear_forward(ctx, &L.d, &w, &xi, &y), BIE_STATUS_INVALID_ARGUMENT, "x");
    TEST_EXPECT_STATUS(ctx, bie_wq_linear_backward(ctx, &L.d, &w, NULL, &y, NULL, NULL), BIE_STATUS_INVALID_ARGUMENT,
                       "grad_x");
    // Mixed bits: group_size * bits must fill whole words.
    d = L.d;
    d.bits = 0;
    d.group_size = 4;
    struct bie_tensor gb = test_tensor(BIE_DTYPE_I32, 1, (int64_t[]){16}, NULL);
    for (int i = 0; i < 16; i++) ((int32_t *)gb.data)[i] = 3;
    w.group_bits = &gb;
    TEST_EXPECT_STATUS(ctx, bie_wq_linear_forward(ctx, &d, &w, &x, &y), BIE_STATUS_INVALID_ARGUMENT, "group_bits");
    // Codes outside [0, 2^b - 1] are refused by the packer.
    struct bie_tensor codes = test_tensor(BIE_DTYPE_I32, 2, (int64_t[]){64, 8}, NULL);
    ((int32_t *)codes.data)[5] = 16;
    TEST_EXPECT_STATUS(ctx, bie_wq_pack(ctx, &L.d, NULL, &codes, &L.qweight), BIE_STATUS_INVALID_ARGUMENT, "codes");
    struct bie_tensor * ts[] = {&x, &y, &y2, &gb, &codes};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) test_tensor_free(ts[i]);
    free_layer(&L);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    bie_context_t * ref = test_new_context(BIE_BACKEND_REF);
    struct bie_context_params p;
    bie_context_params_default(&p);
    bie_context_t * cpu[4];
    const enum bie_cpu_isa isas[4] = {BIE_CPU_ISA_AVX2, BIE_CPU_ISA_AVX512, BIE_CPU_ISA_BEST, BIE_CPU_ISA_BEST};
    for (int i = 0; i < 4; i++) {
        p.backend = BIE_BACKEND_CPU;
        p.max_isa = isas[i];
        p.num_threads = i == 1 ? 1 : 0;
        bie_context_create(&p, &cpu[i]);
    }
    check_gptq_3bit(ref);
    check_quantize(ref);
    check_errors(ref);
    const bool quick = getenv("BIE_TEST_QUICK") && strcmp(getenv("BIE_TEST_QUICK"), "0") != 0;
    const int iters = quick ? 30 : 120;
    for (int it = 0; it < iters; it++) {
        const int64_t ml[] = {1, 2, 3, 4, 5, 7, 16, 17, 33};
        const int64_t bl[] = {2, 3, 4, 8, 0, 4, 2, 1, 5, 6, 7};
        const int bits = (int)test_pick(bl, 11);
        const int64_t gl[] = {32, 64, 128, 100000, 7, 48};
        const int gsz = (int)test_pick(gl, bits ? 6 : 3);
        const int64_t K = it < 4 ? 32 * test_rand_int(1, 6) : test_rand_int(1, 300); // <= 16 blocks of 32
        // (every tenth layer wide: one-row tasks of many vectors, up to the widest and past it)
        const int64_t N = it % 10 == 9 ? test_rand_int(900, 2300) : test_rand_int(1, 90), M = test_pick(ml, 9);
        const enum bie_wq_zero zero = (enum bie_wq_zero)test_rand_int(0, 2);
        struct layer L;
        make_layer(&L, M, K, N, bits, gsz, zero, test_rand_int(0, 2) == 0, test_rand_int(0, 3) == 0,
                   test_rand_int(0, 1) == 0);
        check_forward(ref, cpu, &L);
        if (it % 3 == 0) check_backward(ref, cpu, &L);
        if (it % 2 == 0) check_dequant_and_codes(ref, cpu, &L);
        free_layer(&L);
    }
    bie_context_destroy(ref);
    for (int i = 0; i < 4; i++) bie_context_destroy(cpu[i]);
    return test_finish("test-wq");
}
