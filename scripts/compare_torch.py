"""scripts/compare_torch.py — gridgpt beside PyTorch on the very same samples (docs/compare-torch.md).

    python3 scripts/compare_torch.py corpus OUT.jsonl
        Debian's changelogs (/usr/share/doc/*/changelog.Debian.gz, one per package on every Debian
        machine), each distinct file once, one document per changelog entry, in a fixed shuffled
        order, so that Megatron's contiguous --split draws every split from every package and year.
    python3 scripts/compare_torch.py train [gridgpt's flags] [--init torch|gridgpt]
        trains nanoGPT's GPT-2 (tests/bench_torch.py's model, the one `make bench` times) with
        PyTorch as `./train_cpu` trains gridgpt's with the same flags: the same samples in the same
        order (read from the .bin/.idx and the sample index .npy files gridgpt caches for this
        --data-path, --split, --seq-length, --seed and sample count; ./preprocess --print-samples
        builds them where they are not there yet, and must agree with this reader on the first
        samples), the same learning-rate schedule, AdamW, clipping and evaluation; it prints
        gridgpt's log lines, so that one parser (scripts/plot_compare.py) reads both logs.

What is the same as gridgpt (train.c, step.h, kernels.cuh), and how:
  - model: pre-LayerNorm blocks (eps 1e-5), learned positions, causal attention, GELU (tanh)
    MLP, biases everywhere, the LM head tied to the embedding; gridgpt pads its vocabulary but
    leaves the padded rows out of the softmax, so the PyTorch model has the unpadded vocabulary;
  - init (--init torch): GPT-2's as nanoGPT draws it with torch.manual_seed(--seed): every matrix
    and embedding N(0, std), the two output projections N(0, std / sqrt(2 x layers)), biases 0,
    LayerNorms 1 and 0; (--init gridgpt) gridgpt's own values for --seed, computed here from its
    counter-based generator (gpt.h normal_at), which makes the two runs start from one point;
  - data: sample i of a split is gpt_dataset_get(i mod len): shuffle_idx, then sample_idx's
    (document, offset), then seq-length + 1 tokens through doc_idx; step k's global batch is train
    samples [k x GBS, (k+1) x GBS); the n-th evaluation takes the next eval-iters x GBS valid samples;
  - loss: the mean over every token of the global batch (micro-batches of --micro-batch-size);
  - learning rate: Megatron's, by samples: linear from 0 over the warm-up, then the decay style
    down to --min-lr; step k uses the rate at k x GBS samples;
  - AdamW: torch.optim.AdamW, decay on 2-d tensors only (gridgpt: cols > 1), clip_grad_norm_ with
    clip / (norm + 1e-6) as step.h; evaluation every --eval-interval steps and after the last.
Call it with /usr/bin/python3 (Debian's python3-torch); OMP_NUM_THREADS sets its threads.
"""
import argparse
import glob
import gzip
import hashlib
import json
import math
import os
import random
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# ----------------------------------------------------------------------------
# the corpus: Debian's changelogs


def changelog_entries(raw):
    """The entries of one Debian changelog: from the 'package (version) ...' line to the
    ' -- maintainer  date' trailer inclusive; lines outside any entry (an editor's footer) dropped."""
    entry = []
    for line in raw.split(b"\n"):
        if not entry and not line.strip():
            continue
        entry.append(line)
        if line.startswith(b" -- "):
            text = b"\n".join(entry).strip(b"\n")
            try:
                yield text.decode("utf-8")
            except UnicodeDecodeError:   # an entry from before Debian's changelogs were UTF-8
                yield text.decode("latin-1")
            entry = []


def make_corpus(out):
    files = sorted(glob.glob("/usr/share/doc/*/changelog.Debian.gz"))
    if not files:
        sys.exit("error: no /usr/share/doc/*/changelog.Debian.gz (Debian installs one with every package)")
    seen, docs = set(), []
    for path in files:
        with gzip.open(path) as f:
            raw = f.read()
        digest = hashlib.sha256(raw).digest()   # packages built from one source ship one changelog
        if digest in seen:
            continue
        seen.add(digest)
        docs.extend(changelog_entries(raw))
    random.Random(0).shuffle(docs)
    with open(out, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    size = sum(len(d.encode("utf-8")) for d in docs)
    print(f"corpus: {len(docs)} changelog entries of {len(seen)} distinct changelogs ({len(files)} packages), "
          f"{size / 1e6:.1f} MB of text -> {out}")


# ----------------------------------------------------------------------------
# Megatron's datasets as gridgpt writes them (data.c)

IDX_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}
IDX_HEADER_BYTES = 34
M64 = (1 << 64) - 1


class IndexedDataset:
    """PREFIX.idx (magic, version, dtype, N items, D doc_idx entries, sizes, pointers, doc_idx)
    and PREFIX.bin, mapped."""

    def __init__(self, prefix):
        self.prefix = prefix
        idx = np.fromfile(prefix + ".idx", dtype=np.uint8)
        if bytes(idx[:9]) != b"MMIDIDX\0\0":
            sys.exit(f"error: {prefix}.idx is not a Megatron index")
        self.idx_bytes = len(idx)
        self.dtype = IDX_DTYPES[int(idx[17])]
        n, d = (int(v) for v in idx[18:34].view(np.uint64))
        self.sizes = idx[34:34 + 4 * n].view(np.int32)
        self.pointers = idx[34 + 4 * n:34 + 12 * n].view(np.int64)
        self.bin = np.memmap(prefix + ".bin", dtype=np.uint8, mode="r")
        self.itemsize = np.dtype(self.dtype).itemsize

    def tokens(self, item, offset, count):
        start = int(self.pointers[item]) + offset * self.itemsize
        return self.bin[start:start + count * self.itemsize].view(self.dtype)


def split_bounds(split, num_docs):
    """data.c split_documents (Megatron's get_train_valid_test_split_ over items)."""
    w = [float(x) for x in split.replace("/", ",").split(",")] + [0.0, 0.0]
    w = w[:3]
    bounds = [0]
    for v in w:
        bounds.append(bounds[-1] + round(v / sum(w) * num_docs))   # Python rounds halves to even, as data.c
    diff = bounds[3] - num_docs
    return [bounds[0]] + [b - diff for b in bounds[1:]]


def hash_mix(h, v):
    h = ((h ^ v) * 0x100000001b3) & M64
    return h ^ (h >> 29)


def index_hash(ds, begin, end, seq_length, seed, num_samples):
    """data.c index_hash: the HASH in the cache files' names (every input of the arrays)."""
    h = 0xcbf29ce484222325
    h = hash_mix(h, ds.idx_bytes)
    for s in ds.sizes.tolist():
        h = hash_mix(h, s & 0xffffffff)
    for v in (begin, end, seq_length, seed, num_samples):
        h = hash_mix(h, v & M64)
    h ^= h >> 33
    h = (h * 0xff51afd7ed558ccd) & M64
    h ^= h >> 33
    h = (h * 0xc4ceb9fe1a85ec53) & M64
    return h ^ (h >> 33)


class GPTSplit:
    """One split's GPTDataset from gridgpt's cached doc_idx, sample_idx, shuffle_idx."""

    def __init__(self, ds, name, begin, end, seq_length, seed, num_samples, cache_dir):
        base = os.path.basename(ds.prefix) if cache_dir else ds.prefix
        stem = (f"{cache_dir + '/' if cache_dir else ''}{base}_{name}_indexmap_{num_samples}ns_{seq_length}sl_{seed}s_"
                f"{index_hash(ds, begin, end, seq_length, seed, num_samples):016x}")
        self.doc_idx, self.sample_idx, self.shuffle_idx = (np.load(f"{stem}_{k}.npy", mmap_mode="r")
                                                           for k in ("doc_idx", "sample_idx", "shuffle_idx"))
        self.ds, self.seq_length, self.stem = ds, seq_length, stem
        self.num_samples = len(self.shuffle_idx)

    def get(self, i):
        """data.c gpt_dataset_get: seq_length + 1 tokens of sample i (mod the split's length)."""
        j = int(self.shuffle_idx[i % self.num_samples])
        d, offset = (int(v) for v in self.sample_idx[j])
        out, need = [], self.seq_length + 1
        while need > 0 and d < len(self.doc_idx):
            item = int(self.doc_idx[d])
            take = min(int(self.ds.sizes[item]) - offset, need)
            out.append(self.ds.tokens(item, offset, take))
            need -= take
            d, offset = d + 1, 0
        return np.concatenate(out).astype(np.int64)

    def batch(self, first, count):
        return np.stack([self.get(first + b) for b in range(count)])


def print_samples(a, which, asked, count):
    """./preprocess --print-samples: the first `count` samples of a split as the trainer reads them
    (it builds the split's index cache, as the trainer would, where it is not there yet)."""
    cmd = [os.path.join(ROOT, "preprocess"), "--print-samples", "--data-path", a.data_path, "--seq-length",
           str(a.seq_length), "--seed", str(a.seed), "--num-samples", str(asked), "--split", a.split, "--which", which,
           "--first", str(count)]
    if a.data_cache_path:
        cmd += ["--data-cache-path", a.data_cache_path]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)}: {out.stderr.strip()}")
    return [[int(t) for t in line.split()] for line in out.stdout.split("\n")[:count]]


# ----------------------------------------------------------------------------
# gridgpt's init (gpt.h: normal_at, init_tensor_slice), for --init gridgpt


def splitmix64(x):
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def hash_name(name):   # FNV-1a
    h = 0xcbf29ce484222325
    for c in name.encode():
        h = ((h ^ c) * 0x100000001b3) & M64
    return h


def gridgpt_normal(seed, name, rows, cols, std):
    """std x normal_at(seed, hash(name), row x cols + col) as float32, as gridgpt initializes `name`."""
    with np.errstate(over="ignore"):
        index = np.arange(rows * cols, dtype=np.uint64)
        r1 = splitmix64(np.uint64(seed) ^ splitmix64(np.uint64(hash_name(name)) ^ splitmix64(index)))
        r2 = splitmix64(r1)
    u1 = ((r1 >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / 9007199254740992.0)
    u2 = (r2 >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)
    normal = (np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)).astype(np.float32)
    return (np.float32(std) * normal).reshape(rows, cols)


# ----------------------------------------------------------------------------
# the model and its two inits


def build_model(a):
    import torch
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from bench_torch import GPT   # the model `make bench` times against gridgpt's
    shape = {"padded_vocab": a.vocab_size, "hidden": a.hidden_size, "positions": a.max_position_embeddings,
             "heads": a.num_attention_heads, "ffn": a.ffn_hidden_size, "layers": a.num_layers, "init_std": a.init_method_std}
    torch.manual_seed(a.seed)
    model = GPT(shape)
    out_std = a.init_method_std / math.sqrt(2.0 * a.num_layers)
    with torch.no_grad():
        if a.init == "torch":   # nanoGPT's _init_weights and its scaled c_proj, in one seeded draw
            for name, p in model.named_parameters():
                if name.endswith(("c_proj.weight", "c_fc_proj.weight")):
                    torch.nn.init.normal_(p, std=out_std)
                elif p.dim() == 2:
                    torch.nn.init.normal_(p, std=a.init_method_std)
                elif name.endswith("bias"):
                    torch.nn.init.zeros_(p)
                else:
                    torch.nn.init.ones_(p)
        else:
            load_gridgpt_init(model, a, out_std)
    return model


def load_gridgpt_init(model, a, out_std):
    import torch
    C, F, V, L = a.hidden_size, a.ffn_hidden_size, a.vocab_size, a.num_layers
    H = a.num_attention_heads
    hd = C // H
    padded = -(-V // a.make_vocab_size_divisible_by) * a.make_vocab_size_divisible_by
    std = a.init_method_std
    emb = "language_model.embedding."
    model.wte.weight.copy_(torch.from_numpy(gridgpt_normal(a.seed, emb + "word_embeddings.weight", padded, C, std)[:V]))
    model.wpe.weight.copy_(torch.from_numpy(gridgpt_normal(a.seed, emb + "position_embeddings.weight",
                                                           a.max_position_embeddings, C, std)))
    # gridgpt's fused QKV rows go head by head [q_h | k_h | v_h] (Megatron's); nanoGPT's [all q | all k | all v]
    qkv_rows = np.array([h * 3 * hd + part * hd + i for part in range(3) for h in range(H) for i in range(hd)])
    out_std32 = float(np.float32(std) / np.sqrt(np.float32(2.0 * L), dtype=np.float32))   # gpt.h: std / sqrtf(2 L)
    for l, block in enumerate(model.blocks):
        pre = f"language_model.encoder.layers.{l}."
        block.c_attn.weight.copy_(torch.from_numpy(
            gridgpt_normal(a.seed, pre + "self_attention.query_key_value.weight", 3 * C, C, std)[qkv_rows]))
        block.c_proj.weight.copy_(torch.from_numpy(gridgpt_normal(a.seed, pre + "self_attention.dense.weight", C, C, out_std32)))
        block.c_fc.weight.copy_(torch.from_numpy(gridgpt_normal(a.seed, pre + "mlp.dense_h_to_4h.weight", F, C, std)))
        block.c_fc_proj.weight.copy_(torch.from_numpy(gridgpt_normal(a.seed, pre + "mlp.dense_4h_to_h.weight", C, F, out_std32)))
        for lin in (block.c_attn, block.c_proj, block.c_fc, block.c_fc_proj):
            torch.nn.init.zeros_(lin.bias)
        for ln in (block.ln_1, block.ln_2):
            torch.nn.init.ones_(ln.weight)
            torch.nn.init.zeros_(ln.bias)
    torch.nn.init.ones_(model.ln_f.weight)
    torch.nn.init.zeros_(model.ln_f.bias)


# ----------------------------------------------------------------------------
# the schedule and the run


def learning_rate(a, samples):
    """train.c learning_rate (Megatron's OptimizerParamScheduler.get_lr), by samples."""
    max_lr, min_lr = float(np.float32(a.lr)), float(np.float32(a.min_lr))   # gridgpt holds them in float
    decay = (a.lr_decay_iters or a.train_iters) * a.global_batch_size
    warmup = a.lr_warmup_iters * a.global_batch_size
    if warmup > 0 and samples <= warmup:
        return float(np.float32(max_lr) * np.float32(samples / warmup))
    if a.lr_decay_style == "constant":
        return max_lr
    if samples > decay:
        return min_lr
    ratio = (samples - warmup) / (decay - warmup)
    coeff = 1.0 - ratio if a.lr_decay_style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
    return float(np.float32(min_lr + coeff * (max_lr - min_lr)))


def parse_train_args(argv):
    p = argparse.ArgumentParser(prog="compare_torch.py train", allow_abbrev=False,
                                description="gridgpt's flags (the subset this comparison uses, gridgpt's defaults)")
    p.add_argument("--data-path", required=True)
    p.add_argument("--data-cache-path")
    p.add_argument("--split", default="969,30,1")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--num-layers", type=int, required=True)
    p.add_argument("--hidden-size", type=int, required=True)
    p.add_argument("--num-attention-heads", type=int, required=True)
    p.add_argument("--ffn-hidden-size", type=int, default=0)
    p.add_argument("--seq-length", type=int, required=True)
    p.add_argument("--max-position-embeddings", type=int, default=0)
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    p.add_argument("--init-method-std", type=float, default=0.02)
    p.add_argument("--micro-batch-size", type=int, default=1)
    p.add_argument("--global-batch-size", type=int, required=True)
    p.add_argument("--train-iters", type=int, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--min-lr", type=float, default=0.0)
    p.add_argument("--lr-decay-style", default="linear", choices=["constant", "linear", "cosine"])
    p.add_argument("--lr-warmup-iters", type=int, default=0)
    p.add_argument("--lr-decay-iters", type=int, default=0)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--adam-beta1", type=float, default=0.9)
    p.add_argument("--adam-beta2", type=float, default=0.999)
    p.add_argument("--adam-eps", type=float, default=1e-8)
    p.add_argument("--clip-grad", type=float, default=1.0)
    p.add_argument("--eval-interval", type=int, default=1000)
    p.add_argument("--eval-iters", type=int, default=100)
    p.add_argument("--log-interval", type=int, default=100)
    p.add_argument("--exit-interval", type=int, default=0, help="stop after this step (and its evaluation)")
    p.add_argument("--init", default="torch", choices=["torch", "gridgpt"],
                   help="torch: nanoGPT's init drawn by torch.manual_seed(--seed); gridgpt: gridgpt's values for --seed")
    a = p.parse_args(argv)
    a.ffn_hidden_size = a.ffn_hidden_size or 4 * a.hidden_size
    a.max_position_embeddings = a.max_position_embeddings or a.seq_length
    if a.global_batch_size % a.micro_batch_size:
        p.error("--global-batch-size must be a multiple of --micro-batch-size")
    return a


def train(argv):
    a = parse_train_args(argv)
    import torch
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.set_flush_denormal(True)   # else the steps slow several-fold as weights go denormal
    GBS, MBS, T = a.global_batch_size, a.micro_batch_size, a.seq_length
    ds = IndexedDataset(a.data_path)
    bounds = split_bounds(a.split, len(ds.sizes))
    asked = {"train": a.train_iters * GBS, "valid": (a.train_iters // a.eval_interval + 1) * a.eval_iters * GBS}
    splits = {}
    for k, name in enumerate(("train", "valid")):
        first = print_samples(a, name, asked[name], 3)   # builds the index where gridgpt has not yet
        splits[name] = GPTSplit(ds, name, bounds[k], bounds[k + 1], T, a.seed, asked[name], a.data_cache_path)
        if any(splits[name].get(i).tolist() != sample for i, sample in enumerate(first)):
            sys.exit(f"error: the {name} samples read here differ from ./preprocess --print-samples's: this reader is wrong")
        print(f"data:   {name}: documents [{bounds[k]}, {bounds[k + 1]}), {asked[name]} samples asked, "
              f"{splits[name].num_samples} in the index {os.path.basename(splits[name].stem)}_*.npy; the first "
              f"{len(first)} equal to ./preprocess --print-samples's")
    model = build_model(a)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(a.adam_beta1, a.adam_beta2), eps=a.adam_eps)
    params = sum(p.numel() for p in model.parameters())
    print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} thread(s), flush-denormal on; {params} parameters, "
          f"init {a.init} (seed {a.seed}); training: {a.train_iters} iterations, micro-batch {MBS}, global batch {GBS}")
    sys.stdout.flush()

    def batch_loss(tokens, backward):
        x = torch.from_numpy(tokens[:, :-1])
        y = torch.from_numpy(tokens[:, 1:].copy())
        loss = model(x, y)
        if backward:
            (loss * (MBS / GBS)).backward()   # the mean over the global batch's tokens
        return loss.item()

    valid_consumed = 0

    def evaluate(what):
        nonlocal valid_consumed
        model.eval()
        total = 0.0
        with torch.no_grad():
            for _ in range(a.eval_iters):
                total += sum(batch_loss(splits["valid"].batch(valid_consumed + m, MBS), False)
                             for m in range(0, GBS, MBS)) / (GBS // MBS)
                valid_consumed += GBS
        model.train()
        loss = total / a.eval_iters
        line = f" {what} | lm loss value: {loss:.6E} | lm loss PPL: {math.exp(loss):.6E} | "
        print("-" * len(line) + "\n" + line + "\n" + "-" * len(line))
        sys.stdout.flush()
        return loss

    start, window, window_loss = time.time(), time.time(), 0.0
    for it in range(a.train_iters):
        lr = learning_rate(a, it * GBS)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss = sum(batch_loss(splits["train"].batch(it * GBS + m, MBS), True) for m in range(0, GBS, MBS)) / (GBS // MBS)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip_grad) if a.clip_grad > 0 else float("nan")
        opt.step()
        done = it + 1
        window_loss += loss
        if done % a.log_interval == 0 or done == a.train_iters:
            steps = (done - 1) % a.log_interval + 1
            ms = 1000.0 * (time.time() - window) / steps
            print(f" [{time.strftime('%Y-%m-%d %H:%M:%S')}] iteration {done:8d}/{a.train_iters:8d} | consumed samples: {done * GBS:12d} | elapsed time per "
                  f"iteration (ms): {ms:.1f} | learning rate: {learning_rate(a, done * GBS):.6E} | global batch size: "
                  f"{GBS:5d} | lm loss: {window_loss / steps:.6E} | grad norm: {float(norm):.3f} |")
            sys.stdout.flush()
            window, window_loss = time.time(), 0.0
        if done % a.eval_interval == 0 and done < a.train_iters:
            evaluate(f"validation loss at iteration {done}")
        if a.exit_interval and done % a.exit_interval == 0 and done < a.train_iters:
            print(f"stopping at iteration {done} (--exit-interval)")
            return
    evaluate("validation loss at the end of training")
    print(f"summary: {a.train_iters} iterations in {time.time() - start:.1f} s")


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "corpus":
        make_corpus(sys.argv[2])
    elif len(sys.argv) >= 2 and sys.argv[1] == "train":
        train(sys.argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
