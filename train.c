/*
train.c — the gridgpt trainer: the configuration and its flags, setup, the training loop,
schedules, logging (its scalars go to tensorboard.h), evaluation, sampling; checkpoints and
the Hugging Face export are called from checkpoint.h.

One source, two builds: gcc compiles it with the plain-C kernels and MPI (train_cpu); nvcc
compiles it as CUDA with cuBLAS and NCCL (train_gpu). Flags, log lines and files are the
same in both, and follow Megatron-LM's names so that its users feel at home.

Reading order: configuration -> config checks -> schedules -> data -> the trainer -> setup ->
step -> log -> sampling -> the run -> main.
*/
#include "data.c"
#include "kernels.cuh"
#include "parallel.h"
#include "gpt.h"
#include "step.h"
#include "cluster.h"
#include "checkpoint.h"
#include "tensorboard.h"
#include <signal.h>
#include <sys/resource.h>

// ----------------------------------------------------------------------------
// the configuration: the model's fields (gpt.h's list) and the run's, each declared once
// X(kind, name, default, min, help), as gpt.h's list without its checkpoint columns. The
// Config struct, the flags (Megatron-LM's names and defaults; where Megatron has no default,
// a small model), --help and the range checks walk both lists.

#define RUN_CONFIG_FIELDS(X)                                                                                          \
    X(INT, tensor_model_parallel_size, "1", 1, "TP: tensor-parallel ranks of one model replica")                      \
    X(INT, pipeline_model_parallel_size, "1", 1, "PP: pipeline stages")                                                \
    X(CHOICE, pp_partition_method, "uniform", 0, "uniform | type:transformer | type:transformer|embedding")            \
    X(INT, decoder_first_pipeline_num_layers, NULL, 0, "layers of the first stage (0: not set)")                      \
    X(INT, decoder_last_pipeline_num_layers, NULL, 0, "layers of the last stage (0: not set)")                        \
    X(INT, micro_batch_size, "4", 1, "samples per micro-batch")                                                        \
    X(INT, global_batch_size, NULL, 0, "samples per step (0: micro-batch x DP)")                                       \
    X(INT3, rampup_batch_size, NULL, 0, "START INCREMENT SAMPLES: ramp the global batch up")                           \
    X(SWITCH, checkpoint_activations, NULL, 0, "= --recompute-granularity full --recompute-method uniform")            \
    X(CHOICE, recompute_granularity, "none", 0, "none | full | selective (selective: not implemented)")                \
    X(CHOICE, recompute_method, "none", 0, "none | uniform | block (which layers: see --recompute-num-layers)")        \
    X(INT, recompute_num_layers, NULL, 1, "N: uniform: layers per chunk; block: first N layers of a stage (1)")        \
    X(CHOICE, attention_backend, "auto", 0, "auto | flash | unfused (GPU build; auto: flash where the head size allows)") \
    X(SWITCH, overlap_grad_reduce, NULL, 0, "reduce the DP gradients in buckets during the last backward (DP > 1)")  \
    X(SWITCH, overlap_param_gather, NULL, 0, "all-gather the updated parameters in buckets beside the next forward (DP > 1)") \
    X(LONG, ddp_bucket_size, NULL, 0, "elements per --overlap-grad-reduce/-param-gather bucket (0: max(40M, 1M x DP))") \
    X(SWITCH, no_overlap_p2p_communication, NULL, 0, "pipeline exchanges on the compute stream (GPU build; default: their own)") \
    X(INT, train_iters, NULL, 0, "steps to train (0 with --save: save the initial model)")                            \
    X(LONG, train_samples, NULL, 0, "samples to train (instead of --train-iters)")                                     \
    X(FLOAT, lr, "1e-4", 0, "peak learning rate")                                                                      \
    X(FLOAT, min_lr, NULL, 0, "final learning rate")                                                                   \
    X(CHOICE, lr_decay_style, "linear", 0, "constant | linear | cosine | inverse-square-root")                         \
    X(LONG, lr_warmup_samples, NULL, 0, "warm-up length in samples")                                                   \
    X(INT, lr_warmup_iters, NULL, 0, "warm-up length in steps")                                                        \
    X(FLOAT, lr_warmup_fraction, NULL, 0, "warm-up as a fraction of the decay length")                                 \
    X(LONG, lr_decay_samples, NULL, 0, "decay length in samples (0: the train samples)")                               \
    X(INT, lr_decay_iters, NULL, 0, "decay length in steps (0: the train iters)")                                      \
    X(FLOAT, adam_beta1, "0.9", 0, "Adam's first-moment decay")                                                        \
    X(FLOAT, adam_beta2, "0.999", 0, "Adam's second-moment decay")                                                     \
    X(FLOAT, adam_eps, "1e-8", 0, "Adam's epsilon")                                                                    \
    X(FLOAT, weight_decay, "0.01", 0, "decoupled decay of matrices and embeddings")                                    \
    X(FLOAT, clip_grad, "1.0", 0, "clip the global gradient norm to this (0: off)")                                    \
    X(SWITCH, fp16, NULL, 0, "fp16 with loss scaling (GPU: train_gpu_fp16; CPU: the scaler on fp32)")                 \
    X(SWITCH, bf16, NULL, 0, "bf16 weights and activations (the GPU build's own precision)")                          \
    X(FLOAT, loss_scale, NULL, 0, "static loss scale with --fp16 (0: dynamic)")                                        \
    X(FLOAT, initial_loss_scale, "4294967296", 1, "the dynamic scale's start")                                         \
    X(FLOAT, min_loss_scale, "1", 0, "the dynamic scale's floor")                                                      \
    X(INT, loss_scale_window, "1000", 1, "clean steps before the dynamic scale doubles")                               \
    X(INT, hysteresis, "2", 1, "overflows tolerated before the dynamic scale halves")                                  \
    X(LIST, data_path, NULL, 0, "[WEIGHT] PREFIX [...]: Megatron .bin/.idx dataset(s)")                                \
    X(STRING, split, "969,30,1", 0, "train,valid,test document split")                                                 \
    X(STRING, data_cache_path, NULL, 0, "DIR for the sample-index cache (default: next to the data)")                  \
    X(INT, eval_interval, "1000", 1, "steps between evaluations")                                                      \
    X(INT, eval_iters, "100", 0, "global batches per evaluation")                                                      \
    X(SWITCH, unigram_baseline, NULL, 0, "report the data's order-0 entropy next to the loss")                         \
    X(INT, log_interval, "100", 1, "steps between log lines")                                                          \
    X(SWITCH, log_comm, NULL, 0, "log the bytes each group's communication sent per step")                             \
    X(SWITCH, log_memory_bytes, NULL, 0, "print the memory table in bytes too, with what dev_malloc handed out")       \
    X(INT, watchdog_timeout, "600", 0, "end the job, saying where every rank is, after S s without progress (0: off)") \
    X(INT, watchdog_io_timeout, "3600", 1, "the watchdog's S while a checkpoint is saved or loaded (a slow fsync)")     \
    X(FLOAT, slow_rank_threshold, "1.5", 0, "name a rank computing this many times its stage's median (0: off)")       \
    X(STRING, tensorboard_dir, NULL, 0, "DIR: write the log line's values as TensorBoard events here")                 \
    X(STRING, save, NULL, 0, "DIR: save checkpoints here")                                                             \
    X(STRING, load, NULL, 0, "DIR: resume from its latest checkpoint (any layout)")                                    \
    X(INT, save_interval, NULL, 0, "steps between checkpoints (0: only at the end)")                                   \
    X(INT, exit_interval, NULL, 0, "save and exit when the iteration is a multiple of this")                           \
    X(INT, exit_duration_in_mins, NULL, 0, "save and exit after this many minutes")                                    \
    X(INT, keep_last, NULL, 0, "keep only the newest N checkpoints (0: all)")                                          \
    X(SWITCH, no_load_optim, NULL, 0, "load weights and counters, not the optimizer state")                            \
    X(SWITCH, no_load_rng, NULL, 0, "use this run's --seed, not the checkpoint's")                                     \
    X(SWITCH, finetune, NULL, 0, "load weights only; iteration and data position start at 0")                          \
    X(STRING, export_hf, NULL, 0, "OUT: write --load's latest checkpoint as a Hugging Face model, then exit")          \
    X(CHOICE, export_hf_architecture, "auto", 0, "auto | gpt2 | bloom (auto: bloom for ALiBi models)")                \
    X(INT, generate_tokens, NULL, 0, "sample this many tokens after training")                                         \
    X(STRING, generate_prompt, NULL, 0, "text the sample starts from (byte-level data)")                               \
    X(FLOAT, temperature, "1.0", 0, "sampling temperature")                                                            \
    X(SWITCH, check_cluster, NULL, 0, "measure bus bandwidths and matmuls, name outliers (no --data-path: only that)") \
    X(LIST, check_cluster_sizes, NULL, 0, "MIB [...]: --check-cluster's message sizes (default 1 16 64)")              \
    X(INT, check_cluster_matmul_size, NULL, 0, "N of --check-cluster's N x N matmul (0: 8192 GPU, 1024 CPU)")          \
    X(SWITCH, dry_run, NULL, 0, "plan this layout: each stage's memory, the FLOPs, the bubble; allocate nothing")      \
    X(INT, world_size, NULL, 0, "N: the world size --dry-run plans for (0: the launched size)")                        \
    X(SWITCH, sweep, NULL, 0, "with --dry-run: every (TP, PP, DP, MBS) of the world, fastest first")                 \
    X(CHOICE, hw, NULL, 0, "v100-32gb | a100-40gb | a100-80gb | h100-80gb (default a100-80gb): the dry run's GPU")   \
    X(FLOAT, hw_peak_tflops, NULL, 0, "dense fp16/bf16 peak, TFLOP/s (0: --hw's)")                                      \
    X(FLOAT, hw_matmul_efficiency, NULL, 0, "the fraction of the peak matmuls reach (0: --hw's)")                       \
    X(FLOAT, hw_memory_gib, NULL, 0, "GPU memory, GiB (0: --hw's)")                                                     \
    X(FLOAT, hw_memory_bandwidth, NULL, 0, "GPU memory bandwidth, GB/s (0: --hw's)")                                    \
    X(FLOAT, hw_nvlink_bandwidth, NULL, 0, "GB/s per GPU and direction inside a node (0: --hw's)")                     \
    X(FLOAT, hw_internode_bandwidth, NULL, 0, "GB/s per GPU and direction between nodes (0: --hw's)")                  \
    X(INT, hw_gpus_per_node, NULL, 0, "GPUs per node (0: --hw's)")                                                      \
    X(FLOAT, hw_latency_us, NULL, 0, "microseconds per message: a ring step or a send (0: --hw's)")                    \
    X(FLOAT, hw_reserve_gib, NULL, 0, "GiB per GPU left to CUDA, cuBLAS and NCCL (0: --hw's)")                          \
    X(CHOICE, dry_run_build, NULL, 0, "gpu | cpu (default gpu): the build --dry-run plans, whichever binary runs it")  \
    X(SWITCH, help, NULL, 0, "print this list")                                                                   \
    X(SWITCH, help_markdown, NULL, 0, "print this list as Markdown tables: docs/flags.md")

typedef enum { LR_CONSTANT, LR_LINEAR, LR_COSINE, LR_INVERSE_SQRT } LRDecayStyle;   // in --lr-decay-style's order
typedef enum { PARTITION_UNIFORM, PARTITION_TRANSFORMER, PARTITION_TRANSFORMER_EMBEDDING } PartitionMethod;   // --pp-partition-method
typedef enum { GRANULARITY_NONE, GRANULARITY_FULL, GRANULARITY_SELECTIVE } RecomputeGranularity;   // --recompute-granularity
typedef enum { PLAN_GPU_BUILD, PLAN_CPU_BUILD } DryRunBuild;   // --dry-run-build (-1, not given: the GPU build)
typedef enum { ATTENTION_AUTO, ATTENTION_FLASH, ATTENTION_UNFUSED } AttentionBackend;   // --attention-backend

typedef struct {
    GPTConfig model;
    RUN_CONFIG_FIELDS(DECLARE_FIELD)
} Config;

#define DESCRIBE_RUN_FIELD(kind, name, def, min, help) \
    {#name, def, help, NULL, NULL, FIELD_##kind, offsetof(Config, name), min, NOT_STORED},
static const ConfigField RUN_FIELDS[] = {RUN_CONFIG_FIELDS(DESCRIBE_RUN_FIELD)};
#define NUM_RUN_FIELDS ((int)(sizeof(RUN_FIELDS) / sizeof(RUN_FIELDS[0])))

// field k of both lists (model fields first), and where its value lives in c
static const ConfigField* config_field(Config* c, int k, void** base) {
    *base = k < NUM_MODEL_FIELDS ? (void*)&c->model : (void*)c;
    return k < NUM_MODEL_FIELDS ? &MODEL_FIELDS[k] : &RUN_FIELDS[k - NUM_MODEL_FIELDS];
}

static void set_defaults(Config* c) {
    memset(c, 0, sizeof(*c));
    char err[256];
    for (int k = 0; k < NUM_MODEL_FIELDS + NUM_RUN_FIELDS; k++) {
        void* base;
        const ConfigField* f = config_field(c, k, &base);
        if (f->default_value && parse_field(f, base, f->default_value, err, sizeof(err))) fail("a default: %s", err);
        if (!f->default_value && f->kind == FIELD_CHOICE) *(int*)field_in(f, base) = -1;   // -1: not given
    }
}

static void print_usage(Config* c) {
    printf("usage: train_cpu|train_gpu [flags]   (mpirun -np N for several ranks)\n");
    for (int k = 0; k < NUM_MODEL_FIELDS + NUM_RUN_FIELDS; k++) {
        void* base;
        const ConfigField* f = config_field(c, k, &base);
        char flag[96];
        printf("  %-32s %s", flag_of(f, flag, sizeof(flag)), f->help);
        if (f->default_value) printf(" (%s)", f->default_value);
        printf("\n");
    }
}

// --help-markdown: docs/flags.md, which is this output (make docs writes it; test_cli fails
// when the two differ, so the reference cannot drift from the fields)
static void print_markdown_cell(const char* text) {
    for (; *text; text++) printf(*text == '|' ? "\\|" : "%c", *text);
}

static void print_usage_markdown(Config* c) {
    static const char* const VALUE[] = {"integer", "integer", "number", "switch", "choice", "text", "3 integers", "list"};
    printf("# Flags\n\nEvery flag of `train_cpu` and `train_gpu`, generated by `./train_cpu --help-markdown` from the "
           "two field lists (`GPT_CONFIG_FIELDS` in `gpt.h`, `RUN_CONFIG_FIELDS` in `train.c`): do not edit it by hand; "
           "`make docs` writes it, and `make test` fails when it differs. How flags are declared and checked, and the "
           "flags by topic: [config.md](config.md).\n");
    for (int k = 0; k < NUM_MODEL_FIELDS + NUM_RUN_FIELDS; k++) {
        if (k == 0 || k == NUM_MODEL_FIELDS)
            printf("\n## %s\n\n| flag | value | default | minimum | meaning |\n| --- | --- | --- | --- | --- |\n",
                   k == 0 ? "The model (`gpt.h`, stored in checkpoints)" : "The run (`train.c`)");
        void* base;
        const ConfigField* f = config_field(c, k, &base);
        char flag[96];
        int numeric = f->kind == FIELD_INT || f->kind == FIELD_LONG || f->kind == FIELD_FLOAT;
        printf("| `%s` | %s", flag_of(f, flag, sizeof(flag)), VALUE[f->kind]);
        printf(f->kind == FIELD_LIST ? " (at most %d values) | " : " | ", MAX_LIST);
        print_markdown_cell(f->default_value ? f->default_value : f->kind == FIELD_SWITCH ? "off" : numeric ? "0" : "");
        printf(numeric ? " | %g | " : " | | ", f->min);
        print_markdown_cell(f->help);
        printf(" |\n");
    }
}

// The parsers below move *i to the last index of argv they used and return 0, or 1 with the
// error line in err (a rank's flags may differ from the others': the caller of parse_flags
// settles the verdict with every rank).

// the values of a list flag at argv[*i + 1 ...]: every one up to the next flag
static int parse_list(const ConfigField* f, void* base, int argc, char** argv, int* i, char* err, size_t len) {
    StringList* list = (StringList*)field_in(f, base);
    const char* flag = argv[*i];
    list->count = 0;
    for (; *i + 1 < argc && strncmp(argv[*i + 1], "--", 2) != 0; ++*i) {
        if (list->count == MAX_LIST) return error_line(err, len, "%s takes at most %d values", flag, MAX_LIST);
        list->v[list->count++] = argv[*i + 1];
    }
    return 0;
}

// the flag at argv[*i] and its values
static int parse_flag(Config* c, int argc, char** argv, int* i, char* err, size_t len) {
    char name[96];
    const char* flag = argv[*i];
    void* base = NULL;
    const ConfigField* f = NULL;
    for (int k = 0; k < NUM_MODEL_FIELDS + NUM_RUN_FIELDS && !f; k++) {
        const ConfigField* candidate = config_field(c, k, &base);
        if (strcmp(flag, flag_of(candidate, name, sizeof(name))) == 0) f = candidate;
    }
    if (!f) return error_line(err, len, "unknown flag '%s' (see --help)", flag);
    if (f->kind == FIELD_SWITCH) {
        *(int*)field_in(f, base) = 1;
        return 0;
    }
    if (f->kind == FIELD_LIST) return parse_list(f, base, argc, argv, i, err, len);
    int values = f->kind == FIELD_INT3 ? 3 : 1;
    if (*i + values >= argc) return error_line(err, len, "%s expects %s", flag, values == 3 ? "three integers" : "a value");
    for (int k = 1; k <= values; k++) {
        ++*i;
        if (strncmp(argv[*i], "--", 2) == 0) return error_line(err, len, "%s expects a value, got the flag '%s'", flag, argv[*i]);
        ConfigField one = *f;   // a triple is three integers one after another
        if (f->kind == FIELD_INT3) {
            one.kind = FIELD_INT;
            one.offset += (k - 1) * sizeof(int);
        }
        if (parse_field(&one, base, argv[*i], err, len)) return 1;
    }
    return 0;
}

// every flag; "" in err, or the first bad flag's error line
static void parse_flags(Config* c, int argc, char** argv, char* err, size_t len) {
    err[0] = '\0';
    for (int i = 1; i < argc; i++)
        if (parse_flag(c, argc, argv, &i, err, len)) return;
}

// a digest of field k's value (a list or a triple value by value)
static uint64_t field_digest(Config* c, int k) {
    void* base;
    const ConfigField* f = config_field(c, k, &base);
    char text[64];
    uint64_t h = hash_name(format_field(f, base, text, sizeof(text)));
    if (f->kind == FIELD_INT3)
        for (int i = 0; i < 3; i++) h = splitmix64(h ^ (uint64_t)((IntTriple*)field_in(f, base))->v[i]);
    const StringList* list = (const StringList*)field_in(f, base);
    for (int i = 0; f->kind == FIELD_LIST && i < list->count; i++) h = splitmix64(h ^ hash_name(list->v[i]));
    return h;
}

// Every rank must run the same configuration: ranks started with different flags are one
// line naming the first flag that differs and two ranks that disagree, exit 2, on every rank
// (before any collective that depends on the configuration).
static void check_same_config_everywhere(Config* c) {
    int n = NUM_MODEL_FIELDS + NUM_RUN_FIELDS;
    uint64_t* mine = (uint64_t*)mallocCheck(n * sizeof(uint64_t));
    uint64_t* all = (uint64_t*)mallocCheck((size_t)n * grid.world_size * sizeof(uint64_t));
    for (int k = 0; k < n; k++) mine[k] = field_digest(c, k);
    all_gather_host(&grid.world, mine, all, n * sizeof(uint64_t));
    for (int k = 0; k < n; k++)
        for (int r = 1; r < grid.world_size; r++)
            if (all[(size_t)r * n + k] != all[k]) {
                void* base;
                char flag[96];
                config_error("ranks were started with different flags: %s differs between rank 0 and rank %d (every rank "
                             "must get the same flags)", flag_of(config_field(c, k, &base), flag, sizeof(flag)), r);
            }
    free(mine);
    free(all);
}

// ----------------------------------------------------------------------------
// config checks: every one before any allocation, one line each, exit status 2
// (each field's type and lower bound were checked as it was parsed)

// How many layers each pipeline stage holds (counts[p], p < PP); 0, or 1 with the flags' error in err.
//   uniform (the default): L / PP each, L a multiple of PP;
//   type:transformer (Megatron-DeepSpeed): the L layers spread as evenly as they go, the first
//     L mod PP stages taking one more (DeepSpeed's uniform partition of the counted layers);
//   type:transformer|embedding: the same for L + 2 slots, the word embedding on the first stage
//     and the tied output layer on the last counting as one layer each (BigScience's runs);
//   --decoder-first/last-pipeline-num-layers (Megatron-LM): the first / last stage that many,
//     the other layers evenly over the other stages.
static int stage_layer_counts(const Config* a, int* counts, char* err, size_t len) {
    int L = a->model.num_layers, PP = a->pipeline_model_parallel_size;
    int first = a->decoder_first_pipeline_num_layers, last = a->decoder_last_pipeline_num_layers;
    if ((first || last) && a->pp_partition_method != PARTITION_UNIFORM)
        return error_line(err, len, "give --pp-partition-method or --decoder-first/last-pipeline-num-layers, not both");
    if ((first || last) && PP == 1)
        return error_line(err, len, "--decoder-first/last-pipeline-num-layers need --pipeline-model-parallel-size > 1");
    if (first || last) {
        int rest = L - first - last, others = PP - (first > 0) - (last > 0);
        if (rest < 0 || (others == 0 && rest != 0) || (others > 0 && rest % others != 0))
            return error_line(err, len, "--num-layers %d minus --decoder-first-pipeline-num-layers %d and "
                              "--decoder-last-pipeline-num-layers %d leaves %d layers, which %d other stage(s) cannot "
                              "share evenly", L, first, last, rest, others);
        for (int p = 0; p < PP; p++) counts[p] = others ? rest / others : 0;
        if (first) counts[0] = first;
        if (last) counts[PP - 1] = last;
        return 0;
    }
    if (a->pp_partition_method == PARTITION_UNIFORM && L % PP != 0)
        return error_line(err, len, "--num-layers %d is not divisible by --pipeline-model-parallel-size %d (uneven stages: "
                          "--pp-partition-method, or --decoder-first/last-pipeline-num-layers)", L, PP);
    int embedding = a->pp_partition_method == PARTITION_TRANSFORMER_EMBEDDING, slots = L + 2 * embedding;
    if (slots < PP)
        return error_line(err, len, "--pp-partition-method %s: %d layer slot(s) for %d pipeline stages", embedding ?
                          "type:transformer|embedding" : "type:transformer", slots, PP);
    for (int p = 0; p < PP; p++)
        counts[p] = slots / PP + (p < slots % PP) - embedding * ((p == 0) + (p == PP - 1));
    return 0;
}

// the layers of each pipeline stage, malloc'd (the flags were checked by check_model)
static int* stage_layers(const Config* a) {
    int* counts = (int*)mallocCheck(a->pipeline_model_parallel_size * sizeof(int));
    char err[512];
    if (stage_layer_counts(a, counts, err, sizeof(err))) fail("%s", err);
    return counts;
}

// pipeline stage p of the layout
static PipelineStage pipeline_stage(const Config* a, int p) {
    int* counts = stage_layers(a);
    PipelineStage s = {p, a->pipeline_model_parallel_size, 0, counts[p]};
    for (int q = 0; q < p; q++) s.first_layer += counts[q];
    free(counts);
    return s;
}

static PipelineStage this_stage(const Config* a) { return pipeline_stage(a, grid.pp_rank); }

// whether any of --hw and --hw-* was given (each is 0, or -1 for --hw, when not)
static int hardware_given(const Config* a) {
    return a->hw >= 0 || a->hw_peak_tflops > 0.0f || a->hw_matmul_efficiency > 0.0f || a->hw_memory_gib > 0.0f ||
           a->hw_memory_bandwidth > 0.0f || a->hw_nvlink_bandwidth > 0.0f || a->hw_internode_bandwidth > 0.0f ||
           a->hw_gpus_per_node > 0 || a->hw_latency_us > 0.0f || a->hw_reserve_gib > 0.0f;
}

// the world the layout is for: --world-size (a dry run's), else the launched one
static int layout_world_size(const Config* a) { return a->world_size ? a->world_size : grid.world_size; }
static int data_parallel_size(const Config* a) {
    return layout_world_size(a) / (a->tensor_model_parallel_size * a->pipeline_model_parallel_size);
}

// The first reason the layout of `a` (TP, PP, the DP the world leaves, MBS) cannot run its
// model and batch, as the one line the trainer refuses it with; 0 if none. The trainer's checks
// refuse with it and --sweep passes over the layouts it names. TP x PP divides the world
// (check_grid); --ffn-hidden-size and --global-batch-size have their defaults.
static int layout_error(const Config* a, char* err, size_t len) {
    const GPTConfig* m = &a->model;
    int TP = a->tensor_model_parallel_size, PP = a->pipeline_model_parallel_size, dp = data_parallel_size(a);
    if (m->num_attention_heads % TP != 0)
        return error_line(err, len, "--num-attention-heads %d is not divisible by --tensor-model-parallel-size %d",
                          m->num_attention_heads, TP);
    if (m->ffn_hidden_size % TP != 0)
        return error_line(err, len, "--ffn-hidden-size %d is not divisible by --tensor-model-parallel-size %d",
                          m->ffn_hidden_size, TP);
    int* layers = (int*)mallocCheck(PP * sizeof(int)), most = 0;
    int bad = stage_layer_counts(a, layers, err, len);
    for (int p = 0; p < PP && !bad; p++) most = layers[p] > most ? layers[p] : most;
    free(layers);
    if (bad) return bad;
    int micro_batch_times_dp = a->micro_batch_size * dp;
    if (a->global_batch_size % micro_batch_times_dp != 0)
        return error_line(err, len, "--global-batch-size %d is not divisible by --micro-batch-size %d x data-parallel size %d",
                          a->global_batch_size, a->micro_batch_size, dp);
    const int* ramp = a->rampup_batch_size.v;   // START INCREMENT SAMPLES (the ramp's own shape: check_rampup)
    for (int g = ramp[0]; ramp[0] > 0 && ramp[1] > 0 && g <= a->global_batch_size; g += ramp[1])
        if (g % micro_batch_times_dp != 0)
            return error_line(err, len, "--rampup-batch-size: batch size %d on the ramp is not divisible by micro-batch %d x "
                              "data-parallel size %d", g, a->micro_batch_size, dp);
    if (a->recompute_num_layers > most)
        return error_line(err, len, "--recompute-num-layers %d is more layers than any pipeline stage holds (the largest: "
                          "%d of --num-layers %d over --pipeline-model-parallel-size %d)", a->recompute_num_layers, most,
                          m->num_layers, PP);
    return 0;
}

// the grid's flags against the world size; then every rank knows its coordinates (not in a
// dry run: its world is not the launched one)
static void check_grid(const Config* a) {
    int TP = a->tensor_model_parallel_size, PP = a->pipeline_model_parallel_size, W = layout_world_size(a);
    if (a->world_size && !a->dry_run && a->world_size != grid.world_size)
        config_error("--world-size %d, but the job has %d rank(s) (--world-size is for --dry-run)", a->world_size,
                     grid.world_size);
    if (W % (TP * PP) != 0 && !a->sweep)   // a sweep plans every layout of the world but this one
        config_error("world size %d is not a multiple of --tensor-model-parallel-size %d x --pipeline-model-parallel-size %d",
                     W, TP, PP);
    if (!a->dry_run) grid_place(TP, PP);
}

static void check_model(Config* a) {
    GPTConfig* m = &a->model;
    if (m->ffn_hidden_size == 0) m->ffn_hidden_size = 4 * m->hidden_size;
    if (m->max_position_embeddings == 0) m->max_position_embeddings = m->seq_length;
    if (m->hidden_size % m->num_attention_heads != 0)
        config_error("--hidden-size %d is not divisible by --num-attention-heads %d", m->hidden_size, m->num_attention_heads);
    if (m->seq_length > m->max_position_embeddings && m->position_embedding_type == POSITION_LEARNED_ABSOLUTE)
        config_error("--seq-length %d exceeds --max-position-embeddings %d", m->seq_length, m->max_position_embeddings);
    if (m->init_method_std <= 0.0f) config_error("--init-method-std must be positive, got %g", m->init_method_std);
    int head_size = m->hidden_size / m->num_attention_heads;
    if (a->attention_backend == ATTENTION_FLASH && !flash_attention_supports(head_size))
        config_error("--attention-backend flash needs a head size (--hidden-size / --num-attention-heads) that is a "
                     "multiple of 16 and at most %d, got %d (auto falls back to unfused there)", FLASH_HS_MAX, head_size);
    if (a->dry_run_build >= 0 && !a->dry_run)   // -1: not given
        config_error("--dry-run-build goes with --dry-run (a run allocates for its own build, %s)", BUILD_NAME);
    if (a->data_path.count == 0 && !a->dry_run)
        config_error("--data-path is required (a Megatron .bin/.idx prefix; ./preprocess makes one)");
    if (a->sweep && !a->dry_run) config_error("--sweep goes with --dry-run (it plans every layout of --world-size)");
    if (hardware_given(a) && !a->dry_run)
        config_error("--hw and --hw-* describe the cluster a --dry-run prices its step on: give --dry-run");
    if (a->sweep && a->global_batch_size == 0)
        config_error("--sweep needs --global-batch-size: the batch every layout is planned for");
    if (a->dry_run && m->vocab_size == 0)
        config_error("--dry-run reads no data: give --vocab-size (the data's largest token id + 1)");
    // parallel layout
    int TP = a->tensor_model_parallel_size, PP = a->pipeline_model_parallel_size;
    check_grid(a);
    if (a->global_batch_size == 0) a->global_batch_size = a->micro_batch_size * data_parallel_size(a);
    char err[512];
    if (!a->sweep && layout_error(a, err, sizeof(err))) config_error("%s", err);
    if (a->generate_tokens > 0 && TP * PP != 1)
        config_error("--generate-tokens samples on one model-parallel rank: it needs tensor and pipeline parallel size 1");
}

// --fp16 / --bf16 against what this binary computes in, and the loss scaler's flags
static void check_precision(const Config* a) {
    if (a->fp16 && a->bf16) config_error("give one of --fp16 and --bf16, not both");
#if defined(__CUDACC__) && !defined(GRIDGPT_FP16)
    if (a->fp16) config_error("--fp16: this binary computes in bf16; fp16 runs with train_gpu_fp16 (make gpu builds both)");
#endif
#ifdef GRIDGPT_FP16
    if (!a->fp16) config_error("this binary computes in fp16: give --fp16 (train_gpu computes in bf16)");
#endif
    if (!a->fp16 && a->loss_scale > 0.0f) config_error("--loss-scale %g goes with --fp16 (bf16 and fp32 need no loss scaling)", a->loss_scale);
    if (a->fp16 && a->min_loss_scale <= 0.0f) config_error("--min-loss-scale must be positive, got %g", a->min_loss_scale);
}

// the optimizer's loss scaler: with --fp16, static (--loss-scale) or dynamic; else none
static LossScaler make_loss_scaler(const Config* a) {
    LossScaler s = {1.0f, 0, 1.0f, 1, 1, 0, 0};
    if (!a->fp16) return s;
    s.dynamic = a->loss_scale == 0.0f;
    s.scale = s.dynamic ? a->initial_loss_scale : a->loss_scale;
    s.min_scale = a->min_loss_scale;
    s.window = a->loss_scale_window;
    s.hysteresis = s.hysteresis_tracker = a->hysteresis;
    return s;
}

// Activation recomputation as Megatron-LM asks for it: --recompute-granularity full, a
// --recompute-method and --recompute-num-layers N (1 if not given, as Megatron-LM had it and
// Megatron-DeepSpeed has it); or Megatron-DeepSpeed's --checkpoint-activations, which is full
// and uniform. N counts layers of one pipeline stage: more than the largest stage holds is
// refused (Megatron-LM's range); a stage with fewer recomputes them all in one chunk, and
// uniform lets the last chunk be shorter when N does not divide them, as Megatron-LM does.
// Writes the model's recompute_method and recompute_num_layers.
static void check_recompute(Config* a) {
    if (a->checkpoint_activations) {
        if (a->recompute_granularity == GRANULARITY_SELECTIVE || a->recompute_method == RECOMPUTE_BLOCK)
            config_error("--checkpoint-activations is --recompute-granularity full --recompute-method uniform: it cannot go "
                         "with --recompute-granularity selective or --recompute-method block");
        a->recompute_granularity = GRANULARITY_FULL;
        a->recompute_method = RECOMPUTE_UNIFORM;
    }
    if (a->recompute_granularity == GRANULARITY_SELECTIVE)
        config_error("--recompute-granularity selective (Megatron-LM's recomputation of the attention core alone) is not "
                     "implemented: use --recompute-granularity full with --recompute-method uniform or block");
    if (a->recompute_granularity == GRANULARITY_NONE && a->recompute_method != RECOMPUTE_NONE)
        config_error("--recompute-method needs --recompute-granularity full (as in Megatron-LM)");
    if (a->recompute_granularity == GRANULARITY_NONE && a->recompute_num_layers)
        config_error("--recompute-num-layers needs --recompute-granularity full and a --recompute-method (or "
                     "--checkpoint-activations)");
    if (a->recompute_granularity == GRANULARITY_FULL && a->recompute_method == RECOMPUTE_NONE)
        config_error("--recompute-granularity full needs --recompute-method uniform or block (as in Megatron-LM)");
    a->model.recompute_method = a->recompute_method;
    a->model.recompute_num_layers = a->recompute_num_layers ? a->recompute_num_layers : 1;
}

static void check_run(Config* a) {
    // length of training: iterations or samples, not both (Megatron's rule); 0 iterations
    // with --save writes the initial model
    int initial_only = a->train_iters == 0 && a->train_samples == 0 && a->save;
    if (a->train_iters == 0 && a->train_samples == 0 && !initial_only && !a->dry_run)
        config_error("the length of training is 0: give --train-iters or --train-samples a positive count "
                     "(--train-iters 0 with --save writes the initial model and stops)");
    if (a->train_iters > 0 && a->train_samples > 0)
        config_error("give one of --train-iters and --train-samples, not both");
    if (a->train_iters > 0 && (a->lr_warmup_samples || a->lr_decay_samples || a->rampup_batch_size.v[0]))
        config_error("--train-iters goes with --lr-warmup-iters / --lr-decay-iters and no --rampup-batch-size (use --train-samples)");
    if (a->train_samples > 0 && (a->lr_warmup_iters || a->lr_decay_iters))
        config_error("--train-samples goes with --lr-warmup-samples / --lr-decay-samples, not the -iters forms");
    if (a->lr_warmup_fraction != 0.0f && (a->lr_warmup_iters || a->lr_warmup_samples))
        config_error("give --lr-warmup-fraction or --lr-warmup-iters/--lr-warmup-samples, not both");
    if (a->min_lr > a->lr) config_error("--lr %g and --min-lr %g must satisfy 0 <= min-lr <= lr", a->lr, a->min_lr);
    if (a->adam_beta1 >= 1.0f || a->adam_beta2 >= 1.0f) config_error("--adam-beta1 and --adam-beta2 must be in [0, 1)");
    if (a->adam_eps <= 0.0f) config_error("--adam-eps must be positive");
    check_precision(a);
    if (a->temperature <= 0.0f) config_error("--temperature must be positive");
    check_recompute(a);
}

// ----------------------------------------------------------------------------
// batch-size ramp-up (Megatron's RampupBatchsizeNumMicroBatches)
// The global batch grows from START by INCREMENT, one increment every
// SAMPLES / ((global - START) / INCREMENT) consumed samples, and is the full global batch
// once more than SAMPLES samples are consumed. It changes the number of micro-batches.

typedef struct {
    int micro_batch_times_dp, global_batch_size;
    int start, increment;
    long long rampup_samples;   // 0: no ramp-up
} BatchSchedule;

static int current_global_batch_size(const BatchSchedule* b, long long consumed_samples) {
    if (b->rampup_samples == 0 || consumed_samples > b->rampup_samples) return b->global_batch_size;
    int num_increments = (b->global_batch_size - b->start) / b->increment;
    double samples_per_increment = (double)b->rampup_samples / num_increments;
    int steps = (int)(consumed_samples / samples_per_increment);
    return b->start + steps * b->increment;
}

// the samples consumed after `iterations` more steps from `consumed`: the ramp's batches one
// by one, then whole global batches
static long long consumed_after(const BatchSchedule* b, long long consumed, long long iterations) {
    for (; iterations > 0 && b->rampup_samples && consumed <= b->rampup_samples; iterations--)
        consumed += current_global_batch_size(b, consumed);
    return consumed + iterations * b->global_batch_size;
}

// the ramp's own shape (each batch on it against the layout: layout_error)
static void check_rampup(const BatchSchedule* b) {
    if (b->start <= 0 || b->increment <= 0 || b->rampup_samples <= 0)
        config_error("--rampup-batch-size expects three positive integers START INCREMENT SAMPLES");
    if (b->start > b->global_batch_size || (b->global_batch_size - b->start) % b->increment != 0)
        config_error("--rampup-batch-size: global batch %d minus start %d is not a multiple of the increment %d",
                     b->global_batch_size, b->start, b->increment);
}

// Megatron's update_train_iters: the steps that --train-samples takes, counting the ramp
static long long train_iters_for_samples(const BatchSchedule* b, long long train_samples) {
    if (b->rampup_samples == 0) return train_samples / b->global_batch_size;
    long long consumed = 0, iters = 0;
    while (consumed <= b->rampup_samples) {
        consumed += current_global_batch_size(b, consumed);
        iters++;
    }
    long long rest = train_samples - consumed;   // Python's floor division, as Megatron
    iters += rest >= 0 ? rest / b->global_batch_size : -((-rest + b->global_batch_size - 1) / b->global_batch_size);
    return iters;
}

// ----------------------------------------------------------------------------
// learning-rate schedule (Megatron's OptimizerParamScheduler.get_lr), by consumed samples:
// linear warm-up from 0, then the decay style down to min-lr at the end of the decay.

typedef struct {
    float max_lr, min_lr;
    long long warmup_steps, decay_steps;   // in samples
    LRDecayStyle style;
} LRSchedule;

static float learning_rate(const LRSchedule* s, long long num_steps) {
    if (s->warmup_steps > 0 && num_steps <= s->warmup_steps)
        return s->max_lr * (float)((double)num_steps / (double)s->warmup_steps);
    if (s->style == LR_CONSTANT) return s->max_lr;
    if (s->style == LR_INVERSE_SQRT) {
        double warmup = s->warmup_steps > 1 ? (double)s->warmup_steps : 1.0;
        double steps = num_steps > 1 ? (double)num_steps : 1.0;
        double lr = s->max_lr * sqrt(warmup) / sqrt(steps);
        return (float)(lr > s->min_lr ? lr : s->min_lr);
    }
    if (num_steps > s->decay_steps) return s->min_lr;
    double ratio = (double)(num_steps - s->warmup_steps) / (double)(s->decay_steps - s->warmup_steps);
    double coeff = s->style == LR_LINEAR ? 1.0 - ratio : 0.5 * (cos(M_PI * ratio) + 1.0);   // else cosine
    return (float)(s->min_lr + coeff * (s->max_lr - s->min_lr));
}

// Megatron's get_optimizer_param_scheduler: lengths in samples from either flag family
static LRSchedule make_lr_schedule(const Config* a, int train_iters) {
    LRSchedule s;
    s.max_lr = a->lr;
    s.min_lr = a->min_lr;
    s.style = (LRDecayStyle)a->lr_decay_style;
    if (a->train_iters > 0) {
        long long decay_iters = a->lr_decay_iters > 0 ? a->lr_decay_iters : train_iters;
        s.decay_steps = decay_iters * a->global_batch_size;
        s.warmup_steps = a->lr_warmup_fraction > 0.0f ? (long long)(a->lr_warmup_fraction * s.decay_steps)
                                                      : (long long)a->lr_warmup_iters * a->global_batch_size;
    } else {
        s.decay_steps = a->lr_decay_samples > 0 ? a->lr_decay_samples : a->train_samples;
        s.warmup_steps = a->lr_warmup_fraction > 0.0f ? (long long)(a->lr_warmup_fraction * s.decay_steps)
                                                      : a->lr_warmup_samples;
    }
    if (s.decay_steps <= 0) config_error("the learning-rate decay length must be positive");
    if (s.warmup_steps >= s.decay_steps && s.style != LR_CONSTANT && s.style != LR_INVERSE_SQRT)
        config_error("the learning-rate warm-up (%lld samples) must be shorter than the decay (%lld samples)",
                     s.warmup_steps, s.decay_steps);
    return s;
}

// ----------------------------------------------------------------------------
// data: Megatron's split of the documents, one GPT sample index per split, and the
// pretraining sampler's order: a global batch is micro_batch x DP consecutive samples
// per micro-batch step, this rank taking its micro_batch slice, all from consumed samples.

typedef struct {
    const DataSplits* data;
    int split;                    // 0 train, 1 valid, 2 test
    long long consumed;           // samples consumed before this step
    int micro_batch_size, dp_size, dp_rank, seq_length;
    int* host_sample;             // [seq_length + 1]
    // Two pinned staging buffers, each [tokens | targets] of one micro-batch, used in turn: the
    // host fills one while the GPU may still be copying from the other (host_to_dev_async)
    int* staging[2];
    HostCopy copied[2];           // recorded after each buffer's copies
    int next;                     // the buffer the next micro-batch fills
} Loader;

static void load_micro_batch(void* ctx, int micro_batch, int* tokens, int* targets) {
    Loader* l = (Loader*)ctx;
    int T = l->seq_length;
    long long first = l->consumed + (long long)micro_batch * l->micro_batch_size * l->dp_size
                    + (long long)l->dp_rank * l->micro_batch_size;
    size_t n = (size_t)l->micro_batch_size * T;
    int k = l->next;
    l->next = 1 - k;
    host_copy_wait(&l->copied[k]);   // the GPU has read this buffer (two micro-batches ago)
    int *host_tokens = l->staging[k], *host_targets = l->staging[k] + n;
    for (int b = 0; b < l->micro_batch_size; b++) {
        data_splits_get(l->data, l->split, first + b, l->host_sample);
        memcpy(host_tokens + (size_t)b * T, l->host_sample, T * sizeof(int));
        memcpy(host_targets + (size_t)b * T, l->host_sample + 1, T * sizeof(int));
    }
    host_to_dev_async(tokens, host_tokens, n * sizeof(int));
    host_to_dev_async(targets, host_targets, n * sizeof(int));
    host_copy_record(&l->copied[k]);
}

static Loader make_loader(const DataSplits* d, int split, const Config* a) {
    Loader l;
    memset(&l, 0, sizeof(l));
    l.data = d;
    l.split = split;
    l.micro_batch_size = a->micro_batch_size;
    l.dp_size = grid.dp_size;
    l.dp_rank = grid.dp_rank;
    l.seq_length = a->model.seq_length;
    l.host_sample = (int*)mallocCheck((l.seq_length + 1) * sizeof(int));
    for (int k = 0; k < 2; k++) {
        l.staging[k] = (int*)host_alloc_pinned(2 * (size_t)a->micro_batch_size * l.seq_length * sizeof(int));
        host_copy_create(&l.copied[k]);
    }
    return l;
}

static void free_loader(Loader* l) {
    free(l->host_sample);
    for (int k = 0; k < 2; k++) {
        host_free_pinned(l->staging[k]);
        host_copy_destroy(&l->copied[k]);
    }
}

// What a rank's copy of one data prefix looks like: the .bin's size, a CRC-32 of the .idx's
// contents (dtype, counts and its three arrays) and one of 64 blocks of 4 KiB spread evenly
// over the .bin, the first and last among them. Ranks that read --data-path from node-local
// disks compare these, so that a stale or half-copied file on one node is named, not trained
// on. (A change inside the .bin that leaves its size and those blocks alone goes unseen.)
typedef struct {
    uint64_t bin_bytes;
    uint32_t idx_crc, bin_crc;
} DataFingerprint;

enum { FINGERPRINT_BLOCKS = 64, FINGERPRINT_BLOCK_BYTES = 4096 };

static DataFingerprint data_fingerprint(const IndexedDataset* ds) {
    DataFingerprint f = {(uint64_t)ds->bin_bytes, 0, 0};
    int64_t counts[3] = {ds->dtype_code, ds->num_items, ds->num_docs};
    f.idx_crc = crc32_update(0, counts, sizeof(counts));
    f.idx_crc = crc32_update(f.idx_crc, ds->sizes, (size_t)ds->num_items * sizeof(int32_t));
    f.idx_crc = crc32_update(f.idx_crc, ds->pointers, (size_t)ds->num_items * sizeof(int64_t));
    f.idx_crc = crc32_update(f.idx_crc, ds->doc_idx, (size_t)(ds->num_docs + 1) * sizeof(int64_t));
    size_t block = ds->bin_bytes < (size_t)FINGERPRINT_BLOCK_BYTES ? ds->bin_bytes : (size_t)FINGERPRINT_BLOCK_BYTES;
    for (int k = 0; k < FINGERPRINT_BLOCKS && block > 0; k++) {
        size_t at = (size_t)((double)(ds->bin_bytes - block) * k / (FINGERPRINT_BLOCKS - 1));
        f.bin_crc = crc32_update(f.bin_crc, ds->bin + at, block);
    }
    return f;
}

// Every rank's fingerprints against rank 0's, like the flags: the first rank whose copy of a
// prefix differs says so (naming the file, and rank 0's host), and every rank exits 2.
static void check_same_data_everywhere(const DataSplits* d) {
    int n = d->num_prefixes, W = grid.world_size;
    DataFingerprint* mine = (DataFingerprint*)callocCheck(n, sizeof(DataFingerprint));
    DataFingerprint* all = (DataFingerprint*)callocCheck((size_t)n * W, sizeof(DataFingerprint));
    for (int i = 0; i < n; i++) mine[i] = data_fingerprint(&d->prefix[i].ds);
    all_gather_host(&grid.world, mine, all, n * sizeof(DataFingerprint));
    int rank = -1, prefix = -1;
    for (int r = 1; r < W && rank < 0; r++)
        for (int i = 0; i < n && rank < 0; i++)
            if (memcmp(&all[(size_t)r * n + i], &all[i], sizeof(DataFingerprint)) != 0) rank = r, prefix = i;
    char rank0_host[sizeof(grid.host)], what[4400] = "";
    memcpy(rank0_host, grid.host, sizeof(rank0_host));
    if (rank >= 0) broadcast_host(&grid.world, rank0_host, sizeof(rank0_host), 0);
    if (rank >= 0 && grid.world_rank == rank) {
        const DataFingerprint *here = &mine[prefix], *there = &all[prefix];
        const char* path = d->prefix[prefix].ds.path_prefix;
        if (here->bin_bytes != there->bin_bytes)
            snprintf(what, sizeof(what), "%s.bin is %llu bytes here, %llu on rank 0", path,
                     (unsigned long long)here->bin_bytes, (unsigned long long)there->bin_bytes);
        else if (here->idx_crc != there->idx_crc)
            snprintf(what, sizeof(what), "%s.idx differs (CRC-32 %08x here, %08x on rank 0)", path, here->idx_crc,
                     there->idx_crc);
        else
            snprintf(what, sizeof(what), "%s.bin differs in the blocks sampled (CRC-32 %08x here, %08x on rank 0)", path,
                     here->bin_crc, there->bin_crc);
    }
    free(mine);
    free(all);
    if (rank >= 0)   // (only that rank prints, with its host and coordinates)
        config_error_on(rank, "--data-path: this rank's copy differs from rank 0's (on %s): %s; every rank must read "
                        "the same data (a stale copy on a node-local disk?)", rank0_host, what);
}

// Every rank maps the data files and plans the sample indexes (nothing large is allocated
// yet: the memory check, plan_model, comes next and counts them). Also settles the vocabulary:
// --vocab-size, or the largest token id + 1, and every id must lie below it.
static void open_data_files(DataSplits* d, Config* a, const int64_t want[3]) {
    char err[1024] = "";
    GPTConfig* c = &a->model;
    data_splits_plan(d, a->data_path.v, a->data_path.count, a->split, c->seq_length, (uint64_t)c->seed, want, err,
                     sizeof(err));
    config_error_anywhere(err);
    check_same_data_everywhere(d);
    int64_t max_id = 0;
    if (data_splits_check_vocab(d, c->vocab_size, &max_id, err, sizeof(err)))
        config_error("%s (--vocab-size %d)", err, c->vocab_size);
    if (c->vocab_size == 0) c->vocab_size = (int)(max_id + 1);
}

// Rank 0 builds the planned sample indexes (or finds them cached) and writes the cache; the
// others then map the same cache files.
static void build_data_index(DataSplits* d, const Config* a) {
    char err[1024] = "";
    int rc = 0;
    if (grid.world_rank == 0) rc = data_splits_build(d, a->data_cache_path, 1, err, sizeof(err));
    broadcast_host(&grid.world, &rc, sizeof(rc), 0);
    if (rc) config_error("%s", err);   // rank 0 says why
    err[0] = '\0';   // the other ranks map what rank 0 wrote: a host that cannot see it is named
    if (grid.world_rank != 0) {
        rc = data_splits_build(d, a->data_cache_path, 0, err, sizeof(err));
        if (rc == DATA_NO_CACHE) strncat(err, "; the index cache must be visible to every rank (see --data-cache-path)",
                                         sizeof(err) - strlen(err) - 1);
    }
    config_error_anywhere(err);
}

// ----------------------------------------------------------------------------
// measures

// layers of the whole model whose forward runs a second time in backward (activation
// recomputation): all of them (uniform), the first N of each pipeline stage, all of a stage's
// when it holds fewer (block), or none
static int recomputed_layers(const Config* a) {
    const GPTConfig* c = &a->model;
    if (c->recompute_method != RECOMPUTE_BLOCK) return c->recompute_method == RECOMPUTE_UNIFORM ? c->num_layers : 0;
    int* layers = stage_layers(a), total = 0;
    for (int p = 0; p < a->pipeline_model_parallel_size; p++)
        total += layers[p] < c->recompute_num_layers ? layers[p] : c->recompute_num_layers;
    free(layers);
    return total;
}

// Model FLOPs of one training step of global batch B (Narayanan et al. 2021, §5.1 and its
// appendix): a forward pass costs 2 FLOPs per multiply-add,
//   per layer: 2 B s (3h^2 + h^2 + 2 h F)  (QKV, projection, MLP)  +  4 B s^2 h  (scores, values)
//   logits:    2 B s h V
// and the backward twice the forward. For F = 4h a layer's forward is 24 B s h^2 (1 + s/(6h)),
// so forward and backward make 72 B s l h^2 (1 + s/(6h) + V/(12 l h)). Activation
// recomputation runs the forward of the recomputed layers once more, not the logits (the head
// keeps its activations): with every layer recomputed the layers make four passes, the logits
// three, 4 x 24 B s l h^2 (1 + s/(6h)) + 3 x 2 B s h V = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)),
// the paper's formula (which assumes recomputation). `recomputed`: recomputed_layers().
static double flops_per_step(const GPTConfig* c, int global_batch, int recomputed) {
    double B = global_batch, s = c->seq_length, h = c->hidden_size, F = c->ffn_hidden_size;
    double l = c->num_layers, V = c->padded_vocab_size;
    double layer = 2.0 * B * s * (4.0 * h * h + 2.0 * h * F) + 4.0 * B * s * s * h, logits = 2.0 * B * s * h * V;
    return (3.0 * l + recomputed) * layer + 3.0 * logits;
}

static double peak_rss_gib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / (1024.0 * 1024.0);   // ru_maxrss is in KiB on Linux
}

// ----------------------------------------------------------------------------
// evaluation: eval_iters global batches of a split, continuing where the last one ended

static float evaluate(GPT* m, Loader* l, int eval_iters, int global_batch) {
    int num_micro = global_batch / (l->micro_batch_size * l->dp_size);
    double sum = 0.0;
    for (int it = 0; it < eval_iters; it++) {
        Schedule s = {m, load_micro_batch, l, 0.0f, 0, 0};
        run_forward_only(&s, num_micro);
        sum += step_loss(&s, num_micro);
        l->consumed += global_batch;
    }
    return (float)(sum / (eval_iters > 0 ? eval_iters : 1));
}

static void print_eval(const char* what, float loss) {
    if (grid.world_rank != 0) return;
    char line[256];
    int n = snprintf(line, sizeof(line), " %s | lm loss value: %.6E | lm loss PPL: %.6E | ", what, loss, exp(loss));
    char dashes[256];
    n = n < (int)sizeof(line) - 1 ? n : (int)sizeof(line) - 1;
    memset(dashes, '-', n);
    dashes[n] = '\0';
    printf("%s\n%s\n%s\n", dashes, line, dashes);
    fflush(stdout);
}

// ----------------------------------------------------------------------------
// the trainer

typedef struct {
    Config config;                  // config.model is the model's
    GPT model;
    AdamWConfig adam;
    AdamWState opt;
    BatchSchedule batch;
    LRSchedule lr;
    int train_iters;
    DataSplits data;
    Loader train, valid, test;
    Progress progress;              // iteration and data positions: what a checkpoint stores
    int last_saved;                 // iteration of the last checkpoint this run wrote (-1: none)
    int last_save_failed;           // the last save could not be written (the exit status says so)
    TensorBoardWriter tensorboard;  // --tensorboard-dir, on rank 0
    size_t allocated_bytes;         // what dev_malloc handed out for the model, the optimizer and the kernels
} Trainer;

typedef struct {
    float loss, grad_norm, lr;
    int global_batch, skipped, nan_loss;
    int max_in_flight;   // most micro-batches whose activations this stage held at once
    double comm[4];      // bytes this rank sent in the step: tp, dp, pp, embedding groups
} StepResult;

// out += sign x the bytes each group has sent so far (a step's: -1 before it, +1 after)
static void add_comm_counters(double out[4], double sign) {
    out[0] += sign * grid.tp.bytes_sent;
    out[1] += sign * grid.dp.bytes_sent;
    out[2] += sign * grid.pp.bytes_sent;
    out[3] += sign * grid.embedding.bytes_sent;
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
    size_t workspaces = m->workspace_bytes + adamw_workspace_bytes(m->num_tensors) +
                        (m->build.gpu ? GPU_KERNELS_WORKSPACE_BYTES : 0);
    StageMemory s = {stage, m->num_params, m->num_params_padded * m->build.floatx_bytes,
                     m->num_params_padded * sizeof(float), adamw_state_bytes(m->num_params_padded, dp_size, master_copy),
                     m->arena_bytes - m->workspace_bytes, workspaces, 0, m->num_slots, m->longest_chunk, m->slot_bytes,
                     m->recompute_bytes};
    s.total = s.params + s.grads + s.optimizer + s.activations + s.workspaces;
    return s;
}

// --dry-run-build: the build a dry run plans, whichever binary runs it (not given: the GPU build)
static int plans_gpu_build(const Config* a) { return a->dry_run_build != PLAN_CPU_BUILD; }

// --attention-backend on a build (gpu: the GPU build's): does it run the fused attention? The
// CPU build has one attention, the C reference, whatever the flag says.
static int runs_flash_attention(const Config* a, int gpu) {
    int head_size = a->model.hidden_size / a->model.num_attention_heads;
    if (!gpu || a->attention_backend == ATTENTION_UNFUSED) return 0;
    return a->attention_backend == ATTENTION_FLASH || flash_attention_supports(head_size);
}

// the name of the value a CHOICE field of the run's list (at offset in Config) has in a
static const char* run_choice_name(const Config* a, size_t offset, char* out, size_t len) {
    out[0] = '\0';
    for (int k = 0; k < NUM_RUN_FIELDS; k++)
        if (RUN_FIELDS[k].offset == offset) choice_name(&RUN_FIELDS[k], *(const int*)((const char*)a + offset), out, len);
    return out;
}

// the start-up line (and the dry run's) that says which attention runs
static void print_attention(const Config* a, int gpu) {
    char flag[32];
    run_choice_name(a, offsetof(Config, attention_backend), flag, sizeof flag);
    if (!gpu) printf("attention: the C reference (--attention-backend %s chooses among the GPU build's kernels)\n", flag);
    else if (runs_flash_attention(a, gpu))
        printf("attention: fused, flash kernels on tensor cores (WMMA), log-sum-exp kept (--attention-backend %s)\n", flag);
    else printf("attention: unfused, cuBLAS batched products and a softmax kernel, probabilities kept (--attention-backend %s)\n", flag);
}

// the start-up lines that say how the DP gradients are reduced and the parameters gathered
// (rank 0's stage's buckets)
static void print_dp_communication(const Config* a, const GPT* m) {
    if (grid.dp_size == 1) {
        if (a->overlap_grad_reduce) printf("gradient reduction: none at DP 1 (--overlap-grad-reduce has nothing to do)\n");
        if (a->overlap_param_gather) printf("parameter all-gather: none at DP 1 (--overlap-param-gather has nothing to do)\n");
        return;
    }
    if (grad_reducer.enabled)
        printf("gradient reduction: %d bucket(s) of at least %zu elements on stage 0 (--ddp-bucket-size), each reduced "
               "onto its shards' owners as soon as the last backward has finished its layers%s\n",
               grad_reducer.num_buckets, grad_bucket_size(a, grid.dp_size), m->is_first_stage ? "; the embedding's last" : "");
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

// stage p of the layout with tp_size x dp_size ranks, as its tensor rank 0 would hold it on the
// build --dry-run-build names: planned and thrown away. The ranks of a stage hold the same sizes
// (other slices of the vocabulary, of the matrices and of the ZeRO shard).
static void plan_stage_model(GPT* m, const Config* a, int p, int tp_size, int dp_size) {
    BuildTarget build = {plans_gpu_build(a), plans_gpu_build(a) ? 2 : (int)sizeof(float),   // bf16 or fp16; fp32
                         runs_flash_attention(a, plans_gpu_build(a))};
    gpt_plan_model(m, &a->model, a->micro_batch_size, a->model.seq_length, 0, tp_size, pipeline_stage(a, p),
                   a->pipeline_model_parallel_size, dp_size, build);
}

static StageMemory plan_stage_memory(const Config* a, int p, int tp_size, int dp_size) {
    GPT m;
    plan_stage_model(&m, a, p, tp_size, dp_size);
    StageMemory s = stage_memory(&m, pipeline_stage(a, p), dp_size);
    gpt_free_plan(&m);
    return s;
}

static void print_memory_header(const StageMemory* s) {
    double mib = 1024.0 * 1024.0;
    char recompute[96] = "";
    if (s->longest_chunk > 0)
        snprintf(recompute, sizeof(recompute), " + a recomputed chunk's scratch of %.1f MiB (%d layer(s))",
                 s->recompute_bytes / mib, s->longest_chunk);
    printf("memory per rank (MiB): parameters | gradients | optimizer state (1/DP shard) | activations "
           "(%d micro-batch slot(s) of %.1f MiB%s) | workspaces (backward scratch, column partials, logits, cross-entropy, the optimizer's "
           "norm and shard table; "
           "no communication buffers: NCCL and MPI use the arena's) | total\n", s->num_slots, s->slot_bytes / mib, recompute);
}

// "  LABEL (stage S, layers A-B): N parameters: x | x | x | x | x | x", and with `bytes` the same in bytes
static void print_memory_row(const char* label, const StageMemory* s, int bytes) {
    double mib = 1024.0 * 1024.0;
    char layers[48] = "no layers";   // each stage shows its layers: the balance can be seen
    if (s->stage.num_layers > 0)
        snprintf(layers, sizeof(layers), "layers %d-%d", s->stage.first_layer, s->stage.first_layer + s->stage.num_layers - 1);
    printf("  %s (stage %d, %s): %zu parameters: %9.1f | %9.1f | %9.1f | %9.1f | %9.1f | %9.1f\n", label, s->stage.rank,
           layers, s->num_params, s->params / mib, s->grads / mib, s->optimizer / mib, s->activations / mib,
           s->workspaces / mib, s->total / mib);
    if (bytes)
        printf("  %s (stage %d) in bytes: %zu | %zu | %zu | %zu | %zu | %zu\n", label, s->stage.rank, s->params, s->grads,
               s->optimizer, s->activations, s->workspaces, s->total);
}

// Per rank: parameters, gradients, optimizer state, activations and workspaces, gathered to rank
// 0; with --log-memory-bytes also in bytes, and the bytes dev_malloc really handed out for them
static void print_memory(const Trainer* t) {
    StageMemory s = stage_memory(&t->model, this_stage(&t->config), grid.dp_size);
    double mine[10] = {(double)s.num_params, (double)s.params, (double)s.grads, (double)s.optimizer, (double)s.activations,
                       (double)s.stage.rank, (double)s.stage.first_layer, (double)s.stage.num_layers,
                       (double)t->allocated_bytes, (double)s.workspaces};
    double* all = (double*)mallocCheck(10 * sizeof(double) * grid.world_size);
    gather_to_rank0(&grid.world, mine, all, 10);
    if (grid.world_rank == 0) {
        print_memory_header(&s);
        for (int r = 0; r < grid.world_size; r++) {
            const double* x = all + 10 * r;
            StageMemory row = {{(int)x[5], grid.pp_size, (int)x[6], (int)x[7]}, (size_t)x[0], (size_t)x[1], (size_t)x[2],
                               (size_t)x[3], (size_t)x[4], (size_t)x[9], 0, 0, 0, 0, 0};
            row.total = row.params + row.grads + row.optimizer + row.activations + row.workspaces;
            char label[32];
            snprintf(label, sizeof(label), "rank %3d", r);
            print_memory_row(label, &row, t->config.log_memory_bytes);
            if (t->config.log_memory_bytes) printf("  rank %3d: dev_malloc handed out %.0f bytes for them\n", r, x[8]);
        }
    }
    free(all);
}

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

// OpenBLAS's pthread flavour starts threads of its own that fight the trainer's OpenMP
// threads for the cores (measured: make run 2.2x slower); say so in one line
static void warn_if_pthread_blas(void) {
#if defined(USE_BLAS) && defined(_OPENMP)
    if (openblas_get_parallel() == 1 && omp_get_max_threads() > 1)   // 0 sequential, 1 pthreads, 2 OpenMP
        fprintf(stderr, "warning: linked to the pthread OpenBLAS with %d OpenMP threads: they fight for the cores "
                "(make run measured 2.2x slower); install libopenblas-openmp-dev and rebuild (make clean cpu)\n", omp_get_max_threads());
#endif
}

// "BLAS: ..." for rank 0's start-up lines: the kernels it runs (blas_cores.h chose them before
// MPI started), each rank whose kernels differ (a node of another CPU), and how many ranks
// restarted to get theirs; "" without OpenBLAS. Every rank calls it (a gather).
static void blas_kernels_everywhere(char* out, size_t len) {
    out[0] = '\0';
#ifdef USE_BLAS
    typedef struct {
        char core[32], host[64];
        int restarted;
    } RankKernels;
    RankKernels mine;
    memset(&mine, 0, sizeof(mine));
    snprintf(mine.core, sizeof(mine.core), "%s", openblas_get_corename());
    snprintf(mine.host, sizeof(mine.host), "%.63s", grid.host);
    mine.restarted = blas_restarted;
    size_t bytes;
    RankKernels* all = (RankKernels*)gather_bytes_to_rank0(&grid.world, &mine, (int)sizeof(mine), &bytes);
    if (grid.world_rank == 0) {
        int restarted = 0, differ = 0;
        snprintf(out, len, "%s", blas_kernels_line);
        for (int r = 0; r < grid.world_size; r++) {
            restarted += all[r].restarted;
            if (strcmp(all[r].core, mine.core) == 0 || differ++ >= 4) continue;   // name the first few
            size_t used = strlen(out);
            snprintf(out + used, len - used, "; rank %d on %s runs %s kernels", r, all[r].host, all[r].core);
        }
        size_t used = strlen(out);
        if (differ > 4) snprintf(out + used, len - used, "; %d ranks in all run other kernels", differ);
        else if (grid.world_size > 1 && !differ)
            snprintf(out + used, len - used, " (the same on all %d ranks, %d of them restarted)", grid.world_size, restarted);
    }
    free(all);
#else
    (void)len;
#endif
}

static void print_setup(const Trainer* t) {
    const Config* a = &t->config;
    char blas[1024];
    blas_kernels_everywhere(blas, sizeof(blas));
    if (grid.world_rank == 0) {
        char name[96];
        printf("gridgpt %s build, %s, %d rank(s) as TP %d x PP %d x DP %d, %d OpenMP thread(s) per rank; rank 0 is %s\n",
               BUILD_NAME, PRECISION_NAME, grid.world_size, grid.tp_size, grid.pp_size, grid.dp_size,
#ifdef _OPENMP
               omp_get_max_threads(),
#else
               1,
#endif
               grid_name(name, sizeof(name)));
        if (blas[0]) printf("%s\n", blas);
        warn_if_pthread_blas();
        print_model(&a->model);
        print_attention(a, GPU_BUILD);
        print_dp_communication(a, &t->model);
        print_pipeline_exchanges();
        data_splits_print(&t->data, stdout);
        if (a->eval_iters > 0 && !data_splits_has(&t->data, 1))
            printf("note: --split %s leaves no validation documents: no evaluation (as Megatron)\n", a->split);
        printf("training: %d iterations, micro-batch %d, global batch %d%s", t->train_iters, a->micro_batch_size,
               a->global_batch_size, t->batch.rampup_samples ? " (ramped up)" : "");
        if (a->model.recompute_method == RECOMPUTE_UNIFORM)
            printf("; activation recomputation: full, uniform, chunks of %d layer(s)", a->model.recompute_num_layers);
        if (a->model.recompute_method == RECOMPUTE_BLOCK)
            printf("; activation recomputation: full, block, the first %d layer(s) of a stage", a->model.recompute_num_layers);
        printf("\n");
        fflush(stdout);
    }
    print_memory(t);
    fflush(stdout);
}

// --load DIR --export-hf OUT: the latest checkpoint in DIR as a transformers model; 0, or 1
// with the error line in err
static int export_latest(const Config* a, char* err, size_t len) {
    char ckpt[4300];
    HFArchitecture arch = (HFArchitecture)a->export_hf_architecture;
    double t0 = now_seconds();
    if (!a->load) return error_line(err, len, "--export-hf needs --load DIR (the checkpoint to export)");
    if (latest_checkpoint(a->load, ckpt, sizeof(ckpt), err, len)) return 1;
    if (!ckpt[0]) return error_line(err, len, "--load %s: no latest_checkpointed_iteration.txt, nothing to export", a->load);
    if (export_hf(ckpt, a->export_hf, &arch, err, len) != 0) return 1;
    printf("exported %s as a Hugging Face %s to %s (config.json, model.safetensors) in %.2f s\n", ckpt,
           hf_class_name(arch), a->export_hf, now_seconds() - t0);
    return 0;
}

// no data, no model, just the file conversion, by rank 0 alone (the others end with it)
static void export_and_exit(const Config* a) {
    char err[4600] = "";
    if (grid.world_rank == 0) export_latest(a, err, sizeof(err));
    config_error_anywhere(err);
    grid_finish();
    exit(0);
}

// the batch and learning-rate schedules, and the length of training in iterations
static void setup_schedules(Trainer* t) {
    Config* a = &t->config;
    BatchSchedule* b = &t->batch;
    b->micro_batch_times_dp = a->micro_batch_size * data_parallel_size(a);
    b->global_batch_size = a->global_batch_size;
    b->start = a->rampup_batch_size.v[0];
    b->increment = a->rampup_batch_size.v[1];
    b->rampup_samples = a->rampup_batch_size.v[2];
    if (b->start || b->increment || b->rampup_samples) check_rampup(b);
    if (a->train_iters == 0 && a->train_samples == 0) return;   // --train-iters 0 --save: the initial model only
    long long iters = a->train_iters > 0 ? a->train_iters : train_iters_for_samples(b, a->train_samples);
    if (iters <= 0) config_error("--train-samples %lld is less than one global batch", a->train_samples);
    if (iters > INT_MAX)
        config_error("--train-samples %lld at a global batch of %d is %lld iterations, more than %d", a->train_samples,
                     a->global_batch_size, iters, INT_MAX);
    t->train_iters = (int)iters;
    t->lr = make_lr_schedule(a, t->train_iters);
}

// --save, --tensorboard-dir and --load checked before any work: rank 0 prepares the save
// and TensorBoard directories (it alone writes events), every rank learns its verdict
static void check_paths(const Config* a) {
    char err[4600];
    int rc = 0;
    struct stat st;
    if (a->save && grid.world_rank == 0) rc = prepare_save_dir(a->save, err, sizeof(err)) || take_save_lock(a->save, err, sizeof(err));
    if (!rc && a->tensorboard_dir && grid.world_rank == 0) rc = prepare_dir("--tensorboard-dir", a->tensorboard_dir, err, sizeof(err));
    if (!rc && a->data_cache_path && grid.world_rank == 0)   // (Megatron makes it too)
        rc = prepare_dir("--data-cache-path", a->data_cache_path, err, sizeof(err));
    broadcast_host(&grid.world, &rc, sizeof(rc), 0);
    if (rc) config_error("%s", err);
    err[0] = '\0';
    if (a->load && stat(a->load, &st) == 0 && !S_ISDIR(st.st_mode)) error_line(err, sizeof(err), "--load %s: not a directory", a->load);
    config_error_anywhere(err);
}

// A checkpoint's consumed_samples against the batch schedule recorded with it: the schedule's
// batches summed from the iteration it took over must give it exactly (Megatron adds the
// global batch to consumed_samples once per iteration, skipped steps too). An edited or
// miscounted value would move the data position and the learning rate without a word.
static void check_consumed_samples(const char* ckpt, const Progress* p) {
    const BatchRecord* r = &p->batch;
    if (r->global_batch_size == 0) return;   // not recorded: meta_check_counters' checks only
    BatchSchedule b = {0, r->global_batch_size, r->rampup_start, r->rampup_increment, r->rampup_samples};
    int ramp_ok = b.rampup_samples == 0 || (b.start > 0 && b.increment > 0 && b.start <= b.global_batch_size &&
                                            (b.global_batch_size - b.start) % b.increment == 0);
    long long expected = ramp_ok ? consumed_after(&b, r->since_consumed, p->iteration - r->since_iteration) : -1;
    char err[4600] = "";
    if (expected != p->consumed_samples)
        error_line(err, sizeof(err), "checkpoint %s: consumed_samples %lld is not what its batch schedule gives at "
                   "iteration %d (%lld: global batch %d, ramp-up %d %d %lld, from %lld samples at iteration %d)", ckpt,
                   p->consumed_samples, p->iteration, expected, r->global_batch_size, r->rampup_start, r->rampup_increment,
                   r->rampup_samples, r->since_consumed, r->since_iteration);
    config_error_anywhere(err);
}

// This run's batch schedule goes into its checkpoints, taking over at the iteration it starts
// from, unless it is the schedule the loaded checkpoint recorded (then it goes on from there).
static void record_batch_schedule(Trainer* t) {
    const BatchSchedule* b = &t->batch;
    BatchRecord now = {b->global_batch_size, b->start, b->increment, b->rampup_samples, t->progress.iteration,
                       t->progress.consumed_samples};
    BatchRecord* was = &t->progress.batch;
    int same = was->global_batch_size == now.global_batch_size && was->rampup_start == now.rampup_start &&
               was->rampup_increment == now.rampup_increment && was->rampup_samples == now.rampup_samples;
    if (!same) *was = now;
}

// --load DIR: the latest checkpoint's metadata, read before anything else (its seed
// continues the data order); "" in ckpt when DIR has none (a fresh start). Rank 0 reads the
// marker, so that every rank loads the same checkpoint; each rank reads the metadata itself.
static void find_checkpoint(Config* a, char* ckpt, size_t len, CheckpointMeta* meta) {
    char err[4600] = "";
    int rc = 0;
    ckpt[0] = '\0';
    if (!a->load) return;
    if (grid.world_rank == 0) rc = latest_checkpoint(a->load, ckpt, len, err, sizeof(err));
    broadcast_host(&grid.world, &rc, sizeof(rc), 0);
    if (rc) config_error("%s", err);
    broadcast_host(&grid.world, ckpt, len, 0);
    if (ckpt[0]) {
        if (checkpoint_meta_read(ckpt, meta, err, sizeof(err)) != 0 && !err[0]) strcpy(err, "unreadable metadata");
        config_error_anywhere(err);
        check_consumed_samples(ckpt, &meta->progress);
        if (!a->no_load_rng && !a->finetune) a->model.seed = meta->cfg.seed;   // the data order goes on
    } else if (grid.world_rank == 0) {
        printf("no checkpoint in %s (no latest_checkpointed_iteration.txt): starting from scratch\n", a->load);
    }
}

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

// this rank's GPU, the grid's communicators (NCCL binds a communicator to the current GPU)
// and the watchdog; once per process
static void start_grid(const Config* a) {
    if (grid.ready) return;
#ifdef __CUDACC__
    int gpus = 0;
    char err[256] = "";
    cudaCheck(cudaGetDeviceCount(&gpus));
    if (grid.local_rank >= gpus)
        error_line(err, sizeof(err), "%d or more ranks on this host but %d GPU(s) visible: one GPU per rank", grid.local_rank + 1, gpus);
    config_error_anywhere(err);
#endif
    kernels_init(grid.local_rank);   // ranks on one host take distinct GPUs
    grid_build(a->tensor_model_parallel_size, a->pipeline_model_parallel_size);
    watchdog_start(a->watchdog_timeout, a->watchdog_io_timeout);
}

// --check-cluster's flags: the sizes in MiB (1 16 64 by default, increasing) and the matmul's N
static ClusterCheck cluster_check_config(const Config* a) {
    static const char* const defaults[] = {"1", "16", "64"};
    ClusterCheck cc;
    memset(&cc, 0, sizeof(cc));
    const StringList* given = &a->check_cluster_sizes;
    if (a->check_cluster && a->dry_run) config_error("give --dry-run or --check-cluster, not both (one plans, one measures)");
    if (!a->check_cluster && (given->count || a->check_cluster_matmul_size))
        config_error("--check-cluster-sizes and --check-cluster-matmul-size go with --check-cluster");
    cc.num_sizes = given->count ? given->count : 3;
    if (cc.num_sizes > CHECK_MAX_SIZES) config_error("--check-cluster-sizes takes at most %d sizes", CHECK_MAX_SIZES);
    for (int i = 0; i < cc.num_sizes; i++) {
        const char* v = given->count ? given->v[i] : defaults[i];
        char* end;
        double mib = strtod(v, &end);
        if (end == v || *end || !(mib > 0.0 && mib <= 1024.0))
            config_error("--check-cluster-sizes expects sizes in MiB above 0 and up to 1024, got '%s'", v);
        cc.bytes[i] = (size_t)(mib * 1048576.0);
        if (i > 0 && cc.bytes[i] <= cc.bytes[i - 1]) config_error("--check-cluster-sizes must increase, got '%s' after a larger "
                                                                  "or equal size", v);
    }
    cc.matmul_n = a->check_cluster_matmul_size ? a->check_cluster_matmul_size : CHECK_MATMUL_DEFAULT;
    if (cc.matmul_n > 32768) config_error("--check-cluster-matmul-size %d: at most 32768", cc.matmul_n);
    return cc;
}

// --check-cluster without --data-path: the grid's flags, the check, and exit 0
static void check_cluster_and_exit(const Config* a, const ClusterCheck* cc) {
    check_grid(a);
    start_grid(a);
    check_cluster(cc);
    if (grid.world_rank == 0) printf("check-cluster: no --data-path, so no training\n");
    grid_finish();
    exit(0);
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
// the planner's cost model (--dry-run): one step's time on a described GPU cluster, from what
// the step does on each pipeline stage, kernel by kernel and message by message, as the GPU
// build does it. Everything runs on one stream in order, so nothing overlaps and the costs add
// (but for --overlap-grad-reduce's buckets, which run beside the last backward:
// overlapped_reduce_seconds; and --overlap-param-gather's, beside the next forward:
// overlapped_gather_seconds):
//   a matmul (cuBLAS)     its FLOPs / (the GPU's dense peak x a matmul efficiency);
//   any other kernel      the bytes it reads and writes / the memory bandwidth;
//   a ring collective     steps x latency + the bytes each rank sends / the bandwidth of the
//                         slowest link the group crosses (the alpha-beta model of Thakur,
//                         Rabenseifner and Gropp 2005; the bytes as --log-comm counts them);
//   a pipeline send       latency + its bytes / the link between the two stages.
// A 1F1B step is (m + p - 1) slots of the slowest stage's forward and backward of one
// micro-batch (p - 1 of them the bubble: Narayanan et al. 2021), then the optimizer: the tied
// embedding's all-reduce, the ZeRO reduce-scatter, the norm, AdamW and the all-gather.

typedef struct {
    double peak_tflops;                             // dense fp16/bf16 tensor-core peak (datasheet)
    double matmul_efficiency;                       // the fraction of it our matmuls are taken to reach
    double memory_gib, memory_bandwidth;            // GiB; GB/s
    double nvlink_bandwidth, internode_bandwidth;   // GB/s per GPU and direction
    int gpus_per_node;
    double latency_us;                              // per message: a ring step or a send
    double reserve_gib;                             // memory left to CUDA, cuBLAS and NCCL: not ours
} Hardware;

// --hw's presets, in its order. NVIDIA's datasheets for the GPUs (V100 SXM2, A100 SXM4, H100
// SXM5; NVLink's total bandwidth halved: one direction) and its reference nodes for the
// network (DGX-1: 4 x 100 Gb/s EDR InfiniBand for 8 GPUs; DGX A100: 8 x 200 Gb/s HDR; DGX
// H100: 8 x 400 Gb/s NDR). The matmul efficiency is the one constant per GPU kind fitted to a
// published run (docs/cluster.md, "Planning a layout"): V100 0.41 to BigScience's 104B at TP 4 x PP 32
// (696 s per step), A100 0.40 to their 200B at TP 8 x PP 10 x DP 4, MBS 1 (221 s); H100 has
// no published run here and takes A100's. Latency and reserve are assumptions (docs/cluster.md).
enum { HW_V100_32GB, HW_A100_40GB, HW_A100_80GB, HW_H100_80GB };
static const Hardware HARDWARE_PRESETS[] = {
    [HW_V100_32GB] = {125.0, 0.41, 32.0, 900.0, 150.0, 6.25, 8, 5.0, 2.0},
    [HW_A100_40GB] = {312.0, 0.40, 40.0, 1555.0, 300.0, 25.0, 8, 5.0, 2.0},
    [HW_A100_80GB] = {312.0, 0.40, 80.0, 2039.0, 300.0, 25.0, 8, 5.0, 2.0},
    [HW_H100_80GB] = {989.0, 0.40, 80.0, 3350.0, 450.0, 50.0, 8, 5.0, 2.0},
};

// --hw's preset with each --hw-* flag given (non-zero) in its place
static Hardware hardware_of(const Config* a) {
    Hardware h = HARDWARE_PRESETS[a->hw < 0 ? HW_A100_80GB : a->hw];   // -1: --hw not given
    if (a->hw_peak_tflops > 0.0f) h.peak_tflops = a->hw_peak_tflops;
    if (a->hw_matmul_efficiency > 0.0f) h.matmul_efficiency = a->hw_matmul_efficiency;
    if (a->hw_memory_gib > 0.0f) h.memory_gib = a->hw_memory_gib;
    if (a->hw_memory_bandwidth > 0.0f) h.memory_bandwidth = a->hw_memory_bandwidth;
    if (a->hw_nvlink_bandwidth > 0.0f) h.nvlink_bandwidth = a->hw_nvlink_bandwidth;
    if (a->hw_internode_bandwidth > 0.0f) h.internode_bandwidth = a->hw_internode_bandwidth;
    if (a->hw_gpus_per_node > 0) h.gpus_per_node = a->hw_gpus_per_node;
    if (a->hw_latency_us > 0.0f) h.latency_us = a->hw_latency_us;
    if (a->hw_reserve_gib > 0.0f) h.reserve_gib = a->hw_reserve_gib;
    return h;
}

// The bandwidth (bytes/s) a group's ring runs at. Ranks fill nodes in order (gpus_per_node
// each) and a group's members are `stride` ranks apart (TP 1, DP TP, PP TP x DP): the group
// starting at rank 0 stays in one node when its last member is below gpus_per_node; else
// its ring crosses the network, the slowest link.
static double group_bandwidth(const Hardware* hw, int stride, int size) {
    int in_one_node = (long long)stride * (size - 1) < hw->gpus_per_node;
    return 1e9 * (in_one_node ? hw->nvlink_bandwidth : hw->internode_bandwidth);
}

enum { GROUP_TP, GROUP_DP, GROUP_PP, GROUP_EMBEDDING, NUM_COMM_GROUPS };   // --log-comm's order

// One stage's costs: each kernel (summed over its calls) and each group's messages
#define MAX_COSTS 32
typedef struct {
    const char* name;
    double launches, flops, bytes, seconds;   // bytes: read + written, or sent; launches: kernels or messages
} Cost;
typedef struct {
    const Hardware* hw;
    double group_bandwidth[NUM_COMM_GROUPS];
    double calls;                          // each charge is made this many times (micro-batches)
    Cost costs[MAX_COSTS];
    int num_costs;
    double bytes_sent[NUM_COMM_GROUPS];    // per step, as --log-comm counts them
    double seconds;
    double reduce_total, reduce_hidden;    // --overlap-grad-reduce: its reduces' time, and how much of it the backward hides
    double gather_total, gather_hidden;    // --overlap-param-gather: its broadcasts' time, and how much the forward hides
} StageCost;

// the bucket sizes of the DP overlaps (0: off): --overlap-grad-reduce's and --overlap-param-gather's
typedef struct {
    size_t reduce_bucket, gather_bucket;
} DPOverlap;

static void charge(StageCost* c, const char* name, int launches, double flops, double bytes, double seconds) {
    int k = 0;
    while (k < c->num_costs && strcmp(c->costs[k].name, name) != 0) k++;
    if (k == c->num_costs) {
        if (k == MAX_COSTS) fail("the cost model has more than %d kinds of work", MAX_COSTS);
        Cost empty = {name, 0.0, 0.0, 0.0, 0.0};
        c->costs[c->num_costs++] = empty;
    }
    Cost* k_cost = &c->costs[k];
    k_cost->launches += c->calls * launches;
    k_cost->flops += c->calls * flops;
    k_cost->bytes += c->calls * bytes;
    k_cost->seconds += c->calls * seconds;
    c->seconds += c->calls * seconds;
}

static void charge_matmul(StageCost* c, const char* name, int launches, double flops) {
    charge(c, name, launches, flops, 0.0, flops / (1e12 * c->hw->peak_tflops * c->hw->matmul_efficiency));
}

static void charge_kernel(StageCost* c, const char* name, int launches, double bytes) {
    charge(c, name, launches, 0.0, bytes, bytes / (1e9 * c->hw->memory_bandwidth));
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

// the fused attention's (query tile, key tile) pairs of one head at and below the diagonal
static double flash_tile_pairs(int T) {
    double tiles = ceil(T / 32.0);
    return tiles * (tiles + 1.0) / 2.0;
}

// what one micro-batch's layer forward does (gpt.h block_forward, kernels.cuh's GPU kernels)
// x: the bytes of a floatX; P: attention probabilities [B, heads, T, T]; S: one of q, k, v
static void cost_layer_forward(StageCost* c, const GPT* m, int i, double x, int tp_size) {
    double N = (double)m->B * m->T, C = m->cfg.hidden_size, Cl = m->hidden_local, Fl = m->ffn_local;
    double HS = Cl / m->heads_local, P = (double)m->B * m->heads_local * m->T * m->T, S = N * Cl;
    double layernorm = 2.0 * N * C * x + 8.0 * N, residual_layernorm = 4.0 * N * C * x + 8.0 * N;
    if (i == 0 || !fuses_next_ln1(m, i - 1)) charge_kernel(c, "layernorm forward", 1, layernorm);   // ln1
    charge_kernel(c, "residual + layernorm (fused)", 1, residual_layernorm);                      // res2, ln2
    if (fuses_next_ln1(m, i)) charge_kernel(c, "residual + layernorm (fused)", 1, residual_layernorm);   // res3, next ln1
    else charge_kernel(c, "residual add", 1, 3.0 * N * C * x);
    // biases in the epilogue; fc's GELU too, which also writes the pre-activation it keeps
    charge_matmul(c, "linear layers forward (cuBLASLt epilogues)", 4, 2.0 * N * C * (3.0 * Cl + Cl + 2.0 * Fl));
    charge_kernel(c, "GELU epilogue's second output", 0, N * Fl * x);
    if (m->build.flash_attention) {
        // one fused kernel: 32 x 32 tiles at and below the diagonal through WMMA, q, k, v read
        // once from memory (a head's k and v reused from the cache), out and the log-sum-exp written
        double BH = (double)m->B * m->heads_local, tiles = flash_tile_pairs(m->T);
        charge_matmul(c, "attention, fused (WMMA tiles)", 1, 4096.0 * HS * BH * tiles);
        charge_kernel(c, "attention, fused: memory", 0, 4.0 * S * x + 4.0 * BH * m->T);
    } else {
        charge_kernel(c, "attention permutes", 2, (6.0 * S + 2.0 * S) * x);
        charge_matmul(c, "attention T x T products (cuBLAS, batched)", 2, 2.0 * 2.0 * P * HS);
        // the softmax writes P fp32 scores first (the scores product); reads the causal half three times
        charge_kernel(c, "attention softmax", 1, P * 4.0 + 1.5 * P * 4.0 + P * x);
    }
    for (int k = 0; k < 2; k++) charge_all_reduce(c, "tensor-parallel all-reduce", GROUP_TP, tp_size, N * C * x);
}

// a bias gradient over [N, width]: the column partials' pass reads dout and writes one fp32
// partial per chunk and column, the add kernel reads them back (bias_grad_chunks: the
// chunking is a function of the shape alone)
static double bias_grad_bytes(const GPT* m, int width, double x) {
    double N = (double)m->B * m->T, partials = (double)bias_grad_chunks(m->B * m->T, width) * width * 4.0;
    return N * width * x + 2.0 * partials + 8.0 * width;
}

// LayerNorm backward over [N, C]: dout and the input read, dinp read and written, the rows'
// mean and rstd, the weight and bias partials (2 per 32-row chunk and column) written and read
static double layernorm_backward_bytes(const GPT* m, double x) {
    double N = (double)m->B * m->T, C = m->cfg.hidden_size, chunks = ceil(N / 32.0);
    return 4.0 * N * C * x + 8.0 * N + 2.0 * 8.0 * chunks * C;
}

static void cost_layer_backward(StageCost* c, const GPT* m, double x, int tp_size) {
    double N = (double)m->B * m->T, C = m->cfg.hidden_size, Cl = m->hidden_local, Fl = m->ffn_local;
    double HS = Cl / m->heads_local, P = (double)m->B * m->heads_local * m->T * m->T, S = N * Cl;
    charge_matmul(c, "linear layers backward (cuBLAS)", 8, 2.0 * 2.0 * N * C * (3.0 * Cl + Cl + 2.0 * Fl));
    charge_kernel(c, "bias gradients (column partials + add)", 8,
                  bias_grad_bytes(m, C, x) + bias_grad_bytes(m, Fl, x) + bias_grad_bytes(m, C, x) + bias_grad_bytes(m, 3 * Cl, x));
    charge_kernel(c, "gelu", 1, 3.0 * N * Fl * x);
    charge_kernel(c, "layernorm backward", 4, 2.0 * layernorm_backward_bytes(m, x));
    if (m->build.flash_attention) {
        // D = rowsum(dout out); one block per key tile for dK, dV and one per query tile for dQ,
        // each recomputing p from q, k and the log-sum-exp (5 tile products; no atomics)
        double BH = (double)m->B * m->heads_local, tiles = flash_tile_pairs(m->T);
        charge_matmul(c, "attention, fused (WMMA tiles)", 2, (8192.0 + 6144.0) * HS * BH * tiles);
        charge_kernel(c, "attention, fused: memory", 1, (2.0 + 6.0 + 5.0) * S * x + 20.0 * BH * m->T);
    } else {
        charge_kernel(c, "attention permutes", 3, (6.0 * S + 2.0 * S + 6.0 * S) * x);
        charge_matmul(c, "attention T x T products (cuBLAS, batched)", 4, 4.0 * 2.0 * P * HS);
        charge_kernel(c, "attention softmax", 1, P * 4.0 + P * x + P * 4.0 + P * x);   // datt written, read; att read; dscores
    }
    for (int k = 0; k < 2; k++) charge_all_reduce(c, "tensor-parallel all-reduce", GROUP_TP, tp_size, N * C * x);
}

// one micro-batch through the stage, forward and backward (the recomputed layers' forward
// again), with its pipeline sends
static void cost_micro_batch(StageCost* c, const GPT* m, double x, int tp_size) {
    double N = (double)m->B * m->T, C = m->cfg.hidden_size, V = m->vocab_local;
    if (m->is_first_stage) {
        charge_kernel(c, "embedding", 3, 3.0 * N * C * x + N * C * (2.0 * x + 8.0));   // forward; backward's fp32 rows
        charge_all_reduce(c, "tensor-parallel all-reduce", GROUP_TP, tp_size, N * C * x);
        if (m->cfg.embed_layernorm) {
            charge_kernel(c, "layernorm forward", 1, 2.0 * N * C * x + 8.0 * N);
            charge_kernel(c, "layernorm backward", 3, layernorm_backward_bytes(m, x) + N * C * x);   // and zeroing dinp
        }
    }
    for (int i = 0; i < m->num_local_layers; i++) {
        int first, end;
        cost_layer_forward(c, m, i, x, tp_size);
        if (recompute_chunk(m, i, &first, &end)) cost_layer_forward(c, m, i, x, tp_size);
        cost_layer_backward(c, m, x, tp_size);
    }
    if (m->is_last_stage) {
        charge_kernel(c, "layernorm forward", 1, 2.0 * N * C * x + 8.0 * N);
        charge_kernel(c, "layernorm backward", 3, layernorm_backward_bytes(m, x) + N * C * x);   // and zeroing dres
        charge_matmul(c, "logits (cuBLAS)", 3, 3.0 * 2.0 * N * C * V);
        charge_kernel(c, "cross-entropy", 4, 3.0 * N * V * x);   // one read forward (online), the backward's read and write
        charge_all_reduce(c, "tensor-parallel all-reduce", GROUP_TP, tp_size, N * 4.0);         // the rows' maxima
        charge_all_reduce(c, "tensor-parallel all-reduce", GROUP_TP, tp_size, 2.0 * N * 4.0);   // their sums
        charge_all_reduce(c, "tensor-parallel all-reduce", GROUP_TP, tp_size, N * C * x);       // the head's f
    }
    if (!m->is_last_stage) charge_message(c, "pipeline send", GROUP_PP, 1.0, N * C * x);
    if (!m->is_first_stage) charge_message(c, "pipeline send", GROUP_PP, 1.0, N * C * x);
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
        int above = m->first_layer + m->num_local_layers - b->lowest_layer;   // this stage's layers at or above it
        double ready = (above < 0 ? 0 : above > m->num_local_layers ? m->num_local_layers : above) * t_layer;
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
        int layer = i < m->num_local_layers ? m->first_layer + i : INT_MAX;
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
    if (pp_size > 1 && (m->is_first_stage || m->is_last_stage))
        charge_all_reduce(c, "tied embedding all-reduce", GROUP_EMBEDDING, 2, (double)m->tensors[m->wte].numel * 4.0);
    if (dp_size > 1 && overlap.reduce_bucket > 0) {
        double exposed = overlapped_reduce_seconds(c, m, t_backward, dp_size, overlap.reduce_bucket, &c->reduce_total,
                                                   &messages);
        c->reduce_hidden = c->reduce_total - exposed;
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
        c->gather_hidden = c->gather_total - exposed;
        charge(c, "ZeRO all-gather, buckets: exposed", messages, 0.0, (dp_size - 1.0) * shard * x, exposed);
        c->bytes_sent[GROUP_DP] += (dp_size - 1.0) * shard * x;
    } else if (dp_size > 1) {
        charge_message(c, "ZeRO all-gather", GROUP_DP, dp_size - 1.0, (dp_size - 1.0) * shard * x);
    }
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
    int tp, pp, dp, micro_batches, peak_stage, slowest_stage;
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
    L.step_seconds = (L.micro_batches + L.pp - 1) * L.slot_seconds + L.optimizer_seconds;
    L.bubble = (L.pp - 1.0) / (L.micro_batches + L.pp - 1.0);
    double flops = flops_per_step(&a->model, a->global_batch_size, recomputed_layers(a));
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
    printf("dry-run: world %d TP %d PP %d DP %d MBS %d GBS %d: peak memory per GPU %.1f GiB (stage %d), step ",
           L->tp * L->pp * L->dp, L->tp, L->pp, L->dp, a->micro_batch_size, a->global_batch_size,
           L->peak_bytes / (1 << 30), L->peak_stage);
    print_seconds(L->step_seconds);
    printf(" s, %.1f TFLOPs per GPU, bubble %.1f%%%s\n", L->tflops_per_gpu, 100.0 * L->bubble,
           L->out_of_memory ? " OOM" : "");
}

// --hw's preset name
static const char* hw_name(const Config* a, char* out, size_t len) {
    for (int k = 0; k < NUM_RUN_FIELDS; k++)
        if (strcmp(RUN_FIELDS[k].name, "hw") == 0) choice_name(&RUN_FIELDS[k], a->hw < 0 ? HW_A100_80GB : a->hw, out, len);
    return out;
}

static void print_hardware(const Config* a, const Hardware* hw) {
    char name[32];
    int reduce = a->overlap_grad_reduce && data_parallel_size(a) > 1, gather = a->overlap_param_gather && data_parallel_size(a) > 1;
    printf("cost model (--hw %s): %.0f TFLOP/s dense peak x %.2f matmul efficiency, %.0f GB/s memory, %.1f GiB "
           "(%.1f left to CUDA, cuBLAS and NCCL), NVLink %.0f GB/s, network %.2f GB/s per GPU, %d GPUs per node, "
           "%.1f us per message; %s\n", hw_name(a, name, sizeof(name)), hw->peak_tflops,
           hw->matmul_efficiency, hw->memory_bandwidth, hw->memory_gib, hw->reserve_gib, hw->nvlink_bandwidth,
           hw->internode_bandwidth, hw->gpus_per_node, hw->latency_us,
           reduce && gather ? "nothing overlaps but the DP gradient reduce's and parameter all-gather's buckets"
           : reduce         ? "nothing overlaps but the DP gradient reduce's buckets"
           : gather         ? "nothing overlaps but the DP parameter all-gather's buckets"
                            : "nothing overlaps");
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

// --sweep: every layout of the world the model's shape and the batch allow, one line each,
// those that fit first, each part fastest first
typedef struct {
    LayoutPlan plan;
    int micro_batch_size;
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
            for (int mbs = 1; (W / tp) % pp == 0 && mbs <= a->global_batch_size / dp; mbs++) {
                if ((a->global_batch_size / dp) % mbs != 0) continue;
                Config b = *a;
                b.tensor_model_parallel_size = tp;
                b.pipeline_model_parallel_size = pp;
                b.micro_batch_size = mbs;
                b.model.padded_vocab_size = padded_vocab_size(b.model.vocab_size, b.model.make_vocab_size_divisible_by, tp);
                if (layout_error(&b, err, sizeof(err))) {
                    refused++;
                    continue;
                }
                if (count == capacity) {
                    capacity *= 2;
                    rows = (SweepRow*)reallocCheck(rows, capacity * sizeof(SweepRow));
                }
                rows[count].plan = plan_layout(&b, hw, NULL);
                rows[count].micro_batch_size = mbs;
                oom += rows[count].plan.out_of_memory;
                count++;
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
        print_layout_line(&b, &rows[k].plan);
    }
    free(rows);
}

// The same layout with recomputation the other way round (none, or every layer's: Megatron-
// DeepSpeed's --checkpoint-activations), so the plan shows what it costs and what it saves
static void print_recomputation_alternative(const Config* a, const Hardware* hw) {
    Config other = *a;
    int recomputing = a->model.recompute_method != RECOMPUTE_NONE;
    other.model.recompute_method = recomputing ? RECOMPUTE_NONE : RECOMPUTE_UNIFORM;
    other.model.recompute_num_layers = 1;
    LayoutPlan L = plan_layout(&other, hw, NULL);
    printf("%s: peak memory per GPU %.1f GiB (stage %d), step ", recomputing ? "without activation recomputation" :
           "with every layer recomputed (--checkpoint-activations)", L.peak_bytes / (1 << 30), L.peak_stage);
    print_seconds(L.step_seconds);
    printf(" s, %.1f TFLOPs per GPU%s\n", L.tflops_per_gpu, L.out_of_memory ? " OOM" : "");
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
        if (p == 0) print_memory_header(&s);
        print_memory_row("planned", &s, 1);
    }
    double flops = flops_per_step(&a->model, a->global_batch_size, recomputed_layers(a));
    Hardware hw = hardware_of(a);
    StageCost* slowest = (StageCost*)mallocCheck(sizeof(StageCost));
    LayoutPlan L = plan_layout(a, &hw, slowest);
    printf("model FLOPs per step: %.4g (global batch %d; Narayanan et al. 2021, recomputation included)\n", flops,
           a->global_batch_size);
    printf("1F1B bubble: (p - 1) / (m + p - 1) = %d / %d = %.1f%% of the step, m = %d micro-batches per pipeline\n",
           PP - 1, micro + PP - 1, 100.0 * L.bubble, micro);
    print_comm(L.bytes_sent);
    print_hardware(a, &hw);
    print_stage_costs(slowest, L.slowest_stage, micro);
    printf("step = (m + p - 1) x the slowest stage's micro-batch + the slowest optimizer step = %d x %.4g s + %.4g s\n",
           micro + PP - 1, L.slot_seconds, L.optimizer_seconds);
    if (a->overlap_grad_reduce && DP > 1)
        printf("--overlap-grad-reduce on stage %d: its bucketed reduces take %.3f ms, %.3f ms of them hidden behind the "
               "last micro-batch's backward\n", L.slowest_stage, 1e3 * slowest->reduce_total, 1e3 * slowest->reduce_hidden);
    if (a->overlap_param_gather && DP > 1)
        printf("--overlap-param-gather on stage %d: its bucketed broadcasts take %.3f ms, %.3f ms of them hidden behind the "
               "next step's first forward\n", L.slowest_stage, 1e3 * slowest->gather_total, 1e3 * slowest->gather_hidden);
    print_recomputation_alternative(a, &hw);
    if (L.out_of_memory)
        printf("does not fit: %.1f GiB of ours + %.1f GiB left to CUDA, cuBLAS and NCCL > %.1f GiB\n",
               L.peak_bytes / (1 << 30), hw.reserve_gib, hw.memory_gib);
    free(slowest);
    print_layout_line(a, &L);
}

static void dry_run_and_exit(Config* a) {
    a->model.padded_vocab_size = padded_vocab_size(a->model.vocab_size, a->model.make_vocab_size_divisible_by,
                                                   a->tensor_model_parallel_size);
    Hardware hw = hardware_of(a);
    if (grid.world_rank == 0 && a->sweep) dry_run_sweep(a, &hw);
    if (grid.world_rank == 0 && !a->sweep) dry_run_report(a);
    fflush(stdout);
    grid_finish();
    exit(0);
}

// the model, the optimizer and the grid they live on (every check has passed)
// The model of this rank planned (nothing allocated) and its memory, and the sample index's,
// checked against what there is. (It follows open_data_files, which settles the vocabulary
// --vocab-size 0 takes from the data and plans the index without building it.)
static void plan_model(Trainer* t) {
    Config* a = &t->config;
    GPTConfig* c = &a->model;
    start_grid(a);
    const char* table_flags = "--num-layers, --hidden-size, --ffn-hidden-size, --vocab-size, --max-position-embeddings "
                              "(less with more tensor- and pipeline-parallel ranks)";
    PipelineStage stage = this_stage(a);
    double table_entries = 8.0 + 12.0 * stage.num_layers, have;
    const char* where;
    char table_err[512] = "";   // the host's memory decides: ranks on different hosts may differ
    have = memory_available(&where);
    if (table_entries > INT32_MAX || table_entries * (sizeof(TensorDesc) + 2 * sizeof(LayerActivations)) > have)
        error_line(table_err, sizeof(table_err), "--num-layers %d: the tensor table alone of a pipeline stage would take "
                   "%.1f GiB, but %s %.1f GiB", c->num_layers, table_entries * sizeof(TensorDesc) / (1 << 30), where,
                   have / (1 << 30));
    config_error_anywhere(table_err);
    BuildTarget build = this_build();
    build.flash_attention = runs_flash_attention(a, GPU_BUILD);
    gpt_plan_model(&t->model, c, a->micro_batch_size, c->seq_length, grid.tp_rank, grid.tp_size, stage, grid.pp_size,
                   grid.dp_size, build);
    StageMemory planned = stage_memory(&t->model, stage, grid.dp_size);
    check_memory(&planned, table_flags);
    double model_bytes = GPU_BUILD ? 0.0 : (double)(planned.params + planned.grads + planned.optimizer +
                                                    planned.activations + planned.workspaces);
    check_index_memory(data_splits_index_bytes(&t->data), model_bytes);
}

// the planned model, its optimizer and its communication helpers, allocated
static void build_model(Trainer* t) {
    Config* a = &t->config;
    size_t before = dev_bytes_allocated;
    gpt_allocate(&t->model);
    AdamWConfig adam = {a->adam_beta1, a->adam_beta2, a->adam_eps, a->weight_decay, a->clip_grad};
    t->adam = adam;
    adamw_init(&t->opt, &t->model);
    grad_reducer_init(&t->model, t->opt.grad, t->opt.shard_size, a->overlap_grad_reduce, grad_bucket_size(a, grid.dp_size));
    param_gatherer_init(&t->model, t->opt.shard_size, a->overlap_param_gather, grad_bucket_size(a, grid.dp_size));
    pipeline_link_init(!a->no_overlap_p2p_communication, t->model.num_slots + 1);   // the slots' outputs and dres
    t->allocated_bytes = dev_bytes_allocated - before + kernels_workspace_bytes;   // kernels_init's came first
    t->opt.scaler = make_loss_scaler(a);
}

// the checkpoint's weights (and optimizer state, counters) into the built model
static void resume(Trainer* t, const char* ckpt, const CheckpointMeta* meta) {
    const Config* a = &t->config;
    int with_optim = !a->no_load_optim && !a->finetune;
    double t0 = now_seconds(), gb = checkpoint_load(meta, &t->model, &t->opt, with_optim);
    if (!a->finetune) t->progress = meta->progress;
    if (!a->finetune && a->save && strcmp(a->save, a->load) == 0) t->last_saved = meta->progress.iteration;   // it is there
    if (grid.world_rank == 0) {
        double s = now_seconds() - t0;
        printf("loaded checkpoint %s (iteration %d%s): %.3f GB in %.2f s (%.2f GB/s)\n", ckpt, meta->progress.iteration,
               a->finetune ? ", weights only: --finetune" : with_optim ? "" : ", without optimizer state", gb, s, gb / s);
        if (!meta->text_checked)
            printf("note: %s/metadata.txt has no checksum line (written before gridgpt added it): its counters were "
                   "checked against each other only\n", ckpt);
        fflush(stdout);
    }
}

// --tensorboard-dir: rank 0's event file, created once every check has passed (a refused run
// leaves none); its directory was checked by check_paths
static void open_tensorboard(Trainer* t) {
    char err[4700] = "";
    int rc = 0;
    if (t->config.tensorboard_dir && grid.world_rank == 0)
        rc = tensorboard_open(&t->tensorboard, t->config.tensorboard_dir, report_error, err, sizeof(err));
    broadcast_host(&grid.world, &rc, sizeof(rc), 0);
    if (rc) config_error("%s", err);
}

static void trainer_setup(Trainer* t, int argc, char** argv) {
    memset(t, 0, sizeof(*t));
    Config* a = &t->config;
    set_defaults(a);
    char err[1024];
    parse_flags(a, argc, argv, err, sizeof(err));
    config_error_anywhere(err);
    check_same_config_everywhere(a);   // from here on every rank reaches the same verdicts on the flags
    if (a->help || a->help_markdown) {
        if (grid.world_rank == 0 && a->help) print_usage(a);
        else if (grid.world_rank == 0) print_usage_markdown(a);
        grid_finish();
        exit(0);
    }
    if (a->export_hf) export_and_exit(a);
    ClusterCheck cluster_check = cluster_check_config(a);
    if (a->check_cluster && a->data_path.count == 0) check_cluster_and_exit(a, &cluster_check);
    check_model(a);
    check_run(a);
    setup_schedules(t);
    if (a->dry_run) dry_run_and_exit(a);
    // data: Megatron's sample counts per split
    long long eval_batches = (long long)(t->train_iters / a->eval_interval + 1) * a->eval_iters;
    int64_t samples[3] = {a->train_iters > 0 ? (int64_t)a->train_iters * a->global_batch_size : a->train_samples,
                          eval_batches * a->global_batch_size, (long long)a->eval_iters * a->global_batch_size};
    char ckpt[4300];
    CheckpointMeta meta;
    memset(&meta, 0, sizeof(meta));
    check_paths(a);
    find_checkpoint(a, ckpt, sizeof(ckpt), &meta);
    open_data_files(&t->data, a, samples);
    a->model.padded_vocab_size = padded_vocab_size(a->model.vocab_size, a->model.make_vocab_size_divisible_by,
                                                   a->tensor_model_parallel_size);
    if (ckpt[0]) check_config_matches(ckpt, &meta.cfg, &a->model);
    if (a->check_cluster) {   // every input is checked: now the cluster, then the run
        start_grid(a);
        check_cluster(&cluster_check);
    }
    plan_model(t);
    build_data_index(&t->data, a);
    build_model(t);
    t->last_saved = -1;
    if (ckpt[0]) resume(t, ckpt, &meta);
    record_batch_schedule(t);
    checkpoint_meta_free(&meta);
    t->train = make_loader(&t->data, 0, a);
    t->valid = make_loader(&t->data, 1, a);
    t->valid.consumed = t->progress.consumed_valid_samples;
    t->test = make_loader(&t->data, 2, a);
    open_tensorboard(t);
    print_setup(t);
}

static void trainer_free(Trainer* t) {
    tensorboard_close(&t->tensorboard);
    free_loader(&t->train);
    free_loader(&t->valid);
    free_loader(&t->test);
    grad_reducer_free();
    param_gatherer_free();
    pipeline_link_free();
    adamw_free(&t->opt, &t->model);
    gpt_free(&t->model);
    data_splits_close(&t->data);
}

// Test-only faults, from the environment (tests/test_watchdog.sh): GRIDGPT_TEST_HANG_RANK=R
// with GRIDGPT_TEST_HANG_ITERATION=K makes rank R stop for good at the start of iteration K
// (a frozen process: the watchdog must name it), GRIDGPT_TEST_KILL_RANK=R kills it there
// with SIGKILL (a dead process: the job must end). GRIDGPT_TEST_SLOW_RANK and
// GRIDGPT_TEST_SLOW_FACTOR: parallel.h's test_slow_rank.
static void test_faults_in_step(const Trainer* t) {
    const char* at = getenv("GRIDGPT_TEST_HANG_ITERATION");
    if (!at || atoi(at) != t->progress.iteration + 1) return;
    if (test_rank_is("GRIDGPT_TEST_KILL_RANK")) raise(SIGKILL);
    if (test_rank_is("GRIDGPT_TEST_HANG_RANK"))
        for (;;) sleep(60);
}

// One training step: the micro-batches of the current global batch, forward and backward,
// then the optimizer at the learning rate of the samples consumed so far.
static StepResult train_step(Trainer* t) {
    StepResult r;
    memset(&r, 0, sizeof(r));
    GPT* m = &t->model;
    r.global_batch = current_global_batch_size(&t->batch, t->progress.consumed_samples);
    int num_micro = r.global_batch / t->batch.micro_batch_times_dp;
    add_comm_counters(r.comm, -1.0);
    dev_zero(m->grads, m->num_params_padded * sizeof(float));
    t->train.consumed = t->progress.consumed_samples;
    activity_phase("forward and backward", t->progress.iteration + 1, -1);
    test_faults_in_step(t);
    // d(loss)/d(token loss), times the loss scale: the backward carries scaled gradients
    Schedule s = {m, load_micro_batch, &t->train, t->opt.scaler.scale / ((float)m->T * r.global_batch), 0, 0};
    run_1f1b(&s, num_micro);
    r.loss = step_loss(&s, num_micro);
    r.max_in_flight = s.max_in_flight;
    r.nan_loss = !isfinite(r.loss);
    float lr = learning_rate(&t->lr, t->progress.scheduler_samples);
    activity_phase("optimizer", t->progress.iteration + 1, -1);
    r.grad_norm = optimizer_step(&t->model, &t->opt, &t->adam, lr, &r.skipped);
    t->progress.consumed_samples += r.global_batch;
    if (!r.skipped) t->progress.scheduler_samples += r.global_batch;
    t->progress.iteration++;
    r.lr = learning_rate(&t->lr, t->progress.scheduler_samples);   // Megatron logs the rate set for the next step
    add_comm_counters(r.comm, 1.0);
    return r;
}

// Megatron's log line, with averages over the steps since the last one
typedef struct {
    int steps, skipped, nan_loss;
    double loss_sum, seconds, waited;   // waited: in blocking operations (the rest is compute)
    long long samples;
} LogWindow;

// --log-comm: the last step's
static void log_comm(const StepResult* r) {
    double most[4] = {r->comm[0], r->comm[1], r->comm[2], r->comm[3]};
    all_reduce_host(&grid.world, most, 4, REDUCE_MAX);
    if (grid.world_rank == 0) print_comm(most);
}

// a value as a TensorBoard scalar at this iteration and, as "TAG vs samples", at the samples
// consumed so far (the two curves Megatron's --log-*-to-tensorboard write)
static void tensorboard_pair(Trainer* t, const char* tag, double value) {
    char vs_samples[256];
    snprintf(vs_samples, sizeof(vs_samples), "%s vs samples", tag);
    tensorboard_scalar(&t->tensorboard, tag, value, t->progress.iteration);
    tensorboard_scalar(&t->tensorboard, vs_samples, value, t->progress.consumed_samples);
}

// The log line, and with --tensorboard-dir the same values under Megatron-LM's tags (rank 0
// prints the line and writes the events: the loss and the norm are known on every rank)
static void log_step(Trainer* t, const StepResult* r, LogWindow* w) {
    if (t->config.log_comm) log_comm(r);
    if (grid.world_rank != 0) return;
    double ms = 1000.0 * w->seconds / w->steps, samples_per_second = w->samples / w->seconds;
    double tflops = flops_per_step(&t->config.model, r->global_batch, recomputed_layers(&t->config)) /
                    (ms / 1000.0) / 1e12 / grid.world_size;
    double loss = w->steps > w->nan_loss ? w->loss_sum / (w->steps - w->nan_loss) : NAN;
    printf(" iteration %8d/%8d | consumed samples: %12lld | elapsed time per iteration (ms): %.1f |"
           " learning rate: %.6E | global batch size: %5d | lm loss: %.6E | loss scale: %.1f | grad norm: %.3f |"
           " number of skipped iterations: %3d | number of nan iterations: %3d |"
           " samples per second: %.3f | TFLOPs: %.3f |\n",
           t->progress.iteration, t->train_iters, t->progress.consumed_samples, ms, r->lr, r->global_batch, loss,
           t->opt.scaler.scale, r->grad_norm, w->skipped, w->nan_loss, samples_per_second, tflops);
    fflush(stdout);
    tensorboard_pair(t, "lm loss", loss);
    tensorboard_pair(t, "learning-rate", r->lr);
    tensorboard_pair(t, "batch-size", r->global_batch);
    if (t->config.fp16) tensorboard_pair(t, "loss-scale", t->opt.scaler.scale);
    tensorboard_pair(t, "grad-norm", r->grad_norm);
    tensorboard_pair(t, "iteration-time", ms / 1000.0);   // seconds, as Megatron's
    tensorboard_pair(t, "samples-per-second", samples_per_second);
    tensorboard_pair(t, "throughput", tflops);            // Megatron's tag for TFLOP/s per GPU
    tensorboard_pair(t, "mem-max-rss-bytes", peak_rss_gib() * 1073741824.0);
    tensorboard_flush(&t->tensorboard);
}

// ----------------------------------------------------------------------------
// sampling: feed the context, draw the next token from softmax(logits / temperature)

static uint64_t sample_state;
static double uniform01(void) {
    sample_state = splitmix64(sample_state);
    return (sample_state >> 11) * (1.0 / 9007199254740992.0);
}

static int sample_next(const float* logits, int V, float temperature) {
    double maxv = -INFINITY, sum = 0.0;
    for (int v = 0; v < V; v++) maxv = logits[v] > maxv ? logits[v] : maxv;
    for (int v = 0; v < V; v++) sum += exp((logits[v] - maxv) / temperature);
    double u = uniform01() * sum, acc = 0.0;
    for (int v = 0; v < V; v++) {
        acc += exp((logits[v] - maxv) / temperature);
        if (acc >= u) return v;
    }
    return V - 1;
}

static void print_token(int token, int vocab) {
    if (vocab > BYTE_VOCAB_SIZE) printf("%d ", token);
    else if (token == BYTE_EOD) printf("\n<|endoftext|>\n");
    else putchar(token);
}

// Sampling reuses the training arena for one sequence of the context's length: the model
// runs on m->B x m->T tokens, and any smaller shape fits the arena (it is set back after).
static void generate(Trainer* t) {
    GPT* m = &t->model;
    int B = m->B, T = m->T, V = t->config.model.vocab_size;
    int* ctx = (int*)callocCheck(T, sizeof(int));
    float* logits = (float*)mallocCheck((size_t)m->vocab_local * sizeof(float));
    const char* prompt = t->config.generate_prompt ? t->config.generate_prompt : "";
    int len = 0;
    if (V <= BYTE_VOCAB_SIZE)
        for (const char* p = prompt; *p && len < T; p++) ctx[len++] = (unsigned char)*p;
    if (len == 0) ctx[len++] = V > BYTE_EOD ? BYTE_EOD : 0;   // start of a document
    sample_state = (uint64_t)t->config.model.seed;
    printf("---------- sample (%d tokens, temperature %.2f) ----------\n%s", t->config.generate_tokens,
           t->config.temperature, prompt);
    for (int i = 0; i < t->config.generate_tokens; i++) {
        m->B = 1;
        m->T = len;
        host_to_dev(m->slots[0].tokens, ctx, len * sizeof(int));
        host_to_dev(m->slots[0].targets, ctx, len * sizeof(int));
        gpt_forward(m, 0);
        dev_floatX_to_floats(logits, m->logits + (size_t)(len - 1) * m->vocab_local, m->vocab_local);
        int next = sample_next(logits, V, t->config.temperature);
        print_token(next, V);
        if (len == T) {   // slide the window
            memmove(ctx, ctx + 1, (T - 1) * sizeof(int));
            len--;
        }
        ctx[len++] = next;
    }
    printf("\n------------------------------------------------------\n");
    m->B = B;
    m->T = T;
    free(ctx);
    free(logits);
}

// ----------------------------------------------------------------------------
// the run

// the valid (split 1) or test (split 2) loss, printed; NAN where the split is absent
static float run_evaluation(Trainer* t, int split, const char* what) {
    if (t->config.eval_iters == 0 || !data_splits_has(&t->data, split)) return NAN;
    Loader* l = split == 1 ? &t->valid : &t->test;
    activity_phase(split == 1 ? "validation" : "test", t->progress.iteration, -1);
    float loss = evaluate(&t->model, l, t->config.eval_iters, t->config.global_batch_size);
    print_eval(what, loss);
    if (split == 1) {   // the test loss is printed, not written
        tensorboard_pair(t, "lm loss validation", loss);
        tensorboard_pair(t, "lm loss validation ppl", exp(loss));
        tensorboard_flush(&t->tensorboard);
    }
    return loss;
}

// SIGTERM and SIGUSR1 (what SLURM sends before a time limit), SIGINT (Ctrl-C) and SIGHUP (a
// closed terminal) ask for a save and an exit after the current step; the same signal a
// second time ends the run at once (a user who presses Ctrl-C twice means it).
static volatile sig_atomic_t stop_requested = 0;   // the signal's number
static void request_stop(int sig) {
    stop_requested = sig;
    signal(sig, SIG_DFL);
}

static const char* signal_name(int sig) {
    return sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : "a signal";
}

static void save_checkpoint_once(Trainer* t) {
    if (!t->config.save || t->last_saved == t->progress.iteration) return;
    t->progress.consumed_valid_samples = t->valid.consumed;
    activity_phase("saving a checkpoint", t->progress.iteration, -1);
    t->last_save_failed = checkpoint_save(t->config.save, &t->model, &t->opt, &t->progress, t->config.keep_last);
    t->last_saved = t->progress.iteration;
}

// After a step: save at --save-interval; save and stop on a signal, at --exit-interval or
// after --exit-duration-in-mins. Every rank takes the same decision (a signal may reach
// only some ranks, clocks differ). Returns 1 to stop.
static int after_step(Trainer* t, double start) {
    const Config* a = &t->config;
    int it = t->progress.iteration, at_exit_interval = a->exit_interval > 0 && it % a->exit_interval == 0;
    // the reason, as the whole world sees it: a signal (the highest rank it reached, and which
    // signal, as rank * 64 + signal), else --exit-interval (the same on every rank), else time
    int signalled = max_over_world(stop_requested ? grid.world_rank * 64 + stop_requested : 0);
    int out_of_time = max_over_world(a->exit_duration_in_mins > 0 && now_seconds() - start > 60.0 * a->exit_duration_in_mins);
    int stop = signalled || at_exit_interval || out_of_time;
    if (stop || (a->save_interval > 0 && it % a->save_interval == 0)) save_checkpoint_once(t);
    if (stop && grid.world_rank == 0) {
        char reason[128];
        if (signalled)
            snprintf(reason, sizeof(reason), "%s on rank %d", signal_name(signalled % 64), signalled / 64);
        else snprintf(reason, sizeof(reason), "%s", at_exit_interval ? "--exit-interval" : "--exit-duration-in-mins");
        printf("stopping at iteration %d (%s)%s\n", it, reason,
               !a->save ? "" : t->last_save_failed ? ", checkpoint not saved" : ", checkpoint saved");
        fflush(stdout);
    }
    return stop;
}

// on_step, if given, sees every step's result (the tests record runs through it)
typedef void (*StepHook)(const Trainer* t, const StepResult* r, void* ctx);

static void trainer_run(Trainer* t, StepHook on_step, void* ctx) {
    LogWindow w;
    memset(&w, 0, sizeof(w));
    double start = now_seconds(), train_seconds = 0.0, last_loss = NAN;
    long long tokens_start = t->progress.consumed_samples;
    int in_flight = 0;   // most micro-batches any stage held at once (1F1B: at most PP)
    int stop_signals[] = {SIGTERM, SIGUSR1, SIGINT, SIGHUP};
    for (int i = 0; i < 4; i++) signal(stop_signals[i], request_stop);
    while (t->progress.iteration < t->train_iters) {
        double t0 = now_seconds(), waited0 = seconds_waited();
        StepResult r = train_step(t);
        // the step's AdamW and all-gather are only queued on a GPU: count them in this step (an
        // overlapped all-gather, --overlap-param-gather, in the next: its forward waits for it)
        compute_synchronize();
        test_slow_rank(now_seconds() - t0 - (seconds_waited() - waited0));
        double dt = now_seconds() - t0;
        w.waited += seconds_waited() - waited0;
        if (on_step) on_step(t, &r, ctx);
        train_seconds += dt;
        w.steps++;
        w.seconds += dt;
        w.samples += r.global_batch;
        w.skipped += r.skipped;
        w.nan_loss += r.nan_loss;
        if (!r.nan_loss) w.loss_sum += r.loss;
        last_loss = r.loss;
        in_flight = r.max_in_flight > in_flight ? r.max_in_flight : in_flight;
        if (t->progress.iteration % t->config.log_interval == 0 || t->progress.iteration == t->train_iters) {
            log_step(t, &r, &w);
            slow_rank_report((w.seconds - w.waited) / w.steps, w.waited / w.steps, t->config.slow_rank_threshold);
            memset(&w, 0, sizeof(w));
        }
        if (t->progress.iteration % t->config.eval_interval == 0 && t->progress.iteration < t->train_iters) {
            char what[64];
            snprintf(what, sizeof(what), "validation loss at iteration %d", t->progress.iteration);
            run_evaluation(t, 1, what);
        }
        if (after_step(t, start)) return;
    }
    save_checkpoint_once(t);
    float valid_loss = run_evaluation(t, 1, "validation loss at the end of training");
    run_evaluation(t, 2, "test loss at the end of training");
    in_flight = max_over_world(in_flight);
    watchdog_stop();   // sampling below runs on rank 0 alone, the others wait to finish
    if (grid.world_rank == 0) {
        int it = t->progress.iteration;
        long long samples = t->progress.consumed_samples - tokens_start;
        double tokens = (double)samples * t->config.model.seq_length;
        printf("summary: %d iterations, %lld samples (%.0f tokens) in %.1f s of training (%.1f s in all): "
               "%.0f tokens/s, %.1f ms per iteration; final lm loss %.4f; peak memory %.2f GiB (rank 0); "
               "at most %d micro-batch(es) in flight on a pipeline stage\n",
               it, samples, tokens, train_seconds, now_seconds() - start, train_seconds > 0 ? tokens / train_seconds : 0.0,
               it ? 1000.0 * train_seconds / it : 0.0, last_loss, peak_rss_gib(), in_flight);
        if (t->config.unigram_baseline) {
            double h = data_splits_unigram_entropy(&t->data, t->config.model.vocab_size);
            printf("validation loss %.4f nats/token vs unigram (order-0) entropy of the train split %.4f nats/token: "
                   "%.1f%% of it\n", valid_loss, h, 100.0 * valid_loss / h);
        }
        fflush(stdout);
        if (t->config.generate_tokens > 0) generate(t);
    }
}

#ifndef TESTING
int main(int argc, char** argv) {
    grid_start(&argc, &argv);
    Trainer* t = (Trainer*)callocCheck(1, sizeof(Trainer));
    trainer_setup(t, argc, argv);
    trainer_run(t, NULL, NULL);
    int status = t->last_save_failed;   // 1: the run's last checkpoint could not be saved
    trainer_free(t);
    free(t);
    grid_finish();
    return status;
}
#endif
