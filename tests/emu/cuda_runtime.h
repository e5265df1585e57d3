/*
tests/emu/cuda_runtime.h — a CPU emulation of the CUDA subset gridgpt uses (tests only).

Compile kernels.cuh's CUDA kernels with g++ instead of nvcc:
    g++ -std=c++20 -x c++ -D__CUDACC__ -Itests/emu ...
What it covers, and how:
  - LAUNCH(kernel, grid, block, shmem, args...): 1-D grids and blocks, run synchronously.
    Blocks run one after another, in a shuffled order (a kernel may not rely on it).
  - The threads of a block are coroutines (ucontext), one per CUDA thread, each on its own
    stack. A thread runs until it waits at __syncthreads() or in a warp shuffle; a barrier
    opens when every live thread of the block (or warp) is waiting at it, and the waiters
    resume in a shuffled order. So a missing barrier or a wrong shuffle gives wrong numbers,
    and a barrier that not all threads reach is reported (on the GPU it hangs or is UB).
  - __shared__ variables are static, in one linker section that is filled with 0xFF (NaN
    for floats) before every block: reading shared memory before writing it shows up.
  - Device memory is host memory, filled with 0xFF by cudaMalloc, and every runtime and
    cuBLAS call checks that the device ranges it touches lie inside one live allocation.
What it cannot show: timing, races between blocks (they do not overlap), lost updates
without atomics (one OS thread runs everything, so every read-modify-write is atomic),
memory ordering between streams, out-of-bounds accesses inside kernels.
*/
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <functional>
#include <map>

// ----------------------------------------------------------------------------
// qualifiers and the built-in variables

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// all shared variables live in the section emu_shared, poisoned before each block
#define __shared__ __attribute__((section("emu_shared"))) static
extern "C" char __start_emu_shared[], __stop_emu_shared[];

struct uint3 {
    unsigned int x, y, z;
};
typedef uint3 dim3;
inline uint3 threadIdx, blockIdx, blockDim, gridDim;  // set by the scheduler for the running thread

static void emu_fail(const char* fmt, const char* what) {
    fprintf(stderr, "emu error: ");
    fprintf(stderr, fmt, what);
    fprintf(stderr, "\n");
    abort();
}

// ----------------------------------------------------------------------------
// the scheduler: one coroutine per thread of the running block

#define EMU_MAX_BLOCK 1024
#define EMU_STACK_BYTES (128 * 1024)
#define EMU_MAX_SHARED (48 * 1024)

enum EmuState { EMU_RUNNABLE, EMU_AT_SYNCTHREADS, EMU_AT_WARP_SYNC, EMU_EXITED };

struct EmuThread {
    ucontext_t ctx;
    EmuState state;
    unsigned shuffles;  // how many shuffles this thread has done (picks the exchange buffer)
};

struct EmuScheduler {
    EmuThread threads[EMU_MAX_BLOCK];
    char* stacks = NULL;  // EMU_MAX_BLOCK stacks, each with a guard page below it
    ucontext_t home;      // the launching code
    int current = -1;     // running thread, -1 outside kernels
    unsigned block = 0;
    const std::function<void()>* body = NULL;
    uint64_t rng = 0x9E3779B97F4A7C15ull;  // shuffles the order of blocks and of resumed threads
    double exchange[2][EMU_MAX_BLOCK];     // warp shuffles: lane values, double-buffered
    long launches = 0;
};
inline EmuScheduler emu;

static unsigned emu_random(unsigned n) {
    emu.rng ^= emu.rng << 13, emu.rng ^= emu.rng >> 7, emu.rng ^= emu.rng << 17;
    return (unsigned)(emu.rng % n);
}
static void emu_shuffle_order(unsigned* order, unsigned n) {
    for (unsigned i = 0; i < n; i++) order[i] = i;
    for (unsigned i = n; i > 1; i--) {
        unsigned j = emu_random(i), t = order[i - 1];
        order[i - 1] = order[j], order[j] = t;
    }
}

// the running thread stops here until the scheduler resumes it
static void emu_wait(EmuState why) {
    if (emu.current < 0) emu_fail("%s called outside a kernel", why == EMU_AT_SYNCTHREADS ? "__syncthreads" : "a warp shuffle");
    EmuThread* t = &emu.threads[emu.current];
    t->state = why;
    swapcontext(&t->ctx, &emu.home);
}

static void emu_thread_main(void) {
    (*emu.body)();
    emu.threads[emu.current].state = EMU_EXITED;  // returns to emu.home through uc_link
}

// Opens the barriers that every live thread has reached; false when none can open.
static bool emu_open_barriers(void) {
    unsigned n = emu.block, live = 0, at_sync = 0;
    bool opened = false;
    for (unsigned w0 = 0; w0 < n; w0 += 32) {
        unsigned lanes = n - w0 < 32 ? n - w0 : 32, waiting = 0, exited = 0;
        for (unsigned i = w0; i < w0 + lanes; i++) {
            waiting += emu.threads[i].state == EMU_AT_WARP_SYNC;
            exited += emu.threads[i].state == EMU_EXITED;
        }
        if (waiting > 0 && waiting + exited == lanes && (exited > 0 || lanes < 32))
            emu_fail("%s", "warp shuffle with mask 0xffffffff in a warp that has exited or missing lanes");
        if (waiting == 32) {
            for (unsigned i = w0; i < w0 + 32; i++) emu.threads[i].state = EMU_RUNNABLE;
            opened = true;
        }
    }
    if (opened) return true;
    for (unsigned i = 0; i < n; i++) {
        live += emu.threads[i].state != EMU_EXITED;
        at_sync += emu.threads[i].state == EMU_AT_SYNCTHREADS;
    }
    if (live > 0 && at_sync == live) {
        for (unsigned i = 0; i < n; i++)
            if (emu.threads[i].state == EMU_AT_SYNCTHREADS) emu.threads[i].state = EMU_RUNNABLE;
        return true;
    }
    return false;
}

static void emu_run_block(unsigned b) {
    unsigned n = emu.block;
    blockIdx = {b, 0, 0};
    memset(__start_emu_shared, 0xFF, __stop_emu_shared - __start_emu_shared);
    for (unsigned i = 0; i < n; i++) {
        EmuThread* t = &emu.threads[i];
        getcontext(&t->ctx);
        t->ctx.uc_stack.ss_sp = emu.stacks + (size_t)i * (EMU_STACK_BYTES + 4096) + 4096;
        t->ctx.uc_stack.ss_size = EMU_STACK_BYTES;
        t->ctx.uc_link = &emu.home;
        makecontext(&t->ctx, emu_thread_main, 0);
        t->state = EMU_RUNNABLE;
        t->shuffles = 0;
    }
    unsigned order[EMU_MAX_BLOCK];
    for (;;) {
        emu_shuffle_order(order, n);
        for (unsigned k = 0; k < n; k++) {
            unsigned i = order[k];
            if (emu.threads[i].state != EMU_RUNNABLE) continue;
            emu.current = (int)i;
            threadIdx = {i, 0, 0};
            swapcontext(&emu.home, &emu.threads[i].ctx);
        }
        emu.current = -1;
        unsigned exited = 0;
        for (unsigned i = 0; i < n; i++) exited += emu.threads[i].state == EMU_EXITED;
        if (exited == n) return;
        if (!emu_open_barriers())
            emu_fail("%s", "deadlock: threads wait at different barriers (a __syncthreads or shuffle not reached by all)");
    }
}

static void emu_launch(const char* name, unsigned grid, unsigned block, size_t shmem, const std::function<void()>& body) {
    if (block == 0 || block > EMU_MAX_BLOCK) emu_fail("launch of %s: block size must be 1..1024", name);
    if (grid > 0x7fffffffu) emu_fail("launch of %s: grid too large", name);
    if (shmem != 0) emu_fail("launch of %s: dynamic shared memory is not used by the project nor emulated", name);
    if ((size_t)(__stop_emu_shared - __start_emu_shared) > EMU_MAX_SHARED) emu_fail("%s: static shared memory over 48 KiB", name);
    if (emu.stacks == NULL) {
        size_t bytes = (size_t)EMU_MAX_BLOCK * (EMU_STACK_BYTES + 4096);
        emu.stacks = (char*)mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (emu.stacks == MAP_FAILED) emu_fail("%s", "cannot map the thread stacks");
        for (unsigned i = 0; i < EMU_MAX_BLOCK; i++) mprotect(emu.stacks + (size_t)i * (EMU_STACK_BYTES + 4096), 4096, PROT_NONE);
    }
    emu.launches++;
    emu.block = block;
    emu.body = &body;
    blockDim = {block, 1, 1};
    gridDim = {grid, 1, 1};
    // blocks in a shuffled order
    unsigned* order = (unsigned*)malloc((size_t)grid * sizeof(unsigned));
    emu_shuffle_order(order, grid);
    for (unsigned k = 0; k < grid; k++) emu_run_block(order[k]);
    free(order);
    emu.body = NULL;
}

// The project's launch macro (kernels.cuh keeps its own unless one is defined first).
// The arguments are evaluated by each emulated thread; the project passes plain values.
#define LAUNCH(kernel, grid, block, shmem, ...)                                                      \
    do {                                                                                             \
        unsigned int launch_grid_ = (unsigned int)(grid);                                            \
        if (launch_grid_ > 0) emu_launch(#kernel, launch_grid_, (block), (shmem), [&]() { kernel(__VA_ARGS__); }); \
    } while (0)

// ----------------------------------------------------------------------------
// barriers, warp shuffles, atomics

static inline void __syncthreads(void) { emu_wait(EMU_AT_SYNCTHREADS); }

// lane ^ lane_mask's value, once all 32 lanes have offered theirs. Shuffle k of a warp uses
// buffer k % 2: a lane can only come back to a buffer after every lane has read it.
template <class T>
static inline T __shfl_xor_sync(unsigned mask, T val, int lane_mask) {
    if (mask != 0xffffffffu) emu_fail("%s", "__shfl_xor_sync: only the full mask is emulated");
    if (emu.current < 0) emu_fail("%s", "__shfl_xor_sync outside a kernel");
    unsigned i = (unsigned)emu.current, lane = i % 32, buf = emu.threads[i].shuffles++ % 2;
    emu.exchange[buf][i] = (double)val;  // exact for float, double and int
    emu_wait(EMU_AT_WARP_SYNC);
    return (T)emu.exchange[buf][i - lane + ((lane ^ (unsigned)lane_mask) % 32)];
}

// one OS thread runs every emulated thread, so a read-modify-write is atomic as it stands
static inline float atomicAdd(float* p, float v) { float old = *p; *p = old + v; return old; }
static inline double atomicAdd(double* p, double v) { double old = *p; *p = old + v; return old; }

// ----------------------------------------------------------------------------
// runtime API: synchronous, on host memory

typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidDevice = 101,
    cudaErrorIllegalAddress = 700,
} cudaError_t;
typedef enum { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice, cudaMemcpyDefault } cudaMemcpyKind;
typedef struct EmuStream* cudaStream_t;

static const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered (emulated: range outside a device allocation)";
    }
    return "unknown error";
}

inline std::map<uintptr_t, size_t> emu_allocations;  // live device allocations: start -> bytes
inline int emu_device = 0;

// is [p, p + bytes) inside one live device allocation?
static bool emu_is_device_range(const void* p, size_t bytes) {
    uintptr_t a = (uintptr_t)p;
    auto it = emu_allocations.upper_bound(a);
    if (it == emu_allocations.begin()) return false;
    --it;
    return a >= it->first && a - it->first <= it->second && bytes <= it->second - (a - it->first);
}

static cudaError_t cudaGetDeviceCount(int* count) {
    const char* env = getenv("EMU_GPUS");  // how many GPUs the emulated host has (default 8)
    *count = env ? atoi(env) : 8;
    return cudaSuccess;
}
static cudaError_t cudaSetDevice(int device) {
    int count;
    cudaGetDeviceCount(&count);
    if (device < 0 || device >= count) return cudaErrorInvalidDevice;
    emu_device = device;
    return cudaSuccess;
}
static cudaError_t cudaGetLastError(void) { return cudaSuccess; }  // launch errors abort at once
static cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

static cudaError_t cudaMalloc(void** p, size_t bytes) {
    *p = malloc(bytes ? bytes : 1);
    if (*p == NULL) return cudaErrorMemoryAllocation;
    memset(*p, 0xFF, bytes);  // poison: uninitialised floats and bf16s read as NaN
    emu_allocations[(uintptr_t)*p] = bytes;
    return cudaSuccess;
}
template <class T>
static cudaError_t cudaMalloc(T** p, size_t bytes) { return cudaMalloc((void**)p, bytes); }

static cudaError_t cudaFree(void* p) {
    if (p == NULL) return cudaSuccess;
    if (emu_allocations.erase((uintptr_t)p) != 1) return cudaErrorInvalidValue;
    free(p);
    return cudaSuccess;
}
// the emulated device's memory is the host's
static cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
    *free_bytes = *total = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGE_SIZE);
    return cudaSuccess;
}
static cudaError_t cudaMemset(void* p, int value, size_t bytes) {
    if (!emu_is_device_range(p, bytes)) return cudaErrorIllegalAddress;
    memset(p, value, bytes);
    return cudaSuccess;
}
static cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind == cudaMemcpyDefault) dst_dev = emu_is_device_range(dst, bytes), src_dev = emu_is_device_range(src, bytes);
    if ((dst_dev && !emu_is_device_range(dst, bytes)) || (src_dev && !emu_is_device_range(src, bytes))) return cudaErrorIllegalAddress;
    if ((!dst_dev && emu_is_device_range(dst, 1)) || (!src_dev && emu_is_device_range(src, 1))) return cudaErrorInvalidValue;
    memmove(dst, src, bytes);
    return cudaSuccess;
}
