/*
print_schedule.h — --print-schedule: one step's pipeline schedule drawn as text, one line per
stage, from the very walk pipeline.h's schedules take (schedule_walk), without a model. Its own room
because it is one concern with one caller: the dry run (plan.h) calls draw_schedule and nothing
else; it sits on config.h (the layout's stages, chunks and groups), pipeline.h (the walk) and
context_parallel.h (the ring's steps and blocks).

Interface (what plan.h uses): draw_schedule, schedule_bubble.
*/
#pragma once

// ----------------------------------------------------------------------------
// --print-schedule: one step's pipeline schedule drawn as text, the way Narayanan et al. 2021
// draw it (Figs. 3 and 4): each stage's forwards and backwards in the order pipeline.h runs them
// (the very walk the trainer takes, without a model), each placed at the earliest cell its
// inputs allow: a forward after the previous virtual stage's forward of the micro-batch, a
// backward after the next virtual stage's backward (the last one's after its own forward), a W
// (ZB-H1) after its own backward, and each after the stage's work before it. Every forward,
// backward and W is one cell (the paper draws a backward twice as long; for 1F1B the bubble's
// share is the same either way); messages take no time. '.': a cell where the stage runs
// nothing, the bubble. The planner places the same walk with each work's estimated time
// (schedule_bubble).

enum { WORK_F, WORK_B, WORK_W };   // a StageOrder's kinds of work, in the order of "FBW"

typedef struct {
    int count;
    Work* work;
    char* kind;   // WORK_F, WORK_B or WORK_W
} StageOrder;

static void add_to_stage_order(void* ctx, TraceEvent event, Work w) {
    StageOrder* o = (StageOrder*)ctx;
    if (event != TRACE_FORWARD && event != TRACE_BACKWARD && event != TRACE_WEIGHT) return;
    o->work[o->count] = w;
    o->kind[o->count++] = event == TRACE_FORWARD ? WORK_F : event == TRACE_BACKWARD ? WORK_B : WORK_W;
}

// stage p's work in one step of schedule `kind`, M micro-batches over P stages of v chunks (G at a time)
static StageOrder stage_order(PipelineSchedule kind, int p, int P, int v, int G, int M) {
    StageOrder o = {0, (Work*)mallocCheck(3 * (size_t)M * v * sizeof(Work)), (char*)mallocCheck(3 * (size_t)M * v)};
    Schedule s = schedule_walk(kind, p, P, v, G, -1, add_to_stage_order, &o);
    run_schedule(&s, M);
    return o;
}

// "F3" / "B3" / "W3": micro-batch j counted from 1 (as the papers and scripts/trace_schedule.py
// count), with the chunk's letter where a stage holds several ("F3a")
static void work_label(char* out, size_t len, Work w, int kind, int v) {
    char chunk[2] = {(char)('a' + w.chunk), '\0'};
    snprintf(out, len, "%c%d%s", "FBW"[kind], w.micro + 1, v > 1 ? chunk : "");
}

// where place_schedule keeps the time the work of `kind` of micro-batch `micro` through virtual
// stage vs ends: -1 until it is placed
static double* finish_time(double* finish, int V, int M, int kind, int vs, int micro) {
    return &finish[((size_t)kind * V + vs) * M + micro];
}

// The time each stage's k-th work starts (starts[p][k]), each of kind k taking cost[k], placing
// work as its inputs arrive; returns the step's length.
static double place_schedule(StageOrder* orders, int P, int v, int M, const double* cost, double** starts) {
    int V = P * v, total = 0, placed = 0;
    double length = 0.0;
    double* finish = (double*)mallocCheck(3 * (size_t)V * M * sizeof(double));
    int* next = (int*)callocCheck(P, sizeof(int));            // each stage's next work to place
    double* free_at = (double*)callocCheck(P, sizeof(double));   // the time each stage is free from
    for (size_t i = 0; i < 3 * (size_t)V * M; i++) finish[i] = -1.0;
    for (int p = 0; p < P; p++) total += orders[p].count;
    while (placed < total) {
        int progress = 0;
        for (int p = 0; p < P; p++) {
            while (next[p] < orders[p].count) {
                int k = next[p], kind = orders[p].kind[k];
                Work w = orders[p].work[k];
                int vs = w.chunk * P + p;   // virtual stage c x P + p
                double ready = 0.0;
                if (kind == WORK_F && vs > 0) ready = *finish_time(finish, V, M, WORK_F, vs - 1, w.micro);   // its input
                if (kind == WORK_B)   // its output's gradient; the last virtual stage's own forward made its loss
                    ready = vs < V - 1 ? *finish_time(finish, V, M, WORK_B, vs + 1, w.micro)
                                       : *finish_time(finish, V, M, WORK_F, vs, w.micro);
                if (kind == WORK_W) ready = *finish_time(finish, V, M, WORK_B, vs, w.micro);   // (placed: the stage's order)
                if (ready < 0.0) break;   // not placed yet: another stage first
                double start = ready > free_at[p] ? ready : free_at[p];
                starts[p][k] = start;
                free_at[p] = *finish_time(finish, V, M, kind, vs, w.micro) = start + cost[kind];
                if (free_at[p] > length) length = free_at[p];
                next[p]++, placed++, progress = 1;
            }
        }
        if (!progress) fail("--print-schedule: no stage can go on (stage 0 at its work %d of %d): the schedule deadlocks",
                            next[0], orders[0].count);
    }
    free(finish);
    free(next);
    free(free_at);
    return length;
}

// The bubble of schedule `kind` (plain: one chunk a stage) over P stages and M micro-batches, its
// walk placed with a forward taking f, a backward b and a W w (ZB-H1's; in the other schedules the
// backward takes b + w): the most any stage idles, a share of the step's length. 1F1B and GPipe:
// (P - 1) / (M + P - 1) whatever the times; ZB-H1: (P - 1)(f + b - w) / (M (f + b + w) + (P - 1)(f
// + b - w)) where w <= f (Qi et al. 2023, §3.1), which tests/test_dry_run.sh holds it to.
static double schedule_bubble(PipelineSchedule kind, int P, int M, double f, double b, double w) {
    StageOrder* orders = (StageOrder*)mallocCheck(P * sizeof(StageOrder));
    double** starts = (double**)mallocCheck(P * sizeof(double*));
    double cost[3] = {f, kind == SCHEDULE_ZB_H1 ? b : b + w, w}, busy_least = -1.0;
    for (int p = 0; p < P; p++) {
        orders[p] = stage_order(kind, p, P, 1, 0, M);
        starts[p] = (double*)mallocCheck(orders[p].count * sizeof(double));
    }
    double length = place_schedule(orders, P, 1, M, cost, starts);
    for (int p = 0; p < P; p++) {
        double busy = 0.0;
        for (int k = 0; k < orders[p].count; k++) busy += cost[(int)orders[p].kind[k]];
        if (busy_least < 0.0 || busy < busy_least) busy_least = busy;
        free(orders[p].work);
        free(orders[p].kind);
        free(starts[p]);
    }
    free(orders);
    free(starts);
    return length > 0.0 ? 1.0 - busy_least / length : 0.0;
}

// Context parallelism's attention in each layer, from context_parallel.h's own rules (ring_source_of,
// block_kind): at each ring step, the block every rank holds, and what each of its query chunks
// does with each of the block's key chunks (D: the causal diagonal, W: attended whole, '.':
// skipped, every key after every query); then the blocks each rank attends, equal on every rank
// (Megatron-LM's load balancing). all_gather attends to the same blocks, gathered at once.
static void draw_context_ring(const Config* a) {
    int C = a->context_parallel_size, p2p = a->cp_comm_type == CP_COMM_P2P;
    ContextSlice s = context_slice(0, C, a->model.seq_length);
    const char mark[] = {'.', 'D', 'W'};
    printf("context parallelism (--print-schedule): CP %d, each sequence in %d chunks of %d tokens, rank r holding chunks r "
           "and %d - r; each layer's attention %s: at step k rank r holds rank r - k's block; per query chunk of the rank, "
           "its key chunks in the block: D the causal diagonal, W whole, '.' skipped\n", C, 2 * C, s.chunk_rows, 2 * C - 1,
           p2p ? "round the ring (p2p), the next block in flight during each step" : "over all blocks, gathered at once "
           "(all_gather), drawn in the ring's order");
    for (int r = 0; r < C; r++) {
        int counts[3] = {0, 0, 0};
        printf("rank %d (chunks %d, %d):", r, slice_chunk(&s, r, 0), slice_chunk(&s, r, 1));
        for (int k = 0; k < C; k++) {
            int src = ring_source_of(&s, r, k);
            printf("  step %d, rank %d's (%d, %d): ", k, src, slice_chunk(&s, src, 0), slice_chunk(&s, src, 1));
            for (int qh = 0; qh < 2; qh++) {
                for (int kh = 0; kh < 2; kh++) {
                    BlockKind kind = block_kind(&s, r, qh, src, kh);
                    counts[kind]++;
                    putchar(mark[kind]);
                }
                if (qh == 0) putchar(' ');
            }
        }
        printf("  | %d diagonal, %d whole, %d skipped\n", counts[BLOCK_DIAGONAL], counts[BLOCK_WHOLE], counts[BLOCK_SKIPPED]);
    }
}

static void draw_schedule(const Config* a, int M) {
    int P = a->pipeline_model_parallel_size, v = virtual_chunks(a), width = 0;
    PipelineSchedule kind = (PipelineSchedule)a->pipeline_schedule;
    StageOrder* orders = (StageOrder*)mallocCheck(P * sizeof(StageOrder));
    double** starts = (double**)mallocCheck(P * sizeof(double*));
    const double cell[3] = {1.0, 1.0, 1.0};
    const char* names[] = {"1F1B", "GPipe", "ZB-H1"};
    char label[32];
    for (int p = 0; p < P; p++) {
        orders[p] = stage_order(kind, p, P, v, microbatch_group_size(a), M);
        starts[p] = (double*)mallocCheck(orders[p].count * sizeof(double));
    }
    int length = (int)place_schedule(orders, P, v, M, cell, starts);
    Work widest = {M - 1, v - 1};
    work_label(label, sizeof label, widest, WORK_B, v);
    width = (int)strlen(label) + 1;
    printf("the schedule of one step (--print-schedule): %s%s, PP %d, %d micro-batches; F3 = micro-batch 3's forward, B3 "
           "its backward%s%s, each one cell; '.': the bubble\n", v > 1 ? "interleaved " : "", names[kind], P, M,
           kind == SCHEDULE_ZB_H1 ? " (its input gradients), W3 its weights' gradients" : "",
           v > 1 ? ", through the stage's first model chunk (a), its second (b), ..." : "");
    for (int p = 0; p < P; p++) {
        printf("stage %d: ", p);
        for (int t = 0, k = 0; t < length; t++) {
            if (k < orders[p].count && (int)starts[p][k] == t) work_label(label, sizeof label, orders[p].work[k], orders[p].kind[k], v), k++;
            else snprintf(label, sizeof label, ".");
            printf("%-*s", t + 1 < length ? width : 0, label);
        }
        printf("\n");
    }
    printf("bubble of each stage, drawn:");
    for (int p = 0; p < P; p++)
        printf(" %d of %d cells (%.1f%%)%s", length - orders[p].count, length, 100.0 * (length - orders[p].count) / length,
               p + 1 < P ? "," : "");
    if (kind == SCHEDULE_ZB_H1)   // F = B = W: (p - 1)(F + B - W) of (m (F + B + W) + (p - 1)(F + B - W))
        printf("; (p - 1) / (3 m + p - 1) = %d / %d = %.1f%% (1F1B's, its backward two cells: 3 (p - 1) / (3 m + 3 (p - 1)) "
               "= %.1f%%)\n", P - 1, 3 * M + P - 1, 100.0 * (P - 1) / (3 * M + P - 1), 100.0 * (P - 1) / (M + P - 1));
    else
        printf("; %s = %d / %d = %.1f%%\n", v > 1 ? "(p - 1) / (v m + p - 1)" : "(p - 1) / (m + p - 1)", P - 1, v * M + P - 1,
               100.0 * (P - 1) / (v * M + P - 1));
    for (int p = 0; p < P; p++) {
        free(orders[p].work);
        free(orders[p].kind);
        free(starts[p]);
    }
    free(orders);
    free(starts);
    if (a->context_parallel_size > 1) draw_context_ring(a);
}
