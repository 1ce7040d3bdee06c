// SPDX-License-Identifier: Apache-2.0
// cuda-backend.cu: the CUDA backend's table, its per-context state and device queries.
// Empty slots mean "no kernel yet" (the op layer reports UNSUPPORTED).
#include <cuda_runtime.h>
#include <stdlib.h>

extern "C" {
#include "bie-impl.h"

struct bie_cuda_state {
    void * workspace;
    size_t workspace_size;
};

int bie_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); // clear the sticky "no driver" error
        return 0;
    }
    return n;
}

void bie_cuda_state_destroy(struct bie_cuda_state * state) {
    if (!state) return;
    if (state->workspace) cudaFree(state->workspace);
    free(state);
}

enum bie_status bie_cuda_reserve(bie_context_t * ctx, size_t bytes) {
    if (bie_cuda_device_count() == 0)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "device: no CUDA device is available");
    if (!ctx->cuda) {
        ctx->cuda = (struct bie_cuda_state *)calloc(1, sizeof *ctx->cuda);
        if (!ctx->cuda) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "cuda: out of host memory");
    }
    if (ctx->cuda->workspace_size >= bytes) return BIE_STATUS_OK;
    void * p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess)
        return bie_set_error(ctx, BIE_STATUS_DEVICE_ERROR, "cuda: cudaMalloc(%zu): %s", bytes, cudaGetErrorString(e));
    if (ctx->cuda->workspace) cudaFree(ctx->cuda->workspace);
    ctx->cuda->workspace = p;
    ctx->cuda->workspace_size = bytes;
    return BIE_STATUS_OK;
}

const struct bie_backend_ops bie_cuda_backend = {
      "cuda", NULL, NULL, NULL, NULL, NULL,
};
}
