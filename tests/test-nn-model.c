// SPDX-License-Identifier: Apache-2.0
// test-nn-model.c: the model end to end on small random problems (test-nn-graph.c has the graph's
// own tests):
// - architecture strings: valid ones give the right shapes, invalid ones are refused;
// - float conv / linear gradients (OpenBLAS paths) against central finite differences;
// - a packed file reloaded gives bit-identical logits to the trained model, for b1, q4, q8
//   layers and int8 latent weights; a checkpoint reloaded continues training bit-identically;
// - float_layers mode (low-bit layers as float GEMMs) gives the same logits;
// - training lowers the loss on a learnable problem;
// - damaged model files are refused with FORMAT_ERROR.
#include "test-train-util.h"
#include "nn/model-impl.h"

#include <unistd.h>

static bool quick;

static void test_arch(bie_context_t * ctx) {
    bie_model_t * m =
        test_model_create(ctx, "input 3 9 7; conv f32 4 3 2 1; maxpool 2; bn; relu; linear b1 5", BIE_LATENT_F32, 1);
    if (m) {
        struct bie_model_layer_info li;
        CHECK_OK(ctx, bie_model_layer_info(m, 0, &li));
        // (9 + 2 - 3)/2 + 1 = 5, (7 + 2 - 3)/2 + 1 = 4
        CHECK(li.out_shape[0] == 4 && li.out_shape[1] == 5 && li.out_shape[2] == 4, "conv out %lldx%lldx%lld",
              (long long)li.out_shape[0], (long long)li.out_shape[1], (long long)li.out_shape[2]);
        CHECK_OK(ctx, bie_model_layer_info(m, 1, &li));
        CHECK(li.out_shape[1] == 2 && li.out_shape[2] == 2, "pool out");
        CHECK(bie_model_num_outputs(m) == 5 && bie_model_num_inputs(m) == 189, "outputs / inputs");
        CHECK_OK(ctx, bie_model_layer_info(m, 4, &li));
        CHECK(li.params == 5 * 16 + 16 + 2 && li.bytes == 5 * 16 * 4 + 4 * 18, "b1 linear params %lld bytes %lld",
              (long long)li.params, (long long)li.bytes);
    }
    bie_model_destroy(m);
    const char * bad[] = {"",
                          "conv f32 4 3",
                          "input 1 4 4",
                          "input 1 4 4; conv f16 4 3",
                          "input 1 4 4; conv b1 4 16",
                          "input 1 4 4; maxpool 5",
                          "input 1 4 4; linear b1 0",
                          "input 1 4 4; linear b1 4 4",
                          "input 1 4 4; dense 4",
                          "input 0 4 4; bn",
                          "input 1 4 4; conv b1 4 3 0",
                          "input 1 4 4; conv b1 4 3 1 4",
                          "input 1 4 4; bn 3",
                          "input 1 4 4; linear b1 99999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        m = NULL;
        CHECK(bie_model_create(ctx, bad[i], BIE_LATENT_F32, 1, &m) == BIE_STATUS_INVALID_ARGUMENT && !m,
              "bad arch accepted: \"%s\"", bad[i]);
        bie_model_destroy(m);
    }
}

// Gradients of the float layers and batch norm through the model (no pooling or activation: a
// kink inside the difference step would spoil the quotient; those are tested in test-nn-ops), against finite differences of
// the loss with respect to single parameters.
static void test_float_gradients(bie_context_t * ctx) {
    bie_model_t * m =
        test_model_create(ctx, "input 2 5 5; conv f32 3 3 1 1; bn; linear f32 4", BIE_LATENT_F32, test_seed);
    if (!m) return;
    const int64_t n = 3, in = 50;
    float x[150], g[12];
    uint8_t y[3];
    test_random_batch(x, y, n, in, 4);
    const float * logits;
    double loss;
    CHECK_OK(ctx, test_forward(ctx, m, x, n, 1, 0, &logits));
    CHECK_OK(ctx, test_xent(ctx, n, 4, logits, y, &loss, g, NULL));
    CHECK_OK(ctx, test_backward(ctx, m, n, g));
    struct param * ps[4] = {&m->L[0].w, &m->L[0].b, &m->L[2].w, &m->L[1].w};
    const char * names[4] = {"conv weight", "conv bias", "linear weight", "bn gamma"};
    for (int p = 0; p < 4; p++) {
        for (int t = 0; t < 4; t++) {
            const int64_t i = test_rand_int(0, ps[p]->n - 1);
            const float keep = ps[p]->v[i], grad = ps[p]->g[i], h = 1e-3f;
            double l[2];
            for (int s = 0; s < 2; s++) {
                ps[p]->v[i] = keep + (s ? h : -h);
                CHECK_OK(ctx, test_forward(ctx, m, x, n, 1, 0, &logits));
                CHECK_OK(ctx, test_xent(ctx, n, 4, logits, y, &l[s], NULL, NULL));
            }
            ps[p]->v[i] = keep;
            const double fd = (l[1] - l[0]) / (2.0 * h);
            // f32 forward: the loss (~1) rounds to ~1e-7, over 2h = 2e-3 that is 1e-4 of noise, plus
            // O(h^2) curvature; hence 2e-3 + 2%.
            CHECK(fabs(grad - fd) < 2e-3 + 0.02 * fabs(fd), "%s[%lld]: grad %g, finite difference %g", names[p],
                  (long long)i, grad, fd);
        }
    }
    bie_model_destroy(m);
}

static void tmp_path(char * buf) {
    strcpy(buf, "bie-test-model-XXXXXX");
    int fd = mkstemp(buf);
    if (fd >= 0) close(fd);
}

static void test_files(bie_context_t * ctx, const char * arch, enum bie_latent latent) {
    bie_model_t *m = NULL, *p = NULL, *c = NULL;
    CHECK_OK(ctx, bie_model_create(ctx, arch, latent, test_seed, &m));
    if (!m) return;
    const int64_t n = 16, in = bie_model_num_inputs(m), k = bie_model_num_outputs(m);
    float *x = malloc(sizeof(float) * (size_t)(n * in)), *l0 = malloc(sizeof(float) * (size_t)(n * k));
    uint8_t * y = malloc((size_t)n);
    test_random_batch(x, y, n, in, (int)k);
    test_train_steps(ctx, m, x, y, n, 3, 0.01f);
    char pp[32], cp[32];
    tmp_path(pp);
    tmp_path(cp);
    const char * meta[] = {"note", "test"};
    CHECK_OK(ctx, bie_model_save(ctx, m, pp, BIE_MODEL_FILE_PACKED, meta, 1));
    CHECK_OK(ctx, bie_model_save(ctx, m, cp, BIE_MODEL_FILE_CHECKPOINT, NULL, 0));
    const float * logits;
    CHECK_OK(ctx, test_forward(ctx, m, x, n, 0, 0, &logits));
    memcpy(l0, logits, sizeof(float) * (size_t)(n * k));
    bie_safetensors_t * st = NULL;
    CHECK_OK(ctx, bie_model_load(ctx, pp, &p, &st));
    if (p) {
        CHECK(bie_model_is_packed(p), "packed file not packed");
        CHECK(st && bie_safetensors_metadata(st, "note") && !strcmp(bie_safetensors_metadata(st, "note"), "test"),
              "meta");
        CHECK_OK(ctx, test_forward(ctx, p, x, n, 0, 0, &logits));
        CHECK(memcmp(logits, l0, sizeof(float) * (size_t)(n * k)) == 0, "packed logits differ (%s, latent %d)", arch,
              latent);
        // Float layers: the same integer sums in f32, the same scaling: the same logits.
        CHECK_OK(ctx, test_forward(ctx, p, x, n, 0, 1, &logits));
        for (int64_t i = 0; i < n * k; i++)
            CHECK(fabsf(logits[i] - l0[i]) <= 1e-4f * (1 + fabsf(l0[i])), "float_layers logit %lld: %g vs %g (%s)",
                  (long long)i, logits[i], l0[i], arch);
        CHECK(test_forward(ctx, p, x, n, 1, 0, &logits) == BIE_STATUS_INVALID_ARGUMENT, "packed model trained");
        CHECK(bie_model_save(ctx, p, cp, BIE_MODEL_FILE_CHECKPOINT, NULL, 0) == BIE_STATUS_INVALID_ARGUMENT,
              "checkpoint of a packed model");
    }
    bie_safetensors_free(st);
    // Checkpoint: continuing from the file equals continuing in memory, bit for bit.
    CHECK_OK(ctx, bie_model_load(ctx, cp, &c, NULL));
    if (c) {
        const double la = test_train_steps(ctx, m, x, y, n, 2, 0.01f), lb = test_train_steps(ctx, c, x, y, n, 2, 0.01f);
        CHECK(la == lb, "resumed training differs: loss %.17g vs %.17g (%s)", la, lb, arch);
        const float * la_logits;
        CHECK_OK(ctx, test_forward(ctx, m, x, n, 0, 0, &la_logits));
        memcpy(l0, la_logits, sizeof(float) * (size_t)(n * k));
        CHECK_OK(ctx, test_forward(ctx, c, x, n, 0, 0, &logits));
        CHECK(memcmp(logits, l0, sizeof(float) * (size_t)(n * k)) == 0, "resumed logits differ");
    }
    // Damaged files: every tensor truncated in turn by rewriting the file without it.
    bie_safetensors_t * s2 = NULL;
    CHECK_OK(ctx, bie_safetensors_read(ctx, pp, &s2));
    if (s2) {
        const size_t nt = bie_safetensors_count(s2);
        struct bie_st_tensor * t = calloc(nt, sizeof *t);
        const size_t nm = bie_safetensors_metadata_count(s2);
        const char ** mv = calloc(2 * nm + 2, sizeof *mv);
        for (size_t i = 0; i < nm; i++) mv[2 * i] = bie_safetensors_metadata_at(s2, i, &mv[2 * i + 1]);
        char bad[32];
        tmp_path(bad);
        const int trials = quick ? 2 : 6;
        for (int r = 0; r < trials; r++) {
            for (size_t i = 0; i < nt; i++) t[i] = *bie_safetensors_at(s2, i);
            const size_t victim = (size_t)test_rand_int(0, (int64_t)nt - 1);
            size_t n_out = nt;
            if (r % 2 == 0) { // drop a tensor
                for (size_t i = victim; i + 1 < nt; i++) t[i] = t[i + 1];
                n_out--;
            } else { // change its shape (same bytes, wrong dims)
                t[victim].ndim = 1;
                t[victim].shape[0] = (int64_t)(t[victim].nbytes / (t[victim].dtype == BIE_DTYPE_F32 ? 4 : 1));
                if (bie_safetensors_at(s2, victim)->ndim == 1)
                    t[victim].dtype = BIE_DTYPE_U8, t[victim].shape[0] = (int64_t)t[victim].nbytes;
            }
            CHECK_OK(ctx, bie_safetensors_write(ctx, bad, t, n_out, mv, nm));
            bie_model_t * bm = NULL;
            const enum bie_status s = bie_model_load(ctx, bad, &bm, NULL);
            CHECK(s == BIE_STATUS_FORMAT_ERROR && !bm, "damaged file (%s %s) loaded: %s",
                  r % 2 ? "reshaped" : "without", bie_safetensors_at(s2, victim)->name, bie_status_string(s));
            bie_model_destroy(bm);
        }
        unlink(bad);
        free(t);
        free(mv);
        bie_safetensors_free(s2);
    }
    unlink(pp);
    unlink(cp);
    bie_model_destroy(m);
    bie_model_destroy(p);
    bie_model_destroy(c);
    free(x);
    free(l0);
    free(y);
}

static void test_learns(bie_context_t * ctx) {
    bie_model_t * m = test_model_create(
        ctx, "input 1 6 6; conv f32 8 3; bn; conv b1 16 3; maxpool 2; bn; linear b1 32; bn; linear f32 4",
        BIE_LATENT_F32, test_seed);
    if (!m) return;
    const int64_t n = 64;
    float x[64 * 36];
    uint8_t y[64];
    test_random_batch(x, y, n, 36, 4);
    const double first = test_train_steps(ctx, m, x, y, n, 1, 0.01f);
    const double last = test_train_steps(ctx, m, x, y, n, quick ? 20 : 40, 0.01f);
    CHECK(last < 0.7 * first, "training did not lower the loss: %g -> %g", first, last);
    bie_model_destroy(m);
}

int main(int argc, char ** argv) {
    bie_context_t * ctx = test_model_start(argc, argv, &quick);
    test_arch(ctx);
    for (int r = 0; r < (quick ? 1 : 3); r++) test_float_gradients(ctx);
    test_files(ctx, "input 2 6 6; conv f32 4 3; bn; conv b1 8 3; maxpool 2; bn; linear b1 12; bn; linear f32 3",
               BIE_LATENT_F32);
    test_files(ctx, "input 2 6 6; conv f32 4 3; bn; conv b1 9 3 2 0; bn; linear b1 12; bn; linear f32 3",
               BIE_LATENT_INT8);
    test_files(ctx, "input 1 6 6; conv q4 5 3; maxpool 2; bn; linear q4 7; bn; linear f32 3", BIE_LATENT_F32);
    test_files(ctx, "input 1 5 5; linear q8 16; bn; relu; linear b1 9; sign; linear f32 3", BIE_LATENT_F32);
    // Graphs (format version 2): residual adds, PReLU, pooling, output biases.
    const char * graph = "input 2 6 6; conv f32 4 3; bn; prelu 4; conv b1 4 3 1 1; bn; add @2; avgpool 2;"
                         " conv q4 6 1 1 0 bias; adaptive_avgpool 2; flatten; linear b1 8 bias; bn; gelu; linear f32 3";
    test_files(ctx, graph, BIE_LATENT_F32);
    test_files(ctx, graph, BIE_LATENT_INT8);
    test_learns(ctx);
    bie_context_destroy(ctx);
    return test_finish("test-nn-model");
}
