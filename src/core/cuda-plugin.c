// SPDX-License-Identifier: Apache-2.0
// cuda-plugin.c: finds and opens the CUDA backend (src/bie-cuda-plugin.h says why it is a plugin),
// says why it is absent, and implements include/bie-cuda.h and the CUDA side of the context's
// functions by forwarding through the plugin's table.
//
// Where the table comes from, first match wins:
//   1. the program itself, when it links the backend's objects (tests/cuda, the CUDA benchmark);
//   2. the file named by BIE_CUDA_PLUGIN, when that variable is set and not empty (only that file);
//   3. libbie-cuda.so in the directory of the object holding this code (libbie.so, or the program
//      that links libbie statically), found with dladdr;
//   4. libbie-cuda.so through the dynamic loader's search (LD_LIBRARY_PATH, the run path, the
//      system's library directories).
// A plugin that exists but cannot be opened (a CUDA library it needs is missing) stops the search,
// and dlerror's message, which names that library, becomes the reason.
#define _GNU_SOURCE // dladdr
#include "bie-cuda-plugin.h"

#include "bie-cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// The backend linked into the program. A hidden weak reference: it resolves to NULL when libbie.so
// is linked (libbie never contains the backend) and leaves no dynamic symbol behind.
extern const struct bie_cuda_plugin * BIE_CUDA_LINKED_ENTRY(void) __attribute__((weak, visibility("hidden")));

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static const struct bie_cuda_plugin * plugin;
static char why_absent[1024]; // set once by load() when plugin stays NULL

static pthread_once_t devices_once = PTHREAD_ONCE_INIT;
static int device_total;
static char why_no_device[512];

// Accepts a table from `where` if it was built from the same sources as this libbie.
static bool accept(const struct bie_cuda_plugin * p, const char * where) {
    if (!p) {
        snprintf(why_absent, sizeof why_absent, "%s returned no table", where);
        return false;
    }
    if (p->abi != BIE_CUDA_PLUGIN_ABI || p->size != sizeof(struct bie_cuda_plugin) ||
        p->layout != BIE_CUDA_PLUGIN_LAYOUT) {
        snprintf(why_absent, sizeof why_absent,
                 "%s is from another build of bie (plugin ABI %u, table %u bytes, layout %016llx, version %s) "
                 "than this libbie (ABI %u, table %zu bytes, layout %016llx, version %s); install the "
                 "libbie-cuda.so built with it",
                 where, (unsigned)p->abi, (unsigned)p->size, (unsigned long long)p->layout,
                 p->version ? p->version : "?", (unsigned)BIE_CUDA_PLUGIN_ABI, sizeof(struct bie_cuda_plugin),
                 (unsigned long long)BIE_CUDA_PLUGIN_LAYOUT, BIE_VERSION_STRING);
        return false;
    }
    plugin = p;
    return true;
}

// Opens `path` and takes its table; on failure records why (dlerror's words when dlopen fails).
static bool open_plugin(const char * path, const char * label) {
    dlerror();
    void * h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char * e = dlerror();
        snprintf(why_absent, sizeof why_absent, "%s%s cannot be loaded: %s", label, path, e ? e : "dlopen failed");
        return false;
    }
    bie_cuda_plugin_entry_fn entry;
    *(void **)&entry = dlsym(h, BIE_CUDA_PLUGIN_ENTRY_NAME);
    if (!entry) {
        snprintf(why_absent, sizeof why_absent, "%s%s is not a bie CUDA plugin (it has no %s)", label, path,
                 BIE_CUDA_PLUGIN_ENTRY_NAME);
        dlclose(h);
        return false;
    }
    char where[sizeof why_absent / 2];
    snprintf(where, sizeof where, "%s%s", label, path);
    if (!accept(entry(), where)) {
        dlclose(h);
        return false;
    }
    return true; // never closed: CUDA's libraries do not support being unloaded
}

// The directory of the object that holds this function (libbie.so or a program), with a '/'.
static bool own_directory(char * out, size_t size) {
    Dl_info info;
    if (!dladdr((void *)&own_directory, &info) || !info.dli_fname) return false;
    const char * slash = strrchr(info.dli_fname, '/');
    if (!slash) return false;
    const size_t n = (size_t)(slash - info.dli_fname) + 1;
    if (n + 1 > size) return false;
    memcpy(out, info.dli_fname, n);
    out[n] = '\0';
    return true;
}

static void load(void) {
    if (BIE_CUDA_LINKED_ENTRY) {
        accept(BIE_CUDA_LINKED_ENTRY(), "the CUDA backend linked into this program");
        return;
    }
    const char * env = getenv(BIE_CUDA_PLUGIN_ENV);
    if (env && *env) {
        open_plugin(env, BIE_CUDA_PLUGIN_ENV "=");
        return;
    }
    char dir[4096] = "", path[4096 + sizeof BIE_CUDA_PLUGIN_FILE];
    if (own_directory(dir, sizeof dir)) {
        snprintf(path, sizeof path, "%s%s", dir, BIE_CUDA_PLUGIN_FILE);
        if (access(path, F_OK) == 0) {
            open_plugin(path, "the CUDA plugin ");
            return;
        }
    }
    if (open_plugin(BIE_CUDA_PLUGIN_FILE, "the CUDA plugin ")) return;
    // dlopen says "<name>: cannot open shared object file" when the plugin itself is not found,
    // and names the missing dependency otherwise (then the message above stands).
    if (strstr(why_absent, BIE_CUDA_PLUGIN_FILE ": cannot open shared object file"))
        snprintf(why_absent, sizeof why_absent,
                 "the CUDA plugin " BIE_CUDA_PLUGIN_FILE " is not installed (looked in %s and the loader's "
                 "path; this libbie was built without CUDA, or the plugin was not copied beside it)",
                 *dir ? dir : "libbie's directory");
}

enum bie_status bie_cuda_plugin_get(bie_context_t * ctx, const char * what, const struct bie_cuda_plugin ** out) {
    pthread_once(&load_once, load);
    *out = plugin;
    if (plugin) return BIE_STATUS_OK;
    return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "%s: the CUDA backend is not available: %s", what, why_absent);
}

const struct bie_cuda_plugin * bie_cuda_plugin_loaded(void) { return plugin; }

static void count_devices(void) {
    pthread_once(&load_once, load);
    if (plugin) device_total = plugin->device_count(why_no_device, sizeof why_no_device);
}

int bie_cuda_available(void) {
    pthread_once(&devices_once, count_devices);
    return device_total > 0;
}

const char * bie_backend_unavailable_reason(enum bie_backend backend) {
    switch (backend) {
    case BIE_BACKEND_AUTO:
    case BIE_BACKEND_REF:
    case BIE_BACKEND_CPU: return NULL;
    case BIE_BACKEND_CUDA:
        if (bie_cuda_available()) return NULL;
        if (!plugin) return why_absent;
        return *why_no_device ? why_no_device : "no CUDA device is available";
    }
    return "unknown backend";
}

// --- include/bie-cuda.h ---------------------------------------------------------------------------

enum bie_status bie_context_set_cuda_stream(bie_context_t * ctx, void * stream) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    const struct bie_cuda_plugin * p;
    BIE_TRY(bie_cuda_plugin_get(ctx, "stream", &p));
    return p->set_stream(ctx, stream);
}

void * bie_context_cuda_stream(const bie_context_t * ctx) {
    // CUDA state exists only once the plugin has served this context.
    return ctx && ctx->cuda ? bie_cuda_plugin_loaded()->stream(ctx) : NULL;
}

enum bie_status bie_context_cuda_synchronize(bie_context_t * ctx) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    return ctx->cuda ? bie_cuda_plugin_loaded()->synchronize(ctx) : BIE_STATUS_OK;
}

enum bie_status bie_cuda_record_begin(bie_context_t * ctx) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    const struct bie_cuda_plugin * p;
    BIE_TRY(bie_cuda_plugin_get(ctx, "recording", &p));
    return p->record_begin(ctx);
}

enum bie_status bie_cuda_record_end(bie_context_t * ctx, bie_cuda_graph_t ** out) {
    if (out) *out = NULL;
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    if (!ctx->cuda) return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "cuda: record_end without record_begin");
    return bie_cuda_plugin_loaded()->record_end(ctx, out);
}

enum bie_status bie_cuda_replay(bie_context_t * ctx, const bie_cuda_graph_t * graph) {
    if (!ctx) return BIE_STATUS_INVALID_ARGUMENT;
    BIE_ENTER(ctx);
    if (!graph) return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "cuda: replay of no graph");
    const struct bie_cuda_plugin * p;
    BIE_TRY(bie_cuda_plugin_get(ctx, "replay", &p));
    return p->replay(ctx, graph);
}

void bie_cuda_graph_destroy(bie_cuda_graph_t * graph) {
    if (graph) bie_cuda_plugin_loaded()->graph_destroy(graph); // (a graph exists only where the plugin loaded)
}
