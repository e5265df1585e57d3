/*
files.h — the files a user names, opened in one place; and the one way an input error is told.

Every file gridgpt reads by name (a dataset's .idx and .bin, a vocabulary and its merges, a
checkpoint's metadata and tensors, a Hugging Face config.json, index or safetensors file) is
opened by open_regular_file: without blocking, and refused unless it is a regular file. A FIFO
named as one of them once held start-up until it was killed; a directory, a device or a socket
is never what the user meant. The refusal names the path and what it is instead.
(preprocess's --input is the exception, read by the caller: a pipe is a fair way to feed it.)

Errors: a function that fails on bad input writes one line into (err, errlen) with error_line
and returns 1; its caller decides between an input error (exit 2) and a failure of the run.
*/
#pragma once
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>

// A message's control characters as \xNN (in place, cut at cap bytes): a name a file gave us (a
// tensor's, decoded from a JSON "\n") once split an error into two lines.
static int is_control_character(char c) { return (unsigned char)c < 0x20 || c == 0x7f; }
static void escape_control_characters(char* s, size_t cap) {
    size_t n = strlen(s), controls = 0;
    for (size_t i = 0; i < n; i++) controls += is_control_character(s[i]);
    if (controls == 0) return;
    char* copy = (char*)malloc(n + 1);
    if (copy == NULL) return;
    memcpy(copy, s, n + 1);
    size_t out = 0;
    for (size_t i = 0; i < n; i++) {
        int control = is_control_character(copy[i]);
        if (out + (control ? 4 : 1) >= cap) break;
        if (control) out += (size_t)snprintf(s + out, 5, "\\x%02x", (unsigned char)copy[i]);
        else s[out++] = copy[i];
    }
    s[out] = '\0';
    free(copy);
}

// Write the message into err (if given), one line, and return 1, so callers can `return error_line(...)`.
static int error_line(char* err, size_t errlen, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static int error_line(char* err, size_t errlen, const char* fmt, ...) {
    if (err == NULL || errlen == 0) return 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    escape_control_characters(err, errlen);
    return 1;
}

// what a file that is not a regular one is, in words
static const char* file_kind(mode_t mode) {
    return S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO (named pipe)" : S_ISSOCK(mode) ? "a socket"
         : S_ISCHR(mode) || S_ISBLK(mode)                ? "a device" : "not a regular file";
}

// the system's reason an open of a named file failed (ELOOP's own words name no loop)
static const char* open_error(int error) {
    return error == ELOOP ? "a loop of symbolic links (or more than 40 in a row)" : strerror(error);
}

// path opened for reading: its descriptor, or -1 with "PATH: why" in err (errno kept: ENOENT
// tells a missing file from a bad one). O_NONBLOCK so that a FIFO's open returns at once; it is
// cleared again for the reads of a regular file.
static int open_regular_file(const char* path, char* err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        int error = errno;
        error_line(err, errlen, "%s: %s", path, open_error(error));
        errno = error;
        return -1;
    }
    struct stat st;
    int failed = fstat(fd, &st) != 0 ? error_line(err, errlen, "%s: %s", path, strerror(errno))
               : !S_ISREG(st.st_mode) ? error_line(err, errlen, "%s: is %s, expected a regular file", path, file_kind(st.st_mode))
                                      : 0;
    if (failed) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

// the same as a stdio stream, for readers that go line by line
static FILE* fopen_regular_file(const char* path, char* err, size_t errlen) {
    int fd = open_regular_file(path, err, errlen);
    FILE* f = fd < 0 ? NULL : fdopen(fd, "rb");
    if (fd >= 0 && !f) { error_line(err, errlen, "%s: %s", path, strerror(errno)); close(fd); }
    return f;
}

// rm -rf path: a directory's entries first, then the directory; links are removed, never followed
static inline int remove_tree(const char* path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode)) return unlink(path);
    DIR* d = opendir(path);
    if (!d) return -1;
    int status = 0;
    for (struct dirent* e; (e = readdir(d)) != NULL;) {
        char child[4400];
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (snprintf(child, sizeof(child), "%s/%s", path, e->d_name) >= (int)sizeof(child)) {
            status = -1;   // (a path too long to name: left)
            continue;
        }
        status |= remove_tree(child);
    }
    closedir(d);
    return status == 0 ? rmdir(path) : -1;
}
