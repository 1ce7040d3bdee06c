// SPDX-License-Identifier: Apache-2.0
// test-context.c: what a context promises beyond single calls:
// - the thread count is capped (BIE_MAX_THREADS): a huge count is refused up front, where OpenMP
//   would have ended the process when it could not create the threads;
// - the memory limit caps a call's workspace (OUT_OF_MEMORY naming both sizes), workspace beyond
//   BIE_WORKSPACE_KEEP is released when the call returns, and bie_context_release_workspace frees
//   it at once;
// - the message is "" after every successful call, the IO and training calls included;
// - a call made while another thread is inside a call on the same context is refused, with its
//   own message, and the other thread's call is unharmed.
#include "test-child.h"
#include "bie-train.h"
#include "test-train-util.h"

#include <pthread.h>
#include <unistd.h>

// A binary linear forward with 2^30 threads asked for: refused (INVALID_ARGUMENT), never an exit from
// inside OpenMP. Exits 0 when the library refused the count, 3 when it accepted the call.
static void huge_thread_count(void) {
    struct bie_context_params p;
    bie_context_params_default(&p);
    p.num_threads = 1 << 30;
    bie_context_t * ctx = NULL;
    if (bie_context_create(&p, &ctx) == BIE_STATUS_INVALID_ARGUMENT && !ctx) {
        if (bie_context_create(NULL, &ctx) != BIE_STATUS_OK) _exit(4);
        if (bie_context_set_num_threads(ctx, 1 << 30) != BIE_STATUS_INVALID_ARGUMENT ||
            !strstr(bie_context_last_error(ctx), "num_threads"))
            _exit(5);
        bie_context_destroy(ctx);
        _exit(0);
    }
    const int64_t M = 64, K = 64;
    float * buf = calloc((size_t)(3 * M * K), sizeof(float));
    float s = 1.0f;
    struct bie_tensor x, w, y, sa, sw;
    bie_tensor_make(&x, buf, BIE_DTYPE_F32, 2, (int64_t[]){M, K});
    bie_tensor_make(&w, buf + M * K, BIE_DTYPE_F32, 2, (int64_t[]){K, K});
    bie_tensor_make(&y, buf + 2 * M * K, BIE_DTYPE_F32, 2, (int64_t[]){M, K});
    bie_tensor_make(&sa, &s, BIE_DTYPE_F32, 0, NULL);
    bie_tensor_make(&sw, &s, BIE_DTYPE_F32, 0, NULL);
    const struct bie_linear_desc d = {BIE_QUANT_BINARY, K, K};
    const struct bie_forward_args a = {.x = &x, .weight = &w, .scale_a = &sa, .scale_w = &sw, .y = &y};
    bie_linear_forward(ctx, &d, &a);
    _exit(3);
}

static void test_thread_cap(void) {
    const int st = test_in_child(huge_thread_count, 120);
    CHECK(st == 0,
          "2^30 threads: the child ended with status %d (0: refused; 3: accepted; 1: OpenMP ended the "
          "process)",
          st);
    bie_context_t * ctx = NULL;
    CHECK_OK(ctx, bie_context_create(NULL, &ctx));
    CHECK_OK(ctx, bie_context_set_num_threads(ctx, BIE_MAX_THREADS));
    CHECK(bie_context_threads(ctx) == BIE_MAX_THREADS, "threads %d", bie_context_threads(ctx));
    CHECK_OK(ctx, bie_context_set_num_threads(ctx, 0));
    CHECK(bie_context_threads(ctx) >= 1 && bie_context_threads(ctx) <= BIE_MAX_THREADS, "default threads %d",
          bie_context_threads(ctx));
    bie_context_destroy(ctx);
}

// A reference-backend 8-bit linear forward: its workspace holds the codes of x and w as doubles.
static enum bie_status ref_forward(bie_context_t * ctx, int64_t M, int64_t K) {
    const int64_t N = 4;
    float * buf = calloc((size_t)(M * K + N * K + M * N), sizeof(float));
    float s = 1.0f;
    struct bie_tensor x, w, y, sa, sw;
    bie_tensor_make(&x, buf, BIE_DTYPE_F32, 2, (int64_t[]){M, K});
    bie_tensor_make(&w, buf + M * K, BIE_DTYPE_F32, 2, (int64_t[]){N, K});
    bie_tensor_make(&y, buf + M * K + N * K, BIE_DTYPE_F32, 2, (int64_t[]){M, N});
    bie_tensor_make(&sa, &s, BIE_DTYPE_F32, 0, NULL);
    bie_tensor_make(&sw, &s, BIE_DTYPE_F32, 0, NULL);
    const struct bie_linear_desc d = {BIE_QUANT_INT8, K, N};
    const struct bie_forward_args a = {.x = &x, .weight = &w, .scale_a = &sa, .scale_w = &sw, .y = &y};
    const enum bie_status s_ = bie_linear_forward(ctx, &d, &a);
    free(buf);
    return s_;
}

static void test_workspace(void) {
    struct bie_context_params p;
    bie_context_params_default(&p);
    p.backend = BIE_BACKEND_REF;
    bie_context_t * ctx = NULL;
    CHECK_OK(ctx, bie_context_create(&p, &ctx));
    CHECK(bie_context_memory_limit(ctx) == BIE_DEFAULT_MEMORY_LIMIT, "default limit %zu",
          bie_context_memory_limit(ctx));
    // A small call: its workspace stays for the next call.
    CHECK_OK(ctx, ref_forward(ctx, 64, 64));
    CHECK(ctx->host_ws_size > 0 && ctx->host_ws_size <= BIE_WORKSPACE_KEEP, "small workspace kept: %zu",
          ctx->host_ws_size);
    CHECK_OK(ctx, bie_context_release_workspace(ctx));
    CHECK(ctx->host_ws == NULL && ctx->host_ws_size == 0, "released: %zu bytes left", ctx->host_ws_size);
    // Over the limit: OUT_OF_MEMORY, naming the limit.
    CHECK_OK(ctx, bie_context_set_memory_limit(ctx, 1 << 20));
    TEST_EXPECT_STATUS(ctx, ref_forward(ctx, 512, 1024), BIE_STATUS_OUT_OF_MEMORY, "memory limit");
    CHECK(ctx->host_ws_size <= (1 << 20), "workspace of %zu bytes under a 1 MiB limit", ctx->host_ws_size);
    // A workspace larger than BIE_WORKSPACE_KEEP is released when the call returns, unless reserved.
    CHECK_OK(ctx, bie_context_set_memory_limit(ctx, 0));
    CHECK(bie_context_memory_limit(ctx) == BIE_DEFAULT_MEMORY_LIMIT, "limit 0 restores the default");
    if (!getenv("BIE_TEST_QUICK")) {
        CHECK_OK(ctx, ref_forward(ctx, 16384, 4096)); // x as floats and codes: 16384 * 4096 * 5 bytes
        CHECK(ctx->host_ws == NULL, "a %s workspace outlived its call", "335 MB");
    }
    CHECK_OK(ctx, bie_context_reserve(ctx, BIE_DEVICE_CPU, BIE_WORKSPACE_KEEP + 4096));
    CHECK_OK(ctx, ref_forward(ctx, 64, 64));
    CHECK(ctx->host_ws_size >= BIE_WORKSPACE_KEEP + 4096, "reserved workspace kept: %zu", ctx->host_ws_size);
    bie_context_destroy(ctx);
}

// After a failure, each successful call leaves the message empty.
static void test_message_cleared(void) {
    bie_context_t * ctx = NULL;
    CHECK_OK(ctx, bie_context_create(NULL, &ctx));
#define FAIL_THEN(call)                                                                                                \
    do {                                                                                                               \
        bie_context_set_backend(ctx, (enum bie_backend)99);                                                            \
        CHECK(bie_context_last_error(ctx)[0] != '\0', "no message after a failure");                                   \
        CHECK_OK(ctx, call);                                                                                           \
        CHECK(bie_context_last_error(ctx)[0] == '\0', "%s left the message \"%s\"", #call,                             \
              bie_context_last_error(ctx));                                                                            \
    } while (0)
    float x[8] = {1, -2, 3, -4, 5, -6, 7, -8}, y[8], g[8], m[8] = {0}, v[8] = {0};
    uint8_t labels[2] = {1, 2};
    double loss;
    struct bie_adam_params ap;
    bie_adam_params_default(&ap);
    struct bie_tensor tx = TEST_VIEW(x, BIE_DTYPE_F32, 8), ty = TEST_VIEW(y, BIE_DTYPE_F32, 8),
                      tg = TEST_VIEW(g, BIE_DTYPE_F32, 8), tm = TEST_VIEW(m, BIE_DTYPE_F32, 8),
                      tv = TEST_VIEW(v, BIE_DTYPE_F32, 8), tz = TEST_VIEW(x, BIE_DTYPE_F32, 2, 4),
                      tgz = TEST_VIEW(g, BIE_DTYPE_F32, 2, 4), tl = TEST_VIEW(labels, BIE_DTYPE_U8, 2),
                      tpx = TEST_VIEW(x, BIE_DTYPE_F32, 1, 2, 2, 2), tpy = TEST_VIEW(y, BIE_DTYPE_F32, 1, 2, 1, 1);
    FAIL_THEN(bie_activation_forward(ctx, BIE_ACT_RELU, &(struct bie_activation_args){&tx, &ty}));
    FAIL_THEN(bie_softmax_cross_entropy(ctx, &(struct bie_softmax_cross_entropy_args){&tz, &tl, &tgz, &loss, NULL}));
    FAIL_THEN(bie_adam_step(ctx, &ap, &(struct bie_adam_args){1, &ty, &tg, &tm, &tv}));
    FAIL_THEN(
        bie_maxpool2d_forward(ctx, &(struct bie_maxpool2d_desc){2}, &(struct bie_maxpool2d_args){&tpx, &tpy, NULL}));
    bie_model_t * model = NULL;
    FAIL_THEN(bie_model_create(ctx, "input 1 2 2; linear b1 3", BIE_LATENT_F32, 1, &model));
    const float * logits;
    FAIL_THEN(test_forward(ctx, model, x, 2, 1, 0, &logits));
    const struct bie_st_tensor t = {
        .name = "a", .dtype = BIE_DTYPE_F32, .ndim = 1, .shape = {8}, .data = x, .nbytes = sizeof x};
    char path[] = "/tmp/bie-test-context-XXXXXX";
    const int fd = mkstemp(path);
    close(fd);
    FAIL_THEN(bie_safetensors_write(ctx, path, &t, 1, NULL, 0));
    bie_safetensors_t * st = NULL;
    FAIL_THEN(bie_safetensors_read(ctx, path, &st));
    bie_safetensors_free(st);
    unlink(path);
    bie_model_destroy(model);
    bie_context_destroy(ctx);
#undef FAIL_THEN
}

// Thread B calls while thread A is inside a call on the same context (A holds it through the guard
// every public function takes, so the overlap is certain, not a race the test hopes to hit).
struct intruder {
    bie_context_t * ctx;
    bool every_family; // also one call of each other family of entry points (which must be refused)
    enum bie_status status;
    char msg[BIE_ERROR_CAP];
    const char * owner_msg; // the owner's message, which a refused call leaves as it is
    int not_refused;        // of those calls, how many were let in (they write the owner's message)
};
// A call of entry point family i (NULL arguments: the guard refuses a second thread before it reads
// them), or -1 past the last family.
static enum bie_status family_call(bie_context_t * ctx, int i) {
    switch (i) {
    case 0: return bie_matmul_forward(ctx, NULL, NULL);
    case 1: return bie_matmul_backward(ctx, NULL, NULL);
    case 2: return bie_embedding_forward(ctx, NULL, NULL);
    case 3: return bie_embedding_backward(ctx, NULL, NULL);
    case 4: return bie_wq_linear_forward(ctx, NULL, NULL, NULL, NULL);
    case 5: return bie_wq_linear_backward(ctx, NULL, NULL, NULL, NULL, NULL, NULL);
    case 6: return bie_wq_dequantize(ctx, NULL, NULL, NULL);
    case 7: return bie_wq_pack(ctx, NULL, NULL, NULL, NULL);
    case 8: return bie_wq_unpack(ctx, NULL, NULL, NULL, NULL);
    case 9: return bie_wq_quantize(ctx, NULL, NULL, NULL);
    case 10: return bie_affine_maxpool2d_forward(ctx, NULL, NULL);
    case 11: return bie_linear_forward(ctx, NULL, NULL);
    case 12: return bie_pack(ctx, NULL, NULL, NULL);
    default: return (enum bie_status) - 1;
    }
}
static void * intrude(void * arg) {
    struct intruder * in = arg;
    float x[4] = {1, -1, 2, -2}, y[4];
    struct bie_tensor tx = TEST_VIEW(x, BIE_DTYPE_F32, 4), ty = TEST_VIEW(y, BIE_DTYPE_F32, 4);
    in->status = bie_activation_forward(in->ctx, BIE_ACT_RELU, &(struct bie_activation_args){&tx, &ty});
    snprintf(in->msg, sizeof in->msg, "%s", bie_context_last_error(in->ctx));
    for (int i = 0; in->every_family; i++) {
        const enum bie_status s = family_call(in->ctx, i);
        if ((int)s == -1) break;
        if (s != BIE_STATUS_INVALID_ARGUMENT || strcmp(in->ctx->error, in->owner_msg) != 0) {
            if (!in->not_refused)
                fprintf(stderr, "family %d: %s, the context's message \"%s\"\n", i, bie_status_string(s),
                        in->ctx->error);
            in->not_refused++;
            snprintf(in->ctx->error, sizeof in->ctx->error, "%s", in->owner_msg); // (the owner waits in join)
        }
    }
    return NULL;
}

static void test_shared_context(void) {
    bie_context_t * ctx = NULL;
    CHECK_OK(ctx, bie_context_create(NULL, &ctx));
    bie_context_set_backend(ctx, (enum bie_backend)99); // the owner's message, which B must not touch
    char owner_msg[BIE_ERROR_CAP];
    snprintf(owner_msg, sizeof owner_msg, "%s", bie_context_last_error(ctx));
    {
        struct bie_ctx_guard g = {ctx};
        CHECK(bie_ctx_enter(ctx), "enter"); // this thread is now inside a call on ctx
        snprintf(ctx->error, sizeof ctx->error, "%s", owner_msg);
        struct intruder in = {.ctx = ctx, .every_family = true, .owner_msg = owner_msg};
        pthread_t th;
        pthread_create(&th, NULL, intrude, &in);
        pthread_join(th, NULL);
        CHECK(in.status == BIE_STATUS_INVALID_ARGUMENT, "a second thread's call got %s", bie_status_string(in.status));
        CHECK(in.not_refused == 0, "%d entry points let a second thread in (the first is printed above)",
              in.not_refused);
        CHECK(strstr(in.msg, "another thread") != NULL, "the refused thread reads \"%s\"", in.msg);
        CHECK(strcmp(bie_context_last_error(ctx), owner_msg) == 0, "the owner's message became \"%s\"",
              bie_context_last_error(ctx));
        bie_ctx_leave_guard(&g);
    }
    // Free again: the other thread may use it now (a context may move between threads).
    struct intruder in = {.ctx = ctx};
    pthread_t th;
    pthread_create(&th, NULL, intrude, &in);
    pthread_join(th, NULL);
    CHECK(in.status == BIE_STATUS_OK && in.msg[0] == '\0', "after the owner's call: %s \"%s\"",
          bie_status_string(in.status), in.msg);
    bie_context_destroy(ctx);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    test_thread_cap();
    test_workspace();
    test_message_cleared();
    test_shared_context();
    return test_finish("test-context");
}
