// SPDX-License-Identifier: Apache-2.0
// status.c: status and dtype names, version queries, the context's error message.
#include "bie-impl.h"

#include <stdio.h>
#include <string.h>

const char * bie_status_string(enum bie_status status) {
    switch (status) {
    case BIE_STATUS_OK: return "ok";
    case BIE_STATUS_INVALID_ARGUMENT: return "invalid argument";
    case BIE_STATUS_UNSUPPORTED: return "unsupported";
    case BIE_STATUS_OUT_OF_MEMORY: return "out of memory";
    case BIE_STATUS_DEVICE_ERROR: return "device error";
    case BIE_STATUS_IO_ERROR: return "I/O error";
    case BIE_STATUS_FORMAT_ERROR: return "format error";
    case BIE_STATUS_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char * bie_dtype_name(enum bie_dtype dtype) {
    switch (dtype) {
    case BIE_DTYPE_F32: return "f32";
    case BIE_DTYPE_F16: return "f16";
    case BIE_DTYPE_BF16: return "bf16";
    case BIE_DTYPE_I8: return "i8";
    case BIE_DTYPE_U8: return "u8";
    case BIE_DTYPE_I32: return "i32";
    case BIE_DTYPE_B1: return "b1";
    case BIE_DTYPE_S4: return "s4";
    case BIE_DTYPE_F64: return "f64";
    case BIE_DTYPE_I64: return "i64";
    }
    return "?";
}

void bie_version(int * major, int * minor, int * patch) {
    if (major) *major = BIE_VERSION_MAJOR;
    if (minor) *minor = BIE_VERSION_MINOR;
    if (patch) *patch = BIE_VERSION_PATCH;
}

const char * bie_version_string(void) { return BIE_VERSION_STRING; }

enum bie_status bie_set_error(bie_context_t * ctx, enum bie_status status, const char * fmt, ...) {
    if (ctx) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx->error, sizeof ctx->error, fmt, ap);
        va_end(ap);
    }
    return status;
}

void bie_clear_error(bie_context_t * ctx) {
    if (ctx) ctx->error[0] = '\0';
}
