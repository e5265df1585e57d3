/*
trace.h — the profiler (--profile): what every rank did during the steps it names, as one
file in Chrome's trace-event format (Perfetto, chrome://tracing, PyTorch's profiler and
Nsight Systems' export speak it), one track per rank and stream.

  - the recorder: each rank keeps its spans (begin, end, what, and the arguments that say
    which micro-batch, group, peer, bytes) in one buffer allocated before training. Recording
    a span is a clock reading and a few stores: no allocation, no I/O in the step. When this
    rank does not record, each hook is one branch;
  - on the GPU build a span of device work is also recorded as two CUDA events on the stream
    that runs it (the compute stream or the communication stream), so the device's timeline
    shows what overlapped; the host's spans (its launches) stay beside them on a track of
    their own. The CPU build's work is done when its call returns: one track, the host's;
  - after the last profiled step (trace_finish, every rank at once): the clocks aligned (a
    barrier, then every rank's clock at its exit), each rank's spans as trace events, gathered
    to rank 0, which returns the one JSON text (train.c writes it, atomically).

Interface (what parallel.h's hooks, pipeline.h, step.h and train.c use): trace_init / trace_free,
trace_start, trace_begin, trace_begin_step, trace_begin_micro, trace_end, trace_finish, and
tracer.active (between trace_start and trace_finish, on every rank); trace_stop (tests/bench.c).

It sits above parallel.h (the grid, the barrier and the gathers it aligns and merges with) and
below gpt.h; parallel.h tells it of every collective and exchange through the two hooks
(on_wait_begin, on_wait_end) it sets while it records.
*/
#pragma once

// ----------------------------------------------------------------------------
// the recorder

enum { TRACE_MAX_SPANS = 1 << 15, TRACE_MAX_DEPTH = 32 };

typedef struct {
    double begin, end;            // this rank's clock (now_seconds), the host's side of the span
    const char* name;             // "forward", "backward", "all-reduce", "send and receive", "AdamW", ...
    const char* category;         // "step", "compute", "pipeline", "collective", "optimizer", "data", ...
    const char* group;            // a collective's or an exchange's group, else NULL
    int iteration;                // the log line's iteration it belongs to
    int micro_batch, chunk;       // forward, backward: the micro-batch (-1: none) and the model chunk
    int first_layer, num_layers;  // forward, backward: the stage's layers
    int peer;                     // an exchange's other world rank, else -1
    int micro_batches;            // a step: how many micro-batches it has, else 0
    double bytes;                 // a collective's buffer or an exchange's message, else 0
    StreamId stream;              // ON_HOST, or where its device work was queued (GPU build)
} Span;

typedef struct {
    int enabled;                  // --profile, and this rank among --profile-ranks
    int active;                   // between trace_start and trace_finish (every rank)
    int recording;                // active && enabled: the hooks' one branch
    Span* spans;                  // [TRACE_MAX_SPANS], allocated by trace_init
    int count;
    long dropped;                 // spans that did not fit (said in the file)
    int open[TRACE_MAX_DEPTH];    // the spans begun and not yet ended, innermost last (-1: dropped)
    int depth;
    int iteration;                // the step in hand
    double started;               // this rank's clock at trace_start
#ifdef __CUDACC__
    cudaEvent_t* device_begin;    // [TRACE_MAX_SPANS]: recorded on the span's stream at its begin ...
    cudaEvent_t* device_end;      // ... and at its end
    cudaEvent_t anchor;           // recorded on an idle device at anchor_host: the device's clock on the host's
    double anchor_host;
#endif
} Tracer;
static Tracer tracer;   // one per process, as the grid

#ifdef __CUDACC__
static cudaStream_t stream_of(StreamId s) { return s == ON_COMM_STREAM ? comm_stream : 0; }
#endif

// Before training, on every rank: the buffer (and on the GPU build its events) where `enabled`
static void trace_init(int enabled) {
    memset(&tracer, 0, sizeof(tracer));
    tracer.enabled = enabled;
    if (!enabled) return;
    tracer.spans = (Span*)mallocCheck(TRACE_MAX_SPANS * sizeof(Span));
#ifdef __CUDACC__
    tracer.device_begin = (cudaEvent_t*)mallocCheck(TRACE_MAX_SPANS * sizeof(cudaEvent_t));
    tracer.device_end = (cudaEvent_t*)mallocCheck(TRACE_MAX_SPANS * sizeof(cudaEvent_t));
    for (int i = 0; i < TRACE_MAX_SPANS; i++) {   // timing events (cudaEventDefault), unlike the streams' own
        cudaCheck(cudaEventCreateWithFlags(&tracer.device_begin[i], cudaEventDefault));
        cudaCheck(cudaEventCreateWithFlags(&tracer.device_end[i], cudaEventDefault));
    }
    cudaCheck(cudaEventCreateWithFlags(&tracer.anchor, cudaEventDefault));
#endif
}

static void trace_free(void) {
    if (!tracer.enabled) return;
#ifdef __CUDACC__
    for (int i = 0; i < TRACE_MAX_SPANS; i++) {
        cudaCheck(cudaEventDestroy(tracer.device_begin[i]));
        cudaCheck(cudaEventDestroy(tracer.device_end[i]));
    }
    cudaCheck(cudaEventDestroy(tracer.anchor));
    free(tracer.device_begin);
    free(tracer.device_end);
#endif
    free(tracer.spans);
    memset(&tracer, 0, sizeof(tracer));
}

// A new span, begun now (NULL when the buffer is full: it is counted, and its end ignored)
static Span* trace_open(const char* name, const char* category, StreamId stream) {
    Tracer* t = &tracer;
    if (t->depth == TRACE_MAX_DEPTH) fail("the profiler's spans nest deeper than %d", TRACE_MAX_DEPTH);
    if (t->count == TRACE_MAX_SPANS) {
        t->dropped++;
        t->open[t->depth++] = -1;
        return NULL;
    }
    int i = t->count++;
    Span* s = &t->spans[i];
    memset(s, 0, sizeof(*s));
    s->name = name;
    s->category = category;
    s->iteration = t->iteration;
    s->micro_batch = s->peer = -1;
    s->stream = stream;
    s->begin = now_seconds();
#ifdef __CUDACC__
    if (stream != ON_HOST) cudaCheck(cudaEventRecord(t->device_begin[i], stream_of(stream)));
#endif
    t->open[t->depth++] = i;
    return s;
}

// the hooks' one branch: nothing more when this rank does not record
static inline void trace_begin(const char* name, const char* category, StreamId stream) {
    if (tracer.recording) trace_open(name, category, stream);
}

// the innermost span begun and not ended ends now
static inline void trace_end(void) {
    Tracer* t = &tracer;
    if (!t->recording || t->depth == 0) return;
    int i = t->open[--t->depth];
    if (i < 0) return;
    t->spans[i].end = now_seconds();
#ifdef __CUDACC__
    if (t->spans[i].stream != ON_HOST) cudaCheck(cudaEventRecord(t->device_end[i], stream_of(t->spans[i].stream)));
#endif
}

// the training step `iteration` (as the log line counts), of `micro_batches` micro-batches
static inline void trace_begin_step(int iteration, int micro_batches) {
    if (!tracer.recording) return;
    tracer.iteration = iteration;
    Span* s = trace_open("step", "step", ON_COMPUTE_STREAM);
    if (s) s->micro_batches = micro_batches;
}

// a forward or backward of one micro-batch through one of this stage's model chunks (0 in
// plain 1F1B), which holds the model's layers [first_layer, first_layer + num_layers)
static inline void trace_begin_micro(const char* name, int micro_batch, int chunk, int first_layer, int num_layers) {
    if (!tracer.recording) return;
    Span* s = trace_open(name, "compute", ON_COMPUTE_STREAM);
    if (!s) return;
    s->micro_batch = micro_batch;
    s->chunk = chunk;
    s->first_layer = first_layer;
    s->num_layers = num_layers;
}

// parallel.h's hooks: a collective or an exchange (peer: the other world rank)
static void trace_wait_begin(const char* op, const Group* g, int peer, size_t bytes, StreamId stream) {
    Span* s = trace_open(op, peer >= 0 ? "pipeline" : stream == ON_HOST ? "host communication" : "collective", stream);
    if (!s) return;
    s->group = g->name;
    s->peer = peer;
    s->bytes = (double)bytes;
}
static void trace_wait_end(void) { trace_end(); }

// Every rank, at the same point (before the first profiled step): recording starts where
// enabled. On the GPU build the device's clock is read against the host's once, on an idle device.
static void trace_start(void) {
    Tracer* t = &tracer;
    t->active = 1;
    t->recording = t->enabled;
    t->count = t->depth = 0;
    t->dropped = 0;
#ifdef __CUDACC__
    if (t->enabled) dev_synchronize();
#endif
    t->started = now_seconds();
#ifdef __CUDACC__
    t->anchor_host = t->started;   // (the anchor's record follows it: device times read no earlier than it)
    if (t->enabled) cudaCheck(cudaEventRecord(t->anchor, 0));
#endif
    if (!t->recording) return;
    on_wait_begin = trace_wait_begin;
    on_wait_end = trace_wait_end;
}

// recording stops (its spans are kept for trace_finish)
static void trace_stop(void) {
    on_wait_begin = NULL;
    on_wait_end = NULL;
    tracer.recording = tracer.active = 0;
}

// ----------------------------------------------------------------------------
// the writer: trace events (Chrome's "Trace Event Format": complete events "X" with ts and
// dur in microseconds, metadata events "M" naming processes and threads), one per line

typedef struct {
    char* text;
    size_t len, room;
} Text;

static void text_add(Text* t, const char* fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->text + t->len, t->room - t->len, fmt, ap);
        va_end(ap);
        if (n < 0) fail("the profiler could not format its text");
        if (t->len + n < t->room) {
            t->len += n;
            return;
        }
        t->room = 2 * (t->room + n + 4096);
        t->text = (char*)reallocCheck(t->text, t->room);
    }
}

// s as a JSON string's contents (quotes, backslashes and control characters escaped)
static void text_add_escaped(Text* t, const char* s) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') text_add(t, "\\%c", c);
        else if (c < 0x20) text_add(t, "\\u%04x", c);
        else text_add(t, "%c", c);
    }
}

// the tracks (Chrome's "threads") of each rank's process: the host's, and the GPU build's two streams
enum { TRACK_HOST, TRACK_COMPUTE, TRACK_COMM };

static void add_metadata(Text* out, int pid, int tid, const char* what, const char* name, int sort_index) {
    text_add(out, "{\"name\": \"%s_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": \"", what, pid, tid);
    text_add_escaped(out, name);
    text_add(out, "\"}},\n{\"name\": \"%s_sort_index\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"sort_index\": %d}},\n",
             what, pid, tid, sort_index);
}

// one complete event of span s: from begin to end (seconds on rank 0's clock, from the origin)
static void add_event(Text* out, const Span* s, int pid, int tid, double begin, double end) {
    text_add(out, "{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, "
             "\"args\": {\"iteration\": %d", s->name, s->category, pid, tid, begin * 1e6, (end - begin) * 1e6,
             s->iteration);
    if (s->micro_batches) text_add(out, ", \"micro_batches\": %d", s->micro_batches);
    if (s->micro_batch >= 0) text_add(out, ", \"micro_batch\": %d", s->micro_batch);
    if (strcmp(s->category, "compute") == 0)
        text_add(out, ", \"chunk\": %d, \"stage\": %d, \"first_layer\": %d, \"num_layers\": %d", s->chunk, grid.pp_rank,
                 s->first_layer, s->num_layers);
    if (s->group) text_add(out, ", \"group\": \"%s\", \"bytes\": %.0f", s->group, s->bytes);
    if (s->peer >= 0) text_add(out, ", \"peer\": %d", s->peer);
    text_add(out, "}},\n");
}

// What each rank tells the others at the end: who it is and its clock at the barrier's exit
typedef struct {
    char host[sizeof(grid.host)];
    int rank, tp, pp, dp, profiled, spans;
    long dropped;
    double barrier_exit, started;   // its own clock
} TraceRank;

// Seconds to subtract from rank r's clock to read rank 0's. Ranks on one host read one clock
// (CLOCK_MONOTONIC is the kernel's), so they need none among themselves: a host's offset is
// its first rank's barrier exit minus rank 0's, good to the barrier's exit skew between the two.
static double clock_offset(const TraceRank* all, int r) {
    int first = r;
    for (int q = 0; q < r && first == r; q++)
        if (strcmp(all[q].host, all[r].host) == 0) first = q;
    if (strcmp(all[first].host, all[0].host) == 0) return 0.0;
    return all[first].barrier_exit - all[0].barrier_exit;
}

// this rank's spans as trace events, on rank 0's clock from `origin`
static void add_rank_events(Text* out, const TraceRank* me, double offset, double origin) {
    char name[sizeof(grid.host) + 96];
    snprintf(name, sizeof(name), "rank %d host %s (tp,pp,dp)=(%d,%d,%d)", me->rank, me->host, me->tp, me->pp, me->dp);
    add_metadata(out, me->rank, 0, "process", name, me->rank);
    add_metadata(out, me->rank, TRACK_HOST, "thread", GPU_BUILD ? "host (launches)" : "host", TRACK_HOST);
#ifdef __CUDACC__
    add_metadata(out, me->rank, TRACK_COMPUTE, "thread", "compute stream", TRACK_COMPUTE);
    add_metadata(out, me->rank, TRACK_COMM, "thread", "communication stream", TRACK_COMM);
#endif
    for (int i = 0; i < tracer.count; i++) {
        const Span* s = &tracer.spans[i];
        add_event(out, s, me->rank, TRACK_HOST, s->begin - offset - origin, s->end - offset - origin);
#ifdef __CUDACC__
        if (s->stream == ON_HOST) continue;
        float to_begin = 0.0f, to_end = 0.0f;   // ms after the anchor, on the device's clock
        cudaCheck(cudaEventElapsedTime(&to_begin, tracer.anchor, tracer.device_begin[i]));
        cudaCheck(cudaEventElapsedTime(&to_end, tracer.anchor, tracer.device_end[i]));
        double at = tracer.anchor_host - offset - origin;
        add_event(out, s, me->rank, s->stream == ON_COMM_STREAM ? TRACK_COMM : TRACK_COMPUTE, at + 1e-3 * to_begin,
                  at + 1e-3 * to_end);
#endif
    }
}

// the file's "otherData": the run, the ranks and how their clocks were aligned
static void add_other_data(Text* out, const TraceRank* all, int first_iteration, int last_iteration) {
    double skew = 0.0;   // among the ranks of rank 0's host, who read one clock: the barrier's own exit skew
    for (int r = 0; r < grid.world_size; r++)
        if (strcmp(all[r].host, all[0].host) == 0 && fabs(all[r].barrier_exit - all[0].barrier_exit) > skew)
            skew = fabs(all[r].barrier_exit - all[0].barrier_exit);
    text_add(out, "\"otherData\": {\n\"producer\": \"gridgpt --profile (trace.h)\",\n\"build\": \"%s, %s\",\n"
             "\"layout\": {\"world\": %d, \"tp\": %d, \"pp\": %d, \"dp\": %d},\n\"iterations\": [%d, %d],\n"
             "\"time\": \"ts and dur in microseconds, on rank 0's clock; ts 0 is when the first rank began recording, before "
             "iteration %d\",\n",
             BUILD_NAME, PRECISION_NAME, grid.world_size, grid.tp_size, grid.pp_size, grid.dp_size, first_iteration,
             last_iteration, first_iteration);
    text_add(out, "\"clock_alignment\": {\"method\": \"after the last profiled step, a barrier over every rank, then each "
             "rank's CLOCK_MONOTONIC at its exit; ranks on one host read one clock and need no offset; another host's "
             "offset is its first rank's reading minus rank 0's, subtracted from its ranks' times\",\n\"accuracy\": \"within "
             "the barrier's exit skew between hosts (ranks leave a barrier up to one message latency apart); measured among "
             "rank 0's host's ranks, who read one clock: %.1f us\",\n\"offsets_us\": [", 1e6 * skew);
    for (int r = 0; r < grid.world_size; r++) text_add(out, "%s%.3f", r ? ", " : "", 1e6 * clock_offset(all, r));
    text_add(out, "],\n\"barrier_exit_us\": [");
    for (int r = 0; r < grid.world_size; r++)
        text_add(out, "%s%.3f", r ? ", " : "", 1e6 * (all[r].barrier_exit - all[0].barrier_exit));
    text_add(out, "]},\n\"ranks\": [\n");
    for (int r = 0; r < grid.world_size; r++) {
        text_add(out, "{\"rank\": %d, \"host\": \"", r);
        text_add_escaped(out, all[r].host);
        text_add(out, "\", \"tp\": %d, \"pp\": %d, \"dp\": %d, \"profiled\": %s, \"spans\": %d, \"dropped_spans\": %ld}%s\n",
                 all[r].tp, all[r].pp, all[r].dp, all[r].profiled ? "true" : "false", all[r].spans, all[r].dropped,
                 r + 1 < grid.world_size ? "," : "");
    }
    text_add(out, "]}\n");
}

// Every rank, after the last profiled step (iterations first..last): recording stops, the
// clocks are aligned, every rank's events go to rank 0. Returns the JSON text on rank 0
// (malloc'd, *len bytes, *dropped spans that did not fit in all), NULL on the others.
static char* trace_finish(int first_iteration, int last_iteration, size_t* len, long* dropped) {
    Tracer* t = &tracer;
    trace_stop();
    dev_synchronize();   // every event recorded has happened
    TraceRank me;
    memset(&me, 0, sizeof(me));
    snprintf(me.host, sizeof(me.host), "%s", grid.host);
    me.rank = grid.world_rank, me.tp = grid.tp_rank, me.pp = grid.pp_rank, me.dp = grid.dp_rank;
    me.profiled = t->enabled, me.spans = t->count, me.dropped = t->dropped, me.started = t->started;
    barrier(&grid.world);
    me.barrier_exit = now_seconds();
    TraceRank* all = (TraceRank*)mallocCheck(grid.world_size * sizeof(TraceRank));
    all_gather_host(&grid.world, &me, all, sizeof(me));
    Text mine = {NULL, 0, 0};
    text_add(&mine, "%s", "");
    double origin = INFINITY;   // the first rank's start, on rank 0's clock
    for (int r = 0; r < grid.world_size; r++) origin = fmin(origin, all[r].started - clock_offset(all, r));
    if (t->enabled) add_rank_events(&mine, &me, clock_offset(all, grid.world_rank), origin);
    size_t events_len;
    char* events = (char*)gather_bytes_to_rank0(&grid.world, mine.text, (int)mine.len, &events_len);
    free(mine.text);
    if (grid.world_rank != 0) {
        free(all);
        return NULL;
    }
    Text doc = {NULL, 0, 0};
    *dropped = 0;
    for (int r = 0; r < grid.world_size; r++) *dropped += all[r].dropped;
    text_add(&doc, "{\"traceEvents\": [\n%.*s\n],\n\"displayTimeUnit\": \"ms\",\n",
             (int)(events_len >= 2 ? events_len - 2 : 0), events);   // (less the last event's ",\n")
    add_other_data(&doc, all, first_iteration, last_iteration);
    text_add(&doc, "}\n");
    free(events);
    free(all);
    *len = doc.len;
    return doc.text;
}
