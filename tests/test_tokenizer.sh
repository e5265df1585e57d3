#!/usr/bin/env bash
# tests/test_tokenizer.sh [DATA_PREFIX, unused] — tokenizer.h (GPT-2's byte-level BPE) against
# Hugging Face's GPT2Tokenizer, token for token, through tests/tokenize.c.
#   Everywhere: builds tests/build/tokenize; decodes what it encoded back to the same bytes
#   (the torture text and >= 10 MiB of the machine's text, each document on its own and each
#   file as one text); refuses invalid UTF-8 (overlong encodings, a lone continuation byte, a
#   sequence cut by the end of the file, an encoded surrogate, a code point past U+10FFFF,
#   bytes C0, F5, FF) with one line naming the file and the byte offset, exit status 2;
#   refuses damaged vocabulary and merges files with one line naming the file; reads the
#   vocabulary in another JSON layout; gives the same ids without its cache of words, also
#   past the cache's 2^20 words; and preprocess --tokenizer-type GPT2BPETokenizer writes the same
#   ids, each document's then EOD, from the same documents as JSON lines.
#   Where a python3 has transformers and tokenizers (else one SKIP line; a FAIL with
#   REQUIRE_TRANSFORMERS=1, as CI sets): the token ids of the torture text
#   (tests/make_torture_text.py), of the torture file as one text, and of the machine's text
#   (tests/make_big_text.py) equal GPT2Tokenizer's, "<|endoftext|>" encoded as plain text
#   (tests/tokenizer_check.py says why); a difference is shown with the shortest piece of
#   text that still differs. And Hugging Face's fast tokenizer equals its slow one on the
#   torture text (tests/bench_tokenizer.sh times the fast one against ours).
# About 19 s of CPU time, 12 s on 2 idle cores (25 s measured with other work on them).
set -u
cd "$(dirname "$0")/.."
B=tests/build/tokenizer
rm -rf $B && mkdir -p $B
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
VOCAB=tests/data/gpt2/encoder.json MERGES=tests/data/gpt2/vocab.bpe
T=tests/build/tokenize
failed=0
ok() { echo "PASS tokenizer $1"; }
bad() { echo "FAIL tokenizer $1: $2"; failed=$((failed + 1)); }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
seconds() { local ms=$(( $(now_ms) - $1 )); printf '%d.%01ds' $((ms / 1000)) $((ms % 1000 / 100)); }   # since now_ms's $1
started=$(now_ms)

rm -f $T
if ! gcc -std=gnu11 -O2 -Wall -Wextra -Werror tests/tokenize.c -o $T > $B/build.log 2>&1; then
    bad "build tests/tokenize.c" "$(head -20 $B/build.log)"; exit 1
fi

# the python that has Hugging Face's tokenizers (Debian's first, where CI installs them)
have_hf=no
for PY in /usr/bin/python3 python3; do
    $PY -c "import transformers, tokenizers, regex" > /dev/null 2>&1 && { have_hf=yes; break; }
done
if [ $have_hf = no ]; then
    PY=python3
    if [ "${REQUIRE_TRANSFORMERS:-0}" = 1 ]; then
        bad "transformers is required here (REQUIRE_TRANSFORMERS=1, as in CI)" "no python3 with transformers, tokenizers and regex"
    else
        echo "SKIP tokenizer against GPT2Tokenizer: python transformers not installed (pip install transformers tokenizers)"
    fi
fi

# ---- the texts: the torture text and the machine's text, as documents
if ! $PY tests/make_torture_text.py $B/torture.docs --jsonl $B/torture.jsonl > $B/torture.log 2>&1; then
    bad "tests/make_torture_text.py" "$(tail -3 $B/torture.log)"; exit 1
fi
if ! $PY tests/make_big_text.py $B/big.docs --jsonl $B/big.jsonl > $B/big.log 2>&1; then
    bad "tests/make_big_text.py" "$(tail -3 $B/big.log)"; exit 1
fi
echo "texts: $(cat $B/torture.log); $(cat $B/big.log)"

# ---- encode: each document on its own (--docs), and each file as one text
encode() {  # name, tokenize's arguments...
    local name=$1; shift
    local began status
    began=$(now_ms)
    $T "$@" > $B/$name.ids 2> $B/$name.err
    status=$?
    if [ $status -eq 0 ]; then
        echo "encoded $name: $(grep -vc '^#' $B/$name.ids) tokens in $(seconds $began)"
        return 0
    fi
    bad "encode $name" "tokenize exited with status $status: $(head -3 $B/$name.err)"
    return 1
}
encode torture --docs $VOCAB $MERGES $B/torture.docs; torture_ok=$?
encode torture_whole $VOCAB $MERGES $B/torture.docs; torture_whole_ok=$?
encode big --docs $VOCAB $MERGES $B/big.docs; big_ok=$?
encode big_whole $VOCAB $MERGES $B/big.docs

# GPT2Tokenizer's tokens, in the background (the slowest part, about 6 s on one core)
if [ $have_hf = yes ]; then
    compare() {  # label, docs, ids, ok, [--whole | --fast-too]
        [ $4 -eq 0 ] || return 0
        $PY tests/tokenizer_check.py compare $1 $2 $3 ${5:-} > $B/compare_$1.out 2> $B/compare_$1.err
        echo $? > $B/compare_$1.status
    }
    ( compare torture $B/torture.docs $B/torture.ids $torture_ok --fast-too
      compare torture_whole $B/torture.docs $B/torture_whole.ids $torture_whole_ok --whole ) &
    compare big $B/big.docs $B/big.ids $big_ok &
fi

# ---- decode: the ids give back the bytes
roundtrip() {  # name, file, [--docs]
    local name=$1 file=$2 docs=${3:-}
    [ -s $B/$name.ids ] || return 0
    $T $docs --decode $VOCAB $MERGES $B/$name.ids > $B/$name.decoded 2> $B/$name.decode.err
    local status=$?
    if [ $status -ne 0 ]; then
        bad "decode $name" "tokenize --decode exited with status $status: $(head -3 $B/$name.decode.err)"
    elif cmp -s $B/$name.decoded $file; then
        ok "decode $name: the ids give back $file byte for byte ($(stat -c %s $file) bytes)"
    else
        bad "decode $name" "the bytes differ from $file: $(cmp $B/$name.decoded $file 2>&1 | head -1)"
    fi
}
roundtrip torture $B/torture.docs --docs
roundtrip torture_whole $B/torture.docs
roundtrip big $B/big.docs --docs
roundtrip big_whole $B/big.docs

# ---- invalid UTF-8: refused with one line naming the file and the byte offset, exit status 2
refuses() {  # label, expected offset, printf format of the file's bytes
    local label=$1 offset=$2 f=$B/invalid.txt
    printf "$3" > $f
    $T $VOCAB $MERGES $f > $B/invalid.out 2> $B/invalid.err
    local status=$? lines=$(wc -l < $B/invalid.err)
    if [ $status -eq 2 ] && [ $lines -eq 1 ] && grep -q "$f: invalid UTF-8 at byte $offset\b" $B/invalid.err \
            && [ ! -s $B/invalid.out ]; then
        ok "refuses $label at byte $offset: $(cat $B/invalid.err)"
    else
        bad "invalid UTF-8, $label" "expected exit status 2, one line naming $f and byte $offset, no ids; got status $status, $lines lines: $(head -3 $B/invalid.err)"
    fi
}
refuses "an overlong 2-byte encoding (C0 AF)" 3 'abc\xc0\xafdef'
refuses "an overlong 3-byte encoding (E0 80 AF)" 4 'abcd\xe0\x80\xaf'
refuses "an overlong 4-byte encoding (F0 80 80 AF)" 1 ' \xf0\x80\x80\xaf'
refuses "a lone continuation byte (80)" 2 'ab\x80cd'
refuses "a continuation byte after a complete character (C3 A9 A9)" 3 'x\xc3\xa9\xa9'
refuses "a sequence cut by the end of the file (E2 82)" 6 'hello \xe2\x82'
refuses "a 4-byte sequence cut by the end of the file (F0 9F 98)" 2 'hi\xf0\x9f\x98'
refuses "a sequence cut by an ASCII byte (E2 82 41)" 0 '\xe2\x82A'
refuses "an encoded surrogate (ED A0 80)" 1 'x\xed\xa0\x80y'
refuses "an encoded low surrogate (ED BF BF)" 5 'emoji\xed\xbf\xbf'
refuses "a code point past U+10FFFF (F4 90 80 80)" 0 '\xf4\x90\x80\x80'
refuses "byte F5" 3 'abc\xf5\x80\x80\x80'
refuses "byte FF" 0 '\xff'
# in the second of two documents: the offset is the file's, and the line names the document
printf '5 first\nhello\n9 second\nab\xe2\x82\xacc\xc0 x\n' > $B/invalid.docs
$T --docs $VOCAB $MERGES $B/invalid.docs > /dev/null 2> $B/invalid.err; status=$?
if [ $status -eq 2 ] && [ $(wc -l < $B/invalid.err) -eq 1 ] && grep -q "invalid.docs: invalid UTF-8 at byte 29\b.*second" $B/invalid.err; then
    ok "refuses invalid UTF-8 in a document at the file's byte 29, naming the document: $(cat $B/invalid.err)"
else
    bad "invalid UTF-8 in a document" "expected status 2 and one line naming invalid.docs, byte 29 and document \"second\"; got status $status: $(head -3 $B/invalid.err)"
fi

# ---- damaged vocabulary and merges files: one line naming the file, exit status 2
load_refuses() {  # label, vocab, merges, the file the line must name
    $T $2 $3 $B/torture.docs > /dev/null 2> $B/load.err
    local status=$?
    if [ $status -eq 2 ] && [ $(wc -l < $B/load.err) -eq 1 ] && grep -qF "$4" $B/load.err; then
        ok "refuses $1: $(cat $B/load.err)"
    else
        bad "load $1" "expected status 2 and one line naming $4; got status $status: $(head -3 $B/load.err)"
    fi
}
head -c 100000 $VOCAB > $B/vocab_cut.json
sed '5s/ .*//' $MERGES > $B/merges_bad.txt                            # a merge line without its second part
{ head -3 $MERGES; echo "Ġ zzzzunknown"; tail -n +4 $MERGES; } > $B/merges_unknown.txt   # parts not in the vocabulary
load_refuses "a missing vocabulary file" $B/no_such.json $MERGES $B/no_such.json
load_refuses "a missing merges file" $VOCAB $B/no_such.bpe $B/no_such.bpe
load_refuses "a vocabulary file cut short" $B/vocab_cut.json $MERGES $B/vocab_cut.json
load_refuses "a merges line with one part" $VOCAB $B/merges_bad.txt $B/merges_bad.txt
load_refuses "a merge of symbols not in the vocabulary" $VOCAB $B/merges_unknown.txt $B/merges_unknown.txt

# ---- the cache of words: the same ids without it, also once it has been emptied (over 2^20
# words: 1.17 million distinct ones, every tenth an earlier one again)
$PY -c '
import sys
word = lambda i: "".join(chr(97 + i // 26 ** k % 26) for k in range(5))
words = [" " + (word(i) if i % 10 else word(i // 2)) for i in range(1300000)]
for d in range(4):   # four documents: the cache outlives each
    text = "".join(words[d::4]).encode()
    sys.stdout.buffer.write(b"%d distinct words %d\n" % (len(text), d) + text + b"\n")
' > $B/words.docs
same_without_cache() {  # name, docs file
    if $T --docs --no-cache $VOCAB $MERGES $2 > $B/$1.nocache.ids 2> $B/$1.nocache.err && cmp -s $B/$1.nocache.ids $B/$1.ids; then
        ok "cache: $1 encodes to the same $(grep -vc '^#' $B/$1.ids) ids without the cache of words"
    else
        bad "cache: $1" "the ids with and without the cache differ (or tokenize failed: $(head -1 $B/$1.nocache.err))"
    fi
}
encode words --docs $VOCAB $MERGES $B/words.docs && same_without_cache words $B/words.docs
[ $torture_ok -eq 0 ] && same_without_cache torture $B/torture.docs

# ---- the vocabulary in another JSON layout (indented, raw UTF-8 instead of \u escapes, ids in
# descending order) gives the same tokens
$PY -c '
import json, sys
vocab = json.load(open(sys.argv[1], encoding="utf-8"))
json.dump(dict(sorted(vocab.items(), key=lambda kv: -kv[1])), open(sys.argv[2], "w", encoding="utf-8"), indent=2, ensure_ascii=False)
' $VOCAB $B/vocab_other_layout.json
if $T --docs $B/vocab_other_layout.json $MERGES $B/torture.docs > $B/torture_layout.ids 2> $B/layout.err \
        && cmp -s $B/torture_layout.ids $B/torture.ids; then
    ok "load: the vocabulary indented, in raw UTF-8 and in descending id order gives the same torture-text tokens"
else
    bad "load: the vocabulary in another JSON layout" "other tokens, or refused: $(head -1 $B/layout.err)"
fi

# ---- preprocess --tokenizer-type GPT2BPETokenizer writes the same ids, each document's then EOD
# (the documents as JSON lines: the torture text in ASCII with \u escapes and surrogate pairs, the
# machine's text in raw UTF-8), with two workers
if [ ! -x ./preprocess ]; then
    echo "SKIP tokenizer in preprocess: ./preprocess not built (make preprocess)"
else
    for name in torture big; do
        [ -s $B/$name.ids ] || continue
        if ./preprocess --input $B/$name.jsonl --output-prefix $B/pp_$name --tokenizer-type GPT2BPETokenizer \
                --vocab-file $VOCAB --merge-file $MERGES --append-eod --workers 2 > $B/pp_$name.log 2>&1; then
            $PY tests/tokenizer_check.py preprocess-equals "preprocess $name" $B/pp_${name}_text_document $B/$name.ids \
                > $B/pp_$name.out 2> $B/pp_$name.err
            status=$?
            cat $B/pp_$name.out
            failed=$((failed + $(grep -c '^FAIL' $B/pp_$name.out)))
            if [ $status -ne 0 ] && ! grep -q '^FAIL' $B/pp_$name.out; then
                bad "tests/tokenizer_check.py preprocess-equals on $name" "exit status $status: $(tail -3 $B/pp_$name.err)"
            fi
        else
            bad "preprocess --tokenizer-type GPT2BPETokenizer on $name.jsonl" "$(tail -3 $B/pp_$name.log)"
        fi
    done
fi

# ---- the comparisons with GPT2Tokenizer
wait
if [ $have_hf = yes ]; then
    for name in torture torture_whole big; do
        [ -f $B/compare_$name.status ] || continue
        cat $B/compare_$name.out
        status=$(cat $B/compare_$name.status)
        failed=$((failed + $(grep -c '^FAIL' $B/compare_$name.out)))
        if [ $status -ne 0 ] && ! grep -q '^FAIL' $B/compare_$name.out; then
            bad "tests/tokenizer_check.py on $name" "exit status $status: $(tail -3 $B/compare_$name.err)"
        fi
    done
fi
echo "tokenizer test: $(seconds $started)"
[ $failed -eq 0 ]
