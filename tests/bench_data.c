/*
tests/bench_data.c — how fast the data pipeline is (issue 3, item 11).

usage: bench_data DIR PREPROCESS     DIR: scratch folder (tests/build/bench_data),
                                     PREPROCESS: the ./preprocess program to time

What it measures, through data.c's own functions:
  (a) the GPT sample index: gpt_dataset_build over a synthetic corpus of 1e8 uint16 tokens
      in 1e6 documents (lengths 100 +- up to 99 in pairs, so exactly 1e8; ids < 50257),
      seq-length 1024, seed 1234, 1e7 samples (about a hundred epochs). The corpus is
      written once with the builder into DIR and reused while it reads back with the
      expected counts.
  (b) fetching: micro-batches of 8 samples of 2049 tokens (an index at seq-length 2048)
      through gpt_dataset_get at random sample indices, the .bin mapping touched once
      beforehand so that no page fault is counted; median and 99th percentile.
  (c) preprocessing: ./preprocess on a ~200 MB JSON-lines file and a ~200 MB plain-text
      file (both generated once into DIR), with --workers 1 and 2; MB/s is input bytes
      (1 MB = 1e6 bytes) over the wall time of the whole process. Its outputs are deleted.
The bar for (a) is Megatron's own index build, which is not run here: see bench_index.
*/
#define DATA_TESTING
#include "../preprocess.c"   // data.c and the dataset writer (no main: DATA_TESTING)

#include <spawn.h>
#include <sys/wait.h>
#include <time.h>

extern char** environ;

enum { CORPUS_DOCS = 1000000, CORPUS_MEAN_LEN = 100, CORPUS_VOCAB = 50257 };
enum { INDEX_SEQ = 1024, INDEX_SEED = 1234, INDEX_SAMPLES = 10000000 };
enum { FETCH_SEQ = 2048, FETCH_SAMPLES = 1000000, FETCH_BATCH = 8, FETCH_ROUNDS = 20000 };
#define TEXT_BYTES 200000000L

static char err[8192];
static volatile unsigned sink;   // keeps the reads that nothing else uses

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void die(const char* what) {
    fprintf(stderr, "error: %s\n", what);
    exit(2);
}

// xorshift64*: a fast generator for the synthetic data (not Megatron's RNG)
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rand32(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}
static uint32_t rand_below(uint32_t n) { return (uint32_t)(((uint64_t)rand32() * n) >> 32); }

static void join(char* dst, size_t size, const char* dir, const char* name) {
    if (snprintf(dst, size, "%s/%s", dir, name) >= (int)size) die("path too long");
}

// ----------------------------------------------------------------------------
// the synthetic corpus

static void add_random_document(IndexedDatasetBuilder* b, int64_t* tokens, int64_t n) {
    for (int64_t i = 0; i < n; i++) tokens[i] = rand_below(CORPUS_VOCAB);
    if (builder_add_document(b, tokens, n, err, sizeof err)) die(err);
}

static void make_corpus(const char* prefix) {
    IndexedDatasetBuilder* b = (IndexedDatasetBuilder*)malloc(sizeof *b);
    int64_t tokens[2 * CORPUS_MEAN_LEN];
    if (b == NULL || builder_open(b, prefix, DTYPE_UINT16, err, sizeof err)) die(b ? err : "out of memory");
    for (int i = 0; i < CORPUS_DOCS; i += 2) {   // two documents of mean +- d: the mean is exact
        int64_t d = (int64_t)rand_below(2 * CORPUS_MEAN_LEN - 1) - (CORPUS_MEAN_LEN - 1);
        add_random_document(b, tokens, CORPUS_MEAN_LEN + d);
        add_random_document(b, tokens, CORPUS_MEAN_LEN - d);
    }
    if (builder_finish(b, err, sizeof err)) die(err);
    free(b);
}

static int corpus_is_ready(IndexedDataset* ds, const char* prefix) {
    if (indexed_dataset_open(ds, prefix, NULL, 0)) return 0;
    if (ds->num_items == CORPUS_DOCS && ds->num_tokens == (int64_t)CORPUS_DOCS * CORPUS_MEAN_LEN) return 1;
    indexed_dataset_close(ds);
    return 0;
}

static void open_corpus(IndexedDataset* ds, const char* dir) {
    char prefix[4096];
    join(prefix, sizeof prefix, dir, "corpus_1e8");
    if (corpus_is_ready(ds, prefix)) {
        printf("corpus:   %s.bin/.idx (reused)\n", prefix);
    } else {
        double t0 = now();
        make_corpus(prefix);
        printf("corpus:   %s.bin/.idx written in %.2f s\n", prefix, now() - t0);
        if (indexed_dataset_open(ds, prefix, err, sizeof err)) die(err);
    }
    printf("          %lld documents, %lld tokens, dtype uint16, ids < %d\n", (long long)ds->num_docs,
           (long long)ds->num_tokens, CORPUS_VOCAB);
}

// ----------------------------------------------------------------------------
// (a) the sample index

static void bench_index(const IndexedDataset* ds) {
    GPTDataset g;
    double t0 = now();
    if (gpt_dataset_build(&g, ds, 0, ds->num_items, INDEX_SEQ, INDEX_SEED, INDEX_SAMPLES, err, sizeof err)) die(err);
    double dt = now() - t0;
    printf("\n(a) sample index: gpt_dataset_build, all %lld documents, seq-length %d, seed %d, %d samples requested\n",
           (long long)ds->num_items, INDEX_SEQ, INDEX_SEED, INDEX_SAMPLES);
    printf("    build time:   %.2f s\n", dt);
    printf("    built:        %d epochs, %lld samples, doc_idx %lld entries, separate last epoch: %s\n", g.num_epochs,
           (long long)g.num_samples, (long long)g.doc_idx_len, g.separate_last_epoch ? "yes" : "no");
    printf("    bar:          Megatron's _build_index_mappings, not run or timed here: numpy's\n"
           "                  RandomState(seed).shuffle of doc_idx, its C++ helper helpers.cpp build_sample_idx\n"
           "                  for the sample starts, then a numpy shuffle of shuffle_idx (the same arrays from\n"
           "                  the same MT19937 draws)\n");
    gpt_dataset_free(&g);
}

// ----------------------------------------------------------------------------
// (b) fetching micro-batches

static int compare_doubles(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

// read one byte of every page of the .bin, so the timed fetches take no page fault
static void touch_mapping(const IndexedDataset* ds) {
    unsigned sum = 0;
    for (size_t i = 0; i < ds->bin_bytes; i += 4096) sum += ds->bin[i];
    sink = sum;
}

static double fetch_batch(const GPTDataset* g, int* tokens) {
    int64_t idx[FETCH_BATCH];
    for (int k = 0; k < FETCH_BATCH; k++) idx[k] = rand_below((uint32_t)g->num_samples);
    double t0 = now();
    for (int k = 0; k < FETCH_BATCH; k++) gpt_dataset_get(g, idx[k], tokens + k * (FETCH_SEQ + 1));
    return now() - t0;
}

static void bench_fetch(const IndexedDataset* ds) {
    GPTDataset g;
    if (gpt_dataset_build(&g, ds, 0, ds->num_items, FETCH_SEQ, INDEX_SEED, FETCH_SAMPLES, err, sizeof err)) die(err);
    int* tokens = (int*)malloc(sizeof(int) * FETCH_BATCH * (FETCH_SEQ + 1));
    double* us = (double*)malloc(sizeof(double) * FETCH_ROUNDS);
    if (!tokens || !us) die("out of memory");
    touch_mapping(ds);
    for (int r = 0; r < 1000; r++) fetch_batch(&g, tokens);   // warm-up
    for (int r = 0; r < FETCH_ROUNDS; r++) {
        us[r] = 1e6 * fetch_batch(&g, tokens);
        sink = (unsigned)tokens[r % (FETCH_BATCH * (FETCH_SEQ + 1))];
    }
    qsort(us, FETCH_ROUNDS, sizeof(double), compare_doubles);
    printf("\n(b) fetch: micro-batches of %d x %d tokens, gpt_dataset_get at random indices of a %lld-sample index\n",
           FETCH_BATCH, FETCH_SEQ + 1, (long long)g.num_samples);
    printf("    per micro-batch: median %.1f us, p99 %.1f us (%d micro-batches, .bin in the page cache and mapped)\n",
           us[FETCH_ROUNDS / 2], us[FETCH_ROUNDS * 99 / 100], FETCH_ROUNDS);
    free(tokens);
    free(us);
    gpt_dataset_free(&g);
}

// ----------------------------------------------------------------------------
// (c) preprocessing throughput

// a line of random words; in JSON with a few escapes, as real dumps have them
static size_t random_line(char* out, int json) {
    static const char* words[] = {"the", "model", "of", "data", "and", "parallel", "training", "a", "token",
                                  "gradient", "pipeline", "is", "with", "layer", "attention", "to", "in"};
    size_t n = 0, target = 200 + rand_below(3600);   // ~2 KB of text a line
    if (json) n += (size_t)sprintf(out, "{\"id\": %u, \"text\": \"", rand32());
    while (n < target) {
        const char* w = words[rand_below(sizeof words / sizeof words[0])];
        n += (size_t)sprintf(out + n, "%s ", w);
        if (json && rand_below(64) == 0) n += (size_t)sprintf(out + n, "\\\"caf\\u00e9\\\"\\n");
    }
    n += (size_t)sprintf(out + n, json ? "\"}\n" : "\n");
    return n;
}

static long file_size(const char* path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

// 1 if it wrote the file, 0 if a file of that size is already there
static int make_text(const char* path, int json) {
    if (file_size(path) >= TEXT_BYTES) return 0;
    FILE* f = fopen(path, "wb");
    char* line = (char*)malloc(8192);
    if (f == NULL || line == NULL) die(path);
    for (long written = 0; written < TEXT_BYTES;) {
        size_t n = random_line(line, json);
        if (fwrite(line, 1, n, f) != n) die(path);
        written += (long)n;
    }
    if (fclose(f) != 0) die(path);
    free(line);
    return 1;
}

// run argv with stdout and stderr into log; the wall time, or a negative number if it failed
static double run_timed(char** argv, const char* log) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    double t0 = now();
    pid_t pid;
    int status = -1;
    if (posix_spawn(&pid, argv[0], &fa, NULL, argv, environ) == 0) waitpid(pid, &status, 0);
    double dt = now() - t0;
    posix_spawn_file_actions_destroy(&fa);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? dt : -1.0;
}

static void remove_output(const char* prefix) {
    char path[4200];
    snprintf(path, sizeof path, "%s_text_document.bin", prefix);
    unlink(path);
    snprintf(path, sizeof path, "%s_text_document.idx", prefix);
    unlink(path);
}

static void bench_preprocess_one(const char* dir, const char* preprocess, const char* input, int json, int workers) {
    char prefix[4096], log[4096], w[16];
    join(prefix, sizeof prefix, dir, "preprocessed");
    join(log, sizeof log, dir, "preprocess.log");
    snprintf(w, sizeof w, "%d", workers);
    char* argv[16] = {(char*)preprocess, (char*)"--input", (char*)input, (char*)"--output-prefix", prefix,
                      (char*)"--append-eod", (char*)"--workers", w};
    if (json) { argv[8] = (char*)"--json-keys"; argv[9] = (char*)"text"; }
    else { argv[8] = (char*)"--input-format"; argv[9] = (char*)"text"; }
    double dt = run_timed(argv, log);
    remove_output(prefix);
    double mb = (double)file_size(input) / 1e6;
    if (dt < 0) { printf("    %-10s --workers %d: FAILED (see %s)\n", json ? "JSON lines" : "plain text", workers, log); return; }
    printf("    %-10s --workers %d: %7.1f MB/s  (%.0f MB in %.2f s)\n", json ? "JSON lines" : "plain text", workers,
           mb / dt, mb, dt);
}

static void bench_preprocess(const char* dir, const char* preprocess) {
    char jsonl[4096], txt[4096];
    join(jsonl, sizeof jsonl, dir, "text_200MB.jsonl");
    join(txt, sizeof txt, dir, "text_200MB.txt");
    double t0 = now();
    int made = make_text(jsonl, 1) + make_text(txt, 0);
    printf("\n(c) preprocess: %s, byte tokens, --append-eod, uint16 output\n", preprocess);
    if (made) printf("    inputs: %s, %s (written in %.2f s)\n", jsonl, txt, now() - t0);
    else printf("    inputs: %s, %s (reused)\n", jsonl, txt);
    for (int workers = 1; workers <= 2; workers++) bench_preprocess_one(dir, preprocess, jsonl, 1, workers);
    for (int workers = 1; workers <= 2; workers++) bench_preprocess_one(dir, preprocess, txt, 0, workers);
    printf("    (plain text without --json-keys is one document per file, read as one stream: --workers\n"
           "     parallelizes lines, so it cannot speed up that case)\n");
}

int main(int argc, char** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s DIR PREPROCESS\n", argv[0]);
        return 2;
    }
    mkdir(argv[1], 0755);
    IndexedDataset ds;
    double t0 = now();
    open_corpus(&ds, argv[1]);
    bench_index(&ds);
    bench_fetch(&ds);
    indexed_dataset_close(&ds);
    bench_preprocess(argv[1], argv[2]);
    printf("\ndata benchmark total: %.1f s\n", now() - t0);
    return 0;
}
