// SPDX-License-Identifier: Apache-2.0
// test-io-idx.c: the IDX reader on raw and gzip images: valid files parse to the right shape and
// bytes; wrong magic, unsupported types, bad ranks, zero dimensions, truncated or padded data and
// corrupt or truncated gzip streams are FORMAT_ERRORs whose message names the file.
#include "bie-train.h"
#include "test-util.h"

#include <unistd.h>
#include <zlib.h>

static size_t make_idx(uint8_t * out, int ndim, const uint32_t * dims, int64_t extra) {
    out[0] = 0;
    out[1] = 0;
    out[2] = 0x08;
    out[3] = (uint8_t)ndim;
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        out[4 + 4 * i] = (uint8_t)(dims[i] >> 24);
        out[5 + 4 * i] = (uint8_t)(dims[i] >> 16);
        out[6 + 4 * i] = (uint8_t)(dims[i] >> 8);
        out[7 + 4 * i] = (uint8_t)dims[i];
        numel *= dims[i];
    }
    const size_t head = 4 + 4 * (size_t)ndim, total = head + (size_t)((int64_t)numel + extra);
    for (size_t i = head; i < total; i++) out[i] = (uint8_t)(i * 7);
    return total;
}

static size_t gzip(const uint8_t * in, size_t n, uint8_t * out, size_t cap) {
    z_stream z;
    memset(&z, 0, sizeof z);
    deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
    z.next_in = (Bytef *)in;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    deflate(&z, Z_FINISH);
    size_t len = cap - z.avail_out;
    deflateEnd(&z);
    return len;
}

static enum bie_status parse(bie_context_t * ctx, const uint8_t * b, size_t n, struct bie_idx * out) {
    enum bie_status s = bie_idx_parse(ctx, b, n, "file.idx", out);
    if (s != BIE_STATUS_OK)
        CHECK(strstr(bie_context_last_error(ctx), "file.idx") != NULL, "message does not name the file: %s",
              bie_context_last_error(ctx));
    return s;
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    bie_context_t * ctx = NULL;
    bie_context_create(NULL, &ctx);
    static uint8_t raw[1 << 16], gz[1 << 17];
    const enum bie_status F = BIE_STATUS_FORMAT_ERROR;
    struct bie_idx idx;
    // Valid raw and gzip files of random shapes.
    for (int r = 0; r < 20; r++) {
        const int ndim = (int)test_rand_int(1, 4);
        uint32_t dims[4];
        for (int i = 0; i < ndim; i++) dims[i] = (uint32_t)test_rand_int(1, 12);
        const size_t n = make_idx(raw, ndim, dims, 0), head = 4 + 4 * (size_t)ndim;
        for (int z = 0; z < 2; z++) {
            size_t gn = z ? gzip(raw, n, gz, sizeof gz) : n;
            CHECK_OK(ctx, parse(ctx, z ? gz : raw, gn, &idx));
            CHECK(idx.ndim == ndim, "rank %d, want %d", idx.ndim, ndim);
            for (int i = 0; i < ndim && i < idx.ndim; i++) CHECK(idx.shape[i] == dims[i], "dim %d", i);
            CHECK(idx.data && memcmp(idx.data, raw + head, n - head) == 0, "data differs (gzip %d)", z);
            bie_idx_free(&idx);
            // Truncated or padded data.
            CHECK(parse(ctx, raw, n - 1, &idx) == F, "truncated file accepted");
            CHECK(strstr(bie_context_last_error(ctx), "truncated") != NULL, "message: %s", bie_context_last_error(ctx));
            if (z) {
                CHECK(parse(ctx, gz, gn - 5, &idx) == F, "truncated gzip accepted");
                uint8_t keep = gz[gn / 2];
                gz[gn / 2] ^= 0x5a;
                enum bie_status s = parse(ctx, gz, gn, &idx);
                CHECK(s == F, "corrupt gzip accepted (%s)", bie_status_string(s));
                bie_idx_free(&idx);
                gz[gn / 2] = keep;
            }
        }
        const size_t np = make_idx(raw, ndim, dims, 3);
        CHECK(parse(ctx, raw, np, &idx) == F, "trailing bytes accepted");
    }
    // Bad headers.
    uint32_t d2[2] = {2, 3};
    size_t n = make_idx(raw, 2, d2, 0);
    raw[0] = 1;
    CHECK(parse(ctx, raw, n, &idx) == F, "bad magic accepted");
    raw[0] = 0;
    raw[2] = 0x0D; // float32 elements
    CHECK(parse(ctx, raw, n, &idx) == F, "float IDX accepted");
    raw[2] = 0x08;
    raw[3] = 0;
    CHECK(parse(ctx, raw, n, &idx) == F, "rank 0 accepted");
    raw[3] = 5;
    CHECK(parse(ctx, raw, n, &idx) == F, "rank 5 accepted");
    uint32_t d0[2] = {0, 3};
    n = make_idx(raw, 2, d0, 0);
    CHECK(parse(ctx, raw, n, &idx) == F, "zero dimension accepted");
    uint32_t dbig[3] = {60000, 28000, 28000};
    n = make_idx(raw, 1, dbig, 0); // a valid 1-D file of 60000 bytes
    CHECK_OK(ctx, parse(ctx, raw, n, &idx));
    bie_idx_free(&idx);
    raw[3] = 3; // now it claims 60000 x 28000 x 28000: larger than the bound
    CHECK(parse(ctx, raw, n, &idx) == F, "huge dimensions accepted");
    CHECK(parse(ctx, raw, 3, &idx) == F, "3-byte file accepted");
    CHECK(bie_idx_read(ctx, "no-such-dir/none.idx", &idx) == BIE_STATUS_IO_ERROR, "missing file");
    CHECK(strstr(bie_context_last_error(ctx), "no-such-dir/none.idx") != NULL, "message: %s",
          bie_context_last_error(ctx));
    // A file on disk, gzip-compressed, read back.
    char path[] = "bie-test-idx-XXXXXX";
    int fd = mkstemp(path);
    n = make_idx(raw, 2, d2, 0);
    size_t gn = gzip(raw, n, gz, sizeof gz);
    CHECK(fd >= 0 && write(fd, gz, gn) == (ssize_t)gn, "write");
    close(fd);
    CHECK_OK(ctx, bie_idx_read(ctx, path, &idx));
    CHECK(idx.ndim == 2 && idx.shape[0] == 2 && idx.shape[1] == 3, "read back");
    bie_idx_free(&idx);
    unlink(path);
    bie_context_destroy(ctx);
    return test_finish("test-io-idx");
}
