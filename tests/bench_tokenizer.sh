#!/usr/bin/env bash
# tests/bench_tokenizer.sh (part of `make bench`) — tokenizer.h's tokens/s on one thread against
# Hugging Face's `tokenizers` (Rust, from PyPI) on the same text in the same run, and the
# preprocess program's at --workers 1 and 2.
#   The text: >= 10 MiB of what this machine ships (tests/make_big_text.py), one document per
#   file. tests/build/tokenize_O3 (tests/tokenize.c at preprocess's flags) encodes every
#   document OUR_PASSES times (10: a pass takes a tenth of a second) with a fresh cache each
#   pass (cold), with one cache kept across passes (warm), and without a cache. `tokenizers`, built from the same two files, encodes
#   the same documents with encode_batch on one thread (RAYON_RS_NUM_CPUS=1,
#   TOKENIZERS_PARALLELISM=false), 1 + PASSES times (3): its first pass fills its BPE cache, the
#   others are warm. The ratio compares best passes, the least disturbed by other work.
#   Then ./preprocess --tokenizer-type GPT2BPETokenizer on the documents as JSON lines: wall
#   time of the whole program (reading, JSON, tokenizing, writing the .bin/.idx).
#   tests/test_tokenizer.sh checks that both tokenizers give GPT2Tokenizer's tokens.
# About 35 s, most of it in `tokenizers`.
set -u
cd "$(dirname "$0")/.."
B=tests/build/tokenizer_bench
rm -rf $B && mkdir -p $B
VOCAB=tests/data/gpt2/encoder.json MERGES=tests/data/gpt2/vocab.bpe
PASSES=${PASSES:-3} OUR_PASSES=${OUR_PASSES:-10}
T=tests/build/tokenize_O3
status=0

CFLAGS="-std=gnu11 -O3 -march=${CPU_ARCH:-native} -fno-math-errno -Wall -Wextra -Werror"   # preprocess's, less OpenMP
if ! ${CC:-gcc} $CFLAGS tests/tokenize.c -o $T > $B/build.log 2>&1; then
    echo "FAIL build tokenize:"; cat $B/build.log; exit 1
fi
PY=""
for p in /usr/bin/python3 python3; do
    $p -c "import tokenizers" > /dev/null 2>&1 && { PY=$p; break; }
done
if ! ${PY:-python3} tests/make_big_text.py $B/big.docs --jsonl $B/big.jsonl > $B/big.log 2>&1; then
    echo "FAIL tests/make_big_text.py: $(tail -3 $B/big.log)"; exit 1
fi

echo "tokenizer benchmark — $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg) before"
echo "text:    $(cat $B/big.log)"
echo "build:   ${CC:-gcc} $CFLAGS"
if ! $T --docs --bench $OUR_PASSES $VOCAB $MERGES $B/big.docs | tee $B/ours.txt; then
    echo "FAIL tokenize --bench"; status=1
fi
if [ -n "$PY" ]; then
    if ! RAYON_RS_NUM_CPUS=1 TOKENIZERS_PARALLELISM=false $PY tests/tokenizer_check.py bench-hf $B/big.docs $PASSES \
            2> $B/hf.err | tee $B/hf.txt; then
        echo "FAIL tests/tokenizer_check.py bench-hf: $(tail -3 $B/hf.err)"; status=1
    fi
    best() { sed -n "s/^$1 .*(best pass \([0-9.]*\) M tokens\/s.*/\1/p" $2; }
    hf=$(best tokenizers $B/hf.txt) hf_cold=$(sed -n 's/.*first pass, cache empty: \([0-9.]*\) M.*/\1/p' $B/hf.txt)
    warm=$(best 'tokenize warm cache' $B/ours.txt) cold=$(best 'tokenize cold cache' $B/ours.txt)
    if [ -n "$hf" ] && [ -n "$warm" ]; then
        awk -v w=$warm -v c=$cold -v h=$hf -v hc=$hf_cold 'BEGIN { printf "ratio:   tokenizer.h / tokenizers = %.1fx with warm caches, %.1fx with empty ones (best passes, its first; one thread each)\n", w / h, c / hc }'
    fi
else
    echo "tokenizers: not measured (no 'import tokenizers' in /usr/bin/python3 or python3; pip install tokenizers)"
fi

# the preprocess program, whole: its own timing line, and ours around it
if [ -x ./preprocess ] && ./preprocess --help 2>&1 | grep -q GPT2BPETokenizer; then
    for workers in 1 2; do
        began=$(date +%s%N)
        if ./preprocess --input $B/big.jsonl --output-prefix $B/pp$workers --tokenizer-type GPT2BPETokenizer \
                --vocab-file $VOCAB --merge-file $MERGES --append-eod --workers $workers > $B/pp$workers.log 2>&1; then
            ms=$(( ($(date +%s%N) - began) / 1000000 ))
            tokens=$(sed -n 's/.* \([0-9]*\) tokens$/\1/p' $B/pp$workers.log | head -1)
            awk -v t=${tokens:-0} -v ms=$ms -v w=$workers 'BEGIN { printf "preprocess --workers %d: %6.2f M tokens/s, %d tokens in %.2f s wall (JSON lines in, .bin/.idx out)\n", w, t / ms / 1e3, t, ms / 1e3 }'
        else
            echo "FAIL preprocess --workers $workers: $(tail -3 $B/pp$workers.log)"; status=1
        fi
    done
    cmp -s $B/pp1_text_document.bin $B/pp2_text_document.bin || { echo "FAIL preprocess: --workers 1 and 2 wrote different .bin files"; status=1; }
else
    echo "preprocess: not measured (./preprocess missing or without --tokenizer-type GPT2BPETokenizer; make preprocess)"
fi
exit $status
