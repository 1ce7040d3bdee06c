// SPDX-License-Identifier: Apache-2.0
// idx.c: the IDX reader (MNIST family), raw or gzip-compressed, for untrusted files.
// Layout: 0x00 0x00 TYPE NDIM, NDIM big-endian u32 dimensions, then prod(dims) elements.
//
// Memory: the header is decoded first (from the first 4 + 4*NDIM bytes, inflated or read), and
// refused as soon as a byte of it is wrong; then exactly the declared data size is allocated, and
// the data inflated or read straight into it (one byte more is asked for, to report trailing
// bytes). A gzip "bomb" cannot make the reader hold more than its header declares, which is at most
// BIE_IDX_MAX_BYTES; a raw file is read once, into its final buffer.
#include "io-util.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

// A gzip stream (possibly several members) inflated piece by piece.
struct gz {
    z_stream z;
    const uint8_t * in;
    size_t n, consumed;
    bool ended; // the last member ended with the input
};

// Inflates up to `want` bytes into out (*got < want only at the end of the stream); FORMAT_ERROR
// for corrupt or truncated data.
static enum bie_status gz_read(bie_context_t * ctx, const char * name, struct gz * g, uint8_t * out, size_t want,
                               size_t * got) {
    *got = 0;
    while (*got < want && !g->ended) {
        // zlib counts in uInt: at most 1 GiB in and out per call.
        const size_t in_left = g->n - g->consumed, out_left = want - *got;
        g->z.next_in = (Bytef *)(g->in + g->consumed);
        g->z.avail_in = (uInt)(in_left > (1u << 30) ? (1u << 30) : in_left);
        g->z.next_out = out + *got;
        g->z.avail_out = (uInt)(out_left > (1u << 30) ? (1u << 30) : out_left);
        const uInt avail_in0 = g->z.avail_in, avail_out0 = g->z.avail_out;
        const int r = inflate(&g->z, Z_NO_FLUSH);
        g->consumed += avail_in0 - g->z.avail_in;
        *got += avail_out0 - g->z.avail_out;
        if (r == Z_STREAM_END) {
            if (g->consumed == g->n) {
                g->ended = true;
                break;
            }
            // Another gzip member follows (concatenated .gz files are legal).
            if (inflateReset(&g->z) != Z_OK) return BIE_FORMAT_ERROR("%s: corrupt gzip data", name);
            continue;
        }
        if (r == Z_BUF_ERROR || (r == Z_OK && avail_in0 == g->z.avail_in && avail_out0 == g->z.avail_out)) {
            if (g->consumed == g->n)
                return BIE_FORMAT_ERROR("%s: truncated gzip data (the file ends inside the compressed stream)", name);
            continue;
        }
        if (r != Z_OK) return BIE_FORMAT_ERROR("%s: corrupt gzip data (%s)", name, g->z.msg ? g->z.msg : "zlib error");
    }
    return BIE_STATUS_OK;
}

// The first 4 bytes of an IDX file: magic, element type and rank (in *ndim).
static enum bie_status check_magic(bie_context_t * ctx, const char * name, const uint8_t * p, size_t n, int * ndim) {
    if (n < 4) return BIE_FORMAT_ERROR("%s: too short for an IDX header (%zu bytes)", name, n);
    if (p[0] != 0 || p[1] != 0)
        return BIE_FORMAT_ERROR("%s: bad IDX magic %02x %02x %02x %02x (not an IDX file)", name, p[0], p[1], p[2],
                                p[3]);
    if (p[2] != 0x08)
        return BIE_FORMAT_ERROR("%s: IDX element type 0x%02x is not supported (only unsigned bytes, 0x08)", name, p[2]);
    *ndim = p[3];
    if (*ndim < 1 || *ndim > 4) return BIE_FORMAT_ERROR("%s: IDX rank %d outside [1, 4]", name, *ndim);
    return BIE_STATUS_OK;
}

// The dimensions (p: ndim big-endian u32, n bytes available): out->shape and the element count.
static enum bie_status check_dims(bie_context_t * ctx, const char * name, const uint8_t * p, size_t n, int ndim,
                                  struct bie_idx * out, size_t * numel) {
    if (n < 4 * (size_t)ndim) return BIE_FORMAT_ERROR("%s: truncated IDX header", name);
    uint64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        const uint32_t d = bie_load_be32(p + 4 * i);
        if (d == 0 || d > (1u << 30))
            return BIE_FORMAT_ERROR("%s: IDX dimension %d = %" PRIu32 " is out of range", name, i, d);
        count *= d;
        if (count > BIE_IDX_MAX_BYTES)
            return BIE_FORMAT_ERROR("%s: IDX data larger than %u bytes", name, BIE_IDX_MAX_BYTES);
        out->shape[i] = d;
    }
    *numel = (size_t)count;
    return BIE_STATUS_OK;
}

// *have bytes of data for a header announcing numel: the messages for the two ways to be wrong.
static enum bie_status check_count(bie_context_t * ctx, const char * name, size_t numel, size_t have, bool at_least) {
    if (have < numel)
        return BIE_FORMAT_ERROR("%s: truncated: the header announces %zu bytes of data, the file has %zu", name, numel,
                                have);
    if (have > numel)
        return BIE_FORMAT_ERROR("%s: %s%zu unexpected bytes after the %zu bytes of data", name,
                                at_least ? "at least " : "", have - numel, numel);
    return BIE_STATUS_OK;
}

static enum bie_status parse_gzip(bie_context_t * ctx, const char * name, const uint8_t * p, size_t size,
                                  struct bie_idx * out) {
    struct gz g = {.in = p, .n = size};
    if (inflateInit2(&g.z, 16 + MAX_WBITS) != Z_OK)
        return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "%s: zlib init failed", name);
    uint8_t head[4 + 16];
    size_t got = 0, numel = 0;
    int ndim = 0;
    enum bie_status s = gz_read(ctx, name, &g, head, 4, &got);
    if (s == BIE_STATUS_OK) s = check_magic(ctx, name, head, got, &ndim);
    if (s == BIE_STATUS_OK) s = gz_read(ctx, name, &g, head + 4, 4 * (size_t)ndim, &got);
    if (s == BIE_STATUS_OK) s = check_dims(ctx, name, head + 4, got, ndim, out, &numel);
    if (s == BIE_STATUS_OK) {
        out->data = malloc(numel + 1);
        if (!out->data) s = bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "%s: out of memory", name);
    }
    if (s == BIE_STATUS_OK) s = gz_read(ctx, name, &g, out->data, numel + 1, &got);
    if (s == BIE_STATUS_OK) s = check_count(ctx, name, numel, got, true);
    inflateEnd(&g.z);
    if (s != BIE_STATUS_OK) return s;
    out->ndim = ndim;
    return BIE_STATUS_OK;
}

static enum bie_status parse_raw(bie_context_t * ctx, const char * name, const uint8_t * p, size_t n,
                                 struct bie_idx * out) {
    int ndim = 0;
    size_t numel = 0;
    BIE_TRY(check_magic(ctx, name, p, n, &ndim));
    BIE_TRY(check_dims(ctx, name, p + 4, n - 4, ndim, out, &numel));
    const size_t head = 4 + 4 * (size_t)ndim;
    BIE_TRY(check_count(ctx, name, numel, n - head, false));
    out->data = malloc(numel ? numel : 1);
    if (!out->data) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "%s: out of memory", name);
    memcpy(out->data, p + head, numel);
    out->ndim = ndim;
    return BIE_STATUS_OK;
}

static bool is_gzip(const uint8_t * p, size_t n) { return n >= 2 && p[0] == 0x1f && p[1] == 0x8b; }

enum bie_status bie_idx_parse(bie_context_t * ctx, const void * bytes, size_t size, const char * name,
                              struct bie_idx * out) {
    BIE_ENTER(ctx);
    if (!out) return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "out: is NULL");
    memset(out, 0, sizeof *out);
    if (!name) name = "IDX data";
    if (!bytes && size) return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "bytes: is NULL");
    const enum bie_status s =
        is_gzip(bytes, size) ? parse_gzip(ctx, name, bytes, size, out) : parse_raw(ctx, name, bytes, size, out);
    if (s != BIE_STATUS_OK) bie_idx_free(out);
    return s;
}

// A raw file read from disk: its header first, then its data straight into the result.
static enum bie_status read_raw(bie_context_t * ctx, const char * path, int fd, size_t size, struct bie_idx * out) {
    uint8_t head[4 + 16];
    int ndim = 0;
    size_t numel = 0;
    const size_t h4 = size < 4 ? size : 4;
    BIE_TRY(bie_file_read_at(ctx, path, fd, head, h4, 0));
    BIE_TRY(check_magic(ctx, path, head, h4, &ndim));
    const size_t hd = size - 4 < 4 * (size_t)ndim ? size - 4 : 4 * (size_t)ndim;
    BIE_TRY(bie_file_read_at(ctx, path, fd, head + 4, hd, 4));
    BIE_TRY(check_dims(ctx, path, head + 4, hd, ndim, out, &numel));
    const size_t hl = 4 + 4 * (size_t)ndim;
    BIE_TRY(check_count(ctx, path, numel, size - hl, false));
    out->data = malloc(numel);
    if (!out->data) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
    BIE_TRY(bie_file_read_at(ctx, path, fd, out->data, numel, hl));
    out->ndim = ndim;
    return BIE_STATUS_OK;
}

enum bie_status bie_idx_read(bie_context_t * ctx, const char * path, struct bie_idx * out) {
    BIE_ENTER(ctx);
    if (!path || !out) return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "path/out: is NULL");
    memset(out, 0, sizeof *out);
    int fd;
    size_t size;
    // A compressed file is at most as large as the data (plus a header); a raw one exactly so.
    BIE_TRY(bie_file_open_read(ctx, path, (size_t)BIE_IDX_MAX_BYTES + 64, &fd, &size));
    uint8_t magic[2] = {0, 0};
    enum bie_status s = bie_file_read_at(ctx, path, fd, magic, size < 2 ? size : 2, 0);
    if (s == BIE_STATUS_OK && !is_gzip(magic, size)) {
        s = read_raw(ctx, path, fd, size, out);
    } else if (s == BIE_STATUS_OK) {
        uint8_t * bytes = malloc(size);
        if (!bytes) s = bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
        if (s == BIE_STATUS_OK) s = bie_file_read_at(ctx, path, fd, bytes, size, 0);
        if (s == BIE_STATUS_OK) s = parse_gzip(ctx, path, bytes, size, out);
        free(bytes);
    }
    close(fd);
    if (s != BIE_STATUS_OK) bie_idx_free(out);
    return s;
}

void bie_idx_free(struct bie_idx * idx) {
    if (!idx) return;
    free(idx->data);
    memset(idx, 0, sizeof *idx);
}
