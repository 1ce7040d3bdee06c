// SPDX-License-Identifier: Apache-2.0
// test-nn-graph.c: the model as a graph (residual adds, named inputs) and its planned inference:
// - architecture strings with named inputs and the version-2 layers give the right shapes and
//   format version; invalid ones (dead branches, forward references, mismatched adds) are refused;
// - gradients through branch points, adds, PReLU, average and adaptive pooling and the smooth
//   activations against central finite differences of the loss;
// - planned inference (slots reused, layers in place, flatten as no operation) gives, bit for bit,
//   the logits of an unplanned evaluation that keeps every value in its own buffer and calls the
//   public layer API, at several batch sizes and again after training steps;
// - plans are built once per batch size and rebuilt after the parameters change; a chain of
//   element-wise layers runs in one slot;
// - files without bie.format_version load as version 1; newer or insufficient versions are refused.
#include "test-train-util.h"
#include "nn/model-impl.h"

#include <unistd.h>

static bool quick;

// A residual network with every kind of layer the format has (layer indices in the comments).
static const char * const ARCH_A =
    "input 2 8 8; conv f32 8 3; bn; prelu 8; conv b1 8 3 1 1; bn; add @2; relu; conv q4 8 3 1 1 bias; bn; add @6;"
    " avgpool 2; conv b1 12 1 1 0; bn; gelu; adaptive_avgpool 2 2; flatten; linear q8 10 bias; bn; silu;"
    " linear b1 6; tanh; linear f32 3";
static const char * const ARCH_B =
    "input 1 7 7; conv q4 6 3; maxpool 3 2 1; bn; gelu_tanh; conv b1 6 3 1 1; bn; add @3; flatten; bn;"
    " linear b1 5 bias; prelu 1; linear f32 3";
static const char * const ARCH_C = "input 3 4 4; relu; add @input; sign; flatten; linear b1 4; hardtanh; linear f32 3";
static const char * const ARCH_D = "input 2 3 3; flatten; linear b1 4; bn; add @2 @2; linear f32 3";

static void test_arch(bie_context_t * ctx) {
    struct {
        const char * arch;
        int32_t version;
        int64_t out[3]; // of the layer `at`
        int at;
    } ok[] = {
        {ARCH_A, 2, {8, 8, 8}, 9},
        {ARCH_A, 2, {12, 2, 2}, 14},
        {ARCH_A, 2, {48, 1, 1}, 15},
        {ARCH_B, 2, {6, 4, 4}, 1}, // (7 + 2 - 3)/2 + 1
        {ARCH_C, 2, {3, 4, 4}, 1},
        {ARCH_D, 2, {18, 1, 1}, 0},
        {"input 1 4 4; conv b1 4 3; maxpool 2; relu; linear f32 2", 1, {4, 2, 2}, 1},
        {"input 1 4 4; maxpool 3 1; linear f32 2", 2, {1, 2, 2}, 0},
        {"input 1 5 5; avgpool 3 2 1; linear f32 2", 2, {1, 3, 3}, 0},
        {"input 1 7 5; adaptive_avgpool 3; linear f32 2", 2, {1, 3, 3}, 0},
    };
    for (size_t t = 0; t < sizeof ok / sizeof ok[0]; t++) {
        struct arch a;
        CHECK_OK(ctx, bie_model_parse_arch(ctx, ok[t].arch, &a));
        if (!a.L) continue;
        const struct layer * L = &a.L[ok[t].at];
        CHECK(a.version == ok[t].version, "\"%s\": version %d, want %d", ok[t].arch, a.version, ok[t].version);
        CHECK(!memcmp(L->out, ok[t].out, sizeof L->out), "\"%s\": layer %d is %lldx%lldx%lld", ok[t].arch, ok[t].at,
              (long long)L->out[0], (long long)L->out[1], (long long)L->out[2]);
        free(a.L);
    }
    // The graph of ARCH_A: add @2 reads layers 4 and 2; add @6 reads 8 and 6; value 7 is read twice.
    struct arch a;
    CHECK_OK(ctx, bie_model_parse_arch(ctx, ARCH_A, &a));
    if (a.L) {
        CHECK(a.L[5].src[0] == 5 && a.L[5].src[1] == 3 && a.L[9].src[0] == 9 && a.L[9].src[1] == 7, "add sources");
        CHECK(a.L[6].uses == 2 && a.L[7].has_bias && a.L[2].prelu_n == 8, "uses, bias, prelu");
        free(a.L);
    }
    CHECK_OK(ctx, bie_model_parse_arch(ctx, ARCH_D, &a));
    if (a.L) {
        CHECK(a.L[3].src[0] == 3 && a.L[3].src[1] == 3 && a.L[2].uses == 2 && a.L[0].src[0] == 0, "add @2 @2");
        free(a.L);
    }
    const char * bad[] = {
        "input 1 4 4; relu; relu; add @0 @3",      // a later layer
        "input 1 4 4; relu; add",                  // add without a named input
        "input 1 4 4; relu; relu @0 @input",       // two inputs to a one-input layer
        "input 1 4 4; conv f32 2 3; add @input",   // 2x4x4 + 1x4x4
        "input 1 4 4; relu; tanh @input; flatten", // layer 0's output is never read
        "input 2 4 4; prelu 3",                    // 1 or 2 slopes
        "input 1 4 4; conv f32 2 3 1 1 bias",      // f32 layers always have a bias
        "input 1 4 4; maxpool 3 1 2",              // padding > K/2
        "input 1 4 4; adaptive_avgpool 5",         // larger than the input
        "input 1 4 4; relu @x",                    // not a layer
        "input 1 4 4; @0 relu",                    // an item starts with its kind
        "input 1 4 4; flatten 2",
        "input 1 4 4; gelu 1",
        "input 1 4 4; linear b1 4 bias 2",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        bie_model_t * m = NULL;
        const enum bie_status s = bie_model_create(ctx, bad[i], BIE_LATENT_F32, 1, &m);
        CHECK(s == BIE_STATUS_INVALID_ARGUMENT && !m, "\"%s\": %s (%s)", bad[i], bie_status_string(s),
              bie_context_last_error(ctx));
        bie_model_destroy(m);
    }
}

// Gradients of every parameter kind in a float graph (two branches from one value, adds, PReLU,
// pooling, smooth activations, flatten, bn over features), against central finite differences.
static void test_gradients(bie_context_t * ctx, const char * arch, const int * layers, int n_layers) {
    bie_model_t * m = test_model_create(ctx, arch, BIE_LATENT_F32, test_seed);
    if (!m) return;
    // Eight samples: batch norm over features with fewer has a curvature that spoils the quotient.
    const int64_t n = 8, in = bie_model_num_inputs(m), k = bie_model_num_outputs(m);
    float *x = malloc(sizeof(float) * (size_t)(n * in)), *g = malloc(sizeof(float) * (size_t)(n * k));
    uint8_t y[8];
    test_random_batch(x, y, n, in, (int)k);
    // PReLU slopes away from 0.25 everywhere, and output biases away from 0: a binary layer's
    // output is often exactly 0, which would sit on the kink of the PReLU after it.
    for (int64_t i = 0; i < m->n_layers; i++) {
        struct layer * L = &m->L[i];
        for (int64_t j = 0; j < L->prelu_n; j++) L->w.v[j] = test_rand_float(0.1f, 0.6f);
        if (L->has_bias)
            for (int64_t j = 0; j < L->O; j++) L->b.v[j] = test_rand_float(-0.3f, 0.3f);
    }
    const float * logits;
    double loss;
    CHECK_OK(ctx, test_forward(ctx, m, x, n, 1, 0, &logits));
    CHECK_OK(ctx, test_xent(ctx, n, k, logits, y, &loss, g, NULL));
    CHECK_OK(ctx, test_backward(ctx, m, n, g));
    int checked = 0, skipped = 0;
    for (int li = 0; li < n_layers; li++) {
        struct layer * L = &m->L[layers[li]];
        struct param * ps[2] = {&L->w, &L->b};
        // A low-bit layer's latent weight has a straight-through gradient, not the loss's slope:
        // only its output bias is checked here.
        const bool lowbit = (L->kind == L_CONV || L->kind == L_LINEAR) && L->q != Q_F32;
        for (int p = lowbit ? 1 : 0; p < 2; p++) {
            if (!ps[p]->v || !ps[p]->g) continue;
            for (int t = 0; t < 3; t++) {
                const int64_t i = test_rand_int(0, ps[p]->n - 1);
                const float keep = ps[p]->v[i], grad = ps[p]->g[i];
                double fd[2];
                for (int hs = 0; hs < 2; hs++) { // steps h and h/2
                    const float h = hs ? 5e-4f : 1e-3f;
                    double l[2];
                    for (int s = 0; s < 2; s++) {
                        ps[p]->v[i] = keep + (s ? h : -h);
                        CHECK_OK(ctx, test_forward(ctx, m, x, n, 1, 0, &logits));
                        CHECK_OK(ctx, test_xent(ctx, n, k, logits, y, &l[s], NULL, NULL));
                    }
                    fd[hs] = (l[1] - l[0]) / (2.0 * h);
                }
                ps[p]->v[i] = keep;
                // A kink (PReLU, ReLU) inside the step makes the two quotients disagree: such a
                // point says nothing about the gradient and is skipped (a few per model at most).
                checked++;
                if (fabs(fd[0] - fd[1]) > 1e-3 + 0.02 * fabs(fd[1])) {
                    skipped++;
                    continue;
                }
                // As in test-nn-model: f32 loss noise over 2h, plus curvature.
                CHECK(fabs(grad - fd[1]) < 2e-3 + 0.03 * fabs(fd[1]),
                      "%s: layer %d (%s) %s[%lld]: grad %g, finite difference %g", arch, layers[li],
                      bie_model_kind_name(L), p ? "b" : "w", (long long)i, grad, fd[1]);
            }
        }
    }
    CHECK(skipped * 4 <= checked, "%s: %d of %d finite differences crossed a kink", arch, skipped, checked);
    free(x);
    free(g);
    bie_model_destroy(m);
}

// An unplanned evaluation: every value in its own buffer, low-bit layers through the public
// layer API, batch norm through bie_batchnorm_forward in eval mode. Returns the logits (malloc).
static float * reference_eval(bie_context_t * ctx, bie_model_t * m, const float * x, int64_t n) {
    const int64_t nv = m->n_layers + 1;
    float ** val = calloc((size_t)nv, sizeof *val);
    val[0] = (float *)x;
    for (int64_t i = 0; i < m->n_layers; i++) {
        struct layer * L = &m->L[i];
        const float * in = val[L->src[0]];
        const int64_t cin = n * shape_numel(L->in), cout = n * shape_numel(L->out);
        float * out = val[i + 1] = malloc(sizeof(float) * (size_t)cout);
        if (L->kind == L_CONV || L->kind == L_LINEAR) {
            if (L->q == Q_F32) {
                float * sp = malloc(sizeof(float) * bie_model_fconv_scratch(L, n));
                bie_model_fconv_forward(L, n, in, L->w.v, L->b.v, out, sp);
                free(sp);
            } else {
                struct qviews v;
                bie_model_qviews(L, n, in, out, &v);
                struct bie_forward_args a = bie_model_qviews_forward(&v);
                CHECK_OK(ctx,
                         L->kind == L_CONV ? bie_conv2d_forward(ctx, &v.cd, &a) : bie_linear_forward(ctx, &v.ld, &a));
                const int64_t P = L->out[1] * L->out[2];
                if (L->has_bias)
                    for (int64_t j = 0; j < cout; j++) out[j] += L->b.v[(j / P) % L->O];
            }
        } else if (L->kind == L_BN) {
            const int64_t c = L->in[0], hw = L->in[1] * L->in[2];
            struct bie_tensor tx = TEST_VIEW(in, BIE_DTYPE_F32, n, c, hw), ty = TEST_VIEW(out, BIE_DTYPE_F32, n, c, hw),
                              tw = TEST_VIEW(L->w.v, BIE_DTYPE_F32, c), tb = TEST_VIEW(L->b.v, BIE_DTYPE_F32, c),
                              tm = TEST_VIEW(L->rmean, BIE_DTYPE_F32, c), tv = TEST_VIEW(L->rvar, BIE_DTYPE_F32, c);
            CHECK_OK(ctx, bie_batchnorm_forward(
                              ctx, &(struct bie_batchnorm_desc){0.1f, 1e-5f, 0},
                              &(struct bie_batchnorm_args){&tx, &tw, &tb, &tm, &tv, NULL, NULL, &ty, NULL, NULL}));
        } else if (L->kind == L_POOL && L->pool_kind == POOL_ADAPTIVE_AVG) {
            nn_adaptive_avgpool_forward(n, L->in[0], L->in[1], L->in[2], L->out[1], L->out[2], in, out);
        } else if (L->kind == L_POOL) {
            struct nn_pool g = {.n = n,
                                .c = L->in[0],
                                .h = L->in[1],
                                .w = L->in[2],
                                .k = L->pool,
                                .s = L->pool_stride,
                                .p = L->pool_pad};
            nn_pool_geometry(&g);
            if (L->pool_kind == POOL_MAX) nn_maxpool_forward(&g, in, out, NULL);
            else nn_avgpool_forward(&g, in, out);
        } else if (L->kind == L_ACT && L->prelu_n) {
            nn_prelu_forward(n, L->in[0], L->in[1] * L->in[2], L->w.v, L->prelu_n, in, out);
        } else if (L->kind == L_ACT && L->act <= NN_ACT_HARDTANH) {
            struct bie_tensor tx = TEST_VIEW(in, BIE_DTYPE_F32, cin), ty = TEST_VIEW(out, BIE_DTYPE_F32, cin);
            CHECK_OK(ctx,
                     bie_activation_forward(ctx, (enum bie_activation)L->act, &(struct bie_activation_args){&tx, &ty}));
        } else if (L->kind == L_ACT) {
            nn_act_forward(L->act, cin, in, out);
        } else if (L->kind == L_ADD) {
            for (int64_t j = 0; j < cin; j++) out[j] = in[j] + val[L->src[1]][j];
        } else {
            memcpy(out, in, sizeof(float) * (size_t)cin);
        }
    }
    float * logits = val[nv - 1];
    for (int64_t v = 1; v + 1 < nv; v++) free(val[v]);
    free(val);
    return logits;
}

static void check_plan(bie_context_t * ctx, bie_model_t * m, const float * x, int64_t n, const char * arch,
                       const char * when) {
    const int64_t k = bie_model_num_outputs(m);
    const size_t bytes = sizeof(float) * (size_t)(n * k);
    float * first = malloc(bytes);
    const float * logits = NULL;
    // The first call at a batch size builds the plan (and sets the scales of a model never run),
    // the second only runs it.
    CHECK_OK(ctx, test_forward(ctx, m, x, n, 0, 0, &logits));
    if (logits) memcpy(first, logits, bytes);
    float * want = reference_eval(ctx, m, x, n);
    CHECK(memcmp(first, want, bytes) == 0,
          "planned logits differ from the unplanned evaluation (%s, n %lld, %s, first call)", arch, (long long)n, when);
    logits = NULL;
    CHECK_OK(ctx, test_forward(ctx, m, x, n, 0, 0, &logits));
    if (logits)
        CHECK(memcmp(logits, want, bytes) == 0, "planned logits differ from the unplanned evaluation (%s, n %lld, %s)",
              arch, (long long)n, when);
    free(first);
    free(want);
}

static void test_plans(bie_context_t * ctx, const char * arch, enum bie_latent latent) {
    bie_model_t * m = test_model_create(ctx, arch, latent, test_seed);
    if (!m) return;
    const int64_t N = 9, in = bie_model_num_inputs(m), k = bie_model_num_outputs(m);
    float * x = malloc(sizeof(float) * (size_t)(N * in));
    uint8_t * y = malloc((size_t)N);
    test_random_batch(x, y, N, in, (int)k);
    { // float_layers on a model never run sets the scales as the layer calls do: the same logits
        bie_model_t *f = NULL, *g = NULL;
        CHECK_OK(ctx, bie_model_create(ctx, arch, latent, test_seed, &f));
        CHECK_OK(ctx, bie_model_create(ctx, arch, latent, test_seed, &g));
        const float *lf = NULL, *lg = NULL;
        float * lfc = malloc(sizeof(float) * (size_t)(4 * k));
        if (f && g) {
            CHECK_OK(ctx, test_forward(ctx, f, x, 4, 0, 1, &lf));
            memcpy(lfc, lf, sizeof(float) * (size_t)(4 * k));
            lf = lfc;
            CHECK_OK(ctx, test_forward(ctx, g, x, 4, 0, 0, &lg));
        }
        for (int64_t i = 0; lf && lg && i < 4 * k; i++)
            CHECK(fabsf(lf[i] - lg[i]) <= 1e-4f * (1 + fabsf(lg[i])),
                  "untrained model, logit %lld: float_layers %g, layers %g (%s)", (long long)i, lf[i], lg[i], arch);
        free(lfc);
        bie_model_destroy(f);
        bie_model_destroy(g);
    }
    check_plan(ctx, m, x, 4, arch, "untrained (scales set by the plan)");
    test_train_steps(ctx, m, x, y, N, 2, 0.01f);
    const int64_t sizes[] = {N, 1, 4, 1, N, 2};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) check_plan(ctx, m, x, sizes[i], arch, "trained");
    const int64_t builds = bie_model_plan_builds(m);
    check_plan(ctx, m, x, 4, arch, "again");
    CHECK(bie_model_plan_builds(m) == builds, "a plan for a batch size seen was rebuilt (%s)", arch);
    test_train_steps(ctx, m, x, y, N, 1, 0.01f);
    check_plan(ctx, m, x, 4, arch, "after a step");
    CHECK(bie_model_plan_builds(m) == builds + 1, "no plan rebuilt after a training step (%s)", arch);
    // The packed twin: the same plan routes on packed weights.
    char path[] = "bie-test-graph-XXXXXX";
    const int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    CHECK_OK(ctx, bie_model_save(ctx, m, path, BIE_MODEL_FILE_PACKED, NULL, 0));
    bie_model_t * p = NULL;
    CHECK_OK(ctx, bie_model_load(ctx, path, &p, NULL));
    if (p) {
        check_plan(ctx, p, x, 3, arch, "packed");
        check_plan(ctx, p, x, 1, arch, "packed");
        CHECK(p->format_version == 2 || !strstr(arch, "@"), "format version %d", p->format_version);
    }
    unlink(path);
    bie_model_destroy(p);
    bie_model_destroy(m);
    free(x);
    free(y);
}

// Memory planning: a chain of element-wise layers runs in place in one slot beside the input; a
// residual block needs its branch kept.
static void test_arena(bie_context_t * ctx) {
    bie_model_t * m = test_model_create(ctx, "input 4 8 8; conv f32 4 3; relu; bn; tanh; prelu 4; flatten; silu; gelu",
                                        BIE_LATENT_F32, 1);
    if (!m) return;
    float x[2 * 256] = {0};
    const float * logits;
    CHECK_OK(ctx, test_forward(ctx, m, x, 2, 0, 0, &logits));
    CHECK(bie_model_plan_arena_bytes(m) == 2 * 256 * sizeof(float), "chain arena %zu bytes, want %zu",
          bie_model_plan_arena_bytes(m), 2 * 256 * sizeof(float));
    bie_model_destroy(m);
    CHECK_OK(ctx,
             bie_model_create(ctx, "input 4 8 8; conv f32 4 3; relu; conv f32 4 3; add @0; relu; conv f32 4 3; add @4",
                              BIE_LATENT_F32, 1, &m));
    if (!m) return;
    CHECK_OK(ctx, test_forward(ctx, m, x, 2, 0, 0, &logits));
    CHECK(bie_model_plan_arena_bytes(m) == 3 * 2 * 256 * sizeof(float), "residual arena %zu bytes, want %zu",
          bie_model_plan_arena_bytes(m), 3 * 2 * 256 * sizeof(float));
    bie_model_destroy(m);
}

// Model format versions: a file without bie.format_version (as written before graphs) loads as
// version 1; a newer version, a version that does not cover the architecture, or no number are
// refused with FORMAT_ERROR naming the key.
static void test_versions(bie_context_t * ctx) {
    const char * archs[2] = {"input 1 4 4; conv b1 2 3; bn; relu; linear f32 3",
                             "input 1 4 4; conv b1 2 3; bn; add @0; linear f32 3"};
    for (int a = 0; a < 2; a++) {
        bie_model_t * m = test_model_create(ctx, archs[a], BIE_LATENT_F32, 1);
        if (!m) continue;
        float x[2 * 16];
        for (int i = 0; i < 32; i++) x[i] = test_rand_float(-1, 1);
        const float * logits;
        CHECK_OK(ctx, test_forward(ctx, m, x, 2, 1, 0, &logits));
        char path[] = "bie-test-version-XXXXXX", other[] = "bie-test-version-XXXXXX";
        int fd = mkstemp(path);
        if (fd >= 0) close(fd);
        fd = mkstemp(other);
        if (fd >= 0) close(fd);
        CHECK_OK(ctx, bie_model_save(ctx, m, path, BIE_MODEL_FILE_PACKED, NULL, 0));
        bie_safetensors_t * st = NULL;
        CHECK_OK(ctx, bie_safetensors_read(ctx, path, &st));
        if (st) {
            const char * v = bie_safetensors_metadata(st, "bie.format_version");
            CHECK(v && atoi(v) == a + 1, "%s: bie.format_version %s, want %d", archs[a], v ? v : "(none)", a + 1);
            // The same file with bie.format_version absent, or set to each of these values.
            const char * values[] = {NULL, "1", "2", "3", "0", "x", ""};
            for (size_t k = 0; k < sizeof values / sizeof values[0]; k++) {
                const size_t nt = bie_safetensors_count(st), nm = bie_safetensors_metadata_count(st);
                struct bie_st_tensor * t = calloc(nt, sizeof *t);
                const char ** mv = calloc(2 * nm + 2, sizeof *mv);
                for (size_t i = 0; i < nt; i++) t[i] = *bie_safetensors_at(st, i);
                size_t q = 0;
                for (size_t i = 0; i < nm; i++) {
                    const char *val, *key = bie_safetensors_metadata_at(st, i, &val);
                    if (!strcmp(key, "bie.format_version")) {
                        if (!values[k]) continue;
                        val = values[k];
                    }
                    mv[2 * q] = key;
                    mv[2 * q + 1] = val;
                    q++;
                }
                CHECK_OK(ctx, bie_safetensors_write(ctx, other, t, nt, mv, q));
                bie_model_t * p = NULL;
                const enum bie_status s = bie_model_load(ctx, other, &p, NULL);
                // Version 1 covers the chain only; absent means 1; 3 is newer than this library.
                const bool ok = values[k] ? !strcmp(values[k], "2") || (a == 0 && !strcmp(values[k], "1")) : a == 0;
                CHECK(ok ? s == BIE_STATUS_OK && p
                         : s == BIE_STATUS_FORMAT_ERROR && !p && strstr(bie_context_last_error(ctx), "version"),
                      "%s with bie.format_version %s: %s (%s)", archs[a], values[k] ? values[k] : "absent",
                      bie_status_string(s), bie_context_last_error(ctx));
                bie_model_destroy(p);
                free(t);
                free(mv);
            }
            bie_safetensors_free(st);
        }
        unlink(path);
        unlink(other);
        bie_model_destroy(m);
    }
}

int main(int argc, char ** argv) {
    bie_context_t * ctx = test_model_start(argc, argv, &quick);
    test_arch(ctx);
    // (Kinks next to batch norm over a few values make finite differences unusable, though the
    // gradients agree with PyTorch's: the kinks of these graphs are away from batch norm.)
    const char * g1 = "input 2 5 5; conv f32 3 3; prelu 3; conv f32 3 3 1 1 @0; tanh; add @1; avgpool 3 1 1; silu;"
                      " adaptive_avgpool 2 3; flatten; gelu; linear f32 4";
    const int l1[] = {0, 1, 2, 10};
    const char * g2 = "input 3 4 4; conv f32 4 3 2 1; bn; gelu_tanh; add @1 @2; adaptive_avgpool 1; flatten;"
                      " linear f32 6";
    const int l2[] = {0, 1, 6};
    // A binary layer hides the slope of everything before it (its input is binarized): only its
    // output bias and what follows are checked.
    const char * g3 = "input 4 1 1; linear f32 6; linear b1 5 bias; prelu 1; linear f32 3";
    const int l3[] = {1, 2, 3};
    for (int r = 0; r < (quick ? 1 : 3); r++) {
        test_gradients(ctx, g1, l1, 4);
        test_gradients(ctx, g2, l2, 3);
        test_gradients(ctx, g3, l3, 3);
    }
    const char * archs[] = {ARCH_A, ARCH_B, ARCH_C, ARCH_D};
    for (size_t i = 0; i < 4; i++) test_plans(ctx, archs[i], BIE_LATENT_F32);
    test_plans(ctx, ARCH_A, BIE_LATENT_INT8);
    test_arena(ctx);
    test_versions(ctx);
    bie_context_destroy(ctx);
    return test_finish("test-nn-graph");
}
