#!/usr/bin/env python3
"""tests/test_hf.py — the Hugging Face export against transformers (run by tests/test_hf.sh).
The export is GPT2LMHeadModel, BloomForCausalLM, LlamaForCausalLM, MixtralForCausalLM or
Qwen2MoeForCausalLM, as its config.json says.

usage: test_hf.py LABEL EXPORT_DIR CKPT_ITER_DIR OUR_LOGITS TOKEN...

  - every tensor's CRC-32 in the checkpoint's metadata.txt is zlib's (so crc32_update is
    zlib-compatible), for all three sections;
  - model.safetensors holds exactly the architecture's tensors, each equal bit for bit to the
    checkpoint tensor it comes from: for GPT-2 transposed (Conv1D) and with the QKV columns
    regrouped from our per-head [q|k|v] into GPT-2's [all q | all k | all v], computed here in
    numpy independently of the C code; for Bloom as they are (nn.Linear, per-head QKV); for
    Llama our grouped QKV split into q_proj (head order), k_proj and v_proj, [gate; up] split;
    for Mixtral and Qwen2-MoE the same, each expert's [gate; up] split too (Mixtral's w1 and
    w3, w2 its down), the router as block_sparse_moe.gate (Mixtral) or mlp.gate (Qwen2-MoE),
    Qwen2-MoE's QKV bias split as its weight, its shared expert and gate;
  - from_pretrained loads it with no missing, unexpected or mismatched keys, and lm_head is
    tied to the word embedding (untied where the checkpoint's is);
  - the logits of the same tokens (fp32, eager attention) match ours (OUR_LOGITS, written by
    tests/hf_logits --logits) within fp32 round-off.

Tolerance: both sides compute in fp32 but sum in different orders (OpenBLAS / our loops vs
torch's kernels) and use different exp / tanh; each op is then good to a few ulp, i.e.
~1e-7 relative, and through a few layers the error stays ~1e-6 of the logits' scale.
Measured (transformers 5.23, torch 2.15, CPU): 8e-7 of max |logit| for this test's model,
at most 4e-6 for larger ones (4 layers x 128 wide x 64 tokens; GPT-2 124M's shape). We allow
1e-4 x max(1, max |logit|): 25x the worst seen, and 10^4 below what a layout mistake gives
(without the QKV regrouping the logits differ by 7.7, more than their own size).
"""
import json
import os
import struct
import sys
import zlib

import numpy as np
import torch
from transformers import AutoModelForCausalLM, BloomForCausalLM, GPT2LMHeadModel, LlamaForCausalLM

label, export_dir, ckpt_dir, our_logits_path = sys.argv[1:5]
tokens = [int(t) for t in sys.argv[5:]]
failures = 0


def check(ok, name, why=""):
    global failures
    if ok:
        print(f"PASS {label}: {name}")
    else:
        failures += 1
        print(f"FAIL {label}: {name}: {why}")
    sys.stdout.flush()


# ---- the checkpoint, read by hand as docs/checkpoints.md describes it
config, sections, tensors = {}, {}, []
with open(os.path.join(ckpt_dir, "metadata.txt")) as f:
    for line in f:
        w = line.split()
        if not w:
            continue
        if w[0] == "config":
            try:
                config[w[1]] = float(w[2])
            except ValueError:  # a choice, e.g. position_embedding_type alibi
                config[w[1]] = w[2]
        elif w[0] == "section":
            sections[w[1]] = (int(w[2]), int(w[3]))
        elif w[0] == "tensor":
            tensors.append((w[1], int(w[2]), int(w[3]), int(w[4]), [int(c, 16) for c in w[5:8]]))
blob = open(os.path.join(ckpt_dir, "tensors.bin"), "rb").read()
ours = {}
bad_crc = []
for name, rows, cols, off, crcs in tensors:
    for (sec_name, crc) in zip(("weight", "exp_avg", "exp_avg_sq"), crcs):
        base, _ = sections[sec_name]
        raw = blob[base + off: base + off + 4 * rows * cols]
        if zlib.crc32(raw) != crc:
            bad_crc.append(f"{name} ({sec_name})")
        if sec_name == "weight":
            ours[name] = np.frombuffer(raw, dtype="<f4").reshape(rows, cols)
check(not bad_crc, f"the {3 * len(tensors)} CRC-32s in metadata.txt are zlib's", ", ".join(bad_crc[:3]))

L, C, NH = int(config["num_layers"]), int(config["hidden_size"]), int(config["num_attention_heads"])
HS = C // NH


def qkv_to_gpt2(w):  # our rows h*3*HS + which*HS + d -> GPT-2's rows which*C + h*HS + d
    return w.reshape(NH, 3, HS, -1).transpose(1, 0, 2, 3).reshape(3 * C, -1)


model_type = json.load(open(os.path.join(export_dir, "config.json")))["model_type"]
mixtral, qwen = model_type == "mixtral", model_type == "qwen2_moe"
bloom, llama = model_type == "bloom", model_type in ("llama", "mixtral", "qwen2_moe")  # (Llama's family)
arch = {"bloom": "BloomForCausalLM", "llama": "LlamaForCausalLM", "mixtral": "MixtralForCausalLM",
        "qwen2_moe": "Qwen2MoeForCausalLM"}.get(model_type, "GPT2LMHeadModel")
E = int(config.get("num_experts", 0))
G = int(config["num_query_groups"]) if config.get("group_query_attention", 0) else NH  # key/value heads
untied = bool(config.get("untie_embeddings_and_output_weights", 0))


def bloom_tensors():  # Megatron's names under transformer.h.N., the embedding's and ln_f renamed
    vec_or_matrix = lambda w: w[:, 0] if w.shape[1] == 1 else w
    out = {"transformer.word_embeddings.weight": ours["language_model.embedding.word_embeddings.weight"]}
    for part in ("weight", "bias"):
        out["transformer.word_embeddings_layernorm." + part] = ours["language_model.embedding.layernorm." + part][:, 0]
        out["transformer.ln_f." + part] = ours["language_model.encoder.final_layernorm." + part][:, 0]
    prefix = "language_model.encoder.layers."
    for name, w in ours.items():
        if name.startswith(prefix):
            out["transformer.h." + name[len(prefix):]] = vec_or_matrix(w)
    return out


def gpt2_tensors():
    expected = {"transformer.wte.weight": ours["language_model.embedding.word_embeddings.weight"],
                "transformer.wpe.weight": ours["language_model.embedding.position_embeddings.weight"],
                "transformer.ln_f.weight": ours["language_model.encoder.final_layernorm.weight"][:, 0],
                "transformer.ln_f.bias": ours["language_model.encoder.final_layernorm.bias"][:, 0]}
    for l in range(L):
        p, h = f"language_model.encoder.layers.{l}.", f"transformer.h.{l}."
        vec = lambda n: ours[p + n][:, 0]
        expected.update({
            h + "ln_1.weight": vec("input_layernorm.weight"), h + "ln_1.bias": vec("input_layernorm.bias"),
            h + "attn.c_attn.weight": qkv_to_gpt2(ours[p + "self_attention.query_key_value.weight"]).T,
            h + "attn.c_attn.bias": qkv_to_gpt2(ours[p + "self_attention.query_key_value.bias"])[:, 0],
            h + "attn.c_proj.weight": ours[p + "self_attention.dense.weight"].T,
            h + "attn.c_proj.bias": vec("self_attention.dense.bias"),
            h + "ln_2.weight": vec("post_attention_layernorm.weight"), h + "ln_2.bias": vec("post_attention_layernorm.bias"),
            h + "mlp.c_fc.weight": ours[p + "mlp.dense_h_to_4h.weight"].T, h + "mlp.c_fc.bias": vec("mlp.dense_h_to_4h.bias"),
            h + "mlp.c_proj.weight": ours[p + "mlp.dense_4h_to_h.weight"].T, h + "mlp.c_proj.bias": vec("mlp.dense_4h_to_h.bias"),
        })
    return expected


def swiglu_mlp(p, ours_name, h, names):  # our MLP [gate; up] and down as the architecture's three
    fc = ours[p + ours_name + ".dense_h_to_4h.weight"]
    F = fc.shape[0] // 2
    return {h + names[0] + ".weight": fc[:F], h + names[1] + ".weight": fc[F:],
            h + names[2] + ".weight": ours[p + ours_name + ".dense_4h_to_h.weight"]}


def llama_tensors():  # our QKV rows per group g: [its NH/G query heads | its k | its v], HS rows each
    expected = {"model.embed_tokens.weight": ours["language_model.embedding.word_embeddings.weight"],
                "model.norm.weight": ours["language_model.encoder.final_layernorm.weight"][:, 0]}
    if untied:
        expected["lm_head.weight"] = ours["language_model.output_layer.weight"]
    for l in range(L):
        p, h = f"language_model.encoder.layers.{l}.", f"model.layers.{l}."
        qkv = ours[p + "self_attention.query_key_value.weight"].reshape(G, NH // G + 2, HS, C)
        expected.update({
            h + "input_layernorm.weight": ours[p + "input_layernorm.weight"][:, 0],
            h + "self_attn.q_proj.weight": qkv[:, :NH // G].reshape(NH * HS, C),
            h + "self_attn.k_proj.weight": qkv[:, NH // G].reshape(G * HS, C),
            h + "self_attn.v_proj.weight": qkv[:, NH // G + 1].reshape(G * HS, C),
            h + "self_attn.o_proj.weight": ours[p + "self_attention.dense.weight"],
            h + "post_attention_layernorm.weight": ours[p + "post_attention_layernorm.weight"][:, 0],
        })
        if qwen:  # the QKV's bias, split as its weight
            b = ours[p + "self_attention.query_key_value.bias"][:, 0].reshape(G, NH // G + 2, HS)
            expected.update({h + "self_attn.q_proj.bias": b[:, :NH // G].reshape(NH * HS),
                             h + "self_attn.k_proj.bias": b[:, NH // G].reshape(G * HS),
                             h + "self_attn.v_proj.bias": b[:, NH // G + 1].reshape(G * HS)})
        if not E:
            expected.update(swiglu_mlp(p, "mlp", h, ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")))
            continue
        moe = "block_sparse_moe" if mixtral else "mlp"
        expected[h + moe + ".gate.weight"] = ours[p + "mlp.router.weight"]
        for e in range(E):
            names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
            expected.update(swiglu_mlp(p, f"mlp.experts.{e}", h, [f"{moe}.experts.{e}.{n}" for n in names]))
        if qwen:
            expected.update(swiglu_mlp(p, "mlp.shared_expert", h, ("mlp.shared_expert.gate_proj",
                                                                   "mlp.shared_expert.up_proj", "mlp.shared_expert.down_proj")))
            expected[h + "mlp.shared_expert_gate.weight"] = ours[p + "mlp.shared_expert_gate.weight"]
    return expected


expected = bloom_tensors() if bloom else llama_tensors() if llama else gpt2_tensors()

# ---- model.safetensors, read by hand (the format's whole definition is these few lines)
st_path = os.path.join(export_dir, "model.safetensors")
raw = open(st_path, "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8:8 + n])
meta = header.pop("__metadata__", None)
check(meta == {"format": "pt"} and n % 8 == 0, "safetensors header: __metadata__ {format: pt}, 8-byte aligned",
      f"{meta}, length {n}")
check(set(header) == set(expected), f"safetensors holds exactly {arch}'s tensors (lm_head " +
      ("untied, stored)" if untied else "tied, not stored)"),
      f"extra {sorted(set(header) - set(expected))[:3]}, missing {sorted(set(expected) - set(header))[:3]}")
spans = sorted(v["data_offsets"] for v in header.values())
contiguous = spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:])) and spans[-1][1] == len(raw) - 8 - n
check(contiguous, "tensors' byte ranges are contiguous and fill the file")
wrong = []
for name, want in expected.items():
    if name not in header:
        continue
    e = header[name]
    a, b = e["data_offsets"]
    got = np.frombuffer(raw[8 + n + a: 8 + n + b], dtype="<f4")
    if e["dtype"] != "F32" or list(e["shape"]) != list(want.shape) or got.size != want.size or \
            not np.array_equal(got.reshape(want.shape), want):
        wrong.append(f"{name} {e['shape']} vs {list(want.shape)}")
check(not wrong, "every tensor equals its checkpoint tensor bit for bit" +
      (" (as stored)" if bloom else " (QKV split into q/k/v_proj, [gate; up] split)" if llama
       else " (Conv1D transpose, QKV regrouped)"),
      "; ".join(wrong[:3]))

# ---- transformers
try:
    model_class = (BloomForCausalLM if bloom else AutoModelForCausalLM if mixtral or qwen else LlamaForCausalLM if llama
                   else GPT2LMHeadModel)
    model, info = model_class.from_pretrained(export_dir, output_loading_info=True, attn_implementation="eager")
except Exception as e:  # noqa: BLE001 - any refusal is the failure to report
    check(False, f"{arch}.from_pretrained loads the export", f"{type(e).__name__}: {e}")
    sys.exit(1)
model = model.float().eval()
problems = {k: v for k, v in info.items() if v}
check(not problems, f"{arch}.from_pretrained: no missing, unexpected or mismatched keys", str(problems))
embedding = model.transformer.word_embeddings if bloom else model.model.embed_tokens if llama else model.transformer.wte
check((model.lm_head.weight.data_ptr() == embedding.weight.data_ptr()) != untied,
      "lm_head is " + ("its own tensor (untied)" if untied else "tied to the word embedding"))
cfg = model.config
check(type(model).__name__ == arch, f"AutoModelForCausalLM loads it as {arch}", type(model).__name__)
if mixtral or qwen:
    F = int(config["moe_ffn_hidden_size"])
    check((cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size,
           cfg.rope_theta, cfg.rms_norm_eps, cfg.num_experts_per_tok, cfg.router_aux_loss_coef) ==
          (L, C, NH, G, int(config["vocab_size"]), config["rotary_base"], config["norm_epsilon"],
           int(config["moe_router_topk"]), config["moe_aux_loss_coeff"]) and cfg.hidden_act == "silu" and
          cfg.sliding_window is None and cfg.output_router_logits == (config["moe_router_load_balancing_type"] == "aux_loss")
          and ((cfg.num_local_experts, cfg.intermediate_size) == (E, F) if mixtral else
               (cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size, cfg.norm_topk_prob,
                cfg.decoder_sparse_step) == (E, F, int(config["moe_shared_expert_intermediate_size"]),
                                             not config.get("moe_router_pre_softmax", 0), 1)),
          "config.json: shapes, key/value heads, rope_theta, rms_norm_eps, silu, no window, the experts, their width, k, "
          "the aux loss" + (", the shared expert's width, norm_topk_prob, every layer sparse" if qwen else ""), str(cfg))
elif llama:
    check((cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
           cfg.intermediate_size, cfg.vocab_size, cfg.rope_theta, cfg.rms_norm_eps) ==
          (L, C, NH, G, int(config["ffn_hidden_size"]), int(config["vocab_size"]), config["rotary_base"],
           config["norm_epsilon"]) and cfg.hidden_act == "silu" and cfg.rope_scaling is None and not cfg.attention_bias,
          "config.json: shapes, key/value heads, rope_theta, rms_norm_eps, silu, no rope scaling, no biases", str(cfg))
elif bloom:
    check((cfg.n_layer, cfg.hidden_size, cfg.n_head, cfg.vocab_size) == (L, C, NH, int(config["vocab_size"])) and
          C * 4 == int(config["ffn_hidden_size"]) and cfg.layer_norm_epsilon == 1e-5 and
          not cfg.apply_residual_connection_post_layernorm, "config.json: shapes, eps 1e-5, pre-LayerNorm residual", str(cfg))
else:   # GELU's form: the exact one is transformers' "gelu", the tanh one "gelu_new"
    gelu_name = "gelu" if config.get("gelu") == "erf" else "gelu_new"
    check((cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_inner, cfg.n_positions, cfg.vocab_size) ==
          (L, C, NH, int(config["ffn_hidden_size"]), int(config["max_position_embeddings"]), int(config["vocab_size"]))
          and cfg.activation_function == gelu_name and cfg.layer_norm_epsilon == 1e-5,
          f"config.json: shapes, {gelu_name}, eps 1e-5", str(cfg))

with torch.no_grad():
    theirs = model(torch.tensor([tokens])).logits[0].double().numpy()
mine = np.loadtxt(our_logits_path, ndmin=2)
if mine.shape != theirs.shape:
    check(False, "logits", f"shapes differ: ours {mine.shape}, transformers {theirs.shape}")
else:
    diff = np.abs(mine - theirs).max()
    scale = max(1.0, np.abs(theirs).max())
    tol = 1e-4 * scale
    check(diff <= tol, f"logits of {len(tokens)} tokens match transformers: max |diff| {diff:.3g}, "
          f"max |logit| {np.abs(theirs).max():.3g}, tolerance {tol:.3g}, "
          f"relative {diff / scale:.3g}", f"max |diff| {diff:.3g} > {tol:.3g}")
sys.exit(1 if failures else 0)
