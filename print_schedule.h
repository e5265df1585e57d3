/*
print_schedule.h — --print-schedule: one step's pipeline schedule drawn as text, one line per
stage, from the very walk pipeline.h's schedules take (schedule_walk), without a model. Its own room
because it is one concern with one caller: the dry run (plan.h) calls draw_schedule and nothing
else; it sits on config.h (the layout's stages, chunks and groups), pipeline.h (the walk) and
context_parallel.h (the ring's steps and blocks).

Interface (what plan.h uses): draw_schedule.
*/
#pragma once

// ----------------------------------------------------------------------------
// --print-schedule: one step's pipeline schedule drawn as text, the way Narayanan et al. 2021
// draw it (Figs. 3 and 4): each stage's forwards and backwards in the order pipeline.h runs them
// (the very walk the trainer takes, without a model), each placed at the earliest cell its
// inputs allow: a forward after the previous virtual stage's forward of the micro-batch, a
// backward after the next virtual stage's backward (the last one's after its own forward), and
// each after the stage's work before it. Every forward and backward is one cell (the paper
// draws a backward twice as long; the bubble's share is the same either way); messages take no
// time. '.': a cell where the stage runs nothing, the bubble.

typedef struct {
    int count;
    Work* work;
    char* backward;   // 1: a backward, 0: a forward
} StageOrder;

static void add_to_stage_order(void* ctx, TraceEvent event, Work w) {
    StageOrder* o = (StageOrder*)ctx;
    if (event != TRACE_FORWARD && event != TRACE_BACKWARD) return;
    o->work[o->count] = w;
    o->backward[o->count++] = event == TRACE_BACKWARD;
}

// stage p's forwards and backwards in one step of M micro-batches over P stages of v chunks (G at a time)
static StageOrder stage_order(int p, int P, int v, int G, int M) {
    StageOrder o = {0, (Work*)mallocCheck(2 * (size_t)M * v * sizeof(Work)), (char*)mallocCheck(2 * (size_t)M * v)};
    Schedule s = schedule_walk(SCHEDULE_1F1B, p, P, v, G, -1, add_to_stage_order, &o);
    run_schedule(&s, M);
    return o;
}

// "F3" / "B3": micro-batch j counted from 1 (as the papers and scripts/trace_schedule.py count),
// with the chunk's letter where a stage holds several ("F3a")
static void work_label(char* out, size_t len, Work w, int backward, int v) {
    char chunk[2] = {(char)('a' + w.chunk), '\0'};
    snprintf(out, len, "%c%d%s", backward ? 'B' : 'F', w.micro + 1, v > 1 ? chunk : "");
}

// where place_schedule keeps the cell after the forward (backward 0) or backward (1) of
// micro-batch `micro` through virtual stage vs ends: -1 until it is placed
static int* finish_cell(int* finish, int V, int M, int backward, int vs, int micro) {
    return &finish[((size_t)backward * V + vs) * M + micro];
}

// The cell each stage's k-th work starts in (cells[p][k]), placing work as its inputs arrive;
// returns the step's length in cells.
static int place_schedule(StageOrder* orders, int P, int v, int M, int** cells) {
    int V = P * v, total = 0, placed = 0, length = 0;
    int* finish = (int*)mallocCheck(2 * (size_t)V * M * sizeof(int));
    int* next = (int*)callocCheck(P, sizeof(int));      // each stage's next work to place
    int* free_at = (int*)callocCheck(P, sizeof(int));   // the cell each stage is free from
    for (size_t i = 0; i < 2 * (size_t)V * M; i++) finish[i] = -1;
    for (int p = 0; p < P; p++) total += orders[p].count;
    while (placed < total) {
        int progress = 0;
        for (int p = 0; p < P; p++) {
            while (next[p] < orders[p].count) {
                int k = next[p], backward = orders[p].backward[k];
                Work w = orders[p].work[k];
                int vs = w.chunk * P + p, ready = 0;   // virtual stage c x P + p
                if (!backward && vs > 0) ready = *finish_cell(finish, V, M, 0, vs - 1, w.micro);   // its input
                if (backward)   // its output's gradient; the last virtual stage's own forward made its loss
                    ready = vs < V - 1 ? *finish_cell(finish, V, M, 1, vs + 1, w.micro) : *finish_cell(finish, V, M, 0, vs, w.micro);
                if (ready < 0) break;   // not placed yet: another stage first
                int start = ready > free_at[p] ? ready : free_at[p];
                cells[p][k] = start;
                free_at[p] = *finish_cell(finish, V, M, backward, vs, w.micro) = start + 1;
                if (start + 1 > length) length = start + 1;
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
    StageOrder* orders = (StageOrder*)mallocCheck(P * sizeof(StageOrder));
    int** cells = (int**)mallocCheck(P * sizeof(int*));
    char label[32];
    for (int p = 0; p < P; p++) {
        orders[p] = stage_order(p, P, v, microbatch_group_size(a), M);
        cells[p] = (int*)mallocCheck(orders[p].count * sizeof(int));
    }
    int length = place_schedule(orders, P, v, M, cells);
    Work widest = {M - 1, v - 1};
    work_label(label, sizeof label, widest, 1, v);
    width = (int)strlen(label) + 1;
    printf("the schedule of one step (--print-schedule): %s, PP %d, %d micro-batches; F3 = micro-batch 3's forward, B3 "
           "its backward%s, each one cell; '.': the bubble\n", v > 1 ? "interleaved 1F1B" : "1F1B", P, M,
           v > 1 ? ", through the stage's first model chunk (a), its second (b), ..." : "");
    for (int p = 0; p < P; p++) {
        printf("stage %d: ", p);
        for (int t = 0, k = 0; t < length; t++) {
            if (k < orders[p].count && cells[p][k] == t) work_label(label, sizeof label, orders[p].work[k], orders[p].backward[k], v), k++;
            else snprintf(label, sizeof label, ".");
            printf("%-*s", t + 1 < length ? width : 0, label);
        }
        printf("\n");
    }
    printf("bubble of each stage, drawn:");
    for (int p = 0; p < P; p++)
        printf(" %d of %d cells (%.1f%%)%s", length - orders[p].count, length, 100.0 * (length - orders[p].count) / length,
               p + 1 < P ? "," : "");
    printf("; %s = %d / %d = %.1f%%\n", v > 1 ? "(p - 1) / (v m + p - 1)" : "(p - 1) / (m + p - 1)", P - 1, v * M + P - 1,
           100.0 * (P - 1) / (v * M + P - 1));
    for (int p = 0; p < P; p++) {
        free(orders[p].work);
        free(orders[p].backward);
        free(cells[p]);
    }
    free(orders);
    free(cells);
    if (a->context_parallel_size > 1) draw_context_ring(a);
}
