/*
cluster.h — operating a cluster, on top of parallel.h: what names a sick rank.

  - the watchdog (--watchdog-timeout): a thread per rank that reads parallel.h's record of
    what its rank is doing and, when the rank has got nowhere for too long, names where every
    rank is and who is silent (heartbeats over its own MPI communicator: the main thread may be
    stuck inside MPI);
  - the slow-rank report (--slow-rank-threshold): each rank's compute time per step against
    its stage's median, and in a step bound by communication each host's link, probed, against
    the other hosts';
  - the cluster check (--check-cluster): every group's bus bandwidth and every rank's matmul
    throughput, measured through the same wrappers training uses, and the outliers named with
    their hosts and coordinates; train.c runs it before training (or alone, without
    --data-path).

Interface (what train.c uses): watchdog_start, watchdog_stop, slow_rank_report, ClusterCheck
(its sizes and matmul size), check_cluster, layout_name (the grid as the start-up lines name it).
*/
#pragma once

// ----------------------------------------------------------------------------
// The watchdog (--watchdog-timeout S): a thread per rank that, when its rank has got nowhere
// for S seconds, prints one line (rank, host, coordinates, seconds stuck, what it waits in)
// and ends the job. A hung collective blocks its whole group, so every stuck rank reports.
//
// One summary line then names the ranks the others wait for, and the ranks no one hears from.
// It is written from heartbeats: every WATCHDOG_BEAT seconds each rank's watchdog sends its
// state (what it waits in, for how long) to two writers, rank 0 and its deputy (the lowest rank
// on another host: a lost host takes rank 0 with it, not both). So a writer always holds what
// every rank did lately, and knows the ranks it has not heard from for WATCHDOG_SILENT
// seconds: dead, frozen, or cut off with their host. Once any rank has fired (the writer's own
// watchdog, or a heartbeat that says so), the writer lets WATCHDOG_GRACE pass (a heartbeat
// more from every rank alive) and writes the summary; then the job ends with exit status 3
// (NCCL's communicators aborted first on the GPU build, so that no rank stays blocked in a
// kernel). Rank 0 writes it, or its deputy when rank 0 is silent by then. A rank that fired
// and still runs WATCHDOG_ORPHAN seconds later heard of no summary (both writers are gone):
// it ends the job itself.

#define WATCHDOG_BEAT 0.5
#define WATCHDOG_SILENT 3.0   // six heartbeats missed
#define WATCHDOG_GRACE 1.0
#define WATCHDOG_ORPHAN 15.0
#define WATCHDOG_EXIT 3

typedef struct {   // one rank's state, as a heartbeat carries it (fixed size: one message)
    int rank, pid, iteration, micro_batch, waiting, peer, in_io;
    double stuck;
    char host[64], phase[32], op[40], group[24];
} WatchdogReport;

// every rank's host and process id, gathered once through parallel.h's wrapper (the first
// call is collective: every rank makes it at the same point), for the lines that name a rank
typedef struct {
    char host[64];
    int pid;
} RankName;

static struct {
    double timeout, io_timeout;   // seconds; io_timeout while a checkpoint is saved or loaded
    int stopped;                  // watchdog_stop: the thread ends
    pthread_t thread;
    MPI_Comm comm;                // a copy of the world for the heartbeats alone (MPI_COMM_NULL: none)
    const RankName* names;        // every rank's host and pid, gathered at the start, so that a
                                  // rank that sends nothing (frozen, dead, cut off) is named fully too
} watchdog;

// The heartbeats, on every rank: the one in flight to each writer (a writer that cannot be
// reached gets no more until it is delivered), and on a writer what arrived from each rank
static struct {
    int writer[2];                // rank 0 and its deputy (-1: none)
    MPI_Request sent[2];
    WatchdogReport out[2];
    MPI_Request receiving;        // a writer's: the next heartbeat, from any rank
    WatchdogReport in;
    WatchdogReport* latest;       // [world size]: each rank's last heartbeat (a writer's)
    double* heard_at;             // [world size]: when it arrived
    double fired_at;              // when this writer first knew that some rank had fired (0: not yet)
} beats;

static const RankName* rank_names(void) {
    static RankName* all = NULL;
    if (all) return all;
    RankName me = {"", (int)getpid()};
    snprintf(me.host, sizeof(me.host), "%.63s", grid.host);
    all = (RankName*)callocCheck(grid.world_size, sizeof(RankName));
    all_gather_host(&grid.world, &me, all, sizeof(me));
    return all;
}

// rank 0's deputy: the lowest rank on another host; rank 1 when every rank shares rank 0's
static int watchdog_deputy(void) {
    for (int r = 1; r < grid.world_size; r++)
        if (strcmp(watchdog.names[r].host, watchdog.names[0].host) != 0) return r;
    return grid.world_size > 1 ? 1 : -1;
}

// One beat's sleep, cut short by watchdog_stop (a job's end waited up to a beat for the thread:
// 0.35 s more for every run of 8 ranks); 1 once stopped
static pthread_cond_t watchdog_wake = PTHREAD_COND_INITIALIZER;
static int watchdog_sleep_beat(void) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    long long ns = until.tv_nsec + (long long)(WATCHDOG_BEAT * 1e9);
    until.tv_sec += (time_t)(ns / 1000000000);
    until.tv_nsec = (long)(ns % 1000000000);
    pthread_mutex_lock(&activity_lock);
    while (!watchdog.stopped && pthread_cond_timedwait(&watchdog_wake, &activity_lock, &until) == 0) {}
    int stopped = watchdog.stopped;
    pthread_mutex_unlock(&activity_lock);
    return stopped;
}

static WatchdogReport watchdog_snapshot(void) {
    WatchdogReport r;
    memset(&r, 0, sizeof(r));
    pthread_mutex_lock(&activity_lock);
    r.rank = grid.world_rank;
    r.pid = (int)getpid();
    r.iteration = activity.iteration;
    r.micro_batch = activity.micro_batch;
    r.waiting = activity.waiting;
    r.in_io = activity.in_io;
    r.peer = activity.peer;
    r.stuck = now_seconds() - activity.progress_at;
    snprintf(r.phase, sizeof(r.phase), "%s", activity.phase);
    snprintf(r.op, sizeof(r.op), "%s", activity.op);
    snprintf(r.group, sizeof(r.group), "%s", activity.group);
    pthread_mutex_unlock(&activity_lock);
    snprintf(r.host, sizeof(r.host), "%.63s", grid.host);
    return r;
}

// has this rank got nowhere for its timeout? (every rank runs with the same two)
static int report_fired(const WatchdogReport* r) {
    return r->stuck >= (r->in_io ? watchdog.io_timeout : watchdog.timeout);
}

// "iteration 3, micro-batch 2, forward: waiting in all-reduce (tensor-parallel group)"
static void describe_report(const WatchdogReport* r, char* out, size_t len) {
    char where[96], peer[48] = "";
    if (r->micro_batch >= 0) snprintf(where, sizeof(where), "iteration %d, micro-batch %d, %s", r->iteration, r->micro_batch, r->phase);
    else snprintf(where, sizeof(where), "iteration %d, %s", r->iteration, r->phase);
    if (r->peer >= 0) snprintf(peer, sizeof(peer), " with rank %d", r->peer);
    if (r->waiting) snprintf(out, len, "%s: waiting in %s%s (%s group)", where, r->op, peer, r->group);
    else if (r->op[0]) snprintf(out, len, "%s: in no collective (last: %s%s, %s group)", where, r->op, peer, r->group);
    else snprintf(out, len, "%s: in no collective", where);
}

// the grid as the start-up lines (and the dry run's) name it: "TP 2 x PP 1 x DP 2", with CP next
// to TP where there is context parallelism, as Megatron-LM orders the groups: "TP 2 x CP 2 x PP 1 x DP 2"
static const char* layout_name(char* out, size_t len, int tp, int cp, int pp, int dp) {
    char cp_part[24] = "";
    if (cp > 1) snprintf(cp_part, sizeof cp_part, "CP %d x ", cp);
    snprintf(out, len, "TP %d x %sPP %d x DP %d", tp, cp_part, pp, dp);
    return out;
}

// a rank's grid coordinates, from its number (Megatron's order, as grid_place)
static void coordinates_of(int rank, char* out, size_t len) {
    int TP = grid.tp_size, CP = grid.cp_size, DP = grid.dp_size;
    coordinates_name(out, len, rank % TP, (rank / TP) % CP, rank / (TP * CP * DP), (rank / (TP * CP)) % DP, rank);
}

static void watchdog_end(void) {
#ifdef __CUDACC__
    Group* groups[GRID_GROUPS];
    grid_groups(groups);
    for (int i = 0; i < GRID_GROUPS; i++)
        if (groups[i]->mpi != MPI_COMM_NULL) ncclCommAbort(groups[i]->nccl);
#endif
    fflush(stdout);
    fflush(stderr);
    _exit(WATCHDOG_EXIT);
}

// the line of a rank that has got nowhere for too long
static void watchdog_report(const WatchdogReport* me) {
    char what[200], coords[64];
    describe_report(me, what, sizeof(what));
    coordinates_of(me->rank, coords, sizeof(coords));
    fprintf(stderr, "error: [rank %d on %s pid %d %s] watchdog: no progress for %.0f s (%s %.0f): %s\n", me->rank,
            me->host, me->pid, coords, me->stuck, me->in_io ? "--watchdog-io-timeout" : "--watchdog-timeout",
            me->in_io ? watchdog.io_timeout : watchdog.timeout, what);
    fflush(stderr);
}

// ---- the heartbeats

static void beats_open(void) {
    int n = grid.world_size, use_mpi = watchdog.comm != MPI_COMM_NULL;
    beats.writer[0] = use_mpi ? 0 : -1;
    beats.writer[1] = use_mpi ? watchdog_deputy() : -1;
    beats.sent[0] = beats.sent[1] = beats.receiving = MPI_REQUEST_NULL;
    beats.latest = (WatchdogReport*)callocCheck(n, sizeof(WatchdogReport));
    beats.heard_at = (double*)callocCheck(n, sizeof(double));
    for (int r = 0; r < n; r++) beats.heard_at[r] = now_seconds();   // nobody is silent at the start
    if (grid.world_rank == beats.writer[0] || grid.world_rank == beats.writer[1])
        MPI_Irecv(&beats.in, (int)sizeof(beats.in), MPI_BYTE, MPI_ANY_SOURCE, 0, watchdog.comm, &beats.receiving);
}

// a writer notes its own state as if it had heard it
static void beats_note(const WatchdogReport* r, double now) {
    beats.latest[r->rank] = *r;
    beats.heard_at[r->rank] = now;
    if (report_fired(r) && !beats.fired_at) beats.fired_at = now;
}

// this rank's state to each writer but itself, unless the last one is still in flight
static void beats_send(const WatchdogReport* me) {
    for (int i = 0; i < 2; i++) {
        int done = 1;
        if (beats.writer[i] < 0 || beats.writer[i] == grid.world_rank) continue;
        if (beats.sent[i] != MPI_REQUEST_NULL) MPI_Test(&beats.sent[i], &done, MPI_STATUS_IGNORE);
        if (!done) continue;
        beats.out[i] = *me;
        MPI_Isend(&beats.out[i], (int)sizeof(*me), MPI_BYTE, beats.writer[i], 0, watchdog.comm, &beats.sent[i]);
    }
}

// a writer: every heartbeat that has arrived
static void beats_receive(double now) {
    for (int arrived = beats.receiving != MPI_REQUEST_NULL; arrived;) {
        MPI_Test(&beats.receiving, &arrived, MPI_STATUS_IGNORE);
        if (!arrived) break;
        if (beats.in.rank >= 0 && beats.in.rank < grid.world_size) beats_note(&beats.in, now);
        MPI_Irecv(&beats.in, (int)sizeof(beats.in), MPI_BYTE, MPI_ANY_SOURCE, 0, watchdog.comm, &beats.receiving);
    }
}

// the watchdog stops: no receive left posted, the sends left to finish on their own
static void beats_close(void) {
    if (beats.receiving != MPI_REQUEST_NULL) {
        MPI_Cancel(&beats.receiving);
        MPI_Wait(&beats.receiving, MPI_STATUS_IGNORE);
    }
    for (int i = 0; i < 2; i++)
        if (beats.sent[i] != MPI_REQUEST_NULL) MPI_Request_free(&beats.sent[i]);
}

static int silent(int rank, double now) { return now - beats.heard_at[rank] >= WATCHDOG_SILENT; }

// ---- the summary, by a writer

// appends ",r" (or "r") to a comma-separated list of ranks
static void list_rank(char* list, size_t len, int rank) {
    size_t used = strlen(list);
    snprintf(list + used, len - used, "%s%d", used ? "," : "", rank);
}

// appends "; rank r on HOST pid P TP(.)-PP(.)-DP(.)-Rank(r)" (without "; " first), from what
// was gathered at the start: all an operator needs to find the process
static void list_rank_fully(char* list, size_t len, int rank) {
    char coords[64];
    size_t used = strlen(list);
    coordinates_of(rank, coords, sizeof(coords));
    snprintf(list + used, len - used, "%srank %d on %s pid %d %s", used ? "; " : "", rank, watchdog.names[rank].host,
             watchdog.names[rank].pid, coords);
}

// appends ", HOST" for each host none of whose ranks is heard from (its link, or the host, is lost)
static void list_silent_hosts(char* list, size_t len, double now) {
    const RankName* names = watchdog.names;
    for (int r = 0; r < grid.world_size; r++) {
        int first = 1, all_silent = 1;
        for (int q = 0; q < grid.world_size; q++)
            if (strcmp(names[q].host, names[r].host) == 0) {
                first &= q >= r;
                all_silent &= silent(q, now);
            }
        size_t used = strlen(list);
        if (first && all_silent) snprintf(list + used, len - used, "%s%s", used ? ", " : "", names[r].host);
    }
}

// who waits in a collective, who waits in none (the ones the others wait for), who is silent
static void watchdog_summary(double now) {
    char waiting[512] = "", silent_ranks[2048] = "", culprits[2048] = "", hosts[512] = "", by[400] = "";
    for (int r = 0; r < grid.world_size; r++) {
        const WatchdogReport* x = &beats.latest[r];
        if (silent(r, now)) list_rank_fully(silent_ranks, sizeof(silent_ranks), r);
        else if (x->waiting) list_rank(waiting, sizeof(waiting), r);
        else {
            char what[200];
            describe_report(x, what, sizeof(what));
            list_rank_fully(culprits, sizeof(culprits), r);
            size_t used = strlen(culprits);
            snprintf(culprits + used, sizeof(culprits) - used, " (%s)", what);
        }
    }
    list_silent_hosts(hosts, sizeof(hosts), now);
    if (grid.world_rank != 0)
        snprintf(by, sizeof(by), " | written by rank %d on %s, rank 0's deputy (rank 0 is silent)", grid.world_rank, grid.host);
    fprintf(stderr, "error: watchdog summary: waiting in a collective: ranks %s | in none, so the others wait for them: %s "
            "| not heard from for %.0f s (dead, frozen or cut off): %s | hosts none of whose ranks is heard from: %s%s\n",
            waiting[0] ? waiting : "none", culprits[0] ? culprits : "none", WATCHDOG_SILENT,
            silent_ranks[0] ? silent_ranks : "none", hosts[0] ? hosts : "none", by);
}

// A writer's summary is due WATCHDOG_GRACE after it knew of a fired rank, and later where the
// timeout is shorter than WATCHDOG_SILENT: a rank cut off when the stall began is silent by then.
static int summary_due(double now) {
    double wait = WATCHDOG_GRACE + fmax(0.0, WATCHDOG_SILENT - fmin(watchdog.timeout, watchdog.io_timeout));
    return beats.fired_at && now - beats.fired_at >= wait;
}

static void* watchdog_main(void* unused) {
    (void)unused;
    int me_rank = grid.world_rank, decided = 0;
    int is_writer = me_rank == beats.writer[0] || me_rank == beats.writer[1];
    double fired_at = 0.0;
    for (;;) {
        if (watchdog_sleep_beat()) break;
        WatchdogReport me = watchdog_snapshot();
        double now = now_seconds();
        if (!fired_at && report_fired(&me)) {
            fired_at = now;
            watchdog_report(&me);
        }
        beats_send(&me);
        if (is_writer) {
            beats_note(&me, now);
            beats_receive(now);
        }
        if (is_writer && !decided && summary_due(now)) {   // rank 0 writes; its deputy only for a silent rank 0
            decided = 1;
            if (me_rank == 0 || silent(0, now)) {
                watchdog_summary(now);
                watchdog_end();
            }
        }
        if (fired_at && now - fired_at >= WATCHDOG_ORPHAN) watchdog_end();   // no writer left to end the job
    }
    beats_close();
    return NULL;
}

// The training and its evaluations are over: what follows (sampling on rank 0 while the
// others wait to finish) may take as long as it takes. The thread has left MPI when this returns.
static void watchdog_stop(void) {
    if (watchdog.timeout <= 0.0 || watchdog.stopped) return;
    pthread_mutex_lock(&activity_lock);
    watchdog.stopped = 1;
    pthread_cond_signal(&watchdog_wake);
    pthread_mutex_unlock(&activity_lock);
    pthread_join(watchdog.thread, NULL);
}

// after the grid is built, on every rank at once (the heartbeats' channel is made collectively)
static void watchdog_start(double timeout_seconds, double io_timeout_seconds) {
    if (timeout_seconds <= 0.0) return;
    watchdog.timeout = timeout_seconds;
    watchdog.io_timeout = io_timeout_seconds;
    watchdog.comm = MPI_COMM_NULL;
    if (grid.thread_level >= MPI_THREAD_MULTIPLE) mpiCheck(MPI_Comm_dup(MPI_COMM_WORLD, &watchdog.comm));
    watchdog.names = rank_names();   // (every rank starts the watchdog with the same timeout)
    beats_open();
    activity_phase("setup", -1, -1);
    stop_mpi_threads = watchdog_stop;   // (before MPI ends on any path: the thread calls MPI)
    if (pthread_create(&watchdog.thread, NULL, watchdog_main, NULL) != 0) fail("cannot start the watchdog thread");
}
// ----------------------------------------------------------------------------
// Slow ranks and slow links, every log interval (--slow-rank-threshold X; 0: off). Each rank's
// compute time per step (the step's wall time less the time it waited in blocking operations)
// and its waiting time are gathered on every rank (one small collective), and rank 0 names:
//   - a slow rank: the ranks of one pipeline stage do the same work, so each is held against
//     the median of its stage. Named when it computes above X times that median and what it
//     costs its peers (its compute above the median) is at least SLOW_RANK_SHARE of the step:
//     one millisecond more in a 500 ms step slows nothing (on a shared machine, it is noise).
//   - a slow link: when every rank waits longer than the median rank computes, the time is lost
//     between ranks, not in one rank's compute, and a collective's time cannot say where: each
//     member of a ring waits as long as its slowest link takes. So the ranks probe their links
//     (probe_links), and a host whose best exchange with another host takes above X times the
//     median of the other hosts' is named. A host whose link is slow has no fast exchange; its
//     neighbours each have one. With one host there is no link to probe.

#define SLOW_RANK_SHARE 0.1
#define LINK_PROBE_BYTES (128 * 1024)
#define LINK_PROBE_REPS 3

// the median of n values (sorted in place)
static int compare_doubles(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}
static double median_of(double* x, int n) {
    qsort(x, n, sizeof(double), compare_doubles);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

// The probe's pairs: the edges (e, e+1 mod n) of the ring of world ranks, in phases in which
// no rank is in two pairs: even e, odd e, and for an odd n the closing edge (n-1, 0) alone.
// Every rank meets both its neighbours, so the ring enters and leaves every host.
#define LINK_PROBE_PHASES 3
static int probe_edge(int phase, int e, int n) {   // is (e, e+1 mod n) one of phase's pairs?
    int closing_odd = e == n - 1 && n % 2;
    return phase == 2 ? closing_odd : e % 2 == phase && !closing_odd;
}
static int probe_partner(int phase, int r, int n) {   // r's partner in phase (-1: none)
    if (n < 2) return -1;
    if (probe_edge(phase, r, n)) return (r + 1) % n;
    if (probe_edge(phase, (r + n - 1) % n, n)) return (r + n - 1) % n;
    return -1;
}

// Each pair of ranks on two hosts exchanges LINK_PROBE_BYTES both ways, LINK_PROBE_REPS times,
// each time timed from one small exchange that puts the two in step; best[phase]: this rank's
// best time (the link is at least that slow), NAN where it had no partner on another host. The
// pairs of a phase run at once; a rank starts its next phase when its partner does.
static void probe_links(const RankName* names, double* best) {
    size_t n = LINK_PROBE_BYTES / sizeof(floatX);
    floatX* out = (floatX*)dev_malloc(n * sizeof(floatX));   // (as the cluster check's: only while probing)
    floatX* in = (floatX*)dev_malloc(n * sizeof(floatX));
    dev_zero(out, n * sizeof(floatX));
    pthread_mutex_lock(&activity_lock);
    Activity was = activity;
    pthread_mutex_unlock(&activity_lock);
    activity_phase("probing links", was.iteration, -1);   // (what the watchdog says if a link is lost now)
    for (int phase = 0; phase < LINK_PROBE_PHASES; phase++) {
        int peer = probe_partner(phase, grid.world_rank, grid.world_size);
        if (peer >= 0 && strcmp(names[peer].host, names[grid.world_rank].host) == 0) peer = -1;
        best[phase] = NAN;
        for (int rep = 0; rep < LINK_PROBE_REPS && peer >= 0; rep++) {
            exchange_with_rank(peer, out, in, 1);   // both in step (a barrier's skew would count)
            dev_synchronize();
            double t0 = now_seconds();
            exchange_with_rank(peer, out, in, n);
            dev_synchronize();
            double dt = now_seconds() - t0;
            best[phase] = isnan(best[phase]) ? dt : fmin(best[phase], dt);
        }
    }
    dev_free(out);
    dev_free(in);
    activity_phase(was.phase, was.iteration, was.micro_batch);
}

// "rank 2 TP(0)-PP(0)-DP(2)-Rank(2), rank 6 ..." for the ranks on host h's name (at most 4)
static void ranks_on_host(const RankName* names, const char* host, char* out, size_t len) {
    int listed = 0;
    out[0] = '\0';
    for (int r = 0; r < grid.world_size; r++) {
        if (strcmp(names[r].host, host) != 0) continue;
        char coords[64];
        size_t used = strlen(out);
        coordinates_of(r, coords, sizeof(coords));
        if (listed++ < 4) snprintf(out + used, len - used, "%srank %d %s", used ? ", " : "", r, coords);
        else if (listed == 5) snprintf(out + used, len - used, ", ...");
    }
}

// what each rank gathers about every rank's steps since the last report (seconds and bytes per step)
typedef enum { STEP_COMPUTE, STEP_WAIT, STEP_SENT, STEP_FIELDS, STEP_TOTAL = STEP_FIELDS } StepField;

// the median of field f (STEP_TOTAL: compute + wait) over ranks [first, first + n)
static double median_field(const double* all, int first, int n, StepField f) {
    double* x = (double*)mallocCheck(n * sizeof(double));
    for (int k = 0; k < n; k++) {
        const double* r = &all[STEP_FIELDS * (first + k)];
        x[k] = f == STEP_TOTAL ? r[STEP_COMPUTE] + r[STEP_WAIT] : r[f];
    }
    double m = median_of(x, n);
    free(x);
    return m;
}

// rank 0: each rank's compute against its stage's median
static void report_slow_ranks(const RankName* names, const double* all, float threshold) {
    int per_stage = grid.tp_size * grid.cp_size * grid.dp_size;
    double step = median_field(all, 0, grid.world_size, STEP_TOTAL), ms = 1000.0;
    for (int r = 0; r < grid.world_size && per_stage > 1; r++) {
        double median = median_field(all, r / per_stage * per_stage, per_stage, STEP_COMPUTE);
        double compute = all[STEP_FIELDS * r + STEP_COMPUTE];
        if (compute <= threshold * median || compute - median < SLOW_RANK_SHARE * step) continue;
        char coords[64];
        coordinates_of(r, coords, sizeof(coords));
        printf("slow rank: rank %d on %s %s computes %.1f ms per step, %.1fx the median of its pipeline stage "
               "(%.1f ms; --slow-rank-threshold %.2g); it waits %.1f ms per step\n", r, names[r].host, coords,
               compute * ms, compute / median, median * ms, threshold, all[STEP_FIELDS * r + STEP_WAIT] * ms);
    }
}

// each host's best exchange with another host, from its ranks' best[W][phases] (NAN: none)
static int fastest_per_host(const RankName* names, const double* best, double* fastest, int* first) {
    int H = 0;
    for (int r = 0; r < grid.world_size; r++) {
        int h = 0;
        while (h < H && strcmp(names[first[h]].host, names[r].host) != 0) h++;
        if (h == H) {
            first[H] = r;
            fastest[H++] = NAN;
        }
        for (int p = 0; p < LINK_PROBE_PHASES; p++) {
            double t = best[r * LINK_PROBE_PHASES + p];
            if (!isnan(t)) fastest[h] = isnan(fastest[h]) ? t : fmin(fastest[h], t);
        }
    }
    return H;
}

// Rank 0: each host's figure against the other hosts' median. Named above X times it, when the
// difference also costs the step: the bytes a rank sends in a step, moved at this host's rate
// instead of the others', take at least SLOW_RANK_SHARE of the step longer (a probe's spread
// of a few tenths of a millisecond on a busy machine explains nothing).
static void report_slow_links(const RankName* names, const double* all, const double* best, float threshold) {
    int W = grid.world_size;
    double* fastest = (double*)mallocCheck(W * sizeof(double));   // per host, in the order of its first rank
    double* others = (double*)mallocCheck(W * sizeof(double));
    int* first = (int*)mallocCheck(W * sizeof(int));
    int H = fastest_per_host(names, best, fastest, first);
    double step = median_field(all, 0, W, STEP_TOTAL), sent = median_field(all, 0, W, STEP_SENT), ms = 1000.0;
    for (int h = 0; h < H; h++) {
        int k = 0;
        for (int j = 0; j < H; j++)
            if (j != h && !isnan(fastest[j])) others[k++] = fastest[j];
        double median = k ? median_of(others, k) : NAN, lost = (fastest[h] - median) * sent / LINK_PROBE_BYTES;
        if (!k || isnan(fastest[h]) || fastest[h] <= threshold * median || lost < SLOW_RANK_SHARE * step) continue;
        char ranks[512];
        ranks_on_host(names, names[first[h]].host, ranks, sizeof(ranks));
        printf("slow link: host %s (%s) exchanges %d bytes with another host in %.1f ms at best (%.3g MB/s each way), "
               "%.1fx the median of the other hosts (%.1f ms; --slow-rank-threshold %.2g): about %.0f ms of a %.0f ms step "
               "at %.3g MB sent per rank\n", names[first[h]].host, ranks, LINK_PROBE_BYTES, fastest[h] * ms,
               LINK_PROBE_BYTES / fastest[h] / 1e6, fastest[h] / median, median * ms, threshold, lost * ms, step * ms,
               sent / 1e6);
    }
    free(fastest);
    free(others);
    free(first);
}

// every rank, every log interval (its collectives: every rank calls it at the same point)
static void slow_rank_report(double compute_per_step, double wait_per_step, double bytes_sent_per_step, float threshold) {
    const RankName* names = rank_names();
    int n = grid.world_size, elsewhere = 0;   // ranks on another host than rank 0's
    double mine[STEP_FIELDS] = {compute_per_step, wait_per_step, bytes_sent_per_step};
    double* all = (double*)mallocCheck(sizeof(mine) * n);
    all_gather_host(&grid.world, mine, all, sizeof(mine));   // every rank decides on the probe alike
    if (threshold > 0.0f && grid.world_rank == 0) report_slow_ranks(names, all, threshold);
    double compute = median_field(all, 0, n, STEP_COMPUTE), least_wait = INFINITY;
    for (int r = 0; r < n; r++) {
        least_wait = fmin(least_wait, all[STEP_FIELDS * r + STEP_WAIT]);
        elsewhere += strcmp(names[r].host, names[0].host) != 0;
    }
    if (threshold > 0.0f && elsewhere > 0 && least_wait > compute) {   // bound by communication: probe the links
        double best[LINK_PROBE_PHASES];
        double* every = (double*)mallocCheck(sizeof(best) * n);
        probe_links(names, best);
        all_gather_host(&grid.world, best, every, sizeof(best));
        if (grid.world_rank == 0) report_slow_links(names, all, every, threshold);
        free(every);
    }
    fflush(stdout);
    free(all);
}

// ----------------------------------------------------------------------------
// the cluster check (--check-cluster): what each group's links and each rank's arithmetic give
// It measures what training will use, through the same wrappers: all-reduce in floatX (g, the
// tied embedding), reduce-scatter in fp32 (ZeRO-1's gradients) and all-gather in floatX
// (ZeRO-1's parameters) in every TP, DP and PP group and in the world; send/recv in floatX
// (the activations) from each pipeline stage to the next; matmul_forward of N x N by N x N on
// every rank. Bandwidths in nccl-tests' terms (its doc/PERFORMANCE.md), for an operation on n
// ranks over a buffer of S bytes (the all-reduce's buffer, the reduce-scatter's input, the
// all-gather's output, the message) that took t seconds:
//   algorithm bandwidth  algbw = S / t
//   bus bandwidth        busbw = algbw x 2(n-1)/n   all-reduce
//                                algbw x (n-1)/n    reduce-scatter, all-gather
//                                algbw              send/recv
// The bus bandwidth is what each rank's link carries in a ring, so it can be held against the
// hardware's peak whatever n is. GB/s are 1e9 bytes per second.
// Timing: one group at a time (a figure then belongs to that group alone, not to whoever
// shared its links meanwhile), the other ranks asleep in a barrier; the group's own barrier,
// the operation, a wait for the device. A repetition lasts as long as its slowest member took
// (a collective is as slow as its slowest member: that is what training waits for), and a
// figure is the median of CHECK_REPS repetitions after CHECK_WARMUP untimed ones (one stray
// hiccup does not move it). The repetitions interleave (repetition i of every group, then
// i + 1), so a passing disturbance lands on every group alike. The matmuls likewise: the
// ranks of a host take turns (on the CPU build they share the host's cores), hosts at once.
// Outliers: a figure below CHECK_OUTLIER x the median of its peers' is named on a line that
// starts with "slow": a group against the other groups of its kind (its bus bandwidth at the
// largest size, for each operation), a rank's matmul against the other ranks', a host's
// figures against the other hosts'. A figure with no peers (the world, one host) is never named.

#define CHECK_WARMUP 3
#define CHECK_REPS 10
#define CHECK_MAX_SIZES 8
#define CHECK_OUTLIER 0.8
#ifdef __CUDACC__
#define CHECK_MATMUL_DEFAULT 8192   // 1.1 TFLOP: about 2 ms on an H100 in bf16
#else
#define CHECK_MATMUL_DEFAULT 1024   // 2.1 GFLOP: about 15 ms on 2 cores in fp32
#endif

// what to measure: message sizes in bytes, increasing (each operation rounds them to whole
// elements and shards), and the matmul's N
typedef struct {
    size_t bytes[CHECK_MAX_SIZES];
    int num_sizes, matmul_n;
} ClusterCheck;

// the kinds of group; CHECK_LINK: a pipeline stage and the next one (send/recv)
typedef enum { CHECK_TP, CHECK_DP, CHECK_PP, CHECK_WORLD, CHECK_LINK, CHECK_KINDS } CheckKind;
typedef enum { OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_SEND_RECV, CHECK_OPS } CheckOp;
static const char* const CHECK_KIND_NAMES[CHECK_KINDS] = {"TP group", "DP group", "PP group", "world", "pipeline link"};
static const char* const CHECK_OP_NAMES[CHECK_OPS] = {"all-reduce", "reduce-scatter", "all-gather", "send/recv"};

// what one rank measured and where it sits, gathered to rank 0 for the report
typedef struct {
    char host[256];
    int tp, pp, dp;
    int first[CHECK_KINDS];   // world rank of the first member of this rank's group of each kind
                              // (CHECK_LINK: this rank when it sends to a next stage, else -1)
    int next_stage;           // world rank of the next pipeline stage (-1: the last stage)
    double seconds[CHECK_KINDS][CHECK_OPS][CHECK_MAX_SIZES];   // the time of this rank's group
    double matmul_seconds;
} CheckRecord;

static int check_has_op(CheckKind k, CheckOp op) { return (k == CHECK_LINK) == (op == OP_SEND_RECV); }
static size_t check_elem_bytes(CheckOp op) { return op == OP_REDUCE_SCATTER ? sizeof(float) : sizeof(floatX); }
static const char* check_type_name(CheckOp op) { return op == OP_REDUCE_SCATTER ? "fp32" : FLOATX_NAME; }

// S for a requested size on n ranks: whole elements, and whole shards for the sharded ops
static size_t check_bytes(CheckOp op, size_t want, int n) {
    size_t unit = check_elem_bytes(op) * (op == OP_REDUCE_SCATTER || op == OP_ALL_GATHER ? n : 1);
    return want >= unit ? want / unit * unit : unit;
}

static double busbw_factor(CheckOp op, int n) {
    return op == OP_ALL_REDUCE ? 2.0 * (n - 1) / n : op == OP_SEND_RECV ? 1.0 : (double)(n - 1) / n;
}

// bus bandwidth in GB/s of S bytes in t seconds on n ranks
static double busbw_of(CheckOp op, size_t bytes, double seconds, int n) { return bytes / seconds / 1e9 * busbw_factor(op, n); }

static Group* check_group(CheckKind k) {
    return k == CHECK_TP ? &grid.tp : k == CHECK_DP ? &grid.dp : k == CHECK_WORLD ? &grid.world : &grid.pp;
}

// one operation of S bytes on device buffers a and b of at least S, timed on this rank from
// its group's barrier; a link: stage `link` sends to stage link + 1 of this rank's pipeline
static double check_once(CheckOp op, Group* g, void* a, void* b, size_t bytes, int link) {
    size_t count = bytes / check_elem_bytes(op);
    barrier(g);
    double t0 = now_seconds();
    if (op == OP_ALL_REDUCE) all_reduce(g, a, count, AS_FLOATX, REDUCE_SUM);
    if (op == OP_REDUCE_SCATTER) reduce_scatter(g, a, b, count / g->size, AS_FLOAT);
    if (op == OP_ALL_GATHER) all_gather(g, (floatX*)a + g->rank * (count / g->size), (floatX*)a, count / g->size);
    if (op == OP_SEND_RECV && grid.pp_rank == link) send_forward((const floatX*)a, count);
    if (op == OP_SEND_RECV && grid.pp_rank == link + 1) recv_forward((floatX*)b, count);
    dev_synchronize();
    test_slow_rank(now_seconds() - t0);
    return now_seconds() - t0;
}

// Every kind of group, every operation, every size: the groups of a kind take turns in the
// order of their first ranks (a pipeline's links one after another within its turn).
static void check_bandwidths(CheckRecord* me, const ClusterCheck* cc) {
    int W = grid.world_size, PP = grid.pp_size;
    size_t most = cc->bytes[cc->num_sizes - 1] + sizeof(float) * W;   // check_bytes may round up to one shard per rank
    void* a = dev_malloc(most);
    void* b = dev_malloc(most);
    dev_zero(a, most);
    dev_zero(b, most);
    int* stage_ranks = (int*)mallocCheck(PP * sizeof(int));   // world rank of each stage of this pipeline
    all_gather_host(&grid.pp, &grid.world_rank, stage_ranks, sizeof(int));
    me->next_stage = grid.pp_rank + 1 < PP ? stage_ranks[grid.pp_rank + 1] : -1;
    int* turns = (int*)mallocCheck(W * sizeof(int));                      // turns[q]: the turn of rank q's group
    double* t = (double*)mallocCheck(PP * CHECK_REPS * sizeof(double));   // [link, or 0][repetition]
    dev_synchronize();
    for (int k = 0; k < CHECK_KINDS; k++) {
        Group* g = check_group((CheckKind)k);
        me->first[k] = k == CHECK_LINK ? (me->next_stage >= 0 ? grid.world_rank : -1) : grid.world_rank;
        if (k != CHECK_LINK) broadcast_host(g, &me->first[k], sizeof(int), 0);
        if (g->size < 2) continue;   // a group of one sends nothing (the groups of a kind are all one size)
        int links = k == CHECK_LINK ? PP - 1 : 1, turn = me->first[k == CHECK_LINK ? CHECK_PP : k];
        all_gather_host(&grid.world, &turn, turns, sizeof(int));
        for (int op = 0; op < CHECK_OPS; op++) {
            if (!check_has_op((CheckKind)k, (CheckOp)op)) continue;
            for (int s = 0; s < cc->num_sizes; s++) {
                size_t bytes = check_bytes((CheckOp)op, cc->bytes[s], k == CHECK_LINK ? 2 : g->size);
                memset(t, 0, PP * CHECK_REPS * sizeof(double));
                for (int i = -CHECK_WARMUP; i < CHECK_REPS; i++)         // repetition i of every group, then i + 1
                    for (int q = 0; q < W; q++)
                        for (int link = 0; link < links && turns[q] == q; link++) {   // q: a group's first rank
                            barrier_sleeping(&grid.world);
                            if (turn != q) continue;
                            double dt = check_once((CheckOp)op, g, a, b, bytes, k == CHECK_LINK ? link : -1);
                            if (i >= 0) t[link * CHECK_REPS + i] = dt;
                        }
                all_reduce_host(g, t, links * CHECK_REPS, REDUCE_MAX);   // each repetition: its slowest member
                int row = k == CHECK_LINK ? grid.pp_rank : 0;            // a link's figure: its sender's
                if (row < links) me->seconds[k][op][s] = median_of(t + row * CHECK_REPS, CHECK_REPS);
            }
        }
    }
    free(stage_ranks);
    free(turns);
    free(t);
    dev_free(a);
    dev_free(b);
}

// this rank's N x N x N matmul_forward, median of CHECK_REPS; the ranks of a host take turns
static double check_matmul(int N) {
    size_t n = (size_t)N * N;
    float* host = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) host[i] = (float)((splitmix64(i) >> 40) * 0x1p-24 - 0.5);   // in [-0.5, 0.5)
    floatX* x = (floatX*)dev_malloc(n * sizeof(floatX));
    floatX* w = (floatX*)dev_malloc(n * sizeof(floatX));
    floatX* out = (floatX*)dev_malloc(n * sizeof(floatX));
    floats_to_dev_floatX(x, host, n);
    floats_to_dev_floatX(w, host, n);
    free(host);
    double t[CHECK_REPS];
    int turns = max_over_world(grid.local_size);
    for (int i = -CHECK_WARMUP; i < CHECK_REPS; i++)
        for (int turn = 0; turn < turns; turn++) {
            barrier_sleeping(&grid.world);
            if (grid.local_rank != turn) continue;
            double t0 = now_seconds();
            matmul_forward(out, x, w, NULL, N, N, N);
            dev_synchronize();
            test_slow_rank(now_seconds() - t0);
            if (i >= 0) t[i] = now_seconds() - t0;
        }
    dev_free(x);
    dev_free(w);
    dev_free(out);
    return median_of(t, CHECK_REPS);
}

// ---- the report (rank 0), from every rank's record

typedef struct {
    const CheckRecord* r;   // [W], by world rank
    int W;
    const ClusterCheck* cc;
    int named;              // figures named as slow
    int named_groups;       // groups named as slow (once each, whatever the operation)
    int* named_in;          // [W]: how many of those groups each rank is in
    int H;                  // hosts, in the order of their first ranks
    int* host_of;           // [W]: each rank's host
    int* first_rank;        // [H]: each host's first rank
    int* named_on;          // [H]: how many of the slow groups have a rank on each host
} CheckReport;

// "rank 5 on HOST TP(1)-PP(1)-DP(0)-Rank(5)", as the error lines name a rank
static const char* check_rank_name(const CheckReport* c, int q, char* buf, size_t len) {
    const CheckRecord* x = &c->r[q];
    snprintf(buf, len, "rank %d on %s TP(%d)-PP(%d)-DP(%d)-Rank(%d)", q, x->host, x->tp, x->pp, x->dp, q);
    return buf;
}

// the world ranks of the group of kind k whose first member is `first`, in rank order
static int check_members(const CheckReport* c, CheckKind k, int first, int* out) {
    if (k == CHECK_LINK) {
        out[0] = first;
        out[1] = c->r[first].next_stage;
        return 2;
    }
    int n = 0;
    for (int q = 0; q < c->W; q++)
        if (c->r[q].first[k] == first) out[n++] = q;
    return n;
}

// "4,5"; "0,8,16,...(64)" for a long list; "1>5" for a link; "all" for the world
static const char* check_members_text(CheckKind k, const int* m, int n, char* buf, size_t len) {
    size_t used = 0;
    buf[0] = '\0';
    if (k == CHECK_WORLD) return strcpy(buf, "all");
    for (int i = 0; i < n && used < len; i++) {
        if (i == 3 && n > 4) {
            snprintf(buf + used, len - used, ",...(%d)", n);
            break;
        }
        used += snprintf(buf + used, len - used, "%s%d", i == 0 ? "" : k == CHECK_LINK ? ">" : ",", m[i]);
    }
    return buf;
}

// Is x[i] below CHECK_OUTLIER x the median of the other x[j]? NAN entries are absent; with
// no peers, no. *median: the peers' median (NAN without peers).
static int below_peers(const double* x, int n, int i, double* median) {
    double* peers = (double*)mallocCheck((n + 1) * sizeof(double));
    int p = 0;
    for (int j = 0; j < n; j++)
        if (j != i && !isnan(x[j])) peers[p++] = x[j];
    *median = p > 0 ? median_of(peers, p) : NAN;
    free(peers);
    return p > 0 && !isnan(x[i]) && x[i] < CHECK_OUTLIER * *median;
}

// one kind's table: per operation and size, the median of the groups and the slowest group;
// then each group whose bus bandwidth at the largest size is below CHECK_OUTLIER x the others'
static void report_kind(CheckReport* c, CheckKind k) {
    int W = c->W, G = 0, n = 0, last = c->cc->num_sizes - 1;
    int* firsts = (int*)mallocCheck(W * sizeof(int));   // the groups, by their first ranks
    int* m = (int*)mallocCheck(W * sizeof(int));
    for (int q = 0; q < W; q++)
        if (c->r[q].first[k] == q) firsts[G++] = q;
    if (G > 0) n = check_members(c, k, firsts[0], m);
    if (k == CHECK_LINK) printf("\npipeline links (send/recv from a stage to the next): ");
    else if (k == CHECK_WORLD) printf("\nworld: ");
    else printf("\n%ss: ", CHECK_KIND_NAMES[k]);
    if (G == 0 || n < 2) {
        printf("%s\n", G == 0 ? "none (one pipeline stage)" : G == 1 ? "one rank, nothing to measure" : "one rank each, nothing to measure");
        free(firsts);
        free(m);
        return;
    }
    printf("%d of %d ranks\n", G, n);
    if (G > 1) printf("  %-14s %-4s %10s | %-40s | %s\n", "", "", "", "the median of the groups", "the slowest group");
    printf("  %-14s %-4s %10s | %10s %14s %14s | %-14s %10s %14s %14s\n", "operation", "type", "bytes", "time (us)",
           "algbw (GB/s)", "busbw (GB/s)", "ranks", "time (us)", "algbw (GB/s)", "busbw (GB/s)");
    double* t = (double*)mallocCheck(G * sizeof(double));
    double* busbw = (double*)mallocCheck(G * sizeof(double));
    int* named = (int*)callocCheck(G, sizeof(int));
    char text[64], who[320];
    for (int op = 0; op < CHECK_OPS; op++) {
        if (!check_has_op(k, (CheckOp)op)) continue;
        for (int s = 0; s <= last; s++) {
            size_t bytes = check_bytes((CheckOp)op, c->cc->bytes[s], n);
            int slowest = 0;
            for (int i = 0; i < G; i++) {
                t[i] = c->r[firsts[i]].seconds[k][op][s];
                if (t[i] > t[slowest]) slowest = i;
            }
            double worst = t[slowest], mid = median_of(t, G);
            check_members_text(k, m, check_members(c, k, firsts[slowest], m), text, sizeof(text));
            printf("  %-14s %-4s %10zu | %10.2f %14.3f %14.3f | %-14s %10.2f %14.3f %14.3f\n", CHECK_OP_NAMES[op],
                   check_type_name((CheckOp)op), bytes, mid * 1e6, bytes / mid / 1e9, busbw_of((CheckOp)op, bytes, mid, n),
                   text, worst * 1e6, bytes / worst / 1e9, busbw_of((CheckOp)op, bytes, worst, n));
        }
    }
    for (int op = 0; op < CHECK_OPS; op++) {   // the outliers, at the largest size
        if (!check_has_op(k, (CheckOp)op)) continue;
        size_t bytes = check_bytes((CheckOp)op, c->cc->bytes[last], n);
        for (int i = 0; i < G; i++) busbw[i] = busbw_of((CheckOp)op, bytes, c->r[firsts[i]].seconds[k][op][last], n);
        for (int i = 0; i < G; i++) {
            double median;
            if (!below_peers(busbw, G, i, &median)) continue;
            int count = check_members(c, k, firsts[i], m);
            printf("slow %s %s: %s bus bandwidth %.3f GB/s at %zu bytes, below %.1f x %.3f GB/s (the median of the other "
                   "%d); its ranks:", CHECK_KIND_NAMES[k], check_members_text(k, m, count, text, sizeof(text)),
                   CHECK_OP_NAMES[op], busbw[i], bytes, CHECK_OUTLIER, median, G - 1);
            for (int j = 0; j < count && j < 8; j++) printf("%s %s", j ? "," : "", check_rank_name(c, m[j], who, sizeof(who)));
            printf("%s\n", count > 8 ? ", ..." : "");
            c->named++;
            if (!named[i]++) {
                c->named_groups++;
                for (int j = 0; j < count; j++) c->named_in[m[j]]++;
                for (int h = 0; h < c->H; h++)   // each host once, however many of the group's ranks it holds
                    for (int j = 0; j < count; j++)
                        if (c->host_of[m[j]] == h) {
                            c->named_on[h]++;
                            break;
                        }
            }
        }
    }
    free(named);
    free(t);
    free(busbw);
    free(firsts);
    free(m);
}

// every rank's matmul against the other ranks'
static void report_matmul(CheckReport* c) {
    double flop = 2.0 * pow(c->cc->matmul_n, 3);
    double* tflops = (double*)mallocCheck(c->W * sizeof(double));
    double* sorted = (double*)mallocCheck(c->W * sizeof(double));
    int slowest = 0, N = c->cc->matmul_n;
    for (int q = 0; q < c->W; q++) {
        sorted[q] = tflops[q] = flop / c->r[q].matmul_seconds / 1e12;
        if (tflops[q] < tflops[slowest]) slowest = q;
    }
    char who[320];
    printf("\nmatmul (matmul_forward, %d x %d by %d x %d, %s, %.3g GFLOP) on each of %d ranks: median %.4g TFLOPs, slowest "
           "%.4g TFLOPs (%s)\n", N, N, N, N, FLOATX_NAME, flop / 1e9, c->W, median_of(sorted, c->W), tflops[slowest],
           check_rank_name(c, slowest, who, sizeof(who)));
    for (int q = 0; q < c->W; q++) {
        double median;
        if (!below_peers(tflops, c->W, q, &median)) continue;
        printf("slow rank: matmul of %s %.4g TFLOPs, below %.1f x %.4g TFLOPs (the median of the other %d)\n",
               check_rank_name(c, q, who, sizeof(who)), tflops[q], CHECK_OUTLIER, median, c->W - 1);
        c->named++;
    }
    free(tflops);
    free(sorted);
}

// Per host: the matmul of its slowest rank and the median of its ranks; for the TP, DP and PP
// groups and the pipeline links, the bus bandwidth of the slowest such group it has a rank
// in (all-reduce, or send/recv, at the largest size). Each figure against the other hosts'.
// A group's figure cannot tell its hosts apart: a host whose link is slow slows every group it
// has a rank in, and those groups' other hosts show the same low figure. So where some hosts
// have a rank in every slow group and others do not (check_culprit_host), those hosts are
// named, and a host that only shares a slow group with them is not named for that group's
// figure (its row in the table shows it).
#define HOST_FIGURES 6

// hosts with a rank in every one of two or more slow groups, when not every host has: 1 if
// host h is one of them (0 for every host otherwise)
static int check_culprit_host(const CheckReport* c, int h) {
    int culprits = 0;
    for (int k = 0; k < c->H; k++) culprits += c->named_on[k] == c->named_groups;
    return c->named_groups > 1 && culprits < c->H && c->named_on[h] == c->named_groups;
}
static int check_culprits_known(const CheckReport* c) {
    for (int h = 0; h < c->H; h++)
        if (check_culprit_host(c, h)) return 1;
    return 0;
}
static void report_hosts(CheckReport* c) {
    static const char* const names[HOST_FIGURES] = {"matmul of its slowest rank (TFLOPs)", "median matmul of its ranks (TFLOPs)",
        "all-reduce busbw of its slowest TP group (GB/s)", "all-reduce busbw of its slowest DP group (GB/s)",
        "all-reduce busbw of its slowest PP group (GB/s)", "send/recv busbw of its slowest pipeline link (GB/s)"};
    static const CheckKind kinds[HOST_FIGURES - 2] = {CHECK_TP, CHECK_DP, CHECK_PP, CHECK_LINK};
    int W = c->W, H = c->H, last = c->cc->num_sizes - 1;
    const int *host_of = c->host_of, *first_rank = c->first_rank;
    int* ranks = (int*)callocCheck(W, sizeof(int));          // on each host
    for (int q = 0; q < W; q++) ranks[host_of[q]]++;
    double* fig = (double*)mallocCheck((size_t)HOST_FIGURES * H * sizeof(double));   // [figure][host]
    double* tflops = (double*)mallocCheck(W * sizeof(double));
    int* m = (int*)mallocCheck(W * sizeof(int));
    for (int i = 0; i < HOST_FIGURES * H; i++) fig[i] = NAN;
    for (int h = 0; h < H; h++) {
        int k = 0;
        for (int q = 0; q < W; q++)
            if (host_of[q] == h) tflops[k++] = 2.0 * pow(c->cc->matmul_n, 3) / c->r[q].matmul_seconds / 1e12;
        fig[1 * H + h] = median_of(tflops, k);   // sorted: the slowest comes first
        fig[0 * H + h] = tflops[0];
    }
    for (int j = 0; j < HOST_FIGURES - 2; j++) {
        CheckKind k = kinds[j];
        CheckOp op = k == CHECK_LINK ? OP_SEND_RECV : OP_ALL_REDUCE;
        for (int q = 0; q < W; q++) {
            int n = c->r[q].first[k] == q ? check_members(c, k, q, m) : 0;
            if (n < 2) continue;
            double bw = busbw_of(op, check_bytes(op, c->cc->bytes[last], n), c->r[q].seconds[k][op][last], n);
            for (int i = 0; i < n; i++) {
                double* x = &fig[(2 + j) * H + host_of[m[i]]];
                *x = isnan(*x) ? bw : fmin(*x, bw);
            }
        }
    }
    printf("\nhosts: %d; matmul in TFLOPs; the bus bandwidth in GB/s at the largest size of the slowest group with a rank "
           "on the host (all-reduce; send/recv for links; -: none)\n", H);
    printf("  %-24s %5s | matmul: %8s %8s | busbw: %8s %8s %8s %8s\n", "host", "ranks", "slowest", "median", "TP", "DP", "PP",
           "link");
    for (int h = 0; h < H; h++) {
        printf("  %-24s %5d |         %8.4g %8.4g |       ", c->r[first_rank[h]].host, ranks[h], fig[h], fig[H + h]);
        for (int j = 2; j < HOST_FIGURES; j++) {
            if (isnan(fig[j * H + h])) printf(" %8s", "-");
            else printf(" %8.3f", fig[j * H + h]);
        }
        printf("\n");
    }
    int culprits_known = check_culprits_known(c);
    for (int j = 0; j < HOST_FIGURES; j++)
        for (int h = 0; h < H; h++) {
            double median;
            if (!below_peers(&fig[j * H], H, h, &median)) continue;
            if (j >= 2 && culprits_known && !check_culprit_host(c, h)) continue;   // it shares a slow group
            printf("slow host %s: %s %.4g, below %.1f x %.4g (the median of the other %d)\n", c->r[first_rank[h]].host,
                   names[j], fig[j * H + h], CHECK_OUTLIER, median, H - 1);
            c->named++;
        }
    for (int h = 0; h < H; h++)
        if (check_culprit_host(c, h))
            printf("every slow group has a rank on host %s (%d groups; the other hosts in them only share them)\n",
                   c->r[first_rank[h]].host, c->named_groups);
    free(ranks);
    free(fig);
    free(tflops);
    free(m);
}

// The tables and the outliers from every rank's record r[W] (rank 0; the tests call it on
// made-up records). The caller frees c->named_in.
static void check_report(CheckReport* c, const CheckRecord* r, int W, const ClusterCheck* cc) {
    memset(c, 0, sizeof(*c));
    c->r = r;
    c->W = W;
    c->cc = cc;
    c->named_in = (int*)callocCheck(W, sizeof(int));
    c->host_of = (int*)mallocCheck(W * sizeof(int));   // the hosts, by name
    c->first_rank = (int*)mallocCheck(W * sizeof(int));
    c->named_on = (int*)callocCheck(W, sizeof(int));
    for (int q = 0; q < W; q++) {
        int h = 0;
        while (h < c->H && strcmp(r[c->first_rank[h]].host, r[q].host) != 0) h++;
        if (h == c->H) c->first_rank[c->H++] = q;
        c->host_of[q] = h;
    }
    for (int k = 0; k < CHECK_KINDS; k++) report_kind(c, (CheckKind)k);
    report_matmul(c);
    report_hosts(c);
    char who[320];
    for (int q = 0; q < W && c->named_groups > 1; q++)   // a rank that every slow group shares
        if (c->named_in[q] == c->named_groups) printf("every slow group has %s in it\n", check_rank_name(c, q, who, sizeof(who)));
    free(c->host_of);
    free(c->first_rank);
    free(c->named_on);
    c->host_of = c->first_rank = c->named_on = NULL;
}

// Measures, then rank 0 prints the tables and names the outliers; every rank returns.
static void check_cluster(const ClusterCheck* cc) {
    double start = now_seconds();
    activity_phase("check-cluster", -1, -1);   // what the watchdog says if the check hangs
    if (grid.world_rank == 0) {
        char layout[96];
        printf("check-cluster: %d rank(s) as %s, %s build; one group at a time; each figure is the median of %d "
               "repetitions (after %d untimed) of the slowest member's time\n", grid.world_size,
               layout_name(layout, sizeof layout, grid.tp_size, grid.cp_size, grid.pp_size, grid.dp_size), BUILD_NAME,
               CHECK_REPS, CHECK_WARMUP);
        printf("  nccl-tests' definitions: algbw = bytes / time; busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for "
               "reduce-scatter and all-gather, x 1 for send/recv; GB/s = 1e9 bytes/s\n");
        fflush(stdout);
    }
    CheckRecord me;
    memset(&me, 0, sizeof(me));
    snprintf(me.host, sizeof(me.host), "%s", grid.host);
    me.tp = grid.tp_rank;
    me.pp = grid.pp_rank;
    me.dp = grid.dp_rank;
    check_bandwidths(&me, cc);
    me.matmul_seconds = check_matmul(cc->matmul_n);
    size_t total = 0;
    CheckRecord* all = (CheckRecord*)gather_bytes_to_rank0(&grid.world, &me, sizeof(me), &total);
    if (grid.world_rank == 0) {
        CheckReport c;
        check_report(&c, all, grid.world_size, cc);
        if (c.named) printf("check-cluster: %d figure(s) below %.1f x the median of their peers (the lines that start with "
                            "\"slow\"); %.1f s\n", c.named, CHECK_OUTLIER, now_seconds() - start);
        else printf("check-cluster: every figure is at least %.1f x the median of its peers; %.1f s\n", CHECK_OUTLIER,
                    now_seconds() - start);
        fflush(stdout);
        free(c.named_in);
    }
    free(all);
    barrier(&grid.world);
    activity_phase("setup", -1, -1);
}
