// SPDX-License-Identifier: Apache-2.0
// test-limits.c: size arithmetic at the ends of int64 and the documented limits (docs/limits.md):
// every overflow is an error status, never a wrapped size (and never undefined behaviour: the
// ASan/UBSan build runs this too).
#include "bie-train.h"
#include "test-util.h"

static void test_tensor_sizes(void) {
    struct bie_tensor t;
    const int64_t big2[2] = {INT64_C(1) << 62, 4};
    bie_tensor_make(&t, NULL, BIE_DTYPE_F32, 1, big2); // [2^62]: fine as a shape
    t.ndim = 2;
    t.shape[1] = 4;
    t.stride[1] = 1;
    CHECK(bie_tensor_numel(&t) == -1, "numel of [2^62, 4] is %lld, want -1 (overflow)",
          (long long)bie_tensor_numel(&t));
    const int64_t near_max[1] = {INT64_MAX - 2};
    CHECK(bie_tensor_make(&t, NULL, BIE_DTYPE_B1, 1, near_max) == BIE_STATUS_INVALID_ARGUMENT,
          "b1 [INT64_MAX - 2]: rounding its row up to whole bytes overflows");
    CHECK(bie_tensor_make(&t, NULL, BIE_DTYPE_F32, 1, near_max) == BIE_STATUS_OK, "f32 [INT64_MAX - 2] is a view");
    size_t bytes = 0;
    CHECK(bie_tensor_nbytes(&t, &bytes) == BIE_STATUS_INVALID_ARGUMENT, "nbytes of f32 [INT64_MAX - 2] overflows");
    // the span INT64_MAX + 1 itself overflows
    t.shape[0] = INT64_MAX;
    t.stride[0] = 1;
    CHECK(bie_tensor_nbytes(&t, &bytes) == BIE_STATUS_INVALID_ARGUMENT, "nbytes of [INT64_MAX]");
    t.shape[0] = INT64_MIN;
    CHECK(bie_tensor_nbytes(&t, &bytes) == BIE_STATUS_INVALID_ARGUMENT, "nbytes of a negative shape");
    t.shape[0] = 3;
    t.stride[0] = -1;
    CHECK(bie_tensor_nbytes(&t, &bytes) == BIE_STATUS_INVALID_ARGUMENT, "nbytes of a negative stride");
    t.dtype = BIE_DTYPE_F64;
    t.shape[0] = INT64_C(1) << 60;
    t.stride[0] = 1;
    CHECK(bie_tensor_nbytes(&t, &bytes) == BIE_STATUS_INVALID_ARGUMENT, "bits of 2^60 f64 overflow");
    t.shape[0] = (INT64_MAX - 7) / 8 + 1;
    t.dtype = BIE_DTYPE_U8;
    t.stride[0] = 8;
    CHECK(bie_tensor_nbytes(&t, &bytes) == BIE_STATUS_INVALID_ARGUMENT, "bits + 7 overflows");
}

// bie_conv2d_output_size takes any h, w: h + 2*pad near INT64_MAX is refused, not wrapped.
static void test_conv_output_size(void) {
    struct bie_conv2d_desc d = test_conv3x3(1, 1, BIE_PAD_ZERO);
    int64_t oh = 0, ow = 0;
    CHECK(bie_conv2d_output_size(&d, INT64_MAX, 5, &oh, &ow) == BIE_STATUS_INVALID_ARGUMENT, "h = INT64_MAX, pad 1");
    CHECK(bie_conv2d_output_size(&d, 5, INT64_MAX - 1, &oh, &ow) == BIE_STATUS_INVALID_ARGUMENT, "w = INT64_MAX - 1");
    CHECK(bie_conv2d_output_size(&d, INT64_MAX - 2, 5, &oh, &ow) == BIE_STATUS_OK && oh == INT64_MAX - 2 && ow == 5,
          "h = INT64_MAX - 2 pads to INT64_MAX: %lld", (long long)oh);
    d.padding[0] = INT32_MAX;
    d.kernel[0] = INT32_MAX;
    d.dilation[0] = INT32_MAX;
    CHECK(bie_conv2d_output_size(&d, 5, 5, &oh, &ow) == BIE_STATUS_INVALID_ARGUMENT, "huge kernel");
}

// The float building blocks' views may claim more elements than fit int64, or (max-pooling, whose
// argmax is int32) more than 2^31: such views are refused before any element is touched (the
// buffers here hold four elements).
static void test_nn_sizes(bie_context_t * ctx) {
    float x[4] = {0}, y[4] = {0}, g[4] = {1, 1, 1, 1}, st[4] = {0, 0, 1, 1};
    int32_t am[4] = {0};
    const int64_t e16 = 65536, e15 = 32768;
    struct bie_tensor px = TEST_VIEW(x, BIE_DTYPE_F32, 1, 1, e16, e16),
                      py = TEST_VIEW(y, BIE_DTYPE_F32, 1, 1, e15, e15),
                      pg = TEST_VIEW(g, BIE_DTYPE_F32, 1, 1, e15, e15),
                      pa = TEST_VIEW(am, BIE_DTYPE_I32, 1, 1, e15, e15);
    const struct bie_maxpool2d_desc pd = {2};
    TEST_EXPECT_STATUS(ctx, bie_maxpool2d_forward(ctx, &pd, &(struct bie_maxpool2d_args){&px, &py, &pa}),
                       BIE_STATUS_INVALID_ARGUMENT, "2^31");
    TEST_EXPECT_STATUS(ctx, bie_maxpool2d_backward(ctx, &pd, &(struct bie_maxpool2d_backward_args){&pg, &pa, &px}),
                       BIE_STATUS_INVALID_ARGUMENT, "2^31");
    const int64_t e22 = INT64_C(1) << 22;
    struct bie_tensor bx = TEST_VIEW(x, BIE_DTYPE_F32, 1, 1, 1), by = TEST_VIEW(y, BIE_DTYPE_F32, 1, 1, 1),
                      bs = TEST_VIEW(st, BIE_DTYPE_F32, 1);
    bx.shape[0] = bx.shape[1] = bx.shape[2] = by.shape[0] = by.shape[1] = by.shape[2] = e22; // 2^66 elements
    TEST_EXPECT_STATUS(
        ctx,
        bie_batchnorm_forward(ctx, &(struct bie_batchnorm_desc){0.1f, 1e-5f, 1},
                              &(struct bie_batchnorm_args){&bx, &bs, &bs, &bs, &bs, &bs, &bs, &by, NULL, NULL}),
        BIE_STATUS_INVALID_ARGUMENT, "overflows");
    TEST_EXPECT_STATUS(
        ctx,
        bie_batchnorm_backward(ctx, &(struct bie_batchnorm_backward_args){&bx, &bs, &bs, &bs, &by, NULL, &bs, &bs}),
        BIE_STATUS_INVALID_ARGUMENT, "overflows");
    const uint8_t labels[1] = {0};
    double loss;
    struct bie_tensor lz = TEST_VIEW(x, BIE_DTYPE_F32, 1, 1), ll = TEST_VIEW(labels, BIE_DTYPE_U8, 1);
    lz.shape[0] = lz.shape[1] = ll.shape[0] = INT64_C(1) << 40;
    TEST_EXPECT_STATUS(
        ctx, bie_softmax_cross_entropy(ctx, &(struct bie_softmax_cross_entropy_args){&lz, &ll, NULL, &loss, NULL}),
        BIE_STATUS_INVALID_ARGUMENT, "overflows");
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    test_tensor_sizes();
    test_conv_output_size();
    bie_context_t * ctx = NULL;
    CHECK_OK(ctx, bie_context_create(NULL, &ctx));
    test_nn_sizes(ctx);
    bie_context_destroy(ctx);
    return test_finish("test-limits");
}
