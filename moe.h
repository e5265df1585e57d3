/*
moe.h — a mixture of experts (MoE): the router and the dispatcher, which send each token to k of
E experts and bring the experts' outputs back (Shazeer et al. 2017; Switch Transformer, Fedus
et al. 2021; Megatron-Core's MoELayer; Mixtral, Qwen2-MoE).

A MoE layer takes the place of a layer's MLP. For each of its N tokens (the rows of ln2's output):
  router     logits = x Wr^T [N, E]; the k experts of the largest logits, each with a weight
             (moe_router_forward: the softmax over the k chosen, Mixtral's and Megatron-LM's
             default; or with --moe-router-pre-softmax the softmax over all E at the chosen,
             Qwen2-MoE's);
  capacity   with --moe-expert-capacity-factor F, each expert takes at most ceil(N k / E x F) of
             the choices, the others dropped (moe_drop_over_capacity, below), in every forward
             (evaluation and generation too, as Megatron-Core's router);
  dispatch   the N x k (token, expert) choices sorted by expert, a stable counting sort (the
             same order on every layout), and the rows gathered in that order: expert e's rows
             are [offsets[e], offsets[e + 1]) of one [N k, C] buffer;
  experts    each expert, an MLP like the dense one, on its rows (gpt.h runs them: the dense MLP's
             code on fewer rows, with the expert's tensors);
  combine    out[t] = the sum over its k choices of weight x the expert's output row;
and with --moe-shared-expert-intermediate-size a shared expert every token goes through, gated by
a sigmoid (Qwen2-MoE): out += sigmoid(x w_gate) shared_mlp(x).
The backward runs the same way back: the combine's (each output row's gradient to its expert
rows, and the weights' gradients), the experts', the gather's (each token's k rows summed back),
the router's (through the weights, plus the load-balancing and z losses).

The load-balancing loss (Switch Transformer's, as Megatron-Core's switch_load_balancing_loss_func):
aux = coeff x E / (N^2 k) x sum_e (sum_t p_te) (tokens routed to e), each layer's added to the
loss; the z-loss (ST-MoE): coeff x mean_t logsumexp_t^2. Both are logged beside the LM loss.

Expert parallelism (--expert-model-parallel-size EP; GShard, Lepikhin et al. 2020; Megatron-Core's
alltoall dispatcher): the E experts are split over the EP ranks of an expert group (parallel.h's
grid.ep, taken from the DP x CP ranks), E / EP on each. Each rank routes its own tokens as above;
its rows sorted by expert are then in blocks, one per rank of the group (that rank's experts').
The row counts go first (an all-to-all of E / EP ints to each rank), then the rows: each block of
an expert's rows goes straight to its place among that expert's rows on its owner (expert-major,
the rows from rank 0 first), so each expert here runs one product over the rows of every rank of
the group; its outputs go back the same way, and the combine is this rank's own again. The
backward sends the outputs' gradients the same way and brings the inputs' back. At EP 1 nothing
moves: the rows sorted by expert are the experts' rows.

Included between context_parallel.h and fields.h (it needs the kernels and nothing of the model's).
*/
#pragma once

// one micro-batch's routing in one MoE layer: what the forward decides and the backward reads
typedef struct {
    int N, E, k, pre_softmax;
    float* probs;    // [N, E] the softmax over all experts (the aux loss's and the backward's)
    float* lse;      // [N] each row's log-sum-exp (the z-loss's)
    int* topk;       // [N, k] the chosen experts, best first
    float* weight;   // [N, k] their weights in the combine
    int* counts;     // [E] choices of each expert, before any drop (the aux loss's)
    int* routed;     // [N k] with a capacity: each choice's expert, or -1 dropped (what the sort reads)
    int* order;      // [N k] the experts' rows: row r holds choice order[r] = t k + j
    int* position;   // [N k] choice t k + j's row, -1 dropped
    int* offsets;    // [E + 1] expert e's rows are [offsets[e], offsets[e + 1])
    float capacity_factor;   // --moe-expert-capacity-factor (0: dropless)
    int drop_policy;         // --moe-token-drop-policy: MOE_DROP_PROBS or MOE_DROP_POSITION
} MoERouting;

// lays one routing out from base (NULL: only counts), returns its bytes
static size_t moe_routing_layout(MoERouting* r, char* base, int N, int E, int k, int pre_softmax) {
    size_t at = 0, choices = (size_t)N * k;
    r->N = N, r->E = E, r->k = k, r->pre_softmax = pre_softmax;
    r->probs = (float*)region_take(base, &at, (size_t)N * E * sizeof(float));
    r->lse = (float*)region_take(base, &at, (size_t)N * sizeof(float));
    r->topk = (int*)region_take(base, &at, choices * sizeof(int));
    r->weight = (float*)region_take(base, &at, choices * sizeof(float));
    r->counts = (int*)region_take(base, &at, (size_t)E * sizeof(int));
    r->routed = (int*)region_take(base, &at, choices * sizeof(int));   // (laid out always: the smallest part)
    r->order = (int*)region_take(base, &at, choices * sizeof(int));
    r->position = (int*)region_take(base, &at, choices * sizeof(int));
    r->offsets = (int*)region_take(base, &at, (size_t)(E + 1) * sizeof(int));
    return at;
}

// An expert's capacity, Megatron-Core's get_capacity over the N k choices of this rank's N tokens
// of the micro-batch: ceil(N k / E x F), no minimum (its callers give none), in double as Python's
// floats (F is the flag's float). At N or more nothing is dropped (an expert has N choices at
// most, as Megatron-Core skips the drop when the capacity exceeds the tokens): N then.
static int expert_capacity(int N, int k, int E, float factor) {
    double capacity = ceil((double)N * k / E * (double)factor);
    return capacity < N ? (int)capacity : N;
}
static int moe_expert_capacity(const MoERouting* r) { return expert_capacity(r->N, r->k, r->E, r->capacity_factor); }

// Token dropping (Megatron-Core's topk_softmax_with_capacity): with a capacity factor, each expert
// keeps at most its capacity of the choices (the largest weights, or the first tokens: kernels/
// moe.cuh's moe_apply_capacity), the others go to no expert. The weights stay as the router gave
// them (not renormalized over the kept), and the load-balancing loss counts the choices before any
// drop (r->counts: Megatron-Core's aux loss takes its tokens per expert from the top-k alone).
// Returns the experts the sort reads: the top-k's, or routed (-1 where dropped).
static const int* moe_drop_over_capacity(MoERouting* r) {
    if (r->capacity_factor <= 0.0f) return r->topk;
    moe_apply_capacity(r->routed, r->topk, r->weight, r->N, r->k, moe_expert_capacity(r), r->drop_policy);
    return r->routed;
}

// The router and the dispatch: from the router's logits [N, E] the choices, their weights and the
// experts' order; the experts' row offsets copied to the host (host_offsets [E + 1]: the experts'
// products are launched from there, host_offsets[E] rows in all); the rows of x [N, C] gathered
// into xs [N k, C] in that order
static void moe_dispatch(MoERouting* r, floatX* xs, const floatX* x, const floatX* logits, int C, int* host_offsets) {
    moe_router_forward(r->probs, r->topk, r->weight, r->lse, logits, r->N, r->E, r->k, r->pre_softmax);
    moe_expert_counts(r->counts, r->topk, r->N, r->k, r->E);
    moe_sort_tokens(r->order, r->position, r->offsets, moe_drop_over_capacity(r), r->N, r->k, r->E);
    dev_to_host(host_offsets, r->offsets, (size_t)(r->E + 1) * sizeof(int));
    moe_gather_rows(xs, x, r->order, host_offsets[r->E], r->k, C);
}

// the same routing's offsets on the host and its rows gathered again (the backward's input of the
// experts' products)
static void moe_dispatch_again(const MoERouting* r, floatX* xs, const floatX* x, int C, int* host_offsets) {
    dev_to_host(host_offsets, r->offsets, (size_t)(r->E + 1) * sizeof(int));
    moe_gather_rows(xs, x, r->order, host_offsets[r->E], r->k, C);
}

// The load-balancing and z losses' weights for one micro-batch: each coefficient (0: off),
// `scale`, the micro-batch's share of the step's loss gradient (the LM loss's is dloss a token),
// and `tokens`, the micro-batch's tokens over the ranks that share its sequences (context
// parallelism: each rank's probabilities are a part of the sequence's, the tokens per expert the
// whole sequence's, summed over the group as Megatron-Core's sequence_partition_group does, so the
// ranks' partial losses add up to one process's)
typedef struct {
    float aux_coeff, z_coeff, scale;
    int tokens;
} MoELosses;

// The backward of the combine, the gather and the router: from dout [N, C] (the layer's output
// gradient) and the experts' outputs ys [N k, C], dys [N k, C] (to the experts), then after the
// experts (gpt.h) their input gradients dxs into dx [N, C] and the router logits' dlogits [N, E]
static void moe_combine_backward_rows(const MoERouting* r, floatX* dys, float* dweight, const floatX* dout,
                                      const floatX* ys, int C) {
    moe_combine_backward(dys, dweight, dout, ys, r->weight, r->position, r->N, r->k, C);
}

static void moe_dispatch_backward(const MoERouting* r, floatX* dx, floatX* dlogits, const floatX* dxs,
                                  const float* dweight, MoELosses losses, int C) {
    moe_gather_rows_backward(dx, dxs, r->position, r->N, r->k, C, 0);
    moe_router_backward(dlogits, dweight, r->probs, r->lse, r->topk, r->weight, r->counts, r->N, r->E, r->k,
                        r->pre_softmax, losses.aux_coeff * losses.scale, losses.z_coeff * losses.scale, losses.tokens);
}

// ----------------------------------------------------------------------------
// expert parallelism: which experts are here, and the rows between the ranks of an expert group

typedef struct {
    int rank, size;     // in the expert-parallel group (size 1: every expert is here)
    int local, first;   // the experts here: [first, first + local), E / EP of them
    Group* group;       // the expert-parallel group (NULL at size 1)
    int data_parallel;  // the ranks holding the same experts: DP x CP / EP (their gradients' sum, ZeRO's shards)
} ExpertSlice;

static ExpertSlice expert_slice(int rank, int size, int num_experts, Group* group, int data_parallel) {
    ExpertSlice x = {rank, size, num_experts / size, rank * (num_experts / size), size > 1 ? group : NULL, data_parallel};
    return x;
}

// The rows the experts here receive from the group's ranks, from this rank's routing (offsets
// [E + 1]: expert e's rows [offsets[e], offsets[e + 1]), the experts in rank order): received[q
// x local + e] rows of local expert e come from rank q; expert e's rows are [expert_offsets[e],
// expert_offsets[e + 1]) of the experts' buffer, rank 0's first. Returns their total.
static int expert_rows_plan(const ExpertSlice* x, const int* offsets, int* received, int* expert_offsets) {
    int P = x->size, n = x->local;
    int* sending = (int*)mallocCheck((size_t)P * n * sizeof(int));
    for (int j = 0; j < P * n; j++) sending[j] = offsets[j + 1] - offsets[j];
    all_to_all_host(x->group, sending, received, n);
    free(sending);
    expert_offsets[0] = 0;
    for (int e = 0; e < n; e++) {
        int rows = 0;
        for (int q = 0; q < P; q++) rows += received[q * n + e];
        expert_offsets[e + 1] = expert_offsets[e] + rows;
    }
    return expert_offsets[n];
}

// The rows between this rank's routing order (`mine` [N k, C], sorted by expert) and the experts'
// (`experts`, expert-major as expert_rows_plan lays them out): to_experts, each block of this
// rank's rows for rank p's experts to its place on p; else the experts' rows back to the ranks
// whose tokens they are. The blocks go in (rank, expert) order at both ends (parallel.h's
// exchange_blocks matches them in that order).
static void expert_rows_exchange(const ExpertSlice* x, floatX* experts, floatX* mine, const int* offsets,
                                 const int* received, const int* expert_offsets, int C, int to_experts) {
    int P = x->size, n = x->local;
    Block* ours = (Block*)mallocCheck((size_t)P * n * sizeof(Block));
    Block* theirs = (Block*)mallocCheck((size_t)P * n * sizeof(Block));
    for (int j = 0; j < P * n; j++) {
        Block b = {j / n, mine + (size_t)offsets[j] * C, (size_t)(offsets[j + 1] - offsets[j]) * C};
        ours[j] = b;
    }
    for (int e = 0; e < n; e++)
        for (int q = 0, at = expert_offsets[e]; q < P; at += received[q * n + e], q++) {
            Block b = {q, experts + (size_t)at * C, (size_t)received[q * n + e] * C};
            theirs[q * n + e] = b;
        }
    trace_begin(to_experts ? "expert dispatch" : "expert combine", "expert-parallel", ON_COMPUTE_STREAM);   // (--profile)
    if (to_experts) exchange_blocks(x->group, ours, P * n, theirs, P * n);
    else exchange_blocks(x->group, theirs, P * n, ours, P * n);
    trace_end();
    free(ours);
    free(theirs);
}
