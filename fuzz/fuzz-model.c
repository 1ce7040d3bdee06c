// SPDX-License-Identifier: Apache-2.0
// fuzz-model.c: libFuzzer target of model files, end to end. An input is a safetensors image (the
// corpus: the model files of fuzz/corpus-safetensors); when it loads as a model, the model runs:
// - an inference forward on a batch of 1 to 3 (x drawn from the input);
// - a checkpoint: a training forward, softmax cross-entropy, backward and one optimizer step, then
//   save (checkpoint and packed export) and reload: the reloaded checkpoint's logits and the packed
//   model's equal the trained model's, bit for bit;
// - a packed model: save and reload, the same logits.
// Any input must give OK or an error status: never a crash, a leak, undefined behaviour, a file
// the loader refuses after the saver wrote it, or different logits. The context's memory limit
// is 256 MiB (a hostile architecture is refused on load), and models whose forward would take
// more than 2^26 multiply-adds per sample are loaded but not run (libFuzzer's time per input).
#include "bie.h"
#include "bie-train.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size);

static void finding(const char * what, bie_context_t * ctx) {
    fprintf(stderr, "\nbie model fuzzer: %s (%s)\n", what, bie_context_last_error(ctx));
    abort();
}

// Multiply-adds of one sample's forward (conv and linear layers).
static double macs(const bie_model_t * m) {
    double t = 0;
    for (int64_t i = 0; i < bie_model_num_layers(m); i++) {
        struct bie_model_layer_info li;
        if (bie_model_layer_info(m, i, &li) == BIE_STATUS_OK && li.quant[0])
            t += (double)li.params * (double)li.out_shape[1] * (double)li.out_shape[2];
    }
    return t;
}

// x [n, inputs] and out [n, outputs] as views of m.
static void views(const bie_model_t * m, const float * x, int64_t n, float * out, struct bie_tensor * tx,
                  struct bie_tensor * tout) {
    bie_tensor_make(tx, (void *)(uintptr_t)x, BIE_DTYPE_F32, 2, (const int64_t[]){n, bie_model_num_inputs(m)});
    bie_tensor_make(tout, out, BIE_DTYPE_F32, 2, (const int64_t[]){n, bie_model_num_outputs(m)});
}

static const float * infer(bie_context_t * ctx, bie_model_t * m, const float * x, int64_t n, float * out) {
    struct bie_tensor tx, tz;
    views(m, x, n, out, &tx, &tz);
    const struct bie_model_forward_desc d = {0, 0};
    return bie_model_forward(ctx, m, &d, &(struct bie_model_forward_args){&tx, &tz}) == BIE_STATUS_OK ? out : NULL;
}

// Saves m as `kind`, loads it back and compares its logits on x with want (NULL: not compared).
static void round_trip(bie_context_t * ctx, bie_model_t * m, enum bie_model_file kind, const char * path,
                       const float * x, int64_t n, const float * want) {
    if (bie_model_save(ctx, m, path, kind, NULL, 0) != BIE_STATUS_OK) {
        // A model whose values the file format refuses (a NaN reached by training, say) is not
        // saved; anything else is a finding.
        if (!strstr(bie_context_last_error(ctx), "not saved")) finding("save failed", ctx);
        return;
    }
    bie_model_t * back = NULL;
    if (bie_model_load(ctx, path, &back, NULL) != BIE_STATUS_OK) finding("a saved model does not load", ctx);
    const int64_t k = bie_model_num_outputs(back);
    float * got = malloc(sizeof(float) * (size_t)(n * k));
    if (want && infer(ctx, back, x, n, got) && memcmp(got, want, sizeof(float) * (size_t)(n * k)) != 0)
        finding(kind == BIE_MODEL_FILE_PACKED ? "the packed model's logits differ" : "the reloaded logits differ", ctx);
    free(got);
    bie_model_destroy(back);
    unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    static bie_context_t * ctx;
    static char path[64];
    if (!ctx) {
        if (bie_context_create(NULL, &ctx) != BIE_STATUS_OK) abort();
        bie_context_set_num_threads(ctx, 1);
        bie_context_set_memory_limit(ctx, (size_t)256 << 20);
        snprintf(path, sizeof path, "%s/bie-fuzz-model-%d.safetensors", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp",
                 (int)getpid());
    }
    bie_safetensors_t * st = NULL;
    bie_model_t * m = NULL;
    if (bie_safetensors_parse(ctx, data, size, &st) != BIE_STATUS_OK ||
        bie_model_from_safetensors(ctx, st, &m) != BIE_STATUS_OK || macs(m) > (double)(1 << 26)) {
        bie_model_destroy(m);
        bie_safetensors_free(st);
        return 0;
    }
    if (getenv("BIE_FUZZ_VERBOSE")) fprintf(stderr, "model: %s (%s)\n", bie_model_arch(m), bie_model_is_packed(m) ? "packed" : "checkpoint");
    const int64_t n = 1 + (int64_t)(size % 3), in = bie_model_num_inputs(m), k = bie_model_num_outputs(m);
    float * x = malloc(sizeof(float) * (size_t)(n * in));
    float * l0 = malloc(sizeof(float) * (size_t)(n * k));
    float * g = malloc(sizeof(float) * (size_t)(n * k));
    uint8_t * y = malloc((size_t)n);
    for (int64_t i = 0; i < n * in; i++) x[i] = (float)data[(size_t)i % size] / 64.0f - 2.0f;
    for (int64_t i = 0; i < n; i++) y[i] = (uint8_t)(data[(size_t)i % size] % (k < 256 ? k : 256));
    if (!bie_model_is_packed(m)) {
        double loss;
        struct bie_tensor tx, tz, tl, tg;
        views(m, x, n, l0, &tx, &tz);
        bie_tensor_make(&tl, y, BIE_DTYPE_U8, 1, &n);
        bie_tensor_make(&tg, g, BIE_DTYPE_F32, 2, (const int64_t[]){n, k});
        const struct bie_model_forward_desc train = {1, 0};
        const struct bie_model_step_desc step = {0.01f, 0.0f, 0.05f};
        if (bie_model_forward(ctx, m, &train, &(struct bie_model_forward_args){&tx, &tz}) == BIE_STATUS_OK &&
            bie_softmax_cross_entropy(ctx, &(struct bie_softmax_cross_entropy_args){&tz, &tl, &tg, &loss, NULL}) ==
                BIE_STATUS_OK &&
            bie_model_backward(ctx, m, &(struct bie_model_backward_args){&tg}) == BIE_STATUS_OK)
            bie_model_step(ctx, m, &step);
        const bool ran = infer(ctx, m, x, n, l0) != NULL;
        round_trip(ctx, m, BIE_MODEL_FILE_CHECKPOINT, path, x, n, ran ? l0 : NULL);
        round_trip(ctx, m, BIE_MODEL_FILE_PACKED, path, x, n, ran ? l0 : NULL);
    } else {
        const bool ran = infer(ctx, m, x, n, l0) != NULL;
        round_trip(ctx, m, BIE_MODEL_FILE_PACKED, path, x, n, ran ? l0 : NULL);
    }
    free(x);
    free(l0);
    free(g);
    free(y);
    bie_model_destroy(m);
    bie_safetensors_free(st);
    return 0;
}
