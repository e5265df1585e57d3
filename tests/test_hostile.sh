#!/usr/bin/env bash
# tests/test_hostile.sh DATA_PREFIX — the readers of every file a user hands gridgpt, built with
# AddressSanitizer and UBSan, over a corpus of hostile files (issue 45): each must be refused in
# one line (exit 2) or read (exit 0), never crash, never read or write out of bounds, never hit
# undefined behaviour (a signed overflow, an index past an array).
#
# The corpus: the files under tests/data/hostile/ (small, written by hand for the defects they
# once showed), and variants made here from good files with a fixed seed:
#   hf/NAME/            a Hugging Face model directory          train_cpu --import-hf NAME --save TMP
#   merges/NAME.txt     a merges file, with GPT-2's encoder.json  preprocess --tokenizer-type GPT2BPETokenizer
#   vocab/NAME.json     a vocabulary, with GPT-2's vocab.bpe     preprocess --tokenizer-type GPT2BPETokenizer
#   checkpoint/NAME/    a --load directory                       train_cpu --load NAME (a tiny model)
#   made here           .idx files with random bytes changed     preprocess --inspect PREFIX
#                       checkpoints with one field of metadata.txt out of range, a cut tensors.bin
#                       merges files with a long symbol
set -u
data=${1:?usage: test_hostile.sh DATA_PREFIX}
cd "$(dirname "$0")/.."
B=tests/build/hostile
H=tests/data/hostile
rm -rf $B && mkdir -p $B/made
ok() { echo "PASS $1"; }
bad() { echo "FAIL $1: $2"; }

# the two programs, with both sanitizers; any report ends the program (exit 99)
flags="-std=gnu11 -O0 -g -fopenmp -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
if ! mpicc $flags train.c -o $B/train_cpu -lz -lm > $B/build.log 2>&1 || ! gcc $flags preprocess.c -o $B/preprocess -lm >> $B/build.log 2>&1; then
    bad "the sanitizer builds" "$(head -20 $B/build.log)"; exit 1
fi
export ASAN_OPTIONS=detect_leaks=0:exitcode=99 UBSAN_OPTIONS=print_stacktrace=1:exitcode=99 OMP_NUM_THREADS=1

# run NAME COMMAND...: exit 0 or 2, with 2 exactly one line "error: ...", and no sanitizer report
cases=0 failures=0
run() {
    local name=$1; shift
    timeout 60 "$@" > $B/out 2> $B/err
    local status=$? errors
    errors=$(grep -c '^error: ' $B/err)
    cases=$((cases + 1))
    if grep -qE 'AddressSanitizer|runtime error|LeakSanitizer' $B/err || [ $status -ne 0 -a $status -ne 2 ] ||
            { [ $status -eq 2 ] && [ "$errors" -ne 1 ]; }; then
        failures=$((failures + 1))
        bad "$name" "exit $status: $(grep -m3 -E 'ERROR|runtime error|^error|^    #[0-3] ' $B/err | head -c 600)"
    fi
}

# --- the stored corpus
text=$B/made/one.jsonl
printf '{"text": "Hello, hostile world."}\n{"text": "a second line"}\n' > $text
gpt2="--input $text --json-keys text --tokenizer-type GPT2BPETokenizer --output-prefix $B/made/out"
for f in $H/merges/*; do [ -e "$f" ] && run "merges $(basename $f)" $B/preprocess $gpt2 --vocab-file tests/data/gpt2/encoder.json --merge-file $f; done
for f in $H/vocab/*; do [ -e "$f" ] && run "vocab $(basename $f)" $B/preprocess $gpt2 --vocab-file $f --merge-file tests/data/gpt2/vocab.bpe; done
for d in $H/hf/*/; do [ -d "$d" ] && run "hf $(basename $d)" $B/train_cpu --import-hf $d --save $B/made/import_$(basename $d); done
M="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2 --global-batch-size 4
   --data-path $data --train-iters 3 --eval-iters 1 --eval-interval 10"
for d in $H/checkpoint/*/; do [ -d "$d" ] && run "checkpoint $(basename $d)" $B/train_cpu $M --load $d; done

# --- .idx files with 1 to 8 random bytes changed (the Megatron fixture's)
fixture=tests/data/megatron/corpus_u16/corpus_u16
python3 - "$fixture.idx" $B/made/idx <<'EOF'
import random, sys
good = open(sys.argv[1], "rb").read()
rng = random.Random(45)
for k in range(40):
    b = bytearray(good)
    for _ in range(rng.randint(1, 8)):
        at = rng.randrange(0, 34) if k % 2 else rng.randrange(len(b))   # half in the header
        b[at] = rng.randrange(256)
    open("%s%02d.idx" % (sys.argv[2], k), "wb").write(bytes(b))
EOF
for f in $B/made/idx*.idx; do
    cp $fixture.bin ${f%.idx}.bin
    run "idx $(basename $f)" $B/preprocess --inspect ${f%.idx}
done

# --- a checkpoint's metadata.txt with one field out of range (the CRC line removed, which is
# accepted from older checkpoints), and tensors.bin cut short
good=$B/made/good
./train_cpu $M --train-iters 2 --save $good > $B/made/good.log 2>&1 || { bad "a checkpoint to damage" "$(tail -3 $B/made/good.log)"; exit 1; }
while read -r name edit; do
    d=$B/made/ckpt_$name
    cp -r $good $d
    sed -i -e '/^crc32 /d' -e "$edit" $d/iter_0000002/metadata.txt
    run "checkpoint $name" $B/train_cpu $M --train-iters 4 --load $d
done <<'EOF'
iteration_huge s/^iteration 2$/iteration 99999999999999999999/
iteration_negative s/^iteration 2$/iteration -2/
consumed_valid_max s/^consumed_valid_samples 0$/consumed_valid_samples 9223372036854775807/
consumed_max s/^consumed_samples 8$/consumed_samples 9223372036854775807/
optimizer_step_min s/^optimizer_step 2$/optimizer_step -9223372036854775808/
num_layers_max s/^config num_layers 2$/config num_layers 2147483647/
hidden_negative s/^config hidden_size 64$/config hidden_size -64/
vocab_zero s/^config vocab_size 257$/config vocab_size 0/
seq_length_max s/^config seq_length 32$/config seq_length 2147483647/
epsilon_nan s/^config norm_epsilon .*/config norm_epsilon nan/
batch_negative s/^batch_schedule 4 /batch_schedule -4 /
section_past_end s/^section weight 0 474368$/section weight 0 9223372036854775807/
tensor_offset_negative s/^\(tensor language_model.embedding.word_embeddings.weight 257 64\) 0 /\1 -4 /
tensor_rows_huge s/^\(tensor language_model.embedding.word_embeddings.weight\) 257 /\1 4294967297 /
line_long s/^iteration 2$/iteration 2\nconfig seed 1234567890123456789012345678901234567890123456789012345678901234567890/
EOF
d=$B/made/ckpt_cut
cp -r $good $d
truncate -s 1000 $d/iter_0000002/tensors.bin
run "checkpoint tensors.bin cut to 1000 bytes" $B/train_cpu $M --train-iters 4 --load $d

# --- merges files with one long symbol (a 3,000-byte one overwrote the stack)
for n in 3000 100000; do
    f=$B/made/merges_long_$n.txt
    { echo '#version: 0.2'; printf 'Ġ %s\n' "$(head -c $n /dev/zero | tr '\0' a)"; } > $f
    run "merges with a $n-byte symbol" $B/preprocess $gpt2 --vocab-file tests/data/gpt2/encoder.json --merge-file $f
done

if [ $failures -eq 0 ]; then ok "$cases hostile files read by the ASan/UBSan builds: each refused in one line or read, no sanitizer report"
else bad "hostile files" "$failures of $cases failed (above)"; fi
