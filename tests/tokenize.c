/*
tests/tokenize.c — tokenizer.h from the command line: encode, decode and time it, for
tests/test_tokenizer.sh (against Hugging Face's GPT2Tokenizer) and tests/bench_tokenizer.sh.

    gcc -std=gnu11 -O2 -Wall -Wextra -Werror tests/tokenize.c -o tests/build/tokenize

  tokenize [--docs] [--no-cache] VOCAB MERGES FILE  FILE's tokens: one id per line
  tokenize [--docs] --decode VOCAB MERGES IDS       ids (as encoding wrote them) back to bytes
  tokenize [--docs] --bench N VOCAB MERGES FILE     tokens/s of encoding FILE N times, one
                                                    thread: a fresh cache each pass (cold), one
                                                    cache kept across passes (warm), no cache

Without --docs, FILE is one text, encoded in one call, and --decode writes the bytes of all
the ids. With --docs, FILE is a list of documents, each a header line "LENGTH NAME", LENGTH
bytes, then a newline (tests/make_torture_text.py and tests/make_big_text.py write them);
each document is encoded on its own, as preprocess encodes each JSON line's text, and its
ids follow a line "# NAME"; --decode turns that back into the documents' file, byte for
byte, with each LENGTH counted from the decoded bytes. --no-cache encodes without a cache of
words (tokenizer_encode's cache NULL): the ids must be the same.

Text that is not UTF-8 is refused: one line naming the file, the byte offset in it (and the
document), exit status 2. So are a malformed documents' file and an id outside the
vocabulary.
*/
#include "../files.h"
#include "../tokenizer.h"
#include <errno.h>
#include <stdarg.h>
#include <time.h>

// the one error path: a line "error: tokenize: ...", exit status 2
__attribute__((format(printf, 1, 2))) static void die(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "error: tokenize: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(2);
}

static void* xrealloc(void* p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (p == NULL) die("out of memory");
    return p;
}

// the whole file, NUL-terminated (the NUL is not counted in *len)
static char* read_file(const char* path, size_t* len) {
    FILE* f = fopen(path, "rb");
    if (f == NULL) die("cannot open %s: %s", path, strerror(errno));
    size_t cap = 1 << 20, n = 0, got;
    char* buf = (char*)xrealloc(NULL, cap);
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) buf = (char*)xrealloc(buf, cap *= 2);
    }
    if (ferror(f)) die("cannot read %s: %s", path, strerror(errno));
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ----------------------------------------------------------------------------
// documents: FILE whole, or with --docs its records "LENGTH NAME\n" + LENGTH bytes + "\n"

typedef struct {
    const char* text; size_t len;   // the document's bytes
    size_t offset;                  // where they start in the file
    const char* name; int name_len;
} Doc;

static Doc* split_docs(const char* path, char* buf, size_t len, int docs_mode, size_t* num_docs) {
    Doc* d = NULL;
    size_t n = 0, cap = 0, pos = 0;
    if (!docs_mode) {
        d = (Doc*)xrealloc(NULL, sizeof(Doc));
        d[0] = (Doc){buf, len, 0, path, (int)strlen(path)};
        *num_docs = 1;
        return d;
    }
    while (pos < len) {
        char* eol = (char*)memchr(buf + pos, '\n', len - pos);
        char* end;
        errno = 0;
        unsigned long long doc_len = strtoull(buf + pos, &end, 10);
        if (eol == NULL || end == buf + pos || errno || (*end != ' ' && *end != '\n'))
            die("%s: byte %zu: expected a document header \"LENGTH NAME\"", path, pos);
        size_t body = (size_t)(eol - buf) + 1;
        if (doc_len > len - body || body + doc_len >= len || buf[body + doc_len] != '\n')
            die("%s: byte %zu: the document's LENGTH runs past its closing newline or the file's end", path, pos);
        if (n == cap) d = (Doc*)xrealloc(d, (cap = 2 * cap + 64) * sizeof(Doc));
        const char* name = *end == ' ' ? end + 1 : end;
        d[n++] = (Doc){buf + body, (size_t)doc_len, body, name, (int)(eol - name)};
        pos = body + doc_len + 1;
    }
    *num_docs = n;
    return d;
}

// ----------------------------------------------------------------------------
// encode, decode, bench

static void encode_or_die(const Tokenizer* t, TokenizerCache* cache, const char* path, const Doc* d, int docs_mode,
                          TokenIds* out) {
    size_t bad = 0;
    out->n = 0;
    if (tokenizer_encode(t, cache, d->text, d->len, out, &bad) == 0) return;
    char doc[300] = "";
    if (docs_mode) snprintf(doc, sizeof doc, " (byte %zu of document \"%.*s\")", bad, d->name_len, d->name);
    die("%s: invalid UTF-8 at byte %zu%s", path, d->offset + bad, doc);
}

static void encode_main(const Tokenizer* t, const char* path, const Doc* docs, size_t num_docs, int docs_mode,
                        int no_cache) {
    TokenizerCache* cache = no_cache ? NULL : tokenizer_cache_new();
    TokenIds out = {0};
    for (size_t i = 0; i < num_docs; i++) {
        encode_or_die(t, cache, path, &docs[i], docs_mode, &out);
        if (docs_mode) printf("# %.*s\n", docs[i].name_len, docs[i].name);
        for (size_t j = 0; j < out.n; j++) printf("%d\n", out.ids[j]);
    }
    if (fflush(stdout) != 0 || ferror(stdout)) die("cannot write the ids: %s", strerror(errno));
    free(out.ids);
    tokenizer_cache_free(cache);
}

static void decode_flush(char* name, char* bytes, size_t n) {
    if (name == NULL) return;
    printf("%zu %s\n", n, name);
    fwrite(bytes, 1, n, stdout);
    putchar('\n');
}

static void decode_main(const Tokenizer* t, const char* path, char* buf, int docs_mode) {
    char* name = NULL;   // --docs: the document being decoded
    char* bytes = NULL;
    size_t n = 0, cap = 0, line = 0;
    for (char* p = buf; *p; ) {
        char* eol = strchr(p, '\n');
        if (eol) *eol = 0;
        line++;
        if (docs_mode && p[0] == '#' && p[1] == ' ') {
            decode_flush(name, bytes, n);
            name = p + 2, n = 0;
        } else if (*p) {
            char* end;
            long id = strtol(p, &end, 10);
            if (*end || end == p) die("%s:%zu: expected one token id", path, line);
            if (id < 0 || id >= t->vocab_size) die("%s:%zu: id %ld is not in the vocabulary (0 to %d)", path, line, id, t->vocab_size - 1);
            if (docs_mode && name == NULL) die("%s:%zu: an id before the first \"# NAME\" line", path, line);
            size_t len;
            const char* b = tokenizer_token_bytes(t, (int)id, &len);
            if (n + len > cap) bytes = (char*)xrealloc(bytes, cap = 2 * (n + len));
            memcpy(bytes + n, b, len);
            n += len;
            if (!docs_mode) fwrite(bytes, 1, n, stdout), n = 0;
        }
        if (eol == NULL) break;
        p = eol + 1;
    }
    decode_flush(name, bytes, n);
    if (fflush(stdout) != 0 || ferror(stdout)) die("cannot write the bytes: %s", strerror(errno));
    free(bytes);
}

// seconds for one pass over the documents; *tokens: how many it made
static double bench_pass(const Tokenizer* t, TokenizerCache* cache, const char* path, const Doc* docs,
                         size_t num_docs, int docs_mode, TokenIds* out, size_t* tokens) {
    double t0 = now_seconds();
    *tokens = 0;
    for (size_t i = 0; i < num_docs; i++) {
        encode_or_die(t, cache, path, &docs[i], docs_mode, out);
        *tokens += out->n;
    }
    return now_seconds() - t0;
}

static void bench_main(const Tokenizer* t, const char* path, const Doc* docs, size_t num_docs, int docs_mode,
                       int passes) {
    size_t bytes = 0, tokens = 0;
    for (size_t i = 0; i < num_docs; i++) bytes += docs[i].len;
    TokenIds out = {0};
    const char* what[3] = {"cold cache", "warm cache", "no cache"};
    const char* how[3] = {"a fresh cache each pass", "one cache, filled by a pass before", "cache NULL"};
    for (int mode = 0; mode < 3; mode++) {
        TokenizerCache* kept = mode == 1 ? tokenizer_cache_new() : NULL;
        if (mode == 1) bench_pass(t, kept, path, docs, num_docs, docs_mode, &out, &tokens);
        double total = 0, best = 1e30;
        for (int p = 0; p < passes; p++) {
            TokenizerCache* cache = mode == 0 ? tokenizer_cache_new() : kept;
            double t0 = now_seconds();   // a cold pass counts its cache's making and freeing
            bench_pass(t, cache, path, docs, num_docs, docs_mode, &out, &tokens);
            if (mode == 0) tokenizer_cache_free(cache);
            double s = now_seconds() - t0;
            total += s;
            if (s < best) best = s;
        }
        if (kept) tokenizer_cache_free(kept);
        printf("tokenize %-10s %6.2f M tokens/s %6.2f MB/s (best pass %.2f M tokens/s); %zu tokens of %zu bytes "
               "in %zu documents x %d passes, one thread, %s\n",
               what[mode], 1e-6 * (double)tokens * passes / total, 1e-6 * (double)bytes * passes / total,
               1e-6 * (double)tokens / best, tokens, bytes, num_docs, passes, how[mode]);
    }
    free(out.ids);
}

// ----------------------------------------------------------------------------

int main(int argc, char** argv) {
    int docs_mode = 0, decode = 0, passes = 0, no_cache = 0, i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (strcmp(argv[i], "--docs") == 0) docs_mode = 1;
        else if (strcmp(argv[i], "--decode") == 0) decode = 1;
        else if (strcmp(argv[i], "--no-cache") == 0) no_cache = 1;
        else if (strcmp(argv[i], "--bench") == 0 && i + 1 < argc && (passes = atoi(argv[i + 1])) > 0) i++;
        else die("unknown or incomplete option %s (see tests/tokenize.c's header)", argv[i]);
    }
    if (argc - i != 3 || decode + (passes > 0) + no_cache > 1)
        die("usage: tokenize [--docs] [--decode | --bench N | --no-cache] VOCAB MERGES FILE");
    Tokenizer t;
    char err[512];
    if (tokenizer_load(&t, argv[i], argv[i + 1], err, sizeof err) != 0) die("%s", err);
    const char* path = argv[i + 2];
    size_t len, num_docs;
    char* buf = read_file(path, &len);
    if (decode) {
        decode_main(&t, path, buf, docs_mode);
    } else {
        Doc* docs = split_docs(path, buf, len, docs_mode, &num_docs);
        if (passes) bench_main(&t, path, docs, num_docs, docs_mode, passes);
        else encode_main(&t, path, docs, num_docs, docs_mode, no_cache);
        free(docs);
    }
    free(buf);
    tokenizer_free(&t);
    return 0;
}
