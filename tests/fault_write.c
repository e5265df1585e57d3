/*
tests/fault_write.c — an LD_PRELOAD shim that makes writes to one file fail, as a full disk
or a broken device does, to test that a failed write never becomes a valid checkpoint.

  FAULT_FILE=tensors.bin   writes to files whose path ends with this are counted ...
  FAULT_AFTER=N            ... and once N bytes of them have gone through, every further write
                           fails (FAULT_ERRNO: ENOSPC, the default, or EIO); the write that
                           crosses N is cut short at N (a short write)
  FAULT_SILENT=1           instead, writes past N report success and write nothing (a device
                           that loses data, or an MPI-IO layer that drops an error)
  FAULT_HIDE=name          opening a file whose path ends with this fails with ENOENT (a file
                           that this host cannot see, as on a node without the shared filesystem)
Covers write, pwrite, pwrite64, pwritev, pwritev2 (what MPI-IO uses on Linux). Not stdio's
own writes: glibc's stdio calls its internal write, which an LD_PRELOAD shim cannot replace
(so a full disk under a file written with fprintf is tested with a real full tmpfs).
Build: gcc -shared -fPIC -O1 tests/fault_write.c -o fault_write.so -ldl
*/
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static long long written;   // bytes of matching files that went through, in this process

// how many of n bytes to fd may go through (n, fewer, or 0 with errno set)
static size_t allowed(int fd, size_t n) {
    const char* want = getenv("FAULT_FILE");
    const char* after = getenv("FAULT_AFTER");
    char link[64], path[4096];
    if (!want || !after || n == 0) return n;
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t len = readlink(link, path, sizeof(path) - 1);
    if (len < 0) return n;
    path[len] = '\0';
    size_t w = strlen(want);
    if ((size_t)len < w || strcmp(path + len - w, want) != 0) return n;
    long long left = atoll(after) - written;
    if (left <= 0) {
        const char* e = getenv("FAULT_ERRNO");
        errno = e && !strcmp(e, "EIO") ? EIO : ENOSPC;
        return 0;
    }
    size_t ok = (long long)n < left ? n : (size_t)left;
    written += ok;
    return ok;
}

typedef ssize_t (*WriteFn)(int, const void*, size_t);
typedef ssize_t (*PwriteFn)(int, const void*, size_t, off_t);

// what a refused write returns: -1 (errno set), or with FAULT_SILENT all n bytes, unwritten
static ssize_t refused(size_t n) { return getenv("FAULT_SILENT") ? (ssize_t)n : -1; }

ssize_t write(int fd, const void* buf, size_t n) {
    static WriteFn real = NULL;
    if (!real) real = (WriteFn)dlsym(RTLD_NEXT, "write");
    size_t ok = allowed(fd, n);
    if (ok == 0 && n > 0) return refused(n);
    ssize_t done = real(fd, buf, ok);
    return done == (ssize_t)ok && ok < n && getenv("FAULT_SILENT") ? (ssize_t)n : done;
}
ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
    static PwriteFn real = NULL;
    if (!real) real = (PwriteFn)dlsym(RTLD_NEXT, "pwrite");
    size_t ok = allowed(fd, n);
    if (ok == 0 && n > 0) return refused(n);
    ssize_t done = real(fd, buf, ok, off);
    return done == (ssize_t)ok && ok < n && getenv("FAULT_SILENT") ? (ssize_t)n : done;
}
ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) { return pwrite(fd, buf, n, off); }

// a vector write writes its first buffer only (a short write, which callers must handle)
static ssize_t vector_write(int fd, const struct iovec* iov, int cnt, off_t off) {
    return cnt > 0 ? pwrite(fd, iov[0].iov_base, iov[0].iov_len, off) : 0;
}
ssize_t pwritev(int fd, const struct iovec* iov, int cnt, off_t off) { return vector_write(fd, iov, cnt, off); }
ssize_t pwritev64(int fd, const struct iovec* iov, int cnt, off_t off) { return vector_write(fd, iov, cnt, off); }
ssize_t pwritev2(int fd, const struct iovec* iov, int cnt, off_t off, int flags) {
    (void)flags;
    return vector_write(fd, iov, cnt, off);
}

// open, open64, fopen and fopen64 (data.c's mmap readers, the metadata reader, Open MPI's file layer)
typedef int (*OpenFn)(const char*, int, ...);

static int hidden(const char* path) {
    const char* name = getenv("FAULT_HIDE");
    size_t n = name ? strlen(name) : 0, len = strlen(path);
    return n > 0 && len >= n && strcmp(path + len - n, name) == 0;
}

static int open_unless_hidden(const char* symbol, const char* path, int flags, va_list ap) {
    OpenFn real = (OpenFn)dlsym(RTLD_NEXT, symbol);
    mode_t mode = (flags & (O_CREAT | O_TMPFILE)) ? va_arg(ap, mode_t) : 0;
    if (hidden(path)) {
        errno = ENOENT;
        return -1;
    }
    return real(path, flags, mode);
}

int open(const char* path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    int fd = open_unless_hidden("open", path, flags, ap);
    va_end(ap);
    return fd;
}
int open64(const char* path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    int fd = open_unless_hidden("open64", path, flags, ap);
    va_end(ap);
    return fd;
}
typedef FILE* (*FopenFn)(const char*, const char*);
FILE* fopen(const char* path, const char* mode) {
    static FopenFn real = NULL;
    if (!real) real = (FopenFn)dlsym(RTLD_NEXT, "fopen");
    if (hidden(path)) {
        errno = ENOENT;
        return NULL;
    }
    return real(path, mode);
}
FILE* fopen64(const char* path, const char* mode) { return fopen(path, mode); }
