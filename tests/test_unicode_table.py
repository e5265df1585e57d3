#!/usr/bin/env python3
"""tests/test_unicode_table.py — tokenizer_unicode.h, the code point classes of GPT-2's pre-tokenizer:
  - it is scripts/gen_unicode_table.py's output, byte for byte (the table is generated, never edited
    by hand); SKIP where /usr/share/unicode (Debian's unicode-data) is missing, FAIL instead with
    REQUIRE_UNICODE_DATA=1;
  - it compiles warning-free as C (gcc) and as C++ (g++), and a few known code points (ASCII, the
    ranges UnicodeData.txt gives as First/Last pairs, U+001C which str.isspace calls space and \\s
    does not) get their class;
  - unicode_class agrees with Python's `regex` module (what transformers' GPT2Tokenizer splits with)
    on \\p{L}, \\p{N} and \\s for every code point but the surrogates, except at code points assigned
    after the table's Unicode version (DerivedAge.txt says which: those are OTHER for us, while a
    newer `regex` knows them); SKIP where `regex` is missing, FAIL instead with REQUIRE_TRANSFORMERS=1.
Prints one PASS/FAIL/SKIP line per check.
"""
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
UCD = "/usr/share/unicode"
HEADER = os.path.join(ROOT, "tokenizer_unicode.h")
END = 0x110000
SURROGATES = range(0xD800, 0xE000)
failed = 0


def report(ok, name, why=""):
    global failed
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + why), flush=True)
    failed += not ok


def cannot_run(name, why, required_by):
    """a check that cannot run here: SKIP, or FAIL where the environment variable requires it"""
    if os.environ.get(required_by) == "1":
        report(False, name, why + " (%s=1)" % required_by)
    else:
        print("SKIP " + name + ": " + why, flush=True)


def check_generated(tmp):
    name = "tokenizer_unicode.h is scripts/gen_unicode_table.py's output"
    if not os.path.exists(UCD + "/UnicodeData.txt"):
        return cannot_run(name, UCD + "/UnicodeData.txt is missing (apt-get install unicode-data)",
                          "REQUIRE_UNICODE_DATA")
    fresh = os.path.join(tmp, "generated.h")   # not tokenizer_unicode.h: classes.c beside it would include it
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts/gen_unicode_table.py"), "--ucd", UCD,
                    "--output", fresh], check=True)
    with open(fresh, "rb") as a, open(HEADER, "rb") as b:
        report(a.read() == b.read(), name, "they differ: rerun python3 scripts/gen_unicode_table.py")


# prints every code point's class as one digit, U+0000..U+10FFFF in order (a surrogate's too: unused)
PROGRAM = r"""
#include <stdio.h>
#include "tokenizer_unicode.h"
int main(void) {
    static char digits[0x110000];
    for (uint32_t cp = 0; cp < 0x110000; cp++) digits[cp] = (char)('0' + unicode_class(cp));
    fwrite(digits, 1, sizeof digits, stdout);
    return unicode_class(0xFFFFFFFFu) == UNICODE_OTHER ? 0 : 1;   // no code point: OTHER, no overrun
}
"""

KNOWN = {0x61: 1, 0x37: 2, 0x20: 3, 0x0A: 3, 0x1C: 0, 0x21: 0, 0xB2: 2, 0xA0: 3, 0x4E00: 1, 0x9FFF: 1,
         0xAC00: 1, 0xD7A3: 1, 0x20000: 1, 0x3000: 3, 0x2028: 3, 0x1F600: 0, 0xE000: 0, 0x10FFFF: 0}


def compile_and_list(tmp):
    """every code point's class from the C header (a bytes of digits), or None where it does not build"""
    source = os.path.join(tmp, "classes.c")
    with open(source, "w") as f:
        f.write(PROGRAM)
    flags = ["-Wall", "-Wextra", "-Werror", "-I", ROOT, source]
    built = subprocess.run(["gcc", "-std=gnu11", "-O2"] + flags + ["-o", tmp + "/classes"],
                           capture_output=True, text=True)
    report(built.returncode == 0, "tokenizer_unicode.h compiles with gcc -std=gnu11 -Wall -Wextra -Werror",
           built.stderr)
    as_cpp = subprocess.run(["g++", "-std=c++20", "-fsyntax-only", "-x", "c++"] + flags,
                            capture_output=True, text=True)
    report(as_cpp.returncode == 0, "tokenizer_unicode.h compiles as C++ (g++ -std=c++20 -Wall -Wextra -Werror)",
           as_cpp.stderr)
    if built.returncode != 0:
        return None
    run = subprocess.run([tmp + "/classes"], capture_output=True)
    report(run.returncode == 0 and len(run.stdout) == END, "unicode_class runs over U+0000..U+10FFFF",
           "status %d, %d bytes" % (run.returncode, len(run.stdout)))
    wrong = ["U+%04X is %c, not %d" % (cp, run.stdout[cp], cls) for cp, cls in KNOWN.items()
             if run.stdout[cp] != ord("0") + cls]
    report(not wrong, "known code points (ASCII, First/Last ranges, U+001C not space) get their class",
           "; ".join(wrong))
    return run.stdout


def regex_classes(regex):
    """every code point's class as `regex` matches it: each class's runs over one string of all code
    points (a surrogate replaced by U+0000, which is OTHER), so the scan stays in regex's C code"""
    text = "".join("\0" if cp in SURROGATES else chr(cp) for cp in range(END))
    classes = bytearray(b"0" * END)
    for digit, pattern in ((b"1", r"\p{L}+"), (b"2", r"\p{N}+"), (b"3", r"\s+")):
        for m in regex.finditer(pattern, text):
            classes[m.start():m.end()] = digit * (m.end() - m.start())
    return classes


def assigned_by(version):
    """the code points assigned by Unicode `version` (DerivedAge.txt, whose ages go up to its own)"""
    assigned = bytearray(END)
    with open(UCD + "/DerivedAge.txt") as f:
        for line in f:
            m = re.match(r"([0-9A-F]+)(?:\.\.([0-9A-F]+))?\s*;\s*([\d.]+)", line)
            if m and tuple(map(int, m.group(3).split("."))) <= version:
                lo, hi = int(m.group(1), 16), int(m.group(2) or m.group(1), 16)
                assigned[lo:hi + 1] = b"\1" * (hi + 1 - lo)
    return assigned


def check_against_regex(ours):
    name = "unicode_class agrees with Python's regex on \\p{L}, \\p{N}, \\s at every code point assigned by then"
    try:
        import regex
    except ImportError:
        return cannot_run(name, "Python's regex module is missing (transformers brings it)", "REQUIRE_TRANSFORMERS")
    if not os.path.exists(UCD + "/DerivedAge.txt"):
        return cannot_run(name, UCD + "/DerivedAge.txt is missing (apt-get install unicode-data)",
                          "REQUIRE_UNICODE_DATA")
    version = re.search(r"Unicode ([\d.]+)", open(HEADER).read()).group(1)
    theirs = regex_classes(regex)
    assigned = assigned_by(tuple(map(int, version.split(".")))[:2])
    differ = [cp for cp in range(END) if ours[cp] != theirs[cp] and cp not in SURROGATES]
    newer = [cp for cp in differ if not assigned[cp] and ours[cp] == ord("0")]   # unknown to us: OTHER
    older = [cp for cp in differ if assigned[cp] or ours[cp] != ord("0")]
    print("regex %s: %d code points differ, all but %d assigned after Unicode %s and OTHER here%s"
          % (regex.__version__, len(differ), len(older), version,
             ", e.g. U+%04X" % newer[0] if newer else ""), flush=True)
    report(not older, name.replace("by then", "by Unicode " + version),
           "; ".join("U+%04X: ours %c, regex %c" % (cp, ours[cp], theirs[cp]) for cp in older[:10]))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        check_generated(tmp)
        ours = compile_and_list(tmp)
    if ours is not None:
        check_against_regex(ours)
    print("ok" if not failed else "%d failed" % failed)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
