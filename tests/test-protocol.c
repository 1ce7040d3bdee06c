// SPDX-License-Identifier: Apache-2.0
// test-protocol.c: the layer protocol helpers against hand-computed values.
//   bie_activation_scale_init: binary 2*mean|x| (4*mean|x| when not symmetric), n-bit 2*mean|x|/11.269
//   bie_weight_scale_init:     binary mean|W|, 4-bit max(2*mean|W|/5.6345, 1e-5), 8-bit 2*mean|W|/11.269
//   bie_weight_to_latent_int8: c = W - mean(W), q = rne(c*127/max|c|) (max-abs, not Bitorch
//                              Engine's signed max), q == 0 -> sign(c) with sign(0) = +1
// plus the error cases (all-zero input, non-finite input, wrong output dtype or shape).
#include "test-util.h"

static bie_context_t * ctx;

static struct bie_tensor vec(int64_t n, const float * v) {
    struct bie_tensor t = test_tensor(BIE_DTYPE_F32, 1, &n, NULL);
    memcpy(t.data, v, sizeof(float) * (size_t)n);
    return t;
}

static void test_scales(void) {
    const float xv[4] = {1, -2, 3, -4}; // mean|x| = 2.5
    struct bie_tensor x = vec(4, xv), out = test_scalar(0.0f);
    CHECK_OK(ctx, bie_activation_scale_init(ctx, BIE_QUANT_BINARY, 1, &x, &out));
    CHECK(((float *)out.data)[0] == 5.0f, "binary symmetric activation scale %g, want 5",
          (double)((float *)out.data)[0]);
    CHECK_OK(ctx, bie_activation_scale_init(ctx, BIE_QUANT_BINARY, 0, &x, &out));
    CHECK(((float *)out.data)[0] == 10.0f, "binary asymmetric activation scale %g, want 10",
          (double)((float *)out.data)[0]);
    for (int q = 4; q <= 8; q += 4) {
        CHECK_OK(ctx, bie_activation_scale_init(ctx, (enum bie_quant)q, 1, &x, &out));
        CHECK(((float *)out.data)[0] == (float)(5.0 / 11.269), "%d-bit activation scale %.9g, want %.9g", q,
              (double)((float *)out.data)[0], (double)(float)(5.0 / 11.269));
    }
    CHECK_OK(ctx, bie_weight_scale_init(ctx, BIE_QUANT_BINARY, &x, &out));
    CHECK(((float *)out.data)[0] == 2.5f, "binary weight scale %g, want 2.5", (double)((float *)out.data)[0]);
    CHECK_OK(ctx, bie_weight_scale_init(ctx, BIE_QUANT_INT4, &x, &out));
    CHECK(((float *)out.data)[0] == (float)(5.0 / 5.6345), "4-bit weight scale %.9g", (double)((float *)out.data)[0]);
    CHECK_OK(ctx, bie_weight_scale_init(ctx, BIE_QUANT_INT8, &x, &out));
    CHECK(((float *)out.data)[0] == (float)(5.0 / 11.269), "8-bit weight scale %.9g", (double)((float *)out.data)[0]);
    // 4-bit: the 1e-5 floor
    const float tiny[2] = {1e-6f, -1e-6f};
    struct bie_tensor t = vec(2, tiny);
    CHECK_OK(ctx, bie_weight_scale_init(ctx, BIE_QUANT_INT4, &t, &out));
    CHECK(((float *)out.data)[0] == 1e-5f, "4-bit weight scale floor %g, want 1e-5", (double)((float *)out.data)[0]);
    // An f16 output is rounded (RNE): 2*mean|x| with mean|x| = 1/3 -> 0.6667 in f16.
    const float th[3] = {1, 0, 0};
    struct bie_tensor x3 = vec(3, th), oh = test_tensor(BIE_DTYPE_F16, 0, NULL, NULL);
    CHECK_OK(ctx, bie_activation_scale_init(ctx, BIE_QUANT_BINARY, 1, &x3, &oh));
    CHECK(bie_load(&oh, 0) == bie_f16_to_f32(bie_f32_to_f16((float)(2.0 / 3.0))), "f16 scale %g", bie_load(&oh, 0));
    // A non-contiguous view: every other element of [1, 100, -3, 100] -> mean|x| = 2.
    const float sv[4] = {1, 100, -3, 100};
    struct bie_tensor s = vec(4, sv);
    s.shape[0] = 2;
    s.stride[0] = 2;
    CHECK_OK(ctx, bie_weight_scale_init(ctx, BIE_QUANT_BINARY, &s, &out));
    CHECK(((float *)out.data)[0] == 2.0f, "strided weight scale %g, want 2", (double)((float *)out.data)[0]);
    // Errors: an all-zero input gives no scale (except the 4-bit weight floor); non-finite values.
    const float zeros[3] = {0, -0.0f, 0};
    struct bie_tensor z = vec(3, zeros);
    ((float *)out.data)[0] = 7.0f;
    CHECK(bie_activation_scale_init(ctx, BIE_QUANT_BINARY, 1, &z, &out) == BIE_STATUS_INVALID_ARGUMENT &&
              strstr(bie_context_last_error(ctx), "x") && ((float *)out.data)[0] == 7.0f,
          "all-zero activations: %s", bie_context_last_error(ctx));
    CHECK(bie_activation_scale_init(ctx, BIE_QUANT_INT8, 1, &z, &out) == BIE_STATUS_INVALID_ARGUMENT, "all-zero 8-bit");
    CHECK(bie_weight_scale_init(ctx, BIE_QUANT_BINARY, &z, &out) == BIE_STATUS_INVALID_ARGUMENT &&
              strstr(bie_context_last_error(ctx), "w"),
          "all-zero binary weight: %s", bie_context_last_error(ctx));
    CHECK(bie_weight_scale_init(ctx, BIE_QUANT_INT8, &z, &out) == BIE_STATUS_INVALID_ARGUMENT, "all-zero 8-bit weight");
    CHECK_OK(ctx, bie_weight_scale_init(ctx, BIE_QUANT_INT4, &z, &out));
    CHECK(((float *)out.data)[0] == 1e-5f, "all-zero 4-bit weight takes the floor: %g", (double)((float *)out.data)[0]);
    const float bad[2] = {1.0f, INFINITY};
    struct bie_tensor b = vec(2, bad);
    CHECK(bie_activation_scale_init(ctx, BIE_QUANT_BINARY, 1, &b, &out) == BIE_STATUS_INVALID_ARGUMENT, "inf input");
    ((float *)b.data)[1] = NAN;
    CHECK(bie_weight_scale_init(ctx, BIE_QUANT_BINARY, &b, &out) == BIE_STATUS_INVALID_ARGUMENT &&
              strstr(bie_context_last_error(ctx), "finite"),
          "nan input: %s", bie_context_last_error(ctx));
    CHECK(bie_activation_scale_init(ctx, (enum bie_quant)3, 1, &x, &out) == BIE_STATUS_INVALID_ARGUMENT &&
              strstr(bie_context_last_error(ctx), "quant"),
          "bad quant: %s", bie_context_last_error(ctx));
    struct bie_tensor o2 = vec(2, xv);
    CHECK(bie_weight_scale_init(ctx, BIE_QUANT_BINARY, &x, &o2) == BIE_STATUS_INVALID_ARGUMENT &&
              strstr(bie_context_last_error(ctx), "out_scale"),
          "two-element out_scale: %s", bie_context_last_error(ctx));
    struct bie_tensor oi = test_tensor(BIE_DTYPE_I32, 0, NULL, NULL);
    CHECK(bie_weight_scale_init(ctx, BIE_QUANT_BINARY, &x, &oi) == BIE_STATUS_INVALID_ARGUMENT, "i32 out_scale");
    struct bie_tensor xi = test_tensor(BIE_DTYPE_I8, 1, (const int64_t[]){3}, NULL);
    CHECK(bie_weight_scale_init(ctx, BIE_QUANT_BINARY, &xi, &out) == BIE_STATUS_INVALID_ARGUMENT, "i8 input");
    CHECK(bie_activation_scale_init(NULL, BIE_QUANT_BINARY, 1, &x, &out) == BIE_STATUS_INVALID_ARGUMENT, "NULL ctx");
    CHECK(bie_activation_scale_init(ctx, BIE_QUANT_BINARY, 1, NULL, &out) == BIE_STATUS_INVALID_ARGUMENT, "NULL x");
    CHECK(bie_weight_scale_init(ctx, BIE_QUANT_BINARY, &x, NULL) == BIE_STATUS_INVALID_ARGUMENT, "NULL out");
    // a device out_scale takes a weight on its device (refused before any device is touched)
    struct bie_tensor od = out;
    od.device_type = BIE_DEVICE_CUDA;
    CHECK(bie_weight_scale_init(ctx, BIE_QUANT_INT8, &x, &od) == BIE_STATUS_INVALID_ARGUMENT &&
              strstr(bie_context_last_error(ctx), "device of w"),
          "CPU w, CUDA out_scale: %s", bie_context_last_error(ctx));
    // CUDA tensors of more than 4 dimensions: refused by name, before any device is touched
    const int64_t s5[5] = {2, 1, 3, 1, 2}, ones[5] = {1, 1, 1, 1, 1};
    struct bie_tensor w5 = test_tensor(BIE_DTYPE_F32, 5, s5, NULL), o5 = test_tensor(BIE_DTYPE_F32, 5, ones, NULL);
    struct bie_tensor w5d = w5, o5d = o5, xd = x;
    w5d.device_type = o5d.device_type = xd.device_type = BIE_DEVICE_CUDA;
    const struct {
        const char * what;
        struct bie_tensor *w, *out;
        const char * name;
    } dims[3] = {{"5-d CUDA w", &w5d, &od, "w: a CUDA tensor of 5 dimensions"},
                 {"5-d CUDA out_scale", &xd, &o5d, "out_scale: a CUDA tensor of 5 dimensions"},
                 {"5-d CUDA w, CPU out_scale", &w5d, &out, "w: a CUDA tensor of 5 dimensions"}};
    for (int i = 0; i < 3; i++)
        CHECK(bie_weight_scale_init(ctx, BIE_QUANT_INT8, dims[i].w, dims[i].out) == BIE_STATUS_UNSUPPORTED &&
                  strstr(bie_context_last_error(ctx), dims[i].name),
              "%s: %s", dims[i].what, bie_context_last_error(ctx));
    CHECK(bie_activation_scale_init(ctx, BIE_QUANT_BINARY, 1, &w5d, &out) == BIE_STATUS_UNSUPPORTED &&
              strstr(bie_context_last_error(ctx), "x: a CUDA tensor of 5 dimensions"),
          "5-d CUDA x: %s", bie_context_last_error(ctx));
    struct bie_tensor * ts[13] = {&x, &out, &t, &x3, &oh, &s, &z, &b, &o2, &oi, &xi, &w5, &o5};
    for (int i = 0; i < 13; i++) test_tensor_free(ts[i]);
}

static void latent_case(const char * what, int64_t n, const float * w, const int8_t * want) {
    struct bie_tensor wt = vec(n, w), q = test_tensor(BIE_DTYPE_I8, 1, &n, NULL);
    CHECK_OK(ctx, bie_weight_to_latent_int8(ctx, &wt, &q));
    for (int64_t i = 0; i < n; i++)
        CHECK(((int8_t *)q.data)[i] == want[i], "%s: q[%lld] = %d, want %d", what, (long long)i, ((int8_t *)q.data)[i],
              want[i]);
    test_tensor_free(&wt);
    test_tensor_free(&q);
}

static void test_latent(void) {
    // mean 0.375, c = [0.125, -1.375, 1.625, -0.375], 127/1.625 = 78.15: q = [10, -107, 127, -29]
    latent_case("centred", 4, (const float[]){0.5f, -1.0f, 2.0f, 0.0f}, (const int8_t[]){10, -107, 127, -29});
    // max-abs: mean -1, c = [1, 1, 1, -3]: q = rne(c * 127/3) = [42, 42, 42, -127]; the signed
    // max (1) would give [127, 127, 127, -127].
    latent_case("max-abs", 4, (const float[]){0, 0, 0, -4}, (const int8_t[]){42, 42, 42, -127});
    // zeros take the sign of c, and sign(0) = +1: c = W (mean 0), 127/8 = 15.875
    latent_case("zeros -> sign", 5, (const float[]){8, 0.01f, -0.01f, 0, -8}, (const int8_t[]){127, 1, -1, 1, -127});
    // round half to even: 127/2 = 63.5 -> 64
    latent_case("half to even", 4, (const float[]){2, 1, -1, -2}, (const int8_t[]){127, 64, -64, -127});
    // all-equal and all-zero weights: c = 0 everywhere -> all +1
    latent_case("constant", 3, (const float[]){3, 3, 3}, (const int8_t[]){1, 1, 1});
    latent_case("all zero", 2, (const float[]){0, 0}, (const int8_t[]){1, 1});
    // 2-D, f16 input
    const int64_t shape[2] = {2, 2};
    struct bie_tensor w = test_tensor(BIE_DTYPE_F16, 2, shape, NULL), q = test_tensor(BIE_DTYPE_I8, 2, shape, NULL);
    const float v[4] = {1, -1, 3, -3};
    for (int i = 0; i < 4; i++) bie_store(&w, i, v[i]);
    CHECK_OK(ctx, bie_weight_to_latent_int8(ctx, &w, &q));
    const int8_t want[4] = {42, -42, 127, -127};
    CHECK(memcmp(q.data, want, 4) == 0, "f16 2-D latent %d %d %d %d", ((int8_t *)q.data)[0], ((int8_t *)q.data)[1],
          ((int8_t *)q.data)[2], ((int8_t *)q.data)[3]);
    // errors
    struct bie_tensor qf = test_tensor(BIE_DTYPE_F32, 2, shape, NULL);
    CHECK(bie_weight_to_latent_int8(ctx, &w, &qf) == BIE_STATUS_INVALID_ARGUMENT &&
              strstr(bie_context_last_error(ctx), "out_i8"),
          "f32 out_i8: %s", bie_context_last_error(ctx));
    const int64_t other[2] = {4, 1};
    struct bie_tensor qs = test_tensor(BIE_DTYPE_I8, 2, other, NULL);
    CHECK(bie_weight_to_latent_int8(ctx, &w, &qs) == BIE_STATUS_INVALID_ARGUMENT &&
              strstr(bie_context_last_error(ctx), "shape"),
          "shape mismatch: %s", bie_context_last_error(ctx));
    CHECK(bie_weight_to_latent_int8(ctx, &w, NULL) == BIE_STATUS_INVALID_ARGUMENT, "NULL out");
    CHECK(bie_weight_to_latent_int8(ctx, NULL, &q) == BIE_STATUS_INVALID_ARGUMENT &&
              strstr(bie_context_last_error(ctx), "w"),
          "NULL w: %s", bie_context_last_error(ctx));
    bie_store(&w, 1, NAN);
    CHECK(bie_weight_to_latent_int8(ctx, &w, &q) == BIE_STATUS_INVALID_ARGUMENT, "nan weight");
    test_tensor_free(&w);
    test_tensor_free(&q);
    test_tensor_free(&qf);
    test_tensor_free(&qs);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    if (bie_context_create(NULL, &ctx) != BIE_STATUS_OK) return 2;
    test_scales();
    test_latent();
    bie_context_destroy(ctx);
    return test_finish("test-protocol");
}
