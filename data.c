/*
data.c — the training data: Megatron's indexed datasets and the GPT sample index.

What lives here, in reading order:
  - reading a Megatron mmap indexed dataset (`PREFIX.bin` tokens, `PREFIX.idx` index), the
    tokens memory-mapped and never copied, every field of the index checked on open;
  - the byte-level tokenizer, Megatron's --split, and numpy's legacy RandomState;
  - the GPT sample index exactly as Megatron's GPTDataset builds it, so that the same files,
    seed, sequence length and sample count give the same samples in the same order;
  - its cache on disk: the three index arrays as .npy files, np.save's bytes, keyed by a
    hash of every input, with their CRC-32s beside them, checked before use;
  - blending several datasets by weight (Megatron's BlendableDataset), and DataSplits: the
    whole --data-path / --split setup of a run in one object (what the trainer uses).
The `preprocess` program, and the writer of datasets (Megatron's MMapIndexedDatasetBuilder),
are preprocess.c, which includes this file: the trainer reads datasets, it never writes one.

Rules it keeps: plain C that is also valid C++ (train.c is compiled by nvcc too); no
library beyond libc and POSIX; a function that can fail on bad input returns non-zero and
writes one line, "<file>: <what is wrong>", into the caller's err buffer (the caller
prints it after its "error: "); nothing here exits (only the preprocess program does, when
out of memory). The public functions are `static inline` only so that a program including
this file and using part of it compiles without unused-function warnings.
*/
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// paths

// dst = a followed by b; 1 if that does not fit
static int join_path(char* dst, size_t size, const char* a, const char* b) {
    int n = snprintf(dst, size, "%s%s", a, b);
    return n < 0 || (size_t)n >= size;
}

// ----------------------------------------------------------------------------
// the token types of the .bin file (Megatron's dtype codes)

enum { DTYPE_UINT8 = 1, DTYPE_INT8 = 2, DTYPE_INT16 = 3, DTYPE_INT32 = 4, DTYPE_INT64 = 5,
       DTYPE_FLOAT64 = 6, DTYPE_FLOAT32 = 7, DTYPE_UINT16 = 8 };

typedef struct {
    int code, itemsize;
    const char* name;
    int64_t min, max;   // the token ids it can hold
} TokenDtype;

static const TokenDtype TOKEN_DTYPES[] = {
    {DTYPE_UINT8, 1, "uint8", 0, 255},
    {DTYPE_INT8, 1, "int8", -128, 127},
    {DTYPE_INT16, 2, "int16", -32768, 32767},
    {DTYPE_INT32, 4, "int32", INT32_MIN, INT32_MAX},
    {DTYPE_INT64, 8, "int64", INT64_MIN, INT64_MAX},
    {DTYPE_UINT16, 2, "uint16", 0, 65535},
};
enum { NUM_TOKEN_DTYPES = sizeof(TOKEN_DTYPES) / sizeof(TOKEN_DTYPES[0]) };

// NULL for codes that are not token types (Megatron's 6 float64 and 7 float32 included)
static const TokenDtype* token_dtype(int code) {
    for (int i = 0; i < NUM_TOKEN_DTYPES; i++)
        if (TOKEN_DTYPES[i].code == code) return &TOKEN_DTYPES[i];
    return NULL;
}

// one little-endian token at p; memcpy because .bin offsets need not be aligned
static int64_t token_at(const uint8_t* p, int code) {
    switch (code) {
    case DTYPE_UINT8: return *p;
    case DTYPE_INT8: return (int8_t)*p;
    case DTYPE_INT16: { int16_t v; memcpy(&v, p, 2); return v; }
    case DTYPE_UINT16: { uint16_t v; memcpy(&v, p, 2); return v; }
    case DTYPE_INT32: { int32_t v; memcpy(&v, p, 4); return v; }
    case DTYPE_INT64: { int64_t v; memcpy(&v, p, 8); return v; }
    }
    return -1;
}

// the byte-level tokenizer: a token is a byte, plus one end-of-document token
enum { BYTE_VOCAB_SIZE = 257, BYTE_EOD = 256 };

// ----------------------------------------------------------------------------
// reading an indexed dataset
//
// PREFIX.idx, little-endian, no padding (Megatron's MMapIndexedDataset.Index):
//   9 bytes magic "MMIDIDX\0\0", uint64 version = 1, uint8 dtype code,
//   uint64 N (items), uint64 D (entries of doc_idx),
//   int32 sizes[N]      tokens in each item,
//   int64 pointers[N]   byte offset of each item in PREFIX.bin,
//   int64 doc_idx[D]    first item of each document, then N.
// PREFIX.bin: the items' tokens back to back.
//
// The arrays start at byte 34 and are therefore not aligned for int32/int64 reads, so we
// copy the (small) index into malloc'd arrays; the (large) .bin is only ever mmap'd.
// This code assumes a little-endian host, as Megatron's numpy reader does in practice.

static const char IDX_MAGIC[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
enum { IDX_HEADER_BYTES = 34 };

typedef struct {
    char path_prefix[4096];
    int dtype_code, itemsize;
    int64_t num_items;         // entries of sizes/pointers ("sentences")
    int64_t num_docs;          // entries of doc_idx - 1
    int64_t num_tokens;        // sum of sizes
    const int32_t* sizes;      // [num_items]   our aligned copies of the .idx arrays
    const int64_t* pointers;   // [num_items]
    const int64_t* doc_idx;    // [num_docs+1]
    const uint8_t* bin;        // mmap of PREFIX.bin (NULL when it is empty)
    size_t bin_bytes;
} IndexedDataset;

static inline void indexed_dataset_close(IndexedDataset* ds) {
    if (ds->bin) munmap((void*)ds->bin, ds->bin_bytes);
    free((void*)ds->sizes);       // the const views point at memory we own
    free((void*)ds->pointers);
    free((void*)ds->doc_idx);
    memset(ds, 0, sizeof *ds);
}

// read exactly n bytes at offset, or fail with errno set (0: the file ended first; read_error)
static int read_at(int fd, void* buf, size_t n, off_t offset) {
    uint8_t* p = (uint8_t*)buf;
    while (n > 0) {
        ssize_t got = pread(fd, p, n, offset);
        if (got < 0 && errno == EINTR) continue;
        if (got == 0) errno = 0;
        if (got <= 0) return 1;
        p += got; n -= (size_t)got; offset += got;
    }
    return 0;
}
static const char* read_error(void) { return errno ? strerror(errno) : "the file ended early (is it being rewritten?)"; }

// the header: magic, version, dtype, counts, and that the counts match the file's size
static int check_idx_header(IndexedDataset* ds, const char* path, const uint8_t* h, int64_t file_bytes,
                            char* err, size_t errlen) {
    uint64_t version, n, d;
    memcpy(&version, h + 9, 8);
    memcpy(&n, h + 18, 8);
    memcpy(&d, h + 26, 8);
    int code = h[17];
    if (memcmp(h, IDX_MAGIC, sizeof IDX_MAGIC) != 0)
        return error_line(err, errlen, "%s: bad magic (expected MMIDIDX)", path);
    if (version != 1)
        return error_line(err, errlen, "%s: unsupported version %llu (expected 1)", path, (unsigned long long)version);
    if (code == DTYPE_FLOAT64 || code == DTYPE_FLOAT32)
        return error_line(err, errlen, "%s: dtype code %d is a float type, not token ids", path, code);
    const TokenDtype* dt = token_dtype(code);
    if (dt == NULL) return error_line(err, errlen, "%s: unknown dtype code %d", path, code);
    // bound the counts by the file size before multiplying, so nothing can overflow
    uint64_t size = (uint64_t)file_bytes;
    if (n > size / 12 || d > size / 8 || (uint64_t)IDX_HEADER_BYTES + 12 * n + 8 * d != size)
        return error_line(err, errlen, "%s: %lld bytes, but its header (%llu items, %llu doc_idx entries) needs %.17g",
                          path, (long long)file_bytes, (unsigned long long)n, (unsigned long long)d,
                          (double)(int)IDX_HEADER_BYTES + 12.0 * (double)n + 8.0 * (double)d);   // in double: no overflow
    if (d < 1) return error_line(err, errlen, "%s: empty doc_idx (expected at least the entry 0)", path);
    ds->dtype_code = code;
    ds->itemsize = dt->itemsize;
    ds->num_items = (int64_t)n;
    ds->num_docs = (int64_t)d - 1;
    return 0;
}

// doc_idx starts at 0, never decreases, and ends at the number of items
static int check_doc_idx(const IndexedDataset* ds, const char* path, char* err, size_t errlen) {
    const int64_t* d = ds->doc_idx;
    if (d[0] != 0) return error_line(err, errlen, "%s: doc_idx[0] is %lld (expected 0)", path, (long long)d[0]);
    for (int64_t i = 1; i <= ds->num_docs; i++)
        if (d[i] < d[i - 1])
            return error_line(err, errlen, "%s: doc_idx decreases at entry %lld (%lld after %lld)", path,
                              (long long)i, (long long)d[i], (long long)d[i - 1]);
    if (d[ds->num_docs] != ds->num_items)
        return error_line(err, errlen, "%s: doc_idx ends at %lld (expected the number of items, %lld)", path,
                          (long long)d[ds->num_docs], (long long)ds->num_items);
    return 0;
}

static int read_idx(IndexedDataset* ds, const char* path, char* err, size_t errlen) {
    int fd = open_regular_file(path, err, errlen);
    if (fd < 0) return 1;
    struct stat st;
    uint8_t header[IDX_HEADER_BYTES];
    int rc = 0;
    if (fstat(fd, &st) != 0) rc = error_line(err, errlen, "%s: %s", path, strerror(errno));
    else if (st.st_size < IDX_HEADER_BYTES)
        rc = error_line(err, errlen, "%s: %lld bytes, too short for the %d-byte header", path, (long long)st.st_size,
                        IDX_HEADER_BYTES);
    else if (read_at(fd, header, IDX_HEADER_BYTES, 0)) rc = error_line(err, errlen, "%s: read failed: %s", path, read_error());
    if (rc == 0) rc = check_idx_header(ds, path, header, (int64_t)st.st_size, err, errlen);
    if (rc == 0) {
        uint64_t n = (uint64_t)ds->num_items, d = (uint64_t)ds->num_docs + 1;
        int32_t* sizes = (int32_t*)malloc(4 * n + 1);
        int64_t* pointers = (int64_t*)malloc(8 * n + 1);
        int64_t* doc_idx = (int64_t*)malloc(8 * d);
        ds->sizes = sizes; ds->pointers = pointers; ds->doc_idx = doc_idx;
        if (!sizes || !pointers || !doc_idx) rc = error_line(err, errlen, "%s: out of memory for the index", path);
        else if (read_at(fd, sizes, 4 * n, IDX_HEADER_BYTES) || read_at(fd, pointers, 8 * n, IDX_HEADER_BYTES + 4 * n) ||
                 read_at(fd, doc_idx, 8 * d, IDX_HEADER_BYTES + 12 * n))
            rc = error_line(err, errlen, "%s: read failed: %s", path, read_error());
    }
    close(fd);
    if (rc == 0) rc = check_doc_idx(ds, path, err, errlen);
    return rc;
}

static int map_bin(IndexedDataset* ds, const char* path, char* err, size_t errlen) {
    int fd = open_regular_file(path, err, errlen);
    if (fd < 0) return 1;
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0) rc = error_line(err, errlen, "%s: %s", path, strerror(errno));
    else if (st.st_size > 0) {   // mmap of 0 bytes is an error; an empty .bin is legal
        void* p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) rc = error_line(err, errlen, "%s: mmap failed: %s", path, strerror(errno));
        else { ds->bin = (const uint8_t*)p; ds->bin_bytes = (size_t)st.st_size; }
    }
    close(fd);
    return rc;
}

// Every item lies inside the .bin, in order (after this no read can leave the mapping), the last
// ending where the .bin ends, as Megatron's builder leaves them: else another corpus's .idx is half used.
static int check_items(IndexedDataset* ds, const char* idx_path, const char* path, char* err, size_t errlen) {
    int64_t bin_bytes = (int64_t)ds->bin_bytes, prev_end = 0;   // items lie in order, never overlapping
    ds->num_tokens = 0;
    for (int64_t i = 0; i < ds->num_items; i++) {
        int64_t ptr = ds->pointers[i], size = ds->sizes[i], bytes = size * ds->itemsize;
        if (size < 0) return error_line(err, errlen, "%s: item %lld has negative size %lld", path, (long long)i, (long long)size);
        if (ptr % ds->itemsize != 0)
            return error_line(err, errlen, "%s: item %lld starts at byte %lld, not a multiple of the %d-byte token", path,
                              (long long)i, (long long)ptr, ds->itemsize);
        if (ptr < prev_end)
            return error_line(err, errlen, "%s: item %lld starts at byte %lld, inside the item before it (which ends at "
                              "%lld): pointers decrease or overlap", path, (long long)i, (long long)ptr, (long long)prev_end);
        if (ptr > bin_bytes || bytes > bin_bytes - ptr)
            return error_line(err, errlen, "%s: item %lld (bytes %lld..%lld) lies outside the %lld-byte file", path,
                              (long long)i, (long long)ptr, (long long)(ptr + bytes), (long long)bin_bytes);
        prev_end = ptr + bytes;
        ds->num_tokens += size;
    }
    if (prev_end != bin_bytes)
        return error_line(err, errlen, "%s: its items describe %lld bytes of tokens, but %s has %lld bytes (an index of another "
                          "corpus, or a .bin changed after it was indexed?)", idx_path, (long long)prev_end, path, (long long)bin_bytes);
    return 0;
}

// open PREFIX.idx and PREFIX.bin; on failure ds is left closed and err says why
static inline int indexed_dataset_open(IndexedDataset* ds, const char* prefix, char* err, size_t errlen) {
    memset(ds, 0, sizeof *ds);
    const uint16_t one = 1;
    if (*(const uint8_t*)&one != 1) return error_line(err, errlen, "%s: this reader needs a little-endian host", prefix);
    char idx_path[sizeof ds->path_prefix], bin_path[sizeof ds->path_prefix];
    if (join_path(ds->path_prefix, sizeof ds->path_prefix, prefix, "") ||
        join_path(idx_path, sizeof idx_path, prefix, ".idx") || join_path(bin_path, sizeof bin_path, prefix, ".bin"))
        return error_line(err, errlen, "%s: path too long", prefix);
    int rc = read_idx(ds, idx_path, err, errlen) || map_bin(ds, bin_path, err, errlen) ||
             check_items(ds, idx_path, bin_path, err, errlen);
    if (rc != 0) indexed_dataset_close(ds);
    return rc;
}

// token `pos` of item `item`; -1 if (item, pos) is out of range
static inline int64_t indexed_dataset_token(const IndexedDataset* ds, int64_t item, int64_t pos) {
    if (item < 0 || item >= ds->num_items || pos < 0 || pos >= ds->sizes[item]) return -1;
    return token_at(ds->bin + ds->pointers[item] + pos * ds->itemsize, ds->dtype_code);
}

// smallest and largest token id in the whole dataset; 1 (and 0, 0) if it holds no token
static inline int indexed_dataset_max_token(const IndexedDataset* ds, int64_t* min_id, int64_t* max_id) {
    int64_t lo = INT64_MAX, hi = INT64_MIN;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 64) reduction(min : lo) reduction(max : hi)
#endif
    for (int64_t i = 0; i < ds->num_items; i++) {
        if (ds->sizes[i] == 0) continue;   // (an empty .bin has no mapping at all)
        const uint8_t* p = ds->bin + ds->pointers[i];
        for (int64_t j = 0; j < ds->sizes[i]; j++) {
            int64_t t = token_at(p + j * ds->itemsize, ds->dtype_code);
            if (t < lo) lo = t;
            if (t > hi) hi = t;
        }
    }
    *min_id = ds->num_tokens ? lo : 0;
    *max_id = ds->num_tokens ? hi : 0;
    return ds->num_tokens ? 0 : 1;
}

// ----------------------------------------------------------------------------
// durable files and renames (the sample index's cache files; preprocess.c's dataset writer)

// flush, fsync and close; 1 on any failure
static int close_synced(FILE* f) {
    int bad = fflush(f) != 0 || fsync(fileno(f)) != 0;
    return (fclose(f) != 0) || bad;
}

// make the renames themselves durable
static void fsync_parent_dir(const char* path) {
    char dir[4096];
    if (join_path(dir, sizeof dir, path, "")) return;
    char* slash = strrchr(dir, '/');
    if (slash == NULL) strcpy(dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    int fd = open(dir, O_RDONLY);
    if (fd >= 0) { fsync(fd); close(fd); }
}

// mkdir -p DIR for the directory a flag names (--save, --output-prefix's): the first one that
// cannot be made is named, with why. *made gets the highest directory it made ("": none), so a
// caller that fails later can take them away again. 0, or 1 with a line in err.
static inline int make_dirs(const char* flag, const char* dir, char* made, size_t made_len, char* err, size_t errlen) {
    char path[4200];
    made[0] = '\0';
    if (!dir[0]) return error_line(err, errlen, "%s expects a directory, got ''", flag);
    if (snprintf(path, sizeof(path), "%s", dir) >= (int)sizeof(path)) return error_line(err, errlen, "%s: path too long", flag);
    size_t n = strlen(path);
    for (char* p = path + 1; p <= path + n; p++) {
        if (*p != '/' && *p != '\0') continue;
        if (p[-1] == '/') continue;
        char was = *p;
        *p = '\0';
        if (mkdir(path, 0755) == 0) {
            if (!made[0]) snprintf(made, made_len, "%s", path);
        } else if (errno != EEXIST) {
            return error_line(err, errlen, "%s %s: cannot create %s: %s", flag, dir, path, strerror(errno));
        }
        *p = was;
    }
    return 0;
}

// the empty directories make_dirs made for dir, from dir up to the highest one (made)
static inline void remove_made_dirs(const char* dir, const char* made) {
    char path[4200];
    if (!made[0] || snprintf(path, sizeof(path), "%s", dir) >= (int)sizeof(path)) return;
    while (strlen(path) >= strlen(made) && rmdir(path) == 0 && strcmp(path, made) != 0) {
        char* slash = strrchr(path, '/');
        if (!slash) break;
        *slash = '\0';
    }
}

// ----------------------------------------------------------------------------
// train / valid / test split (Megatron's get_train_valid_test_split_)
//
// "969,30,1" (or "969/30/1", or fewer numbers padded with 0) splits num_docs documents into
// [bounds[0], bounds[1]) train, [bounds[1], bounds[2]) valid, [bounds[2], bounds[3]) test.
// Megatron passes the number of *items* (sizes.shape[0]) here, not len(doc_idx) - 1: the
// GPT path treats every item as a document. A range with end <= begin is empty (Megatron
// then builds no dataset for it). Like Python, round() rounds halves to even.

static int64_t round_half_even(double x) {   // x >= 0
    int64_t r = (int64_t)x;
    double frac = x - (double)r;             // exact for doubles
    if (frac > 0.5 || (frac == 0.5 && (r & 1))) r++;
    return r;
}

static inline int split_documents(const char* split, int64_t num_docs, int64_t bounds[4], char* err, size_t errlen) {
    char sep = strchr(split, ',') ? ',' : strchr(split, '/') ? '/' : 0;
    double w[3] = {0, 0, 0};
    int count = 0;
    for (const char* p = split;; count++) {
        char* end;
        double v = strtod(p, &end);
        while (*end == ' ' || *end == '\t') end++;
        if (end == p || !(v >= 0 && v <= 1e300) || (*end != 0 && *end != sep))
            return error_line(err, errlen, "--split %s: expected up to 3 non-negative numbers separated by , or /", split);
        if (count == 3)   // Megatron silently keeps the first three
            return error_line(err, errlen, "--split %s: more than 3 parts (train,valid,test)", split);
        w[count] = v;
        if (*end == 0) break;
        p = end + 1;
    }
    double sum = w[0] + w[1] + w[2];
    if (!(sum > 0)) return error_line(err, errlen, "--split %s: the weights add up to 0", split);
    bounds[0] = 0;
    for (int i = 0; i < 3; i++) bounds[i + 1] = bounds[i] + round_half_even(w[i] / sum * (double)num_docs);
    int64_t diff = bounds[3] - num_docs;   // rounding may overshoot: shift every boundary back
    for (int i = 1; i < 4; i++) bounds[i] -= diff;
    return 0;
}

// ----------------------------------------------------------------------------
// numpy's legacy RandomState: MT19937 seeded with init_genrand, and its shuffle
//
// np.random.RandomState(seed) with an integer seed runs the reference init_genrand(seed)
// (numpy's mt19937_seed); RandomState.shuffle is Fisher-Yates from the end, drawing j in
// [0, i] by masked rejection sampling (numpy's random_interval).

enum { MT_N = 624, MT_M = 397 };

typedef struct {
    uint32_t state[MT_N];
    int pos;
} MT19937;

static void mt19937_seed(MT19937* r, uint32_t seed) {
    r->state[0] = seed;
    for (int i = 1; i < MT_N; i++)
        r->state[i] = 1812433253u * (r->state[i - 1] ^ (r->state[i - 1] >> 30)) + (uint32_t)i;
    r->pos = MT_N;
}

static uint32_t mt19937_next32(MT19937* r) {
    if (r->pos >= MT_N) {   // regenerate the whole state (indices mod MT_N, without the divisions)
        for (int i = 0; i < MT_N; i++) {
            int next = i + 1 < MT_N ? i + 1 : 0, far = i + MT_M < MT_N ? i + MT_M : i + MT_M - MT_N;
            uint32_t y = (r->state[i] & 0x80000000u) | (r->state[next] & 0x7fffffffu);
            r->state[i] = r->state[far] ^ (y >> 1) ^ ((y & 1) ? 0x9908b0dfu : 0);
        }
        r->pos = 0;
    }
    uint32_t y = r->state[r->pos++];   // tempering
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

// uniform in [0, max]: draw under the smallest all-ones mask >= max until it fits
static uint64_t random_interval(MT19937* r, uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max, v;
    for (int s = 1; s <= 32; s *= 2) mask |= mask >> s;
    if (max <= 0xffffffffu) {
        do v = mt19937_next32(r) & mask; while (v > max);
    } else {   // numpy's next_uint64 for MT19937: high word drawn first
        do { uint64_t hi = mt19937_next32(r); v = ((hi << 32) | mt19937_next32(r)) & mask; } while (v > max);
    }
    return v;
}

// The swaps of a big shuffle wait on memory (x[j] lies anywhere in hundreds of MB), and each
// draw waits on the one before. Drawing a block of j's first, then prefetching their
// elements, lets the cache misses overlap; the draws depend only on i, so the permutation is
// the same (measured: the 1e8-element document shuffle of the benchmark 5.0 s -> ~2.5 s).
#define SHUFFLE_BLOCK 256

// j for i, i-1, ... (at most SHUFFLE_BLOCK of them, down to 1); returns how many
static int draw_block(MT19937* r, int64_t i, int64_t* j) {
    int m = i < SHUFFLE_BLOCK ? (int)i : SHUFFLE_BLOCK;
    for (int k = 0; k < m; k++) j[k] = (int64_t)random_interval(r, (uint64_t)(i - k));
    return m;
}

static void shuffle_int32(MT19937* r, int32_t* x, int64_t n) {
    int64_t j[SHUFFLE_BLOCK];
    for (int64_t i = n - 1; i >= 1;) {
        int m = draw_block(r, i, j);
        for (int k = 0; k < m; k++) __builtin_prefetch(&x[j[k]], 1);
        for (int k = 0; k < m; k++, i--) { int32_t t = x[i]; x[i] = x[j[k]]; x[j[k]] = t; }
    }
}

static void shuffle_int64(MT19937* r, int64_t* x, int64_t n) {
    int64_t j[SHUFFLE_BLOCK];
    for (int64_t i = n - 1; i >= 1;) {
        int m = draw_block(r, i, j);
        for (int k = 0; k < m; k++) __builtin_prefetch(&x[j[k]], 1);
        for (int k = 0; k < m; k++, i--) { int64_t t = x[i]; x[i] = x[j[k]]; x[j[k]] = t; }
    }
}

// ----------------------------------------------------------------------------
// the GPT sample index (Megatron's GPTDataset, _build_index_mappings)
//
// Documents [doc_begin, doc_end) are *items* of the dataset, as in Megatron's GPT path
// (documents = np.arange(start, stop) over sizes, get(doc) reads item doc); the .idx
// doc_idx is not used for sampling. Three arrays define the samples:
//   doc_idx     the documents of every epoch, epochs concatenated, shuffled;
//   sample_idx  where sample k starts in the stream of documents in doc_idx order:
//               (index into doc_idx, token offset in that document); sample k runs to
//               the start of sample k+1 inclusive, so seq_length+1 tokens;
//   shuffle_idx the order in which samples are served.
// One RandomState(seed) shuffles doc_idx, then shuffle_idx.

typedef struct {
    const IndexedDataset* ds;     // not owned: keep it open while this is used
    int seq_length;
    int64_t num_samples;          // len(dataset) = rows of sample_idx - 1 (Megatron builds them all)
    int32_t* doc_idx; int64_t doc_idx_len;
    int32_t* sample_idx;          // [num_samples+1][2]
    int64_t* shuffle_idx;         // [num_samples] as gpt_dataset_build makes it, or from an int64 cache file;
    const uint32_t* shuffle_idx_u32;   // or this, from a cache file in Megatron's usual uint32 (one is NULL)
    int64_t doc_begin, doc_end;
    int64_t tokens_per_epoch;
    int num_epochs;
    int separate_last_epoch;
    // gpt_dataset_open_cached only: the arrays live in these read-only mappings of the cache
    // files (NULL: malloc'd), whose names are cache_stem + "_doc_idx.npy" etc.
    void* maps[3]; size_t map_bytes[3];
    int built;                    // 1: this call built the cache; 0: found it
    char note[2048];              // built: stale temporaries removed, why a cache there was not used
    char cache_stem[4096];
} GPTDataset;

// mapped (from the cache) or malloc'd (gpt_dataset_build), never both
static inline void gpt_dataset_free(GPTDataset* g) {
    int mapped = g->maps[0] || g->maps[1] || g->maps[2];
    for (int k = 0; k < 3; k++)
        if (g->maps[k]) munmap(g->maps[k], g->map_bytes[k]);
    if (!mapped) { free(g->doc_idx); free(g->sample_idx); free(g->shuffle_idx); }
    memset(g, 0, sizeof *g);
}

static int64_t shuffle_at(const GPTDataset* g, int64_t i) {
    return g->shuffle_idx ? g->shuffle_idx[i] : (int64_t)g->shuffle_idx_u32[i];
}

// Megatron's _num_epochs loops E = 1, 2, ... until (E*T - 1) // seq_length >= num_samples;
// that is the smallest E >= 1 with E*T >= num_samples*seq_length + 1.
static int64_t num_epochs_needed(int64_t tokens_per_epoch, int seq_length, int64_t num_samples) {
    int64_t need = num_samples * seq_length + 1;   // >= 1, so E >= 1
    return need / tokens_per_epoch + (need % tokens_per_epoch != 0);
}

// If the last epoch contributes less than 80% of an epoch's samples, Megatron shuffles it
// apart from the others (so its few samples are not spread over the whole run), and keeps
// the samples of the full epochs first in shuffle_idx. Returns the samples of the first
// E-1 epochs through *first_samples.
static int separate_last_epoch(const GPTDataset* g, int64_t num_samples, int64_t* first_samples) {
    if (g->num_epochs == 1) return 0;
    int64_t from_full = ((int64_t)(g->num_epochs - 1) * g->tokens_per_epoch - 1) / g->seq_length;
    int64_t last_epoch_samples = num_samples - from_full;
    int64_t per_epoch = (g->tokens_per_epoch - 1) / g->seq_length;
    // (Megatron also asserts last_epoch_samples <= per_epoch; where that fails it would
    // stop, and the rule below gives "not separate", which is what we do.)
    if (last_epoch_samples >= (int64_t)(0.80 * (double)per_epoch)) return 0;
    *first_samples = from_full;
    return 1;
}

// E copies of the documents; with separation the first E-1 and the last are shuffled apart
static void build_doc_idx(GPTDataset* g, MT19937* rng) {
    int64_t n = g->doc_end - g->doc_begin;
    for (int64_t i = 0; i < g->doc_idx_len; i++) g->doc_idx[i] = (int32_t)(g->doc_begin + i % n);
    int64_t first = g->separate_last_epoch ? g->doc_idx_len - n : g->doc_idx_len;
    shuffle_int32(rng, g->doc_idx, first);
    if (first < g->doc_idx_len) shuffle_int32(rng, g->doc_idx + first, n);
}

// helpers.cpp build_sample_idx: walk the document stream seq_length tokens at a time
static int build_sample_idx(GPTDataset* g) {
    const int32_t* sizes = g->ds->sizes;
    int64_t d = 0, offset = 0;   // position: index into doc_idx, token offset in that document
    g->sample_idx[0] = 0;
    g->sample_idx[1] = 0;
    for (int64_t k = 1; k <= g->num_samples; k++) {
        int64_t remaining = g->seq_length + 1;
        while (remaining != 0) {
            if (d >= g->doc_idx_len) return 1;   // cannot happen: the epochs hold enough tokens
            int64_t doc_length = sizes[g->doc_idx[d]] - offset;
            remaining -= doc_length;
            if (remaining <= 0) {   // the sample ends inside this document, on its last token
                offset += remaining + doc_length - 1;
                remaining = 0;
            } else {
                d++;
                offset = 0;
            }
        }
        g->sample_idx[2 * k] = (int32_t)d;
        g->sample_idx[2 * k + 1] = (int32_t)offset;
    }
    return 0;
}

// Megatron's _build_shuffle_idx: [0, first) shuffled, then [first, total) shuffled
static void build_shuffle_idx(GPTDataset* g, MT19937* rng, int64_t first) {
    for (int64_t i = 0; i < g->num_samples; i++) g->shuffle_idx[i] = i;
    shuffle_int64(rng, g->shuffle_idx, first);
    if (first < g->num_samples) shuffle_int64(rng, g->shuffle_idx + first, g->num_samples - first);
}

static int check_gpt_args(const IndexedDataset* ds, int64_t doc_begin, int64_t doc_end, int seq_length, uint64_t seed,
                          int64_t num_samples, char* err, size_t errlen) {
    const char* p = ds->path_prefix;
    if (doc_begin < 0 || doc_end > ds->num_items || doc_begin >= doc_end || doc_end > INT32_MAX)
        return error_line(err, errlen, "%s: document range [%lld, %lld) is empty or outside [0, %lld)", p,
                          (long long)doc_begin, (long long)doc_end, (long long)ds->num_items);
    if (seq_length < 2) return error_line(err, errlen, "seq_length %d: Megatron needs at least 2", seq_length);
    if (seed > 0xffffffffu) return error_line(err, errlen, "seed %llu: numpy's RandomState takes 0..2^32-1", (unsigned long long)seed);
    if (num_samples < 0 || num_samples > (INT64_MAX - 1) / seq_length)
        return error_line(err, errlen, "%lld samples: out of range", (long long)num_samples);
    return 0;
}

// the shape of the index for these inputs, without building it: tokens per epoch, epochs,
// samples, separation of the last epoch (*first: the samples shuffled before it)
static int gpt_plan(GPTDataset* g, const IndexedDataset* ds, int64_t doc_begin, int64_t doc_end, int seq_length,
                    uint64_t seed, int64_t num_samples_requested, int64_t* first, char* err, size_t errlen) {
    memset(g, 0, sizeof *g);
    if (check_gpt_args(ds, doc_begin, doc_end, seq_length, seed, num_samples_requested, err, errlen)) return 1;
    const char* p = ds->path_prefix;
    g->ds = ds; g->seq_length = seq_length; g->doc_begin = doc_begin; g->doc_end = doc_end;
    for (int64_t i = doc_begin; i < doc_end; i++) g->tokens_per_epoch += ds->sizes[i];
    if (g->tokens_per_epoch < 2)
        return error_line(err, errlen, "%s: documents [%lld, %lld) hold %lld tokens, too few for a sample", p,
                          (long long)doc_begin, (long long)doc_end, (long long)g->tokens_per_epoch);
    int64_t epochs = num_epochs_needed(g->tokens_per_epoch, seq_length, num_samples_requested);
    if (epochs > INT32_MAX / (doc_end - doc_begin))   // Megatron keeps doc_idx positions in int32
        return error_line(err, errlen, "%s: %lld samples of %d tokens need %lld epochs: too many", p,
                          (long long)num_samples_requested, seq_length, (long long)epochs);
    g->num_epochs = (int)epochs;
    g->num_samples = (epochs * g->tokens_per_epoch - 1) / seq_length;
    if (g->num_samples < 1) return error_line(err, errlen, "%s: too few tokens for one sample of %d", p, seq_length + 1);
    *first = g->num_samples;
    g->separate_last_epoch = separate_last_epoch(g, num_samples_requested, first);
    g->doc_idx_len = epochs * (doc_end - doc_begin);
    return 0;
}

static inline int gpt_dataset_build(GPTDataset* g, const IndexedDataset* ds, int64_t doc_begin, int64_t doc_end,
                                    int seq_length, uint64_t seed, int64_t num_samples_requested, char* err, size_t errlen) {
    int64_t first = 0;
    if (gpt_plan(g, ds, doc_begin, doc_end, seq_length, seed, num_samples_requested, &first, err, errlen)) return 1;
    const char* p = ds->path_prefix;
    g->doc_idx = (int32_t*)malloc((size_t)g->doc_idx_len * sizeof(int32_t));
    g->sample_idx = (int32_t*)malloc((size_t)(g->num_samples + 1) * 2 * sizeof(int32_t));
    g->shuffle_idx = (int64_t*)malloc((size_t)g->num_samples * sizeof(int64_t));
    if (!g->doc_idx || !g->sample_idx || !g->shuffle_idx) {
        gpt_dataset_free(g);
        return error_line(err, errlen, "%s: out of memory for the sample index", p);
    }
    MT19937 rng;
    mt19937_seed(&rng, (uint32_t)seed);
    build_doc_idx(g, &rng);
    if (build_sample_idx(g)) { gpt_dataset_free(g); return error_line(err, errlen, "%s: sample index overran", p); }
    build_shuffle_idx(g, &rng, first);
    return 0;
}

// sample i (taken modulo num_samples): seq_length+1 tokens of the document stream
static inline void gpt_dataset_get(const GPTDataset* g, int64_t i, int* tokens_out) {
    const IndexedDataset* ds = g->ds;
    i %= g->num_samples;
    if (i < 0) i += g->num_samples;
    int64_t j = shuffle_at(g, i);
    int64_t d = g->sample_idx[2 * j], offset = g->sample_idx[2 * j + 1];
    int64_t need = g->seq_length + 1, got = 0;
    for (; got < need && d < g->doc_idx_len; d++, offset = 0) {
        int64_t item = g->doc_idx[d], take = ds->sizes[item] - offset;
        if (take > need - got) take = need - got;
        const uint8_t* p = ds->bin + ds->pointers[item] + offset * ds->itemsize;
        for (int64_t t = 0; t < take; t++) tokens_out[got + t] = (int)token_at(p + t * ds->itemsize, ds->dtype_code);
        got += take;
    }
}

// ----------------------------------------------------------------------------
// CRC-32 (zlib's, Python's zlib.crc32: polynomial 0xEDB88320 reflected, a byte a step through a
// table, about 0.5 GB/s) of the n bytes at data after those that gave crc (0 to start).

static uint32_t crc32_bytes(uint32_t crc, const void* data, size_t n) {
    static uint32_t table[256];   // [b]: the CRC of byte b; the first call fills it, up to table[255] != 0
    for (uint32_t b = 0, c; table[255] == 0 && b < 256; table[b++] = c) {
        c = b;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
    }
    const uint8_t* p = (const uint8_t*)data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 255] ^ (crc >> 8);
    return ~crc;
}

// ----------------------------------------------------------------------------
// .npy files (numpy's format), for the index cache
//
// "\x93NUMPY", version 1.0, a uint16 header length, then an ASCII header such as
//     {'descr': '<i4', 'fortran_order': False, 'shape': (196, 2), }
// padded with spaces and ending in '\n' so that the data starts at a multiple of 64 bytes,
// then the array in C order. npy_write writes what np.save writes (numpy >= 1.23 also leaves
// room for shape[0] to grow to 21 digits); npy_map reads versions 1.0 and 2.0 (a uint32
// header length) from any writer, and maps the file rather than reading it.

typedef struct {
    char descr[8];                // '<i4', '<u4', '<i8', ...
    int ndim;                     // 1 or 2
    int64_t shape[2];
    const void* data;             // inside the mapping
    void* map; size_t map_bytes;
} NpyArray;

// the value after 'key': in the header dictionary, or NULL
static const char* npy_value(const char* header, const char* key) {
    char quoted[32];
    snprintf(quoted, sizeof quoted, "'%s':", key);
    const char* p = strstr(header, quoted);
    if (p == NULL) return NULL;
    for (p += strlen(quoted); *p == ' '; p++) {}
    return p;
}

// the header of the file's n bytes at p: magic, version, descr, fortran_order, shape, and
// that the data fills the rest of the file exactly, aligned for its type
static int npy_parse(NpyArray* a, const uint8_t* p, size_t n, char* why, size_t whylen) {
    if (n < 12 || memcmp(p, "\x93NUMPY", 6) != 0) return error_line(why, whylen, "not a .npy file (bad magic)");
    if ((p[6] != 1 && p[6] != 2) || p[7] != 0) return error_line(why, whylen, "unsupported .npy version %d.%d", p[6], p[7]);
    size_t start = p[6] == 1 ? 10 : 12;
    size_t hlen = p[8] | (size_t)p[9] << 8 | (p[6] == 2 ? (size_t)p[10] << 16 | (size_t)p[11] << 24 : 0);
    char h[4096];
    if (hlen >= sizeof h || start + hlen > n) return error_line(why, whylen, "header of %zu bytes is too long or truncated", hlen);
    memcpy(h, p + start, hlen);
    h[hlen] = 0;
    const char* descr = npy_value(h, "descr");
    const char* fortran = npy_value(h, "fortran_order");
    const char* shape = npy_value(h, "shape");
    if (hlen == 0 || h[hlen - 1] != '\n' || !descr || !fortran || !shape || *descr != '\'' || *shape != '(')
        return error_line(why, whylen, "malformed header \"%.80s\"", h);
    int k = 0;
    for (descr++; k < 7 && descr[k] != '\'' && descr[k]; k++) a->descr[k] = descr[k];
    a->descr[k] = 0;
    if (strncmp(fortran, "False", 5) != 0) return error_line(why, whylen, "fortran_order is not False");
    for (shape++;;) {   // "(n,)" or "(n, m)"
        while (*shape == ' ' || *shape == ',') shape++;
        if (*shape == ')') break;
        char* end;
        long long v = strtoll(shape, &end, 10);
        if (end == shape || v < 0 || a->ndim == 2) return error_line(why, whylen, "bad shape in \"%.80s\"", h);
        a->shape[a->ndim++] = v;
        shape = end;
    }
    int itemsize = a->descr[0] == '<' && (a->descr[2] == '4' || a->descr[2] == '8') && !a->descr[3] ? a->descr[2] - '0' : 0;
    size_t offset = start + hlen, bytes = (size_t)itemsize;
    for (int i = 0; i < a->ndim; i++)   // compared with the file size before multiplying: no overflow
        bytes = a->shape[i] && bytes > (n + 1) / (size_t)a->shape[i] ? n + 1 : bytes * (size_t)a->shape[i];
    if (a->ndim == 0 || itemsize == 0 || offset % (size_t)itemsize || bytes != n - offset)
        return error_line(why, whylen, "descr '%s', shape (%lld, %lld): does not match the %zu bytes of data", a->descr,
                          (long long)a->shape[0], (long long)a->shape[1], n - offset);
    a->data = p + offset;
    return 0;
}

static int npy_map(NpyArray* a, const char* path, char* why, size_t whylen) {
    memset(a, 0, sizeof *a);
    int fd = open_regular_file(path, why, whylen);
    if (fd < 0) return 1;
    struct stat st;
    void* p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size > 0) p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return error_line(why, whylen, "%s: empty, or cannot be mapped", path);
    a->map = p;
    a->map_bytes = (size_t)st.st_size;
    char reason[512];
    if (npy_parse(a, (const uint8_t*)p, a->map_bytes, reason, sizeof reason) == 0) return 0;
    munmap(p, a->map_bytes);
    memset(a, 0, sizeof *a);
    return error_line(why, whylen, "%s: %s", path, reason);
}

static void this_host(char* out, size_t size) { if (gethostname(out, size - 1) != 0) out[0] = 0; out[size - 1] = 0; }

// Write the pieces to a temporary, sync it and rename it over path: a reader sees the whole file
// or none. The temporary, PATH.tmpPID.HOST, is unique per writer and names it: a later build
// tells one whose writer was killed from one still being written (remove_stale_temporaries).
static int write_cache_file(const char* path, const void* const* pieces, const size_t* lens, int n, char* err, size_t errlen) {
    char tmp[4500], host[256];
    this_host(host, sizeof host);
    snprintf(tmp, sizeof tmp, "%s.tmp%d%s%s", path, (int)getpid(), host[0] ? "." : "", host);
    FILE* f = fopen(tmp, "wb");
    if (f == NULL) return error_line(err, errlen, "%s: %s (--data-cache-path names a writable directory)", tmp, strerror(errno));
    int e = 0;   // the errno of the first failure
    for (int i = 0; i < n && !e; i++)
        if (fwrite(pieces[i], 1, lens[i], f) != lens[i]) e = errno ? errno : EIO;
    if (close_synced(f) && !e) e = errno ? errno : EIO;
    int rc = e ? error_line(err, errlen, "%s: write failed: %s", tmp, strerror(e)) : 0;
    if (rc == 0 && rename(tmp, path) != 0) rc = error_line(err, errlen, "%s: rename to %s failed: %s", tmp, path, strerror(errno));
    if (rc) unlink(tmp);
    else fsync_parent_dir(path);
    return rc;
}

// np.save's bytes, written atomically; *crc (if not NULL) = the CRC-32 of the file's bytes
static int npy_write(const char* path, const char* descr, int64_t rows, int64_t cols, const void* data, size_t itemsize,
                     uint32_t* crc, char* err, size_t errlen) {
    char h[256];
    int n = cols ? snprintf(h, 128, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld, %lld), }", descr, (long long)rows, (long long)cols)
                 : snprintf(h, 128, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld,), }", descr, (long long)rows);
    char digits[32];
    n += snprintf(h + n, 32, "%*s", 21 - snprintf(digits, sizeof digits, "%lld", (long long)rows), "");
    int total = (10 + n + 1) / 64 * 64 + 64;   // numpy pads 1..64 spaces (64 when already aligned)
    memset(h + n, ' ', (size_t)(total - 11 - n));
    h[total - 11] = '\n';
    uint8_t prefix[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)(total - 10), (uint8_t)((total - 10) >> 8)};
    const void* pieces[3] = {prefix, h, data};
    const size_t lens[3] = {10, (size_t)(total - 10), (size_t)rows * (size_t)(cols ? cols : 1) * itemsize};
    if (crc) *crc = crc32_bytes(crc32_bytes(crc32_bytes(0, prefix, lens[0]), h, lens[1]), data, lens[2]);
    return write_cache_file(path, pieces, lens, 3, err, errlen);
}

// ----------------------------------------------------------------------------
// the index cache: the three arrays as .npy files beside the data (or in a cache directory)
//
// Megatron saves doc_idx (int32), sample_idx (int32, [n+1][2]) and shuffle_idx (uint32, or
// int64 from 2^32-1 samples on) with np.save as
//     PREFIX_NAME_indexmap_{num_samples}ns_{seq_length}sl_{seed}s_{doc_idx,sample_idx,shuffle_idx}.npy
// and trusts any file of that name. That name does not capture the document range, so a
// changed --split (or a dataset rewritten in place) silently reuses a stale index. We write
// the same files, which np.load and Megatron read, under the same name plus a hash:
//     PREFIX_NAME_indexmap_{num_samples}ns_{seq_length}sl_{seed}s_{HASH}_doc_idx.npy ...
// HASH (16 hex digits) covers every input of the arrays: the .idx file's size and its sizes
// array, the document range, seq_length, seed and num_samples (not the tokens: the arrays do
// not depend on them). Files are written under a temporary name and renamed, so a reader
// sees a whole file or none; and one that is there is checked (header, shape, contents as far as one
// pass can tell, bytes against the CRC-32s taken as they were written, which go last to PREFIX_..._
// {HASH}_crc32.txt, a line "<8 hex digits>  <file name>" each) and rebuilt, never trusted, if it fails.

enum { DATA_NO_CACHE = 2 };   // returned when may_build is 0 and there is no valid cache

static uint64_t hash_mix(uint64_t h, uint64_t v) {   // FNV-1a's step on whole words, high bits folded back
    h = (h ^ v) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

// the HASH of the cache's file names: every input of the index arrays
static uint64_t index_hash(const GPTDataset* g, uint64_t seed, int64_t num_samples) {
    const IndexedDataset* ds = g->ds;
    uint64_t h = 0xcbf29ce484222325ull;
    h = hash_mix(h, (uint64_t)(IDX_HEADER_BYTES + 12 * ds->num_items + 8 * (ds->num_docs + 1)));   // the .idx file's size
    for (int64_t i = 0; i < ds->num_items; i++) h = hash_mix(h, (uint32_t)ds->sizes[i]);
    const int64_t inputs[5] = {g->doc_begin, g->doc_end, g->seq_length, (int64_t)seed, num_samples};
    for (int i = 0; i < 5; i++) h = hash_mix(h, (uint64_t)inputs[i]);
    h ^= h >> 33;   // MurmurHash3's finalizer, so that any input changes every digit
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

// g->cache_stem = PREFIX (or CACHE_DIR/basename of PREFIX) + _NAME_indexmap_..._HASH; 1 if too long
static int cache_stem(GPTDataset* g, const char* cache_dir, const char* name, uint64_t seed, int64_t num_samples) {
    const char* base = strrchr(g->ds->path_prefix, '/');
    base = cache_dir && base ? base + 1 : g->ds->path_prefix;
    int n = snprintf(g->cache_stem, sizeof g->cache_stem, "%s%s%s_%s_indexmap_%lldns_%dsl_%llus_%016llx", cache_dir ? cache_dir : "",
                     cache_dir ? "/" : "", base, name, (long long)num_samples, g->seq_length, (unsigned long long)seed,
                     (unsigned long long)index_hash(g, seed, num_samples));
    return n < 0 || (size_t)n + 20 >= sizeof g->cache_stem;   // room for "_shuffle_idx.npy"
}

static const char* const INDEX_FILES[3] = {"doc_idx", "sample_idx", "shuffle_idx"};

static void cache_path(char* out, size_t size, const GPTDataset* g, int k) {   // k: 0..2 the arrays, 3 their checksums
    if (k == 3) snprintf(out, size, "%s_crc32.txt", g->cache_stem);
    else snprintf(out, size, "%s_%s.npy", g->cache_stem, INDEX_FILES[k]);
}

static const char* base_name(const char* path) { return strrchr(path, '/') ? strrchr(path, '/') + 1 : path; }

// The arrays are what gpt_dataset_build makes for g's inputs, as far as one linear pass can
// tell: the planned lengths; every doc_idx entry inside the document range; row k of
// sample_idx exactly at token k*seq_length of the document stream, its offset inside its
// document (so no sample reads past the stream or outside a document); every shuffle_idx
// entry a sample. Only the shuffled order itself is taken on trust.
static int check_cached_index(const GPTDataset* g, char* why, size_t whylen) {
    char path[4200];
    const int32_t* sizes = g->ds->sizes;
    cache_path(path, sizeof path, g, 0);
    for (int64_t i = 0; i < g->doc_idx_len; i++)
        if (g->doc_idx[i] < g->doc_begin || g->doc_idx[i] >= g->doc_end)
            return error_line(why, whylen, "%s: doc_idx[%lld] = %d is outside documents [%lld, %lld)", path, (long long)i,
                              g->doc_idx[i], (long long)g->doc_begin, (long long)g->doc_end);
    cache_path(path, sizeof path, g, 1);
    int64_t d = 0, start = 0;   // start: stream position of document doc_idx[d]
    for (int64_t k = 0; k <= g->num_samples; k++) {
        int64_t dk = g->sample_idx[2 * k], off = g->sample_idx[2 * k + 1];
        if (dk < d || dk >= g->doc_idx_len)
            return error_line(why, whylen, "%s: row %lld points at doc_idx entry %lld (expected %lld..%lld)", path,
                              (long long)k, (long long)dk, (long long)d, (long long)g->doc_idx_len - 1);
        for (; d < dk; d++) start += sizes[g->doc_idx[d]];
        if (off < 0 || (off >= sizes[g->doc_idx[d]] && k > 0) || start + off != k * g->seq_length)
            return error_line(why, whylen, "%s: row %lld (%lld, %lld) is not token %lld of the documents", path,
                              (long long)k, (long long)dk, (long long)off, (long long)k * g->seq_length);
    }
    cache_path(path, sizeof path, g, 2);
    for (int64_t i = 0; i < g->num_samples; i++)
        if (shuffle_at(g, i) < 0 || shuffle_at(g, i) >= g->num_samples)
            return error_line(why, whylen, "%s: entry %lld = %lld is not a sample (0..%lld)", path, (long long)i,
                              (long long)shuffle_at(g, i), (long long)g->num_samples - 1);
    return 0;
}

// each mapped file's bytes against the CRC-32 the checksum file holds for it
static int check_checksums(const GPTDataset* g, char* why, size_t whylen) {
    char sums[4200], path[4200], line[4400], name[4300];
    cache_path(sums, sizeof sums, g, 3);
    char reason[4400];
    FILE* f = fopen_regular_file(sums, reason, sizeof reason);
    if (f == NULL) return error_line(why, whylen, "%s (a cache without checksums is not trusted)", reason);
    int rc = 0;
    for (int k = 0; k < 3 && rc == 0; k++) {
        unsigned int crc = 0, now = crc32_bytes(0, g->maps[k], g->map_bytes[k]);
        cache_path(path, sizeof path, g, k);
        if (!fgets(line, sizeof line, f) || sscanf(line, "%8x %4299s", &crc, name) != 2 || strcmp(name, base_name(path)) || crc != now)
            rc = error_line(why, whylen, "%s: CRC-32 %08x, not what line %d of %s says: changed since written", path, now, k + 1, sums);
    }
    fclose(f);
    return rc;
}

// the checksum file of the arrays just written, their CRC-32s taken from the bytes in memory
static int write_checksums(const GPTDataset* g, const uint32_t crc[3], char* err, size_t errlen) {
    char text[3 * 4400], path[4200];
    size_t len = 0;
    for (int k = 0; k < 3; k++) {
        cache_path(path, sizeof path, g, k);
        len += (size_t)snprintf(text + len, sizeof text - len, "%08x  %s\n", crc[k], base_name(path));
    }
    cache_path(path, sizeof path, g, 3);
    const void* pieces[1] = {text};
    return write_cache_file(path, pieces, &len, 1, err, errlen);
}

// map the three files into g (planned, with its stem) and check them; on failure g keeps the
// mappings made so far, for gpt_dataset_free
static int load_index(GPTDataset* g, char* why, size_t whylen) {
    NpyArray a[3];
    char path[4200];
    for (int k = 0; k < 3; k++) {
        cache_path(path, sizeof path, g, k);
        if (npy_map(&a[k], path, why, whylen)) return 1;
        g->maps[k] = a[k].map;
        g->map_bytes[k] = a[k].map_bytes;
        int64_t want = k == 0 ? g->doc_idx_len : k == 1 ? g->num_samples + 1 : g->num_samples;
        int ok = a[k].ndim == (k == 1 ? 2 : 1) && a[k].shape[0] == want && (k != 1 || a[k].shape[1] == 2) &&
                 (k == 2 ? !strcmp(a[k].descr, "<u4") || !strcmp(a[k].descr, "<i8") : !strcmp(a[k].descr, "<i4"));
        if (!ok)
            return error_line(why, whylen, "%s: descr '%s', shape (%lld, %lld); expected %s of %lld rows", path, a[k].descr,
                              (long long)a[k].shape[0], (long long)a[k].shape[1], k == 2 ? "<u4 or <i8" : "<i4", (long long)want);
    }
    g->doc_idx = (int32_t*)a[0].data;   // read-only mappings: nothing writes through these
    g->sample_idx = (int32_t*)a[1].data;
    if (!strcmp(a[2].descr, "<i8")) g->shuffle_idx = (int64_t*)a[2].data;
    else g->shuffle_idx_u32 = (const uint32_t*)a[2].data;
    return check_cached_index(g, why, whylen) || check_checksums(g, why, whylen);
}

// the three arrays, and the CRC-32 of each file's bytes into crc
static int write_index(const GPTDataset* g, const GPTDataset* built, uint32_t crc[3], char* err, size_t errlen) {
    char path[3][4200];
    for (int k = 0; k < 3; k++) cache_path(path[k], sizeof path[k], g, k);
    int64_t n = built->num_samples;
    if (npy_write(path[0], "<i4", built->doc_idx_len, 0, built->doc_idx, 4, &crc[0], err, errlen) ||
        npy_write(path[1], "<i4", n + 1, 2, built->sample_idx, 4, &crc[1], err, errlen))
        return 1;
    if (n >= 0xfffffffell) return npy_write(path[2], "<i8", n, 0, built->shuffle_idx, 8, &crc[2], err, errlen);   // as Megatron
    uint32_t* narrow = (uint32_t*)malloc((size_t)n * 4);   // Megatron's dtype below 2^32-1 samples
    if (narrow == NULL) return error_line(err, errlen, "%s: out of memory", path[2]);
    for (int64_t i = 0; i < n; i++) narrow[i] = (uint32_t)built->shuffle_idx[i];
    int rc = npy_write(path[2], "<u4", n, 0, narrow, 4, &crc[2], err, errlen);
    free(narrow);
    return rc;
}

// NAME.tmpPID.HOST (NAME.tmpPID from older gridgpts: this host's), NAME a cache's file, is stale
// when HOST is this host and no process PID runs here: its writer was killed and it would stay,
// an array's size, forever. Not one whose writer runs (another job building the same cache),
// nor another host's: its pid means nothing here.
static int is_stale_temporary(const char* name, const char* host) {
    const char *npy = strstr(name, ".npy.tmp"), *sums = strstr(name, "_crc32.txt.tmp"), *t = npy ? npy + 4 : sums ? sums + 10 : NULL;
    if (t == NULL || strstr(name, "_indexmap_") == NULL || !(t[4] >= '0' && t[4] <= '9')) return 0;
    char* end;
    long long pid = strtoll(t + 4, &end, 10);
    if (pid <= 0 || pid > 0x7fffffff || (*end != 0 && (*end != '.' || strcmp(end + 1, host) != 0))) return 0;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;   // (EPERM: it runs, as another user)
}

// remove the stale temporaries of index caches in stem's folder (into dir: "." if stem has no '/'); how many
static int remove_stale_temporaries(const char* stem, char* dir, size_t size) {
    char host[256], path[4400];
    const char* slash = strrchr(stem, '/');
    snprintf(dir, size, "%.*s", slash ? (int)(slash - stem) + (slash == stem) : 1, slash ? stem : ".");
    this_host(host, sizeof host);
    DIR* d = opendir(dir);
    int removed = 0;
    for (struct dirent* e; d && (e = readdir(d)) != NULL;)
        if (is_stale_temporary(e->d_name, host) && snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path)
            removed += unlink(path) == 0;
    if (d) closedir(d);
    return removed;
}

// gpt_dataset_build's dataset, through the cache in cache_dir (NULL: beside the data). A
// valid cache is mapped; else with may_build the index is built, written and then mapped like
// one found (so every rank reads the same files the same way), and without it DATA_NO_CACHE
// is returned with the reason. The trainer calls this with may_build on one rank, waits at a
// barrier, then calls it without on the others. A build first removes the temporaries killed
// builds left in the cache's folder; g->note says so, and why a cache that was there failed.
static inline int gpt_dataset_open_cached(GPTDataset* g, const IndexedDataset* ds, const char* name, int64_t doc_begin,
                                          int64_t doc_end, int seq_length, uint64_t seed, int64_t num_samples,
                                          const char* cache_dir, int may_build, char* err, size_t errlen) {
    int64_t first = 0;
    if (gpt_plan(g, ds, doc_begin, doc_end, seq_length, seed, num_samples, &first, err, errlen)) return 1;
    if (cache_stem(g, cache_dir, name, seed, num_samples))
        return error_line(err, errlen, "%s: index cache path too long", cache_dir ? cache_dir : ds->path_prefix);
    GPTDataset plan = *g;
    char why[1024];
    if (load_index(g, why, sizeof why) == 0) return 0;
    gpt_dataset_free(g);
    if (!may_build) {
        error_line(err, errlen, "%s (no valid index cache, and this process may not build it)", why);
        return DATA_NO_CACHE;
    }
    char dir[4096], path[4200];
    int removed = remove_stale_temporaries(plan.cache_stem, dir, sizeof dir);
    cache_path(path, sizeof path, &plan, 0);   // written first: if it is there, the cache was (damaged, or incomplete)
    int found = access(path, F_OK) == 0;
    GPTDataset built;
    if (gpt_dataset_build(&built, ds, doc_begin, doc_end, seq_length, seed, num_samples, err, errlen)) return 1;
    uint32_t crc[3];   // the checksums go last: a cache is whole once they are there
    int rc = write_index(&plan, &built, crc, err, errlen) || write_checksums(&plan, crc, err, errlen);
    gpt_dataset_free(&built);
    *g = plan;
    size_t n = removed ? (size_t)snprintf(g->note, sizeof g->note, "data:   %s: removed %d stale temporar%s of index builds no "
                                          "longer running on this host from %s\n", name, removed, removed > 1 ? "ies" : "y", dir) : 0;
    if (found && n < sizeof g->note)
        snprintf(g->note + n, sizeof g->note - n, "data:   %s: rebuilt the index cache, which failed its check: %s\n", name, why);
    if (rc == 0 && load_index(g, why, sizeof why) != 0) rc = error_line(err, errlen, "%s (just written)", why);
    if (rc) gpt_dataset_free(g);
    g->built = rc == 0;
    return rc;
}

// ----------------------------------------------------------------------------
// blending several datasets by weight (Megatron's BlendableDataset)
//
// With --data-path W1 P1 W2 P2 ..., Megatron normalizes the weights, asks dataset k for
// ceil(N * w_k * 1.005) samples (0.5% spare), and then serves sample s from the dataset
// whose share so far lags its weight the most (helpers.cpp build_blending_indices).

static double numpy_sum(const double* a, int64_t n) {   // np.sum's pairwise order, for exact weights
    if (n < 8) {
        double s = 0.;
        for (int64_t i = 0; i < n; i++) s += a[i];
        return s;
    }
    if (n <= 128) {
        double r[8];
        int64_t i;
        for (int k = 0; k < 8; k++) r[k] = a[k];
        for (i = 8; i < n - n % 8; i += 8)
            for (int k = 0; k < 8; k++) r[k] += a[i + k];
        double s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) s += a[i];
        return s;
    }
    int64_t half = n / 2;
    half -= half % 8;
    return numpy_sum(a, half) + numpy_sum(a + half, n - half);
}

// weights -> normalized weights (in place) and each dataset's sample count for num_samples
static inline int blend_weights(double* weights, int n, int64_t num_samples, int64_t* per_dataset, char* err, size_t errlen) {
    double sum = 0.0;
    for (int k = 0; k < n; k++) {
        if (!(weights[k] >= 0)) return error_line(err, errlen, "--data-path: weight %g is negative", weights[k]);
        sum += weights[k];
    }
    if (!(sum > 0) || n < 1 || n > 254) return error_line(err, errlen, "--data-path: need 1..254 datasets with weights adding up to more than 0");
    for (int k = 0; k < n; k++) {
        weights[k] /= sum;
        per_dataset[k] = (int64_t)ceil((double)num_samples * weights[k] * 1.005);
    }
    return 0;
}

typedef struct {
    int num_datasets;
    int64_t size;
    uint8_t* dataset_index;          // [size] which dataset serves sample s
    int64_t* dataset_sample_index;   // [size] and which of its samples
} BlendIndex;

static inline void blend_free(BlendIndex* b) {
    free(b->dataset_index);
    free(b->dataset_sample_index);
    memset(b, 0, sizeof *b);
}

// size = total samples (Megatron-DeepSpeed: the sum of the datasets' lengths)
static inline int blend_build(BlendIndex* b, const double* weights, int n, int64_t size, char* err, size_t errlen) {
    memset(b, 0, sizeof *b);
    double w[256];
    int64_t served[256] = {0};   // samples taken from each dataset so far
    if (n < 1 || n > 254) return error_line(err, errlen, "--data-path: %d datasets (1..254 allowed)", n);
    double sum = numpy_sum(weights, n);   // BlendableDataset normalizes once more, with np.sum
    if (!(sum > 0)) return error_line(err, errlen, "--data-path: weights add up to 0");
    for (int k = 0; k < n; k++) w[k] = weights[k] / sum;
    b->num_datasets = n; b->size = size;
    b->dataset_index = (uint8_t*)malloc((size_t)size + 1);
    b->dataset_sample_index = (int64_t*)malloc((size_t)size * sizeof(int64_t) + 1);
    if (!b->dataset_index || !b->dataset_sample_index) {
        blend_free(b);
        return error_line(err, errlen, "--data-path: out of memory for the blending index");
    }
    for (int64_t s = 0; s < size; s++) {
        double at = s > 1 ? (double)s : 1.0;
        int best = 0;
        double best_error = w[0] * at - (double)served[0];
        for (int k = 1; k < n; k++) {
            double error = w[k] * at - (double)served[k];
            if (error > best_error) { best_error = error; best = k; }
        }
        b->dataset_index[s] = (uint8_t)best;
        b->dataset_sample_index[s] = served[best]++;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// token statistics: order-0 (unigram) entropy

// counts[t - lo] += 1 for each token t of documents [begin, end) with lo <= t < lo + n;
// returns how many were counted
static int64_t count_tokens(const IndexedDataset* ds, int64_t begin, int64_t end, double* counts, int64_t lo, int64_t n) {
    int64_t counted = 0;
    for (int64_t doc = begin; doc < end; doc++)
        for (int64_t i = 0; i < ds->sizes[doc]; i++) {
            int64_t t = token_at(ds->bin + ds->pointers[doc] + i * ds->itemsize, ds->dtype_code) - lo;
            if (t >= 0 && t < n) { counts[t] += 1.0; counted++; }
        }
    return counted;
}

// -sum p log p (nats) of the distribution proportional to counts
static double entropy_nats(const double* counts, int64_t n) {
    double total = 0.0, h = 0.0;
    for (int64_t v = 0; v < n; v++) total += counts[v];
    for (int64_t v = 0; v < n; v++)
        if (counts[v] > 0) h -= counts[v] / total * log(counts[v] / total);
    return h;
}

// ----------------------------------------------------------------------------
// the datasets of a run: --data-path, --split and blending in one object
// (Megatron's build_train_valid_test_datasets)
//
// --data-path P: split k is P's GPTDataset over the k-th range of --split, asked for
// num_samples[k] samples: Megatron's single-dataset path, exactly.
// --data-path W1 P1 W2 P2 ...: each prefix is split the same way and its k-th dataset asked
// for ceil(num_samples[k] * w * 1.005) samples (blend_weights); split k is the
// BlendableDataset over them, of size the sum of their lengths, as Megatron-DeepSpeed (and
// Megatron-LM until 2023, which later passes num_samples[k] as the size: the first
// num_samples[k] samples are the same either way). Megatron takes this path for a single
// "W P" pair too, so that the margin changes its sample count; so do we.
// A split is there when samples are asked of it and every prefix has documents for it. A
// prefix without documents for the train split is an error; a valid or test split without
// documents is just absent (Megatron builds no dataset for it and does not evaluate).
// --train-data-path, --valid-data-path, --test-data-path (Megatron-LM's per-split blends):
// each list, "P" or "W1 P1 ...", serves its split alone with every document of its prefixes,
// blended as above; --split does not apply.

// one blend of prefixes as the flag gave it, and the split it serves (-1: all three, by --split)
typedef struct {
    const char* flag;
    const char* const* v;
    int count, serves;
} DataPathList;

typedef struct {
    IndexedDataset ds;
    double weight;                // normalized within its blend; 1 without weights
    int serves;                   // -1: every split, by --split's ranges; k: split k alone, every document
    int64_t bounds[4];            // split k: documents [bounds[k], bounds[k+1])
    int64_t requested[3];         // samples asked of split k's GPTDataset
    GPTDataset split[3];
} DataPrefix;

#define MAX_PREFIXES 254
typedef struct {
    int num_prefixes;
    DataPrefix* prefix;           // [num_prefixes]: every list's, in the order given
    int members[3][MAX_PREFIXES]; // the prefixes split k draws from, and how many
    int num_members[3];
    int weighted[3];              // split k's blend came as WEIGHT PREFIX pairs
    int has[3];                   // train, valid, test
    int64_t num_samples[3];       // length of each split that is there
    BlendIndex blend[3];          // weighted only; its dataset index counts in members[k]
    char split[64];               // --split, for the print-out
    int seq_length;               // the index's shape, kept by data_splits_plan for data_splits_build
    uint64_t seed;
} DataSplits;

static const char* const SPLIT_NAMES[3] = {"train", "valid", "test"};

static inline void data_splits_close(DataSplits* d) {
    for (int i = 0; i < d->num_prefixes; i++) {
        for (int k = 0; k < 3; k++) gpt_dataset_free(&d->prefix[i].split[k]);
        indexed_dataset_close(&d->prefix[i].ds);
    }
    for (int k = 0; k < 3; k++) blend_free(&d->blend[k]);
    free(d->prefix);
    memset(d, 0, sizeof *d);
}

// "P", or "W1 P1 W2 P2 ...": the list's raw weights into w (1 each without weights) and its
// prefix paths into paths, n of them
static int parse_data_path(const DataPathList* l, double* w, const char** paths, int* n, int* weighted, char* err,
                           size_t errlen) {
    *weighted = l->count > 1;
    *n = *weighted ? l->count / 2 : l->count;
    if (l->count < 1 || (*weighted && l->count % 2) || *n > MAX_PREFIXES)
        return error_line(err, errlen, "%s: %d values; expected PREFIX, or WEIGHT PREFIX pairs (at most %d)", l->flag,
                          l->count, MAX_PREFIXES);
    for (int i = 0; i < *n; i++) {
        char* end;
        w[i] = *weighted ? strtod(l->v[2 * i], &end) : 1.0;
        paths[i] = l->v[*weighted ? 2 * i + 1 : i];
        if (*weighted && (end == l->v[2 * i] || *end || !(w[i] >= 0 && w[i] < 1e300)))
            return error_line(err, errlen, "%s: '%s' is not a weight (expected WEIGHT PREFIX pairs, weights >= 0)", l->flag,
                              l->v[2 * i]);
    }
    return 0;
}

// a prefix's document ranges: --split's, or every document in the one split it serves
static int prefix_bounds(DataPrefix* p, const char* split, char* err, size_t errlen) {
    if (p->serves < 0) return split_documents(split, p->ds.num_items, p->bounds, err, errlen);
    for (int k = 0; k < 4; k++) p->bounds[k] = k > p->serves ? p->ds.num_items : 0;
    return 0;
}

// every list's prefixes opened and their document ranges; each split's members and raw weights
static int open_prefixes(DataSplits* d, const DataPathList* lists, int num_lists, double* raw, char* err, size_t errlen) {
    int total = 0;
    for (int l = 0; l < num_lists; l++) total += lists[l].count;
    d->prefix = (DataPrefix*)calloc((size_t)(total > 0 ? total : 1), sizeof(DataPrefix));
    if (d->prefix == NULL) return error_line(err, errlen, "%s: out of memory", lists[0].flag);
    for (int l = 0; l < num_lists; l++) {
        const char* paths[MAX_PREFIXES];
        int n, weighted;
        if (parse_data_path(&lists[l], raw + d->num_prefixes, paths, &n, &weighted, err, errlen)) return 1;
        for (int i = 0; i < n; i++) {
            DataPrefix* p = &d->prefix[d->num_prefixes];
            p->serves = lists[l].serves;
            if (indexed_dataset_open(&p->ds, paths[i], err, errlen)) return 1;
            d->num_prefixes++;   // (opened: data_splits_close closes it)
            if (prefix_bounds(p, d->split, err, errlen)) return 1;
            for (int k = 0; k < 3; k++) {
                if (p->serves >= 0 && p->serves != k) continue;
                if (d->num_members[k] == MAX_PREFIXES)
                    return error_line(err, errlen, "%s: more than %d prefixes for the %s split", lists[l].flag,
                                      MAX_PREFIXES, SPLIT_NAMES[k]);
                d->members[k][d->num_members[k]++] = d->num_prefixes - 1;
                d->weighted[k] = weighted;
            }
        }
    }
    return 0;
}

// the sample counts of each split's members, and which splits are there
static int plan_splits(DataSplits* d, const double* raw, const int64_t num_samples[3], char* err, size_t errlen) {
    for (int k = 0; k < 3; k++) {
        double w[MAX_PREFIXES];
        int64_t per[MAX_PREFIXES];
        int n = d->num_members[k];
        for (int j = 0; j < n; j++) { w[j] = raw[d->members[k][j]]; per[j] = num_samples[k]; }
        if (d->weighted[k] && blend_weights(w, n, num_samples[k], per, err, errlen)) return 1;   // normalizes w
        d->has[k] = num_samples[k] > 0 && n > 0;
        for (int j = 0; j < n; j++) {
            DataPrefix* p = &d->prefix[d->members[k][j]];
            p->weight = d->weighted[k] ? w[j] : 1.0;
            p->requested[k] = per[j];
            if (!d->has[k] || p->bounds[k + 1] > p->bounds[k]) continue;
            if (k > 0) { d->has[k] = 0; continue; }
            if (p->serves >= 0)
                return error_line(err, errlen, "%s: no documents, but %lld train samples are asked for", p->ds.path_prefix,
                                  (long long)num_samples[k]);
            return error_line(err, errlen, "%s: --split %s leaves the %s split without documents (%lld documents in all), "
                              "but %lld %s samples are asked for", p->ds.path_prefix, d->split, SPLIT_NAMES[k],
                              (long long)p->ds.num_items, (long long)num_samples[k], SPLIT_NAMES[k]);
        }
    }
    return 0;
}

// Opening the data takes two calls, so that a trainer can check its memory between them:
// data_splits_plan maps every prefix's .idx and .bin, splits the documents and works out each
// split's index (its shape: samples, epochs), which data_splits_index_bytes prices;
// data_splits_build then builds or maps the indexes. data_splits_open does both.

// The blends of lists (num_lists of them: --data-path alone, or the per-split ones given).
// Returns 0, or 1 with err naming the file or flag and what is wrong (d is then closed).
static inline int data_splits_plan_lists(DataSplits* d, const DataPathList* lists, int num_lists, const char* split,
                                         int seq_length, uint64_t seed, const int64_t num_samples[3], char* err,
                                         size_t errlen) {
    memset(d, 0, sizeof *d);
    double* raw = (double*)calloc(3 * MAX_PREFIXES, sizeof(double));
    d->seq_length = seq_length;
    d->seed = seed;
    int rc = raw == NULL;
    if (rc) error_line(err, errlen, "data: out of memory");
    if (!rc && snprintf(d->split, sizeof d->split, "%s", split) >= (int)sizeof d->split)
        rc = error_line(err, errlen, "--split %s: too long", split);
    if (!rc) rc = open_prefixes(d, lists, num_lists, raw, err, errlen);
    if (!rc) rc = plan_splits(d, raw, num_samples, err, errlen);
    for (int k = 0; k < 3 && rc == 0; k++) {
        for (int j = 0; j < d->num_members[k] && rc == 0 && d->has[k]; j++) {
            DataPrefix* p = &d->prefix[d->members[k][j]];
            int64_t first;
            rc = gpt_plan(&p->split[k], &p->ds, p->bounds[k], p->bounds[k + 1], seq_length, seed, p->requested[k], &first,
                          err, errlen);
            d->num_samples[k] += p->split[k].num_samples;
        }
    }
    free(raw);
    if (rc) data_splits_close(d);
    return rc;
}

// --data-path alone, split by --split
static inline int data_splits_plan(DataSplits* d, const char* const* data_path, int count, const char* split,
                                   int seq_length, uint64_t seed, const int64_t num_samples[3], char* err, size_t errlen) {
    DataPathList list = {"--data-path", data_path, count, -1};
    return data_splits_plan_lists(d, &list, 1, split, seq_length, seed, num_samples, err, errlen);
}

// The bytes of host memory the planned indexes take once built: per split and prefix doc_idx
// (4 bytes a document per epoch), sample_idx (8 a sample) and shuffle_idx (8 a sample); with
// blending, 9 bytes a sample of each split. (Rank 0 builds them in memory, then every rank
// maps the same cache files.)
static inline double data_splits_index_bytes(const DataSplits* d) {
    double bytes = 0.0;
    for (int k = 0; k < 3; k++) {
        if (!d->has[k]) continue;
        for (int j = 0; j < d->num_members[k]; j++) {
            const GPTDataset* g = &d->prefix[d->members[k][j]].split[k];
            bytes += 4.0 * (double)g->doc_idx_len + 8.0 * (double)(g->num_samples + 1) + 8.0 * (double)g->num_samples;
        }
        if (d->weighted[k]) bytes += 9.0 * (double)d->num_samples[k];
    }
    return bytes;
}

// The planned indexes, built (and written to the cache in cache_dir, NULL: beside the data) or
// found there. Returns 0; DATA_NO_CACHE when may_build is 0 and an index cache is missing or
// invalid; 1 on any other error. err names the file and what is wrong; d is then closed.
static inline int data_splits_build(DataSplits* d, const char* cache_dir, int may_build, char* err, size_t errlen) {
    int rc = 0;
    for (int k = 0; k < 3 && rc == 0; k++) {
        if (!d->has[k]) continue;
        double w[MAX_PREFIXES];
        int64_t size = 0;
        for (int j = 0; j < d->num_members[k] && rc == 0; j++) {
            DataPrefix* p = &d->prefix[d->members[k][j]];
            rc = gpt_dataset_open_cached(&p->split[k], &p->ds, SPLIT_NAMES[k], p->bounds[k], p->bounds[k + 1], d->seq_length,
                                         d->seed, p->requested[k], cache_dir, may_build, err, errlen);
            size += p->split[k].num_samples;
            w[j] = p->weight;
        }
        if (rc == 0 && d->weighted[k]) rc = blend_build(&d->blend[k], w, d->num_members[k], size, err, errlen);
        d->num_samples[k] = size;
    }
    if (rc) data_splits_close(d);
    return rc;
}

// Both at once. Returns as data_splits_build.
static inline int data_splits_open(DataSplits* d, const char* const* data_path, int count, const char* split, int seq_length,
                                   uint64_t seed, const int64_t num_samples[3], const char* cache_dir, int may_build,
                                   char* err, size_t errlen) {
    if (data_splits_plan(d, data_path, count, split, seq_length, seed, num_samples, err, errlen)) return 1;
    return data_splits_build(d, cache_dir, may_build, err, errlen);
}

// the samples of split k's documents in one pass, none taken twice: (tokens - 1) / seq_length of
// each member (Megatron's samples in one epoch), summed over the blend
static inline int64_t data_splits_one_pass(const DataSplits* d, int k) {
    int64_t samples = 0;
    for (int j = 0; j < d->num_members[k]; j++) {
        const GPTDataset* g = &d->prefix[d->members[k][j]].split[k];
        samples += (g->tokens_per_epoch - 1) / g->seq_length;
    }
    return samples;
}

static inline int data_splits_has(const DataSplits* d, int split) { return split >= 0 && split < 3 && d->has[split]; }

// sample i (modulo the split's length) of split 0 train, 1 valid, 2 test, which must be there
// (data_splits_has): seq_length+1 tokens
static inline void data_splits_get(const DataSplits* d, int split, int64_t i, int* tokens) {
    const int* members = d->members[split];
    if (!d->weighted[split]) { gpt_dataset_get(&d->prefix[members[0]].split[split], i, tokens); return; }
    const BlendIndex* b = &d->blend[split];
    i %= b->size;
    if (i < 0) i += b->size;
    gpt_dataset_get(&d->prefix[members[b->dataset_index[i]]].split[split], b->dataset_sample_index[i], tokens);
}

// the largest token id of all prefixes into *max_id_out; with vocab_size > 0, an id outside
// [0, vocab_size) is an error that names the file, the document and the position
static inline int data_splits_check_vocab(const DataSplits* d, int vocab_size, int64_t* max_id_out, char* err, size_t errlen) {
    *max_id_out = 0;
    for (int i = 0; i < d->num_prefixes; i++) {
        const IndexedDataset* ds = &d->prefix[i].ds;
        int64_t lo, hi;
        if (indexed_dataset_max_token(ds, &lo, &hi)) continue;   // no tokens
        if (hi > *max_id_out) *max_id_out = hi;
        if (lo >= 0 && (vocab_size <= 0 || hi < vocab_size)) continue;
        for (int64_t doc = 0; doc < ds->num_items; doc++)   // the rare bad file: find the first culprit
            for (int64_t t = 0; t < ds->sizes[doc]; t++) {
                int64_t id = indexed_dataset_token(ds, doc, t);
                if (id < 0 || (vocab_size > 0 && id >= vocab_size))
                    return error_line(err, errlen, "%s.bin: document %lld, token %lld: id %lld is outside the vocabulary [0, %d)",
                                      ds->path_prefix, (long long)doc, (long long)t, (long long)id, vocab_size);
            }
    }
    return 0;
}

// order-0 entropy (nats per token) of the train split: of the mixture that blending serves,
// sum_k w_k * (token frequencies of prefix k's train documents); ids >= vocab_size ignored
static inline double data_splits_unigram_entropy(const DataSplits* d, int vocab_size) {
    double* mix = (double*)calloc((size_t)vocab_size, sizeof(double));
    double* counts = (double*)malloc((size_t)vocab_size * sizeof(double));
    double h = NAN;
    for (int j = 0; j < d->num_members[0] && mix && counts; j++) {
        const DataPrefix* p = &d->prefix[d->members[0][j]];
        memset(counts, 0, (size_t)vocab_size * sizeof(double));
        int64_t n = p->bounds[1] > p->bounds[0] ? count_tokens(&p->ds, p->bounds[0], p->bounds[1], counts, 0, vocab_size) : 0;
        for (int v = 0; v < vocab_size && n > 0; v++) mix[v] += p->weight * counts[v] / (double)n;
    }
    if (mix && counts) h = entropy_nats(mix, vocab_size);
    free(mix);
    free(counts);
    return h;
}

// what the trainer prints at start-up: each prefix's split, each split's samples and index cache
// (and what a build had to say: stale temporaries removed, a damaged cache rebuilt)
static inline void data_splits_print(const DataSplits* d, FILE* f) {
    for (int i = 0; i < d->num_prefixes; i++) {
        const DataPrefix* p = &d->prefix[i];
        const int64_t* b = p->bounds;
        fprintf(f, "data: %s", p->ds.path_prefix);
        if (d->weighted[p->serves < 0 ? 0 : p->serves]) fprintf(f, " (weight %.4f)", p->weight);
        if (p->serves >= 0)
            fprintf(f, ": %lld documents, all %s data\n", (long long)p->ds.num_items, SPLIT_NAMES[p->serves]);
        else
            fprintf(f, ": %lld documents, split %s -> train [%lld, %lld) valid [%lld, %lld) test [%lld, %lld)\n",
                    (long long)p->ds.num_items, d->split, (long long)b[0], (long long)b[1], (long long)b[1],
                    (long long)b[2], (long long)b[2], (long long)b[3]);
        for (int k = 0; k < 3; k++) {
            const GPTDataset* g = &p->split[k];
            if (!d->has[k] || (p->serves >= 0 && p->serves != k)) continue;
            fputs(g->note, f);
            fprintf(f, "data:   %s: %lld samples asked, %lld in %d epoch(s)%s; index %s %s_*.npy\n", SPLIT_NAMES[k],
                    (long long)p->requested[k], (long long)g->num_samples, g->num_epochs,
                    g->separate_last_epoch ? " (last one shuffled apart)" : "", g->built ? "built into" : "loaded from",
                    g->cache_stem);
        }
    }
    fprintf(f, "data: samples per split:");
    for (int k = 0; k < 3; k++)
        if (d->has[k]) fprintf(f, " %s %lld", SPLIT_NAMES[k], (long long)d->num_samples[k]);
        else fprintf(f, " %s none", SPLIT_NAMES[k]);
    fprintf(f, "%s\n", d->weighted[0] || d->weighted[1] || d->weighted[2] ? " (blended)" : "");
}
