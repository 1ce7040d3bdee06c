// SPDX-License-Identifier: Apache-2.0
// eval.c: `bie eval MODEL`: test accuracy and images/s of a model file (packed or checkpoint),
// optionally beside the same model run with float layers (OpenBLAS GEMMs over the dequantized
// codes) in the same run.
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static void usage(FILE * f) {
    fprintf(f, "usage: bie eval MODEL [options]\n\n"
               "Runs MODEL (a packed model or a checkpoint written by bie train) on the test split and\n"
               "prints its accuracy and speed.\n\n"
               "  --data DIR        IDX files (t10k-images-idx3-ubyte[.gz] ...), default " DEFAULT_DATA_DIR "\n"
               "  --batch N         images per forward call (default 1000)\n"
               "  --threads N       threads (default: all cores)\n"
               "  --limit N         evaluate the first N test images only\n"
               "  --compare-float   also run the model with its low-bit layers as float GEMMs\n"
               "                    (OpenBLAS) and print both speeds and their ratio\n"
               "  -h, --help        this help\n\n"
               "Exit codes: 0 success, 1 run-time error (unreadable or corrupt model, data), 2 usage error.\n");
}

int bie_eval_main(int argc, char ** argv) {
    const char * path = NULL, * data = DEFAULT_DATA_DIR;
    int64_t batch = 1000, threads = 0, limit = 0;
    bool compare = false;
    for (int i = 1; i < argc; i++) {
        const char * a = argv[i], * v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return EXIT_OK_;
        } else if (!strcmp(a, "--compare-float")) {
            compare = true;
        } else if (!strcmp(a, "--data")) {
            if (!v) return fprintf(stderr, "bie eval: --data needs a value\n"), EXIT_USAGE;
            data = v;
            i++;
        } else if (!strcmp(a, "--batch") || !strcmp(a, "--threads") || !strcmp(a, "--limit")) {
            int64_t * dst = a[2] == 'b' ? &batch : a[2] == 't' ? &threads : &limit;
            if (!cli_int(a, v, 1, a[2] == 't' ? 1024 : INT64_MAX, dst)) return EXIT_USAGE;
            if (a[2] == 'b' && batch > 65536) return fprintf(stderr, "bie eval: --batch is at most 65536\n"), EXIT_USAGE;
            i++;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "bie eval: unknown option '%s' (see bie eval --help)\n", a);
            return EXIT_USAGE;
        } else if (!path) {
            path = a;
        } else {
            fprintf(stderr, "bie eval: more than one model given\n");
            return EXIT_USAGE;
        }
    }
    if (!path) {
        usage(stderr);
        return EXIT_USAGE;
    }
    bie_context_t * ctx = NULL;
    if (bie_context_create(NULL, &ctx) != BIE_STATUS_OK) return fprintf(stderr, "bie eval: no context\n"), EXIT_FAILURE_;
    set_threads(ctx, threads);
    int rc = EXIT_FAILURE_;
    bie_model_t * m = NULL;
    struct dataset test;
    memset(&test, 0, sizeof test);
    enum bie_status s = bie_model_load(ctx, path, &m, NULL);
    if (s != BIE_STATUS_OK) {
        fprintf(stderr, "bie eval: %s\n", bie_context_last_error(ctx));
        goto done;
    }
    if (!data_load(ctx, data, false, &test)) goto done;
    if (bie_model_num_inputs(m) != test.h * test.w) {
        fprintf(stderr, "bie eval: the model takes %lld inputs, the images have %lld pixels\n",
                (long long)bie_model_num_inputs(m), (long long)(test.h * test.w));
        goto done;
    }
    double acc, ips;
    if (!evaluate(ctx, m, &test, limit, batch, 0, &acc, &ips)) goto done;
    const int64_t n = limit > 0 && limit < test.n ? limit : test.n;
    printf("%s: test accuracy %.2f%% (%lld images), %.0f images/s (%s model, %d threads)\n", path, 100.0 * acc,
           (long long)n, ips, bie_model_is_packed(m) ? "packed" : "checkpoint", bie_omp_threads());
    if (compare) {
        double facc, fips;
        if (!evaluate(ctx, m, &test, limit, batch, 1, &facc, &fips)) goto done;
        printf("%s: test accuracy %.2f%% with float layers (OpenBLAS), %.0f images/s\n", path, 100.0 * facc, fips);
        printf("speed: the packed low-bit layers run %.2fx the images/s of the float layers\n", ips / fips);
    }
    rc = EXIT_OK_;
done:
    bie_model_destroy(m);
    data_free(&test);
    bie_context_destroy(ctx);
    return rc;
}
