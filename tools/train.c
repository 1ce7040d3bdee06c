// SPDX-License-Identifier: Apache-2.0
// train.c: `bie train`: trains a preset (or any architecture string) on an IDX data set with
// shuffled mini-batches, Adam (Diode for int8 latent weights) and a cosine learning-rate
// schedule; tests after each epoch, checkpoints atomically after each epoch, and exports the packed
// inference model at the end.
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE * f) {
    fprintf(f,
            "usage: bie train [options]\n\n"
            "Trains a low-bit network on Fashion-MNIST (or any IDX data set of the MNIST family) and\n"
            "exports the packed inference model (safetensors, docs/model-format.md).\n\n"
            "model:\n"
            "  --model NAME       bmlp | bcnn | q4cnn (default bcnn)\n"
            "                       bmlp : input layer (f32, or q8 with --input-bits 8), two binary linear\n"
            "                              layers of --hidden units, batch norm, float classifier\n"
            "                       bcnn : float conv 3x3 (--c1), binary convs 3x3 (--c2 at full size,\n"
            "                              --c3 after a 2x2 max-pool), max-pool, a binary linear layer of\n"
            "                              --hidden units, batch norm after each, float classifier\n"
            "                       q4cnn: bcnn with 4-bit layers instead of binary ones\n"
            "  --c1 N --c2 N --c3 N --hidden N   layer widths (defaults: 32 64 64 256; bmlp --hidden 1024)\n"
            "  --input-bits 32|8  bmlp's input layer: float or 8-bit (default 32)\n"
            "  --arch STRING      any architecture (overrides --model; grammar in docs/model-format.md)\n"
            "  --latent f32|int8  latent weights of binary layers: float + Adam (default) or int8 + Diode\n"
            "training:\n"
            "  --epochs N         epochs (default 3)\n"
            "  --batch N          mini-batch size (default 128)\n"
            "  --lr X             peak Adam learning rate of the cosine schedule (default: 0.002, bmlp 0.001)\n"
            "  --diode-lr X       Diode's step fed into its sign accumulator (default 0.05)\n"
            "  --wd X             decoupled weight decay of float weights (default 0)\n"
            "  --seed N           seed of the initialisation and the shuffling (default 1)\n"
            "  --threads N        threads (default: all cores); a run is deterministic for a given seed\n"
            "                     and thread count\n"
            "  --limit N          train on the first N training images only\n"
            "  --test-limit N     test on the first N test images only\n"
            "data and files:\n"
            "  --data DIR         IDX files (train-images-idx3-ubyte[.gz] ...), default " DEFAULT_DATA_DIR "\n"
            "  --out FILE         the packed model (default model.safetensors)\n"
            "  --checkpoint FILE  checkpoint written after each epoch (default FILE.ckpt for --out FILE)\n"
            "  --resume           continue from the checkpoint (same options; the result is the same as\n"
            "                     an uninterrupted run's)\n"
            "  --stop-after N     stop after epoch N (the schedule still spans --epochs); --resume continues\n"
            "  -h, --help         this help\n\n"
            "Progress goes to stderr (a bar on a terminal, lines otherwise); results to stdout.\n"
            "Exit codes: 0 success, 1 run-time error, 2 usage error.\n");
}

struct opts {
    const char * model, * arch, * data, * out, * checkpoint;
    int64_t c1, c2, c3, hidden, input_bits, epochs, batch, seed, threads, limit, test_limit, stop_after;
    double lr, diode_lr, wd;
    enum bie_latent latent;
    bool resume;
};

static bool build_arch(const struct opts * o, int64_t c, int64_t h, int64_t w, char * out, size_t size) {
    if (o->arch) {
        snprintf(out, size, "%s", o->arch);
        return true;
    }
    if (!strcmp(o->model, "bmlp")) {
        const int64_t hid = o->hidden > 0 ? o->hidden : 1024;
        snprintf(out, size,
                 "input %lld %lld %lld; linear %s %lld; bn; linear b1 %lld; bn; linear b1 %lld; bn; linear f32 10",
                 (long long)c, (long long)h, (long long)w, o->input_bits == 8 ? "q8" : "f32", (long long)hid,
                 (long long)hid, (long long)hid);
        return true;
    }
    if (!strcmp(o->model, "bcnn") || !strcmp(o->model, "q4cnn")) {
        const char * q = !strcmp(o->model, "bcnn") ? "b1" : "q4";
        const int64_t c1 = o->c1 > 0 ? o->c1 : 32, c2 = o->c2 > 0 ? o->c2 : 64, c3 = o->c3 > 0 ? o->c3 : 64,
                      hid = o->hidden > 0 ? o->hidden : 256;
        snprintf(out, size,
                 "input %lld %lld %lld; conv f32 %lld 3; bn; conv %s %lld 3; maxpool 2; bn; conv %s %lld 3; "
                 "maxpool 2; bn; linear %s %lld; bn; linear f32 10",
                 (long long)c, (long long)h, (long long)w, (long long)c1, q, (long long)c2, q, (long long)c3, q,
                 (long long)hid);
        return true;
    }
    fprintf(stderr, "bie train: unknown model '%s' (bmlp, bcnn, q4cnn)\n", o->model);
    return false;
}

static uint64_t splitmix64(uint64_t * state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The order of epoch e depends only on (seed, e), so a resumed run sees the same batches.
static void shuffle(int64_t * order, int64_t n, uint64_t seed, int64_t epoch) {
    uint64_t st = seed * 0x9e3779b97f4a7c15ull + (uint64_t)epoch * 0xd1b54a32d192ed03ull;
    for (int64_t i = 0; i < n; i++) order[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        const int64_t j = (int64_t)(splitmix64(&st) % (uint64_t)(i + 1));
        const int64_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

// Progress: a redrawn bar on a terminal; otherwise a plain line every 15 seconds.
struct progress {
    bool tty;
    double last;
};

static void fmt_time(double s, char * out, size_t size) {
    if (!(s >= 0) || s > 360000) s = 0;
    snprintf(out, size, "%d:%02d", (int)s / 60, (int)s % 60);
}

static void progress_show(struct progress * p, int64_t epoch, int64_t epochs, int64_t batch, int64_t batches,
                          double loss, double acc, double ips, double eta, bool final) {
    const double t = now_seconds();
    if (!final && t - p->last < (p->tty ? 0.2 : 15.0)) return;
    p->last = t;
    char e[16];
    fmt_time(eta, e, sizeof e);
    if (p->tty) {
        char bar[21];
        const int fill = (int)(20 * batch / (batches ? batches : 1));
        for (int i = 0; i < 20; i++) bar[i] = i < fill ? '#' : '.';
        bar[20] = '\0';
        fprintf(stderr, "\r\033[Kepoch %lld/%lld [%s] %lld/%lld loss %.4f acc %.2f%% %.0f img/s ETA %s",
                (long long)epoch, (long long)epochs, bar, (long long)batch, (long long)batches, loss, 100 * acc, ips, e);
        if (final) fputc('\n', stderr);
    } else {
        fprintf(stderr, "epoch %lld/%lld batch %lld/%lld loss %.4f acc %.2f%% %.0f img/s ETA %s\n", (long long)epoch,
                (long long)epochs, (long long)batch, (long long)batches, loss, 100 * acc, ips, e);
    }
    fflush(stderr);
}

static bool parse(int argc, char ** argv, struct opts * o, int * code) {
    memset(o, 0, sizeof *o);
    o->model = "bcnn";
    o->data = DEFAULT_DATA_DIR;
    o->out = "model.safetensors";
    o->input_bits = 32;
    o->batch = 128;
    o->seed = 1;
    o->diode_lr = 0.05;
    *code = EXIT_USAGE;
    for (int i = 1; i < argc; i++) {
        const char * a = argv[i], * v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true, takes = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            *code = EXIT_OK_;
            return false;
        } else if (!strcmp(a, "--resume")) {
            o->resume = true;
            takes = false;
        } else if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--arch")) o->arch = v;
        else if (!strcmp(a, "--data")) o->data = v;
        else if (!strcmp(a, "--out")) o->out = v;
        else if (!strcmp(a, "--checkpoint")) o->checkpoint = v;
        else if (!strcmp(a, "--latent")) {
            if (v && !strcmp(v, "f32")) o->latent = BIE_LATENT_F32;
            else if (v && !strcmp(v, "int8")) o->latent = BIE_LATENT_INT8;
            else {
                fprintf(stderr, "bie train: --latent must be f32 or int8\n");
                return false;
            }
        } else if (!strcmp(a, "--c1")) ok = cli_int(a, v, 1, 4096, &o->c1);
        else if (!strcmp(a, "--c2")) ok = cli_int(a, v, 1, 4096, &o->c2);
        else if (!strcmp(a, "--c3")) ok = cli_int(a, v, 1, 4096, &o->c3);
        else if (!strcmp(a, "--hidden")) ok = cli_int(a, v, 1, 65536, &o->hidden);
        else if (!strcmp(a, "--input-bits")) {
            ok = cli_int(a, v, 8, 32, &o->input_bits) && (o->input_bits == 8 || o->input_bits == 32);
            if (!ok) fprintf(stderr, "bie train: --input-bits must be 32 or 8\n");
        } else if (!strcmp(a, "--epochs")) ok = cli_int(a, v, 1, 1000, &o->epochs);
        else if (!strcmp(a, "--batch")) ok = cli_int(a, v, 1, 65536, &o->batch);
        else if (!strcmp(a, "--seed")) ok = cli_int(a, v, 0, INT64_MAX, &o->seed);
        else if (!strcmp(a, "--threads")) ok = cli_int(a, v, 1, 1024, &o->threads);
        else if (!strcmp(a, "--limit")) ok = cli_int(a, v, 1, INT64_MAX, &o->limit);
        else if (!strcmp(a, "--test-limit")) ok = cli_int(a, v, 1, INT64_MAX, &o->test_limit);
        else if (!strcmp(a, "--stop-after")) ok = cli_int(a, v, 1, 1000, &o->stop_after);
        else if (!strcmp(a, "--lr")) ok = cli_float(a, v, 1e-9, 10, &o->lr);
        else if (!strcmp(a, "--diode-lr")) ok = cli_float(a, v, 0, 10, &o->diode_lr);
        else if (!strcmp(a, "--wd")) ok = cli_float(a, v, 0, 10, &o->wd);
        else {
            fprintf(stderr, "bie train: unknown option '%s' (see bie train --help)\n", a);
            return false;
        }
        if (!ok) return false;
        if (takes) {
            if (!v) {
                fprintf(stderr, "bie train: %s needs a value\n", a);
                return false;
            }
            i++;
        }
    }
    // Preset defaults, measured to reach the targets on 2 cores (docs/model-format.md).
    const bool mlp = !o->arch && o->model && !strcmp(o->model, "bmlp");
    if (o->epochs == 0) o->epochs = 3;
    if (o->lr == 0) o->lr = mlp ? 0.001 : 0.002;
    return true;
}

int bie_train_main(int argc, char ** argv) {
    struct opts o;
    int code;
    if (!parse(argc, argv, &o, &code)) return code;
    char ckpt[4096];
    snprintf(ckpt, sizeof ckpt, "%s", o.checkpoint ? o.checkpoint : o.out);
    if (!o.checkpoint) strncat(ckpt, ".ckpt", sizeof ckpt - strlen(ckpt) - 1);

    bie_context_t * ctx = NULL;
    if (bie_context_create(NULL, &ctx) != BIE_STATUS_OK) {
        fprintf(stderr, "bie train: cannot create a context\n");
        return EXIT_FAILURE_;
    }
    set_threads(ctx, o.threads);
    struct dataset train, test;
    if (!data_load(ctx, o.data, true, &train)) {
        bie_context_destroy(ctx);
        return EXIT_FAILURE_;
    }
    if (!data_load(ctx, o.data, false, &test)) {
        data_free(&train);
        bie_context_destroy(ctx);
        return EXIT_FAILURE_;
    }
    int rc = EXIT_FAILURE_;
    bie_model_t * m = NULL, * packed = NULL;
    float * x = NULL, * grad = NULL;
    uint8_t * y = NULL;
    int64_t * order = NULL;
    char arch[4096];
    enum bie_status s;
    int64_t first_epoch = 1;
    if (!build_arch(&o, 1, train.h, train.w, arch, sizeof arch)) {
        rc = EXIT_USAGE;
        goto done;
    }
    if (o.resume) {
        bie_safetensors_t * st = NULL;
        s = bie_model_load(ctx, ckpt, &m, &st);
        if (s != BIE_STATUS_OK) {
            rc = fail_status(ctx, "--resume", s);
            goto done;
        }
        const char * ep = bie_safetensors_metadata(st, "train.epoch");
        int64_t done_epochs = 0;
        if (bie_model_is_packed(m) || !ep || !cli_int("train.epoch", ep, 0, 1000, &done_epochs)) {
            fprintf(stderr, "bie train: %s is not a training checkpoint\n", ckpt);
            bie_safetensors_free(st);
            goto done;
        }
        bie_safetensors_free(st);
        if (strcmp(bie_model_arch(m), arch) != 0 && !o.arch) {
            fprintf(stderr, "bie train: the checkpoint's architecture differs from the options:\n  %s\n  %s\n",
                    bie_model_arch(m), arch);
            rc = EXIT_USAGE;
            goto done;
        }
        snprintf(arch, sizeof arch, "%s", bie_model_arch(m));
        first_epoch = done_epochs + 1;
        fprintf(stderr, "resuming from %s after epoch %lld\n", ckpt, (long long)done_epochs);
    } else {
        s = bie_model_create(ctx, arch, o.latent, (uint64_t)o.seed, &m);
        if (s != BIE_STATUS_OK) {
            rc = fail_status(ctx, "model", s);
            goto done;
        }
    }
    if (bie_model_num_inputs(m) != train.h * train.w) {
        fprintf(stderr, "bie train: the model takes %lld inputs, the images have %lld pixels\n",
                (long long)bie_model_num_inputs(m), (long long)(train.h * train.w));
        goto done;
    }
    const int64_t n_train = o.limit > 0 && o.limit < train.n ? o.limit : train.n;
    const int64_t batches = (n_train + o.batch - 1) / o.batch, classes = bie_model_num_outputs(m);
    const int64_t total_steps = batches * o.epochs;
    x = malloc(sizeof(float) * (size_t)(o.batch * train.h * train.w));
    grad = malloc(sizeof(float) * (size_t)(o.batch * classes));
    y = malloc((size_t)o.batch);
    order = malloc(sizeof(int64_t) * (size_t)n_train);
    if (!x || !grad || !y || !order) {
        fprintf(stderr, "bie train: out of memory\n");
        goto done;
    }
    printf("model: %s\narch: %s\ntraining on %lld images, testing on %lld, %lld epochs of %lld batches\n",
           o.arch ? "custom" : o.model, arch, (long long)n_train,
           (long long)(o.test_limit > 0 && o.test_limit < test.n ? o.test_limit : test.n), (long long)o.epochs,
           (long long)batches);
    fflush(stdout);
    struct progress prog = {isatty(2) != 0, 0};
    const double t_start = now_seconds();
    double test_acc = -1;
    for (int64_t epoch = first_epoch; epoch <= o.epochs; epoch++) {
        shuffle(order, n_train, (uint64_t)o.seed, epoch);
        double loss_sum = 0, t_epoch = now_seconds();
        int64_t correct = 0, seen = 0;
        for (int64_t b = 0; b < batches; b++) {
            const int64_t at = b * o.batch, nb = n_train - at < o.batch ? n_train - at : o.batch;
            data_batch(&train, order + at, nb, x, y);
            const int64_t step = (epoch - 1) * batches + b; // cosine schedule over the whole run
            const float lr = (float)(o.lr * 0.5 * (1.0 + cos(M_PI * (double)step / (double)total_steps)));
            const float dlr = (float)(o.diode_lr * 0.5 * (1.0 + cos(M_PI * (double)step / (double)total_steps)));
            const float * logits;
            double loss = 0;
            int64_t c = 0;
            s = bie_model_forward(ctx, m, x, nb, 1, 0, &logits);
            if (s == BIE_STATUS_OK) s = bie_softmax_cross_entropy(ctx, nb, classes, logits, y, &loss, grad, &c);
            if (s == BIE_STATUS_OK) s = bie_model_backward(ctx, m, grad);
            if (s == BIE_STATUS_OK) s = bie_model_step(ctx, m, lr, (float)o.wd, dlr);
            if (s != BIE_STATUS_OK) {
                if (prog.tty) fputc('\n', stderr);
                rc = fail_status(ctx, "training step", s);
                goto done;
            }
            if (!isfinite(loss)) {
                fprintf(stderr, "\nbie train: the loss diverged (%g) at epoch %lld batch %lld; try a smaller --lr\n",
                        loss, (long long)epoch, (long long)b);
                goto done;
            }
            loss_sum += loss * (double)nb;
            correct += c;
            seen += nb;
            const double el = now_seconds() - t_epoch, ips = (double)seen / (el > 0 ? el : 1e-9);
            const double left = (double)(n_train - seen) + (double)(o.epochs - epoch) * (double)n_train;
            progress_show(&prog, epoch, o.epochs, b + 1, batches, loss_sum / (double)seen, (double)correct / (double)seen,
                          ips, left / ips, b + 1 == batches);
        }
        double ips_test;
        if (!evaluate(ctx, m, &test, o.test_limit, 1000, 0, &test_acc, &ips_test)) goto done;
        printf("epoch %lld: train loss %.4f, train accuracy %.2f%%, test accuracy %.2f%%, %.1f s (elapsed %.1f s)\n",
               (long long)epoch, loss_sum / (double)seen, 100.0 * (double)correct / (double)seen, 100.0 * test_acc,
               now_seconds() - t_epoch, now_seconds() - t_start);
        fflush(stdout);
        char ep[32], tot[32], acc[32];
        snprintf(ep, sizeof ep, "%lld", (long long)epoch);
        snprintf(tot, sizeof tot, "%lld", (long long)o.epochs);
        snprintf(acc, sizeof acc, "%.4f", 100.0 * test_acc);
        const char * meta[] = {"train.epoch", ep, "train.epochs", tot, "train.test_accuracy", acc};
        s = bie_model_save(ctx, m, ckpt, BIE_MODEL_FILE_CHECKPOINT, meta, 3);
        if (s != BIE_STATUS_OK) {
            rc = fail_status(ctx, "checkpoint", s);
            goto done;
        }
        if (o.stop_after && epoch >= o.stop_after && epoch < o.epochs) {
            printf("stopped after epoch %lld; continue with --resume (checkpoint %s)\n", (long long)epoch, ckpt);
            rc = EXIT_OK_;
            goto done;
        }
    }
    if (test_acc < 0) { // resumed after the last epoch: measure once
        double ips_test;
        if (!evaluate(ctx, m, &test, o.test_limit, 1000, 0, &test_acc, &ips_test)) goto done;
    }
    const double train_time = now_seconds() - t_start;
    char acc[32];
    snprintf(acc, sizeof acc, "%.4f", 100.0 * test_acc);
    const char * meta[] = {"train.test_accuracy", acc};
    s = bie_model_save(ctx, m, o.out, BIE_MODEL_FILE_PACKED, meta, 1);
    if (s != BIE_STATUS_OK) {
        rc = fail_status(ctx, "export", s);
        goto done;
    }
    // The exported file is evaluated from the file alone: the same accuracy as the training's.
    s = bie_model_load(ctx, o.out, &packed, NULL);
    if (s != BIE_STATUS_OK) {
        rc = fail_status(ctx, "reloading the export", s);
        goto done;
    }
    double packed_acc, ips;
    if (!evaluate(ctx, packed, &test, o.test_limit, 1000, 0, &packed_acc, &ips)) goto done;
    printf("final test accuracy %.2f%% after %.1f s of training\n", 100.0 * test_acc, train_time);
    printf("exported %s: test accuracy %.2f%% from the packed file (%.0f images/s)\n", o.out, 100.0 * packed_acc, ips);
    if (packed_acc != test_acc) {
        fprintf(stderr, "bie train: the packed model's accuracy differs from the trained model's\n");
        goto done;
    }
    rc = EXIT_OK_;
done:
    bie_model_destroy(m);
    bie_model_destroy(packed);
    free(x);
    free(grad);
    free(y);
    free(order);
    data_free(&train);
    data_free(&test);
    bie_context_destroy(ctx);
    return rc;
}
