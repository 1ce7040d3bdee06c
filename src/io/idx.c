// SPDX-License-Identifier: Apache-2.0
// idx.c: the IDX reader (MNIST family), raw or gzip-compressed, for untrusted files.
// Layout: 0x00 0x00 TYPE NDIM, NDIM big-endian u32 dimensions, then prod(dims) elements.
#include "io-util.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

// Inflates a gzip stream (possibly several members) into a malloc'd buffer of at most max bytes.
static enum bie_status gunzip(bie_context_t * ctx, const char * name, const uint8_t * in, size_t n,
                              size_t max, uint8_t ** out, size_t * out_n) {
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK)
        return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "%s: zlib init failed", name);
    size_t cap = n < (1u << 20) ? (1u << 16) : n * 2, len = 0;
    if (cap > max) cap = max;
    uint8_t * buf = malloc(cap + 1);
    enum bie_status s = BIE_STATUS_OK;
    if (!buf) {
        inflateEnd(&z);
        return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "%s: out of memory", name);
    }
    size_t consumed = 0;
    for (;;) {
        // zlib counts in uInt: feed at most 1 GiB at a time.
        size_t in_left = n - consumed;
        z.next_in = (Bytef *)(in + consumed);
        z.avail_in = (uInt)(in_left > (1u << 30) ? (1u << 30) : in_left);
        if (len == cap) {
            if (cap >= max) {
                s = BIE_FORMAT_ERROR("%s: decompresses to more than %zu bytes", name, max);
                break;
            }
            size_t nc = cap * 2 > max ? max : cap * 2;
            uint8_t * nb = realloc(buf, nc + 1);
            if (!nb) {
                s = bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "%s: out of memory", name);
                break;
            }
            buf = nb;
            cap = nc;
        }
        z.next_out = buf + len;
        z.avail_out = (uInt)(cap - len > (1u << 30) ? (1u << 30) : cap - len);
        const uInt avail_in0 = z.avail_in, avail_out0 = z.avail_out;
        int r = inflate(&z, Z_NO_FLUSH);
        consumed += avail_in0 - z.avail_in;
        len += avail_out0 - z.avail_out;
        // Once the IDX header is out, nothing beyond the size it announces (plus one byte, to
        // report padding) is inflated: a small "zip bomb" cannot make us allocate more.
        if (len >= 4 && buf[3] >= 1 && buf[3] <= 4 && len >= 4 + 4 * (size_t)buf[3]) {
            uint64_t want = 4 + 4 * (uint64_t)buf[3];
            uint64_t numel = 1;
            for (int i = 0; i < buf[3] && numel <= max; i++) numel *= bie_load_be32(buf + 4 + 4 * i);
            want += numel + 1;
            if (want < max) max = (size_t)want;
            if (len >= max) break; // parse_raw reports the padding
        }
        if (r == Z_STREAM_END) {
            if (consumed == n) break;
            // Another gzip member follows (concatenated .gz files are legal).
            if (inflateReset(&z) != Z_OK) {
                s = BIE_FORMAT_ERROR("%s: corrupt gzip data", name);
                break;
            }
            continue;
        }
        if (r == Z_BUF_ERROR && consumed == n && z.avail_out > 0) {
            s = BIE_FORMAT_ERROR("%s: truncated gzip data (the file ends inside the compressed stream)", name);
            break;
        }
        if (r != Z_OK && r != Z_BUF_ERROR) {
            s = BIE_FORMAT_ERROR("%s: corrupt gzip data (%s)", name, z.msg ? z.msg : "zlib error");
            break;
        }
        if (r == Z_BUF_ERROR && z.avail_out > 0) { // no progress possible
            s = BIE_FORMAT_ERROR("%s: truncated gzip data", name);
            break;
        }
    }
    inflateEnd(&z);
    if (s != BIE_STATUS_OK) {
        free(buf);
        return s;
    }
    *out = buf;
    *out_n = len;
    return BIE_STATUS_OK;
}

static enum bie_status parse_raw(bie_context_t * ctx, const char * name, const uint8_t * p, size_t n,
                                 struct bie_idx * out) {
    if (n < 4) return BIE_FORMAT_ERROR("%s: too short for an IDX header (%zu bytes)", name, n);
    if (p[0] != 0 || p[1] != 0)
        return BIE_FORMAT_ERROR("%s: bad IDX magic %02x %02x %02x %02x (not an IDX file)", name, p[0], p[1], p[2], p[3]);
    if (p[2] != 0x08)
        return BIE_FORMAT_ERROR("%s: IDX element type 0x%02x is not supported (only unsigned bytes, 0x08)", name, p[2]);
    const int ndim = p[3];
    if (ndim < 1 || ndim > 4) return BIE_FORMAT_ERROR("%s: IDX rank %d outside [1, 4]", name, ndim);
    if (n < 4 + 4 * (size_t)ndim) return BIE_FORMAT_ERROR("%s: truncated IDX header", name);
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        const uint32_t d = bie_load_be32(p + 4 + 4 * i);
        if (d == 0 || d > (1u << 30)) return BIE_FORMAT_ERROR("%s: IDX dimension %d = %" PRIu32 " is out of range", name, i, d);
        numel *= d;
        if (numel > BIE_IDX_MAX_BYTES) return BIE_FORMAT_ERROR("%s: IDX data larger than %u bytes", name, BIE_IDX_MAX_BYTES);
        out->shape[i] = d;
    }
    const size_t have = n - 4 - 4 * (size_t)ndim;
    if (have < numel)
        return BIE_FORMAT_ERROR("%s: truncated: the header announces %" PRIu64 " bytes of data, the file has %zu", name, numel, have);
    if (have > numel)
        return BIE_FORMAT_ERROR("%s: %zu unexpected bytes after the %" PRIu64 " bytes of data", name, have - (size_t)numel, numel);
    out->data = malloc(numel);
    if (!out->data) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "%s: out of memory", name);
    memcpy(out->data, p + 4 + 4 * ndim, numel);
    out->ndim = ndim;
    return BIE_STATUS_OK;
}

enum bie_status bie_idx_parse(bie_context_t * ctx, const void * bytes, size_t size, const char * name,
                              struct bie_idx * out) {
    BIE_ENTER(ctx);
    if (!out) return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "out: is NULL");
    memset(out, 0, sizeof *out);
    if (!name) name = "IDX data";
    if (!bytes && size) return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "bytes: is NULL");
    const uint8_t * p = bytes;
    if (size >= 2 && p[0] == 0x1f && p[1] == 0x8b) {
        uint8_t * raw = NULL;
        size_t raw_n = 0;
        // Room for the header and a few bytes more than the limit, so an oversize file is named.
        enum bie_status s = gunzip(ctx, name, p, size, BIE_IDX_MAX_BYTES + 64, &raw, &raw_n);
        if (s != BIE_STATUS_OK) return s;
        s = parse_raw(ctx, name, raw, raw_n, out);
        free(raw);
        return s;
    }
    return parse_raw(ctx, name, p, size, out);
}

enum bie_status bie_idx_read(bie_context_t * ctx, const char * path, struct bie_idx * out) {
    BIE_ENTER(ctx);
    if (!path || !out) return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "path/out: is NULL");
    memset(out, 0, sizeof *out);
    uint8_t * bytes = NULL;
    size_t n = 0;
    enum bie_status s = bie_read_file(ctx, path, BIE_IDX_MAX_BYTES + 64, &bytes, &n);
    if (s != BIE_STATUS_OK) return s;
    s = bie_idx_parse(ctx, bytes, n, path, out);
    free(bytes);
    return s;
}

void bie_idx_free(struct bie_idx * idx) {
    if (!idx) return;
    free(idx->data);
    memset(idx, 0, sizeof *idx);
}
