"""tests/bench_torch.py KEY=VALUE... — PyTorch's training step for one of tests/bench.c's shapes,
measured in the same `make bench` run, so that the comparison is of two measurements on one
machine in one hour, never of ours against a remembered figure.

tests/bench.sh passes the "same shape:" line that tests/bench.c prints (layers, hidden, heads,
ffn, vocabulary, positions, micro-batch, sequence, warm-up and timed steps, AdamW's settings)
and runs this script the way docs/measured.md says PyTorch must be run for a fair comparison:
  - Debian's python3-torch, on the OpenMP flavour of OpenBLAS (LD_LIBRARY_PATH to its folder),
    with the kernels gridgpt chose for this CPU (OPENBLAS_CORETYPE, as bench.sh passes it); and,
    with TORCH_PYTHON, PyPI's torch 2.x in a venv, on the MKL it brings (the same settings);
  - fp32, OMP_NUM_THREADS threads (torch.set_num_threads), torch.set_flush_denormal(True)
    (without it the step slows several-fold within a dozen steps as weights go denormal);
  - the same model as gridgpt's: nanoGPT's GPT-2 (pre-LayerNorm blocks, causal attention written
    out as matmuls, GELU (tanh) MLP of ffn, tied LM head), the vocabulary padded as ours;
  - the same step: zero the gradients, forward, cross-entropy, backward, clip the gradient norm,
    AdamW (weight decay on matrices only), one micro-batch of random tokens below the vocabulary.
Prints the library it ran on and one line "torch step ms: MEDIAN MIN" for bench.sh.
"""
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, hidden, heads, ffn):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(hidden)
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.c_proj = nn.Linear(hidden, hidden)
        self.ln_2 = nn.LayerNorm(hidden)
        self.c_fc = nn.Linear(hidden, ffn)
        self.c_fc_proj = nn.Linear(ffn, hidden)

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.c_fc_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.wte = nn.Embedding(s["padded_vocab"], s["hidden"])
        self.wpe = nn.Embedding(s["positions"], s["hidden"])
        self.blocks = nn.ModuleList(Block(s["hidden"], s["heads"], s["ffn"]) for _ in range(s["layers"]))
        self.ln_f = nn.LayerNorm(s["hidden"])
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=s["init_std"])

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(T))
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()   # the LM head tied to the embedding
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def parse(args):
    shape = {}
    for arg in args:
        key, _, value = arg.partition("=")
        shape[key] = float(value) if any(c in value for c in ".e") else int(value)
    return shape


def blas_in_use():
    """The libopenblas this process mapped (the flavour is in its folder's name), else MKL where
    this torch was built with it (PyPI's wheels link it into libtorch_cpu)."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libopenblas" in line or "libblas" in line}
    if paths:
        return ", ".join(sorted(paths))
    return "MKL (in libtorch)" if torch.backends.mkl.is_available() else "none mapped"


def main():
    s = parse(sys.argv[1:])
    torch.manual_seed(1234)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    torch.set_flush_denormal(True)
    model = GPT(s)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": s["weight_decay"]},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=s["lr"], betas=(s["beta1"], s["beta2"]), eps=s["eps"])
    generator = torch.Generator().manual_seed(20240601)
    tokens = torch.randint(0, s["vocab"], (s["micro_batch"], s["seq"]), generator=generator)
    targets = torch.randint(0, s["vocab"], (s["micro_batch"], s["seq"]), generator=generator)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s["clip"])
        optimizer.step()
        return loss.item()

    first = None
    for _ in range(s["warmup"]):
        loss = step()
        first = loss if first is None else first
    times = []
    for _ in range(s["timed"]):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    params = sum(p.numel() for p in model.parameters())
    print(f"   PyTorch {torch.__version__}, {torch.get_num_threads()} thread(s), flush-denormal on, "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}, BLAS: {blas_in_use()}")
    print(f"   {params} parameters; loss {first:.4f} at the first warm-up step -> {loss:.4f} at the last timed step")
    print(f"torch step ms: {1e3 * statistics.median(times):.1f} {1e3 * min(times):.1f}")


if __name__ == "__main__":
    main()
