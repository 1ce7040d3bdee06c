// SPDX-License-Identifier: Apache-2.0
// test-cuda-pack.c: bie_pack / bie_unpack on CUDA tensors (bit-identical to the reference over the
// whole destination span, including bits of packed bytes that belong to no element), the
// scale-init helpers' device reductions (sum in double: the f32 scale must match the reference's
// to 1 ulp), the weight scale computed into a device tensor, and the no-GPU / error statuses.
#include "cuda-test.h"

static bie_context_t *ref_ctx, *cu_ctx;

static void random_shape(int32_t * ndim, int64_t * shape) {
    *ndim = (int32_t)test_rand_int(1, 4);
    for (int32_t i = 0; i < *ndim; i++) shape[i] = test_rand_int(1, i == *ndim - 1 ? 70 : 9);
}

static struct bie_tensor make_any(enum bie_dtype dt, int32_t ndim, const int64_t * shape) {
    // dense, or transposed last two dims: for byte-sized dtypes half the time, for B1 (the serial
    // path) a third of the time
    const bool packed = dt == BIE_DTYPE_B1 || dt == BIE_DTYPE_S4;
    if (ndim >= 2 && ((!packed && test_rand_int(0, 1)) || (dt == BIE_DTYPE_B1 && test_rand_int(0, 2) == 0))) {
        int64_t s[BIE_MAX_DIMS];
        memcpy(s, shape, sizeof(int64_t) * (size_t)ndim);
        s[ndim - 1] = shape[ndim - 2];
        s[ndim - 2] = shape[ndim - 1];
        struct bie_tensor t = test_tensor(dt, ndim, s, NULL);
        int32_t perm[BIE_MAX_DIMS];
        for (int32_t i = 0; i < ndim; i++) perm[i] = i;
        perm[ndim - 1] = ndim - 2;
        perm[ndim - 2] = ndim - 1;
        bie_tensor_permute(&t, perm);
        return t;
    }
    return test_tensor(dt, ndim, shape, NULL);
}

// A float within 3 ulps of (m + 0.5) * scale for an integer m around the codes' range: where the
// quotient by scale lies next to a half-integer, the rounding the codes take is decided by its last
// bits.
static double near_tie(float scale) {
    float v = (float)(((double)test_rand_int(-140, 139) + 0.5) * scale);
    const int64_t steps = test_rand_int(-3, 3);
    for (int64_t i = 0; i < (steps < 0 ? -steps : steps); i++) v = nextafterf(v, steps < 0 ? -INFINITY : INFINITY);
    return v;
}

static void test_pack_unpack(void) {
    static const enum bie_dtype srcs[4] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16, BIE_DTYPE_I8};
    static const enum bie_dtype dsts[3] = {BIE_DTYPE_B1, BIE_DTYPE_S4, BIE_DTYPE_I8};
    static const enum bie_dtype outs[4] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16, BIE_DTYPE_I8};
    const int n = cuda_test_quick() ? 30 : 200;
    for (int it = 0; it < n; it++) {
        int32_t nd;
        int64_t shape[BIE_MAX_DIMS];
        random_shape(&nd, shape);
        const enum bie_dtype dd = dsts[test_rand_int(0, 2)];
        enum bie_dtype sd = srcs[test_rand_int(0, dd == BIE_DTYPE_I8 ? 2 : 3)];
        const int with_scale = dd != BIE_DTYPE_B1 && sd != BIE_DTYPE_I8 && test_rand_int(0, 1);
        const float scale = test_rand_float(0.1f, 3.0f);
        struct bie_tensor src = make_any(sd, nd, shape);
        int64_t idx[BIE_MAX_DIMS] = {0};
        do {
            const int64_t k = test_rand_int(0, 9);
            double v = k == 0   ? 0.0
                       : k == 1 ? ((double)test_rand_int(-10, 9) + 0.5) * scale
                       : k == 2 ? near_tie(scale)
                                : test_rand_float(-200, 200) * (k == 3 ? 1 : 0.05) * scale;
            if (sd == BIE_DTYPE_I8) v = (double)test_rand_int(-128, 127);
            bie_store(&src, bie_offset(&src, idx), v);
        } while (bie_next_index(&src, idx));
        struct bie_tensor sc = test_scalar(scale);
        struct bie_tensor d_ref = make_any(dd, nd, shape), d_cu = d_ref;
        fill_poison(&d_ref);
        d_cu.data = malloc(tensor_span(&d_ref) + 64);
        struct bie_tensor dsrc = cuda_mirror(&src), ddst = cuda_mirror(&d_ref);
        CHECK_OK(ref_ctx, bie_pack(ref_ctx, &src, with_scale ? &sc : NULL, &d_ref));
        CHECK_OK(cu_ctx, bie_pack(cu_ctx, &dsrc, with_scale ? &sc : NULL, &ddst));
        CHECK_OK(cu_ctx, bie_context_cuda_synchronize(cu_ctx));
        cuda_fetch(&d_cu, &ddst);
        CHECK(memcmp(d_cu.data, d_ref.data, tensor_span(&d_ref)) == 0,
              "pack %s -> %s (ndim %d, last %lld, scale %d) differs", bie_dtype_name(sd), bie_dtype_name(dd), (int)nd,
              (long long)shape[nd - 1], with_scale);
        // unpack the packed tensor back
        const enum bie_dtype od = outs[test_rand_int(0, 3)];
        const int uscale = od != BIE_DTYPE_I8 && test_rand_int(0, 1);
        struct bie_tensor u_ref = make_any(od, nd, shape), u_cu = u_ref;
        fill_poison(&u_ref);
        u_cu.data = malloc(tensor_span(&u_ref) + 64);
        struct bie_tensor du = cuda_mirror(&u_ref);
        CHECK_OK(ref_ctx, bie_unpack(ref_ctx, &d_ref, uscale ? &sc : NULL, &u_ref));
        CHECK_OK(cu_ctx, bie_unpack(cu_ctx, &ddst, uscale ? &sc : NULL, &du));
        CHECK_OK(cu_ctx, bie_context_cuda_synchronize(cu_ctx));
        cuda_fetch(&u_cu, &du);
        CHECK(memcmp(u_cu.data, u_ref.data, tensor_span(&u_ref)) == 0, "unpack %s -> %s (ndim %d) differs",
              bie_dtype_name(dd), bie_dtype_name(od), (int)nd);
        cuda_tensor_free(&dsrc);
        cuda_tensor_free(&ddst);
        cuda_tensor_free(&du);
        test_tensor_free(&src);
        test_tensor_free(&sc);
        test_tensor_free(&d_ref);
        test_tensor_free(&d_cu);
        test_tensor_free(&u_ref);
        test_tensor_free(&u_cu);
    }
}

static void test_scale_init(void) {
    for (int it = 0; it < 20; it++) {
        int32_t nd;
        int64_t shape[BIE_MAX_DIMS];
        random_shape(&nd, shape);
        struct bie_tensor x = make_any(BIE_DTYPE_F32, nd, shape);
        test_fill_uniform(&x, -3.0f, 2.0f);
        struct bie_tensor dx = cuda_mirror(&x);
        static const enum bie_quant qs[3] = {BIE_QUANT_BINARY, BIE_QUANT_INT4, BIE_QUANT_INT8};
        const enum bie_quant q = qs[test_rand_int(0, 2)];
        struct bie_tensor r1 = test_scalar(0), r2 = test_scalar(0), r3 = test_scalar(0), r4 = test_scalar(0);
        CHECK_OK(ref_ctx, bie_activation_scale_init(ref_ctx, q, 1, &x, &r1));
        CHECK_OK(cu_ctx, bie_activation_scale_init(cu_ctx, q, 1, &dx, &r2));
        CHECK_OK(ref_ctx, bie_weight_scale_init(ref_ctx, q, &x, &r3));
        CHECK_OK(cu_ctx, bie_weight_scale_init(cu_ctx, q, &dx, &r4));
        const float a = *(float *)r1.data, b = *(float *)r2.data, c = *(float *)r3.data, d = *(float *)r4.data;
        CHECK(fabsf(a - b) <= 1.2e-7f * fabsf(a), "activation scale %.9g vs reference %.9g", (double)b, (double)a);
        CHECK(fabsf(c - d) <= 1.2e-7f * fabsf(c), "weight scale %.9g vs reference %.9g", (double)d, (double)c);
        cuda_tensor_free(&dx);
        test_tensor_free(&x);
        test_tensor_free(&r1);
        test_tensor_free(&r2);
        test_tensor_free(&r3);
        test_tensor_free(&r4);
    }
}

// bie_weight_scale_init into a device out_scale: within one ulp of out's dtype of the reference's
// scale (which sums in element order, the device in a tree), the same bits on a second call, and
// recorded (bie_cuda_record_begin) then replayed on new weight values, their scale.
static void test_weight_scale_on_device(void) {
    static const enum bie_dtype dts[3] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16};
    static const double ulp[3] = {1.2e-7, 9.8e-4, 7.9e-3};
    static const enum bie_quant qs[3] = {BIE_QUANT_BINARY, BIE_QUANT_INT4, BIE_QUANT_INT8};
    for (int it = 0; it < 24; it++) {
        int32_t nd;
        int64_t shape[BIE_MAX_DIMS];
        random_shape(&nd, shape);
        if (it % 4 == 0) shape[0] = test_rand_int(300, 3000); // (several blocks of the device's sums)
        const int wi = (int)test_rand_int(0, 2), oi = (int)test_rand_int(0, 2);
        const enum bie_quant q = qs[it % 3];
        struct bie_tensor w = make_any(dts[wi], nd, shape);
        test_fill_uniform(&w, -3.0f, 2.0f);
        struct bie_tensor dw = cuda_mirror(&w);
        struct bie_tensor ref = test_tensor(dts[oi], 0, NULL, NULL), got = test_tensor(dts[oi], 0, NULL, NULL);
        struct bie_tensor dout = cuda_mirror(&got);
        CHECK_OK(ref_ctx, bie_weight_scale_init(ref_ctx, q, &w, &ref));
        CHECK_OK(cu_ctx, bie_weight_scale_init(cu_ctx, q, &dw, &dout));
        cuda_fetch(&got, &dout);
        const double r = bie_load(&ref, 0), g = bie_load(&got, 0);
        CHECK(fabs(r - g) <= ulp[oi] * fabs(r),
              "case %d (%d-bit, w %s %lld elements, out %s): device scale %.9g, "
              "reference %.9g",
              it, (int)q, bie_dtype_name(dts[wi]), (long long)bie_tensor_numel(&w), bie_dtype_name(dts[oi]), g, r);
        struct bie_tensor again = test_tensor(dts[oi], 0, NULL, NULL);
        CHECK_OK(cu_ctx, bie_weight_scale_init(cu_ctx, q, &dw, &dout));
        cuda_fetch(&again, &dout);
        CHECK(memcmp(again.data, got.data, (size_t)(bie_dtype_bits(dts[oi]) / 8)) == 0,
              "case %d: a second call gives other bits", it);
        // recorded: the replay reads the weight's values of the time it runs
        bie_cuda_graph_t * graph = NULL;
        CHECK_OK(cu_ctx, bie_cuda_record_begin(cu_ctx));
        CHECK_OK(cu_ctx, bie_weight_scale_init(cu_ctx, q, &dw, &dout));
        CHECK_OK(cu_ctx, bie_cuda_record_end(cu_ctx, &graph));
        test_fill_uniform(&w, -1.0f, 5.0f);
        CUDA_OK(cudaMemcpy(dw.data, w.data, tensor_span(&w), cudaMemcpyHostToDevice));
        CHECK_OK(ref_ctx, bie_weight_scale_init(ref_ctx, q, &w, &ref));
        CHECK_OK(cu_ctx, bie_cuda_replay(cu_ctx, graph));
        CHECK_OK(cu_ctx, bie_context_cuda_synchronize(cu_ctx));
        cuda_fetch(&got, &dout);
        const double r2 = bie_load(&ref, 0), g2 = bie_load(&got, 0);
        CHECK(fabs(r2 - g2) <= ulp[oi] * fabs(r2), "case %d replayed: device scale %.9g, reference %.9g", it, g2, r2);
        bie_cuda_graph_destroy(graph);
        cuda_tensor_free(&dw);
        cuda_tensor_free(&dout);
        test_tensor_free(&w);
        test_tensor_free(&ref);
        test_tensor_free(&got);
        test_tensor_free(&again);
    }
    // refused: two elements, a CPU w with a device out_scale, an integer out_scale
    const int64_t two = 2, shape[2] = {3, 5};
    struct bie_tensor w = test_tensor(BIE_DTYPE_F32, 2, shape, NULL), o2 = test_tensor(BIE_DTYPE_F32, 1, &two, NULL);
    test_fill_uniform(&w, -1.0f, 1.0f);
    struct bie_tensor dw = cuda_mirror(&w), do2 = cuda_mirror(&o2), d1 = do2, di = do2;
    d1.ndim = 0;
    di.ndim = 0;
    di.dtype = BIE_DTYPE_I32;
    TEST_EXPECT_STATUS(cu_ctx, bie_weight_scale_init(cu_ctx, BIE_QUANT_INT8, &dw, &do2), BIE_STATUS_INVALID_ARGUMENT,
                       "exactly one element");
    TEST_EXPECT_STATUS(cu_ctx, bie_weight_scale_init(cu_ctx, BIE_QUANT_INT8, &w, &d1), BIE_STATUS_INVALID_ARGUMENT,
                       "on the device of w");
    TEST_EXPECT_STATUS(cu_ctx, bie_weight_scale_init(cu_ctx, BIE_QUANT_INT8, &dw, &di), BIE_STATUS_INVALID_ARGUMENT,
                       "f32, f16 or bf16");
    TEST_EXPECT_STATUS(cu_ctx, bie_weight_scale_init(cu_ctx, (enum bie_quant)3, &dw, &d1), BIE_STATUS_INVALID_ARGUMENT,
                       "must be 1, 4 or 8");
    cuda_tensor_free(&dw);
    cuda_tensor_free(&do2);
    test_tensor_free(&w);
    test_tensor_free(&o2);
}

// A CUDA error comes back as a status with the CUDA message (a device tensor pointing at host
// memory that the device cannot read).
static void test_errors(void) {
    const int64_t shape[2] = {4, 100};
    struct bie_tensor h = test_tensor(BIE_DTYPE_F32, 2, shape, NULL);
    struct bie_tensor bogus = h;
    bogus.device_type = BIE_DEVICE_CUDA;
    bogus.data = (void *)(uintptr_t)0x10; // not a device allocation
    struct bie_tensor out = test_scalar(0);
    enum bie_status st = bie_weight_scale_init(cu_ctx, BIE_QUANT_BINARY, &bogus, &out);
    CHECK(st == BIE_STATUS_DEVICE_ERROR, "a bad device pointer gives DEVICE_ERROR, got %s: %s", bie_status_string(st),
          bie_context_last_error(cu_ctx));
    // an illegal address is sticky: the process cannot use the device afterwards, so this is last
    test_tensor_free(&h);
    test_tensor_free(&out);
}

// Without a usable GPU (no driver, no device) every CUDA entry point returns UNSUPPORTED with a
// message, and touches no pointer.
static void test_no_device(void) {
    bie_context_t * ctx;
    if (bie_context_create(NULL, &ctx) != BIE_STATUS_OK) exit(1);
    CHECK(bie_context_set_cuda_stream(ctx, NULL) == BIE_STATUS_UNSUPPORTED, "set stream: %s",
          bie_context_last_error(ctx));
    CHECK(bie_context_cuda_stream(ctx) == NULL, "no stream");
    CHECK(bie_context_reserve(ctx, BIE_DEVICE_CUDA, 1 << 20) == BIE_STATUS_UNSUPPORTED, "reserve: %s",
          bie_context_last_error(ctx));
    const int64_t shape[2] = {3, 40}, wshape[2] = {5, 40}, yshape[2] = {3, 5};
    struct bie_tensor x, w, y, sa = test_scalar(1.0f), sw = test_scalar(1.0f);
    bie_tensor_make(&x, (void *)(uintptr_t)0x1000, BIE_DTYPE_F32, 2, shape);
    bie_tensor_make(&w, (void *)(uintptr_t)0x2000, BIE_DTYPE_F32, 2, wshape);
    bie_tensor_make(&y, (void *)(uintptr_t)0x3000, BIE_DTYPE_F32, 2, yshape);
    x.device_type = w.device_type = y.device_type = BIE_DEVICE_CUDA;
    const struct bie_linear_desc d = {BIE_QUANT_BINARY, 40, 5};
    struct bie_forward_args a = {.x = &x, .weight = &w, .scale_a = &sa, .scale_w = &sw, .y = &y};
    enum bie_status st = bie_linear_forward(ctx, &d, &a);
    CHECK(st == BIE_STATUS_UNSUPPORTED, "forward on a CUDA tensor without a GPU: %s: %s", bie_status_string(st),
          bie_context_last_error(ctx));
    struct bie_tensor xb = x;
    bie_tensor_make(&xb, (void *)(uintptr_t)0x4000, BIE_DTYPE_B1, 2, shape);
    xb.device_type = BIE_DEVICE_CUDA;
    st = bie_pack(ctx, &x, NULL, &xb);
    CHECK(st == BIE_STATUS_UNSUPPORTED, "pack without a GPU: %s", bie_status_string(st));
    struct bie_tensor out = test_scalar(0.0f);
    st = bie_weight_scale_init(ctx, BIE_QUANT_BINARY, &x, &out);
    CHECK(st == BIE_STATUS_UNSUPPORTED, "scale init without a GPU: %s", bie_status_string(st));
    struct bie_tensor dout = out; // (the scale computed on the device)
    dout.device_type = BIE_DEVICE_CUDA;
    st = bie_weight_scale_init(ctx, BIE_QUANT_INT8, &x, &dout);
    CHECK(st == BIE_STATUS_UNSUPPORTED, "scale init into a device tensor without a GPU: %s", bie_status_string(st));
    test_tensor_free(&sa);
    test_tensor_free(&sw);
    test_tensor_free(&out);
    bie_context_destroy(ctx);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    if (!bie_backend_available(BIE_BACKEND_CUDA)) {
        test_no_device();
        if (test_failures) return test_finish("test-cuda-pack");
        printf("test-cuda-pack: the no-device statuses hold (%d checks)\n", test_checks);
    }
    cuda_test_require_gpu("test-cuda-pack");
    cuda_test_contexts(&ref_ctx, &cu_ctx);
    test_pack_unpack();
    test_scale_init();
    test_weight_scale_on_device();
    if (!getenv("BIE_TEST_NO_FAULT")) test_errors();
    bie_context_destroy(ref_ctx);
    bie_context_destroy(cu_ctx);
    return test_finish("test-cuda-pack");
}
