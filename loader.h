/*
loader.h — the samples a step reads, and evaluation over them.

  - a split as one stream of tokens (data.c's files, walked in order), which
    --full-validation's windows read;
  - the Loader: Megatron's pretraining sampler's order (a global batch is micro_batch x DP
    consecutive samples of a split's index, this rank taking its slice), into pinned staging
    buffers the GPU copies from while the host fills the other;
  - evaluation: --eval-iters global batches of a split, continuing where the last one ended
    (Megatron-LM's), or --full-validation's every token of the split once, in order, in windows
    of --seq-length, the last one shorter; Megatron-LM's evaluation block.

Interface (what train.c uses): Loader, make_loader, free_loader, load_micro_batch, StopCheck,
evaluate, evaluate_full, print_eval. It sits on data.c, pipeline.h and step.h; it knows no flags (train.c hands them).
*/
#pragma once

// ----------------------------------------------------------------------------
// a split as one stream of tokens (--full-validation): its documents in the order of the files,
// every member prefix's in turn, no shuffle and no epochs, each document with its own
// end-of-document token where preprocess wrote one

// where a forward walk of the stream is: item `item` of member `member` starts at `start`
// (member -1: not started)
typedef struct {
    int member;
    int64_t item, start;
} StreamCursor;

static inline int64_t data_splits_stream_length(const DataSplits* d, int split) {
    int64_t n = 0;
    for (int j = 0; j < d->num_members[split]; j++) {
        const DataPrefix* p = &d->prefix[d->members[split][j]];
        for (int64_t i = p->bounds[split]; i < p->bounds[split + 1]; i++) n += p->ds.sizes[i];
    }
    return n;
}

// tokens [begin, begin + n) of split's stream into out; returns how many there were (fewer at
// its end). The cursor moves forward only (back to the start when begin is behind it): reading
// in order costs one pass over the items.
static inline int data_splits_stream_read(const DataSplits* d, int split, StreamCursor* c, int64_t begin, int n, int* out) {
    if (c->member < 0 || begin < c->start) {
        c->member = 0, c->start = 0;
        c->item = d->num_members[split] ? d->prefix[d->members[split][0]].bounds[split] : 0;
    }
    int got = 0;
    while (got < n && c->member < d->num_members[split]) {
        const DataPrefix* p = &d->prefix[d->members[split][c->member]];
        if (c->item >= p->bounds[split + 1]) {   // the next member's first item
            if (++c->member < d->num_members[split]) c->item = d->prefix[d->members[split][c->member]].bounds[split];
            continue;
        }
        int64_t size = p->ds.sizes[c->item], at = begin + got - c->start;
        if (at >= size) { c->start += size, c->item++; continue; }
        while (got < n && at < size) out[got++] = (int)indexed_dataset_token(&p->ds, c->item, at++);
    }
    return got;
}

// ----------------------------------------------------------------------------
// the Loader: a split's samples (data.c's GPT sample index, or the stream's windows) in the
// pretraining sampler's order: a global batch is micro_batch x DP consecutive samples
// per micro-batch step, this rank taking its micro_batch slice, all from consumed samples.

typedef struct {
    const DataSplits* data;
    int split;                    // 0 train, 1 valid, 2 test
    long long consumed;           // samples consumed before this step
    int micro_batch_size, dp_size, dp_rank, seq_length;
    ContextSlice cp;              // context parallelism: this rank's chunks of each sample (rows: 2 chunks' tokens)
    int rows;                     // tokens of a sample this rank takes: seq_length / CP
    int* host_sample;             // [seq_length + 1]
    // Two pinned staging buffers, each [tokens | targets] of one micro-batch, used in turn: the
    // host fills one while the GPU may still be copying from the other (host_to_dev_async)
    int* staging[2];
    HostCopy copied[2];           // recorded after each buffer's copies
    int next;                     // the buffer the next micro-batch fills
    // --full-validation: sample i is window i of the split's token stream (data.c), tokens
    // [i T, i T + T] (the last one shorter, padded), the losses of its real targets summed here
    int full;
    int64_t stream_tokens;
    StreamCursor cursor;
    float* host_losses;           // [micro_batch_size x seq_length]
    double loss_sum;
    long long targets;
} Loader;

// the targets window i holds: T, fewer in the last, 0 past it
static int window_targets(const Loader* l, long long i) {
    long long left = l->stream_tokens - 1 - i * l->seq_length;
    return left <= 0 ? 0 : left < l->seq_length ? (int)left : l->seq_length;
}

// sample i's seq_length + 1 tokens into l->host_sample: the index's, or window i (zeros after its end)
static void load_sample(Loader* l, long long i) {
    int T = l->seq_length, got = 0;
    if (!l->full) data_splits_get(l->data, l->split, i, l->host_sample);
    else got = data_splits_stream_read(l->data, l->split, &l->cursor, i * T, T + 1, l->host_sample);
    if (l->full) memset(l->host_sample + got, 0, (T + 1 - got) * sizeof(int));
}

// this rank's first sample of a micro-batch
static long long first_sample(const Loader* l, int micro_batch) {
    return micro_batch_first_sample(l->consumed, micro_batch, l->micro_batch_size, l->dp_rank, l->dp_size);
}

static void load_micro_batch(void* ctx, int micro_batch, int* tokens, int* targets) {
    Loader* l = (Loader*)ctx;
    int T = l->rows;
    long long first = first_sample(l, micro_batch);
    size_t n = (size_t)l->micro_batch_size * T;
    int k = l->next;
    l->next = 1 - k;
    trace_begin("load micro-batch", "data", ON_HOST);
    host_copy_wait(&l->copied[k]);   // the GPU has read this buffer (two micro-batches ago)
    int *host_tokens = l->staging[k], *host_targets = l->staging[k] + n;
    for (int b = 0; b < l->micro_batch_size; b++) {
        load_sample(l, first + b);   // (context parallelism: this rank's two chunks of it)
        slice_sequence(host_tokens + (size_t)b * T, l->host_sample, &l->cp);
        slice_sequence(host_targets + (size_t)b * T, l->host_sample + 1, &l->cp);
    }
    host_to_dev_async(tokens, host_tokens, n * sizeof(int));
    host_to_dev_async(targets, host_targets, n * sizeof(int));
    host_copy_record(&l->copied[k]);
    trace_end();
}

// the loader of split 0 train, 1 valid, 2 test; full: --full-validation's windows (valid, test)
static Loader make_loader(const DataSplits* d, int split, int micro_batch_size, int seq_length, int full) {
    Loader l;
    memset(&l, 0, sizeof(l));
    l.data = d;
    l.split = split;
    l.micro_batch_size = micro_batch_size;
    l.dp_size = grid.dp_size;
    l.dp_rank = grid.dp_rank;
    l.seq_length = seq_length;
    l.cp = context_slice(grid.cp_rank, grid.cp_size, seq_length);
    l.rows = l.cp.rows;
    l.full = split > 0 && full && data_splits_has(d, split);
    l.stream_tokens = l.full ? data_splits_stream_length(d, split) : 0;
    l.cursor.member = -1;
    l.host_sample = (int*)mallocCheck((seq_length + 1) * sizeof(int));
    l.host_losses = (float*)mallocCheck((size_t)micro_batch_size * seq_length * sizeof(float));
    for (int k = 0; k < 2; k++) {
        l.staging[k] = (int*)host_alloc_pinned(2 * (size_t)micro_batch_size * seq_length * sizeof(int));
        host_copy_create(&l.copied[k]);
    }
    return l;
}

static void free_loader(Loader* l) {
    free(l->host_sample);
    free(l->host_losses);
    for (int k = 0; k < 2; k++) {
        host_free_pinned(l->staging[k]);
        host_copy_destroy(&l->copied[k]);
    }
}

// ----------------------------------------------------------------------------
// evaluation: eval_iters global batches of a split, continuing where the last one ended; NAN
// when a stop signal arrives during it, after the one it saw (stopped.seen: a rank's own, as a
// signal may reach only some ranks; every rank asks the world between batches)

typedef struct {   // evaluate stops when *flag is no longer seen
    const volatile sig_atomic_t* flag;   // NULL: never stop
    int seen;
} StopCheck;

static int stop_arrived(StopCheck stopped) { return stopped.flag && max_over_world(*stopped.flag != stopped.seen); }

static float evaluate(GPT* m, Loader* l, int eval_iters, int global_batch, StopCheck stopped) {
    int num_micro = global_batch / (l->micro_batch_size * l->dp_size);
    double sum = 0.0;
    for (int it = 0; it < eval_iters; it++) {
        if (stop_arrived(stopped)) return NAN;
        Schedule s = schedule_for(m, load_micro_batch, l, 0.0f);
        run_forward_only(&s, num_micro);
        sum += step_loss(&s, num_micro);
        l->consumed += global_batch;
    }
    return (float)(sum / (eval_iters > 0 ? eval_iters : 1));
}

// --full-validation: a micro-batch's losses of real targets (rows past a window's end are padding:
// causal attention keeps them out of the rows before)
static void add_window_losses(void* ctx, int micro_batch, const float* losses) {
    Loader* l = (Loader*)ctx;
    int T = l->rows, n = l->micro_batch_size * T;
    float* host = l->host_losses;
    long long first = first_sample(l, micro_batch);
    dev_to_host(host, losses, (size_t)n * sizeof(float));
    for (int b = 0; b < l->micro_batch_size; b++)
        for (int t = 0; t < T; t++)   // (context parallelism: this rank's rows, at their positions in the window)
            if (slice_position(&l->cp, t) < window_targets(l, first + b)) l->loss_sum += host[b * T + t], l->targets++;
}

// every target of the split once: its windows, global_batch of them a step split over DP as
// the samples of training are; the mean loss over the targets (whose count it prints)
static float evaluate_full(GPT* m, Loader* l, int global_batch, StopCheck stopped) {
    int num_micro = global_batch / (l->micro_batch_size * l->dp_size);
    long long windows = (l->stream_tokens - 1 + l->seq_length - 1) / l->seq_length;
    long long kept = l->consumed;   // (the sampler's count, which checkpoints record, is not this walk's)
    l->loss_sum = 0.0, l->targets = 0, l->consumed = 0;
    for (; l->consumed < windows; l->consumed += global_batch) {
        if (stop_arrived(stopped)) break;
        Schedule s = schedule_for(m, load_micro_batch, l, 0.0f);
        s.take_losses = add_window_losses;
        run_forward_only(&s, num_micro);
    }
    l->consumed = kept;
    if (stop_arrived(stopped)) return NAN;   // (every rank left the walk at the same window)
    double sums[2] = {l->loss_sum, (double)l->targets};   // (other stages than the last: 0)
    all_reduce_host(&grid.pp, sums, 2, REDUCE_SUM);
    all_reduce_host(&grid.dp_cp, sums, 2, REDUCE_SUM);
    if (grid.world_rank == 0)
        printf("full validation: %.0f tokens predicted, in %lld windows of up to %d (the %s split's %lld tokens, "
               "each after the ones before it in its window)\n", sums[1], windows, l->seq_length,
               SPLIT_NAMES[l->split], (long long)l->stream_tokens);
    return (float)(sums[0] / (sums[1] > 0 ? sums[1] : 1));
}

// Megatron-LM's evaluation block: " validation loss at PREFIX | lm loss value: ... | lm loss
// PPL: ... | " between two rulers one dash longer, PPL = exp(min(20, loss)); the prefix is
// "iteration N" during training, "iteration N on validation set" / "... on test set" at the end
static void print_eval(const char* prefix, float loss) {
    if (grid.world_rank != 0) return;
    char line[256], dashes[256];
    int n = snprintf(line, sizeof(line), " validation loss at %s | lm loss value: %.6E | lm loss PPL: %.6E | ", prefix,
                     loss, exp(fmin(20.0, loss)));
    n = n + 1 < (int)sizeof(line) - 1 ? n + 1 : (int)sizeof(line) - 1;
    memset(dashes, '-', n);
    dashes[n] = '\0';
    printf("%s\n%s\n%s\n", dashes, line, dashes);
    fflush(stdout);
}

