// SPDX-License-Identifier: Apache-2.0
// bie-main.c: the `bie` command-line program: subcommands train, eval, info and bench.
#include "../bench/bench.h"
#include "bie.h"
#include "cli.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE * f) {
    fprintf(f, "usage: bie <command> [options]\n\n"
               "commands:\n"
               "  train    train a low-bit network on an IDX data set and export the packed model\n"
               "  eval     evaluate a model file (accuracy, images/s)\n"
               "  info     print a model file's layers and sizes\n"
               "  bench    benchmark bie's layers against float baselines\n"
               "  version  print the library version\n\n"
               "Run `bie <command> --help` for a command's options.\n"
               "Exit codes: 0 success, 1 run-time error (I/O, corrupt file, library error), 2 usage error.\n"
               "OpenMP runs with OMP_WAIT_POLICY=PASSIVE unless the variable is set (its spinning threads\n"
               "would take the cores from OpenBLAS's).\n");
}

// OpenBLAS (pthreads) and OpenMP each keep a thread per core; OpenMP's default of spinning
// while it waits then takes the cores from OpenBLAS's GEMMs, which slows training down where
// cores are few. libgomp reads OMP_WAIT_POLICY when it loads, before main, so
// when the variable is unset the program sets it to PASSIVE and runs itself again; an explicit
// setting is kept.
static void passive_openmp(char ** argv) {
    const char * set = getenv("OMP_WAIT_POLICY");
    if (set && *set) return;
    if (setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0) return;
    execv("/proc/self/exe", argv); // returns only on failure: then run as we are
}

int main(int argc, char ** argv) {
    // A file size limit (ulimit -f) reached while saving: the write fails with EFBIG and the
    // library reports it, instead of SIGXFSZ ending the program without a word.
    signal(SIGXFSZ, SIG_IGN);
    passive_openmp(argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char * cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("bie %s\n", bie_version_string());
        return 0;
    }
    if (!strcmp(cmd, "bench")) return bie_bench_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "train")) return bie_train_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return bie_eval_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "info")) return bie_info_main(argc - 1, argv + 1);
    fprintf(stderr, "bie: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
