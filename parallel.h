/*
parallel.h — everything that crosses a process boundary, and the step built on it.

  - the process grid: world = TP x PP x DP ranks in Megatron's order (TP fastest, then DP,
    then PP: rank = tp + TP * (dp + DP * pp)), one object every part asks for its
    coordinates and groups, and the one way a rank fails (naming rank, host and coordinates);
  - collectives over a group (Megatron's f and g by name) and exchanges between pipeline
    neighbours: MPI on the CPU build, NCCL on the GPU build (MPI only to start), counting bytes;
  - the 1F1B pipeline schedule of a step (with one stage: forward, backward, ...);
  - ZeRO-1 AdamW: gradients reduce-scattered, master weights and moments sharded 1/DP,
    the global gradient norm (each parameter once) and clipping, parameters all-gathered;
  - what each rank is doing (before every blocking operation), the watchdog thread that
    names a hang, and the time each rank spends computing and waiting (slow ranks);
  - the cluster check (--check-cluster): every group's bus bandwidth and every rank's matmul
    throughput, through the same wrappers training uses, and the outliers named.

Rules it keeps: one wrapper per collective (MPI-IO's shared files too), and no MPI call in any
other file but start-up and shutdown; nobody else computes a rank by hand.
*/
#pragma once
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>
#ifdef __CUDACC__
#include <nccl.h>
#endif

// ----------------------------------------------------------------------------
// errors

#define mpiCheck(call) mpi_check_((call), #call, __FILE__, __LINE__)
#ifdef __CUDACC__
#define ncclCheck(call) nccl_check_((call), __FILE__, __LINE__)
#endif

// one communication group: its MPI communicator and, on the GPU build, its NCCL twin
typedef struct {
    MPI_Comm mpi;             // MPI_COMM_NULL where this rank is not a member
    int size, rank;
#ifdef __CUDACC__
    ncclComm_t nccl;
#endif
    double bytes_sent;        // bytes this rank sent in the group (ring algorithms), for --log-comm
    const char* name;         // "tensor-parallel", ... (the watchdog's lines)
} Group;

typedef struct {
    int world_rank, world_size, local_rank;   // local_rank: index among the ranks on this host ...
    int local_size;                           // ... of local_size
    char host[256];
    int tp_size, pp_size, dp_size;
    int tp_rank, pp_rank, dp_rank;
    Group world;
    Group tp, dp, pp;                         // same (dp, pp) / same (tp, pp) / same (tp, dp)
    Group model_parallel;                     // all ranks with the same dp
    Group embedding;                          // first and last stage of a pipeline (PP > 1)
    int thread_level;                         // MPI's, from MPI_Init_thread
    int placed;                               // coordinates known
    int ready;                                // groups built
} Topology;

static Topology grid;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char* grid_name(char* buf, size_t len) {
    snprintf(buf, len, "TP(%d)-PP(%d)-DP(%d)-Rank(%d)", grid.tp_rank, grid.pp_rank, grid.dp_rank, grid.world_rank);
    return buf;
}

// Test-only switches, from the environment (train.c's test_faults_in_step has the others):
// GRIDGPT_TEST_SLOW_RANK=R with GRIDGPT_TEST_SLOW_FACTOR=F makes rank R take F times as long
// in each piece of work it times: a training step's compute (tests/test_watchdog.sh: the
// slow-rank report must name it) and each operation and matmul of --check-cluster
// (tests/test_check_cluster.sh: the check must name it).
static int test_rank_is(const char* variable) {
    const char* v = getenv(variable);
    return v && atoi(v) == grid.world_rank;
}

// after `seconds` of timed work: rank R works (F - 1) x as long again
static void test_slow_rank(double seconds) {
    const char* factor = getenv("GRIDGPT_TEST_SLOW_FACTOR");
    if (test_rank_is("GRIDGPT_TEST_SLOW_RANK") && factor && atof(factor) > 1.0)
        usleep((useconds_t)(1e6 * seconds * (atof(factor) - 1.0)));
}

// the one error line: "error: " + where (may be empty) + the message, in one write so that
// the lines of several ranks do not interleave
static void print_error(const char* where, const char* fmt, va_list ap) {
    char msg[8192];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    fprintf(stderr, "error: %s%s\n", where, msg);
    fflush(stderr);
}

// the error line of a run-time failure, naming this rank, its host and its coordinates
static void print_rank_error(const char* fmt, va_list ap) {
    char coordinates[96] = "", where[512];
    if (grid.placed) grid_name(coordinates, sizeof(coordinates));
    snprintf(where, sizeof(where), "[rank %d on %s%s%s] ", grid.world_rank, grid.host, grid.placed ? " " : "", coordinates);
    print_error(where, fmt, ap);
}

// A failure on one rank ends the whole job, and says where it happened.
static void fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    print_rank_error(fmt, ap);
    va_end(ap);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

// A failure the run survives (a checkpoint that could not be saved): the same line, no abort.
static void report_error(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    print_rank_error(fmt, ap);
    va_end(ap);
}

// Bad input (a flag, a config, a file): every rank sees the same input and reaches the same
// verdict, so each exits with status 2 on its own; rank 0 says why in one line.
static void config_error(const char* fmt, ...) {
    if (grid.world_rank == 0) {
        va_list ap;
        va_start(ap, fmt);
        print_error("", fmt, ap);
        va_end(ap);
    }
    MPI_Finalize();
    exit(2);
}

// Bad input that only rank `who` can name (every rank has agreed on who): that rank says why,
// with its coordinates, and every rank exits with status 2.
static void config_error_on(int who, const char* fmt, ...) {
    if (grid.world_rank == who) {
        va_list ap;
        va_start(ap, fmt);
        print_rank_error(fmt, ap);
        va_end(ap);
    }
    MPI_Finalize();
    exit(2);
}

static void mpi_check_(int err, const char* what, const char* file, int line) {
    if (err == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(err, msg, &len);
    fail("MPI error at %s:%d in %s: %s", file, line, what, msg);
}

#ifdef __CUDACC__
static void nccl_check_(ncclResult_t err, const char* file, int line) {
    if (err == ncclSuccess) return;
    fail("NCCL error at %s:%d: %s", file, line, ncclGetErrorString(err));
}
#endif

// ----------------------------------------------------------------------------
// the process grid

static void grid_start(int* argc, char*** argv) {
    // first, before MPI: OpenBLAS's kernels can only be changed by executing again (blas_cores.h)
    blas_choose_kernels(*argv);
    // MPI_THREAD_MULTIPLE: the watchdog thread sends its report over MPI while the main thread
    // may be blocked inside MPI (without it the watchdog still reports, with no summary)
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &grid.thread_level);
    MPI_Comm_rank(MPI_COMM_WORLD, &grid.world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &grid.world_size);
    gethostname(grid.host, sizeof(grid.host) - 1);
    // the world group works from the start (setup's broadcasts); grid_build remakes it with its NCCL twin
    grid.world.mpi = MPI_COMM_WORLD;
    grid.world.size = grid.world_size;
    grid.world.rank = grid.world_rank;
    grid.world.name = "world";
    MPI_Comm local;
    mpiCheck(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, grid.world_rank, MPI_INFO_NULL, &local));
    MPI_Comm_rank(local, &grid.local_rank);
    MPI_Comm_size(local, &grid.local_size);
    MPI_Comm_free(&local);
}

// color MPI_UNDEFINED: this rank is not in the group
static void group_make(Group* g, const char* name, int color, int key) {
    memset(g, 0, sizeof(*g));
    g->name = name;
    mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, color, key, &g->mpi));
    if (g->mpi == MPI_COMM_NULL) return;
    MPI_Comm_size(g->mpi, &g->size);
    MPI_Comm_rank(g->mpi, &g->rank);
#ifdef __CUDACC__
    ncclUniqueId id;
    if (g->rank == 0) ncclCheck(ncclGetUniqueId(&id));
    mpiCheck(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, g->mpi));
    ncclCheck(ncclCommInitRank(&g->nccl, g->size, id, g->rank));
#endif
}

// Coordinates from the rank (Megatron's order: TP fastest, then DP, then PP), known as soon
// as the flags are checked, so that every later error line can name them. The caller has
// checked that world size is a multiple of TP x PP.
static void grid_place(int tp_size, int pp_size) {
    grid.tp_size = tp_size;
    grid.pp_size = pp_size;
    grid.dp_size = grid.world_size / (tp_size * pp_size);
    int r = grid.world_rank, TP = tp_size, DP = grid.dp_size;
    grid.tp_rank = r % TP;
    grid.dp_rank = (r / TP) % DP;
    grid.pp_rank = r / (TP * DP);
    grid.placed = 1;
}

// The coordinates and one communicator per group. On the GPU build this rank's GPU must be
// chosen first (kernels_init): NCCL binds a communicator to the current device.
static void grid_build(int tp_size, int pp_size) {
    grid_place(tp_size, pp_size);
    int r = grid.world_rank, TP = tp_size, DP = grid.dp_size, PP = pp_size;
    group_make(&grid.world, "world", 0, r);
    group_make(&grid.tp, "tensor-parallel", grid.dp_rank + DP * grid.pp_rank, grid.tp_rank);
    group_make(&grid.dp, "data-parallel", grid.tp_rank + TP * grid.pp_rank, grid.dp_rank);
    group_make(&grid.pp, "pipeline", grid.tp_rank + TP * grid.dp_rank, grid.pp_rank);
    group_make(&grid.model_parallel, "model-parallel", grid.dp_rank, grid.tp_rank + TP * grid.pp_rank);
    int embedding_stage = PP > 1 && (grid.pp_rank == 0 || grid.pp_rank == PP - 1);
    group_make(&grid.embedding, "embedding", embedding_stage ? grid.tp_rank + TP * grid.dp_rank : MPI_UNDEFINED,
               grid.pp_rank);
    grid.ready = 1;
}

static void grid_finish(void) {
    if (grid.ready) {
        Group* groups[] = {&grid.world, &grid.tp, &grid.dp, &grid.pp, &grid.model_parallel, &grid.embedding};
        for (int i = 0; i < 6; i++) {
            if (groups[i]->mpi == MPI_COMM_NULL) continue;
#ifdef __CUDACC__
            ncclCommDestroy(groups[i]->nccl);
#endif
            MPI_Comm_free(&groups[i]->mpi);
        }
    }
    MPI_Finalize();
}

// ----------------------------------------------------------------------------
// What this rank is doing: the trainer sets its phase (iteration, micro-batch, forward,
// backward, ...) and every wrapper below marks the blocking operation it enters and leaves.
// A few words and a clock reading under a mutex, no I/O; read by the watchdog thread and by
// the slow-rank report (the time spent waiting, apart from the time spent computing). On the
// GPU build a collective is enqueued and returns: the rank then blocks at its next copy from
// the GPU, and the watchdog names the last collective enqueued.

typedef struct {
    int iteration, micro_batch;           // the step and micro-batch in hand (-1: none)
    const char* phase;                    // "setup", "forward", "backward", "optimizer", ...
    const char* op;                       // the blocking operation in progress, or the last one
    const char* group;                    // its group ("" before any)
    int peer;                             // the other world rank of a pipeline exchange, else -1
    int waiting;                          // 1 while inside op
    int in_io;                            // 1 while a checkpoint is saved or loaded
    double progress_at;                   // when this rank last got anywhere
    double wait_started, wait_seconds;    // the wait in progress; all waits so far, summed
} Activity;

static Activity activity = {-1, -1, "setup", "", "", -1, 0, 0, 0.0, 0.0, 0.0};
static pthread_mutex_t activity_lock = PTHREAD_MUTEX_INITIALIZER;

static void activity_phase(const char* phase, int iteration, int micro_batch) {
    pthread_mutex_lock(&activity_lock);
    activity.phase = phase;
    activity.iteration = iteration;
    activity.micro_batch = micro_batch;
    activity.progress_at = now_seconds();
    pthread_mutex_unlock(&activity_lock);
}

// Every rank, around a checkpoint's save or load: the watchdog then allows
// --watchdog-io-timeout (an fsync on a busy parallel file system, or the ranks that wait for
// rank 0's, can take far longer than a step without anything being wrong)
static void activity_io(int in_io) {
    pthread_mutex_lock(&activity_lock);
    activity.in_io = in_io;
    activity.progress_at = now_seconds();
    pthread_mutex_unlock(&activity_lock);
}

// progress within one long operation (a checkpoint file written 1 GiB at a time)
static void activity_progress(void) {
    pthread_mutex_lock(&activity_lock);
    activity.progress_at = now_seconds();
    pthread_mutex_unlock(&activity_lock);
}

static void wait_begin(const char* op, const Group* g, int peer) {
    pthread_mutex_lock(&activity_lock);
    activity.op = op;
    activity.group = g->name ? g->name : "";
    activity.peer = peer;
    activity.waiting = 1;
    activity.wait_started = now_seconds();
    pthread_mutex_unlock(&activity_lock);
}

static void wait_end(void) {
    pthread_mutex_lock(&activity_lock);
    double now = now_seconds();
    activity.waiting = 0;
    activity.wait_seconds += now - activity.wait_started;
    activity.progress_at = now;
    pthread_mutex_unlock(&activity_lock);
}

static double seconds_waited(void) {
    pthread_mutex_lock(&activity_lock);
    double w = activity.wait_seconds;
    pthread_mutex_unlock(&activity_lock);
    return w;
}

// ----------------------------------------------------------------------------
// The watchdog (--watchdog-timeout S): a thread per rank that, when its rank has got nowhere
// for S seconds, prints one line (rank, host, coordinates, seconds stuck, what it waits in)
// and ends the job. A hung collective blocks its whole group, so every stuck rank reports.
// Each sends its report to rank 0's watchdog, which collects reports for WATCHDOG_GRACE
// seconds and prints one summary naming the ranks that wait in no collective: the ones the
// others are waiting for. Then the job ends with exit status 3, NCCL's communicators aborted
// first on the GPU build so that no rank stays blocked in a kernel.

#define WATCHDOG_GRACE 10.0
#define WATCHDOG_EXIT 3

typedef struct {   // one rank's state, as rank 0 receives it (fixed size: one message)
    int rank, pid, iteration, micro_batch, waiting, peer, in_io;
    double stuck;
    char host[64], phase[32], op[40], group[24];
} WatchdogReport;

static struct {
    double timeout, io_timeout;   // seconds; io_timeout while a checkpoint is saved or loaded
    int stopped;     // watchdog_stop: the thread ends
    MPI_Comm comm;   // a copy of the world for the reports alone (MPI_COMM_NULL: no summary)
    char (*hosts)[64];   // rank 0: every rank's host and process id, gathered at the start, so
    int* pids;           // that a rank that sends no report (frozen, dead) is named fully too
} watchdog;

static int watchdog_stopped(void) {
    pthread_mutex_lock(&activity_lock);
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

// a rank's grid coordinates, from its number (Megatron's order, as grid_place)
static void coordinates_of(int rank, char* out, size_t len) {
    int TP = grid.tp_size, DP = grid.dp_size;
    snprintf(out, len, "TP(%d)-PP(%d)-DP(%d)-Rank(%d)", rank % TP, rank / (TP * DP), (rank / TP) % DP, rank);
}

static void watchdog_end(void) {
#ifdef __CUDACC__
    Group* groups[] = {&grid.world, &grid.tp, &grid.dp, &grid.pp, &grid.model_parallel, &grid.embedding};
    for (int i = 0; i < 6; i++)
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

// appends ",r" (or "r") to a comma-separated list of ranks
static void list_rank(char* list, size_t len, int rank) {
    size_t used = strlen(list);
    snprintf(list + used, len - used, "%s%d", used ? "," : "", rank);
}

// appends "; rank r on HOST pid P TP(.)-PP(.)-DP(.)-Rank(r)" (without "; " first), from what
// rank 0 gathered at the start: all an operator needs to find the process
static void list_rank_fully(char* list, size_t len, int rank) {
    char coords[64];
    size_t used = strlen(list);
    coordinates_of(rank, coords, sizeof(coords));
    if (watchdog.hosts)
        snprintf(list + used, len - used, "%srank %d on %s pid %d %s", used ? "; " : "", rank, watchdog.hosts[rank],
                 watchdog.pids[rank], coords);
    else snprintf(list + used, len - used, "%srank %d %s", used ? "; " : "", rank, coords);
}

// rank 0: who waits in a collective, who waits in none (the ones the others wait for), who
// sent nothing
static void watchdog_summary(const WatchdogReport* reports, const int* heard) {
    char waiting[512] = "", silent[2048] = "", culprits[2048] = "";
    for (int r = 0; r < grid.world_size; r++) {
        if (!heard[r]) list_rank_fully(silent, sizeof(silent), r);
        else if (reports[r].waiting) list_rank(waiting, sizeof(waiting), r);
        else {
            char what[200], coords[64];
            size_t used = strlen(culprits);
            describe_report(&reports[r], what, sizeof(what));
            coordinates_of(r, coords, sizeof(coords));
            snprintf(culprits + used, sizeof(culprits) - used, "%srank %d on %s pid %d %s (%s)", used ? "; " : "", r,
                     reports[r].host, reports[r].pid, coords, what);
        }
    }
    fprintf(stderr, "error: watchdog summary: waiting in a collective: ranks %s | in none, so the others wait for "
            "them: %s | no report within %.0f s (dead, frozen or still going): %s\n", waiting[0] ? waiting : "none",
            culprits[0] ? culprits : "none", WATCHDOG_GRACE, silent[0] ? silent : "none");
}

// rank 0's watchdog: the reports that have arrived (heard[r] once rank r's has)
static void watchdog_receive(MPI_Request* pending, int* heard, double* first_heard_at) {
    for (int r = 1; r < grid.world_size; r++) {
        if (heard[r]) continue;
        MPI_Test(&pending[r], &heard[r], MPI_STATUS_IGNORE);
        if (heard[r] && !*first_heard_at) *first_heard_at = now_seconds();
    }
}

static void* watchdog_main(void* unused) {
    (void)unused;
    int n = grid.world_size, is_root = grid.world_rank == 0, use_mpi = watchdog.comm != MPI_COMM_NULL;
    WatchdogReport* reports = (WatchdogReport*)callocCheck(n, sizeof(WatchdogReport));
    int* heard = (int*)callocCheck(n, sizeof(int));
    MPI_Request* pending = (MPI_Request*)callocCheck(n, sizeof(MPI_Request));
    for (int r = 1; r < n && is_root && use_mpi; r++)
        MPI_Irecv(&reports[r], (int)sizeof(WatchdogReport), MPI_BYTE, r, 0, watchdog.comm, &pending[r]);
    double fired_at = 0.0, first_heard_at = 0.0;
    WatchdogReport me;
    MPI_Request sent;
    for (;;) {
        sleep(1);
        if (watchdog_stopped()) return NULL;
        me = watchdog_snapshot();
        if (!fired_at && me.stuck >= (me.in_io ? watchdog.io_timeout : watchdog.timeout)) {
            fired_at = now_seconds();
            watchdog_report(&me);
            if (!is_root && use_mpi) MPI_Isend(&me, (int)sizeof(me), MPI_BYTE, 0, 0, watchdog.comm, &sent);
        }
        if (is_root && use_mpi) watchdog_receive(pending, heard, &first_heard_at);
        double since = fired_at ? fired_at : first_heard_at;
        if (is_root && since && now_seconds() - since >= WATCHDOG_GRACE) {
            reports[0] = me;   // rank 0's own state, stuck or not
            heard[0] = 1;
            if (use_mpi) watchdog_summary(reports, heard);
            watchdog_end();
        }
        if (!is_root && fired_at && now_seconds() - fired_at >= WATCHDOG_GRACE + 5.0) watchdog_end();   // rank 0 is gone
    }
    return NULL;
}

// The training and its evaluations are over: what follows (sampling on rank 0 while the
// others wait to finish) may take as long as it takes.
static void watchdog_stop(void) {
    pthread_mutex_lock(&activity_lock);
    watchdog.stopped = 1;
    pthread_mutex_unlock(&activity_lock);
}

// after the grid is built, on every rank at once (the report channel is made collectively)
static void watchdog_start(double timeout_seconds, double io_timeout_seconds) {
    if (timeout_seconds <= 0.0) return;
    watchdog.timeout = timeout_seconds;
    watchdog.io_timeout = io_timeout_seconds;
    watchdog.comm = MPI_COMM_NULL;
    if (grid.thread_level >= MPI_THREAD_MULTIPLE) mpiCheck(MPI_Comm_dup(MPI_COMM_WORLD, &watchdog.comm));
    // every rank's host and pid to rank 0 (all ranks start the watchdog with the same timeout)
    char host[64];
    int pid = (int)getpid();
    snprintf(host, sizeof(host), "%.63s", grid.host);
    if (grid.world_rank == 0) {
        watchdog.hosts = (char(*)[64])callocCheck(grid.world_size, 64);
        watchdog.pids = (int*)callocCheck(grid.world_size, sizeof(int));
    }
    mpiCheck(MPI_Gather(host, 64, MPI_CHAR, watchdog.hosts, 64, MPI_CHAR, 0, MPI_COMM_WORLD));
    mpiCheck(MPI_Gather(&pid, 1, MPI_INT, watchdog.pids, 1, MPI_INT, 0, MPI_COMM_WORLD));
    activity_phase("setup", -1, -1);
    pthread_t thread;
    if (pthread_create(&thread, NULL, watchdog_main, NULL) != 0) fail("cannot start the watchdog thread");
    pthread_detach(thread);
}

// ----------------------------------------------------------------------------
// collectives on device buffers: one wrapper per operation; a group of one returns at once
// Each counts the bytes this rank sends as the ring algorithms do (Patarasuk & Yuan 2009):
// an all-reduce sends 2 (g-1)/g of the buffer, a reduce-scatter or all-gather (g-1)/g.

typedef enum { AS_FLOATX, AS_FLOAT } Elem;
typedef enum { REDUCE_SUM, REDUCE_MAX } Reduction;

static size_t elem_bytes(Elem e) { return e == AS_FLOATX ? sizeof(floatX) : sizeof(float); }

#ifdef __CUDACC__
static ncclDataType_t nccl_type(Elem e) { return e == AS_FLOATX ? NCCL_FLOATX : ncclFloat; }
#endif

static void all_reduce(Group* g, void* buf, size_t n, Elem elem, Reduction op) {
    if (g->size <= 1) return;
    g->bytes_sent += 2.0 * (g->size - 1) / g->size * n * elem_bytes(elem);
    wait_begin("all-reduce", g, -1);
#ifdef __CUDACC__
    ncclCheck(ncclAllReduce(buf, buf, n, nccl_type(elem), op == REDUCE_SUM ? ncclSum : ncclMax, g->nccl, 0));
#else
    (void)elem;   // floatX is float on the CPU build
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, op == REDUCE_SUM ? MPI_SUM : MPI_MAX, g->mpi));
#endif
    wait_end();
}

// out[shard] = sum over the group of in[rank * shard .. +shard): fp32 gradients
static void reduce_scatter(Group* g, const float* in, float* out, size_t shard) {
    g->bytes_sent += (double)(g->size - 1) * shard * sizeof(float);
    wait_begin("reduce-scatter", g, -1);
#ifdef __CUDACC__
    ncclCheck(ncclReduceScatter(in, out, shard, ncclFloat, ncclSum, g->nccl, 0));
#else
    mpiCheck(MPI_Reduce_scatter_block(in, out, (int)shard, MPI_FLOAT, MPI_SUM, g->mpi));
#endif
    wait_end();
}

// out[n] on rank `root` = sum over the group of in[n] (out is not touched elsewhere): fp32
// gradients, queued on the communication stream (the CPU build: done when it returns). A ring
// or chain reduce has every rank but the root send the buffer once.
static void reduce_to(Group* g, const float* in, float* out, size_t n, int root) {
    if (g->rank != root) g->bytes_sent += (double)n * sizeof(float);
    wait_begin("reduce", g, -1);
#ifdef __CUDACC__
    ncclCheck(ncclReduce(in, out, n, ncclFloat, ncclSum, root, g->nccl, comm_stream));
#else
    mpiCheck(MPI_Reduce(in, out, (int)n, MPI_FLOAT, MPI_SUM, root, g->mpi));
#endif
    wait_end();
}

// buf[n] of rank `root` copied to the group's other ranks, in place: floatX parameters, queued
// on the communication stream (the CPU build: done when it returns). A ring broadcast has
// every rank but the one before the root send the buffer once.
static void broadcast_from(Group* g, floatX* buf, size_t n, int root) {
    if (g->rank != (root + g->size - 1) % g->size) g->bytes_sent += (double)n * sizeof(floatX);
    wait_begin("broadcast", g, -1);
#ifdef __CUDACC__
    ncclCheck(ncclBroadcast(buf, buf, n, NCCL_FLOATX, root, g->nccl, comm_stream));
#else
    mpiCheck(MPI_Bcast(buf, (int)n, MPI_FLOAT, root, g->mpi));
#endif
    wait_end();
}

// in place: every rank's shard buf[rank * shard .. +shard) is copied to all the others
static void all_gather(Group* g, floatX* buf, size_t shard) {
    if (g->size <= 1) return;
    g->bytes_sent += (double)(g->size - 1) * shard * sizeof(floatX);
    wait_begin("all-gather", g, -1);
#ifdef __CUDACC__
    ncclCheck(ncclAllGather(buf + g->rank * shard, buf, shard, NCCL_FLOATX, g->nccl, 0));
#else
    mpiCheck(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)shard, MPI_FLOAT, g->mpi));
#endif
    wait_end();
}

// host values (a norm, a loss, a flag) go over MPI in both builds: NCCL reads device memory only
static void all_reduce_host(Group* g, double* x, int n, Reduction op) {
    if (g->size <= 1) return;
    wait_begin("all-reduce (host values)", g, -1);
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, op == REDUCE_SUM ? MPI_SUM : MPI_MAX, g->mpi));
    wait_end();
}

// the largest of every rank's v (a stop request, a count), known to every rank
static int max_over_world(int v) {
    double x = v;
    all_reduce_host(&grid.world, &x, 1, REDUCE_MAX);
    return (int)x;
}

// A verdict each rank reaches on its own (its flags, a file its host may not see): every rank
// calls this at the same point with its own error line, "" for none. If any rank failed, every
// rank exits with status 2 and one line says why: rank 0's when every rank failed (the same
// input, the same verdict), else the first failing rank's, with its host and coordinates.
static void config_error_anywhere(const char* err) {
    int first_failed = grid.world_size - max_over_world(err[0] ? grid.world_size - grid.world_rank : 0);
    if (first_failed == grid.world_size) return;
    int all_failed = !max_over_world(!err[0]);
    if (all_failed) config_error("%s", err);
    config_error_on(first_failed, "%s", err);
}

// bitwise or of every rank's words (checksums each computed by one rank, zero elsewhere)
static void all_reduce_or(Group* g, uint32_t* x, int n) {
    wait_begin("all-reduce (checksums)", g, -1);
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_UINT32_T, MPI_BOR, g->mpi));
    wait_end();
}

static void broadcast_host(Group* g, void* buf, size_t bytes, int root) {
    wait_begin("broadcast", g, -1);
    mpiCheck(MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, g->mpi));
    wait_end();
}

// rank 0 of the group receives every rank's n doubles, in rank order
static void gather_to_rank0(Group* g, const double* mine, double* all, int n) {
    wait_begin("gather", g, -1);
    mpiCheck(MPI_Gather(mine, n, MPI_DOUBLE, all, n, MPI_DOUBLE, 0, g->mpi));
    wait_end();
}

// every rank receives every rank's bytes, in rank order
static void all_gather_host(Group* g, const void* mine, void* all, size_t bytes) {
    wait_begin("all-gather (host values)", g, -1);
    mpiCheck(MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, g->mpi));
    wait_end();
}

static void barrier(Group* g) {
    wait_begin("barrier", g, -1);
    mpiCheck(MPI_Barrier(g->mpi));
    wait_end();
}

// ----------------------------------------------------------------------------
// Slow ranks: every log interval each rank's compute time per step (the step's wall time less
// the time it waited in blocking operations) is gathered on rank 0 (one small collective).
// Ranks of one pipeline stage do the same work, so each is held against the median of its
// stage: above threshold x the median, one line names it (rank, host, coordinates, its time,
// the median).

// the median of n values (sorted in place)
static int compare_doubles(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}
static double median_of(double* x, int n) {
    qsort(x, n, sizeof(double), compare_doubles);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static void slow_rank_report(double compute_per_step, double wait_per_step, float threshold) {
    static char (*hosts)[64] = NULL;   // every rank's host name, gathered once
    int n = grid.world_size, per_stage = grid.tp_size * grid.dp_size;
    if (!hosts) {
        hosts = (char (*)[64])callocCheck(n, 64);
        char mine[64];
        snprintf(mine, sizeof(mine), "%.63s", grid.host);
        all_gather_host(&grid.world, mine, hosts, 64);
    }
    double mine[2] = {compute_per_step, wait_per_step};
    double* all = (double*)mallocCheck(2 * sizeof(double) * n);
    gather_to_rank0(&grid.world, mine, all, 2);
    double* stage = (double*)mallocCheck(sizeof(double) * per_stage);
    for (int r = 0; r < n && grid.world_rank == 0 && threshold > 0.0f; r++) {
        int first = r / per_stage * per_stage;
        for (int k = 0; k < per_stage; k++) stage[k] = all[2 * (first + k)];
        double median = median_of(stage, per_stage), ms = 1000.0;
        if (per_stage < 2 || all[2 * r] <= threshold * median) continue;
        char coords[64];
        coordinates_of(r, coords, sizeof(coords));
        printf("slow rank: rank %d on %s %s computes %.1f ms per step, %.1fx the median of its pipeline stage "
               "(%.1f ms; --slow-rank-threshold %.2g); it waits %.1f ms per step\n", r, hosts[r], coords,
               all[2 * r] * ms, all[2 * r] / median, median * ms, threshold, all[2 * r + 1] * ms);
    }
    fflush(stdout);
    free(stage);
    free(all);
}

// a barrier whose ranks sleep while they wait instead of spinning, leaving the cores to ranks
// that work meanwhile (where ranks share a host's cores); it lets them go up to 50 us late
static void barrier_sleeping(Group* g) {
    wait_begin("barrier", g, -1);
    MPI_Request request;
    mpiCheck(MPI_Ibarrier(g->mpi, &request));
    struct timespec nap = {0, 50000};
    for (int done = 0; !done;) {
        mpiCheck(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
        if (!done) nanosleep(&nap, NULL);
    }
    wait_end();
}

// ----------------------------------------------------------------------------
// Megatron's tensor-parallel operators (Shoeybi et al. 2019, §3, Fig. 3), by Megatron's names
// f = copy_to_tensor_model_parallel_region: the identity forward (every tensor rank already
//     holds the whole input of a column-parallel layer), an all-reduce of the input's
//     gradient backward (each rank computed a part of it);
// g = reduce_from_tensor_model_parallel_region: an all-reduce forward (the partial outputs of
//     a row-parallel layer, or of the vocab-parallel embedding, are summed), the identity
//     backward. With one tensor rank each does nothing. The forward of f and the backward of
//     g are the identity, so only these two calls appear in gpt.h.
static void copy_to_tensor_model_parallel_region_backward(floatX* dx, size_t n) {
    all_reduce(&grid.tp, dx, n, AS_FLOATX, REDUCE_SUM);
}
static void reduce_from_tensor_model_parallel_region(floatX* x, size_t n) {
    all_reduce(&grid.tp, x, n, AS_FLOATX, REDUCE_SUM);
}
// vocab-parallel cross-entropy (Megatron's _VocabParallelCrossEntropy): each tensor rank holds
// a slice of the logits; the row maxima, then the sums of exponentials and target logits, are
// reduced over the tensor ranks, so no rank ever holds a whole row of logits
static void vocab_parallel_max(float* row_max, size_t n) { all_reduce(&grid.tp, row_max, n, AS_FLOAT, REDUCE_MAX); }
static void vocab_parallel_sum(float* sums, size_t n) { all_reduce(&grid.tp, sums, n, AS_FLOAT, REDUCE_SUM); }

// ----------------------------------------------------------------------------
// files every rank of the world writes and reads at once (MPI-IO): each rank its own ranges
// (open, set_size, sync and close are collective: every rank calls them together)

static int shared_file_open(const char* path, int writing, MPI_File* f) {
    int mode = writing ? MPI_MODE_CREATE | MPI_MODE_RDWR : MPI_MODE_RDONLY;
    wait_begin("opening a checkpoint file", &grid.world, -1);
    int rc = MPI_File_open(grid.world.mpi, path, mode, MPI_INFO_NULL, f) == MPI_SUCCESS ? 0 : -1;
    wait_end();
    return rc;
}
static int shared_file_set_size(MPI_File f, size_t bytes) {   // 1: done
    return MPI_File_set_size(f, (MPI_Offset)bytes) == MPI_SUCCESS;
}
static int shared_file_sync(MPI_File f) {   // 1: synced
    wait_begin("syncing a checkpoint file", &grid.world, -1);
    int synced = MPI_File_sync(f) == MPI_SUCCESS;
    wait_end();
    return synced;
}
static void shared_file_close(MPI_File* f) {
    wait_begin("closing a checkpoint file", &grid.world, -1);
    mpiCheck(MPI_File_close(f));
    wait_end();
}
// bytes at offset to (writing) or from the file, in pieces of at most 1 GiB (MPI counts are
// ints). 0, or -1 when MPI reports an error or moved fewer bytes. (Open MPI's ompio has been
// seen to report success for a write the disk refused: checkpoint.h reads every write back.)
static int shared_file_io(MPI_File f, size_t offset, void* buf, size_t bytes, int writing) {
    for (size_t done = 0, n; done < bytes; done += n) {
        n = bytes - done < ((size_t)1 << 30) ? bytes - done : (size_t)1 << 30;
        MPI_Offset at = (MPI_Offset)(offset + done);
        MPI_Status status;
        int count = 0, rc = writing ? MPI_File_write_at(f, at, (char*)buf + done, (int)n, MPI_BYTE, &status)
                                    : MPI_File_read_at(f, at, (char*)buf + done, (int)n, MPI_BYTE, &status);
        if (rc != MPI_SUCCESS || MPI_Get_count(&status, MPI_BYTE, &count) != MPI_SUCCESS || count != (int)n) return -1;
        activity_progress();
    }
    return 0;
}

// rank 0 of the group receives every rank's bytes, one after another in rank order (malloc'd,
// *total bytes); NULL elsewhere
static void* gather_bytes_to_rank0(Group* g, const void* mine, int bytes, size_t* total) {
    int* counts = (int*)callocCheck(g->size, sizeof(int));
    int* starts = (int*)callocCheck(g->size, sizeof(int));
    mpiCheck(MPI_Gather(&bytes, 1, MPI_INT, counts, 1, MPI_INT, 0, g->mpi));
    *total = 0;
    for (int r = 0; r < g->size; r++) {
        starts[r] = (int)*total;
        *total += counts[r];
    }
    char* all = g->rank == 0 ? (char*)mallocCheck(*total) : NULL;
    mpiCheck(MPI_Gatherv(mine, bytes, MPI_BYTE, all, counts, starts, MPI_BYTE, 0, g->mpi));
    free(counts);
    free(starts);
    return all;
}

// ----------------------------------------------------------------------------
// point-to-point between pipeline neighbours
// One exchange posts a send and/or a receive and waits for both (on the GPU, one NCCL
// group), so a stage that sends forward while its neighbour sends backward never waits on
// itself. A neighbour of -1 (beyond the first or last stage) means nothing to do, so the
// schedule below needs no first/last-stage branches.
//
// On the GPU build the exchanges go on the communication stream (Megatron's
// --no-overlap-p2p-communication keeps them on the compute stream), each after the kernels
// queued before it (they wrote what it sends and last read the buffer it receives into).
// The compute stream waits for the exchanges only where it must: at once after one that
// receives (the next kernel reads what arrives; 1F1B has nothing else to do meanwhile);
// before it rewrites a buffer that a send alone still reads (a slot's output before the
// slot's next forward, dres before the next backward); and at the end of the schedule. So a
// send alone (stage 0's warm-up outputs, a stage's last gradient) runs beside the next
// kernels. All exchanges share one stream: a send and a receive to one neighbour must stay
// in one NCCL group, in the same order on both sides. The CPU build (MPI) waits for each.

typedef struct {
    int overlap;                 // exchanges on the communication stream (GPU build, PP > 1)
    StreamEvent data_written;    // compute -> communication: what a send reads is written
    StreamEvent exchanged;       // communication -> compute: the exchanges so far are done
    const floatX** unsent;       // buffers of sends the compute stream has not waited for
    int num_unsent, max_unsent;
} PipelineLink;
static PipelineLink pipeline_link;   // one per process, as the grid

// `max_unsent`: the most sends in flight before a receive (the slots, and dres)
static void pipeline_link_init(int overlap, int max_unsent) {
    PipelineLink* l = &pipeline_link;
    memset(l, 0, sizeof(*l));
    l->overlap = overlap && GPU_BUILD && grid.pp_size > 1;
    if (!l->overlap) return;
    l->unsent = (const floatX**)mallocCheck(max_unsent * sizeof(const floatX*));
    l->max_unsent = max_unsent;
    stream_event_create(&l->data_written);
    stream_event_create(&l->exchanged);
}

static void pipeline_link_free(void) {
    PipelineLink* l = &pipeline_link;
    if (!l->overlap) return;
    free(l->unsent);
    stream_event_destroy(&l->data_written);
    stream_event_destroy(&l->exchanged);
    memset(l, 0, sizeof(*l));
}

// the compute stream waits for every exchange queued so far (and what the communication
// stream holds before them)
static void wait_for_exchanges(void) {
    PipelineLink* l = &pipeline_link;
    if (!l->overlap) return;
    compute_waits_for_comm(&l->exchanged);
    l->num_unsent = 0;
}

// the compute stream is about to write buf: first the sends that read it must be done
static void pipeline_before_writing(const floatX* buf) {
    PipelineLink* l = &pipeline_link;
    for (int i = 0; i < l->num_unsent; i++)
        if (l->unsent[i] == buf) {
            wait_for_exchanges();
            return;
        }
}

// a send alone: the compute stream need not wait for it until it rewrites buf
static void remember_unsent(const floatX* buf) {
    PipelineLink* l = &pipeline_link;
    if (l->num_unsent == l->max_unsent) wait_for_exchanges();   // (not in 1F1B: a receive comes first)
    l->unsent[l->num_unsent++] = buf;
}

static void pipeline_exchange(const floatX* send, int send_to, floatX* recv, int recv_from, size_t n) {
    Group* g = &grid.pp;
    PipelineLink* l = &pipeline_link;
    if (send_to < 0) send = NULL;
    if (recv_from < 0) recv = NULL;
    if (!send && !recv) return;
    if (send) g->bytes_sent += (double)n * sizeof(floatX);
    int peer = recv ? recv_from : send_to, TPxDP = grid.tp_size * grid.dp_size;   // the stage's world rank, same tp, dp
    wait_begin(send && recv ? "send and receive" : send ? "send" : "receive", g, grid.world_rank + (peer - grid.pp_rank) * TPxDP);
#ifdef __CUDACC__
    cudaStream_t stream = l->overlap ? comm_stream : 0;
    if (l->overlap) comm_waits_for_compute(&l->data_written);
    ncclCheck(ncclGroupStart());
    if (send) ncclCheck(ncclSend(send, n, NCCL_FLOATX, send_to, g->nccl, stream));
    if (recv) ncclCheck(ncclRecv(recv, n, NCCL_FLOATX, recv_from, g->nccl, stream));
    ncclCheck(ncclGroupEnd());
#else
    MPI_Request req[2];
    int k = 0;
    if (send) mpiCheck(MPI_Isend(send, (int)n, MPI_FLOAT, send_to, 0, g->mpi, &req[k++]));
    if (recv) mpiCheck(MPI_Irecv(recv, (int)n, MPI_FLOAT, recv_from, 0, g->mpi, &req[k++]));
    mpiCheck(MPI_Waitall(k, req, MPI_STATUSES_IGNORE));
#endif
    if (l->overlap && recv) wait_for_exchanges();   // the next kernel reads what arrives
    else if (l->overlap) remember_unsent(send);
    wait_end();
}

static int next_stage(void) { return grid.pp_rank + 1 < grid.pp_size ? grid.pp_rank + 1 : -1; }
static int prev_stage(void) { return grid.pp_rank - 1; }

static void recv_forward(floatX* x, size_t n) { pipeline_exchange(NULL, -1, x, prev_stage(), n); }
static void send_forward(const floatX* x, size_t n) { pipeline_exchange(x, next_stage(), NULL, -1, n); }
static void recv_backward(floatX* dx, size_t n) { pipeline_exchange(NULL, -1, dx, next_stage(), n); }
static void send_backward(const floatX* dx, size_t n) { pipeline_exchange(dx, prev_stage(), NULL, -1, n); }
static void send_forward_recv_backward(const floatX* x, floatX* dx, size_t n) {
    pipeline_exchange(x, next_stage(), dx, next_stage(), n);
}
static void send_backward_recv_forward(const floatX* dx, floatX* x, size_t n) {
    pipeline_exchange(dx, prev_stage(), x, prev_stage(), n);
}
// one output on to the next stage while the next input comes in from the previous one
static void send_forward_recv_forward(const floatX* x, floatX* next_x, size_t n) {
    pipeline_exchange(x, next_stage(), next_x, prev_stage(), n);
}

// ----------------------------------------------------------------------------
// the gradient reduction over DP, overlapped with the last backward (--overlap-grad-reduce,
// Megatron-LM's flag; DeepSpeed's ZeRO reduces its gradient buckets the same way)
// Without overlap the step's gradients are reduce-scattered once the last micro-batch's
// backward is over: all of it on the critical path. With it, the flat gradient buffer is cut
// into buckets of whole tensors, from its end (the last layers, whose gradients are final
// first in the backward) towards its start. While the last micro-batch's backward runs, a
// bucket is queued on the communication stream as soon as the backward has finished its
// lowest layer: the part of it in rank r's ZeRO shard is summed onto rank r (a reduce with
// root r), so each rank ends with what the reduce-scatter gave it, bytes sent included. The
// embedding's bucket goes last, after the tied embedding's all-reduce. Nothing else changes:
// the buckets are a plan over the buffer, no memory of their own.

// [lo, hi) = [a, b) ∩ [c, d) (empty when lo >= hi)
static void intersect_ranges(size_t a, size_t b, size_t c, size_t d, size_t* lo, size_t* hi) {
    *lo = a > c ? a : c;
    *hi = b < d ? b : d;
}

typedef struct {
    size_t start, end;   // [start, end) of the flat gradient buffer
    int lowest_layer;    // final once the backward has finished this layer (-1: the embedding's bucket)
} GradBucket;

// [lo, hi): the part of bucket b inside DP rank q's shard of `shard` elements; 0 when empty
static int bucket_part(const GradBucket* b, size_t shard, int q, size_t* lo, size_t* hi) {
    intersect_ranges(b->start, b->end, q * shard, (q + 1) * shard, lo, hi);
    return *lo < *hi;
}

// Cut [0, padded) into buckets: from the top, whole tensors until a bucket holds at least
// `bucket_size` elements; the embedding's tensors (layer -1, at the start) in a last bucket of
// their own; the padding with the top bucket. `out` has room for one per tensor; returns how many.
static int grad_buckets(const GPT* m, size_t bucket_size, GradBucket* out) {
    int count = 0;
    size_t end = m->num_params_padded;
    for (int i = m->num_tensors - 1; i >= 0; i--) {
        const TensorDesc* t = &m->tensors[i];
        int last_of_bucket = i == 0 || (t->layer >= 0 && m->tensors[i - 1].layer < 0) ||
                             (t->layer >= 0 && end - t->offset >= bucket_size);
        if (!last_of_bucket) continue;
        GradBucket b = {i == 0 ? 0 : t->offset, end, t->layer};
        out[count++] = b;
        end = b.start;
    }
    return count;
}

typedef struct {
    int enabled;             // --overlap-grad-reduce with DP > 1
    GradBucket* buckets;     // in the order they are launched
    int num_buckets, launched;
    int armed;               // the last micro-batch's backward is running
    float* grads;            // the whole flat buffer ...
    float* shard_grad;       // ... and this rank's reduced shard of it
    size_t shard_size;
    StreamEvent grads_written, reduced;
} GradReducer;
static GradReducer grad_reducer;   // one per process, as the grid: gpt.h's backward calls in

static void grad_reducer_init(const GPT* m, float* shard_grad, size_t shard_size, int overlap, size_t bucket_size) {
    GradReducer* r = &grad_reducer;
    memset(r, 0, sizeof(*r));
    r->enabled = overlap && grid.dp_size > 1;
    if (!r->enabled) return;
    r->buckets = (GradBucket*)mallocCheck((m->num_tensors + 1) * sizeof(GradBucket));
    r->num_buckets = grad_buckets(m, bucket_size, r->buckets);
    r->grads = m->grads;
    r->shard_grad = shard_grad;
    r->shard_size = shard_size;
    stream_event_create(&r->grads_written);
    stream_event_create(&r->reduced);
}

static void grad_reducer_free(void) {
    GradReducer* r = &grad_reducer;
    if (!r->enabled) return;
    free(r->buckets);
    stream_event_destroy(&r->grads_written);
    stream_event_destroy(&r->reduced);
    memset(r, 0, sizeof(*r));
}

// queue bucket b's reduces on the communication stream, after the kernels that wrote it
static void reduce_bucket(GradReducer* r, const GradBucket* b) {
    comm_waits_for_compute(&r->grads_written);
    for (int q = 0; q < grid.dp_size; q++) {   // the part of b in each rank's shard, onto that rank
        size_t lo, hi;
        if (bucket_part(b, r->shard_size, q, &lo, &hi))
            reduce_to(&grid.dp, r->grads + lo, r->shard_grad + (lo - q * r->shard_size), hi - lo, q);
    }
}

// the backward (of any micro-batch) has finished `layer`: in the last one, launch the buckets
// that are final now (gpt.h calls this)
static void gradients_final_down_to(int layer) {
    GradReducer* r = &grad_reducer;
    if (!r->armed) return;
    while (r->launched < r->num_buckets && r->buckets[r->launched].lowest_layer >= layer)   // layer >= 0
        reduce_bucket(r, &r->buckets[r->launched++]);
}

// after the tied embedding's all-reduce: the buckets left (the embedding's), then the compute
// stream waits for every reduce before anything reads the shard or writes the gradients again
static void grad_reducer_finish(void) {
    GradReducer* r = &grad_reducer;
    while (r->launched < r->num_buckets) reduce_bucket(r, &r->buckets[r->launched++]);
    compute_waits_for_comm(&r->reduced);
    r->armed = 0;
    r->launched = 0;
}

// ----------------------------------------------------------------------------
// ZeRO-1's parameter all-gather beside the next forward (--overlap-param-gather, Megatron-LM's flag)
// Without it the updated parameters are all-gathered right after AdamW, on the critical path.
// With it, the gradient reduction's buckets (grad_buckets), taken from the buffer's start
// (the embedding, then the layers in the order the forward needs them), are each queued on
// the communication stream after AdamW: the part of a bucket in rank r's shard is broadcast
// from rank r, so every rank ends with the all-gather's buffer, bytes sent included. The
// next forward, of training or of evaluation, waits before each layer only for the buckets
// that hold it and the ones before (gpt.h calls parameters_needed); whatever else reads the
// parameters first waits for them all (param_gather_finish). No device memory of its own.

typedef struct {
    int enabled;             // --overlap-param-gather with DP > 1
    GradBucket* buckets;     // in the order they are gathered: from the buffer's start
    StreamEvent* gathered;   // [bucket]: marked on the communication stream after its broadcasts
    int num_buckets, waited; // the compute stream has waited for buckets [0, waited)
    floatX* params;          // the whole flat buffer, of which this rank updated its shard
    size_t shard_size;
    StreamEvent updated;     // compute -> communication: AdamW has written the shard
} ParamGatherer;
static ParamGatherer param_gatherer;   // one per process, as the grid: gpt.h's forward calls in

static void param_gatherer_init(const GPT* m, size_t shard_size, int overlap, size_t bucket_size) {
    ParamGatherer* g = &param_gatherer;
    memset(g, 0, sizeof(*g));
    g->enabled = overlap && grid.dp_size > 1;
    if (!g->enabled) return;
    GradBucket* from_end = (GradBucket*)mallocCheck((m->num_tensors + 1) * sizeof(GradBucket));
    g->num_buckets = grad_buckets(m, bucket_size, from_end);
    g->buckets = (GradBucket*)mallocCheck(g->num_buckets * sizeof(GradBucket));
    g->gathered = (StreamEvent*)mallocCheck(g->num_buckets * sizeof(StreamEvent));
    for (int k = 0; k < g->num_buckets; k++) {
        g->buckets[k] = from_end[g->num_buckets - 1 - k];
        stream_event_create(&g->gathered[k]);
    }
    free(from_end);
    g->waited = g->num_buckets;   // nothing in flight
    g->params = m->params;
    g->shard_size = shard_size;
    stream_event_create(&g->updated);
}

// after AdamW: every bucket's broadcasts queued on the communication stream, in order
static void param_gather_launch(void) {
    ParamGatherer* g = &param_gatherer;
    comm_waits_for_compute(&g->updated);
    for (int k = 0; k < g->num_buckets; k++) {
        const GradBucket* b = &g->buckets[k];
        for (int q = 0; q < grid.dp_size; q++) {   // the part of b in each rank's shard, from that rank
            size_t lo, hi;
            if (bucket_part(b, g->shard_size, q, &lo, &hi)) broadcast_from(&grid.dp, g->params + lo, hi - lo, q);
        }
        comm_mark(&g->gathered[k]);
    }
    g->waited = 0;
}

// the forward is about to read `layer`'s parameters (-1: the embedding's): the compute stream
// waits for the buckets up to the last one holding some of them (gpt.h calls this)
static void parameters_needed(int layer) {
    ParamGatherer* g = &param_gatherer;
    int k = g->waited;
    while (k < g->num_buckets && g->buckets[k].lowest_layer <= layer) k++;
    if (k == g->waited) return;
    compute_waits_for_mark(&g->gathered[k - 1]);
    g->waited = k;
}

// everything gathered before anything but the forward reads the parameters (or AdamW writes them)
static void param_gather_finish(void) { parameters_needed(INT_MAX); }

static void param_gatherer_free(void) {
    ParamGatherer* g = &param_gatherer;
    if (!g->enabled) return;
    param_gather_finish();   // the last step's broadcasts, if no forward came after them
    dev_synchronize();
    for (int k = 0; k < g->num_buckets; k++) stream_event_destroy(&g->gathered[k]);
    stream_event_destroy(&g->updated);
    free(g->buckets);
    free(g->gathered);
    memset(g, 0, sizeof(*g));
}

// ----------------------------------------------------------------------------
// the schedule of one step: 1F1B (PipeDream-flush; Narayanan et al. 2021, Fig. 4)
// Stage p of P runs min(P - p - 1, M) warm-up forwards, then alternates one forward and
// one backward, then drains the backwards it still owes. A stage never holds more than P
// micro-batches' activations, whatever the number of micro-batches M. With one stage it
// is simply forward, backward, forward, backward, ... (Megatron's no-pipelining schedule).
// Each token's loss enters the gradient with weight dloss = 1 / (tokens in the global
// batch), so summing gradients over micro-batches and data-parallel ranks gives the mean.

typedef void (*LoadMicroBatch)(void* ctx, int micro_batch, int* tokens, int* targets);

typedef struct {
    GPT* model;
    LoadMicroBatch load;
    void* ctx;
    float dloss;
    int in_flight, max_in_flight;
} Schedule;

static size_t hidden_elems(const GPT* m) { return (size_t)m->B * m->T * m->cfg.hidden_size; }
static MicroBatchActivations* slot_of(const Schedule* s, int micro) { return &s->model->slots[micro % s->model->num_slots]; }

static void forward_step(Schedule* s, int micro) {
    GPT* m = s->model;
    activity_phase("forward", activity.iteration, micro);
    MicroBatchActivations* a = slot_of(s, micro);
    if (m->is_first_stage || m->is_last_stage) s->load(s->ctx, micro, a->tokens, a->targets);
    pipeline_before_writing(stage_output(m, a));   // the slot's last output may still be on its way
    gpt_forward_stage(m, micro % m->num_slots);
    if (m->is_last_stage) loss_mean_add(m->loss_sum, m->losses, m->B * m->T);   // no host copy per micro-batch
    if (++s->in_flight > s->max_in_flight) s->max_in_flight = s->in_flight;
}

// micro-batch `micro` of M: the last one adds the gradients' last terms (the overlap's cue)
static void backward_step(Schedule* s, int micro, int M) {
    activity_phase("backward", activity.iteration, micro);
    grad_reducer.armed = grad_reducer.enabled && micro == M - 1;
    pipeline_before_writing(s->model->dres);   // (in 1F1B an exchange that receives comes between)
    gpt_backward(s->model, micro % s->model->num_slots, s->dloss);
    s->in_flight--;
}

static void run_1f1b(Schedule* s, int M) {
    GPT* m = s->model;
    size_t n = hidden_elems(m);
    int warmup = grid.pp_size - grid.pp_rank - 1;
    if (warmup > M) warmup = M;
    int steady = M - warmup, fwd = 0, bwd = 0;
    // warm-up: each output goes on while the next input comes in (one exchange, not two)
    if (M > 0) recv_forward(slot_of(s, 0)->input, n);
    for (int i = 0; i < warmup; i++, fwd++) {
        forward_step(s, fwd);
        send_forward_recv_forward(stage_output(m, slot_of(s, fwd)), fwd + 1 < M ? slot_of(s, fwd + 1)->input : NULL, n);
    }
    // steady 1F1B
    for (int i = 0; i < steady; i++, fwd++, bwd++) {
        forward_step(s, fwd);
        send_forward_recv_backward(stage_output(m, slot_of(s, fwd)), m->dres, n);
        backward_step(s, bwd, M);
        if (i == steady - 1) send_backward(m->dres, n);
        else send_backward_recv_forward(m->dres, slot_of(s, fwd + 1)->input, n);
    }
    // cool-down
    for (int i = 0; i < warmup; i++, bwd++) {
        recv_backward(m->dres, n);
        backward_step(s, bwd, M);
        send_backward(m->dres, n);
    }
    wait_for_exchanges();   // the step's own work: none of it left queued behind the optimizer
}

// forward only, for evaluation
static void run_forward_only(Schedule* s, int M) {
    size_t n = hidden_elems(s->model);
    for (int i = 0; i < M; i++) {
        recv_forward(slot_of(s, i)->input, n);
        forward_step(s, i);
        s->in_flight--;
        send_forward(stage_output(s->model, slot_of(s, i)), n);
    }
    wait_for_exchanges();
}

// The mean loss of the step, known on every rank: the last stage's sum, over the pipeline
// (other stages add 0) and averaged over data-parallel ranks.
static float step_loss(const Schedule* s, int M) {
    const GPT* m = s->model;
    double loss = 0.0;
    if (m->is_last_stage) {   // the one read of the losses this step
        dev_to_host(&loss, m->loss_sum, sizeof(double));
        dev_zero(m->loss_sum, sizeof(double));
        loss /= M;
    }
    all_reduce_host(&grid.pp, &loss, 1, REDUCE_SUM);
    all_reduce_host(&grid.dp, &loss, 1, REDUCE_SUM);
    return (float)(loss / grid.dp_size);
}

// ----------------------------------------------------------------------------
// optimizer: ZeRO-1 AdamW (Rajbhandari et al. 2020, stage 1)
// Every rank keeps the whole model of its (tp, pp) slot in floatX and its fp32 gradients,
// but the fp32 master weights and the Adam moments only for its 1/DP shard of the flat
// buffer (padded to a multiple of DP). A step: reduce-scatter the gradients (each rank gets
// the summed gradient of its shard), the global norm over all shards, AdamW on the shard,
// all-gather the updated parameters.

typedef struct {
    float beta1, beta2, eps, weight_decay, clip_grad;
} AdamWConfig;

// Megatron's loss scaler for fp16 (Micikevicius et al. 2018): the loss is multiplied by
// `scale` before the backward, so that small gradients do not underflow fp16, and the
// gradients are divided by it before the norm. A step whose gradients overflow (their norm
// is not finite) is skipped. Dynamic scaling (Megatron's DynamicGradScaler): an overflow
// resets the run of clean steps and uses up one unit of hysteresis; with none left the
// scale halves (not below min_scale), and so on each further overflow; `window` clean steps
// in a row double it (while it stays finite: fp32's largest power of two is 2^127) and
// restore the hysteresis. Static (--loss-scale): the scale never
// changes. scale 1 and not dynamic: no scaling (bf16, fp32).
typedef struct {
    float scale;
    int dynamic;
    float min_scale;
    int window, hysteresis;
    int growth_tracker;       // clean steps since the last growth or overflow
    int hysteresis_tracker;   // overflows left before the scale halves
} LossScaler;

static void loss_scaler_update(LossScaler* s, int overflow) {
    if (!s->dynamic) return;
    if (overflow) {
        s->growth_tracker = 0;
        s->hysteresis_tracker--;
        if (s->hysteresis_tracker <= 0) s->scale = fmaxf(s->scale * 0.5f, s->min_scale);
    } else if (++s->growth_tracker == s->window) {
        s->growth_tracker = 0;
        s->hysteresis_tracker = s->hysteresis;
        if (isfinite(s->scale * 2.0f)) s->scale *= 2.0f;   // 2^128 would be inf, and inf / 2 stays inf
    }
}

typedef struct {
    size_t shard_start, shard_size;  // this rank's part of the padded flat buffer
    float* master;       // fp32 master weights of the shard (on the CPU build: the params themselves)
    float* grad;         // summed gradient of the shard (the gradient buffer itself when DP = 1)
    float* m;            // first moment, fp32, shard
    float* v;            // second moment, fp32, shard
    int step;            // updates applied so far
    LossScaler scaler;   // the gradients in model->grads are the loss's times scaler.scale
    double* norm_acc;    // device scalar for the gradient norm
    ShardRange* ranges;  // device table: the shard's part of each tensor, in order (shard_ranges)
    int num_ranges;
} AdamWState;

// [lo, hi): the part of tensor t inside this rank's shard (empty when lo >= hi)
static void shard_part(const AdamWState* s, const TensorDesc* t, size_t* lo, size_t* hi) {
    intersect_ranges(t->offset, t->offset + t->numel, s->shard_start, s->shard_start + s->shard_size, lo, hi);
}

// A parameter is counted once in the norm: a tensor replicated over tensor ranks only on
// tensor rank 0, and the tied embedding only on the first stage.
static int counts_in_norm(const GPT* m, const TensorDesc* t) {
    if (t->split_axis < 0 && m->tp_rank != 0) return 0;
    return !t->tied_copy;
}

// The shard's part of each tensor, in the flat buffer's order, as ShardRanges into `table`
// (room for one per tensor); returns how many
static int shard_ranges(const AdamWState* s, const GPT* model, ShardRange* table) {
    int count = 0;
    for (int i = 0; i < model->num_tensors; i++) {
        const TensorDesc* t = &model->tensors[i];
        size_t lo, hi;
        shard_part(s, t, &lo, &hi);
        if (lo >= hi) continue;
        ShardRange r = {lo - s->shard_start, hi - s->shard_start, t->weight_decay, counts_in_norm(model, t)};
        if (count > 0 && r.start < table[count - 1].end) fail("the tensor table is not in the flat buffer's order");
        table[count++] = r;
    }
    return count;
}

static void adamw_init(AdamWState* s, const GPT* model) {
    memset(s, 0, sizeof(*s));
    s->shard_size = model->num_params_padded / grid.dp_size;
    s->shard_start = grid.dp_rank * s->shard_size;
    size_t bytes = s->shard_size * sizeof(float);
    s->m = (float*)dev_malloc(bytes);
    s->v = (float*)dev_malloc(bytes);
    dev_zero(s->m, bytes);
    dev_zero(s->v, bytes);
    s->grad = grid.dp_size == 1 ? model->grads : (float*)dev_malloc(bytes);
    if (sizeof(floatX) == sizeof(float)) {
        s->master = (float*)model->params + s->shard_start;
    } else {   // as Megatron: the fp32 main params start as copies of the bf16 params
        float* host = (float*)mallocCheck(bytes);
        dev_floatX_to_floats(host, model->params + s->shard_start, s->shard_size);
        s->master = (float*)dev_malloc(bytes);
        host_to_dev(s->master, host, bytes);
        free(host);
    }
    s->norm_acc = (double*)dev_malloc(sizeof(double));
    ShardRange* table = (ShardRange*)mallocCheck(model->num_tensors * sizeof(ShardRange));
    s->num_ranges = shard_ranges(s, model, table);
    s->ranges = (ShardRange*)dev_malloc(model->num_tensors * sizeof(ShardRange));   // as planned: one per tensor
    host_to_dev(s->ranges, table, s->num_ranges * sizeof(ShardRange));
    free(table);
    s->scaler.scale = 1.0f;
}

static void adamw_free(AdamWState* s, const GPT* model) {
    dev_free(s->m);
    dev_free(s->v);
    if (s->grad != model->grads) dev_free(s->grad);
    if (sizeof(floatX) != sizeof(float)) dev_free(s->master);
    dev_free(s->norm_acc);
    dev_free(s->ranges);
}

// the bytes adamw_init allocates as state for a flat buffer of `padded` elements over DP ranks:
// the shard's two moments, its fp32 master where it is a copy (`master_copy`: floatX is not
// float, the GPU build), the reduce-scatter's gradient shard where DP > 1 (else the gradient
// buffer serves). The norm's scalar is a workspace: adamw_workspace_bytes.
static size_t adamw_state_bytes(size_t padded, int dp_size, int master_copy) {
    size_t shard = padded / dp_size * sizeof(float);
    return shard * (master_copy ? 3 : 2) + (dp_size > 1 ? shard : 0);
}

// the rest of what adamw_init allocates: norm_acc, the gradient norm's device scalar, and the
// shard's range table, room for one range per tensor (the same size on every rank)
static size_t adamw_workspace_bytes(int num_tensors) { return sizeof(double) + num_tensors * sizeof(ShardRange); }

static float global_grad_norm(AdamWState* s) {
    dev_zero(s->norm_acc, sizeof(double));
    sum_squares_ranges(s->norm_acc, s->grad, s->shard_size, s->ranges, s->num_ranges);
    double sq = 0.0;
    dev_to_host(&sq, s->norm_acc, sizeof(double));
    all_reduce_host(&grid.world, &sq, 1, REDUCE_SUM);
    return (float)sqrt(sq);
}

// Gradients of the whole step, times the loss scale, are in model->grads. Tied embedding,
// reduce-scatter, norm (of the unscaled gradients), the loss scaler's update, clipping
// (Megatron's clip_grad_norm: scale by clip / (norm + 1e-6) when below 1), AdamW on the
// shard with each tensor's decay, all-gather. A step whose gradient norm is not finite is
// skipped. Returns the norm before clipping. Unscaling is one more factor in the gradient
// multiplier AdamW applies anyway; for a power-of-two scale it changes no bit.
static float optimizer_step(GPT* model, AdamWState* s, const AdamWConfig* cfg, float lr, int* skipped) {
    if (grid.embedding.size > 1) {   // the two copies of the tied embedding get the sum
        const TensorDesc* wte = &model->tensors[model->wte];
        all_reduce(&grid.embedding, model->grads + wte->offset, wte->numel, AS_FLOAT, REDUCE_SUM);
    }
    param_gather_finish();   // (the forward waited for every bucket; a stage without layers did not)
    if (grad_reducer.enabled) grad_reducer_finish();   // reduced while the backward ran
    else if (grid.dp_size > 1) reduce_scatter(&grid.dp, model->grads, s->grad, s->shard_size);
    float unscale = 1.0f / s->scaler.scale;
    float norm = global_grad_norm(s) * unscale;
    *skipped = !isfinite(norm);
    loss_scaler_update(&s->scaler, *skipped);
    if (*skipped) return norm;
    float scale = unscale;
    if (cfg->clip_grad > 0.0f) {
        float clip_coeff = cfg->clip_grad / (norm + 1e-6f);
        if (clip_coeff < 1.0f) scale = unscale * clip_coeff;
    }
    s->step++;
    adamw_update_ranges(s->master, model->params + s->shard_start, s->grad, s->m, s->v, s->shard_size, s->ranges,
                        s->num_ranges, lr, cfg->beta1, cfg->beta2, cfg->eps, cfg->weight_decay, scale, s->step);
    if (param_gatherer.enabled) param_gather_launch();   // waited for by the next forward
    else all_gather(&grid.dp, model->params, s->shard_size);
    return norm;
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
    if (op == OP_REDUCE_SCATTER) reduce_scatter(g, (const float*)a, (float*)b, count / g->size);
    if (op == OP_ALL_GATHER) all_gather(g, (floatX*)a, count / g->size);
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
#define HOST_FIGURES 6
static void report_hosts(CheckReport* c) {
    static const char* const names[HOST_FIGURES] = {"matmul of its slowest rank (TFLOPs)", "median matmul of its ranks (TFLOPs)",
        "all-reduce busbw of its slowest TP group (GB/s)", "all-reduce busbw of its slowest DP group (GB/s)",
        "all-reduce busbw of its slowest PP group (GB/s)", "send/recv busbw of its slowest pipeline link (GB/s)"};
    static const CheckKind kinds[HOST_FIGURES - 2] = {CHECK_TP, CHECK_DP, CHECK_PP, CHECK_LINK};
    int W = c->W, H = 0, last = c->cc->num_sizes - 1;
    int* host_of = (int*)mallocCheck(W * sizeof(int));
    int* first_rank = (int*)mallocCheck(W * sizeof(int));   // of each host
    int* ranks = (int*)callocCheck(W, sizeof(int));          // on each host
    for (int q = 0; q < W; q++) {
        int h = 0;
        while (h < H && strcmp(c->r[first_rank[h]].host, c->r[q].host) != 0) h++;
        if (h == H) first_rank[H++] = q;
        host_of[q] = h;
        ranks[h]++;
    }
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
    for (int j = 0; j < HOST_FIGURES; j++)
        for (int h = 0; h < H; h++) {
            double median;
            if (!below_peers(&fig[j * H], H, h, &median)) continue;
            printf("slow host %s: %s %.4g, below %.1f x %.4g (the median of the other %d)\n", c->r[first_rank[h]].host,
                   names[j], fig[j * H + h], CHECK_OUTLIER, median, H - 1);
            c->named++;
        }
    free(host_of);
    free(first_rank);
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
    for (int k = 0; k < CHECK_KINDS; k++) report_kind(c, (CheckKind)k);
    report_matmul(c);
    report_hosts(c);
    char who[320];
    for (int q = 0; q < W && c->named_groups > 1; q++)   // a rank that every slow group shares
        if (c->named_in[q] == c->named_groups) printf("every slow group has %s in it\n", check_rank_name(c, q, who, sizeof(who)));
}

// Measures, then rank 0 prints the tables and names the outliers; every rank returns.
static void check_cluster(const ClusterCheck* cc) {
    double start = now_seconds();
    activity_phase("check-cluster", -1, -1);   // what the watchdog says if the check hangs
    if (grid.world_rank == 0) {
        printf("check-cluster: %d rank(s) as TP %d x PP %d x DP %d, %s build; one group at a time; each figure is the median "
               "of %d repetitions (after %d untimed) of the slowest member's time\n", grid.world_size, grid.tp_size,
               grid.pp_size, grid.dp_size, BUILD_NAME, CHECK_REPS, CHECK_WARMUP);
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
