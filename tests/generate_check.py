#!/usr/bin/env python3
"""tests/generate_check.py LABEL HF_DIR LOG PROMPT MAX_NEW — our greedy generation against
transformers' on the same model (./train_cpu --export-hf's HF_DIR, GPT2LMHeadModel,
BloomForCausalLM or LlamaForCausalLM): model.generate(prompt ids, do_sample=False,
max_new_tokens=MAX_NEW), which stops at the config's eos (the byte vocabulary's
end-of-document, 256), as our default does.

LOG is ./train_cpu's output for a byte-level model: the sample between the
'---------- sample' line and the dashes under it is the prompt, then a byte per token, then
'\\n<|endoftext|>\\n' where the end-of-document token was drawn. Prints one PASS/FAIL line:
the token ids must be equal, one for one.
"""
import re
import sys

import torch
from transformers import AutoModelForCausalLM

EOD = 256
FOOTER = b"\n" + b"-" * 54 + b"\n"


def our_ids(log, prompt):
    """the new token ids in our log's sample (bytes; the end-of-document as 256)"""
    with open(log, "rb") as f:
        text = f.read()
    header = re.search(rb"^---------- sample [^\n]*\n", text, flags=re.M)
    end = text.rindex(FOOTER)
    sample = text[header.end():end]
    if not sample.startswith(prompt):
        raise SystemExit(f"the sample does not start with the prompt: {sample[:40]!r}")
    sample = sample[len(prompt):]
    ids = list(sample)
    if sample.endswith(b"\n<|endoftext|>\n"):
        ids = list(sample[: -len(b"\n<|endoftext|>\n")]) + [EOD]
    return ids


def main():
    label, hf_dir, log, prompt, max_new = sys.argv[1:6]
    prompt = prompt.encode()
    torch.set_grad_enabled(False)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    ids = torch.tensor([list(prompt)], dtype=torch.long)
    out = model.generate(ids, do_sample=False, max_new_tokens=int(max_new), eos_token_id=EOD, pad_token_id=EOD,
                         attention_mask=torch.ones_like(ids))
    theirs = out[0, ids.shape[1]:].tolist()
    ours = our_ids(log, prompt)
    same = ours == theirs
    why = "" if same else f": ours {ours} vs transformers' {theirs}"
    print(f"{'PASS' if same else 'FAIL'} {label}: greedy tokens equal transformers' generate, {len(theirs)} of them"
          f"{', ending at the end-of-document' if theirs and theirs[-1] == EOD else ''}{why}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
