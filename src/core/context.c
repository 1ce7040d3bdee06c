// SPDX-License-Identifier: Apache-2.0
// context.c: context lifetime, settings, the host workspace and the one-thread-at-a-time guard.
#include "bie-cuda-plugin.h"

#include <omp.h>
#include <stdio.h>
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
    return b == BIE_BACKEND_AUTO || b == BIE_BACKEND_REF || b == BIE_BACKEND_CPU || b == BIE_BACKEND_CUDA;
}

static enum bie_cpu_isa cap_isa(enum bie_cpu_isa requested) {
    enum bie_cpu_isa isa = bie_cpu_isa_detected();
    if (requested < isa) isa = requested;
    return bie_cpu_isa_cap_from_env(isa);
}

enum bie_status bie_context_create(const struct bie_context_params * params, bie_context_t ** out_ctx) {
    if (!out_ctx) return BIE_STATUS_INVALID_ARGUMENT;
    *out_ctx = NULL;
    struct bie_context_params p;
    bie_context_params_default(&p);
    if (params) p = *params;
    if (!backend_valid(p.backend) || p.num_threads > BIE_MAX_THREADS) return BIE_STATUS_INVALID_ARGUMENT;
    bie_context_t * ctx = calloc(1, sizeof *ctx);
    if (!ctx) return BIE_STATUS_OUT_OF_MEMORY;
    ctx->params = p;
    ctx->isa = cap_isa(p.max_isa);
    ctx->isa_cap = bie_cpu_isa_cap_from_env(p.max_isa);
    ctx->mem_limit = BIE_DEFAULT_MEMORY_LIMIT;
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
    BIE_ENTER(ctx);
    if (!backend_valid(backend))
        return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "backend: unknown value %d", (int)backend);
    ctx->params.backend = backend;
    return BIE_STATUS_OK;
}

enum bie_status bie_context_set_num_threads(bie_context_t * ctx, int32_t num_threads) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    if (num_threads > BIE_MAX_THREADS)
        return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "num_threads: %d is more than BIE_MAX_THREADS (%d)",
                             (int)num_threads, BIE_MAX_THREADS);
    ctx->params.num_threads = num_threads > 0 ? num_threads : 0;
    return BIE_STATUS_OK;
}

int bie_context_threads(const bie_context_t * ctx) {
    const int n = ctx && ctx->params.num_threads > 0 ? ctx->params.num_threads : omp_get_max_threads();
    return n < 1 ? 1 : n > BIE_MAX_THREADS ? BIE_MAX_THREADS : n;
}

enum bie_status bie_context_set_memory_limit(bie_context_t * ctx, size_t bytes) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    ctx->mem_limit = bytes ? bytes : BIE_DEFAULT_MEMORY_LIMIT;
    return BIE_STATUS_OK;
}

size_t bie_context_memory_limit(const bie_context_t * ctx) { return ctx ? ctx->mem_limit : 0; }

static void release_host_workspace(bie_context_t * ctx) {
    free(ctx->host_ws);
    ctx->host_ws = NULL;
    ctx->host_ws_size = 0;
}

enum bie_status bie_context_release_workspace(bie_context_t * ctx) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    release_host_workspace(ctx);
    ctx->ws_reserved = 0;
    return BIE_STATUS_OK;
}

// --- one thread at a time ----------------------------------------------------------------------------

static _Thread_local char tls_token;                    // its address names the thread
static _Thread_local const bie_context_t * tls_refused; // the context whose call was refused here
static _Thread_local char tls_refused_msg[BIE_ERROR_CAP];

bool bie_ctx_enter(bie_context_t * ctx) {
    const uintptr_t me = (uintptr_t)&tls_token;
    uintptr_t user = 0;
    if (!__atomic_compare_exchange_n(&ctx->user, &user, me, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
        if (user != me) return false;
        ctx->depth++; // a nested public call of the same thread
    } else {
        ctx->depth = 1;
    }
    if (tls_refused == ctx) tls_refused = NULL;
    ctx->error[0] = '\0';
    return true;
}

void bie_ctx_leave_guard(struct bie_ctx_guard * g) {
    bie_context_t * ctx = g->ctx;
    if (!ctx || --ctx->depth > 0) return;
    const size_t keep = ctx->ws_reserved > BIE_WORKSPACE_KEEP ? ctx->ws_reserved : BIE_WORKSPACE_KEEP;
    if (ctx->host_ws_size > keep) release_host_workspace(ctx);
    __atomic_store_n(&ctx->user, 0, __ATOMIC_RELEASE);
}

enum bie_status bie_ctx_busy(const bie_context_t * ctx) {
    tls_refused = ctx;
    snprintf(tls_refused_msg, sizeof tls_refused_msg,
             "context: another thread is inside a call on this context; a context is used by one thread at a "
             "time (create one per thread)");
    return BIE_STATUS_INVALID_ARGUMENT;
}

const char * bie_context_last_error(const bie_context_t * ctx) {
    if (!ctx) return "ctx is NULL";
    return tls_refused == ctx ? tls_refused_msg : ctx->error;
}

enum bie_cpu_isa bie_context_cpu_isa(const bie_context_t * ctx) { return ctx ? ctx->isa : BIE_CPU_ISA_SCALAR; }

enum bie_status bie_host_workspace(bie_context_t * ctx, size_t bytes, void ** out) {
    *out = NULL;
    if (bytes == 0) bytes = 64;
    if (bytes > ctx->mem_limit || bytes > SIZE_MAX - 64)
        return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY,
                             "workspace: the call needs %zu bytes, more than the context's memory limit of %zu "
                             "(bie_context_set_memory_limit)",
                             bytes, ctx->mem_limit);
    if (ctx->host_ws_size < bytes) {
        size_t size = (bytes + 63) / 64 * 64;
        void * p = aligned_alloc(64, size);
        if (!p) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "workspace: cannot allocate %zu bytes", size);
        free(ctx->host_ws);
        ctx->host_ws = p;
        ctx->host_ws_size = size;
    }
    *out = ctx->host_ws;
    return BIE_STATUS_OK;
}

enum bie_status bie_context_reserve(bie_context_t * ctx, enum bie_device_type device, size_t bytes) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    if (device == BIE_DEVICE_CPU) {
        void * p;
        BIE_TRY(bie_host_workspace(ctx, bytes, &p));
        if (bytes > ctx->ws_reserved) ctx->ws_reserved = bytes;
        return BIE_STATUS_OK;
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
