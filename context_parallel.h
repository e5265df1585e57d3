/*
context_parallel.h — context parallelism (CP): every sequence cut over the ranks of a
context-parallel group, and the attention that still sees the whole of it.

A sequence of T tokens is cut into 2 CP chunks of S = T / (2 CP) tokens. Rank r of the group
holds chunks r and 2 CP - 1 - r (Megatron-LM's load balancing for causal attention: a chunk near
the start attends to few keys, its partner near the end to many, so every rank does the same
work). At CP 2, T = 8 tokens, S = 2:

    positions   0 1 | 2 3 | 4 5 | 6 7
    chunk         0     1     2     3
    rank          0     1     1     0          rank 0: chunks 0 and 3, rank 1: chunks 1 and 2

A rank's T / CP local rows of a sequence are its two chunks, one after the other. Everything but
the attention works on them as on any rows: the linear layers, the norms, the MLP and the loss
are row by row; the positions a row needs (learned, rope, ALiBi, dropout's masks) are its global
ones (position_run_at, below); each weight's gradient is summed over DP x CP (parallel.h's
dp_cp group: for the weights a context-parallel rank is one more data-parallel rank).

The attention (context_attention_forward, _backward) needs every earlier token's key and value.
A rank's own keys and values travel as one block (its two chunks, packed as the KV cache's rows:
grouped-query attention sends its G heads only), and the rank's queries attend to each block it
gets: chunk by chunk, a key chunk after the query chunk is skipped, the same chunk is the causal
diagonal, an earlier one is attended whole (kernels/attention_blocks.cuh takes the global
positions and masks by them). Each block gives a partial output and its log-sum-exp, merged
into the running result by their log-sum-exp (attention_merge). Two ways to get the blocks,
--cp-comm-type (Megatron-LM's values):
  p2p         a ring (Liu et al. 2023, ring attention): at step k every rank holds the block of
              rank r - k, passes it to rank r + 1 and receives rank r - k - 1's, the transfer
              posted before the step's compute so that it hides behind it (CP - 1 transfers);
              the backward sends the blocks round again, and with them the partial sums of
              their keys' and values' gradients, each rank adding its share as a block passes;
              after CP steps one more transfer brings every block's sum home;
  all_gather  every block gathered at once (Llama 3's choice: simpler, CP times the memory of
              the keys and values), and the gradients of all of them reduce-scattered back.
The backward of a block (FlashAttention's) recomputes its probabilities from the merged
log-sum-exp the forward kept, so no rank keeps any block but its own.

Included between parallel.h (the ring's transfer, the group's collectives) and gpt.h (which
calls it from each layer's attention).
*/
#pragma once

typedef enum { CP_COMM_P2P, CP_COMM_ALL_GATHER, CP_COMM_A2A } CpCommType;   // --cp-comm-type

// ----------------------------------------------------------------------------
// the chunks: this rank's rows of a sequence and their global positions

typedef struct {
    int rank, size;   // this rank's place in the context-parallel group, and the group's size
    int chunk_rows;   // S = seq_length / (2 size): tokens of one chunk
    int rows;         // 2S = seq_length / size: this rank's tokens of a sequence (size 1: all, any length)
} ContextSlice;

static ContextSlice context_slice(int rank, int size, int seq_length) {
    ContextSlice c = {rank, size, seq_length / (2 * size), seq_length / size};
    return c;
}

// the global chunk of this rank's half 0 or 1 (its local rows [0, S) or [S, 2S))
static int slice_chunk(const ContextSlice* c, int rank, int half) { return half == 0 ? rank : 2 * c->size - 1 - rank; }

// the global position of local row t (0 <= t < 2S) of a sequence
static int slice_position(const ContextSlice* c, int t) {
    int S = c->chunk_rows;
    return c->size == 1 ? t : slice_chunk(c, c->rank, t / S) * S + t % S;
}

// a whole sequence's values (tokens, targets) at this rank's rows: local[t] = whole[position of t]
static void slice_sequence(int* local, const int* whole, const ContextSlice* c) {
    int S = c->chunk_rows;
    if (c->size == 1) memcpy(local, whole, c->rows * sizeof(int));
    else
        for (int half = 0; half < 2; half++) memcpy(local + half * S, whole + slice_chunk(c, c->rank, half) * S, S * sizeof(int));
}

// A stretch of rows whose positions follow each other: rows [row, row + count) of a micro-batch's
// [B x 2S] rows, all of sequence `sequence`, at global positions [position, position + count).
// What the kernels that read a row's position take at once (a table's rows, rope, dropout's
// masks), where one process takes a whole sequence.
typedef struct {
    int row, count, sequence, position;
} PositionRun;

// the run that starts at row `row` and ends at a chunk's end or at `end`
static PositionRun position_run_at(const ContextSlice* c, int row, int end) {
    int S = c->chunk_rows, t = row % (2 * S), left = S - t % S;
    PositionRun r = {row, end - row < left ? end - row : left, row / (2 * S), slice_position(c, t)};
    return r;
}

// ----------------------------------------------------------------------------
// the attention across the group

typedef struct {
    ContextSlice slice;
    CpCommType comm;
    Group* group;
    int B, NH, G, HS;          // sequences, this rank's query heads and key/value groups, head size
    RingTransfer kv_transfer, dkv_transfer;
    // scratch, shared by the layers (gpt.h lays it out in the arena: context_attention_layout)
    floatX* kv[2];             // p2p: the block held and the one arriving; all_gather: kv[0] holds all CP blocks
    float* dkv[3];             // p2p: this rank's share of the held block's gradient, the partial sum that
                               // arrived, the one sent on; all_gather: dkv[0] all CP blocks', dkv[1] this rank's sum
    float *out_part, *lse_part, *out_acc;   // a block's output and log-sum-exp, the running output
    float *dq, *D;             // the queries' gradient (fp32, summed over the blocks), rowsum(dout x out)
} ContextAttention;

static size_t kv_block_elems(const ContextAttention* c) {
    return (size_t)c->B * 2 * c->slice.chunk_rows * 2 * c->G * c->HS;
}
static size_t query_rows_elems(const ContextAttention* c) { return (size_t)c->B * 2 * c->slice.chunk_rows * c->NH * c->HS; }
static size_t lse_elems(const ContextAttention* c) { return (size_t)c->B * c->NH * 2 * c->slice.chunk_rows; }

// Lays the scratch out from base (NULL: only counts) with floatX of floatx_bytes (a dry run may
// lay out the other build's), returns its bytes: the keys and values of one block twice (p2p)
// or of all CP blocks (all_gather), their gradients in fp32 likewise (p2p: three, see above),
// the rows' fp32 outputs and gradients, the log-sum-exps
static size_t context_attention_layout(ContextAttention* c, char* base, int floatx_bytes) {
    size_t at = 0, kv = kv_block_elems(c), rows = query_rows_elems(c), lse = lse_elems(c);
    int gathered = c->comm == CP_COMM_ALL_GATHER;
    size_t blocks = gathered ? (size_t)c->slice.size : 1;
    for (int k = 0; k < 2; k++) c->kv[k] = (floatX*)region_take(base, &at, gathered && k ? 0 : blocks * kv * floatx_bytes);
    c->dkv[0] = (float*)region_take(base, &at, blocks * kv * sizeof(float));
    for (int k = 1; k < 3; k++) c->dkv[k] = (float*)region_take(base, &at, gathered && k == 2 ? 0 : kv * sizeof(float));
    c->out_part = (float*)region_take(base, &at, rows * sizeof(float));
    c->out_acc = (float*)region_take(base, &at, rows * sizeof(float));
    c->dq = (float*)region_take(base, &at, rows * sizeof(float));
    c->lse_part = (float*)region_take(base, &at, lse * sizeof(float));
    c->D = (float*)region_take(base, &at, lse * sizeof(float));
    return at;
}

// What rank `rank`'s query chunk of half qh does with key half kh of rank src's block: a key
// chunk after the query chunk is wholly masked (skipped), the same chunk is the causal diagonal,
// an earlier one is attended whole. The one rule: the attention's and --print-schedule's.
typedef enum { BLOCK_SKIPPED, BLOCK_DIAGONAL, BLOCK_WHOLE } BlockKind;
static BlockKind block_kind(const ContextSlice* s, int rank, int qh, int src, int kh) {
    int q_chunk = slice_chunk(s, rank, qh), kv_chunk = slice_chunk(s, src, kh);
    return kv_chunk > q_chunk ? BLOCK_SKIPPED : kv_chunk == q_chunk ? BLOCK_DIAGONAL : BLOCK_WHOLE;
}

// the queries of this rank's half qh against key half kh of the block rank `src` holds (in a kv
// buffer of that block's 2S rows a sequence), at their global positions: 0 where it is skipped
static int visible_block(const ContextAttention* c, int qh, int src, int kh, AttentionBlock* blk) {
    const ContextSlice* s = &c->slice;
    int S = s->chunk_rows, q_chunk = slice_chunk(s, s->rank, qh), kv_chunk = slice_chunk(s, src, kh);
    AttentionBlock b = {c->B, 2 * S, 2 * S, qh * S, kh * S, S, S, q_chunk * S, kv_chunk * S};
    *blk = b;
    return block_kind(s, s->rank, qh, src, kh) != BLOCK_SKIPPED;
}

// the forward of this rank's queries against rank src's block kv, merged into out_acc and lse
static void attend_to_block(ContextAttention* c, float* lse, const floatX* qkv, const floatX* kv, int src, Alibi alibi,
                            Dropout d) {
    AttentionBlock blk;
    for (int qh = 0; qh < 2; qh++)
        for (int kh = 0; kh < 2; kh++) {
            if (!visible_block(c, qh, src, kh, &blk)) continue;
            attention_block_forward(c->out_part, c->lse_part, qkv, kv, blk, c->NH, c->G, c->HS, alibi, d);
            attention_merge(c->out_acc, lse, c->out_part, c->lse_part, blk, c->NH, c->HS);
        }
}

// the backward of the same blocks: dq and this block's dkv (both fp32) get their shares
static void backward_through_block(ContextAttention* c, float* dkv, const floatX* dout, const float* lse,
                                   const floatX* qkv, const floatX* kv, int src, Alibi alibi, Dropout d) {
    AttentionBlock blk;
    for (int qh = 0; qh < 2; qh++)
        for (int kh = 0; kh < 2; kh++)
            if (visible_block(c, qh, src, kh, &blk))
                attention_block_backward(c->dq, dkv, dout, c->D, lse, qkv, kv, blk, c->NH, c->G, c->HS, alibi, d);
}

// the rank whose block rank r holds at step k of the ring: its own first, then the one before
static int ring_source_of(const ContextSlice* s, int r, int k) { return (r - k + s->size) % s->size; }
static int ring_source(const ContextAttention* c, int k) { return ring_source_of(&c->slice, c->slice.rank, k); }

// --profile's names of a ring step's compute (the transfer beside it is parallel.h's span)
static const char* const RING_STEP_NAMES[] = {"ring step 0", "ring step 1", "ring step 2", "ring step 3", "ring step 4",
                                              "ring step 5", "ring step 6", "ring step 7", "ring step 8+"};

// The layer's attention over the whole sequence: out [B x 2S, NH x HS] (floatX, this rank's rows)
// and lse [B, NH, 2S] (the merged log-sum-exp the backward needs), from this rank's qkv.
static void context_attention_forward(ContextAttention* c, floatX* out, float* lse, const floatX* qkv, Alibi alibi,
                                      Dropout d) {
    int C = c->slice.size, n = c->B * 2 * c->slice.chunk_rows;
    size_t kv = kv_block_elems(c);
    attention_accumulator_clear(c->out_acc, lse, c->B, 2 * c->slice.chunk_rows, c->NH, c->HS);
    if (c->comm == CP_COMM_ALL_GATHER) {
        floatX* mine = c->kv[0] + (size_t)c->slice.rank * kv;
        kv_cache_append(mine, qkv, n, 0, c->NH, c->G, c->HS);
        all_gather(c->group, mine, c->kv[0], kv);
        for (int src = 0; src < C; src++) attend_to_block(c, lse, qkv, c->kv[0] + (size_t)src * kv, src, alibi, d);
    } else {
        kv_cache_append(c->kv[0], qkv, n, 0, c->NH, c->G, c->HS);
        for (int k = 0; k < C; k++) {
            floatX *held = c->kv[k % 2], *next = c->kv[(k + 1) % 2];
            if (k + 1 < C) ring_transfer_start(&c->kv_transfer, c->group, held, next, kv, AS_FLOATX);   // first: it overlaps
            trace_begin(RING_STEP_NAMES[k < 8 ? k : 8], "context-parallel", ON_COMPUTE_STREAM);
            attend_to_block(c, lse, qkv, held, ring_source(c, k), alibi, d);
            trace_end();
            ring_transfer_finish(&c->kv_transfer);
        }
    }
    attention_output_rows(out, c->out_acc, query_rows_elems(c));
}

// p2p's backward: the blocks round the ring again; at step k this rank adds its share of the
// held block's gradient (dkv[0]) to the partial sum the ranks before it sent (dkv[1]) and sends
// the total (dkv[2]) on, the transfer hidden behind the next step; after CP steps the last
// transfer brings this rank's own block's sum into dkv[1]
static const float* ring_backward(ContextAttention* c, const floatX* dout, const floatX* qkv, const float* lse,
                                  Alibi alibi, Dropout d) {
    int C = c->slice.size;
    size_t kv = kv_block_elems(c);
    kv_cache_append(c->kv[0], qkv, c->B * 2 * c->slice.chunk_rows, 0, c->NH, c->G, c->HS);
    for (int k = 0; k < C; k++) {
        floatX *held = c->kv[k % 2], *next = c->kv[(k + 1) % 2];
        if (k + 1 < C) ring_transfer_start(&c->kv_transfer, c->group, held, next, kv, AS_FLOATX);
        dev_zero(c->dkv[0], kv * sizeof(float));
        trace_begin(RING_STEP_NAMES[k < 8 ? k : 8], "context-parallel", ON_COMPUTE_STREAM);
        backward_through_block(c, c->dkv[0], dout, lse, qkv, held, ring_source(c, k), alibi, d);
        trace_end();
        ring_transfer_finish(&c->kv_transfer);
        ring_transfer_finish(&c->dkv_transfer);   // (k > 0) the partial sum of this block from the ranks before
        if (k == 0) dev_copy(c->dkv[2], c->dkv[0], kv * sizeof(float));
        else add_floats(c->dkv[2], c->dkv[1], c->dkv[0], kv);
        ring_transfer_start(&c->dkv_transfer, c->group, c->dkv[2], c->dkv[1], kv, AS_FLOAT);
    }
    ring_transfer_finish(&c->dkv_transfer);
    return c->dkv[1];
}

// all_gather's backward: every block gathered again, every block's gradient from this rank's
// queries, then summed over the group into each block's owner (reduce-scatter)
static const float* gathered_backward(ContextAttention* c, const floatX* dout, const floatX* qkv, const float* lse,
                                      Alibi alibi, Dropout d) {
    int C = c->slice.size;
    size_t kv = kv_block_elems(c);
    floatX* mine = c->kv[0] + (size_t)c->slice.rank * kv;
    kv_cache_append(mine, qkv, c->B * 2 * c->slice.chunk_rows, 0, c->NH, c->G, c->HS);
    all_gather(c->group, mine, c->kv[0], kv);
    dev_zero(c->dkv[0], C * kv * sizeof(float));
    for (int src = 0; src < C; src++)
        backward_through_block(c, c->dkv[0] + (size_t)src * kv, dout, lse, qkv, c->kv[0] + (size_t)src * kv, src, alibi, d);
    reduce_scatter(c->group, c->dkv[0], c->dkv[1], kv, AS_FLOAT);
    return c->dkv[1];
}

// The backward: dqkv [B x 2S, (NH + 2G) HS] (overwritten) from dout, the forward's out and lse
static void context_attention_backward(ContextAttention* c, floatX* dqkv, const floatX* dout, const floatX* qkv,
                                       const floatX* out, const float* lse, Alibi alibi, Dropout d) {
    int n = c->B * 2 * c->slice.chunk_rows;
    attention_rows_dot(c->D, dout, out, c->B, 2 * c->slice.chunk_rows, c->NH, c->HS);
    dev_zero(c->dq, query_rows_elems(c) * sizeof(float));
    const float* dkv = c->comm == CP_COMM_ALL_GATHER ? gathered_backward(c, dout, qkv, lse, alibi, d)
                                                     : ring_backward(c, dout, qkv, lse, alibi, d);
    attention_block_gradients_into_qkv(dqkv, c->dq, dkv, n, c->NH, c->G, c->HS);
}

static void context_attention_init(ContextAttention* c) {
    ring_transfer_init(&c->kv_transfer, 1);   // (the backward has both in flight at once)
    ring_transfer_init(&c->dkv_transfer, 2);
}

static void context_attention_free(ContextAttention* c) {
    ring_transfer_free(&c->kv_transfer);
    ring_transfer_free(&c->dkv_transfer);
}
