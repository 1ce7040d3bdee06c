// SPDX-License-Identifier: Apache-2.0
// test-embedding.c: the embedding lookup from packed tables and its sparse backward
// (bie_embedding_*): the CPU backend against the reference on random tables (b1 / s4 / i8 /
// float, rows byte-aligned, gapped or packed back to back), indices (i32 / i64, 1-3 dims, bags),
// per-row scales (some zero) and output layouts; a case worked by hand; and every bad argument.
//   forward: identical to the reference element by element (scale * code in f32, a bag summed in
//            f32 in index order, one rounding to out's dtype);
//   backward: grad_rows[u, d] sums n = (lookups of slot u) terms |grad_out * scale| <= smax, in f32
//            in index order on the CPU, in double in the reference: tol = (n+1)*2^-24*n*smax plus
//            one rounding of the dtype; rows no lookup reaches are exactly 0.
#include "test-cpu-common.h"
#include "op-cases.h"

// A binary table of 3 rows of 10 bits, scales [0.5, 2, 0]:
//   row 0 bits 1,0,0,0,0,0,0,0, 1,1 -> values 0.5*[+1,-1,-1,-1,-1,-1,-1,-1,+1,+1]
//   row 1 all set                   -> 2*[+1 x 10];  row 2: scale 0 -> zeros
// indices [[1, 0], [2, 1]] as a bag: out[0] = row1 + row0, out[1] = row2 + row1.
static void check_by_hand(bie_context_t * ctx) {
    uint8_t tb[3][2] = {{0x01, 0x03}, {0xff, 0x03}, {0x00, 0x00}};
    float sc[3] = {0.5f, 2.0f, 0.0f}, out[2][10], gout[2][10], grows[2][10];
    int32_t ix[4] = {1, 0, 2, 1}, inv[4] = {0, 1, 1, 0}; // slots: row 1 -> 0, rows 0 and 2 -> 1 (a merged slot)
    struct bie_tensor t, s, i, o, g, iv, gr;
    bie_tensor_make(&t, tb, BIE_DTYPE_B1, 2, (int64_t[]){3, 10});
    bie_tensor_make(&s, sc, BIE_DTYPE_F32, 1, (int64_t[]){3});
    bie_tensor_make(&i, ix, BIE_DTYPE_I32, 2, (int64_t[]){2, 2});
    bie_tensor_make(&o, out, BIE_DTYPE_F32, 2, (int64_t[]){2, 10});
    const struct bie_embedding_desc d = {BIE_QUANT_BINARY, 1};
    const struct bie_embedding_args a = {&i, &t, &s, &o};
    CHECK_OK(ctx, bie_embedding_forward(ctx, &d, &a));
    for (int k = 0; k < 10; k++) {
        const float r0 = (k == 0 || k >= 8) ? 0.5f : -0.5f;
        CHECK(out[0][k] == 2.0f + r0 && out[1][k] == 2.0f, "by hand: out[.][%d] = %g, %g, want %g, 2", k, out[0][k],
              out[1][k], 2.0f + r0);
        gout[0][k] = (float)k;
        gout[1][k] = 1.0f;
    }
    bie_tensor_make(&g, gout, BIE_DTYPE_F32, 2, (int64_t[]){2, 10});
    bie_tensor_make(&iv, inv, BIE_DTYPE_I32, 2, (int64_t[]){2, 2});
    bie_tensor_make(&gr, grows, BIE_DTYPE_F32, 2, (int64_t[]){2, 10});
    const struct bie_embedding_backward_args b = {&i, &iv, &s, &g, &gr};
    CHECK_OK(ctx, bie_embedding_backward(ctx, &d, &b));
    // slot 0: row 1 read by bag 0 and bag 1, scale 2: 2*(k + 1); slot 1: row 0 (bag 0, scale 0.5)
    // and row 2 (bag 1, scale 0): 0.5*k
    for (int k = 0; k < 10; k++)
        CHECK(grows[0][k] == 2.0f * (float)(k + 1) && grows[1][k] == 0.5f * (float)k,
              "by hand: grad_rows[.][%d] = %g, %g, want %g, %g", k, grows[0][k], grows[1][k], 2.0 * (k + 1), 0.5 * k);
}

static void check_errors(bie_context_t * ctx) {
    uint8_t tb[16] = {0}; // (the s4 table [2, 16] spans 16 bytes)
    float sc[2] = {1, 1}, out[64], f[64] = {0};
    int32_t ix[3] = {0, 1, 2}, ok_ix[3] = {0, 1, 1};
    struct bie_tensor t, t4, tf, s, i, iok, o, o_bad, fidx, g, gr, gr_bad;
    bie_tensor_make(&t, tb, BIE_DTYPE_B1, 2, (int64_t[]){2, 16});
    bie_tensor_make(&t4, tb, BIE_DTYPE_S4, 2, (int64_t[]){2, 16});
    bie_tensor_make(&tf, f, BIE_DTYPE_F32, 2, (int64_t[]){2, 16});
    bie_tensor_make(&s, sc, BIE_DTYPE_F32, 1, (int64_t[]){2});
    bie_tensor_make(&i, ix, BIE_DTYPE_I32, 1, (int64_t[]){3});
    bie_tensor_make(&iok, ok_ix, BIE_DTYPE_I32, 1, (int64_t[]){3});
    bie_tensor_make(&o, out, BIE_DTYPE_F32, 2, (int64_t[]){3, 16});
    bie_tensor_make(&o_bad, out, BIE_DTYPE_F32, 2, (int64_t[]){3, 15});
    bie_tensor_make(&fidx, f, BIE_DTYPE_F32, 1, (int64_t[]){3});
    bie_tensor_make(&g, f, BIE_DTYPE_F32, 2, (int64_t[]){3, 16});
    bie_tensor_make(&gr, out, BIE_DTYPE_F32, 2, (int64_t[]){2, 16});
    bie_tensor_make(&gr_bad, out, BIE_DTYPE_F32, 2, (int64_t[]){3, 16});
    const struct bie_embedding_desc d = {BIE_QUANT_BINARY, 0}, d4 = {BIE_QUANT_INT4, 0}, d2 = {(enum bie_quant)2, 0};
    struct bie_embedding_args a;
#define EF(D, I, T, S, O) (a = (struct bie_embedding_args){I, T, S, O}, bie_embedding_forward(ctx, D, &a))
    TEST_EXPECT_STATUS(ctx, EF(&d, &i, &t, &s, &o), BIE_STATUS_INVALID_ARGUMENT, "indices"); // index 2 of 2 rows
    TEST_EXPECT_STATUS(ctx, EF(&d2, &iok, &t, &s, &o), BIE_STATUS_INVALID_ARGUMENT, "quant");
    TEST_EXPECT_STATUS(ctx, EF(NULL, &iok, &t, &s, &o), BIE_STATUS_INVALID_ARGUMENT, "desc");
    TEST_EXPECT_STATUS(ctx, EF(&d, NULL, &t, &s, &o), BIE_STATUS_INVALID_ARGUMENT, "indices");
    TEST_EXPECT_STATUS(ctx, EF(&d, &iok, NULL, &s, &o), BIE_STATUS_INVALID_ARGUMENT, "table");
    TEST_EXPECT_STATUS(ctx, EF(&d, &iok, &t, &s, NULL), BIE_STATUS_INVALID_ARGUMENT, "out");
    TEST_EXPECT_STATUS(ctx, EF(&d, &fidx, &t, &s, &o), BIE_STATUS_INVALID_ARGUMENT, "indices");
    TEST_EXPECT_STATUS(ctx, EF(&d, &iok, &t4, &s, &o), BIE_STATUS_INVALID_ARGUMENT, "table");
    TEST_EXPECT_STATUS(ctx, EF(&d4, &iok, &t, &s, &o), BIE_STATUS_INVALID_ARGUMENT, "table");
    TEST_EXPECT_STATUS(ctx, EF(&d4, &iok, &tf, NULL, &o), BIE_STATUS_INVALID_ARGUMENT, "scale");
    TEST_EXPECT_STATUS(ctx, EF(&d, &iok, &t, &o, &o), BIE_STATUS_INVALID_ARGUMENT, "scale");
    TEST_EXPECT_STATUS(ctx, EF(&d, &iok, &t, &s, &o_bad), BIE_STATUS_INVALID_ARGUMENT, "out");
    TEST_EXPECT_STATUS(ctx, EF(&d, &iok, &t, &s, &fidx), BIE_STATUS_INVALID_ARGUMENT, "out");
    CHECK_OK(ctx, EF(&d, &iok, &t, &s, &o));
    CHECK_OK(ctx, EF(&d4, &iok, &t4, NULL, &o));
#undef EF
    struct bie_embedding_backward_args b = {&iok, NULL, &s, &g, &gr_bad};
    TEST_EXPECT_STATUS(ctx, bie_embedding_backward(ctx, &d, &b), BIE_STATUS_INVALID_ARGUMENT, "grad_rows");
    b.grad_rows = &gr;
    b.grad_out = &o_bad;
    TEST_EXPECT_STATUS(ctx, bie_embedding_backward(ctx, &d, &b), BIE_STATUS_INVALID_ARGUMENT, "grad_out");
    b.grad_out = &g;
    b.inverse = &i; // slot 2 of 2 rows
    TEST_EXPECT_STATUS(ctx, bie_embedding_backward(ctx, &d, &b), BIE_STATUS_INVALID_ARGUMENT, "inverse");
    b.inverse = &o;
    TEST_EXPECT_STATUS(ctx, bie_embedding_backward(ctx, &d, &b), BIE_STATUS_INVALID_ARGUMENT, "inverse");
    b.inverse = NULL;
    b.indices = &i;
    TEST_EXPECT_STATUS(ctx, bie_embedding_backward(ctx, &d, &b), BIE_STATUS_INVALID_ARGUMENT, "indices");
    b.indices = &iok;
    CHECK_OK(ctx, bie_embedding_backward(ctx, &d, &b));
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    bie_context_t * ref = cpu_test_ctx(BIE_BACKEND_REF, BIE_CPU_ISA_BEST, 1);
    bie_context_t * cpu = cpu_test_ctx(BIE_BACKEND_CPU, BIE_CPU_ISA_BEST, (int)test_rand_int(1, 3));
    check_by_hand(ref);
    check_by_hand(cpu);
    check_errors(ref);
    check_errors(cpu);
    const int iters = cpu_test_quick() ? 60 : 300;
    for (int i = 0; i < iters; i++) embedding_check_case(ref, cpu, "cpu", &op_host);
    bie_context_destroy(ref);
    bie_context_destroy(cpu);
    return test_finish("test-embedding");
}
