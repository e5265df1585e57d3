#!/usr/bin/env bash
# tests/test_preprocess_gpt2.sh [DATA_PREFIX] — GPT-2's tokenizer end to end (issue 35, items 4
# and 5): ./preprocess --tokenizer-type GPT2BPETokenizer --append-eod writes the ids that
# transformers' GPT2Tokenizer gives (built offline from tests/data/gpt2; one SKIP line where no
# python3 has transformers, a FAIL with REQUIRE_TRANSFORMERS=1, as CI sets), the same files at
# --workers 1 and 2; every bad input (the tokenizer's two files, the JSON lines, text that is
# not UTF-8, the flags) ends with one line naming the file (and line), exit status 2, and no
# output left behind; --json-keys is text by default and --input-format text reads plain text;
# then ./train_cpu trains on GPT-2 tokens and prints its sample as text, from the prompt.
# DATA_PREFIX (tests/run.sh passes its corpus) is not needed: the test makes its own.
set -u
cd "$(dirname "$0")/.."
B=tests/build/preprocess_gpt2
rm -rf $B && mkdir -p $B
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
G=tests/data/gpt2
GPT2="--tokenizer-type GPT2BPETokenizer --vocab-file $G/encoder.json --merge-file $G/vocab.bpe"
failed=0
ok() { echo "PASS $1"; }
bad() { echo "FAIL $1: $2"; failed=$((failed + 1)); }

# ---- inputs: the license corpus, and lines that exercise GPT-2's pattern (contractions, letters
# and numbers of other scripts, combining marks, emoji, whitespace runs, words past the cache's
# 256 bytes, escapes, a blank line, an empty text, keys around the text)
scripts/make_corpus.sh $B/corpus.jsonl > /dev/null
long_word=$(printf 'a%.0s' $(seq 300))
cat > $B/cases.jsonl <<EOF
{"text": "Hello world! I'm here, you're there; they've gone, he'll stay, she'd go, it's DON'T 'S."}
{"id": 2, "meta": {"a": [1, "x}"]}, "text": "na\u00efve caf\u00e9 \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u4e2d\u6587 \u65e5\u672c\u8a9e \ud55c\uad6d\uc5b4"}
{"text": "12345 3.14159 \u0661\u0662\u0663 \u216b \u00bd e\u0301 \ud83d\ude00\ud83d\udc4d\ud83c\udffd ok"}

{"text": "a  b   c\t\td\n\n\ne  \u00a0x\u3000y\u2028z\r\nend   "}
{"text": ""}
{"text": "!!! ??? ... --- ''' \"quoted\" \\\\ back/slash \u0001\u007f"}
{"text": "$long_word 123456789012345678901234567890 $long_word$long_word"}
EOF
cat $B/cases.jsonl $B/corpus.jsonl > $B/all.jsonl
printf 'Plain text, one document per file.\n\nIt'"'"'s read whole:  spaces   stay.\n' > $B/plain.txt

# ---- preprocess with GPT-2's tokenizer, at one worker and at two
run_ok() {  # NAME ARGS...: exit 0
    local name=$1; shift
    if ./preprocess "$@" > $B/out 2> $B/err; then return 0; fi
    bad "$name" "status $?: $(head -c 300 $B/err)"
    return 1
}
run_ok "preprocess --workers 1" --input $B/all.jsonl --output-prefix $B/w1 $GPT2 --append-eod --workers 1
run_ok "preprocess --workers 2" --input $B/all.jsonl --output-prefix $B/w2 $GPT2 --append-eod --workers 2
if cmp -s $B/w1_text_document.bin $B/w2_text_document.bin && cmp -s $B/w1_text_document.idx $B/w2_text_document.idx; then
    ok "GPT2BPETokenizer at --workers 1 and 2: identical .bin and .idx"
else bad "GPT2BPETokenizer at --workers 1 and 2" "the files differ"; fi
if grep -q "dtype uint16" $B/out; then ok "GPT-2's 50257 ids are written as uint16 (Megatron's choice below 65500)"
else bad "GPT-2's ids as uint16" "$(cat $B/out)"; fi
run_ok "preprocess without --json-keys" --input $B/cases.jsonl --output-prefix $B/nokeys $GPT2 --append-eod
run_ok "preprocess --json-keys text" --input $B/cases.jsonl --output-prefix $B/keys $GPT2 --append-eod --json-keys text
if cmp -s $B/nokeys_text_document.bin $B/keys_text_document.bin && cmp -s $B/nokeys_text_document.idx $B/keys_text_document.idx; then
    ok "--json-keys is text by default (as preprocess_data.py)"
else bad "--json-keys is text by default" "the files differ from --json-keys text's"; fi
run_ok "preprocess --input-format text" --input $B/plain.txt --output-prefix $B/plain $GPT2 --append-eod --input-format text

# empty documents are skipped, as preprocess_data.py skips them, and counted (issue 45, item 16: 10
# lines with one {"text": ""} once said "9 documents" and no more)
for i in 1 2 3 4 5 6 7 8 9; do echo "{\"text\": \"document $i\"}"; [ $i = 4 ] && echo '{"text": ""}'; done > $B/ten.jsonl
run_ok "preprocess of 10 lines, one empty" --input $B/ten.jsonl --output-prefix $B/ten $GPT2 --append-eod
if grep -q "9 documents, 27 tokens (1 empty document skipped, as preprocess_data.py does)" $B/out; then
    ok "10 lines, one of them {\"text\": \"\"}: 9 documents, and the empty one counted as skipped"
else bad "an empty document counted" "$(head -1 $B/out)"; fi

# the byte-level tokenizer reads JSON lines too: {"text": "hello"} is 5 bytes and the EOD, not the raw line
printf '{"text": "hello"}\n' > $B/hello.jsonl
run_ok "bytes without --json-keys" --input $B/hello.jsonl --output-prefix $B/hello --append-eod
if grep -q "1 documents, 6 tokens" $B/out; then ok "bytes without --json-keys: the text string, not the raw JSON line"
else bad "bytes without --json-keys" "$(head -1 $B/out)"; fi
run_ok "bytes --input-format text" --input $B/plain.txt $B/hello.jsonl --output-prefix $B/files --input-format text
if grep -q "2 documents, $(( $(wc -c < $B/plain.txt) + $(wc -c < $B/hello.jsonl) )) tokens" $B/out; then
    ok "bytes --input-format text: each file one document of its bytes (the whole-file mode, opted into)"
else bad "bytes --input-format text" "$(head -1 $B/out)"; fi

# ---- the ids against transformers' GPT2Tokenizer (the first python3 that has it)
have_transformers=no
for PY in python3 /usr/bin/python3; do
    $PY -c "import transformers" > /dev/null 2>&1 && { have_transformers=yes; break; }
done
if [ $have_transformers = no ] && [ "${REQUIRE_TRANSFORMERS:-0}" = 1 ]; then
    bad "transformers is required here (REQUIRE_TRANSFORMERS=1, as in CI)" "no python3 with transformers"
elif [ $have_transformers = no ]; then
    echo "SKIP GPT2BPETokenizer against transformers' GPT2Tokenizer: python transformers not installed"
else
    # each argument: INPUT:PREFIX:FORMAT; one line per argument, "ok N documents" or what differs
    $PY - $B/all.jsonl:$B/w1_text_document:jsonl $B/plain.txt:$B/plain_text_document:text > $B/compare.out 2> $B/compare.err <<'EOF'
import json, struct, sys
from transformers import GPT2Tokenizer
tok = GPT2Tokenizer(vocab_file="tests/data/gpt2/encoder.json", merges_file="tests/data/gpt2/vocab.bpe")
for arg in sys.argv[1:]:
    path, prefix, fmt = arg.split(":")
    with open(path, encoding="utf-8", newline="") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()] if fmt == "jsonl" else [f.read()]
    want = [ids + [50256] for ids in map(tok.encode, texts) if ids]   # --append-eod; empty documents skipped
    idx, data = open(prefix + ".idx", "rb").read(), open(prefix + ".bin", "rb").read()
    n, dtype = struct.unpack("<Q", idx[18:26])[0], idx[17]
    sizes = struct.unpack("<%di" % n, idx[34:34 + 4 * n])
    ids = struct.unpack("<%dH" % (len(data) // 2), data)
    got, at = [], 0
    for size in sizes:
        got.append(list(ids[at:at + size]))
        at += size
    diff = [i for i in range(min(len(got), len(want))) if got[i] != want[i]]
    if dtype != 8: print("dtype code %d, not uint16's 8" % dtype)
    elif len(got) != len(want): print("%d documents, transformers %d" % (len(got), len(want)))
    elif diff: print("document %d: %s, transformers %s (text %r)" % (diff[0], got[diff[0]][:40], want[diff[0]][:40], texts[diff[0]][:80]))
    else: print("ok %d documents, %d tokens" % (len(got), len(ids)))
EOF
    status=$?
    line() { sed -n "$1p" $B/compare.out; }
    for k in 1 2; do
        what=$([ $k = 1 ] && echo "JSON lines (the license corpus and hard cases)" || echo "a plain-text file (--input-format text)")
        if [ $status -eq 0 ] && [ "$(line $k | cut -c1-3)" = "ok " ]; then ok "GPT2BPETokenizer = transformers' GPT2Tokenizer on $what: $(line $k | cut -c4-)"
        else bad "GPT2BPETokenizer = transformers' GPT2Tokenizer on $what" "$(line $k)$(tail -3 $B/compare.err)"; fi
    done
fi

# ---- bad input: one line naming the file (and line), exit status 2, no output left behind
expect_refusal() {  # NAME NEEDLE PREFIX ARGS...
    local name=$1 needle=$2 prefix=$3; shift 3
    ./preprocess "$@" --output-prefix $prefix > $B/out 2> $B/err
    local status=$? lines left
    lines=$(wc -l < $B/err)
    left=$(ls ${prefix}_* 2> /dev/null | head -3 | tr '\n' ' ')
    if [ $status -eq 2 ] && [ "$lines" -eq 1 ] && grep -qF -- "$needle" $B/err && [ -z "$left" ]; then ok "refused: $name"
    else bad "refused: $name" "status $status, $lines stderr line(s): $(head -c 300 $B/err)${left:+; left behind: $left}"; fi
}
V=$G/encoder.json M=$G/vocab.bpe T=GPT2BPETokenizer
in="--input $B/cases.jsonl --tokenizer-type $T --append-eod"
# the output's directory is made when missing, and a failed run takes away the ones it made
rm -rf $B/made
if ./preprocess $in --vocab-file $G/encoder.json --merge-file $G/vocab.bpe --output-prefix $B/made/a/b/cases > /dev/null 2>&1 &&
   [ -s $B/made/a/b/cases_text_document.bin ] && [ -s $B/made/a/b/cases_text_document.idx ]; then
    ok "--output-prefix DIR/a/b/cases: the missing directories are made"
else bad "--output-prefix in a missing directory" "$(ls -R $B/made 2>&1 | head -5)"; fi
mkdir -p $B/made/kept
printf '{"text": "no end' > $B/broken.jsonl
./preprocess --input $B/broken.jsonl --output-prefix $B/made/kept/new/deeper/x > /dev/null 2>&1
status=$?
if [ $status -eq 2 ] && [ -d $B/made/kept ] && [ ! -e $B/made/kept/new ]; then
    ok "a failed run leaves no directory it made (the one that was there stays)"
else bad "a failed run's directories" "status $status: $(ls -R $B/made/kept 2>&1 | head -5)"; fi
expect_refusal "a missing vocabulary file" "$B/none.json" $B/r1 $in --vocab-file $B/none.json --merge-file $M
expect_refusal "a missing merges file" "$B/none.txt" $B/r2 $in --vocab-file $V --merge-file $B/none.txt
{ head -3 $M; echo "h e l"; } > $B/merges_three.txt
expect_refusal "a merges line that is not two symbols" "$B/merges_three.txt: line 4" $B/r3 $in --vocab-file $V --merge-file $B/merges_three.txt
{ head -2 $M; echo "Q Q"; } > $B/merges_qq.txt
expect_refusal "a merge whose result the vocabulary lacks" "$B/merges_qq.txt: line 3" $B/r4 $in --vocab-file $V --merge-file $B/merges_qq.txt
echo '["!", "\""]' > $B/vocab_array.json
expect_refusal "a vocabulary that is a JSON array" "$B/vocab_array.json" $B/r5 $in --vocab-file $B/vocab_array.json --merge-file $M
sed 's/"!": 0,/"!": "zero",/' $V > $B/vocab_string_id.json
expect_refusal "a vocabulary whose id is a string" "$B/vocab_string_id.json" $B/r6 $in --vocab-file $B/vocab_string_id.json --merge-file $M
sed 's/, "<|endoftext|>": 50256}/}/' $V > $B/vocab_no_eod.json
expect_refusal "--append-eod with a vocabulary without <|endoftext|>" "$B/vocab_no_eod.json: no <|endoftext|> token" $B/r18 $in \
    --vocab-file $B/vocab_no_eod.json --merge-file $M
printf '{"text": "fine"}\n[1, 2]\n' > $B/notobject.jsonl
expect_refusal "a JSON line that is not an object" "$B/notobject.jsonl:2" $B/r7 --input $B/notobject.jsonl $GPT2 --append-eod
printf '{"text": "fine"}\n\n{"body": "x"}\n' > $B/nokey.jsonl
expect_refusal "a JSON line without the key" "$B/nokey.jsonl:3" $B/r8 --input $B/nokey.jsonl $GPT2 --append-eod
printf '{"text": "fine"}\n{"text": "ab\xffcd"}\n' > $B/badutf8.jsonl
expect_refusal "invalid UTF-8 in a JSON string" "$B/badutf8.jsonl:2: invalid UTF-8" $B/r9 --input $B/badutf8.jsonl $GPT2 --append-eod
printf '{"text": "a truncated \xe2\x82"}\n' > $B/truncated.jsonl
expect_refusal "a truncated UTF-8 character" "$B/truncated.jsonl:1: invalid UTF-8" $B/r10 --input $B/truncated.jsonl $GPT2
expect_refusal "a bad file after a good one" "$B/badutf8.jsonl:2" $B/r11 --input $B/cases.jsonl $B/badutf8.jsonl $GPT2 --workers 2
printf 'text \xc0\xaf overlong\n' > $B/overlong.txt
expect_refusal "invalid UTF-8 in a plain-text file" "$B/overlong.txt: invalid UTF-8" $B/r12 --input $B/overlong.txt $GPT2 --input-format text
expect_refusal "--vocab-file without GPT2BPETokenizer" "--vocab-file goes with --tokenizer-type GPT2BPETokenizer" $B/r13 \
    --input $B/cases.jsonl --vocab-file $V --merge-file $M
expect_refusal "GPT2BPETokenizer without --merge-file" "--tokenizer-type GPT2BPETokenizer needs --vocab-file VOCAB.json and --merge-file" $B/r14 \
    --input $B/cases.jsonl --tokenizer-type $T --vocab-file $V
expect_refusal "--vocab-size with GPT2BPETokenizer" "--vocab-size goes with --tokenizer-type ids" $B/r15 $in --vocab-file $V --merge-file $M --vocab-size 50304
expect_refusal "--json-keys with --input-format text" "--json-keys" $B/r16 $in --vocab-file $V --merge-file $M --json-keys text --input-format text
expect_refusal "an unknown --tokenizer-type" "--tokenizer-type GPT2Tokenizer" $B/r17 --input $B/cases.jsonl --tokenizer-type GPT2Tokenizer
# a lone surrogate has no UTF-8: Python's strict encoding raises where this once wrote U+FFFD (issue 45, item 10)
printf '{"text": "fine"}\n{"text": "a\\ud800b"}\n' > $B/surrogate.jsonl
expect_refusal "a lone surrogate (\\ud800) in a JSON string" "$B/surrogate.jsonl:2: a lone surrogate" $B/r19 --input $B/surrogate.jsonl $GPT2
printf '{"text": "low first \\udc00\\ud800"}\n' > $B/surrogate_low.jsonl
expect_refusal "a low surrogate before a high one" "$B/surrogate_low.jsonl:1: a lone surrogate" $B/r20 --input $B/surrogate_low.jsonl $GPT2
# --workers is bounded by the cores (issue 45, item 6: 10^8 segfaulted and left .bin.tmp, 2^31 was an
# OpenMP out-of-memory, 2^32 wrapped to 0 and was accepted)
for w in 100000000 2147483648 4294967296; do
    expect_refusal "--workers $w" "--workers $w: at most" $B/r21 $in --vocab-file $V --merge-file $M --workers $w
done

# ---- the trainer on GPT-2 tokens: the prompt encoded, the sample decoded
train="--num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2 --global-batch-size 4
       --train-iters 3 --eval-iters 1 --split 90,10,0 --data-cache-path $B/cache"
./train_cpu --data-path $B/w1_text_document $train $GPT2 --generate-tokens 20 --generate-prompt "The" --max-position-embeddings 32 \
    --generate-ignore-eod > $B/train.log 2>&1
status=$?
sample=$(sed -n '/^---------- sample/,/^-------------------/p' $B/train.log | sed '1d;$d')
if [ $status -eq 0 ] && [ "${sample:0:3}" = "The" ] && [ "$(printf '%s' "$sample" | wc -c)" -gt 23 ] &&
   ! printf '%s' "$sample" | grep -qE '^The( [0-9]+)+ ?$' && printf '%s' "${sample:3}" | grep -q '[A-Za-z]'; then
    ok "train_cpu with GPT2BPETokenizer: the sample starts with the prompt and is printed as text ($(printf '%s' "$sample" | head -c 60 | tr '\n' ' ')...)"
else bad "train_cpu with GPT2BPETokenizer samples text" "status $status: $(tail -3 $B/train.log)"; fi
if ./train_cpu --data-path $B/w1_text_document $train $GPT2 --generate-tokens 5 > $B/train_eod.log 2>&1 &&
   grep -q "^---------- sample (5 tokens" $B/train_eod.log; then ok "train_cpu with GPT2BPETokenizer: no prompt starts at <|endoftext|>"
else bad "train_cpu with GPT2BPETokenizer: no prompt" "$(tail -3 $B/train_eod.log)"; fi

expect_train_error() {  # NAME NEEDLE ARGS...: exit 2, exactly one line on stderr, containing NEEDLE
    local name=$1 needle=$2; shift 2
    ./train_cpu "$@" > $B/out 2> $B/err
    local status=$? lines
    lines=$(wc -l < $B/err)
    if [ $status -eq 2 ] && [ "$lines" -eq 1 ] && grep -qF -- "$needle" $B/err; then ok "train_cpu refuses $name"
    else bad "train_cpu refuses $name" "status $status, $lines stderr line(s): $(head -c 300 $B/err)"; fi
}
./preprocess --input $B/corpus.jsonl --output-prefix $B/bytes --append-eod > /dev/null
expect_train_error "a --vocab-size other than the tokenizer's" "--vocab-file $G/encoder.json has 50257 tokens, but the model's vocabulary (--vocab-size) has 257" \
    --data-path $B/bytes_text_document $train $GPT2 --vocab-size 257
expect_train_error "--vocab-file without --tokenizer-type" "--vocab-file goes with --tokenizer-type GPT2BPETokenizer" \
    --data-path $B/w1_text_document $train --vocab-file $G/encoder.json --merge-file $G/vocab.bpe
expect_train_error "GPT2BPETokenizer without --merge-file" "--tokenizer-type GPT2BPETokenizer needs --vocab-file VOCAB.json and --merge-file" \
    --data-path $B/w1_text_document $train --tokenizer-type GPT2BPETokenizer --vocab-file $G/encoder.json
expect_train_error "a missing --vocab-file" "$B/none.json" \
    --data-path $B/w1_text_document $train --tokenizer-type GPT2BPETokenizer --vocab-file $B/none.json --merge-file $G/vocab.bpe
expect_train_error "a prompt not in UTF-8" "--generate-prompt: invalid UTF-8 at byte 1" \
    --data-path $B/w1_text_document $train $GPT2 --generate-tokens 5 --generate-prompt $'a\xff'
expect_train_error "a prompt for GPT-2 tokens without the tokenizer" "--generate-prompt: a vocabulary of 50257 ids is not bytes" \
    --data-path $B/w1_text_document $train --generate-tokens 5 --generate-prompt "The"

echo "$failed failed"
[ $failed -eq 0 ]
