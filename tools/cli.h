// SPDX-License-Identifier: Apache-2.0
// cli.h: what the subcommands of the `bie` program share: exit codes, option parsing helpers,
// the data set, the presets and the progress display.
#pragma once

#include "bie.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

// Exit codes of every subcommand.
enum {
    EXIT_OK_ = 0,
    EXIT_FAILURE_ = 1, // a run-time error: I/O, a corrupt file, a library error
    EXIT_USAGE = 2,    // bad command line
};

#define DEFAULT_DATA_DIR "/usr/share/datasets/fashion-mnist"

int bie_train_main(int argc, char ** argv);
int bie_eval_main(int argc, char ** argv);
int bie_info_main(int argc, char ** argv);

// Option parsing: each returns false (after printing to stderr) when the value is missing/bad.
bool cli_int(const char * opt, const char * val, int64_t lo, int64_t hi, int64_t * out);
bool cli_float(const char * opt, const char * val, double lo, double hi, double * out);

// A split of an IDX data set: n images of h x w bytes and their labels.
struct dataset {
    struct bie_idx images, labels;
    int64_t n, h, w;
};
// Loads DIR/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]; validates ranks, sizes and labels.
bool data_load(bie_context_t * ctx, const char * dir, bool train, struct dataset * out);
void data_free(struct dataset * d);
// Writes images order[0..n) as floats in [0, 1] ([n, 1, h, w]) and their labels.
void data_batch(const struct dataset * d, const int64_t * order, int64_t n, float * x, uint8_t * y);

// Accuracy over the first `limit` images (limit <= 0: all), batch by batch; images/s out.
bool evaluate(bie_context_t * ctx, bie_model_t * m, const struct dataset * d, int64_t limit, int64_t batch,
              int float_layers, double * accuracy, double * images_per_s);

// Sets the thread count of OpenMP, OpenBLAS and the context (n <= 0: leave the defaults).
void set_threads(bie_context_t * ctx, int64_t n);
double now_seconds(void);
// Prints the library's message for a failed call and returns EXIT_FAILURE_.
int fail_status(bie_context_t * ctx, const char * what, enum bie_status s);
// OpenMP's thread count for the next parallel region.
int bie_omp_threads(void);
