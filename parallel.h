/*
parallel.h — everything that crosses a process boundary (the step built on it: data_parallel.h,
pipeline.h and step.h).

  - the process grid: world = TP x CP x DP x PP ranks in Megatron-LM's order (TP fastest, then
    CP, then DP, then PP: rank = tp + TP * (cp + CP * (dp + DP * pp))), one object every part
    asks for its coordinates and groups, and the one way a rank fails (naming rank, host and
    coordinates);
  - collectives over a group (Megatron's f and g by name) and exchanges between pipeline
    neighbours: MPI on the CPU build, NCCL on the GPU build (MPI only to start), counting bytes;
  - what each rank is doing (before every blocking operation) and how long it waited: what
    cluster.h's watchdog and slow-rank report read; the same marks feed --profile's spans,
    through the two hooks trace.h sets while it records (on_wait_begin, on_wait_end);
  - MPI-IO's shared files.

Rules it keeps: one wrapper per collective (MPI-IO's shared files too), and no MPI call in any
other file but start-up, shutdown and the watchdog's own channel (cluster.h); nobody else
computes a rank by hand.
*/
#pragma once
#include <dirent.h>
#include <errno.h>
#include <signal.h>
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
    int tp_size, cp_size, pp_size, dp_size;
    int tp_rank, cp_rank, pp_rank, dp_rank;
    Group world;
    Group tp, cp, dp, pp;                     // same (cp, dp, pp) / (tp, dp, pp) / (tp, cp, pp) / (tp, cp, dp)
    Group dp_cp;                              // same (tp, pp): the ranks one weight's gradient is summed over (DP x CP,
                                              // Megatron-LM's data-parallel group with context parallelism)
    int ep_size, ep_rank;                     // expert parallelism: the experts split over EP of the DP x CP ranks
    Group ep;                                 // same (tp, pp, expert_dp): the ranks whose experts a layer's tokens
                                              // go to (MPI_COMM_NULL at EP 1)
    Group expert_dp;                          // same (tp, pp, ep): the ranks holding the same experts, whose
                                              // gradients are summed (MPI_COMM_NULL at EP 1: DP x CP's)
    Group model_parallel;                     // all ranks with the same (cp, dp)
    Group embedding;                          // first and last stage of a pipeline (PP > 1)
    int thread_level;                         // MPI's, from MPI_Init_thread
    const char* threads_from;                 // where the OpenMP thread count came from (start-up line)
    int placed;                               // coordinates known
    int ready;                                // groups built
} Topology;

static Topology grid;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// a rank's coordinates as its error lines name them (CP only where there is context parallelism)
static const char* coordinates_name(char* buf, size_t len, int tp, int cp, int pp, int dp, int rank) {
    char cp_part[24] = "";
    if (grid.cp_size > 1) snprintf(cp_part, sizeof cp_part, "CP(%d)-", cp);
    snprintf(buf, len, "TP(%d)-%sPP(%d)-DP(%d)-Rank(%d)", tp, cp_part, pp, dp, rank);
    return buf;
}

static const char* grid_name(char* buf, size_t len) {
    return coordinates_name(buf, len, grid.tp_rank, grid.cp_rank, grid.pp_rank, grid.dp_rank, grid.world_rank);
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

// A failure on one rank ends the whole job, and says where it happened. Once MPI runs, this
// is fail() everywhere (grid_start hands it to kernels.cuh's checks).
static void fail_job(const char* fmt, ...) {
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

// What this rank must do before MPI ends, set by a room above (checkpoint.h: release the
// --save lock). Not left to atexit: once one rank exits non-zero, the launcher may kill the
// others while they are still exiting, and MPI_Finalize is the last point every rank reaches.
static void (*before_mpi_finalize)(void);
// and the threads that call MPI on their own, which must leave it first (cluster.h's watchdog)
static void (*stop_mpi_threads)(void);

static void finalize_mpi(void) {
    if (stop_mpi_threads) stop_mpi_threads();
    if (before_mpi_finalize) before_mpi_finalize();
    MPI_Finalize();
}

// Every rank exits 2 for bad input; the launcher, seeing the first, may send the others SIGTERM
// before they are gone: that adds no line (one rank has said what was wrong)
static void exit_for_bad_input(void) {
    signal(SIGTERM, SIG_IGN);
    finalize_mpi();
    exit(2);
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
    exit_for_bad_input();
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
    exit_for_bad_input();
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

static void shared_files_before_mpi_init(void);   // MPI-IO's shared files, below

// Without OMP_NUM_THREADS, each rank takes its share of its host's cores: the host's online
// cores over the ranks on this host, at least one, and no more than the cores it may run on
// (omp_get_num_procs: its affinity mask, which a launcher that binds ranks has already cut).
// Left alone, every rank of `mpirun -np N` would start a thread per core, N threads per core in
// all, spinning against each other (the seed configs' --tiny runs took 45 to 199 s, not 1 s).
// (hardware.h's this_machine asks the same of a planned world's ranks.)
static int threads_of_local_rank(int local_size) {
#ifdef _OPENMP
    if (getenv("OMP_NUM_THREADS")) return omp_get_max_threads();
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int share = (int)(online / local_size), usable = omp_get_num_procs();
    int threads = share < usable ? share : usable;
    return threads > 1 ? threads : 1;
#else
    (void)local_size;
    return 1;
#endif
}

static void share_cores_among_local_ranks(void) {
    grid.threads_from = "OMP_NUM_THREADS";
#ifdef _OPENMP
    if (getenv("OMP_NUM_THREADS")) return;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    omp_set_num_threads(threads_of_local_rank(grid.local_size));
    static char from[96];
    snprintf(from, sizeof(from), "this host's %ld cores over its %d rank(s)", online, grid.local_size);
    grid.threads_from = from;
#endif
}

// A process started alone (no launcher: `./train_cpu --help`, a refused flag, a one-process run)
// is an MPI singleton, for which Open MPI opens every point-to-point layer it has, probing the
// fabric libraries (cm and its mtl components): MPI_Init 0.37 s here, 0.18 s without the probes.
// Alone it talks to no one, so it takes the plain layer (pml ob1, which Open MPI picks on such a
// host anyway). It spawns nothing either, so it needs no supporting daemon (Open MPI's
// ess_singleton_isolated: a one-rank run of the tests' tiny model took 0.23 s, 0.06 s without
// it). Such processes would all take one session directory, and two started at once collide at
// MPI_Init (seen in make test's two lanes): each gets a folder of its own for it, removed at
// exit (Open MPI empties it at MPI_Finalize). A user's own settings win; under mpirun or srun
// (their variables set) nothing changes.
// A process that ends without MPI_Finalize (killed, aborted) leaves its folder behind, which no
// daemon is there to remove: the next process started alone removes the folders whose process
// is gone (named gridgpt-alone-PID-...).
static char alone_session_dir[512];
static void remove_alone_session_dir(void) { remove_tree(alone_session_dir); }   // (files.h)

static void remove_stale_alone_dirs(const char* tmp) {
    DIR* d = opendir(tmp);
    if (!d) return;
    for (struct dirent* e; (e = readdir(d)) != NULL;) {
        int pid;
        if (sscanf(e->d_name, "gridgpt-alone-%d-", &pid) != 1 || pid <= 0) continue;
        if (kill(pid, 0) == 0 || errno != ESRCH) continue;   // alive (or another user's: not ours to remove)
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", tmp, e->d_name);
        remove_tree(path);
    }
    closedir(d);
}

static void start_alone_quickly(void) {
#ifdef OPEN_MPI
    const char* launcher_variables[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};
    for (int i = 0; i < 4; i++)
        if (getenv(launcher_variables[i])) return;
    setenv("OMPI_MCA_pml", "ob1", 0);
    if (getenv("OMPI_MCA_ess_singleton_isolated") || getenv("OMPI_MCA_orte_tmpdir_base")) return;
    const char* tmp = getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR") : "/tmp";
    remove_stale_alone_dirs(tmp);
    snprintf(alone_session_dir, sizeof alone_session_dir, "%s/gridgpt-alone-%d-XXXXXX", tmp, (int)getpid());
    if (!mkdtemp(alone_session_dir)) return;   // (then the supporting daemon, as Open MPI's default)
    atexit(remove_alone_session_dir);
    setenv("OMPI_MCA_orte_tmpdir_base", alone_session_dir, 1);
    setenv("OMPI_MCA_ess_singleton_isolated", "1", 1);
#endif
}

static void grid_start(int* argc, char*** argv) {
    // first, before MPI: OpenBLAS's kernels can only be changed by executing again (blas_cores.h)
    blas_choose_kernels(*argv);
    shared_files_before_mpi_init();
    start_alone_quickly();
    // MPI_THREAD_MULTIPLE: the watchdog thread sends its report over MPI while the main thread
    // may be blocked inside MPI (without it the watchdog still reports, with no summary)
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &grid.thread_level);
    fail = fail_job;
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
    share_cores_among_local_ranks();
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

// Coordinates from the rank (Megatron-LM's order: TP fastest, then CP, DP, PP), known as soon
// as the flags are checked, so that every later error line can name them. The caller has
// checked that world size is a multiple of TP x CP x PP. CP sits next to TP, as in Megatron-LM's
// parallel_state: the ring of a context-parallel group is the next-fastest link after TP's.
static void grid_place(int tp_size, int cp_size, int pp_size) {
    grid.tp_size = tp_size;
    grid.cp_size = cp_size;
    grid.pp_size = pp_size;
    grid.dp_size = grid.world_size / (tp_size * cp_size * pp_size);
    int r = grid.world_rank, TP = tp_size, CP = cp_size, DP = grid.dp_size;
    grid.tp_rank = r % TP;
    grid.cp_rank = (r / TP) % CP;
    grid.dp_rank = (r / (TP * CP)) % DP;
    grid.pp_rank = r / (TP * CP * DP);
    grid.placed = 1;
}

// every group of the grid, for what walks them all (shutdown, the watchdog's abort, the cluster check)
enum { GRID_GROUPS = 10 };
static void grid_groups(Group** out) {
    Group* all[GRID_GROUPS] = {&grid.world, &grid.tp, &grid.cp, &grid.dp, &grid.dp_cp, &grid.pp, &grid.model_parallel,
                               &grid.embedding, &grid.ep, &grid.expert_dp};
    memcpy(out, all, sizeof(all));
}

// The coordinates and one communicator per group. On the GPU build this rank's GPU must be
// chosen first (kernels_init): NCCL binds a communicator to the current device.
static void grid_build_experts(int ep_size);
static void grid_build(int tp_size, int cp_size, int pp_size, int ep_size) {
    grid_place(tp_size, cp_size, pp_size);
    int r = grid.world_rank, TP = tp_size, CP = cp_size, DP = grid.dp_size, PP = pp_size;
    int tp = grid.tp_rank, cp = grid.cp_rank, dp = grid.dp_rank, pp = grid.pp_rank;
    group_make(&grid.world, "world", 0, r);
    group_make(&grid.tp, "tensor-parallel", cp + CP * (dp + DP * pp), tp);
    group_make(&grid.cp, "context-parallel", tp + TP * (dp + DP * pp), cp);
    group_make(&grid.dp, "data-parallel", tp + TP * (cp + CP * pp), dp);
    group_make(&grid.dp_cp, "data-parallel x context-parallel", tp + TP * pp, cp + CP * dp);
    group_make(&grid.pp, "pipeline", tp + TP * (cp + CP * dp), pp);
    group_make(&grid.model_parallel, "model-parallel", cp + CP * dp, tp + TP * pp);
    int embedding_stage = PP > 1 && (pp == 0 || pp == PP - 1);
    group_make(&grid.embedding, "embedding", embedding_stage ? tp + TP * (cp + CP * dp) : MPI_UNDEFINED, pp);
    grid_build_experts(ep_size);
    grid.ready = 1;
}

// Expert parallelism (Megatron-Core's layout): the DP x CP ranks of one (tp, pp) slot, in their
// order (cp fastest), are cut into expert groups of EP consecutive ranks; a group's ranks hold
// the experts between them, E / EP each, and the ranks at the same place in every group hold the
// same experts (their expert-data-parallel group: DP x CP / EP ranks, over which those experts'
// gradients are summed). At EP 1 neither group is made: every rank holds every expert.
static void grid_build_experts(int ep_size) {
    int TP = grid.tp_size, slot = grid.tp_rank + TP * grid.pp_rank, at = grid.cp_rank + grid.cp_size * grid.dp_rank;
    grid.ep_size = ep_size;
    grid.ep_rank = at % ep_size;
    grid.ep.mpi = grid.expert_dp.mpi = MPI_COMM_NULL;
    grid.ep.size = 1;
    if (ep_size <= 1) return;
    int groups = grid.cp_size * grid.dp_size / ep_size;
    group_make(&grid.ep, "expert-parallel", slot * groups + at / ep_size, grid.ep_rank);
    group_make(&grid.expert_dp, "expert-data-parallel", slot * ep_size + grid.ep_rank, at / ep_size);
}

static void grid_finish(void) {
    if (grid.ready) {
        Group* groups[GRID_GROUPS];
        grid_groups(groups);
        for (int i = 0; i < GRID_GROUPS; i++) {
            if (groups[i]->mpi == MPI_COMM_NULL) continue;
#ifdef __CUDACC__
            ncclCommDestroy(groups[i]->nccl);
#endif
            MPI_Comm_free(&groups[i]->mpi);
        }
    }
    finalize_mpi();
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

// Where an operation's work runs on the GPU build: nowhere but the host (host values, files),
// or queued on the compute stream (0) or the communication stream (device.cuh's comm_stream)
typedef enum { ON_HOST, ON_COMPUTE_STREAM, ON_COMM_STREAM } StreamId;

// The profiler's hooks (trace.h sets them while this rank records, NULL otherwise): told of
// every operation below as it begins (its buffer's or message's bytes, its stream) and ends.
static void (*on_wait_begin)(const char* op, const Group* g, int peer, size_t bytes, StreamId stream);
static void (*on_wait_end)(void);

static void wait_begin_on(const char* op, const Group* g, int peer, size_t bytes, StreamId stream) {
    pthread_mutex_lock(&activity_lock);
    activity.op = op;
    activity.group = g->name ? g->name : "";
    activity.peer = peer;
    activity.waiting = 1;
    activity.wait_started = now_seconds();
    pthread_mutex_unlock(&activity_lock);
    if (on_wait_begin) on_wait_begin(op, g, peer, bytes, stream);
}

// an operation on host values (or files): no device work, no bytes counted
static void wait_begin(const char* op, const Group* g, int peer) { wait_begin_on(op, g, peer, 0, ON_HOST); }

static void wait_end(void) {
    if (on_wait_end) on_wait_end();
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
    wait_begin_on("all-reduce", g, -1, n * elem_bytes(elem), ON_COMPUTE_STREAM);
#ifdef __CUDACC__
    ncclCheck(ncclAllReduce(buf, buf, n, nccl_type(elem), op == REDUCE_SUM ? ncclSum : ncclMax, g->nccl, 0));
#else
    (void)elem;   // floatX is float on the CPU build
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, op == REDUCE_SUM ? MPI_SUM : MPI_MAX, g->mpi));
#endif
    wait_end();
}

// out[shard] = sum over the group of in[rank * shard .. +shard): fp32 gradients (ZeRO), or
// floatX activations (sequence parallelism). out may be in + rank * shard (in place: ZeRO's
// gradients summed into their own shard of the flat buffer, as Megatron-LM's distributed
// optimizer does; the rest of `in` is left undefined). NCCL takes that as is; MPI's in-place
// form leaves the sum at the buffer's start, from where it moves to the rank's shard.
static void reduce_scatter(Group* g, const void* in, void* out, size_t shard, Elem elem) {
    g->bytes_sent += (double)(g->size - 1) * shard * elem_bytes(elem);
    wait_begin_on("reduce-scatter", g, -1, g->size * shard * elem_bytes(elem), ON_COMPUTE_STREAM);
#ifdef __CUDACC__
    ncclCheck(ncclReduceScatter(in, out, shard, nccl_type(elem), ncclSum, g->nccl, 0));
#else
    if (out == (const float*)in + (size_t)g->rank * shard) {
        mpiCheck(MPI_Reduce_scatter_block(MPI_IN_PLACE, (void*)in, (int)shard, MPI_FLOAT, MPI_SUM, g->mpi));
        if (g->rank > 0) memcpy(out, in, shard * sizeof(float));   // (shards do not overlap)
    } else mpiCheck(MPI_Reduce_scatter_block(in, out, (int)shard, MPI_FLOAT, MPI_SUM, g->mpi));
#endif
    wait_end();
}

// out[n] on rank `root` = sum over the group of in[n] (out is not touched elsewhere; it may be
// in: in place): fp32 gradients, queued on the communication stream (the CPU build: done when
// it returns). A ring or chain reduce has every rank but the root send the buffer once.
// On MPI, in pieces of REDUCE_PIECE elements: Open MPI's reduce takes temporaries as large as
// its message (measured: the root of an in-place reduce of a 50 MB part peaked 84 MB above
// the others), a piece's stay at 4 MiB. Each element is still summed over the ranks, in MPI's order.
enum { REDUCE_PIECE = 1 << 20 };
static void reduce_to(Group* g, const float* in, float* out, size_t n, int root) {
    if (g->rank != root) g->bytes_sent += (double)n * sizeof(float);
    wait_begin_on("reduce", g, -1, n * sizeof(float), ON_COMM_STREAM);
#ifdef __CUDACC__
    ncclCheck(ncclReduce(in, out, n, ncclFloat, ncclSum, root, g->nccl, comm_stream));
#else
    int in_place = in == out && g->rank == root;   // MPI's root names it so
    for (size_t at = 0; at < n; at += REDUCE_PIECE) {
        int k = (int)(n - at < REDUCE_PIECE ? n - at : REDUCE_PIECE);
        mpiCheck(MPI_Reduce(in_place ? MPI_IN_PLACE : in + at, out + at, k, MPI_FLOAT, MPI_SUM, root, g->mpi));
    }
#endif
    wait_end();
}

// buf[n] of rank `root` copied to the group's other ranks, in place: floatX parameters, queued
// on the communication stream (the CPU build: done when it returns). A ring broadcast has
// every rank but the one before the root send the buffer once.
static void broadcast_from(Group* g, floatX* buf, size_t n, int root) {
    if (g->rank != (root + g->size - 1) % g->size) g->bytes_sent += (double)n * sizeof(floatX);
    wait_begin_on("broadcast", g, -1, n * sizeof(floatX), ON_COMM_STREAM);
#ifdef __CUDACC__
    ncclCheck(ncclBroadcast(buf, buf, n, NCCL_FLOATX, root, g->nccl, comm_stream));
#else
    mpiCheck(MPI_Bcast(buf, (int)n, MPI_FLOAT, root, g->mpi));
#endif
    wait_end();
}

// n floatX to world rank `peer` while n arrive from it (the slow-rank report's link probe). On
// the CPU build the rank sleeps while it waits, as barrier_sleeping does: where ranks share a
// host's cores, spinning ones would hold the cores the transfers need, and a probe would time
// the scheduler rather than the link.
static void exchange_with_rank(int peer, const floatX* out, floatX* in, size_t n) {
    Group* g = &grid.world;
    g->bytes_sent += (double)n * sizeof(floatX);
    wait_begin_on("send and receive", g, peer, 2 * n * sizeof(floatX), ON_COMPUTE_STREAM);
#ifdef __CUDACC__
    ncclCheck(ncclGroupStart());
    ncclCheck(ncclSend(out, n, NCCL_FLOATX, peer, g->nccl, 0));
    ncclCheck(ncclRecv(in, n, NCCL_FLOATX, peer, g->nccl, 0));
    ncclCheck(ncclGroupEnd());
#else
    MPI_Request req[2];
    mpiCheck(MPI_Irecv(in, (int)n, MPI_FLOAT, peer, 0, g->mpi, &req[0]));
    mpiCheck(MPI_Isend(out, (int)n, MPI_FLOAT, peer, 0, g->mpi, &req[1]));
    struct timespec nap = {0, 50000};
    for (int done = 0; !done;) {
        mpiCheck(MPI_Testall(2, req, &done, MPI_STATUSES_IGNORE));
        if (!done) nanosleep(&nap, NULL);
    }
#endif
    wait_end();
}

// out[r * shard .. +shard) = rank r's in[shard], on every rank: floatX parameters (ZeRO) or
// activations (sequence parallelism). in may be out + rank * shard (in place).
static void all_gather(Group* g, const floatX* in, floatX* out, size_t shard) {
    int in_place = in == out + g->rank * shard;
    if (g->size <= 1 && in_place) return;
    g->bytes_sent += (double)(g->size - 1) * shard * sizeof(floatX);
    wait_begin_on("all-gather", g, -1, g->size * shard * sizeof(floatX), ON_COMPUTE_STREAM);
#ifdef __CUDACC__
    ncclCheck(ncclAllGather(in, out, shard, NCCL_FLOATX, g->nccl, 0));
#else
    mpiCheck(MPI_Allgather(in_place ? MPI_IN_PLACE : in, (int)shard, MPI_FLOAT, out, (int)shard, MPI_FLOAT, g->mpi));
#endif
    wait_end();
}

// n ints on the device summed over the group, in place (a MoE layer's tokens per expert over
// the ranks that share a sequence)
static void all_reduce_counts(Group* g, int* counts, size_t n) {
    if (g->size <= 1) return;
    g->bytes_sent += 2.0 * (g->size - 1) / g->size * n * sizeof(int);
    wait_begin_on("all-reduce", g, -1, n * sizeof(int), ON_COMPUTE_STREAM);
#ifdef __CUDACC__
    ncclCheck(ncclAllReduce(counts, counts, n, ncclInt32, ncclSum, g->nccl, 0));
#else
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, counts, (int)n, MPI_INT, MPI_SUM, g->mpi));
#endif
    wait_end();
}

// One rank's part of an all-to-all in blocks (expert parallelism's rows): each block n floatX to
// or from a peer of the group. Blocks between two ranks are matched in the order both post them
// (MPI's messages between two ranks do not overtake each other; NCCL's sends and receives of a
// group call pair up in order), so a block lands at its place with no permutation afterwards.
// Empty blocks are not posted: both ends know every block's size beforehand.
typedef struct {
    int peer;
    floatX* buf;
    size_t n;
} Block;

static void exchange_blocks(Group* g, const Block* sends, int num_sends, const Block* recvs, int num_recvs) {
    size_t out = 0, in = 0;
    for (int i = 0; i < num_sends; i++) out += sends[i].peer == g->rank ? 0 : sends[i].n;
    for (int i = 0; i < num_recvs; i++) in += recvs[i].n;
    g->bytes_sent += (double)out * sizeof(floatX);
    wait_begin_on("all-to-all", g, -1, (out + in) * sizeof(floatX), ON_COMPUTE_STREAM);
#ifdef __CUDACC__
    ncclCheck(ncclGroupStart());
    for (int i = 0; i < num_recvs; i++)
        if (recvs[i].n) ncclCheck(ncclRecv(recvs[i].buf, recvs[i].n, NCCL_FLOATX, recvs[i].peer, g->nccl, 0));
    for (int i = 0; i < num_sends; i++)
        if (sends[i].n) ncclCheck(ncclSend(sends[i].buf, sends[i].n, NCCL_FLOATX, sends[i].peer, g->nccl, 0));
    ncclCheck(ncclGroupEnd());
#else
    MPI_Request* req = (MPI_Request*)mallocCheck((size_t)(num_sends + num_recvs + 1) * sizeof(MPI_Request));
    int posted = 0;
    for (int i = 0; i < num_recvs; i++)
        if (recvs[i].n) mpiCheck(MPI_Irecv(recvs[i].buf, (int)recvs[i].n, MPI_FLOAT, recvs[i].peer, 0, g->mpi, &req[posted++]));
    for (int i = 0; i < num_sends; i++)
        if (sends[i].n) mpiCheck(MPI_Isend(sends[i].buf, (int)sends[i].n, MPI_FLOAT, sends[i].peer, 0, g->mpi, &req[posted++]));
    mpiCheck(MPI_Waitall(posted, req, MPI_STATUSES_IGNORE));
    free(req);
#endif
    wait_end();
}

// each rank's `each` host ints to every rank of the group (send[r * each ..] to rank r), over
// MPI in both builds (expert parallelism's row counts, known on the host beforehand)
static void all_to_all_host(Group* g, const int* send, int* recv, int each) {
    wait_begin("all-to-all (host values)", g, -1);
    mpiCheck(MPI_Alltoall(send, each, MPI_INT, recv, each, MPI_INT, g->mpi));
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

// Sequence parallelism's two operators (Korthikanti et al. 2022, §4.2.2, Fig. 5: their g and
// g-bar), by Megatron-LM's names. With --sequence-parallel a micro-batch's [N, C] residual
// stream is split along its rows (tokens) over the tensor ranks, rank r holding rows
// [r N/t, (r + 1) N/t) (gpt.h's residual rows), and where f and g stood:
// gather_from_sequence_parallel_region: before a column-parallel layer (QKV, FC1, the head),
//     the LayerNorm's output of every rank's rows all-gathered into the whole [N, C] (forward);
//     the layer's input gradient, a partial sum on each rank, reduce-scattered back to the
//     rows' owners (backward);
// reduce_scatter_to_sequence_parallel_region: after a row-parallel layer (and the
//     vocab-parallel embedding), the ranks' partial [N, C] outputs summed and scattered to the
//     rows' owners (forward); the output's gradient all-gathered (backward).
// An all-reduce is a reduce-scatter followed by an all-gather (the ring algorithm does just
// that), so the pair sends what f and g sent; in between, each rank holds 1/t of the rows.
// local_n: elements of this rank's rows; the whole buffer holds t times as many.
static void gather_from_sequence_parallel_region(floatX* whole, const floatX* local, size_t local_n) {
    all_gather(&grid.tp, local, whole, local_n);
}
static void gather_from_sequence_parallel_region_backward(floatX* dlocal, const floatX* dwhole, size_t local_n) {
    reduce_scatter(&grid.tp, dwhole, dlocal, local_n, AS_FLOATX);
}
static void reduce_scatter_to_sequence_parallel_region(floatX* local, const floatX* whole, size_t local_n) {
    reduce_scatter(&grid.tp, whole, local, local_n, AS_FLOATX);
}
static void reduce_scatter_to_sequence_parallel_region_backward(floatX* dwhole, const floatX* dlocal, size_t local_n) {
    all_gather(&grid.tp, dlocal, dwhole, local_n);
}

// vocab-parallel cross-entropy (Megatron's _VocabParallelCrossEntropy): each tensor rank holds
// a slice of the logits; the row maxima, then the sums of exponentials and target logits, are
// reduced over the tensor ranks, so no rank ever holds a whole row of logits
static void vocab_parallel_max(float* row_max, size_t n) { all_reduce(&grid.tp, row_max, n, AS_FLOAT, REDUCE_MAX); }
static void vocab_parallel_sum(float* sums, size_t n) { all_reduce(&grid.tp, sums, n, AS_FLOAT, REDUCE_SUM); }

// ----------------------------------------------------------------------------
// A ring's transfer that runs while the rank computes (context parallelism's, context_parallel.h):
// n elements to the next rank of group g and n from the previous one, posted by
// ring_transfer_start and waited for by ring_transfer_finish, with the work between the two
// hiding it. On the GPU build it runs on the communication stream, after the kernels that
// wrote what it sends, and the compute stream waits for it at the finish; on the CPU build
// MPI's nonblocking send and receive, waited for at the finish (what MPI moves meanwhile is its
// own business: a large message over shared memory may wait for the finish to move at all).
typedef struct {
    Group* g;
    size_t bytes;
    int from;
    int tag;      // MPI's message tag: two transfers in flight at once on one ring stay apart (NCCL
                  // matches by order, which every rank keeps alike)
    int active;
#ifdef __CUDACC__
    StreamEvent written, arrived;
#else
    MPI_Request req[2];
#endif
} RingTransfer;

static void ring_transfer_init(RingTransfer* t, int tag) {
    memset(t, 0, sizeof(*t));
    t->tag = tag;
#ifdef __CUDACC__
    stream_event_create(&t->written);
    stream_event_create(&t->arrived);
#endif
}

static void ring_transfer_free(RingTransfer* t) {
#ifdef __CUDACC__
    stream_event_destroy(&t->written);
    stream_event_destroy(&t->arrived);
#endif
    (void)t;
}

// the previous and the next rank of this rank in group g's ring
static int ring_prev(const Group* g) { return (g->rank + g->size - 1) % g->size; }
static int ring_next(const Group* g) { return (g->rank + 1) % g->size; }

static void ring_transfer_start(RingTransfer* t, Group* g, const void* send, void* recv, size_t n, Elem elem) {
    t->g = g;
    t->bytes = n * elem_bytes(elem);
    t->from = ring_prev(g);
    t->active = 1;
    g->bytes_sent += (double)t->bytes;
#ifdef __CUDACC__
    comm_waits_for_compute(&t->written);
    wait_begin_on("ring send and receive", g, t->from, 2 * t->bytes, ON_COMM_STREAM);
    ncclCheck(ncclGroupStart());
    ncclCheck(ncclSend(send, n, nccl_type(elem), ring_next(g), g->nccl, comm_stream));
    ncclCheck(ncclRecv(recv, n, nccl_type(elem), t->from, g->nccl, comm_stream));
    ncclCheck(ncclGroupEnd());
    comm_mark(&t->arrived);
    wait_end();
#else
    (void)elem;   // floatX is float on the CPU build
    mpiCheck(MPI_Irecv(recv, (int)n, MPI_FLOAT, t->from, t->tag, g->mpi, &t->req[0]));
    mpiCheck(MPI_Isend(send, (int)n, MPI_FLOAT, ring_next(g), t->tag, g->mpi, &t->req[1]));
#endif
}

// what arrives is there for the next kernel (and what was sent may be written again)
static void ring_transfer_finish(RingTransfer* t) {
    if (!t->active) return;
    t->active = 0;
#ifdef __CUDACC__
    compute_waits_for_mark(&t->arrived);
#else
    wait_begin_on("ring send and receive", t->g, t->from, 2 * t->bytes, ON_COMPUTE_STREAM);
    mpiCheck(MPI_Waitall(2, t->req, MPI_STATUSES_IGNORE));
    wait_end();
#endif
}

// ----------------------------------------------------------------------------
// files every rank of the world writes and reads at once (MPI-IO): each rank its own ranges
// (open, set_size, sync and close are collective: every rank calls them together)

// Open MPI's sharedfp components serve MPI-IO's shared file pointer, which gridgpt never uses
// (explicit offsets only), yet ompio asks each of them at every MPI_File_open whether it can
// serve the file. Open MPI 4.1's lockedfile answers by sprintf-ing "<path>.locktest.<rank>" into
// 256 bytes on its stack: a checkpoint file's path of 245 characters or more at ranks 0 to 9 (a
// --save of 216: <save>/iter_0000002.tmp/tensors.bin) overran them, and glibc aborted the run at
// the first save ("buffer overflow detected", exit 134; a --load the same). Fixed upstream in
// 2025 (open-mpi/ompi#13571, for 5.0.x and 6.0.x). So, before MPI reads its parameters,
// lockedfile is left out, unless the user chose the components (OMPI_MCA_sharedfp: mpirun's
// --mca and -x put it in the environment too; set here, it outranks Open MPI's parameter files).
// What remains names its files from malloc'd buffers: sm (all ranks on one host: a file in the
// session directory named after the basename) or individual (files opened for writing across
// hosts: <path>.data.<rank> and <path>.metadata.<rank> beside the file, deleted at close). One
// must remain: with none available, ompio opens no file at all.
static void shared_files_before_mpi_init(void) {
#ifdef OPEN_MPI
    setenv("OMPI_MCA_sharedfp", "^lockedfile", 0);
#endif
}

// Whether an MCA component list ("": all; "a,b": these; "^a,b": all but these) lets `name` run
static int mca_list_allows(const char* list, const char* name) {
    int excluding = list[0] == '^', listed = 0;
    for (const char* p = list + excluding; *p; p += *p == ',') {
        size_t n = strcspn(p, ",");
        listed |= n == strlen(name) && strncmp(p, name, n) == 0;
        p += n;
    }
    return list[0] == '\0' || excluding != listed;
}

// The longest path shared_file_open takes in this run, and why (for train.c's check_paths, which
// refuses a --save or --load at start-up whose checkpoint file would be longer): PATH_MAX less
// individual's ".metadata.<rank>"; where the user's OMPI_MCA_sharedfp lets lockedfile run, its
// 256 bytes less ".locktest.<rank>" and the NUL.
static size_t shared_file_path_max(const char** why) {
    size_t rank_digits = (size_t)snprintf(NULL, 0, "%d", grid.world_size - 1);
    *why = "the system's PATH_MAX, less the suffix Open MPI adds to name its own files beside it";
#ifdef OPEN_MPI
    const char* list = getenv("OMPI_MCA_sharedfp");
    if (list && mca_list_allows(list, "lockedfile")) {
        *why = "OMPI_MCA_sharedfp lets Open MPI's sharedfp/lockedfile run, which names a file after the path in "
               "256 bytes: leave it out (^lockedfile)";
        return 255 - strlen(".locktest.") - rank_digits;
    }
#endif
    return PATH_MAX - 1 - strlen(".metadata.") - rank_digits;
}

// Why the last MPI-IO call failed: the system's reason where the file system gave one (errno
// right after the call: "No space left on device", "Input/output error"), else MPI's (whose
// class for an EIO in ftruncate or fsync is MPI_ERR_OTHER, "known error not in list").
static char shared_file_why[MPI_MAX_ERROR_STRING + 64];
static void shared_file_failed(int rc, int error) {
    int len = 0;
    if (error) snprintf(shared_file_why, sizeof(shared_file_why), "%s", strerror(error));
    else if (rc != MPI_SUCCESS) MPI_Error_string(rc, shared_file_why, &len);
}

// -1, and no rank enters MPI_File_open, where the path is too long for it on any rank (the first
// says why): train.c's check_paths refuses such a --save or --load at start-up; this keeps Open
// MPI from aborting a run that got past it
static int shared_file_open(const char* path, int writing, MPI_File* f) {
    const char* why;
    size_t max = shared_file_path_max(&why);
    int first = grid.world_size - max_over_world(strlen(path) > max ? grid.world_size - grid.world_rank : 0);
    if (first < grid.world_size) {
        snprintf(shared_file_why, sizeof(shared_file_why), "a path longer than MPI-IO takes here");
        if (grid.world_rank == first)
            report_error("%s: %zu characters, more than the %zu MPI-IO takes here (%s)", path, strlen(path), max, why);
        return -1;
    }
    int mode = writing ? MPI_MODE_CREATE | MPI_MODE_RDWR : MPI_MODE_RDONLY;
    wait_begin("opening a checkpoint file", &grid.world, -1);
    errno = 0;
    int rc = MPI_File_open(grid.world.mpi, path, mode, MPI_INFO_NULL, f);
    if (rc != MPI_SUCCESS) shared_file_failed(rc, errno);
    wait_end();
    return rc == MPI_SUCCESS ? 0 : -1;
}
static int shared_file_set_size(MPI_File f, size_t bytes) {   // 1: done (else shared_file_why says why)
    errno = 0;
    int rc = MPI_File_set_size(f, (MPI_Offset)bytes);
    if (rc != MPI_SUCCESS) shared_file_failed(rc, errno);
    return rc == MPI_SUCCESS;
}
static int shared_file_sync(MPI_File f) {   // 1: synced (else shared_file_why says why)
    wait_begin("syncing a checkpoint file", &grid.world, -1);
    errno = 0;
    int rc = MPI_File_sync(f);
    if (rc != MPI_SUCCESS) shared_file_failed(rc, errno);
    wait_end();
    return rc == MPI_SUCCESS;
}
static void shared_file_close(MPI_File* f) {
    wait_begin("closing a checkpoint file", &grid.world, -1);
    mpiCheck(MPI_File_close(f));
    wait_end();
}
// bytes at offset to (writing) or from the file, in pieces of at most 1 GiB (MPI counts are
// ints). 0, or -1 when MPI reports an error or moved fewer bytes. (Open MPI's ompio has been
// seen to report success for a write the disk refused: checkpoint.h reads every write back.)
// A short transfer is progress, as with write(2): the rest is asked for again, and a disk that
// is full says so then (ENOSPC), which shared_file_why keeps: the system's reason where the
// file system gave one ("No space left on device"), else MPI's.
static int shared_file_io(MPI_File f, size_t offset, void* buf, size_t bytes, int writing) {
    for (size_t done = 0; done < bytes;) {
        size_t n = bytes - done < ((size_t)1 << 30) ? bytes - done : (size_t)1 << 30;
        MPI_Offset at = (MPI_Offset)(offset + done);
        MPI_Status status;
        errno = 0;
        int count = 0, rc = writing ? MPI_File_write_at(f, at, (char*)buf + done, (int)n, MPI_BYTE, &status)
                                    : MPI_File_read_at(f, at, (char*)buf + done, (int)n, MPI_BYTE, &status);
        int e = errno;
        if (rc == MPI_SUCCESS && MPI_Get_count(&status, MPI_BYTE, &count) == MPI_SUCCESS && count > 0) {
            done += (size_t)count;
            activity_progress();
            continue;
        }
        if (e || rc != MPI_SUCCESS) shared_file_failed(rc, e);
        else snprintf(shared_file_why, sizeof(shared_file_why), "no bytes %s (end of file?)", writing ? "written" : "read");
        return -1;
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

// The messages of one exchange, each of n floatX (NULL: none): an activation to the next stage
// and one from the previous, a gradient to the previous stage and one from the next. They are
// posted in this order on every rank: where the next and the previous stage are one rank (PP 2
// with interleaving), the two messages each way are then matched in the order both sides post
// them (NCCL, like MPI with one tag, matches a pair's messages in posting order).
typedef struct {
    const floatX* to_next;
    floatX* from_prev;
    const floatX* to_prev;
    floatX* from_next;
} PipelineMessages;

// the world rank of pipeline stage `stage` of this rank's pipeline (same tp, dp)
static int pipeline_world_rank(int stage) {
    return grid.world_rank + (stage - grid.pp_rank) * grid.tp_size * grid.cp_size * grid.dp_size;
}

// one exchange with the stages `next` and `prev` (-1: none, and so nothing to or from it)
static void pipeline_exchange(PipelineMessages msg, int next, int prev, size_t n) {
    Group* g = &grid.pp;
    PipelineLink* l = &pipeline_link;
    if (next < 0) msg.to_next = msg.from_next = NULL;
    if (prev < 0) msg.to_prev = msg.from_prev = NULL;
    int sends = (msg.to_next != NULL) + (msg.to_prev != NULL), recvs = (msg.from_prev != NULL) + (msg.from_next != NULL);
    if (sends + recvs == 0) return;
    g->bytes_sent += (double)sends * n * sizeof(floatX);
    int peer = msg.from_prev ? prev : msg.from_next ? next : msg.to_next ? next : prev;
    if (l->overlap) comm_waits_for_compute(&l->data_written);   // (first: the exchange's device time starts after it)
    wait_begin_on(sends && recvs ? "send and receive" : sends ? "send" : "receive", g, pipeline_world_rank(peer),
                  (sends + recvs) * n * sizeof(floatX), l->overlap ? ON_COMM_STREAM : ON_COMPUTE_STREAM);
    const void* bufs[4] = {msg.to_next, msg.from_prev, msg.to_prev, msg.from_next};
    int peers[4] = {next, prev, prev, next}, is_send[4] = {1, 0, 1, 0};
#ifdef __CUDACC__
    cudaStream_t stream = l->overlap ? comm_stream : 0;
    ncclCheck(ncclGroupStart());
    for (int k = 0; k < 4; k++) {
        if (!bufs[k]) continue;
        if (is_send[k]) ncclCheck(ncclSend(bufs[k], n, NCCL_FLOATX, peers[k], g->nccl, stream));
        else ncclCheck(ncclRecv((void*)bufs[k], n, NCCL_FLOATX, peers[k], g->nccl, stream));
    }
    ncclCheck(ncclGroupEnd());
#else
    MPI_Request req[4];
    int posted = 0;
    for (int k = 0; k < 4; k++) {
        if (!bufs[k]) continue;
        if (is_send[k]) mpiCheck(MPI_Isend(bufs[k], (int)n, MPI_FLOAT, peers[k], 0, g->mpi, &req[posted++]));
        else mpiCheck(MPI_Irecv((void*)bufs[k], (int)n, MPI_FLOAT, peers[k], 0, g->mpi, &req[posted++]));
    }
    mpiCheck(MPI_Waitall(posted, req, MPI_STATUSES_IGNORE));
#endif
    if (l->overlap && recvs) {
        wait_for_exchanges();   // the next kernel reads what arrives
    } else if (l->overlap) {
        if (msg.to_next) remember_unsent(msg.to_next);
        if (msg.to_prev) remember_unsent(msg.to_prev);
    }
    wait_end();
}

static int next_stage(void) { return grid.pp_rank + 1 < grid.pp_size ? grid.pp_rank + 1 : -1; }
static int prev_stage(void) { return grid.pp_rank - 1; }

// an activation to the next stage, or from the previous one (the cluster check's link test)
static void send_forward(const floatX* x, size_t n) {
    PipelineMessages msg = {x, NULL, NULL, NULL};
    pipeline_exchange(msg, next_stage(), prev_stage(), n);
}
static void recv_forward(floatX* x, size_t n) {
    PipelineMessages msg = {NULL, x, NULL, NULL};
    pipeline_exchange(msg, next_stage(), prev_stage(), n);
}

// The schedule's exchange (Megatron-LM's send_forward_backward_recv_forward_backward, which its
// other exchanges are with some messages NULL). With interleaving the virtual stages c x PP + p
// go round the pipeline v times, so the last stage's next is the first and the first's previous
// the last: the neighbours are taken on that ring, and the schedule passes NULL at the virtual
// pipeline's two ends (pipeline.h's exchange; without interleaving those are the stages' own ends).
static void send_forward_backward_recv_forward_backward(const floatX* x, const floatX* dx, floatX* next_x,
                                                         floatX* next_dx, size_t n) {
    PipelineMessages msg = {x, next_x, dx, next_dx};
    int P = grid.pp_size;
    pipeline_exchange(msg, (grid.pp_rank + 1) % P, (grid.pp_rank + P - 1) % P, n);
}
