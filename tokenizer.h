/*
tokenizer.h — GPT-2's byte-level BPE (Radford et al. 2019), in C: load, encode, decode.

Megatron's GPT2BPETokenizer, from the two files OpenAI published: VOCAB.json (encoder.json,
Hugging Face's vocab.json: a JSON object of token strings to ids) and MERGES.txt (vocab.bpe,
merges.txt: a "#version" line, then one merge "a b" per line, the most frequent first).
Encoding, as GPT-2's encoder.py and transformers' GPT2Tokenizer do:
  1. pre-tokenization: the text is cut into words by GPT-2's pattern
         's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
     (contractions; a letter run, a number run, or a run of anything else, each with at most
     one space before it; whitespace, of which a run followed by a word leaves its last
     character to that word). \p{L}, \p{N} and \s come from tokenizer_unicode.h, a table generated from
     the Unicode Character Database by scripts/gen_unicode_table.py;
  2. each word's UTF-8 bytes become symbols through GPT-2's byte-to-unicode table (printable
     bytes stand for themselves, the others are moved to U+0100 and up, so that every symbol
     is a printable character of the vocabulary's strings). Here it is done the other way
     round, once: at load each vocabulary entry is turned back into the bytes it stands for,
     and words are merged as bytes;
  3. BPE: the adjacent pair of lowest merge rank is merged, everywhere in the word, until no
     pair has a rank; each resulting symbol is a vocabulary entry, its id the token.
Words seen are cached (a word's tokens depend on the word alone); a cache belongs to one
thread. Decoding maps each id back to its bytes.

Loading checks that the merges match the vocabulary (every token is a byte, a merge's result or
a special token: check_every_token_built), and reads into buffers as long as the file, never
into fixed ones.

Interface (static inline: a program may use part of it): tokenizer_load, tokenizer_free,
tokenizer_encode, tokenizer_token_bytes, tokenizer_cache_new, tokenizer_cache_free,
tokenizer_load_merges (the merges alone, over a loaded vocabulary: tests/fuzz_merges.c);
Tokenizer.eod (the id of <|endoftext|>), Tokenizer.vocab_hash and merges_hash (what ranks compare).
*/
#pragma once
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer_unicode.h"

// a growing array of token ids
typedef struct {
    int* ids;
    size_t n, cap;
} TokenIds;

static void token_ids_push(TokenIds* out, int id) {
    if (out->n == out->cap) {
        out->cap = out->cap ? 2 * out->cap : 1024;
        out->ids = (int*)realloc(out->ids, out->cap * sizeof(int));
        if (!out->ids) { fprintf(stderr, "error: out of memory for token ids\n"); exit(1); }
    }
    out->ids[out->n++] = id;
}

static void* tokenizer_alloc(size_t n) {   // (calloc, or the process ends: a tokenizer has no way back)
    void* p = calloc(n ? n : 1, 1);
    if (!p) { fprintf(stderr, "error: out of memory for the tokenizer\n"); exit(1); }
    return p;
}

// ----------------------------------------------------------------------------
// GPT-2's byte-to-unicode table: the 188 printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF)
// stand for themselves; the 68 others (controls, space, 0x7F..0xA0, 0xAD) are given the code
// points 256, 257, ... in byte order. Each vocabulary string is a sequence of these.

static int printable_byte(int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

// ----------------------------------------------------------------------------
// UTF-8

// the code point at p (n bytes left) and its length, or 0 when the bytes there are not UTF-8
// (overlong forms, surrogates and values past U+10FFFF are not: RFC 3629)
static int utf8_next(const unsigned char* p, size_t n, uint32_t* cp) {
    if (n == 0) return 0;
    if (p[0] < 0x80) return *cp = p[0], 1;
    int len = p[0] >= 0xF0 ? 4 : p[0] >= 0xE0 ? 3 : p[0] >= 0xC2 ? 2 : 0;
    if (len == 0 || p[0] > 0xF4 || (size_t)len > n) return 0;
    uint32_t c = p[0] & (0x7F >> len);
    for (int k = 1; k < len; k++) {
        if ((p[k] & 0xC0) != 0x80) return 0;
        c = (c << 6) | (p[k] & 0x3F);
    }
    static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < least[len] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
    *cp = c;
    return len;
}

// ----------------------------------------------------------------------------
// two hash tables, open addressing (FNV-1a): byte strings to ids, and merges to their rank

static uint64_t fnv1a_more(uint64_t h, const void* data, size_t n) {   // h, carried on over n more bytes
    const unsigned char* p = (const unsigned char*)data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t fnv1a(const void* data, size_t n) { return fnv1a_more(0xcbf29ce484222325ull, data, n); }

typedef struct {
    int rank, merged;   // rank -1: an empty slot
    uint64_t pair;      // left id << 32 | right id
} MergeSlot;

struct TokenizerTables {
    int* vocab_slot;          // [vocab_mask + 1] ids by their bytes' hash, -1 empty
    size_t vocab_mask;
    MergeSlot* merge_slot;    // [merge_mask + 1]
    size_t merge_mask;
};

// ----------------------------------------------------------------------------
// the tokenizer

typedef struct {
    int vocab_size;                 // the vocabulary's entries (50257 for GPT-2)
    int eod;                        // the id of <|endoftext|> (50256), -1 if the vocabulary lacks it
    char** token;                   // [vocab_size] each id's bytes
    int* token_len;                 // [vocab_size]
    int byte_token[256];            // the id of each single byte
    struct TokenizerTables tables;
    uint64_t vocab_hash, merges_hash;   // FNV-1a of what was loaded: each id's bytes in id order, each
                                        // merge's ids in the file's order (ranks compare them)
} Tokenizer;

static size_t table_size_for(size_t entries) {   // a power of two at least twice as large
    size_t n = 1024;
    while (n < 2 * entries) n *= 2;
    return n;
}

// the id whose bytes are s[0..n), -1 if none
static int vocab_lookup(const Tokenizer* t, const char* s, size_t n) {
    const struct TokenizerTables* x = &t->tables;
    for (size_t i = fnv1a(s, n) & x->vocab_mask;; i = (i + 1) & x->vocab_mask) {
        int id = x->vocab_slot[i];
        if (id < 0) return -1;
        if ((size_t)t->token_len[id] == n && memcmp(t->token[id], s, n) == 0) return id;
    }
}

static void vocab_insert(Tokenizer* t, int id) {
    struct TokenizerTables* x = &t->tables;
    size_t i = fnv1a(t->token[id], t->token_len[id]) & x->vocab_mask;
    while (x->vocab_slot[i] >= 0) i = (i + 1) & x->vocab_mask;
    x->vocab_slot[i] = id;
}

static MergeSlot* merge_find(const struct TokenizerTables* x, uint64_t pair) {   // its slot, or the empty one it would take
    for (size_t i = fnv1a(&pair, sizeof(pair)) & x->merge_mask;; i = (i + 1) & x->merge_mask)
        if (x->merge_slot[i].rank < 0 || x->merge_slot[i].pair == pair) return &x->merge_slot[i];
}

// GPT-2's files are 1 MB and 456 KB: one past this is not a tokenizer's, and below it every
// length and line number fits an int
enum { TOKENIZER_FILE_MAX = 1 << 30 };

// the whole of a regular file, NUL-terminated (*n its length); NULL with "PATH: why" in err
static char* read_whole_file(const char* path, size_t* n, char* err, size_t errlen) {
    FILE* f = fopen_regular_file(path, err, errlen);
    if (!f) return NULL;
    char* text = NULL;
    size_t cap = 0;
    *n = 0;
    for (size_t got = 1; got > 0;) {
        if (*n > TOKENIZER_FILE_MAX) {
            fclose(f);
            free(text);
            error_line(err, errlen, "%s: larger than 1 GiB, which no tokenizer file is (GPT-2's are about 1 MB)", path);
            return NULL;
        }
        if (*n + 65536 + 1 > cap) text = (char*)realloc(text, cap = 2 * cap + 65536 + 1);
        if (!text) { fclose(f); error_line(err, errlen, "%s: out of memory", path); return NULL; }
        got = fread(text + *n, 1, 65536, f);
        *n += got;
    }
    int failed = ferror(f);
    fclose(f);
    if (failed) { free(text); error_line(err, errlen, "%s: read failed: %s", path, strerror(errno)); return NULL; }
    text[*n] = '\0';
    return text;
}

// ----------------------------------------------------------------------------
// loading VOCAB.json: {"symbols": id, ...}, JSON strings with their escapes

// cp as UTF-8 at out; its length
static int utf8_put(char* out, uint32_t cp) {
    if (cp < 0x80) return out[0] = (char)cp, 1;
    if (cp < 0x800) return out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12), out[1] = (char)(0x80 | ((cp >> 6) & 0x3F)), out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18), out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

// four hex digits at p, or -1
static long hex4(const char* p) {
    long v = 0;
    for (int k = 0; k < 4; k++) {
        int c = p[k], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = 16 * v + d;
    }
    return v;
}

// the escape after a backslash at *pp (moved past it): its code point, or -1 with *why; a
// surrogate pair is one code point. A lone surrogate is refused: it is no character and has no
// UTF-8 (Python's json.loads keeps it, but encoding it as UTF-8 then raises; writing U+FFFD in
// its place would hide damaged data)
static long json_escape(const char** pp, const char* end, const char** why) {
    const char *p = *pp, *simple = "\"\\/bfnrt", *meant = "\"\\/\b\f\n\r\t";
    *why = "an escape that is not JSON's";
    if (p >= end) return -1;
    const char* k = *p != 'u' ? strchr(simple, *p) : NULL;
    if (*p != 'u') return k && *p ? (*pp = p + 1, meant[k - simple]) : -1;
    long cp = end - p >= 5 ? hex4(p + 1) : -1, lo = -1;
    if (cp < 0) return *why = "a \\u escape without four hex digits", -1;
    p += 5;
    if (cp >= 0xD800 && cp <= 0xDBFF && end - p >= 6 && p[0] == '\\' && p[1] == 'u' && (lo = hex4(p + 2)) >= 0xDC00 &&
        lo <= 0xDFFF) {   // a surrogate pair: one code point past U+FFFF
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        p += 6;
    }
    if (cp >= 0xD800 && cp <= 0xDFFF) return *why = "a lone surrogate (a \\uD800-\\uDFFF escape without its pair): no character, "
                                                    "and no UTF-8 (Python's strict encoding refuses it too)", -1;
    *pp = p;
    return cp;
}

// a JSON string at *pp (after its opening quote) into out as UTF-8, *pp moved past its closing
// quote; NULL, or what is wrong. out needs no more room than the string takes in the file (an
// escape is longer than its UTF-8)
static const char* json_string_utf8(const char** pp, const char* end, char* out, size_t* len) {
    const char* p = *pp;
    *len = 0;
    while (p < end && *p != '"') {
        if (*p != '\\') {   // the file's own bytes (its UTF-8 is checked with the symbols)
            out[(*len)++] = *p++;
            continue;
        }
        const char* why;
        p++;
        long cp = json_escape(&p, end, &why);
        if (cp < 0) return why;
        *len += utf8_put(out + *len, (uint32_t)cp);
    }
    if (p >= end) return "an unterminated string";
    *pp = p + 1;
    return NULL;
}

// a vocabulary string's symbols as the bytes they stand for, into out (room for n bytes: a
// symbol is one or two bytes of UTF-8 and stands for one); its length, or -1 when a symbol is
// not one of the 256 (symbol_byte: code point -> byte, -1 none)
static int symbols_to_bytes(const char* s, size_t n, const int* symbol_byte, char* out) {
    int len = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = utf8_next((const unsigned char*)s + i, n - i, &cp);
        if (k == 0 || cp >= 512 || symbol_byte[cp] < 0) return -1;
        out[len++] = (char)symbol_byte[cp];
        i += k;
    }
    return len;
}

// symbol_byte[cp]: the byte that code point cp (< 512) stands for, -1 if none
static void symbol_byte_table(int* symbol_byte /* [512] */) {
    for (int cp = 0; cp < 512; cp++) symbol_byte[cp] = -1;
    for (int b = 0, n = 256; b < 256; b++) symbol_byte[printable_byte(b) ? b : n++] = b;
}

static int line_of(const char* text, const char* at) {   // 1-based
    int line = 1;
    for (const char* p = text; p < at; p++) line += *p == '\n';
    return line;
}

static const char* skip_json_space(const char* p, const char* end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

// one "symbols": id entry of VOCAB.json at *pp into (bytes, id); NULL, or what is wrong.
// symbols and bytes: room for the rest of the file (end - *pp)
static const char* vocab_entry(const char** pp, const char* end, const int* symbol_byte, char* symbols, char* bytes,
                               int* len, long* id) {
    size_t n;
    const char* p = skip_json_space(*pp, end);
    if (p >= end || *p != '"') return "expected a string (a token's symbols)";
    p++;
    const char* why = json_string_utf8(&p, end, symbols, &n);
    if (why) return why;
    if ((*len = symbols_to_bytes(symbols, n, symbol_byte, bytes)) < 0)
        return "a token whose characters are not GPT-2's byte symbols";
    p = skip_json_space(p, end);
    if (p >= end || *p++ != ':') return "expected ':' after a token";
    p = skip_json_space(p, end);
    char* stop;
    *id = strtol(p, &stop, 10);
    if (stop == p || *id < 0 || *id > 10000000) return "expected an id (an integer from 0) after a token";
    *pp = skip_json_space(stop, end);
    return NULL;
}

// VOCAB.json into t->token, t->token_len, t->vocab_size: every id from 0 to the largest, once
static int load_vocab(Tokenizer* t, const char* path, char* err, size_t errlen) {
    size_t size;
    char reason[4400];
    char* text = read_whole_file(path, &size, reason, sizeof reason);
    if (!text) return error_line(err, errlen, "--vocab-file %s", reason);
    int symbol_byte[512], cap = 0, n = 0, status = 0;
    symbol_byte_table(symbol_byte);
    char** token = NULL;
    int *token_len = NULL, *id_of = NULL;
    char* symbols = (char*)tokenizer_alloc(size);   // one token's, as long as the file at most
    char* bytes = (char*)tokenizer_alloc(size);
    const char *p = skip_json_space(text, text + size), *end = text + size, *why = NULL;
    if (p >= end || *p++ != '{') why = "expected a JSON object of tokens to ids";
    for (int first = 1; !why && (p = skip_json_space(p, end)) < end && *p != '}'; first = 0) {
        if (!first && *p++ != ',') { why = "expected ',' or '}' between entries"; break; }
        int len;
        long id;
        if ((why = vocab_entry(&p, end, symbol_byte, symbols, bytes, &len, &id)) != NULL) break;
        if (n == cap) {
            cap = cap ? 2 * cap : 65536;
            token = (char**)realloc(token, cap * sizeof(char*));
            token_len = (int*)realloc(token_len, cap * sizeof(int));
            id_of = (int*)realloc(id_of, cap * sizeof(int));
            if (!token || !token_len || !id_of) { why = "out of memory"; break; }
        }
        token[n] = (char*)tokenizer_alloc(len + 1);
        memcpy(token[n], bytes, len);
        token_len[n] = len;
        id_of[n++] = (int)id;
    }
    if (!why && (p >= end || skip_json_space(p + 1, end) != end)) why = "expected the object to end the file";
    if (why) status = error_line(err, errlen, "--vocab-file %s: line %d: %s", path, line_of(text, p < end ? p : end), why);
    // by id: every id from 0 to the largest exactly once
    int vocab_size = 0;
    for (int i = 0; i < n && !status; i++) vocab_size = id_of[i] + 1 > vocab_size ? id_of[i] + 1 : vocab_size;
    t->token = (char**)tokenizer_alloc((size_t)(vocab_size > n ? vocab_size : n) * sizeof(char*));
    t->token_len = (int*)tokenizer_alloc((size_t)(vocab_size > n ? vocab_size : n) * sizeof(int));
    for (int i = 0; i < n && !status; i++) {
        if (t->token[id_of[i]]) {   // (the first stays, to be freed with the rest)
            status = error_line(err, errlen, "--vocab-file %s: id %d is given twice", path, id_of[i]);
            break;
        }
        t->token[id_of[i]] = token[i], token[i] = NULL;
        t->token_len[id_of[i]] = token_len[i];
    }
    for (int id = 0; id < vocab_size && !status; id++)
        if (!t->token[id]) status = error_line(err, errlen, "--vocab-file %s: no token has id %d (ids must run from 0 to %d)", path,
                                             id, vocab_size - 1);
    if (!status && vocab_size == 0) status = error_line(err, errlen, "--vocab-file %s: no tokens", path);
    t->vocab_size = vocab_size > n ? vocab_size : n;   // (the tables' length, until a refusal frees them)
    for (int i = 0; i < n; i++) free(token[i]);
    free(token);
    free(token_len);
    free(id_of);
    free(symbols);
    free(bytes);
    free(text);
    return status;
}

// the ids by their bytes (after load_vocab); 0, or 1 when two ids have the same bytes
static int index_vocab(Tokenizer* t, const char* path, char* err, size_t errlen) {
    struct TokenizerTables* x = &t->tables;
    x->vocab_mask = table_size_for(t->vocab_size) - 1;
    x->vocab_slot = (int*)tokenizer_alloc((x->vocab_mask + 1) * sizeof(int));
    memset(x->vocab_slot, 0xFF, (x->vocab_mask + 1) * sizeof(int));   // -1: empty
    for (int id = 0; id < t->vocab_size; id++) {
        int other = vocab_lookup(t, t->token[id], t->token_len[id]);
        if (other >= 0)
            return error_line(err, errlen, "--vocab-file %s: ids %d and %d are the same token", path, other, id);
        vocab_insert(t, id);
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        if ((t->byte_token[b] = vocab_lookup(t, &c, 1)) < 0)
            return error_line(err, errlen, "--vocab-file %s: no token for the byte 0x%02x (a byte-level vocabulary has all 256)",
                            path, b);
    }
    t->eod = vocab_lookup(t, "<|endoftext|>", 13);
    uint64_t hash = fnv1a(NULL, 0);
    for (int id = 0; id < t->vocab_size; id++) {
        hash = fnv1a_more(hash, &t->token_len[id], sizeof(int));
        hash = fnv1a_more(hash, t->token[id], t->token_len[id]);
    }
    t->vocab_hash = hash;
    return 0;
}

// at most 60 bytes of the symbols s[0..n), quoted, for a message ("..." where they were cut, at
// a character's start)
static void show_symbols(char* out, size_t cap, const char* s, size_t n) {
    size_t k = n;
    if (k > 60)
        for (k = 60; k > 0 && (s[k] & 0xC0) == 0x80; k--) {}
    snprintf(out, cap, "'%.*s'%s", (int)k, s, k < n ? "..." : "");
}

// why, after writing the merge "left right" (space: the one between them) into what, for the message
static const char* merge_refused(const char* why, const char* line, size_t n, const char* space, char* what, size_t whatlen) {
    char left[80], right[80];
    show_symbols(left, sizeof left, line, space - line);
    show_symbols(right, sizeof right, space + 1, line + n - space - 1);
    snprintf(what, whatlen, "%s + %s", left, right);
    return why;
}

// one merge line "left right" (symbols) into its ids and the merged token's; NULL, or what is
// wrong (*what: the merge, for the message). bytes: room for n bytes (a symbol is at least one)
static const char* merge_line(const Tokenizer* t, const char* line, size_t n, const int* symbol_byte, char* bytes, int ids[3],
                              char* what, size_t whatlen) {
    const char* space = (const char*)memchr(line, ' ', n);
    what[0] = '\0';
    if (!space || space == line || space + 1 == line + n || memchr(space + 1, ' ', line + n - space - 1))
        return "expected two symbols separated by one space";
    int left = symbols_to_bytes(line, space - line, symbol_byte, bytes);
    int right = left < 0 ? -1 : symbols_to_bytes(space + 1, line + n - space - 1, symbol_byte, bytes + left);
    const char* why = NULL;
    if (left < 0 || right < 0) why = "a symbol that is not GPT-2's byte symbols";
    else if ((ids[0] = vocab_lookup(t, bytes, left)) < 0 || (ids[1] = vocab_lookup(t, bytes + left, right)) < 0)
        why = "a symbol the vocabulary lacks";
    else if ((ids[2] = vocab_lookup(t, bytes, left + right)) < 0) why = "a merge whose result the vocabulary lacks";
    return why ? merge_refused(why, line, n, space, what, whatlen) : NULL;
}

// A merges file's frame: "#version ..." on its first line and a newline after its last. GPT-2's
// encoder.py, Megatron and transformers' GPT2Tokenizer all read lines [1:-1] of the file split
// at newlines: they skip the first line whatever it holds and drop a last line without a
// newline, so a file without either would lose a merge there and not here. NULL, or what is wrong
static const char* merges_frame(const char* text, size_t size) {
    if (size == 0) return "empty: expected \"#version: 0.2\" on the first line, then the merges, one a line";
    if (size < 8 || memcmp(text, "#version", 8) != 0)
        return "expected \"#version: 0.2\" on the first line, as GPT-2's vocab.bpe has (Megatron and transformers skip "
               "the first line, whatever it holds)";
    if (text[size - 1] != '\n')
        return "the last line has no newline: a file cut short? (Megatron and transformers drop a last line without one)";
    return NULL;
}

// MERGES.txt: "#version ..." (merges_frame), then one merge a line, the most frequent first. Its
// rank is its place (a pair given twice keeps the later place, as GPT-2's dict(zip(merges, range)))
static int load_merges(Tokenizer* t, const char* path, char* err, size_t errlen) {
    size_t size;
    char reason[4400];
    char* text = read_whole_file(path, &size, reason, sizeof reason);
    if (!text) return error_line(err, errlen, "--merge-file %s", reason);
    const char* frame = merges_frame(text, size);
    if (frame) {
        free(text);
        return error_line(err, errlen, "--merge-file %s: %s", path, frame);
    }
    int symbol_byte[512], lines = 0, rank = 0, status = 0;
    symbol_byte_table(symbol_byte);
    for (size_t i = 0; i < size; i++) lines += text[i] == '\n';
    struct TokenizerTables* x = &t->tables;
    x->merge_mask = table_size_for((size_t)lines + 1) - 1;
    x->merge_slot = (MergeSlot*)tokenizer_alloc((x->merge_mask + 1) * sizeof(MergeSlot));
    for (size_t i = 0; i <= x->merge_mask; i++) x->merge_slot[i].rank = -1;
    char* bytes = (char*)tokenizer_alloc(size);   // one merge's, as long as the file at most
    uint64_t hash = fnv1a(NULL, 0);
    const char* end = text + size;
    for (const char *line = (const char*)memchr(text, '\n', size) + 1, *next; line < end && !status; line = next) {
        const char* nl = (const char*)memchr(line, '\n', end - line);   // (every line has one: merges_frame)
        next = nl + 1;
        size_t n = nl - line;
        if (n > 0 && line[n - 1] == '\r') n--;   // (a file saved on Windows)
        char what[200];
        int ids[3];
        const char* why = merge_line(t, line, n, symbol_byte, bytes, ids, what, sizeof(what));
        if (why) {
            status = error_line(err, errlen, "--merge-file %s: line %d: %s%s%s", path, line_of(text, line), why,
                              what[0] ? ": " : "", what);
            break;
        }
        MergeSlot* slot = merge_find(x, (uint64_t)ids[0] << 32 | (uint32_t)ids[1]);
        *slot = (MergeSlot){rank++, ids[2], (uint64_t)ids[0] << 32 | (uint32_t)ids[1]};
        hash = fnv1a_more(hash, ids, 2 * sizeof(int));
    }
    t->merges_hash = hash;
    free(bytes);
    free(text);
    return status;
}

// A special token: GPT-2's <|endoftext|>, or one of the tokens Hugging Face adds by hand (<s>,
// </s>, <pad>, <unk>, <mask>, <|im_start|>; BERT's [PAD], [CLS]). No merge builds one: a
// tokenizer that knows them cuts the text around them first. Here: "<...>" or "[...]", three
// or more printable ASCII bytes, no space.
static int looks_special(const char* s, int n) {
    if (n < 3 || !((s[0] == '<' && s[n - 1] == '>') || (s[0] == '[' && s[n - 1] == ']'))) return 0;
    for (int i = 0; i < n; i++)
        if (s[i] < '!' || s[i] > '~') return 0;
    return 1;
}

// a token as VOCAB.json writes it (GPT-2's byte symbols), its first 20 symbols, quoted
static void show_token(const Tokenizer* t, int id, char* out, size_t cap /* >= 100 */) {
    int symbol[256], n = t->token_len[id], k = 1, i;
    for (int b = 0, moved = 256; b < 256; b++) symbol[b] = printable_byte(b) ? b : moved++;
    out[0] = '\'';
    for (i = 0; i < n && i < 20; i++) k += utf8_put(out + k, (uint32_t)symbol[(unsigned char)t->token[id][i]]);
    snprintf(out + k, cap - k, "'%s", i < n ? "..." : "");
}

// Every token of the vocabulary must be one BPE can reach with these merges: one of the 256
// bytes, some merge's result, or a special token (looks_special). Any other means a merges file
// cut short or written for another vocabulary, which tokenizes otherwise without a word (GPT-2's
// 50,257 tokens: 256 bytes, 50,000 merges' results, <|endoftext|>).
static int check_every_token_built(const Tokenizer* t, const char* vocab_file, const char* merges_file, char* err, size_t errlen) {
    char* built = (char*)tokenizer_alloc(t->vocab_size);
    for (int b = 0; b < 256; b++) built[t->byte_token[b]] = 1;
    for (size_t i = 0; i <= t->tables.merge_mask; i++)
        if (t->tables.merge_slot[i].rank >= 0) built[t->tables.merge_slot[i].merged] = 1;
    int unbuilt = 0, first = -1;
    for (int id = 0; id < t->vocab_size; id++)
        if (!built[id] && !looks_special(t->token[id], t->token_len[id])) first = first < 0 ? id : first, unbuilt++;
    free(built);
    if (unbuilt == 0) return 0;
    char shown[100];
    show_token(t, first, shown, sizeof shown);
    return error_line(err, errlen, "--merge-file %s: no merge builds %d of the tokens of --vocab-file %s (the first: id %d, "
                      "%s): a merges file cut short, or another vocabulary's? (every token but the 256 bytes and special "
                      "ones such as <|endoftext|> must be some merge's result)", merges_file, unbuilt, vocab_file, first, shown);
}

static inline void tokenizer_free(Tokenizer* t) {
    for (int id = 0; t->token && id < t->vocab_size; id++) free(t->token[id]);
    free(t->token);
    free(t->token_len);
    free(t->tables.vocab_slot);
    free(t->tables.merge_slot);
    memset(t, 0, sizeof(*t));
}

// The merges of a loaded vocabulary (any earlier merges are dropped first): 0, or 1 with the
// line in err. tokenizer_load's second half; tests/fuzz_merges.c calls it alone, over one vocabulary.
static inline int tokenizer_load_merges(Tokenizer* t, const char* vocab_file, const char* merges_file, char* err, size_t errlen) {
    free(t->tables.merge_slot);
    t->tables.merge_slot = NULL;
    int status = load_merges(t, merges_file, err, errlen);
    return status ? status : check_every_token_built(t, vocab_file, merges_file, err, errlen);
}

// Load GPT-2's two files. 0, or 1 with one line in err naming the file (and its line) and what
// was expected: a file that cannot be read, a vocabulary that is not a JSON object of GPT-2's
// byte symbols to the ids 0..N-1, a merges file without its "#version" line or its last newline,
// a merge that is not two symbols of the vocabulary, or whose result it lacks, a token no merge
// builds.
static inline int tokenizer_load(Tokenizer* t, const char* vocab_file, const char* merges_file, char* err, size_t errlen) {
    memset(t, 0, sizeof(*t));
    int status = load_vocab(t, vocab_file, err, errlen);
    if (!status) status = index_vocab(t, vocab_file, err, errlen);
    if (!status) status = tokenizer_load_merges(t, vocab_file, merges_file, err, errlen);
    if (status) tokenizer_free(t);
    return status;
}

// the bytes that id stands for (not NUL-terminated; a token may end inside a UTF-8 character)
static inline const char* tokenizer_token_bytes(const Tokenizer* t, int id, size_t* len) {
    if (id < 0 || id >= t->vocab_size) return *len = 0, "";
    *len = (size_t)t->token_len[id];
    return t->token[id];
}

// ----------------------------------------------------------------------------
// BPE of one word, and the cache of words seen

// the word's bytes as byte tokens, then the pair of lowest rank merged wherever it stands
// (left to right, as GPT-2's bpe()), until no pair has a rank; the tokens in sym, their count
static int bpe(const Tokenizer* t, const unsigned char* word, int n, int* sym) {
    for (int i = 0; i < n; i++) sym[i] = t->byte_token[word[i]];
    while (n > 1) {
        const MergeSlot* best = NULL;
        for (int i = 0; i + 1 < n; i++) {
            const MergeSlot* m = merge_find(&t->tables, (uint64_t)sym[i] << 32 | (uint32_t)sym[i + 1]);
            if (m->rank >= 0 && (!best || m->rank < best->rank)) best = m;
        }
        if (!best) break;
        int left = (int)(best->pair >> 32), right = (int)(uint32_t)best->pair, kept = 0;
        for (int i = 0; i < n; i++) {
            if (i + 1 < n && sym[i] == left && sym[i + 1] == right) sym[kept++] = best->merged, i++;
            else sym[kept++] = sym[i];
        }
        n = kept;
    }
    return n;
}

// words seen: their bytes and tokens in two arenas, found by hash; emptied when it reaches
// CACHE_WORDS (a corpus's words are Zipf-distributed: the frequent ones come back at once)
enum { CACHE_WORDS = 1 << 20, CACHE_LONGEST_WORD = 256 };

typedef struct {
    uint64_t hash;
    uint32_t word_at, ids_at;
    uint16_t word_len, ids_len;   // word_len 0: an empty slot
} CacheSlot;

struct TokenizerCache {
    CacheSlot* slot;
    size_t mask, used;
    char* words;
    int* ids;
    size_t words_len, words_cap, ids_len, ids_cap;
};
typedef struct TokenizerCache TokenizerCache;

static inline TokenizerCache* tokenizer_cache_new(void) {
    TokenizerCache* c = (TokenizerCache*)tokenizer_alloc(sizeof(TokenizerCache));
    c->mask = 4095;
    c->slot = (CacheSlot*)tokenizer_alloc((c->mask + 1) * sizeof(CacheSlot));
    return c;
}

static inline void tokenizer_cache_free(TokenizerCache* c) {
    if (!c) return;
    free(c->slot);
    free(c->words);
    free(c->ids);
    free(c);
}

static CacheSlot* cache_find(const TokenizerCache* c, uint64_t hash, const char* word, int n) {   // its slot or the empty one
    for (size_t i = hash & c->mask;; i = (i + 1) & c->mask) {
        CacheSlot* s = &c->slot[i];
        if (s->word_len == 0 || (s->hash == hash && s->word_len == n && memcmp(c->words + s->word_at, word, n) == 0)) return s;
    }
}

static void cache_grow_or_empty(TokenizerCache* c) {
    size_t old_size = c->mask + 1;
    CacheSlot* old = c->slot;
    if (c->used >= CACHE_WORDS) {   // full: start again
        memset(c->slot, 0, old_size * sizeof(CacheSlot));
        c->used = c->words_len = c->ids_len = 0;
        return;
    }
    c->mask = 2 * old_size - 1;
    c->slot = (CacheSlot*)tokenizer_alloc((c->mask + 1) * sizeof(CacheSlot));
    for (size_t i = 0; i < old_size; i++)
        if (old[i].word_len) *cache_find(c, old[i].hash, c->words + old[i].word_at, old[i].word_len) = old[i];
    free(old);
}

static void cache_add(TokenizerCache* c, CacheSlot* s, uint64_t hash, const char* word, int n, const int* ids, int k) {
    if (c->words_len + n > c->words_cap) c->words = (char*)realloc(c->words, c->words_cap = 2 * (c->words_cap + n));
    if (c->ids_len + k > c->ids_cap) c->ids = (int*)realloc(c->ids, (c->ids_cap = 2 * (c->ids_cap + k)) * sizeof(int));
    if (!c->words || !c->ids) { fprintf(stderr, "error: out of memory for the tokenizer's cache\n"); exit(1); }
    *s = (CacheSlot){hash, (uint32_t)c->words_len, (uint32_t)c->ids_len, (uint16_t)n, (uint16_t)k};
    memcpy(c->words + c->words_len, word, n);
    memcpy(c->ids + c->ids_len, ids, k * sizeof(int));
    c->words_len += n;
    c->ids_len += k;
    if (++c->used > c->mask / 2) cache_grow_or_empty(c);
}

// a word's tokens appended to out, through the cache (short words) when there is one
static void encode_word(const Tokenizer* t, TokenizerCache* c, const char* word, int n, TokenIds* out) {
    uint64_t hash = 0;
    CacheSlot* s = NULL;
    if (c && n <= CACHE_LONGEST_WORD) {
        hash = fnv1a(word, n);
        s = cache_find(c, hash, word, n);
        if (s->word_len) {
            for (int k = 0; k < s->ids_len; k++) token_ids_push(out, c->ids[s->ids_at + k]);
            return;
        }
    }
    int stack[CACHE_LONGEST_WORD], *sym = n <= CACHE_LONGEST_WORD ? stack : (int*)tokenizer_alloc(n * sizeof(int));
    int k = bpe(t, (const unsigned char*)word, n, sym);
    for (int i = 0; i < k; i++) token_ids_push(out, sym[i]);
    if (s) cache_add(c, s, hash, word, n, sym, k);
    if (sym != stack) free(sym);
}

// ----------------------------------------------------------------------------
// pre-tokenization: GPT-2's pattern, its alternatives tried in order at each position

// the class (tokenizer_unicode.h) of the character at s[i] (valid UTF-8), its length in *len
static int class_at(const unsigned char* s, size_t n, size_t i, int* len) {
    uint32_t cp = s[i];
    *len = s[i] < 0x80 ? 1 : utf8_next(s + i, n - i, &cp);
    return unicode_class(cp);
}

// the end of a run of characters of class k from s[i]
static size_t run_end(const unsigned char* s, size_t n, size_t i, int k) {
    int len;
    while (i < n && class_at(s, n, i, &len) == k) i += len;
    return i;
}

// the contraction at s[i] ('s 't 're 've 'm 'll 'd: lower case only, as the pattern), its length or 0
static int contraction(const unsigned char* s, size_t n, size_t i) {
    if (s[i] != '\'' || i + 1 >= n) return 0;
    unsigned char a = s[i + 1], b = i + 2 < n ? s[i + 2] : 0;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    return (a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l') ? 3 : 0;
}

// the end of the word that starts at s[i] (i < n)
static size_t word_end(const unsigned char* s, size_t n, size_t i) {
    int len, c = contraction(s, n, i);
    if (c) return i + c;
    size_t j = i + (s[i] == ' ' && i + 1 < n);   //  ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+ (one space before)
    int k = class_at(s, n, j, &len);
    if (k != UNICODE_SPACE) return run_end(s, n, j, k);
    size_t spaces = run_end(s, n, i, UNICODE_SPACE);   // \s+(?!\S) | \s+
    if (spaces == n) return n;
    size_t last = spaces - 1;   // a run followed by a word leaves its last whitespace character to it
    while ((s[last] & 0xC0) == 0x80) last--;
    return last > i ? last : spaces;
}

// Encode len bytes of UTF-8 text, appending its tokens to out. 0, or -1 when the text is not
// valid UTF-8 (*bad_offset: the byte where it stops being so; nothing appended). cache may be NULL.
static inline int tokenizer_encode(const Tokenizer* t, TokenizerCache* cache, const char* text, size_t len, TokenIds* out,
                            size_t* bad_offset) {
    const unsigned char* s = (const unsigned char*)text;
    for (size_t i = 0; i < len;) {   // first the whole text is checked: a refusal appends nothing
        uint32_t cp;
        int k = s[i] < 0x80 ? 1 : utf8_next(s + i, len - i, &cp);
        if (k == 0) return *bad_offset = i, -1;
        i += k;
    }
    for (size_t i = 0, end; i < len; i = end) {
        end = word_end(s, len, i);
        encode_word(t, cache, text + i, (int)(end - i), out);
    }
    return 0;
}
