// SPDX-License-Identifier: Apache-2.0
// io-util.h: file helpers shared by the readers and writers of src/io and src/nn.
#pragma once

#include "bie-impl.h"

#include <stdint.h>

// Reads the whole file at path into a malloc'd buffer (*out, *out_size), refusing files larger
// than max_size bytes. IO_ERROR (naming the file) if it cannot be opened or read,
// FORMAT_ERROR if it is larger than max_size.
enum bie_status bie_read_file(bie_context_t * ctx, const char * path, size_t max_size, uint8_t ** out,
                              size_t * out_size);

// Atomic replacement: writes the buffers (in order) to a temporary file next to path, flushes
// it to disk, then renames it over path. A crash leaves either the old file or the new one.
enum bie_status bie_write_file_atomic(bie_context_t * ctx, const char * path, size_t n_parts,
                                      const void * const * parts, const size_t * sizes);

// Little-endian and big-endian loads from possibly unaligned bytes.
static inline uint64_t bie_load_le64(const uint8_t * p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static inline uint32_t bie_load_be32(const uint8_t * p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
