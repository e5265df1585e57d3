#!/usr/bin/env python3
"""scripts/gen_unicode_table.py — writes tokenizer_unicode.h, the code point classes of GPT-2's
pre-tokenizer, from the Unicode Character Database that Debian's `unicode-data` package installs.

GPT-2 splits text with  's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
so the C tokenizer needs one of four classes per code point: letter (\\p{L}: general category
Lu Ll Lt Lm Lo), number (\\p{N}: Nd Nl No), space (\\s, which in Python's `regex` module is the
White_Space property of PropList.txt, not str.isspace: U+001C..U+001F are not \\s there) or other.
The table is two-stage: the code points come in blocks of 256, equal blocks are stored once, and
an index maps each block to its stored copy.
  python3 scripts/gen_unicode_table.py [--ucd /usr/share/unicode] [--output tokenizer_unicode.h]
tests/test_unicode_table.py reruns it and checks that the committed header is its output.
"""
import argparse
import os
import re

OTHER, LETTER, NUMBER, SPACE = 0, 1, 2, 3
CATEGORY_CLASS = {"Lu": LETTER, "Ll": LETTER, "Lt": LETTER, "Lm": LETTER, "Lo": LETTER,
                  "Nd": NUMBER, "Nl": NUMBER, "No": NUMBER}
BLOCK = 256                      # code points per block: cp >> 8 picks the block, cp & 255 the entry
END = 0x110000                   # one past the last code point


def read_classes(ucd):
    """one class per code point, from UnicodeData.txt's categories and PropList.txt's White_Space"""
    classes = bytearray(END)     # unassigned code points stay OTHER
    first = None                 # a range's "<..., First>" line, waiting for its "<..., Last>"
    with open(ucd + "/UnicodeData.txt") as f:
        for line in f:
            fields = line.split(";")
            cp, name, cls = int(fields[0], 16), fields[1], CATEGORY_CLASS.get(fields[2], OTHER)
            if name.endswith(", First>"):
                first = cp
                continue
            start = first if name.endswith(", Last>") else cp   # CJK ideographs, Hangul...: one range
            classes[start:cp + 1] = bytes([cls]) * (cp + 1 - start)
            first = None
    with open(ucd + "/PropList.txt") as f:
        for line in f:
            m = re.match(r"([0-9A-F]+)(?:\.\.([0-9A-F]+))?\s*; White_Space\b", line)
            if m:
                lo = int(m.group(1), 16)
                hi = int(m.group(2) or m.group(1), 16)
                classes[lo:hi + 1] = bytes([SPACE]) * (hi + 1 - lo)
    return classes


def unicode_version(ucd):
    """the version from PropList.txt's first line ("# PropList-15.0.0.txt"); UnicodeData.txt has none"""
    with open(ucd + "/PropList.txt") as f:
        return re.match(r"# PropList-([\d.]+)\.txt", f.readline()).group(1)


def two_stages(classes):
    """(index, blocks): blocks[index[cp >> 8]][cp & 255] is cp's class. Blocks are numbered in order of
    first use, so U+0000..U+00FF is block 0; the index stops after the last block that holds any
    class but OTHER (everything above it is OTHER: planes 4 to 16 are unassigned or private use)"""
    blocks, number, index = [], {}, []
    for start in range(0, END, BLOCK):
        block = bytes(classes[start:start + BLOCK])
        if block not in number:
            number[block] = len(blocks)
            blocks.append(block)
        index.append(number[block])
    while index[-1] == number[bytes(BLOCK)]:
        index.pop()
    return index, blocks


HEADER = """\
// tokenizer_unicode.h — the class of every Unicode code point for GPT-2's pre-tokenizer: letter (\\p{L}),
// number (\\p{N}), space (\\s) or other. GENERATED, never edited by hand:
//   python3 scripts/gen_unicode_table.py
// from %(ucd)s/UnicodeData.txt and PropList.txt (Debian's unicode-data: Unicode %(version)s).
// \\s is the White_Space property, as Python's `regex` module matches it (not str.isspace, which adds
// U+001C..U+001F). Code points assigned after Unicode %(version)s are OTHER here, while transformers'
// GPT2Tokenizer splits with `regex`, whose Unicode is newer (measured: regex 2026.5.9 has Unicode
// 17.0.0, 2026.11.19 has 18.0.0; Python 3.11's own unicodedata, not used for the split, is 14.0.0):
// text holding such characters may tokenize differently. Nothing else differs: against those two,
// 9,661 and 22,484 code points differ, every one assigned after %(version)s
// (tests/test_unicode_table.py checks all of U+0000..U+10FFFF against the `regex` it finds).
//
// Two-stage table: code points come in blocks of %(block)d; the %(nblocks)d distinct blocks are stored once
// each, as strings of class digits ('0' other, '1' letter, '2' number, '3' space), and
// unicode_block_index[cp >> 8] says which one holds cp. Above U+%(end)04X everything is OTHER.
#pragma once
#include <stdint.h>

enum { UNICODE_OTHER = 0, UNICODE_LETTER = 1, UNICODE_NUMBER = 2, UNICODE_SPACE = 3 };

"""

FUNCTION = """
// the tokenizer's inner loop: one load for U+0000..U+00FF (always block 0), two for the rest
static inline int unicode_class(uint32_t cp) {
    if (cp < %(block)d) return unicode_blocks[0][cp] - '0';
    if (cp >= %(end)#x) return UNICODE_OTHER;
    return unicode_blocks[unicode_block_index[cp >> 8]][cp & %(mask)d] - '0';
}
"""


def header(index, blocks, version, ucd):
    """the C text: the comment, the enum, the two arrays and unicode_class"""
    values = {"version": version, "ucd": ucd, "block": BLOCK, "nblocks": len(blocks), "end": len(index) * BLOCK,
              "mask": BLOCK - 1}
    out = [HEADER % values]
    index_type = "uint8_t" if len(blocks) <= 256 else "uint16_t"
    out.append("static const %s unicode_block_index[%d] = {\n" % (index_type, len(index)))
    for i in range(0, len(index), 32):
        out.append("    " + ",".join(str(n) for n in index[i:i + 32]) + ",\n")
    out.append("};\n\n")
    out.append("static const char unicode_blocks[%d][%d] = {   // +1: each string's closing NUL\n"
               % (len(blocks), BLOCK + 1))
    for n, block in enumerate(blocks):
        digits = "".join(str(c) for c in block)
        rows = ['"%s"' % digits[i:i + 64] for i in range(0, BLOCK, 64)]
        first = index.index(n) * BLOCK                       # the first code point it holds, for the reader
        out.append("    " + rows[0] + "   // %d: U+%04X\n" % (n, first) + "".join("    " + r + "\n" for r in rows[1:-1]))
        out.append("    " + rows[-1] + ",\n")
    out.append("};\n")
    out.append(FUNCTION % values)
    return "".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ucd", default="/usr/share/unicode", help="folder of UnicodeData.txt and PropList.txt")
    parser.add_argument("--output", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                         "tokenizer_unicode.h"))
    args = parser.parse_args()
    index, blocks = two_stages(read_classes(args.ucd))
    with open(args.output, "w") as f:
        f.write(header(index, blocks, unicode_version(args.ucd), args.ucd))


if __name__ == "__main__":
    main()
