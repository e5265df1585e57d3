/*
tests/test_tensorboard.c — the TensorBoard writer (tensorboard.h), and our own reader of its files.

  test_tensorboard --check DIR   CRC-32C against its standard check value, the record framing
                                 and protobuf encoding written and read back (every tag, step
                                 and value exact), a failing write said once and no more
                                 events after it, and the writer's cost per log interval
  test_tensorboard --dump FILE   every record's two masked CRC-32Cs checked and its Event
                                 decoded: one line "TAG<TAB>STEP<TAB>VALUE" per scalar; exit
                                 status 1 and one line naming the record at the first damage

The reader is written from the format (tensorboard.h's comment on it), not from the writer's code:
it walks any protobuf message field by field and skips the fields it does not know.
*/
#include "../tensorboard.h"
#include "test.h"
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>

// the reader's one line on what is wrong, into why; returns 1
static int why_line(char* why, size_t len, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
    return 1;
}

// the writer's report function: counts the lines it would print (the trainer hands it report_error)
static int reports = 0;
static void count_report(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    reports++;
}

// ----------------------------------------------------------------------------
// the reader

static uint64_t get_le(const uint8_t* p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

// one field of a protobuf message: its number, its wire type, and its value (a varint or a
// fixed-size number in num; length-delimited bytes at bytes, len)
typedef struct {
    int field, wire;
    uint64_t num;
    const uint8_t* bytes;
    size_t len;
} PbField;

static int pb_read_varint(const uint8_t** p, const uint8_t* end, uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) return 0;
    }
    return 1;
}

// the next field at *p; 1 at the end of the message, -1 if it is malformed
static int pb_next(const uint8_t** p, const uint8_t* end, PbField* f) {
    uint64_t key;
    if (*p == end) return 1;
    if (pb_read_varint(p, end, &key)) return -1;
    f->field = (int)(key >> 3);
    f->wire = (int)(key & 7);
    size_t fixed = f->wire == 1 ? 8 : f->wire == 5 ? 4 : 0;
    if (f->wire == 0) return pb_read_varint(p, end, &f->num) ? -1 : 0;
    if (fixed) {
        if ((size_t)(end - *p) < fixed) return -1;
        f->num = get_le(*p, (int)fixed);
        *p += fixed;
        return 0;
    }
    if (f->wire != 2 || pb_read_varint(p, end, &f->num) || f->num > (uint64_t)(end - *p)) return -1;
    f->bytes = *p;
    f->len = (size_t)f->num;
    *p += f->len;
    return 0;
}

typedef struct {
    double wall_time;
    long long step;
    char file_version[64];
    int num_values;
    char tag[8][256];
    float value[8];
} Event;

// Summary.Value { tag = 1; simple_value = 2 }
static int decode_value(const uint8_t* p, const uint8_t* end, Event* e) {
    PbField f;
    int rc, k = e->num_values;
    if (k == 8) return -1;
    e->tag[k][0] = '\0';
    e->value[k] = NAN;
    while ((rc = pb_next(&p, end, &f)) == 0) {
        if (f.field == 1 && f.wire == 2) snprintf(e->tag[k], sizeof(e->tag[k]), "%.*s", (int)f.len, (const char*)f.bytes);
        if (f.field == 2 && f.wire == 5) {
            uint32_t bits = (uint32_t)f.num;
            memcpy(&e->value[k], &bits, 4);
        }
    }
    e->num_values++;
    return rc < 0 ? -1 : 0;
}

// Event { wall_time = 1; step = 2; file_version = 3; summary = 5 { repeated value = 1 } }
static int decode_event(const uint8_t* p, const uint8_t* end, Event* e) {
    PbField f, v;
    int rc;
    memset(e, 0, sizeof(*e));
    while ((rc = pb_next(&p, end, &f)) == 0) {
        if (f.field == 1 && f.wire == 1) memcpy(&e->wall_time, &f.num, 8);
        if (f.field == 2 && f.wire == 0) e->step = (long long)f.num;
        if (f.field == 3 && f.wire == 2) snprintf(e->file_version, sizeof(e->file_version), "%.*s", (int)f.len, (const char*)f.bytes);
        if (f.field == 5 && f.wire == 2) {
            const uint8_t *s = f.bytes, *s_end = f.bytes + f.len;
            int src;
            while ((src = pb_next(&s, s_end, &v)) == 0)
                if (v.field == 1 && v.wire == 2 && decode_value(v.bytes, v.bytes + v.len, e)) return -1;
            if (src < 0) return -1;
        }
    }
    return rc < 0 ? -1 : 0;
}

// The next record of f into data (cap bytes), its two CRCs checked: 0 and its length in *n;
// 1 at the end of the file; -1 with what is wrong in why
static int read_record(FILE* f, uint8_t* data, size_t cap, size_t* n, char* why, size_t len) {
    uint8_t header[12], footer[4];
    size_t got = fread(header, 1, 12, f);
    if (got == 0 && feof(f)) return 1;
    if (got < 12) return -why_line(why, len, "truncated header (%zu of 12 bytes)", got);
    uint64_t length = get_le(header, 8);
    uint32_t stored = (uint32_t)get_le(header + 8, 4), computed = masked_crc32c(header, 8);
    if (stored != computed) return -why_line(why, len, "length CRC mismatch (stored %08x, computed %08x)", stored, computed);
    if (length > cap) return -why_line(why, len, "%llu bytes, more than an event of ours", (unsigned long long)length);
    *n = (size_t)length;
    if (fread(data, 1, *n, f) != *n || fread(footer, 1, 4, f) != 4)
        return -why_line(why, len, "truncated (%zu data bytes announced)", *n);
    stored = (uint32_t)get_le(footer, 4);
    computed = masked_crc32c(data, *n);
    if (stored != computed) return -why_line(why, len, "data CRC mismatch (stored %08x, computed %08x)", stored, computed);
    return 0;
}

// Every record of the file read and its Event decoded and printed (scalars as
// "TAG<TAB>STEP<TAB>VALUE"); 0, or 1 with the first damage in err, naming the record
static int dump_events(const char* path, FILE* out, char* err, size_t len) {
    static uint8_t data[1 << 16];
    char why[256] = "";
    size_t n = 0;
    FILE* f = fopen(path, "rb");
    if (!f) return why_line(err, len, "%s: %s", path, strerror(errno));
    int record = 0, rc;
    long offset = 0;
    for (; (rc = read_record(f, data, sizeof(data), &n, why, sizeof(why))) == 0; record++, offset = ftell(f)) {
        Event e;
        if (decode_event(data, data + n, &e)) snprintf(why, sizeof(why), "not a valid Event");
        else if (record == 0 && strcmp(e.file_version, "brain.Event:2") != 0)
            snprintf(why, sizeof(why), "file_version '%s', not 'brain.Event:2', in the first event", e.file_version);
        else if (!(e.wall_time > 1e9)) snprintf(why, sizeof(why), "wall_time %.17g is no time since 1970", e.wall_time);
        if (why[0]) {
            rc = -1;
            break;
        }
        for (int k = 0; k < e.num_values; k++) fprintf(out, "%s\t%lld\t%.9g\n", e.tag[k], e.step, e.value[k]);
    }
    if (rc == 1 && record == 0) snprintf(why, sizeof(why), "empty file");
    fclose(f);
    if (why[0]) return why_line(err, len, "%s: record %d (at byte %ld): %s", path, record, offset, why);
    return 0;
}

// ----------------------------------------------------------------------------
// the checks

static void check_crc32c(void) {
    uint32_t c = crc32c("123456789", 9);
    check(c == 0xE3069283u, "CRC-32C of \"123456789\" is the standard check value 0xE3069283", "got %08x", c);
    uint8_t zero_bytes[32] = {0};
    uint32_t zeros = crc32c(zero_bytes, 32);
    check(zeros == 0x8A9136AAu, "CRC-32C of 32 zero bytes is 0x8A9136AA (RFC 3720's example)", "got %08x", zeros);
    uint32_t m = masked_crc32c("", 0);
    check(m == 0xa282ead8u, "masked CRC-32C of nothing is the mask's constant 0xa282ead8", "got %08x", m);
}

static const char* const TAGS[3] = {"lm loss", "learning-rate vs samples", "a tag of ten bytes, then more: éè"};

// written by train.c's writer, read by our reader: tags, steps and values come back exactly
static void check_round_trip(const char* dir) {
    TensorBoardWriter w;
    char err[5000] = "", line[512];
    memset(&w, 0, sizeof(w));
    int rc = tensorboard_open(&w, dir, count_report, err, sizeof(err));
    check(rc == 0, "tensorboard_open creates an event file", "%s", err);
    if (rc) return;
    check(strstr(w.path, "/events.out.tfevents.") != NULL, "the file name has TensorBoard's 'events.out.tfevents.' (what it looks for)",
          "%s", w.path);
    double values[4] = {2.468413, 1e-30, -3.0e38, 4294967296.0};
    long long steps[4] = {0, 1, 300, 1LL << 40};   // steps up to 2^40 (samples of a long run): 6-byte varints
    for (int i = 0; i < 12; i++) tensorboard_scalar(&w, TAGS[i % 3], values[i % 4], steps[i % 4]);
    char path[4400];
    snprintf(path, sizeof(path), "%s", w.path);
    tensorboard_close(&w);
    FILE* out = tmpfile();
    rc = dump_events(path, out, err, sizeof(err));
    check(rc == 0, "our reader reads the writer's file: every record's two CRCs check", "%s", err);
    rewind(out);
    int i = 0, same = 1;
    for (; fgets(line, sizeof(line), out); i++) {
        char want[512];
        snprintf(want, sizeof(want), "%s\t%lld\t%.9g\n", TAGS[i % 3], steps[i % 4], (float)values[i % 4]);
        if (strcmp(line, want) != 0) {
            same = 0;
            check(0, "scalars read back as written", "scalar %d: got '%s', wrote '%s'", i, line, want);
            break;
        }
    }
    fclose(out);
    if (same) check(i == 12, "12 scalars read back as written (tag, step and float value exact)", "read %d", i);
}

// a write that fails (a full disk: /dev/full) is said once; the writer then writes nothing
static void check_failed_write(void) {
    TensorBoardWriter w;
    memset(&w, 0, sizeof(w));
    snprintf(w.path, sizeof(w.path), "/dev/full");
    w.file = fopen("/dev/full", "wb");
    w.report = count_report;
    if (!w.file) {
        printf("SKIP a failed write: no /dev/full\n");
        return;
    }
    for (int i = 0; i < 10; i++) tensorboard_scalar(&w, "lm loss", 1.0, i);
    tensorboard_flush(&w);   // the writes reach the device here
    check(w.file == NULL, "a failed write closes the writer (the run goes on, without events)", "file still open");
    tensorboard_scalar(&w, "lm loss", 1.0, 11);   // must do nothing, quietly
    tensorboard_flush(&w);
    tensorboard_close(&w);
    check(w.file == NULL, "after a failed write, scalars, flush and close do nothing", "file reopened");
    check(reports == 1, "a failed write is said once", "%d reports", reports);
}

// the writer's cost per log interval: the 18 scalars log_step writes with --fp16 --log-throughput, then the flush
static void measure_cost(const char* dir) {
    TensorBoardWriter w;
    char err[5000];
    memset(&w, 0, sizeof(w));
    if (tensorboard_open(&w, dir, count_report, err, sizeof(err))) return;
    const char* tags[18] = {"lm loss", "lm loss vs samples", "learning-rate", "learning-rate vs samples", "batch-size",
                            "batch-size vs samples", "loss-scale", "loss-scale vs samples", "grad-norm", "grad-norm vs samples",
                            "iteration-time", "iteration-time vs samples", "tokens-per-second",
                            "tokens-per-second vs samples", "throughput", "throughput vs samples", "mem-max-rss-bytes",
                            "mem-max-rss-bytes vs samples"};
    int intervals = 2000;
    double t0 = wall_clock_seconds();
    for (int i = 0; i < intervals; i++) {
        for (int k = 0; k < 18; k++) tensorboard_scalar(&w, tags[k], 1.0 + i, (long long)i * 100);
        tensorboard_flush(&w);
    }
    double us = (wall_clock_seconds() - t0) / intervals * 1e6;
    long bytes = ftell(w.file);
    tensorboard_close(&w);
    char name[160];
    snprintf(name, sizeof(name), "the writer's cost per log interval (18 scalars, %ld bytes, and a flush): %.1f us, under 5 ms",
             bytes / intervals, us);
    check(us < 5000.0, name, "%.1f us", us);
}

int main(int argc, char** argv) {
    if (argc == 3 && strcmp(argv[1], "--dump") == 0) {
        char err[5000];
        if (dump_events(argv[2], stdout, err, sizeof(err)) == 0) return 0;
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    if (argc != 3 || strcmp(argv[1], "--check") != 0) {
        fprintf(stderr, "usage: test_tensorboard --check DIR | --dump FILE\n");
        return 2;
    }
    check_crc32c();
    check_round_trip(argv[2]);
    check_failed_write();
    measure_cost(argv[2]);
    return tests_summary();
}
