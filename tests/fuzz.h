/*
tests/fuzz.h — what the libFuzzer targets share (tests/fuzz_data.c, fuzz_merges.c,
fuzz_safetensors.c): a broken rule's line and abort (libFuzzer reports it as a crash with its
input), a private folder on tmpfs for each input's files (/dev/shm, else $TMPDIR or /tmp; made
on the first call, emptied and removed at exit), and writing a file whole. A target defines
FUZZ_NAME before including it.
*/
#pragma once
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void fuzz_fail(const char* what, const char* detail) {
    fprintf(stderr, "%s: %s: %s\n", FUZZ_NAME, what, detail);
    abort();
}

static char fuzz_dir[4000];

static void fuzz_remove_work_dir(void) {
    DIR* d = opendir(fuzz_dir);
    char path[4400];
    for (struct dirent* e; d && (e = readdir(d)) != NULL;)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", fuzz_dir, e->d_name);
            unlink(path);
        }
    if (d) closedir(d);
    rmdir(fuzz_dir);
}

static const char* fuzz_work_dir(void) {
    if (fuzz_dir[0]) return fuzz_dir;
    const char* base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(fuzz_dir, sizeof fuzz_dir, "%s/%s.XXXXXX", base, FUZZ_NAME);
    if (mkdtemp(fuzz_dir) == NULL) fuzz_fail(fuzz_dir, strerror(errno));
    atexit(fuzz_remove_work_dir);
    return fuzz_dir;
}

static void fuzz_write_file(const char* path, const uint8_t* p, size_t n) {
    FILE* f = fopen(path, "wb");
    if (f == NULL || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) fuzz_fail(path, "cannot write");
}
