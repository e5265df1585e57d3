/*
tests/test_parallel.c — one parallel layout's run, recorded so that tests/test_parallel.sh can
hold it against the single-process run.

  mpirun -np N test_parallel OUT [trainer flags]   trains with the trainer's own functions and
      writes OUT.steps (per step: loss, grad norm, global batch, in full precision),
      OUT.ckpt/ (the final checkpoint: its first section is the weights in the canonical
      layout, whatever the grid) and OUT.info (optimizer bytes
      per rank, most micro-batches in flight, bytes sent per step in each group); prints PASS /
      FAIL lines for what only the live grid can check: replicated tensors identical on every
      tensor rank, the two copies of the tied embedding identical, at most PP micro-batches in
      flight and min(PP - p, M) slots on stage p (plain 1F1B); and OUT.order, the last step's
      forwards and backwards on each stage in the order they ran ("stage 0: F0a F1a ... B7b",
      a, b, ... the model chunks).
  test_parallel --fail-rank R OUT [flags]          the same, but world rank R fails after step 2
      (the whole job must end, naming the rank, its host and grid coordinates)
  test_parallel --compare REF RUN NAME              PASS / FAIL: RUN's losses and grad norms
      within 1e-5 relative of REF's at every step, its weights within 1e-5 (per tensor,
      max |difference| / max |reference|).
  test_parallel --moe-routing < CASES               each case, one MoE layer's routing of given router
      logits through moe.h's own dispatch (the expert capacity's drops included), printed for
      tests/moe_capacity.py to hold against Megatron-Core's rule.
*/
#define TESTING
#include "../train.c"
#include "test.h"

// ----------------------------------------------------------------------------
// checks on the live grid

// every tensor replicated over tensor ranks holds the same bits on every tensor rank
static int replicated_tensors_differ(const GPT* m) {
    int differ = 0;
    for (int i = 0; i < m->num_tensors; i++) {
        const TensorDesc* t = &m->tensors[i];
        if (t->split_axis >= 0 || grid.tp_size == 1) continue;
        if (m->zero_stage >= 3 && t->layer >= 0 && t->layer < m->cfg.num_layers) continue;   // (ZeRO-3: a layer's is sharded)
        float* mine = (float*)mallocCheck(t->numel * sizeof(float));
        float* first = (float*)mallocCheck(t->numel * sizeof(float));
        dev_floatX_to_floats(mine, param_of(m, i), t->numel);
        memcpy(first, mine, t->numel * sizeof(float));
        mpiCheck(MPI_Bcast(first, (int)t->numel, MPI_FLOAT, 0, grid.tp.mpi));
        differ += memcmp(mine, first, t->numel * sizeof(float)) != 0;
        free(mine);
        free(first);
    }
    return differ;
}

// the last stage's copy of the word embedding equals the first stage's, bit for bit
static int tied_copies_differ(const GPT* m) {
    if (grid.embedding.size <= 1 || m->cfg.untie_embeddings_and_output_weights) return 0;   // no tied copies
    const TensorDesc* t = &m->tensors[m->wte];
    float* mine = (float*)mallocCheck(t->numel * sizeof(float));
    float* first = (float*)mallocCheck(t->numel * sizeof(float));
    dev_floatX_to_floats(mine, param_of(m, m->wte), t->numel);
    memcpy(first, mine, t->numel * sizeof(float));
    mpiCheck(MPI_Bcast(first, (int)t->numel, MPI_FLOAT, 0, grid.embedding.mpi));
    int differ = memcmp(mine, first, t->numel * sizeof(float)) != 0;
    free(mine);
    free(first);
    return differ;
}

static int sum_over_world(int x) {
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    return x;
}

// --order: each step's forwards and backwards on this rank, "F3a" for micro-batch 3's forward
// through model chunk 0 (b, c, ... the next chunks), as docs/parallelism.md draws them
static char order_now[16384], order_last[16384];
static void record_order(void* ctx, TraceEvent event, Work w) {
    (void)ctx;
    size_t used = strlen(order_now);
    if (event == TRACE_FORWARD || event == TRACE_BACKWARD)
        snprintf(order_now + used, sizeof(order_now) - used, "%s%c%d%c", used ? " " : "", event == TRACE_FORWARD ? 'F' : 'B',
                 w.micro, 'a' + w.chunk);
}

// What a plain schedule (--pipeline-schedule) holds: stage p's slots, and stage 0's peak in flight,
// in a step of M micro-batches over P stages. 1F1B: min(P - p, M) and min(P, M); GPipe: all M;
// ZB-H1: min(P, M) on every stage (P - p before their B, p waiting for their W)
static int planned_slots(PipelineSchedule kind, int P, int p, int M) {
    int most = kind == SCHEDULE_GPIPE ? M : kind == SCHEDULE_ZB_H1 ? P : P - p;
    return most < M ? most : M;
}

typedef struct {
    FILE* steps;
    int most_in_flight;
    int wrong_peak_step, wrong_peak, wanted_peak;   // a step whose peak in flight is not min(P, micro-batches)
    double comm_last[NUM_COMM_GROUPS];
    int fail_rank;   // this world rank fails after step 2 (-1: none), to test fail()
} Recording;

static void record_step(const Trainer* t, const StepResult* r, void* ctx) {
    Recording* rec = (Recording*)ctx;
    if (rec->steps) fprintf(rec->steps, "%d %.17g %.17g %d\n", t->progress.iteration, r->loss, r->grad_norm, r->global_batch);
    if (r->max_in_flight > rec->most_in_flight) rec->most_in_flight = r->max_in_flight;
    int micro = r->global_batch / t->batch.micro_batch_times_dp, want = planned_slots(pipeline_schedule, grid.pp_size, 0, micro);
    int plain = t->model.num_chunks == 1;   // (interleaved: tests/test_model.c counts the slots)
    if (plain && grid.pp_rank == 0 && r->max_in_flight != want && !rec->wrong_peak_step) {   // stage 0 holds the most
        rec->wrong_peak_step = t->progress.iteration;
        rec->wrong_peak = r->max_in_flight;
        rec->wanted_peak = want;
    }
    memcpy(rec->comm_last, r->comm, sizeof(rec->comm_last));
    memcpy(order_last, order_now, sizeof(order_now));   // (an evaluation's forwards would come first)
    order_now[0] = '\0';
    if (rec->fail_rank == grid.world_rank && t->progress.iteration == 2) fail("injected failure after step 2 (test)");
}

static int record(const char* out, int fail_rank, int argc, char** argv) {
    Trainer* t = (Trainer*)callocCheck(1, sizeof(Trainer));
    schedule_trace = record_order;
    trainer_setup(t, argc, argv);
    char path[4096], ckpt[4096];
    snprintf(ckpt, sizeof(ckpt), "%s.ckpt", out);
    t->config.save = ckpt;   // trainer_run saves at the end
    snprintf(path, sizeof(path), "%s.steps", out);
    Recording rec = {grid.world_rank == 0 ? fopen(path, "w") : NULL, 0, 0, 0, 0, {0}, fail_rank};
    trainer_run(t, record_step, &rec);
    FILE* steps = rec.steps;
    int most_in_flight = rec.most_in_flight;
    double* comm_sum = rec.comm_last;
    if (steps) fclose(steps);

    int replicated = sum_over_world(replicated_tensors_differ(&t->model));
    int tied = sum_over_world(tied_copies_differ(&t->model));
    int worst = most_in_flight, plain = t->model.num_chunks == 1;
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    // the arena's slots: stage p of P needs min(P - p, M) for the largest step's M micro-batches (1F1B)
    int M = t->config.global_batch_size / t->batch.micro_batch_times_dp, P = grid.pp_size;
    int wrong_slots = sum_over_world(plain && t->model.num_slots != planned_slots(pipeline_schedule, P, grid.pp_rank, M));
    const char* names[] = {"1F1B", "GPipe", "ZB-H1"};
    const char* slots_are[] = {"min(PP - p, micro-batches)", "M (every micro-batch's)", "min(PP, micro-batches)"};
    char peak_name[160], slots_name[160];
    snprintf(peak_name, sizeof peak_name, "%s keeps at most %s micro-batches in flight on stage 0 at every step's peak",
             names[pipeline_schedule], pipeline_schedule == SCHEDULE_GPIPE ? "all the" : "min(PP, micro-batches)");
    snprintf(slots_name, sizeof slots_name, "each stage p's arena holds %s slots, what %s needs", slots_are[pipeline_schedule],
             names[pipeline_schedule]);
    if (grid.world_rank == 0) {   // rank 0 is stage 0: in a step of M micro-batches it holds min(P, M) at the peak
        check(replicated == 0, "replicated LayerNorm and bias tensors identical on every tensor rank", "%d differ", replicated);
        check(tied == 0, "the tied embedding's two copies are identical", "%d ranks differ", tied);
        if (plain) {
            check(worst <= planned_slots(pipeline_schedule, P, 0, M) && !rec.wrong_peak_step, peak_name,
                  "most in flight %d, PP %d; step %d: stage 0 held %d, want %d", worst, grid.pp_size, rec.wrong_peak_step,
                  rec.wrong_peak, rec.wanted_peak);
            check(wrong_slots == 0, slots_name, "%d rank(s) hold another count", wrong_slots);
        }
    }

    // the last step's order of forwards and backwards on each stage, "stage P: F0a F1a ..."
    size_t bytes;
    char* orders = (char*)gather_bytes_to_rank0(&grid.world, order_last, (int)sizeof(order_last), &bytes);
    snprintf(path, sizeof(path), "%s.order", out);
    if (grid.world_rank == 0) {
        FILE* f = fopen(path, "w");
        for (int r = 0; r < grid.world_size; r++)   // the ranks of tensor and data rank 0: one per stage
            if (r % (grid.tp_size * grid.dp_size) == 0) fprintf(f, "stage %d: %s\n", r / (grid.tp_size * grid.dp_size),
                                                               orders + (size_t)r * sizeof(order_last));
        fclose(f);
    }
    free(orders);

    // facts for the script: the Adam moments' bytes, micro-batches in flight, rank 0's bytes per group
    snprintf(path, sizeof(path), "%s.info", out);
    if (grid.world_rank == 0) {
        FILE* info = fopen(path, "w");
        fprintf(info, "optimizer_bytes %zu\nmax_in_flight %d\nparams_padded %zu\nhidden_bytes %zu\n",
                2 * (t->opt.regions[0].shard_size + t->opt.regions[1].shard_size) * sizeof(float), worst,
                t->model.num_params_padded,
                (size_t)t->model.B * t->model.T * t->config.model.hidden_size * sizeof(floatX));
        fprintf(info, "comm_tp %.0f\ncomm_dp %.0f\ncomm_pp %.0f\ncomm_embedding %.0f\ncomm_cp %.0f\n", comm_sum[GROUP_TP],
                comm_sum[GROUP_DP], comm_sum[GROUP_PP], comm_sum[GROUP_EMBEDDING], comm_sum[GROUP_CP]);
        fclose(info);
    }
    trainer_free(t);
    free(t);
    return 0;
}

// ----------------------------------------------------------------------------
// comparison against the single-process recording

static int read_steps(const char* prefix, double* loss, double* norm, int max) {
    char path[4096];
    snprintf(path, sizeof(path), "%s.steps", prefix);
    FILE* f = fopen(path, "r");
    if (!f) return -1;
    int n = 0, it, gb;
    while (n < max && fscanf(f, "%d %lf %lf %d", &it, &loss[n], &norm[n], &gb) == 4) n++;
    fclose(f);
    return n;
}

// the weight section of the run's final checkpoint: `n` floats at the start of tensors.bin
static float* read_weights(const char* prefix, size_t n) {
    char dir[4096], path[4400];
    snprintf(dir, sizeof(dir), "%s.ckpt", prefix);
    if (latest_checkpoint(dir, path, sizeof(path), NULL, 0)) fail("bad marker in %s", dir);
    strcat(path, "/tensors.bin");
    FILE* f = fopen(path, "rb");
    if (!f) return NULL;
    float* w = (float*)mallocCheck(n * sizeof(float) + 1);
    size_t got = fread(w, sizeof(float), n, f);
    fclose(f);
    if (got != n) {
        free(w);
        return NULL;
    }
    return w;
}

static double relative(double a, double b) { return fabs(a - b) / (fabs(b) > 1e-30 ? fabs(b) : 1e-30); }

// The key part of the QKV bias gets no gradient in exact arithmetic (adding b_k to every key
// adds q . b_k to all of a query's scores, which the softmax ignores), so it carries only
// rounding noise, which Adam's normalization turns into steps of ~lr x eps-scale: any change
// in summation order gives other noise (measured ~1e-6 absolute, 100% of itself, against
// ~1e-8 for the q and v parts). It is checked for staying at noise level, the rest for equality.
static int is_key_bias(const TensorDesc* t, size_t k, int head_size) {
    if (!strstr(t->name, "query_key_value.bias")) return 0;
    return (int)(k % (3 * head_size)) / head_size == 1;
}

// weights per tensor of the canonical layout (needs the config: rebuilt from the flags)
static void compare_weights(const char* ref, const char* run, const char* name, const GPTConfig* c) {
    CanonicalLayout layout = canonical_layout(c);
    size_t na = layout.section_bytes / sizeof(float);
    free_layout(&layout);
    float* a = read_weights(run, na);
    float* b = read_weights(ref, na);
    char label[256];
    snprintf(label, sizeof(label), "%s: final weights match one process within 1e-5", name);
    if (!a || !b) {
        check(0, label, "a checkpoint is missing or short (%zu floats expected)", na);
        free(a);
        free(b);
        return;
    }
    GPT whole = canonical_table(c);
    int head_size = c->hidden_size / c->num_attention_heads;
    size_t at = 0;
    double worst = 0.0, key_bias = 0.0, key_scale = 0.0;
    const char* worst_name = "";
    for (int i = 0; i < whole.num_tensors; i++) {
        size_t n = canonical_bytes(&whole.tensors[i]) / sizeof(float);
        double diff = 0.0, scale = 0.0;
        for (size_t k = 0; k < n && at + k < na; k++) {
            double x = a[at + k], y = b[at + k];
            if (is_key_bias(&whole.tensors[i], k, head_size)) {
                key_bias = fmax(key_bias, fmax(fabs(x), fabs(y)));
                continue;
            }
            diff = fmax(diff, fabs(x - y));
            scale = fmax(scale, fabs(y));
        }
        if (strstr(whole.tensors[i].name, "query_key_value.bias")) key_scale = fmax(key_scale, scale);
        double rel = scale > 0 ? diff / scale : diff;
        if (rel > worst) {
            worst = rel;
            worst_name = whole.tensors[i].name;
        }
        at += n;
    }
    snprintf(label, sizeof(label), "%s: final weights match one process within 1e-5 (worst %.2g)", name, worst);
    check(at == na && worst <= 1e-5, label, "worst tensor %s: max |diff| / max |ref| = %.3g (%zu of %zu floats)",
          worst_name, worst, at, na);
    snprintf(label, sizeof(label), "%s: the key bias (no gradient) stays at rounding-noise level", name);
    check(key_bias <= 1e-3 * key_scale, label, "max |key bias| %.3g vs max |query, value bias| %.3g", key_bias, key_scale);
    gpt_free(&whole);
    free(a);
    free(b);
}

static void compare(const char* ref, const char* run, const char* name, const GPTConfig* c) {
    double la[1000], na_[1000], lb[1000], nb_[1000];
    int n = read_steps(run, la, na_, 1000), m = read_steps(ref, lb, nb_, 1000);
    double worst_loss = 0.0, worst_norm = 0.0;
    for (int i = 0; i < n && i < m; i++) {
        worst_loss = fmax(worst_loss, relative(la[i], lb[i]));
        worst_norm = fmax(worst_norm, relative(na_[i], nb_[i]));
    }
    char label[256];
    snprintf(label, sizeof(label), "%s: loss at every step matches one process within 1e-5 (worst %.2g)", name, worst_loss);
    check(n == m && n >= 20 && worst_loss <= 1e-5, label, "%d vs %d steps, worst relative difference %.3g", n, m, worst_loss);
    snprintf(label, sizeof(label), "%s: grad norm at every step matches one process within 1e-5 (worst %.2g)", name, worst_norm);
    check(n == m && n >= 20 && worst_norm <= 1e-5, label, "%d vs %d steps, worst relative difference %.3g", n, m, worst_norm);
    compare_weights(ref, run, name, c);
}

// ----------------------------------------------------------------------------
// --moe-routing: a case is "N E k pre_softmax capacity_factor drop_policy" (the policy's index in
// --moe-token-drop-policy's choices), then the N x E logits; the cases one after another until the
// input ends. Prints for each "choice t j expert weight position" for each of the N k choices
// (position -1: dropped), then "offsets" and the E + 1 row offsets (the CPU build: the device's
// buffers are the host's). 0 at the input's end.
static int print_moe_routing(void) {
    int N, E, k, pre_softmax, policy;
    float factor;
    int read = scanf("%d %d %d %d %f %d", &N, &E, &k, &pre_softmax, &factor, &policy);
    if (read == EOF) return 0;
    if (read != 6 || N < 1 || E < 1 || k < 1 || k > E)
        fail("--moe-routing: expected 'N E k pre_softmax capacity_factor drop_policy' on stdin");
    float* logits = (float*)mallocCheck((size_t)N * E * sizeof(float));
    for (size_t i = 0; i < (size_t)N * E; i++)
        if (scanf("%f", &logits[i]) != 1) fail("--moe-routing: %d x %d logits expected, %zu read", N, E, i);
    MoERouting r;
    char* base = (char*)mallocCheck(moe_routing_layout(&r, NULL, N, E, k, pre_softmax));
    moe_routing_layout(&r, base, N, E, k, pre_softmax);
    r.capacity_factor = factor, r.drop_policy = policy;
    float *x = (float*)callocCheck(N, sizeof(float)), *xs = (float*)mallocCheck((size_t)N * k * sizeof(float));
    int* offsets = (int*)mallocCheck((size_t)(E + 1) * sizeof(int));
    moe_dispatch(&r, xs, x, logits, 1, offsets);   // rows of one channel: the routing is what is printed
    for (int c = 0; c < N * k; c++)
        printf("choice %d %d %d %.9g %d\n", c / k, c % k, r.topk[c], r.weight[c], r.position[c]);
    printf("offsets");
    for (int e = 0; e <= E; e++) printf(" %d", offsets[e]);
    printf("\n");
    free(logits), free(base), free(x), free(xs), free(offsets);
    return 1;
}

int main(int argc, char** argv) {
    grid_start(&argc, &argv);
    if (argc == 2 && strcmp(argv[1], "--moe-routing") == 0) {
        while (print_moe_routing()) {}
        grid_finish();
        return 0;
    }
    if (argc >= 5 && strcmp(argv[1], "--compare") == 0) {
        // the config, for the canonical table: the trainer's flags after the three names
        Config a;
        set_defaults(&a);
        char err[512];
        parse_flags(&a, argc - 4, argv + 4, err, sizeof(err));
        if (err[0]) fail("%s", err);
        GPTConfig c = a.model;
        if (!c.ffn_hidden_size) c.ffn_hidden_size = 4 * c.hidden_size;
        if (!c.max_position_embeddings) c.max_position_embeddings = c.seq_length;
        c.padded_vocab_size = c.vocab_size;
        compare(argv[2], argv[3], argv[4], &c);
    } else if (argc >= 4 && strcmp(argv[1], "--fail-rank") == 0) {
        record(argv[3], atoi(argv[2]), argc - 3, argv + 3);
    } else if (argc >= 2) {
        record(argv[1], -1, argc - 1, argv + 1);
    } else {
        check(0, "test_parallel", "usage: test_parallel OUT [flags] | --compare REF RUN NAME [flags]");
    }
    int status = grid.world_rank == 0 ? tests_summary() : (tests_failed ? 1 : 0);
    grid_finish();
    return status;
}
