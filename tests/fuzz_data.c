/*
tests/fuzz_data.c — a libFuzzer target for data.c's indexed-dataset reader (issue 3, item 2).

An input is one dataset image: [uint32 little-endian L][L bytes: the .idx][the rest: the .bin]
(an L beyond the input's end takes all of it, and the .bin is empty). Each input is written
to PREFIX.idx and PREFIX.bin in a private folder on tmpfs (/dev/shm, else $TMPDIR or /tmp)
and opened with indexed_dataset_open. What must hold, whatever the bytes:
  - a refused file leaves one line in err, "<file>: <what is wrong>";
  - an accepted one has every item inside the .bin mapping (checked here: ASan does not see
    a read past a mapping's end that stays inside its last page), every token of every item
    reads back, and with 9 tokens or more a GPT sample index of seq-length 8 builds and every
    sample fetches; AddressSanitizer catches any read outside the index arrays on the way.
A broken rule aborts, which libFuzzer reports as a crash with the input that caused it.

    clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address -Wall -Wextra -Werror tests/fuzz_data.c -o fuzz_data
    clang -std=gnu11 -O1 -DFUZZ_SEED_MAIN -Wall -Wextra -Werror tests/fuzz_data.c -o fuzz_data_seeds
    ./fuzz_data_seeds tests/data/megatron/corpus_u16/corpus_u16 corpus   # the seed corpus
    ./fuzz_data -max_total_time=60 corpus

With FUZZ_SEED_MAIN defined, the program writes the seed corpus instead: the Megatron fixture
as one image, and one small image per token dtype written by preprocess.c's builder (an empty
document included).
*/
#define DATA_TESTING
#define FUZZ_NAME "fuzz_data"
#include "fuzz.h"
#include "../preprocess.c"   // data.c and the dataset writer (no main: DATA_TESTING)

static char prefix[4096], idx_path[4200], bin_path[4200];

// ----------------------------------------------------------------------------
// files

// PREFIX.idx / PREFIX.bin, in the private folder
static void make_work_dir(void) {
    if (prefix[0]) return;
    snprintf(prefix, sizeof prefix, "%s/d", fuzz_work_dir());
    snprintf(idx_path, sizeof idx_path, "%s.idx", prefix);
    snprintf(bin_path, sizeof bin_path, "%s.bin", prefix);
}

// ----------------------------------------------------------------------------
// the checks on an accepted dataset

static volatile int64_t sink;   // keeps the reads

// the reader's promise: after a successful open, every item lies inside the mapping
static void check_items_inside(const IndexedDataset* ds) {
    for (int64_t i = 0; i < ds->num_items; i++) {
        int64_t begin = ds->pointers[i], end = begin + (int64_t)ds->sizes[i] * ds->itemsize;
        if (ds->sizes[i] < 0 || begin < 0 || end > (int64_t)ds->bin_bytes) fuzz_fail(prefix, "an accepted item lies outside the .bin");
    }
}

static void read_every_token(const IndexedDataset* ds) {
    uint64_t sum = 0;   // unsigned: int64 tokens may wrap it
    int64_t count = 0;
    for (int64_t i = 0; i < ds->num_items; i++)
        for (int64_t pos = 0; pos < ds->sizes[i]; pos++, count++) sum += (uint64_t)indexed_dataset_token(ds, i, pos);
    if (count != ds->num_tokens) fuzz_fail(prefix, "num_tokens is not the sum of the sizes");
    sink = (int64_t)sum;
}

static void fetch_every_sample(const IndexedDataset* ds) {
    enum { SEQ = 8 };
    GPTDataset g;
    int tokens[SEQ + 1];
    if (ds->num_tokens < SEQ + 1) return;
    if (gpt_dataset_build(&g, ds, 0, ds->num_items, SEQ, 1234, 4, NULL, 0)) return;
    for (int64_t i = 0; i < g.num_samples; i++) {
        gpt_dataset_get(&g, i, tokens);
        sink = (int64_t)tokens[0] + tokens[SEQ];
    }
    gpt_dataset_free(&g);
}

// a refusal names the file and says what is wrong, on one line
static void check_error_line(const char* err) {
    if (err[0] == 0) fuzz_fail(prefix, "refused without a message");
    if (strncmp(err, prefix, strlen(prefix)) != 0 || strchr(err, '\n')) fuzz_fail("error line is not \"<file>: ...\"", err);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    make_work_dir();
    uint32_t idx_len = 0;
    if (size >= 4) memcpy(&idx_len, data, 4);
    const uint8_t* body = size >= 4 ? data + 4 : data + size;
    size_t body_len = size >= 4 ? size - 4 : 0;
    if (idx_len > body_len) idx_len = (uint32_t)body_len;
    fuzz_write_file(idx_path, body, idx_len);
    fuzz_write_file(bin_path, body + idx_len, body_len - idx_len);
    IndexedDataset ds;
    char err[8192] = {0};
    int rc = indexed_dataset_open(&ds, prefix, err, sizeof err);
    unlink(idx_path);   // the .bin stays mapped; a crash below leaves only the empty folder
    unlink(bin_path);
    if (rc != 0) {
        check_error_line(err);
        return 0;
    }
    check_items_inside(&ds);
    read_every_token(&ds);
    fetch_every_sample(&ds);
    indexed_dataset_close(&ds);
    return 0;
}

#ifdef FUZZ_SEED_MAIN
// ----------------------------------------------------------------------------
// the seed corpus

static uint8_t* slurp(const char* path, size_t* len) {
    FILE* f = fopen(path, "rb");
    if (f == NULL) fuzz_fail(path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t* p = (uint8_t*)malloc((size_t)n + 1);
    if (p == NULL || n < 0 || fread(p, 1, (size_t)n, f) != (size_t)n) fuzz_fail(path, "cannot read");
    fclose(f);
    *len = (size_t)n;
    return p;
}

// the image of dataset `from` (a prefix) into the file `to`
static void write_seed(const char* from, const char* to) {
    char path[4200];
    size_t idx_len, bin_len;
    snprintf(path, sizeof path, "%s.idx", from);
    uint8_t* idx = slurp(path, &idx_len);
    snprintf(path, sizeof path, "%s.bin", from);
    uint8_t* bin = slurp(path, &bin_len);
    uint32_t len32 = (uint32_t)idx_len;
    FILE* f = fopen(to, "wb");
    if (f == NULL || fwrite(&len32, 4, 1, f) != 1 || fwrite(idx, 1, idx_len, f) != idx_len ||
        fwrite(bin, 1, bin_len, f) != bin_len || fclose(f) != 0)
        fuzz_fail(to, "cannot write");
    free(idx);
    free(bin);
}

// three documents of 5, 0 and 12 tokens in the given dtype, at PREFIX
static void build_small_dataset(const TokenDtype* dt) {
    static const int64_t lengths[3] = {5, 0, 12};
    IndexedDatasetBuilder* b = (IndexedDatasetBuilder*)malloc(sizeof *b);
    char err[8192];
    int64_t tokens[12];
    if (b == NULL || builder_open(b, prefix, dt->code, err, sizeof err)) fuzz_fail(dt->name, b ? err : "out of memory");
    for (int d = 0; d < 3; d++) {
        for (int64_t i = 0; i < lengths[d]; i++) tokens[i] = dt->min + (i * 37 + d) % 100;
        if (builder_add_document(b, tokens, lengths[d], err, sizeof err)) fuzz_fail(dt->name, err);
    }
    if (builder_finish(b, err, sizeof err)) fuzz_fail(dt->name, err);
    free(b);
}

int main(int argc, char** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s FIXTURE_PREFIX OUT_DIR\n", argv[0]);
        return 2;
    }
    char to[4200];
    mkdir(argv[2], 0755);
    make_work_dir();
    snprintf(to, sizeof to, "%s/fixture", argv[2]);
    write_seed(argv[1], to);
    for (int k = 0; k < NUM_TOKEN_DTYPES; k++) {
        build_small_dataset(&TOKEN_DTYPES[k]);
        snprintf(to, sizeof to, "%s/%s", argv[2], TOKEN_DTYPES[k].name);
        write_seed(prefix, to);
        unlink(idx_path);
        unlink(bin_path);
    }
    return 0;
}
#endif
