// SPDX-License-Identifier: Apache-2.0
// io-util.h: file helpers shared by the readers and writers of src/io and src/nn.
#pragma once

#include "bie-impl.h"

#include <stdint.h>

// Opens path for reading (*out_fd, to close) and gives its size. Only regular files are read: a
// FIFO, device or directory is an IO_ERROR before anything is read (a FIFO would block, /dev/zero
// never end); a file larger than max_size is a FORMAT_ERROR from its size alone.
enum bie_status bie_file_open_read(bie_context_t * ctx, const char * path, size_t max_size, int * out_fd,
                                   size_t * out_size);
// Reads exactly n bytes at offset (FORMAT_ERROR when the file is shorter: it shrank meanwhile).
enum bie_status bie_file_read_at(bie_context_t * ctx, const char * path, int fd, void * buf, size_t n, uint64_t offset);

// Reads the whole file at path into a malloc'd buffer (*out, *out_size) with the checks of
// bie_file_open_read: its size is known, and bounded, before a byte is read.
enum bie_status bie_read_file(bie_context_t * ctx, const char * path, size_t max_size, uint8_t ** out,
                              size_t * out_size);

// Atomic replacement: writes the buffers (in order) to a temporary file next to path
// ("<path>.tmp.<pid>.<suffix>"), flushes it to disk, renames it over path and flushes the
// directory. A crash leaves either the old file or the new one, and the temporary files of writers
// that died are removed by the next write of the same path. A new file gets 0666 less the umask
// (applied by the kernel; the process umask is never changed), a replaced one keeps its mode.
// Reaching the file size limit (ulimit -f, with SIGXFSZ ignored) is an IO_ERROR that says so.
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
