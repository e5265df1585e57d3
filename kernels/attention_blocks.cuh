/*
kernels/attention_blocks.cuh — causal attention one block at a time, the kernels of context
parallelism (ring attention): a rank's queries against one block of keys and values, each
block's partial output and log-sum-exp merged into an accumulator, and the backward block by
block from the merged log-sum-exp. Each op: its C reference, then its CUDA twin.

The decomposition (Liu, Zaharia and Abbeel 2023, "Ring Attention with Blockwise Transformers";
the online softmax of Milakov and Gimelshein 2018, as FlashAttention merges its tiles): context
parallelism over C ranks cuts each sequence into 2C chunks and gives rank r chunks r and
2C-1-r, one early and one late, so that every rank has the same share of the causal triangle.
A rank's attention is a sum over blocks: some of its query rows (an AttentionBlock's, at their
GLOBAL positions) against the keys and values of one chunk, its own or one that came from
another rank around the ring. The causal mask compares global positions, so a block is whole
(every key before every query), a triangle, or empty; a query row that sees no key of a block
gets out 0 and lse -inf there, which the merge leaves out.
  forward:  attention_accumulator_clear; per block attention_block_forward into a partial
            (out, lse) and attention_merge of it into the accumulator; attention_output_rows
            rounds the accumulated output to floatX, once.
  backward: attention_rows_dot (D = rowsum(dout * out), FlashAttention-2's); per block
            attention_block_backward, which recomputes the block's probabilities from the FINAL
            (merged) lse, P = exp(s - lse), and adds into dq (the queries' rank) and dkv (the
            block's owner's, sent back around the ring); attention_block_gradients_into_qkv
            writes both into qkv's layout, rounded once.
Which blocks, in which order, and the ring's sends and receives are context_parallel.h's; this
file only computes.

Why simple kernels: the fused FlashAttention kernels of flash_attention.cuh take one whole causal
sequence (tiles from row 0, the diagonal where query row = key row); generalizing them to blocks
at offsets (a diagonal anywhere or nowhere, q_count != kv_count) is future work. Here a warp
takes one query row (the forward, dq) or one key (dk, dv); its lanes split the head's dims
(lane l: dims l, l + 32, ...), a warp reduction sums each dot product, one key or query at a
time. fp32 math, no tensor cores, no shared memory, no atomics; every sum in a fixed order (dq
over the keys in order; dk and dv over the group's heads in order, then the queries in order),
so that two runs give the same bits.

Layouts (B sequences; NH query heads in G groups, each group's NH/G heads sharing one key and
value head; head size HS):
  qkv   floatX [B * q_rows, (NH + 2G) HS]  attention.cuh's grouped layout (qkv_index, T = q_rows):
                                          only the q slots are read
  kv    floatX [B * kv_rows, 2 G HS]      the KV cache's row: G keys side by side, then G values;
                                          kv_cache_append(kv, qkv, B * rows, 0, NH, G, HS) packs it
  out   float  [B * q_rows, NH HS]        partial or accumulated (heads side by side)
  lse   float  [B, NH, q_rows]            natural log; D the same shape
  dout  floatX [B * q_rows, NH HS]
  dq    float  [B * q_rows, NH HS];  dkv float [B * kv_rows, 2 G HS] (kv's layout)

Included by kernels.cuh, the index of kernels/: the conventions every kernel keeps are there.
*/
#pragma once

// ----------------------------------------------------------------------------
// a block: B sequences; in each, query rows [q_first, q_first + q_count) of a buffer of q_rows
// rows a sequence against key rows [kv_first, kv_first + kv_count) of one of kv_rows rows a
// sequence. Query row q_first + i is at global position q_pos + i, key row kv_first + j at
// kv_pos + j; the query sees the key iff kv_pos + j <= q_pos + i (causal, in global positions).
typedef struct {
    int B;
    int q_rows, kv_rows;
    int q_first, kv_first;
    int q_count, kv_count;
    int q_pos, kv_pos;
} AttentionBlock;

// query i sees keys 0 .. block_visible_keys - 1 of the block
HOST_DEVICE static inline int block_visible_keys(AttentionBlock blk, int i) {
    int n = blk.q_pos + i - blk.kv_pos + 1;
    return n < 0 ? 0 : n > blk.kv_count ? blk.kv_count : n;
}

// key j is seen by queries block_first_query .. q_count - 1
HOST_DEVICE static inline int block_first_query(AttentionBlock blk, int j) {
    int i = blk.kv_pos + j - blk.q_pos;
    return i < 0 ? 0 : i > blk.q_count ? blk.q_count : i;
}

// query i's row of the [B * q_rows, ...] buffers, key j's of the [B * kv_rows, ...] ones
HOST_DEVICE static inline size_t block_q_row(AttentionBlock blk, int b, int i) {
    return (size_t)b * blk.q_rows + blk.q_first + i;
}
HOST_DEVICE static inline size_t block_kv_row(AttentionBlock blk, int b, int j) {
    return (size_t)b * blk.kv_rows + blk.kv_first + j;
}

// query i of head h: its entry of lse or D [B, NH, q_rows], its head's offset in out, dout, dq
HOST_DEVICE static inline size_t block_stat_index(AttentionBlock blk, int b, int h, int i, int NH) {
    return ((size_t)b * NH + h) * blk.q_rows + blk.q_first + i;
}
HOST_DEVICE static inline size_t block_out_index(AttentionBlock blk, int b, int h, int i, int NH, int HS) {
    return (block_q_row(blk, b, i) * NH + h) * HS;
}

// Merging two log-sum-exps a and c (a block's into the accumulator's): the new one, and the
// weights exp(a - new), exp(c - new) of the two outputs. Neither may be -inf both.
HOST_DEVICE static inline float lse_merge(float a, float c, float* weight_a, float* weight_c) {
    float m = fmaxf(a, c), merged = m + logf(expf(a - m) + expf(c - m));
    *weight_a = expf(a - merged);
    *weight_c = expf(c - merged);
    return merged;
}

// One (query, key) pair of the backward from its dot products q.k and dout.v: P = exp(s - lse)
// with s = q.k scale + bias; dS = P (f dout.v - D) scale (f the dropout's factor). Returns P f,
// the weight of dout in dv.
HOST_DEVICE static inline float block_pair_gradient(float qk, float dov, float scale, float bias, float lse, float D,
                                                    float f, float* ds) {
    float p = expf(qk * scale + bias - lse);
    *ds = p * (f * dov - D) * scale;
    return p * f;
}

// ----------------------------------------------------------------------------
// the forward of a block: out_i = sum_j p_ij f_ij v_j, p = softmax over the visible keys of
// s_ij = q_i.k_j / sqrt(HS) + ALiBi's bias, f_ij the attention dropout's factor (attention.cuh's
// mask, at global positions); lse_i = log sum_j exp(s_ij). The softmax's sum is of p, not of
// p f, as attention_forward_cpu's. Writes the block's query rows only.

// C: two passes over a row's keys, their largest score (a stable softmax), then the weights and
// the weighted values (attention_decode_cpu's way); no scratch
static void attention_block_forward_cpu(float* out, float* lse, const float* qkv, const float* kv, AttentionBlock blk,
                                        int NH, int G, int HS, Alibi alibi, Dropout d) {
    const float scale = 1.0f / sqrtf((float)HS);
    #pragma omp parallel for collapse(3)
    for (int b = 0; b < blk.B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < blk.q_count; i++) {
                int g = h / (NH / G), keys = block_visible_keys(blk, i), qpos = blk.q_pos + i;
                uint64_t head_key = d.threshold ? dropout_head_key(&d, b, h) : 0;
                const float* q = qkv + qkv_index(b, blk.q_first + i, h, 0, blk.q_rows, NH, G, HS);
                float* o = out + block_out_index(blk, b, h, i, NH, HS);
                float maxval = -INFINITY, sum = 0.0f;
                for (int j = 0; j < keys; j++) {
                    const float* k = kv + kv_cache_index(block_kv_row(blk, b, j), g, 0, G, HS);
                    maxval = fmaxf(maxval, dot_lanes(q, k, HS) * scale + alibi_bias(alibi, h, qpos, blk.kv_pos + j));
                }
                for (int e = 0; e < HS; e++) o[e] = 0.0f;
                for (int j = 0; j < keys; j++) {
                    const float* k = kv + kv_cache_index(block_kv_row(blk, b, j), g, 0, G, HS);
                    const float* v = kv + kv_cache_index(block_kv_row(blk, b, j), g, 1, G, HS);
                    float w = expf(dot_lanes(q, k, HS) * scale + alibi_bias(alibi, h, qpos, blk.kv_pos + j) - maxval);
                    sum += w;
                    axpy_lanes(o, w * attention_dropout_factor(head_key, qpos, blk.kv_pos + j, &d), v, HS);
                }
                for (int e = 0; e < HS && keys > 0; e++) o[e] /= sum;
                lse[block_stat_index(blk, b, h, i, NH)] = keys > 0 ? maxval + logf(sum) : -INFINITY;
            }
}

#ifdef __CUDACC__
// A warp's share of a head's vector: lane l holds dims l, l + 32, ... (DECODE_DIMS of them, so
// HS <= 32 x DECODE_DIMS, as attention_decode); dims past HS are 0, so that sums need no bound.
__device__ void head_to_lanes(float* x, const floatX* p, int HS) {
    for (int k = 0, lane = threadIdx.x % 32; k < DECODE_DIMS; k++)
        x[k] = lane + 32 * k < HS ? floatX_to_float(p[lane + 32 * k]) : 0.0f;
}
__device__ void head_to_lanes(float* x, const float* p, int HS) {
    for (int k = 0, lane = threadIdx.x % 32; k < DECODE_DIMS; k++) x[k] = lane + 32 * k < HS ? p[lane + 32 * k] : 0.0f;
}
__device__ void head_from_lanes(float* p, const float* x, int HS) {
    for (int k = 0, lane = threadIdx.x % 32; k < DECODE_DIMS; k++)
        if (lane + 32 * k < HS) p[lane + 32 * k] = x[k];
}

// the dot product of two heads held by the warp's lanes; every lane gets it
__device__ float warp_head_dot(const float* x, const float* y) {
    float s = 0.0f;
    for (int k = 0; k < DECODE_DIMS; k++) s += x[k] * y[k];
    return warp_reduce_sum(s);
}

// One warp per (b, h, query i): an online softmax over the visible keys (attention_decode_kernel's
// within one warp): the running maximum m, the sum l of exp(s - m) and the output o, rescaled by
// exp(m_old - m) when m grows.
__global__ void attention_block_forward_kernel(float* out, float* lse, const floatX* qkv, const floatX* kv,
                                               AttentionBlock blk, int NH, int G, int HS, Alibi alibi, Dropout d) {
    size_t row = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;   // (b * NH + h) * q_count + i
    if (row >= (size_t)blk.B * NH * blk.q_count) return;   // the whole warp
    int i = (int)(row % blk.q_count), h = (int)(row / blk.q_count % NH), b = (int)(row / blk.q_count / NH);
    int g = h / (NH / G), keys = block_visible_keys(blk, i), qpos = blk.q_pos + i;
    uint64_t head_key = d.threshold ? dropout_head_key(&d, b, h) : 0;
    float scale = 1.0f / sqrtf((float)HS), q[DECODE_DIMS], k[DECODE_DIMS], v[DECODE_DIMS], o[DECODE_DIMS];
    float m = -INFINITY, l = 0.0f;
    head_to_lanes(q, qkv + qkv_index(b, blk.q_first + i, h, 0, blk.q_rows, NH, G, HS), HS);
    for (int e = 0; e < DECODE_DIMS; e++) o[e] = 0.0f;
    for (int j = 0; j < keys; j++) {
        head_to_lanes(k, kv + kv_cache_index(block_kv_row(blk, b, j), g, 0, G, HS), HS);
        head_to_lanes(v, kv + kv_cache_index(block_kv_row(blk, b, j), g, 1, G, HS), HS);
        float s = warp_head_dot(q, k) * scale + alibi_bias(alibi, h, qpos, blk.kv_pos + j);
        float m_new = fmaxf(m, s), rescale = expf(m - m_new), w = expf(s - m_new);
        float wf = w * attention_dropout_factor(head_key, qpos, blk.kv_pos + j, &d);
        l = l * rescale + w;
        for (int e = 0; e < DECODE_DIMS; e++) o[e] = o[e] * rescale + wf * v[e];
        m = m_new;
    }
    for (int e = 0; e < DECODE_DIMS; e++) o[e] = keys > 0 ? o[e] / l : 0.0f;
    head_from_lanes(out + block_out_index(blk, b, h, i, NH, HS), o, HS);
    if (threadIdx.x % 32 == 0) lse[block_stat_index(blk, b, h, i, NH)] = keys > 0 ? m + logf(l) : -INFINITY;
}

static void attention_block_forward(float* out, float* lse, const floatX* qkv, const floatX* kv, AttentionBlock blk,
                                    int NH, int G, int HS, Alibi alibi, Dropout d) {
    if (HS > 32 * DECODE_DIMS) fail("attention_block_forward: head size %d, above %d", HS, 32 * DECODE_DIMS);
    LAUNCH(attention_block_forward_kernel, CEIL_DIV((size_t)blk.B * NH * blk.q_count, ROWS_PER_BLOCK), ROW_BLOCK, 0,
           out, lse, qkv, kv, blk, NH, G, HS, alibi, d);
}
#else
#define attention_block_forward attention_block_forward_cpu
#endif

// ----------------------------------------------------------------------------
// the accumulator: out [B * rows, NH HS] and lse [B, NH, rows], which the caller fills with out
// 0, lse -inf before the first block (attention_accumulator_clear); then each block's partial
// merged in by their log-sum-exps: lse_new = logaddexp(lse_acc, lse), out_acc = exp(lse_acc -
// lse_new) out_acc + exp(lse - lse_new) out, over the block's query rows. A row the block gave
// nothing (lse -inf) is left as it is.

static void attention_accumulator_clear_cpu(float* out, float* lse, int B, int rows, int NH, int HS) {
    for (size_t n = 0; n < (size_t)B * rows * NH * HS; n++) out[n] = 0.0f;
    for (size_t n = 0; n < (size_t)B * NH * rows; n++) lse[n] = -INFINITY;
}

static void attention_merge_cpu(float* out_acc, float* lse_acc, const float* out, const float* lse, AttentionBlock blk,
                                int NH, int HS) {
    #pragma omp parallel for collapse(3)
    for (int b = 0; b < blk.B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < blk.q_count; i++) {
                size_t s = block_stat_index(blk, b, h, i, NH), at = block_out_index(blk, b, h, i, NH, HS);
                if (lse[s] == -INFINITY) continue;   // the block gave this row nothing
                float w_acc, w;
                lse_acc[s] = lse_merge(lse_acc[s], lse[s], &w_acc, &w);
                for (int e = 0; e < HS; e++) out_acc[at + e] = w_acc * out_acc[at + e] + w * out[at + e];
            }
}

// the accumulated output rounded to floatX, n elements
static void attention_output_rows_cpu(float* out, const float* acc, size_t n) {
    for (size_t e = 0; e < n; e++) out[e] = acc[e];
}

#ifdef __CUDACC__
// one thread per element of out or of lse
__global__ void attention_accumulator_clear_kernel(float* out, float* lse, size_t n_out, size_t n_lse) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n_out) out[idx] = 0.0f;
    if (idx < n_lse) lse[idx] = -INFINITY;
}

// One thread per element of the block's out rows, from the two lse, which the next kernel
// (one thread a row) then merges: a thread of this one may still read lse_acc.
__global__ void attention_merge_out_kernel(float* out_acc, const float* lse_acc, const float* out, const float* lse,
                                           AttentionBlock blk, int NH, int HS) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;   // ((b * q_count + i) * NH + h) * HS + e
    if (idx >= (size_t)blk.B * blk.q_count * NH * HS) return;
    int e = (int)(idx % HS), h = (int)(idx / HS % NH), i = (int)(idx / HS / NH % blk.q_count);
    int b = (int)(idx / HS / NH / blk.q_count);
    size_t s = block_stat_index(blk, b, h, i, NH), at = block_out_index(blk, b, h, i, NH, HS) + e;
    if (lse[s] == -INFINITY) return;
    float w_acc, w;
    lse_merge(lse_acc[s], lse[s], &w_acc, &w);
    out_acc[at] = w_acc * out_acc[at] + w * out[at];
}

__global__ void attention_merge_lse_kernel(float* lse_acc, const float* lse, AttentionBlock blk, int NH) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;   // (b * NH + h) * q_count + i
    if (idx >= (size_t)blk.B * NH * blk.q_count) return;
    int i = (int)(idx % blk.q_count), h = (int)(idx / blk.q_count % NH), b = (int)(idx / blk.q_count / NH);
    size_t s = block_stat_index(blk, b, h, i, NH);
    float w_acc, w;
    if (lse[s] != -INFINITY) lse_acc[s] = lse_merge(lse_acc[s], lse[s], &w_acc, &w);
}

// one thread per pack of X128 elements
__global__ void attention_output_rows_kernel(floatX* out, const float* acc, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * X128;
    if (i >= n) return;
    x128 v = zero_pack();
    for (int k = 0; k < pack_count(i, n); k++) v.e[k] = to_floatX(acc[i + k]);
    store_pack(out + i, v, pack_count(i, n));
}

static void attention_accumulator_clear(float* out, float* lse, int B, int rows, int NH, int HS) {
    size_t n_out = (size_t)B * rows * NH * HS, n_lse = (size_t)B * NH * rows;
    LAUNCH(attention_accumulator_clear_kernel, CEIL_DIV(n_out > n_lse ? n_out : n_lse, ELEMENTWISE_BLOCK),
           ELEMENTWISE_BLOCK, 0, out, lse, n_out, n_lse);
}

static void attention_merge(float* out_acc, float* lse_acc, const float* out, const float* lse, AttentionBlock blk,
                            int NH, int HS) {
    LAUNCH(attention_merge_out_kernel, CEIL_DIV((size_t)blk.B * blk.q_count * NH * HS, ELEMENTWISE_BLOCK),
           ELEMENTWISE_BLOCK, 0, out_acc, lse_acc, out, lse, blk, NH, HS);
    LAUNCH(attention_merge_lse_kernel, CEIL_DIV((size_t)blk.B * NH * blk.q_count, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK,
           0, lse_acc, lse, blk, NH);
}

static void attention_output_rows(floatX* out, const float* acc, size_t n) {
    LAUNCH(attention_output_rows_kernel, CEIL_DIV(CEIL_DIV(n, X128), ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0, out, acc, n);
}
#else
#define attention_accumulator_clear attention_accumulator_clear_cpu
#define attention_merge attention_merge_cpu
#define attention_output_rows attention_output_rows_cpu
#endif

// ----------------------------------------------------------------------------
// the backward of a block, from the final output and lse
// D[(b NH + h) T + t] = dout[b, t, h] . out[b, t, h] (out: the final floatX output). Then, ADDED
// (+=) into the block's rows of dq and dkv, with P_ij = exp(s_ij - lse_i) and f as the forward's:
//   dv_j += sum_i P_ij f_ij dout_i;  dP_ij = f_ij dout_i . v_j;  dS_ij = P_ij (dP_ij - D_i) / sqrt(HS);
//   dq_i += sum_j dS_ij k_j;  dk_j += sum_i dS_ij q_i;
// a group's dk and dv summed over its NH/G heads. dq adds over the keys in order; dk and dv over
// the group's heads in order, then the queries in order.

static void attention_rows_dot_cpu(float* D, const float* dout, const float* out, int B, int T, int NH, int HS) {
    #pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                size_t at = ((size_t)(b * T + t) * NH + h) * HS;
                D[((size_t)b * NH + h) * T + t] = dot_lanes(dout + at, out + at, HS);
            }
}

// dq: one (b, h, query) an iteration, over the keys it sees
static void block_backward_dq_cpu(float* dq, const float* dout, const float* D, const float* lse, const float* qkv,
                                  const float* kv, AttentionBlock blk, int NH, int G, int HS, Alibi alibi, Dropout d) {
    const float scale = 1.0f / sqrtf((float)HS);
    #pragma omp parallel for collapse(3)
    for (int b = 0; b < blk.B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < blk.q_count; i++) {
                int g = h / (NH / G), keys = block_visible_keys(blk, i), qpos = blk.q_pos + i;
                uint64_t head_key = d.threshold ? dropout_head_key(&d, b, h) : 0;
                size_t s = block_stat_index(blk, b, h, i, NH), at = block_out_index(blk, b, h, i, NH, HS);
                const float* q = qkv + qkv_index(b, blk.q_first + i, h, 0, blk.q_rows, NH, G, HS);
                for (int j = 0; j < keys; j++) {
                    const float* k = kv + kv_cache_index(block_kv_row(blk, b, j), g, 0, G, HS);
                    const float* v = kv + kv_cache_index(block_kv_row(blk, b, j), g, 1, G, HS);
                    int kpos = blk.kv_pos + j;
                    float ds;
                    block_pair_gradient(dot_lanes(q, k, HS), dot_lanes(dout + at, v, HS), scale,
                                        alibi_bias(alibi, h, qpos, kpos), lse[s], D[s],
                                        attention_dropout_factor(head_key, qpos, kpos, &d), &ds);
                    axpy_lanes(dq + at, ds, k, HS);
                }
            }
}

// dk, dv: one (b, group, key) an iteration, over the group's heads and the queries that see it
static void block_backward_dkv_cpu(float* dkv, const float* dout, const float* D, const float* lse, const float* qkv,
                                   const float* kv, AttentionBlock blk, int NH, int G, int HS, Alibi alibi, Dropout d) {
    const float scale = 1.0f / sqrtf((float)HS);
    #pragma omp parallel for collapse(3)
    for (int b = 0; b < blk.B; b++)
        for (int g = 0; g < G; g++)
            for (int j = 0; j < blk.kv_count; j++) {
                size_t row = block_kv_row(blk, b, j);
                const float *k = kv + kv_cache_index(row, g, 0, G, HS), *v = kv + kv_cache_index(row, g, 1, G, HS);
                float *dk = dkv + kv_cache_index(row, g, 0, G, HS), *dv = dkv + kv_cache_index(row, g, 1, G, HS);
                int kpos = blk.kv_pos + j;
                for (int h = g * (NH / G); h < (g + 1) * (NH / G); h++) {
                    uint64_t head_key = d.threshold ? dropout_head_key(&d, b, h) : 0;
                    for (int i = block_first_query(blk, j); i < blk.q_count; i++) {
                        size_t s = block_stat_index(blk, b, h, i, NH), at = block_out_index(blk, b, h, i, NH, HS);
                        const float* q = qkv + qkv_index(b, blk.q_first + i, h, 0, blk.q_rows, NH, G, HS);
                        int qpos = blk.q_pos + i;
                        float ds, pf = block_pair_gradient(dot_lanes(q, k, HS), dot_lanes(dout + at, v, HS), scale,
                                                           alibi_bias(alibi, h, qpos, kpos), lse[s], D[s],
                                                           attention_dropout_factor(head_key, qpos, kpos, &d), &ds);
                        axpy_lanes(dv, pf, dout + at, HS);
                        axpy_lanes(dk, ds, q, HS);
                    }
                }
            }
}

static void attention_block_backward_cpu(float* dq, float* dkv, const float* dout, const float* D, const float* lse,
                                         const float* qkv, const float* kv, AttentionBlock blk, int NH, int G, int HS,
                                         Alibi alibi, Dropout d) {
    block_backward_dq_cpu(dq, dout, D, lse, qkv, kv, blk, NH, G, HS, alibi, d);
    block_backward_dkv_cpu(dkv, dout, D, lse, qkv, kv, blk, NH, G, HS, alibi, d);
}

// dqkv's n rows (qkv's layout) from dq [n, NH HS] (the q slots) and dkv [n, 2 G HS] (k and v)
static void attention_block_gradients_into_qkv_cpu(float* dqkv, const float* dq, const float* dkv, int n, int NH, int G,
                                                   int HS) {
    int per = NH / G;
    #pragma omp parallel for collapse(2)
    for (int r = 0; r < n; r++)
        for (int g = 0; g < G; g++)
            for (int slot = 0; slot < per + 2; slot++) {
                float* dst = dqkv + qkv_group_index(0, r, g, slot, n, NH, G, HS);
                const float* src = slot < per ? dq + ((size_t)r * NH + g * per + slot) * HS
                                              : dkv + kv_cache_index(r, g, slot - per, G, HS);
                for (int e = 0; e < HS; e++) dst[e] = src[e];
            }
}

#ifdef __CUDACC__
// One warp per (b, h, query i): q, dout and the dq row in the lanes, the keys it sees in order.
__global__ void attention_block_backward_dq_kernel(float* dq, const floatX* dout, const float* D, const float* lse,
                                                   const floatX* qkv, const floatX* kv, AttentionBlock blk, int NH,
                                                   int G, int HS, Alibi alibi, Dropout d) {
    size_t row = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;   // (b * NH + h) * q_count + i
    if (row >= (size_t)blk.B * NH * blk.q_count) return;   // the whole warp
    int i = (int)(row % blk.q_count), h = (int)(row / blk.q_count % NH), b = (int)(row / blk.q_count / NH);
    int g = h / (NH / G), keys = block_visible_keys(blk, i), qpos = blk.q_pos + i;
    uint64_t head_key = d.threshold ? dropout_head_key(&d, b, h) : 0;
    size_t s = block_stat_index(blk, b, h, i, NH), at = block_out_index(blk, b, h, i, NH, HS);
    float scale = 1.0f / sqrtf((float)HS), q[DECODE_DIMS], dout_i[DECODE_DIMS], k[DECODE_DIMS], v[DECODE_DIMS];
    float acc[DECODE_DIMS], lse_i = lse[s], D_i = D[s];
    head_to_lanes(q, qkv + qkv_index(b, blk.q_first + i, h, 0, blk.q_rows, NH, G, HS), HS);
    head_to_lanes(dout_i, dout + at, HS);
    head_to_lanes(acc, dq + at, HS);
    for (int j = 0; j < keys; j++) {
        head_to_lanes(k, kv + kv_cache_index(block_kv_row(blk, b, j), g, 0, G, HS), HS);
        head_to_lanes(v, kv + kv_cache_index(block_kv_row(blk, b, j), g, 1, G, HS), HS);
        int kpos = blk.kv_pos + j;
        float ds;
        block_pair_gradient(warp_head_dot(q, k), warp_head_dot(dout_i, v), scale, alibi_bias(alibi, h, qpos, kpos),
                            lse_i, D_i, attention_dropout_factor(head_key, qpos, kpos, &d), &ds);
        for (int e = 0; e < DECODE_DIMS; e++) acc[e] += ds * k[e];
    }
    head_from_lanes(dq + at, acc, HS);
}

// One warp per (b, group g, key j): k, v and their gradients in the lanes, the group's heads in
// order, each head's queries that see the key in order.
__global__ void attention_block_backward_dkv_kernel(float* dkv, const floatX* dout, const float* D, const float* lse,
                                                    const floatX* qkv, const floatX* kv, AttentionBlock blk, int NH,
                                                    int G, int HS, Alibi alibi, Dropout d) {
    size_t id = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;   // (b * G + g) * kv_count + j
    if (id >= (size_t)blk.B * G * blk.kv_count) return;   // the whole warp
    int j = (int)(id % blk.kv_count), g = (int)(id / blk.kv_count % G), b = (int)(id / blk.kv_count / G);
    int kpos = blk.kv_pos + j;
    size_t row = block_kv_row(blk, b, j);
    float scale = 1.0f / sqrtf((float)HS), k[DECODE_DIMS], v[DECODE_DIMS], dk[DECODE_DIMS], dv[DECODE_DIMS];
    float q[DECODE_DIMS], dout_i[DECODE_DIMS];
    head_to_lanes(k, kv + kv_cache_index(row, g, 0, G, HS), HS);
    head_to_lanes(v, kv + kv_cache_index(row, g, 1, G, HS), HS);
    head_to_lanes(dk, dkv + kv_cache_index(row, g, 0, G, HS), HS);
    head_to_lanes(dv, dkv + kv_cache_index(row, g, 1, G, HS), HS);
    for (int h = g * (NH / G); h < (g + 1) * (NH / G); h++) {
        uint64_t head_key = d.threshold ? dropout_head_key(&d, b, h) : 0;
        for (int i = block_first_query(blk, j); i < blk.q_count; i++) {
            size_t s = block_stat_index(blk, b, h, i, NH);
            int qpos = blk.q_pos + i;
            head_to_lanes(q, qkv + qkv_index(b, blk.q_first + i, h, 0, blk.q_rows, NH, G, HS), HS);
            head_to_lanes(dout_i, dout + block_out_index(blk, b, h, i, NH, HS), HS);
            float ds, pf = block_pair_gradient(warp_head_dot(q, k), warp_head_dot(dout_i, v), scale,
                                               alibi_bias(alibi, h, qpos, kpos), lse[s], D[s],
                                               attention_dropout_factor(head_key, qpos, kpos, &d), &ds);
            for (int e = 0; e < DECODE_DIMS; e++) {
                dv[e] += pf * dout_i[e];
                dk[e] += ds * q[e];
            }
        }
    }
    head_from_lanes(dkv + kv_cache_index(row, g, 0, G, HS), dk, HS);
    head_from_lanes(dkv + kv_cache_index(row, g, 1, G, HS), dv, HS);
}

// one thread per element of dqkv's n rows
__global__ void attention_block_gradients_into_qkv_kernel(floatX* dqkv, const float* dq, const float* dkv, int n,
                                                          int NH, int G, int HS) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x, width = (size_t)(NH + 2 * G) * HS;
    if (idx >= (size_t)n * width) return;
    int per = NH / G, r = (int)(idx / width), col = (int)(idx % width), e = col % HS;
    int g = col / HS / (per + 2), slot = col / HS % (per + 2);
    dqkv[idx] = to_floatX(slot < per ? dq[((size_t)r * NH + g * per + slot) * HS + e]
                                     : dkv[kv_cache_index(r, g, slot - per, G, HS) + e]);
}

// D: the fused backward's kernel, a warp per row (no counters to zero: count 0)
static void attention_rows_dot(float* D, const floatX* dout, const floatX* out, int B, int T, int NH, int HS) {
    LAUNCH(attention_backward_flash_d_kernel, CEIL_DIV((size_t)B * NH * T, ROWS_PER_BLOCK), ROW_BLOCK, 0,
           D, (unsigned*)NULL, 0, dout, out, B, T, NH, HS);
}

static void attention_block_backward(float* dq, float* dkv, const floatX* dout, const float* D, const float* lse,
                                     const floatX* qkv, const floatX* kv, AttentionBlock blk, int NH, int G, int HS,
                                     Alibi alibi, Dropout d) {
    if (HS > 32 * DECODE_DIMS) fail("attention_block_backward: head size %d, above %d", HS, 32 * DECODE_DIMS);
    LAUNCH(attention_block_backward_dq_kernel, CEIL_DIV((size_t)blk.B * NH * blk.q_count, ROWS_PER_BLOCK), ROW_BLOCK, 0,
           dq, dout, D, lse, qkv, kv, blk, NH, G, HS, alibi, d);
    LAUNCH(attention_block_backward_dkv_kernel, CEIL_DIV((size_t)blk.B * G * blk.kv_count, ROWS_PER_BLOCK), ROW_BLOCK,
           0, dkv, dout, D, lse, qkv, kv, blk, NH, G, HS, alibi, d);
}

static void attention_block_gradients_into_qkv(floatX* dqkv, const float* dq, const float* dkv, int n, int NH, int G,
                                               int HS) {
    LAUNCH(attention_block_gradients_into_qkv_kernel, CEIL_DIV((size_t)n * (NH + 2 * G) * HS, ELEMENTWISE_BLOCK),
           ELEMENTWISE_BLOCK, 0, dqkv, dq, dkv, n, NH, G, HS);
}
#else
#define attention_rows_dot attention_rows_dot_cpu
#define attention_block_backward attention_block_backward_cpu
#define attention_block_gradients_into_qkv attention_block_gradients_into_qkv_cpu
#endif
