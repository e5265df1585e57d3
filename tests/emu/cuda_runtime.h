/*
tests/emu/cuda_runtime.h — a CPU emulation of the CUDA subset gridgpt uses (tests only).

Compile kernels.cuh's CUDA kernels with g++ instead of nvcc:
    g++ -std=c++20 -x c++ -D__CUDACC__ -Itests/emu ...
What it covers, and how:
  - LAUNCH(kernel, grid, block, shmem, args...): 1-D grids and blocks, run synchronously.
    Blocks run one after another, in a shuffled order (a kernel may not rely on it). The
    shuffles of a launch are drawn from the kernel's name and how many times that kernel was
    launched before, never from the other kernels run in between: two runs that launch one
    kernel as often in the same order get the same orders for it however many other launches
    differ (a run with activation recomputation launches more forward kernels, and its
    atomic kernel, encoder_backward's, must add in the same order to give the same bits).
  - The threads of a block are coroutines, one per CUDA thread, each on its own stack (on
    x86-64 switched by a few instructions of our own; elsewhere by ucontext). A thread runs
    until it waits at __syncthreads() or a warp-collective instruction (a shuffle; mma,
    ldmatrix: tests/emu/ptx.h); a barrier opens when every live thread of
    the block (or warp) is waiting at it, and the waiters resume in a shuffled order. A warp
    whose barrier opens goes on at once, ahead of the other warps, up to the next
    __syncthreads. So a missing barrier or a wrong shuffle gives wrong numbers, and a barrier
    that not all threads reach is reported (on the GPU it hangs or is UB).
  - __shared__ variables are static, in one linker section that is filled with 0xFF (NaN
    for floats) before every block: reading shared memory before writing it shows up.
  - Device memory is host memory, filled with 0xFF by cudaMalloc, and every runtime and
    cuBLAS call checks that the device ranges it touches lie inside one live allocation.
  - Out-of-bounds accesses inside kernels: every cudaMalloc gets a mapping of its own
    between two inaccessible guard pages and ends exactly where the trailing one begins, so
    a kernel that reads or writes even one byte past the end faults; a SIGSEGV handler then
    prints one line that names the kernel, its block and thread, the allocation and how far
    outside it the access was, and aborts like every emu error. EMU_GUARD=start in the
    environment makes allocations begin exactly where the leading guard page ends instead:
    an index of -1 faults the same way. cudaFree unmaps, so freed memory faults too (until
    its addresses are mapped again).
    The price is alignment: ending at a page boundary, an allocation starts aligned to the
    largest power of two that divides its size (at most a page), where CUDA gives 256 bytes.
    That is still the alignment of any one type whose array fills the allocation (the size
    is a multiple of it), so gridgpt does not notice, and x86 does not fault on misaligned
    loads anyway. EMU_GUARD=start gives page-aligned allocations.
  - 128-bit accesses (kernels/common.cuh's load128/store128, through the CHECK_ALIGNED_128 hook):
    each must be 16-byte aligned, as the GPU requires ("misaligned address"); one that is not
    stops the run with a line naming the kernel, block, thread, the address and its place in
    its allocation. (Under EMU_GUARD=end an allocation whose size is not a multiple of 16
    starts less aligned: kernels/common.cuh's packs then take their element-by-element path.)
  - Streams and events (cudaStreamCreateWithFlags, cudaEventRecord, cudaStreamWaitEvent):
    by default every call runs at once on whatever stream it is queued, so work queued on a
    second stream before what it must wait for has run (a missing comm_waits_for_compute)
    reads what is there too early and gives wrong numbers. EMU_DEFER_STREAMS=1 holds the work
    queued on a created stream (not stream 0) back in that stream's queue until something
    needs it: a cudaStreamWaitEvent on an event recorded behind it, a synchronize. Then the
    compute stream running ahead of the communication it should wait for (a missing
    compute_waits_for_comm) reads what is not written yet and gives wrong numbers too. A
    test runs both ways.
  - CUDA graphs by stream capture (cudaStreamBeginCapture ... cudaStreamEndCapture,
    cudaGraphInstantiate, cudaGraphExecUpdate, cudaGraphLaunch): what is queued on a capturing
    stream (kernel launches, cuBLAS and cuBLASLt calls, cudaMemcpyAsync) is recorded with its
    arguments as they are at the call, as CUDA copies a kernel's parameters at capture, and
    not run; a launched graph runs its records in the order they were queued (a single
    stream's capture is such a chain). An update takes a new capture's records where they are
    the same kernels (or the same library calls) in the same order, and is refused otherwise
    (cudaErrorGraphExecUpdateFailure), as CUDA refuses a changed topology. Inside a capture,
    what CUDA refuses is refused (cudaErrorStreamCaptureUnsupported: a cudaMemcpy, a
    cudaMalloc or cudaFree, a synchronize), and work queued on stream 0 is an emu error: on
    the GPU it would run at once, outside the graph.
What it cannot show: timing, races between blocks (they do not overlap), lost updates
without atomics (one OS thread runs everything, so every read-modify-write is atomic),
orders between streams other than those two extremes. Out-of-bounds accesses it misses (the slack): at the end
that is not exact, those that stay in the allocation's partial last page, up to a page
minus one byte (under the default EMU_GUARD=end a read at index -1 gets the 0xFF poison and
a write there goes unseen, unless the size is a whole number of pages); those from one
buffer into another that shares its allocation (the trainer's activation arena, its flat
parameter and gradient buffers: only their outer ends are guarded); a wild access that
jumps past a guard page into other mapped memory (an ordinary segmentation fault, or none).
*/
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>
#include <deque>
#include <functional>
#include <map>
#include <tuple>
#include <vector>

// ----------------------------------------------------------------------------
// qualifiers and the built-in variables

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
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
// coroutines: switching between the launching code and the threads of a block
// glibc's swapcontext also saves and restores the signal mask, a system call each time, and
// an emulated training run switches hundreds of millions of times: that call alone was 40% of
// the emulated tests' time. On x86-64 a switch is what the System V ABI asks a function call
// to keep: push the callee-saved registers, swap the stack pointers, pop the other thread's
// (everything else the calling code has already saved; the kernels never change MXCSR or the
// x87 control word). Elsewhere, ucontext.

#if defined(__x86_64__)
struct EmuContext {
    void* sp;   // where the registers were pushed, at its last switch away
};
// emu_switch_stacks(&from->sp, to->sp): a weak symbol, as every program includes this header once
extern "C" void emu_switch_stacks(void** save_sp, void* resume_sp);
asm(".text\n"
    ".weak emu_switch_stacks\n"
    ".type emu_switch_stacks, @function\n"
    "emu_switch_stacks:\n"
    "    pushq %rbp\n    pushq %rbx\n    pushq %r12\n    pushq %r13\n    pushq %r14\n    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n    popq %r14\n    popq %r13\n    popq %r12\n    popq %rbx\n    popq %rbp\n"
    "    ret\n"
    ".size emu_switch_stacks, .-emu_switch_stacks\n");
static void emu_switch(EmuContext* from, EmuContext* to) { emu_switch_stacks(&from->sp, to->sp); }
// a context whose first switch to it calls entry() on the stack [base, base + bytes) (bytes and
// base 16-byte aligned); entry must never return
static void emu_make_context(EmuContext* c, char* base, size_t bytes, void (*entry)(void)) {
    void** top = (void**)(base + bytes);
    *--top = NULL;                              // entry's return address: none; keeps the ABI's alignment
    *--top = (void*)entry;                      // the first switch's ret goes there
    for (int k = 0; k < 6; k++) *--top = NULL;  // rbp, rbx, r12 to r15
    c->sp = top;
}
#else
struct EmuContext {
    ucontext_t uc;
};
static void emu_switch(EmuContext* from, EmuContext* to) { swapcontext(&from->uc, &to->uc); }
static void emu_make_context(EmuContext* c, char* base, size_t bytes, void (*entry)(void)) {
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = base;
    c->uc.uc_stack.ss_size = bytes;
    c->uc.uc_link = NULL;   // entry never returns
    makecontext(&c->uc, entry, 0);
}
#endif

// ----------------------------------------------------------------------------
// the scheduler: one coroutine per thread of the running block

#define EMU_MAX_BLOCK 1024
#define EMU_STACK_BYTES (128 * 1024)
#define EMU_MAX_SHARED (48 * 1024)          // static, and dynamic without an opt-in
#define EMU_MAX_BLOCK_SHARED (227 * 1024)   // a block's all (sm_90's limit)
#define CEIL_128(n) (((n) + 127) / 128 * 128)

enum EmuState { EMU_RUNNABLE, EMU_AT_SYNCTHREADS, EMU_AT_WARP_SYNC, EMU_EXITED };

// a cp.async in flight (tests/emu/ptx.h): its 16 bytes land at dst when a wait_group completes it
struct EmuCopy {
    char* dst;
    char data[16];
    int bytes;   // 16, or 4
    int group;   // the commit group it belongs to, -1 before its commit_group
};

struct EmuThread {
    EmuContext ctx;
    EmuState state;
    unsigned shuffles;       // how many shuffles this thread has done (picks the exchange buffer)
    const char* collective;  // the warp-collective instruction it waits at (EMU_AT_WARP_SYNC)
    std::vector<EmuCopy> copies;   // its cp.async copies in flight
    int groups;                    // how many commit groups it has closed
    unsigned ptx_collectives;      // how many mma and ldmatrix it has done (picks the exchange buffer)
    unsigned barriers;             // how many __syncthreads it has passed (orders its work: tests/emu/ptx.h's turns)
};

struct EmuScheduler {
    EmuThread threads[EMU_MAX_BLOCK];
    char* stacks = NULL;  // EMU_MAX_BLOCK stacks, each with a guard page below it
    EmuContext home;      // the launching code
    int current = -1;     // running thread, -1 outside kernels
    unsigned block = 0;
    const std::function<void()>* body = NULL;
    uint64_t rng = 0x9E3779B97F4A7C15ull;  // shuffles the order of blocks and of resumed threads
    double exchange[2][EMU_MAX_BLOCK];     // warp shuffles: lane values, double-buffered
    unsigned arrived[EMU_MAX_BLOCK / 32];  // each warp's lanes waiting at a warp barrier or exited
    long launches = 0;
    const char* kernel = NULL;  // the kernel being launched (for the fault report), NULL between launches
    struct { uint64_t name; long launches; } kernels[256];  // launches of each kernel so far, by name hash
    uint32_t ptx_exchange[2][EMU_MAX_BLOCK][6];   // mma, ldmatrix: each lane's offer (tests/emu/ptx.h)
    char* dynamic_shared = NULL;                  // the launch's dynamic shared memory, NULL when none
    size_t dynamic_shared_bytes = 0;
    std::map<const void*, size_t> max_dynamic_shared;   // cudaFuncSetAttribute's opt-ins, by kernel
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

// A launch's shuffles start from its kernel's name and that kernel's launch count (SplitMix64).
// EMU_ORDERS=name: from the name alone, every launch of a kernel in one order, so that a run
// resumed from a checkpoint (a new process: its launch counts start again at 0) adds a
// kernel's atomics (encoder_backward's) in the uninterrupted run's order (test_emu_train.sh)
static uint64_t emu_launch_seed(const char* kernel) {
    static int by_name = -1;
    if (by_name < 0) by_name = getenv("EMU_ORDERS") && strcmp(getenv("EMU_ORDERS"), "name") == 0;
    uint64_t name = 0xcbf29ce484222325ull;   // FNV-1a
    for (const char* p = kernel; *p; p++) name = (name ^ (unsigned char)*p) * 0x100000001b3ull;
    unsigned k = 0;
    while (k < 256 && emu.kernels[k].name != 0 && emu.kernels[k].name != name) k++;
    if (k == 256) emu_fail("%s", "more than 256 kernels");
    emu.kernels[k].name = name;
    uint64_t x = name + 0x9E3779B97F4A7C15ull * (uint64_t)(by_name ? 0 : ++emu.kernels[k].launches);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x ? x : 1;   // xorshift needs a state other than 0
}

// the running thread stops here until the scheduler resumes it
static void emu_wait(EmuState why) {
    if (emu.current < 0) emu_fail("%s called outside a kernel", why == EMU_AT_SYNCTHREADS ? "__syncthreads" : "a warp shuffle");
    EmuThread* t = &emu.threads[emu.current];
    t->state = why;
    emu_switch(&t->ctx, &emu.home);
}

static void emu_thread_main(void) {
    (*emu.body)();
    EmuThread* t = &emu.threads[emu.current];
    t->state = EMU_EXITED;
    emu_switch(&t->ctx, &emu.home);   // never resumed
    abort();
}

// Opens the warp barrier of the warp starting at thread w0 when all its lanes have reached it
// (and all at the same instruction); true when it opened. Nothing to do (false, and no fault to
// find) until each lane waits there or has exited: emu.arrived counts them.
static bool emu_open_warp(unsigned w0) {
    unsigned n = emu.block, lanes = n - w0 < 32 ? n - w0 : 32, waiting = 0, exited = 0;
    for (unsigned i = w0; i < w0 + lanes; i++) {
        waiting += emu.threads[i].state == EMU_AT_WARP_SYNC;
        exited += emu.threads[i].state == EMU_EXITED;
    }
    if (waiting > 0 && waiting + exited == lanes && (exited > 0 || lanes < 32))
        emu_fail("kernel %s: a warp-collective instruction (a shuffle, mma or ldmatrix: all 32 lanes) in a warp that has exited or missing lanes", emu.kernel);
    if (waiting < 32) return false;
    for (unsigned i = w0 + 1; i < w0 + 32; i++)
        if (strcmp(emu.threads[i].collective, emu.threads[w0].collective) != 0) {
            char line[300];
            snprintf(line, sizeof line, "kernel %s: the lanes of warp %u wait at different warp-collective instructions (%s, %s)",
                     emu.kernel, w0 / 32, emu.threads[w0].collective, emu.threads[i].collective);
            emu_fail("%s", line);
        }
    for (unsigned i = w0; i < w0 + 32; i++) emu.threads[i].state = EMU_RUNNABLE;
    emu.arrived[w0 / 32] -= 32;
    return true;
}

// Opens the barriers that every live thread has reached; false when none can open.
static bool emu_open_barriers(void) {
    unsigned n = emu.block, live = 0, at_sync = 0;
    bool opened = false;
    for (unsigned w0 = 0; w0 < n; w0 += 32) opened |= emu_open_warp(w0);
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

// thread i of the block, ready to run the kernel from its start
static void emu_thread_start(unsigned i) {
    EmuThread* t = &emu.threads[i];
    emu_make_context(&t->ctx, emu.stacks + (size_t)i * (EMU_STACK_BYTES + 4096) + 4096, EMU_STACK_BYTES, emu_thread_main);
    t->state = EMU_RUNNABLE;
    t->shuffles = 0;
    t->collective = NULL;
    t->copies.clear();
    t->groups = 0;
    t->ptx_collectives = 0;
    t->barriers = 0;
}

// Runs the block's threads in rounds, each runnable thread in a shuffled order until it waits or
// exits. A warp whose last lane reaches a warp barrier goes on at once, before the rest of the
// round (its lanes in a shuffled order): a warp can run far ahead of the block's other
// warps, up to their next __syncthreads, so a kernel that reads what another warp has not yet
// written (a missing __syncthreads) reads the poison.
static void emu_run_block(unsigned b) {
    unsigned n = emu.block;
    blockIdx = {b, 0, 0};
    memset(__start_emu_shared, 0xFF, __stop_emu_shared - __start_emu_shared);
    if (emu.dynamic_shared) memset(emu.dynamic_shared, 0xFF, emu.dynamic_shared_bytes);
    for (unsigned i = 0; i < n; i++) emu_thread_start(i);
    memset(emu.arrived, 0, sizeof emu.arrived);
    std::vector<unsigned> order(n);
    unsigned lanes[32];
    for (;;) {
        order.resize(n);
        emu_shuffle_order(order.data(), n);
        for (size_t k = 0; k < order.size(); k++) {
            unsigned i = order[k];
            if (emu.threads[i].state != EMU_RUNNABLE) continue;
            emu.current = (int)i;
            threadIdx = {i, 0, 0};
            emu_switch(&emu.home, &emu.threads[i].ctx);
            emu.current = -1;
            unsigned w0 = i - i % 32, lanes_in_warp = n - w0 < 32 ? n - w0 : 32;
            EmuState now = emu.threads[i].state;
            if (now == EMU_AT_WARP_SYNC || now == EMU_EXITED) emu.arrived[w0 / 32]++;
            if (now == EMU_AT_WARP_SYNC && emu.arrived[w0 / 32] == lanes_in_warp && emu_open_warp(w0)) {
                emu_shuffle_order(lanes, 32);   // next, before the rest of the round
                for (unsigned& lane : lanes) lane += w0;
                order.insert(order.begin() + (long)k + 1, lanes, lanes + 32);
            }
        }
        unsigned exited = 0;
        for (unsigned i = 0; i < n; i++) exited += emu.threads[i].state == EMU_EXITED;
        if (exited == n) return;
        if (!emu_open_barriers())
            emu_fail("kernel %s: deadlock: threads wait at different barriers (a __syncthreads, shuffle, mma or ldmatrix not reached by all)", emu.kernel);
    }
}

// Dynamic shared memory, as CUDA has it: up to 48 KiB per block as it is; more only after
// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) raised the
// kernel's limit to at least the launch's, up to what one block may have (227 KiB on sm_90,
// the most of the GPUs the project builds for). It is poisoned (0xFF) before every block.
static void emu_set_dynamic_shared(const char* name, const void* kernel, size_t shmem) {
    auto opted = emu.max_dynamic_shared.find(kernel);
    size_t limit = opted == emu.max_dynamic_shared.end() ? EMU_MAX_SHARED : opted->second;
    char line[300];
    if (shmem > limit) {
        snprintf(line, sizeof line, "launch of %s: %zu bytes of dynamic shared memory, over its limit of %zu "
                 "(above 48 KiB a kernel needs cudaFuncSetAttribute(..., cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) first)",
                 name, shmem, limit);
        emu_fail("%s", line);
    }
    if ((size_t)(__stop_emu_shared - __start_emu_shared) + shmem > EMU_MAX_BLOCK_SHARED) {
        snprintf(line, sizeof line, "launch of %s: static and dynamic shared memory over %d bytes", name, EMU_MAX_BLOCK_SHARED);
        emu_fail("%s", line);
    }
    free(emu.dynamic_shared);
    emu.dynamic_shared = shmem ? (char*)aligned_alloc(128, CEIL_128(shmem)) : NULL;
    emu.dynamic_shared_bytes = shmem;
}

static void emu_launch(const char* name, const void* kernel, unsigned grid, unsigned block, size_t shmem,
                       const std::function<void()>& body) {
    if (block == 0 || block > EMU_MAX_BLOCK) emu_fail("launch of %s: block size must be 1..1024", name);
    if (grid > 0x7fffffffu) emu_fail("launch of %s: grid too large", name);
    if ((size_t)(__stop_emu_shared - __start_emu_shared) > EMU_MAX_SHARED) emu_fail("%s: static shared memory over 48 KiB", name);
    emu_set_dynamic_shared(name, kernel, shmem);
    if (emu.stacks == NULL) {
        size_t bytes = (size_t)EMU_MAX_BLOCK * (EMU_STACK_BYTES + 4096);
        emu.stacks = (char*)mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (emu.stacks == MAP_FAILED) emu_fail("%s", "cannot map the thread stacks");
        for (unsigned i = 0; i < EMU_MAX_BLOCK; i++) mprotect(emu.stacks + (size_t)i * (EMU_STACK_BYTES + 4096), 4096, PROT_NONE);
    }
    emu.launches++;
    emu.kernel = name;
    emu.rng = emu_launch_seed(name);
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
    emu.kernel = NULL;
}

// what `extern __shared__` names in a kernel: the launch's dynamic shared memory
static inline void* emu_dynamic_shared_memory(void) { return emu.dynamic_shared; }

// The project's launch macro (kernels/common.cuh keeps its own unless one is defined first). The
// arguments are evaluated once, at the launch, into the kernel's parameter types (as CUDA copies
// them), and the launch is queued on the project's compute stream (device.cuh's compute_stream):
// run at once, or recorded while that stream is captured into a graph.
template <class... P>
std::tuple<P...> emu_params_of(void (*)(P...));   // (the types only: never called)
#define LAUNCH(kernel, grid, block, shmem, ...)                                                          \
    do {                                                                                                 \
        unsigned int launch_grid_ = (unsigned int)(grid);                                                \
        if (launch_grid_ > 0) {                                                                          \
            auto launch_args_ = decltype(emu_params_of(kernel))(__VA_ARGS__);                            \
            unsigned int launch_block_ = (block);                                                        \
            size_t launch_shmem_ = (shmem);                                                              \
            emu_on_stream(compute_stream, [=]() {                                                        \
                emu_launch(#kernel, (const void*)&kernel, launch_grid_, launch_block_, launch_shmem_,    \
                           [&]() { std::apply(kernel, launch_args_); });                                 \
            }, (const void*)&kernel);                                                                    \
        }                                                                                                \
    } while (0)

// ----------------------------------------------------------------------------
// barriers, warp shuffles, atomics

static inline void __syncthreads(void) {
    emu_wait(EMU_AT_SYNCTHREADS);
    emu.threads[emu.current].barriers++;
}

// lane ^ lane_mask's value, once all 32 lanes have offered theirs. Shuffle k of a warp uses
// buffer k % 2: a lane can only come back to a buffer after every lane has read it.
template <class T>
static inline T __shfl_xor_sync(unsigned mask, T val, int lane_mask) {
    if (mask != 0xffffffffu) emu_fail("%s", "__shfl_xor_sync: only the full mask is emulated");
    if (emu.current < 0) emu_fail("%s", "__shfl_xor_sync outside a kernel");
    unsigned i = (unsigned)emu.current, lane = i % 32, buf = emu.threads[i].shuffles++ % 2;
    emu.exchange[buf][i] = (double)val;  // exact for float, double and int
    emu.threads[i].collective = "__shfl_xor_sync";
    emu_wait(EMU_AT_WARP_SYNC);
    return (T)emu.exchange[buf][i - lane + ((lane ^ (unsigned)lane_mask) % 32)];
}

// one OS thread runs every emulated thread, so a read-modify-write is atomic as it stands
static inline float atomicAdd(float* p, float v) { float old = *p; *p = old + v; return old; }
static inline double atomicAdd(double* p, double v) { double old = *p; *p = old + v; return old; }
static inline unsigned int atomicAdd(unsigned int* p, unsigned int v) { unsigned int old = *p; *p = old + v; return old; }
// blocks run one after another: every write is seen by the blocks after it
static inline void __threadfence(void) {}

// ----------------------------------------------------------------------------
// runtime API: synchronous, on host memory

typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorGraphExecUpdateFailure = 910,
} cudaError_t;
typedef enum { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice, cudaMemcpyDefault } cudaMemcpyKind;
// a graph: what a capture recorded, in order, each with what it runs (a kernel, or a library
// call's name) for cudaGraphExecUpdate's comparison
struct EmuGraphNode {
    const void* what;
    std::function<void()> op;
};
struct EmuGraph {
    std::vector<EmuGraphNode> nodes;
};
// a created stream: the work EMU_DEFER_STREAMS holds back, in the order it was queued; the
// graph it is being captured into (NULL: none)
struct EmuStream {
    std::deque<std::function<void()>> queue;
    EmuGraph* capture = NULL;
};
inline int emu_captures = 0;   // streams being captured now
typedef struct EmuStream* cudaStream_t;
#define cudaStreamNonBlocking 0x01
inline std::vector<cudaStream_t> emu_streams;   // every live created stream
static bool emu_defer_streams(void) {
    static int defer = -1;
    if (defer < 0) defer = getenv("EMU_DEFER_STREAMS") && strcmp(getenv("EMU_DEFER_STREAMS"), "1") == 0;
    return defer == 1;
}
// run `op` now, or (EMU_DEFER_STREAMS=1, a created stream) when the stream is next flushed, or
// record it (`what` it runs) in the graph the stream is being captured into
static void emu_on_stream(cudaStream_t stream, std::function<void()> op, const void* what = NULL) {
    if (stream && stream->capture) stream->capture->nodes.push_back({what, std::move(op)});
    else if (!stream && emu_captures > 0)
        emu_fail("%s", "work queued on stream 0 while a stream is captured into a CUDA graph: on the GPU it runs at once, "
                       "outside the graph (queue it on the capturing stream)");
    else if (stream && emu_defer_streams()) stream->queue.push_back(std::move(op));
    else op();
}
// run the stream's held work in order, until `done` says stop (NULL: all of it)
static void emu_stream_flush(cudaStream_t stream, const std::function<bool()>& done) {
    while (stream && !stream->queue.empty() && !(done && done())) {
        std::function<void()> op = std::move(stream->queue.front());
        stream->queue.pop_front();
        op();
    }
}

static const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered (emulated: range outside a device allocation)";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorGraphExecUpdateFailure: return "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update";
    }
    return "unknown error";
}

// ----------------------------------------------------------------------------
// device memory: each allocation in a mapping of its own, between two guard pages
//
//   [ guard page | padding   allocation | guard page ]    EMU_GUARD=end (the default)
//   [ guard page | allocation   padding | guard page ]    EMU_GUARD=start
//
// The padding (what is left of the last page: none when the size is a whole number of
// pages) is poisoned like the allocation. A kernel that touches a guard page faults, and
// emu_on_segv names the kernel and the allocation.

struct EmuAllocation {
    char* start;
    size_t bytes;
    char* mapping;  // the whole mapping, guard pages included
    size_t mapping_bytes;
};
inline std::map<uintptr_t, EmuAllocation> emu_allocations;  // live device allocations by start

static size_t emu_page_bytes(void) {
    static const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return page;
}

// is [p, p + bytes) inside one live device allocation?
static bool emu_is_device_range(const void* p, size_t bytes) {
    uintptr_t a = (uintptr_t)p;
    auto it = emu_allocations.upper_bound(a);
    if (it == emu_allocations.begin()) return false;
    --it;
    size_t size = it->second.bytes;
    return a >= it->first && a - it->first <= size && bytes <= size - (a - it->first);
}

// Does the environment ask allocations to begin at their leading guard page (EMU_GUARD=start)
// rather than end at their trailing one (EMU_GUARD=end, or unset)?
static bool emu_guard_at_start(void) {
    const char* env = getenv("EMU_GUARD");
    if (env == NULL || strcmp(env, "end") == 0) return false;
    if (strcmp(env, "start") != 0) emu_fail("EMU_GUARD=%s: must be end (the default) or start", env);
    return true;
}

// the live allocation one of whose guard pages holds addr, or NULL
static const EmuAllocation* emu_guard_owner(uintptr_t addr) {
    uintptr_t page = emu_page_bytes();
    for (const auto& entry : emu_allocations) {
        const EmuAllocation* a = &entry.second;
        uintptr_t leading = (uintptr_t)a->mapping, trailing = leading + a->mapping_bytes - page;
        if ((addr >= leading && addr < leading + page) || (addr >= trailing && addr < trailing + page)) return a;
    }
    return NULL;
}

// "reads" or "writes", where the CPU tells (x86-64: bit 1 of the page fault's error code)
static const char* emu_access_kind(const void* context) {
#if defined(__x86_64__)
    return (((const ucontext_t*)context)->uc_mcontext.gregs[REG_ERR] & 2) ? "writes" : "reads";
#else
    (void)context;
    return "touches";
#endif
}

// who was running when the fault came: a kernel's thread, or host code
static void emu_describe_running(char* out, size_t cap) {
    if (emu.kernel == NULL) snprintf(out, cap, "host code outside any kernel (the emulated runtime, cuBLAS, NCCL or the caller)");
    else if (emu.current >= 0) snprintf(out, cap, "kernel %s (block %u, thread %u)", emu.kernel, blockIdx.x, threadIdx.x);
    else snprintf(out, cap, "kernel %s (its scheduler, between threads)", emu.kernel);
}

// 128-bit accesses (kernels/common.cuh's load128 and store128 call CHECK_ALIGNED_128): the GPU
// needs them 16-byte aligned and stops the kernel with "misaligned address" otherwise; x86
// would not notice, so each one is checked here, and a misaligned one is an emu error that
// names the kernel, block, thread, the address and where it lies in its allocation.
#define CHECK_ALIGNED_128(p, access) emu_check_aligned_128((const void*)(p), (access))
inline long emu_accesses_128 = 0;   // how many 128-bit accesses kernels made (tests report it)
static void emu_check_aligned_128(const void* p, const char* access) {
    uintptr_t a = (uintptr_t)p;
    emu_accesses_128++;
    if (a % 16 == 0) return;
    char who[256], where[200] = "outside any device allocation", line[640];
    emu_describe_running(who, sizeof who);
    auto it = emu_allocations.upper_bound(a);
    if (it != emu_allocations.begin() && a < (--it)->first + it->second.bytes)
        snprintf(where, sizeof where, "byte %zu of the %zu-byte device allocation at %p", (size_t)(a - it->first),
                 it->second.bytes, (void*)it->second.start);
    snprintf(line, sizeof line, "%s %s 16 bytes at misaligned address %p (%u bytes past a 16-byte boundary; "
             "a 128-bit access needs 16-byte alignment), %s", who, access, p, (unsigned)(a % 16), where);
    emu_fail("%s", line);
}

inline struct sigaction emu_previous_segv;  // SIGSEGV's handling before ours: faults that are not ours go back to it

// A fault in a guard page is an access outside a device allocation: one line, then abort as
// every emu error does. Any other fault is not ours: after naming the running kernel, the
// previous handling is put back and the faulting instruction, run again, meets it (by default
// the process dies of SIGSEGV as it would without us).
static void emu_on_segv(int sig, siginfo_t* info, void* context) {
    (void)sig;
    uintptr_t addr = (uintptr_t)info->si_addr;
    const EmuAllocation* a = emu_guard_owner(addr);
    char who[256], line[640];
    emu_describe_running(who, sizeof who);
    if (a == NULL) {
        if (emu.kernel != NULL) fprintf(stderr, "emu: segmentation fault at %p in %s, not in a device allocation's guard page\n", info->si_addr, who);
        sigaction(SIGSEGV, &emu_previous_segv, NULL);
        return;
    }
    long long offset = (long long)(addr - (uintptr_t)a->start);  // negative before the start
    long long outside = offset < 0 ? -offset : offset - (long long)a->bytes + 1;
    snprintf(line, sizeof line, "%s %s byte %lld of the %zu-byte device allocation at %p, %lld byte%s %s", who,
             emu_access_kind(context), offset, a->bytes, (void*)a->start, outside, outside == 1 ? "" : "s",
             offset < 0 ? "before its first byte" : "past its last byte");
    emu_fail("%s", line);
}

// Installed by the first cudaMalloc. The handler runs on a stack of its own: a fault may come
// from a kernel thread, on its small coroutine stack (or from overflowing it).
static void emu_install_fault_handler(void) {
    static bool installed = false;
    static char handler_stack[64 * 1024];
    if (installed) return;
    stack_t stack = {};
    stack.ss_sp = handler_stack;
    stack.ss_size = sizeof handler_stack;
    struct sigaction action = {};
    action.sa_sigaction = emu_on_segv;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    if (sigaltstack(&stack, NULL) != 0 || sigaction(SIGSEGV, &action, &emu_previous_segv) != 0)
        emu_fail("%s", "cannot install the SIGSEGV handler of the guard pages");
    installed = true;
}

static cudaError_t cudaMalloc(void** p, size_t bytes) {
    if (emu_captures > 0) return cudaErrorStreamCaptureUnsupported;
    size_t page = emu_page_bytes();
    if (bytes > SIZE_MAX - 3 * page) return cudaErrorMemoryAllocation;
    size_t data = (bytes + page - 1) / page * page, mapping_bytes = data + 2 * page;
    char* mapping = (char*)mmap(NULL, mapping_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapping == MAP_FAILED) return cudaErrorMemoryAllocation;
    if (data > 0 && mprotect(mapping + page, data, PROT_READ | PROT_WRITE) != 0) {
        munmap(mapping, mapping_bytes);
        return cudaErrorMemoryAllocation;
    }
    memset(mapping + page, 0xFF, data);  // poison: uninitialised floats, bf16s and fp16s read as NaN
    char* start = emu_guard_at_start() ? mapping + page : mapping + page + data - bytes;
    emu_allocations[(uintptr_t)start] = {start, bytes, mapping, mapping_bytes};
    emu_install_fault_handler();
    *p = start;
    return cudaSuccess;
}
template <class T>
static cudaError_t cudaMalloc(T** p, size_t bytes) { return cudaMalloc((void**)p, bytes); }

static cudaError_t cudaFree(void* p) {
    if (emu_captures > 0) return cudaErrorStreamCaptureUnsupported;
    if (p == NULL) return cudaSuccess;
    auto it = emu_allocations.find((uintptr_t)p);
    if (it == emu_allocations.end()) return cudaErrorInvalidValue;
    munmap(it->second.mapping, it->second.mapping_bytes);
    emu_allocations.erase(it);
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// the rest of the runtime API: devices, memset, memcpy

inline int emu_device = 0;

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
static cudaError_t cudaGetDevice(int* device) {
    *device = emu_device;
    return cudaSuccess;
}
static cudaError_t cudaGetLastError(void) { return cudaSuccess; }  // launch errors abort at once
typedef enum { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrComputeCapabilityMajor = 75 } cudaDeviceAttr;
// the emulated GPU is an sm_90 H100 SXM (132 SMs): the architecture the fused attention is built for
static cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
    int count;
    cudaGetDeviceCount(&count);
    if (device < 0 || device >= count) return cudaErrorInvalidValue;
    if (attribute == cudaDevAttrComputeCapabilityMajor) *value = 9;
    else if (attribute == cudaDevAttrMultiProcessorCount) *value = 132;
    else return cudaErrorInvalidValue;
    return cudaSuccess;
}

typedef enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 } cudaFuncAttribute;
// the one attribute the project sets: a kernel's dynamic shared memory limit, up to a block's all
template <class Kernel>
static cudaError_t cudaFuncSetAttribute(Kernel* kernel, cudaFuncAttribute attribute, int value) {
    if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > EMU_MAX_BLOCK_SHARED)
        return cudaErrorInvalidValue;
    emu.max_dynamic_shared[(const void*)kernel] = (size_t)value;
    return cudaSuccess;
}

static cudaError_t cudaDeviceSynchronize(void) {
    if (emu_captures > 0) return cudaErrorStreamCaptureUnsupported;
    for (cudaStream_t st : emu_streams) emu_stream_flush(st, nullptr);
    return cudaSuccess;
}
static cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
    (void)flags;   // stream 0 here never waits for a created stream: non-blocking either way
    *stream = new EmuStream;
    emu_streams.push_back(*stream);
    return cudaSuccess;
}
static cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    if (emu_captures > 0) return cudaErrorStreamCaptureUnsupported;
    emu_stream_flush(stream, nullptr);
    return cudaSuccess;
}
static cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    if (!stream) return cudaErrorInvalidValue;
    emu_stream_flush(stream, nullptr);
    for (size_t i = 0; i < emu_streams.size(); i++)
        if (emu_streams[i] == stream) emu_streams.erase(emu_streams.begin() + i);
    delete stream;
    return cudaSuccess;
}

// the emulated device's memory is the host's
static cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
    *free_bytes = *total = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGE_SIZE);
    return cudaSuccess;
}
static cudaError_t cudaMemset(void* p, int value, size_t bytes) {
    if (emu_captures > 0) return cudaErrorStreamCaptureUnsupported;
    if (!emu_is_device_range(p, bytes)) return cudaErrorIllegalAddress;
    memset(p, value, bytes);
    return cudaSuccess;
}
// Pinned host memory: plain host memory here (the emulated device reads the host directly).
static cudaError_t cudaMallocHost(void** p, size_t bytes) {
    *p = malloc(bytes ? bytes : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
static cudaError_t cudaFreeHost(void* p) {
    free(p);
    return cudaSuccess;
}

// Events: an event is complete when the work queued before its latest record has run: at
// once, unless the record waits in a deferred stream's queue (EMU_DEFER_STREAMS). Waiting for
// an event (cudaStreamWaitEvent, cudaEventSynchronize) runs that stream's queue up to the
// record. An event never recorded counts as complete, as CUDA's. A timing event (created
// without cudaEventDisableTiming) reads the host's clock when its record runs, and
// cudaEventElapsedTime gives the milliseconds between two such readings, refusing what CUDA
// refuses: an event never recorded or made without timing (invalid resource handle), one whose
// record has not run yet (not ready).
// What this cannot show: a host write into a buffer whose asynchronous copy has not run yet.
typedef struct EmuEvent {
    cudaStream_t stream;     // where the latest record was queued (NULL: stream 0)
    unsigned long records;   // records queued so far
    unsigned long reached;   // of them, the latest one that ran
    bool timing;             // made without cudaEventDisableTiming
    double reached_at;       // the host's clock (CLOCK_MONOTONIC, s) when the latest record ran
}* cudaEvent_t;
#define cudaEventDefault 0x00
#define cudaEventDisableTiming 0x02
static cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
    *e = (cudaEvent_t)calloc(1, sizeof(struct EmuEvent));
    if (*e) (*e)->timing = !(flags & cudaEventDisableTiming);
    return *e ? cudaSuccess : cudaErrorMemoryAllocation;
}
static double emu_clock_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static cudaError_t cudaEventDestroy(cudaEvent_t e) {
    free(e);
    return cudaSuccess;
}
static cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
    if (!e) return cudaErrorInvalidValue;
    unsigned long record = ++e->records;
    e->stream = stream;
    emu_on_stream(stream, [e, record] {
        e->reached = record;
        e->reached_at = emu_clock_seconds();
    });
    return cudaSuccess;
}
// the milliseconds from start's latest record to end's, as each ran
static cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    if (!ms || !start || !end) return cudaErrorInvalidValue;
    if (!start->timing || !end->timing || !start->records || !end->records) return cudaErrorInvalidResourceHandle;
    if (start->reached != start->records || end->reached != end->records) return cudaErrorNotReady;
    *ms = (float)(1e3 * (end->reached_at - start->reached_at));
    return cudaSuccess;
}
static void emu_event_wait(cudaEvent_t e) {
    emu_stream_flush(e->stream, [e] { return e->reached == e->records; });
}
static cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!e) return cudaErrorInvalidValue;
    emu_event_wait(e);
    return cudaSuccess;
}
// `stream` waits for e: the work before e's record runs now if it was held back (what
// `stream` queues later runs at once or is held anyway)
static cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned flags) {
    (void)stream, (void)flags;
    if (!e) return cudaErrorInvalidValue;
    emu_event_wait(e);
    return cudaSuccess;
}

static cudaError_t emu_memcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
    bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind == cudaMemcpyDefault) dst_dev = emu_is_device_range(dst, bytes), src_dev = emu_is_device_range(src, bytes);
    if ((dst_dev && !emu_is_device_range(dst, bytes)) || (src_dev && !emu_is_device_range(src, bytes))) return cudaErrorIllegalAddress;
    if ((!dst_dev && emu_is_device_range(dst, 1)) || (!src_dev && emu_is_device_range(src, 1))) return cudaErrorInvalidValue;
    if (stream && stream->capture) emu_on_stream(stream, [=] { memmove(dst, src, bytes); }, (const void*)&emu_memcpy);
    else memmove(dst, src, bytes);
    return cudaSuccess;
}
static cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (emu_captures > 0) return cudaErrorStreamCaptureUnsupported;
    return emu_memcpy(dst, src, bytes, kind, NULL);
}
// queued on `stream` on a GPU; here done at once (recorded where `stream` is captured), with
// cudaMemcpy's checks
static cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
    if (!stream && emu_captures > 0) return cudaErrorStreamCaptureUnsupported;   // (the emulation's rule: see the header)
    return emu_memcpy(dst, src, bytes, kind, stream);
}

// CUDA graphs by stream capture (the header says what is emulated)
typedef EmuGraph* cudaGraph_t;
typedef struct EmuGraphExec {
    std::vector<EmuGraphNode> nodes;
}* cudaGraphExec_t;
typedef enum { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1, cudaStreamCaptureModeRelaxed = 2 } cudaStreamCaptureMode;
typedef enum { cudaGraphExecUpdateSuccess = 0, cudaGraphExecUpdateError = 1, cudaGraphExecUpdateErrorTopologyChanged = 2,
               cudaGraphExecUpdateErrorFunctionChanged = 4 } cudaGraphExecUpdateResult;
typedef struct {
    cudaGraphExecUpdateResult result;
    void* errorNode;
    void* errorFromNode;
} cudaGraphExecUpdateResultInfo;
static cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
    (void)mode;
    if (!stream) return cudaErrorStreamCaptureUnsupported;   // the legacy stream cannot be captured
    if (stream->capture || !stream->queue.empty()) return cudaErrorInvalidValue;
    stream->capture = new EmuGraph;
    emu_captures++;
    return cudaSuccess;
}
static cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
    if (!stream || !stream->capture) return cudaErrorInvalidValue;
    *graph = stream->capture;
    stream->capture = NULL;
    emu_captures--;
    return cudaSuccess;
}
static cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags) {
    if (!exec || !graph || flags) return cudaErrorInvalidValue;
    *exec = new EmuGraphExec;
    (*exec)->nodes = graph->nodes;
    return cudaSuccess;
}
static cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph, cudaGraphExecUpdateResultInfo* info) {
    if (!exec || !graph || !info) return cudaErrorInvalidValue;
    info->errorNode = info->errorFromNode = NULL;
    info->result = exec->nodes.size() == graph->nodes.size() ? cudaGraphExecUpdateSuccess : cudaGraphExecUpdateErrorTopologyChanged;
    for (size_t i = 0; i < graph->nodes.size() && info->result == cudaGraphExecUpdateSuccess; i++)
        if (exec->nodes[i].what != graph->nodes[i].what) info->result = cudaGraphExecUpdateErrorFunctionChanged;
    if (info->result != cudaGraphExecUpdateSuccess) return cudaErrorGraphExecUpdateFailure;
    exec->nodes = graph->nodes;
    return cudaSuccess;
}
static cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
    if (!exec || (stream && stream->capture)) return cudaErrorInvalidValue;
    std::vector<EmuGraphNode> nodes = exec->nodes;   // (its records as they are now: a later update changes exec's)
    emu_on_stream(stream, [nodes] {
        for (const EmuGraphNode& node : nodes) node.op();
    });
    return cudaSuccess;
}
static cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    delete graph;
    return cudaSuccess;
}
static cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete exec;
    return cudaSuccess;
}

// the PTX the fused attention writes as inline assembly: mma.sync, ldmatrix, cp.async
#include "ptx.h"
