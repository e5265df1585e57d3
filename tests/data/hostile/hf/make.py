#!/usr/bin/env python3
"""tests/data/hostile/hf/make.py — small hostile Hugging Face model directories (issue 45).

Each NAME/ holds a config.json and a model.safetensors of a few hundred bytes: a tiny GPT-2 (1
layer, hidden 4, 1 head, 4 positions, vocabulary 4) or Llama (1 layer, hidden 4, 2 heads, MLP 4),
F16, written by hand (no torch), then broken in one way. EXPECTED lists what
`train_cpu --import-hf NAME --save TMP` must do with each: its exit status and a piece of its
one line (tests/test_hf.sh checks both; the sanitizer sweep runs them all under ASan and UBSan).
Run it to write them again: python3 tests/data/hostile/hf/make.py
"""
import json
import math
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
C, V, P = 4, 4, 4

# name: (exit status, a piece of the output: the error line, or a note for status 0)
EXPECTED = {
    "gpt2_ok": (0, "imported"),
    "llama_ok": (0, "imported"),
    "offsets_five": (2, "data_offsets is not [begin, end], two integers"),
    "offsets_negative": (2, "data_offsets is not [begin, end], two integers"),
    "offsets_string": (2, "data_offsets is not [begin, end], two integers"),
    "offsets_reversed": (2, "data_offsets is not [begin, end], two integers"),
    "offsets_past_end": (2, "(truncated?)"),
    "shape_negative": (2, "its shape is not a list of at most 8 sizes"),
    "header_not_object": (2, "its header is not a JSON object"),
    "header_length_huge": (2, "but only"),
    "header_not_json": (2, "not JSON"),
    "config_duplicate_key": (2, '"layer_norm_epsilon" is given twice in one object'),
    "header_duplicate_tensor": (2, '"transformer.ln_f.bias" is given twice in one object'),
    "llama_max_positions_zero": (2, '"max_position_embeddings": 0, expected a positive length'),
    "llama_rms_eps_zero": (2, "--norm-epsilon must be positive"),
    "eps_string": (2, '"layer_norm_epsilon" is a string, expected a number'),
    "zero_size_inside": (2, "holds no bytes (a zero-size tensor)"),
    "gap": (2, "belong to no tensor (a gap before"),
    "trailing_bytes": (2, "trailing bytes"),
    "name_newline": (2, "tensor evil\\x0aname: expected {"),
    "nan_weights": (0, "note: 3 weights are NaN or infinite, in 1 tensor (the first: transformer.wpe.weight)"),
}


def gpt2():
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 1, "n_embd": C, "n_head": 1,
              "n_positions": P, "vocab_size": V, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new"}
    h = "transformer.h.0."
    shapes = [("transformer.wte.weight", [V, C]), ("transformer.wpe.weight", [P, C]),
              (h + "ln_1.weight", [C]), (h + "ln_1.bias", [C]), (h + "attn.c_attn.weight", [C, 3 * C]),
              (h + "attn.c_attn.bias", [3 * C]), (h + "attn.c_proj.weight", [C, C]), (h + "attn.c_proj.bias", [C]),
              (h + "ln_2.weight", [C]), (h + "ln_2.bias", [C]), (h + "mlp.c_fc.weight", [C, 4 * C]),
              (h + "mlp.c_fc.bias", [4 * C]), (h + "mlp.c_proj.weight", [4 * C, C]), (h + "mlp.c_proj.bias", [C]),
              ("transformer.ln_f.weight", [C]), ("transformer.ln_f.bias", [C])]
    return config, shapes


def llama():
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1, "hidden_size": C,
              "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 4, "max_position_embeddings": P,
              "vocab_size": V, "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False}
    l = "model.layers.0."
    shapes = [("model.embed_tokens.weight", [V, C]), (l + "input_layernorm.weight", [C]),
              (l + "self_attn.q_proj.weight", [C, C]), (l + "self_attn.k_proj.weight", [C, C]),
              (l + "self_attn.v_proj.weight", [C, C]), (l + "self_attn.o_proj.weight", [C, C]),
              (l + "post_attention_layernorm.weight", [C]), (l + "mlp.gate_proj.weight", [4, C]),
              (l + "mlp.up_proj.weight", [4, C]), (l + "mlp.down_proj.weight", [C, 4]), ("model.norm.weight", [C]),
              ("lm_head.weight", [V, C])]
    return config, shapes


def tensors(shapes, values=None):
    """the header's entries (a dict in file order) and the F16 data, back to back"""
    header, data = {}, b""
    for k, (name, shape) in enumerate(shapes):
        n = math.prod(shape)
        vals = values.get(name) if values else None
        vals = vals or [((k * 7 + i) % 11 - 5) / 16 for i in range(n)]
        blob = struct.pack("<%de" % n, *vals)
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    return header, data


def header_text(header):
    return json.dumps({"__metadata__": {"format": "pt"}, **header}, separators=(",", ":"))


def write(name, config, text, data, length=None, config_text=None):
    d = os.path.join(HERE, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write(config_text if config_text is not None else json.dumps(config, indent=1) + "\n")
    raw = text.encode()
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(raw) if length is None else length) + raw + data)


def with_offsets(header, name, offsets):
    """header's text with one tensor's data_offsets replaced by the raw JSON `offsets`"""
    text = header_text(header)
    old = json.dumps(header[name]["data_offsets"], separators=(",", ":"))
    entry = text.index('"%s":' % name)
    at = text.index(old, entry)
    return text[:at] + offsets + text[at + len(old):]


def main():
    g, gs = gpt2()
    lc, ls = llama()
    gh, gd = tensors(gs)
    lh, ld = tensors(ls)
    write("gpt2_ok", g, header_text(gh), gd)
    write("llama_ok", lc, header_text(lh), ld)
    b, e = gh["transformer.ln_f.bias"]["data_offsets"]
    write("offsets_five", g, with_offsets(gh, "transformer.ln_f.bias", "[%d,%d,1,2,3]" % (b, e)), gd)
    write("offsets_negative", g, with_offsets(gh, "transformer.ln_f.bias", "[-4,%d]" % e), gd)
    write("offsets_string", g, with_offsets(gh, "transformer.ln_f.bias", '["%d",%d]' % (b, e)), gd)
    write("offsets_reversed", g, with_offsets(gh, "transformer.ln_f.bias", "[%d,%d]" % (e, b)), gd)
    write("offsets_past_end", g, with_offsets(gh, "transformer.ln_f.bias", "[%d,%d]" % (b + 64, e + 64)), gd)
    text = header_text(gh).replace('"shape":[4],"data_offsets":[%d' % b, '"shape":[-4],"data_offsets":[%d' % b)
    write("shape_negative", g, text, gd)
    write("header_not_object", g, "[1,2,3]   ", gd)
    write("header_length_huge", g, header_text(gh), gd, length=1 << 40)
    write("header_not_json", g, header_text(gh)[:-9] + "}}", gd)
    text = json.dumps(g, indent=1)   # 1e-5, then 1e-6: json.load (transformers) takes the last
    write("config_duplicate_key", g, header_text(gh), gd, config_text=text[:-2] + ',\n "layer_norm_epsilon": 1e-06\n}\n')
    entry = '"transformer.ln_f.bias":' + json.dumps(gh["transformer.ln_f.bias"], separators=(",", ":"))
    write("header_duplicate_tensor", g, header_text(gh)[:-1] + "," + entry + "}", gd)
    write("llama_max_positions_zero", {**lc, "max_position_embeddings": 0}, header_text(lh), ld)
    write("llama_rms_eps_zero", {**lc, "rms_norm_eps": 0.0}, header_text(lh), ld)
    write("eps_string", g, header_text(gh), gd, config_text=json.dumps(g, indent=1).replace("1e-05", '"1e-5"'))
    zero = {**gh, "extra.zero": {"dtype": "F16", "shape": [0], "data_offsets": [2, 2]}}
    write("zero_size_inside", g, header_text(zero), gd)
    gap = json.loads(json.dumps(gh))   # 8 bytes of nothing before ln_f.bias
    for name in ("transformer.ln_f.bias",):
        gap[name]["data_offsets"] = [b + 8, e + 8]
    write("gap", g, header_text(gap), gd[:b] + bytes(8) + gd[b:])
    write("trailing_bytes", g, header_text(gh), gd + bytes(8))
    evil = {**gh, "evil\nname": {"shape": [1]}}   # a name with a newline in it (JSON's "\n"), in the error line
    write("name_newline", g, header_text(evil), gd)
    nan = {"transformer.wpe.weight": [float("nan"), float("inf"), -float("inf")] + [0.5] * (P * C - 3)}
    nh, nd = tensors(gs, nan)
    write("nan_weights", g, header_text(nh), nd)
    with open(os.path.join(HERE, "EXPECTED"), "w") as f:
        f.write("# NAME STATUS PIECE: `train_cpu --import-hf NAME --save TMP` exits STATUS and prints PIECE (make.py writes this)\n")
        for name, (status, piece) in EXPECTED.items():
            f.write("%s %d %s\n" % (name, status, piece))


if __name__ == "__main__":
    main()
