/*
kernels/attention.cuh — causal self-attention but its fused kernels: the QKV layout
(qkv_group_index, grouped-query attention), ALiBi, the fused kernels' tile sizes and the
attention scratch (known to both builds, for the plans), the unfused attention (cuBLAS
products and a softmax that keeps att[B, NH, T, T]); then generation's KV cache and
attention_decode, and the rotary position embedding (rope_forward, rope_backward). Each op:
its C reference, then its CUDA twin. The fused kernels follow in flash_attention.cuh, with
attention_forward and attention_backward, which choose between them and the unfused path.

Included by kernels.cuh, the index of kernels/: the conventions every kernel keeps are there.
*/
#pragma once

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

// the attention dropout's factor of query t and key t2 under a head's key (1: dropout off)
HOST_DEVICE static inline float attention_dropout_factor(uint64_t head_key, int t, int t2, const Dropout* d) {
    return d->threshold ? dropout_factor(head_key, t, t2, d) : 1.0f;
}

// att keeps the probabilities p; with dropout d the values are weighed by p x its mask's factor
// (Megatron-LM's attention dropout on the probabilities), the mask drawn again in the backward
static void attention_forward_cpu(float* out, float* att, const float* qkv, int B, int T, int NH, int G, int HS,
                                  Alibi alibi, Dropout d) {
    const size_t row = (size_t)(NH + 2 * G) * HS;   // one token's qkv: token t2's value is v + t2 * row
    // one (b, h) pair per iteration: every pair has the same triangle of work
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            float* p = att + ((size_t)b * NH + h) * T * T;   // the head's probabilities [T, T]
            uint64_t head_key = d.threshold ? dropout_head_key(&d, b, h) : 0;
            for (int t = 0; t < T; t++) attention_row_probabilities(p + (size_t)t * T, qkv, b, t, h, T, NH, G, HS, alibi);
            // out_t = the sum over t2 <= t of p[t, t2] v_t2, added in t2 order; value by value
            // (t2 outer), so that consecutive adds go to different rows of out (query by query,
            // each add to a row waited for the one before it, through memory)
            const float* v = qkv + qkv_index(b, 0, h, 2, T, NH, G, HS);
            for (int t = 0; t < T; t++)
                for (int i = 0; i < HS; i++) out[((size_t)(b * T + t) * NH + h) * HS + i] = 0.0f;
            for (int t2 = 0; t2 < T; t2++)
                for (int t = t2; t < T; t++)
                    axpy_lanes(out + ((size_t)(b * T + t) * NH + h) * HS,
                               p[(size_t)t * T + t2] * attention_dropout_factor(head_key, t, t2, &d), v + t2 * row, HS);
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
// datt[t2] = dout . v[t2]:  dscore[t2] = p[t2] * (datt[t2] - sum_j p[j] datt[j]). With dropout
// (out = (p f) v, f the mask's factor drawn again): datt[t2] = f[t2] dout . v[t2], dv += p f dout.
// scratch holds one row of datt, then dscore, per (b, h) pair: B * NH * T floats.
// Each product is a loop of its own over the head's HS elements (dot_lanes, axpy_lanes), so
// that it runs on vector lanes: one loop updating dq, dk and dv together went through more
// pointers than the compiler would check apart, ran one element at a time, and held the
// attention's backward to 1/8 of the matmuls' rate. dq, dk and dv get their adds in that
// loop's order.
static void attention_backward_cpu(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                   const float* att, int B, int T, int NH, int G, int HS, Dropout d) {
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
                uint64_t head_key = d.threshold ? dropout_head_key(&d, b, h) : 0;
                for (int t = 0; t < T; t++) {
                    const float* a = att + (((size_t)b * NH + h) * T + t) * T;
                    const float* dout_row = dout + ((size_t)(b * T + t) * NH + h) * HS;
                    const float* q = qkv + qkv_index(b, t, h, 0, T, NH, G, HS);
                    float* dq = dqkv + qkv_index(b, t, h, 0, T, NH, G, HS);
                    float p_dot_datt = 0.0f;
                    for (int t2 = 0; t2 <= t; t2++) {
                        dscore[t2] = dot_lanes(dout_row, v + t2 * row, HS) * attention_dropout_factor(head_key, t, t2, &d);
                        p_dot_datt += a[t2] * dscore[t2];   // datt
                    }
                    for (int t2 = 0; t2 <= t; t2++) {
                        axpy_lanes(dv + t2 * row, a[t2] * attention_dropout_factor(head_key, t, t2, &d), dout_row, HS);
                        dscore[t2] = a[t2] * (dscore[t2] - p_dot_datt) * scale;
                    }
                    for (int t2 = 0; t2 <= t; t2++) {
                        axpy_lanes(dq, dscore[t2], k + t2 * row, HS);
                        axpy_lanes(dk + t2 * row, dscore[t2], q, HS);
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

// The fused backward's scratch, in floats: dQ's fp32 sums [B, NH, T, HS] (each query step's,
// between the key tiles that add to it in turn; from the first 16-byte boundary, so 3 floats more
// for a scratch that starts past one), then D [B, NH, T], then the counters: one turn counter per
// (b, h, query step of FLASH_STEP) and the blocks' ticket counter.
static size_t flash_backward_scratch_floats(int B, int T, int NH, int HS) {
    size_t rows = (size_t)B * NH * T;
    return 3 + rows * HS + rows + (size_t)B * NH * CEIL_DIV(T, FLASH_STEP) + 1;
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

// the attention dropout's factor of row `row` (b, h, t) of [B, NH, T, T] at key t2, with the
// row's head key (dropout_head_key of b, h) hoisted by the caller; 1 with dropout off
__device__ float row_dropout_factor(uint64_t head_key, int t, int t2, const Dropout* d) {
    return d->threshold ? dropout_factor(head_key, t, t2, d) : 1.0f;
}
__device__ uint64_t row_head_key(int row, int T, int NH, const Dropout* d) {
    return d->threshold ? dropout_head_key(d, row / T / NH, row / T % NH) : 0;
}

// One warp per row: the probabilities with the attention dropout's mask, att x its factor, into
// dropped (what weighs the values: the forward's product, and dV's in the backward)
__global__ void attention_dropout_kernel(floatX* dropped, const floatX* att, int rows, int T, int NH, Dropout d) {
    int lane = threadIdx.x % 32, row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (row >= rows) return;
    uint64_t key = row_head_key(row, T, NH, &d);
    for (int t2 = lane; t2 < T; t2 += 32)
        dropped[(size_t)row * T + t2] = to_floatX(floatX_to_float(att[(size_t)row * T + t2]) *
                                                   row_dropout_factor(key, row % T, t2, &d));
}

// One warp per row: dscores = scale * p * (datt - sum_j p_j datt_j) over t2 <= t, 0 above; with
// dropout datt is the mask's factor times dout . v (the mask drawn again)
__global__ void attention_softmax_backward_kernel(floatX* dscores, const floatX* att, const float* datt,
                                                  float scale, int rows, int T, int NH, Dropout d) {
    int lane = threadIdx.x % 32, row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (row >= rows) return;
    int t = row % T;
    uint64_t key = row_head_key(row, T, NH, &d);
    const floatX* a = att + (size_t)row * T;
    const float* da = datt + (size_t)row * T;
    floatX* ds = dscores + (size_t)row * T;
    float dot = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += 32) dot += floatX_to_float(a[t2]) * da[t2] * row_dropout_factor(key, t, t2, &d);
    dot = warp_reduce_sum(dot);
    for (int t2 = lane; t2 < T; t2 += 32) {
        float g = t2 <= t ? da[t2] * row_dropout_factor(key, t, t2, &d) : 0.0f;
        ds[t2] = to_floatX(t2 <= t ? scale * floatX_to_float(a[t2]) * (g - dot) : 0.0f);
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

// the probabilities that weigh the values: att itself, or with dropout att x its mask in the
// dscores region (free in the forward; in the backward before dscores is written)
static const floatX* attention_weights(AttentionScratch s, const floatX* att, int B, int T, int NH, Dropout d) {
    if (!d.threshold) return att;
    LAUNCH(attention_dropout_kernel, CEIL_DIV(B * NH * T, ROWS_PER_BLOCK), ROW_BLOCK, 0, s.dscores, att, B * NH * T, T, NH, d);
    return s.dscores;
}

static void attention_forward_unfused(floatX* out, floatX* att, floatX* scratch, const floatX* qkv,
                                      int B, int T, int NH, int G, int HS, Alibi alibi, Dropout d) {
    AttentionScratch s = attention_scratch(scratch, B, T, NH, HS);
    AttentionGroups a = attention_groups(B, T, NH, G, HS);
    size_t n = (size_t)B * NH * T * HS;
    attention_probabilities_unfused(att, scratch, qkv, B, T, NH, G, HS, alibi);
    // y = att v:  y^T [HS, R] = v^T [HS, T] @ att^T [T, R]; both arrays are already these
    // transposes, op = N, N (att with the dropout's mask, if any)
    gemm_batched(CUBLAS_OP_N, CUBLAS_OP_N, HS, a.R, T, s.v, HS, a.kv_stride, attention_weights(s, att, B, T, NH, d), T,
                 a.score_stride, s.y, CUDA_R_FLOATX, HS, a.q_stride, a.batch);
    LAUNCH(unpermute_heads_kernel, CEIL_DIV(n, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0, out, s.y, B, T, NH, HS);
}

static void attention_backward_unfused(floatX* dqkv, floatX* scratch, const floatX* dout, const floatX* qkv,
                                       const floatX* att, int B, int T, int NH, int G, int HS, Dropout d) {
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
    // the att array is att^T, op = T gives att (with the dropout's mask drawn again, if any)
    gemm_batched(CUBLAS_OP_N, CUBLAS_OP_T, HS, T, a.R, dy, HS, a.q_stride, attention_weights(s, att, B, T, NH, d), T,
                 a.score_stride, s.dv, CUDA_R_FLOATX, HS, a.kv_stride, a.batch);
    LAUNCH(attention_softmax_backward_kernel, CEIL_DIV(B * NH * T, ROWS_PER_BLOCK), ROW_BLOCK, 0,
           s.dscores, att, datt, 1.0f / sqrtf((float)HS), B * NH * T, T, NH, d);
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

// The keys split over blocks (flash-decoding's split-K, Dao, Haziza, Massa and Sizov 2023): one
// new token has NH (query, head) pairs, a dozen blocks where an H100 has 132 SMs, so each pair's
// keys are cut into `splits` runs of CEIL_DIV(pos0 + n, splits) keys (the longest row's keys;
// a shorter row's last runs may be empty), one block each. Split s of pair p leaves its part in
// partials[p * splits + s]: [m, l, o[0 .. HS)], m the largest score of its keys, l the sum of
// exp(score - m) and o the sum of exp(score - m) v (not divided by l); an empty run m = -inf,
// l = 0, o = 0. The merge (attention_decode_merge_kernel) is the log-sum-exp combination of
// context parallelism's blocks (attention_blocks.cuh): with M = max_s m_s and w_s = exp(m_s - M),
//   out = sum_s w_s o_s / sum_s w_s l_s,
// in split order (the same bits every run). One split (a prompt's chunk of many rows fills the
// GPU by itself) writes out directly: no partials, no merge.
// The rule (decode_splits): blocks to fill the SMs twice, CEIL_DIV(2 x SMs, n x NH) splits, but
// at least DECODE_SPLIT_KEYS keys a split (8 a warp: fewer and the block's fixed costs, the
// query's load and the merges, outweigh its keys) and at most DECODE_MAX_SPLITS. Then a pair
// has more than one split only when n x NH < 2 x SMs, so n x NH x splits < 4 x SMs: the
// partials need at most 4 x SMs parts (DECODE_PARTS).
#define DECODE_BLOCK 256
#define DECODE_DIMS 8
#define DECODE_SPLIT_KEYS 64
#define DECODE_MAX_SPLITS 64
#define DECODE_PARTS(sms) (4 * (size_t)(sms))
#define DECODE_PART_FLOATS (32 * DECODE_DIMS + 2)   // a part: m, l, and o of the largest head size
static int decode_splits(int keys, int pairs, int sms) {
    int fill = CEIL_DIV(2 * sms, pairs), most = CEIL_DIV(keys, DECODE_SPLIT_KEYS);
    int splits = fill < most ? fill : most;
    return splits < 1 ? 1 : splits > DECODE_MAX_SPLITS ? DECODE_MAX_SPLITS : splits;
}

// One block of DECODE_BLOCK threads per (query i, head h, split s). Warp w takes the split's keys
// first + w, first + w + warps, ...; its lanes split the head's dimensions (DECODE_DIMS each: HS
// <= 32 x DECODE_DIMS), sum the score with a warp reduction, and keep an online softmax (Milakov
// and Gimelshein 2018): the running maximum m, the sum l of exp(score - m) and the output o,
// rescaled by exp(m_old - m) when m grows. The block then merges its warps' (m, l, o): each
// warp's weighed by exp(m - the block's maximum), a warp without keys (m = -inf) by 0, o summed
// over the warps in warp order, lane by lane (block_sum_over_warps).
__global__ void attention_decode_kernel(floatX* out, float* partials, const floatX* cache, const floatX* qkv, int n,
                                        int pos0, int NH, int G, int HS, Alibi alibi, int splits) {
    int s = blockIdx.x % splits, pair = blockIdx.x / splits, i = pair / NH, h = pair % NH, t = pos0 + i, g = h / (NH / G);
    int chunk = CEIL_DIV(pos0 + n, splits), first = s * chunk, end = first + chunk < t + 1 ? first + chunk : t + 1;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const floatX* q = qkv + qkv_index(0, i, h, 0, n, NH, G, HS);
    float scale = 1.0f / sqrtf((float)HS), qr[DECODE_DIMS], o[DECODE_DIMS], m = -INFINITY, l = 0.0f;
    for (int k = 0; k < DECODE_DIMS; k++) {
        int d = lane + 32 * k;
        qr[k] = d < HS ? floatX_to_float(q[d]) : 0.0f;
        o[k] = 0.0f;
    }
    for (int t2 = first + warp; t2 < end; t2 += warps) {   // the same keys for every lane of the warp
        const floatX* key = cache + kv_cache_index(t2, g, 0, G, HS);
        const floatX* value = cache + kv_cache_index(t2, g, 1, G, HS);
        float score = 0.0f;
        for (int k = 0; k < DECODE_DIMS; k++)
            if (lane + 32 * k < HS) score += qr[k] * floatX_to_float(key[lane + 32 * k]);
        score = warp_reduce_sum(score) * scale + alibi_bias(alibi, h, t, t2);
        float m_new = fmaxf(m, score), rescale = expf(m - m_new), w = expf(score - m_new);
        l = l * rescale + w;
        for (int k = 0; k < DECODE_DIMS; k++)
            if (lane + 32 * k < HS) o[k] = o[k] * rescale + w * floatX_to_float(value[lane + 32 * k]);
        m = m_new;
    }
    float block_max = block_reduce_max(m), weight = m == -INFINITY ? 0.0f : expf(m - block_max);
    float sum = block_reduce_sum(lane == 0 ? l * weight : 0.0f);
    float* part = partials + ((size_t)pair * splits + s) * (HS + 2);
    if (splits > 1 && threadIdx.x == 0) part[0] = block_max, part[1] = sum;
    for (int k = 0; k < DECODE_DIMS && 32 * k < HS; k++) {   // (the same trips in every thread)
        float v = block_sum_over_warps(o[k] * weight);
        int d = lane + 32 * k;
        if (warp != 0 || d >= HS) continue;
        if (splits > 1) part[2 + d] = v;
        else out[(size_t)pair * HS + d] = to_floatX(v / sum);   // (key 0 is in the one split: sum > 0)
    }
}

// one thread per element of out[n, NH, HS]: the pair's splits merged by their maxima (above)
__global__ void attention_decode_merge_kernel(floatX* out, const float* partials, int pairs, int HS, int splits) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)pairs * HS) return;
    int pair = (int)(idx / HS), d = (int)(idx % HS);
    const float* parts = partials + (size_t)pair * splits * (HS + 2);
    float M = -INFINITY, sum = 0.0f, o = 0.0f;
    for (int s = 0; s < splits; s++) M = fmaxf(M, parts[(size_t)s * (HS + 2)]);   // finite: split 0 holds key 0
    for (int s = 0; s < splits; s++) {
        const float* part = parts + (size_t)s * (HS + 2);
        float w = part[0] == -INFINITY ? 0.0f : expf(part[0] - M);
        sum += w * part[1];
        o += w * part[2 + d];
    }
    out[idx] = to_floatX(o / sum);
}

static void kv_cache_append(floatX* cache, const floatX* qkv, int n, int pos0, int NH, int G, int HS) {
    LAUNCH(kv_cache_append_kernel, CEIL_DIV((size_t)n * 2 * G * HS, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0,
           cache, qkv, n, pos0, NH, G, HS);
}

// the SMs decode_splits fills; the partials (DECODE_PARTS of them), allocated at the first call
// and kept (kernels_free frees them): not in the memory plan, as the KV cache is not
static int decode_sms;
static void decode_partials_init(void) {
    if (decode_partials) return;
    int device;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&decode_sms, cudaDevAttrMultiProcessorCount, device));
    decode_partials = (float*)dev_malloc(DECODE_PARTS(decode_sms) * DECODE_PART_FLOATS * sizeof(float));
}

// attention_decode in `splits` splits a pair (tests may choose them; at most DECODE_PARTS in all)
static void attention_decode_split(floatX* out, const floatX* cache, const floatX* qkv, int n, int pos0, int NH, int G,
                                   int HS, Alibi alibi, int splits) {
    if (HS > 32 * DECODE_DIMS) fail("attention_decode: head size %d, above %d", HS, 32 * DECODE_DIMS);
    decode_partials_init();
    if (splits > 1 && (size_t)n * NH * splits > DECODE_PARTS(decode_sms))
        fail("attention_decode: %d x %d pairs in %d splits, more than the %zu parts", n, NH, splits, DECODE_PARTS(decode_sms));
    LAUNCH(attention_decode_kernel, n * NH * splits, DECODE_BLOCK, 0, out, decode_partials, cache, qkv, n, pos0, NH, G,
           HS, alibi, splits);
    if (splits > 1)
        LAUNCH(attention_decode_merge_kernel, CEIL_DIV((size_t)n * NH * HS, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0, out,
               decode_partials, n * NH, HS, splits);
}

static void attention_decode(floatX* out, const floatX* cache, const floatX* qkv, int n, int pos0, int NH, int G, int HS,
                             Alibi alibi) {
    decode_partials_init();
    attention_decode_split(out, cache, qkv, n, pos0, NH, G, HS, alibi, decode_splits(pos0 + n, n * NH, decode_sms));
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
