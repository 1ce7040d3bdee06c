// SPDX-License-Identifier: Apache-2.0
// test-nn-plan-alloc.c: planned inference allocates nothing per call. The program counts every
// heap allocation of the process (it defines malloc and its relatives over glibc's __libc_*
// functions, so the library, OpenMP and OpenBLAS are counted too) while a loaded packed graph
// model runs at batch sizes whose plans exist, with low-bit layers and with float_layers.
// Under AddressSanitizer, which owns malloc itself, the count is not taken (the planned logits
// are still compared with the first call's).
//
// Two threads: libgomp allocates a team on every parallel region of ONE thread (teams of more
// are kept for the next region), and the CPU kernels' packing loops enter parallel regions at
// any thread count. The model's own loops never enter a region for small work.
#include "test-train-util.h"
#include "nn/model-impl.h"

#include <omp.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define HAVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HAVE_ASAN 1
#endif
#endif

#ifndef HAVE_ASAN
#define COUNTING 1
extern void * __libc_malloc(size_t n);
extern void * __libc_calloc(size_t n, size_t size);
extern void * __libc_realloc(void * p, size_t n);
extern void * __libc_memalign(size_t align, size_t n);
extern void __libc_free(void * p);

static int counting;
static int64_t allocations;

static void note(void) {
    if (__atomic_load_n(&counting, __ATOMIC_RELAXED)) __atomic_fetch_add(&allocations, 1, __ATOMIC_RELAXED);
}
void * malloc(size_t n) {
    note();
    return __libc_malloc(n);
}
void * calloc(size_t n, size_t size) {
    note();
    return __libc_calloc(n, size);
}
void * realloc(void * p, size_t n) {
    note();
    return __libc_realloc(p, n);
}
void * aligned_alloc(size_t align, size_t n) {
    note();
    return __libc_memalign(align, n);
}
void * memalign(size_t align, size_t n) {
    note();
    return __libc_memalign(align, n);
}
int posix_memalign(void ** out, size_t align, size_t n) {
    note();
    *out = __libc_memalign(align, n);
    return *out ? 0 : 12; // ENOMEM
}
void free(void * p) { __libc_free(p); }
#else
#define COUNTING 0
static int counting;
static int64_t allocations;
#endif

static const char * const ARCH =
    "input 3 8 8; conv f32 8 3; bn; prelu 8; conv b1 8 3 1 1; bn; add @2; maxpool 3 2 1; conv q4 8 3 1 1 bias; bn;"
    " relu; conv b1 8 1 1 0; bn; add @6; avgpool 2; adaptive_avgpool 1; flatten; linear q8 16 bias; bn; gelu;"
    " linear b1 12; bn; silu; linear f32 5";

int main(int argc, char ** argv) {
    test_init(argc, argv);
    struct bie_context_params cp;
    bie_context_params_default(&cp);
    cp.num_threads = 2;
    omp_set_num_threads(2);
    bie_context_t * ctx = NULL;
    bie_context_create(&cp, &ctx);
    bie_model_t *m = NULL, *p = NULL;
    CHECK_OK(ctx, bie_model_create(ctx, ARCH, BIE_LATENT_F32, test_seed, &m));
    const int64_t N = 7, in = 3 * 8 * 8, k = 5;
    float *x = malloc(sizeof(float) * N * in), *first = malloc(sizeof(float) * N * k), one[5];
    for (int64_t i = 0; i < N * in; i++) x[i] = test_rand_float(-1, 1);
    const float * logits = NULL;
    CHECK_OK(ctx, test_forward(ctx, m, x, N, 1, 0, &logits)); // sets the scales and statistics
    char path[] = "bie-test-plan-XXXXXX";
    const int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    CHECK_OK(ctx, bie_model_save(ctx, m, path, BIE_MODEL_FILE_PACKED, NULL, 0));
    CHECK_OK(ctx, bie_model_load(ctx, path, &p, NULL));
    unlink(path);
    if (!p) return test_finish("test-nn-plan-alloc");
    for (int fl = 0; fl < 2; fl++) {
        // Plans for 1 and N samples (the first call at each size builds its plan).
        CHECK_OK(ctx, test_forward(ctx, p, x, N, 0, fl, &logits));
        memcpy(first, logits, sizeof(float) * N * k);
        CHECK_OK(ctx, test_forward(ctx, p, x, 1, 0, fl, &logits));
        memcpy(one, logits, sizeof one);
        const int64_t builds = bie_model_plan_builds(p);
        __atomic_store_n(&counting, 1, __ATOMIC_RELAXED);
        for (int r = 0; r < 40; r++) {
            const int64_t n = r % 3 ? 1 : N;
            const enum bie_status s = test_forward(ctx, p, x, n, 0, fl, &logits);
            if (s != BIE_STATUS_OK || memcmp(logits, n == 1 ? one : first, sizeof(float) * (size_t)(n * k)) != 0) {
                __atomic_store_n(&counting, 0, __ATOMIC_RELAXED);
                CHECK(false, "call %d (n %lld, float_layers %d): %s, or logits differ from the first call's", r,
                      (long long)n, fl, bie_status_string(s));
                break;
            }
        }
        __atomic_store_n(&counting, 0, __ATOMIC_RELAXED);
        CHECK(bie_model_plan_builds(p) == builds, "plans rebuilt: %lld -> %lld", (long long)builds,
              (long long)bie_model_plan_builds(p));
        if (COUNTING)
            CHECK(allocations == 0, "%lld heap allocations in 40 planned calls (float_layers %d)",
                  (long long)allocations, fl);
        allocations = 0;
    }
    printf("heap allocations %s\n", COUNTING ? "counted" : "not counted (AddressSanitizer owns malloc)");
    free(x);
    free(first);
    bie_model_destroy(m);
    bie_model_destroy(p);
    bie_context_destroy(ctx);
    return test_finish("test-nn-plan-alloc");
}
