#!/usr/bin/env python3
"""tests/tokenizer_check.py — tokenizer.h's tokens against Hugging Face's, for tests/test_tokenizer.sh
and tests/bench_tokenizer.sh.

  tokenizer_check.py compare LABEL DOCS IDS [--whole] [--fast-too] [--tokenize BIN]
      IDS: what `tokenize --docs VOCAB MERGES DOCS` wrote (without --whole), or what
      `tokenize VOCAB MERGES DOCS` wrote for the whole file as one text (--whole). Each
      document is encoded by transformers' GPT2Tokenizer (the slow one: Python, GPT-2's own
      `regex` pattern and BPE loop) and compared token for token. One PASS line, or a FAIL line
      per differing document (the first 5 in detail: where, the text around, both token lists
      there, and the shortest piece of it that still differs, found by running BIN, the
      tokenize program, on pieces of the document: default tests/build/tokenize).
      --fast-too: and Hugging Face's fast tokenizer (`tokenizers`, Rust) against the slow one,
      in one more PASS or FAIL line: the benchmark times the fast one, so it must do the same work.
  tokenizer_check.py preprocess-equals LABEL PREFIX IDS
      PREFIX.bin/.idx, what `preprocess --tokenizer-type GPT2BPETokenizer --append-eod` made of
      the documents as JSON lines, against IDS (tokenize --docs on the same documents): each
      document's ids then the EOD id (50256), a document without tokens skipped (Megatron's
      preprocess_data.py). Needs no Hugging Face package.
  tokenizer_check.py bench-hf DOCS PASSES
      tokens/s of `tokenizers` (Rust) encoding DOCS on one thread (RAYON_RS_NUM_CPUS=1,
      TOKENIZERS_PARALLELISM=false), as tokenize --bench does: one line.

"<|endoftext|>" in a text is plain text here, as it is to tokenizer.h and to Megatron's
preprocess (which encodes a document's text and then appends the EOD id): GPT2Tokenizer is
called with split_special_tokens=True, so that it encodes the string as the seven tokens
"<", "|", "end", "of", "text", "|", ">" instead of id 50256, and the fast tokenizer is built
from the two files without added tokens. Both read GPT-2's files offline:
tests/data/gpt2/encoder.json and vocab.bpe.
"""
import os
import subprocess
import sys
import tempfile
import time
import unicodedata

VOCAB = "tests/data/gpt2/encoder.json"
MERGES = "tests/data/gpt2/vocab.bpe"
DETAILS = 5   # failing documents shown in detail


def read_docs(path):
    """[(name, text)] from a documents' file: "LENGTH NAME\\n" + LENGTH bytes + "\\n", repeated"""
    data = open(path, "rb").read()
    docs, pos = [], 0
    while pos < len(data):
        eol = data.index(b"\n", pos)
        length, _, name = data[pos:eol].partition(b" ")
        start = eol + 1
        end = start + int(length)
        docs.append((name.decode("utf-8", "replace"), data[start:end].decode("utf-8")))
        pos = end + 1
    return docs


def write_docs(path, docs):
    with open(path, "wb") as f:
        for name, text in docs:
            data = text.encode("utf-8")
            f.write(f"{len(data)} {name}\n".encode() + data + b"\n")


def read_ids(text, whole=False):
    """the ids of each document, as tokenize wrote them: "# NAME" before each document's with --docs,
    else (whole) the ids of one text"""
    if whole:
        return [[int(line) for line in text.split()]]
    docs = []
    for line in text.splitlines():
        if line.startswith("# "):
            docs.append([])
        elif line.strip():
            docs[-1].append(int(line))
    return docs


def slow_tokenizer():
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import GPT2Tokenizer
    return GPT2Tokenizer(vocab_file=VOCAB, merges_file=MERGES)


def fast_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.BPE.from_file(VOCAB, MERGES))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)   # GPT-2's pattern, use_regex=True
    return tok


def slow_encode(tok, text):
    return tok.convert_tokens_to_ids(tok.tokenize(text, split_special_tokens=True))


def shown(tok, ids, most=16):
    """ids with the bytes each stands for (the first most of them)"""
    out = []
    for i in ids[:most]:
        if 0 <= i < len(tok.decoder):
            b = bytes(tok.byte_decoder[c] for c in tok.decoder[i])
            try:
                out.append(f"{i}:{b.decode('utf-8')!r}")
            except UnicodeDecodeError:   # a piece of a character
                out.append(f"{i}:{b!r}")
        else:
            out.append(f"{i}:(no such id)")
    if len(ids) > most:
        out.append(f"... {len(ids) - most} more")
    return "[" + " ".join(out) + "]"


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def ours_on(tokenize, pieces):
    """tokenize's ids for each piece, or None where it failed"""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "pieces.docs")
        write_docs(path, [(str(i), p) for i, p in enumerate(pieces)])
        run = subprocess.run([tokenize, "--docs", VOCAB, MERGES, path], capture_output=True, text=True)
        if run.returncode != 0:
            return None
        return read_ids(run.stdout)


def differing(tok, tokenize, candidates):
    """[(piece, ours, GPT2Tokenizer's)] for the candidates on which the two differ, shortest first"""
    candidates = [c for c in dict.fromkeys(candidates) if c]
    got = ours_on(tokenize, candidates) or []
    out = [(c, g, slow_encode(tok, c)) for c, g in zip(candidates, got)]
    return sorted([x for x in out if x[1] != x[2]], key=lambda x: len(x[0]))


def minimal_piece(tok, tokenize, text):
    """(piece, ours, GPT2Tokenizer's) for a short text on which tokenize and GPT2Tokenizer differ:
    the shortest run of GPT-2 words (pre-tokens) around the first difference that still differs
    (else the shortest single word of text that does), then cut down further by removing
    characters while it still differs; None if no piece differs"""
    import regex
    words = regex.findall(tok.pat, text)
    ours = ours_on(tokenize, [text])
    if ours is None:
        return None
    at = first_difference(slow_encode(tok, text), ours[0])
    k, count = 0, 0   # the word that holds the first differing token
    for k, w in enumerate(words):
        count += len(slow_encode(tok, w))
        if count > at:
            break
    found = (differing(tok, tokenize, ["".join(words[lo:lo + width]) for width in range(1, 9)
                                       for lo in range(max(0, k - width + 1), min(k, len(words) - width) + 1)])
             or differing(tok, tokenize, sorted(set(words), key=len)[:5000]))
    if not found:
        return None
    best = found[0]
    for _ in range(30):   # remove a run of characters (halves, quarters... single ones) while it differs
        p = best[0]
        cuts = sorted({max(1, len(p) >> k) for k in range(1, 12)}, reverse=True)
        candidates = [p[:i] + p[i + c:] for c in cuts for i in range(0, len(p) - c + 1, max(1, c // 2))][:400]
        smaller = differing(tok, tokenize, candidates)
        if not smaller or len(smaller[0][0]) >= len(p):
            break
        best = smaller[0]
    return best


def newer_code_points(text):
    """the code points of text that `regex` knows and this Python's unicodedata does not, as U+XXXX"""
    import regex
    found = sorted({c for c in text if unicodedata.category(c) == "Cn" and regex.match(r"\P{Cn}", c)})
    return ", ".join(f"U+{ord(c):04X}" for c in found)


def compare(label, docs_path, ids_path, whole, fast_too, tokenize):
    t0 = time.time()
    tok = slow_tokenizer()
    docs = read_docs(docs_path) if not whole else [(docs_path, open(docs_path, "rb").read().decode("utf-8"))]
    ours = read_ids(open(ids_path).read(), whole)
    if len(ours) != len(docs):
        print(f"FAIL tokenizer {label}: tokenize wrote ids for {len(ours)} documents, {docs_path} holds {len(docs)}")
        return 1
    tokens, failed, refs = 0, [], []
    for (name, text), got in zip(docs, ours):
        refs.append(slow_encode(tok, text))
        tokens += len(refs[-1])
        if got != refs[-1]:
            failed.append((name, text, got, refs[-1]))
    seconds = time.time() - t0
    if fast_too:
        fast_equals_slow(label, docs, refs)
    if not failed:
        size = sum(len(t.encode()) for _, t in docs)
        print(f"PASS tokenizer {label}: {len(docs)} documents, {size} bytes, {tokens} tokens, all equal to "
              f"GPT2Tokenizer's ({seconds:.1f}s for its encoding)")
        return 0
    for name, text, got, ref in failed[:DETAILS]:
        i = first_difference(got, ref)
        offset = sum(len(bytes(tok.byte_decoder[c] for c in tok.decoder[t])) for t in ref[:i])
        around = text.encode("utf-8")[max(0, offset - 40):offset + 40].decode("utf-8", "replace")
        print(f"FAIL tokenizer {label}: document \"{name}\": {len(got)} tokens, GPT2Tokenizer {len(ref)}; "
              f"first difference at token {i} (byte {offset}), text around it: {around!r}")
        print(f"    ours:          {shown(tok, got[max(0, i - 3):i + 8])}")
        print(f"    GPT2Tokenizer: {shown(tok, ref[max(0, i - 3):i + 8])}")
        m = minimal_piece(tok, tokenize, text) if tokenize and os.path.exists(tokenize) else None
        if m:
            piece, g, r = m
            cut = f"{piece[:100]!r}... ({len(piece)} characters)" if len(piece) > 100 else f"{piece!r} = {piece.encode()!r}"
            print(f"    shortest piece that differs: {cut}: ours {shown(tok, g)}, "
                  f"GPT2Tokenizer {shown(tok, r)}")
        newer = newer_code_points((m[0] if m else "") + around)
        if newer:
            print(f"    note: {newer} unassigned in Python's unicodedata (Unicode {unicodedata.unidata_version}) but "
                  f"assigned for `regex`: if also after Unicode 15.0, tokenizer_unicode.h's table has them as "
                  f"OTHER, a known difference (see its header)")
    others = "".join(f", \"{name}\"" for name, _, _, _ in failed[DETAILS:DETAILS + 10])
    print(f"FAIL tokenizer {label}: {len(failed)} of {len(docs)} documents differ from GPT2Tokenizer's tokens"
          + (f" (also{others[1:]}{'...' if len(failed) > DETAILS + 10 else ''})" if others else ""))
    return 1


def fast_equals_slow(label, docs, refs):
    got = [e.ids for e in fast_tokenizer().encode_batch([t for _, t in docs])]
    differ = [name for (name, _), g, r in zip(docs, got, refs) if g != r]
    if differ:
        print(f"FAIL tokenizer {label}, fast against slow: Hugging Face's fast tokenizer differs from the slow one in {len(differ)} of "
              f"{len(docs)} documents, the first \"{differ[0]}\"")
    else:
        print(f"PASS tokenizer {label}, fast against slow: Hugging Face's fast tokenizer (tokenizers, Rust) equals GPT2Tokenizer (slow) "
              f"token for token on {len(docs)} documents")


def preprocess_equals(label, prefix, ids_path, eod=50256):
    import array
    import struct
    idx = open(prefix + ".idx", "rb").read()
    if idx[:9] != b"MMIDIDX\0\0":
        print(f"FAIL tokenizer {label}: {prefix}.idx is not a Megatron index (its magic)")
        return 1
    code = idx[17]
    typecode = {1: "B", 2: "b", 3: "h", 4: "i", 5: "q", 8: "H"}.get(code)
    if typecode is None:
        print(f"FAIL tokenizer {label}: {prefix}.idx has dtype code {code}, not a token dtype")
        return 1
    got = array.array(typecode)
    got.frombytes(open(prefix + ".bin", "rb").read())
    num_docs = struct.unpack_from("<Q", idx, 26)[0] - 1   # Megatron's: sequences, then documents + 1
    want = []
    for ids in read_ids(open(ids_path).read()):
        if ids:
            want += ids + [eod]
    if list(got) == want:
        print(f"PASS tokenizer {label}: preprocess wrote tokenize's {len(want)} ids (each document's, then EOD) "
              f"as {prefix}.bin ({got.itemsize}-byte ids), {num_docs} documents in the index")
        return 0
    i = first_difference(list(got), want)
    print(f"FAIL tokenizer {label}: {prefix}.bin holds {len(got)} ids, tokenize's documents + EOD make {len(want)}; "
          f"first difference at id {i}: preprocess {list(got[max(0, i - 3):i + 8])}, tokenize {want[max(0, i - 3):i + 8]}")
    return 1


def bench_hf(docs_path, passes):
    os.environ["RAYON_RS_NUM_CPUS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import tokenizers
    tok = fast_tokenizer()
    texts = [t for _, t in read_docs(docs_path)]
    size = sum(len(t.encode()) for t in texts)
    times, tokens = [], 0
    for p in range(passes + 1):   # the first pass fills the BPE cache and is reported apart
        t0 = time.perf_counter()
        tokens = sum(len(e.ids) for e in tok.encode_batch(texts))
        times.append(time.perf_counter() - t0)
    warm, best = sum(times[1:]), min(times[1:])
    print(f"tokenizers {tokenizers.__version__} {tokens * passes / warm * 1e-6:6.2f} M tokens/s "
          f"{size * passes / warm * 1e-6:6.2f} MB/s (best pass {tokens / best * 1e-6:.2f} M tokens/s; first pass, "
          f"cache empty: {tokens / times[0] * 1e-6:.2f} M tokens/s); {tokens} tokens of {size} bytes in {len(texts)} "
          f"documents x {passes} passes, one thread (encode_batch, RAYON_RS_NUM_CPUS=1)")
    return 0


def main():
    a = sys.argv[1:]
    tokenize = "tests/build/tokenize"
    if "--tokenize" in a:
        i = a.index("--tokenize")
        tokenize = a[i + 1]
        del a[i:i + 2]
    whole, fast_too = "--whole" in a, "--fast-too" in a
    a = [x for x in a if x not in ("--whole", "--fast-too")]
    if len(a) == 4 and a[0] == "compare":
        return compare(a[1], a[2], a[3], whole, fast_too, tokenize)
    if len(a) == 4 and a[0] == "preprocess-equals":
        return preprocess_equals(a[1], a[2], a[3])
    if len(a) == 3 and a[0] == "bench-hf":
        return bench_hf(a[1], int(a[2]))
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
