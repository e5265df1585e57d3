/*
tests/test_data.c — data.c against real Megatron files.

The fixture (argv[1], default tests/data/megatron/corpus_u16 from the repository
root) was written and indexed by Megatron's own code; its README.txt describes every file.
Checks: the corpus reads back as docs.json lists it; doc_idx / sample_idx / shuffle_idx and
the first samples equal Megatron's; more sample indexes (several epochs, a separated last
epoch) equal tests/data/gpt_index_cases.txt (made with numpy's RandomState by
tests/data/gen_gpt_index.py); the builder writes the fixture byte for byte; corrupted
copies, and an .idx that does not describe its .bin exactly, are refused with a message;
--split and blending follow Megatron's formulas; the index cache reads Megatron's .npy files
and writes them byte for byte, round-trips, is not used when stale, is refused or rebuilt (in
one line) when damaged, even where only its CRC-32s can tell, and a build removes the
temporaries of killed builds, not those of live ones; DataSplits (--data-path with weights,
--split, blending) serves Megatron's samples, checks the vocabulary and computes the unigram
entropy; and the preprocess program turns text, JSON lines and ids into datasets (refusing
an empty or directory --output-prefix), inspects them, and prints samples (--print-samples)
equal to Megatron's.

    gcc -std=gnu11 -O1 -g -fsanitize=address -Wall -Wextra tests/test_data.c -o /tmp/test_data -lm
    /tmp/test_data tests/data/megatron/corpus_u16 [tests/data/gpt_index_cases.txt]

(run from the repository root, or from tests/; argv[2] names the cases file elsewhere)
*/
#define DATA_TESTING
#include "../preprocess.c"   // data.c and the preprocess program (no main: DATA_TESTING)
#include "test.h"

#include <dirent.h>
#include <sys/wait.h>

static char FIXTURE[4096];   // fixture directory
static char TMP[4096];       // scratch directory, removed at the end
static char err[8192];

// ----------------------------------------------------------------------------
// file helpers

static uint8_t* slurp(const char* path, size_t* len) {
    FILE* f = fopen(path, "rb");
    if (f == NULL) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t* data = (uint8_t*)malloc((size_t)n + 1);
    *len = fread(data, 1, (size_t)n, f);
    data[*len] = 0;
    fclose(f);
    return data;
}

static void spit(const char* path, const void* data, size_t len) {
    FILE* f = fopen(path, "wb");
    if (f == NULL) { perror(path); exit(2); }
    fwrite(data, 1, len, f);
    fclose(f);
}

static void spit_text(const char* path, const char* text) { spit(path, text, strlen(text)); }

static int same_file(const char* a, const char* b) {
    size_t la = 0, lb = 0;
    uint8_t *da = slurp(a, &la), *db = slurp(b, &lb);
    int same = da && db && la == lb && memcmp(da, db, la) == 0;
    free(da);
    free(db);
    return same;
}

static int exists(const char* path) { return access(path, F_OK) == 0; }

// every integer in a text file (whitespace separated), up to max
static int64_t read_ints(const char* path, int64_t* out, int64_t max) {
    size_t len;
    char* text = (char*)slurp(path, &len);
    if (text == NULL) return -1;
    int64_t n = 0;
    for (char *p = text, *end; n < max; p = end) {
        long long v = strtoll(p, &end, 10);
        if (end == p) break;
        out[n++] = v;
    }
    free(text);
    return n;
}

static const char* fixture(const char* name) {
    static char path[8192];
    snprintf(path, sizeof path, "%s/%s", FIXTURE, name);
    return path;
}

static const char* scratch(const char* name) {
    static char path[16][8192];   // a few live at once
    static int k = 0;
    k = (k + 1) % 16;
    snprintf(path[k], sizeof path[k], "%s/%s", TMP, name);
    return path[k];
}

// ----------------------------------------------------------------------------
// docs.json: the documents' token ids, parsed simply ("docs": [[...], [...], ...])

enum { NUM_DOCS = 40, NUM_TOKENS = 6263 };
static int64_t doc_tokens[NUM_TOKENS];
static int64_t doc_start[NUM_DOCS + 1];

static int load_docs_json(void) {
    size_t len;
    char* text = (char*)slurp(fixture("docs.json"), &len);
    if (text == NULL) return 1;
    char* p = strstr(text, "\"docs\"");
    int d = -1, n = 0;
    for (p = p ? strchr(p, '[') + 1 : text + len; *p && d < NUM_DOCS; p++) {
        if (*p == '[') doc_start[++d] = n;
        else if (*p == ']') { if (d == NUM_DOCS - 1) { d++; break; } }
        else if (*p >= '0' && *p <= '9' && n < NUM_TOKENS) { doc_tokens[n++] = strtoll(p, &p, 10); p--; }
    }
    doc_start[NUM_DOCS] = n;
    free(text);
    return d == NUM_DOCS && n == NUM_TOKENS ? 0 : 1;
}

// ----------------------------------------------------------------------------
// reading the fixture

static void test_read_fixture(void) {
    IndexedDataset ds;
    int rc = indexed_dataset_open(&ds, fixture("corpus_u16"), err, sizeof err);
    check(rc == 0, "open_fixture", "%s", err);
    if (rc) return;
    check(ds.dtype_code == 8 && ds.itemsize == 2 && ds.num_items == NUM_DOCS && ds.num_docs == NUM_DOCS &&
              ds.num_tokens == NUM_TOKENS && ds.bin_bytes == 2 * NUM_TOKENS,
          "fixture_header", "dtype %d, %lld items, %lld docs, %lld tokens", ds.dtype_code, (long long)ds.num_items,
          (long long)ds.num_docs, (long long)ds.num_tokens);
    int bad = 0;
    for (int64_t i = 0; i <= NUM_DOCS; i++) bad += ds.doc_idx[i] != i;
    check(bad == 0, "fixture_doc_idx_is_one_item_per_document", "%d entries differ from 0..40", bad);
    int64_t first_bad = -1;
    for (int d = 0; d < NUM_DOCS && first_bad < 0; d++) {
        if (ds.sizes[d] != doc_start[d + 1] - doc_start[d]) first_bad = d;
        for (int64_t t = 0; t < ds.sizes[d] && first_bad < 0; t++)
            if (indexed_dataset_token(&ds, d, t) != doc_tokens[doc_start[d] + t]) first_bad = d;
    }
    check(first_bad < 0, "fixture_tokens_equal_docs_json", "document %lld differs", (long long)first_bad);
    check(indexed_dataset_token(&ds, 40, 0) == -1 && indexed_dataset_token(&ds, 5, 1) == -1 &&
              indexed_dataset_token(&ds, -1, 0) == -1,
          "token_out_of_range_is_minus_one", "got a token outside the dataset");
    int64_t lo = -5, hi = -5;
    rc = indexed_dataset_max_token(&ds, &lo, &hi);
    check(rc == 0 && lo == 0 && hi == 50256, "min_max_token", "rc %d, min %lld, max %lld", rc, (long long)lo, (long long)hi);
    indexed_dataset_close(&ds);
    check(ds.bin == NULL && ds.sizes == NULL, "close_clears", "fields left after close");
}

// ----------------------------------------------------------------------------
// the GPT sample index against Megatron's files

static void test_gpt_fixture(void) {
    IndexedDataset ds;
    if (indexed_dataset_open(&ds, fixture("corpus_u16"), err, sizeof err)) { check(0, "gpt_fixture_open", "%s", err); return; }
    GPTDataset g;
    int rc = gpt_dataset_build(&g, &ds, 0, NUM_DOCS, 32, 1234, 100, err, sizeof err);
    check(rc == 0, "gpt_build", "%s", err);
    if (rc) { indexed_dataset_close(&ds); return; }
    check(g.num_samples == 195 && g.num_epochs == 1 && g.separate_last_epoch == 0 && g.doc_idx_len == 40,
          "gpt_counts", "%lld samples, %d epochs, separate %d", (long long)g.num_samples, g.num_epochs, g.separate_last_epoch);

    static int64_t want[1024];
    const char* stem = "corpus_u16_train_indexmap_100ns_32sl_1234s_";
    char name[256];
    snprintf(name, sizeof name, "%sdoc_idx.txt", stem);
    int64_t n = read_ints(fixture(name), want, 1024), bad = n != g.doc_idx_len;
    for (int64_t i = 0; i < n && !bad; i++) bad = want[i] != g.doc_idx[i];
    check(!bad, "gpt_doc_idx_equals_megatron", "differs (%lld entries in the file)", (long long)n);
    snprintf(name, sizeof name, "%ssample_idx.txt", stem);
    n = read_ints(fixture(name), want, 1024), bad = n != 2 * (g.num_samples + 1);
    for (int64_t i = 0; i < n && !bad; i++) bad = want[i] != g.sample_idx[i];
    check(!bad, "gpt_sample_idx_equals_megatron", "differs (%lld numbers in the file)", (long long)n);
    snprintf(name, sizeof name, "%sshuffle_idx.txt", stem);
    n = read_ints(fixture(name), want, 1024), bad = n != g.num_samples;
    for (int64_t i = 0; i < n && !bad; i++) bad = want[i] != g.shuffle_idx[i];
    check(!bad, "gpt_shuffle_idx_equals_megatron", "differs (%lld entries in the file)", (long long)n);

    int sample[33];
    snprintf(name, sizeof name, "%ssamples_first5.txt", stem);
    n = read_ints(fixture(name), want, 1024), bad = n != 5 * 33;
    for (int i = 0; i < 5 && !bad; i++) {
        gpt_dataset_get(&g, i, sample);
        for (int t = 0; t < 33; t++) bad |= sample[t] != want[33 * i + t];
    }
    check(!bad, "gpt_first5_samples_equal_megatron", "differ");

    // every sample is the window [j*32, j*32+33) of the documents concatenated in doc_idx order
    static int64_t stream[NUM_TOKENS];
    int64_t len = 0;
    for (int d = 0; d < NUM_DOCS; d++)
        for (int64_t t = doc_start[g.doc_idx[d]]; t < doc_start[g.doc_idx[d] + 1]; t++) stream[len++] = doc_tokens[t];
    bad = 0;
    for (int64_t i = 0; i < g.num_samples && !bad; i++) {
        gpt_dataset_get(&g, i, sample);
        for (int t = 0; t < 33; t++) bad |= sample[t] != stream[g.shuffle_idx[i] * 32 + t];
        if (bad) bad = i + 1;
    }
    check(!bad, "gpt_all_samples_are_stream_windows", "sample %lld differs", (long long)bad - 1);
    int again[33];
    gpt_dataset_get(&g, 195, sample);
    gpt_dataset_get(&g, 0, again);
    bad = memcmp(sample, again, sizeof sample) != 0;
    gpt_dataset_get(&g, -1, sample);
    gpt_dataset_get(&g, 194, again);
    bad |= memcmp(sample, again, sizeof sample) != 0;
    check(!bad, "gpt_get_wraps_modulo_len", "sample 195 != 0 or -1 != 194");
    gpt_dataset_free(&g);

    check(gpt_dataset_build(&g, &ds, 10, 10, 32, 1, 10, err, sizeof err) != 0, "gpt_refuses_empty_range", "accepted");
    check(gpt_dataset_build(&g, &ds, 0, 41, 32, 1, 10, err, sizeof err) != 0, "gpt_refuses_range_past_end", "accepted");
    check(gpt_dataset_build(&g, &ds, 0, 40, 1, 1, 10, err, sizeof err) != 0, "gpt_refuses_seq_length_1", "accepted");
    check(gpt_dataset_build(&g, &ds, 0, 40, 32, 1ull << 32, 10, err, sizeof err) != 0 && strstr(err, "seed"),
          "gpt_refuses_seed_over_32_bits", "accepted");
    check(gpt_dataset_build(&g, &ds, 5, 6, 32, 1, 10, err, sizeof err) != 0, "gpt_refuses_one_token", "accepted");
    indexed_dataset_close(&ds);
}

// more cases, including several epochs and a separated last epoch (tests/data/gen_gpt_index.py)
static int64_t* read_array(char** p, const char* label, int64_t* n) {
    char* at = strstr(*p, label);
    if (at == NULL) return NULL;
    *n = strtoll(at + strlen(label), p, 10);
    int64_t* a = (int64_t*)malloc((size_t)(*n + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < *n; i++) a[i] = strtoll(*p, p, 10);
    return a;
}

static void test_gpt_cases(const char* cases_path) {
    size_t len;
    char* text = (char*)slurp(cases_path, &len);
    check(text != NULL, "gpt_cases_file", "cannot read %s", cases_path);
    if (text == NULL) return;
    IndexedDataset ds;
    if (indexed_dataset_open(&ds, fixture("corpus_u16"), err, sizeof err)) { check(0, "gpt_cases_open", "%s", err); free(text); return; }
    char* p = text;
    while ((p = strstr(p, "case ")) != NULL) {
        char name[128], full[160];
        long long b, e, seq, seed, ns, epochs, separate;
        if (sscanf(p, "case %127s %lld %lld %lld %lld %lld %lld %lld", name, &b, &e, &seq, &seed, &ns, &epochs, &separate) != 8) break;
        p++;
        int64_t nd = 0, nsi = 0, nsh = 0;
        int64_t* d = read_array(&p, "doc_idx ", &nd);
        int64_t* s = read_array(&p, "sample_idx ", &nsi);
        int64_t* sh = read_array(&p, "shuffle_idx ", &nsh);
        GPTDataset g;
        snprintf(full, sizeof full, "gpt_case_%s", name);
        int rc = gpt_dataset_build(&g, &ds, b, e, (int)seq, (uint64_t)seed, ns, err, sizeof err);
        int bad = rc != 0 || !d || !s || !sh;
        if (!bad) bad = g.num_epochs != epochs || g.separate_last_epoch != separate || g.doc_idx_len != nd ||
                        2 * (g.num_samples + 1) != nsi || g.num_samples != nsh;
        for (int64_t i = 0; !bad && i < nd; i++) bad = g.doc_idx[i] != d[i];
        for (int64_t i = 0; !bad && i < nsi; i++) bad = g.sample_idx[i] != s[i];
        for (int64_t i = 0; !bad && i < nsh; i++) bad = g.shuffle_idx[i] != sh[i];
        check(!bad, full, rc ? err : "differs from numpy (epochs %d, separate %d)", g.num_epochs, g.separate_last_epoch);
        if (rc == 0) gpt_dataset_free(&g);
        free(d); free(s); free(sh);
    }
    indexed_dataset_close(&ds);
    free(text);
}

// ----------------------------------------------------------------------------
// writing

static int write_fixture_docs(const char* prefix, int dtype_code) {
    IndexedDatasetBuilder b;
    if (builder_open(&b, prefix, dtype_code, err, sizeof err)) return 1;
    for (int d = 0; d < NUM_DOCS; d++)
        if (builder_add_document(&b, doc_tokens + doc_start[d], doc_start[d + 1] - doc_start[d], err, sizeof err)) {
            builder_abort(&b);
            return 1;
        }
    return builder_finish(&b, err, sizeof err);
}

static void test_builder(void) {
    char prefix[8192], name[8300];
    snprintf(prefix, sizeof prefix, "%s", scratch("copy"));
    int rc = write_fixture_docs(prefix, DTYPE_UINT16);
    check(rc == 0, "builder_writes_fixture", "%s", err);
    snprintf(name, sizeof name, "%s.bin", prefix);
    int bin_same = same_file(name, fixture("corpus_u16.bin"));
    snprintf(name, sizeof name, "%s.idx", prefix);
    check(bin_same && same_file(name, fixture("corpus_u16.idx")), "builder_byte_identical_to_megatron",
          ".bin %s, .idx differs", bin_same ? "same" : "differs");
    snprintf(name, sizeof name, "%s.bin.tmp", prefix);
    int tmp_left = exists(name);
    snprintf(name, sizeof name, "%s.idx.tmp", prefix);
    check(!tmp_left && !exists(name), "builder_leaves_no_temporaries", "a .tmp file is left");

    // every token dtype reads back what was written (int8/uint8 with tokens that fit)
    const int codes[] = {DTYPE_UINT8, DTYPE_INT8, DTYPE_INT16, DTYPE_INT32, DTYPE_INT64, DTYPE_UINT16};
    for (int c = 0; c < 6; c++) {
        const TokenDtype* dt = token_dtype(codes[c]);
        int64_t toks[] = {dt->min, dt->max, 0, 1, dt->min / 2, dt->max / 3};
        IndexedDatasetBuilder b;
        IndexedDataset ds;
        snprintf(prefix, sizeof prefix, "%s_%s", scratch("dtype"), dt->name);
        rc = builder_open(&b, prefix, codes[c], err, sizeof err) || builder_add_document(&b, toks, 6, err, sizeof err) ||
             builder_add_document(&b, toks, 0, err, sizeof err) || builder_add_document(&b, toks + 2, 3, err, sizeof err) ||
             builder_finish(&b, err, sizeof err) || indexed_dataset_open(&ds, prefix, err, sizeof err);
        int bad = rc || ds.num_items != 3 || ds.sizes[1] != 0 || ds.dtype_code != codes[c];
        for (int t = 0; t < 6 && !bad; t++) bad = indexed_dataset_token(&ds, 0, t) != toks[t];
        for (int t = 0; t < 3 && !bad; t++) bad = indexed_dataset_token(&ds, 2, t) != toks[2 + t];
        snprintf(name, sizeof name, "builder_roundtrip_%s", dt->name);
        check(!bad, name, rc ? err : "read back differs");
        if (!rc) indexed_dataset_close(&ds);
    }

    // a token that does not fit is refused; giving up leaves an existing dataset untouched
    IndexedDatasetBuilder b;
    snprintf(prefix, sizeof prefix, "%s", scratch("copy"));
    int64_t big[] = {1, 70000}, neg[] = {-1};
    rc = builder_open(&b, prefix, DTYPE_UINT16, err, sizeof err);
    int refused = rc == 0 && builder_add_document(&b, big, 2, err, sizeof err) != 0 && strstr(err, "70000");
    refused = refused && builder_add_document(&b, neg, 1, err, sizeof err) != 0;
    check(refused, "builder_refuses_token_outside_dtype", "accepted (%s)", err);
    builder_add_document(&b, big, 1, err, sizeof err);
    builder_abort(&b);
    snprintf(name, sizeof name, "%s.bin", prefix);
    int kept = same_file(name, fixture("corpus_u16.bin"));
    snprintf(name, sizeof name, "%s.idx", prefix);
    kept = kept && same_file(name, fixture("corpus_u16.idx"));
    snprintf(name, sizeof name, "%s.bin.tmp", prefix);
    check(kept && !exists(name), "builder_abort_keeps_old_dataset", "old files changed or temporary left");
    check(builder_open(&b, scratch("no/such/dir/x"), DTYPE_UINT16, err, sizeof err) != 0 && strstr(err, "no/such/dir"),
          "builder_reports_unwritable_path", "%s", err);
    check(builder_open(&b, scratch("f"), DTYPE_FLOAT32, err, sizeof err) != 0, "builder_refuses_float_dtype", "accepted");
}

// ----------------------------------------------------------------------------
// corrupted copies of the fixture are refused, with a message naming the file

// a copy of the fixture's two files in memory, to be damaged
typedef struct {
    uint8_t *idx, *bin;
    size_t idx_len, bin_len;
} Files;
typedef void (*Corruption)(Files* f);

static void put64(uint8_t* p, int64_t v) { memcpy(p, &v, 8); }
static int64_t get64(const uint8_t* p) { int64_t v; memcpy(&v, p, 8); return v; }
enum { SIZES_AT = 34, POINTERS_AT = 34 + 4 * 40, DOC_IDX_AT = 34 + 12 * 40 };

static void bad_magic(Files* f) { f->idx[0] = 'X'; }
static void bad_version(Files* f) { f->idx[9] = 2; }
static void float_dtype(Files* f) { f->idx[17] = DTYPE_FLOAT32; }
static void unknown_dtype(Files* f) { f->idx[17] = 99; }
static void truncated_idx(Files* f) { f->idx_len -= 1; }
static void idx_shorter_than_header(Files* f) { f->idx_len = 20; }
static void huge_count(Files* f) { put64(f->idx + 18, INT64_MAX); }
static void truncated_bin(Files* f) { f->bin_len -= 1; }
static void empty_bin(Files* f) { f->bin_len = 0; }
static void pointer_out_of_range(Files* f) { put64(f->idx + POINTERS_AT + 8 * 39, 1000000); }
static void pointers_decrease(Files* f) { put64(f->idx + POINTERS_AT + 8 * 3, get64(f->idx + POINTERS_AT + 8 * 2) - 2); }
static void pointers_overlap(Files* f) { put64(f->idx + POINTERS_AT + 8 * 3, get64(f->idx + POINTERS_AT + 8 * 2)); }
static void pointer_misaligned(Files* f) { put64(f->idx + POINTERS_AT + 8 * 3, get64(f->idx + POINTERS_AT + 8 * 3) + 1); }
static void negative_size(Files* f) { int32_t v = -1; memcpy(f->idx + SIZES_AT + 4 * 7, &v, 4); }
static void doc_idx_decreases(Files* f) {
    put64(f->idx + DOC_IDX_AT + 8 * 5, 6);
    put64(f->idx + DOC_IDX_AT + 8 * 6, 5);
}
static void doc_idx_not_from_zero(Files* f) { put64(f->idx + DOC_IDX_AT, 1); }
static void doc_idx_short_of_items(Files* f) { put64(f->idx + DOC_IDX_AT + 8 * 40, 39); }

static void test_corruptions(void) {
    static const struct { const char* name; Corruption corrupt; const char* file; const char* says; } cases[] = {
        {"bad_magic", bad_magic, ".idx", "bad magic"},
        {"bad_version", bad_version, ".idx", "version 2"},
        {"float_dtype", float_dtype, ".idx", "dtype code 7"},
        {"unknown_dtype", unknown_dtype, ".idx", "dtype code 99"},
        {"truncated_idx", truncated_idx, ".idx", "841 bytes"},
        {"idx_shorter_than_header", idx_shorter_than_header, ".idx", "header"},
        {"huge_item_count", huge_count, ".idx", "needs 1.1068046444225731e+20"},
        {"truncated_bin", truncated_bin, ".bin", "outside"},
        {"empty_bin", empty_bin, ".bin", "outside"},
        {"pointer_out_of_range", pointer_out_of_range, ".bin", "item 39"},
        {"pointers_decrease", pointers_decrease, ".bin", "decrease"},
        {"pointers_overlap", pointers_overlap, ".bin", "item 3 starts at byte"},
        {"pointer_misaligned", pointer_misaligned, ".bin", "not a multiple of the 2-byte token"},
        {"negative_size", negative_size, ".bin", "negative"},
        {"doc_idx_decreases", doc_idx_decreases, ".idx", "doc_idx decreases"},
        {"doc_idx_not_from_zero", doc_idx_not_from_zero, ".idx", "doc_idx[0]"},
        {"doc_idx_short_of_items", doc_idx_short_of_items, ".idx", "doc_idx ends"},
    };
    size_t idx_len0, bin_len0;
    uint8_t* idx0 = slurp(fixture("corpus_u16.idx"), &idx_len0);
    uint8_t* bin0 = slurp(fixture("corpus_u16.bin"), &bin_len0);
    if (!idx0 || !bin0) { check(0, "corrupt_read_fixture", "cannot read the fixture"); free(idx0); free(bin0); return; }
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        Files f = {(uint8_t*)malloc(idx_len0), (uint8_t*)malloc(bin_len0), idx_len0, bin_len0};
        memcpy(f.idx, idx0, idx_len0);
        memcpy(f.bin, bin0, bin_len0);
        cases[c].corrupt(&f);
        char prefix[8192], path[8300], name[200];
        snprintf(prefix, sizeof prefix, "%s", scratch(cases[c].name));
        snprintf(path, sizeof path, "%s.idx", prefix);
        spit(path, f.idx, f.idx_len);
        snprintf(path, sizeof path, "%s.bin", prefix);
        spit(path, f.bin, f.bin_len);
        IndexedDataset ds;
        err[0] = 0;
        int rc = indexed_dataset_open(&ds, prefix, err, sizeof err);
        snprintf(path, sizeof path, "%s%s", prefix, cases[c].file);
        snprintf(name, sizeof name, "refuses_%s", cases[c].name);
        check(rc != 0 && strstr(err, path) && strstr(err, cases[c].says) && ds.bin == NULL,
              name, rc ? "message \"%s\"" : "accepted%s", err);
        if (rc == 0) indexed_dataset_close(&ds);
        free(f.idx);
        free(f.bin);
    }
    free(idx0);
    free(bin0);
    IndexedDataset ds;
    check(indexed_dataset_open(&ds, scratch("missing"), err, sizeof err) != 0 && strstr(err, "missing.idx"),
          "refuses_missing_files", "%s", err);
    char dir[8300];
    snprintf(dir, sizeof dir, "%s.idx", scratch("a_directory"));
    mkdir(dir, 0755);
    check(indexed_dataset_open(&ds, scratch("a_directory"), err, sizeof err) != 0 && strstr(err, "is a directory, expected a regular file"),
          "refuses_an_idx_that_is_a_directory", "%s", err);
    // a FIFO as the .idx: refused at once (its open blocked until the job was killed: issue 45, item 8)
    snprintf(dir, sizeof dir, "%s.idx", scratch("a_fifo"));
    mkfifo(dir, 0644);
    check(indexed_dataset_open(&ds, scratch("a_fifo"), err, sizeof err) != 0 && strstr(err, "is a FIFO (named pipe), expected a regular file"),
          "refuses_an_idx_that_is_a_fifo", "%s", err);
}

// An .idx must describe its .bin exactly: its last item ends at the .bin's last byte (issue 34,
// item 8). The fixture's .idx beside its .bin with 1,000 bytes appended, a smaller corpus's
// .idx beside the fixture's .bin (it would train on the first 24 bytes), an empty index beside
// tokens: each refused in one line naming both files and both sizes.
static void test_idx_covers_bin(void) {
    size_t idx_len, bin_len;
    uint8_t* idx = slurp(fixture("corpus_u16.idx"), &idx_len);
    uint8_t* bin = slurp(fixture("corpus_u16.bin"), &bin_len);
    if (!idx || !bin) { check(0, "idx_covers_bin_setup", "cannot read the fixture"); free(idx); free(bin); return; }
    uint8_t* longer = (uint8_t*)calloc(bin_len + 1000, 1);
    memcpy(longer, bin, bin_len);
    spit(scratch("longer.idx"), idx, idx_len);
    spit(scratch("longer.bin"), longer, bin_len + 1000);
    IndexedDatasetBuilder b;   // one document: the fixture's first 12 tokens (24 bytes)
    int rc = builder_open(&b, scratch("smaller"), DTYPE_UINT16, err, sizeof err) ||
             builder_add_document(&b, doc_tokens, 12, err, sizeof err) || builder_finish(&b, err, sizeof err) ||
             builder_open(&b, scratch("none"), DTYPE_UINT16, err, sizeof err) || builder_finish(&b, err, sizeof err);
    spit(scratch("smaller.bin"), bin, bin_len);
    spit(scratch("none.bin"), bin, bin_len);
    static const struct { const char* name; const char* prefix; long long idx_bytes, bin_bytes; } cases[] = {
        {"refuses_bin_longer_than_its_index", "longer", 2 * NUM_TOKENS, 2 * NUM_TOKENS + 1000},
        {"refuses_idx_of_a_smaller_corpus", "smaller", 24, 2 * NUM_TOKENS},
        {"refuses_empty_index_beside_tokens", "none", 0, 2 * NUM_TOKENS},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0] && rc == 0; c++) {
        char prefix[8300], idx_path[8400], bin_path[8400], idx_says[64], bin_says[64];
        snprintf(prefix, sizeof prefix, "%s", scratch(cases[c].prefix));
        snprintf(idx_path, sizeof idx_path, "%s.idx", prefix);
        snprintf(bin_path, sizeof bin_path, "%s.bin", prefix);
        snprintf(idx_says, sizeof idx_says, " %lld bytes", cases[c].idx_bytes);
        snprintf(bin_says, sizeof bin_says, " %lld bytes", cases[c].bin_bytes);
        IndexedDataset ds;
        err[0] = 0;
        int opened = indexed_dataset_open(&ds, prefix, err, sizeof err) == 0;
        if (opened) snprintf(err, sizeof err, "accepted, %lld documents", (long long)ds.num_docs);
        check(!opened && strstr(err, idx_path) && strstr(err, bin_path) && strstr(err, idx_says) && strstr(err, bin_says) &&
                  !strchr(err, '\n'), cases[c].name, "%s", err);
        if (opened) indexed_dataset_close(&ds);
    }
    check(rc == 0, "idx_covers_bin_builds", "%s", err);
    free(idx);
    free(bin);
    free(longer);
}

// random damage to the .idx: whatever opens must be safe to read in full (run under ASan)
static void test_random_corruptions(void) {
    size_t idx_len, bin_len;
    uint8_t* idx0 = slurp(fixture("corpus_u16.idx"), &idx_len);
    uint8_t* bin = slurp(fixture("corpus_u16.bin"), &bin_len);
    if (!idx0 || !bin) { check(0, "random_corruptions", "cannot read the fixture"); free(idx0); free(bin); return; }
    char prefix[8192], path[8300];
    snprintf(prefix, sizeof prefix, "%s", scratch("fuzz"));
    snprintf(path, sizeof path, "%s.bin", prefix);
    spit(path, bin, bin_len);
    snprintf(path, sizeof path, "%s.idx", prefix);
    uint64_t x = 88172645463325252ull;   // xorshift64: the same damage every run
    int opened = 0, tries = 400;
    int64_t sum = 0;
    for (int k = 0; k < tries; k++) {
        uint8_t idx[1024];
        memcpy(idx, idx0, idx_len);
        for (int flips = 0; flips < 1 + k % 3; flips++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            idx[34 + x % (idx_len - 34)] = (uint8_t)(x >> 32);   // damage the arrays, not the magic
        }
        spit(path, idx, k % 7 == 0 ? idx_len - (x % 16) : idx_len);
        IndexedDataset ds;
        if (indexed_dataset_open(&ds, prefix, err, sizeof err) != 0) continue;
        opened++;
        for (int64_t i = 0; i < ds.num_items; i++)
            for (int64_t t = 0; t < ds.sizes[i]; t++) sum += indexed_dataset_token(&ds, i, t);
        int64_t lo, hi;
        indexed_dataset_max_token(&ds, &lo, &hi);
        GPTDataset g;
        if (ds.num_items > 0 && gpt_dataset_build(&g, &ds, 0, ds.num_items, 16, 3, 50, err, sizeof err) == 0) {
            int sample[17];
            for (int64_t i = 0; i < g.num_samples; i++) gpt_dataset_get(&g, i, sample);
            gpt_dataset_free(&g);
        }
        indexed_dataset_close(&ds);
    }
    check(opened > 0 && sum >= 0, "random_corruptions_read_safely", "no damaged copy opened (of %d)", tries);
    free(idx0);
    free(bin);
}

// ----------------------------------------------------------------------------
// --split and blending, against Megatron's formulas worked by hand

static void test_splits(void) {
    static const struct { const char* split; int64_t n; int64_t want[4]; } cases[] = {
        {"969,30,1", 40, {0, 39, 40, 40}},        // 38.76 -> 39, 1.2 -> 1, 0.04 -> 0
        {"969/30/1", 1000, {0, 969, 999, 1000}},
        {"100", 7, {0, 7, 7, 7}},                 // one number: padded with 0, 0
        {"1,1,1", 10, {0, 4, 7, 10}},             // 3 + 3 + 3 = 9, one short: every boundary +1
        {"80,20", 5, {0, 4, 5, 5}},
        {"1,1", 5, {0, 3, 5, 5}},                 // 2.5 rounds to 2 (half to even), then +1
        {"1,1,2", 6, {0, 1, 3, 6}},               // 1.5 -> 2, 1.5 -> 2, 3: one over, every boundary -1
        {"0,1,1", 3, {0, -1, 1, 3}},              // Megatron's own result; train is empty
        {"969, 30, 1", 12345, {0, 11963, 12333, 12345}},
        {"949,50,1", 1001, {0, 950, 1000, 1001}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t b[4] = {-9, -9, -9, -9};
        int rc = split_documents(cases[c].split, cases[c].n, b, err, sizeof err);
        char name[128];
        snprintf(name, sizeof name, "split_%s_of_%lld", cases[c].split, (long long)cases[c].n);
        check(rc == 0 && memcmp(b, cases[c].want, sizeof b) == 0, name, "got %lld %lld %lld %lld (%s)", (long long)b[0],
              (long long)b[1], (long long)b[2], (long long)b[3], rc ? err : "");
    }
    int64_t b[4];
    const char* bad[] = {"", "a,b", "0,0,0", "1,-1", "1,,2", "969,30,1,", "nan", "1,2,3,4"};   // Megatron drops a 4th
    int refused = 1;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) refused &= split_documents(bad[i], 10, b, err, sizeof err) != 0;
    check(refused, "split_refuses_bad_strings", "one was accepted");
}

static void test_blending(void) {
    double w[3] = {5, 3, 2};
    int64_t per[3];
    int rc = blend_weights(w, 3, 1000, per, err, sizeof err);
    check(rc == 0 && per[0] == 503 && per[1] == 302 && per[2] == 201, "blend_samples_per_dataset",
          "got %lld %lld %lld", (long long)per[0], (long long)per[1], (long long)per[2]);   // ceil(1000 * w * 1.005)
    BlendIndex bi;
    rc = blend_build(&bi, w, 3, 20, err, sizeof err);
    // worked by hand: at each sample the dataset whose share lags its weight most
    const uint8_t want_d[20] = {0, 1, 2, 0, 1, 0, 2, 0, 1, 0, 0, 1, 2, 0, 1, 0, 2, 0, 1, 0};
    const int64_t want_s[20] = {0, 0, 0, 1, 1, 2, 1, 3, 2, 4, 5, 3, 2, 6, 4, 7, 3, 8, 5, 9};
    check(rc == 0 && memcmp(bi.dataset_index, want_d, 20) == 0 && memcmp(bi.dataset_sample_index, want_s, sizeof want_s) == 0,
          "blend_index_equals_megatron", "differs");
    if (rc == 0) blend_free(&bi);
    double zero[2] = {0, 0};
    check(blend_weights(zero, 2, 10, per, err, sizeof err) != 0, "blend_refuses_zero_weights", "accepted");
}

// ----------------------------------------------------------------------------
// the index cache: .npy files, round trip, stale and damaged caches

static const char* MEGATRON_NPY[3] = {"corpus_u16_train_indexmap_100ns_32sl_1234s_doc_idx.npy",
                                      "corpus_u16_train_indexmap_100ns_32sl_1234s_sample_idx.npy",
                                      "corpus_u16_train_indexmap_100ns_32sl_1234s_shuffle_idx.npy"};

// a and b hold the same index (b may come from the cache, with a uint32 shuffle_idx)
static int same_index(const GPTDataset* a, const GPTDataset* b) {
    int same = a->num_samples == b->num_samples && a->doc_idx_len == b->doc_idx_len && a->num_epochs == b->num_epochs &&
               a->separate_last_epoch == b->separate_last_epoch &&
               memcmp(a->doc_idx, b->doc_idx, (size_t)a->doc_idx_len * 4) == 0 &&
               memcmp(a->sample_idx, b->sample_idx, (size_t)(a->num_samples + 1) * 8) == 0;
    for (int64_t i = 0; same && i < a->num_samples; i++) same = shuffle_at(a, i) == shuffle_at(b, i);
    return same;
}

// Megatron's own .npy files parse, equal our arrays, and our writer reproduces them byte for byte
static void test_npy_fixture(void) {
    IndexedDataset ds;
    GPTDataset g;
    if (indexed_dataset_open(&ds, fixture("corpus_u16"), err, sizeof err) ||
        gpt_dataset_build(&g, &ds, 0, NUM_DOCS, 32, 1234, 100, err, sizeof err)) {
        check(0, "npy_fixture_setup", "%s", err);
        return;
    }
    NpyArray a[3];
    const char* want_descr[3] = {"<i4", "<i4", "<u4"};
    const int64_t want_rows[3] = {40, 196, 195};
    int bad = 0;
    for (int k = 0; k < 3; k++) {
        if (npy_map(&a[k], fixture(MEGATRON_NPY[k]), err, sizeof err)) { check(0, "npy_reads_megatron_files", "%s", err); return; }
        bad |= strcmp(a[k].descr, want_descr[k]) || a[k].ndim != (k == 1 ? 2 : 1) || a[k].shape[0] != want_rows[k];
    }
    check(!bad, "npy_reads_megatron_headers", "descr or shape differs");
    const uint32_t* shuffle = (const uint32_t*)a[2].data;
    bad = memcmp(a[0].data, g.doc_idx, 40 * 4) || memcmp(a[1].data, g.sample_idx, 196 * 8);
    for (int i = 0; i < 195; i++) bad |= shuffle[i] != g.shuffle_idx[i];
    check(!bad, "npy_megatron_arrays_equal_ours", "differ");
    for (int k = 0; k < 3; k++) munmap(a[k].map, a[k].map_bytes);

    uint32_t narrow[195];
    for (int i = 0; i < 195; i++) narrow[i] = (uint32_t)g.shuffle_idx[i];
    int rc = npy_write(scratch("d.npy"), "<i4", 40, 0, g.doc_idx, 4, NULL, err, sizeof err) ||
             npy_write(scratch("s.npy"), "<i4", 196, 2, g.sample_idx, 4, NULL, err, sizeof err) ||
             npy_write(scratch("h.npy"), "<u4", 195, 0, narrow, 4, NULL, err, sizeof err);
    check(rc == 0 && same_file(scratch("d.npy"), fixture(MEGATRON_NPY[0])) &&
              same_file(scratch("s.npy"), fixture(MEGATRON_NPY[1])) && same_file(scratch("h.npy"), fixture(MEGATRON_NPY[2])),
          "npy_write_is_byte_identical_to_np_save", "%s", rc ? err : "bytes differ");
    gpt_dataset_free(&g);
    indexed_dataset_close(&ds);
}

static int count_scratch_files(const char* part) {
    DIR* d = opendir(TMP);
    int n = 0;
    for (struct dirent* e; d && (e = readdir(d)) != NULL;) n += strstr(e->d_name, part) != NULL;
    if (d) closedir(d);
    return n;
}

// gpt_dataset_open_cached for a train split of seq_length 32
static int open_cached(GPTDataset* g, const IndexedDataset* ds, int64_t b, int64_t e, uint64_t seed, int64_t ns,
                       const char* dir, int may_build) {
    return gpt_dataset_open_cached(g, ds, "train", b, e, 32, seed, ns, dir, may_build, err, sizeof err);
}

static void test_cache_roundtrip(void) {
    // a writable copy of the fixture, so the cache can go beside the data (cache_dir NULL)
    IndexedDataset ds;
    GPTDataset ref, g, h;
    if (write_fixture_docs(scratch("cached"), DTYPE_UINT16) || indexed_dataset_open(&ds, scratch("cached"), err, sizeof err) ||
        gpt_dataset_build(&ref, &ds, 0, NUM_DOCS, 32, 1234, 100, err, sizeof err)) {
        check(0, "cache_setup", "%s", err);
        return;
    }
    int rc = open_cached(&g, &ds, 0, NUM_DOCS, 1234, 100, NULL, 0);
    check(rc == DATA_NO_CACHE && strstr(err, "doc_idx.npy") && strstr(err, "may not build"), "cache_missing_refused_without_build",
          "rc %d: %s", rc, err);
    rc = open_cached(&g, &ds, 0, NUM_DOCS, 1234, 100, NULL, 1);
    char stem[8300];
    snprintf(stem, sizeof stem, "%s_train_indexmap_100ns_32sl_1234s_", scratch("cached"));
    check(rc == 0 && g.built && g.maps[0] && strncmp(g.cache_stem, stem, strlen(stem)) == 0 && strlen(g.cache_stem) == strlen(stem) + 16,
          "cache_built_beside_data_with_hash_in_name", "rc %d (%s), stem %s", rc, err, g.cache_stem);
    check(rc == 0 && same_index(&ref, &g) && g.shuffle_idx_u32 && !g.shuffle_idx, "cache_built_equals_gpt_build", "differs");
    check(count_scratch_files(".tmp") == 0 && count_scratch_files("cached_train_indexmap") == 4 &&
              count_scratch_files("cached_train_indexmap_100ns_32sl_1234s_") == 4 && count_scratch_files("_crc32.txt") == 1,
          "cache_writes_three_arrays_and_checksums_no_temporaries", "%d temporaries, %d cache files",
          count_scratch_files(".tmp"), count_scratch_files("cached_train_indexmap"));
    rc = open_cached(&h, &ds, 0, NUM_DOCS, 1234, 100, NULL, 0);
    int same = rc == 0 && !h.built && same_index(&ref, &h);
    int s1[33], s2[33];
    for (int64_t i = 0; same && i < ref.num_samples; i++) {
        gpt_dataset_get(&ref, i, s1);
        gpt_dataset_get(&h, i, s2);
        same = memcmp(s1, s2, sizeof s1) == 0;
    }
    check(same, "cache_loaded_without_build_is_identical", "rc %d: %s", rc, err);
    gpt_dataset_free(&h);
    // Megatron writes shuffle_idx as int64 from 2^32-1 samples on: such a file reads too
    char path[8300];
    snprintf(path, sizeof path, "%s_shuffle_idx.npy", g.cache_stem);
    uint32_t crc[3];   // (its checksum too, or the cache would not be trusted)
    for (int k = 0; k < 2; k++) {
        char array[8300];
        size_t len = 0;
        snprintf(array, sizeof array, "%s_%s.npy", g.cache_stem, INDEX_FILES[k]);
        uint8_t* bytes = slurp(array, &len);
        crc[k] = bytes ? crc32_bytes(0, bytes, len) : 0;
        free(bytes);
    }
    rc = npy_write(path, "<i8", ref.num_samples, 0, ref.shuffle_idx, 8, &crc[2], err, sizeof err) ||
         write_checksums(&g, crc, err, sizeof err) || open_cached(&h, &ds, 0, NUM_DOCS, 1234, 100, NULL, 0);
    gpt_dataset_free(&g);
    check(rc == 0 && h.shuffle_idx && !h.shuffle_idx_u32 && same_index(&ref, &h), "cache_reads_int64_shuffle_idx", "rc %d: %s", rc, err);
    gpt_dataset_free(&h);

    // a stale cache is never used: other seed, document range or sample count -> another name
    static const struct { const char* name; int64_t b, e; uint64_t seed; int64_t ns; } stale[] = {
        {"cache_other_seed_not_used", 0, NUM_DOCS, 1235, 100},
        {"cache_other_split_not_used", 0, 39, 1234, 100},
        {"cache_other_split_start_not_used", 1, NUM_DOCS, 1234, 100},
        {"cache_other_num_samples_not_used", 0, NUM_DOCS, 1234, 101},
    };
    for (size_t c = 0; c < sizeof stale / sizeof stale[0]; c++) {
        rc = open_cached(&g, &ds, stale[c].b, stale[c].e, stale[c].seed, stale[c].ns, NULL, 0);
        int refused = rc == DATA_NO_CACHE;
        rc = open_cached(&g, &ds, stale[c].b, stale[c].e, stale[c].seed, stale[c].ns, NULL, 1);
        gpt_dataset_build(&h, &ds, stale[c].b, stale[c].e, 32, stale[c].seed, stale[c].ns, err, sizeof err);
        check(refused && rc == 0 && g.built && same_index(&h, &g), stale[c].name, "refused %d, rc %d: %s", refused, rc, err);
        gpt_dataset_free(&g);
        gpt_dataset_free(&h);
    }
    // the same dataset rewritten in place with one document a token shorter: the cache is stale
    indexed_dataset_close(&ds);
    IndexedDatasetBuilder b;
    rc = builder_open(&b, scratch("cached"), DTYPE_UINT16, err, sizeof err);
    for (int d = 0; d < NUM_DOCS && rc == 0; d++)
        rc = builder_add_document(&b, doc_tokens + doc_start[d], doc_start[d + 1] - doc_start[d] - (d == 7), err, sizeof err);
    rc = rc || builder_finish(&b, err, sizeof err) || indexed_dataset_open(&ds, scratch("cached"), err, sizeof err);
    check(rc == 0 && open_cached(&g, &ds, 0, NUM_DOCS, 1234, 100, NULL, 0) == DATA_NO_CACHE, "cache_of_rewritten_dataset_not_used",
          "the old index was accepted");
    gpt_dataset_free(&g);
    gpt_dataset_free(&ref);
    indexed_dataset_close(&ds);
}

// damage one byte range of a cache file: what is written at offset (a negative length truncates)
typedef struct { const char* name; int file; long offset; const char* bytes; int len; const char* says; } Damage;

static void test_cache_damage(void) {
    IndexedDataset ds;
    GPTDataset ref, g;
    if (indexed_dataset_open(&ds, fixture("corpus_u16"), err, sizeof err) ||
        gpt_dataset_build(&ref, &ds, 0, NUM_DOCS, 32, 1234, 100, err, sizeof err)) {
        check(0, "cache_damage_setup", "%s", err);
        return;
    }
    const int32_t forty = 40, big = 1000, off = 500;
    const uint32_t ns = 195;
    const Damage cases[] = {   // the fixture's .npy headers are 128 bytes
        {"truncated", 0, 0, NULL, -4, "does not match"},
        {"empty", 1, 0, NULL, -2000, "empty"},
        {"bad_magic", 1, 0, "\x93NUMPZ", 6, "bad magic"},
        {"bad_version", 2, 6, "\x03", 1, "version 3.0"},
        {"bad_descr", 0, 23, "8", 1, "does not match"},          // '<i4' -> '<i8'
        {"fortran_order", 0, 44, "True ", 5, "fortran_order"},
        {"bad_shape", 2, 63, "6", 1, "does not match"},           // (195,) -> (196,)
        {"doc_idx_out_of_range", 0, 128 + 4 * 3, (const char*)&forty, 4, "outside documents [0, 40)"},
        {"sample_idx_row_out_of_order", 1, 128 + 8 * 100, (const char*)&big, 4, "row 100"},
        {"sample_idx_offset_past_document", 1, 128 + 8 * 50 + 4, (const char*)&off, 4, "row 50"},
        {"shuffle_idx_out_of_range", 2, 128 + 4 * 194, (const char*)&ns, 4, "entry 194 = 195"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const Damage* dm = &cases[c];
        char name[128], path[8300];
        int rc = open_cached(&g, &ds, 0, NUM_DOCS, 1234, 100, TMP, 1);   // a valid cache first
        snprintf(path, sizeof path, "%s_%s.npy", g.cache_stem, INDEX_FILES[dm->file]);
        gpt_dataset_free(&g);
        size_t len = 0;
        uint8_t* bytes = slurp(path, &len);
        if (rc || bytes == NULL) { check(0, "cache_damage_setup", "%s", err); free(bytes); continue; }
        if (dm->len < 0) len = (long)len + dm->len > 0 ? len + dm->len : 0;
        else memcpy(bytes + dm->offset, dm->bytes, (size_t)dm->len);
        spit(path, bytes, len);
        free(bytes);
        rc = open_cached(&g, &ds, 0, NUM_DOCS, 1234, 100, TMP, 0);
        snprintf(name, sizeof name, "cache_%s_refused", dm->name);
        check(rc == DATA_NO_CACHE && strstr(err, path) && strstr(err, dm->says), name, "rc %d: %s", rc, err);
        gpt_dataset_free(&g);
        rc = open_cached(&g, &ds, 0, NUM_DOCS, 1234, 100, TMP, 1);
        snprintf(name, sizeof name, "cache_%s_rebuilt", dm->name);
        check(rc == 0 && g.built && same_index(&ref, &g) && same_file(path, fixture(MEGATRON_NPY[dm->file])), name, "rc %d: %s", rc, err);
        gpt_dataset_free(&g);
    }
    gpt_dataset_free(&ref);
    indexed_dataset_close(&ds);
}

// random damage to the cache files: whatever is accepted must be safe to read in full (ASan)
static void test_cache_random_damage(void) {
    IndexedDataset ds;
    GPTDataset g;
    uint8_t* good[3] = {NULL, NULL, NULL};
    size_t len[3] = {0, 0, 0};
    char path[3][8300];
    int rc = indexed_dataset_open(&ds, fixture("corpus_u16"), err, sizeof err) || open_cached(&g, &ds, 0, NUM_DOCS, 1234, 100, TMP, 1);
    for (int k = 0; k < 3 && rc == 0; k++) {
        snprintf(path[k], sizeof path[k], "%s_%s.npy", g.cache_stem, INDEX_FILES[k]);
        good[k] = slurp(path[k], &len[k]);
    }
    gpt_dataset_free(&g);
    uint64_t x = 2463534242ull;   // xorshift64: the same damage every run
    int accepted = 0, accepted_changed = 0, tries = 300, sample[33];
    for (int t = 0; t < tries && rc == 0; t++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        int k = (int)(x % 3);
        uint8_t* bytes = (uint8_t*)malloc(len[k]);
        memcpy(bytes, good[k], len[k]);
        for (int flips = 0; flips < 1 + t % 3; flips++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            size_t at = t % 2 ? 8 + x % 120 : 128 + x % (len[k] - 128);   // the header, or the data
            bytes[at] = (uint8_t)(x >> 40);
        }
        size_t damaged_len = t % 5 == 0 ? len[k] - x % 9 : len[k];
        int changed = damaged_len != len[k] || memcmp(bytes, good[k], len[k]) != 0;   // (a flip may write the same byte)
        spit(path[k], bytes, damaged_len);
        free(bytes);
        if (open_cached(&g, &ds, 0, NUM_DOCS, 1234, 100, TMP, 0) == 0) {
            accepted++;
            accepted_changed += changed;
            for (int64_t i = 0; i < g.num_samples; i++) gpt_dataset_get(&g, i, sample);
        }
        gpt_dataset_free(&g);
        spit(path[k], good[k], len[k]);
    }
    check(rc == 0 && accepted < tries, "cache_random_damage_read_safely", "rc %d, %d of %d damaged caches accepted", rc, accepted, tries);
    check(rc == 0 && accepted_changed == 0, "cache_random_damage_every_change_refused", "%d changed caches of %d accepted",
          accepted_changed, tries);
    for (int k = 0; k < 3; k++) free(good[k]);
    indexed_dataset_close(&ds);
}

// the CRC-32 of the cache's checksums is zlib's: its check value, and the same in pieces
static void test_crc32(void) {
    const char* digits = "123456789";
    uint8_t bytes[1001];
    for (int i = 0; i < 1001; i++) bytes[i] = (uint8_t)(i * 2654435761u >> 13);
    uint32_t whole = crc32_bytes(0, bytes, 1001), pieces = crc32_bytes(crc32_bytes(crc32_bytes(0, bytes, 3), bytes + 3, 500), bytes + 503, 498);
    check(crc32_bytes(0, digits, 9) == 0xcbf43926u && crc32_bytes(0, digits, 0) == 0 && whole == pieces, "crc32_is_zlibs",
          "check value %08x (zlib: cbf43926), whole %08x, in pieces %08x", crc32_bytes(0, digits, 9), whole, pieces);
}

// what data_splits_print says
static char* printed(const DataSplits* d) {
    char* text = NULL;
    size_t len = 0;
    FILE* f = open_memstream(&text, &len);
    if (f == NULL) return NULL;
    data_splits_print(d, f);
    fclose(f);
    return text;
}

static int count_lines_with(const char* text, const char* part) {
    int n = 0;
    for (const char* p = text; p && (p = strstr(p, part)) != NULL; p++) n++;
    return n;
}

// A built cache with one entry of one array replaced by another in-range value (issue 34,
// item 9): the structural checks cannot see every such change (any order of documents of equal
// length passes them; so does a shuffle_idx entry that names another sample), the checksums
// do. The damaged cache is refused where this process may not build, and rebuilt, in one
// line that says so, where it may: the arrays come back clean.
static void test_cache_checksum(void) {
    IndexedDatasetBuilder b;
    int64_t doc[20];
    int rc = builder_open(&b, scratch("even"), DTYPE_UINT16, err, sizeof err);
    for (int d = 0; d < 24 && rc == 0; d++) {   // 24 documents of 20 tokens
        for (int t = 0; t < 20; t++) doc[t] = 100 * d + t;
        rc = builder_add_document(&b, doc, 20, err, sizeof err);
    }
    IndexedDataset ds;
    GPTDataset ref;
    rc = rc || builder_finish(&b, err, sizeof err) || indexed_dataset_open(&ds, scratch("even"), err, sizeof err) ||
         gpt_dataset_build(&ref, &ds, 0, 24, 16, 1234, 60, err, sizeof err);
    if (rc) { check(0, "cache_checksum_setup", "%s", err); return; }
    char prefix[8300];
    snprintf(prefix, sizeof prefix, "%s", scratch("even"));
    const char* path[] = {prefix};
    const int64_t ns[3] = {60, 0, 0};
    for (int k = 0; k < 3; k++) {
        DataSplits d;
        char file[8300], name[128];
        rc = data_splits_open(&d, path, 1, "100,0,0", 16, 1234, ns, TMP, 1, err, sizeof err);   // a clean cache
        if (rc == 0) snprintf(file, sizeof file, "%s_%s.npy", d.prefix[0].split[0].cache_stem, INDEX_FILES[k]);
        if (rc == 0) data_splits_close(&d);
        size_t len = 0;
        uint8_t* bytes = rc ? NULL : slurp(file, &len);
        NpyArray a;
        memset(&a, 0, sizeof a);
        if (bytes == NULL || npy_parse(&a, bytes, len, err, sizeof err)) { check(0, "cache_checksum_setup", "%s", err); free(bytes); continue; }
        uint8_t* data = bytes + ((const uint8_t*)a.data - bytes);
        if (k == 1) memcpy(data + 8 * 3 + 4, data + 8 * 4 + 4, 4);   // row 3's offset := row 4's
        else memcpy(data, data + 4, 4);                               // entry 0 := entry 1
        spit(file, bytes, len);
        free(bytes);
        rc = data_splits_open(&d, path, 1, "100,0,0", 16, 1234, ns, TMP, 0, err, sizeof err);
        snprintf(name, sizeof name, "cache_damaged_%s_refused", INDEX_FILES[k]);
        check(rc == DATA_NO_CACHE && strstr(err, file), name, "rc %d: %s", rc, rc ? err : "the damaged cache was used");
        if (rc == 0) data_splits_close(&d);
        rc = data_splits_open(&d, path, 1, "100,0,0", 16, 1234, ns, TMP, 1, err, sizeof err);
        char* said = rc ? NULL : printed(&d);
        snprintf(name, sizeof name, "cache_damaged_%s_rebuilt_in_one_line", INDEX_FILES[k]);
        check(rc == 0 && d.prefix[0].split[0].built && same_index(&ref, &d.prefix[0].split[0]) && said &&
                  count_lines_with(said, "rebuilt") == 1 && strstr(said, INDEX_FILES[k]),
              name, "rc %d: %s", rc, rc ? err : said ? said : "");
        free(said);
        if (rc == 0) data_splits_close(&d);
    }
    gpt_dataset_free(&ref);
    indexed_dataset_close(&ds);
}

// A sample-index build killed mid-write (kill -9) leaves NAME.npy.tmpPID (a file the size of
// the array) behind (issue 34, item 16). The next build removes each one whose writer is no
// longer running on this host, in one line; one whose writer still runs (here: this process),
// one written on another host, and other files are left alone.
static void test_stale_temporaries(void) {
    char dir[8300], host[256] = "";
    snprintf(dir, sizeof dir, "%s", scratch("cache_dir"));
    mkdir(dir, 0755);
    gethostname(host, sizeof host - 1);
    pid_t dead = fork();   // a pid that ran, and runs no more
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    const char* stem = "corpus_u16_train_indexmap_100ns_32sl_1234s_0123456789abcdef";
    char files[6][9000];
    snprintf(files[0], sizeof files[0], "%s/%s_sample_idx.npy.tmp%d", dir, stem, (int)dead);               // stale
    snprintf(files[1], sizeof files[1], "%s/%s_doc_idx.npy.tmp%d.%s", dir, stem, (int)dead, host);         // stale
    snprintf(files[2], sizeof files[2], "%s/%s_shuffle_idx.npy.tmp%d.%s", dir, stem, (int)getpid(), host); // alive
    snprintf(files[3], sizeof files[3], "%s/%s_shuffle_idx.npy.tmp%d.another-host", dir, stem, (int)dead); // elsewhere
    snprintf(files[4], sizeof files[4], "%s/notes.npy.tmp%d", dir, (int)dead);                             // not ours
    snprintf(files[5], sizeof files[5], "%s/%s_doc_idx.npy.tmpx%d", dir, stem, (int)dead);                 // not ours
    for (int i = 0; i < 6; i++) spit(files[i], "partial", 7);
    char prefix[8300];
    snprintf(prefix, sizeof prefix, "%s", fixture("corpus_u16"));
    const char* path[] = {prefix};
    const int64_t ns[3] = {100, 0, 0};
    DataSplits d;
    int rc = data_splits_open(&d, path, 1, "100,0,0", 32, 1234, ns, dir, 1, err, sizeof err);
    char* said = rc ? NULL : printed(&d);
    check(rc == 0 && said && count_lines_with(said, "removed 2 ") == 1 && count_lines_with(said, dir) >= 1 &&
              !exists(files[0]) && !exists(files[1]),
          "stale_index_temporaries_removed_in_one_line", "rc %d, %s left: %s", rc, exists(files[0]) ? "legacy" : exists(files[1]) ? "host-named" : "none",
          rc ? err : said ? said : "");
    check(exists(files[2]) && exists(files[3]) && exists(files[4]) && exists(files[5]), "live_and_foreign_temporaries_left_alone",
          "%d %d %d %d", exists(files[2]), exists(files[3]), exists(files[4]), exists(files[5]));
    free(said);
    if (rc == 0) data_splits_close(&d);
}

// ----------------------------------------------------------------------------
// DataSplits: --data-path, --split and blending together

// order-0 entropy of the mixture sum_k w[k] * (token frequencies of documents [b[k], e[k]))
static double entropy_of_docs(int n, const double* w, const int* b, const int* e) {
    static double p[50257];
    memset(p, 0, sizeof p);
    for (int k = 0; k < n; k++) {
        int64_t total = doc_start[e[k]] - doc_start[b[k]];
        for (int64_t t = doc_start[b[k]]; t < doc_start[e[k]]; t++) p[doc_tokens[t]] += w[k] / (double)total;
    }
    double h = 0;
    for (int v = 0; v < 50257; v++)
        if (p[v] > 0) h -= p[v] * log(p[v]);
    return h;
}

static int open_splits(DataSplits* d, const char** path, int count, const char* split, int seq, int64_t n0, int64_t n1, int64_t n2) {
    const int64_t ns[3] = {n0, n1, n2};
    return data_splits_open(d, path, count, split, seq, 1234, ns, TMP, 1, err, sizeof err);
}

static void test_data_splits_single(void) {
    DataSplits d;
    char prefix[8300];
    snprintf(prefix, sizeof prefix, "%s", fixture("corpus_u16"));   // fixture() reuses its buffer
    const char* one[] = {prefix};
    int rc = open_splits(&d, one, 1, "100,0,0", 32, 100, 0, 0);
    static int64_t want[5 * 33];
    int64_t n = read_ints(fixture("corpus_u16_train_indexmap_100ns_32sl_1234s_samples_first5.txt"), want, 5 * 33);
    int bad = rc != 0 || n != 5 * 33 || d.weighted[0] || !data_splits_has(&d, 0) || data_splits_has(&d, 1) ||
              data_splits_has(&d, 2) || d.num_samples[0] != 195;
    int sample[33];
    for (int i = 0; i < 5 && !bad; i++) {
        data_splits_get(&d, 0, i, sample);
        for (int t = 0; t < 33; t++) bad |= sample[t] != want[33 * i + t];
    }
    check(!bad, "splits_single_prefix_is_megatron_gpt_dataset", "rc %d: %s", rc, err);
    int64_t max_id = -1;
    rc = data_splits_check_vocab(&d, 50257, &max_id, err, sizeof err);
    check(rc == 0 && max_id == 50256, "vocab_check_passes", "rc %d, max %lld: %s", rc, (long long)max_id, err);
    // the first document holding an id >= 50000, from docs.json
    int first_doc = -1, first_pos = -1;
    for (int doc = 0; doc < NUM_DOCS && first_doc < 0; doc++)
        for (int64_t t = doc_start[doc]; t < doc_start[doc + 1] && first_doc < 0; t++)
            if (doc_tokens[t] >= 50000) { first_doc = doc; first_pos = (int)(t - doc_start[doc]); }
    char says[64];
    snprintf(says, sizeof says, "corpus_u16.bin: document %d, token %d:", first_doc, first_pos);
    rc = data_splits_check_vocab(&d, 50000, &max_id, err, sizeof err);
    check(rc != 0 && strstr(err, says) && strstr(err, "[0, 50000)"), "vocab_check_names_file_and_document", "rc %d: %s (want %s)", rc, err, says);
    const int b[1] = {0}, e[1] = {NUM_DOCS};
    const double w[1] = {1.0};
    double h = data_splits_unigram_entropy(&d, 50257), want_h = entropy_of_docs(1, w, b, e);
    check(fabs(h - want_h) < 1e-9, "unigram_entropy_of_train_split", "%.9f, expected %.9f", h, want_h);
    data_splits_close(&d);

    rc = open_splits(&d, one, 1, "100,0,0", 32, 100, 10, 0);   // Megatron: no valid dataset, no evaluation
    check(rc == 0 && data_splits_has(&d, 0) && !data_splits_has(&d, 1), "splits_empty_valid_is_absent", "rc %d: %s", rc, err);
    if (rc == 0) data_splits_close(&d);
    rc = open_splits(&d, one, 1, "0,50,50", 32, 100, 10, 0);
    check(rc == 1 && strstr(err, "corpus_u16") && strstr(err, "train split without documents"), "splits_empty_train_is_an_error",
          "rc %d: %s", rc, err);
    rc = open_splits(&d, one, 1, "969,30,1", 32, 100, 20, 5);   // 40 documents: train [0, 39) valid [39, 40) test none
    check(rc == 0 && data_splits_has(&d, 0) && data_splits_has(&d, 1) && !data_splits_has(&d, 2) && d.prefix[0].bounds[1] == 39,
          "splits_empty_test_is_absent", "rc %d: %s", rc, err);
    if (rc == 0) data_splits_close(&d);
    const int64_t ns[3] = {100, 0, 0};
    char dir[8300];
    snprintf(dir, sizeof dir, "%s", scratch("nowhere"));
    rc = data_splits_open(&d, one, 1, "100,0,0", 32, 99, ns, dir, 0, err, sizeof err);
    check(rc == DATA_NO_CACHE, "splits_without_cache_and_build_say_so", "rc %d: %s", rc, err);
}

static void test_data_splits_blend(void) {
    // a second dataset: the fixture's documents 20..39
    IndexedDatasetBuilder b;
    int rc = builder_open(&b, scratch("half"), DTYPE_UINT16, err, sizeof err);
    for (int doc = 20; doc < NUM_DOCS && rc == 0; doc++)
        rc = builder_add_document(&b, doc_tokens + doc_start[doc], doc_start[doc + 1] - doc_start[doc], err, sizeof err);
    if (rc || builder_finish(&b, err, sizeof err)) { check(0, "blend_setup", "%s", err); return; }
    char half[8300], full[8300];
    snprintf(half, sizeof half, "%s", scratch("half"));
    snprintf(full, sizeof full, "%s", fixture("corpus_u16"));
    const char* path[] = {"0.3", full, "0.7", half};
    DataSplits d;
    rc = open_splits(&d, path, 4, "100,0,0", 16, 50, 0, 0);
    check(rc == 0 && d.weighted[0] && d.num_prefixes == 2 && fabs(d.prefix[0].weight - 0.3) < 1e-15 &&
              d.prefix[0].requested[0] == 16 && d.prefix[1].requested[0] == 36,   // ceil(50 * w * 1.005)
          "blend_weights_and_per_dataset_samples", "rc %d: %s", rc, err);
    if (rc) return;
    // each prefix's dataset is the plain GPTDataset for its count; the blend spans all of them
    IndexedDataset ds[2];
    GPTDataset g[2];
    rc = indexed_dataset_open(&ds[0], full, err, sizeof err) || indexed_dataset_open(&ds[1], half, err, sizeof err) ||
         gpt_dataset_build(&g[0], &ds[0], 0, 40, 16, 1234, 16, err, sizeof err) ||
         gpt_dataset_build(&g[1], &ds[1], 0, 20, 16, 1234, 36, err, sizeof err);
    check(rc == 0 && same_index(&g[0], &d.prefix[0].split[0]) && same_index(&g[1], &d.prefix[1].split[0]) &&
              d.num_samples[0] == g[0].num_samples + g[1].num_samples && d.blend[0].size == d.num_samples[0],
          "blend_datasets_are_plain_gpt_datasets", "rc %d: %s", rc, err);
    // worked by hand: at each sample the dataset whose share lags 0.3 / 0.7 the most
    const uint8_t want_d[10] = {1, 0, 1, 1, 0, 1, 1, 0, 1, 1};
    const int64_t want_s[10] = {0, 0, 1, 2, 1, 3, 4, 2, 5, 6};
    int bad = memcmp(d.blend[0].dataset_index, want_d, 10) || memcmp(d.blend[0].dataset_sample_index, want_s, sizeof want_s);
    int s1[17], s2[17];
    for (int i = 0; i < 10 && !bad; i++) {
        data_splits_get(&d, 0, i, s1);
        gpt_dataset_get(&g[want_d[i]], want_s[i], s2);
        bad = memcmp(s1, s2, sizeof s1) != 0;
    }
    check(!bad && rc == 0, "blend_sample_order_equals_hand_computed", "differs");
    const int eb[2] = {0, 20}, ee[2] = {NUM_DOCS, NUM_DOCS};
    const double w[2] = {0.3, 0.7};
    double h = data_splits_unigram_entropy(&d, 50257), want_h = entropy_of_docs(2, w, eb, ee);
    check(fabs(h - want_h) < 1e-9, "unigram_entropy_of_blend", "%.9f, expected %.9f", h, want_h);
    for (int k = 0; k < 2 && rc == 0; k++) { gpt_dataset_free(&g[k]); indexed_dataset_close(&ds[k]); }
    data_splits_close(&d);

    // one weighted pair still goes through blending: the 0.5% margin, the same order
    const char* pair[] = {"1", full};
    rc = open_splits(&d, pair, 2, "100,0,0", 32, 100, 0, 0);
    static int64_t want[5 * 33];
    read_ints(fixture("corpus_u16_train_indexmap_100ns_32sl_1234s_samples_first5.txt"), want, 5 * 33);
    bad = rc || !d.weighted[0] || d.prefix[0].requested[0] != 101;
    int sample[33];
    for (int i = 0; i < 5 && !bad; i++) {
        data_splits_get(&d, 0, i, sample);
        for (int t = 0; t < 33; t++) bad |= sample[t] != want[33 * i + t];
    }
    check(!bad, "blend_of_one_pair", "rc %d: %s", rc, err);
    if (rc == 0) data_splits_close(&d);

    static const struct { const char* name; const char* v[4]; int n; const char* says; } malformed[] = {
        {"odd_count", {"0.5", "a", "b"}, 3, "3 values"},
        {"not_a_weight", {"x", "a", "1", "b"}, 4, "'x' is not a weight"},
        {"negative_weight", {"-1", "a", "1", "b"}, 4, "'-1' is not a weight"},
        {"zero_weights", {"0", "a", "0", "b"}, 4, "adding up"},
        {"empty", {NULL}, 0, "0 values"},
    };
    for (size_t c = 0; c < sizeof malformed / sizeof malformed[0]; c++) {
        const char* v[4];
        for (int i = 0; i < 4; i++)   // "a", "b": real prefixes
            v[i] = malformed[c].v[i] && strchr("ab", malformed[c].v[i][0]) ? full : malformed[c].v[i];
        char name[128];
        snprintf(name, sizeof name, "data_path_refuses_%s", malformed[c].name);
        rc = open_splits(&d, v, malformed[c].n, "100,0,0", 32, 100, 0, 0);
        check(rc == 1 && strstr(err, malformed[c].says) && d.prefix == NULL, name, "rc %d: %s", rc, err);
    }
}

// ----------------------------------------------------------------------------
// the preprocess program

// run preprocess_main on a NULL-terminated argument list, its stdout captured into
// scratch("stdout.txt") and its stderr into err
static int run_preprocess(const char** args) {
    char* argv[32] = {(char*)"preprocess"};
    int argc = 1;
    while (argc < 31 && args[argc - 1]) { argv[argc] = (char*)args[argc - 1]; argc++; }
    char captured[8300];
    snprintf(captured, sizeof captured, "%s", scratch("stderr.txt"));
    fflush(stdout);
    fflush(stderr);
    int out = dup(1), errfd = dup(2);
    int out_fd = open(scratch("stdout.txt"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int cap = open(captured, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out_fd, 1);
    dup2(cap, 2);
    int rc = preprocess_main(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(out, 1);
    dup2(errfd, 2);
    close(out); close(errfd); close(out_fd); close(cap);
    size_t len;
    char* text = (char*)slurp(captured, &len);
    snprintf(err, sizeof err, "%s", text ? text : "");
    free(text);
    return rc;
}
#define PP(...) run_preprocess((const char*[]){__VA_ARGS__, NULL})

// the dataset at prefix holds exactly these documents (each a list ending in -9)
static int holds(const char* prefix, int dtype_code, const int64_t* docs, char* why, size_t whylen) {
    IndexedDataset ds;
    if (indexed_dataset_open(&ds, prefix, why, whylen)) return 0;
    int64_t d = 0, ok = ds.dtype_code == dtype_code;
    if (!ok) snprintf(why, whylen, "dtype %d", ds.dtype_code);
    for (const int64_t* p = docs; ok && *p != -10; d++) {
        int64_t n = 0;
        while (p[n] != -9) n++;
        ok = d < ds.num_items && ds.sizes[d] == n;
        for (int64_t t = 0; ok && t < n; t++) ok = indexed_dataset_token(&ds, d, t) == p[t];
        if (!ok) snprintf(why, whylen, "document %lld differs", (long long)d);
        p += n + 1;
    }
    if (ok && d != ds.num_docs) { ok = 0; snprintf(why, whylen, "%lld documents, expected %lld", (long long)ds.num_docs, (long long)d); }
    indexed_dataset_close(&ds);
    return (int)ok;
}

static void test_preprocess(void) {
    char why[512] = "";
    const char* jsonl =
        "{\"id\": 1, \"title\": \"\", \"text\": \"h\\u00e9llo \\\"q\\\" \\\\ \\n\", \"meta\": {\"a\": [1, \"x}\"], \"b\": null}}\n"
        "{\"other\": true, \"text\": \"\\ud83d\\ude00!\", \"title\": \"T\"}\n"
        "\n"
        "{\"text\": \"\", \"title\": \"\"}\n"
        "  {\"title\": \"ab\",\"text\":\"ab\"}  \r\n";
    spit(scratch("in.jsonl"), jsonl, strlen(jsonl));
    int rc = PP("--input", scratch("in.jsonl"), "--output-prefix", scratch("j"), "--json-keys", "text", "title", "--append-eod");
    const int64_t want_text[] = {'h', 0xc3, 0xa9, 'l', 'l', 'o', ' ', '"', 'q', '"', ' ', '\\', ' ', '\n', 256, -9,
                                 0xf0, 0x9f, 0x98, 0x80, '!', 256, -9, 'a', 'b', 256, -9, -10};
    const int64_t want_title[] = {'T', 256, -9, 'a', 'b', 256, -9, -10};
    check(rc == 0 && holds(scratch("j_text_document"), DTYPE_UINT16, want_text, why, sizeof why), "preprocess_json_lines",
          "rc %d: %s %s", rc, err, why);
    check(rc == 0 && holds(scratch("j_title_document"), DTYPE_UINT16, want_title, why, sizeof why), "preprocess_json_second_key",
          "%s", why);

    spit(scratch("a.txt"), "hi\n", 3);
    spit(scratch("empty.txt"), "", 0);
    spit(scratch("b.txt"), "\xff" "z", 2);
    rc = PP("--input", scratch("a.txt"), scratch("empty.txt"), scratch("b.txt"), "--output-prefix", scratch("t"), "--workers", "3",
            "--input-format", "text");
    const int64_t want_files[] = {'h', 'i', '\n', -9, 255, 'z', -9, -10};
    check(rc == 0 && holds(scratch("t_text_document"), DTYPE_UINT16, want_files, why, sizeof why), "preprocess_file_per_document",
          "rc %d: %s %s", rc, err, why);
    rc = PP("--input", scratch("a.txt"), "--output-prefix", scratch("t8"), "--dtype", "int32", "--input-format", "text");
    const int64_t want_a[] = {'h', 'i', '\n', -9, -10};
    check(rc == 0 && holds(scratch("t8_text_document"), DTYPE_INT32, want_a, why, sizeof why), "preprocess_dtype_flag", "%s %s", err, why);

    spit_text(scratch("ids.txt"), "1 2 3\n\n70000\t5\n");
    rc = PP("--input", scratch("ids.txt"), "--output-prefix", scratch("i"), "--tokenizer-type", "ids", "--input-format", "text");
    const int64_t want_ids[] = {1, 2, 3, -9, 70000, 5, -9, -10};   // largest id 70000: vocabulary >= 65500, so int32
    check(rc == 0 && holds(scratch("i_text_document"), DTYPE_INT32, want_ids, why, sizeof why), "preprocess_ids_int32", "%s %s", err, why);
    spit_text(scratch("ids2.txt"), "1 2\n3\n");
    rc = PP("--input", scratch("ids2.txt"), "--output-prefix", scratch("i2"), "--tokenizer-type", "ids", "--vocab-size", "10",
            "--append-eod", "--input-format", "text");
    const int64_t want_ids2[] = {1, 2, 10, -9, 3, 10, -9, -10};   // NullTokenizer: EOD = vocab size
    check(rc == 0 && holds(scratch("i2_text_document"), DTYPE_UINT16, want_ids2, why, sizeof why), "preprocess_ids_eod", "%s %s", err, why);

    spit_text(scratch("bad.jsonl"), "{\"text\": \"ok\"}\n{\"text\": 5}\n");
    spit_text(scratch("nokey.jsonl"), "{\"body\": \"x\"}\n");
    spit_text(scratch("badids.txt"), "1 x2\n");
    spit_text(scratch("extra.jsonl"), "{\"text\": \"a\"} {\"text\": \"b\"}\n");
    spit_text(scratch("surrogate.jsonl"), "{\"text\": \"ok\"}\n{\"text\": \"a\\ud800b\"}\n");   // a lone surrogate: no UTF-8
    static const struct { const char* name; const char* args[8]; const char* says; } bad[] = {
        {"unknown_flag", {"--frobnicate", "1"}, "--frobnicate"},
        {"missing_value", {"--input", "x", "--output-prefix"}, "--output-prefix"},
        {"missing_file", {"--input", "/no/such/file", "--output-prefix", "x"}, "/no/such/file"},
        {"bad_dtype", {"--input", "x", "--output-prefix", "x", "--dtype", "float32"}, "float32"},
        {"bad_json_value", {"--input", "bad.jsonl", "--output-prefix", "bj", "--json-keys", "text"}, "bad.jsonl:2"},
        {"missing_json_key", {"--input", "nokey.jsonl", "--output-prefix", "bk", "--json-keys", "text"}, "nokey.jsonl:1"},
        {"json_extra_data", {"--input", "extra.jsonl", "--output-prefix", "bx", "--json-keys", "text"}, "extra.jsonl:1"},
        {"lone_surrogate", {"--input", "surrogate.jsonl", "--output-prefix", "bs"}, "surrogate.jsonl:2: a lone surrogate"},
        {"bad_ids", {"--input", "badids.txt", "--output-prefix", "bi", "--tokenizer-type", "ids", "--input-format", "text"}, "badids.txt:1"},
        {"eod_without_vocab", {"--input", "ids2.txt", "--output-prefix", "be", "--tokenizer-type", "ids", "--append-eod"}, "--vocab-size"},
    };
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        const char* a[9] = {NULL};
        char paths[8][8300];
        for (int i = 0; i < 8; i++) {   // file arguments live in the scratch directory
            const char* v = bad[c].args[i];
            int is_file = v && i > 0 && (!strcmp(bad[c].args[i - 1], "--input") || !strcmp(bad[c].args[i - 1], "--output-prefix"));
            snprintf(paths[i], sizeof paths[i], "%s", v && is_file && v[0] != '/' ? scratch(v) : v ? v : "");
            a[i] = v ? paths[i] : NULL;
        }
        rc = run_preprocess(a);
        char name[128];
        snprintf(name, sizeof name, "preprocess_refuses_%s", bad[c].name);
        int one_line = strchr(err, '\n') == err + strlen(err) - 1;
        check(rc == 2 && strncmp(err, "error: ", 7) == 0 && strstr(err, bad[c].says) && one_line, name, "rc %d, \"%s\"", rc, err);
    }
    // an empty --output-prefix, or one naming a directory, would write "_text_document.*" (issue
    // 34, item 18): refused in one line, exit 2, nothing written (run inside the scratch folder)
    char cwd[4096], input[8300];
    snprintf(input, sizeof input, "%s", scratch("a.txt"));
    if (getcwd(cwd, sizeof cwd) && chdir(TMP) == 0) {
        mkdir("sub", 0755);
        static const char* const dir_prefixes[][2] = {{"", "empty"}, {"sub/", "slash"}, {".", "dot"}, {"sub/..", "dotdot"}};
        for (int i = 0; i < 4; i++) {
            rc = PP("--input", input, "--output-prefix", dir_prefixes[i][0]);
            int one_line = strchr(err, '\n') == err + strlen(err) - 1;
            int written = exists("_text_document.bin") || exists("sub/_text_document.bin") || exists("._text_document.bin") ||
                          exists("sub/.._text_document.bin") || exists("_text_document.bin.tmp");
            char name[128];
            snprintf(name, sizeof name, "preprocess_refuses_%s_output_prefix", dir_prefixes[i][1]);
            check(rc == 2 && strncmp(err, "error: --output-prefix", 22) == 0 && one_line && !written, name,
                  "rc %d, %s, \"%s\"", rc, written ? "written" : "nothing written", err);
        }
        if (chdir(cwd) != 0) perror(cwd);
    }
    char leftover[8300];
    snprintf(leftover, sizeof leftover, "%s.bin.tmp", scratch("bj_text_document"));
    int left = exists(leftover);
    snprintf(leftover, sizeof leftover, "%s.bin", scratch("bj_text_document"));
    check(!left && !exists(leftover), "preprocess_failure_leaves_no_files", "output or temporary left behind");

    char prefix[8300];
    snprintf(prefix, sizeof prefix, "%s", fixture("corpus_u16"));
    rc = PP("--inspect", prefix);
    size_t len;
    char* out = (char*)slurp(scratch("stdout.txt"), &len);
    const char* at = out ? strstr(out, "unigram entropy ") : NULL;
    const int b[1] = {0}, e[1] = {NUM_DOCS};
    const double w[1] = {1.0};
    double h = at ? atof(at + 16) : -1, want_h = entropy_of_docs(1, w, b, e);
    check(rc == 0 && strstr(out, "max token id 50256") && fabs(h - want_h) < 1e-4, "preprocess_inspect_with_entropy",
          "rc %d, \"%s\" (entropy %.4f expected)", rc, out ? out : err, want_h);
    free(out);
}

// --print-samples prints Megatron's samples, and nothing else, on stdout
static void test_print_samples(void) {
    char prefix[8300];
    snprintf(prefix, sizeof prefix, "%s", fixture("corpus_u16"));
    const char* megatron = fixture("corpus_u16_train_indexmap_100ns_32sl_1234s_samples_first5.txt");
    int rc = PP("--print-samples", "--data-path", prefix, "--seq-length", "32", "--seed", "1234", "--num-samples", "100",
                "--split", "100,0,0", "--first", "5", "--data-cache-path", TMP);
    check(rc == 0 && same_file(scratch("stdout.txt"), megatron), "print_samples_equal_megatron", "rc %d: %s", rc, err);
    rc = PP("--print-samples", prefix, "--seq-length", "32", "--num-samples", "100", "--split", "100/0/0", "--first", "5",
            "--data-cache-path", TMP);   // the short form, default seed
    check(rc == 0 && same_file(scratch("stdout.txt"), megatron), "print_samples_short_form", "rc %d: %s", rc, err);
    char new_cache[8300];   // a missing --data-cache-path is made, as the trainer makes it (it failed: issue 46)
    snprintf(new_cache, sizeof new_cache, "%s/new/cache", scratch("print_samples"));
    rc = PP("--print-samples", prefix, "--seq-length", "32", "--num-samples", "100", "--split", "100,0,0", "--first", "5",
            "--data-cache-path", new_cache);
    check(rc == 0 && same_file(scratch("stdout.txt"), megatron), "print_samples_makes_its_cache_path", "rc %d: %s", rc, err);
    rc = PP("--print-samples", "--data-path", "1", prefix, "--seq-length", "32", "--num-samples", "100", "--split", "100,0,0",
            "--data-cache-path", TMP);
    size_t len;
    char* out = (char*)slurp(scratch("stdout.txt"), &len);
    int lines = 0;
    for (size_t i = 0; out && i < len; i++) lines += out[i] == '\n';
    check(rc == 0 && lines == 100 && out && strncmp(out, "18044 11600 ", 12) == 0, "print_samples_all_k_by_default",
          "rc %d, %d lines: %s", rc, lines, err);
    free(out);
    rc = PP("--print-samples", "--data-path", prefix, "--num-samples", "100");
    check(rc == 2 && strstr(err, "--seq-length"), "print_samples_needs_seq_length", "rc %d: %s", rc, err);
    rc = PP("--print-samples", "--data-path", prefix, "--seq-length", "32", "--num-samples", "10", "--split", "100,0,0",
            "--which", "valid", "--data-cache-path", TMP);
    check(rc == 2 && strstr(err, "valid split without documents"), "print_samples_empty_split", "rc %d: %s", rc, err);
}

// ----------------------------------------------------------------------------

// the scratch folder and the folders made in it (files.h remove_tree: a link is unlinked, never followed)
static void remove_scratch(void) { remove_tree(TMP); }

int main(int argc, char** argv) {
    // tests/data/ sits beside this file, in the repository: find it from the working directory
    const char* data = exists("tests/data/gpt_index_cases.txt") ? "tests/data" : "data";
    if (argc > 1) snprintf(FIXTURE, sizeof FIXTURE, "%s", argv[1]);
    else snprintf(FIXTURE, sizeof FIXTURE, "%s/megatron/corpus_u16", data);
    char cases[4096];
    if (argc > 2) snprintf(cases, sizeof cases, "%s", argv[2]);
    else snprintf(cases, sizeof cases, "%s/gpt_index_cases.txt", data);
    // a fixture that is not there is one failure that names the file, not a cascade
    if (!exists(fixture("corpus_u16.idx"))) {
        check(0, "fixture", "%s not found: the Megatron fixture is part of the repository (tests/data/megatron/)",
              fixture("corpus_u16.idx"));
        return 1;
    }
    snprintf(TMP, sizeof TMP, "/tmp/test_data_XXXXXX");
    if (mkdtemp(TMP) == NULL) { perror("mkdtemp"); return 2; }
    check(load_docs_json() == 0, "load_docs_json", "cannot parse %s", fixture("docs.json"));
    test_read_fixture();
    test_gpt_fixture();
    test_gpt_cases(cases);
    test_builder();
    test_corruptions();
    test_idx_covers_bin();
    test_random_corruptions();
    test_splits();
    test_blending();
    test_npy_fixture();
    test_cache_roundtrip();
    test_cache_damage();
    test_cache_random_damage();
    test_crc32();
    test_cache_checksum();
    test_stale_temporaries();
    test_data_splits_single();
    test_data_splits_blend();
    test_preprocess();
    test_print_samples();
    remove_scratch();
    return tests_summary();
}
