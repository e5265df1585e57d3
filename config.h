/*
config.h — the run's configuration: the model's fields (gpt.h's list) and the run's, each
declared once, and everything that reads them before any work is done.

  - RUN_CONFIG_FIELDS and the Config struct; flags (Megatron-LM's names; numbers as Python
    writes them too), --help and --help-markdown (docs/flags.md), the range checks, the same
    flags on every rank; Megatron's flags through megatron_flags.h's tables, and the start-up
    notes of those accepted and of Megatron-LM's defaults gridgpt does not apply;
  - every config check, one line each and exit status 2 before anything is allocated: the
    grid, the model, the precision, recomputation, the run; the pipeline's stage layout;
  - what a config costs: the layers recomputed and the FLOPs of one step (Narayanan et al.).

Interface (what train.c and plan.h use): Config, set_defaults, parse_flags, print_megatron_notes,
print_usage, print_usage_markdown, check_same_config_everywhere, check_grid, check_model, check_precision,
check_recompute, check_run, check_profile, profiles_rank, make_loss_scaler, stage_layers, pipeline_stage, this_stage,
data_parallel_size, layout_error, plans_gpu_build, set_padded_vocab_size, recomputed_layers, recomputed_attention_cores,
flops_per_step.
*/
#pragma once

// ----------------------------------------------------------------------------
// the configuration: the model's fields (gpt.h's list) and the run's, each declared once
// X(kind, name, default, min, help), as gpt.h's list without its checkpoint columns. The
// Config struct, the flags (Megatron-LM's names and defaults; where Megatron has no default,
// a small model), --help and the range checks walk both lists.

#define RUN_CONFIG_FIELDS(X)                                                                                          \
    X(INT, tensor_model_parallel_size, "1", 1, "TP: tensor-parallel ranks of one model replica")                      \
    X(INT, pipeline_model_parallel_size, "1", 1, "PP: pipeline stages")                                                \
    X(INT, context_parallel_size, "1", 1, "CP: context-parallel ranks; each holds 2 of every sequence's 2 CP chunks")  \
    X(INT, expert_model_parallel_size, "1", 1, "EP: the ranks each MoE layer's experts are split over, taken from "       \
      "the data-parallel (x context-parallel) ranks")                                                                  \
    X(CHOICE, cp_comm_type, "p2p", 0, "p2p | all_gather | a2a (CP's keys and values round a ring, or gathered once; "  \
      "a2a, Ulysses', is refused)")                                                                                    \
    X(CHOICE, pp_partition_method, "uniform", 0, "uniform | type:transformer | type:transformer|embedding")            \
    X(INT, decoder_first_pipeline_num_layers, NULL, 0, "layers of the first stage (0: not set)")                      \
    X(INT, decoder_last_pipeline_num_layers, NULL, 0, "layers of the last stage (0: not set)")                        \
    X(INT, num_layers_per_virtual_pipeline_stage, NULL, 0, "N: interleaved 1F1B, each stage's layers in model chunks of N " \
      "(0: plain 1F1B)")                                                                                               \
    X(INT, num_virtual_stages_per_pipeline_rank, NULL, 0, "v: interleaved 1F1B, v model chunks per stage (uneven stages "  \
      "too; 0: plain 1F1B)")                                                                                           \
    X(INT, microbatch_group_size_per_virtual_pipeline_stage, NULL, 0, "G: interleaved 1F1B takes the micro-batches G at " \
      "a time per model chunk, PP <= G <= micro-batches (0: PP)")                                                      \
    X(CHOICE, pipeline_schedule, "1f1b", 0, "1f1b | gpipe | zb-h1 (gpipe: all forwards, then all backwards; zb-h1: "     \
      "the weight gradients deferred into the bubble, Qi et al. 2023)")                                                \
    X(INT, micro_batch_size, "4", 1, "samples per micro-batch")                                                        \
    X(INT, global_batch_size, NULL, 0, "samples per step (0: micro-batch x DP)")                                       \
    X(INT3, rampup_batch_size, NULL, 0, "START INCREMENT SAMPLES: ramp the global batch up")                           \
    X(SWITCH, checkpoint_activations, NULL, 0, "= --recompute-granularity full --recompute-method uniform")            \
    X(SWITCH, recompute_activations, NULL, 0, "= --recompute-granularity selective (Megatron-LM's)")                   \
    X(CHOICE, recompute_granularity, "none", 0, "none | full | selective (selective: the attention core alone)")        \
    X(CHOICE, recompute_method, "none", 0, "none | uniform | block (which layers: see --recompute-num-layers)")        \
    X(INT, recompute_num_layers, NULL, 1, "N: uniform: layers per chunk; block: first N layers of a stage (1)")        \
    X(LIST, recompute_modules, NULL, 0, "MODULE [...]: what selective recomputes (Megatron-LM's names; here core_attn, " \
      "the default)")                                                                                                  \
    X(CHOICE, attention_backend, "auto", 0, "auto | flash | unfused (GPU build; auto: flash where the head size allows)") \
    X(CHOICE, bias_grad, "epilogue", 0, "epilogue | kernel (GPU build: the linear layers' bias gradients summed in " \
      "cuBLASLt's BGRADB epilogue, or by a kernel after the weight-gradient GEMM, llm.c's way)")                     \
    X(SWITCH, overlap_grad_reduce, NULL, 0, "reduce the DP gradients in buckets during the last backward (DP > 1)")  \
    X(SWITCH, overlap_param_gather, NULL, 0, "all-gather the updated parameters in buckets beside the next forward (DP > 1)") \
    X(INT, zero_stage, "1", 0, "ZeRO over DP x CP: 1 the optimizer state sharded (0: the same step), 2 the gradients " \
      "too, 3 the parameters too (FSDP), each layer gathered before its forward and backward")                     \
    X(SWITCH, no_reshard_after_forward, NULL, 0, "ZeRO-3: keep each layer gathered from its forward to the optimizer " \
      "step (FSDP2's reshard_after_forward=False; default: freed after the forward, gathered again for the backward)") \
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
    X(SWITCH, use_bnb_optimizer, NULL, 0, "Adam's m and v in 8 bits, block-wise dynamic quantization (Dettmers et al. " \
      "2021, bitsandbytes' Adam8bit; Megatron-DeepSpeed's flag): 2 bytes a parameter instead of 8")                      \
    X(FLOAT, weight_decay, "0.01", 0, "decoupled decay of matrices and embeddings")                                    \
    X(FLOAT, clip_grad, "1.0", 0, "clip the global gradient norm to this (0: off)")                                    \
    X(SWITCH, fp16, NULL, 0, "fp16 with loss scaling (GPU: train_gpu_fp16; CPU: the scaler on fp32)")                 \
    X(SWITCH, bf16, NULL, 0, "bf16 weights and activations (the GPU build's own precision)")                          \
    X(FLOAT, loss_scale, NULL, 0, "static loss scale with --fp16 (0: dynamic)")                                        \
    X(FLOAT, initial_loss_scale, "4294967296", 1, "the dynamic scale's start")                                         \
    X(FLOAT, min_loss_scale, "1", 0, "the dynamic scale's floor")                                                      \
    X(INT, loss_scale_window, "1000", 1, "clean steps before the dynamic scale doubles")                               \
    X(INT, hysteresis, "2", 1, "overflows tolerated before the dynamic scale halves")                                  \
    X(LIST, data_path, NULL, 0, "[WEIGHT] PREFIX [...]: Megatron .bin/.idx dataset(s), split by --split")              \
    X(LIST, train_data_path, NULL, 0, "[WEIGHT] PREFIX [...]: the training data alone (with the two below, no --split)") \
    X(LIST, valid_data_path, NULL, 0, "[WEIGHT] PREFIX [...]: the validation data alone")                             \
    X(LIST, test_data_path, NULL, 0, "[WEIGHT] PREFIX [...]: the test data alone")                                    \
    X(STRING, split, "969,30,1", 0, "train,valid,test document split")                                                 \
    X(STRING, data_cache_path, NULL, 0, "DIR for the sample-index cache (default: next to the data)")                  \
    X(INT, eval_interval, "1000", 1, "steps between evaluations")                                                      \
    X(INT, eval_iters, "100", 0, "global batches per evaluation (not given: at most one pass of the held-out split)")     \
    X(SWITCH, full_validation, NULL, 0, "evaluate every token of the valid and test splits once instead (in order, "    \
      "windows of --seq-length)")                                                                                      \
    X(SWITCH, unigram_baseline, NULL, 0, "report the data's order-0 entropy next to the loss")                         \
    X(INT, log_interval, "100", 1, "steps between log lines")                                                          \
    X(SWITCH, log_comm, NULL, 0, "log the bytes each group's communication sent per step")                             \
    X(SWITCH, log_throughput, NULL, 0, "the log line's throughput per GPU (TFLOP/s/GPU), as Megatron-LM's")              \
    X(SWITCH, log_memory_bytes, NULL, 0, "print the memory table in bytes too, with what dev_malloc handed out")       \
    X(INT, watchdog_timeout, "600", 0, "end the job, saying where every rank is, after S s without progress (0: off)") \
    X(INT, watchdog_io_timeout, "3600", 1, "the watchdog's S while a checkpoint is saved or loaded (a slow fsync)")     \
    X(FLOAT, slow_rank_threshold, "1.5", 0, "name a rank computing, or a link moving, X x its peers' median (0: off)")  \
    X(STRING, tensorboard_dir, NULL, 0, "DIR: write the log line's values as TensorBoard events here")                 \
    X(SWITCH, profile, NULL, 0, "record a timeline of every rank's steps: a Chrome trace (docs/profiling.md)")          \
    X(INT, profile_step_start, "10", 0, "--profile starts with this many iterations done (Megatron-LM's count) ...")   \
    X(INT, profile_step_end, "12", 0, "... and stops with this many: it records the steps in between")               \
    X(LIST, profile_ranks, NULL, 0, "R [...]: the ranks --profile records (default: every rank)")                     \
    X(STRING, profile_dir, "profile", 0, "DIR where rank 0 writes --profile's trace_iterations_A-B.json")              \
    X(STRING, save, NULL, 0, "DIR: save checkpoints here")                                                             \
    X(STRING, load, NULL, 0, "DIR: resume from its latest checkpoint (any layout)")                                    \
    X(INT, save_interval, NULL, 0, "steps between checkpoints (0: only at the end)")                                   \
    X(INT, exit_interval, NULL, 0, "save and exit when the iteration is a multiple of this")                           \
    X(FLOAT, exit_duration_in_mins, NULL, 0, "save and exit after this many minutes (a fraction too)")                \
    X(INT, keep_last, NULL, 0, "keep only the newest N checkpoints (0: all)")                                          \
    X(SWITCH, no_load_optim, NULL, 0, "load weights and counters, not the optimizer state")                            \
    X(SWITCH, no_load_rng, NULL, 0, "use this run's --seed, not the checkpoint's")                                     \
    X(SWITCH, finetune, NULL, 0, "load weights only; iteration and data position start at 0")                          \
    X(SWITCH, override_opt_param_scheduler, NULL, 0, "resume with this run's learning-rate schedule, not the checkpoint's") \
    X(SWITCH, use_checkpoint_opt_param_scheduler, NULL, 0, "resume with the checkpoint's learning-rate schedule, whatever " \
      "the flags (else they must match it)")                                                                           \
    X(SWITCH, skip_train, NULL, 0, "no training: evaluate --load's checkpoint on the data, and/or generate from it")    \
    X(STRING, import_hf, NULL, 0, "DIR: a Hugging Face model into --save as an iteration-0 checkpoint, then exit")     \
    X(SWITCH, import_hf_dropout, NULL, 0, "with --import-hf: config.json's dropout (GPT-2's resid_pdrop, attn_pdrop) "  \
      "becomes the checkpoint's, a fine-tune's default (else --hidden-dropout's and --attention-dropout's, 0.1)")      \
    X(STRING, export_hf, NULL, 0, "OUT: write --load's latest checkpoint as a Hugging Face model, then exit")          \
    X(CHOICE, export_hf_architecture, "auto", 0, "auto | gpt2 | bloom | llama | mixtral | qwen2_moe (auto: by the "   \
      "positions, ALiBi or rope; rope with experts: qwen2_moe with a shared expert, a QKV bias or the pre-softmax "     \
      "router, else mixtral)")                                                                                         \
    X(INT, generate_tokens, NULL, 0, "generate at most this many tokens (after training, or alone with --skip-train)") \
    X(STRING, generate_prompt, NULL, 0, "text the generation starts from (bytes, or --tokenizer-type's; none: EOD)")   \
    X(STRING, generate_prompt_ids, NULL, 0, "ID,ID,...: token ids the generation starts from (instead of --generate-prompt)") \
    X(CHOICE, generate_output, "text", 0, "text | ids | both (ids: the prompt's and the new ids, comma-separated lines)") \
    X(INT, eod_id, "-1", -1, "the end-of-document id without --tokenizer-type (-1: the vocabulary's last from 257 ids)") \
    X(FLOAT, temperature, "1.0", 0, "sampling temperature (0: greedy, the most likely token)")                         \
    X(INT, top_k, NULL, 0, "sample among the K most likely tokens only (0: all; 1: greedy)")                          \
    X(FLOAT, top_p, NULL, 0, "sample among the most likely tokens whose probabilities add up to P (0: all)")          \
    X(LONG, generate_seed, NULL, 0, "the sampler's seed (0: --seed)")                                                 \
    X(SWITCH, generate_ignore_eod, NULL, 0, "go on past the end-of-document token (default: stop there)")             \
    X(SWITCH, no_cuda_graph, NULL, 0, "the GPU build's generation: each step of one token as plain launches, not a CUDA graph") \
    X(CHOICE, tokenizer_type, NULL, 0, "GPT2BPETokenizer (GPT-2's BPE encodes the prompt and decodes the sample)")     \
    X(STRING, vocab_file, NULL, 0, "VOCAB.json: GPT2BPETokenizer's vocabulary (GPT-2's encoder.json)")                 \
    X(STRING, merge_file, NULL, 0, "MERGES.txt: GPT2BPETokenizer's merges (GPT-2's vocab.bpe)")                        \
    X(SWITCH, check_cluster, NULL, 0, "measure bus bandwidths and matmuls, name outliers (no --data-path: only that)") \
    X(LIST, check_cluster_sizes, NULL, 0, "MIB [...]: --check-cluster's message sizes (default 1 16 64)")              \
    X(INT, check_cluster_matmul_size, NULL, 0, "N of --check-cluster's N x N matmul (0: 8192 GPU, 1024 CPU)")          \
    X(SWITCH, dry_run, NULL, 0, "plan this layout: each stage's memory, the FLOPs, the bubble; allocate nothing")      \
    X(INT, world_size, NULL, 0, "N: the world size --dry-run plans for (0: the launched size)")                        \
    X(SWITCH, sweep, NULL, 0, "with --dry-run: every (TP, CP, PP, DP, MBS; SP on and off at TP > 1; ZeRO 1-3) of the " \
      "world, fastest first")                                                                                           \
    X(SWITCH, print_schedule, NULL, 0, "with --dry-run: draw one step's pipeline schedule, a line per stage ('.': the bubble)") \
    X(FLOAT, moe_imbalance, NULL, 0, "X, with --dry-run: the busiest expert's tokens over its layer's mean, as a run logs " \
      "them (\"expert tokens max/mean\"; 0: 1, balanced)")                                                        \
    X(CHOICE, hw, NULL, 0, "v100-32gb | a100-40gb | a100-80gb | h100-80gb (default a100-80gb; train_cpu: this machine): the dry run's GPU")   \
    X(FLOAT, hw_peak_tflops, NULL, 0, "dense fp16/bf16 peak, TFLOP/s (0: --hw's)")                                      \
    X(FLOAT, hw_matmul_efficiency, NULL, 0, "the fraction of the peak large matmuls reach (0: --hw's)")                 \
    X(FLOAT, hw_attention_efficiency, NULL, 0, "the fraction of the peak the fused attention's products reach (0: --hw's)") \
    X(FLOAT, hw_memory_efficiency, NULL, 0, "the fraction of the memory bandwidth streaming kernels reach (0: --hw's)")  \
    X(INT, hw_sm_count, NULL, 0, "streaming multiprocessors per GPU: a matmul's waves of tiles (0: --hw's)")            \
    X(FLOAT, hw_memory_gib, NULL, 0, "GPU memory, GiB (0: --hw's)")                                                     \
    X(FLOAT, hw_memory_bandwidth, NULL, 0, "GPU memory bandwidth, GB/s (0: --hw's)")                                    \
    X(FLOAT, hw_l2_bandwidth, NULL, 0, "L2 cache bandwidth, GB/s: the fused attention's K/V re-reads (0: --hw's)")       \
    X(FLOAT, hw_memory_latency_us, NULL, 0, "microseconds per dependent memory trip: the column reductions (0: --hw's)") \
    X(FLOAT, hw_launch_us, NULL, 0, "microseconds between two kernel launches (0: --hw's)")                           \
    X(FLOAT, hw_nvlink_bandwidth, NULL, 0, "GB/s per GPU and direction inside a node (0: --hw's)")                     \
    X(FLOAT, hw_internode_bandwidth, NULL, 0, "GB/s per GPU and direction between nodes (0: --hw's)")                  \
    X(INT, hw_gpus_per_node, NULL, 0, "GPUs per node (0: --hw's)")                                                      \
    X(FLOAT, hw_latency_us, NULL, 0, "microseconds per message: a ring step or a send (0: --hw's)")                    \
    X(FLOAT, hw_reserve_gib, NULL, 0, "GiB per GPU left to CUDA, cuBLAS and NCCL (0: --hw's)")                          \
    X(CHOICE, dry_run_build, NULL, 0, "gpu | cpu (default: the binary's own, gpu with --hw or --hw-*): the build --dry-run plans")  \
    X(SWITCH, help, NULL, 0, "print this list")                                                                   \
    X(SWITCH, help_markdown, NULL, 0, "print this list as Markdown tables: docs/flags.md")

typedef enum { LR_CONSTANT, LR_LINEAR, LR_COSINE, LR_INVERSE_SQRT } LRDecayStyle;   // in --lr-decay-style's order
typedef enum { PARTITION_UNIFORM, PARTITION_TRANSFORMER, PARTITION_TRANSFORMER_EMBEDDING } PartitionMethod;   // --pp-partition-method
typedef enum { GRANULARITY_NONE, GRANULARITY_FULL, GRANULARITY_SELECTIVE } RecomputeGranularity;   // --recompute-granularity
typedef enum { PLAN_GPU_BUILD, PLAN_CPU_BUILD } DryRunBuild;   // --dry-run-build (-1, not given: plans_gpu_build)
typedef enum { ATTENTION_AUTO, ATTENTION_FLASH, ATTENTION_UNFUSED } AttentionBackend;   // --attention-backend
typedef enum { BIAS_GRAD_EPILOGUE, BIAS_GRAD_KERNEL } BiasGradWay;                        // --bias-grad
typedef enum { GENERATE_TEXT, GENERATE_IDS, GENERATE_BOTH } GenerateOutput;   // --generate-output
typedef enum { TOKENIZER_GPT2_BPE } TokenizerType;   // --tokenizer-type (-1, not given: bytes, or ids printed as numbers)

// a Megatron flag accepted as what gridgpt does (megatron_flags.h's row; the flag in argv, its values after it)
typedef struct { int row; char** at; int count; } MegatronGiven;
#define MAX_MEGATRON_GIVEN 64

#define COUNT_FIELD(kind, name, def, min, help) +1
typedef struct {
    GPTConfig model;
    RUN_CONFIG_FIELDS(DECLARE_FIELD)
    unsigned char model_given[NUM_MODEL_FIELDS];   // the model flags on the command line (the rest may come from --load)
    unsigned char run_given[0 RUN_CONFIG_FIELDS(COUNT_FIELD)];   // and the run's (a default that adapts: eval_iters)
    MegatronGiven megatron[MAX_MEGATRON_GIVEN];    // for the start-up notes (print_megatron_notes)
    int megatron_count;
    int sequence_parallel_off;   // --sequence-parallel given at TP 1, and turned off (as Megatron-LM does)
} Config;

#define DESCRIBE_RUN_FIELD(kind, name, def, min, help) \
    {#name, def, help, NULL, NULL, NULL, FIELD_##kind, offsetof(Config, name), min, NOT_STORED},
static const ConfigField RUN_FIELDS[] = {RUN_CONFIG_FIELDS(DESCRIBE_RUN_FIELD)};
#define NUM_RUN_FIELDS ((int)(sizeof(RUN_FIELDS) / sizeof(RUN_FIELDS[0])))

// whether a model flag was given (offset: the field's in GPTConfig)
static int model_field_given(const Config* c, size_t offset) {
    for (int k = 0; k < NUM_MODEL_FIELDS; k++)
        if (MODEL_FIELDS[k].offset == offset) return c->model_given[k];
    return 0;
}

// whether a run flag was given (offset: the field's in Config)
static int run_field_given(const Config* c, size_t offset) {
    for (int k = 0; k < NUM_RUN_FIELDS; k++)
        if (RUN_FIELDS[k].offset == offset) return c->run_given[k];
    return 0;
}

// field k of both lists (model fields first), and where its value lives in c
static const ConfigField* config_field(Config* c, int k, void** base) {
    *base = k < NUM_MODEL_FIELDS ? (void*)&c->model : (void*)c;
    return k < NUM_MODEL_FIELDS ? &MODEL_FIELDS[k] : &RUN_FIELDS[k - NUM_MODEL_FIELDS];
}

static void set_defaults(Config* c) {
    memset(c, 0, sizeof(*c));
    c->model = gpt_default_config();
    char err[256];
    for (int k = NUM_MODEL_FIELDS; k < NUM_MODEL_FIELDS + NUM_RUN_FIELDS; k++) {
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

// docs/flags.md's last section: megatron_flags.h's table, row by row
static void print_megatron_markdown(void) {
    printf("\n## Megatron-LM's and Megatron-DeepSpeed's other flags (`megatron_flags.h`)\n\nA flag of theirs that "
           "gridgpt lacks is decided by its row here: *accepted* where it asks for what gridgpt always does (the trainer "
           "says so in a start-up line `note: Megatron's FLAG accepted: ...` and goes on; *as* names the flag of "
           "gridgpt's it is taken as), *refused* where it asks for something gridgpt does not have (one line naming it, "
           "exit status 2; every refused flag of the command line in that one line). A flag's first row whose values "
           "match decides; *other* is any value the rows above it did not take. Numbers compare as numbers (`0` = "
           "`0.0`).\n\n| flag | values | verdict | why |\n| --- | --- | --- | --- |\n");
    static const char* const VERDICT[] = {"accepted", "refused"};
    for (int r = 0; r < NUM_MEGATRON_FLAGS; r++) {
        const MegatronFlag* f = &MEGATRON_FLAGS[r];
        int other = r > 0 && strcmp(MEGATRON_FLAGS[r - 1].flag, f->flag) == 0;
        printf("| `%s` | ", f->flag);
        print_markdown_cell(f->values ? f->values : f->arity == MEGATRON_SWITCH ? "switch" : other ? "other" : "any");
        printf(" | %s", VERDICT[f->verdict]);
        if (f->as) printf(" as `%s`", f->as);
        printf(" | ");
        print_markdown_cell(f->text);
        printf(" |\n");
    }
    printf("\n## Megatron-LM's defaults that gridgpt does not apply (`megatron_flags.h`)\n\nA Megatron-LM flag left "
           "out of a command line leaves its default; where that default asks for something other than what gridgpt "
           "does, the start-up says so, one line a row whose runs these are (`note: Megatron-LM's default, "
           "--hidden-dropout 0.1: ...; gridgpt ...`, rank 0, in every run that trains or plans training: see "
           "[megatron.md](megatron.md)). gridgpt's other defaults are Megatron-LM's; a difference of speed or memory "
           "alone is not a row.\n\n| flag | Megatron-LM's default | what it does there | gridgpt | noted |\n"
           "| --- | --- | --- | --- | --- |\n");
    for (int r = 0; r < NUM_MEGATRON_DEFAULTS; r++) {
        const MegatronDefault* d = &MEGATRON_DEFAULTS[r];
        printf("| `%s` | %s | ", d->flag, d->value ? d->value : "off");
        print_markdown_cell(d->megatron);
        printf(" | ");
        print_markdown_cell(d->gridgpt);
        printf(" | %s |\n", MEGATRON_DIFFERS_WHEN[d->when]);
    }
}

static void print_usage_markdown(Config* c) {
    static const char* const VALUE[] = {"integer", "integer", "number", "switch", "choice", "text", "3 integers", "list"};
    printf("# Flags\n\nEvery flag of `train_cpu` and `train_gpu`, generated by `./train_cpu --help-markdown` from the "
           "two field lists (`GPT_CONFIG_FIELDS` in `gpt.h`, `RUN_CONFIG_FIELDS` in `config.h`): do not edit it by hand; "
           "`make docs` writes it, and `make test` fails when it differs. How flags are declared and checked, and the "
           "flags by topic: [config.md](config.md).\n");
    for (int k = 0; k < NUM_MODEL_FIELDS + NUM_RUN_FIELDS; k++) {
        if (k == 0 || k == NUM_MODEL_FIELDS)
            printf("\n## %s\n\n| flag | value | default | minimum | meaning |\n| --- | --- | --- | --- | --- |\n",
                   k == 0 ? "The model (`gpt.h`, stored in checkpoints)" : "The run (`config.h`)");
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
    print_megatron_markdown();
}

// The parsers below move *i to the last index of argv they used and return 0, or 1 with the
// error line in err (a rank's flags may differ from the others': the caller of parse_flags
// settles the verdict with every rank).

// A number as Python writes it: Megatron's argparse reads its numbers with int() and float(),
// which take underscores between digits (PEP 515: BigScience's scripts write 9_765_625). argv[k],
// when it is a number once its underscores are dropped, becomes that number (a copy that lives as
// long as the argument vector); an underscore anywhere but between two digits (9__7, _9, 9_, 1_.5)
// is refused, as Python refuses it. Anything else (a name, a path) stays as it is. The one place
// underscores are read: the values of gridgpt's numeric flags and of Megatron's flags.
static int python_number(char** argv, int k, const char* flag, char* err, size_t len) {
    const char* v = argv[k];
    if (!strchr(v, '_')) return 0;
    char* digits = (char*)mallocCheck(strlen(v) + 1);
    int misplaced = 0, n = 0;
    for (int i = 0; v[i]; i++) {
        if (v[i] != '_') digits[n++] = v[i];
        else if (i == 0 || v[i - 1] < '0' || v[i - 1] > '9' || v[i + 1] < '0' || v[i + 1] > '9') misplaced = 1;
    }
    digits[n] = '\0';
    char* end;
    strtod(digits, &end);
    if (end == digits || *end) {   // not a number: its underscores are a name's
        free(digits);
        return 0;
    }
    if (misplaced) {
        free(digits);
        return error_line(err, len, "%s %s: an underscore in a number goes between two digits (Python's rule, which "
                          "Megatron's argparse follows: 9_765_625)", flag, v);
    }
    argv[k] = digits;
    return 0;
}

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

// gridgpt's own field of a flag (NULL: none), and in *base where its value lives in c
static const ConfigField* own_field(Config* c, const char* flag, void** base) {
    char name[96];
    for (int k = 0; k < NUM_MODEL_FIELDS + NUM_RUN_FIELDS; k++) {
        const ConfigField* f = config_field(c, k, base);
        if (strcmp(flag, flag_of(f, name, sizeof(name))) == 0) return f;
    }
    return NULL;
}

// A flag neither gridgpt's nor Megatron's: its values (whatever follows up to the next flag)
// go with it, and a typo of a flag of either names the flag it is close to.
static int unknown_flag(Config* c, int argc, char** argv, int* i, char* err, size_t len) {
    const char* flag = argv[*i];
    while (*i + 1 < argc && strncmp(argv[*i + 1], "--", 2) != 0) ++*i;
    char best[96] = "", name[96];
    int distance = 3;   // more edits than a typo's
    for (int k = 0; k < NUM_MODEL_FIELDS + NUM_RUN_FIELDS; k++) {   // gridgpt's own flags first: a tie keeps them
        void* base;
        if (closer_flag(flag, flag_of(config_field(c, k, &base), name, sizeof(name)), &distance))
            snprintf(best, sizeof(best), "%s", name);
    }
    megatron_closest(flag, distance, best, sizeof(best));
    if (best[0]) return error_line(err, len, "unknown flag '%s', did you mean %s?", flag, best);
    return error_line(err, len, "unknown flag '%s' (see --help)", flag);
}

// An accepted Megatron flag that stands for one of gridgpt's (its row's `as`): "--flag" takes
// the same value, "--flag VALUE" that value, "--flag *N" the value times N. The targets are
// numbers and choices, parsed here and now (a value made here is not kept).
static int parse_as(Config* c, const MegatronFlag* r, const char* flag, char** values, int count, char* err, size_t len) {
    char as[96], scaled[32];
    snprintf(as, sizeof(as), "%s", r->as);
    char* value = strchr(as, ' ');
    if (value) *value++ = '\0';
    if (!value && count) value = values[0];
    if (value && value[0] == '*') {
        char* end;
        long long v = count ? strtoll(values[0], &end, 10) : 0;
        if (!count || end == values[0] || *end) return error_line(err, len, "%s expects an integer", flag);
        snprintf(scaled, sizeof(scaled), "%lld", v * atoll(value + 1));
        value = scaled;
    }
    void* base;
    const ConfigField* f = own_field(c, as, &base);
    if (!f || !value) fail("megatron_flags.h: %s stands for '%s', not a flag of gridgpt's with a value", flag, r->as);
    if (parse_field(f, base, value, err, len) == 0) return 0;
    char why[1024];
    snprintf(why, sizeof(why), "%s", err);
    return error_line(err, len, "%s (taken as %s %s): %s", flag, as, value, why);
}

// The verdict of row r of megatron_flags.h on flag (at *at in argv) with its count values:
// accepted, it is noted for the start-up line (and parsed as the gridgpt flag it stands for);
// refused, err says what Megatron would do, and brief names it for a list of several.
static int megatron_verdict(Config* c, int r, char** at, int count, char* err, size_t len, char* brief, size_t brief_len) {
    const MegatronFlag* f = &MEGATRON_FLAGS[r];
    char given[256] = "", what[96];
    for (int k = 1; k <= count; k++)
        snprintf(given + strlen(given), sizeof(given) - strlen(given), " %s", at[k]);
    if (f->verdict != MEGATRON_ACCEPTED) {
        snprintf(brief, brief_len, "%s%s (%s)", at[0], given, megatron_what(f, what, sizeof(what)));
        return error_line(err, len, "%s%s: not in gridgpt: %s", at[0], given, f->text);
    }
    if (f->as && parse_as(c, f, at[0], at + 1, count, err, len)) return 1;
    if (c->megatron_count < MAX_MEGATRON_GIVEN) {
        MegatronGiven* g = &c->megatron[c->megatron_count++];
        g->row = r;
        g->at = at;
        g->count = count;
    }
    return 0;
}

// A flag that is not gridgpt's: megatron_flags.h's table reads its values and decides, or it is unknown.
static int parse_megatron_flag(Config* c, int argc, char** argv, int* i, char* err, size_t len, char* brief,
                               size_t brief_len) {
    int at = *i, first = megatron_row(argv[at], NULL);
    if (first < 0) return unknown_flag(c, argc, argv, i, err, len);
    MegatronArity arity = MEGATRON_FLAGS[first].arity;
    int most = arity == MEGATRON_LIST ? MAX_LIST : arity == MEGATRON_VALUE;
    while (*i - at < most && *i + 1 < argc && strncmp(argv[*i + 1], "--", 2) != 0) ++*i;
    if (arity == MEGATRON_VALUE && *i == at) return error_line(err, len, "%s expects a value", argv[at]);
    for (int k = at + 1; k <= *i; k++)
        if (python_number(argv, k, argv[at], err, len)) return 1;
    char values[256] = "";   // the list's values as one text, for the rows' values to match
    for (int k = at + 1; k <= *i; k++)
        snprintf(values + strlen(values), sizeof(values) - strlen(values), "%s%s", k > at + 1 ? " " : "", argv[k]);
    return megatron_verdict(c, megatron_row(argv[at], *i > at ? values : NULL), argv + at, *i - at, err, len, brief,
                            brief_len);
}

// The flag at argv[*i] and its values; 0, or 1 with its error line in err and in brief (a
// Megatron refusal named in a few words there, for a list of several). A flag gridgpt lacks,
// and a value of a choice of gridgpt's that its choices lack, go to megatron_flags.h's table.
static int parse_flag(Config* c, int argc, char** argv, int* i, char* err, size_t len, char* brief, size_t brief_len) {
    const char* flag = argv[*i];
    void* base = NULL;
    const ConfigField* f = own_field(c, flag, &base);
    brief[0] = '\0';
    if (!f) return parse_megatron_flag(c, argc, argv, i, err, len, brief, brief_len);
    if (f >= MODEL_FIELDS && f < MODEL_FIELDS + NUM_MODEL_FIELDS) c->model_given[f - MODEL_FIELDS] = 1;
    if (f >= RUN_FIELDS && f < RUN_FIELDS + NUM_RUN_FIELDS) c->run_given[f - RUN_FIELDS] = 1;
    if (f->kind == FIELD_SWITCH) {
        *(int*)field_in(f, base) = 1;
        return 0;
    }
    if (f->kind == FIELD_LIST) return parse_list(f, base, argc, argv, i, err, len);
    int values = f->kind == FIELD_INT3 ? 3 : 1;
    if (*i + values >= argc) return error_line(err, len, "%s expects %s", flag, values == 3 ? "three integers" : "a value");
    for (int k = 1; k <= values; k++) {
        ++*i;
        if (strncmp(argv[*i], "--", 2) == 0) {
            --*i;   // (the flag is read next)
            return error_line(err, len, "%s expects a value, got the flag '%s'", flag, argv[*i + 1]);
        }
        ConfigField one = *f;   // a triple is three integers one after another
        if (f->kind == FIELD_INT3) {
            one.kind = FIELD_INT;
            one.offset += (k - 1) * sizeof(int);
        }
        int number = one.kind == FIELD_INT || one.kind == FIELD_LONG || one.kind == FIELD_FLOAT;
        if (number && python_number(argv, *i, flag, err, len)) return 1;
        if (parse_field(&one, base, argv[*i], err, len) == 0) continue;
        int r = f->kind == FIELD_CHOICE ? megatron_row(flag, argv[*i]) : -1;   // a choice of Megatron's?
        return r < 0 ? 1 : megatron_verdict(c, r, argv + *i - 1, 1, err, len, brief, brief_len);
    }
    return 0;
}

// --kv-channels (Megatron's head size) is accepted only as gridgpt's, --hidden-size /
// --num-attention-heads: the flags' (or the defaults' in a fresh run; a run from --load without
// them takes the checkpoint's shape, which holds its own)
static int check_kv_channels(Config* c, char* err, size_t len, char* brief, size_t brief_len) {
    const GPTConfig* m = &c->model;
    int given = model_field_given(c, offsetof(GPTConfig, hidden_size)) &&
                model_field_given(c, offsetof(GPTConfig, num_attention_heads));
    for (int k = 0; k < c->megatron_count; k++) {
        const MegatronGiven* g = &c->megatron[k];
        if (strcmp(g->at[0], "--kv-channels") != 0 || (c->load && !given)) continue;
        if (atoi(g->at[1]) == m->hidden_size / m->num_attention_heads && m->hidden_size % m->num_attention_heads == 0) continue;
        snprintf(brief, brief_len, "--kv-channels %s (a head size other than --hidden-size / --num-attention-heads)", g->at[1]);
        return error_line(err, len, "--kv-channels %s: not in gridgpt: a head size other than --hidden-size %d / "
                          "--num-attention-heads %d (Megatron-LM would project each head to %s channels)", g->at[1],
                          m->hidden_size, m->num_attention_heads, g->at[1]);
    }
    return 0;
}

// one more bad flag: the first one's line in err, each one's brief in the list
static void add_refusal(char* list, size_t list_len, int* listed, int* more, const char* brief) {
    if (strlen(list) + strlen(brief) + 2 < list_len) {
        snprintf(list + strlen(list), list_len - strlen(list), "%s%s", *listed ? "; " : "", brief);
        ++*listed;
    } else {
        ++*more;
    }
}

// argparse's "--flag=value" form, which Megatron-LM's scripts may use, as "--flag" "value".
// The new argument vector lives as long as the run: string fields point into it.
static char** split_flag_values(int* argc, char** argv) {
    char** out = (char**)malloc((2 * (size_t)*argc + 1) * sizeof(char*));
    int n = 0;
    if (!out) fail("out of host memory for the command line");
    for (int i = 0; i < *argc; i++) {
        char* equals = i > 0 && strncmp(argv[i], "--", 2) == 0 ? strchr(argv[i], '=') : NULL;
        out[n++] = equals ? strndup(argv[i], (size_t)(equals - argv[i])) : argv[i];
        if (equals) out[n++] = equals + 1;
    }
    out[n] = NULL;
    *argc = n;
    return out;
}

// Every flag. "" in err, or one line: the bad flag's, or with several every one of them in
// brief (a user learns all that stands between a Megatron command line and a run at once).
static void parse_flags(Config* c, int argc, char** argv, char* err, size_t len) {
    char one[1024], brief[1024], list[4096] = "";
    int bad = 0, listed = 0, more = 0;
    err[0] = '\0';
    argv = split_flag_values(&argc, argv);
    c->megatron_count = 0;
    for (int i = 1; i <= argc; i++) {
        int failed = i < argc ? parse_flag(c, argc, argv, &i, one, sizeof(one), brief, sizeof(brief))
                              : check_kv_channels(c, one, sizeof(one), brief, sizeof(brief));   // after every flag
        if (!failed) continue;
        if (bad++ == 0) snprintf(err, len, "%s", one);
        size_t room = len > 160 ? len - 80 : len / 2;   // the head and the tail of the line stay
        add_refusal(list, room < sizeof(list) ? room : sizeof(list), &listed, &more, brief[0] ? brief : one);
    }
    if (bad > 1 && more) snprintf(err, len, "%d flags refused: %s; and %d more", bad, list, more);
    else if (bad > 1) snprintf(err, len, "%d flags refused: %s", bad, list);
    // Sequence parallelism splits the rows over the tensor-parallel ranks: at TP 1 there is nothing
    // to split, and Megatron-LM HEAD's arguments.py turns the switch off with a warning (its own
    // Llama 3 8B example gives it at TP 1). So does gridgpt, with a note (print_megatron_notes).
    c->sequence_parallel_off = c->model.sequence_parallel && c->tensor_model_parallel_size == 1;
    if (c->sequence_parallel_off) c->model.sequence_parallel = 0;
}

// whether any of --hw and --hw-* was given (each is 0, or -1 for --hw, when not)
static int hardware_given(const Config* a) {
    for (int k = 0; k < NUM_RUN_FIELDS; k++) {
        const ConfigField* f = &RUN_FIELDS[k];
        const char* at = (const char*)a + f->offset;
        if (strncmp(f->name, "hw_", 3) == 0 && (f->kind == FIELD_INT ? *(const int*)at : *(const float*)at) > 0) return 1;
    }
    return a->hw >= 0;
}

// the build the run is for: the binary's own; in a dry run, --dry-run-build's: the one given, else
// the GPU build when --hw or an --hw-* describes a GPU, else the binary's own (train_cpu: the CPU
// build, on this machine)
static int plans_gpu_build(const Config* a) {
    if (a->dry_run_build >= 0) return a->dry_run_build == PLAN_GPU_BUILD;
    return GPU_BUILD || hardware_given(a);
}

// whether the command line gave Megatron's flag (accepted: a refused one has ended the run)
static int megatron_given(const Config* c, const char* flag) {
    for (int k = 0; k < c->megatron_count; k++)
        if (strcmp(c->megatron[k].at[0], flag) == 0) return 1;
    return 0;
}

// whether a difference of megatron_flags.h's MEGATRON_DEFAULTS is about this run
static int megatron_default_differs(const Config* c, MegatronDiffers when) {
    switch (when) {
    case DIFFERS_ALWAYS: return 1;
    case DIFFERS_UNLESS_DYNAMIC_FP16: return !(c->fp16 && c->loss_scale == 0.0f);
    case DIFFERS_WITH_FP16: return c->fp16;
    case DIFFERS_ON_GPU_FP32: return plans_gpu_build(c) && !c->fp16 && !c->bf16;
    case DIFFERS_WITH_SAVE: return c->save != NULL;
    case DIFFERS_WITH_SPARSE_TENSORBOARD: return c->tensorboard_dir && c->log_interval != 1;
    case DIFFERS_WITH_PROFILE_ALL_RANKS: return c->profile && c->profile_ranks.count == 0;
    }
    return 0;
}

// Megatron-LM's defaults that the command line leaves and gridgpt does not apply, a line each:
// in a run that trains or plans training (not --help, an export, an import, an evaluation or a
// generation alone, a cluster check alone) once its flags have passed the checks (check_run's
// last act: a refused command line gets its one error line alone), on rank 0, once. A plain
// gridgpt run gets them too: a Megatron-LM command line need not look like one (the GPT-3 175B
// example's flags are all gridgpt's), and a reader of either should learn what differs.
static void print_megatron_defaults(const Config* c) {
    int cluster_check_alone = c->check_cluster && !c->data_path.count && !c->train_data_path.count;
    if (c->help || c->help_markdown || c->export_hf || c->import_hf || c->skip_train || cluster_check_alone) return;
    for (int r = 0; r < NUM_MEGATRON_DEFAULTS && grid.world_rank == 0; r++) {
        const MegatronDefault* d = &MEGATRON_DEFAULTS[r];
        if (megatron_given(c, d->flag) || !megatron_default_differs(c, d->when)) continue;
        printf("note: Megatron-LM's default, %s%s%s%s: %s; gridgpt %s\n", d->value ? "" : "no ", d->flag,
               d->value ? " " : "", d->value ? d->value : "", d->megatron, d->gridgpt);
    }
}

// the start-up notes of the Megatron flags accepted as what gridgpt does and of --sequence-parallel
// turned off at TP 1 (rank 0, a line each; those of Megatron-LM's defaults come after the checks)
static void print_megatron_notes(const Config* c) {
    if (grid.world_rank != 0) return;
    for (int k = 0; k < c->megatron_count; k++) {
        const MegatronGiven* g = &c->megatron[k];
        printf("note: Megatron's %s", g->at[0]);
        for (int v = 1; v <= g->count; v++) printf(" %s", g->at[v]);
        printf(" accepted: %s\n", MEGATRON_FLAGS[g->row].text);
    }
    if (c->sequence_parallel_off)
        printf("note: --sequence-parallel at --tensor-model-parallel-size 1 turned off: without tensor parallelism there "
               "are no ranks to split the rows over (Megatron-LM HEAD turns it off too, with a warning)\n");
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

// Model chunks per pipeline stage, v: the interleaved schedule's (a stage's layers / N with
// --num-layers-per-virtual-pipeline-stage N, or --num-virtual-stages-per-pipeline-rank); 1
// without interleaving (layout_error has checked the flags)
static int virtual_chunks(const Config* a) {
    if (a->num_virtual_stages_per_pipeline_rank > 0) return a->num_virtual_stages_per_pipeline_rank;
    if (a->num_layers_per_virtual_pipeline_stage == 0) return 1;
    int* counts = stage_layers(a), v = counts[0] / a->num_layers_per_virtual_pipeline_stage;
    free(counts);
    return v;
}

// G, the micro-batches interleaved 1F1B takes at a time per model chunk: Megatron-LM's
// --microbatch-group-size-per-virtual-pipeline-stage, PP by default (its depth-first order)
static int microbatch_group_size(const Config* a) {
    int G = a->microbatch_group_size_per_virtual_pipeline_stage;
    return G > 0 ? G : a->pipeline_model_parallel_size;
}

// the world the layout is for: --world-size (a dry run's), else the launched one
static int layout_world_size(const Config* a) { return a->world_size ? a->world_size : grid.world_size; }
static int data_parallel_size(const Config* a) {
    return layout_world_size(a) / (a->tensor_model_parallel_size * a->context_parallel_size * a->pipeline_model_parallel_size);
}

// The micro-batches whose logits the last stage's head keeps at once (pipeline.h's
// schedule_head_logits) in a step of every micro-batch count the run has (each batch of the
// ramp-up, the full batch): one, but more with interleaving where a last group is short
static int planned_head_logits(const Config* a) {
    int v = virtual_chunks(a), PP = a->pipeline_model_parallel_size, per_micro = a->micro_batch_size * data_parallel_size(a);
    const int* ramp = a->rampup_batch_size.v;   // START INCREMENT SAMPLES
    int G = microbatch_group_size(a), most = 1;
    PipelineSchedule kind = (PipelineSchedule)a->pipeline_schedule;
    if ((v == 1 && kind != SCHEDULE_GPIPE) || per_micro < 1) return 1;
    for (int g = ramp[0]; ramp[0] > 0 && ramp[1] > 0 && g < a->global_batch_size; g += ramp[1]) {
        int n = schedule_head_logits(kind, PP, v, G, g / per_micro);
        most = n > most ? n : most;
    }
    int n = schedule_head_logits(kind, PP, v, G, a->global_batch_size / per_micro);
    return n > most ? n : most;
}

// Pipeline stage p of the layout. With v model chunks, each stage's layers are cut into v equal
// chunks and virtual stage c x PP + p (stage p's chunk c) holds the c-th of v rounds of the
// layers: round c is layers [c L / v, (c + 1) L / v), stage p's chunk of it starting after the
// earlier stages' chunks (Megatron-LM's offsets, uneven stages included).
static PipelineStage pipeline_stage(const Config* a, int p) {
    int* counts = stage_layers(a), v = virtual_chunks(a);
    PipelineStage s = {p, a->pipeline_model_parallel_size, 0, counts[p], v, a->model.num_layers / v, 1};
    for (int q = 0; q < p; q++) s.first_layer += counts[q] / v;
    free(counts);
    if (p == s.size - 1) s.head_logits = planned_head_logits(a);
    return s;
}

static PipelineStage this_stage(const Config* a) { return pipeline_stage(a, grid.pp_rank); }

// The micro-batch slots stage p needs for each of its model chunks (slots[c]): what the schedule
// holds at the most (step.h's schedule_slots, a walk of the schedule itself) in a step of every
// micro-batch count the run has (each batch of the ramp-up, the full batch), and in an
// evaluation (the full batch's forwards)
static void stage_slots(const Config* a, int p, int* slots) {
    int v = virtual_chunks(a), PP = a->pipeline_model_parallel_size, per_micro = a->micro_batch_size * data_parallel_size(a);
    int full = a->global_batch_size / per_micro;
    const int* ramp = a->rampup_batch_size.v;   // START INCREMENT SAMPLES
    int G = microbatch_group_size(a);
    PipelineSchedule kind = (PipelineSchedule)a->pipeline_schedule;
    for (int c = 0; c < v; c++) slots[c] = 1;
    schedule_slots(kind, p, PP, v, G, full, 0, slots);
    schedule_slots(kind, p, PP, v, G, full, 1, slots);
    for (int g = ramp[0]; ramp[0] > 0 && ramp[1] > 0 && g < a->global_batch_size; g += ramp[1])
        schedule_slots(kind, p, PP, v, G, g / per_micro, 0, slots);
}

// "the global batch" or "batch size G on the ramp" for an error line about batch g
static const char* batch_named(const Config* a, int g, char* out, size_t len) {
    if (g == a->global_batch_size) snprintf(out, len, "--global-batch-size %d", g);
    else snprintf(out, len, "--rampup-batch-size: batch size %d on the ramp", g);
    return out;
}

// The first reason the interleaved schedule's groups of G (microbatch_group_size) cannot take
// batch g's micro-batches, M of them: Megatron-LM refuses G outside [PP, M] and a last group of
// fewer than PP (on the first stage a chunk's input would be due before it arrives). A last
// group of PP or more but fewer than G runs, as in Megatron-LM: its order runs head forwards on
// the last stage ahead of their backwards, and the head keeps each one's logits until then
// (pipeline.h's schedule_head_logits counts the buffers, gpt.h's logits_of picks one).
static int micro_batch_group_error(const Config* a, int g, int micro_times_dp, char* err, size_t len) {
    int G = microbatch_group_size(a), PP = a->pipeline_model_parallel_size, M = g / micro_times_dp;
    const char* flag = "--microbatch-group-size-per-virtual-pipeline-stage";
    char named[96], what[256], fits[128] = "", *f = fits;
    snprintf(what, sizeof what, "%s makes %d micro-batches per pipeline (micro-batch %d x data-parallel size %d)",
             batch_named(a, g, named, sizeof named), M, a->micro_batch_size, micro_times_dp / a->micro_batch_size);
    if (G > M)
        return error_line(err, len, "%s, fewer than %s %d: the interleaved schedule takes PP to M micro-batches at a "
                          "time per model chunk (as Megatron-LM)", what, a->microbatch_group_size_per_virtual_pipeline_stage ?
                          flag : "--pipeline-model-parallel-size", G);
    if (M % G == 0 || M % G >= PP) return 0;
    for (int k = PP; k <= M && f < fits + sizeof fits - 16; k++)   // the sizes that take M here
        if (M % k == 0 || M % k >= PP) f += snprintf(f, fits + sizeof fits - f, "%s%d", f == fits ? "" : ", ", k);
    return error_line(err, len, "%s: taken %d at a time per model chunk (%s, PP by default), the last group holds %d, "
                      "fewer than --pipeline-model-parallel-size %d, which Megatron-LM refuses (the first stage would "
                      "wait for its own output); group sizes that take %d: %s", what, G, flag, M % G, PP, M, fits);
}

// The first reason --pipeline-schedule gpipe or zb-h1 cannot run the layout of `a`, as one line; 0
// if none. GPipe and ZB-H1 are written for one model chunk a stage; ZB-H1's W pass reads the
// layers' inputs the forward kept in the slot (layers.h), which full recomputation does not keep,
// and with sequence parallelism those inputs are 1/TP of the rows (W would gather them again).
static int pipeline_schedule_error(const Config* a, char* err, size_t len) {
    const char* name = a->pipeline_schedule == SCHEDULE_GPIPE ? "gpipe" : "zb-h1";
    if (a->pipeline_schedule == SCHEDULE_1F1B) return 0;
    if (virtual_chunks(a) > 1)
        return error_line(err, len, "--pipeline-schedule %s with virtual stages (interleaving): not built; interleaving "
                          "goes with 1f1b", name);
    if (a->pipeline_schedule != SCHEDULE_ZB_H1) return 0;
    if (a->recompute_granularity == GRANULARITY_FULL || a->checkpoint_activations)
        return error_line(err, len, "--pipeline-schedule zb-h1 with full recomputation: its W pass reads each layer's "
                          "inputs, which recomputation does not keep (selective recomputation composes)");
    if (a->model.sequence_parallel && a->tensor_model_parallel_size > 1)
        return error_line(err, len, "--pipeline-schedule zb-h1 with --sequence-parallel: not built (the W pass would "
                          "gather each layer's inputs over the tensor ranks again)");
    return 0;
}

// The first reason the interleaved schedule cannot run the layout of `a` (stage p holding
// layers[p] layers; micro_times_dp samples a micro-batch over DP), as one line; 0 if none, or
// no interleaving. Megatron-LM's refusals (its arguments.py, and its schedule's for the
// micro-batches, which it meets only mid-run when a ramp-up batch breaks it), with two choices
// of ours: a group size without interleaving is refused (Megatron-LM ignores it), and PP 2 is
// allowed, as Megatron-LM allows it with its --overlap-p2p-comm (older versions
// refused any PP below 3: with both neighbours one rank, an exchange holds two messages each way
// between the same two ranks; ours posts them in one fixed order on both sides, parallel.h's
// pipeline_exchange, and NCCL and MPI match them in that order).
static int interleaving_error(const Config* a, const int* layers, int micro_times_dp, char* err, size_t len) {
    int N = a->num_layers_per_virtual_pipeline_stage, v = a->num_virtual_stages_per_pipeline_rank;
    int PP = a->pipeline_model_parallel_size, G = a->microbatch_group_size_per_virtual_pipeline_stage;
    const char* alone = "--microbatch-group-size-per-virtual-pipeline-stage goes with the interleaved schedule "
                        "(--num-layers-per-virtual-pipeline-stage or --num-virtual-stages-per-pipeline-rank, two model "
                        "chunks a stage at least)";
    if (!N && !v) return G ? error_line(err, len, "%s", alone) : 0;
    if (N && v) return error_line(err, len, "give --num-layers-per-virtual-pipeline-stage or "
                                  "--num-virtual-stages-per-pipeline-rank, not both (as in Megatron-LM)");
    const char* flag = N ? "--num-layers-per-virtual-pipeline-stage" : "--num-virtual-stages-per-pipeline-rank";
    if (PP == 1) return error_line(err, len, "%s: the interleaved schedule needs --pipeline-model-parallel-size > 1", flag);
    for (int p = 0; p < PP && N; p++)
        if (layers[p] != layers[0])
            return error_line(err, len, "--num-layers-per-virtual-pipeline-stage needs stages of equal layers, but stage %d "
                              "holds %d and stage 0 %d: uneven stages take --num-virtual-stages-per-pipeline-rank (as in "
                              "Megatron-LM)", p, layers[p], layers[0]);
    if (N && layers[0] % N != 0)
        return error_line(err, len, "--num-layers-per-virtual-pipeline-stage %d does not divide the %d layers of each "
                          "pipeline stage (--num-layers %d over --pipeline-model-parallel-size %d)", N, layers[0],
                          a->model.num_layers, PP);
    if (N) v = layers[0] / N;
    for (int p = 0; p < PP; p++)
        if (layers[p] == 0 || layers[p] % v != 0)
            return error_line(err, len, "--num-virtual-stages-per-pipeline-rank %d: stage %d's %d layer(s) do not split into "
                              "%d model chunks of equal layers, one at least", v, p, layers[p], v);
    if (v == 1) return G ? error_line(err, len, "%s", alone) : 0;   // one chunk a stage: plain 1F1B (Megatron-LM too)
    if (G && G < PP)
        return error_line(err, len, "--microbatch-group-size-per-virtual-pipeline-stage %d is less than "
                          "--pipeline-model-parallel-size %d: the interleaved schedule takes PP to M micro-batches at a "
                          "time per model chunk (as Megatron-LM)", G, PP);
    const int* ramp = a->rampup_batch_size.v;   // START INCREMENT SAMPLES: each batch of the ramp, then the global batch
    for (int r = ramp[0]; ramp[0] > 0 && ramp[1] > 0 && r < a->global_batch_size; r += ramp[1])
        if (micro_batch_group_error(a, r, micro_times_dp, err, len)) return 1;
    return micro_batch_group_error(a, a->global_batch_size, micro_times_dp, err, len);
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
    if (m->num_experts > 0 && TP > 1)
        return error_line(err, len, "--num-experts %d at --tensor-model-parallel-size %d: the experts' tensor parallelism "
                          "is not built yet (each rank holds whole experts): TP 1 with a mixture of experts",
                          m->num_experts, TP);
    if (query_groups(m) % TP != 0)   // (without GQA the heads' count, above)
        return error_line(err, len, "--num-query-groups %d is not divisible by --tensor-model-parallel-size %d (the "
                          "query groups are split over the tensor-parallel ranks, as Megatron-LM)", m->num_query_groups, TP);
    // sequence parallelism splits each sequence's tokens over the tensor ranks (at TP 1, parse_flags
    // has turned it off, as Megatron-LM's arguments.py does): Megatron-LM asserts that the sequence
    // splits evenly
    // context parallelism cuts each sequence into 2 CP chunks (Megatron-LM asserts the same)
    int CP = a->context_parallel_size;
    if (CP > 1 && m->seq_length % (2 * CP) != 0)
        return error_line(err, len, "--seq-length %d is not divisible by 2 x --context-parallel-size %d: each sequence is "
                          "cut into 2 CP equal chunks, two to a context-parallel rank", m->seq_length, CP);
    if (m->sequence_parallel && m->seq_length / CP % TP != 0)
        return error_line(err, len, "--seq-length %d%s is not divisible by --tensor-model-parallel-size %d: "
                          "--sequence-parallel splits each sequence%s over the tensor-parallel ranks", m->seq_length,
                          CP > 1 ? " / --context-parallel-size" : "", TP, CP > 1 ? "'s context-parallel part" : "");
    // Megatron-Core counts an expert's capacity over each rank's own tokens, so with context
    // parallelism the drops would follow the split: refused, every layout stays one process's model
    if (CP > 1 && m->num_experts > 0 && m->moe_expert_capacity_factor > 0.0f)
        return error_line(err, len, "--moe-expert-capacity-factor %g at --context-parallel-size %d: an expert's capacity "
                          "is counted over a rank's own tokens, so the dropped choices would depend on the context-parallel "
                          "split: CP 1 with a capacity factor", m->moe_expert_capacity_factor, CP);
    // expert parallelism splits the experts over EP of the DP x CP ranks (Megatron-Core's layout)
    int EP = a->expert_model_parallel_size;
    if (EP > 1 && m->num_experts == 0)
        return error_line(err, len, "--expert-model-parallel-size %d without --num-experts: a dense model has no experts "
                          "to split", EP);
    if (EP > 1 && (dp * CP) % EP != 0)
        return error_line(err, len, "--expert-model-parallel-size %d does not divide data-parallel size %d x "
                          "--context-parallel-size %d: the expert ranks are taken from those", EP, dp, CP);
    if (EP > 1 && m->num_experts % EP != 0)
        return error_line(err, len, "--num-experts %d is not divisible by --expert-model-parallel-size %d: each expert rank "
                          "holds the same number of experts", m->num_experts, EP);
    int* layers = (int*)mallocCheck(PP * sizeof(int)), most = 0;
    int bad = stage_layer_counts(a, layers, err, len);
    for (int p = 0; p < PP && !bad; p++) most = layers[p] > most ? layers[p] : most;
    if (bad) {
        free(layers);
        return bad;
    }
    int micro_batch_times_dp = a->micro_batch_size * dp;
    if (a->global_batch_size % micro_batch_times_dp != 0)
        return error_line(err, len, "--global-batch-size %d is not divisible by --micro-batch-size %d x data-parallel size %d",
                          a->global_batch_size, a->micro_batch_size, dp);
    const int* ramp = a->rampup_batch_size.v;   // START INCREMENT SAMPLES (the ramp's own shape: check_rampup)
    for (int g = ramp[0]; ramp[0] > 0 && ramp[1] > 0 && g <= a->global_batch_size; g += ramp[1])
        if (g % micro_batch_times_dp != 0)
            return error_line(err, len, "--rampup-batch-size: batch size %d on the ramp is not divisible by micro-batch %d x "
                              "data-parallel size %d", g, a->micro_batch_size, dp);
    bad = interleaving_error(a, layers, micro_batch_times_dp, err, len);
    free(layers);
    if (bad || (bad = pipeline_schedule_error(a, err, len))) return bad;
    int v = virtual_chunks(a);   // N counts the layers of one model chunk: a stage's, or one of its v
    char chunks[64] = "";
    if (v > 1) snprintf(chunks, sizeof chunks, ", in %d model chunks a stage", v);
    if (a->recompute_num_layers > most / v)
        return error_line(err, len, "--recompute-num-layers %d is more layers than any pipeline stage holds (the largest: "
                          "%d of --num-layers %d over --pipeline-model-parallel-size %d%s)", a->recompute_num_layers,
                          most / v, m->num_layers, PP, chunks);
    return 0;
}

// the grid's flags against the world size; then every rank knows its coordinates (not in a
// dry run: its world is not the launched one)
static void check_grid(const Config* a) {
    int TP = a->tensor_model_parallel_size, CP = a->context_parallel_size, PP = a->pipeline_model_parallel_size;
    int W = layout_world_size(a);
    if (a->world_size && !a->dry_run && a->world_size != grid.world_size)
        config_error("--world-size %d, but the job has %d rank(s) (--world-size is for --dry-run)", a->world_size,
                     grid.world_size);
    if (W % (TP * CP * PP) != 0 && !a->sweep) {   // a sweep plans every layout of the world but this one
        char cp[48] = "";
        if (CP > 1) snprintf(cp, sizeof cp, " x --context-parallel-size %d", CP);
        config_error("world size %d is not a multiple of --tensor-model-parallel-size %d%s x --pipeline-model-parallel-size %d",
                     W, TP, cp, PP);
    }
    if (a->cp_comm_type == CP_COMM_A2A)
        config_error("--cp-comm-type a2a (Ulysses' all-to-all of heads and sequence) is not built: p2p (a ring) or "
                     "all_gather");
    if (!a->dry_run) grid_place(TP, CP, PP);
}

// an --hw-*-efficiency is a fraction of a peak (0: the preset's): above 1 is a typo, not a faster GPU
static void check_fraction(const char* flag, float value) {
    if (value > 1.0f) config_error("%s %g: a fraction of the peak, at most 1", flag, value);
}

// Megatron-DeepSpeed's --pad-vocab-size-to N pads the vocabulary to exactly N rows: accepted
// (megatron_flags.h) when N is where gridgpt pads it, refused naming both sizes otherwise, and
// the --make-vocab-size-divisible-by that would reach N where one does (N a multiple of TP, at
// least the vocabulary: N / TP pads it to N)
static void check_pad_vocab_size_to(const Config* a, long long padded) {
    const GPTConfig* c = &a->model;
    int TP = a->tensor_model_parallel_size;
    for (int k = 0; k < a->megatron_count; k++) {
        const char* flag = a->megatron[k].at[0], *value = a->megatron[k].at[1];
        if (strcmp(flag, "--pad-vocab-size-to") != 0) continue;
        char* end, hint[160];
        long long want = strtoll(value, &end, 10);
        if (end == value || *end || want < 1) config_error("--pad-vocab-size-to expects a positive integer, got '%s'", value);
        if (want == padded) continue;
        if (want < c->vocab_size) snprintf(hint, sizeof hint, "fewer rows than the vocabulary's %d", c->vocab_size);
        else if (want % TP) snprintf(hint, sizeof hint, "not a multiple of --tensor-model-parallel-size %d: no padding "
                                     "reaches it", TP);
        else snprintf(hint, sizeof hint, "--make-vocab-size-divisible-by %lld pads it to %lld", want / TP, want);
        config_error("--pad-vocab-size-to %s: not in gridgpt: a vocabulary of %s rows: gridgpt pads --vocab-size %d to "
                     "%lld, a multiple of --make-vocab-size-divisible-by %d x --tensor-model-parallel-size %d (%s)", value,
                     value, c->vocab_size, padded, c->make_vocab_size_divisible_by, TP, hint);
    }
}

// the vocabulary as Megatron pads it (gpt.h), which must fit the int that shapes are counted in
static void set_padded_vocab_size(Config* a) {
    GPTConfig* c = &a->model;
    long long padded = padded_vocab_size(c->vocab_size, c->make_vocab_size_divisible_by, a->tensor_model_parallel_size);
    if (padded > INT_MAX)
        config_error("--make-vocab-size-divisible-by %d x --tensor-model-parallel-size %d pads the vocabulary of %d to "
                     "%lld, more than %d", c->make_vocab_size_divisible_by, a->tensor_model_parallel_size, c->vocab_size,
                     padded, INT_MAX);
    c->padded_vocab_size = (int)padded;
    check_pad_vocab_size_to(a, padded);
}

// --data-path (split by --split) or Megatron-LM's per-split blends, not both; training needs
// training data (an evaluation or generation alone, --skip-train, may have none)
static void check_data_paths(const Config* a) {
    int per_split = a->train_data_path.count || a->valid_data_path.count || a->test_data_path.count;
    if (a->data_path.count && per_split)
        config_error("give --data-path (split by --split) or --train-data-path / --valid-data-path / --test-data-path, "
                     "not both (as Megatron-LM)");
    if (a->dry_run || a->skip_train || a->data_path.count || a->train_data_path.count) return;
    config_error(per_split ? "--train-data-path is required to train (--valid-data-path and --test-data-path hold only "
                             "the data evaluated; --skip-train evaluates alone)"
                           : "--data-path is required (a Megatron .bin/.idx prefix; ./preprocess makes one), or "
                             "--train-data-path with --valid-data-path and --test-data-path");
}

static int has_eval_data(const Config* a) {
    return a->data_path.count || a->valid_data_path.count || a->test_data_path.count;
}

// --skip-train (Megatron's): no step, no save; an evaluation of --load's checkpoint and/or a
// generation from it
static void check_skip_train(const Config* a) {
    if (!a->skip_train) return;
    if (!a->load) config_error("--skip-train needs --load DIR: the checkpoint to evaluate or generate from");
    if (a->save) config_error("--skip-train trains nothing and saves nothing: drop --save %s", a->save);
    if (a->eval_iters == 0 && a->generate_tokens == 0)
        config_error("--skip-train with --eval-iters 0 and no --generate-tokens has nothing to do");
    if (!has_eval_data(a) && a->generate_tokens == 0)
        config_error("--skip-train has nothing to do: give data to evaluate (--valid-data-path, --test-data-path, or "
                     "--data-path split by --split) or --generate-tokens N to generate");
}

// a qualifier flag given without the field it qualifies (Megatron-LM ignores it; gridgpt says so)
static void check_given_with(const Config* a, size_t offset, int with, const char* flag, const char* needs) {
    if (model_field_given(a, offset) && !with) config_error("%s goes with %s (without it, it would change nothing)", flag, needs);
}

// Llama's flags that go together, refused where Megatron-LM refuses them (the fields' values:
// gpt.h's model_config_error; the query groups against the tensor-parallel size: layout_error)
static void check_architecture(Config* a) {
    GPTConfig* m = &a->model;
    int rope = m->position_embedding_type == POSITION_ROPE;
    check_given_with(a, offsetof(GPTConfig, num_query_groups), m->group_query_attention, "--num-query-groups",
                     "--group-query-attention");
    check_given_with(a, offsetof(GPTConfig, rotary_base), rope, "--rotary-base", "--position-embedding-type rope");
    check_given_with(a, offsetof(GPTConfig, rotary_percent), rope, "--rotary-percent", "--position-embedding-type rope");
    check_given_with(a, offsetof(GPTConfig, add_qkv_bias), m->disable_bias_linear, "--add-qkv-bias", "--disable-bias-linear");
}

// --ffn-hidden-size's default: 4h, or with SwiGLU Megatron-LM's 2/3 of that (the same
// parameters in three matrices as in two), rounded down to a multiple of 64
static int default_ffn_hidden_size(const GPTConfig* m) {
    return m->swiglu ? (int)(4.0 * m->hidden_size * 2.0 / 3.0 / 64.0) * 64 : 4 * m->hidden_size;
}

// The MLP's GELU where --gelu is not given, as Megatron-LM chooses it: its fused bias-GELU computes
// the tanh form, and with the fusion off (--no-bias-gelu-fusion, or --disable-bias-linear, which
// turns it off) its GELU is torch's exact (erf) one, unless --openai-gelu asks for OpenAI's tanh
// one (Megatron-LM's legacy model and Megatron-DeepSpeed); --swiglu has no GELU. Flags of this
// command line only: a model from --load keeps its checkpoint's form (tanh if written before it).
static void choose_gelu(Config* a) {
    GPTConfig* m = &a->model;
    int given = model_field_given(a, offsetof(GPTConfig, gelu)), openai = megatron_given(a, "--openai-gelu");
    check_given_with(a, offsetof(GPTConfig, gelu), !m->swiglu, "--gelu", "a GELU MLP (not --swiglu)");
    if (given && openai && m->gelu == GELU_ERF)
        config_error("--gelu erf with --openai-gelu, which asks for OpenAI's tanh form: give one of them");
    int unfused = megatron_given(a, "--no-bias-gelu-fusion") || model_field_given(a, offsetof(GPTConfig, disable_bias_linear));
    if (!given && !openai && !m->swiglu && unfused) m->gelu = GELU_ERF;
}

static void check_model(Config* a) {
    GPTConfig* m = &a->model;
    choose_gelu(a);
    if (m->ffn_hidden_size == 0) m->ffn_hidden_size = default_ffn_hidden_size(m);
    if (m->ffn_hidden_size == 0)
        config_error("--swiglu at --hidden-size %d: Megatron-LM's MLP width, 8h/3 rounded down to a multiple of 64, is 0: "
                     "give --ffn-hidden-size", m->hidden_size);
    if (m->max_position_embeddings == 0) m->max_position_embeddings = m->seq_length;
    if (m->num_experts > 0 && m->moe_ffn_hidden_size == 0) m->moe_ffn_hidden_size = m->ffn_hidden_size;
    char err[512];
    check_architecture(a);
    if (model_config_error(m, err, sizeof(err))) config_error("%s", err);   // (the same checks as an import's)
    int head_size = m->hidden_size / m->num_attention_heads;
    if (a->attention_backend == ATTENTION_FLASH && !flash_attention_supports(head_size))
        config_error("--attention-backend flash needs a head size (--hidden-size / --num-attention-heads) of 64 or 128, "
                     "got %d (auto falls back to unfused there)", head_size);
    if (a->dry_run_build >= 0 && !a->dry_run)   // -1: not given
        config_error("--dry-run-build goes with --dry-run (a run allocates for its own build, %s)", BUILD_NAME);
    check_data_paths(a);
    if (a->sweep && !a->dry_run) config_error("--sweep goes with --dry-run (it plans every layout of --world-size)");
    if (a->print_schedule && (!a->dry_run || a->sweep))
        config_error("--print-schedule goes with --dry-run, not --sweep (it draws the one layout planned)");
    if (hardware_given(a) && !a->dry_run)
        config_error("--hw and --hw-* describe the cluster a --dry-run prices its step on: give --dry-run");
    if (a->moe_imbalance > 0.0f && !a->dry_run)
        config_error("--moe-imbalance is the load a --dry-run prices the experts at (a run measures its own): give --dry-run");
    if (a->dry_run_build == PLAN_CPU_BUILD && a->hw >= 0)
        config_error("--hw names a GPU, but --dry-run-build cpu plans the CPU build, priced on this machine as measured "
                     "now (an --hw-* number may replace one of its figures): give one of them");
    check_fraction("--hw-matmul-efficiency", a->hw_matmul_efficiency);
    check_fraction("--hw-attention-efficiency", a->hw_attention_efficiency);
    check_fraction("--hw-memory-efficiency", a->hw_memory_efficiency);
    if (a->sweep && a->global_batch_size == 0)
        config_error("--sweep needs --global-batch-size: the batch every layout is planned for");
    if (a->dry_run && m->vocab_size == 0)
        config_error("--dry-run reads no data: give --vocab-size (the data's largest token id + 1) or a tokenizer");
    // parallel layout
    check_grid(a);
    long long one_batch_each = (long long)a->micro_batch_size * data_parallel_size(a);   // (an int may not hold it)
    if (a->global_batch_size == 0 && one_batch_each > INT_MAX)
        config_error("--micro-batch-size %d x data-parallel size %d is a global batch of %lld samples, more than %d",
                     a->micro_batch_size, data_parallel_size(a), one_batch_each, INT_MAX);
    if (a->global_batch_size == 0) a->global_batch_size = (int)one_batch_each;
    if (!a->sweep && layout_error(a, err, sizeof(err))) config_error("%s", err);
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

// --recompute-modules (Megatron-LM's, which reads it with --recompute-granularity selective alone,
// core_attn by default): gridgpt's selective recomputation is the attention core, core_attn. The
// other modules Megatron-LM can recompute (its TransformerConfig's list) are refused by name: they
// are MoE, MLA, hyper-connection and gated-delta-net parts gridgpt's model does not have, or
// (layernorm, mlp) parts it keeps whole. Given without selective, where Megatron-LM ignores it: refused.
static void check_recompute_modules(const Config* a) {
    static const char* const MEGATRON_MODULES[] = {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                                                   "shared_experts", "mhc", "gdn", "gdn_norm_out"};
    const int known = (int)(sizeof MEGATRON_MODULES / sizeof MEGATRON_MODULES[0]);
    const StringList* modules = &a->recompute_modules;
    if (modules->count > 0 && a->recompute_granularity != GRANULARITY_SELECTIVE)
        config_error("--recompute-modules goes with --recompute-granularity selective (or --recompute-activations): "
                     "Megatron-LM reads it only then");
    for (int i = 0; i < modules->count; i++) {
        const char* name = modules->v[i];
        int k = 0;
        while (k < known && strcmp(name, MEGATRON_MODULES[k]) != 0) k++;
        if (k == 0) continue;   // core_attn
        if (k < known)
            config_error("--recompute-modules %s: not in gridgpt, whose selective recomputation is the attention core "
                         "alone (core_attn, the default)", name);
        char choices[160] = "";
        for (k = 0; k < known; k++) snprintf(choices + strlen(choices), sizeof choices - strlen(choices), "%s%s",
                                             k ? ", " : "", MEGATRON_MODULES[k]);
        config_error("--recompute-modules %s: not a module Megatron-LM recomputes (its choices: %s)", name, choices);
    }
}

// Activation recomputation as Megatron-LM asks for it: --recompute-granularity full, a
// --recompute-method and --recompute-num-layers N (1 if not given, as Megatron-LM had it and
// Megatron-DeepSpeed has it); or Megatron-DeepSpeed's --checkpoint-activations, which is full
// and uniform. N counts layers of one pipeline stage: more than the largest stage holds is
// refused (Megatron-LM's range); a stage with fewer recomputes them all in one chunk, and
// uniform lets the last chunk be shorter when N does not divide them, as Megatron-LM does.
// --recompute-granularity selective (or Megatron-LM's --recompute-activations) recomputes the
// attention core of every layer and takes no method, as in Megatron-LM. Where Megatron-LM lets
// --recompute-activations quietly override a --recompute-granularity full, the two are refused.
// Writes the model's recompute_method, recompute_num_layers and recompute_attention_core.
static void check_recompute(Config* a) {
    if (a->checkpoint_activations) {
        if (a->recompute_granularity == GRANULARITY_SELECTIVE || a->recompute_method == RECOMPUTE_BLOCK ||
            a->recompute_activations)
            config_error("--checkpoint-activations is --recompute-granularity full --recompute-method uniform: it cannot go "
                         "with --recompute-granularity selective, --recompute-activations or --recompute-method block");
        a->recompute_granularity = GRANULARITY_FULL;
        a->recompute_method = RECOMPUTE_UNIFORM;
    }
    if (a->recompute_activations) {
        if (a->recompute_granularity == GRANULARITY_FULL)
            config_error("--recompute-activations is --recompute-granularity selective: it cannot go with "
                         "--recompute-granularity full");
        a->recompute_granularity = GRANULARITY_SELECTIVE;
    }
    if (a->recompute_granularity == GRANULARITY_SELECTIVE && a->recompute_method != RECOMPUTE_NONE)
        config_error("--recompute-method is not supported with --recompute-granularity selective (as in Megatron-LM: "
                     "selective recomputes the attention core of every layer)");
    if (a->recompute_granularity != GRANULARITY_FULL && a->recompute_method != RECOMPUTE_NONE)
        config_error("--recompute-method needs --recompute-granularity full (as in Megatron-LM)");
    if (a->recompute_granularity != GRANULARITY_FULL && a->recompute_num_layers)
        config_error("--recompute-num-layers needs --recompute-granularity full and a --recompute-method (or "
                     "--checkpoint-activations)");
    if (a->recompute_granularity == GRANULARITY_FULL && a->recompute_method == RECOMPUTE_NONE)
        config_error("--recompute-granularity full needs --recompute-method uniform or block (as in Megatron-LM)");
    check_recompute_modules(a);
    a->model.recompute_method = a->recompute_method;
    a->model.recompute_num_layers = a->recompute_num_layers ? a->recompute_num_layers : 1;
    a->model.recompute_attention_core = a->recompute_granularity == GRANULARITY_SELECTIVE;
}

// --tokenizer-type GPT2BPETokenizer and its two files go together (Megatron-LM's flags)
static void check_tokenizer(const Config* a) {
    int gpt2 = a->tokenizer_type == TOKENIZER_GPT2_BPE;
    if (!gpt2 && (a->vocab_file || a->merge_file))
        config_error("%s goes with --tokenizer-type GPT2BPETokenizer (and --%s)", a->vocab_file ? "--vocab-file" : "--merge-file",
                     a->vocab_file ? "merge-file" : "vocab-file");
    if (gpt2 && !(a->vocab_file && a->merge_file))
        config_error("--tokenizer-type GPT2BPETokenizer needs --vocab-file VOCAB.json and --merge-file MERGES.txt "
                     "(GPT-2's encoder.json and vocab.bpe)");
}

// the generation's flags (generate.h): the sampler's ranges, and each goes with --generate-tokens
static void check_generate(const Config* a) {
    if (a->temperature < 0.0f) config_error("--temperature must be 0 (greedy) or positive, got %g", a->temperature);
    if (a->top_p < 0.0f || a->top_p > 1.0f) config_error("--top-p must be in [0, 1] (0: off), got %g", a->top_p);
    const char* alone = a->top_k ? "--top-k" : a->top_p > 0.0f ? "--top-p" : a->generate_seed ? "--generate-seed"
                      : a->generate_ignore_eod ? "--generate-ignore-eod" : a->generate_prompt ? "--generate-prompt"
                      : a->generate_prompt_ids ? "--generate-prompt-ids" : a->eod_id >= 0 ? "--eod-id" : NULL;
    if (alone && a->generate_tokens == 0) config_error("%s goes with --generate-tokens N (how many tokens to generate)", alone);
    if (a->eod_id >= 0 && a->tokenizer_type >= 0)
        config_error("--eod-id goes without --tokenizer-type (a tokenizer has its own end-of-document id)");
    if (a->generate_prompt && a->generate_prompt_ids)
        config_error("--generate-prompt and --generate-prompt-ids: give the prompt one way, text or ids");
#ifdef __CUDACC__
    int head_size = a->model.hidden_size / a->model.num_attention_heads;
    if (a->generate_tokens > 0 && head_size > 32 * DECODE_DIMS)
        config_error("--generate-tokens: the GPU's decode attention takes a head size up to %d, this model's is %d",
                     32 * DECODE_DIMS, head_size);
#endif
}

// what of the run ZeRO stage `stage` does not run with (yet), or NULL (docs/parallelism.md lists them;
// --sweep leaves out the stages a run's flags rule out)
static const char* zero_stage_conflict(const Config* a, int stage) {
    if (stage < 2) return NULL;
    return a->pipeline_schedule == SCHEDULE_ZB_H1 ? "--pipeline-schedule zb-h1 (its deferred weight gradients)"
           : a->model.num_experts > 0         ? "--num-experts (the experts' region of the flat buffers)"
           : a->use_bnb_optimizer             ? "--use-bnb-optimizer"
           : a->overlap_grad_reduce           ? "--overlap-grad-reduce (ZeRO-2/3 reduce each layer as its backward ends)"
           : a->overlap_param_gather          ? "--overlap-param-gather (ZeRO-3 gathers each layer before it runs)"
           : stage < 3                        ? NULL
           : a->generate_tokens > 0           ? "--generate-tokens (generation reads the whole model)"
           : a->export_hf || a->import_hf     ? "--export-hf / --import-hf (they read the whole model)"
                                              : NULL;
}

// --zero-stage: 0 to 3, and the combinations ZeRO-2/3 do not run (yet) refused, the first in one line
static void check_zero_stage(const Config* a) {
    if (a->zero_stage > 3) config_error("--zero-stage %d: ZeRO has stages 0 to 3", a->zero_stage);
    if (a->no_reshard_after_forward && a->zero_stage < 3)
        config_error("--no-reshard-after-forward goes with --zero-stage 3 (the parameters sharded)");
    const char* with = zero_stage_conflict(a, a->zero_stage);
    if (with) config_error("--zero-stage %d does not run with %s yet: use --zero-stage 1", a->zero_stage, with);
}

static void check_run(Config* a) {
    // length of training: iterations or samples, not both (Megatron's rule); 0 iterations
    // with --save writes the initial model
    int initial_only = a->train_iters == 0 && a->train_samples == 0 && a->save;
    check_skip_train(a);
    if (a->train_iters == 0 && a->train_samples == 0 && !initial_only && !a->dry_run && !a->skip_train)
        config_error("the length of training is 0: give --train-iters or --train-samples a positive count "
                     "(--train-iters 0 with --save writes the initial model and stops)");
    if (a->train_iters > 0 && a->train_samples > 0)
        config_error("give one of --train-iters and --train-samples, not both");
    if (a->train_iters > 0 && (a->lr_warmup_samples || a->lr_decay_samples || a->rampup_batch_size.v[0]))
        config_error("--train-iters goes with --lr-warmup-iters / --lr-decay-iters and no --rampup-batch-size (use --train-samples)");
    if (a->train_samples > 0 && (a->lr_warmup_iters || a->lr_decay_iters))
        config_error("--train-samples goes with --lr-warmup-samples / --lr-decay-samples, not the -iters forms");
    if (a->lr_warmup_fraction > 1.0f)   // (9.2e18 once overflowed the warm-up's step count: lr 0 throughout)
        config_error("--lr-warmup-fraction %g: a fraction of the decay length, expected 0 to 1", a->lr_warmup_fraction);
    if (a->lr_warmup_fraction != 0.0f && (a->lr_warmup_iters || a->lr_warmup_samples))
        config_error("give --lr-warmup-fraction or --lr-warmup-iters/--lr-warmup-samples, not both");
    if (a->min_lr > a->lr) config_error("--lr %g and --min-lr %g must satisfy 0 <= min-lr <= lr", a->lr, a->min_lr);
    if (a->adam_beta1 >= 1.0f || a->adam_beta2 >= 1.0f) config_error("--adam-beta1 and --adam-beta2 must be in [0, 1)");
    if (a->adam_eps <= 0.0f) config_error("--adam-eps must be positive");
    check_precision(a);
    check_zero_stage(a);
    check_generate(a);
    check_recompute(a);
    check_tokenizer(a);
    print_megatron_defaults(a);   // every check passed: what Megatron-LM's defaults would do otherwise (rank 0)
}

// --profile: the steps it records lie inside this run (of train_iters iterations, starting
// after first_iteration: a resumed run's), its ranks in the world. Its directory is checked
// with the others' (train.c's check_paths). Megatron-LM counts the same way: profiling starts
// when `iteration` (steps done) equals --profile-step-start and stops when it equals --profile-step-end.
static void check_profile(const Config* a, int train_iters, int first_iteration) {
    if (!a->profile) return;
    if (a->profile_step_end <= a->profile_step_start)
        config_error("--profile-step-end %d must be greater than --profile-step-start %d (it records the steps from "
                     "iteration %d to --profile-step-end)", a->profile_step_end, a->profile_step_start,
                     a->profile_step_start + 1);
    if (a->profile_step_end > train_iters)
        config_error("--profile-step-end %d is beyond the run, which ends at iteration %d", a->profile_step_end,
                     train_iters);
    if (a->profile_step_start < first_iteration)
        config_error("--profile-step-start %d is before the run, which resumes after iteration %d", a->profile_step_start,
                     first_iteration);
    for (int i = 0; i < a->profile_ranks.count; i++) {
        const char* v = a->profile_ranks.v[i];
        char* end;
        long r = strtol(v, &end, 10);
        if (end == v || *end) config_error("--profile-ranks expects rank numbers, got '%s'", v);
        if (r < 0 || r >= grid.world_size)
            config_error("--profile-ranks %s: no such rank in a world of %d (ranks 0 to %d)", v, grid.world_size,
                         grid.world_size - 1);
    }
}

// whether --profile records `rank` (every rank unless --profile-ranks names some; Megatron-LM's
// default is rank 0 alone, for Nsight Systems: here one file shows the pipeline's stages side by side)
static int profiles_rank(const Config* a, int rank) {
    if (!a->profile) return 0;
    for (int i = 0; i < a->profile_ranks.count; i++)
        if (atoi(a->profile_ranks.v[i]) == rank) return 1;
    return a->profile_ranks.count == 0;
}

// ----------------------------------------------------------------------------
// what a config costs: the layers recomputed, the FLOPs of a step

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

// layers whose attention core, softmax(q k^T) v, runs forward a second time in backward
// (selective recomputation, gpt.h's rule): every layer, or none (flash: the fused attention)
static int recomputed_attention_cores(const Config* a, int flash) {
    return selective_recomputes_core(&a->model, flash) ? a->model.num_layers : 0;
}

// Model FLOPs of one training step of global batch B (Narayanan et al. 2021, §5.1 and its
// appendix): a forward pass costs 2 FLOPs per multiply-add,
//   per layer: 2 B s h (n + 2g) d  (QKV: n query heads, g key and value heads, of d = h / n)
//            + 2 B s h^2           (the attention's projection)
//            + 2 B s h F x 2       (the MLP's two matrices; SwiGLU's three, gate, up and down: x 3;
//                                   a MoE layer's active ones: the router's h E, k experts' and
//                                   the shared expert's: mlp_multiply_adds)
//            + 4 B s^2 h           (scores, values)
//   logits:    2 B s h V           (the tied word embedding or an output layer of its own: the same product)
// and the backward twice the forward. Without grouped-query attention g = n and QKV is 3h^2; for
// F = 4h a layer's forward is then 24 B s h^2 (1 + s/(6h)), so forward and backward make
// 72 B s l h^2 (1 + s/(6h) + V/(12 l h)). Megatron-LM's num_floating_point_operations
// (megatron/training/training.py) counts the same, 12 B s l h^2 ((1 + g/n + s/h) + (F/h) x 3/2
// with --swiglu + V/(2 l h)) with its query projection n d = h: the same three passes. Activation
// recomputation runs the forward of the recomputed layers once more, not the logits (the head
// keeps its activations): with every layer recomputed the layers make four passes, the logits
// three, 4 x 24 B s l h^2 (1 + s/(6h)) + 3 x 2 B s h V = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)),
// the paper's formula (which assumes recomputation). `recomputed`: recomputed_layers(); a
// selectively recomputed layer (`cores`: recomputed_attention_cores()) adds its probabilities'
// scores q k^T once more, 2 B s^2 h: half the attention core's 4 B s^2 h that Korthikanti et al.
// 2022 (§5) and Megatron-LM recompute, since the product with v is kept (gpt.h block_backward).
// A layer's MLP multiply-adds per token, mean over the layers: the dense MLP's, or a MoE layer's
// active ones (the router, the k experts a token goes to, the shared expert and its gate; the
// experts a token skips cost it nothing)
static double mlp_multiply_adds(const GPTConfig* c) {
    double h = c->hidden_size, glu = c->swiglu ? 3.0 : 2.0, sum = 0.0;
    for (int l = 0; l < c->num_layers; l++)
        sum += !is_moe_layer(c, l) ? glu * h * c->ffn_hidden_size
                                   : h * c->num_experts + c->moe_router_topk * glu * h * c->moe_ffn_hidden_size +
                                         (c->moe_shared_expert_intermediate_size ? glu * h * c->moe_shared_expert_intermediate_size + h : 0.0);
    return sum / c->num_layers;
}

static double flops_per_step(const GPTConfig* c, int global_batch, int recomputed, int cores) {
    double B = global_batch, s = c->seq_length, h = c->hidden_size;
    double l = c->num_layers, V = c->padded_vocab_size, n = c->num_attention_heads, g = query_groups(c), d = h / n;
    double matrices = h * (n + 2.0 * g) * d + h * h + mlp_multiply_adds(c);   // multiply-adds per token
    double core = 4.0 * B * s * s * h, layer = 2.0 * B * s * matrices + core, logits = 2.0 * B * s * h * V;
    return (3.0 * l + recomputed) * layer + cores * core / 2.0 + 3.0 * logits;
}

// The model FLOPs of a step as Megatron-LM HEAD counts them for its log line's throughput
// (megatron/training/training.py, num_floating_point_operations: 12 B s l h^2 (1 + g/n +
// s/h/2) for attention, "only half of the attention matrix is non-zero" under the causal
// mask, plus the MLP and 6 B s h V for the logits; no recomputation): flops_per_step without
// recomputation less half its attention core (its 3 x 4 B s^2 h a layer becomes 6 B s^2 h)
static double causal_flops_per_step(const GPTConfig* c, int global_batch) {
    double B = global_batch, s = c->seq_length, h = c->hidden_size;
    return flops_per_step(c, global_batch, 0, 0) - 3.0 * c->num_layers * 2.0 * B * s * s * h;
}
