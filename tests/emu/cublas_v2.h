/*
tests/emu/cublas_v2.h — the cuBLAS calls gridgpt makes, emulated on the CPU (tests only).

cublasGemmEx and cublasGemmStridedBatchedEx with cuBLAS's own column-major semantics:
    C[i + j*ldc] = alpha * sum_l op(A)[i, l] * op(B)[l, j] + beta * C[i + j*ldc]
for i < m, j < n, l < k, where op(A)[i, l] is A[i + l*lda] (OP_N) or A[l + i*lda] (OP_T),
and batch b uses A + b*strideA, B + b*strideB, C + b*strideC (strides in elements).
The argument checks are cuBLAS's (CUBLAS_STATUS_INVALID_VALUE for negative sizes or too
small leading dimensions; NOT_SUPPORTED for type combinations other than fp32 compute with
A and B both bf16, both fp16 or both fp32, and C of their type or fp32); on top, every
matrix must lie inside one device allocation. With beta == 0, C is not read (it may hold
NaN), as in cuBLAS. Products are summed in double and rounded once to C's type: the exact
answer, which a tensor-core GEMM approaches to within fp32 accumulation error.
*/
#pragma once
#include <vector>
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
typedef struct EmuCublas* cublasHandle_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0 } cublasMath_t;

struct EmuCublas {
    int valid;
    cudaStream_t stream;   // cublasSetStream's: the products are queued there (recorded where it is captured)
};

static const char* cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

static cublasStatus_t cublasCreate(cublasHandle_t* handle) {
    static EmuCublas the_handle = {1, NULL};
    *handle = &the_handle;
    return CUBLAS_STATUS_SUCCESS;
}
static cublasStatus_t cublasDestroy(cublasHandle_t h) { return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED; }
static cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t) { return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED; }
static cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t stream) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

static size_t emu_type_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }
static double emu_load(const void* p, cudaDataType_t t, size_t i) {
    if (t == CUDA_R_16BF) return (double)__bfloat162float(((const __nv_bfloat16*)p)[i]);
    if (t == CUDA_R_16F) return (double)__half2float(((const __half*)p)[i]);
    return (double)((const float*)p)[i];
}
static void emu_store(void* p, cudaDataType_t t, size_t i, double x) {
    if (t == CUDA_R_16BF) ((__nv_bfloat16*)p)[i] = __float2bfloat16((float)x);
    else if (t == CUDA_R_16F) ((__half*)p)[i] = __float2half((float)x);
    else ((float*)p)[i] = (float)x;
}
// op(X)'s r rows of k values each, as doubles, one row after another: row i of op(A) for A, column
// j of op(B) for B (trans_rows: op is N for B, T for A), so that a product's dot product runs
// over two contiguous rows. The values and the order of the additions are the loop's over the
// arrays as stored; only the conversions, done once, are not redone for every product (they were
// a fifth of the emulated trainer's time).
static std::vector<double> emu_rows(const void* X, cudaDataType_t t, size_t x0, int ld, int r, int k, bool trans_rows) {
    std::vector<double> rows((size_t)r * k);
    for (int i = 0; i < r; i++)
        for (int l = 0; l < k; l++)
            rows[(size_t)i * k + l] = emu_load(X, t, x0 + (trans_rows ? (size_t)l + (size_t)i * ld : (size_t)i + (size_t)l * ld));
    return rows;
}
static double emu_dot(const double* a, const double* b, int k) {
    double acc = 0.0;
    for (int l = 0; l < k; l++) acc += a[l] * b[l];
    return acc;
}

// the elements a column-major rows x cols matrix with leading dimension ld spans, per batch
// entry, over `batch` entries `stride` apart: must lie in one device allocation
static bool emu_matrix_in_device(const void* p, cudaDataType_t t, int rows, int cols, int ld, long long stride, int batch) {
    if (rows == 0 || cols == 0 || batch == 0) return true;
    size_t last = (size_t)(cols - 1) * ld + rows - 1 + (size_t)(batch - 1) * stride;
    return stride >= 0 && emu_is_device_range(p, (last + 1) * emu_type_bytes(t));
}

static cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                                 int m, int n, int k, const void* alpha,
                                                 const void* A, cudaDataType_t Atype, int lda, long long strideA,
                                                 const void* B, cudaDataType_t Btype, int ldb, long long strideB,
                                                 const void* beta, void* C, cudaDataType_t Ctype, int ldc, long long strideC,
                                                 int batch, cublasComputeType_t compute, cublasGemmAlgo_t) {
    if (handle == NULL) return CUBLAS_STATUS_NOT_INITIALIZED;
    // cuBLAS's checks: op(A) is m x k, op(B) is k x n, stored as their (transposed) arrays
    int a_rows = transa == CUBLAS_OP_N ? m : k, a_cols = transa == CUBLAS_OP_N ? k : m;
    int b_rows = transb == CUBLAS_OP_N ? k : n, b_cols = transb == CUBLAS_OP_N ? n : k;
    if (m < 0 || n < 0 || k < 0 || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (lda < (a_rows > 1 ? a_rows : 1) || ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (compute != CUBLAS_COMPUTE_32F || Atype != Btype || (Ctype != Atype && Ctype != CUDA_R_32F))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    // alpha and beta are host floats (pointer mode host, fp32 compute)
    double al = *(const float*)alpha, be = *(const float*)beta;
    if (!emu_matrix_in_device(A, Atype, a_rows, a_cols, lda, strideA, batch) ||
        !emu_matrix_in_device(B, Btype, b_rows, b_cols, ldb, strideB, batch) ||
        !emu_matrix_in_device(C, Ctype, m, n, ldc, strideC, batch))
        emu_fail("%s", "cuBLAS GEMM: a matrix reaches outside its device allocation (check ld, stride, m, n, k)");
    emu_on_stream(handle->stream, [=] {   // the product, on the handle's stream
    for (int b = 0; b < batch; b++) {
        size_t a0 = (size_t)b * strideA, b0 = (size_t)b * strideB, c0 = (size_t)b * strideC;
        std::vector<double> a = emu_rows(A, Atype, a0, lda, m, k, transa != CUBLAS_OP_N);
        std::vector<double> bt = emu_rows(B, Btype, b0, ldb, n, k, transb == CUBLAS_OP_N);
        for (int j = 0; j < n; j++) {
            for (int i = 0; i < m; i++) {
                double acc = emu_dot(&a[(size_t)i * k], &bt[(size_t)j * k], k);
                size_t ic = c0 + (size_t)i + (size_t)j * ldc;
                double prev = be != 0.0 ? emu_load(C, Ctype, ic) : 0.0;
                emu_store(C, Ctype, ic, al * acc + be * prev);
            }
        }
    }
    }, (const void*)&cublasGemmStridedBatchedEx);
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                   int m, int n, int k, const void* alpha,
                                   const void* A, cudaDataType_t Atype, int lda, const void* B, cudaDataType_t Btype, int ldb,
                                   const void* beta, void* C, cudaDataType_t Ctype, int ldc,
                                   cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    return cublasGemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0,
                                      beta, C, Ctype, ldc, 0, 1, compute, algo);
}
