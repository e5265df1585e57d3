/*
step.h — one training step above the model, where the dimensions meet: the step's loss and
the optimizer step that ends it.

A step is pipeline.h's schedule (schedule_for, run_schedule: every micro-batch's forward and
backward over the stages), then step_loss, then optimizer_step; train.c runs them in that order.

  - step_loss: the mean loss of the step, known on every rank (the last stage's, summed over
    the pipeline and averaged over DP);
  - the global gradient norm (each parameter once, over every rank) and clipping;
  - optimizer_step, what follows the last backward: the tied embedding's all-reduce over the
    embedding group, the gradient reduction over DP (data_parallel.h's buckets, or one
    reduce-scatter; with ZeRO-2/3 zero.h's, the layers' reduced in the backward), the norm of
    the unscaled gradients, the loss scaler's update (a step whose norm is not finite is
    skipped), clipping, AdamW on the shard, the parameters' all-gather.

What a reader learns here: the order of everything after the last backward, and over which
group each part talks (embedding, TP, DP, world). The loss scaler's state and rule live with
the optimizer's state that carries them, in data_parallel.h.

Interface (what train.c, loader.h and the tests use): step_loss, optimizer_step.

It sits on data_parallel.h (the shard, the reducer and gatherer, the loss scaler), zero.h
(ZeRO-2/3's edges and gathers) and pipeline.h (Schedule) in the one include line.
*/
#pragma once

// ----------------------------------------------------------------------------
// the step's loss

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
    all_reduce_host(&grid.dp_cp, &loss, 1, REDUCE_SUM);   // (each context-parallel rank: its chunks' mean)
    return (float)(loss / grid.dp_cp.size);
}

// The step's tokens routed to each expert of every MoE layer: tokens[l x E + e] for the model's
// layer l (0 in a dense one), summed over the DP x CP ranks and gathered from every stage (the
// rows the experts ran: past a capacity, the choices kept)
static void step_expert_tokens(GPT* m, double* tokens) {
    size_t E = m->cfg.num_experts, n = (size_t)m->num_local_layers * E;
    memset(tokens, 0, (size_t)m->cfg.num_layers * E * sizeof(double));
    for (int i = 0; i < m->num_local_layers; i++)
        for (size_t e = 0; e < E; e++) tokens[(size_t)global_layer(m, i) * E + e] = (double)m->moe_tokens[i * E + e];
    memset(m->moe_tokens, 0, n * sizeof(long long));
    all_reduce_host(&grid.dp_cp, tokens, m->cfg.num_layers * (int)E, REDUCE_SUM);   // (every layer's in one)
    all_reduce_host(&grid.pp, tokens, m->cfg.num_layers * (int)E, REDUCE_SUM);      // (each stage its own layers)
}

// The experts' load imbalance: the most tokens any expert of a MoE layer got over the mean of that
// layer's experts, the worst layer's (1: balanced; the first thing a MoE user watches)
static double expert_imbalance(const GPTConfig* c, const double* tokens) {
    double worst = 0.0;
    for (int l = 0; l < c->num_layers; l++) {
        const double* layer = tokens + (size_t)l * c->num_experts;
        double most = 0.0, total = 0.0;
        for (int e = 0; e < c->num_experts; e++) most = fmax(most, layer[e]), total += layer[e];
        if (is_moe_layer(c, l) && total > 0) worst = fmax(worst, most / (total / c->num_experts));
    }
    return worst;
}

// The choices the step dropped over the experts' capacity (--moe-expert-capacity-factor): every MoE
// layer's, every micro-batch's, summed over the stages and the data-parallel ranks (the
// experts' layers run at TP 1 and CP 1, so no rank counts another's)
static double step_moe_dropped(GPT* m) {
    double dropped = (double)m->moe_dropped;
    m->moe_dropped = 0;
    all_reduce_host(&grid.dp_cp, &dropped, 1, REDUCE_SUM);
    all_reduce_host(&grid.pp, &dropped, 1, REDUCE_SUM);
    return dropped;
}

// The step's MoE losses (moe.h: Switch Transformer's load balance, 1 when balanced, and the router's
// z-loss), each the mean over the model's MoE layers, the micro-batches and the DP ranks (their
// coefficients apart; a context-parallel rank's is its part of its sequences'): out[0], out[1].
// Every stage adds its own layers' sums.
static void step_moe_losses(const GPT* m, int M, double out[2]) {
    out[0] = out[1] = 0.0;
    if (m->cfg.num_experts == 0) return;
    if (m->moe_loss_sums) {
        dev_to_host(out, m->moe_loss_sums, 2 * sizeof(double));
        dev_zero(m->moe_loss_sums, 2 * sizeof(double));
    }
    all_reduce_host(&grid.pp, out, 2, REDUCE_SUM);
    all_reduce_host(&grid.dp_cp, out, 2, REDUCE_SUM);
    int layers = 0;
    for (int l = 0; l < m->cfg.num_layers; l++) layers += is_moe_layer(&m->cfg, l);
    for (int i = 0; i < 2; i++) out[i] /= (double)M * grid.dp_size * layers;
}

// ----------------------------------------------------------------------------
// after the last backward: the gradient norm, clipping and the optimizer step

static float global_grad_norm(AdamWState* s) {
    dev_zero(s->norm_acc, sizeof(double));
    for (int i = 0; i < s->num_regions; i++) {
        const ShardRegion* r = &s->regions[i];
        sum_squares_ranges(s->norm_acc, r->grad, r->shard_size, r->ranges, r->num_ranges);
    }
    double sq = 0.0;
    dev_to_host(&sq, s->norm_acc, sizeof(double));
    all_reduce_host(&grid.world, &sq, 1, REDUCE_SUM);
    return (float)sqrt(sq);
}

// Each shard's gradient summed over its group: ZeRO-1's reduce-scatter (or its buckets, reduced while
// the backward ran); with ZeRO-2/3 the layers' were reduced in the backward, the edges' are now (zero.h)
static void reduce_gradients_into_shards(GPT* model, AdamWState* s) {
    if (s->zero_stage >= 2) {
        zero_reduce_edges();
        return;
    }
    if (!grad_reducer.enabled) sequence_parallel_grads_all_reduce(model, -1, INT_MAX);   // (else in the buckets' turn)
    if (grad_reducer.enabled) grad_reducer_finish();
    else for (int i = 0; i < s->num_regions; i++) {   // in place; each region over its own group
        ShardRegion* r = &s->regions[i];
        if (r->group->size > 1) reduce_scatter(r->group, model->grads + r->start, r->grad, r->shard_size, AS_FLOAT);
    }
}

// Gradients of the whole step, times the loss scale, are in model->grads (ZeRO-2/3: in the shards
// and the edges' window). Tied embedding, reduce-scatter, norm (of the unscaled gradients), the
// loss scaler's update, clipping (Megatron's clip_grad_norm: scale by clip / (norm + 1e-6) when
// below 1), AdamW on the shard with each tensor's decay, all-gather. A step whose gradient norm is not finite is
// skipped. Returns the norm before clipping. Unscaling is one more factor in the gradient
// multiplier AdamW applies anyway; for a power-of-two scale it changes no bit.
static float optimizer_step(GPT* model, AdamWState* s, const AdamWConfig* cfg, float lr, int* skipped) {
    if (grid.embedding.size > 1 && !model->cfg.untie_embeddings_and_output_weights) {   // the tied copies get the sum
        const TensorDesc* wte = &model->tensors[model->wte];
        all_reduce(&grid.embedding, grad_of(model, model->wte), wte->numel, AS_FLOAT, REDUCE_SUM);
    }
    param_gather_finish();   // (the forward waited for every bucket; a stage without layers did not)
    reduce_gradients_into_shards(model, s);
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
    for (int i = 0; i < s->num_regions; i++) {
        ShardRegion* r = &s->regions[i];
        if (s->states_8bit)   // --use-bnb-optimizer: the moments dequantized, updated, requantized block by block
            adamw8bit_update_ranges(r->master, r->params, r->grad, r->moments8, r->shard_size,
                                    r->ranges, r->num_ranges, lr, cfg->beta1, cfg->beta2, cfg->eps, cfg->weight_decay,
                                    scale, s->step);
        else
            adamw_update_ranges(r->master, r->params, r->grad, r->m, r->v, r->shard_size, r->ranges,
                                r->num_ranges, lr, cfg->beta1, cfg->beta2, cfg->eps, cfg->weight_decay, scale, s->step);
    }
    trace_end();
    if (s->zero_stage >= 3) zero3_after_update();   // (the layers: gathered as each is needed)
    else if (param_gatherer.enabled) param_gather_launch();   // waited for by the next forward
    else for (int i = 0; i < s->num_regions; i++) {
        ShardRegion* r = &s->regions[i];
        all_gather(r->group, model->params + r->shard_start, model->params + r->start, r->shard_size);
    }
    return norm;
}
