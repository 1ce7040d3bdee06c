// SPDX-License-Identifier: Apache-2.0
// test-cpu-pack.c: bie_pack / bie_unpack through the CPU backend's row kernels against the
// reference backend, at every ISA level: f32 -> b1 / s4 / i8 and back, on 1- to 3-D views with
// contiguous or gapped rows and odd row lengths, with special values (+-0, NaN, +-inf, halves for
// round-half-to-even). The whole destination buffer (padding bits included) must be identical.
#include "test-cpu-common.h"

static float special(void) {
    switch (test_rand_int(0, 9)) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return NAN;
    case 3: return test_rand_int(0, 1) ? INFINITY : -INFINITY;
    case 4: return (float)test_rand_int(-300, 300) * 0.5f; // exact halves
    default: return test_rand_float(-200.0f, 200.0f);
    }
}

// A view [d0, ..., cols] with rows padded to bytes, and optionally a gap after each row.
static struct bie_tensor make(enum bie_dtype d, int nd, const int64_t * shape, bool gap) {
    struct bie_tensor t = test_tensor(d, nd, shape, NULL);
    if (gap && nd > 1) {
        free(t.data);
        t.stride[nd - 2] += d == BIE_DTYPE_B1 ? 16 : d == BIE_DTYPE_S4 ? 4 : 2;
        for (int i = nd - 3; i >= 0; i--) t.stride[i] = t.stride[i + 1] * t.shape[i + 1];
        size_t b = 0;
        bie_tensor_nbytes(&t, &b);
        t.data = calloc(1, b + 64);
    }
    return t;
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    enum bie_cpu_isa levels[CPU_TEST_LEVELS];
    const int nlev = cpu_test_levels(levels);
    bie_context_t * ref = cpu_test_ctx(BIE_BACKEND_REF, BIE_CPU_ISA_BEST, 1);
    const int iters = cpu_test_quick() ? 40 : 300;
    for (int it = 0; it < iters; it++) {
        const int nd = (int)test_rand_int(1, 3);
        int64_t shape[3];
        for (int i = 0; i < nd; i++) shape[i] = test_rand_int(1, 7);
        shape[nd - 1] = test_rand_int(1, 70);
        static const enum bie_dtype dd[3] = {BIE_DTYPE_B1, BIE_DTYPE_S4, BIE_DTYPE_I8};
        const enum bie_dtype pd = dd[test_rand_int(0, 2)];
        const bool gap = test_rand_int(0, 1);
        struct bie_tensor src = make(BIE_DTYPE_F32, nd, shape, gap);
        {
            int64_t idx[BIE_MAX_DIMS] = {0};
            do ((float *)src.data)[bie_offset(&src, idx)] = special();
            while (bie_next_index(&src, idx));
        }
        struct bie_tensor dst = make(pd, nd, shape, !gap);
        cpu_test_garbage(&dst);
        struct bie_tensor sc = test_scalar(pd == BIE_DTYPE_B1    ? 1.0f
                                           : test_rand_int(0, 1) ? 1.0f
                                                                 : test_rand_float(0.1f, 3.0f));
        const struct bie_tensor * scale = pd == BIE_DTYPE_B1 ? NULL : &sc;
        struct bie_tensor dref = cpu_test_clone(&dst);
        CHECK_OK(ref, bie_pack(ref, &src, scale, &dref));
        struct bie_tensor uref = cpu_test_clone(&src);
        CHECK_OK(ref, bie_unpack(ref, &dref, scale, &uref));
        for (int l = 0; l < nlev; l++) {
            bie_context_t * cpu = cpu_test_ctx(BIE_BACKEND_CPU, levels[l], 2);
            struct bie_tensor d = cpu_test_clone(&dst);
            CHECK_OK(cpu, bie_pack(cpu, &src, scale, &d));
            CHECK(memcmp(d.data, dref.data, cpu_test_nbytes(&d)) == 0,
                  "pack to %s differs (isa %s, nd %d, cols %lld, gap %d)", bie_dtype_name(pd),
                  bie_cpu_isa_name(levels[l]), nd, (long long)shape[nd - 1], (int)gap);
            struct bie_tensor u = cpu_test_clone(&src);
            CHECK_OK(cpu, bie_unpack(cpu, &dref, scale, &u));
            CHECK(memcmp(u.data, uref.data, cpu_test_nbytes(&u)) == 0,
                  "unpack of %s differs (isa %s, nd %d, cols %lld)", bie_dtype_name(pd), bie_cpu_isa_name(levels[l]),
                  nd, (long long)shape[nd - 1]);
            test_tensor_free(&d);
            test_tensor_free(&u);
            bie_context_destroy(cpu);
        }
        test_tensor_free(&src);
        test_tensor_free(&dst);
        test_tensor_free(&dref);
        test_tensor_free(&uref);
        test_tensor_free(&sc);
    }
    bie_context_destroy(ref);
    return test_finish("test-cpu-pack");
}
