/*
blas_cores.h — the right OpenBLAS kernels on any x86-64 CPU, for the CPU build's matmuls.

OpenBLAS built with DYNAMIC_ARCH (Debian's and Ubuntu's are) carries kernels for many CPUs
("cores") and picks one when it is loaded, from the CPU's vendor, family and model. A CPU
newer than its tables gets a generic fallback: Debian 12's OpenBLAS 0.3.21 runs its SSE3
`Prescott` kernels on Xeons of family 6 model 207, measured at 67 GFLOP/s for a 1024^3 sgemm
on 2 threads against 308 GFLOP/s with the AVX-512 `SkylakeX` kernels on the same machine.

OpenBLAS reads OPENBLAS_CORETYPE only when it is loaded, so the fix has to come before that:
the program sets the variable and executes itself again, once. `grid_start` does this first
thing, before MPI starts, so every rank of an `mpirun` or `srun` job decides alone and the
same way, and no MPI state is lost in the exec (the process keeps its pid and environment).

  blas_core_choice(core, level)   the decision, a pure function (tests/test_kernels.c checks
                                  it on a table of cases)
  blas_choose_kernels(argv)       ask OpenBLAS, decide, execute again if needed; the line that
                                  says so is kept in blas_kernels_line, which the trainer prints
                                  with its start-up lines (with every rank's kernels, once MPI
                                  has started) and make bench in its header

The rules:
  - a user's own OPENBLAS_CORETYPE is respected (the line says what it asked for);
  - only a core OpenBLAS knows, whose vectors are narrower than the CPU's, is replaced, by the
    core OpenBLAS picks for the first CPUs of the CPU's level (SkylakeX, Haswell, Sandybridge);
    a core name we do not know (another architecture, a newer OpenBLAS) is left alone;
  - the CPU's level counts only what the CPU has and the OS enables (GCC's
    __builtin_cpu_supports checks XCR0), so the choice never runs an instruction it lacks.
Test-only: GRIDGPT_TEST_GENERIC_BLAS=1 with OPENBLAS_CORETYPE=Prescott plays an OpenBLAS that
fell back to Prescott by itself (the variable is then not the user's).
*/
#pragma once
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#ifdef USE_BLAS
#include <cblas.h>
#endif

// the widest vectors a CPU offers, or an OpenBLAS core's sgemm uses
typedef enum { ISA_UNKNOWN, ISA_SSE, ISA_AVX, ISA_AVX2, ISA_AVX512 } IsaLevel;
static inline const char* isa_name(IsaLevel level) {
    static const char* const names[] = {"unknown", "SSE", "AVX", "AVX2", "AVX-512"};
    return names[level];
}

typedef struct {
    const char* core;   // as openblas_get_corename() spells it
    IsaLevel level;
} BlasCore;

// OpenBLAS's x86-64 cores (the names in its driver/others/dynamic.c) by the vectors they use
static const BlasCore BLAS_CORES[] = {
    {"Katmai", ISA_SSE},         {"Coppermine", ISA_SSE}, {"Northwood", ISA_SSE},    {"Prescott", ISA_SSE},
    {"Banias", ISA_SSE},         {"Atom", ISA_SSE},       {"Core2", ISA_SSE},        {"Penryn", ISA_SSE},
    {"Dunnington", ISA_SSE},     {"Nehalem", ISA_SSE},    {"Athlon", ISA_SSE},       {"Opteron", ISA_SSE},
    {"Opteron_SSE3", ISA_SSE},   {"Barcelona", ISA_SSE},  {"Nano", ISA_SSE},         {"Bobcat", ISA_SSE},
    {"Sandybridge", ISA_AVX},    {"Bulldozer", ISA_AVX},  {"Piledriver", ISA_AVX},   {"Steamroller", ISA_AVX},
    {"Haswell", ISA_AVX2},       {"Excavator", ISA_AVX2}, {"Zen", ISA_AVX2},         {"SkylakeX", ISA_AVX512},
    {"Cooperlake", ISA_AVX512},  {"SapphireRapids", ISA_AVX512},
};

static inline IsaLevel blas_core_level(const char* core) {
    for (size_t i = 0; core && i < sizeof(BLAS_CORES) / sizeof(BLAS_CORES[0]); i++)
        if (strcasecmp(core, BLAS_CORES[i].core) == 0) return BLAS_CORES[i].level;
    return ISA_UNKNOWN;
}

// The core to run instead of `core` on a CPU of level `cpu`, or NULL to keep `core`; the
// replacement is what OpenBLAS itself runs on the first CPUs of the CPU's level.
static inline const char* blas_core_choice(const char* core, IsaLevel cpu) {
    IsaLevel have = blas_core_level(core);
    static const char* const core_for_level[] = {NULL, NULL, "Sandybridge", "Haswell", "SkylakeX"};
    if (have == ISA_UNKNOWN || cpu <= have) return NULL;
    return core_for_level[cpu];
}

// This CPU's level, as far as the OS lets programs use it.
static inline IsaLevel cpu_isa_level(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return ISA_AVX2;
    if (__builtin_cpu_supports("avx")) return ISA_AVX;
    return ISA_SSE;
#else
    return ISA_UNKNOWN;
#endif
}

#ifdef USE_BLAS
// ----------------------------------------------------------------------------
// asking OpenBLAS, executing again, the one line

static char blas_kernels_line[320];   // "BLAS: OpenBLAS 0.3.21, Zen kernels (this CPU: AVX2)"
static int blas_restarted;            // this process was executed again with the kernels chosen

// "OpenBLAS 0.3.21" from openblas_get_config()'s "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..."
static const char* openblas_version(char* buf, size_t len) {
    const char* config = openblas_get_config();
    const char* space = strchr(config, ' ');
    size_t n = space ? strcspn(space + 1, " ") + (size_t)(space + 1 - config) : strlen(config);
    snprintf(buf, len, "%.*s", (int)n, config);
    return buf;
}

// after the exec: did OpenBLAS take the core we set?
static void blas_report_choice(const char* found, const char* version, IsaLevel cpu) {
    const char* asked = getenv("OPENBLAS_CORETYPE");
    const char* core = openblas_get_corename();
    blas_restarted = 1;
    if (asked && strcasecmp(core, asked) == 0) {
        snprintf(blas_kernels_line, sizeof(blas_kernels_line), "BLAS: %s, %s kernels: it found %s, a fallback below "
                 "this %s CPU, so gridgpt set OPENBLAS_CORETYPE=%s and restarted once", version, core, found,
                 isa_name(cpu), asked);
    } else {
        snprintf(blas_kernels_line, sizeof(blas_kernels_line), "BLAS: %s, %s kernels (this CPU: %s; it did not take "
                 "OPENBLAS_CORETYPE=%s)", version, core, isa_name(cpu), asked ? asked : "(unset)");
        fprintf(stderr, "warning: %s did not take OPENBLAS_CORETYPE=%s: it still runs its %s kernels "
                "(matmuls may run several times slower)\n", version, asked ? asked : "(unset)", core);
    }
}

static void blas_choose_kernels(char** argv) {
    char version[64], found[64];
    openblas_version(version, sizeof(version));
    snprintf(found, sizeof(found), "%s", openblas_get_corename());
    IsaLevel cpu = cpu_isa_level();
    const char* before_exec = getenv("GRIDGPT_BLAS_FOUND");   // set below, before executing again
    if (before_exec) {
        blas_report_choice(before_exec, version, cpu);
        unsetenv("GRIDGPT_BLAS_FOUND");
        return;
    }
    const char* users = getenv("GRIDGPT_TEST_GENERIC_BLAS") ? NULL : getenv("OPENBLAS_CORETYPE");
    const char* choice = blas_core_choice(found, cpu);
    if (users) {
        snprintf(blas_kernels_line, sizeof(blas_kernels_line), "BLAS: %s, %s kernels, as OPENBLAS_CORETYPE=%s asks "
                 "(this CPU: %s)", version, found, users, isa_name(cpu));
        return;
    }
    snprintf(blas_kernels_line, sizeof(blas_kernels_line), "BLAS: %s, %s kernels (this CPU: %s)", version, found,
             isa_name(cpu));
    if (choice == NULL) return;
    if (!strstr(openblas_get_config(), "DYNAMIC_ARCH")) {
        fprintf(stderr, "warning: %s runs its %s kernels on this %s CPU and, built without DYNAMIC_ARCH, cannot "
                "switch to %s (matmuls may run several times slower)\n", version, found, isa_name(cpu), choice);
        return;
    }
    setenv("OPENBLAS_CORETYPE", choice, 1);
    setenv("GRIDGPT_BLAS_FOUND", found, 1);
    fflush(stdout);
    fflush(stderr);
    execv("/proc/self/exe", argv);
    fprintf(stderr, "warning: could not restart with OPENBLAS_CORETYPE=%s (/proc/self/exe: %s): running %s's %s "
            "kernels\n", choice, strerror(errno), version, found);
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("GRIDGPT_BLAS_FOUND");
}
#else
static inline void blas_choose_kernels(char** argv) { (void)argv; }
#endif
