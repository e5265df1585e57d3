/*
kernels/quantize.cuh — 8-bit optimizer states (--use-bnb-optimizer): block-wise dynamic
quantization (Dettmers et al. 2021, "8-bit Optimizers via Block-wise Quantization") and AdamW
with its moments kept that way. The dynamic (tree) map, a block's quantization and its inverse,
and the 8-bit AdamW over a rank's ZeRO shard (the ShardRanges of kernels/optimizer.cuh). Each
op: its C reference, then its CUDA twin.

Included by kernels.cuh, the index of kernels/, after kernels/optimizer.cuh (whose AdamW element
and shard ranges it uses): the conventions every kernel keeps are there.
*/
#pragma once

// ----------------------------------------------------------------------------
// the dynamic quantization map (Dettmers 2016, "8-Bit Approximations for Parallelism in Deep
// Learning"; the 8-bit optimizers' paper §2, "dynamic tree quantization")
// 256 values in [-1, 1], dense near 0 and sparse near 1, so that a byte holds numbers of very
// different magnitudes with about the same relative error. Read as a number: a sign bit, then
// zeros that count the decimal exponent, a 1 that ends them, and the bits left a linear
// fraction. As bitsandbytes' create_dynamic_map(signed, max_exponent_bits 7, total_bits 8) lays
// it out, for decades i = 0 .. 6 (exponent e = i - 6, from 1e-6 up to 1):
//   signed (Adam's m):    the 2^i midpoints of linspace(0.1, 1, 2^i + 1), times 10^e, each
//                         with both signs: 1 + 2 + ... + 64 = 127 a sign, 254 values;
//   unsigned (Adam's v):  2^(i+1) midpoints of linspace(0.1, 1, 2^(i+1) + 1), times 10^e: 254
//                         values (the sign bit spent on the fraction: v is never negative);
// the midpoint of boundaries j and j + 1 being 0.1 + 0.9 (j + 1/2) / k for k of them; then 0
// and 1, and the 256 sorted. The signed map has 1 but not -1 (its most negative value is
// -(1 - 0.45/64) = -0.99297). Its largest gap between neighbours is the top decade's 0.9/64
// = 0.0141 (the unsigned map's 0.9/128 = 0.0070), so a value quantized to the nearest one is
// off by at most 0.0070 (0.0035) of its block's scale; in the top decade (|x| >= 0.1 of the
// scale) that is at most 6.6% (3.3%) of the value, the paper's regime for most of a block.
// Computed in double and rounded to float once (bitsandbytes' torch code rounds its linspace to
// float first: a value may differ in its last bit).

#define QUANT_MAP_SIZE 256
#define QUANT_BLOCK 2048   // values a block, each block with its own scale (the paper's block size)

// map[0..255], sorted: the signed map (is_signed) or the unsigned one
static void dynamic_quant_map(int is_signed, float* map) {
    double values[QUANT_MAP_SIZE];
    int n = 0;
    for (int i = 0; i < 7; i++) {
        int k = is_signed ? 1 << i : 1 << (i + 1);   // midpoints in decade i
        double decade = pow(10.0, i - 6);
        for (int j = 0; j < k; j++) {
            double mid = 0.1 + 0.9 * (j + 0.5) / k;
            values[n++] = decade * mid;
            if (is_signed) values[n++] = -decade * mid;
        }
    }
    values[n++] = 0.0;
    values[n++] = 1.0;
    for (int i = 1; i < n; i++)   // insertion sort: 256 values, once
        for (int j = i; j > 0 && values[j - 1] > values[j]; j--) {
            double swap = values[j];
            values[j] = values[j - 1];
            values[j - 1] = swap;
        }
    for (int i = 0; i < QUANT_MAP_SIZE; i++) map[i] = (float)values[i];
}

// The two maps as the kernels take them: maps[0..255] signed (m), maps[256..511] unsigned (v)
static void dynamic_quant_maps(float* maps) {
    dynamic_quant_map(1, maps);
    dynamic_quant_map(0, maps + QUANT_MAP_SIZE);
}

// ----------------------------------------------------------------------------
// one block: the scale, the nearest code, and back
// quantize: code = the map's nearest value to x / scale; dequantize: map[code] x scale.
// The scale is the block's value of largest magnitude, with its sign (bitsandbytes keeps the
// absolute maximum): that value is then stored exactly (as the map's 1, which the signed map
// has and -1 it has not), so a dequantized block quantizes back to the same codes and scale,
// and a checkpoint of dequantized moments loads back bit for bit (checkpoint.h). A block of
// zeros has scale 0 and dequantizes to zeros whatever its codes (a zeroed state is one).

// the scale of a block whose largest value is hi and smallest lo: the one of larger magnitude
// (hi on a tie); for v (never negative) its maximum
HOST_DEVICE static inline float quant_scale(float hi, float lo) { return hi >= -lo ? hi : lo; }

// the code of the map's value nearest to y (ties to the lower code): a binary search of the
// sorted 256
HOST_DEVICE static inline uint8_t quantize_nearest(const float* map, float y) {
    int lo = 0, hi = QUANT_MAP_SIZE - 1;   // map[lo] <= y < map[hi] once inside
    if (!(y > map[lo])) return 0;
    if (y >= map[hi]) return (uint8_t)hi;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (map[mid] <= y) lo = mid;
        else hi = mid;
    }
    return (uint8_t)(y - map[lo] <= map[hi] - y ? lo : hi);
}

HOST_DEVICE static inline uint8_t quantize_value(const float* map, float x, float scale) {
    return quantize_nearest(map, scale != 0.0f ? x / scale : 0.0f);
}

// n <= QUANT_BLOCK values of one block into codes and the block's scale
static void quantize_block_cpu(const float* x, size_t n, const float* map, uint8_t* codes, float* scale) {
    float hi = -INFINITY, lo = INFINITY;
    for (size_t i = 0; i < n; i++) hi = fmaxf(hi, x[i]), lo = fminf(lo, x[i]);
    *scale = quant_scale(hi, lo);
    for (size_t i = 0; i < n; i++) codes[i] = quantize_value(map, x[i], *scale);
}

static void dequantize_block_cpu(const uint8_t* codes, float scale, size_t n, const float* map, float* x) {
    for (size_t i = 0; i < n; i++) x[i] = map[codes[i]] * scale;
}

// A rank's shard of n values in blocks of QUANT_BLOCK from its start: block b holds
// [b QUANT_BLOCK, (b + 1) QUANT_BLOCK), the last one the n % QUANT_BLOCK left (when not 0),
// with a scale of its own like any other. The trainer's shards are whole blocks, each starting
// on a block of its region's grid (data_parallel.h zero_shard_multiple), so the blocks are the
// same whatever the data-parallel size (the functions here take any n: tests/test_kernels.c's
// end in a shorter block). The blocks follow the flat buffer, not the tensors: a block may hold
// the end of one tensor and the start of the next (bitsandbytes quantizes each tensor alone),
// and the padding (zeros, never updated) is quantized with its block.
static size_t quant_blocks(size_t n) { return CEIL_DIV(n, (size_t)QUANT_BLOCK); }

static void quantize_blocks_cpu(const float* x, size_t n, const float* map, uint8_t* codes, float* scales) {
    #pragma omp parallel for
    for (size_t b = 0; b < quant_blocks(n); b++) {
        size_t a = b * QUANT_BLOCK, len = n - a < QUANT_BLOCK ? n - a : QUANT_BLOCK;
        quantize_block_cpu(x + a, len, map, codes + a, &scales[b]);
    }
}

static void dequantize_blocks_cpu(const uint8_t* codes, const float* scales, size_t n, const float* map, float* x) {
    #pragma omp parallel for
    for (size_t b = 0; b < quant_blocks(n); b++) {
        size_t a = b * QUANT_BLOCK, len = n - a < QUANT_BLOCK ? n - a : QUANT_BLOCK;
        dequantize_block_cpu(codes + a, scales[b], len, map, x + a);
    }
}

// ----------------------------------------------------------------------------
// AdamW with 8-bit moments (the paper's Algorithm 1, with AdamW's step)
// Block by block: dequantize its m and v, the AdamW step of kernels/optimizer.cuh in fp32 on
// each element of a shard range (the fp32 master weights kept, as in 32-bit AdamW), the new
// scales (the block's largest m, v), requantize. Elements in no range (the padding) keep their
// moments. The only difference from adamw_update_ranges is the rounding of m and v to the map
// once a step. bitsandbytes' Adam8bit also applies AdamW's decoupled weight decay; it scales
// eps by sqrt(1 - b2^t) and decays with the new weight, where this keeps torch's AdamW formula.

// a shard's 8-bit moments: codes [n] and scales [quant_blocks(n)] of each, and the two maps
// (dynamic_quant_maps, [2 x 256]) in the same memory as the codes
typedef struct {
    uint8_t* m;
    uint8_t* v;
    float* m_scale;
    float* v_scale;
    const float* maps;
} Moments8bit;

// the first of the `count` ranges (in order, disjoint) that ends after element a: a block
// finds its ranges with one search (not one a thread per element)
HOST_DEVICE static inline int first_range_after(const ShardRange* ranges, int count, size_t a) {
    int lo = 0, hi = count;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (ranges[mid].end <= a) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// one block [a, a + len) of the shard, its moments dequantized into m and v
static void adamw8bit_block_cpu(float* master, float* param, const float* grad, float* m, float* v, size_t a,
                                size_t len, const ShardRange* ranges, int count, AdamWStep s, float weight_decay) {
    for (int r = first_range_after(ranges, count, a); r < count && ranges[r].start < a + len; r++) {
        size_t lo = ranges[r].start > a ? ranges[r].start : a, hi = ranges[r].end < a + len ? ranges[r].end : a + len;
        s.weight_decay = ranges[r].decay ? weight_decay : 0.0f;
        for (size_t i = lo; i < hi; i++) {
            float p = adamw_element(master[i], grad[i], &m[i - a], &v[i - a], s);
            master[i] = p;
            param[i] = p;
        }
    }
}

static void adamw8bit_update_ranges_cpu(float* master, float* param, const float* grad, Moments8bit q, size_t n,
                                        const ShardRange* ranges, int count, float lr, float beta1, float beta2,
                                        float eps, float weight_decay, float grad_scale, int step) {
    AdamWStep s = adamw_step(lr, beta1, beta2, eps, weight_decay, grad_scale, step);
    #pragma omp parallel for firstprivate(s)
    for (size_t b = 0; b < quant_blocks(n); b++) {
        size_t a = b * QUANT_BLOCK, len = n - a < QUANT_BLOCK ? n - a : QUANT_BLOCK;
        float m[QUANT_BLOCK], v[QUANT_BLOCK];
        dequantize_block_cpu(q.m + a, q.m_scale[b], len, q.maps, m);
        dequantize_block_cpu(q.v + a, q.v_scale[b], len, q.maps + QUANT_MAP_SIZE, v);
        adamw8bit_block_cpu(master, param, grad, m, v, a, len, ranges, count, s, weight_decay);
        quantize_block_cpu(m, len, q.maps, q.m + a, &q.m_scale[b]);
        quantize_block_cpu(v, len, q.maps + QUANT_MAP_SIZE, q.v + a, &q.v_scale[b]);
    }
}

#ifdef __CUDACC__
#define QUANT_THREADS 256                              // a CUDA block per quantization block ...
#define QUANT_PER_THREAD (QUANT_BLOCK / QUANT_THREADS) // ... each thread 8 of its values, in registers

// CUDA block b updates quantization block b: thread t holds values t, t + 256, ... (coalesced);
// the block walks the pieces (shard_pieces) that meet it, found with one search, each thread
// updating those of its values inside each; the scales are block maxima (exact in any order),
// so the codes are the reference's, but where --use_fast_math's division rounds x / scale to
// the other side of a midpoint between two codes.
__global__ void adamw8bit_ranges_kernel(float* master, floatX* param, const float* grad, Moments8bit q, size_t n,
                                        const ShardRange* pieces, int count, AdamWStep s, float weight_decay) {
    size_t a = (size_t)blockIdx.x * QUANT_BLOCK, len = n - a < QUANT_BLOCK ? n - a : QUANT_BLOCK;
    float m[QUANT_PER_THREAD], v[QUANT_PER_THREAD];
    float m_scale = q.m_scale[blockIdx.x], v_scale = q.v_scale[blockIdx.x];
    UNROLL for (int k = 0; k < QUANT_PER_THREAD; k++) {
        size_t j = threadIdx.x + (size_t)k * QUANT_THREADS;
        m[k] = j < len ? q.maps[q.m[a + j]] * m_scale : 0.0f;
        v[k] = j < len ? q.maps[QUANT_MAP_SIZE + q.v[a + j]] * v_scale : 0.0f;
    }
    for (int r = first_range_after(pieces, count, a); r < count && pieces[r].start < a + len; r++) {
        ShardRange p = pieces[r];
        s.weight_decay = p.decay ? weight_decay : 0.0f;
        UNROLL for (int k = 0; k < QUANT_PER_THREAD; k++) {
            size_t i = a + threadIdx.x + (size_t)k * QUANT_THREADS;
            if (i < p.start || i >= p.end) continue;
            float x = adamw_element(master[i], grad[i], &m[k], &v[k], s);
            master[i] = x;
            param[i] = to_floatX(x);
        }
    }
    float m_hi = -INFINITY, m_lo = INFINITY, v_hi = -INFINITY, v_lo = INFINITY;
    UNROLL for (int k = 0; k < QUANT_PER_THREAD; k++)
        if (threadIdx.x + (size_t)k * QUANT_THREADS < len) {
            m_hi = fmaxf(m_hi, m[k]), m_lo = fminf(m_lo, m[k]);
            v_hi = fmaxf(v_hi, v[k]), v_lo = fminf(v_lo, v[k]);
        }
    m_scale = quant_scale(block_reduce_max(m_hi), -block_reduce_max(-m_lo));
    v_scale = quant_scale(block_reduce_max(v_hi), -block_reduce_max(-v_lo));
    UNROLL for (int k = 0; k < QUANT_PER_THREAD; k++) {
        size_t j = threadIdx.x + (size_t)k * QUANT_THREADS;
        if (j >= len) continue;
        q.m[a + j] = quantize_value(q.maps, m[k], m_scale);
        q.v[a + j] = quantize_value(q.maps + QUANT_MAP_SIZE, v[k], v_scale);
    }
    if (threadIdx.x == 0) q.m_scale[blockIdx.x] = m_scale, q.v_scale[blockIdx.x] = v_scale;
}

// 8-bit AdamW over a shard of n elements (as adamw_update_ranges: master, param, grad and q's
// codes all start at the shard's start), the `count` pieces of its ranges in `pieces`
static void adamw8bit_update_ranges(float* master, floatX* param, const float* grad, Moments8bit q, size_t n,
                                    const ShardRange* pieces, int count, float lr, float beta1, float beta2, float eps,
                                    float weight_decay, float grad_scale, int step) {
    AdamWStep s = adamw_step(lr, beta1, beta2, eps, weight_decay, grad_scale, step);
    LAUNCH(adamw8bit_ranges_kernel, quant_blocks(n), QUANT_THREADS, 0, master, param, grad, q, n, pieces, count, s,
           weight_decay);
}
#else
#define adamw8bit_update_ranges adamw8bit_update_ranges_cpu
#endif
