// SPDX-License-Identifier: Apache-2.0
// context.c: context lifetime, settings and the host workspace.
#include "bie-cuda-plugin.h"

#include <stdlib.h>
#include <string.h>

void bie_context_params_default(struct bie_context_params * params) {
    if (!params) return;
    memset(params, 0, sizeof *params);
    params->backend = BIE_BACKEND_AUTO;
    params->num_threads = 0;
    params->max_isa = BIE_CPU_ISA_BEST;
}

static bool backend_valid(enum bie_backend b) {
    return b == BIE_BACKEND_AUTO || b == BIE_BACKEND_REF || b == BIE_BACKEND_CPU ||
           b == BIE_BACKEND_CUDA;
}

static enum bie_cpu_isa cap_isa(enum bie_cpu_isa requested) {
    enum bie_cpu_isa isa = bie_cpu_isa_detected();
    if (requested < isa) isa = requested;
    return bie_cpu_isa_cap_from_env(isa);
}

enum bie_status bie_context_create(const struct bie_context_params * params,
                                   bie_context_t ** out_ctx) {
    if (!out_ctx) return BIE_STATUS_INVALID_ARGUMENT;
    *out_ctx = NULL;
    struct bie_context_params p;
    bie_context_params_default(&p);
    if (params) p = *params;
    if (!backend_valid(p.backend)) return BIE_STATUS_INVALID_ARGUMENT;
    bie_context_t * ctx = calloc(1, sizeof *ctx);
    if (!ctx) return BIE_STATUS_OUT_OF_MEMORY;
    ctx->params = p;
    ctx->isa = cap_isa(p.max_isa);
    *out_ctx = ctx;
    return BIE_STATUS_OK;
}

void bie_context_destroy(bie_context_t * ctx) {
    if (!ctx) return;
    if (ctx->cuda) bie_cuda_plugin_loaded()->state_destroy(ctx->cuda); // (state implies the plugin)
    free(ctx->host_ws);
    free(ctx);
}

enum bie_status bie_context_set_backend(bie_context_t * ctx, enum bie_backend backend) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    bie_clear_error(ctx);
    if (!backend_valid(backend))
        return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "backend: unknown value %d",
                             (int)backend);
    ctx->params.backend = backend;
    return BIE_STATUS_OK;
}

enum bie_status bie_context_set_num_threads(bie_context_t * ctx, int32_t num_threads) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    bie_clear_error(ctx);
    ctx->params.num_threads = num_threads > 0 ? num_threads : 0;
    return BIE_STATUS_OK;
}

enum bie_cpu_isa bie_context_cpu_isa(const bie_context_t * ctx) {
    return ctx ? ctx->isa : BIE_CPU_ISA_SCALAR;
}

enum bie_status bie_host_workspace(bie_context_t * ctx, size_t bytes, void ** out) {
    *out = NULL;
    if (bytes == 0) bytes = 64;
    if (ctx->host_ws_size < bytes) {
        size_t size = (bytes + 63) / 64 * 64;
        void * p = aligned_alloc(64, size);
        if (!p)
            return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY,
                                 "workspace: cannot allocate %zu bytes", size);
        free(ctx->host_ws);
        ctx->host_ws = p;
        ctx->host_ws_size = size;
    }
    *out = ctx->host_ws;
    return BIE_STATUS_OK;
}

enum bie_status bie_context_reserve(bie_context_t * ctx, enum bie_device_type device, size_t bytes) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    bie_clear_error(ctx);
    if (device == BIE_DEVICE_CPU) {
        void * p;
        return bie_host_workspace(ctx, bytes, &p);
    }
    if (device == BIE_DEVICE_CUDA) {
        const struct bie_cuda_plugin * cuda;
        BIE_TRY(bie_cuda_plugin_get(ctx, "device", &cuda));
        return cuda->reserve(ctx, bytes);
    }
    return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "device: unknown value %d", (int)device);
}

int bie_backend_available(enum bie_backend backend) {
    switch (backend) {
    case BIE_BACKEND_AUTO:
    case BIE_BACKEND_REF:
    case BIE_BACKEND_CPU: return 1;
    case BIE_BACKEND_CUDA: return bie_cuda_available();
    }
    return 0;
}
