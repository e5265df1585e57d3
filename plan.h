/*
plan.h — what a run will take before it takes it: the memory plan of every pipeline stage
(to the byte, from the same plan the model allocates from), the memory a rank may take
(host, process limits, cgroup; or the GPU), and the planner (--dry-run, --sweep): a cost model
of one step on a described GPU cluster and the layouts a model and batch allow. The pipeline
schedule drawn as text (--print-schedule) is print_schedule.h's, below it; the machines priced
(Hardware, --hw's presets, this CPU measured, the --hw-* flags, the cost model's line) are hardware.h's.

Interface (what train.c uses): StageMemory, stage_memory, plan_stage_memory,
print_memory_header, print_memory_row, print_model_state_bytes, print_attention, print_dp_communication,
print_pipeline_exchanges, runs_flash_attention, memory_available, check_memory,
check_index_memory, dry_run_and_exit (and, for the tests, Hardware, plan_layout and the
cost of a stage).
*/
#pragma once
#include <sys/resource.h>

// ----------------------------------------------------------------------------
// the lines a plan and a run share

// "model: --num-layers 4 --hidden-size 256 ...": every model field as the flag that sets it
static void print_model(const GPTConfig* c) {
    printf("model:");
    for (int k = 0; k < NUM_MODEL_FIELDS; k++) {
        const ConfigField* f = &MODEL_FIELDS[k];
        char flag[96], value[64];
        format_field(f, c, value, sizeof(value));
        if (f->kind != FIELD_SWITCH) printf(" %s %s", flag_of(f, flag, sizeof(flag)), value);
        else if (strcmp(value, "0") != 0) printf(" %s", flag_of(f, flag, sizeof(flag)));
    }
    printf(" (vocabulary padded to %d)\n", c->padded_vocab_size);
}

// --log-comm's two lines: the bytes sent in each group (tp, dp, pp, embedding) in a step, the
// most any rank sent, in MiB and in bytes (--dry-run prints the ones it predicts)
static void print_comm(const double most[4]) {
    double mib = 1024.0 * 1024.0;
    printf(" communication per step (MiB sent by the busiest rank, ring algorithms): tensor-parallel %.3f |"
           " data-parallel %.3f | pipeline %.3f | embedding %.3f |\n", most[0] / mib, most[1] / mib, most[2] / mib,
           most[3] / mib);
    printf(" communication per step in bytes: %.0f | %.0f | %.0f | %.0f\n", most[0], most[1], most[2], most[3]);
}

// ----------------------------------------------------------------------------
// the memory plan: what one rank of a pipeline stage allocates, to the byte, from the plan
// alone. The start-up table, the memory check and --dry-run all take their numbers here.
// Activations are what the micro-batches in flight keep (and the recomputed chunk's scratch);
// workspaces what a step only borrows: the arena's backward scratch, logits and cross-entropy
// buffers, the gradient norm's scalar (adamw_init) and partials (kernels_init, GPU build).
// There are no communication buffers: NCCL and MPI send from and receive into the arena and
// the flat buffers themselves (NCCL's own internal buffers are NCCL's, outside this count).

typedef struct {
    PipelineStage stage;
    size_t num_params;                                                  // this rank's parameters (unpadded)
    size_t params, grads, optimizer, activations, workspaces, total;   // bytes
    int num_slots, longest_chunk;                                       // the arena's make-up, for the table's header
    size_t slot_bytes, recompute_bytes;
} StageMemory;

// --ddp-bucket-size, or Megatron-LM's default: max(40M, 1M x DP) elements
static size_t grad_bucket_size(const Config* a, int dp_size) {
    if (a->ddp_bucket_size > 0) return (size_t)a->ddp_bucket_size;
    return dp_size > 40 ? (size_t)1000000 * dp_size : (size_t)40000000;
}

// a planned (or built) model's bytes over dp_size data ranks: what gpt_allocate, adamw_init and
// kernels_init hand out on the build the model was laid out for (m->build)
static StageMemory stage_memory(const GPT* m, PipelineStage stage, int dp_size) {
    int master_copy = m->build.floatx_bytes != (int)sizeof(float);   // adamw_init's rule
    size_t workspaces = m->workspace_bytes + adamw_workspace_bytes(m->build, m->num_tensors, m->num_params_padded, dp_size) +
                        (m->build.gpu ? GPU_KERNELS_WORKSPACE_BYTES : 0);
    StageMemory s = {stage, m->num_params, m->num_params_padded * m->build.floatx_bytes,
                     m->num_params_padded * sizeof(float), adamw_state_bytes(m->num_params_padded, dp_size, master_copy),
                     m->arena_bytes - m->workspace_bytes, workspaces, 0, m->num_slots, m->longest_chunk, m->slot_bytes,
                     m->recompute_bytes};
    s.total = s.params + s.grads + s.optimizer + s.activations + s.workspaces;
    return s;
}

// The model state a parameter costs (parameters, gradients, optimizer state) on a stage of the
// plan, against Megatron-LM's distributed optimizer (its docs' table of bytes a parameter and
// theoretical_memory_usage.py): 16-bit parameters with fp32 gradients keep 6 + 12/DP there,
// fp32 ones 8 + 8/DP. The same here: the gradients' reduce-scatter sums into each rank's shard
// of the gradient buffer in place, so the optimizer's shard holds no gradient copy.
static void print_model_state_bytes(const StageMemory* s, int dp_size) {
    size_t padded = s->grads / sizeof(float);
    if (padded == 0) return;
    int param_bytes = (int)(s->params / padded), shard_bytes = (int)(s->optimizer / (padded / dp_size));
    double per_param = (double)(s->params + s->grads + s->optimizer) / padded;
    printf("model state: %.3g bytes a parameter = %d (%s parameters) + 4 (fp32 gradients%s) + %d/%d (%s), Megatron-LM's "
           "distributed optimizer's %d + %d/DP\n", per_param, param_bytes, param_bytes == 4 ? "fp32" : "16-bit",
           dp_size > 1 ? ", each rank's shard summed over DP in place" : "", shard_bytes, dp_size,
           shard_bytes == 12 ? "the shard's fp32 master weights, Adam's m and v" : "the shard's Adam m and v; the "
           "parameters are the master weights", param_bytes + 4, shard_bytes);
}

// the start-up lines that say how the DP gradients are reduced and the parameters gathered
// (rank 0's stage's buckets)
static void print_dp_communication(const Config* a, const GPT* m) {
    if (grid.dp_cp.size == 1) {
        if (a->overlap_grad_reduce) printf("gradient reduction: none at DP 1 (--overlap-grad-reduce has nothing to do)\n");
        if (a->overlap_param_gather) printf("parameter all-gather: none at DP 1 (--overlap-param-gather has nothing to do)\n");
        return;
    }
    if (grad_reducer.enabled)
        printf("gradient reduction: %d bucket(s) of at least %zu elements on stage 0 (--ddp-bucket-size), each reduced "
               "onto its shards' owners as soon as the last backward has finished its layers%s\n",
               grad_reducer.num_buckets, grad_bucket_size(a, grid.dp_cp.size), m->is_first_stage ? "; the embedding's last" : "");
    else printf("gradient reduction: one reduce-scatter over DP after the last backward (--overlap-grad-reduce: in buckets, "
                "during it)\n");
    if (param_gatherer.enabled)
        printf("parameter all-gather: %d bucket(s) broadcast from their shards' owners after AdamW, each waited for by the "
               "next forward before its layers\n", param_gatherer.num_buckets);
    else printf("parameter all-gather: one all-gather over DP after AdamW (--overlap-param-gather: in buckets, beside the "
                "next forward)\n");
    if (!GPU_BUILD && (grad_reducer.enabled || param_gatherer.enabled))
        printf("  (the CPU build runs the same reduces and broadcasts in the same order, each done when it returns: nothing "
               "overlaps)\n");
}

// the start-up line that says where the pipeline's sends and receives run (PP > 1)
static void print_pipeline_exchanges(void) {
    if (grid.pp_size == 1) return;
    if (!GPU_BUILD) printf("pipeline exchanges: MPI, each waited for before the schedule goes on\n");
    else if (pipeline_link.overlap)
        printf("pipeline exchanges: on the communication stream, a send alone beside the next forward "
               "(--no-overlap-p2p-communication: on the compute stream)\n");
    else printf("pipeline exchanges: on the compute stream (--no-overlap-p2p-communication)\n");
}

static void print_memory_header(void) {
    printf("memory per rank (MiB): parameters | gradients | optimizer state (1/DP shard) | activations (the "
           "micro-batch slots the row names, each one micro-batch's through one model chunk, and a recomputed chunk's "
           "scratch) | workspaces (backward scratch, column partials, logits, cross-entropy, the optimizer's norm and "
           "shard table; no communication buffers: NCCL and MPI use the arena's) | total\n");
}

// "layers A-B" of a stage, each model chunk's ("layers 0-1, 4-5"), or "no layers"
static void format_stage_layers(const PipelineStage* stage, char* out, size_t len) {
    snprintf(out, len, "no layers");   // each stage shows its layers: the balance can be seen
    int per_chunk = stage->num_layers / stage->chunks;
    for (int c = 0, used = 0; c < stage->chunks && per_chunk > 0 && used < (int)len; c++) {
        int first = stage->first_layer + c * stage->round_layers;
        used += snprintf(out + used, len - used, "%s%d-%d", c ? ", " : "layers ", first, first + per_chunk - 1);
    }
}

// "  LABEL (stage S, layers A-B): N parameters: x | x | x | x | x | x  (K micro-batch slot(s) of up to X MiB ...)",
// and with `bytes` the same in bytes
static void print_memory_row(const char* label, const StageMemory* s, int bytes) {
    double mib = 1024.0 * 1024.0;
    char layers[256], recompute[128] = "";
    format_stage_layers(&s->stage, layers, sizeof layers);
    if (s->longest_chunk > 0)
        snprintf(recompute, sizeof(recompute), " + a recomputed chunk's scratch of %.1f MiB (%d layer(s))",
                 s->recompute_bytes / mib, s->longest_chunk);
    else if (s->recompute_bytes > 0)
        snprintf(recompute, sizeof(recompute), " + the recomputed attention probabilities' scratch of %.1f MiB (one layer's)",
                 s->recompute_bytes / mib);
    printf("  %s (stage %d, %s): %zu parameters: %9.1f | %9.1f | %9.1f | %9.1f | %9.1f | %9.1f  (%d micro-batch slot(s) of "
           "up to %.1f MiB%s)\n", label, s->stage.rank, layers, s->num_params, s->params / mib, s->grads / mib,
           s->optimizer / mib, s->activations / mib, s->workspaces / mib, s->total / mib, s->num_slots, s->slot_bytes / mib,
           recompute);
    if (bytes)
        printf("  %s (stage %d) in bytes: %zu | %zu | %zu | %zu | %zu | %zu\n", label, s->stage.rank, s->params, s->grads,
               s->optimizer, s->activations, s->workspaces, s->total);
}

// ----------------------------------------------------------------------------
// the memory there is

// The room a memory cgroup leaves: its limit less its usage, for this process's cgroup and
// each one above it (SLURM and containers set the limit on one of them); -1 when none is set.
// cgroup v2 has one line "0::/path" in /proc/self/cgroup and the files memory.max and
// memory.current; v1 has a line "N:...memory...:/path" and memory.limit_in_bytes and
// memory.usage_in_bytes (an unlimited v1 limit reads as about 2^63).
static double cgroup_memory_left(void) {
    char line[4096], dir[4200], path[4300], v1_path[4096] = "", v2_path[4096] = "";
    FILE* f = fopen("/proc/self/cgroup", "r");
    if (!f) return -1.0;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        char *controllers = strchr(line, ':'), *where = controllers ? strchr(controllers + 1, ':') : NULL;
        if (!where) continue;
        *where++ = '\0';
        controllers++;
        if (strcmp(line, "0") == 0 && controllers[0] == '\0') snprintf(v2_path, sizeof(v2_path), "%s", where);
        for (char* c = strtok(controllers, ","); c; c = strtok(NULL, ","))
            if (strcmp(c, "memory") == 0) snprintf(v1_path, sizeof(v1_path), "%s", where);
    }
    fclose(f);
    int v1 = v1_path[0] != '\0';
    if (!v1 && !v2_path[0]) return -1.0;
    const char *root = v1 ? "/sys/fs/cgroup/memory" : "/sys/fs/cgroup", *rel = v1 ? v1_path : v2_path;
    const char* limit_file = v1 ? "memory.limit_in_bytes" : "memory.max";
    const char* usage_file = v1 ? "memory.usage_in_bytes" : "memory.current";
    snprintf(dir, sizeof(dir), "%s%s", root, strcmp(rel, "/") ? rel : "");
    double left = -1.0;
    for (;;) {
        double max = -1.0, current = 0.0;
        snprintf(path, sizeof(path), "%s/%s", dir, limit_file);
        if ((f = fopen(path, "r")) != NULL) {
            if (fscanf(f, "%lf", &max) != 1 || max > 0x1p62) max = -1.0;   // "max" or ~2^63: no limit here
            fclose(f);
        }
        snprintf(path, sizeof(path), "%s/%s", dir, usage_file);
        if (max >= 0.0 && (f = fopen(path, "r")) != NULL) {
            if (fscanf(f, "%lf", &current) != 1) current = 0.0;
            fclose(f);
        }
        if (max >= 0.0 && (left < 0.0 || max - current < left)) left = max > current ? max - current : 0.0;
        char* slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < strlen(root)) break;   // the hierarchy's root is done
        *slash = '\0';
    }
    return left;
}

// The room a process limit leaves (ulimit -v: RLIMIT_AS over the address space; RLIMIT_DATA
// over the heap and mappings): the limit less what the process already uses; -1 when unlimited.
static double rlimit_left(int resource, int statm_field) {
    struct rlimit rl;
    if (getrlimit(resource, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return -1.0;
    long pages[7] = {0};
    FILE* f = fopen("/proc/self/statm", "r");
    if (f) {
        for (int i = 0; i < 7 && fscanf(f, "%ld", &pages[i]) == 1; i++) {}
        fclose(f);
    }
    double used = (double)pages[statm_field] * sysconf(_SC_PAGE_SIZE);
    return (double)rl.rlim_cur > used ? (double)rl.rlim_cur - used : 0.0;
}

// The host memory this rank may take: the least of its share of the host's memory (every rank
// on the host takes as much), its share of the cgroup's room, and what its own process limits
// leave. *where says which.
static double host_memory_available(const char** where) {
    double have = (double)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGE_SIZE) / grid.local_size;
    double cgroup = cgroup_memory_left(), as = rlimit_left(RLIMIT_AS, 0), data = rlimit_left(RLIMIT_DATA, 5);
    *where = "its share of the host's memory is";
    if (cgroup >= 0.0 && cgroup / grid.local_size < have) have = cgroup / grid.local_size, *where = "its share of the cgroup's memory limit leaves";
    if (as >= 0.0 && as < have) have = as, *where = "its address-space limit (ulimit -v, RLIMIT_AS) leaves";
    if (data >= 0.0 && data < have) have = data, *where = "its data limit (ulimit -d, RLIMIT_DATA) leaves";
    return have;
}

// The memory this rank's buffers may take: its GPU's free memory on the GPU build, host
// memory on the CPU build.
static double memory_available(const char** where) {
#ifdef __CUDACC__
    size_t free_bytes = 0, total = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total));
    *where = "its GPU has";
    return (double)free_bytes;
#else
    return host_memory_available(where);
#endif
}

// Before anything large is allocated: what this rank will hold (the numbers of the memory
// table), against what there is. Too much is refused in one line by the rank that would hold
// the most, naming the largest part and the flags that drive it; every rank exits 2.
static void check_memory(const StageMemory* s, const char* table_flags) {
    double gib = 1024.0 * 1024.0 * 1024.0;
    double part[5] = {(double)s->params, (double)s->grads, (double)s->optimizer, (double)s->activations,
                      (double)s->workspaces};
    const char* names[5] = {"parameters", "gradients", "optimizer state", "activations", "workspaces"};
    const char* flags[5] = {table_flags, table_flags, table_flags,
                            "--micro-batch-size, --seq-length, --hidden-size, --num-attention-heads (scores: seq^2 per head; "
                            "--checkpoint-activations keeps less)",
                            "--micro-batch-size, --seq-length (the GPU's attention scratch: seq^2 per head; the logits: "
                            "seq x the vocabulary / TP)"};
    const char* where;
    double total = part[0] + part[1] + part[2] + part[3] + part[4], have = memory_available(&where);
    int largest = 0;
    for (int k = 1; k < 5; k++) largest = part[k] > part[largest] ? k : largest;
    int worst = max_over_world(total > have ? grid.world_rank + 1 : 0);   // the last rank that does not fit, + 1
    if (worst)
        config_error_on(worst - 1, "this rank would allocate %.2f GiB (parameters %.2f, gradients %.2f, optimizer state "
                        "%.2f, activations %.2f, workspaces %.2f) but %s %.2f GiB: the largest part, %s, grows with %s",
                        total / gib, part[0] / gib, part[1] / gib, part[2] / gib, part[3] / gib, part[4] / gib, where,
                        have / gib, names[largest], flags[largest]);
}

// The sample index in host memory: rank 0 builds it, and every rank on a host maps the same
// cache files (one copy a host: each rank counts its share). On the CPU build the rank's
// model is host memory too. Refused, like check_memory, before the index is built.
static void check_index_memory(double index_bytes, double host_model_bytes) {
    double gib = 1024.0 * 1024.0 * 1024.0;
    const char* where;
    double share = index_bytes / grid.local_size, have = host_memory_available(&where);
    char model[64] = "";
    if (host_model_bytes > 0) snprintf(model, sizeof(model), " next to its %.2f GiB of model", host_model_bytes / gib);
    int worst = max_over_world(share + host_model_bytes > have ? grid.world_rank + 1 : 0);
    if (worst)
        config_error_on(worst - 1, "the sample index would take %.2f GiB of host memory, this rank's share %.2f GiB%s, but "
                        "%s %.2f GiB: it grows with --train-iters (or --train-samples) x --global-batch-size and with "
                        "--eval-interval, --eval-iters (16 bytes a sample)", index_bytes / gib, share / gib, model, where,
                        have / gib);
}

// ----------------------------------------------------------------------------
// the planner's cost model (--dry-run): one step's time on a described GPU cluster, from what
// the step does on each pipeline stage, kernel by kernel and message by message, as the GPU
// build does it. Everything runs on one stream in order, so nothing overlaps and the costs add
// (but for --overlap-grad-reduce's buckets, which run beside the last backward:
// overlapped_reduce_seconds; and --overlap-param-gather's, beside the next forward:
// overlapped_gather_seconds):
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
//   a pipeline send       latency + its bytes / the link between the two stages.
// Not priced: dropout (gpt.h dropout_of): two elementwise passes a layer each way and a
// SplitMix64 hash an element (integer units no preset describes; the attention's inside the fused
// tiles). V100's and A100's constants were fitted to BigScience's runs, with Megatron-LM's dropout
// 0.1, so they carry its time; H100's, fitted to a run without, does not (issue 48).
// A 1F1B step is (m + p - 1) slots of the slowest stage's forward and backward of one
// micro-batch (p - 1 of them the bubble: Narayanan et al. 2021), then the optimizer: the tied
// embedding's all-reduce, the ZeRO reduce-scatter, the norm, AdamW and the all-gather. With v
// model chunks a stage (interleaved 1F1B, §2.2) the bubble is p - 1 slots of one chunk, so the
// step is (m + (p - 1) / v) slots, each slot with v times the pipeline's messages.

// The bandwidth (bytes/s) a group's ring runs at. Ranks fill nodes in order (gpus_per_node
// each) and a group's members are `stride` ranks apart (TP 1, DP TP, PP TP x DP): the group
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

enum { GROUP_TP, GROUP_DP, GROUP_PP, GROUP_EMBEDDING, NUM_COMM_GROUPS };   // --log-comm's order

// One stage's costs: each kernel (summed over its calls) and each group's messages
#define MAX_COSTS 32
typedef struct {
    const char* name;
    double launches, flops, bytes, seconds;   // bytes: read + written, or sent; launches: kernels or messages
    int matmul;                               // a cuBLAS GEMM's row: the GEMM-only part of the step
} Cost;
typedef struct {
    const Hardware* hw;
    double group_bandwidth[NUM_COMM_GROUPS];
    double calls;                          // each charge is made this many times (micro-batches)
    Cost costs[MAX_COSTS];
    int num_costs;
    double pending_launches;               // kernels charged since the last charge_launch_gaps, per call
    double bytes_sent[NUM_COMM_GROUPS];    // per step, as --log-comm counts them
    double seconds;
    double reduce_total, reduce_hidden;    // --overlap-grad-reduce: its reduces' time, and how much of it the backward hides
    double gather_total, gather_hidden;    // --overlap-param-gather: its broadcasts' time, and how much the forward hides
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
// reads the sums, each but the last writes them, the last writes dQ itself. The sums live in
// L2 (a few steps at a time are being added) and go to memory once, written back.
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

// stage p of the layout with tp_size x dp_size ranks, as its tensor rank 0 would hold it on the
// build --dry-run-build names: planned and thrown away. The ranks of a stage hold the same sizes
// (other slices of the vocabulary, of the matrices and of the ZeRO shard).
static void plan_stage_model(GPT* m, const Config* a, int p, int tp_size, int dp_size) {
    BuildTarget build = {plans_gpu_build(a), plans_gpu_build(a) ? 2 : (int)sizeof(float),   // bf16 or fp16; fp32
                         runs_flash_attention(a, plans_gpu_build(a))};
    PipelineStage stage = pipeline_stage(a, p);
    int* slots = (int*)mallocCheck(stage.chunks * sizeof(int));   // what the schedule needs, as the trainer's
    stage_slots(a, p, slots);
    gpt_plan_model(m, &a->model, a->micro_batch_size, a->model.seq_length, 0, tp_size,
                   context_slice(0, a->context_parallel_size, a->model.seq_length), (CpCommType)a->cp_comm_type, stage, slots,
                   dp_size * a->context_parallel_size, build);
    free(slots);
}

static StageMemory plan_stage_memory(const Config* a, int p, int tp_size, int dp_size) {
    GPT m;
    plan_stage_model(&m, a, p, tp_size, dp_size);
    StageMemory s = stage_memory(&m, pipeline_stage(a, p), dp_size);
    gpt_free_plan(&m);
    return s;
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
    charge_matmul(c, linear, N, m->fc_local, C, 1.0, x);    // fc1 (SwiGLU's gate and up: twice as wide)
    charge_matmul(c, linear, N, C, Fl, 1.0, x);             // the MLP's projection
    if (m->cfg.swiglu) charge_kernel(c, "swiglu forward", 1, 3.0 * N * Fl * x);   // gate and up read, out written
    else if (m->cfg.gelu == GELU_ERF) charge_kernel(c, "GELU (erf) forward", 1, 2.0 * N * Fl * x);   // no epilogue's
    else charge_kernel(c, "GELU epilogue's second output", 0, N * Fl * x);
    charge_rope(c, m, x);
    cost_attention(c, (double)m->B * m->heads_local, m->T, m->head_size, x, m->build.flash_attention, 0);
    // f and g around attention and MLP; with sequence parallelism ln1 and ln2 gathered, the two
    // projections' outputs scattered, each rank adding the biases to its rows
    charge_tensor_parallel_joins(c, m, tp_size, N * C * x, 2, 2, 2);
    charge_bias_adds(c, m, x, 2);
}

static void cost_layer_backward(StageCost* c, const GPT* m, double x, int tp_size) {
    double N = (double)m->B * m->T, C = m->cfg.hidden_size, Cl = m->hidden_local, Fl = m->ffn_local;
    int rows = m->B * m->T, R = m->residual_rows;   // with SP, the row-parallel biases' gradients: over the residual rows
    const char* linear = "linear layers backward (cuBLAS)";
    charge_linear_backward(c, linear, N, C, m->qkv_local, x);   // qkv
    charge_linear_backward(c, linear, N, Cl, C, x);             // the attention's projection
    charge_linear_backward(c, linear, N, C, m->fc_local, x);    // fc1
    charge_linear_backward(c, linear, N, Fl, C, x);             // the MLP's projection
    if (!m->cfg.disable_bias_linear || m->cfg.add_qkv_bias) {
        // in the weight gradients' GEMMs on the GPU build; the row-parallel layers' (the MLP's
        // and the attention's projections) with SP over the residual rows before the
        // reduce-scatter, by column sums (gpt.h's rows_add_backward), as on the CPU build;
        // --add-qkv-bias alone: the QKV's, the last
        int hidden = m->cfg.hidden_size, row_parallel = 2;   // the two projections first
        int widths[4] = {hidden, hidden, m->fc_local, m->qkv_local};
        for (int k = m->cfg.disable_bias_linear ? 3 : 0; k < 4; k++)
            if (m->build.gpu && !(k < row_parallel && m->sequence_parallel)) charge_epilogue_bias_grad(c, widths[k]);
            else charge_bias_grad(c, k < row_parallel ? R : rows, widths[k], x);
    }
    if (m->cfg.swiglu)   // fc1's output (gate and up) and dout read, their gradient written
        charge_kernel(c, "swiglu backward", 1, 5.0 * N * Fl * x);
    else if (m->cfg.gelu == GELU_ERF) charge_kernel(c, "GELU (erf) backward", 1, 3.0 * N * Fl * x);   // no epilogue's
    else charge_kernel(c, "GELU backward: the DGELU epilogue's aux read", 0, N * Fl * x);   // in fcproj's dinp GEMM
    charge_norm_backward(c, m, x);   // ln2's
    charge_norm_backward(c, m, x);   // ln1's
    if (recomputes_attention_core(m))   // selective: the probabilities again (never the fused attention's)
        cost_unfused_probabilities(c, (double)m->B * m->heads_local, m->T, m->head_size, x);
    cost_attention(c, (double)m->B * m->heads_local, m->T, m->head_size, x, m->build.flash_attention, 1);
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
        cost_layer_backward(c, m, x, tp_size);
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
        if (backward) cost_layer_backward(scratch, m, x, tp_size);
    }
    charge_launch_gaps(scratch);
    double seconds = scratch->seconds / m->num_local_layers;
    free(scratch);
    return seconds;
}

// one DP bucket's chain reduce, or chain broadcast, per shard it touches: (DP - 1) latencies
// and its bytes over the DP link each (elem_bytes: fp32 gradients, floatX parameters)
static double bucket_seconds(const StageCost* c, const GradBucket* b, size_t shard, int dp_size, double elem_bytes,
                             int* messages) {
    double seconds = 0.0;
    for (int q = 0; q < dp_size; q++) {
        size_t lo, hi;
        if (!bucket_part(b, shard, q, &lo, &hi)) continue;
        seconds += (dp_size - 1.0) * 1e-6 * c->hw->latency_us + (hi - lo) * elem_bytes / c->group_bandwidth[GROUP_DP];
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
    GradBucket* buckets = (GradBucket*)mallocCheck((m->num_tensors + 1) * sizeof(GradBucket));
    int count = grad_buckets(m, bucket_size, buckets);
    size_t shard = m->num_params_padded / dp_size;
    double busy_until = 0.0, exposed = 0.0;
    double backward_end = m->num_local_layers * t_layer;
    *total = 0.0;
    *messages = 0;
    for (int k = 0; k < count; k++) {
        const GradBucket* b = &buckets[k];
        double seconds = bucket_seconds(c, b, shard, dp_size, 4.0, messages);
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
    GradBucket* buckets = (GradBucket*)mallocCheck((m->num_tensors + 1) * sizeof(GradBucket));
    int count = grad_buckets(m, bucket_size, buckets);
    size_t shard = m->num_params_padded / dp_size;
    double* done = (double*)mallocCheck((count + 1) * sizeof(double));   // done[k]: the k-th from the start
    *total = 0.0;
    *messages = 0;
    for (int k = 0; k < count; k++) {
        *total += bucket_seconds(c, &buckets[count - 1 - k], shard, dp_size, x, messages);
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
// buckets of the DP overlaps; t_forward, t_backward: layer_seconds
static void cost_optimizer(StageCost* c, const GPT* m, double x, int dp_size, int pp_size, DPOverlap overlap,
                           double t_forward, double t_backward) {
    double shard = (double)m->num_params_padded / dp_size;
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
    if (dp_size > 1 && overlap.reduce_bucket > 0) {
        double exposed = overlapped_reduce_seconds(c, m, t_backward, dp_size, overlap.reduce_bucket, &c->reduce_total,
                                                   &messages);
        c->reduce_hidden = fmax(0.0, c->reduce_total - exposed);   // (not -0.000 by rounding)
        charge(c, "ZeRO gradient reduce, buckets: exposed", messages, 0.0, (dp_size - 1.0) * shard * 4.0, exposed);
        c->bytes_sent[GROUP_DP] += (dp_size - 1.0) * shard * 4.0;
    } else if (dp_size > 1) {
        charge_message(c, "ZeRO reduce-scatter", GROUP_DP, dp_size - 1.0, (dp_size - 1.0) * shard * 4.0);
    }
    charge_kernel(c, "gradient norm", 2, shard * 4.0);   // the whole shard in one pass and a final sum
    charge_kernel(c, "AdamW", 1, shard * (7.0 * 4.0 + x));   // master, m, v read and written; grad read; param written
    if (dp_size > 1 && overlap.gather_bucket > 0) {
        double exposed = overlapped_gather_seconds(c, m, t_forward, dp_size, overlap.gather_bucket, x, &c->gather_total,
                                                   &messages);
        c->gather_hidden = fmax(0.0, c->gather_total - exposed);   // (not -0.000 by rounding)
        charge(c, "ZeRO all-gather, buckets: exposed", messages, 0.0, (dp_size - 1.0) * shard * x, exposed);
        c->bytes_sent[GROUP_DP] += (dp_size - 1.0) * shard * x;
    } else if (dp_size > 1) {
        charge_message(c, "ZeRO all-gather", GROUP_DP, dp_size - 1.0, (dp_size - 1.0) * shard * x);
    }
    charge_launch_gaps(c);
}

// a planned stage's costs over a step of `micro` micro-batches, in its build's precision
static void plan_stage_cost(const GPT* m, const Hardware* hw, int TP, int PP, int DP, int micro, DPOverlap overlap,
                            StageCost* c, double* micro_seconds) {
    double x = m->build.floatx_bytes;
    memset(c, 0, sizeof(*c));
    c->hw = hw;
    c->group_bandwidth[GROUP_TP] = group_bandwidth(hw, 1, TP);
    c->group_bandwidth[GROUP_DP] = group_bandwidth(hw, TP, DP);
    c->group_bandwidth[GROUP_PP] = group_bandwidth(hw, TP * DP, PP);
    c->group_bandwidth[GROUP_EMBEDDING] = group_bandwidth(hw, TP * DP * (PP - 1), 2);
    c->calls = micro;
    cost_micro_batch(c, m, x, TP);
    *micro_seconds = c->seconds / micro;
    cost_optimizer(c, m, x, DP, PP, overlap, layer_seconds(c, m, x, TP, 0), layer_seconds(c, m, x, TP, 1));
}

// a layout's plan: its peak memory (the stage that holds most), its step and what it sends
typedef struct {
    int tp, pp, dp, vp, micro_batches, peak_stage, slowest_stage;   // vp: model chunks per stage (interleaving)
    double peak_bytes, step_seconds, slot_seconds, optimizer_seconds, tflops_per_gpu, bubble;
    double bytes_sent[NUM_COMM_GROUPS];   // the busiest rank's, per group: --log-comm's numbers
    int out_of_memory;
} LayoutPlan;

// the layout of `a` on `hw`: every stage's memory and costs; the slowest stage's costs into
// `slowest` when given
static LayoutPlan plan_layout(const Config* a, const Hardware* hw, StageCost* slowest) {
    LayoutPlan L;
    memset(&L, 0, sizeof(L));
    L.tp = a->tensor_model_parallel_size;
    L.pp = a->pipeline_model_parallel_size;
    L.dp = data_parallel_size(a);
    L.vp = virtual_chunks(a);
    L.micro_batches = a->global_batch_size / (a->micro_batch_size * L.dp);
    StageCost* c = (StageCost*)mallocCheck(sizeof(StageCost));
    for (int p = 0; p < L.pp; p++) {
        GPT m;
        plan_stage_model(&m, a, p, L.tp, L.dp);
        StageMemory s = stage_memory(&m, pipeline_stage(a, p), L.dp);
        if (s.total > L.peak_bytes) {
            L.peak_bytes = (double)s.total;
            L.peak_stage = p;
        }
        double micro_seconds;
        DPOverlap overlap = {a->overlap_grad_reduce ? grad_bucket_size(a, L.dp) : 0,
                             a->overlap_param_gather ? grad_bucket_size(a, L.dp) : 0};
        plan_stage_cost(&m, hw, L.tp, L.pp, L.dp, L.micro_batches, overlap, c, &micro_seconds);
        gpt_free_plan(&m);
        if (micro_seconds > L.slot_seconds) {
            L.slot_seconds = micro_seconds;
            L.slowest_stage = p;
            if (slowest) *slowest = *c;
        }
        double optimizer_seconds = c->seconds - micro_seconds * L.micro_batches;
        if (optimizer_seconds > L.optimizer_seconds) L.optimizer_seconds = optimizer_seconds;
        for (int g = 0; g < NUM_COMM_GROUPS; g++)
            if (c->bytes_sent[g] > L.bytes_sent[g]) L.bytes_sent[g] = c->bytes_sent[g];
    }
    free(c);
    // the bubble is p - 1 of a chunk's slots, a v-th of a stage's (Narayanan et al. 2021, §2.2.1)
    L.step_seconds = (L.micro_batches + (L.pp - 1.0) / L.vp) * L.slot_seconds + L.optimizer_seconds;
    L.bubble = (L.pp - 1.0) / ((double)L.vp * L.micro_batches + L.pp - 1.0);
    double flops = flops_per_step(&a->model, a->global_batch_size, recomputed_layers(a),
                                  recomputed_attention_cores(a, runs_flash_attention(a, plans_gpu_build(a))));
    L.tflops_per_gpu = flops / L.step_seconds / (L.tp * L.pp * L.dp) / 1e12;
    L.out_of_memory = L.peak_bytes + hw->reserve_gib * (1 << 30) > hw->memory_gib * (1 << 30);
    return L;
}

// a time in seconds with two significant digits at least ("12.3", "0.45", "0.0031")
static void print_seconds(double s) {
    int decimals = s >= 1.0 ? 1 : (int)ceil(-log10(s > 0.0 ? s : 1e-9)) + 1;
    printf("%.*f", decimals, s);
}

// the fixed, parseable last line
static void print_layout_line(const Config* a, const LayoutPlan* L) {
    char vp[16] = "";   // interleaved: its model chunks per stage (Megatron-LM's virtual pipeline size)
    if (L->vp > 1) snprintf(vp, sizeof vp, " VPP %d", L->vp);
    printf("dry-run: world %d TP %d PP %d DP %d MBS %d GBS %d%s%s: peak memory per GPU %.1f GiB (stage %d), step ",
           L->tp * L->pp * L->dp, L->tp, L->pp, L->dp, a->micro_batch_size, a->global_batch_size, vp,
           a->model.sequence_parallel ? " SP" : "", L->peak_bytes / (1 << 30), L->peak_stage);
    print_seconds(L->step_seconds);
    printf(" s, %.1f TFLOPs per GPU, bubble %.1f%%%s\n", L->tflops_per_gpu, 100.0 * L->bubble,
           L->out_of_memory ? " OOM" : "");
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

// --sweep: every layout of the world the model's shape and the batch allow, with sequence
// parallelism and without where TP > 1 (a --sequence-parallel given is not read) and with each
// interleaving (v model chunks per stage) its layers and micro-batches allow, one line each,
// those that fit first, each part fastest first
typedef struct {
    LayoutPlan plan;
    int micro_batch_size, sequence_parallel;
} SweepRow;

static int compare_sweep_rows(const void* x, const void* y) {
    const SweepRow *a = (const SweepRow*)x, *b = (const SweepRow*)y;
    if (a->plan.out_of_memory != b->plan.out_of_memory) return a->plan.out_of_memory - b->plan.out_of_memory;
    return (a->plan.step_seconds > b->plan.step_seconds) - (a->plan.step_seconds < b->plan.step_seconds);
}

static void dry_run_sweep(const Config* a, const Hardware* hw) {
    int W = layout_world_size(a), count = 0, refused = 0, capacity = 64, oom = 0;
    SweepRow* rows = (SweepRow*)mallocCheck(capacity * sizeof(SweepRow));
    char err[512];
    for (int tp = 1; tp <= W; tp++) {
        for (int pp = 1; W % tp == 0 && pp <= W / tp; pp++) {
            int dp = W / (tp * pp);
            for (int k = 0; (W / tp) % pp == 0 && k < a->global_batch_size / dp * (tp > 1 ? 2 : 1); k++) {
                int mbs = k / (tp > 1 ? 2 : 1) + 1, sp = tp > 1 && k % 2;   // each MBS without SP, then with
                if ((a->global_batch_size / dp) % mbs != 0) continue;
                Config b = *a;
                b.tensor_model_parallel_size = tp;
                b.pipeline_model_parallel_size = pp;
                b.micro_batch_size = mbs;
                b.num_layers_per_virtual_pipeline_stage = b.num_virtual_stages_per_pipeline_rank = 0;
                b.microbatch_group_size_per_virtual_pipeline_stage = 0;   // (a group size given: the interleaved rows')
                b.model.sequence_parallel = sp;
                long long padded = padded_vocab_size(b.model.vocab_size, b.model.make_vocab_size_divisible_by, tp);
                b.model.padded_vocab_size = padded > INT_MAX ? 0 : (int)padded;
                if (padded > INT_MAX || layout_error(&b, err, sizeof(err))) {
                    refused++;
                    continue;
                }
                // plain 1F1B (v = 1), then each interleaving the layers and the micro-batches allow
                for (int v = 1; v == 1 || (pp > 1 && v <= a->model.num_layers / pp); v++) {
                    b.num_virtual_stages_per_pipeline_rank = v > 1 ? v : 0;
                    b.microbatch_group_size_per_virtual_pipeline_stage =
                        v > 1 ? a->microbatch_group_size_per_virtual_pipeline_stage : 0;
                    if (v > 1 && layout_error(&b, err, sizeof(err))) continue;
                    if (count == capacity) {
                        capacity *= 2;
                        rows = (SweepRow*)reallocCheck(rows, capacity * sizeof(SweepRow));
                    }
                    rows[count].plan = plan_layout(&b, hw, NULL);
                    rows[count].micro_batch_size = mbs;
                    rows[count].sequence_parallel = sp;
                    oom += rows[count].plan.out_of_memory;
                    count++;
                }
            }
        }
    }
    qsort(rows, count, sizeof(SweepRow), compare_sweep_rows);
    printf("sweep: %d layout(s) of world %d at global batch %d (%d fit, %d above memory: OOM), %d refused by the "
           "model's shape or the batch; those that fit first, each part fastest first\n", count, W,
           a->global_batch_size, count - oom, oom, refused);
    for (int k = 0; k < count; k++) {
        Config b = *a;
        b.micro_batch_size = rows[k].micro_batch_size;
        b.model.sequence_parallel = rows[k].sequence_parallel;
        print_layout_line(&b, &rows[k].plan);
    }
    free(rows);
}

// a plan's figures after "LABEL: ", as the last line has them, with the pipeline's bytes
static void print_plan_summary(const char* label, const LayoutPlan* L) {
    printf("%s: peak memory per GPU %.1f GiB (stage %d), step ", label, L->peak_bytes / (1 << 30), L->peak_stage);
    print_seconds(L->step_seconds);
    printf(" s, %.1f TFLOPs per GPU, bubble %.1f%%, pipeline %.1f MiB sent per step (the busiest rank)%s\n",
           L->tflops_per_gpu, 100.0 * L->bubble, L->bytes_sent[GROUP_PP] / (1024.0 * 1024.0),
           L->out_of_memory ? " OOM" : "");
}

// The same layout with each other form of recomputation: none, the attention core of every
// layer (Megatron-LM's --recompute-activations), every layer (Megatron-DeepSpeed's
// --checkpoint-activations), so the plan shows what each would cost and save
static void print_recomputation_alternative(const Config* a, const Hardware* hw, int method, int core, const char* label) {
    Config other = *a;
    other.model.recompute_method = method;
    other.model.recompute_num_layers = 1;
    other.model.recompute_attention_core = core;
    LayoutPlan L = plan_layout(&other, hw, NULL);
    print_plan_summary(label, &L);
}

static void print_recomputation_alternatives(const Config* a, const Hardware* hw) {
    const GPTConfig* m = &a->model;
    int none = m->recompute_method == RECOMPUTE_NONE && !m->recompute_attention_core;
    if (!none) print_recomputation_alternative(a, hw, RECOMPUTE_NONE, 0, "without activation recomputation");
    if (runs_flash_attention(a, plans_gpu_build(a)))   // selective's plan would be the plan without, line for line
        printf("with the attention core recomputed (--recompute-activations): the same as without recomputation: the "
               "fused attention keeps no T x T probabilities, and its backward recomputes them already\n");
    else if (!m->recompute_attention_core)
        print_recomputation_alternative(a, hw, RECOMPUTE_NONE, 1, "with the attention core recomputed (--recompute-activations)");
    if (m->recompute_method != RECOMPUTE_UNIFORM)
        print_recomputation_alternative(a, hw, RECOMPUTE_UNIFORM, 0, "with every layer recomputed (--checkpoint-activations)");
}

// The same layout the other way round for interleaving, so the plan shows what it saves and
// costs: plain 1F1B for an interleaved one; for a plain one with PP > 1 the fastest interleaving
// its layers and micro-batches allow (--num-virtual-stages-per-pipeline-rank v), or why none.
static void print_interleaving_alternative(const Config* a, const Hardware* hw) {
    if (a->pipeline_model_parallel_size == 1) return;
    Config other = *a;
    other.num_layers_per_virtual_pipeline_stage = other.num_virtual_stages_per_pipeline_rank = 0;
    if (virtual_chunks(a) > 1) {
        LayoutPlan L = plan_layout(&other, hw, NULL);
        print_plan_summary("without interleaving (plain 1F1B)", &L);
        return;
    }
    int* layers = stage_layers(a), most = 0, best_v = 0;
    for (int p = 0; p < a->pipeline_model_parallel_size; p++) most = layers[p] > most ? layers[p] : most;
    free(layers);
    LayoutPlan best;
    char err[512], why[512] = "its stages hold one layer at most";
    for (int v = 2; v <= most; v++) {
        other.num_virtual_stages_per_pipeline_rank = v;
        if (layout_error(&other, err, sizeof err)) {
            if (v == 2) snprintf(why, sizeof why, "%s", err);
            continue;
        }
        LayoutPlan L = plan_layout(&other, hw, NULL);
        if (!best_v || L.step_seconds < best.step_seconds) {
            best = L;
            best_v = v;
        }
    }
    if (!best_v) {
        printf("interleaving: no v of 2 or more model chunks per stage fits this layout (v = 2: %s)\n", why);
        return;
    }
    char label[160];
    snprintf(label, sizeof label, "with interleaving, the fastest its layers and micro-batches allow "
             "(--num-virtual-stages-per-pipeline-rank %d)", best_v);
    print_plan_summary(label, &best);
}

// the same run with --sequence-parallel the other way round, and that way's name
static Config sequence_parallel_toggled(const Config* a, const char** name) {
    Config other = *a;
    other.model.sequence_parallel = !a->model.sequence_parallel;
    *name = other.model.sequence_parallel ? "with --sequence-parallel" : "without sequence parallelism";
    return other;
}

// one layer's activations for one micro-batch, as stage 0's tensor rank 0 lays them out
static size_t stage0_layer_bytes(const Config* a) {
    GPT m;
    plan_stage_model(&m, a, 0, a->tensor_model_parallel_size, data_parallel_size(a));
    size_t bytes = layer_activation_bytes(&m);
    gpt_free_plan(&m);
    return bytes;
}

// With TP > 1, the same layout with sequence parallelism the other way round: its memory (one
// layer's activations, the peak) and its step, so the plan shows what it saves and costs
static void print_sequence_parallel_alternative(const Config* a, const Hardware* hw) {
    const char* name;
    Config other = sequence_parallel_toggled(a, &name);
    char err[512];
    if (a->tensor_model_parallel_size == 1) return;
    if (layout_error(&other, err, sizeof(err))) {
        printf("%s: refused (%s)\n", name, err);
        return;
    }
    LayoutPlan L = plan_layout(&other, hw, NULL);
    print_plan_summary(name, &L);
}

// One layer's activations for one micro-batch, as stage 0's tensor rank 0 lays them out, and
// with TP > 1 the same with sequence parallelism the other way round (Korthikanti et al. 2022,
// Table 2: the LayerNorm and residual rows' share 1/TP with it; docs/parallelism.md compares)
static void print_layer_activations(const Config* a) {
    const char* name;
    Config other = sequence_parallel_toggled(a, &name);
    char err[512];
    size_t bytes = stage0_layer_bytes(a);
    printf("activations of one layer for one micro-batch: %zu bytes (%.2f MiB)", bytes, bytes / 1048576.0);
    if (a->tensor_model_parallel_size > 1 && !layout_error(&other, err, sizeof(err))) {
        size_t other_bytes = stage0_layer_bytes(&other);
        printf("; %s %zu bytes (%.2f MiB)", name, other_bytes, other_bytes / 1048576.0);
    }
    printf("\n");
}

// The step's tokens per second (global batch x sequence / step) and its model FLOPs utilization:
// the model's FLOPs without recomputation (what the step must do, PaLM's MFU: Chowdhery et al.
// 2022, appendix B) per second per GPU, over --hw's dense peak. With recomputation the TFLOPs
// of the last line count the recomputed forwards too (Narayanan et al. 2021's convention).
static void print_throughput(const Config* a, const Hardware* hw, const LayoutPlan* L) {
    double tokens = (double)a->global_batch_size * a->model.seq_length, gpus = (double)L->tp * L->pp * L->dp;
    double model_flops = flops_per_step(&a->model, a->global_batch_size, 0, 0);
    int digits = hw->cpu_threads > 0.0 ? 3 : 0;   // a CPU's peak is a fraction of a TFLOP/s
    printf("throughput: %.0f tokens per second (%.0f per GPU); model FLOPs utilization %.1f%% of %.*f TFLOP/s (%.*f TFLOPs "
           "per GPU without recomputation)\n", tokens / L->step_seconds, tokens / L->step_seconds / gpus,
           100.0 * model_flops / L->step_seconds / gpus / (1e12 * hw->peak_tflops), digits, hw->peak_tflops, digits + 1,
           model_flops / L->step_seconds / gpus / 1e12);
}

// the precision of the build --dry-run-build plans: the GPU build's 16-bit type (fp16 with --fp16,
// train_gpu_fp16's; else bf16, train_gpu's) over fp32 master weights; the CPU build's fp32
static const char* planned_precision(const Config* a) {
    if (!plans_gpu_build(a)) return "fp32";
    return a->fp16 ? "fp16 (fp32 master weights, fp32 grads)" : "bf16 (fp32 master weights, fp32 grads)";
}

// --dry-run: the layout of --world-size ranks (or the launched ones) planned stage by stage on
// one rank: what each would allocate (the trainer's own numbers: plan_stage_memory), the model
// FLOPs of a step, the bubble, what each group sends, the cost model's step on --hw, and a
// last line in a fixed form. Every check of the flags has passed; nothing large is allocated,
// no group built, no data read, no step run.
static void dry_run_report(const Config* a) {
    int TP = a->tensor_model_parallel_size, PP = a->pipeline_model_parallel_size, DP = data_parallel_size(a);
    int micro = a->global_batch_size / (a->micro_batch_size * DP);
    printf("dry run: gridgpt %s build planned (--dry-run-build), %s, world %d as TP %d x PP %d x DP %d: nothing allocated, "
           "no step run\n", plans_gpu_build(a) ? "GPU" : "CPU", planned_precision(a), layout_world_size(a), TP, PP, DP);
    print_model(&a->model);
    print_attention(a, plans_gpu_build(a));
    printf("each stage as its tensor rank 0, data rank 0 holds it (its other ranks hold the same sizes: another slice "
           "of the vocabulary, the matrices and the ZeRO shard)\n");
    for (int p = 0; p < PP; p++) {
        StageMemory s = plan_stage_memory(a, p, TP, DP);
        if (p == 0) print_memory_header();
        print_memory_row("planned", &s, 1);
        if (p == PP - 1) print_model_state_bytes(&s, DP);
    }
    print_layer_activations(a);
    double flops = flops_per_step(&a->model, a->global_batch_size, recomputed_layers(a),
                                  recomputed_attention_cores(a, runs_flash_attention(a, plans_gpu_build(a))));
    Hardware hw = hardware_of(a);
    StageCost* slowest = (StageCost*)mallocCheck(sizeof(StageCost));
    LayoutPlan L = plan_layout(a, &hw, slowest);
    printf("model FLOPs per step: %.4g (global batch %d; Narayanan et al. 2021, recomputation included)\n", flops,
           a->global_batch_size);
    if (L.vp == 1)
        printf("1F1B bubble: (p - 1) / (m + p - 1) = %d / %d = %.1f%% of the step, m = %d micro-batches per pipeline\n",
               PP - 1, micro + PP - 1, 100.0 * L.bubble, micro);
    else
        printf("interleaved 1F1B bubble: (p - 1) / (v m + p - 1) = %d / %d = %.1f%% of the step, m = %d micro-batches per "
               "pipeline, v = %d model chunks per stage (Narayanan et al. 2021, §2.2.1); the pipeline sends v times plain "
               "1F1B's messages\n", PP - 1, L.vp * micro + PP - 1, 100.0 * L.bubble, micro, L.vp);
    if (a->print_schedule) draw_schedule(a, micro);
    print_comm(L.bytes_sent);
    print_hardware(a, &hw);
    print_stage_costs(slowest, L.slowest_stage, micro);
    printf("GEMMs only (the cuBLAS rows): %.6g ms of stage %d's step\n", 1e3 * gemm_only_seconds(slowest), L.slowest_stage);
    if (L.vp == 1)
        printf("step = (m + p - 1) x the slowest stage's micro-batch + the slowest optimizer step = %d x %.4g s + %.4g s\n",
               micro + PP - 1, L.slot_seconds, L.optimizer_seconds);
    else
        printf("step = (m + (p - 1) / v) x the slowest stage's micro-batch + the slowest optimizer step = %.4g x %.4g s + "
               "%.4g s\n", micro + (PP - 1.0) / L.vp, L.slot_seconds, L.optimizer_seconds);
    if (a->overlap_grad_reduce && DP > 1)
        printf("--overlap-grad-reduce on stage %d: its bucketed reduces take %.3f ms, %.3f ms of them hidden behind the "
               "last micro-batch's backward\n", L.slowest_stage, 1e3 * slowest->reduce_total, 1e3 * slowest->reduce_hidden);
    if (a->overlap_param_gather && DP > 1)
        printf("--overlap-param-gather on stage %d: its bucketed broadcasts take %.3f ms, %.3f ms of them hidden behind the "
               "next step's first forward\n", L.slowest_stage, 1e3 * slowest->gather_total, 1e3 * slowest->gather_hidden);
    print_recomputation_alternatives(a, &hw);
    print_interleaving_alternative(a, &hw);
    print_sequence_parallel_alternative(a, &hw);
    print_throughput(a, &hw, &L);
    if (L.out_of_memory)
        printf("does not fit: %.1f GiB of ours + %.1f GiB left to CUDA, cuBLAS and NCCL > %.1f GiB\n",
               L.peak_bytes / (1 << 30), hw.reserve_gib, hw.memory_gib);
    free(slowest);
    print_layout_line(a, &L);
}

static void dry_run_and_exit(Config* a) {
    set_padded_vocab_size(a);
    Hardware hw = hardware_of(a);
    char name[32];
    if (plans_gpu_build(a) && a->attention_backend == ATTENTION_FLASH && hw.attention_efficiency <= 0.0)
        config_error("--attention-backend flash: --hw %s's GPU has no fused attention kernels (they need sm_80: cp.async, "
                     "mma.sync.m16n8k16)", hw_name(a, name, sizeof name));
    if (grid.world_rank == 0 && a->sweep) dry_run_sweep(a, &hw);
    if (grid.world_rank == 0 && !a->sweep) dry_run_report(a);
    fflush(stdout);
    grid_finish();
    exit(0);
}
