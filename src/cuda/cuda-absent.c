// SPDX-License-Identifier: Apache-2.0
// cuda-absent.c: the entry points of bie-cuda.h in a build without the CUDA backend, so that every
// build exports the same symbols; each reports that CUDA is not available.
#include "bie-cuda.h"
#include "bie-impl.h"

enum bie_status bie_context_set_cuda_stream(bie_context_t * ctx, void * stream) {
    (void)stream;
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "ctx: this build has no CUDA backend");
}

void * bie_context_cuda_stream(const bie_context_t * ctx) {
    (void)ctx;
    return NULL;
}

enum bie_status bie_context_cuda_synchronize(bie_context_t * ctx) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "ctx: this build has no CUDA backend");
}
