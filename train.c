/*
train.c — the gridgpt trainer: flags, setup, the training loop, schedules, logging,
evaluation, checkpoints (any grid saves, any grid loads), the Hugging Face export, sampling.

One source, two builds: gcc compiles it with the plain-C kernels and MPI (train_cpu); nvcc
compiles it as CUDA with cuBLAS and NCCL (train_gpu). Flags, log lines and files are the
same in both, and follow Megatron-LM's names so that its users feel at home.

Reading order: flags -> config checks -> schedules -> data -> the trainer -> checkpoints ->
Hugging Face export -> setup -> step -> log -> sampling -> the run -> main.
*/
#include "kernels.cuh"
#include "gpt.h"
#include "parallel.h"
#include "data.c"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

// ----------------------------------------------------------------------------
// flags

typedef struct {
    // model
    int num_layers, hidden_size, num_attention_heads, ffn_hidden_size;
    int seq_length, max_position_embeddings, vocab_size, make_vocab_size_divisible_by;
    int embed_layernorm;
    float init_method_std;
    int seed;
    // parallelism
    int tensor_model_parallel_size, pipeline_model_parallel_size;
    // batch and length of training
    int micro_batch_size, global_batch_size;
    int rampup_batch_size[3];          // start, increment, samples; start 0 = no ramp-up
    int train_iters;
    long long train_samples;
    // learning rate
    float lr, min_lr, lr_warmup_fraction;
    const char* lr_decay_style;
    long long lr_warmup_samples, lr_decay_samples;
    int lr_warmup_iters, lr_decay_iters;
    // optimizer
    float adam_beta1, adam_beta2, adam_eps, weight_decay, clip_grad;
    // data and evaluation
    const char* data_path[64];         // [weight] prefix [weight prefix ...]
    int data_path_count;
    const char* split;
    const char* data_cache_path;
    int eval_interval, eval_iters;
    int unigram_baseline;
    // logging and sampling
    int log_interval;
    int log_comm;
    // checkpoints
    const char *save, *load;
    int save_interval, exit_interval, exit_duration_in_mins, keep_last;
    int no_load_optim, no_load_rng, finetune;
    const char* export_hf;
    int generate_tokens;
    const char* generate_prompt;
    float temperature;
    int help;
} Args;

typedef enum { FLAG_INT, FLAG_LONG, FLAG_FLOAT, FLAG_STRING, FLAG_SWITCH, FLAG_INT3, FLAG_LIST } FlagKind;

typedef struct {
    const char* name;
    FlagKind kind;
    void* dest;
    const char* help;
} Flag;

static void set_defaults(Args* a) {
    memset(a, 0, sizeof(*a));
    a->num_layers = 4;
    a->hidden_size = 256;
    a->num_attention_heads = 4;
    a->seq_length = 128;
    a->make_vocab_size_divisible_by = 128;
    a->init_method_std = 0.02f;
    a->seed = 1234;
    a->tensor_model_parallel_size = 1;
    a->pipeline_model_parallel_size = 1;
    a->micro_batch_size = 4;
    a->lr = 1e-4f;
    a->lr_decay_style = "linear";
    a->adam_beta1 = 0.9f;
    a->adam_beta2 = 0.999f;
    a->adam_eps = 1e-8f;
    a->weight_decay = 0.01f;
    a->clip_grad = 1.0f;
    a->split = "969,30,1";
    a->eval_interval = 1000;
    a->eval_iters = 100;
    a->log_interval = 100;
    a->temperature = 1.0f;
}

// Megatron-LM's flag names and defaults (where Megatron has no default, a small model)
static int flag_table(Args* a, Flag* f) {
    Flag all[] = {
        {"--num-layers", FLAG_INT, &a->num_layers, "transformer layers (4)"},
        {"--hidden-size", FLAG_INT, &a->hidden_size, "model width (256)"},
        {"--num-attention-heads", FLAG_INT, &a->num_attention_heads, "attention heads (4)"},
        {"--ffn-hidden-size", FLAG_INT, &a->ffn_hidden_size, "MLP width (4 x hidden)"},
        {"--seq-length", FLAG_INT, &a->seq_length, "tokens per sample (128)"},
        {"--max-position-embeddings", FLAG_INT, &a->max_position_embeddings, "position table size (seq-length)"},
        {"--vocab-size", FLAG_INT, &a->vocab_size, "vocabulary (default: largest token id in the data + 1)"},
        {"--make-vocab-size-divisible-by", FLAG_INT, &a->make_vocab_size_divisible_by, "pad vocabulary to a multiple of this x TP (128)"},
        {"--embed-layernorm", FLAG_SWITCH, &a->embed_layernorm, "LayerNorm after the embedding (BLOOM)"},
        {"--init-method-std", FLAG_FLOAT, &a->init_method_std, "std of the normal init (0.02)"},
        {"--seed", FLAG_INT, &a->seed, "seed of init and data order (1234)"},
        {"--tensor-model-parallel-size", FLAG_INT, &a->tensor_model_parallel_size, "TP (1)"},
        {"--pipeline-model-parallel-size", FLAG_INT, &a->pipeline_model_parallel_size, "PP (1)"},
        {"--micro-batch-size", FLAG_INT, &a->micro_batch_size, "samples per micro-batch (4)"},
        {"--global-batch-size", FLAG_INT, &a->global_batch_size, "samples per step (micro-batch x DP)"},
        {"--rampup-batch-size", FLAG_INT3, a->rampup_batch_size, "START INCREMENT SAMPLES: ramp the global batch up"},
        {"--train-iters", FLAG_INT, &a->train_iters, "steps to train"},
        {"--train-samples", FLAG_LONG, &a->train_samples, "samples to train (instead of --train-iters)"},
        {"--lr", FLAG_FLOAT, &a->lr, "peak learning rate (1e-4)"},
        {"--min-lr", FLAG_FLOAT, &a->min_lr, "final learning rate (0)"},
        {"--lr-decay-style", FLAG_STRING, &a->lr_decay_style, "constant | linear | cosine | inverse-square-root (linear)"},
        {"--lr-warmup-samples", FLAG_LONG, &a->lr_warmup_samples, "warm-up length in samples"},
        {"--lr-warmup-iters", FLAG_INT, &a->lr_warmup_iters, "warm-up length in steps"},
        {"--lr-warmup-fraction", FLAG_FLOAT, &a->lr_warmup_fraction, "warm-up as a fraction of the decay length"},
        {"--lr-decay-samples", FLAG_LONG, &a->lr_decay_samples, "decay length in samples (train samples)"},
        {"--lr-decay-iters", FLAG_INT, &a->lr_decay_iters, "decay length in steps (train iters)"},
        {"--adam-beta1", FLAG_FLOAT, &a->adam_beta1, "(0.9)"},
        {"--adam-beta2", FLAG_FLOAT, &a->adam_beta2, "(0.999)"},
        {"--adam-eps", FLAG_FLOAT, &a->adam_eps, "(1e-8)"},
        {"--weight-decay", FLAG_FLOAT, &a->weight_decay, "decoupled decay of matrices and embeddings (0.01)"},
        {"--clip-grad", FLAG_FLOAT, &a->clip_grad, "clip the global gradient norm to this (1.0; 0 = off)"},
        {"--data-path", FLAG_LIST, a->data_path, "[WEIGHT] PREFIX [...]: Megatron .bin/.idx dataset(s)"},
        {"--split", FLAG_STRING, &a->split, "train,valid,test document split (969,30,1)"},
        {"--data-cache-path", FLAG_STRING, &a->data_cache_path, "DIR for the sample-index cache (next to the data)"},
        {"--eval-interval", FLAG_INT, &a->eval_interval, "steps between evaluations (1000)"},
        {"--eval-iters", FLAG_INT, &a->eval_iters, "global batches per evaluation (100)"},
        {"--unigram-baseline", FLAG_SWITCH, &a->unigram_baseline, "report the data's order-0 entropy next to the loss"},
        {"--log-interval", FLAG_INT, &a->log_interval, "steps between log lines (100)"},
        {"--log-comm", FLAG_SWITCH, &a->log_comm, "log the bytes each group's communication sent per step"},
        {"--save", FLAG_STRING, &a->save, "DIR: save checkpoints here"},
        {"--load", FLAG_STRING, &a->load, "DIR: resume from its latest checkpoint (any layout)"},
        {"--save-interval", FLAG_INT, &a->save_interval, "steps between checkpoints (0: only at the end)"},
        {"--exit-interval", FLAG_INT, &a->exit_interval, "save and exit when the iteration is a multiple of this"},
        {"--exit-duration-in-mins", FLAG_INT, &a->exit_duration_in_mins, "save and exit after this many minutes"},
        {"--keep-last", FLAG_INT, &a->keep_last, "keep only the newest N checkpoints (0: all)"},
        {"--no-load-optim", FLAG_SWITCH, &a->no_load_optim, "load weights and counters, not the optimizer state"},
        {"--no-load-rng", FLAG_SWITCH, &a->no_load_rng, "use this run's --seed, not the checkpoint's"},
        {"--finetune", FLAG_SWITCH, &a->finetune, "load weights only; iteration and data position start at 0"},
        {"--export-hf", FLAG_STRING, &a->export_hf, "OUT: write --load's latest checkpoint as a Hugging Face GPT-2, then exit"},
        {"--generate-tokens", FLAG_INT, &a->generate_tokens, "sample this many tokens after training (0)"},
        {"--generate-prompt", FLAG_STRING, &a->generate_prompt, "text the sample starts from (byte-level data)"},
        {"--temperature", FLAG_FLOAT, &a->temperature, "sampling temperature (1.0)"},
        {"--help", FLAG_SWITCH, &a->help, "print this list"},
    };
    int n = (int)(sizeof(all) / sizeof(all[0]));
    if (f) memcpy(f, all, sizeof(all));
    return n;
}

static void print_usage(Args* a) {
    Flag flags[64];
    int n = flag_table(a, flags);
    printf("usage: train_cpu|train_gpu [flags]   (mpirun -np N for several ranks)\n");
    for (int i = 0; i < n; i++) printf("  %-32s %s\n", flags[i].name, flags[i].help);
}

static long long parse_integer(const char* flag, const char* s) {
    char* end = NULL;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0') config_error("%s expects an integer, got '%s'", flag, s);
    return v;
}

static float parse_float(const char* flag, const char* s) {
    char* end = NULL;
    float v = strtof(s, &end);
    if (end == s || *end != '\0' || !isfinite(v)) config_error("%s expects a number, got '%s'", flag, s);
    return v;
}

static void parse_flags(Args* a, int argc, char** argv) {
    Flag flags[64];
    int n = flag_table(a, flags);
    for (int i = 1; i < argc; i++) {
        const Flag* f = NULL;
        for (int k = 0; k < n; k++)
            if (strcmp(argv[i], flags[k].name) == 0) f = &flags[k];
        if (!f) config_error("unknown flag '%s' (see --help)", argv[i]);
        if (f->kind == FLAG_SWITCH) {
            *(int*)f->dest = 1;
            continue;
        }
        int values = f->kind == FLAG_INT3 ? 3 : 1;
        if (i + values >= argc) config_error("%s expects %s", f->name, values == 3 ? "three integers" : "a value");
        const char* v = argv[++i];
        if (strncmp(v, "--", 2) == 0) config_error("%s expects a value, got the flag '%s'", f->name, v);
        switch (f->kind) {
        case FLAG_INT: *(int*)f->dest = (int)parse_integer(f->name, v); break;
        case FLAG_LONG: *(long long*)f->dest = parse_integer(f->name, v); break;
        case FLAG_FLOAT: *(float*)f->dest = parse_float(f->name, v); break;
        case FLAG_STRING: *(const char**)f->dest = v; break;
        case FLAG_INT3:
            for (int k = 0; k < 3; k++) ((int*)f->dest)[k] = (int)parse_integer(f->name, argv[i + k]);
            i += 2;
            break;
        case FLAG_LIST:   // every value up to the next flag
            a->data_path_count = 0;
            for (; i < argc && strncmp(argv[i], "--", 2) != 0; i++) {
                if (a->data_path_count == 64) config_error("%s takes at most 64 values", f->name);
                a->data_path[a->data_path_count++] = argv[i];
            }
            i--;
            break;
        case FLAG_SWITCH: break;
        }
    }
}

// ----------------------------------------------------------------------------
// config checks: every one before any allocation, one line each, exit status 2

static void check_positive(const char* flag, long long v) {
    if (v <= 0) config_error("%s must be positive, got %lld", flag, v);
}

static void check_args(Args* a) {
    check_positive("--num-layers", a->num_layers);
    check_positive("--hidden-size", a->hidden_size);
    check_positive("--num-attention-heads", a->num_attention_heads);
    check_positive("--seq-length", a->seq_length);
    check_positive("--micro-batch-size", a->micro_batch_size);
    check_positive("--make-vocab-size-divisible-by", a->make_vocab_size_divisible_by);
    check_positive("--log-interval", a->log_interval);
    check_positive("--tensor-model-parallel-size", a->tensor_model_parallel_size);
    check_positive("--pipeline-model-parallel-size", a->pipeline_model_parallel_size);
    if (a->ffn_hidden_size == 0) a->ffn_hidden_size = 4 * a->hidden_size;
    check_positive("--ffn-hidden-size", a->ffn_hidden_size);
    if (a->max_position_embeddings == 0) a->max_position_embeddings = a->seq_length;
    if (a->hidden_size % a->num_attention_heads != 0)
        config_error("--hidden-size %d is not divisible by --num-attention-heads %d", a->hidden_size, a->num_attention_heads);
    if (a->seq_length > a->max_position_embeddings)
        config_error("--seq-length %d exceeds --max-position-embeddings %d", a->seq_length, a->max_position_embeddings);
    if (a->init_method_std <= 0.0f) config_error("--init-method-std must be positive, got %g", a->init_method_std);
    if (a->data_path_count == 0) config_error("--data-path is required (a Megatron .bin/.idx prefix; ./preprocess makes one)");
    // parallel layout
    int TP = a->tensor_model_parallel_size, PP = a->pipeline_model_parallel_size;
    if (grid.world_size % (TP * PP) != 0)
        config_error("world size %d is not a multiple of --tensor-model-parallel-size %d x --pipeline-model-parallel-size %d",
                     grid.world_size, TP, PP);
    if (a->num_attention_heads % TP != 0)
        config_error("--num-attention-heads %d is not divisible by --tensor-model-parallel-size %d", a->num_attention_heads, TP);
    if (a->ffn_hidden_size % TP != 0)
        config_error("--ffn-hidden-size %d is not divisible by --tensor-model-parallel-size %d", a->ffn_hidden_size, TP);
    if (a->num_layers % PP != 0)
        config_error("--num-layers %d is not divisible by --pipeline-model-parallel-size %d", a->num_layers, PP);
    if (a->generate_tokens > 0 && TP * PP != 1)
        config_error("--generate-tokens samples on one model-parallel rank: it needs tensor and pipeline parallel size 1");
    int dp = grid.world_size / (TP * PP);
    // batch
    if (a->global_batch_size == 0) a->global_batch_size = a->micro_batch_size * dp;
    check_positive("--global-batch-size", a->global_batch_size);
    if (a->global_batch_size % (a->micro_batch_size * dp) != 0)
        config_error("--global-batch-size %d is not divisible by --micro-batch-size %d x data-parallel size %d",
                     a->global_batch_size, a->micro_batch_size, dp);
    // length of training: iterations or samples, not both (Megatron's rule)
    if ((a->train_iters > 0) == (a->train_samples > 0))
        config_error("give exactly one of --train-iters and --train-samples");
    if (a->train_iters < 0 || a->train_samples < 0) config_error("--train-iters / --train-samples must be positive");
    if (a->train_iters > 0 && (a->lr_warmup_samples || a->lr_decay_samples || a->rampup_batch_size[0]))
        config_error("--train-iters goes with --lr-warmup-iters / --lr-decay-iters and no --rampup-batch-size (use --train-samples)");
    if (a->train_samples > 0 && (a->lr_warmup_iters || a->lr_decay_iters))
        config_error("--train-samples goes with --lr-warmup-samples / --lr-decay-samples, not the -iters forms");
    if (a->lr_warmup_fraction != 0.0f && (a->lr_warmup_iters || a->lr_warmup_samples))
        config_error("give --lr-warmup-fraction or --lr-warmup-iters/--lr-warmup-samples, not both");
    const char* styles[] = {"constant", "linear", "cosine", "inverse-square-root"};
    int style_ok = 0;
    for (int i = 0; i < 4; i++) style_ok |= strcmp(a->lr_decay_style, styles[i]) == 0;
    if (!style_ok) config_error("--lr-decay-style must be constant, linear, cosine or inverse-square-root, got '%s'", a->lr_decay_style);
    if (a->lr < 0.0f || a->min_lr < 0.0f || a->min_lr > a->lr)
        config_error("--lr %g and --min-lr %g must satisfy 0 <= min-lr <= lr", a->lr, a->min_lr);
    if (a->adam_beta1 < 0.0f || a->adam_beta1 >= 1.0f || a->adam_beta2 < 0.0f || a->adam_beta2 >= 1.0f)
        config_error("--adam-beta1 and --adam-beta2 must be in [0, 1)");
    if (a->adam_eps <= 0.0f) config_error("--adam-eps must be positive");
    if (a->eval_interval <= 0 || a->eval_iters < 0) config_error("--eval-interval must be positive and --eval-iters not negative");
    if (a->generate_tokens < 0) config_error("--generate-tokens must not be negative");
    if (a->temperature <= 0.0f) config_error("--temperature must be positive");
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

static void check_rampup(const Args* a, const BatchSchedule* b) {
    if (b->rampup_samples == 0) return;
    if (b->start <= 0 || b->increment <= 0 || b->rampup_samples <= 0)
        config_error("--rampup-batch-size expects three positive integers START INCREMENT SAMPLES");
    if (b->start > b->global_batch_size || (b->global_batch_size - b->start) % b->increment != 0)
        config_error("--rampup-batch-size: global batch %d minus start %d is not a multiple of the increment %d",
                     b->global_batch_size, b->start, b->increment);
    for (int g = b->start; g <= b->global_batch_size; g += b->increment)
        if (g % b->micro_batch_times_dp != 0)
            config_error("--rampup-batch-size: batch size %d on the ramp is not divisible by micro-batch %d x data-parallel size %d",
                         g, a->micro_batch_size, b->micro_batch_times_dp / a->micro_batch_size);
}

// Megatron's update_train_iters: the steps that --train-samples takes, counting the ramp
static int train_iters_for_samples(const BatchSchedule* b, long long train_samples) {
    if (b->rampup_samples == 0) return (int)(train_samples / b->global_batch_size);
    long long consumed = 0;
    int iters = 0;
    while (consumed <= b->rampup_samples) {
        consumed += current_global_batch_size(b, consumed);
        iters++;
    }
    long long rest = train_samples - consumed;   // Python's floor division, as Megatron
    iters += (int)(rest >= 0 ? rest / b->global_batch_size : -((-rest + b->global_batch_size - 1) / b->global_batch_size));
    return iters;
}

// ----------------------------------------------------------------------------
// learning-rate schedule (Megatron's OptimizerParamScheduler.get_lr), by consumed samples:
// linear warm-up from 0, then the decay style down to min-lr at the end of the decay.

typedef struct {
    float max_lr, min_lr;
    long long warmup_steps, decay_steps;   // in samples
    const char* style;
} LRSchedule;

static float learning_rate(const LRSchedule* s, long long num_steps) {
    if (s->warmup_steps > 0 && num_steps <= s->warmup_steps)
        return s->max_lr * (float)((double)num_steps / (double)s->warmup_steps);
    if (strcmp(s->style, "constant") == 0) return s->max_lr;
    if (strcmp(s->style, "inverse-square-root") == 0) {
        double warmup = s->warmup_steps > 1 ? (double)s->warmup_steps : 1.0;
        double steps = num_steps > 1 ? (double)num_steps : 1.0;
        double lr = s->max_lr * sqrt(warmup) / sqrt(steps);
        return (float)(lr > s->min_lr ? lr : s->min_lr);
    }
    if (num_steps > s->decay_steps) return s->min_lr;
    double ratio = (double)(num_steps - s->warmup_steps) / (double)(s->decay_steps - s->warmup_steps);
    double coeff = strcmp(s->style, "linear") == 0 ? 1.0 - ratio : 0.5 * (cos(M_PI * ratio) + 1.0);
    return (float)(s->min_lr + coeff * (s->max_lr - s->min_lr));
}

// Megatron's get_optimizer_param_scheduler: lengths in samples from either flag family
static LRSchedule make_lr_schedule(const Args* a, int train_iters) {
    LRSchedule s;
    s.max_lr = a->lr;
    s.min_lr = a->min_lr;
    s.style = a->lr_decay_style;
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
    if (s.warmup_steps >= s.decay_steps && strcmp(s.style, "constant") != 0 && strcmp(s.style, "inverse-square-root") != 0)
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
    int* host_tokens;             // [micro_batch_size * seq_length]
    int* host_targets;
} Loader;

static void load_micro_batch(void* ctx, int micro_batch, int* tokens, int* targets) {
    Loader* l = (Loader*)ctx;
    int T = l->seq_length;
    long long first = l->consumed + (long long)micro_batch * l->micro_batch_size * l->dp_size
                    + (long long)l->dp_rank * l->micro_batch_size;
    for (int b = 0; b < l->micro_batch_size; b++) {
        data_splits_get(l->data, l->split, first + b, l->host_sample);
        memcpy(l->host_tokens + (size_t)b * T, l->host_sample, T * sizeof(int));
        memcpy(l->host_targets + (size_t)b * T, l->host_sample + 1, T * sizeof(int));
    }
    host_to_dev(tokens, l->host_tokens, (size_t)l->micro_batch_size * T * sizeof(int));
    host_to_dev(targets, l->host_targets, (size_t)l->micro_batch_size * T * sizeof(int));
}

static Loader make_loader(const DataSplits* d, int split, const Args* a) {
    Loader l;
    memset(&l, 0, sizeof(l));
    l.data = d;
    l.split = split;
    l.micro_batch_size = a->micro_batch_size;
    l.dp_size = grid.dp_size;
    l.dp_rank = grid.dp_rank;
    l.seq_length = a->seq_length;
    l.host_sample = (int*)mallocCheck((a->seq_length + 1) * sizeof(int));
    l.host_tokens = (int*)mallocCheck((size_t)a->micro_batch_size * a->seq_length * sizeof(int));
    l.host_targets = (int*)mallocCheck((size_t)a->micro_batch_size * a->seq_length * sizeof(int));
    return l;
}

static void free_loader(Loader* l) {
    free(l->host_sample);
    free(l->host_tokens);
    free(l->host_targets);
}

// Rank 0 builds the sample indexes (or finds them cached) and writes the cache; the others
// then map the same cache files. Also settles the vocabulary: --vocab-size, or the largest
// token id + 1, and every id must lie below it.
static void open_data(DataSplits* d, Args* a, const long long samples[3]) {
    char err[1024];
    int64_t want[3] = {samples[0], samples[1], samples[2]};
    int rc = 0;
    if (grid.world_rank == 0)
        rc = data_splits_open(d, a->data_path, a->data_path_count, a->split, a->seq_length, (uint64_t)a->seed, want,
                              a->data_cache_path, 1, err, sizeof(err));
    mpiCheck(MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD));
    if (rc) config_error("%s", err);   // rank 0 says why
    if (grid.world_rank != 0) {
        rc = data_splits_open(d, a->data_path, a->data_path_count, a->split, a->seq_length, (uint64_t)a->seed, want,
                              a->data_cache_path, 0, err, sizeof(err));
        if (rc == DATA_NO_CACHE) fail("%s (the index cache must be visible to every rank: see --data-cache-path)", err);
        if (rc) fail("%s", err);
    }
    int64_t max_id = 0;
    if (data_splits_check_vocab(d, a->vocab_size, &max_id, err, sizeof(err)))
        config_error("%s (--vocab-size %d)", err, a->vocab_size);
    if (a->vocab_size == 0) a->vocab_size = (int)(max_id + 1);
}

// ----------------------------------------------------------------------------
// measures

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Model FLOPs of one training step of global batch Bg (Narayanan et al. 2021, §5.1, without
// activation recomputation): a forward pass costs 2 FLOPs per multiply-add,
//   per layer: 2 B s (3h^2 + h^2 + 2 h F)  (QKV, projection, MLP)  +  4 B s^2 h  (scores, values)
//   logits:    2 B s h V
// and the backward twice the forward. For F = 4h this is 72 B s l h^2 (1 + s/(6h) + V/(12 l h)).
static double flops_per_step(const GPTConfig* c, int global_batch) {
    double B = global_batch, s = c->seq_length, h = c->hidden_size, F = c->ffn_hidden_size;
    double l = c->num_layers, V = c->padded_vocab_size;
    double forward = l * (2.0 * B * s * (4.0 * h * h + 2.0 * h * F) + 4.0 * B * s * s * h) + 2.0 * B * s * h * V;
    return 3.0 * forward;
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
        Schedule s = {m, load_micro_batch, l, 0.0f, 0.0, 0, 0};
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
    for (int i = 0; i < n; i++) putchar('-');
    printf("\n%s\n", line);
    for (int i = 0; i < n; i++) putchar('-');
    printf("\n");
    fflush(stdout);
}

// ----------------------------------------------------------------------------
// the trainer

typedef struct {
    Args args;
    GPTConfig cfg;
    GPT model;
    AdamWConfig adam;
    AdamWState opt;
    BatchSchedule batch;
    LRSchedule lr;
    int train_iters;
    DataSplits data;
    Loader train, valid, test;
    int iteration;
    long long consumed_samples;     // samples trained on so far (the data position)
    long long scheduler_samples;    // samples of successful updates (drives the LR, as Megatron)
    int last_saved;                 // iteration of the last checkpoint this run wrote (-1: none)
    long long valid_consumed_at_load;
} Trainer;

typedef struct {
    float loss, grad_norm, lr;
    int global_batch, skipped, nan_loss;
    int max_in_flight;   // most micro-batches whose activations this stage held at once
    double comm[4];      // bytes this rank sent in the step: tp, dp, pp, embedding groups
} StepResult;

static void comm_counters(double out[4]) {
    out[0] = grid.tp.bytes_sent;
    out[1] = grid.dp.bytes_sent;
    out[2] = grid.pp.bytes_sent;
    out[3] = grid.embedding.bytes_sent;
}

// ----------------------------------------------------------------------------
// checkpoints: one canonical layout, whatever the grid
// A checkpoint is a directory DIR/iter_0000100/ with
//   metadata.txt  the run's counters, the model config, the sections and one line per tensor
//                 (name, whole shape, offset in its section, CRC-32 of each section's bytes);
//   tensors.bin   three sections back to back: the fp32 master weights, Adam's first and
//                 second moments; in each, every tensor whole, row-major, in the order of the
//                 tensor table of a one-process model, the vocabulary without padding rows.
// Each rank writes and reads only its own slices: the part of each tensor inside its ZeRO
// shard, at the tensor's place in the file (MPI-IO, so any number of hosts can share the
// file). Nothing is written in place: a save goes to iter_0000100.tmp/, is synced, renamed,
// and latest_checkpointed_iteration.txt (Megatron's name) is replaced last, so a crash in
// the middle of a save leaves the previous checkpoint as it was.

static const char* const SECTION_NAMES[3] = {"weight", "exp_avg", "exp_avg_sq"};

// CRC-32 as zlib computes it (reflected polynomial 0xEDB88320); start with crc = 0.
// "Slicing by 8" (Kounavis & Berry 2005): eight tables let the loop take 8 bytes per step
// instead of one, the same result ~4x faster (checkpoints checksum gigabytes).
static uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
    static uint32_t table[8][256];
    if (table[0][1] == 0) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[0][i] = c;
        }
        for (int s = 1; s < 8; s++)   // table[s][i]: byte i followed by s zero bytes
            for (int i = 0; i < 256; i++) table[s][i] = (table[s - 1][i] >> 8) ^ table[0][table[s - 1][i] & 0xFF];
    }
    const uint8_t* p = (const uint8_t*)data;
    crc = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = table[7][lo & 0xFF] ^ table[6][(lo >> 8) & 0xFF] ^ table[5][(lo >> 16) & 0xFF] ^ table[4][lo >> 24] ^
              table[3][p[4]] ^ table[2][p[5]] ^ table[1][p[6]] ^ table[0][p[7]];
    }
    for (; n > 0; n--, p++) crc = table[0][(crc ^ *p) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

// the canonical table: the model as one process holds it (no memory is allocated)
static GPT canonical_table(const GPTConfig* c) {
    GPT whole;
    memset(&whole, 0, sizeof(whole));
    whole.cfg = *c;
    whole.tp_size = 1;
    whole.num_local_layers = c->num_layers;
    whole.is_first_stage = whole.is_last_stage = 1;
    build_tensor_table(&whole);
    return whole;
}

static size_t canonical_bytes(const TensorDesc* t) { return (size_t)t->valid_rows * t->cols * sizeof(float); }

// where each tensor of the table sits in a section, and the section's size
typedef struct {
    GPT whole;
    size_t* offset;        // [whole.num_tensors]
    size_t section_bytes;
} CanonicalLayout;

static CanonicalLayout canonical_layout(const GPTConfig* c) {
    CanonicalLayout L;
    L.whole = canonical_table(c);
    L.offset = (size_t*)mallocCheck(L.whole.num_tensors * sizeof(size_t));
    L.section_bytes = 0;
    for (int i = 0; i < L.whole.num_tensors; i++) {
        L.offset[i] = L.section_bytes;
        L.section_bytes += canonical_bytes(&L.whole.tensors[i]);
    }
    return L;
}

static void free_layout(CanonicalLayout* L) {
    free(L->whole.tensors);
    free(L->whole.layer_tensors);
    free(L->offset);
}

static int canonical_index(const CanonicalLayout* L, const char* name) {
    for (int i = 0; i < L->whole.num_tensors; i++)
        if (strcmp(L->whole.tensors[i].name, name) == 0) return i;
    return -1;
}

// Walk the part of local tensor t inside [lo, hi) of the flat buffer, as runs that are
// contiguous in the canonical file: fn(run's flat index, run length, canonical byte offset
// within the section). A slice of whole rows is contiguous across rows; a column slice is
// one run per row. Runs stop before the vocabulary's padding rows and at RUN_MAX elements.
#define RUN_MAX ((size_t)1 << 20)
typedef void (*RunFn)(void* ctx, size_t flat, size_t n, size_t file_offset);

static void for_each_run(const TensorDesc* t, size_t tensor_offset, size_t lo, size_t hi, RunFn fn, void* ctx) {
    size_t cols = t->local_cols;
    for (size_t f = lo; f < hi;) {
        size_t e = f - t->offset, row = t->row_start + e / cols, c = e % cols;
        if (row >= (size_t)t->valid_rows) break;   // the rest is padding
        size_t n = cols == (size_t)t->cols ? (t->valid_rows - row) * cols - c : cols - c;
        n = n < hi - f ? n : hi - f;
        n = n < RUN_MAX ? n : RUN_MAX;
        fn(ctx, f, n, tensor_offset + (row * t->cols + t->col_start + c) * sizeof(float));
        f += n;
    }
}

// one run between the file and a float array in device memory, through a host buffer of
// RUN_MAX floats: a save or load never holds more of the model than that on the host
typedef struct {
    MPI_File file;
    size_t section_base;       // byte offset of the section in tensors.bin
    float* dev;                // the array (device memory) ...
    size_t dev_start;          // ... whose element 0 is this flat index
    float* bounce;             // [RUN_MAX] on the host
    int reading;
} RunIO;

static void run_io(void* ctx, size_t flat, size_t n, size_t file_offset) {
    RunIO* io = (RunIO*)ctx;
    float* p = io->dev + (flat - io->dev_start);
    MPI_Offset at = (MPI_Offset)(io->section_base + file_offset);
    if (io->reading) {
        mpiCheck(MPI_File_read_at(io->file, at, io->bounce, (int)n, MPI_FLOAT, MPI_STATUS_IGNORE));
        host_to_dev(p, io->bounce, n * sizeof(float));
    } else {
        dev_to_host(io->bounce, p, n * sizeof(float));
        mpiCheck(MPI_File_write_at(io->file, at, io->bounce, (int)n, MPI_FLOAT, MPI_STATUS_IGNORE));
    }
}

// Does this rank write tensor t? Each element once: not the tied copy of the last stage, a
// tensor replicated over tensor ranks only from tensor rank 0 (their values are identical).
static int writes_tensor(const GPT* m, const TensorDesc* t) {
    return !t->tied_copy && (t->split_axis >= 0 || m->tp_rank == 0);
}

// read (reading = 1) or write the shard's parts of every local tensor: the master weights,
// and with all three sections the Adam moments
static void shard_io(Trainer* t, const CanonicalLayout* L, MPI_File f, int reading, int sections) {
    const GPT* m = &t->model;
    float* arrays[3] = {t->opt.master, t->opt.m, t->opt.v};
    float* bounce = (float*)mallocCheck(RUN_MAX * sizeof(float));
    for (int k = 0; k < sections; k++) {
        if (reading && k == 0 && sizeof(floatX) == sizeof(float)) continue;   // CPU: the master is the params, loaded
        RunIO io = {f, k * L->section_bytes, arrays[k], t->opt.shard_start, bounce, reading};
        for (int i = 0; i < m->num_tensors; i++) {
            const TensorDesc* tensor = &m->tensors[i];
            if (!reading && !writes_tensor(m, tensor)) continue;
            size_t lo, hi;
            shard_part(&t->opt, tensor, &lo, &hi);
            if (lo < hi) for_each_run(tensor, L->offset[canonical_index(L, tensor->name)], lo, hi, run_io, &io);
        }
    }
    free(bounce);
}

// CRC-32 of every tensor in every section, each rank reading its share of the tensors back
static void section_checksums(const CanonicalLayout* L, MPI_File f, uint32_t* crc /* [num_tensors][3] */) {
    int n = L->whole.num_tensors;
    memset(crc, 0, 3 * n * sizeof(uint32_t));
    for (int i = grid.world_rank; i < n; i += grid.world_size) {
        size_t bytes = canonical_bytes(&L->whole.tensors[i]);
        uint8_t* buf = (uint8_t*)mallocCheck(bytes);
        for (int k = 0; k < 3; k++) {
            MPI_Offset at = (MPI_Offset)(k * L->section_bytes + L->offset[i]);
            mpiCheck(MPI_File_read_at(f, at, buf, (int)bytes, MPI_BYTE, MPI_STATUS_IGNORE));
            crc[3 * i + k] = crc32_update(0, buf, bytes);
        }
        free(buf);
    }
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, crc, 3 * n, MPI_UINT32_T, MPI_BOR, MPI_COMM_WORLD));
}

static void write_metadata(const Trainer* t, const CanonicalLayout* L, const uint32_t* crc, const char* path) {
    FILE* f = fopen(path, "w");
    if (!f) fail("cannot write %s: %s", path, strerror(errno));
    const GPTConfig* c = &t->cfg;
    fprintf(f, "gridgpt-checkpoint 1\niteration %d\nconsumed_samples %lld\nscheduler_samples %lld\noptimizer_step %d\n"
            "consumed_valid_samples %lld\n", t->iteration, t->consumed_samples, t->scheduler_samples, t->opt.step,
            t->valid.consumed);
    fprintf(f, "config num_layers %d\nconfig hidden_size %d\nconfig num_attention_heads %d\nconfig ffn_hidden_size %d\n"
            "config seq_length %d\nconfig max_position_embeddings %d\nconfig vocab_size %d\n"
            "config make_vocab_size_divisible_by %d\nconfig embed_layernorm %d\nconfig init_method_std %.9g\n"
            "config seed %llu\n", c->num_layers, c->hidden_size, c->num_attention_heads, c->ffn_hidden_size,
            c->seq_length, c->max_position_embeddings, c->vocab_size, c->make_vocab_size_divisible_by,
            c->embed_layernorm, c->init_method_std, (unsigned long long)c->seed);
    for (int k = 0; k < 3; k++) fprintf(f, "section %s %zu %zu\n", SECTION_NAMES[k], k * L->section_bytes, L->section_bytes);
    for (int i = 0; i < L->whole.num_tensors; i++) {
        const TensorDesc* d = &L->whole.tensors[i];
        fprintf(f, "tensor %s %d %d %zu %08x %08x %08x\n", d->name, d->valid_rows, d->cols, L->offset[i],
                crc[3 * i], crc[3 * i + 1], crc[3 * i + 2]);
    }
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) fail("writing %s: %s", path, strerror(errno));
    fclose(f);
}

static void sync_dir(const char* path) {
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

// write `text` to path through a temporary file and a rename
static void replace_file(const char* path, const char* text) {
    char tmp[4608];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE* f = fopen(tmp, "w");
    if (!f || fputs(text, f) < 0 || fflush(f) != 0 || fsync(fileno(f)) != 0) fail("cannot write %s: %s", tmp, strerror(errno));
    fclose(f);
    if (rename(tmp, path) != 0) fail("cannot rename %s to %s: %s", tmp, path, strerror(errno));
}

static void iter_dir(char* out, size_t len, const char* dir, int iteration) {
    snprintf(out, len, "%s/iter_%07d", dir, iteration);
}

// --keep-last N: remove all but the N newest iter_* directories (rank 0, after a save)
static void rotate_checkpoints(const char* dir, int keep) {
    int iters[4096], n = 0;
    DIR* d = opendir(dir);
    if (!d) return;
    for (struct dirent* e; (e = readdir(d)) != NULL && n < 4096;) {
        int it;
        char rest;
        if (sscanf(e->d_name, "iter_%d%c", &it, &rest) == 1) iters[n++] = it;
    }
    closedir(d);
    for (int i = 0; i < n; i++) {
        int newer = 0;
        for (int j = 0; j < n; j++) newer += iters[j] > iters[i];
        if (newer < keep) continue;
        char path[4200], cmd[8600];
        iter_dir(path, sizeof(path), dir, iters[i]);
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
        if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", path);
    }
}

static void checkpoint_save(Trainer* t, const char* dir) {
    double t0 = now_seconds();
    char final_dir[4200], tmp_dir[4300], path[4400];
    iter_dir(final_dir, sizeof(final_dir), dir, t->iteration);
    snprintf(tmp_dir, sizeof(tmp_dir), "%s.tmp", final_dir);
    if (grid.world_rank == 0) {
        mkdir(dir, 0755);
        snprintf(path, sizeof(path), "rm -rf '%s'", tmp_dir);   // a crashed earlier attempt
        if (system(path) != 0 || mkdir(tmp_dir, 0755) != 0) fail("cannot create %s: %s", tmp_dir, strerror(errno));
    }
    mpiCheck(MPI_Barrier(MPI_COMM_WORLD));
    CanonicalLayout L = canonical_layout(&t->cfg);
    snprintf(path, sizeof(path), "%s/tensors.bin", tmp_dir);
    MPI_File f;
    mpiCheck(MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_CREATE | MPI_MODE_RDWR, MPI_INFO_NULL, &f));
    mpiCheck(MPI_File_set_size(f, (MPI_Offset)(3 * L.section_bytes)));
    shard_io(t, &L, f, 0, 3);
    mpiCheck(MPI_File_sync(f));
    mpiCheck(MPI_Barrier(MPI_COMM_WORLD));
    uint32_t* crc = (uint32_t*)mallocCheck(3 * L.whole.num_tensors * sizeof(uint32_t));
    section_checksums(&L, f, crc);
    mpiCheck(MPI_File_close(&f));
    if (grid.world_rank == 0) {
        snprintf(path, sizeof(path), "%s/metadata.txt", tmp_dir);
        write_metadata(t, &L, crc, path);
        sync_dir(tmp_dir);
        if (rename(tmp_dir, final_dir) != 0) fail("cannot rename %s to %s: %s", tmp_dir, final_dir, strerror(errno));
        sync_dir(dir);
        char text[32];
        snprintf(text, sizeof(text), "%d\n", t->iteration);
        snprintf(path, sizeof(path), "%s/latest_checkpointed_iteration.txt", dir);
        replace_file(path, text);
        sync_dir(dir);
        if (t->args.keep_last > 0) rotate_checkpoints(dir, t->args.keep_last);
        double s = now_seconds() - t0, gb = 3.0 * L.section_bytes / 1e9;
        printf("saved checkpoint %s: %.3f GB in %.2f s (%.2f GB/s)\n", final_dir, gb, s, gb / s);
        fflush(stdout);
    }
    mpiCheck(MPI_Barrier(MPI_COMM_WORLD));
    free(crc);
    free_layout(&L);
}

// ---- loading

// ---- reading metadata.txt (the loader and the Hugging Face export share it)

typedef struct {
    char name[128];
    int rows, cols;
    size_t offset;        // in each section
    uint32_t crc[3];      // CRC-32 of the tensor's bytes in each section
} CkptTensor;

typedef struct {
    char bin_path[4300];
    int iteration, optimizer_step;
    long long consumed_samples, scheduler_samples, consumed_valid_samples;
    GPTConfig cfg;
    size_t section_offset[3], section_bytes[3];
    int num_tensors;
    CkptTensor* tensors;
} CheckpointMeta;

static int meta_error(char* err, size_t errlen, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static void checkpoint_meta_free(CheckpointMeta* m) {
    free(m->tensors);
    m->tensors = NULL;
}

// config keys a reader needs (the others are optional)
static const char* const CKPT_REQUIRED[] = {"num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
                                            "max_position_embeddings", "vocab_size", "embed_layernorm"};

static void meta_config_line(GPTConfig* c, const char* key, const char* value, unsigned* seen) {
    int* ints[] = {&c->num_layers, &c->hidden_size, &c->num_attention_heads, &c->ffn_hidden_size,
                   &c->max_position_embeddings, &c->vocab_size, &c->embed_layernorm};
    for (int k = 0; k < 7; k++)
        if (!strcmp(key, CKPT_REQUIRED[k])) {
            *ints[k] = atoi(value);
            *seen |= 1u << k;
            return;
        }
    if (!strcmp(key, "seq_length")) c->seq_length = atoi(value);
    else if (!strcmp(key, "make_vocab_size_divisible_by")) c->make_vocab_size_divisible_by = atoi(value);
    else if (!strcmp(key, "init_method_std")) c->init_method_std = (float)atof(value);
    else if (!strcmp(key, "seed")) c->seed = strtoull(value, NULL, 10);
}

// one line of metadata.txt into m; 1 if it is not understood
static int meta_line(CheckpointMeta* m, const char* line, unsigned* seen, int* version, int* cap) {
    char word[64], key[128], value[64];
    if (sscanf(line, "%63s", word) != 1) return 0;
    if (!strcmp(word, "gridgpt-checkpoint")) return sscanf(line, "%*s %d", version) != 1;
    if (!strcmp(word, "iteration")) return sscanf(line, "%*s %d", &m->iteration) != 1;
    if (!strcmp(word, "optimizer_step")) return sscanf(line, "%*s %d", &m->optimizer_step) != 1;
    if (!strcmp(word, "consumed_samples")) return sscanf(line, "%*s %lld", &m->consumed_samples) != 1;
    if (!strcmp(word, "scheduler_samples")) return sscanf(line, "%*s %lld", &m->scheduler_samples) != 1;
    if (!strcmp(word, "consumed_valid_samples")) return sscanf(line, "%*s %lld", &m->consumed_valid_samples) != 1;
    if (!strcmp(word, "config")) {
        if (sscanf(line, "%*s %127s %63s", key, value) != 2) return 1;
        meta_config_line(&m->cfg, key, value, seen);
        return 0;
    }
    if (!strcmp(word, "section")) {
        size_t off, bytes;
        if (sscanf(line, "%*s %127s %zu %zu", key, &off, &bytes) != 3) return 1;
        for (int k = 0; k < 3; k++)
            if (!strcmp(key, SECTION_NAMES[k])) {
                m->section_offset[k] = off;
                m->section_bytes[k] = bytes;
                *seen |= 1u << (8 + k);
            }
        return 0;
    }
    if (!strcmp(word, "tensor")) {
        if (m->num_tensors == *cap) {
            *cap = *cap ? 2 * *cap : 64;
            m->tensors = (CkptTensor*)realloc(m->tensors, *cap * sizeof(CkptTensor));
            if (!m->tensors) malloc_check_failed(*cap * sizeof(CkptTensor), __FILE__, __LINE__);
        }
        CkptTensor* t = &m->tensors[m->num_tensors];
        if (sscanf(line, "%*s %127s %d %d %zu %x %x %x", t->name, &t->rows, &t->cols, &t->offset, &t->crc[0], &t->crc[1],
                   &t->crc[2]) != 7)
            return 1;
        m->num_tensors++;
        return 0;
    }
    return 1;
}

// Read DIR/metadata.txt and check it against the tensor table of the config it declares
// (names, order, shapes) and the size of DIR/tensors.bin. 0, or -1 with a line in err.
static int checkpoint_meta_read(const char* dir, CheckpointMeta* m, char* err, size_t errlen) {
    memset(m, 0, sizeof(*m));
    snprintf(m->bin_path, sizeof(m->bin_path), "%s/tensors.bin", dir);
    char path[4300], line[1024];
    snprintf(path, sizeof(path), "%s/metadata.txt", dir);
    FILE* f = fopen(path, "r");
    if (!f) return meta_error(err, errlen, "checkpoint %s: %s", path, strerror(errno));
    int version = 0, lineno = 0, cap = 0;
    unsigned seen = 0;
    while (fgets(line, sizeof(line), f)) {
        lineno++;
        if (meta_line(m, line, &seen, &version, &cap)) {
            fclose(f);
            line[strcspn(line, "\n")] = '\0';
            return meta_error(err, errlen, "checkpoint %s: line %d is not understood: %s", path, lineno, line);
        }
    }
    fclose(f);
    if (version != 1) return meta_error(err, errlen, "checkpoint %s: not a gridgpt checkpoint of format 1", path);
    for (int k = 0; k < 7; k++)
        if (!(seen & (1u << k))) return meta_error(err, errlen, "checkpoint %s: no `config %s` line", path, CKPT_REQUIRED[k]);
    for (int k = 0; k < 3; k++)
        if (!(seen & (1u << (8 + k)))) return meta_error(err, errlen, "checkpoint %s: no `section %s` line", path, SECTION_NAMES[k]);
    GPTConfig* c = &m->cfg;
    if (c->num_layers < 1 || c->hidden_size < 1 || c->num_attention_heads < 1 || c->hidden_size % c->num_attention_heads ||
        c->ffn_hidden_size < 1 || c->max_position_embeddings < 1 || c->vocab_size < 1)
        return meta_error(err, errlen, "checkpoint %s: the model config is not valid", path);
    if (c->make_vocab_size_divisible_by < 1) c->make_vocab_size_divisible_by = 1;
    c->padded_vocab_size = padded_vocab_size(c->vocab_size, c->make_vocab_size_divisible_by, 1);
    if (c->seq_length < 1) c->seq_length = c->max_position_embeddings;
    // the tensor lines must be the table of that config: same names, order, whole shapes
    GPT whole = canonical_table(c);
    int status = 0;
    if (m->num_tensors != whole.num_tensors)
        status = meta_error(err, errlen, "checkpoint %s: %d tensors, the model of its config has %d", path,
                            m->num_tensors, whole.num_tensors);
    for (int i = 0; i < whole.num_tensors && status == 0; i++) {
        const TensorDesc* d = &whole.tensors[i];
        const CkptTensor* t = &m->tensors[i];
        if (strcmp(t->name, d->name) != 0)
            status = meta_error(err, errlen, "checkpoint %s: tensor %d is %s, expected %s", path, i, t->name, d->name);
        else if (t->rows != d->valid_rows || t->cols != d->cols)
            status = meta_error(err, errlen, "checkpoint %s: tensor %s is [%d, %d], expected [%d, %d]", path, t->name,
                                t->rows, t->cols, d->valid_rows, d->cols);
        else if (t->offset + (size_t)t->rows * t->cols * sizeof(float) > m->section_bytes[0])
            status = meta_error(err, errlen, "checkpoint %s: tensor %s lies outside its section", path, t->name);
    }
    free(whole.tensors);
    free(whole.layer_tensors);
    if (status != 0) return status;
    struct stat st;
    size_t end = m->section_offset[2] + m->section_bytes[2];
    if (stat(m->bin_path, &st) != 0) return meta_error(err, errlen, "checkpoint %s: %s", m->bin_path, strerror(errno));
    if ((size_t)st.st_size != end)
        return meta_error(err, errlen, "checkpoint %s: %lld bytes, expected %zu (truncated?)", m->bin_path,
                          (long long)st.st_size, end);
    return 0;
}

// The model config must be the checkpoint's: one clear error naming the first field that
// differs. (Sequence length and vocabulary padding may change: the layout does not depend on them.)
static void check_config_matches(const char* path, const GPTConfig* saved, const GPTConfig* now) {
    struct { const char* flag; int saved, now; } fields[] = {
        {"--num-layers", saved->num_layers, now->num_layers},
        {"--hidden-size", saved->hidden_size, now->hidden_size},
        {"--num-attention-heads", saved->num_attention_heads, now->num_attention_heads},
        {"--ffn-hidden-size", saved->ffn_hidden_size, now->ffn_hidden_size},
        {"--max-position-embeddings", saved->max_position_embeddings, now->max_position_embeddings},
        {"--vocab-size", saved->vocab_size, now->vocab_size},
        {"--embed-layernorm", saved->embed_layernorm, now->embed_layernorm},
    };
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
        if (fields[i].saved != fields[i].now)
            config_error("checkpoint %s has %s %d, this run %d", path, fields[i].flag, fields[i].saved, fields[i].now);
}

// the directory of the latest checkpoint in dir, or "" when there is none (a fresh start)
static void latest_checkpoint(const char* dir, char* out, size_t len) {
    char path[4200];
    snprintf(path, sizeof(path), "%s/latest_checkpointed_iteration.txt", dir);
    out[0] = '\0';
    FILE* f = fopen(path, "r");
    if (!f) return;
    int it = -1;
    int ok = fscanf(f, "%d", &it) == 1 && it >= 0;
    fclose(f);
    if (!ok) config_error("%s: expected an iteration number", path);
    iter_dir(out, len, dir, it);
}

// every tensor's CRC-32 in the sections to be loaded, each rank checking its share
static void verify_checksums(const CheckpointMeta* meta, const CanonicalLayout* L, int sections) {
    MPI_File f;
    if (MPI_File_open(MPI_COMM_WORLD, meta->bin_path, MPI_MODE_RDONLY, MPI_INFO_NULL, &f) != MPI_SUCCESS)
        config_error("checkpoint %s: cannot open", meta->bin_path);
    uint32_t* crc = (uint32_t*)mallocCheck(3 * L->whole.num_tensors * sizeof(uint32_t));
    section_checksums(L, f, crc);
    MPI_File_close(&f);
    for (int i = 0; i < L->whole.num_tensors; i++)
        for (int k = 0; k < sections; k++)
            if (crc[3 * i + k] != meta->tensors[i].crc[k])
                config_error("checkpoint %s: tensor %s (%s) fails its checksum (%08x, expected %08x)", meta->bin_path,
                             meta->tensors[i].name, SECTION_NAMES[k], crc[3 * i + k], meta->tensors[i].crc[k]);
    free(crc);
}

// every local tensor's rows from the weight section into the (floatX) parameters
// (one tensor's slice at a time passes through host memory)
static void load_params(Trainer* t, const CanonicalLayout* L, MPI_File f) {
    GPT* m = &t->model;
    float* bounce = (float*)mallocCheck(RUN_MAX * sizeof(float));
    for (int i = 0; i < m->num_tensors; i++) {
        const TensorDesc* d = &m->tensors[i];
        float* host = (float*)callocCheck(d->numel, sizeof(float));   // padding rows stay zero
        RunIO io = {f, 0, host, d->offset, bounce, 1};   // the "device" array here is this host one
        for_each_run(d, L->offset[canonical_index(L, d->name)], d->offset, d->offset + d->numel, run_io, &io);
        floats_to_dev_floatX(m->params + d->offset, host, d->numel);
        free(host);
    }
    free(bounce);
}

// Resume from --load DIR (its latest checkpoint). Reads the checkpoint's counters and
// verifies every checksum; loads the parameters, and unless --no-load-optim / --finetune the
// optimizer shard (master weights and moments) of this rank.
static void checkpoint_load(Trainer* t, const char* ckpt, const CheckpointMeta* meta) {
    double t0 = now_seconds();
    const Args* a = &t->args;
    int with_optim = !a->no_load_optim && !a->finetune;
    CanonicalLayout L = canonical_layout(&t->cfg);
    verify_checksums(meta, &L, with_optim ? 3 : 1);
    MPI_File f;
    mpiCheck(MPI_File_open(MPI_COMM_WORLD, meta->bin_path, MPI_MODE_RDONLY, MPI_INFO_NULL, &f));
    load_params(t, &L, f);
    shard_io(t, &L, f, 1, with_optim ? 3 : 1);
    mpiCheck(MPI_File_close(&f));
    if (!a->finetune) {
        t->iteration = meta->iteration;
        t->consumed_samples = meta->consumed_samples;
        t->scheduler_samples = meta->scheduler_samples;
        t->valid_consumed_at_load = meta->consumed_valid_samples;
        if (with_optim) t->opt.step = meta->optimizer_step;
    }
    if (grid.world_rank == 0) {
        double s = now_seconds() - t0, gb = (with_optim ? 3.0 : 1.0) * L.section_bytes / 1e9;
        printf("loaded checkpoint %s (iteration %d%s): %.3f GB in %.2f s (%.2f GB/s)\n", ckpt, meta->iteration,
               a->finetune ? ", weights only: --finetune" : with_optim ? "" : ", without optimizer state", gb, s, gb / s);
        fflush(stdout);
    }
    free_layout(&L);
}

// ----------------------------------------------------------------------------
// Hugging Face export: a checkpoint's weights as transformers' GPT2LMHeadModel
// export_hf(DIR/iter_0000100, OUT) reads metadata.txt and the weight section of tensors.bin
// (one tensor at a time, each verified against its CRC-32) and writes OUT/config.json and
// OUT/model.safetensors, loadable with GPT2LMHeadModel.from_pretrained(OUT). Our tensors map
// one to one onto GPT-2's, in the same order; three things change on the way:
//   - GPT-2's projections are Conv1D layers, whose weight is [in, out]: the transpose of
//     our Linear [out, in] (c_attn, attn.c_proj, c_fc, mlp.c_proj);
//   - our QKV rows are grouped per head, [q|k|v] of head 0, then of head 1, ... (Megatron's
//     layout, see qkv_index in kernels.cuh), GPT-2's columns are [all q | all k | all v];
//   - the LM head is tied to the word embedding (tie_word_embeddings), so as transformers'
//     save_pretrained does, lm_head.weight is not stored.
// safetensors: 8 bytes little-endian length of a JSON header, the header (padded with
// spaces to a multiple of 8), then the tensors' bytes back to back in the header's order.
// The embedding LayerNorm (--embed-layernorm, BLOOM's) has no place in GPT-2: refused.
// tensor i of the weight section into out (rows * cols floats), verified against its CRC
static int ckpt_read_tensor(const CheckpointMeta* ck, FILE* bin, int i, float* out, char* err, size_t errlen) {
    const CkptTensor* t = &ck->tensors[i];
    size_t bytes = (size_t)t->rows * t->cols * sizeof(float);
    if (fseeko(bin, (off_t)(ck->section_offset[0] + t->offset), SEEK_SET) != 0 || fread(out, 1, bytes, bin) != bytes)
        return meta_error(err, errlen, "checkpoint %s: cannot read tensor %s", ck->bin_path, t->name);
    uint32_t crc = crc32_update(0, out, bytes);
    if (crc != t->crc[0])
        return meta_error(err, errlen, "checkpoint %s: tensor %s (weight) fails its checksum (%08x, expected %08x)",
                          ck->bin_path, t->name, crc, t->crc[0]);
    return 0;
}

// one tensor of the export: where it comes from and how it changes on the way
typedef struct {
    char name[96];   // transformers' name
    int src;         // index in the checkpoint's tensor table
    int transpose;   // Linear [out, in] -> Conv1D [in, out]
    int qkv;         // reorder our per-head [q|k|v] rows into GPT-2's [all q | all k | all v]
    int rows, cols;  // the exported shape; cols == 0 for a vector
} HfTensor;

// GPT-2's row r of the fused QKV output (r = which * C + h * HS + d) is our row
// qkv_index(0, 0, h, which, 1, NH, HS) + d, i.e. h * 3 * HS + which * HS + d
static int hf_qkv_source_row(int r, int C, int NH) {
    int HS = C / NH, which = r / C, h = (r % C) / HS, d = r % HS;
    return (int)qkv_index(0, 0, h, which, 1, NH, HS) + d;
}

static void hf_transform(const HfTensor* h, const CkptTensor* t, const float* src, float* dst, int C, int NH) {
    for (int r = 0; r < t->rows; r++) {
        const float* row = src + (size_t)(h->qkv ? hf_qkv_source_row(r, C, NH) : r) * t->cols;
        for (int c = 0; c < t->cols; c++) {
            if (h->transpose) dst[(size_t)c * t->rows + r] = row[c];
            else dst[(size_t)r * t->cols + c] = row[c];
        }
    }
}

// the export's tensors in GPT2LMHeadModel's state_dict order (which is also ours)
static int hf_tensor_list(const GPTConfig* c, HfTensor* out) {
    GPT whole = canonical_table(c);
    int n = 0;
    struct { const char* suffix; int transpose, qkv; } layer_names[12] = {
        {"ln_1.weight", 0, 0}, {"ln_1.bias", 0, 0}, {"attn.c_attn.weight", 1, 1}, {"attn.c_attn.bias", 0, 1},
        {"attn.c_proj.weight", 1, 0}, {"attn.c_proj.bias", 0, 0}, {"ln_2.weight", 0, 0}, {"ln_2.bias", 0, 0},
        {"mlp.c_fc.weight", 1, 0}, {"mlp.c_fc.bias", 0, 0}, {"mlp.c_proj.weight", 1, 0}, {"mlp.c_proj.bias", 0, 0}};
    struct { const char* name; int src; } fixed[4] = {
        {"transformer.wte.weight", whole.wte}, {"transformer.wpe.weight", whole.wpe},
        {"transformer.ln_f.weight", whole.lnf_w}, {"transformer.ln_f.bias", whole.lnf_b}};
    for (int k = 0; k < 2; k++) {
        snprintf(out[n].name, sizeof(out[n].name), "%s", fixed[k].name);
        out[n++].src = fixed[k].src;
    }
    for (int l = 0; l < c->num_layers; l++) {
        const LayerTensors* t = &whole.layer_tensors[l];
        int ids[12] = {t->ln1_w, t->ln1_b, t->qkv_w, t->qkv_b, t->proj_w, t->proj_b,
                       t->ln2_w, t->ln2_b, t->fc_w, t->fc_b, t->fcproj_w, t->fcproj_b};
        for (int k = 0; k < 12; k++) {
            snprintf(out[n].name, sizeof(out[n].name), "transformer.h.%d.%s", l, layer_names[k].suffix);
            out[n].src = ids[k];
            out[n].transpose = layer_names[k].transpose;
            out[n++].qkv = layer_names[k].qkv;
        }
    }
    for (int k = 2; k < 4; k++) {
        snprintf(out[n].name, sizeof(out[n].name), "%s", fixed[k].name);
        out[n++].src = fixed[k].src;
    }
    for (int i = 0; i < n; i++) {
        const TensorDesc* d = &whole.tensors[out[i].src];
        out[i].rows = out[i].transpose ? d->cols : d->valid_rows;
        out[i].cols = d->cols == 1 ? 0 : out[i].transpose ? d->valid_rows : d->cols;
    }
    free(whole.tensors);
    free(whole.layer_tensors);
    return n;
}

// flush, sync, close and rename tmp to path; on failure remove tmp
static int hf_commit_file(FILE* f, const char* tmp, const char* path, char* err, size_t errlen) {
    int ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (ok && rename(tmp, path) == 0) return 0;
    int e = errno;
    remove(tmp);
    return meta_error(err, errlen, "cannot write %s: %s", path, strerror(e));
}

static int hf_write_config(const GPTConfig* c, const char* out_dir, char* err, size_t errlen) {
    char path[4200], tmp[4300];
    snprintf(path, sizeof(path), "%s/config.json", out_dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE* f = fopen(tmp, "w");
    if (!f) return meta_error(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
    // bos/eos: the end-of-document token is the vocabulary's last id for GPT-2's BPE (50256),
    // our byte tokenizer (256) and the ids tokenizer run with --vocab-size N+1 (N)
    fprintf(f,
            "{\n"
            "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
            "  \"model_type\": \"gpt2\",\n"
            "  \"vocab_size\": %d,\n"
            "  \"n_positions\": %d,\n"
            "  \"n_embd\": %d,\n"
            "  \"n_layer\": %d,\n"
            "  \"n_head\": %d,\n"
            "  \"n_inner\": %d,\n"
            "  \"activation_function\": \"gelu_new\",\n"
            "  \"layer_norm_epsilon\": 1e-05,\n"
            "  \"initializer_range\": %g,\n"
            "  \"resid_pdrop\": 0.0,\n"
            "  \"embd_pdrop\": 0.0,\n"
            "  \"attn_pdrop\": 0.0,\n"
            "  \"scale_attn_weights\": true,\n"
            "  \"scale_attn_by_inverse_layer_idx\": false,\n"
            "  \"reorder_and_upcast_attn\": false,\n"
            "  \"tie_word_embeddings\": true,\n"
            "  \"bos_token_id\": %d,\n"
            "  \"eos_token_id\": %d,\n"
            "  \"use_cache\": true,\n"
            "  \"torch_dtype\": \"float32\"\n"
            "}\n",
            c->vocab_size, c->max_position_embeddings, c->hidden_size, c->num_layers, c->num_attention_heads,
            c->ffn_hidden_size, c->init_method_std > 0 ? c->init_method_std : 0.02f, c->vocab_size - 1, c->vocab_size - 1);
    return hf_commit_file(f, tmp, path, err, errlen);
}

static int hf_write_safetensors(const CheckpointMeta* ck, const char* out_dir, char* err, size_t errlen) {
    const GPTConfig* c = &ck->cfg;
    int capacity = 4 + 12 * c->num_layers;
    HfTensor* list = (HfTensor*)callocCheck(capacity, sizeof(HfTensor));
    int n = hf_tensor_list(c, list);
    // the header: each tensor's dtype, shape and byte range in the data that follows
    size_t header_cap = 64 + (size_t)n * 256, len = 0, data = 0, largest = 0, largest_changed = 1;
    char* header = (char*)mallocCheck(header_cap);
    len += snprintf(header + len, header_cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        const HfTensor* h = &list[i];
        size_t numel = (size_t)h->rows * (h->cols ? h->cols : 1), bytes = numel * sizeof(float);
        char shape[48];
        if (h->cols) snprintf(shape, sizeof(shape), "%d,%d", h->rows, h->cols);
        else snprintf(shape, sizeof(shape), "%d", h->rows);
        len += snprintf(header + len, header_cap - len, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%s],\"data_offsets\":[%zu,%zu]}",
                        h->name, shape, data, data + bytes);
        data += bytes;
        largest = numel > largest ? numel : largest;
        if ((h->transpose || h->qkv) && numel > largest_changed) largest_changed = numel;
    }
    len += snprintf(header + len, header_cap - len, "}");
    while (len % 8) header[len++] = ' ';   // the data starts 8-byte aligned, as safetensors writes it
    uint8_t len_le[8];
    for (int b = 0; b < 8; b++) len_le[b] = (uint8_t)((uint64_t)len >> (8 * b));
    // the data, one tensor at a time
    char path[4200], tmp[4300];
    snprintf(path, sizeof(path), "%s/model.safetensors", out_dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    float* src = (float*)mallocCheck(largest * sizeof(float));
    float* dst = (float*)mallocCheck(largest_changed * sizeof(float));
    FILE* bin = fopen(ck->bin_path, "rb");
    FILE* f = bin ? fopen(tmp, "wb") : NULL;
    int status = 0;
    if (!bin) status = meta_error(err, errlen, "checkpoint %s: %s", ck->bin_path, strerror(errno));
    else if (!f) status = meta_error(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
    else if (fwrite(len_le, 1, 8, f) != 8 || fwrite(header, 1, len, f) != len)
        status = meta_error(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
    for (int i = 0; i < n && status == 0; i++) {
        const HfTensor* h = &list[i];
        const CkptTensor* t = &ck->tensors[h->src];
        size_t numel = (size_t)t->rows * t->cols;
        status = ckpt_read_tensor(ck, bin, h->src, src, err, errlen);
        if (status != 0) break;
        const float* out = src;   // a tensor that changes on the way goes through dst
        if (h->transpose || h->qkv) {
            hf_transform(h, t, src, dst, c->hidden_size, c->num_attention_heads);
            out = dst;
        }
        if (fwrite(out, sizeof(float), numel, f) != numel)
            status = meta_error(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
    }
    if (bin) fclose(bin);
    if (f && status == 0) status = hf_commit_file(f, tmp, path, err, errlen);
    else if (f) {
        fclose(f);
        remove(tmp);
    }
    free(src);
    free(dst);
    free(header);
    free(list);
    return status;
}

// Export the checkpoint in checkpoint_iter_dir (a DIR/iter_NNNNNNN directory) as a
// transformers GPT2LMHeadModel in out_dir (created if missing): config.json and
// model.safetensors, each written under a .tmp name and renamed. Returns 0, or -1 with a
// one-line reason in err (a missing or malformed file, a tensor failing its checksum, a
// model GPT-2 cannot express). Reads one tensor at a time: memory is the largest tensor
// (the word embedding) plus the largest transposed one. Only the weight section is read;
// the optimizer state is left alone.
static int export_hf(const char* checkpoint_iter_dir, const char* out_dir, char* err, size_t errlen) {
    const uint32_t one = 1;
    if (*(const uint8_t*)&one != 1)
        return meta_error(err, errlen, "export_hf: fp32 is copied as is, so a little-endian host is needed");
    CheckpointMeta ck;
    if (checkpoint_meta_read(checkpoint_iter_dir, &ck, err, errlen) != 0) {
        checkpoint_meta_free(&ck);
        return -1;
    }
    int status = 0;
    if (ck.cfg.embed_layernorm)
        status = meta_error(err, errlen, "checkpoint %s has an embedding LayerNorm (--embed-layernorm): GPT2LMHeadModel has "
                          "none, so it cannot be exported as GPT-2", checkpoint_iter_dir);
    else if (mkdir(out_dir, 0755) != 0 && errno != EEXIST)
        status = meta_error(err, errlen, "cannot create %s: %s", out_dir, strerror(errno));
    if (status == 0) status = hf_write_safetensors(&ck, out_dir, err, errlen);
    if (status == 0) status = hf_write_config(&ck.cfg, out_dir, err, errlen);
    checkpoint_meta_free(&ck);
    return status;
}

// Per rank: parameters, gradients, optimizer state and activations, gathered to rank 0
static void print_memory(const Trainer* t) {
    const GPT* m = &t->model;
    double mine[5] = {(double)m->num_params, (double)m->num_params_padded * sizeof(floatX),
                      (double)m->num_params_padded * sizeof(float), (double)adamw_state_bytes(&t->opt),
                      (double)m->arena_bytes};
    double* all = (double*)mallocCheck(5 * sizeof(double) * grid.world_size);
    mpiCheck(MPI_Gather(mine, 5, MPI_DOUBLE, all, 5, MPI_DOUBLE, 0, MPI_COMM_WORLD));
    if (grid.world_rank == 0) {
        double mib = 1024.0 * 1024.0;
        printf("memory per rank (MiB): parameters | gradients | optimizer state (1/DP shard) | activations "
               "(%d micro-batch slot(s) of %.1f MiB + backward scratch)\n", m->num_slots, m->slot_bytes / mib);
        for (int r = 0; r < grid.world_size; r++) {
            const double* x = all + 5 * r;
            printf("  rank %3d: %.0f parameters: %9.1f | %9.1f | %9.1f | %9.1f\n", r, x[0], x[1] / mib, x[2] / mib,
                   x[3] / mib, x[4] / mib);
        }
    }
    free(all);
}

static void print_setup(const Trainer* t) {
    const GPTConfig* c = &t->cfg;
    if (grid.world_rank == 0) {
        char name[96];
        printf("gridgpt %s build, %s, %d rank(s) as TP %d x PP %d x DP %d, %d OpenMP thread(s) per rank; rank 0 is %s\n",
#ifdef __CUDACC__
               "GPU",
#else
               "CPU",
#endif
               PRECISION_NAME, grid.world_size, grid.tp_size, grid.pp_size, grid.dp_size,
#ifdef _OPENMP
               omp_get_max_threads(),
#else
               1,
#endif
               grid_name(name, sizeof(name)));
        printf("model: %d layers, hidden %d, %d heads, ffn %d, seq %d, vocab %d (padded to %d)%s\n", c->num_layers,
               c->hidden_size, c->num_attention_heads, c->ffn_hidden_size, c->seq_length, c->vocab_size,
               c->padded_vocab_size, c->embed_layernorm ? ", embedding LayerNorm" : "");
        data_splits_print(&t->data, stdout);
        printf("training: %d iterations, micro-batch %d, global batch %d%s\n", t->train_iters, t->args.micro_batch_size,
               t->args.global_batch_size, t->batch.rampup_samples ? " (ramped up)" : "");
        fflush(stdout);
    }
    print_memory(t);
    fflush(stdout);
}

// --load DIR --export-hf OUT: no data, no model, just the file conversion (on rank 0)
static void export_and_exit(const Args* a) {
    char ckpt[4300], err[4600];
    if (!a->load) config_error("--export-hf needs --load DIR (the checkpoint to export)");
    latest_checkpoint(a->load, ckpt, sizeof(ckpt));
    if (!ckpt[0]) config_error("--load %s: no latest_checkpointed_iteration.txt, nothing to export", a->load);
    if (grid.world_rank == 0) {
        double t0 = now_seconds();
        if (export_hf(ckpt, a->export_hf, err, sizeof(err)) != 0) config_error("%s", err);
        printf("exported %s as a Hugging Face GPT2LMHeadModel to %s (config.json, model.safetensors) in %.2f s\n", ckpt,
               a->export_hf, now_seconds() - t0);
    }
    MPI_Finalize();
    exit(0);
}

static void trainer_setup(Trainer* t, int argc, char** argv) {
    memset(t, 0, sizeof(*t));
    Args* a = &t->args;
    set_defaults(a);
    parse_flags(a, argc, argv);
    if (a->help) {
        if (grid.world_rank == 0) print_usage(a);
        MPI_Finalize();
        exit(0);
    }
    if (a->export_hf) export_and_exit(a);
    check_args(a);
    // schedules
    BatchSchedule* b = &t->batch;
    b->micro_batch_times_dp = a->micro_batch_size * (grid.world_size / (a->tensor_model_parallel_size * a->pipeline_model_parallel_size));
    b->global_batch_size = a->global_batch_size;
    b->start = a->rampup_batch_size[0];
    b->increment = a->rampup_batch_size[1];
    b->rampup_samples = a->rampup_batch_size[2];
    if (b->start || b->increment || b->rampup_samples) {
        if (b->rampup_samples == 0) b->rampup_samples = -1;   // make check_rampup complain
        check_rampup(a, b);
    }
    t->train_iters = a->train_iters > 0 ? a->train_iters : train_iters_for_samples(b, a->train_samples);
    if (t->train_iters <= 0) config_error("--train-samples %lld is less than one global batch", a->train_samples);
    t->lr = make_lr_schedule(a, t->train_iters);
    // data: Megatron's sample counts per split
    long long eval_batches = (long long)(t->train_iters / a->eval_interval + 1) * a->eval_iters;
    long long samples[3] = {a->train_iters > 0 ? (long long)a->train_iters * a->global_batch_size : a->train_samples,
                            eval_batches * a->global_batch_size, (long long)a->eval_iters * a->global_batch_size};
    // a checkpoint to resume from: its counters and config are read before anything else
    char ckpt[4300] = "";
    CheckpointMeta meta;
    memset(&meta, 0, sizeof(meta));
    if (a->load) {
        latest_checkpoint(a->load, ckpt, sizeof(ckpt));
        if (ckpt[0]) {
            char err[4600];
            if (checkpoint_meta_read(ckpt, &meta, err, sizeof(err)) != 0) config_error("%s", err);
            if (!a->no_load_rng && !a->finetune) a->seed = (int)meta.cfg.seed;   // the data order goes on
        } else if (grid.world_rank == 0) {
            printf("no checkpoint in %s (no latest_checkpointed_iteration.txt): starting from scratch\n", a->load);
        }
    }
    open_data(&t->data, a, samples);
    // model
    GPTConfig* c = &t->cfg;
    c->num_layers = a->num_layers;
    c->hidden_size = a->hidden_size;
    c->num_attention_heads = a->num_attention_heads;
    c->ffn_hidden_size = a->ffn_hidden_size;
    c->seq_length = a->seq_length;
    c->max_position_embeddings = a->max_position_embeddings;
    c->vocab_size = a->vocab_size;
    c->make_vocab_size_divisible_by = a->make_vocab_size_divisible_by;
    c->padded_vocab_size = padded_vocab_size(a->vocab_size, a->make_vocab_size_divisible_by, a->tensor_model_parallel_size);
    c->embed_layernorm = a->embed_layernorm;
    c->init_method_std = a->init_method_std;
    c->seed = (uint64_t)a->seed;
    if (ckpt[0]) check_config_matches(ckpt, &meta.cfg, c);
    // every check has passed: build the grid and allocate
    if (!grid.ready) grid_build(a->tensor_model_parallel_size, a->pipeline_model_parallel_size);
#ifdef __CUDACC__
    int gpus = 0;
    cudaCheck(cudaGetDeviceCount(&gpus));
    if (grid.local_rank >= gpus) fail("%d or more ranks on this host but %d GPU(s) visible: one GPU per rank", grid.local_rank + 1, gpus);
#endif
    kernels_init(grid.local_rank);   // ranks on one host take distinct GPUs
    gpt_build(&t->model, c, a->micro_batch_size, a->seq_length, grid.tp_rank, grid.tp_size, grid.pp_rank, grid.pp_size,
              grid.pp_size, grid.dp_size);
    t->adam.beta1 = a->adam_beta1;
    t->adam.beta2 = a->adam_beta2;
    t->adam.eps = a->adam_eps;
    t->adam.weight_decay = a->weight_decay;
    t->adam.clip_grad = a->clip_grad;
    adamw_init(&t->opt, &t->model);
    t->last_saved = -1;
    if (ckpt[0]) {
        checkpoint_load(t, ckpt, &meta);
        checkpoint_meta_free(&meta);
    }
    t->train = make_loader(&t->data, 0, a);
    t->valid = make_loader(&t->data, 1, a);
    t->valid.consumed = t->valid_consumed_at_load;
    t->test = make_loader(&t->data, 2, a);
    print_setup(t);
}

static void trainer_free(Trainer* t) {
    free_loader(&t->train);
    free_loader(&t->valid);
    free_loader(&t->test);
    adamw_free(&t->opt, &t->model);
    gpt_free(&t->model);
    data_splits_close(&t->data);
}

// One training step: the micro-batches of the current global batch, forward and backward,
// then the optimizer at the learning rate of the samples consumed so far.
static StepResult train_step(Trainer* t) {
    StepResult r;
    memset(&r, 0, sizeof(r));
    GPT* m = &t->model;
    r.global_batch = current_global_batch_size(&t->batch, t->consumed_samples);
    int num_micro = r.global_batch / t->batch.micro_batch_times_dp;
    double before[4], after[4];
    comm_counters(before);
    dev_zero(m->grads, m->num_params_padded * sizeof(float));
    t->train.consumed = t->consumed_samples;
    Schedule s = {m, load_micro_batch, &t->train, 1.0f / ((float)m->T * r.global_batch), 0.0, 0, 0};
    run_1f1b(&s, num_micro);
    r.loss = step_loss(&s, num_micro);
    r.max_in_flight = s.max_in_flight;
    r.nan_loss = !isfinite(r.loss);
    float lr = learning_rate(&t->lr, t->scheduler_samples);
    r.grad_norm = optimizer_step(&t->model, &t->opt, &t->adam, lr, &r.skipped);
    t->consumed_samples += r.global_batch;
    if (!r.skipped) t->scheduler_samples += r.global_batch;
    t->iteration++;
    r.lr = learning_rate(&t->lr, t->scheduler_samples);   // Megatron logs the rate set for the next step
    comm_counters(after);
    for (int k = 0; k < 4; k++) r.comm[k] = after[k] - before[k];
    return r;
}

// Megatron's log line, with averages over the steps since the last one
typedef struct {
    int steps, skipped, nan_loss;
    double loss_sum, seconds;
    long long samples;
} LogWindow;

// --log-comm: the bytes sent in each group in the last step, the most any rank sent
static void log_comm(const StepResult* r) {
    double most[4];
    mpiCheck(MPI_Reduce(r->comm, most, 4, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD));
    if (grid.world_rank != 0) return;
    double mib = 1024.0 * 1024.0;
    printf(" communication per step (MiB sent by the busiest rank, ring algorithms): tensor-parallel %.3f |"
           " data-parallel %.3f | pipeline %.3f | embedding %.3f |\n", most[0] / mib, most[1] / mib, most[2] / mib,
           most[3] / mib);
}

static void log_step(const Trainer* t, const StepResult* r, LogWindow* w) {
    if (t->args.log_comm) log_comm(r);
    if (grid.world_rank != 0) return;
    double ms = 1000.0 * w->seconds / w->steps;
    double flops = flops_per_step(&t->cfg, r->global_batch);
    double loss = w->steps > w->nan_loss ? w->loss_sum / (w->steps - w->nan_loss) : NAN;
    printf(" iteration %8d/%8d | consumed samples: %12lld | elapsed time per iteration (ms): %.1f |"
           " learning rate: %.6E | global batch size: %5d | lm loss: %.6E | grad norm: %.3f |"
           " number of skipped iterations: %3d | number of nan iterations: %3d |"
           " samples per second: %.3f | TFLOPs: %.3f |\n",
           t->iteration, t->train_iters, t->consumed_samples, ms, r->lr, r->global_batch, loss, r->grad_norm,
           w->skipped, w->nan_loss, w->samples / w->seconds, flops / (ms / 1000.0) / 1e12 / grid.world_size);
    fflush(stdout);
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
    int B = m->B, T = m->T, V = t->cfg.vocab_size;
    int* ctx = (int*)callocCheck(T, sizeof(int));
    float* logits = (float*)mallocCheck((size_t)m->vocab_local * sizeof(float));
    const char* prompt = t->args.generate_prompt ? t->args.generate_prompt : "";
    int len = 0;
    if (V <= BYTE_VOCAB_SIZE)
        for (const char* p = prompt; *p && len < T; p++) ctx[len++] = (unsigned char)*p;
    if (len == 0) ctx[len++] = V > BYTE_EOD ? BYTE_EOD : 0;   // start of a document
    sample_state = (uint64_t)t->args.seed;
    printf("---------- sample (%d tokens, temperature %.2f) ----------\n%s", t->args.generate_tokens,
           t->args.temperature, prompt);
    for (int i = 0; i < t->args.generate_tokens; i++) {
        m->B = 1;
        m->T = len;
        host_to_dev(m->slots[0].tokens, ctx, len * sizeof(int));
        host_to_dev(m->slots[0].targets, ctx, len * sizeof(int));
        gpt_forward(m, 0);
        dev_floatX_to_floats(logits, m->logits + (size_t)(len - 1) * m->vocab_local, m->vocab_local);
        int next = sample_next(logits, V, t->args.temperature);
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

static float run_evaluation(Trainer* t, const char* what) {
    if (t->args.eval_iters == 0 || !data_splits_has(&t->data, 1)) return NAN;
    float loss = evaluate(&t->model, &t->valid, t->args.eval_iters, t->args.global_batch_size);
    print_eval(what, loss);
    return loss;
}

// SIGTERM and SIGUSR1 (what SLURM sends before a time limit) ask for a save and an exit
// after the current step
static volatile sig_atomic_t stop_requested = 0;
static void request_stop(int sig) { (void)sig; stop_requested = 1; }

static void save_checkpoint_once(Trainer* t) {
    if (!t->args.save || t->last_saved == t->iteration) return;
    checkpoint_save(t, t->args.save);
    t->last_saved = t->iteration;
}

// After a step: save at --save-interval; save and stop on a signal, at --exit-interval or
// after --exit-duration-in-mins. Every rank takes the same decision (a signal may reach
// only some ranks, clocks differ). Returns 1 to stop.
static int after_step(Trainer* t, double start) {
    const Args* a = &t->args;
    int stop = stop_requested || (a->exit_interval > 0 && t->iteration % a->exit_interval == 0) ||
               (a->exit_duration_in_mins > 0 && now_seconds() - start > 60.0 * a->exit_duration_in_mins);
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    if (stop || (a->save_interval > 0 && t->iteration % a->save_interval == 0)) save_checkpoint_once(t);
    if (stop && grid.world_rank == 0) {
        printf("stopping at iteration %d (%s)%s\n", t->iteration,
               stop_requested ? "signal" : a->exit_interval > 0 && t->iteration % a->exit_interval == 0 ? "--exit-interval"
                                                                                                    : "--exit-duration-in-mins",
               a->save ? ", checkpoint saved" : "");
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
    long long tokens_start = t->consumed_samples;
    int in_flight = 0;   // most micro-batches any stage held at once (1F1B: at most PP)
    signal(SIGTERM, request_stop);
    signal(SIGUSR1, request_stop);
    while (t->iteration < t->train_iters) {
        double t0 = now_seconds();
        StepResult r = train_step(t);
        double dt = now_seconds() - t0;
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
        if (t->iteration % t->args.log_interval == 0 || t->iteration == t->train_iters) {
            log_step(t, &r, &w);
            memset(&w, 0, sizeof(w));
        }
        if (t->iteration % t->args.eval_interval == 0 && t->iteration < t->train_iters) {
            char what[64];
            snprintf(what, sizeof(what), "validation loss at iteration %d", t->iteration);
            run_evaluation(t, what);
        }
        if (after_step(t, start)) return;
    }
    save_checkpoint_once(t);
    float valid_loss = run_evaluation(t, "validation loss at the end of training");
    if (t->args.eval_iters > 0 && data_splits_has(&t->data, 2)) {
        float test_loss = evaluate(&t->model, &t->test, t->args.eval_iters, t->args.global_batch_size);
        print_eval("test loss at the end of training", test_loss);
    }
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, &in_flight, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    if (grid.world_rank == 0) {
        long long samples = t->consumed_samples - tokens_start;
        double tokens = (double)samples * t->cfg.seq_length;
        printf("summary: %d iterations, %lld samples (%.0f tokens) in %.1f s of training (%.1f s in all): "
               "%.0f tokens/s, %.1f ms per iteration; final lm loss %.4f; peak memory %.2f GiB (rank 0); "
               "at most %d micro-batch(es) in flight on a pipeline stage\n",
               t->iteration, samples, tokens, train_seconds, now_seconds() - start,
               train_seconds > 0 ? tokens / train_seconds : 0.0, t->iteration ? 1000.0 * train_seconds / t->iteration : 0.0,
               last_loss, peak_rss_gib(), in_flight);
        if (t->args.unigram_baseline) {
            double h = data_splits_unigram_entropy(&t->data, t->cfg.vocab_size);
            printf("validation loss %.4f nats/token vs unigram (order-0) entropy of the train split %.4f nats/token: "
                   "%.1f%% of it\n", valid_loss, h, 100.0 * valid_loss / h);
        }
        fflush(stdout);
        if (t->args.generate_tokens > 0) generate(t);
    }
}

#ifndef TESTING
int main(int argc, char** argv) {
    grid_start(&argc, &argv);
    Trainer* t = (Trainer*)callocCheck(1, sizeof(Trainer));
    trainer_setup(t, argc, argv);
    trainer_run(t, NULL, NULL);
    trainer_free(t);
    free(t);
    grid_finish();
    return 0;
}
#endif
