// SPDX-License-Identifier: Apache-2.0
// test-pack.c: bie_pack / bie_unpack.
//  - the bit and nibble order against hand-written byte vectors (B1: LSB first; S4: element 2i
//    in the high nibble; rows padded to whole bytes);
//  - every bit / nibble of random rows of every length 1..70 against the layout rule;
//  - exact round trips: B1 from f32/f16/bf16/i8 (values -> signs), S4 from f32/f16/bf16/i8
//    (codes -> codes, with and without a scale, clamping), I8 quantization (RNE, clamp) and back;
//  - padding bits never leak: garbage in the row padding changes neither unpack nor a layer's
//    output, and pack writes no byte outside the view's elements.
#include "test-util.h"

static bie_context_t * ctx;

static bool quick(void) {
    const char * q = getenv("BIE_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

static struct bie_tensor f32_row(int64_t rows, int64_t k, const float * vals) {
    const int64_t shape[2] = {rows, k};
    struct bie_tensor t = test_tensor(BIE_DTYPE_F32, 2, shape, NULL);
    memcpy(t.data, vals, sizeof(float) * (size_t)(rows * k));
    return t;
}

static void test_hand_bytes(void) {
    // B1: two rows of 10 -> 2 bytes per row; bit k of a row is bit k%8 of byte k/8.
    const float v[20] = {1,  -1, 0,  -0.5f, 2,  -3, 0.1f, -0.1f, 5,     -5,  // 1010101010
                         -1, -1, -1, -1,    -1, -1, -1,   1,     -0.0f, -2}; // 0000000110
    struct bie_tensor src = f32_row(2, 10, v);
    const int64_t shape[2] = {2, 10};
    struct bie_tensor b1 = test_tensor(BIE_DTYPE_B1, 2, shape, NULL);
    CHECK_OK(ctx, bie_pack(ctx, &src, NULL, &b1));
    const uint8_t want_b1[4] = {0x55, 0x01, 0x80, 0x01};
    CHECK(memcmp(b1.data, want_b1, 4) == 0, "b1 bytes %02x %02x %02x %02x, want 55 01 80 01", ((uint8_t *)b1.data)[0],
          ((uint8_t *)b1.data)[1], ((uint8_t *)b1.data)[2], ((uint8_t *)b1.data)[3]);
    // S4: one row of 5 codes -> 3 bytes; element 2i in the high nibble, two's complement.
    const float q[5] = {1, -1, 7, -8, 3};
    struct bie_tensor qs = f32_row(1, 5, q);
    const int64_t s4shape[2] = {1, 5};
    struct bie_tensor s4 = test_tensor(BIE_DTYPE_S4, 2, s4shape, NULL);
    CHECK_OK(ctx, bie_pack(ctx, &qs, NULL, &s4));
    const uint8_t want_s4[3] = {0x1F, 0x78, 0x30};
    CHECK(memcmp(s4.data, want_s4, 3) == 0, "s4 bytes %02x %02x %02x, want 1f 78 30", ((uint8_t *)s4.data)[0],
          ((uint8_t *)s4.data)[1], ((uint8_t *)s4.data)[2]);
    // And back from hand-written bytes.
    const uint8_t in_s4[3] = {0x9E, 0x07, 0x40}; // -7 -2 | 0 7 | 4
    memcpy(s4.data, in_s4, 3);
    struct bie_tensor out = f32_row(1, 5, q);
    CHECK_OK(ctx, bie_unpack(ctx, &s4, NULL, &out));
    const float want_u[5] = {-7, -2, 0, 7, 4};
    CHECK(memcmp(out.data, want_u, sizeof want_u) == 0, "s4 unpack %g %g %g %g %g", (double)((float *)out.data)[0],
          (double)((float *)out.data)[1], (double)((float *)out.data)[2], (double)((float *)out.data)[3],
          (double)((float *)out.data)[4]);
    const uint8_t in_b1[4] = {0x81, 0x02, 0xFF, 0xFC}; // row 0: 1000000101, row 1: 1111111100
    memcpy(b1.data, in_b1, 4);
    struct bie_tensor ub = f32_row(2, 10, v);
    CHECK_OK(ctx, bie_unpack(ctx, &b1, NULL, &ub));
    const float want_b[20] = {1, -1, -1, -1, -1, -1, -1, 1, -1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1};
    CHECK(memcmp(ub.data, want_b, sizeof want_b) == 0, "b1 unpack of hand-written bytes");
    test_tensor_free(&src);
    test_tensor_free(&b1);
    test_tensor_free(&qs);
    test_tensor_free(&s4);
    test_tensor_free(&out);
    test_tensor_free(&ub);
}

// Every element of random rows of every length lands where the layout rule says.
static void test_layout_rule(void) {
    for (int64_t k = 1; k <= 70; k++)
        for (int64_t rows = 1; rows <= 3; rows++) {
            const int64_t shape[2] = {rows, k};
            struct bie_tensor src = test_tensor(BIE_DTYPE_F32, 2, shape, NULL);
            for (int64_t i = 0; i < rows * k; i++) ((float *)src.data)[i] = (float)test_rand_int(-9, 8);
            struct bie_tensor b1 = test_tensor(BIE_DTYPE_B1, 2, shape, NULL),
                              s4 = test_tensor(BIE_DTYPE_S4, 2, shape, NULL);
            CHECK_OK(ctx, bie_pack(ctx, &src, NULL, &b1));
            CHECK_OK(ctx, bie_pack(ctx, &src, NULL, &s4));
            const uint8_t * pb = b1.data;
            const uint8_t * ps = s4.data;
            const int64_t rb = (k + 7) / 8, rs = (k + 1) / 2;
            int bad_b = 0, bad_s = 0, bad_pad = 0;
            for (int64_t r = 0; r < rows; r++) {
                for (int64_t j = 0; j < k; j++) {
                    const float v = ((float *)src.data)[r * k + j];
                    const int bit = (pb[r * rb + j / 8] >> (j % 8)) & 1;
                    if (bit != (v >= 0)) bad_b++;
                    const int nib = j % 2 == 0 ? ps[r * rs + j / 2] >> 4 : ps[r * rs + j / 2] & 15;
                    const int code = v < -8 ? -8 : v > 7 ? 7 : (int)v;
                    if (nib != (code & 15)) bad_s++;
                }
                if (k % 8 && (pb[r * rb + rb - 1] >> (k % 8))) bad_pad++; // calloc'ed padding stays 0
                if (k % 2 && (ps[r * rs + rs - 1] & 15)) bad_pad++;
            }
            CHECK(bad_b == 0 && bad_s == 0 && bad_pad == 0,
                  "rows %lld k %lld: %d bad bits, %d bad nibbles, %d dirty pads", (long long)rows, (long long)k, bad_b,
                  bad_s, bad_pad);
            test_tensor_free(&src);
            test_tensor_free(&b1);
            test_tensor_free(&s4);
        }
}

static const enum bie_dtype src_dtypes[4] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16, BIE_DTYPE_I8};

static void test_round_trips(void) {
    const int cases = quick() ? 20 : 200;
    for (int it = 0; it < cases; it++) {
        const int64_t shape[2] = {test_rand_int(1, 5), test_rand_int(1, 77)};
        const int64_t n = shape[0] * shape[1];
        const enum bie_dtype sd = src_dtypes[test_rand_int(0, 3)];
        const float scale = ldexpf(1.0f, (int)test_rand_int(-3, 3)); // exact products
        struct bie_tensor scale_t = test_scalar(scale);
        struct bie_tensor src = test_tensor(sd, 2, shape, NULL), back = test_tensor(BIE_DTYPE_F32, 2, shape, NULL);
        struct bie_tensor b1 = test_tensor(BIE_DTYPE_B1, 2, shape, NULL),
                          b1b = test_tensor(BIE_DTYPE_B1, 2, shape, NULL);
        struct bie_tensor s4 = test_tensor(BIE_DTYPE_S4, 2, shape, NULL),
                          s4b = test_tensor(BIE_DTYPE_S4, 2, shape, NULL);
        struct bie_tensor i8 = test_tensor(BIE_DTYPE_I8, 2, shape, NULL);
        size_t b1_bytes = 0, s4_bytes = 0;
        bie_tensor_nbytes(&b1, &b1_bytes);
        bie_tensor_nbytes(&s4, &s4_bytes);
        // B1: sign of any value, then +-scale back, and the same bytes again.
        test_fill_uniform(&src, -3.0f, 3.0f);
        CHECK_OK(ctx, bie_pack(ctx, &src, NULL, &b1));
        CHECK_OK(ctx, bie_unpack(ctx, &b1, &scale_t, &back));
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            const int64_t idx[2] = {i / shape[1], i % shape[1]};
            const double v = bie_load(&src, bie_offset(&src, idx));
            if (((float *)back.data)[i] != (v >= 0 ? scale : -scale)) bad++;
        }
        CHECK(bad == 0, "b1 from %s: %d wrong signs", bie_dtype_name(sd), bad);
        CHECK_OK(ctx, bie_pack(ctx, &back, NULL, &b1b));
        CHECK(memcmp(b1.data, b1b.data, b1_bytes) == 0, "b1 repack from %s differs", bie_dtype_name(sd));
        // S4 from integer codes (out of range ones clamp), with scale for floats.
        for (int64_t i = 0; i < n; i++) {
            const int64_t idx[2] = {i / shape[1], i % shape[1]};
            const int q = (int)test_rand_int(-10, 9);
            bie_store(&src, bie_offset(&src, idx), sd == BIE_DTYPE_I8 ? q : q * (double)scale);
        }
        CHECK_OK(ctx, bie_pack(ctx, &src, sd == BIE_DTYPE_I8 ? NULL : &scale_t, &s4));
        CHECK_OK(ctx, bie_unpack(ctx, &s4, sd == BIE_DTYPE_I8 ? NULL : &scale_t, &back));
        bad = 0;
        for (int64_t i = 0; i < n; i++) {
            const int64_t idx[2] = {i / shape[1], i % shape[1]};
            double q = bie_load(&src, bie_offset(&src, idx)) / (sd == BIE_DTYPE_I8 ? 1.0 : scale);
            q = q < -8 ? -8 : q > 7 ? 7 : q;
            if (((float *)back.data)[i] != (float)(q * (sd == BIE_DTYPE_I8 ? 1.0 : scale))) bad++;
        }
        CHECK(bad == 0, "s4 from %s: %d wrong codes", bie_dtype_name(sd), bad);
        CHECK_OK(ctx, bie_unpack(ctx, &s4, NULL, &i8)); // codes as i8
        CHECK_OK(ctx, bie_pack(ctx, &i8, NULL, &s4b));
        CHECK(memcmp(s4.data, s4b.data, s4_bytes) == 0, "s4 -> i8 -> s4 differs");
        // I8 quantization of floats: clamp(rne(v / scale), -128, 127), including halves.
        if (sd != BIE_DTYPE_I8) {
            for (int64_t i = 0; i < n; i++) {
                const int64_t idx[2] = {i / shape[1], i % shape[1]};
                bie_store(&src, bie_offset(&src, idx), test_rand_int(-300, 300) * 0.5 * scale);
            }
            CHECK_OK(ctx, bie_pack(ctx, &src, &scale_t, &i8));
            CHECK_OK(ctx, bie_unpack(ctx, &i8, &scale_t, &back));
            bad = 0;
            for (int64_t i = 0; i < n; i++) {
                const int64_t idx[2] = {i / shape[1], i % shape[1]};
                double q = nearbyint((double)((float)bie_load(&src, bie_offset(&src, idx)) / scale));
                q = q < -128 ? -128 : q > 127 ? 127 : q;
                if (((int8_t *)i8.data)[i] != (int8_t)q || ((float *)back.data)[i] != (float)(q * scale)) bad++;
            }
            CHECK(bad == 0, "i8 quantization from %s: %d wrong", bie_dtype_name(sd), bad);
        }
        // B1 -> i8 gives +-1; f16 / bf16 destinations hold +-scale exactly.
        CHECK_OK(ctx, bie_unpack(ctx, &b1, NULL, &i8));
        struct bie_tensor h = test_tensor(test_rand_int(0, 1) ? BIE_DTYPE_F16 : BIE_DTYPE_BF16, 2, shape, NULL);
        CHECK_OK(ctx, bie_unpack(ctx, &b1, &scale_t, &h));
        bad = 0;
        for (int64_t i = 0; i < n; i++) {
            const int64_t idx[2] = {i / shape[1], i % shape[1]};
            const double bit = bie_load(&b1, bie_offset(&b1, idx));
            if (((int8_t *)i8.data)[i] != bit || bie_load(&h, bie_offset(&h, idx)) != bit * scale) bad++;
        }
        CHECK(bad == 0, "b1 unpack to i8 / %s: %d wrong", bie_dtype_name(h.dtype), bad);
        struct bie_tensor * ts[9] = {&scale_t, &src, &back, &b1, &b1b, &s4, &s4b, &i8, &h};
        for (int i = 0; i < 9; i++) test_tensor_free(ts[i]);
    }
}

// Garbage in the padding bits of packed rows leaks nowhere: not into unpack, not into a layer's
// output; and pack writes only the view's elements (the padding and the bytes around the view
// keep their content).
static void test_padding_never_leaks(void) {
    const int64_t odd[4] = {1, 7, 13, 33};
    for (int t = 0; t < 4; t++) {
        const int64_t k = odd[t], o = 3;
        const int64_t shape[2] = {o, k};
        struct bie_tensor w = test_tensor(BIE_DTYPE_F32, 2, shape, NULL);
        test_fill_uniform(&w, -8.0f, 8.0f);
        for (int d = 0; d < 2; d++) {
            const enum bie_dtype pd = d ? BIE_DTYPE_S4 : BIE_DTYPE_B1;
            struct bie_tensor clean = test_tensor(pd, 2, shape, NULL), dirty = test_tensor(pd, 2, shape, NULL);
            size_t bytes = 0;
            bie_tensor_nbytes(&clean, &bytes);
            memset(dirty.data, 0xFF, bytes + 64); // padding and the guard bytes past the view
            CHECK_OK(ctx, bie_pack(ctx, &w, NULL, &clean));
            CHECK_OK(ctx, bie_pack(ctx, &w, NULL, &dirty));
            int guard = 0, pad_kept = 0;
            for (size_t i = bytes; i < bytes + 64; i++) guard += ((uint8_t *)dirty.data)[i] != 0xFF;
            const int per = d ? 2 : 8;
            const int64_t row = (k + per - 1) / per;
            for (int64_t r = 0; r < o && k % per; r++) {
                const uint8_t last = ((uint8_t *)dirty.data)[r * row + row - 1];
                pad_kept += d ? (last & 15) == 15 : (last >> (k % 8)) == (0xFF >> (k % 8));
            }
            CHECK(guard == 0, "k %lld %s: pack wrote %d bytes past the view", (long long)k, bie_dtype_name(pd), guard);
            CHECK(k % per == 0 || pad_kept == o, "k %lld %s: pack overwrote row padding", (long long)k,
                  bie_dtype_name(pd));
            struct bie_tensor u1 = test_tensor(BIE_DTYPE_F32, 2, shape, NULL),
                              u2 = test_tensor(BIE_DTYPE_F32, 2, shape, NULL);
            CHECK_OK(ctx, bie_unpack(ctx, &clean, NULL, &u1));
            CHECK_OK(ctx, bie_unpack(ctx, &dirty, NULL, &u2));
            CHECK(memcmp(u1.data, u2.data, sizeof(float) * (size_t)(o * k)) == 0,
                  "k %lld %s: padding leaks into unpack", (long long)k, bie_dtype_name(pd));
            // A layer reading the dirty weight gives the same bits as with the clean one.
            const int64_t xshape[2] = {2, k}, yshape[2] = {2, o};
            struct bie_tensor x = test_tensor(BIE_DTYPE_F32, 2, xshape, NULL);
            test_fill_uniform(&x, -3.0f, 3.0f);
            struct bie_tensor y1 = test_tensor(BIE_DTYPE_I32, 2, yshape, NULL),
                              y2 = test_tensor(BIE_DTYPE_I32, 2, yshape, NULL);
            struct bie_tensor sa = test_scalar(0.5f), sw = test_scalar(1.0f);
            const struct bie_linear_desc ld = {d ? BIE_QUANT_INT4 : BIE_QUANT_BINARY, k, o};
            struct bie_forward_args a = {.x = &x, .weight = &clean, .scale_a = &sa, .scale_w = &sw, .y = &y1};
            CHECK_OK(ctx, bie_linear_forward(ctx, &ld, &a));
            a.weight = &dirty;
            a.y = &y2;
            CHECK_OK(ctx, bie_linear_forward(ctx, &ld, &a));
            CHECK(memcmp(y1.data, y2.data, sizeof(int32_t) * 2 * (size_t)o) == 0,
                  "k %lld %s: padding leaks into the layer", (long long)k, bie_dtype_name(pd));
            struct bie_tensor * ts[8] = {&clean, &dirty, &u1, &u2, &x, &y1, &y2, &sa};
            for (int i = 0; i < 8; i++) test_tensor_free(ts[i]);
            test_tensor_free(&sw);
        }
        test_tensor_free(&w);
    }
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    for (int b = 0; b < 2; b++) { // the reference, then the default backend
        struct bie_context_params p;
        bie_context_params_default(&p);
        p.backend = b ? BIE_BACKEND_AUTO : BIE_BACKEND_REF;
        if (bie_context_create(&p, &ctx) != BIE_STATUS_OK) return 2;
        test_hand_bytes();
        test_layout_rule();
        test_round_trips();
        test_padding_never_leaks();
        bie_context_destroy(ctx);
    }
    return test_finish("test-pack");
}
