/*
generate.h — generation: text from the model, a token at a time, with a KV cache, on any grid.

What lives here:
  - the sampler: greedy (temperature 0, or top-k 1), or a draw from softmax(logits /
    temperature), cut to the top-k ids and/or the nucleus of top-p (Holtzman et al. 2020),
    from a seeded counter-based generator: the same seed, the same text, whatever the layout;
  - the decode loop over the grid. Every rank of the world runs it. The prompt goes through
    the model in pieces of at most the arena's rows (the prefill), then each new token costs
    one position: its keys and values join each layer's cache (gpt.h's decoding form, the
    kernels' attention_decode). The first pipeline stage embeds; activations go stage to
    stage (parallel.h's point-to-point; with interleaving, chunk by chunk round the ring); the
    last stage's tensor ranks gather their vocab-parallel logits; one rank draws the token and
    every rank learns it (every data-parallel replica computes the same, and needs it);
  - the output, on world rank 0: GPT-2's tokenizer's text, bytes (a byte-level vocabulary),
    or ids; a summary line.

The context: learned positions end at --max-position-embeddings; when it is full, its last
half is fed again at positions from 0 and generation goes on (a context shift: one prefill of
half the context every half context, where a sliding window would recompute it all every
token); ALiBi has no position table, and the context is the prompt and the new tokens, all of
them (the cache grows with them). Nothing here knows the trainer's flags:
train.c hands over a GenerateOptions.
*/
#pragma once
#include <signal.h>

typedef struct {
    int max_new_tokens;
    float temperature;                    // 0: greedy
    int top_k;                            // 0: every id; 1: greedy
    float top_p;                          // 0: every id
    uint64_t seed;
    int eod;                              // the end-of-document id, where generation stops (-1: none)
    int ignore_eod;                       // go on past it
    int vocab;                            // ids that may be drawn: the tokenizer's, else the model's vocab_size
    const Tokenizer* tokenizer;           // its text; NULL: bytes (a vocabulary of <= 257 ids), else ids
    const char* prompt_text;              // printed before the sample
    int show_text, show_ids;              // the sample as text (as it comes), as ids (at the end), or both
    const volatile sig_atomic_t* stop;    // a stop signal's number (0: none): generation ends cleanly
    const char* (*name_signal)(int sig);  // its name, for the line that says so
    int cuda_graph;                       // the GPU build: a step of one row as a CUDA graph, where it can be
} GenerateOptions;

// ----------------------------------------------------------------------------
// the sampler

typedef struct {
    float logit;
    int id;
} LogitId;

typedef struct {
    float temperature, top_p;
    int top_k;
    uint64_t state;                       // splitmix64's, seeded once
    LogitId* order;                       // [vocab] scratch: the ids by logit
} Sampler;

static double sampler_uniform(Sampler* s) {   // [0, 1), 53 bits
    s->state = splitmix64(s->state);
    return (s->state >> 11) * (1.0 / 9007199254740992.0);
}

// the most likely id, the lowest of those tied (torch.argmax's rule)
static int argmax_id(const float* logits, int V) {
    int best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    return best;
}

static int by_logit_then_id(const void* a, const void* b) {
    const LogitId *x = (const LogitId*)a, *y = (const LogitId*)b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id - y->id;
}

// The next id from logits[0 .. V): greedy, or one uniform draw over the candidates, which are
// every id in id order, or (top-k, top-p) the most likely first (ties: the lower id first).
// As transformers' warpers, in this order: the temperature, top-k, then the smallest set of the
// most likely ids whose probabilities add up to top-p (at least one).
static int sample_next(Sampler* s, const float* logits, int V) {
    if (s->temperature == 0.0f || s->top_k == 1) return argmax_id(logits, V);
    int n = V, sorted = s->top_k > 0 || s->top_p > 0.0f;
    for (int v = 0; v < V; v++) {
        s->order[v].logit = logits[v];
        s->order[v].id = v;
    }
    if (sorted) qsort(s->order, V, sizeof(s->order[0]), by_logit_then_id);
    if (s->top_k > 0 && s->top_k < V) n = s->top_k;
    double maxv = logits[argmax_id(logits, V)], sum = 0.0, kept = 0.0, acc = 0.0;
    for (int j = 0; j < n; j++) sum += exp((s->order[j].logit - maxv) / s->temperature);
    if (s->top_p > 0.0f) {   // the nucleus: the shortest prefix whose probabilities reach top_p
        int j = 0;
        do kept += exp((s->order[j].logit - maxv) / s->temperature);
        while (++j < n && kept < s->top_p * sum);
        n = j;
        sum = kept;
    }
    double u = sampler_uniform(s) * sum;
    for (int j = 0; j < n; j++) {
        acc += exp((s->order[j].logit - maxv) / s->temperature);
        if (acc > u) return s->order[j].id;
    }
    return s->order[n - 1].id;
}

// ----------------------------------------------------------------------------
// the prompt's ids and the end-of-document id

// The end-of-document id, where a sample starts (an empty prompt) and stops: the tokenizer's
// (GPT-2's <|endoftext|>). Without one, `given` (>= 0); else the vocabulary's last id once it has
// 257 ids or more, which is where preprocess puts it: bytes' 256 of 257, the ids tokenizer's N
// of N + 1 (Megatron's NullTokenizer). The data files do not say which tokenizer made them, so
// this is a rule, and --eod-id overrides it. A smaller vocabulary is bytes with no such id: -1.
static int end_of_document_id(const Tokenizer* tok, int vocab, int given) {
    if (tok) return tok->eod;
    if (given >= 0) return given;
    return vocab > BYTE_EOD ? vocab - 1 : -1;
}

// "7,12,5" into ids (room for strlen(text) / 2 + 1 of them), each below vocab; 1 with err's line
static int parse_prompt_ids(const char* text, int vocab, int* ids, size_t* n, char* err, size_t errlen) {
    const char* p = text;
    *n = 0;
    do {
        char* end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || (*end && *end != ',') || errno)
            return error_line(err, errlen, "--generate-prompt-ids: '%s' is not a comma-separated list of ids", text);
        if (v < 0 || v >= vocab)
            return error_line(err, errlen, "--generate-prompt-ids: id %lld is outside the vocabulary [0, %d)", v, vocab);
        ids[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
    } while (*p);
    return 0;
}

// ----------------------------------------------------------------------------
// output (world rank 0)

// "LABEL: id,id,...": --generate-output ids's lines
static void print_ids(const char* label, const int* ids, int n) {
    printf("%s:", label);
    for (int i = 0; i < n; i++) printf("%s%d", i ? "," : " ", ids[i]);
    printf("\n");
}

// a token as text: GPT-2's tokenizer's bytes, a byte, or the id
static void print_token(const GenerateOptions* o, int token) {
    size_t len = 0;
    if (token == o->eod) printf("\n<|endoftext|>\n");
    else if (o->tokenizer) {   // (the bytes first: an argument's order of evaluation is the compiler's)
        const char* bytes = tokenizer_token_bytes(o->tokenizer, token, &len);
        fwrite(bytes, 1, len, stdout);
    }
    else if (o->vocab <= BYTE_VOCAB_SIZE) putchar(token);
    else printf("%d ", token);
}

// ----------------------------------------------------------------------------
// the decode loop over the grid

// the first slot of model chunk c (slots are in chunk order)
static int chunk_first_slot(const GPT* m, int c) {
    int slot = 0;
    for (int k = 0; k < c; k++) slot += m->chunk_slots[k];
    return slot;
}

// Can this rank's step of n rows run as a CUDA graph (kernels/common.cuh's compute_graph_begin)?
// Launches dominate a step of one row: eight to ten kernels and GEMMs a layer, each a few
// microseconds, so the GPU build captures the step (its kernels and cuBLASLt's) and launches it
// as one graph, re-captured a token and updated in place (the position, the cache's length and
// its split count change; the kernels stay). Not captured: the collectives and point-to-point of
// tensor and pipeline parallelism (NCCL can be captured, but the ranks would have to agree on
// every capture and update: not done here, so a graph runs only where a stage is the whole model
// and its tensor rank alone: TP = PP = 1, any DP or CP, whose replicas decode alone), the MoE
// layer (its routing's row offsets come back to the host, a wait a capture cannot hold), and
// the first step of one row, which runs plainly to make what is made once (cuBLASLt's plans for
// one row, the split decode's partials; and the overlapped parameter gather's last waits are
// behind it: data_parallel.h's hook waits for nothing in the steps after).
static int decode_graph_usable(const GPT* m, int n) {
    const KVCache* kv = m->kv_cache;
    return GPU_BUILD && kv->use_graph && kv->graph_warm && n == 1 && m->tp_size == 1 && grid.pp_size == 1 &&
           m->num_chunks == 1 && m->cfg.num_experts == 0;
}

// The rows [pos0, pos0 + n) of ids through this rank's model chunks, in pipeline order: each
// chunk takes its input from the embedding (the first stage's chunk 0) or the stage before it
// on the ring (the last stage for a later chunk of the first stage), and sends its output on,
// but for the head's chunk, whose forward leaves the last row's logits in m->logits. One row on
// a stage that is the whole model: as a CUDA graph, where decode_graph_usable says it can be.
static void decode_forward(GPT* m, const int* ids, int pos0, int n) {
    gpt_decode_rows(m, pos0, n);
    KVCache* kv = m->kv_cache;
    if (decode_graph_usable(m, n)) {
        host_to_dev(m->slots[0].tokens, ids + pos0, sizeof(int));   // (a copy from the host: before the capture)
        compute_graph_begin(&kv->graph);
        gpt_forward_stage(m, 0, 0.0f);
        compute_graph_end(&kv->graph);
        return;
    }
    kv->graph_warm |= n == 1;
    size_t elems = (size_t)n * m->cfg.hidden_size;
    for (int c = 0; c < m->num_chunks; c++) {
        int slot = chunk_first_slot(m, c);
        MicroBatchActivations* s = &m->slots[slot];
        if (chunk_holds_embedding(m, c)) host_to_dev(s->tokens, ids + pos0, n * sizeof(int));
        else send_forward_backward_recv_forward_backward(NULL, NULL, s->input, NULL, elems);
        gpt_forward_stage(m, slot, 0.0f);
        if (!chunk_holds_head(m, c)) send_forward_backward_recv_forward_backward(stage_output(s), NULL, NULL, NULL, elems);
    }
}

// the world rank that draws: tensor rank 0 of data-parallel replica 0's last stage
static int drawing_rank(void) { return grid.tp_size * grid.cp_size * grid.dp_size * (grid.pp_size - 1); }

// The next token, known to every rank: the last stage's tensor ranks gather the vocab-parallel
// logits of the last row (whole_logits: [padded vocabulary] on the device), the drawing rank
// draws from the ids below o->vocab (never a padding row), and broadcasts it.
static int next_token(GPT* m, Sampler* s, const GenerateOptions* o, floatX* whole_logits, float* logits) {
    int token = 0, root = drawing_rank();
    if (m->is_last_stage) all_gather(&grid.tp, m->logits, whole_logits, m->vocab_local);
    if (grid.world_rank == root) {
        dev_floatX_to_floats(logits, whole_logits, o->vocab);
        token = sample_next(s, logits, o->vocab);
    }
    broadcast_host(&grid.world, &token, sizeof(token), root);
    return token;
}

// The cache's positions, layer by layer, moved to a cache of max_len positions (the first
// `kept` of them copied; none allocated yet: kv->layers[i] NULL), and the context's ids with them
static void kv_cache_resize(GPT* m, KVCache* kv, int** ids, int max_len, int kept) {
    size_t row_bytes = 2 * (size_t)m->groups_local * m->head_size * sizeof(floatX);   // each position's keys and values
    for (int i = 0; i < m->num_local_layers; i++) {
        floatX* bigger = (floatX*)dev_malloc((size_t)max_len * row_bytes);
        if (kv->layers[i]) dev_copy(bigger, kv->layers[i], (size_t)kept * row_bytes);
        if (kv->layers[i]) dev_free(kv->layers[i]);
        kv->layers[i] = bigger;
    }
    *ids = (int*)realloc(*ids, (max_len + 1) * sizeof(int));
    if (!*ids) fail("out of host memory for %d token ids", max_len + 1);
    kv->max_len = max_len;
}

// the positions [0, len) of ids, in pieces the arena holds (the prefill)
static void prefill(GPT* m, const int* ids, int len, int max_rows) {
    for (int pos0 = 0; pos0 < len; pos0 += max_rows) decode_forward(m, ids, pos0, len - pos0 < max_rows ? len - pos0 : max_rows);
}

// A full context of learned positions (fed == the position table's size) shifted: its last
// half, the token just drawn last, fed again at positions from 0. Returns the positions now
// in the cache.
static int shift_context(GPT* m, int* ids, int fed, int token, int max_rows) {
    int keep = fed / 2 > 1 ? fed / 2 : 1;
    memmove(ids, ids + fed - (keep - 1), (keep - 1) * sizeof(int));
    ids[keep - 1] = token;
    prefill(m, ids, keep, max_rows);
    return keep;
}

static void print_sample_header(const GenerateOptions* o) {
    printf("---------- sample (%d tokens, temperature %.2f, top-k %d, top-p %.2f) ----------\n%s", o->max_new_tokens,
           o->temperature, o->top_k, o->top_p, o->prompt_text);
    fflush(stdout);
}

// Generate up to o->max_new_tokens after the prompt's ids (n_prompt of them, at least one);
// every rank calls it. Returns the tokens generated. The context: learned positions hold
// max_position_embeddings of them (a longer prompt keeps its last ones); ALiBi's, every token,
// the cache growing twice as long as it fills (memory for the tokens generated, not for the
// --generate-tokens asked: a signal may end a long run). The last token drawn is never fed.
static int generate_tokens(GPT* m, const GenerateOptions* o, const int* prompt, int n_prompt) {
    const GPTConfig* c = &m->cfg;
    int rank0 = grid.world_rank == 0;
    int cap = c->position_embedding_type == POSITION_LEARNED_ABSOLUTE ? c->max_position_embeddings : INT_MAX;
    int first = n_prompt > cap ? n_prompt - cap : 0, len = n_prompt - first;
    long long wanted = (long long)len + o->max_new_tokens - 1;   // positions fed at the most
    if (wanted > cap) wanted = cap;
    if (first && rank0) printf("note: the prompt's %d tokens are more than the %d positions of --max-position-embeddings: "
                               "generating from its last %d\n", n_prompt, cap, len);
    KVCache kv;
    memset(&kv, 0, sizeof(kv));
    kv.layers = (floatX**)callocCheck(m->num_local_layers + 1, sizeof(floatX*));
    kv.use_graph = o->cuda_graph;
    int* ids = NULL;
    kv_cache_resize(m, &kv, &ids, cap == INT_MAX && wanted > len + 1024 ? len + 1024 : (int)(wanted > len ? wanted : len), 0);
    memcpy(ids, prompt + first, len * sizeof(int));
    floatX* whole_logits = m->is_last_stage ? (floatX*)dev_malloc((size_t)c->padded_vocab_size * sizeof(floatX)) : NULL;
    float* logits = (float*)mallocCheck((size_t)c->padded_vocab_size * sizeof(float));
    Sampler s = {o->temperature, o->top_p, o->top_k, o->seed, (LogitId*)mallocCheck((size_t)o->vocab * sizeof(LogitId))};
    if (rank0) print_sample_header(o);
    activity_phase("generation", 0, -1);
    gpt_decode_begin(m, &kv);
    double t0 = now_seconds();
    prefill(m, ids, len, kv.max_rows);
    double prefill_seconds = now_seconds() - t0;
    int generated = 0, fed = len, shifts = 0;   // fed: the positions in the cache
    int sample_cap = 64, *sample = (int*)mallocCheck(sample_cap * sizeof(int));   // the new ids
    char note[160] = "";
    while (generated < o->max_new_tokens) {
        int signalled = max_over_world(*o->stop);   // a signal on any rank stops every rank here
        if (signalled) {
            snprintf(note, sizeof(note), "\n[sampling stopped by %s after %d of %d tokens]", o->name_signal(signalled),
                     generated, o->max_new_tokens);
            break;
        }
        int token = next_token(m, &s, o, whole_logits, logits);
        if (generated == sample_cap) sample = (int*)reallocCheck(sample, (sample_cap *= 2) * sizeof(int));
        sample[generated++] = token;
        if (rank0 && o->show_text) print_token(o, token);
        if ((token == o->eod && !o->ignore_eod) || generated == o->max_new_tokens) break;
        if (fed == cap) {
            fed = shift_context(m, ids, fed, token, kv.max_rows);
            shifts++;
            continue;
        }
        if (fed == kv.max_len) kv_cache_resize(m, &kv, &ids, 2LL * fed < wanted ? 2 * fed : (int)wanted, fed);
        ids[fed] = token;
        decode_forward(m, ids, fed++, 1);
    }
    double seconds = now_seconds() - t0;
    gpt_decode_end(m);
    if (rank0) {
        printf("%s\n", note);
        if (o->show_ids) {   // the whole prompt, as given (a cut one included)
            print_ids("prompt ids", prompt, n_prompt);
            print_ids("sample ids", sample, generated);
        }
        printf("------------------------------------------------------\n");
        if (shifts)
            printf("note: the context of %d positions (--max-position-embeddings) was full %d time(s): each time its last "
                   "%d tokens went on from position 0\n", cap, shifts, cap / 2 > 1 ? cap / 2 : 1);
        printf("generation: %d tokens after a prompt of %d tokens in %.3f s (prompt %.3f s): %.1f tokens/s\n", generated,
               len, seconds, prefill_seconds, seconds > 0 ? generated / seconds : 0.0);
        if (kv.graph.launches)
            printf("generation: %ld steps as a CUDA graph (%ld instantiated, %ld updated in place)\n", kv.graph.launches,
                   kv.graph.instantiated, kv.graph.launches - kv.graph.instantiated);
        fflush(stdout);
    }
    compute_graph_free(&kv.graph);
    for (int i = 0; i < m->num_local_layers; i++) dev_free(kv.layers[i]);
    free(kv.layers);
    if (whole_logits) dev_free(whole_logits);
    free(logits);
    free(ids);
    free(sample);
    free(s.order);
    return generated;
}
