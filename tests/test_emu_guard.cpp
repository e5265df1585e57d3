/*
tests/test_emu_guard.cpp — the emulation's guard pages (tests/emu/cuda_runtime.h): a kernel
that reads or writes one element outside its cudaMalloc'd buffer is stopped, with a line that
names the kernel; in-bounds use of buffers of awkward sizes is not. Then the rules of the PTX
the fused attention uses (tests/emu/ptx.h) and of dynamic shared memory: an ldmatrix from
global memory or a misaligned row, a cp.async into global memory or from a misaligned source,
an mma half a warp reaches, lanes at different collectives, more than 48 KiB of dynamic shared
memory without the kernel's opt-in, each stopped with a line naming the kernel. Last, the
timing of events (cudaEventElapsedTime, the profiler's) and CUDA's refusals of it.

Build and run: bash tests/test_emu.sh (emulation only: nvcc has no guard pages to test).

Each case runs in a child process (fork), since a caught access ends the process: the
parent checks the child's exit status and its stderr. The kernels below are the classic
off-by-ones, written on purpose: `<=` for `<`, a neighbour at i + 1 or i - 1 with no edge
check. Allocations end exactly at a guard page by default (EMU_GUARD=end) and begin exactly
at one with EMU_GUARD=start, so the past-the-end cases run under the first and the
before-the-start cases under the second.
*/
#include "kernels.cuh"
#include "test.h"
#include <sys/resource.h>
#include <sys/wait.h>

#define GUARD_BLOCK 64

__global__ void copy_kernel(float* out, const float* in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}
__global__ void shift_left_kernel(float* out, const float* in, int n) {  // reads in[n]
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i + 1];
}
__global__ void fill_inclusive_kernel(float* out, int n) {  // writes out[n]
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) out[i] = 1.0f;
}
__global__ void shift_right_kernel(float* out, const float* in, int n) {  // reads in[-1]
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i - 1];
}
__global__ void scatter_back_kernel(float* out, const float* in, int n) {  // writes out[-1]
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i - 1] = in[i];
}
__global__ void write_null_kernel(float* out) { out[threadIdx.x] = 1.0f; }  // not a guard page
// 128-bit copies of packs (kernels/common.cuh's load128/store128), one pack per thread, starting
// `offset` elements into the buffers: the packs are misaligned unless offset % X128 == 0
__global__ void copy_packs_kernel(floatX* out, const floatX* in, int offset, int packs) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < packs) store128(out + offset + i * X128, load128(in + offset + i * X128));
}
__global__ void store_packs_kernel(floatX* out, int offset, int packs) {   // misaligned stores only
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < packs) store128(out + offset + i * X128, zero_pack());
}

// the PTX rules (tests/emu/ptx.h): ldmatrix and cp.async's destination in shared memory, 16-byte
// aligned; cp.async's source in a device allocation, 16-byte aligned; all 32 lanes at every
// mma and ldmatrix, at the same one
__global__ void ldmatrix_global_kernel(const floatX* in) {
    uint32_t r[4];
    ldmatrix_x4(r, in + 8 * (threadIdx.x % 8), false);   // rows of global memory
}
__global__ void ldmatrix_misaligned_kernel(void) {
    __shared__ __align__(16) floatX tile[8 * 16];
    uint32_t r[4];
    ldmatrix_x4(r, tile + 16 * (threadIdx.x % 8) + 4, false);   // 8 bytes past each row's start
}
__global__ void cp_async_to_global_kernel(floatX* out, const floatX* in) {
    cp_async_16(out, in, true);
}
__global__ void cp_async_misaligned_source_kernel(const floatX* in) {
    __shared__ __align__(16) floatX tile[8];
    cp_async_16(tile, in + 1, true);
}
__global__ void mma_divergent_kernel(float* out) {
    float d[4] = {};
    uint32_t a[4] = {}, b0 = 0, b1 = 0;
    if (threadIdx.x < 16) {   // half a warp
        mma_16816(d, a, b0, b1);
        out[threadIdx.x] = d[0];
    }
}
__global__ void mma_and_shuffle_kernel(float* out) {
    float d[4] = {};
    uint32_t a[4] = {}, b0 = 0, b1 = 0;
    if (threadIdx.x % 2) mma_16816(d, a, b0, b1);   // the odd lanes multiply, the even ones shuffle
    else d[0] = __shfl_xor_sync(0xffffffffu, d[0], 1);
    out[threadIdx.x] = d[0];
}
__global__ void dynamic_shared_kernel(float* out) {
    out[threadIdx.x] = 0.0f;
}

// ----------------------------------------------------------------------------
// running a case in a child process

typedef void (*Case)(int n);

typedef struct {
    int status;       // as waitpid reports it
    char err[2048];   // the child's stderr
} ChildResult;

// runs one_case(n) in a child with EMU_GUARD=guard; the child exits 0 if it returns
static ChildResult run_in_child(Case one_case, int n, const char* guard) {
    ChildResult r = {};
    int fds[2];
    if (pipe(fds) != 0) return r;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit no_core = {0, 0};  // the aborts below are expected: no core files
        setrlimit(RLIMIT_CORE, &no_core);
        setenv("EMU_GUARD", guard, 1);
        close(fds[0]);
        dup2(fds[1], 2);
        one_case(n);
        _exit(0);
    }
    close(fds[1]);
    size_t used = 0;
    ssize_t got;
    while ((got = read(fds[0], r.err + used, sizeof r.err - 1 - used)) > 0) used += (size_t)got;
    close(fds[0]);
    waitpid(pid, &r.status, 0);
    return r;
}

static bool child_succeeded(const ChildResult& r) { return WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0; }

static const char* first_line(const ChildResult& r) {
    static char line[512];
    snprintf(line, sizeof line, "%.*s", (int)strcspn(r.err, "\n"), r.err);
    return line;
}

// ----------------------------------------------------------------------------
// the cases: each allocates n floats in and out, fills in with 0..n-1 and runs one kernel

static float* dev_iota(int n) {
    float* host = (float*)malloc((size_t)n * sizeof(float));
    for (int i = 0; i < n; i++) host[i] = (float)i;
    float* d = (float*)dev_malloc((size_t)n * sizeof(float));
    host_to_dev(d, host, (size_t)n * sizeof(float));
    free(host);
    return d;
}

// in bounds: the copy must be exact, and the buffers must sit where EMU_GUARD says
static void copy_case(int n) {
    float *in = dev_iota(n), *out = (float*)dev_malloc((size_t)n * sizeof(float));
    LAUNCH(copy_kernel, CEIL_DIV(n, GUARD_BLOCK), GUARD_BLOCK, 0, out, in, n);
    float* host = (float*)malloc((size_t)n * sizeof(float));
    dev_to_host(host, out, (size_t)n * sizeof(float));
    for (int i = 0; i < n; i++)
        if (host[i] != (float)i) _exit(3);
    uintptr_t page = emu_page_bytes(), edge = emu_guard_at_start() ? (uintptr_t)out : (uintptr_t)(out + n);
    if (edge % page != 0 || (uintptr_t)out % alignof(float) != 0) _exit(4);
    free(host);
    dev_free(in);
    dev_free(out);
}

static void shift_left_case(int n) {
    float *in = dev_iota(n), *out = (float*)dev_malloc((size_t)n * sizeof(float));
    LAUNCH(shift_left_kernel, CEIL_DIV(n, GUARD_BLOCK), GUARD_BLOCK, 0, out, in, n);
}
static void fill_inclusive_case(int n) {
    float* out = (float*)dev_malloc((size_t)n * sizeof(float));
    LAUNCH(fill_inclusive_kernel, CEIL_DIV(n + 1, GUARD_BLOCK), GUARD_BLOCK, 0, out, n);
}
static void shift_right_case(int n) {
    float *in = dev_iota(n), *out = (float*)dev_malloc((size_t)n * sizeof(float));
    LAUNCH(shift_right_kernel, CEIL_DIV(n, GUARD_BLOCK), GUARD_BLOCK, 0, out, in, n);
}
static void scatter_back_case(int n) {
    float *in = dev_iota(n), *out = (float*)dev_malloc((size_t)n * sizeof(float));
    LAUNCH(scatter_back_kernel, CEIL_DIV(n, GUARD_BLOCK), GUARD_BLOCK, 0, out, in, n);
}
static void write_null_case(int n) {
    (void)dev_malloc((size_t)n * sizeof(float));  // the handler is installed
    LAUNCH(write_null_kernel, 1, GUARD_BLOCK, 0, (float*)NULL);
}

// packs of 8 floatX, `offset` elements into page-aligned buffers (EMU_GUARD=start)
static void copy_packs_case(int offset) {
    const int packs = 100;
    floatX *in = (floatX*)dev_malloc((packs + 1) * X128 * sizeof(floatX)), *out = (floatX*)dev_malloc((packs + 1) * X128 * sizeof(floatX));
    dev_zero(in, (packs + 1) * X128 * sizeof(floatX));
    LAUNCH(copy_packs_kernel, CEIL_DIV(packs, GUARD_BLOCK), GUARD_BLOCK, 0, out, in, offset, packs);
}
static void store_packs_case(int offset) {
    const int packs = 100;
    floatX* out = (floatX*)dev_malloc((packs + 1) * X128 * sizeof(floatX));
    LAUNCH(store_packs_kernel, CEIL_DIV(packs, GUARD_BLOCK), GUARD_BLOCK, 0, out, offset, packs);
}
static void ldmatrix_global_case(int n) {
    floatX* in = (floatX*)dev_malloc((size_t)n * sizeof(floatX));
    LAUNCH(ldmatrix_global_kernel, 1, 32, 0, in);
}
static void ldmatrix_misaligned_case(int n) {
    (void)n;
    LAUNCH(ldmatrix_misaligned_kernel, 1, 32, 0);
}
static void cp_async_to_global_case(int n) {
    floatX* in = (floatX*)dev_malloc((size_t)n * sizeof(floatX));
    floatX* out = (floatX*)dev_malloc((size_t)n * sizeof(floatX));
    LAUNCH(cp_async_to_global_kernel, 1, 32, 0, out, in);
}
static void cp_async_misaligned_source_case(int n) {
    floatX* in = (floatX*)dev_malloc((size_t)n * sizeof(floatX));
    LAUNCH(cp_async_misaligned_source_kernel, 1, 32, 0, in);
}
static void mma_divergent_case(int n) {
    float* out = (float*)dev_malloc((size_t)n * sizeof(float));
    LAUNCH(mma_divergent_kernel, 1, 32, 0, out);
}
static void mma_and_shuffle_case(int n) {
    float* out = (float*)dev_malloc((size_t)n * sizeof(float));
    LAUNCH(mma_and_shuffle_kernel, 1, 32, 0, out);
}
// n bytes of dynamic shared memory; n < 0: -n bytes after the kernel's opt-in for them
static void dynamic_shared_case(int n) {
    float* out = (float*)dev_malloc(32 * sizeof(float));
    size_t bytes = (size_t)(n < 0 ? -n : n);
    if (n < 0) cudaCheck(cudaFuncSetAttribute(dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    LAUNCH(dynamic_shared_kernel, 1, 32, bytes, out);
}

// ----------------------------------------------------------------------------

static void test_in_bounds(void) {
    const int sizes[] = {1, 3, 4097, 1024};  // 1024 floats: exactly one page, no padding
    const char* guards[] = {"end", "start"};
    for (const char* guard : guards)
        for (int n : sizes) {
            ChildResult r = run_in_child(copy_case, n, guard);
            char label[128];
            snprintf(label, sizeof label, "emu guard: in-bounds copy of %d float%s runs clean (EMU_GUARD=%s)", n, n == 1 ? "" : "s", guard);
            check(child_succeeded(r), label, "status %#x: %s", r.status, first_line(r));
        }
}

// the child must fail with one line naming the kernel, the access, and the distance
static void expect_caught(Case one_case, int n, const char* guard, const char* kernel, const char* access, const char* where) {
    ChildResult r = run_in_child(one_case, n, guard);
    char label[200], want_kernel[96];
    snprintf(label, sizeof label, "emu guard: %s (%d floats, EMU_GUARD=%s) is caught: %s", kernel, n, guard, where);
    snprintf(want_kernel, sizeof want_kernel, "emu error: kernel %s (block ", kernel);
#if !defined(__x86_64__)
    access = "touches";  // the CPU does not tell reads from writes there
#endif
    bool named = strstr(r.err, want_kernel) && strstr(r.err, access) && strstr(r.err, where);
    check(!child_succeeded(r) && named, label, "status %#x, stderr: %s", r.status, first_line(r));
    printf("    %s\n", first_line(r));
}

static void test_caught(void) {
    const int sizes[] = {3, 4097};
    for (int n : sizes) {
        expect_caught(shift_left_case, n, "end", "shift_left_kernel", "reads", "1 byte past its last byte");
        expect_caught(fill_inclusive_case, n, "end", "fill_inclusive_kernel", "writes", "1 byte past its last byte");
        expect_caught(shift_right_case, n, "start", "shift_right_kernel", "reads", "4 bytes before its first byte");
        expect_caught(scatter_back_case, n, "start", "scatter_back_kernel", "writes", "4 bytes before its first byte");
    }
}

// a fault outside the guard pages keeps its ordinary ending (death by SIGSEGV), after a hint
static void test_other_faults(void) {
    ChildResult r = run_in_child(write_null_case, 3, "end");
    bool by_segv = WIFSIGNALED(r.status) && WTERMSIG(r.status) == SIGSEGV;
    check(by_segv && strstr(r.err, "kernel write_null_kernel") && !strstr(r.err, "emu error"),
          "emu guard: a NULL write in a kernel still dies of SIGSEGV, the kernel named", "status %#x, stderr: %s", r.status, first_line(r));
}

// a 128-bit load or store at an address that is not 16-byte aligned stops the kernel with one
// line naming it (the GPU's "misaligned address"); aligned ones run clean
static void test_misaligned(void) {
    ChildResult r = run_in_child(copy_packs_case, 0, "start");
    check(child_succeeded(r), "emu alignment: aligned 128-bit loads and stores run clean", "status %#x: %s", r.status, first_line(r));
    struct { Case one_case; int offset; const char *kernel, *access, *where; } cases[] = {
        {copy_packs_case, 1, "copy_packs_kernel", "reads 16 bytes at misaligned address", "(2 bytes past a 16-byte boundary"},
        {copy_packs_case, 4, "copy_packs_kernel", "reads 16 bytes at misaligned address", "(8 bytes past a 16-byte boundary"},
        {store_packs_case, 3, "store_packs_kernel", "writes 16 bytes at misaligned address", "(6 bytes past a 16-byte boundary"},
    };
    for (const auto& c : cases) {
        r = run_in_child(c.one_case, c.offset, "start");
        char label[200], want_kernel[96];
        snprintf(label, sizeof label, "emu alignment: %s %d elements off a 16-byte boundary is caught", c.kernel, c.offset);
        snprintf(want_kernel, sizeof want_kernel, "emu error: kernel %s (block ", c.kernel);
        bool named = strstr(r.err, want_kernel) && strstr(r.err, c.access) && strstr(r.err, c.where) &&
                     strstr(r.err, "-byte device allocation at ");
        check(!child_succeeded(r) && named, label, "status %#x, stderr: %s", r.status, first_line(r));
        printf("    %s\n", first_line(r));
    }
}

// a broken PTX or shared-memory rule: the child ends with an emu error line that names the kernel and the rule
static void expect_emu_error(Case one_case, int n, const char* kernel, const char* rule) {
    ChildResult r = run_in_child(one_case, n, "start");   // "start": allocations begin page-aligned
    char label[200], want_kernel[96];
    snprintf(label, sizeof label, "emu PTX: %s is caught: %s", kernel, rule);
    snprintf(want_kernel, sizeof want_kernel, "%s", kernel);
    check(!child_succeeded(r) && strstr(r.err, "emu error") && strstr(r.err, want_kernel) && strstr(r.err, rule), label,
          "status %#x, stderr: %s", r.status, first_line(r));
    printf("    %s\n", first_line(r));
}

// cudaEventElapsedTime as CUDA's (the profiler's device spans, trace.h): the milliseconds between
// two records, and its refusals: an event made without timing or never recorded (invalid
// resource handle), one whose record waits in a held-back stream (not ready) until it runs.
// In the child, with its stream held back (EMU_DEFER_STREAMS=1); a wrong answer exits 1 naming it.
static void event_timing_case(int n) {
    (void)n;
    setenv("EMU_DEFER_STREAMS", "1", 1);
    cudaEvent_t a, b, untimed, never;
    cudaStream_t side;
    cudaCheck(cudaEventCreateWithFlags(&a, cudaEventDefault));
    cudaCheck(cudaEventCreateWithFlags(&b, cudaEventDefault));
    cudaCheck(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&never, cudaEventDefault));
    cudaCheck(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    float ms = -1.0f;
    const char* wrong = NULL;
    cudaCheck(cudaEventRecord(a, 0));
    usleep(20000);
    cudaCheck(cudaEventRecord(b, 0));
    cudaCheck(cudaEventRecord(untimed, 0));
    if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess || !(ms >= 20.0f && ms < 1000.0f)) wrong = "20 ms slept between two records";
    else if (cudaEventElapsedTime(&ms, a, untimed) != cudaErrorInvalidResourceHandle) wrong = "an event made with cudaEventDisableTiming";
    else if (cudaEventElapsedTime(&ms, a, never) != cudaErrorInvalidResourceHandle) wrong = "an event never recorded";
    if (!wrong) {
        cudaCheck(cudaEventRecord(b, side));   // held back in the side stream's queue
        if (cudaEventElapsedTime(&ms, a, b) != cudaErrorNotReady) wrong = "an event whose record has not run yet";
        cudaCheck(cudaStreamSynchronize(side));
        if (!wrong && cudaEventElapsedTime(&ms, a, b) != cudaSuccess) wrong = "the same event once its stream ran";
    }
    if (wrong) {
        fprintf(stderr, "cudaEventElapsedTime is wrong on %s (%.3f ms)\n", wrong, ms);
        _exit(1);
    }
}

int main(void) {
    kernels_init(0);
    test_in_bounds();
    test_caught();
    test_other_faults();
    test_misaligned();
    expect_emu_error(ldmatrix_global_case, 1024, "ldmatrix_global_kernel", "ldmatrix.x4: the address is not in shared memory");
    expect_emu_error(ldmatrix_misaligned_case, 0, "ldmatrix_misaligned_kernel", "ldmatrix.x4: the address is not 16-byte aligned");
    expect_emu_error(cp_async_to_global_case, 1024, "cp_async_to_global_kernel", "cp.async: the address is not in shared memory");
    expect_emu_error(cp_async_misaligned_source_case, 1024, "cp_async_misaligned_source_kernel",
                     "cp.async: the source is not 16-byte aligned");
    expect_emu_error(mma_divergent_case, 1024, "mma_divergent_kernel", "in a warp that has exited or missing lanes");
    expect_emu_error(mma_and_shuffle_case, 1024, "mma_and_shuffle_kernel", "wait at different warp-collective instructions");
    expect_emu_error(dynamic_shared_case, 64 * 1024, "dynamic_shared_kernel", "65536 bytes of dynamic shared memory, over its limit of 49152");
    ChildResult r = run_in_child(dynamic_shared_case, -64 * 1024, "start");
    check(child_succeeded(r), "emu shared memory: 64 KiB of dynamic shared memory after cudaFuncSetAttribute's opt-in runs",
          "status %#x: %s", r.status, first_line(r));
    r = run_in_child(event_timing_case, 0, "end");
    check(child_succeeded(r), "emu events: cudaEventElapsedTime gives the 20 ms slept between two records, and refuses as "
          "CUDA does an event without timing or never recorded (invalid resource handle) and one held back (not ready)",
          "status %#x: %s", r.status, first_line(r));
    return tests_summary();
}
