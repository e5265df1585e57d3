/*
data_parallel.h — data parallelism with ZeRO-1: every DP rank runs the same model on its own
micro-batches; the ranks meet only over the gradients and the updated parameters, and each
keeps the optimizer's state for its 1/DP shard of the flat buffers alone.

  - the gradient reduction over DP, overlapped with the last backward (--overlap-grad-reduce):
    the flat gradient buffer cut into buckets of whole tensors, each reduced onto the ranks
    whose shards hold it as soon as the backward has finished its layers; in the same turn,
    sequence parallelism's sums over TP of the replicated tensors' gradients;
  - ZeRO-1's parameter all-gather beside the next forward (--overlap-param-gather), bucket by
    bucket, each layer's forward waiting for its own;
  - ZeRO-1's sharded AdamW state (Rajbhandari et al. 2020, stage 1): the fp32 master weights
    and moments of the shard, the shard's part of each tensor (shard_ranges), which
    tensors count in the norm, what it allocates (for the planner), and the loss scaler the
    state carries (Megatron's dynamic scaler for fp16).

What a reader learns here: how ZeRO-1 cuts the flat buffer into shards; how the step's
reduce-scatter becomes per-bucket reduces beside the backward and its all-gather per-bucket
broadcasts beside the forward, the bytes sent unchanged; and which stream waits for which.
ZeRO-2 and ZeRO-3 (the gradients, then the parameters, sharded too) are zero.h's, on the same
shards: here only the shard's gradient accumulator and parameters they give a buffer of its own.

Interface (what pipeline.h, step.h, train.c, checkpoint.h, plan.h and the tests use):
grad_reducer_init / _free, grad_reducer (a backward arms it), grad_reducer_finish,
param_gatherer_init / _free, param_gather_launch, param_gather_finish,
sequence_parallel_grads_all_reduce, AdamWConfig, LossScaler, loss_scaler_update, AdamWState,
adamw_init / adamw_init_stage / adamw_free, shard_master_from_params, ShardRegion, zero_shard_sizes, planned_regions, adamw_state_bytes,
adamw_workspace_bytes. The model
calls back into the overlapped reduction and gather through the two hooks these inits set in
the GPT (on_gradients_final, on_parameters_needed); gpt.h knows nothing of this file.

It sits above gpt.h and parallel.h in the one include line (train.c includes them in order),
below pipeline.h and step.h, and does its communication through parallel.h's wrappers only.
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
// root r, in place: into rank r's own shard of its gradient buffer), so each rank ends with
// what the reduce-scatter gave it, bytes sent included. The embedding's bucket goes last, after
// the tied embedding's all-reduce. Nothing else changes: the buckets are a plan over the
// buffer, no memory of their own.

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
            all_reduce(&grid.tp, grad_of(m, i), t->numel, AS_FLOAT, REDUCE_SUM);
    }
}

// [lo, hi) = [a, b) ∩ [c, d) (empty when lo >= hi)
static void intersect_ranges(size_t a, size_t b, size_t c, size_t d, size_t* lo, size_t* hi) {
    *lo = a > c ? a : c;
    *hi = b < d ? b : d;
}

// ZeRO-1 shards each region of the flat buffers (gpt.h: the dense parameters, then the experts')
// over the group that sums its gradients: DP x CP, or for the experts their expert-data-parallel
// group (the ranks holding the same experts; DP x CP / EP of them)
typedef struct {
    Group* group;
    size_t start, length;             // [start, start + length) of the flat buffers, a multiple of the group's size
    size_t shard_start, shard_size;   // this rank's shard (flat indices)
    float* master;       // fp32 master weights of the shard (on the CPU build: the params themselves)
    floatX* params;      // the shard's parameters, which AdamW writes: model->params + shard_start, or with
                         // ZeRO-3 a buffer of its own (the model's params are then a window: zero.h)
    float* grad;         // summed gradient of the shard: the gradient buffer's shard, reduced in place (ZeRO-1),
                         // or with ZeRO-2/3 an accumulator of its own, each micro-batch's sums added in (zero.h)
    float* m;            // first moment, fp32, shard (NULL with 8-bit states)
    float* v;            // second moment, fp32, shard (NULL with 8-bit states)
    Moments8bit moments8;   // with --use-bnb-optimizer: m and v in 8 bits, block-wise (kernels/quantize.cuh)
    ShardRange* ranges;  // device table: the shard's part of each tensor, in order (shard_ranges), cut
    int num_ranges;      // into the pieces the kernels walk (kernels/optimizer.cuh's shard_pieces)
} ShardRegion;

// Each shard a multiple of this many elements (gpt_plan_model pads each region to whole shards
// of it): with 8-bit Adam states (--use-bnb-optimizer) a quantization block, so that every shard
// starts on a block of the region's own grid, [k QUANT_BLOCK, (k + 1) QUANT_BLOCK) from the
// region's start, and the values that share a scale are the same under every DP x CP. (Blocks
// counted from each shard's own start moved with DP: at DP 2 every block of rank 1 held other
// values than one process's, and the emulated GPU build's loss at step 7 came out 1.5% above DP
// 1's, where 32-bit Adam's was bit-equal; aligned, DP 2 follows DP 1 to 1e-6.)
static int zero_shard_multiple(int states_8bit) { return states_8bit ? QUANT_BLOCK : 1; }

// the model's regions (1 without experts) and their groups, shards not yet placed
static int zero_regions(const GPT* m, ShardRegion* out) {
    memset(out, 0, 2 * sizeof(ShardRegion));
    out[0].group = &grid.dp_cp;
    out[0].length = m->expert_params_start;
    if (m->num_params_padded == m->expert_params_start) return 1;
    out[1].group = grid.ep_size > 1 ? &grid.expert_dp : &grid.dp_cp;
    out[1].start = m->expert_params_start;
    out[1].length = m->num_params_padded - m->expert_params_start;
    return 2;
}

// the regions as a plan of dp_cp ranks sees them (the planner's: no grid, no group), each
// shard as the ranks' of its group
static void planned_regions(const GPT* m, int dp_cp, ShardRegion* out) {
    memset(out, 0, 2 * sizeof(ShardRegion));
    out[0].length = m->expert_params_start;
    out[0].shard_size = out[0].length / dp_cp;
    out[1].start = m->expert_params_start;
    out[1].length = m->num_params_padded - m->expert_params_start;
    out[1].shard_size = out[1].length / m->ep.data_parallel;
}

typedef struct {
    size_t start, end;   // [start, end) of the flat gradient buffer, inside one region
    int lowest_layer;    // final once the backward has finished this layer (-1: the embedding's bucket)
    const ShardRegion* region;
} GradBucket;

// [lo, hi): the part of bucket b inside its group's rank q's shard; 0 when empty
static int bucket_part(const GradBucket* b, int q, size_t* lo, size_t* hi) {
    const ShardRegion* r = b->region;
    intersect_ranges(b->start, b->end, r->start + q * r->shard_size, r->start + (q + 1) * r->shard_size, lo, hi);
    return *lo < *hi;
}

// buckets by their lowest layer, highest first (stable: a region's keep their order)
static void sort_buckets_down(GradBucket* b, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && b[j - 1].lowest_layer < b[j].lowest_layer; j--) {
            GradBucket swap = b[j];
            b[j] = b[j - 1];
            b[j - 1] = swap;
        }
}

// Cut each region into buckets: from its top, whole tensors until a bucket holds at least
// `bucket_size` elements; the embedding's tensors (layer -1, at the start) in a bucket of their
// own; a region's padding with its top bucket. Then ordered by their lowest layer, highest first
// (the order the backward finishes them in: the experts' region, after the head in the flat
// buffers, holds every layer's experts). `out` has room for one per tensor; returns how many.
static int grad_buckets(const GPT* m, const ShardRegion* regions, size_t bucket_size, GradBucket* out) {
    int count = 0, region = m->num_params_padded > m->expert_params_start;
    size_t end = m->num_params_padded;
    for (int i = m->num_tensors - 1; i >= 0; i--) {
        const TensorDesc* t = &m->tensors[i];
        int region_starts = i == 0 || t->offset == regions[region].start;
        int last_of_bucket = region_starts || (t->layer >= 0 && m->tensors[i - 1].layer < 0) ||
                             (t->layer >= 0 && end - t->offset >= bucket_size);
        if (!last_of_bucket) continue;
        GradBucket b = {region_starts ? regions[region].start : t->offset, end, t->layer, &regions[region]};
        out[count++] = b;
        end = b.start;
        if (region_starts && region > 0) region--;
    }
    sort_buckets_down(out, count);
    return count;
}

typedef struct {
    int enabled;             // --overlap-grad-reduce with DP > 1
    const GPT* model;
    GradBucket* buckets;     // in the order they are launched
    int num_buckets, launched;
    int armed;               // the last micro-batch's backward is running
    float* grads;            // the whole flat buffer, each rank's shard of it reduced in place
    StreamEvent grads_written, reduced;
} GradReducer;
static GradReducer grad_reducer;   // one per process, as the grid

// queue bucket b's reduces on the communication stream, after the kernels that wrote it
static void reduce_bucket(GradReducer* r, const GradBucket* b) {
    comm_waits_for_compute(&r->grads_written);
    for (int q = 0; q < b->region->group->size; q++) {   // the part of b in each rank's shard, onto that rank
        size_t lo, hi;
        if (bucket_part(b, q, &lo, &hi)) reduce_to(b->region->group, r->grads + lo, r->grads + lo, hi - lo, q);
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

static void grad_reducer_init(GPT* m, const ShardRegion* regions, int overlap, size_t bucket_size) {
    GradReducer* r = &grad_reducer;
    memset(r, 0, sizeof(*r));
    r->enabled = overlap && grid.dp_cp.size > 1;
    if (!r->enabled) return;
    r->buckets = (GradBucket*)mallocCheck((m->num_tensors + 2) * sizeof(GradBucket));
    r->num_buckets = grad_buckets(m, regions, bucket_size, r->buckets);
    r->model = m;
    r->grads = m->grads;
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
    floatX* params;          // the whole flat buffer, of which this rank updated its shards
    StreamEvent updated;     // compute -> communication: AdamW has written the shards
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

static void param_gatherer_init(GPT* m, const ShardRegion* regions, int overlap, size_t bucket_size) {
    ParamGatherer* g = &param_gatherer;
    memset(g, 0, sizeof(*g));
    g->enabled = overlap && grid.dp_cp.size > 1;
    if (!g->enabled) return;
    GradBucket* from_end = (GradBucket*)mallocCheck((m->num_tensors + 2) * sizeof(GradBucket));
    g->num_buckets = grad_buckets(m, regions, bucket_size, from_end);
    g->buckets = (GradBucket*)mallocCheck(g->num_buckets * sizeof(GradBucket));
    g->gathered = (StreamEvent*)mallocCheck(g->num_buckets * sizeof(StreamEvent));
    for (int k = 0; k < g->num_buckets; k++) {
        g->buckets[k] = from_end[g->num_buckets - 1 - k];
        stream_event_create(&g->gathered[k]);
    }
    free(from_end);
    g->waited = g->num_buckets;   // nothing in flight
    g->params = m->params;
    stream_event_create(&g->updated);
    m->on_parameters_needed = parameters_needed;   // the forward's hook
}

// after AdamW: every bucket's broadcasts queued on the communication stream, in order
static void param_gather_launch(void) {
    ParamGatherer* g = &param_gatherer;
    comm_waits_for_compute(&g->updated);
    for (int k = 0; k < g->num_buckets; k++) {
        const GradBucket* b = &g->buckets[k];
        for (int q = 0; q < b->region->group->size; q++) {   // the part of b in each rank's shard, from that rank
            size_t lo, hi;
            if (bucket_part(b, q, &lo, &hi)) broadcast_from(b->region->group, g->params + lo, hi - lo, q);
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
// optimizer: ZeRO-1 AdamW (Rajbhandari et al. 2020, stage 1)
// Every rank keeps the whole model of its (tp, pp) slot in floatX and its fp32 gradients,
// but the fp32 master weights and the Adam moments only for its 1/DP shard of the flat
// buffer (padded to a multiple of DP). A step: reduce-scatter the gradients in place (each
// rank gets the summed gradient of its shard in its own gradient buffer's shard, the rest of
// the buffer no longer read), the global norm over all shards, AdamW on the shard, all-gather
// the updated parameters (step.h's optimizer_step runs the step).
// Model state per parameter, as Megatron-LM's distributed optimizer keeps it (the table of
// bytes a parameter in its distributed-optimizer docs; theoretical_memory_usage.py's 6 + 12/DP):
// on the GPU build 2 (bf16 or fp16 parameters) + 4 (fp32 gradients) + 12/DP (fp32 master
// weights, m and v of the shard); on the CPU build, fp32 throughout, 4 + 4 + 8/DP (the master
// weights are the parameters themselves). No gradient shard of its own: the reduce-scatter's
// output is the gradient buffer's own shard, where Megatron-LM's grad buffer also holds the
// summed 1/DP of the main gradients between the reduce-scatter and the optimizer.

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
    ShardRegion regions[2];   // the dense parameters' shard, the experts' (zero_regions)
    int num_regions;
    int states_8bit;     // --use-bnb-optimizer: Adam's moments in 8 bits (each region's moments8)
    float* quant_maps;   // with them: the signed and the unsigned dynamic map (dynamic_quant_maps), device
    int step;            // updates applied so far
    int zero_stage;      // 1 (0 is the same step), 2: the gradients sharded too, 3: the parameters too (zero.h)
    LossScaler scaler;   // the gradients in model->grads are the loss's times scaler.scale
    double* norm_acc;    // device scalar for the gradient norm
} AdamWState;

// A parameter is counted once in the norm: a tensor replicated over tensor ranks only on
// tensor rank 0, and the tied embedding only on the first stage. (An expert is in one shard of
// its expert-data-parallel group, and the expert groups' other ranks hold other experts.)
static int counts_in_norm(const GPT* m, const TensorDesc* t) {
    if (t->split_axis < 0 && m->tp_rank != 0) return 0;
    return !t->tied_copy;
}

// The shard's part of each tensor, in the flat buffer's order, as ShardRanges into `table`
// (room for one per tensor); returns how many
static int shard_ranges(const ShardRegion* s, const GPT* model, ShardRange* table) {
    int count = 0;
    for (int i = 0; i < model->num_tensors; i++) {
        const TensorDesc* t = &model->tensors[i];
        size_t lo, hi;
        intersect_ranges(t->offset, t->offset + t->numel, s->shard_start, s->shard_start + s->shard_size, &lo, &hi);
        if (lo >= hi) continue;
        ShardRange r = {lo - s->shard_start, hi - s->shard_start, t->weight_decay, counts_in_norm(model, t)};
        if (count > 0 && r.start < table[count - 1].end) fail("the tensor table is not in the flat buffer's order");
        table[count++] = r;
    }
    return count;
}

// 8-bit moments of n elements, zero (every scale 0: every value 0, whatever the codes)
static Moments8bit moments8_alloc(size_t n, const float* maps) {
    Moments8bit q = {(uint8_t*)dev_malloc(n), (uint8_t*)dev_malloc(n), (float*)dev_malloc(quant_blocks(n) * sizeof(float)),
                     (float*)dev_malloc(quant_blocks(n) * sizeof(float)), maps};
    dev_zero(q.m_scale, quant_blocks(n) * sizeof(float));
    dev_zero(q.v_scale, quant_blocks(n) * sizeof(float));
    return q;
}

// the fp32 master weights of the shard from its floatX parameters (the GPU build; on the CPU build
// they are the same array), as Megatron: the fp32 main params start as copies of the bf16 params
static void shard_master_from_params(ShardRegion* s) {
    if (sizeof(floatX) == sizeof(float)) return;
    size_t bytes = s->shard_size * sizeof(float);
    float* host = (float*)mallocCheck(bytes);
    dev_floatX_to_floats(host, s->params, s->shard_size);
    host_to_dev(s->master, host, bytes);
    free(host);
}

// one region's shard: its place, its state, its ranges; zero_stage 2 gives its gradient, 3 also its
// parameters a buffer of its own (ZeRO-3's parameters are set by zero.h, the master copied after)
static void shard_region_init(ShardRegion* s, const GPT* model, const float* quant_maps, int zero_stage) {
    s->shard_size = s->length / s->group->size;   // (DP x CP: Megatron-LM's distributed optimizer)
    s->shard_start = s->start + s->group->rank * s->shard_size;
    size_t bytes = s->shard_size * sizeof(float);
    if (quant_maps && s->shard_size % QUANT_BLOCK != 0)
        fail("8-bit Adam states: a ZeRO shard of %zu elements is no whole number of %d-blocks", s->shard_size, QUANT_BLOCK);
    if (quant_maps) {
        s->moments8 = moments8_alloc(s->shard_size, quant_maps);
    } else {
        s->m = (float*)dev_malloc(bytes);
        s->v = (float*)dev_malloc(bytes);
        dev_zero(s->m, bytes);
        dev_zero(s->v, bytes);
    }
    if (zero_stage >= 2) {
        s->grad = (float*)dev_malloc(bytes);
        dev_zero(s->grad, bytes);
    } else s->grad = model->grads + s->shard_start;   // the reduce-scatter sums into it in place
    if (zero_stage >= 3) {
        s->params = (floatX*)dev_malloc(s->shard_size * sizeof(floatX));
        dev_zero(s->params, s->shard_size * sizeof(floatX));
    } else s->params = model->params + s->shard_start;
    s->master = sizeof(floatX) == sizeof(float) ? (float*)s->params : (float*)dev_malloc(bytes);
    shard_master_from_params(s);
    ShardRange* table = (ShardRange*)mallocCheck(model->num_tensors * sizeof(ShardRange));
    size_t room = shard_pieces_max(model->build, model->num_tensors, s->shard_size);   // the same on every rank
    ShardRange* pieces = (ShardRange*)mallocCheck(room * sizeof(ShardRange));
    int parts = shard_ranges(s, model, table);
    s->num_ranges = shard_pieces(table, parts, shard_piece_size(model->build), pieces);
    s->ranges = (ShardRange*)dev_malloc(room * sizeof(ShardRange));   // as planned
    host_to_dev(s->ranges, pieces, s->num_ranges * sizeof(ShardRange));
    free(pieces);
    free(table);
}

// states_8bit: --use-bnb-optimizer's block-wise 8-bit moments, else fp32 ones; zero_stage 1 (or 0), 2 or 3
static void adamw_init_stage(AdamWState* s, const GPT* model, int states_8bit, int zero_stage) {
    memset(s, 0, sizeof(*s));
    s->zero_stage = zero_stage < 1 ? 1 : zero_stage;
    s->num_regions = zero_regions(model, s->regions);
    s->states_8bit = states_8bit;
    if (states_8bit) {
        float maps[2 * QUANT_MAP_SIZE];
        dynamic_quant_maps(maps);
        s->quant_maps = (float*)dev_malloc(sizeof(maps));
        host_to_dev(s->quant_maps, maps, sizeof(maps));
    }
    for (int i = 0; i < s->num_regions; i++) shard_region_init(&s->regions[i], model, s->quant_maps, s->zero_stage);
    s->norm_acc = (double*)dev_malloc(sizeof(double));
    s->scaler.scale = 1.0f;
}

static inline void adamw_init(AdamWState* s, const GPT* model, int states_8bit) { adamw_init_stage(s, model, states_8bit, 1); }

static void adamw_free(AdamWState* s) {
    for (int i = 0; i < s->num_regions; i++) {
        ShardRegion* r = &s->regions[i];
        if (s->states_8bit) {
            dev_free(r->moments8.m);
            dev_free(r->moments8.v);
            dev_free(r->moments8.m_scale);
            dev_free(r->moments8.v_scale);
        } else {
            dev_free(r->m);
            dev_free(r->v);
        }
        if (sizeof(floatX) != sizeof(float)) dev_free(r->master);
        if (s->zero_stage >= 2) dev_free(r->grad);
        if (s->zero_stage >= 3) dev_free(r->params);
        dev_free(r->ranges);
    }
    dev_free(s->norm_acc);
    if (s->states_8bit) dev_free(s->quant_maps);
}

// The moment `which` (0: m, 1: v) of region r, fp32, into host[shard_size]: what a checkpoint
// holds whatever the states (checkpoint.h). 8-bit states are dequantized on the host, with the
// reference (the same codes and scales on both builds).
static void adamw_moment_to_host(const AdamWState* s, const ShardRegion* r, int which, float* host) {
    size_t n = r->shard_size, blocks = quant_blocks(n);
    if (!s->states_8bit) {
        dev_to_host(host, which ? r->v : r->m, n * sizeof(float));
        return;
    }
    uint8_t* codes = (uint8_t*)mallocCheck(n + 1);
    float* scales = (float*)mallocCheck((blocks + 1) * sizeof(float));
    float maps[2 * QUANT_MAP_SIZE];
    dynamic_quant_maps(maps);
    dev_to_host(codes, which ? r->moments8.v : r->moments8.m, n);
    dev_to_host(scales, which ? r->moments8.v_scale : r->moments8.m_scale, blocks * sizeof(float));
    dequantize_blocks_cpu(codes, scales, n, maps + which * QUANT_MAP_SIZE, host);
    free(codes);
    free(scales);
}

// the reverse: host[shard_size] into the moment `which` of region r (8-bit states: quantized
// on the host, each block to its nearest codes; a dequantized block comes back bit for bit)
static void adamw_moment_from_host(const AdamWState* s, const ShardRegion* r, int which, const float* host) {
    size_t n = r->shard_size, blocks = quant_blocks(n);
    if (!s->states_8bit) {
        host_to_dev(which ? r->v : r->m, host, n * sizeof(float));
        return;
    }
    uint8_t* codes = (uint8_t*)mallocCheck(n + 1);
    float* scales = (float*)mallocCheck((blocks + 1) * sizeof(float));
    float maps[2 * QUANT_MAP_SIZE];
    dynamic_quant_maps(maps);
    quantize_blocks_cpu(host, n, maps + which * QUANT_MAP_SIZE, codes, scales);
    host_to_dev(which ? r->moments8.v : r->moments8.m, codes, n);
    host_to_dev(which ? r->moments8.v_scale : r->moments8.m_scale, scales, blocks * sizeof(float));
    free(codes);
    free(scales);
}

// the shard's elements of each region of a model whose dense parameters are sharded over dp_cp
// ranks and its experts over expert_dp (the planner's: no grid)
static void zero_shard_sizes(const GPT* m, int dp_cp, int expert_dp, size_t shard[2]) {
    shard[0] = m->expert_params_start / dp_cp;
    shard[1] = (m->num_params_padded - m->expert_params_start) / expert_dp;
}

// the bytes adamw_init allocates as state for shards of shard[2] elements (zero_shard_sizes):
// each shard's two moments and its fp32 master where it is a copy (`master_copy`: floatX is not
// float, the GPU build): 12/DP or 8/DP bytes a parameter. With 8-bit states (states_8bit) the
// moments take a byte each and a 4-byte scale each a block of 2,048 (quant_blocks): 6/DP or
// 2/DP bytes a parameter, and 8 bytes a block. No gradient shard: the gradient buffer's own
// serves. The norm's scalar and the maps are workspaces: adamw_workspace_bytes.
static size_t adamw_state_bytes(const size_t shard[2], int master_copy, int states_8bit) {
    size_t master = master_copy ? sizeof(float) : 0, bytes = 0;
    for (int i = 0; i < 2; i++)
        bytes += states_8bit ? shard[i] * (master + 2) + 2 * quant_blocks(shard[i]) * sizeof(float)
                             : shard[i] * (master + 2 * sizeof(float));
    return bytes;
}

// the rest of what adamw_init allocates on build b: norm_acc, the gradient norm's device scalar,
// each shard's range table, room for the pieces of one range per tensor (the same size on
// every rank; an empty experts' region has none), and with 8-bit states the two maps
static size_t adamw_workspace_bytes(BuildTarget b, int num_tensors, const size_t shard[2], int states_8bit) {
    size_t bytes = sizeof(double) + (states_8bit ? 2 * QUANT_MAP_SIZE * sizeof(float) : 0);
    for (int i = 0; i < 2; i++)
        if (i == 0 || shard[i] > 0) bytes += shard_pieces_max(b, num_tensors, shard[i]) * sizeof(ShardRange);
    return bytes;
}
