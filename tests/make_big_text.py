#!/usr/bin/env python3
"""tests/make_big_text.py OUT.docs [--min-bytes N] [--jsonl OUT.jsonl] — at least N bytes (10 MiB
by default) of the text a Debian machine ships, as documents, for the tokenizer's tests.

    /usr/bin/python3 tests/make_big_text.py tests/build/tokenizer/big.docs

One document per file, taken in turn from each of these sources, each in sorted path order:
the license texts (/usr/share/common-licenses), packages' documentation (/usr/share/doc:
copyright files, changelogs, NEWS, READMEs, .txt and .md; .gz files decompressed), the other
files under /usr/share/doc, manual pages' troff sources (/usr/share/man, decompressed), and the
Python standard library's sources (/usr/lib/python3.*: code, with its own tests' Unicode).
A file that is not valid UTF-8 or holds a NUL byte is skipped (counted in the summary line),
not decoded with replacement characters; a file over 256 KiB is cut at its last newline
before that size. It stops once it has N bytes, and fails if the machine has fewer.
The output is a documents' file as tests/make_torture_text.py writes it; --jsonl also writes
the same documents as JSON lines {"text": ...}, preprocess's input.
"""
import glob
import gzip
import json
import os
import sys

MAX_DOC = 256 * 1024
DOC_NAMES = ("copyright", "changelog", "news", "readme")


def files_under(root):
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if os.path.isfile(path) and not os.path.islink(path):
                out.append(path)
    return out


def sources():
    doc = files_under("/usr/share/doc")
    prose = [p for p in doc if os.path.basename(p).lower().startswith(DOC_NAMES)
             or p.endswith((".txt", ".md", ".txt.gz", ".md.gz"))]
    chosen = set(prose)
    python = sorted(p for d in glob.glob("/usr/lib/python3.*") for p in files_under(d) if p.endswith(".py"))
    return [files_under("/usr/share/common-licenses"), prose, [p for p in doc if p not in chosen],
            files_under("/usr/share/man"), python]


def text_of(path):
    """the file's text, or None where it is not UTF-8 (or holds NUL, or cannot be read)"""
    try:
        with open(path, "rb") as f:
            data = f.read()
        if path.endswith(".gz"):
            data = gzip.decompress(data)
        if b"\0" in data:
            return None
        if len(data) > MAX_DOC:
            cut = data.rfind(b"\n", 0, MAX_DOC)
            data = data[:cut + 1 if cut > 0 else MAX_DOC]
        return data.decode("utf-8")
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError):
        return None


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit("usage: make_big_text.py OUT.docs [--min-bytes N] [--jsonl OUT.jsonl]")
    out, min_bytes, jsonl = args[0], 10 * 1024 * 1024, None
    for flag, value in zip(args[1::2], args[2::2]):
        if flag == "--min-bytes":
            min_bytes = int(value)
        elif flag == "--jsonl":
            jsonl = value
        else:
            sys.exit(f"make_big_text.py: unknown flag {flag}")
    lists = [iter(s) for s in sources()]
    docs, total, skipped = [], 0, 0
    while total < min_bytes and lists:
        for it in list(lists):
            path = next(it, None)
            if path is None:
                lists.remove(it)
                continue
            text = text_of(path)
            if text is None:
                skipped += 1
            elif text:
                docs.append((path, text.encode("utf-8")))
                total += len(docs[-1][1])
    if total < min_bytes:
        sys.exit(f"make_big_text.py: this machine has only {total} bytes of UTF-8 text in the places searched, "
                 f"fewer than {min_bytes}")
    with open(out, "wb") as f:
        for path, data in docs:
            f.write(f"{len(data)} {path}\n".encode() + data + b"\n")
    if jsonl:
        with open(jsonl, "w", encoding="utf-8") as f:
            for _, data in docs:
                f.write(json.dumps({"text": data.decode("utf-8")}, ensure_ascii=False) + "\n")
    print(f"big text: {len(docs)} documents, {total} bytes ({skipped} files skipped: not UTF-8, or NUL bytes) -> {out}")


if __name__ == "__main__":
    main()
