// SPDX-License-Identifier: Apache-2.0
// test-model-limits.c: what a model file may make the library do, and what a checkpoint may hold:
// - the activation memory of a model at a batch (bie_model_memory) is checked against the
//   context's memory limit: on load for one sample (a tiny file with a huge activation footprint
//   is refused), and on each forward for its batch, before anything is allocated (peak RSS
//   measured in a child process);
// - checkpoint contents are validated on load and before save: NaN or infinite values, a negative
//   second moment or running variance, values beyond 1e30 and step counts beyond 2^62 are refused
//   with the tensor's name (a NaN moment resumed silently and exported a broken model before);
// - the optimizer's step counter never overflows.
#include "test-child.h"
#include "test-train-util.h"
#include "nn/model-impl.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static bool quick;

static void tmp_path(char * out) {
    snprintf(out, 64, "/tmp/bie-test-limits-XXXXXX");
    const int fd = mkstemp(out);
    if (fd >= 0) close(fd);
}

// The audit's file: a 1x1 binary conv to `width` channels, then `relus` ReLUs, each its own
// activation buffer (per sample: (relus + 1) * width * 28 * 28 floats).
static void hostile_arch(char * out, size_t size, int width, int relus) {
    int len = snprintf(out, size, "input 1 28 28; conv b1 %d 1", width);
    for (int i = 0; i < relus && (size_t)len < size; i++) len += snprintf(out + len, size - (size_t)len, "; relu");
}

// A packed file of arch (its scales set as a trained model's would be).
static void write_packed(bie_context_t * ctx, const char * arch, const char * path) {
    bie_model_t * m = NULL;
    CHECK_OK(ctx, bie_model_create(ctx, arch, BIE_LATENT_F32, 1, &m));
    if (!m) return;
    for (int64_t i = 0; i < m->n_layers; i++)
        if (m->L[i].scale_a.v) m->L[i].scale_a.v[0] = 0.5f;
    CHECK_OK(ctx, bie_model_save(ctx, m, path, BIE_MODEL_FILE_PACKED, NULL, 0));
    bie_model_destroy(m);
}

static char hostile_path[64];

// Loads the hostile file under an 8 MiB limit (one sample needs more: refused), then under the
// default, and runs a batch of 10 under a 64 MiB limit: refused before anything is allocated.
// Exit status: 0 as expected, 3 load accepted, 4 forward accepted, 5 wrong message.
static void hostile_child(void) {
    bie_context_t * ctx = NULL;
    bie_context_create(NULL, &ctx);
    bie_context_set_memory_limit(ctx, (size_t)8 << 20);
    bie_model_t * m = NULL;
    bie_model_load(ctx, hostile_path, &m, NULL);
    if (m) _exit(3);
    if (!strstr(bie_context_last_error(ctx), "memory limit")) _exit(5);
    // Under the default limit it loads (one sample fits), and a batch of 10 does not.
    bie_context_set_memory_limit(ctx, 0);
    if (bie_model_load(ctx, hostile_path, &m, NULL) != BIE_STATUS_OK) _exit(6);
    const int64_t n = 10, in = bie_model_num_inputs(m);
    float * x = calloc((size_t)(n * in), sizeof(float));
    bie_context_set_memory_limit(ctx, (size_t)64 << 20);
    float * logits = calloc((size_t)(n * bie_model_num_outputs(m)), sizeof(float));
    struct bie_tensor tx = TEST_VIEW(x, BIE_DTYPE_F32, n, in),
                      tz = TEST_VIEW(logits, BIE_DTYPE_F32, n, bie_model_num_outputs(m));
    if (bie_model_forward(ctx, m, &(struct bie_model_forward_desc){0, 0}, &(struct bie_model_forward_args){&tx, &tz}) !=
        BIE_STATUS_OUT_OF_MEMORY)
        _exit(4);
    if (!strstr(bie_context_last_error(ctx), "memory limit")) _exit(5);
    free(logits);
    free(x);
    bie_model_destroy(m);
    bie_context_destroy(ctx);
}

static void test_activation_memory(bie_context_t * ctx) {
    // bie_model_memory: activations of each layer's output, the gradients in training, max-pool
    // indexes and the float layers' im2col scratch; linear in the batch.
    bie_model_t * m = NULL;
    CHECK_OK(ctx,
             bie_model_create(ctx, "input 1 8 8; conv f32 4 3; maxpool 2; relu; linear b1 5", BIE_LATENT_F32, 1, &m));
    size_t b1 = 0, b7 = 0, t7 = 0;
    CHECK_OK(ctx, bie_model_memory(m, 1, 0, &b1));
    CHECK_OK(ctx, bie_model_memory(m, 7, 0, &b7));
    CHECK_OK(ctx, bie_model_memory(m, 7, 1, &t7));
    // per sample: outputs 256 + 64 + 64 + 5 floats, argmax 64, scratch (9 + 4) * 64 floats
    CHECK(b1 == 4 * (256 + 64 + 64 + 5 + 64 + 13 * 64), "one sample: %zu bytes", b1);
    CHECK(b7 == 7 * b1 && t7 > b7, "7 samples: %zu bytes, in training %zu", b7, t7);
    CHECK(bie_model_memory(m, 0, 0, &b1) == BIE_STATUS_INVALID_ARGUMENT, "batch 0");
    bie_model_destroy(m);

    char arch[2048];
    const int width = quick ? 100 : 500, relus = 30;
    hostile_arch(arch, sizeof arch, width, relus);
    tmp_path(hostile_path);
    write_packed(ctx, arch, hostile_path);
    int status = -1;
    const long long g = test_rss_growth(hostile_child, &status);
    // per sample (relus + 1) * width * 784 floats: 48.6 MB for 500 channels, 486 MB for a batch of 10
    CHECK(status == 0,
          "hostile model under 8 and 64 MiB limits: child status %d (3: loaded, 4: batch of 10 ran, 5: "
          "message, 6: refused under the default limit)",
          status);
    CHECK(g >= 0 && g < (64 << 20), "hostile model: %lld bytes of peak RSS growth under a 64 MiB limit", g);
    unlink(hostile_path);
}

// --- checkpoint contents --------------------------------------------------------------------------

#define ARCH "input 1 6 6; conv f32 3 3; bn; conv b1 4 3; bn; linear q8 5; bn; linear f32 3"

static bie_model_t * trained(bie_context_t * ctx) {
    bie_model_t * m = NULL;
    CHECK_OK(ctx, bie_model_create(ctx, ARCH, BIE_LATENT_F32, 3, &m));
    if (!m) return NULL;
    float x[4 * 36], g[4 * 3];
    uint8_t y[4] = {0, 1, 2, 1};
    for (int i = 0; i < 4 * 36; i++) x[i] = test_rand_float(-1, 1);
    const float * logits;
    double loss;
    CHECK_OK(ctx, test_forward(ctx, m, x, 4, 1, 0, &logits));
    struct bie_tensor tz = TEST_VIEW(logits, BIE_DTYPE_F32, 4, 3), tl = TEST_VIEW(y, BIE_DTYPE_U8, 4),
                      tg = TEST_VIEW(g, BIE_DTYPE_F32, 4, 3);
    CHECK_OK(ctx, bie_softmax_cross_entropy(ctx, &(struct bie_softmax_cross_entropy_args){&tz, &tl, &tg, &loss, NULL}));
    CHECK_OK(ctx, test_backward(ctx, m, 4, g));
    CHECK_OK(ctx, test_step(ctx, m, 0.01f, 0.0f, 0.05f));
    return m;
}

// Rewrites the checkpoint at path with element 0 of tensor `name` set to v (or, name NULL, the
// metadata key `key` set to `value`).
static void rewrite(bie_context_t * ctx, const char * path, const char * name, float v, const char * key,
                    const char * value, const char * out) {
    bie_safetensors_t * st = NULL;
    CHECK_OK(ctx, bie_safetensors_read(ctx, path, &st));
    if (!st) return;
    const size_t nt = bie_safetensors_count(st), nm = bie_safetensors_metadata_count(st);
    struct bie_st_tensor * t = calloc(nt, sizeof *t);
    void ** copies = calloc(nt, sizeof *copies);
    const char ** mv = calloc(2 * nm + 2, sizeof *mv);
    bool found = name == NULL;
    for (size_t i = 0; i < nt; i++) {
        t[i] = *bie_safetensors_at(st, i);
        if (name && strcmp(t[i].name, name) == 0) {
            copies[i] = malloc(t[i].nbytes);
            memcpy(copies[i], t[i].data, t[i].nbytes);
            memcpy(copies[i], &v, sizeof v);
            t[i].data = copies[i];
            found = true;
        }
    }
    CHECK(found, "no tensor %s in the checkpoint", name);
    for (size_t i = 0; i < nm; i++) {
        mv[2 * i] = bie_safetensors_metadata_at(st, i, &mv[2 * i + 1]);
        if (key && strcmp(mv[2 * i], key) == 0) mv[2 * i + 1] = value;
    }
    CHECK_OK(ctx, bie_safetensors_write(ctx, out, t, nt, mv, nm));
    for (size_t i = 0; i < nt; i++) free(copies[i]);
    free(copies);
    free(t);
    free(mv);
    bie_safetensors_free(st);
}

static void test_checkpoint_values(bie_context_t * ctx) {
    bie_model_t * m = trained(ctx);
    if (!m) return;
    char good[64], bad[64];
    tmp_path(good);
    tmp_path(bad);
    CHECK_OK(ctx, bie_model_save(ctx, m, good, BIE_MODEL_FILE_CHECKPOINT, NULL, 0));
    bie_model_t * back = NULL;
    CHECK_OK(ctx, bie_model_load(ctx, good, &back, NULL));
    bie_model_destroy(back);
    // Values the file must not hold, each refused on load with the tensor's name.
    const struct {
        const char * name;
        float v;
    } cases[] = {
        {"layers.2.weight.opt_m", NAN},  {"layers.2.weight.opt_v", -1.0f}, {"layers.0.weight", INFINITY},
        {"layers.1.running_var", -0.5f}, {"layers.3.running_mean", NAN},   {"layers.4.bias_a.opt_m", 3e38f},
        {"layers.4.scale_a", -1.0f},     {"layers.0.bias.opt_v", NAN},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rewrite(ctx, good, cases[i].name, cases[i].v, NULL, NULL, bad);
        bie_model_t * l = NULL;
        const enum bie_status s = bie_model_load(ctx, bad, &l, NULL);
        CHECK(s == BIE_STATUS_FORMAT_ERROR && !l && strstr(bie_context_last_error(ctx), cases[i].name),
              "%s = %g: load gave %s \"%s\"", cases[i].name, (double)cases[i].v, bie_status_string(s),
              bie_context_last_error(ctx));
        bie_model_destroy(l);
    }
    // A step count the optimizer could not continue from.
    rewrite(ctx, good, NULL, 0, "bie.step", "9223372036854775807", bad);
    bie_model_t * l = NULL;
    TEST_EXPECT_STATUS(ctx, bie_model_load(ctx, bad, &l, NULL), BIE_STATUS_FORMAT_ERROR, "bie.step");
    bie_model_destroy(l);
    // The same values are refused before save (the model is left as it is, nothing is written).
    unlink(bad);
    const float keep_m = m->L[2].w.m[0], keep_v = m->L[2].w.s[0];
    m->L[2].w.m[0] = NAN;
    TEST_EXPECT_STATUS(ctx, bie_model_save(ctx, m, bad, BIE_MODEL_FILE_CHECKPOINT, NULL, 0),
                       BIE_STATUS_INVALID_ARGUMENT, "layers.2.weight.opt_m");
    m->L[2].w.m[0] = 1e38f; // huge but finite: saved before, then refused on load
    TEST_EXPECT_STATUS(ctx, bie_model_save(ctx, m, bad, BIE_MODEL_FILE_CHECKPOINT, NULL, 0),
                       BIE_STATUS_INVALID_ARGUMENT, "layers.2.weight.opt_m");
    m->L[2].w.m[0] = keep_m;
    m->L[2].w.s[0] = -keep_v - 1.0f;
    TEST_EXPECT_STATUS(ctx, bie_model_save(ctx, m, bad, BIE_MODEL_FILE_CHECKPOINT, NULL, 0),
                       BIE_STATUS_INVALID_ARGUMENT, "layers.2.weight.opt_v");
    m->L[2].w.s[0] = keep_v;
    m->L[1].rvar[0] = NAN; // also in the packed export
    TEST_EXPECT_STATUS(ctx, bie_model_save(ctx, m, bad, BIE_MODEL_FILE_PACKED, NULL, 0), BIE_STATUS_INVALID_ARGUMENT,
                       "layers.1.running_var");
    m->L[1].rvar[0] = 1.0f;
    CHECK(access(bad, F_OK) != 0, "a refused save wrote the file");
    const char * meta[2] = {"note", "\xff\xfe"};
    TEST_EXPECT_STATUS(ctx, bie_model_save(ctx, m, bad, BIE_MODEL_FILE_CHECKPOINT, meta, 1),
                       BIE_STATUS_INVALID_ARGUMENT, "UTF-8");
    // The step counter at its bound: refused, not wrapped.
    m->step = INT64_C(1) << 62;
    TEST_EXPECT_STATUS(ctx, test_step(ctx, m, 0.01f, 0.0f, 0.05f), BIE_STATUS_INVALID_ARGUMENT, "step");
    CHECK(m->step == INT64_C(1) << 62, "the step counter moved to %lld", (long long)m->step);
    unlink(good);
    unlink(bad);
    bie_model_destroy(m);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    quick = getenv("BIE_TEST_QUICK") != NULL;
    bie_context_t * ctx = NULL;
    CHECK_OK(ctx, bie_context_create(NULL, &ctx));
    if (!ctx) return test_finish("test-model-limits");
    test_activation_memory(ctx);
    test_checkpoint_values(ctx);
    bie_context_destroy(ctx);
    return test_finish("test-model-limits");
}
