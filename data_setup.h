/*
data_setup.h — the run's data files, opened from the flags, the same on every rank.

  - the run's blends: --data-path (split by --split), or Megatron-LM's per-split
    --train-data-path, --valid-data-path and --test-data-path;
  - on every rank: data.c's files mapped and the sample indexes planned (nothing large
    allocated: train.c's memory check comes next and counts them), the vocabulary settled;
  - each rank's copy of the files fingerprinted and held against the copy most ranks hold
    (rank_unlike_most, which train.c's tokenizer check uses too): a stale or half-copied file
    on a node-local disk is named, not trained on;
  - the samples each split is asked for, an evaluation at most one pass of its split when
    --eval-iters is not given, and a note when the evaluations ask more than one pass holds;
  - the sample indexes built by rank 0 (or found in the cache) and mapped by the others.

Interface (what train.c uses): samples_per_split, eval_iters_at_most_one_pass, open_data_files,
note_eval_epochs, build_data_index, rank_unlike_most. It sits on data.c, parallel.h,
checkpoint.h's CRC-32 and config.h's Config.
*/
#pragma once

// ----------------------------------------------------------------------------
// data: the files, the same on every rank

// What a rank's copy of one data prefix looks like: the .bin's size, a CRC-32 of the .idx's
// contents (dtype, counts and its three arrays) and one of 64 blocks of 4 KiB spread evenly
// over the .bin, the first and last among them. Ranks that read --data-path from node-local
// disks compare these, so that a stale or half-copied file on one node is named, not trained
// on. (A change inside the .bin that leaves its size and those blocks alone goes unseen.)
typedef struct {
    uint64_t bin_bytes;
    uint32_t idx_crc, bin_crc;
} DataFingerprint;

enum { FINGERPRINT_BLOCKS = 64, FINGERPRINT_BLOCK_BYTES = 4096 };

static DataFingerprint data_fingerprint(const IndexedDataset* ds) {
    DataFingerprint f = {(uint64_t)ds->bin_bytes, 0, 0};
    int64_t counts[3] = {ds->dtype_code, ds->num_items, ds->num_docs};
    f.idx_crc = crc32_update(0, counts, sizeof(counts));
    f.idx_crc = crc32_update(f.idx_crc, ds->sizes, (size_t)ds->num_items * sizeof(int32_t));
    f.idx_crc = crc32_update(f.idx_crc, ds->pointers, (size_t)ds->num_items * sizeof(int64_t));
    f.idx_crc = crc32_update(f.idx_crc, ds->doc_idx, (size_t)(ds->num_docs + 1) * sizeof(int64_t));
    size_t block = ds->bin_bytes < (size_t)FINGERPRINT_BLOCK_BYTES ? ds->bin_bytes : (size_t)FINGERPRINT_BLOCK_BYTES;
    for (int k = 0; k < FINGERPRINT_BLOCKS && block > 0; k++) {
        size_t at = (size_t)((double)(ds->bin_bytes - block) * k / (FINGERPRINT_BLOCKS - 1));
        f.bin_crc = crc32_update(f.bin_crc, ds->bin + at, block);
    }
    return f;
}

// Each rank's copy of something (`bytes` of it at all[rank], all_gather_host's) against the copy
// most ranks hold (the first rank whose copy more than half the ranks share; rank 0 where none
// is), like the flags: the first rank whose copy differs, or -1; *ref that reference rank, and
// ref_host its host, which every rank learns. (Held against rank 0's alone, a stale copy on rank
// 0's host had the first healthy rank named, on another host: tests/test_hosts.sh.)
static int rank_unlike_most(const void* all, size_t bytes, int* ref, char ref_host[sizeof(grid.host)]) {
    const char* copy = (const char*)all;
    int W = grid.world_size, rank = -1;
    *ref = 0;
    for (int q = 0, found = 0; q < W && !found; q++) {
        int same = 0;
        for (int r = 0; r < W; r++) same += memcmp(copy + r * bytes, copy + q * bytes, bytes) == 0;
        if (2 * same > W) *ref = q, found = 1;
    }
    for (int r = 0; r < W && rank < 0; r++)
        if (memcmp(copy + r * bytes, copy + *ref * bytes, bytes) != 0) rank = r;
    memcpy(ref_host, grid.host, sizeof(grid.host));
    if (rank >= 0) broadcast_host(&grid.world, ref_host, sizeof(grid.host), *ref);
    return rank;
}

// Every rank's fingerprints against those most ranks hold: the first rank whose copy of a
// prefix differs says so (naming the file, and the reference rank's host), and every rank exits 2.
static void check_same_data_everywhere(const DataSplits* d) {
    int n = d->num_prefixes, W = grid.world_size;
    size_t bytes = n * sizeof(DataFingerprint);
    DataFingerprint* mine = (DataFingerprint*)callocCheck(n, sizeof(DataFingerprint));
    DataFingerprint* all = (DataFingerprint*)callocCheck((size_t)n * W, sizeof(DataFingerprint));
    for (int i = 0; i < n; i++) mine[i] = data_fingerprint(&d->prefix[i].ds);
    all_gather_host(&grid.world, mine, all, bytes);
    char ref_host[sizeof(grid.host)], what[4400] = "";
    int ref, rank = rank_unlike_most(all, bytes, &ref, ref_host), prefix = 0;
    while (rank >= 0 && prefix < n - 1 &&
           memcmp(&all[(size_t)rank * n + prefix], &all[(size_t)ref * n + prefix], sizeof(DataFingerprint)) == 0)
        prefix++;
    if (rank >= 0 && grid.world_rank == rank) {
        const DataFingerprint *here = &mine[prefix], *there = &all[(size_t)ref * n + prefix];
        const char* path = d->prefix[prefix].ds.path_prefix;
        if (here->bin_bytes != there->bin_bytes)
            snprintf(what, sizeof(what), "%s.bin is %llu bytes here, %llu on rank %d", path,
                     (unsigned long long)here->bin_bytes, (unsigned long long)there->bin_bytes, ref);
        else if (here->idx_crc != there->idx_crc)
            snprintf(what, sizeof(what), "%s.idx differs (CRC-32 %08x here, %08x on rank %d)", path, here->idx_crc,
                     there->idx_crc, ref);
        else
            snprintf(what, sizeof(what), "%s.bin differs in the blocks sampled (CRC-32 %08x here, %08x on rank %d)", path,
                     here->bin_crc, there->bin_crc, ref);
    }
    free(mine);
    free(all);
    if (rank >= 0)   // (only that rank prints, with its host and coordinates)
        config_error_on(rank, "--data-path: this rank's copy differs from rank %d's (on %s): %s; every rank must read "
                        "the same data (a stale copy on a node-local disk?)", ref, ref_host, what);
}

// Every rank maps the data files and plans the sample indexes (nothing large is allocated
// yet: the memory check, plan_model, comes next and counts them). Also settles the vocabulary:
// --vocab-size, or the largest token id + 1, and every id must lie below it.
// The run's blends: --data-path (split by --split), or Megatron-LM's per-split ones given;
// returns how many (0: no data, an evaluation-less --skip-train)
static int data_lists(const Config* a, DataPathList lists[3]) {
    const StringList* per_split[3] = {&a->train_data_path, &a->valid_data_path, &a->test_data_path};
    const char* flags[3] = {"--train-data-path", "--valid-data-path", "--test-data-path"};
    int n = 0;
    if (a->data_path.count) {
        DataPathList all = {"--data-path", a->data_path.v, a->data_path.count, -1};
        lists[n++] = all;
    }
    for (int k = 0; k < 3 && !a->data_path.count; k++) {
        DataPathList one = {flags[k], per_split[k]->v, per_split[k]->count, k};
        if (one.count) lists[n++] = one;
    }
    return n;
}

static void open_data_files(DataSplits* d, Config* a, const int64_t want[3]) {
    char err[1024] = "";
    GPTConfig* c = &a->model;
    DataPathList lists[3];
    int num_lists = data_lists(a, lists);
    memset(d, 0, sizeof(*d));
    if (num_lists == 0) return;   // (the vocabulary comes from the checkpoint)
    data_splits_plan_lists(d, lists, num_lists, a->split, c->seq_length, (uint64_t)c->seed, want, err, sizeof(err));
    config_error_anywhere(err);
    check_same_data_everywhere(d);
    int64_t max_id = 0;
    if (data_splits_check_vocab(d, c->vocab_size, &max_id, err, sizeof(err)))
        config_error("%s (--vocab-size %d)", err, c->vocab_size);
    if (c->vocab_size == 0) c->vocab_size = (int)(max_id + 1);
}

// More evaluation samples than one pass over a split holds (--eval-iters x the global batch, at
// every evaluation of the run) make the index a second epoch of the same documents, as in
// Megatron-LM: said, since a loss over repeated samples is not the loss over the file
static void note_eval_epochs(const DataSplits* d, const Config* a) {
    for (int k = 1; k < 3 && !a->full_validation; k++)
        for (int j = 0; j < d->num_members[k] && d->has[k]; j++) {
            const DataPrefix* p = &d->prefix[d->members[k][j]];
            if (p->split[k].num_epochs < 2) continue;
            printf("note: the evaluations ask %lld %s samples of %s, which holds %lld in one pass: %d epochs of the same "
                   "documents (--full-validation evaluates each token once)\n", (long long)p->requested[k],
                   SPLIT_NAMES[k], p->ds.path_prefix, (long long)((p->split[k].tokens_per_epoch - 1) / d->seq_length),
                   p->split[k].num_epochs);
        }
}

// Megatron's sample counts per split: the training's, and the evaluations' (every evaluation of
// the run, eval_iters[k] global batches each)
static void samples_per_split(const Config* a, int train_iters, const int eval_iters[3], int64_t samples[3]) {
    long long eval_batches = (long long)(train_iters / a->eval_interval + 1) * eval_iters[1];
    samples[0] = a->skip_train ? 0 : a->train_iters > 0 ? (int64_t)a->train_iters * a->global_batch_size : a->train_samples;
    // (--full-validation walks the files: one epoch's index)
    samples[1] = a->full_validation ? !!eval_batches : eval_batches * a->global_batch_size;
    samples[2] = a->full_validation ? !!eval_iters[2] : (long long)eval_iters[2] * a->global_batch_size;
}

// Megatron-LM's 100 evaluation iterations suit a large held-out set; on a small one every
// evaluation would be several epochs of the same documents (a loss over repeats, at 3 to 6 times
// the cost of a 20-step fine-tune). So, unless --eval-iters is given, an evaluation of split k
// takes at most the whole global batches one pass of it holds (at least one) in iters[k]: said,
// and 1 returned when one was lowered (the splits must be planned again for it).
static int eval_iters_at_most_one_pass(const DataSplits* d, const Config* a, int iters[3]) {
    if (run_field_given(a, offsetof(Config, eval_iters)) || a->full_validation) return 0;
    int lowered = 0;
    for (int k = 1; k < 3; k++) {
        int64_t one_pass = data_splits_one_pass(d, k), batches = one_pass / a->global_batch_size;
        if (!data_splits_has(d, k) || batches >= iters[k]) continue;
        iters[k] = batches > 1 ? (int)batches : 1;
        lowered = 1;
        if (grid.world_rank == 0)
            printf("note: an evaluation of the %s split takes %d global batch(es) of %d, not --eval-iters' default %d: "
                   "one pass of it holds %lld samples (give --eval-iters to take more, or --full-validation for every "
                   "token once)\n", SPLIT_NAMES[k], iters[k], a->global_batch_size, a->eval_iters, (long long)one_pass);
    }
    return lowered;
}

// Rank 0 builds the planned sample indexes (or finds them cached) and writes the cache; the
// others then map the same cache files.
static void build_data_index(DataSplits* d, const Config* a) {
    char err[1024] = "";
    int rc = 0;
    if (grid.world_rank == 0) rc = data_splits_build(d, a->data_cache_path, 1, err, sizeof(err));
    broadcast_host(&grid.world, &rc, sizeof(rc), 0);
    if (rc) config_error("%s", err);   // rank 0 says why
    err[0] = '\0';   // the other ranks map what rank 0 wrote: a host that cannot see it is named
    if (grid.world_rank != 0) {
        rc = data_splits_build(d, a->data_cache_path, 0, err, sizeof(err));
        if (rc == DATA_NO_CACHE) strncat(err, "; the index cache must be visible to every rank (see --data-cache-path)",
                                         sizeof(err) - strlen(err) - 1);
    }
    config_error_anywhere(err);
}
