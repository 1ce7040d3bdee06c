// SPDX-License-Identifier: Apache-2.0
// test-core.c: contexts, tensor views, dtype conversions, pack/unpack round trips and the error
// classes of the utility functions.
#include "test-util.h"

static void test_context(void) {
    bie_context_t * ctx = NULL;
    CHECK(bie_context_create(NULL, NULL) == BIE_STATUS_INVALID_ARGUMENT, "NULL out_ctx");
    struct bie_context_params p;
    bie_context_params_default(&p);
    p.backend = (enum bie_backend)42;
    CHECK(bie_context_create(&p, &ctx) == BIE_STATUS_INVALID_ARGUMENT && ctx == NULL, "bad backend");
    CHECK(bie_context_create(NULL, &ctx) == BIE_STATUS_OK && ctx, "create");
    CHECK(strcmp(bie_context_last_error(ctx), "") == 0, "fresh error is empty");
    CHECK(bie_context_set_backend(ctx, (enum bie_backend)9) == BIE_STATUS_INVALID_ARGUMENT, "bad backend");
    CHECK(strstr(bie_context_last_error(ctx), "backend") != NULL, "message names the argument: %s",
          bie_context_last_error(ctx));
    CHECK(bie_context_reserve(ctx, BIE_DEVICE_CPU, 1 << 20) == BIE_STATUS_OK, "reserve");
    CHECK(strcmp(bie_context_last_error(NULL), "") != 0, "NULL ctx message");
    CHECK(bie_backend_available(BIE_BACKEND_REF) == 1, "ref backend always there");
    int ma = -1, mi = -1, pa = -1;
    bie_version(&ma, &mi, &pa);
    CHECK(ma == BIE_VERSION_MAJOR && mi == BIE_VERSION_MINOR && pa == BIE_VERSION_PATCH, "version");
    CHECK(strcmp(bie_version_string(), BIE_VERSION_STRING) == 0, "version string");
    CHECK(strcmp(bie_status_string(BIE_STATUS_OK), "ok") == 0, "status string");
    CHECK(bie_cpu_isa_name(bie_cpu_isa_detected())[0] != '?', "isa name");
    bie_context_destroy(ctx);
    bie_context_destroy(NULL);
}

// The ISA levels by name, and every level (AVX512-VNNI too) as a cap.
static void test_isa_levels(void) {
    const enum bie_cpu_isa levels[] = {BIE_CPU_ISA_SCALAR,         BIE_CPU_ISA_AVX2,        BIE_CPU_ISA_AVX512,
                                       BIE_CPU_ISA_AVX512_VPOPCNT, BIE_CPU_ISA_AVX512_VNNI, BIE_CPU_ISA_BEST};
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
        enum bie_cpu_isa got = (enum bie_cpu_isa) - 1;
        CHECK(bie_cpu_isa_from_name(bie_cpu_isa_name(levels[i]), &got) == BIE_STATUS_OK && got == levels[i],
              "isa %s by name: %d", bie_cpu_isa_name(levels[i]), (int)got);
        if (levels[i] == BIE_CPU_ISA_BEST) continue;
        struct bie_context_params p;
        bie_context_params_default(&p);
        p.max_isa = levels[i];
        bie_context_t * ctx = NULL;
        CHECK(bie_context_create(&p, &ctx) == BIE_STATUS_OK, "context capped at %s", bie_cpu_isa_name(levels[i]));
        const enum bie_cpu_isa isa = bie_context_cpu_isa(ctx), det = bie_cpu_isa_detected();
        CHECK(isa == (levels[i] < det ? levels[i] : det) || getenv("BIE_CPU_ISA"), "cap %s gives %s (machine: %s)",
              bie_cpu_isa_name(levels[i]), bie_cpu_isa_name(isa), bie_cpu_isa_name(det));
        bie_context_destroy(ctx);
    }
    enum bie_cpu_isa keep = BIE_CPU_ISA_AVX2;
    CHECK(bie_cpu_isa_from_name("avx1024", &keep) == BIE_STATUS_INVALID_ARGUMENT && keep == BIE_CPU_ISA_AVX2,
          "unknown isa name refused");
    CHECK(bie_cpu_isa_from_name(NULL, &keep) == BIE_STATUS_INVALID_ARGUMENT, "NULL isa name refused");
}

static void test_tensors(void) {
    struct bie_tensor t;
    const int64_t shape[3] = {2, 3, 13};
    CHECK(bie_tensor_make(&t, NULL, BIE_DTYPE_B1, 3, shape) == BIE_STATUS_OK, "make b1");
    CHECK(t.stride[2] == 1 && t.stride[1] == 16 && t.stride[0] == 48, "b1 rows padded to bytes: %lld %lld",
          (long long)t.stride[1], (long long)t.stride[0]);
    size_t bytes = 0;
    CHECK(bie_tensor_nbytes(&t, &bytes) == BIE_STATUS_OK && bytes == 2 * 3 * 2, "b1 bytes %zu", bytes);
    CHECK(bie_tensor_make(&t, NULL, BIE_DTYPE_S4, 3, shape) == BIE_STATUS_OK, "make s4");
    CHECK(t.stride[1] == 14, "s4 rows padded to bytes");
    CHECK(bie_tensor_nbytes(&t, &bytes) == BIE_STATUS_OK && bytes == 2 * 3 * 7, "s4 bytes %zu", bytes);
    const int64_t bad[2] = {3, 0};
    CHECK(bie_tensor_make(&t, NULL, BIE_DTYPE_F32, 2, bad) == BIE_STATUS_INVALID_ARGUMENT, "zero dim");
    const int64_t huge[3] = {INT64_MAX / 2, 4, 4};
    CHECK(bie_tensor_make(&t, NULL, BIE_DTYPE_F32, 3, huge) == BIE_STATUS_INVALID_ARGUMENT, "overflow");
    const int64_t nhwc[4] = {2, 5, 7, 3};
    CHECK(bie_tensor_make(&t, NULL, BIE_DTYPE_F32, 4, nhwc) == BIE_STATUS_OK, "nhwc");
    const int32_t perm[4] = {0, 3, 1, 2};
    CHECK(bie_tensor_permute(&t, perm) == BIE_STATUS_OK, "permute");
    CHECK(t.shape[1] == 3 && t.stride[1] == 1 && t.shape[2] == 5 && t.stride[2] == 21, "nchw view");
    const int32_t badperm[4] = {0, 0, 1, 2};
    CHECK(bie_tensor_permute(&t, badperm) == BIE_STATUS_INVALID_ARGUMENT, "bad perm");
    CHECK(bie_tensor_numel(&t) == 2 * 5 * 7 * 3, "numel");
}

static void test_half_conversions(void) {
    // Every f16 value survives f16 -> f32 -> f16.
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        const float f = bie_f16_to_f32((uint16_t)h);
        const uint16_t back = bie_f32_to_f16(f);
        if (isnan(f) ? !(back & 0x7c00) || !(back & 0x3ff) : back != h) bad++;
    }
    CHECK(bad == 0, "%d f16 values do not round-trip", bad);
    CHECK(bie_f32_to_f16(65504.0f) == 0x7bff && bie_f32_to_f16(65520.0f) == 0x7c00, "f16 overflow");
    CHECK(bie_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00, "tie to even (down)");
    CHECK(bie_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02, "tie to even (up)");
    CHECK(bie_f32_to_f16(0x1p-25f) == 0 && bie_f32_to_f16(0x1.8p-25f) == 1, "subnormal rounding");
    CHECK(bie_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80 && bie_f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82,
          "bf16 tie to even");
    CHECK(bie_bf16_to_f32(0x3f80) == 1.0f, "bf16 -> f32");
    CHECK(isnan(bie_bf16_to_f32(bie_f32_to_bf16(NAN))), "bf16 nan");
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    test_context();
    test_isa_levels();
    test_tensors();
    test_half_conversions();
    return test_finish("test-core");
}
