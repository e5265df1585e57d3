/*
tests/generate_logits.c — generation's pieces, through the trainer's own functions (train.c,
with generate.h, included as tests/test_model.c does):
  - the KV cache: a sequence decoded a piece at a time (gpt.h's decoding form, generate.h's
    decode_forward) gives at every position the logits a full forward of the whole sequence
    gives, for a GPT-2 model (learned positions), a BLOOM one (embedding LayerNorm, ALiBi) and a
    Llama one (rotary positions from the cache's end, 4 query heads sharing 2 cached K/V heads,
    RMSNorm, SwiGLU, untied, no biases);
    one token at a time and in pieces of several rows (a prefill); launched on N processes, the
    model is split over N tensor ranks, with and without sequence parallelism (which decoding
    turns off and back on);
  - the sampler: greedy takes the first of tied maxima; top-k 1 and a tiny top-p are greedy; a
    seed gives the same draws again, another seed others; top-k 2 draws only the two most likely
    ids; top-p keeps the smallest set that reaches it.
usage: mpirun -np N tests/build/generate_logits   (N = 1 or 2)
*/
#define TESTING
#pragma GCC diagnostic ignored "-Wunused-function"   // the trainer's setup and run: not needed here
#include "../train.c"
#include "test.h"

enum { GPT2, BLOOM, LLAMA };
static const char* const MODEL_NAMES[] = {"GPT-2 (learned positions)", "BLOOM (embedding LayerNorm, ALiBi)",
                                          "Llama (rope, grouped-query attention, RMSNorm, SwiGLU, untied)"};

static GPTConfig small_config(int model) {
    GPTConfig c = gpt_default_config();
    c.num_layers = 3;
    c.hidden_size = 24;
    c.num_attention_heads = 4;
    c.ffn_hidden_size = 40;
    c.seq_length = 12;
    c.max_position_embeddings = 12;
    c.vocab_size = 37;
    c.make_vocab_size_divisible_by = 8;
    c.padded_vocab_size = padded_vocab_size(c.vocab_size, c.make_vocab_size_divisible_by, grid.tp_size);
    c.init_method_std = 0.3f;   // large: logits that differ, attention that is not uniform
    c.seed = 11;
    if (model == BLOOM) {
        c.embed_layernorm = 1;
        c.position_embedding_type = POSITION_ALIBI;
    }
    if (model == LLAMA) {
        c.position_embedding_type = POSITION_ROPE;
        c.normalization = NORM_RMSNORM;
        c.swiglu = c.group_query_attention = c.untie_embeddings_and_output_weights = c.disable_bias_linear = 1;
        c.num_query_groups = 2;
    }
    return c;
}

// The logits of a full forward of T tokens, then those of the same tokens decoded in pieces
// (pieces[] rows each, summing to T): the decode's last row of each piece against the full
// forward's row there. Relative to the largest logit: fp32 sums in another order, ~1e-6.
static void decode_matches_full_forward(int model, int sequence_parallel, const int* pieces, int count, const char* how) {
    GPTConfig c = small_config(model);
    c.sequence_parallel = sequence_parallel;
    int T = c.seq_length, V = c.padded_vocab_size / grid.tp_size;
    GPT m;
    gpt_build(&m, &c, 1, T, grid.tp_rank, grid.tp_size, 0, 1, 1, 1);
    int ids[12];
    for (int t = 0; t < T; t++) ids[t] = m.slots[0].tokens[t] = m.slots[0].targets[t] = (t * 7 + 3) % c.vocab_size;
    gpt_forward(&m, 0);
    float* full = (float*)mallocCheck((size_t)T * V * sizeof(float));
    memcpy(full, m.logits, (size_t)T * V * sizeof(float));
    KVCache kv;
    memset(&kv, 0, sizeof(kv));
    kv.max_len = T;
    floatX* layers[3];
    for (int i = 0; i < 3; i++) layers[i] = (floatX*)dev_malloc((size_t)T * 2 * m.hidden_local * sizeof(floatX));
    kv.layers = layers;
    gpt_decode_begin(&m, &kv);
    double worst = 0.0, scale = 0.0;
    for (int k = 0, pos0 = 0; k < count; pos0 += pieces[k++]) {
        decode_forward(&m, ids, pos0, pieces[k]);
        const float* want = full + (size_t)(pos0 + pieces[k] - 1) * V;
        for (int v = 0; v < V; v++) {
            worst = fmax(worst, fabs(m.logits[v] - want[v]));
            scale = fmax(scale, fabs(want[v]));
        }
    }
    gpt_decode_end(&m);
    int shape_back = m.B == 1 && m.T == T && m.sequence_parallel == (sequence_parallel && grid.tp_size > 1) && !m.kv_cache &&
                     m.residual_rows == (m.sequence_parallel ? T / grid.tp_size : T);
    double all[2] = {worst / scale, !shape_back};
    all_reduce_host(&grid.world, all, 2, REDUCE_MAX);
    char name[256];
    snprintf(name, sizeof(name), "KV-cache decode %s = a full forward's logits at every position, %s, TP %d%s", how,
             MODEL_NAMES[model], grid.tp_size,
             sequence_parallel && grid.tp_size > 1 ? " with sequence parallelism" : "");
    check(all[0] <= 1e-5 && all[1] == 0.0, name, "worst error %.3g of the largest logit%s", all[0],
          all[1] != 0.0 ? "; the training shape was not restored" : "");
    for (int i = 0; i < 3; i++) dev_free(layers[i]);
    free(full);
    gpt_free(&m);
}

static int draw(float temperature, int top_k, float top_p, uint64_t seed, const float* logits, int V) {
    LogitId order[16];
    Sampler s = {temperature, top_p, top_k, seed, order};
    return sample_next(&s, logits, V);
}

static void sampler_rules(void) {
    float tied[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
    check(draw(0.0f, 0, 0.0f, 1, tied, 5) == 1, "greedy takes the first of tied maxima (torch.argmax's rule)", "it does not");
    int k1 = 1, p_tiny = 1, same = 1, differs = 0, outside_k2 = 0, outside_p = 0;
    for (uint64_t seed = 1; seed <= 200; seed++) {
        k1 &= draw(1.0f, 1, 0.0f, seed, tied, 5) == 1;
        p_tiny &= draw(1.0f, 0, 1e-6f, seed, tied, 5) == 1;
        int a = draw(1.0f, 0, 0.0f, seed, tied, 5);
        same &= a == draw(1.0f, 0, 0.0f, seed, tied, 5);
        differs += a != draw(1.0f, 0, 0.0f, seed + 1000, tied, 5);
        int b = draw(1.0f, 2, 0.0f, seed, tied, 5);
        outside_k2 += b != 1 && b != 3;
        // probabilities of the sorted ids 1, 3, 4 (2.0, 2.0, 1.9): 0.34, 0.34, 0.31, then 0.08 and 0.02:
        // top-p 0.6 keeps 1 and 3 (0.68 >= 0.6), 0.7 adds 4
        int p = draw(1.0f, 0, 0.6f, seed, tied, 5), q = draw(1.0f, 0, 0.7f, seed, tied, 5);
        outside_p += (p != 1 && p != 3) + (q != 1 && q != 3 && q != 4);
    }
    check(k1, "top-k 1 is greedy, whatever the seed", "a draw was not the first maximum");
    check(p_tiny, "a tiny top-p is greedy (the most likely id, ties: the lowest)", "a draw was not the first maximum");
    check(same, "a seed draws the same ids again", "a draw differed");
    check(differs > 50, "another seed draws other ids", "only %d of 200 draws differed", differs);
    check(outside_k2 == 0, "top-k 2 draws only the two most likely ids", "%d draws outside them", outside_k2);
    check(outside_p == 0, "top-p keeps the smallest set of the most likely ids that reaches it", "%d draws outside", outside_p);
}

int main(int argc, char** argv) {
    grid_start(&argc, &argv);
    grid_build(grid.world_size, 1, 1, 1);
    int one_by_one[12] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, prefill[4] = {5, 1, 4, 2}, sp_prefill[5] = {6, 1, 2, 1, 2};
    for (int model = GPT2; model <= LLAMA; model++) {
        decode_matches_full_forward(model, 0, one_by_one, 12, "one token at a time");
        decode_matches_full_forward(model, 0, prefill, 4, "in pieces of 5, 1, 4, 2");
        if (grid.tp_size > 1) decode_matches_full_forward(model, 1, sp_prefill, 5, "in pieces of 6, 1, 2, 1, 2");
    }
    if (grid.world_rank == 0) sampler_rules();
    int status = tests_summary();
    grid_finish();
    return status;
}
