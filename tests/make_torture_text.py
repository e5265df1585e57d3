#!/usr/bin/env python3
"""tests/make_torture_text.py OUT.docs [--jsonl OUT.jsonl] — text that GPT-2's tokenizer finds
hard, as documents.

    /usr/bin/python3 tests/make_torture_text.py tests/build/tokenizer/torture.docs

Written for tests/test_tokenizer.sh, which encodes each document with tokenizer.h
(tests/tokenize.c) and with Hugging Face's GPT2Tokenizer and compares them token for token.
The output is a documents' file: for each document a header line "LENGTH NAME", then LENGTH
bytes of UTF-8, then a newline (tests/tokenize.c --docs reads it). Deterministic: the same
bytes on every run of the same Python (the characters of each general category come from this
Python's unicodedata, Unicode 14.0 for Python 3.11, with fixed random seeds). --jsonl also
writes the documents as JSON lines {"text": ...}, preprocess's input, in ASCII: every other
character as a \\u escape, those past U+FFFF as surrogate pairs.

What it holds, one or more documents each:
  every assigned code point of each general category (Cs excepted: not UTF-8; Co and the large
  Lo, Ll, So... categories sampled) in contexts that tell GPT-2's pre-tokenizer classes apart:
  "  c" (two spaces: whitespace or not), "ac" (joins a letter run), "1c", "!c", "cc", " c";
  code points assigned in Unicode 15.0 (Kawi, Nag Mundari, Kaktovik numerals, CJK extension
  H, new emoji); noncharacters (U+FDD0, U+FFFE, U+10FFFF); every byte value that UTF-8 uses;
  emoji with ZWJ sequences, skin tones, flags, tag sequences, keycaps; CJK, kana, hangul,
  fullwidth forms; combining marks; every whitespace character, runs of 1 to 20 spaces
  before words, tabs, "\\r\\n", U+00A0, U+3000 and the characters Python's str.isspace()
  counts but regex's \\s does not (U+001C..U+001F); letters next to digits; contractions in
  every case ('s 'S 'T 'Re 'vE...), "''s", "it’s" with U+2019; "<|endoftext|>" as plain text;
  runs of one character of lengths 1 to 64 (BPE's leftmost-first merging of equal pairs);
  words of 250 to 260 bytes; words of thousands of bytes (5000 letters, 3000 digits, 4000
  punctuation characters, runs of spaces and newlines); scripts mixed without spaces; an empty
  document; and random mixtures of all of these.
"""
import json
import random
import sys
import unicodedata

# regex's \s in GPT-2's pattern (Unicode White_Space); Python's str.isspace() adds U+001C..U+001F
WHITESPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
             "\u2028\u2029\u202f\u205f\u3000"
NEAR_WHITESPACE = "\x1c\x1d\x1e\x1f\u180e\u200b\u200c\u200d\u2060\ufeff"   # none of them \s

# assigned in Unicode 15.0 (DerivedAge.txt), absent from Python 3.11's unicodedata (14.0)
UNICODE_15 = [0x0CF3, 0x0ECE, 0x10EFD, 0x11241, 0x11B00, 0x11F00, 0x11F04, 0x11F10, 0x11F12, 0x11F3A,
              0x11F50, 0x11F59, 0x1342F, 0x13440, 0x1B132, 0x1B155, 0x1D2C0, 0x1D2D3, 0x1DF25, 0x1E030,
              0x1E08F, 0x1E4D0, 0x1E4EB, 0x1E4F0, 0x1E4F9, 0x1F6DC, 0x1F7D9, 0x1FA75, 0x1FAE8, 0x1FAF8,
              0x2B739, 0x31350, 0x31351, 0x323AF]
NONCHARACTERS = [0xFDD0, 0xFDEF, 0xFFFE, 0xFFFF, 0x1FFFE, 0x10FFFE, 0x10FFFF]

SAMPLE = 1500   # a category with more code points than this is sampled: evenly spread, plus random ones


def by_category():
    cats = {}
    for cp in range(0x110000):
        cat = unicodedata.category(chr(cp))
        if cat not in ("Cs", "Cn"):
            cats.setdefault(cat, []).append(cp)
    return cats


def probe(c):
    """c in contexts whose pre-tokenization depends on c's class (letter, number, space, other)"""
    return f"  {c} a{c} 1{c} !{c} {c}{c} x{c}y{c}\n"


def category_docs():
    docs = []
    for cat, cps in sorted(by_category().items()):
        if len(cps) > SAMPLE:
            rng = random.Random("category " + cat)
            step = len(cps) / (SAMPLE // 2)
            chosen = sorted(set([cps[int(i * step)] for i in range(SAMPLE // 2)] + rng.sample(cps, SAMPLE // 2)))
        else:
            chosen = cps
        docs.append((f"category {cat} ({len(chosen)} of {len(cps)} code points)",
                     "".join(probe(chr(cp)) for cp in chosen)))
    docs.append(("Unicode 15.0 additions", "".join(probe(chr(cp)) for cp in UNICODE_15)))
    docs.append(("noncharacters", "".join(probe(chr(cp)) for cp in NONCHARACTERS)))
    return docs


def every_byte():
    """every byte value UTF-8 uses: ASCII, each lead byte C2..F4, each continuation byte 80..BF"""
    chars = [chr(i) for i in range(128)] + [chr(i) for i in range(0x80, 0x800, 0x40)]   # C2..DF
    chars += [chr(cp) for cp in range(0x80, 0x100)]                                     # C2/C3 + 80..BF
    chars += [chr(max(lead << 12, 0x800) | 0x123) for lead in range(16)]                # E0..EF
    chars += [chr(0x10000 + (lead << 18) + 0x1234) for lead in range(4)] + ["\U00100000", "\U0010FFFF"]  # F0..F4
    text = "".join(chars)
    return [("every byte", text + "\n" + " ".join(chars) + "\n" + text[::-1])]


def emoji():
    skin = [chr(cp) for cp in range(0x1F3FB, 0x1F400)]
    zwj = ["👨\u200d👩\u200d👧\u200d👦", "👩🏽\u200d💻", "🏳️\u200d🌈", "🏴\u200d☠️", "🧑🏿\u200d🤝\u200d🧑🏻",
           "👁️\u200d🗨️", "❤️\u200d🔥", "🐻\u200d❄️", "👨\u200d❤️\u200d💋\u200d👨"]
    flags = ["🇺🇸", "🇯🇵", "🇩🇪", "🇫🇷", "🇧🇷", "🇮🇳", "🇺🇳", "🇪🇺", "🇦", "🇿🇿"]
    tags = ["🏴\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F",
            "🏴\U000E0067\U000E0062\U000E0077\U000E006C\U000E0073\U000E007F"]
    keycaps = [k + "\ufe0f\u20e3" for k in "0123456789#*"] + ["1\u20e3"]
    plain = ["😀", "😂", "🤣", "❤", "❤️", "☺", "☺️", "✌️", "🙏", "🔥", "💯", "🚀", "🫠", "🫶🏽", "🥲", "👋"]
    lines = [" ".join(plain), "".join(plain), " ".join("👍" + s for s in skin), "".join("✋" + s for s in skin),
             " ".join(zwj), "".join(zwj), " ".join(flags), "".join(flags), " ".join(tags), "".join(tags),
             " ".join(keycaps), "".join(keycaps), "hi👋there, I❤️NY!🇺🇸🇺🇸 ok👌🏼.", "😀" * 50, " 😀" * 20,
             "a😀b 1😀2 !😀? 😀😀 . 😀 \t😀\n😀"]
    return [("emoji, ZWJ sequences, skin tones, flags, tags, keycaps", "\n".join(lines) + "\n")]


def scripts():
    cjk = ("我们今天去北京。你好，世界！「引号」『二重』【括弧】〈山〉《书》　全角空格　在这里。" "日本語のテキスト、ひらがなとカタカナ。"
           "ｶﾀｶﾅ ﾊﾝｶｸ ＡＢＣ１２３ ｆｕｌｌｗｉｄｔｈ！？" "한국어 텍스트입니다. ᄀᄁᄂ ᅡᅢ ᆨᆩ 한글" "𠀀𠀁𪜀 𫝀 𫠠 𬺰 𰀀 (Ext B–G) 〇〡〢〩")
    combining = ["e\u0301 e\u0301e\u0301 cafe\u0301 café", "Z\u0351\u0308\u0300\u034b\u0300a\u0310\u0306\u0336l\u0336\u0321g\u0327o\u0315",
                 "नमस्ते दुनिया क्षत्रिय र्‍", "สวัสดีครับ ภาษาไทย", "مَرْحَبًا بِالْعَالَمِ ١٢٣ ٤٥٦", "שָׁלוֹם עוֹלָם",
                 "ত্র ক্ষ ঙ্গ", "\u0041\u030a \u00c5 \u212b", "a\u20dd b\u20de 1\u20e3", "Å\u0332\u0332\u0332", "ἄλφα Ὀδυσσεύς ᾅ",
                 "Tiếng Việt có dấu: Nguyễn ở đâu?", "Ѐ Ё й й", "ﬁ ﬂ ﬃ ẞ ß ǅ ǈ ǋ ǲ", "\u0345\u0345 \u1dc0\u1dff"]
    mixed = ["Hello世界Привет123мир٣٤abcשלוםnamasteनमस्तेΓειάσου", "東京Tokyo2020年オリンピック", "x²+y²=z² ½¼¾ ⅓ Ⅻ ⅻ ① ⑳ ㉑",
             "١٢٣abc٤٥٦ ०१२३ ๑๒๓ ߀߁ ᠐᠑ ０１２３ 𝟎𝟏𝟐 𝟘𝟙 𝐀𝐁𝐂 𝔸𝔹", "Ελληνικά123Русский456العربية789עברית0",
             "ǆemal Ǆ ǉubljana Ǉ", "ℌℑℜℭ ℕℙℚℤ ℂ ℮ ™ ℠ № ℃ ℉", "𐌰𐌱𐌲 (Gothic) 𓀀𓀁 (hieroglyphs) 𒀀 (cuneiform)"]
    return [("CJK, kana, hangul, fullwidth", cjk + "\n" + cjk.replace("　", "") + "\n"),
            ("combining marks, Indic, Thai, Arabic, Hebrew", "\n".join(combining) + "\n"),
            ("mixed scripts without spaces", "\n".join(mixed) + "\n" + "".join(mixed))]


def whitespace():
    words = ["word", "Word", "123", "!!", "é", "中文", "'s", "\u00a0x", "😀"]
    parts = []
    for n in range(1, 21):
        for w in words:
            parts.append(" " * n + w)
        parts.append("\n")
    for ws in WHITESPACE + NEAR_WHITESPACE:
        for n in (1, 2, 3):
            parts.append(f"a{ws * n}b {ws * n}c{ws * n} d {ws * n} {ws}\n")
    lines = ["\ttab\t\ttabs\t \t mixed", "line\r\nwindows\r\n\r\nblank", "mac\rline\r\rend", "\n\r\n\r",
             "nbsp\u00a0between\u00a0\u00a0words \u00a0 x", "ideographic\u3000space\u3000\u3000x \u3000 y",
             "thin\u2009space\u202fnarrow", "zero\u200bwidth\u200b\u200bspace", "bom\ufeffinside",
             "trailing   ", "trailing\t\t", "  leading", "\u00a0\u00a0leading nbsp", "x\x0by\x0cz\x85w",
             "\u2028line sep\u2029para sep", "   \n   \n", " \n \n x", "a \n\n\n b", "a\n \nb", "\x1c\x1d\x1e\x1f end"]
    text = "".join(parts) + "\n".join(lines) + "\n"
    return [("whitespace: runs of 1..20 spaces, tabs, CR LF, every \\s character", text),
            ("whitespace at the end", "ends with spaces and newlines    \n\n  \n   "),
            ("whitespace only", " \t\n\r\n\u00a0\u3000  "),
            ("one space", " "), ("one newline", "\n"), ("empty", ""), ("one letter", "a")]


def letters_digits():
    items = ["abc123def", "3rd", "21st", "1.5e10", "-2.5E-3", "0x1F", "0b1010", "1,000,000", "1 000 000", "3.14159",
             "v1.2.3-rc4", "2024-01-15T12:30:00Z", "192.168.0.1", "$1,234.56", "€5", "50%", "#1", "A4", "B2B", "mp3",
             "H2O", "CO2", "x86_64", "utf-8", "i18n", "l10n", "4ever", "2nite", "9am-5pm", "1st2nd3rd"]
    digits = [str(10 ** k) for k in range(1, 25)] + ["".join(str(i % 10) for i in range(n)) for n in range(1, 41)]
    return [("letters next to digits", " ".join(items) + "\n" + "".join(items) + "\n" + " ".join(digits) + "\n")]


def contractions():
    endings = ["s", "t", "re", "ve", "m", "ll", "d"]
    cased = []
    for e in endings:
        for mask in range(1 << len(e)):
            cased.append("".join(ch.upper() if mask >> i & 1 else ch for i, ch in enumerate(e)))
    # a contraction taken for letters (or letters for a contraction) shows in the ids only where the
    # letters around it merge: 'Sam is "'" + "Sam" for GPT-2, 'sam is "'s" + "am"
    lines = [" ".join("it'" + e for e in cased), " ".join("'" + e for e in cased), "".join("'" + e for e in cased),
             " ".join("'" + e + w for e in cased for w in ("am", "ome", "ing", "ay", "AM", "OME", "ING")),
             " ".join("x'" + e + w for e in cased for w in ("ell", "EAL", "er")), "'Tis 'Twas 'Em 'Mid 'Ello 'Sup",
             " ".join("IT'" + e.upper() for e in endings), "''s '''s ''t 's's 't't 'll've 'd've y'all'd've",
             "it’s it‘s it`s it´s it′s itʼs it＇s", "'s at start", "end's", "rock'n'roll O'Neil d'Artagnan",
             "' s ' t '1 '' ''' '''' 'é 'a '中", "don't DON'T Don'T we're WE'RE I'm I'M you'll YOU'LL she'd SHE'D",
             "'s\n's\t's  's", "x's'y 1's 2'S", "can't've won't 'twas ’twas"]
    return [("contractions in every case", "\n".join(lines) + "\n")]


def punctuation():
    ascii_punct = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
    lines = [" ".join(ascii_punct), ascii_punct, ascii_punct[::-1], " ".join(p * 3 for p in ascii_punct),
             "Hello, world! How's it going? (fine) [ok] {yes} <no>", "--> => :: ... ... ?!? !!! ??? ---- ==== ____",
             "```python\ndef f(x):\n    return x**2  # square\n```", "http://example.com/a/b?c=d&e=f#g",
             "<|endoftext|>", "a<|endoftext|>b <|endoftext|> <|endoftext|><|endoftext|>", "<|endoftext|", "<|endof text|>",
             "“quotes” ‘single’ «guillemets» „low“ ‹›", "— – ‐ ‑ ‒ … · • ‣ ※ ‼ ⁉ ¿¡", "§ ¶ † ‡ © ® ° ± × ÷ ¬ ¦",
             "\\n \\t \\\\ \\\"", "@user #hashtag $var %mod ^caret &amp; *ptr", "a.b,c;d:e!f?g", "...a...b..."]
    return [("punctuation", "\n".join(lines) + "\n")]


def runs():
    chars = ["a", "e", "s", "E", " ", "\n", "\t", "!", ".", "-", "=", "*", "#", "_", "/", "0", "1", "9", "é", "中", "😀",
             "\u00a0", "'", "\r\n"]
    docs = []
    for c in chars:
        sep = "|" if c.isspace() else " "
        docs.append((f"runs of {ascii(c)}, lengths 1..64", sep.join(c * n for n in range(1, 65))))
    docs.append(("runs of two alternating characters", " ".join(p * n for p in ["ab", "ba", "aab", " a", "a ", "0.", "!?"]
                                                               for n in range(1, 33))))
    return docs


def long_words():
    rng = random.Random(5000)
    letters = "abcdefghijklmnopqrstuvwxyz"
    punct = "!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~"
    random_word = "".join(rng.choice(letters) for _ in range(5000))
    return [("a 5000-letter word", random_word),
            ("5000 letters of English-like text without spaces", "".join(rng.choice(["the", "quick", "brown", "fox",
                                                                                   "jumps", "over", "lazy", "dog"]) for _ in range(1000))[:5000]),
            ("'a' x 5000", "a" * 5000), (" 'a' x 5000 after a space", " " + "a" * 5000),
            ("3000 digits", "".join(rng.choice("0123456789") for _ in range(3000))),
            ("4000 punctuation characters", "".join(rng.choice(punct) for _ in range(4000))),
            ("10000 spaces, then a word, then 3000 spaces", " " * 10000 + "word" + " " * 3000),
            ("5000 newlines between words", "start" + "\n" * 5000 + "end"),
            ("3000 CJK characters without spaces", "".join(chr(rng.randrange(0x4E00, 0x9FA0)) for _ in range(3000))),
            ("1000 emoji", "".join(chr(rng.randrange(0x1F600, 0x1F650)) for _ in range(1000))),
            ("words of 250 to 260 bytes (around tokenizer.h's longest cached word, 256)",
             "\n".join(" ".join(["a" * n, " " + "".join(rng.choice(letters) for _ in range(n - 1)), "é" * (n // 2),
                                  "中" * (n // 3), "1" * n, "!" * n, " " * n + "x"]) for n in range(250, 261))),
            ("2000 combining marks on one letter", "a" + "".join(chr(rng.randrange(0x300, 0x370)) for _ in range(2000)))]


def mixtures(docs, n, size):
    """random documents made of pieces of the others"""
    pieces = []
    for _, text in docs:
        for i in range(0, min(len(text), 20000), 37):
            pieces.append(text[i:i + 1 + (i * 7919) % 41])
    rng = random.Random(1234)
    out = []
    for k in range(n):
        parts, length = [], 0
        while length < size:
            p = rng.choice(pieces)
            parts.append(p)
            length += len(p)
        out.append((f"random mixture {k + 1}", "".join(parts)))
    return out


def main():
    if len(sys.argv) not in (2, 4) or (len(sys.argv) == 4 and sys.argv[2] != "--jsonl"):
        sys.exit("usage: make_torture_text.py OUT.docs [--jsonl OUT.jsonl]")
    docs = (category_docs() + every_byte() + emoji() + scripts() + whitespace() + letters_digits() + contractions()
            + punctuation() + runs() + long_words())
    docs += mixtures(docs, 8, 4000)
    with open(sys.argv[1], "wb") as f:
        for name, text in docs:
            data = text.encode("utf-8")
            f.write(f"{len(data)} {name}\n".encode("utf-8") + data + b"\n")
    if len(sys.argv) == 4:
        with open(sys.argv[3], "w") as f:
            for _, text in docs:
                f.write(json.dumps({"text": text}, ensure_ascii=True) + "\n")
    total = sum(len(t.encode()) for _, t in docs)
    print(f"torture text: {len(docs)} documents, {total} bytes -> {sys.argv[1]}")


if __name__ == "__main__":
    main()
