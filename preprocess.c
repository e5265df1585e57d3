/*
preprocess.c — the `preprocess` program: text in, a Megatron indexed dataset out (Megatron's
tools/preprocess_data.py: bytes, ids, or GPT-2's BPE); also --inspect PREFIX and --print-samples.

    cc -std=gnu11 -O3 -fopenmp preprocess.c -o preprocess -lm        (make preprocess)

It is the writer of Megatron's indexed datasets (the builder) and a front end: flags, a
JSON-lines reader, the tokenizers (bytes, ids, and tokenizer.h's GPT-2 BPE) run over the input
files (in parallel with --workers), on top of data.c's reader. The trainer never compiles it.
tests/test_data.c, bench_data.c and fuzz_data.c include it with DATA_TESTING defined (then there
is no main) to test the builder and preprocess_main as functions. The rules of data.c hold here too: plain C that is also valid
C++, bad input returns non-zero with one line in err, only main exits.
*/
#include "files.h"
#include "tokenizer.h"
#include "data.c"

// ----------------------------------------------------------------------------
// preprocess: text in, .bin/.idx out (Megatron's tools/preprocess_data.py)
//
// ./preprocess --input FILE [FILE ...] --output-prefix PREFIX [--json-keys KEY [KEY ...]]
//              [--input-format jsonl|text] [--append-eod] [--tokenizer-type bytes|ids|GPT2BPETokenizer]
//              [--vocab-file VOCAB.json --merge-file MERGES.txt] [--vocab-size N] [--dtype NAME]
//              [--workers N]          or          ./preprocess --inspect PREFIX
//              or ./preprocess --print-samples --data-path ... (see PREPROCESS_USAGE)
// Sources of documents: as preprocess_data.py, JSON lines, one string per --json-keys key
// (default: text) and line; with --input-format text, plain text: a whole input file (bytes,
// GPT2BPETokenizer) or one line (ids). Output per key: PREFIX_KEY_document.bin/.idx. As
// preprocess_data.py: a document with no tokens is skipped, and --append-eod adds the
// end-of-document token to the others. The ids tokenizer is Megatron's NullTokenizer:
// whitespace-separated ids below --vocab-size N, EOD = N. GPT2BPETokenizer is GPT-2's BPE
// (tokenizer.h; EOD <|endoftext|>, 50256): the Tokenizer is shared by the workers, each with
// its own word cache; text that is not UTF-8 is refused, as Python's strict decoding refuses it.
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

// ----------------------------------------------------------------------------
// writing an indexed dataset (Megatron's MMapIndexedDatasetBuilder)
//
// Tokens stream into PREFIX.bin.tmp as documents arrive; the sizes stay in memory and go,
// with the pointers and doc_idx they imply, to PREFIX.idx.tmp at the end. Both are fsync'd
// before either is renamed, so an existing dataset is never replaced by a half-written one.
// (Two renames are not one atomic step: a crash between them leaves a new .bin beside the
// old .idx, which the reader's checks will usually refuse.)

typedef struct {
    char bin_path[4096], idx_path[4096], bin_tmp[4096], idx_tmp[4096];
    FILE* bin;
    int dtype_code, itemsize;
    int32_t* sizes; int64_t num_items, cap_items;   // one item per document: doc_idx is 0, 1, ..., num_items
    int64_t item_tokens;    // tokens appended to the item that is still open
    int64_t num_tokens;
} IndexedDatasetBuilder;

// grow an array to hold `need` elements; NULL (and the old array untouched) if out of memory
static void* grow_array(void* p, int64_t* cap, int64_t need, size_t elem) {
    if (need <= *cap) return p;
    int64_t new_cap = *cap * 2 > need ? *cap * 2 : need + 1024;
    void* q = realloc(p, (size_t)new_cap * elem);
    if (q != NULL) *cap = new_cap;
    return q;
}

// throw away the temporary files and the memory (after an error, or to give up)
static inline void builder_abort(IndexedDatasetBuilder* b) {
    if (b->bin) fclose(b->bin);
    if (b->bin_tmp[0]) unlink(b->bin_tmp);
    if (b->idx_tmp[0]) unlink(b->idx_tmp);
    free(b->sizes);
    memset(b, 0, sizeof *b);
}

static inline int builder_open(IndexedDatasetBuilder* b, const char* prefix, int dtype_code, char* err, size_t errlen) {
    memset(b, 0, sizeof *b);
    const TokenDtype* dt = token_dtype(dtype_code);
    if (dt == NULL) return error_line(err, errlen, "%s: dtype code %d is not a token type", prefix, dtype_code);
    if (join_path(b->bin_path, sizeof b->bin_path, prefix, ".bin") || join_path(b->idx_path, sizeof b->idx_path, prefix, ".idx") ||
        join_path(b->bin_tmp, sizeof b->bin_tmp, prefix, ".bin.tmp") || join_path(b->idx_tmp, sizeof b->idx_tmp, prefix, ".idx.tmp"))
        return error_line(err, errlen, "%s: path too long", prefix);
    b->dtype_code = dtype_code;
    b->itemsize = dt->itemsize;
    b->bin = fopen(b->bin_tmp, "wb");
    if (b->bin == NULL) {
        int rc = error_line(err, errlen, "%s: %s", b->bin_tmp, strerror(errno));
        memset(b, 0, sizeof *b);   // closed, and the temporaries are not ours to delete
        return rc;
    }
    return 0;
}

// append tokens to the open item (a document may arrive in pieces); all or nothing
static int builder_append_tokens(IndexedDatasetBuilder* b, const int64_t* tokens, int64_t n, char* err, size_t errlen) {
    const TokenDtype* dt = token_dtype(b->dtype_code);
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < dt->min || tokens[i] > dt->max)
            return error_line(err, errlen, "%s: token id %lld does not fit dtype %s", b->bin_path, (long long)tokens[i],
                              dt->name);
    if (n > INT32_MAX - b->item_tokens)   // sizes are int32 in the .idx
        return error_line(err, errlen, "%s: a document of more than %d tokens", b->bin_path, INT32_MAX);
    uint8_t buf[1 << 14];
    int64_t per_buf = (int64_t)sizeof buf / b->itemsize;
    for (int64_t i = 0; i < n; i += per_buf) {
        int64_t m = n - i < per_buf ? n - i : per_buf;
        for (int64_t j = 0; j < m; j++)   // narrow to the dtype (little-endian host: low bytes first)
            memcpy(buf + j * b->itemsize, &tokens[i + j], (size_t)b->itemsize);
        if (fwrite(buf, (size_t)b->itemsize, (size_t)m, b->bin) != (size_t)m)
            return error_line(err, errlen, "%s: write failed: %s", b->bin_tmp, strerror(errno));
    }
    b->item_tokens += n;
    b->num_tokens += n;
    return 0;
}

// close the open item and end the document after it (add_item's size + end_document)
static int builder_end_document(IndexedDatasetBuilder* b, char* err, size_t errlen) {
    int32_t* sizes = (int32_t*)grow_array(b->sizes, &b->cap_items, b->num_items + 1, sizeof(int32_t));
    if (sizes == NULL) return error_line(err, errlen, "%s: out of memory", b->idx_path);
    b->sizes = sizes;
    b->sizes[b->num_items++] = (int32_t)b->item_tokens;
    b->item_tokens = 0;
    return 0;
}

// one document of one item, as tools/preprocess_data.py writes it: add_item + end_document
static inline int builder_add_document(IndexedDatasetBuilder* b, const int64_t* tokens, int64_t n, char* err, size_t errlen) {
    if (builder_append_tokens(b, tokens, n, err, errlen)) return 1;
    return builder_end_document(b, err, errlen);
}

static int write_idx(const IndexedDatasetBuilder* b, FILE* f) {
    const uint64_t version = 1, n = (uint64_t)b->num_items, d = n + 1;
    const uint8_t code = (uint8_t)b->dtype_code;
    int bad = fwrite(IDX_MAGIC, 1, 9, f) != 9 || fwrite(&version, 8, 1, f) != 1 || fwrite(&code, 1, 1, f) != 1 ||
              fwrite(&n, 8, 1, f) != 1 || fwrite(&d, 8, 1, f) != 1;
    if (n > 0) bad = bad || fwrite(b->sizes, 4, n, f) != n;
    int64_t address = 0;   // pointers: each item starts where the previous one ended
    for (int64_t i = 0; i < b->num_items && !bad; i++) {
        bad = fwrite(&address, 8, 1, f) != 1;
        address += (int64_t)b->sizes[i] * b->itemsize;
    }
    for (int64_t i = 0; i <= b->num_items && !bad; i++) bad = fwrite(&i, 8, 1, f) != 1;   // doc_idx
    return bad;
}

static inline int builder_finish(IndexedDatasetBuilder* b, char* err, size_t errlen) {
    if (b->bin == NULL) return error_line(err, errlen, "builder_finish: the builder is not open");
    int rc = 0;
    if (b->item_tokens != 0) rc = error_line(err, errlen, "%s: the last document was never ended", b->bin_path);
    FILE* bin = b->bin;
    b->bin = NULL;
    if (close_synced(bin) && rc == 0) rc = error_line(err, errlen, "%s: write failed: %s", b->bin_tmp, strerror(errno));
    FILE* idx = rc ? NULL : fopen(b->idx_tmp, "wb");
    if (rc == 0 && idx == NULL) rc = error_line(err, errlen, "%s: %s", b->idx_tmp, strerror(errno));
    if (rc == 0) {
        int bad = write_idx(b, idx);
        if (close_synced(idx) || bad) rc = error_line(err, errlen, "%s: write failed: %s", b->idx_tmp, strerror(errno));
    }
    if (rc == 0 && (rename(b->bin_tmp, b->bin_path) != 0 || rename(b->idx_tmp, b->idx_path) != 0))
        rc = error_line(err, errlen, "%s: rename failed: %s", b->idx_path, strerror(errno));
    if (rc == 0) { fsync_parent_dir(b->idx_path); b->bin_tmp[0] = b->idx_tmp[0] = 0; }
    builder_abort(b);   // frees memory; on failure also deletes the temporaries
    return rc;
}

enum { PREPROCESS_MAX_KEYS = 16, PREPROCESS_BATCH_LINES = 4096 };
enum { BYTES_TOKENIZER, IDS_TOKENIZER, GPT2_TOKENIZER };   // --tokenizer-type, in TOKENIZER_TYPES' order
static const char* const TOKENIZER_TYPES[] = {"bytes", "ids", "GPT2BPETokenizer"};

typedef struct {
    const char* inputs[1024]; int num_inputs;
    const char* output_prefix;
    const char* keys[PREPROCESS_MAX_KEYS]; int num_keys;
    int json, tokenizer, append_eod, dtype_code;   // json: 0 with --input-format text
    int64_t workers, vocab_size;   // ids: --vocab-size (0: largest id in the data + 1)
    const char* vocab_file; const char* merge_file;
    Tokenizer gpt2;                // GPT2BPETokenizer's, loaded by preprocess_run
    TokenizerCache** caches;       // [workers]: each worker's words seen (GPT2BPETokenizer)
    const char* inspect;
    // --print-samples: the trainer's --data-path, --split, --seq-length, --seed, --data-cache-path
    int print_samples, which;                    // which: 0 train, 1 valid, 2 test
    const char* data_path[512]; int num_data_path;
    const char* split; const char* cache_dir;
    int64_t seq_length, seed, num_samples, first;   // first < 0: all num_samples
} PreprocessArgs;

typedef struct { uint8_t* data; size_t len; int64_t cap; } ByteBuf;
typedef struct { int64_t* data; int64_t len, cap; } TokenBuf;

// grow_array, but the preprocess program may stop on out-of-memory (the library functions
// above never do)
static void* grow_or_exit(void* p, int64_t* cap, int64_t need, size_t elem) {
    if (need <= *cap) return p;
    p = grow_array(p, cap, need, elem);
    if (p == NULL) { fprintf(stderr, "error: preprocess: out of memory\n"); exit(2); }
    return p;
}

static void bytes_push(ByteBuf* v, const void* p, size_t n) {
    v->data = (uint8_t*)grow_or_exit(v->data, &v->cap, (int64_t)(v->len + n), 1);
    memcpy(v->data + v->len, p, n);
    v->len += n;
}

static void tokens_push(TokenBuf* v, int64_t t) {
    v->data = (int64_t*)grow_or_exit(v->data, &v->cap, v->len + 1, sizeof(int64_t));
    v->data[v->len++] = t;
}

// ----------------------------------------------------------------------------
// a small JSON reader: enough to pull string fields out of one JSON object per line

static const char* json_ws(const char* p, const char* end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')) p++;
    return p;
}

// the string at *pp (just past its opening quote) decoded to UTF-8 bytes into out (may
// be NULL: skip); its escapes are tokenizer.h's json_escape (a surrogate pair one code point,
// a lone surrogate refused), turned into UTF-8 by its utf8_put
static const char* json_string(const char** pp, const char* end, ByteBuf* out) {
    const char* p = *pp;
    for (;;) {
        if (p >= end) return "unterminated string";
        unsigned char c = (unsigned char)*p++;
        if (c == '"') break;
        if (c < 0x20) return "control character inside a string";
        if (c != '\\') { if (out) bytes_push(out, &c, 1); continue; }
        if (p >= end) return "unterminated string";
        const char* why;
        long cp = json_escape(&p, end, &why);
        if (cp < 0) return why;
        char utf8[4];
        if (out) bytes_push(out, utf8, (size_t)utf8_put(utf8, (uint32_t)cp));
    }
    *pp = p;
    return NULL;
}

// skip a number, true/false/null, or a nested object/array (brackets counted, strings skipped)
static const char* json_skip_value(const char** pp, const char* end) {
    const char* p = *pp;
    int depth = 0;
    do {
        if (p >= end) return "unexpected end of line";
        char c = *p++;
        if (c == '"') {
            const char* why = json_string(&p, end, NULL);
            if (why) return why;
        } else if (c == '{' || c == '[') depth++;
        else if (c == '}' || c == ']') depth--;
        else if (depth == 0) {   // a scalar: runs to the next delimiter
            while (p < end && !strchr(",}] \t\r\n", *p)) p++;
        }
        if (depth < 0) return "unbalanced brackets";
    } while (depth > 0);
    *pp = p;
    return NULL;
}

// out[k] = the string value of keys[k] in the object on this line; NULL or why not
// (*missing: the first key the object lacks, -1 if none)
static const char* json_find_keys(const char* p, const char* end, const char* const* keys, int n, ByteBuf* out, int* missing) {
    int found[PREPROCESS_MAX_KEYS] = {0};
    ByteBuf key = {NULL, 0, 0};
    *missing = -1;
    const char* why = NULL;
    p = json_ws(p, end);
    if (p >= end || *p++ != '{') return "expected a JSON object";
    p = json_ws(p, end);
    int done = p < end && *p == '}';   // {}
    if (done) p++;
    while (!done && !why) {            // "key": value, ... }
        key.len = 0;
        if (p >= end || *p++ != '"') { why = "expected a key"; break; }
        if ((why = json_string(&p, end, &key)) != NULL) break;
        p = json_ws(p, end);
        if (p >= end || *p++ != ':') { why = "expected ':'"; break; }
        p = json_ws(p, end);
        int k = 0;
        while (k < n && !(strlen(keys[k]) == key.len && memcmp(keys[k], key.data, key.len) == 0)) k++;
        if (k == n) why = json_skip_value(&p, end);
        else if (p < end && *p == '"') { p++; out[k].len = 0; found[k] = 1; why = json_string(&p, end, &out[k]); }
        else why = "value is not a string";
        p = json_ws(p, end);
        if (why) break;
        if (p < end && *p == ',') p = json_ws(p + 1, end);
        else if (p < end && *p == '}') { p++; done = 1; }
        else why = "expected ',' or '}'";
    }
    if (!why && json_ws(p, end) != end) why = "extra characters after the object";
    for (int k = 0; k < n && !why; k++)
        if (!found[k]) why = "a key given by --json-keys is missing", *missing = k;
    free(key.data);
    return why;
}

// ----------------------------------------------------------------------------
// preprocess: tokenizing, and the input files

static int is_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; }

// Megatron's NullTokenizer: int() of each whitespace-separated word
static int tokenize_ids(const PreprocessArgs* a, const uint8_t* text, size_t n, TokenBuf* out, char* why, size_t whylen) {
    for (size_t i = 0; i < n;) {
        while (i < n && is_space(text[i])) i++;
        if (i == n) break;
        int64_t v = 0;
        size_t start = i;
        while (i < n && text[i] >= '0' && text[i] <= '9' && v < (INT64_MAX - 9) / 10) v = v * 10 + (text[i++] - '0');
        if (i == start || (i < n && !is_space(text[i])))
            return error_line(why, whylen, "not a token id (expected a non-negative integer) at byte %zu", start);
        if (a->vocab_size > 0 && v >= a->vocab_size)
            return error_line(why, whylen, "token id %lld is not below --vocab-size %lld", (long long)v,
                              (long long)a->vocab_size);
        tokens_push(out, v);
    }
    return 0;
}

// GPT-2's BPE, with this worker's cache; text that is not UTF-8 is refused
static int tokenize_gpt2(const PreprocessArgs* a, TokenizerCache* cache, const uint8_t* text, size_t n, TokenBuf* out,
                         char* why, size_t whylen) {
    TokenIds ids = {NULL, 0, 0};
    size_t bad = 0;
    int rc = 0;
    if (tokenizer_encode(&a->gpt2, cache, (const char*)text, n, &ids, &bad) != 0)
        rc = error_line(why, whylen, "invalid UTF-8 at byte %zu of the text (GPT2BPETokenizer reads UTF-8)", bad);
    for (size_t i = 0; i < ids.n; i++) tokens_push(out, ids.ids[i]);
    free(ids.ids);
    return rc;
}

// the end-of-document token: 256 (bytes), --vocab-size N (ids), <|endoftext|> (GPT-2: 50256)
static int64_t eod_token(const PreprocessArgs* a) {
    return a->tokenizer == IDS_TOKENIZER ? a->vocab_size : a->tokenizer == GPT2_TOKENIZER ? a->gpt2.eod : BYTE_EOD;
}

// text -> tokens (+ EOD when the document is not empty); why says what is wrong
static int tokenize(const PreprocessArgs* a, TokenizerCache* cache, const uint8_t* text, size_t n, TokenBuf* out,
                    char* why, size_t whylen) {
    out->len = 0;
    int rc = 0;
    if (a->tokenizer == IDS_TOKENIZER) rc = tokenize_ids(a, text, n, out, why, whylen);
    else if (a->tokenizer == GPT2_TOKENIZER) rc = tokenize_gpt2(a, cache, text, n, out, why, whylen);
    else for (size_t i = 0; i < n; i++) tokens_push(out, text[i]);
    if (rc == 0 && out->len > 0 && a->append_eod) tokens_push(out, eod_token(a));
    return rc;
}

// one line of input and what it becomes (lines are tokenized in parallel, written in order)
typedef struct {
    char* text; size_t len;
    int64_t line_no;
    TokenBuf docs[PREPROCESS_MAX_KEYS];
    int num_docs;   // documents on the line: one per key, none on a blank line
    int failed; char why[200];
} Line;

static void encode_line(const PreprocessArgs* a, TokenizerCache* cache, Line* L) {
    ByteBuf text[PREPROCESS_MAX_KEYS];
    memset(text, 0, sizeof text);
    int n = a->json ? a->num_keys : 1;
    const char* bad = NULL;
    int missing = -1;
    if (json_ws(L->text, L->text + L->len) == L->text + L->len) n = 0;   // a blank line: nothing to encode
    else if (a->json) bad = json_find_keys(L->text, L->text + L->len, a->keys, n, text, &missing);
    else bytes_push(&text[0], L->text, L->len);
    if (missing >= 0) snprintf(L->why, sizeof L->why, "no \"%s\" key (--json-keys; text by default)", a->keys[missing]);
    else if (bad) snprintf(L->why, sizeof L->why, "%s", bad);
    L->failed = bad != NULL;
    for (int k = 0; k < n && !L->failed; k++)
        L->failed = tokenize(a, cache, text[k].data, text[k].len, &L->docs[k], L->why, sizeof L->why);
    L->num_docs = n;
    for (int k = 0; k < PREPROCESS_MAX_KEYS; k++) free(text[k].data);
}

// where documents go: the builders (one per key), or, in a dry run, only the largest id
typedef struct {
    IndexedDatasetBuilder builders[PREPROCESS_MAX_KEYS];
    int64_t empty[PREPROCESS_MAX_KEYS];   // documents without tokens, skipped (and counted)
    int dry;
    int64_t max_id, bytes;
} Sink;

static int sink_document(Sink* s, int k, const TokenBuf* t, char* err, size_t errlen) {
    if (t->len == 0) return s->empty[k]++, 0;   // preprocess_data.py skips documents without tokens
    for (int64_t i = 0; i < t->len; i++)
        if (t->data[i] > s->max_id) s->max_id = t->data[i];
    return s->dry ? 0 : builder_add_document(&s->builders[k], t->data, t->len, err, errlen);
}

// this worker's word cache, made at its first use (GPT2BPETokenizer's; NULL for the others)
static TokenizerCache* worker_cache(const PreprocessArgs* a) {
#ifdef _OPENMP
    int w = omp_get_thread_num();
#else
    int w = 0;
#endif
    if (a->caches && a->caches[w] == NULL) a->caches[w] = tokenizer_cache_new();   // (each worker its own slot)
    return a->caches ? a->caches[w] : NULL;
}

// a whole file is one document of GPT-2 tokens, read whole first (a cut could split a word)
static int preprocess_file_gpt2(const PreprocessArgs* a, const char* path, Sink* s, char* err, size_t errlen) {
    FILE* f = fopen(path, "rb");
    if (f == NULL) return error_line(err, errlen, "%s: %s", path, strerror(errno));
    ByteBuf text = {NULL, 0, 0};
    uint8_t buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) bytes_push(&text, buf, n);
    int rc = ferror(f) ? error_line(err, errlen, "%s: read failed: %s", path, strerror(errno)) : 0;
    fclose(f);
    TokenBuf doc = {NULL, 0, 0};
    char why[200];
    if (rc == 0 && text.len > 0 && tokenize(a, worker_cache(a), text.data, text.len, &doc, why, sizeof why))
        rc = error_line(err, errlen, "%s: %s", path, why);
    if (rc == 0) rc = sink_document(s, 0, &doc, err, errlen);
    s->bytes += (int64_t)text.len;
    free(text.data);
    free(doc.data);
    return rc;
}

// a whole file is one document of bytes, streamed
static int preprocess_file(const PreprocessArgs* a, const char* path, Sink* s, char* err, size_t errlen) {
    if (a->tokenizer == GPT2_TOKENIZER) return preprocess_file_gpt2(a, path, s, err, errlen);
    FILE* f = fopen(path, "rb");
    if (f == NULL) return error_line(err, errlen, "%s: %s", path, strerror(errno));
    uint8_t buf[1 << 13];
    int64_t tokens[1 << 13];
    int64_t total = 0;
    size_t n;
    int rc = 0;
    while (rc == 0 && (n = fread(buf, 1, sizeof buf, f)) > 0) {
        for (size_t i = 0; i < n; i++) tokens[i] = buf[i];
        rc = builder_append_tokens(&s->builders[0], tokens, (int64_t)n, err, errlen);
        total += (int64_t)n;
    }
    if (rc == 0 && ferror(f)) rc = error_line(err, errlen, "%s: read failed: %s", path, strerror(errno));
    fclose(f);
    s->bytes += total;
    if (rc == 0 && total == 0) s->empty[0]++;
    if (rc || total == 0) return rc;
    if (a->append_eod) { tokens[0] = BYTE_EOD; rc = builder_append_tokens(&s->builders[0], tokens, 1, err, errlen); }
    return rc ? rc : builder_end_document(&s->builders[0], err, errlen);
}

// line by line: read a batch, encode it on --workers threads, write it in order
static int preprocess_lines(const PreprocessArgs* a, const char* path, Sink* s, char* err, size_t errlen) {
    FILE* f = fopen(path, "rb");
    if (f == NULL) return error_line(err, errlen, "%s: %s", path, strerror(errno));
    Line* batch = (Line*)calloc(PREPROCESS_BATCH_LINES, sizeof(Line));
    int64_t line_no = 0;
    int rc = batch ? 0 : error_line(err, errlen, "%s: out of memory", path);
    while (rc == 0) {
        int n = 0;
        ssize_t len;
        for (size_t cap = 0; n < PREPROCESS_BATCH_LINES && (len = getline(&batch[n].text, &cap, f)) >= 0; n++) {
            batch[n].len = (size_t)len;
            batch[n].line_no = ++line_no;
            s->bytes += len;
            cap = 0;   // the next line gets a buffer of its own
        }
        if (n < PREPROCESS_BATCH_LINES) { free(batch[n].text); batch[n].text = NULL; }   // getline's, at end of file
        if (n == 0) break;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 16) num_threads(a->workers)
#endif
        for (int i = 0; i < n; i++) encode_line(a, worker_cache(a), &batch[i]);
        for (int i = 0; i < n; i++) {
            Line* L = &batch[i];
            if (rc == 0 && L->failed) rc = error_line(err, errlen, "%s:%lld: %s", path, (long long)L->line_no, L->why);
            for (int k = 0; k < PREPROCESS_MAX_KEYS; k++) {
                if (rc == 0 && k < L->num_docs) rc = sink_document(s, k, &L->docs[k], err, errlen);
                free(L->docs[k].data);
            }
            free(L->text);
            memset(L, 0, sizeof *L);
        }
    }
    if (rc == 0 && ferror(f)) rc = error_line(err, errlen, "%s: read failed: %s", path, strerror(errno));
    free(batch);
    fclose(f);
    return rc;
}

static int preprocess_inputs(const PreprocessArgs* a, Sink* s, char* err, size_t errlen) {
    for (int i = 0; i < a->num_inputs; i++) {
        int rc = a->json || a->tokenizer == IDS_TOKENIZER ? preprocess_lines(a, a->inputs[i], s, err, errlen)
                                                          : preprocess_file(a, a->inputs[i], s, err, errlen);
        if (rc) return rc;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// preprocess: flags and main

static int parse_int_flag(const char* flag, const char* v, int64_t lo, int64_t* out, char* err, size_t errlen) {
    char* end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (*v == 0 || *end != 0 || errno || x < lo) return error_line(err, errlen, "%s %s: expected an integer >= %lld", flag, v, (long long)lo);
    *out = x;
    return 0;
}

// a flag that takes a list of values: where they go, and how many fit
static const char** list_flag(PreprocessArgs* a, const char* f, int** count, int* cap) {
    if (!strcmp(f, "--input")) { *count = &a->num_inputs; *cap = 1024; return a->inputs; }
    if (!strcmp(f, "--json-keys")) { *count = &a->num_keys; *cap = PREPROCESS_MAX_KEYS; return a->keys; }
    if (!strcmp(f, "--data-path") || !strcmp(f, "--print-samples")) { *count = &a->num_data_path; *cap = 512; return a->data_path; }
    return NULL;
}

static const char* const VALUE_FLAGS[] = {"--output-prefix", "--inspect", "--split", "--data-cache-path", "--which",
                                          "--tokenizer-type", "--dtype", "--workers", "--vocab-size", "--seq-length",
                                          "--seed", "--num-samples", "--first", "--vocab-file", "--merge-file",
                                          "--input-format"};

// one of VALUE_FLAGS and its value: 0, or 1 with err set
static int value_flag(PreprocessArgs* a, const char* f, const char* value, char* err, size_t errlen) {
    const struct { const char* name; int64_t lo; int64_t* at; } ints[] = {
        {"--workers", 1, &a->workers}, {"--vocab-size", 1, &a->vocab_size}, {"--seq-length", 2, &a->seq_length},
        {"--seed", 0, &a->seed}, {"--num-samples", 1, &a->num_samples}, {"--first", 0, &a->first}};
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++)
        if (!strcmp(f, ints[k].name)) return parse_int_flag(f, value, ints[k].lo, ints[k].at, err, errlen);
    if (!strcmp(f, "--output-prefix")) a->output_prefix = value;
    else if (!strcmp(f, "--inspect")) a->inspect = value;
    else if (!strcmp(f, "--split")) a->split = value;
    else if (!strcmp(f, "--data-cache-path")) a->cache_dir = value;
    else if (!strcmp(f, "--vocab-file")) a->vocab_file = value;
    else if (!strcmp(f, "--merge-file")) a->merge_file = value;
    else if (!strcmp(f, "--input-format")) {
        if (strcmp(value, "jsonl") && strcmp(value, "text"))
            return error_line(err, errlen, "--input-format %s: expected jsonl (the default) or text", value);
        a->json = !strcmp(value, "jsonl");
    } else if (!strcmp(f, "--which")) {
        for (a->which = 0; a->which < 3 && strcmp(value, SPLIT_NAMES[a->which]); a->which++) {}
        if (a->which == 3) return error_line(err, errlen, "--which %s: expected train, valid or test", value);
    } else if (!strcmp(f, "--tokenizer-type")) {
        for (a->tokenizer = 0; a->tokenizer < 3 && strcmp(value, TOKENIZER_TYPES[a->tokenizer]); a->tokenizer++) {}
        if (a->tokenizer == 3) return error_line(err, errlen, "--tokenizer-type %s: expected bytes, ids or GPT2BPETokenizer", value);
    } else if (!strcmp(f, "--dtype")) {
        for (int k = 0; k < NUM_TOKEN_DTYPES; k++)
            if (!strcmp(value, TOKEN_DTYPES[k].name)) a->dtype_code = TOKEN_DTYPES[k].code;
        if (!a->dtype_code) return error_line(err, errlen, "--dtype %s: expected uint8, int8, int16, uint16, int32 or int64", value);
    }
    return 0;
}

// --workers' ceiling: 4 threads a core this process may run on
static int max_workers(void) {
#ifdef _OPENMP
    return 4 * omp_get_num_procs();
#else
    return 4;
#endif
}

static int check_print_samples(const PreprocessArgs* a, char* err, size_t errlen) {
    if (a->num_data_path == 0 || a->seq_length == 0 || a->num_samples == 0)
        return error_line(err, errlen, "--print-samples needs --data-path [WEIGHT] PREFIX ..., --seq-length and --num-samples");
    if (a->seed > 0xffffffffll) return error_line(err, errlen, "--seed %lld: numpy's RandomState takes 0..2^32-1", (long long)a->seed);
    if (a->seq_length > (1 << 30)) return error_line(err, errlen, "--seq-length %lld: too long", (long long)a->seq_length);
    return 0;
}

// the tokenizer's flags, and the input format's, go together
static int check_tokenizer_flags(const PreprocessArgs* a, char* err, size_t errlen) {
    int gpt2 = a->tokenizer == GPT2_TOKENIZER;
    if (!gpt2 && (a->vocab_file || a->merge_file))
        return error_line(err, errlen, "%s goes with --tokenizer-type GPT2BPETokenizer (and --%s)",
                          a->vocab_file ? "--vocab-file" : "--merge-file", a->vocab_file ? "merge-file" : "vocab-file");
    if (gpt2 && !(a->vocab_file && a->merge_file))
        return error_line(err, errlen, "--tokenizer-type GPT2BPETokenizer needs --vocab-file VOCAB.json and --merge-file "
                          "MERGES.txt (GPT-2's encoder.json and vocab.bpe)");
    if (a->vocab_size && a->tokenizer != IDS_TOKENIZER)
        return error_line(err, errlen, "--vocab-size goes with --tokenizer-type ids (the %s tokenizer's vocabulary is its own)",
                          TOKENIZER_TYPES[a->tokenizer]);
    if (a->tokenizer == IDS_TOKENIZER && a->append_eod && a->vocab_size == 0)
        return error_line(err, errlen, "--append-eod with --tokenizer-type ids needs --vocab-size N (EOD is N)");
    if (!a->json && a->num_keys)
        return error_line(err, errlen, "--json-keys reads JSON lines: not with --input-format text");
    return 0;
}

static int preprocess_parse(int argc, char** argv, PreprocessArgs* a, char* err, size_t errlen) {
    memset(a, 0, sizeof *a);
    a->workers = 1;
    a->json = 1;      // JSON lines, --json-keys text
    a->seed = 1234;   // Megatron's defaults
    a->split = "969, 30, 1";
    a->first = -1;
    for (int i = 1; i < argc; i++) {
        const char* f = argv[i];
        int* count;
        int cap;
        const char** list = list_flag(a, f, &count, &cap);
        if (!strcmp(f, "--append-eod")) { a->append_eod = 1; continue; }
        a->print_samples |= !strcmp(f, "--print-samples");
        if (list) {   // the values up to the next flag (--print-samples may have none)
            int before = *count;
            for (; i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0; i++) {
                if (*count == cap) return error_line(err, errlen, "%s: too many values", f);
                list[(*count)++] = argv[i + 1];
            }
            if (*count == before && !a->print_samples) return error_line(err, errlen, "%s: missing value", f);
            continue;
        }
        int known = 0;
        for (size_t k = 0; k < sizeof VALUE_FLAGS / sizeof VALUE_FLAGS[0]; k++) known |= !strcmp(f, VALUE_FLAGS[k]);
        if (!known) return error_line(err, errlen, "%s: unknown flag (see --help)", f);
        if (i + 1 == argc || strncmp(argv[i + 1], "--", 2) == 0) return error_line(err, errlen, "%s: missing value", f);
        if (value_flag(a, f, argv[++i], err, errlen)) return 1;
    }
    if (a->workers > max_workers())   // (threads past the cores only take turns; 2^32 once wrapped to 0)
        return error_line(err, errlen, "--workers %lld: at most %d here (4 threads for each of the %d cores this process may use)",
                          (long long)a->workers, max_workers(), max_workers() / 4);
    if (a->print_samples) return check_print_samples(a, err, errlen);
    if (a->inspect) return 0;
    if (a->num_inputs == 0 || a->output_prefix == NULL)
        return error_line(err, errlen, "--input and --output-prefix are required (see --help)");
    const char* last = strrchr(a->output_prefix, '/');   // the prefix's last component: the start of the file names
    last = last ? last + 1 : a->output_prefix;
    if (!*last || !strcmp(last, ".") || !strcmp(last, ".."))
        return error_line(err, errlen, "--output-prefix '%s': %s; expected a path and file-name prefix such as data/my "
                          "(which writes data/my_text_document.bin and .idx)", a->output_prefix,
                          *a->output_prefix ? "names a directory, not a file-name prefix" : "empty");
    if (check_tokenizer_flags(a, err, errlen)) return 1;
    if (a->num_keys == 0) a->keys[a->num_keys++] = "text";
    for (int k = 0; k < a->num_keys; k++)
        for (int j = 0; j < k; j++)
            if (!strcmp(a->keys[j], a->keys[k])) return error_line(err, errlen, "--json-keys: %s given twice", a->keys[k]);
    for (int i = 0; i < a->num_inputs; i++) {   // fail before writing anything
        struct stat st;
        if (stat(a->inputs[i], &st) != 0) return error_line(err, errlen, "%s: %s", a->inputs[i], strerror(errno));
        if (S_ISDIR(st.st_mode)) return error_line(err, errlen, "%s: is a directory", a->inputs[i]);
    }
    return 0;
}

static int preprocess_inspect(const char* prefix, char* err, size_t errlen) {
    IndexedDataset ds;
    if (indexed_dataset_open(&ds, prefix, err, errlen)) return 1;
    int64_t lo, hi;
    indexed_dataset_max_token(&ds, &lo, &hi);
    printf("%s: dtype %s, %lld documents, %lld items, %lld tokens, min token id %lld, max token id %lld", prefix,
           token_dtype(ds.dtype_code)->name, (long long)ds.num_docs, (long long)ds.num_items, (long long)ds.num_tokens,
           (long long)lo, (long long)hi);
    double* counts = hi - lo < (1 << 26) ? (double*)calloc((size_t)(hi - lo + 1), sizeof(double)) : NULL;
    if (counts) {   // (not for ids spread over more than 2^26 values)
        count_tokens(&ds, 0, ds.num_items, counts, lo, hi - lo + 1);
        printf(", unigram entropy %.4f nats/token", entropy_nats(counts, hi - lo + 1));
    }
    printf("\n");
    free(counts);
    indexed_dataset_close(&ds);
    return 0;
}

// the first --first samples of a split, one line of seq_length+1 ids each, alone on stdout
static int preprocess_print_samples(const PreprocessArgs* a, char* err, size_t errlen) {
    int64_t samples[3] = {0, 0, 0};
    samples[a->which] = a->num_samples;
    DataSplits d;
    char made[4200];   // (a missing --data-cache-path is made, as the trainer and Megatron make it)
    if (a->cache_dir && make_dirs("--data-cache-path", a->cache_dir, made, sizeof made, err, errlen)) return 1;
    int rc = data_splits_open(&d, a->data_path, a->num_data_path, a->split, (int)a->seq_length, (uint64_t)a->seed,
                              samples, a->cache_dir, 1, err, errlen);
    if (rc) return rc;
    data_splits_print(&d, stderr);
    int64_t n = a->first < 0 ? a->num_samples : a->first < d.num_samples[a->which] ? a->first : d.num_samples[a->which];
    int* tokens = (int*)malloc((size_t)(a->seq_length + 1) * sizeof(int));
    if (!d.has[a->which]) rc = error_line(err, errlen, "--split %s leaves the %s split without documents", a->split, SPLIT_NAMES[a->which]);
    else if (tokens == NULL) rc = error_line(err, errlen, "out of memory");
    for (int64_t i = 0; i < n && rc == 0; i++) {
        data_splits_get(&d, a->which, i, tokens);
        for (int64_t t = 0; t <= a->seq_length; t++) printf("%d%c", tokens[t], t == a->seq_length ? '\n' : ' ');
    }
    if (rc == 0 && (fflush(stdout) != 0 || ferror(stdout))) rc = error_line(err, errlen, "stdout: write failed: %s", strerror(errno));
    free(tokens);
    data_splits_close(&d);
    return rc;
}

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// the dtype Megatron's best_fitting_dtype picks, unless --dtype forces one
static int preprocess_dtype(PreprocessArgs* a, char* err, size_t errlen) {
    if (a->dtype_code) return 0;
    int64_t vocab = a->tokenizer == GPT2_TOKENIZER ? a->gpt2.vocab_size : BYTE_VOCAB_SIZE;   // GPT-2: 50257
    if (a->tokenizer == IDS_TOKENIZER && a->vocab_size) vocab = a->vocab_size + 1;   // NullTokenizer: ids + EOD
    else if (a->tokenizer == IDS_TOKENIZER) {   // no vocabulary given: one dry pass finds the largest id
        Sink* dry = (Sink*)calloc(1, sizeof(Sink));
        if (dry == NULL) return error_line(err, errlen, "out of memory");
        dry->dry = 1;
        dry->max_id = -1;
        int rc = preprocess_inputs(a, dry, err, errlen);
        vocab = dry->max_id + 1;
        free(dry);
        if (rc) return rc;
    }
    a->dtype_code = vocab < 65500 ? DTYPE_UINT16 : DTYPE_INT32;
    return 0;
}

// GPT2BPETokenizer: the tokenizer, loaded before anything is written, and room for a word
// cache per worker (worker_cache makes each)
static int open_gpt2(PreprocessArgs* a, char* err, size_t errlen) {
    if (tokenizer_load(&a->gpt2, a->vocab_file, a->merge_file, err, errlen)) return 1;
    a->caches = (TokenizerCache**)calloc((size_t)a->workers, sizeof(TokenizerCache*));
    if (a->caches == NULL) return error_line(err, errlen, "out of memory");
    if (a->append_eod && a->gpt2.eod < 0)
        return error_line(err, errlen, "--vocab-file %s: no <|endoftext|> token, which --append-eod appends", a->vocab_file);
    return 0;
}

static void close_gpt2(PreprocessArgs* a) {
    for (int64_t w = 0; a->caches && w < a->workers; w++) tokenizer_cache_free(a->caches[w]);
    free(a->caches);
    a->caches = NULL;
    if (a->gpt2.vocab_size) tokenizer_free(&a->gpt2);
}

// the inputs into PREFIX_KEY_document.bin/.idx, under temporary names until every input is
// done (an error leaves nothing behind)
static int preprocess_write(PreprocessArgs* a, char* err, size_t errlen) {
    if (preprocess_dtype(a, err, errlen)) return 1;
    Sink* s = (Sink*)calloc(1, sizeof(Sink));
    if (s == NULL) return error_line(err, errlen, "out of memory");
    double t0 = seconds_now();
    int rc = 0, opened = 0;
    char prefix[4096];
    for (; rc == 0 && opened < a->num_keys; opened++) {   // Megatron's names: PREFIX_KEY_document
        int n = snprintf(prefix, sizeof prefix, "%s_%s_document", a->output_prefix, a->keys[opened]);
        rc = n < 0 || (size_t)n >= sizeof prefix ? error_line(err, errlen, "%s: path too long", a->output_prefix)
                                                 : builder_open(&s->builders[opened], prefix, a->dtype_code, err, errlen);
    }
    if (rc == 0) rc = preprocess_inputs(a, s, err, errlen);
    for (int k = 0; k < opened; k++) {
        int64_t docs = s->builders[k].num_items, tokens = s->builders[k].num_tokens;
        if (rc == 0) rc = builder_finish(&s->builders[k], err, errlen);
        else builder_abort(&s->builders[k]);
        char skipped[100] = "";
        if (s->empty[k])
            snprintf(skipped, sizeof skipped, " (%lld empty document%s skipped, as preprocess_data.py does)",
                     (long long)s->empty[k], s->empty[k] == 1 ? "" : "s");
        if (rc == 0)
            printf("preprocess: %s_%s_document.bin/.idx: dtype %s, %lld documents, %lld tokens%s\n", a->output_prefix,
                   a->keys[k], token_dtype(a->dtype_code)->name, (long long)docs, (long long)tokens, skipped);
    }
    double dt = seconds_now() - t0, mb = (double)s->bytes / 1e6;
    if (rc == 0)
        printf("preprocess: %d input file(s), %.2f MB in %.2f s (%.1f MB/s)\n", a->num_inputs, mb, dt, dt > 0 ? mb / dt : 0.0);
    free(s);
    return rc;
}

// The output's directory is made when missing (mkdir -p), and taken away again if the run fails
static int preprocess_run(PreprocessArgs* a, char* err, size_t errlen) {
    char dir[4096] = "", made[4200] = "";
    const char* slash = strrchr(a->output_prefix, '/');
    if (slash && slash > a->output_prefix) snprintf(dir, sizeof dir, "%.*s", (int)(slash - a->output_prefix), a->output_prefix);
    int rc = a->tokenizer == GPT2_TOKENIZER ? open_gpt2(a, err, errlen) : 0;
    if (rc == 0 && dir[0]) rc = make_dirs("--output-prefix", dir, made, sizeof made, err, errlen);
    if (rc == 0) rc = preprocess_write(a, err, errlen);
    if (rc && dir[0]) remove_made_dirs(dir, made);
    close_gpt2(a);
    return rc;
}

static const char* PREPROCESS_USAGE =
    "usage: preprocess --input FILE [FILE ...] --output-prefix PREFIX [--json-keys KEY [KEY ...] | --input-format text]\n"
    "                  [--append-eod] [--tokenizer-type bytes|ids|GPT2BPETokenizer] [--vocab-file VOCAB.json]\n"
    "                  [--merge-file MERGES.txt] [--vocab-size N] [--dtype NAME] [--workers N]\n"
    "       preprocess --inspect PREFIX\n"
    "       preprocess --print-samples --data-path [WEIGHT] PREFIX [...] --seq-length S --num-samples K [--seed 1234]\n"
    "                  [--split 969,30,1] [--which train|valid|test] [--first F] [--data-cache-path DIR]\n"
    "Writes PREFIX_KEY_document.bin/.idx (KEY: text unless --json-keys) in Megatron's mmap format. The input is\n"
    "JSON lines, as preprocess_data.py's: each line's KEY string is one document (--json-keys: text by default).\n"
    "--input-format text reads plain text instead: each input file is one document (a line, for ids).\n"
    "  bytes (default): token = byte 0..255, end of document 256\n"
    "  ids:             whitespace-separated token ids (Megatron's NullTokenizer);\n"
    "                   --vocab-size N: ids must be below N, and the end-of-document id is N\n"
    "  GPT2BPETokenizer: GPT-2's BPE from --vocab-file (encoder.json) and --merge-file (vocab.bpe), 50257 ids,\n"
    "                   end of document <|endoftext|> (50256); the text must be UTF-8\n"
    "  --dtype:         uint8 int8 int16 uint16 int32 int64 (default: uint16 if the vocabulary < 65500, else int32)\n"
    "--inspect prints dtype, counts, the id range and the order-0 entropy. --print-samples prints the first F\n"
    "(default K) samples of a split as the trainer sees them, one line of S+1 token ids each, with K samples asked\n"
    "of that split; the index cache goes beside the data unless --data-cache-path.\n";

// returns the exit status: 0, or 2 after printing one error line
static inline int preprocess_main(int argc, char** argv) {
    PreprocessArgs a;
    char err[8192];
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { fputs(PREPROCESS_USAGE, stdout); return 0; }
    if (argc < 2) { fputs(PREPROCESS_USAGE, stderr); return 2; }
    int rc = preprocess_parse(argc, argv, &a, err, sizeof err);
    if (rc == 0) rc = a.print_samples ? preprocess_print_samples(&a, err, sizeof err)
                      : a.inspect     ? preprocess_inspect(a.inspect, err, sizeof err)
                                      : preprocess_run(&a, err, sizeof err);
    if (rc) fprintf(stderr, "error: %s\n", err);
    return rc ? 2 : 0;
}

#ifndef DATA_TESTING
int main(int argc, char** argv) { return preprocess_main(argc, argv); }
#endif
