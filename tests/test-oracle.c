// SPDX-License-Identifier: Apache-2.0
// test-oracle.c: the reference forward of every layer against an independent double-precision
// oracle (test-oracle.h: float convolution of the +-1 / integer codes, no bit packing) on random
// shapes, dtypes, layouts and pad values, plus hand-computed cases for the rounding, sign(0),
// NaN and padding rules. Every output is compared exactly: I32 and B1 because they are integers,
// floats because y = (float)acc * (scale_a * scale_w) rounded once to y's dtype is computed the
// same way by the oracle.
#include "test-oracle.h"

static bie_context_t * ctx;

static enum bie_status forward(const struct layer_case * c, struct bie_tensor * y) {
    const struct bie_forward_args a = {.x = &c->x,
                                       .bias_a = c->has_bias ? &c->bias : NULL,
                                       .weight = &c->w,
                                       .scale_a = &c->sa,
                                       .scale_w = &c->sw_t,
                                       .y = y};
    return c->conv ? bie_conv2d_forward(ctx, &c->cd, &a) : bie_linear_forward(ctx, &c->lin, &a);
}

static void run_random_case(bool conv) {
    struct layer_case c;
    const struct case_opts o = {.conv = conv, .x_dtype = -1, .w_dtype = -1};
    case_random(&c, &o);
    double * acc = oracle_acc(&c);
    const enum bie_dtype ydt[5] = {BIE_DTYPE_I32, BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16, BIE_DTYPE_B1};
    const int nd = c.quant == BIE_QUANT_BINARY ? 5 : 4;
    for (int d = 0; d < nd; d++) {
        struct bie_tensor y = case_make_out(&c, ydt[d]);
        const enum bie_status st = forward(&c, &y);
        CHECK(st == BIE_STATUS_OK, "%s y=%s: %s: %s", c.desc, bie_dtype_name(ydt[d]), bie_status_string(st),
              bie_context_last_error(ctx));
        if (st == BIE_STATUS_OK) {
            double * got = dense_load(&y);
            int64_t bad = 0, first = -1;
            for (int64_t i = 0; i < lc_ynumel(&c); i++)
                if (!(got[i] == oracle_y(&c, ydt[d], acc[i]))) {
                    if (first < 0) first = i;
                    bad++;
                }
            CHECK(bad == 0, "%s y=%s: %lld of %lld outputs differ; first at %lld: got %.9g, oracle %.9g (acc %.0f)",
                  c.desc, bie_dtype_name(ydt[d]), (long long)bad, (long long)lc_ynumel(&c), (long long)first,
                  first >= 0 ? got[first] : 0.0, first >= 0 ? oracle_y(&c, ydt[d], acc[first]) : 0.0,
                  first >= 0 ? acc[first] : 0.0);
            free(got);
        }
        test_tensor_free(&y);
    }
    free(acc);
    case_free(&c);
}

// --- hand-computed cases -------------------------------------------------------------------------

// A dense f32 tensor holding `vals`.
static struct bie_tensor f32_tensor(int32_t ndim, const int64_t * shape, const float * vals) {
    struct bie_tensor t = test_tensor(BIE_DTYPE_F32, ndim, shape, NULL);
    memcpy(t.data, vals, sizeof(float) * (size_t)bie_tensor_numel(&t));
    return t;
}

// 4-bit and 8-bit codes: round half to even, clamping, NaN -> lo; identity weight reads them out.
static void test_hand_rounding(void) {
    const float xs[10] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 7.5f, -8.5f, 100.0f, NAN, -2.4999998f};
    const int want4[10] = {0, 2, 2, 0, -2, 7, -8, 7, -8, -2};
    const int want8[10] = {0, 2, 2, 0, -2, 8, -8, 100, -128, -2};
    const int64_t xshape[2] = {1, 10}, wshape[2] = {10, 10};
    struct bie_tensor x = f32_tensor(2, xshape, xs);
    struct bie_tensor w = test_tensor(BIE_DTYPE_I8, 2, wshape, NULL);
    for (int i = 0; i < 10; i++) ((int8_t *)w.data)[i * 10 + i] = 1;
    struct bie_tensor y = test_tensor(BIE_DTYPE_I32, 2, xshape, NULL);
    struct bie_tensor sa = test_scalar(1.0f), sw = test_scalar(1.0f);
    for (int q = 4; q <= 8; q += 4) {
        const struct bie_linear_desc d = {(enum bie_quant)q, 10, 10};
        const struct bie_forward_args a = {.x = &x, .weight = &w, .scale_a = &sa, .scale_w = &sw, .y = &y};
        CHECK_OK(ctx, bie_linear_forward(ctx, &d, &a));
        for (int i = 0; i < 10; i++) {
            const int want = q == 4 ? want4[i] : want8[i];
            CHECK(((int32_t *)y.data)[i] == want, "%d-bit code of x = %g: got %d, want %d", q, (double)xs[i],
                  ((int32_t *)y.data)[i], want);
        }
    }
    // The division is done in f32: 0.7f / 0.2f is exactly 3.5 in f32 (-> 4, half to even), while
    // the same division in double gives 3.4999999 (-> 3).
    const float x2[2] = {0.7f, 0.3f};
    const int64_t x2s[2] = {1, 2}, w2s[2] = {1, 2}, y2s[2] = {1, 1};
    struct bie_tensor x2t = f32_tensor(2, x2s, x2), w2 = test_tensor(BIE_DTYPE_I8, 2, w2s, NULL);
    struct bie_tensor y2 = test_tensor(BIE_DTYPE_I32, 2, y2s, NULL), sa2 = test_scalar(0.2f);
    ((int8_t *)w2.data)[0] = 1;
    ((int8_t *)w2.data)[1] = 10;
    const struct bie_linear_desc d2 = {BIE_QUANT_INT8, 2, 1};
    const struct bie_forward_args a2 = {.x = &x2t, .weight = &w2, .scale_a = &sa2, .scale_w = &sw, .y = &y2};
    CHECK_OK(ctx, bie_linear_forward(ctx, &d2, &a2));
    const int want = 4 + 10 * 2; // 0.3f / 0.2f = 1.5 in f32 -> 2
    CHECK(((int32_t *)y2.data)[0] == want, "f32 division: got %d, want %d", ((int32_t *)y2.data)[0], want);
    test_tensor_free(&x2t);
    test_tensor_free(&w2);
    test_tensor_free(&y2);
    test_tensor_free(&sa2);
    test_tensor_free(&x);
    test_tensor_free(&w);
    test_tensor_free(&y);
    test_tensor_free(&sa);
    test_tensor_free(&sw);
}

// Binary codes: sign(0) = sign(-0) = +1, NaN -> -1; bias_a is added in f32 before the sign.
static void test_hand_sign(void) {
    const float xs[6] = {0.0f, -0.0f, NAN, -1e-30f, 1e-30f, -0.25f};
    const float bias[1] = {0.0f};
    const int want[6] = {1, 1, -1, -1, 1, -1};
    const int64_t xshape[2] = {6, 1}, wshape[2] = {1, 1}, bshape[1] = {1};
    struct bie_tensor x = f32_tensor(2, xshape, xs), w = test_tensor(BIE_DTYPE_F32, 2, wshape, NULL);
    ((float *)w.data)[0] = -0.0f; // sign(-0) = +1
    struct bie_tensor y = test_tensor(BIE_DTYPE_I32, 2, xshape, NULL), b = f32_tensor(1, bshape, bias);
    struct bie_tensor sa = test_scalar(1.0f), sw = test_scalar(1.0f);
    const struct bie_linear_desc d = {BIE_QUANT_BINARY, 1, 1};
    struct bie_forward_args a = {.x = &x, .bias_a = &b, .weight = &w, .scale_a = &sa, .scale_w = &sw, .y = &y};
    CHECK_OK(ctx, bie_linear_forward(ctx, &d, &a));
    for (int i = 0; i < 6; i++)
        CHECK(((int32_t *)y.data)[i] == want[i], "sign(%g): got %d, want %d", (double)xs[i], ((int32_t *)y.data)[i],
              want[i]);
    ((float *)b.data)[0] = 0.25f; // -0.25 + 0.25 = 0 -> +1; 1e-30 + 0.25 > 0
    CHECK_OK(ctx, bie_linear_forward(ctx, &d, &a));
    CHECK(((int32_t *)y.data)[5] == 1 && ((int32_t *)y.data)[3] == 1, "bias_a shifts before the sign: %d %d",
          ((int32_t *)y.data)[5], ((int32_t *)y.data)[3]);
    test_tensor_free(&x);
    test_tensor_free(&w);
    test_tensor_free(&y);
    test_tensor_free(&b);
    test_tensor_free(&sa);
    test_tensor_free(&sw);
}

// The three pad values of a binary conv: a 1x1 image, 3x3 kernel of +1, padding 1: the one
// output reads 1 real tap (+1) and 8 padded ones.
static void test_hand_pad_values(void) {
    const int64_t xshape[4] = {1, 1, 1, 1}, wshape[4] = {1, 1, 3, 3};
    const float one[1] = {1.0f};
    struct bie_tensor x = f32_tensor(4, xshape, one), w = test_tensor(BIE_DTYPE_F32, 4, wshape, NULL);
    for (int i = 0; i < 9; i++) ((float *)w.data)[i] = 0.5f;
    struct bie_tensor y = test_tensor(BIE_DTYPE_I32, 4, xshape, NULL), yb = test_tensor(BIE_DTYPE_B1, 4, xshape, NULL);
    struct bie_tensor sa = test_scalar(1.0f), sw = test_scalar(1.0f);
    const int want[3] = {1, -7, 9};
    for (int p = 0; p < 3; p++) {
        const struct bie_conv2d_desc d = test_conv3x3(1, 1, (enum bie_pad_value)p);
        struct bie_forward_args a = {.x = &x, .weight = &w, .scale_a = &sa, .scale_w = &sw, .y = &y};
        CHECK_OK(ctx, bie_conv2d_forward(ctx, &d, &a));
        CHECK(((int32_t *)y.data)[0] == want[p], "pad value %d: got %d, want %d", p, ((int32_t *)y.data)[0], want[p]);
        a.y = &yb;
        ((uint8_t *)yb.data)[0] = 0xAA; // the other bits of the byte are not touched
        CHECK_OK(ctx, bie_conv2d_forward(ctx, &d, &a));
        const uint8_t wantb = (uint8_t)(0xAA | (want[p] >= 0 ? 1 : 0)) & (uint8_t)(want[p] >= 0 ? 0xFF : 0xFE);
        CHECK(((uint8_t *)yb.data)[0] == wantb, "pad value %d: b1 byte 0x%02x, want 0x%02x", p, ((uint8_t *)yb.data)[0],
              wantb);
    }
    test_tensor_free(&x);
    test_tensor_free(&w);
    test_tensor_free(&y);
    test_tensor_free(&yb);
    test_tensor_free(&sa);
    test_tensor_free(&sw);
}

// An 8-bit conv with dilation 2 and padding 1 written out by hand.
static void test_hand_conv(void) {
    const int64_t xshape[4] = {1, 1, 3, 3}, wshape[4] = {1, 1, 2, 2}, yshape[4] = {1, 1, 3, 3};
    const float xs[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    struct bie_tensor x = f32_tensor(4, xshape, xs), w = test_tensor(BIE_DTYPE_I8, 4, wshape, NULL);
    ((int8_t *)w.data)[0] = 1;
    ((int8_t *)w.data)[3] = -1;
    struct bie_tensor y = test_tensor(BIE_DTYPE_I32, 4, yshape, NULL), yf = test_tensor(BIE_DTYPE_F32, 4, yshape, NULL);
    struct bie_tensor sa = test_scalar(1.0f), sw = test_scalar(0.5f);
    const struct bie_conv2d_desc d = {.quant = BIE_QUANT_INT8,
                                      .in_channels = 1,
                                      .out_channels = 1,
                                      .kernel = {2, 2},
                                      .stride = {1, 1},
                                      .padding = {1, 1},
                                      .dilation = {2, 2},
                                      .groups = 1,
                                      .pad_value = BIE_PAD_ZERO};
    struct bie_forward_args a = {.x = &x, .weight = &w, .scale_a = &sa, .scale_w = &sw, .y = &y};
    CHECK_OK(ctx, bie_conv2d_forward(ctx, &d, &a));
    // y(oh, ow) = x(oh-1, ow-1) - x(oh+1, ow+1), zero outside the image
    const int want[9] = {-5, -6, 0, -8, -8, 2, 0, 4, 5};
    for (int i = 0; i < 9; i++)
        CHECK(((int32_t *)y.data)[i] == want[i], "dilated conv output %d: got %d, want %d", i, ((int32_t *)y.data)[i],
              want[i]);
    a.y = &yf;
    CHECK_OK(ctx, bie_conv2d_forward(ctx, &d, &a));
    for (int i = 0; i < 9; i++)
        CHECK(((float *)yf.data)[i] == 0.5f * (float)want[i], "scaled output %d: %g", i, (double)((float *)yf.data)[i]);
    test_tensor_free(&x);
    test_tensor_free(&w);
    test_tensor_free(&y);
    test_tensor_free(&yf);
    test_tensor_free(&sa);
    test_tensor_free(&sw);
}

// Output rounding: y = (float)acc * (scale_a * scale_w) then RNE to f16 (overflow to inf) / bf16.
static void test_hand_output_rounding(void) {
    const int64_t xshape[2] = {1, 1000}, wshape[2] = {1, 1000}, yshape[2] = {1, 1};
    struct bie_tensor x = test_tensor(BIE_DTYPE_F32, 2, xshape, NULL), w = test_tensor(BIE_DTYPE_F32, 2, wshape, NULL);
    for (int i = 0; i < 1000; i++) ((float *)x.data)[i] = ((float *)w.data)[i] = 1.0f;
    struct bie_tensor sa = test_scalar(10.0f), sw = test_scalar(10.0f);
    const struct bie_linear_desc d = {BIE_QUANT_BINARY, 1000, 1};
    const enum bie_dtype dts[3] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16};
    const double want[3] = {100000.0, INFINITY, 99840.0};
    for (int i = 0; i < 3; i++) {
        struct bie_tensor y = test_tensor(dts[i], 2, yshape, NULL);
        const struct bie_forward_args a = {.x = &x, .weight = &w, .scale_a = &sa, .scale_w = &sw, .y = &y};
        CHECK_OK(ctx, bie_linear_forward(ctx, &d, &a));
        CHECK(bie_load(&y, 0) == want[i], "y %s = %g, want %g", bie_dtype_name(dts[i]), bie_load(&y, 0), want[i]);
        test_tensor_free(&y);
    }
    test_tensor_free(&x);
    test_tensor_free(&w);
    test_tensor_free(&sa);
    test_tensor_free(&sw);
}

// An 8-bit sum past the int32 range wraps modulo 2^32, as every int32 accumulator does:
// K = 131073 products of (-128)*(-128) = 2147500032 = 2^31 + 16384 -> -2147467264.
static void test_hand_int32_wrap(void) {
    const int64_t K = 131073, xshape[2] = {1, K}, yshape[2] = {1, 1};
    struct bie_tensor x = test_tensor(BIE_DTYPE_F32, 2, xshape, NULL), w = test_tensor(BIE_DTYPE_I8, 2, xshape, NULL);
    for (int64_t i = 0; i < K; i++) {
        ((float *)x.data)[i] = -1000.0f;
        ((int8_t *)w.data)[i] = -128;
    }
    struct bie_tensor y = test_tensor(BIE_DTYPE_I32, 2, yshape, NULL), sa = test_scalar(1.0f), sw = test_scalar(1.0f);
    const struct bie_linear_desc d = {BIE_QUANT_INT8, K, 1};
    const struct bie_forward_args a = {.x = &x, .weight = &w, .scale_a = &sa, .scale_w = &sw, .y = &y};
    CHECK_OK(ctx, bie_linear_forward(ctx, &d, &a));
    CHECK(((int32_t *)y.data)[0] == -2147467264, "int32 wrap: got %d, want -2147467264", ((int32_t *)y.data)[0]);
    test_tensor_free(&x);
    test_tensor_free(&w);
    test_tensor_free(&y);
    test_tensor_free(&sa);
    test_tensor_free(&sw);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    ctx = test_new_context(BIE_BACKEND_REF);
    test_hand_rounding();
    test_hand_sign();
    test_hand_pad_values();
    test_hand_conv();
    test_hand_output_rounding();
    test_hand_int32_wrap();
    const int n_linear = test_quick() ? 100 : 600, n_conv = test_quick() ? 200 : 1500;
    for (int i = 0; i < n_linear; i++) run_random_case(false);
    for (int i = 0; i < n_conv; i++) run_random_case(true);
    bie_context_destroy(ctx);
    return test_finish("test-oracle");
}
