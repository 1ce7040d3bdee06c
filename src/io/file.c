// SPDX-License-Identifier: Apache-2.0
// file.c: whole-file reads with a size bound, and atomic writes (temporary file, fsync, rename).
#include "io-util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum bie_status bie_read_file(bie_context_t * ctx, const char * path, size_t max_size, uint8_t ** out,
                              size_t * out_size) {
    *out = NULL;
    *out_size = 0;
    FILE * f = fopen(path, "rb");
    if (!f) return bie_set_error(ctx, BIE_STATUS_IO_ERROR, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    uint8_t * buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    for (;;) {
        if (n == cap) {
            if (cap > max_size) {
                free(buf);
                fclose(f);
                return bie_set_error(ctx, BIE_STATUS_FORMAT_ERROR, "%s: file is larger than %zu bytes",
                                     path, max_size);
            }
            uint8_t * nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                fclose(f);
                return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return bie_set_error(ctx, BIE_STATUS_IO_ERROR, "%s: read error", path);
    }
    if (n > max_size) {
        free(buf);
        return bie_set_error(ctx, BIE_STATUS_FORMAT_ERROR, "%s: file is larger than %zu bytes", path,
                             max_size);
    }
    *out = buf;
    *out_size = n;
    return BIE_STATUS_OK;
}

enum bie_status bie_write_file_atomic(bie_context_t * ctx, const char * path, size_t n_parts,
                                      const void * const * parts, const size_t * sizes) {
    size_t pl = strlen(path);
    char * tmp = malloc(pl + 16);
    if (!tmp) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp.XXXXXX", 12);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        enum bie_status s = bie_set_error(ctx, BIE_STATUS_IO_ERROR, "%s: cannot create a temporary file: %s",
                                          path, strerror(errno));
        free(tmp);
        return s;
    }
    // mkstemp creates the file 0600; give it the mode a plain fopen would (0666 less the umask).
    const mode_t mask = umask(0);
    umask(mask);
    fchmod(fd, 0666 & ~mask);
    FILE * f = fdopen(fd, "wb");
    bool ok = f != NULL;
    for (size_t i = 0; ok && i < n_parts; i++)
        if (sizes[i] && fwrite(parts[i], 1, sizes[i], f) != sizes[i]) ok = false;
    if (ok && fflush(f) != 0) ok = false;
    if (ok && fsync(fileno(f)) != 0) ok = false;
    int saved = errno;
    if (f) {
        if (fclose(f) != 0) ok = false;
    } else {
        close(fd);
    }
    if (ok && rename(tmp, path) != 0) {
        saved = errno;
        ok = false;
    }
    if (!ok) {
        unlink(tmp);
        free(tmp);
        return bie_set_error(ctx, BIE_STATUS_IO_ERROR, "%s: write failed: %s", path, strerror(saved));
    }
    free(tmp);
    return BIE_STATUS_OK;
}
