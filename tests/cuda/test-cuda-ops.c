// SPDX-License-Identifier: Apache-2.0
// test-cuda-ops.c: the batched matmul of two activations and the embedding on CUDA tensors against
// the plain-C reference on host copies of the same operands (the cases and bounds of
// tests/op-cases.h, as the CPU tests use them):
//   matmul forward: identical element by element (out f32/f16/bf16 or I32), host and device clips,
//            odd shapes and layouts (y stored transposed), and large batches whose GEMMs take
//            several tiles and K stages on the tensor cores;
//   matmul backward: within the f32-accumulation bound, clip gradients included;
//   embedding forward: identical (tables b1 / s4 / i8 / float, bags, per-row scales, i32 / i64);
//            an index outside [0, V) reads as a zero row;
//   embedding backward: within the bound of float atomics adding n terms in any order.
#include "cuda-test.h"
#include "op-cases.h"

static struct bie_tensor dev_put(const struct bie_tensor * h) { return cuda_mirror(h); }
static void dev_get(struct bie_tensor * h, const struct bie_tensor * d) {
    CUDA_OK(cudaDeviceSynchronize());
    cuda_fetch(h, d);
}
static void dev_drop(struct bie_tensor * d) { cuda_tensor_free(d); }
static const struct op_device cuda_dev = {dev_put, dev_get, dev_drop, true};

// Out-of-range indices read as zero rows on CUDA (no host read of the indices).
static void check_out_of_range(bie_context_t * cu) {
    uint8_t tb[2] = {0xff, 0x00};
    int32_t ix[3] = {0, 7, -1};
    float out[3][8];
    struct bie_tensor t, i, o;
    bie_tensor_make(&t, tb, BIE_DTYPE_B1, 2, (int64_t[]){2, 8});
    bie_tensor_make(&i, ix, BIE_DTYPE_I32, 1, (int64_t[]){3});
    bie_tensor_make(&o, out, BIE_DTYPE_F32, 2, (int64_t[]){3, 8});
    struct bie_tensor dt = cuda_mirror(&t), di = cuda_mirror(&i), dout = cuda_mirror(&o);
    const struct bie_embedding_desc d = {BIE_QUANT_BINARY, 0};
    const struct bie_embedding_args a = {&di, &dt, NULL, &dout};
    CHECK_OK(cu, bie_embedding_forward(cu, &d, &a));
    dev_get(&o, &dout);
    for (int k = 0; k < 8; k++)
        CHECK(out[0][k] == 1.0f && out[1][k] == 0.0f && out[2][k] == 0.0f, "out-of-range rows: [%g %g %g] at %d",
              out[0][k], out[1][k], out[2][k], k);
    cuda_tensor_free(&dt);
    cuda_tensor_free(&di);
    cuda_tensor_free(&dout);
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
    // large: several row and column tiles and K stages per batch (the wgmma route on Hopper)
    for (int i = 0; i < (cuda_test_quick() ? 1 : 4); i++) {
        struct mcase c;
        matmul_random_case(&c);
        c.lead = 1;
        c.ls[0] = c.B = test_rand_int(2, 3);
        c.M = test_rand_int(300, 700);
        c.N = test_rand_int(260, 520);
        c.K = test_rand_int(600, 1300);
        matmul_describe(&c);
        matmul_check_case(&c, ref, &cu, names, 1, i % 2 == 1, &cuda_dev);
    }
    for (int i = 0; i < (cuda_test_quick() ? 60 : 300); i++) embedding_check_case(ref, cu, "cuda", &cuda_dev);
    check_out_of_range(cu);
    bie_context_destroy(ref);
    bie_context_destroy(cu);
    return test_finish("test-cuda-ops");
}
