/*
kernels/embedding.cuh — the residual stream's first ops: the vocab-parallel embedding
(encoder_forward, encoder_backward), the residual add, and the column reductions that
parameter gradients sum through (their fixed chunks, bias_grad_chunks and layernorm_grad_chunks,
and column_partials_add; a bias's own column sums, column_sums_add, are linear.cuh's).
Each op: its C reference, then its CUDA twin.

Included by kernels.cuh, the index of kernels/: the conventions every kernel keeps are there.
*/
#pragma once

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

// the same add on fp32 buffers (context parallelism's partial sums of the keys' and values'
// gradients, added on their way round the ring): on the CPU build residual_forward_cpu itself
#ifdef __CUDACC__
__global__ void add_floats_kernel(float* out, const float* a, const float* b, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

static void add_floats(float* out, const float* a, const float* b, size_t n) {
    LAUNCH(add_floats_kernel, CEIL_DIV(n, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0, out, a, b, n);
}
#else
#define add_floats residual_forward_cpu
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
