// SPDX-License-Identifier: Apache-2.0
// fuzz-layers-cuda.c: the layer fuzzer's CUDA mode, a plain program (no libFuzzer, no ASan: run it
// under compute-sanitizer). It draws --runs random inputs from --seed, decodes each as
// fuzz-layers.c does, and runs the call on the reference, the CPU backend and the CUDA backend
// (tensors copied to the device; scales on the host or the device), checking every result
// against the reference (fuzz/lib/layer-case.h). A corpus directory may be given too: its files
// are run first. Exit status 0 when nothing was found; a finding prints the case and aborts.
//
//   compute-sanitizer --tool memcheck build/fuzz-layers-cuda --runs 20000 --seed 1
//   (scripts/gpu-check.sh runs it with each of memcheck, racecheck, initcheck and synccheck)
#include "../lib/layer-case.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix(uint64_t * s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static long run_corpus(const struct fuzz_backends * b, const char * dir) {
    DIR * d = opendir(dir);
    long n = 0;
    if (!d) return 0;
    for (struct dirent * e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE * f = fopen(path, "rb");
        if (!f) continue;
        static uint8_t buf[1 << 16];
        const size_t len = fread(buf, 1, sizeof buf, f);
        fclose(f);
        fuzz_layer_case(b, buf, len);
        n++;
    }
    closedir(d);
    return n;
}

int main(int argc, char ** argv) {
    long runs = 2000;
    uint64_t seed = 1;
    const char * corpus = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--corpus") && i + 1 < argc) corpus = argv[++i];
        else {
            fprintf(stderr, "usage: fuzz-layers-cuda [--runs N] [--seed S] [--corpus DIR]\n");
            return 2;
        }
    }
    if (!bie_backend_available(BIE_BACKEND_CUDA)) {
        fprintf(stderr, "fuzz-layers-cuda: no usable GPU (or a build without CUDA)\n");
        return 2;
    }
    struct fuzz_backends b;
    if (!fuzz_backends_init(&b, true)) {
        fprintf(stderr, "fuzz-layers-cuda: cannot create the contexts\n");
        return 1;
    }
    long valid = 0, done = corpus ? run_corpus(&b, corpus) : 0;
    uint64_t st = seed;
    for (long r = 0; r < runs; r++) {
        uint8_t in[256];
        const size_t len = (size_t)(splitmix(&st) % sizeof in) + 1;
        for (size_t i = 0; i < len; i += 8) {
            const uint64_t v = splitmix(&st);
            memcpy(in + i, &v, len - i < 8 ? len - i : 8);
        }
        valid += fuzz_layer_case(&b, in, len);
        done++;
    }
    printf("fuzz-layers-cuda: %ld cases (%ld valid calls), seed %llu: no finding\n", done, valid,
           (unsigned long long)seed);
    fuzz_backends_free(&b);
    return 0;
}
