/*
train.c — the gridgpt trainer: schedules, setup, the training loop, logging (its scalars go to
tensorboard.h), evaluation's calls, sampling. The flags and their checks are config.h's, the
memory plan and the dry run plan.h's (its cost model cost.h's), the step step.h's (its
schedules pipeline.h's, its data-parallel reduction and optimizer data_parallel.h's), the
loader and evaluation loader.h's, the data files' set-up data_setup.h's, the stop signals
stop_signals.h's, the Hugging Face conversions (run instead of training) convert.h's;
checkpoints are called from checkpoint.h, --profile's recorder and writer from trace.h.

One source, two builds: gcc compiles it with the plain-C kernels and MPI (train_cpu); nvcc
compiles it as CUDA with cuBLAS and NCCL (train_gpu). Flags, log lines and files are the
same in both, and follow Megatron-LM's names so that its users feel at home.

Reading order: schedules -> the trainer -> setup -> step -> log -> sampling -> the run ->
main.
*/
#include "files.h"
#include "tokenizer.h"
#include "data.c"
#include "kernels.cuh"
#include "parallel.h"
#include "trace.h"
#include "context_parallel.h"
#include "moe.h"
#include "fields.h"
#include "gpt.h"
#include "layers.h"
#include "data_parallel.h"
#include "zero.h"
#include "pipeline.h"
#include "step.h"
#include "loader.h"
#include "generate.h"
#include "cluster.h"
#include "checkpoint.h"
#include "json.h"
#include "hf.h"
#include "hf_import.h"
#include "tensorboard.h"
#include "megatron_flags.h"
#include "config.h"
#include "print_schedule.h"
#include "hardware.h"
#include "cost.h"
#include "plan.h"
#include "data_setup.h"
#include "stop_signals.h"
#include "convert.h"
#include <signal.h>
#include <sys/resource.h>

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
// measures

static double peak_rss_gib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / (1024.0 * 1024.0);   // ru_maxrss is in KiB on Linux
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
    int eval_iters[3];              // global batches an evaluation of split k takes (eval_iters_at_most_one_pass)
    DataSplits data;
    Loader train, valid, test;
    Progress progress;              // iteration and data positions: what a checkpoint stores
    int last_saved;                 // iteration of the last checkpoint this run wrote (-1: none)
    int last_save_failed;           // the last save could not be written (the exit status says so)
    TensorBoardWriter tensorboard;  // --tensorboard-dir, on rank 0
    size_t allocated_bytes;         // what dev_malloc handed out for the model, the optimizer and the kernels
    Tokenizer tokenizer;            // --tokenizer-type GPT2BPETokenizer's (vocab_size 0: none)
    TokenIds prompt;                // --generate-prompt's tokens, the sample's start
    double* expert_tokens;          // a mixture of experts: the last step's tokens per expert [layers x E]
} Trainer;

typedef struct {
    float loss, grad_norm, lr;
    int global_batch, skipped, nan_loss;
    int max_in_flight;   // most micro-batches whose activations this stage held at once
    double comm[NUM_COMM_GROUPS];   // bytes this rank sent in the step: tp, dp (x cp), pp, embedding, cp groups
    double moe[4];       // the MoE layers' load balance and z-loss (step_moe_losses), the experts' imbalance, the
                         // choices dropped over their capacity
} StepResult;

// out += sign x the bytes each group has sent so far (a step's: -1 before it, +1 after), in
// cost.h's order of the groups: the data-parallel one is DP x CP's (ZeRO's), the
// context-parallel one the ring's or the blocks' gathers
static void add_comm_counters(double out[NUM_COMM_GROUPS], double sign) {
    out[GROUP_TP] += sign * grid.tp.bytes_sent;
    out[GROUP_DP] += sign * (grid.dp_cp.bytes_sent + grid.expert_dp.bytes_sent);   // (the experts' gradients: their own group)
    out[GROUP_PP] += sign * grid.pp.bytes_sent;
    out[GROUP_EMBEDDING] += sign * grid.embedding.bytes_sent;
    out[GROUP_CP] += sign * grid.cp.bytes_sent;
}

// Per rank: parameters, gradients, optimizer state, activations and workspaces, gathered to rank
// 0; with --log-memory-bytes also in bytes, and the bytes dev_malloc really handed out for them
static void print_memory(const Trainer* t) {
    StageMemory s = stage_memory(&t->model, this_stage(&t->config), grid.dp_cp.size, t->config.use_bnb_optimizer);
    enum { FIELDS = 14 };
    double mine[FIELDS] = {(double)s.num_params, (double)s.params, (double)s.grads, (double)s.optimizer, (double)s.activations,
                           (double)s.stage.rank, (double)s.stage.first_layer, (double)s.stage.num_layers,
                           (double)t->allocated_bytes, (double)s.workspaces, (double)s.num_slots, (double)s.slot_bytes,
                           (double)s.longest_chunk, (double)s.recompute_bytes};
    double* all = (double*)mallocCheck(FIELDS * sizeof(double) * grid.world_size);
    gather_to_rank0(&grid.world, mine, all, FIELDS);
    if (grid.world_rank == 0) {
        print_memory_header();
        for (int r = 0; r < grid.world_size; r++) {
            const double* x = all + FIELDS * r;
            StageMemory row = {{(int)x[5], grid.pp_size, (int)x[6], (int)x[7], s.stage.chunks, s.stage.round_layers, 1},
                               (size_t)x[0], (size_t)x[1], (size_t)x[2], (size_t)x[3], (size_t)x[4], (size_t)x[9], 0,
                               (int)x[10], (int)x[12], (size_t)x[11], (size_t)x[13], s.states_8bit, s.zero_stage, s.padded};
            row.total = row.params + row.grads + row.optimizer + row.activations + row.workspaces;
            char label[32];
            snprintf(label, sizeof(label), "rank %3d", r);
            print_memory_row(label, &row, t->config.log_memory_bytes);
            if (t->config.log_memory_bytes) printf("  rank %3d: dev_malloc handed out %.0f bytes for them\n", r, x[8]);
        }
        print_model_state_bytes(&s, grid.dp_cp.size);
    }
    free(all);
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

// the training's start-up line: its length, its batches, its activation recomputation
static void print_training(const Trainer* t) {
    const Config* a = &t->config;
    printf("training: %d iterations, micro-batch %d, global batch %d%s", t->train_iters, a->micro_batch_size,
           a->global_batch_size, t->batch.rampup_samples ? " (ramped up)" : "");
    if (a->model.recompute_method == RECOMPUTE_UNIFORM)
        printf("; activation recomputation: full, uniform, chunks of %d layer(s)", a->model.recompute_num_layers);
    if (a->model.recompute_method == RECOMPUTE_BLOCK)
        printf("; activation recomputation: full, block, the first %d layer(s) of a stage", a->model.recompute_num_layers);
    if (a->model.recompute_attention_core)
        printf("; activation recomputation: selective, %s", recomputes_attention_core(&t->model) ?
               "each layer's attention probabilities again in its backward" :
               "nothing to do (the fused attention keeps no probabilities: its backward recomputes them anyway)");
    printf("\n");
}

static void print_setup(const Trainer* t) {
    const Config* a = &t->config;
    char blas[1024];
    blas_kernels_everywhere(blas, sizeof(blas));
    if (grid.world_rank == 0) {
        char name[96], layout[96];
        printf("gridgpt %s build, %s, %d rank(s) as %s, %d OpenMP thread(s) per rank (%s); rank 0 is %s\n", BUILD_NAME,
               PRECISION_NAME, grid.world_size,
               layout_name(layout, sizeof layout, grid.tp_size, grid.cp_size, grid.pp_size, grid.dp_size),
#ifdef _OPENMP
               omp_get_max_threads(),
#else
               1,
#endif
               grid.threads_from ? grid.threads_from : "OMP_NUM_THREADS", grid_name(name, sizeof(name)));
        if (blas[0]) printf("%s\n", blas);
        warn_if_pthread_blas();
        print_model(&a->model);
        print_attention(a, GPU_BUILD);
        print_dp_communication(a, &t->model);
        print_pipeline_exchanges();
        if (grid.pp_size > 1 && t->model.num_chunks == 1)   // Megatron-LM's "Number of virtual stages per pipeline stage"
            printf("pipeline schedule: 1F1B, 1 virtual stage per pipeline stage\n");
        if (t->model.num_chunks > 1)
            printf("pipeline schedule: interleaved 1F1B, %d virtual stages per pipeline stage (model chunks), the "
                   "micro-batches taken %d at a time per chunk (--microbatch-group-size-per-virtual-pipeline-stage)\n",
                   t->model.num_chunks, microbatch_group_size(a));
        if (t->data.num_prefixes) data_splits_print(&t->data, stdout);
        note_eval_epochs(&t->data, a);
        if (a->eval_iters > 0 && a->data_path.count && !data_splits_has(&t->data, 1))
            printf("note: --split %s leaves no validation documents: no evaluation (as Megatron)\n", a->split);
        if (a->skip_train)
            printf("no training (--skip-train): %s%s%s\n", t->data.num_prefixes ? "evaluation" : "",
                   t->data.num_prefixes && a->generate_tokens ? ", then " : "", a->generate_tokens ? "generation" : "");
        else print_training(t);
        fflush(stdout);
    }
    print_memory(t);
    fflush(stdout);
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
    // --train-iters 0 --save: the initial model only; --skip-train: no step (its --train-iters, as
    // in Megatron, ignored)
    if ((a->train_iters == 0 && a->train_samples == 0) || a->skip_train) return;
    long long iters = a->train_iters > 0 ? a->train_iters : train_iters_for_samples(b, a->train_samples);
    if (iters <= 0) config_error("--train-samples %lld is less than one global batch", a->train_samples);
    if (iters > INT_MAX)
        config_error("--train-samples %lld at a global batch of %d is %lld iterations, more than %d", a->train_samples,
                     a->global_batch_size, iters, INT_MAX);
    t->train_iters = (int)iters;
    t->lr = make_lr_schedule(a, t->train_iters);
}

// The learning-rate schedule of a resumed run against the checkpoint's, as Megatron-LM's
// OptimizerParamScheduler.load_state_dict: each value must equal the checkpoint's, unless
// --override-opt-param-scheduler takes this run's or --use-checkpoint-opt-param-scheduler the
// checkpoint's (a resume with another --lr once went on without a word). Only a run that loads
// the optimizer state resumes the schedule (not --finetune, --no-load-optim, --skip-train).

// this run's schedule as a checkpoint records it (the style by its flag's name)
static LRRecord lr_record(Config* a, const LRSchedule* s) {
    LRRecord r = {1, s->max_lr, s->min_lr, a->weight_decay, "", s->warmup_steps, s->decay_steps};
    void* base;
    const ConfigField* style = own_field(a, "--lr-decay-style", &base);
    format_field(style, base, r.decay_style, sizeof(r.decay_style));
    return r;
}

// the first value of the two records that differs, in words and both values ("": none)
static void lr_difference(const LRRecord* saved, const LRRecord* now, char* out, size_t len) {
    out[0] = '\0';
    if (saved->max_lr != now->max_lr) snprintf(out, len, "--lr %g, this run %g", saved->max_lr, now->max_lr);
    else if (saved->min_lr != now->min_lr) snprintf(out, len, "--min-lr %g, this run %g", saved->min_lr, now->min_lr);
    else if (strcmp(saved->decay_style, now->decay_style))
        snprintf(out, len, "--lr-decay-style %s, this run %s", saved->decay_style, now->decay_style);
    else if (saved->warmup_samples != now->warmup_samples)
        snprintf(out, len, "a warm-up of %lld samples, this run %lld (--lr-warmup-*)", saved->warmup_samples, now->warmup_samples);
    else if (saved->decay_samples != now->decay_samples)
        snprintf(out, len, "a decay over %lld samples, this run %lld (--lr-decay-*, or --train-iters/--train-samples "
                 "without them)", saved->decay_samples, now->decay_samples);
    else if (saved->weight_decay != now->weight_decay)
        snprintf(out, len, "--weight-decay %g, this run %g", saved->weight_decay, now->weight_decay);
}

static void reconcile_lr_schedule(Trainer* t, const char* ckpt, const LRRecord* saved) {
    Config* a = &t->config;
    char err[256], what[160];
    if (a->override_opt_param_scheduler && a->use_checkpoint_opt_param_scheduler)
        config_error("give --override-opt-param-scheduler or --use-checkpoint-opt-param-scheduler, not both (this "
                     "run's schedule, or the checkpoint's)");
    int resumes = ckpt[0] && !a->finetune && !a->no_load_optim && !a->skip_train && t->train_iters > 0;
    if (!resumes || a->override_opt_param_scheduler) return;
    if (!saved->recorded) {
        if (a->use_checkpoint_opt_param_scheduler)
            config_error("--use-checkpoint-opt-param-scheduler: checkpoint %s records no learning-rate schedule (an "
                         "import, the initial model, or written before gridgpt recorded it)", ckpt);
        return;
    }
    if (a->use_checkpoint_opt_param_scheduler) {   // the checkpoint's, whatever the flags
        void* base;
        const ConfigField* style = own_field(a, "--lr-decay-style", &base);
        if (parse_field(style, base, saved->decay_style, err, sizeof(err)))
            config_error("checkpoint %s: %s", ckpt, err);
        t->lr = (LRSchedule){saved->max_lr, saved->min_lr, saved->warmup_samples, saved->decay_samples,
                             (LRDecayStyle)a->lr_decay_style};
        a->lr = saved->max_lr, a->min_lr = saved->min_lr, a->weight_decay = saved->weight_decay;
        return;
    }
    LRRecord now = lr_record(a, &t->lr);
    lr_difference(saved, &now, what, sizeof(what));
    if (what[0])
        config_error("checkpoint %s was trained with %s: give the same schedule, --override-opt-param-scheduler "
                     "(this run's) or --use-checkpoint-opt-param-scheduler (the checkpoint's)", ckpt, what);
}

// Not bad input but a busy --save directory (another job's): rank 0's line, and every rank
// exits with its own status, so that a script can tell "try again later" from "fix the flags"
static void busy_exit(const char* err) {
    if (grid.world_rank == 0) fprintf(stderr, "error: %s\n", err);
    finalize_mpi();
    exit(SAVE_LOCK_BUSY);
}

// --save (and --load's path length), claimed before the checkpoint to load is chosen: rank 0
// prepares the directory and takes its lock, then find_checkpoint reads the marker under it. A
// job that waited for another's lock once trained from the choice it had made before, then
// rotated away the checkpoints the other job saved meanwhile (issue 45). Every rank learns the
// verdict.
static void claim_save_dir(const Config* a) {
    char err[4600] = "";
    int rc = 0;
    // the checkpoint file MPI-IO opens under --save or --load must fit what it takes in this run
    // (parallel.h: shared_file_path_max), checked before anything is made on disk
    const char* why;
    size_t max = shared_file_path_max(&why);
    const char *saved = "/iter_0000000.tmp/tensors.bin", *loaded = "/iter_0000000/tensors.bin";
    if (a->save && strlen(a->save) + strlen(saved) > max)
        error_line(err, sizeof(err), "--save %s: %zu characters, at most %zu here (%s)", a->save, strlen(a->save),
                   max - strlen(saved), why);
    else if (a->load && strlen(a->load) + strlen(loaded) > max)
        error_line(err, sizeof(err), "--load %s: %zu characters, at most %zu here (%s)", a->load, strlen(a->load),
                   max - strlen(loaded), why);
    config_error_anywhere(err);
    if (a->save && grid.world_rank == 0) rc = prepare_save_dir(a->save, a->load, a->finetune, err, sizeof(err));
    broadcast_host(&grid.world, &rc, sizeof(rc), 0);
    if (rc == SAVE_LOCK_BUSY) busy_exit(err);
    if (rc) config_error("%s", err);
}

// --tensorboard-dir, --profile-dir and --data-cache-path checked before any work: rank 0
// prepares them (it alone writes events and the trace), every rank learns its verdict
static void check_paths(const Config* a) {
    char err[4600] = "";
    int rc = 0;
    if (a->tensorboard_dir && grid.world_rank == 0) rc = prepare_dir("--tensorboard-dir", a->tensorboard_dir, err, sizeof(err));
    if (!rc && a->profile && grid.world_rank == 0)   // (rank 0 writes the trace)
        rc = prepare_dir("--profile-dir", a->profile_dir, err, sizeof(err)) || probe_dir("--profile-dir", a->profile_dir, "trace", err, sizeof(err));
    if (!rc && a->data_cache_path && grid.world_rank == 0)   // (Megatron makes it too)
        rc = prepare_dir("--data-cache-path", a->data_cache_path, err, sizeof(err));
    broadcast_host(&grid.world, &rc, sizeof(rc), 0);
    if (rc) config_error("%s", err);
}

// A checkpoint's consumed_samples against the batch schedule recorded with it: the schedule's
// batches summed from the iteration it took over must give it exactly (Megatron adds the
// global batch to consumed_samples once per iteration, skipped steps too). An edited or
// miscounted value would move the data position and the learning rate without a word.
static void check_consumed_samples(const char* ckpt, const Progress* p) {
    const BatchRecord* r = &p->batch;
    if (r->global_batch_size == 0) return;   // not recorded: counters_problem's checks only
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

// Megatron-LM's --use-checkpoint-args, made the default: each field the checkpoint holds that no
// flag gave is the checkpoint's: the model's shape, and what it stores for the record (a fine-tune
// once reset the initializer_range of the model it started from to the default). Not taken: the
// seed, the data order's (find_checkpoint), and sequence parallelism, a layout.
static int taken_from_checkpoint(const ConfigField* f) {
    return f->checkpoint != NOT_STORED && f->offset != offsetof(GPTConfig, seed) &&
           f->offset != offsetof(GPTConfig, sequence_parallel);
}

// A field a flag gave must match the checkpoint's where the layout depends on it
// (check_config_matches, once the vocabulary is settled); a switch or choice, the kind of model
// (RMSNorm or LayerNorm, rope...), is compared here, before the checks of the fields whose
// meaning it decides (a Llama checkpoint with --normalization LayerNorm was refused over the
// epsilon it took from the checkpoint).
static void take_model_from_checkpoint(Config* a, const GPTConfig* saved, const char* ckpt) {
    char taken[1024] = "", value[64], flag[96], err[256];
    size_t used = 0;
    for (int k = 0; k < NUM_MODEL_FIELDS; k++) {
        const ConfigField* f = &MODEL_FIELDS[k];
        if (a->model_given[k] && (f->kind == FIELD_SWITCH || f->kind == FIELD_CHOICE)) check_field_matches(ckpt, f, saved, &a->model);
        if (a->model_given[k] || !taken_from_checkpoint(f)) continue;
        format_field(f, saved, value, sizeof(value));
        if (parse_field(f, &a->model, value, err, sizeof(err))) config_error("checkpoint %s: %s", ckpt, err);
        if (used < sizeof(taken))
            used += snprintf(taken + used, sizeof(taken) - used, " %s %s", flag_of(f, flag, sizeof(flag)), value);
    }
    if (grid.world_rank == 0 && taken[0]) printf("model from checkpoint %s:%s\n", ckpt, taken);
}

// --load DIR: the latest checkpoint's metadata, read before anything else (the model's shape
// and the seed that continues the data order come from it); "" in ckpt when DIR has none (a
// fresh start). Rank 0 reads the marker, so that every rank loads the same checkpoint; each
// rank reads the metadata itself.
static void find_checkpoint(Config* a, char* ckpt, size_t len, CheckpointMeta* meta) {
    char err[4600] = "";
    int rc = 0;
    ckpt[0] = '\0';
    if (!a->load) return;
    struct stat st;
    if (stat(a->load, &st) == 0 && !S_ISDIR(st.st_mode)) config_error("--load %s: not a directory", a->load);
    if (grid.world_rank == 0) rc = latest_checkpoint(a->load, ckpt, len, err, sizeof(err));
    broadcast_host(&grid.world, &rc, sizeof(rc), 0);
    if (rc) config_error("%s", err);
    broadcast_host(&grid.world, ckpt, len, 0);
    if (ckpt[0]) {
        if (checkpoint_meta_read(ckpt, meta, err, sizeof(err)) != 0 && !err[0]) strcpy(err, "unreadable metadata");
        config_error_anywhere(err);
        check_consumed_samples(ckpt, &meta->progress);
        take_model_from_checkpoint(a, &meta->cfg, ckpt);
        if (!a->no_load_rng && !a->finetune) a->model.seed = meta->cfg.seed;   // the data order goes on
    } else if (a->skip_train) {
        config_error("--skip-train --load %s: no checkpoint there (no latest_checkpointed_iteration.txt)", a->load);
    } else if (grid.world_rank == 0) {
        printf("no checkpoint in %s (no latest_checkpointed_iteration.txt): starting from scratch\n", a->load);
    }
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
    grid_build(a->tensor_model_parallel_size, a->context_parallel_size, a->pipeline_model_parallel_size,
               a->expert_model_parallel_size);
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
    build.bias_grad_kernel = a->bias_grad == BIAS_GRAD_KERNEL;
#ifdef __CUDACC__
    bias_grad_in_epilogue = !build.bias_grad_kernel;   // the kernels run what the plan prices
#endif
    int* slots = (int*)mallocCheck(stage.chunks * sizeof(int));   // what the schedule needs
    stage_slots(a, grid.pp_rank, slots);
    microbatch_group_size_per_vp_stage = microbatch_group_size(a);   // the order the slots were counted in (pipeline.h)
    pipeline_schedule = (PipelineSchedule)a->pipeline_schedule;
    gpt_plan_model(&t->model, c, a->micro_batch_size, c->seq_length, grid.tp_rank, grid.tp_size,
                   context_slice(grid.cp_rank, grid.cp_size, c->seq_length), (CpCommType)a->cp_comm_type,
                   expert_slice(grid.ep_rank, grid.ep_size, c->num_experts, &grid.ep, grid.dp_cp.size / grid.ep_size),
                   stage, slots, grid.dp_cp.size, zero_shard_multiple(a->use_bnb_optimizer), build);
    zero_plan_windows(&t->model, a->zero_stage, !a->no_reshard_after_forward);
    free(slots);
    StageMemory planned = stage_memory(&t->model, stage, grid.dp_cp.size, a->use_bnb_optimizer);
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
    adamw_init_stage(&t->opt, &t->model, a->use_bnb_optimizer, a->zero_stage);
    zero_init(&t->model, &t->opt);   // ZeRO-2/3's hooks (ZeRO-3: the parameters initialized into the shards)
    grad_reducer_init(&t->model, t->opt.regions, a->overlap_grad_reduce, grad_bucket_size(a, grid.dp_cp.size));
    param_gatherer_init(&t->model, t->opt.regions, a->overlap_param_gather, grad_bucket_size(a, grid.dp_cp.size));
    pipeline_link_init(!a->no_overlap_p2p_communication, t->model.num_slots + 1);   // the slots' outputs and dres
    trace_init(profiles_rank(a, grid.world_rank));
    t->allocated_bytes = dev_bytes_allocated - before + kernels_workspace_bytes;   // kernels_init's came first
    t->opt.scaler = make_loss_scaler(a);
    t->expert_tokens = (double*)callocCheck((size_t)a->model.num_layers * a->model.num_experts + 1, sizeof(double));
}

// the checkpoint's weights (and optimizer state, counters) into the built model
static void resume(Trainer* t, const char* ckpt, const CheckpointMeta* meta) {
    const Config* a = &t->config;
    int with_optim = !a->no_load_optim && !a->finetune && !a->skip_train;
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

// the end-of-document id (generate.h's rule): the tokenizer's, --eod-id, or the vocabulary's last
static int eod_of(const Trainer* t) {
    const Config* a = &t->config;
    return end_of_document_id(t->tokenizer.vocab_size ? &t->tokenizer : NULL, a->model.vocab_size, a->eod_id);
}

// --generate-prompt as tokens (GPT-2's, or bytes: a byte-level vocabulary), or
// --generate-prompt-ids as they are; an empty prompt starts a document: the end-of-document id
static void encode_prompt(Trainer* t) {
    const Tokenizer* tok = &t->tokenizer;
    int V = t->config.model.vocab_size, eod = eod_of(t);
    const char* prompt = t->config.generate_prompt ? t->config.generate_prompt : "";
    const char* ids = t->config.generate_prompt_ids;
    size_t n = strlen(prompt) + (ids ? strlen(ids) : 0), bad = 0;
    char err[256];
    if (eod >= V) config_error("--eod-id %d: outside the vocabulary of %d ids", eod, V);
    if (*prompt && !tok->vocab_size && V > BYTE_VOCAB_SIZE)
        config_error("--generate-prompt: a vocabulary of %d ids is not bytes: give the tokenizer that made the data "
                     "(--tokenizer-type GPT2BPETokenizer --vocab-file VOCAB.json --merge-file MERGES.txt), or "
                     "--generate-prompt-ids", V);
    t->prompt.ids = (int*)mallocCheck((n + 1) * sizeof(int));   // a token is a byte or more, an id two
    t->prompt.cap = n + 1;
    if (ids && parse_prompt_ids(ids, tok->vocab_size ? tok->vocab_size : V, t->prompt.ids, &t->prompt.n, err, sizeof(err)))
        config_error("%s", err);
    if (tok->vocab_size && tokenizer_encode(tok, NULL, prompt, strlen(prompt), &t->prompt, &bad) != 0)
        config_error("--generate-prompt: invalid UTF-8 at byte %zu (GPT2BPETokenizer reads UTF-8 text)", bad);
    for (size_t i = 0; prompt[i] && !tok->vocab_size; i++) t->prompt.ids[t->prompt.n++] = (unsigned char)prompt[i];
    if (t->prompt.n == 0) t->prompt.ids[t->prompt.n++] = eod >= 0 ? eod : 0;   // (-1: bytes without one)
}

// --tokenizer-type GPT2BPETokenizer: the tokenizer, loaded on every rank (a file one host
// lacks is named). As in Megatron-LM the model's vocabulary is the tokenizer's: --vocab-size 0
// takes it; any other (given, or a checkpoint's) must be the same (a model reads the ids of the
// tokenizer it learned them from; the padding is --make-vocab-size-divisible-by's).
static void setup_tokenizer(Trainer* t) {
    Config* a = &t->config;
    Tokenizer* tok = &t->tokenizer;
    int V = a->model.vocab_size;
    char err[4600] = "";
    if (a->tokenizer_type == TOKENIZER_GPT2_BPE && tokenizer_load(tok, a->vocab_file, a->merge_file, err, sizeof(err)) == 0) {
        if (V == 0) a->model.vocab_size = tok->vocab_size;
        else if (V != tok->vocab_size)
            error_line(err, sizeof(err), "--vocab-file %s has %d tokens, but the model's vocabulary (%s) has %d: give the "
                       "tokenizer the model was trained with", a->vocab_file, tok->vocab_size,
                       model_field_given(a, offsetof(GPTConfig, vocab_size)) ? "--vocab-size" : "--load's checkpoint", V);
    }
    config_error_anywhere(err);
}

// The tokenizer every rank loaded (FNV-1a of its vocabulary and of its merges) against the one
// most ranks hold, as the data files are: a rank whose copy differs (a stale or cut file on a
// node-local disk) names the file, and every rank exits 2. Unchecked, ranks that encode a
// prompt differently ended in MPI_ERR_TRUNCATE, or generated from another text without a word.
static void check_same_tokenizer_everywhere(const Tokenizer* tok, const Config* a) {
    if (!tok->vocab_size) return;   // (no tokenizer: the flags, the same on every rank, say so everywhere)
    uint64_t mine[2] = {tok->vocab_hash, tok->merges_hash};
    uint64_t* all = (uint64_t*)callocCheck(2 * (size_t)grid.world_size, sizeof(uint64_t));
    all_gather_host(&grid.world, mine, all, sizeof(mine));
    char ref_host[sizeof(grid.host)];
    int ref, rank = rank_unlike_most(all, sizeof(mine), &ref, ref_host), which = mine[0] == all[2 * ref] ? 1 : 0;
    unsigned long long there = all[2 * ref + which];
    free(all);
    if (rank >= 0)
        config_error_on(rank, "%s %s: this rank's %s differs from rank %d's (on %s): FNV-1a %016llx here, %016llx there; "
                        "every rank must read the same tokenizer files (a stale or cut copy on a node-local disk?)",
                        which ? "--merge-file" : "--vocab-file", which ? a->merge_file : a->vocab_file,
                        which ? "merges file" : "vocabulary", ref, ref_host, (unsigned long long)mine[which], there);
}

static void trainer_setup(Trainer* t, int argc, char** argv) {
    memset(t, 0, sizeof(*t));
    on_stop_signals(stop_during_startup);   // trainer_run's handlers take over when training starts
    Config* a = &t->config;
    set_defaults(a);
    char err[4096];   // (every refused flag of a Megatron command line fits)
    parse_flags(a, argc, argv, err, sizeof(err));
    config_error_anywhere(err);
    print_megatron_notes(a);   // the Megatron flags accepted as what gridgpt does, a line each
    check_same_config_everywhere(a);   // from here on every rank reaches the same verdicts on the flags
    if (a->help || a->help_markdown) {
        if (grid.world_rank == 0 && a->help) print_usage(a);
        else if (grid.world_rank == 0) print_usage_markdown(a);
        grid_finish();
        exit(0);
    }
    if (a->export_hf) export_and_exit(a);
    if (a->import_hf) import_and_exit(a);
    ClusterCheck cluster_check = cluster_check_config(a);
    if (a->check_cluster && !a->data_path.count && !a->train_data_path.count) check_cluster_and_exit(a, &cluster_check);
    char ckpt[4300];
    CheckpointMeta meta;
    memset(&meta, 0, sizeof(meta));
    check_grid(a);   // (each rank's coordinates: an error of one rank's, below, names them)
    if (!a->dry_run) claim_save_dir(a);   // the lock first: the checkpoint to load is chosen under it
    find_checkpoint(a, ckpt, sizeof(ckpt), &meta);
    if (a->dry_run && !a->model.vocab_size) setup_tokenizer(t);   // (it reads no data: a tokenizer's vocabulary is the model's)
    check_model(a);
    check_run(a);
    setup_schedules(t);
    if (a->dry_run) dry_run_and_exit(a);
    check_paths(a);
    check_profile(a, t->train_iters, ckpt[0] && !a->finetune ? meta.progress.iteration : 0);
    setup_tokenizer(t);
    check_same_tokenizer_everywhere(&t->tokenizer, a);
    int64_t samples[3];
    t->eval_iters[1] = t->eval_iters[2] = a->eval_iters;
    samples_per_split(a, t->train_iters, t->eval_iters, samples);
    open_data_files(&t->data, a, samples);
    if (eval_iters_at_most_one_pass(&t->data, a, t->eval_iters)) {
        data_splits_close(&t->data);
        samples_per_split(a, t->train_iters, t->eval_iters, samples);
        open_data_files(&t->data, a, samples);
    }
    encode_prompt(t);
    set_padded_vocab_size(a);
    if (ckpt[0]) check_config_matches(ckpt, &meta.cfg, &a->model);
    reconcile_lr_schedule(t, ckpt, &meta.progress.lr);
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
    t->progress.lr = t->train_iters > 0 ? lr_record(a, &t->lr) : meta.progress.lr;   // what its checkpoints record
    checkpoint_meta_free(&meta);
    int B = a->micro_batch_size, T = a->model.seq_length;
    t->train = make_loader(&t->data, 0, B, T, 0);
    t->valid = make_loader(&t->data, 1, B, T, a->full_validation);
    t->valid.consumed = t->progress.consumed_valid_samples;
    t->test = make_loader(&t->data, 2, B, T, a->full_validation);
    open_tensorboard(t);
    print_setup(t);
}

static void trainer_free(Trainer* t) {
    tensorboard_close(&t->tensorboard);
    free_loader(&t->train);
    free_loader(&t->valid);
    free_loader(&t->test);
    grad_reducer_free();
    zero_free();
    param_gatherer_free();
    pipeline_link_free();
    trace_free();
    adamw_free(&t->opt);
    gpt_free(&t->model);
    data_splits_close(&t->data);
    if (t->tokenizer.vocab_size) tokenizer_free(&t->tokenizer);
    free(t->prompt.ids);
    free(t->expert_tokens);
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
    trace_begin_step(t->progress.iteration + 1, num_micro);
    add_comm_counters(r.comm, -1.0);
    zero_step_begin(m, &t->opt);
    t->train.consumed = t->progress.consumed_samples;
    activity_phase("forward and backward", t->progress.iteration + 1, -1);
    test_faults_in_step(t);
    // d(loss)/d(token loss), times the loss scale: the backward carries scaled gradients
    Schedule s = schedule_for(m, load_micro_batch, &t->train, t->opt.scaler.scale / ((float)m->seq_length * r.global_batch));
    DropoutStep dropout = {1, t->progress.iteration + 1, t->progress.consumed_samples, grid.dp_rank, grid.dp_size};
    m->dropout = dropout;   // the step's masks (off again after it: evaluation and generation have none)
    run_schedule(&s, num_micro);
    m->dropout.training = 0;
    r.loss = step_loss(&s, num_micro);
    step_moe_losses(m, num_micro, r.moe);
    if (m->cfg.num_experts > 0) {
        step_expert_tokens(m, t->expert_tokens);
        r.moe[2] = expert_imbalance(&m->cfg, t->expert_tokens);
    }
    r.moe[3] = drops_choices(&m->cfg) ? step_moe_dropped(m) : 0.0;
    r.max_in_flight = s.most_held;
    r.nan_loss = !isfinite(r.loss);
    float lr = learning_rate(&t->lr, t->progress.scheduler_samples);
    activity_phase("optimizer", t->progress.iteration + 1, -1);
    trace_begin("optimizer step", "optimizer", ON_COMPUTE_STREAM);
    r.grad_norm = optimizer_step(&t->model, &t->opt, &t->adam, lr, &r.skipped);
    trace_end();
    t->progress.consumed_samples += r.global_batch;
    if (!r.skipped) t->progress.scheduler_samples += r.global_batch;
    t->progress.iteration++;
    r.lr = learning_rate(&t->lr, t->progress.scheduler_samples);   // Megatron logs the rate set for the next step
    add_comm_counters(r.comm, 1.0);
    trace_end();
    return r;
}

// Megatron's log line, with averages over the steps since the last one
typedef struct {
    int steps, skipped, nan_loss;
    double loss_sum, seconds, waited;   // waited: in blocking operations (the rest is compute)
    long long samples;
} LogWindow;

// --log-comm: the last step's
static void print_comm_sent(const StepResult* r) {
    double most[NUM_COMM_GROUPS];
    memcpy(most, r->comm, sizeof(most));
    all_reduce_host(&grid.world, most, NUM_COMM_GROUPS, REDUCE_MAX);
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

// each MoE layer's tokens per expert in the last step, one scalar each ("expert tokens/layer 3/
// expert 1": TensorBoard groups them by layer), the load the log line's max/mean sums up
static void tensorboard_expert_tokens(Trainer* t) {
    const GPTConfig* c = &t->config.model;
    for (int l = 0; l < c->num_layers; l++)
        for (int e = 0; is_moe_layer(c, l) && e < c->num_experts; e++) {
            char tag[64];
            snprintf(tag, sizeof tag, "expert tokens/layer %d/expert %d", l, e);
            tensorboard_pair(t, tag, t->expert_tokens[(size_t)l * c->num_experts + e]);
        }
}

// The log line of Megatron-LM HEAD (training.py's training_log), field for field: the date,
// the throughput with --log-throughput (its FLOPs count: causal_flops_per_step), the grad
// norm unless the step was skipped. Then gridgpt's own two fields, always (a newcomer wants
// them before knowing a flag; last, so that parsers by field name see HEAD's): tokens per
// second and the ETA, the iterations left at the window's time per iteration. With
// --tensorboard-dir the same values under Megatron-LM's tags. Rank 0 prints and writes.
static void log_step(Trainer* t, const StepResult* r, LogWindow* w) {
    if (t->config.log_comm) print_comm_sent(r);
    if (grid.world_rank != 0) return;
    double seconds = w->seconds / w->steps, tokens_per_second = w->samples * t->config.model.seq_length / w->seconds;
    double tflops = causal_flops_per_step(&t->config.model, r->global_batch) / seconds / 1e12 / grid.world_size;
    double loss = w->steps > w->nan_loss ? w->loss_sum / (w->steps - w->nan_loss) : NAN;
    long eta = lround(seconds * (t->train_iters - t->progress.iteration));
    char date[32], throughput[64] = "", norm[64] = "";
    time_t now = time(NULL);
    strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S", localtime(&now));
    if (t->config.log_throughput) snprintf(throughput, sizeof(throughput), " throughput per GPU (TFLOP/s/GPU): %.1f |", tflops);
    int has_norm = isfinite(r->grad_norm);   // a skipped step (gradients not finite) has no norm
    if (has_norm) snprintf(norm, sizeof(norm), " grad norm: %.3f |", r->grad_norm);
    char moe[200] = "";   // a mixture of experts: its losses after the LM loss, as Megatron-LM's MoE logs them
    if (t->config.model.num_experts > 0)
        snprintf(moe, sizeof moe, " load_balancing_loss: %.6E | z_loss: %.6E | expert tokens max/mean: %.3f |", r->moe[0],
                 r->moe[1], r->moe[2]);
    if (drops_choices(&t->config.model))   // (the step's, with a capacity factor)
        snprintf(moe + strlen(moe), sizeof moe - strlen(moe), " dropped expert choices: %.0f |", r->moe[3]);
    printf(" [%s] iteration %8d/%8d | consumed samples: %12lld | elapsed time per iteration (ms): %.1f |%s"
           " learning rate: %.6E | global batch size: %5d | lm loss: %.6E |%s loss scale: %.1f |%s"
           " number of skipped iterations: %3d | number of nan iterations: %3d |"
           " tokens per second: %.0f | ETA: %ld:%02ld:%02ld |\n",
           date, t->progress.iteration, t->train_iters, t->progress.consumed_samples, 1000.0 * seconds, throughput, r->lr,
           r->global_batch, loss, moe, t->opt.scaler.scale, norm, w->skipped, w->nan_loss, tokens_per_second, eta / 3600,
           eta / 60 % 60, eta % 60);
    fflush(stdout);
    tensorboard_pair(t, "lm loss", loss);
    if (t->config.model.num_experts > 0) {   // (the last step's)
        tensorboard_pair(t, "load_balancing_loss", r->moe[0]);
        tensorboard_pair(t, "z_loss", r->moe[1]);
        tensorboard_pair(t, "expert_tokens_max_over_mean", r->moe[2]);
        tensorboard_expert_tokens(t);
    }
    if (drops_choices(&t->config.model)) tensorboard_pair(t, "dropped_expert_choices", r->moe[3]);
    tensorboard_pair(t, "learning-rate", r->lr);
    tensorboard_pair(t, "batch-size", r->global_batch);
    if (t->config.fp16) tensorboard_pair(t, "loss-scale", t->opt.scaler.scale);
    if (has_norm) tensorboard_pair(t, "grad-norm", r->grad_norm);
    tensorboard_pair(t, "iteration-time", seconds);   // seconds, as Megatron's
    if (t->config.log_throughput) tensorboard_pair(t, "throughput", tflops);
    tensorboard_pair(t, "tokens-per-second", tokens_per_second);
    tensorboard_pair(t, "mem-max-rss-bytes", peak_rss_gib() * 1073741824.0);
    tensorboard_flush(&t->tensorboard);
}

// ----------------------------------------------------------------------------
// generation (generate.h): the trainer's flags and prompt handed over; every rank calls it

static void generate(Trainer* t) {
    const Config* a = &t->config;
    const Tokenizer* tok = t->tokenizer.vocab_size ? &t->tokenizer : NULL;
    int text = a->generate_output != GENERATE_IDS;
    GenerateOptions o = {a->generate_tokens, a->temperature, a->top_k, a->top_p,
                         (uint64_t)(a->generate_seed ? a->generate_seed : a->model.seed), eod_of(t),
                         a->generate_ignore_eod, tok ? tok->vocab_size : a->model.vocab_size, tok,
                         text && a->generate_prompt ? a->generate_prompt : "", text, a->generate_output != GENERATE_TEXT,
                         &stop_requested, signal_name, !a->no_cuda_graph};
    on_stop_signals(request_stop);   // a signal ends generation after the token in hand (twice: at once)
    generate_tokens(&t->model, &o, t->prompt.ids, (int)t->prompt.n);
}

// ----------------------------------------------------------------------------
// the run

// the valid (split 1) or test (split 2) loss, printed; NAN where the split is absent or a
// signal stopped it
static float run_evaluation(Trainer* t, int split, const char* prefix, StopCheck stopped) {
    if (t->eval_iters[split] == 0 || !data_splits_has(&t->data, split)) return NAN;
    Loader* l = split == 1 ? &t->valid : &t->test;
    activity_phase(split == 1 ? "validation" : "test", t->progress.iteration, -1);
    trace_begin("evaluation", "evaluation", ON_COMPUTE_STREAM);
    float loss = l->full ? evaluate_full(&t->model, l, t->config.global_batch_size, stopped)
                         : evaluate(&t->model, l, t->eval_iters[split], t->config.global_batch_size, stopped);
    trace_end();
    if (stopped.flag && max_over_world(*stopped.flag != stopped.seen)) {
        if (grid.world_rank == 0) printf("evaluation at %s stopped by a signal\n", prefix);
        return NAN;
    }
    print_eval(prefix, loss);
    if (split == 1) {   // the test loss is printed, not written
        tensorboard_pair(t, "lm loss validation", loss);
        tensorboard_pair(t, "lm loss validation ppl", exp(loss));
        tensorboard_flush(&t->tensorboard);
    }
    return loss;
}

// after training, or alone (--skip-train): the validation and the test loss (Megatron-LM's
// do_valid and do_test); returns the validation loss. A signal after the one seen stops it.
static float evaluate_at_the_end(Trainer* t, StopCheck stopped) {
    char valid[64], test[64];
    snprintf(valid, sizeof(valid), "iteration %d on validation set", t->progress.iteration);
    snprintf(test, sizeof(test), "iteration %d on test set", t->progress.iteration);
    float loss = run_evaluation(t, 1, valid, stopped);
    run_evaluation(t, 2, test, stopped);
    return loss;
}

static void save_checkpoint_once(Trainer* t) {
    if (!t->config.save || t->last_saved == t->progress.iteration) return;
    t->progress.consumed_valid_samples = t->valid.consumed;
    activity_phase("saving a checkpoint", t->progress.iteration, -1);
    trace_begin("checkpoint save", "checkpoint", ON_HOST);
    t->last_save_failed = checkpoint_save(t->config.save, &t->model, &t->opt, &t->progress, t->config.keep_last);
    trace_end();
    t->last_saved = t->progress.iteration;
}

// a stop signal as the whole world sees it: the highest rank it reached, and which signal, as
// rank * 64 + signal (0: none)
static int signal_over_world(void) { return max_over_world(stop_requested ? grid.world_rank * 64 + stop_requested : 0); }

enum { EXIT_INTERVAL = -1, OUT_OF_TIME = -2 };

// After a step, before its log line: whether the run stops here, and why, as the whole world
// sees it (a signal may reach only some ranks, clocks differ): a signal (signal_over_world's
// value), else --exit-interval, else --exit-duration-in-mins; 0: go on
static int stop_reason(const Trainer* t, double start) {
    const Config* a = &t->config;
    int signalled = signal_over_world();
    if (signalled) return signalled;
    if (a->exit_interval > 0 && t->progress.iteration % a->exit_interval == 0) return EXIT_INTERVAL;
    return max_over_world(a->exit_duration_in_mins > 0 && now_seconds() - start > 60.0 * a->exit_duration_in_mins) ? OUT_OF_TIME : 0;
}

// After the log line and the evaluation: save at --save-interval (a signal during this save
// stops the run here, on the save just made), or on a stop, said in one line. Returns the reason.
static int save_after_step(Trainer* t, int reason) {
    const Config* a = &t->config;
    int it = t->progress.iteration;
    if (!reason && a->save_interval > 0 && it % a->save_interval == 0) {
        save_checkpoint_once(t);
        reason = signal_over_world();
    }
    if (!reason) return 0;
    save_checkpoint_once(t);
    if (grid.world_rank == 0) {
        char why[128];
        snprintf(why, sizeof(why), "%s on rank %d", signal_name(reason % 64), reason / 64);
        printf("stopping at iteration %d (%s)%s\n", it,
               reason == EXIT_INTERVAL ? "--exit-interval" : reason == OUT_OF_TIME ? "--exit-duration-in-mins" : why,
               !a->save ? "" : t->last_save_failed ? ", checkpoint not saved" : ", checkpoint saved");
        fflush(stdout);
    }
    return reason;
}

// --profile: every rank starts recording (where --profile-ranks has it) before the step that
// follows --profile-step-start iterations, as Megatron-LM starts its profiler ...
static void profile_start_if_due(const Trainer* t) {
    if (t->config.profile && t->progress.iteration == t->config.profile_step_start) trace_start();
}

// ... and stops after --profile-step-end's, that step's evaluation and checkpoint included (or
// at an earlier stop): every rank's spans merged into one file by rank 0, written atomically
static void profile_write_if_due(const Trainer* t, int stop) {
    const Config* a = &t->config;
    if (!tracer.active || (t->progress.iteration < a->profile_step_end && !stop)) return;
    activity_phase("writing the profile", t->progress.iteration, -1);
    size_t len = 0;
    long dropped = 0;
    int first = a->profile_step_start + 1, last = t->progress.iteration;
    char* json = trace_finish(first, last, &len, &dropped);
    if (grid.world_rank != 0) return;
    char path[4300], err[4700];
    snprintf(path, sizeof(path), "%s/trace_iterations_%d-%d.json", a->profile_dir, first, last);
    if (write_file_atomically(path, json, len, err, sizeof(err))) report_error("--profile: %s", err);
    else printf("profile: iterations %d to %d of %d rank(s) written to %s (%.1f MB)%s\n", first, last, grid.world_size,
                path, len / 1e6, dropped ? "; some spans did not fit (see its otherData): profile fewer steps" : "");
    fflush(stdout);
    free(json);
}

// on_step, if given, sees every step's result (the tests record runs through it)
typedef void (*StepHook)(const Trainer* t, const StepResult* r, void* ctx);

// what the summary line reports about this run's own steps (a resumed run counts from its start)
typedef struct {
    double start, train_seconds, last_loss;
    long long first_samples;
    int first_iteration, in_flight;   // in_flight: most micro-batches any stage held at once (1F1B: at most PP)
} RunTally;

static void print_summary(const Trainer* t, const RunTally* run, float valid_loss) {
    int in_flight = max_over_world(run->in_flight);
    if (grid.world_rank != 0) return;
    int it = t->progress.iteration - run->first_iteration;
    long long samples = t->progress.consumed_samples - run->first_samples;
    double tokens = (double)samples * t->config.model.seq_length, seconds = run->train_seconds;
    char resumed[64] = "";
    if (run->first_iteration > 0)
        snprintf(resumed, sizeof(resumed), " (%d to %d, resumed)", run->first_iteration + 1, t->progress.iteration);
    printf("summary: %d iterations%s, %lld samples (%.0f tokens) in %.1f s of training (%.1f s in all): "
           "%.0f tokens/s, %.1f ms per iteration; final lm loss %.4f; peak memory %.2f GiB (rank 0); "
           "at most %d micro-batch(es) in flight on a pipeline stage%s\n",
           it, resumed, samples, tokens, seconds, now_seconds() - run->start, seconds > 0 ? tokens / seconds : 0.0,
           it ? 1000.0 * seconds / it : 0.0, run->last_loss, peak_rss_gib(), in_flight,
           t->model.num_chunks > 1 ? " (interleaved: a micro-batch counted once in each model chunk it is in)" : "");
    if (t->config.unigram_baseline) {
        double h = data_splits_unigram_entropy(&t->data, t->config.model.vocab_size);
        printf("validation loss %.4f nats/token vs unigram (order-0) entropy of the train split %.4f nats/token: "
               "%.1f%% of it\n", valid_loss, h, 100.0 * valid_loss / h);
    }
    fflush(stdout);
}

// --generate-tokens, on every rank, unless a signal asked the run to end (said in one line)
static void sample_unless_signalled(Trainer* t) {
    if (t->config.generate_tokens == 0) return;
    int signalled = signal_over_world();
    if (!signalled) generate(t);
    else if (grid.world_rank == 0) printf("no sample: %s asked the run to end (sample from its checkpoint with --load and "
                                          "--skip-train --generate-tokens)\n", signal_name(signalled % 64));
}

// Every end of a run alike (--train-iters, --exit-interval, --exit-duration-in-mins, a
// signal): the line of the steps since the last one, the save (first, what a time limit must
// not lose, and before the evaluation: a resumed run then draws the validation samples an
// uninterrupted one would), the end-of-run evaluation, the summary, the sample. A signal during
// the evaluation stops it and skips the sample; a run a signal stopped evaluates (the same
// signal again ends the process at once: its default action is back) but does not sample: it
// was asked to end soon, and the checkpoint can sample later (--skip-train --generate-tokens).
static void finish_run(Trainer* t, const RunTally* run, const StepResult* r, LogWindow* w) {
    if (w->steps) log_step(t, r, w);
    save_checkpoint_once(t);
    float valid_loss = evaluate_at_the_end(t, (StopCheck){&stop_requested, stop_requested});
    print_summary(t, run, valid_loss);
    sample_unless_signalled(t);
    watchdog_stop();
}

static void trainer_run(Trainer* t, StepHook on_step, void* ctx) {
    LogWindow w;
    StepResult r;
    memset(&w, 0, sizeof(w));
    memset(&r, 0, sizeof(r));
    RunTally run = {now_seconds(), 0.0, NAN, t->progress.consumed_samples, t->progress.iteration, 0};
    on_stop_signals(request_stop);
    if (t->config.skip_train) {   // Megatron's --skip-train: the evaluation alone, and/or a generation
        evaluate_at_the_end(t, (StopCheck){&stop_requested, 0});
        sample_unless_signalled(t);
        return;
    }
    for (int reason = 0; !reason && t->progress.iteration < t->train_iters;) {
        profile_start_if_due(t);
        double t0 = now_seconds(), waited0 = seconds_waited();
        r = train_step(t);
        // the step's AdamW and all-gather are only queued on a GPU: count them in this step (an
        // overlapped all-gather, --overlap-param-gather, in the next: its forward waits for it)
        compute_synchronize();
        test_slow_rank(now_seconds() - t0 - (seconds_waited() - waited0));
        double dt = now_seconds() - t0;
        w.waited += seconds_waited() - waited0;
        if (on_step) on_step(t, &r, ctx);
        run.train_seconds += dt;
        w.steps++;
        w.seconds += dt;
        w.samples += r.global_batch;
        w.skipped += r.skipped;
        w.nan_loss += r.nan_loss;
        if (!r.nan_loss) w.loss_sum += r.loss;
        run.last_loss = r.loss;
        run.in_flight = r.max_in_flight > run.in_flight ? r.max_in_flight : run.in_flight;
        int it = t->progress.iteration;
        reason = stop_reason(t, run.start);
        // Megatron-LM HEAD logs the first iteration too; the last, and a stop's, close the window
        if (it % t->config.log_interval == 0 || it == 1 || it == t->train_iters || reason) {
            double sent = 0.0;   // (the last step's: each alike)
            for (int g = 0; g < NUM_COMM_GROUPS; g++) sent += r.comm[g];
            slow_rank_report((w.seconds - w.waited) / w.steps, w.waited / w.steps, sent, t->config.slow_rank_threshold);
            log_step(t, &r, &w);
            memset(&w, 0, sizeof(w));
        }
        if (it % t->config.eval_interval == 0) {   // the last iteration's too, as HEAD, then the end's
            char prefix[64];
            snprintf(prefix, sizeof(prefix), "iteration %d", it);
            run_evaluation(t, 1, prefix, (StopCheck){NULL, 0});
        }
        reason = save_after_step(t, reason);
        profile_write_if_due(t, reason);
    }
    finish_run(t, &run, &r, &w);
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
    kernels_free();   // what start_grid's kernels_init made (the cuBLASLt plans among it)
    grid_finish();
    return status;
}
#endif
