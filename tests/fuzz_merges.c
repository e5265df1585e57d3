/*
tests/fuzz_merges.c — a libFuzzer target for tokenizer.h's merges reader (issue 45, items 5 and 13).

An input is the bytes of a merges file (vocab.bpe, merges.txt). GPT-2's tokenizer is loaded once
from tests/data/gpt2 (or $FUZZ_GPT2_DIR); each input is written to a private folder on tmpfs
(/dev/shm, else $TMPDIR or /tmp) and loaded over that vocabulary with tokenizer_load_merges. What
must hold, whatever the bytes:
  - a refusal is one line in err, "--merge-file <file>: <what is wrong>";
  - an accepted file tokenizes a fixed text (GPT-2's pattern's cases, every byte value as UTF-8)
    into ids of the vocabulary whose bytes give the text back, with its word cache and without
    it alike; AddressSanitizer and UBSan watch the reading on the way.
A broken rule aborts, which libFuzzer reports as a crash with the input that caused it.

    clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Wall -Wextra -Werror \
          tests/fuzz_merges.c -o fuzz_merges
    clang -std=gnu11 -O1 -DFUZZ_SEED_MAIN -Wall -Wextra -Werror tests/fuzz_merges.c -o fuzz_merges_seeds
    ./fuzz_merges_seeds tests/data/gpt2/vocab.bpe corpus_merges       # the seed corpus
    cp tests/data/hostile/merges/[a-z]* corpus_merges/               # and the hostile files
    ./fuzz_merges -max_total_time=30 -max_len=600000 corpus_merges    # from the repository's root

With FUZZ_SEED_MAIN defined, the program writes the seed corpus instead: GPT-2's whole file (the
one input that is accepted as it stands), the same with two merges swapped, with \r\n line ends,
cut after 1,000 merges, cut inside a line, its #version line alone, and an empty file.
*/
#define FUZZ_NAME "fuzz_merges"
#include "fuzz.h"
#include "../files.h"
#include "../tokenizer.h"
#include <sys/stat.h>
#include <unistd.h>

#ifndef FUZZ_SEED_MAIN
// ----------------------------------------------------------------------------
// the target

static char merges_path[4100], vocab_path[4100];
static Tokenizer gpt2;   // GPT-2's vocabulary; its merges replaced by each input's

// GPT-2's tokenizer, and a private folder for the input's file, on the first call
static void set_up(void) {
    if (merges_path[0]) return;
    const char* dir = getenv("FUZZ_GPT2_DIR") ? getenv("FUZZ_GPT2_DIR") : "tests/data/gpt2";
    char merges[4100], err[8192];
    snprintf(vocab_path, sizeof vocab_path, "%s/encoder.json", dir);
    snprintf(merges, sizeof merges, "%s/vocab.bpe", dir);
    if (tokenizer_load(&gpt2, vocab_path, merges, err, sizeof err)) fuzz_fail("GPT-2's tokenizer (run from the repository's root, or set FUZZ_GPT2_DIR)", err);
    snprintf(merges_path, sizeof merges_path, "%s/merges.txt", fuzz_work_dir());
}

// a refusal names the file and says what is wrong, on one line
static void check_error_line(const char* err) {
    char start[4200];
    snprintf(start, sizeof start, "--merge-file %s: ", merges_path);
    if (strncmp(err, start, strlen(start)) != 0 || strchr(err, '\n')) fuzz_fail("error line is not \"--merge-file <file>: ...\"", err);
}

// GPT-2's pattern's cases (contractions, letters, numbers, runs of spaces, other scripts, emoji)
// and every code point below U+0100, so every byte token is needed
static const char* test_text(size_t* n) {
    static char text[1024];
    static size_t len;
    if (len) return *n = len, text;
    len = (size_t)snprintf(text, sizeof text, "Hello world! I'm here, you're there; it's 12345 \xce\x95\xce\xbb\xce\xbb "
                           "\xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80  a   b\t\n\n");
    for (uint32_t cp = 1; cp < 256; cp++) len += (size_t)utf8_put(text + len, cp);
    return *n = len, text;
}

// an accepted file's promise: the text's ids are the vocabulary's and give the text back
static void check_tokens(const Tokenizer* t, TokenizerCache* cache) {
    size_t n, bad = 0, at = 0, len;
    const char* text = test_text(&n);
    TokenIds ids = {NULL, 0, 0};
    if (tokenizer_encode(t, cache, text, n, &ids, &bad) != 0) fuzz_fail(merges_path, "the test text refused as not UTF-8");
    for (size_t i = 0; i < ids.n; i++) {
        if (ids.ids[i] < 0 || ids.ids[i] >= t->vocab_size) fuzz_fail(merges_path, "an id outside the vocabulary");
        const char* bytes = tokenizer_token_bytes(t, ids.ids[i], &len);
        if (at + len > n || memcmp(text + at, bytes, len) != 0) fuzz_fail(merges_path, "the ids do not give the text back");
        at += len;
    }
    if (at != n) fuzz_fail(merges_path, "the ids give back less than the text");
    free(ids.ids);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    set_up();
    fuzz_write_file(merges_path, data, size);
    char err[8192] = {0};
    if (tokenizer_load_merges(&gpt2, vocab_path, merges_path, err, sizeof err) != 0) {
        check_error_line(err);
        return 0;
    }
    TokenizerCache* cache = tokenizer_cache_new();
    check_tokens(&gpt2, cache);
    check_tokens(&gpt2, cache);   // (the second time from the cache)
    check_tokens(&gpt2, NULL);
    tokenizer_cache_free(cache);
    return 0;
}

#else
// ----------------------------------------------------------------------------
// the seed corpus

static char* slurp(const char* path, size_t* len) {
    char err[4400];
    char* text = read_whole_file(path, len, err, sizeof err);   // tokenizer.h's
    if (text == NULL) fuzz_fail(path, err);
    return text;
}

static void seed(const char* dir, const char* name, const char* p, size_t n) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    fuzz_write_file(path, (const uint8_t*)p, n);
}

// the offset of line k (0-based) in text
static size_t line_start(const char* text, size_t n, int k) {
    size_t at = 0;
    for (; k > 0 && at < n; at++) k -= text[at] == '\n';
    return at;
}

int main(int argc, char** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s VOCAB.BPE OUT_DIR\n", argv[0]);
        return 2;
    }
    size_t n;
    char* text = slurp(argv[1], &n);
    const char* dir = argv[2];
    mkdir(dir, 0755);
    seed(dir, "whole", text, n);
    seed(dir, "cut_1000", text, line_start(text, n, 1001));
    seed(dir, "cut_in_a_line", text, line_start(text, n, 1001) - 3);
    seed(dir, "header_only", text, line_start(text, n, 1));
    seed(dir, "empty", text, 0);
    char* other = (char*)malloc(2 * n + 1);
    if (other == NULL) fuzz_fail(argv[1], "out of memory");
    size_t a = line_start(text, n, 100), b = line_start(text, n, 101), c = line_start(text, n, 102), k = 0;
    memcpy(other, text, a);   // lines 100 and 101 swapped
    memcpy(other + a, text + b, c - b);
    memcpy(other + a + (c - b), text + a, b - a);
    memcpy(other + c, text + c, n - c);
    seed(dir, "swapped", other, n);
    for (size_t i = 0; i < n; i++) {   // \r\n line ends
        if (text[i] == '\n') other[k++] = '\r';
        other[k++] = text[i];
    }
    seed(dir, "crlf", other, k);
    free(other);
    free(text);
    return 0;
}
#endif
