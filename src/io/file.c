// SPDX-License-Identifier: Apache-2.0
// file.c: bounded reads of regular files, and atomic writes (temporary file, fsync, rename,
// directory fsync) that leave the process's state (its umask) alone.
#define _GNU_SOURCE
#include "io-util.h"

#include <dirent.h>
#include <signal.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

// --- reading -------------------------------------------------------------------------------------------

enum bie_status bie_file_open_read(bie_context_t * ctx, const char * path, size_t max_size, int * out_fd,
                                   size_t * out_size) {
    *out_fd = -1;
    *out_size = 0;
    // O_NONBLOCK: opening a FIFO without a writer would otherwise wait forever.
    const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) return bie_set_error(ctx, BIE_STATUS_IO_ERROR, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        const int e = errno;
        close(fd);
        return bie_set_error(ctx, BIE_STATUS_IO_ERROR, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return bie_set_error(ctx, BIE_STATUS_IO_ERROR, "%s: not a regular file (%s)", path,
                             S_ISDIR(sb.st_mode)                          ? "a directory"
                             : S_ISFIFO(sb.st_mode)                       ? "a FIFO"
                             : S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) ? "a device"
                                                                          : "a special file");
    }
    if (sb.st_size < 0 || (uint64_t)sb.st_size > (uint64_t)max_size) {
        close(fd);
        return bie_set_error(ctx, BIE_STATUS_FORMAT_ERROR, "%s: file of %lld bytes is larger than the limit of %zu",
                             path, (long long)sb.st_size, max_size);
    }
    *out_fd = fd;
    *out_size = (size_t)sb.st_size;
    return BIE_STATUS_OK;
}

enum bie_status bie_file_read_at(bie_context_t * ctx, const char * path, int fd, void * buf, size_t n,
                                 uint64_t offset) {
    uint8_t * p = buf;
    while (n) {
        const ssize_t got = pread(fd, p, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n, (off_t)offset);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return bie_set_error(ctx, BIE_STATUS_IO_ERROR, "%s: read error: %s", path, strerror(errno));
        if (got == 0)
            return bie_set_error(ctx, BIE_STATUS_FORMAT_ERROR, "%s: truncated (the file shrank while being read)",
                                 path);
        p += got;
        n -= (size_t)got;
        offset += (uint64_t)got;
    }
    return BIE_STATUS_OK;
}

enum bie_status bie_read_file(bie_context_t * ctx, const char * path, size_t max_size, uint8_t ** out,
                              size_t * out_size) {
    *out = NULL;
    *out_size = 0;
    int fd;
    size_t size;
    BIE_TRY(bie_file_open_read(ctx, path, max_size, &fd, &size));
    uint8_t * buf = malloc(size ? size : 1);
    if (!buf) {
        close(fd);
        return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "%s: out of memory for %zu bytes", path, size);
    }
    const enum bie_status s = bie_file_read_at(ctx, path, fd, buf, size, 0);
    close(fd);
    if (s != BIE_STATUS_OK) {
        free(buf);
        return s;
    }
    *out = buf;
    *out_size = size;
    return BIE_STATUS_OK;
}

// --- writing -------------------------------------------------------------------------------------------

// Temporary files are "<name>.tmp.<pid>.<6 hex digits>" next to the target "<name>": the pid tells
// whether their writer is still alive.
#define TMP_TAG ".tmp."

// The writer of a temporary file named `rest` ("<pid>.<suffix>") is a process that no longer exists.
static bool writer_gone(const char * rest) {
    char * end = NULL;
    errno = 0;
    const long pid = strtol(rest, &end, 10);
    if (errno || end == rest || *end != '.' || pid <= 0 || pid > INT32_MAX) return false;
    if ((pid_t)pid == getpid()) return false; // this process's own writers may be in flight
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

// Removes the temporary files of `base` in dirfd whose writers died (killed during a write).
static void remove_stale_temps(int dirfd, const char * base) {
    const int fd = dup(dirfd);
    if (fd < 0) return;
    DIR * d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    const size_t bl = strlen(base), tl = strlen(TMP_TAG);
    for (struct dirent * e; (e = readdir(d));)
        if (strncmp(e->d_name, base, bl) == 0 && strncmp(e->d_name + bl, TMP_TAG, tl) == 0 &&
            writer_gone(e->d_name + bl + tl))
            unlinkat(dirfd, e->d_name, 0);
    closedir(d);
}

// write(2) all of buf, through partial writes and signals.
static int write_all(int fd, const void * buf, size_t n) {
    const uint8_t * p = buf;
    while (n) {
        const ssize_t w = write(fd, p, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return errno;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static enum bie_status write_error(bie_context_t * ctx, const char * path, const char * what, int e) {
    if (e == EFBIG)
        return bie_set_error(ctx, BIE_STATUS_IO_ERROR, "%s: %s failed: the file size limit is reached (ulimit -f; %s)",
                             path, what, strerror(e));
    return bie_set_error(ctx, BIE_STATUS_IO_ERROR, "%s: %s failed: %s", path, what, strerror(e));
}

enum bie_status bie_write_file_atomic(bie_context_t * ctx, const char * path, size_t n_parts,
                                      const void * const * parts, const size_t * sizes) {
    // Split path into its directory (opened, to name files relative to it and fsync it) and name.
    const char * slash = strrchr(path, '/');
    const char * base = slash ? slash + 1 : path;
    if (!*base) return bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT, "%s: is a directory name", path);
    char * dname = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dname) return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
    const int dirfd = open(dname, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(dname);
    if (dirfd < 0)
        return bie_set_error(ctx, BIE_STATUS_IO_ERROR, "%s: cannot open its directory: %s", path, strerror(errno));
    remove_stale_temps(dirfd, base);
    // The new file gets the mode a plain creat() would give (0666 less the umask, applied by the
    // kernel: the umask is neither read nor changed); a replaced file keeps its own mode.
    struct stat old;
    const bool replacing = fstatat(dirfd, base, &old, 0) == 0 && S_ISREG(old.st_mode);
    const mode_t mode = replacing ? (old.st_mode & 0777) : 0666;
    const size_t tmp_size = strlen(base) + 48;
    char * tmp = malloc(tmp_size);
    if (!tmp) {
        close(dirfd);
        return bie_set_error(ctx, BIE_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    int fd = -1, e = 0;
    static unsigned counter; // with the time and pid: a name no other writer has
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        const unsigned r = (unsigned)t.tv_nsec ^ (__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) * 2654435761u);
        snprintf(tmp, tmp_size, "%s" TMP_TAG "%d.%06x", base, (int)getpid(), r & 0xffffffu);
        fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
        e = fd < 0 ? errno : 0;
        if (fd < 0 && e != EEXIST) break;
    }
    if (fd < 0) {
        free(tmp);
        close(dirfd);
        return bie_set_error(ctx, BIE_STATUS_IO_ERROR, "%s: cannot create a temporary file: %s", path, strerror(e));
    }
    const char * what = "write";
    if (replacing && fchmod(fd, mode) != 0) e = errno;
    for (size_t i = 0; !e && i < n_parts; i++)
        if (sizes[i]) e = write_all(fd, parts[i], sizes[i]);
    if (!e && fsync(fd) != 0) {
        e = errno;
        what = "fsync";
    }
    if (close(fd) != 0 && !e) {
        e = errno;
        what = "close";
    }
    if (!e && renameat(dirfd, tmp, dirfd, base) != 0) {
        e = errno;
        what = "rename";
    }
    if (e) {
        unlinkat(dirfd, tmp, 0);
        free(tmp);
        close(dirfd);
        return write_error(ctx, path, what, e);
    }
    free(tmp);
    // The rename itself is durable only once the directory is on disk. (Some file systems cannot
    // fsync a directory: EINVAL, nothing to do there.)
    if (fsync(dirfd) != 0 && errno != EINVAL) {
        e = errno;
        close(dirfd);
        return bie_set_error(ctx, BIE_STATUS_IO_ERROR, "%s: written, but its directory could not be synced: %s", path,
                             strerror(e));
    }
    close(dirfd);
    return BIE_STATUS_OK;
}
