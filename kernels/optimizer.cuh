/*
kernels/optimizer.cuh — the step's kernels after the backward: AdamW on this rank's shard
(ShardRange, shard_pieces), the micro-batches' mean loss (loss_mean_add), and the sum of
squares of the global gradient norm (in double, in fixed chunks). Each op: its C reference,
then its CUDA twin.

Included by kernels.cuh, the index of kernels/: the conventions every kernel keeps are there.
*/
#pragma once

// ----------------------------------------------------------------------------
// AdamW (Loshchilov & Hutter 2019), as torch.optim.AdamW and Megatron apply it:
//   g = grad * grad_scale                (grad_scale carries gradient clipping)
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = p - lr * ( (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * p )
// master is the fp32 copy that is updated; param gets the new value in floatX (on the CPU
// build they are the same buffer).

// the constants of one step; bias corrections in double, as PyTorch (1 - 0.999^t loses
// digits in float)
typedef struct {
    float lr, beta1, beta2, eps, weight_decay, grad_scale, bias_correction1, bias_correction2;
} AdamWStep;

static AdamWStep adamw_step(float lr, float beta1, float beta2, float eps, float weight_decay,
                            float grad_scale, int step) {
    AdamWStep s = {lr, beta1, beta2, eps, weight_decay, grad_scale,
                   (float)(1.0 - pow(beta1, step)), (float)(1.0 - pow(beta2, step))};
    return s;
}

// one element, the same on both builds: updates m and v, returns the new master value
HOST_DEVICE static inline float adamw_element(float master, float grad, float* m, float* v, AdamWStep s) {
    float g = grad * s.grad_scale;
    float mi = s.beta1 * *m + (1.0f - s.beta1) * g;
    float vi = s.beta2 * *v + (1.0f - s.beta2) * g * g;
    *m = mi;
    *v = vi;
    float update = (mi / s.bias_correction1) / (sqrtf(vi / s.bias_correction2) + s.eps);
    return master - s.lr * (update + s.weight_decay * master);
}

static void adamw_update_cpu(float* master, float* param, const float* grad, float* m, float* v,
                             size_t n, float lr, float beta1, float beta2, float eps,
                             float weight_decay, float grad_scale, int step) {
    AdamWStep s = adamw_step(lr, beta1, beta2, eps, weight_decay, grad_scale, step);
    #pragma omp parallel for firstprivate(s)   // a private copy: its fields stay in registers
    for (size_t i = 0; i < n; i++) {
        float p = adamw_element(master[i], grad[i], &m[i], &v[i], s);
        master[i] = p;
        param[i] = p;
    }
}

// A rank's ZeRO shard holds parts of many tensors, each with its own weight decay and each
// counted in the gradient norm or not. One ShardRange per part: [start, end) relative to the
// shard, in increasing order; elements in no range (the padding) are left alone. The GPU
// build updates the whole shard in one launch (and the norm in two) instead of one per tensor
// (about 450 launches a step for GPT-2 124M); the CPU build walks the ranges in order, the
// same calls as one per tensor, so its bits do not change.
// The kernels take the ranges cut into pieces of at most SHARD_PIECE elements (shard_pieces,
// once, on the host): a block works inside one piece, so it knows its range, and no thread
// searches the table for the range its element is in.
typedef struct {
    size_t start, end;
    int decay, in_norm;   // AdamW's weight decay applies; the part counts in the gradient norm
} ShardRange;

// the ranges as the kernels of build b walk them: each cut into pieces of at most SHARD_PIECE
// elements on the GPU build (the last piece of a range shorter), whole on the CPU build
static size_t shard_piece_size(BuildTarget b) { return b.gpu ? SHARD_PIECE : SIZE_MAX; }

// The `count` ranges cut into pieces of at most `piece` elements, in order, into `pieces`;
// returns how many. Room enough: shard_pieces_max.
static int shard_pieces(const ShardRange* ranges, int count, size_t piece, ShardRange* pieces) {
    int k = 0;
    for (int r = 0; r < count; r++)
        for (size_t a = ranges[r].start; a < ranges[r].end; a = pieces[k++].end) {
            pieces[k] = ranges[r];
            pieces[k].start = a;
            pieces[k].end = ranges[r].end - a > piece ? a + piece : ranges[r].end;
        }
    return k;
}

// The most pieces up to `count` ranges inside a shard of n elements can become: a range of L
// elements becomes at most floor(L / piece) + 1 pieces, and the lengths add up to at most n
static size_t shard_pieces_max(BuildTarget b, int count, size_t n) {
    return (size_t)count + (b.gpu ? n / SHARD_PIECE : 0);
}

static void adamw_update_ranges_cpu(float* master, float* param, const float* grad, float* m, float* v, size_t n,
                                    const ShardRange* ranges, int count, float lr, float beta1, float beta2, float eps,
                                    float weight_decay, float grad_scale, int step) {
    (void)n;
    for (int r = 0; r < count; r++) {
        size_t a = ranges[r].start, len = ranges[r].end - ranges[r].start;
        adamw_update_cpu(master + a, param + a, grad + a, m + a, v + a, len, lr, beta1, beta2, eps,
                         ranges[r].decay ? weight_decay : 0.0f, grad_scale, step);
    }
}

// *acc += the mean of a micro-batch's N token losses. The training schedule adds each
// micro-batch's on the device and reads the sum once a step (a host copy and a wait per
// micro-batch before). In double, in token order on the CPU build.
static void loss_mean_add_cpu(double* acc, const float* losses, int N) {
    double sum = 0.0;
    for (int n = 0; n < N; n++) sum += losses[n];
    *acc += sum / N;
}

#ifdef __CUDACC__
// one block: strided sums reduced in a fixed order (the same bits every run)
__global__ void loss_mean_add_kernel(double* acc, const float* losses, int N) {
    double s = 0.0;
    for (int n = threadIdx.x; n < N; n += blockDim.x) s += losses[n];
    s = block_reduce_sum_double(s);
    if (threadIdx.x == 0) *acc += s / N;
}

static void loss_mean_add(double* acc, const float* losses, int N) {
    LAUNCH(loss_mean_add_kernel, 1, SUM_SQUARES_BLOCK, 0, acc, losses, N);
}
#else
#define loss_mean_add loss_mean_add_cpu
#endif

// acc[n] += x[n], fp32: ZeRO-2/3 add each micro-batch's summed gradients of a layer into the
// shard's accumulator (zero.h), DeepSpeed's way
static void floats_add_cpu(float* acc, const float* x, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) acc[i] += x[i];
}

#ifdef __CUDACC__
#define FLOATS_ADD_BLOCK 256
__global__ void floats_add_kernel(float* acc, const float* x, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) acc[i] += x[i];
}

static void floats_add(float* acc, const float* x, size_t n) {
    if (n == 0) return;
    LAUNCH(floats_add_kernel, (unsigned)CEIL_DIV(n, (size_t)FLOATS_ADD_BLOCK), FLOATS_ADD_BLOCK, 0, acc, x, n);
}
#else
#define floats_add floats_add_cpu
#endif

#ifdef __CUDACC__
// block b updates piece b of the shard (see shard_pieces), its threads striding through it
__global__ void adamw_ranges_kernel(float* master, floatX* param, const float* grad, float* m, float* v,
                                    const ShardRange* pieces, AdamWStep s, float weight_decay) {
    ShardRange p = pieces[blockIdx.x];
    s.weight_decay = p.decay ? weight_decay : 0.0f;
    for (size_t i = p.start + threadIdx.x; i < p.end; i += blockDim.x) {
        float x = adamw_element(master[i], grad[i], &m[i], &v[i], s);
        master[i] = x;
        param[i] = to_floatX(x);
    }
}

// AdamW over a shard of n elements (master, param, grad, m, v all start at the shard's
// start), the `count` pieces of its ranges in `pieces` (shard_pieces; the CPU build: the ranges)
static void adamw_update_ranges(float* master, floatX* param, const float* grad, float* m, float* v, size_t n,
                                const ShardRange* pieces, int count, float lr, float beta1, float beta2, float eps,
                                float weight_decay, float grad_scale, int step) {
    (void)n;
    AdamWStep s = adamw_step(lr, beta1, beta2, eps, weight_decay, grad_scale, step);
    LAUNCH(adamw_ranges_kernel, count, ELEMENTWISE_BLOCK, 0, master, param, grad, m, v, pieces, s, weight_decay);
}
#else
#define adamw_update_ranges adamw_update_ranges_cpu
#endif

// ----------------------------------------------------------------------------
// sum of squares, for the global gradient norm: *acc += sum x[i]^2, in double, in fixed
// chunks added in order (so the result does not depend on the number of threads)

#define SUM_CHUNK 4096  // elements per chunk, whatever the thread count

static void sum_squares_cpu(double* acc, const float* x, size_t n) {
    size_t chunks = CEIL_DIV(n, (size_t)SUM_CHUNK);
    double* partial = (double*)mallocCheck(chunks * sizeof(double));
    #pragma omp parallel for
    for (size_t k = 0; k < chunks; k++) {
        size_t i0 = k * SUM_CHUNK, i1 = (k + 1) * SUM_CHUNK < n ? (k + 1) * SUM_CHUNK : n;
        // 16 running sums (element i goes to sum i % 16), added in order at the end: the
        // same result every time, and the adds no longer wait on each other. Taken 16 at a
        // time, so that the 16 sums are the lanes of vector registers.
        double s[16] = {0};
        size_t i = i0;
        for (; i + 16 <= i1; i += 16)
            for (int j = 0; j < 16; j++) s[j] += (double)x[i + j] * x[i + j];
        for (; i < i1; i++) s[(i - i0) % 16] += (double)x[i] * x[i];   // the chunk's tail
        double total = 0.0;
        for (int j = 0; j < 16; j++) total += s[j];
        partial[k] = total;
    }
    double total = 0.0;
    for (size_t k = 0; k < chunks; k++) total += partial[k];
    free(partial);
    *acc += total;
}

// the CPU build's norm over a shard: the ranges counted in it, in order
static void sum_squares_ranges_cpu(double* acc, const float* x, size_t n, const ShardRange* ranges, int count) {
    (void)n;
    for (int r = 0; r < count; r++)
        if (ranges[r].in_norm) sum_squares_cpu(acc, x + ranges[r].start, ranges[r].end - ranges[r].start);
}

#ifdef __CUDACC__
// one block: *acc += partials[0] + ... + partials[count - 1]
__global__ void sum_squares_final_kernel(double* acc, const double* partials, int count) {
    double s = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
    s = block_reduce_sum_double(s);
    if (threadIdx.x == 0) *acc += s;
}

// block b sums the squares of pieces b, b + gridDim, b + 2 gridDim, ... that count in the norm
// (the pieces of shard_pieces) into partials[b]
__global__ void sum_squares_ranges_partial_kernel(double* partials, const float* x, const ShardRange* pieces, int count) {
    double s = 0.0;
    for (int k = blockIdx.x; k < count; k += gridDim.x) {
        ShardRange p = pieces[k];
        if (!p.in_norm) continue;   // the same for the whole block
        for (size_t i = p.start + threadIdx.x; i < p.end; i += blockDim.x) s += (double)x[i] * x[i];
    }
    s = block_reduce_sum_double(s);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// *acc += the squares of the shard's elements counted in the norm, in two launches; the grid
// is a function of the table alone, so the result does not change from run to run
static void sum_squares_ranges(double* acc, const float* x, size_t n, const ShardRange* pieces, int count) {
    (void)n;
    int blocks = count < SUM_SQUARES_MAX_BLOCKS ? count : SUM_SQUARES_MAX_BLOCKS;
    if (blocks == 0) return;
    LAUNCH(sum_squares_ranges_partial_kernel, blocks, SUM_SQUARES_BLOCK, 0, sum_squares_partials, x, pieces, count);
    LAUNCH(sum_squares_final_kernel, 1, SUM_SQUARES_BLOCK, 0, acc, sum_squares_partials, blocks);
}
#else
#define sum_squares_ranges sum_squares_ranges_cpu
#endif
