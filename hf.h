/*
hf.h — Hugging Face models out, and the names both ways: the export of a checkpoint as
transformers' GPT2LMHeadModel, BloomForCausalLM, LlamaForCausalLM, MixtralForCausalLM or
Qwen2MoeForCausalLM (config.json and model.safetensors); and what the import (hf_import.h, the
room above) reads through too: each architecture's tensor names and layouts (hf_tensor) and
config.json keys (hf_field_key).

Its own room because it is one concern on top of checkpoint.h: it reads checkpoints only
through that room's pieces (checkpoint_meta_read, canonical_table), and knows each tensor's
Hugging Face names and layout from gpt.h's tensor table and each config field's config.json
key from GPT_CONFIG_FIELDS. Nothing is read whole: one tensor at a time passes through memory.

Interface: export_hf (rank 0 alone calls it; the trainer's other ranks wait); for hf_import.h
HFArchitecture, hf_class_name, hf_model_type, hf_llama_family, hf_moe, hf_field_key, hf_tensor,
hf_shape, hf_changed, hf_source_row.
*/
#pragma once
#include <dirent.h>
#include <sys/stat.h>

// ----------------------------------------------------------------------------
// Hugging Face export: a checkpoint's weights as transformers' GPT2LMHeadModel (learned
// positions), BloomForCausalLM (ALiBi and the embedding LayerNorm), LlamaForCausalLM (rope,
// RMSNorm, SwiGLU, no biases; grouped-query attention and an untied output layer allowed), or
// Llama's block with a mixture of experts in every layer: MixtralForCausalLM, or with a shared
// expert, the QKV's bias and the softmax over all experts, Qwen2MoeForCausalLM.
// export_hf(DIR/iter_0000100, OUT, &arch) reads metadata.txt and the weight section of
// tensors.bin (one tensor at a time, each verified against its CRC-32) and writes
// OUT/config.json and OUT/model.safetensors, loadable with from_pretrained(OUT). The tensor
// table gives each tensor's names (hf_name for GPT-2, bloom_name, llama_name) and how it changes:
//   - GPT-2's projections are Conv1D layers, whose weight is [in, out]: the transpose of
//     our Linear [out, in] (hf_transpose);
//   - our QKV rows are grouped per head, [q|k|v] of head 0, then of head 1, ... (Megatron's
//     layout, see qkv_index in kernels/attention.cuh), GPT-2's columns are [all q | all k | all v] (hf_qkv);
//   - Bloom keeps both as we do (nn.Linear, and its fused QKV is viewed as [heads, 3, head
//     size]): its tensors are copied as they are, under Megatron's part names;
//   - Llama's linears are nn.Linear too, but unfused: our QKV (per query group [its query
//     heads | its key head | its value head]) becomes q_proj [heads x head size, C] in head
//     order, k_proj and v_proj [groups x head size, C]; our fc1 [gate; up] becomes gate_proj
//     and up_proj. Our rope turns dims (i, i + d/2), rotate_half's pairing, which is what
//     LlamaRotaryEmbedding does to q_proj's rows: no permutation;
//   - Mixtral's and Qwen2-MoE's experts are Llama's MLPs, split the same way, under their names
//     (hf_mixtral_name renames the table's Qwen2-MoE ones for Mixtral); Qwen2-MoE's QKV bias is
//     split as its weight;
//   - a tied LM head (tie_word_embeddings) is not stored, as transformers' save_pretrained
//     does; Llama's untied one is lm_head.weight.
// safetensors: 8 bytes little-endian length of a JSON header, the header (padded with
// spaces to a multiple of 8), then the tensors' bytes back to back in the header's order.
// A model the architecture cannot express is refused naming what is missing.

// --export-hf-architecture's order; Llama's family last: LlamaForCausalLM, and its two mixtures of
// experts, MixtralForCausalLM and Qwen2MoeForCausalLM (Llama's block with a MoE layer as the MLP)
typedef enum { HF_AUTO, HF_GPT2, HF_BLOOM, HF_LLAMA, HF_MIXTRAL, HF_QWEN2_MOE, HF_NUM_ARCHITECTURES } HFArchitecture;

static const char* hf_class_name(HFArchitecture arch) {
    static const char* const NAMES[] = {"GPT2LMHeadModel", "GPT2LMHeadModel", "BloomForCausalLM", "LlamaForCausalLM",
                                        "MixtralForCausalLM", "Qwen2MoeForCausalLM"};
    return NAMES[arch];
}
static const char* hf_model_type(HFArchitecture arch) {
    static const char* const TYPES[] = {"gpt2", "gpt2", "bloom", "llama", "mixtral", "qwen2_moe"};
    return TYPES[arch];
}
// Llama or one of its mixtures of experts: rope, RMSNorm, SwiGLU, no biases (but Qwen2's QKV's),
// nn.Linear weights under "model.", gpt.h's llama names and column
static int hf_llama_family(HFArchitecture arch) { return arch >= HF_LLAMA; }
static int hf_moe(HFArchitecture arch) { return arch == HF_MIXTRAL || arch == HF_QWEN2_MOE; }

// a MoE field of gpt.h's list (num_experts, moe_*): none of them is Llama's
static int moe_field(const ConfigField* f) { return !strcmp(f->name, "num_experts") || !strncmp(f->name, "moe_", 4); }

// Mixtral's config.json keys where they are not the Llama family's column (which has Qwen2-MoE's):
// its intermediate_size is the experts' width, as it has no dense MLP (nor a shared expert)
static const struct {
    size_t offset;
    const char* key;
} MIXTRAL_KEYS[] = {
    {offsetof(GPTConfig, num_experts), "num_local_experts"},
    {offsetof(GPTConfig, moe_ffn_hidden_size), "intermediate_size"},
    {offsetof(GPTConfig, ffn_hidden_size), NULL},
    {offsetof(GPTConfig, moe_shared_expert_intermediate_size), NULL},
};

// the key of config field f in the architecture's config.json (NULL: none)
static const char* hf_field_key(const ConfigField* f, HFArchitecture arch) {
    if (arch == HF_GPT2 || arch == HF_AUTO) return f->hf_gpt2;
    if (arch == HF_BLOOM) return f->hf_bloom;
    if (arch == HF_LLAMA && moe_field(f)) return NULL;
    for (int k = 0; arch == HF_MIXTRAL && k < (int)(sizeof(MIXTRAL_KEYS) / sizeof(MIXTRAL_KEYS[0])); k++)
        if (f->offset == MIXTRAL_KEYS[k].offset) return MIXTRAL_KEYS[k].key;
    return f->hf_llama;
}

// A stop signal (the trainer's flag, handed in; NULL: none) ends a conversion between two
// tensors, as a failure: what it wrote is removed on the way out, as after any failure. (A
// signal once ended it at once and left model.safetensors.tmp, or a probe file in --save.)
static int hf_stopped(const volatile sig_atomic_t* stop, char* err, size_t errlen) {
    return stop && *stop ? error_line(err, errlen, "stopped by a signal") : 0;
}

// How the architecture names and stores table tensor d: one tensor, or (Llama's q/k/v_proj of
// our fused QKV, gate/up_proj of our [gate; up]) `parts` tensors, each some of its rows.
#define HF_MAX_PARTS 3
typedef struct {
    char name[HF_MAX_PARTS][96];   // "": the architecture has no such tensor
    int rows[HF_MAX_PARTS];        // each part's rows (a vector's length)
    int parts, transpose, regroup_qkv;
} HFTensor;

// name with its first `from` replaced by `to` (name as it is without one)
static void hf_rename(char* name, size_t len, const char* from, const char* to) {
    char* at = strstr(name, from);
    if (!at) return;
    char rest[96];
    snprintf(rest, sizeof(rest), "%s", at + strlen(from));
    snprintf(at, len - (size_t)(at - name), "%s%s", to, rest);
}

// Mixtral's names for the MoE layer's tensors, from the Llama family's (Qwen2-MoE's) of the table:
// mlp.gate (the router) and mlp.experts.E.gate_proj / up_proj / down_proj are
// block_sparse_moe.gate and block_sparse_moe.experts.E.w1 / w3 / w2; no shared expert ("")
static void hf_mixtral_name(char* name, size_t len) {
    static const char* const RENAMES[][2] = {{".mlp.gate.", ".block_sparse_moe.gate."},
                                             {".mlp.experts.", ".block_sparse_moe.experts."},
                                             {".gate_proj.", ".w1."}, {".up_proj.", ".w3."}, {".down_proj.", ".w2."}};
    if (strstr(name, ".mlp.shared_expert")) name[0] = '\0';
    if (!strstr(name, ".mlp.gate.") && !strstr(name, ".mlp.experts.")) return;
    for (int k = 0; k < (int)(sizeof(RENAMES) / sizeof(RENAMES[0])); k++) hf_rename(name, len, RENAMES[k][0], RENAMES[k][1]);
}

static HFTensor hf_tensor(const TensorDesc* d, HFArchitecture arch, const GPTConfig* c) {
    // Llama's fused names in the table (Phi-3's) and the tensors Llama has instead
    static const char* const FUSED[2][4] = {{"qkv_proj", "q_proj", "k_proj", "v_proj"},
                                            {"gate_up_proj", "gate_proj", "up_proj", NULL}};
    HFTensor h;
    memset(&h, 0, sizeof(h));
    h.parts = 1;
    h.rows[0] = d->valid_rows;
    int llama = hf_llama_family(arch);
    const char* name = arch == HF_BLOOM ? d->bloom_name : llama ? d->llama_name : d->hf_name;
    snprintf(h.name[0], sizeof(h.name[0]), "%s", name);
    if (arch == HF_GPT2) {
        h.transpose = d->hf_transpose;
        h.regroup_qkv = d->hf_qkv;
    }
    int HS = c->hidden_size / c->num_attention_heads;
    for (int k = 0; llama && k < 2; k++) {
        const char* at = strstr(name, FUSED[k][0]);
        if (!at) continue;
        h.parts = k == 0 ? 3 : 2;
        for (int p = 0; p < h.parts; p++) {   // q: the heads' rows, k and v: the groups'; gate and up: half each
            snprintf(h.name[p], sizeof(h.name[p]), "%.*s%s%s", (int)(at - name), name, FUSED[k][p + 1],
                     at + strlen(FUSED[k][0]));
            h.rows[p] = k == 1 ? d->rows / 2 : p == 0 ? c->num_attention_heads * HS : query_groups(c) * HS;
        }
    }
    for (int p = 0; arch == HF_MIXTRAL && p < h.parts; p++) hf_mixtral_name(h.name[p], sizeof(h.name[p]));
    return h;
}

// the transformers shape of part p of table tensor d: a vector [rows], a Conv1D weight [in, out]
static int hf_shape(const TensorDesc* d, const HFTensor* h, int p, uint64_t* shape) {
    shape[0] = d->cols == 1 ? (uint64_t)h->rows[p] : h->transpose ? (uint64_t)d->cols : (uint64_t)h->rows[p];
    shape[1] = h->transpose ? (uint64_t)h->rows[p] : (uint64_t)d->cols;
    return d->cols == 1 ? 1 : 2;
}

static size_t hf_part_bytes(const TensorDesc* d, const HFTensor* h, int p) {
    return (size_t)h->rows[p] * d->cols * sizeof(float);
}

// whether the architecture's bytes are not our tensor's as they are (transposed, regrouped, split)
static int hf_changed(const HFTensor* h) { return h->transpose || h->regroup_qkv || h->parts > 1; }

// GPT-2's row r of the fused QKV output (r = which * C + h * HS + d) is our row
// qkv_index(0, 0, h, which, 1, NH, NH, HS) + d, i.e. h * 3 * HS + which * HS + d (every head its own group)
static int hf_qkv_source_row(int r, int C, int NH) {
    int HS = C / NH, which = r / C, h = (r % C) / HS, d = r % HS;
    return (int)qkv_index(0, 0, h, which, 1, NH, NH, HS) + d;
}

// our row that row r of part p is: GPT-2's regrouped QKV; Llama's q_proj row of query head
// r / HS, k_proj's or v_proj's of group r / HS (read through the group's first head), at dim
// r % HS; up_proj's after the F rows of gate_proj; else r
static int hf_source_row(const HFTensor* h, int p, int r, const GPTConfig* c) {
    int NH = c->num_attention_heads, HS = c->hidden_size / NH, G = query_groups(c);
    if (h->regroup_qkv) return hf_qkv_source_row(r, c->hidden_size, NH);
    if (h->parts == 3) return (int)qkv_index(0, 0, p == 0 ? r / HS : r / HS * (NH / G), p, 1, NH, G, HS) + r % HS;
    return p * h->rows[0] + r;
}

// part p of our tensor src into dst, in the architecture's layout
static void hf_transform(const TensorDesc* d, const HFTensor* h, int p, const float* src, float* dst, const GPTConfig* c) {
    int rows = h->rows[p];
    for (int r = 0; r < rows; r++) {
        const float* row = src + (size_t)hf_source_row(h, p, r, c) * d->cols;
        for (int k = 0; k < d->cols; k++) {
            if (h->transpose) dst[(size_t)k * rows + r] = row[k];
            else dst[(size_t)r * d->cols + k] = row[k];
        }
    }
}

// a feature of gpt.h's model that Llama has always (llama_needs 1) or may have (0), and GPT-2
// and Bloom never
typedef struct {
    const char *on, *flag, *off;   // the model with it, the flag that gives it, the model without it
    int has, llama_needs;
} HFSwitch;

// The architecture --export-hf-architecture auto picks for a rope model: Llama without experts;
// with them Qwen2-MoE where the model has what only it expresses (a shared expert, the QKV's bias,
// the softmax over all experts), else Mixtral
static HFArchitecture hf_rope_architecture(const GPTConfig* c) {
    if (c->num_experts == 0) return HF_LLAMA;
    return c->moe_shared_expert_intermediate_size > 0 || c->add_qkv_bias || c->moe_router_pre_softmax ? HF_QWEN2_MOE
                                                                                                        : HF_MIXTRAL;
}

// The mixture of experts and the QKV's bias against the architecture (in Llama's family the model
// is rope, RMSNorm, SwiGLU, without biases but perhaps the QKV's): only Mixtral and Qwen2-MoE have
// experts; Llama has no bias;
// Mixtral's and Qwen2-MoE's MLP is a mixture of experts in every layer, weighted by Mixtral's
// softmax over the top-k or Qwen2-MoE's over all (norm_topk_prob false; true is Mixtral's);
// Qwen2-MoE always has a shared expert and the QKV's bias (its o_proj has none), Mixtral neither.
// 0, or 1 with why in err.
static int hf_moe_refusal(const GPTConfig* c, HFArchitecture arch, const char* ckpt, char* err, size_t errlen) {
    const char* name = hf_class_name(arch);
    int shared = c->moe_shared_expert_intermediate_size;
    if (!hf_moe(arch) && c->num_experts > 0)
        return error_line(err, errlen, "checkpoint %s has a mixture of experts (--num-experts %d), which %s cannot express: "
                          "%s%s", ckpt, c->num_experts, name, arch == HF_LLAMA ? "export it as " : "Mixtral and Qwen2-MoE "
                          "can, with rope", arch == HF_LLAMA ? hf_model_type(hf_rope_architecture(c)) : "");
    if (arch == HF_LLAMA && c->add_qkv_bias)
        return error_line(err, errlen, "checkpoint %s has a bias on the QKV projection alone (--add-qkv-bias), which %s "
                          "cannot express (its attention_bias biases o_proj too)", ckpt, name);
    if (!hf_moe(arch)) return 0;
    if (c->num_experts == 0)
        return error_line(err, errlen, "checkpoint %s has a dense MLP (no --num-experts), which %s has no place for (its MLP "
                          "is a mixture of experts): export it as llama", ckpt, name);
    if (c->moe_layer_freq != 1)
        return error_line(err, errlen, "checkpoint %s has dense MLPs between its MoE layers (--moe-layer-freq %d), which %s "
                          "cannot express (a mixture of experts in every layer)", ckpt, c->moe_layer_freq, name);
    if (arch == HF_MIXTRAL && (shared || c->add_qkv_bias || c->moe_router_pre_softmax))
        return error_line(err, errlen, "checkpoint %s has %s, which %s cannot express: export it as qwen2_moe", ckpt,
                          shared ? "a shared expert (--moe-shared-expert-intermediate-size)"
                          : c->add_qkv_bias ? "a bias on the QKV projection (--add-qkv-bias)"
                                            : "the experts' weights from the softmax over all of them, not renormalized "
                                              "(--moe-router-pre-softmax; Mixtral renormalizes the top-k)", name);
    if (arch == HF_QWEN2_MOE && (!shared || !c->add_qkv_bias))
        return error_line(err, errlen, "checkpoint %s has no %s, which %s always has (%s)", ckpt,
                          !shared ? "shared expert" : "bias on the QKV projection", name,
                          !shared ? "--moe-shared-expert-intermediate-size" : "--add-qkv-bias");
    return 0;
}

// 0 when the model of config c can be written as arch, else 1 with why in err
static int hf_refusal(const GPTConfig* c, HFArchitecture arch, const char* ckpt, char* err, size_t errlen) {
    int alibi = c->position_embedding_type == POSITION_ALIBI, rope = c->position_embedding_type == POSITION_ROPE;
    int llama = hf_llama_family(arch), HS = c->hidden_size / c->num_attention_heads;
    const char* name = hf_class_name(arch);
    if (!llama && rope)
        return error_line(err, errlen, "checkpoint %s uses rope (--position-embedding-type rope), which %s cannot express: "
                          "export it as llama", ckpt, hf_class_name(arch));
    if (arch == HF_GPT2 && alibi)
        return error_line(err, errlen, "checkpoint %s uses ALiBi (--position-embedding-type alibi), which GPT2LMHeadModel "
                          "cannot express (it learns positions): export it as bloom", ckpt);
    if (arch == HF_BLOOM && !alibi)
        return error_line(err, errlen, "checkpoint %s has learned position embeddings, which BloomForCausalLM has no place "
                          "for (it uses ALiBi): export it as gpt2", ckpt);
    if (llama && !rope)
        return error_line(err, errlen, "checkpoint %s %s, which %s cannot express (it uses rope): export it as %s", ckpt,
                          alibi ? "uses ALiBi (--position-embedding-type alibi)" : "has learned position embeddings", name,
                          alibi ? "bloom" : "gpt2");
    if (llama && rotated_dims(c) != HS)
        return error_line(err, errlen, "checkpoint %s turns %d of each head's %d dims (--rotary-percent %g), but %s turns "
                          "them all", ckpt, rotated_dims(c), HS, c->rotary_percent, name);
    const HFSwitch SWITCHES[] = {
        {"RMSNorm", "--normalization RMSNorm", "LayerNorm", c->normalization == NORM_RMSNORM, 1},
        {"a SwiGLU MLP", "--swiglu", "a GELU MLP", c->swiglu, 1},
        {"linear layers without biases", "--disable-bias-linear", "biases in its linear layers", c->disable_bias_linear, 1},
        {"grouped-query attention", "--group-query-attention", "multi-head attention",
         query_groups(c) != c->num_attention_heads, 0},
        {"an output layer of its own", "--untie-embeddings-and-output-weights", "the output layer tied to the word "
         "embedding", c->untie_embeddings_and_output_weights, 0},
    };
    for (int k = 0; k < (int)(sizeof(SWITCHES) / sizeof(SWITCHES[0])); k++) {
        const HFSwitch* s = &SWITCHES[k];
        if (llama && s->llama_needs && !s->has)
            return error_line(err, errlen, "checkpoint %s has %s, which %s cannot express (it has %s: %s)", ckpt, s->off,
                              name, s->on, s->flag);
        if (!llama && s->has)
            return error_line(err, errlen, "checkpoint %s has %s (%s), which %s cannot express (it has %s)", ckpt, s->on,
                              s->flag, hf_class_name(arch), s->off);
    }
    if (arch == HF_BLOOM && !c->swiglu && c->gelu == GELU_ERF)
        return error_line(err, errlen, "checkpoint %s has GELU's exact form (--gelu erf), which BloomForCausalLM cannot "
                          "express (its GELU is the tanh form)", ckpt);
    if (arch == HF_BLOOM && !c->embed_layernorm)
        return error_line(err, errlen, "checkpoint %s has no embedding LayerNorm (--embed-layernorm), which "
                          "BloomForCausalLM always applies", ckpt);
    if (arch == HF_BLOOM && c->ffn_hidden_size != 4 * c->hidden_size)
        return error_line(err, errlen, "checkpoint %s has --ffn-hidden-size %d, but BloomForCausalLM's MLP is 4 x "
                          "hidden = %d wide", ckpt, c->ffn_hidden_size, 4 * c->hidden_size);
    return hf_moe_refusal(c, arch, ckpt, err, errlen);
}

// tensor i of the weight section into out (rows * cols floats), verified against its CRC
static int ckpt_read_tensor(const CheckpointMeta* ck, FILE* bin, int i, float* out, char* err, size_t errlen) {
    const CkptTensor* t = &ck->tensors[i];
    size_t bytes = (size_t)t->rows * t->cols * sizeof(float);
    if (fseeko(bin, (off_t)(ck->section_offset[0] + t->offset), SEEK_SET) != 0 || fread(out, 1, bytes, bin) != bytes)
        return error_line(err, errlen, "checkpoint %s: cannot read tensor %s", ck->bin_path, t->name);
    uint32_t crc = crc32_update(0, out, bytes);
    if (crc != t->crc[0])
        return error_line(err, errlen, "checkpoint %s: tensor %s (weight) fails its checksum (%08x, expected %08x)",
                          ck->bin_path, t->name, crc, t->crc[0]);
    return 0;
}

// config.json's "exported_by": what tells an earlier export of ours (transformers keeps a key it
// does not know as an attribute of the config, and writes it back)
#define HF_EXPORT_MARK "gridgpt --export-hf"

// config.json: the model fields that have a name in the architecture's config (gpt.h's list),
// then its constants (GPT-2 and Bloom: no dropout, LayerNorm eps 1e-5, tied embeddings, GELU's
// form: GPT-2's "gelu" (erf) or "gelu_new" (tanh), Bloom's tanh always; Llama: SiLU's SwiGLU, no
// biases, rope unscaled; Mixtral and Qwen2-MoE: SiLU's SwiGLU, no sliding window, the router's
// aux loss in training (output_router_logits) where --moe-router-load-balancing-type is aux_loss;
// Qwen2-MoE's norm_topk_prob the inverse of --moe-router-pre-softmax, every layer a MoE layer).
// The z-loss, as dropout, is training's, not the model's: not written.
static int hf_write_config(const GPTConfig* c, HFArchitecture arch, const char* out_dir, char* err, size_t errlen) {
    char path[4200], tmp[4300], value[64];
    snprintf(path, sizeof(path), "%s/config.json", out_dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE* f = create_temporary(tmp);
    if (!f) return error_line(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
    fprintf(f, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n  \"exported_by\": \"%s\",\n",
            hf_class_name(arch), hf_model_type(arch), HF_EXPORT_MARK);
    for (int k = 0; k < NUM_MODEL_FIELDS; k++) {
        const ConfigField* field = &MODEL_FIELDS[k];
        const char* key = hf_field_key(field, arch);
        int text = field->kind == FIELD_CHOICE || field->kind == FIELD_STRING;   // JSON strings; a switch: true/false
        format_field(field, c, value, sizeof(value));
        if (field->kind == FIELD_SWITCH) snprintf(value, sizeof(value), "%s", strcmp(value, "0") ? "true" : "false");
        if (field->offset == offsetof(GPTConfig, num_query_groups))   // num_key_value_heads: the heads without GQA
            snprintf(value, sizeof(value), "%d", query_groups(c));
        if (key) fprintf(f, "  \"%s\": %s%s%s,\n", key, text ? "\"" : "", value, text ? "\"" : "");
    }
    if (arch == HF_BLOOM)   // Bloom's GELU is the tanh form always; no residual from after the LayerNorm
        fprintf(f, "  \"hidden_dropout\": 0.0,\n  \"attention_dropout\": 0.0,\n"
                   "  \"apply_residual_connection_post_layernorm\": false,\n  \"pretraining_tp\": 1,\n"
                   "  \"slow_but_exact\": false,\n");
    else if (arch == HF_LLAMA)
        fprintf(f, "  \"hidden_act\": \"silu\",\n  \"attention_bias\": false,\n  \"mlp_bias\": false,\n"
                   "  \"attention_dropout\": 0.0,\n  \"pretraining_tp\": 1,\n  \"rope_scaling\": null,\n");
    else if (hf_moe(arch))
        fprintf(f, "  \"hidden_act\": \"silu\",\n  \"attention_dropout\": 0.0,\n  \"sliding_window\": null,\n"
                   "  \"output_router_logits\": %s,\n", c->moe_router_load_balancing_type == 0 ? "true" : "false");
    else
        fprintf(f, "  \"activation_function\": \"%s\",\n  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n"
                   "  \"attn_pdrop\": 0.0,\n  \"scale_attn_weights\": true,\n  \"scale_attn_by_inverse_layer_idx\": false,\n"
                   "  \"reorder_and_upcast_attn\": false,\n", c->gelu == GELU_ERF ? "gelu" : "gelu_new");
    if (arch == HF_MIXTRAL) fprintf(f, "  \"router_jitter_noise\": 0.0,\n");
    if (arch == HF_QWEN2_MOE)
        fprintf(f, "  \"norm_topk_prob\": %s,\n  \"decoder_sparse_step\": 1,\n  \"mlp_only_layers\": [],\n"
                   "  \"use_sliding_window\": false,\n", c->moe_router_pre_softmax ? "false" : "true");
    if (!hf_llama_family(arch)) fprintf(f, "  \"layer_norm_epsilon\": 1e-05,\n");   // (Llama's rms_norm_eps is a field)
    // bos/eos: the end-of-document token is the vocabulary's last id for GPT-2's BPE (50256),
    // our byte tokenizer (256) and the ids tokenizer run with --vocab-size N+1 (N)
    fprintf(f,
            "  \"tie_word_embeddings\": %s,\n  \"bos_token_id\": %d,\n"
            "  \"eos_token_id\": %d,\n  \"use_cache\": true,\n  \"torch_dtype\": \"float32\"\n}\n",
            c->untie_embeddings_and_output_weights ? "false" : "true", c->vocab_size - 1, c->vocab_size - 1);
    return commit_file(f, tmp, path, err, errlen);
}

// the safetensors header of the table's tensors (each part of one), padded to a multiple of 8 (malloc'd)
static char* hf_header(const GPT* whole, const GPTConfig* c, HFArchitecture arch, size_t* len_out) {
    size_t cap = 64 + (size_t)whole->num_tensors * HF_MAX_PARTS * 256, len = 0, data = 0;
    char* header = (char*)mallocCheck(cap);
    len += snprintf(header + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < whole->num_tensors; i++) {
        const TensorDesc* d = &whole->tensors[i];
        HFTensor h = hf_tensor(d, arch, c);
        for (int p = 0; p < h.parts; p++) {
            uint64_t shape[2];
            char text[48];
            size_t bytes = hf_part_bytes(d, &h, p);
            if (hf_shape(d, &h, p, shape) == 2)
                snprintf(text, sizeof(text), "%llu,%llu", (unsigned long long)shape[0], (unsigned long long)shape[1]);
            else snprintf(text, sizeof(text), "%llu", (unsigned long long)shape[0]);
            len += snprintf(header + len, cap - len, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%s],\"data_offsets\":[%zu,%zu]}",
                            h.name[p], text, data, data + bytes);
            data += bytes;
        }
    }
    len += snprintf(header + len, cap - len, "}");
    while (len % 8) header[len++] = ' ';   // the data starts 8-byte aligned, as safetensors writes it
    *len_out = len;
    return header;
}

// the header, then each tensor (transformed where the architecture stores it otherwise; each of
// its parts) into f; memory: the largest tensor, plus the largest transformed one
static int hf_write_tensors(const CheckpointMeta* ck, const GPT* whole, HFArchitecture arch, FILE* bin, FILE* f,
                            const char* tmp, const volatile sig_atomic_t* stop, char* err, size_t errlen) {
    const GPTConfig* c = &ck->cfg;
    size_t len, largest = 1, largest_changed = 1;
    char* header = hf_header(whole, c, arch, &len);
    for (int i = 0; i < whole->num_tensors; i++) {
        const TensorDesc* d = &whole->tensors[i];
        HFTensor h = hf_tensor(d, arch, c);
        largest = canonical_bytes(d) > largest ? canonical_bytes(d) : largest;
        if (hf_changed(&h) && canonical_bytes(d) > largest_changed) largest_changed = canonical_bytes(d);
    }
    float* src = (float*)mallocCheck(largest);
    float* dst = (float*)mallocCheck(largest_changed);
    uint8_t len_le[8];
    for (int b = 0; b < 8; b++) len_le[b] = (uint8_t)((uint64_t)len >> (8 * b));
    int status = 0;
    if (fwrite(len_le, 1, 8, f) != 8 || fwrite(header, 1, len, f) != len)
        status = error_line(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
    for (int i = 0; i < whole->num_tensors && status == 0; i++) {
        const TensorDesc* d = &whole->tensors[i];
        HFTensor h = hf_tensor(d, arch, c);
        status = hf_stopped(stop, err, errlen) || ckpt_read_tensor(ck, bin, i, src, err, errlen);
        for (int p = 0; p < h.parts && status == 0; p++) {
            if (hf_changed(&h)) hf_transform(d, &h, p, src, dst, c);
            if (fwrite(hf_changed(&h) ? dst : src, 1, hf_part_bytes(d, &h, p), f) != hf_part_bytes(d, &h, p))
                status = error_line(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
        }
    }
    free(src);
    free(dst);
    free(header);
    return status;
}

static int hf_write_safetensors(const CheckpointMeta* ck, const GPT* whole, HFArchitecture arch, const char* out_dir,
                                const volatile sig_atomic_t* stop, char* err, size_t errlen) {
    char path[4200], tmp[4300];
    snprintf(path, sizeof(path), "%s/model.safetensors", out_dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE* bin = fopen_regular_file(ck->bin_path, err, errlen);
    if (!bin) return 1;
    FILE* f = create_temporary(tmp);
    int status = f ? hf_write_tensors(ck, whole, arch, bin, f, tmp, stop, err, errlen)
                   : error_line(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
    fclose(bin);
    if (f && status == 0) status = commit_file(f, tmp, path, err, errlen);
    else if (f) {
        fclose(f);
        remove(tmp);
    }
    return status;
}

// whether out_dir/config.json carries our mark
static int hf_config_is_ours(const char* out_dir) {
    char path[4200], why[512];
    size_t len;
    Json j;
    snprintf(path, sizeof(path), "%s/config.json", out_dir);
    char* text = read_small_file(path, 1 << 20, &len, why, sizeof(why));
    if (!text) return 0;
    int root = json_parse(&j, text, len, path, why, sizeof(why));
    const char* mark = root >= 0 ? json_str(&j, json_get(&j, root, "exported_by")) : NULL;
    int ours = mark && !strcmp(mark, HF_EXPORT_MARK);
    json_free(&j);
    free(text);
    return ours;
}

// the files an export writes (the model's, then the tokenizer's when the run has one), each also
// under its .tmp name: what an earlier export of ours may hold
static const char* const HF_MODEL_FILES[] = {"config.json", "model.safetensors", "generation_config.json"};
static const char* const HF_TOKENIZER_FILES[] = {"vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"};
enum { HF_NUM_MODEL_FILES = 3, HF_NUM_TOKENIZER_FILES = 4 };

static int hf_file_is_ours(const char* name) {
    char tmp[64];
    for (int k = 0; k < HF_NUM_MODEL_FILES + HF_NUM_TOKENIZER_FILES; k++) {
        const char* ours = k < HF_NUM_MODEL_FILES ? HF_MODEL_FILES[k] : HF_TOKENIZER_FILES[k - HF_NUM_MODEL_FILES];
        snprintf(tmp, sizeof(tmp), "%s.tmp", ours);
        if (!strcmp(name, ours) || !strcmp(name, tmp)) return 1;
    }
    return 0;
}

// OUT before an export writes there: missing, empty, or an earlier export of ours (only the files
// an export writes, config.json with our mark), which it replaces. Any other directory is refused,
// as --save refuses another run's series: the export would replace that model's config.json and
// model.safetensors and leave the rest beside them (a Llama generation_config.json beside GPT-2
// weights). 0, or 1 with a line in err.
static int hf_check_out_dir(const char* out_dir, char* err, size_t errlen) {
    char other[300] = "";
    int entries = 0;
    DIR* d = opendir(out_dir);
    if (!d) return errno == ENOENT ? 0 : error_line(err, errlen, "--export-hf %s: %s", out_dir, strerror(errno));
    for (struct dirent* e; !other[0] && (e = readdir(d)) != NULL;) {
        int ours = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
        ours |= hf_file_is_ours(e->d_name);
        if (!ours) snprintf(other, sizeof(other), "%s", e->d_name);
        entries += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    }
    closedir(d);
    if (other[0] || (entries && !hf_config_is_ours(out_dir)))
        return error_line(err, errlen, "--export-hf %s holds %s%s, not an earlier export of gridgpt (whose config.json "
                          "says \"exported_by\": \"%s\"): an export would replace another model's files and leave the "
                          "rest beside them; give a new or empty directory", out_dir, other[0] ? other : "a config.json",
                          other[0] ? ", which an export does not write" : "", HF_EXPORT_MARK);
    return 0;
}

// generation_config.json: what GenerationConfig.from_model_config(config).save_pretrained writes
// for our config.json (its bos and eos; no transformers_version, as no transformers wrote it), so
// that pipeline("text-generation") stops at the end-of-document token as config.json says
static int hf_write_generation_config(const GPTConfig* c, const char* out_dir, char* err, size_t errlen) {
    char path[4200], text[256];
    snprintf(path, sizeof(path), "%s/generation_config.json", out_dir);
    int n = snprintf(text, sizeof(text), "{\n  \"_from_model_config\": true,\n  \"bos_token_id\": %d,\n  \"eos_token_id\": %d\n}\n",
                     c->vocab_size - 1, c->vocab_size - 1);
    return write_file_atomically(path, text, (size_t)n, err, errlen);
}

// The run's tokenizer, for the export to write beside the model. A checkpoint does not record its
// tokenizer files (paths that move with no checkpoint knowing; Megatron-LM's do not either), so
// the export takes them from --tokenizer-type GPT2BPETokenizer --vocab-file --merge-file.
typedef struct {
    const char* vocab_file;   // NULL: no tokenizer, no tokenizer files
    const char* merge_file;
    int vocab_size, eod;      // its tokens, and the id of <|endoftext|> (-1: none)
} HFTokenizer;

// a tokenizer the model cannot use: its ids are not the model's, or its end-of-document token is
// not config.json's bos and eos (the vocabulary's last id). 0, or 1 with a line in err.
static int hf_tokenizer_refusal(const HFTokenizer* tok, const GPTConfig* c, const char* ckpt, char* err, size_t errlen) {
    if (tok->vocab_size != c->vocab_size)
        return error_line(err, errlen, "--vocab-file %s has %d tokens, but checkpoint %s's vocabulary has %d: give the "
                          "tokenizer the model was trained with", tok->vocab_file, tok->vocab_size, ckpt, c->vocab_size);
    if (tok->eod != c->vocab_size - 1)
        return error_line(err, errlen, "--vocab-file %s: <|endoftext|> is not its last id (%d), which config.json names as "
                          "bos and eos", tok->vocab_file, c->vocab_size - 1);
    return 0;
}

// a file copied as it is into out_dir/name (the tokenizer's files are small: read whole)
static int hf_copy_file(const char* src, const char* out_dir, const char* name, char* err, size_t errlen) {
    char path[4200];
    size_t n;
    char* text = read_whole_file(src, &n, err, errlen);
    if (!text) return 1;
    snprintf(path, sizeof(path), "%s/%s", out_dir, name);
    int status = write_file_atomically(path, text, n, err, errlen);
    free(text);
    return status;
}

// <|endoftext|>'s attributes as transformers' AddedToken writes them, each line at indent
static void hf_token_attributes(char* out, size_t n, const char* indent) {
    snprintf(out, n, "%s\"content\": \"<|endoftext|>\",\n%s\"lstrip\": false,\n%s\"normalized\": true,\n"
             "%s\"rstrip\": false,\n%s\"single_word\": false", indent, indent, indent, indent, indent);
}

// vocab.json and merges.txt (the run's files as they are: the same maps GPT2Tokenizer would write
// sorted), tokenizer_config.json and special_tokens_map.json as GPT2Tokenizer.save_pretrained
// (transformers 4.40) writes them for GPT-2's files, model_max_length the model's positions.
// tokenizer_class is GPT2Tokenizer for every architecture: AutoTokenizer takes the class
// tokenizer_config.json names over the model type's (a Bloom's would be BloomTokenizerFast, which
// needs a tokenizer.json we do not write).
static int hf_write_tokenizer(const HFTokenizer* tok, const GPTConfig* c, const char* out_dir, char* err, size_t errlen) {
    char path[4200], token[400], text[4096];
    int positions = c->max_position_embeddings ? c->max_position_embeddings : c->seq_length, n;
    if (hf_copy_file(tok->vocab_file, out_dir, "vocab.json", err, errlen) ||
        hf_copy_file(tok->merge_file, out_dir, "merges.txt", err, errlen))
        return 1;
    hf_token_attributes(token, sizeof(token), "      ");
    n = snprintf(text, sizeof(text),
                 "{\n  \"add_bos_token\": false,\n  \"add_prefix_space\": false,\n  \"added_tokens_decoder\": {\n"
                 "    \"%d\": {\n%s,\n      \"special\": true\n    }\n  },\n  \"bos_token\": \"<|endoftext|>\",\n"
                 "  \"clean_up_tokenization_spaces\": true,\n  \"eos_token\": \"<|endoftext|>\",\n  \"errors\": \"replace\",\n"
                 "  \"model_max_length\": %d,\n  \"pad_token\": null,\n  \"tokenizer_class\": \"GPT2Tokenizer\",\n"
                 "  \"unk_token\": \"<|endoftext|>\"\n}\n", tok->eod, token, positions);
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", out_dir);
    if (write_file_atomically(path, text, (size_t)n, err, errlen)) return 1;
    hf_token_attributes(token, sizeof(token), "    ");
    n = snprintf(text, sizeof(text), "{\n  \"bos_token\": {\n%s\n  },\n  \"eos_token\": {\n%s\n  },\n  \"unk_token\": {\n%s\n  }\n}\n",
                 token, token, token);
    snprintf(path, sizeof(path), "%s/special_tokens_map.json", out_dir);
    return write_file_atomically(path, text, (size_t)n, err, errlen);
}

// out_dir/name for each of n names, removed (those not there are no matter)
static void hf_remove_files(const char* out_dir, const char* const* names, int n) {
    char path[4200];
    for (int k = 0; k < n; k++) {
        snprintf(path, sizeof(path), "%s/%s", out_dir, names[k]);
        remove(path);
    }
}

// Export the checkpoint in checkpoint_iter_dir (a DIR/iter_NNNNNNN directory) as a
// transformers model in out_dir (created if missing): model.safetensors, then the tokenizer's
// files when tok names them (else those of an earlier export are removed), generation_config.json,
// and config.json last (the mark of a whole export), each written under a .tmp name and renamed.
// *arch: GPT-2, Bloom, Llama, or HF_AUTO (Bloom for an ALiBi model, Llama for a rope one, else
// GPT-2), replaced by the one written. Returns 0, or 1 with a one-line reason in err (a missing or
// malformed file, a tensor failing its checksum, a model the architecture cannot express, a
// tokenizer whose vocabulary is not the model's, an out_dir that holds another model, a stop
// signal before model.safetensors is in place: then no .tmp file is left, and an out_dir the
// export made is removed with what it wrote; after it, the small files are finished). Reads one
// tensor at a time: memory is twice the largest tensor. Only the weight section is read; the
// optimizer state is left alone.
static int export_hf(const char* checkpoint_iter_dir, const char* out_dir, HFArchitecture* arch, const HFTokenizer* tok,
                     const volatile sig_atomic_t* stop, char* err, size_t errlen) {
    const uint32_t one = 1;
    if (*(const uint8_t*)&one != 1)
        return error_line(err, errlen, "export_hf: fp32 is copied as is, so a little-endian host is needed");
    CheckpointMeta ck;
    if (checkpoint_meta_read(checkpoint_iter_dir, &ck, err, errlen) != 0) {
        checkpoint_meta_free(&ck);
        return 1;
    }
    int position = ck.cfg.position_embedding_type;
    if (*arch == HF_AUTO)
        *arch = position == POSITION_ALIBI ? HF_BLOOM : position == POSITION_ROPE ? hf_rope_architecture(&ck.cfg) : HF_GPT2;
    GPT whole = canonical_table(&ck.cfg);
    int status = hf_refusal(&ck.cfg, *arch, checkpoint_iter_dir, err, errlen);
    for (int i = 0; i < whole.num_tensors && status == 0; i++)
        if (!hf_tensor(&whole.tensors[i], *arch, &ck.cfg).name[0][0])
            status = error_line(err, errlen, "checkpoint %s has %s, which %s has no place for", checkpoint_iter_dir,
                                whole.tensors[i].name, hf_class_name(*arch));
    if (status == 0 && tok && tok->vocab_file) status = hf_tokenizer_refusal(tok, &ck.cfg, checkpoint_iter_dir, err, errlen);
    struct stat st;
    int out_was_there = stat(out_dir, &st) == 0;
    if (status == 0) status = hf_check_out_dir(out_dir, err, errlen);
    if (status == 0 && mkdir(out_dir, 0755) != 0 && errno != EEXIST)
        status = error_line(err, errlen, "cannot create %s: %s", out_dir, strerror(errno));
    if (status == 0) status = hf_write_safetensors(&ck, &whole, *arch, out_dir, stop, err, errlen);
    if (status == 0 && tok && tok->vocab_file) status = hf_write_tokenizer(tok, &ck.cfg, out_dir, err, errlen);
    else if (status == 0)   // over an earlier export with a tokenizer: none left beside a model it may not fit
        hf_remove_files(out_dir, HF_TOKENIZER_FILES, HF_NUM_TOKENIZER_FILES);
    if (status == 0) status = hf_write_generation_config(&ck.cfg, out_dir, err, errlen);
    if (status == 0) status = hf_write_config(&ck.cfg, *arch, out_dir, err, errlen);
    if (status && !out_was_there) {   // made for the export: what it wrote before the failure goes, then it
        hf_remove_files(out_dir, HF_MODEL_FILES, HF_NUM_MODEL_FILES);
        hf_remove_files(out_dir, HF_TOKENIZER_FILES, HF_NUM_TOKENIZER_FILES);
        rmdir(out_dir);
    }
    gpt_free(&whole);
    checkpoint_meta_free(&ck);
    return status;
}
