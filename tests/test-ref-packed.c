// SPDX-License-Identifier: Apache-2.0
// test-ref-packed.c: the packed inference path equals the training path bit for bit. A layer
// run with its float (or int8) weight and the same layer run with that weight packed by
// bie_pack (B1 for binary, S4 for 4-bit, I8 for 8-bit; scale_w as the pack scale) must produce
// identical bytes in y for every y dtype. Conv weights are packed in the canonical OHWI view (a
// [O, kh, kw, C] tensor permuted to [O, C, kh, kw]), in an OIHW-ordered view and as one flat
// OHWI row per output channel. Run on the reference and on the default backend.
#include "test-oracle.h"

static bie_context_t * ctx;

static enum bie_status forward(const struct layer_case * c, const struct bie_tensor * w, struct bie_tensor * y) {
    const struct bie_forward_args a = {.x = &c->x,
                                       .bias_a = c->has_bias ? &c->bias : NULL,
                                       .weight = w,
                                       .scale_a = &c->sa,
                                       .scale_w = &c->sw_t,
                                       .y = y};
    return c->conv ? bie_conv2d_forward(ctx, &c->cd, &a) : bie_linear_forward(ctx, &c->lin, &a);
}

// A dense y of dtype d (zeroed, so whole buffers compare with memcmp).
static struct bie_tensor dense_y(const struct layer_case * c, enum bie_dtype d, size_t * bytes) {
    struct bie_tensor y;
    if (c->conv) {
        const int64_t shape[4] = {c->N, c->O, c->OH, c->OW};
        y = test_tensor(d, 4, shape, NULL);
    } else {
        int64_t shape[3];
        for (int i = 0; i < c->nlead; i++) shape[i] = c->lead[i];
        shape[c->nlead] = c->O;
        y = test_tensor(d, c->nlead + 1, shape, NULL);
    }
    bie_tensor_nbytes(&y, bytes);
    return y;
}

static void run_case(bool conv) {
    struct layer_case c;
    static const enum bie_quant quants[3] = {BIE_QUANT_BINARY, BIE_QUANT_INT4, BIE_QUANT_INT8};
    const enum bie_quant q = quants[test_rand_int(0, 2)];
    // float weights for every layer; the int8 latent weight (binary) and int8 codes (4-bit) too
    const int wsel = (int)test_rand_int(0, q == BIE_QUANT_INT8 ? 2 : 3);
    const enum bie_dtype wd = wsel < 3 ? float_dtypes[wsel] : BIE_DTYPE_I8;
    const struct case_opts o = {.conv = conv, .quant = q, .x_dtype = -1, .w_dtype = (int)wd};
    case_random(&c, &o);
    const enum bie_dtype pd = q == BIE_QUANT_BINARY ? BIE_DTYPE_B1 : q == BIE_QUANT_INT4 ? BIE_DTYPE_S4 : BIE_DTYPE_I8;
    const bool scaled = q != BIE_QUANT_BINARY && bie_dtype_is_float(c.w.dtype);
    // packed weights: [0] OIHW-ordered (linear: [N, K] rows), [1] OHWI canonical (conv only),
    // [2] one flat OHWI row of K elements per output channel, padded to bytes at its end only
    struct bie_tensor pw[3];
    const int nviews = conv ? 3 : 1;
    for (int v = 0; v < nviews; v++) {
        if (v == 0) {
            const int64_t shape[4] = {c.O, c.C, c.kh, c.kw};
            pw[v] = test_tensor(pd, conv ? 4 : 2, shape, NULL);
        } else {
            const int64_t shape[4] = {c.O, c.kh, c.kw, c.C};
            const int per = pd == BIE_DTYPE_B1 ? 8 : pd == BIE_DTYPE_S4 ? 2 : 1;
            const int64_t K = lc_K(&c), flat[4] = {(K + per - 1) / per * per, c.kw * c.C, c.C, 1};
            static const int32_t perm[4] = {0, 3, 1, 2};
            pw[v] = test_tensor(pd, 4, shape, v == 2 ? flat : NULL);
            bie_tensor_permute(&pw[v], perm);
        }
        CHECK_OK(ctx, bie_pack(ctx, &c.w, scaled ? &c.sw_t : NULL, &pw[v]));
    }
    const enum bie_dtype ydt[5] = {BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_BF16, BIE_DTYPE_I32, BIE_DTYPE_B1};
    for (int d = 0; d < (q == BIE_QUANT_BINARY ? 5 : 4); d++) {
        size_t bytes = 0;
        struct bie_tensor y0 = dense_y(&c, ydt[d], &bytes);
        const enum bie_status st = forward(&c, &c.w, &y0);
        CHECK(st == BIE_STATUS_OK, "%s: training path: %s", c.desc, bie_context_last_error(ctx));
        for (int v = 0; v < nviews; v++) {
            struct bie_tensor y1 = dense_y(&c, ydt[d], &bytes);
            const enum bie_status st1 = forward(&c, &pw[v], &y1);
            CHECK(st1 == BIE_STATUS_OK, "%s: packed path: %s", c.desc, bie_context_last_error(ctx));
            CHECK(memcmp(y0.data, y1.data, bytes) == 0,
                  "%s: y %s differs between the %s weight and the %s %s-packed weight", c.desc, bie_dtype_name(ydt[d]),
                  bie_dtype_name(c.w.dtype),
                  v == 2 ? "flat-OHWI"
                  : v    ? "OHWI"
                         : "OIHW",
                  bie_dtype_name(pd));
            test_tensor_free(&y1);
        }
        test_tensor_free(&y0);
    }
    for (int v = 0; v < nviews; v++) test_tensor_free(&pw[v]);
    case_free(&c);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    const int n = test_quick() ? 25 : 300;
    for (int b = 0; b < 2; b++) {
        struct bie_context_params p;
        bie_context_params_default(&p);
        p.backend = b ? BIE_BACKEND_AUTO : BIE_BACKEND_REF;
        if (bie_context_create(&p, &ctx) != BIE_STATUS_OK) return 2;
        for (int i = 0; i < n; i++) run_case(false);
        for (int i = 0; i < n; i++) run_case(true);
        bie_context_destroy(ctx);
    }
    return test_finish("test-ref-packed");
}
