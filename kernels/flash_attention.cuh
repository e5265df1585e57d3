/*
kernels/flash_attention.cuh — causal self-attention fused, at FlashAttention-2's design on
tensor cores: the tiles and fragments, the forward, the deterministic backward (the PTX they
write, mma.sync, ldmatrix, cp.async and the dQ turns, is kernels/flash_ptx.cuh's); and the
launches, attention_forward, attention_backward and attention_probabilities, which take the
fused kernels or attention.cuh's unfused ones (on the CPU build: attention.cuh's C references).

Included by kernels.cuh, the index of kernels/: the conventions every kernel keeps are there.
*/
#pragma once

// ----------------------------------------------------------------------------
// causal self-attention, fused, at FlashAttention-2's design (Dao 2023) on tensor cores
//
// The forward: one block of 4 warps per (b, h, 64-row query tile), each warp owning 16 rows.
// The block copies its queries and the first key tile into shared memory with cp.async, then
// walks the key tiles at and left of the diagonal (those right of it are never touched); the
// copy of tile k + 1 is in flight while tile k is multiplied (two buffers). Each warp keeps
// its rows' scores S = Q K^T, probabilities P and output O in registers, as the fragments of
// mma.sync.m16n8k16 (16-bit inputs, fp32 sums): S's accumulators are exactly the A operand of
// P V once rounded to 16 bits, so nothing goes back through shared memory. Per row it keeps
// the running maximum m and sum l of the online softmax (each key tile rescales O and l by
// 2^(m_old - m_new)); a row's values are spread over the 4 lanes of a quad, so a maximum or a
// sum takes two shuffles. Q, K and V fragments come from shared memory through ldmatrix (.trans
// for V: the B operand of P V is V's columns); the queries' once, before the loop, kept in
// registers. Only the diagonal tile is masked. The block writes out and each row's log-sum-exp
// m + log l, all the backward needs to recompute P.
//
// The backward: D = rowsum(dout * out) first; then one kernel at FlashAttention-2's cost, five
// products a (64-key tile, 32-row query step): one block per key tile (a warp per 16 keys)
// steps over the query steps at and below the diagonal, recomputing S^T = K Q^T and dP^T = V
// dO^T, summing dV += P^T dO and dK += dS^T Q in registers, and computing the step's dQ = dS K
// through a dS^T tile in shared memory. A step's dQ gets a part from each key tile at or left of
// it, in different blocks: FlashAttention-2 adds them with atomics (an order that changes from run
// to run); here the blocks add them in a fixed order, taking turns on a counter per step
// (FlashAttention-3's deterministic backward does the same), so two runs give the same bits.
// Before issue 39 a second kernel, one block per query tile, recomputed S and dP for dQ: 7
// products. Scores are kept in log2 units (scaled by log2 e), for exp2, the GPU's native
// exponential. Each kernel is built with and without ALiBi (a template argument): the instance
// without has no bias arithmetic at all; and with and without the attention dropout (another):
// the forward weighs V by P times the mask's factor (l, the softmax's sum, stays P's), the
// backward draws the same mask from the same counters (kernels/random.cuh: the head's key, then
// a hash of (query, key) per score), P^T times it for dV, and dP^T = the factor times V dO^T
// (D = rowsum(dO O) is already P's mask-weighed dot, as FlashAttention-2's dropout has it).
//
// Grouped-query attention (G < NH key/value heads, each shared by the NH/G query heads of its
// group): the forward keeps a block per query head, reading the group's K and V, and numbers
// its blocks so that a group's heads are neighbours (flash_query_block): they run together and
// read each K and V tile once from memory, the others from L2. The backward takes a key tile of
// one (b, group) and walks the query steps of each of the group's heads in turn: K and V are
// read once per group, dK and dV add up over the heads in registers, in head order, as a
// group's gradient must (no atomics, no second pass), and each head's dQ takes its turns.

#ifdef __CUDACC__
#define FLASH_WARPS (FLASH_ROWS / 16)
#define FLASH_THREADS (32 * FLASH_WARPS)
#define FLASH_ROW(HS) ((HS) + FLASH_PAD)   // elements from one tile row to the next
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// (the PTX wrappers, the dQ turns and the partial sums' accesses: kernels/flash_ptx.cuh)

__device__ inline uint32_t pack_floatX2(float low, float high) {
    floatX pair[2] = {to_floatX(low), to_floatX(high)};
    uint32_t r;
    memcpy(&r, pair, 4);
    return r;
}

// the sum and the maximum over the 4 lanes of a quad (one row of a fragment)
__device__ inline float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ inline float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// ---- tiles and fragments

// ROWS rows from t0 of one head's q, k, v or dout (row t at src + t * stride) into a tile of
// padded rows, with cp.async (not waited for); rows at or past T become zeros
template <int HS, int ROWS>
__device__ void flash_copy_rows(floatX* tile, const floatX* src, size_t stride, int t0, int T) {
    constexpr int pieces = HS / 8;   // 16 bytes each
    static_assert(ROWS * pieces % FLASH_THREADS == 0, "every thread copies as many pieces");
    UNROLL
    for (int k = 0; k < ROWS * pieces / FLASH_THREADS; k++) {
        int i = threadIdx.x + k * FLASH_THREADS, r = i / pieces, c = i % pieces, t = t0 + r;
        bool inside = t < T;
        cp_async_16(tile + r * FLASH_ROW(HS) + 8 * c, src + (size_t)(inside ? t : 0) * stride + 8 * c, inside);
    }
}

// the A fragment (16 x 16) at rows row0 .., columns 16 kk .. of a tile
template <int HS>
__device__ void load_a(uint32_t a[4], const floatX* tile, int row0, int kk) {
    int lane = threadIdx.x % 32;
    ldmatrix_x4(a, tile + (row0 + lane % 16) * FLASH_ROW(HS) + 16 * kk + lane / 16 * 8, false);
}

// acc (16 x N) += A_kk B_kk^T for one 16-column slice kk of the head: B^T = the N tile rows
// from row 0, B[k][n] = tile[n][16 kk + k], which is what ldmatrix gives without .trans
template <int HS, int N>
__device__ void warp_product_abt_slice(float acc[][4], const uint32_t a[4], const floatX* tile, int kk) {
    int lane = threadIdx.x % 32;
    UNROLL
    for (int j = 0; j < N / 16; j++) {   // two 8-column blocks of acc per ldmatrix
        uint32_t b[4];
        ldmatrix_x4(b, tile + (16 * j + lane / 16 * 8 + lane % 8) * FLASH_ROW(HS) + 16 * kk + (lane / 8) % 2 * 8, false);
        mma_16816(acc[2 * j], a, b[0], b[1]);
        mma_16816(acc[2 * j + 1], a, b[2], b[3]);
    }
}

// acc (16 x N) += A B^T, A's HS / 16 fragments in registers (the forward's queries)
template <int HS, int N>
__device__ void warp_product_abt(float acc[][4], const uint32_t a[][4], const floatX* tile) {
    UNROLL
    for (int kk = 0; kk < HS / 16; kk++) warp_product_abt_slice<HS, N>(acc, a[kk], tile, kk);
}

// the same with A = rows row0 .. row0 + 15 of a shared tile, one slice at a time (fewer registers)
template <int HS, int N>
__device__ void warp_product_abt(float acc[][4], const floatX* a_tile, int row0, const floatX* tile) {
    UNROLL
    for (int kk = 0; kk < HS / 16; kk++) {
        uint32_t a[4];
        load_a<HS>(a, a_tile, row0, kk);
        warp_product_abt_slice<HS, N>(acc, a, tile, kk);
    }
}

// acc (16 x HS) += P B: P (16 x K) in accumulators, rounded to floatX, B = K tile rows (K x HS);
// B[k][n] = tile[k][n] is what ldmatrix gives with .trans
template <int HS, int K>
__device__ void warp_product_pb(float acc[][4], const float p[][4], const floatX* tile) {
    int lane = threadIdx.x % 32;
    UNROLL
    for (int j = 0; j < K / 16; j++) {
        // accumulator blocks 2j and 2j + 1 (columns 16j ..) are the A fragment of those columns
        uint32_t a[4] = {pack_floatX2(p[2 * j][0], p[2 * j][1]), pack_floatX2(p[2 * j][2], p[2 * j][3]),
                         pack_floatX2(p[2 * j + 1][0], p[2 * j + 1][1]), pack_floatX2(p[2 * j + 1][2], p[2 * j + 1][3])};
        UNROLL
        for (int nb = 0; nb < HS / 16; nb++) {
            uint32_t b[4];
            ldmatrix_x4(b, tile + (16 * j + (lane / 8) % 2 * 8 + lane % 8) * FLASH_ROW(HS) + 16 * nb + lane / 16 * 8, true);
            mma_16816(acc[2 * nb], a, b[0], b[1]);
            mma_16816(acc[2 * nb + 1], a, b[2], b[3]);
        }
    }
}

// acc (16 rows from row0, HS columns) to global memory, row t at dst + t * stride; rows past T
// are not written. Lane (g, t) holds columns 2t and 2t + 1 of rows g and g + 8 in each block.
template <int HS>
__device__ void flash_store_rows(floatX* dst, size_t stride, const float acc[][4], int row0, int T) {
    int lane = threadIdx.x % 32;
    UNROLL
    for (int half = 0; half < 2; half++) {
        int t = row0 + lane / 4 + 8 * half;
        if (t >= T) continue;
        UNROLL
        for (int nb = 0; nb < HS / 8; nb++) {
            // one 4-byte store: the pair's offset is even and every row starts 4-byte aligned
            *(uint32_t*)(dst + (size_t)t * stride + 8 * nb + 2 * (lane % 4)) =
                pack_floatX2(acc[nb][2 * half], acc[nb][2 * half + 1]);
        }
    }
}

// A head's constants for its scores in log2 units (the kernels use exp2): the score of query
// `row` and key `key` is x = s / sqrt(HS) + slope (key - row) (ALiBi's bias; 0 without), and
// x log2(e) = s scale_log2 + slope_log2 (key - row). The forward and both backward kernels take
// them from here, so P recomputed in the backward is the forward's to the bit.
struct FlashHead {
    float scale, scale_log2, slope_log2;   // 1 / sqrt(HS), and the two in log2 units
};

__device__ FlashHead flash_head(int HS, Alibi alibi, int h) {
    FlashHead f;
    f.scale = 1.0f / sqrtf((float)HS);
    f.scale_log2 = LOG2E * f.scale;
    f.slope_log2 = alibi.heads ? LOG2E * alibi_slope(alibi.first_head + h, alibi.heads) : 0.0f;
    return f;
}

// ALIBI is a compile-time choice: each kernel is built twice, and the instance without ALiBi
// has no bias arithmetic at all (about a sixth of the forward's instructions a tile: an int to
// float conversion and a multiply-add per score), where a run-time slope of 0 would still pay it.
template <bool ALIBI>
__device__ float flash_score_log2(const FlashHead& f, float s, int key, int row) {
    return ALIBI ? s * f.scale_log2 + f.slope_log2 * (float)(key - row) : s * f.scale_log2;
}

// ---- the forward

// One key tile's step of the online softmax for this lane's rows (row0 + g and row0 + g + 8):
// s (scores) becomes p = 2^(x - m_new), x the score in log2 units with ALiBi's bias; keys
// right of a row (on tiles that reach the diagonal only) get p = 0; m, l and o move to the new
// maximum. A row whose keys in this tile are all masked keeps m: it saw key 0 in tile 0.
template <int HS, bool DROPOUT, bool ALIBI>
__device__ void flash_online_softmax(float s[][4], float o[][4], float m[2], float l[2], int k0, int row0,
                                     bool diagonal, const FlashHead& head, uint64_t head_key, const Dropout& dropout) {
    int lane = threadIdx.x % 32;
    float tile_max[2] = {-INFINITY, -INFINITY};
    UNROLL
    for (int n = 0; n < FLASH_KEYS(HS) / 8; n++) {
        UNROLL
        for (int e = 0; e < 4; e++) {
            int row = row0 + lane / 4 + 8 * (e / 2), key = k0 + 8 * n + 2 * (lane % 4) + e % 2;
            float x = flash_score_log2<ALIBI>(head, s[n][e], key, row);
            s[n][e] = diagonal && key > row ? -INFINITY : x;
            tile_max[e / 2] = fmaxf(tile_max[e / 2], s[n][e]);
        }
    }
    float rescale[2];
    UNROLL
    for (int half = 0; half < 2; half++) {
        float new_max = fmaxf(m[half], quad_max(tile_max[half]));   // finite: every row sees key 0 first
        rescale[half] = exp2f(m[half] - new_max);                   // 0 at the first tile (m = -inf)
        m[half] = new_max;
        l[half] *= rescale[half];
    }
    UNROLL
    for (int n = 0; n < FLASH_KEYS(HS) / 8; n++) {
        UNROLL
        for (int e = 0; e < 4; e++) {
            s[n][e] = exp2f(s[n][e] - m[e / 2]);
            l[e / 2] += s[n][e];   // this lane's part of the row's sum: the quad adds at the end
            if (DROPOUT)           // then P V weighs by P x the mask's factor
                s[n][e] *= dropout_factor(head_key, row0 + lane / 4 + 8 * (e / 2), k0 + 8 * n + 2 * (lane % 4) + e % 2, &dropout);
        }
    }
    UNROLL
    for (int nb = 0; nb < HS / 8; nb++)
        UNROLL
        for (int e = 0; e < 4; e++) o[nb][e] *= rescale[e / 2];
}

// The forward's block: head h of sequence b, the query tile from row t0.
// Blocks are numbered (b, group, tile, head of the group): the NH/G heads of a group, which
// read the same keys and values, are adjacent blocks, so they run at about the same time and
// read each K and V tile through L2 (the first block to ask brings it there). The longest
// rows first. With G = NH: (b, h, tile).
struct FlashQueryBlock {
    int b, h, t0;
};

__device__ FlashQueryBlock flash_query_block(int T, int NH, int G) {
    int per = NH / G, tiles = CEIL_DIV(T, FLASH_ROWS), i = blockIdx.x / per;   // i = (b G + g) tiles + tile
    FlashQueryBlock f;
    f.b = i / tiles / G;
    f.h = i / tiles % G * per + blockIdx.x % per;
    f.t0 = (tiles - 1 - i % tiles) * FLASH_ROWS;
    return f;
}

// grid: B * NH * tiles blocks of FLASH_THREADS (flash_query_block), flash_shared_bytes(HS, 1) of
// dynamic shared memory; out [N, NH * HS], lse [B, NH, T]. ALIBI: alibi.heads != 0.
template <int HS, bool DROPOUT, bool ALIBI>
__global__ void __launch_bounds__(FLASH_THREADS, 3) attention_forward_flash_kernel(floatX* out, float* lse, const floatX* qkv,
                                                                                int T, int NH, int G, Alibi alibi, Dropout dropout) {
    constexpr int KEYS = FLASH_KEYS(HS), tile = KEYS * FLASH_ROW(HS);
    floatX* q = flash_shared();
    floatX* k = q + FLASH_ROWS * FLASH_ROW(HS);   // two buffers, then v's two
    floatX* v = k + 2 * tile;
    const FlashQueryBlock block = flash_query_block(T, NH, G);
    int b = block.b, h = block.h, t0 = block.t0, bh = b * NH + h;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, row0 = t0 + 16 * warp;
    // causal: the key tiles up to the tile's last row; those right of it are never touched
    int last_row = t0 + FLASH_ROWS < T ? t0 + FLASH_ROWS - 1 : T - 1, key_tiles = last_row / KEYS + 1;
    int stride = (NH + 2 * G) * HS;   // (int: a register fewer through the loop)
    const floatX* q_rows = qkv + qkv_index(b, 0, h, 0, T, NH, G, HS);
    const floatX* k_rows = qkv + qkv_index(b, 0, h, 1, T, NH, G, HS);   // the group's
    // (the group's v, qkv_index(b, 0, h, 2, ...), is k_rows + HS; at head size 128 the loop
    // computes k_rows again from bh rather than keep the pointer: that keeps the block at 168
    // registers, three blocks an SM, without a spill)
    const FlashHead head = flash_head(HS, alibi, h);
    const uint64_t head_key = DROPOUT ? dropout_head_key(&dropout, b, h) : 0;

    flash_copy_rows<HS, FLASH_ROWS>(q, q_rows, stride, t0, T);
    cp_async_commit();   // a group of its own: the queries are waited for before the first key tile
    flash_copy_rows<HS, KEYS>(k, k_rows, stride, 0, T);
    flash_copy_rows<HS, KEYS>(v, k_rows + HS, stride, 0, T);
    cp_async_commit();
    cp_async_wait<1>();   // the queries are here
    __syncthreads();      // ... every thread's part of them
    uint32_t qa[HS / 16][4];   // this warp's queries, in registers through the loop (loop-invariant)
    UNROLL
    for (int kk = 0; kk < HS / 16; kk++) load_a<HS>(qa[kk], q, 16 * warp, kk);
    float o[HS / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    for (int kt = 0; kt < key_tiles; kt++) {
        int buffer = kt % 2, k0 = kt * KEYS;
        if (kt + 1 < key_tiles) {   // the next tile, into the buffer the previous one used
            const floatX* rows = HS > 64 ? qkv + qkv_index(bh / NH, 0, bh % NH, 1, T, NH, G, HS) : k_rows;
            flash_copy_rows<HS, KEYS>(k + (1 - buffer) * tile, rows, stride, k0 + KEYS, T);
            flash_copy_rows<HS, KEYS>(v + (1 - buffer) * tile, rows + HS, stride, k0 + KEYS, T);
        }
        cp_async_commit();
        cp_async_wait<1>();   // all but the newest group: this tile is here
        __syncthreads();      // ... and every thread's part of them
        float s[KEYS / 8][4] = {};
        warp_product_abt<HS, KEYS>(s, qa, k + buffer * tile);
        flash_online_softmax<HS, DROPOUT, ALIBI>(s, o, m, l, k0, row0, k0 + KEYS > t0, head, head_key, dropout);
        warp_product_pb<HS, KEYS>(o, s, v + buffer * tile);
        __syncthreads();   // every warp is done with this buffer before the next copy into it
    }
    UNROLL
    for (int half = 0; half < 2; half++) l[half] = quad_sum(l[half]);
    UNROLL
    for (int nb = 0; nb < HS / 8; nb++)   // the softmax's division, once a row
        UNROLL
        for (int e = 0; e < 4; e++) o[nb][e] /= l[e / 2];
    // (b and h again from bh: one register less through the loop, which keeps the block at 168
    // registers, three blocks per SM, at head size 128 on sm_90)
    flash_store_rows<HS>(out + ((size_t)(bh / NH) * T * NH + bh % NH) * HS, (size_t)NH * HS, o, row0, T);
    UNROLL
    for (int half = 0; half < 2; half++) {
        int t = row0 + lane / 4 + 8 * half;
        if (lane % 4 == 0 && t < T) lse[(size_t)bh * T + t] = m[half] * LN2 + logf(l[half]);
    }
}

// ---- the backward

// D[b, h, t] = sum_i dout[b, t, h, i] * out[b, t, h, i]: the p . dp of every row, a warp per row.
// It also zeroes the `count` counters of attention_backward_flash_kernel, which runs next.
__global__ void attention_backward_flash_d_kernel(float* D, unsigned* counters, int count, const floatX* dout,
                                                  const floatX* out, int B, int T, int NH, int HS) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)count; i += (size_t)gridDim.x * blockDim.x)
        counters[i] = 0;
    int lane = threadIdx.x % 32;
    size_t row = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;   // (b * NH + h) * T + t
    if (row >= (size_t)B * NH * T) return;   // the whole warp
    size_t t = row % T, bh = row / T, b = bh / NH, h = bh % NH, at = ((b * T + t) * NH + h) * HS;
    float sum = 0.0f;
    for (int i = lane; i < HS; i += 32) sum += floatX_to_float(dout[at + i]) * floatX_to_float(out[at + i]);
    sum = warp_reduce_sum(sum);
    if (lane == 0) D[row] = sum;
}

// A step: st = S^T (this warp's 16 keys from key0 by FLASH_STEP queries from q0) becomes P^T,
// dpt = dP^T becomes dS^T = scale P^T (dP^T - D); stats holds the step's queries' lse (natural
// log, as the forward wrote it) then their D. Masked where a key is right of its query or the
// query is past T. With dropout, st becomes P^T x the mask's factor (for dV) and dP^T the factor
// x (V dO^T), the mask drawn again from the head's key.
template <bool DROPOUT, bool ALIBI>
__device__ void flash_scores_to_gradients(float st[][4], float dpt[][4], const float* stats, int key0, int q0, int T,
                                          bool masked, const FlashHead& head, uint64_t head_key, const Dropout& dropout) {
    int lane = threadIdx.x % 32;
    UNROLL
    for (int n = 0; n < FLASH_STEP / 8; n++) {
        UNROLL
        for (int e = 0; e < 4; e++) {
            int key = key0 + lane / 4 + 8 * (e / 2), c = 8 * n + 2 * (lane % 4) + e % 2, query = q0 + c;
            float p = exp2f(flash_score_log2<ALIBI>(head, st[n][e], key, query) - stats[c] * LOG2E);
            if (masked && (key > query || query >= T)) p = 0.0f;
            float f = DROPOUT ? dropout_factor(head_key, query, key, &dropout) : 1.0f;
            st[n][e] = p * f;
            dpt[n][e] = head.scale * p * (dpt[n][e] * f - stats[FLASH_STEP + c]);
        }
    }
}

// this warp's dS^T (its 16 keys, from row0 of the block's, by the step's queries), rounded to
// floatX as the products take it, into the block's dS^T tile: key r's queries at ds + r FLASH_DS_ROW
__device__ void flash_store_ds(floatX* ds, const float dst[][4], int row0) {
    int lane = threadIdx.x % 32;
    UNROLL
    for (int n = 0; n < FLASH_STEP / 8; n++)
        UNROLL
        for (int half = 0; half < 2; half++)
            *(uint32_t*)(ds + (row0 + lane / 4 + 8 * half) * FLASH_DS_ROW + 8 * n + 2 * (lane % 4)) =
                pack_floatX2(dst[n][2 * half], dst[n][2 * half + 1]);
}

// dq (the step's FLASH_STEP queries by HS / 4 columns from col0: 32 rows a warp, so that each
// of K's fragments feeds both 16-row blocks) = dS K: A = dS from the dS^T tile through
// ldmatrix.trans; B = the K tile's rows (keys), columns col0 .., through ldmatrix.trans, as V's in
// P V. dq[rb HS / 32 + nb]: rows 16 rb .., columns col0 + 8 nb ..
template <int HS>
__device__ void warp_product_dq(float dq[][4], const floatX* ds, const floatX* k, int col0) {
    int lane = threadIdx.x % 32;
    UNROLL
    for (int kk = 0; kk < FLASH_ROWS / 16; kk++) {   // 16 keys at a time
        uint32_t b[HS / 64][4];   // an ldmatrix.x4.trans: two 8-column blocks
        UNROLL
        for (int j = 0; j < HS / 64; j++)
            ldmatrix_x4(b[j], k + (16 * kk + (lane / 8) % 2 * 8 + lane % 8) * FLASH_ROW(HS) + col0 + 16 * j + lane / 16 * 8, true);
        UNROLL
        for (int rb = 0; rb < FLASH_STEP / 16; rb++) {
            uint32_t a[4];   // dS rows 16 rb .., keys 16 kk ..: the dS^T tile's transpose
            ldmatrix_x4(a, ds + (16 * kk + lane / 16 * 8 + lane % 8) * FLASH_DS_ROW + 16 * rb + (lane / 8) % 2 * 8, true);
            UNROLL
            for (int j = 0; j < HS / 64; j++) {
                mma_16816(dq[rb * (HS / 32) + 2 * j], a, b[j][0], b[j][1]);
                mma_16816(dq[rb * (HS / 32) + 2 * j + 1], a, b[j][2], b[j][3]);
            }
        }
    }
}

// This warp's part of the step's dQ (warp_product_dq's dq: rows q0 .., columns col0 ..), in its
// turn: the first turn (key tile 0) stores it into sums, fp32 [T, HS] of the head; each later
// one adds it to what is there (from L2, where the block before stored it); the last (the
// diagonal's key tile) writes the total, rounded to floatX once, to dqkv's row t at dst + t *
// stride instead. Rows past T are not written. 128-bit accesses: a lane holds 2 columns of rows g
// and g + 8 in each 8-column block, so the lanes of a pair (t, t ^ 1) swap halves first, the even
// lane then holding 4 columns of row g, the odd one the same 4 of row g + 8.
template <int HS>
__device__ void flash_add_dq(float* sums, floatX* dst, size_t stride, const float dq[][4], int q0, int col0, int T,
                             bool first, bool last, const unsigned* turn) {
#ifndef __NVCC__
    emu_check_turn(turn, "adds its part of dQ");
#else
    (void)turn;
#endif
    int lane = threadIdx.x % 32, odd = lane % 2;
    UNROLL
    for (int rb = 0; rb < FLASH_STEP / 16; rb++)
        UNROLL
        for (int nb = 0; nb < HS / 32; nb++) {
            const float* d = dq[rb * (HS / 32) + nb];
            float give0 = odd ? d[0] : d[2], give1 = odd ? d[1] : d[3];   // the half the other lane keeps
            float got0 = __shfl_xor_sync(0xffffffffu, give0, 1), got1 = __shfl_xor_sync(0xffffffffu, give1, 1);
            float x[4] = {odd ? got0 : d[0], odd ? got1 : d[1], odd ? d[2] : got0, odd ? d[3] : got1};
            int t = q0 + 16 * rb + lane / 4 + 8 * odd, c = col0 + 8 * nb + 2 * (lane & 2);
            if (t >= T) continue;
            float* s = sums + (size_t)t * HS + c;
            if (!first) {
                float before[4];
                load_sums_128(before, s);
                UNROLL
                for (int e = 0; e < 4; e++) x[e] = before[e] + x[e];
            }
            if (last) {   // 4 floatX in one 8-byte store (c is a multiple of 4)
                uint64_t rounded = pack_floatX2(x[0], x[1]) | (uint64_t)pack_floatX2(x[2], x[3]) << 32;
                *(uint64_t*)(dst + (size_t)t * stride + c) = rounded;
            } else {
                store_sums_128(s, x);
            }
        }
}

// The backward's pair (hi, s) of sequence b, head hi of a group (its global head h) and query
// step s, into a buffer: the step's q rows (the group's first query head's at q_group, head
// hi's HS further) and dout rows with 16-byte cp.async, the rows' lse and D ([B, NH, T] each)
// with 4-byte ones (rows of T floats are not 16-byte aligned). Not waited for.
template <int HS>
__device__ void flash_copy_pair(floatX* q_tile, floatX* dout_tile, float* stats, const floatX* q_group, int stride,
                                const floatX* dout, int out_stride, const float* lse, const float* D, int b, int NH,
                                int h, int hi, int s, int T) {
    int q0 = s * FLASH_STEP, i = threadIdx.x;
    flash_copy_rows<HS, FLASH_STEP>(q_tile, q_group + hi * HS, stride, q0, T);
    flash_copy_rows<HS, FLASH_STEP>(dout_tile, dout + (size_t)b * T * out_stride + h * HS, out_stride, q0, T);
    if (i < 2 * FLASH_STEP) {
        int t = q0 + i % FLASH_STEP;
        const float* row = (i < FLASH_STEP ? lse : D) + ((size_t)b * NH + h) * T;
        cp_async_4(stats + i, row + (t < T ? t : 0), t < T);
    }
}

// One fused kernel, FlashAttention-2's five products a step, deterministic. grid: B * G * tiles
// blocks of FLASH_THREADS, one per 64-key tile of each (b, group); warp w owns the tile's keys
// 16w .. 16w + 15. The tile's K and V stay in shared memory (and, at head size 64, the warp's K
// fragments in registers: loop-invariant) while the block walks the 32-row query steps at and
// below the diagonal, from the last step down to the diagonal's, each step for each of the group's
// NH/G heads in turn, one cp.async pipeline of (step, head) pairs (q, dout and the rows' lse and D
// of the next pair in flight during this one):
//   S^T = K Q^T, dP^T = V dO^T; P^T and dS^T = P^T (dP^T - D) in registers;
//   dV += P^T dO, dK += dS^T Q, in registers across the whole walk (so K and V are read once
//   per group, and dK and dV sum over the group's heads in a fixed order);
//   dS^T to shared memory, and dQ_step = dS K, each warp 32 rows by HS / 4 columns.
// A step's dQ sums the partial products of key tiles 0 up to kt_max (its diagonal's), which
// belong to different blocks: they add them in that order, each in its turn on the step's
// counter (flash_wait_turn), the first storing into `sums` (fp32, in scratch), the last writing
// floatX into dqkv. The same sums in the same order: the same bits every run, where
// FlashAttention-2 adds dQ with atomics.
// The tickets. A block may wait only for blocks that started before it (one not yet started may
// need the waiting block's SM): so a block does not take its tile from blockIdx (the GPU may start
// blocks in any order) but from a ticket, counters[count - 1] counted up as blocks start. The
// tickets go window by window (issue 52), `windows` of them, each of B G / windows (b, group)
// pairs or one more (flash_ticket_windows: so few pairs that what their blocks read again, q, dout
// and dQ's sums, stays in L2; before, tile 0 of every pair, then tile 1, ... put two waves of
// other heads between two tiles of one head at 64 x 1024, and every re-read came from memory); in
// a window, tile 0 of each pair, then tile 1 of each, and so on. Deadlock-free: a block waits only
// for the tiles before it (lower kt) of its own pair, in its own window, whose tickets are lower:
// they were taken, so those blocks have started, and hold an SM till they end, waiting in turn only
// for lower tickets: by induction every wait ends. Tile kt walks 2 (tiles - kt) steps, tile 0 the
// most, so in a window the longest blocks start first; and each walks from the last step down, so
// that tile kt - 1, which started earlier, is past each step before tile kt comes to it (walking up
// from the diagonal, tile kt would wait 2 steps for each tile before it: nearly half the blocks'
// time by the list schedule in tests/recost.py, none walking down). The pairs are spread evenly
// over the windows, so that no small window is left to end the kernel with its longest tiles (the
// blocks end 1.11x the work's even share at 16 x 1024 by that schedule, 1.18x with a last window
// of 8 pairs). The windows change which blocks run together, never a sum's order: the same bits
// with any number of windows. counters: [B, NH, steps] turns, then the ticket; zero when the
// kernel starts (the D kernel zeroes them). sums: [B, NH, T, HS] floats, 16-byte aligned. With
// dropout at head size 64: two blocks an SM, not three (the mask's key and hashes took the last
// registers of 168: a spill).
template <int HS, bool DROPOUT, bool ALIBI>
__global__ void __launch_bounds__(FLASH_THREADS, HS > 64 ? 1 : DROPOUT ? 2 : 3) attention_backward_flash_kernel(floatX* dqkv, float* sums,
        unsigned* counters, const floatX* dout, const floatX* qkv, const float* lse, const float* D, int B, int T, int NH,
        int G, int windows, Alibi alibi, Dropout dropout) {
    constexpr int step_tile = FLASH_STEP * FLASH_ROW(HS);
    // K's A fragments in registers at head size 64 (16 registers; V's too would take 16 more, and
    // the block would no longer fit the 168 registers that give three blocks an SM): at 128 they
    // would take 32 more where dK and dV take 128
    constexpr bool k_in_registers = HS <= 64;
    floatX* k = flash_shared();
    floatX* v = k + FLASH_ROWS * FLASH_ROW(HS);
    floatX* q = v + FLASH_ROWS * FLASH_ROW(HS);   // two buffers, then dout's two
    floatX* dO = q + 2 * step_tile;
    floatX* ds = dO + 2 * step_tile;              // dS^T, FLASH_ROWS keys by FLASH_STEP queries
    float* stats = (float*)(ds + FLASH_ROWS * FLASH_DS_ROW);   // per buffer: FLASH_STEP lse, then D
    unsigned* ticket = (unsigned*)(stats + 4 * FLASH_STEP);   // the tile and its (b, group)
    int steps_T = CEIL_DIV(T, FLASH_STEP), per = NH / G;
    if (threadIdx.x == 0) {   // ticket i: window w (the first `extra` of base + 1 pairs, the others of base)
        int i = (int)atomicAdd(counters + (size_t)B * NH * steps_T, 1u), tiles = CEIL_DIV(T, FLASH_ROWS);
        int base = B * G / windows, extra = B * G % windows, at = i / tiles, big = extra * (base + 1);
        int w = at < big ? at / (base + 1) : extra + (at - big) / base, n = base + (w < extra);   // (at: a pair's place)
        int first_pair = w * base + (w < extra ? w : extra), j = i - first_pair * tiles;   // j tickets into the window
        ticket[0] = j / n, ticket[1] = first_pair + j % n;   // tile 0 of each pair, then tile 1, ...
    }
    __syncthreads();
    int kt = (int)ticket[0], bg = (int)ticket[1], b = bg / G, g = bg % G;
    int k0 = kt * FLASH_ROWS, warp = threadIdx.x / 32, key0 = k0 + 16 * warp;
    int stride = (NH + 2 * G) * HS, out_stride = NH * HS;   // (int: two registers fewer)
    // causal: queries before k0 see none of these keys; the walk ends at step `first`
    int first = k0 / FLASH_STEP, pairs = per * (steps_T - first);
    size_t group = qkv_group_index(b, 0, g, 0, T, NH, G, HS);   // the group's first query head; head hi at + hi HS
    // the pairs (s, hi), query step s and head g per + hi of the group: the steps from the last
    // down, each for the group's heads in turn
    flash_copy_rows<HS, FLASH_ROWS>(k, qkv + qkv_group_index(b, 0, g, per, T, NH, G, HS), stride, k0, T);
    flash_copy_rows<HS, FLASH_ROWS>(v, qkv + qkv_group_index(b, 0, g, per + 1, T, NH, G, HS), stride, k0, T);
    cp_async_commit();   // K and V: a group of their own, waited for before the first pair
    flash_copy_pair<HS>(q, dO, stats, qkv + group, stride, dout, out_stride, lse, D, b, NH, g * per, 0, steps_T - 1, T);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    uint32_t kf[HS / 16][4];   // this warp's keys as A fragments
    if (k_in_registers)
        UNROLL
        for (int kk = 0; kk < HS / 16; kk++) load_a<HS>(kf[kk], k, 16 * warp, kk);
    float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
    int hi = 0, s = steps_T - 1;   // the pair's head in the group, and query step
    for (int j = 0; j < pairs; j++) {
        int buffer = j % 2, h = g * per + hi, q0 = s * FLASH_STEP;
        int next_hi = hi + 1 < per ? hi + 1 : 0, next_s = hi + 1 < per ? s : s - 1;
        const floatX* qs = q + buffer * step_tile;
        const floatX* dos = dO + buffer * step_tile;
        if (j + 1 < pairs)
            flash_copy_pair<HS>(q + (1 - buffer) * step_tile, dO + (1 - buffer) * step_tile, stats + (1 - buffer) * 2 * FLASH_STEP,
                                qkv + group, stride, dout, out_stride, lse, D, b, NH, g * per + next_hi, next_hi, next_s, T);
        cp_async_commit();
        cp_async_wait<1>();   // all but the newest group: this pair is here
        __syncthreads();      // ... and every thread's part of it
        const FlashHead head = flash_head(HS, alibi, h);
        const uint64_t head_key = DROPOUT ? dropout_head_key(&dropout, b, h) : 0;
        float st[FLASH_STEP / 8][4] = {}, dpt[FLASH_STEP / 8][4] = {};
        if (k_in_registers) warp_product_abt<HS, FLASH_STEP>(st, kf, qs);   // S^T = K Q^T
        else warp_product_abt<HS, FLASH_STEP>(st, k, 16 * warp, qs);
        warp_product_abt<HS, FLASH_STEP>(dpt, v, 16 * warp, dos);            // dP^T = V dO^T
        bool diagonal = q0 < k0 + FLASH_ROWS;   // (the walk ends at the tile's diagonal)
        bool masked = diagonal || q0 + FLASH_STEP > T;   // the diagonal, or past T
        flash_scores_to_gradients<DROPOUT, ALIBI>(st, dpt, stats + buffer * 2 * FLASH_STEP, key0, q0, T, masked, head, head_key,
                                                  dropout);
        warp_product_pb<HS, FLASH_STEP>(dv, st, dos);   // dV += P^T dO
        warp_product_pb<HS, FLASH_STEP>(dk, dpt, qs);   // dK += dS^T Q
        flash_store_ds(ds, dpt, 16 * warp);
        __syncthreads();   // the block's dS^T is whole
        float dq[FLASH_STEP / 16 * HS / 32][4] = {};
        warp_product_dq<HS>(dq, ds, k, warp * HS / 4);   // dQ_step = dS K
        // the step's dQ: the key tiles from 0 up to its diagonal's, s / 2, in turn
        unsigned* turn = counters + ((size_t)b * NH + h) * steps_T + s;
        flash_wait_turn(turn, kt);
        flash_add_dq<HS>(sums + ((size_t)b * NH + h) * T * HS, dqkv + group + hi * HS, stride, dq, q0, warp * HS / 4, T,
                         kt == 0, diagonal, turn);
        flash_pass_turn(turn, kt);   // its barrier: every warp is done with this pair's buffers and dS^T
        hi = next_hi, s = next_s;
    }
    // (the tile again from the ticket in shared memory: at head size 64 a register less through the
    // loop, which keeps the block at 168 registers, three blocks per SM, without a spill)
    bg = (int)ticket[1], b = bg / G, g = bg % G, key0 = (int)ticket[0] * FLASH_ROWS + 16 * warp;
    flash_store_rows<HS>(dqkv + qkv_group_index(b, 0, g, per, T, NH, G, HS), stride, dk, key0, T);
    flash_store_rows<HS>(dqkv + qkv_group_index(b, 0, g, per + 1, T, NH, G, HS), stride, dv, key0, T);
}

// ---- the launches

// this process's GPU's compute capability, its major number (7: V100, 8: A100, 9: H100), asked once
static int device_major_version(void) {
    static int major = 0;
    if (major == 0) {
        int device;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    }
    return major;
}

// can this process's GPU run the fused attention? mma.sync.m16n8k16 and cp.async need sm_80
static int flash_attention_runs_here(void) { return device_major_version() >= 8; }

static void check_flash_arguments(int HS, const void* qkv, const void* dout) {
    if (!flash_attention_runs_here())
        fail("the fused attention needs a GPU of compute capability 8.0 or newer (A100, H100), this one is %d.x: "
             "run --attention-backend unfused", device_major_version());
    if (!flash_attention_supports(HS)) fail("the fused attention is built for head sizes 64 and 128, got %d", HS);
    if ((uintptr_t)qkv % 16 != 0 || (uintptr_t)dout % 16 != 0)
        fail("the fused attention copies 16 bytes at a time: qkv (%p) and dout (%p) must be 16-byte aligned", qkv, dout);
}

// a flash kernel's instance for the launcher's head size and ALiBi: a name with a comma in it
// cannot be LAUNCH's argument, a macro call can
#define FLASH_INSTANCE(kernel) kernel<HS, DROPOUT, ALIBI>

// a kernel may use more than 48 KiB of dynamic shared memory only after it asked for it
template <class Kernel>
static void allow_shared_bytes(Kernel* kernel, size_t bytes) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

template <int HS, bool DROPOUT, bool ALIBI>
static void attention_forward_flash_at(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int G, Alibi alibi,
                                       Dropout dropout) {
    static size_t allowed = 0;
    size_t bytes = flash_shared_bytes(HS, 1);
    if (allowed != bytes) allow_shared_bytes(FLASH_INSTANCE(attention_forward_flash_kernel), bytes), allowed = bytes;
    LAUNCH(FLASH_INSTANCE(attention_forward_flash_kernel), B * NH * CEIL_DIV(T, FLASH_ROWS), FLASH_THREADS, bytes,
           out, lse, qkv, T, NH, G, alibi, dropout);
}

template <int HS, bool DROPOUT, bool ALIBI>
static void attention_backward_flash_at(floatX* dqkv, float* sums, unsigned* counters, const float* D, const floatX* dout,
                                        const floatX* qkv, const float* lse, int B, int T, int NH, int G, int windows,
                                        Alibi alibi, Dropout dropout) {
    static size_t allowed = 0;
    size_t bytes = flash_shared_bytes(HS, 0);
    if (allowed != bytes) allow_shared_bytes(FLASH_INSTANCE(attention_backward_flash_kernel), bytes), allowed = bytes;
    int tiles = CEIL_DIV(T, FLASH_ROWS);   // a block per key tile of each (b, group)
    LAUNCH(FLASH_INSTANCE(attention_backward_flash_kernel), B * G * tiles, FLASH_THREADS, bytes, dqkv, sums, counters, dout,
           qkv, lse, D, B, T, NH, G, windows, alibi, dropout);
}

// the eight instances: head size 64 or 128, dropout or not, ALiBi or not
#define FLASH_DISPATCH(launcher, ...)                                                                      \
    do {                                                                                                    \
        bool drop = dropout.threshold != 0, bias = alibi.heads != 0;                                        \
        if (HS == 64 && drop && bias) launcher<64, true, true>(__VA_ARGS__);                                \
        else if (HS == 64 && drop) launcher<64, true, false>(__VA_ARGS__);                                  \
        else if (HS == 64 && bias) launcher<64, false, true>(__VA_ARGS__);                                  \
        else if (HS == 64) launcher<64, false, false>(__VA_ARGS__);                                         \
        else if (drop && bias) launcher<128, true, true>(__VA_ARGS__);                                      \
        else if (drop) launcher<128, true, false>(__VA_ARGS__);                                             \
        else if (bias) launcher<128, false, true>(__VA_ARGS__);                                             \
        else launcher<128, false, false>(__VA_ARGS__);                                                      \
    } while (0)

static void attention_forward_flash(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int G, int HS,
                                    Alibi alibi, Dropout dropout) {
    check_flash_arguments(HS, qkv, qkv);
    FLASH_DISPATCH(attention_forward_flash_at, out, lse, qkv, B, T, NH, G, alibi, dropout);
}

// The backward's ticket windows (issue 52): how many, so that a window holds at most
// FLASH_WINDOW_L2_BYTES of what its blocks read again (q and dout, the rows' lse and D, dQ's fp32
// sums: 532,480 bytes a (b, group) pair at GPT-2's T 1024 and head size 64, so 23 pairs). That is a
// quarter of an H100's 50 MB L2 (NVIDIA's "NVIDIA Hopper Architecture In-Depth", 2022): the blocks
// that run between two tiles of one pair belong to three windows at most (the list schedule in
// tests/recost.py: 69 pairs, 37 MB at 23 a window), and the rest holds the K and V tiles and the
// outputs streaming through. Windows of fewer pairs would not help: the 396 blocks an H100 runs at
// once belong to 56 to 72 pairs whatever the window (the same schedule, windows of 8 to 31 pairs).
#define FLASH_WINDOW_L2_BYTES 12500000
static int flash_ticket_windows(int B, int T, int NH, int G, int HS) {
    size_t pair = (size_t)(NH / G) * T * (HS * (4 + 2 * sizeof(floatX)) + 2 * sizeof(float));
    size_t most = FLASH_WINDOW_L2_BYTES / pair;   // pairs a window
    return most < 1 ? B * G : (int)CEIL_DIV((size_t)B * G, most);
}

// scratch: flash_backward_scratch_floats(B, T, NH, HS) floats (dQ's sums from its first 16-byte
// boundary, D, the counters); out and lse: the forward's. windows: flash_ticket_windows's (any
// other count from 1 to B G gives the same bits)
static void attention_backward_flash_windowed(floatX* dqkv, float* scratch, const floatX* dout, const floatX* qkv,
                                              const floatX* out, const float* lse, int B, int T, int NH, int G, int HS,
                                              Alibi alibi, Dropout dropout, int windows) {
    check_flash_arguments(HS, qkv, dout);
    size_t rows = (size_t)B * NH * T;
    float *sums = scratch + (16 - (uintptr_t)scratch % 16) % 16 / sizeof(float), *D = sums + rows * HS;   // (16-byte aligned)
    unsigned* counters = (unsigned*)(D + rows);
    int count = B * NH * CEIL_DIV(T, FLASH_STEP) + 1;   // the turns and the ticket
    LAUNCH(attention_backward_flash_d_kernel, CEIL_DIV(rows, ROWS_PER_BLOCK), ROW_BLOCK, 0, D, counters, count, dout, out,
           B, T, NH, HS);
    FLASH_DISPATCH(attention_backward_flash_at, dqkv, sums, counters, D, dout, qkv, lse, B, T, NH, G, windows, alibi, dropout);
}

static void attention_backward_flash(floatX* dqkv, float* scratch, const floatX* dout, const floatX* qkv, const floatX* out,
                                     const float* lse, int B, int T, int NH, int G, int HS, Alibi alibi, Dropout dropout) {
    attention_backward_flash_windowed(dqkv, scratch, dout, qkv, out, lse, B, T, NH, G, HS, alibi, dropout,
                                      flash_ticket_windows(B, T, NH, G, HS));
}
// The layer's layout decides which attention runs: lse given (the fused kernels keep the
// log-sum-exp), or att (the cuBLAS path keeps the probabilities).
static void attention_forward(floatX* out, floatX* att, float* lse, floatX* scratch, const floatX* qkv,
                              int B, int T, int NH, int G, int HS, Alibi alibi, Dropout dropout) {
    if (lse) attention_forward_flash(out, lse, qkv, B, T, NH, G, HS, alibi, dropout);
    else attention_forward_unfused(out, att, scratch, qkv, B, T, NH, G, HS, alibi, dropout);
}

static void attention_backward(floatX* dqkv, floatX* scratch, const floatX* dout, const floatX* qkv, const floatX* out,
                               const floatX* att, const float* lse, int B, int T, int NH, int G, int HS, Alibi alibi,
                               Dropout dropout) {
    if (lse) attention_backward_flash(dqkv, (float*)scratch, dout, qkv, out, lse, B, T, NH, G, HS, alibi, dropout);
    else attention_backward_unfused(dqkv, scratch, dout, qkv, att, B, T, NH, G, HS, dropout);
}
// selective recomputation's pass: the probabilities again, for the backward (the cuBLAS path
// alone: the fused attention keeps none, and its backward recomputes them itself)
static void attention_probabilities(floatX* att, floatX* scratch, const floatX* qkv, int B, int T, int NH, int G, int HS,
                                    Alibi alibi) {
    attention_probabilities_unfused(att, scratch, qkv, B, T, NH, G, HS, alibi);
}
#else
static int flash_attention_runs_here(void) { return 1; }   // the CPU build plans for any GPU

// one C attention: the layout's lse (never planned on this build) and out are not needed
#define attention_forward(out, att, lse, scratch, qkv, B, T, NH, G, HS, alibi, dropout) \
    attention_forward_cpu(out, att, qkv, B, T, NH, G, HS, alibi, dropout)
#define attention_backward(dqkv, scratch, dout, qkv, out, att, lse, B, T, NH, G, HS, alibi, dropout) \
    attention_backward_cpu(dqkv, scratch, dout, qkv, att, B, T, NH, G, HS, dropout)
#define attention_probabilities(att, scratch, qkv, B, T, NH, G, HS, alibi) \
    attention_probabilities_cpu(att, qkv, B, T, NH, G, HS, alibi)
#endif
