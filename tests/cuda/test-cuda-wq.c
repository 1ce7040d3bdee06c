// SPDX-License-Identifier: Apache-2.0
// test-cuda-wq.c: the CUDA weight-only n-bit layer against the reference on the host: forward in its
// routes (the mma decode kernel: f16/bf16 x, 2/4/8 bits, M <= 32; the SIMT decode kernel: other
// bits, mixed bits, f32 x, odd N, M <= 16; dequantise + cuBLAS for the rest; passes of 32 rows through
// the mma kernel for M > 32, which only large weights take by default and BIE_CUDA_WQ=passes forces in a
// second context; and the mma kernel's x' from its own kernel, which only large calls take by
// default and BIE_CUDA_WQ=xs forces in a third), backward (grad_x, grad_w) and dequantize, on random
// odd shapes with every zero form, permutations, channel scales, bias and dense or padded rows of x.
// Tolerance: the reference's f32 bound (test-wq.h) plus one rounding of x' (and of W on the cuBLAS
// routes) to the GEMM's 16-bit dtype.
#include "cuda/cuda-test.h"
#include "test-wq.h"

static struct bie_tensor mirror_or_empty(const struct bie_tensor * h) {
    struct bie_tensor d;
    memset(&d, 0, sizeof d);
    return h->data ? cuda_mirror(h) : d;
}

struct dev_layer {
    struct bie_tensor qweight, scales, zeros, perm, cs, bias;
    struct bie_wq_weight w;
};

static void to_device(const struct layer * L, struct dev_layer * D) {
    D->qweight = cuda_mirror(&L->qweight);
    D->scales = cuda_mirror(&L->scales);
    D->zeros = mirror_or_empty(&L->zeros);
    D->perm = mirror_or_empty(&L->perm);
    D->cs = mirror_or_empty(&L->cs);
    D->bias = mirror_or_empty(&L->bias);
    D->w = (struct bie_wq_weight){.qweight = &D->qweight,
                                  .scales = &D->scales,
                                  .zeros = D->zeros.data ? &D->zeros : NULL,
                                  .group_bits = L->w.group_bits,
                                  .perm = D->perm.data ? &D->perm : NULL,
                                  .channel_scale = D->cs.data ? &D->cs : NULL,
                                  .bias = D->bias.data ? &D->bias : NULL};
}

static void free_device(struct dev_layer * D) {
    struct bie_tensor * ts[] = {&D->qweight, &D->scales, &D->zeros, &D->perm, &D->cs, &D->bias};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) cuda_tensor_free(ts[i]);
}

static void check_case(bie_context_t * ref, bie_context_t * cu, struct layer * L, enum bie_dtype xd, bool backward) {
    const int64_t M = L->M, K = L->d.in_features, N = L->d.out_features;
    struct dev_layer D;
    to_device(L, &D);
    // x's rows dense or padded (by a multiple of 16 bytes of a 16-bit x, or not)
    const int64_t pads[] = {0, 0, 3, 8}, ld = K + test_pick(pads, 4);
    struct bie_tensor x = test_tensor(xd, 2, (int64_t[]){M, K}, (int64_t[]){ld, 1});
    test_fill_uniform(&x, -1.0f, 1.0f);
    const enum bie_dtype yd = pick_float();
    struct bie_tensor yr = test_tensor(yd, 2, (int64_t[]){M, N}, NULL), y = test_tensor(yd, 2, (int64_t[]){M, N}, NULL);
    struct bie_tensor xg = cuda_mirror(&x), yg = cuda_mirror(&y);
    CHECK_OK(ref, bie_wq_linear_forward(ref, &L->d, &L->w, &x, &yr));
    CHECK_OK(cu, bie_wq_linear_forward(cu, &L->d, &D.w, &xg, &yg));
    CHECK_OK(cu, bie_context_cuda_synchronize(cu));
    cuda_fetch(&y, &yg);
    const double ex = eps_of(xd == BIE_DTYPE_F32 ? BIE_DTYPE_F16 : xd); // x' (or W) rounded to a 16-bit dtype
    int bad = 0;
    for (int64_t m = 0; m < M && bad < 3; m++)
        for (int64_t n = 0; n < N && bad < 3; n++) {
            double B = 0.0;
            for (int64_t r = 0; r < K; r++) B += fabs(xprime(L, &x, m, r)) * wbound(L, r, n);
            const double want = bie_load(&yr, m * N + n), got = bie_load(&y, m * N + n);
            const double tol = (double)(K + L->G + 8) * U32 * B + ex * B + eps_of(yd) * fabs(want) + 1e-30;
            if (!(fabs(got - want) <= tol)) {
                bad++;
                CHECK(false,
                      "forward M=%lld K=%lld N=%lld bits=%d gs=%d zero=%d x=%s ld=%lld: y[%lld,%lld] = %.9g, ref %.9g "
                      "(tol %.3g)",
                      (long long)M, (long long)K, (long long)N, L->d.bits, L->d.group_size, (int)L->d.zero,
                      bie_dtype_name(xd), (long long)ld, (long long)m, (long long)n, got, want, tol);
            }
        }
    CHECK(bad == 0, "forward: outputs off");
    if (backward) {
        struct bie_tensor g = test_tensor(xd, 2, (int64_t[]){M, N}, NULL);
        test_fill_uniform(&g, -1.0f, 1.0f);
        struct bie_tensor gxr = test_tensor(xd, 2, (int64_t[]){M, K}, NULL),
                          gx = test_tensor(xd, 2, (int64_t[]){M, K}, NULL);
        struct bie_tensor gwr = test_tensor(BIE_DTYPE_F32, 2, (int64_t[]){K, N}, NULL), gw = gwr;
        gw = test_tensor(BIE_DTYPE_F32, 2, (int64_t[]){K, N}, NULL);
        struct bie_tensor gg = cuda_mirror(&g), gxg = cuda_mirror(&gx), gwg = cuda_mirror(&gw);
        CHECK_OK(ref, bie_wq_linear_backward(ref, &L->d, &L->w, &x, &g, &gxr, &gwr));
        CHECK_OK(cu, bie_wq_linear_backward(cu, &L->d, &D.w, &xg, &gg, &gxg, &gwg));
        CHECK_OK(cu, bie_context_cuda_synchronize(cu));
        cuda_fetch(&gx, &gxg);
        cuda_fetch(&gw, &gwg);
        for (int64_t m = 0; m < M && bad < 3; m++)
            for (int64_t r = 0; r < K && bad < 3; r++) {
                const int64_t k = L->perm.data ? ((int32_t *)L->perm.data)[r] : r;
                const double csv = L->cs.data ? fabs(bie_load(&L->cs, k)) : 1.0;
                double B = 0.0;
                for (int64_t n = 0; n < N; n++) B += fabs(bie_load(&g, m * N + n)) * wbound(L, r, n);
                const double want = bie_load(&gxr, m * K + k), got = bie_load(&gx, m * K + k);
                const double tol = ((double)(N + 8) * U32 + ex) * B * csv + eps_of(xd) * fabs(want) + 1e-30;
                if (!(fabs(got - want) <= tol)) {
                    bad++;
                    CHECK(false, "grad_x M=%lld K=%lld N=%lld bits=%d: [%lld,%lld] = %.9g, ref %.9g", (long long)M,
                          (long long)K, (long long)N, L->d.bits, (long long)m, (long long)k, got, want);
                }
            }
        for (int64_t r = 0; r < K && bad < 6; r++)
            for (int64_t n = 0; n < N && bad < 6; n++) {
                double B = 0.0;
                for (int64_t m = 0; m < M; m++) B += fabs(xprime(L, &x, m, r) * bie_load(&g, m * N + n));
                const double want = ((float *)gwr.data)[r * N + n], got = ((float *)gw.data)[r * N + n];
                if (!(fabs(got - want) <= ((double)(M + 8) * U32 + ex) * B + 1e-30)) {
                    bad++;
                    CHECK(false, "grad_w M=%lld K=%lld N=%lld: [%lld,%lld] = %.9g, ref %.9g", (long long)M,
                          (long long)K, (long long)N, (long long)r, (long long)n, got, want);
                }
            }
        struct bie_tensor * ts[] = {&g, &gxr, &gx, &gwr, &gw};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) test_tensor_free(ts[i]);
        cuda_tensor_free(&gg);
        cuda_tensor_free(&gxg);
        cuda_tensor_free(&gwg);
    }
    // dequantize: f32, the same operations as the reference
    struct bie_tensor wr = test_tensor(BIE_DTYPE_F32, 2, (int64_t[]){K, N}, NULL),
                      wh = test_tensor(BIE_DTYPE_F32, 2, (int64_t[]){K, N}, NULL);
    struct bie_tensor wg = cuda_mirror(&wh);
    CHECK_OK(ref, bie_wq_dequantize(ref, &L->d, &L->w, &wr));
    CHECK_OK(cu, bie_wq_dequantize(cu, &L->d, &D.w, &wg));
    CHECK_OK(cu, bie_context_cuda_synchronize(cu));
    cuda_fetch(&wh, &wg);
    CHECK(memcmp(wh.data, wr.data, (size_t)(K * N) * 4) == 0, "dequantize K=%lld N=%lld bits=%d: not bit-identical",
          (long long)K, (long long)N, L->d.bits);
    struct bie_tensor * ts[] = {&x, &y, &yr, &wr, &wh};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) test_tensor_free(ts[i]);
    cuda_tensor_free(&xg);
    cuda_tensor_free(&yg);
    cuda_tensor_free(&wg);
    free_device(&D);
}

// Layers of M rows from ml through a context that reads BIE_CUDA_WQ=value: f16/bf16 x, 2/4/8 bits,
// N a multiple of 4 (the mma kernel's calls).
static void env_cases(bie_context_t * ref, const char * value, const int64_t * ml, int nm, int iters) {
    setenv("BIE_CUDA_WQ", value, 1); // read by a context when it first meets the device
    bie_context_t * cu = test_new_context(BIE_BACKEND_AUTO);
    for (int it = 0; it < iters; it++) {
        const int64_t bl[] = {4, 2, 8};
        const int bits = (int)test_pick(bl, 3);
        const int64_t gl[] = {128, 64, 100000};
        const int64_t K = 128 * test_rand_int(1, 5) + (it % 2 ? test_rand_int(0, 127) : 0);
        const int64_t N = 4 * test_rand_int(1, 80);
        const enum bie_dtype xd = it % 2 ? BIE_DTYPE_F16 : BIE_DTYPE_BF16;
        struct layer L;
        make_layer(&L, test_pick(ml, nm), K, N, bits, (int)test_pick(gl, 3), (enum bie_wq_zero)test_rand_int(0, 2),
                   test_rand_int(0, 2) == 0, test_rand_int(0, 3) == 0, test_rand_int(0, 1) == 0);
        check_case(ref, cu, &L, xd, false);
        free_layer(&L);
    }
    unsetenv("BIE_CUDA_WQ");
    bie_context_destroy(cu);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    cuda_test_require_gpu("test-cuda-wq");
    bie_context_t *ref, *cu;
    cuda_test_contexts(&ref, &cu);
    const int iters = cuda_test_quick() ? 40 : 160;
    for (int it = 0; it < iters; it++) {
        const int64_t ml[] = {1, 2, 3, 5, 8, 16, 17, 25, 32, 40};
        const int64_t bl[] = {4, 2, 8, 4, 2, 3, 0, 5};
        const int bits = (int)test_pick(bl, 8);
        const int64_t gl[] = {128, 64, 32, 100000, 48};
        const int gsz = (int)test_pick(gl, bits ? 5 : 3);
        const int64_t K = it < 8 ? 128 * test_rand_int(1, 12) : test_rand_int(1, 600);
        const int64_t N = it % 2 ? 4 * test_rand_int(1, 80) : test_rand_int(1, 300);
        const int64_t M = test_pick(ml, 10);
        const int64_t xl[] = {BIE_DTYPE_F16, BIE_DTYPE_BF16, BIE_DTYPE_F16, BIE_DTYPE_BF16, BIE_DTYPE_F32};
        const enum bie_dtype xd = (enum bie_dtype)test_pick(xl, 5);
        struct layer L;
        make_layer(&L, M, K, N, bits, gsz, (enum bie_wq_zero)test_rand_int(0, 2), test_rand_int(0, 2) == 0,
                   test_rand_int(0, 3) == 0, test_rand_int(0, 1) == 0);
        check_case(ref, cu, &L, xd, it % 3 == 0);
        free_layer(&L);
    }
    const int64_t passes_m[] = {33, 40, 64, 65, 95}, decode_m[] = {1, 2, 5, 8, 9, 16, 17, 32};
    env_cases(ref, "passes", passes_m, 5, iters / 4);
    env_cases(ref, "xs", decode_m, 8, iters / 4);
    bie_context_destroy(ref);
    bie_context_destroy(cu);
    return test_finish("test-cuda-wq");
}
