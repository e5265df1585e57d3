#!/usr/bin/env python3
"""tests/hf_pipeline.py — a whole Hugging Face export (issue 46, item 5), run by tests/test_hf.sh.

usage: hf_pipeline.py GPT2_DIR SAMPLE PROMPT N TOKENIZER_DIR OTHER_DIR...

  GPT2_DIR: train_cpu --export-hf of a small random GPT-2-shaped model with GPT-2's vocabulary,
  with the tokenizer flags (tests/data/gpt2's files: TOKENIZER_DIR/encoder.json, vocab.bpe);
  SAMPLE: train_cpu's stdout of its greedy generation (--top-k 1) of N tokens after PROMPT;
  OTHER_DIR: exports of other architectures (Bloom, Llama) with the same tokenizer.

  - pipeline("text-generation", model=GPT2_DIR) loads the directory alone (model, tokenizer,
    generation config), and its greedy continuation of PROMPT is gridgpt's token for token (its
    ids decoded without clean-up, against the sample's text: gridgpt prints text only);
  - the small JSON files equal what transformers itself writes for that model and tokenizer
    (GenerationConfig.from_model_config(config).save_pretrained, GPT2Tokenizer.save_pretrained
    with model_max_length the model's positions; transformers_version left out), and vocab.json
    and merges.txt hold the same maps as tests/data/gpt2's files;
  - AutoTokenizer.from_pretrained of every export encodes a few texts exactly as GPT2Tokenizer
    made from tests/data/gpt2's files does.
One PASS or FAIL line per check; exit status 1 if any failed.
"""
import json
import os
import sys
import tempfile

from transformers import AutoConfig, AutoTokenizer, GenerationConfig, GPT2Tokenizer, pipeline

gpt2_dir, sample_path, prompt, n_new, tok_dir = sys.argv[1:6]
other_dirs = sys.argv[6:]
failures = 0


def check(ok, name, why=""):
    global failures
    failures += not ok
    print(f"PASS {name}" if ok else f"FAIL {name}: {why}")
    sys.stdout.flush()


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def sample_text(path):
    """the text between train_cpu's sample header and the dashes that close it"""
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    start = next(i for i, l in enumerate(lines) if l.startswith(b"---------- sample")) + 1
    end = max(i for i, l in enumerate(lines) if l.startswith(b"------") and i > start)
    return b"\n".join(lines[start:end]).decode("utf-8", errors="replace")   # as GPT2Tokenizer decodes


reference = GPT2Tokenizer(os.path.join(tok_dir, "encoder.json"), os.path.join(tok_dir, "vocab.bpe"))

# ---- pipeline: the directory alone is a text generator, greedy as gridgpt's
generator = pipeline("text-generation", model=gpt2_dir, device="cpu")
out = generator(prompt, max_new_tokens=int(n_new), do_sample=False, return_tensors=True)[0]["generated_token_ids"]
theirs = generator.tokenizer.decode(out, clean_up_tokenization_spaces=False)
ours = sample_text(sample_path)
check(theirs == ours, f"pipeline('text-generation') of the export continues '{prompt}' greedily as gridgpt does "
      f"({len(out)} tokens)", f"transformers {theirs!r}, gridgpt {ours!r}")

# ---- the small files as transformers writes them for this model and tokenizer
config = AutoConfig.from_pretrained(gpt2_dir)
with tempfile.TemporaryDirectory() as ref_dir:
    GenerationConfig.from_model_config(config).save_pretrained(ref_dir)
    want = load_json(os.path.join(ref_dir, "generation_config.json"))
    want.pop("transformers_version")
    got = load_json(os.path.join(gpt2_dir, "generation_config.json"))
    check(got == want, "generation_config.json is GenerationConfig.from_model_config's", f"{got} != {want}")
    positions = getattr(config, "n_positions", None) or config.max_position_embeddings
    GPT2Tokenizer(os.path.join(tok_dir, "encoder.json"), os.path.join(tok_dir, "vocab.bpe"),
                  model_max_length=positions).save_pretrained(ref_dir)
    for name in ("tokenizer_config.json", "special_tokens_map.json", "vocab.json"):
        got, want = load_json(os.path.join(gpt2_dir, name)), load_json(os.path.join(ref_dir, name))
        check(got == want, f"{name} holds what GPT2Tokenizer.save_pretrained writes", f"{got} != {want}"[:400])
    with open(os.path.join(gpt2_dir, "merges.txt"), "rb") as a, open(os.path.join(ref_dir, "merges.txt"), "rb") as b:
        check(a.read() == b.read(), "merges.txt is GPT2Tokenizer.save_pretrained's byte for byte")

# ---- AutoTokenizer of every export encodes as tests/data/gpt2's files do
TEXTS = ["Hello, my name is", " leading spaces  and  double\nnewlines\n\n", "naïve café 東京 🙂 x<|endoftext|>y",
         "1234567 ids'll don't"]
for d in [gpt2_dir] + other_dirs:
    kind = AutoConfig.from_pretrained(d).model_type
    tok = AutoTokenizer.from_pretrained(d)
    bad = [t for t in TEXTS if tok.encode(t) != reference.encode(t)]
    check(not bad, f"{kind}: AutoTokenizer ({type(tok).__name__}) encodes {len(TEXTS)} texts as tests/data/gpt2's files",
          f"differs on {bad[:1]!r}: {tok.encode(bad[0]) if bad else ''} != {reference.encode(bad[0]) if bad else ''}")
sys.exit(1 if failures else 0)
