/*
device.cuh — the device runtime both builds share, under the kernels: the checks that end the
job (mallocCheck, cudaCheck, cublasCheck), the precision (floatX and its conversions, one
block per precision), device memory (dev_malloc and its count, the host-device copies,
pinned host buffers), the streams and events of the overlapped communication, and
BuildTarget (the build a memory plan is for). On the CPU build "device" memory is host
memory and the streams are no-ops.

Interface: fail (a pointer, set by parallel.h), mallocCheck / callocCheck / reallocCheck,
cudaCheck / cublasCheck, floatX / to_floatX / floatX_to_float, dev_malloc / dev_free /
dev_bytes_allocated, host_to_dev / dev_to_host (and the async and pinned forms), the stream
and event helpers, BuildTarget / this_build, GPU_BUILD, CEIL_DIV.
*/
#pragma once
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#else   // compiled without OpenMP (tests/recost.py's SASS): one thread
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_max_threads(void) { return 1; }
static inline void omp_set_num_threads(int threads) { (void)threads; }
#endif
#ifdef __CUDACC__
#include <cuda_runtime.h>
#ifdef GRIDGPT_FP16
#include <cuda_fp16.h>
#else
#include <cuda_bf16.h>
#endif
#include <cublas_v2.h>
#include <cublasLt.h>
#endif

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

// Laying out a scratch of regions in one buffer: the next region of `bytes` at *at, 256-byte
// aligned; a NULL base only counts (the same walk sizes the buffer, then hands out its pointers:
// context parallelism's and a MoE layer's scratch)
static inline void* region_take(char* base, size_t* at, size_t bytes) {
    void* p = base ? base + *at : NULL;
    *at += CEIL_DIV(bytes, (size_t)256) * 256;
    return p;
}

// ----------------------------------------------------------------------------
// checking helpers: print file:line and the library's own message, then end the job

// How a failed check ends the program: alone (tests/test_kernels.c) one error line and exit
// status 1; in the trainer parallel.h hands over its fail(), which names the rank, host and
// grid and ends the whole job, when the grid starts. (Nothing here calls up the include line.)
static void fail_alone(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}
static void (*fail)(const char* fmt, ...) = fail_alone;

static void malloc_check_failed(size_t bytes, const char* file, int line) {
    fail("out of host memory allocating %zu bytes at %s:%d", bytes, file, line);
}
static void* malloc_check_(size_t bytes, const char* file, int line) {
    void* p = malloc(bytes ? bytes : 1);
    if (p == NULL) malloc_check_failed(bytes, file, line);
    return p;
}
static void* calloc_check_(size_t count, size_t size, const char* file, int line) {
    void* p = calloc(count ? count : 1, size ? size : 1);
    if (p == NULL) malloc_check_failed(count * size, file, line);
    return p;
}
static inline void* realloc_check_(void* p, size_t bytes, const char* file, int line) {
    void* q = realloc(p, bytes ? bytes : 1);
    if (q == NULL) malloc_check_failed(bytes, file, line);
    return q;
}
#define mallocCheck(bytes) malloc_check_((bytes), __FILE__, __LINE__)
#define callocCheck(count, size) calloc_check_((count), (size), __FILE__, __LINE__)
#define reallocCheck(p, bytes) realloc_check_((p), (bytes), __FILE__, __LINE__)

#ifdef __CUDACC__
static void cuda_check_(cudaError_t err, const char* file, int line) {
    if (err == cudaSuccess) return;
    fail("CUDA error at %s:%d: %s", file, line, cudaGetErrorString(err));
}
#define cudaCheck(call) cuda_check_((call), __FILE__, __LINE__)

static void cublas_check_(cublasStatus_t status, const char* file, int line) {
    if (status == CUBLAS_STATUS_SUCCESS) return;
    fail("cuBLAS error at %s:%d: status %d, %s", file, line, (int)status, cublasGetStatusString(status));
}
#define cublasCheck(call) cublas_check_((call), __FILE__, __LINE__)
#endif

// ----------------------------------------------------------------------------
// precision and device memory
// `floatX` is what activations and parameters are stored in. The dev_* functions are the
// only place that knows whether "device memory" is GPU memory or plain host memory.
// HOST_DEVICE marks the few functions both the CPU loops and the CUDA kernels call.

// The GPU build's kernels keep workspaces of their own, outside the model, handed out once by
// kernels_init: the partial sums of sum_squares (the gradient norm), cuBLASLt's workspace and
// the column sums' counters.
// Their size is known to both builds, so that either one can plan the GPU build's memory
// (train.c's --dry-run-build).
#define SUM_SQUARES_MAX_BLOCKS 1024  // partial sums of sum_squares, combined in order
// The GPU build's column reductions (bias and LayerNorm gradients) cut the rows into chunks
// by these rules, which both builds know: their workspace, in the model's arena, is planned
// by either (bias_grad_partials, layernorm_grad_partials)
#define COLUMN_BLOCK 256            // threads of a column reduction's block, one per column
#define COLUMN_CHUNK_ROWS 32        // rows of a LayerNorm chunk; the fewest rows of a bias chunk
#define COLUMN_REDUCE_BLOCKS 1024   // about how many blocks a bias sum launches: several per SM
#define COLUMN_ADD_BLOCK 1024       // column_partials_add's block, 32 warps: 32 columns a block, the chunks in 32 runs
#define SUM_SQUARES_PARTIALS_BYTES (SUM_SQUARES_MAX_BLOCKS * sizeof(double))
// The GPU build's optimizer walks the ZeRO shard in pieces of at most this many elements, one
// tensor's part each, from a table made once (kernels/optimizer.cuh's shard_pieces; planned by either build)
#define SHARD_PIECE 4096
// 32 MiB: what cuBLAS itself sets aside on Hopper (llm.c's choice too); some algorithms
// (split-K) need one, and the heuristic only offers those that fit
#define CUBLASLT_WORKSPACE_BYTES ((size_t)32 << 20)
// a bias sum's last block per column tile is the one the tile's counter finds (kernels/common.cuh's
// block_is_last): one counter per tile of COLUMN_BLOCK columns, for sums up to 262,144 wide
#define COLUMN_COUNTERS 1024
#define COLUMN_COUNTERS_BYTES (COLUMN_COUNTERS * sizeof(unsigned int))
#define GPU_KERNELS_WORKSPACE_BYTES (SUM_SQUARES_PARTIALS_BYTES + CUBLASLT_WORKSPACE_BYTES + COLUMN_COUNTERS_BYTES)

#ifndef __CUDACC__
typedef float floatX;
#define FLOATX_NAME "fp32"
#define PRECISION_NAME "fp32"
#define BUILD_NAME "CPU"
#define GPU_BUILD 0
#define HOST_DEVICE

// every device byte handed out, never decreased: the memory table checks the plan against it
static size_t dev_bytes_allocated = 0;
static void* dev_malloc(size_t bytes) {
    dev_bytes_allocated += bytes;
    return mallocCheck(bytes);
}
static void dev_free(void* p) { free(p); }
static void dev_zero(void* p, size_t bytes) { memset(p, 0, bytes); }
static void dev_to_host(void* host_dst, const void* dev_src, size_t bytes) { memcpy(host_dst, dev_src, bytes); }
static void host_to_dev(void* dev_dst, const void* host_src, size_t bytes) { memcpy(dev_dst, host_src, bytes); }
static inline void dev_copy(void* dev_dst, const void* dev_src, size_t bytes) { memcpy(dev_dst, dev_src, bytes); }
static inline void dev_synchronize(void) {}   // the CPU's work is done when its call returns
static inline void compute_synchronize(void) {}
// the GPU build's asynchronous copies from pinned host memory (below); here plain copies
typedef int HostCopy;
static inline void* host_alloc_pinned(size_t bytes) { return mallocCheck(bytes); }
static inline void host_free_pinned(void* p) { free(p); }
static inline void host_copy_create(HostCopy* done) { *done = 0; }
static inline void host_copy_destroy(HostCopy* done) { (void)done; }
static inline void host_to_dev_async(void* dev_dst, const void* host_src, size_t bytes) { memcpy(dev_dst, host_src, bytes); }
static inline void host_copy_record(HostCopy* done) { (void)done; }
static inline void host_copy_wait(HostCopy* done) { (void)done; }
// the GPU build's communication stream (below); here every call is done when it returns
typedef int StreamEvent;
static inline void stream_event_create(StreamEvent* e) { *e = 0; }
static inline void stream_event_destroy(StreamEvent* e) { (void)e; }
static inline void comm_waits_for_compute(StreamEvent* e) { (void)e; }
static inline void compute_waits_for_comm(StreamEvent* e) { (void)e; }
static inline void comm_mark(StreamEvent* e) { (void)e; }
static inline void compute_waits_for_mark(StreamEvent* e) { (void)e; }
// the GPU build's CUDA graphs (kernels/common.cuh); none here: plain calls
typedef struct {
    long launches, instantiated;
} ComputeGraph;
static inline void compute_graph_begin(ComputeGraph* g) { (void)g; }
static inline void compute_graph_end(ComputeGraph* g) { (void)g; }
static inline void compute_graph_free(ComputeGraph* g) { (void)g; }
// float <-> floatX conversions between host float arrays and device floatX arrays
static void floats_to_dev_floatX(floatX* dev_dst, const float* host_src, size_t n) { memcpy(dev_dst, host_src, n * sizeof(float)); }
static void dev_floatX_to_floats(float* host_dst, const floatX* dev_src, size_t n) { memcpy(host_dst, dev_src, n * sizeof(float)); }
#define kernels_workspace_bytes ((size_t)0)   // what kernels_init handed out: nothing on the CPU
static void kernels_init(int local_device) { (void)local_device; }
static inline void kernels_free(void) {}   // (inline: programs without a trainer never call it)
#else
#define BUILD_NAME "GPU"
#define GPU_BUILD 1
#define HOST_DEVICE __host__ __device__

// The GPU build keeps floatX in 16 bits: bf16, or fp16 when compiled with -DGRIDGPT_FP16
// (`make gpu` builds both, train_gpu and train_gpu_fp16). Each block names everything about
// its type that the rest of the code needs: the conversions every kernel goes through
// (float -> floatX rounds to nearest even; floatX -> float is exact), the cuBLAS data type,
// the NCCL data type (used in parallel.h, which includes nccl.h), and the names the log shows.
// fp16 keeps 11 significand bits to bf16's 8, but its largest value is 65504 and below
// 2^-14 it loses bits (subnormals, the last one 2^-24): why fp16 training scales the loss.
#ifdef GRIDGPT_FP16
typedef __half floatX;
#define CUDA_R_FLOATX CUDA_R_16F
#define NCCL_FLOATX ncclFloat16
#define FLOATX_NAME "fp16"
#define PTX_FLOATX "f16"   // the type's name in PTX (the fused attention's mma.sync)
#define PRECISION_NAME "fp16 (fp32 master weights, fp32 grads, dynamic loss scaling)"
HOST_DEVICE static inline floatX to_floatX(float f) { return __float2half(f); }
HOST_DEVICE static inline float floatX_to_float(floatX x) { return __half2float(x); }
#else
typedef __nv_bfloat16 floatX;
#define CUDA_R_FLOATX CUDA_R_16BF
#define NCCL_FLOATX ncclBfloat16
#define FLOATX_NAME "bf16"
#define PTX_FLOATX "bf16"
#define PRECISION_NAME "bf16 (fp32 master weights, fp32 grads)"
HOST_DEVICE static inline floatX to_floatX(float f) { return __float2bfloat16(f); }
HOST_DEVICE static inline float floatX_to_float(floatX x) { return __bfloat162float(x); }
#endif

static size_t dev_bytes_allocated = 0;   // as the CPU build's
static void* dev_malloc(size_t bytes) {
    void* p = NULL;
    dev_bytes_allocated += bytes;
    cudaCheck(cudaMalloc(&p, bytes));
    return p;
}
static void dev_free(void* p) { cudaCheck(cudaFree(p)); }
static void dev_zero(void* p, size_t bytes) { cudaCheck(cudaMemset(p, 0, bytes)); }
static void dev_to_host(void* host_dst, const void* dev_src, size_t bytes) {
    cudaCheck(cudaMemcpy(host_dst, dev_src, bytes, cudaMemcpyDeviceToHost));
}
static void host_to_dev(void* dev_dst, const void* host_src, size_t bytes) {
    cudaCheck(cudaMemcpy(dev_dst, host_src, bytes, cudaMemcpyHostToDevice));
}
// The compute stream: the legacy default stream (0), where every kernel, cuBLAS call and copy
// of the compute is queued, but while generation captures a decode step into a CUDA graph
// (kernels/common.cuh's compute_graph_begin): a capture cannot be made on the legacy stream.
static cudaStream_t compute_stream = 0;

// device to device, queued on the compute stream
static void dev_copy(void* dev_dst, const void* dev_src, size_t bytes) {
    cudaCheck(cudaMemcpyAsync(dev_dst, dev_src, bytes, cudaMemcpyDeviceToDevice, compute_stream));
}
// wait until the GPU has finished everything queued (kernels, cuBLAS and NCCL calls are asynchronous): for timing
static inline void dev_synchronize(void) { cudaCheck(cudaDeviceSynchronize()); }
// the compute stream's work only: what the communication stream runs beside it goes on
static inline void compute_synchronize(void) { cudaCheck(cudaStreamSynchronize(compute_stream)); }

// Copies of a micro-batch's tokens from pinned (page-locked) host memory, queued on the
// compute stream: the host goes on at once, where a copy from pageable memory (cudaMemcpy)
// waits for the copy and so for every kernel queued before it. An event recorded after a
// buffer's copies says when the GPU has read it; the host waits for it (host_copy_wait)
// before it writes that buffer again.
typedef cudaEvent_t HostCopy;
static inline void* host_alloc_pinned(size_t bytes) {
    void* p = NULL;
    cudaCheck(cudaMallocHost(&p, bytes));
    return p;
}
static inline void host_free_pinned(void* p) { cudaCheck(cudaFreeHost(p)); }
static inline void host_copy_create(HostCopy* done) { cudaCheck(cudaEventCreateWithFlags(done, cudaEventDisableTiming)); }
static inline void host_copy_destroy(HostCopy* done) { cudaCheck(cudaEventDestroy(*done)); }
static inline void host_to_dev_async(void* dev_dst, const void* host_src, size_t bytes) {
    cudaCheck(cudaMemcpyAsync(dev_dst, host_src, bytes, cudaMemcpyHostToDevice, compute_stream));
}
static inline void host_copy_record(HostCopy* done) { cudaCheck(cudaEventRecord(*done, compute_stream)); }
static inline void host_copy_wait(HostCopy* done) { cudaCheck(cudaEventSynchronize(*done)); }

// The communication stream: communication that can overlap compute (parallel.h's bucketed
// gradient reduction and parameter all-gather, the pipeline's exchanges) is queued here,
// everything else on the compute stream (0). It is
// created non-blocking: the legacy default stream would otherwise wait for it, and it for
// the default stream, at every call, and nothing would overlap. Two streams are ordered by
// events: comm_waits_for_compute(e) makes what is queued on the communication stream next
// start only after everything queued on the compute stream so far (say, the kernels that
// wrote a bucket's gradients), and compute_waits_for_comm(e) the other way round (the norm
// reads the reduced gradients). One event may serve again and again: a wait takes the
// event's latest record.
typedef cudaEvent_t StreamEvent;
static cudaStream_t comm_stream;   // created by kernels_init
static inline void stream_event_create(StreamEvent* e) { cudaCheck(cudaEventCreateWithFlags(e, cudaEventDisableTiming)); }
static inline void stream_event_destroy(StreamEvent* e) { cudaCheck(cudaEventDestroy(*e)); }
static inline void comm_waits_for_compute(StreamEvent* e) {
    cudaCheck(cudaEventRecord(*e, compute_stream));
    cudaCheck(cudaStreamWaitEvent(comm_stream, *e, 0));
}
// compute_waits_for_comm in two halves: mark the communication stream's work so far now, wait
// for it later (the compute stream waits for one gathered bucket, not for those queued after it)
static inline void comm_mark(StreamEvent* e) { cudaCheck(cudaEventRecord(*e, comm_stream)); }
static inline void compute_waits_for_mark(StreamEvent* e) { cudaCheck(cudaStreamWaitEvent(compute_stream, *e, 0)); }
static inline void compute_waits_for_comm(StreamEvent* e) {
    comm_mark(e);
    compute_waits_for_mark(e);
}

// float <-> floatX conversions go through a host staging buffer of this many elements
#define CONVERT_CHUNK ((size_t)1 << 20)

static void floats_to_dev_floatX(floatX* dev_dst, const float* host_src, size_t n) {
    floatX* staging = (floatX*)mallocCheck(CONVERT_CHUNK * sizeof(floatX));
    for (size_t i0 = 0; i0 < n; i0 += CONVERT_CHUNK) {
        size_t count = n - i0 < CONVERT_CHUNK ? n - i0 : CONVERT_CHUNK;
        for (size_t i = 0; i < count; i++) staging[i] = to_floatX(host_src[i0 + i]);
        host_to_dev(dev_dst + i0, staging, count * sizeof(floatX));
    }
    free(staging);
}

static void dev_floatX_to_floats(float* host_dst, const floatX* dev_src, size_t n) {
    floatX* staging = (floatX*)mallocCheck(CONVERT_CHUNK * sizeof(floatX));
    for (size_t i0 = 0; i0 < n; i0 += CONVERT_CHUNK) {
        size_t count = n - i0 < CONVERT_CHUNK ? n - i0 : CONVERT_CHUNK;
        dev_to_host(staging, dev_src + i0, count * sizeof(floatX));
        for (size_t i = 0; i < count; i++) host_dst[i0 + i] = floatX_to_float(staging[i]);
    }
    free(staging);
}
#endif

// The build a memory layout is for: this binary's (this_build()), or in a dry run's plan the
// other one (train.c's --dry-run-build). What differs between the builds' layouts goes by it.
typedef struct {
    int gpu;               // the GPU build: 16-bit floatX, fp32 master weights, the kernels' workspace
    int floatx_bytes;      // 2 (bf16, fp16) or 4 (fp32)
    int flash_attention;   // the GPU build's fused attention (--attention-backend): a layer keeps the
                           // log-sum-exp of its scores, not its probabilities
    int bias_grad_kernel;  // the GPU build's bias gradients by a kernel of their own, not in the weight
                           // gradients' GEMMs (--bias-grad kernel): the planner prices what runs
} BuildTarget;

// this binary's build, with the unfused attention (train.c sets flash_attention from the flag)
static inline BuildTarget this_build(void) {
    BuildTarget b = {GPU_BUILD, (int)sizeof(floatX), 0, 0};
    return b;
}
