/*
kernels/flash_ptx.cuh — the PTX the fused attention (kernels/flash_attention.cuh) writes as
inline assembly, each instruction beside the call into its emulation (tests/emu/ptx.h, which also
draws the fragment layouts): mma.sync, ldmatrix, cp.async; and what the backward's blocks take
turns with on dQ: an acquire load and a release store of a turn's counter, and 128-bit accesses
to dQ's fp32 partial sums in L2.

Included by kernels.cuh, the index of kernels/, right before flash_attention.cuh.
*/
#pragma once

#ifdef __CUDACC__
// mma.sync.m16n8k16 and cp.async need sm_80 (A100) or newer: an fp16 build for an older GPU
// (GPU_ARCH=70 or 75, see the Makefile) compiles these kernels as a trap, and
// check_flash_arguments refuses to launch them there first.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define FLASH_PTX 0
#else
#define FLASH_PTX 1
#endif

// ---- the PTX: each instruction next to its emulation (tests/emu/ptx.h, which also draws
// the fragment layouts). A 16 x 16 A operand is 4 registers of two 16-bit elements, a 16 x 8
// B operand 2, a 16 x 8 fp32 accumulator 4: for lane L, g = L / 4 and t = L % 4, accumulator
// registers 0 and 1 are row g, columns 2t and 2t + 1, registers 2 and 3 the same of row g + 8.

#ifdef __NVCC__
// a generic pointer into shared memory as the 32-bit shared-window address the instructions take
__device__ inline uint32_t shared_address(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
#endif

// four 8 x 8 matrices: lane L gives the address of row L % 8 of matrix L / 8; r[j] is matrix j's
// row L / 4, columns 2 (L % 4) and 2 (L % 4) + 1 (trans: column L / 4, rows 2 (L % 4) and + 1)
__device__ inline void ldmatrix_x4(uint32_t r[4], const floatX* row, bool trans) {
#if defined(__NVCC__) && !FLASH_PTX
    (void)r, (void)row, (void)trans, __trap();
#elif defined(__NVCC__)
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_address(row)) : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_address(row)) : "memory");
#else
    emu_ldmatrix_x4(r, row, trans);
#endif
}

// d (16 x 8) += a (16 x 16) b (16 x 8), on the tensor cores
__device__ inline void mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(__NVCC__) && !FLASH_PTX
    (void)d, (void)a, (void)b0, (void)b1, __trap();
#elif defined(__NVCC__)
    asm("mma.sync.aligned.m16n8k16.row.col.f32." PTX_FLOATX "." PTX_FLOATX ".f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    emu_mma_m16n8k16<floatX>(d, a, b0, b1);
#endif
}

// 16 bytes from global to shared memory, in the background (zeros when !fill)
__device__ inline void cp_async_16(void* dst, const void* src, bool fill) {
#if defined(__NVCC__) && !FLASH_PTX
    (void)dst, (void)src, (void)fill, __trap();
#elif defined(__NVCC__)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(shared_address(dst)), "l"(src), "r"(fill ? 16 : 0) : "memory");
#else
    emu_cp_async(dst, src, 16, fill);
#endif
}

// 4 bytes from global to shared memory, in the background (zeros when !fill): a row's statistic
__device__ inline void cp_async_4(void* dst, const void* src, bool fill) {
#if defined(__NVCC__) && !FLASH_PTX
    (void)dst, (void)src, (void)fill, __trap();
#elif defined(__NVCC__)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(shared_address(dst)), "l"(src), "r"(fill ? 4 : 0) : "memory");
#else
    emu_cp_async(dst, src, 4, fill);
#endif
}

// the copies issued so far become one group
__device__ inline void cp_async_commit(void) {
#if defined(__NVCC__) && !FLASH_PTX
    __trap();
#elif defined(__NVCC__)
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#else
    emu_cp_async_commit();
#endif
}

// wait until at most `newest` groups are in flight (this thread's copies; a barrier shares them)
template <int newest>
__device__ inline void cp_async_wait(void) {
#if defined(__NVCC__) && !FLASH_PTX
    __trap();
#elif defined(__NVCC__)
    asm volatile("cp.async.wait_group %0;\n" :: "n"(newest) : "memory");
#else
    emu_cp_async_wait(newest);
#endif
}

// the launch's dynamic shared memory
__device__ inline floatX* flash_shared(void) {
#ifdef __NVCC__
    extern __shared__ __align__(16) unsigned char flash_dynamic_shared[];
    return (floatX*)flash_dynamic_shared;
#else
    return (floatX*)emu_dynamic_shared_memory();
#endif
}

// ---- turns between blocks: the backward's dQ, added in a fixed order (FlashAttention-3's
// deterministic backward does the same). A block waits until `counter` (in global memory) reaches
// `turn`, every thread adds its part, then the block passes the turn on (counter = turn + 1). All
// threads call both. The pattern is CUTLASS's semaphore (include/cutlass/semaphore.h): thread 0
// reads the counter with acquire semantics, and a barrier then orders every thread's loads after
// that acquire; a barrier orders every thread's stores before thread 0's release store of the
// counter. (PTX ISA, "Memory Consistency Model": the release store and the acquire load that reads
// it synchronize, and a barrier synchronizes the threads of a block; causality order is transitive.)
// In the SASS (sm_80, sm_90) the acquire is a load from L2 and one L1 invalidation (CCTL.IVALL),
// the release one fence (MEMBAR.ALL.GPU) and a store, both in thread 0 alone; before issue 52 the
// turn was two __threadfence (MEMBAR.SC.GPU and CCTL.IVALL each), the second in every thread, and an
// atomic add. A block may wait only for blocks that started before it (see
// attention_backward_flash_kernel's tickets): the emulation (tests/emu/ptx.h) checks that, and the
// order of the acquire, the barriers, the parts and the release.

// ld.relaxed.gpu: the spin's load, from L2 (no L1 invalidation each time round)
__device__ inline unsigned load_relaxed_gpu(const unsigned* p) {
#ifdef __NVCC__
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
#else
    return *p;
#endif
}

// ld.acquire.gpu: what the thread reads after it is ordered after the load
__device__ inline unsigned load_acquire_gpu(const unsigned* p) {
#ifdef __NVCC__
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
#else
    return emu_load_acquire(p);
#endif
}

// st.release.gpu: what the thread wrote (and, through a barrier before it, its block) is ordered before
__device__ inline void store_release_gpu(unsigned* p, unsigned v) {
#ifdef __NVCC__
    asm volatile("st.release.gpu.global.u32 [%0], %1;\n" :: "l"(p), "r"(v) : "memory");
#else
    emu_store_release(p, v);
#endif
}

__device__ inline void flash_wait_turn(const unsigned* counter, unsigned turn) {
    if (threadIdx.x == 0) {
#ifdef __NVCC__
        while (load_relaxed_gpu(counter) != turn) {
        }
#else
        emu_spin_until(counter, turn);   // the turn is there already, or an emu error (a GPU would spin forever)
#endif
        (void)load_acquire_gpu(counter);   // one acquire, once the turn is ours: the parts before it are visible
    }
    __syncthreads();   // ... to every thread of the block, whose loads come after this barrier
}

__device__ inline void flash_pass_turn(unsigned* counter, unsigned turn) {
    __syncthreads();   // every thread's part is stored (and every warp is done with the step's buffers)
    if (threadIdx.x == 0) store_release_gpu(counter, turn + 1);
}

// 4 fp32 of dQ's partial sums, 16-byte aligned, from or to L2 (.cg: the block does not read them
// again, so they need no L1 line), between the wait for a turn and its pass
__device__ inline void load_sums_128(float v[4], const float* p) {
#ifdef __NVCC__
    float4 x = __ldcg((const float4*)p);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
#else
    emu_sums_access(p, "loads");
    memcpy(v, p, 16);
#endif
}

__device__ inline void store_sums_128(float* p, const float v[4]) {
#ifdef __NVCC__
    __stcg((float4*)p, make_float4(v[0], v[1], v[2], v[3]));
#else
    emu_sums_access(p, "stores");
    memcpy(p, v, 16);
#endif
}
#endif
