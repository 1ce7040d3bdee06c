// SPDX-License-Identifier: Apache-2.0
// bench.c: `bie bench` (being written: the CPU performance work fills it in).
#include "bench.h"

#include <stdio.h>

int bie_bench_main(int argc, char ** argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "bie bench: not available in this build yet\n");
    return 2;
}
