#!/usr/bin/env bash
# Builds the default corpus offline from text every Debian and Ubuntu machine ships: the
# license texts in /usr/share/common-licenses (package base-files). Each paragraph becomes
# one document, one JSON line {"text": ...}; paragraphs of the different licenses are
# interleaved (the 1st paragraph of every license, then the 2nd, ...) so that Megatron's
# contiguous train/valid/test split of the documents draws from every license.
# With --prose, a paragraph is read as running text: its lines joined by one space, runs of
# spaces squeezed, and a paragraph with no letter in it (a rule of dashes, a row of stars) left
# out, so that a model trained on it writes sentences rather than the texts' layout.
# usage: scripts/make_corpus.sh [--prose] OUT.jsonl
set -euo pipefail
prose=0
[ "${1:-}" = --prose ] && { prose=1; shift; }
out=${1:?usage: make_corpus.sh [--prose] OUT.jsonl}
src=/usr/share/common-licenses
[ -d "$src" ] || { echo "error: $src not found (it comes with Debian's base-files package)" >&2; exit 2; }
# every license once (several names are symlinks to the same text), in a fixed order
files=$(find "$src" -maxdepth 1 -type f | LC_ALL=C sort)
n=0
for f in $files; do
    awk -v file="$n" -v prose=$prose '
        function flush() {
            if (prose) { gsub(/[ \t]+/, " ", para); sub(/^ /, "", para); sub(/ $/, "", para) }
            if (para != "" && (!prose || para ~ /[A-Za-z]/)) {
                gsub(/\\/, "\\\\", para); gsub(/"/, "\\\"", para); gsub(/\t/, "\\t", para)
                printf "%08d %04d {\"text\": \"%s\"}\n", count++, file, para
            }
            para = ""
        }
        /^[ \t]*$/ { flush(); next }
        { para = (para == "") ? $0 : para (prose ? " " : "\\n") $0 }
        END { flush() }
    ' <(tr -d '\f\r\v' < "$f")   # page breaks and carriage returns are not text
    n=$((n + 1))
done | LC_ALL=C sort -k1,1n -k2,2n | cut -d' ' -f3- > "$out"
echo "corpus: $(wc -l < "$out") paragraphs of $(echo "$files" | wc -l) license texts from $src -> $out"
