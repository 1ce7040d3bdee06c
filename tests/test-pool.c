// SPDX-License-Identifier: Apache-2.0
// test-pool.c: the affine max-pool (bie_affine_maxpool2d_forward) on the CPU: worked examples of
// its arithmetic (the affine map, the clamp, padding, NaN, the bits), every refused argument with
// its message, and random cases of tests/pool-cases.h (the CPU context against the reference).
#include "pool-cases.h"
#include "test-util.h"

static struct bie_affine_maxpool2d_desc desc(int k, int s, int p, float lo, float hi) {
    return (struct bie_affine_maxpool2d_desc){k, k, s, s, p, p, lo, hi};
}

// x [1, 2, 3, 3] = 1..9 in both channels; t = clamp(x * {2, -1} + {1, 10}, -inf, 12), 2x2 windows of
// stride 1: channel 0 t = 3 5 7 / 9 11 12 / 12 12 12, channel 1 t = 9 8 7 / 6 5 4 / 3 2 1.
static void worked_example(bie_context_t * ctx) {
    float xv[18], yv[8] = {0}, mulv[2] = {2, -1}, addv[2] = {1, 10}, bbv[2] = {-11.5f, -7};
    for (int i = 0; i < 18; i++) xv[i] = (float)(i % 9 + 1);
    uint8_t bitsv[1] = {0};
    struct bie_tensor x = TEST_VIEW(xv, BIE_DTYPE_F32, 1, 2, 3, 3), y = TEST_VIEW(yv, BIE_DTYPE_F32, 1, 2, 2, 2),
                      mul = TEST_VIEW(mulv, BIE_DTYPE_F32, 2), add = TEST_VIEW(addv, BIE_DTYPE_F32, 2),
                      bb = TEST_VIEW(bbv, BIE_DTYPE_F32, 2), bits = TEST_VIEW(bitsv, BIE_DTYPE_B1, 1, 2, 2, 2);
    const int64_t packed[4] = {8, 4, 2, 1}; // the 8 bits in one byte (a dense B1 view pads each row)
    memcpy(bits.stride, packed, sizeof packed);
    struct bie_affine_maxpool2d_desc d = desc(2, 1, 0, -INFINITY, 12);
    struct bie_affine_maxpool2d_args a = {&x, &mul, &add, &y, &bits, &bb, NULL};
    CHECK_OK(ctx, bie_affine_maxpool2d_forward(ctx, &d, &a));
    const float want[8] = {11, 12, 12, 12, 9, 8, 6, 5};
    for (int i = 0; i < 8; i++) CHECK(yv[i] == want[i], "y[%d] = %g, want %g", i, (double)yv[i], (double)want[i]);
    // bits: y + {-11.5, -7} >= 0 -> channel 0: 0 1 1 1, channel 1: 1 1 0 0 (LSB first)
    CHECK(bitsv[0] == 0x3E, "bits = 0x%02x, want 0x3e", bitsv[0]);

    // 3x3 windows, stride 2, padding 1 (the padding never wins, even over negative values), no
    // affine map: channel 0 of -x gives -1 -2 / -4 -5 without a clamp, 0 under a ReLU clamp
    for (int i = 0; i < 9; i++) xv[i] = -xv[i];
    d = desc(3, 2, 1, -INFINITY, INFINITY);
    a = (struct bie_affine_maxpool2d_args){&x, NULL, NULL, &y, NULL, NULL, NULL};
    CHECK_OK(ctx, bie_affine_maxpool2d_forward(ctx, &d, &a));
    const float want2[8] = {-1, -2, -4, -5, 5, 6, 8, 9};
    for (int i = 0; i < 8; i++) CHECK(yv[i] == want2[i], "y[%d] = %g, want %g", i, (double)yv[i], (double)want2[i]);
    d.lo = 0;
    CHECK_OK(ctx, bie_affine_maxpool2d_forward(ctx, &d, &a));
    CHECK(yv[0] == 0 && yv[3] == 0 && yv[7] == 9, "relu: y = %g .. %g .. %g", (double)yv[0], (double)yv[3],
          (double)yv[7]);

    // NaN wins its windows (and its bits are 0); the clamp keeps it
    xv[9 + 4] = NAN; // channel 1, the centre: in every 2x2 window
    d = desc(2, 1, 0, -1, 1);
    a = (struct bie_affine_maxpool2d_args){&x, NULL, NULL, &y, &bits, NULL, NULL};
    CHECK_OK(ctx, bie_affine_maxpool2d_forward(ctx, &d, &a));
    for (int i = 4; i < 8; i++) CHECK(isnan(yv[i]), "y[%d] = %g, want NaN", i, (double)yv[i]);
    CHECK((bitsv[0] & 0xF0) == 0, "NaN bits = 0x%02x", bitsv[0]);
}

// y in f16 and bf16: the f32 maximum rounded once to nearest even (1 + 2^-11 is a tie in f16 that
// goes to 1; 1 + 2^-7 + 2^-9 goes to 1 + 2^-7 in bf16).
static void rounding(bie_context_t * ctx) {
    float xv[2] = {1.0f, 1.0f + 0x1p-11f}, mulv[1] = {1.0f};
    uint16_t yv[1] = {0};
    struct bie_tensor x = TEST_VIEW(xv, BIE_DTYPE_F32, 1, 1, 1, 2), y = TEST_VIEW(yv, BIE_DTYPE_F16, 1, 1, 1, 1),
                      mul = TEST_VIEW(mulv, BIE_DTYPE_F32, 1);
    struct bie_affine_maxpool2d_desc d = {1, 2, 1, 1, 0, 0, -INFINITY, INFINITY};
    struct bie_affine_maxpool2d_args a = {&x, &mul, NULL, &y, NULL, NULL, NULL};
    CHECK_OK(ctx, bie_affine_maxpool2d_forward(ctx, &d, &a));
    CHECK(yv[0] == 0x3C00, "f16 y = 0x%04x, want 0x3c00 (1 + 2^-11 is a tie, to even)", yv[0]);
    y.dtype = BIE_DTYPE_BF16;
    xv[1] = 1.0f + 0x1p-7f + 0x1p-9f;
    CHECK_OK(ctx, bie_affine_maxpool2d_forward(ctx, &d, &a));
    CHECK(yv[0] == 0x3F81, "bf16 y = 0x%04x, want 0x3f81", yv[0]);
}

static void refused(bie_context_t * ctx) {
    float xv[2 * 4 * 4] = {0}, yv[2 * 2 * 2] = {0}, v2[2] = {1, 1}, v3[3] = {0};
    int32_t iv[2] = {0};
    uint8_t bitsv[8] = {0}; // [1, 2, 2, 2] B1, each row of 2 bits in a byte of its own
    struct bie_tensor x = TEST_VIEW(xv, BIE_DTYPE_F32, 1, 2, 4, 4), y = TEST_VIEW(yv, BIE_DTYPE_F32, 1, 2, 2, 2),
                      vec = TEST_VIEW(v2, BIE_DTYPE_F32, 2), vec3 = TEST_VIEW(v3, BIE_DTYPE_F32, 3),
                      ivec = TEST_VIEW(iv, BIE_DTYPE_I32, 2), bits = TEST_VIEW(bitsv, BIE_DTYPE_B1, 1, 2, 2, 2),
                      x3 = TEST_VIEW(xv, BIE_DTYPE_F32, 2, 4, 4), xi = TEST_VIEW(iv, BIE_DTYPE_I32, 1, 2, 1, 1),
                      ybad = TEST_VIEW(yv, BIE_DTYPE_F32, 1, 2, 3, 2),
                      bits_f = TEST_VIEW(yv, BIE_DTYPE_F32, 1, 2, 2, 2),
                      y_on_x = TEST_VIEW(xv, BIE_DTYPE_F32, 1, 2, 2, 2);
    const struct bie_affine_maxpool2d_desc good = desc(2, 2, 0, -INFINITY, INFINITY);
    struct bie_affine_maxpool2d_args a = {&x, &vec, &vec, &y, &bits, &vec, NULL};
    CHECK_OK(ctx, bie_affine_maxpool2d_forward(ctx, &good, &a));
    TEST_EXPECT_STATUS(ctx, bie_affine_maxpool2d_forward(ctx, NULL, &a), BIE_STATUS_INVALID_ARGUMENT, "desc");
    TEST_EXPECT_STATUS(ctx, bie_affine_maxpool2d_forward(ctx, &good, NULL), BIE_STATUS_INVALID_ARGUMENT, "args");
    struct {
        struct bie_affine_maxpool2d_desc d;
        struct bie_affine_maxpool2d_args a;
        const char * name;
    } bad[] = {
        {desc(0, 1, 0, 0, 1), a, "kernel_h"},
        {desc(2, 0, 0, 0, 1), a, "stride_h"},
        {desc(2, 2, 2, 0, 1), a, "2 * pad"},
        {desc(5, 1, 0, 0, 1), a, "does not fit"},
        {{2, 2, 2, 2, 0, -1, 0, 1}, a, "pad_w"},
        {desc(2, 2, 0, 1, 0), a, "lo <= hi"},
        {desc(2, 2, 0, NAN, 1), a, "no NaN"},
        {good, {NULL, NULL, NULL, &y, NULL, NULL, NULL}, "x: is NULL"},
        {good, {&x, NULL, NULL, NULL, NULL, NULL, NULL}, "y: is NULL"},
        {good, {&x3, NULL, NULL, &y, NULL, NULL, NULL}, "4-D"},
        {good, {&xi, NULL, NULL, &y, NULL, NULL, NULL}, "x: dtype"},
        {good, {&x, NULL, NULL, &ybad, NULL, NULL, NULL}, "y:"},
        {good, {&x, &vec3, NULL, &y, NULL, NULL, NULL}, "mul:"},
        {good, {&x, NULL, &ivec, &y, NULL, NULL, NULL}, "add: dtype"},
        {good, {&x, NULL, NULL, &y, NULL, &vec, NULL}, "without out_bits"},
        {good, {&x, NULL, NULL, &y, &bits_f, NULL, NULL}, "out_bits: dtype"},
        {good, {&x, NULL, NULL, &y_on_x, NULL, NULL, NULL}, "overlap"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        TEST_EXPECT_STATUS(ctx, bie_affine_maxpool2d_forward(ctx, &bad[i].d, &bad[i].a), BIE_STATUS_INVALID_ARGUMENT,
                           bad[i].name);
    CHECK(bie_affine_maxpool2d_forward(NULL, &good, &a) == BIE_STATUS_INVALID_ARGUMENT, "NULL context");
}

// argmax and the backward by hand: x [1, 1, 3, 3] = 1 2 3 / 4 5 6 / 7 9 8, 2x2 windows of stride 1:
// the maxima are 5, 6, 9, 9 at positions 3, 3, 3 and 2 of their windows; with the clamp hi = 8.5 the
// two windows of 9 stop their gradient (255). grad_y = 1, 2, 3, 4: grad_z = 1 at x's 5, 2 at its 6,
// 3 + 4 at its 9 (0 under the clamp), 0 elsewhere.
static void argmax_example(bie_context_t * ctx) {
    float xv[9] = {1, 2, 3, 4, 5, 6, 7, 9, 8}, yv[4], gyv[4] = {1, 2, 3, 4}, gzv[9];
    uint8_t amv[4];
    struct bie_tensor x = TEST_VIEW(xv, BIE_DTYPE_F32, 1, 1, 3, 3), y = TEST_VIEW(yv, BIE_DTYPE_F32, 1, 1, 2, 2),
                      am = TEST_VIEW(amv, BIE_DTYPE_U8, 1, 1, 2, 2), gy = TEST_VIEW(gyv, BIE_DTYPE_F32, 1, 1, 2, 2),
                      gz = TEST_VIEW(gzv, BIE_DTYPE_F32, 1, 1, 3, 3);
    for (int clamp = 0; clamp < 2; clamp++) {
        const struct bie_affine_maxpool2d_desc d = desc(2, 1, 0, -INFINITY, clamp ? 8.5f : INFINITY);
        const struct bie_affine_maxpool2d_args a = {&x, NULL, NULL, &y, NULL, NULL, &am};
        CHECK_OK(ctx, bie_affine_maxpool2d_forward(ctx, &d, &a));
        const uint8_t want[4] = {3, 3, clamp ? 255 : 3, clamp ? 255 : 2};
        for (int i = 0; i < 4; i++)
            CHECK(amv[i] == want[i], "clamp %d: argmax[%d] = %d, want %d", clamp, i, amv[i], want[i]);
        const struct bie_affine_maxpool2d_backward_args b = {&am, &gy, &gz};
        CHECK_OK(ctx, bie_affine_maxpool2d_backward(ctx, &d, &b));
        for (int i = 0; i < 9; i++) {
            const float w = i == 4 ? 1 : i == 5 ? 2 : i == 7 ? (clamp ? 0 : 7) : 0;
            CHECK(gzv[i] == w, "clamp %d: grad_z[%d] = %g, want %g", clamp, i, (double)gzv[i], (double)w);
        }
    }
    // refused: a window of 256 positions, argmax not u8, grad_z of the wrong shape or NULL
    float big[16 * 16] = {0}, one[1];
    struct bie_tensor xb = TEST_VIEW(big, BIE_DTYPE_F32, 1, 1, 16, 16), yb = TEST_VIEW(one, BIE_DTYPE_F32, 1, 1, 1, 1),
                      ab = TEST_VIEW(amv, BIE_DTYPE_U8, 1, 1, 1, 1), af = TEST_VIEW(gyv, BIE_DTYPE_F32, 1, 1, 2, 2);
    const struct bie_affine_maxpool2d_desc d16 = desc(16, 1, 0, -INFINITY, INFINITY), d2 = desc(2, 1, 0, 0, 1);
    TEST_EXPECT_STATUS(ctx,
                       bie_affine_maxpool2d_forward(
                           ctx, &d16, &(struct bie_affine_maxpool2d_args){&xb, NULL, NULL, &yb, NULL, NULL, &ab}),
                       BIE_STATUS_INVALID_ARGUMENT, "does not fit a byte");
    TEST_EXPECT_STATUS(ctx,
                       bie_affine_maxpool2d_forward(
                           ctx, &d2, &(struct bie_affine_maxpool2d_args){&x, NULL, NULL, &y, NULL, NULL, &af}),
                       BIE_STATUS_INVALID_ARGUMENT, "argmax: dtype");
    TEST_EXPECT_STATUS(
        ctx, bie_affine_maxpool2d_backward(ctx, &d2, &(struct bie_affine_maxpool2d_backward_args){&am, &gy, &y}),
        BIE_STATUS_INVALID_ARGUMENT, "argmax");
    TEST_EXPECT_STATUS(
        ctx, bie_affine_maxpool2d_backward(ctx, &d2, &(struct bie_affine_maxpool2d_backward_args){&am, &gy, NULL}),
        BIE_STATUS_INVALID_ARGUMENT, "grad_z: is NULL");
    TEST_EXPECT_STATUS(
        ctx, bie_affine_maxpool2d_backward(ctx, &d2, &(struct bie_affine_maxpool2d_backward_args){&am, &gz, &gz}),
        BIE_STATUS_INVALID_ARGUMENT, "grad_y");
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    bie_context_t *ref = test_new_context(BIE_BACKEND_REF), *cpu = test_new_context(BIE_BACKEND_AUTO);
    bie_context_t * both[2] = {ref, cpu};
    for (int i = 0; i < 2; i++) {
        worked_example(both[i]);
        rounding(both[i]);
        refused(both[i]);
        argmax_example(both[i]);
    }
    for (int i = 0; i < 200; i++) {
        struct pcase c;
        pool_random_case(&c);
        pool_check_case(&c, ref, cpu, "cpu", &op_host);
    }
    bie_context_destroy(ref);
    bie_context_destroy(cpu);
    return test_finish("test-pool");
}
