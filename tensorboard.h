/*
tensorboard.h — TensorBoard event files, written by hand (--tensorboard-dir): what
TensorFlow's record writer and protobuf would produce for Megatron's
`writer.add_scalar(tag, value, step)`, with no TensorFlow, protobuf or CRC library.

Interface (what train.c uses): TensorBoardWriter, tensorboard_open (a new event file in a
directory), tensorboard_scalar, tensorboard_flush, tensorboard_close. A failed write does
not end the run: it is said once, through the report function the opener hands over, and the
writer writes nothing more. A room of its own, on libc and POSIX alone, so that
tests/test_tensorboard.c tests it without the trainer.

The format:
A file DIR/events.out.tfevents.<unix time>.<host>.<pid> is a sequence of records:
  uint64 length | uint32 masked CRC-32C of the 8 length bytes | data | uint32 masked CRC-32C of data
(little-endian; mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8), each record's data one
protobuf Event. The first Event holds only file_version "brain.Event:2"; every other holds
one scalar. The few protobuf fields used, by number and wire type (0 varint, 1 fixed64,
2 length-delimited, 5 fixed32):
  Event         { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
  Summary       { repeated Value value = 1; }
  Summary.Value { string tag = 1; float simple_value = 2; }
*/
#pragma once
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// CRC-32C (Castagnoli: the reflected polynomial 0x82F63B78; zlib's crc32 is another polynomial)
static uint32_t crc32c(const void* data, size_t n) {
    static uint32_t table[256];
    if (table[1] == 0)
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            table[i] = c;
        }
    const uint8_t* p = (const uint8_t*)data;
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return crc ^ 0xFFFFFFFFu;
}

static uint32_t masked_crc32c(const void* data, size_t n) {
    uint32_t c = crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// protobuf by hand: each returns the bytes it put at out
static size_t put_le(uint8_t* out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) out[i] = (uint8_t)(v >> (8 * i));
    return bytes;
}
static size_t pb_varint(uint8_t* out, uint64_t v) {
    size_t n = 0;
    for (; v >= 0x80; v >>= 7) out[n++] = (uint8_t)(v | 0x80);
    out[n++] = (uint8_t)v;
    return n;
}
static size_t pb_key(uint8_t* out, int field, int wire_type) { return pb_varint(out, (uint64_t)(field << 3 | wire_type)); }
static size_t pb_bytes(uint8_t* out, int field, const void* data, size_t n) {
    size_t k = pb_key(out, field, 2);
    k += pb_varint(out + k, n);
    memcpy(out + k, data, n);
    return k + n;
}

// an Event with file_version (tag NULL) or with one scalar; out needs 64 bytes + the tag's
static size_t encode_event(uint8_t* out, double wall_time, long long step, const char* tag, float value) {
    uint8_t scalar[256], summary[272];
    uint64_t wall_bits;
    uint32_t value_bits;
    memcpy(&wall_bits, &wall_time, 8);
    memcpy(&value_bits, &value, 4);
    size_t n = pb_key(out, 1, 1);
    n += put_le(out + n, wall_bits, 8);
    n += pb_key(out + n, 2, 0);
    n += pb_varint(out + n, (uint64_t)step);
    if (!tag) return n + pb_bytes(out + n, 3, "brain.Event:2", 13);
    size_t v = pb_bytes(scalar, 1, tag, strlen(tag));
    v += pb_key(scalar + v, 2, 5);
    v += put_le(scalar + v, value_bits, 4);
    return n + pb_bytes(out + n, 5, summary, pb_bytes(summary, 1, scalar, v));
}

// how the writer says a failed write: the trainer hands it report_error (one line naming the rank)
typedef void (*TensorBoardReport)(const char* fmt, ...);

typedef struct {
    FILE* file;        // NULL: nothing to write (no --tensorboard-dir, not rank 0, or a write failed)
    char path[4400];
    TensorBoardReport report;
} TensorBoardWriter;

// A failed write does not end a long run: one line, and no more events from this run.
static void tensorboard_give_up(TensorBoardWriter* w, int error) {
    w->report("--tensorboard-dir: cannot write %s: %s; no more TensorBoard events from this run (training goes on)",
              w->path, strerror(error));
    fclose(w->file);
    w->file = NULL;
}

// one record around n bytes of data; 0, or the error of a failed write
static int tensorboard_record(FILE* f, const uint8_t* data, size_t n) {
    uint8_t header[12], footer[4];
    put_le(header, n, 8);
    put_le(header + 8, masked_crc32c(header, 8), 4);
    put_le(footer, masked_crc32c(data, n), 4);
    int ok = fwrite(header, 1, 12, f) == 12 && fwrite(data, 1, n, f) == n && fwrite(footer, 1, 4, f) == 4;
    return ok ? 0 : errno ? errno : EIO;
}

static double wall_clock_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// a new event file in DIR (an existing directory), opened by its file_version event; 0, or 1
// with one line in err
static int tensorboard_open(TensorBoardWriter* w, const char* dir, TensorBoardReport report, char* err, size_t len) {
    char host[256] = "localhost";
    uint8_t event[64];
    gethostname(host, sizeof(host) - 1);
    snprintf(w->path, sizeof(w->path), "%s/events.out.tfevents.%lld.%s.%d", dir, (long long)time(NULL), host, (int)getpid());
    w->report = report;
    w->file = fopen(w->path, "wb");
    if (!w->file) {
        snprintf(err, len, "--tensorboard-dir %s: cannot create %s: %s", dir, w->path, strerror(errno));
        return 1;
    }
    int e = tensorboard_record(w->file, event, encode_event(event, wall_clock_seconds(), 0, NULL, 0.0f));
    if (!e && fflush(w->file) != 0) e = errno;
    if (!e) return 0;
    fclose(w->file);
    w->file = NULL;
    snprintf(err, len, "--tensorboard-dir %s: cannot write %s: %s", dir, w->path, strerror(e));
    return 1;
}

// Megatron's writer.add_scalar(tag, value, step)
static void tensorboard_scalar(TensorBoardWriter* w, const char* tag, double value, long long step) {
    uint8_t event[320];
    if (!w->file) return;
    if (strlen(tag) > 200) {   // the trainer's tags are constants: a programming error, said once
        w->report("tensorboard_scalar: tag '%.40s...' is longer than 200 bytes; no more TensorBoard events", tag);
        fclose(w->file);
        w->file = NULL;
        return;
    }
    int e = tensorboard_record(w->file, event, encode_event(event, wall_clock_seconds(), step, tag, (float)value));
    if (e) tensorboard_give_up(w, e);
}

// to the operating system (not to the disk), so that a crashed run loses at most the events since
static void tensorboard_flush(TensorBoardWriter* w) {
    if (w->file && fflush(w->file) != 0) tensorboard_give_up(w, errno);
}

static void tensorboard_close(TensorBoardWriter* w) {
    tensorboard_flush(w);
    if (w->file && fclose(w->file) != 0) w->report("--tensorboard-dir: cannot write %s: %s", w->path, strerror(errno));
    w->file = NULL;
}
