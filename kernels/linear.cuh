/*
kernels/linear.cuh — the linear layers: matmul_forward and matmul_backward (the C loops, or
sgemm with USE_BLAS; cuBLAS on the GPU), a bias gradient's column sums (column_sums_add), the
cuBLASLt products with an epilogue (bias, GELU, dGELU, bias gradient) and their plans made
once per shape, kernels_free; and rows_add, a table's rows added to a buffer's (a row-parallel
bias, the position embedding, under sequence parallelism). Each op: its C reference, then its
CUDA twin.

Included by kernels.cuh, the index of kernels/: the conventions every kernel keeps are there.
*/
#pragma once

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

// The backward in its two halves, which share nothing: the input's gradient (what the layer
// before waits for) and the parameters' (which nothing in this micro-batch's backward reads, so
// a zero-bubble schedule may run them later: pipeline.h's ZB-H1).
// dinp = dout @ weight
static void matmul_backward_dinp_reference(float* dinp, const float* dout, const float* weight, int N, int C, int OC) {
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
}

// dweight += dout^T @ inp;  dbias += column sums of dout
static void matmul_backward_params_reference(float* dweight, float* dbias, const float* dout, const float* inp, int N,
                                             int C, int OC) {
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

static void matmul_backward_dinp_cpu(float* dinp, const float* dout, const float* weight, int N, int C, int OC) {
#ifdef USE_BLAS
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
#else
    matmul_backward_dinp_reference(dinp, dout, weight, N, C, OC);
#endif
}

static void matmul_backward_params_cpu(float* dweight, float* dbias, const float* dout, const float* inp, int N, int C,
                                       int OC) {
#ifdef USE_BLAS
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias) column_sums_add_cpu(dbias, dout, N, OC);
#else
    matmul_backward_params_reference(dweight, dbias, dout, inp, N, C, OC);
#endif
}

static void matmul_backward_cpu(float* dinp, float* dweight, float* dbias, const float* dout,
                                const float* inp, const float* weight, int N, int C, int OC) {
    matmul_backward_dinp_cpu(dinp, dout, weight, N, C, OC);
    matmul_backward_params_cpu(dweight, dbias, dout, inp, N, C, OC);
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
                               &p->heuristic.algo, cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES, compute_stream));
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
// --bias-grad (train.c's plan_model sets it from the model's BuildTarget): 1, the bias gradient in the BGRADB epilogue; 0,
// always the product alone, then column_sums_add (llm.c's way). The weight-gradient GEMMs have few
// output tiles (GPT-2 124M: 36 to 144 of 128 x 128, against an H100's 132 SMs) and fill the GPU
// only by splitting K, which cuBLASLt's heuristic may pass over with BGRADB: tests/gpu_dweight.cu
// times both ways, with the algorithm chosen for each, and says which --bias-grad is faster.
static int bias_grad_in_epilogue = 1;

static void matmul_backward_params(float* dweight, float* dbias, float* partials, const floatX* dout,
                                   const floatX* inp, int N, int C, int OC) {
    if (bias_grad_in_epilogue && dbias != NULL && N > 0 && (uintptr_t)partials % 16 == 0) {
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
    if (decode_partials) dev_free(decode_partials);
}
#else
#define matmul_forward matmul_forward_cpu
#define matmul_backward(dinp, dweight, dbias, partials, ...) matmul_backward_cpu(dinp, dweight, dbias, __VA_ARGS__)
#define matmul_backward_dinp matmul_backward_dinp_cpu
#define matmul_backward_params(dweight, dbias, partials, ...) matmul_backward_params_cpu(dweight, dbias, __VA_ARGS__)
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
