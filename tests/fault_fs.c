/*
tests/fault_fs.c — an LD_PRELOAD shim that counts the file-system calls a process makes under
one directory and kills the process at, or fails, the k-th: the crash-point method of SQLite's
tests and of "All File Systems Are Not Created Equal" (Pillai et al., OSDI 2014), for
tests/test_crash_points.sh.

  FAULT_DIR=DIR        calls on paths under DIR (or on descriptors of files under it) count
  FAULT_AT=K           the K-th counted call (1-based) ...
  FAULT_MODE=kill      ... is never made: the process dies there (SIGKILL, as a power cut does
                       to a process; what reached the disk before it stays), or
  FAULT_MODE=fail      ... fails with EIO, and the process goes on, or
  FAULT_MODE=delay     ... is made FAULT_DELAY seconds late (a busy parallel file system);
                       without FAULT_AT, every counted call is
  FAULT_MODE=signal    ... is made after the process receives FAULT_SIGNAL (default 15,
                       SIGTERM): a job stopped in the middle of that step, or
  FAULT_MODE=hold      ... is made once the file FAULT_RELEASE exists; while it waits, the file
                       FAULT_RELEASE.held exists (so a test can run another process at exactly
                       that point of this one: the interleaving of two jobs, deterministically)
  FAULT_CALLS=a,b      only calls of these names count (as FAULT_COUNT's list names them)
  FAULT_RANK=R         only the process whose launcher rank (OMPI_COMM_WORLD_RANK; a
                       process started alone is rank 0) is R counts (default: every process)
  FAULT_COUNT=FILE     at exit, the number of counted calls is written to FILE (the sweep's
                       length), with one line per call ("N name path") in FILE.calls

Counted: open, open64, openat, openat64 and creat when they create or write (open and open64
for reading too, as open_read, where FAULT_CALLS names it), mkdir, rename,
renameat, unlink, unlinkat, rmdir, write, pwrite, pwrite64, pwritev, ftruncate, ftruncate64,
fsync, fdatasync: what checkpoint.h and Open MPI's MPI-IO (ompio) call to save. Not counted:
reads, and stdio's own writes (glibc calls its internal write, which a shim cannot replace;
checkpoint.h writes its small files with write(2) for this reason).
Build: gcc -shared -fPIC -O1 tests/fault_fs.c -o fault_fs.so -ldl
*/
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static long counted;   // calls counted so far in this process
static FILE* call_log;

static int this_process_counts(void) {
    const char* want = getenv("FAULT_RANK");
    const char* rank = getenv("OMPI_COMM_WORLD_RANK");
    return getenv("FAULT_DIR") && (!want || strcmp(want, rank ? rank : "0") == 0);   // one process: rank 0
}

static int under_dir(const char* path) {
    const char* dir = getenv("FAULT_DIR");
    char resolved[4096];
    if (!path || !dir) return 0;
    size_t n = strlen(dir);
    if (strncmp(path, dir, n) == 0 && (path[n] == '/' || path[n] == '\0')) return 1;
    // a relative path, or one through another spelling: compare its folder's real path
    char copy[4096];
    snprintf(copy, sizeof(copy), "%s", path);
    char* slash = strrchr(copy, '/');
    if (slash) *slash = '\0';
    else snprintf(copy, sizeof(copy), ".");
    if (!realpath(copy, resolved)) return 0;
    char real_dir[4096];
    if (!realpath(dir, real_dir)) return 0;
    n = strlen(real_dir);
    return strncmp(resolved, real_dir, n) == 0 && (resolved[n] == '/' || resolved[n] == '\0');
}

static const char* fd_path(int fd, char* buf, size_t len) {
    char link[64];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, buf, len - 1);
    if (n < 0) return NULL;
    buf[n] = '\0';
    return buf;
}

static void write_count(void) {
    const char* file = getenv("FAULT_COUNT");
    if (!file || !this_process_counts()) return;
    FILE* f = fopen(file, "w");
    if (f) fprintf(f, "%ld\n", counted), fclose(f);
    if (call_log) fclose(call_log);
}

// 0: make the call; -1: fail it (errno set). Kills the process at the chosen call.
static int named(const char* name) {
    const char* calls = getenv("FAULT_CALLS");
    if (!calls) return 1;
    size_t n = strlen(name);
    for (const char* p = strstr(calls, name); p; p = strstr(p + 1, name))
        if ((p == calls || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return 1;
    return 0;
}

#define REAL(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))

// FAULT_MODE=hold: FAULT_RELEASE.held made, then wait (polled) for FAULT_RELEASE
static void hold_until_released(void) {
    const char* release = getenv("FAULT_RELEASE");
    char held[4200];
    struct stat st;
    if (!release) return;
    snprintf(held, sizeof(held), "%s.held", release);
    int fd = REAL(open)(held, O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) close(fd);
    while (stat(release, &st) != 0) usleep(20000);
}

static int fault_at(const char* name, const char* path) {
    if (!this_process_counts() || !named(name) || !under_dir(path)) return 0;
    counted++;
    const char* file = getenv("FAULT_COUNT");
    if (file && !call_log) {
        char calls[4200];
        snprintf(calls, sizeof(calls), "%s.calls", file);
        call_log = fopen(calls, "w");
        atexit(write_count);
    }
    if (call_log) fprintf(call_log, "%ld %s %s\n", counted, name, path), fflush(call_log);
    const char* at = getenv("FAULT_AT");
    const char* mode = getenv("FAULT_MODE");
    int delaying = mode && strcmp(mode, "delay") == 0;
    if (at ? atol(at) != counted : !delaying) return 0;   // a delay without FAULT_AT: every call
    if (delaying) {
        sleep((unsigned)atoi(getenv("FAULT_DELAY") ? getenv("FAULT_DELAY") : "5"));
        return 0;
    }
    if (mode && strcmp(mode, "signal") == 0) {
        raise(getenv("FAULT_SIGNAL") ? atoi(getenv("FAULT_SIGNAL")) : SIGTERM);
        return 0;
    }
    if (mode && strcmp(mode, "hold") == 0) {
        hold_until_released();
        return 0;
    }
    if (mode && strcmp(mode, "fail") == 0) {
        errno = EIO;
        return -1;
    }
    raise(SIGKILL);
    return -1;
}

// A call that is not failed leaves errno as the real call will: the path checks' readlink and
// realpath once set it to EINVAL in the middle of Open MPI's error handling (its message's
// write), which then reported an EIO as "Invalid argument".
static int fault_point(const char* name, const char* path) {
    int e = errno, rc = fault_at(name, path);
    if (rc == 0) errno = e;
    return rc;
}

static int fd_fault(const char* name, int fd) {
    char buf[4096];
    int e = errno, rc = fault_at(name, fd_path(fd, buf, sizeof(buf)));
    if (rc == 0) errno = e;
    return rc;
}

static int writes(int flags) { return (flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC)) != 0; }

// an open for reading counts only where FAULT_CALLS names open_read (the sweeps count writes)
static int read_fault(const char* path) { return getenv("FAULT_CALLS") && fault_point("open_read", path); }

int open(const char* path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = (flags & O_CREAT) ? va_arg(ap, mode_t) : 0;
    va_end(ap);
    if (writes(flags) ? fault_point("open", path) : read_fault(path)) return -1;
    return REAL(open)(path, flags, mode);
}
int open64(const char* path, int flags, ...) {   // on 64-bit Linux the same call as open
    va_list ap;
    va_start(ap, flags);
    mode_t mode = (flags & O_CREAT) ? va_arg(ap, mode_t) : 0;
    va_end(ap);
    return open(path, flags, mode);
}
int openat(int dirfd, const char* path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = (flags & O_CREAT) ? va_arg(ap, mode_t) : 0;
    va_end(ap);
    if (writes(flags) && fault_point("openat", path)) return -1;
    return REAL(openat)(dirfd, path, flags, mode);
}
int openat64(int dirfd, const char* path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = (flags & O_CREAT) ? va_arg(ap, mode_t) : 0;
    va_end(ap);
    return openat(dirfd, path, flags, mode);
}
int creat(const char* path, mode_t mode) { return fault_point("creat", path) ? -1 : REAL(creat)(path, mode); }
int mkdir(const char* path, mode_t mode) { return fault_point("mkdir", path) ? -1 : REAL(mkdir)(path, mode); }
int rmdir(const char* path) { return fault_point("rmdir", path) ? -1 : REAL(rmdir)(path); }
int unlink(const char* path) { return fault_point("unlink", path) ? -1 : REAL(unlink)(path); }
int unlinkat(int dirfd, const char* path, int flags) {
    return fault_point("unlinkat", path) ? -1 : REAL(unlinkat)(dirfd, path, flags);
}
int rename(const char* from, const char* to) { return fault_point("rename", to) ? -1 : REAL(rename)(from, to); }
int renameat(int fromfd, const char* from, int tofd, const char* to) {
    return fault_point("renameat", to) ? -1 : REAL(renameat)(fromfd, from, tofd, to);
}
ssize_t write(int fd, const void* buf, size_t n) { return fd_fault("write", fd) ? -1 : REAL(write)(fd, buf, n); }
ssize_t pwrite(int fd, const void* buf, size_t n, off_t at) {
    return fd_fault("pwrite", fd) ? -1 : REAL(pwrite)(fd, buf, n, at);
}
ssize_t pwrite64(int fd, const void* buf, size_t n, off_t at) {
    return fd_fault("pwrite", fd) ? -1 : REAL(pwrite64)(fd, buf, n, at);
}
ssize_t pwritev(int fd, const struct iovec* iov, int count, off_t at) {
    return fd_fault("pwritev", fd) ? -1 : REAL(pwritev)(fd, iov, count, at);
}
int ftruncate(int fd, off_t length) { return fd_fault("ftruncate", fd) ? -1 : REAL(ftruncate)(fd, length); }
int ftruncate64(int fd, off_t length) { return fd_fault("ftruncate", fd) ? -1 : REAL(ftruncate64)(fd, length); }
int fsync(int fd) { return fd_fault("fsync", fd) ? -1 : REAL(fsync)(fd); }
int fdatasync(int fd) { return fd_fault("fdatasync", fd) ? -1 : REAL(fdatasync)(fd); }
