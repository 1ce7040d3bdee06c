// SPDX-License-Identifier: Apache-2.0
// info.c: `bie info MODEL`: the file's metadata, its layers, the bytes of each and the total
// against the same model in float32.
#include "cli.h"

#include <string.h>
#include <sys/stat.h>

static void usage(FILE * f) {
    fprintf(f, "usage: bie info MODEL\n\n"
               "Prints a model file's metadata, its layers (shapes, parameters, bytes) and its size against\n"
               "the same model stored as float32.\n\n"
               "Exit codes: 0 success, 1 unreadable or corrupt model, 2 usage error.\n");
}

static void human(double b, char * out, size_t size) {
    if (b >= 1 << 20) snprintf(out, size, "%.2f MiB", b / (1 << 20));
    else if (b >= 1 << 10) snprintf(out, size, "%.1f KiB", b / (1 << 10));
    else snprintf(out, size, "%.0f B", b);
}

int bie_info_main(int argc, char ** argv) {
    const char * path = NULL;
    int n_pos, code;
    if (!cli_parse("bie info", argc, argv, NULL, 0, &path, 1, &n_pos, usage, &code)) return code;
    if (!path) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (!cli_check_model_file("bie info", path)) return EXIT_FAILURE_;
    bie_context_t * ctx = NULL;
    if (bie_context_create(NULL, &ctx) != BIE_STATUS_OK) return EXIT_FAILURE_;
    bie_model_t * m = NULL;
    bie_safetensors_t * st = NULL;
    enum bie_status s = bie_model_load(ctx, path, &m, &st);
    if (s != BIE_STATUS_OK) {
        fprintf(stderr, "bie info: %s\n", bie_context_last_error(ctx));
        bie_context_destroy(ctx);
        return EXIT_FAILURE_;
    }
    printf("%s\n", path);
    for (size_t i = 0; i < bie_safetensors_metadata_count(st); i++) {
        const char *v, *k = bie_safetensors_metadata_at(st, i, &v);
        printf("  %-22s %s\n", k, v);
    }
    printf("\n  %-3s %-16s %-5s %-14s %-14s %10s %12s %12s\n", "#", "layer", "q", "input", "output", "params", "bytes",
           "f32 bytes");
    int64_t total = 0, total_f = 0, params = 0;
    for (int64_t i = 0; i < bie_model_num_layers(m); i++) {
        struct bie_model_layer_info li;
        bie_model_layer_info(m, i, &li);
        char in[32], out[32];
        snprintf(in, sizeof in, "%lldx%lldx%lld", (long long)li.in_shape[0], (long long)li.in_shape[1],
                 (long long)li.in_shape[2]);
        snprintf(out, sizeof out, "%lldx%lldx%lld", (long long)li.out_shape[0], (long long)li.out_shape[1],
                 (long long)li.out_shape[2]);
        printf("  %-3lld %-16s %-5s %-14s %-14s %10lld %12lld %12lld\n", (long long)i, li.kind, li.quant, in, out,
               (long long)li.params, (long long)li.bytes, (long long)li.float_bytes);
        total += li.bytes;
        total_f += li.float_bytes;
        params += li.params;
    }
    struct stat sb;
    const long long file = stat(path, &sb) == 0 ? (long long)sb.st_size : -1;
    char a[32], b[32], c[32];
    human((double)total, a, sizeof a);
    human((double)total_f, b, sizeof b);
    human((double)file, c, sizeof c);
    printf("\n  parameters: %lld; tensors: %lld bytes (%s) in this %s file, %lld bytes (%s) as float32\n",
           (long long)params, (long long)total, a, bie_model_is_packed(m) ? "packed" : "checkpoint", (long long)total_f,
           b);
    printf("  file size: %lld bytes (%s, with the header); float32 / this model: %.1fx\n", file, c,
           (double)total_f / (double)(file > 0 ? file : 1));
    bie_model_destroy(m);
    bie_safetensors_free(st);
    bie_context_destroy(ctx);
    return EXIT_OK_;
}
