// SPDX-License-Identifier: Apache-2.0
// test-ref-rounding.c: the reference rounds each double result ONCE to its dtype
// (bie_ref_store_rounded). A plain double -> f32 -> f16 conversion rounds twice and can land on
// the wrong side of a tie; the reference goes through a round-to-odd f32, which cannot. Each case
// below is a value where the two-step conversion is wrong, with the correctly rounded answer.
#include "test-util.h"

#include "ref/ref-impl.h"

struct rcase {
    enum bie_dtype dtype;
    double v;
    double want; // correctly rounded (RNE) value
};

int main(int argc, char ** argv) {
    test_init(argc, argv);
    const struct rcase cases[] = {
        // just above the f16 tie between 1 and 1 + 2^-10: f32 drops the 2^-40, then ties to even (1)
        {BIE_DTYPE_F16, 1.0 + 0x1p-11 + 0x1p-40, 1.0 + 0x1p-10},
        {BIE_DTYPE_F16, -(1.0 + 0x1p-11 + 0x1p-40), -(1.0 + 0x1p-10)},
        // just below a tie that f32 rounds up onto the tie (then to even, upwards)
        {BIE_DTYPE_F16, 1.0 + 3 * 0x1p-11 - 0x1p-40, 1.0 + 0x1p-10},
        // below the f16 overflow threshold 65520: f32 rounds to 65520, which overflows to inf
        {BIE_DTYPE_F16, 65520.0 - 0x1p-12, 65504.0},
        // exact ties still go to even
        {BIE_DTYPE_F16, 1.0 + 0x1p-11, 1.0},
        {BIE_DTYPE_F16, 1.0 + 3 * 0x1p-11, 1.0 + 0x1p-9},
        // f16 subnormals: just above half the smallest step
        {BIE_DTYPE_F16, 0x1p-25 + 0x1p-60, 0x1p-24},
        {BIE_DTYPE_F16, 0x1p-25, 0.0},
        // bf16, same traps
        {BIE_DTYPE_BF16, 1.0 + 0x1p-8 + 0x1p-40, 1.0 + 0x1p-7},
        {BIE_DTYPE_BF16, -(1.0 + 0x1p-8 + 0x1p-40), -(1.0 + 0x1p-7)},
        {BIE_DTYPE_BF16, 1.0 + 0x1p-8, 1.0},
        // f32 and f64 outputs: one rounding of the double
        {BIE_DTYPE_F32, 1.0 + 0x1p-24 + 0x1p-50, 1.0 + 0x1p-23},
        {BIE_DTYPE_F64, 1.0 + 0x1p-40, 1.0 + 0x1p-40},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct bie_tensor t = test_tensor(cases[i].dtype, 0, NULL, NULL);
        bie_ref_store_rounded(&t, 0, cases[i].v);
        const double got = bie_load(&t, 0);
        CHECK(got == cases[i].want, "%s(%.17g) = %.17g, want %.17g", bie_dtype_name(cases[i].dtype), cases[i].v, got,
              cases[i].want);
        test_tensor_free(&t);
    }
    // The two-step conversion really is wrong on the first case (so the test can fail).
    CHECK(bie_f16_to_f32(bie_f32_to_f16((float)(1.0 + 0x1p-11 + 0x1p-40))) == 1.0f, "double rounding premise");
    // Random doubles: the result is the nearest representable value (ties aside, measure zero).
    int bad = 0;
    for (int i = 0; i < 100000; i++) {
        const double v = ldexp((double)test_rand_u64() * 0x1p-64 + 0.5, (int)test_rand_int(-20, 15)) *
                         (test_rand_int(0, 1) ? 1 : -1);
        struct bie_tensor t = test_tensor(i % 2 ? BIE_DTYPE_F16 : BIE_DTYPE_BF16, 0, NULL, NULL);
        bie_ref_store_rounded(&t, 0, v);
        const double got = bie_load(&t, 0);
        const uint16_t h = ((uint16_t *)t.data)[0];
        // neighbours of the result in the dtype
        const uint16_t up = (uint16_t)(h + 1), dn = (uint16_t)(h - 1);
        const double nu = t.dtype == BIE_DTYPE_F16 ? bie_f16_to_f32(up) : bie_bf16_to_f32(up);
        const double nd = t.dtype == BIE_DTYPE_F16 ? bie_f16_to_f32(dn) : bie_bf16_to_f32(dn);
        if (!isinf(got) && (fabs(nu - v) < fabs(got - v) || fabs(nd - v) < fabs(got - v))) bad++;
        test_tensor_free(&t);
    }
    CHECK(bad == 0, "%d random values not rounded to nearest", bad);
    return test_finish("test-ref-rounding");
}
