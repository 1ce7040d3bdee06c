// SPDX-License-Identifier: Apache-2.0
// test-files.c: how the library treats the file system and hostile files:
// - writes never touch the process umask; a new file gets 0666 less the umask, a replaced file
//   keeps its mode; the directory is fsynced after the rename;
// - temporary files left by a killed writer are removed by the next write of the same file;
// - a write that reaches the file size limit (ulimit -f, SIGXFSZ ignored) says so and leaves
//   nothing behind;
// - FIFOs, devices and directories are refused before any read; a file's size is checked before
//   its contents are read, and a safetensors header before its data section;
// - header parsing is linear in time and bounded in memory; an IDX gzip stream is inflated only as
//   far as its header declares.
// Memory bounds are measured in child processes (getrusage's peak RSS).
#define _GNU_SOURCE
#include "test-child.h"
#include "bie-train.h"
#include "test-util.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

static bool quick;

// --- interposed calls: what the library does to the process and the disk ---------------------------

static int calls_umask = 0, dir_fsyncs = 0;

mode_t umask(mode_t mask) {
    __atomic_add_fetch(&calls_umask, 1, __ATOMIC_RELAXED);
    static mode_t (*real)(mode_t);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "umask");
    return real(mask);
}

int fsync(int fd) {
    struct stat sb;
    if (fstat(fd, &sb) == 0 && S_ISDIR(sb.st_mode)) __atomic_add_fetch(&dir_fsyncs, 1, __ATOMIC_RELAXED);
    static int (*real)(int);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "fsync");
    return real(fd);
}

// The test's own umask changes go around the counter.
static mode_t set_umask(mode_t m) {
    const mode_t old = umask(m);
    __atomic_sub_fetch(&calls_umask, 1, __ATOMIC_RELAXED);
    return old;
}

static char dir[256];

static void path_in_dir(char * out, size_t size, const char * name) { snprintf(out, size, "%s/%s", dir, name); }

static enum bie_status write_small(bie_context_t * ctx, const char * path, size_t nbytes) {
    static uint8_t data[1 << 20];
    const struct bie_st_tensor t = {
        .name = "w", .dtype = BIE_DTYPE_U8, .ndim = 1, .shape = {(int64_t)nbytes}, .data = data, .nbytes = nbytes};
    return bie_safetensors_write(ctx, path, &t, 1, NULL, 0);
}

static int count_temps(const char * base) {
    DIR * d = opendir(dir);
    int n = 0;
    char prefix[300];
    snprintf(prefix, sizeof prefix, "%s.tmp.", base);
    for (struct dirent * e; d && (e = readdir(d));) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (d) closedir(d);
    return n;
}

static void test_modes(bie_context_t * ctx) {
    char path[300];
    path_in_dir(path, sizeof path, "modes.safetensors");
    static const mode_t masks[3] = {022, 077, 0};
    const mode_t saved = set_umask(022);
    for (int i = 0; i < 3; i++) {
        unlink(path);
        set_umask(masks[i]);
        __atomic_store_n(&dir_fsyncs, 0, __ATOMIC_RELAXED);
        CHECK_OK(ctx, write_small(ctx, path, 100));
        struct stat sb;
        CHECK(stat(path, &sb) == 0 && (sb.st_mode & 0777) == (0666 & ~masks[i]), "umask %03o: new file mode %03o",
              (unsigned)masks[i], (unsigned)(sb.st_mode & 0777));
        CHECK(dir_fsyncs >= 1, "umask %03o: the directory was not fsynced after the rename", (unsigned)masks[i]);
    }
    // Replacing a file keeps its mode.
    set_umask(022);
    chmod(path, 0640);
    CHECK_OK(ctx, write_small(ctx, path, 200));
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && (sb.st_mode & 0777) == 0640 && sb.st_size > 200, "replaced file mode %03o",
          (unsigned)(sb.st_mode & 0777));
    set_umask(saved);
    CHECK(calls_umask == 0, "the library called umask %d times (a process-wide setting)", calls_umask);
    unlink(path);
}

// Temporary files of a writer that died: "<file>.tmp.<pid>.<suffix>" with a dead pid go, a live
// pid's (another writer's, in flight) and unrelated names stay.
static void test_stale_temps(bie_context_t * ctx) {
    char path[300], dead[400], live[400], other[400];
    path_in_dir(path, sizeof path, "stale.ckpt");
    const pid_t child = fork();
    if (child == 0) _exit(0);
    waitpid(child, NULL, 0); // its pid is now free
    snprintf(dead, sizeof dead, "%s.tmp.%d.a1b2c3", path, (int)child);
    snprintf(live, sizeof live, "%s.tmp.%d.d4e5f6", path, (int)getppid());
    snprintf(other, sizeof other, "%s.tmpx", path);
    const char * names[3] = {dead, live, other};
    for (int i = 0; i < 3; i++) {
        FILE * f = fopen(names[i], "w");
        if (f) {
            fputs("partial", f);
            fclose(f);
        }
    }
    CHECK_OK(ctx, write_small(ctx, path, 64));
    CHECK(access(dead, F_OK) != 0, "the temporary file of a dead writer is still there");
    CHECK(access(live, F_OK) == 0, "the temporary file of a live writer was removed");
    CHECK(access(other, F_OK) == 0, "an unrelated file was removed");
    unlink(live);
    unlink(other);
    unlink(path);
}

// ulimit -f: the write stops with EFBIG (SIGXFSZ ignored, as the bie program does).
static void efbig_child(void) {
    signal(SIGXFSZ, SIG_IGN);
    const struct rlimit rl = {16384, 16384};
    setrlimit(RLIMIT_FSIZE, &rl);
    bie_context_t * ctx = NULL;
    bie_context_create(NULL, &ctx);
    char path[300];
    path_in_dir(path, sizeof path, "big.safetensors");
    const enum bie_status s = write_small(ctx, path, 65536);
    const char * m = bie_context_last_error(ctx);
    if (s != BIE_STATUS_IO_ERROR) _exit(3);
    if (!strstr(m, "file size limit")) {
        fprintf(stderr, "message: %s\n", m);
        _exit(4);
    }
    if (access(path, F_OK) == 0 || count_temps("big.safetensors") != 0) _exit(5);
    _exit(0);
}

static void test_efbig(void) {
    const int st = test_in_child(efbig_child, 60);
    CHECK(st == 0,
          "a write past ulimit -f: child status %d (3: wrong status, 4: message without \"file size "
          "limit\", 5: a file left behind, 153: killed by SIGXFSZ)",
          st);
}

// What the reader refuses, the writer refuses: non-UTF-8 or repeated keys, names over the bounds.
static void test_write_checks(bie_context_t * ctx) {
    char path[300];
    path_in_dir(path, sizeof path, "checks.safetensors");
    uint8_t data[4] = {0};
    const struct bie_st_tensor t = {
        .name = "w", .dtype = BIE_DTYPE_U8, .ndim = 1, .shape = {4}, .data = data, .nbytes = 4};
    const char *bad_utf8[2] = {"note", "caf\xe9"}, *dup[4] = {"a", "1", "a", "2"};
    TEST_EXPECT_STATUS(ctx, bie_safetensors_write(ctx, path, &t, 1, bad_utf8, 1), BIE_STATUS_INVALID_ARGUMENT, "UTF-8");
    TEST_EXPECT_STATUS(ctx, bie_safetensors_write(ctx, path, &t, 1, dup, 2), BIE_STATUS_INVALID_ARGUMENT, "twice");
    struct bie_st_tensor two[2] = {t, t};
    TEST_EXPECT_STATUS(ctx, bie_safetensors_write(ctx, path, two, 2, NULL, 0), BIE_STATUS_INVALID_ARGUMENT, "twice");
    struct bie_st_tensor wrap = t; // 2^33 x 2^31 elements: the product wraps to 0 in 64 bits... times 4 bytes
    wrap.ndim = 2;
    wrap.shape[0] = INT64_C(1) << 33;
    wrap.shape[1] = INT64_C(1) << 31;
    wrap.nbytes = 0;
    TEST_EXPECT_STATUS(ctx, bie_safetensors_write(ctx, path, &wrap, 1, NULL, 0), BIE_STATUS_INVALID_ARGUMENT,
                       "tensors[0]");
    CHECK(access(path, F_OK) != 0, "a refused write left a file");
}

// --- special files and sizes -------------------------------------------------------------------------

static void special_child(void) {
    bie_context_t * ctx = NULL;
    bie_context_create(NULL, &ctx);
    char fifo[300];
    path_in_dir(fifo, sizeof fifo, "fifo");
    mkfifo(fifo, 0600);
    bie_safetensors_t * st = NULL;
    struct bie_idx idx;
    const char * paths[3] = {fifo, "/dev/zero", dir};
    for (int i = 0; i < 3; i++) {
        if (bie_safetensors_read(ctx, paths[i], &st) != BIE_STATUS_IO_ERROR) _exit(10 + i);
        if (!strstr(bie_context_last_error(ctx), "not a regular file")) _exit(20 + i);
        if (bie_idx_read(ctx, paths[i], &idx) != BIE_STATUS_IO_ERROR) _exit(30 + i);
    }
    unlink(fifo);
    _exit(0);
}

static void test_special_files(void) {
    const int st = test_in_child(special_child, 60);
    CHECK(st == 0,
          "FIFO, /dev/zero, directory: child status %d (1x: not refused, 2x: message, 3x: IDX; 142: "
          "blocked until the alarm)",
          st);
}

#define CHILD_EXPECT(cond)                                                                                             \
    do {                                                                                                               \
        if (!(cond)) _exit(7);                                                                                         \
    } while (0)

// A sparse file of `size` bytes whose first bytes are `head`.
static void sparse_file(const char * path, uint64_t size, const void * head, size_t head_len) {
    const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return;
    if (head_len && write(fd, head, head_len) != (ssize_t)head_len) perror("write");
    if (ftruncate(fd, (off_t)size) != 0) perror("ftruncate");
    close(fd);
}

static void read_sparse_child(void) {
    bie_context_t * ctx = NULL;
    bie_context_create(NULL, &ctx);
    char path[300];
    path_in_dir(path, sizeof path, "sparse.safetensors");
    bie_safetensors_t * st = NULL;
    CHILD_EXPECT(bie_safetensors_read(ctx, path, &st) == BIE_STATUS_FORMAT_ERROR);
}

static void test_size_first(void) {
    char path[300];
    path_in_dir(path, sizeof path, "sparse.safetensors");
    // Over the 4 GiB limit: refused from its size alone.
    sparse_file(path, ((uint64_t)4 << 30) + 1, NULL, 0);
    long long g = test_rss_growth(read_sparse_child, NULL);
    CHECK(g >= 0 && g < (64 << 20), "a 4 GiB + 1 file: %lld bytes of peak RSS growth (refused from its size)", g);
    // Under the limit, with a 100-byte header of garbage: only the header is read.
    const uint8_t head[16] = {100, 0, 0, 0, 0, 0, 0, 0, '{', 'x'};
    sparse_file(path, (uint64_t)3 << 30, head, sizeof head);
    g = test_rss_growth(read_sparse_child, NULL);
    CHECK(g >= 0 && g < (64 << 20), "a 3 GiB file with a bad header: %lld bytes of peak RSS growth", g);
    unlink(path);
}

// --- header parsing --------------------------------------------------------------------------------

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// A header of n metadata keys "k<i>": "" (2.2 MB for 160k keys); key number dup (if any) repeats "k0".
static char * many_keys(int n, int dup) {
    char * h = malloc((size_t)n * 24 + 64);
    size_t len = (size_t)sprintf(h, "{\"__metadata__\":{");
    for (int i = 0; i < n; i++) len += (size_t)sprintf(h + len, "%s\"k%d\":\"\"", i ? "," : "", i == dup ? 0 : i);
    len += (size_t)sprintf(h + len, "}}");
    return h;
}

static enum bie_status parse_text(bie_context_t * ctx, const char * header, size_t hl) {
    uint8_t * img = malloc(hl + 8);
    for (int i = 0; i < 8; i++) img[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(img + 8, header, hl);
    bie_safetensors_t * st = NULL;
    const enum bie_status s = bie_safetensors_parse(ctx, img, hl + 8, &st);
    bie_safetensors_free(st);
    free(img);
    return s;
}

static void test_header_time(bie_context_t * ctx) {
    const int n = quick ? 40000 : 160000;
    char * h = many_keys(n, -1);
    const double t0 = seconds();
    CHECK_OK(ctx, parse_text(ctx, h, strlen(h)));
    const double dt = seconds() - t0;
    CHECK(dt < 5.0, "%d metadata keys took %.2f s to parse", n, dt);
    free(h);
    h = many_keys(n, n - 1); // the last key repeats the first
    TEST_EXPECT_STATUS(ctx, parse_text(ctx, h, strlen(h)), BIE_STATUS_FORMAT_ERROR, "duplicate key");
    free(h);
    h = many_keys(3, 2); // a duplicate in a small object
    TEST_EXPECT_STATUS(ctx, parse_text(ctx, h, strlen(h)), BIE_STATUS_FORMAT_ERROR, "duplicate key");
    free(h);
}

static size_t big_header_len;

// A header of big_header_len bytes: one tensor whose shape is [0, 0, 0, ...] (one value per 2 bytes).
static void big_header_child(void) {
    char * h = malloc(big_header_len + 1);
    size_t len = (size_t)sprintf(h, "{\"t\":{\"dtype\":\"U8\",\"data_offsets\":[0,0],\"shape\":[0");
    while (len + 4 < big_header_len) {
        memcpy(h + len, ",0", 2);
        len += 2;
    }
    memcpy(h + len, "]}}", 3);
    len += 3;
    bie_context_t * ctx = NULL;
    bie_context_create(NULL, &ctx);
    CHILD_EXPECT(parse_text(ctx, h, len) == BIE_STATUS_FORMAT_ERROR);
    free(h);
}

static void test_header_memory(void) {
    big_header_len = quick ? (size_t)8 << 20 : (size_t)100 << 20;
    const long long g = test_rss_growth(big_header_child, NULL);
    // The image (the test's copy and the parser's), and at most BIE_JSON_MAX_VALUES parsed values.
    const long long bound = 3 * (long long)big_header_len + (128 << 20);
    CHECK(g >= 0 && g < bound, "a %zu-byte header of 2-byte values: %lld bytes of peak RSS growth (bound %lld)",
          big_header_len, g, bound);
}

// --- IDX gzip ------------------------------------------------------------------------------------------

// gzip of a 4-byte header, the dims, then `zeros` zero bytes (streamed, level 1).
static uint8_t * gzip_idx(const uint8_t * head, size_t head_len, size_t zeros, size_t * out_len) {
    z_stream z;
    memset(&z, 0, sizeof z);
    deflateInit2(&z, 1, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
    size_t cap = zeros / 500 + 4096, len = 0;
    uint8_t * out = malloc(cap);
    static uint8_t zbuf[1 << 16];
    z.next_in = (Bytef *)head;
    z.avail_in = (uInt)head_len;
    size_t left = zeros;
    for (;;) {
        if (z.avail_in == 0 && left) {
            const size_t n = left < sizeof zbuf ? left : sizeof zbuf;
            z.next_in = zbuf;
            z.avail_in = (uInt)n;
            left -= n;
        }
        if (cap - len < 1024) {
            cap *= 2;
            out = realloc(out, cap);
        }
        z.next_out = out + len;
        z.avail_out = (uInt)(cap - len);
        const int r = deflate(&z, left || z.avail_in ? Z_NO_FLUSH : Z_FINISH);
        len = cap - z.avail_out;
        if (r == Z_STREAM_END) break;
    }
    deflateEnd(&z);
    *out_len = len;
    return out;
}

static size_t bomb_zeros;
static bool bomb_bad_header;

static void bomb_child(void) {
    // 0x00 0x00 0x08 3 then dims 256 x 1024 x bomb_zeros/2^18 (a declared size of bomb_zeros bytes)
    uint8_t head[16] = {0, 0, 8, 3, 0, 0, 1, 0, 0, 0, 4, 0};
    const uint32_t d2 = (uint32_t)(bomb_zeros >> 18);
    head[12] = (uint8_t)(d2 >> 24);
    head[13] = (uint8_t)(d2 >> 16);
    head[14] = (uint8_t)(d2 >> 8);
    head[15] = (uint8_t)d2;
    if (bomb_bad_header) head[2] = 0x0d; // f32 elements: not supported
    size_t n = 0;
    uint8_t * gz = gzip_idx(head, sizeof head, bomb_zeros, &n);
    bie_context_t * ctx = NULL;
    bie_context_create(NULL, &ctx);
    struct bie_idx idx;
    const enum bie_status s = bie_idx_parse(ctx, gz, n, "bomb", &idx);
    CHILD_EXPECT(bomb_bad_header ? s == BIE_STATUS_FORMAT_ERROR : s == BIE_STATUS_OK);
    bie_idx_free(&idx);
    free(gz);
}

static void test_idx_bomb(void) {
    bomb_zeros = quick ? (size_t)32 << 20 : (size_t)256 << 20;
    bomb_bad_header = true;
    long long g = test_rss_growth(bomb_child, NULL);
    CHECK(g >= 0 && g < (32 << 20), "gzip of %zu zero bytes behind a bad IDX header: %lld bytes of peak RSS growth",
          bomb_zeros, g);
    bomb_bad_header = false;
    g = test_rss_growth(bomb_child, NULL);
    // What the header declares, once, and the compressed stream (bomb_zeros / 1000).
    CHECK(g >= 0 && g < (long long)bomb_zeros + (32 << 20),
          "a valid %zu-byte IDX gzip: %lld bytes of peak RSS growth (bound: its size + 32 MiB)", bomb_zeros, g);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    quick = getenv("BIE_TEST_QUICK") && *getenv("BIE_TEST_QUICK");
    snprintf(dir, sizeof dir, "/tmp/bie-test-files-XXXXXX");
    if (!mkdtemp(dir)) return 2;
    bie_context_t * ctx = NULL;
    CHECK_OK(ctx, bie_context_create(NULL, &ctx));
    test_modes(ctx);
    test_stale_temps(ctx);
    test_write_checks(ctx);
    test_efbig();
    test_special_files();
    test_size_first();
    test_header_time(ctx);
    test_header_memory();
    test_idx_bomb();
    bie_context_destroy(ctx);
    rmdir(dir);
    return test_finish("test-files");
}
