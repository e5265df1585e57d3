/*
kernels/loss.cuh — the vocab-parallel cross-entropy fused with the softmax: the online
statistics, their rescale to the global maximum, the loss and dlogits in one pass, and all of
it in one kernel where one rank holds the whole vocabulary (crossentropy_forward_fused). Each
op: its C reference, then its CUDA twin.

Included by kernels.cuh, the index of kernels/: the conventions every kernel keeps are there.
*/
#pragma once

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
