// SPDX-License-Identifier: Apache-2.0
// test-limits.c: size arithmetic at the ends of int64 and the documented limits (docs/limits.md):
// every overflow is an error status, never a wrapped size (and never undefined behaviour: the
// ASan/UBSan build runs this too).
#include "test-util.h"

static void test_tensor_sizes(void) {
    struct bie_tensor t;
    const int64_t big2[2] = {INT64_C(1) << 62, 4};
    bie_tensor_make(&t, NULL, BIE_DTYPE_F32, 1, big2); // [2^62]: fine as a shape
    t.ndim = 2;
    t.shape[1] = 4;
    t.stride[1] = 1;
    CHECK(bie_tensor_numel(&t) == -1, "numel of [2^62, 4] is %lld, want -1 (overflow)", (long long)bie_tensor_numel(&t));
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

int main(int argc, char ** argv) {
    test_init(argc, argv);
    test_tensor_sizes();
    return test_finish("test-limits");
}
