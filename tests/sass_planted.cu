// tests/sass_planted.cu — kernels planted for tests/test_sass.py, never part of the trainer.
// Each name contains "flash", so the test reads them exactly as it reads the flash kernels
// of kernels/, and each breaks the rule its name says (or none), to show that every rule of the
// test fires on a kernel that breaks it and stays quiet on one that does not:
//   planted_flash_good_kernel<1>       a warp's 16 x 8 tile product the FlashAttention-2 way:
//                                      the tile staged in shared memory with shared stores,
//                                      fragments by ldmatrix, the product by mma.sync (bf16,
//                                      fp32 accumulation): breaks nothing (LDSM, HMMA present)
//   planted_flash_good_kernel<2>, <3>  the same; the test gives <2> a made-up launch with
//                                      170 KB of dynamic shared memory (more than a block may
//                                      have on sm_80, not on sm_90), and <3> no launch at all
//   planted_flash_spill_kernel         the same, with more values live than the 32 registers a
//                                      thread may have under its __launch_bounds__: spills
//   planted_flash_local_kernel         the same, with an array indexed at run time: local memory
//   planted_flash_generic_kernel       the same, with the tile reached through a pointer the
//                                      compiler cannot trace to shared memory: the tile is
//                                      stored and read with generic ST / LD
//   planted_flash_callee_kernel        a tile loaded by a helper that is not inlined and
//                                      reaches the tile the same opaque way: the generic ST is
//                                      the helper's (ptxas puts it in the kernel's section)
//   planted_flash_notensor_kernel      the product by fp32 multiply-adds: no LDSM, no HMMA
//   planted_flash_d_kernel             a row sum, as the backward's D kernel: no LDSM, no HMMA,
//                                      and exempt from that rule by its name
//   planted_flash_alibi_kernel<ALIBI>  the good kernel plus ALiBi's bias, slope (key - row), on each
//                                      sum; <true> breaks nothing, <false> is an instance built
//                                      "without ALiBi" that computes it anyway: ALiBi arithmetic
//   planted_flash_nobias_kernel<true>  an instance "with ALiBi" that adds a bias with no int to
//                                      float conversion in it: the rule's signature is missing
//   planted_flash_reload_kernel        the good kernel's product in a loop, both operands loaded
//                                      by ldmatrix for each mma: 2 LDSM an HMMA in its inner loop
//   planted_flash_turn_kernel          products in a loop whose trips each take a turn between
//                                      blocks as the attention backward takes dQ's: thread 0's
//                                      acquire load of the counter, a barrier, 128-bit sums, a
//                                      barrier, thread 0's release store: breaks nothing
//   planted_flash_fence_kernel         the same turn with two __threadfence (MEMBAR.SC.GPU and
//                                      CCTL.IVALL each), as the backward's before issue 52: fences
//   planted_flash_never_kernel<HS>     a template never instantiated: named here, absent from
//                                      the cubin (the test's "every flash kernel the source
//                                      defines was compiled" check)
// Compiled for sm_80 and up (mma.sync.m16n8k16 with bf16 needs sm_80).
#include <cuda_bf16.h>

// the 16 x 16 bf16 tile at `in` into shared memory (explicit shared stores), then its fragments
// by ldmatrix: A = the tile, B = its first 8 rows read as a column-major 16 x 8 matrix
__device__ void tile_fragments(unsigned a[4], unsigned b[2], __nv_bfloat16* tile, const __nv_bfloat16* in) {
    int lane = threadIdx.x % 32;
    for (int i = lane; i < 16 * 16; i += 32) tile[i] = in[i];
    __syncwarp();
    // lanes 0-15 address rows 0-15 at column 0, lanes 16-31 the same rows at column 8
    unsigned row = (unsigned)__cvta_generic_to_shared(&tile[(lane % 16) * 16 + (lane / 16) * 8]);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(b[0]), "=r"(b[1]) : "r"(row));
}

// ... and one m16n8k16 product of them into c
__device__ void tile_product(float c[4], __nv_bfloat16* tile, const __nv_bfloat16* in) {
    unsigned a[4], b[2];
    tile_fragments(a, b, tile, in);
    unsigned a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], b0 = b[0], b1 = b[1];
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// one warp per block; out gets each lane's four accumulators
template <int SCALE>
__global__ void planted_flash_good_kernel(float* out, const __nv_bfloat16* in) {
    __shared__ __align__(16) __nv_bfloat16 tile[16 * 16];
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    tile_product(c, tile, in);
    for (int i = 0; i < 4; i++) out[threadIdx.x * 4 + i] = c[i] * SCALE;
}
template __global__ void planted_flash_good_kernel<1>(float*, const __nv_bfloat16*);
template __global__ void planted_flash_good_kernel<2>(float*, const __nv_bfloat16*);
template __global__ void planted_flash_good_kernel<3>(float*, const __nv_bfloat16*);

// 64 values loaded before any is used, then every pair multiplied: all 64 live at once, in a
// thread that may have 32 registers (1024 threads, 2 blocks per SM: 65536 / 2048)
#define SPILL_LIVE 64
__global__ void __launch_bounds__(1024, 2) planted_flash_spill_kernel(float* out, const __nv_bfloat16* in, const float* x) {
    __shared__ __align__(16) __nv_bfloat16 tile[16 * 16];
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    tile_product(c, tile, in);
    float v[SPILL_LIVE];
#pragma unroll
    for (int i = 0; i < SPILL_LIVE; i++) v[i] = x[i * blockDim.x + threadIdx.x];
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < SPILL_LIVE; i++)
#pragma unroll
        for (int j = i; j < SPILL_LIVE; j++) sum += v[i] * v[j];
    for (int i = 0; i < 4; i++) out[threadIdx.x * 4 + i] = c[i] + sum;
}

// a per-thread array written and read at indices known only at run time lives in local memory
#define LOCAL_ARRAY 256
__global__ void planted_flash_local_kernel(float* out, const __nv_bfloat16* in, const int* pick) {
    __shared__ __align__(16) __nv_bfloat16 tile[16 * 16];
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    tile_product(c, tile, in);
    float scratch[LOCAL_ARRAY];
    for (int i = 0; i < LOCAL_ARRAY; i++) scratch[i] = c[i % 4] * i;
    scratch[pick[threadIdx.x] % LOCAL_ARRAY] += 1.0f;
    for (int i = 0; i < 4; i++) out[threadIdx.x * 4 + i] = scratch[pick[threadIdx.x + 32 * (i + 1)] % LOCAL_ARRAY];
}

// The tile's address passes through an asm statement the compiler cannot see into: what comes
// out is a plain (generic) pointer, as a pointer into shared memory becomes when the compiler
// loses track of where it points, so the tile is stored and read with generic ST / LD.
__global__ void planted_flash_generic_kernel(float* out, const __nv_bfloat16* in) {
    __shared__ __align__(16) __nv_bfloat16 shared_tile[16 * 16];
    __nv_bfloat16* tile;
    asm("mov.b64 %0, %1;" : "=l"(tile) : "l"(shared_tile));
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    tile_product(c, tile, in);
    for (int i = 0; i < 4; i++) out[threadIdx.x * 4 + i] = c[i] + __bfloat162float(tile[threadIdx.x % 32]);
}

// 16 x 16 values into the tile, through an address the compiler cannot trace; not inlined:
// the kernel calls it
__device__ __noinline__ void load_tile_opaquely(__nv_bfloat16* shared_tile, const __nv_bfloat16* in) {
    __nv_bfloat16* tile;
    asm("mov.b64 %0, %1;" : "=l"(tile) : "l"(shared_tile));
    for (int i = threadIdx.x % 32; i < 16 * 16; i += 32) tile[i] = in[i];
}
__global__ void planted_flash_callee_kernel(float* out, const __nv_bfloat16* in) {
    __shared__ __align__(16) __nv_bfloat16 tile[16 * 16];
    load_tile_opaquely(tile, in);
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    tile_product(c, tile, in + 256);   // stores the next tile over it with shared stores, then multiplies
    for (int i = 0; i < 4; i++) out[threadIdx.x * 4 + i] = c[i];
}

// the same tile through shared memory, multiplied by fp32 multiply-adds: no tensor cores
__global__ void planted_flash_notensor_kernel(float* out, const __nv_bfloat16* in) {
    __shared__ __align__(16) __nv_bfloat16 tile[16 * 16];
    int lane = threadIdx.x % 32;
    for (int i = lane; i < 16 * 16; i += 32) tile[i] = in[i];
    __syncwarp();
    float sum = 0.0f;
    for (int k = 0; k < 16; k++) sum += __bfloat162float(tile[(lane % 16) * 16 + k]) * __bfloat162float(tile[k * 16 + lane / 2]);
    out[threadIdx.x] = sum;
}

// D = rowsum(dout * out), one thread per row: what the backward's D kernel computes
__global__ void planted_flash_d_kernel(float* D, const __nv_bfloat16* dout, const __nv_bfloat16* o, int rows, int HS) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float d = 0.0f;
    for (int c = 0; c < HS; c++) d += __bfloat162float(dout[(size_t)r * HS + c]) * __bfloat162float(o[(size_t)r * HS + c]);
    D[r] = d;
}

// ALiBi's bias, slope (key - row) with key and row known at run time, on each sum, whatever
// ALIBI says: the <false> instance is planted, built without ALiBi and doing its arithmetic
template <bool ALIBI>
__global__ void planted_flash_alibi_kernel(float* out, const __nv_bfloat16* in, float slope, int row) {
    __shared__ __align__(16) __nv_bfloat16 tile[16 * 16];
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    tile_product(c, tile, in);
    int key = threadIdx.x % 32;
    for (int i = 0; i < 4; i++) out[threadIdx.x * 4 + i] = c[i] + slope * (float)(key + i - row);
}
template __global__ void planted_flash_alibi_kernel<false>(float*, const __nv_bfloat16*, float, int);
template __global__ void planted_flash_alibi_kernel<true>(float*, const __nv_bfloat16*, float, int);

// "with ALiBi" but the bias a float read from memory: no conversion, the signature missing
template <bool ALIBI>
__global__ void planted_flash_nobias_kernel(float* out, const __nv_bfloat16* in, const float* bias) {
    __shared__ __align__(16) __nv_bfloat16 tile[16 * 16];
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    tile_product(c, tile, in);
    for (int i = 0; i < 4; i++) out[threadIdx.x * 4 + i] = c[i] + (ALIBI ? bias[i] : 0.0f);
}
template __global__ void planted_flash_nobias_kernel<true>(float*, const __nv_bfloat16*, const float*);

// a product a slice, `slices` of them, each loading its A and its B by ldmatrix: nothing kept
// in registers across the loop
__global__ void planted_flash_reload_kernel(float* out, const __nv_bfloat16* in, int slices) {
    __shared__ __align__(16) __nv_bfloat16 tile[16 * 16];
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int s = 0; s < slices; s++) {
        tile_product(c, tile, in + 256 * s);
        __syncwarp();   // every lane's ldmatrix is done before the next slice's stores
    }
    for (int i = 0; i < 4; i++) out[threadIdx.x * 4 + i] = c[i];
}

// A turn between blocks on `counter` around one 128-bit read-modify-write of `sums` a thread, each
// trip of a loop of products (the fragments loaded once, before it: an HMMA loop with few LDSM):
// with acquire and release (kernels/flash_ptx.cuh's turn), or with full fences (FENCE)
__device__ void turn_loop(float* out, const __nv_bfloat16* in, unsigned* counter, float4* sums, int trips, bool fence) {
    __shared__ __align__(16) __nv_bfloat16 tile[16 * 16];
    unsigned a[4], b[2];
    tile_fragments(a, b, tile, in);
    unsigned a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], b0 = b[0], b1 = b[1];
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int s = 0; s < trips; s++) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                     "{%0, %1, %2, %3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        if (threadIdx.x == 0) {
            if (fence) {
                while (*(volatile unsigned*)counter != (unsigned)s) {
                }
                __threadfence();
            } else {
                unsigned v;
                do asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
                while (v != (unsigned)s);
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
            }
        }
        __syncthreads();
        float4 x = __ldcg(sums + threadIdx.x);
        x.x += c[0], x.y += c[1], x.z += c[2], x.w += c[3];
        __stcg(sums + threadIdx.x, x);
        if (fence) __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            if (fence) atomicAdd(counter, 1u);
            else asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(counter), "r"((unsigned)s + 1) : "memory");
        }
    }
    for (int i = 0; i < 4; i++) out[threadIdx.x * 4 + i] = c[i];
}
__global__ void planted_flash_turn_kernel(float* out, const __nv_bfloat16* in, unsigned* counter, float4* sums, int trips) {
    turn_loop(out, in, counter, sums, trips, false);
}
__global__ void planted_flash_fence_kernel(float* out, const __nv_bfloat16* in, unsigned* counter, float4* sums, int trips) {
    turn_loop(out, in, counter, sums, trips, true);
}

// defined, never instantiated: no code for it exists
template <int HS>
__global__ void planted_flash_never_kernel(float* out) {
    out[threadIdx.x] = HS;
}
