// SPDX-License-Identifier: Apache-2.0
// cli.h: what the subcommands of the `bie` program share: exit codes, option parsing helpers,
// the data set, the presets and the progress display.
#pragma once

#include "bie.h"
#include "bie-train.h"

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

// --- options ------------------------------------------------------------------------------------
// Each subcommand describes its options in a table and parses argv with getopt_long: --name VALUE
// and --name=VALUE both work, -h and --help print the usage, values are checked against the ranges
// and words listed here (and the messages state those limits).
enum cli_kind {
    CLI_FLAG,   // bool *
    CLI_INT,    // int64_t *, in [lo, hi]
    CLI_FLOAT,  // double *, in [lo, hi]
    CLI_STRING, // const char **
    CLI_WORD,   // const char **, one of `words` (the stored pointer is the matching entry of words)
};
struct cli_option {
    const char * name; // without the leading "--"
    enum cli_kind kind;
    void * value;
    double lo, hi;
    const char * const * words; // CLI_WORD: NULL-terminated
    bool given;                 // set by cli_parse when the option was on the command line
};
// Parses argv[1..]: options into the table, the other arguments into positional[0..max_positional)
// (*n_positional of them). Returns false when the program must exit with *exit_code: 0 after
// --help (usage printed to stdout), 2 after a usage error (a message and the usage on stderr).
bool cli_parse(const char * prog, int argc, char ** argv, struct cli_option * opts, size_t n_opts,
               const char ** positional, int max_positional, int * n_positional, void (*usage)(FILE *),
               int * exit_code);
// Parses `text` as the value of option o (prints "prog: --name: ..." to stderr when it is bad).
bool cli_set(const char * prog, struct cli_option * o, const char * text);
// Writes o's current value as text (the canonical form cli_set reads back; empty for a string
// that is not set and an integer below its range, which mean "the default").
void cli_format(const struct cli_option * o, char * out, size_t size);
// The option of the table named `name` (NULL if none).
struct cli_option * cli_find(struct cli_option * opts, size_t n_opts, const char * name);
// A file the program is about to write: its directory must exist and be writable, and the path
// must not be a directory. Prints "prog: what PATH: why" and returns false otherwise.
bool cli_check_output(const char * prog, const char * what, const char * path);
// A model file the program is about to read: false (after a message) when its first bytes are not
// those of a safetensors file (an 8-byte header length, then '{'), naming what it looks like
// instead (a PyTorch zip archive or pickle, gzip, HDF5, ...). Unreadable files pass: the
// library's loader reports them.
bool cli_check_model_file(const char * prog, const char * path);
// Writes s as a JSON string (quoted, escaped).
void cli_json_string(FILE * f, const char * s);
// JSON lines: jl_begin opens an object with "event", the others add members, jl_end closes it,
// ends the line and flushes. Each does nothing when f is NULL. Non-finite numbers become null.
void jl_begin(FILE * f, const char * event);
void jl_int(FILE * f, const char * key, int64_t v);
void jl_num(FILE * f, const char * key, double v);
void jl_str(FILE * f, const char * key, const char * v);
void jl_end(FILE * f);

// Images per forward call of `bie eval` and of the test passes of `bie train` (the fastest of the
// batch sizes measured on the bcnn preset, with the least memory among those within a few percent
// of it: docs/training.md).
#define CLI_EVAL_BATCH 32

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
