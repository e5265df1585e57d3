/*
kernels/common.cuh — the CUDA build's shared pieces, under every kernel: the launch macro
(LAUNCH), the block sizes, the cuBLAS and cuBLASLt handles and kernels_init; the reduction
helpers, the only code that touches warp shuffles and shared memory (warp and block sums and
maxima, the warp's arg-max, the norms' table of column partials, block_is_last); the 128-bit
packs (x128, load_pack, store_pack). All of it under `#ifdef __CUDACC__`: the CPU build has none of it.

Included by kernels.cuh, the index of kernels/: the conventions every kernel keeps are there.
*/
#pragma once

// ----------------------------------------------------------------------------
// the CUDA build's shared pieces: the launch macro, block sizes, the cuBLAS handle

#ifdef __CUDACC__
// The one place a kernel is launched (a test build may define its own LAUNCH first). Grids
// are 1-D (`blocks` of them); a launch over nothing (0 blocks, e.g. an empty tensor) is
// skipped, not an error.
// Every kernel runs on the compute stream (device.cuh: the default stream 0 but while a CUDA
// graph is captured), as cuBLAS does; NCCL too, but for the collectives queued on the
// communication stream (comm_stream, above).
#ifndef LAUNCH
#define LAUNCH(kernel, blocks, block, shmem, ...)                             \
    do {                                                                      \
        unsigned int launch_grid_ = (unsigned int)(blocks);                   \
        if (launch_grid_ > 0) {                                               \
            kernel<<<launch_grid_, (block), (shmem), compute_stream>>>(__VA_ARGS__); \
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
static float* decode_partials;        // the split decode's parts (kernels/attention.cuh), at its first call
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

// CUDA graphs of the compute stream's work (generation's decode step: generate.h), by stream
// capture. From compute_graph_begin, the compute stream is the graph's own stream (a capture
// cannot be made on the legacy stream 0), cuBLAS's too, and what is queued on it is recorded with
// its arguments, not run; compute_graph_end ends the capture, puts the capture into the graph's
// executable form and launches that on stream 0, where it runs in order with the plain launches
// around it. The first capture is instantiated (cudaGraphInstantiate); each later one updates the
// executable graph in place (cudaGraphExecUpdate: the same kernels with other arguments, as
// llama.cpp's decode does a token), or is instantiated anew where CUDA refuses the update (a
// kernel more or fewer, e.g. when the split decode's merge appears). Between the two calls
// nothing may wait for the device (a copy from pageable host memory, a synchronize, an
// allocation): CUDA refuses those inside a capture.
typedef struct {
    cudaStream_t stream;    // the capture's stream, created at the first capture
    cudaGraphExec_t exec;   // the executable graph, launched at the end of each capture
    long launches, instantiated;   // graphs launched; of them, instantiated anew (the rest updated)
} ComputeGraph;

static void compute_graph_begin(ComputeGraph* g) {
    if (!g->stream) cudaCheck(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    cudaCheck(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal));
    compute_stream = g->stream;
    cublasCheck(cublasSetStream(cublas_handle, compute_stream));
}

static void compute_graph_end(ComputeGraph* g) {
    cudaGraph_t graph = NULL;
    cudaCheck(cudaStreamEndCapture(g->stream, &graph));
    compute_stream = 0;
    cublasCheck(cublasSetStream(cublas_handle, 0));
    cudaGraphExecUpdateResultInfo result;
    if (!g->exec || cudaGraphExecUpdate(g->exec, graph, &result) != cudaSuccess) {
        (void)cudaGetLastError();   // a refused update's error, not sticky: cleared before the next check reads it
        if (g->exec) cudaCheck(cudaGraphExecDestroy(g->exec));
        cudaCheck(cudaGraphInstantiate(&g->exec, graph, 0));
        g->instantiated++;
    }
    cudaCheck(cudaGraphDestroy(graph));
    cudaCheck(cudaGraphLaunch(g->exec, 0));
    g->launches++;
}

static void compute_graph_free(ComputeGraph* g) {
    if (g->exec) cudaCheck(cudaGraphExecDestroy(g->exec));
    if (g->stream) cudaCheck(cudaStreamDestroy(g->stream));
    g->exec = NULL, g->stream = NULL;
}

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

// The warp's first (value, index) pair: the largest value, ties to the lower index (the MoE
// router's top-k order). Every lane ends with the same pair: the order is total (for values
// that are not NaN), so the butterfly's pairings do not matter.
__device__ void warp_reduce_argmax(float* value, int* index) {
    for (int offset = 16; offset > 0; offset /= 2) {
        float v = __shfl_xor_sync(0xffffffffu, *value, offset);
        int i = __shfl_xor_sync(0xffffffffu, *index, offset);
        if (v > *value || (v == *value && i < *index)) *value = v, *index = i;
    }
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
