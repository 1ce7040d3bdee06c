// SPDX-License-Identifier: Apache-2.0
// bench.h: the `bie bench` subcommand: times bie's layers against the baseline a user would
// otherwise pick, measured in the same run (bench.c: the CPU cases).
//
//   bie bench [--shapes FILE] [--case SUBSTRING] [--threads N] [--repeat N] [--json] [--quick]
//             [--backend cpu|ref|cuda]
//
// Cases come from a shape file (bench/shapes/cpu.txt, or bench/shapes/quick.txt with --quick):
// one case per line, `kind key=value ...` (kinds linear, gemm, conv, train; see the files).
// Each case prints bie's median time, the baseline's median time, their ratio and bie's GOPS,
// with 1 thread and with all threads (or the --threads count); --json prints one object per line
// with the keys case, backend, threads, bie_ms, baseline, baseline_ms, speedup, gops.
//
// CUDA: `--backend cuda` hands the whole command line to bie_bench_cuda_main (bench/bench-cuda.c,
// compiled only with the CUDA backend), which runs its own GPU cases and may print its rows with
// bench_print() below so that both share one format. The symbol is declared weak: a build
// without that file reports that CUDA cases are not available.
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct bench_options {
    const char * shapes;  // shape file
    const char * filter;  // --case substring, or NULL
    int threads;          // > 0: only this count; else 1 and all
    int repeat;           // timed runs per measurement (median)
    bool json;
    bool quick;
    const char * backend; // "cpu", "ref" or "cuda"
};

// One measured row.
struct bench_result {
    const char * name;     // case name
    const char * backend;
    int threads;
    double bie_ms;
    const char * baseline; // e.g. "openblas-sgemm"
    double baseline_ms;
    double ops;            // operations of the case (2*M*N*K for a GEMM)
};

// Prints a row as a table line or (json) as one JSON object per line.
void bench_print(const struct bench_options * opt, const struct bench_result * r);

// A context for the options' backend (cpu or ref) with `threads` threads; NULL on failure.
struct bie_context;
struct bie_context * bench_context(const struct bench_options * opt, int threads);

// Milliseconds of a monotonic clock; the median of t[0 .. n-1] (sorts t).
double bench_now_ms(void);
double bench_median(double * t, int n);

// The `gemv` cases (bench/bench-gemv.c): a linear layer with M <= 8 rows against a read of the same
// bytes, its weight in the caches and streamed from DRAM; prints two rows.
int bench_gemv_case(const struct bench_options * opt, const char * name, int quant, int64_t M, int64_t K, int64_t N,
                    int threads);

// Runs `bie bench [options]`; argv[0] is "bench". Returns the process exit code.
int bie_bench_main(int argc, char ** argv);

// The CUDA cases (bench/bench-cuda.c, only in CUDA builds); argv as for bie_bench_main.
int bie_bench_cuda_main(int argc, char ** argv) __attribute__((weak));
