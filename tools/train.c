// SPDX-License-Identifier: Apache-2.0
// train.c: `bie train`: trains a preset (or any architecture string) on an IDX data set with
// shuffled mini-batches, Adam (Diode for int8 latent weights) and a cosine learning-rate
// schedule; tests after each epoch, checkpoints atomically after each epoch (the checkpoint goes
// once the run succeeds, unless kept), optionally logs metrics as JSON lines, and exports the
// packed inference model at the end.
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE * f) {
    fprintf(f, "usage: bie train [options]\n\n"
               "Trains a low-bit network on Fashion-MNIST (or any IDX data set of the MNIST family) and\n"
               "exports the packed inference model (safetensors, docs/model-format.md). Options take their\n"
               "value as --opt VALUE or --opt=VALUE.\n\n"
               "model:\n"
               "  --model=NAME       bmlp | bcnn | q4cnn (default bcnn)\n"
               "                       bmlp : input layer (f32, or q8 with --input-bits 8), two binary linear\n"
               "                              layers of --hidden units, batch norm, float classifier\n"
               "                       bcnn : float conv 3x3 (--c1), binary convs 3x3 (--c2 at full size,\n"
               "                              --c3 after a 2x2 max-pool), max-pool, a binary linear layer of\n"
               "                              --hidden units, batch norm after each, float classifier\n"
               "                       q4cnn: bcnn with 4-bit layers instead of binary ones\n"
               "  --c1=N --c2=N --c3=N  conv widths, 1..4096 (defaults 32 64 64)\n"
               "  --hidden=N         hidden units, 1..65536 (default 256; bmlp 1024)\n"
               "  --input-bits=32|8  bmlp's input layer: float or 8-bit (default 32)\n"
               "  --arch=STRING      any architecture (overrides --model; grammar in docs/model-format.md)\n"
               "  --latent=f32|int8  latent weights of binary layers: float + Adam (default) or int8 + Diode\n"
               "training:\n"
               "  --epochs=N         epochs, 1..1000 (default 3)\n"
               "  --batch=N          mini-batch size, 1..65536 (default 128)\n"
               "  --lr=X             peak Adam learning rate of the cosine schedule, in [1e-9, 10]\n"
               "                     (default 0.002; bmlp 0.001)\n"
               "  --diode-lr=X       Diode's step fed into its sign accumulator, in [0, 10] (default 0.05)\n"
               "  --wd=X             decoupled weight decay of float weights, in [0, 10] (default 0)\n"
               "  --seed=N           seed of the initialisation and the shuffling, >= 0 (default 1)\n"
               "  --threads=N        threads, 1..1024 (default: all cores); a run is deterministic for a\n"
               "                     given seed and thread count\n"
               "  --limit=N          train on the first N training images only\n"
               "  --test-limit=N     test on the first N test images only\n"
               "data and files (checked before training starts):\n"
               "  --data=DIR         IDX files (train-images-idx3-ubyte[.gz] ...), default " DEFAULT_DATA_DIR "\n"
               "  --out=FILE         the packed model (default model.safetensors)\n"
               "  --checkpoint=FILE  checkpoint written after each epoch (default FILE.ckpt for --out FILE);\n"
               "                     removed once the run succeeds\n"
               "  --keep-checkpoint  keep the checkpoint after a successful run\n"
               "  --no-checkpoint    write no checkpoint (then --resume and --stop-after are not possible)\n"
               "  --resume           continue from the checkpoint: the options not given are the\n"
               "                     checkpoint's, and a given option that differs from it is refused (the\n"
               "                     result is the same as an uninterrupted run's)\n"
               "  --stop-after=N     stop after epoch N, 1..1000 (the schedule still spans --epochs);\n"
               "                     --resume continues\n"
               "  --log=FILE         metrics as JSON lines: every --log-every batches and after each epoch\n"
               "                     (appended to on --resume); scripts/plot-training.py draws them\n"
               "  --log-every=N      batches between two progress lines of the log, 1..1000000 (default 50)\n"
               "  -h, --help         this help\n\n"
               "Progress goes to stderr (a bar on a terminal, lines otherwise); results to stdout.\n"
               "Exit codes: 0 success, 1 run-time error, 2 usage error.\n");
}

struct opts {
    const char *model, *arch, *data, *out, *checkpoint, *latent, *log;
    int64_t c1, c2, c3, hidden, input_bits, epochs, batch, seed, threads, limit, test_limit, stop_after, log_every;
    double lr, diode_lr, wd;
    bool resume, keep_checkpoint, no_checkpoint;
};

static const char * const MODELS[] = {"bmlp", "bcnn", "q4cnn", NULL};
static const char * const LATENTS[] = {"f32", "int8", NULL};
static const char * const INPUT_BITS[] = {"32", "8", NULL};

// The options of `bie train`. The first N_RECORDED decide the trained weights and the accuracy
// reported: a checkpoint records them (metadata train.option.NAME), and --resume takes them from it.
enum { N_RECORDED = 16, N_OPTIONS = 26 };
static void option_table(struct opts * o, const char ** input_bits, struct cli_option * t) {
    const double big = (double)INT64_MAX;
    const struct cli_option table[N_OPTIONS] = {
        {"model", CLI_WORD, &o->model, 0, 0, MODELS, false},
        {"arch", CLI_STRING, &o->arch, 0, 0, NULL, false},
        {"c1", CLI_INT, &o->c1, 1, 4096, NULL, false},
        {"c2", CLI_INT, &o->c2, 1, 4096, NULL, false},
        {"c3", CLI_INT, &o->c3, 1, 4096, NULL, false},
        {"hidden", CLI_INT, &o->hidden, 1, 65536, NULL, false},
        {"input-bits", CLI_WORD, input_bits, 0, 0, INPUT_BITS, false},
        {"latent", CLI_WORD, &o->latent, 0, 0, LATENTS, false},
        {"epochs", CLI_INT, &o->epochs, 1, 1000, NULL, false},
        {"batch", CLI_INT, &o->batch, 1, 65536, NULL, false},
        {"lr", CLI_FLOAT, &o->lr, 1e-9, 10, NULL, false},
        {"diode-lr", CLI_FLOAT, &o->diode_lr, 0, 10, NULL, false},
        {"wd", CLI_FLOAT, &o->wd, 0, 10, NULL, false},
        {"seed", CLI_INT, &o->seed, 0, big, NULL, false},
        {"limit", CLI_INT, &o->limit, 1, big, NULL, false},
        {"test-limit", CLI_INT, &o->test_limit, 1, big, NULL, false},
        // not recorded: they change neither the weights nor the reported accuracy
        {"threads", CLI_INT, &o->threads, 1, 1024, NULL, false},
        {"data", CLI_STRING, &o->data, 0, 0, NULL, false},
        {"out", CLI_STRING, &o->out, 0, 0, NULL, false},
        {"checkpoint", CLI_STRING, &o->checkpoint, 0, 0, NULL, false},
        {"keep-checkpoint", CLI_FLAG, &o->keep_checkpoint, 0, 0, NULL, false},
        {"no-checkpoint", CLI_FLAG, &o->no_checkpoint, 0, 0, NULL, false},
        {"resume", CLI_FLAG, &o->resume, 0, 0, NULL, false},
        {"stop-after", CLI_INT, &o->stop_after, 1, 1000, NULL, false},
        {"log", CLI_STRING, &o->log, 0, 0, NULL, false},
        {"log-every", CLI_INT, &o->log_every, 1, 1000000, NULL, false},
    };
    memcpy(t, table, sizeof table);
}

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
                (long long)epoch, (long long)epochs, bar, (long long)batch, (long long)batches, loss, 100 * acc, ips,
                e);
        if (final) fputc('\n', stderr);
    } else {
        fprintf(stderr, "epoch %lld/%lld batch %lld/%lld loss %.4f acc %.2f%% %.0f img/s ETA %s\n", (long long)epoch,
                (long long)epochs, (long long)batch, (long long)batches, loss, 100 * acc, ips, e);
    }
    fflush(stderr);
}

// What a parsed command line holds: the options, their table (for the checkpoint's record) and the
// checkpoint's path.
struct command {
    struct opts o;
    const char * input_bits;
    struct cli_option table[N_OPTIONS];
    char ckpt[4096];
};

static bool parse(int argc, char ** argv, struct command * cmd, int * code) {
    struct opts * o = &cmd->o;
    memset(o, 0, sizeof *o);
    o->model = "bcnn";
    o->data = DEFAULT_DATA_DIR;
    o->out = "model.safetensors";
    o->latent = "f32";
    o->batch = 128;
    o->seed = 1;
    o->diode_lr = 0.05;
    o->epochs = 3;
    o->log_every = 50;
    cmd->input_bits = "32";
    option_table(o, &cmd->input_bits, cmd->table);
    int n_pos;
    if (!cli_parse("bie train", argc, argv, cmd->table, N_OPTIONS, NULL, 0, &n_pos, usage, code)) return false;
    *code = EXIT_USAGE;
    if (o->no_checkpoint && (o->resume || o->stop_after || o->keep_checkpoint || o->checkpoint)) {
        fprintf(stderr, "bie train: --no-checkpoint excludes --%s\n",
                o->resume            ? "resume"
                : o->stop_after      ? "stop-after (a stopped run resumes from its checkpoint)"
                : o->keep_checkpoint ? "keep-checkpoint"
                                     : "checkpoint");
        return false;
    }
    snprintf(cmd->ckpt, sizeof cmd->ckpt, "%s%s", o->checkpoint ? o->checkpoint : o->out, o->checkpoint ? "" : ".ckpt");
    if (!o->no_checkpoint && !strcmp(cmd->ckpt, o->out)) {
        fprintf(stderr, "bie train: --checkpoint and --out name the same file\n");
        return false;
    }
    return true;
}

// Preset defaults, measured to reach the targets on 2 cores (docs/model-format.md).
static void apply_defaults(struct command * cmd) {
    struct opts * o = &cmd->o;
    o->input_bits = atoi(cmd->input_bits);
    if (o->lr == 0) o->lr = !o->arch && !strcmp(o->model, "bmlp") ? 0.001 : 0.002;
}

// The outputs are checked before any work, so that a bad path fails at once, not after an epoch.
static bool check_outputs(const struct command * cmd) {
    const struct opts * o = &cmd->o;
    if (!cli_check_output("bie train", "--out", o->out)) return false;
    if (!o->no_checkpoint && !cli_check_output("bie train", "--checkpoint", cmd->ckpt)) return false;
    if (o->log && !cli_check_output("bie train", "--log", o->log)) return false;
    if (o->resume && access(cmd->ckpt, R_OK) != 0) {
        fprintf(stderr, "bie train: --resume: there is no checkpoint %s to resume from\n", cmd->ckpt);
        return false;
    }
    return true;
}

// --resume: the recorded options come from the checkpoint; one given on the command line with
// another value is refused, and each such option is named with both values.
static bool adopt_recorded(struct command * cmd, const bie_safetensors_t * st, bool * any_recorded) {
    char differ[2048] = "";
    *any_recorded = false;
    for (int i = 0; i < N_RECORDED; i++) {
        struct cli_option * opt = &cmd->table[i];
        char key[64], now[128];
        snprintf(key, sizeof key, "train.option.%s", opt->name);
        const char * was = bie_safetensors_metadata(st, key);
        if (!was) continue;
        *any_recorded = true;
        cli_format(opt, now, sizeof now);
        if (opt->given) {
            if (strcmp(now, was) != 0) {
                const size_t n = strlen(differ);
                snprintf(differ + n, sizeof differ - n, "  --%s: %s given, %s in the checkpoint\n", opt->name, now,
                         *was ? was : "(not set)");
            }
        } else if (!*was && (opt->kind == CLI_STRING || opt->kind == CLI_INT)) { // recorded as not set
            if (opt->kind == CLI_STRING) *(const char **)opt->value = NULL;
            else *(int64_t *)opt->value = 0;
        } else if (!cli_set("bie train: the checkpoint's", opt, was)) {
            return false;
        }
    }
    if (*differ) {
        fprintf(stderr,
                "bie train: --resume continues the checkpoint's run, and these options differ from it:\n%s"
                "Drop them to resume, or train anew without --resume.\n",
                differ);
        return false;
    }
    return true;
}

// The checkpoint's metadata: the epoch reached, the accuracy and the recorded options.
struct checkpoint_meta {
    char keys[N_RECORDED][64], values[N_RECORDED + 3][128];
    const char * meta[2 * (N_RECORDED + 3)];
};
static size_t checkpoint_meta(struct command * cmd, struct checkpoint_meta * cm, int64_t epoch, double test_acc) {
    size_t n = 0;
    snprintf(cm->values[0], sizeof cm->values[0], "%lld", (long long)epoch);
    snprintf(cm->values[1], sizeof cm->values[1], "%lld", (long long)cmd->o.epochs);
    snprintf(cm->values[2], sizeof cm->values[2], "%.4f", 100.0 * test_acc);
    const char * fixed[3] = {"train.epoch", "train.epochs", "train.test_accuracy"};
    for (int i = 0; i < 3; i++) {
        cm->meta[n++] = fixed[i];
        cm->meta[n++] = cm->values[i];
    }
    for (int i = 0; i < N_RECORDED; i++) {
        snprintf(cm->keys[i], sizeof cm->keys[i], "train.option.%s", cmd->table[i].name);
        cli_format(&cmd->table[i], cm->values[3 + i], sizeof cm->values[3 + i]);
        cm->meta[n++] = cm->keys[i];
        cm->meta[n++] = cm->values[3 + i];
    }
    return n / 2;
}

// What a run holds, released by run_free.
struct run {
    bie_context_t * ctx;
    bie_model_t *m, *packed;
    bie_safetensors_t * st;
    float *x, *grad, *logits;
    uint8_t * y;
    int64_t * order;
    FILE * log;
    struct dataset train, test;
    char arch[4096];
    int64_t first_epoch, n_train, n_test, batches, classes;
    struct progress prog;
    double t_start;
};
#define RUN_ON (-1) // a step's result when the run goes on (else the exit code)

static void run_free(struct run * r) {
    if (r->log) fclose(r->log);
    bie_safetensors_free(r->st);
    bie_model_destroy(r->m);
    bie_model_destroy(r->packed);
    free(r->x);
    free(r->grad);
    free(r->logits);
    free(r->y);
    free(r->order);
    data_free(&r->train);
    data_free(&r->test);
    bie_context_destroy(r->ctx);
}

// --resume: the checkpoint's model, its last epoch and its recorded options.
static int resume_from(struct command * cmd, struct run * r, bool * recorded) {
    if (!cli_check_model_file("bie train", cmd->ckpt)) return EXIT_FAILURE_;
    const enum bie_status s = bie_model_load(r->ctx, cmd->ckpt, &r->m, &r->st);
    if (s != BIE_STATUS_OK) return fail_status(r->ctx, "--resume", s);
    const char * ep = bie_safetensors_metadata(r->st, "train.epoch");
    struct cli_option epoch_opt = {"train.epoch", CLI_INT, &r->first_epoch, 0, 1000, NULL, false};
    if (bie_model_is_packed(r->m) || !ep || !cli_set("bie train: checkpoint", &epoch_opt, ep)) {
        fprintf(stderr, "bie train: %s is not a training checkpoint\n", cmd->ckpt);
        return EXIT_FAILURE_;
    }
    fprintf(stderr, "resuming from %s after epoch %lld\n", cmd->ckpt, (long long)r->first_epoch);
    r->first_epoch++;
    return adopt_recorded(cmd, r->st, recorded) ? RUN_ON : EXIT_USAGE;
}

// The data, the model (created, or the checkpoint's checked against the options) and the buffers.
static int setup(struct command * cmd, struct run * r) {
    struct opts * o = &cmd->o;
    bool recorded = false;
    r->first_epoch = 1;
    int rc = o->resume ? resume_from(cmd, r, &recorded) : RUN_ON;
    if (rc != RUN_ON) return rc;
    apply_defaults(cmd);
    set_threads(r->ctx, o->threads);
    if (o->log && !(r->log = fopen(o->log, o->resume ? "a" : "w"))) {
        fprintf(stderr, "bie train: --log %s: %s\n", o->log, strerror(errno));
        return EXIT_FAILURE_;
    }
    if (!data_load(r->ctx, o->data, true, &r->train) || !data_load(r->ctx, o->data, false, &r->test))
        return EXIT_FAILURE_;
    if (!build_arch(o, 1, r->train.h, r->train.w, r->arch, sizeof r->arch)) return EXIT_USAGE;
    if (o->resume) {
        // A checkpoint that records no options (an older one) is still checked by its architecture.
        if (!recorded && strcmp(bie_model_arch(r->m), r->arch) != 0 && !o->arch) {
            fprintf(stderr, "bie train: the checkpoint's architecture differs from the options:\n  %s\n  %s\n",
                    bie_model_arch(r->m), r->arch);
            return EXIT_USAGE;
        }
        snprintf(r->arch, sizeof r->arch, "%s", bie_model_arch(r->m));
    } else {
        const enum bie_status s = bie_model_create(
            r->ctx, r->arch, !strcmp(o->latent, "int8") ? BIE_LATENT_INT8 : BIE_LATENT_F32, (uint64_t)o->seed, &r->m);
        if (s != BIE_STATUS_OK) return fail_status(r->ctx, "model", s);
    }
    const int64_t pixels = r->train.h * r->train.w;
    if (bie_model_num_inputs(r->m) != pixels) {
        fprintf(stderr, "bie train: the model takes %lld inputs, the images have %lld pixels\n",
                (long long)bie_model_num_inputs(r->m), (long long)pixels);
        return EXIT_FAILURE_;
    }
    r->n_train = o->limit > 0 && o->limit < r->train.n ? o->limit : r->train.n;
    r->n_test = o->test_limit > 0 && o->test_limit < r->test.n ? o->test_limit : r->test.n;
    r->batches = (r->n_train + o->batch - 1) / o->batch;
    r->classes = bie_model_num_outputs(r->m);
    r->x = malloc(sizeof(float) * (size_t)(o->batch * pixels));
    r->grad = malloc(sizeof(float) * (size_t)(o->batch * r->classes));
    r->logits = malloc(sizeof(float) * (size_t)(o->batch * r->classes));
    r->y = malloc((size_t)o->batch);
    r->order = malloc(sizeof(int64_t) * (size_t)r->n_train);
    if (!r->x || !r->grad || !r->logits || !r->y || !r->order) {
        fprintf(stderr, "bie train: out of memory\n");
        return EXIT_FAILURE_;
    }
    return RUN_ON;
}

// The run's first lines: on stdout, and the log's "start" record.
static void announce(const struct command * cmd, const struct run * r) {
    const struct opts * o = &cmd->o;
    printf("model: %s\narch: %s\ntraining on %lld images, testing on %lld, %lld epochs of %lld batches\n",
           o->arch ? "custom" : o->model, r->arch, (long long)r->n_train, (long long)r->n_test, (long long)o->epochs,
           (long long)r->batches);
    fflush(stdout);
    FILE * log = r->log;
    jl_begin(log, "start");
    jl_str(log, "model", o->arch ? "custom" : o->model);
    jl_str(log, "arch", r->arch);
    jl_int(log, "epochs", o->epochs);
    jl_int(log, "batch", o->batch);
    jl_int(log, "batches_per_epoch", r->batches);
    jl_num(log, "lr", o->lr);
    jl_int(log, "train_images", r->n_train);
    jl_int(log, "test_images", r->n_test);
    jl_int(log, "first_epoch", r->first_epoch);
    jl_int(log, "threads", bie_omp_threads());
    jl_end(log);
}

// Sums of the batches since the epoch began (all) and since the last log line (win).
struct tally {
    double loss, t;
    int64_t correct, seen;
};

// The cosine schedule's factor at a step (over the whole run): 1 at the start, 0 at the end.
static double schedule(const struct command * cmd, const struct run * r, int64_t step) {
    return 0.5 * (1.0 + cos(M_PI * (double)step / (double)(r->batches * cmd->o.epochs)));
}

// One training step on nb images (forward, loss, backward, step) at the schedule's learning rates.
static int train_step(const struct command * cmd, struct run * r, int64_t nb, int64_t step, double * loss,
                      int64_t * correct) {
    const struct opts * o = &cmd->o;
    const double cosine = schedule(cmd, r, step);
    const float lr = (float)(o->lr * cosine), dlr = (float)(o->diode_lr * cosine);
    struct bie_tensor tx, tz, tl, tg;
    bie_tensor_make(&tx, r->x, BIE_DTYPE_F32, 2, (const int64_t[]){nb, bie_model_num_inputs(r->m)});
    bie_tensor_make(&tz, r->logits, BIE_DTYPE_F32, 2, (const int64_t[]){nb, r->classes});
    bie_tensor_make(&tl, r->y, BIE_DTYPE_U8, 1, &nb);
    bie_tensor_make(&tg, r->grad, BIE_DTYPE_F32, 2, (const int64_t[]){nb, r->classes});
    enum bie_status s = bie_model_forward(r->ctx, r->m, &(struct bie_model_forward_desc){1, 0},
                                          &(struct bie_model_forward_args){&tx, &tz});
    if (s == BIE_STATUS_OK)
        s = bie_softmax_cross_entropy(r->ctx, &(struct bie_softmax_cross_entropy_args){&tz, &tl, &tg, loss, correct});
    if (s == BIE_STATUS_OK) s = bie_model_backward(r->ctx, r->m, &(struct bie_model_backward_args){&tg});
    if (s == BIE_STATUS_OK) s = bie_model_step(r->ctx, r->m, &(struct bie_model_step_desc){lr, (float)o->wd, dlr});
    if (s != BIE_STATUS_OK) {
        if (r->prog.tty) fputc('\n', stderr);
        return fail_status(r->ctx, "training step", s);
    }
    return RUN_ON;
}

// The log's "step" record: the mean loss and accuracy of the batches since the last one.
static void log_window(const struct command * cmd, const struct run * r, int64_t epoch, int64_t b,
                       const struct tally * win, double now) {
    const float lr = (float)(cmd->o.lr * schedule(cmd, r, (epoch - 1) * r->batches + b));
    jl_begin(r->log, "step");
    jl_int(r->log, "epoch", epoch);
    jl_int(r->log, "batch", b + 1);
    jl_num(r->log, "epoch_progress", (double)(epoch - 1) + (double)(b + 1) / (double)r->batches);
    jl_num(r->log, "loss", win->loss / (double)win->seen);
    jl_num(r->log, "accuracy", (double)win->correct / (double)win->seen);
    jl_num(r->log, "lr", lr);
    jl_num(r->log, "images_per_s", (double)win->seen / (now - win->t > 0 ? now - win->t : 1e-9));
    jl_num(r->log, "elapsed_s", now - r->t_start);
    jl_end(r->log);
}

// The batches of one epoch; all holds their sums.
static int train_batches(const struct command * cmd, struct run * r, int64_t epoch, struct tally * all) {
    const struct opts * o = &cmd->o;
    struct tally win = {0, all->t, 0, 0};
    for (int64_t b = 0; b < r->batches; b++) {
        const int64_t at = b * o->batch, nb = r->n_train - at < o->batch ? r->n_train - at : o->batch;
        data_batch(&r->train, r->order + at, nb, r->x, r->y);
        double loss = 0;
        int64_t c = 0;
        const int rc = train_step(cmd, r, nb, (epoch - 1) * r->batches + b, &loss, &c);
        if (rc != RUN_ON) return rc;
        if (!isfinite(loss)) {
            fprintf(stderr, "\nbie train: the loss diverged (%g) at epoch %lld batch %lld; try a smaller --lr\n", loss,
                    (long long)epoch, (long long)b);
            return EXIT_FAILURE_;
        }
        all->loss += loss * (double)nb;
        all->correct += c;
        all->seen += nb;
        win.loss += loss * (double)nb;
        win.correct += c;
        win.seen += nb;
        const double now = now_seconds(), el = now - all->t, ips = (double)all->seen / (el > 0 ? el : 1e-9);
        const double left = (double)(r->n_train - all->seen) + (double)(o->epochs - epoch) * (double)r->n_train;
        progress_show(&r->prog, epoch, o->epochs, b + 1, r->batches, all->loss / (double)all->seen,
                      (double)all->correct / (double)all->seen, ips, left / ips, b + 1 == r->batches);
        if (r->log && ((b + 1) % o->log_every == 0 || b + 1 == r->batches)) {
            log_window(cmd, r, epoch, b, &win, now);
            win = (struct tally){0, now, 0, 0};
        }
    }
    return RUN_ON;
}

// One epoch: its batches, the test accuracy, its lines and its checkpoint.
static int train_epoch(struct command * cmd, struct run * r, int64_t epoch, double * test_acc) {
    const struct opts * o = &cmd->o;
    shuffle(r->order, r->n_train, (uint64_t)o->seed, epoch);
    struct tally all = {0, now_seconds(), 0, 0};
    int rc = train_batches(cmd, r, epoch, &all);
    if (rc != RUN_ON) return rc;
    double ips_test;
    if (!evaluate(r->ctx, r->m, &r->test, o->test_limit, CLI_EVAL_BATCH, 0, test_acc, &ips_test)) return EXIT_FAILURE_;
    const double epoch_s = now_seconds() - all.t, loss = all.loss / (double)all.seen;
    const double acc = (double)all.correct / (double)all.seen;
    printf("epoch %lld: train loss %.4f, train accuracy %.2f%%, test accuracy %.2f%%, %.1f s (elapsed %.1f s)\n",
           (long long)epoch, loss, 100.0 * acc, 100.0 * *test_acc, epoch_s, now_seconds() - r->t_start);
    fflush(stdout);
    jl_begin(r->log, "epoch");
    jl_int(r->log, "epoch", epoch);
    jl_num(r->log, "train_loss", loss);
    jl_num(r->log, "train_accuracy", acc);
    jl_num(r->log, "test_accuracy", *test_acc);
    jl_num(r->log, "epoch_s", epoch_s);
    jl_num(r->log, "elapsed_s", now_seconds() - r->t_start);
    jl_end(r->log);
    if (!o->no_checkpoint) {
        struct checkpoint_meta cm;
        const size_t n_meta = checkpoint_meta(cmd, &cm, epoch, *test_acc);
        const enum bie_status s = bie_model_save(r->ctx, r->m, cmd->ckpt, BIE_MODEL_FILE_CHECKPOINT, cm.meta, n_meta);
        if (s != BIE_STATUS_OK) return fail_status(r->ctx, "checkpoint", s);
    }
    if (o->stop_after && epoch >= o->stop_after && epoch < o->epochs) {
        printf("stopped after epoch %lld; continue with --resume (checkpoint %s)\n", (long long)epoch, cmd->ckpt);
        return EXIT_OK_;
    }
    return RUN_ON;
}

// The packed export, evaluated from the file alone (the same accuracy as the training's), and the
// checkpoint removed unless kept.
static int finish(const struct command * cmd, struct run * r, double test_acc) {
    const struct opts * o = &cmd->o;
    const double train_time = now_seconds() - r->t_start;
    char acc[32];
    snprintf(acc, sizeof acc, "%.4f", 100.0 * test_acc);
    const char * meta[] = {"train.test_accuracy", acc};
    enum bie_status s = bie_model_save(r->ctx, r->m, o->out, BIE_MODEL_FILE_PACKED, meta, 1);
    if (s != BIE_STATUS_OK) return fail_status(r->ctx, "export", s);
    s = bie_model_load(r->ctx, o->out, &r->packed, NULL);
    if (s != BIE_STATUS_OK) return fail_status(r->ctx, "reloading the export", s);
    double packed_acc, ips;
    if (!evaluate(r->ctx, r->packed, &r->test, o->test_limit, CLI_EVAL_BATCH, 0, &packed_acc, &ips))
        return EXIT_FAILURE_;
    printf("final test accuracy %.2f%% after %.1f s of training\n", 100.0 * test_acc, train_time);
    printf("exported %s: test accuracy %.2f%% from the packed file (%.0f images/s)\n", o->out, 100.0 * packed_acc, ips);
    jl_begin(r->log, "end");
    jl_num(r->log, "test_accuracy", test_acc);
    jl_num(r->log, "packed_test_accuracy", packed_acc);
    jl_num(r->log, "train_s", train_time);
    jl_str(r->log, "model_file", o->out);
    jl_end(r->log);
    if (packed_acc != test_acc) {
        fprintf(stderr, "bie train: the packed model's accuracy differs from the trained model's\n");
        return EXIT_FAILURE_;
    }
    if (!o->no_checkpoint && !o->keep_checkpoint && remove(cmd->ckpt) != 0 && errno != ENOENT)
        fprintf(stderr, "bie train: cannot remove the checkpoint %s: %s\n", cmd->ckpt, strerror(errno));
    return EXIT_OK_;
}

static int train_run(struct command * cmd, struct run * r) {
    int rc = setup(cmd, r);
    if (rc != RUN_ON) return rc;
    announce(cmd, r);
    r->prog = (struct progress){isatty(2) != 0, 0};
    r->t_start = now_seconds();
    double test_acc = -1;
    for (int64_t epoch = r->first_epoch; epoch <= cmd->o.epochs; epoch++)
        if ((rc = train_epoch(cmd, r, epoch, &test_acc)) != RUN_ON) return rc;
    if (test_acc < 0) { // resumed after the last epoch: measure once
        double ips_test;
        if (!evaluate(r->ctx, r->m, &r->test, cmd->o.test_limit, CLI_EVAL_BATCH, 0, &test_acc, &ips_test))
            return EXIT_FAILURE_;
    }
    return finish(cmd, r, test_acc);
}

int bie_train_main(int argc, char ** argv) {
    struct command cmd;
    int code;
    if (!parse(argc, argv, &cmd, &code)) return code;
    if (!check_outputs(&cmd)) return EXIT_USAGE;
    struct run r;
    memset(&r, 0, sizeof r);
    if (bie_context_create(NULL, &r.ctx) != BIE_STATUS_OK) {
        fprintf(stderr, "bie train: cannot create a context\n");
        return EXIT_FAILURE_;
    }
    const int rc = train_run(&cmd, &r);
    run_free(&r);
    return rc;
}
