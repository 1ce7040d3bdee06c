// SPDX-License-Identifier: Apache-2.0
// bench-model-host.c: the host cost per layer of a model's planned inference at batch 1, against
// the same layers called one by one through the public API (validated on every call, as the
// model ran them before plans).
//
//   bie_bench_model_host [--layers N] [--width W] [--calls N] [--repeat N] [--threads N]
//
// The model is a chain of tiny layers (W features at 1x1: binary, 4-bit, 8-bit and float linear
// layers, batch norm, activations, residual adds, flatten), so the kernels' arithmetic is a few
// hundred operations and what remains is host cost. Three figures per thread count, each the
// median over --repeat runs of --calls calls:
//   model      bie_model_forward(n = 1), planned
//   kernels    the same work called directly: each low-bit layer's pre-validated backend call
//              (bie_layer_run), each float op, on the same buffers
//   unplanned  the public calls a user would make per layer (bie_linear_forward with its views,
//              bie_batchnorm_forward, bie_activation_forward, ...), validated on every call
// host cost per layer = (model - kernels) / layers; the unplanned path's the same way.
#include "nn/model-impl.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp_double(const void * a, const void * b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double * v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The arch: a repeated block of 8 layers over W features at 1x1.
static char * make_arch(int blocks, int w) {
    size_t cap = 64 + (size_t)blocks * 160;
    char * s = malloc(cap);
    int at = snprintf(s, cap, "input %d 1 1; flatten", w);
    const char * q[3] = {"b1", "q4", "q8"};
    for (int b = 0; b < blocks; b++) {
        const int base = 1 + 8 * b; // index of this block's first layer
        at += snprintf(s + at, cap - (size_t)at,
                       "; linear %s %d; bn; relu; linear %s %d bias; bn; add @%d; tanh; linear f32 %d", q[b % 3], w,
                       q[(b + 1) % 3], w, base - 1, w);
    }
    return s;
}

struct runner {
    bie_model_t * m;
    const float * x;
    float ** buf;                 // one buffer per value
    float ** val;                 // the value each layer reads (flatten: its input's buffer)
    struct bie_layer_call * call; // per low-bit layer, validated once (kernels)
};

// Layer i's work without the model: its kernel (a planned call) or the public API (unplanned).
static void run_layer(bie_context_t * ctx, struct runner * r, int64_t i, bool unplanned) {
    struct layer * L = &r->m->L[i];
    const float * in = r->val[L->src[0]];
    float * out = r->val[i + 1];
    const int64_t count = shape_numel(L->in), c = L->in[0], hw = L->in[1] * L->in[2];
    switch (L->kind) {
    case L_LINEAR:
        if (L->q == Q_F32) {
            bie_fconv_forward(1, L->K, 1, 1, L->O, 1, 1, 0, 0.0f, in, L->w.v, L->b.v, out, NULL);
        } else if (unplanned) {
            struct qviews v;
            bie_model_qviews(L, 1, in, out, &v);
            struct bie_forward_args a = bie_model_qviews_forward(&v);
            bie_linear_forward(ctx, &v.ld, &a);
            bie_model_add_output_bias(L, 1, out);
        } else {
            r->call[i].x.data = (void *)in;
            bie_layer_run(ctx, &r->call[i], false);
            bie_model_add_output_bias(L, 1, out);
        }
        break;
    case L_BN:
        if (unplanned) {
            struct bie_tensor tx, ty, tw, tb, tm, tv;
            bie_tensor_make(&tx, (void *)(uintptr_t)in, BIE_DTYPE_F32, 3, (const int64_t[]){1, c, hw});
            bie_tensor_make(&ty, out, BIE_DTYPE_F32, 3, (const int64_t[]){1, c, hw});
            bie_tensor_make(&tw, L->w.v, BIE_DTYPE_F32, 1, &c);
            bie_tensor_make(&tb, L->b.v, BIE_DTYPE_F32, 1, &c);
            bie_tensor_make(&tm, L->rmean, BIE_DTYPE_F32, 1, &c);
            bie_tensor_make(&tv, L->rvar, BIE_DTYPE_F32, 1, &c);
            bie_batchnorm_forward(ctx, &(struct bie_batchnorm_desc){BN_MOMENTUM, BN_EPS, 0},
                                  &(struct bie_batchnorm_args){&tx, &tw, &tb, &tm, &tv, NULL, NULL, &ty, NULL, NULL});
        } else nn_channel_affine(1, c, hw, L->bn_scale, L->bn_shift, in, out);
        break;
    case L_ACT:
        if (unplanned && L->act <= NN_ACT_HARDTANH) {
            struct bie_tensor tx, ty;
            bie_tensor_make(&tx, (void *)(uintptr_t)in, BIE_DTYPE_F32, 1, &count);
            bie_tensor_make(&ty, out, BIE_DTYPE_F32, 1, &count);
            bie_activation_forward(ctx, (enum bie_activation)L->act, &(struct bie_activation_args){&tx, &ty});
        } else nn_act_forward(L->act, count, in, out);
        break;
    case L_ADD: nn_add(count, in, r->val[L->src[1]], out); break;
    case L_FLATTEN:
        if (unplanned) memcpy(out, in, sizeof(float) * (size_t)count);
        else r->val[i + 1] = (float *)in;
        break;
    default: break;
    }
}

static void run_layers(bie_context_t * ctx, struct runner * r, bool unplanned) {
    r->val[0] = (float *)r->x;
    for (int64_t v = 1; v <= r->m->n_layers; v++) r->val[v] = r->buf[v];
    for (int64_t i = 0; i < r->m->n_layers; i++) run_layer(ctx, r, i, unplanned);
}

// The CPU's model name from /proc/cpuinfo ("unknown CPU" where it has none).
static void cpu_name(char * cpu, size_t n) {
    snprintf(cpu, n, "unknown CPU");
    FILE * f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            const char * p = strchr(line, ':');
            snprintf(cpu, n, "%s", p ? p + 2 : line);
            cpu[strcspn(cpu, "\n")] = 0;
            break;
        }
    fclose(f);
}

// Each layer's kernel alone (medians of `repeat` runs of `calls` calls; t: their scratch) as planned
// and through the public API, summed by kind, at the context's thread count.
static void per_kind_rows(bie_context_t * ctx, struct runner * r, int repeat, int calls, double * t) {
    const char * kinds[] = {"linear b1", "linear q4", "linear q8", "linear f32", "bn", "relu/tanh", "add", "flatten"};
    double per_kind[8] = {0}, per_kind_unpl[8] = {0};
    int n_kind[8] = {0};
    run_layers(ctx, r, false);
    for (int64_t i = 0; i < r->m->n_layers; i++) {
        const struct layer * L = &r->m->L[i];
        const int k = L->kind == L_LINEAR ? (L->q == Q_B1   ? 0
                                             : L->q == Q_Q4 ? 1
                                             : L->q == Q_Q8 ? 2
                                                            : 3)
                      : L->kind == L_BN   ? 4
                      : L->kind == L_ACT  ? 5
                      : L->kind == L_ADD  ? 6
                                          : 7;
        for (int u = 0; u < 2; u++) {
            for (int rep = 0; rep < repeat; rep++) {
                const double t0 = now_ns();
                for (int c = 0; c < calls; c++) run_layer(ctx, r, i, u);
                t[rep] = (now_ns() - t0) / calls;
            }
            (u ? per_kind_unpl : per_kind)[k] += median(t, repeat);
        }
        n_kind[k]++;
    }
    printf("\nper layer kind, each layer alone: ns per call as planned (the kernel) and through the public API\n");
    for (int k = 0; k < 8; k++)
        if (n_kind[k])
            printf("  %-11s x%-3d %10.0f %10.0f\n", kinds[k], n_kind[k], per_kind[k] / n_kind[k],
                   per_kind_unpl[k] / n_kind[k]);
}

int main(int argc, char ** argv) {
    int blocks = 6, width = 16, calls = 200, repeat = 31, only_threads = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--layers")) blocks = (v - 1) / 8 > 0 ? (v - 1) / 8 : 1;
        else if (!strcmp(argv[i], "--width")) width = v;
        else if (!strcmp(argv[i], "--calls")) calls = v;
        else if (!strcmp(argv[i], "--repeat")) repeat = v;
        else if (!strcmp(argv[i], "--threads")) only_threads = v;
        else {
            fprintf(stderr, "usage: %s [--layers N] [--width W] [--calls N] [--repeat N] [--threads N]\n", argv[0]);
            return 2;
        }
    }
    if (width < 1 || calls < 1 || repeat < 1) return 2;
    char cpu[256];
    cpu_name(cpu, sizeof cpu);
    char * arch = make_arch(blocks, width);
    bie_context_t * ctx = NULL;
    bie_model_t * m = NULL;
    if (bie_context_create(NULL, &ctx) != BIE_STATUS_OK ||
        bie_model_create(ctx, arch, BIE_LATENT_F32, 1, &m) != BIE_STATUS_OK) {
        fprintf(stderr, "bench: %s\n", bie_context_last_error(ctx));
        return 1;
    }
    // Train one step so that the scales are set; then pack it as a model file would be.
    float *x = malloc(sizeof(float) * 4 * (size_t)width), *g = malloc(sizeof(float) * 4 * (size_t)width),
          *logits = malloc(sizeof(float) * 4 * (size_t)width);
    for (int i = 0; i < 4 * width; i++) x[i] = (float)((i * 37) % 17) / 8.0f - 1.0f;
    const int64_t in = bie_model_num_inputs(m), k = bie_model_num_outputs(m);
    struct bie_tensor tx4, tz4, tg4, tx1, tz1;
    bie_tensor_make(&tx4, x, BIE_DTYPE_F32, 2, (const int64_t[]){4, in});
    bie_tensor_make(&tz4, logits, BIE_DTYPE_F32, 2, (const int64_t[]){4, k});
    bie_tensor_make(&tg4, g, BIE_DTYPE_F32, 2, (const int64_t[]){4, k});
    bie_tensor_make(&tx1, x, BIE_DTYPE_F32, 2, (const int64_t[]){1, in});
    bie_tensor_make(&tz1, logits, BIE_DTYPE_F32, 2, (const int64_t[]){1, k});
    const struct bie_model_forward_desc train = {1, 0}, infer = {0, 0};
    const struct bie_model_forward_args one = {&tx1, &tz1};
    bie_model_forward(ctx, m, &train, &(struct bie_model_forward_args){&tx4, &tz4});
    for (int i = 0; i < 4 * width; i++) g[i] = 0.01f;
    bie_model_backward(ctx, m, &(struct bie_model_backward_args){&tg4});
    bie_model_step(ctx, m, &(struct bie_model_step_desc){1e-3f, 0, 0});
    const char path[] = "bench-model-host.safetensors";
    bie_model_t * p = NULL;
    if (bie_model_save(ctx, m, path, BIE_MODEL_FILE_PACKED, NULL, 0) != BIE_STATUS_OK ||
        bie_model_load(ctx, path, &p, NULL) != BIE_STATUS_OK) {
        fprintf(stderr, "bench: %s\n", bie_context_last_error(ctx));
        return 1;
    }
    remove(path);
    // Build the plan at n = 1, and the runner's buffers and validated calls.
    bie_model_forward(ctx, p, &infer, &one);
    struct runner r = {.m = p, .x = x};
    r.val = calloc((size_t)p->n_layers + 1, sizeof *r.val);
    r.buf = calloc((size_t)p->n_layers + 1, sizeof *r.buf);
    r.call = calloc((size_t)p->n_layers, sizeof *r.call);
    for (int64_t i = 0; i < p->n_layers; i++) {
        struct layer * L = &p->L[i];
        r.buf[i + 1] = malloc(sizeof(float) * (size_t)shape_numel(L->out));
        if (L->kind == L_LINEAR && L->q != Q_F32) {
            struct qviews v;
            bie_model_qviews(L, 1, x, r.buf[i + 1], &v);
            struct bie_forward_args a = bie_model_qviews_forward(&v);
            bie_layer_prepare_forward(ctx, &v.ld, NULL, &a, &r.call[i]);
        }
    }
    const int64_t nl = p->n_layers;
    printf("CPU: %s\nmodel: %lld layers of %d features at batch 1 (%s...)\n", cpu, (long long)nl, width,
           "input; flatten; linear b1; bn; relu; linear q4 bias; bn; add; tanh; linear f32");
    printf("%-8s %12s %12s %12s %14s %14s %8s\n", "threads", "model us", "kernels us", "unplanned us", "host ns/layer",
           "unpl. ns/layer", "ratio");
    double * t = malloc(sizeof(double) * 3 * (size_t)repeat);
    for (int threads = 1; threads <= 2; threads++) {
        if (only_threads && threads != only_threads) continue;
        omp_set_num_threads(threads);
        bie_context_set_num_threads(ctx, threads);
        double med[3];
        double * ts[3] = {t, t + repeat, t + 2 * repeat};
        for (int w = 0; w < 3; w++) { // warm-up
            bie_model_forward(ctx, p, &infer, &one);
            run_layers(ctx, &r, false);
            run_layers(ctx, &r, true);
        }
        // Interleaved, in a rotating order (the one measured right after another differs by up
        // to a fifth on the development machine), so that load and order weigh on all three alike.
        for (int rep = 0; rep < repeat; rep++)
            for (int j = 0; j < 3; j++) {
                const int what = (j + rep) % 3;
                const double t0 = now_ns();
                for (int c = 0; c < calls; c++) {
                    if (what == 0) bie_model_forward(ctx, p, &infer, &one);
                    else run_layers(ctx, &r, what == 2);
                }
                ts[what][rep] = (now_ns() - t0) / calls;
            }
        for (int what = 0; what < 3; what++) med[what] = median(ts[what], repeat);
        const double host = (med[0] - med[1]) / (double)nl, unpl = (med[2] - med[1]) / (double)nl;
        printf("%-8d %12.2f %12.2f %12.2f %14.0f %14.0f %8.2f\n", threads, med[0] / 1e3, med[1] / 1e3, med[2] / 1e3,
               host, unpl, med[2] / med[0]);
    }
    printf("host ns/layer = (model - kernels) / layers; ratio = unplanned / model (medians of %d runs of %d calls)\n",
           repeat, calls);
    per_kind_rows(ctx, &r, repeat, calls, t); // (at the last thread count)
    for (int64_t i = 1; i <= nl; i++) free(r.buf[i]);
    free(r.buf);
    free(r.val);
    free(r.call);
    free(t);
    free(x);
    free(g);
    free(logits);
    free(arch);
    bie_model_destroy(m);
    bie_model_destroy(p);
    bie_context_destroy(ctx);
    return 0;
}
