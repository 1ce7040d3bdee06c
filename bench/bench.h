// SPDX-License-Identifier: Apache-2.0
// bench.h: the `bie bench` subcommand (benchmarks against the baseline a user would otherwise pick).
#pragma once

// Runs `bie bench [options]`; argv[0] is "bench". Returns the process exit code.
int bie_bench_main(int argc, char ** argv);
