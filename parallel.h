/*
parallel.h — everything that crosses a process boundary, and the step built on it.

  - the process grid: world = TP x PP x DP ranks in Megatron's order (TP fastest, then DP,
    then PP: rank = tp + TP * (dp + DP * pp)), one object every part asks for its
    coordinates and groups, and the one way a rank fails (naming rank, host and coordinates);
  - collectives over a group: MPI on the CPU build, NCCL on the GPU build (MPI only to start);
  - the micro-batch schedule of a step;
  - AdamW over this rank's flat buffers, the global gradient norm and clipping.

Rules it keeps: one wrapper per collective; nobody else computes a rank by hand.
*/
#pragma once
#include <mpi.h>
#include <stdarg.h>
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
    MPI_Comm mpi;
    int size, rank;
#ifdef __CUDACC__
    ncclComm_t nccl;
#endif
} Group;

typedef struct {
    int world_rank, world_size, local_rank;   // local_rank: index among the ranks on this host
    char host[256];
    int tp_size, pp_size, dp_size;
    int tp_rank, pp_rank, dp_rank;
    Group tp, dp, pp, model_parallel;         // model_parallel: all ranks with the same dp
    int ready;                                // groups built
} Topology;

static Topology grid;

static const char* grid_name(char* buf, size_t len) {
    snprintf(buf, len, "TP(%d)-PP(%d)-DP(%d)-Rank(%d)", grid.tp_rank, grid.pp_rank, grid.dp_rank, grid.world_rank);
    return buf;
}

// the one error line: "error: " + where (may be empty) + the message
static void print_error(const char* where, const char* fmt, va_list ap) {
    fprintf(stderr, "error: %s", where);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    fflush(stderr);
}

// A failure on one rank ends the whole job, and says where it happened.
static void fail(const char* fmt, ...) {
    char name[96] = "", where[512];
    if (grid.ready) grid_name(name, sizeof(name));
    snprintf(where, sizeof(where), "[rank %d on %s %s] ", grid.world_rank, grid.host, name);
    va_list ap;
    va_start(ap, fmt);
    print_error(where, fmt, ap);
    va_end(ap);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
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
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &grid.world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &grid.world_size);
    gethostname(grid.host, sizeof(grid.host) - 1);
    MPI_Comm local;
    mpiCheck(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, grid.world_rank, MPI_INFO_NULL, &local));
    MPI_Comm_rank(local, &grid.local_rank);
    MPI_Comm_free(&local);
}

static void group_make(Group* g, int color, int key) {
    mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, color, key, &g->mpi));
    MPI_Comm_size(g->mpi, &g->size);
    MPI_Comm_rank(g->mpi, &g->rank);
#ifdef __CUDACC__
    ncclUniqueId id;
    if (g->rank == 0) ncclCheck(ncclGetUniqueId(&id));
    mpiCheck(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, g->mpi));
    ncclCheck(ncclCommInitRank(&g->nccl, g->size, id, g->rank));
#endif
}

// Coordinates from the rank (Megatron's order) and one communicator per group. The caller
// has checked that world size is a multiple of tp_size * pp_size.
static void grid_build(int tp_size, int pp_size) {
    grid.tp_size = tp_size;
    grid.pp_size = pp_size;
    grid.dp_size = grid.world_size / (tp_size * pp_size);
    int r = grid.world_rank;
    grid.tp_rank = r % tp_size;
    grid.dp_rank = (r / tp_size) % grid.dp_size;
    grid.pp_rank = r / (tp_size * grid.dp_size);
    int TP = tp_size, DP = grid.dp_size;
    group_make(&grid.tp, grid.dp_rank + DP * grid.pp_rank, grid.tp_rank);
    group_make(&grid.dp, grid.tp_rank + TP * grid.pp_rank, grid.dp_rank);
    group_make(&grid.pp, grid.tp_rank + TP * grid.dp_rank, grid.pp_rank);
    group_make(&grid.model_parallel, grid.dp_rank, grid.tp_rank + TP * grid.pp_rank);
    grid.ready = 1;
}

static void grid_finish(void) {
    if (grid.ready) {
        Group* groups[] = {&grid.tp, &grid.dp, &grid.pp, &grid.model_parallel};
        for (int i = 0; i < 4; i++) {
#ifdef __CUDACC__
            ncclCommDestroy(groups[i]->nccl);
#endif
            MPI_Comm_free(&groups[i]->mpi);
        }
    }
    MPI_Finalize();
}

// ----------------------------------------------------------------------------
// collectives on device buffers: one wrapper per operation; a group of one returns at once

typedef enum { AS_FLOATX, AS_FLOAT } Elem;
typedef enum { REDUCE_SUM, REDUCE_MAX } Reduction;

static void all_reduce(Group* g, void* buf, size_t n, Elem elem, Reduction op) {
    if (g->size == 1) return;
#ifdef __CUDACC__
    ncclDataType_t type = elem == AS_FLOATX ? ncclBfloat16 : ncclFloat;
    ncclCheck(ncclAllReduce(buf, buf, n, type, op == REDUCE_SUM ? ncclSum : ncclMax, g->nccl, 0));
#else
    (void)elem;   // floatX is float on the CPU build
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, op == REDUCE_SUM ? MPI_SUM : MPI_MAX, g->mpi));
#endif
}

// host scalars (a norm, a loss) go over MPI in both builds: NCCL reads device memory only
static void all_reduce_host(Group* g, double* x, int n, Reduction op) {
    if (g->size == 1) return;
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, op == REDUCE_SUM ? MPI_SUM : MPI_MAX, g->mpi));
}

static void tensor_parallel_all_reduce(floatX* x, size_t n) { all_reduce(&grid.tp, x, n, AS_FLOATX, REDUCE_SUM); }
static void tensor_parallel_all_reduce_floats(float* x, size_t n) { all_reduce(&grid.tp, x, n, AS_FLOAT, REDUCE_SUM); }
static void tensor_parallel_all_reduce_max(float* x, size_t n) { all_reduce(&grid.tp, x, n, AS_FLOAT, REDUCE_MAX); }

// ----------------------------------------------------------------------------
// the schedule of one step
// With one pipeline stage (Megatron's forward_backward_no_pipelining) each micro-batch
// runs forward then backward, its gradients adding into the one gradient buffer. The loss
// of the step is the mean over all tokens of all micro-batches, so each token's loss
// enters the gradient with weight 1 / (tokens per micro-batch x micro-batches).

typedef void (*LoadMicroBatch)(void* ctx, int micro_batch, int* tokens, int* targets);

static float forward_backward_no_pipelining(GPT* m, int num_micro_batches, LoadMicroBatch load, void* ctx) {
    float dloss = 1.0f / ((float)m->B * m->T * num_micro_batches);
    double loss_sum = 0.0;
    for (int i = 0; i < num_micro_batches; i++) {
        load(ctx, i, m->slots[0].tokens, m->slots[0].targets);
        loss_sum += gpt_forward(m, 0);
        gpt_backward(m, 0, dloss);
    }
    return (float)(loss_sum / num_micro_batches);
}

// forward only, for evaluation: the mean loss over the micro-batches
static float forward_only(GPT* m, int num_micro_batches, LoadMicroBatch load, void* ctx) {
    double loss_sum = 0.0;
    for (int i = 0; i < num_micro_batches; i++) {
        load(ctx, i, m->slots[0].tokens, m->slots[0].targets);
        loss_sum += gpt_forward(m, 0);
    }
    return (float)(loss_sum / num_micro_batches);
}

// ----------------------------------------------------------------------------
// optimizer: AdamW over this rank's flat buffers, with global-norm gradient clipping

typedef struct {
    float beta1, beta2, eps, weight_decay, clip_grad;
} AdamWConfig;

typedef struct {
    float* m;      // first moment, fp32
    float* v;      // second moment, fp32
    int step;      // updates applied so far
    double* norm_acc;   // device scalar for the gradient norm
} AdamWState;

static void adamw_init(AdamWState* s, const GPT* model) {
    size_t bytes = model->num_params * sizeof(float);
    s->m = (float*)dev_malloc(bytes);
    s->v = (float*)dev_malloc(bytes);
    dev_zero(s->m, bytes);
    dev_zero(s->v, bytes);
    s->step = 0;
    s->norm_acc = (double*)dev_malloc(sizeof(double));
}

static void adamw_free(AdamWState* s) {
    dev_free(s->m);
    dev_free(s->v);
    dev_free(s->norm_acc);
}

// L2 norm of the whole model's gradient, every parameter counted once
static float global_grad_norm(GPT* model, AdamWState* s) {
    dev_zero(s->norm_acc, sizeof(double));
    sum_squares(s->norm_acc, model->grads, model->num_params);
    double sq = 0.0;
    dev_to_host(&sq, s->norm_acc, sizeof(double));
    all_reduce_host(&grid.model_parallel, &sq, 1, REDUCE_SUM);
    return (float)sqrt(sq);
}

// One optimizer step: norm, clipping (Megatron's clip_grad_norm: scale by
// clip / (norm + 1e-6) when that is below 1), AdamW per tensor with its decay. A step whose
// gradient norm is not finite is skipped. Returns the norm before clipping.
static float optimizer_step(GPT* model, AdamWState* s, const AdamWConfig* cfg, float lr, int* skipped) {
    float norm = global_grad_norm(model, s);
    *skipped = !isfinite(norm);
    if (*skipped) return norm;
    float scale = 1.0f;
    if (cfg->clip_grad > 0.0f) {
        float clip_coeff = cfg->clip_grad / (norm + 1e-6f);
        if (clip_coeff < 1.0f) scale = clip_coeff;
    }
    s->step++;
    for (int i = 0; i < model->num_tensors; i++) {
        const TensorDesc* t = &model->tensors[i];
        size_t o = t->offset;
        adamw_update(model->master + o, model->params + o, model->grads + o, s->m + o, s->v + o, t->numel, lr,
                     cfg->beta1, cfg->beta2, cfg->eps, t->weight_decay ? cfg->weight_decay : 0.0f, scale, s->step);
    }
    return norm;
}
