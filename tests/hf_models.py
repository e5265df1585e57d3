#!/usr/bin/env python3
"""tests/hf_models.py — transformers' side of the Hugging Face import check (run by tests/test_hf.sh).

usage: hf_models.py make OUT
         writes OUT/NAME/ for each model of MODELS: a randomly initialized GPT2LMHeadModel,
         BloomForCausalLM, LlamaForCausalLM, MixtralForCausalLM or Qwen2MoeForCausalLM (every
         parameter perturbed, norms, biases and routers included, so none is a trivial 1 or 0), saved
         by save_pretrained (safetensors) in its dtype, sharded where asked; OUT/NAME/tokens.txt, 2T+1
         token ids; OUT/NAME/loss.txt, transformers' mean loss (fp32, the saved model read back) over
         the two samples tokens[0..T] and tokens[T..2T] (a mixture of experts: and OUT/NAME/aux.txt,
         its aux_loss on that batch, output_router_logits=True); and OUT/bad/CASE/, the
         variants every refusal is checked on (one thing wrong each), and OUT/good/CASE/, variants
         that must import (no "transformer." prefix with GPT-2's mask buffers, a tied lm_head,
         Llama's config without num_key_value_heads, Mixtral's sliding window longer than its
         positions).
       hf_models.py same HF_DIR EXPORT_DIR
         every tensor of HF_DIR's model (names with or without "transformer.") equals the export's
         bit for bit; an F16 or BF16 tensor, its exact fp32 upcast. One PASS/FAIL line.
       hf_models.py loss EXPORT_DIR TOKENS_FILE
         loads EXPORT_DIR with from_pretrained (refusing missing, unexpected or mismatched keys)
         and prints its mean loss (fp32) over the two samples of the tokens, as `make` does.
       hf_models.py aux HF_DIR ROUTING_FILE TOKEN...
         a mixture of experts' routing on the tokens (one sequence) against ours (ROUTING_FILE:
         tests/hf_logits --routing's lines, each MoE layer's count of rows per expert and sum of
         the router's softmax per expert): the counts equal transformers' top-k choices', layer by
         layer; transformers' aux_loss (load_balancing_loss_func: every layer's router logits
         concatenated, E x sum over the k slots and the experts of the fraction of rows choosing
         the expert x its mean probability) equals that formula computed from our counts and sums,
         within 1e-5 relative. PASS/FAIL lines.
       hf_models.py generate HF_DIR N TOKEN...
         transformers' greedy generate of N tokens after the prompt's ids, past any eos (as
         ./train_cpu --generate-ignore-eod), printed comma-separated.
"""
import json
import os
import shutil
import struct
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import (AutoConfig, AutoModelForCausalLM, BloomConfig, BloomForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM)

T = 16  # tokens per sample
# name: (architecture, config, dtype, max_shard_size or None)
MODELS = {
    # head size 24, 3 heads, an odd vocabulary, n_inner None (4 x 72); GPT2Config's dropout 0.1 (noted)
    "gpt2_f32": ("gpt2", dict(vocab_size=1001, n_positions=40, n_embd=72, n_layer=2, n_head=3), torch.float32, None),
    # head size 40, n_inner set, fp16; 2 heads: TP=2 can split it
    "gpt2_f16": ("gpt2", dict(vocab_size=333, n_positions=24, n_embd=80, n_layer=2, n_head=2, n_inner=100,
                              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0), torch.float16, None),
    # bf16, sharded: the index's path
    "gpt2_bf16_sharded": ("gpt2", dict(vocab_size=257, n_positions=32, n_embd=96, n_layer=3, n_head=4,
                                       activation_function="gelu_pytorch_tanh"), torch.bfloat16, "40KB"),
    # 6 heads (not a power of two: ALiBi's extra slopes), head size 24
    "bloom_f32": ("bloom", dict(vocab_size=333, hidden_size=144, n_layer=2, n_head=6), torch.float32, None),
    # 3 heads of 40, fp16, sharded
    "bloom_f16_sharded": ("bloom", dict(vocab_size=1001, hidden_size=120, n_layer=2, n_head=3, hidden_dropout=0.1),
                          torch.float16, "60KB"),
    # grouped-query attention: 4 heads of 16 sharing 2 key/value heads; tied; rope_theta a float
    # (500000.0, as Llama 3 writes it); an MLP width that is not Megatron's 8h/3 default
    "llama_f32": ("llama", dict(vocab_size=1001, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True), torch.float32, None),
    # bf16, sharded, untied, 4 heads of 32 and as many key/value heads (multi-head), LlamaConfig's eps
    "llama_bf16_sharded": ("llama", dict(vocab_size=777, hidden_size=128, intermediate_size=200, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                                         tie_word_embeddings=False), torch.bfloat16, "200KB"),
    # GELU's exact (erf) form, transformers' "gelu": gridgpt's --gelu erf
    "gpt2_erf": ("gpt2", dict(vocab_size=500, n_positions=20, n_embd=48, n_layer=2, n_head=2, activation_function="gelu",
                              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0), torch.float32, None),
    # Mixtral: 8 experts, each token to 2 (softmax, top-2, renormalized), 4 heads sharing 2
    # key/value heads, untied, rope_theta MixtralConfig's 1e6; the aux loss on in training
    "mixtral_f32": ("mixtral", dict(vocab_size=301, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                            num_local_experts=8, num_experts_per_tok=2, output_router_logits=True,
                                            router_aux_loss_coef=0.02), torch.float32, None),
    # Qwen2-MoE: 8 experts, each token to 4 weighted by the softmax over all 8 (norm_topk_prob
    # false: --moe-router-pre-softmax), a shared expert of its own width and its sigmoid gate, the
    # QKV's biases; bf16, sharded
    "qwen2_moe_bf16_sharded": ("qwen2_moe", dict(vocab_size=333, hidden_size=48, intermediate_size=64, moe_intermediate_size=24,
                                         shared_expert_intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, max_position_embeddings=32, num_experts=8,
                                         num_experts_per_tok=4, norm_topk_prob=False), torch.bfloat16, "60KB"),
    # one layer (transformers' aux loss is then k x Megatron-LM's), norm_topk_prob true (gridgpt's
    # softmax over the top-k), 4 experts to 2, tied embeddings
    "qwen2_moe_one_layer": ("qwen2_moe", dict(vocab_size=257, hidden_size=32, intermediate_size=64,
                                              moe_intermediate_size=32, shared_expert_intermediate_size=16,
                                              num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                              max_position_embeddings=16, num_experts=4, num_experts_per_tok=2,
                                              norm_topk_prob=True, tie_word_embeddings=True), torch.float32, None),
}
MOE = ("mixtral", "qwen2_moe")
# the config.json keys that describe a mixture of experts' model, equal after an import and an export
LLAMA_KEYS = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "max_position_embeddings", "rope_theta", "rms_norm_eps", "tie_word_embeddings", "hidden_act",
              "num_experts_per_tok", "router_aux_loss_coef", "output_router_logits", "intermediate_size"]
CONFIG_KEYS = {"mixtral": LLAMA_KEYS + ["num_local_experts", "sliding_window", "router_jitter_noise"],
               "qwen2_moe": LLAMA_KEYS + ["num_experts", "moe_intermediate_size", "shared_expert_intermediate_size",
                                          "norm_topk_prob", "decoder_sparse_step", "use_sliding_window"]}


def make_model(arch, kwargs, seed):
    torch.manual_seed(seed)
    if arch == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(**kwargs))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**kwargs))
    elif arch == "mixtral":
        model = MixtralForCausalLM(MixtralConfig(**kwargs))
    elif arch == "qwen2_moe":
        model = Qwen2MoeForCausalLM(Qwen2MoeConfig(**kwargs))
    else:
        model = BloomForCausalLM(BloomConfig(**kwargs))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.eval()


def loss_of(model, tokens, aux=False):
    x = torch.tensor([tokens[0:T], tokens[T:2 * T]])
    y = torch.tensor([tokens[1:T + 1], tokens[T + 1:2 * T + 1]])
    with torch.no_grad():
        if aux:  # transformers' load-balancing loss of the batch (its raw value, without the coefficient)
            return model.float()(x, output_router_logits=True).aux_loss.item()
        logits = model.float()(x).logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()


def write_safetensors_by_hand(path, header, data):
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def read_safetensors_by_hand(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def variant(src, dst, config_edit=None, tensors_edit=None):
    shutil.copytree(src, dst)
    if config_edit:
        cfg = json.load(open(os.path.join(dst, "config.json")))
        config_edit(cfg)
        json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    if tensors_edit:
        path = os.path.join(dst, "model.safetensors")
        tensors = load_file(path)
        tensors_edit(tensors)
        save_file(tensors, path, metadata={"format": "pt"})


def make(out):
    for i, (name, (arch, kwargs, dtype, shard)) in enumerate(MODELS.items()):
        model = make_model(arch, kwargs, 100 + i)
        d = os.path.join(out, name)
        g = torch.Generator().manual_seed(7 + i)
        tokens = torch.randint(0, kwargs["vocab_size"], (2 * T + 1,), generator=g).tolist()
        tokens[0], tokens[1] = 0, kwargs["vocab_size"] - 1  # both ends of the vocabulary
        model = model.to(dtype)
        model.save_pretrained(d, max_shard_size=shard) if shard else model.save_pretrained(d)
        with open(os.path.join(d, "tokens.txt"), "w") as f:
            f.write(" ".join(map(str, tokens)) + "\n")
        # the loss of the saved model read back in fp32: a model cast back with .float() would keep
        # Llama's rope frequencies (a buffer) rounded to its dtype, which from_pretrained computes anew
        back = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager").eval()
        with open(os.path.join(d, "loss.txt"), "w") as f:
            f.write("%.9g\n" % loss_of(back, tokens))
        if arch in MOE:
            with open(os.path.join(d, "aux.txt"), "w") as f:
                f.write("%.9g\n" % loss_of(back, tokens, aux=True))
    g2, bl = os.path.join(out, "gpt2_f32"), os.path.join(out, "bloom_f32")
    bad, good = os.path.join(out, "bad"), os.path.join(out, "good")

    def setter(key, value):
        return lambda cfg: cfg.__setitem__(key, value)

    # config.json: each a model gridgpt would compute otherwise, or no model at all
    variant(g2, f"{bad}/relu", setter("activation_function", "relu"))
    variant(g2, f"{bad}/eps", setter("layer_norm_epsilon", 1e-6))
    variant(g2, f"{bad}/untied_config", setter("tie_word_embeddings", False))
    variant(g2, f"{bad}/inverse_layer_idx", setter("scale_attn_by_inverse_layer_idx", True))
    variant(g2, f"{bad}/unscaled", setter("scale_attn_weights", False))
    variant(g2, f"{bad}/cross_attention", setter("add_cross_attention", True))
    variant(g2, f"{bad}/model_type", setter("model_type", "mistral"))
    variant(g2, f"{bad}/architecture", setter("architectures", ["GPT2ForSequenceClassification"]))
    variant(g2, f"{bad}/no_n_layer", lambda cfg: cfg.pop("n_layer"))
    variant(g2, f"{bad}/bad_json", None)
    with open(f"{bad}/bad_json/config.json", "a") as f:
        f.write("}")
    variant(bl, f"{bad}/post_layernorm", setter("apply_residual_connection_post_layernorm", True))
    variant(bl, f"{bad}/bloom_n_inner", setter("n_inner", 100))
    # the tensors: missing, of the wrong shape, unexpected, an untied lm_head, an F64, a file
    # cut short, two tensors on the same bytes, a shard the index gets wrong, no tensor file
    variant(g2, f"{bad}/missing", None, lambda t: t.pop("transformer.h.1.mlp.c_fc.bias"))
    variant(g2, f"{bad}/shape", None, lambda t: t.__setitem__("transformer.ln_f.weight", torch.ones(71)))
    variant(g2, f"{bad}/extra", None, lambda t: t.__setitem__("transformer.h.2.ln_1.weight", torch.ones(72)))
    variant(g2, f"{bad}/untied", None,
            lambda t: t.__setitem__("lm_head.weight", t["transformer.wte.weight"] + 1e-3))
    variant(g2, f"{bad}/f64", None, lambda t: t.__setitem__("transformer.ln_f.bias", t["transformer.ln_f.bias"].double()))
    variant(g2, f"{bad}/truncated")
    path = f"{bad}/truncated/model.safetensors"
    os.truncate(path, os.path.getsize(path) - 100)
    variant(g2, f"{bad}/overlap")
    path = f"{bad}/overlap/model.safetensors"
    header, data = read_safetensors_by_hand(path)
    header["transformer.h.0.ln_1.bias"]["data_offsets"] = header["transformer.h.0.ln_1.weight"]["data_offsets"]
    write_safetensors_by_hand(path, header, data)
    variant(g2, f"{bad}/span")  # data_offsets that do not match the shape
    path = f"{bad}/span/model.safetensors"
    header, data = read_safetensors_by_hand(path)
    a, b = header["transformer.ln_f.bias"]["data_offsets"]
    header["transformer.ln_f.bias"]["data_offsets"] = [a, b - 4]
    write_safetensors_by_hand(path, header, data)
    sh = os.path.join(out, "gpt2_bf16_sharded")
    variant(sh, f"{bad}/index", None)
    path = f"{bad}/index/model.safetensors.index.json"
    index = json.load(open(path))
    files = sorted(set(index["weight_map"].values()))
    name = next(k for k, v in index["weight_map"].items() if v == files[0])
    index["weight_map"][name] = files[1]
    json.dump(index, open(path, "w"))
    variant(g2, f"{bad}/no_tensors")
    os.remove(f"{bad}/no_tensors/model.safetensors")

    # variants that import: the hub's gpt2 layout (no "transformer." prefix, the mask buffers
    # attn.bias and attn.masked_bias saved), and a stored lm_head equal to the embedding
    def hub_layout(t):
        for k in list(t):
            t[k.replace("transformer.", "", 1)] = t.pop(k)
        for l in range(2):
            t[f"h.{l}.attn.bias"] = torch.tril(torch.ones(40, 40)).view(1, 1, 40, 40)
            t[f"h.{l}.attn.masked_bias"] = torch.tensor(-1e4)
    variant(g2, f"{good}/hub_layout", None, hub_layout)
    variant(g2, f"{good}/tied", None, lambda t: t.__setitem__("lm_head.weight", t["transformer.wte.weight"].clone()))

    # Llama: each a model gridgpt would compute otherwise, or a config no model has
    ll, lb = os.path.join(out, "llama_f32"), os.path.join(out, "llama_bf16_sharded")
    variant(ll, f"{bad}/llama_act", setter("hidden_act", "gelu"))
    variant(ll, f"{bad}/llama_rope_scaling", setter("rope_scaling", {"type": "linear", "factor": 2.0}))
    variant(ll, f"{bad}/llama_attention_bias", setter("attention_bias", True))
    variant(ll, f"{bad}/llama_mlp_bias", setter("mlp_bias", True))
    variant(ll, f"{bad}/llama_head_dim", setter("head_dim", 32))
    variant(ll, f"{bad}/llama_tp", setter("pretraining_tp", 2))
    variant(ll, f"{bad}/llama_partial_rotary", setter("partial_rotary_factor", 0.5))
    variant(ll, f"{bad}/llama_rope_theta", setter("rope_theta", 10000.5))
    variant(ll, f"{bad}/llama_kv_heads", setter("num_key_value_heads", 3))
    variant(ll, f"{bad}/llama_untied_head", None,  # tied in config.json, a different lm_head stored
            lambda t: t.__setitem__("lm_head.weight", t["model.embed_tokens.weight"] + 1e-3))
    variant(ll, f"{bad}/llama_missing", None, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    variant(ll, f"{bad}/llama_shape", None,
            lambda t: t.__setitem__("model.layers.0.self_attn.v_proj.weight", torch.ones(64, 64)))
    variant(ll, f"{bad}/llama_extra", None, lambda t: t.__setitem__("model.layers.0.self_attn.q_proj.bias", torch.ones(64)))
    # imports as the model itself: no num_key_value_heads (LlamaConfig's default: the heads)
    variant(lb, f"{good}/llama_no_kv_heads", lambda cfg: cfg.pop("num_key_value_heads"))

    # the mixtures of experts: what gridgpt's model is not (a window shorter than the sequence, dense
    # layers among the MoE ones, a shared expert of no width, no experts)
    mx, qw = os.path.join(out, "mixtral_f32"), os.path.join(out, "qwen2_moe_bf16_sharded")
    variant(mx, f"{bad}/mixtral_window", setter("sliding_window", 8))
    variant(qw, f"{bad}/qwen2_moe_sparse_step", setter("decoder_sparse_step", 2))
    variant(qw, f"{bad}/qwen2_moe_mlp_only_layers", setter("mlp_only_layers", [1]))
    variant(qw, f"{bad}/qwen2_moe_window", lambda cfg: cfg.update(use_sliding_window=True, sliding_window=16))
    variant(qw, f"{bad}/qwen2_moe_no_shared", setter("shared_expert_intermediate_size", 0))
    variant(mx, f"{bad}/mixtral_no_experts", setter("num_local_experts", 0))
    variant(mx, f"{bad}/mixtral_missing_w3", None,
            lambda t: t.pop("model.layers.1.block_sparse_moe.experts.7.w3.weight"))
    # a window no shorter than the sequence changes nothing: the same checkpoint as the model's
    variant(mx, f"{good}/mixtral_long_window", setter("sliding_window", 32))


def loss(export_dir, tokens_file):
    tokens = [int(t) for t in open(tokens_file).read().split()]
    model, info = AutoModelForCausalLM.from_pretrained(export_dir, output_loading_info=True, attn_implementation="eager")
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"{export_dir}: {type(model).__name__}.from_pretrained: {problems}")
    print(f"{type(model).__name__} %.9g" % loss_of(model.eval(), tokens))


def same(hf_dir, export_dir):
    if os.path.exists(os.path.join(hf_dir, "model.safetensors")):
        theirs = load_file(os.path.join(hf_dir, "model.safetensors"))
    else:
        index = json.load(open(os.path.join(hf_dir, "model.safetensors.index.json")))
        theirs = {}
        for f in sorted(set(index["weight_map"].values())):
            theirs.update(load_file(os.path.join(hf_dir, f)))
    ours = load_file(os.path.join(export_dir, "model.safetensors"))
    if json.load(open(os.path.join(hf_dir, "config.json")))["model_type"] not in ("llama",) + MOE:
        theirs = {(k if k.startswith("transformer.") else "transformer." + k): v for k, v in theirs.items()
                  if k != "lm_head.weight" and not k.endswith(("attn.bias", "attn.masked_bias")) or "c_attn" in k}
    dtypes = sorted({str(v.dtype).replace("torch.", "") for v in theirs.values()})
    wrong = [k for k in theirs if k not in ours or ours[k].dtype != torch.float32 or ours[k].shape != theirs[k].shape
             or not torch.equal(ours[k].view(torch.int32), theirs[k].float().view(torch.int32))]
    # a mixture of experts: its config's keys too, as its class reads them (defaults filled in)
    keys = CONFIG_KEYS.get(json.load(open(os.path.join(hf_dir, "config.json")))["model_type"], [])
    a, b = AutoConfig.from_pretrained(hf_dir), AutoConfig.from_pretrained(export_dir)
    keys_wrong = [f"{k}: {getattr(a, k, None)} vs {getattr(b, k, None)}" for k in keys if getattr(a, k, 0) != getattr(b, k, 1)]
    ok = set(theirs) == set(ours) and not wrong and not keys_wrong
    print(("PASS" if ok else "FAIL") + f" {os.path.basename(hf_dir)}: import then export gives back all {len(theirs)} "
          f"tensors bit for bit ({'/'.join(dtypes)} read; the export's fp32 is their exact upcast)" +
          (f" and config.json's {len(keys)} keys of the model" if keys else "") +
          ("" if ok else f": differ {wrong[:3]}, only theirs {sorted(set(theirs) - set(ours))[:3]}, "
                         f"only ours {sorted(set(ours) - set(theirs))[:3]}, config {keys_wrong[:3]}"))
    return ok


def aux(hf_dir, routing_file, tokens):
    """our routing (counts and probability sums per MoE layer) against transformers' on the same tokens"""
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32, attn_implementation="eager").eval()
    cfg = model.config
    E, k = cfg.num_experts if cfg.model_type == "qwen2_moe" else cfg.num_local_experts, cfg.num_experts_per_tok
    with torch.no_grad():
        out = model(torch.tensor([tokens]), output_router_logits=True)
    theirs = [torch.bincount(torch.topk(torch.softmax(g.float(), -1), k, dim=-1)[1].reshape(-1), minlength=E).tolist()
              for g in out.router_logits]
    rows = [line.split() for line in open(routing_file) if line.strip()]
    counts = [[int(c) for c in r[1:1 + E]] for r in rows]
    sums = [[float(p) for p in r[1 + E:1 + 2 * E]] for r in rows]
    name, ok = os.path.basename(hf_dir.rstrip("/")), 0
    same = counts == theirs
    print(("PASS" if same else "FAIL") + f" {name}: each of the {len(rows)} MoE layers sends the same number of the "
          f"{len(tokens)} tokens' {k} choices to each of the {E} experts as transformers' router" +
          ("" if same else f": ours {counts}, theirs {theirs}"))
    # load_balancing_loss_func over the layers' rows together: E x sum_e (rows choosing e / rows) x (sum of p_e / rows)
    n = len(rows) * len(tokens)
    ours = E * sum(sum(c[e] for c in counts) / n * sum(s[e] for s in sums) / n for e in range(E))
    want = out.aux_loss.item()
    close = abs(ours - want) <= 1e-5 * abs(want)
    print(("PASS" if close else "FAIL") + f" {name}: transformers' aux_loss {want:.9g} from our routing: {ours:.9g} "
          f"(within 1e-5 relative; {len(rows)} layers' rows pooled, as load_balancing_loss_func does)")
    return same and close


def generate(hf_dir, n, prompt):
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32, attn_implementation="eager").eval()
    model.generation_config.eos_token_id = None  # past the end of document, as --generate-ignore-eod
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, do_sample=False, max_new_tokens=n, pad_token_id=0, attention_mask=torch.ones_like(ids))
    print(",".join(str(t) for t in out[0, len(prompt):].tolist()))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) >= 4 and len(sys.argv) % 2 == 0 and sys.argv[1] == "same":   # pairs: one import of torch
        sys.exit(0 if all([same(a, b) for a, b in zip(sys.argv[2::2], sys.argv[3::2])]) else 1)
    elif len(sys.argv) == 4 and sys.argv[1] == "loss":
        loss(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 5 and sys.argv[1] == "aux":
        sys.exit(0 if aux(sys.argv[2], sys.argv[3], [int(t) for t in sys.argv[4:]]) else 1)
    elif len(sys.argv) >= 5 and sys.argv[1] == "generate":
        generate(sys.argv[2], int(sys.argv[3]), [int(t) for t in sys.argv[4:]])
    else:
        sys.exit(__doc__)
