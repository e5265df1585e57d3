/*
tests/test.h — the few lines every test program shares.

A test program prints one line per check, `PASS name` or `FAIL name: why`, and ends with
`N passed, M failed`; its exit status is non-zero when anything failed. `make test` runs
every program and adds the counts up. TEST_STOP_AT_FAIL=1 ends the program at its first FAIL
(a planted bug needs only one, tests/test_emu.sh).
*/
#pragma once
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int tests_passed = 0, tests_failed = 0;

// record one check; `why` is printed only when it failed
static void check(int ok, const char* name, const char* why_fmt, ...) {
    if (ok) {
        tests_passed++;
        printf("PASS %s\n", name);
    } else {
        tests_failed++;
        printf("FAIL %s: ", name);
        va_list ap;
        va_start(ap, why_fmt);
        vprintf(why_fmt, ap);
        va_end(ap);
        printf("\n");
    }
    fflush(stdout);
    if (!ok && getenv("TEST_STOP_AT_FAIL")) exit(1);
}

static int tests_summary(void) {
    printf("%d passed, %d failed\n", tests_passed, tests_failed);
    return tests_failed ? 1 : 0;
}
