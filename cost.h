/*
cost.h — the planner's cost model: one step's time on a described cluster, priced from what the
step does on each pipeline stage, kernel by kernel and message by message (the charges, the
messages and their groups, the overlaps, the hardware's efficiencies), and the attention's choice
that rests on it (--attention-backend auto). plan.h, above it, lays the layouts out and prints
the dry run; hardware.h, below it, describes the machines priced.

Interface (what plan.h and train.c use): StageCost, DPOverlap, NUM_COMM_GROUPS and the groups'
order (--log-comm's), plan_stage_cost, gemm_only_seconds, print_stage_costs, runs_flash_attention,
print_attention.
*/
#pragma once

// ----------------------------------------------------------------------------
// the planner's cost model (--dry-run): one step's time on a described GPU cluster, from what
// the step does on each pipeline stage, kernel by kernel and message by message, as the GPU
// build does it. Everything runs on one stream in order, so nothing overlaps and the costs add
// (but for --overlap-grad-reduce's buckets, which run beside the last backward:
// overlapped_reduce_seconds; --overlap-param-gather's, beside the next forward:
// overlapped_gather_seconds; and context parallelism's ring, beside its blocks' attention:
// cost_layer_attention):
//   a matmul (cuBLAS)     its FLOPs / (the dense peak x the matmul efficiency x its shape's
//                         wave efficiency), or its bytes at the streaming bandwidth when that
//                         is longer (gemm_seconds);
//   the fused attention   each kernel's tile FLOPs / (the peak x the attention efficiency),
//                         or its first reads and writes at the streaming bandwidth, or all its
//                         bytes at L2's bandwidth, whichever is longest (charge_flash_kernel);
//   a column reduction    its bytes at the streaming bandwidth, or its chains of dependent
//                         round trips to memory when they are longer (chain_seconds);
//   any other kernel      the bytes it reads and writes / the streaming bandwidth (the memory
//                         bandwidth x the memory efficiency);
//   a launch              the device idle between two kernels (charge_launch_gaps);
//   a ring collective     steps x latency + the bytes each rank sends / the bandwidth of the
//                         slowest link the group crosses (the alpha-beta model of Thakur,
//                         Rabenseifner and Gropp 2005; the bytes as --log-comm counts them);
//   a pipeline send       latency + its bytes / the link between the two stages;
//   a context-parallel    with --cp-comm-type p2p each transfer of the ring beside one ring
//   ring transfer         step's block attention, only what it takes beyond that compute
//                         exposed (cost_layer_attention); all_gather's collectives as any
//                         ring collective, nothing beside them.
// Not priced: dropout (gpt.h dropout_of): two elementwise passes a layer each way and a
// SplitMix64 hash an element (integer units no preset describes; the attention's inside the fused
// tiles). V100's and A100's constants were fitted to BigScience's runs, with Megatron-LM's dropout
// 0.1, so they carry its time; H100's, fitted to a run without, does not (issue 48).
// A 1F1B step is (m + p - 1) slots of the slowest stage's forward and backward of one
// micro-batch (p - 1 of them the bubble: Narayanan et al. 2021), then the optimizer: the tied
// embedding's all-reduce, the ZeRO reduce-scatter, the norm, AdamW and the all-gather. With v
// model chunks a stage (interleaved 1F1B, §2.2) the bubble is p - 1 slots of one chunk, so the
// step is (m + (p - 1) / v) slots, each slot with v times the pipeline's messages. GPipe's
// bubble is 1F1B's; ZB-H1's is its walk placed with a layer's forward, backward less W and W
// (layer_weight_gradient_seconds): print_schedule.h's schedule_bubble.

// The bandwidth (bytes/s) a group's ring runs at. Ranks fill nodes in order (gpus_per_node
// each) and a group's members are `stride` ranks apart (TP 1, CP TP, DP x CP TP, PP TP x CP x
// DP: Megatron-LM's order, parallel.h grid_build): the group
// starting at rank 0 stays in one node when its last member is below gpus_per_node; else
// its ring crosses the network, the slowest link.
static double group_bandwidth(const Hardware* hw, int stride, int size) {
    int in_one_node = (double)stride * (size - 1) < hw->gpus_per_node;
    return 1e9 * (in_one_node ? hw->nvlink_bandwidth : hw->internode_bandwidth);
}

// A GEMM's time by its shape (NVIDIA, "Matrix Multiplication Background User's Guide",
// DU-09799-001, 2023). cuBLAS computes the M x N output in tiles, one thread block each, and
// the GPU runs the blocks in waves of one per SM (ch. 3, "Dimension quantization effects"):
// M and N are padded up to whole tiles (tile quantization) and a last, partial wave leaves SMs
// idle (wave quantization), so a GEMM takes ceil(tiles / SMs) waves of one tile's time where
// tiles / SMs would do. An output of fewer tiles than SMs (a weight gradient, hidden x hidden
// over the tokens) is split along K across blocks (split-K, as CUTLASS's efficient_gemm.md
// describes it), up to the SMs, each slice keeping GEMM_SPLIT_K of K at least. The tile is
// 128 x 128, one of the typical cuBLAS tiles the guide lists (§2.3). A GEMM whose arithmetic
// intensity is below the GPU's FLOPs-to-bytes ratio is bound by its bytes instead (ch. 2,
// "Math and memory bounds"). What this leaves out: cuBLAS's choice among tile sizes (a GEMM
// just past a whole wave may do better with another tile than this model says), and a tile's
// own efficiency, which the fitted matmul efficiency carries.
#define GEMM_TILE 128      // an output tile's rows and columns
#define GEMM_SPLIT_K 256   // the least K one split-K slice keeps

// the fraction of its waves' time batch GEMMs of (M x K) by (K x N) keep the SMs busy
static double gemm_wave_efficiency(const Hardware* hw, double M, double N, double K, double batch) {
    double sms = hw->sm_count, tiles = ceil(M / GEMM_TILE) * ceil(N / GEMM_TILE) * batch, splits = 1.0;
    if (tiles < sms) splits = fmax(1.0, fmin(floor(sms / tiles), floor(K / GEMM_SPLIT_K)));
    double waves = ceil(tiles * splits / sms);
    return M * N * batch * splits / (waves * sms * GEMM_TILE * GEMM_TILE);
}

// the bytes a kernel moves in a second: the memory bandwidth at the memory efficiency
static double streaming_bandwidth(const Hardware* hw) { return 1e9 * hw->memory_bandwidth * hw->memory_efficiency; }

// batch GEMMs of (M x K) by (K x N) in floatX (x bytes): the math at the matmul efficiency and
// the shape's wave efficiency, or both inputs read and the output written, whichever is longer
static double gemm_seconds(const Hardware* hw, double M, double N, double K, double batch, double x) {
    double waves = hw->cpu_threads > 0.0 ? 1.0 : gemm_wave_efficiency(hw, M, N, K, batch);   // none on a CPU (hardware.h)
    double math = 2.0 * M * N * K * batch / (1e12 * hw->peak_tflops * hw->matmul_efficiency * waves);
    return fmax(math, (M * K + K * N + M * N) * batch * x / streaming_bandwidth(hw));
}

// --log-comm's order. GROUP_DP is the group ZeRO shards over and a weight's gradient is summed
// over: DP x CP (parallel.h's dp_cp); GROUP_CP the context-parallel ring's (grid.cp); GROUP_EP the
// experts' all-to-alls, GROUP_EXPERT_DP the experts' gradients' and ZeRO's with EP > 1 (ExpertLayout)
enum { GROUP_TP, GROUP_DP, GROUP_PP, GROUP_EMBEDDING, GROUP_CP, GROUP_EP, GROUP_EXPERT_DP, NUM_COMM_GROUPS };

// A mixture of experts as the planner lays it out. Expert parallelism is Megatron-Core's: the EP
// ranks of an MoE layer are taken from the DP x CP ones (its "parallel folding": the experts' own
// grid, tensor rank fastest, then EP, then the expert-data-parallel group, so that an EP group is
// TP ranks apart, as the DP x CP group's members are); each holds E / EP of the experts, and
// their gradients and ZeRO-1 state are summed and sharded over the expert-data-parallel group of
// DP x CP / EP ranks, the dense parameters' over DP x CP as without experts. The trainer does not
// run EP > 1 yet (config.h refuses it outside --dry-run): the planner's EP is its plan.
typedef struct {
    int ep;             // --expert-model-parallel-size
    double imbalance;   // --moe-imbalance: the busiest expert's rows over its layer's mean (1: balanced)
} ExpertLayout;

// One stage's costs: each kernel (summed over its calls) and each group's messages
#define MAX_COSTS 56
typedef struct {
    const char* name;
    double launches, flops, bytes, seconds;   // bytes: read + written, or sent; launches: kernels or messages
    int matmul;                               // a cuBLAS GEMM's row: the GEMM-only part of the step
} Cost;
typedef struct {
    const Hardware* hw;
    ExpertLayout experts;
    double group_bandwidth[NUM_COMM_GROUPS];
    double calls;                          // each charge is made this many times (micro-batches)
    Cost costs[MAX_COSTS];
    int num_costs;
    double pending_launches;               // kernels charged since the last charge_launch_gaps, per call
    double bytes_sent[NUM_COMM_GROUPS];    // per step, as --log-comm counts them
    double seconds;
    double reduce_total, reduce_hidden;    // --overlap-grad-reduce: its reduces' time, and how much of it the backward hides
    double gather_total, gather_hidden;    // --overlap-param-gather: its broadcasts' time, and how much the forward hides
    double ring_total, ring_hidden;        // --cp-comm-type p2p: the ring's transfers' time, and how much the blocks hide
    double ring_step[2];                   // the block attention one ring step's transfers run beside: forward, backward
} StageCost;

// the bucket sizes of the DP overlaps (0: off): --overlap-grad-reduce's and --overlap-param-gather's
typedef struct {
    size_t reduce_bucket, gather_bucket;
} DPOverlap;

// adds to the row `name` (made on first use); returns it
static Cost* charge(StageCost* c, const char* name, int launches, double flops, double bytes, double seconds) {
    int k = 0;
    while (k < c->num_costs && strcmp(c->costs[k].name, name) != 0) k++;
    if (k == c->num_costs) {
        if (k == MAX_COSTS) fail("the cost model has more than %d kinds of work", MAX_COSTS);
        Cost empty = {name, 0.0, 0.0, 0.0, 0.0, 0};
        c->costs[c->num_costs++] = empty;
    }
    Cost* k_cost = &c->costs[k];
    k_cost->launches += c->calls * launches;
    k_cost->flops += c->calls * flops;
    k_cost->bytes += c->calls * bytes;
    k_cost->seconds += c->calls * seconds;
    c->seconds += c->calls * seconds;
    return k_cost;
}

// one kernel of a stream (anything charge_launch_gaps counts): a row of `launches` launches
static Cost* charge_launches(StageCost* c, const char* name, int launches, double flops, double bytes, double seconds) {
    c->pending_launches += launches;
    return charge(c, name, launches, flops, bytes, seconds);
}

// The device idle between the kernels charged since the last call (a micro-batch's, the
// optimizer's): launch_us each, one row. A kernel starts once the one before it has drained
// and the next launch has reached the SMs; the stream is kept full (the host runs ahead), so
// this is the device's gap, not the host's launch time.
static void charge_launch_gaps(StageCost* c) {
    if (c->pending_launches > 0.0)
        charge(c, "kernel launch gaps (the device idle)", (int)c->pending_launches, 0.0, 0.0,
               c->pending_launches * 1e-6 * c->hw->launch_us);
    c->pending_launches = 0.0;
}

// one cuBLAS GEMM launch: batch products of (M x K) by (K x N) in floatX (x bytes)
static void charge_matmul(StageCost* c, const char* name, double M, double N, double K, double batch, double x) {
    charge_launches(c, name, 1, 2.0 * M * N * K * batch, (M * K + K * N + M * N) * batch * x,
                    gemm_seconds(c->hw, M, N, K, batch, x))->matmul = 1;
}

// a linear layer's backward over N tokens, `in` to `out` features: dinp = dout W (N x in, over
// out) and dW = dout^T inp (out x in, over the tokens)
static void charge_linear_backward(StageCost* c, const char* name, double N, double in, double out, double x) {
    charge_matmul(c, name, N, in, out, 1.0, x);
    charge_matmul(c, name, out, in, N, 1.0, x);
}

static void charge_kernel(StageCost* c, const char* name, int launches, double bytes) {
    charge_launches(c, name, launches, 0.0, bytes, bytes / streaming_bandwidth(c->hw));
}

// ----------------------------------------------------------------------------
// the column reductions: latency-bound where they are
//
// A column reduction's thread walks down rows, adding one load after another, and nvcc issues
// only a few loads ahead of the add that needs them (the counts below, read in the kernels'
// sm_80 and sm_90 SASS). Each such batch of loads is a round trip to memory that the next
// one waits for: a chain. A kernel of few blocks, or of blocks with long chains, has too
// little in flight to keep the memory busy (Little's law: the bandwidth a kernel reaches is
// the bytes it has in flight over the latency), and runs at its chains' pace. Its time is
// the longer of its bytes at the streaming bandwidth and its waves of chains (chain_seconds):
// LayerNorm's and RMSNorm's backward with their column_partials_add, and the bias gradients'
// column_sums_kernel (kernels/norms.cuh; the column reductions: kernels/embedding.cuh, kernels/linear.cuh).
#define COLUMN_SUM_ROWS_AHEAD 4          // column_sums_kernel's loads down its chunk's rows: 4 issued before the first add
#define PARTIALS_AHEAD 16                // column_sums_kernel's last block's loop over the partials
#define PARTIALS_ADD_AHEAD 4             // column_partials_add_kernel's run of chunks (its UNROLL_4)
#define NORM_BACKWARD_REGISTERS 128      // norm_backward_chunk's thread (LayerNorm's and RMSNorm's, issue 39's kernel):
                                         // ptxas for sm_90, 2 blocks an SM
#define COLUMN_SUMS_REGISTERS 32         // 8 blocks an SM (the 2048 threads bound it)
#define PACK 8                           // the floatX a 128-bit pack moves (kernels/common.cuh's X128, of the CUDA build only)

// the blocks of `threads` threads an SM holds when each thread takes `registers`: 64K registers
// and 2048 threads an SM on sm_80 and sm_90 (CUDA C++ Programming Guide, the table of the
// compute capabilities' technical specifications)
static double blocks_per_sm(double threads, double registers) {
    return fmax(1.0, fmin(floor(65536.0 / (threads * registers)), floor(2048.0 / threads)));
}

// `blocks` blocks, `per_sm` of them at a time on each SM, each waiting through `trips` round
// trips to memory and then `l2_trips` to L2, one after another
static double chain_seconds(const Hardware* hw, double blocks, double per_sm, double trips, double l2_trips) {
    double waves = ceil(blocks / (per_sm * hw->sm_count));
    return waves * (trips + L2_LATENCY_FRACTION * l2_trips) * 1e-6 * hw->memory_latency_us;
}

// one latency-bound kernel: its bytes at the streaming bandwidth, or its chains if longer
static void charge_reduction(StageCost* c, const char* name, double bytes, double chains) {
    charge_launches(c, name, 1, 0.0, bytes, fmax(bytes / streaming_bandwidth(c->hw), chains));
}

// A bias gradient over [rows, width], one launch of column_sums_kernel: chunks x tiles blocks
// of COLUMN_BLOCK threads, a thread a column down its chunk's rows (bias_grad_chunks: the
// chunking is a function of the shape alone), reading dout and writing one fp32 partial per
// chunk and column; the last block of each column tile, after the tile's counter (an atomic:
// one L2 trip), reads the partials back from L2 and adds them into the gradient.
static void charge_bias_grad(StageCost* c, int rows, int width, double x) {
    double chunks = bias_grad_chunks(rows, width), tiles = ceil((double)width / COLUMN_BLOCK);
    double chunk_rows = ceil((double)rows / chunks), partials = chunks * width * 4.0;
    double chains = chain_seconds(c->hw, chunks * tiles, blocks_per_sm(COLUMN_BLOCK, COLUMN_SUMS_REGISTERS),
                                  ceil(chunk_rows / COLUMN_SUM_ROWS_AHEAD), 0.0) +
                    chain_seconds(c->hw, 1.0, 1.0, 0.0, 1.0 + ceil(chunks / PARTIALS_AHEAD));   // the last blocks'
    charge_reduction(c, "bias gradients (column sums)", (double)rows * width * x + 2.0 * partials + 8.0 * width, chains);
}

// A bias gradient summed in its weight gradient's GEMM (cuBLASLt's BGRADB epilogue: kernels/linear.cuh's
// matmul_backward_params; the GEMM reads dout anyway, the epilogue's cost inside the GEMMs'
// efficiency), then one launch of column_partials_add adding the width sums to the gradient:
// a block of COLUMN_ADD_BLOCK threads per 32 columns, each thread one trip to memory
static void charge_epilogue_bias_grad(StageCost* c, int width) {
    double bytes = 3.0 * 4.0 * width;   // the sums read, the gradient read and written
    double chains = chain_seconds(c->hw, ceil(width / 32.0), blocks_per_sm(COLUMN_ADD_BLOCK, 32), 1.0, 0.0);
    charge_reduction(c, "bias gradients (GEMM epilogue, then added)", bytes, chains);
}

// a message of `bytes` sent by each rank of the group in `steps` ring steps
static void charge_message(StageCost* c, const char* name, int group, double steps, double bytes) {
    charge(c, name, 1, 0.0, bytes, steps * 1e-6 * c->hw->latency_us + bytes / c->group_bandwidth[group]);
    c->bytes_sent[group] += c->calls * bytes;
}

// the ring algorithms, as parallel.h's wrappers count them
static void charge_all_reduce(StageCost* c, const char* name, int group, int size, double bytes) {
    if (size > 1) charge_message(c, name, group, 2.0 * (size - 1), 2.0 * (size - 1) / size * bytes);
}
// a reduce-scatter or an all-gather of a whole buffer of `bytes` (each rank's part 1/size of it):
// an all-reduce's two halves
static void charge_half_all_reduce(StageCost* c, const char* name, int group, int size, double bytes) {
    if (size > 1) charge_message(c, name, group, size - 1.0, (size - 1.0) / size * bytes);
}

// Where tensor parallelism joins the residual stream, `count` times, on the whole rows' [N, C]
// of `bytes`: an all-reduce each (f or g); with sequence parallelism `gathers` all-gathers and
// `scatters` reduce-scatters instead (gpt.h's column_parallel_input, row_parallel_linear_forward ...)
static void charge_tensor_parallel_joins(StageCost* c, const GPT* m, int tp_size, double bytes, int all_reduces,
                                         int gathers, int scatters) {
    for (int k = 0; k < all_reduces && !m->sequence_parallel; k++)
        charge_all_reduce(c, "tensor-parallel all-reduce", GROUP_TP, tp_size, bytes);
    for (int k = 0; k < gathers && m->sequence_parallel; k++)
        charge_half_all_reduce(c, "sequence-parallel all-gather", GROUP_TP, tp_size, bytes);
    for (int k = 0; k < scatters && m->sequence_parallel; k++)
        charge_half_all_reduce(c, "sequence-parallel reduce-scatter", GROUP_TP, tp_size, bytes);
}

// ----------------------------------------------------------------------------
// the attention's costs, fused or not, and --attention-backend auto's choice between them

// The fused kernels' tiles are kernels/attention.cuh's: FLASH_ROWS, FLASH_KEYS(HS), FLASH_STEP.

// ATTENTION EFFICIENCY: the presets' fraction of the peak the fused kernels' products reach,
// from FlashAttention-2's published figures (Dao 2023, "FlashAttention-2: Faster Attention with
// Better Parallelism and Work Partitioning", arXiv 2307.08691). The paper times its kernels on
// an A100 80GB SXM4 and an H100 80GB SXM5 for sequences of 512 to 16k (16k tokens a batch),
// head sizes 64 and 128, causal and not (Figs. 4-7). Its text says of them: on A100, 50-73% of
// the peak across those settings (abstract), up to 73% in the forward and 63% in the backward
// (§1); on H100, the same code, up to 335 TFLOP/s (§4.1, Fig. 7), 34% of 989 (35%, says
// FlashAttention-3's abstract, Shah et al. 2024). GPT-2's shape (causal, head size 64, T 1024)
// sits at the low end of the benchmark, and the figures' bars are not in the text, so: A100
// 0.50, the low end of the stated range; H100 the best scaled as A100's range is, 0.34 x 50 /
// 73 = 0.23. A check at exactly that shape: FlashAttention-2's forward on an H100 at 198
// TFLOP/s (causal, d 64, T 1024; a third-party measurement in triton-lang/triton pull request
// 2459), 0.20 of 989.
// From their FLOPs to ours: the paper counts a causal forward as half the square, 4 T^2 d / 2
// per head, and a backward as 2.5 forwards (its 5 products against 2). Our kernels execute more:
// the diagonal tiles whole (at T 1024, 136 pairs of 64 x 64 a head against the 128 of half the
// square, and 272 of the backward's 64-key tiles by 32-row steps against 256: 1.06x both). The
// efficiency is applied to what we execute, so the extra work costs its full time: our
// products are taken to run as fast as FlashAttention-2 runs its counted ones, no faster.

// the fused kernels' work on one head of T rows (whole tiles, the diagonal's too: the causal
// mask is applied inside a tile, never by skipping part of one)
typedef struct {
    double forward_pairs;    // (64-row query tile, key tile: 64 keys, 32 at HS 128) pairs at and left of the diagonal
    double backward_steps;   // (64-key tile, 32-row query step) at and below the diagonal
} FlashWork;

static FlashWork flash_work(double T, double HS) {
    FlashWork f = {0.0, 0.0};
    for (double r0 = 0.0; r0 < T; r0 += FLASH_ROWS) {   // tile r0 .. r0 + 63: of queries, or of keys
        double keys_seen = fmin(T, r0 + FLASH_ROWS);      // a query tile's keys at and left of the diagonal
        f.forward_pairs += ceil(keys_seen / FLASH_KEYS(HS));
        f.backward_steps += ceil((T - r0) / FLASH_STEP);   // a key tile's queries at and below it
    }
    return f;
}

// One fused kernel, the longest of three (the roofline, as gemm_seconds, with L2 for a second
// memory): its products at the attention efficiency; what it reads first and writes, at the
// streaming bandwidth; every load and store it issues, at L2's bandwidth. Not their sum: the
// products of one tile overlap the loads of the next (cp.async, double-buffered), and
// FlashAttention-2's measured efficiency already holds its own loads. What a kernel reads
// again (K and V for each tile pair, the backward's Q and dO for each step) comes from L2,
// where the first read left it: the blocks of one head's tiles are adjacent (kernels/flash_attention.cuh's
// flash_query_block), so a few heads' K and V are in use at a time, megabytes against L2's
// 40-50. `bytes`: every load and store; `first`: the part that touches memory.
static void charge_flash_kernel(StageCost* c, double flops, double bytes, double first) {
    double products = flops / (1e12 * c->hw->peak_tflops * c->hw->attention_efficiency);
    double memory = first / streaming_bandwidth(c->hw), l2 = bytes / (1e9 * c->hw->l2_bandwidth);
    charge_launches(c, "attention, fused (FlashAttention-2 design)", 1, flops, bytes, fmax(products, fmax(memory, l2)));
}

// the fused forward of BH heads of T x HS: one block of 4 warps per 64-row query tile, stepping
// over the key tiles (K = FLASH_KEYS(HS): 64 keys, 32 at HS 128) at and left of the diagonal; a
// pair is S = Q K^T and O += P V, 2 x 64 x K x HS FLOPs each. Q read once, K and V once a pair
// (from memory the first time), the output and the log-sum-exp (fp32) written. Its shared
// memory, flash_shared_bytes (46,080 bytes at HS 64, 52,224 at 128; each backward kernel's
// about as much), bounds the blocks an SM holds: not modelled apart, the efficiency carries it.
static void cost_flash_forward(StageCost* c, double BH, double T, double HS, double x) {
    FlashWork f = flash_work(T, HS);
    charge_flash_kernel(c, BH * f.forward_pairs * 2.0 * (2.0 * FLASH_ROWS * FLASH_KEYS(HS) * HS),
                        BH * ((2.0 * T * HS + f.forward_pairs * 2.0 * FLASH_KEYS(HS) * HS) * x + 4.0 * T),
                        BH * (4.0 * T * HS * x + 4.0 * T));
}

// The fused backward, deterministic, two kernels. D = rowsum(dout * out): dout and out read, D
// written (and the next kernel's counters zeroed, one a query step). Then one block per 64-key
// tile steps down the 32-row query steps at and below it, FlashAttention-2's 5 products a step
// (S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q, dQ_step = dS K), each 2 x 64 x 32 x HS
// FLOPs: K and V read and dK, dV written once a tile, Q and dO (and the rows' lse and D) read
// once a step. A step's dQ is the sum of the parts of its key tiles, added in tile order (not
// by atomics: the same bits every run) through fp32 sums in scratch: each part but the first
// reads the sums, each but the last writes them, the last writes dQ itself. Its bytes with
// memory follow the windowed order of its tickets (issue 52; kernels/flash_attention.cuh's
// flash_ticket_windows): tile 0 of each pair of a window, then tile 1..., the windows of at
// most FLASH_WINDOW_L2_BYTES of what a pair's blocks read again (q, dO, lse, D, the sums), so
// the pairs touched between two tiles of one pair hold about three windows (tests/recost.py's
// list schedule: 66-69 pairs, 35-37 MB at GPT-2's shapes), inside the L2 of every preset with
// the fused kernels (A100 40 MB, H100 50 MB): every re-read comes from L2 and only the first
// read of each reaches memory, the sums written back once: the bytes tests/recost.py's L2 model
// gives that order (attention_backward_hbm, where they fit). Before the windows (tile 0 of
// every pair, then tile 1...) the touched pairs were all B x G of them, every re-read from
// memory at 64 x 1024 (63.5 GB a step by that model against 10.9).
static void cost_flash_backward(StageCost* c, double BH, double T, double HS, double x) {
    FlashWork f = flash_work(T, HS);
    double tiles = ceil(T / FLASH_ROWS), steps = ceil(T / FLASH_STEP), tile = FLASH_ROWS * HS * x;
    double step = FLASH_STEP * HS * x, rows = T * HS * x;   // rows: one of Q, K, V, dO, dQ... of the head
    double D = BH * (2.0 * rows + 4.0 * T + 4.0 * steps);
    charge_flash_kernel(c, 0.0, D, D);
    double sums = (f.backward_steps - steps) * 2.0 * FLASH_STEP * HS * 4.0 + rows;   // dQ's parts added, dQ written
    charge_flash_kernel(c, BH * f.backward_steps * 5.0 * (2.0 * FLASH_ROWS * FLASH_STEP * HS),
                        BH * (tiles * 4.0 * tile + f.backward_steps * (2.0 * step + 2.0 * 4.0 * FLASH_STEP) + sums),
                        BH * (7.0 * rows + 8.0 * T + 4.0 * T * HS));   // K, V, Q, dO read; dK, dV, dQ written; lse, D; the sums
}

// the unfused attention of BH heads of T x HS (the cuBLAS path): q, k, v permuted out of qkv,
// the scores and the values as batched GEMMs over the whole square, a softmax kernel that
// writes P fp32 scores first (the scores product) and reads the causal half three times
// the probabilities (attention_probabilities_unfused): q, k, v permuted, the scores, the softmax
static void cost_unfused_probabilities(StageCost* c, double BH, double T, double HS, double x) {
    double S = BH * T * HS, P = BH * T * T;   // one of q, k, v; the probabilities
    charge_kernel(c, "attention permutes", 1, 6.0 * S * x);
    charge_matmul(c, "attention T x T products (cuBLAS, batched)", T, T, HS, BH, x);   // scores = q k^T
    charge_kernel(c, "attention softmax", 1, P * 4.0 + 1.5 * P * 4.0 + P * x);
}

static void cost_unfused_forward(StageCost* c, double BH, double T, double HS, double x) {
    double S = BH * T * HS;
    cost_unfused_probabilities(c, BH, T, HS, x);
    charge_matmul(c, "attention T x T products (cuBLAS, batched)", T, HS, T, BH, x);   // out = att v
    charge_kernel(c, "attention permutes", 1, 2.0 * S * x);                            // out's heads back in place
}

static void cost_unfused_backward(StageCost* c, double BH, double T, double HS, double x) {
    double S = BH * T * HS, P = BH * T * T;
    const char* products = "attention T x T products (cuBLAS, batched)";
    charge_kernel(c, "attention permutes", 3, (6.0 * S + 2.0 * S + 6.0 * S) * x);
    charge_matmul(c, products, T, T, HS, BH, x);   // datt = dout v^T
    charge_matmul(c, products, T, HS, T, BH, x);   // dv = att^T dout
    charge_matmul(c, products, T, HS, T, BH, x);   // dq = dpreatt k
    charge_matmul(c, products, T, HS, T, BH, x);   // dk = dpreatt^T q
    charge_kernel(c, "attention softmax", 1, P * 4.0 + P * x + P * 4.0 + P * x);   // datt written, read; att read; dscores
}

// one layer's attention of BH heads of T x HS, fused or not, forward or backward
static void cost_attention(StageCost* c, double BH, double T, double HS, double x, int fused, int backward) {
    if (fused) backward ? cost_flash_backward(c, BH, T, HS, x) : cost_flash_forward(c, BH, T, HS, x);
    else backward ? cost_unfused_backward(c, BH, T, HS, x) : cost_unfused_forward(c, BH, T, HS, x);
}

// the seconds of one layer's attention, forward and backward, of B sequences of T and H heads
// of HS on hw in the GPU build's 16 bits, fused or not
static double attention_seconds(const Hardware* hw, double B, double H, double T, double HS, int fused) {
    StageCost c;
    memset(&c, 0, sizeof(c));
    c.hw = hw;
    c.calls = 1.0;
    cost_attention(&c, B * H, T, HS, 2.0, fused, 0);
    cost_attention(&c, B * H, T, HS, 2.0, fused, 1);
    return c.seconds;
}

// --attention-backend auto on the GPU build: the fused kernels where they take the head size and
// --hw's GPU has them (a run's: the default preset's), if the cost model estimates them faster
// than the unfused path for a micro-batch of the heads of one tensor rank; the two estimates
// (seconds, 0 when not compared) into *fused_s and *unfused_s
static int auto_picks_fused(const Config* a, double* fused_s, double* unfused_s) {
    const GPTConfig* m = &a->model;
    int head_size = m->hidden_size / m->num_attention_heads;
    double B = a->micro_batch_size, H = (double)m->num_attention_heads / a->tensor_model_parallel_size;
    Hardware hw = hardware_of(a);
    *fused_s = *unfused_s = 0.0;
    if (!flash_attention_supports(head_size) || hw.attention_efficiency <= 0.0) return 0;
    if (GPU_BUILD && !a->dry_run && !flash_attention_runs_here()) return 0;   // a real run on a GPU before sm_80
    *fused_s = attention_seconds(&hw, B, H, m->seq_length, head_size, 1);
    *unfused_s = attention_seconds(&hw, B, H, m->seq_length, head_size, 0);
    return *fused_s <= *unfused_s;
}

// --attention-backend on a build (gpu: the GPU build's): does it run the fused attention? The
// CPU build has one attention, the C reference, whatever the flag says.
static int runs_flash_attention(const Config* a, int gpu) {
    double fused_s, unfused_s;
    if (!gpu || a->attention_backend == ATTENTION_UNFUSED) return 0;
    return a->attention_backend == ATTENTION_FLASH || auto_picks_fused(a, &fused_s, &unfused_s);
}

// the name of the value a CHOICE field of the run's list (at offset in Config) has in a
static const char* run_choice_name(const Config* a, size_t offset, char* out, size_t len) {
    out[0] = '\0';
    for (int k = 0; k < NUM_RUN_FIELDS; k++)
        if (RUN_FIELDS[k].offset == offset) choice_name(&RUN_FIELDS[k], *(const int*)((const char*)a + offset), out, len);
    return out;
}

// why auto chose what it did, for the attention line: ": ..." (auto only)
static void auto_attention_reason(const Config* a, char* why, size_t len) {
    int head_size = a->model.hidden_size / a->model.num_attention_heads;
    double fused_s, unfused_s;
    char name[32];
    int fused = auto_picks_fused(a, &fused_s, &unfused_s);
    hw_name(a, name, sizeof name);
    if (!flash_attention_supports(head_size))
        snprintf(why, len, ": the fused kernels do not take head size %d", head_size);
    else if (GPU_BUILD && !a->dry_run && !flash_attention_runs_here())
        snprintf(why, len, ": this GPU has no fused kernels (they need sm_80: A100, H100, later)");
    else if (fused_s == 0.0) snprintf(why, len, ": --hw %s's GPU has no fused kernels (they need sm_80)", name);
    else snprintf(why, len, ": the planner estimates a layer's attention, forward and backward, at %.3g ms %s against %.3g "
                  "ms %s a micro-batch on --hw %s%s", 1e3 * (fused ? fused_s : unfused_s), fused ? "fused" : "unfused",
                  1e3 * (fused ? unfused_s : fused_s), fused ? "unfused" : "fused", name, a->hw < 0 ? ", the default" : "");
}

// the start-up line (and the dry run's) that says which attention runs, and for auto why
static void print_attention(const Config* a, int gpu) {
    char flag[32], why[320] = "";
    run_choice_name(a, offsetof(Config, attention_backend), flag, sizeof flag);
    if (!gpu) {
        printf("attention: the C reference (--attention-backend %s chooses among the GPU build's kernels)\n", flag);
        return;
    }
    if (a->attention_backend == ATTENTION_AUTO) auto_attention_reason(a, why, sizeof why);
    if (runs_flash_attention(a, gpu))
        printf("attention: fused, flash kernels on tensor cores (mma.sync), log-sum-exp kept (--attention-backend %s%s)\n",
               flag, why);
    else printf("attention: unfused, cuBLAS batched products and a softmax kernel, probabilities kept (--attention-backend "
                "%s%s)\n", flag, why);
}

// ----------------------------------------------------------------------------
// context parallelism's attention (context_parallel.h): a rank's queries against every rank's
// keys and values, block by block, and the blocks' transfers
//
// The compute: a rank's share of the causal attention over the whole sequence, 1/CP of it
// (chunks i and 2 CP - 1 - i: every rank the same share of the triangle), kind of work by kind
// of work as cost_attention prices the whole sequence's attention (fused or not, as the planned
// build runs it), each row a CP-th of its FLOPs, bytes and time. kernels/attention_blocks.cuh's
// block kernels and the merges are not priced apart: the attention's own rows stand for them.
// The messages (a block: this rank's keys and values, B x T / CP rows x 2 x G x HS floatX;
// kv_block_elems): p2p, a ring (context_attention_forward, ring_backward): CP steps of a CP-th
// of the share each; the forward's CP - 1 transfers of a block each run beside one step; the
// backward's step k runs beside the next block's transfer (k < CP - 1) and the fp32 partial sums
// sent at step k - 1's end (k > 0), and the last sums (the CP-th) go home after the last step,
// beside nothing. On one link a step's transfers take their sum; what a step's transfers take
// beyond the step's compute is exposed: max(0, transfers - step) a step. all_gather: an
// all-gather of every block in the forward, again in the backward, and a reduce-scatter of the
// fp32 gradients of all blocks (gathered_backward); none of them beside any compute.

// one layer's attention of this rank, forward or backward, with context parallelism's messages
static void cost_layer_attention(StageCost* c, const GPT* m, double x, int backward) {
    double BH = (double)m->B * m->heads_local;
    int CP = m->context.slice.size;
    if (CP == 1) {
        cost_attention(c, BH, m->T, m->head_size, x, m->build.flash_attention, backward);
        return;
    }
    StageCost whole;   // the whole sequence's attention of this rank's heads, once
    memset(&whole, 0, sizeof(whole));
    whole.hw = c->hw;
    whole.calls = 1.0;
    cost_attention(&whole, BH, m->seq_length, m->head_size, x, m->build.flash_attention, backward);
    for (int k = 0; k < whole.num_costs; k++) {
        const Cost* w = &whole.costs[k];
        charge_launches(c, w->name, (int)w->launches, w->flops / CP, w->bytes / CP, w->seconds / CP)->matmul = w->matmul;
    }
    double block = kv_block_elems(&m->context) * x, sums = kv_block_elems(&m->context) * 4.0;
    if (m->context.comm == CP_COMM_ALL_GATHER) {
        charge_half_all_reduce(c, "context-parallel all-gather", GROUP_CP, CP, CP * block);
        if (backward) charge_half_all_reduce(c, "context-parallel reduce-scatter", GROUP_CP, CP, CP * sums);
        return;
    }
    double step = whole.seconds / CP / CP, total = 0.0, exposed = 0.0, bytes = 0.0;
    int messages = 0;
    for (int k = 0; k <= CP; k++) {   // k = CP: after the last step (the backward's last sums)
        double sent = 0.0;
        if (k + 1 < CP) sent += block;          // the next block
        if (backward && k > 0) sent += sums;    // the partial sums of the block before
        if (sent == 0.0) continue;
        int count = (k + 1 < CP) + (backward && k > 0);
        double seconds = count * 1e-6 * c->hw->latency_us + sent / c->group_bandwidth[GROUP_CP];
        total += seconds;
        exposed += k < CP ? fmax(0.0, seconds - step) : seconds;
        bytes += sent;
        messages += count;
    }
    charge(c, "context-parallel ring: exposed", messages, 0.0, bytes, exposed);
    c->bytes_sent[GROUP_CP] += c->calls * bytes;
    c->ring_total += c->calls * total;
    c->ring_hidden += c->calls * (total - exposed);
    c->ring_step[backward] = step;
}

// what one micro-batch's layer does (gpt.h block_forward and block_backward, kernels.cuh's GPU
// kernels), in the model's choices: LayerNorm or RMSNorm, learned positions, ALiBi or rope, a
// GELU or a SwiGLU MLP, linear biases or none, multi-head or grouped-query attention (the QKV
// product's width, qkv_local, is (heads + 2 groups) x the head size). x: the bytes of a floatX.

// with sequence parallelism, each rank adding a row-parallel linear's bias to its R rows of C
// (rows_add_forward: the rows read and written, the bias read once a row); no biases, no adds
static void charge_bias_adds(StageCost* c, const GPT* m, double x, int count) {
    double R = m->residual_rows, C = m->cfg.hidden_size;
    if (m->sequence_parallel && !m->cfg.disable_bias_linear)
        charge_kernel(c, "bias and position adds (sequence parallel)", count, count * 3.0 * R * C * x);
}

// the normalization's forward of the R residual rows of C (gpt.h norm_forward): the rows read,
// the output written, its statistics written in fp32: LayerNorm's mean and rstd, RMSNorm's
// rstd alone (kernels/norms.cuh layernorm_forward, rmsnorm_forward; the weight, C, left out)
static void charge_norm_forward(StageCost* c, const GPT* m, double x) {
    double R = m->residual_rows, C = m->cfg.hidden_size;
    if (uses_rmsnorm(m)) charge_kernel(c, "rmsnorm forward", 1, 2.0 * R * C * x + 4.0 * R);
    else charge_kernel(c, "layernorm forward", 1, 2.0 * R * C * x + 8.0 * R);
}

// the residual add and the normalization of its sum (gpt.h residual_norm_forward): LayerNorm's
// one fused pass (both inputs read, the sum and the output written); RMSNorm's two, the add
// (residual_forward: two reads, a write) and then the norm of the sum
static void charge_residual_norm_forward(StageCost* c, const GPT* m, double x) {
    double R = m->residual_rows, C = m->cfg.hidden_size;
    if (!uses_rmsnorm(m)) {
        charge_kernel(c, "residual + layernorm (fused)", 1, 4.0 * R * C * x + 8.0 * R);
        return;
    }
    charge_kernel(c, "residual add", 1, 3.0 * R * C * x);
    charge_norm_forward(c, m, x);
}

// The normalization's backward over the [R, C] of the residual rows (gpt.h norm_backward), two
// launches (kernels/norms.cuh layernorm_backward, rmsnorm_backward):
//  - one block of COLUMN_BLOCK threads per chunk of COLUMN_CHUNK_ROWS rows (norm_backward_chunk):
//    dout and the input read, dinp read and written, the rows' fp32 statistics read (LayerNorm's
//    mean and rstd, RMSNorm's rstd), one fp32 partial per chunk and column written (LayerNorm's
//    weight and bias, RMSNorm's weight alone). Each warp holds its NORM_WARP_ROWS rows and issues
//    all their loads of a window of NORM_WINDOW columns before it uses any: a trip a window in
//    step 1 (the rows' means) and one in step 2 (dinp and the partials);
//  - column_partials_add: the partials read back from L2 by blocks of 32 columns, each of its
//    32 warps adding a run of chunks/32 of them, PARTIALS_ADD_AHEAD a trip, then the warps' sums.
static void charge_norm_backward(StageCost* c, const GPT* m, double x) {
    double R = m->residual_rows, C = m->cfg.hidden_size, chunks = ceil(R / COLUMN_CHUNK_ROWS);
    int rms = uses_rmsnorm(m);
    const char* name = rms ? "rmsnorm backward" : "layernorm backward";
    double partials = (rms ? 1.0 : 2.0) * 4.0 * chunks * C;
    double trips = 2.0 * ceil(C / (32.0 * PACK));   // a trip a window of 32 packs, in each step
    charge_reduction(c, name, 4.0 * R * C * x + (rms ? 4.0 : 8.0) * R + partials,
                     chain_seconds(c->hw, chunks, blocks_per_sm(COLUMN_BLOCK, NORM_BACKWARD_REGISTERS), trips, 0.0));
    double add_blocks = ceil((rms ? 1.0 : 2.0) * C / 32.0), run = ceil(chunks / 32.0);
    charge_reduction(c, name, partials, chain_seconds(c->hw, add_blocks, blocks_per_sm(1024.0, 32.0), 0.0,
                                                      ceil(run / PARTIALS_ADD_AHEAD) + 1.0));
}

// the final norm's and the embedding LayerNorm's backward: its input gradient zeroed first (it
// adds into it), then charge_norm_backward
static void charge_zeroed_norm_backward(StageCost* c, const GPT* m, double x) {
    charge_kernel(c, uses_rmsnorm(m) ? "rmsnorm backward" : "layernorm backward", 1, m->residual_rows * m->cfg.hidden_size * x);
    charge_norm_backward(c, m, x);
}

// rope (gpt.h rotate_positions, kernels/attention.cuh rope_rotate): the rotated dims of each query and
// key head of this rank read and written in place, once forward and once backward (on dqkv)
static void charge_rope(StageCost* c, const GPT* m, double x) {
    if (m->cfg.position_embedding_type != POSITION_ROPE) return;
    double N = (double)m->B * m->T, heads = m->heads_local + m->groups_local;
    charge_kernel(c, "rope (rotary positions, in place)", 1, 2.0 * N * heads * rotated_dims(&m->cfg) * x);
}

// ----------------------------------------------------------------------------
// a mixture of experts (moe.h, layers.h moe_forward and moe_backward): what a MoE layer does in
// place of the MLP, for one micro-batch of this rank's N tokens, each to k of E experts
//
// The experts' GEMMs are priced expert by expert, each on its own rows (the trainer launches one
// product an expert, from the offsets it copies to the host): E small GEMMs keep the SMs less
// busy than one of all N k rows would (gemm_seconds' waves), which the plan shows. The rows: at
// balance each expert gets N k / E of a rank's rows, and with expert parallelism each of the E /
// EP experts a rank holds gets them from all EP ranks, EP N k / E. --moe-imbalance X puts the
// busiest expert at X times that mean and spreads the rest evenly over the other E - 1 experts
// (their sum stays E means: (E - X) / (E - 1) each); the plan prices the rank that holds the
// busiest expert (it and E / EP - 1 of the others), since every rank waits for it at the
// combine's all-to-all. At EP 1 the rank's rows stay N k whatever X is: only the GEMMs' shapes change.
// X is the measure a run logs as "expert tokens max/mean" (step.h step_expert_imbalance): at most
// E / k, when every token of every rank sends one of its k choices to the busiest expert.

#define HOST_SYNC_US 10.0   // a device-to-host copy the host waits for (moe_dispatch's offsets): the stream
                            // drains, and the device idles until the host's next launch reaches it; assumed
                            // the middle of the 5-20 us a host's launch takes (hardware.h's launch note)

static int expert_ranks(const StageCost* c) { return c->experts.ep > 1 ? c->experts.ep : 1; }

// The rows the busiest rank's experts compute in one MoE layer's micro-batch: its busiest expert's
// and each of its other experts' (ExpertLayout, the section's note); returns the experts it holds
static int busiest_rank_rows(const StageCost* c, const GPT* m, double* busiest, double* other) {
    double N = (double)m->B * m->T, E = m->cfg.num_experts, k = m->cfg.moe_router_topk, X = c->experts.imbalance;
    int EP = expert_ranks(c);
    double mean = EP * N * k / E;
    X = X >= 1.0 ? X : 1.0;
    *busiest = X * mean;
    *other = E > 1.0 ? (E - X) / (E - 1.0) * mean : 0.0;
    return (int)E / EP;
}

// all the rows of the busiest rank's experts, the expert-parallel all-to-all's receives
static double busiest_rank_total_rows(const StageCost* c, const GPT* m) {
    double busiest, other;
    int held = busiest_rank_rows(c, m, &busiest, &other);
    return busiest + (held - 1) * other;
}

// the MLP's activation on `rows` rows of width F (gpt.h mlp_rows_activation): SwiGLU's kernel (gate
// and up read, the product written), GELU erf's, or GELU tanh's second output in fc1's epilogue
static void charge_mlp_activation(StageCost* c, const GPT* m, double rows, double F, double x) {
    if (m->cfg.swiglu) charge_kernel(c, "swiglu forward", 1, 3.0 * rows * F * x);
    else if (m->cfg.gelu == GELU_ERF) charge_kernel(c, "GELU (erf) forward", 1, 2.0 * rows * F * x);   // no epilogue's
    else charge_kernel(c, "GELU epilogue's second output", 0, rows * F * x);
}

// its backward: SwiGLU's (fc1's output and dout read, their gradient written), GELU erf's, or
// GELU tanh's DGELU epilogue reading the pre-activation in fc2's input-gradient GEMM
static void charge_mlp_activation_backward(StageCost* c, const GPT* m, double rows, double F, double x) {
    if (m->cfg.swiglu) charge_kernel(c, "swiglu backward", 1, 5.0 * rows * F * x);
    else if (m->cfg.gelu == GELU_ERF) charge_kernel(c, "GELU (erf) backward", 1, 3.0 * rows * F * x);   // no epilogue's
    else charge_kernel(c, "GELU backward: the DGELU epilogue's aux read", 0, rows * F * x);
}

// the GPU build sums a bias gradient in its weight gradient's GEMM (unless --bias-grad kernel)
static int bias_grad_in_gemm(const GPT* m) { return m->build.gpu && !m->build.bias_grad_kernel; }

// a linear layer's bias gradient over `rows` rows: in the weight gradient's GEMM on the GPU build
// (then added), by column sums on the CPU build and with --bias-grad kernel
static void charge_rows_bias_grad(StageCost* c, const GPT* m, double rows, int width, double x) {
    if (bias_grad_in_gemm(m)) charge_epilogue_bias_grad(c, width);
    else charge_bias_grad(c, (int)ceil(rows), width, x);
}

// An expert's or the shared expert's MLP of width F on `rows` rows (layers.h mlp_rows_forward,
// mlp_rows_backward: TP 1): fc1 (SwiGLU's gate and up, 2F wide), the activation, fc2; backward
// fc2's two products, the activation's, fc1's two and the biases' gradients
static void cost_mlp_rows(StageCost* c, const GPT* m, const char* gemms, double rows, double F, double x, int backward) {
    double C = m->cfg.hidden_size, glu = m->cfg.swiglu ? 2.0 : 1.0;
    if (rows <= 0.0) return;   // (an expert no token chose: nothing launched)
    if (!backward) {
        charge_matmul(c, gemms, rows, glu * F, C, 1.0, x);
        charge_mlp_activation(c, m, rows, F, x);
        charge_matmul(c, gemms, rows, C, F, 1.0, x);
        return;
    }
    charge_linear_backward(c, gemms, rows, F, C, x);
    charge_mlp_activation_backward(c, m, rows, F, x);
    charge_linear_backward(c, gemms, rows, C, glu * F, x);
    if (m->cfg.disable_bias_linear) return;
    charge_rows_bias_grad(c, m, rows, (int)C, x);
    charge_rows_bias_grad(c, m, rows, (int)(glu * F), x);
}

// the busiest rank's experts, each on its rows (busiest_rank_rows)
static void cost_experts(StageCost* c, const GPT* m, double x, int backward) {
    double busiest, other;
    int held = busiest_rank_rows(c, m, &busiest, &other);
    const char* gemms = backward ? "MoE experts backward (cuBLAS, per expert)"
                                 : "MoE experts forward (cuBLAS, per expert)";
    for (int e = 0; e < held; e++)
        cost_mlp_rows(c, m, gemms, e == 0 ? busiest : other, m->cfg.moe_ffn_hidden_size, x, backward);
}

// One all-to-all of the expert-parallel group (EP > 1: the dispatch's, the combine's, and their
// backward's): each rank sends each other rank the rows routed to its experts, (EP - 1) / EP of
// its N k rows of C at balance, in pairwise exchanges of EP - 1 steps (Thakur, Rabenseifner and
// Gropp 2005's alpha-beta model of an all-to-all, on the slowest link the group crosses as the
// other groups'). The bytes (and --log-comm's column) are the balanced routing's; the time is the
// busiest rank's, which receives (EP - 1) / EP of its experts' rows (busiest_rank_total_rows),
// more than it sends when --moe-imbalance is above 1.
static void charge_all_to_all(StageCost* c, const GPT* m, double x) {
    int EP = expert_ranks(c);
    if (EP == 1) return;
    double N = (double)m->B * m->T, k = m->cfg.moe_router_topk, C = m->cfg.hidden_size;
    double sent = (EP - 1.0) / EP * N * k * C * x, received = (EP - 1.0) / EP * busiest_rank_total_rows(c, m) * C * x;
    charge(c, "expert-parallel all-to-all", 1, 0.0, sent,
           (EP - 1.0) * 1e-6 * c->hw->latency_us + fmax(sent, received) / c->group_bandwidth[GROUP_EP]);
    c->bytes_sent[GROUP_EP] += c->calls * sent;
}

// The counting sort by expert (kernels/moe.cuh moe_sort_tokens): one thread an expert reads all N k
// choices in order, twice (the counts, then the rows), with a one-thread prefix sum between: a
// chain of dependent trips, taken here as one L2 trip for each 128-byte line of the choices (its
// 32 ints; the rest of the line from L1), or the bytes if longer (blocks of 256 threads: the GPU
// build's ELEMENTWISE_BLOCK)
static void charge_expert_sort(StageCost* c, const GPT* m) {
    double choices = (double)m->B * m->T * m->cfg.moe_router_topk, E = m->cfg.num_experts;
    double chains = chain_seconds(c->hw, ceil(E / 256.0), 1.0, 0.0, ceil(choices * 4.0 / 128.0));
    const char* name = "MoE sort by expert (a thread an expert)";
    charge_reduction(c, name, choices * 4.0 + E * 4.0, chains);                   // the counts
    charge_kernel(c, name, 1, 8.0 * E);                                             // their prefix sum
    charge_reduction(c, name, choices * 4.0 + choices * 8.0 + E * 4.0, chains);   // order and position written
}

// the experts' row offsets copied to the host, which launches the experts' products from them
static void charge_offsets_to_host(StageCost* c, const GPT* m) {
    charge(c, "MoE offsets to the host (the stream drains)", 1, 0.0, 4.0 * (m->cfg.num_experts + 1.0),
           1e-6 * HOST_SYNC_US);
}

// the shared expert (--moe-shared-expert-intermediate-size, Qwen2-MoE's) on all N rows and its
// sigmoid gate (a product of width 1 and the kernel that adds the gated output); backward the
// gate's kernel, its product and the MLP's, each input gradient added to dx (residual_forward)
static void cost_shared_expert(StageCost* c, const GPT* m, double x, int backward) {
    double N = (double)m->B * m->T, C = m->cfg.hidden_size, Fs = m->cfg.moe_shared_expert_intermediate_size;
    const char* gemms = "MoE shared expert and its gate (cuBLAS)";
    if (Fs <= 0.0) return;
    if (!backward) {
        cost_mlp_rows(c, m, gemms, N, Fs, x, 0);
        charge_matmul(c, gemms, N, 1.0, C, 1.0, x);
        charge_kernel(c, "MoE shared expert's gate", 1, 3.0 * N * C * x + N * x);   // its output and res3 read, res3 written
        return;
    }
    charge_kernel(c, "MoE shared expert's gate", 1, 3.0 * N * C * x + 2.0 * N * x);   // dout, its output read; its gradient
    charge_linear_backward(c, gemms, N, C, 1.0, x);
    charge_kernel(c, "residual add", 1, 3.0 * N * C * x);
    cost_mlp_rows(c, m, gemms, N, Fs, x, 1);
    charge_kernel(c, "residual add", 1, 3.0 * N * C * x);
}

// A MoE layer's forward (moe_forward): the router's product and its kernel (the softmax, the top
// k, their weights; the load-balancing and z losses' sums, each row's probabilities read again),
// with context parallelism the counts' all-reduce over CP, the sort, the offsets to the host, the
// rows gathered, the dispatch's all-to-all, the experts, the combine's all-to-all, the combine
// (each token's k rows read, weighted, its row written), the shared expert
static void cost_moe_forward(StageCost* c, const GPT* m, double x) {
    double N = (double)m->B * m->T, C = m->cfg.hidden_size, E = m->cfg.num_experts, k = m->cfg.moe_router_topk;
    const char* router = "MoE router: softmax, top k, losses";
    charge_matmul(c, "MoE router (cuBLAS)", N, E, C, 1.0, x);
    charge_kernel(c, router, 1, N * E * x + N * E * 4.0 + N * 4.0 + N * k * 8.0);   // probs, lse, the choices, weights
    charge_kernel(c, router, 1, N * E * 4.0 + N * 4.0 + E * 4.0);
    charge_all_reduce(c, "context-parallel expert counts all-reduce", GROUP_CP, m->context.slice.size, E * 4.0);
    charge_expert_sort(c, m);
    charge_offsets_to_host(c, m);
    charge_kernel(c, "MoE permutation: gather and its backward", 1, 2.0 * N * k * C * x + N * k * 4.0);
    charge_all_to_all(c, m, x);
    cost_experts(c, m, x, 0);
    charge_all_to_all(c, m, x);
    charge_kernel(c, "MoE combine and its backward", 1, (N * k * C + N * C) * x + N * k * 8.0);
    cost_shared_expert(c, m, x, 0);
}

// Its backward (moe_backward): the rows gathered again and the offsets copied again, the
// combine's backward (dout and the experts' outputs read; each row's gradient and each weight's
// written), the all-to-all back to the experts, the experts', the all-to-all home, the gather's
// backward (each token's k rows summed), the router's kernel and product, its input gradient
// added, the shared expert's. With EP > 1 the rows gathered again go to the experts' ranks again
// (layers.h moe_backward: one all-to-all more instead of keeping the rows received: 3 in the
// backward, 5 a layer and micro-batch, 7 with the forward recomputed).
static void cost_moe_backward(StageCost* c, const GPT* m, double x) {
    double N = (double)m->B * m->T, C = m->cfg.hidden_size, E = m->cfg.num_experts, k = m->cfg.moe_router_topk;
    charge_kernel(c, "MoE permutation: gather and its backward", 1, 2.0 * N * k * C * x + N * k * 4.0);
    charge_offsets_to_host(c, m);
    charge_all_to_all(c, m, x);
    charge_kernel(c, "MoE combine and its backward", 1, (N * C + 2.0 * N * k * C) * x + N * k * 12.0);
    charge_all_to_all(c, m, x);
    cost_experts(c, m, x, 1);
    charge_all_to_all(c, m, x);
    charge_kernel(c, "MoE permutation: gather and its backward", 1, (N * k * C + N * C) * x + N * k * 4.0);
    charge_kernel(c, "MoE router: softmax, top k, losses", 1, N * E * (4.0 + x) + N * k * 12.0 + N * 4.0 + E * 4.0);
    charge_linear_backward(c, "MoE router (cuBLAS)", N, C, E, x);
    charge_kernel(c, "residual add", 1, 3.0 * N * C * x);
    cost_shared_expert(c, m, x, 1);
}

static void cost_layer_forward(StageCost* c, const GPT* m, int i, double x, int tp_size) {
    double N = (double)m->B * m->T, C = m->cfg.hidden_size, Cl = m->hidden_local, Fl = m->ffn_local;
    double R = m->residual_rows;   // the norms' and the residual's rows: N, or N / TP (sequence parallelism)
    const char* linear = "linear layers forward (cuBLASLt epilogues)";
    if (i == 0 || !fuses_next_ln1(m, i - 1)) charge_norm_forward(c, m, x);   // ln1
    charge_residual_norm_forward(c, m, x);                                   // res2, ln2
    if (fuses_next_ln1(m, i)) charge_residual_norm_forward(c, m, x);         // res3, next ln1
    else charge_kernel(c, "residual add", 1, 3.0 * R * C * x);
    // biases in the epilogue; GELU's too, which also writes the pre-activation it keeps
    charge_matmul(c, linear, N, m->qkv_local, C, 1.0, x);   // qkv: (heads + 2 groups) x the head size
    charge_matmul(c, linear, N, C, Cl, 1.0, x);             // the attention's projection
    if (is_moe_layer(&m->cfg, global_layer(m, i))) {   // a mixture of experts in the MLP's place
        cost_moe_forward(c, m, x);
    } else {
        charge_matmul(c, linear, N, m->fc_local, C, 1.0, x);   // fc1 (SwiGLU's gate and up: twice as wide)
        charge_matmul(c, linear, N, C, Fl, 1.0, x);            // the MLP's projection
        charge_mlp_activation(c, m, N, Fl, x);
    }
    charge_rope(c, m, x);
    cost_layer_attention(c, m, x, 0);
    // f and g around attention and MLP; with sequence parallelism ln1 and ln2 gathered, the two
    // projections' outputs scattered, each rank adding the biases to its rows
    charge_tensor_parallel_joins(c, m, tp_size, N * C * x, 2, 2, 2);
    charge_bias_adds(c, m, x, 2);
}

static void cost_layer_backward(StageCost* c, const GPT* m, int i, double x, int tp_size) {
    double N = (double)m->B * m->T, C = m->cfg.hidden_size, Cl = m->hidden_local, Fl = m->ffn_local;
    int rows = m->B * m->T, R = m->residual_rows;   // with SP, the row-parallel biases' gradients: over the residual rows
    int moe = is_moe_layer(&m->cfg, global_layer(m, i));
    const char* linear = "linear layers backward (cuBLAS)";
    if (moe) cost_moe_backward(c, m, x);   // the experts' biases with them
    charge_linear_backward(c, linear, N, C, m->qkv_local, x);   // qkv
    charge_linear_backward(c, linear, N, Cl, C, x);             // the attention's projection
    if (!moe) charge_linear_backward(c, linear, N, C, m->fc_local, x);    // fc1
    if (!moe) charge_linear_backward(c, linear, N, Fl, C, x);             // the MLP's projection
    if (!m->cfg.disable_bias_linear || m->cfg.add_qkv_bias) {
        // in the weight gradients' GEMMs on the GPU build; the row-parallel layers' (the MLP's
        // and the attention's projections) with SP over the residual rows before the
        // reduce-scatter, by column sums (gpt.h's rows_add_backward), as on the CPU build;
        // --add-qkv-bias alone: the QKV's, the last
        int hidden = m->cfg.hidden_size, row_parallel = 2;   // the two projections first
        int widths[4] = {hidden, hidden, m->fc_local, m->qkv_local};
        for (int k = m->cfg.disable_bias_linear ? 3 : 0; k < 4; k++)
            if (moe && (k == 1 || k == 2)) continue;   // (the MLP's: a MoE layer has none)
            else if (bias_grad_in_gemm(m) && !(k < row_parallel && m->sequence_parallel)) charge_epilogue_bias_grad(c, widths[k]);
            else charge_bias_grad(c, k < row_parallel ? R : rows, widths[k], x);
    }
    if (!moe) charge_mlp_activation_backward(c, m, N, Fl, x);
    charge_norm_backward(c, m, x);   // ln2's
    charge_norm_backward(c, m, x);   // ln1's
    if (recomputes_attention_core(m))   // selective: the probabilities again (never the fused attention's)
        cost_unfused_probabilities(c, (double)m->B * m->heads_local, m->T, m->head_size, x);
    cost_layer_attention(c, m, x, 1);
    charge_rope(c, m, x);
    // f's backward twice; with sequence parallelism the projections' output gradients gathered,
    // ln2 and ln1 gathered again for the weight gradients, the input gradients scattered
    charge_tensor_parallel_joins(c, m, tp_size, N * C * x, 2, 4, 2);
}

// the embedding's kernels (encoder_forward, encoder_backward; with sequence parallelism the
// positions added to and their gradient taken from the residual rows alone, rows_add) and
// its g, or its reduce-scatter and the all-gather of its output's gradient. Forward: the word
// embedding's rows (and the positions' when learned) read, the output written; backward: the
// output's gradient read into the fp32 rows (and again for the positions' gradient).
static void cost_embedding(StageCost* c, const GPT* m, double x, int tp_size) {
    double N = (double)m->B * m->T, R = m->residual_rows, C = m->cfg.hidden_size, T = m->T;
    if (!m->sequence_parallel && m->wpe >= 0) {
        charge_kernel(c, "embedding", 3, 3.0 * N * C * x + N * C * (2.0 * x + 8.0));
    } else {
        charge_kernel(c, "embedding", 2, 2.0 * N * C * x + N * C * (x + 8.0));   // the word embedding's rows alone
        if (m->sequence_parallel && m->wpe >= 0)
            charge_kernel(c, "bias and position adds (sequence parallel)", 2, 3.0 * R * C * x + R * C * x + 8.0 * T * C);
    }
    charge_tensor_parallel_joins(c, m, tp_size, N * C * x, 1, 1, 1);
    if (m->cfg.embed_layernorm) {
        charge_norm_forward(c, m, x);
        charge_zeroed_norm_backward(c, m, x);
    }
}

// one micro-batch through the stage, forward and backward (the recomputed layers' forward
// again), with its pipeline sends
static void cost_micro_batch(StageCost* c, const GPT* m, double x, int tp_size) {
    double N = (double)m->B * m->T, R = m->residual_rows, C = m->cfg.hidden_size, V = m->vocab_local;
    if (m->is_first_stage) cost_embedding(c, m, x, tp_size);
    for (int i = 0; i < m->num_local_layers; i++) {
        int first, end;
        cost_layer_forward(c, m, i, x, tp_size);
        if (recompute_chunk(m, i, &first, &end)) cost_layer_forward(c, m, i, x, tp_size);
        cost_layer_backward(c, m, i, x, tp_size);
    }
    if (m->is_last_stage) {
        charge_norm_forward(c, m, x);                                            // the final norm
        charge_zeroed_norm_backward(c, m, x);                                    // the final norm's
        // the head, logits = x W^T: W the tied word embedding or the output layer, the same product
        charge_matmul(c, "logits (cuBLAS)", N, V, C, 1.0, x);
        charge_linear_backward(c, "logits (cuBLAS)", N, C, V, x);   // dx, and W's gradient
        // the loss and dlogits in the forward's pass (kernels/loss.cuh): at TP 1 one kernel, each row read
        // from memory once (again from the cache) and dlogits written; else the statistics' read,
        // the all-reduces' rescale, then the loss's read and the write of dlogits
        if (tp_size == 1) charge_kernel(c, "cross-entropy", 1, 2.0 * N * V * x);
        else charge_kernel(c, "cross-entropy", 3, 3.0 * N * V * x);
        charge_all_reduce(c, "tensor-parallel all-reduce", GROUP_TP, tp_size, N * 4.0);         // the rows' maxima
        charge_all_reduce(c, "tensor-parallel all-reduce", GROUP_TP, tp_size, 2.0 * N * 4.0);   // their sums
        // the head's f; with sequence parallelism lnf gathered (forward, and again for wte's
        // gradient), its input gradient scattered
        charge_tensor_parallel_joins(c, m, tp_size, N * C * x, 1, 2, 1);
    }
    // each model chunk's output to the next stage but the head's, each one's input gradient to the
    // previous stage but the embedding's: v times plain 1F1B's messages with v model chunks
    int sends = 2 * m->num_chunks - m->is_last_stage - m->is_first_stage;
    for (int k = 0; k < sends; k++) charge_message(c, "pipeline send", GROUP_PP, 1.0, R * C * x);
    charge_launch_gaps(c);
}

// the forward, or the backward, of one micro-batch through one of the stage's layers (the
// average layer: they differ only where some are recomputed), compute and tensor-parallel
// all-reduces
static double layer_seconds(const StageCost* c, const GPT* m, double x, int tp_size, int backward) {
    if (m->num_local_layers == 0) return 0.0;
    StageCost* scratch = (StageCost*)mallocCheck(sizeof(StageCost));
    memcpy(scratch, c, sizeof(StageCost));
    scratch->calls = 1.0;
    scratch->seconds = 0.0;
    for (int i = 0; i < m->num_local_layers; i++) {
        int first, end;
        if (!backward || recompute_chunk(m, i, &first, &end)) cost_layer_forward(scratch, m, i, x, tp_size);
        if (backward) cost_layer_backward(scratch, m, i, x, tp_size);
    }
    charge_launch_gaps(scratch);
    double seconds = scratch->seconds / m->num_local_layers;
    free(scratch);
    return seconds;
}

// ZB-H1's W of one micro-batch through one of the stage's layers (the average layer): the weight
// gradients' GEMMs of the linear layers whose W it defers (layers.h: QKV, the attention's
// projection, and a dense layer's fc1 and fc2), each charge_linear_backward's second product. The
// rest of the backward (the input gradients, attention, norms, bias sums) stays in B.
static double layer_weight_gradient_seconds(const StageCost* c, const GPT* m, double x) {
    if (m->num_local_layers == 0) return 0.0;
    double N = (double)m->B * m->T, C = m->cfg.hidden_size, seconds = 0.0;
    for (int i = 0; i < m->num_local_layers; i++) {
        seconds += gemm_seconds(c->hw, m->qkv_local, C, N, 1.0, x) + gemm_seconds(c->hw, C, m->hidden_local, N, 1.0, x);
        if (!is_moe_layer(&m->cfg, global_layer(m, i)))
            seconds += gemm_seconds(c->hw, m->fc_local, C, N, 1.0, x) + gemm_seconds(c->hw, C, m->ffn_local, N, 1.0, x);
    }
    return seconds / m->num_local_layers;
}

// one DP bucket's chain reduce, or chain broadcast, per shard it touches: (DP - 1) latencies
// and its bytes over the DP link each (elem_bytes: fp32 gradients, floatX parameters); a
// bucket of experts over their expert-data-parallel group's ranks
static double bucket_seconds(const StageCost* c, const GradBucket* b, double elem_bytes, int* messages) {
    double seconds = 0.0;
    int ranks = (int)(b->region->length / b->region->shard_size);
    for (int q = 0; q < ranks; q++) {
        size_t lo, hi;
        if (!bucket_part(b, q, &lo, &hi)) continue;
        seconds += (ranks - 1.0) * 1e-6 * c->hw->latency_us + (hi - lo) * elem_bytes / c->group_bandwidth[GROUP_DP];
        (*messages)++;
    }
    return seconds;
}

// --overlap-grad-reduce (parallel.h's GradReducer): the buckets as the trainer cuts them, each
// reduced (bucket_seconds) one after another on the communication stream. A layers' bucket may
// start once the last micro-batch's backward has passed its lowest layer (the layers taken
// alike, t_layer each; the head's backward before them left out: it moves every start and the
// end alike) and what is still running when that backward ends is exposed; the embedding's
// bucket starts after it, after the tied all-reduce: all exposed. Returns the exposed seconds;
// the total into *total.
static double overlapped_reduce_seconds(const StageCost* c, const GPT* m, double t_layer, int dp_size,
                                        size_t bucket_size, double* total, int* messages) {
    GradBucket* buckets = (GradBucket*)mallocCheck((m->num_tensors + 2) * sizeof(GradBucket));
    ShardRegion regions[2];
    planned_regions(m, dp_size, regions);
    int count = grad_buckets(m, regions, bucket_size, buckets);
    double busy_until = 0.0, exposed = 0.0;
    double backward_end = m->num_local_layers * t_layer;
    *total = 0.0;
    *messages = 0;
    for (int k = 0; k < count; k++) {
        const GradBucket* b = &buckets[k];
        double seconds = bucket_seconds(c, b, 4.0, messages);
        *total += seconds;
        if (b->lowest_layer < 0) {   // the embedding's: after the backward and the tied all-reduce
            exposed += seconds;
            continue;
        }
        int above = 0;   // this stage's layers at or above it
        for (int i = 0; i < m->num_local_layers; i++) above += global_layer(m, i) >= b->lowest_layer;
        double ready = above * t_layer;
        busy_until = fmax(busy_until, ready) + seconds;
    }
    exposed += fmax(0.0, busy_until - backward_end);
    free(buckets);
    return exposed;
}

// --overlap-param-gather (parallel.h's ParamGatherer): the same buckets from the buffer's start,
// broadcast (bucket_seconds) one after another on the communication stream from the end of
// AdamW on, while the next step's first forward waits before each layer for the buckets up to
// it (the layers taken alike, t_layer each; the stage's input taken as there at once) and
// before the head for all. The exposed seconds are how much later that forward ends; the
// total into *total.
static double overlapped_gather_seconds(const StageCost* c, const GPT* m, double t_layer, int dp_size,
                                        size_t bucket_size, double x, double* total, int* messages) {
    GradBucket* buckets = (GradBucket*)mallocCheck((m->num_tensors + 2) * sizeof(GradBucket));
    ShardRegion regions[2];
    planned_regions(m, dp_size, regions);
    int count = grad_buckets(m, regions, bucket_size, buckets);
    double* done = (double*)mallocCheck((count + 1) * sizeof(double));   // done[k]: the k-th from the start
    *total = 0.0;
    *messages = 0;
    for (int k = 0; k < count; k++) {
        *total += bucket_seconds(c, &buckets[count - 1 - k], x, messages);
        done[k] = *total;
    }
    double t = 0.0;
    int waited = 0;
    for (int i = 0; i <= m->num_local_layers; i++) {   // i == num_local_layers: the head (or the stage's end)
        int layer = i < m->num_local_layers ? global_layer(m, i) : INT_MAX;
        while (waited < count && buckets[count - 1 - waited].lowest_layer <= layer) waited++;
        if (waited > 0) t = fmax(t, done[waited - 1]);
        if (i < m->num_local_layers) t += t_layer;
    }
    free(done);
    free(buckets);
    return t - m->num_local_layers * t_layer;
}

// the optimizer step of the stage's ranks: their shard of the flat buffers. overlap: the
// buckets of the DP overlaps; t_forward, t_backward: layer_seconds; states_8bit: Adam's moments
// in 8 bits (--use-bnb-optimizer)
static void cost_optimizer(StageCost* c, const GPT* m, double x, int dp_size, int pp_size, DPOverlap overlap,
                           double t_forward, double t_backward, int states_8bit) {
    // with EP > 1 the experts' parameters (1/EP of them here: the flat buffers' experts' region,
    // gpt.h) are sharded over the expert-data-parallel group, the others over DP x CP
    // (ExpertLayout); their buckets are not planned: at EP > 1 the overlaps are priced as one
    // reduce-scatter and one all-gather a group
    int EP = expert_ranks(c), expert_dp = dp_size / EP;
    double experts = EP > 1 ? (double)(m->num_params_padded - m->expert_params_start) : 0.0;
    double dense = (double)m->num_params_padded - experts;
    double dense_shard = dense / dp_size, expert_shard = experts / expert_dp, shard = dense_shard + expert_shard;
    int messages;
    c->calls = 1.0;
    charge_kernel(c, "zero gradients", 1, (double)m->num_params_padded * 4.0);
    for (int i = 0; i < m->num_tensors && m->sequence_parallel; i++)   // data_parallel.h's sequence_parallel_grads_all_reduce
        if (m->tensors[i].split_axis < 0)
            charge_all_reduce(c, "sequence-parallel gradient all-reduce", GROUP_TP, m->tp_size, m->tensors[i].numel * 4.0);
    // the tied copies of the word embedding, on the first and the last stage (step.h's rule): an
    // output layer of its own (--untie-embeddings-and-output-weights) has no copy to sum
    if (pp_size > 1 && (m->is_first_stage || m->is_last_stage) && !m->cfg.untie_embeddings_and_output_weights)
        charge_all_reduce(c, "tied embedding all-reduce", GROUP_EMBEDDING, 2, (double)m->tensors[m->wte].numel * 4.0);
    if (m->zero_stage >= 2) {   // (reduced layer by layer in the backward: cost_zero)
    } else if (dp_size > 1 && overlap.reduce_bucket > 0 && EP == 1) {
        double exposed = overlapped_reduce_seconds(c, m, t_backward, dp_size, overlap.reduce_bucket, &c->reduce_total,
                                                   &messages);
        c->reduce_hidden = fmax(0.0, c->reduce_total - exposed);   // (not -0.000 by rounding)
        charge(c, "ZeRO gradient reduce, buckets: exposed", messages, 0.0, (dp_size - 1.0) * shard * 4.0, exposed);
        c->bytes_sent[GROUP_DP] += (dp_size - 1.0) * shard * 4.0;
    } else if (dp_size > 1) {
        charge_message(c, "ZeRO reduce-scatter", GROUP_DP, dp_size - 1.0, (dp_size - 1.0) * dense_shard * 4.0);
    }
    if (expert_dp > 1 && experts > 0.0)
        charge_message(c, "ZeRO reduce-scatter, experts (expert-DP)", GROUP_EXPERT_DP, expert_dp - 1.0,
                       (expert_dp - 1.0) * expert_shard * 4.0);
    charge_kernel(c, "gradient norm", 2, shard * 4.0);   // the whole shard in one pass and a final sum
    // AdamW: the fp32 master weights read and written, the gradient read, the parameter written,
    // and m and v read and written: 4 bytes each, or with 8-bit states a byte each and each
    // block's two scales (fp32) read and written, 16 bytes a 2,048 (kernels/quantize.cuh; the
    // shards are whole blocks: data_parallel.h zero_shard_multiple; the maps stay in cache)
    double moments = states_8bit ? 2.0 * 2.0 + 4.0 * 4.0 / QUANT_BLOCK : 4.0 * 4.0;
    charge_kernel(c, states_8bit ? "AdamW, 8-bit m and v" : "AdamW", 1, shard * (3.0 * 4.0 + moments + x));
    if (m->zero_stage >= 3) {   // (gathered layer by layer as the model needs them: cost_zero)
    } else if (dp_size > 1 && overlap.gather_bucket > 0 && EP == 1) {
        double exposed = overlapped_gather_seconds(c, m, t_forward, dp_size, overlap.gather_bucket, x, &c->gather_total,
                                                   &messages);
        c->gather_hidden = fmax(0.0, c->gather_total - exposed);   // (not -0.000 by rounding)
        charge(c, "ZeRO all-gather, buckets: exposed", messages, 0.0, (dp_size - 1.0) * shard * x, exposed);
        c->bytes_sent[GROUP_DP] += (dp_size - 1.0) * shard * x;
    } else if (dp_size > 1) {
        charge_message(c, "ZeRO all-gather", GROUP_DP, dp_size - 1.0, (dp_size - 1.0) * dense_shard * x);
    }
    if (expert_dp > 1 && experts > 0.0)
        charge_message(c, "ZeRO all-gather, experts (expert-DP)", GROUP_EXPERT_DP, expert_dp - 1.0,
                       (expert_dp - 1.0) * expert_shard * x);
    charge_launch_gaps(c);
}

// one gather (or reduce) of `elems` elements of `bytes_each` over the DP group: a broadcast (a reduce)
// from each rank's part, the all-gather's bytes; its seconds
static double zero_transfer_seconds(const StageCost* c, int dp_size, double elems, double bytes_each) {
    return (dp_size - 1.0) * 1e-6 * c->hw->latency_us + (dp_size - 1.0) / dp_size * elems * bytes_each / c->group_bandwidth[GROUP_DP];
}

// ZeRO-2/3 (zero.h) over `micro` micro-batches. ZeRO-2: each layer's gradients reduced onto the
// shards in every micro-batch's backward, beside the next layer's backward (two gradient places):
// exposed what exceeds that layer's time; the edges' (embedding, head) once at the step's end. ZeRO-3: also each layer gathered before its forward
// and again before its backward (once a step with --no-reshard-after-forward), each gather queued
// while the layer before computes (the prefetch): exposed what exceeds that layer's time; the edges
// gathered once after AdamW. The bytes are the reduce-scatter's and all-gather's, times the gathers.
static void cost_zero(StageCost* c, const GPT* m, double x, int dp_size, int micro, double t_forward, double t_backward) {
    if (m->zero_stage < 2 || dp_size <= 1) return;
    double layers = 0.0, edges = 0.0;
    for (int i = 0; i < m->num_tensors; i++) {
        const TensorDesc* t = &m->tensors[i];
        if (t->layer >= 0 && t->layer < m->cfg.num_layers) layers += t->numel;
        else edges += t->numel;
    }
    double n = m->num_local_layers > 0 ? m->num_local_layers : 1, per_layer = layers / n, sent = (dp_size - 1.0) / dp_size;
    c->calls = micro * n;
    charge(c, "ZeRO-2 layer gradient reduce (each micro-batch): exposed", dp_size, 0.0, sent * per_layer * 4.0,
           fmax(0.0, zero_transfer_seconds(c, dp_size, per_layer, 4.0) - t_backward));
    c->bytes_sent[GROUP_DP] += c->calls * sent * per_layer * 4.0;
    c->calls = 1.0;
    charge_message(c, "ZeRO-2 embedding and head gradient reduce", GROUP_DP, dp_size - 1.0, sent * edges * 4.0);
    if (m->zero_stage < 3) return;
    double g = zero_transfer_seconds(c, dp_size, per_layer, x);
    int reshard = m->zero3_places < m->num_local_layers;
    c->calls = (reshard ? micro : 1) * n;
    charge(c, "ZeRO-3 layer gather before a forward: exposed", dp_size, 0.0, sent * per_layer * x, fmax(0.0, g - t_forward));
    c->bytes_sent[GROUP_DP] += c->calls * sent * per_layer * x;
    if (reshard) {
        charge(c, "ZeRO-3 layer gather before a backward: exposed", dp_size, 0.0, sent * per_layer * x,
               fmax(0.0, g - t_backward));
        c->bytes_sent[GROUP_DP] += c->calls * sent * per_layer * x;
    }
    c->calls = 1.0;
    charge_message(c, "ZeRO-3 embedding and head gather", GROUP_DP, dp_size - 1.0, sent * edges * x);
}

// a planned stage's costs over a step of `micro` micro-batches, in its build's precision; the
// ZeRO group (GROUP_DP) is DP x CP; with experts, their layout (ExpertLayout: EP's group TP ranks
// apart, the expert-data-parallel one TP x EP)
static void plan_stage_cost(const GPT* m, const Hardware* hw, int TP, int CP, int PP, int DP, ExpertLayout experts,
                            int micro, DPOverlap overlap, int states_8bit, StageCost* c, double* micro_seconds) {
    double x = m->build.floatx_bytes;
    int EP = experts.ep > 1 ? experts.ep : 1;
    memset(c, 0, sizeof(*c));
    c->hw = hw;
    c->experts = experts;
    c->group_bandwidth[GROUP_EP] = group_bandwidth(hw, TP, EP);
    c->group_bandwidth[GROUP_EXPERT_DP] = group_bandwidth(hw, TP * EP, CP * DP / EP);
    c->group_bandwidth[GROUP_TP] = group_bandwidth(hw, 1, TP);
    c->group_bandwidth[GROUP_DP] = group_bandwidth(hw, TP, CP * DP);
    c->group_bandwidth[GROUP_PP] = group_bandwidth(hw, TP * CP * DP, PP);
    c->group_bandwidth[GROUP_EMBEDDING] = group_bandwidth(hw, TP * CP * DP * (PP - 1), 2);
    c->group_bandwidth[GROUP_CP] = group_bandwidth(hw, TP, CP);
    c->calls = micro;
    cost_micro_batch(c, m, x, TP);
    *micro_seconds = c->seconds / micro;
    cost_optimizer(c, m, x, DP * CP, PP, overlap, layer_seconds(c, m, x, TP, 0), layer_seconds(c, m, x, TP, 1),
                   states_8bit);
    cost_zero(c, m, x, DP * CP, micro, layer_seconds(c, m, x, TP, 0), layer_seconds(c, m, x, TP, 1));
}

// the GEMM-only part of a stage's step: its cuBLAS rows (what tests/fit_matmul_efficiency.sh fits
// the matmul efficiency to, against the GEMMs' measured time)
static double gemm_only_seconds(const StageCost* c) {
    double seconds = 0.0;
    for (int k = 0; k < c->num_costs; k++) seconds += c->costs[k].matmul ? c->costs[k].seconds : 0.0;
    return seconds;
}

// the slowest stage's step, kind of work by kind of work
static void print_stage_costs(const StageCost* c, int stage, int micro) {
    printf("stage %d's step (the slowest; %d micro-batches): launches | GFLOP | GB moved or sent | estimated ms | share\n",
           stage, micro);
    for (int k = 0; k < c->num_costs; k++) {
        const Cost* x = &c->costs[k];
        printf("  %-44s %8.0f | %10.1f | %10.3f | %10.2f | %5.1f%%\n", x->name, x->launches, x->flops / 1e9, x->bytes / 1e9,
               1e3 * x->seconds, 100.0 * x->seconds / c->seconds);
    }
}
