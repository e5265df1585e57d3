#!/usr/bin/env python3
"""tests/full_validation_check.py HF_DIR PREFIX T LOSS TOKENS — --full-validation's loss against
transformers' on the same windows.

PREFIX.bin/.idx is a Megatron indexed dataset that ./preprocess wrote (its documents one after
another in the .bin), all of it the split evaluated: its tokens in order, windows i of T + 1
tokens, [i T, i T + T] (the last one shorter): its first T are the model's input (T positions),
each predicting the next token from the ones before it in the window; the loss is the
cross-entropy of transformers' logits, summed over every target and divided by their count. LOSS and TOKENS are what ./train_cpu printed. Prints one PASS/FAIL line: the
same count, the loss within 1e-5 relative (fp32 on both sides).
"""
import array
import sys

import torch
from transformers import AutoModelForCausalLM

# Megatron's .idx dtype codes of integer tokens, as the array module's type codes
DTYPES = {1: "B", 2: "b", 3: "h", 4: "i", 5: "q", 8: "H"}


def tokens_of(prefix):
    with open(prefix + ".idx", "rb") as f:
        header = f.read(18)   # magic (9 bytes), version (8), dtype code (1)
    tokens = array.array(DTYPES[header[17]])
    with open(prefix + ".bin", "rb") as f:
        tokens.frombytes(f.read())
    return tokens


def main():
    hf_dir, prefix, T, loss, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    ids = torch.tensor(tokens_of(prefix), dtype=torch.long)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    total, targets = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, T):
            window = ids[start:start + T + 1]   # T inputs (the model's positions), each with the next as target
            logits = model(input_ids=window[None, :-1]).logits[0].double()
            total += torch.nn.functional.cross_entropy(logits, window[1:], reduction="sum").item()
            targets += len(window) - 1
    theirs = total / targets
    ok = targets == count and abs(loss - theirs) <= 1e-5 * abs(theirs)
    print(("PASS" if ok else "FAIL") + f" --full-validation equals transformers' loss on the same windows: {targets} "
          f"targets in windows of {T} ({count} ours), loss {theirs:.6f} ({loss:.6f} ours)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
