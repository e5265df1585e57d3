/*
plan.h — what a run will take before it takes it: the memory plan of every pipeline stage
(to the byte, from the same plan the model allocates from), the memory a rank may take
(host, process limits, cgroup; or the GPU), and the planner (--dry-run, --sweep): the layouts a
model and batch allow, each priced by the cost model of one step on a described GPU cluster
(cost.h's, below it). The pipeline schedule drawn as text (--print-schedule) is
print_schedule.h's; the machines priced (Hardware, --hw's presets, this CPU measured, the --hw-*
flags, the cost model's line) are hardware.h's.

Interface (what train.c uses): StageMemory, stage_memory, plan_stage_memory,
print_memory_header, print_memory_row, print_model_state_bytes, print_dp_communication,
print_pipeline_exchanges, memory_available, check_memory, check_index_memory, dry_run_and_exit
(and, for the tests, Hardware, plan_layout and the cost of a stage: cost.h's plan_stage_cost).
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

// --log-comm's two lines: the bytes sent in each group (cost.h's order: tp, dp (DP x CP's, ZeRO's),
// pp, embedding, cp, ep (the experts' all-to-alls), expert-dp (the experts' ZeRO with EP > 1)) in a
// step, the most any rank sent, in MiB and in bytes (--dry-run prints the ones it predicts)
static void print_comm(const double most[NUM_COMM_GROUPS]) {
    double mib = 1024.0 * 1024.0;
    printf(" communication per step (MiB sent by the busiest rank, ring algorithms): tensor-parallel %.3f |"
           " data-parallel %.3f | pipeline %.3f | embedding %.3f | context-parallel %.3f | expert-parallel %.3f |"
           " expert-data-parallel %.3f |\n", most[GROUP_TP] / mib, most[GROUP_DP] / mib, most[GROUP_PP] / mib,
           most[GROUP_EMBEDDING] / mib, most[GROUP_CP] / mib, most[GROUP_EP] / mib, most[GROUP_EXPERT_DP] / mib);
    printf(" communication per step in bytes: %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f\n", most[GROUP_TP],
           most[GROUP_DP], most[GROUP_PP], most[GROUP_EMBEDDING], most[GROUP_CP], most[GROUP_EP], most[GROUP_EXPERT_DP]);
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
    int states_8bit;                                                    // Adam's moments in 8 bits (--use-bnb-optimizer)
    int zero_stage;                                                     // 1 (0), 2 or 3 (zero.h)
    size_t padded;                                                      // the flat buffers' elements (num_params_padded)
} StageMemory;

// --ddp-bucket-size, or Megatron-LM's default: max(40M, 1M x DP) elements
static size_t grad_bucket_size(const Config* a, int dp_size) {
    if (a->ddp_bucket_size > 0) return (size_t)a->ddp_bucket_size;
    return dp_size > 40 ? (size_t)1000000 * dp_size : (size_t)40000000;
}

// a planned (or built) model's bytes over dp_size data ranks: what gpt_allocate, adamw_init and
// kernels_init hand out on the build the model was laid out for (m->build), Adam's moments in
// 8 bits with states_8bit (--use-bnb-optimizer)
static StageMemory stage_memory(const GPT* m, PipelineStage stage, int dp_size, int states_8bit) {
    int master_copy = m->build.floatx_bytes != (int)sizeof(float);   // adamw_init's rule
    size_t shard[2];   // (the experts' over their expert-data-parallel group)
    zero_shard_sizes(m, dp_size, m->ep.data_parallel, shard);
    size_t workspaces = m->workspace_bytes + adamw_workspace_bytes(m->build, m->num_tensors, shard, states_8bit) +
                        (m->build.gpu ? GPU_KERNELS_WORKSPACE_BYTES : 0);
    // ZeRO-2: the gradient window and the shard's fp32 accumulator; ZeRO-3: also the parameter window and
    // the shard's parameters (on the CPU build the master weights themselves: no copy in the state)
    size_t accumulator = m->zero_stage >= 2 ? shard[0] * sizeof(float) : 0;
    size_t param_shard = m->zero_stage >= 3 ? shard[0] * m->build.floatx_bytes : 0;
    StageMemory s = {stage, m->num_params, m->params_length * m->build.floatx_bytes + param_shard,
                     m->grads_length * sizeof(float) + accumulator, adamw_state_bytes(shard, master_copy, states_8bit),
                     m->arena_bytes - m->workspace_bytes, workspaces, 0, m->num_slots, m->longest_chunk, m->slot_bytes,
                     m->recompute_bytes, states_8bit, m->zero_stage, m->num_params_padded};
    s.total = s.params + s.grads + s.optimizer + s.activations + s.workspaces;
    return s;
}

// The model state a parameter costs (parameters, gradients, optimizer state) on a stage of the
// plan, against Megatron-LM's distributed optimizer (its docs' table of bytes a parameter and
// theoretical_memory_usage.py): 16-bit parameters with fp32 gradients keep 6 + 12/DP there,
// fp32 ones 8 + 8/DP. The same here: the gradients' reduce-scatter sums into each rank's shard
// of the gradient buffer in place, so the optimizer's shard holds no gradient copy. With 8-bit
// moments (--use-bnb-optimizer) the shard's 12 or 8 bytes become 6 or 2 (and a scale of 4 bytes
// for each moment's 2,048: 0.004 more).
// ZeRO-2 and ZeRO-3 (zero.h): what each part costs a parameter, the windows onto the layers in flight included
static void print_zero_state_bytes(const StageMemory* s, int dp_size) {
    double n = (double)s->padded;
    printf("model state: %.3g bytes a parameter = %.3g (%s) + %.3g (%s) + %.3g (the shard's optimizer state), "
           "ZeRO-%d over DP %d\n", (s->params + s->grads + s->optimizer) / n, s->params / n,
           s->zero_stage >= 3 ? "the shard's parameters, the embedding, the head and the layers gathered" : "parameters",
           s->grads / n, "the shard's fp32 gradient accumulator, the embedding's, the head's and two layers' gradients",
           s->optimizer / n, s->zero_stage, dp_size);
}

static void print_model_state_bytes(const StageMemory* s, int dp_size) {
    if (s->padded == 0) return;
    if (s->zero_stage >= 2) {
        print_zero_state_bytes(s, dp_size);
        return;
    }
    size_t padded = s->padded;
    int param_bytes = (int)(s->params / padded), shard_bytes = (int)(s->optimizer / (padded / dp_size));
    double per_param = (double)(s->params + s->grads + s->optimizer) / padded;
    const char* what = s->states_8bit ? (param_bytes == 4 ? "the shard's Adam m and v in 8 bits, with a scale a 2,048; the "
                                                            "parameters are the master weights"
                                                          : "the shard's fp32 master weights, Adam's m and v in 8 bits "
                                                            "with a scale a 2,048")
                        : shard_bytes == 12 ? "the shard's fp32 master weights, Adam's m and v"
                                            : "the shard's Adam m and v; the parameters are the master weights";
    printf("model state: %.3g bytes a parameter = %d (%s parameters) + 4 (fp32 gradients%s) + %d/%d (%s), Megatron-LM's "
           "distributed optimizer's %d + %d/DP\n", per_param, param_bytes, param_bytes == 4 ? "fp32" : "16-bit",
           dp_size > 1 ? ", each rank's shard summed over DP in place" : "", shard_bytes, dp_size, what, param_bytes + 4,
           param_bytes == 4 ? 8 : 12);
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
                            "--checkpoint-activations keeps less; --context-parallel-size divides a rank's rows)",
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

// stage p of the layout with tp_size x CP x dp_size ranks, as its tensor rank 0 (and context rank
// 0) would hold it on the build --dry-run-build names: planned and thrown away. The ranks of a
// stage hold the same sizes (other slices of the vocabulary, of the matrices, of the sequences'
// chunks and of the ZeRO shard, which is over DP x CP).
static void plan_stage_model(GPT* m, const Config* a, int p, int tp_size, int dp_size) {
    BuildTarget build = {plans_gpu_build(a), plans_gpu_build(a) ? 2 : (int)sizeof(float),   // bf16 or fp16; fp32
                         runs_flash_attention(a, plans_gpu_build(a)), a->bias_grad == BIAS_GRAD_KERNEL};
    PipelineStage stage = pipeline_stage(a, p);
    int* slots = (int*)mallocCheck(stage.chunks * sizeof(int));   // what the schedule needs, as the trainer's
    stage_slots(a, p, slots);
    int dp_cp = dp_size * a->context_parallel_size, EP = a->expert_model_parallel_size;
    gpt_plan_model(m, &a->model, a->micro_batch_size, a->model.seq_length, 0, tp_size,
                   context_slice(0, a->context_parallel_size, a->model.seq_length), (CpCommType)a->cp_comm_type,
                   expert_slice(0, EP, a->model.num_experts, NULL, dp_cp / EP), stage, slots, dp_cp,
                   zero_shard_multiple(a->use_bnb_optimizer), build);
    zero_plan_windows(m, a->zero_stage, !a->no_reshard_after_forward);
    free(slots);
}

// the MoE layers whose activations a stage keeps at once: each slot's (its chunk's layers that are
// not recomputed) and the recomputation's scratch's, laid out for a MoE layer at every position
static int kept_moe_layers(const GPT* m) {
    int n = 0;
    for (int s = 0; s < m->num_slots; s++)
        for (int i = m->slots[s].first; i < m->slots[s].end; i++) {
            int first, end;
            n += !recompute_chunk(m, i, &first, &end) && is_moe_layer(&m->cfg, global_layer(m, i));
        }
    return n + (m->cfg.num_experts > 0 ? m->longest_chunk : 0);
}

// The rows a rank's experts may receive in one MoE layer's micro-batch (gpt.h expert_rows_max:
// the activations the model lays out are sized so: dropless, or with a capacity factor each
// expert's capacity from each rank of its group)
static double expert_receive_rows(const GPT* m) { return (double)expert_rows_max(m); }

// a planned stage's memory: the model's (stage_memory; its experts those of the layout's EP)
static StageMemory planned_stage_memory(const GPT* m, const Config* a, int p, int dp_size) {
    return stage_memory(m, pipeline_stage(a, p), dp_size * a->context_parallel_size, a->use_bnb_optimizer);   // (ZeRO's DP x CP)
}

static StageMemory plan_stage_memory(const Config* a, int p, int tp_size, int dp_size) {
    GPT m;
    plan_stage_model(&m, a, p, tp_size, dp_size);
    StageMemory s = planned_stage_memory(&m, a, p, dp_size);
    gpt_free_plan(&m);
    return s;
}

// the experts' layout the plan prices (cost.h's ExpertLayout)
static ExpertLayout expert_layout_of(const Config* a) {
    ExpertLayout e = {a->expert_model_parallel_size, a->moe_imbalance > 0.0f ? a->moe_imbalance : 1.0};
    return e;
}

// a layout's plan: its peak memory (the stage that holds most), its step and what it sends
typedef struct {
    int tp, cp, pp, dp, ep, vp, micro_batches, peak_stage, slowest_stage;   // vp: model chunks per stage (interleaving)
    double peak_bytes, step_seconds, slot_seconds, optimizer_seconds, tflops_per_gpu, bubble;
    double fbw[3];   // the slowest stage's layer: its forward, its backward less W, W (ZB-H1's split), in seconds
    double bytes_sent[NUM_COMM_GROUPS];   // the busiest rank's, per group: --log-comm's numbers
    int out_of_memory;
} LayoutPlan;

// the layout of `a` on `hw`: every stage's memory and costs; the slowest stage's costs into
// `slowest` when given
static LayoutPlan plan_layout(const Config* a, const Hardware* hw, StageCost* slowest) {
    LayoutPlan L;
    memset(&L, 0, sizeof(L));
    L.tp = a->tensor_model_parallel_size;
    L.cp = a->context_parallel_size;
    L.pp = a->pipeline_model_parallel_size;
    L.dp = data_parallel_size(a);
    L.ep = a->expert_model_parallel_size;
    L.vp = virtual_chunks(a);
    L.micro_batches = a->global_batch_size / (a->micro_batch_size * L.dp);
    int zero = L.dp * L.cp;   // the ranks ZeRO shards over and a gradient is summed over (DP x CP)
    StageCost* c = (StageCost*)mallocCheck(sizeof(StageCost));
    for (int p = 0; p < L.pp; p++) {
        GPT m;
        plan_stage_model(&m, a, p, L.tp, L.dp);
        StageMemory s = planned_stage_memory(&m, a, p, L.dp);
        if (s.total > L.peak_bytes) {
            L.peak_bytes = (double)s.total;
            L.peak_stage = p;
        }
        double micro_seconds;
        DPOverlap overlap = {a->overlap_grad_reduce ? grad_bucket_size(a, zero) : 0,
                             a->overlap_param_gather ? grad_bucket_size(a, zero) : 0};
        plan_stage_cost(&m, hw, L.tp, L.cp, L.pp, L.dp, expert_layout_of(a), L.micro_batches, overlap, a->use_bnb_optimizer,
                        c, &micro_seconds);
        gpt_free_plan(&m);
        if (micro_seconds > L.slot_seconds) {
            double x = m.build.floatx_bytes;
            L.slot_seconds = micro_seconds;
            L.slowest_stage = p;
            L.fbw[2] = layer_weight_gradient_seconds(c, &m, x);
            L.fbw[0] = layer_seconds(c, &m, x, L.tp, 0);
            L.fbw[1] = layer_seconds(c, &m, x, L.tp, 1) - L.fbw[2];
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
    if (a->pipeline_schedule == SCHEDULE_ZB_H1 && L.fbw[0] > 0.0) {   // its walk, W's share from the layers' GEMMs
        L.bubble = schedule_bubble(SCHEDULE_ZB_H1, L.pp, L.micro_batches, L.fbw[0], L.fbw[1], L.fbw[2]);
        L.step_seconds = L.micro_batches / (1.0 - L.bubble) * L.slot_seconds + L.optimizer_seconds;
    }
    double flops = flops_per_step(&a->model, a->global_batch_size, recomputed_layers(a),
                                  recomputed_attention_cores(a, runs_flash_attention(a, plans_gpu_build(a))));
    L.tflops_per_gpu = flops / L.step_seconds / (L.tp * L.cp * L.pp * L.dp) / 1e12;
    L.out_of_memory = L.peak_bytes + hw->reserve_gib * (1 << 30) > hw->memory_gib * (1 << 30);
    return L;
}

// a time in seconds with two significant digits at least ("12.3", "0.45", "0.0031")
static void print_seconds(double s) {
    int decimals = s >= 1.0 ? 1 : (int)ceil(-log10(s > 0.0 ? s : 1e-9)) + 1;
    printf("%.*f", decimals, s);
}

// the fixed, parseable last line (CP, with all_gather's exchange named, only with context parallelism)
static void print_layout_line(const Config* a, const LayoutPlan* L) {
    char vp[16] = "", cp[32] = "", ep[16] = "";   // vp: its model chunks per stage (Megatron-LM's virtual pipeline size)
    if (L->vp > 1) snprintf(vp, sizeof vp, " VPP %d", L->vp);
    if (L->cp > 1) snprintf(cp, sizeof cp, " CP %d%s", L->cp, a->cp_comm_type == CP_COMM_ALL_GATHER ? " all_gather" : "");
    if (L->ep > 1) snprintf(ep, sizeof ep, " EP %d", L->ep);   // (of the DP x CP ranks)
    char zero[24] = "";   // ZeRO-2 and -3 named (ZeRO-1 is the distributed optimizer every plan has)
    if (a->zero_stage >= 2) snprintf(zero, sizeof zero, " ZeRO-%d", a->zero_stage);
    printf("dry-run: world %d TP %d%s PP %d DP %d%s MBS %d GBS %d%s%s%s: peak memory per GPU %.1f GiB (stage %d), step ",
           L->tp * L->cp * L->pp * L->dp, L->tp, cp, L->pp, L->dp, ep, a->micro_batch_size, a->global_batch_size, vp,
           a->model.sequence_parallel ? " SP" : "", zero, L->peak_bytes / (1 << 30), L->peak_stage);
    print_seconds(L->step_seconds);
    printf(" s, %.1f TFLOPs per GPU, bubble %.1f%%%s\n", L->tflops_per_gpu, 100.0 * L->bubble,
           L->out_of_memory ? " OOM" : "");
}

// --sweep: every layout of the world (TP, CP, PP, the rest DP, MBS; with experts each EP of the
// DP x CP ranks that divides them and the experts; the ZeRO stage) the model's shape, the sequence and the batch
// allow, with sequence parallelism and without where TP > 1 (a --sequence-parallel given is not
// read) and with each interleaving (v model chunks per stage) its layers and micro-batches allow,
// one line each, those that fit first, each part fastest first; context parallelism by the
// --cp-comm-type given
typedef struct {
    LayoutPlan plan;
    int micro_batch_size, sequence_parallel, zero_stage;
} SweepRow;

typedef struct {
    SweepRow* rows;
    int count, capacity, oom, refused;   // refused: by layout_error (the model's shape, the sequence, the batch)
} Sweep;

static int compare_sweep_rows(const void* x, const void* y) {
    const SweepRow *a = (const SweepRow*)x, *b = (const SweepRow*)y;
    if (a->plan.out_of_memory != b->plan.out_of_memory) return a->plan.out_of_memory - b->plan.out_of_memory;
    return (a->plan.step_seconds > b->plan.step_seconds) - (a->plan.step_seconds < b->plan.step_seconds);
}

// a layout's rows, one for each ZeRO stage: the stage given (--zero-stage), or with none given
// each of 1, 2 and 3 that the run's flags allow (zero_stage_conflict) where DP x CP > 1 shards
static void sweep_zero_stages(Sweep* s, Config* b, const Hardware* hw, int dp_cp, int mbs, int sp) {
    int given = run_field_given(b, offsetof(Config, zero_stage));
    for (int stage = 1; stage <= 3; stage++) {
        if (given ? stage != (b->zero_stage < 1 ? 1 : b->zero_stage) : (stage > 1 && (dp_cp == 1 || zero_stage_conflict(b, stage))))
            continue;
        Config z = *b;
        z.zero_stage = given ? b->zero_stage : stage;
        if (s->count == s->capacity) {
            s->capacity *= 2;
            s->rows = (SweepRow*)reallocCheck(s->rows, s->capacity * sizeof(SweepRow));
        }
        SweepRow* row = &s->rows[s->count++];
        row->plan = plan_layout(&z, hw, NULL);
        row->micro_batch_size = mbs;
        row->sequence_parallel = sp;
        row->zero_stage = z.zero_stage;
        s->oom += row->plan.out_of_memory;
    }
}

// the layouts of one (TP, CP, PP, EP): each MBS that divides a pipeline's batch, without SP and
// then with, each plain and interleaved, at each ZeRO stage
static void sweep_micro_batches(Sweep* s, const Config* a, const Hardware* hw, int tp, int cp, int pp, int ep) {
    int dp = layout_world_size(a) / (tp * cp * pp);
    char err[512];
    for (int k = 0; k < a->global_batch_size / dp * (tp > 1 ? 2 : 1); k++) {
        int mbs = k / (tp > 1 ? 2 : 1) + 1, sp = tp > 1 && k % 2;   // each MBS without SP, then with
        if ((a->global_batch_size / dp) % mbs != 0) continue;
        Config b = *a;
        b.tensor_model_parallel_size = tp;
        b.context_parallel_size = cp;
        b.pipeline_model_parallel_size = pp;
        b.expert_model_parallel_size = ep;
        b.micro_batch_size = mbs;
        b.num_layers_per_virtual_pipeline_stage = b.num_virtual_stages_per_pipeline_rank = 0;
        b.microbatch_group_size_per_virtual_pipeline_stage = 0;   // (a group size given: the interleaved rows')
        b.model.sequence_parallel = sp;
        long long padded = padded_vocab_size(b.model.vocab_size, b.model.make_vocab_size_divisible_by, tp);
        b.model.padded_vocab_size = padded > INT_MAX ? 0 : (int)padded;
        if (padded > INT_MAX || layout_error(&b, err, sizeof(err))) {
            s->refused++;
            continue;
        }
        // plain 1F1B (v = 1), then each interleaving the layers and the micro-batches allow
        for (int v = 1; v == 1 || (pp > 1 && v <= a->model.num_layers / pp); v++) {
            b.num_virtual_stages_per_pipeline_rank = v > 1 ? v : 0;
            b.microbatch_group_size_per_virtual_pipeline_stage = v > 1 ? a->microbatch_group_size_per_virtual_pipeline_stage : 0;
            if (v > 1 && layout_error(&b, err, sizeof(err))) continue;
            sweep_zero_stages(s, &b, hw, dp * cp, mbs, sp);
        }
    }
}

static void dry_run_sweep(const Config* a, const Hardware* hw) {
    int W = layout_world_size(a), E = a->model.num_experts;
    Sweep s = {(SweepRow*)mallocCheck(64 * sizeof(SweepRow)), 0, 64, 0, 0};
    for (int tp = 1; tp <= W; tp++)
        for (int cp = 1; W % tp == 0 && cp <= W / tp; cp++)
            for (int pp = 1; (W / tp) % cp == 0 && pp <= W / (tp * cp); pp++)
                for (int ep = 1; (W / (tp * cp)) % pp == 0 && ep <= W / (tp * pp); ep++)   // EP of DP x CP's ranks
                    if (ep == 1 || (E > 0 && E % ep == 0 && (W / (tp * pp)) % ep == 0))
                        sweep_micro_batches(&s, a, hw, tp, cp, pp, ep);
    qsort(s.rows, s.count, sizeof(SweepRow), compare_sweep_rows);
    printf("sweep: %d layout(s) of world %d at global batch %d (%d fit, %d above memory: OOM), %d refused by the "
           "model's shape or the batch; those that fit first, each part fastest first\n", s.count, W,
           a->global_batch_size, s.count - s.oom, s.oom, s.refused);
    for (int k = 0; k < s.count; k++) {
        Config b = *a;
        b.micro_batch_size = s.rows[k].micro_batch_size;
        b.model.sequence_parallel = s.rows[k].sequence_parallel;
        b.zero_stage = s.rows[k].zero_stage;
        print_layout_line(&b, &s.rows[k].plan);
    }
    free(s.rows);
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
// --checkpoint-activations), so the plan shows what each would cost and save; or the reason the
// trainer would refuse it (--pipeline-schedule zb-h1 with full recomputation)
static void print_recomputation_alternative(const Config* a, const Hardware* hw, int method, int core, const char* label) {
    Config other = *a;
    // the run flags as this form's own would leave them (pipeline_schedule_error reads them), and the model's fields
    other.checkpoint_activations = other.recompute_activations = 0;
    other.recompute_granularity = method != RECOMPUTE_NONE ? GRANULARITY_FULL : core ? GRANULARITY_SELECTIVE : GRANULARITY_NONE;
    other.recompute_method = method;
    other.recompute_num_layers = method != RECOMPUTE_NONE ? 1 : 0;
    other.model.recompute_method = method;
    other.model.recompute_num_layers = 1;
    other.model.recompute_attention_core = core;
    char err[512];
    if (layout_error(&other, err, sizeof err)) {
        printf("%s: refused (%s)\n", label, err);
        return;
    }
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
    double tokens = (double)a->global_batch_size * a->model.seq_length, gpus = (double)L->tp * L->cp * L->pp * L->dp;
    double model_flops = flops_per_step(&a->model, a->global_batch_size, 0, 0);
    int digits = hw->cpu_threads > 0.0 ? 3 : 0;   // a CPU's peak is a fraction of a TFLOP/s
    printf("throughput: %.0f tokens per second (%.0f per GPU); model FLOPs utilization %.1f%% of %.*f TFLOP/s (%.*f TFLOPs "
           "per GPU without recomputation)\n", tokens / L->step_seconds, tokens / L->step_seconds / gpus,
           100.0 * model_flops / L->step_seconds / gpus / (1e12 * hw->peak_tflops), digits, hw->peak_tflops, digits + 1,
           model_flops / L->step_seconds / gpus / 1e12);
}

// With context parallelism, what a layer's micro-batch exchanges (cost.h's cost_layer_attention):
// its block of keys and values (stage 0's tensor rank 0's, as the plan's rows), and with p2p
// the block attention each ring step's transfers run beside, and how much of the ring it hides
static void print_context_parallel_exchange(const Config* a, const StageCost* slowest, int stage) {
    int CP = a->context_parallel_size;
    GPT m;
    plan_stage_model(&m, a, 0, a->tensor_model_parallel_size, data_parallel_size(a));
    double block = (double)kv_block_elems(&m.context) * m.build.floatx_bytes, sums = (double)kv_block_elems(&m.context) * 4.0;
    gpt_free_plan(&m);
    if (a->cp_comm_type == CP_COMM_ALL_GATHER) {
        printf("context parallelism, --cp-comm-type all_gather over CP %d: a layer's micro-batch all-gathers the %d blocks "
               "of keys and values (%.0f bytes each) in the forward and again in the backward, and reduce-scatters their "
               "fp32 gradients (%.0f bytes a block): it sends %.0f bytes, beside no compute\n", CP, CP, block, sums,
               (CP - 1.0) * (2.0 * block + sums));
        return;
    }
    printf("context parallelism, --cp-comm-type p2p, a ring of CP %d: a layer's micro-batch sends %d block(s) of keys and "
           "values (%.0f bytes each) in the forward, %d again and %d fp32 partial sums of their gradients (%.0f bytes each) "
           "in the backward; each transfer beside one ring step's block attention (%.6g ms forward, %.6g ms backward) on "
           "stage %d: the ring takes %.6g ms a step, %.6g ms of them hidden\n", CP, CP - 1, block, CP - 1, CP, sums,
           1e3 * slowest->ring_step[0], 1e3 * slowest->ring_step[1], stage, 1e3 * slowest->ring_total,
           1e3 * slowest->ring_hidden);
}

// A layout above the memory: the smallest context-parallel size of the same world, TP and PP (DP
// the rest) that the trainer accepts (2 CP chunks of every sequence, the batch over DP) and whose
// plan fits, or that none does: context parallelism divides a rank's activations by CP
static void print_context_parallel_fit(const Config* a, const Hardware* hw) {
    int W = layout_world_size(a), TP = a->tensor_model_parallel_size, PP = a->pipeline_model_parallel_size;
    Config other = *a;
    char err[512], label[256], layout[96];
    for (int cp = a->context_parallel_size + 1; cp <= W / (TP * PP); cp++) {
        other.context_parallel_size = cp;
        if (W % (TP * cp * PP) != 0 || layout_error(&other, err, sizeof err)) continue;
        LayoutPlan L = plan_layout(&other, hw, NULL);
        if (L.out_of_memory) continue;
        snprintf(label, sizeof label, "the smallest context parallelism that fits: --context-parallel-size %d (%s)", cp,
                 layout_name(layout, sizeof layout, TP, cp, PP, W / (TP * cp * PP)));
        print_plan_summary(label, &L);
        return;
    }
    printf("context parallelism: no --context-parallel-size above %d fits world %d at TP %d and PP %d (CP must divide "
           "the world over TP x PP, and --seq-length %d into 2 CP chunks)\n", a->context_parallel_size, W, TP, PP,
           a->model.seq_length);
}

// A MoE layer's multiply-adds a token in its MLP's place, as config.h's mlp_multiply_adds counts
// the active ones (the router's h E, k experts', the shared expert's and its gate's), and with all
// E experts: what the model holds against what a token uses
static void moe_layer_multiply_adds(const GPTConfig* c, double* active, double* all) {
    double h = c->hidden_size, glu = c->swiglu ? 3.0 : 2.0, expert = glu * h * c->moe_ffn_hidden_size;
    double shared = c->moe_shared_expert_intermediate_size ? glu * h * c->moe_shared_expert_intermediate_size + h : 0.0;
    *active = h * c->num_experts + c->moe_router_topk * expert + shared;
    *all = h * c->num_experts + c->num_experts * expert + shared;
}

// The dry run's lines on a mixture of experts: the FLOPs it counts (the active parameters), the
// rows its experts are priced on (the busiest rank's, --moe-imbalance), and with expert
// parallelism the all-to-alls and the memory the plan assumes (expert_parallel_memory)
static void print_experts_plan(const Config* a, const LayoutPlan* L) {
    const GPTConfig* c = &a->model;
    int E = c->num_experts, k = c->moe_router_topk, EP = L->ep, moe_layers = 0;
    double active, all, X = expert_layout_of(a).imbalance;
    for (int l = 0; l < c->num_layers; l++) moe_layers += is_moe_layer(c, l);
    moe_layer_multiply_adds(c, &active, &all);
    GPT m;
    plan_stage_model(&m, a, 0, L->tp, L->dp);
    double N = (double)m.B * m.T, C = c->hidden_size, x = m.build.floatx_bytes, mean = EP * N * k / E;
    printf("mixture of experts: %d MoE layer(s) of %d (--moe-layer-freq %d), %d experts, each token to %d: the model FLOPs "
           "count a MoE layer's active parameters alone, %.4g multiply-adds a token in its MLP's place (the router's, %d "
           "experts'%s) of the %.4g its experts hold (config.h mlp_multiply_adds)\n", moe_layers, c->num_layers,
           c->moe_layer_freq, E, k, active, k, c->moe_shared_expert_intermediate_size ? ", the shared expert's" : "", all);
    printf("  the experts priced expert by expert on the rank that holds the busiest: %d expert(s) a rank, %.6g rows each "
           "at balance (EP x N k / E, N = %.0f tokens a micro-batch), the busiest at --moe-imbalance %.3g x that (the "
           "others %.6g each); a run logs its own as \"expert tokens max/mean\", which --moe-imbalance takes back\n",
           E / EP, mean, N, X, E > 1 ? (E - X) / (E - 1.0) * mean : 0.0);
    if (EP > 1) {
        double sent = (EP - 1.0) / EP * N * k * C * x, rows = expert_receive_rows(&m);
        int edp = L->dp * L->cp / EP;
        printf("  expert parallelism: EP %d of the DP x CP %d ranks, each holding %d of the %d experts of a MoE layer, "
               "their gradients and optimizer state sharded over the expert-data-parallel group of %d rank(s) (DP x CP / "
               "EP), the dense parameters' over DP x CP; a MoE layer's micro-batch sends 5 all-to-alls (the dispatch and "
               "the combine, and in the backward the rows again, the outputs' gradients and the inputs' back; 7 with the "
               "forward recomputed) of (EP - 1) / EP x N k rows of %d: %.0f bytes each a rank\n", EP, L->dp * L->cp, E / EP,
               E, edp, c->hidden_size, sent);
        const char* bound = c->moe_expert_capacity_factor > 0.0f
                                ? "each expert's capacity from each rank of its group (--moe-expert-capacity-factor)"
                                : "the dropless worst case, EP x N x min(k, E / EP) (each peer may send every token's "
                                  "choices of this rank's experts; a capacity factor bounds it)";
        printf("  memory: a rank's experts' parameters, gradients and optimizer state 1/EP of all of them (the state "
               "1/(DP x CP / EP) of those); the experts' rows of a MoE layer laid out at %s: %.0f rows of %d (%.1f MiB a "
               "layer and micro-batch), on stage 0 for %d layer(s) at once\n", bound, rows, c->hidden_size,
               rows * C * x / 1048576.0, kept_moe_layers(&m));
    }
    gpt_free_plan(&m);
}

// A layout above the memory, with experts: the smallest expert parallelism of the same TP, CP,
// PP and DP above the layout's (dividing the experts and DP x CP) whose plan fits, or that none
// does: EP divides the experts' parameters, gradients and optimizer state by EP
static void print_expert_parallel_fit(const Config* a, const Hardware* hw) {
    int ranks = data_parallel_size(a) * a->context_parallel_size, E = a->model.num_experts;
    Config other = *a;
    char err[512], label[160];
    for (int ep = a->expert_model_parallel_size + 1; ep <= ranks && ep <= E; ep++) {
        other.expert_model_parallel_size = ep;
        if (ranks % ep != 0 || E % ep != 0 || layout_error(&other, err, sizeof err)) continue;
        LayoutPlan L = plan_layout(&other, hw, NULL);
        if (L.out_of_memory) continue;
        snprintf(label, sizeof label, "the smallest expert parallelism that fits: --expert-model-parallel-size %d", ep);
        print_plan_summary(label, &L);
        return;
    }
    printf("expert parallelism: no --expert-model-parallel-size above %d fits (EP must divide DP x CP = %d and the %d "
           "experts)\n", a->expert_model_parallel_size, ranks, E);
}

// the precision of the build --dry-run-build plans: the GPU build's 16-bit type (fp16 with --fp16,
// train_gpu_fp16's; else bf16, train_gpu's) over fp32 master weights; the CPU build's fp32
static const char* planned_precision(const Config* a) {
    if (!plans_gpu_build(a)) return "fp32";
    return a->fp16 ? "fp16 (fp32 master weights, fp32 grads)" : "bf16 (fp32 master weights, fp32 grads)";
}

// The dry run's first lines: the build and the layout planned, the model, the attention, and
// which rank of each stage the memory lines describe
static void print_dry_run_layout(const Config* a) {
    int TP = a->tensor_model_parallel_size, CP = a->context_parallel_size, PP = a->pipeline_model_parallel_size;
    int DP = data_parallel_size(a);
    char layout[96];
    char ep[48] = "";
    if (a->expert_model_parallel_size > 1) snprintf(ep, sizeof ep, ", EP %d of the DP x CP ranks", a->expert_model_parallel_size);
    printf("dry run: gridgpt %s build planned (--dry-run-build), %s, world %d as %s%s: nothing allocated, no step run\n",
           plans_gpu_build(a) ? "GPU" : "CPU", planned_precision(a), layout_world_size(a),
           layout_name(layout, sizeof layout, TP, CP, PP, DP), ep);
    print_model(&a->model);
    print_attention(a, plans_gpu_build(a));
    if (a->expert_model_parallel_size > 1)   // (the experts' TP is not built: TP 1 with experts)
        printf("each stage as its %sdata rank 0 holds it (its other ranks hold the same sizes: another %d of the %d "
               "experts of a MoE layer, another ZeRO shard%s)\n", CP > 1 ? "context rank 0, " : "",
               a->model.num_experts / a->expert_model_parallel_size, a->model.num_experts,
               CP > 1 ? ", the sequences' other chunks" : "");
    else if (CP == 1)
        printf("each stage as its tensor rank 0, data rank 0 holds it (its other ranks hold the same sizes: another slice "
               "of the vocabulary, the matrices and the ZeRO shard)\n");
    else
        printf("each stage as its tensor rank 0, context rank 0, data rank 0 holds it (its other ranks hold the same sizes: "
               "another slice of the vocabulary, the matrices, the sequences' chunks (%d rows of each sequence's %d) and the "
               "ZeRO shard, over DP x CP = %d)\n", a->model.seq_length / CP, a->model.seq_length, DP * CP);
}

// The dry run's memory lines: each stage's bytes as the trainer would allocate them
// (plan_stage_memory), the model state a parameter, one layer's activations
static void print_dry_run_memory(const Config* a) {
    int TP = a->tensor_model_parallel_size, PP = a->pipeline_model_parallel_size, DP = data_parallel_size(a);
    for (int p = 0; p < PP; p++) {
        StageMemory s = plan_stage_memory(a, p, TP, DP);
        if (p == 0) print_memory_header();
        print_memory_row("planned", &s, 1);
        if (p == PP - 1 && a->expert_model_parallel_size == 1)   // (EP's: print_experts_plan)
            print_model_state_bytes(&s, DP * a->context_parallel_size);
    }
    print_layer_activations(a);
}

// --dry-run: the layout of --world-size ranks (or the launched ones) planned stage by stage on
// one rank: what each would allocate (the trainer's own numbers: plan_stage_memory), the model
// FLOPs of a step, the bubble, what each group sends, the cost model's step on --hw, and a
// last line in a fixed form. Every check of the flags has passed; nothing large is allocated,
// no group built, no data read, no step run.
static void dry_run_report(const Config* a) {
    int CP = a->context_parallel_size, PP = a->pipeline_model_parallel_size;
    int DP = data_parallel_size(a), micro = a->global_batch_size / (a->micro_batch_size * DP);
    print_dry_run_layout(a);
    print_dry_run_memory(a);
    double flops = flops_per_step(&a->model, a->global_batch_size, recomputed_layers(a),
                                  recomputed_attention_cores(a, runs_flash_attention(a, plans_gpu_build(a))));
    Hardware hw = hardware_of(a);
    StageCost* slowest = (StageCost*)mallocCheck(sizeof(StageCost));
    LayoutPlan L = plan_layout(a, &hw, slowest);
    printf("model FLOPs per step: %.4g (global batch %d; Narayanan et al. 2021, recomputation included%s)\n", flops,
           a->global_batch_size, a->model.num_experts > 0 ? "; a MoE layer's active parameters alone" : "");
    if (a->pipeline_schedule == SCHEDULE_ZB_H1) {
        double f = L.fbw[0], b = L.fbw[1], w = L.fbw[2], idle = (PP - 1) * (f + b - w);
        printf("ZB-H1 bubble: its walk placed with a layer's F : B : W = 1 : %.3f : %.3f (W: the weight gradients' GEMMs, "
               "%.1f%% of the backward) = %.1f%% of the step; Qi et al.'s (p - 1)(F + B - W) / (m (F + B + W) + (p - 1)(F + B "
               "- W)) = %.1f%%; 1F1B's (p - 1) / (m + p - 1) = %.1f%%, m = %d micro-batches per pipeline\n", b / f, w / f,
               100.0 * w / (b + w), 100.0 * L.bubble, 100.0 * idle / (micro * (f + b + w) + idle),
               100.0 * (PP - 1) / (micro + PP - 1), micro);
    } else if (L.vp == 1)
        printf("%s bubble: (p - 1) / (m + p - 1) = %d / %d = %.1f%% of the step, m = %d micro-batches per pipeline%s\n",
               a->pipeline_schedule == SCHEDULE_GPIPE ? "GPipe" : "1F1B", PP - 1, micro + PP - 1, 100.0 * L.bubble, micro,
               a->pipeline_schedule == SCHEDULE_GPIPE ? " (1F1B's, but each stage holds all m micro-batches)" : "");
    else
        printf("interleaved 1F1B bubble: (p - 1) / (v m + p - 1) = %d / %d = %.1f%% of the step, m = %d micro-batches per "
               "pipeline, v = %d model chunks per stage (Narayanan et al. 2021, §2.2.1); the pipeline sends v times plain "
               "1F1B's messages\n", PP - 1, L.vp * micro + PP - 1, 100.0 * L.bubble, micro, L.vp);
    if (a->print_schedule) draw_schedule(a, micro);
    print_comm(L.bytes_sent);
    print_hardware(a, &hw);
    print_stage_costs(slowest, L.slowest_stage, micro);
    printf("GEMMs only (the cuBLAS rows): %.6g ms of stage %d's step\n", 1e3 * gemm_only_seconds(slowest), L.slowest_stage);
    if (a->pipeline_schedule == SCHEDULE_ZB_H1)
        printf("step = m / (1 - the bubble) x the slowest stage's micro-batch + the slowest optimizer step = %.4g x %.4g s + "
               "%.4g s\n", micro / (1.0 - L.bubble), L.slot_seconds, L.optimizer_seconds);
    else if (L.vp == 1)
        printf("step = (m + p - 1) x the slowest stage's micro-batch + the slowest optimizer step = %d x %.4g s + %.4g s\n",
               micro + PP - 1, L.slot_seconds, L.optimizer_seconds);
    else
        printf("step = (m + (p - 1) / v) x the slowest stage's micro-batch + the slowest optimizer step = %.4g x %.4g s + "
               "%.4g s\n", micro + (PP - 1.0) / L.vp, L.slot_seconds, L.optimizer_seconds);
    if (a->overlap_grad_reduce && DP * CP > 1)
        printf("--overlap-grad-reduce on stage %d: its bucketed reduces take %.3f ms, %.3f ms of them hidden behind the "
               "last micro-batch's backward\n", L.slowest_stage, 1e3 * slowest->reduce_total, 1e3 * slowest->reduce_hidden);
    if (a->overlap_param_gather && DP * CP > 1)
        printf("--overlap-param-gather on stage %d: its bucketed broadcasts take %.3f ms, %.3f ms of them hidden behind the "
               "next step's first forward\n", L.slowest_stage, 1e3 * slowest->gather_total, 1e3 * slowest->gather_hidden);
    if (CP > 1) print_context_parallel_exchange(a, slowest, L.slowest_stage);
    if (a->model.num_experts > 0) print_experts_plan(a, &L);
    print_recomputation_alternatives(a, &hw);
    print_interleaving_alternative(a, &hw);
    print_sequence_parallel_alternative(a, &hw);
    print_throughput(a, &hw, &L);
    if (L.out_of_memory)
        printf("does not fit: %.1f GiB of ours + %.1f GiB left to CUDA, cuBLAS and NCCL > %.1f GiB\n",
               L.peak_bytes / (1 << 30), hw.reserve_gib, hw.memory_gib);
    if (L.out_of_memory) print_context_parallel_fit(a, &hw);
    if (L.out_of_memory && a->model.num_experts > 0) print_expert_parallel_fit(a, &hw);
    free(slowest);
    print_layout_line(a, &L);
}

static void dry_run_and_exit(Config* a) {
    set_padded_vocab_size(a);
    Hardware hw = hardware_of(a);
    char name[32];
    int E = a->model.num_experts, k = a->model.moe_router_topk;
    if (a->moe_imbalance > 0.0f && (E == 0 || a->moe_imbalance < 1.0f || a->moe_imbalance > (double)E / k))
        config_error("--moe-imbalance %g: the busiest expert's tokens over the mean are 1 (balanced) to E / k = %d / %d "
                     "(each token's k choices, one to the busiest)%s", a->moe_imbalance, E, k,
                     E == 0 ? ", and this model has no experts (--num-experts)" : "");
    if (plans_gpu_build(a) && a->attention_backend == ATTENTION_FLASH && hw.attention_efficiency <= 0.0)
        config_error("--attention-backend flash: --hw %s's GPU has no fused attention kernels (they need sm_80: cp.async, "
                     "mma.sync.m16n8k16)", hw_name(a, name, sizeof name));
    if (grid.world_rank == 0 && a->sweep) dry_run_sweep(a, &hw);
    if (grid.world_rank == 0 && !a->sweep) dry_run_report(a);
    fflush(stdout);
    grid_finish();
    exit(0);
}
