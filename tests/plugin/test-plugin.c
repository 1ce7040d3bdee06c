// SPDX-License-Identifier: Apache-2.0
// test-plugin.c: libbie without its CUDA backend. Linked to the shared libbie through the public
// headers only, as a user's program is, and run by CTest with the plugin made unusable in each
// way it can be (tests/plugin/CMakeLists.txt): libbie must load, say why CUDA is absent in words
// that contain argv[1], answer every CUDA entry point with UNSUPPORTED and that reason, and run
// CPU layers as usual.
//
// Usage: test-plugin EXPECTED-WORDS
//        test-plugin --loads   (a CUDA build: the real plugin must load; CUDA is then available, or
//                               absent for want of a GPU only)
#include "bie-cuda.h"
#include "bie.h"

#include <stdio.h>
#include <string.h>

static int failures = 0;
#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            failures++;                                                                                                \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                            \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fputc('\n', stderr);                                                                                       \
        }                                                                                                              \
    } while (0)

// A binary linear layer on the CPU: x [2, 5] of +-1 values, w [3, 5], scales 1; y = x . w^T.
static void cpu_layer_runs(bie_context_t * ctx) {
    float x[10] = {1, -1, 1, 1, -1, -1, -1, 1, 1, 1}, w[15] = {1, 1, 1, 1, 1, -1, 1, -1, 1, -1, 1, -1, 1, 1, -1};
    float y[6] = {0}, one = 1.0f;
    struct bie_tensor tx, tw, ty, sa, sw;
    bie_tensor_make(&tx, x, BIE_DTYPE_F32, 2, (int64_t[]){2, 5});
    bie_tensor_make(&tw, w, BIE_DTYPE_F32, 2, (int64_t[]){3, 5});
    bie_tensor_make(&ty, y, BIE_DTYPE_F32, 2, (int64_t[]){2, 3});
    bie_tensor_make(&sa, &one, BIE_DTYPE_F32, 0, NULL);
    bie_tensor_make(&sw, &one, BIE_DTYPE_F32, 0, NULL);
    const struct bie_linear_desc d = {BIE_QUANT_BINARY, 5, 3};
    const struct bie_forward_args a = {.x = &tx, .weight = &tw, .scale_a = &sa, .scale_w = &sw, .y = &ty};
    const enum bie_status s = bie_linear_forward(ctx, &d, &a);
    CHECK(s == BIE_STATUS_OK, "CPU forward: %s", bie_context_last_error(ctx));
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            float want = 0;
            for (int k = 0; k < 5; k++) want += x[i * 5 + k] * w[j * 5 + k];
            CHECK(y[i * 3 + j] == want, "y[%d][%d] = %g, want %g", i, j, (double)y[i * 3 + j], (double)want);
        }
}

int main(int argc, char ** argv) {
    const char * expected = argc > 1 ? argv[1] : "";
    if (!strcmp(expected, "--loads")) {
        const char * why = bie_backend_unavailable_reason(BIE_BACKEND_CUDA);
        CHECK(bie_backend_available(BIE_BACKEND_CUDA) || (why && !strncmp(why, "no CUDA device", 14)),
              "the CUDA plugin does not load: %s", why ? why : "(no reason)");
        printf("test-plugin: the CUDA plugin loads; CUDA: %s\n", why ? why : "available");
        return failures ? 1 : 0;
    }
    CHECK(bie_backend_available(BIE_BACKEND_CPU) == 1, "the CPU backend is always there");
    CHECK(bie_backend_unavailable_reason(BIE_BACKEND_CPU) == NULL, "no reason for the CPU");
    CHECK(bie_backend_available(BIE_BACKEND_CUDA) == 0, "CUDA must be unavailable here");
    const char * why = bie_backend_unavailable_reason(BIE_BACKEND_CUDA);
    CHECK(why && strstr(why, expected), "reason '%s' lacks '%s'", why ? why : "(null)", expected);
    if (why) printf("test-plugin: CUDA unavailable: %s\n", why);

    bie_context_t * ctx;
    if (bie_context_create(NULL, &ctx) != BIE_STATUS_OK) return 1;
    // Every CUDA entry point answers UNSUPPORTED with the reason, and touches no pointer.
    CHECK(bie_context_set_cuda_stream(ctx, NULL) == BIE_STATUS_UNSUPPORTED, "set stream");
    CHECK(strstr(bie_context_last_error(ctx), expected), "message: %s", bie_context_last_error(ctx));
    CHECK(bie_context_cuda_stream(ctx) == NULL, "no stream");
    CHECK(bie_context_cuda_synchronize(ctx) == BIE_STATUS_OK, "nothing to wait for");
    CHECK(bie_cuda_record_begin(ctx) == BIE_STATUS_UNSUPPORTED, "record");
    bie_cuda_graph_t * graph = (bie_cuda_graph_t *)(uintptr_t)0x10;
    CHECK(bie_cuda_record_end(ctx, &graph) == BIE_STATUS_INVALID_ARGUMENT && graph == NULL, "record_end");
    CHECK(bie_cuda_replay(ctx, NULL) == BIE_STATUS_INVALID_ARGUMENT, "replay of no graph");
    bie_cuda_graph_destroy(NULL);
    CHECK(bie_context_reserve(ctx, BIE_DEVICE_CUDA, 1 << 20) == BIE_STATUS_UNSUPPORTED, "reserve");
    struct bie_tensor x, w, y, xb, sa, sw, out;
    float one = 1.0f, scale = 0.0f;
    bie_tensor_make(&x, (void *)(uintptr_t)0x1000, BIE_DTYPE_F32, 2, (int64_t[]){3, 40});
    bie_tensor_make(&w, (void *)(uintptr_t)0x2000, BIE_DTYPE_F32, 2, (int64_t[]){5, 40});
    bie_tensor_make(&y, (void *)(uintptr_t)0x3000, BIE_DTYPE_F32, 2, (int64_t[]){3, 5});
    bie_tensor_make(&xb, (void *)(uintptr_t)0x4000, BIE_DTYPE_B1, 2, (int64_t[]){3, 40});
    bie_tensor_make(&sa, &one, BIE_DTYPE_F32, 0, NULL);
    bie_tensor_make(&sw, &one, BIE_DTYPE_F32, 0, NULL);
    bie_tensor_make(&out, &scale, BIE_DTYPE_F32, 0, NULL);
    x.device_type = w.device_type = y.device_type = xb.device_type = BIE_DEVICE_CUDA;
    const struct bie_linear_desc d = {BIE_QUANT_BINARY, 40, 5};
    const struct bie_forward_args a = {.x = &x, .weight = &w, .scale_a = &sa, .scale_w = &sw, .y = &y};
    CHECK(bie_linear_forward(ctx, &d, &a) == BIE_STATUS_UNSUPPORTED, "forward: %s", bie_context_last_error(ctx));
    CHECK(strstr(bie_context_last_error(ctx), expected), "message: %s", bie_context_last_error(ctx));
    CHECK(bie_pack(ctx, &x, NULL, &xb) == BIE_STATUS_UNSUPPORTED, "pack: %s", bie_context_last_error(ctx));
    CHECK(bie_weight_scale_init(ctx, BIE_QUANT_BINARY, &x, &out) == BIE_STATUS_UNSUPPORTED, "scale: %s",
          bie_context_last_error(ctx));
    cpu_layer_runs(ctx);
    bie_context_destroy(ctx);
    if (failures) {
        fprintf(stderr, "test-plugin: %d failures\n", failures);
        return 1;
    }
    printf("test-plugin: ok\n");
    return 0;
}
