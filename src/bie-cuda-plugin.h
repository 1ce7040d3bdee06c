// SPDX-License-Identifier: Apache-2.0
// bie-cuda-plugin.h: the one table through which libbie reaches its CUDA backend.
//
// libbie links no CUDA library. The CUDA backend (src/cuda, cudart, cuBLAS, cuBLASLt, cuDNN) is a
// plugin, libbie-cuda.so, that libbie opens at run time (src/core/cuda-plugin.c) the first time a
// CUDA tensor or a CUDA query arrives, and that exports one symbol, BIE_CUDA_PLUGIN_ENTRY, which
// returns this table. Every call from libbie into the backend goes through it. Programs that link
// the backend's objects themselves (tests/cuda, the CUDA benchmark) get the same table without
// any loading: the entry symbol is then part of the program, and libbie takes it from there.
//
// The plugin is built from the same tree as libbie and shares its internal structs (struct
// bie_context, struct bie_layer_call, ...), so libbie accepts a table only when its ABI number and
// the sizes it was built with match its own.
//
// Adding an entry point: one line in struct bie_cuda_plugin below (before `end`: anywhere is
// fine, the size check catches a plugin built from another tree) and one line in the plugin's
// table in src/cuda/cuda-backend.cu; libbie's callers reach it as bie_cuda_plugin_get(ctx, &p)
// then p->name(...). Bump BIE_CUDA_PLUGIN_ABI when the meaning of an entry or of a shared struct
// changes without changing its size.
#pragma once

#include "bie-impl.h"

#include <stddef.h>
#include <stdint.h>

#define BIE_CUDA_PLUGIN_ABI 1
#define BIE_CUDA_PLUGIN_ENTRY bie_cuda_plugin_entry
#define BIE_CUDA_PLUGIN_ENTRY_NAME "bie_cuda_plugin_entry"
// The plugin's file name; libbie looks for it next to itself, then through the loader's path.
// The environment variable BIE_CUDA_PLUGIN names another file instead (and only that file).
#define BIE_CUDA_PLUGIN_FILE "libbie-cuda.so"
#define BIE_CUDA_PLUGIN_ENV "BIE_CUDA_PLUGIN"

struct bie_cuda_plugin {
    // Checked by libbie before any other field is read; these five fields keep their place in
    // every ABI so that a mismatch can be described.
    uint32_t abi;          // BIE_CUDA_PLUGIN_ABI of the plugin's build
    uint32_t size;         // sizeof(struct bie_cuda_plugin) in the plugin's build
    uint32_t context_size; // sizeof(struct bie_context) in the plugin's build
    uint32_t call_size;    // sizeof(struct bie_layer_call) in the plugin's build
    const char * version;  // BIE_VERSION_STRING of the plugin's build (for messages)

    // The layer, packing, reduction and STE slots (src/ops dispatches CUDA tensors here).
    struct bie_backend_ops backend;

    // Number of usable CUDA devices (0 when there is no driver or no GPU: then why[0..cap) says
    // what CUDA answered). Never fails otherwise.
    int (*device_count)(char * why, size_t cap);
    // Frees a context's CUDA state (its workspace, library handles). NULL is accepted.
    void (*state_destroy)(struct bie_cuda_state * state);
    // bie_context_reserve for BIE_DEVICE_CUDA.
    enum bie_status (*reserve)(bie_context_t * ctx, size_t bytes);
    // The functions of include/bie-cuda.h (libbie checks ctx first).
    enum bie_status (*set_stream)(bie_context_t * ctx, void * stream);
    void * (*stream)(const bie_context_t * ctx);
    enum bie_status (*synchronize)(bie_context_t * ctx);
};

// The entry point the plugin exports (extern "C", default visibility).
typedef const struct bie_cuda_plugin * (*bie_cuda_plugin_entry_fn)(void);

// The CUDA backend's table, loading the plugin on first use (thread-safe; the plugin stays loaded
// for the life of the process). When it is absent, sets ctx's message to why (the plugin is
// missing, a CUDA library it needs is missing, or it is from another build) and returns
// BIE_STATUS_UNSUPPORTED. `what` names the argument that asked for CUDA ("x", "src", "device").
enum bie_status bie_cuda_plugin_get(bie_context_t * ctx, const char * what,
                                    const struct bie_cuda_plugin ** out);
// 1 when the plugin is present and sees at least one CUDA device (counted once per process).
int bie_cuda_available(void);
// The table if the plugin is loaded, else NULL; never loads it (for teardown and queries of state
// that can only exist once the plugin was used).
const struct bie_cuda_plugin * bie_cuda_plugin_loaded(void);
