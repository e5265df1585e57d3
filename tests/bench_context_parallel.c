/*
tests/bench_context_parallel.c — how much of context parallelism's ring transfer hides behind
the block attention, on the CPU build (MPI's nonblocking send and receive).

usage: mpirun -np C bench_context_parallel SEQ [--heads NH] [--head-size HS] [--groups G]
                                               [--batch B] [--reps N] [--pieces P] [--header]
  C ranks form one context-parallel group; each holds SEQ / C tokens of B sequences of SEQ
  tokens (NH query heads of HS, G key/value groups: NH by default, GPT-2's attention). Prints
  one line for the forward and one for the backward (--header: the table's heading first).

The ring (context_parallel.h, p2p) posts the next block's transfer (ring_transfer_start:
MPI_Irecv + MPI_Isend) before each step's block attention and waits for it after
(ring_transfer_finish: MPI_Waitall). Whether the data moves during the compute is MPI's
business: Open MPI's ob1 over shared memory (btl vader) sends a message above its eager limit
(4 KiB) by rendezvous, and a rendezvous advances only inside an MPI call. This program measures
it, with the trainer's own functions, each piece timed on every rank from a sleeping barrier to
its end and the slowest rank's time kept, the pieces interleaved in each repetition, one warm-up
repetition, then the median of N:
  transfer   the transfers alone: the ring's sends and receives of one layer, each start followed
             by its finish (forward: the C - 1 key/value blocks; backward: C - 1 blocks and the
             C partial sums of their gradients, in ring_backward's order);
  compute    the layer's attention without any transfer: everything context_attention_forward
             (_backward) does but ring_transfer_start / _finish, on the blocks as they lie;
  together   context_attention_forward (_backward) itself, as the trainer runs it;
  poked      `together` again, but with MPI_Testall on the transfers in flight after every
             block of a step (the 2 x 2 chunk pairs of attend_to_block / backward_through_block;
             --pieces P: after every P-th part of each block's query rows too): what a progress
             poke in context_parallel.h would give;
  idle       the transfers again, each start and finish 20 ms apart, asleep, outside MPI.
Beside them, the time poked spends in its pokes (`in pokes`), and the time inside
ring_transfer_finish (parallel.h's own wait accounting, seconds_waited) of together, poked and
idle, each the slowest rank's: idle's says directly whether MPI moves a message by itself (then
~0: it had arrived) or only once asked (then the copy's time, as in `transfer`); the others also
hold what a rank waits for a slower peer.
overlap = (transfer + compute - together) / transfer: 1 where the transfer is wholly hidden,
0 where it costs its whole time on top of the compute, below 0 where running them together costs
more than both apart. The share printed is clamped to [0, 1]; the raw value stands beside it.
`spread` is the median absolute deviation over the repetitions of each one's own hidden time
(transfer + compute - together, in ms): where it is as large as `transfer`, the overlap is noise;
it is the least of the noise, since the medians of separate pieces move more than one
repetition's pieces, which run back to back, move apart.
*/
#ifdef __CUDACC__
#error "tests/bench_context_parallel.c measures the CPU build's MPI ring"
#endif
#define TESTING
// the trainer's own main path (trainer_setup, trainer_run, ...) is not called here
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "../train.c"
#pragma GCC diagnostic pop

// ----------------------------------------------------------------------------
// the layer: this rank's inputs and the context-parallel scratch, laid out once

typedef struct {
    ContextAttention c;
    int pieces;                          // --pieces: the poked pieces split each block's queries so many ways
    floatX *qkv, *out, *dout, *dqkv;
    float* lse;
    char* scratch;
} Layer;

// the bench's layer: no ALiBi, no dropout
static const Alibi NO_ALIBI = {0, 0};
static Dropout no_dropout(void) {
    Dropout d;
    memset(&d, 0, sizeof(d));
    return d;
}

static void fill_random(floatX* x, size_t n, uint64_t* state) {
    for (size_t i = 0; i < n; i++) {
        *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = (float)((*state >> 40) & 0xffffff) / (float)0x1000000 - 0.5f;
    }
}

static void layer_init(Layer* L, int seq, int B, int NH, int G, int HS, int pieces) {
    ContextAttention* c = &L->c;
    memset(L, 0, sizeof(*L));
    c->slice = context_slice(grid.cp_rank, grid.cp_size, seq);
    c->comm = CP_COMM_P2P;
    c->group = &grid.cp;
    c->B = B, c->NH = NH, c->G = G, c->HS = HS;
    L->pieces = pieces;
    L->scratch = (char*)mallocCheck(context_attention_layout(c, NULL, sizeof(floatX)));
    context_attention_layout(c, L->scratch, sizeof(floatX));
    context_attention_init(c);
    size_t n = (size_t)B * c->slice.rows, qkv = n * (NH + 2 * G) * HS;
    L->qkv = (floatX*)mallocCheck(qkv * sizeof(floatX));
    L->dqkv = (floatX*)mallocCheck(qkv * sizeof(floatX));
    L->out = (floatX*)mallocCheck(query_rows_elems(c) * sizeof(floatX));
    L->dout = (floatX*)mallocCheck(query_rows_elems(c) * sizeof(floatX));
    L->lse = (float*)mallocCheck(lse_elems(c) * sizeof(float));
    uint64_t state = 1234 + (uint64_t)grid.cp_rank;
    fill_random(L->qkv, qkv, &state);
    fill_random(L->dout, query_rows_elems(c), &state);
    context_attention_forward(c, L->out, L->lse, L->qkv, NO_ALIBI, no_dropout());   // the backward's out and lse
}

static void layer_free(Layer* L) {
    context_attention_free(&L->c);
    free(L->scratch);
    free(L->qkv);
    free(L->dqkv);
    free(L->out);
    free(L->dout);
    free(L->lse);
}

// what the idle pieces sleep between a transfer's start and its finish: many times the transfer
// alone (0.2-3 ms here), so that whatever MPI moves by itself has time to arrive
#define IDLE_SECONDS 0.02
static void sleep_seconds(double s) {
    struct timespec t = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    if (s > 0) nanosleep(&t, NULL);
}

// ----------------------------------------------------------------------------
// the pieces, forward: the transfers alone, the compute alone, the two together

// the C - 1 transfers of the keys and values, each start followed by its finish, with `pause`
// seconds between the two spent outside MPI (asleep)
static void forward_transfers_paused(Layer* L, double pause) {
    ContextAttention* c = &L->c;
    for (int k = 0; k + 1 < c->slice.size; k++) {
        ring_transfer_start(&c->kv_transfer, c->group, c->kv[k % 2], c->kv[(k + 1) % 2], kv_block_elems(c), AS_FLOATX);
        sleep_seconds(pause);
        ring_transfer_finish(&c->kv_transfer);
    }
}
static void forward_transfers(Layer* L) { forward_transfers_paused(L, 0); }
static void forward_idle(Layer* L) { forward_transfers_paused(L, IDLE_SECONDS); }

// MPI's progress engine, asked once: whatever of the transfer it can move now, it moves (the
// seconds spent in it add up in poke_seconds)
static double poke_seconds;
static void ring_transfer_poke(RingTransfer* t) {
    int done;
    if (!t->active) return;
    double t0 = now_seconds();
    mpiCheck(MPI_Testall(2, t->req, &done, MPI_STATUSES_IGNORE));
    poke_seconds += now_seconds() - t0;
}

// attend_to_block, with a poke of the transfer in flight after each block (and each 1/pieces of
// one's query rows); no poke where `poke` is NULL
static void attend_poked(Layer* L, const floatX* kv, int src, RingTransfer* poke) {
    ContextAttention* c = &L->c;
    AttentionBlock blk;
    for (int qh = 0; qh < 2; qh++)
        for (int kh = 0; kh < 2; kh++) {
            if (!visible_block(c, qh, src, kh, &blk)) continue;
            for (int p = 0; p < L->pieces; p++) {
                AttentionBlock part = blk;
                int first = blk.q_count * p / L->pieces, last = blk.q_count * (p + 1) / L->pieces;
                part.q_first += first, part.q_pos += first, part.q_count = last - first;
                attention_block_forward(c->out_part, c->lse_part, L->qkv, kv, part, c->NH, c->G, c->HS, NO_ALIBI,
                                        no_dropout());
                attention_merge(c->out_acc, L->lse, c->out_part, c->lse_part, part, c->NH, c->HS);
                if (poke) ring_transfer_poke(poke);
            }
        }
}

// context_attention_forward's p2p branch; transfers 0: without its transfers (the blocks as
// they lie), poke 1: with a poke after each block
static void forward_ring(Layer* L, int transfers, int poke) {
    ContextAttention* c = &L->c;
    int C = c->slice.size, n = c->B * c->slice.rows;
    size_t kv = kv_block_elems(c);
    attention_accumulator_clear(c->out_acc, L->lse, c->B, c->slice.rows, c->NH, c->HS);
    kv_cache_append(c->kv[0], L->qkv, n, 0, c->NH, c->G, c->HS);
    for (int k = 0; k < C; k++) {
        floatX *held = c->kv[k % 2], *next = c->kv[(k + 1) % 2];
        if (transfers && k + 1 < C) ring_transfer_start(&c->kv_transfer, c->group, held, next, kv, AS_FLOATX);
        attend_poked(L, held, ring_source(c, k), poke ? &c->kv_transfer : NULL);
        if (transfers) ring_transfer_finish(&c->kv_transfer);
    }
    attention_output_rows(L->out, c->out_acc, query_rows_elems(c));
}

static void forward_compute(Layer* L) { forward_ring(L, 0, 0); }
static void forward_together(Layer* L) {
    context_attention_forward(&L->c, L->out, L->lse, L->qkv, NO_ALIBI, no_dropout());
}
static void forward_poked(Layer* L) { forward_ring(L, 1, 1); }

// ----------------------------------------------------------------------------
// the pieces, backward (ring_backward's order of transfers and sums)

static void backward_transfers_paused(Layer* L, double pause) {
    ContextAttention* c = &L->c;
    int C = c->slice.size;
    size_t kv = kv_block_elems(c);
    for (int k = 0; k < C; k++) {
        if (k + 1 < C) ring_transfer_start(&c->kv_transfer, c->group, c->kv[k % 2], c->kv[(k + 1) % 2], kv, AS_FLOATX);
        sleep_seconds(pause);
        ring_transfer_finish(&c->kv_transfer);
        ring_transfer_finish(&c->dkv_transfer);
        ring_transfer_start(&c->dkv_transfer, c->group, c->dkv[2], c->dkv[1], kv, AS_FLOAT);
    }
    sleep_seconds(pause);
    ring_transfer_finish(&c->dkv_transfer);
}
static void backward_transfers(Layer* L) { backward_transfers_paused(L, 0); }
static void backward_idle(Layer* L) { backward_transfers_paused(L, IDLE_SECONDS); }

// backward_through_block with pokes, as attend_poked
static void backward_poked_block(Layer* L, const floatX* kv, int src, int poke) {
    ContextAttention* c = &L->c;
    AttentionBlock blk;
    for (int qh = 0; qh < 2; qh++)
        for (int kh = 0; kh < 2; kh++) {
            if (!visible_block(c, qh, src, kh, &blk)) continue;
            for (int p = 0; p < L->pieces; p++) {
                AttentionBlock part = blk;
                int first = blk.q_count * p / L->pieces, last = blk.q_count * (p + 1) / L->pieces;
                part.q_first += first, part.q_pos += first, part.q_count = last - first;
                attention_block_backward(c->dq, c->dkv[0], L->dout, c->D, L->lse, L->qkv, kv, part, c->NH, c->G, c->HS,
                                         NO_ALIBI, no_dropout());
                if (poke) {
                    ring_transfer_poke(&c->kv_transfer);
                    ring_transfer_poke(&c->dkv_transfer);
                }
            }
        }
}

// context_attention_backward's p2p branch (ring_backward inside it); transfers 0: none, poke 1:
// with pokes after each block
static void backward_ring(Layer* L, int transfers, int poke) {
    ContextAttention* c = &L->c;
    int C = c->slice.size, n = c->B * c->slice.rows;
    size_t kv = kv_block_elems(c);
    attention_rows_dot(c->D, L->dout, L->out, c->B, c->slice.rows, c->NH, c->HS);
    dev_zero(c->dq, query_rows_elems(c) * sizeof(float));
    kv_cache_append(c->kv[0], L->qkv, n, 0, c->NH, c->G, c->HS);
    for (int k = 0; k < C; k++) {
        floatX *held = c->kv[k % 2], *next = c->kv[(k + 1) % 2];
        if (transfers && k + 1 < C) ring_transfer_start(&c->kv_transfer, c->group, held, next, kv, AS_FLOATX);
        dev_zero(c->dkv[0], kv * sizeof(float));
        backward_poked_block(L, held, ring_source(c, k), poke);
        if (transfers) {
            ring_transfer_finish(&c->kv_transfer);
            ring_transfer_finish(&c->dkv_transfer);
        }
        if (k == 0) dev_copy(c->dkv[2], c->dkv[0], kv * sizeof(float));
        else add_floats(c->dkv[2], c->dkv[1], c->dkv[0], kv);
        if (transfers) ring_transfer_start(&c->dkv_transfer, c->group, c->dkv[2], c->dkv[1], kv, AS_FLOAT);
    }
    if (transfers) ring_transfer_finish(&c->dkv_transfer);
    attention_block_gradients_into_qkv(L->dqkv, c->dq, c->dkv[1], n, c->NH, c->G, c->HS);
}

static void backward_compute(Layer* L) { backward_ring(L, 0, 0); }
static void backward_together(Layer* L) {
    context_attention_backward(&L->c, L->dqkv, L->dout, L->qkv, L->out, L->lse, NO_ALIBI, no_dropout());
}
static void backward_poked(Layer* L) { backward_ring(L, 1, 1); }

// ----------------------------------------------------------------------------
// timing

enum { TRANSFER, COMPUTE, TOGETHER, POKED, IDLE, PIECES };

// one piece on every rank from a sleeping barrier (oversubscribed ranks leave the cores to the
// ranks still working); the slowest rank's seconds, its seconds inside ring_transfer_finish, and
// inside the pokes
static void time_piece(Layer* L, void (*piece)(Layer*), double x[3]) {
    barrier_sleeping(L->c.group);
    double w0 = seconds_waited(), p0 = poke_seconds, t0 = now_seconds();
    piece(L);
    x[0] = now_seconds() - t0, x[1] = seconds_waited() - w0, x[2] = poke_seconds - p0;
    all_reduce_host(L->c.group, x, 3, REDUCE_MAX);
}

// the median of n values, x left as it is (cluster.h's median_of sorts in place)
static double median(const double* x, int n) {
    double* s = (double*)mallocCheck(n * sizeof(double));
    memcpy(s, x, n * sizeof(double));
    double m = median_of(s, n);
    free(s);
    return m;
}

static double median_abs_deviation(const double* x, int n) {
    double m = median(x, n), *d = (double*)mallocCheck(n * sizeof(double));
    for (int i = 0; i < n; i++) d[i] = fabs(x[i] - m);
    double mad = median(d, n);
    free(d);
    return mad;
}

static double share(double overlap) { return overlap < 0 ? 0 : overlap > 1 ? 1 : overlap; }

#define MAX_REPS 64

// The repetitions of one pass (forward or backward), the pieces interleaved in each: one line on
// rank 0: the medians, the overlaps, the spread, the time in the pokes, and in ring_transfer_finish
// that of together, of poked and of the idle piece.
static void bench_pass(Layer* L, const char* pass, void (*const pieces[PIECES])(Layer*), int seq, int reps) {
    double ms[PIECES][MAX_REPS], wait_ms[PIECES][MAX_REPS], poke_ms[MAX_REPS], hidden[MAX_REPS], x[3];
    for (int r = -1; r < reps; r++)   // r = -1: the warm-up
        for (int p = 0; p < PIECES; p++) {
            time_piece(L, pieces[p], x);
            if (r < 0) continue;
            ms[p][r] = 1e3 * x[0];
            wait_ms[p][r] = 1e3 * x[1];
            if (p == POKED) poke_ms[r] = 1e3 * x[2];
        }
    for (int r = 0; r < reps; r++) hidden[r] = ms[TRANSFER][r] + ms[COMPUTE][r] - ms[TOGETHER][r];
    double m[PIECES];
    for (int p = 0; p < PIECES; p++) m[p] = median(ms[p], reps);
    double overlap = (m[TRANSFER] + m[COMPUTE] - m[TOGETHER]) / m[TRANSFER];
    double poked = (m[TRANSFER] + m[COMPUTE] - m[POKED]) / m[TRANSFER];
    if (grid.world_rank == 0)
        printf("%5d %6d %-8s %5.1f %8.2f %8.1f %8.1f %6.0f%% %+7.2f %7.2f %8.1f %6.0f%% %+7.2f %7.2f %7.2f %7.2f"
               " %7.2f\n", grid.cp_size, seq, pass, kv_block_elems(&L->c) * sizeof(floatX) / 1048576.0, m[TRANSFER],
               m[COMPUTE], m[TOGETHER], 100 * share(overlap), overlap, median_abs_deviation(hidden, reps), m[POKED],
               100 * share(poked), poked, median(poke_ms, reps), median(wait_ms[TOGETHER], reps),
               median(wait_ms[POKED], reps), median(wait_ms[IDLE], reps));
    fflush(stdout);
}

// The poked passes are the trainer's own, pokes aside: with whole blocks (--pieces 1) they must
// give its outputs bit for bit (a bench that measured other work would say nothing of the ring)
static int poked_differs(Layer* L) {
    const ContextAttention* c = &L->c;
    size_t n_out = query_rows_elems(c), n_dqkv = (size_t)c->B * c->slice.rows * (c->NH + 2 * c->G) * c->HS;
    floatX* out = (floatX*)mallocCheck(n_out * sizeof(floatX));
    floatX* dqkv = (floatX*)mallocCheck(n_dqkv * sizeof(floatX));
    forward_together(L);
    memcpy(out, L->out, n_out * sizeof(floatX));
    backward_together(L);
    memcpy(dqkv, L->dqkv, n_dqkv * sizeof(floatX));
    forward_poked(L);
    backward_poked(L);
    int differs = memcmp(out, L->out, n_out * sizeof(floatX)) || memcmp(dqkv, L->dqkv, n_dqkv * sizeof(floatX));
    free(out);
    free(dqkv);
    return differs;
}

static void print_header(void) {
    const char* f = "%5s %6s %-8s %5s %8s %8s %8s %7s %7s %7s %8s %7s %7s %7s %7s %7s %7s\n";
    printf(f, "", "", "", "block", "transfer", "compute", "together", "overlap", "", "spread", "poked", "overlap", "",
           "in", "wait", "wait", "idle");
    printf(f, "ranks", "seq", "pass", "MB", "ms", "ms", "ms", "share", "raw", "ms", "ms", "share", "raw", "pokes",
           "ms", "poked", "wait");
}

int main(int argc, char** argv) {
    grid_start(&argc, &argv);
    if (argc < 2) {
        fprintf(stderr, "usage: mpirun -np C %s SEQ [--heads NH] [--head-size HS] [--groups G] [--batch B] [--reps N] "
                        "[--pieces P] [--header]\n", argv[0]);
        return 2;
    }
    int seq = atoi(argv[1]), NH = 8, HS = 64, G = 0, B = 1, reps = 5, pieces = 1, header = 0;
    for (int i = 2; i < argc; i++) {
        int* v = !strcmp(argv[i], "--heads") ? &NH : !strcmp(argv[i], "--head-size") ? &HS
               : !strcmp(argv[i], "--groups") ? &G : !strcmp(argv[i], "--batch") ? &B
               : !strcmp(argv[i], "--reps") ? &reps : !strcmp(argv[i], "--pieces") ? &pieces : NULL;
        if (!strcmp(argv[i], "--header")) header = 1;
        else if (v && i + 1 < argc) *v = atoi(argv[++i]);
        else fail("unknown argument '%s'", argv[i]);
    }
    if (G == 0) G = NH;
    if (reps < 1 || reps > MAX_REPS) fail("--reps %d: 1 to %d", reps, MAX_REPS);
    int C = grid.world_size;
    if (C < 2 || seq % (2 * C) || NH % G || pieces < 1)
        fail("SEQ %d, C %d, NH %d, G %d, P %d: wanted C >= 2, SEQ a multiple of 2C, G dividing NH, P >= 1", seq, C, NH,
             G, pieces);
    grid_build(1, C, 1, 1);
    Layer L;
    layer_init(&L, seq, B, NH, G, HS, pieces);
    if (pieces == 1 && poked_differs(&L)) fail("the poked ring's outputs differ from the trainer's");
    if (header && grid.world_rank == 0) print_header();
    void (*const forward[PIECES])(Layer*) = {forward_transfers, forward_compute, forward_together, forward_poked,
                                             forward_idle};
    void (*const backward[PIECES])(Layer*) = {backward_transfers, backward_compute, backward_together, backward_poked,
                                              backward_idle};
    bench_pass(&L, "forward", forward, seq, reps);
    bench_pass(&L, "backward", backward, seq, reps);
    layer_free(&L);
    grid_finish();
    return 0;
}
