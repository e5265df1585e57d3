/*
zero.h — ZeRO-2 and ZeRO-3 (--zero-stage 2 | 3; Rajbhandari et al. 2020, stages 2 and 3; ZeRO-3 is
PyTorch's FSDP FULL_SHARD): on ZeRO-1's shards (data_parallel.h), the gradients and then the
parameters sharded too, so that a rank keeps of them only its 1/DP plus the layers in flight.

  - the units: the embedding's tensors, each transformer layer's, the head's (the final norm, the
    output layer), each a run of the flat buffers; what is gathered and reduced together;
  - the windows: with ZeRO-2 the gradient buffer (m->grads) holds the embedding's and the head's
    gradients and TWO layers' (layer i's tensors mapped onto place i mod 2: one written by the
    backward while the other's reduce runs on the communication stream); with ZeRO-3 the
    parameter buffer (m->params) holds the embedding and the head and two layers' places (the one
    computing, the one gathered ahead), or with --no-reshard-after-forward every layer's. The model
    finds a tensor through param_of / grad_of, which read the tensor table's param_at / grad_at:
    this room moves those, gpt.h never calls it (zero_plan_windows, before anything is allocated);
  - ZeRO-2: after each layer's backward, in every micro-batch, its gradients summed over DP x CP
    onto the rank whose shard holds each part (a reduce per rank's part: the reduce-scatter's
    bytes), queued on the communication stream beside the next layer's backward; when that one
    ends, the sums added into the rank's fp32 shard accumulator and the place zeroed for the layer
    after it (DeepSpeed's way with gradient accumulation: reduce each micro-batch, accumulate the shard, in
    place of ZeRO-1's whole-buffer accumulation and one reduce-scatter a step). The embedding's and
    the head's gradients stay in the window the whole step (the tied embedding's all-reduce over
    the embedding group needs the step's sum), reduced once at the step's end;
  - ZeRO-3: before a layer's forward and again before its backward (the model's on_parameters_needed
    hook) the layer is all-gathered into a place of the window (a broadcast of each rank's part from
    its shard: the all-gather's bytes), the next layer's gather queued on the communication stream
    at once (the prefetch: forward goes up, backward down); a place is reused, so a layer is freed,
    once two others were needed after it (reshard_after_forward, FSDP2's default). With
    --no-reshard-after-forward each layer keeps its own place from its first gather to the optimizer
    step. The embedding and the head are gathered after each optimizer step and kept (torchtitan's
    root module and its output layer, which FSDP2 does not reshard); AdamW writes the shard.

What a reader learns here: where the memory of ZeRO-2 and ZeRO-3 goes (the bytes a parameter in
docs/parallelism.md), what moves when, and that a window plus a mapping is all the model needs.

Interface (what step.h, train.c, plan.h and checkpoint.h use): zero_plan_windows (the plan),
zero_init / zero_free, zero_step_begin (gradients zeroed), zero_reduce_edges (the step's end),
zero3_after_update (the parameters after AdamW); config.h refuses what they do not run (check_zero_stage).

It sits above data_parallel.h (the shards) and below pipeline.h and step.h in the one include
line, and talks through parallel.h's wrappers only.
*/
#pragma once

// ----------------------------------------------------------------------------
// units and windows

typedef struct {
    int layer;              // -1: the embedding's tensors, num_layers: the head's, else a transformer layer
    size_t start, end;      // [start, end) of the flat buffers
    size_t window_at;       // where the window holds it (the edges; a layer's place: the slot's)
} ZeroUnit;

// the model's units in flat order: consecutive tensors of one layer are one unit; `out` has room
// for num_local_layers + 2; returns how many. Each layer's tensors must be one run (they are:
// build_tensor_table adds them so; the experts' region is refused with ZeRO-2/3).
static int zero_units(const GPT* m, ZeroUnit* out) {
    int n = 0;
    for (int i = 0; i < m->num_tensors; i++) {
        const TensorDesc* t = &m->tensors[i];
        if (n > 0 && out[n - 1].layer == t->layer && out[n - 1].end == t->offset) {
            out[n - 1].end = t->offset + t->numel;
            continue;
        }
        for (int k = 0; k < n; k++)
            if (out[k].layer == t->layer) fail("ZeRO-2/3: layer %d's tensors are not one run of the flat buffer", t->layer);
        if (n >= m->num_local_layers + 2) fail("ZeRO-2/3: more units than layers + 2");
        ZeroUnit u = {t->layer, t->offset, t->offset + t->numel, 0};
        out[n++] = u;
    }
    return n;
}

// the local index of global layer l (-1: not on this rank)
static int local_layer_index(const GPT* m, int l) {
    for (int i = 0; i < m->num_local_layers; i++)
        if (global_layer(m, i) == l) return i;
    return -1;
}

static int is_edge_unit(const GPT* m, const ZeroUnit* u) { return u->layer < 0 || u->layer >= m->cfg.num_layers; }

// The windows' layout: the edges packed from 0, then `places` places of the largest layer's size.
// Sets each edge unit's window_at and returns the edges' total; *largest = the largest layer's size.
static size_t zero_window_layout(const GPT* m, ZeroUnit* units, int n, size_t* largest) {
    size_t edges = 0;
    *largest = 0;
    for (int k = 0; k < n; k++) {
        size_t len = units[k].end - units[k].start;
        if (is_edge_unit(m, &units[k])) {
            units[k].window_at = edges;
            edges += len;
        } else if (len > *largest) *largest = len;
    }
    return edges;
}

// the tensors of unit u found at window place `at` (grads: grad_at, else param_at)
static void map_unit(GPT* m, const ZeroUnit* u, size_t at, int grads) {
    for (int i = 0; i < m->num_tensors; i++) {
        TensorDesc* t = &m->tensors[i];
        if (t->offset < u->start || t->offset >= u->end) continue;
        if (grads) t->grad_at = at + (t->offset - u->start);
        else t->param_at = at + (t->offset - u->start);
    }
}

// --zero-stage's plan, before anything is allocated (the trainer's and the planner's model alike):
// stage 2 makes the gradient buffer a window of the edges and two layers' places; stage 3 also the
// parameter buffer one of the edges and two places (every layer's with reshard 0). Stage 0 and 1:
// nothing changes. The model keeps the stage for the planner (stage_memory).
static void zero_plan_windows(GPT* m, int stage, int reshard_after_forward) {
    m->zero_stage = stage < 1 ? 1 : stage;
    m->zero3_places = 0;
    if (stage < 2) return;
    ZeroUnit* units = (ZeroUnit*)mallocCheck((m->num_local_layers + 2) * sizeof(ZeroUnit));
    int n = zero_units(m, units);
    size_t largest, edges = zero_window_layout(m, units, n, &largest);
    for (int k = 0; k < n; k++)   // (local layer i at place i mod 2)
        map_unit(m, &units[k], is_edge_unit(m, &units[k]) ? units[k].window_at
                                                         : edges + (size_t)(local_layer_index(m, units[k].layer) % 2) * largest, 1);
    m->grads_length = edges + (size_t)(m->num_local_layers < 2 ? m->num_local_layers : 2) * largest;
    if (stage >= 3) {
        m->zero3_places = reshard_after_forward ? (m->num_local_layers < 2 ? m->num_local_layers : 2) : m->num_local_layers;
        for (int k = 0; k < n; k++) map_unit(m, &units[k], is_edge_unit(m, &units[k]) ? units[k].window_at : edges, 0);
        m->params_length = edges + (size_t)m->zero3_places * largest;
    }
    free(units);
}

// ----------------------------------------------------------------------------
// the state: the units, the shard they reduce into and gather from, the places in flight

typedef struct {
    int stage;               // 1: nothing here; 2; 3
    GPT* model;
    ShardRegion* shard;      // the dense region's (the only one: experts are refused)
    ZeroUnit* units;         // [num_units], flat order
    int num_units;
    int* unit_of_layer;      // [num_local_layers]: the unit of local layer i
    size_t edges, largest;   // the windows' layout (zero_window_layout)
    // ZeRO-3's places: which local layer each holds (-1: none), each gather's mark, the last needed
    int places, *held, last_place, last_layer, direction;
    StreamEvent* gathered;
    StreamEvent written, freed;   // compute -> communication: gradients written; a place's readers queued
    int pending;             // ZeRO-2: the local layer whose reduce is in flight (-1: none)
    StreamEvent reduced;     // ... marked on the communication stream after its reduces
} ZeroState;
static ZeroState zero;   // one per process, as the grid

// [lo, hi): unit u's part in the group's rank q's shard; 0 when empty
static int unit_part(const ZeroUnit* u, const ShardRegion* r, int q, size_t* lo, size_t* hi) {
    intersect_ranges(u->start, u->end, r->start + q * r->shard_size, r->start + (q + 1) * r->shard_size, lo, hi);
    return *lo < *hi;
}

// ----------------------------------------------------------------------------
// ZeRO-2: the gradients reduced layer by layer into the shard's accumulator

// Unit u's gradients, at window place `at`, summed over the group: each rank's part onto that rank
// (in place in the window), queued on the communication stream after the kernels that wrote them
static void reduce_unit_launch(const ZeroUnit* u, size_t at) {
    ShardRegion* r = zero.shard;
    float* window = zero.model->grads + at;
    comm_waits_for_compute(&zero.written);
    for (int q = 0; q < r->group->size; q++) {
        size_t lo, hi;
        if (unit_part(u, r, q, &lo, &hi)) reduce_to(r->group, window + (lo - u->start), window + (lo - u->start), hi - lo, q);
    }
}

// ... once the reduces have run (the compute stream waited for them): this rank's part added into its
// accumulator, and the place zeroed for the next unit written there
static void reduce_unit_finish(const ZeroUnit* u, size_t at) {
    ShardRegion* r = zero.shard;
    float* window = zero.model->grads + at;
    size_t lo, hi;
    if (unit_part(u, r, r->group->rank, &lo, &hi)) floats_add(r->grad + (lo - r->shard_start), window + (lo - u->start), hi - lo);
    dev_zero(window, (u->end - u->start) * sizeof(float));
}

// where local layer i's gradients are: place i mod 2 of the gradient window
static size_t grad_place_of(int i) { return zero.edges + (size_t)(i % 2) * zero.largest; }

// the layer whose reduce is in flight finished (its place written again next): wait, add, zero
static void finish_pending_reduce(void) {
    if (zero.pending < 0) return;
    compute_waits_for_mark(&zero.reduced);
    reduce_unit_finish(&zero.units[zero.unit_of_layer[zero.pending]], grad_place_of(zero.pending));
    zero.pending = -1;
}

// the backward has finished global `layer` of a micro-batch (the model's hook): the layer before's
// reduce finished, this one's (its sequence-parallel sums first) launched, to run beside the next
// layer's backward. The head's (num_layers) wait in the window for the step's end.
static void zero2_layer_gradients_final(int layer) {
    GPT* m = zero.model;
    int i = local_layer_index(m, layer);
    if (i < 0) return;
    finish_pending_reduce();
    sequence_parallel_grads_all_reduce(m, layer, layer);
    reduce_unit_launch(&zero.units[zero.unit_of_layer[i]], grad_place_of(i));
    comm_mark(&zero.reduced);
    zero.pending = i;
}

// the model is about to read `layer`'s parameters (the hook; ZeRO-3's calls it too): before a layer
// writes the place whose reduce is in flight, that reduce is finished (a backward's next layer has
// the other place: it runs beside the reduce)
static void zero2_parameters_needed(int layer) {
    int i = local_layer_index(zero.model, layer);
    if (i >= 0 && zero.pending >= 0 && i % 2 == zero.pending % 2) finish_pending_reduce();
}

// the step's end, after the tied embedding's all-reduce: the last layer's reduce finished, the edges'
// gradients (the embedding's, the head's), their sequence-parallel sums first, reduced into the shards
static void zero_reduce_edges(void) {
    GPT* m = zero.model;
    finish_pending_reduce();
    sequence_parallel_grads_all_reduce(m, -1, -1);
    sequence_parallel_grads_all_reduce(m, m->cfg.num_layers, m->cfg.num_layers);
    for (int k = 0; k < zero.num_units; k++)
        if (is_edge_unit(m, &zero.units[k])) {
            reduce_unit_launch(&zero.units[k], zero.units[k].window_at);
            compute_waits_for_comm(&zero.written);
            reduce_unit_finish(&zero.units[k], zero.units[k].window_at);
        }
}

// ----------------------------------------------------------------------------
// ZeRO-3: the parameters gathered layer by layer, the next one ahead

// unit u's parameters gathered into the window at `at` on the communication stream: each rank's part
// from its shard (copied into the window first, on the compute stream), broadcast from it
static void gather_unit(const ZeroUnit* u, size_t at) {
    ShardRegion* r = zero.shard;
    floatX* window = zero.model->params + at;
    size_t lo, hi;
    if (unit_part(u, r, r->group->rank, &lo, &hi))
        dev_copy(window + (lo - u->start), r->params + (lo - r->shard_start), (hi - lo) * sizeof(floatX));
    comm_waits_for_compute(&zero.freed);   // the copy, and every reader of the place before it
    for (int q = 0; q < r->group->size; q++)
        if (unit_part(u, r, q, &lo, &hi)) broadcast_from(r->group, window + (lo - u->start), hi - lo, q);
}

// local layer i into place p (its tensors mapped there), the gather marked on p's event
static void gather_layer_into(int i, int p) {
    const ZeroUnit* u = &zero.units[zero.unit_of_layer[i]];
    size_t at = zero.edges + (size_t)p * zero.largest;
    compute_waits_for_mark(&zero.gathered[p]);   // a gather still landing in p (a prefetch not taken)
    zero.held[p] = i;
    map_unit(zero.model, u, at, 0);
    gather_unit(u, at);
    comm_mark(&zero.gathered[p]);
}

// the place of local layer i, gathering it there if no place holds it: its own place without
// resharding, else the place not used last
static int place_of(int i, int avoid) {
    for (int p = 0; p < zero.places; p++)
        if (zero.held[p] == i) return p;
    int p = zero.places == zero.model->num_local_layers ? i : (avoid == 0 ? 1 % zero.places : 0);
    gather_layer_into(i, p);
    return p;
}

// the model is about to read global `layer`'s parameters (the hook; -1 and num_layers: the edges,
// always here): wait for its gather, and queue the next one's, up in a forward, down in a backward
// (the direction: the layers needed lately, going up or down; a wrong guess costs a gather, never a
// wrong value). The forward of layer i also reads layer i + 1's first norm (fused), so asks for it.
static void zero3_parameters_needed(int layer) {
    GPT* m = zero.model;
    zero2_parameters_needed(layer);
    if (layer != zero.last_layer) zero.direction = layer > zero.last_layer ? 1 : -1;
    zero.last_layer = layer;
    int i = local_layer_index(m, layer), p = zero.last_place;
    if (i >= 0) {
        p = place_of(i, zero.last_place);
        compute_waits_for_mark(&zero.gathered[p]);
        map_unit(m, &zero.units[zero.unit_of_layer[i]], zero.edges + (size_t)p * zero.largest, 0);
        zero.last_place = p;
    } else i = layer < 0 ? -1 : m->num_local_layers;   // (an edge: before the first local layer, or after the last)
    int next = i + zero.direction;
    if (next >= 0 && next < m->num_local_layers) place_of(next, p);
}

// after AdamW wrote the shards: no layer held any more (the next forward gathers them), the edges
// gathered again now
static void zero3_after_update(void) {
    if (zero.stage < 3) return;
    for (int p = 0; p < zero.places; p++) {
        compute_waits_for_mark(&zero.gathered[p]);
        zero.held[p] = -1;
    }
    zero.last_layer = INT_MIN;   // (the next need is a forward's)
    zero.direction = 1;
    for (int k = 0; k < zero.num_units; k++)
        if (is_edge_unit(zero.model, &zero.units[k])) gather_unit(&zero.units[k], zero.units[k].window_at);
    compute_waits_for_comm(&zero.written);
}

// a whole tensor's values (init, a checkpoint's load: the model's on_tensor_values): the shard's part
// into the shard, an edge's whole tensor into the window too
static void zero3_tensor_values(GPT* m, int id, const float* host) {
    const TensorDesc* t = &m->tensors[id];
    const ShardRegion* r = zero.shard;
    size_t lo, hi;
    intersect_ranges(t->offset, t->offset + t->numel, r->shard_start, r->shard_start + r->shard_size, &lo, &hi);
    if (lo < hi) floats_to_dev_floatX(r->params + (lo - r->shard_start), host + (lo - t->offset), hi - lo);
    if (t->layer < 0 || t->layer >= m->cfg.num_layers) floats_to_dev_floatX(m->params + t->param_at, host, t->numel);
}

// ----------------------------------------------------------------------------
// set up, each step, free

// after adamw_init_stage on the planned windows: the hooks set, and with ZeRO-3 the parameters
// initialized into the shards (and the master weights copied from them)
static void zero_init(GPT* m, AdamWState* opt) {
    memset(&zero, 0, sizeof(zero));
    zero.stage = opt->zero_stage;
    if (zero.stage < 2) return;
    zero.model = m;
    zero.shard = &opt->regions[0];
    zero.units = (ZeroUnit*)mallocCheck((m->num_local_layers + 2) * sizeof(ZeroUnit));
    zero.num_units = zero_units(m, zero.units);
    zero.edges = zero_window_layout(m, zero.units, zero.num_units, &zero.largest);
    zero.unit_of_layer = (int*)mallocCheck((m->num_local_layers + 1) * sizeof(int));
    for (int k = 0; k < zero.num_units; k++) {
        int i = local_layer_index(m, zero.units[k].layer);
        if (!is_edge_unit(m, &zero.units[k]) && i >= 0) zero.unit_of_layer[i] = k;
    }
    stream_event_create(&zero.written);
    stream_event_create(&zero.freed);
    stream_event_create(&zero.reduced);
    zero.pending = -1;
    m->on_gradients_final = zero2_layer_gradients_final;
    m->on_parameters_needed = zero2_parameters_needed;
    if (zero.stage < 3) return;
    zero.places = m->zero3_places;
    zero.held = (int*)mallocCheck((zero.places + 1) * sizeof(int));
    zero.gathered = (StreamEvent*)mallocCheck((zero.places + 1) * sizeof(StreamEvent));
    for (int p = 0; p < zero.places; p++) {
        zero.held[p] = -1;
        stream_event_create(&zero.gathered[p]);
    }
    zero.last_layer = INT_MIN;
    zero.direction = 1;
    m->on_parameters_needed = zero3_parameters_needed;
    m->on_tensor_values = zero3_tensor_values;
    gpt_init_params(m);
    shard_master_from_params(zero.shard);
}

// the step's start: the gradient window and the shard's accumulator zeroed (ZeRO-1: the whole buffer)
static void zero_step_begin(GPT* m, AdamWState* opt) {
    dev_zero(m->grads, m->grads_length * sizeof(float));
    if (opt->zero_stage >= 2)
        for (int i = 0; i < opt->num_regions; i++) dev_zero(opt->regions[i].grad, opt->regions[i].shard_size * sizeof(float));
}

static void zero_free(void) {
    if (zero.stage < 2) return;
    dev_synchronize();
    for (int p = 0; p < zero.places; p++) stream_event_destroy(&zero.gathered[p]);
    stream_event_destroy(&zero.written);
    stream_event_destroy(&zero.freed);
    stream_event_destroy(&zero.reduced);
    free(zero.units);
    free(zero.unit_of_layer);
    free(zero.held);
    free(zero.gathered);
    memset(&zero, 0, sizeof(zero));
}
