#!/usr/bin/env bash
# tests/test_tokenizer.sh [DATA_PREFIX, unused] — tokenizer.h (GPT-2's byte-level BPE) against
# Hugging Face's GPT2Tokenizer, token for token, through tests/tokenize.c.
#   Everywhere: builds tests/build/tokenize; decodes what it encoded back to the same bytes
#   (the torture text and >= 10 MiB of the machine's text, each document on its own and each
#   file as one text); refuses invalid UTF-8 (overlong encodings, a lone continuation byte, a
#   sequence cut by the end of the file, an encoded surrogate, a code point past U+10FFFF,
#   bytes C0, F5, FF) with one line naming the file and the byte offset, exit status 2;
#   refuses damaged vocabulary and merges files with one line naming the file (among them merges
#   that do not match the vocabulary: empty, cut, without "#version", a token no merge builds;
#   special tokens such as <s> or [PAD] are accepted) and long symbols without a fixed buffer;
#   preprocess and train_cpu refuse a FIFO as either file at once; two ranks under mpirun whose
#   copies of the merges differ are named (issue 45, items 5, 7, 8, 13); reads the
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

# ---- the merges file must match its vocabulary (issue 45, item 13: a cut or empty merges file
# was accepted and tokenized otherwise): its "#version" line, a newline after its last merge,
# and every token built by a merge but the 256 bytes and special tokens
: > $B/merges_empty.txt
head -1 $MERGES > $B/merges_header_only.txt
head -30001 $MERGES > $B/merges_30000.txt
head -c 200000 $MERGES > $B/merges_cut_in_a_line.txt
tail -n +2 $MERGES > $B/merges_no_header.txt
load_refuses "an empty merges file" $VOCAB $B/merges_empty.txt "merges_empty.txt: empty"
load_refuses "a merges file of its #version line alone" $VOCAB $B/merges_header_only.txt \
    "merges_header_only.txt: no merge builds 50000 of the tokens of --vocab-file $VOCAB (the first: id 256, 'Ġt')"
load_refuses "GPT-2's first 30,000 merges" $VOCAB $B/merges_30000.txt "merges_30000.txt: no merge builds 20000 of the tokens"
load_refuses "a merges file cut inside a line" $VOCAB $B/merges_cut_in_a_line.txt "merges_cut_in_a_line.txt: the last line has no newline"
load_refuses "a merges file without its #version line" $VOCAB $B/merges_no_header.txt "merges_no_header.txt: expected \"#version"
# special tokens (GPT-2's <|endoftext|>, Hugging Face's added <s>, </s>, <|im_start|>, [PAD]) are built by
# no merge and accepted; an ordinary token no merge builds is refused
$PY -c '
import json, sys
vocab = json.load(open(sys.argv[1], encoding="utf-8"))
n = len(vocab)
json.dump(dict(vocab, **{"<s>": n, "</s>": n + 1, "<|im_start|>": n + 2, "[PAD]": n + 3}), open(sys.argv[2], "w"))
json.dump(dict(vocab, **{"\u0120zqxj": n}), open(sys.argv[3], "w"))
' $VOCAB $B/vocab_special.json $B/vocab_unbuilt.json
if $T --docs $B/vocab_special.json $MERGES $B/torture.docs > $B/torture_special.ids 2> $B/special.err \
        && cmp -s $B/torture_special.ids $B/torture.ids; then
    ok "load: special tokens added to the vocabulary (<s>, </s>, <|im_start|>, [PAD]) are accepted, the torture text's tokens the same"
else
    bad "load: special tokens added to the vocabulary" "other tokens, or refused: $(head -1 $B/special.err)"
fi
load_refuses "a vocabulary token no merge builds" $B/vocab_unbuilt.json $MERGES \
    "no merge builds 1 of the tokens of --vocab-file $B/vocab_unbuilt.json (the first: id 50257, 'Ġzqxj')"
# a long symbol is read without a fixed buffer (issue 45, item 5: 3,000 bytes overwrote the stack,
# 20,000,000 crashed)
for n in 3000 20000000; do
    $PY -c 'import sys; sys.stdout.write("#version: 0.2\n" + "a" * int(sys.argv[1]) + " b\n")' $n > $B/merges_long$n.txt
    load_refuses "a merge of a $n-byte symbol" $VOCAB $B/merges_long$n.txt "merges_long$n.txt: line 2: a symbol the vocabulary lacks: 'aaaa"
done

# ---- preprocess and the trainer read the tokenizer's files: a FIFO refused at once (issue 45,
# item 8: it blocked until killed), a long symbol refused (item 5: a segfault), and ranks whose
# files differ named (item 7: MPI_ERR_TRUNCATE, or 30,000 merges on one rank silently)
one_line_exit2() {  # LABEL NEEDLE COMMAND...: exit status 2 within 20 s, one line on stderr holding NEEDLE
    local label=$1 needle=$2; shift 2
    timeout 20 "$@" > $B/run.out 2> $B/run.err
    local status=$? lines=$(grep -vc '^\(-\|  \|mpirun\|Primary job\|a non-zero\|the job\|$\)' $B/run.err)
    if [ $status -eq 2 ] && [ $lines -eq 1 ] && grep -qF -- "$needle" $B/run.err; then ok "$label: $(grep -m1 error $B/run.err)"
    else bad "$label" "expected exit status 2 and one line with \"$needle\"; got status $status, $lines line(s): $(head -c 400 $B/run.err)"; fi
}
if [ ! -x ./preprocess ] || [ ! -x ./train_cpu ]; then
    echo "SKIP tokenizer files in preprocess and train_cpu: ./preprocess or ./train_cpu not built (make cpu preprocess)"
else
    export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    mkfifo $B/fifo
    scripts/make_corpus.sh $B/corpus.jsonl > /dev/null
    GPT2="--tokenizer-type GPT2BPETokenizer"
    ./preprocess --input $B/corpus.jsonl --append-eod --output-prefix $B/bpe $GPT2 --vocab-file $VOCAB --merge-file $MERGES > /dev/null
    PP="./preprocess --input $B/corpus.jsonl --output-prefix $B/refused $GPT2"
    TRAIN="./train_cpu --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2
           --global-batch-size 4 --data-path $B/bpe_text_document --split 100,0,0 --data-cache-path $B/cache --eval-iters 0
           --train-iters 2 $GPT2"
    one_line_exit2 "preprocess, a FIFO as --vocab-file" "$B/fifo: is a FIFO" $PP --vocab-file $B/fifo --merge-file $MERGES
    one_line_exit2 "preprocess, a FIFO as --merge-file" "$B/fifo: is a FIFO" $PP --vocab-file $VOCAB --merge-file $B/fifo
    one_line_exit2 "train_cpu, a FIFO as --vocab-file" "$B/fifo: is a FIFO" $TRAIN --vocab-file $B/fifo --merge-file $MERGES
    one_line_exit2 "train_cpu, a FIFO as --merge-file" "$B/fifo: is a FIFO" $TRAIN --vocab-file $VOCAB --merge-file $B/fifo
    one_line_exit2 "preprocess, a 20,000,000-byte merge symbol" "merges_long20000000.txt: line 2: a symbol the vocabulary lacks" \
        $PP --vocab-file $VOCAB --merge-file $B/merges_long20000000.txt
    one_line_exit2 "train_cpu --generate-prompt, a 20,000,000-byte merge symbol" "merges_long20000000.txt: line 2" \
        $TRAIN --vocab-file $VOCAB --merge-file $B/merges_long20000000.txt --generate-prompt The --generate-tokens 4
    # two ranks, each with its own copy of the files (a node-local disk: the same relative paths,
    # another working directory); rank 1's merges with lines 100 and 101 swapped (still every token
    # built, but another tokenizer), then cut to 30,000 merges
    $TRAIN --vocab-file $VOCAB --merge-file $MERGES --save $B/model > $B/model.log 2>&1 || bad "train a model of GPT-2's ids" "$(tail -3 $B/model.log)"
    for r in 0 1; do mkdir -p $B/rank$r/tok && cp $VOCAB $B/rank$r/tok/encoder.json; done
    cp $MERGES $B/rank0/tok/vocab.bpe
    GEN="$PWD/train_cpu --skip-train --load $PWD/$B/model --micro-batch-size 2 --global-batch-size 4 $GPT2 --vocab-file tok/encoder.json
         --merge-file tok/vocab.bpe --tensor-model-parallel-size 2 --generate-prompt The --generate-tokens 4 --temperature 0"
    echo "exec mpirun --oversubscribe --bind-to none -np 1 --wdir $PWD/$B/rank0" $GEN ": -np 1 --wdir $PWD/$B/rank1" $GEN > $B/two_ranks.sh
    cp $MERGES $B/rank1/tok/vocab.bpe
    if timeout 60 bash $B/two_ranks.sh > $B/same.log 2>&1 && grep -q '^generation: 4 tokens' $B/same.log; then
        ok "two ranks with the same tokenizer files, each its own copy, generate at TP 2"
    else bad "two ranks with the same tokenizer files" "$(tail -3 $B/same.log)"; fi
    awk 'NR == 100 { held = $0; next } NR == 101 { print; print held; next } { print }' $MERGES > $B/rank1/tok/vocab.bpe
    one_line_exit2 "two ranks, rank 1's merges in another order" \
        "Rank(1)] --merge-file tok/vocab.bpe: this rank's merges file differs from rank 0's" bash $B/two_ranks.sh
    head -30001 $MERGES > $B/rank1/tok/vocab.bpe
    one_line_exit2 "two ranks, rank 1's merges cut to 30,000" "Rank(1)] --merge-file tok/vocab.bpe: no merge builds 20000" bash $B/two_ranks.sh
fi

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
