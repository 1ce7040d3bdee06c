// SPDX-License-Identifier: Apache-2.0
// test-errors.c: every error class of the public layer and packing functions, one test each:
// NULL pointers (ctx, desc, args, each tensor and its data), zero / negative / overflowing
// dimensions, mismatched shapes, unsupported dtypes, wrong devices, bad scales (zero, negative,
// NaN, inf), bad conv parameters, bad pad values, B1 inputs where they are not allowed. Each
// check asserts the status and that bie_context_last_error names the argument; the outputs must
// be untouched, and nothing may crash (the suite also runs under ASan/UBSan).
#include "test-util.h"

static bie_context_t * ctx;

// Under AddressSanitizer a failed huge allocation must return NULL (as malloc does) instead of
// stopping the program, so that the out-of-memory status can be checked.
const char * __asan_default_options(void);
const char * __asan_default_options(void) { return "allocator_may_return_null=1"; }

#define EXPECT(call, want_status, name) TEST_EXPECT_STATUS(ctx, call, want_status, name)

// A valid layer call and all its tensors.
struct fixture {
    bool conv;
    struct bie_linear_desc ld;
    struct bie_conv2d_desc cd;
    struct bie_tensor x, bias, w, sa, sw, y, gy, gx, gw, gs, gb;
};

static void fixture_make(struct fixture * f, bool conv) {
    memset(f, 0, sizeof *f);
    f->conv = conv;
    // x, weight and y (and their gradients): conv NCHW / OIHW, or linear [rows, features]
    static const int64_t conv_shapes[3][4] = {{2, 3, 5, 5}, {4, 3, 3, 3}, {2, 4, 5, 5}};
    static const int64_t linear_shapes[3][4] = {{3, 5}, {4, 5}, {3, 4}};
    const int64_t(*shapes)[4] = conv ? conv_shapes : linear_shapes;
    const int nd = conv ? 4 : 2;
    if (conv) f->cd = test_conv3x3(3, 4, BIE_PAD_ZERO);
    else f->ld = (struct bie_linear_desc){BIE_QUANT_BINARY, 5, 4};
    f->x = test_tensor(BIE_DTYPE_F32, nd, shapes[0], NULL);
    f->gx = test_tensor(BIE_DTYPE_F32, nd, shapes[0], NULL);
    f->w = test_tensor(BIE_DTYPE_F32, nd, shapes[1], NULL);
    f->gw = test_tensor(BIE_DTYPE_F32, nd, shapes[1], NULL);
    f->y = test_tensor(BIE_DTYPE_F32, nd, shapes[2], NULL);
    f->gy = test_tensor(BIE_DTYPE_F32, nd, shapes[2], NULL);
    const int64_t c = conv ? 3 : 5;
    f->bias = test_tensor(BIE_DTYPE_F32, 1, &c, NULL);
    f->gb = test_tensor(BIE_DTYPE_F32, 1, &c, NULL);
    f->sa = test_scalar(0.5f);
    f->sw = test_scalar(0.25f);
    f->gs = test_scalar(0.0f);
    test_fill_uniform(&f->x, -1, 1);
    test_fill_uniform(&f->w, -1, 1);
    test_fill_uniform(&f->gy, -1, 1);
}

static void fixture_free(struct fixture * f) {
    struct bie_tensor * ts[11] = {&f->x,  &f->bias, &f->w,  &f->sa, &f->sw, &f->y,
                                  &f->gy, &f->gx,   &f->gw, &f->gs, &f->gb};
    for (int i = 0; i < 11; i++) test_tensor_free(ts[i]);
}

static struct bie_forward_args fwd_args(struct fixture * f) {
    return (struct bie_forward_args){
        .x = &f->x, .bias_a = &f->bias, .weight = &f->w, .scale_a = &f->sa, .scale_w = &f->sw, .y = &f->y};
}
static struct bie_backward_args bwd_args(struct fixture * f) {
    return (struct bie_backward_args){&f->x,  &f->bias, &f->w,  &f->sa, &f->sw, &f->gy, &f->gx,
                                      &f->gw, &f->gs,   &f->gb, NULL,   NULL,   NULL,   0.0f};
}

static enum bie_status fwd(struct fixture * f, const struct bie_forward_args * a) {
    return f->conv ? bie_conv2d_forward(ctx, &f->cd, a) : bie_linear_forward(ctx, &f->ld, a);
}
static enum bie_status bwd(struct fixture * f, const struct bie_backward_args * a) {
    return f->conv ? bie_conv2d_backward(ctx, &f->cd, a) : bie_linear_backward(ctx, &f->ld, a);
}

// y is filled with a sentinel before each failing call; it must still hold it afterwards.
static void sentinel(struct fixture * f) {
    int64_t idx[BIE_MAX_DIMS] = {0};
    do bie_store(&f->y, bie_offset(&f->y, idx), 12345.0);
    while (bie_next_index(&f->y, idx));
}
static bool sentinel_kept(struct fixture * f) {
    int64_t idx[BIE_MAX_DIMS] = {0};
    do
        if (bie_load(&f->y, bie_offset(&f->y, idx)) != 12345.0) return false;
    while (bie_next_index(&f->y, idx));
    return true;
}

static void test_null_pointers(struct fixture * f) {
    struct bie_forward_args a = fwd_args(f);
    struct bie_backward_args b = bwd_args(f);
    CHECK_OK(ctx, fwd(f, &a));
    CHECK_OK(ctx, bwd(f, &b));
    CHECK((f->conv ? bie_conv2d_forward(NULL, &f->cd, &a) : bie_linear_forward(NULL, &f->ld, &a)) ==
              BIE_STATUS_INVALID_ARGUMENT,
          "NULL ctx");
    CHECK((f->conv ? bie_conv2d_backward(NULL, &f->cd, &b) : bie_linear_backward(NULL, &f->ld, &b)) ==
              BIE_STATUS_INVALID_ARGUMENT,
          "NULL ctx (backward)");
    EXPECT(f->conv ? bie_conv2d_forward(ctx, NULL, &a) : bie_linear_forward(ctx, NULL, &a), BIE_STATUS_INVALID_ARGUMENT,
           "desc");
    EXPECT(f->conv ? bie_conv2d_backward(ctx, NULL, &b) : bie_linear_backward(ctx, NULL, &b),
           BIE_STATUS_INVALID_ARGUMENT, "desc");
    EXPECT(f->conv ? bie_conv2d_forward(ctx, &f->cd, NULL) : bie_linear_forward(ctx, &f->ld, NULL),
           BIE_STATUS_INVALID_ARGUMENT, "args");
    EXPECT(f->conv ? bie_conv2d_backward(ctx, &f->cd, NULL) : bie_linear_backward(ctx, &f->ld, NULL),
           BIE_STATUS_INVALID_ARGUMENT, "args");
    // each tensor pointer of the forward
    const struct bie_tensor ** fp[5] = {&a.x, &a.weight, &a.scale_a, &a.scale_w, (const struct bie_tensor **)&a.y};
    const char * fn[5] = {"x", "weight", "scale_a", "scale_w", "y"};
    for (int i = 0; i < 5; i++) {
        a = fwd_args(f);
        *fp[i] = NULL;
        sentinel(f);
        EXPECT(fwd(f, &a), BIE_STATUS_INVALID_ARGUMENT, fn[i]);
        if (i < 4) CHECK(sentinel_kept(f), "y written after a failed call (NULL %s)", fn[i]);
    }
    // each tensor's data
    struct bie_tensor * ft[6] = {&f->x, &f->bias, &f->w, &f->sa, &f->sw, &f->y};
    const char * ftn[6] = {"x", "bias_a", "weight", "scale_a", "scale_w", "y"};
    for (int i = 0; i < 6; i++) {
        a = fwd_args(f);
        void * keep = ft[i]->data;
        ft[i]->data = NULL;
        EXPECT(fwd(f, &a), BIE_STATUS_INVALID_ARGUMENT, ftn[i]);
        ft[i]->data = keep;
    }
    // the backward's tensors: required ones NULL, optional ones with NULL data
    const struct bie_tensor ** bp[5] = {&b.x, &b.weight, &b.scale_a, &b.scale_w, &b.grad_y};
    const char * bn[5] = {"x", "weight", "scale_a", "scale_w", "grad_y"};
    for (int i = 0; i < 5; i++) {
        b = bwd_args(f);
        *bp[i] = NULL;
        EXPECT(bwd(f, &b), BIE_STATUS_INVALID_ARGUMENT, bn[i]);
    }
    struct bie_tensor * bt[4] = {&f->gx, &f->gw, &f->gs, &f->gb};
    const char * btn[4] = {"grad_x", "grad_weight", "grad_scale_a", "grad_bias_a"};
    for (int i = 0; i < 4; i++) {
        b = bwd_args(f);
        void * keep = bt[i]->data;
        bt[i]->data = NULL;
        EXPECT(bwd(f, &b), BIE_STATUS_INVALID_ARGUMENT, btn[i]);
        bt[i]->data = keep;
    }
    // every gradient NULL is a valid (empty) request
    b = bwd_args(f);
    b.grad_x = b.grad_weight = b.grad_scale_a = b.grad_bias_a = NULL;
    CHECK_OK(ctx, bwd(f, &b));
}

// The forward with *field = v fails naming `name`; *field is restored after.
static void expect_bad_i64(struct fixture * f, const struct bie_forward_args * a, int64_t * field, int64_t v,
                           const char * name) {
    const int64_t keep = *field;
    *field = v;
    EXPECT(fwd(f, a), BIE_STATUS_INVALID_ARGUMENT, name);
    *field = keep;
}

static void test_dimensions(struct fixture * f) {
    struct bie_forward_args a = fwd_args(f);
    // zero and negative sizes in the descriptor
    if (f->conv) {
        expect_bad_i64(f, &a, &f->cd.in_channels, 0, "in_channels");
        expect_bad_i64(f, &a, &f->cd.out_channels, -4, "out_channels");
        struct bie_conv2d_desc keep = f->cd;
        f->cd.in_channels = 3;
        f->cd.kernel[0] = f->cd.kernel[1] = 1 << 20; // C*kh*kw overflows 32-bit accumulation
        EXPECT(fwd(f, &a), BIE_STATUS_INVALID_ARGUMENT, "desc");
        f->cd = keep;
    } else {
        expect_bad_i64(f, &a, &f->ld.in_features, 0, "in_features");
        expect_bad_i64(f, &a, &f->ld.out_features, -1, "out_features");
        expect_bad_i64(f, &a, &f->ld.in_features, (int64_t)1 << 40, "x");
    }
    // zero, negative and overflowing tensor shapes
    expect_bad_i64(f, &a, &f->x.shape[0], 0, "x");
    expect_bad_i64(f, &a, &f->x.shape[0], -2, "x");
    expect_bad_i64(f, &a, &f->x.shape[0], INT64_MAX / 2, "x");
    expect_bad_i64(f, &a, &f->w.stride[0], INT64_MAX / 4, "weight");
    expect_bad_i64(f, &a, &f->w.stride[0], -1, "weight");
    const int32_t keepn = f->x.ndim;
    f->x.ndim = BIE_MAX_DIMS + 1;
    EXPECT(fwd(f, &a), BIE_STATUS_INVALID_ARGUMENT, "x");
    f->x.ndim = keepn;
    // a broadcast (stride 0) output
    expect_bad_i64(f, &a, &f->y.stride[0], 0, "y");
    CHECK_OK(ctx, fwd(f, &a));
}

static void test_shapes(struct fixture * f) {
    struct bie_forward_args a = fwd_args(f);
    struct bie_tensor * ts[4] = {&f->x, &f->w, &f->y, &f->bias};
    const char * names[4] = {"x", "weight", "y", "bias_a"};
    for (int i = 0; i < 4; i++) { // one dimension too small
        const int32_t d = ts[i]->ndim - 1;
        ts[i]->shape[d]--;
        if (ts[i]->shape[d] == 0) ts[i]->shape[d] = 2;
        sentinel(f);
        EXPECT(fwd(f, &a), BIE_STATUS_INVALID_ARGUMENT, names[i]);
        ts[i]->shape[d]++;
        if (i != 2) CHECK(sentinel_kept(f), "y written after a failed call (%s shape)", names[i]);
    }
    // a rank mismatch
    f->w.ndim = f->conv ? 3 : 1;
    EXPECT(fwd(f, &a), BIE_STATUS_INVALID_ARGUMENT, "weight");
    f->w.ndim = f->conv ? 4 : 2;
    if (f->conv) {
        f->x.ndim = 3;
        EXPECT(fwd(f, &a), BIE_STATUS_INVALID_ARGUMENT, "x");
        f->x.ndim = 4;
        f->y.shape[3] = 4; // output size follows from the geometry
        EXPECT(fwd(f, &a), BIE_STATUS_INVALID_ARGUMENT, "y");
        f->y.shape[3] = 5;
    } else {
        // leading dims that cannot be flattened: x [3, 1, 5] viewed as [1, 3, 5] with odd strides
        const int64_t shape3[3] = {3, 2, 5}, ys3[3] = {3, 2, 4};
        struct bie_tensor x3 = test_tensor(BIE_DTYPE_F32, 3, shape3, NULL),
                          y3 = test_tensor(BIE_DTYPE_F32, 3, ys3, NULL);
        x3.stride[0] = 5; // rows of dim 1 at 10 apart, of dim 0 at 5: not one row stride
        x3.stride[1] = 15;
        struct bie_forward_args a3 = a;
        a3.x = &x3;
        a3.y = &y3;
        EXPECT(fwd(f, &a3), BIE_STATUS_INVALID_ARGUMENT, "x");
        const int64_t ys2[3] = {3, 3, 4};
        struct bie_tensor y2 = test_tensor(BIE_DTYPE_F32, 3, ys2, NULL);
        a3.x = &f->x;
        a3.y = &y2; // y's leading dims must be x's
        EXPECT(fwd(f, &a3), BIE_STATUS_INVALID_ARGUMENT, "y");
        test_tensor_free(&x3);
        test_tensor_free(&y3);
        test_tensor_free(&y2);
    }
    // backward shapes
    struct bie_backward_args b = bwd_args(f);
    struct bie_tensor * gts[5] = {&f->gy, &f->gx, &f->gw, &f->gb, &f->gs};
    const char * gnames[5] = {"grad_y", "grad_x", "grad_weight", "grad_bias_a", "grad_scale_a"};
    for (int i = 0; i < 4; i++) {
        const int32_t d = gts[i]->ndim - 1;
        gts[i]->shape[d]++;
        EXPECT(bwd(f, &b), BIE_STATUS_INVALID_ARGUMENT, gnames[i]);
        gts[i]->shape[d]--;
    }
    const int64_t two = 2;
    struct bie_tensor gs2 = test_tensor(BIE_DTYPE_F32, 1, &two, NULL);
    b.grad_scale_a = &gs2;
    EXPECT(bwd(f, &b), BIE_STATUS_INVALID_ARGUMENT, gnames[4]);
    test_tensor_free(&gs2);
}

static void test_dtypes(struct fixture * f) {
    struct bie_forward_args a = fwd_args(f);
    struct {
        struct bie_tensor * t;
        enum bie_dtype d;
        const char * name;
        enum bie_quant q;
    } cases[] = {
        {&f->x, BIE_DTYPE_I32, "x", BIE_QUANT_BINARY},      {&f->x, BIE_DTYPE_I8, "x", BIE_QUANT_INT8},
        {&f->x, BIE_DTYPE_F64, "x", BIE_QUANT_BINARY},      {&f->w, BIE_DTYPE_U8, "weight", BIE_QUANT_BINARY},
        {&f->w, BIE_DTYPE_S4, "weight", BIE_QUANT_BINARY},  {&f->w, BIE_DTYPE_B1, "weight", BIE_QUANT_INT4},
        {&f->w, BIE_DTYPE_S4, "weight", BIE_QUANT_INT8},    {&f->w, BIE_DTYPE_I32, "weight", BIE_QUANT_INT8},
        {&f->y, BIE_DTYPE_I8, "y", BIE_QUANT_BINARY},       {&f->y, BIE_DTYPE_B1, "y", BIE_QUANT_INT4},
        {&f->y, BIE_DTYPE_S4, "y", BIE_QUANT_BINARY},       {&f->bias, BIE_DTYPE_I8, "bias_a", BIE_QUANT_BINARY},
        {&f->sa, BIE_DTYPE_I8, "scale_a", BIE_QUANT_INT4},  {&f->sw, BIE_DTYPE_I32, "scale_w", BIE_QUANT_INT8},
        {&f->x, (enum bie_dtype)77, "x", BIE_QUANT_BINARY},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const enum bie_dtype keep = cases[i].t->dtype;
        cases[i].t->dtype = cases[i].d;
        f->ld.quant = f->cd.quant = cases[i].q;
        EXPECT(fwd(f, &a), BIE_STATUS_INVALID_ARGUMENT, cases[i].name);
        cases[i].t->dtype = keep;
    }
    f->ld.quant = f->cd.quant = (enum bie_quant)2;
    EXPECT(fwd(f, &a), BIE_STATUS_INVALID_ARGUMENT, "quant");
    f->ld.quant = f->cd.quant = BIE_QUANT_BINARY;
    // gradients must be float
    struct bie_backward_args b = bwd_args(f);
    struct bie_tensor * gts[5] = {&f->gy, &f->gx, &f->gw, &f->gb, &f->gs};
    const char * gnames[5] = {"grad_y", "grad_x", "grad_weight", "grad_bias_a", "grad_scale_a"};
    for (int i = 0; i < 5; i++) {
        const enum bie_dtype keep = gts[i]->dtype;
        gts[i]->dtype = BIE_DTYPE_I32;
        EXPECT(bwd(f, &b), BIE_STATUS_INVALID_ARGUMENT, gnames[i]);
        gts[i]->dtype = keep;
    }
    // B1 x: not for n-bit layers, not with bias_a; in backward only as saved bits of a linear layer
    // (with x_mask for grad_x: tests/test-saved-bits.c)
    const int64_t * xs = f->x.shape;
    struct bie_tensor xb = test_tensor(BIE_DTYPE_B1, f->x.ndim, xs, NULL);
    a.x = &xb;
    EXPECT(fwd(f, &a), BIE_STATUS_INVALID_ARGUMENT, "bias_a");
    a.bias_a = NULL;
    CHECK_OK(ctx, fwd(f, &a));
    f->ld.quant = f->cd.quant = BIE_QUANT_INT8;
    EXPECT(fwd(f, &a), BIE_STATUS_INVALID_ARGUMENT, "x");
    f->ld.quant = f->cd.quant = BIE_QUANT_BINARY;
    b.x = &xb;
    b.bias_a = NULL;
    EXPECT(bwd(f, &b), BIE_STATUS_INVALID_ARGUMENT, "x_mask"); // (saved bits need their mask for grad_x)
    test_tensor_free(&xb);
}

static void test_devices(struct fixture * f) {
    struct bie_forward_args a = fwd_args(f);
    struct bie_tensor * ts[5] = {&f->w, &f->bias, &f->y, &f->sa, &f->sw};
    const char * names[5] = {"weight", "bias_a", "y", "scale_a", "scale_w"};
    for (int i = 0; i < 5; i++) { // a CUDA tensor beside a CPU x (checked before any device access)
        ts[i]->device_type = BIE_DEVICE_CUDA;
        EXPECT(fwd(f, &a), BIE_STATUS_INVALID_ARGUMENT, names[i]);
        ts[i]->device_type = BIE_DEVICE_CPU;
    }
    f->w.device_index = 1;
    EXPECT(fwd(f, &a), BIE_STATUS_INVALID_ARGUMENT, "weight");
    f->w.device_index = 0;
    f->x.device_type = (enum bie_device_type)5;
    EXPECT(fwd(f, &a), BIE_STATUS_INVALID_ARGUMENT, "x");
    f->x.device_type = BIE_DEVICE_CPU;
    struct bie_backward_args b = bwd_args(f);
    f->gx.device_type = BIE_DEVICE_CUDA;
    EXPECT(bwd(f, &b), BIE_STATUS_INVALID_ARGUMENT, "grad_x");
    f->gx.device_type = BIE_DEVICE_CPU;
    // a CPU call on a context bound to the CUDA backend
    CHECK_OK(ctx, bie_context_set_backend(ctx, BIE_BACKEND_CUDA));
    EXPECT(fwd(f, &a), BIE_STATUS_INVALID_ARGUMENT, "x");
    CHECK_OK(ctx, bie_context_set_backend(ctx, BIE_BACKEND_REF));
}

static void test_scales(struct fixture * f) {
    struct bie_forward_args a = fwd_args(f);
    struct bie_backward_args b = bwd_args(f);
    const float bad[5] = {0.0f, -0.0f, -1.0f, NAN, INFINITY};
    struct bie_tensor * ts[2] = {&f->sa, &f->sw};
    const char * names[2] = {"scale_a", "scale_w"};
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 5; i++) {
            const float keep = ((float *)ts[s]->data)[0];
            ((float *)ts[s]->data)[0] = bad[i];
            sentinel(f);
            EXPECT(fwd(f, &a), BIE_STATUS_INVALID_ARGUMENT, names[s]);
            CHECK(sentinel_kept(f), "y written after a failed call (%s = %g)", names[s], (double)bad[i]);
            EXPECT(bwd(f, &b), BIE_STATUS_INVALID_ARGUMENT, names[s]);
            ((float *)ts[s]->data)[0] = keep;
        }
    // a scale with two elements
    const int64_t two = 2;
    struct bie_tensor s2 = test_tensor(BIE_DTYPE_F32, 1, &two, NULL);
    a.scale_a = &s2;
    EXPECT(fwd(f, &a), BIE_STATUS_INVALID_ARGUMENT, "scale_a");
    test_tensor_free(&s2);
}

static void test_conv_params(void) {
    struct fixture f;
    fixture_make(&f, true);
    struct bie_forward_args a = fwd_args(&f);
    const struct bie_conv2d_desc keep = f.cd;
    int32_t * fields[4] = {f.cd.kernel, f.cd.stride, f.cd.padding, f.cd.dilation};
    const int32_t bad[4] = {0, 0, -1, 0};
    for (int i = 0; i < 4; i++)
        for (int d = 0; d < 2; d++) {
            fields[i][d] = bad[i];
            EXPECT(fwd(&f, &a), BIE_STATUS_INVALID_ARGUMENT, "desc");
            f.cd = keep;
        }
    f.cd.kernel[0] = 9; // output smaller than 1: 5 + 2 - 9 + 1 < 1
    EXPECT(fwd(&f, &a), BIE_STATUS_INVALID_ARGUMENT, "desc");
    f.cd = keep;
    f.cd.dilation[1] = 4; // 1 + 4*2 = 9 > 7: dilation counts in the output size
    EXPECT(fwd(&f, &a), BIE_STATUS_INVALID_ARGUMENT, "desc");
    f.cd = keep;
    f.cd.groups = 3;
    EXPECT(fwd(&f, &a), BIE_STATUS_UNSUPPORTED, "groups");
    f.cd.groups = 0;
    EXPECT(fwd(&f, &a), BIE_STATUS_UNSUPPORTED, "groups");
    f.cd = keep;
    f.cd.pad_value = (enum bie_pad_value)3;
    EXPECT(fwd(&f, &a), BIE_STATUS_INVALID_ARGUMENT, "pad_value");
    f.cd.pad_value = (enum bie_pad_value) - 1;
    EXPECT(fwd(&f, &a), BIE_STATUS_INVALID_ARGUMENT, "pad_value");
    f.cd = keep;
    f.cd.quant = BIE_QUANT_INT4;
    f.cd.pad_value = BIE_PAD_MINUS_ONE; // n-bit convs pad with 0 only
    EXPECT(fwd(&f, &a), BIE_STATUS_INVALID_ARGUMENT, "pad_value");
    f.cd = keep;
    f.cd.in_channels = 4; // x has 3
    EXPECT(fwd(&f, &a), BIE_STATUS_INVALID_ARGUMENT, "x");
    f.cd = keep;
    CHECK_OK(ctx, fwd(&f, &a));
    // bie_conv2d_output_size
    int64_t oh = 0, ow = 0;
    CHECK(bie_conv2d_output_size(&keep, 5, 5, &oh, &ow) == BIE_STATUS_OK && oh == 5 && ow == 5, "output size %lld %lld",
          (long long)oh, (long long)ow);
    CHECK(bie_conv2d_output_size(NULL, 5, 5, &oh, &ow) == BIE_STATUS_INVALID_ARGUMENT, "output size: NULL desc");
    CHECK(bie_conv2d_output_size(&keep, 0, 5, &oh, &ow) == BIE_STATUS_INVALID_ARGUMENT, "output size: h = 0");
    CHECK(bie_conv2d_output_size(&keep, 5, -5, &oh, &ow) == BIE_STATUS_INVALID_ARGUMENT, "output size: w < 0");
    CHECK(bie_conv2d_output_size(&keep, 5, 5, NULL, &ow) == BIE_STATUS_INVALID_ARGUMENT, "output size: NULL out");
    fixture_free(&f);
}

static void test_pack_errors(void) {
    const int64_t shape[2] = {3, 5}, other[2] = {3, 4};
    struct bie_tensor src = test_tensor(BIE_DTYPE_F32, 2, shape, NULL), b1 = test_tensor(BIE_DTYPE_B1, 2, shape, NULL);
    struct bie_tensor s4 = test_tensor(BIE_DTYPE_S4, 2, shape, NULL), i8 = test_tensor(BIE_DTYPE_I8, 2, shape, NULL);
    struct bie_tensor i32 = test_tensor(BIE_DTYPE_I32, 2, shape, NULL), b1o = test_tensor(BIE_DTYPE_B1, 2, other, NULL);
    struct bie_tensor sc = test_scalar(0.5f), bad = test_scalar(-1.0f);
    test_fill_uniform(&src, -2, 2);
    CHECK(bie_pack(NULL, &src, NULL, &b1) == BIE_STATUS_INVALID_ARGUMENT, "pack: NULL ctx");
    CHECK(bie_unpack(NULL, &b1, NULL, &src) == BIE_STATUS_INVALID_ARGUMENT, "unpack: NULL ctx");
    EXPECT(bie_pack(ctx, NULL, NULL, &b1), BIE_STATUS_INVALID_ARGUMENT, "src");
    EXPECT(bie_pack(ctx, &src, NULL, NULL), BIE_STATUS_INVALID_ARGUMENT, "dst");
    EXPECT(bie_pack(ctx, &src, NULL, &b1o), BIE_STATUS_INVALID_ARGUMENT, "dst");  // shape
    EXPECT(bie_pack(ctx, &src, NULL, &i32), BIE_STATUS_INVALID_ARGUMENT, "dst");  // not packed
    EXPECT(bie_pack(ctx, &src, &sc, &b1), BIE_STATUS_INVALID_ARGUMENT, "scale");  // no scale for b1
    EXPECT(bie_pack(ctx, &i32, NULL, &b1), BIE_STATUS_INVALID_ARGUMENT, "src");   // i32 source
    EXPECT(bie_pack(ctx, &i8, &sc, &s4), BIE_STATUS_INVALID_ARGUMENT, "scale");   // i8 -> s4 takes no scale
    EXPECT(bie_pack(ctx, &i8, NULL, &i8), BIE_STATUS_INVALID_ARGUMENT, "src");    // i8 -> i8
    EXPECT(bie_pack(ctx, &src, &bad, &s4), BIE_STATUS_INVALID_ARGUMENT, "scale"); // negative scale
    ((float *)bad.data)[0] = NAN;
    EXPECT(bie_pack(ctx, &src, &bad, &i8), BIE_STATUS_INVALID_ARGUMENT, "scale");
    ((float *)bad.data)[0] = 0.0f;
    EXPECT(bie_unpack(ctx, &s4, &bad, &src), BIE_STATUS_INVALID_ARGUMENT, "scale");
    EXPECT(bie_unpack(ctx, &src, NULL, &src), BIE_STATUS_INVALID_ARGUMENT, "src"); // f32 is not packed
    EXPECT(bie_unpack(ctx, &b1, &sc, &i8), BIE_STATUS_INVALID_ARGUMENT, "scale");  // i8 dst takes no scale
    EXPECT(bie_unpack(ctx, &b1, NULL, &i32), BIE_STATUS_INVALID_ARGUMENT, "dst");
    EXPECT(bie_unpack(ctx, &b1o, NULL, &src), BIE_STATUS_INVALID_ARGUMENT, "dst");
    b1.device_type = BIE_DEVICE_CUDA;
    EXPECT(bie_pack(ctx, &src, NULL, &b1), BIE_STATUS_INVALID_ARGUMENT, "dst"); // devices differ
    b1.device_type = BIE_DEVICE_CPU;
    src.stride[1] = 0; // a broadcast source is fine, a broadcast destination is not
    CHECK_OK(ctx, bie_pack(ctx, &src, NULL, &b1));
    src.stride[1] = 1;
    b1.stride[0] = 0;
    EXPECT(bie_pack(ctx, &src, NULL, &b1), BIE_STATUS_INVALID_ARGUMENT, "dst");
    b1.stride[0] = 8;
    struct bie_tensor * ts[8] = {&src, &b1, &s4, &i8, &i32, &b1o, &sc, &bad};
    for (int i = 0; i < 8; i++) test_tensor_free(ts[i]);
}

// A valid call whose workspace cannot exist: a broadcast x of 2^46 elements (one float in
// memory) read by a 1x1 conv with stride 2^23, so y is one pixel. The reference needs ~350 TB
// of codes, more than the address space: OUT_OF_MEMORY, not a crash.
static void test_out_of_memory(void) {
    const int64_t xs[4] = {1, 1, (int64_t)1 << 23, (int64_t)1 << 23}, xst[4] = {0, 0, 0, 0};
    const int64_t ws[4] = {1, 1, 1, 1}, ys[4] = {1, 1, 1, 1};
    struct bie_tensor x = test_tensor(BIE_DTYPE_F32, 4, xs, xst), w = test_tensor(BIE_DTYPE_F32, 4, ws, NULL);
    struct bie_tensor y = test_tensor(BIE_DTYPE_F32, 4, ys, NULL), sa = test_scalar(1.0f), sw = test_scalar(1.0f);
    const struct bie_conv2d_desc d = {.quant = BIE_QUANT_INT8,
                                      .in_channels = 1,
                                      .out_channels = 1,
                                      .kernel = {1, 1},
                                      .stride = {1 << 23, 1 << 23},
                                      .padding = {0, 0},
                                      .dilation = {1, 1},
                                      .groups = 1,
                                      .pad_value = BIE_PAD_ZERO};
    const struct bie_forward_args a = {.x = &x, .weight = &w, .scale_a = &sa, .scale_w = &sw, .y = &y};
    EXPECT(bie_conv2d_forward(ctx, &d, &a), BIE_STATUS_OUT_OF_MEMORY, "workspace");
    // the context still works afterwards
    const int64_t xs1[4] = {1, 1, 1, 1};
    struct bie_tensor x1 = test_tensor(BIE_DTYPE_F32, 4, xs1, NULL);
    const struct bie_conv2d_desc d1 = {.quant = BIE_QUANT_INT8,
                                       .in_channels = 1,
                                       .out_channels = 1,
                                       .kernel = {1, 1},
                                       .stride = {1, 1},
                                       .padding = {0, 0},
                                       .dilation = {1, 1},
                                       .groups = 1,
                                       .pad_value = BIE_PAD_ZERO};
    const struct bie_forward_args a1 = {.x = &x1, .weight = &w, .scale_a = &sa, .scale_w = &sw, .y = &y};
    CHECK_OK(ctx, bie_conv2d_forward(ctx, &d1, &a1));
    struct bie_tensor * ts[6] = {&x, &w, &y, &sa, &sw, &x1};
    for (int i = 0; i < 6; i++) test_tensor_free(ts[i]);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    ctx = test_new_context(BIE_BACKEND_REF);
    for (int conv = 0; conv < 2; conv++) {
        struct fixture f;
        fixture_make(&f, conv);
        test_null_pointers(&f);
        test_dimensions(&f);
        test_shapes(&f);
        test_dtypes(&f);
        test_devices(&f);
        test_scales(&f);
        fixture_free(&f);
    }
    test_conv_params();
    test_pack_errors();
    test_out_of_memory();
    bie_context_destroy(ctx);
    return test_finish("test-errors");
}
