// SPDX-License-Identifier: Apache-2.0
// layer-case.h: the differential fuzzer of the layer API (fuzz-layers.c under libFuzzer, and
// cuda/fuzz-layers-cuda.c on a GPU under compute-sanitizer).
//
// Each input decodes to one call of the public API — a linear or conv2d forward or backward,
// bie_binarize_ste, bie_pack, bie_unpack or bie_affine_maxpool2d_forward — with a random quantization, shape (small, or extreme:
// zero, negative, INT64_MAX-sized), layout (dense, gaps, permuted, broadcast inputs), dtype (valid
// or not), NULL arguments, overlapping outputs, and data (special values in forward calls). The
// call runs on every backend: the reference, the CPU backend at each ISA level of the machine and,
// in the CUDA build, the CUDA backend. What must hold:
// - every backend returns the same status (the CUDA backend may also answer UNSUPPORTED);
// - forward, packing and binarize_ste outputs are byte-identical to the reference's, the whole
//   buffer included (bytes outside the view untouched);
// - backward gradients are within the derived tolerance of tests/test-cpu-backward.c, and bytes
//   outside the views are untouched;
// - no crash, leak or undefined behaviour (ASan/UBSan under libFuzzer; compute-sanitizer on GPU).
// A mismatch prints the case and aborts (libFuzzer keeps the input).
#pragma once

#include "bie.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FUZZ_MAX_BACKENDS 7

struct fuzz_backends {
    int n;
    bie_context_t * ctx[FUZZ_MAX_BACKENDS]; // [0] is the reference
    const char * name[FUZZ_MAX_BACKENDS];
    bool cuda[FUZZ_MAX_BACKENDS];
};

// The reference, the CPU backend at every ISA level this machine has, and (with_cuda) the CUDA
// backend. Returns false when a context cannot be created.
bool fuzz_backends_init(struct fuzz_backends * b, bool with_cuda);
void fuzz_backends_free(struct fuzz_backends * b);

// Runs the case that data decodes to on every backend and checks the results (aborts on a finding).
// Returns 1 when the call was valid (all backends returned OK), else 0.
int fuzz_layer_case(const struct fuzz_backends * b, const uint8_t * data, size_t size);
