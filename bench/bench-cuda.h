// SPDX-License-Identifier: Apache-2.0
// bench-cuda.h: what the CUDA cases of `bie bench` (bench-cuda.c) share with their harness
// (bench-cuda-harness.c): the checks that end the program on a failed call, the options and
// handles, the timing of a run function and the rows it prints.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "bench.h"
#include "bie-cuda.h"
#include "bie.h"

// A failed call ends the program, except while a graph is being captured: then the capture is
// marked failed (the graph timing is skipped and the call timing stands alone).
extern int g_capturing, g_capture_failed;
void fail(const char * what, const char * why);
#define CK(expr)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (expr);                                                                                       \
        if (e_ != cudaSuccess) fail(#expr, cudaGetErrorString(e_));                                                    \
    } while (0)
#define BK(ctx, expr)                                                                                                  \
    do {                                                                                                               \
        enum bie_status s_ = (expr);                                                                                   \
        if (s_ != BIE_STATUS_OK) fail(#expr, bie_context_last_error(ctx));                                             \
    } while (0)
#define CB(expr)                                                                                                       \
    do {                                                                                                               \
        cublasStatus_t s_ = (expr);                                                                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS) fail(#expr, cublasGetStatusString(s_));                                       \
    } while (0)

extern int g_quick, g_json, g_call_only; // --quick, --json, --call-only
extern const char *g_case, *g_shape;     // --case, --shape (NULL: all)
extern cudaStream_t g_stream;
extern cublasHandle_t g_blas;
extern int g_rows; // rows printed (an empty --case/--shape selection exits 2)

// One timed call of a case on input set rot (of those its state holds), queued on g_stream.
typedef void (*run_fn)(void * state, int rot);

// A measurement: device time per call (graph replays; < 0 when the calls could not be captured)
// and the time of one isolated call, both medians in milliseconds.
struct timing {
    double ms, call_ms;
};

// Both timings of one call of fn, rotating over `rots` input sets.
struct timing time_ms(run_fn fn, void * state, int rots);
// A side's time per call: the lower of its two medians (a side without a graph time: its call time).
double best_ms(struct timing t);

// Device buffers of random bytes, and of random f16 values of either sign with magnitudes in
// [2^-8, 1); a CUDA tensor view of device data.
void * dev_alloc_random(size_t bytes);
void * dev_half_random(size_t n);
struct bie_tensor dev_tensor(void * data, enum bie_dtype dt, int nd, const int64_t * shape);
// The bytes of a dense tensor of that dtype and shape.
size_t dense_bytes(enum bie_dtype dt, int nd, const int64_t * shape);
// Input sets to rotate over so that together they exceed the L2 cache (at most MAX_ROTATIONS).
#define MAX_ROTATIONS 96
int rotations(size_t bytes_per_set);

// One row: each side's best time per call and their ratio, the device times and the isolated-call
// times (ops: the operations of one call, for the throughput column).
void print_row(const char * name, const char * shape, struct timing bie, const char * base_name, struct timing base,
               double ops);
// What every --json row also names (the device, versions and date, as `"key": value` pairs).
const char * json_run_info(void);
// Whether a row of group runs under --case and --shape.
int want_row(const char * group, const char * name, const char * shape);
