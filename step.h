/*
step.h — one training step above the model: what drives gpt.h's forward and backward over
the grid, and updates the weights.

  - the gradient reduction over DP, overlapped with the last backward (--overlap-grad-reduce);
  - ZeRO-1's parameter all-gather beside the next forward (--overlap-param-gather);
  - the 1F1B pipeline schedule of a step, plain or interleaved (with one stage: forward,
    backward, ...), and the micro-batch slots it needs;
  - ZeRO-1 AdamW: gradients reduce-scattered, master weights and moments sharded 1/DP, the
    global gradient norm (each parameter once) and clipping, the loss scaler, parameters
    all-gathered.

Interface (what train.c, checkpoint.h and the tests use): grad_reducer_init / _free,
param_gatherer_init / _free, Schedule, schedule_for, run_schedule, run_forward_only, step_loss,
schedule_walk, schedule_slots, AdamWConfig, AdamWState,
adamw_init / adamw_free, shard_part, optimizer_step. The model calls back into the
overlapped reduction and gather through the two hooks these inits set in the GPT
(on_gradients_final, on_parameters_needed); gpt.h knows nothing of this file.

It sits above gpt.h and parallel.h in the one include line (train.c includes them in order)
and does its communication through parallel.h's wrappers only.
*/
#pragma once

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

// ----------------------------------------------------------------------------
// sequence parallelism's gradients (Korthikanti et al. 2022, §4.2.2)
// With --sequence-parallel every tensor that tensor parallelism replicates (the tensor table's
// split_axis -1: the LayerNorms, the row-parallel biases, the position embedding) meets only
// this rank's rows of the residual stream, so its gradient here covers 1/TP of the tokens: it
// is summed over the tensor-parallel group once a step, before the data-parallel reduction and
// the norm read it (Megatron-LM marks these parameters `sequence_parallel` and all-reduces their
// gradients in finalize_model_grads). Then every tensor rank holds the same sum, updates the same
// bits, and the norm still counts them on tensor rank 0 alone (counts_in_norm).

// the gradients of the replicated tensors of layers [lo, hi], summed over the tensor ranks
static void sequence_parallel_grads_all_reduce(const GPT* m, int lo, int hi) {
    if (!m->sequence_parallel) return;
    for (int i = 0; i < m->num_tensors; i++) {
        const TensorDesc* t = &m->tensors[i];
        if (t->split_axis < 0 && t->layer >= lo && t->layer <= hi)
            all_reduce(&grid.tp, m->grads + t->offset, t->numel, AS_FLOAT, REDUCE_SUM);
    }
}

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
    const GPT* model;
    GradBucket* buckets;     // in the order they are launched
    int num_buckets, launched;
    int armed;               // the last micro-batch's backward is running
    float* grads;            // the whole flat buffer ...
    float* shard_grad;       // ... and this rank's reduced shard of it
    size_t shard_size;
    StreamEvent grads_written, reduced;
} GradReducer;
static GradReducer grad_reducer;   // one per process, as the grid

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
// that are final now (the backward calls it: the GPT's hook), the layer's sequence-parallel sums first
static void gradients_final_down_to(int layer) {
    GradReducer* r = &grad_reducer;
    if (!r->armed) return;
    sequence_parallel_grads_all_reduce(r->model, layer, layer);
    while (r->launched < r->num_buckets && r->buckets[r->launched].lowest_layer >= layer)   // layer >= 0
        reduce_bucket(r, &r->buckets[r->launched++]);
}

static void grad_reducer_init(GPT* m, float* shard_grad, size_t shard_size, int overlap, size_t bucket_size) {
    GradReducer* r = &grad_reducer;
    memset(r, 0, sizeof(*r));
    r->enabled = overlap && grid.dp_size > 1;
    if (!r->enabled) return;
    r->buckets = (GradBucket*)mallocCheck((m->num_tensors + 1) * sizeof(GradBucket));
    r->num_buckets = grad_buckets(m, bucket_size, r->buckets);
    r->model = m;
    r->grads = m->grads;
    r->shard_grad = shard_grad;
    r->shard_size = shard_size;
    stream_event_create(&r->grads_written);
    stream_event_create(&r->reduced);
    m->on_gradients_final = gradients_final_down_to;   // the backward's hook
}

static void grad_reducer_free(void) {
    GradReducer* r = &grad_reducer;
    if (!r->enabled) return;
    free(r->buckets);
    stream_event_destroy(&r->grads_written);
    stream_event_destroy(&r->reduced);
    memset(r, 0, sizeof(*r));
}

// after the tied embedding's all-reduce: the buckets left (the embedding's), then the compute
// stream waits for every reduce before anything reads the shard or writes the gradients again
static void grad_reducer_finish(void) {
    GradReducer* r = &grad_reducer;
    sequence_parallel_grads_all_reduce(r->model, -1, -1);   // the embedding's
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
static ParamGatherer param_gatherer;   // one per process, as the grid

// the forward is about to read `layer`'s parameters (-1: the embedding's): the compute stream
// waits for the buckets up to the last one holding some of them (the forward calls it: the GPT's hook)
static void parameters_needed(int layer) {
    ParamGatherer* g = &param_gatherer;
    int k = g->waited;
    while (k < g->num_buckets && g->buckets[k].lowest_layer <= layer) k++;
    if (k == g->waited) return;
    compute_waits_for_mark(&g->gathered[k - 1]);
    g->waited = k;
}

static void param_gatherer_init(GPT* m, size_t shard_size, int overlap, size_t bucket_size) {
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
    m->on_parameters_needed = parameters_needed;   // the forward's hook
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
// the schedule of one step: 1F1B (PipeDream-flush; Narayanan et al. 2021, Fig. 4), plain or
// interleaved
// Plain: stage p of P runs min(P - p - 1, M) warm-up forwards, then alternates one forward
// and one backward, then drains the backwards it still owes. With one stage it is simply
// forward, backward, forward, backward, ... (Megatron's no-pipelining schedule).
// Interleaved (§2.2, Fig. 4 bottom; Megatron-LM's forward_backward_pipelining_with_interleaving):
// each rank holds v model chunks, virtual stage c x P + p being chunk c of stage p, so a
// micro-batch goes round the pipeline v times. Micro-batches are taken in groups of G per
// chunk (--microbatch-group-size-per-virtual-pipeline-stage, P by default: Megatron-LM's
// schedule table): G forwards of chunk 0, G of chunk 1, ..., then the next G micro-batches, the
// last group whatever is left; backwards the same with the chunks reversed. A stage warms up
// with 2 (P - p - 1) + (v - 1) G forwards, then 1F1B, then the cool-down. The first stage
// receives chunk c + 1's input P - 1 forwards after it sent chunk c's on, so each group must
// hold P micro-batches at least (config.h refuses the rest, as Megatron-LM does). The bubble
// shrinks from (P - 1) / M of the ideal step to (P - 1) / (v M), for v times the messages.
// Each token's loss enters the gradient with weight dloss = 1 / (tokens in the global
// batch), so summing gradients over micro-batches and data-parallel ranks gives the mean.
//
// A micro-batch's activations through a chunk live in one of the chunk's slots from the moment
// its input arrives (or its forward starts, on virtual stage 0) until its backward ends. A
// chunk's micro-batches run, and finish, in order, so those in flight are consecutive and
// micro-batch j takes slot j mod (the chunk's slots). How many slots each chunk needs is
// counted by walking the very schedule below without a model (schedule_slots), so that the
// arena, the memory plan and the run cannot disagree; the run checks it (take_slot).

typedef void (*LoadMicroBatch)(void* ctx, int micro_batch, int* tokens, int* targets);
// an evaluation's own use of a micro-batch's token losses (the device's m->losses, B x T of
// them), instead of adding their mean to the step's loss (--full-validation: some are padding)
typedef void (*TakeLosses)(void* ctx, int micro_batch, const float* losses);

// A unit of the schedule: micro-batch `micro` through model chunk `chunk` of this stage
// (micro -1: none)
typedef struct {
    int micro, chunk;
} Work;
static const Work NO_WORK = {-1, 0};

// What a walk of the schedule can report, in order (the tests record the order it runs in):
// a forward, a backward, an exchange's start and each of its messages
typedef enum { TRACE_FORWARD, TRACE_BACKWARD, TRACE_EXCHANGE, TRACE_TO_NEXT, TRACE_FROM_PREV, TRACE_TO_PREV,
               TRACE_FROM_NEXT } TraceEvent;
typedef void (*ScheduleTrace)(void* ctx, TraceEvent event, Work w);

typedef struct {
    GPT* model;             // NULL: a walk that runs nothing, only counts slots and traces
    LoadMicroBatch load;
    void* ctx;
    TakeLosses take_losses; // NULL: the mean of each micro-batch's losses adds to the step's
    float dloss;
    int stage, stages;      // this rank's pipeline stage, of how many
    int chunks;             // its model chunks (1: plain 1F1B)
    int group;              // interleaved: micro-batches a chunk takes at a time (0: stages)
    int micro_batches;      // of the step being run (set by the run_*)
    int counted_chunk;      // the chunk whose slots in use are counted (-1: all chunks)
    int held, most_held;    // slots in use, now and at the most
    ScheduleTrace trace;    // (tests) told each forward, backward and message; NULL: none
    void* trace_ctx;
} Schedule;

// a test's look at the trainer's schedules (NULL: none; tests/test_parallel.c records the order)
static ScheduleTrace schedule_trace;
static void* schedule_trace_ctx;
// the run's --microbatch-group-size-per-virtual-pipeline-stage (0: PP), one per process as the
// grid: train.c sets it from the checked config (Megatron-LM's microbatch_group_size_per_vp_stage)
static int microbatch_group_size_per_vp_stage;

// the schedule of this rank's model for one step; dloss 0: forwards only (evaluation)
static Schedule schedule_for(GPT* m, LoadMicroBatch load, void* ctx, float dloss) {
    Schedule s = {m, load, ctx, NULL, dloss, grid.pp_rank, grid.pp_size, m->num_chunks, microbatch_group_size_per_vp_stage,
                  0, -1, 0, 0, schedule_trace, schedule_trace_ctx};
    return s;
}

static void trace(const Schedule* s, TraceEvent event, Work w) {
    if (s->trace) s->trace(s->trace_ctx, event, w);
}


// the slot of a chunk's micro-batch: the chunk's slots, taken in turn
static MicroBatchActivations* slot_of(const Schedule* s, Work w) {
    const GPT* m = s->model;
    int first = 0;
    for (int c = 0; c < w.chunk; c++) first += m->chunk_slots[c];
    return &m->slots[first + w.micro % m->chunk_slots[w.chunk]];
}

// the ends of the (virtual) pipeline: the first virtual stage reads tokens and receives nothing,
// the last computes the loss and sends nothing on
static int first_virtual_stage(const Schedule* s, Work w) { return s->stage == 0 && w.chunk == 0; }
static int last_virtual_stage(const Schedule* s, Work w) { return s->stage == s->stages - 1 && w.chunk == s->chunks - 1; }

// w's slot is in use from now: counted, and (in a run) checked free
static void take_slot(Schedule* s, Work w) {
    if (s->counted_chunk < 0 || s->counted_chunk == w.chunk)
        if (++s->held > s->most_held) s->most_held = s->held;
    if (!s->model) return;
    MicroBatchActivations* a = slot_of(s, w);
    if (a->holder >= 0)
        fail("the schedule gave micro-batch %d of chunk %d the slot micro-batch %d still holds (the slots planned are "
             "fewer than it needs)", w.micro, w.chunk, a->holder);
    a->holder = w.micro;
}

static void release_slot(Schedule* s, Work w) {
    if (s->counted_chunk < 0 || s->counted_chunk == w.chunk) s->held--;
    if (s->model) slot_of(s, w)->holder = -1;
}

// One exchange with the neighbouring stages: the output of forward `out` to the next stage, the
// input of forward `in` from the previous, the input's gradient of backward `grad_out` to the
// previous, the output's gradient for backward `grad_in` from the next (NO_WORK: none; nothing
// crosses the virtual pipeline's ends). An input that arrives takes its slot. Its gradient
// arrives in dres, or with interleaving in the slot (dres is being sent in the same exchange,
// and the gradient may wait there while other work runs).
static void exchange(Schedule* s, Work out, Work in, Work grad_out, Work grad_in) {
    if (out.micro >= 0 && last_virtual_stage(s, out)) out = NO_WORK;
    if (in.micro >= 0 && first_virtual_stage(s, in)) in = NO_WORK;
    if (grad_out.micro >= 0 && first_virtual_stage(s, grad_out)) grad_out = NO_WORK;
    if (grad_in.micro >= 0 && last_virtual_stage(s, grad_in)) grad_in = NO_WORK;
    if (out.micro < 0 && in.micro < 0 && grad_out.micro < 0 && grad_in.micro < 0) return;
    trace(s, TRACE_EXCHANGE, NO_WORK);
    Work works[4] = {out, in, grad_out, grad_in};
    TraceEvent events[4] = {TRACE_TO_NEXT, TRACE_FROM_PREV, TRACE_TO_PREV, TRACE_FROM_NEXT};
    for (int k = 0; k < 4; k++)
        if (works[k].micro >= 0) trace(s, events[k], works[k]);
    if (in.micro >= 0) take_slot(s, in);
    GPT* m = s->model;
    if (!m) return;
    floatX* grad = NULL;
    if (grad_in.micro >= 0) grad = s->chunks > 1 ? slot_of(s, grad_in)->dout : m->dres;
    send_forward_backward_recv_forward_backward(out.micro >= 0 ? stage_output(slot_of(s, out)) : NULL,
                                                grad_out.micro >= 0 ? m->dres : NULL,
                                                in.micro >= 0 ? slot_of(s, in)->input : NULL, grad, residual_elems(m));
}

static void forward_step(Schedule* s, Work w) {
    trace(s, TRACE_FORWARD, w);
    if (first_virtual_stage(s, w)) take_slot(s, w);   // (elsewhere its input took it)
    GPT* m = s->model;
    if (!m) return;
    activity_phase("forward", activity.iteration, w.micro);
    MicroBatchActivations* a = slot_of(s, w);
    trace_begin_micro("forward", w.micro, w.chunk, global_layer(m, a->first), a->end - a->first);
    int head = chunk_holds_head(m, w.chunk);
    if (chunk_holds_embedding(m, w.chunk) || head) s->load(s->ctx, w.micro, a->tokens, a->targets);
    pipeline_before_writing(stage_output(a));   // the slot's last output may still be on its way
    gpt_forward_stage(m, (int)(a - m->slots), s->dloss);   // dloss 0 (evaluation): no backward follows
    if (head && s->take_losses) s->take_losses(s->ctx, w.micro, m->losses);
    else if (head) loss_mean_add(m->loss_sum, m->losses, m->B * m->T);   // no host copy per micro-batch
    trace_end();
}

// micro-batch w.micro of M: the last one adds its chunk's gradients' last terms (the overlap's cue)
static void backward_step(Schedule* s, Work w, int M) {
    trace(s, TRACE_BACKWARD, w);
    GPT* m = s->model;
    if (m) {
        activity_phase("backward", activity.iteration, w.micro);
        MicroBatchActivations* a = slot_of(s, w);
        trace_begin_micro("backward", w.micro, w.chunk, global_layer(m, a->first), a->end - a->first);
        grad_reducer.armed = grad_reducer.enabled && w.micro == M - 1;
        pipeline_before_writing(m->dres);   // (in 1F1B an exchange that receives comes between)
        if (a->dout) dev_copy(m->dres, a->dout, residual_elems(m) * sizeof(floatX));   // the gradient that came ahead
        gpt_backward(m, (int)(a - m->slots));
        trace_end();
    }
    release_slot(s, w);
}

static void finish_exchanges(const Schedule* s) {
    if (s->model) wait_for_exchanges();   // the step's own work: none of it left queued behind the optimizer
}

// micro-batch j through plain 1F1B's one chunk
static Work plain_work(int j) {
    Work w = {j, 0};
    return w;
}

static void run_1f1b(Schedule* s, int M) {
    int warmup = s->stages - s->stage - 1;
    if (warmup > M) warmup = M;
    int steady = M - warmup, fwd = 0, bwd = 0;
    // warm-up: each output goes on while the next input comes in (one exchange, not two)
    if (M > 0) exchange(s, NO_WORK, plain_work(0), NO_WORK, NO_WORK);   // receive forward
    for (int i = 0; i < warmup; i++, fwd++) {
        forward_step(s, plain_work(fwd));
        exchange(s, plain_work(fwd), fwd + 1 < M ? plain_work(fwd + 1) : NO_WORK, NO_WORK, NO_WORK);
    }
    // steady 1F1B
    for (int i = 0; i < steady; i++, fwd++, bwd++) {
        forward_step(s, plain_work(fwd));
        exchange(s, plain_work(fwd), NO_WORK, NO_WORK, plain_work(bwd));   // send forward, receive backward
        backward_step(s, plain_work(bwd), M);
        exchange(s, NO_WORK, i < steady - 1 ? plain_work(fwd + 1) : NO_WORK, plain_work(bwd), NO_WORK);
    }
    // cool-down
    for (int i = 0; i < warmup; i++, bwd++) {
        exchange(s, NO_WORK, NO_WORK, NO_WORK, plain_work(bwd));   // receive backward
        backward_step(s, plain_work(bwd), M);
        exchange(s, NO_WORK, NO_WORK, plain_work(bwd), NO_WORK);   // send backward
    }
    finish_exchanges(s);
}

// micro-batches a chunk takes at a time (G; P by default, Megatron-LM's)
static int group_size(const Schedule* s) { return s->group > 0 ? s->group : s->stages; }

// The k-th forward of a stage in the interleaved schedule, from Megatron-LM's schedule table:
// the micro-batches cut into groups of G from the first (the last group what is left: G or
// fewer), each group through chunk 0, then chunk 1, ... (get_schedule_table)
static Work forward_work(const Schedule* s, int k) {
    int G = group_size(s), first = k / (G * s->chunks) * G;   // the group's first micro-batch
    int size = s->micro_batches - first < G ? s->micro_batches - first : G, j = k - first * s->chunks;
    Work w = {first + j % size, j / size};
    return w;
}

// the k-th backward: the same micro-batches, the chunks in reverse (NO_WORK for k < 0)
static Work backward_work(const Schedule* s, int k) {
    if (k < 0) return NO_WORK;
    Work w = forward_work(s, k);
    w.chunk = s->chunks - 1 - w.chunk;
    return w;
}

// What arrives from the previous stage in the exchange after forward fk: the next forward's
// input, but on the first stage the last stage's output of P - 1 forwards back (the first stage
// runs that far ahead), for the next chunk, which runs it when that micro-batch's group comes to
// that chunk (G - P + 1 forwards later: an input may wait in its slot); what arrives from the
// next stage after backward k: the next backward's gradient, but on the last stage the first
// stage's of P - 1 backwards back, for the chunk before (Megatron-LM's rule both ways:
// recv_tensor_from_previous_stage)
static Work next_input(const Schedule* s, int fk, int total) {
    if (s->stage > 0) return fk + 1 < total ? forward_work(s, fk + 1) : NO_WORK;
    if (fk < s->stages - 1) return NO_WORK;
    Work w = forward_work(s, fk - (s->stages - 1));
    return ++w.chunk < s->chunks ? w : NO_WORK;
}
static Work next_gradient(const Schedule* s, int k, int total) {
    if (s->stage < s->stages - 1) return k + 1 < total ? backward_work(s, k + 1) : NO_WORK;
    Work w = backward_work(s, k - (s->stages - 1));
    return w.micro >= 0 && --w.chunk >= 0 ? w : NO_WORK;
}

// Megatron-LM's interleaved schedule (as its versions since the schedule table run it; up to
// core 0.9 every stage ran all its forwards first when M = P: see docs/parallelism.md)
static void run_interleaved_1f1b(Schedule* s, int M) {
    int P = s->stages, total = M * s->chunks;
    int warmup = 2 * (P - s->stage - 1) + (s->chunks - 1) * group_size(s);
    if (warmup > total) warmup = total;
    int steady = total - warmup;
    s->micro_batches = M;
    // warm-up: each output goes on while the next input comes in, the last one's exchange also
    // bringing the first backward's gradient
    exchange(s, NO_WORK, forward_work(s, 0), NO_WORK, NO_WORK);   // receive forward
    for (int k = 0; k < warmup; k++) {
        forward_step(s, forward_work(s, k));
        exchange(s, forward_work(s, k), next_input(s, k, total), NO_WORK, k == warmup - 1 ? backward_work(s, 0) : NO_WORK);
    }
    // steady 1F1B: one exchange after each pair, all four messages at once
    for (int k = 0; k < steady; k++) {
        int fk = k + warmup;
        forward_step(s, forward_work(s, fk));
        backward_step(s, backward_work(s, k), M);
        exchange(s, forward_work(s, fk), next_input(s, fk, total), backward_work(s, k), next_gradient(s, k, total));
    }
    // cool-down
    for (int k = steady; k < total; k++) {
        backward_step(s, backward_work(s, k), M);
        exchange(s, NO_WORK, NO_WORK, backward_work(s, k), next_gradient(s, k, total));
    }
    finish_exchanges(s);
}

// forwards only, for evaluation: plain, each input in, the forward, its output on; interleaved,
// in the training's forward order (Megatron-LM's forward-only pass), each output going on while
// the next input comes in
static void run_forward_only(Schedule* s, int M) {
    if (s->chunks == 1) {
        for (int i = 0; i < M; i++) {
            exchange(s, NO_WORK, plain_work(i), NO_WORK, NO_WORK);
            forward_step(s, plain_work(i));
            release_slot(s, plain_work(i));
            exchange(s, plain_work(i), NO_WORK, NO_WORK, NO_WORK);
        }
    } else {
        int total = M * s->chunks;
        s->micro_batches = M;
        exchange(s, NO_WORK, forward_work(s, 0), NO_WORK, NO_WORK);
        for (int k = 0; k < total; k++) {
            forward_step(s, forward_work(s, k));
            release_slot(s, forward_work(s, k));
            exchange(s, forward_work(s, k), next_input(s, k, total), NO_WORK, NO_WORK);
        }
    }
    finish_exchanges(s);
}

// one training step's forwards and backwards
static void run_schedule(Schedule* s, int M) {
    if (s->chunks > 1) run_interleaved_1f1b(s, M);
    else run_1f1b(s, M);
}

// a walk of stage `stage`'s schedule (`group`: micro-batches a chunk takes at a time, 0: stages)
// that runs nothing: it counts chunk `counted_chunk`'s slots in use (-1: every chunk's) and tells
// `trace` each forward, backward and message
static Schedule schedule_walk(int stage, int stages, int chunks, int group, int counted_chunk, ScheduleTrace trace,
                              void* ctx) {
    Schedule s = {NULL, NULL, NULL, NULL, 0.0f, stage, stages, chunks, group, 0, counted_chunk, 0, 0, trace, ctx};
    return s;
}

// The slots stage `stage` of `stages` needs for each of its `chunks` model chunks (taking `group`
// micro-batches at a time) in a step of M micro-batches (forward_only: an evaluation's), at least
// the slots[c] given: the most micro-batches the chunk holds at once in a walk of the schedule
// above (no model: nothing runs, one walk per chunk). Plain 1F1B: min(P - p, M) for training, 1
// for an evaluation.
static void schedule_slots(int stage, int stages, int chunks, int group, int M, int forward_only, int* slots) {
    for (int c = 0; c < chunks; c++) {
        Schedule s = schedule_walk(stage, stages, chunks, group, c, NULL, NULL);
        if (forward_only) run_forward_only(&s, M);
        else run_schedule(&s, M);
        if (s.most_held > slots[c]) slots[c] = s.most_held;
    }
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
    int hysteresis_tracker;   // overflows left before the scale halves; below 0 after more
                              // overflows than that, as in Megatron (a checkpoint stores it so)
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
    ShardRange* ranges;  // device table: the shard's part of each tensor, in order (shard_ranges), cut
    int num_ranges;      // into the pieces the kernels walk (kernels.cuh's shard_pieces)
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
    size_t room = shard_pieces_max(model->build, model->num_tensors, s->shard_size);   // the same on every rank
    ShardRange* pieces = (ShardRange*)mallocCheck(room * sizeof(ShardRange));
    int parts = shard_ranges(s, model, table);
    s->num_ranges = shard_pieces(table, parts, shard_piece_size(model->build), pieces);
    s->ranges = (ShardRange*)dev_malloc(room * sizeof(ShardRange));   // as planned
    host_to_dev(s->ranges, pieces, s->num_ranges * sizeof(ShardRange));
    free(pieces);
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

// the rest of what adamw_init allocates on build b for a flat buffer of `padded` elements over
// DP ranks: norm_acc, the gradient norm's device scalar, and the shard's range table, room for
// the pieces of one range per tensor (the same size on every rank)
static size_t adamw_workspace_bytes(BuildTarget b, int num_tensors, size_t padded, int dp_size) {
    return sizeof(double) + shard_pieces_max(b, num_tensors, padded / dp_size) * sizeof(ShardRange);
}

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
    if (grid.embedding.size > 1 && !model->cfg.untie_embeddings_and_output_weights) {   // the tied copies get the sum
        const TensorDesc* wte = &model->tensors[model->wte];
        all_reduce(&grid.embedding, model->grads + wte->offset, wte->numel, AS_FLOAT, REDUCE_SUM);
    }
    param_gather_finish();   // (the forward waited for every bucket; a stage without layers did not)
    if (!grad_reducer.enabled) sequence_parallel_grads_all_reduce(model, -1, INT_MAX);   // (else in the buckets' turn)
    if (grad_reducer.enabled) grad_reducer_finish();   // reduced while the backward ran
    else if (grid.dp_size > 1) reduce_scatter(&grid.dp, model->grads, s->grad, s->shard_size, AS_FLOAT);
    float unscale = 1.0f / s->scaler.scale;
    trace_begin("gradient norm", "optimizer", ON_COMPUTE_STREAM);
    float norm = global_grad_norm(s) * unscale;
    trace_end();
    *skipped = !isfinite(norm);
    loss_scaler_update(&s->scaler, *skipped);
    if (*skipped) return norm;
    float scale = unscale;
    if (cfg->clip_grad > 0.0f) {
        float clip_coeff = cfg->clip_grad / (norm + 1e-6f);
        if (clip_coeff < 1.0f) scale = unscale * clip_coeff;
    }
    s->step++;
    trace_begin("AdamW", "optimizer", ON_COMPUTE_STREAM);
    adamw_update_ranges(s->master, model->params + s->shard_start, s->grad, s->m, s->v, s->shard_size, s->ranges,
                        s->num_ranges, lr, cfg->beta1, cfg->beta2, cfg->eps, cfg->weight_decay, scale, s->step);
    trace_end();
    if (param_gatherer.enabled) param_gather_launch();   // waited for by the next forward
    else all_gather(&grid.dp, model->params + s->shard_start, model->params, s->shard_size);
    return norm;
}
