// SPDX-License-Identifier: Apache-2.0
// eval.c: `bie eval MODEL`: test accuracy and images/s of a model file (packed or checkpoint),
// optionally beside the same model run with float layers (OpenBLAS GEMMs over the dequantized
// codes) in the same run.
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static void usage(FILE * f) {
    fprintf(f,
            "usage: bie eval MODEL [options]\n\n"
            "Runs MODEL (a packed model or a checkpoint written by bie train) on the test split and\n"
            "prints its accuracy and speed.\n\n"
            "  --data=DIR        IDX files (t10k-images-idx3-ubyte[.gz] ...), default " DEFAULT_DATA_DIR "\n"
            "  --batch=N         images per forward call, 1..65536 (default %d)\n"
            "  --threads=N       threads, 1..1024 (default: all cores)\n"
            "  --limit=N         evaluate the first N test images only\n"
            "  --compare-float   also run the model with its low-bit layers as float GEMMs\n"
            "                    (OpenBLAS) and print both speeds and their ratio\n"
            "  -h, --help        this help\n\n"
            "Exit codes: 0 success, 1 run-time error (unreadable or corrupt model, data), 2 usage error.\n",
            CLI_EVAL_BATCH);
}

int bie_eval_main(int argc, char ** argv) {
    const char *path = NULL, *data = DEFAULT_DATA_DIR;
    int64_t batch = CLI_EVAL_BATCH, threads = 0, limit = 0;
    bool compare = false;
    struct cli_option opts[] = {
        {"data", CLI_STRING, &data, 0, 0, NULL, false},
        {"batch", CLI_INT, &batch, 1, 65536, NULL, false},
        {"threads", CLI_INT, &threads, 1, 1024, NULL, false},
        {"limit", CLI_INT, &limit, 1, (double)INT64_MAX, NULL, false},
        {"compare-float", CLI_FLAG, &compare, 0, 0, NULL, false},
    };
    int n_pos, code;
    if (!cli_parse("bie eval", argc, argv, opts, sizeof opts / sizeof opts[0], &path, 1, &n_pos, usage, &code))
        return code;
    if (!path) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (!cli_check_model_file("bie eval", path)) return EXIT_FAILURE_;
    bie_context_t * ctx = NULL;
    if (bie_context_create(NULL, &ctx) != BIE_STATUS_OK)
        return fprintf(stderr, "bie eval: no context\n"), EXIT_FAILURE_;
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
