// SPDX-License-Identifier: Apache-2.0
// cli.c: option parsing, the data set, evaluation and thread helpers of the `bie` program.
#include "cli.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

bool cli_int(const char * opt, const char * val, int64_t lo, int64_t hi, int64_t * out) {
    if (!val) {
        fprintf(stderr, "bie: %s needs a value\n", opt);
        return false;
    }
    char * end;
    errno = 0;
    long long v = strtoll(val, &end, 10);
    if (errno || *end || end == val || v < lo || v > hi) {
        fprintf(stderr, "bie: %s: '%s' is not an integer in [%lld, %lld]\n", opt, val, (long long)lo, (long long)hi);
        return false;
    }
    *out = v;
    return true;
}

bool cli_float(const char * opt, const char * val, double lo, double hi, double * out) {
    if (!val) {
        fprintf(stderr, "bie: %s needs a value\n", opt);
        return false;
    }
    char * end;
    errno = 0;
    double v = strtod(val, &end);
    if (errno || *end || end == val || !(v >= lo && v <= hi)) {
        fprintf(stderr, "bie: %s: '%s' is not a number in [%g, %g]\n", opt, val, lo, hi);
        return false;
    }
    *out = v;
    return true;
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
            fprintf(stderr, "bie: data: %s: label %d of item %lld is not in [0, 9]\n", lp, out->labels.data[i], (long long)i);
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
    if (!x || !y || !order) {
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
        const float * logits;
        const double t0 = now_seconds();
        enum bie_status s = bie_model_forward(ctx, m, x, b, 0, float_layers, &logits);
        model_time += now_seconds() - t0;
        int64_t c = 0;
        if (s == BIE_STATUS_OK)
            s = bie_softmax_cross_entropy(ctx, b, bie_model_num_outputs(m), logits, y, NULL, NULL, &c);
        if (s != BIE_STATUS_OK) {
            fail_status(ctx, "evaluation", s);
            ok = false;
        }
        correct += c;
    }
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
