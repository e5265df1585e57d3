/*
gpt.h — the model: a GPT-2-family decoder, as one pipeline stage of one tensor-parallel rank.

What lives here:
  - the config: each field declared once (GPT_CONFIG_FIELDS), as text; the padded vocabulary;
  - the tensor table: one descriptor per parameter tensor, built from the config, saying
    its names (ours, GPT-2's), whole shape, how tensor parallelism splits it, which layer (so which
    pipeline stage) it belongs to, and where this rank's slice sits in the flat buffers;
  - initialization as a pure function of (seed, tensor name, element index in the whole
    tensor), so every parallel layout starts from the very same weights;
  - activation recomputation's plan (a chunk of layers keeps its input only, and re-runs its
    forward in the backward);
  - the activation arena: everything a micro-batch keeps from its forward to its backward,
    one "slot" per micro-batch in flight, sized once at start (a MoE layer's routing too).
The forward and the backward that use all this are layers.h's.

Rules it keeps: it never allocates after gpt_build().
*/
#pragma once
#include <errno.h>
#include <float.h>
#include <stddef.h>
#include <stdint.h>

// ----------------------------------------------------------------------------
// config: each field of the model declared once
// X(kind, name, default, min, help, checkpoint, gpt2, bloom, llama): the GPTConfig struct, the trainer's flag
// (--name with '-' for '_', Megatron's), --help, the range check, checkpoint metadata
// (written, read, compared on load), the Hugging Face config and the start-up print all walk
// this list, so adding a model option is one line here plus its use.
//   default: text, parsed like the flag's value (NULL: zero);  min: the smallest value allowed
//   checkpoint: MATCH = the tensor layout depends on it, a resume must give the same value;
//               STORED = written for the record, may change on resume
//   gpt2, bloom, llama: the field's name in transformers' GPT-2 / Bloom / Llama config.json (NULL: none);
//               llama is the Llama family's column: Llama's keys, and the MoE fields' Qwen2-MoE keys (hf.h's
//               hf_field_key leaves the MoE fields out of Llama's config and names Mixtral's few others)
// GPT-2, BLOOM and Llama are presets of these fields: where the models differ, the model reads
// the field in one place (gpt.h's helpers below the tensor table, kernels.cuh's arguments).
#define GPT_CONFIG_FIELDS(X)                                                                                          \
    X(INT, num_layers, "4", 1, "transformer layers", MATCH, "n_layer", "n_layer", "num_hidden_layers")                 \
    X(INT, hidden_size, "256", 1, "model width", MATCH, "n_embd", "hidden_size", "hidden_size")                        \
    X(INT, num_attention_heads, "4", 1, "attention heads", MATCH, "n_head", "n_head", "num_attention_heads")           \
    X(INT, ffn_hidden_size, NULL, 0, "MLP width (0: 4 x hidden)", MATCH, "n_inner", NULL, "intermediate_size")         \
    X(INT, seq_length, "128", 1, "tokens per sample", STORED, NULL, NULL, NULL)                                        \
    X(INT, max_position_embeddings, NULL, 0, "position table size (0: seq-length)", MATCH, "n_positions", NULL,        \
      "max_position_embeddings")                                                                                       \
    X(INT, vocab_size, NULL, 0, "vocabulary (0: the largest token id in the data + 1)", MATCH, "vocab_size",           \
      "vocab_size", "vocab_size")                                                                                      \
    X(INT, make_vocab_size_divisible_by, "128", 1, "pad the vocabulary to a multiple of this x TP", STORED, NULL, NULL, \
      NULL)                                                                                                            \
    X(SWITCH, embed_layernorm, NULL, 0, "LayerNorm after the embedding (BLOOM)", MATCH, NULL, NULL, NULL)              \
    X(CHOICE, position_embedding_type, "learned_absolute", 0, "learned_absolute | alibi | rope", MATCH, NULL, NULL,    \
      NULL)                                                                                                            \
    X(INT, rotary_base, "10000", 1, "rope: the base of the rotary frequencies", MATCH, NULL, NULL, "rope_theta")       \
    X(FLOAT, rotary_percent, "1.0", 0, "rope: the fraction of each head's dims rotated", MATCH, NULL, NULL, NULL)      \
    X(CHOICE, normalization, "LayerNorm", 0, "LayerNorm | RMSNorm", MATCH, NULL, NULL, NULL)                           \
    X(FLOAT, norm_epsilon, "1e-5", 0, "the normalization's epsilon (RMSNorm's; LayerNorm's is 1e-5)", MATCH, NULL,     \
      NULL, "rms_norm_eps")                                                                                            \
    X(SWITCH, swiglu, NULL, 0, "SwiGLU MLP, silu(gate) x up (Llama); fc1 twice as wide", MATCH, NULL, NULL, NULL)      \
    X(CHOICE, gelu, "tanh", 0, "tanh | erf (the GELU MLP's form; not given: erf with --no-bias-gelu-fusion or "     \
      "--disable-bias-linear, as Megatron-LM)", MATCH, NULL, NULL, NULL)                                            \
    X(SWITCH, group_query_attention, NULL, 0, "grouped-query attention: heads share --num-query-groups K/V heads",    \
      MATCH, NULL, NULL, NULL)                                                                                         \
    X(INT, num_query_groups, "1", 1, "key/value heads (with --group-query-attention)", MATCH, NULL, NULL,              \
      "num_key_value_heads")                                                                                           \
    X(SWITCH, untie_embeddings_and_output_weights, NULL, 0, "an output layer of its own, not the word embedding",     \
      MATCH, NULL, NULL, NULL)                                                                                         \
    X(SWITCH, disable_bias_linear, NULL, 0, "linear layers without biases (Llama)", MATCH, NULL, NULL, NULL)          \
    X(SWITCH, add_qkv_bias, NULL, 0, "a bias on the QKV projection even with --disable-bias-linear (Qwen2)", MATCH,  \
      NULL, NULL, NULL)                                                                                                \
    X(FLOAT, init_method_std, "0.02", 0, "std of the normal init", STORED, "initializer_range", "initializer_range",   \
      "initializer_range")                                                                                             \
    X(INT, seed, "1234", 0, "seed of the init, the data order and dropout's masks", STORED, NULL, NULL, NULL)          \
    X(FLOAT, hidden_dropout, "0.1", 0, "in training, the fraction of the hidden states zeroed after the embedding, "   \
      "the attention and the MLP (before each residual add)", STORED, NULL, NULL, NULL)                                \
    X(FLOAT, attention_dropout, "0.1", 0, "in training, the fraction of the attention probabilities zeroed", STORED,   \
      NULL, NULL, NULL)                                                                                                \
    X(SWITCH, sequence_parallel, NULL, 0, "split the LayerNorm and residual rows over the TP ranks (TP > 1)", STORED,   \
      NULL, NULL, NULL)                                                                                                \
    X(INT, num_experts, NULL, 0, "E: experts in each MoE layer, a mixture of experts in place of the MLP (0: dense)", \
      MATCH, NULL, NULL, "num_experts")                                                                                \
    X(INT, moe_router_topk, "2", 1, "k: the experts each token goes to", STORED, NULL, NULL, "num_experts_per_tok")    \
    X(INT, moe_ffn_hidden_size, NULL, 0, "an expert's MLP width (0: --ffn-hidden-size)", MATCH, NULL, NULL,            \
      "moe_intermediate_size")                                                                                         \
    X(INT, moe_layer_freq, "1", 1, "N: layers 0, N, 2N, ... are MoE layers, the others dense", MATCH, NULL, NULL, NULL) \
    X(SWITCH, moe_router_pre_softmax, NULL, 0, "the top-k's weights from the softmax over all experts, not "          \
      "renormalized (Qwen2-MoE); default: the softmax over the k chosen (Mixtral)", STORED, NULL, NULL, NULL)        \
    X(CHOICE, moe_router_load_balancing_type, "aux_loss", 0, "aux_loss | none (Switch Transformer's, per layer)",     \
      STORED, NULL, NULL, NULL)                                                                                        \
    X(FLOAT, moe_aux_loss_coeff, NULL, 0, "the load-balancing loss's weight in the loss (0: off)", STORED, NULL, NULL, \
      "router_aux_loss_coef")                                                                                          \
    X(FLOAT, moe_z_loss_coeff, NULL, 0, "the router z-loss's weight (ST-MoE; 0: off)", STORED, NULL, NULL, NULL)      \
    X(INT, moe_shared_expert_intermediate_size, NULL, 0, "a shared expert of this width every token goes through, "  \
      "its output gated by a sigmoid (Qwen2-MoE; 0: none)", MATCH, NULL, NULL, "shared_expert_intermediate_size")   \
    X(FLOAT, moe_expert_capacity_factor, NULL, 0, "F: each expert takes at most ceil(N k / E x F) of a micro-batch's " \
      "N k choices, the others dropped (Megatron-Core's token dropping; 0: dropless)", STORED, NULL, NULL, NULL)      \
    X(CHOICE, moe_token_drop_policy, "probs", 0, "probs | position (over its capacity an expert keeps the choices of " \
      "the largest weights, or of the first tokens)", STORED, NULL, NULL, NULL)                                    \
    X(SWITCH, moe_pad_expert_input_to_capacity, NULL, 0, "each expert runs exactly its capacity of rows (refused: "  \
      "not built)", STORED, NULL, NULL, NULL)

// activation recomputation, in --recompute-method's order (train.c's check_recompute)
typedef enum { RECOMPUTE_NONE, RECOMPUTE_UNIFORM, RECOMPUTE_BLOCK } RecomputeMethod;

typedef struct {
    GPT_CONFIG_FIELDS(DECLARE_FIELD)
    int padded_vocab_size;   // derived: vocab_size rounded up (see padded_vocab_size())
    // derived from the run's --recompute-* flags (train.c): how backward gets its activations
    // back, never stored in checkpoints (a run may resume with or without it)
    int recompute_method;    // RecomputeMethod
    int recompute_num_layers;
    int recompute_attention_core;   // --recompute-granularity selective: each layer's softmax(q k^T) again in backward
} GPTConfig;

typedef enum { POSITION_LEARNED_ABSOLUTE, POSITION_ALIBI, POSITION_ROPE } PositionEmbeddingType;   // --position-embedding-type
typedef enum { NORM_LAYERNORM, NORM_RMSNORM } Normalization;                                     // --normalization

#define DESCRIBE_MODEL_FIELD(kind, name, def, min, help, ckpt, gpt2, bloom, llama) \
    {#name, def, help, gpt2, bloom, llama, FIELD_##kind, offsetof(GPTConfig, name), min, ckpt},
static const ConfigField MODEL_FIELDS[] = {GPT_CONFIG_FIELDS(DESCRIBE_MODEL_FIELD)};
#define NUM_MODEL_FIELDS ((int)(sizeof(MODEL_FIELDS) / sizeof(MODEL_FIELDS[0])))

// every model field at its default (NULL: zero; a choice without one: -1, "not given"): what
// the trainer's config starts from, and the tests' models too, so a new field needs no edit there
static GPTConfig gpt_default_config(void) {
    GPTConfig c;
    memset(&c, 0, sizeof(c));
    char err[256];
    for (int k = 0; k < NUM_MODEL_FIELDS; k++) {
        const ConfigField* f = &MODEL_FIELDS[k];
        if (f->default_value && parse_field(f, &c, f->default_value, err, sizeof(err))) fail("a default: %s", err);
        if (!f->default_value && f->kind == FIELD_CHOICE) *(int*)field_in(f, &c) = -1;
    }
    return c;
}

// Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by x TP, so
// that every tensor-parallel rank holds an equal slice and matmuls get friendly shapes.
// (In 64 bits: a large multiple once wrapped to a vocabulary of 0. The callers check it fits an int.)
static long long padded_vocab_size(int vocab_size, int divisible_by, int tensor_parallel_size) {
    long long multiple = (long long)divisible_by * tensor_parallel_size;
    return (vocab_size + multiple - 1) / multiple * multiple;
}

// grouped-query attention (Ainslie et al. 2023; Megatron's --group-query-attention
// --num-query-groups): the query heads fall into groups, each sharing one key head and one value
// head; without it every head is its own group (multi-head attention)
static int query_groups(const GPTConfig* c) {
    return c->group_query_attention ? c->num_query_groups : c->num_attention_heads;
}

// rope: the rotated dims of a head, Megatron's int(head size x --rotary-percent) (config.h
// checks it is even)
static int rotated_dims(const GPTConfig* c) {
    return (int)((double)(c->hidden_size / c->num_attention_heads) * c->rotary_percent);
}

// The checks of a model's fields, as a run's flags (config.h's check_model) and as an imported
// config.json (hf.h) get them: an import once wrote a model that every later --load refused
// (max_position_embeddings 0, so a sequence length of 0). Each number within its flag's range
// (a value derived from another never passed through a flag's parse), then the fields against
// each other; after the derived fields are settled. 0, or 1 with a line in err in the flags' words.
static int model_config_error(const GPTConfig* m, char* err, size_t len) {
    GPTConfig scratch = *m;
    char value[64];
    for (int k = 0; k < NUM_MODEL_FIELDS; k++) {
        const ConfigField* f = &MODEL_FIELDS[k];
        int number = f->kind == FIELD_INT || f->kind == FIELD_LONG || f->kind == FIELD_FLOAT;
        if (number && parse_field(f, &scratch, format_field(f, m, value, sizeof(value)), err, len)) return 1;
    }
    int NH = m->num_attention_heads, G = query_groups(m), rope = m->position_embedding_type == POSITION_ROPE;
    if (m->hidden_size % NH != 0)
        return error_line(err, len, "--hidden-size %d is not divisible by --num-attention-heads %d", m->hidden_size, NH);
    if (m->ffn_hidden_size < 1) return error_line(err, len, "--ffn-hidden-size must be at least 1, got %d", m->ffn_hidden_size);
    if (G < 1 || NH % G != 0)
        return error_line(err, len, "--num-attention-heads %d is not divisible by --num-query-groups %d (each group shares "
                          "one key and value head among the same number of query heads)", NH, G);
    if (rope && (m->rotary_percent <= 0.0f || m->rotary_percent > 1.0f))
        return error_line(err, len, "--rotary-percent must be in (0, 1], got %g", m->rotary_percent);
    if (rope && (rotated_dims(m) < 2 || rotated_dims(m) % 2 != 0))
        return error_line(err, len, "--rotary-percent %g of a head of %d dims rotates %d of them: rope turns dims in "
                          "pairs, give an even number, 2 at least", m->rotary_percent, m->hidden_size / NH, rotated_dims(m));
    if (m->normalization == NORM_LAYERNORM && m->norm_epsilon != LAYERNORM_EPS)
        return error_line(err, len, "--norm-epsilon %g with LayerNorm: gridgpt's LayerNorm adds 1e-5 (Megatron-LM's "
                          "default); the epsilon is --normalization RMSNorm's to choose", m->norm_epsilon);
    if (m->norm_epsilon <= 0.0f) return error_line(err, len, "--norm-epsilon must be positive, got %g", m->norm_epsilon);
    if (m->seq_length > m->max_position_embeddings && m->position_embedding_type == POSITION_LEARNED_ABSOLUTE)
        return error_line(err, len, "--seq-length %d exceeds --max-position-embeddings %d", m->seq_length,
                          m->max_position_embeddings);
    if (m->init_method_std <= 0.0f) return error_line(err, len, "--init-method-std must be positive, got %g", m->init_method_std);
    if (m->num_experts > MOE_MAX_EXPERTS || (m->num_experts > 0 && m->moe_router_topk > m->num_experts) ||
        (m->num_experts > 0 && m->moe_router_topk > MOE_MAX_TOPK))
        return error_line(err, len, "--num-experts %d with --moe-router-topk %d: at most %d experts, each token to at most "
                          "%d of them and no more than there are", m->num_experts, m->moe_router_topk, MOE_MAX_EXPERTS,
                          MOE_MAX_TOPK);
    if (m->num_experts > 0 && m->moe_ffn_hidden_size < 1)
        return error_line(err, len, "--moe-ffn-hidden-size must be at least 1, got %d", m->moe_ffn_hidden_size);
    if (m->moe_pad_expert_input_to_capacity && m->moe_expert_capacity_factor == 0.0f)
        return error_line(err, len, "--moe-pad-expert-input-to-capacity without --moe-expert-capacity-factor: there is no "
                          "capacity to pad to (Megatron-Core asks for both)");
    // Padding is refused: it buys Megatron-Core static shapes (CUDA graphs, a fixed all-to-all); here
    // each expert's products run on the rows it got, and padding would only add zero rows' work
    if (m->moe_pad_expert_input_to_capacity)
        return error_line(err, len, "--moe-pad-expert-input-to-capacity: not built (gridgpt's experts run the rows they "
                          "got, no CUDA graph needs static shapes, and the padding's zero rows change no output)");
    if (m->hidden_dropout >= 1.0f || m->attention_dropout >= 1.0f)
        return error_line(err, len, "--%s-dropout %g: a fraction below 1 (dropout scales what it keeps by 1 / (1 - p))",
                          m->hidden_dropout >= 1.0f ? "hidden" : "attention",
                          m->hidden_dropout >= 1.0f ? m->hidden_dropout : m->attention_dropout);
    return 0;
}

// ----------------------------------------------------------------------------
// the tensor table

enum { INIT_NORMAL, INIT_ONES, INIT_ZEROS };

typedef struct {
    char name[128];       // Megatron's parameter name (checkpoints use it)
    char hf_name[96];     // transformers' GPT-2 name ("": GPT-2 has no such tensor)
    char bloom_name[96];  // transformers' Bloom name ("": Bloom has none); stored as ours, no transform
    char llama_name[96];  // transformers' Llama name ("": Llama has none); the fused qkv_proj and gate_up_proj
                          // are Phi-3's names, which hf.h splits into Llama's q/k/v_proj and gate/up_proj
    int hf_transpose;     // GPT-2 stores this linear as a Conv1D: [in, out], our [out, in] transposed
    int hf_qkv;           // rows grouped per head [q|k|v] here, [all q | all k | all v] in GPT-2
    int layer;            // -1: embedding, 0..L-1: a transformer layer, L: final LayerNorm
    int rows, cols;       // whole (unsharded) shape; a vector has cols == 1
    int split_axis;       // -1: replicated over tensor ranks, 0: rows split, 1: columns split
    int row_parts;        // rows split (axis 0) in this many equal blocks, each split over the tensor
                          // ranks, a rank holding its piece of each, stacked (SwiGLU's [gate; up]: 2)
    int weight_decay;     // matrices and embeddings decay; biases and LayerNorm do not
    int init;             // INIT_NORMAL with init_std, or constant ones / zeros
    float init_std;
    int valid_rows;       // rows below this are real; above are vocabulary padding (zero)
    int tied_copy;        // the last stage's copy of the word embedding (PP > 1)
    int row_start, local_rows, col_start, local_cols;   // this rank's slice (row_start: in the first row block)
    size_t offset, numel; // the slice in the rank's flat parameter / gradient buffers
    size_t param_at, grad_at;   // where param_of and grad_of find it in m->params and m->grads: `offset`, unless
                                // ZeRO-2/3 (zero.h) keep those buffers as windows onto the layers in flight
} TensorDesc;

// indices into the tensor table of one transformer layer's tensors
// an MLP's tensors, of width F (fc1 is [F, C], or with SwiGLU [gate; up], [2F, C]; fc2 [C, F]): the
// dense MLP's, or in a MoE layer one expert's or the shared expert's. An expert is the dense MLP
// on the rows routed to it: the same code runs both (mlp_rows_forward, mlp_rows_backward).
typedef struct {
    int fc_w, fc_b, fcproj_w, fcproj_b;
    int width;   // F on this rank (the dense MLP's is split over the tensor ranks)
} MlpTensors;

typedef struct {
    int ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b;
    MlpTensors mlp;          // the dense MLP (-1s in a MoE layer)
    int router_w;            // a MoE layer (else -1): the router [E, C], the experts [E], and with
    MlpTensors* experts;     // --moe-shared-expert-intermediate-size the shared expert and its gate [1, C]
    MlpTensors shared;
    int shared_gate_w;
} LayerTensors;

// ----------------------------------------------------------------------------
// activations

typedef struct {
    floatX *ln1, *qkv, *atty, *att, *res2, *ln2, *fch, *fch_act, *res3;   // fch: fc1's output, fch_act: GELU or SwiGLU of it
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
    float* lse;   // the fused attention's log-sum-exp [B, heads, T], kept instead of att [B, heads, T, T]
    // a MoE layer (moe.h): its routing, the router's logits [N, E], each routed row's expert output
    // [N k, C] (fch and fch_act hold the experts' N k rows); the shared expert's fc1 output, its
    // activation, its output [N, C] and its gate's logit [N]
    MoERouting route;
    floatX *router_logits, *moe_ys, *shared_fch, *shared_fch_act, *shared_y, *shared_gate;
} LayerActivations;

// everything one micro-batch keeps from its forward until its backward through one model chunk
// of this stage (a plain 1F1B stage is one chunk)
typedef struct {
    int chunk, first, end; // the chunk, and its local layers [first, end) (layers[i] for i in that range)
    int holder;           // the micro-batch in it now (-1: free; the schedule checks it, pipeline.h take_slot)
    int* tokens;          // [B*T] inputs (first stage)
    int* targets;         // [B*T] next tokens (last stage)
    floatX* input;        // [B*T, C] chunk input: embedding output, or received from the previous stage
    floatX* dout;         // [B*T, C] the gradient of the chunk's output, received ahead of its backward
                          // (interleaved 1F1B, a chunk without the head; else NULL: it arrives in dres)
    floatX* embed_ln;     // [B*T, C] output of the embedding LayerNorm (if any)
    float *embed_ln_mean, *embed_ln_rstd;
    LayerActivations* layers;
    floatX* lnf;          // [B*T, C] final LayerNorm output (last stage)
    float *lnf_mean, *lnf_rstd;
} MicroBatchActivations;

// generation's KV cache (generate.h allocates it, outside the arena): per local layer i,
// layers[i] is [max_len, 2 x hidden_local] floatX, each position's keys of this rank's heads,
// then their values (kernels/attention.cuh's kv_cache_index). pos0: the first position of the rows the
// next forward runs. B .. first_residual_row: the training shape gpt_decode_begin set aside, for
// gpt_decode_end. The rest: the decode step's CUDA graph (generate.h).
typedef struct {
    floatX** layers;
    int max_len, pos0;
    int max_rows;   // the most rows one forward may run: the arena's residual rows
    int B, T, sequence_parallel, residual_rows, first_residual_row;
    int use_graph;        // may a step of one row run as a CUDA graph (the GPU build: generate.h's decode_forward)
    int graph_warm;       // a step of one row has run plainly: what is made once for it is made
    ComputeGraph graph;   // those steps' graph
} KVCache;

// dropout's step: train.c's train_step sets it for the step it runs (training 0, as in an
// evaluation, a generation or a test's forward: no dropout); the masks' keys (kernels/random.cuh)
typedef struct {
    int training;
    long long iteration, consumed_samples;   // the step's iteration (1 the first), and the samples before it
    int dp_rank, dp_size;
} DropoutStep;

// The global index of data-parallel rank r's first sample of micro-batch j in a step that starts
// after `consumed` samples: the pretraining sampler's order (a global batch is micro-batch x DP
// consecutive samples per micro-batch, each rank taking its slice), which loader.h reads and the
// dropout masks are keyed by, so that neither DP nor the micro-batch count changes a sample's index.
static long long micro_batch_first_sample(long long consumed, int j, int B, int dp_rank, int dp_size) {
    return consumed + ((long long)j * dp_size + dp_rank) * B;
}

// ----------------------------------------------------------------------------
// the model of one rank

typedef struct GPT {
    GPTConfig cfg;
    int B, T;                          // micro-batch size, rows of a sequence on this rank (the sequence
                                       // length, or with context parallelism its seq_length / CP)
    int seq_length;                    // tokens of a whole sequence
    int tp_rank, tp_size;
    ExpertSlice ep;                    // the experts here (moe.h; expert parallelism: E / EP of them)
    // context parallelism (context_parallel.h): this rank's two chunks of each sequence, the
    // attention across the context-parallel group and its scratch (slice.size 1: none)
    ContextAttention context;
    // sequence parallelism (--sequence-parallel with TP > 1): the rows of a micro-batch's [B*T, C]
    // residual stream (and of the LayerNorms around it) are split over the tensor ranks, this rank
    // holding residual_rows = B*T / TP of them from first_residual_row on; without: all B*T from 0
    int sequence_parallel, residual_rows, first_residual_row;
    int first_layer, num_local_layers; // chunk 0's first layer; the layers of all this rank's chunks
    int num_chunks, chunk_layers;      // model chunks on this rank (virtual pipeline stages; 1: plain 1F1B), layers of each
    int round_layers;                  // the model's layers / num_chunks: chunk c starts c x this after chunk 0
    int is_first_stage, is_last_stage; // this rank holds the embedding (its chunk 0) / the head (its last chunk)
    // per tensor-rank sizes
    int heads_local, hidden_local, ffn_local;        // hidden_local = heads_local * head size
    int head_size, groups_local;                     // groups_local: this rank's key/value heads (query_groups / TP)
    int qkv_local, fc_local;                         // the QKV's and fc1's output features here: (heads + 2 groups)
                                                     // x head size, and ffn_local (x 2 with SwiGLU: [gate | up])
    int vocab_start, vocab_local, vocab_valid_local; // rows of the word embedding held here
    // tensor table and flat buffers
    TensorDesc* tensors;
    int num_tensors;
    int wte, wpe, lne_w, lne_b, lnf_w, lnf_b;        // table indices (-1: not on this stage, or no such tensor)
    int output;                                      // the head's matrix: wte (tied), or the output layer's
    LayerTensors* layer_tensors;                     // [num_local_layers]
    size_t num_params;                               // elements of this rank's tensors
    size_t num_params_padded;                        // the flat buffers' length (each region padded: ZeRO shards)
    // The flat buffers hold two regions (data_parallel.h shards each over its own group): the
    // dense parameters, padded to a multiple of DP x CP shards, then from expert_params_start the
    // experts', padded to a multiple of their expert-data-parallel group's (none: the two are
    // equal); each shard a multiple of shard_multiple elements
    size_t expert_params_start, flat_length;         // (flat_length: where the next tensor goes)
    int dense_pad_multiple;                          // DP x CP
    int shard_multiple;                              // 1, or with 8-bit Adam states a quantization block
                                                     // (data_parallel.h zero_shard_multiple)
    BuildTarget build;                               // the build laid out: this_build(), or in a dry run's
                                                     // plan the other one (floatX of 2 or 4 bytes)
    floatX* params;                                  // what the kernels read
    float* grads;                                    // fp32 gradients, accumulated over micro-batches
    // the buffers' lengths: num_params_padded each (the whole flat buffers), or with ZeRO-2 (gradients)
    // and ZeRO-3 (parameters) windows onto the layers in flight, which zero.h plans (zero_plan_windows)
    // and moves the tensors' param_at / grad_at within
    size_t params_length, grads_length;
    int zero_stage, zero3_places;                    // --zero-stage (1: ZeRO-1), ZeRO-3's layer places (zero.h)
    // activation arena
    int num_slots;                                   // micro-batches in flight, over all chunks (the schedule's count)
    int* chunk_slots;                                // [num_chunks]: how many of them each chunk has, in chunk order
    MicroBatchActivations* slots;
    int longest_chunk;                               // layers in the longest recomputed chunk (0: none)
    LayerActivations* recompute_layers;              // [longest_chunk] scratch of the chunk being recomputed
    floatX* recomputed_att;                          // selective: the one [B, heads, T, T] every layer's att points to
    floatX* logits;                                  // last stage: head_logits x [B*T, vocab_local], a micro-batch's
                                                     // in each (logits_of); generation's and the tests' in the first
    int head_logits;                                 // micro-batches whose dlogits the head keeps at once (1; more
                                                     // where interleaving's last group is short: pipeline.h)
    int logits_hold_gradient;                        // of them, those whose forward wrote dlogits (a backward follows)
    float *ce_max, *ce_local_max, *ce_sums, *losses, *host_losses;
    double* loss_sum;   // last stage: the step's micro-batch mean losses, added on the device
    floatX *dres, *dbuf_a, *dbuf_b;                  // backward scratch, reused layer after layer
    floatX* whole_rows;                              // sequence parallelism: [B*T, C], the whole rows a tensor-
                                                     // parallel matmul reads or writes, gathered or to be scattered
    floatX* att_scratch;
    // MoE layers' scratch, shared by the layers (moe.h): the experts' input rows [N k, C] and the
    // gradients the backward passes through, the host's copy of a routing's offsets; the step's
    // load-balancing and z losses (device: [2]); the forward's dloss x N, the micro-batch's share
    // of the step's gradient (the MoE losses' weight); set while a backward recomputes a forward
    floatX *moe_xs, *moe_dys, *moe_dxs, *moe_dfch, *moe_dfch_act, *moe_dlogits, *moe_dx;
    float* moe_dweight;
    double* moe_loss_sums;
    int* moe_host_offsets;
    // expert parallelism (EP > 1): the rows the experts here receive (expert_rows_max of them), their
    // inputs, their outputs (the backward: the outputs' gradients) and their inputs' gradients; the
    // host's copy of a layer's exchange (moe.h's expert_rows_plan: received [EP x local], offsets [local + 1])
    floatX *expert_xs, *expert_ys, *expert_dxs;
    int *expert_received, *expert_offsets;
    long long* moe_tokens;   // host [num_local_layers x E]: the tokens routed to each expert in this step
    long long moe_dropped;   // host: the choices dropped over the experts' capacity in this step
    float moe_loss_scale;
    int recomputing;
    int weights_deferred;   // ZB-H1's backward: the linear layers' weight gradients wait for the W pass (layers.h)
    float* column_partials;                          // the GPU build's column reductions' partial sums
    void* arena;
    size_t arena_bytes;
    size_t slot_bytes;                               // activation bytes of the largest slot (one micro-batch in
                                                     // flight through one chunk)
    size_t recompute_bytes;                          // the recomputation scratch (part of arena_bytes)
    size_t workspace_bytes;                          // the arena after the slots: backward scratch, attention
                                                     // scratch, column partials, logits and cross-entropy
                                                     // (part of arena_bytes)
    // the step's hooks (data_parallel.h sets them; NULL: nothing to do): the backward says when every
    // gradient of `layer` and above is final for this micro-batch (the final LayerNorm's layer
    // is num_layers), so the overlapped DP reduction may take them; the forward says it is about
    // to read `layer`'s parameters (-1: the embedding's), which the overlapped ZeRO all-gather
    // may still be bringing in
    void (*on_gradients_final)(int layer);
    void (*on_parameters_needed)(int layer);
    // ZeRO-3 (zero.h sets it; NULL: into m->params at the tensor's offset): where a tensor's values go
    // when they are set whole (gpt_init_params, a checkpoint's load), the parameters being sharded
    void (*on_tensor_values)(struct GPT* m, int id, const float* host);
    // generation (NULL in training): the forward runs rows [pos0, pos0 + B x T) of one sequence
    // against this cache (gpt_decode_begin)
    KVCache* kv_cache;
    DropoutStep dropout;
} GPT;

static floatX* param_of(const GPT* m, int id) { return id < 0 ? NULL : m->params + m->tensors[id].param_at; }
static float* grad_of(const GPT* m, int id) { return id < 0 ? NULL : m->grads + m->tensors[id].grad_at; }

// a tensor's names: ours (Megatron's) and transformers' GPT-2 and Bloom ones, for the export
typedef struct {
    char ours[128], hf[96], bloom[96], llama[96];
} TensorNames;

static TensorNames names_with_suffix(const TensorNames* n, const char* suffix) {
    TensorNames out;
    int a = snprintf(out.ours, sizeof(out.ours), "%s%s", n->ours, suffix);
    int b = snprintf(out.hf, sizeof(out.hf), "%s%s", n->hf, n->hf[0] ? suffix : "");
    int c = snprintf(out.bloom, sizeof(out.bloom), "%s%s", n->bloom, n->bloom[0] ? suffix : "");
    int d = snprintf(out.llama, sizeof(out.llama), "%s%s", n->llama, n->llama[0] ? suffix : "");
    if (a >= (int)sizeof(out.ours) || b >= (int)sizeof(out.hf) || c >= (int)sizeof(out.bloom) || d >= (int)sizeof(out.llama))
        fail("tensor name too long: %s%s", n->ours, suffix);
    return out;
}

// the whole tensor's row of this rank's local row r (a plain row split: row_start + r)
static int whole_row(const TensorDesc* t, int r) {
    int piece = t->local_rows / t->row_parts, block = t->rows / t->row_parts;
    return r / piece * block + t->row_start + r % piece;
}

static int add_tensor(GPT* m, int capacity, TensorNames names, int layer, int rows, int cols,
                      int split_axis, int init, float init_std, int row_parts) {
    if (m->num_tensors >= capacity) fail("tensor table overflow: more than %d tensors", capacity);
    TensorDesc* t = &m->tensors[m->num_tensors];
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%s", names.ours);
    snprintf(t->hf_name, sizeof(t->hf_name), "%s", names.hf);
    snprintf(t->bloom_name, sizeof(t->bloom_name), "%s", names.bloom);
    snprintf(t->llama_name, sizeof(t->llama_name), "%s", names.llama);
    t->layer = layer;
    t->rows = rows;
    t->cols = cols;
    t->split_axis = split_axis;
    t->row_parts = split_axis == 0 ? row_parts : 1;
    t->weight_decay = cols > 1;   // Megatron: no decay on biases and LayerNorm (1-d tensors)
    t->init = init;
    t->init_std = init_std;
    t->valid_rows = rows;
    t->row_start = split_axis == 0 ? m->tp_rank * (rows / t->row_parts / m->tp_size) : 0;
    t->local_rows = split_axis == 0 ? rows / m->tp_size : rows;
    t->col_start = split_axis == 1 ? m->tp_rank * (cols / m->tp_size) : 0;
    t->local_cols = split_axis == 1 ? cols / m->tp_size : cols;
    t->numel = (size_t)t->local_rows * t->local_cols;
    t->offset = t->param_at = t->grad_at = m->flat_length;
    m->flat_length += t->numel;
    m->num_params += t->numel;
    return m->num_tensors++;
}

// a normalization's weight [C], and with LayerNorm its bias (RMSNorm has none: -1)
static int add_norm(GPT* m, int capacity, TensorNames prefix, int layer, int C, int* bias_id) {
    int w = add_tensor(m, capacity, names_with_suffix(&prefix, ".weight"), layer, C, 1, -1, INIT_ONES, 0.0f, 1);
    *bias_id = m->cfg.normalization == NORM_RMSNORM
                   ? -1
                   : add_tensor(m, capacity, names_with_suffix(&prefix, ".bias"), layer, C, 1, -1, INIT_ZEROS, 0.0f, 1);
    return w;
}

// a linear layer [out, in] and, where `bias`, its bias [out] (else -1); split_axis 0 =
// column-parallel (output features split, bias split too), 1 = row-parallel (input features
// split, bias replicated); row_parts: see TensorDesc
static int add_linear(GPT* m, int capacity, TensorNames prefix, int layer, int out, int in,
                      int split_axis, float std, int bias, int* bias_id, int row_parts) {
    int w = add_tensor(m, capacity, names_with_suffix(&prefix, ".weight"), layer, out, in, split_axis, INIT_NORMAL, std,
                       row_parts);
    *bias_id = !bias ? -1
                     : add_tensor(m, capacity, names_with_suffix(&prefix, ".bias"), layer, out, 1, split_axis == 0 ? 0 : -1,
                                  INIT_ZEROS, 0.0f, row_parts);
    m->tensors[w].hf_transpose = 1;
    return w;
}

// names of a part of transformer layer l (Bloom names a layer's parts as Megatron does)
static TensorNames layer_part(int l, const char* ours, const char* hf, const char* llama) {
    TensorNames n;
    snprintf(n.ours, sizeof(n.ours), "language_model.encoder.layers.%d.%s", l, ours);
    snprintf(n.hf, sizeof(n.hf), "transformer.h.%d.%s", l, hf);
    if (!hf[0]) n.hf[0] = '\0';   // GPT-2 has none
    snprintf(n.bloom, sizeof(n.bloom), "transformer.h.%d.%s", l, ours);
    snprintf(n.llama, sizeof(n.llama), "model.layers.%d.%s", l, llama);
    return n;
}

// Is layer l a mixture of experts? Megatron-LM's --moe-layer-freq N: layers 0, N, 2N, ...
static int is_moe_layer(const GPTConfig* c, int l) { return c->num_experts > 0 && l % c->moe_layer_freq == 0; }

// Do the MoE layers drop choices over their experts' capacity (--moe-expert-capacity-factor)?
static int drops_choices(const GPTConfig* c) { return c->num_experts > 0 && c->moe_expert_capacity_factor > 0.0f; }

// An MLP of width F named `ours` (Megatron's dense_h_to_4h and dense_4h_to_h under it), GPT-2's
// fc1 and fc2 names (`gpt2_fc`, `gpt2_proj`: "" where GPT-2 has none) and the Llama-family `llama`
// prefix's gate_up_proj and down_proj; split over the tensor ranks as Megatron-LM splits the MLP
static MlpTensors add_mlp(GPT* m, int capacity, int l, const char* ours, const char* gpt2_fc, const char* gpt2_proj,
                          const char* llama, int F, float std, float out_std) {
    int C = m->cfg.hidden_size, glu = m->cfg.swiglu ? 2 : 1;
    char a[64], b[64], c[64], d[64];   // (short enough for layer_part's names)
    snprintf(a, sizeof a, "%s.dense_h_to_4h", ours);
    snprintf(b, sizeof b, "%s.dense_4h_to_h", ours);
    snprintf(c, sizeof c, "%s.gate_up_proj", llama);
    snprintf(d, sizeof d, "%s.down_proj", llama);
    MlpTensors t;
    int bias = !m->cfg.disable_bias_linear;
    t.fc_w = add_linear(m, capacity, layer_part(l, a, gpt2_fc, c), l, glu * F, C, 0, std, bias, &t.fc_b, glu);
    t.fcproj_w = add_linear(m, capacity, layer_part(l, b, gpt2_proj, d), l, C, F, 1, out_std, bias, &t.fcproj_b, 1);
    t.width = F / m->tp_size;
    return t;
}

// The QKV weight's rows, Megatron's layout: per query group [its NH/G query heads | its key head
// | its value head], HS rows each (kernels/attention.cuh's qkv_group_index), so a row split over the tensor
// ranks gives each whole groups. The MLP's first weight: F rows, or with SwiGLU [gate; up], 2F.
// Biases: on every linear layer, none with --disable-bias-linear, except the QKV's with
// --add-qkv-bias (Megatron-LM's; Qwen2's attention).
static void add_layer(GPT* m, int capacity, int l, LayerTensors* t) {
    const GPTConfig* c = &m->cfg;
    int C = c->hidden_size, F = c->ffn_hidden_size, HS = C / c->num_attention_heads, G = query_groups(c);
    int bias = !c->disable_bias_linear, qkv_bias = bias || c->add_qkv_bias;
    // output projections: GPT-2's scaled init, std / sqrt(2 * num_layers) (Radford et al.
    // 2019, §2.3; Megatron's scaled_init_method_normal)
    float std = c->init_method_std, out_std = c->init_method_std / sqrtf(2.0f * c->num_layers);
    t->ln1_w = add_norm(m, capacity, layer_part(l, "input_layernorm", "ln_1", "input_layernorm"), l, C, &t->ln1_b);
    t->qkv_w = add_linear(m, capacity, layer_part(l, "self_attention.query_key_value", "attn.c_attn", "self_attn.qkv_proj"),
                          l, (c->num_attention_heads + 2 * G) * HS, C, 0, std, qkv_bias, &t->qkv_b, 1);
    m->tensors[t->qkv_w].hf_qkv = 1;
    if (t->qkv_b >= 0) m->tensors[t->qkv_b].hf_qkv = 1;
    t->proj_w = add_linear(m, capacity, layer_part(l, "self_attention.dense", "attn.c_proj", "self_attn.o_proj"), l, C, C,
                           1, out_std, bias, &t->proj_b, 1);
    t->ln2_w = add_norm(m, capacity, layer_part(l, "post_attention_layernorm", "ln_2", "post_attention_layernorm"), l, C,
                        &t->ln2_b);
    MlpTensors none = {-1, -1, -1, -1, 0};
    t->mlp = t->shared = none;
    t->router_w = t->shared_gate_w = -1;
    if (!is_moe_layer(c, l)) {
        t->mlp = add_mlp(m, capacity, l, "mlp", "mlp.c_fc", "mlp.c_proj", "mlp", F, std, out_std);
        return;
    }
    // a mixture of experts (moe.h): Megatron-LM's router and experts (the Hugging Face names are
    // Qwen2-MoE's, hf.h renames them for Mixtral), each expert an MLP of --moe-ffn-hidden-size, in
    // the flat buffers' expert region (add_layer_experts)
    int E = c->num_experts;
    t->router_w = add_tensor(m, capacity, layer_part(l, "mlp.router.weight", "", "mlp.gate.weight"), l, E, C, -1,
                             INIT_NORMAL, std, 1);
    if (c->moe_shared_expert_intermediate_size > 0) {
        t->shared = add_mlp(m, capacity, l, "mlp.shared_expert", "", "", "mlp.shared_expert",
                            c->moe_shared_expert_intermediate_size, std, out_std);
        t->shared_gate_w = add_tensor(m, capacity, layer_part(l, "mlp.shared_expert_gate.weight", "",
                                                               "mlp.shared_expert_gate.weight"), l, 1, C, -1, INIT_NORMAL, std, 1);
    }
}

// The experts of MoE layer l held here (ep.local of them, from expert ep.first on: their names
// and initial values are the one-process model's experts')
static void add_layer_experts(GPT* m, int capacity, int l, LayerTensors* t) {
    const GPTConfig* c = &m->cfg;
    float std = c->init_method_std, out_std = c->init_method_std / sqrtf(2.0f * c->num_layers);
    t->experts = (MlpTensors*)mallocCheck(m->ep.local * sizeof(MlpTensors));
    for (int e = 0; e < m->ep.local; e++) {
        char name[64];
        snprintf(name, sizeof name, "mlp.experts.%d", m->ep.first + e);
        t->experts[e] = add_mlp(m, capacity, l, name, "", "", name, c->moe_ffn_hidden_size, std, out_std);
    }
}

// Local layer i of a rank: in chunk i / chunk_layers, which starts round_layers after the one
// before it (the interleaved schedule's virtual stage c x PP + rank holds the c-th round of the
// layers: Narayanan et al. 2021, §2.2). With one chunk, the stage's layers are consecutive.
static int chunk_of_layer(const GPT* m, int i) { return m->num_chunks <= 1 ? 0 : i / m->chunk_layers; }
static int global_layer(const GPT* m, int i) {
    return m->first_layer + chunk_of_layer(m, i) * m->round_layers + (m->num_chunks <= 1 ? i : i % m->chunk_layers);
}
// the embedding is chunk 0's of the first stage, the head the last chunk's of the last stage
static int chunk_holds_embedding(const GPT* m, int chunk) { return m->is_first_stage && chunk == 0; }
static int chunk_holds_head(const GPT* m, int chunk) { return m->is_last_stage && chunk == m->num_chunks - 1; }

// The one list of the model's tensors, in canonical order: embedding, layers, final norm
// (also GPT2LMHeadModel's state_dict order; a rank's chunks hold increasing layers, so their
// tensors keep that order).
static void build_tensor_table(GPT* m) {
    const GPTConfig* c = &m->cfg;
    long long per_layer = 12 + (c->num_experts > 0 ? 4LL * c->num_experts + 7 : 0);   // a MoE layer's router, experts, shared
    long long entries = 8 + per_layer * m->num_local_layers;   // (in an int, 2^31 layers once wrapped it)
    if (entries > INT_MAX) fail("the tensor table of %d layers: more than %d tensors", m->num_local_layers, INT_MAX);
    int C = c->hidden_size, capacity = (int)entries;
    m->tensors = (TensorDesc*)callocCheck(capacity, sizeof(TensorDesc));
    m->layer_tensors = (LayerTensors*)callocCheck(m->num_local_layers, sizeof(LayerTensors));
    m->wte = m->wpe = m->lne_w = m->lne_b = m->lnf_w = m->lnf_b = m->output = -1;
    float std = c->init_method_std;
    int tied = !c->untie_embeddings_and_output_weights;
    // the word embedding sits on the first stage, and (tied) as the output layer on the last
    if (m->is_first_stage || (m->is_last_stage && tied)) {
        TensorNames wte = {"language_model.embedding.word_embeddings.weight", "transformer.wte.weight",
                           "transformer.word_embeddings.weight", "model.embed_tokens.weight"};
        m->wte = add_tensor(m, capacity, wte, -1, c->padded_vocab_size, C, 0, INIT_NORMAL, std, 1);
        m->tensors[m->wte].valid_rows = c->vocab_size;
        m->tensors[m->wte].tied_copy = !m->is_first_stage;
    }
    if (m->is_first_stage) {
        TensorNames wpe = {"language_model.embedding.position_embeddings.weight", "transformer.wpe.weight", "", ""};
        TensorNames lne = {"language_model.embedding.layernorm", "", "transformer.word_embeddings_layernorm", ""};   // BLOOM's
        if (c->position_embedding_type == POSITION_LEARNED_ABSOLUTE)   // ALiBi and rope have no position table
            m->wpe = add_tensor(m, capacity, wpe, -1, c->max_position_embeddings, C, -1, INIT_NORMAL, std, 1);
        if (c->embed_layernorm) m->lne_w = add_norm(m, capacity, lne, -1, C, &m->lne_b);
    }
    for (int i = 0; i < m->num_local_layers; i++) add_layer(m, capacity, global_layer(m, i), &m->layer_tensors[i]);
    TensorNames lnf = {"language_model.encoder.final_layernorm", "transformer.ln_f", "transformer.ln_f", "model.norm"};
    if (m->is_last_stage) m->lnf_w = add_norm(m, capacity, lnf, c->num_layers, C, &m->lnf_b);
    // the output layer: the word embedding (tied), or with --untie-embeddings-and-output-weights a
    // vocab-parallel matrix of its own, on the last stage (after the final norm in the table: the
    // layer the head's gradients are final at)
    TensorNames out = {"language_model.output_layer.weight", "", "", "lm_head.weight"};
    if (m->is_last_stage && !tied) {
        m->output = add_tensor(m, capacity, out, c->num_layers, c->padded_vocab_size, C, 0, INIT_NORMAL, std, 1);
        m->tensors[m->output].valid_rows = c->vocab_size;
    }
    if (m->is_last_stage && tied) m->output = m->wte;
    // the experts last, a region of their own: summed over their expert-data-parallel group, not DP x CP
    size_t dense_pad = (size_t)m->dense_pad_multiple * m->shard_multiple;
    m->flat_length = CEIL_DIV(m->flat_length, dense_pad) * dense_pad;
    m->expert_params_start = m->flat_length;
    for (int i = 0; i < m->num_local_layers; i++)
        if (is_moe_layer(c, global_layer(m, i))) add_layer_experts(m, capacity, global_layer(m, i), &m->layer_tensors[i]);
    size_t experts = m->flat_length - m->expert_params_start, pad = (size_t)m->ep.data_parallel * m->shard_multiple;
    m->num_params_padded = m->expert_params_start + CEIL_DIV(experts, pad) * pad;
    m->params_length = m->grads_length = m->num_params_padded;   // (ZeRO-2/3 may make them windows)
}

// ----------------------------------------------------------------------------
// initialization: a pure function of (seed, tensor name, element index)
// A counter-based generator (SplitMix64's finalizer as a hash) turns the triple into two
// uniforms, Box-Muller turns them into a normal. No state is carried from one element to
// the next, so any slice of any tensor can be initialized alone, identically in every layout.

static uint64_t hash_name(const char* s) {  // FNV-1a
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static float normal_at(uint64_t seed, uint64_t tensor_key, uint64_t index) {
    uint64_t r1 = splitmix64(seed ^ splitmix64(tensor_key ^ splitmix64(index)));
    uint64_t r2 = splitmix64(r1);
    double u1 = ((r1 >> 11) + 0.5) * (1.0 / 9007199254740992.0);   // (0, 1), 53 bits
    double u2 = (r2 >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

static void init_tensor_slice(const TensorDesc* t, uint64_t seed, float* out) {
    uint64_t key = hash_name(t->name);
    #pragma omp parallel for   // each value depends on its index only: any split is exact
    for (int r = 0; r < t->local_rows; r++) {
        int row = whole_row(t, r);
        for (int c = 0; c < t->local_cols; c++) {
            size_t whole_index = (size_t)row * t->cols + (t->col_start + c);
            float v = 0.0f;
            if (t->init == INIT_ONES) v = 1.0f;
            else if (t->init == INIT_NORMAL && row < t->valid_rows) v = t->init_std * normal_at(seed, key, whole_index);
            out[(size_t)r * t->local_cols + c] = v;
        }
    }
}

// tensor `id`'s values, host[numel], into the parameters (wherever ZeRO-3 keeps them)
static void set_tensor_values(GPT* m, int id, const float* host) {
    const TensorDesc* t = &m->tensors[id];
    if (m->on_tensor_values) m->on_tensor_values(m, id, host);
    else floats_to_dev_floatX(m->params + t->offset, host, t->numel);
}

static void gpt_init_params(GPT* m) {
    for (int i = 0; i < m->num_tensors; i++) {
        const TensorDesc* t = &m->tensors[i];
        float* host = (float*)mallocCheck(t->numel * sizeof(float));
        init_tensor_slice(t, m->cfg.seed, host);
        set_tensor_values(m, i, host);
        free(host);
    }
}

// ----------------------------------------------------------------------------
// activation recomputation (Chen et al. 2016; Megatron-LM's --recompute-granularity full)
// The layers of a model chunk (a stage's, or with interleaving each of its virtual stages', as
// Megatron-LM recomputes each of its model chunks alone) are cut into recomputed chunks. From a
// recomputed chunk's forward a micro-batch keeps only the chunk's output, which is the next
// chunk's input; everything else the chunk computes goes to one scratch shared by all
// micro-batches, and the chunk's backward first runs its forward again to fill that scratch.
// uniform: chunks of N layers (the last one shorter when N does not divide the model chunk's
// layers, as Megatron-LM cuts them); block: the model chunk's first N layers are chunks of one,
// the others keep all their activations. Recomputation changes no value: the same kernels see
// the same inputs, and dropout draws the same masks (kernels/random.cuh: keyed by coordinates).

// the recomputed chunk [*first, *end) that local layer i is in; 0: layer i is not recomputed
static int recompute_chunk(const GPT* m, int i, int* first, int* end) {
    int n = m->cfg.recompute_num_layers, model_chunk_first = 0, L = m->num_local_layers;
    if (m->num_chunks > 1) {   // within its model chunk
        model_chunk_first = chunk_of_layer(m, i) * m->chunk_layers;
        L = m->chunk_layers;
        i -= model_chunk_first;
    }
    if (m->cfg.recompute_method == RECOMPUTE_UNIFORM) {
        *first = model_chunk_first + i / n * n;
        *end = model_chunk_first + (i / n * n + n < L ? i / n * n + n : L);
        return 1;
    }
    if (m->cfg.recompute_method == RECOMPUTE_BLOCK && i < n) {
        *first = model_chunk_first + i;
        *end = *first + 1;
        return 1;
    }
    return 0;
}

// the last local layer of local layer i's model chunk
static int model_chunk_last(const GPT* m, int i) {
    return m->num_chunks <= 1 ? m->num_local_layers - 1 : (chunk_of_layer(m, i) + 1) * m->chunk_layers - 1;
}

// Does a micro-batch keep local layer i's output until its backward? A layer that is not
// recomputed keeps everything; a recomputed one only when something after its chunk reads it:
// the next layer, or the final LayerNorm (the head's model chunk). A stage's output that goes to
// the next stage is sent right after the forward in plain 1F1B, and the scratch may hold it till
// then; the interleaved schedule runs a backward (which may recompute into the scratch) between a
// forward and the exchange that sends its output, so there the slot keeps it.
static int keeps_output(const GPT* m, int i) {
    int first, end;
    if (!recompute_chunk(m, i, &first, &end)) return 1;
    if (i == model_chunk_last(m, i)) return chunk_holds_head(m, chunk_of_layer(m, i)) || m->num_chunks > 1;
    return i == end - 1;
}

// Does some recomputed layer at position k of its chunk leave its output in the scratch?
static int scratch_holds_output(const GPT* m, int k) {
    int first, end;
    for (int i = 0; i < m->num_local_layers; i++)
        if (recompute_chunk(m, i, &first, &end) && i - first == k && !keeps_output(m, i)) return 1;
    return 0;
}

static int longest_recomputed_chunk(const GPT* m) {
    int longest = 0, first, end;
    for (int i = 0; i < m->num_local_layers; i++)
        if (recompute_chunk(m, i, &first, &end) && end - first > longest) longest = end - first;
    return longest;
}

// ----------------------------------------------------------------------------
// the activation arena
// Laid out twice: once with no base to add up its size, once to hand out the pointers.
// floatX's size is the arena's, not the compiler's: a dry run may lay out the other build's.

typedef struct {
    char* base;
    size_t used;
    int floatx_bytes;   // the model's build's
} Arena;

static void* arena_take(Arena* a, size_t bytes) { return region_take(a->base, &a->used, bytes); }   // (256-aligned)
#define TAKE(arena, type, count) ((type*)arena_take((arena), (size_t)(count) * sizeof(type)))
static floatX* take_floatX(Arena* a, size_t count) { return (floatX*)arena_take(a, count * a->floatx_bytes); }

// Does the backward recompute the attention core, the probabilities softmax(q k^T) (selective
// recomputation)? Only where a layer would keep them: the fused attention (`flash`) keeps none
// (its backward recomputes them from the log-sum-exp anyway), so there selective changes nothing.
// The one rule, for the model's layout and backward and for the FLOPs count (config.h).
static int selective_recomputes_core(const GPTConfig* c, int flash) { return c->recompute_attention_core && !flash; }
// Does each query row keep the log-sum-exp of its scores rather than its probabilities? The fused
// attention does, and so does context parallelism's (its blocks merge by it, context_parallel.h).
static int attention_keeps_lse(const GPT* m) { return m->build.flash_attention || m->context.slice.size > 1; }
static int recomputes_attention_core(const GPT* m) { return selective_recomputes_core(&m->cfg, attention_keeps_lse(m)); }

// one layer's activations; its output (res3) only when `with_output`. The tensor-parallel
// region's (qkv, atty, att or lse, fch, fch_act) hold every row and this rank's heads or MLP
// columns; the residual stream and the LayerNorms' (ln1, res2, ln2, res3, their statistics)
// this rank's residual rows: all of them, or 1/TP with sequence parallelism (Korthikanti et al.
// 2022, §4.2.2: the 10sbh of the LayerNorm and residual regions become 10sbh / t)
// the statistics a normalization keeps for its backward: LayerNorm's mean and rstd, RMSNorm's
// rstd alone (mean NULL)
static void layout_norm_stats(const GPT* m, Arena* a, float** mean, float** rstd, size_t rows) {
    *mean = m->cfg.normalization == NORM_RMSNORM ? NULL : TAKE(a, float, rows);
    *rstd = TAKE(a, float, rows);
}

// a MoE layer's own activations: the routing, the router's logits, the experts' outputs and the
// shared expert's (the experts' fc1 rows are fch's, laid out N k rows long by layout_layer)
static void layout_moe_layer(GPT* m, Arena* a, LayerActivations* L) {
    const GPTConfig* c = &m->cfg;
    size_t N = (size_t)m->B * m->T, C = c->hidden_size, Fs = c->moe_shared_expert_intermediate_size, E = c->num_experts;
    size_t k = c->moe_router_topk;
    size_t bytes = moe_routing_layout(&L->route, NULL, (int)N, (int)E, (int)k, c->moe_router_pre_softmax);
    moe_routing_layout(&L->route, (char*)arena_take(a, bytes), (int)N, (int)E, (int)k, c->moe_router_pre_softmax);
    L->route.capacity_factor = c->moe_expert_capacity_factor, L->route.drop_policy = c->moe_token_drop_policy;
    L->router_logits = take_floatX(a, N * E);
    L->moe_ys = take_floatX(a, N * k * C);
    if (!Fs) return;
    L->shared_fch = take_floatX(a, N * (c->swiglu ? 2 : 1) * Fs);
    L->shared_fch_act = take_floatX(a, N * Fs);
    L->shared_y = take_floatX(a, N * C);
    L->shared_gate = take_floatX(a, N);
}

// The rows the experts here run in one MoE layer, at most: this rank's N k choices, or with
// expert parallelism (dropless) every rank of the group's choices of these experts, N min(k,
// local) from each (a token goes to k different experts); with a capacity factor no more than
// each expert's capacity from each rank (moe.h)
static size_t expert_rows_max(const GPT* m) {
    const GPTConfig* c = &m->cfg;
    size_t N = (size_t)m->B * m->T, k = c->moe_router_topk, P = m->ep.size, held = m->ep.local;
    size_t rows = P <= 1 ? N * k : P * N * (k < held ? k : held);
    if (c->moe_expert_capacity_factor > 0.0f) {
        size_t capped = P * held * expert_capacity((int)N, (int)k, c->num_experts, c->moe_expert_capacity_factor);
        rows = capped < rows ? capped : rows;
    }
    return rows;
}

// the rows and width of a layer's fc1 output: the dense MLP's N rows of fc_local, or a MoE
// layer's expert rows of its experts' width (x 2 with SwiGLU)
static size_t mlp_rows(const GPT* m, int moe) { return moe ? expert_rows_max(m) : (size_t)m->B * m->T; }
static size_t mlp_width(const GPT* m, int moe) { return moe ? (size_t)m->cfg.moe_ffn_hidden_size : (size_t)m->ffn_local; }
static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

static void layout_layer(GPT* m, Arena* a, LayerActivations* L, int with_output, int moe) {
    size_t N = (size_t)m->B * m->T, R = m->residual_rows, C = m->cfg.hidden_size;
    size_t Cl = m->hidden_local, NHl = m->heads_local;
    L->ln1 = take_floatX(a, R * C);
    layout_norm_stats(m, a, &L->ln1_mean, &L->ln1_rstd, R);
    L->qkv = take_floatX(a, N * m->qkv_local);
    L->atty = take_floatX(a, N * Cl);
    if (attention_keeps_lse(m)) L->lse = TAKE(a, float, (size_t)m->B * NHl * m->T);    // one per row: recomputes p
    else if (recomputes_attention_core(m)) L->att = m->recomputed_att;                 // selective: shared, refilled
    else L->att = take_floatX(a, (size_t)m->B * NHl * m->T * m->T);                    // the probabilities
    L->res2 = take_floatX(a, R * C);
    L->ln2 = take_floatX(a, R * C);
    layout_norm_stats(m, a, &L->ln2_mean, &L->ln2_rstd, R);
    // (moe -1: room for either kind, the recomputation's scratch of a model with both)
    size_t act = moe < 0 ? max_size(mlp_rows(m, 0) * mlp_width(m, 0), mlp_rows(m, 1) * mlp_width(m, 1))
                         : mlp_rows(m, moe) * mlp_width(m, moe);
    L->fch = take_floatX(a, (m->cfg.swiglu ? 2 : 1) * act);
    L->fch_act = take_floatX(a, act);
    L->res3 = with_output ? take_floatX(a, R * C) : NULL;
    if (moe) layout_moe_layer(m, a, L);
}

// the bytes of one layer's activations, its output included, as layout_layer lays them out
// (the planner's line: what sequence parallelism saves a layer)
static size_t layer_activation_bytes(GPT* m) {
    Arena sizing = {NULL, 0, m->build.floatx_bytes};
    LayerActivations L;
    layout_layer(m, &sizing, &L, 1, is_moe_layer(&m->cfg, 0));
    return sizing.used;
}

// the recomputation's scratch: of the chunk being recomputed (full), one layer's activations
// per position in a chunk; or (selective) one layer's attention probabilities, which every
// layer of every micro-batch refills in its backward
static void layout_recompute_scratch(GPT* m, Arena* a) {
    size_t before = a->used;
    for (int k = 0; k < m->longest_chunk; k++)
        layout_layer(m, a, &m->recompute_layers[k], scratch_holds_output(m, k), m->cfg.num_experts > 0 ? -1 : 0);
    if (recomputes_attention_core(m)) m->recomputed_att = take_floatX(a, (size_t)m->B * m->heads_local * m->T * m->T);
    m->recompute_bytes = a->used - before;
}

// a slot of model chunk s->chunk: its layers [s->first, s->end), the embedding's or the head's
// activations where the chunk holds them
static void layout_slot(GPT* m, Arena* a, MicroBatchActivations* s) {
    size_t N = (size_t)m->B * m->T, R = m->residual_rows, C = m->cfg.hidden_size;
    s->tokens = TAKE(a, int, N);
    s->targets = TAKE(a, int, N);
    s->input = take_floatX(a, R * C);
    if (m->num_chunks > 1 && !chunk_holds_head(m, s->chunk)) s->dout = take_floatX(a, R * C);
    if (chunk_holds_embedding(m, s->chunk) && m->cfg.embed_layernorm) {
        s->embed_ln = take_floatX(a, R * C);
        layout_norm_stats(m, a, &s->embed_ln_mean, &s->embed_ln_rstd, R);
    }
    for (int i = s->first; i < s->end; i++) {
        int first, end;
        if (!recompute_chunk(m, i, &first, &end)) {
            layout_layer(m, a, &s->layers[i], 1, is_moe_layer(&m->cfg, global_layer(m, i)));
            continue;
        }
        s->layers[i] = m->recompute_layers[i - first];   // in the shared scratch ...
        if (keeps_output(m, i)) s->layers[i].res3 = take_floatX(a, R * C);   // ... but for its output
    }
    if (chunk_holds_head(m, s->chunk)) {
        s->lnf = take_floatX(a, R * C);
        layout_norm_stats(m, a, &s->lnf_mean, &s->lnf_rstd, R);
    }
}

// the workspace of the column reductions (kernels/embedding.cuh; none on the CPU build), the largest any
// call needs: the LayerNorms' (width C, over the residual rows) and the biases' (widths 3 Cl and
// Fl over every row; C over the residual rows: the row-parallel biases, summed over every row
// without sequence parallelism)
static size_t column_partials_floats(const GPT* m) {
    int N = m->B * m->T, R = m->residual_rows, C = m->cfg.hidden_size;
    const GPTConfig* c = &m->cfg;
    int Nk = c->num_experts > 0 ? (int)expert_rows_max(m) : N, glu = c->swiglu ? 2 : 1;   // (MoE: TP 1, no SP)
    int rows[6] = {R, N, N, Nk, Nk, N};
    int widths[6] = {C, m->qkv_local, m->fc_local, glu * c->moe_ffn_hidden_size, C, glu * c->moe_shared_expert_intermediate_size};
    size_t floats = layernorm_grad_partials(m->build, R, C);
    for (int i = 0; i < 6; i++) {
        size_t bias = bias_grad_partials(m->build, rows[i], widths[i]);
        floats = bias > floats ? bias : floats;
    }
    return floats;
}

// the MoE layers' shared scratch (see the GPT's fields); the experts' fc1 gradients as wide as the
// widest of the experts' and the shared expert's
static void layout_moe_scratch(GPT* m, Arena* a) {
    const GPTConfig* c = &m->cfg;
    size_t N = (size_t)m->B * m->T, Nk = N * c->moe_router_topk, C = c->hidden_size, glu = c->swiglu ? 2 : 1;
    size_t rows = expert_rows_max(m), act = max_size(rows * c->moe_ffn_hidden_size, N * c->moe_shared_expert_intermediate_size);
    if (m->ep.size > 1) {
        m->expert_xs = take_floatX(a, rows * C);
        m->expert_ys = take_floatX(a, rows * C);
        m->expert_dxs = take_floatX(a, rows * C);
    }
    m->moe_xs = take_floatX(a, Nk * C);
    m->moe_dys = take_floatX(a, Nk * C);
    m->moe_dxs = take_floatX(a, Nk * C);
    m->moe_dfch = take_floatX(a, glu * act);
    m->moe_dfch_act = take_floatX(a, act);
    m->moe_dlogits = take_floatX(a, N * max_size(c->num_experts, 1));
    m->moe_dx = take_floatX(a, N * C);
    m->moe_dweight = TAKE(a, float, Nk);
    m->moe_loss_sums = TAKE(a, double, 2);
}

static void layout_arena(GPT* m, Arena* a) {
    size_t N = (size_t)m->B * m->T, C = m->cfg.hidden_size;
    size_t Fl = m->ffn_local;
    layout_recompute_scratch(m, a);   // first: the slots' recomputed layers point into it
    m->slot_bytes = 0;
    for (int s = 0; s < m->num_slots; s++) {
        size_t before = a->used;
        layout_slot(m, a, &m->slots[s]);
        if (a->used - before > m->slot_bytes) m->slot_bytes = a->used - before;
    }
    // block_backward's two buffers take turns: dbuf_a holds the MLP's gradients (N x Fl) and
    // inputs' (N x C), dbuf_b the QKV gradient (N x (NH + 2G) HS / TP), SwiGLU's (N x 2Fl) and
    // inputs' (N x C)
    size_t qkv = m->qkv_local, swiglu_grad = m->cfg.swiglu ? m->fc_local : 0, wide_a = Fl > C ? Fl : C, before = a->used;
    size_t wide_b = qkv > swiglu_grad ? qkv : swiglu_grad;
    wide_b = wide_b > C ? wide_b : C;
    m->dres = take_floatX(a, (size_t)m->residual_rows * C);
    m->dbuf_a = take_floatX(a, N * wide_a);
    m->dbuf_b = take_floatX(a, N * wide_b);
    if (m->sequence_parallel) m->whole_rows = take_floatX(a, N * C);   // one for every layer and micro-batch
    if (m->context.slice.size > 1) {   // context parallelism's attention: its own scratch (context_parallel.h)
        size_t bytes = context_attention_layout(&m->context, NULL, a->floatx_bytes);
        context_attention_layout(&m->context, (char*)arena_take(a, bytes), a->floatx_bytes);
    } else {
        m->att_scratch = (floatX*)arena_take(a, attention_scratch_bytes(m->build, m->B, m->T, m->heads_local,
                                                                        C / m->cfg.num_attention_heads));
    }
    m->column_partials = TAKE(a, float, column_partials_floats(m));
    if (m->cfg.num_experts > 0) layout_moe_scratch(m, a);
    if (m->is_last_stage) {
        m->logits = take_floatX(a, m->head_logits * N * m->vocab_local);
        m->ce_max = TAKE(a, float, N);
        if (m->tp_size > 1) m->ce_local_max = TAKE(a, float, N);   // a slice's own maxima (head_forward)
        m->ce_sums = TAKE(a, float, 2 * N);
        m->losses = TAKE(a, float, N);
        m->loss_sum = TAKE(a, double, 1);
    }
    m->workspace_bytes = a->used - before;
}

// ----------------------------------------------------------------------------
// build: the tensor table, the flat buffers and the arena of one rank
// chunk_slots: micro-batches in flight per model chunk (what the schedule needs: pipeline.h's
// schedule_slots); pad_multiple: the flat buffers are padded with zeros to a multiple of it (the
// data-parallel size, for ZeRO) times shard_multiple (each ZeRO shard a multiple of it: 1, or
// data_parallel.h's zero_shard_multiple).

// gpt_plan_model: the tensor table and the sizes of the flat buffers and the arena, nothing large
// allocated (so the trainer can check the memory first); gpt_allocate: the buffers, the init.
// build: this_build() for a model to allocate; a plan alone may lay out the other build.
// One pipeline stage: stage `rank` of `size`, holding `chunks` model chunks of num_layers /
// chunks layers each, chunk c from layer first_layer + c x round_layers (round_layers: the
// model's layers / chunks, one trip round the pipeline); with one chunk, layers
// [first_layer, first_layer + num_layers); head_logits: on the last stage, the micro-batches whose
// logits the head keeps at once (pipeline.h's schedule_head_logits; 0: one)
typedef struct {
    int rank, size, first_layer, num_layers, chunks, round_layers, head_logits;
} PipelineStage;

// the even split: every stage num_layers / size of them (a multiple), one chunk
static PipelineStage even_stage(int num_layers, int rank, int size) {
    PipelineStage s = {rank, size, rank * (num_layers / size), num_layers / size, 1, num_layers, 1};
    return s;
}

// the slots, chunk_slots[c] of each model chunk c in chunk order, each for the chunk's local
// layers [c x chunk_layers, (c + 1) x chunk_layers)
static void plan_slots(GPT* m, const int* chunk_slots) {
    m->chunk_slots = (int*)mallocCheck(m->num_chunks * sizeof(int));
    m->num_slots = 0;
    for (int c = 0; c < m->num_chunks; c++) m->num_slots += m->chunk_slots[c] = chunk_slots[c];
    m->slots = (MicroBatchActivations*)callocCheck(m->num_slots, sizeof(MicroBatchActivations));
    for (int c = 0, s = 0; c < m->num_chunks; c++)
        for (int k = 0; k < chunk_slots[c]; k++, s++) {
            MicroBatchActivations* slot = &m->slots[s];
            slot->chunk = c;
            slot->holder = -1;
            slot->first = c * m->chunk_layers;
            slot->end = slot->first + m->chunk_layers;
            slot->layers = (LayerActivations*)callocCheck(m->num_local_layers, sizeof(LayerActivations));
        }
}

static void gpt_plan_model(GPT* m, const GPTConfig* cfg, int B, int T, int tp_rank, int tp_size, ContextSlice cp,
                           CpCommType cp_comm, ExpertSlice ep, PipelineStage stage, const int* chunk_slots,
                           int pad_multiple, int shard_multiple, BuildTarget build) {
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    m->ep = ep;
    m->dense_pad_multiple = pad_multiple;
    m->shard_multiple = shard_multiple;
    m->build = build;
    m->B = B;
    m->seq_length = T;
    m->T = T / cp.size;   // this rank's two chunks of each sequence
    m->tp_rank = tp_rank;
    m->tp_size = tp_size;
    m->dropout.dp_size = 1;   // (off until a step says otherwise)
    // one tensor rank has nothing to split (a checkpoint saved with the switch may be built at TP 1)
    m->sequence_parallel = cfg->sequence_parallel && tp_size > 1;
    if (m->sequence_parallel && (B * m->T) % tp_size != 0)
        fail("sequence parallelism: %d x %d rows do not split over %d tensor ranks", B, m->T, tp_size);
    m->residual_rows = m->sequence_parallel ? B * m->T / tp_size : B * m->T;
    m->first_residual_row = m->sequence_parallel ? tp_rank * m->residual_rows : 0;
    m->first_layer = stage.first_layer;
    m->num_local_layers = stage.num_layers;   // may be 0: a stage that holds only the embedding or the head
    m->num_chunks = stage.chunks;
    m->chunk_layers = stage.num_layers / stage.chunks;
    m->round_layers = stage.round_layers;
    m->is_first_stage = stage.rank == 0;
    m->is_last_stage = stage.rank == stage.size - 1;
    m->head_logits = stage.head_logits > 1 ? stage.head_logits : 1;
    m->heads_local = cfg->num_attention_heads / tp_size;
    m->head_size = cfg->hidden_size / cfg->num_attention_heads;
    m->hidden_local = m->heads_local * m->head_size;
    m->groups_local = query_groups(cfg) / tp_size;   // Megatron-LM splits the groups over the tensor ranks
    m->qkv_local = (m->heads_local + 2 * m->groups_local) * m->head_size;
    m->ffn_local = cfg->ffn_hidden_size / tp_size;
    m->fc_local = (cfg->swiglu ? 2 : 1) * m->ffn_local;
    m->vocab_local = cfg->padded_vocab_size / tp_size;
    m->vocab_start = tp_rank * m->vocab_local;
    int valid = cfg->vocab_size - m->vocab_start;
    m->vocab_valid_local = valid < 0 ? 0 : (valid > m->vocab_local ? m->vocab_local : valid);
    ContextAttention* ca = &m->context;   // (its scratch: layout_arena)
    ca->slice = cp;
    ca->comm = cp_comm;
    ca->group = &grid.cp;
    ca->B = B;
    ca->NH = m->heads_local;
    ca->G = m->groups_local;
    ca->HS = m->head_size;

    build_tensor_table(m);
    m->longest_chunk = longest_recomputed_chunk(m);
    m->recompute_layers = (LayerActivations*)callocCheck(m->longest_chunk, sizeof(LayerActivations));
    plan_slots(m, chunk_slots);
    Arena sizing = {NULL, 0, build.floatx_bytes};
    layout_arena(m, &sizing);
    m->arena_bytes = sizing.used;
}

static void gpt_allocate(GPT* m) {
    if (m->build.gpu != this_build().gpu || m->build.floatx_bytes != this_build().floatx_bytes)
        fail("a plan for the other build cannot be allocated by this one");
    m->params = (floatX*)dev_malloc(m->params_length * sizeof(floatX));
    m->grads = (float*)dev_malloc(m->grads_length * sizeof(float));
    dev_zero(m->params, m->params_length * sizeof(floatX));
    dev_zero(m->grads, m->grads_length * sizeof(float));
    if (m->params_length == m->num_params_padded) gpt_init_params(m);   // (ZeRO-3: zero.h's, into the shards)
    if (m->context.slice.size > 1) context_attention_init(&m->context);
    m->arena = dev_malloc(m->arena_bytes);
    Arena real = {(char*)m->arena, 0, m->build.floatx_bytes};
    layout_arena(m, &real);
    if (m->loss_sum) dev_zero(m->loss_sum, sizeof(double));   // step_loss zeroes it after each read
    if (m->moe_loss_sums) dev_zero(m->moe_loss_sums, 2 * sizeof(double));
    m->host_losses = (float*)mallocCheck((size_t)m->B * m->T * sizeof(float));
    m->moe_host_offsets = (int*)mallocCheck((size_t)(m->cfg.num_experts + 1) * sizeof(int));
    m->expert_received = (int*)mallocCheck((size_t)(m->cfg.num_experts + 1) * sizeof(int));   // (EP x E / EP)
    m->expert_offsets = (int*)mallocCheck((size_t)(m->ep.local + 1) * sizeof(int));
    m->moe_tokens = (long long*)callocCheck((size_t)m->num_local_layers * m->cfg.num_experts + 1, sizeof(long long));
}

// both at once (tests and tools; inline: the trainer, which checks memory between, does not call it)
static inline void gpt_build(GPT* m, const GPTConfig* cfg, int B, int T, int tp_rank, int tp_size,
                             int pp_rank, int pp_size, int num_slots, int pad_multiple) {
    gpt_plan_model(m, cfg, B, T, tp_rank, tp_size, context_slice(0, 1, T), CP_COMM_P2P,
                   expert_slice(0, 1, cfg->num_experts, NULL, pad_multiple), even_stage(cfg->num_layers, pp_rank, pp_size),
                   &num_slots, pad_multiple, 1, this_build());
    gpt_allocate(m);
}

// what gpt_plan_model allocated (host memory only: a plan touches no device)
static void gpt_free_plan(GPT* m) {
    for (int s = 0; s < m->num_slots; s++) free(m->slots[s].layers);
    free(m->slots);
    free(m->chunk_slots);
    free(m->recompute_layers);
    free(m->tensors);
    for (int i = 0; i < m->num_local_layers && m->layer_tensors; i++) free(m->layer_tensors[i].experts);
    free(m->layer_tensors);
}

static void gpt_free(GPT* m) {
    if (m->context.slice.size > 1) context_attention_free(&m->context);
    dev_free(m->arena);
    dev_free(m->params);
    dev_free(m->grads);
    gpt_free_plan(m);
    free(m->host_losses);
    free(m->moe_host_offsets);
    free(m->expert_received);
    free(m->expert_offsets);
    free(m->moe_tokens);
}
