/*
tests/emu/ptx.h — the PTX instructions the fused attention (kernels/flash_attention.cuh) writes
as inline assembly, on the CPU emulation of tests/emu/cuda_runtime.h (tests only). It calls
emu_<instruction> where nvcc compiles the asm statement, one line apart, so the two can be
read side by side. The layouts are the PTX ISA's ("Warp-level matrix instructions",
mma.m16n8k16 with .bf16/.f16 inputs; ldmatrix; cp.async); lane L's groupID is L / 4 and its
threadID_in_group L % 4.

  mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32   D = A B + C
      A 16 x 16 in 4 registers of two 16-bit elements (the lower column in the low half):
        a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
      B 16 x 8 in 2: b0 (rows 2t..2t+1, column g)  b1 (rows 2t+8.., column g)
      C, D 16 x 8 fp32 in 4: c0 c1 (g, 2t and 2t+1)  c2 c3 (g+8, 2t and 2t+1)
  ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16   four 8 x 8 matrices of 16-bit elements
      lane L gives the shared-memory address of row L % 8 of matrix L / 8; register j of lane
      L gets matrix j's row L / 4, columns 2 (L % 4) and 2 (L % 4) + 1; with .trans the
      transpose's: rows 2 (L % 4) and 2 (L % 4) + 1 of column L / 4.
  cp.async.cg.shared.global [dst], [src], 16, src_size    16 bytes global -> shared, not
      waited for; src_size 0 writes zeros. cp.async.ca.shared.global [dst], [src], 4, src_size:
      the same for 4 bytes. cp.async.commit_group closes the copies issued
      so far (by this thread) into a group; cp.async.wait_group N waits until at most the N
      newest groups are still in flight.
  Turns between blocks (kernels/flash_ptx.cuh's flash_wait_turn, flash_pass_turn): thread 0
      spins on a counter in global memory (ld.relaxed.gpu) until it reaches the block's turn,
      then reads it once more with ld.acquire.gpu.global.u32; a barrier; every thread does its
      part (128-bit ld.global.cg / st.global.cg of dQ's partial sums); a barrier; thread 0 passes
      the turn on with st.release.gpu.global.u32 of turn + 1.

What the emulation keeps of the hardware's rules, so that a kernel that breaks one fails here:
  - mma and ldmatrix are warp-collective (.sync.aligned): all 32 lanes must reach the same
    instruction (a lane that exited, or waits at another collective, is an emu error). Each
    lane offers its operands (for ldmatrix, the 16 bytes of its row, read as it arrives), then,
    once every lane has, each computes its own registers from all of them: nothing a lane does
    after the instruction changes what the instruction saw. The offers are double-buffered, as
    the shuffles' are: a lane comes back to a buffer only after every lane has read it.
  - ldmatrix and cp.async's destination must lie in shared memory (static __shared__ or the
    launch's dynamic shared memory) and be 16-byte aligned (4-byte for a 4-byte cp.async);
    cp.async's source must lie in a device allocation and be as aligned. A violation is an emu error naming the kernel,
    block and thread.
  - A copy's data reaches shared memory only when a cp.async.wait_group lets it complete, the
    latest the PTX ISA allows; from its issue until then its 16 bytes hold the 0xFF poison
    (NaN), which the hardware leaves unspecified. So a missing wait_group, a wait for too
    few groups, a missing __syncthreads after the wait (another thread reads before the
    copier's wait ran), or a copy issued into a buffer other threads still read, all show up
    as NaN. A __syncthreads completes nothing, as on the GPU.
  - mma multiplies the 16-bit inputs exactly (a bf16 or fp16 product fits in a float) and
    adds in fp32, in k order: d = c + sum_k a[i][k] b[k][j] (the hardware's order and its
    rounding of the additions inside one instruction are unspecified).
  - Turns: the emulation runs a launch's blocks one after another, each to its end. A block
    may only wait for blocks that started before it (on a GPU, one that has not started may
    need the waiting block's SM first, and both wait forever: the kernels hand the blocks
    tickets in the order they start, and the turns follow the tickets). So here every block
    it may wait for has finished when it asks: a turn not yet reached then is an emu error
    (on the GPU it would hang, or wait for a block that started later). The order within the
    block is checked by barrier counts: a thread's part (emu_check_turn, each partial-sum
    access) must come after thread 0's acquire and a barrier after it (the wait's barrier
    missing, or the wait itself, is an emu error), and before a barrier that thread 0's release
    follows (the pass's barrier missing: an error); so is passing a turn not held, or to
    another value than the next, and acquiring one while the last was never passed.
*/
#pragma once
#include <stdint.h>
#include <string.h>
#include <vector>
#include "cuda_bf16.h"
#include "cuda_fp16.h"

static inline float emu_ptx_float(uint16_t bits, __nv_bfloat16*) {
    __nv_bfloat16 x;
    x.__x = bits;
    return __bfloat162float(x);
}
static inline float emu_ptx_float(uint16_t bits, __half*) {
    __half x;
    memcpy(&x, &bits, 2);
    return __half2float(x);
}
// element `high` (0: the low half, the lower index) of a register of two 16-bit values of type T
template <class T>
static inline float emu_ptx_element(uint32_t reg, int high) {
    return emu_ptx_float((uint16_t)(high ? reg >> 16 : reg & 0xffffu), (T*)NULL);
}

// the running thread's kernel, block and thread, for an error line
static void emu_ptx_fail(const char* op, const char* what, const void* p) {
    char line[400];
    snprintf(line, sizeof line, "kernel %s (block %u, thread %u): %s: %s (address %p)", emu.kernel ? emu.kernel : "?",
             blockIdx.x, threadIdx.x, op, what, p);
    emu_fail("%s", line);
}

static bool emu_is_shared(const void* p, size_t bytes) {
    const char* c = (const char*)p;
    bool in_static = c >= __start_emu_shared && c + bytes <= __stop_emu_shared;
    bool in_dynamic = emu.dynamic_shared && c >= emu.dynamic_shared && c + bytes <= emu.dynamic_shared + emu.dynamic_shared_bytes;
    return in_static || in_dynamic;
}

// p, where `op` reads or writes `bytes` bytes, must be in shared memory and aligned to them
static void emu_check_shared(const char* op, const void* p, int bytes) {
    char misaligned[64];
    snprintf(misaligned, sizeof misaligned, "the address is not %d-byte aligned", bytes);
    if (!emu_is_shared(p, (size_t)bytes)) emu_ptx_fail(op, "the address is not in shared memory", p);
    if ((uintptr_t)p % bytes != 0) emu_ptx_fail(op, misaligned, p);
}

// This lane's offer of four or six 32-bit words for the collective instruction `op`; once all
// 32 lanes have offered, the warp's offers, lane L's at [L]
static const uint32_t (*emu_ptx_exchange(const char* op, const uint32_t* offer, int words))[6] {
    if (emu.current < 0) emu_fail("%s called outside a kernel", op);
    EmuThread* t = &emu.threads[emu.current];
    uint32_t(*buffer)[6] = emu.ptx_exchange[t->ptx_collectives++ % 2];
    memcpy(buffer[emu.current], offer, (size_t)words * 4);
    t->collective = op;
    emu_wait(EMU_AT_WARP_SYNC);
    return buffer + (emu.current - emu.current % 32);
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 {r0, r1, r2, r3}, [row]
static inline void emu_ldmatrix_x4(uint32_t r[4], const void* row, bool trans) {
    const char* op = trans ? "ldmatrix.x4.trans" : "ldmatrix.x4";
    emu_check_shared(op, row, 16);
    uint32_t mine[4];   // the 8 elements of this lane's row
    memcpy(mine, row, 16);
    const uint32_t(*rows)[6] = emu_ptx_exchange(op, mine, 4);
    unsigned lane = threadIdx.x % 32;
    for (int j = 0; j < 4; j++) {
        uint16_t half[2];
        for (int e = 0; e < 2; e++) {
            // matrix j's element (row, column) is element `column` of the row lane 8 j + row gave
            unsigned matrix_row = trans ? 2 * (lane % 4) + e : lane / 4, column = trans ? lane / 4 : 2 * (lane % 4) + e;
            half[e] = ((const uint16_t*)rows[8 * j + matrix_row])[column];
        }
        r[j] = (uint32_t)half[0] | (uint32_t)half[1] << 16;
    }
}

// element (row, k) of the A operand and (k, col) of the B operand, from the lanes' registers
template <class T>
static inline float emu_mma_a(const uint32_t (*regs)[6], int row, int k) {
    return emu_ptx_element<T>(regs[4 * (row % 8) + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)], k % 2);
}
template <class T>
static inline float emu_mma_b(const uint32_t (*regs)[6], int k, int col) {
    return emu_ptx_element<T>(regs[4 * col + (k % 8) / 2][4 + (k >= 8)], k % 2);
}

// mma.sync.aligned.m16n8k16.row.col.f32.T.T.f32 {d}, {a}, {b0, b1}, {d}: d += a b
template <class T>
static inline void emu_mma_m16n8k16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    uint32_t mine[6] = {a[0], a[1], a[2], a[3], b0, b1};
    const uint32_t(*regs)[6] = emu_ptx_exchange("mma.m16n8k16", mine, 6);
    unsigned lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; i++) {
        int row = g + 8 * (i / 2), col = 2 * t + i % 2;
        float sum = d[i];
        for (int k = 0; k < 16; k++) sum += emu_mma_a<T>(regs, row, k) * emu_mma_b<T>(regs, k, col);
        d[i] = sum;
    }
}

// cp.async.cg.shared.global [dst], [src], 16, fill ? 16 : 0 (bytes 16), or
// cp.async.ca.shared.global [dst], [src], 4, fill ? 4 : 0 (bytes 4): both addresses aligned to
// the copy's size, the source in a device allocation
static inline void emu_cp_async(void* dst, const void* src, int bytes, bool fill) {
    const char* op = bytes == 16 ? "cp.async" : "cp.async (4 bytes)";
    char misaligned[64];
    snprintf(misaligned, sizeof misaligned, "the source is not %d-byte aligned", bytes);
    emu_check_shared(op, dst, bytes);
    if (!emu_is_device_range(src, (size_t)bytes)) emu_ptx_fail(op, "the source is not in a device allocation", src);
    if ((uintptr_t)src % bytes != 0) emu_ptx_fail(op, misaligned, src);
    EmuCopy copy;
    copy.dst = (char*)dst;
    copy.bytes = bytes;
    if (fill) memcpy(copy.data, src, (size_t)bytes);
    else memset(copy.data, 0, (size_t)bytes);
    copy.group = -1;   // not committed yet
    memset(dst, 0xFF, (size_t)bytes);   // unspecified until the copy completes
    emu.threads[emu.current].copies.push_back(copy);
}

// cp.async.commit_group
static inline void emu_cp_async_commit(void) {
    EmuThread* t = &emu.threads[emu.current];
    for (EmuCopy& c : t->copies)
        if (c.group < 0) c.group = t->groups;
    t->groups++;
}

// cp.async.wait_group n: the copies of every committed group but the n newest land now
static inline void emu_cp_async_wait(int n) {
    EmuThread* t = &emu.threads[emu.current];
    std::vector<EmuCopy> pending;
    for (const EmuCopy& c : t->copies) {
        if (c.group >= 0 && c.group < t->groups - n) memcpy(c.dst, c.data, (size_t)c.bytes);
        else pending.push_back(c);
    }
    t->copies.swap(pending);
}

// ---- turns between blocks (see the top). A block holds a turn from thread 0's acquire load of
// the counter to its release store; each thread's part (emu_check_turn, and its 128-bit accesses
// to the partial sums) must come after a barrier that follows the acquire and before a barrier
// that precedes the release: the barriers are what order the other threads' work after thread 0's
// acquire and before its release (a thread's barrier count, tests/emu/cuda_runtime.h, dates it).
struct EmuTurn {
    const unsigned* counter;   // the turn's counter, NULL when the block holds none
    unsigned block;            // the block holding it
    unsigned acquired_at;      // thread 0's barrier count at the acquire
    long generation;           // which turn (each acquire is a new one)
    bool released;
};
inline EmuTurn emu_turn;
inline long emu_turn_part_of[EMU_MAX_BLOCK];        // the turn (generation) each thread did its part in
inline unsigned emu_turn_part_at[EMU_MAX_BLOCK];   // ... and its barrier count then

static void emu_turn_fail(const char* what, const unsigned* counter) {
    char line[400];
    snprintf(line, sizeof line, "kernel %s (block %u, thread %u): %s (counter at %p, now %u)", emu.kernel ? emu.kernel : "?",
             blockIdx.x, threadIdx.x, what, (const void*)counter, counter ? *counter : 0u);
    emu_fail("%s", line);
}

static bool emu_turn_held_here(void) { return emu_turn.counter && !emu_turn.released && emu_turn.block == blockIdx.x; }

// flash_wait_turn's spin (thread 0): every block that may pass the turns before this one has run
// to its end, so the counter is at the turn already, or the spin would never end
static inline void emu_spin_until(const unsigned* counter, unsigned turn) {
    if (!emu_is_device_range(counter, 4)) emu_ptx_fail("wait for a turn", "the counter is not in a device allocation", counter);
    if (emu_turn.counter && !emu_turn.released)
        emu_turn_fail(emu_turn.block == blockIdx.x ? "waits for a turn while its block holds one it never passed"
                                                   : "waits for a turn: a block before it ended holding one it never passed",
                      counter);
    if (*counter != turn) {
        char what[200];
        snprintf(what, sizeof what, "waits for turn %u, which no block before it passed: on a GPU it would wait forever, "
                 "or for a block that started after it", turn);
        emu_turn_fail(what, counter);
    }
}

// ld.acquire.gpu.global.u32 (thread 0, once the turn is there): the block holds the turn from here
static inline unsigned emu_load_acquire(const unsigned* counter) {
    if (!emu_is_device_range(counter, 4)) emu_ptx_fail("ld.acquire.gpu", "the address is not in a device allocation", counter);
    if (emu_turn.counter && !emu_turn.released) emu_turn_fail("acquires a turn while one is held, never passed", counter);
    emu_turn.counter = counter, emu_turn.block = blockIdx.x, emu_turn.released = false;
    emu_turn.acquired_at = emu.threads[emu.current].barriers;
    emu_turn.generation++;
    return *counter;
}

// a thread's work in the turn: after thread 0's acquire and a barrier, before the release
static void emu_check_in_turn(const unsigned* counter, const char* what) {
    char line[300];
    if (!emu_turn_held_here() || (counter && emu_turn.counter != counter)) {
        snprintf(line, sizeof line, "%s outside its turn (no wait for it, or the turn already passed)", what);
        emu_turn_fail(line, counter);
    }
    if (emu.threads[emu.current].barriers <= emu_turn.acquired_at) {
        snprintf(line, sizeof line, "%s before a barrier after thread 0's acquire of the turn (a barrier missing: its "
                 "loads are not ordered after the acquire)", what);
        emu_turn_fail(line, emu_turn.counter);
    }
}

// the part each thread of the block does in the turn on `counter` (all threads call it)
static inline void emu_check_turn(const unsigned* counter, const char* what) {
    emu_check_in_turn(counter, what);
    emu_turn_part_of[emu.current] = emu_turn.generation;
    emu_turn_part_at[emu.current] = emu.threads[emu.current].barriers;
}

// a 128-bit access to the partial sums: in this thread's part of a turn, 16-byte aligned
static inline void emu_sums_access(const float* p, const char* what) {
    char op[64];
    snprintf(op, sizeof op, "%s dQ's partial sums", what);
    if (!emu_is_device_range(p, 16)) emu_ptx_fail(op, "the address is not in a device allocation", p);
    if ((uintptr_t)p % 16 != 0) emu_ptx_fail(op, "the address is not 16-byte aligned", p);
    emu_check_in_turn(NULL, op);
}

// st.release.gpu.global.u32 (thread 0): the turn passes on, once every thread of the block did its
// part before a barrier that thread 0 has passed too (without the barrier some would not have)
static inline void emu_store_release(unsigned* counter, unsigned value) {
    if (!emu_turn_held_here() || emu_turn.counter != counter) emu_turn_fail("passes a turn it does not hold", counter);
    if (value != *counter + 1) emu_turn_fail("passes the turn to another than the next", counter);
    unsigned now = emu.threads[emu.current].barriers;
    for (unsigned i = 0; i < emu.block; i++)
        if (emu.threads[i].state != EMU_EXITED && (emu_turn_part_of[i] != emu_turn.generation || emu_turn_part_at[i] >= now)) {
            char what[200];
            snprintf(what, sizeof what, "passes the turn before thread %u has done its part (a barrier missing)", i);
            emu_turn_fail(what, counter);
        }
    *counter = value;
    emu_turn.released = true;
}
