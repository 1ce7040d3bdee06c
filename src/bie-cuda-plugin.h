// SPDX-License-Identifier: Apache-2.0
// bie-cuda-plugin.h: the one table through which libbie reaches its CUDA backend.
//
// libbie links no CUDA library. The CUDA backend (src/cuda, cudart, cuBLAS, cuBLASLt, cuDNN) is a
// plugin, libbie-cuda.so, that libbie opens at run time (src/core/cuda-plugin.c) the first time a
// CUDA tensor or a CUDA query arrives, and that exports one symbol, BIE_CUDA_PLUGIN_ENTRY, which
// returns this table. Every call from libbie into the backend goes through it. Programs that link
// the backend's objects themselves (tests/cuda, the CUDA benchmark) get the same table without
// any loading, from BIE_CUDA_LINKED_ENTRY, which libbie references weakly. (Two names: the plugin
// also holds the pieces of libbie.a that its code calls, that weak and hidden reference among
// them, and a hidden reference to the exported name would hide it.)
//
// The plugin is built from the same tree as libbie and shares its internal structs (struct
// bie_context, struct bie_layer_call, ...), so libbie accepts a table only when its ABI number, its
// size and the layout fingerprint of those structs match its own.
//
// Adding an entry point: one line in struct bie_cuda_plugin below (anywhere after the four checked
// fields: the size check catches a plugin built from another tree) and one line in the plugin's
// table in src/cuda/cuda-backend.cu; libbie's callers reach it as bie_cuda_plugin_get(ctx, what,
// &p) then p->name(...). A new slot of struct bie_backend_ops needs only its line in the plugin's
// table. Bump BIE_CUDA_PLUGIN_ABI when the meaning of an entry or of a shared struct changes
// without changing its size.
#pragma once

#include "bie-impl.h"
#include "wq-impl.h"

#include <stddef.h>
#include <stdint.h>

#define BIE_CUDA_PLUGIN_ABI 3
#define BIE_CUDA_PLUGIN_ENTRY bie_cuda_plugin_entry
#define BIE_CUDA_PLUGIN_ENTRY_NAME "bie_cuda_plugin_entry"
#define BIE_CUDA_LINKED_ENTRY bie_cuda_linked_entry
// The plugin's file name; libbie looks for it next to itself, then through the loader's path.
// The environment variable BIE_CUDA_PLUGIN names another file instead (and only that file).
#define BIE_CUDA_PLUGIN_FILE "libbie-cuda.so"
#define BIE_CUDA_PLUGIN_ENV "BIE_CUDA_PLUGIN"

// The sizes of the structs that libbie and the plugin pass each other, folded into one constant
// (each size times its own odd multiplier, modulo 2^64): the same on both sides only when both were
// built from the same definitions. A struct that starts to cross the boundary is one more term.
#define BIE_CUDA_PLUGIN_TERM(type, i) ((uint64_t)sizeof(type) * (0x9E3779B97F4A7C15ull * (2 * (i) + 1)))
#define BIE_CUDA_PLUGIN_LAYOUT                                                                                         \
    (BIE_CUDA_PLUGIN_TERM(struct bie_context, 0) + BIE_CUDA_PLUGIN_TERM(struct bie_layer_call, 1) +                    \
     BIE_CUDA_PLUGIN_TERM(struct bie_backend_ops, 2) + BIE_CUDA_PLUGIN_TERM(struct bie_matmul_call, 3) +               \
     BIE_CUDA_PLUGIN_TERM(struct bie_embedding_call, 4) + BIE_CUDA_PLUGIN_TERM(struct bie_wq_call, 5) +                \
     BIE_CUDA_PLUGIN_TERM(struct bie_pool_call, 6) + BIE_CUDA_PLUGIN_TERM(struct bie_ste_out, 7) +                     \
     BIE_CUDA_PLUGIN_TERM(struct bie_bn_call, 8))

struct bie_cuda_graph; // (include/bie-cuda.h's bie_cuda_graph_t; defined in src/cuda/cuda-backend.cu)

struct bie_cuda_plugin {
    // Checked by libbie before any other field is read; these four fields keep their place in
    // every ABI so that a mismatch can be described.
    uint32_t abi;         // BIE_CUDA_PLUGIN_ABI of the plugin's build
    uint32_t size;        // sizeof(struct bie_cuda_plugin) in the plugin's build
    uint64_t layout;      // BIE_CUDA_PLUGIN_LAYOUT in the plugin's build
    const char * version; // BIE_VERSION_STRING of the plugin's build (for messages)

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
    enum bie_status (*record_begin)(bie_context_t * ctx);
    enum bie_status (*record_end)(bie_context_t * ctx, struct bie_cuda_graph ** out);
    enum bie_status (*replay)(bie_context_t * ctx, const struct bie_cuda_graph * graph);
    void (*graph_destroy)(struct bie_cuda_graph * graph);
    // The weight-only n-bit layer (src/ops/wq.c; every case of a valid call, no fallback).
    enum bie_status (*wq_forward)(bie_context_t * ctx, const struct bie_wq_call * c);
    enum bie_status (*wq_backward)(bie_context_t * ctx, const struct bie_wq_call * c);
    enum bie_status (*wq_dequantize)(bie_context_t * ctx, const struct bie_wq_call * c, const struct bie_tensor * w);
    // bie_batchnorm_forward / _backward on CUDA tensors (src/nn/nn-entry.c; every valid call).
    enum bie_status (*batchnorm_forward)(bie_context_t * ctx, const struct bie_bn_call * c);
    enum bie_status (*batchnorm_backward)(bie_context_t * ctx, const struct bie_bn_call * c);
};

// The entry points of the backend: the one the plugin exports (extern "C", default visibility) and
// the one a program that links the backend's objects resolves.
typedef const struct bie_cuda_plugin * (*bie_cuda_plugin_entry_fn)(void);

// The CUDA backend's table, loading the plugin on first use (thread-safe; the plugin stays loaded
// for the life of the process). When it is absent, sets ctx's message to why (the plugin is
// missing, a CUDA library it needs is missing, or it is from another build) and returns
// BIE_STATUS_UNSUPPORTED. `what` names the argument that asked for CUDA ("x", "src", "device").
enum bie_status bie_cuda_plugin_get(bie_context_t * ctx, const char * what, const struct bie_cuda_plugin ** out);
// 1 when the plugin is present and sees at least one CUDA device (counted once per process).
int bie_cuda_available(void);
// The table if the plugin is loaded, else NULL; never loads it (for teardown and queries of state
// that can only exist once the plugin was used).
const struct bie_cuda_plugin * bie_cuda_plugin_loaded(void);
