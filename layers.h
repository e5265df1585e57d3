/*
layers.h — the model's passes: the forward and the backward of one micro-batch through this
stage's layers (the embedding, each transformer block with its attention and its MLP or mixture
of experts, the head and its vocab-parallel cross-entropy), activation recomputation's re-run,
and decoding with a KV cache. gpt.h holds what the model is (its config, tensor table, init,
activation arena); this room, what it does with them. It calls the kernels by their common names,
the tensor-parallel operators of parallel.h, context_parallel.h's attention and moe.h's router
and dispatcher.
*/
#pragma once
// ----------------------------------------------------------------------------
// forward

// the input of local layer i: the previous layer's output, or the input of the slot's model chunk
static floatX* layer_input(const MicroBatchActivations* s, int i) {
    if (i > s->first) return s->layers[i - 1].res3;
    return s->embed_ln ? s->embed_ln : s->input;
}

// what the slot's model chunk sends on (its last layer's output)
static floatX* stage_output(const MicroBatchActivations* s) { return layer_input(s, s->end); }

// elements of this rank's rows of an [B*T, C] activation of the residual stream (and what goes
// between pipeline stages: 1/TP of the rows with sequence parallelism)
static size_t residual_elems(const GPT* m) { return (size_t)m->residual_rows * m->cfg.hidden_size; }

// The normalization, LayerNorm or RMSNorm (--normalization), of `rows` rows: the one place the
// model reads the choice. The residual form adds first (residual = a + b, out = norm(residual)):
// one pass on the GPU build for LayerNorm, two for RMSNorm. The backward adds into dinp.
static int uses_rmsnorm(const GPT* m) { return m->cfg.normalization == NORM_RMSNORM; }

static void norm_forward(GPT* m, floatX* out, float* mean, float* rstd, const floatX* inp, int w, int b, int rows) {
    int C = m->cfg.hidden_size;
    if (uses_rmsnorm(m)) rmsnorm_forward(out, rstd, inp, param_of(m, w), rows, C, m->cfg.norm_epsilon);
    else layernorm_forward(out, mean, rstd, inp, param_of(m, w), param_of(m, b), rows, C);
}

static void residual_norm_forward(GPT* m, floatX* residual, floatX* out, float* mean, float* rstd, const floatX* a,
                                  const floatX* b, int w, int bias) {
    int R = m->residual_rows, C = m->cfg.hidden_size;
    if (!uses_rmsnorm(m)) {
        residual_layernorm_forward(residual, out, mean, rstd, a, b, param_of(m, w), param_of(m, bias), R, C);
        return;
    }
    residual_forward(residual, a, b, (size_t)R * C);
    norm_forward(m, out, mean, rstd, residual, w, bias, R);
}

static void norm_backward(GPT* m, floatX* dinp, const floatX* dout, const floatX* inp, int w, int b, const float* mean,
                          const float* rstd) {
    int R = m->residual_rows, C = m->cfg.hidden_size;
    if (uses_rmsnorm(m)) rmsnorm_backward(dinp, grad_of(m, w), m->column_partials, dout, inp, param_of(m, w), rstd, R, C);
    else layernorm_backward(dinp, grad_of(m, w), grad_of(m, b), m->column_partials, dout, inp, param_of(m, w), mean, rstd,
                            R, C);
}

// the first position of the rows a forward runs: 0, or in generation where the cache ends
static int first_position(const GPT* m) { return m->kv_cache ? m->kv_cache->pos0 : 0; }

// Dropout at `site` of global layer `layer` (-1: the embedding) for the micro-batch in slot s:
// its mask keyed by the step, the micro-batch's first sample (s->holder is the micro-batch the
// schedule put there) and the rank's first global head; off outside training and in generation
static Dropout dropout_of(const GPT* m, const MicroBatchActivations* s, int layer, int site) {
    const DropoutStep* d = &m->dropout;
    if (!d->training || m->kv_cache) return NO_DROPOUT;
    float p = site == DROPOUT_ATTENTION_PROBS ? m->cfg.attention_dropout : m->cfg.hidden_dropout;
    long long first = micro_batch_first_sample(d->consumed_samples, s->holder < 0 ? 0 : s->holder, m->B, d->dp_rank,
                                               d->dp_size);
    return dropout_mask(p, (uint64_t)m->cfg.seed, d->iteration, layer, site, first, m->tp_rank * m->heads_local);
}

// Does this forward run a rank's chunks of its sequences (context parallelism in training or an
// evaluation)? Decoding runs whole sequences on every context-parallel rank (see gpt_decode_begin).
static int splits_sequence(const GPT* m) { return m->context.slice.size > 1 && !m->kv_cache; }

// The hidden dropout's mask on this rank's residual rows: out = in x the mask's factor (the
// forward on x in place, the backward on its gradient, the mask drawn again). A row's mask is
// keyed by its sample and its position: one call where the position is its place in a sequence
// of T; with context parallelism one a run of consecutive positions (context_parallel.h).
static void apply_hidden_dropout(GPT* m, floatX* out, const floatX* in, Dropout d) {
    int C = m->cfg.hidden_size, first = m->first_residual_row, end = first + m->residual_rows;
    if (!splits_sequence(m)) {
        dropout_forward(out, in, m->residual_rows, C, m->T, first, d);
        return;
    }
    for (int row = first; row < end && d.threshold;) {
        PositionRun r = position_run_at(&m->context.slice, row, end);
        Dropout of_run = d;
        of_run.sample0 += r.sequence;   // (rows of one sequence, at positions [position, position + count))
        size_t at = (size_t)(row - first) * C;
        dropout_forward(out + at, in + at, r.count, C, m->seq_length, r.position, of_run);
        row += r.count;
    }
    if (!d.threshold && out != in) dev_copy(out, in, residual_elems(m) * sizeof(floatX));
}

// the hidden dropout of this rank's residual rows x, in place (Megatron-LM's, before the residual add)
static void residual_dropout_forward(GPT* m, floatX* x, Dropout d) { apply_hidden_dropout(m, x, x, d); }

// The position embedding's rows added to rows [first, first + rows) of x, a row's position its
// place in its sequence (sequence parallelism: this rank's residual rows); with context
// parallelism a run of consecutive positions at a time. The backward adds each row into the
// table's gradient at its position.
static void position_rows_forward(GPT* m, floatX* x, int rows, int first) {
    int C = m->cfg.hidden_size;
    const floatX* wpe = param_of(m, m->wpe);
    if (!splits_sequence(m)) {
        rows_add_forward(x, wpe, rows, C, first, m->T);
        return;
    }
    for (int row = first; row < first + rows;) {
        PositionRun r = position_run_at(&m->context.slice, row, first + rows);
        rows_add_forward(x + (size_t)(row - first) * C, wpe + (size_t)r.position * C, r.count, C, 0, r.count);
        row += r.count;
    }
}

static void position_rows_backward(GPT* m, const floatX* d, int rows, int first) {
    int C = m->cfg.hidden_size;
    float* dwpe = grad_of(m, m->wpe);
    if (!splits_sequence(m)) {
        rows_add_backward(dwpe, m->column_partials, d, rows, C, first, m->T);
        return;
    }
    for (int row = first; row < first + rows;) {
        PositionRun r = position_run_at(&m->context.slice, row, first + rows);
        rows_add_backward(dwpe + (size_t)r.position * C, m->column_partials, d + (size_t)(row - first) * C, r.count, C, 0,
                          r.count);
        row += r.count;
    }
}

// word embedding (vocab-parallel, summed over tensor ranks) + position embedding. With sequence
// parallelism the sums go to the rows' owners (reduce-scatter, not all-reduce), and each rank
// adds its rows' positions.
static void embedding_forward(GPT* m, MicroBatchActivations* s) {
    int N = m->B * m->T, C = m->cfg.hidden_size;
    if (m->sequence_parallel) {
        encoder_forward(m->whole_rows, s->tokens, param_of(m, m->wte), NULL, N, m->T, C, m->vocab_start, m->vocab_local);
        reduce_scatter_to_sequence_parallel_region(s->input, m->whole_rows, residual_elems(m));
        if (m->wpe >= 0) position_rows_forward(m, s->input, m->residual_rows, m->first_residual_row);
    } else {
        const floatX* wpe = m->tp_rank == 0 ? param_of(m, m->wpe) : NULL;   // added once
        int pos0 = first_position(m);   // generation: the rows' positions start there
        int with_words = !pos0 && !splits_sequence(m);   // row t at position t: with the word, in one pass
        encoder_forward(s->input, s->tokens, param_of(m, m->wte), with_words ? wpe : NULL, N, m->T, C, m->vocab_start,
                        m->vocab_local);
        if (pos0 && wpe) rows_add_forward(s->input, wpe, N, C, pos0, m->cfg.max_position_embeddings);   // the same sums
        else if (!with_words && wpe) position_rows_forward(m, s->input, N, 0);
        reduce_from_tensor_model_parallel_region(s->input, (size_t)N * C);   // g (vocab-parallel embedding)
    }
    if (m->cfg.embed_layernorm)
        norm_forward(m, s->embed_ln, s->embed_ln_mean, s->embed_ln_rstd, s->input, m->lne_w, m->lne_b, m->residual_rows);
    residual_dropout_forward(m, layer_input(s, 0), dropout_of(m, s, -1, DROPOUT_EMBEDDING));   // (after the LayerNorm)
}

// The input of a column-parallel layer (QKV, FC1, the head) from a LayerNorm's output x of this
// rank's residual rows: x itself, every row (f's forward is the identity); with sequence
// parallelism every rank's rows gathered into the shared whole_rows.
static const floatX* column_parallel_input(GPT* m, const floatX* x) {
    if (!m->sequence_parallel) return x;
    gather_from_sequence_parallel_region(m->whole_rows, x, residual_elems(m));
    return m->whole_rows;
}

// Row-parallel linear (Megatron's RowParallelLinear): out = g(inp @ W^T) + b, of this rank's
// residual rows. Without sequence parallelism the bias is added by tensor rank 0 only, before
// the all-reduce; with it the partial products are reduce-scattered to the rows' owners and
// every rank adds the bias to its own rows (as Megatron-LM). Then the hidden dropout d of the
// output, bias included; the residual add that follows is the caller's (Megatron-LM's
// bias-dropout-add, here the bias in the product, the dropout a pass, the add fused with the
// next LayerNorm).
static void row_parallel_linear_forward(GPT* m, floatX* out, const floatX* inp, int w, int b, int in_local, Dropout d) {
    int N = m->B * m->T, C = m->cfg.hidden_size;
    if (m->sequence_parallel) {
        matmul_forward(m->whole_rows, inp, param_of(m, w), NULL, N, in_local, C);
        reduce_scatter_to_sequence_parallel_region(out, m->whole_rows, residual_elems(m));
        if (b >= 0) rows_add_forward(out, param_of(m, b), m->residual_rows, C, 0, 1);
    } else {
        matmul_forward(out, inp, param_of(m, w), m->tp_rank == 0 ? param_of(m, b) : NULL, N, in_local, C);
        reduce_from_tensor_model_parallel_region(out, (size_t)N * C);   // g
    }
    residual_dropout_forward(m, out, d);
}

// this rank's heads for the attention kernels: with ALiBi, they are global heads
// tp_rank * heads_local onwards of num_attention_heads (each with its own slope)
static Alibi alibi_of(const GPT* m) {
    Alibi none = {0, 0}, heads = {m->tp_rank * m->heads_local, m->cfg.num_attention_heads};
    return m->cfg.position_embedding_type == POSITION_ALIBI ? heads : none;
}

// the model is about to read `layer`'s parameters (-1: the embedding's, num_layers: the head's): the
// step's hook may have them still in flight (ZeRO-1's overlapped gather, ZeRO-3's layer gathers)
static void before_reading_parameters(const GPT* m, int layer) {
    if (m->on_parameters_needed) m->on_parameters_needed(layer);
}

// Does block i end with the next block's ln1, fused with its last residual add (res3 + the
// LayerNorm of it, residual_layernorm_forward)? Only inside a model chunk, and only when both blocks
// are recomputed in the same chunk or both not recomputed: a recomputed chunk restarts from
// its input alone, so its first block computes its own ln1, and its last one must not write
// into the layer after it, whose activations may share the recomputation scratch. Fused or
// not, the LayerNorm is the same code on the same floatX residual: the same bits.
static int fuses_next_ln1(const GPT* m, int i) {
    if (i < 0 || i + 1 >= m->num_local_layers || chunk_of_layer(m, i) != chunk_of_layer(m, i + 1)) return 0;
    int first, end, next_first, next_end;
    int chunk = recompute_chunk(m, i, &first, &end), next_chunk = recompute_chunk(m, i + 1, &next_first, &next_end);
    return chunk == next_chunk && (!chunk || first == next_first);
}

// rope (--position-embedding-type rope) turns this rank's query and key heads in qkv by their
// tokens' positions, in place, after the QKV product; the backward turns their gradients back
// (B sequences of T rows, from position pos0; with context parallelism a run of positions at a time)
static void rotate_rows(GPT* m, floatX* qkv, int B, int T, int pos0, int direction) {
    const GPTConfig* c = &m->cfg;
    if (direction > 0)
        rope_forward(qkv, B, T, m->heads_local, m->groups_local, m->head_size, rotated_dims(c), (float)c->rotary_base, pos0);
    else
        rope_backward(qkv, B, T, m->heads_local, m->groups_local, m->head_size, rotated_dims(c), (float)c->rotary_base, pos0);
}

static void rotate_positions(GPT* m, floatX* qkv, int direction) {
    if (m->cfg.position_embedding_type != POSITION_ROPE) return;
    if (!splits_sequence(m)) {
        rotate_rows(m, qkv, m->B, m->T, first_position(m), direction);
        return;
    }
    for (int row = 0, N = m->B * m->T; row < N;) {
        PositionRun r = position_run_at(&m->context.slice, row, N);
        rotate_rows(m, qkv + (size_t)row * m->qkv_local, 1, r.count, r.position, direction);
        row += r.count;
    }
}

// The attention core of layer l of the micro-batch in slot s: out = softmax(q k^T) v over this
// rank's heads; with context parallelism over every context-parallel rank's keys (context_parallel.h)
static void attention_core_forward(GPT* m, MicroBatchActivations* s, LayerActivations* L, int l) {
    Dropout d = dropout_of(m, s, l, DROPOUT_ATTENTION_PROBS);
    if (splits_sequence(m)) context_attention_forward(&m->context, L->atty, L->lse, L->qkv, alibi_of(m), d);
    else attention_forward(L->atty, L->att, L->lse, m->att_scratch, L->qkv, m->B, m->T, m->heads_local, m->groups_local,
                           m->head_size, alibi_of(m), d);
}

// its backward: dqkv from datty
static void attention_core_backward(GPT* m, MicroBatchActivations* s, LayerActivations* L, int l, floatX* dqkv,
                                    const floatX* datty) {
    Dropout d = dropout_of(m, s, l, DROPOUT_ATTENTION_PROBS);
    if (splits_sequence(m)) {
        context_attention_backward(&m->context, dqkv, datty, L->qkv, L->atty, L->lse, alibi_of(m), d);
        return;
    }
    if (recomputes_attention_core(m))   // selective: the probabilities again (atty, the product with v, was kept)
        attention_probabilities(L->att, m->att_scratch, L->qkv, m->B, m->T, m->heads_local, m->groups_local, m->head_size,
                                alibi_of(m));
    attention_backward(dqkv, m->att_scratch, datty, L->qkv, L->atty, L->att, L->lse, m->B, m->T, m->heads_local,
                       m->groups_local, m->head_size, alibi_of(m), d);
}

// generation: the rows' keys and values appended to layer i's cache, their queries attending
// to every position cached so far (their own included)
static void cached_attention_forward(GPT* m, LayerActivations* L, int i) {
    const KVCache* kv = m->kv_cache;
    int n = m->B * m->T;
    kv_cache_append(kv->layers[i], L->qkv, n, kv->pos0, m->heads_local, m->groups_local, m->head_size);
    attention_decode(L->atty, kv->layers[i], L->qkv, n, kv->pos0, m->heads_local, m->groups_local, m->head_size,
                     alibi_of(m));
}

// An MLP's first product and activation on `rows` rows of x (the dense MLP's every row, or an
// expert's rows): fch = fc1(x), kept for the backward, fch_act = its activation, GELU (in --gelu's
// form) or SwiGLU (--swiglu); the forward's one place to read the choice (the backward's: below).
// GELU's tanh form goes into the product's epilogue; SwiGLU's halves are [gate | up].
static void mlp_rows_activation(GPT* m, const MlpTensors* t, int rows, const floatX* x, floatX* fch, floatX* fch_act) {
    int C = m->cfg.hidden_size, F = t->width;
    if (!m->cfg.swiglu) {
        matmul_gelu_forward(fch_act, fch, x, param_of(m, t->fc_w), param_of(m, t->fc_b), rows, C, F, (GeluForm)m->cfg.gelu);
        return;
    }
    matmul_forward(fch, x, param_of(m, t->fc_w), param_of(m, t->fc_b), rows, C, 2 * F);
    swiglu_forward(fch_act, fch, rows, F);
}

// the whole MLP on `rows` rows of x into y (an expert's or the shared expert's: TP 1)
static void mlp_rows_forward(GPT* m, const MlpTensors* t, int rows, const floatX* x, floatX* fch, floatX* fch_act, floatX* y) {
    mlp_rows_activation(m, t, rows, x, fch, fch_act);
    matmul_forward(y, fch_act, param_of(m, t->fcproj_w), param_of(m, t->fcproj_b), rows, t->width, m->cfg.hidden_size);
}

// The MLP's backward on `rows` rows from its output's gradient dy (an expert's or the shared
// expert's: TP 1): its weights' and biases' gradients, and into dx its input's gradient. dfch,
// dfch_act: scratch. GELU's backward goes into fc2's product, as the dense MLP's.
static void mlp_rows_backward(GPT* m, const MlpTensors* t, int rows, floatX* dx, const floatX* dy, const floatX* x,
                              const floatX* fch, const floatX* fch_act, floatX* dfch, floatX* dfch_act) {
    int C = m->cfg.hidden_size, F = t->width;
    if (!m->cfg.swiglu) {
        gelu_matmul_backward(dfch, grad_of(m, t->fcproj_w), grad_of(m, t->fcproj_b), m->column_partials, dy, fch_act,
                             param_of(m, t->fcproj_w), fch, rows, F, C, (GeluForm)m->cfg.gelu);
    } else {
        matmul_backward(dfch_act, grad_of(m, t->fcproj_w), grad_of(m, t->fcproj_b), m->column_partials, dy, fch_act,
                        param_of(m, t->fcproj_w), rows, F, C);
        swiglu_backward(dfch, fch, dfch_act, rows, F);
    }
    matmul_backward(dx, grad_of(m, t->fc_w), grad_of(m, t->fc_b), m->column_partials, dfch, x, param_of(m, t->fc_w), rows, C,
                    (m->cfg.swiglu ? 2 : 1) * F);
}

// the load-balancing and z losses' coefficients (0: off), weight and tokens (moe.h's MoELosses)
static MoELosses moe_losses_of(const GPT* m) {
    const GPTConfig* c = &m->cfg;
    int share = splits_sequence(m) ? m->context.slice.size : 1;   // (context parallelism: the sequences' tokens)
    MoELosses l = {c->moe_router_load_balancing_type == 0 ? c->moe_aux_loss_coeff : 0.0f, c->moe_z_loss_coeff,
                   m->moe_loss_scale * share, m->B * m->T * share};
    return l;
}

// The experts' rows of a MoE layer from this rank's routing (moe.h; offsets on the host): at EP
// 1 the rows sorted by expert themselves; with expert parallelism `mine` go out to the experts'
// ranks and the group's rows for the experts here come in at `theirs`, the counts exchanged first
// where `plan` (else the last plan's: the same routing's rows again). Returns the experts' rows'
// buffer; m->expert_offsets then holds each expert's rows in it.
static floatX* experts_rows_in(GPT* m, floatX* mine, floatX* theirs, int plan) {
    const int* offsets = m->moe_host_offsets;
    if (m->ep.size <= 1) {
        memcpy(m->expert_offsets, offsets, (m->ep.local + 1) * sizeof(int));
        return mine;
    }
    if (plan) expert_rows_plan(&m->ep, offsets, m->expert_received, m->expert_offsets);
    expert_rows_exchange(&m->ep, theirs, mine, offsets, m->expert_received, m->expert_offsets, m->cfg.hidden_size, 1);
    return theirs;
}

// and the experts' rows back to the ranks whose tokens they are (nothing to do at EP 1)
static void experts_rows_out(GPT* m, floatX* mine, floatX* theirs) {
    if (m->ep.size <= 1) return;
    expert_rows_exchange(&m->ep, theirs, mine, m->moe_host_offsets, m->expert_received, m->expert_offsets,
                         m->cfg.hidden_size, 0);
}

// A MoE layer's forward in place of the MLP (moe.h): res3 = the experts' outputs combined by the
// router's weights, plus the shared expert's gated output; the hidden dropout after it, as the
// dense MLP's. In training the layer's load-balancing and z losses add to the step's sums (raw,
// without their coefficients: 1 is a perfect balance), once (not again when a backward recomputes).
// The experts run one GEMM pair each, launched from the host's copy of the row offsets (the
// dense MLP's own code on fewer rows): a grouped GEMM (cuBLAS's cublasGemmGroupedBatchedEx,
// Megatron-Core's --moe-grouped-gemm) would launch them in one call and read the offsets on the
// device, saving E - 1 launches and the copy to the host; here each expert is a plain product a
// reader can follow, and the planner prices the smaller GEMMs' lower efficiency (cost.h).
static void moe_forward(GPT* m, MicroBatchActivations* s, LayerActivations* L, const LayerTensors* t, int l) {
    const GPTConfig* c = &m->cfg;
    int N = m->B * m->T, C = c->hidden_size, E = c->num_experts, k = c->moe_router_topk;
    int F = c->moe_ffn_hidden_size, glu = c->swiglu ? 2 : 1, *offsets = m->moe_host_offsets;
    matmul_forward(L->router_logits, L->ln2, param_of(m, t->router_w), NULL, N, C, E);
    L->route.N = N;   // (decoding runs fewer rows than the arena's)
    moe_dispatch(&L->route, m->moe_xs, L->ln2, L->router_logits, C, offsets);
    if (splits_sequence(m)) all_reduce_counts(m->context.group, L->route.counts, E);   // the sequences' (moe_losses_of)
    floatX* xs = experts_rows_in(m, m->moe_xs, m->expert_xs, 1);
    floatX* ys = m->ep.size > 1 ? m->expert_ys : L->moe_ys;
    const int* rows = m->expert_offsets;
    for (int e = 0; e < m->ep.local; e++) {   // each expert here on its rows (none: nothing to do)
        size_t r = rows[e];
        if (rows[e + 1] > rows[e])
            mlp_rows_forward(m, &t->experts[e], rows[e + 1] - rows[e], xs + r * C, L->fch + r * glu * F, L->fch_act + r * F,
                             ys + r * C);
    }
    experts_rows_out(m, L->moe_ys, ys);
    moe_combine(L->res3, L->moe_ys, L->route.weight, L->route.position, N, k, C);
    if (t->shared_gate_w >= 0) {   // + sigmoid(x w_gate) shared_mlp(x)
        mlp_rows_forward(m, &t->shared, N, L->ln2, L->shared_fch, L->shared_fch_act, L->shared_y);
        matmul_forward(L->shared_gate, L->ln2, param_of(m, t->shared_gate_w), NULL, N, C, 1);
        moe_shared_gate_forward(L->res3, L->shared_y, L->shared_gate, N, C);
    }
    if (m->moe_loss_scale > 0.0f && !m->recomputing) {   // training, once: the step's tokens per expert and MoE losses
        long long* tokens = m->moe_tokens + (size_t)(t - m->layer_tensors) * E;
        for (int e = 0; e < E; e++) tokens[e] += offsets[e + 1] - offsets[e];   // (the rows each expert ran)
        m->moe_dropped += (long long)N * k - offsets[E];   // (the choices over an expert's capacity)
        moe_aux_loss(&m->moe_loss_sums[0], &m->moe_loss_sums[1], L->route.probs, L->route.lse, L->route.counts, N, E, k,
                     1.0f, 1.0f, moe_losses_of(m).tokens);
    }
    residual_dropout_forward(m, L->res3, dropout_of(m, s, l, DROPOUT_MLP_OUTPUT));
}

// The MLP's forward, dense or a mixture of experts: res3 = mlp(ln2), before the residual add
static void mlp_forward(GPT* m, MicroBatchActivations* s, LayerActivations* L, const LayerTensors* t, int l) {
    if (t->router_w >= 0) {
        moe_forward(m, s, L, t, l);
        return;
    }
    mlp_rows_activation(m, &t->mlp, m->B * m->T, column_parallel_input(m, L->ln2), L->fch, L->fch_act);   // f, column-parallel
    row_parallel_linear_forward(m, L->res3, L->fch_act, t->mlp.fcproj_w, t->mlp.fcproj_b, m->ffn_local,
                                dropout_of(m, s, l, DROPOUT_MLP_OUTPUT));
}

static void block_forward(GPT* m, MicroBatchActivations* s, int i) {
    int B = m->B, T = m->T, N = B * T, C = m->cfg.hidden_size;
    int Cl = m->hidden_local, l = global_layer(m, i);
    const LayerTensors* t = &m->layer_tensors[i];
    LayerActivations* L = &s->layers[i];
    const floatX* x = layer_input(s, i);
    // attention: res2 = x + proj(attention(qkv(ln1(x)))); ln1 may come from the block before
    if (!fuses_next_ln1(m, i - 1)) norm_forward(m, L->ln1, L->ln1_mean, L->ln1_rstd, x, t->ln1_w, t->ln1_b, m->residual_rows);
    matmul_forward(L->qkv, column_parallel_input(m, L->ln1), param_of(m, t->qkv_w), param_of(m, t->qkv_b), N, C,
                   m->qkv_local);   // f, column-parallel
    rotate_positions(m, L->qkv, +1);
    if (m->kv_cache) cached_attention_forward(m, L, i);
    else attention_core_forward(m, s, L, l);
    row_parallel_linear_forward(m, L->res2, L->atty, t->proj_w, t->proj_b, Cl, dropout_of(m, s, l, DROPOUT_ATTENTION_OUTPUT));
    // the residual add and ln2 in one pass: res2 += x, ln2 = norm(res2)
    residual_norm_forward(m, L->res2, L->ln2, L->ln2_mean, L->ln2_rstd, L->res2, x, t->ln2_w, t->ln2_b);
    // MLP: res3 = res2 + fcproj(act(fc(ln2))), or a mixture of experts
    mlp_forward(m, s, L, t, l);
    if (fuses_next_ln1(m, i)) {   // res3 += res2, and the next block's ln1 = norm(res3) in the same pass
        before_reading_parameters(m, global_layer(m, i + 1));   // (the next layer's ln1: ZeRO gathers it)
        const LayerTensors* next_t = &m->layer_tensors[i + 1];
        LayerActivations* next = &s->layers[i + 1];
        residual_norm_forward(m, L->res3, next->ln1, next->ln1_mean, next->ln1_rstd, L->res3, L->res2, next_t->ln1_w,
                              next_t->ln1_b);
    } else {
        residual_forward(L->res3, L->res3, L->res2, residual_elems(m));
    }
}

// The logits of the micro-batch in slot s: its buffer of the head's (micro-batch j in buffer j mod
// head_logits: the head's forwards and backwards both run in micro-batch order, so those between
// the two are consecutive, and the schedule keeps no more of them than the buffers); a slot no
// schedule holds (generation, the tests) has the first
static floatX* logits_of(const GPT* m, const MicroBatchActivations* s) {
    size_t j = s->holder > 0 ? (size_t)(s->holder % m->head_logits) : 0;
    return m->logits + j * m->B * m->T * m->vocab_local;
}

// final norm, logits with the output layer (the tied word embedding, or its own), and the
// vocab-parallel cross-entropy.
// dloss: the weight of each token's loss in the step's (see gpt_backward); with dloss != 0 a
// backward follows, and the cross-entropy writes dlogits over the logits in the pass that
// computes the loss, for head_backward. With 0 the logits stay (generation reads them).
static void head_forward(GPT* m, MicroBatchActivations* s, float dloss) {
    int N = m->B * m->T, C = m->cfg.hidden_size, V = m->vocab_local, valid = m->vocab_valid_local;
    floatX* logits = logits_of(m, s);
    if (m->kv_cache) {   // generation: the last row's logits alone (the next token's), no loss
        norm_forward(m, s->lnf, s->lnf_mean, s->lnf_rstd, stage_output(s) + (size_t)(N - 1) * C, m->lnf_w, m->lnf_b, 1);
        matmul_forward(logits, s->lnf, param_of(m, m->output), NULL, 1, C, V);
        return;
    }
    if (dloss != 0.0f && m->logits_hold_gradient == m->head_logits)
        fail("head_forward: %d micro-batches' dlogits wait for their backwards already, as many as the logits buffers "
             "planned (the schedule runs further ahead than its walk counted)", m->head_logits);
    norm_forward(m, s->lnf, s->lnf_mean, s->lnf_rstd, stage_output(s), m->lnf_w, m->lnf_b, m->residual_rows);
    matmul_forward(logits, column_parallel_input(m, s->lnf), param_of(m, m->output), NULL, N, C, V);   // f, column-parallel
    if (m->tp_size == 1) {   // whole rows here: statistics, loss and dlogits in one pass a row
        crossentropy_forward_fused(m->losses, logits, m->ce_max, m->ce_sums, s->targets, dloss, N, V, valid);
    } else {
        crossentropy_online_stats(m->ce_max, m->ce_local_max, m->ce_sums, logits, s->targets, N, V, valid,
                                  m->vocab_start);   // the first read of the logits
        vocab_parallel_max(m->ce_max, N);
        crossentropy_rescale_sums(m->ce_sums, m->ce_local_max, m->ce_max, N);
        vocab_parallel_sum(m->ce_sums, 2 * (size_t)N);
        crossentropy_forward(m->losses, logits, m->ce_max, m->ce_sums, s->targets, dloss, N, V, valid,
                             m->vocab_start);   // the second: the loss, and dlogits
    }
    m->logits_hold_gradient += dloss != 0.0f;
}

// Forward of the micro-batch in `slot` through the slot's model chunk of this stage (the whole
// stage without interleaving). The embedding's chunk reads the slot's tokens, the others its
// input (received from the previous stage). The head's chunk leaves each token's loss in
// m->losses, on the device. dloss: d(loss)/d(each token's loss) of the backward that follows
// on the head's chunk (which its forward prepares), 0 if none.

static void gpt_forward_stage(GPT* m, int slot, float dloss) {
    MicroBatchActivations* s = &m->slots[slot];
    m->moe_loss_scale = dloss * m->B * m->T;   // (the micro-batch's share of the step's gradient: its MoE losses')
    if (chunk_holds_embedding(m, s->chunk)) {
        before_reading_parameters(m, -1);
        embedding_forward(m, s);
    }
    for (int i = s->first; i < s->end; i++) {
        before_reading_parameters(m, global_layer(m, i));
        block_forward(m, s, i);
    }
    if (chunk_holds_head(m, s->chunk)) {
        before_reading_parameters(m, m->cfg.num_layers);   // the final LayerNorm, and the tied copy of the embedding
        head_forward(m, s, dloss);
    }
}

// gpt_forward_stage with no backward to follow, then on the last stage the mean loss over the
// micro-batch's tokens read back to the host (else 0): for tests and tools (inline: the trainer
// does not call it). The training schedule keeps the losses on the device instead
// (loss_mean_add) and reads them once a step.
static inline double gpt_forward(GPT* m, int slot) {
    gpt_forward_stage(m, slot, 0.0f);
    if (!chunk_holds_head(m, m->slots[slot].chunk)) return 0.0;
    int N = m->B * m->T;
    dev_to_host(m->host_losses, m->losses, (size_t)N * sizeof(float));
    double sum = 0.0;
    for (int n = 0; n < N; n++) sum += m->host_losses[n];
    return sum / N;
}

// ----------------------------------------------------------------------------
// decoding: the same forward, of a few rows of one sequence at a time (generate.h)
// gpt_decode_begin hands the model a KV cache: from then on a forward of the slot's B x T rows
// (set by gpt_decode_rows: B = 1, T = n) is rows [pos0, pos0 + n) of one sequence; the embedding
// adds positions from pos0, each layer's attention appends the rows' keys and values to its
// cache and attends over it (cached_attention_forward), the head gives the last row's logits.
// The rows reuse the training arena's slots, so n is at most its residual rows (B x T, or
// B x T / TP with sequence parallelism). Sequence parallelism is a layout of the same weights:
// decoding turns it off (its few rows are not worth splitting) and gpt_decode_end turns it
// back on, with the training shape.

static void gpt_decode_begin(GPT* m, KVCache* kv) {
    kv->B = m->B;
    kv->T = m->T;
    kv->sequence_parallel = m->sequence_parallel;
    kv->residual_rows = kv->max_rows = m->residual_rows;
    kv->first_residual_row = m->first_residual_row;
    kv->pos0 = 0;
    m->sequence_parallel = 0;
    m->kv_cache = kv;
}

static void gpt_decode_rows(GPT* m, int pos0, int n) {
    KVCache* kv = m->kv_cache;
    if (n < 1 || n > kv->max_rows || pos0 < 0 || pos0 + n > kv->max_len)
        fail("gpt_decode_rows: rows [%d, %d) do not fit (at most %d rows at once, %d positions cached)", pos0, pos0 + n,
             kv->max_rows, kv->max_len);
    m->B = 1;
    m->T = m->residual_rows = n;
    m->first_residual_row = 0;
    kv->pos0 = pos0;
}

static void gpt_decode_end(GPT* m) {
    KVCache* kv = m->kv_cache;
    m->B = kv->B;
    m->T = kv->T;
    m->sequence_parallel = kv->sequence_parallel;
    m->residual_rows = kv->residual_rows;
    m->first_residual_row = kv->first_residual_row;
    m->kv_cache = NULL;
}

// ----------------------------------------------------------------------------
// backward
// m->dres carries the gradient of the residual stream down through the layers: it holds
// the gradient of a layer's output when the layer's backward starts, and of its input
// when it ends.

// A linear layer's weight and bias gradients from its output's gradient dout [N, out] and its
// input inp [N, in]: now, or with ZB-H1 (m->weights_deferred, pipeline.h) in the micro-batch's W
// pass, later (gpt_backward_weights). Then `keep` holds dout until that pass: a buffer of the
// slot's of dout's shape that the rest of the backward no longer reads (NULL: never deferred).
static void linear_weight_gradients(GPT* m, int w, float* dbias, const floatX* dout, const floatX* inp, floatX* keep,
                                    int N, int in, int out) {
    if (!m->weights_deferred || !keep) {
        matmul_backward_params(grad_of(m, w), dbias, m->column_partials, dout, inp, N, in, out);
        return;
    }
    pipeline_before_writing(keep);   // (a chunk's last output, still on its way to the next stage)
    dev_copy(keep, dout, (size_t)N * out * sizeof(floatX));
}

// A column-parallel layer's backward, of `out_local` output features (this rank's) and input x
// (the LayerNorm's output of this rank's residual rows, gathered again with sequence
// parallelism: as Megatron-LM, a micro-batch keeps only its own rows of it): the weight's and
// the bias's gradients, and into dinp [B*T, C] this rank's part of the input's gradient, then
// summed over the tensor ranks: in place by an all-reduce (f's backward), or with sequence
// parallelism reduce-scattered into `dlocal` (this rank's rows). Returns where the sum is. keep:
// where ZB-H1's W pass finds dout (linear_weight_gradients).
static floatX* column_parallel_linear_backward(GPT* m, floatX* dinp, floatX* dlocal, const floatX* dout, const floatX* x,
                                               int w, int b, int out_local, floatX* keep) {
    int N = m->B * m->T, C = m->cfg.hidden_size;
    matmul_backward_dinp(dinp, dout, param_of(m, w), N, C, out_local);
    linear_weight_gradients(m, w, grad_of(m, b), dout, column_parallel_input(m, x), keep, N, C, out_local);
    if (!m->sequence_parallel) {
        copy_to_tensor_model_parallel_region_backward(dinp, (size_t)N * C);   // f
        return dinp;
    }
    gather_from_sequence_parallel_region_backward(dlocal, dinp, residual_elems(m));
    return dlocal;
}

// A row-parallel layer's backward, of `in_local` input features and input `inp` [B*T,
// in_local], from the gradient of its output in m->dres (this rank's residual rows, all of
// them gathered with sequence parallelism: the reduce-scatter's backward): dinp, and the
// weight's and bias's gradients. pre_gelu: the MLP's GELU input, whose backward then goes into
// the same product (else NULL). With sequence parallelism the bias was added to this rank's rows
// only, and its gradient is theirs (data_parallel.h sums it over the tensor ranks). Dropout d
// (the forward's): the gradient through its mask, drawn again, into `dropped` (this rank's
// residual rows; m->dres stays the residual stream's). keep: as the column-parallel layer's.
static void row_parallel_linear_backward(GPT* m, floatX* dinp, const floatX* inp, const floatX* pre_gelu, int w, int b,
                                         int in_local, Dropout d, floatX* dropped, floatX* keep) {
    int N = m->B * m->T, C = m->cfg.hidden_size;
    const floatX* dout = m->dres;
    float* dbias = grad_of(m, b);
    if (d.threshold) {
        apply_hidden_dropout(m, dropped, m->dres, d);
        dout = dropped;
    }
    if (m->sequence_parallel) {
        if (dbias) rows_add_backward(dbias, m->column_partials, dout, m->residual_rows, C, 0, 1);
        reduce_scatter_to_sequence_parallel_region_backward(m->whole_rows, dout, residual_elems(m));
        dout = m->whole_rows;
        dbias = NULL;
    }
    if (pre_gelu) gelu_matmul_backward_dinp(dinp, dout, param_of(m, w), pre_gelu, N, in_local, C, (GeluForm)m->cfg.gelu);
    else matmul_backward_dinp(dinp, dout, param_of(m, w), N, in_local, C);
    linear_weight_gradients(m, w, dbias, dout, inp, keep, N, in_local, C);
}

// the micro-batch's logits hold its dlogits already: head_forward wrote them. The output
// layer's weight gradient is never deferred: ZB-H1 would keep the vocabulary-wide dlogits.
static void head_backward(GPT* m, MicroBatchActivations* s) {
    if (!m->logits_hold_gradient) fail("gpt_backward: the last stage's forward was run without a backward to follow (dloss 0)");
    m->logits_hold_gradient--;
    floatX* d = column_parallel_linear_backward(m, m->dbuf_a, m->dbuf_b, logits_of(m, s), s->lnf, m->output, -1, m->vocab_local,
                                                 NULL);
    dev_zero(m->dres, residual_elems(m) * sizeof(floatX));
    norm_backward(m, m->dres, d, stage_output(s), m->lnf_w, m->lnf_b, s->lnf_mean, s->lnf_rstd);
}

// The MLP's second linear layer (its dropout d) and the activation before it: da = the gradient
// at fch (fc1's output). GELU's backward (--gelu's form) goes into the product; SwiGLU's reads
// the product's gradient at fch_act from db and writes the [gate | up] gradient into da. (db holds
// the dropout's gradient while the product reads it.) ZB-H1 keeps fc2's output gradient in res3.
static floatX* mlp_activation_backward(GPT* m, const LayerActivations* L, const MlpTensors* t, floatX* da, floatX* db,
                                       Dropout d) {
    if (!m->cfg.swiglu) {
        row_parallel_linear_backward(m, da, L->fch_act, L->fch, t->fcproj_w, t->fcproj_b, m->ffn_local, d, db, L->res3);
        return da;
    }
    row_parallel_linear_backward(m, da, L->fch_act, NULL, t->fcproj_w, t->fcproj_b, m->ffn_local, d, db, L->res3);
    swiglu_backward(db, L->fch, da, m->B * m->T, m->ffn_local);
    return db;
}

// A MoE layer's backward (moe.h), from the gradient of its output in m->dres: the combine's, each
// expert's on its rows, the gather's, the router's (with the load-balancing and z losses), the
// shared expert's and its gate's. Returns the gradient at ln2 (in dbuf_a).
static floatX* moe_backward(GPT* m, MicroBatchActivations* s, LayerActivations* L, const LayerTensors* t, int l) {
    const GPTConfig* c = &m->cfg;
    int N = m->B * m->T, C = c->hidden_size, E = c->num_experts, F = c->moe_ffn_hidden_size, glu = c->swiglu ? 2 : 1;
    floatX *dx = m->dbuf_a, *dout = m->dres;
    Dropout d = dropout_of(m, s, l, DROPOUT_MLP_OUTPUT);
    if (d.threshold) apply_hidden_dropout(m, dout = m->dbuf_b, m->dres, d);
    // the experts' inputs again (with expert parallelism, received again: memory kept for one
    // more all-to-all), and their outputs' gradients sent the same way
    moe_dispatch_again(&L->route, m->moe_xs, L->ln2, C, m->moe_host_offsets);
    floatX* xs = experts_rows_in(m, m->moe_xs, m->expert_xs, 1);
    moe_combine_backward_rows(&L->route, m->moe_dys, m->moe_dweight, dout, L->moe_ys, C);
    floatX* dys = experts_rows_in(m, m->moe_dys, m->expert_ys, 0);
    floatX* dxs = m->ep.size > 1 ? m->expert_dxs : m->moe_dxs;
    const int* rows = m->expert_offsets;
    for (int e = 0; e < m->ep.local; e++) {
        size_t r = rows[e];
        if (rows[e + 1] > rows[e])
            mlp_rows_backward(m, &t->experts[e], rows[e + 1] - rows[e], dxs + r * C, dys + r * C, xs + r * C,
                              L->fch + r * glu * F, L->fch_act + r * F, m->moe_dfch, m->moe_dfch_act);
    }
    experts_rows_out(m, m->moe_dxs, dxs);
    moe_dispatch_backward(&L->route, dx, m->moe_dlogits, m->moe_dxs, m->moe_dweight, moe_losses_of(m), C);
    // the router's product: its weight's gradient, and its input's added to dx
    matmul_backward(m->moe_dx, grad_of(m, t->router_w), NULL, m->column_partials, m->moe_dlogits, L->ln2,
                    param_of(m, t->router_w), N, C, E);
    residual_forward(dx, dx, m->moe_dx, (size_t)N * C);
    if (t->shared_gate_w < 0) return dx;
    // the shared expert's gate (its logit's gradient in moe_dlogits' first N) and the shared expert
    moe_shared_gate_backward(m->moe_dys, m->moe_dlogits, dout, L->shared_y, L->shared_gate, N, C);
    matmul_backward(m->moe_dx, grad_of(m, t->shared_gate_w), NULL, m->column_partials, m->moe_dlogits, L->ln2,
                    param_of(m, t->shared_gate_w), N, C, 1);
    residual_forward(dx, dx, m->moe_dx, (size_t)N * C);
    mlp_rows_backward(m, &t->shared, N, m->moe_dx, m->moe_dys, L->ln2, L->shared_fch, L->shared_fch_act, m->moe_dfch,
                      m->moe_dfch_act);
    residual_forward(dx, dx, m->moe_dx, (size_t)N * C);
    return dx;
}

// With ZB-H1 the four linear layers' weight gradients wait for the W pass (linear_weight_gradients),
// each output gradient kept where the layer's backward has read the last of a forward activation
// of its shape: the layer's output res3 (read by the next layer's backward, which ran first: fc2's),
// fch (fc1's, once the activation's backward has read it), res2 (the projection's, once ln2's
// backward has read it), qkv (QKV's, once the attention's backward has read it). The slot grows by
// nothing; the W pass reads them with the inputs the forward kept (fch_act, ln2, atty, ln1).
static void block_backward(GPT* m, MicroBatchActivations* s, int i) {
    int Cl = m->hidden_local, l = global_layer(m, i);
    const LayerTensors* t = &m->layer_tensors[i];
    LayerActivations* L = &s->layers[i];
    floatX *da = m->dbuf_a, *db = m->dbuf_b, *d, *dfch;
    // MLP: fcproj and the activation before it, then fc1; or a mixture of experts
    if (t->router_w >= 0) {
        d = moe_backward(m, s, L, t, l);
    } else {
        dfch = mlp_activation_backward(m, L, &t->mlp, da, db, dropout_of(m, s, l, DROPOUT_MLP_OUTPUT));
        floatX* other = dfch == da ? db : da;
        d = column_parallel_linear_backward(m, other, dfch, dfch, L->ln2, t->mlp.fc_w, t->mlp.fc_b, m->fc_local, L->fch);   // f
    }
    norm_backward(m, m->dres, d, L->res2, t->ln2_w, t->ln2_b, L->ln2_mean, L->ln2_rstd);
    // attention
    row_parallel_linear_backward(m, da, L->atty, NULL, t->proj_w, t->proj_b, Cl, dropout_of(m, s, l, DROPOUT_ATTENTION_OUTPUT),
                                 db, L->res2);
    attention_core_backward(m, s, L, l, db, da);
    rotate_positions(m, db, -1);
    d = column_parallel_linear_backward(m, da, db, db, L->ln1, t->qkv_w, t->qkv_b, m->qkv_local, L->qkv);   // f
    norm_backward(m, m->dres, d, layer_input(s, i), t->ln1_w, t->ln1_b, L->ln1_mean, L->ln1_rstd);
}

static void embedding_backward(GPT* m, MicroBatchActivations* s) {
    int N = m->B * m->T, C = m->cfg.hidden_size;
    const floatX* d = m->dres;
    Dropout drop = dropout_of(m, s, -1, DROPOUT_EMBEDDING);
    if (drop.threshold) {
        apply_hidden_dropout(m, m->dbuf_b, m->dres, drop);
        d = m->dbuf_b;
    }
    if (m->cfg.embed_layernorm) {
        dev_zero(m->dbuf_a, residual_elems(m) * sizeof(floatX));
        norm_backward(m, m->dbuf_a, d, s->input, m->lne_w, m->lne_b, s->embed_ln_mean, s->embed_ln_rstd);
        d = m->dbuf_a;
    }
    if (!m->sequence_parallel) {
        // every tensor rank holds the whole gradient of the (replicated) embedding output, so
        // each computes the same position-embedding gradient and its own word-embedding rows
        int with_words = !splits_sequence(m);   // (as the forward added them)
        encoder_backward(grad_of(m, m->wte), with_words ? grad_of(m, m->wpe) : NULL, d, s->tokens, N, m->T, C,
                         m->vocab_start, m->vocab_local);
        if (!with_words && m->wpe >= 0) position_rows_backward(m, d, N, 0);
        return;
    }
    // sequence parallelism: the positions' gradient from this rank's rows (data_parallel.h sums it over
    // the tensor ranks), the word embedding's rows from every row, gathered (the reduce-scatter's backward)
    if (m->wpe >= 0) position_rows_backward(m, d, m->residual_rows, m->first_residual_row);
    reduce_scatter_to_sequence_parallel_region_backward(m->whole_rows, d, residual_elems(m));
    encoder_backward(grad_of(m, m->wte), NULL, m->whole_rows, s->tokens, N, m->T, C, m->vocab_start, m->vocab_local);
}

// Backward of the micro-batch in `slot` through the slot's model chunk: in the head's chunk
// after its forward (its logits buffer kept since: logits_of), whose dloss (d(loss)/d(each
// token's loss): 1 / the step's tokens, times fp16's loss scale) has already gone into the
// dlogits that forward wrote. In other chunks m->dres must hold the gradient of the chunk's
// output (received from the next stage); afterwards it holds the gradient of the chunk's input
// (to send to the previous stage).
// Reaching the last layer of a recomputed chunk, the chunk's forward runs again from the
// chunk's input, which the slot kept, and refills the scratch (its tensor-parallel all-reduces
// run again too). It also writes the chunk's output again, where the forward put it: the same
// bits, and nobody reads them any more (what came after the chunk is done).
static void after_final_gradients(const GPT* m, int layer) {
    if (m->on_gradients_final) m->on_gradients_final(layer);
}

static void gpt_backward(GPT* m, int slot) {
    MicroBatchActivations* s = &m->slots[slot];
    if (chunk_holds_head(m, s->chunk)) {
        before_reading_parameters(m, m->cfg.num_layers);
        head_backward(m, s);
        after_final_gradients(m, m->cfg.num_layers);
    }
    for (int i = s->end - 1; i >= s->first; i--) {
        int first, end;
        if (recompute_chunk(m, i, &first, &end) && i == end - 1) {
            m->recomputing = 1;
            for (int k = first; k < end; k++) {
                before_reading_parameters(m, global_layer(m, k));
                block_forward(m, s, k);
            }
            m->recomputing = 0;
        }
        before_reading_parameters(m, global_layer(m, i));   // (ZeRO-3 gathers the layer again for its backward)
        block_backward(m, s, i);
        after_final_gradients(m, global_layer(m, i));
    }
    if (chunk_holds_embedding(m, s->chunk)) {
        before_reading_parameters(m, -1);
        embedding_backward(m, s);
    }
}

// ZB-H1's W pass of the micro-batch in `slot` (pipeline.h's weight_step), after its backward
// (run with m->weights_deferred): each layer's four linear weight and bias gradients, from the
// output gradients the backward kept (block_backward says where) and the inputs the forward kept,
// by the same kernel on the same bits as gpt_backward's; layer by layer from the last, as the
// backward, each layer's gradients then final (the head's were at the backward: its turn first).
// A MoE layer's experts, router and shared expert ran whole in the backward.
static void deferred_weight_gradients(GPT* m, int w, int b, const floatX* kept, const floatX* inp, int in, int out) {
    matmul_backward_params(grad_of(m, w), grad_of(m, b), m->column_partials, kept, inp, m->B * m->T, in, out);
}

static void layer_weight_gradients(GPT* m, MicroBatchActivations* s, int i) {
    const LayerTensors* t = &m->layer_tensors[i];
    const LayerActivations* L = &s->layers[i];
    int C = m->cfg.hidden_size;
    if (t->router_w < 0) {
        deferred_weight_gradients(m, t->mlp.fcproj_w, t->mlp.fcproj_b, L->res3, L->fch_act, m->ffn_local, C);
        deferred_weight_gradients(m, t->mlp.fc_w, t->mlp.fc_b, L->fch, L->ln2, C, m->fc_local);
    }
    deferred_weight_gradients(m, t->proj_w, t->proj_b, L->res2, L->atty, m->hidden_local, C);
    deferred_weight_gradients(m, t->qkv_w, t->qkv_b, L->qkv, L->ln1, C, m->qkv_local);
}

static void gpt_backward_weights(GPT* m, int slot) {
    MicroBatchActivations* s = &m->slots[slot];
    if (chunk_holds_head(m, s->chunk)) after_final_gradients(m, m->cfg.num_layers);
    for (int i = s->end - 1; i >= s->first; i--) {
        layer_weight_gradients(m, s, i);
        after_final_gradients(m, global_layer(m, i));
    }
}
