/*
kernels/random.cuh — the counter-based generator both builds share (SplitMix64's finalizer as a
hash), dropout's masks drawn from it, and the hidden dropout (dropout_forward, dropout_backward:
the C reference, then its CUDA twin). The attention's dropout draws from the same masks inside
attention.cuh's and flash_attention.cuh's kernels.

Why counter-based: a draw is a pure function of its coordinates, never of a stream a rank has
advanced, so any slice of the work (a tensor rank's heads, a sequence-parallel rank's rows, a
pipeline stage's layers, a data-parallel rank's samples, a recomputed forward, a resumed run)
draws the very bits one process would. A mask is keyed by
  (seed, iteration, layer, site)            dropout_mask, once a call, on the host;
  the sample's global index                 its place in the training data's order (train.c's
                                            consumed samples): no DP size or micro-batch count
                                            changes it;
  the global head (attention)               tensor rank r's local head h is global head
                                            r x heads_local + h;
  (row, column)                             token position and channel (hidden), query and key
                                            position (attention), one 64-bit counter.
An element keeps its value, times 1 / (1 - p), when its draw u (24 bits: [0, 1) in steps of
2^-24) is at least p, as PyTorch's dropout; compared as integers, so that the CPU and the GPU
decide every element alike. Nothing is stored: the backward draws the same mask again.

Included by kernels.cuh, the index of kernels/: the conventions every kernel keeps are there.
*/
#pragma once

// ----------------------------------------------------------------------------
// the generator: SplitMix64's finalizer (Steele, Lea and Flood 2014; Vigna's constants), a
// bijection of 64 bits with full avalanche, used as a hash of a counter. gpt.h's init and the
// sampler use it too.

HOST_DEVICE static inline uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// a key with one more coordinate folded in (the counter hashed first, so that nearby
// counters under nearby keys do not meet)
HOST_DEVICE static inline uint64_t random_key(uint64_t key, uint64_t counter) { return splitmix64(key ^ splitmix64(counter)); }

// ----------------------------------------------------------------------------
// dropout's masks

// what a dropout call's mask is keyed by, and what a kept element is multiplied by
typedef struct {
    uint64_t key;            // dropout_mask's (seed, iteration, layer, site)
    long long sample0;  // the global index of the sample in row block b = 0 (block b: sample0 + b)
    int first_head;          // attention: the global index of this rank's head 0
    unsigned threshold;      // an element whose 24-bit draw is below it is dropped; 0: dropout off
    float scale;             // 1 / (1 - p)
} Dropout;

// the sites of a layer, in the order a forward meets them (a key each)
enum { DROPOUT_EMBEDDING, DROPOUT_ATTENTION_PROBS, DROPOUT_ATTENTION_OUTPUT, DROPOUT_MLP_OUTPUT };

static const Dropout NO_DROPOUT = {0, 0, 0, 0, 1.0f};

// the mask of fraction p at (seed, iteration, layer, site); layer -1: the embedding's
static Dropout dropout_mask(float p, uint64_t seed, long long iteration, int layer, int site, long long sample0,
                                int first_head) {
    if (p <= 0.0f) return NO_DROPOUT;
    Dropout d;
    d.key = random_key(random_key(random_key(seed, (uint64_t)iteration), (uint64_t)(layer + 1)), (uint64_t)site);
    d.sample0 = sample0;
    d.first_head = first_head;
    d.threshold = (unsigned)ceil((double)p * 16777216.0);   // u = k 2^-24 >= p  <=>  k >= ceil(p 2^24)
    d.scale = 1.0f / (1.0f - p);
    return d;
}

// the key of sample b of the row block (hidden sites), and of its head h (attention)
HOST_DEVICE static inline uint64_t dropout_sample_key(const Dropout* d, int b) {
    return random_key(d->key, (uint64_t)(d->sample0 + b));
}
HOST_DEVICE static inline uint64_t dropout_head_key(const Dropout* d, int b, int h) {
    return random_key(dropout_sample_key(d, b), (uint64_t)(d->first_head + h));
}

// element (row, col) under a sample's or a head's key: scale if kept, 0 if dropped. One
// finalizer a draw: the key is already mixed, the counter tells the elements apart.
HOST_DEVICE static inline float dropout_factor(uint64_t key, int row, int col, const Dropout* d) {
    uint64_t draw = splitmix64(key ^ ((uint64_t)(unsigned)row << 32 | (unsigned)col));
    return (unsigned)(draw >> 40) >= d->threshold ? d->scale : 0.0f;
}

// ----------------------------------------------------------------------------
// hidden dropout (Megatron-LM's bias-dropout-add, before the residual add; and the embedding's)
// out = inp x the mask's factor, for rows [first_row, first_row + rows) of a [B x T, C]
// activation (first_row: a sequence-parallel rank's first residual row): row r is token
// r % T of sample r / T. In place (out == inp) allowed. The backward is the same product on
// the gradient: the mask drawn again.

static void dropout_forward_cpu(float* out, const float* inp, int rows, int C, int T, int first_row, Dropout d) {
    if (d.threshold == 0) {   // off: a copy at most
        if (out != inp) memcpy(out, inp, (size_t)rows * C * sizeof(float));
        return;
    }
    #pragma omp parallel for
    for (int r = 0; r < rows; r++) {
        int row = first_row + r, t = row % T;
        uint64_t key = dropout_sample_key(&d, row / T);
        for (int c = 0; c < C; c++) out[(size_t)r * C + c] = inp[(size_t)r * C + c] * dropout_factor(key, t, c, &d);
    }
}

static void dropout_backward_cpu(float* dinp, const float* dout, int rows, int C, int T, int first_row, Dropout d) {
    dropout_forward_cpu(dinp, dout, rows, C, T, first_row, d);
}

#ifdef __CUDACC__
// one thread per pack of X128 elements of a row (C a multiple of 8 keeps a pack in one row;
// else one element a thread)
__global__ void dropout_kernel(floatX* out, const floatX* inp, int rows, int C, int T, int first_row, Dropout d) {
    int per = C % X128 == 0 ? X128 : 1, packs = C / per;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)rows * packs) return;
    int r = (int)(idx / packs), c0 = (int)(idx % packs) * per, row = first_row + r;
    uint64_t key = dropout_sample_key(&d, row / T);
    const floatX* in = inp + (size_t)r * C + c0;
    floatX* o = out + (size_t)r * C + c0;
    x128 v = load_pack(in, per);
    for (int k = 0; k < per; k++) v.e[k] = to_floatX(floatX_to_float(v.e[k]) * dropout_factor(key, row % T, c0 + k, &d));
    store_pack(o, v, per);
}

static void dropout_forward(floatX* out, const floatX* inp, int rows, int C, int T, int first_row, Dropout d) {
    if (d.threshold == 0) {
        if (out != inp) dev_copy(out, inp, (size_t)rows * C * sizeof(floatX));
        return;
    }
    size_t threads = (size_t)rows * (C % X128 == 0 ? C / X128 : C);
    LAUNCH(dropout_kernel, CEIL_DIV(threads, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0, out, inp, rows, C, T, first_row, d);
}

static void dropout_backward(floatX* dinp, const floatX* dout, int rows, int C, int T, int first_row, Dropout d) {
    dropout_forward(dinp, dout, rows, C, T, first_row, d);
}
#else
#define dropout_forward dropout_forward_cpu
#define dropout_backward dropout_backward_cpu
#endif
