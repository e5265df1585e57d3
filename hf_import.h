/*
hf_import.h — Hugging Face models in: the import of a transformers GPT2LMHeadModel,
BloomForCausalLM, LlamaForCausalLM, MixtralForCausalLM or Qwen2MoeForCausalLM (config.json and
one model.safetensors, or the shards model.safetensors.index.json names) as a gridgpt checkpoint
at iteration 0 with a fresh optimizer, which any grid can --load.

Its own room (out of hf.h, the room below, whose names and layouts it reads through: the
export's inverse) because it is one concern: reading another program's files. It writes the
checkpoint only through checkpoint.h's pieces (canonical_layout, prepare_save_dir,
finish_save); the JSON it reads (config.json, the safetensors header, the shard index) goes
through json.h (JSON's whole grammar; no library). One tensor at a time passes through memory.

Interface: import_hf (rank 0 alone calls it; the trainer's other ranks wait).
*/
#pragma once

// ----------------------------------------------------------------------------
// Hugging Face import: import_hf(DIR, SAVE, ...) reads DIR/config.json and the tensors of
// DIR/model.safetensors (or of the shards DIR/model.safetensors.index.json maps them to) and
// writes SAVE/iter_0000000: a checkpoint at iteration 0 with a fresh optimizer (step 0,
// Adam's moments zero, every counter 0), in the format checkpoint_save writes, through
// checkpoint.h's own pieces. The inverse of the export:
//   - config.json's model keys are read through gpt.h's field list (hf_gpt2, hf_bloom,
//     hf_llama), GPT-2's activation_function (GELU's form), and its constants checked: what our
//     model would compute otherwise (an activation other than GELU, another LayerNorm eps,
//     untied GPT-2 or Bloom, attention scaled by the layer or not at all, cross-attention,
//     Bloom's residual taken after the LayerNorm; Llama's activation other than SiLU, scaled
//     or partial rope, biases, a head_dim of its own, pretraining_tp; a mixture of experts'
//     sliding window or dense layers: hf_read_moe) is refused naming the key. Dropout is not (the weights are the same function) but
//     noted, and taken as the checkpoint's (the default of a fine-tune from it) with
//     --import-hf-dropout (hf_dropout);
//   - each tensor of the table (each part of Llama's split ones) is found under its
//     transformers name, with or without the "transformer." or "model." prefix (a base model's
//     save has none); its shape is checked; it is converted to fp32 (F16 and BF16 exactly);
//     GPT-2's Conv1D weights are transposed back and its QKV regrouped per head; Llama's q/k/v
//     and gate/up are fused back (its family's too: each expert's, Qwen2-MoE's QKV bias);
//     Bloom's are copied as they are (our layout);
//   - GPT-2's attention-mask buffers (h.N.attn.bias, .masked_bias) and Llama's rope
//     frequencies (layers.N.self_attn.rotary_emb.inv_freq) are skipped, a stored lm_head.weight
//     of a tied model is accepted only as a bit-for-bit copy of the word embedding, and any
//     other tensor is refused.
// safetensors (its format's whole definition): 8 bytes little-endian N, an N-byte JSON header
// {name: {dtype, shape, data_offsets: [begin, end)}, "__metadata__": {...}}, then the data,
// offsets counted from its start. Each header is checked against itself and the file's size
// before a byte of data is read, and DIR is checked whole before SAVE is touched: a refusal
// leaves SAVE as it was.

enum { ST_F32, ST_F16, ST_BF16, ST_NUM_DTYPES };
static const char* const ST_DTYPE_NAMES[ST_NUM_DTYPES] = {"F32", "F16", "BF16"};
static const int ST_DTYPE_BYTES[ST_NUM_DTYPES] = {4, 2, 2};
#define ST_MAX_DIMS 8
#define ST_MAX_HEADER ((uint64_t)100 << 20)   // safetensors' own limit on the header

typedef struct {
    char* name;
    int file, dtype, ndim, used;
    uint64_t shape[ST_MAX_DIMS], numel;
    uint64_t at, bytes;    // where its data lies in its file
} StTensor;

typedef struct {
    char name[256], path[4500];
    int fd;
} StFile;

// what import_hf reads of DIR
typedef struct {
    const char* dir;
    char listing[4500];    // the file that lists the tensors: model.safetensors, or the shard index
    HFArchitecture arch;
    GPTConfig cfg;
    StFile* files;
    int num_files;
    StTensor* tensors;
    int num_tensors, cap;
    const volatile sig_atomic_t* stop;   // hf_stopped's
    int take_dropout;      // --import-hf-dropout: config.json's dropout becomes the checkpoint's
    unsigned dtypes_read;  // bit per ST_* dtype
    int nonfinite_tensors, first_nonfinite;   // tensors holding NaN or Inf, and the first (a table index)
    uint64_t nonfinite;    // their NaN and Inf values
    char note[600];
} HFModel;

// what import_hf wrote, for the caller's summary
typedef struct {
    GPTConfig cfg;
    HFArchitecture arch;
    int tensors, files;    // tensors written; safetensors files read
    char dtypes[16];       // the dtypes read: "F32", "BF16+F32"...
    char note[1200];       // "", or lines for the user (dropout in config.json, NaN or Inf weights)
    char checkpoint[4300]; // SAVE/iter_0000000
} HFImport;

// fp16 to fp32, exactly (every fp16 value is an fp32 value)
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    if (exponent == 0) {   // zero or subnormal: mantissa x 2^-24
        float v = (float)mantissa * 0x1p-24f;
        return sign ? -v : v;
    }
    uint32_t bits = sign | mantissa << 13 | (exponent == 0x1f ? 0x7f800000u : (exponent + 112) << 23);   // rebias 15 -> 127
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

static float bf16_to_f32(uint16_t h) {   // bf16 is fp32's upper half
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

static int pread_all(int fd, void* buf, size_t n, uint64_t at) {
    for (size_t done = 0; done < n;) {
        ssize_t k = pread(fd, (char*)buf + done, n - done, (off_t)(at + done));
        if (k <= 0) return k == 0 ? (errno = EIO, -1) : -1;
        done += (size_t)k;
    }
    return 0;
}

static int pwrite_all(int fd, const void* buf, size_t n, uint64_t at) {
    for (size_t done = 0; done < n;) {
        ssize_t k = pwrite(fd, (const char*)buf + done, n - done, (off_t)(at + done));
        if (k <= 0) return k == 0 ? (errno = EIO, -1) : -1;
        done += (size_t)k;
    }
    return 0;
}

// ---- config.json

// the key of field f in the architecture's config.json (NULL: none)
static const char* hf_key(const ConfigField* f, HFArchitecture arch, const Json* j, int root) {
    if (arch == HF_BLOOM && f->offset == offsetof(GPTConfig, hidden_size) && json_get(j, root, "n_embed") >= 0)
        return "n_embed";   // an older name, which BloomConfig takes over hidden_size
    return hf_field_key(f, arch);
}

// whether field f may be absent or null in the architecture's config.json, its value then
// transformers' default: GPT-2's n_inner (4 x hidden), initializer_range (0.02, ours too), the
// Llama family's rms_norm_eps, router_aux_loss_coef and rope_theta (set before reading: their
// classes' defaults) and Llama's num_key_value_heads (the heads: no grouped-query attention)
static int hf_optional(const ConfigField* f, HFArchitecture arch) {
    if (f->kind == FIELD_FLOAT) return 1;
    if (hf_llama_family(arch))
        return f->offset == offsetof(GPTConfig, rotary_base) ||
               (arch == HF_LLAMA && f->offset == offsetof(GPTConfig, num_query_groups));
    return f->offset == offsetof(GPTConfig, ffn_hidden_size);
}

// the model fields that have a key in the architecture's config.json (gpt.h's list), read as
// their flags would be; an integer may be written as a float with an integral value (Llama's
// rope_theta: 500000.0)
static int hf_read_fields(HFModel* hm, const Json* j, int root, const char* path, char* err, size_t errlen) {
    if (hf_llama_family(hm->arch)) {   // LlamaConfig's, MixtralConfig's and Qwen2MoeConfig's defaults
        hm->cfg.norm_epsilon = hm->arch == HF_MIXTRAL ? 1e-5f : 1e-6f;
        hm->cfg.rotary_base = hm->arch == HF_MIXTRAL ? 1000000 : 10000;
        hm->cfg.num_query_groups = 0;       // num_key_value_heads absent (hf_settle_config)
        if (hf_moe(hm->arch)) hm->cfg.moe_aux_loss_coeff = 0.001f;
    }
    for (int k = 0; k < NUM_MODEL_FIELDS; k++) {
        const ConfigField* f = &MODEL_FIELDS[k];
        const char* key = hf_key(f, hm->arch, j, root);
        if (!key) continue;
        int v = json_get(j, root, key), optional = hf_optional(f, hm->arch);
        JsonType type = v < 0 ? JSON_NULL : j->nodes[v].type;
        char text[64], why[512];
        if (type == JSON_NULL && optional) continue;
        if (type == JSON_NULL) return error_line(err, errlen, "%s: no \"%s\" (the model's %s)", path, key, f->name);
        int number = f->kind == FIELD_INT || f->kind == FIELD_LONG || f->kind == FIELD_FLOAT;
        if (f->kind == FIELD_SWITCH && (type == JSON_TRUE || type == JSON_FALSE)) {
            *(int*)field_in(f, &hm->cfg) = type == JSON_TRUE;
            continue;
        }
        double x = type == JSON_NUMBER ? j->nodes[v].number : 0.0;
        if (number && type == JSON_NUMBER && f->kind != FIELD_FLOAT && x == floor(x) && fabs(x) < 0x1p62)
            snprintf(text, sizeof(text), "%.0f", x);   // 2, 2.0, 2e0
        else if (number && type == JSON_NUMBER) snprintf(text, sizeof(text), "%.*s", j->nodes[v].text_len, j->nodes[v].text);
        else if (f->kind == FIELD_CHOICE && type == JSON_STRING) snprintf(text, sizeof(text), "%s", json_str(j, v));
        else return error_line(err, errlen, "%s: \"%s\" is %s, expected %s", path, key, json_type_name(j, v),
                                f->kind == FIELD_SWITCH ? "true or false" : number ? "a number" : "a string");
        if (parse_field(f, &hm->cfg, text, why, sizeof(why)))
            return error_line(err, errlen, "%s: \"%s\": %s", path, key, why);
    }
    return 0;
}

// a true/false key into *value (absent: `absent`, transformers' default); 0, or 1 if it is neither
static int hf_read_switch(const Json* j, int root, const char* path, const char* key, int absent, int* value, char* err,
                          size_t errlen) {
    int v = json_get(j, root, key);
    if (v >= 0 && j->nodes[v].type != JSON_TRUE && j->nodes[v].type != JSON_FALSE)
        return error_line(err, errlen, "%s: \"%s\" is %s, expected true or false", path, key, json_type_name(j, v));
    *value = v >= 0 ? j->nodes[v].type == JSON_TRUE : absent;
    return 0;
}

// a true/false key (absent: transformers' default) that must be `want`, else `why` says so
static int hf_check_switch(const Json* j, int root, const char* path, const char* key, int absent, int want,
                           const char* why, char* err, size_t errlen) {
    int value;
    if (hf_read_switch(j, root, path, key, absent, &value, err, errlen)) return 1;
    return value == want ? 0 : error_line(err, errlen, "%s: \"%s\": %s %s", path, key, value ? "true" : "false", why);
}

// GPT-2's activation into --gelu: the tanh form under any of transformers' names for it
// (activations.py: gelu_new, gelu_pytorch_tanh, gelu_fast and gelu_accurate all compute
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))), the exact erf form under "gelu" (torch's
// F.gelu) and "gelu_python" (the same in Python); any other activation refused
static int hf_read_activation(HFModel* hm, const Json* j, int root, const char* path, char* err, size_t errlen) {
    static const char* const GELU[] = {"gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_accurate", "gelu", "gelu_python"};
    int v = json_get(j, root, "activation_function");
    const char* name = v < 0 ? "gelu_new" : json_str(j, v);   // (GPT2Config's default)
    if (!name) return error_line(err, errlen, "%s: \"activation_function\" is %s, expected a string", path, json_type_name(j, v));
    for (int k = 0; k < 6; k++)
        if (!strcmp(name, GELU[k])) {
            hm->cfg.gelu = k < 4 ? GELU_TANH : GELU_ERF;
            return 0;
        }
    return error_line(err, errlen, "%s: \"activation_function\": \"%s\" is not GELU; gridgpt's GPT-2 has GELU's tanh "
                      "form (gelu_new, gelu_pytorch_tanh, gelu_fast, gelu_accurate) or its exact one (gelu, gelu_python)",
                      path, name);
}

// a number key (absent or null: transformers' default) that must be `want`, else `why` says so
static int hf_check_number(const Json* j, int root, const char* path, const char* key, double want, const char* why,
                           char* err, size_t errlen) {
    int v = json_get(j, root, key);
    if (v < 0 || j->nodes[v].type == JSON_NULL || (j->nodes[v].type == JSON_NUMBER && j->nodes[v].number == want)) return 0;
    if (j->nodes[v].type != JSON_NUMBER) return error_line(err, errlen, "%s: \"%s\" is %s, expected a number", path, key, json_type_name(j, v));
    return error_line(err, errlen, "%s: \"%s\": %.*s %s", path, key, j->nodes[v].text_len < 24 ? j->nodes[v].text_len : 24,
                      j->nodes[v].text, why);
}

// Llama's constants. The activation is SiLU under either of transformers' names for it (silu,
// swish); the tied output layer is read into the config (LlamaConfig's default: untied)
static int hf_check_llama(HFModel* hm, const Json* j, int root, const char* path, char* err, size_t errlen) {
    int v = json_get(j, root, "hidden_act"), HS = hm->cfg.hidden_size / hm->cfg.num_attention_heads;
    const char* act = v < 0 ? "silu" : json_str(j, v);
    if (!act) return error_line(err, errlen, "%s: \"hidden_act\" is %s, expected a string", path, json_type_name(j, v));
    if (strcmp(act, "silu") && strcmp(act, "swish"))
        return error_line(err, errlen, "%s: \"hidden_act\": \"%s\", but gridgpt's SwiGLU gates with SiLU (silu)", path, act);
    v = json_get(j, root, "rope_scaling");
    if (v >= 0 && j->nodes[v].type != JSON_NULL) {
        const char* type = json_str(j, json_get(j, v, "rope_type"));
        if (!type) type = json_str(j, json_get(j, v, "type"));
        return error_line(err, errlen, "%s: \"rope_scaling\" is %s%s%s%s: scaled rope, which gridgpt's is not (null "
                          "expected)", path, json_type_name(j, v), type ? " (" : "", type ? type : "", type ? ")" : "");
    }
    v = json_get(j, root, "tie_word_embeddings");
    if (v >= 0 && j->nodes[v].type != JSON_TRUE && j->nodes[v].type != JSON_FALSE)
        return error_line(err, errlen, "%s: \"tie_word_embeddings\" is %s, expected true or false", path, json_type_name(j, v));
    hm->cfg.untie_embeddings_and_output_weights = v < 0 || j->nodes[v].type == JSON_FALSE;
    return hf_check_switch(j, root, path, "attention_bias", 0, 0, "adds biases to the attention's projections; "
                           "gridgpt's Llama has none (--disable-bias-linear)", err, errlen) ||
           hf_check_switch(j, root, path, "mlp_bias", 0, 0, "adds biases to the MLP's projections; gridgpt's Llama "
                           "has none (--disable-bias-linear)", err, errlen) ||
           hf_check_switch(j, root, path, "add_cross_attention", 0, 0, "adds cross-attention to an encoder, which "
                           "gridgpt's decoder has not", err, errlen) ||
           hf_check_number(j, root, path, "head_dim", HS, "is not hidden_size / num_attention_heads: gridgpt's heads "
                           "split the hidden size", err, errlen) ||
           hf_check_number(j, root, path, "pretraining_tp", 1, "splits the projections' matmuls into slices summed in "
                           "another order; gridgpt computes them whole (1 expected)", err, errlen) ||
           hf_check_number(j, root, path, "partial_rotary_factor", 1, "turns only part of each head; Llama's rope, and "
                           "gridgpt's import, turns it all (1 expected)", err, errlen);
}

// the architecture's constants: each must be what our model computes
static int hf_check_constants(HFModel* hm, const Json* j, int root, const char* path, char* err, size_t errlen) {
    if (hf_llama_family(hm->arch)) return hf_check_llama(hm, j, root, path, err, errlen);
    int v = json_get(j, root, "layer_norm_epsilon"), gpt2 = hm->arch == HF_GPT2;
    if (v >= 0 && j->nodes[v].type != JSON_NUMBER)   // (a string "1e-5" was once reported as null)
        return error_line(err, errlen, "%s: \"layer_norm_epsilon\" is %s, expected a number", path, json_type_name(j, v));
    if (v >= 0 && (float)j->nodes[v].number != LAYERNORM_EPS)
        return error_line(err, errlen, "%s: \"layer_norm_epsilon\": %.*s, but gridgpt's LayerNorm uses %g", path,
                          j->nodes[v].text_len < 24 ? j->nodes[v].text_len : 24, j->nodes[v].text, LAYERNORM_EPS);
    if (hf_check_switch(j, root, path, "tie_word_embeddings", 1, 1, "unties the output layer from the word embedding; "
                        "gridgpt's is tied", err, errlen) ||
        hf_check_switch(j, root, path, "add_cross_attention", 0, 0, "adds cross-attention to an encoder, which "
                        "gridgpt's decoder has not", err, errlen))
        return 1;
    if (gpt2)
        return hf_read_activation(hm, j, root, path, err, errlen) ||
               hf_check_switch(j, root, path, "scale_attn_weights", 1, 1, "leaves the attention scores unscaled; "
                               "gridgpt divides them by sqrt(head size)", err, errlen) ||
               hf_check_switch(j, root, path, "scale_attn_by_inverse_layer_idx", 0, 0, "divides layer l's attention "
                               "scores by l + 1 too, which gridgpt does not", err, errlen);
    v = json_get(j, root, "n_inner");   // (not BloomConfig's: its MLP is always 4 x hidden)
    if (v >= 0 && j->nodes[v].type != JSON_NULL &&
        (j->nodes[v].type != JSON_NUMBER || j->nodes[v].number != 4.0 * hm->cfg.hidden_size))
        return error_line(err, errlen, "%s: \"n_inner\": %s, but BloomForCausalLM's MLP is 4 x hidden = %d wide", path,
                          j->nodes[v].type == JSON_NUMBER ? "a width" : json_type_name(j, v), 4 * hm->cfg.hidden_size);
    return hf_check_switch(j, root, path, "apply_residual_connection_post_layernorm", 0, 0, "takes the residual "
                           "after the LayerNorm; gridgpt's is the LayerNorm's input", err, errlen);
}

// a dropout key of config.json, transformers' class default where it is absent or null
static float hf_dropout_value(const Json* j, int root, const char* key, float class_default) {
    int v = key ? json_get(j, root, key) : -1;
    return v >= 0 && j->nodes[v].type == JSON_NUMBER ? (float)j->nodes[v].number : key ? class_default : 0.0f;
}

// Dropout changes training, not the function the weights compute: said, not refused (and so is
// Mixtral's router_jitter_noise, a training noise on the router's input gridgpt has not). With
// --import-hf-dropout config.json's becomes the checkpoint's --hidden-dropout and
// --attention-dropout (GPT-2's resid_pdrop and attn_pdrop, 0.1 when absent; Bloom's
// hidden_dropout and attention_dropout, Llama's attention_dropout, 0 when absent; GPT-2's
// embd_pdrop has no field of its own: the embedding's dropout is --hidden-dropout's, as
// Megatron-LM's), the default of a fine-tune from it; without, the checkpoint keeps gridgpt's
// defaults (Megatron-LM's 0.1), and a fine-tune's flags decide either way.
static void hf_dropout(HFModel* hm, const Json* j, int root) {
    static const char* const KEYS[] = {"embd_pdrop", "resid_pdrop", "attn_pdrop", "hidden_dropout", "attention_dropout",
                                       "router_jitter_noise"};
    size_t len = 0;
    for (int k = 0; k < 6; k++) {
        int v = json_get(j, root, KEYS[k]);
        if (v >= 0 && j->nodes[v].type == JSON_NUMBER && j->nodes[v].number != 0.0 && len < sizeof(hm->note) - 64)
            len += snprintf(hm->note + len, sizeof(hm->note) - len, "%s%s %.*s", len ? ", " : "config.json has ", KEYS[k],
                            j->nodes[v].text_len < 24 ? j->nodes[v].text_len : 24, j->nodes[v].text);
    }
    int gpt2 = hm->arch == HF_GPT2;
    if (hm->take_dropout) {
        hm->cfg.hidden_dropout = hf_dropout_value(j, root, gpt2 ? "resid_pdrop" : hm->arch == HF_BLOOM ? "hidden_dropout"
                                                                                                   : NULL, gpt2 ? 0.1f : 0.0f);
        hm->cfg.attention_dropout = hf_dropout_value(j, root, gpt2 ? "attn_pdrop" : "attention_dropout", gpt2 ? 0.1f : 0.0f);
        snprintf(hm->note + len, sizeof(hm->note) - len, "%s--import-hf-dropout: the checkpoint's dropout is config.json's, "
                 "--hidden-dropout %g --attention-dropout %g (a fine-tune's default)", len ? "; " : "",
                 hm->cfg.hidden_dropout, hm->cfg.attention_dropout);
    } else if (len)
        snprintf(hm->note + len, sizeof(hm->note) - len, ": not taken, the checkpoint keeps gridgpt's --hidden-dropout %g "
                 "--attention-dropout %g (--import-hf-dropout takes config.json's)", hm->cfg.hidden_dropout,
                 hm->cfg.attention_dropout);
}

// model_type (and architectures, if given) name one of the five architectures
static int hf_read_architecture(HFModel* hm, const Json* j, int root, const char* path, char* err, size_t errlen) {
    const char* type = json_str(j, json_get(j, root, "model_type"));
    if (!type)
        return error_line(err, errlen, "%s: no \"model_type\" string (gpt2, bloom, llama, mixtral or qwen2_moe expected)",
                          path);
    hm->arch = HF_AUTO;
    for (int a = HF_GPT2; a < HF_NUM_ARCHITECTURES; a++)
        if (!strcmp(type, hf_model_type((HFArchitecture)a))) hm->arch = (HFArchitecture)a;
    if (hm->arch == HF_AUTO)
        return error_line(err, errlen, "%s: model_type \"%s\": gridgpt imports gpt2 (GPT2LMHeadModel), bloom "
                          "(BloomForCausalLM), llama (LlamaForCausalLM), mixtral (MixtralForCausalLM) and qwen2_moe "
                          "(Qwen2MoeForCausalLM)", path, type);
    int a = json_get(j, root, "architectures");
    if (a >= 0 && j->nodes[a].type != JSON_ARRAY && j->nodes[a].type != JSON_NULL)
        return error_line(err, errlen, "%s: \"architectures\" is %s, expected a list", path, json_type_name(j, a));
    for (int c = a >= 0 ? j->nodes[a].child : -1; c >= 0; c = j->nodes[c].next) {
        const char* name = json_str(j, c);
        if (!name || strcmp(name, hf_class_name(hm->arch)))
            return error_line(err, errlen, "%s: architectures names %s; a %s model is imported as %s only", path,
                              name ? name : json_type_name(j, c), type, hf_class_name(hm->arch));
    }
    return 0;
}

// the shape of the model, settled: derived fields, the sequence length, the checks our
// config needs (hidden divisible by heads; learned positions at least the sequence)
static int hf_settle_config(HFModel* hm, const Json* j, int root, int seq_length, const char* path, char* err,
                            size_t errlen) {
    GPTConfig* c = &hm->cfg;
    int bloom = hm->arch == HF_BLOOM, llama = hf_llama_family(hm->arch), v = json_get(j, root, "seq_length");
    c->position_embedding_type = bloom ? POSITION_ALIBI : llama ? POSITION_ROPE : POSITION_LEARNED_ABSOLUTE;
    c->embed_layernorm = bloom;
    if (hm->arch == HF_MIXTRAL) c->ffn_hidden_size = c->moe_ffn_hidden_size;   // (no dense MLP: its experts' width)
    if (c->ffn_hidden_size == 0) c->ffn_hidden_size = 4 * c->hidden_size;
    if (llama) {   // rope over whole heads, RMSNorm, SwiGLU, no biases; the key/value heads
        int NH = c->num_attention_heads, G = c->num_query_groups ? c->num_query_groups : NH;
        c->normalization = NORM_RMSNORM;
        c->swiglu = c->disable_bias_linear = 1;
        c->rotary_percent = 1.0f;
        if (NH % G)
            return error_line(err, errlen, "%s: num_key_value_heads %d does not divide the %d heads (each key/value head "
                              "serves the same number of query heads)", path, G, NH);
        c->group_query_attention = G != NH;
        c->num_query_groups = G != NH ? G : gpt_default_config().num_query_groups;
        if (c->hidden_size % NH == 0 && c->hidden_size / NH % 2)
            return error_line(err, errlen, "%s: a head size of %d (hidden_size / num_attention_heads) is odd, but rope "
                              "turns a head's dims in pairs", path, c->hidden_size / NH);
    }
    uint64_t bloom_seq = 2048;   // Bloom's training length, when its config does not say
    if (bloom && v >= 0 && (json_uint(j, v, &bloom_seq) || bloom_seq < 1 || bloom_seq > INT_MAX))
        return error_line(err, errlen, "%s: \"seq_length\" is not a positive integer", path);
    if (!bloom && c->max_position_embeddings < 1)   // (0 once became a sequence length of 0)
        return error_line(err, errlen, "%s: \"%s\": %d, expected a positive length (the model's %s)", path,
                          llama ? "max_position_embeddings" : "n_positions", c->max_position_embeddings,
                          llama ? "longest trained sequence" : "position table");
    c->seq_length = seq_length > 0 ? seq_length : bloom ? (int)bloom_seq : c->max_position_embeddings;
    if (bloom) c->max_position_embeddings = c->seq_length;   // ALiBi: no table, any length
    if (!bloom && c->seq_length > c->max_position_embeddings)
        return error_line(err, errlen, "%s: a sequence length of %d is more than %s %d, the model's %s", path,
                          c->seq_length, llama ? "max_position_embeddings" : "n_positions", c->max_position_embeddings,
                          llama ? "longest trained sequence" : "position table");
    if (c->hidden_size % c->num_attention_heads)
        return error_line(err, errlen, "%s: the hidden size %d is not divisible by the %d heads", path, c->hidden_size,
                          c->num_attention_heads);
    long long padded = padded_vocab_size(c->vocab_size, c->make_vocab_size_divisible_by, 1);
    if (padded > INT_MAX) return error_line(err, errlen, "%s: vocab_size %d padded is more than %d", path, c->vocab_size, INT_MAX);
    c->padded_vocab_size = (int)padded;
    return 0;
}

// A mixture of experts' keys that are not fields (after hf_settle_config: the sequence is known).
//   - Both: every layer a MoE layer; output_router_logits (whether transformers' training adds the
//     aux loss) is --moe-router-load-balancing-type aux_loss, or none; router_aux_loss_coef is
//     --moe-aux-loss-coeff as it is (transformers' loss pools every layer's router, and for one
//     layer is k x Megatron-LM's: docs/checkpoints.md); a sliding window shorter than the
//     sequence is refused (gridgpt's attention sees every earlier token); Qwen2-MoE's window
//     counts only with use_sliding_window (transformers 4.40's eager mask applies it regardless:
//     a model of ours exports sliding_window null).
//   - Mixtral's router (softmax, top-k, renormalized) weighs the k chosen by the softmax over
//     their logits: gridgpt's default router.
//   - Qwen2-MoE: norm_topk_prob false is --moe-router-pre-softmax (the softmax over all experts,
//     at the top-k); true renormalizes that top-k, which is the softmax over the top-k logits,
//     mathematically: it is taken as gridgpt's default router (the two round differently, in the
//     last bit). Layer l is a MoE layer iff l is not in mlp_only_layers and (l + 1) %
//     decoder_sparse_step == 0: a step of 1 and no mlp_only_layers (every layer) are taken, the
//     rest refused. The QKV has a bias (--add-qkv-bias), and a shared expert is always there (a
//     width of 0 is refused: transformers still stores its empty tensors and its gate).
static int hf_read_moe(HFModel* hm, const Json* j, int root, const char* path, char* err, size_t errlen) {
    GPTConfig* c = &hm->cfg;
    int qwen = hm->arch == HF_QWEN2_MOE, aux, norm_topk = 1, windowed = 1;
    if (!hf_moe(hm->arch)) return 0;
    if (c->num_experts < 1)
        return error_line(err, errlen, "%s: \"%s\": %d, a mixture of no experts (import a dense model as llama)", path,
                          qwen ? "num_experts" : "num_local_experts", c->num_experts);
    if (qwen && c->moe_shared_expert_intermediate_size < 1)
        return error_line(err, errlen, "%s: \"shared_expert_intermediate_size\": %d: a shared expert of no width, whose "
                          "empty tensors and gate gridgpt has no place for", path, c->moe_shared_expert_intermediate_size);
    c->moe_layer_freq = 1;
    c->add_qkv_bias = qwen;
    if (hf_read_switch(j, root, path, "output_router_logits", 0, &aux, err, errlen) ||
        (qwen && hf_read_switch(j, root, path, "norm_topk_prob", 0, &norm_topk, err, errlen)) ||
        (qwen && hf_read_switch(j, root, path, "use_sliding_window", 0, &windowed, err, errlen)))
        return 1;
    c->moe_router_load_balancing_type = aux ? 0 : 1;   // aux_loss | none
    c->moe_router_pre_softmax = !norm_topk;
    if (qwen && hf_check_number(j, root, path, "decoder_sparse_step", 1, "makes layer l a mixture of experts only where "
                                "(l + 1) % decoder_sparse_step is 0; gridgpt's import takes every layer's MLP to be one (1 expected)",
                                err, errlen))
        return 1;
    int v = json_get(j, root, "mlp_only_layers");
    if (qwen && v >= 0 && j->nodes[v].type != JSON_NULL && (j->nodes[v].type != JSON_ARRAY || j->nodes[v].child >= 0))
        return error_line(err, errlen, "%s: \"mlp_only_layers\" is %s: layers with a dense MLP; gridgpt's import takes "
                          "every layer's MLP to be a mixture of experts ([] expected)", path,
                          j->nodes[v].type == JSON_ARRAY ? "not empty" : json_type_name(j, v));
    v = json_get(j, root, "sliding_window");
    if (v >= 0 && j->nodes[v].type != JSON_NULL && j->nodes[v].type != JSON_NUMBER)
        return error_line(err, errlen, "%s: \"sliding_window\" is %s, expected a number or null", path, json_type_name(j, v));
    if (windowed && v >= 0 && j->nodes[v].type == JSON_NUMBER && j->nodes[v].number < c->seq_length)
        return error_line(err, errlen, "%s: \"sliding_window\": %.*s%s is shorter than the sequence (%d tokens): each "
                          "token would see only that many; gridgpt's attention sees every one before it", path,
                          j->nodes[v].text_len < 24 ? j->nodes[v].text_len : 24, j->nodes[v].text,
                          qwen ? " (use_sliding_window true)" : "", c->seq_length);
    return 0;
}

static int hf_read_config(HFModel* hm, int seq_length, char* err, size_t errlen) {
    char path[4400];
    size_t len;
    snprintf(path, sizeof(path), "%s/config.json", hm->dir);
    char* text = read_small_file(path, 16 << 20, &len, err, errlen);
    if (!text) return 1;
    Json j;
    int root = json_parse(&j, text, len, path, err, errlen), status = root < 0;
    if (!status && j.nodes[root].type != JSON_OBJECT) status = error_line(err, errlen, "%s: not a JSON object", path);
    hm->cfg = gpt_default_config();   // then every field config.json has
    hm->cfg.ffn_hidden_size = hm->cfg.max_position_embeddings = 0;
    if (!status) status = hf_read_architecture(hm, &j, root, path, err, errlen) ||
                          hf_read_fields(hm, &j, root, path, err, errlen) ||
                          hf_check_constants(hm, &j, root, path, err, errlen) ||
                          hf_settle_config(hm, &j, root, seq_length, path, err, errlen) ||
                          hf_read_moe(hm, &j, root, path, err, errlen);
    if (!status) hf_dropout(hm, &j, root);
    char why[512];   // then as a run's flags are checked: a model every --load would refuse is not written
    if (!status && model_config_error(&hm->cfg, why, sizeof(why)))
        status = error_line(err, errlen, "%s: the model it describes fails the checks of a run's flags: %s", path, why);
    json_free(&j);
    free(text);
    return status;
}

// ---- safetensors headers

// data_offsets: exactly two integers, 0 <= begin <= end, into span (a list of five once ran past
// span's end; "0" and -4 are no offsets). 0, or 1 when it is not that.
static int st_offsets(const Json* j, int offsets, uint64_t span[2]) {
    int n = 0;
    for (int c = j->nodes[offsets].child; c >= 0; c = j->nodes[c].next, n++)
        if (n == 2 || json_uint(j, c, &span[n])) return 1;
    return n != 2 || span[0] > span[1];
}

// header entry e of file `file` (its data after data_start, data_bytes long) as a tensor
static int st_add_tensor(HFModel* hm, int file, const Json* j, int e, uint64_t data_start, uint64_t data_bytes,
                         char* err, size_t errlen) {
    const char *path = hm->files[file].path, *name = json_key(j, e);
    int shape = json_get(j, e, "shape"), offsets = json_get(j, e, "data_offsets");
    const char* dtype = json_str(j, json_get(j, e, "dtype"));
    if (!dtype || shape < 0 || j->nodes[shape].type != JSON_ARRAY || offsets < 0 || j->nodes[offsets].type != JSON_ARRAY)
        return error_line(err, errlen, "%s: tensor %s: expected {\"dtype\": string, \"shape\": [...], \"data_offsets\": "
                          "[begin, end]}", path, name);
    StTensor t;
    memset(&t, 0, sizeof(t));
    t.dtype = -1;
    for (int k = 0; k < ST_NUM_DTYPES; k++)
        if (!strcmp(dtype, ST_DTYPE_NAMES[k])) t.dtype = k;
    if (t.dtype < 0) return error_line(err, errlen, "%s: tensor %s has dtype %s; gridgpt reads F32, F16 and BF16", path, name, dtype);
    t.numel = 1;
    for (int c = j->nodes[shape].child; c >= 0; c = j->nodes[c].next) {
        uint64_t d;
        if (t.ndim == ST_MAX_DIMS || json_uint(j, c, &d) || (d && t.numel > ((uint64_t)1 << 58) / d))
            return error_line(err, errlen, "%s: tensor %s: its shape is not a list of at most %d sizes below 2^58 "
                              "elements", path, name, ST_MAX_DIMS);
        t.shape[t.ndim++] = d;
        t.numel *= d;
    }
    uint64_t span[2];
    if (st_offsets(j, offsets, span))
        return error_line(err, errlen, "%s: tensor %s: data_offsets is not [begin, end], two integers with 0 <= begin <= "
                          "end", path, name);
    if (span[1] > data_bytes)
        return error_line(err, errlen, "%s: tensor %s ends at byte %llu of the data, but the file holds %llu bytes of "
                          "data after its header (truncated?)", path, name, (unsigned long long)span[1],
                          (unsigned long long)data_bytes);
    t.bytes = t.numel * ST_DTYPE_BYTES[t.dtype];
    if (span[1] - span[0] != t.bytes)
        return error_line(err, errlen, "%s: tensor %s: data_offsets [%llu, %llu] hold %llu bytes, but %llu %s values "
                          "take %llu", path, name, (unsigned long long)span[0], (unsigned long long)span[1],
                          (unsigned long long)(span[1] - span[0]), (unsigned long long)t.numel, dtype,
                          (unsigned long long)t.bytes);
    t.at = data_start + span[0];
    t.file = file;
    t.name = (char*)mallocCheck(strlen(name) + 1);
    strcpy(t.name, name);
    if (hm->num_tensors == hm->cap)
        hm->tensors = (StTensor*)reallocCheck(hm->tensors, (hm->cap = hm->cap ? 2 * hm->cap : 256) * sizeof(StTensor));
    hm->tensors[hm->num_tensors++] = t;
    return 0;
}

static const StTensor* st_sorted_base;   // (qsort has no context argument)
static int st_by_position(const void* a, const void* b) {   // by where they begin, a zero-size one first
    const StTensor *x = &st_sorted_base[*(const int*)a], *y = &st_sorted_base[*(const int*)b];
    return x->at != y->at ? (x->at < y->at ? -1 : 1) : (x->bytes > y->bytes) - (x->bytes < y->bytes);
}
static int st_by_name(const void* a, const void* b) {
    return strcmp(st_sorted_base[*(const int*)a].name, st_sorted_base[*(const int*)b].name);
}

// Tensors [first, end), one file's, must tile its data as safetensors writes them, and as its
// own reader demands (else InvalidOffset, MetadataIncompleteBuffer): in order of position, each
// begins where the one before ends, from the data's first byte to the file's last. A byte in
// two tensors (looked for first: it says more than the gap it leaves), in none (a gap) or after
// the last one (trailing bytes) is refused, naming it. Offsets in the lines are the header's:
// counted from the data's start.
static int st_check_layout(const HFModel* hm, int first, int end, uint64_t data_start, uint64_t data_bytes,
                           const char* path, char* err, size_t errlen) {
    int n = end - first, status = 0;
    int* order = (int*)mallocCheck((n + 1) * sizeof(int));
    for (int i = 0; i < n; i++) order[i] = first + i;
    st_sorted_base = hm->tensors;
    qsort(order, n, sizeof(int), st_by_position);
    uint64_t next = 0;   // the end of the bytes the tensors so far cover
    for (int pass = 0; pass < 2 && !status; pass++) {   // overlaps, then gaps
        const StTensor* last = NULL;                     // the tensor that ends at next
        next = 0;
        for (int i = 0; i < n && !status; i++) {
            const StTensor* b = &hm->tensors[order[i]];
            unsigned long long at = b->at - data_start, a_at = last ? last->at - data_start : 0;
            if (pass == 0 && at < next && b->bytes == 0)
                status = error_line(err, errlen, "%s: tensor %s holds no bytes (a zero-size tensor) but is placed at byte "
                                    "%llu, inside tensor %s's bytes [%llu, %llu)", path, b->name, at, last->name, a_at,
                                    (unsigned long long)next);
            else if (pass == 0 && at < next)
                status = error_line(err, errlen, "%s: tensors %s and %s overlap (bytes %llu to %llu of the data are in "
                                    "both)", path, last->name, b->name, at,
                                    (unsigned long long)(next < at + b->bytes ? next : at + b->bytes));
            else if (pass == 1 && at > next)
                status = error_line(err, errlen, "%s: bytes %llu to %llu of the data belong to no tensor (a gap before %s): "
                                    "safetensors packs tensors back to back", path, (unsigned long long)next, at, b->name);
            if (at + b->bytes >= next) next = at + b->bytes, last = b;
        }
    }
    if (!status && next < data_bytes)
        status = error_line(err, errlen, "%s: %llu bytes after the last tensor's data (which ends at byte %llu of %llu): "
                            "trailing bytes, which safetensors' own reader refuses too", path,
                            (unsigned long long)(data_bytes - next), (unsigned long long)next, (unsigned long long)data_bytes);
    free(order);
    return status;
}

// names that appear twice (in one header, or in two shards) are refused: the second would be
// read in place of the first or not at all
static int hf_check_unique(const HFModel* hm, char* err, size_t errlen) {
    int n = hm->num_tensors, status = 0;
    int* order = (int*)mallocCheck((n + 1) * sizeof(int));
    for (int i = 0; i < n; i++) order[i] = i;
    st_sorted_base = hm->tensors;
    qsort(order, n, sizeof(int), st_by_name);
    for (int i = 1; i < n && !status; i++)
        if (!strcmp(hm->tensors[order[i - 1]].name, hm->tensors[order[i]].name))
            status = error_line(err, errlen, "%s: tensor %s appears twice (also in %s)", hm->files[hm->tensors[order[i]].file].path,
                                hm->tensors[order[i]].name, hm->files[hm->tensors[order[i - 1]].file].path);
    free(order);
    return status;
}

// open DIR/name and read its header into the tensor list
static int st_read_header(HFModel* hm, const char* name, char* err, size_t errlen) {
    hm->files = (StFile*)reallocCheck(hm->files, (hm->num_files + 1) * sizeof(StFile));
    int file = hm->num_files++;
    StFile* f = &hm->files[file];
    snprintf(f->name, sizeof(f->name), "%s", name);
    snprintf(f->path, sizeof(f->path), "%s/%s", hm->dir, name);
    f->fd = open_regular_file(f->path, err, errlen);   // (a FIFO once blocked here until killed)
    struct stat st;
    uint8_t le[8];
    if (f->fd < 0) return 1;
    if (fstat(f->fd, &st) != 0) return error_line(err, errlen, "%s: %s", f->path, strerror(errno));
    uint64_t size = (uint64_t)st.st_size, n = 0;
    if (size < 8 || pread_all(f->fd, le, 8, 0) != 0)
        return error_line(err, errlen, "%s: %llu bytes, too short for safetensors (an 8-byte header length first)",
                          f->path, (unsigned long long)size);
    for (int b = 7; b >= 0; b--) n = n << 8 | le[b];
    if (n > size - 8)
        return error_line(err, errlen, "%s: its header is %llu bytes, but only %llu follow its length (truncated?)",
                          f->path, (unsigned long long)n, (unsigned long long)(size - 8));
    if (n > ST_MAX_HEADER)
        return error_line(err, errlen, "%s: a header of %llu bytes, more than safetensors' 100 MB", f->path,
                          (unsigned long long)n);
    char* header = (char*)mallocCheck(n + 1);
    Json j;
    memset(&j, 0, sizeof(j));
    int root = -1, first = hm->num_tensors, status = 0;
    if (pread_all(f->fd, header, n, 8) != 0) status = error_line(err, errlen, "%s: cannot read its header: %s", f->path, strerror(errno));
    if (!status) status = (root = json_parse(&j, header, n, f->path, err, errlen)) < 0;
    if (!status && j.nodes[root].type != JSON_OBJECT) status = error_line(err, errlen, "%s: its header is not a JSON object", f->path);
    for (int e = status ? -1 : j.nodes[root].child; e >= 0 && !status; e = j.nodes[e].next)
        if (strcmp(json_key(&j, e), "__metadata__"))
            status = st_add_tensor(hm, file, &j, e, 8 + n, size - 8 - n, err, errlen);
    if (!status) status = hf_check_unique(hm, err, errlen) ||
                          st_check_layout(hm, first, hm->num_tensors, 8 + n, size - 8 - n, f->path, err, errlen);
    json_free(&j);
    free(header);
    return status;
}

// model.safetensors.index.json: {"weight_map": {tensor: shard file}}; each shard's header is
// read, and the map and the shards must agree: every tensor in the shard the map names it in,
// no tensor in a shard that the map does not name there
static int st_read_shards(HFModel* hm, const char* index_path, char* err, size_t errlen) {
    size_t len;
    char* text = read_small_file(index_path, 64 << 20, &len, err, errlen);
    if (!text) return 1;
    Json j;
    int root = json_parse(&j, text, len, index_path, err, errlen), status = root < 0;
    int map = status ? -1 : json_get(&j, root, "weight_map");
    if (!status && (map < 0 || j.nodes[map].type != JSON_OBJECT))
        status = error_line(err, errlen, "%s: no \"weight_map\" object (tensor name: shard file)", index_path);
    for (int e = status ? -1 : j.nodes[map].child; e >= 0 && !status; e = j.nodes[e].next) {
        const char* file = json_str(&j, e);
        int known = 0;
        if (!file || !file[0] || strchr(file, '/') || !strcmp(file, ".") || !strcmp(file, "..") || strlen(file) >= 256)
            status = error_line(err, errlen, "%s: weight_map gives tensor %s the shard %s, expected a file name in %s",
                                index_path, json_key(&j, e), file ? file : json_type_name(&j, e), hm->dir);
        for (int f = 0; f < hm->num_files && !status; f++) known |= !strcmp(hm->files[f].name, file);
        if (!status && !known) status = st_read_header(hm, file, err, errlen);
    }
    for (int e = status ? -1 : j.nodes[map].child; e >= 0 && !status; e = j.nodes[e].next) {
        int t = 0;
        while (t < hm->num_tensors && strcmp(hm->tensors[t].name, json_key(&j, e))) t++;
        if (t == hm->num_tensors || strcmp(hm->files[hm->tensors[t].file].name, json_str(&j, e)))
            status = error_line(err, errlen, "%s: weight_map puts tensor %s in %s, which has no such tensor", index_path,
                                json_key(&j, e), json_str(&j, e));
    }
    for (int t = 0; t < hm->num_tensors && !status; t++) {
        int e = json_get(&j, map, hm->tensors[t].name);
        if (e < 0 || strcmp(json_str(&j, e), hm->files[hm->tensors[t].file].name))
            status = error_line(err, errlen, "%s holds tensor %s, which %s does not map to it",
                                hm->files[hm->tensors[t].file].path, hm->tensors[t].name, index_path);
    }
    json_free(&j);
    free(text);
    return status;
}

// the model's tensors: DIR/model.safetensors, else the shards of DIR/model.safetensors.index.json
// (transformers' order of preference)
static int st_open_model(HFModel* hm, char* err, size_t errlen) {
    char bin[4400];
    struct stat st;
    snprintf(hm->listing, sizeof(hm->listing), "%s/model.safetensors", hm->dir);
    if (stat(hm->listing, &st) == 0) return st_read_header(hm, "model.safetensors", err, errlen);
    snprintf(hm->listing, sizeof(hm->listing), "%s/model.safetensors.index.json", hm->dir);
    if (stat(hm->listing, &st) == 0) return st_read_shards(hm, hm->listing, err, errlen);
    snprintf(bin, sizeof(bin), "%s/pytorch_model.bin", hm->dir);
    return error_line(err, errlen, "%s: no model.safetensors nor model.safetensors.index.json%s", hm->dir,
                      stat(bin, &st) == 0 ? " (only pytorch_model.bin, a pickle, which gridgpt does not read: save the "
                      "model again with save_pretrained(DIR, safe_serialization=True))" : "");
}

// tensor t as fp32 into out; scratch: room for its 16-bit values
static int st_read_floats(HFModel* hm, const StTensor* t, float* out, void* scratch, char* err, size_t errlen) {
    const uint16_t* half = (const uint16_t*)scratch;
    if (pread_all(hm->files[t->file].fd, t->dtype == ST_F32 ? (void*)out : scratch, t->bytes, t->at) != 0)
        return error_line(err, errlen, "%s: cannot read tensor %s: %s", hm->files[t->file].path, t->name, strerror(errno));
    for (uint64_t i = 0; t->dtype == ST_F16 && i < t->numel; i++) out[i] = f16_to_f32(half[i]);
    for (uint64_t i = 0; t->dtype == ST_BF16 && i < t->numel; i++) out[i] = bf16_to_f32(half[i]);
    hm->dtypes_read |= 1u << t->dtype;
    return 0;
}

// ---- the tensors against the table

static const char* shape_text(const uint64_t* shape, int ndim, char* out, size_t len) {
    size_t n = snprintf(out, len, "[");
    for (int k = 0; k < ndim && n < len; k++) n += snprintf(out + n, len - n, "%s%llu", k ? ", " : "", (unsigned long long)shape[k]);
    if (n < len) snprintf(out + n, len - n, "]");
    return out;
}

// name without the base model's prefix ("transformer.", Llama's "model."), as a save of the
// base model (GPT2Model, LlamaModel) names its tensors; name itself if it has none
static const char* hf_bare(const char* name, HFArchitecture arch) {
    const char* prefix = hf_llama_family(arch) ? "model." : "transformer.";
    return strncmp(name, prefix, strlen(prefix)) ? name : name + strlen(prefix);
}

// the tensor named `name`, or the same without the prefix; -1 if neither
static int hf_find(const HFModel* hm, const char* name) {
    const char* bare = hf_bare(name, hm->arch);
    for (int pass = 0; pass < 2; pass++)
        for (int t = 0; t < hm->num_tensors; t++)
            if (!strcmp(hm->tensors[t].name, pass ? bare : name)) return t;
    return -1;
}

// buffers, not parameters, that older transformers saved: GPT-2's causal masks, Llama's rope
// frequencies (rope_theta's, which gridgpt computes)
static int hf_saved_buffer(const char* name, HFArchitecture arch) {
    const char* s = hf_bare(name, arch);
    char what[16];
    int layer, end = 0;
    if (hf_llama_family(arch))
        return sscanf(s, "layers.%d.self_attn.rotary_emb.inv_freq%n", &layer, &end) == 1 && end && !s[end];
    if (arch != HF_GPT2 || sscanf(s, "h.%d.attn.%15[a-z_]%n", &layer, what, &end) != 2 || s[end]) return 0;
    return !strcmp(what, "bias") || !strcmp(what, "masked_bias");
}

static const char* st_path(const HFModel* hm, int t) { return hm->files[hm->tensors[t].file].path; }

// a stored lm_head.weight is the word embedding's copy (tied), bit for bit, or refused
static int hf_check_tied(HFModel* hm, int head, int wte, char* err, size_t errlen) {
    const StTensor *h = &hm->tensors[head], *w = &hm->tensors[wte];
    char a[96], b[96];
    if (h->ndim != w->ndim || memcmp(h->shape, w->shape, sizeof(h->shape)))
        return error_line(err, errlen, "%s: lm_head.weight is %s, the word embedding %s: an untied output layer, but "
                          "config.json ties them (tie_word_embeddings)", st_path(hm, head), shape_text(h->shape, h->ndim, a, sizeof(a)),
                          shape_text(w->shape, w->ndim, b, sizeof(b)));
    size_t bytes = h->numel * sizeof(float);
    float *x = (float*)mallocCheck(bytes + 1), *y = (float*)mallocCheck(bytes + 1);
    void* scratch = mallocCheck(h->numel * 2 + 1);
    int status = st_read_floats(hm, h, x, scratch, err, errlen) || st_read_floats(hm, w, y, scratch, err, errlen);
    size_t first = 0;
    while (!status && first < h->numel && !memcmp(&x[first], &y[first], sizeof(float))) first++;
    if (!status && first < h->numel)
        status = error_line(err, errlen, "%s: lm_head.weight differs from the word embedding %s (first at element %zu): "
                            "an untied output layer, but config.json ties them (tie_word_embeddings)", st_path(hm, head),
                            w->name, first);
    free(scratch);
    free(x);
    free(y);
    return status;
}

// source[HF_MAX_PARTS x i + p]: the stored tensor that part p of table tensor i comes from.
// Every table tensor (each part) must be there in its shape; every stored tensor must be one of
// them, a saved buffer, or a tied lm_head. 0, or 1 with the first that is not so.
static int hf_match(HFModel* hm, const GPT* whole, int* source, char* err, size_t errlen) {
    char a[96], b[96], nor[120];
    for (int i = 0; i < whole->num_tensors; i++) {
        const TensorDesc* d = &whole->tensors[i];
        HFTensor h = hf_tensor(d, hm->arch, &hm->cfg);
        for (int p = 0; p < h.parts; p++) {
            uint64_t shape[2];
            int ndim = hf_shape(d, &h, p, shape), t = hf_find(hm, h.name[p]);
            const char* bare = hf_bare(h.name[p], hm->arch);
            snprintf(nor, sizeof(nor), " (nor %s)", bare);
            if (bare == h.name[p]) nor[0] = '\0';
            if (t < 0)
                return error_line(err, errlen, "%s: no tensor %s%s, which %s of this config.json has (%s)", hm->listing,
                                  h.name[p], nor, hf_class_name(hm->arch), shape_text(shape, ndim, a, sizeof(a)));
            const StTensor* s = &hm->tensors[t];
            if (s->ndim != ndim || memcmp(s->shape, shape, ndim * sizeof(uint64_t)))
                return error_line(err, errlen, "%s: tensor %s is %s, expected %s by this config.json", st_path(hm, t),
                                  s->name, shape_text(s->shape, s->ndim, a, sizeof(a)), shape_text(shape, ndim, b, sizeof(b)));
            source[HF_MAX_PARTS * i + p] = t;
            hm->tensors[t].used = 1;
        }
    }
    for (int t = 0; t < hm->num_tensors; t++) {
        const char* name = hm->tensors[t].name;
        if (hm->tensors[t].used || hf_saved_buffer(name, hm->arch)) continue;
        if (strcmp(name, "lm_head.weight") || hm->cfg.untie_embeddings_and_output_weights)
            return error_line(err, errlen, "%s: unexpected tensor %s: %s of this config.json has no such tensor",
                              st_path(hm, t), name, hf_class_name(hm->arch));
        if (hf_check_tied(hm, t, source[HF_MAX_PARTS * whole->wte], err, errlen)) return 1;
    }
    return 0;
}

// ---- the checkpoint

// the inverse of hf_transform: part p in the architecture's layout (src) into its rows of ours (dst)
static void hf_untransform(const TensorDesc* d, const HFTensor* h, int p, const float* src, float* dst, const GPTConfig* c) {
    int rows = h->rows[p];
    for (int r = 0; r < rows; r++) {
        float* row = dst + (size_t)hf_source_row(h, p, r, c) * d->cols;
        for (int k = 0; k < d->cols; k++) row[k] = h->transpose ? src[(size_t)k * rows + r] : src[(size_t)r * d->cols + k];
    }
}

// CRC-32 of n zero bytes (an Adam moment of a fresh optimizer)
static uint32_t crc32_of_zeros(size_t n) {
    static const uint8_t zeros[1 << 16] = {0};
    uint32_t crc = 0;
    for (size_t k; n > 0; n -= k) crc = crc32_update(crc, zeros, k = n < sizeof(zeros) ? n : sizeof(zeros));
    return crc;
}

// how many of x[0, n) are NaN or infinite (their exponent bits all ones: no -ffast-math can fold it away)
static uint64_t count_nonfinite(const float* x, size_t n) {
    uint64_t bad = 0;
    for (size_t k = 0; k < n; k++) {
        uint32_t bits;
        memcpy(&bits, &x[k], sizeof(bits));
        bad += (bits & 0x7f800000u) == 0x7f800000u;
    }
    return bad;
}

// tmp_dir/tensors.bin: the weight section, one tensor at a time in our layout (then read back
// and checked against its CRC, as a save does), and the two moment sections zero (the file is
// sized first: they are never written); each tensor's three CRCs into crc
static int import_write_tensors(HFModel* hm, const CanonicalLayout* L, const int* source, const char* tmp_dir,
                            uint32_t* crc, char* err, size_t errlen) {
    char path[4500];
    snprintf(path, sizeof(path), "%s/tensors.bin", tmp_dir);
    size_t largest = sizeof(float);
    for (int i = 0; i < L->whole.num_tensors; i++)
        largest = canonical_bytes(&L->whole.tensors[i]) > largest ? canonical_bytes(&L->whole.tensors[i]) : largest;
    float *theirs = (float*)mallocCheck(largest), *ours = (float*)mallocCheck(largest);
    void* half = mallocCheck(largest / 2 + 1);   // a part's 16-bit values (F16, BF16)
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644), status = 0;   // (in a new directory)
    if (fd < 0) status = error_line(err, errlen, "cannot create %s: %s", path, strerror(errno));
    else if (ftruncate(fd, (off_t)(3 * L->section_bytes)) != 0)
        status = error_line(err, errlen, "cannot size %s to %zu bytes: %s", path, 3 * L->section_bytes, strerror(errno));
    for (int i = 0; i < L->whole.num_tensors && !status; i++) {
        const TensorDesc* d = &L->whole.tensors[i];
        HFTensor h = hf_tensor(d, hm->arch, &hm->cfg);
        size_t bytes = canonical_bytes(d);
        for (int p = 0; p < h.parts && !status; p++) {   // each part into its rows of ours
            status = hf_stopped(hm->stop, err, errlen) || st_read_floats(hm, &hm->tensors[source[HF_MAX_PARTS * i + p]], theirs, half, err, errlen);
            if (!status && hf_changed(&h)) hf_untransform(d, &h, p, theirs, ours, &hm->cfg);
        }
        if (status) break;
        const float* out = hf_changed(&h) ? ours : theirs;
        uint64_t bad = count_nonfinite(out, bytes / sizeof(float));
        if (bad && hm->nonfinite_tensors++ == 0) hm->first_nonfinite = i;
        hm->nonfinite += bad;
        crc[3 * i] = crc32_update(0, out, bytes);
        crc[3 * i + 1] = crc[3 * i + 2] = crc32_of_zeros(bytes);
        if (pwrite_all(fd, out, bytes, L->offset[i]) != 0)
            status = error_line(err, errlen, "cannot write %s: %s", path, strerror(errno));
    }
    if (!status && fsync(fd) != 0) status = error_line(err, errlen, "cannot sync %s: %s", path, strerror(errno));
    for (int i = 0; i < L->whole.num_tensors && !status; i++) {   // what is on the disk is what was meant
        size_t bytes = canonical_bytes(&L->whole.tensors[i]);
        if (pread_all(fd, theirs, bytes, L->offset[i]) != 0 || crc32_update(0, theirs, bytes) != crc[3 * i])
            status = error_line(err, errlen, "%s: tensor %s read back differently from what was written (a full disk "
                                "or a failing device?)", path, L->whole.tensors[i].name);
    }
    if (fd >= 0 && close(fd) != 0 && !status) status = error_line(err, errlen, "cannot close %s: %s", path, strerror(errno));
    free(theirs);
    free(ours);
    free(half);
    return status;
}

// SAVE/iter_0000000, through iter_0000000.tmp, finished as checkpoint_save finishes a save
static int hf_write_checkpoint(HFModel* hm, const CanonicalLayout* L, const int* source, const char* save_dir,
                               char* final_dir, size_t final_len, char* err, size_t errlen) {
    char tmp_dir[4400];
    iter_dir(final_dir, final_len, save_dir, 0);
    snprintf(tmp_dir, sizeof(tmp_dir), "%s.tmp", final_dir);
    if (remove_tree(tmp_dir) != 0 || mkdir(tmp_dir, 0755) != 0)
        return error_line(err, errlen, "cannot create %s: %s", tmp_dir, strerror(errno));
    uint32_t* crc = (uint32_t*)mallocCheck(3 * L->whole.num_tensors * sizeof(uint32_t));
    Progress p;
    AdamWState fresh;   // a fresh optimizer: step 0, no loss scaler's state
    memset(&p, 0, sizeof(p));
    memset(&fresh, 0, sizeof(fresh));
    int status = import_write_tensors(hm, L, source, tmp_dir, crc, err, errlen);
    if (!status) status = finish_save(save_dir, tmp_dir, final_dir, &L->whole, &fresh, &p, L, crc, 0, err, errlen);
    if (status) remove_tree(tmp_dir);
    free(crc);
    return status;
}

static void hf_model_free(HFModel* hm) {
    for (int f = 0; f < hm->num_files; f++)
        if (hm->files[f].fd >= 0) close(hm->files[f].fd);
    for (int t = 0; t < hm->num_tensors; t++) free(hm->tensors[t].name);
    free(hm->files);
    free(hm->tensors);
}

// --save must be new or hold no checkpoint: an import starts a series (checked again under
// the lock by prepare_save_dir, which then writes there)
static int hf_check_save(const char* save_dir, char* err, size_t errlen) {
    char latest[4300];
    struct stat st;
    if (stat(save_dir, &st) == 0 && !S_ISDIR(st.st_mode)) return error_line(err, errlen, "--save %s: not a directory", save_dir);
    if (latest_checkpoint(save_dir, latest, sizeof(latest), err, errlen)) return 1;
    if (latest[0])
        return error_line(err, errlen, "--save %s already holds checkpoints (the latest: %s); an imported model starts "
                          "a new series: give an empty or new directory", save_dir, latest);
    return 0;
}

// Import the transformers model in hf_dir (GPT2LMHeadModel, BloomForCausalLM or
// LlamaForCausalLM: config.json and model.safetensors, or its shards) as save_dir/iter_0000000,
// a checkpoint at iteration 0 with a fresh optimizer, marked the latest. seq_length: the run's
// (0: n_positions for GPT-2, max_position_embeddings for Llama; Bloom's "seq_length", else
// 2048). Rank 0 alone. Returns 0 with *out filled, or 1 with a line in err naming the file, the
// tensor or key, and what was expected, or after a stop signal (hf_stopped; one during
// prepare_save_dir's probe is seen once the probe is gone); then save_dir is as it was.
// Memory: the largest tensor, three times.
static int import_hf(const char* hf_dir, const char* save_dir, int seq_length, int take_dropout,
                     const volatile sig_atomic_t* stop, HFImport* out, char* err, size_t errlen) {
    const uint32_t one = 1;
    memset(out, 0, sizeof(*out));
    if (*(const uint8_t*)&one != 1)
        return error_line(err, errlen, "import_hf: safetensors are little-endian, and so must the host be");
    HFModel hm;
    memset(&hm, 0, sizeof(hm));
    hm.dir = hf_dir;
    hm.stop = stop;
    hm.take_dropout = take_dropout;
    struct stat st;
    int save_was_there = stat(save_dir, &st) == 0;
    int* source = NULL, status = hf_check_save(save_dir, err, errlen) || hf_read_config(&hm, seq_length, err, errlen) ||
                                 st_open_model(&hm, err, errlen);
    CanonicalLayout L;
    memset(&L, 0, sizeof(L));
    if (!status) {
        L = canonical_layout(&hm.cfg);
        source = (int*)mallocCheck(HF_MAX_PARTS * L.whole.num_tensors * sizeof(int));
        status = hf_match(&hm, &L.whole, source, err, errlen);
    }
    // only now is --save touched: made if missing, locked, checked again under the lock
    if (!status) status = hf_stopped(stop, err, errlen) || prepare_save_dir(save_dir, NULL, 0, err, errlen) != 0;
    if (!status) status = hf_stopped(stop, err, errlen) ||
                          hf_write_checkpoint(&hm, &L, source, save_dir, out->checkpoint, sizeof(out->checkpoint), err, errlen);
    release_save_lock();   // the import was this process's one use of --save
    if (status && !save_was_there) rmdir(save_dir);   // made for the import, and empty again
    if (!status) {
        out->cfg = hm.cfg;
        out->arch = hm.arch;
        out->tensors = L.whole.num_tensors;
        out->files = hm.num_files;
        for (int k = ST_NUM_DTYPES - 1, n = 0; k >= 0; k--)   // BF16+F16+F32
            if (hm.dtypes_read >> k & 1)
                n += snprintf(out->dtypes + n, sizeof(out->dtypes) - n, "%s%s", n ? "+" : "", ST_DTYPE_NAMES[k]);
        int n = snprintf(out->note, sizeof(out->note), "%s", hm.note);
        if (hm.nonfinite_tensors)   // imported as they are (the file's weights), but said: training from them gives NaN
            snprintf(out->note + n, sizeof(out->note) - n, "%s%llu weights are NaN or infinite, in %d tensor%s (the first: "
                     "%s): the model computes NaN; training from it will skip or diverge", n ? "\n" : "",
                     (unsigned long long)hm.nonfinite, hm.nonfinite_tensors, hm.nonfinite_tensors > 1 ? "s" : "",
                     hm.tensors[source[HF_MAX_PARTS * hm.first_nonfinite]].name);
    }
    if (source) free_layout(&L);
    free(source);
    hf_model_free(&hm);
    return status;
}
