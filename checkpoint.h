/*
checkpoint.h — checkpoints (any grid saves, any grid loads).

Its own header because it is a self-contained concern behind a narrow interface: it takes
the model (its tensor table and flat buffers), the optimizer state and one struct of
counters (`Progress`, exactly what metadata.txt stores), never the trainer. A test or a tool
can save and load a model with it alone.

A checkpoint is a directory DIR/iter_0000100/ with
  metadata.txt  the run's counters, the model config, the sections and one line per tensor
                (name, whole shape, offset in its section, CRC-32 of each section's bytes);
  tensors.bin   three sections back to back: the fp32 master weights, Adam's first and
                second moments; in each, every tensor whole, row-major, in the order of the
                tensor table of a one-process model, the vocabulary without padding rows.
8-bit moments (--use-bnb-optimizer) are saved dequantized, fp32 as any (metadata.txt's
`optimizer_states 8bit` says so): their blocks follow each rank's flat buffer (the same under
any DP, not under another TP or PP), so a file of codes and block scales would hold one layout's
blocks, and every checkpoint here loads in any layout. So 32-bit AdamW loads them as they are, and 8-bit AdamW quantizes what it loads (fp32
moments, or 8-bit ones under another layout's blocks) to its own blocks: each value off by at
most half a gap of the dynamic map, 0.7% of its block's largest m, 0.35% of its largest v
(kernels/quantize.cuh). Saved and loaded in the same layout, the blocks come back bit for bit
(the scale is the block's value of largest magnitude, stored exactly), and so does a second save.
Each rank writes and reads only its own slices: the part of each tensor inside its ZeRO
shard, at the tensor's place in the file (MPI-IO, so any number of hosts can share the
file). Nothing is written in place: a save goes to iter_0000100.tmp/, is synced, renamed,
and latest_checkpointed_iteration.txt (Megatron's name) is replaced last, so a crash in
the middle of a save leaves the previous checkpoint as it was.

Interface: checkpoint_save, latest_checkpoint, checkpoint_meta_read, check_config_matches,
checkpoint_load; for hf_import.h (which writes an imported model as a checkpoint):
canonical_layout, prepare_save_dir, finish_save.
The Hugging Face export and import are hf.h's and hf_import.h's, on top of this room.
*/
#pragma once
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <zlib.h>

// The batch schedule the samples were consumed under (--global-batch-size and
// --rampup-batch-size START INCREMENT SAMPLES, 0 0 0 without a ramp), since the iteration and
// consumed_samples at which it took over (a resumed run may change it): so consumed_samples
// can be checked at load against the sum of the batches the schedule gives.
typedef struct {
    int global_batch_size;              // 0: not recorded (a checkpoint from before gridgpt recorded it)
    int rampup_start, rampup_increment;
    long long rampup_samples;
    int since_iteration;
    long long since_consumed;
} BatchRecord;

// The learning-rate schedule the run trained under (Megatron-LM's OptimizerParamScheduler state,
// its lengths in samples): a resume whose flags give another is refused unless it says which
// one goes on (train.c's reconcile_lr_schedule)
typedef struct {
    int recorded;               // 0: none (the initial model, an import, a checkpoint from before)
    float max_lr, min_lr, weight_decay;
    char decay_style[24];       // --lr-decay-style's name
    long long warmup_samples, decay_samples;
} LRRecord;

// the run's counters a checkpoint stores, besides the optimizer's step
typedef struct {
    int iteration;
    long long consumed_samples;         // samples trained on so far (the data position)
    long long scheduler_samples;        // samples of successful updates (drives the LR, as Megatron)
    long long consumed_valid_samples;   // the validation data's position
    BatchRecord batch;
    LRRecord lr;
} Progress;

// The sample counters' ceiling, 2^62: INT_MAX iterations of INT_MAX-sample batches stay below
// it, and a run going on from it cannot wrap a 64-bit count. (A metadata.txt without its checksum
// line once held consumed_valid_samples 2^63 - 1: evaluation wrapped it, and the run's next,
// checksummed checkpoint held a negative count that every later --load refused.)
#define COUNTER_MAX ((long long)1 << 62)

// The counters against their ranges and each other: at load (all a checkpoint written before
// metadata.txt had its checksum line gets), and at save (no checkpoint is written that its own
// load would refuse). NULL, or what is out of range. scaler: a dynamic loss scaler's, or NULL.
static const char* counters_problem(const Progress* p, int optimizer_step, const LossScaler* scaler) {
    const BatchRecord* b = &p->batch;
    if (p->iteration < 0) return "iteration is negative";
    if (optimizer_step < 0 || optimizer_step > p->iteration)
        return "optimizer_step is outside [0, iteration] (a step is taken or skipped once per iteration)";
    if (p->consumed_samples < p->iteration || (p->iteration == 0 && p->consumed_samples != 0))
        return "consumed_samples is below iteration (every iteration consumes a batch) or not 0 at iteration 0";
    if (p->scheduler_samples < 0 || p->scheduler_samples > p->consumed_samples)
        return "scheduler_samples is outside [0, consumed_samples] (it counts the samples of applied steps)";
    if (p->consumed_valid_samples < 0) return "consumed_valid_samples is negative";
    if (p->consumed_samples > COUNTER_MAX || p->consumed_valid_samples > COUNTER_MAX)
        return "a sample count is beyond 2^62 (4611686018427387904: no run of 2^31 iterations of 2^31 samples gets "
               "there, and a run going on from it could wrap it)";
    if (b->global_batch_size > 0 &&
        (b->since_iteration < 0 || b->since_iteration > p->iteration || b->since_consumed < 0 ||
         b->since_consumed > p->consumed_samples || b->rampup_start < 0 || b->rampup_increment < 0 || b->rampup_samples < 0))
        return "batch_schedule's counters are outside [0, iteration] and [0, consumed_samples], or negative";
    if (scaler && scaler->growth_tracker < 0)   // (the hysteresis tracker may be: data_parallel.h)
        return "the loss_scaler's growth tracker is negative";
    return NULL;
}

static const char* const SECTION_NAMES[3] = {"weight", "exp_avg", "exp_avg_sq"};

// CRC-32 (zlib's crc32, start with crc = 0), in pieces: its length argument is 32-bit.
// zlib's measured 1.6x the speed of a hand-written slicing-by-8 loop here (docs/measured.md).
static uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
    const Bytef* p = (const Bytef*)data;
    for (size_t k; n > 0; n -= k, p += k) crc = (uint32_t)crc32(crc, p, (uInt)(k = n < (1u << 30) ? n : (1u << 30)));
    return crc;
}

// ----------------------------------------------------------------------------
// the canonical layout: the model as one process holds it

// the tensor table of a one-process model (no buffers are allocated; gpt_free frees the table)
static GPT canonical_table(const GPTConfig* c) {
    GPT whole;
    memset(&whole, 0, sizeof(whole));
    whole.cfg = *c;
    whole.tp_size = 1;
    whole.ep = expert_slice(0, 1, c->num_experts, NULL, 1);   // every expert
    whole.dense_pad_multiple = whole.shard_multiple = 1;
    whole.num_local_layers = c->num_layers;
    whole.is_first_stage = whole.is_last_stage = 1;
    build_tensor_table(&whole);
    return whole;
}

static size_t canonical_bytes(const TensorDesc* t) { return (size_t)t->valid_rows * t->cols * sizeof(float); }

// where each tensor of the table sits in a section, and the section's size
typedef struct {
    GPT whole;
    size_t* offset;        // [whole.num_tensors]
    size_t section_bytes;
} CanonicalLayout;

static CanonicalLayout canonical_layout(const GPTConfig* c) {
    CanonicalLayout L;
    L.whole = canonical_table(c);
    L.offset = (size_t*)mallocCheck(L.whole.num_tensors * sizeof(size_t));
    L.section_bytes = 0;
    for (int i = 0; i < L.whole.num_tensors; i++) {
        L.offset[i] = L.section_bytes;
        L.section_bytes += canonical_bytes(&L.whole.tensors[i]);
    }
    return L;
}

static void free_layout(CanonicalLayout* L) {
    gpt_free(&L->whole);
    free(L->offset);
}

static int canonical_index(const CanonicalLayout* L, const char* name) {
    for (int i = 0; i < L->whole.num_tensors; i++)
        if (strcmp(L->whole.tensors[i].name, name) == 0) return i;
    return -1;
}

// ----------------------------------------------------------------------------
// a rank's slices of the file

// Walk the part of local tensor t inside [lo, hi) of the flat buffer, as runs that are
// contiguous in the canonical file: fn(run's flat index, run length, canonical byte offset
// within the section). A slice of whole rows is contiguous across rows (within each row block:
// SwiGLU's [gate; up]); a column slice is one run per row. Runs stop before the vocabulary's
// padding rows and at RUN_MAX elements.
#define RUN_MAX ((size_t)1 << 20)
typedef void (*RunFn)(void* ctx, size_t flat, size_t n, size_t file_offset);

static void for_each_run(const TensorDesc* t, size_t tensor_offset, size_t lo, size_t hi, RunFn fn, void* ctx) {
    size_t cols = t->local_cols;
    size_t piece = t->local_rows / t->row_parts;   // local rows contiguous in the file (see TensorDesc)
    for (size_t f = lo; f < hi;) {
        size_t e = f - t->offset, r = e / cols, row = whole_row(t, (int)r), c = e % cols;
        if (row >= (size_t)t->valid_rows) break;   // the rest is padding
        size_t rows = t->valid_rows - row < piece - r % piece ? t->valid_rows - row : piece - r % piece;
        size_t n = cols == (size_t)t->cols ? rows * cols - c : cols - c;
        n = n < hi - f ? n : hi - f;
        n = n < RUN_MAX ? n : RUN_MAX;
        fn(ctx, f, n, tensor_offset + (row * t->cols + t->col_start + c) * sizeof(float));
        f += n;
    }
}

// A save never trusts a write: the CRC-32 of each run is taken from memory before it is
// written (runs are written several at a time: run_io), each run is read back and checked
// against it, and the tensors' CRCs in metadata.txt are combined from the runs' (so a damaged
// file can never match them).
typedef struct {
    uint64_t offset, bytes;    // where in tensors.bin
    uint32_t crc, pad;         // of the bytes meant to be there
} Piece;

// what one rank wrote in a save, and the first thing that went wrong ("": nothing)
typedef struct {
    Piece* pieces;
    size_t count, cap;
    char error[4800];
} SaveLog;

static void log_piece(SaveLog* log, Piece p) {
    if (log->count == log->cap) {
        log->cap = log->cap ? 2 * log->cap : 1024;
        log->pieces = (Piece*)reallocCheck(log->pieces, log->cap * sizeof(Piece));
    }
    log->pieces[log->count++] = p;
}

// one run between the file and a float array in device memory, through a host buffer of
// RUN_MAX floats: a save or load never holds more of the model than that on the host
typedef struct {
    MPI_File file;
    const char* path;
    size_t section_base;       // byte offset of the section in tensors.bin
    float* dev;                // the array (device memory, or host memory with on_host) ...
    size_t dev_start;          // ... whose element 0 is this flat index
    float* bounce;             // [RUN_MAX] on the host
    SaveLog* log;              // writing: the pieces written; NULL: reading
    size_t pending_at, pending_bytes;   // writing: runs gathered in bounce, not yet written
    int on_host;               // `dev` is a host array, read into or written from directly
} RunIO;

// writing: the gathered runs, in one write
static void write_pending(RunIO* io) {
    size_t at = io->pending_at, bytes = io->pending_bytes;
    io->pending_bytes = 0;
    if (bytes == 0 || io->log->error[0]) return;   // after the first failed write this save is lost: no more
    if (shared_file_io(io->file, at, io->bounce, bytes, 1) != 0)
        snprintf(io->log->error, sizeof(io->log->error), "writing %s at byte %zu failed: %s", io->path, at, shared_file_why);
}

// A save gathers runs that follow each other in the file (biases, LayerNorms, whole tensors
// of a small shard, the rows of a column slice) into one write of up to RUN_MAX floats: fewer
// and larger writes, fewer points where a save can fail. Each run is still its own piece,
// with its own CRC, so that the pieces of a tensor give the tensor's CRC.
static void run_io(void* ctx, size_t flat, size_t n, size_t file_offset) {
    RunIO* io = (RunIO*)ctx;
    float* p = io->dev + (flat - io->dev_start);
    size_t at = io->section_base + file_offset, bytes = n * sizeof(float);
    if (!io->log) {
        float* into = io->on_host ? p : io->bounce;
        if (shared_file_io(io->file, at, into, bytes, 0) != 0)
            fail("reading %s at byte %zu failed: %s", io->path, at, shared_file_why);
        if (!io->on_host) host_to_dev(p, io->bounce, bytes);
        return;
    }
    int follows = io->pending_bytes > 0 && at == io->pending_at + io->pending_bytes;
    if (!follows || io->pending_bytes + bytes > RUN_MAX * sizeof(float)) write_pending(io);
    if (io->pending_bytes == 0) io->pending_at = at;
    char* run = (char*)io->bounce + io->pending_bytes;
    if (io->on_host) memcpy(run, p, bytes);
    else dev_to_host(run, p, bytes);
    Piece piece = {at, bytes, crc32_update(0, run, bytes), 0};
    log_piece(io->log, piece);
    io->pending_bytes += bytes;
}

// Does this rank write tensor t? Each element once: not the tied copy of the last stage, a
// tensor replicated over tensor ranks only from tensor rank 0 (their values are identical).
static int writes_tensor(const GPT* m, const TensorDesc* t) {
    return !t->tied_copy && (t->split_axis >= 0 || m->tp_rank == 0);
}

// write (log given) or read the shard's parts of every local tensor: the master weights, and
// with all three sections the Adam moments (8-bit ones through an fp32 copy of the shard's on
// the host: dequantized before a write, quantized after a read, the shard's padding with them)
static void shard_io(const GPT* m, const AdamWState* opt, const CanonicalLayout* L, MPI_File f, const char* path,
                     SaveLog* log, int sections) {
    float* bounce = (float*)mallocCheck(RUN_MAX * sizeof(float));
    int reading = log == NULL;
    for (int k = 0; k < sections; k++) {
        if (reading && k == 0 && sizeof(floatX) == sizeof(float)) continue;   // CPU: the master is the params, loaded
        for (int g = 0; g < opt->num_regions; g++) {
            const ShardRegion* r = &opt->regions[g];
            float* host = k > 0 && opt->states_8bit ? (float*)mallocCheck(r->shard_size * sizeof(float)) : NULL;
            if (host) adamw_moment_to_host(opt, r, k - 1, host);
            float* arrays[3] = {r->master, r->m, r->v};
            RunIO io = {f, path, k * L->section_bytes, host ? host : arrays[k], r->shard_start, bounce, log, 0, 0, host != NULL};
            for (int i = 0; i < m->num_tensors; i++) {
                const TensorDesc* tensor = &m->tensors[i];
                if (!reading && !writes_tensor(m, tensor)) continue;
                size_t lo, hi;
                intersect_ranges(tensor->offset, tensor->offset + tensor->numel, r->shard_start,
                                 r->shard_start + r->shard_size, &lo, &hi);
                if (lo < hi) for_each_run(tensor, L->offset[canonical_index(L, tensor->name)], lo, hi, run_io, &io);
            }
            if (!reading) write_pending(&io);
            if (host && reading) adamw_moment_from_host(opt, r, k - 1, host);
            free(host);
        }
    }
    free(bounce);
}

// CRC-32 of every tensor in every section, each rank reading its share of the tensors back
static void section_checksums(const CanonicalLayout* L, MPI_File f, uint32_t* crc /* [num_tensors][3] */) {
    int n = L->whole.num_tensors;
    memset(crc, 0, 3 * n * sizeof(uint32_t));
    for (int i = grid.world_rank; i < n; i += grid.world_size) {
        size_t bytes = canonical_bytes(&L->whole.tensors[i]);
        uint8_t* buf = (uint8_t*)mallocCheck(bytes);
        for (int k = 0; k < 3; k++) {
            if (shared_file_io(f, k * L->section_bytes + L->offset[i], buf, bytes, 0) != 0)
                fail("reading tensor %s of a checkpoint failed: %s", L->whole.tensors[i].name, shared_file_why);
            crc[3 * i + k] = crc32_update(0, buf, bytes);
        }
        free(buf);
    }
    all_reduce_or(&grid.world, crc, 3 * n);
}

// ----------------------------------------------------------------------------
// saving

// flush, sync and close f (open on tmp), then rename tmp to path; on failure remove tmp. 0, or 1 with a line in err
static int commit_file(FILE* f, const char* tmp, const char* path, char* err, size_t errlen) {
    int ok = !ferror(f) && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (ok && rename(tmp, path) == 0) return 0;
    int e = errno;
    remove(tmp);
    return error_line(err, errlen, "cannot write %s: %s", path, strerror(e));
}

// metadata.txt's text, in a buffer the caller frees; its last line is the CRC-32 of the lines
// before it, so that an edited counter (optimizer_step -1, consumed_samples off by one) is
// refused at load instead of trusted
static char* metadata_text(const GPT* m, const AdamWState* opt, const Progress* p, const CanonicalLayout* L,
                           const uint32_t* crc) {
    char* text = NULL;
    size_t len = 0;
    FILE* f = open_memstream(&text, &len);
    if (!f) fail("out of host memory for a checkpoint's metadata");
    fprintf(f, "gridgpt-checkpoint 1\niteration %d\nconsumed_samples %lld\nscheduler_samples %lld\noptimizer_step %d\n"
            "consumed_valid_samples %lld\n", p->iteration, p->consumed_samples, p->scheduler_samples, opt->step,
            p->consumed_valid_samples);
    const BatchRecord* b = &p->batch;
    if (b->global_batch_size > 0)
        fprintf(f, "batch_schedule %d %d %d %lld since %d %lld\n", b->global_batch_size, b->rampup_start,
                b->rampup_increment, b->rampup_samples, b->since_iteration, b->since_consumed);
    const LRRecord* r = &p->lr;
    if (r->recorded)
        fprintf(f, "lr_schedule max_lr %.9g min_lr %.9g decay_style %s warmup_samples %lld decay_samples %lld "
                "weight_decay %.9g\n", r->max_lr, r->min_lr, r->decay_style, r->warmup_samples, r->decay_samples,
                r->weight_decay);
    fprintf(f, "optimizer_states %s\n", opt->states_8bit ? "8bit" : "fp32");   // 8bit: saved dequantized (above)
    if (opt->scaler.dynamic)   // the dynamic loss scale goes on where it was (as Megatron's grad scaler state)
        fprintf(f, "loss_scaler %.9g %d %d\n", opt->scaler.scale, opt->scaler.growth_tracker, opt->scaler.hysteresis_tracker);
    char value[64];
    for (int k = 0; k < NUM_MODEL_FIELDS; k++)
        if (MODEL_FIELDS[k].checkpoint != NOT_STORED)
            fprintf(f, "config %s %s\n", MODEL_FIELDS[k].name, format_field(&MODEL_FIELDS[k], &m->cfg, value, sizeof(value)));
    for (int k = 0; k < 3; k++) fprintf(f, "section %s %zu %zu\n", SECTION_NAMES[k], k * L->section_bytes, L->section_bytes);
    for (int i = 0; i < L->whole.num_tensors; i++) {
        const TensorDesc* d = &L->whole.tensors[i];
        fprintf(f, "tensor %s %d %d %zu %08x %08x %08x\n", d->name, d->valid_rows, d->cols, L->offset[i],
                crc[3 * i], crc[3 * i + 1], crc[3 * i + 2]);
    }
    fflush(f);
    fprintf(f, "crc32 %08x\n", crc32_update(0, text, len));
    fclose(f);
    return text;
}

// A new temporary file for writing, created exclusively and never through a link: a file left
// by a crashed save, or planted there (a link named like the temporary file, pointing at
// something of the user's, in a directory others can write), is removed first, never written
// through. -1 (NULL) with errno set when it cannot be made.
static int create_temporary_fd(const char* tmp) {
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST && unlink(tmp) == 0)   // unlink removes a link itself, not its target
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    return fd;
}
static FILE* create_temporary(const char* tmp) {
    int fd = create_temporary_fd(tmp);
    FILE* f = fd < 0 ? NULL : fdopen(fd, "w");
    if (fd >= 0 && !f) close(fd);
    return f;
}

// text into path through a temporary file: created exclusively, written with write(2) (each
// call one a test can make fail or crash at), synced, renamed over path. 0, or 1 with a line
// in err naming the step; the temporary file is removed on failure.
static int write_file_atomically(const char* path, const char* text, size_t len, char* err, size_t errlen) {
    char tmp[4608];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    int fd = create_temporary_fd(tmp);
    if (fd < 0) return error_line(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, text + done, len - done);
        if (n <= 0) break;
        done += (size_t)n;
    }
    const char* step = "write";
    int ok = done == len, e = errno;
    if (ok) step = "sync", ok = fsync(fd) == 0, e = errno;
    if (close(fd) != 0 && ok) step = "close", ok = 0, e = errno;
    if (ok) step = "rename", ok = rename(tmp, path) == 0, e = errno;
    if (ok) return 0;
    unlink(tmp);
    return error_line(err, errlen, "cannot %s %s: %s", step, tmp, strerror(e));
}

static int write_metadata(const GPT* m, const AdamWState* opt, const Progress* p, const CanonicalLayout* L,
                          const uint32_t* crc, const char* path, char* err, size_t errlen) {
    char* text = metadata_text(m, opt, p, L, crc);
    int rc = write_file_atomically(path, text, strlen(text), err, errlen);
    free(text);
    return rc;
}

// fsync a directory, so that the names created and renamed in it are on disk. 0, or -1 with
// errno set; a filesystem that cannot sync directories (EINVAL) is not a failure.
static int sync_dir(const char* path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return -1;
    int rc = fsync(fd) == 0 || errno == EINVAL ? 0 : -1, e = errno;
    close(fd);
    errno = e;
    return rc;
}

static void iter_dir(char* out, size_t len, const char* dir, int iteration) {
    snprintf(out, len, "%s/iter_%07d", dir, iteration);
}

// the iteration of a name iter_dir writes (iter_0000100, then suffix: "", ".tmp"...), or -1.
// iter_15 or iter_00000011 is no checkpoint of ours: --keep-last once read them as 15 and 11,
// "removed" an iter_0000015 that never existed, and left both.
static int checkpoint_name_iteration(const char* name, const char* suffix) {
    char ours[64];
    int it;
    if (sscanf(name, "iter_%9d", &it) != 1 || it < 0) return -1;
    snprintf(ours, sizeof(ours), "iter_%07d%s", it, suffix);
    return strcmp(name, ours) == 0 ? it : -1;
}


// The directory a flag names (--save, --tensorboard-dir), before any training (rank 0):
// created with its parents if missing (the highest it made into made, "" none), and a writable
// directory. 0, or 1 with a line in err.
static int prepare_dir_made(const char* flag, const char* dir, char* made, size_t made_len, char* err, size_t errlen) {
    struct stat st;
    if (make_dirs(flag, dir, made, made_len, err, errlen)) return 1;
    if (stat(dir, &st) != 0)   // (a loop of links, EEXIST to mkdir, was once "not a directory")
        return error_line(err, errlen, "%s %s: %s", flag, dir, open_error(errno));
    if (!S_ISDIR(st.st_mode)) return error_line(err, errlen, "%s %s: not a directory", flag, dir);
    if (access(dir, W_OK | X_OK) != 0) return error_line(err, errlen, "%s %s: not writable: %s", flag, dir, strerror(errno));
    return 0;
}
static int prepare_dir(const char* flag, const char* dir, char* err, size_t errlen) {
    char made[4200];
    return prepare_dir_made(flag, dir, made, sizeof(made), err, errlen);
}

// What a save does, done once on a probe at start-up: create a file exclusively, write and
// sync it, rename it, remove it (`--save /proc` passed a test of the directory's permissions,
// then ended the run at its first save). `what` the flag's files ("checkpoint"). 0, or 1 with
// a line in err naming the step.
static int probe_dir(const char* flag, const char* dir, const char* what, char* err, size_t errlen) {
    char probe[4300], why[4700];
    snprintf(probe, sizeof(probe), "%s/.gridgpt-probe-%d", dir, (int)getpid());
    int rc = write_file_atomically(probe, "probe\n", 6, why, sizeof(why));
    if (rc == 0 && unlink(probe) != 0) rc = error_line(why, sizeof(why), "cannot remove %s: %s", probe, strerror(errno));
    if (rc) return error_line(err, errlen, "%s %s: %s, so no %s could be saved there", flag, dir, why, what);
    return 0;
}

// The marker holds an iteration number and a newline, nothing else: digits only, at most
// INT_MAX ("4x" was once read as 4, and "4294967302" wrapped to 6). 0, or 1 if it is not that.
static int parse_marker(const char* text, size_t len, int* iteration) {
    size_t digits = 0;
    long long value = 0;
    while (digits < len && text[digits] >= '0' && text[digits] <= '9' && value <= INT_MAX)
        value = 10 * value + (text[digits++] - '0');
    int rest_is_newline = digits == len || (digits + 1 == len && text[digits] == '\n');
    if (digits == 0 || !rest_is_newline || value > INT_MAX) return 1;
    *iteration = (int)value;
    return 0;
}

// the directory of the latest checkpoint in dir, or "" when there is none (a fresh start);
// 1 with the error line in err when the marker is not an iteration number
static int latest_checkpoint(const char* dir, char* out, size_t len, char* err, size_t errlen) {
    char path[4200], text[32];
    snprintf(path, sizeof(path), "%s/latest_checkpointed_iteration.txt", dir);
    out[0] = '\0';
    char why[4400];
    int fd = open_regular_file(path, why, sizeof(why));   // (a FIFO must not block the open)
    if (fd < 0 && errno == ENOENT) return 0;
    if (fd < 0) return error_line(err, errlen, "%s (the marker is a file holding an iteration number)", why);
    ssize_t got = read(fd, text, sizeof(text));
    close(fd);
    size_t n = got > 0 ? (size_t)got : 0;
    int it;
    if (n == sizeof(text) || parse_marker(text, n, &it)) {
        for (size_t i = 0; i < n && i < 12; i++) text[i] = text[i] >= ' ' && text[i] <= '~' ? text[i] : '?';
        return error_line(err, errlen, "%s: expected an iteration number (digits and a newline, at most %d), got '%.*s%s'",
                          path, INT_MAX, (int)(n < 12 ? n : 12), text, n > 12 ? "..." : "");
    }
    iter_dir(out, len, dir, it);
    return 0;
}

// ----------------------------------------------------------------------------
// one job per --save directory

// A --save directory belongs to one job at a time (a resubmitted job while the first still
// runs, or a mistyped array index, once wrote the same iter_N and marker): rank 0 holds an
// exclusive flock(2) on DIR/gridgpt.lock for the run's life. The kernel decides who gets it,
// atomically (two jobs that both found a dead job's lock file once both took it over:
// reading, judging and replacing a file are three steps), and lets it go when the process
// ends, however it ends. The file names the holder's host, pid and start time (in clock ticks
// since boot, which tells a reused pid apart) for the refusal's line; the holder removes it
// at the end, while still holding the flock, so a job that was waiting on the removed file
// sees that the name now points elsewhere, or nowhere, and starts over.
// A file that names someone although nobody holds its flock was left by a killed job (or by a
// file system that does not pass flocks between hosts): on this host, a holder that is gone is
// taken over in one line; one named on another host can only be judged by the person who knows
// that host, so the run refuses and says which.
#define SAVE_LOCK "gridgpt.lock"
#define SAVE_LOCK_BUSY 75            // the exit status of a run whose --save is busy (EX_TEMPFAIL: try later)
#define SAVE_LOCK_WAIT_SECONDS 5.0   // a holder on this host may be a job's last rank, exiting (a rank
                                     // stuck in a collective held it 1.6 s after mpirun returned)

// the start of process pid in clock ticks since boot (/proc/PID/stat's 22nd field), 0 if unknown
static unsigned long long process_start_ticks(int pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE* f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char* p = strrchr(buf, ')');   // the name (field 2) may hold spaces and parentheses
    for (int field = 3; p && field <= 22; field++)
        if ((p = strchr(p, ' ')) != NULL) p++;   // p: the start of field `field`
    return p ? strtoull(p, NULL, 10) : 0;
}

typedef struct {
    char host[256], since[64];
    int pid;
    unsigned long long start_ticks;
} LockHolder;

// the holder the lock file names: 0 named, 1 empty (its holder is about to write), -1 not a gridgpt lock
static int read_lock(int fd, LockHolder* h) {
    char text[512];
    ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
    memset(h, 0, sizeof(*h));
    if (n <= 0) return n == 0 ? 1 : -1;
    text[n] = '\0';
    int fields = sscanf(text, "host %255s pid %d start %llu since %63[^\n]", h->host, &h->pid, &h->start_ticks, h->since);
    return fields == 4 ? 0 : -1;
}

static int holder_is_running(const LockHolder* h) {
    if (kill(h->pid, 0) != 0 && errno != EPERM) return 0;
    return process_start_ticks(h->pid) == h->start_ticks;
}

static int save_lock_fd = -1;       // the lock this process holds, -1 if none ...
static char save_lock_path[4300];   // ... and its file

// remove the file, then close it, which lets the flock go (both async-signal-safe: stop_signals.h's
// start-up signal handler calls this)
static void release_save_lock(void) {
    if (save_lock_fd < 0) return;
    unlink(save_lock_path);
    close(save_lock_fd);
    save_lock_fd = -1;
}

// flock within `seconds` (polled): 1 taken, 0 held by another process, -1 not supported here
static int flock_within(int fd, double seconds) {
    double deadline = now_seconds() + seconds;
    for (;;) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) return 1;
        if (errno != EWOULDBLOCK && errno != EINTR) return -1;   // ENOLCK, EOPNOTSUPP...: a file system without flocks
        if (now_seconds() >= deadline) return 0;
        usleep(100000);
    }
}

// is fd still the file at path? (not once its holder has removed it at the end)
static int still_named(int fd, const char* path) {
    struct stat by_fd, by_name;
    return fstat(fd, &by_fd) == 0 && stat(path, &by_name) == 0 && by_fd.st_dev == by_name.st_dev &&
           by_fd.st_ino == by_name.st_ino;
}

// Open path and take its flock (waiting a little for a holder on this host, which may be a job
// exiting): the descriptor, with *flocked 1, or -1 for none on this file system; -2 when
// another job holds it (its line in err); -3 when path cannot be opened or is not a file.
static int open_and_flock(const char* dir, const char* path, const char* host, int* flocked, char* err, size_t errlen) {
    for (int attempt = 0; attempt < 100; attempt++) {   // (each further attempt: a holder removed the file meanwhile)
        int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            if (fd < 0) error_line(err, errlen, "--save %s: cannot open %s: %s", dir, path, strerror(errno));
            else error_line(err, errlen, "--save %s: %s is not a regular file; remove it if no job saves there", dir, path);
            if (fd >= 0) close(fd);
            return -3;
        }
        LockHolder h;
        *flocked = flock_within(fd, 0.0);
        if (*flocked == 0 && read_lock(fd, &h) == 0 && strcmp(h.host, host) == 0) {
            printf("waiting up to %.0f s for pid %d on this host, which holds %s, to exit\n", SAVE_LOCK_WAIT_SECONDS,
                   h.pid, path);
            fflush(stdout);
            *flocked = flock_within(fd, SAVE_LOCK_WAIT_SECONDS);
        }
        if (*flocked == 0) {
            int named = read_lock(fd, &h);
            char who[512] = "its holder is writing its name";
            if (named == 0) snprintf(who, sizeof(who), "host %s, pid %d, since %s", h.host, h.pid, h.since);
            close(fd);
            error_line(err, errlen, "--save %s is in use by another job: %s (%s is released when it ends): wait for it, "
                       "or save elsewhere", dir, who, path);
            return -2;
        }
        if (*flocked < 0 || still_named(fd, path)) return fd;
        close(fd);
    }
    error_line(err, errlen, "--save %s: %s kept being replaced while this job took it", dir, path);
    return -2;
}

// Rank 0 at start-up: 0 with the lock held (released at exit, or by the kernel when the
// process dies); SAVE_LOCK_BUSY when another job holds it; 1 for bad input (the file is not a
// lock). Each refusal has its line in err.
static int take_save_lock(const char* dir, char* err, size_t errlen) {
    char path[4300], host[256] = "", since[64], text[512];
    snprintf(path, sizeof(path), "%s/" SAVE_LOCK, dir);
    gethostname(host, sizeof(host) - 1);
    int flocked, fd = open_and_flock(dir, path, host, &flocked, err, errlen);
    if (fd < 0) return fd == -2 ? SAVE_LOCK_BUSY : 1;
    if (flocked < 0)
        printf("note: %s's file system has no flock(2) (%s): the lock is its file's text alone, so two jobs that start "
               "at the same moment are not told apart\n", dir, strerror(errno));
    LockHolder h;
    int named = read_lock(fd, &h);
    if (named < 0) {
        close(fd);
        return error_line(err, errlen, "--save %s: %s is not a gridgpt lock; remove it if no job saves there", dir, path);
    }
    // a holder on this host that still runs although its flock is free is exiting (its files
    // are closed before its pid is gone): wait for it a little
    for (double t0 = now_seconds(); named == 0 && flocked > 0 && strcmp(h.host, host) == 0 && holder_is_running(&h) &&
                                    now_seconds() - t0 < SAVE_LOCK_WAIT_SECONDS;)
        usleep(100000);
    if (named == 0 && (strcmp(h.host, host) != 0 || holder_is_running(&h))) {
        close(fd);
        error_line(err, errlen, "--save %s is in use by another job: host %s, pid %d, since %s (%s; remove it if that "
                   "job is gone)", dir, h.host, h.pid, h.since, path);
        return SAVE_LOCK_BUSY;
    }
    if (named == 0) printf("took over %s from pid %d (since %s), which is no longer running\n", path, h.pid, h.since);
    time_t now = time(NULL);
    strftime(since, sizeof(since), "%Y-%m-%d %H:%M:%S %Z", localtime(&now));
    int len = snprintf(text, sizeof(text), "host %s pid %d start %llu since %s\n", host, (int)getpid(),
                       process_start_ticks(getpid()), since);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, len, 0) != len) {
        int e = errno;
        close(fd);
        return error_line(err, errlen, "--save %s: cannot write %s: %s", dir, path, strerror(e));
    }
    save_lock_fd = fd;
    snprintf(save_lock_path, sizeof(save_lock_path), "%s", path);
    atexit(release_save_lock);              // any exit ...
    before_mpi_finalize = release_save_lock;   // ... and before MPI ends, which every rank reaches
    return 0;
}

// same directory: the same file-system object, however spelled
static int same_directory(const char* x, const char* y) {
    struct stat a, b;
    return stat(x, &a) == 0 && stat(y, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// A --save directory whose marker names a checkpoint holds a run's series of checkpoints, and
// only the run that continues it (--load of that directory, not --finetune) may save there:
// any other would train from elsewhere, replace its iter_N and rotate the rest away with
// --keep-last. (Megatron-LM users resume with --load and --save the same.) 0, or 1 with a line.
static int check_save_series(const char* dir, const char* load, int finetune, char* err, size_t errlen) {
    char latest[4300];
    if (latest_checkpoint(dir, latest, sizeof(latest), err, errlen)) return 1;
    int continues = load && same_directory(load, dir);
    if (!latest[0] || (continues && !finetune)) return 0;
    if (continues)
        return error_line(err, errlen, "--finetune --load %s --save %s would replace the checkpoints it starts from "
                          "(the latest: %s): save the fine-tuned run to another directory", load, dir, latest);
    return error_line(err, errlen, "--save %s holds a run's checkpoints (the latest: %s), which this run, %s%s, would "
                      "replace: resume that run with --load %s, or save to another directory", dir, latest,
                      load ? "starting from --load " : "starting from scratch", load ? load : "", dir);
}

// A --save directory, before any training (rank 0): prepared (prepare_dir), probed
// (probe_dir), locked, checked to be this run's (check_save_series); then the iter_*.tmp/ (and
// .replaced/) left by an interrupted save, each a checkpoint's worth of disk, are removed, said
// in one line. Nothing in it is touched before the lock is held: a second job once removed the
// first one's save in progress, then was refused. 0, SAVE_LOCK_BUSY, or 1 (bad input), with a
// line in err.
static char save_dir_made[4200];   // the highest directory prepare_save_dir made ("": none) ...
static char save_dir_path[4200];   // ... for the --save directory

// at exit, after the lock is let go: the directories prepare_save_dir made, if the run left them
// empty (one refused over a flag checked after the lock, --skip-train's --save, once left an
// empty --save behind; a directory that holds anything stays)
static void remove_unused_save_dir(void) { remove_made_dirs(save_dir_path, save_dir_made); }

static int prepare_save_dir(const char* dir, const char* load, int finetune, char* err, size_t errlen) {
    char tmp[4400];
    int rc = prepare_dir_made("--save", dir, save_dir_made, sizeof(save_dir_made), err, errlen) ||
             probe_dir("--save", dir, "checkpoint", err, errlen);
    snprintf(save_dir_path, sizeof(save_dir_path), "%s", dir);
    if (save_dir_made[0]) atexit(remove_unused_save_dir);   // (before the lock's: it runs after it)
    if (!rc) rc = take_save_lock(dir, err, errlen);
    if (!rc) rc = check_save_series(dir, load, finetune, err, errlen);
    if (rc) return rc;
    DIR* d = opendir(dir);
    int removed = 0;
    for (struct dirent* e; d && (e = readdir(d)) != NULL;) {
        // iter_N.tmp (an interrupted save) or iter_N.replaced (an interrupted replacement)
        if (checkpoint_name_iteration(e->d_name, ".tmp") < 0 && checkpoint_name_iteration(e->d_name, ".replaced") < 0) continue;
        if (snprintf(tmp, sizeof(tmp), "%s/%s", dir, e->d_name) < (int)sizeof(tmp)) removed += remove_tree(tmp) == 0;
    }
    if (d) closedir(d);
    if (removed) printf("removed %d iter_*.tmp director%s left in %s by an interrupted save\n", removed,
                        removed > 1 ? "ies" : "y", dir);
    return 0;
}

// --keep-last N (rank 0, after a save and its marker): keep the checkpoint just saved, which the
// marker names, and the N-1 others written most recently; remove the rest, one line each.
// Ranked by when they were written, not by number: after a rollback (the marker set back by
// hand, then a resumed run) the highest numbers are the abandoned run's, and ranking by number
// removed the save just made and left the marker naming nothing.
typedef struct {
    int iteration;
    double written;   // metadata.txt's modification time (the last file of a save), in seconds
} SavedCheckpoint;

static double written_time(const char* iter_path) {
    char path[4400];
    struct stat st;
    snprintf(path, sizeof(path), "%s/metadata.txt", iter_path);
    if (stat(path, &st) != 0 && stat(iter_path, &st) != 0) return 0.0;
    return st.st_mtim.tv_sec + 1e-9 * st.st_mtim.tv_nsec;
}

// newest first; the same time (a coarse clock) by the higher number
static int newest_first(const void* a, const void* b) {
    const SavedCheckpoint *x = (const SavedCheckpoint*)a, *y = (const SavedCheckpoint*)b;
    if (x->written != y->written) return x->written < y->written ? 1 : -1;
    return (x->iteration < y->iteration) - (x->iteration > y->iteration);
}

static void rotate_checkpoints(const char* dir, int keep, int just_saved) {
    SavedCheckpoint* others = NULL;
    int n = 0, cap = 0;
    char path[4200];
    DIR* d = opendir(dir);
    if (!d) return;
    static int noted;   // (once a run)
    for (struct dirent* e; (e = readdir(d)) != NULL;) {
        int it = checkpoint_name_iteration(e->d_name, ""), other;
        char rest;
        if (it < 0 && !noted && sscanf(e->d_name, "iter_%d%c", &other, &rest) == 1)
            noted = printf("note: --keep-last leaves %s/%s alone: not a checkpoint name gridgpt writes (iter_%07d)\n", dir,
                           e->d_name, other);
        if (it < 0 || it == just_saved) continue;
        if (n == cap) others = (SavedCheckpoint*)reallocCheck(others, (cap = cap ? 2 * cap : 64) * sizeof(SavedCheckpoint));
        iter_dir(path, sizeof(path), dir, it);
        others[n++] = (SavedCheckpoint){it, written_time(path)};
    }
    closedir(d);
    qsort(others, n, sizeof(SavedCheckpoint), newest_first);
    for (int i = keep - 1; i < n; i++) {
        iter_dir(path, sizeof(path), dir, others[i].iteration);
        if (remove_tree(path) != 0) fprintf(stderr, "warning: could not remove %s: %s\n", path, strerror(errno));
        else printf("removed %s (--keep-last %d keeps the one just saved and the %d written last before it)\n", path,
                    keep, keep - 1);
    }
    free(others);
}

// Put the finished tmp_dir in final_dir's place. An iter_N/ already there (a run repeated into
// the same --save directory, or a crash between this rename and the marker's update) is
// replaced, said in one line: swapped atomically (Linux's renameat2 RENAME_EXCHANGE) where the
// filesystem can, else moved aside first; then the old one is removed.
static int install_dir(const char* tmp_dir, const char* final_dir, char* err, size_t errlen) {
    struct stat st;
    if (lstat(final_dir, &st) != 0) {
        if (rename(tmp_dir, final_dir) != 0)
            return error_line(err, errlen, "cannot rename %s to %s: %s", tmp_dir, final_dir, strerror(errno));
        return 0;
    }
    char aside[4400];
    snprintf(aside, sizeof(aside), "%s.replaced", final_dir);
    remove_tree(aside);
#ifdef SYS_renameat2
    if (syscall(SYS_renameat2, AT_FDCWD, tmp_dir, AT_FDCWD, final_dir, 2 /* RENAME_EXCHANGE */) == 0)
        rename(tmp_dir, aside);   // tmp_dir now holds the old checkpoint
    else
#endif
    if (rename(final_dir, aside) != 0 || rename(tmp_dir, final_dir) != 0)
        return error_line(err, errlen, "cannot replace %s with %s: %s", final_dir, tmp_dir, strerror(errno));
    printf("replaced %s, which an earlier or interrupted run left there\n", final_dir);
    remove_tree(aside);
    return 0;
}

// every piece read back and checked against the CRC of what was meant to be written: a write
// the disk refused (full, failing), even one MPI reported as done, can never pass as saved
static void verify_pieces(MPI_File f, SaveLog* log, const char* path, float* bounce) {
    for (size_t i = 0; i < log->count && !log->error[0]; i++) {
        const Piece* p = &log->pieces[i];
        if (shared_file_io(f, p->offset, bounce, p->bytes, 0) != 0 || crc32_update(0, bounce, p->bytes) != p->crc)
            snprintf(log->error, sizeof(log->error), "%s: bytes %llu to %llu read back differently from what was written "
                     "(a full disk or a failing device?)", path, (unsigned long long)p->offset,
                     (unsigned long long)(p->offset + p->bytes));
    }
}

static int by_offset(const void* a, const void* b) {
    uint64_t x = ((const Piece*)a)->offset, y = ((const Piece*)b)->offset;
    return x < y ? -1 : x > y;
}

// rank 0: each tensor's CRC-32 in each section from every rank's pieces, in file order
// (zlib's crc32_combine gives the CRC of two blocks one after another from theirs); the
// pieces must tile the file exactly
static void combine_checksums(const CanonicalLayout* L, Piece* all, size_t n, uint32_t* crc) {
    qsort(all, n, sizeof(Piece), by_offset);
    size_t next = 0;
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < L->whole.num_tensors; i++) {
            uint64_t at = k * L->section_bytes + L->offset[i], end = at + canonical_bytes(&L->whole.tensors[i]);
            uint32_t c = 0;   // the CRC of nothing
            for (; next < n && all[next].offset < end; at += all[next++].bytes) {
                if (all[next].offset != at) fail("checkpoint: the ranks' pieces do not tile tensors.bin at byte %llu", (unsigned long long)at);
                c = (uint32_t)crc32_combine(c, all[next].crc, (z_off_t)all[next].bytes);
            }
            if (at != end) fail("checkpoint: tensor %s is not wholly written", L->whole.tensors[i].name);
            crc[3 * i + k] = c;
        }
}

// tensors.bin in tmp_dir, written by every rank and read back; on rank 0 the tensors' CRCs
// into crc. 0, or 1 on every rank when a write failed on any (that rank says so in one line)
static int save_tensors(const char* tmp_dir, const GPT* m, const AdamWState* opt, const CanonicalLayout* L,
                        uint32_t* crc) {
    char path[4400];
    snprintf(path, sizeof(path), "%s/tensors.bin", tmp_dir);
    SaveLog log;
    memset(&log, 0, sizeof(log));
    MPI_File f;
    // (a rank that did open it keeps the handle: closing is collective, and the others have none)
    if (max_over_world(shared_file_open(path, 1, &f) != 0)) {
        if (grid.world_rank == 0) report_error("checkpoint not saved: cannot create %s", path);
        return 1;
    }
    if (!shared_file_set_size(f, 3 * L->section_bytes))
        snprintf(log.error, sizeof(log.error), "cannot size %s to %zu bytes: %s", path, 3 * L->section_bytes, shared_file_why);
    else shard_io(m, opt, L, f, path, &log, 3);
    if (!shared_file_sync(f) && !log.error[0]) snprintf(log.error, sizeof(log.error), "syncing %s failed: %s", path, shared_file_why);
    barrier(&grid.world);
    float* bounce = (float*)mallocCheck(RUN_MAX * sizeof(float));
    verify_pieces(f, &log, path, bounce);
    shared_file_close(&f);
    int failed = max_over_world(log.error[0] != 0);
    if (log.error[0]) report_error("checkpoint not saved: %s", log.error);
    size_t bytes;
    Piece* all = (Piece*)gather_bytes_to_rank0(&grid.world, log.pieces, (int)(log.count * sizeof(Piece)), &bytes);
    if (grid.world_rank == 0 && !failed) combine_checksums(L, all, bytes / sizeof(Piece), crc);
    free(all);
    free(bounce);
    free(log.pieces);
    return failed;
}

// rank 0, after tensors.bin: metadata.txt, the rename into place, the marker, the rotation.
// 0, or 1 with the line in err (checkpoint_save's and hf_import.h's callers print it).
static int finish_save(const char* dir, const char* tmp_dir, const char* final_dir, const GPT* m,
                       const AdamWState* opt, const Progress* p, const CanonicalLayout* L, const uint32_t* crc,
                       int keep_last, char* err, size_t errlen) {
    char path[4400], text[32], why[4700];
    snprintf(path, sizeof(path), "%s/metadata.txt", tmp_dir);
    if (write_metadata(m, opt, p, L, crc, path, why, sizeof(why)))
        return error_line(err, errlen, "checkpoint not saved: %s", why);
    if (sync_dir(tmp_dir) != 0)
        return error_line(err, errlen, "checkpoint not saved: cannot sync %s: %s", tmp_dir, strerror(errno));
    if (install_dir(tmp_dir, final_dir, why, sizeof(why)) != 0 || (sync_dir(dir) != 0 &&
        error_line(why, sizeof(why), "cannot sync %s: %s", dir, strerror(errno))))
        return error_line(err, errlen, "checkpoint not saved: %s", why);
    snprintf(text, sizeof(text), "%d\n", p->iteration);
    snprintf(path, sizeof(path), "%s/latest_checkpointed_iteration.txt", dir);
    if (write_file_atomically(path, text, strlen(text), why, sizeof(why)))   // the new iter_N stays, beyond the marker
        return error_line(err, errlen, "checkpoint %s written but not marked as the latest: %s", final_dir, why);
    if (sync_dir(dir) != 0)
        return error_line(err, errlen, "checkpoint %s marked as the latest, but syncing %s failed: %s", final_dir, dir,
                          strerror(errno));
    if (keep_last > 0) rotate_checkpoints(dir, keep_last, p->iteration);
    return 0;
}

static int save_on_every_rank(const char* dir, const GPT* m, const AdamWState* opt, const Progress* p, int keep_last) {
    double t0 = now_seconds();
    char final_dir[4200], tmp_dir[4300];
    iter_dir(final_dir, sizeof(final_dir), dir, p->iteration);
    snprintf(tmp_dir, sizeof(tmp_dir), "%s.tmp", final_dir);
    int failed = 0;
    if (grid.world_rank == 0) {
        mkdir(dir, 0755);   // removed since start-up? made again; if not possible, the next line says why
        if (remove_tree(tmp_dir) != 0 || mkdir(tmp_dir, 0755) != 0) {   // a crashed earlier attempt
            report_error("checkpoint of iteration %d not saved: cannot create %s: %s", p->iteration, tmp_dir, strerror(errno));
            failed = 1;
        }
    }
    broadcast_host(&grid.world, &failed, sizeof(failed), 0);   // also: no rank opens the file before it exists
    if (failed) return 1;
    CanonicalLayout L = canonical_layout(&m->cfg);
    uint32_t* crc = (uint32_t*)mallocCheck(3 * L.whole.num_tensors * sizeof(uint32_t));
    failed = save_tensors(tmp_dir, m, opt, &L, crc);
    if (grid.world_rank == 0) {
        char err[9600];
        if (!failed && (failed = finish_save(dir, tmp_dir, final_dir, m, opt, p, &L, crc, keep_last, err, sizeof(err))))
            report_error("%s", err);
        double s = now_seconds() - t0, gb = 3.0 * L.section_bytes / 1e9;
        if (!failed) printf("saved checkpoint %s: %.3f GB in %.2f s (%.2f GB/s)\n", final_dir, gb, s, gb / s);
        else if (remove_tree(tmp_dir) == 0)
            printf("checkpoint of iteration %d not saved; %s/latest_checkpointed_iteration.txt names the latest good one\n",
                   p->iteration, dir);
        fflush(stdout);
    }
    broadcast_host(&grid.world, &failed, sizeof(failed), 0);
    free(crc);
    free_layout(&L);
    return failed;
}

// Save the model and optimizer state as DIR/iter_N (N = p->iteration), every rank together;
// with keep_last > 0, only the newest keep_last checkpoints are kept. Returns 0, or 1 on every
// rank when it could not be saved: then iter_N.tmp/ is removed and the previous checkpoint
// stays the latest, and the caller decides whether the run goes on.
static int checkpoint_save(const char* dir, const GPT* m, const AdamWState* opt, const Progress* p, int keep_last) {
    // what its load would refuse is never saved (the same counters on every rank: no exchange)
    const char* problem = counters_problem(p, opt->step, opt->scaler.dynamic ? &opt->scaler : NULL);
    if (problem) {
        if (grid.world_rank == 0)
            report_error("checkpoint of iteration %d not saved: %s (consumed_samples %lld, consumed_valid_samples %lld)",
                         p->iteration, problem, p->consumed_samples, p->consumed_valid_samples);
        return 1;
    }
    activity_io(1);
    int failed = save_on_every_rank(dir, m, opt, p, keep_last);
    activity_io(0);
    return failed;
}

// ----------------------------------------------------------------------------
// reading metadata.txt (the loader and hf.h's export share it)

typedef struct {
    char name[128];
    int rows, cols;
    size_t offset;        // in each section
    uint32_t crc[3];      // CRC-32 of the tensor's bytes in each section
} CkptTensor;

typedef struct {
    char bin_path[4300];
    Progress progress;
    int optimizer_step;
    int has_loss_scaler;   // a dynamic loss scaler's state: scale, growth and hysteresis trackers
    LossScaler loss_scaler;
    int states_8bit;       // `optimizer_states 8bit`: the moments were 8-bit, saved dequantized (none: fp32)
    int text_checked;      // metadata.txt ended with the CRC-32 of its text, and it matched
    GPTConfig cfg;
    size_t section_offset[3], section_bytes[3];
    int num_tensors;
    CkptTensor* tensors;
} CheckpointMeta;

static void checkpoint_meta_free(CheckpointMeta* m) {
    free(m->tensors);
    m->tensors = NULL;
}

// "config NAME VALUE": a model field (seen[k] set), read as its flag would be
static int meta_config_line(CheckpointMeta* m, const char* line, int* seen) {
    char key[128], value[64], err[256];
    if (sscanf(line, "%*s %127s %63s", key, value) != 2) return 1;
    for (int k = 0; k < NUM_MODEL_FIELDS; k++)
        if (strcmp(key, MODEL_FIELDS[k].name) == 0) {
            seen[k] = 1;
            return parse_field(&MODEL_FIELDS[k], &m->cfg, value, err, sizeof(err));
        }
    return 0;   // a field this version does not know: written by a newer one, ignored
}

static int meta_tensor_line(CheckpointMeta* m, const char* line, int* cap) {
    if (m->num_tensors == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        m->tensors = (CkptTensor*)reallocCheck(m->tensors, *cap * sizeof(CkptTensor));
    }
    CkptTensor* t = &m->tensors[m->num_tensors];
    if (sscanf(line, "%*s %127s %d %d %zu %x %x %x", t->name, &t->rows, &t->cols, &t->offset, &t->crc[0], &t->crc[1],
               &t->crc[2]) != 7)
        return 1;
    m->num_tensors++;
    return 0;
}

// the next whole number of a metadata line, strictly: digits, no overflow, at most max in
// magnitude (sscanf's %d read 99999999999999999999 as -1). 0, or 1 with why set when it is a
// number that does not fit (not a number: why untouched).
static int meta_number(const char** s, const char* name, long long max, long long* v, char* why, size_t len) {
    char* end;
    while (**s == ' ') (*s)++;
    errno = 0;
    long long x = strtoll(*s, &end, 10);
    if (end == *s || (*end && *end != ' ' && *end != '\n')) return 1;
    if (errno == ERANGE || x > max || x < -max)
        return error_line(why, len, "%s %.*s does not fit: at most %lld", name, (int)(end - *s > 40 ? 40 : end - *s), *s, max);
    *s = end;
    *v = x;
    return 0;
}

// the numbers of a line "WORD N [N ...]" after its word (with a `since` where the format has it)
static int meta_numbers(const char* line, const char* name, const long long* max, long long* v, int count,
                        int since_at, char* why, size_t len) {
    const char* s = line + strcspn(line, " ");
    for (int i = 0; i < count; i++) {
        if (i == since_at) {
            while (*s == ' ') s++;
            if (strncmp(s, "since ", 6) != 0) return 1;
            s += 5;
        }
        if (meta_number(&s, name, max[i], &v[i], why, len)) return 1;
    }
    return s[strspn(s, " \n")] != '\0';
}

// a counter's line "WORD N" into its field, an int's or a long long's; -1 if word is none of them
static int meta_counter_line(CheckpointMeta* m, const char* word, const char* line, char* why, size_t len) {
    Progress* p = &m->progress;
    const struct { const char* word; int* as_int; long long* as_long; } counters[] = {
        {"iteration", &p->iteration, NULL}, {"optimizer_step", &m->optimizer_step, NULL},
        {"consumed_samples", NULL, &p->consumed_samples}, {"scheduler_samples", NULL, &p->scheduler_samples},
        {"consumed_valid_samples", NULL, &p->consumed_valid_samples}};
    for (size_t i = 0; i < sizeof(counters) / sizeof(counters[0]); i++) {
        if (strcmp(word, counters[i].word)) continue;
        long long v = 0, max = counters[i].as_int ? INT_MAX : LLONG_MAX;
        if (meta_numbers(line, word, &max, &v, 1, -1, why, len)) return 1;
        if (counters[i].as_int) *counters[i].as_int = (int)v;
        else *counters[i].as_long = v;
        return 0;
    }
    return -1;
}

// "batch_schedule GLOBAL START INCREMENT SAMPLES since ITERATION CONSUMED"
static int meta_batch_line(BatchRecord* b, const char* line, char* why, size_t len) {
    const long long max[6] = {INT_MAX, INT_MAX, INT_MAX, LLONG_MAX, INT_MAX, LLONG_MAX};
    long long v[6];
    if (meta_numbers(line, "batch_schedule", max, v, 6, 4, why, len)) return 1;
    *b = (BatchRecord){(int)v[0], (int)v[1], (int)v[2], v[3], (int)v[4], v[5]};
    return b->global_batch_size <= 0;
}

// one line of metadata.txt into m; 1 if it is not understood (why: a number that does not fit)
static int meta_line(CheckpointMeta* m, const char* line, int* seen, int* sections_seen, int* version, int* cap,
                     char* why, size_t len) {
    char word[64], key[128];
    if (sscanf(line, "%63s", word) != 1) return 0;
    if (!strcmp(word, "gridgpt-checkpoint")) return sscanf(line, "%*s %d", version) != 1;
    int counter = meta_counter_line(m, word, line, why, len);
    if (counter >= 0) return counter;
    if (!strcmp(word, "loss_scaler")) {
        LossScaler* s = &m->loss_scaler;
        m->has_loss_scaler = 1;
        return sscanf(line, "%*s %f %d %d", &s->scale, &s->growth_tracker, &s->hysteresis_tracker) != 3 ||
               !(s->scale > 0.0f);
    }
    if (!strcmp(word, "optimizer_states")) {
        if (sscanf(line, "%*s %127s", key) != 1) return 1;
        m->states_8bit = !strcmp(key, "8bit");
        return !m->states_8bit && strcmp(key, "fp32") != 0;
    }
    if (!strcmp(word, "batch_schedule")) return meta_batch_line(&m->progress.batch, line, why, len);
    if (!strcmp(word, "lr_schedule")) {
        LRRecord* r = &m->progress.lr;
        r->recorded = sscanf(line, "%*s max_lr %f min_lr %f decay_style %23s warmup_samples %lld decay_samples %lld "
                             "weight_decay %f", &r->max_lr, &r->min_lr, r->decay_style, &r->warmup_samples,
                             &r->decay_samples, &r->weight_decay) == 6;
        return !r->recorded || r->warmup_samples < 0 || r->decay_samples <= 0;
    }
    if (!strcmp(word, "config")) return meta_config_line(m, line, seen);
    if (!strcmp(word, "tensor")) return meta_tensor_line(m, line, cap);
    if (!strcmp(word, "section")) {
        size_t off, bytes;
        if (sscanf(line, "%*s %127s %zu %zu", key, &off, &bytes) != 3) return 1;
        for (int k = 0; k < 3; k++)
            if (!strcmp(key, SECTION_NAMES[k])) {
                m->section_offset[k] = off;
                m->section_bytes[k] = bytes;
                sections_seen[k] = 1;
            }
        return 0;
    }
    return 1;
}

// the counters of path's metadata (counters_problem): 0, or 1 with a line in err naming them
static int counters_error(const char* path, const Progress* p, int optimizer_step, const LossScaler* scaler, char* err,
                          size_t errlen) {
    const char* what = counters_problem(p, optimizer_step, scaler);
    if (!what) return 0;
    return error_line(err, errlen, "checkpoint %s: %s (iteration %d, optimizer_step %d, consumed_samples %lld, "
                      "scheduler_samples %lld, consumed_valid_samples %lld)", path, what, p->iteration, optimizer_step,
                      p->consumed_samples, p->scheduler_samples, p->consumed_valid_samples);
}

// the lines of path into m (the last one, the CRC-32 of the others, checked); 0, or 1 with a line in err
static int meta_parse(const char* path, CheckpointMeta* m, char* err, size_t errlen) {
    char line[1024], why[256] = "";
    FILE* f = fopen_regular_file(path, why, sizeof(why));   // (a FIFO once blocked here until killed)
    if (!f) return error_line(err, errlen, "checkpoint %s", why);
    int version = 0, lineno = 0, cap = 0, seen[NUM_MODEL_FIELDS] = {0}, sections_seen[3] = {0};
    uint32_t crc = 0, stored;
    while (fgets(line, sizeof(line), f)) {
        lineno++;
        if (m->text_checked) {
            fclose(f);
            return error_line(err, errlen, "checkpoint %s: line %d follows the checksum line", path, lineno);
        }
        if (strncmp(line, "crc32 ", 6) == 0 && sscanf(line + 6, "%8x", &stored) == 1) {
            if (stored != crc) {
                fclose(f);
                return error_line(err, errlen, "checkpoint %s: its text fails its checksum (crc32 %08x, computed %08x): "
                                  "edited or damaged", path, stored, crc);
            }
            m->text_checked = 1;
            continue;
        }
        crc = crc32_update(crc, line, strlen(line));
        if (meta_line(m, line, seen, sections_seen, &version, &cap, why, sizeof(why))) {
            fclose(f);
            line[strcspn(line, "\n")] = '\0';
            if (why[0]) return error_line(err, errlen, "checkpoint %s: line %d: %s", path, lineno, why);
            return error_line(err, errlen, "checkpoint %s: line %d is not understood: %s", path, lineno, line);
        }
    }
    fclose(f);
    if (version != 1) return error_line(err, errlen, "checkpoint %s: not a gridgpt checkpoint of format 1", path);
    // an absent switch or choice stays at its zero value (off, the first choice), an absent
    // number with a default takes it (Llama's rotary base, its norm's epsilon, ...): a checkpoint
    // written before the option existed had that behaviour. The shape's numbers must be there.
    for (int k = 0; k < NUM_MODEL_FIELDS; k++) {
        const ConfigField* f = &MODEL_FIELDS[k];
        if (seen[k] || f->checkpoint != MATCH || f->kind == FIELD_SWITCH || f->kind == FIELD_CHOICE) continue;
        if (!f->default_value || parse_field(f, &m->cfg, f->default_value, err, errlen))
            return error_line(err, errlen, "checkpoint %s: no `config %s` line", path, f->name);
    }
    for (int k = 0; k < 3; k++)
        if (!sections_seen[k]) return error_line(err, errlen, "checkpoint %s: no `section %s` line", path, SECTION_NAMES[k]);
    return counters_error(path, &m->progress, m->optimizer_step, m->has_loss_scaler ? &m->loss_scaler : NULL, err, errlen);
}

// the number of tensors in the table of config c, from the tables of one and two layers: the
// table of c itself is built only once its size matches the file's (a metadata.txt without its
// checksum line, at num_layers 2147483647, once sized it past the host's memory)
static long long table_size(const GPTConfig* c) {
    GPTConfig one = *c, two = *c;
    one.num_layers = 1;
    two.num_layers = 2;
    GPT a = canonical_table(&one), b = canonical_table(&two);
    long long size = a.num_tensors + (c->num_layers - 1LL) * (b.num_tensors - a.num_tensors);
    gpt_free(&a);
    gpt_free(&b);
    return size;
}

// the tensor lines must be the table of the config: same names, order, whole shapes
static int meta_check_tensors(const char* path, const CheckpointMeta* m, char* err, size_t errlen) {
    long long size = table_size(&m->cfg);
    if (m->num_tensors != size)
        return error_line(err, errlen, "checkpoint %s: %d tensors, the model of its config (%d layers) has %lld", path,
                          m->num_tensors, m->cfg.num_layers, size);
    GPT whole = canonical_table(&m->cfg);
    int status = 0;
    if (m->num_tensors != whole.num_tensors)
        status = error_line(err, errlen, "checkpoint %s: %d tensors, the model of its config has %d", path,
                            m->num_tensors, whole.num_tensors);
    for (int i = 0; i < whole.num_tensors && status == 0; i++) {
        const TensorDesc* d = &whole.tensors[i];
        const CkptTensor* t = &m->tensors[i];
        if (strcmp(t->name, d->name) != 0)
            status = error_line(err, errlen, "checkpoint %s: tensor %d is %s, expected %s", path, i, t->name, d->name);
        else if (t->rows != d->valid_rows || t->cols != d->cols)
            status = error_line(err, errlen, "checkpoint %s: tensor %s is [%d, %d], expected [%d, %d]", path, t->name,
                                t->rows, t->cols, d->valid_rows, d->cols);
        else if (t->offset + (size_t)t->rows * t->cols * sizeof(float) > m->section_bytes[0])
            status = error_line(err, errlen, "checkpoint %s: tensor %s lies outside its section", path, t->name);
    }
    gpt_free(&whole);
    return status;
}

// Read DIR/metadata.txt and check it against the tensor table of the config it declares
// (names, order, shapes) and the size of DIR/tensors.bin. 0, or 1 with a line in err.
static int checkpoint_meta_read(const char* dir, CheckpointMeta* m, char* err, size_t errlen) {
    memset(m, 0, sizeof(*m));
    snprintf(m->bin_path, sizeof(m->bin_path), "%s/tensors.bin", dir);
    char path[4300];
    snprintf(path, sizeof(path), "%s/metadata.txt", dir);
    if (meta_parse(path, m, err, errlen)) return 1;
    GPTConfig* c = &m->cfg;
    if (c->hidden_size % c->num_attention_heads || c->ffn_hidden_size < 1 || c->max_position_embeddings < 1 ||
        c->vocab_size < 1)
        return error_line(err, errlen, "checkpoint %s: the model config is not valid", path);
    if (c->make_vocab_size_divisible_by < 1) c->make_vocab_size_divisible_by = 1;
    long long padded = padded_vocab_size(c->vocab_size, c->make_vocab_size_divisible_by, 1);
    if (padded > INT_MAX) return error_line(err, errlen, "checkpoint %s: its vocabulary padded is %lld, more than %d", path, padded, INT_MAX);
    c->padded_vocab_size = (int)padded;
    if (c->seq_length < 1) c->seq_length = c->max_position_embeddings;
    if (meta_check_tensors(path, m, err, errlen)) return 1;
    // tensors.bin: a regular file this process can open (MPI-IO's open says no why), of the sections' size
    struct stat st;
    size_t end = m->section_offset[2] + m->section_bytes[2];
    char why[4400];
    int fd = open_regular_file(m->bin_path, why, sizeof(why));
    if (fd < 0) return error_line(err, errlen, "checkpoint %s", why);
    int got = fstat(fd, &st);
    close(fd);
    if (got != 0) return error_line(err, errlen, "checkpoint %s: %s", m->bin_path, strerror(errno));
    if ((size_t)st.st_size != end)
        return error_line(err, errlen, "checkpoint %s: %lld bytes, expected %zu (truncated?)", m->bin_path,
                          (long long)st.st_size, end);
    return 0;
}

// The model config must be the checkpoint's in every field the tensor layout depends on
// (MATCH in gpt.h's list): one clear error naming the first that differs.
static void check_field_matches(const char* path, const ConfigField* f, const GPTConfig* saved, const GPTConfig* now) {
    char a[64], b[64], flag[96];
    if (f->checkpoint == MATCH && strcmp(format_field(f, saved, a, sizeof(a)), format_field(f, now, b, sizeof(b))))
        config_error("checkpoint %s has %s %s, this run %s", path, flag_of(f, flag, sizeof(flag)), a, b);
}
static void check_config_matches(const char* path, const GPTConfig* saved, const GPTConfig* now) {
    for (int k = 0; k < NUM_MODEL_FIELDS; k++) check_field_matches(path, &MODEL_FIELDS[k], saved, now);
}

// ----------------------------------------------------------------------------
// loading

// every tensor's CRC-32 in the sections to be loaded, each rank checking its share
static void verify_checksums(const CheckpointMeta* meta, const CanonicalLayout* L, MPI_File f, int sections) {
    uint32_t* crc = (uint32_t*)mallocCheck(3 * L->whole.num_tensors * sizeof(uint32_t));
    section_checksums(L, f, crc);
    for (int i = 0; i < L->whole.num_tensors; i++)
        for (int k = 0; k < sections; k++)
            if (crc[3 * i + k] != meta->tensors[i].crc[k])
                config_error("checkpoint %s: tensor %s (%s) fails its checksum (%08x, expected %08x)", meta->bin_path,
                             meta->tensors[i].name, SECTION_NAMES[k], crc[3 * i + k], meta->tensors[i].crc[k]);
    free(crc);
}

// every local tensor's rows from the weight section into the (floatX) parameters
// (one tensor's slice at a time passes through host memory)
static void load_params(GPT* m, const CanonicalLayout* L, MPI_File f, const char* path) {
    float* bounce = (float*)mallocCheck(RUN_MAX * sizeof(float));
    for (int i = 0; i < m->num_tensors; i++) {
        const TensorDesc* d = &m->tensors[i];
        float* host = (float*)callocCheck(d->numel, sizeof(float));   // padding rows stay zero
        RunIO io = {f, path, 0, host, d->offset, bounce, NULL, 0, 0, 1};   // read into this host array
        for_each_run(d, L->offset[canonical_index(L, d->name)], d->offset, d->offset + d->numel, run_io, &io);
        set_tensor_values(m, i, host);
        free(host);
    }
    free(bounce);
}

// Load a checkpoint whose metadata was read (and its config checked against the model's)
// into every rank's slices: the parameters and, with with_optim, the optimizer shard (master
// weights, moments, step). Every checksum of the sections read is verified first. Returns
// the gigabytes read.
static double checkpoint_load(const CheckpointMeta* meta, GPT* m, AdamWState* opt, int with_optim) {
    activity_io(1);
    int sections = with_optim ? 3 : 1;
    CanonicalLayout L = canonical_layout(&m->cfg);
    MPI_File f;
    if (shared_file_open(meta->bin_path, 0, &f) != 0) config_error("checkpoint %s: cannot open: %s", meta->bin_path, shared_file_why);
    verify_checksums(meta, &L, f, sections);
    load_params(m, &L, f, meta->bin_path);
    shard_io(m, opt, &L, f, meta->bin_path, NULL, sections);
    shared_file_close(&f);
    if (with_optim) opt->step = meta->optimizer_step;
    if (with_optim && meta->states_8bit != opt->states_8bit && grid.world_rank == 0)
        printf("checkpoint: Adam's moments were saved by %s AdamW, loaded %s\n", meta->states_8bit ? "8-bit" : "32-bit",
               opt->states_8bit ? "into 8 bits (each within half a gap of the dynamic map of its block's largest)"
                                : "as they are (the 8-bit moments' values, in fp32)");
    if (with_optim && meta->has_loss_scaler && opt->scaler.dynamic) {   // this run's flags otherwise
        opt->scaler.scale = meta->loss_scaler.scale;
        opt->scaler.growth_tracker = meta->loss_scaler.growth_tracker;
        opt->scaler.hysteresis_tracker = meta->loss_scaler.hysteresis_tracker;
    }
    double gb = sections * L.section_bytes / 1e9;
    free_layout(&L);
    activity_io(0);
    return gb;
}
