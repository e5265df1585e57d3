"""Expected GPT sample indexes for tests/test_data.c, beyond the one Megatron fixture.

Re-derives doc_idx, sample_idx and shuffle_idx the way Megatron's gpt_dataset.py
(_num_epochs, _build_doc_idx, _build_sample_idx, _build_shuffle_idx, in
_build_index_mappings' order, one np.random.RandomState(seed)) does, for the sizes of the
fixture corpus tests/data/megatron/corpus_u16 and a few other (documents, seq_length,
seed, num_samples), including several epochs with and without a separated last epoch.
Case "fixture" reproduces the fixture's own files, which checks this script.

    python3 tests/data/gen_gpt_index.py tests/data/megatron/corpus_u16/docs.json > tests/data/gpt_index_cases.txt

needs numpy (the legacy RandomState is the point); made with numpy 1.24.2.
"""
import json
import sys

import numpy as np

CASES = [  # name, first doc, end doc, seq_length, seed, num_samples
    ("fixture", 0, 40, 32, 1234, 100),
    ("three_epochs_separate_last", 5, 30, 16, 7, 500),
    ("two_epochs_not_separate", 0, 40, 64, 42, 180),
    ("many_epochs_short_docs", 2, 9, 8, 2**32 - 1, 1000),
    ("one_doc", 19, 20, 5, 0, 3),
]


def index_mappings(sizes, begin, end, seq_length, seed, num_samples):
    documents = np.arange(begin, end, dtype=np.int32)
    tokens_per_epoch = int(np.sum(sizes[documents]))
    epochs, total = 0, 0
    while True:  # smallest number of epochs that yields num_samples samples
        epochs += 1
        total += tokens_per_epoch
        if (total - 1) // seq_length >= num_samples:
            break
    rng = np.random.RandomState(seed=seed)
    separate = False
    if epochs > 1:
        from_full = ((epochs - 1) * tokens_per_epoch - 1) // seq_length
        last = num_samples - from_full
        per_epoch = (tokens_per_epoch - 1) // seq_length
        separate = last < int(0.80 * per_epoch)

    def epochs_of_docs(n):
        d = np.tile(documents, n).astype(np.int32)
        rng.shuffle(d)
        return d

    if separate:
        first = epochs_of_docs(epochs - 1)
        doc_idx = np.concatenate((first, epochs_of_docs(1)))
    else:
        doc_idx = epochs_of_docs(epochs)

    n = (epochs * tokens_per_epoch - 1) // seq_length
    sample_idx = np.zeros((n + 1, 2), dtype=np.int32)
    d, off = 0, 0
    for k in range(1, n + 1):
        remaining = seq_length + 1
        while remaining != 0:
            length = sizes[doc_idx[d]] - off
            remaining -= length
            if remaining <= 0:
                off += remaining + length - 1
                remaining = 0
            else:
                d, off = d + 1, 0
        sample_idx[k] = (d, off)

    first_n = ((epochs - 1) * tokens_per_epoch - 1) // seq_length if separate else n
    dtype = np.uint32 if n < np.iinfo(np.uint32).max - 1 else np.int64
    a = np.arange(0, first_n, dtype=dtype)
    rng.shuffle(a)
    b = np.arange(first_n, n, dtype=dtype)
    rng.shuffle(b)
    shuffle_idx = np.concatenate((a, b))
    return epochs, separate, doc_idx, sample_idx, shuffle_idx


def main():
    sizes = np.array(json.load(open(sys.argv[1]))["sizes"], dtype=np.int32)
    for name, begin, end, seq_length, seed, num_samples in CASES:
        epochs, separate, doc_idx, sample_idx, shuffle_idx = index_mappings(
            sizes, begin, end, seq_length, seed, num_samples)
        print("case", name, begin, end, seq_length, seed, num_samples, epochs, int(separate))
        print("doc_idx", len(doc_idx), *doc_idx.tolist())
        print("sample_idx", sample_idx.size, *sample_idx.reshape(-1).tolist())
        print("shuffle_idx", len(shuffle_idx), *shuffle_idx.tolist())


main()
