// SPDX-License-Identifier: Apache-2.0
// test-cuda-ops.c: the batched matmul of two activations and the embedding on CUDA tensors against
// the plain-C reference on host copies of the same operands (the cases and bounds of
// tests/op-cases.h, as the CPU tests use them):
//   matmul forward: identical element by element (out f32/f16/bf16 or I32), host and device clips,
//            odd shapes and layouts (y stored transposed), small batches of long rows, and
//            large batches whose GEMMs take several tiles and K stages on the tensor cores;
//   matmul backward: within the f32-accumulation bound, clip gradients included;
//   embedding forward: identical (tables b1 / s4 / i8 / float, bags, per-row scales, i32 / i64);
//            an index outside [0, V) reads as a zero row;
//   embedding backward: within the bound of float atomics adding n terms in any order;
//   affine max-pool: identical, y and bits (the cases of tests/pool-cases.h, and channels-last
//            ones of 8k channels that take the vectorised route, the ResNet stem's among them).
#include "cuda-test.h"
#include "op-cases.h"
#include "pool-cases.h"

static struct bie_tensor dev_put(const struct bie_tensor * h) { return cuda_mirror(h); }
static void dev_get(struct bie_tensor * h, const struct bie_tensor * d) {
    CUDA_OK(cudaDeviceSynchronize());
    cuda_fetch(h, d);
}
static void dev_drop(struct bie_tensor * d) { cuda_tensor_free(d); }
static const struct op_device cuda_dev = {dev_put, dev_get, dev_drop, true};

// Binary tables looked up one index per output row into wide dense f16 / bf16 rows (the CUDA
// backend's warp-per-row route), with and without scales, dense and gapped tables.
static void check_binary_rows(bie_context_t * ref, bie_context_t * cu) {
    static const int64_t ds[] = {128, 136, 256, 1032};
    for (int i = 0; i < (cuda_test_quick() ? 12 : 48); i++) {
        struct ecase c;
        embedding_random_case(&c);
        c.q = BIE_QUANT_BINARY;
        c.bag = false;
        c.td = BIE_DTYPE_B1;
        c.D = test_pick(ds, 4);
        c.od = test_rand_int(0, 1) ? BIE_DTYPE_F16 : BIE_DTYPE_BF16;
        c.tlayout = (int)test_rand_int(0, 1);
        snprintf(c.what, sizeof c.what, "binary rows: V %lld D %lld layout %d scale %d idx %s nd %d out %s",
                 (long long)c.V, (long long)c.D, c.tlayout, (int)c.has_scale, bie_dtype_name(c.id), (int)c.nd,
                 bie_dtype_name(c.od));
        embedding_check(ref, cu, "cuda", &cuda_dev, c);
    }
}

// Out-of-range indices read as zero rows (+0) on CUDA (no host read of the indices), by the generic
// kernel (D = 8, f32) and the binary-rows one (D = 128, f16).
static void check_out_of_range(bie_context_t * cu, int64_t D, enum bie_dtype od) {
    uint8_t tb[2][16];
    memset(tb[0], 0xff, sizeof tb[0]);
    memset(tb[1], 0x00, sizeof tb[1]);
    int32_t ix[3] = {0, 7, -1};
    struct bie_tensor t, i, o;
    bie_tensor_make(&t, tb, BIE_DTYPE_B1, 2, (int64_t[]){2, D});
    t.stride[0] = 128; // rows 16 bytes apart
    bie_tensor_make(&i, ix, BIE_DTYPE_I32, 1, (int64_t[]){3});
    o = test_tensor(od, 2, (int64_t[]){3, D}, NULL);
    struct bie_tensor dt = cuda_mirror(&t), di = cuda_mirror(&i), dout = cuda_mirror(&o);
    const struct bie_embedding_desc d = {BIE_QUANT_BINARY, 0};
    const struct bie_embedding_args a = {&di, &dt, NULL, &dout};
    CHECK_OK(cu, bie_embedding_forward(cu, &d, &a));
    dev_get(&o, &dout);
    for (int64_t k = 0; k < D; k++) {
        const double r0 = bie_load(&o, k), r1 = bie_load(&o, D + k), r2 = bie_load(&o, 2 * D + k);
        CHECK(r0 == 1.0 && r1 == 0.0 && r2 == 0.0 && !signbit(r1) && !signbit(r2),
              "out-of-range rows (D %lld, %s): [%g %g %g] at %lld", (long long)D, bie_dtype_name(od), r0, r1, r2,
              (long long)k);
    }
    cuda_tensor_free(&dt);
    cuda_tensor_free(&di);
    cuda_tensor_free(&dout);
    test_tensor_free(&o);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    cuda_test_require_gpu("test-cuda-ops");
    bie_context_t *ref, *cu;
    cuda_test_contexts(&ref, &cu);
    const char * names[1] = {"cuda"};
    const int iters = cuda_test_quick() ? 30 : 150;
    for (int i = 0; i < 2 * iters; i++) {
        struct mcase c;
        matmul_random_case(&c);
        matmul_check_case(&c, ref, &cu, names, 1, i >= iters, &cuda_dev);
    }
    // many small batches of long rows: the word products stage y[b] in several tiles
    for (int i = 0; i < (cuda_test_quick() ? 4 : 12); i++) {
        struct mcase c;
        matmul_random_case(&c);
        c.lead = 1;
        c.ls[0] = c.B = test_rand_int(2, 5);
        c.K = test_rand_int(2000, 4000);
        matmul_describe(&c);
        matmul_check_case(&c, ref, &cu, names, 1, i % 4 == 3, &cuda_dev);
    }
    // large: several row and column tiles and K stages per batch (the wgmma route on Hopper);
    // binary ones take the packed-batches route, K a multiple of 1024 reading its bits in place
    for (int i = 0; i < (cuda_test_quick() ? 2 : 6); i++) {
        struct mcase c;
        do matmul_random_case(&c);
        while ((c.q == BIE_QUANT_BINARY) != (i % 2 == 0));
        c.lead = 1;
        c.ls[0] = c.B = test_rand_int(2, 3);
        c.M = test_rand_int(300, 700);
        c.N = test_rand_int(260, 520);
        c.K = i % 4 == 0 ? 1024 * test_rand_int(1, 2) : test_rand_int(600, 1300);
        matmul_describe(&c);
        matmul_check_case(&c, ref, &cu, names, 1, i >= 4, &cuda_dev);
    }
    for (int i = 0; i < (cuda_test_quick() ? 60 : 300); i++) embedding_check_case(ref, cu, "cuda", &cuda_dev);
    check_binary_rows(ref, cu);
    check_out_of_range(cu, 8, BIE_DTYPE_F32);
    check_out_of_range(cu, 128, BIE_DTYPE_F16);
    for (int i = 0; i < (cuda_test_quick() ? 100 : 400); i++) {
        struct pcase c;
        pool_random_case(&c);
        if (i % 2) { // channels-last x and y of 8k channels, bits channels-last or none
            c.C = 8 * test_rand_int(1, 9);
            c.xl = c.yl = c.zl = c.gl = 1;
            c.bl = test_rand_int(0, 1) ? 1 : -1;
            c.bb = c.bl >= 0 && c.bb;
            if (i % 16 == 1) { // the stem's pool: 3x3, stride 2, padding 1, ReLU, at its real size
                c.N = 2, c.C = 64, c.H = c.W = 112;
                c.d = (struct bie_affine_maxpool2d_desc){3, 3, 2, 2, 1, 1, 0.0f, INFINITY};
                c.OH = c.OW = 56;
            }
            pool_describe(&c);
        }
        pool_check_case(&c, ref, cu, "cuda", &cuda_dev);
    }
    bie_context_destroy(ref);
    bie_context_destroy(cu);
    return test_finish("test-cuda-ops");
}
