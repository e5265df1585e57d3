/*
tests/bench.c — how fast the CPU build trains one shape, and how much memory it takes.

usage: bench machine                   the machine's peaks, measured now (below)
       bench SHAPE [FMA_PEAK SGEMM_PEAK]  SHAPE is 124M (GPT-2 124M) or small; the peaks
                       (GFLOP/s, from `bench machine`) give the achieved rate as fractions of
                       them. tests/bench.sh runs one process per shape, so that each peak RSS
                       is its own.

The machine's peaks, measured, never assumed: an FMA loop on every OpenMP thread at once
(independent chains of the widest vectors this build compiles for, so the FMA pipes stay
full), and the best of OpenBLAS's sgemm at large square sizes.

What it measures, through the trainer's own functions (no dataset: one batch of random
token ids from a fixed seed, below the vocabulary):
  - the step, as train_step runs it with one micro-batch: dev_zero(grads),
    run_1f1b (one stage: forward then backward), optimizer_step (AdamW with gradient clipping);
    a few warm-up steps, then the median and the minimum of N timed steps;
  - throughput: tokens per second, and GFLOP/s of the model FLOPs that train.c's
    flops_per_step() counts (Narayanan et al. 2021);
  - memory: peak RSS (getrusage ru_maxrss) against the budget: (parameters + gradients +
    two Adam moments) x 4 bytes + the activation arena (the model's arena_bytes); and the
    arena with --checkpoint-activations against without, as gpt_plan_model lays it out;
  - where the time goes: more steps with gpt_forward, gpt_backward and optimizer_step
    timed apart, and every kernel call timed. For the kernels this file includes
    kernels.cuh first and, on the CPU build where each kernel name is a macro, points each
    name at a wrapper here; then it includes train.c, so the trainer's own code calls the
    wrappers. A wrapper only reads the clock while `profiling` is on (the phase steps),
    never during the timed steps.
Other systems are measured in the same `make bench` run by tests/bench.sh (PyTorch, by
tests/bench_torch.py, from the "same shape" line this program prints); this program prints
no figure it did not measure.
*/
#ifdef __CUDACC__
#error "tests/bench.c measures the CPU build"
#endif
#define TESTING
#include "../kernels.cuh"
#include <time.h>

// ----------------------------------------------------------------------------
// kernel timing: one entry per kernel (per role, for the matmuls)

typedef struct {
    char name[64];
    double seconds, flops;
    long calls;
} KernelStat;

#define MAX_KERNEL_STATS 64
static KernelStat kernel_stats[MAX_KERNEL_STATS];
static int num_kernel_stats;
static int profiling;               // time kernel calls (phase steps only)
static int model_hidden, model_ffn; // to name a matmul by its role
static const float* logits_weight;  // ... and the input gradient's of the logits (which has no bias)

static double bench_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void record_kernel(const char* name, double flops, double seconds) {
    KernelStat* s = NULL;
    for (int i = 0; i < num_kernel_stats && !s; i++)
        if (strcmp(kernel_stats[i].name, name) == 0) s = &kernel_stats[i];
    if (!s) {
        if (num_kernel_stats == MAX_KERNEL_STATS) return;
        s = &kernel_stats[num_kernel_stats++];
        snprintf(s->name, sizeof(s->name), "%s", name);
    }
    s->seconds += seconds;
    s->flops += flops;
    s->calls++;
}

#define TIMED(name, flops, call)                                                 \
    do {                                                                         \
        double t0_ = profiling ? bench_clock() : 0.0;                            \
        call;                                                                    \
        if (profiling) record_kernel((name), (flops), bench_clock() - t0_);     \
    } while (0)

// Megatron's names of the linear layers, told apart by their shapes (one tensor rank)
static const char* matmul_role(int in, int out, int has_bias) {
    if (!has_bias) return "logits";
    if (out == 3 * model_hidden) return "query_key_value";
    if (in == model_ffn) return "dense_4h_to_h";
    if (out == model_ffn) return "dense_h_to_4h";
    return "dense (attention)";
}

static const char* matmul_name(char* buf, size_t len, const char* op, int N, int in, int out, int has_bias) {
    snprintf(buf, len, "%s %s %dx%d->%d", op, matmul_role(in, out, has_bias), N, in, out);
    return buf;
}

// ----------------------------------------------------------------------------
// the wrappers: the matmuls are named by their role and shape

static void bench_matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                                 int N, int C, int OC) {
    char name[64] = "";
    if (profiling) matmul_name(name, sizeof(name), "matmul_forward", N, C, OC, bias != NULL);
    TIMED(name, 2.0 * N * C * OC, matmul_forward_cpu(out, inp, weight, bias, N, C, OC));
}

// the backward in the two products the model calls apart (the split a zero-bubble schedule
// defers): the input's gradient and the weight's (with the bias's column sums)
static void bench_matmul_backward_dinp(float* dinp, const float* dout, const float* weight, int N, int C, int OC) {
    char name[64] = "";
    if (profiling) matmul_name(name, sizeof(name), "matmul_backward_dinp", N, C, OC, weight != logits_weight);
    TIMED(name, 2.0 * N * C * OC, matmul_backward_dinp_cpu(dinp, dout, weight, N, C, OC));
}

static void bench_matmul_backward_params(float* dweight, float* dbias, const float* dout, const float* inp,
                                         int N, int C, int OC) {
    char name[64] = "";
    if (profiling) matmul_name(name, sizeof(name), "matmul_backward_params", N, C, OC, dbias != NULL);
    TIMED(name, 2.0 * N * C * OC, matmul_backward_params_cpu(dweight, dbias, dout, inp, N, C, OC));
}

// The other kernels keep the trainer's arguments untouched: NAME(...) becomes a timed
// NAME_cpu(...), as kernels.cuh maps them (attention_forward drops its lse and scratch
// arguments, attention_probabilities its scratch, attention_backward its out, lse and alibi, as kernels.cuh does on the CPU build). Attention's model FLOPs as flops_per_step counts
// them: 4 B T^2 C forward, twice that backward.
static double attention_flops;   // forward, per call

#undef matmul_forward
#undef matmul_gelu_forward
#undef matmul_backward_dinp
#undef matmul_backward_params
#undef gelu_matmul_backward_dinp
#undef attention_forward
#undef attention_backward
#undef attention_probabilities
#undef encoder_forward
#undef encoder_backward
#undef residual_forward
#undef layernorm_forward
#undef layernorm_backward
#undef residual_layernorm_forward
#undef gelu_forward
#undef gelu_backward
#undef crossentropy_online_stats
#undef crossentropy_rescale_sums
#undef crossentropy_forward
#undef crossentropy_forward_fused
#undef adamw_update_ranges
#undef sum_squares_ranges
#define matmul_forward bench_matmul_forward
// the fc layer and its GELU, timed as the two calls they are on the CPU build
#define matmul_gelu_forward(out, pre_gelu, inp, weight, bias, N, C, OC, form)                      \
    do {                                                                                          \
        bench_matmul_forward(pre_gelu, inp, weight, bias, N, C, OC);                              \
        if ((form) == GELU_ERF) TIMED("gelu_erf_forward", 0.0, gelu_erf_forward_cpu(out, pre_gelu, (size_t)(N) * (OC))); \
        else gelu_forward(out, pre_gelu, (size_t)(N) * (OC));                                     \
    } while (0)
#define matmul_backward_dinp bench_matmul_backward_dinp
#define matmul_backward_params(dweight, dbias, partials, ...) bench_matmul_backward_params(dweight, dbias, __VA_ARGS__)
// the fcproj layer's input gradient and the GELU before it: the two calls they are on the CPU build
#define gelu_matmul_backward_dinp(dpre, dout, weight, pre_gelu, N, C, OC, form)                                 \
    do {                                                                                                  \
        bench_matmul_backward_dinp(dpre, dout, weight, N, C, OC);                                         \
        if ((form) == GELU_ERF) TIMED("gelu_erf_backward", 0.0, gelu_erf_backward_cpu(dpre, pre_gelu, dpre, (size_t)(N) * (C))); \
        else gelu_backward(dpre, pre_gelu, dpre, (size_t)(N) * (C));                                      \
    } while (0)
#define attention_forward(out, att, lse, scratch, ...) \
    TIMED("attention_forward", attention_flops, attention_forward_cpu(out, att, __VA_ARGS__))
#define attention_backward(dqkv, scratch, dout, qkv, out, att, lse, B, T, NH, G, HS, alibi, dropout) \
    TIMED("attention_backward", 2.0 * attention_flops, attention_backward_cpu(dqkv, scratch, dout, qkv, att, B, T, NH, G, HS, dropout))
// selective recomputation's pass: the scores q k^T again, half the forward's products
#define attention_probabilities(att, scratch, ...) \
    TIMED("attention_probabilities", attention_flops / 2.0, attention_probabilities_cpu(att, __VA_ARGS__))
#define encoder_forward(...) TIMED("encoder_forward", 0.0, encoder_forward_cpu(__VA_ARGS__))
#define encoder_backward(...) TIMED("encoder_backward", 0.0, encoder_backward_cpu(__VA_ARGS__))
#define residual_forward(...) TIMED("residual_forward", 0.0, residual_forward_cpu(__VA_ARGS__))
#define layernorm_forward(...) TIMED("layernorm_forward", 0.0, layernorm_forward_cpu(__VA_ARGS__))
#define layernorm_backward(dinp, dweight, dbias, partials, ...) \
    TIMED("layernorm_backward", 0.0, layernorm_backward_cpu(dinp, dweight, dbias, __VA_ARGS__))
#define residual_layernorm_forward(...) TIMED("residual_layernorm_forward", 0.0, residual_layernorm_forward_cpu(__VA_ARGS__))
#define gelu_forward(...) TIMED("gelu_forward", 0.0, gelu_forward_cpu(__VA_ARGS__))
#define gelu_backward(...) TIMED("gelu_backward", 0.0, gelu_backward_cpu(__VA_ARGS__))
#define crossentropy_online_stats(...) TIMED("crossentropy_online_stats", 0.0, crossentropy_online_stats_cpu(__VA_ARGS__))
#define crossentropy_rescale_sums(...) TIMED("crossentropy_rescale_sums", 0.0, crossentropy_rescale_sums_cpu(__VA_ARGS__))
#define crossentropy_forward(...) TIMED("crossentropy_forward", 0.0, crossentropy_forward_cpu(__VA_ARGS__))
#define crossentropy_forward_fused(...) TIMED("crossentropy_forward_fused", 0.0, crossentropy_forward_fused_cpu(__VA_ARGS__))
#define adamw_update_ranges(...) TIMED("adamw_update", 0.0, adamw_update_ranges_cpu(__VA_ARGS__))
#define sum_squares_ranges(...) TIMED("sum_squares", 0.0, sum_squares_ranges_cpu(__VA_ARGS__))

// the trainer's own main path (trainer_setup, trainer_run, ...) is not called here
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "../train.c"
#pragma GCC diagnostic pop

// ----------------------------------------------------------------------------
// the shapes

typedef struct {
    const char* name;
    int layers, hidden, heads, vocab, max_positions, micro_batch, seq;
    int warmup, timed, profiled;    // steps
} Shape;

static const Shape shapes[] = {
    // GPT-2 124M: 1024 positions, as GPT-2 (124,475,904 parameters with the padded vocabulary)
    {"124M", 12, 768, 12, 50304, 1024, 4, 64, 3, 10, 5},
    {"small", 4, 256, 4, 256, 64, 4, 64, 5, 50, 20},
};

static const Shape* shape_named(const char* name) {
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
        if (name && strcmp(shapes[i].name, name) == 0) return &shapes[i];
    fprintf(stderr, "usage: bench machine | bench 124M|small [FMA_PEAK SGEMM_PEAK]\n");
    exit(2);
}

static GPTConfig shape_config(const Shape* s) {
    GPTConfig c = gpt_default_config();   // every field the trainer's default, then the model's own
    c.num_layers = s->layers;
    c.hidden_size = s->hidden;
    c.num_attention_heads = s->heads;
    c.ffn_hidden_size = 4 * s->hidden;
    c.seq_length = s->seq;
    c.max_position_embeddings = s->max_positions;
    c.vocab_size = s->vocab;
    c.make_vocab_size_divisible_by = 128;
    c.padded_vocab_size = padded_vocab_size(c.vocab_size, c.make_vocab_size_divisible_by, 1);
    c.init_method_std = 0.02f;
    c.seed = 1234;
    return c;
}

// ----------------------------------------------------------------------------
// the bench: a model, its optimizer and one random batch

#define MAX_WARMUP 8

typedef struct {
    const Shape* shape;
    GPTConfig cfg;
    GPT model;
    AdamWConfig adam;
    AdamWState opt;
    int *tokens, *targets;   // host copies of the batch
    double build_seconds;
    double warmup_seconds[MAX_WARMUP];
    float first_loss, last_loss;
} Bench;

static void random_batch(Bench* b) {
    int n = b->shape->micro_batch * b->shape->seq;
    b->tokens = (int*)mallocCheck(n * sizeof(int));
    b->targets = (int*)mallocCheck(n * sizeof(int));
    uint64_t state = 20240601;
    for (int i = 0; i < n; i++) {
        state = splitmix64(state);
        b->tokens[i] = (int)(state % (uint64_t)b->cfg.vocab_size);
        b->targets[i] = (int)((state >> 32) % (uint64_t)b->cfg.vocab_size);
    }
}

// the LoadMicroBatch of the schedule: the same batch every time
static void load_random_batch(void* ctx, int micro_batch, int* tokens, int* targets) {
    (void)micro_batch;
    Bench* b = (Bench*)ctx;
    size_t bytes = (size_t)b->model.B * b->model.T * sizeof(int);
    host_to_dev(tokens, b->tokens, bytes);
    host_to_dev(targets, b->targets, bytes);
}

static void bench_setup(Bench* b, const Shape* s) {
    memset(b, 0, sizeof(*b));
    b->shape = s;
    b->cfg = shape_config(s);
    model_hidden = b->cfg.hidden_size;
    model_ffn = b->cfg.ffn_hidden_size;
    attention_flops = 4.0 * s->micro_batch * s->seq * s->seq * s->hidden;
    double t0 = bench_clock();
    gpt_build(&b->model, &b->cfg, s->micro_batch, s->seq, 0, 1, 0, 1, 1, 1);
    b->build_seconds = bench_clock() - t0;
    logits_weight = param_of(&b->model, b->model.output);
    AdamWConfig adam = {0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};   // beta1, beta2, eps, weight decay, clip
    b->adam = adam;
    adamw_init(&b->opt, &b->model, 0);
    random_batch(b);
}

static void bench_free(Bench* b) {
    adamw_free(&b->opt);
    gpt_free(&b->model);
    free(b->tokens);
    free(b->targets);
}

#define BENCH_LR 1e-4f

// one training step as train_step runs it, with one micro-batch
static float train_step_once(Bench* b) {
    int skipped = 0;
    GPT* m = &b->model;
    dev_zero(m->grads, m->num_params_padded * sizeof(float));
    Schedule s = schedule_for(m, load_random_batch, b, 1.0f / ((float)m->B * m->T));
    run_1f1b(&s, 1);
    float loss = step_loss(&s, 1);
    optimizer_step(m, &b->opt, &b->adam, BENCH_LR, &skipped);
    return loss;
}

// ----------------------------------------------------------------------------
// timing

// (compare_doubles and median_of, which sorts, are parallel.h's: --check-cluster's medians)
static double median_of_sorted(const double* v, int n) {
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// warm-up, then times[] of the timed steps, sorted
static void time_steps(Bench* b, double* times) {
    for (int i = 0; i < b->shape->warmup; i++) {
        double t0 = bench_clock();
        float loss = train_step_once(b);
        if (i < MAX_WARMUP) b->warmup_seconds[i] = bench_clock() - t0;
        if (i == 0) b->first_loss = loss;
    }
    for (int i = 0; i < b->shape->timed; i++) {
        double t0 = bench_clock();
        b->last_loss = train_step_once(b);
        times[i] = bench_clock() - t0;
    }
    qsort(times, b->shape->timed, sizeof(double), compare_doubles);
}

enum { PHASE_ZERO, PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER, NUM_PHASES };
static const char* phase_names[NUM_PHASES] = {"zero grads (dev_zero)", "forward (gpt_forward)",
                                              "backward (gpt_backward)", "optimizer (optimizer_step)"};

// the same step cut at its phases, kernels timed; phases[p][step] in seconds
static void profile_steps(Bench* b, double* phases[NUM_PHASES]) {
    GPT* m = &b->model;
    int skipped = 0;
    profiling = 1;
    for (int i = 0; i < b->shape->profiled; i++) {
        double t[NUM_PHASES + 1];
        t[0] = bench_clock();
        dev_zero(m->grads, m->num_params * sizeof(float));
        load_random_batch(b, 0, m->slots[0].tokens, m->slots[0].targets);
        t[1] = bench_clock();
        gpt_forward_stage(m, 0, 1.0f / ((float)m->B * m->T));   // and dlogits, for the backward
        t[2] = bench_clock();
        gpt_backward(m, 0);
        t[3] = bench_clock();
        optimizer_step(m, &b->opt, &b->adam, BENCH_LR, &skipped);
        t[4] = bench_clock();
        for (int p = 0; p < NUM_PHASES; p++) phases[p][i] = t[p + 1] - t[p];
    }
    profiling = 0;
}

// ----------------------------------------------------------------------------
// the profiler's cost (--profile, trace.h). Recording off, each hook is one branch: measured
// as a begin and end pair in a loop (a compiler barrier in it, so that the flag is read each
// time, as in the step), times the pairs a step makes. Recording on, a span is two clock
// readings and a few stores: steps with it against steps without, in interleaved pairs (the
// one with recording first in every other pair, so that a step's place in a pair cancels out).

typedef struct {
    double hook_ns;        // one begin + end pair, recording off
    int spans;             // spans one step records
    double off_ms[3], on_ms[3];   // the interleaved steps' median, min, max
} ProfilerCost;

static ProfilerCost measure_profiler(Bench* b) {
    ProfilerCost c;
    int n = b->shape->profiled;
    long pairs = 20000000;
    double t0 = bench_clock();
    for (long i = 0; i < pairs; i++) {
        trace_begin("forward", "compute", ON_COMPUTE_STREAM);
        trace_end();
        __asm__ volatile("" ::: "memory");
    }
    c.hook_ns = (bench_clock() - t0) / pairs * 1e9;
    double* off = (double*)callocCheck(n, sizeof(double));
    double* on = (double*)callocCheck(n, sizeof(double));
    trace_init(1);
    for (int i = 0; i < 2 * n; i++) {   // pairs, the step with recording first in every other one
        int recording = (i % 2) ^ ((i / 2) % 2);
        if (recording) trace_start();
        double t = bench_clock();
        train_step_once(b);
        (recording ? on : off)[i / 2] = bench_clock() - t;
        if (recording) c.spans = tracer.count;
        trace_stop();
    }
    trace_free();
    qsort(off, n, sizeof(double), compare_doubles);
    qsort(on, n, sizeof(double), compare_doubles);
    double off_ms[3] = {1e3 * median_of_sorted(off, n), 1e3 * off[0], 1e3 * off[n - 1]};
    double on_ms[3] = {1e3 * median_of_sorted(on, n), 1e3 * on[0], 1e3 * on[n - 1]};
    memcpy(c.off_ms, off_ms, sizeof(off_ms));
    memcpy(c.on_ms, on_ms, sizeof(on_ms));
    free(off);
    free(on);
    return c;
}

// ----------------------------------------------------------------------------
// the machine's peaks, measured now

// fma_peak_gflops and linear_gflops are hardware.h's: the planner prices the CPU build on the
// same measurements (there the median window's rate, under the machine's load; here the best).

// `bench machine`: both peaks, and a last line "peaks: FMA SGEMM" for tests/bench.sh
static int bench_machine(void) {
    int threads = omp_get_max_threads();
    double fma = fma_peak_gflops(0.3, 3, 1);
#ifdef USE_BLAS
    printf("%s\n", blas_kernels_line);
#endif
    printf("machine peaks, measured now with %d OpenMP thread(s):\n", threads);
    printf("   FMA loop          %8.1f GFLOP/s = %d x %.1f per thread (%d-wide fp32 FMA, %d chains)\n", fma, threads,
           fma / threads, FMA_LANES, FMA_CHAINS);
    double sgemm = 0.0;
#ifdef USE_BLAS
    int sizes[] = {1024, 2048}, best_n = 0;
    printf("   OpenBLAS sgemm   ");
    for (int i = 0; i < 2; i++) {
        LinearWork square = {sizes[i], 1, {sizes[i]}, {sizes[i]}, 0, NULL, NULL, NULL, NULL, NULL, NULL};   // one sgemm
        double g = linear_gflops(square, 0.3, 3, 1);
        printf(" %d^3: %.1f GFLOP/s;", sizes[i], g);
        if (g > sgemm) sgemm = g, best_n = sizes[i];
    }
    printf(" best %.1f (%d^3, %s kernels, %.0f%% of the FMA loop)\n", sgemm, best_n, openblas_get_corename(),
           100.0 * sgemm / fma);
#else
    printf("   sgemm             none: built without OpenBLAS\n");
#endif
    printf("peaks: %.1f %.1f\n", fma, sgemm);
    return 0;
}

// ----------------------------------------------------------------------------
// report

static double rss_mib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0;   // KiB on Linux
}

static void print_header(const Bench* b) {
    const GPTConfig* c = &b->cfg;
    printf("== %s: %d layers, hidden %d, %d heads, ffn %d, vocab %d (padded %d), positions %d, "
           "micro-batch %d, seq %d, %s\n", b->shape->name, c->num_layers, c->hidden_size, c->num_attention_heads,
           c->ffn_hidden_size, c->vocab_size, c->padded_vocab_size, c->max_position_embeddings, b->model.B,
           b->model.T, PRECISION_NAME);
    printf("   %zu parameters, %d OpenMP thread(s), sgemm: %s%s; gpt_build (init) took %.2f s\n",
           b->model.num_params, omp_get_max_threads(),
#ifdef USE_BLAS
           openblas_get_corename(), " kernels of OpenBLAS",
#else
           "none", " (plain-C matmuls)",
#endif
           b->build_seconds);
}

static double fma_peak, sgemm_peak;   // GFLOP/s, from `bench machine` (0: not given)

static void print_step(const Bench* b, const double* sorted_times) {
    const Shape* s = b->shape;
    double med = median_of_sorted(sorted_times, s->timed), min = sorted_times[0];
    double flops = flops_per_step(&b->cfg, b->model.B, 0, 0);
    int tokens = b->model.B * b->model.T;
    printf("step (zero grads + forward + backward + AdamW with clipping, 1 micro-batch), %d warm-up + %d timed:\n",
           s->warmup, s->timed);
    printf("   step time         median %9.1f ms   min %9.1f ms   max %9.1f ms\n", 1e3 * med, 1e3 * min,
           1e3 * sorted_times[s->timed - 1]);
    printf("   warm-up steps    ");
    for (int i = 0; i < s->warmup && i < MAX_WARMUP; i++) printf(" %.1f", 1e3 * b->warmup_seconds[i]);
    printf(" ms (the first one touches the activation arena)\n");
    printf("   tokens/s          median %9.0f      best %8.0f      (%d tokens per step)\n", tokens / med,
           tokens / min, tokens);
    printf("   model FLOPs       %.3f GFLOP per step (train.c flops_per_step: 3 x forward, Narayanan et al. 2021)\n",
           flops / 1e9);
    printf("   achieved          median %9.1f GFLOP/s   best %6.1f GFLOP/s\n", flops / med / 1e9, flops / min / 1e9);
    if (fma_peak > 0.0)
        printf("                     median = %.0f%% of the FMA loop's %.1f, %.0f%% of OpenBLAS's best sgemm %.1f "
               "(measured before this shape)\n", 100.0 * flops / med / 1e9 / fma_peak, fma_peak,
               sgemm_peak > 0.0 ? 100.0 * flops / med / 1e9 / sgemm_peak : 0.0, sgemm_peak);
    printf("   loss (sanity)     %.4f at the first warm-up step -> %.4f at the last timed step (same batch)\n",
           b->first_loss, b->last_loss);
}

// what another system needs to run the same step (tests/bench_torch.py reads this line)
static void print_same_shape(const Bench* b) {
    const Shape* s = b->shape;
    printf("same shape: layers=%d hidden=%d heads=%d ffn=%d vocab=%d padded_vocab=%d positions=%d micro_batch=%d "
           "seq=%d warmup=%d timed=%d lr=%g beta1=%g beta2=%g eps=%g weight_decay=%g clip=%g init_std=%g\n", s->layers,
           s->hidden, s->heads, b->cfg.ffn_hidden_size, b->cfg.vocab_size, b->cfg.padded_vocab_size, s->max_positions,
           s->micro_batch, s->seq,
           s->warmup, s->timed, BENCH_LR, b->adam.beta1, b->adam.beta2, b->adam.eps, b->adam.weight_decay,
           b->adam.clip_grad, b->cfg.init_method_std);
}

static void print_bench_memory(const Bench* b, double rss_start, double rss_built) {
    const GPT* m = &b->model;
    double mib = 1024.0 * 1024.0, tensor = m->num_params * sizeof(float) / mib, arena = m->arena_bytes / mib;
    double budget = 4.0 * tensor + arena, peak = rss_mib();
    printf("memory (this process only):\n");
    printf("   peak RSS          %9.1f MiB   (getrusage ru_maxrss)\n", peak);
    printf("   budget            %9.1f MiB = parameters %.1f + gradients %.1f + Adam m %.1f + Adam v %.1f"
           " + activations %.1f (arena_bytes)\n", budget, tensor, tensor, tensor, tensor, arena);
    printf("   peak / budget     %9.3f       (target <= 1.2 for 124M)\n", peak / budget);
    printf("   peak RSS so far:  %.1f MiB after MPI start, %.1f MiB after gpt_build + adamw_init, %.1f MiB at the end\n",
           rss_start, rss_built, peak);
}

// the activation arena gpt_plan_model lays out (nothing allocated, no step run) on one rank for
// micro-batch B and sequence T, with recomputation `method` in chunks of one layer, or the
// attention core's (`core`: selective)
static size_t planned_arena(GPTConfig c, int B, int T, int method, int core) {
    c.seq_length = T;
    c.recompute_method = method;
    c.recompute_num_layers = 1;
    c.recompute_attention_core = core;
    GPT m;
    int one_slot = 1;
    gpt_plan_model(&m, &c, B, T, 0, 1, context_slice(0, 1, T), CP_COMM_P2P, expert_slice(0, 1, c.num_experts, NULL, 1),
                   even_stage(c.num_layers, 0, 1), &one_slot, 1, 1, this_build());
    size_t bytes = m.arena_bytes;
    gpt_free(&m);
    return bytes;
}

// the arena without recomputation, with the selective one (--recompute-activations) and with
// --checkpoint-activations (full, uniform, chunks of one layer), at this shape's micro-batch
// and sequence and at the trainer's defaults
static void print_recompute_memory(const Bench* b) {
    Config defaults;
    set_defaults(&defaults);
    int sizes[2][2] = {{b->model.B, b->model.T}, {defaults.micro_batch_size, defaults.model.seq_length}};
    double mib = 1024.0 * 1024.0;
    printf("activation recomputation, the arena as gpt_plan_model lays it out (selective: --recompute-activations; "
           "full: --checkpoint-activations):\n");
    for (int k = 0; k < 2; k++) {
        int B = sizes[k][0], T = sizes[k][1];
        if ((k == 1 && B == sizes[0][0] && T == sizes[0][1]) || T > b->cfg.max_position_embeddings) continue;
        double without = planned_arena(b->cfg, B, T, RECOMPUTE_NONE, 0) / mib;
        double selective = planned_arena(b->cfg, B, T, RECOMPUTE_NONE, 1) / mib;
        double full = planned_arena(b->cfg, B, T, RECOMPUTE_UNIFORM, 0) / mib;
        printf("   micro-batch %d, seq %4d %-26s %8.1f MiB without, %7.1f MiB selective (%.3f of it), %7.1f MiB full "
               "(%.3f)\n", B, T, k ? "(the trainer's defaults):" : "(this bench's shape):", without, selective,
               selective / without, full, full / without);
    }
}

static double mean(const double* v, int n) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += v[i];
    return sum / n;
}

// returns the mean step of these steps, which the kernel table divides by
static double print_phases(const Bench* b, double* phases[NUM_PHASES]) {
    int n = b->shape->profiled;
    double med[NUM_PHASES], avg[NUM_PHASES], med_sum = 0.0, avg_sum = 0.0;
    for (int p = 0; p < NUM_PHASES; p++) {
        avg_sum += avg[p] = mean(phases[p], n);
        med_sum += med[p] = median_of(phases[p], n);
    }
    printf("phases (%d more steps, cut at the phases, kernels timed):\n", n);
    printf("   %-28s %9s %9s %7s\n", "phase", "median ms", "mean ms", "% mean");
    for (int p = 0; p < NUM_PHASES; p++)
        printf("   %-28s %9.2f %9.2f %6.1f%%\n", phase_names[p], 1e3 * med[p], 1e3 * avg[p], 100.0 * avg[p] / avg_sum);
    printf("   %-28s %9.2f %9.2f\n", "step", 1e3 * med_sum, 1e3 * avg_sum);
    return avg_sum;
}

static int compare_stats(const void* a, const void* b) {
    double x = ((const KernelStat*)a)->seconds, y = ((const KernelStat*)b)->seconds;
    return (x < y) - (x > y);
}

static void print_kernels(const Bench* b, double step_seconds) {
    int n = b->shape->profiled;
    double sum = 0.0;
    qsort(kernel_stats, num_kernel_stats, sizeof(KernelStat), compare_stats);
    printf("kernels by time (mean per step over the same %d steps; %% of the mean step):\n", n);
    printf("   %-58s %9s %7s %6s %9s\n", "kernel", "ms", "% step", "calls", "GFLOP/s");
    for (int i = 0; i < num_kernel_stats; i++) {
        const KernelStat* s = &kernel_stats[i];
        char rate[32] = "-";
        if (s->flops > 0.0) snprintf(rate, sizeof(rate), "%.1f", s->flops / s->seconds / 1e9);
        printf("   %-58s %9.2f %6.1f%% %6ld %9s\n", s->name, 1e3 * s->seconds / n, 100.0 * s->seconds / n / step_seconds,
               s->calls / n, rate);
        sum += s->seconds / n;
    }
    printf("   %-58s %9.2f %6.1f%%\n", "all kernels", 1e3 * sum, 100.0 * sum / step_seconds);
    printf("   %-58s %9.2f %6.1f%%\n", "outside kernels (memsets, copies, glue)", 1e3 * (step_seconds - sum),
           100.0 * (step_seconds - sum) / step_seconds);
}

static void print_profiler(const Bench* b, const ProfilerCost* c) {
    printf("profiler (--profile, trace.h), %d pairs of steps, with and without recording, interleaved:\n",
           b->shape->profiled);
    printf("   recording off     a hook pair (begin, end) %.2f ns; %d pairs a step: %.3f us, %.5f%% of the step\n",
           c->hook_ns, c->spans, 1e-3 * c->hook_ns * c->spans, 100.0 * 1e-6 * c->hook_ns * c->spans / c->off_ms[0]);
    printf("   step time off     median %9.2f ms   min %9.2f ms   max %9.2f ms\n", c->off_ms[0], c->off_ms[1],
           c->off_ms[2]);
    printf("   step time on      median %9.2f ms   min %9.2f ms   max %9.2f ms   (%+.2f%% at the median; %d spans a "
           "step)\n", c->on_ms[0], c->on_ms[1], c->on_ms[2], 100.0 * (c->on_ms[0] / c->off_ms[0] - 1.0), c->spans);
}

// ----------------------------------------------------------------------------

int main(int argc, char** argv) {
    grid_start(&argc, &argv);
    grid_build(1, 1, 1, 1);
    if (argc > 1 && strcmp(argv[1], "machine") == 0) {
        bench_machine();
        grid_finish();
        return 0;
    }
    const Shape* s = shape_named(argc > 1 ? argv[1] : NULL);
    if (argc > 3) fma_peak = atof(argv[2]), sgemm_peak = atof(argv[3]);
    double rss_start = rss_mib();
    Bench* b = (Bench*)callocCheck(1, sizeof(Bench));
    bench_setup(b, s);
    double rss_built = rss_mib();
    double* times = (double*)callocCheck(s->timed, sizeof(double));
    time_steps(b, times);
    double* phases[NUM_PHASES];
    for (int p = 0; p < NUM_PHASES; p++) phases[p] = (double*)callocCheck(s->profiled, sizeof(double));
    profile_steps(b, phases);
    ProfilerCost profiler = measure_profiler(b);
    print_header(b);
    print_step(b, times);
    print_bench_memory(b, rss_start, rss_built);
    print_recompute_memory(b);
    print_same_shape(b);
    print_kernels(b, print_phases(b, phases));
    print_profiler(b, &profiler);
    fflush(stdout);
    for (int p = 0; p < NUM_PHASES; p++) free(phases[p]);
    free(times);
    bench_free(b);
    free(b);
    grid_finish();
    return 0;
}
