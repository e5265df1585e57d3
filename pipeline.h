/*
pipeline.h — pipeline parallelism: the schedule of one step's forwards and backwards over the
stages, and the exchanges between neighbouring stages that carry the activations forward and
their gradients back.

  - 1F1B (PipeDream-flush; Narayanan et al. 2021), plain or interleaved (virtual stages, in
    Megatron-LM's order with its micro-batch groups); with one stage simply forward, backward,
    forward, ...; GPipe (all forwards, then all backwards); ZB-H1 (each backward split in two, its
    weights' part deferred into the bubble); and an evaluation's forwards alone;
  - one exchange with the neighbouring stages per turn of the schedule (an output on, an input
    in, a gradient back, a gradient in), nothing crossing the virtual pipeline's ends;
  - the micro-batch slots: which slot holds a micro-batch's activations through a chunk, and
    how many each chunk needs (and the head's logits), counted by walking the very schedule
    without a model (schedule_walk, schedule_slots, schedule_head_logits) — the walk
    --print-schedule draws.

What a reader learns here: the schedules read top-down as the papers' figures (warm-up,
steady 1F1B, cool-down), how interleaving orders the work and what arrives when, why a stage
holds the activations it holds, and that the schedule has no first- or last-stage branches
(the exchange drops what would cross an end), and how splitting the backward (ZB-H1) lets the
input gradients race back up the pipeline while the weights' gradients wait for the bubble.

Interface (what step.h, loader.h, print_schedule.h, train.c and the tests use): LoadMicroBatch,
TakeLosses, Work, TraceEvent, ScheduleTrace, PipelineSchedule, Schedule, schedule_trace, schedule_trace_ctx,
microbatch_group_size_per_vp_stage, pipeline_schedule, schedule_for, run_schedule, run_1f1b, run_forward_only,
schedule_walk, schedule_slots, schedule_head_logits.

It sits above gpt.h (a micro-batch's forward and backward through a chunk), parallel.h (the
exchange, pipeline_before_writing, wait_for_exchanges) and data_parallel.h (the last
micro-batch's backward arms the overlapped gradient reduction) in the one include line.
*/
#pragma once

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
// hold P micro-batches at least (config.h refuses the rest, as Megatron-LM does). A last group
// shorter than G (P or more) runs too: there the last stage runs head forwards ahead of their
// backwards, each keeping its logits until then (schedule_head_logits, below). The bubble
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
// a forward, a backward (ZB-H1: its input gradients alone), ZB-H1's weight pass, an exchange's
// start and each of its messages
typedef enum { TRACE_FORWARD, TRACE_BACKWARD, TRACE_EXCHANGE, TRACE_TO_NEXT, TRACE_FROM_PREV, TRACE_TO_PREV,
               TRACE_FROM_NEXT, TRACE_WEIGHT } TraceEvent;
typedef void (*ScheduleTrace)(void* ctx, TraceEvent event, Work w);

// --pipeline-schedule, in its choices' order
typedef enum { SCHEDULE_1F1B, SCHEDULE_GPIPE, SCHEDULE_ZB_H1 } PipelineSchedule;

typedef struct {
    GPT* model;             // NULL: a walk that runs nothing, only counts slots and traces
    LoadMicroBatch load;
    void* ctx;
    TakeLosses take_losses; // NULL: the mean of each micro-batch's losses adds to the step's
    float dloss;
    PipelineSchedule kind;
    int stage, stages;      // this rank's pipeline stage, of how many
    int chunks;             // its model chunks (1: plain 1F1B)
    int group;              // interleaved: micro-batches a chunk takes at a time (0: stages)
    int micro_batches;      // of the step being run (set by the run_*)
    int counted_chunk;      // the chunk whose slots in use are counted (-1: all chunks)
    int held, most_held;    // slots in use, now and at the most
    ScheduleTrace trace;    // (tests) told each forward, backward and message; NULL: none
    void* trace_ctx;
    int logits_held, most_logits_held;   // the head's micro-batches between forward and backward, now and at the most
} Schedule;

// a test's look at the trainer's schedules (NULL: none; tests/test_parallel.c records the order)
static ScheduleTrace schedule_trace;
static void* schedule_trace_ctx;
// the run's --microbatch-group-size-per-virtual-pipeline-stage (0: PP), one per process as the
// grid: train.c sets it from the checked config (Megatron-LM's microbatch_group_size_per_vp_stage)
static int microbatch_group_size_per_vp_stage;
// the run's --pipeline-schedule, set by train.c beside it
static PipelineSchedule pipeline_schedule;

// the schedule of this rank's model for one step; dloss 0: forwards only (evaluation)
static Schedule schedule_for(GPT* m, LoadMicroBatch load, void* ctx, float dloss) {
    Schedule s = {m, load, ctx, NULL, dloss, pipeline_schedule, grid.pp_rank, grid.pp_size, m->num_chunks,
                  microbatch_group_size_per_vp_stage, 0, -1, 0, 0, schedule_trace, schedule_trace_ctx, 0, 0};
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

// The head's micro-batches whose forward has run and backward not yet, counted (change +1 at a
// head forward, -1 at its backward, or at once in an evaluation): each keeps its dlogits in a
// logits buffer of its own until its backward (gpt.h's logits_of)
static void count_head_logits(Schedule* s, Work w, int change) {
    if (!last_virtual_stage(s, w)) return;
    s->logits_held += change;
    if (s->logits_held > s->most_logits_held) s->most_logits_held = s->logits_held;
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
    count_head_logits(s, w, +1);
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

// ZB-H1 splits each backward: B, the input gradients (what the previous stage waits for), and W,
// the linear layers' weight gradients, run later from what B left in the slot (layers.h)
static int defers_weights(const Schedule* s) { return s->kind == SCHEDULE_ZB_H1; }

// What a backward and ZB-H1's weight pass of micro-batch w both begin with: the walk's event,
// and with a model the watchdog's phase, the profile's span (closed by the caller's trace_end)
// and the overlapped reduction armed if this pass adds the stage's gradients' last terms
// (`last`). Returns w's slot, NULL on a walk without a model (--print-schedule).
static MicroBatchActivations* begin_gradient_pass(Schedule* s, Work w, TraceEvent event, const char* phase,
                                                  const char* span, int last) {
    trace(s, event, w);
    GPT* m = s->model;
    if (!m) return NULL;
    activity_phase(phase, activity.iteration, w.micro);
    MicroBatchActivations* a = slot_of(s, w);
    trace_begin_micro(span, w.micro, w.chunk, global_layer(m, a->first), a->end - a->first);
    grad_reducer.armed = grad_reducer.enabled && last;
    return a;
}

// micro-batch w.micro of M: the last one adds its chunk's gradients' last terms (the overlap's
// cue), but with ZB-H1 its weight pass does (weight_step), which also frees the slot
static void backward_step(Schedule* s, Work w, int M) {
    GPT* m = s->model;
    MicroBatchActivations* a =
        begin_gradient_pass(s, w, TRACE_BACKWARD, "backward", "backward", w.micro == M - 1 && !defers_weights(s));
    if (a) {
        pipeline_before_writing(m->dres);   // (in 1F1B an exchange that receives comes between)
        if (a->dout) dev_copy(m->dres, a->dout, residual_elems(m) * sizeof(floatX));   // the gradient that came ahead
        m->weights_deferred = defers_weights(s);
        gpt_backward(m, (int)(a - m->slots));
        m->weights_deferred = 0;
        trace_end();
    }
    count_head_logits(s, w, -1);
    if (!defers_weights(s)) release_slot(s, w);
}

// ZB-H1's W of micro-batch w.micro of M: the linear layers' weight gradients, each added in
// micro-batch order as 1F1B adds them (the W passes run in order). The last one's make the
// stage's gradients final, so it arms the overlapped reduction, which its backward did not.
static void weight_step(Schedule* s, Work w, int M) {
    MicroBatchActivations* a = begin_gradient_pass(s, w, TRACE_WEIGHT, "weight gradients", "weights", w.micro == M - 1);
    if (a) {
        gpt_backward_weights(s->model, (int)(a - s->model->slots));
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

// ZB-H1 (Qi et al. 2023, Fig. 3): 1F1B's order, but stage p runs each W p backwards after its B
// (the last stage's W waits longest, the first stage's not at all), and the W's left after the
// last backward at the end: the input gradients come back up the pipeline at B's pace, not B +
// W's, and the W's fill the cool-down. A stage then holds at most P micro-batches between their
// forward and their W (P - p before their B, p after it), 1F1B's first stage's P: the peak over
// the stages is 1F1B's (a W runs before the next input arrives: run_1f1b's steady phase). In
// 1F1B every W runs inside its backward: nothing deferred.
static void weights_after_backward(Schedule* s, int bwd, int M, int* weights) {
    if (!defers_weights(s)) return;
    if (bwd >= s->stage) weight_step(s, plain_work((*weights)++), M);
    if (bwd == M - 1)
        while (*weights < M) weight_step(s, plain_work((*weights)++), M);
}

static void run_1f1b(Schedule* s, int M) {
    int warmup = s->stages - s->stage - 1;
    if (warmup > M) warmup = M;
    int steady = M - warmup, fwd = 0, bwd = 0, weights = 0;
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
        Work next = i < steady - 1 ? plain_work(fwd + 1) : NO_WORK;
        if (!defers_weights(s)) {
            exchange(s, NO_WORK, next, plain_work(bwd), NO_WORK);   // receive forward, send backward
            continue;
        }
        // ZB-H1: the gradient on at once, then the W, then the next input, whose slot the W may have freed
        exchange(s, NO_WORK, NO_WORK, plain_work(bwd), NO_WORK);
        weights_after_backward(s, bwd, M, &weights);
        exchange(s, NO_WORK, next, NO_WORK, NO_WORK);
    }
    // cool-down
    for (int i = 0; i < warmup; i++, bwd++) {
        exchange(s, NO_WORK, NO_WORK, NO_WORK, plain_work(bwd));   // receive backward
        backward_step(s, plain_work(bwd), M);
        exchange(s, NO_WORK, NO_WORK, plain_work(bwd), NO_WORK);   // send backward
        weights_after_backward(s, bwd, M, &weights);
    }
    finish_exchanges(s);
}

// GPipe (Huang et al. 2019): every forward, each output going on while the next input comes in,
// then every backward, in micro-batch order (the gradients then add up in 1F1B's order). The
// bubble is 1F1B's, (P - 1) / (M + P - 1), but a stage holds all M micro-batches at once (and the
// last stage M micro-batches' logits): the memory 1F1B was made to save. For teaching.
static void run_gpipe(Schedule* s, int M) {
    if (M > 0) exchange(s, NO_WORK, plain_work(0), NO_WORK, NO_WORK);   // receive forward
    for (int j = 0; j < M; j++) {
        forward_step(s, plain_work(j));
        exchange(s, plain_work(j), j + 1 < M ? plain_work(j + 1) : NO_WORK, NO_WORK, NO_WORK);
    }
    for (int j = 0; j < M; j++) {
        exchange(s, NO_WORK, NO_WORK, NO_WORK, plain_work(j));   // receive backward
        backward_step(s, plain_work(j), M);
        exchange(s, NO_WORK, NO_WORK, plain_work(j), NO_WORK);   // send backward
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
            count_head_logits(s, plain_work(i), -1);
            release_slot(s, plain_work(i));
            exchange(s, plain_work(i), NO_WORK, NO_WORK, NO_WORK);
        }
    } else {
        int total = M * s->chunks;
        s->micro_batches = M;
        exchange(s, NO_WORK, forward_work(s, 0), NO_WORK, NO_WORK);
        for (int k = 0; k < total; k++) {
            forward_step(s, forward_work(s, k));
            count_head_logits(s, forward_work(s, k), -1);
            release_slot(s, forward_work(s, k));
            exchange(s, forward_work(s, k), next_input(s, k, total), NO_WORK, NO_WORK);
        }
    }
    finish_exchanges(s);
}

// one training step's forwards and backwards (config.h lets only 1F1B interleave)
static void run_schedule(Schedule* s, int M) {
    if (s->chunks > 1) run_interleaved_1f1b(s, M);
    else if (s->kind == SCHEDULE_GPIPE) run_gpipe(s, M);
    else run_1f1b(s, M);   // and ZB-H1
}

// a walk of stage `stage`'s schedule `kind` (`group`: micro-batches a chunk takes at a time, 0:
// stages) that runs nothing: it counts chunk `counted_chunk`'s slots in use (-1: every chunk's)
// and tells `trace` each forward, backward, weight pass and message
static Schedule schedule_walk(PipelineSchedule kind, int stage, int stages, int chunks, int group, int counted_chunk,
                              ScheduleTrace trace, void* ctx) {
    Schedule s = {NULL, NULL, NULL, NULL, 0.0f, kind, stage, stages, chunks, group, 0, counted_chunk, 0, 0, trace, ctx, 0, 0};
    return s;
}

// The slots stage `stage` of `stages` needs for each of its `chunks` model chunks (taking `group`
// micro-batches at a time) in a step of M micro-batches (forward_only: an evaluation's), at least
// the slots[c] given: the most micro-batches the chunk holds at once in a walk of the schedule
// above (no model: nothing runs, one walk per chunk). Plain 1F1B: min(P - p, M) for training, 1
// for an evaluation; GPipe M; ZB-H1 min(P, M) (a slot is freed by its W).
static void schedule_slots(PipelineSchedule kind, int stage, int stages, int chunks, int group, int M, int forward_only,
                           int* slots) {
    for (int c = 0; c < chunks; c++) {
        Schedule s = schedule_walk(kind, stage, stages, chunks, group, c, NULL, NULL);
        if (forward_only) run_forward_only(&s, M);
        else run_schedule(&s, M);
        if (s.most_held > slots[c]) slots[c] = s.most_held;
    }
}

// The logits the last stage's head keeps at once in a training step of M micro-batches: one
// micro-batch's, whose backward follows its forward at once; but with interleaving a last group
// of micro-batches shorter than the others (M mod G of them, P at least) runs head forwards ahead
// of their backwards in Megatron-LM's order, and GPipe all M: then the most a walk of the last
// stage holds (ZB-H1's head keeps its logits only until its B: the output layer's weight
// gradient is not deferred, layers.h)
static int schedule_head_logits(PipelineSchedule kind, int stages, int chunks, int group, int M) {
    Schedule s = schedule_walk(kind, stages - 1, stages, chunks, group, -1, NULL, NULL);
    run_schedule(&s, M);
    return s.most_logits_held > 1 ? s.most_logits_held : 1;
}
