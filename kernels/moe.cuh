/*
kernels/moe.cuh — the kernels of a mixture-of-experts (MoE) layer: the router and its top-k, the
tokens sorted by expert and gathered, the experts' outputs combined, the shared expert's gate,
the router's auxiliary losses, and the backward of each. Each op: its C reference, then its CUDA
twin. The layer itself (moe.h) calls them around the experts' matmuls (linear.cuh).

The layer (Shazeer et al. 2017; Switch Transformer, Fedus et al. 2021; Mixtral, Jiang et al.
2024; as Megatron-Core's MoE layer computes it): each of N tokens x[t] (C wide) goes to k of E
experts, and its output is the weighted sum of theirs.
  forward:
    logits [N, E] = x @ W_router^T                                       (matmul_forward)
    moe_router_forward: probs = softmax(logits) over the E experts and lse, its log-sum-exp; the
        k largest logits (topk_expert [N, k], descending, ties to the lower expert) and their
        weights (topk_weight [N, k], below)
    moe_expert_counts: counts[e], how many of the N k choices are e (the aux loss's)
    moe_apply_capacity (with an expert capacity, below): routed [N k], each choice's expert, or
        -1 where its expert has taken its capacity of choices ahead of it (dropped)
    moe_sort_tokens: a stable counting sort of the N k choices (choice t k + j: token t's slot
        j) by expert (topk_expert, or routed): expert e's rows are [offsets[e], offsets[e+1]),
        its choices in (t, j) order; order maps a row to its choice, position a choice to its row
        (-1: dropped; the rows end at offsets[E], N k less the dropped)
    moe_gather_rows: xs [N k, C], row r = x[order[r] / k]: each expert's tokens side by side
    the experts: rows [offsets[e], offsets[e+1]) of xs through expert e's MLP -> ys [N k, C]
    moe_combine: out[t] = sum over j of topk_weight[t, j] ys[position[t k + j]] (a dropped
        choice adds nothing)
    Qwen2-MoE's shared expert, on every token: out[t] += sigmoid(x[t] . w_gate) shared_mlp(x[t])
        (moe_shared_gate_forward, after the shared MLP and the gate's one-column matmul)
    moe_aux_loss: the load-balancing and z losses' values, added into two device doubles (the log)
  backward, the same in reverse:
    moe_shared_gate_backward: dshared_y, dgate_logit (to the shared MLP's and the gate's backward)
    moe_combine_backward: dys [N k, C], and dweight [N, k] for the router
    the experts' backward: dys -> dxs [N k, C]
    moe_gather_rows_backward: dx[t] (+)= sum over j of dxs[position[t k + j]]
    moe_router_backward: dlogits, from dweight, the aux loss and the z-loss; then the router's
        matmul_backward (into dx and dW_router)

The weights (Megatron-LM's --moe-router-pre-softmax; Hugging Face's norm_topk_prob):
  pre_softmax 0: the softmax over the k chosen logits, the same as softmax, top-k, renormalize
                 (Mixtral; Megatron-LM's default; Qwen2-MoE with norm_topk_prob true);
  pre_softmax 1: the full softmax's probabilities of the chosen, not renormalized (Megatron-LM's
                 --moe-router-pre-softmax; Qwen2-MoE with norm_topk_prob false, its default).
The losses over aux_tokens tokens (Megatron's num_tokens: N here, a parameter so that the caller
can give the global count), counts taken as constants (no gradient through the top-k):
  aux = aux_coeff E / (aux_tokens^2 k) sum_e (sum_t probs[t][e]) counts[e]: the Switch
        Transformer's load-balancing loss as Megatron-Core's switch_load_balancing_loss_func
        computes it, probs the full softmax's whatever pre_softmax; its gradient at probs[t][e]
        is aux_coeff E counts[e] / (aux_tokens^2 k), taken through the softmax to the logits.
        Hugging Face's load_balancing_loss_func (Mixtral, Qwen2-MoE) averages the one-hot choices
        of each slot over the tokens, sums over the k slots and the experts, and multiplies by E:
        for one layer, no coefficient, that is E / N^2 sum_e (sum_t probs[t][e]) counts[e], k
        times Megatron's. It concatenates the logits of all L layers into one list of L N rows
        first (one loss of the layers pooled, products across layers in it), where Megatron
        adds up each layer's.
  z   = z_coeff (1 / aux_tokens) sum_t lse[t]^2: the router z-loss (ST-MoE, Zoph et al. 2022;
        Megatron-Core's z_loss_func); its gradient at logits[t][e] is 2 z_coeff lse[t] /
        aux_tokens probs[t][e] (d lse / d logit = the probability).

Deterministic everywhere: no atomics, every sum in a fixed order, ties broken by the lower expert
index, the sort stable. On the GPU the row ops are a warp a token (or a sorted row), its lanes
over C in packs of X128, each sum over the k slots in slot order in fp32, rounded once; the
router is a warp a token, its lanes over the experts (E <= MOE_MAX_EXPERTS, k <= MOE_MAX_TOPK).

Layouts: logits, dlogits floatX [N, E]; probs float [N, E]; lse float [N]; topk_expert, routed
int, topk_weight and dweight float [N, k]; counts int [E]; offsets int [E + 1]; order, position int
[N k]; x, out, dout, dx, shared_y, dshared_y floatX [N, C]; xs, ys, dxs, dys floatX [N k, C],
rows sorted by expert; gate_logit, dgate_logit floatX [N].

Included by kernels.cuh, the index of kernels/: the conventions every kernel keeps are there.
*/
#pragma once

// ----------------------------------------------------------------------------
// the router: softmax, log-sum-exp, the top k and their weights

#define MOE_MAX_EXPERTS 256   // the GPU router: a token's logits in the lanes of one warp
#define MOE_MAX_TOPK 8
#define MOE_EXPERTS_PER_LANE (MOE_MAX_EXPERTS / 32)   // lane l holds experts l, l + 32, ...

// A logit as the top-k order sees it: NaN (a diverged run) as -inf, so that the order stays
// total and the k picks are always k distinct experts of [0, E).
HOST_DEVICE static inline float moe_rank_value(float l) { return l == l ? l : -INFINITY; }

// expert a (logit la) comes before expert b (logit lb) in the top-k order: the larger logit
// first, ties to the lower index
HOST_DEVICE static inline int moe_ranks_before(float la, int a, float lb, int b) {
    la = moe_rank_value(la), lb = moe_rank_value(lb);
    return la > lb || (la == lb && a < b);
}

static void moe_router_forward_cpu(float* probs, int* topk_expert, float* topk_weight, float* lse, const float* logits,
                                   int N, int E, int k, int pre_softmax) {
    if (k < 1 || k > E) fail("moe_router_forward: top %d of %d experts", k, E);
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        const float* l = logits + (size_t)t * E;
        float* p = probs + (size_t)t * E;
        int* chosen = topk_expert + (size_t)t * k;
        float m = -INFINITY, sum = 0.0f, sum_k = 0.0f;
        for (int e = 0; e < E; e++) m = fmaxf(m, l[e]);
        for (int e = 0; e < E; e++) sum += expf(l[e] - m);
        for (int e = 0; e < E; e++) p[e] = expf(l[e] - m) / sum;
        lse[t] = m + logf(sum);
        // pick j: the first expert in the order of those after pick j - 1 (before the first:
        // after (+inf, -1), which every expert is)
        float last_l = INFINITY;
        int last_e = -1;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (moe_ranks_before(last_l, last_e, l[e], e) && (best < 0 || moe_ranks_before(l[e], e, l[best], best)))
                    best = e;
            chosen[j] = best;
            last_l = l[best], last_e = best;
        }
        for (int j = 0; j < k; j++) sum_k += expf(l[chosen[j]] - l[chosen[0]]);
        for (int j = 0; j < k; j++)
            topk_weight[(size_t)t * k + j] = pre_softmax ? p[chosen[j]] : expf(l[chosen[j]] - l[chosen[0]]) / sum_k;
    }
}

#ifdef __CUDACC__
static void moe_router_check(const char* op, int E, int k) {
    if (E > MOE_MAX_EXPERTS) fail("%s: %d experts, above %d", op, E, MOE_MAX_EXPERTS);
    if (k > MOE_MAX_TOPK) fail("%s: top %d, above %d", op, k, MOE_MAX_TOPK);
    if (k < 1 || k > E) fail("%s: top %d of %d experts", op, k, E);
}

// One warp per token, lane l holding the logits of experts l, l + 32, ... (-inf past E): the
// maximum and the sum by warp reductions; then k picks, each lane's first expert after the last
// pick, then the warp's first of those (warp_reduce_argmax: every lane gets it). Lane j keeps
// pick j and writes it and its weight.
__global__ void moe_router_forward_kernel(float* probs, int* topk_expert, float* topk_weight, float* lse,
                                          const floatX* logits, int N, int E, int k, int pre_softmax) {
    int lane = threadIdx.x % 32, t = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (t >= N) return;   // the whole warp
    float l[MOE_EXPERTS_PER_LANE], m = -INFINITY, sum = 0.0f;
    for (int i = 0; i < MOE_EXPERTS_PER_LANE; i++) {
        int e = lane + 32 * i;
        l[i] = e < E ? floatX_to_float(logits[(size_t)t * E + e]) : -INFINITY;
        m = fmaxf(m, l[i]);
    }
    m = warp_reduce_max(m);
    for (int i = 0; i < MOE_EXPERTS_PER_LANE; i++)
        if (lane + 32 * i < E) sum += expf(l[i] - m);
    sum = warp_reduce_sum(sum);
    for (int i = 0; i < MOE_EXPERTS_PER_LANE; i++)
        if (lane + 32 * i < E) probs[(size_t)t * E + lane + 32 * i] = expf(l[i] - m) / sum;
    if (lane == 0) lse[t] = m + logf(sum);
    float last_l = INFINITY, first_l = 0.0f, sum_k = 0.0f, my_l = 0.0f;
    int last_e = -1, my_e = 0;
    for (int j = 0; j < k; j++) {
        float best_l = -INFINITY;
        int best_e = E;   // (-inf, E): after every expert
        for (int i = 0; i < MOE_EXPERTS_PER_LANE; i++) {
            int e = lane + 32 * i;
            if (e < E && moe_ranks_before(last_l, last_e, l[i], e) && moe_ranks_before(l[i], e, best_l, best_e))
                best_l = moe_rank_value(l[i]), best_e = e;
        }
        warp_reduce_argmax(&best_l, &best_e);
        if (j == 0) first_l = best_l;
        sum_k += expf(best_l - first_l);
        if (lane == j) my_l = best_l, my_e = best_e;
        last_l = best_l, last_e = best_e;
    }
    if (lane < k) {
        topk_expert[(size_t)t * k + lane] = my_e;
        topk_weight[(size_t)t * k + lane] = pre_softmax ? expf(my_l - m) / sum : expf(my_l - first_l) / sum_k;
    }
}

static void moe_router_forward(float* probs, int* topk_expert, float* topk_weight, float* lse, const floatX* logits,
                               int N, int E, int k, int pre_softmax) {
    moe_router_check("moe_router_forward", E, k);
    LAUNCH(moe_router_forward_kernel, CEIL_DIV(N, ROWS_PER_BLOCK), ROW_BLOCK, 0, probs, topk_expert, topk_weight, lse,
           logits, N, E, k, pre_softmax);
}
#else
#define moe_router_forward moe_router_forward_cpu
#endif

// ----------------------------------------------------------------------------
// expert capacity: the choices each expert takes, the others dropped
// (GShard, Lepikhin et al. 2020; Switch Transformer; Megatron-Core's --moe-expert-capacity-factor,
// its topk_softmax_with_capacity.) With a capacity (moe.h computes it: ceil(N k / E x factor)),
// expert e takes at most `capacity` of the choices routed to it, the first in the policy's order:
//   MOE_DROP_PROBS     the larger weight first (Megatron-Core's "probs": the top `capacity` of
//                      the expert's column of routing probabilities), equal weights the lower token;
//   MOE_DROP_POSITION  the lower token first (its "position": the first tokens of the micro-batch).
// A token goes to an expert at most once, so two choices of one expert never share a token and
// the order is total: the same choices kept on every device and in every launch. Choice c is kept
// when fewer than `capacity` of its expert's choices come before it:
//   routed[c] = topk_expert[c] if kept, else -1 (the sort leaves it out: position -1)
// O((N k)^2) compares at most (correctness over speed, as the sort below); each choice stops
// reading once `capacity` are ahead of it. The weights are not renormalized over what is kept
// (Megatron-Core's: a dropped choice's share of its token's output is lost).

enum { MOE_DROP_PROBS, MOE_DROP_POSITION };   // --moe-token-drop-policy, in its choices' order

// choice a (weight wa, token ta) comes before choice b of the same expert in the policy's order
HOST_DEVICE static inline int moe_choice_before(float wa, int ta, float wb, int tb, int policy) {
    if (policy == MOE_DROP_POSITION) return ta < tb;
    wa = moe_rank_value(wa), wb = moe_rank_value(wb);   // (NaN as -inf: the order stays total)
    return wa > wb || (wa == wb && ta < tb);
}

// choice c's expert, or -1 if `capacity` of that expert's choices come before it
HOST_DEVICE static inline int moe_routed_expert(size_t c, const int* topk_expert, const float* topk_weight, int N, int k,
                                                int capacity, int policy) {
    int e = topk_expert[c], t = (int)(c / k), ahead = 0;
    for (size_t o = 0; o < (size_t)N * k && ahead < capacity; o++)
        ahead += topk_expert[o] == e && moe_choice_before(topk_weight[o], (int)(o / k), topk_weight[c], t, policy);
    return ahead < capacity ? e : -1;
}

static void moe_apply_capacity_cpu(int* routed, const int* topk_expert, const float* topk_weight, int N, int k,
                                   int capacity, int policy) {
    #pragma omp parallel for
    for (long long c = 0; c < (long long)N * k; c++)
        routed[c] = moe_routed_expert((size_t)c, topk_expert, topk_weight, N, k, capacity, policy);
}

#ifdef __CUDACC__
// one thread per choice: the threads of a warp read the same other choice at once
__global__ void moe_apply_capacity_kernel(int* routed, const int* topk_expert, const float* topk_weight, int N, int k,
                                          int capacity, int policy) {
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= (size_t)N * k) return;
    routed[c] = moe_routed_expert(c, topk_expert, topk_weight, N, k, capacity, policy);
}

static void moe_apply_capacity(int* routed, const int* topk_expert, const float* topk_weight, int N, int k, int capacity,
                               int policy) {
    LAUNCH(moe_apply_capacity_kernel, CEIL_DIV(N * k, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0, routed, topk_expert,
           topk_weight, N, k, capacity, policy);
}
#else
#define moe_apply_capacity moe_apply_capacity_cpu
#endif

// ----------------------------------------------------------------------------
// the choices counted, and sorted by expert
// The GPU's way is the simplest deterministic one: a thread per expert reads all N k choices in
// order (the threads of a warp read the same choice at once), counts its own, then (after the
// counts' prefix sum, one thread) writes its rows: O(E N k) reads by only E threads,
// correctness over speed. A faster one, as deterministic: the choices in tiles, a
// block a tile counting each expert's choices in it (in shared memory), an exclusive scan over
// the (expert, tile) counts in expert-major order giving each tile's first row in each expert,
// then each block writing its tile's choices in order from there (stable, O(N k) work spread
// over the GPU; what a GPU radix sort's passes do).

// (an expert of -1, a dropped choice, is nobody's: not counted, not sorted, position -1)
static void moe_expert_counts_cpu(int* counts, const int* topk_expert, int N, int k, int E) {
    for (int e = 0; e < E; e++) counts[e] = 0;
    for (size_t c = 0; c < (size_t)N * k; c++)
        if (topk_expert[c] >= 0) counts[topk_expert[c]]++;
}

static void moe_sort_tokens_cpu(int* order, int* position, int* offsets, const int* topk_expert, int N, int k, int E) {
    moe_expert_counts_cpu(offsets + 1, topk_expert, N, k, E);
    offsets[0] = 0;
    for (int e = 0; e < E; e++) offsets[e + 1] += offsets[e];   // offsets[e]: expert e's first row
    // the choices in (t, j) order, each to its expert's next row: offsets[e] serves as the
    // cursor, and ends at e's last row + 1, e + 1's first; shifted back by one expert after
    for (size_t c = 0; c < (size_t)N * k; c++) {
        int row = topk_expert[c] < 0 ? -1 : offsets[topk_expert[c]]++;
        if (row >= 0) order[row] = (int)c;
        position[c] = row;
    }
    for (int e = E - 1; e > 0; e--) offsets[e] = offsets[e - 1];
    offsets[0] = 0;
}

#ifdef __CUDACC__
// one thread per expert
__global__ void moe_expert_counts_kernel(int* counts, const int* topk_expert, int N, int k, int E) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= E) return;
    int count = 0;
    for (size_t c = 0; c < (size_t)N * k; c++) count += topk_expert[c] == e;
    counts[e] = count;
}

// one thread: offsets[1 .. E] hold the counts; their running sum, from offsets[0] = 0
__global__ void moe_offsets_kernel(int* offsets, int E) {
    offsets[0] = 0;
    for (int e = 0; e < E; e++) offsets[e + 1] += offsets[e];
}

// one thread per expert: its choices in (t, j) order to its rows, from its first
__global__ void moe_sort_tokens_kernel(int* order, int* position, const int* offsets, const int* topk_expert, int N,
                                       int k, int E) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= E) return;
    int row = offsets[e];
    for (size_t c = 0; c < (size_t)N * k; c++)
        if (topk_expert[c] == e) {
            order[row] = (int)c;
            position[c] = row++;
        }
}

static void moe_expert_counts(int* counts, const int* topk_expert, int N, int k, int E) {
    LAUNCH(moe_expert_counts_kernel, CEIL_DIV(E, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0, counts, topk_expert, N, k, E);
}

// one thread per choice: a dropped one's position -1 (no expert's thread writes it)
__global__ void moe_dropped_positions_kernel(int* position, const int* topk_expert, int N, int k) {
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c < (size_t)N * k && topk_expert[c] < 0) position[c] = -1;
}

static void moe_sort_tokens(int* order, int* position, int* offsets, const int* topk_expert, int N, int k, int E) {
    moe_expert_counts(offsets + 1, topk_expert, N, k, E);
    LAUNCH(moe_offsets_kernel, 1, 1, 0, offsets, E);
    LAUNCH(moe_dropped_positions_kernel, CEIL_DIV(N * k, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0, position, topk_expert,
           N, k);
    LAUNCH(moe_sort_tokens_kernel, CEIL_DIV(E, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0, order, position, offsets,
           topk_expert, N, k, E);
}
#else
#define moe_expert_counts moe_expert_counts_cpu
#define moe_sort_tokens moe_sort_tokens_cpu
#endif

// ----------------------------------------------------------------------------
// the rows gathered for the experts, and their outputs combined
// gather:   xs[r] = x[order[r] / k], r < rows (= offsets[E]: N k less the dropped choices)
// combine:  out[t] = sum_j topk_weight[t k + j] ys[position[t k + j]], j = 0 .. k-1 in order
//           (fp32, rounded once; overwrites)
// backward: dys[position[t k + j]] = topk_weight[t k + j] dout[t];
//           dweight[t k + j] = dout[t] . ys[position[t k + j]] (fp32);
//           dx[t] (= or, with accumulate, +=) sum_j dxs[position[t k + j]] (fp32, rounded once;
//           added to dx's value last)
// A dropped choice (position -1) has no row: it adds nothing to out[t] nor to dx[t], and its
// dweight is 0 (its weight reaches no output: Megatron-Core's probs x the kept mask).

static void moe_gather_rows_cpu(float* xs, const float* x, const int* order, int rows, int k, int C) {
    #pragma omp parallel for
    for (int r = 0; r < rows; r++) memcpy(xs + (size_t)r * C, x + (size_t)(order[r] / k) * C, (size_t)C * sizeof(float));
}

static void moe_combine_cpu(float* out, const float* ys, const float* topk_weight, const int* position, int N, int k,
                            int C) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        float* o = out + (size_t)t * C;
        for (int c = 0; c < C; c++) o[c] = 0.0f;
        for (int j = 0; j < k; j++)
            if (position[(size_t)t * k + j] >= 0)
                axpy_lanes(o, topk_weight[(size_t)t * k + j], ys + (size_t)position[(size_t)t * k + j] * C, C);
    }
}

static void moe_combine_backward_cpu(float* dys, float* dweight, const float* dout, const float* ys,
                                     const float* topk_weight, const int* position, int N, int k, int C) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            size_t choice = (size_t)t * k + j, row = (size_t)position[choice] * C;
            dweight[choice] = 0.0f;
            if (position[choice] < 0) continue;   // dropped
            for (int c = 0; c < C; c++) dys[row + c] = topk_weight[choice] * dout[(size_t)t * C + c];
            dweight[choice] = dot_lanes(dout + (size_t)t * C, ys + row, C);
        }
}

static void moe_gather_rows_backward_cpu(float* dx, const float* dxs, const int* position, int N, int k, int C,
                                         int accumulate) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++)
        for (int c = 0; c < C; c++) {
            float s = 0.0f;
            for (int j = 0; j < k; j++)
                if (position[(size_t)t * k + j] >= 0) s += dxs[(size_t)position[(size_t)t * k + j] * C + c];
            dx[(size_t)t * C + c] = accumulate ? dx[(size_t)t * C + c] + s : s;
        }
}

#ifdef __CUDACC__
// one warp per sorted row, its lanes over the row's packs
__global__ void moe_gather_rows_kernel(floatX* xs, const floatX* x, const int* order, int rows, int k, int C) {
    int lane = threadIdx.x % 32, r = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (r >= rows) return;
    const floatX* src = x + (size_t)(order[r] / k) * C;
    for (int c = lane * X128; c < C; c += 32 * X128)
        store_pack(xs + (size_t)r * C + c, load_pack(src + c, min_int(X128, C - c)), min_int(X128, C - c));
}

// one warp per token, its lanes over the packs of the row, the slots in order in each
__global__ void moe_combine_kernel(floatX* out, const floatX* ys, const float* topk_weight, const int* position, int N,
                                   int k, int C) {
    int lane = threadIdx.x % 32, t = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (t >= N) return;
    for (int c = lane * X128; c < C; c += 32 * X128) {
        int count = min_int(X128, C - c);
        float acc[X128] = {0.0f};
        for (int j = 0; j < k; j++) {
            if (position[(size_t)t * k + j] < 0) continue;   // dropped
            float w = topk_weight[(size_t)t * k + j];
            x128 y = load_pack(ys + (size_t)position[(size_t)t * k + j] * C + c, count);
            for (int e = 0; e < X128; e++) acc[e] += w * floatX_to_float(y.e[e]);
        }
        x128 o;
        for (int e = 0; e < X128; e++) o.e[e] = to_floatX(acc[e]);
        store_pack(out + (size_t)t * C + c, o, count);
    }
}

// one warp per token: for each slot, its row of dys and (a warp sum) its dweight
__global__ void moe_combine_backward_kernel(floatX* dys, float* dweight, const floatX* dout, const floatX* ys,
                                            const float* topk_weight, const int* position, int N, int k, int C) {
    int lane = threadIdx.x % 32, t = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (t >= N) return;
    for (int j = 0; j < k; j++) {
        size_t choice = (size_t)t * k + j, row = (size_t)position[choice] * C;
        float w = topk_weight[choice], dot = 0.0f;
        if (position[choice] < 0) {   // dropped: no row, no gradient at its weight
            if (lane == 0) dweight[choice] = 0.0f;
            continue;
        }
        for (int c = lane * X128; c < C; c += 32 * X128) {
            int count = min_int(X128, C - c);
            x128 d = load_pack(dout + (size_t)t * C + c, count), y = load_pack(ys + row + c, count), dy;
            for (int e = 0; e < X128; e++) {
                dot += floatX_to_float(d.e[e]) * floatX_to_float(y.e[e]);
                dy.e[e] = to_floatX(w * floatX_to_float(d.e[e]));
            }
            store_pack(dys + row + c, dy, count);
        }
        dot = warp_reduce_sum(dot);
        if (lane == 0) dweight[choice] = dot;
    }
}

// one warp per token, its lanes over the packs of the row, the slots in order in each
__global__ void moe_gather_rows_backward_kernel(floatX* dx, const floatX* dxs, const int* position, int N, int k, int C,
                                                int accumulate) {
    int lane = threadIdx.x % 32, t = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (t >= N) return;
    for (int c = lane * X128; c < C; c += 32 * X128) {
        int count = min_int(X128, C - c);
        float acc[X128] = {0.0f};
        for (int j = 0; j < k; j++) {
            if (position[(size_t)t * k + j] < 0) continue;   // dropped
            x128 d = load_pack(dxs + (size_t)position[(size_t)t * k + j] * C + c, count);
            for (int e = 0; e < X128; e++) acc[e] += floatX_to_float(d.e[e]);
        }
        x128 old = accumulate ? load_pack(dx + (size_t)t * C + c, count) : zero_pack(), o;
        for (int e = 0; e < X128; e++) o.e[e] = to_floatX(accumulate ? floatX_to_float(old.e[e]) + acc[e] : acc[e]);
        store_pack(dx + (size_t)t * C + c, o, count);
    }
}

static void moe_gather_rows(floatX* xs, const floatX* x, const int* order, int rows, int k, int C) {
    LAUNCH(moe_gather_rows_kernel, CEIL_DIV(rows, ROWS_PER_BLOCK), ROW_BLOCK, 0, xs, x, order, rows, k, C);
}

static void moe_combine(floatX* out, const floatX* ys, const float* topk_weight, const int* position, int N, int k,
                        int C) {
    LAUNCH(moe_combine_kernel, CEIL_DIV(N, ROWS_PER_BLOCK), ROW_BLOCK, 0, out, ys, topk_weight, position, N, k, C);
}

static void moe_combine_backward(floatX* dys, float* dweight, const floatX* dout, const floatX* ys,
                                 const float* topk_weight, const int* position, int N, int k, int C) {
    LAUNCH(moe_combine_backward_kernel, CEIL_DIV(N, ROWS_PER_BLOCK), ROW_BLOCK, 0, dys, dweight, dout, ys, topk_weight,
           position, N, k, C);
}

static void moe_gather_rows_backward(floatX* dx, const floatX* dxs, const int* position, int N, int k, int C,
                                     int accumulate) {
    LAUNCH(moe_gather_rows_backward_kernel, CEIL_DIV(N, ROWS_PER_BLOCK), ROW_BLOCK, 0, dx, dxs, position, N, k, C,
           accumulate);
}
#else
#define moe_gather_rows moe_gather_rows_cpu
#define moe_combine moe_combine_cpu
#define moe_combine_backward moe_combine_backward_cpu
#define moe_gather_rows_backward moe_gather_rows_backward_cpu
#endif

// ----------------------------------------------------------------------------
// the router's backward, and the auxiliary losses' values
// Per token, with p = probs[t], g_e = d loss / d p_e from the aux loss (aux_factor counts[e],
// aux_factor = aux_coeff E / (aux_tokens^2 k)) and, with pre_softmax 1, from the weight of a
// chosen expert (dweight of its slot): through the softmax, p_e (g_e - sum_e' p_e' g_e').
// With pre_softmax 0 the weights are a softmax of the k chosen logits: w_j (dw_j - sum_i w_i
// dw_i) at the chosen expert of slot j, nothing at the others. The z-loss adds 2 z_coeff lse[t]
// / aux_tokens p_e.
//   dlogits[t][e] = p_e (g_e - sum_e' p_e' g_e') + (2 z_coeff lse[t] / aux_tokens) p_e
//                   + [pre_softmax 0, e chosen in slot j] w_j (dw_j - sum_i w_i dw_i)

// the aux loss's factor aux_coeff E / (aux_tokens^2 k), in double (aux_tokens^2 passes 2^31 at 46341)
static double moe_aux_factor(float aux_coeff, int E, int k, int aux_tokens) {
    return (double)aux_coeff * E / ((double)aux_tokens * aux_tokens * k);
}

// the slot of expert e among a token's k chosen, or -1
HOST_DEVICE static inline int moe_slot_of(int e, const int* chosen, int k) {
    for (int j = 0; j < k; j++)
        if (chosen[j] == e) return j;
    return -1;
}

// g_e: the gradient at the full softmax's probability of expert e (its slot j, or -1)
HOST_DEVICE static inline float moe_probs_gradient(int j, int count, const float* dw, int pre_softmax, float aux_factor) {
    return aux_factor * (float)count + (pre_softmax && j >= 0 ? dw[j] : 0.0f);
}

// d loss / d logit of expert e (probability p, its slot j or -1), from pg = sum_e' p_e' g_e' and
// wdw = sum_i w_i dw_i
HOST_DEVICE static inline float moe_logit_gradient(float p, float g, float pg, float z, int j, const float* w,
                                                   const float* dw, float wdw, int pre_softmax) {
    return p * (g - pg) + z * p + (!pre_softmax && j >= 0 ? w[j] * (dw[j] - wdw) : 0.0f);
}

static void moe_router_backward_cpu(float* dlogits, const float* dweight, const float* probs, const float* lse,
                                    const int* topk_expert, const float* topk_weight, const int* counts, int N, int E,
                                    int k, int pre_softmax, float aux_coeff, float z_coeff, int aux_tokens) {
    float aux_factor = (float)moe_aux_factor(aux_coeff, E, k, aux_tokens), z_factor = 2.0f * z_coeff / aux_tokens;
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        const float *p = probs + (size_t)t * E, *w = topk_weight + (size_t)t * k, *dw = dweight + (size_t)t * k;
        const int* chosen = topk_expert + (size_t)t * k;
        float pg = 0.0f, wdw = 0.0f, z = z_factor * lse[t];
        for (int j = 0; j < k; j++) wdw += w[j] * dw[j];
        for (int e = 0; e < E; e++)
            pg += p[e] * moe_probs_gradient(moe_slot_of(e, chosen, k), counts[e], dw, pre_softmax, aux_factor);
        for (int e = 0; e < E; e++) {
            int j = moe_slot_of(e, chosen, k);
            float g = moe_probs_gradient(j, counts[e], dw, pre_softmax, aux_factor);
            dlogits[(size_t)t * E + e] = moe_logit_gradient(p[e], g, pg, z, j, w, dw, wdw, pre_softmax);
        }
    }
}

// *aux += aux_coeff E / (aux_tokens^2 k) sum_t sum_e probs[t][e] counts[e] (the same sum as
// the formula's, by columns first), *z += z_coeff / aux_tokens sum_t lse[t]^2; in double
static void moe_aux_loss_cpu(double* aux, double* z, const float* probs, const float* lse, const int* counts, int N,
                             int E, int k, float aux_coeff, float z_coeff, int aux_tokens) {
    double pc = 0.0, l2 = 0.0;
    for (size_t i = 0; i < (size_t)N * E; i++) pc += (double)probs[i] * counts[i % E];
    for (int t = 0; t < N; t++) l2 += (double)lse[t] * lse[t];
    *aux += moe_aux_factor(aux_coeff, E, k, aux_tokens) * pc;
    *z += (double)z_coeff / aux_tokens * l2;
}

#ifdef __CUDACC__
// One warp per token, lane l over experts l, l + 32, ...: sum p g by a warp reduction, then
// each lane its experts' gradients. Every lane reads the token's k slots.
__global__ void moe_router_backward_kernel(floatX* dlogits, const float* dweight, const float* probs, const float* lse,
                                           const int* topk_expert, const float* topk_weight, const int* counts, int N,
                                           int E, int k, int pre_softmax, float aux_factor, float z_factor) {
    int lane = threadIdx.x % 32, t = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (t >= N) return;   // the whole warp
    const float *w = topk_weight + (size_t)t * k, *dw = dweight + (size_t)t * k;
    const int* chosen = topk_expert + (size_t)t * k;
    float p[MOE_EXPERTS_PER_LANE], pg = 0.0f, wdw = 0.0f, z = z_factor * lse[t];
    for (int j = 0; j < k; j++) wdw += w[j] * dw[j];
    for (int i = 0; i < MOE_EXPERTS_PER_LANE; i++) {
        int e = lane + 32 * i;
        p[i] = e < E ? probs[(size_t)t * E + e] : 0.0f;
        if (e < E) pg += p[i] * moe_probs_gradient(moe_slot_of(e, chosen, k), counts[e], dw, pre_softmax, aux_factor);
    }
    pg = warp_reduce_sum(pg);
    for (int i = 0; i < MOE_EXPERTS_PER_LANE; i++) {
        int e = lane + 32 * i;
        if (e >= E) continue;
        int j = moe_slot_of(e, chosen, k);
        float g = moe_probs_gradient(j, counts[e], dw, pre_softmax, aux_factor);
        dlogits[(size_t)t * E + e] = to_floatX(moe_logit_gradient(p[i], g, pg, z, j, w, dw, wdw, pre_softmax));
    }
}

// one block: strided sums over (t, e) and over t, each reduced in a fixed order
#define MOE_LOSS_BLOCK 256
__global__ void moe_aux_loss_kernel(double* aux, double* z, const float* probs, const float* lse, const int* counts,
                                    int N, int E, double aux_factor, double z_factor) {
    double pc = 0.0, l2 = 0.0;
    for (size_t i = threadIdx.x; i < (size_t)N * E; i += blockDim.x) pc += (double)probs[i] * counts[i % E];
    for (int t = threadIdx.x; t < N; t += blockDim.x) l2 += (double)lse[t] * lse[t];
    pc = block_reduce_sum_double(pc);
    l2 = block_reduce_sum_double(l2);
    if (threadIdx.x == 0) {
        *aux += aux_factor * pc;
        *z += z_factor * l2;
    }
}

static void moe_router_backward(floatX* dlogits, const float* dweight, const float* probs, const float* lse,
                                const int* topk_expert, const float* topk_weight, const int* counts, int N, int E, int k,
                                int pre_softmax, float aux_coeff, float z_coeff, int aux_tokens) {
    moe_router_check("moe_router_backward", E, k);
    float aux_factor = (float)moe_aux_factor(aux_coeff, E, k, aux_tokens), z_factor = 2.0f * z_coeff / aux_tokens;
    LAUNCH(moe_router_backward_kernel, CEIL_DIV(N, ROWS_PER_BLOCK), ROW_BLOCK, 0, dlogits, dweight, probs, lse,
           topk_expert, topk_weight, counts, N, E, k, pre_softmax, aux_factor, z_factor);
}

static void moe_aux_loss(double* aux, double* z, const float* probs, const float* lse, const int* counts, int N, int E,
                         int k, float aux_coeff, float z_coeff, int aux_tokens) {
    LAUNCH(moe_aux_loss_kernel, 1, MOE_LOSS_BLOCK, 0, aux, z, probs, lse, counts, N, E,
           moe_aux_factor(aux_coeff, E, k, aux_tokens), (double)z_coeff / aux_tokens);
}
#else
#define moe_router_backward moe_router_backward_cpu
#define moe_aux_loss moe_aux_loss_cpu
#endif

// ----------------------------------------------------------------------------
// the shared expert's gate (Qwen2-MoE: out += sigmoid(x . w_gate) shared_mlp(x), on every token)
// forward:  out[t] += s_t shared_y[t], s_t = sigmoid(gate_logit[t]) (out holds the combine's)
// backward: dshared_y[t] = s_t dout[t]; dgate_logit[t] = s_t (1 - s_t) (dout[t] . shared_y[t])
// (fp32 dot); both overwritten

HOST_DEVICE static inline float moe_sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

static void moe_shared_gate_forward_cpu(float* out, const float* shared_y, const float* gate_logit, int N, int C) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) axpy_lanes(out + (size_t)t * C, moe_sigmoid(gate_logit[t]), shared_y + (size_t)t * C, C);
}

static void moe_shared_gate_backward_cpu(float* dshared_y, float* dgate_logit, const float* dout, const float* shared_y,
                                         const float* gate_logit, int N, int C) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        float s = moe_sigmoid(gate_logit[t]);
        for (int c = 0; c < C; c++) dshared_y[(size_t)t * C + c] = s * dout[(size_t)t * C + c];
        dgate_logit[t] = s * (1.0f - s) * dot_lanes(dout + (size_t)t * C, shared_y + (size_t)t * C, C);
    }
}

#ifdef __CUDACC__
// one warp per token, its lanes over the row's packs
__global__ void moe_shared_gate_forward_kernel(floatX* out, const floatX* shared_y, const floatX* gate_logit, int N,
                                               int C) {
    int lane = threadIdx.x % 32, t = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (t >= N) return;
    float s = moe_sigmoid(floatX_to_float(gate_logit[t]));
    for (int c = lane * X128; c < C; c += 32 * X128) {
        int count = min_int(X128, C - c);
        x128 o = load_pack(out + (size_t)t * C + c, count), y = load_pack(shared_y + (size_t)t * C + c, count);
        for (int e = 0; e < X128; e++) o.e[e] = to_floatX(floatX_to_float(o.e[e]) + s * floatX_to_float(y.e[e]));
        store_pack(out + (size_t)t * C + c, o, count);
    }
}

__global__ void moe_shared_gate_backward_kernel(floatX* dshared_y, floatX* dgate_logit, const floatX* dout,
                                                const floatX* shared_y, const floatX* gate_logit, int N, int C) {
    int lane = threadIdx.x % 32, t = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (t >= N) return;
    float s = moe_sigmoid(floatX_to_float(gate_logit[t])), dot = 0.0f;
    for (int c = lane * X128; c < C; c += 32 * X128) {
        int count = min_int(X128, C - c);
        x128 d = load_pack(dout + (size_t)t * C + c, count), y = load_pack(shared_y + (size_t)t * C + c, count), dy;
        for (int e = 0; e < X128; e++) {
            dot += floatX_to_float(d.e[e]) * floatX_to_float(y.e[e]);
            dy.e[e] = to_floatX(s * floatX_to_float(d.e[e]));
        }
        store_pack(dshared_y + (size_t)t * C + c, dy, count);
    }
    dot = warp_reduce_sum(dot);
    if (lane == 0) dgate_logit[t] = to_floatX(s * (1.0f - s) * dot);
}

static void moe_shared_gate_forward(floatX* out, const floatX* shared_y, const floatX* gate_logit, int N, int C) {
    LAUNCH(moe_shared_gate_forward_kernel, CEIL_DIV(N, ROWS_PER_BLOCK), ROW_BLOCK, 0, out, shared_y, gate_logit, N, C);
}

static void moe_shared_gate_backward(floatX* dshared_y, floatX* dgate_logit, const floatX* dout, const floatX* shared_y,
                                     const floatX* gate_logit, int N, int C) {
    LAUNCH(moe_shared_gate_backward_kernel, CEIL_DIV(N, ROWS_PER_BLOCK), ROW_BLOCK, 0, dshared_y, dgate_logit, dout,
           shared_y, gate_logit, N, C);
}
#else
#define moe_shared_gate_forward moe_shared_gate_forward_cpu
#define moe_shared_gate_backward moe_shared_gate_backward_cpu
#endif
