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
// with the keys case, backend, threads, bie_ms, baseline, baseline_ms, speedup, gops, and the run's
// device (the CPU's model name), cpus, isa, blas (OpenBLAS's build), bie_version and date (UTC).
//
// CUDA: `--backend cuda` runs the program bie_bench_cuda (bench/bench-cuda.c and bench-llm-cuda.c,
// built only with the CUDA backend, and linked to cuBLAS and cuDNN for their baselines) from the bie
// program's directory with the same options; without it, the bie program says that the CUDA cases
// are not available.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

struct bench_options {
    const char * shapes; // shape file
    const char * filter; // --case substring, or NULL
    int threads;         // > 0: only this count; else 1 and all
    int repeat;          // timed runs per measurement (median)
    bool json;
    bool quick;
    const char * backend; // "cpu", "ref" or "cuda"
};

// One measured row.
struct bench_result {
    const char * name; // case name
    const char * backend;
    int threads;
    double bie_ms;
    const char * baseline; // e.g. "openblas-sgemm"
    double baseline_ms;
    double ops; // operations of the case (2*M*N*K for a GEMM)
};

// Prints a row as a table line or (json) as one JSON object per line.
void bench_print(const struct bench_options * opt, const struct bench_result * r);
// The fields every CPU row's JSON also holds ("device": ..., no braces; bench.c says which).
const char * bench_cpu_run_info(void);

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

// The CUDA cases (bench/bench-cuda.c); argv as for bie_bench_main. Weak: they are linked into the
// program bie_bench_cuda only (with cuBLAS and cuDNN for their baselines), not into bie.
int bie_bench_cuda_main(int argc, char ** argv) __attribute__((weak));
// Runs the program bie_bench_cuda found beside this one with argv's options (each --opt=value split
// in two, as that program reads them): how the bie program, which links no CUDA library, runs the
// CUDA cases and the GPU rows of --llm. Returns only on failure (2 when the program is missing).
int bench_run_cuda_program(int argc, char ** argv);
// The CUDA "plan-host" rows (bench/bench-cuda-host.c): the host time per planned call against the
// entry point's. ctx is a context with CUDA state; info: what every --json row also names (the
// device, versions and date, as `"key": value` pairs).
struct bie_context;
void bench_cuda_host_rows(struct bie_context * ctx, int json, const char * info);

// For the --json rows of both benchmarks: src copied into dst as the inside of a JSON string
// (outer blanks trimmed; quotes, backslashes and control characters left out), and today's UTC
// date as YYYY-MM-DD ("unknown" if the clock cannot say).
static inline void bench_json_text(char * dst, size_t cap, const char * src) {
    while (*src == ' ' || *src == '\t') src++;
    size_t n = 0;
    for (; *src && n + 1 < cap; src++)
        if ((unsigned char)*src >= 0x20 && *src != '"' && *src != '\\') dst[n++] = *src;
    while (n > 0 && dst[n - 1] == ' ') n--;
    dst[n] = 0;
}
static inline void bench_utc_date(char * dst, size_t cap) {
    const time_t now = time(NULL);
    struct tm tm;
    if (!gmtime_r(&now, &tm) || !strftime(dst, cap, "%Y-%m-%d", &tm)) snprintf(dst, cap, "unknown");
}

// `bie bench --llm` (bench/bench-llm.c): the weight-only n-bit layer at LLM layer shapes; its GPU
// rows (--backend cuda) are in bench/bench-llm-cuda.c, part of the program bie_bench_cuda.
int bench_llm_main(const struct bench_options * o, int argc, char ** argv);
int bench_llm_cuda_main(const struct bench_options * o, int argc, char ** argv) __attribute__((weak));
