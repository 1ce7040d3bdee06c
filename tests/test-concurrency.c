// SPDX-License-Identifier: Apache-2.0
// test-concurrency.c: bie in a process with several threads, each with its own context (the
// documented pattern), and what it must leave alone of the process's state:
// - several models training at once give, to the bit, the result of the same training run alone;
// - the library never calls openblas_set_num_threads (a process-wide setting), and OpenBLAS's
//   thread count seen by another thread stays what the application set during bie's backward (the
//   weight-only layers' forward and backward included);
// - the trainings save and reload checkpoints at the same time: the process umask (read from
//   /proc/self/status, which does not change it) stays as it was, and every file reloads.
// These are also the programs of `make test-tsan` (ThreadSanitizer), where the OpenMP and OpenBLAS
// thread counts are 1 so that only the threads of this test run (libgomp and OpenBLAS are not
// instrumented).
#define _GNU_SOURCE
#include "bie-train.h"
#include "test-util.h"
#include "test-wq.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

// --- interposed process-wide setters: the library must not call them ------------------------------

static int calls_openblas_set = 0; // set by the library (the test's own calls go through set_blas)
static bool test_setting_blas = false;

void openblas_set_num_threads(int n);
void openblas_set_num_threads(int n) {
    if (!test_setting_blas) __atomic_add_fetch(&calls_openblas_set, 1, __ATOMIC_RELAXED);
    static void (*real)(int);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "openblas_set_num_threads");
    if (real) real(n);
}
int openblas_get_num_threads(void);

static void set_blas(int n) {
    test_setting_blas = true;
    openblas_set_num_threads(n);
    test_setting_blas = false;
}

// --- several trainings at once ---------------------------------------------------------------------

#define TRAIN_ARCH                                                                                                     \
    "input 2 10 10; conv f32 6 3; bn; conv q8 8 3; maxpool 2; bn; conv b1 12 3 1 1; bn; conv q4 8 3; bn; "             \
    "linear q8 600; bn; linear b1 24; bn; linear f32 5"
#define TRAIN_N 13
#define TRAIN_STEPS 4

struct training {
    const float * x;
    const uint8_t * y;
    int threads;   // the context's thread count
    char path[64]; // where to save a checkpoint after each step ("": no saving)
    float out[TRAIN_N * 5];
    enum bie_status status;
    char error[256];
};

// Trains TRAIN_ARCH from seed 7 on (x, y) and keeps the logits of an inference pass at the end.
static void * train_one(void * arg) {
    struct training * t = arg;
    struct bie_context_params p;
    bie_context_params_default(&p);
    p.num_threads = t->threads;
    bie_context_t * ctx = NULL;
    bie_model_t * m = NULL;
    float g[TRAIN_N * 5], logits[TRAIN_N * 5];
    double loss;
    struct bie_tensor tx = TEST_VIEW(t->x, BIE_DTYPE_F32, TRAIN_N, 2, 10, 10),
                      tz = TEST_VIEW(logits, BIE_DTYPE_F32, TRAIN_N, 5), tl = TEST_VIEW(t->y, BIE_DTYPE_U8, TRAIN_N),
                      tg = TEST_VIEW(g, BIE_DTYPE_F32, TRAIN_N, 5), to = TEST_VIEW(t->out, BIE_DTYPE_F32, TRAIN_N, 5);
    const struct bie_model_forward_desc train = {1, 0}, infer = {0, 0};
    const struct bie_model_step_desc step = {0.01f, 0.0f, 0.05f};
    t->status = bie_context_create(&p, &ctx);
    if (t->status == BIE_STATUS_OK) t->status = bie_model_create(ctx, TRAIN_ARCH, BIE_LATENT_F32, 7, &m);
    for (int s = 0; s < TRAIN_STEPS && t->status == BIE_STATUS_OK; s++) {
        t->status = bie_model_forward(ctx, m, &train, &(struct bie_model_forward_args){&tx, &tz});
        if (t->status == BIE_STATUS_OK)
            t->status =
                bie_softmax_cross_entropy(ctx, &(struct bie_softmax_cross_entropy_args){&tz, &tl, &tg, &loss, NULL});
        if (t->status == BIE_STATUS_OK) t->status = bie_model_backward(ctx, m, &(struct bie_model_backward_args){&tg});
        if (t->status == BIE_STATUS_OK) t->status = bie_model_step(ctx, m, &step);
        if (t->status == BIE_STATUS_OK && t->path[0]) { // save, and continue from the reloaded file
            bie_model_t * back = NULL;
            t->status = bie_model_save(ctx, m, t->path, BIE_MODEL_FILE_CHECKPOINT, NULL, 0);
            if (t->status == BIE_STATUS_OK) t->status = bie_model_load(ctx, t->path, &back, NULL);
            if (t->status == BIE_STATUS_OK) {
                bie_model_destroy(m);
                m = back;
            }
        }
    }
    if (t->path[0]) unlink(t->path);
    if (t->status == BIE_STATUS_OK)
        t->status = bie_model_forward(ctx, m, &infer, &(struct bie_model_forward_args){&tx, &to});
    snprintf(t->error, sizeof t->error, "%s", bie_context_last_error(ctx));
    bie_model_destroy(m);
    bie_context_destroy(ctx);
    return NULL;
}

static void test_concurrent_training(int omp_threads, int rounds) {
    float x[TRAIN_N * 200];
    uint8_t y[TRAIN_N];
    for (int i = 0; i < TRAIN_N * 200; i++) x[i] = test_rand_float(-2, 2);
    for (int i = 0; i < TRAIN_N; i++) y[i] = (uint8_t)test_rand_int(0, 4);
    struct training alone = {.x = x, .y = y, .threads = omp_threads};
    train_one(&alone);
    CHECK(alone.status == BIE_STATUS_OK, "training alone: %s", alone.error);
    enum { T = 3 };
    int mismatches = 0, runs = 0;
    for (int r = 0; r < rounds; r++) {
        struct training t[T];
        pthread_t th[T];
        for (int i = 0; i < T; i++) {
            t[i] = (struct training){.x = x, .y = y, .threads = omp_threads};
            snprintf(t[i].path, sizeof t[i].path, "/tmp/bie-test-concurrency-%d-%d.ckpt", (int)getpid(), i);
            pthread_create(&th[i], NULL, train_one, &t[i]);
        }
        for (int i = 0; i < T; i++) {
            pthread_join(th[i], NULL);
            CHECK(t[i].status == BIE_STATUS_OK, "training %d: %s", i, t[i].error);
            mismatches += memcmp(t[i].out, alone.out, sizeof alone.out) != 0;
            runs++;
        }
    }
    CHECK(mismatches == 0,
          "%d of %d trainings run %d at once (saving and reloading a checkpoint after each step) "
          "differ from the same training run alone (%d OpenMP threads each)",
          mismatches, runs, (int)T, omp_threads);
}

// --- OpenBLAS's thread count -----------------------------------------------------------------------

struct backward_job {
    bie_context_t * ctx;
    int reps;
    enum bie_status status;
};

// 8-bit linear backward (an sgemm path on every ISA level), reps times.
static void * backward_loop(void * arg) {
    struct backward_job * j = arg;
    const int64_t M = 64, K = 300, N = 200;
    const int64_t xs[2] = {M, K}, ws[2] = {N, K}, ys[2] = {M, N};
    struct bie_tensor x = test_tensor(BIE_DTYPE_F32, 2, xs, NULL), w = test_tensor(BIE_DTYPE_F32, 2, ws, NULL);
    struct bie_tensor gy = test_tensor(BIE_DTYPE_F32, 2, ys, NULL), gx = test_tensor(BIE_DTYPE_F32, 2, xs, NULL);
    struct bie_tensor gw = test_tensor(BIE_DTYPE_F32, 2, ws, NULL);
    float sav = 0.05f, swv = 0.01f;
    struct bie_tensor sa, sw;
    bie_tensor_make(&sa, &sav, BIE_DTYPE_F32, 0, NULL);
    bie_tensor_make(&sw, &swv, BIE_DTYPE_F32, 0, NULL);
    for (int64_t i = 0; i < M * K; i++) ((float *)x.data)[i] = (float)((i * 37) % 101) * 0.01f - 0.5f;
    for (int64_t i = 0; i < N * K; i++) ((float *)w.data)[i] = (float)((i * 53) % 97) * 0.01f - 0.5f;
    for (int64_t i = 0; i < M * N; i++) ((float *)gy.data)[i] = (float)((i * 29) % 89) * 0.01f - 0.4f;
    const struct bie_linear_desc d = {BIE_QUANT_INT8, K, N};
    struct bie_backward_args a = {
        .x = &x, .weight = &w, .scale_a = &sa, .scale_w = &sw, .grad_y = &gy, .grad_x = &gx, .grad_weight = &gw};
    j->status = BIE_STATUS_OK;
    for (int r = 0; r < j->reps && j->status == BIE_STATUS_OK; r++) j->status = bie_linear_backward(j->ctx, &d, &a);
    struct bie_tensor * ts[] = {&x, &w, &gy, &gx, &gw};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) test_tensor_free(ts[i]);
    return NULL;
}

static bool polling_done;

static void * poll_blas(void * arg) {
    int * seen_other = arg;
    while (!__atomic_load_n(&polling_done, __ATOMIC_ACQUIRE))
        if (openblas_get_num_threads() != 2) (*seen_other)++;
    return NULL;
}

static void test_openblas_untouched(int omp_threads) {
    set_blas(2); // the application's choice, which bie must leave as it is
    __atomic_store_n(&calls_openblas_set, 0, __ATOMIC_RELAXED);
    enum { T = 2 };
    struct backward_job jobs[T];
    pthread_t th[T], poller;
    int seen_other = 0;
    polling_done = false;
    pthread_create(&poller, NULL, poll_blas, &seen_other);
    for (int i = 0; i < T; i++) {
        struct bie_context_params p;
        bie_context_params_default(&p);
        p.num_threads = omp_threads;
        jobs[i] = (struct backward_job){.reps = 20};
        bie_context_create(&p, &jobs[i].ctx);
        pthread_create(&th[i], NULL, backward_loop, &jobs[i]);
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        CHECK(jobs[i].status == BIE_STATUS_OK, "backward %d: %s", i, bie_context_last_error(jobs[i].ctx));
        bie_context_destroy(jobs[i].ctx);
    }
    __atomic_store_n(&polling_done, true, __ATOMIC_RELEASE);
    pthread_join(poller, NULL);
    CHECK(calls_openblas_set == 0, "the library called openblas_set_num_threads %d times", calls_openblas_set);
    CHECK(seen_other == 0, "another thread saw OpenBLAS's thread count changed %d times during bie's backward",
          seen_other);
    CHECK(openblas_get_num_threads() == 2, "OpenBLAS's thread count is %d after bie's backward, the application set 2",
          openblas_get_num_threads());
}

// The weight-only n-bit layer's CPU forward (its sgemm path: more than 16 rows) and backward leave
// OpenBLAS's thread count alone too, and give the same results at 1 and 2 OpenMP threads.
static void test_wq_openblas_untouched(int omp_threads) {
    set_blas(2);
    __atomic_store_n(&calls_openblas_set, 0, __ATOMIC_RELAXED);
    struct layer L;
    make_layer(&L, 40, 96, 70, 4, 32, BIE_WQ_ZERO_CODE, false, false, false);
    struct bie_tensor x = test_tensor(BIE_DTYPE_F32, 2, (int64_t[]){L.M, 96}, NULL),
                      gy = test_tensor(BIE_DTYPE_F32, 2, (int64_t[]){L.M, 70}, NULL);
    test_fill_uniform(&x, -1.0f, 1.0f);
    test_fill_uniform(&gy, -1.0f, 1.0f);
    struct bie_tensor y[2], gx[2], gw[2];
    for (int t = 0; t < 2; t++) {
        struct bie_context_params p;
        bie_context_params_default(&p);
        p.num_threads = t == 0 ? 1 : omp_threads;
        bie_context_t * ctx;
        bie_context_create(&p, &ctx);
        y[t] = test_tensor(BIE_DTYPE_F32, 2, (int64_t[]){L.M, 70}, NULL);
        gx[t] = test_tensor(BIE_DTYPE_F32, 2, (int64_t[]){L.M, 96}, NULL);
        gw[t] = test_tensor(BIE_DTYPE_F32, 2, (int64_t[]){96, 70}, NULL);
        CHECK_OK(ctx, bie_wq_linear_forward(ctx, &L.d, &L.w, &x, &y[t]));
        CHECK_OK(ctx, bie_wq_linear_backward(ctx, &L.d, &L.w, &x, &gy, &gx[t], &gw[t]));
        bie_context_destroy(ctx);
    }
    CHECK(calls_openblas_set == 0, "the weight-only layer called openblas_set_num_threads %d times",
          calls_openblas_set);
    CHECK(openblas_get_num_threads() == 2,
          "OpenBLAS's thread count is %d after the weight-only layer, the application "
          "set 2",
          openblas_get_num_threads());
    const size_t ny = (size_t)(L.M * 70) * 4, nx = (size_t)(L.M * 96) * 4, nw = (size_t)(96 * 70) * 4;
    CHECK(memcmp(y[0].data, y[1].data, ny) == 0 && memcmp(gx[0].data, gx[1].data, nx) == 0 &&
              memcmp(gw[0].data, gw[1].data, nw) == 0,
          "the weight-only layer's results differ between 1 and %d OpenMP threads", omp_threads);
    for (int t = 0; t < 2; t++) test_tensor_free(&y[t]), test_tensor_free(&gx[t]), test_tensor_free(&gw[t]);
    test_tensor_free(&x);
    test_tensor_free(&gy);
    free_layer(&L);
}

// The process umask, read without changing it.
static int read_umask(void) {
    FILE * f = fopen("/proc/self/status", "r");
    char line[256];
    int mask = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Umask: %o", &mask) == 1) break;
    if (f) fclose(f);
    return mask;
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    umask(027);
    const int mask0 = read_umask();
    const char * tsan = getenv("BIE_TEST_TSAN"); // ThreadSanitizer: one OpenMP thread per context
    const int omp_threads = tsan && *tsan ? 1 : 2;
    set_blas(2);
    test_concurrent_training(omp_threads, tsan && *tsan ? 1 : 3);
    test_openblas_untouched(omp_threads);
    test_wq_openblas_untouched(omp_threads);
    CHECK(read_umask() == mask0 && mask0 == 027, "the process umask is %03o after the saves, it was %03o", read_umask(),
          mask0);
    return test_finish("test-concurrency");
}
