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

static const enum bie_dtype floats[3] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16};

struct ecase {
    enum bie_quant q;
    bool bag, has_scale, use_inverse;
    int64_t V, D, nd, ishape[3], U;
    enum bie_dtype td, id, od;
    int tlayout; // 0 dense rows, 1 gapped rows, 2 (b1/s4) rows packed back to back
    char what[256];
};

static void random_case(struct ecase * c) {
    static const enum bie_quant qs[3] = {BIE_QUANT_BINARY, BIE_QUANT_INT4, BIE_QUANT_INT8};
    static const int64_t ds[] = {1, 3, 7, 8, 9, 16, 31, 33, 64, 100, 129};
    memset(c, 0, sizeof *c);
    c->q = qs[test_rand_int(0, 2)];
    c->bag = test_rand_int(0, 3) == 0;
    c->V = test_rand_int(1, 40);
    c->D = test_pick(ds, 11);
    const int r = (int)test_rand_int(0, 3);
    if (c->q == BIE_QUANT_BINARY) c->td = r == 0 ? BIE_DTYPE_I8 : r == 1 ? floats[test_rand_int(0, 2)] : BIE_DTYPE_B1;
    else if (c->q == BIE_QUANT_INT4) c->td = r == 0 ? BIE_DTYPE_I8 : r == 1 ? floats[test_rand_int(0, 2)] : BIE_DTYPE_S4;
    else c->td = r <= 1 ? BIE_DTYPE_I8 : floats[test_rand_int(0, 2)];
    c->has_scale = bie_dtype_is_float(c->td) && c->q != BIE_QUANT_BINARY ? true : test_rand_int(0, 2) != 0;
    c->id = test_rand_int(0, 1) ? BIE_DTYPE_I64 : BIE_DTYPE_I32;
    c->od = floats[test_rand_int(0, 2)];
    c->nd = test_rand_int(1, 3);
    for (int i = 0; i < c->nd; i++) c->ishape[i] = test_rand_int(1, 6);
    c->tlayout = (int)test_rand_int(0, c->td == BIE_DTYPE_B1 || c->td == BIE_DTYPE_S4 ? 2 : 1);
    c->use_inverse = test_rand_int(0, 1);
    snprintf(c->what, sizeof c->what, "q%d bag %d V %lld D %lld table %s layout %d scale %d idx %s nd %d [%lld %lld %lld] out %s inv %d",
             (int)c->q, (int)c->bag, (long long)c->V, (long long)c->D, bie_dtype_name(c->td), c->tlayout, (int)c->has_scale,
             bie_dtype_name(c->id), (int)c->nd, (long long)c->ishape[0], (long long)(c->nd > 1 ? c->ishape[1] : 0),
             (long long)(c->nd > 2 ? c->ishape[2] : 0), bie_dtype_name(c->od), (int)c->use_inverse);
}

static struct bie_tensor make_table(const struct ecase * c) {
    const int64_t shape[2] = {c->V, c->D};
    struct bie_tensor t = test_tensor(c->td, 2, shape, NULL);
    if (c->tlayout != 0) {
        free(t.data);
        t.stride[0] = c->tlayout == 1 ? t.stride[0] + (c->td == BIE_DTYPE_B1 ? 8 : c->td == BIE_DTYPE_S4 ? 2 : 3) : c->D;
        t.data = calloc(1, (size_t)(c->V * t.stride[0] * bie_dtype_bits(c->td) + 7) / 8 + 64);
    }
    if (c->td == BIE_DTYPE_I8) test_fill_uniform(&t, -130, 130);
    else if (c->td == BIE_DTYPE_S4) test_fill_uniform(&t, -8, 8);
    else test_fill_uniform(&t, -1, 1);
    return t;
}

// out-shaped [lead..., D] float tensor, dense or with a gap after each row.
static struct bie_tensor make_out(const struct ecase * c, enum bie_dtype d, bool gap) {
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

static int64_t mismatches(const struct bie_tensor * a, const struct bie_tensor * b) {
    int64_t bad = 0, idx[BIE_MAX_DIMS] = {0};
    do {
        const double x = bie_load(a, bie_offset(a, idx)), y = bie_load(b, bie_offset(b, idx));
        if (!(x == y && signbit(x) == signbit(y)) && !(isnan(x) && isnan(y))) bad++;
    } while (bie_next_index(a, idx));
    return bad;
}

static double rel_round(enum bie_dtype d) { return d == BIE_DTYPE_BF16 ? 0x1p-8 : d == BIE_DTYPE_F16 ? 0x1p-11 : 0x1p-24; }

static void run_case(bie_context_t * ref, bie_context_t * cpu) {
    struct ecase c;
    random_case(&c);
    struct bie_tensor table = make_table(&c);
    struct bie_tensor idx = test_tensor(c.id, (int32_t)c.nd, c.ishape, NULL);
    int64_t n = bie_tensor_numel(&idx);
    // indices: a few rows only, so that rows repeat (and some are never read)
    const int64_t used = test_rand_int(1, c.V);
    for (int64_t i = 0; i < n; i++) bie_store(&idx, i, (double)test_rand_int(0, used - 1));
    struct bie_tensor scale = {0};
    float smax = 1.0f;
    if (c.has_scale) {
        scale = test_tensor(floats[test_rand_int(0, 2)], 1, &c.V, NULL);
        test_fill_uniform(&scale, 0.05f, 2.0f);
        if (test_rand_int(0, 2) == 0) bie_store(&scale, 0, 0.0); // a padding row
        smax = 2.0f;
    }
    const struct bie_embedding_desc d = {c.q, c.bag};
    struct bie_tensor o_ref = make_out(&c, c.od, false), o = make_out(&c, c.od, test_rand_int(0, 1));
    struct bie_embedding_args a = {&idx, &table, c.has_scale ? &scale : NULL, &o_ref};
    CHECK_OK(ref, bie_embedding_forward(ref, &d, &a));
    a.out = &o;
    CHECK_OK(cpu, bie_embedding_forward(cpu, &d, &a));
    const int64_t bad = mismatches(&o, &o_ref);
    CHECK(bad == 0, "forward: %lld elements differ from the reference: %s", (long long)bad, c.what);

    // backward: slots from the distinct rows (inverse), or the dense gradient
    struct bie_tensor g = make_out(&c, floats[test_rand_int(0, 2)], test_rand_int(0, 1));
    test_fill_uniform(&g, -1, 1);
    struct bie_tensor inv = {0};
    int64_t U = c.V, count[64] = {0};
    int64_t slot_of[64];
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
    for (size_t i = 0; i < cpu_test_nbytes(&gr); i++) ((uint8_t *)gr.data)[i] = 0x55;
    struct bie_embedding_backward_args b = {&idx, c.use_inverse ? &inv : NULL, c.has_scale ? &scale : NULL, &g, &gr_ref};
    CHECK_OK(ref, bie_embedding_backward(ref, &d, &b));
    b.grad_rows = &gr;
    CHECK_OK(cpu, bie_embedding_backward(cpu, &d, &b));
    for (int64_t u = 0; u < U; u++)
        for (int64_t k = 0; k < c.D; k++) {
            const double got = bie_load(&gr, u * gr.stride[0] + k), want = bie_load(&gr_ref, u * gr_ref.stride[0] + k);
            const double nt = (double)count[u];
            const double tol = (nt + 1) * 0x1p-24 * nt * smax + rel_round(gd) * fabs(want);
            CHECK(fabs(got - want) <= tol && (count[u] || got == 0.0), "backward: grad_rows[%lld, %lld] = %g, want %g (%lld lookups): %s",
                  (long long)u, (long long)k, got, want, (long long)count[u], c.what);
        }
    struct bie_tensor * all[] = {&table, &idx, &scale, &o_ref, &o, &g, &inv, &gr_ref, &gr};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) test_tensor_free(all[i]);
}

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
    uint8_t tb[8] = {0};
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
    for (int i = 0; i < iters; i++) run_case(ref, cpu);
    bie_context_destroy(ref);
    bie_context_destroy(cpu);
    return test_finish("test-embedding");
}
