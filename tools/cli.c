// SPDX-License-Identifier: Apache-2.0
// cli.c: option parsing, file checks, the data set, evaluation and thread helpers of the `bie`
// program.
#include "cli.h"

#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

// The limits of an integer option in words ("1..65536", "a positive integer").
static void int_range(const struct cli_option * o, char * out, size_t size) {
    if (o->hi >= (double)INT64_MAX && o->lo == 1) snprintf(out, size, "a positive integer");
    else if (o->hi >= (double)INT64_MAX && o->lo == 0) snprintf(out, size, "an integer >= 0");
    else snprintf(out, size, "an integer in %lld..%lld", (long long)o->lo, (long long)o->hi);
}

bool cli_set(const char * prog, struct cli_option * o, const char * text) {
    char * end;
    errno = 0;
    switch (o->kind) {
    case CLI_FLAG: *(bool *)o->value = true; return true;
    case CLI_STRING:
        if (!*text) {
            fprintf(stderr, "%s: --%s: the value is empty\n", prog, o->name);
            return false;
        }
        *(const char **)o->value = text;
        return true;
    case CLI_WORD:
        for (const char * const * w = o->words; *w; w++)
            if (!strcmp(*w, text)) {
                *(const char **)o->value = *w;
                return true;
            }
        fprintf(stderr, "%s: --%s: '%s' is not one of", prog, o->name, text);
        for (const char * const * w = o->words; *w; w++) fprintf(stderr, "%s %s", w == o->words ? "" : ",", *w);
        fputc('\n', stderr);
        return false;
    case CLI_INT: {
        const long long v = strtoll(text, &end, 10);
        if (errno || *end || end == text || (double)v < o->lo || (double)v > o->hi) {
            char range[64];
            int_range(o, range, sizeof range);
            fprintf(stderr, "%s: --%s: '%s' is not %s\n", prog, o->name, text, range);
            return false;
        }
        *(int64_t *)o->value = v;
        return true;
    }
    case CLI_FLOAT: {
        const double v = strtod(text, &end);
        if (errno || *end || end == text || !(v >= o->lo && v <= o->hi)) {
            fprintf(stderr, "%s: --%s: '%s' is not a number in [%g, %g]\n", prog, o->name, text, o->lo, o->hi);
            return false;
        }
        *(double *)o->value = v;
        return true;
    }
    }
    return false;
}

void cli_format(const struct cli_option * o, char * out, size_t size) {
    switch (o->kind) {
    case CLI_FLAG: snprintf(out, size, "%s", *(bool *)o->value ? "1" : "0"); return;
    case CLI_STRING:
    case CLI_WORD: snprintf(out, size, "%s", *(const char **)o->value ? *(const char **)o->value : ""); return;
    case CLI_INT: { // a value below the range is "not set" (the default applies): empty text
        const int64_t v = *(int64_t *)o->value;
        if ((double)v < o->lo) snprintf(out, size, "%s", "");
        else snprintf(out, size, "%lld", (long long)v);
        return;
    }
    case CLI_FLOAT: snprintf(out, size, "%.17g", *(double *)o->value); return;
    }
}

struct cli_option * cli_find(struct cli_option * opts, size_t n_opts, const char * name) {
    for (size_t i = 0; i < n_opts; i++)
        if (!strcmp(opts[i].name, name)) return &opts[i];
    return NULL;
}

bool cli_parse(const char * prog, int argc, char ** argv, struct cli_option * opts, size_t n_opts,
               const char ** positional, int max_positional, int * n_positional, void (*usage)(FILE *),
               int * exit_code) {
    *exit_code = EXIT_USAGE;
    *n_positional = 0;
    struct option * longopts = calloc(n_opts + 2, sizeof *longopts);
    if (!longopts) {
        fprintf(stderr, "%s: out of memory\n", prog);
        *exit_code = EXIT_FAILURE_;
        return false;
    }
    for (size_t i = 0; i < n_opts; i++)
        longopts[i] = (struct option){opts[i].name, opts[i].kind == CLI_FLAG ? no_argument : required_argument, NULL,
                                      (int)(256 + i)};
    longopts[n_opts] = (struct option){"help", no_argument, NULL, 'h'};
    bool ok = true;
    optind = 0; // (re)initialises GNU getopt, which permutes: options may follow positional arguments
    opterr = 0;
    int c;
    while (ok && (c = getopt_long(argc, argv, "-:h", longopts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            *exit_code = EXIT_OK_;
            ok = false;
        } else if (c == 1) { // a positional argument (the "-" in the option string keeps the order)
            if (*n_positional >= max_positional) {
                fprintf(stderr, "%s: unexpected argument '%s'\n", prog, optarg);
                ok = false;
            } else {
                positional[(*n_positional)++] = optarg;
            }
        } else if (c == ':') {
            fprintf(stderr, "%s: %s needs a value\n", prog, argv[optind - 1]);
            ok = false;
        } else if (c >= 256 && c < 256 + (int)n_opts) {
            struct cli_option * o = &opts[c - 256];
            ok = cli_set(prog, o, optarg);
            o->given = true;
        } else {
            fprintf(stderr, "%s: unknown option '%s'\n", prog, argv[optind - 1]);
            ok = false;
        }
    }
    free(longopts);
    if (!ok && *exit_code == EXIT_USAGE) fprintf(stderr, "Try '%s --help'.\n", prog);
    return ok;
}

bool cli_check_output(const char * prog, const char * what, const char * path) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "%s: %s %s: is a directory\n", prog, what, path);
        return false;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char * slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) slash[1] = '\0';
    else *slash = '\0';
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "%s: %s %s: the directory %s does not exist\n", prog, what, path, dir);
        return false;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        fprintf(stderr, "%s: %s %s: the directory %s is not writable: %s\n", prog, what, path, dir, strerror(errno));
        return false;
    }
    return true;
}

bool cli_check_model_file(const char * prog, const char * path) {
    FILE * f = fopen(path, "rb");
    if (!f) return true;
    unsigned char b[9];
    const size_t n = fread(b, 1, sizeof b, f);
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    fclose(f);
    uint64_t header = 0;
    for (int i = 7; i >= 0 && n >= 8; i--) header = header << 8 | b[i];
    if (n == sizeof b && b[8] == '{' && size >= 9 && header <= (uint64_t)size - 8) return true;
    const char * kind = "it does not start with a header length and a JSON header";
    if (n < sizeof b) kind = "it is too short";
    else if (!memcmp(b, "PK\x03\x04", 4)) kind = "it is a zip archive, as PyTorch's torch.save writes";
    else if (b[0] == 0x80 && b[1] >= 2 && b[1] <= 5) kind = "it is a Python pickle, as older torch.save writes";
    else if (b[0] == 0x1f && b[1] == 0x8b) kind = "it is gzip-compressed";
    else if (!memcmp(b, "\x89HDF", 4)) kind = "it is an HDF5 file";
    else if (!memcmp(b, "\x08\x01", 2) || !memcmp(b, "\x08\x03", 2) || !memcmp(b, "\x08\x07", 2))
        kind = "it looks like an ONNX model";
    else if (b[8] == '{') kind = "its header length is larger than the file";
    fprintf(stderr,
            "%s: %s is not a safetensors file: %s (bie reads the models that bie train and the "
            "PyTorch binding's bie.export_model write)\n",
            prog, path, kind);
    return false;
}

void cli_json_string(FILE * f, const char * s) {
    fputc('"', f);
    for (const unsigned char * p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

void jl_begin(FILE * f, const char * event) {
    if (!f) return;
    fputs("{\"event\": ", f);
    cli_json_string(f, event);
}

void jl_int(FILE * f, const char * key, int64_t v) {
    if (f) fprintf(f, ", \"%s\": %lld", key, (long long)v);
}

void jl_num(FILE * f, const char * key, double v) {
    if (!f) return;
    if (isfinite(v)) fprintf(f, ", \"%s\": %.6g", key, v);
    else fprintf(f, ", \"%s\": null", key);
}

void jl_str(FILE * f, const char * key, const char * v) {
    if (!f) return;
    fprintf(f, ", \"%s\": ", key);
    cli_json_string(f, v);
}

void jl_end(FILE * f) {
    if (!f) return;
    fputs("}\n", f);
    fflush(f);
}

int fail_status(bie_context_t * ctx, const char * what, enum bie_status s) {
    fprintf(stderr, "bie: %s: %s: %s\n", what, bie_status_string(s), bie_context_last_error(ctx));
    return EXIT_FAILURE_;
}

// DIR/name.gz if it exists, else DIR/name.
static void data_path(const char * dir, const char * name, char * out, size_t size) {
    struct stat sb;
    snprintf(out, size, "%s/%s.gz", dir, name);
    if (stat(out, &sb) == 0) return;
    snprintf(out, size, "%s/%s", dir, name);
}

bool data_load(bie_context_t * ctx, const char * dir, bool train, struct dataset * out) {
    memset(out, 0, sizeof *out);
    char ip[4096], lp[4096];
    data_path(dir, train ? "train-images-idx3-ubyte" : "t10k-images-idx3-ubyte", ip, sizeof ip);
    data_path(dir, train ? "train-labels-idx1-ubyte" : "t10k-labels-idx1-ubyte", lp, sizeof lp);
    enum bie_status s = bie_idx_read(ctx, ip, &out->images);
    if (s == BIE_STATUS_OK) s = bie_idx_read(ctx, lp, &out->labels);
    if (s != BIE_STATUS_OK) {
        fprintf(stderr, "bie: data: %s\n", bie_context_last_error(ctx));
        if (s == BIE_STATUS_IO_ERROR)
            fprintf(stderr, "bie: install the data set (apt-get install dataset-fashion-mnist) or point --data "
                            "to a directory of IDX files\n");
        data_free(out);
        return false;
    }
    if (out->images.ndim != 3 || out->labels.ndim != 1) {
        fprintf(stderr, "bie: data: %s must have 3 dimensions and %s 1 (have %d and %d)\n", ip, lp,
                (int)out->images.ndim, (int)out->labels.ndim);
        data_free(out);
        return false;
    }
    if (out->images.shape[0] != out->labels.shape[0]) {
        fprintf(stderr, "bie: data: %s has %lld images but %s has %lld labels\n", ip, (long long)out->images.shape[0],
                lp, (long long)out->labels.shape[0]);
        data_free(out);
        return false;
    }
    for (int64_t i = 0; i < out->labels.shape[0]; i++)
        if (out->labels.data[i] > 9) {
            fprintf(stderr, "bie: data: %s: label %d of item %lld is not in [0, 9]\n", lp, out->labels.data[i],
                    (long long)i);
            data_free(out);
            return false;
        }
    out->n = out->images.shape[0];
    out->h = out->images.shape[1];
    out->w = out->images.shape[2];
    return true;
}

void data_free(struct dataset * d) {
    bie_idx_free(&d->images);
    bie_idx_free(&d->labels);
}

void data_batch(const struct dataset * d, const int64_t * order, int64_t n, float * x, uint8_t * y) {
    const int64_t px = d->h * d->w;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const int64_t j = order ? order[i] : i;
        const uint8_t * src = d->images.data + j * px;
        for (int64_t p = 0; p < px; p++) x[i * px + p] = (float)src[p] * (1.0f / 255.0f);
        y[i] = d->labels.data[j];
    }
}

bool evaluate(bie_context_t * ctx, bie_model_t * m, const struct dataset * d, int64_t limit, int64_t batch,
              int float_layers, double * accuracy, double * images_per_s) {
    const int64_t n = limit > 0 && limit < d->n ? limit : d->n;
    const int64_t px = d->h * d->w;
    float * x = malloc(sizeof(float) * (size_t)(batch * px));
    uint8_t * y = malloc((size_t)batch);
    int64_t * order = malloc(sizeof(int64_t) * (size_t)batch);
    const int64_t k = bie_model_num_outputs(m);
    float * logits = malloc(sizeof(float) * (size_t)(batch * k));
    if (!x || !y || !order || !logits) {
        free(logits);
        free(x);
        free(y);
        free(order);
        fprintf(stderr, "bie: out of memory\n");
        return false;
    }
    int64_t correct = 0;
    double model_time = 0;
    bool ok = true;
    for (int64_t at = 0; ok && at < n; at += batch) {
        const int64_t b = n - at < batch ? n - at : batch;
        for (int64_t i = 0; i < b; i++) order[i] = at + i;
        data_batch(d, order, b, x, y);
        struct bie_tensor tx, tz, tl;
        bie_tensor_make(&tx, x, BIE_DTYPE_F32, 2, (const int64_t[]){b, px});
        bie_tensor_make(&tz, logits, BIE_DTYPE_F32, 2, (const int64_t[]){b, k});
        bie_tensor_make(&tl, y, BIE_DTYPE_U8, 1, &b);
        const double t0 = now_seconds();
        enum bie_status s = bie_model_forward(ctx, m, &(struct bie_model_forward_desc){0, float_layers},
                                              &(struct bie_model_forward_args){&tx, &tz});
        model_time += now_seconds() - t0;
        int64_t c = 0;
        if (s == BIE_STATUS_OK)
            s = bie_softmax_cross_entropy(ctx, &(struct bie_softmax_cross_entropy_args){&tz, &tl, NULL, NULL, &c});
        if (s != BIE_STATUS_OK) {
            fail_status(ctx, "evaluation", s);
            ok = false;
        }
        correct += c;
    }
    free(logits);
    free(x);
    free(y);
    free(order);
    *accuracy = (double)correct / (double)n;
    *images_per_s = model_time > 0 ? (double)n / model_time : 0;
    return ok;
}

void set_threads(bie_context_t * ctx, int64_t n) {
    if (n <= 0) return;
    omp_set_num_threads((int)n);
    openblas_set_num_threads((int)n);
    bie_context_set_num_threads(ctx, (int32_t)n);
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int bie_omp_threads(void) { return omp_get_max_threads(); }
