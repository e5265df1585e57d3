/*
kernels.cuh — every numeric kernel of gridgpt.

Each op is written twice, and the two versions sit side by side, op by op:
  - a plain-C reference, `<op>_cpu`, that states the math in the simplest loops we can write
    (a few OpenMP pragmas, no intrinsics, fp32 with fp64 where a sum needs it; the inner
    loops in shapes the compiler puts on vector lanes: the helpers before the first op);
  - right below it, under `#ifdef __CUDACC__`, its CUDA kernels and the launcher `<op>`.
The rest of the trainer calls `<op>` and does not know which one it got: on the CPU build
`<op>` is the reference itself (the `#else` branch of each op's section says so).

Conventions every kernel keeps:
  - Activations and parameters are `floatX` (float on the CPU; bf16 on the GPU, or fp16 when
    built with -DGRIDGPT_FP16); gradients of parameters, LayerNorm statistics, losses and
    optimizer state are always float. Kernels convert with to_floatX / floatX_to_float.
  - Parameter-gradient outputs ACCUMULATE (+=): micro-batches add into one gradient buffer.
    Activation-gradient outputs are overwritten (=), except `layernorm_backward`'s dinp,
    which adds into the residual stream's gradient (that is the residual's backward).
  - Linear weights are stored [out, in] (Megatron/PyTorch), so a linear layer is
    out[N, OC] = inp[N, C] @ W[OC, C]^T + b.
  - Reductions are deterministic: a fixed split of the work, independent of the thread
    count, so two runs with the same seed are bit-identical. One exception on the GPU:
    encoder_backward's word-embedding gradient adds with atomics (repeated tokens collide).
  - Elementwise and row kernels move floatX in 128-bit packs of 8 (x128, load_pack/store_pack)
    where a pack is whole and 16-byte aligned, one element at a time where not, so they take
    any size and any pointer. The linear layers' forward runs through cuBLASLt with the bias
    (and the MLP's GELU) in the GEMM's epilogue, and the GELU's backward in the epilogue of
    the GEMM before it (each shape's cuBLASLt plan made once); the rest of the GEMMs through
    cuBLAS.
  - CUDA kernels are plain `__global__ void` functions (the fused attention's are templates
    on the head size and on ALiBi, on or off), launched only through LAUNCH() (1-D grids, a fixed block size per
    op); shared memory and warp shuffles appear only in the reduction helpers and the fused
    attention's tiles; every CUDA/cuBLAS call goes through a check; all math is fp32 (fp64
    for the gradient norm), 16 bits only in memory, save the tensor cores' products of 16-bit
    inputs (mma.sync, fp32 accumulation) in the fused attention, written as PTX beside its
    emulation. So tests can run the CUDA code on a CPU emulation of CUDA (tests/emu/).
*/
#pragma once
#include "device.cuh"     // checks, floatX, device memory, streams: the runtime under the kernels
#include "blas_cores.h"   // the CPU build's sgemm: OpenBLAS, and the right kernels for this CPU

// ----------------------------------------------------------------------------
// the CUDA build's shared pieces: the launch macro, block sizes, the cuBLAS handle

#ifdef __CUDACC__
// The one place a kernel is launched (a test build may define its own LAUNCH first). Grids
// are 1-D (`blocks` of them); a launch over nothing (0 blocks, e.g. an empty tensor) is
// skipped, not an error.
// Every kernel runs on the default stream (0), as cuBLAS does; NCCL too, but for the
// collectives queued on the communication stream (comm_stream, above).
#ifndef LAUNCH
#define LAUNCH(kernel, blocks, block, shmem, ...)                             \
    do {                                                                      \
        unsigned int launch_grid_ = (unsigned int)(blocks);                   \
        if (launch_grid_ > 0) {                                               \
            kernel<<<launch_grid_, (block), (shmem), 0>>>(__VA_ARGS__);       \
            cudaCheck(cudaGetLastError());                                    \
        }                                                                     \
    } while (0)
#endif

// block sizes, one per kind of kernel
#define ELEMENTWISE_BLOCK 256  // one thread per element
#define ROW_BLOCK 256          // one warp per row, so ROW_BLOCK / 32 rows per block
#define ROWS_PER_BLOCK (ROW_BLOCK / 32)
#define SUM_SQUARES_BLOCK 256

// #pragma unroll (a loop of constant trips, whole; UNROLL_4: by 4) where nvcc compiles (g++
// compiling for the emulation does not know it)
#ifdef __NVCC__
#define UNROLL _Pragma("unroll")
#define UNROLL_4 _Pragma("unroll 4")
#else
#define UNROLL
#define UNROLL_4
#endif

static cublasHandle_t cublas_handle;
static cublasLtHandle_t cublaslt_handle;   // the linear layers' forward (epilogues: bias, GELU)
static void* cublaslt_workspace;           // CUBLASLT_WORKSPACE_BYTES, allocated once
static double* sum_squares_partials;  // [SUM_SQUARES_MAX_BLOCKS], allocated once
static unsigned int* column_counters; // [COLUMN_COUNTERS], zero between the launches that use them
static size_t kernels_workspace_bytes = 0;   // what kernels_init handed out through dev_malloc

static void kernels_init(int local_device) {
    cudaCheck(cudaSetDevice(local_device));
    cublasCheck(cublasCreate(&cublas_handle));
    // default math: 16-bit inputs with fp32 compute already use the tensor cores; we do not
    // opt into TF32 or any reduced-precision accumulation
    cublasCheck(cublasSetMathMode(cublas_handle, CUBLAS_DEFAULT_MATH));
    cublasCheck(cublasSetStream(cublas_handle, 0));
    cublasCheck(cublasLtCreate(&cublaslt_handle));
    cudaCheck(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking));
    // through dev_malloc, so that the memory table's check against dev_malloc counts it (build_model
    // adds kernels_workspace_bytes: this is allocated before the model, once per process)
    size_t before = dev_bytes_allocated;
    sum_squares_partials = (double*)dev_malloc(SUM_SQUARES_PARTIALS_BYTES);
    cublaslt_workspace = dev_malloc(CUBLASLT_WORKSPACE_BYTES);
    column_counters = (unsigned int*)dev_malloc(COLUMN_COUNTERS_BYTES);
    dev_zero(column_counters, COLUMN_COUNTERS_BYTES);
    kernels_workspace_bytes = dev_bytes_allocated - before;
}
// (kernels_free, which undoes it at exit, follows the linear layers: it frees their cuBLASLt plans too)

// ----------------------------------------------------------------------------
// reduction helpers: the only code that touches warp shuffles and shared memory
// (blocks are whole warps, at most 32 of them)

// Butterfly sum: every lane ends with the same total (a + b == b + a exactly).
__device__ float warp_reduce_sum(float val) {
    for (int offset = 16; offset > 0; offset /= 2) val += __shfl_xor_sync(0xffffffffu, val, offset);
    return val;
}

__device__ float warp_reduce_max(float val) {
    for (int offset = 16; offset > 0; offset /= 2) val = fmaxf(val, __shfl_xor_sync(0xffffffffu, val, offset));
    return val;
}

// The LayerNorm and RMSNorm backward's table of column sums over each warp's rows, for a
// window of NORM_WINDOW columns (a pack of 8 a lane): [2 sums][COLUMN_BLOCK / 32 warps][8][32],
// column 8 l + k of the window (lane l's pack, element k) at [sum][warp][k][l], so that a warp's
// stores, and the loads of the warp that reads element k of every pack, hit 32 banks.
#define NORM_WINDOW (32 * 8)
__device__ float* block_column_partials(void) {
    __shared__ float sums[2 * (COLUMN_BLOCK / 32) * NORM_WINDOW];
    return sums;
}

// Is this block the last of `blocks` to finish a piece of work they share? `counter` counts
// the blocks done (0 before the first): the last one gets true in every thread, and puts the
// counter back to 0 for the next launch. Each thread's writes before the call are visible to
// the last block after it (the fence orders them before the count, CUDA's threadFenceReduction
// sample's way). All threads of the block must call it, once.
__device__ bool block_is_last(unsigned int* counter, unsigned int blocks) {
    __shared__ unsigned int done_before;
    __threadfence();
    __syncthreads();   // every thread's writes are fenced before the block is counted
    if (threadIdx.x == 0) {
        done_before = atomicAdd(counter, 1u);
        if (done_before == blocks - 1) *counter = 0;   // every block has counted: nobody reads it again
    }
    __syncthreads();
    return done_before == blocks - 1;
}

// Lane l of every warp gets the sum of lane l's val over the block's warps, in warp order (the
// same bits every run). All threads must call it.
__device__ float block_sum_over_warps(float val) {
    __shared__ float values[32][32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    __syncthreads();   // an earlier call's readers are done with values
    values[warp][lane] = val;
    __syncthreads();
    float sum = 0.0f;
    for (int w = 0; w < warps; w++) sum += values[w][lane];
    return sum;
}

__device__ double warp_reduce_sum_double(double val) {
    for (int offset = 16; offset > 0; offset /= 2) val += __shfl_xor_sync(0xffffffffu, val, offset);
    return val;
}

// Max and sum over the whole block, in a fixed order (the same bits every run); every thread
// gets the result. All threads must call them.
__device__ float block_reduce_max(float val) {
    __shared__ float warp_maxima[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    val = warp_reduce_max(val);
    __syncthreads();  // an earlier call's readers are done with warp_maxima
    if (lane == 0) warp_maxima[warp] = val;
    __syncthreads();
    val = lane < warps ? warp_maxima[lane] : -INFINITY;
    return warp_reduce_max(val);
}

__device__ float block_reduce_sum(float val) {
    __shared__ float warp_sums[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    val = warp_reduce_sum(val);
    __syncthreads();
    if (lane == 0) warp_sums[warp] = val;
    __syncthreads();
    val = lane < warps ? warp_sums[lane] : 0.0f;
    return warp_reduce_sum(val);
}

// Sum over the whole block; every thread gets the total. All threads must call it.
__device__ double block_reduce_sum_double(double val) {
    __shared__ double warp_sums[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    val = warp_reduce_sum_double(val);
    __syncthreads();  // an earlier call's readers are done with warp_sums
    if (lane == 0) warp_sums[warp] = val;
    __syncthreads();
    val = lane < warps ? warp_sums[lane] : 0.0;
    return warp_reduce_sum_double(val);
}

// ----------------------------------------------------------------------------
// 128-bit packs (llm.c's "Packed128"): the elementwise kernels move 16 bytes per access
// A GPU serves a warp's loads in 32-byte sectors; one 2-byte load per thread issues 8x as
// many load instructions as one 16-byte load per thread for the same bytes. So a thread
// takes a pack of X128 = 8 consecutive floatX and loads or stores it with one 128-bit access.
// The GPU requires such an access to be 16-byte aligned (else "misaligned address"); the
// emulation checks every one (CHECK_ALIGNED_128, tests/emu/cuda_runtime.h). The packs are
// used only where they are known to be whole and aligned (load_pack/store_pack check both
// and fall back to element by element, so every kernel still takes any n, any row length C
// and any pointer: an odd C, a tail of n % 8, a buffer that is not 16-byte aligned).

#define X128 8   // floatX per 128-bit pack
typedef struct __align__(16) {
    floatX e[X128];
} x128;
static_assert(sizeof(x128) == 16, "a pack is 16 bytes");

#ifndef CHECK_ALIGNED_128
#define CHECK_ALIGNED_128(p, access)   // nothing on the GPU: the hardware faults by itself
#endif

// one 128-bit load or store; p must be 16-byte aligned
__device__ x128 load128(const floatX* p) {
    CHECK_ALIGNED_128(p, "reads");
    return *(const x128*)p;
}
__device__ void store128(floatX* p, x128 v) {
    CHECK_ALIGNED_128(p, "writes");
    *(x128*)p = v;
}

__device__ x128 zero_pack(void) {
    x128 v;
    for (int k = 0; k < X128; k++) v.e[k] = to_floatX(0.0f);
    return v;
}

__device__ bool aligned_128(const void* p) { return ((uintptr_t)p & 15) == 0; }

// elements p[0 .. count) into a pack (count <= X128; the rest of the pack is 0): one 128-bit
// load when the pack is whole and aligned, else one element at a time
__device__ x128 load_pack(const floatX* p, int count) {
    if (count == X128 && aligned_128(p)) return load128(p);
    x128 v = zero_pack();
    for (int k = 0; k < count && k < X128; k++) v.e[k] = p[k];
    return v;
}

// the first `count` elements of v to p[0 .. count)
__device__ void store_pack(floatX* p, x128 v, int count) {
    if (count == X128 && aligned_128(p)) {
        store128(p, v);
        return;
    }
    for (int k = 0; k < count && k < X128; k++) p[k] = v.e[k];
}

// how many of the X128 elements from i on are below n
__device__ int pack_count(size_t i, size_t n) { return n - i < (size_t)X128 ? (int)(n - i) : X128; }
#endif

// ============================================================================
// the ops: each `<op>_cpu` reference, then its CUDA version
// ============================================================================
// The references are compiled in every build (the tests hold the CUDA kernels against
// them) and called by the CPU build only: a build that does not call one is not a mistake.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

// ----------------------------------------------------------------------------
// the references' inner loops, written so that the compiler runs them on vector lanes
// GCC vectorizes a loop only where it can prove it safe: __restrict__ says that the arrays do
// not overlap, and `omp simd` lets a sum be split over the lanes (a split fixed at compile
// time: the same bits every run, whatever the thread count). A loop that updates several
// arrays through pointers it cannot tell apart runs one element at a time.

// y[i] += a * x[i]
static inline void axpy_lanes(float* __restrict__ y, float a, const float* __restrict__ x, int n) {
    #pragma omp simd
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

// the sum of x[i] * y[i]: 8 running sums (element i goes to sum i % 8), which the compiler
// keeps in vector lanes, added pairwise at the end. (`omp simd reduction` adds its lanes one
// after the other at the end, a chain of 16 adds on AVX-512 that took most of a head-size dot
// product.)
static inline float dot_lanes(const float* x, const float* y, int n) {
    float s[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += x[i + j] * y[i + j];
    for (; i < n; i++) s[i % 8] += x[i] * y[i];
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

// exp(x) in arithmetic that vectorizes. glibc's expf is a call, one element at a time (its
// vector versions need -ffast-math), and was most of the time of GELU and the cross-entropy.
// Cephes's expf (Moshier): exp(x) = 2^k exp(r), k = round(x / ln 2), r = x - k ln 2 in
// [-ln2/2, ln2/2] (ln 2 in two parts, the first exact in few bits, so that r is exact), exp(r)
// by a polynomial. Within 1.03 ulp of exp over [-87, 88] (tests/test_kernels.c measures it);
// below -87 it gives 0 (exp(-87) = 1.6e-38, next to nothing beside any sum it joins), above 88
// +inf (exp overflows a float at 88.72), NaN stays NaN. The rounding adds and subtracts
// 1.5 * 2^23 (which leaves the nearest integer), and 2^k is built from its bits: no branch, no
// call, so every lane runs it.
static inline float exp_poly(float x) {
    float c = x >= -87.0f ? (x <= 88.0f ? x : 88.0f) : -87.0f;   // (NaN -> -87: k stays an integer)
    float k = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = (c - k * 0.693359375f) - k * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)k + 127) << 23;   // 2^k, k in [-126, 127]
    float two_k;
    memcpy(&two_k, &bits, sizeof(two_k));
    return x < -87.0f ? 0.0f : x > 88.0f ? INFINITY : x != x ? x : p * two_k;
}

// ----------------------------------------------------------------------------
// embedding: out[n] = wte[token[n]] + wpe[n % T]
// Vocab-parallel (Megatron): this rank holds rows [vocab_start, vocab_start + vocab_local)
// of the word embedding; a token outside that range contributes zeros here and the rows
// are summed over the tensor-parallel group. wpe is NULL where position embeddings are
// added elsewhere (only one tensor-parallel rank adds them before that sum).

static void encoder_forward_cpu(float* out, const int* tokens, const float* wte, const float* wpe,
                                int N, int T, int C, int vocab_start, int vocab_local) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        int local = tokens[n] - vocab_start;
        const float* w = local >= 0 && local < vocab_local ? wte + (size_t)local * C : NULL;
        const float* p = wpe ? wpe + (size_t)(n % T) * C : NULL;
        float* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) {
            o[c] = (w ? w[c] : 0.0f) + (p ? p[c] : 0.0f);
        }
    }
}

static void encoder_backward_cpu(float* dwte, float* dwpe, const float* dout, const int* tokens,
                                 int N, int T, int C, int vocab_start, int vocab_local) {
    // parallel over column chunks: each thread owns some columns of every row, so no two
    // threads add into the same element and the order of the adds is fixed
    int chunks = CEIL_DIV(C, 64);
    #pragma omp parallel for
    for (int k = 0; k < chunks; k++) {
        int c0 = k * 64, c1 = c0 + 64 < C ? c0 + 64 : C;
        for (int n = 0; n < N; n++) {
            int local = tokens[n] - vocab_start;
            const float* d = dout + (size_t)n * C;
            if (local >= 0 && local < vocab_local) {
                float* w = dwte + (size_t)local * C;
                for (int c = c0; c < c1; c++) w[c] += d[c];
            }
            if (dwpe) {
                float* p = dwpe + (size_t)(n % T) * C;
                for (int c = c0; c < c1; c++) p[c] += d[c];
            }
        }
    }
}

#ifdef __CUDACC__
// one warp per row n (see the warp-per-row kernels below), its lanes taking packs of the row:
// the token and the position are looked up once per row, not per element
__global__ void encoder_forward_kernel(floatX* out, const int* tokens, const floatX* wte, const floatX* wpe,
                                       int N, int T, int C, int vocab_start, int vocab_local) {
    int lane = threadIdx.x % 32, n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    int local = tokens[n] - vocab_start;
    const floatX* w = local >= 0 && local < vocab_local ? wte + (size_t)local * C : NULL;
    const floatX* p = wpe != NULL ? wpe + (size_t)(n % T) * C : NULL;
    floatX* o = out + (size_t)n * C;
    for (int c = lane * X128; c < C; c += 32 * X128) {
        int count = C - c < X128 ? C - c : X128;
        x128 pw = w ? load_pack(w + c, count) : zero_pack(), pp = p ? load_pack(p + c, count) : zero_pack(), po;
        for (int k = 0; k < X128; k++) po.e[k] = to_floatX(floatX_to_float(pw.e[k]) + floatX_to_float(pp.e[k]));
        store_pack(o + c, po, count);
    }
}

// one thread per element of dout; tokens repeat, so rows of dwte are added with atomics
__global__ void encoder_backward_wte_kernel(float* dwte, const floatX* dout, const int* tokens,
                                            int N, int C, int vocab_start, int vocab_local) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * C) return;
    int n = (int)(idx / C), c = (int)(idx % C);
    int local = tokens[n] - vocab_start;
    if (local >= 0 && local < vocab_local) atomicAdd(&dwte[(size_t)local * C + c], floatX_to_float(dout[idx]));
}

// one thread per element of dwpe, summing the rows n = t, t + T, t + 2T, ... in order
__global__ void encoder_backward_wpe_kernel(float* dwpe, const floatX* dout, int N, int T, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)T * C) return;
    int t = (int)(idx / C), c = (int)(idx % C);
    float sum = 0.0f;
    for (int n = t; n < N; n += T) sum += floatX_to_float(dout[(size_t)n * C + c]);
    dwpe[idx] += sum;
}

static void encoder_forward(floatX* out, const int* tokens, const floatX* wte, const floatX* wpe,
                            int N, int T, int C, int vocab_start, int vocab_local) {
    LAUNCH(encoder_forward_kernel, CEIL_DIV(N, ROWS_PER_BLOCK), ROW_BLOCK, 0,
           out, tokens, wte, wpe, N, T, C, vocab_start, vocab_local);
}

static void encoder_backward(float* dwte, float* dwpe, const floatX* dout, const int* tokens,
                             int N, int T, int C, int vocab_start, int vocab_local) {
    LAUNCH(encoder_backward_wte_kernel, CEIL_DIV((size_t)N * C, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0,
           dwte, dout, tokens, N, C, vocab_start, vocab_local);
    if (dwpe != NULL) {
        LAUNCH(encoder_backward_wpe_kernel, CEIL_DIV((size_t)T * C, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0,
               dwpe, dout, N, T, C);
    }
}
#else
#define encoder_forward encoder_forward_cpu
#define encoder_backward encoder_backward_cpu
#endif

// ----------------------------------------------------------------------------
// residual add: out = a + b (out may be a or b). Its backward is the identity on both
// inputs, which the model gets for free: one gradient buffer (the residual stream's) flows through.

static void residual_forward_cpu(float* out, const float* a, const float* b, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

#ifdef __CUDACC__
// one thread per pack of X128 elements (the last one may be short)
__global__ void residual_forward_kernel(floatX* out, const floatX* a, const floatX* b, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * X128;
    if (i >= n) return;
    int count = pack_count(i, n);
    x128 pa = load_pack(a + i, count), pb = load_pack(b + i, count), po;
    for (int k = 0; k < X128; k++) po.e[k] = to_floatX(floatX_to_float(pa.e[k]) + floatX_to_float(pb.e[k]));
    store_pack(out + i, po, count);
}

static void residual_forward(floatX* out, const floatX* a, const floatX* b, size_t n) {
    LAUNCH(residual_forward_kernel, CEIL_DIV(CEIL_DIV(n, X128), ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0, out, a, b, n);
}
#else
#define residual_forward residual_forward_cpu
#endif


// ----------------------------------------------------------------------------
// column reductions: the sums over rows that bias and LayerNorm parameter gradients need
// On the GPU the rows are cut into chunks, fixed by the shapes alone (never by the device, so
// the result is the same everywhere): each block writes one fp32 partial sum per chunk and
// column into a workspace, [chunks, columns], and each column's partials are then added in
// chunk order (0, 1, 2, ...) into the gradient: for a bias by the last block to finish the
// column's tile, in the same launch (column_sums_kernel); for LayerNorm, whose blocks each hold
// all the columns of their rows (so one block would be left adding up every column), by a
// second kernel, column_partials_add. Each sum is then a fixed sequence of fp32 adds, whatever
// order the blocks run in: two runs give the same bits. The CPU build sums straight into the
// gradient and needs no workspace.

HOST_DEVICE static inline int min_int(int a, int b) { return a < b ? a : b; }

// chunks of a bias sum over N rows and OC columns: enough for about COLUMN_REDUCE_BLOCKS
// blocks of COLUMN_BLOCK columns, with at least COLUMN_CHUNK_ROWS rows each (where N allows),
// the rows spread evenly and none empty
static int bias_grad_chunks(int N, int OC) {
    if (N <= 0 || OC <= 0) return 0;
    int wanted = min_int(CEIL_DIV(N, COLUMN_CHUNK_ROWS), CEIL_DIV(COLUMN_REDUCE_BLOCKS, CEIL_DIV(OC, COLUMN_BLOCK)));
    return CEIL_DIV(N, CEIL_DIV(N, wanted));
}

// chunks of LayerNorm's parameter gradients: COLUMN_CHUNK_ROWS rows each (the last may have fewer)
static int layernorm_grad_chunks(int N) { return N <= 0 ? 0 : CEIL_DIV(N, COLUMN_CHUNK_ROWS); }

// the workspace floats (gpt.h's column_partials) on build b: a bias sum's [chunks, OC]
// partials, LayerNorm's [2, chunks, C] (dweight's, then dbias's); none on the CPU build
static size_t bias_grad_partials(BuildTarget b, int N, int OC) {
    return b.gpu ? (size_t)bias_grad_chunks(N, OC) * OC : 0;
}
static size_t layernorm_grad_partials(BuildTarget b, int N, int C) {
    return b.gpu ? 2 * (size_t)layernorm_grad_chunks(N) * C : 0;
}

#ifdef __CUDACC__
// out[c] += the sum of partials[0 .. chunks, c], in a fixed order: block b takes 32 columns (lane
// l: column 32 b + l), and its warp w the run of chunks [w chunks / 32, (w + 1) chunks / 32), added
// in order (a warp reads 32 adjacent floats of a chunk's row at a time); then the 32 runs' sums
// are added in warp order (block_sum_over_warps). With out2 (else NULL) the same for the [chunks,
// C] partials that follow, into out2: columns C .. 2C - 1 of the grid. A thread per column adding
// all `chunks` partials (before issue 39) launched 12 blocks at C = 768, each thread 512 dependent
// loads and adds in a row at 16 x 1024 tokens: latency, not bandwidth; here 48 blocks, 16 each.
__global__ void column_partials_add_kernel(float* out, float* out2, const float* partials, int chunks, int C) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    int idx = blockIdx.x * 32 + lane, second = idx >= C, c = idx - (second ? C : 0);
    bool here = idx < (out2 != NULL ? 2 * C : C);
    const float* p = partials + (size_t)second * chunks * C + c;
    float sum = 0.0f;
    int k1 = (int)((long long)(warp + 1) * chunks / warps);
    UNROLL_4
    for (int k = (int)((long long)warp * chunks / warps); k < k1 && here; k++) sum += p[(size_t)k * C];
    sum = block_sum_over_warps(sum);
    if (here && warp == 0) (second ? out2 : out)[c] += sum;
}

static void column_partials_add(float* out, float* out2, const float* partials, int chunks, int C) {
    LAUNCH(column_partials_add_kernel, CEIL_DIV((out2 != NULL ? 2 : 1) * C, 32), COLUMN_ADD_BLOCK, 0,
           out, out2, partials, chunks, C);
}
#endif

// ----------------------------------------------------------------------------
// LayerNorm over the last dimension, eps = 1e-5 (Megatron's default)

#define LAYERNORM_EPS 1e-5f

static void layernorm_forward_cpu(float* out, float* mean, float* rstd, const float* inp,
                                  const float* weight, const float* bias, int N, int C) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        double m = 0.0, v = 0.0;   // (the sums on vector lanes: one chain of double adds is slow)
        #pragma omp simd reduction(+ : m)
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        #pragma omp simd reduction(+ : v)
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= C;
        float s = (float)(1.0 / sqrt(v + LAYERNORM_EPS));
        float* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = ((x[c] - (float)m) * s) * weight[c] + bias[c];
        mean[n] = (float)m;
        rstd[n] = s;
    }
}

// d(inp) += rstd * (g - mean(g) - xhat * mean(g * xhat)), with g = dout * weight
static void layernorm_backward_cpu(float* dinp, float* dweight, float* dbias, const float* dout,
                                   const float* inp, const float* weight, const float* mean,
                                   const float* rstd, int N, int C) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        const float* d = dout + (size_t)n * C;
        float m = mean[n], s = rstd[n];
        double g_mean = 0.0, gx_mean = 0.0;
        #pragma omp simd reduction(+ : g_mean, gx_mean)
        for (int c = 0; c < C; c++) {
            float g = d[c] * weight[c];
            g_mean += g;
            gx_mean += g * ((x[c] - m) * s);
        }
        g_mean /= C;
        gx_mean /= C;
        float* di = dinp + (size_t)n * C;
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - m) * s;
            di[c] += s * (d[c] * weight[c] - (float)g_mean - xhat * (float)gx_mean);
        }
    }
    // parameter gradients: columns are independent, each summed over rows in order; 64
    // columns at a time, so that the rows are read along (column_sums_add_cpu's way)
    int chunks = CEIL_DIV(C, 64);
    #pragma omp parallel for
    for (int k = 0; k < chunks; k++) {
        int c0 = k * 64, c1 = c0 + 64 < C ? c0 + 64 : C;
        float dw[64] = {0}, db[64] = {0};
        for (int n = 0; n < N; n++) {
            const float* d = dout + (size_t)n * C;
            const float* x = inp + (size_t)n * C;
            for (int c = c0; c < c1; c++) {
                dw[c - c0] += d[c] * ((x[c] - mean[n]) * rstd[n]);
                db[c - c0] += d[c];
            }
        }
        for (int c = c0; c < c1; c++) {
            dweight[c] += dw[c - c0];
            dbias[c] += db[c - c0];
        }
    }
}

// residual = a + b, then out = LayerNorm(residual) with its mean and rstd: the residual add
// and the LayerNorm that follows it, which the GPU build does in one pass over the rows
static void residual_layernorm_forward_cpu(float* residual, float* out, float* mean, float* rstd,
                                           const float* a, const float* b, const float* weight,
                                           const float* bias, int N, int C) {
    residual_forward_cpu(residual, a, b, (size_t)N * C);
    layernorm_forward_cpu(out, mean, rstd, residual, weight, bias, N, C);
}

#ifdef __CUDACC__
// LayerNorm: the forward one warp per row; the backward one block per chunk of rows

// In the warp-per-row kernels, warp w of block b owns row b * ROWS_PER_BLOCK + w and its
// lanes stride along the row. A warp past the last row leaves as a whole, so the shuffles
// of the other warps still see all 32 lanes.
// LayerNorm of the row x[0 .. C) into o[0 .. C), by the 32 lanes of one warp, lane l taking
// the packs that start at 8l, 8l + 256, ...; writes the row's mean and rstd (lane 0).
__device__ void layernorm_row(floatX* o, float* mean, float* rstd, const floatX* x, const floatX* weight,
                              const floatX* bias, int C, int lane) {
    float sum = 0.0f;
    for (int c = lane * X128; c < C; c += 32 * X128) {
        x128 px = load_pack(x + c, C - c < X128 ? C - c : X128);   // the missing elements are 0
        for (int k = 0; k < X128; k++) sum += floatX_to_float(px.e[k]);
    }
    float m = warp_reduce_sum(sum) / C;
    float var = 0.0f;  // two passes: the variance of (x - m), as the reference
    for (int c = lane * X128; c < C; c += 32 * X128) {
        int count = C - c < X128 ? C - c : X128;
        x128 px = load_pack(x + c, count);
        for (int k = 0; k < count; k++) {
            float d = floatX_to_float(px.e[k]) - m;
            var += d * d;
        }
    }
    float s = 1.0f / sqrtf(warp_reduce_sum(var) / C + LAYERNORM_EPS);
    for (int c = lane * X128; c < C; c += 32 * X128) {
        int count = C - c < X128 ? C - c : X128;
        x128 px = load_pack(x + c, count), pw = load_pack(weight + c, count), pb = load_pack(bias + c, count), po;
        for (int k = 0; k < X128; k++) {
            float xhat = (floatX_to_float(px.e[k]) - m) * s;
            po.e[k] = to_floatX(xhat * floatX_to_float(pw.e[k]) + floatX_to_float(pb.e[k]));
        }
        store_pack(o + c, po, count);
    }
    if (lane == 0) {
        *mean = m;
        *rstd = s;
    }
}

__global__ void layernorm_forward_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                         const floatX* weight, const floatX* bias, int N, int C) {
    int lane = threadIdx.x % 32, n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    layernorm_row(out + (size_t)n * C, mean + n, rstd + n, inp + (size_t)n * C, weight, bias, C, lane);
}

// residual = a + b, then out = LayerNorm(residual): one warp per row. The lane that writes a
// pack of the residual row (rounded to floatX, as residual_forward stores it) is the lane
// that reads it back in layernorm_row, so no barrier is needed; residual may be a or b.
// Saves residual_forward's second pass over the residual stream (one read of N * C).
__global__ void residual_layernorm_forward_kernel(floatX* residual, floatX* out, float* mean, float* rstd,
                                                  const floatX* a, const floatX* b, const floatX* weight,
                                                  const floatX* bias, int N, int C) {
    int lane = threadIdx.x % 32, n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    size_t row = (size_t)n * C;
    for (int c = lane * X128; c < C; c += 32 * X128) {
        int count = C - c < X128 ? C - c : X128;
        x128 pa = load_pack(a + row + c, count), pb = load_pack(b + row + c, count), pr;
        for (int k = 0; k < X128; k++) pr.e[k] = to_floatX(floatX_to_float(pa.e[k]) + floatX_to_float(pb.e[k]));
        store_pack(residual + row + c, pr, count);
    }
    layernorm_row(out + row, mean + n, rstd + n, residual + row, weight, bias, C, lane);
}

// The backward of LayerNorm (layernorm true) and of RMSNorm (false: no mean, no bias), one block
// per chunk of COLUMN_CHUNK_ROWS rows: block k takes the rows [32k, 32k + 32), warp w its
// NORM_WARP_ROWS rows 4w .. 4w + 3 all the way, in two steps:
//   1. the warp's rows' mean(g) and mean(g xhat), g = dout * weight (LayerNorm; RMSNorm's xhat
//      is x rstd and it needs the second alone), in registers: every lane has them after the
//      butterfly sums, so the block needs no barrier for them;
//   2. the columns in windows of NORM_WINDOW, lane l the pack at 8 l: dinp += rstd * (g -
//      mean(g) - xhat * mean(g xhat)) on the warp's rows, and their sums of dout xhat and dout
//      into block_column_partials; after a barrier, warp k adds element k of each lane's pack
//      over the 8 warps, in warp order, and writes the chunk's partials of dweight (dout xhat)
//      and dbias (dout), [2, chunks, C] ([chunks, C] for RMSNorm), for column_partials_add.
// A lane loads the packs of all its rows before it computes and stores any (and the pointers are
// __restrict__), so no row's loads wait for the row before it: where one thread took a pack
// down all 32 rows, each row's loads waited for the previous row's store of dinp, which the
// compiler had to take for the same memory, and at C = 768 only 96 of the 256 threads had a
// pack. A row past N (the last chunk) reads row N - 1 again and stores nothing. Step 2 reads
// again the rows step 1 read, from the cache: dout and inp come from memory once. Both steps
// move floatX in 128-bit packs (load_pack: element by element where a row's pack is not whole
// and aligned, e.g. an odd C), the forward kernels' way.
#define NORM_WARP_ROWS (COLUMN_CHUNK_ROWS / (COLUMN_BLOCK / 32))
static_assert(NORM_WARP_ROWS * (COLUMN_BLOCK / 32) == COLUMN_CHUNK_ROWS && NORM_WINDOW == 32 * X128,
              "a chunk's rows shared evenly by the block's warps; a window is a pack a lane");

// load_pack and store_pack where `whole` says every pack of the rows is whole and aligned
// (count X128, or 0 past the end of the row): straight 128-bit accesses, no element-by-element
// branch, which the compiler would otherwise lay out, with its registers, for each of them
__device__ x128 pack_load(const floatX* p, int count, bool whole) {
    if (whole) return count == X128 ? load128(p) : zero_pack();
    x128 v;
    UNROLL
    for (int k = 0; k < X128; k++) v.e[k] = k < count ? p[k] : to_floatX(0.0f);
    return v;
}
__device__ void pack_store(floatX* p, x128 v, int count, bool whole) {
    if (whole) {
        if (count == X128) store128(p, v);
        return;
    }
    UNROLL
    for (int k = 0; k < X128; k++)
        if (k < count) p[k] = v.e[k];
}

// the offset of row n of an [N, C] array, a row past N read as N - 1 (a chunk's last warp may
// hold rows past the end: it reads the last row again and stores nothing)
__device__ size_t row_at(int n, int N, int C) { return (size_t)min_int(n, N - 1) * C; }

__device__ void norm_backward_chunk(floatX* __restrict__ dinp, float* __restrict__ partials,
                                    const floatX* __restrict__ dout, const floatX* __restrict__ inp,
                                    const floatX* __restrict__ weight, const float* __restrict__ mean,
                                    const float* __restrict__ rstd, int N, int C, bool layernorm, bool whole) {
    constexpr int R = NORM_WARP_ROWS, warps = COLUMN_BLOCK / 32;
    float* sums = block_column_partials();   // [2][warps][X128][32]
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, chunks = gridDim.x;
    int n0 = blockIdx.x * COLUMN_CHUNK_ROWS + warp * R;
    float m[R], s[R], g_mean[R], gx_mean[R];
    for (int r = 0; r < R; r++) {
        m[r] = layernorm ? mean[min_int(n0 + r, N - 1)] : 0.0f;
        s[r] = rstd[min_int(n0 + r, N - 1)];
        g_mean[r] = 0.0f;
        gx_mean[r] = 0.0f;
    }
    // 1. the rows' sums of g and g xhat: each lane its packs, then the warp's butterfly
    for (int c = lane * X128; c < C; c += NORM_WINDOW) {
        int count = min_int(C - c, X128);   // the pack's missing elements are 0
        x128 pw = pack_load(weight + c, count, whole), pd[R], px[R];
        for (int r = 0; r < R; r++) {
            pd[r] = pack_load(dout + row_at(n0 + r, N, C) + c, count, whole);
            px[r] = pack_load(inp + row_at(n0 + r, N, C) + c, count, whole);
        }
        for (int r = 0; r < R; r++)
            for (int k = 0; k < X128; k++) {
                float g = floatX_to_float(pd[r].e[k]) * floatX_to_float(pw.e[k]);
                g_mean[r] += g;
                gx_mean[r] += g * ((floatX_to_float(px[r].e[k]) - m[r]) * s[r]);
            }
    }
    for (int r = 0; r < R; r++) {
        g_mean[r] = layernorm ? warp_reduce_sum(g_mean[r]) / C : 0.0f;
        gx_mean[r] = warp_reduce_sum(gx_mean[r]) / C;
    }
    // 2. dinp, and the columns' sums over the chunk, a window at a time
    for (int c0 = 0; c0 < C; c0 += NORM_WINDOW) {
        int c = c0 + lane * X128, count = c < C ? min_int(C - c, X128) : 0;   // missing elements: 0, not stored
        x128 pw = pack_load(weight + c, count, whole), pd[R], px[R], pi[R];
        for (int r = 0; r < R; r++) {
            pd[r] = pack_load(dout + row_at(n0 + r, N, C) + c, count, whole);
            px[r] = pack_load(inp + row_at(n0 + r, N, C) + c, count, whole);
            pi[r] = pack_load(dinp + row_at(n0 + r, N, C) + c, count, whole);
        }
        x128 po[R];
        for (int k = 0; k < X128; k++) {   // element k of every row, then its sums over the rows
            float dw = 0.0f, db = 0.0f;
            for (int r = 0; r < R; r++) {
                float d = floatX_to_float(pd[r].e[k]), xhat = (floatX_to_float(px[r].e[k]) - m[r]) * s[r];
                float g = d * floatX_to_float(pw.e[k]);
                po[r].e[k] = to_floatX(floatX_to_float(pi[r].e[k]) + s[r] * (g - g_mean[r] - xhat * gx_mean[r]));
                dw += n0 + r < N ? d * xhat : 0.0f;
                db += n0 + r < N ? d : 0.0f;
            }
            sums[(warp * X128 + k) * 32 + lane] = dw;
            if (layernorm) sums[((warps + warp) * X128 + k) * 32 + lane] = db;
        }
        for (int r = 0; r < R; r++)
            if (n0 + r < N) pack_store(dinp + row_at(n0 + r, N, C) + c, po[r], count, whole);
        __syncthreads();
        float dw_sum = 0.0f, db_sum = 0.0f;   // column c0 + 8 lane + warp: element `warp` of lane's pack
        for (int w = 0; w < warps; w++) {
            dw_sum += sums[(w * X128 + warp) * 32 + lane];
            if (layernorm) db_sum += sums[((warps + w) * X128 + warp) * 32 + lane];
        }
        int column = c0 + lane * X128 + warp;
        if (column < C) {
            partials[(size_t)blockIdx.x * C + column] = dw_sum;
            if (layernorm) partials[(size_t)(chunks + blockIdx.x) * C + column] = db_sum;
        }
        __syncthreads();   // every warp has read the sums before the next window's are stored
    }
}

__global__ void __launch_bounds__(COLUMN_BLOCK, 2) layernorm_backward_kernel(floatX* dinp, float* partials, const floatX* dout, const floatX* inp,
                                          const floatX* weight, const float* mean, const float* rstd,
                                          int N, int C) {
    if (C % X128 == 0 && aligned_128(dinp) && aligned_128(dout) && aligned_128(inp) && aligned_128(weight))
        norm_backward_chunk(dinp, partials, dout, inp, weight, mean, rstd, N, C, true, true);
    else
        norm_backward_chunk(dinp, partials, dout, inp, weight, mean, rstd, N, C, true, false);
}

static void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp,
                              const floatX* weight, const floatX* bias, int N, int C) {
    LAUNCH(layernorm_forward_kernel, CEIL_DIV(N, ROWS_PER_BLOCK), ROW_BLOCK, 0,
           out, mean, rstd, inp, weight, bias, N, C);
}

static void residual_layernorm_forward(floatX* residual, floatX* out, float* mean, float* rstd,
                                       const floatX* a, const floatX* b, const floatX* weight,
                                       const floatX* bias, int N, int C) {
    LAUNCH(residual_layernorm_forward_kernel, CEIL_DIV(N, ROWS_PER_BLOCK), ROW_BLOCK, 0,
           residual, out, mean, rstd, a, b, weight, bias, N, C);
}

// partials: layernorm_grad_partials(N, C) floats of workspace
static void layernorm_backward(floatX* dinp, float* dweight, float* dbias, float* partials, const floatX* dout,
                               const floatX* inp, const floatX* weight, const float* mean,
                               const float* rstd, int N, int C) {
    int chunks = layernorm_grad_chunks(N);
    LAUNCH(layernorm_backward_kernel, chunks, COLUMN_BLOCK, 0, dinp, partials, dout, inp, weight, mean, rstd, N, C);
    column_partials_add(dweight, dbias, partials, chunks, C);
}
#else
#define layernorm_forward layernorm_forward_cpu
#define layernorm_backward(dinp, dweight, dbias, partials, ...) layernorm_backward_cpu(dinp, dweight, dbias, __VA_ARGS__)
#define residual_layernorm_forward residual_layernorm_forward_cpu
#endif

// ----------------------------------------------------------------------------
// RMSNorm (Zhang and Sennrich 2019; Megatron's --normalization RMSNorm, --norm-epsilon):
// out = x / sqrt(mean(x^2) + eps) * weight, per row of C; no mean subtracted, no bias.
// The forward keeps each row's rstd = 1 / sqrt(mean(x^2) + eps) for the backward. As LayerNorm's,
// the backward ADDS its dinp into the residual stream's gradient and accumulates dweight; on
// the GPU through the same [chunks, C] column partials (rmsnorm_grad_partials floats).

static void rmsnorm_forward_cpu(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                                float eps) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        float s = (float)(1.0 / sqrt(ss / C + eps));
        float* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] * s) * weight[c];
        rstd[n] = s;
    }
}

// d(inp) += rstd * (g - xhat * mean(g * xhat)), with g = dout * weight and xhat = x * rstd
// (the mean-free half of LayerNorm's formula); dweight += column sums of dout * xhat
static void rmsnorm_backward_cpu(float* dinp, float* dweight, const float* dout, const float* inp,
                                 const float* weight, const float* rstd, int N, int C) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        const float* d = dout + (size_t)n * C;
        float s = rstd[n];
        double gx_mean = 0.0;
        for (int c = 0; c < C; c++) gx_mean += (d[c] * weight[c]) * (x[c] * s);
        gx_mean /= C;
        float* di = dinp + (size_t)n * C;
        for (int c = 0; c < C; c++) di[c] += s * (d[c] * weight[c] - (x[c] * s) * (float)gx_mean);
    }
    #pragma omp parallel for
    for (int c = 0; c < C; c++) {
        float dw = 0.0f;
        for (int n = 0; n < N; n++) dw += dout[(size_t)n * C + c] * (inp[(size_t)n * C + c] * rstd[n]);
        dweight[c] += dw;
    }
}

// the workspace floats of rmsnorm_backward on build b: dweight's [chunks, C] partials
static size_t rmsnorm_grad_partials(BuildTarget b, int N, int C) {
    return b.gpu ? (size_t)layernorm_grad_chunks(N) * C : 0;
}

#ifdef __CUDACC__
// the forward one warp per row (layernorm_forward_kernel's layout); the backward one block per
// chunk of COLUMN_CHUNK_ROWS rows (layernorm_backward_kernel's two steps, without the mean)
__global__ void rmsnorm_forward_kernel(floatX* out, float* rstd, const floatX* inp, const floatX* weight,
                                       int N, int C, float eps) {
    int lane = threadIdx.x % 32, n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    const floatX* x = inp + (size_t)n * C;
    floatX* o = out + (size_t)n * C;
    float ss = 0.0f;
    for (int c = lane * X128; c < C; c += 32 * X128) {
        x128 px = load_pack(x + c, C - c < X128 ? C - c : X128);   // the missing elements are 0
        for (int k = 0; k < X128; k++) ss += floatX_to_float(px.e[k]) * floatX_to_float(px.e[k]);
    }
    float s = 1.0f / sqrtf(warp_reduce_sum(ss) / C + eps);
    for (int c = lane * X128; c < C; c += 32 * X128) {
        int count = C - c < X128 ? C - c : X128;
        x128 px = load_pack(x + c, count), pw = load_pack(weight + c, count), po;
        for (int k = 0; k < X128; k++) po.e[k] = to_floatX(floatX_to_float(px.e[k]) * s * floatX_to_float(pw.e[k]));
        store_pack(o + c, po, count);
    }
    if (lane == 0) rstd[n] = s;
}

// layernorm_backward_kernel's steps without the mean and the bias: dinp += rstd * (g - xhat *
// mean(g xhat)) with xhat = x rstd, g = dout * weight, and the chunk's partial sums of dweight
// (dout xhat) into partials [chunks, C] for column_partials_add
__global__ void __launch_bounds__(COLUMN_BLOCK, 2) rmsnorm_backward_kernel(floatX* dinp, float* partials, const floatX* dout, const floatX* inp,
                                        const floatX* weight, const float* rstd, int N, int C) {
    if (C % X128 == 0 && aligned_128(dinp) && aligned_128(dout) && aligned_128(inp) && aligned_128(weight))
        norm_backward_chunk(dinp, partials, dout, inp, weight, NULL, rstd, N, C, false, true);
    else
        norm_backward_chunk(dinp, partials, dout, inp, weight, NULL, rstd, N, C, false, false);
}

static void rmsnorm_forward(floatX* out, float* rstd, const floatX* inp, const floatX* weight, int N, int C,
                            float eps) {
    LAUNCH(rmsnorm_forward_kernel, CEIL_DIV(N, ROWS_PER_BLOCK), ROW_BLOCK, 0, out, rstd, inp, weight, N, C, eps);
}

// partials: rmsnorm_grad_partials(N, C) floats of workspace
static void rmsnorm_backward(floatX* dinp, float* dweight, float* partials, const floatX* dout, const floatX* inp,
                             const floatX* weight, const float* rstd, int N, int C) {
    int chunks = layernorm_grad_chunks(N);
    LAUNCH(rmsnorm_backward_kernel, chunks, COLUMN_BLOCK, 0, dinp, partials, dout, inp, weight, rstd, N, C);
    column_partials_add(dweight, NULL, partials, chunks, C);
}
#else
#define rmsnorm_forward rmsnorm_forward_cpu
#define rmsnorm_backward(dinp, dweight, partials, ...) rmsnorm_backward_cpu(dinp, dweight, __VA_ARGS__)
#endif

// ----------------------------------------------------------------------------
// linear layer: out[N, OC] = inp[N, C] @ weight[OC, C]^T + bias[OC]   (bias may be NULL)
// The plain loops are the reference; with USE_BLAS the CPU build hands the same products
// to sgemm, as the GPU build hands them to cuBLAS.

static void matmul_forward_reference(float* out, const float* inp, const float* weight,
                                     const float* bias, int N, int C, int OC) {
    #pragma omp parallel for collapse(2)
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            const float* x = inp + (size_t)n * C;
            const float* w = weight + (size_t)o * C;
            float acc = bias ? bias[o] : 0.0f;
            for (int c = 0; c < C; c++) acc += x[c] * w[c];
            out[(size_t)n * OC + o] = acc;
        }
    }
}

// dinp = dout @ weight;  dweight += dout^T @ inp;  dbias += column sums of dout
static void matmul_backward_reference(float* dinp, float* dweight, float* dbias, const float* dout,
                                      const float* inp, const float* weight, int N, int C, int OC) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float* di = dinp + (size_t)n * C;
        for (int c = 0; c < C; c++) di[c] = 0.0f;
        for (int o = 0; o < OC; o++) {
            float d = dout[(size_t)n * OC + o];
            const float* w = weight + (size_t)o * C;
            for (int c = 0; c < C; c++) di[c] += d * w[c];
        }
    }
    #pragma omp parallel for
    for (int o = 0; o < OC; o++) {
        float* dw = dweight + (size_t)o * C;
        float db = 0.0f;
        for (int n = 0; n < N; n++) {
            float d = dout[(size_t)n * OC + o];
            const float* x = inp + (size_t)n * C;
            for (int c = 0; c < C; c++) dw[c] += d * x[c];
            db += d;
        }
        if (dbias) dbias[o] += db;
    }
}

// column sums of a [N, OC] matrix added into out[OC]
static void column_sums_add_cpu(float* out, const float* x, int N, int OC) {
    // chunks of 64 columns, rows walked in order inside a chunk (contiguous reads)
    int chunks = CEIL_DIV(OC, 64);
    #pragma omp parallel for
    for (int k = 0; k < chunks; k++) {
        int o0 = k * 64, o1 = o0 + 64 < OC ? o0 + 64 : OC;
        float s[64] = {0};
        for (int n = 0; n < N; n++)
            for (int o = o0; o < o1; o++) s[o - o0] += x[(size_t)n * OC + o];
        for (int o = o0; o < o1; o++) out[o] += s[o - o0];
    }
}

static void matmul_forward_cpu(float* out, const float* inp, const float* weight, const float* bias,
                               int N, int C, int OC) {
#ifdef USE_BLAS
    // start from the bias rows and let sgemm add the product (beta = 1)
    float beta = 0.0f;
    if (bias) {
        #pragma omp parallel for
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, OC * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, beta, out, OC);
#else
    matmul_forward_reference(out, inp, weight, bias, N, C, OC);
#endif
}

static void matmul_backward_cpu(float* dinp, float* dweight, float* dbias, const float* dout,
                                const float* inp, const float* weight, int N, int C, int OC) {
#ifdef USE_BLAS
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias) column_sums_add_cpu(dbias, dout, N, OC);
#else
    matmul_backward_reference(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
#endif
}

#ifdef __CUDACC__
// linear layer: out[N, OC] = inp[N, C] @ weight[OC, C]^T + bias[OC], through cuBLAS
//
// cuBLAS is column-major. A row-major [R, K] array read column-major is its transpose, a
// [K, R] matrix with leading dimension K. So every product below is written for the
// transposes: out^T = W inp^T, and so on. (transa, transb, m, n, k) describe
// C[m, n] = op(A)[m, k] @ op(B)[k, n] in that column-major view.

// out[n, :] = bias, for the forward GEMM to add its product onto (beta = 1): only for a bias
// that cuBLASLt's epilogue cannot take (see matmul_forward). One warp per row.
__global__ void fill_rows_kernel(floatX* out, const floatX* bias, int N, int OC) {
    int lane = threadIdx.x % 32, n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    for (int o = lane; o < OC; o += 32) out[(size_t)n * OC + o] = bias[o];
}

// Bias gradient, one launch: block b sums chunk k = b / tiles of the rows, columns [j *
// COLUMN_BLOCK, (j + 1) * COLUMN_BLOCK) with j = b % tiles, into partials[k, :]. Thread t takes
// column j * COLUMN_BLOCK + t down the chunk's rows in order, so the block reads COLUMN_BLOCK
// adjacent elements of a row at a time. The block that finishes tile j last then adds the
// tile's partials in chunk order into out: every sum is a fixed sequence of fp32 adds whatever
// order the blocks ran in, as column_partials_add's, without its launch (a latency-bound one:
// a thread per column, each adding up `chunks` partials). The last block reads the partials
// through a volatile pointer: from L2, where the other blocks' writes are, never a stale L1 line.
__global__ void column_sums_kernel(float* out, float* partials, unsigned int* counters, const floatX* x, int N,
                                   int OC, int chunk_rows) {
    int tiles = CEIL_DIV(OC, COLUMN_BLOCK), chunks = gridDim.x / tiles;
    int k = blockIdx.x / tiles, j = blockIdx.x % tiles, o = j * COLUMN_BLOCK + threadIdx.x;
    if (o < OC) {
        int n0 = k * chunk_rows, n1 = min_int(n0 + chunk_rows, N);
        float sum = 0.0f;
        for (int n = n0; n < n1; n++) sum += floatX_to_float(x[(size_t)n * OC + o]);
        partials[(size_t)k * OC + o] = sum;
    }
    if (!block_is_last(&counters[j], chunks) || o >= OC) return;
    const volatile float* p = partials + o;
    float total = 0.0f;
    for (int c = 0; c < chunks; c++) total += p[(size_t)c * OC];
    out[o] += total;
}

// out[o] += the column sums of x[N, OC], through `chunks` partial sums a column (at least
// chunks * OC floats of workspace); the model takes bias_grad_chunks(N, OC), tests others
static void column_sums_add_chunks(float* out, float* partials, const floatX* x, int N, int OC, int chunks) {
    if (N <= 0 || OC <= 0) return;
    int chunk_rows = CEIL_DIV(N, chunks), tiles = CEIL_DIV(OC, COLUMN_BLOCK);
    chunks = CEIL_DIV(N, chunk_rows);   // none empty
    if (tiles > COLUMN_COUNTERS) fail("column sums over %d columns: more than the %d tiles of %d there are counters for",
                                      OC, COLUMN_COUNTERS, COLUMN_BLOCK);
    LAUNCH(column_sums_kernel, (size_t)chunks * tiles, COLUMN_BLOCK, 0, out, partials, column_counters, x, N, OC, chunk_rows);
}

static void column_sums_add(float* out, float* partials, const floatX* x, int N, int OC) {
    column_sums_add_chunks(out, partials, x, N, OC, bias_grad_chunks(N, OC));
}

// C = A op B + beta C with floatX A and B, fp32 compute; C is floatX or fp32 (Ctype)
static void gemm(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                 const floatX* A, int lda, const floatX* B, int ldb, float beta,
                 void* C, cudaDataType_t Ctype, int ldc) {
    const float alpha = 1.0f;
    cublasCheck(cublasGemmEx(cublas_handle, transa, transb, m, n, k, &alpha, A, CUDA_R_FLOATX, lda,
                             B, CUDA_R_FLOATX, ldb, &beta, C, Ctype, ldc, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT));
}

// the largest power of two, up to 256, that divides p's address: cuBLASLt's heuristic assumes
// 256-byte aligned matrices unless told less (the tensors in the flat parameter buffer are not)
static uint32_t alignment_of(const void* p) {
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a != 0) a /= 2;
    return a;
}

// ---- cuBLASLt: a product with an epilogue, its descriptors and algorithm cached per shape
// cuBLASLt applies the epilogue to the fp32 result, before the one rounding to D's type:
//   DEFAULT                  D = product
//   BIAS                     D = product + bias            (bias: floatX, one per row of D)
//   GELU_AUX, GELU_AUX_BIAS  aux = product (+ bias), D = GELU(aux)
//   DGELU                    D = product * GELU'(aux)      (aux read: what GELU_AUX wrote)
//   BGRADB                   D = product, bias = op(B)'s column sums (written, D's type)
// aux has D's shape and type, with leading dimension m (cuBLASLt: a multiple of 8).
typedef struct {
    cublasLtEpilogue_t kind;
    const void* bias;   // NULL where the epilogue takes none (BGRADB writes it)
    const void* aux;    // written by GELU_AUX*, read by DGELU; NULL where the epilogue takes none
} LtEpilogue;

// What a cached plan is for: everything cuBLASLt's heuristic sees. The alignments are part of
// it because the heuristic only offers algorithms that can take the pointers it was shown
// (the bias and aux pointers' too: it reads their alignment from the descriptor).
typedef struct {
    int transa, transb, m, n, k, lda, ldb, ldd, epilogue, d_type;
    uint32_t align_a, align_b, align_d, align_bias, align_aux;
} LtKey;

typedef struct {
    LtKey key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;   // the arrays as stored: type, rows, columns, ld
    cublasLtMatmulHeuristicResult_t heuristic;
    int found;                        // 0: cuBLASLt offered no algorithm (the caller takes cuBLAS)
} LtPlan;

// The plans made so far, looked up by key: a micro-batch makes about 50 cuBLASLt calls of a
// few dozen shapes (the alignments of each layer's tensors in the flat buffer may differ), so
// the table fills in the first micro-batch and a linear search finds each plan after that.
// Grown with realloc; freed by kernels_free.
static LtPlan* lt_plans;
static int lt_plan_count, lt_plan_capacity;
static long lt_heuristic_calls;   // plans made: tests check that a repeated call makes none

static LtPlan* lt_plan_create(const LtKey* key, const LtEpilogue* e) {
    if (lt_plan_count == lt_plan_capacity) {
        lt_plan_capacity = lt_plan_capacity ? 2 * lt_plan_capacity : 64;
        lt_plans = (LtPlan*)reallocCheck(lt_plans, lt_plan_capacity * sizeof(LtPlan));
    }
    LtPlan* p = &lt_plans[lt_plan_count++];
    memset(p, 0, sizeof(*p));
    p->key = *key;
    cublasOperation_t transa = (cublasOperation_t)key->transa, transb = (cublasOperation_t)key->transb;
    cublasLtEpilogue_t epilogue = e->kind;
    cublasCheck(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    if (e->bias != NULL) {   // D's type: a bias floatX as D, the BGRADB gradient fp32 as its D
        cudaDataType_t bias_type = (cudaDataType_t)key->d_type;
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e->bias, sizeof e->bias));
    }
    if (e->aux != NULL) {
        int64_t aux_ld = key->m;
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &e->aux, sizeof e->aux));
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
    }
    int a_rows = transa == CUBLAS_OP_N ? key->m : key->k, b_rows = transb == CUBLAS_OP_N ? key->k : key->n;
    cublasCheck(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_FLOATX, a_rows, key->m + key->k - a_rows, key->lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_FLOATX, b_rows, key->k + key->n - b_rows, key->ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->d, (cudaDataType_t)key->d_type, key->m, key->n, key->ldd));
    cublasLtMatmulPreference_t pref;
    uint64_t workspace = CUBLASLT_WORKSPACE_BYTES;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key->align_a, sizeof key->align_a));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key->align_b, sizeof key->align_b));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key->align_d, sizeof key->align_d));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key->align_d, sizeof key->align_d));
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(cublaslt_handle, p->desc, p->a, p->b, p->d, p->d, pref, 1,
                                                           &p->heuristic, &p->found);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED) p->found = 0;   // how cuBLASLt says it has no algorithm
    else cublasCheck(status);
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    lt_heuristic_calls++;
    return p;
}

static LtPlan* lt_plan(const LtKey* key, const LtEpilogue* e) {
    for (int i = 0; i < lt_plan_count; i++)
        if (memcmp(&lt_plans[i].key, key, sizeof *key) == 0) return &lt_plans[i];
    return lt_plan_create(key, e);
}

static void lt_plans_free(void) {
    for (int i = 0; i < lt_plan_count; i++) {
        cublasCheck(cublasLtMatrixLayoutDestroy(lt_plans[i].d));
        cublasCheck(cublasLtMatrixLayoutDestroy(lt_plans[i].b));
        cublasCheck(cublasLtMatrixLayoutDestroy(lt_plans[i].a));
        cublasCheck(cublasLtMatmulDescDestroy(lt_plans[i].desc));
    }
    free(lt_plans);
    lt_plans = NULL;
    lt_plan_count = lt_plan_capacity = 0;
}

// D = op(A) op(B) + beta D, then the epilogue, laid out as in gemm() (column-major, D [m, n]
// with ld ldd; A and B floatX, D floatX or fp32 (d_type), C the same array as D). False,
// having done nothing, when cuBLASLt has no algorithm for it (e.g. for matrices only 2-byte
// aligned): the caller then takes the cuBLAS path.
static bool gemm_lt(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k, const floatX* A,
                    int lda, const floatX* B, int ldb, float beta, void* D, cudaDataType_t d_type, int ldd,
                    LtEpilogue e) {
    LtKey key;
    memset(&key, 0, sizeof key);   // the padding too: keys are compared with memcmp
    key.transa = transa, key.transb = transb, key.m = m, key.n = n, key.k = k;
    key.lda = lda, key.ldb = ldb, key.ldd = ldd, key.epilogue = e.kind, key.d_type = d_type;
    key.align_a = alignment_of(A), key.align_b = alignment_of(B), key.align_d = alignment_of(D);
    key.align_bias = e.bias ? alignment_of(e.bias) : 0, key.align_aux = e.aux ? alignment_of(e.aux) : 0;
    LtPlan* p = lt_plan(&key, &e);
    if (!p->found) return false;
    // this call's pointers (the plan may have been made for others of the same alignment)
    if (e.bias != NULL)
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e.bias, sizeof e.bias));
    if (e.aux != NULL)
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &e.aux, sizeof e.aux));
    const float alpha = 1.0f;
    cublasCheck(cublasLtMatmul(cublaslt_handle, p->desc, &alpha, A, p->a, B, p->b, &beta, D, p->d, D, p->d,
                               &p->heuristic.algo, cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES, 0));
    return true;
}

// out = inp @ weight^T through cuBLASLt, the rest done by the GEMM's epilogue:
//   pre_gelu NULL:  out = x + bias                       (BIAS; DEFAULT without a bias)
//   pre_gelu given: pre_gelu = x + bias, out = GELU(x + bias)   (GELU_AUX_BIAS; GELU_AUX)
// cuBLASLt's GELU is the tanh approximation, as ours. The product is laid out as in gemm():
// out^T [OC, N] = W [OC, C] @ inp^T [C, N]; weight a [C, OC] array taken transposed, inp a
// [C, N] array, out (and pre_gelu) [OC, N] arrays. False when cuBLASLt has no algorithm.
static bool matmul_cublaslt(floatX* out, floatX* pre_gelu, const floatX* inp, const floatX* weight,
                            const floatX* bias, int N, int C, int OC) {
    cublasLtEpilogue_t kind = pre_gelu ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                                       : (bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
    LtEpilogue e = {kind, bias, pre_gelu};
    return gemm_lt(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, weight, C, inp, C, 0.0f, out, CUDA_R_FLOATX, OC, e);
}

// The bias goes in cuBLASLt's epilogue (no extra pass over out) when the epilogue can read it:
// 16-byte aligned (see tests/emu/cublasLt.h). Otherwise (an odd-sized tensor before it in the
// parameter buffer), or if cuBLASLt has no algorithm, cuBLAS: out starts as the bias rows and
// the GEMM adds its product (beta = 1).
static void matmul_forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                           int N, int C, int OC) {
    if ((bias == NULL || (uintptr_t)bias % 16 == 0) && matmul_cublaslt(out, NULL, inp, weight, bias, N, C, OC)) return;
    float beta = 0.0f;
    if (bias != NULL) {
        LAUNCH(fill_rows_kernel, CEIL_DIV(N, ROWS_PER_BLOCK), ROW_BLOCK, 0, out, bias, N, OC);
        beta = 1.0f;
    }
    // out^T [OC, N] = W [OC, C] @ inp^T [C, N]. Column-major, weight is a [C, OC] array
    // (lda = C), so op = T gives W; inp is a [C, N] array (ldb = C), op = N; out is [OC, N]
    // (ldc = OC).
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, weight, C, inp, C, beta, out, CUDA_R_FLOATX, OC);
}

// The backward's products take the forward's path, cuBLASLt with our workspace, falling back
// to cuBLAS as it does (issue 39's choice, to be measured on a GPU by tests/gpu_check.sh):
// - the weight gradients are short, wide products: C x OC outputs (768 x 768 to 768 x 3072 in
//   GPT-2 124M: 36 to 144 tiles of 128 x 128 for an H100's 132 SMs) summed over N, 16K-64K
//   tokens. They fill the GPU only when split along N, which needs workspace: cuBLASLt's
//   heuristic is told what we have (32 MiB, as llm.c gives it on an H100) and picks the split;
// - each plan is made once per shape and kept (lt_plan), the heuristic's first choice: never
//   timed and picked (autotuning), which could pick differently from run to run or rank to
//   rank and break the same bits each run;
// - dweight stays fp32 with beta = 1, the gradient summed over micro-batches in fp32 as
//   mixed precision keeps it (Micikevicius et al. 2018; Megatron-LM's gradient-accumulation
//   fusion writes its main_grad the same way). llm.c's bf16 dweight would round each
//   micro-batch's sum to 8 bits; fp32 reads and writes 8 bytes an element instead of 4:
//   0.68 GB a micro-batch at GPT-2 124M against 0.34, 0.24 ms against 0.12 on an H100.
static const LtEpilogue LT_PLAIN = {CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL};

// dinp = dout @ W:  dinp^T [C, N] = W^T [C, OC] @ dout^T [OC, N]. Column-major, weight is
// already W^T as a [C, OC] array (op = N, lda = C); dout is a [OC, N] array (op = N, ldb =
// OC); dinp is [C, N] (ldc = C).
static void matmul_backward_dinp(floatX* dinp, const floatX* dout, const floatX* weight, int N, int C, int OC) {
    if (gemm_lt(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, weight, C, dout, OC, 0.0f, dinp, CUDA_R_FLOATX, C, LT_PLAIN)) return;
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, weight, C, dout, OC, 0.0f, dinp, CUDA_R_FLOATX, C);
}

// dweight += dout^T @ inp:  dweight^T [C, OC] = inp^T [C, N] @ dout [N, OC]. inp is a [C, N]
// array (op = N, lda = C); dout is a [OC, N] array, op = T gives [N, OC] (ldb = OC); dweight
// is an fp32 [C, OC] array (ldc = C), beta = 1 accumulates. Then dbias += dout's column sums.
// With a bias, cuBLASLt's BGRADB epilogue sums dout's columns as the product reads them (fp32,
// the output's type), instead of column_sums_add reading dout again: 10.9 GB a step at GPT-2
// 124M's 64 x 1024, 3.9 ms on an H100 by the planner. The epilogue writes its sums, so they go
// to partials and are added to dbias there (it sums over micro-batches). Where cuBLASLt offers
// no algorithm for that, or partials is not 16-byte aligned as the epilogue's vectors need (see
// tests/emu/cublasLt.h), the product alone, then column_sums_add; then cuBLAS.
static void matmul_backward_params(float* dweight, float* dbias, float* partials, const floatX* dout,
                                   const floatX* inp, int N, int C, int OC) {
    if (dbias != NULL && N > 0 && (uintptr_t)partials % 16 == 0) {
        LtEpilogue bgrad = {CUBLASLT_EPILOGUE_BGRADB, partials, NULL};
        if (gemm_lt(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp, C, dout, OC, 1.0f, dweight, CUDA_R_32F, C, bgrad)) {
            column_partials_add(dbias, NULL, partials, 1, OC);
            return;
        }
    }
    if (!gemm_lt(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp, C, dout, OC, 1.0f, dweight, CUDA_R_32F, C, LT_PLAIN))
        gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp, C, dout, OC, 1.0f, dweight, CUDA_R_32F, C);
    if (dbias != NULL) column_sums_add(dbias, partials, dout, N, OC);
}

// partials: bias_grad_partials(N, OC) floats of workspace (none needed without dbias)
static void matmul_backward(floatX* dinp, float* dweight, float* dbias, float* partials, const floatX* dout,
                            const floatX* inp, const floatX* weight, int N, int C, int OC) {
    matmul_backward_dinp(dinp, dout, weight, N, C, OC);
    matmul_backward_params(dweight, dbias, partials, dout, inp, N, C, OC);
}

// kernels_init's counterpart, at exit: the cuBLASLt plans, the handles, the workspaces
static void kernels_free(void) {
    lt_plans_free();
    cublasCheck(cublasLtDestroy(cublaslt_handle));
    cublasCheck(cublasDestroy(cublas_handle));
    dev_free(cublaslt_workspace);
    dev_free(sum_squares_partials);
    dev_free(column_counters);
}
#else
#define matmul_forward matmul_forward_cpu
#define matmul_backward(dinp, dweight, dbias, partials, ...) matmul_backward_cpu(dinp, dweight, dbias, __VA_ARGS__)
#endif

// ----------------------------------------------------------------------------
// a table's rows added to a buffer's: out[n] += table[(first_row + n) % period], out [N, C]
// Sequence parallelism (gpt.h) leaves each tensor rank rows first_row .. first_row + N - 1 of a
// micro-batch's residual stream, and each rank adds to its rows what tensor parallelism alone
// adds before its all-reduce: a row-parallel linear's bias (a table of one row, period 1) and
// the position embedding (wpe's first T rows, period T: a row's position in its sequence).
// The backward adds each table row's share of dout: dtable[p] += the sum of dout[n] over the
// rows n with (first_row + n) % period == p, in the order of n.

static void rows_add_forward_cpu(float* out, const float* table, int N, int C, int first_row, int period) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* t = table + (size_t)((first_row + n) % period) * C;
        float* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] += t[c];
    }
}

static void rows_add_backward_cpu(float* dtable, const float* dout, int N, int C, int first_row, int period) {
    // as encoder_backward_cpu: each thread owns some columns of every row, adding in row order
    int chunks = CEIL_DIV(C, 64);
    #pragma omp parallel for
    for (int k = 0; k < chunks; k++) {
        int c0 = k * 64, c1 = c0 + 64 < C ? c0 + 64 : C;
        for (int n = 0; n < N; n++) {
            float* t = dtable + (size_t)((first_row + n) % period) * C;
            const float* d = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++) t[c] += d[c];
        }
    }
}

#ifdef __CUDACC__
// one warp per row, its lanes taking packs of the row (as encoder_forward_kernel)
__global__ void rows_add_forward_kernel(floatX* out, const floatX* table, int N, int C, int first_row, int period) {
    int lane = threadIdx.x % 32, n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    const floatX* t = table + (size_t)((first_row + n) % period) * C;
    floatX* o = out + (size_t)n * C;
    for (int c = lane * X128; c < C; c += 32 * X128) {
        int count = C - c < X128 ? C - c : X128;
        x128 po = load_pack(o + c, count), pt = load_pack(t + c, count);
        for (int k = 0; k < X128; k++) po.e[k] = to_floatX(floatX_to_float(po.e[k]) + floatX_to_float(pt.e[k]));
        store_pack(o + c, po, count);
    }
}

// one thread per element of dtable, adding its rows in order (as encoder_backward_wpe_kernel)
__global__ void rows_add_backward_kernel(float* dtable, const floatX* dout, int N, int C, int first_row, int period) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)period * C) return;
    int p = (int)(idx / C), c = (int)(idx % C);
    float sum = 0.0f;
    for (int n = ((p - first_row) % period + period) % period; n < N; n += period) sum += floatX_to_float(dout[(size_t)n * C + c]);
    dtable[idx] += sum;
}

static void rows_add_forward(floatX* out, const floatX* table, int N, int C, int first_row, int period) {
    LAUNCH(rows_add_forward_kernel, CEIL_DIV(N, ROWS_PER_BLOCK), ROW_BLOCK, 0, out, table, N, C, first_row, period);
}

// partials: bias_grad_partials(N, C) floats of workspace where period is 1 (a bias: its column
// sums, chunked as a linear layer's bias gradient is, column_sums_add); else none
static void rows_add_backward(float* dtable, float* partials, const floatX* dout, int N, int C, int first_row, int period) {
    if (period == 1) {
        column_sums_add(dtable, partials, dout, N, C);
        return;
    }
    LAUNCH(rows_add_backward_kernel, CEIL_DIV((size_t)period * C, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0,
           dtable, dout, N, C, first_row, period);
}
#else
#define rows_add_forward rows_add_forward_cpu
#define rows_add_backward(dtable, partials, ...) rows_add_backward_cpu(dtable, __VA_ARGS__)
#endif

// ----------------------------------------------------------------------------
// causal self-attention
// qkv[N, (NH + 2G) * HS] holds, for each token, G query groups one after another (G = NH
// without grouped-query attention), each [its NH/G query heads | its key head | its value head]
// (Megatron's layout: splitting the rows of the QKV weight into contiguous blocks gives each
// tensor-parallel rank whole groups; with G = NH, [q | k | v] per head). Query head h reads the
// key and value of its group h / (NH/G). out[N, NH*HS], heads side by side.
// The cuBLAS path (--attention-backend unfused) keeps the softmax probabilities att[B, NH, T, T]
// for the backward pass; the fused one (the next section) keeps their log-sum-exp [B, NH, T].

// qkv_group_index: the offset of slot `slot` (0 .. NH/G - 1: the group's queries, NH/G: its k,
// NH/G + 1: its v) of group g of token (b, t)
HOST_DEVICE static inline size_t qkv_group_index(int b, int t, int g, int slot, int T, int NH, int G, int HS) {
    return (size_t)(b * T + t) * (NH + 2 * G) * HS + ((size_t)g * (NH / G + 2) + slot) * HS;
}

// query head h's q (which 0), or the k (1) or v (2) of its group
HOST_DEVICE static inline size_t qkv_index(int b, int t, int h, int which, int T, int NH, int G, int HS) {
    int per_group = NH / G;
    return qkv_group_index(b, t, h / per_group, which == 0 ? h % per_group : per_group + which - 1, T, NH, G, HS);
}

// ALiBi (Press et al. 2022, "Train Short, Test Long"; BLOOM's position encoding): instead of a
// position table, head h of H adds slope(h) * (t2 - t) to the score of query t for key t2 <= t,
// a penalty growing with distance. (BLOOM adds slope * t2; the softmax ignores the shift by
// slope * t shared by a query's scores, and t2 - t keeps the bias small.) Under tensor
// parallelism this rank's local head i is global head first_head + i. heads == 0: no ALiBi.
typedef struct {
    int first_head, heads;
} Alibi;

// BLOOM's slopes: for H a power of two, 2^(-8 (h + 1) / H), a geometric sequence from 2^(-8/H);
// otherwise the P = 2^floor(log2 H) slopes of that rule, followed by the odd-numbered slopes
// of the rule for 2P, 2^(-4 (2k + 1) / P) for k = 0, 1, ..., up to H heads in all
HOST_DEVICE static inline float alibi_slope(int h, int H) {
    int P = 1;
    while (2 * P <= H) P *= 2;
    return h < P ? exp2f(-8.0f * (h + 1) / P) : exp2f(-4.0f * (2 * (h - P) + 1) / P);
}

// the bias of local head h for query t and key t2
HOST_DEVICE static inline float alibi_bias(Alibi alibi, int h, int t, int t2) {
    return alibi.heads ? alibi_slope(alibi.first_head + h, alibi.heads) * (float)(t2 - t) : 0.0f;
}

// Query t's row a[0..T) of head h of sequence b: the probabilities softmax(q k^T / sqrt(HS) +
// ALiBi's bias) over the keys at or before t, zeros after
static void attention_row_probabilities(float* a, const float* qkv, int b, int t, int h, int T, int NH, int G, int HS,
                                        Alibi alibi) {
    const float scale = 1.0f / sqrtf((float)HS);
    const size_t row = (size_t)(NH + 2 * G) * HS;   // one token's qkv: token t2's key is k + t2 * row
    const float* q = qkv + qkv_index(b, t, h, 0, T, NH, G, HS);
    const float* k = qkv + qkv_index(b, 0, h, 1, T, NH, G, HS);
    // scores of the keys at or before t, and their maximum for a stable softmax
    float maxval = -INFINITY;
    for (int t2 = 0; t2 <= t; t2++) {
        a[t2] = dot_lanes(q, k + t2 * row, HS) * scale + alibi_bias(alibi, h, t, t2);
        if (a[t2] > maxval) maxval = a[t2];
    }
    float sum = 0.0f;
    #pragma omp simd reduction(+ : sum)
    for (int t2 = 0; t2 <= t; t2++) {
        a[t2] = exp_poly(a[t2] - maxval);
        sum += a[t2];
    }
    for (int t2 = 0; t2 < T; t2++) a[t2] = t2 <= t ? a[t2] / sum : 0.0f;
}

static void attention_forward_cpu(float* out, float* att, const float* qkv, int B, int T, int NH, int G, int HS,
                                  Alibi alibi) {
    const size_t row = (size_t)(NH + 2 * G) * HS;   // one token's qkv: token t2's value is v + t2 * row
    // one (b, h) pair per iteration: every pair has the same triangle of work
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            float* p = att + ((size_t)b * NH + h) * T * T;   // the head's probabilities [T, T]
            for (int t = 0; t < T; t++) attention_row_probabilities(p + (size_t)t * T, qkv, b, t, h, T, NH, G, HS, alibi);
            // out_t = the sum over t2 <= t of p[t, t2] v_t2, added in t2 order; value by value
            // (t2 outer), so that consecutive adds go to different rows of out (query by query,
            // each add to a row waited for the one before it, through memory)
            const float* v = qkv + qkv_index(b, 0, h, 2, T, NH, G, HS);
            for (int t = 0; t < T; t++)
                for (int i = 0; i < HS; i++) out[((size_t)(b * T + t) * NH + h) * HS + i] = 0.0f;
            for (int t2 = 0; t2 < T; t2++)
                for (int t = t2; t < T; t++)
                    axpy_lanes(out + ((size_t)(b * T + t) * NH + h) * HS, p[(size_t)t * T + t2], v + t2 * row, HS);
        }
    }
}

// the forward's probabilities alone, the same bits (selective recomputation's pass: the
// backward needs them, not the output, which the forward kept)
static void attention_probabilities_cpu(float* att, const float* qkv, int B, int T, int NH, int G, int HS, Alibi alibi) {
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++)
                attention_row_probabilities(att + (((size_t)b * NH + h) * T + t) * T, qkv, b, t, h, T, NH, G, HS, alibi);
}

// Backward of out = softmax(q k^T * scale) v. For one query row with probabilities p and
// datt[t2] = dout . v[t2]:  dscore[t2] = p[t2] * (datt[t2] - sum_j p[j] datt[j]).
// scratch holds one row of datt, then dscore, per (b, h) pair: B * NH * T floats.
// Each product is a loop of its own over the head's HS elements (dot_lanes, axpy_lanes), so
// that it runs on vector lanes: one loop updating dq, dk and dv together went through more
// pointers than the compiler would check apart, ran one element at a time, and held the
// attention's backward to 1/8 of the matmuls' rate. dq, dk and dv get their adds in that
// loop's order.
static void attention_backward_cpu(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                   const float* att, int B, int T, int NH, int G, int HS) {
    const float scale = 1.0f / sqrtf((float)HS);
    const size_t row = (size_t)(NH + 2 * G) * HS;   // one token's qkv: token t2's key is k + t2 * row
    // one (b, group) pair per iteration: dk and dv of a key gather from every later query of
    // every head of the group, in head order
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int g = 0; g < G; g++) {
            for (int t = 0; t < T; t++)
                for (int slot = 0; slot < NH / G + 2; slot++) {
                    float* d = dqkv + qkv_group_index(b, t, g, slot, T, NH, G, HS);
                    for (int i = 0; i < HS; i++) d[i] = 0.0f;
                }
            for (int h = g * (NH / G); h < (g + 1) * (NH / G); h++) {
                float* dscore = scratch + ((size_t)b * NH + h) * T;
                const float* k = qkv + qkv_index(b, 0, h, 1, T, NH, G, HS);
                const float* v = qkv + qkv_index(b, 0, h, 2, T, NH, G, HS);
                float* dk = dqkv + qkv_index(b, 0, h, 1, T, NH, G, HS);
                float* dv = dqkv + qkv_index(b, 0, h, 2, T, NH, G, HS);
                for (int t = 0; t < T; t++) {
                    const float* a = att + (((size_t)b * NH + h) * T + t) * T;
                    const float* dout_row = dout + ((size_t)(b * T + t) * NH + h) * HS;
                    const float* q = qkv + qkv_index(b, t, h, 0, T, NH, G, HS);
                    float* dq = dqkv + qkv_index(b, t, h, 0, T, NH, G, HS);
                    float p_dot_datt = 0.0f;
                    for (int t2 = 0; t2 <= t; t2++) {
                        dscore[t2] = dot_lanes(dout_row, v + t2 * row, HS);   // datt
                        p_dot_datt += a[t2] * dscore[t2];
                    }
                    for (int t2 = 0; t2 <= t; t2++) dscore[t2] = a[t2] * (dscore[t2] - p_dot_datt) * scale;
                    for (int t2 = 0; t2 <= t; t2++) {
                        axpy_lanes(dq, dscore[t2], k + t2 * row, HS);
                        axpy_lanes(dk + t2 * row, dscore[t2], q, HS);
                        axpy_lanes(dv + t2 * row, a[t2], dout_row, HS);
                    }
                }
            }
        }
    }
}

// The fused attention's tiles (FlashAttention-2's, Dao 2023): a block of FLASH_ROWS / 16 warps
// takes FLASH_ROWS query rows (the forward) or keys (the backward), 16 to a warp; the forward
// walks key tiles of FLASH_KEYS(HS), the backward query steps of FLASH_STEP. The head
// size is a compile-time constant, 64 (every GPT-2) or 128 (BLOOM, GPT-3 175B). A tile row in
// shared memory is padded by FLASH_PAD elements (16 bytes) so that the 8 rows one ldmatrix
// phase reads begin in 8 different 4-bank groups: no bank conflicts. Known to both builds, for
// --attention-backend auto and the dry run's plans of the GPU build.
#define FLASH_ROWS 64
#define FLASH_STEP 32
#define FLASH_PAD 8
#define FLASH_DS_ROW (FLASH_STEP + FLASH_PAD)   // the backward's dS^T tile: a key's FLASH_STEP queries a row
static int flash_attention_supports(int HS) { return HS == 64 || HS == 128; }

// The forward's key tile: 64 keys at head size 64, 32 at 128, where the two buffers of k and v
// would otherwise take 70 KB and the block 87 KB of shared memory, one block per A100 SM
// (164 KB) instead of two (52 KB).
#define FLASH_KEYS(HS) ((HS) > 64 ? 32 : 64)

// a block's dynamic shared memory, in bytes (16-bit elements on the GPU build): the forward's
// q tile and two k and v tiles; the backward's k and v tiles (64 keys), two 32-row steps of q
// and of dout, the step's dS^T (64 keys by 32 queries), two steps' log-sum-exp and D, and the
// block's ticket (16 bytes)
static size_t flash_shared_bytes(int HS, int forward) {
    size_t row = (size_t)(HS + FLASH_PAD) * 2;
    if (forward) return (FLASH_ROWS + 4 * FLASH_KEYS(HS)) * row;
    return (2 * FLASH_ROWS + 4 * FLASH_STEP) * row + FLASH_ROWS * FLASH_DS_ROW * 2 + 4 * FLASH_STEP * sizeof(float) + 16;
}

// The fused backward's scratch, in floats: D [B, NH, T], then dQ's fp32 sums [B, NH, T, HS]
// (each query step's, between the key tiles that add to it in turn), then the counters: one
// turn counter per (b, h, query step of FLASH_STEP) and the blocks' ticket counter.
static size_t flash_backward_scratch_floats(int B, int T, int NH, int HS) {
    size_t rows = (size_t)B * NH * T;
    return rows + rows * HS + (size_t)B * NH * CEIL_DIV(T, FLASH_STEP) + 1;
}

// attention's scratch (gpt.h's att_scratch) in bytes on build b: both builds' formulas are
// here, for a dry run plans either. The GPU build's unfused path: 7 head-major [B, NH, T, HS]
// floatX arrays (k, v, dk and dv fill G of those NH heads: the room does not depend on G),
// [B, NH, T, T] fp32 scores and floatX dscores, each region starting on a
// SCRATCH_ALIGN boundary, whatever the scratch's alignment (attention_scratch); its fused path:
// the backward's D, dQ's fp32 sums and counters (flash_backward_scratch_floats); the CPU build's
// backward keeps one row of datt per (b, h) pair.
#define SCRATCH_ALIGN 256
#define ATTENTION_SCRATCH_REGIONS 9
static size_t attention_scratch_bytes(BuildTarget b, int B, int T, int NH, int HS) {
    size_t S = (size_t)B * NH * T * HS, P = (size_t)B * NH * T * T, x = b.floatx_bytes;
    if (!b.gpu) return (size_t)B * NH * T * x;
    if (b.flash_attention) return CEIL_DIV(flash_backward_scratch_floats(B, T, NH, HS) * sizeof(float), x) * x;
    size_t bytes = 7 * S * x + P * sizeof(float) + P * x;
    return CEIL_DIV(bytes + ATTENTION_SCRATCH_REGIONS * SCRATCH_ALIGN, x) * x;
}

// the same in floatX elements, on this build
static size_t attention_scratch_elements(int B, int T, int NH, int HS) {
    return attention_scratch_bytes(this_build(), B, T, NH, HS) / sizeof(floatX);
}

#ifdef __CUDACC__
// qkv is staged into head-major arrays, q [B, NH, T, HS] and k, v [B, G, T, HS], so that one
// head of one sequence is a contiguous [T, HS] matrix and cuBLAS runs the products as one
// strided batch, a product per (b, group): a group's NH/G query heads are adjacent in q (and
// their scores in [B, NH, T, T]), one [NH/G * T, HS] matrix against the group's one k and v.
// So no head's k or v is copied NH/G times, and in the backward a group's dK and dV sum over
// its heads inside the product (over NH/G * T rows, in cuBLAS's fixed order, rounded once).
// With G = NH: B * NH products of [T, HS] matrices.
// The scores q k^T are kept in fp32 for the softmax; the probabilities go to att in floatX.
// The full T x T products are computed; the softmax zeroes what the causal mask hides.

typedef struct {
    floatX *q, *k, *v;     // q [B, NH, T, HS]; k, v [B, G, T, HS] (the first B * G * T * HS of their regions)
    floatX* y;             // forward: att @ v; backward: dout; [B, NH, T, HS]
    floatX *dq, *dk, *dv;  // backward only, as q, k, v
    float* scores;         // forward: q k^T; backward: datt; [B, NH, T, T]
    floatX* dscores;       // backward only, [B, NH, T, T]
} AttentionScratch;

// the next region of `bytes` after *cursor, rounded up to SCRATCH_ALIGN
static void* scratch_take(char** cursor, size_t bytes) {
    uintptr_t p = ((uintptr_t)*cursor + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN;
    *cursor = (char*)p + bytes;
    return (void*)p;
}

// the regions as attention_scratch_bytes counts them: seven of [B, NH, T, HS] (those of k, v,
// dk and dv hold G <= NH heads), the scores and the dscores
static AttentionScratch attention_scratch(floatX* scratch, int B, int T, int NH, int HS) {
    size_t S = (size_t)B * NH * T * HS, P = (size_t)B * NH * T * T;
    char* cursor = (char*)scratch;
    AttentionScratch s;
    floatX** heads[7] = {&s.q, &s.k, &s.v, &s.y, &s.dq, &s.dk, &s.dv};  // the [B, NH, T, HS] regions, in order
    for (int i = 0; i < 7; i++) *heads[i] = (floatX*)scratch_take(&cursor, S * sizeof(floatX));
    s.scores = (float*)scratch_take(&cursor, P * sizeof(float));
    s.dscores = (floatX*)scratch_take(&cursor, P * sizeof(floatX));
    return s;
}

// For element idx of qkv [B * T, (NH + 2G) * HS]: the head-major array that holds it (*which:
// 0 q [B, NH, T, HS], 1 k or 2 v [B, G, T, HS]) and its index there
__device__ size_t qkv_head_major(size_t idx, int T, int NH, int G, int HS, int* which) {
    int per = NH / G, width = NH + 2 * G;   // a group's slots: per queries, k, v
    size_t r = idx / HS, token = r / width, b = token / T, t = token % T;
    int g = (int)(r % width) / (per + 2), slot = (int)(r % width) % (per + 2);
    *which = slot < per ? 0 : slot - per + 1;
    size_t head = slot < per ? b * NH + g * per + slot : b * G + g;
    return (head * T + t) * HS + idx % HS;
}

// qkv -> q, k, v (head-major), one thread per element of qkv
__global__ void permute_qkv_kernel(floatX* q, floatX* k, floatX* v, const floatX* qkv, int B, int T, int NH, int G, int HS) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * (NH + 2 * G) * HS) return;
    int which;
    size_t at = qkv_head_major(idx, T, NH, G, HS, &which);
    (which == 0 ? q : which == 1 ? k : v)[at] = qkv[idx];
}

// dq, dk, dv (head-major) -> dqkv; writes every element of dqkv
__global__ void unpermute_qkv_kernel(floatX* dqkv, const floatX* dq, const floatX* dk, const floatX* dv,
                                     int B, int T, int NH, int G, int HS) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * (NH + 2 * G) * HS) return;
    int which;
    size_t at = qkv_head_major(idx, T, NH, G, HS, &which);
    dqkv[idx] = (which == 0 ? dq : which == 1 ? dk : dv)[at];
}

// For element idx of a head-major [B, NH, T, HS] array: its row (b * T + t) * NH + h of the
// token-major out[N, NH * HS], which holds it at row * HS + i, with i = idx % HS.
__device__ size_t token_major_row(size_t idx, int T, int NH, int HS) {
    size_t r = idx / HS, bh = r / T;  // r = (b * NH + h) * T + t, bh = b * NH + h
    size_t b = bh / NH, h = bh % NH, t = r % T;
    return (b * T + t) * NH + h;
}

// [N, NH * HS] (token-major) -> [B, NH, T, HS] (head-major)
__global__ void permute_heads_kernel(floatX* heads, const floatX* tokens, int B, int T, int NH, int HS) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * NH * T * HS) return;
    heads[idx] = tokens[token_major_row(idx, T, NH, HS) * HS + idx % HS];
}

// [B, NH, T, HS] (head-major) -> [N, NH * HS] (token-major)
__global__ void unpermute_heads_kernel(floatX* tokens, const floatX* heads, int B, int T, int NH, int HS) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * NH * T * HS) return;
    tokens[token_major_row(idx, T, NH, HS) * HS + idx % HS] = heads[idx];
}

// One warp per row (b, h, t) of the scores: att = softmax(scale * scores + ALiBi bias) over
// t2 <= t, exactly 0 for t2 > t. rows = B * NH * T.
__global__ void attention_softmax_kernel(floatX* att, const float* scores, float scale, int rows, int T, int NH,
                                         Alibi alibi) {
    int lane = threadIdx.x % 32, row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (row >= rows) return;
    int t = row % T, h = (row / T) % NH;
    const float* s = scores + (size_t)row * T;
    floatX* a = att + (size_t)row * T;
    float maxval = -INFINITY;
    for (int t2 = lane; t2 <= t; t2 += 32) maxval = fmaxf(maxval, s[t2] * scale + alibi_bias(alibi, h, t, t2));
    maxval = warp_reduce_max(maxval);  // finite: t2 = 0 is always visible
    float sum = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += 32) sum += expf(s[t2] * scale + alibi_bias(alibi, h, t, t2) - maxval);
    float inv_sum = 1.0f / warp_reduce_sum(sum);
    for (int t2 = lane; t2 < T; t2 += 32) {
        float p = t2 <= t ? expf(s[t2] * scale + alibi_bias(alibi, h, t, t2) - maxval) * inv_sum : 0.0f;
        a[t2] = to_floatX(p);
    }
}

// One warp per row: dscores = scale * p * (datt - sum_j p_j datt_j) over t2 <= t, 0 above.
__global__ void attention_softmax_backward_kernel(floatX* dscores, const floatX* att, const float* datt,
                                                  float scale, int rows, int T) {
    int lane = threadIdx.x % 32, row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (row >= rows) return;
    int t = row % T;
    const floatX* a = att + (size_t)row * T;
    const float* da = datt + (size_t)row * T;
    floatX* ds = dscores + (size_t)row * T;
    float dot = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += 32) dot += floatX_to_float(a[t2]) * da[t2];
    dot = warp_reduce_sum(dot);
    for (int t2 = lane; t2 < T; t2 += 32) {
        ds[t2] = to_floatX(t2 <= t ? scale * floatX_to_float(a[t2]) * (da[t2] - dot) : 0.0f);
    }
}

// The batched form of gemm(): `batch` independent products, matrix i of A, B and C at
// A + i * strideA and so on (strides in elements). C is fp32 or floatX (Ctype), beta = 0.
static void gemm_batched(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                         const floatX* A, int lda, long long strideA, const floatX* B, int ldb,
                         long long strideB, void* C, cudaDataType_t Ctype, int ldc, long long strideC,
                         int batch) {
    const float alpha = 1.0f, beta = 0.0f;
    cublasCheck(cublasGemmStridedBatchedEx(cublas_handle, transa, transb, m, n, k, &alpha,
                                           A, CUDA_R_FLOATX, lda, strideA, B, CUDA_R_FLOATX, ldb, strideB,
                                           &beta, C, Ctype, ldc, strideC, batch,
                                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// One product per (b, group), B * G of them; row-major, with R = NH/G * T rows for the group's
// heads one after another: q, y, dy, dq are [R, HS], k, v, dk, dv [T, HS] (column-major: their
// transposes, ld HS); scores, att, datt, dscores are [R, T] (column-major: [T, R], ld T).
// Each product is written for the transposes, as in the linear layer above.
typedef struct {
    int R, batch;                      // a group's query rows, NH/G * T; the products, B * G
    long long q_stride, kv_stride, score_stride;   // from one group's matrix to the next
} AttentionGroups;

static AttentionGroups attention_groups(int B, int T, int NH, int G, int HS) {
    AttentionGroups a;
    a.R = NH / G * T, a.batch = B * G;
    a.q_stride = (long long)a.R * HS, a.kv_stride = (long long)T * HS, a.score_stride = (long long)a.R * T;
    return a;
}

// att = softmax(q k^T / sqrt(HS) + ALiBi's bias), causal; q, k and v left permuted in the scratch
static void attention_probabilities_unfused(floatX* att, floatX* scratch, const floatX* qkv, int B, int T, int NH, int G,
                                            int HS, Alibi alibi) {
    AttentionScratch s = attention_scratch(scratch, B, T, NH, HS);
    AttentionGroups a = attention_groups(B, T, NH, G, HS);
    size_t n_qkv = (size_t)B * T * (NH + 2 * G) * HS;
    LAUNCH(permute_qkv_kernel, CEIL_DIV(n_qkv, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0, s.q, s.k, s.v, qkv, B, T, NH, G, HS);
    // scores = q k^T:  scores^T [T, R] = k [T, HS] @ q^T [HS, R]; k is an [HS, T] array,
    // op = T gives k; q is an [HS, R] array = q^T, op = N
    gemm_batched(CUBLAS_OP_T, CUBLAS_OP_N, T, a.R, HS, s.k, HS, a.kv_stride, s.q, HS, a.q_stride,
                 s.scores, CUDA_R_32F, T, a.score_stride, a.batch);
    LAUNCH(attention_softmax_kernel, CEIL_DIV(B * NH * T, ROWS_PER_BLOCK), ROW_BLOCK, 0,
           att, s.scores, 1.0f / sqrtf((float)HS), B * NH * T, T, NH, alibi);
}

static void attention_forward_unfused(floatX* out, floatX* att, floatX* scratch, const floatX* qkv,
                                      int B, int T, int NH, int G, int HS, Alibi alibi) {
    AttentionScratch s = attention_scratch(scratch, B, T, NH, HS);
    AttentionGroups a = attention_groups(B, T, NH, G, HS);
    size_t n = (size_t)B * NH * T * HS;
    attention_probabilities_unfused(att, scratch, qkv, B, T, NH, G, HS, alibi);
    // y = att v:  y^T [HS, R] = v^T [HS, T] @ att^T [T, R]; both arrays are already these
    // transposes, op = N, N
    gemm_batched(CUBLAS_OP_N, CUBLAS_OP_N, HS, a.R, T, s.v, HS, a.kv_stride, att, T, a.score_stride,
                 s.y, CUDA_R_FLOATX, HS, a.q_stride, a.batch);
    LAUNCH(unpermute_heads_kernel, CEIL_DIV(n, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0, out, s.y, B, T, NH, HS);
}

static void attention_backward_unfused(floatX* dqkv, floatX* scratch, const floatX* dout, const floatX* qkv,
                                       const floatX* att, int B, int T, int NH, int G, int HS) {
    AttentionScratch s = attention_scratch(scratch, B, T, NH, HS);
    AttentionGroups a = attention_groups(B, T, NH, G, HS);
    size_t n = (size_t)B * NH * T * HS, n_qkv = (size_t)B * T * (NH + 2 * G) * HS;
    floatX* dy = s.y;
    float* datt = s.scores;
    // scratch is shared by all layers: stage this layer's q, k, v again
    LAUNCH(permute_qkv_kernel, CEIL_DIV(n_qkv, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0, s.q, s.k, s.v, qkv, B, T, NH, G, HS);
    LAUNCH(permute_heads_kernel, CEIL_DIV(n, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0, dy, dout, B, T, NH, HS);
    // datt = dy v^T:  datt^T [T, R] = v [T, HS] @ dy^T [HS, R] (as the scores)
    gemm_batched(CUBLAS_OP_T, CUBLAS_OP_N, T, a.R, HS, s.v, HS, a.kv_stride, dy, HS, a.q_stride,
                 datt, CUDA_R_32F, T, a.score_stride, a.batch);
    // dv = att^T dy, summed over the group's heads:  dv^T [HS, T] = dy^T [HS, R] @ att [R, T];
    // the att array is att^T, op = T gives att
    gemm_batched(CUBLAS_OP_N, CUBLAS_OP_T, HS, T, a.R, dy, HS, a.q_stride, att, T, a.score_stride,
                 s.dv, CUDA_R_FLOATX, HS, a.kv_stride, a.batch);
    LAUNCH(attention_softmax_backward_kernel, CEIL_DIV(B * NH * T, ROWS_PER_BLOCK), ROW_BLOCK, 0,
           s.dscores, att, datt, 1.0f / sqrtf((float)HS), B * NH * T, T);
    // dq = dscores k (the scale is in dscores):  dq^T [HS, R] = k^T [HS, T] @ dscores^T [T, R]
    gemm_batched(CUBLAS_OP_N, CUBLAS_OP_N, HS, a.R, T, s.k, HS, a.kv_stride, s.dscores, T, a.score_stride,
                 s.dq, CUDA_R_FLOATX, HS, a.q_stride, a.batch);
    // dk = dscores^T q, summed over the group's heads:  dk^T [HS, T] = q^T [HS, R] @ dscores [R, T];
    // op = T on dscores^T
    gemm_batched(CUBLAS_OP_N, CUBLAS_OP_T, HS, T, a.R, s.q, HS, a.q_stride, s.dscores, T, a.score_stride,
                 s.dk, CUDA_R_FLOATX, HS, a.kv_stride, a.batch);
    LAUNCH(unpermute_qkv_kernel, CEIL_DIV(n_qkv, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0, dqkv, s.dq, s.dk, s.dv,
           B, T, NH, G, HS);
}
#endif

// ----------------------------------------------------------------------------
// causal self-attention, fused, at FlashAttention-2's design (Dao 2023) on tensor cores
//
// The forward: one block of 4 warps per (b, h, 64-row query tile), each warp owning 16 rows.
// The block copies its queries and the first key tile into shared memory with cp.async, then
// walks the key tiles at and left of the diagonal (those right of it are never touched); the
// copy of tile k + 1 is in flight while tile k is multiplied (two buffers). Each warp keeps
// its rows' scores S = Q K^T, probabilities P and output O in registers, as the fragments of
// mma.sync.m16n8k16 (16-bit inputs, fp32 sums): S's accumulators are exactly the A operand of
// P V once rounded to 16 bits, so nothing goes back through shared memory. Per row it keeps
// the running maximum m and sum l of the online softmax (each key tile rescales O and l by
// 2^(m_old - m_new)); a row's values are spread over the 4 lanes of a quad, so a maximum or a
// sum takes two shuffles. Q, K and V fragments come from shared memory through ldmatrix (.trans
// for V: the B operand of P V is V's columns); the queries' once, before the loop, kept in
// registers. Only the diagonal tile is masked. The block writes out and each row's log-sum-exp
// m + log l, all the backward needs to recompute P.
//
// The backward: D = rowsum(dout * out) first; then one kernel at FlashAttention-2's cost, five
// products a (64-key tile, 32-row query step): one block per key tile (a warp per 16 keys)
// steps over the query steps at and below the diagonal, recomputing S^T = K Q^T and dP^T = V
// dO^T, summing dV += P^T dO and dK += dS^T Q in registers, and computing the step's dQ = dS K
// through a dS^T tile in shared memory. A step's dQ gets a part from each key tile at or left of
// it, in different blocks: FlashAttention-2 adds them with atomics (an order that changes from run
// to run); here the blocks add them in a fixed order, taking turns on a counter per step
// (FlashAttention-3's deterministic backward does the same), so two runs give the same bits.
// Before issue 39 a second kernel, one block per query tile, recomputed S and dP for dQ: 7
// products. Scores are kept in log2 units (scaled by log2 e), for exp2, the GPU's native
// exponential. Each kernel is built with and without ALiBi (a template argument): the instance
// without has no bias arithmetic at all.
//
// Grouped-query attention (G < NH key/value heads, each shared by the NH/G query heads of its
// group): the forward keeps a block per query head, reading the group's K and V, and numbers
// its blocks so that a group's heads are neighbours (flash_query_block): they run together and
// read each K and V tile once from memory, the others from L2. The backward takes a key tile of
// one (b, group) and walks the query steps of each of the group's heads in turn: K and V are
// read once per group, dK and dV add up over the heads in registers, in head order, as a
// group's gradient must (no atomics, no second pass), and each head's dQ takes its turns.

#ifdef __CUDACC__
#define FLASH_WARPS (FLASH_ROWS / 16)
#define FLASH_THREADS (32 * FLASH_WARPS)
#define FLASH_ROW(HS) ((HS) + FLASH_PAD)   // elements from one tile row to the next
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

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

// Turns between blocks (the backward's dQ, added in a fixed order; FlashAttention-3's
// deterministic backward does the same): a block waits until `counter` (in global memory) reaches
// `turn`, does its part, then passes the turn on (counter + 1). All threads call both. Thread 0
// spins; its fence after the spin orders the turns' writes before what the block reads next, and
// each thread's fence before the pass orders its own writes before the counter moves (CUDA's
// threadFenceReduction sample's pairing). A block may wait only for blocks that started before
// it (see attention_backward_flash_kernel's tickets): the emulation (tests/emu/ptx.h) checks that.
__device__ inline void flash_wait_turn(const unsigned* counter, unsigned turn) {
#ifdef __NVCC__
    if (threadIdx.x == 0) {
        while (*(const volatile unsigned*)counter != turn) {
        }
        __threadfence();
    }
#else
    emu_wait_turn(counter, turn);
#endif
    __syncthreads();
}

__device__ inline void flash_pass_turn(unsigned* counter) {
    __threadfence();
#ifndef __NVCC__
    emu_turn_done(counter);
#endif
    __syncthreads();
#ifdef __NVCC__
    if (threadIdx.x == 0) atomicAdd(counter, 1u);
#else
    emu_pass_turn(counter);
#endif
}

__device__ inline uint32_t pack_floatX2(float low, float high) {
    floatX pair[2] = {to_floatX(low), to_floatX(high)};
    uint32_t r;
    memcpy(&r, pair, 4);
    return r;
}

// the sum and the maximum over the 4 lanes of a quad (one row of a fragment)
__device__ inline float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ inline float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// ---- tiles and fragments

// ROWS rows from t0 of one head's q, k, v or dout (row t at src + t * stride) into a tile of
// padded rows, with cp.async (not waited for); rows at or past T become zeros
template <int HS, int ROWS>
__device__ void flash_copy_rows(floatX* tile, const floatX* src, size_t stride, int t0, int T) {
    constexpr int pieces = HS / 8;   // 16 bytes each
    static_assert(ROWS * pieces % FLASH_THREADS == 0, "every thread copies as many pieces");
    UNROLL
    for (int k = 0; k < ROWS * pieces / FLASH_THREADS; k++) {
        int i = threadIdx.x + k * FLASH_THREADS, r = i / pieces, c = i % pieces, t = t0 + r;
        bool inside = t < T;
        cp_async_16(tile + r * FLASH_ROW(HS) + 8 * c, src + (size_t)(inside ? t : 0) * stride + 8 * c, inside);
    }
}

// the A fragment (16 x 16) at rows row0 .., columns 16 kk .. of a tile
template <int HS>
__device__ void load_a(uint32_t a[4], const floatX* tile, int row0, int kk) {
    int lane = threadIdx.x % 32;
    ldmatrix_x4(a, tile + (row0 + lane % 16) * FLASH_ROW(HS) + 16 * kk + lane / 16 * 8, false);
}

// acc (16 x N) += A_kk B_kk^T for one 16-column slice kk of the head: B^T = the N tile rows
// from row 0, B[k][n] = tile[n][16 kk + k], which is what ldmatrix gives without .trans
template <int HS, int N>
__device__ void warp_product_abt_slice(float acc[][4], const uint32_t a[4], const floatX* tile, int kk) {
    int lane = threadIdx.x % 32;
    UNROLL
    for (int j = 0; j < N / 16; j++) {   // two 8-column blocks of acc per ldmatrix
        uint32_t b[4];
        ldmatrix_x4(b, tile + (16 * j + lane / 16 * 8 + lane % 8) * FLASH_ROW(HS) + 16 * kk + (lane / 8) % 2 * 8, false);
        mma_16816(acc[2 * j], a, b[0], b[1]);
        mma_16816(acc[2 * j + 1], a, b[2], b[3]);
    }
}

// acc (16 x N) += A B^T, A's HS / 16 fragments in registers (the forward's queries)
template <int HS, int N>
__device__ void warp_product_abt(float acc[][4], const uint32_t a[][4], const floatX* tile) {
    UNROLL
    for (int kk = 0; kk < HS / 16; kk++) warp_product_abt_slice<HS, N>(acc, a[kk], tile, kk);
}

// the same with A = rows row0 .. row0 + 15 of a shared tile, one slice at a time (fewer registers)
template <int HS, int N>
__device__ void warp_product_abt(float acc[][4], const floatX* a_tile, int row0, const floatX* tile) {
    UNROLL
    for (int kk = 0; kk < HS / 16; kk++) {
        uint32_t a[4];
        load_a<HS>(a, a_tile, row0, kk);
        warp_product_abt_slice<HS, N>(acc, a, tile, kk);
    }
}

// acc (16 x HS) += P B: P (16 x K) in accumulators, rounded to floatX, B = K tile rows (K x HS);
// B[k][n] = tile[k][n] is what ldmatrix gives with .trans
template <int HS, int K>
__device__ void warp_product_pb(float acc[][4], const float p[][4], const floatX* tile) {
    int lane = threadIdx.x % 32;
    UNROLL
    for (int j = 0; j < K / 16; j++) {
        // accumulator blocks 2j and 2j + 1 (columns 16j ..) are the A fragment of those columns
        uint32_t a[4] = {pack_floatX2(p[2 * j][0], p[2 * j][1]), pack_floatX2(p[2 * j][2], p[2 * j][3]),
                         pack_floatX2(p[2 * j + 1][0], p[2 * j + 1][1]), pack_floatX2(p[2 * j + 1][2], p[2 * j + 1][3])};
        UNROLL
        for (int nb = 0; nb < HS / 16; nb++) {
            uint32_t b[4];
            ldmatrix_x4(b, tile + (16 * j + (lane / 8) % 2 * 8 + lane % 8) * FLASH_ROW(HS) + 16 * nb + lane / 16 * 8, true);
            mma_16816(acc[2 * nb], a, b[0], b[1]);
            mma_16816(acc[2 * nb + 1], a, b[2], b[3]);
        }
    }
}

// acc (16 rows from row0, HS columns) to global memory, row t at dst + t * stride; rows past T
// are not written. Lane (g, t) holds columns 2t and 2t + 1 of rows g and g + 8 in each block.
template <int HS>
__device__ void flash_store_rows(floatX* dst, size_t stride, const float acc[][4], int row0, int T) {
    int lane = threadIdx.x % 32;
    UNROLL
    for (int half = 0; half < 2; half++) {
        int t = row0 + lane / 4 + 8 * half;
        if (t >= T) continue;
        UNROLL
        for (int nb = 0; nb < HS / 8; nb++) {
            // one 4-byte store: the pair's offset is even and every row starts 4-byte aligned
            *(uint32_t*)(dst + (size_t)t * stride + 8 * nb + 2 * (lane % 4)) =
                pack_floatX2(acc[nb][2 * half], acc[nb][2 * half + 1]);
        }
    }
}

// A head's constants for its scores in log2 units (the kernels use exp2): the score of query
// `row` and key `key` is x = s / sqrt(HS) + slope (key - row) (ALiBi's bias; 0 without), and
// x log2(e) = s scale_log2 + slope_log2 (key - row). The forward and both backward kernels take
// them from here, so P recomputed in the backward is the forward's to the bit.
struct FlashHead {
    float scale, scale_log2, slope_log2;   // 1 / sqrt(HS), and the two in log2 units
};

__device__ FlashHead flash_head(int HS, Alibi alibi, int h) {
    FlashHead f;
    f.scale = 1.0f / sqrtf((float)HS);
    f.scale_log2 = LOG2E * f.scale;
    f.slope_log2 = alibi.heads ? LOG2E * alibi_slope(alibi.first_head + h, alibi.heads) : 0.0f;
    return f;
}

// ALIBI is a compile-time choice: each kernel is built twice, and the instance without ALiBi
// has no bias arithmetic at all (about a sixth of the forward's instructions a tile: an int to
// float conversion and a multiply-add per score), where a run-time slope of 0 would still pay it.
template <bool ALIBI>
__device__ float flash_score_log2(const FlashHead& f, float s, int key, int row) {
    return ALIBI ? s * f.scale_log2 + f.slope_log2 * (float)(key - row) : s * f.scale_log2;
}

// ---- the forward

// One key tile's step of the online softmax for this lane's rows (row0 + g and row0 + g + 8):
// s (scores) becomes p = 2^(x - m_new), x the score in log2 units with ALiBi's bias; keys
// right of a row (on tiles that reach the diagonal only) get p = 0; m, l and o move to the new
// maximum. A row whose keys in this tile are all masked keeps m: it saw key 0 in tile 0.
template <int HS, bool ALIBI>
__device__ void flash_online_softmax(float s[][4], float o[][4], float m[2], float l[2], int k0, int row0,
                                     bool diagonal, const FlashHead& head) {
    int lane = threadIdx.x % 32;
    float tile_max[2] = {-INFINITY, -INFINITY};
    UNROLL
    for (int n = 0; n < FLASH_KEYS(HS) / 8; n++) {
        UNROLL
        for (int e = 0; e < 4; e++) {
            int row = row0 + lane / 4 + 8 * (e / 2), key = k0 + 8 * n + 2 * (lane % 4) + e % 2;
            float x = flash_score_log2<ALIBI>(head, s[n][e], key, row);
            s[n][e] = diagonal && key > row ? -INFINITY : x;
            tile_max[e / 2] = fmaxf(tile_max[e / 2], s[n][e]);
        }
    }
    float rescale[2];
    UNROLL
    for (int half = 0; half < 2; half++) {
        float new_max = fmaxf(m[half], quad_max(tile_max[half]));   // finite: every row sees key 0 first
        rescale[half] = exp2f(m[half] - new_max);                   // 0 at the first tile (m = -inf)
        m[half] = new_max;
        l[half] *= rescale[half];
    }
    UNROLL
    for (int n = 0; n < FLASH_KEYS(HS) / 8; n++) {
        UNROLL
        for (int e = 0; e < 4; e++) {
            s[n][e] = exp2f(s[n][e] - m[e / 2]);
            l[e / 2] += s[n][e];   // this lane's part of the row's sum: the quad adds at the end
        }
    }
    UNROLL
    for (int nb = 0; nb < HS / 8; nb++)
        UNROLL
        for (int e = 0; e < 4; e++) o[nb][e] *= rescale[e / 2];
}

// The forward's block: head h of sequence b, the query tile from row t0.
// Blocks are numbered (b, group, tile, head of the group): the NH/G heads of a group, which
// read the same keys and values, are adjacent blocks, so they run at about the same time and
// read each K and V tile through L2 (the first block to ask brings it there). The longest
// rows first. With G = NH: (b, h, tile).
struct FlashQueryBlock {
    int b, h, t0;
};

__device__ FlashQueryBlock flash_query_block(int T, int NH, int G) {
    int per = NH / G, tiles = CEIL_DIV(T, FLASH_ROWS), i = blockIdx.x / per;   // i = (b G + g) tiles + tile
    FlashQueryBlock f;
    f.b = i / tiles / G;
    f.h = i / tiles % G * per + blockIdx.x % per;
    f.t0 = (tiles - 1 - i % tiles) * FLASH_ROWS;
    return f;
}

// grid: B * NH * tiles blocks of FLASH_THREADS (flash_query_block), flash_shared_bytes(HS, 1) of
// dynamic shared memory; out [N, NH * HS], lse [B, NH, T]. ALIBI: alibi.heads != 0.
template <int HS, bool ALIBI>
__global__ void __launch_bounds__(FLASH_THREADS, 3) attention_forward_flash_kernel(floatX* out, float* lse, const floatX* qkv,
                                                                                int T, int NH, int G, Alibi alibi) {
    constexpr int KEYS = FLASH_KEYS(HS), tile = KEYS * FLASH_ROW(HS);
    floatX* q = flash_shared();
    floatX* k = q + FLASH_ROWS * FLASH_ROW(HS);   // two buffers, then v's two
    floatX* v = k + 2 * tile;
    const FlashQueryBlock block = flash_query_block(T, NH, G);
    int b = block.b, h = block.h, t0 = block.t0, bh = b * NH + h;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, row0 = t0 + 16 * warp;
    // causal: the key tiles up to the tile's last row; those right of it are never touched
    int last_row = t0 + FLASH_ROWS < T ? t0 + FLASH_ROWS - 1 : T - 1, key_tiles = last_row / KEYS + 1;
    int stride = (NH + 2 * G) * HS;   // (int: a register fewer through the loop)
    const floatX* q_rows = qkv + qkv_index(b, 0, h, 0, T, NH, G, HS);
    const floatX* k_rows = qkv + qkv_index(b, 0, h, 1, T, NH, G, HS);   // the group's
    // (the group's v, qkv_index(b, 0, h, 2, ...), is k_rows + HS; at head size 128 the loop
    // computes k_rows again from bh rather than keep the pointer: that keeps the block at 168
    // registers, three blocks an SM, without a spill)
    const FlashHead head = flash_head(HS, alibi, h);

    flash_copy_rows<HS, FLASH_ROWS>(q, q_rows, stride, t0, T);
    cp_async_commit();   // a group of its own: the queries are waited for before the first key tile
    flash_copy_rows<HS, KEYS>(k, k_rows, stride, 0, T);
    flash_copy_rows<HS, KEYS>(v, k_rows + HS, stride, 0, T);
    cp_async_commit();
    cp_async_wait<1>();   // the queries are here
    __syncthreads();      // ... every thread's part of them
    uint32_t qa[HS / 16][4];   // this warp's queries, in registers through the loop (loop-invariant)
    UNROLL
    for (int kk = 0; kk < HS / 16; kk++) load_a<HS>(qa[kk], q, 16 * warp, kk);
    float o[HS / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    for (int kt = 0; kt < key_tiles; kt++) {
        int buffer = kt % 2, k0 = kt * KEYS;
        if (kt + 1 < key_tiles) {   // the next tile, into the buffer the previous one used
            const floatX* rows = HS > 64 ? qkv + qkv_index(bh / NH, 0, bh % NH, 1, T, NH, G, HS) : k_rows;
            flash_copy_rows<HS, KEYS>(k + (1 - buffer) * tile, rows, stride, k0 + KEYS, T);
            flash_copy_rows<HS, KEYS>(v + (1 - buffer) * tile, rows + HS, stride, k0 + KEYS, T);
        }
        cp_async_commit();
        cp_async_wait<1>();   // all but the newest group: this tile is here
        __syncthreads();      // ... and every thread's part of them
        float s[KEYS / 8][4] = {};
        warp_product_abt<HS, KEYS>(s, qa, k + buffer * tile);
        flash_online_softmax<HS, ALIBI>(s, o, m, l, k0, row0, k0 + KEYS > t0, head);
        warp_product_pb<HS, KEYS>(o, s, v + buffer * tile);
        __syncthreads();   // every warp is done with this buffer before the next copy into it
    }
    UNROLL
    for (int half = 0; half < 2; half++) l[half] = quad_sum(l[half]);
    UNROLL
    for (int nb = 0; nb < HS / 8; nb++)   // the softmax's division, once a row
        UNROLL
        for (int e = 0; e < 4; e++) o[nb][e] /= l[e / 2];
    // (b and h again from bh: one register less through the loop, which keeps the block at 168
    // registers, three blocks per SM, at head size 128 on sm_90)
    flash_store_rows<HS>(out + ((size_t)(bh / NH) * T * NH + bh % NH) * HS, (size_t)NH * HS, o, row0, T);
    UNROLL
    for (int half = 0; half < 2; half++) {
        int t = row0 + lane / 4 + 8 * half;
        if (lane % 4 == 0 && t < T) lse[(size_t)bh * T + t] = m[half] * LN2 + logf(l[half]);
    }
}

// ---- the backward

// D[b, h, t] = sum_i dout[b, t, h, i] * out[b, t, h, i]: the p . dp of every row, a warp per row.
// It also zeroes the `count` counters of attention_backward_flash_kernel, which runs next.
__global__ void attention_backward_flash_d_kernel(float* D, unsigned* counters, int count, const floatX* dout,
                                                  const floatX* out, int B, int T, int NH, int HS) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)count; i += (size_t)gridDim.x * blockDim.x)
        counters[i] = 0;
    int lane = threadIdx.x % 32;
    size_t row = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;   // (b * NH + h) * T + t
    if (row >= (size_t)B * NH * T) return;   // the whole warp
    size_t t = row % T, bh = row / T, b = bh / NH, h = bh % NH, at = ((b * T + t) * NH + h) * HS;
    float sum = 0.0f;
    for (int i = lane; i < HS; i += 32) sum += floatX_to_float(dout[at + i]) * floatX_to_float(out[at + i]);
    sum = warp_reduce_sum(sum);
    if (lane == 0) D[row] = sum;
}

// A step: st = S^T (this warp's 16 keys from key0 by FLASH_STEP queries from q0) becomes P^T,
// dpt = dP^T becomes dS^T = scale P^T (dP^T - D); stats holds the step's queries' lse (natural
// log, as the forward wrote it) then their D. Masked where a key is right of its query or the
// query is past T.
template <bool ALIBI>
__device__ void flash_scores_to_gradients(float st[][4], float dpt[][4], const float* stats, int key0, int q0, int T,
                                          bool masked, const FlashHead& head) {
    int lane = threadIdx.x % 32;
    UNROLL
    for (int n = 0; n < FLASH_STEP / 8; n++) {
        UNROLL
        for (int e = 0; e < 4; e++) {
            int key = key0 + lane / 4 + 8 * (e / 2), c = 8 * n + 2 * (lane % 4) + e % 2, query = q0 + c;
            float p = exp2f(flash_score_log2<ALIBI>(head, st[n][e], key, query) - stats[c] * LOG2E);
            if (masked && (key > query || query >= T)) p = 0.0f;
            st[n][e] = p;
            dpt[n][e] = head.scale * p * (dpt[n][e] - stats[FLASH_STEP + c]);
        }
    }
}

// this warp's dS^T (its 16 keys, from row0 of the block's, by the step's queries), rounded to
// floatX as the products take it, into the block's dS^T tile: key r's queries at ds + r FLASH_DS_ROW
__device__ void flash_store_ds(floatX* ds, const float dst[][4], int row0) {
    int lane = threadIdx.x % 32;
    UNROLL
    for (int n = 0; n < FLASH_STEP / 8; n++)
        UNROLL
        for (int half = 0; half < 2; half++)
            *(uint32_t*)(ds + (row0 + lane / 4 + 8 * half) * FLASH_DS_ROW + 8 * n + 2 * (lane % 4)) =
                pack_floatX2(dst[n][2 * half], dst[n][2 * half + 1]);
}

// dq (the step's FLASH_STEP queries by HS / 4 columns from col0: 32 rows a warp, so that each
// of K's fragments feeds both 16-row blocks) = dS K: A = dS from the dS^T tile through
// ldmatrix.trans; B = the K tile's rows (keys), columns col0 .., through ldmatrix.trans, as V's in
// P V. dq[rb HS / 32 + nb]: rows 16 rb .., columns col0 + 8 nb ..
template <int HS>
__device__ void warp_product_dq(float dq[][4], const floatX* ds, const floatX* k, int col0) {
    int lane = threadIdx.x % 32;
    UNROLL
    for (int kk = 0; kk < FLASH_ROWS / 16; kk++) {   // 16 keys at a time
        uint32_t b[HS / 64][4];   // an ldmatrix.x4.trans: two 8-column blocks
        UNROLL
        for (int j = 0; j < HS / 64; j++)
            ldmatrix_x4(b[j], k + (16 * kk + (lane / 8) % 2 * 8 + lane % 8) * FLASH_ROW(HS) + col0 + 16 * j + lane / 16 * 8, true);
        UNROLL
        for (int rb = 0; rb < FLASH_STEP / 16; rb++) {
            uint32_t a[4];   // dS rows 16 rb .., keys 16 kk ..: the dS^T tile's transpose
            ldmatrix_x4(a, ds + (16 * kk + lane / 16 * 8 + lane % 8) * FLASH_DS_ROW + 16 * rb + (lane / 8) % 2 * 8, true);
            UNROLL
            for (int j = 0; j < HS / 64; j++) {
                mma_16816(dq[rb * (HS / 32) + 2 * j], a, b[j][0], b[j][1]);
                mma_16816(dq[rb * (HS / 32) + 2 * j + 1], a, b[j][2], b[j][3]);
            }
        }
    }
}

// This warp's part of the step's dQ (warp_product_dq's dq: rows q0 .., columns col0 ..), in its
// turn: the first turn (key tile 0) stores it into sums, fp32 [T, HS] of the head; each later
// one adds it to what is there (read through a volatile pointer: from L2, where the block
// before wrote it, never a stale L1 line); the last (the diagonal's key tile) writes the total,
// rounded to floatX once, to dqkv's row t at dst + t * stride instead. Rows past T are not
// written.
template <int HS>
__device__ void flash_add_dq(float* sums, floatX* dst, size_t stride, const float dq[][4], int q0, int col0, int T,
                             bool first, bool last, const unsigned* turn) {
#ifndef __NVCC__
    emu_check_turn(turn, "adds its part of dQ");
#else
    (void)turn;
#endif
    int lane = threadIdx.x % 32;
    UNROLL
    for (int rb = 0; rb < FLASH_STEP / 16; rb++)
        UNROLL
        for (int half = 0; half < 2; half++) {
            int t = q0 + 16 * rb + lane / 4 + 8 * half;
            if (t >= T) continue;
            UNROLL
            for (int nb = 0; nb < HS / 32; nb++) {
                int c = col0 + 8 * nb + 2 * (lane % 4);
                float* s = sums + (size_t)t * HS + c;
                float x0 = dq[rb * (HS / 32) + nb][2 * half], x1 = dq[rb * (HS / 32) + nb][2 * half + 1];
                if (!first) {
                    const volatile float* before = s;
                    x0 = before[0] + x0;
                    x1 = before[1] + x1;
                }
                if (last) *(uint32_t*)(dst + (size_t)t * stride + c) = pack_floatX2(x0, x1);
                else s[0] = x0, s[1] = x1;
            }
        }
}

// The backward's pair (hi, s) of sequence b, head hi of a group (its global head h) and query
// step s, into a buffer: the step's q rows (the group's first query head's at q_group, head
// hi's HS further) and dout rows with 16-byte cp.async, the rows' lse and D ([B, NH, T] each)
// with 4-byte ones (rows of T floats are not 16-byte aligned). Not waited for.
template <int HS>
__device__ void flash_copy_pair(floatX* q_tile, floatX* dout_tile, float* stats, const floatX* q_group, int stride,
                                const floatX* dout, int out_stride, const float* lse, const float* D, int b, int NH,
                                int h, int hi, int s, int T) {
    int q0 = s * FLASH_STEP, i = threadIdx.x;
    flash_copy_rows<HS, FLASH_STEP>(q_tile, q_group + hi * HS, stride, q0, T);
    flash_copy_rows<HS, FLASH_STEP>(dout_tile, dout + (size_t)b * T * out_stride + h * HS, out_stride, q0, T);
    if (i < 2 * FLASH_STEP) {
        int t = q0 + i % FLASH_STEP;
        const float* row = (i < FLASH_STEP ? lse : D) + ((size_t)b * NH + h) * T;
        cp_async_4(stats + i, row + (t < T ? t : 0), t < T);
    }
}

// One fused kernel, FlashAttention-2's five products a step, deterministic. grid: B * G * tiles
// blocks of FLASH_THREADS, one per 64-key tile of each (b, group); warp w owns the tile's keys
// 16w .. 16w + 15. The tile's K and V stay in shared memory (and, at head size 64, the warp's K
// fragments in registers: loop-invariant) while the block walks the 32-row query steps at and
// below the diagonal of each of the group's NH/G heads in turn, one cp.async pipeline of (head,
// step) pairs (q, dout and the rows' lse and D of the next pair in flight during this one):
//   S^T = K Q^T, dP^T = V dO^T; P^T and dS^T = P^T (dP^T - D) in registers;
//   dV += P^T dO, dK += dS^T Q, in registers across the whole walk (so K and V are read once
//   per group, and dK and dV sum over the group's heads in head order);
//   dS^T to shared memory, and dQ_step = dS K, each warp 32 rows by HS / 4 columns.
// A step's dQ sums the partial products of key tiles 0 up to kt_max (its diagonal's), which
// belong to different blocks: they add them in that order, each in its turn on the step's
// counter (flash_wait_turn), the first storing into `sums` (fp32, in scratch), the last writing
// floatX into dqkv. The same sums in the same order: the same bits every run, where
// FlashAttention-2 adds dQ with atomics. A block may wait only for blocks that started before it
// (one not yet started may need the waiting block's SM): so a block does not take its tile from
// blockIdx (the GPU may start blocks in any order) but from a ticket, counters[count - 1]
// counted up as blocks start, which hands out tile 0 of every (b, group), then tile 1 of every
// one, and so on: the tiles a block waits for have lower tickets, and started first. Tile kt
// walks 2 (tiles - kt) steps, tile 0 the most: so the longest blocks start first and the last to
// start are the shortest (the other order, the diagonal's tile first, started the longest last
// and left the GPU half idle at the end: 15% longer at GPT-2's 16 x 1024 by a list
// schedule of the blocks on 396 slots), and a tile's predecessor in the turns is usually done
// before it starts. counters: [B, NH, steps] turns, then the ticket; zero when the kernel starts
// (the D kernel zeroes them). sums: [B, NH, T, HS] floats.
template <int HS, bool ALIBI>
__global__ void __launch_bounds__(FLASH_THREADS, HS > 64 ? 1 : 3) attention_backward_flash_kernel(floatX* dqkv, float* sums,
        unsigned* counters, const floatX* dout, const floatX* qkv, const float* lse, const float* D, int B, int T, int NH,
        int G, Alibi alibi) {
    constexpr int step_tile = FLASH_STEP * FLASH_ROW(HS);
    // K's A fragments in registers at head size 64 (16 registers; V's too would take 16 more, and
    // the block would no longer fit the 168 registers that give three blocks an SM): at 128 they
    // would take 32 more where dK and dV take 128
    constexpr bool k_in_registers = HS <= 64;
    floatX* k = flash_shared();
    floatX* v = k + FLASH_ROWS * FLASH_ROW(HS);
    floatX* q = v + FLASH_ROWS * FLASH_ROW(HS);   // two buffers, then dout's two
    floatX* dO = q + 2 * step_tile;
    floatX* ds = dO + 2 * step_tile;              // dS^T, FLASH_ROWS keys by FLASH_STEP queries
    float* stats = (float*)(ds + FLASH_ROWS * FLASH_DS_ROW);   // per buffer: FLASH_STEP lse, then D
    unsigned* ticket = (unsigned*)(stats + 4 * FLASH_STEP);   // the tile and its (b, group)
    int steps_T = CEIL_DIV(T, FLASH_STEP), per = NH / G;
    if (threadIdx.x == 0) {
        unsigned i = atomicAdd(counters + (size_t)B * NH * steps_T, 1u);
        ticket[0] = i / (B * G), ticket[1] = i % (B * G);
    }
    __syncthreads();
    int kt = (int)ticket[0], bg = (int)ticket[1], b = bg / G, g = bg % G;
    int k0 = kt * FLASH_ROWS, warp = threadIdx.x / 32, key0 = k0 + 16 * warp;
    int stride = (NH + 2 * G) * HS, out_stride = NH * HS;   // (int: two registers fewer)
    // causal: queries before k0 see none of these keys; each head's steps start at `first`
    int first = k0 / FLASH_STEP, pairs = per * (steps_T - first);
    size_t group = qkv_group_index(b, 0, g, 0, T, NH, G, HS);   // the group's first query head; head hi at + hi HS
    // the pairs (hi, s), head g per + hi of the group and its query step s, go through the steps
    // of each head in turn
    flash_copy_rows<HS, FLASH_ROWS>(k, qkv + qkv_group_index(b, 0, g, per, T, NH, G, HS), stride, k0, T);
    flash_copy_rows<HS, FLASH_ROWS>(v, qkv + qkv_group_index(b, 0, g, per + 1, T, NH, G, HS), stride, k0, T);
    cp_async_commit();   // K and V: a group of their own, waited for before the first pair
    flash_copy_pair<HS>(q, dO, stats, qkv + group, stride, dout, out_stride, lse, D, b, NH, g * per, 0, first, T);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    uint32_t kf[HS / 16][4];   // this warp's keys as A fragments
    if (k_in_registers)
        UNROLL
        for (int kk = 0; kk < HS / 16; kk++) load_a<HS>(kf[kk], k, 16 * warp, kk);
    float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
    int hi = 0, s = first;   // the pair's head in the group, and query step
    for (int j = 0; j < pairs; j++) {
        int buffer = j % 2, h = g * per + hi, q0 = s * FLASH_STEP;
        int next_hi = s + 1 < steps_T ? hi : hi + 1, next_s = s + 1 < steps_T ? s + 1 : first;
        const floatX* qs = q + buffer * step_tile;
        const floatX* dos = dO + buffer * step_tile;
        if (j + 1 < pairs)
            flash_copy_pair<HS>(q + (1 - buffer) * step_tile, dO + (1 - buffer) * step_tile, stats + (1 - buffer) * 2 * FLASH_STEP,
                                qkv + group, stride, dout, out_stride, lse, D, b, NH, g * per + next_hi, next_hi, next_s, T);
        cp_async_commit();
        cp_async_wait<1>();   // all but the newest group: this pair is here
        __syncthreads();      // ... and every thread's part of it
        const FlashHead head = flash_head(HS, alibi, h);
        float st[FLASH_STEP / 8][4] = {}, dpt[FLASH_STEP / 8][4] = {};
        if (k_in_registers) warp_product_abt<HS, FLASH_STEP>(st, kf, qs);   // S^T = K Q^T
        else warp_product_abt<HS, FLASH_STEP>(st, k, 16 * warp, qs);
        warp_product_abt<HS, FLASH_STEP>(dpt, v, 16 * warp, dos);            // dP^T = V dO^T
        bool diagonal = q0 < k0 + FLASH_ROWS;   // (the walk's steps start at the tile's diagonal)
        bool masked = diagonal || q0 + FLASH_STEP > T;   // the diagonal, or past T
        flash_scores_to_gradients<ALIBI>(st, dpt, stats + buffer * 2 * FLASH_STEP, key0, q0, T, masked, head);
        warp_product_pb<HS, FLASH_STEP>(dv, st, dos);   // dV += P^T dO
        warp_product_pb<HS, FLASH_STEP>(dk, dpt, qs);   // dK += dS^T Q
        flash_store_ds(ds, dpt, 16 * warp);
        __syncthreads();   // the block's dS^T is whole
        float dq[FLASH_STEP / 16 * HS / 32][4] = {};
        warp_product_dq<HS>(dq, ds, k, warp * HS / 4);   // dQ_step = dS K
        // the step's dQ: the key tiles from 0 up to its diagonal's, s / 2, in turn
        unsigned* turn = counters + ((size_t)b * NH + h) * steps_T + s;
        flash_wait_turn(turn, kt);
        flash_add_dq<HS>(sums + ((size_t)b * NH + h) * T * HS, dqkv + group + hi * HS, stride, dq, q0, warp * HS / 4, T,
                         kt == 0, diagonal, turn);
        flash_pass_turn(turn);   // its barrier: every warp is done with this pair's buffers and dS^T
        hi = next_hi, s = next_s;
    }
    // (the tile again from the ticket in shared memory: at head size 64 a register less through the
    // loop, which keeps the block at 168 registers, three blocks per SM, without a spill)
    bg = (int)ticket[1], b = bg / G, g = bg % G, key0 = (int)ticket[0] * FLASH_ROWS + 16 * warp;
    flash_store_rows<HS>(dqkv + qkv_group_index(b, 0, g, per, T, NH, G, HS), stride, dk, key0, T);
    flash_store_rows<HS>(dqkv + qkv_group_index(b, 0, g, per + 1, T, NH, G, HS), stride, dv, key0, T);
}

// ---- the launches

// this process's GPU's compute capability, its major number (7: V100, 8: A100, 9: H100), asked once
static int device_major_version(void) {
    static int major = 0;
    if (major == 0) {
        int device;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    }
    return major;
}

// can this process's GPU run the fused attention? mma.sync.m16n8k16 and cp.async need sm_80
static int flash_attention_runs_here(void) { return device_major_version() >= 8; }

static void check_flash_arguments(int HS, const void* qkv, const void* dout) {
    if (!flash_attention_runs_here())
        fail("the fused attention needs a GPU of compute capability 8.0 or newer (A100, H100), this one is %d.x: "
             "run --attention-backend unfused", device_major_version());
    if (!flash_attention_supports(HS)) fail("the fused attention is built for head sizes 64 and 128, got %d", HS);
    if ((uintptr_t)qkv % 16 != 0 || (uintptr_t)dout % 16 != 0)
        fail("the fused attention copies 16 bytes at a time: qkv (%p) and dout (%p) must be 16-byte aligned", qkv, dout);
}

// a flash kernel's instance for the launcher's head size and ALiBi: a name with a comma in it
// cannot be LAUNCH's argument, a macro call can
#define FLASH_INSTANCE(kernel) kernel<HS, ALIBI>

// a kernel may use more than 48 KiB of dynamic shared memory only after it asked for it
template <class Kernel>
static void allow_shared_bytes(Kernel* kernel, size_t bytes) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

template <int HS, bool ALIBI>
static void attention_forward_flash_at(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int G, Alibi alibi) {
    static size_t allowed = 0;
    size_t bytes = flash_shared_bytes(HS, 1);
    if (allowed != bytes) allow_shared_bytes(FLASH_INSTANCE(attention_forward_flash_kernel), bytes), allowed = bytes;
    LAUNCH(FLASH_INSTANCE(attention_forward_flash_kernel), B * NH * CEIL_DIV(T, FLASH_ROWS), FLASH_THREADS, bytes,
           out, lse, qkv, T, NH, G, alibi);
}

template <int HS, bool ALIBI>
static void attention_backward_flash_at(floatX* dqkv, float* sums, unsigned* counters, const float* D, const floatX* dout,
                                        const floatX* qkv, const float* lse, int B, int T, int NH, int G, Alibi alibi) {
    static size_t allowed = 0;
    size_t bytes = flash_shared_bytes(HS, 0);
    if (allowed != bytes) allow_shared_bytes(FLASH_INSTANCE(attention_backward_flash_kernel), bytes), allowed = bytes;
    int tiles = CEIL_DIV(T, FLASH_ROWS);   // a block per key tile of each (b, group)
    LAUNCH(FLASH_INSTANCE(attention_backward_flash_kernel), B * G * tiles, FLASH_THREADS, bytes, dqkv, sums, counters, dout,
           qkv, lse, D, B, T, NH, G, alibi);
}

static void attention_forward_flash(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int G, int HS,
                                    Alibi alibi) {
    check_flash_arguments(HS, qkv, qkv);
    // the four instances: head size 64 or 128, ALiBi or not
    if (HS == 64 && alibi.heads) attention_forward_flash_at<64, true>(out, lse, qkv, B, T, NH, G, alibi);
    else if (HS == 64) attention_forward_flash_at<64, false>(out, lse, qkv, B, T, NH, G, alibi);
    else if (alibi.heads) attention_forward_flash_at<128, true>(out, lse, qkv, B, T, NH, G, alibi);
    else attention_forward_flash_at<128, false>(out, lse, qkv, B, T, NH, G, alibi);
}

// scratch: flash_backward_scratch_floats(B, T, NH, HS) floats (D, dQ's sums, the counters); out
// and lse: the forward's
static void attention_backward_flash(floatX* dqkv, float* scratch, const floatX* dout, const floatX* qkv, const floatX* out,
                                     const float* lse, int B, int T, int NH, int G, int HS, Alibi alibi) {
    check_flash_arguments(HS, qkv, dout);
    size_t rows = (size_t)B * NH * T;
    float *D = scratch, *sums = scratch + rows;
    unsigned* counters = (unsigned*)(sums + rows * HS);
    int count = B * NH * CEIL_DIV(T, FLASH_STEP) + 1;   // the turns and the ticket
    LAUNCH(attention_backward_flash_d_kernel, CEIL_DIV(rows, ROWS_PER_BLOCK), ROW_BLOCK, 0, D, counters, count, dout, out,
           B, T, NH, HS);
    if (HS == 64 && alibi.heads) attention_backward_flash_at<64, true>(dqkv, sums, counters, D, dout, qkv, lse, B, T, NH, G, alibi);
    else if (HS == 64) attention_backward_flash_at<64, false>(dqkv, sums, counters, D, dout, qkv, lse, B, T, NH, G, alibi);
    else if (alibi.heads) attention_backward_flash_at<128, true>(dqkv, sums, counters, D, dout, qkv, lse, B, T, NH, G, alibi);
    else attention_backward_flash_at<128, false>(dqkv, sums, counters, D, dout, qkv, lse, B, T, NH, G, alibi);
}
// The layer's layout decides which attention runs: lse given (the fused kernels keep the
// log-sum-exp), or att (the cuBLAS path keeps the probabilities).
static void attention_forward(floatX* out, floatX* att, float* lse, floatX* scratch, const floatX* qkv,
                              int B, int T, int NH, int G, int HS, Alibi alibi) {
    if (lse) attention_forward_flash(out, lse, qkv, B, T, NH, G, HS, alibi);
    else attention_forward_unfused(out, att, scratch, qkv, B, T, NH, G, HS, alibi);
}

static void attention_backward(floatX* dqkv, floatX* scratch, const floatX* dout, const floatX* qkv, const floatX* out,
                               const floatX* att, const float* lse, int B, int T, int NH, int G, int HS, Alibi alibi) {
    if (lse) attention_backward_flash(dqkv, (float*)scratch, dout, qkv, out, lse, B, T, NH, G, HS, alibi);
    else attention_backward_unfused(dqkv, scratch, dout, qkv, att, B, T, NH, G, HS);
}
// selective recomputation's pass: the probabilities again, for the backward (the cuBLAS path
// alone: the fused attention keeps none, and its backward recomputes them itself)
static void attention_probabilities(floatX* att, floatX* scratch, const floatX* qkv, int B, int T, int NH, int G, int HS,
                                    Alibi alibi) {
    attention_probabilities_unfused(att, scratch, qkv, B, T, NH, G, HS, alibi);
}
#else
static int flash_attention_runs_here(void) { return 1; }   // the CPU build plans for any GPU

// one C attention: the layout's lse (never planned on this build) and out are not needed
#define attention_forward(out, att, lse, scratch, qkv, B, T, NH, G, HS, alibi) \
    attention_forward_cpu(out, att, qkv, B, T, NH, G, HS, alibi)
#define attention_backward(dqkv, scratch, dout, qkv, out, att, lse, B, T, NH, G, HS, alibi) \
    attention_backward_cpu(dqkv, scratch, dout, qkv, att, B, T, NH, G, HS)
#define attention_probabilities(att, scratch, qkv, B, T, NH, G, HS, alibi) \
    attention_probabilities_cpu(att, qkv, B, T, NH, G, HS, alibi)
#endif

// ----------------------------------------------------------------------------
// generation's attention: a KV cache (what every decoder's inference keeps; Megatron-LM's
// InferenceParams, transformers' past_key_values)
// One sequence is decoded a few rows at a time. The keys and values of every position so far
// stay in a per-layer cache [max_len, 2 * G * HS]: position t's row holds this rank's G key
// heads side by side, then the G value heads (G = NH without grouped-query attention: a
// group's query heads share its cached key and value). The n new rows at positions [pos0, pos0 + n) append
// theirs (kv_cache_append), and query pos0 + i attends to the cache's keys 0 .. pos0 + i
// (attention_decode): the causal rule of the training attention, with ALiBi's bias as
// alibi_bias adds it there. A new token costs one position, not the whole prefix again.

HOST_DEVICE static inline size_t kv_cache_index(int t, int g, int which, int G, int HS) {
    return (size_t)t * 2 * G * HS + (size_t)which * G * HS + (size_t)g * HS;   // which: 0 key, 1 value
}

// the n rows' keys and values (qkv [n, (NH + 2G) * HS], one sequence) into the cache's rows pos0 ..
static void kv_cache_append_cpu(float* cache, const float* qkv, int n, int pos0, int NH, int G, int HS) {
    #pragma omp parallel for
    for (int i = 0; i < n; i++)
        for (int g = 0; g < G; g++)
            for (int which = 0; which < 2; which++) {
                const float* src = qkv + qkv_group_index(0, i, g, NH / G + which, n, NH, G, HS);
                float* dst = cache + kv_cache_index(pos0 + i, g, which, G, HS);
                for (int d = 0; d < HS; d++) dst[d] = src[d];
            }
}

// query q of head h (of group g) against the cached key of position t2, scaled, with ALiBi's
// bias for query position t
static float decode_score(const float* q, const float* cache, int t, int t2, int h, int g, int G, int HS, Alibi alibi) {
    const float* k = cache + kv_cache_index(t2, g, 0, G, HS);
    float s = 0.0f;
    #pragma omp simd reduction(+ : s)
    for (int d = 0; d < HS; d++) s += q[d] * k[d];
    return s / sqrtf((float)HS) + alibi_bias(alibi, h, t, t2);
}

// out[n, NH * HS]: softmax over the keys 0 .. pos0 + i of query i's scores, times the values.
// Two passes over the keys: their largest score (a stable softmax), then the weights and the
// weighted sum of the values; no scratch.
static void attention_decode_cpu(float* out, const float* cache, const float* qkv, int n, int pos0, int NH, int G,
                                 int HS, Alibi alibi) {
    #pragma omp parallel for collapse(2)
    for (int i = 0; i < n; i++)
        for (int h = 0; h < NH; h++) {
            int t = pos0 + i, g = h / (NH / G);
            const float* q = qkv + qkv_index(0, i, h, 0, n, NH, G, HS);
            float* o = out + ((size_t)i * NH + h) * HS;
            float maxval = -INFINITY, sum = 0.0f;
            for (int t2 = 0; t2 <= t; t2++) maxval = fmaxf(maxval, decode_score(q, cache, t, t2, h, g, G, HS, alibi));
            for (int d = 0; d < HS; d++) o[d] = 0.0f;
            for (int t2 = 0; t2 <= t; t2++) {
                float w = expf(decode_score(q, cache, t, t2, h, g, G, HS, alibi) - maxval);
                const float* v = cache + kv_cache_index(t2, g, 1, G, HS);
                sum += w;
                for (int d = 0; d < HS; d++) o[d] += w * v[d];
            }
            for (int d = 0; d < HS; d++) o[d] /= sum;
        }
}

#ifdef __CUDACC__
// one thread per element of the n new cache rows
__global__ void kv_cache_append_kernel(floatX* cache, const floatX* qkv, int n, int pos0, int NH, int G, int HS) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x, row = 2 * (size_t)G * HS;
    if (idx >= (size_t)n * row) return;
    int i = (int)(idx / row), r = (int)(idx % row), which = r / (G * HS), g = r / HS % G, d = r % HS;
    cache[(size_t)(pos0 + i) * row + r] = qkv[qkv_group_index(0, i, g, NH / G + which, n, NH, G, HS) + d];
}

// One block of DECODE_BLOCK threads per (query i, head h). Warp w takes the keys w, w + warps,
// ...; its lanes split the head's dimensions (DECODE_DIMS each: HS <= 32 x DECODE_DIMS), sum the
// score with a warp reduction, and keep an online softmax (Milakov and Gimelshein 2018): the
// running maximum m, the sum l of exp(score - m) and the output o, rescaled by exp(m_old - m)
// when m grows. The block then merges its warps' (m, l, o) with block reductions.
#define DECODE_BLOCK 256
#define DECODE_DIMS 8
__global__ void attention_decode_kernel(floatX* out, const floatX* cache, const floatX* qkv, int n, int pos0, int NH,
                                        int G, int HS, Alibi alibi) {
    int i = blockIdx.x / NH, h = blockIdx.x % NH, t = pos0 + i, g = h / (NH / G);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const floatX* q = qkv + qkv_index(0, i, h, 0, n, NH, G, HS);
    float scale = 1.0f / sqrtf((float)HS), qr[DECODE_DIMS], o[DECODE_DIMS], m = -INFINITY, l = 0.0f;
    for (int k = 0; k < DECODE_DIMS; k++) {
        int d = lane + 32 * k;
        qr[k] = d < HS ? floatX_to_float(q[d]) : 0.0f;
        o[k] = 0.0f;
    }
    for (int t2 = warp; t2 <= t; t2 += warps) {   // the same keys for every lane of the warp
        const floatX* key = cache + kv_cache_index(t2, g, 0, G, HS);
        const floatX* value = cache + kv_cache_index(t2, g, 1, G, HS);
        float s = 0.0f;
        for (int k = 0; k < DECODE_DIMS; k++)
            if (lane + 32 * k < HS) s += qr[k] * floatX_to_float(key[lane + 32 * k]);
        s = warp_reduce_sum(s) * scale + alibi_bias(alibi, h, t, t2);
        float m_new = fmaxf(m, s), rescale = expf(m - m_new), w = expf(s - m_new);
        l = l * rescale + w;
        for (int k = 0; k < DECODE_DIMS; k++)
            if (lane + 32 * k < HS) o[k] = o[k] * rescale + w * floatX_to_float(value[lane + 32 * k]);
        m = m_new;
    }
    // merge the warps: a warp's share is weighed by exp(m - the block's maximum); key 0 makes
    // that maximum finite, and a warp without keys (m = -inf) weighs 0
    float block_max = block_reduce_max(m), weight = expf(m - block_max);
    float sum = block_reduce_sum(lane == 0 ? l * weight : 0.0f);
    for (int k = 0; k < DECODE_DIMS; k++)
        for (int j = 0; j < 32 && j + 32 * k < HS; j++) {   // the same bounds in every thread
            float v = block_reduce_sum(lane == j ? o[k] * weight : 0.0f);
            if (threadIdx.x == 0) out[((size_t)i * NH + h) * HS + j + 32 * k] = to_floatX(v / sum);
        }
}

static void kv_cache_append(floatX* cache, const floatX* qkv, int n, int pos0, int NH, int G, int HS) {
    LAUNCH(kv_cache_append_kernel, CEIL_DIV((size_t)n * 2 * G * HS, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0,
           cache, qkv, n, pos0, NH, G, HS);
}

static void attention_decode(floatX* out, const floatX* cache, const floatX* qkv, int n, int pos0, int NH, int G, int HS,
                             Alibi alibi) {
    if (HS > 32 * DECODE_DIMS) fail("attention_decode: head size %d, above %d", HS, 32 * DECODE_DIMS);
    LAUNCH(attention_decode_kernel, n * NH, DECODE_BLOCK, 0, out, cache, qkv, n, pos0, NH, G, HS, alibi);
}
#else
#define kv_cache_append kv_cache_append_cpu
#define attention_decode attention_decode_cpu
#endif

// ----------------------------------------------------------------------------
// rotary position embedding (Su et al. 2021, RoFormer; Megatron's --position-embedding-type
// rope, --rotary-base, --rotary-percent), applied in place to the q and k heads of qkv
// The non-interleaved convention (Megatron's default; Hugging Face Llama's rotate_half): of a
// head's first r = rotary_dims dims (HS * rotary_percent, even), dim i < r/2 is paired with
// dim i + r/2 and the pair turned by the angle pos * inv_freq[i], inv_freq[i] = base^(-2i/r):
//   x'[i] = x[i] cos - x[i + r/2] sin,   x'[i + r/2] = x[i + r/2] cos + x[i] sin;
// dims [r, HS) and the v heads are left as they are. Token t of a sequence is at position
// pos0 + t (pos0 > 0: decoding after pos0 cached tokens). The backward turns the gradient by
// the opposite angle (a rotation's transpose is its inverse), in place on dqkv.
// The angle is fp32 (position times the fp32 inv_freq), as Megatron and Hugging Face compute it;
// inv_freq is rounded once from fp64 (one pow per thread on the GPU, where --use_fast_math
// would make powf coarse enough to move the angle of position 4096 by ~1e-2).
//
// qkv is the attention's layout (Megatron's grouped-query one, qkv_group_index): a token's row
// is G groups, each [the NH/G query heads of the group, the group's k head, its v head].
//
// Why a separate in-place pass rather than rotating inside the fused attention's tile loads:
// the rotated k is what the KV cache keeps for decoding, what the unfused (cuBLAS) path, the
// decode kernel and the CPU build read, and what the attention backward needs again; rotating
// once here gives all of them the same buffer and leaves the attention kernels (and their
// SASS rules) as they are. The fused kernels load each k tile once per query tile, so rotating
// at load would recompute the sines T / FLASH_ROWS times over, and the backward would need the
// inverse rotation on dq and dk on the way out of three kernels. The cost here is one read and
// one write of q and k, (NH + G) x HS per token, small beside the attention itself.

// inv_freq[i] = base^(-2i / r), rounded once to fp32
HOST_DEVICE static inline float rope_inv_freq(int i, int rotary_dims, float base) {
    return (float)pow((double)base, -2.0 * i / rotary_dims);
}

static void rope_check(int NH, int G, int HS, int rotary_dims) {
    if (G <= 0 || NH % G != 0) fail("rope: %d query heads do not split into %d groups", NH, G);
    if (rotary_dims < 0 || rotary_dims > HS || rotary_dims % 2 != 0)
        fail("rope: %d rotary dims of a head of %d: they must be even and at most the head size", rotary_dims, HS);
}

// direction +1: the forward rotation; -1: its transpose, the backward
static void rope_rotate_cpu(float* qkv, int B, int T, int NH, int G, int HS, int rotary_dims, float base, int pos0,
                            float direction) {
    rope_check(NH, G, HS, rotary_dims);
    int half = rotary_dims / 2;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int i = 0; i < half; i++) {
                float theta = (float)(pos0 + t) * rope_inv_freq(i, rotary_dims, base);
                float c = cosf(theta), s = direction * sinf(theta);
                for (int g = 0; g < G; g++) {
                    for (int slot = 0; slot <= NH / G; slot++) {   // the group's queries, then its k
                        float* x = qkv + qkv_group_index(b, t, g, slot, T, NH, G, HS);
                        float x1 = x[i], x2 = x[i + half];
                        x[i] = x1 * c - x2 * s;
                        x[i + half] = x2 * c + x1 * s;
                    }
                }
            }
        }
    }
}

static void rope_forward_cpu(float* qkv, int B, int T, int NH, int G, int HS, int rotary_dims, float base, int pos0) {
    rope_rotate_cpu(qkv, B, T, NH, G, HS, rotary_dims, base, pos0, 1.0f);
}

static void rope_backward_cpu(float* dqkv, int B, int T, int NH, int G, int HS, int rotary_dims, float base, int pos0) {
    rope_rotate_cpu(dqkv, B, T, NH, G, HS, rotary_dims, base, pos0, -1.0f);
}

#ifdef __CUDACC__
// One thread per token and frequency i: it computes the angle's sine and cosine once and turns
// the pair (i, i + r/2) of each of the token's NH + G rotated heads. Neighbouring threads take
// neighbouring i, so each head's loads and stores are contiguous across the warp (2-byte
// accesses: a pair's two halves are r/2 apart, so 128-bit packs would not line up).
// The angle is reduced to [-pi, pi] first (Cody and Waite: 2 pi split into a part exact in a
// few bits and the rest), as --use_fast_math makes sinf and cosf the hardware's approximations,
// accurate only near 0.
#define TWO_PI_HI 6.28125f                   // 201 / 32: k * TWO_PI_HI is exact for k < 2^16
#define TWO_PI_LO 1.9353071795864769253e-3f  // 2 pi - TWO_PI_HI
__global__ void rope_rotate_kernel(floatX* qkv, int B, int T, int NH, int G, int HS, int rotary_dims, float base,
                                   int pos0, float direction) {
    int half = rotary_dims / 2;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * half) return;
    int i = (int)(idx % half), n = (int)(idx / half), b = n / T, t = n % T;
    float theta = (float)(pos0 + t) * rope_inv_freq(i, rotary_dims, base);
    float turns = rintf(theta * (1.0f / 6.283185307179586f));
    float reduced = fmaf(-turns, TWO_PI_LO, fmaf(-turns, TWO_PI_HI, theta));
    float c = cosf(reduced), s = direction * sinf(reduced);
    for (int g = 0; g < G; g++) {
        for (int slot = 0; slot <= NH / G; slot++) {   // the group's queries, then its k
            floatX* x = qkv + qkv_group_index(b, t, g, slot, T, NH, G, HS);
            float x1 = floatX_to_float(x[i]), x2 = floatX_to_float(x[i + half]);
            x[i] = to_floatX(x1 * c - x2 * s);
            x[i + half] = to_floatX(x2 * c + x1 * s);
        }
    }
}

static void rope_rotate(floatX* qkv, int B, int T, int NH, int G, int HS, int rotary_dims, float base, int pos0,
                        float direction) {
    rope_check(NH, G, HS, rotary_dims);
    LAUNCH(rope_rotate_kernel, CEIL_DIV((size_t)B * T * (rotary_dims / 2), ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0,
           qkv, B, T, NH, G, HS, rotary_dims, base, pos0, direction);
}

static void rope_forward(floatX* qkv, int B, int T, int NH, int G, int HS, int rotary_dims, float base, int pos0) {
    rope_rotate(qkv, B, T, NH, G, HS, rotary_dims, base, pos0, 1.0f);
}

static void rope_backward(floatX* dqkv, int B, int T, int NH, int G, int HS, int rotary_dims, float base, int pos0) {
    rope_rotate(dqkv, B, T, NH, G, HS, rotary_dims, base, pos0, -1.0f);
}
#else
#define rope_forward rope_forward_cpu
#define rope_backward rope_backward_cpu
#endif

// ----------------------------------------------------------------------------
// GELU, GPT-2's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))

#define GELU_SCALE 0.7978845608028654f  // sqrt(2 / pi)

// tanh(u) = 1 - 2 / (exp(2u) + 1): glibc's tanhf costs several expf calls and took a fifth
// of a small model's step; this form is exact to float rounding and saturates correctly
// (exp overflows to inf -> 1, underflows to 0 -> -1). exp_poly, so that the loops over the
// elements run on vector lanes.
static inline float tanh_by_exp(float u) { return 1.0f - 2.0f / (exp_poly(2.0f * u) + 1.0f); }

static void gelu_forward_cpu(float* out, const float* inp, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanh_by_exp(GELU_SCALE * (x + 0.044715f * x * x * x)));
    }
}

// dinp may be the same buffer as dout
static void gelu_backward_cpu(float* dinp, const float* inp, const float* dout, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float th = tanh_by_exp(u);
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = grad * dout[i];
    }
}

#ifdef __CUDACC__
// one thread per pack of X128 elements (the last one may be short)
__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * X128;
    if (i >= n) return;
    int count = pack_count(i, n);
    x128 px = load_pack(inp + i, count), po;
    for (int k = 0; k < X128; k++) {
        float x = floatX_to_float(px.e[k]);
        po.e[k] = to_floatX(0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x))));
    }
    store_pack(out + i, po, count);
}

// dinp may be dout: each thread reads its pack of dout before writing dinp's
__global__ void gelu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * X128;
    if (i >= n) return;
    int count = pack_count(i, n);
    x128 px = load_pack(inp + i, count), pd = load_pack(dout + i, count), po;
    for (int k = 0; k < X128; k++) {
        float x = floatX_to_float(px.e[k]);
        float th = tanhf(GELU_SCALE * (x + 0.044715f * x * x * x));
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        po.e[k] = to_floatX(grad * floatX_to_float(pd.e[k]));
    }
    store_pack(dinp + i, po, count);
}

static void gelu_forward(floatX* out, const floatX* inp, size_t n) {
    LAUNCH(gelu_forward_kernel, CEIL_DIV(CEIL_DIV(n, X128), ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0, out, inp, n);
}

static void gelu_backward(floatX* dinp, const floatX* inp, const floatX* dout, size_t n) {
    LAUNCH(gelu_backward_kernel, CEIL_DIV(CEIL_DIV(n, X128), ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0, dinp, inp, dout, n);
}
#else
#define gelu_forward gelu_forward_cpu
#define gelu_backward gelu_backward_cpu
#endif

// ----------------------------------------------------------------------------
// the MLP's GELU and the linear layers on either side of it
// Forward, the first linear layer and its GELU: pre_gelu = inp @ weight^T + bias (kept for the
// backward), out = GELU(pre_gelu). On the GPU one cuBLASLt call writes both (the GELU in the
// GEMM's epilogue) instead of a GEMM, then a GELU kernel reading pre_gelu back. Backward, the
// second linear layer and the GELU before it, gelu_matmul_backward: below.

static void matmul_gelu_forward_cpu(float* out, float* pre_gelu, const float* inp, const float* weight,
                                    const float* bias, int N, int C, int OC) {
    matmul_forward_cpu(pre_gelu, inp, weight, bias, N, C, OC);
    gelu_forward_cpu(out, pre_gelu, (size_t)N * OC);
}

#ifdef __CUDACC__
// cuBLASLt takes pre_gelu (its "aux" output) only with a leading dimension that is a multiple
// of 8 and, we assume, 16-byte aligned, as the bias (see tests/emu/cublasLt.h); otherwise (or
// with no algorithm for it) the two steps of the reference. The GELU is applied to the fp32 sum there, to its floatX
// rounding here: the same within a rounding.
static void matmul_gelu_forward(floatX* out, floatX* pre_gelu, const floatX* inp, const floatX* weight,
                                const floatX* bias, int N, int C, int OC) {
    if (OC % 8 == 0 && (uintptr_t)pre_gelu % 16 == 0 && (bias == NULL || (uintptr_t)bias % 16 == 0) &&
        matmul_cublaslt(out, pre_gelu, inp, weight, bias, N, C, OC))
        return;
    matmul_forward(pre_gelu, inp, weight, bias, N, C, OC);
    gelu_forward(out, pre_gelu, (size_t)N * OC);
}
#else
#define matmul_gelu_forward matmul_gelu_forward_cpu
#endif

// The backward of out = GELU(pre_gelu) @ weight^T + bias: the MLP's second linear layer and the
// GELU before it. dpre = (dout @ weight) * GELU'(pre_gelu), the gradient at the GELU's input;
// dweight and dbias as matmul_backward's, inp being the layer's input GELU(pre_gelu). On the
// GPU cuBLASLt multiplies by GELU' in the epilogue of the GEMM that computes dout @ weight
// (CUBLASLT_EPILOGUE_DGELU, pre_gelu its aux input) instead of a GELU-backward kernel reading
// pre_gelu and that product back, and writing the product again.
static void gelu_matmul_backward_cpu(float* dpre, float* dweight, float* dbias, const float* dout, const float* inp,
                                     const float* weight, const float* pre_gelu, int N, int C, int OC) {
    matmul_backward_cpu(dpre, dweight, dbias, dout, inp, weight, N, C, OC);
    gelu_backward_cpu(dpre, pre_gelu, dpre, (size_t)N * C);
}

#ifdef __CUDACC__
// The epilogue applies GELU' to the fp32 product, which the two steps round to floatX first:
// one rounding less. pre_gelu as an aux input: the rules matmul_gelu_forward's aux output
// keeps (C a multiple of 8, 16-byte aligned); otherwise, or with no algorithm for it, the two
// steps of the reference.
static void gelu_matmul_backward(floatX* dpre, float* dweight, float* dbias, float* partials, const floatX* dout,
                                 const floatX* inp, const floatX* weight, const floatX* pre_gelu, int N, int C, int OC) {
    LtEpilogue dgelu = {CUBLASLT_EPILOGUE_DGELU, NULL, pre_gelu};
    // laid out as matmul_backward_dinp's product
    if (!(C % 8 == 0 && (uintptr_t)pre_gelu % 16 == 0 &&
          gemm_lt(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, weight, C, dout, OC, 0.0f, dpre, CUDA_R_FLOATX, C, dgelu))) {
        matmul_backward_dinp(dpre, dout, weight, N, C, OC);
        gelu_backward(dpre, pre_gelu, dpre, (size_t)N * C);
    }
    matmul_backward_params(dweight, dbias, partials, dout, inp, N, C, OC);
}
#else
#define gelu_matmul_backward(dpre, dweight, dbias, partials, ...) gelu_matmul_backward_cpu(dpre, dweight, dbias, __VA_ARGS__)
#endif

// ----------------------------------------------------------------------------
// SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer"; Megatron's --swiglu)
// The MLP's first linear layer yields inp[N, 2F]: per row the gate a (the first F columns),
// then the up projection b (the next F). out[N, F] = silu(a) * b, silu(a) = a * sigmoid(a):
// Megatron's swiglu (megatron/core/fusions/fused_bias_swiglu.py: y_1, y_2 = chunk(y, 2, -1);
// silu(y_1) * y_2), so fc1's weight is [gate rows; up rows]. In Hugging Face Llama terms,
// down_proj(silu(gate_proj(x)) * up_proj(x)): gate_proj's rows are fc1's first F rows, up_proj's
// the next F (with tensor parallelism each rank's fc1 holds [its gate rows; its up rows]).
// Backward (dinp overwritten, [N, 2F]): da = dout * b * sigmoid(a) (1 + a (1 - sigmoid(a))),
// db = dout * silu(a).

static inline float sigmoid_by_exp(float a) { return 1.0f / (1.0f + exp_poly(-a)); }

static void swiglu_forward_cpu(float* out, const float* inp, int N, int F) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* a = inp + (size_t)n * 2 * F;
        const float* b = a + F;
        for (int j = 0; j < F; j++) out[(size_t)n * F + j] = a[j] * sigmoid_by_exp(a[j]) * b[j];
    }
}

static void swiglu_backward_cpu(float* dinp, const float* inp, const float* dout, int N, int F) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* a = inp + (size_t)n * 2 * F;
        const float* b = a + F;
        float* da = dinp + (size_t)n * 2 * F;
        float* db = da + F;
        for (int j = 0; j < F; j++) {
            float d = dout[(size_t)n * F + j], sig = sigmoid_by_exp(a[j]);
            da[j] = d * b[j] * sig * (1.0f + a[j] * (1.0f - sig));
            db[j] = d * a[j] * sig;
        }
    }
}

#ifdef __CUDACC__
// one thread per pack of X128 columns of one row of out (a row's last pack may be short); the
// packs of a and b are whole and aligned when F is a multiple of 8 and the buffers are aligned
// this thread's pack: row *n, columns [*j, *j + *count) of F; 0 past the last row
__device__ static inline int swiglu_pack(int N, int F, size_t* n, int* j, int* count) {
    int packs = CEIL_DIV(F, X128);
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * packs) return 0;
    *n = idx / packs;
    *j = (int)(idx % packs) * X128;
    *count = min_int(X128, F - *j);
    return 1;
}

__global__ void swiglu_forward_kernel(floatX* out, const floatX* inp, int N, int F) {
    size_t n;
    int j, count;
    if (!swiglu_pack(N, F, &n, &j, &count)) return;
    const floatX* a = inp + n * 2 * F + j;
    x128 pa = load_pack(a, count), pb = load_pack(a + F, count), po;
    for (int k = 0; k < X128; k++) {
        float x = floatX_to_float(pa.e[k]);
        po.e[k] = to_floatX(x / (1.0f + expf(-x)) * floatX_to_float(pb.e[k]));
    }
    store_pack(out + n * F + j, po, count);
}

__global__ void swiglu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, int N, int F) {
    size_t n;
    int j, count;
    if (!swiglu_pack(N, F, &n, &j, &count)) return;
    const floatX* a = inp + n * 2 * F + j;
    x128 pa = load_pack(a, count), pb = load_pack(a + F, count), pd = load_pack(dout + n * F + j, count), pda, pdb;
    for (int k = 0; k < X128; k++) {
        float x = floatX_to_float(pa.e[k]), d = floatX_to_float(pd.e[k]);
        float sig = 1.0f / (1.0f + expf(-x));
        pda.e[k] = to_floatX(d * floatX_to_float(pb.e[k]) * sig * (1.0f + x * (1.0f - sig)));
        pdb.e[k] = to_floatX(d * x * sig);
    }
    store_pack(dinp + n * 2 * F + j, pda, count);
    store_pack(dinp + n * 2 * F + F + j, pdb, count);
}

static void swiglu_forward(floatX* out, const floatX* inp, int N, int F) {
    LAUNCH(swiglu_forward_kernel, CEIL_DIV((size_t)N * CEIL_DIV(F, X128), ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0,
           out, inp, N, F);
}

static void swiglu_backward(floatX* dinp, const floatX* inp, const floatX* dout, int N, int F) {
    LAUNCH(swiglu_backward_kernel, CEIL_DIV((size_t)N * CEIL_DIV(F, X128), ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0,
           dinp, inp, dout, N, F);
}
#else
#define swiglu_forward swiglu_forward_cpu
#define swiglu_backward swiglu_backward_cpu
#endif

// ----------------------------------------------------------------------------
// cross-entropy fused with the softmax, vocab-parallel (Megatron, Shoeybi et al. 2019 §3)
// Each rank holds the logits of V columns, of which the first `valid` are real vocabulary
// (the rest is padding: masked out of the softmax, zero gradient). A row's loss needs the
// maximum, the sum of exponentials and the target's logit over the whole vocabulary. Each
// rank finds its own maximum and the sum of exp relative to it in one pass, the online
// softmax normalizer (Milakov & Gimelshein 2018): when a larger value m' turns up, the sum so
// far is rescaled by exp(m - m'). Between the ranks:
//   online_stats -> all-reduce(max) -> rescale_sums (to the global max) -> all-reduce(sum)
//   -> forward: the loss, and in the same pass dlogits when a backward follows.
// The gradient, dloss (softmax - onehot), is known as soon as the maximum and the sum are, so
// the forward writes it over the logits (llm.c's fused classifier): the backward finds it
// there instead of reading the logits once more. dloss is the weight of each token's loss in
// the step's loss (1 / the step's tokens, times fp16's loss scale); 0 means that no backward
// follows (evaluation, generation: they may read the logits afterwards), and the logits stay.
// With the whole vocabulary on one rank (no tensor parallelism) nothing is waited for between
// the statistics and the loss: crossentropy_forward_fused does all of it, a row at a time.

// row_max[n] = local_max[n] = the maximum over this rank's valid columns (row_max is then
// all-reduced to the global maximum; local_max stays, for rescale_sums);
// sums[n] = sum over this rank's valid columns of exp(logit - local_max[n]);
// sums[N + n] = the target's logit if this rank holds the target's column, else 0
static void crossentropy_online_stats_cpu(float* row_max, float* local_max, float* sums, const float* logits,
                                          const int* targets, int N, int V, int valid, int vocab_start) {
    // A row stays in the CPU's cache, so this takes two passes, the maximum and then the sum
    // relative to it: the same pair as the GPU's online update (online_softmax_add_pack), whose
    // running maximum would keep the loop off the vector lanes.
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* l = logits + (size_t)n * V;
        float m = -INFINITY, s = 0.0f;
        #pragma omp simd reduction(max : m)
        for (int v = 0; v < valid; v++) m = l[v] > m ? l[v] : m;
        #pragma omp simd reduction(+ : s)
        for (int v = 0; v < valid; v++) s += exp_poly(l[v] - m);
        int local = targets[n] - vocab_start;
        row_max[n] = local_max[n] = m;
        sums[n] = s;
        sums[N + n] = (local >= 0 && local < valid) ? l[local] : 0.0f;
    }
}

// sums[n] *= exp(local_max[n] - row_max[n]): this rank's sum relative to the global maximum
// (a rank without valid columns has sum 0 and local max -inf: it stays 0)
HOST_DEVICE static inline float rescaled_sum(float sum, float local_max, float row_max) {
    return sum > 0.0f ? sum * expf(local_max - row_max) : 0.0f;
}

static void crossentropy_rescale_sums_cpu(float* sums, const float* local_max, const float* row_max, int N) {
    for (int n = 0; n < N; n++) sums[n] = rescaled_sum(sums[n], local_max[n], row_max[n]);
}

// dlogits = dloss * (softmax - onehot(target)), written over the logits
static void crossentropy_backward_cpu(float* logits, const float* row_max, const float* sums,
                                      const int* targets, float dloss, int N, int V, int valid, int vocab_start) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float* l = logits + (size_t)n * V;
        int local = targets[n] - vocab_start;
        float m = row_max[n], inv_sum = 1.0f / sums[n];
        for (int v = 0; v < V; v++) {
            float p = v < valid ? exp_poly(l[v] - m) * inv_sum : 0.0f;
            l[v] = (p - (v == local ? 1.0f : 0.0f)) * dloss;
        }
    }
}

// loss = log(sum exp(l - max)) + max - l[target]; then, when a backward follows (dloss != 0),
// dlogits over the logits (crossentropy_backward_cpu)
static void crossentropy_forward_cpu(float* losses, float* logits, const float* row_max, const float* sums,
                                     const int* targets, float dloss, int N, int V, int valid, int vocab_start) {
    for (int n = 0; n < N; n++) losses[n] = logf(sums[n]) + row_max[n] - sums[N + n];
    if (dloss != 0.0f) crossentropy_backward_cpu(logits, row_max, sums, targets, dloss, N, V, valid, vocab_start);
}

// the whole vocabulary on this rank (vocab_start 0, no all-reduce between): the statistics,
// then the forward; row_max and sums are filled as by the two
static void crossentropy_forward_fused_cpu(float* losses, float* logits, float* row_max, float* sums,
                                           const int* targets, float dloss, int N, int V, int valid) {
    crossentropy_online_stats_cpu(row_max, row_max, sums, logits, targets, N, V, valid, 0);
    crossentropy_forward_cpu(losses, logits, row_max, sums, targets, dloss, N, V, valid, 0);
}

#ifdef __CUDACC__
// cross-entropy, vocab-parallel (see crossentropy_online_stats_cpu): one warp per row for the
// statistics, one thread per row to rescale, one block per row for the loss and the gradient

// exp(logit - offset / log2 e) as 2^(logit log2 e - offset): one fused multiply-add and the
// GPU's native exponential (offset is in log2 units)
__device__ inline float exp_shifted(float logit, float offset) { return exp2f(fmaf(logit, LOG2E, -offset)); }

// The online (max, sum) of softmax over one more pack of `count` logits: the pack's maximum
// first, so that the running sum is rescaled at most once a pack and each logit costs one
// exponential (a logit at a time, as before issue 39, costs two where the maximum moves, and
// each exponential waits on its compare: the cross-entropy was bound by issuing instructions,
// 267 a pack in its two loops, not by its bytes; tests/recost.py). exp(x) as 2^(x log2 e).
__device__ inline void online_softmax_add_pack(float* max, float* sum, const x128& pack, int count) {
    float pack_max = -INFINITY;
    UNROLL
    for (int k = 0; k < X128; k++)
        if (k < count) pack_max = fmaxf(pack_max, floatX_to_float(pack.e[k]));
    if (pack_max > *max) {
        *sum *= exp2f((*max - pack_max) * LOG2E);   // *max = -inf at first: 2^-inf = 0
        *max = pack_max;
    }
    float max_log2 = *max * LOG2E;
    UNROLL
    for (int k = 0; k < X128; k++)
        if (k < count) *sum += exp_shifted(floatX_to_float(pack.e[k]), max_log2);
}

// a thread's online (max, sum) over the packs of row l at v0, v0 + stride, ... below `valid`.
// In a 16-byte aligned row (a vocabulary a multiple of 8) every whole pack is aligned: those
// take one 128-bit load each, the test made once a row (load_pack's test on each pack lets nvcc
// issue its 8 element loads beside the 128-bit one); then the rest, pack by pack
__device__ inline void online_softmax_row(float* max, float* sum, const floatX* l, int v0, int stride, int valid) {
    int v = v0;
    if (aligned_128(l))
        for (; v + X128 <= valid; v += stride) online_softmax_add_pack(max, sum, load128(l + v), X128);
    for (; v < valid; v += stride) {
        int count = pack_count(v, valid);
        online_softmax_add_pack(max, sum, load_pack(l + v, count), count);
    }
}

// Each lane keeps its own online (max, sum) over the packs lane, lane + 32, ...; the warp
// then takes the maximum of the lanes' maxima and adds the lanes' sums rescaled to it.
__global__ void crossentropy_online_stats_kernel(float* row_max, float* local_max, float* sums, const floatX* logits,
                                                 const int* targets, int N, int V, int valid, int vocab_start) {
    int lane = threadIdx.x % 32, n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    const floatX* l = logits + (size_t)n * V;
    float m = -INFINITY, s = 0.0f;
    online_softmax_row(&m, &s, l, lane * X128, 32 * X128, valid);
    float row_m = warp_reduce_max(m);
    s = warp_reduce_sum(rescaled_sum(s, m, row_m));
    if (lane == 0) {
        int local = targets[n] - vocab_start;
        row_max[n] = local_max[n] = row_m;
        sums[n] = s;
        sums[N + n] = (local >= 0 && local < valid) ? floatX_to_float(l[local]) : 0.0f;
    }
}

__global__ void crossentropy_rescale_sums_kernel(float* sums, const float* local_max, const float* row_max, int N) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N) sums[n] = rescaled_sum(sums[n], local_max[n], row_max[n]);
}

// The rows' kernels below take one block of CROSSENTROPY_BLOCK threads per row, each thread
// packs of the row. 1024 threads: 2 blocks on an SM, so the rows being worked on at any time
// (2 x 132 on an H100, 100 KB each for GPT-2's 50,304 columns in bf16, about 26 MB) stay in
// the 50 MB L2 cache between the fused kernel's two passes over a row (llm.c's choice too).
#define CROSSENTROPY_BLOCK 1024

// a row's block: a thread per 16-byte pack of the row, in whole warps, up to CROSSENTROPY_BLOCK
// (GPT-2's 50,304 columns take all 1024; a vocabulary of 257 takes 64, not 1024 threads of
// which 991 would find no pack)
static int crossentropy_block(int V) {
    int threads = CEIL_DIV(CEIL_DIV(V, X128), 32) * 32;
    return threads < CROSSENTROPY_BLOCK ? threads : CROSSENTROPY_BLOCK;
}

// the block's row l[0 .. V) becomes its gradient, dloss * (softmax - onehot(local_target)):
// p = exp(l - row_max) / sum on the valid columns, 0 on the padding. p = 2^(l log2 e - offset),
// the division folded into the exponent: a fused multiply-add and an exponential a logit.
// The whole packs of an aligned row (see online_softmax_row) in one loop of 128-bit loads and
// stores, then the rest pack by pack; the target's one-hot last, by the thread that wrote its
// pack, from its logit (the row holds its gradient by then): the same p, the same rounding.
__device__ void crossentropy_row_backward(floatX* l, float row_max, float sum, int local_target, float target_logit,
                                          float dloss, int V, int valid) {
    float offset = (row_max + logf(sum)) * LOG2E;
    int v = threadIdx.x * X128, stride = blockDim.x * X128;
    if (aligned_128(l))
        for (; v + X128 <= valid; v += stride) {
            x128 pl = load128(l + v), pg;
            UNROLL
            for (int k = 0; k < X128; k++) pg.e[k] = to_floatX(exp_shifted(floatX_to_float(pl.e[k]), offset) * dloss);
            store128(l + v, pg);
        }
    for (; v < V; v += stride) {
        int count = pack_count(v, V);
        x128 pl = load_pack(l + v, count), pg;
        for (int k = 0; k < X128; k++)
            pg.e[k] = to_floatX(v + k < valid ? exp_shifted(floatX_to_float(pl.e[k]), offset) * dloss : 0.0f);
        store_pack(l + v, pg, count);
    }
    if (local_target >= 0 && local_target < V && local_target / X128 % blockDim.x == threadIdx.x) {
        float p = local_target < valid ? exp_shifted(target_logit, offset) : 0.0f;
        l[local_target] = to_floatX((p - 1.0f) * dloss);
    }
}

// row n = blockIdx.x: the loss from the all-reduced statistics; dlogits over its logits if dloss != 0
__global__ void crossentropy_forward_kernel(float* losses, floatX* logits, const float* row_max, const float* sums,
                                            const int* targets, float dloss, int N, int V, int valid, int vocab_start) {
    int n = blockIdx.x;
    if (threadIdx.x == 0) losses[n] = logf(sums[n]) + row_max[n] - sums[N + n];
    if (dloss != 0.0f)
        crossentropy_row_backward(logits + (size_t)n * V, row_max[n], sums[n], targets[n] - vocab_start, sums[N + n],
                                  dloss, V, valid);
}

// row n = blockIdx.x, the whole vocabulary: its maximum and sum (each thread online over its
// packs, then the block's), the loss, then dlogits over the row if dloss != 0. The row is read
// twice, the second time from the cache (see CROSSENTROPY_BLOCK).
__global__ void crossentropy_forward_fused_kernel(float* losses, floatX* logits, float* row_max, float* sums,
                                                  const int* targets, float dloss, int N, int V, int valid) {
    int n = blockIdx.x, target = targets[n];
    floatX* l = logits + (size_t)n * V;
    float m = -INFINITY, s = 0.0f;
    online_softmax_row(&m, &s, l, threadIdx.x * X128, blockDim.x * X128, valid);
    float block_m = block_reduce_max(m);
    float sum = block_reduce_sum(rescaled_sum(s, m, block_m));
    float target_logit = target >= 0 && target < valid ? floatX_to_float(l[target]) : 0.0f;   // every thread's
    if (threadIdx.x == 0) {
        losses[n] = logf(sum) + block_m - target_logit;
        row_max[n] = block_m;
        sums[n] = sum;
        sums[N + n] = target_logit;
    }
    __syncthreads();   // the target's logit is read before any thread writes the gradient over it
    if (dloss != 0.0f) crossentropy_row_backward(l, block_m, sum, target, target_logit, dloss, V, valid);
}

static void crossentropy_online_stats(float* row_max, float* local_max, float* sums, const floatX* logits,
                                      const int* targets, int N, int V, int valid, int vocab_start) {
    LAUNCH(crossentropy_online_stats_kernel, CEIL_DIV(N, ROWS_PER_BLOCK), ROW_BLOCK, 0,
           row_max, local_max, sums, logits, targets, N, V, valid, vocab_start);
}

static void crossentropy_rescale_sums(float* sums, const float* local_max, const float* row_max, int N) {
    LAUNCH(crossentropy_rescale_sums_kernel, CEIL_DIV(N, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0,
           sums, local_max, row_max, N);
}

static void crossentropy_forward(float* losses, floatX* logits, const float* row_max, const float* sums,
                                 const int* targets, float dloss, int N, int V, int valid, int vocab_start) {
    LAUNCH(crossentropy_forward_kernel, N, crossentropy_block(V), 0,
           losses, logits, row_max, sums, targets, dloss, N, V, valid, vocab_start);
}

static void crossentropy_forward_fused(float* losses, floatX* logits, float* row_max, float* sums,
                                       const int* targets, float dloss, int N, int V, int valid) {
    LAUNCH(crossentropy_forward_fused_kernel, N, crossentropy_block(V), 0,
           losses, logits, row_max, sums, targets, dloss, N, V, valid);
}
#else
#define crossentropy_online_stats crossentropy_online_stats_cpu
#define crossentropy_rescale_sums crossentropy_rescale_sums_cpu
#define crossentropy_forward crossentropy_forward_cpu
#define crossentropy_forward_fused crossentropy_forward_fused_cpu
#endif

// ----------------------------------------------------------------------------
// AdamW (Loshchilov & Hutter 2019), as torch.optim.AdamW and Megatron apply it:
//   g = grad * grad_scale                (grad_scale carries gradient clipping)
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = p - lr * ( (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * p )
// master is the fp32 copy that is updated; param gets the new value in floatX (on the CPU
// build they are the same buffer).

// the constants of one step; bias corrections in double, as PyTorch (1 - 0.999^t loses
// digits in float)
typedef struct {
    float lr, beta1, beta2, eps, weight_decay, grad_scale, bias_correction1, bias_correction2;
} AdamWStep;

static AdamWStep adamw_step(float lr, float beta1, float beta2, float eps, float weight_decay,
                            float grad_scale, int step) {
    AdamWStep s = {lr, beta1, beta2, eps, weight_decay, grad_scale,
                   (float)(1.0 - pow(beta1, step)), (float)(1.0 - pow(beta2, step))};
    return s;
}

// one element, the same on both builds: updates m and v, returns the new master value
HOST_DEVICE static inline float adamw_element(float master, float grad, float* m, float* v, AdamWStep s) {
    float g = grad * s.grad_scale;
    float mi = s.beta1 * *m + (1.0f - s.beta1) * g;
    float vi = s.beta2 * *v + (1.0f - s.beta2) * g * g;
    *m = mi;
    *v = vi;
    float update = (mi / s.bias_correction1) / (sqrtf(vi / s.bias_correction2) + s.eps);
    return master - s.lr * (update + s.weight_decay * master);
}

static void adamw_update_cpu(float* master, float* param, const float* grad, float* m, float* v,
                             size_t n, float lr, float beta1, float beta2, float eps,
                             float weight_decay, float grad_scale, int step) {
    AdamWStep s = adamw_step(lr, beta1, beta2, eps, weight_decay, grad_scale, step);
    #pragma omp parallel for firstprivate(s)   // a private copy: its fields stay in registers
    for (size_t i = 0; i < n; i++) {
        float p = adamw_element(master[i], grad[i], &m[i], &v[i], s);
        master[i] = p;
        param[i] = p;
    }
}

// A rank's ZeRO shard holds parts of many tensors, each with its own weight decay and each
// counted in the gradient norm or not. One ShardRange per part: [start, end) relative to the
// shard, in increasing order; elements in no range (the padding) are left alone. The GPU
// build updates the whole shard in one launch (and the norm in two) instead of one per tensor
// (about 450 launches a step for GPT-2 124M); the CPU build walks the ranges in order, the
// same calls as one per tensor, so its bits do not change.
// The kernels take the ranges cut into pieces of at most SHARD_PIECE elements (shard_pieces,
// once, on the host): a block works inside one piece, so it knows its range, and no thread
// searches the table for the range its element is in.
typedef struct {
    size_t start, end;
    int decay, in_norm;   // AdamW's weight decay applies; the part counts in the gradient norm
} ShardRange;

// the ranges as the kernels of build b walk them: each cut into pieces of at most SHARD_PIECE
// elements on the GPU build (the last piece of a range shorter), whole on the CPU build
static size_t shard_piece_size(BuildTarget b) { return b.gpu ? SHARD_PIECE : SIZE_MAX; }

// The `count` ranges cut into pieces of at most `piece` elements, in order, into `pieces`;
// returns how many. Room enough: shard_pieces_max.
static int shard_pieces(const ShardRange* ranges, int count, size_t piece, ShardRange* pieces) {
    int k = 0;
    for (int r = 0; r < count; r++)
        for (size_t a = ranges[r].start; a < ranges[r].end; a = pieces[k++].end) {
            pieces[k] = ranges[r];
            pieces[k].start = a;
            pieces[k].end = ranges[r].end - a > piece ? a + piece : ranges[r].end;
        }
    return k;
}

// The most pieces up to `count` ranges inside a shard of n elements can become: a range of L
// elements becomes at most floor(L / piece) + 1 pieces, and the lengths add up to at most n
static size_t shard_pieces_max(BuildTarget b, int count, size_t n) {
    return (size_t)count + (b.gpu ? n / SHARD_PIECE : 0);
}

static void adamw_update_ranges_cpu(float* master, float* param, const float* grad, float* m, float* v, size_t n,
                                    const ShardRange* ranges, int count, float lr, float beta1, float beta2, float eps,
                                    float weight_decay, float grad_scale, int step) {
    (void)n;
    for (int r = 0; r < count; r++) {
        size_t a = ranges[r].start, len = ranges[r].end - ranges[r].start;
        adamw_update_cpu(master + a, param + a, grad + a, m + a, v + a, len, lr, beta1, beta2, eps,
                         ranges[r].decay ? weight_decay : 0.0f, grad_scale, step);
    }
}

// *acc += the mean of a micro-batch's N token losses. The training schedule adds each
// micro-batch's on the device and reads the sum once a step (a host copy and a wait per
// micro-batch before). In double, in token order on the CPU build.
static void loss_mean_add_cpu(double* acc, const float* losses, int N) {
    double sum = 0.0;
    for (int n = 0; n < N; n++) sum += losses[n];
    *acc += sum / N;
}

#ifdef __CUDACC__
// one block: strided sums reduced in a fixed order (the same bits every run)
__global__ void loss_mean_add_kernel(double* acc, const float* losses, int N) {
    double s = 0.0;
    for (int n = threadIdx.x; n < N; n += blockDim.x) s += losses[n];
    s = block_reduce_sum_double(s);
    if (threadIdx.x == 0) *acc += s / N;
}

static void loss_mean_add(double* acc, const float* losses, int N) {
    LAUNCH(loss_mean_add_kernel, 1, SUM_SQUARES_BLOCK, 0, acc, losses, N);
}
#else
#define loss_mean_add loss_mean_add_cpu
#endif

#ifdef __CUDACC__
// block b updates piece b of the shard (see shard_pieces), its threads striding through it
__global__ void adamw_ranges_kernel(float* master, floatX* param, const float* grad, float* m, float* v,
                                    const ShardRange* pieces, AdamWStep s, float weight_decay) {
    ShardRange p = pieces[blockIdx.x];
    s.weight_decay = p.decay ? weight_decay : 0.0f;
    for (size_t i = p.start + threadIdx.x; i < p.end; i += blockDim.x) {
        float x = adamw_element(master[i], grad[i], &m[i], &v[i], s);
        master[i] = x;
        param[i] = to_floatX(x);
    }
}

// AdamW over a shard of n elements (master, param, grad, m, v all start at the shard's
// start), the `count` pieces of its ranges in `pieces` (shard_pieces; the CPU build: the ranges)
static void adamw_update_ranges(float* master, floatX* param, const float* grad, float* m, float* v, size_t n,
                                const ShardRange* pieces, int count, float lr, float beta1, float beta2, float eps,
                                float weight_decay, float grad_scale, int step) {
    (void)n;
    AdamWStep s = adamw_step(lr, beta1, beta2, eps, weight_decay, grad_scale, step);
    LAUNCH(adamw_ranges_kernel, count, ELEMENTWISE_BLOCK, 0, master, param, grad, m, v, pieces, s, weight_decay);
}
#else
#define adamw_update_ranges adamw_update_ranges_cpu
#endif

// ----------------------------------------------------------------------------
// sum of squares, for the global gradient norm: *acc += sum x[i]^2, in double, in fixed
// chunks added in order (so the result does not depend on the number of threads)

#define SUM_CHUNK 4096  // elements per chunk, whatever the thread count

static void sum_squares_cpu(double* acc, const float* x, size_t n) {
    size_t chunks = CEIL_DIV(n, (size_t)SUM_CHUNK);
    double* partial = (double*)mallocCheck(chunks * sizeof(double));
    #pragma omp parallel for
    for (size_t k = 0; k < chunks; k++) {
        size_t i0 = k * SUM_CHUNK, i1 = (k + 1) * SUM_CHUNK < n ? (k + 1) * SUM_CHUNK : n;
        // 16 running sums (element i goes to sum i % 16), added in order at the end: the
        // same result every time, and the adds no longer wait on each other. Taken 16 at a
        // time, so that the 16 sums are the lanes of vector registers.
        double s[16] = {0};
        size_t i = i0;
        for (; i + 16 <= i1; i += 16)
            for (int j = 0; j < 16; j++) s[j] += (double)x[i + j] * x[i + j];
        for (; i < i1; i++) s[(i - i0) % 16] += (double)x[i] * x[i];   // the chunk's tail
        double total = 0.0;
        for (int j = 0; j < 16; j++) total += s[j];
        partial[k] = total;
    }
    double total = 0.0;
    for (size_t k = 0; k < chunks; k++) total += partial[k];
    free(partial);
    *acc += total;
}

// the CPU build's norm over a shard: the ranges counted in it, in order
static void sum_squares_ranges_cpu(double* acc, const float* x, size_t n, const ShardRange* ranges, int count) {
    (void)n;
    for (int r = 0; r < count; r++)
        if (ranges[r].in_norm) sum_squares_cpu(acc, x + ranges[r].start, ranges[r].end - ranges[r].start);
}

#ifdef __CUDACC__
// one block: *acc += partials[0] + ... + partials[count - 1]
__global__ void sum_squares_final_kernel(double* acc, const double* partials, int count) {
    double s = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
    s = block_reduce_sum_double(s);
    if (threadIdx.x == 0) *acc += s;
}

// block b sums the squares of pieces b, b + gridDim, b + 2 gridDim, ... that count in the norm
// (the pieces of shard_pieces) into partials[b]
__global__ void sum_squares_ranges_partial_kernel(double* partials, const float* x, const ShardRange* pieces, int count) {
    double s = 0.0;
    for (int k = blockIdx.x; k < count; k += gridDim.x) {
        ShardRange p = pieces[k];
        if (!p.in_norm) continue;   // the same for the whole block
        for (size_t i = p.start + threadIdx.x; i < p.end; i += blockDim.x) s += (double)x[i] * x[i];
    }
    s = block_reduce_sum_double(s);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// *acc += the squares of the shard's elements counted in the norm, in two launches; the grid
// is a function of the table alone, so the result does not change from run to run
static void sum_squares_ranges(double* acc, const float* x, size_t n, const ShardRange* pieces, int count) {
    (void)n;
    int blocks = count < SUM_SQUARES_MAX_BLOCKS ? count : SUM_SQUARES_MAX_BLOCKS;
    if (blocks == 0) return;
    LAUNCH(sum_squares_ranges_partial_kernel, blocks, SUM_SQUARES_BLOCK, 0, sum_squares_partials, x, pieces, count);
    LAUNCH(sum_squares_final_kernel, 1, SUM_SQUARES_BLOCK, 0, acc, sum_squares_partials, blocks);
}
#else
#define sum_squares_ranges sum_squares_ranges_cpu
#endif

#pragma GCC diagnostic pop
