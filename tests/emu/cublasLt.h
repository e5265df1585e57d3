/*
tests/emu/cublasLt.h — the cuBLASLt calls gridgpt makes, emulated on the CPU (tests only).

cublasLtMatmul computes, column-major as cuBLAS (see cublas_v2.h here),
    D[i + j*ldd] = epilogue(alpha * sum_l op(A)[i, l] * op(B)[l, j] + beta * C[i + j*ldc])
for i < m, j < n, l < k, where m x n is D's layout and op(A), op(B) are the stored arrays
(their layouts: rows x cols, ld) transposed or not by the descriptor's TRANSA / TRANSB. The
products are summed in double and the epilogue applied to that value before the one rounding
to D's type, as cuBLASLt applies its epilogue to the fp32 accumulator:
  DEFAULT        nothing;
  BIAS           + bias[i] (a vector of m elements, broadcast over the columns);
  GELU_AUX       aux = x (rounded to D's type, aux[i + j*aux_ld]), D = GELU(x);
  GELU_AUX_BIAS  x = x + bias[i], then as GELU_AUX.
  DGELU          D = x * GELU'(aux[i + j*aux_ld]): aux is read (the GELU's input, as GELU_AUX
                 wrote it in the forward), with the same ld rules; the backward of a GELU
                 folded into the GEMM that computes the gradient at its output.
  BGRADB         D = x, and bias[j] = sum_l op(B)[l, j] (n elements, D's type: a bias
                 gradient, written where the other epilogues read a bias), the sums in
                 double rounded once: the bias gradient of the layer whose output gradient
                 is op(B), folded into its weight gradient's GEMM.
GELU is the tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), and GELU' its
derivative. cuBLASLt's
documentation only says "GELU point-wise transform"; that it is the tanh form is what
PyTorch relies on (its _addmm_activation with use_gelu=True stands for gelu(approximate=
"tanh") and is checked against it) and what llm.c's fused GELU epilogue matches.
What is checked, as cuBLASLt documents it (CUBLAS_STATUS_INVALID_VALUE): layouts whose sizes
do not agree (op(A) m x k, op(B) k x n, C and D m x n), ld below the rows, an epilogue that
needs a bias or aux pointer without one, an aux ld below m or not a multiple of 8. Only what
gridgpt uses is emulated (NOT_SUPPORTED otherwise): fp32 compute and scale, A and B both
bf16 or both fp16, C and D alike and of A's type or fp32, bias of D's type or fp32 (a BGRADB
bias gradient: D's type, as cuBLASLt.h says), aux of D's type. The algorithm the heuristic returns keeps the minimum alignments of A, B, C and D
the preference asked for (cuBLASLt's default: 256 bytes); cublasLtMatmul with a pointer
less aligned than that is NOT_SUPPORTED here (on the GPU the algorithm is not allowed to
meet it). The bias and aux pointers must be 16-byte aligned (our conservative reading: the
epilogue reads and writes them in 16-byte vectors; llm.c requires the same of every
pointer). On top, every matrix, the bias, aux and the workspace must lie inside one device
allocation each (an emu error, as the emulated cuBLAS's). The workspace the heuristic asks
for is 0 bytes: the emulation needs none, but checks the one it is given.
*/
#pragma once
#include "cublas_v2.h"

typedef struct EmuCublasLt* cublasLtHandle_t;

typedef enum {
    CUBLASLT_EPILOGUE_DEFAULT = 1,
    CUBLASLT_EPILOGUE_BIAS = 4,
    CUBLASLT_EPILOGUE_GELU = 32,
    CUBLASLT_EPILOGUE_GELU_AUX = 160,
    CUBLASLT_EPILOGUE_GELU_BIAS = 36,
    CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 164,
    CUBLASLT_EPILOGUE_DGELU = 192,
    CUBLASLT_EPILOGUE_BGRADB = 512,
} cublasLtEpilogue_t;

typedef enum {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,
    CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,
} cublasLtMatmulDescAttributes_t;

typedef enum {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
} cublasLtMatmulPreferenceAttributes_t;

struct EmuCublasLt {
    int valid;
};
struct EmuMatmulDesc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    cublasOperation_t transa, transb;
    cublasLtEpilogue_t epilogue;
    const void* bias;
    int32_t bias_type;   // a cudaDataType_t, or -1: D's type (cuBLASLt's default)
    void* aux;
    int64_t aux_ld;
};
struct EmuMatrixLayout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
struct EmuMatmulPreference {
    uint64_t max_workspace;
    uint32_t min_alignment[4];   // A, B, C, D
};
typedef EmuMatmulDesc* cublasLtMatmulDesc_t;
typedef EmuMatrixLayout* cublasLtMatrixLayout_t;
typedef EmuMatmulPreference* cublasLtMatmulPreference_t;

typedef struct {
    uint64_t data[8];   // here: the minimum alignments of A, B, C, D the heuristic was asked for
} cublasLtMatmulAlgo_t;

typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

// what an algorithm is (tests/gpu_dweight.cu prints it): here one emulated product, so every
// attribute reads 0
typedef enum {
    CUBLASLT_ALGO_CONFIG_ID = 0,
    CUBLASLT_ALGO_CONFIG_TILE_ID = 1,
    CUBLASLT_ALGO_CONFIG_SPLITK_NUM = 2,
    CUBLASLT_ALGO_CONFIG_STAGES_ID = 6,
} cublasLtMatmulAlgoConfigAttributes_t;
static cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t,
                                                           void* buf, size_t bytes, size_t* written) {
    if (algo == NULL || buf == NULL || bytes < sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    memset(buf, 0, bytes);
    if (written) *written = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

// ----------------------------------------------------------------------------
// handle, descriptors, layouts, preferences

static cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
    static EmuCublasLt the_handle = {1};
    *handle = &the_handle;
    return CUBLAS_STATUS_SUCCESS;
}
static cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) { return handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED; }

static cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale) {
    *desc = new EmuMatmulDesc{compute, scale, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, NULL, -1, NULL, 0};
    return CUBLAS_STATUS_SUCCESS;
}
static cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

// copies the attribute's value, if the size is the attribute's
template <class T>
static cublasStatus_t emu_set_attribute(T* field, const void* buf, size_t bytes) {
    if (bytes != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(field, buf, sizeof(T));
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                                     const void* buf, size_t bytes) {
    if (desc == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return emu_set_attribute(&desc->transa, buf, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSB: return emu_set_attribute(&desc->transb, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return emu_set_attribute(&desc->epilogue, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return emu_set_attribute(&desc->bias, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return emu_set_attribute(&desc->bias_type, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return emu_set_attribute(&desc->aux, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return emu_set_attribute(&desc->aux_ld, buf, bytes);
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

static cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type, uint64_t rows,
                                                 uint64_t cols, int64_t ld) {
    *layout = new EmuMatrixLayout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
static cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
    *pref = new EmuMatmulPreference{0, {256, 256, 256, 256}};
    return CUBLAS_STATUS_SUCCESS;
}
static cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}
static cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                                                           const void* buf, size_t bytes) {
    if (pref == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return emu_set_attribute(&pref->max_workspace, buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return emu_set_attribute(&pref->min_alignment[0], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return emu_set_attribute(&pref->min_alignment[1], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return emu_set_attribute(&pref->min_alignment[2], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return emu_set_attribute(&pref->min_alignment[3], buf, bytes);
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

// ----------------------------------------------------------------------------
// the checks both the heuristic and the matmul make

static bool emu_lt_has_bias(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
// the bias pointer, read (a bias) or written (a bias gradient)
static bool emu_lt_has_bias_pointer(cublasLtEpilogue_t e) { return emu_lt_has_bias(e) || e == CUBLASLT_EPILOGUE_BGRADB; }
static bool emu_lt_has_gelu(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
static bool emu_lt_has_aux(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU; }
static bool emu_is_16bit(cudaDataType_t t) { return t == CUDA_R_16BF || t == CUDA_R_16F; }

// m, n, k from the layouts, or INVALID_VALUE / NOT_SUPPORTED as cuBLASLt would answer
static cublasStatus_t emu_lt_problem(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                     cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D, int* m, int* n, int* k) {
    if (d == NULL || A == NULL || B == NULL || C == NULL || D == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    *m = (int)D->rows, *n = (int)D->cols;
    *k = (int)(d->transa == CUBLAS_OP_N ? A->cols : A->rows);
    uint64_t a_m = d->transa == CUBLAS_OP_N ? A->rows : A->cols;
    uint64_t b_k = d->transb == CUBLAS_OP_N ? B->rows : B->cols, b_n = d->transb == CUBLAS_OP_N ? B->cols : B->rows;
    if (a_m != D->rows || b_k != (uint64_t)*k || b_n != D->cols || C->rows != D->rows || C->cols != D->cols)
        return CUBLAS_STATUS_INVALID_VALUE;
    const EmuMatrixLayout* all[4] = {A, B, C, D};
    for (const EmuMatrixLayout* l : all)
        if (l->ld < (int64_t)(l->rows > 1 ? l->rows : 1)) return CUBLAS_STATUS_INVALID_VALUE;
    if (emu_lt_has_bias_pointer(d->epilogue) && d->bias == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    if (emu_lt_has_aux(d->epilogue) && (d->aux == NULL || d->aux_ld < (int64_t)D->rows || d->aux_ld % 8 != 0))
        return CUBLAS_STATUS_INVALID_VALUE;
    cudaDataType_t bias_type = d->bias_type == -1 ? D->type : (cudaDataType_t)d->bias_type;
    bool epilogue_known = d->epilogue == CUBLASLT_EPILOGUE_DEFAULT || emu_lt_has_bias(d->epilogue) || emu_lt_has_gelu(d->epilogue) ||
                          d->epilogue == CUBLASLT_EPILOGUE_DGELU || d->epilogue == CUBLASLT_EPILOGUE_BGRADB;
    if (d->compute != CUBLAS_COMPUTE_32F || d->scale != CUDA_R_32F || A->type != B->type || !emu_is_16bit(A->type) ||
        C->type != D->type || (D->type != A->type && D->type != CUDA_R_32F) || !epilogue_known ||
        (emu_lt_has_bias(d->epilogue) && bias_type != D->type && bias_type != CUDA_R_32F) ||
        (d->epilogue == CUBLASLT_EPILOGUE_BGRADB && bias_type != D->type))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}

// one algorithm, if the problem is one cuBLASLt takes
static cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                     cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                                     cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
                                                     cublasLtMatmulPreference_t pref, int requested,
                                                     cublasLtMatmulHeuristicResult_t* results, int* returned) {
    if (handle == NULL) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (pref == NULL || requested < 1 || results == NULL || returned == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    int m, n, k;
    cublasStatus_t s = emu_lt_problem(desc, A, B, C, D, &m, &n, &k);
    *returned = 0;
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    memset(&results[0], 0, sizeof results[0]);
    for (int i = 0; i < 4; i++) results[0].algo.data[i] = pref->min_alignment[i];
    results[0].workspaceSize = 0;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

// GELU, tanh approximation (see the header), and its derivative
static double emu_gelu(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
static double emu_gelu_grad(double x) {
    double s = 0.7978845608028654, th = tanh(s * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

static cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                                     const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                                     const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc,
                                     void* D, cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                                     void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    if (handle == NULL) return CUBLAS_STATUS_NOT_INITIALIZED;
    int m, n, k;
    cublasStatus_t s = emu_lt_problem(desc, Adesc, Bdesc, Cdesc, Ddesc, &m, &n, &k);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (algo == NULL) return CUBLAS_STATUS_INVALID_VALUE;   // gridgpt always passes the heuristic's
    const void* pointers[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++)
        if ((uintptr_t)pointers[i] % (algo->data[i] ? algo->data[i] : 1) != 0) return CUBLAS_STATUS_NOT_SUPPORTED;
    cublasLtEpilogue_t e = desc->epilogue;
    if ((emu_lt_has_bias_pointer(e) && (uintptr_t)desc->bias % 16 != 0) || (emu_lt_has_aux(e) && (uintptr_t)desc->aux % 16 != 0))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    cudaDataType_t bias_type = desc->bias_type == -1 ? Ddesc->type : (cudaDataType_t)desc->bias_type;
    int a_rows = (int)Adesc->rows, a_cols = (int)Adesc->cols, b_rows = (int)Bdesc->rows, b_cols = (int)Bdesc->cols;
    int lda = (int)Adesc->ld, ldb = (int)Bdesc->ld, ldc = (int)Cdesc->ld, ldd = (int)Ddesc->ld;
    double al = *(const float*)alpha, be = *(const float*)beta;
    if (!emu_matrix_in_device(A, Adesc->type, a_rows, a_cols, lda, 0, 1) ||
        !emu_matrix_in_device(B, Bdesc->type, b_rows, b_cols, ldb, 0, 1) ||
        (be != 0.0 && !emu_matrix_in_device(C, Cdesc->type, m, n, ldc, 0, 1)) ||
        !emu_matrix_in_device(D, Ddesc->type, m, n, ldd, 0, 1) ||
        (emu_lt_has_bias(e) && !emu_matrix_in_device(desc->bias, bias_type, m, 1, m, 0, 1)) ||
        (e == CUBLASLT_EPILOGUE_BGRADB && !emu_matrix_in_device(desc->bias, bias_type, n, 1, n, 0, 1)) ||
        (emu_lt_has_aux(e) && !emu_matrix_in_device(desc->aux, Ddesc->type, m, n, (int)desc->aux_ld, 0, 1)) ||
        (workspace_bytes > 0 && !emu_is_device_range(workspace, workspace_bytes)))
        emu_fail("%s", "cuBLASLt matmul: a matrix, the bias, aux or the workspace reaches outside its device allocation");
    // the product, on `stream`, with the descriptors as they are now (a plan's descriptor gets
    // the next call's bias and aux pointers: cuBLASLt takes them at the call)
    EmuMatmulDesc desc_now = *desc;
    EmuMatrixLayout a_now = *Adesc, b_now = *Bdesc, c_now = *Cdesc, d_now = *Ddesc;
    emu_on_stream(stream, [=] {
    const EmuMatmulDesc* desc = &desc_now;
    const EmuMatrixLayout *Adesc = &a_now, *Bdesc = &b_now, *Cdesc = &c_now, *Ddesc = &d_now;
    (void)Cdesc;
    std::vector<double> a = emu_rows(A, Adesc->type, 0, lda, m, k, desc->transa != CUBLAS_OP_N);
    std::vector<double> bt = emu_rows(B, Bdesc->type, 0, ldb, n, k, desc->transb == CUBLAS_OP_N);
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < m; i++) {
            double acc = emu_dot(&a[(size_t)i * k], &bt[(size_t)j * k], k);
            double x = al * acc + (be != 0.0 ? be * emu_load(C, Cdesc->type, (size_t)i + (size_t)j * ldc) : 0.0);
            if (emu_lt_has_bias(e)) x += emu_load(desc->bias, bias_type, (size_t)i);
            size_t at_aux = (size_t)i + (size_t)j * desc->aux_ld;
            if (e == CUBLASLT_EPILOGUE_DGELU) x *= emu_gelu_grad(emu_load(desc->aux, Ddesc->type, at_aux));
            else if (emu_lt_has_aux(e)) emu_store(desc->aux, Ddesc->type, at_aux, x);
            if (emu_lt_has_gelu(e)) x = emu_gelu(x);
            emu_store(D, Ddesc->type, (size_t)i + (size_t)j * ldd, x);
        }
        if (e == CUBLASLT_EPILOGUE_BGRADB) {
            double column_sum = 0.0;
            for (int l = 0; l < k; l++) column_sum += bt[(size_t)j * k + l];
            emu_store((void*)desc->bias, bias_type, (size_t)j, column_sum);
        }
    }
    }, (const void*)&cublasLtMatmul);
    return CUBLAS_STATUS_SUCCESS;
}
