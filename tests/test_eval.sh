#!/usr/bin/env bash
# tests/test_eval.sh DATA_PREFIX — evaluation alone (issue 36, item 4), and the model's shape
# taken from the checkpoint (Megatron-LM's --use-checkpoint-args, the default here).
#   --skip-train --load CKPT, with no model flag, prints the very validation and test lines of
#   the run that saved CKPT, in Megatron-LM's shape; at TP 2 x PP 2 x DP 2 the same losses within
#   1e-5; --valid-data-path and --test-data-path (blends too) give what --data-path with a --split
#   giving every document to that split gives; a flag differing from the checkpoint, and each
#   misuse of the new flags, is one line and exit status 2.
#   --full-validation (issue 46): every token of a held-out file once, in windows of --seq-length
#   (the last one shorter), the same at TP 2 x PP 2 x DP 2, equal to transformers' loss on the
#   same windows (tests/full_validation_check.py on the exported model); more samples asked than
#   a file holds: a note that says it is several epochs; --eval-iters not given: at most one
#   pass of the held-out split (said), the loss of the same number given.
set -u
data=${1:?usage: test_eval.sh DATA_PREFIX}
B=tests/build/eval
rm -rf $B && mkdir -p $B
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none"
ok() { echo "PASS $1"; }
bad() { echo "FAIL $1: $2"; }

# the evaluation block's lines (Megatron-LM's " validation loss at ... | lm loss value: ... |")
eval_lines() { grep '^ validation loss at iteration [0-9]* on \(validation\|test\) set | lm loss value: ' "$1"; }
value_of() { eval_lines "$1" | grep "on $2 set" | sed 's/.*lm loss value: \([^ ]*\) .*/\1/'; }
within() { awk -v a="$1" -v b="$2" -v tol="$3" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d; exit !(a != "" && d <= tol) }'; }

./train_cpu --data-path $data --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 \
    --micro-batch-size 2 --global-batch-size 4 --train-iters 12 --eval-interval 6 --eval-iters 2 --log-interval 6 \
    --split 90,8,2 --save $B/ck > $B/train.log 2>&1 || bad "train" "$(tail -3 $B/train.log)"
common="--eval-iters 2 --micro-batch-size 2 --global-batch-size 4"

# ---- evaluation alone, no model flag: the lines of the run that saved the checkpoint
./train_cpu --skip-train --load $B/ck --data-path $data --split 90,8,2 $common > $B/alone.log 2>&1
status=$?
if [ $status -eq 0 ] && [ "$(eval_lines $B/alone.log | wc -l)" -eq 2 ] && diff <(eval_lines $B/train.log) <(eval_lines $B/alone.log) > /dev/null; then
    ok "--skip-train --load (no model flag): the validation and test lines of the run that saved it, byte for byte"
else bad "--skip-train --load" "status $status; $(diff <(eval_lines $B/train.log) <(eval_lines $B/alone.log) | head -4; grep -m1 error $B/alone.log)"; fi
if grep -q '^model from checkpoint .*--num-layers 2 --hidden-size 32 --num-attention-heads 4 .*--seq-length 16' $B/alone.log &&
   ! grep -q 'summary:\|nan\|^ \[[^]]*\] iteration ' $B/alone.log; then
    ok "the model's shape comes from the checkpoint (printed); no step, no summary, no 'nan'"
else bad "evaluation alone's output" "$(grep -m2 'model from\|summary\|nan' $B/alone.log)"; fi
# Megatron-LM's block: a ruler one dash longer than the line, PPL = exp(loss)
ruler=$(grep -B1 -m1 ' on validation set' $B/alone.log | head -1)
line=$(grep -m1 ' on validation set' $B/alone.log)
v=$(value_of $B/alone.log validation)
ppl=$(echo "$line" | sed 's/.*lm loss PPL: \([^ ]*\) .*/\1/')
if [ "${#ruler}" -eq $(( ${#line} + 1 )) ] && [ -z "$(echo "$ruler" | tr -d -)" ] &&
   awk -v v="$v" -v p="$ppl" 'BEGIN { d = (exp(v) - p) / p; exit !(d < 1e-6 && d > -1e-6) }'; then
    ok "the block is Megatron-LM's: ruler one dash longer than ' validation loss at ... | ', PPL = exp(loss)"
else bad "the evaluation block" "ruler ${#ruler}, line ${#line}, loss $v, PPL $ppl"; fi

# ---- any layout: TP 2 x PP 2 x DP 2 (the same global batches)
$MPIRUN -np 8 ./train_cpu --skip-train --load $B/ck --data-path $data --split 90,8,2 --eval-iters 2 --micro-batch-size 1 \
    --global-batch-size 4 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 > $B/grid.log 2>&1
if within "$(value_of $B/grid.log validation)" "$v" 1e-5 &&
   within "$(value_of $B/grid.log test)" "$(value_of $B/alone.log test)" 1e-5; then
    ok "evaluation alone at TP 2 x PP 2 x DP 2 equals one process within 1e-5 ($(value_of $B/grid.log validation) vs $v)"
else bad "evaluation alone at (2,2,2)" "$(value_of $B/grid.log validation) vs $v; $(grep -m1 error $B/grid.log)"; fi

# ---- --full-validation (issue 46): every token of a held-out file once, in windows of 16, the
# last one shorter (134 targets: 8 windows of 16 and one of 6), at TP 2 x PP 2 x DP 2 as on one
# process (DP ranks take windows in turn, one of them padding), and as transformers' loss on the
# same windows; asking more samples than the file holds builds a second epoch, and says so
printf '%s\n' '{"text": "the held-out file: a few lines of text, evaluated once."}' \
    '{"text": "A second document, a little longer than the first one, with its own end."}' '{"text": "third"}' > $B/held.jsonl
./preprocess --input $B/held.jsonl --json-keys text --append-eod --output-prefix $B/held > /dev/null
full="--skip-train --load $B/ck --valid-data-path $B/held_text_document --full-validation --micro-batch-size 1 --global-batch-size 4"
./train_cpu $full > $B/full.log 2>&1
$MPIRUN -np 8 ./train_cpu $full --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 > $B/full_grid.log 2>&1
fv=$(value_of $B/full.log validation)
if grep -q '^full validation: 134 tokens predicted, in 9 windows of up to 16 ' $B/full.log &&
   within "$(value_of $B/full_grid.log validation)" "$fv" 1e-5; then
    ok "--full-validation: 134 tokens predicted in 9 windows of up to 16; TP 2 x PP 2 x DP 2 gives one process's loss ($fv)"
else bad "--full-validation" "$(grep -m1 '^full\|error' $B/full.log); $(value_of $B/full_grid.log validation) vs $fv"; fi
PY=
for p in python3 /usr/bin/python3; do $p -c "import torch, transformers" > /dev/null 2>&1 && { PY=$p; break; }; done
if [ -z "$PY" ] && [ "${REQUIRE_TRANSFORMERS:-0}" = 1 ]; then bad "transformers is required here" "no python3 with it"
elif [ -z "$PY" ]; then echo "SKIP --full-validation against transformers: no python3 with torch and transformers"
elif ./train_cpu --load $B/ck --export-hf $B/hf > $B/export.log 2>&1; then
    HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error $PY tests/full_validation_check.py $B/hf $B/held_text_document 16 "$fv" \
        "$(sed -n 's/^full validation: \([0-9]*\) tokens.*/\1/p' $B/full.log)" 2>&1 | tail -1 | grep '^\(PASS\|FAIL\)' ||
        bad "tests/full_validation_check.py" "no verdict"
else bad "export the model" "$(tail -2 $B/export.log)"; fi
./train_cpu --skip-train --load $B/ck --valid-data-path $B/held_text_document $common --eval-iters 5 > $B/epochs.log 2>&1
if grep -q "^note: the evaluations ask 20 valid samples of $B/held_text_document, which holds 8 in one pass: 3 epochs" $B/epochs.log; then
    ok "20 samples asked of a file of 8: a note says it is 3 epochs of the same documents"
else bad "the note on a second epoch" "$(grep -m1 'note\|error' $B/epochs.log)"; fi
# --eval-iters not given: Megatron-LM's 100, but never more than one pass of the split (here 8
# samples: 2 global batches of 4), the same loss as --eval-iters 2; given, it is taken as it is
./train_cpu --skip-train --load $B/ck --valid-data-path $B/held_text_document --micro-batch-size 2 --global-batch-size 4 \
    > $B/one_pass.log 2>&1
./train_cpu --skip-train --load $B/ck --valid-data-path $B/held_text_document $common > $B/two.log 2>&1
if grep -q "^note: an evaluation of the valid split takes 2 global batch(es) of 4, not --eval-iters' default 100: one pass of it holds 8 samples" $B/one_pass.log &&
   grep -q "valid: 8 samples asked, 8 in 1 epoch" $B/one_pass.log && [ -n "$(value_of $B/two.log validation)" ] &&
   [ "$(value_of $B/one_pass.log validation)" = "$(value_of $B/two.log validation)" ] &&
   ! grep -q "^note: an evaluation of" $B/epochs.log $B/two.log; then
    ok "--eval-iters not given: one pass of a file of 8 samples (2 global batches, said), the loss of --eval-iters 2 ($(value_of $B/two.log validation)); given, taken as it is"
else bad "the default evaluation's one pass" "$(grep -m2 'note: an evaluation\|valid:\|error' $B/one_pass.log); $(value_of $B/one_pass.log validation) vs $(value_of $B/two.log validation)"; fi

# ---- Megatron-LM's per-split paths: the split they name holds every document of their prefixes
./train_cpu --skip-train --load $B/ck --valid-data-path $data --test-data-path $data $common > $B/paths.log 2>&1
./train_cpu --skip-train --load $B/ck --data-path $data --split 0,100,0 $common > $B/split_valid.log 2>&1
./train_cpu --skip-train --load $B/ck --data-path $data --split 0,0,100 $common > $B/split_test.log 2>&1
pv=$(value_of $B/paths.log validation) pt=$(value_of $B/paths.log test)
if [ -n "$pv" ] && [ "$pv" = "$(value_of $B/split_valid.log validation)" ] && [ "$pt" = "$(value_of $B/split_test.log test)" ] &&
   grep -q "documents, all valid data" $B/paths.log; then
    ok "--valid-data-path P and --test-data-path P: the losses of --data-path P --split 0,100,0 and 0,0,100 ($pv, $pt)"
else bad "per-split paths" "valid $pv vs $(value_of $B/split_valid.log validation), test $pt vs $(value_of $B/split_test.log test); $(grep -m1 error $B/paths.log)"; fi
./train_cpu --skip-train --load $B/ck --valid-data-path 0.3 $data 0.7 $data $common > $B/blend.log 2>&1
./train_cpu --skip-train --load $B/ck --data-path 0.3 $data 0.7 $data --split 0,100,0 $common > $B/blend_split.log 2>&1
bv=$(value_of $B/blend.log validation)
if [ -n "$bv" ] && [ "$bv" = "$(value_of $B/blend_split.log validation)" ]; then
    ok "--valid-data-path 0.3 P 0.7 P blends as --data-path does ($bv)"
else bad "a per-split blend" "$bv vs $(value_of $B/blend_split.log validation); $(grep -m1 error $B/blend.log)"; fi
# and training from them: --train-data-path P trains as --data-path P --split 100,0,0
./train_cpu --train-data-path $data --valid-data-path $data --num-layers 2 --hidden-size 32 --num-attention-heads 4 \
    --seq-length 16 $common --train-iters 3 --log-interval 1 > $B/train_paths.log 2>&1
./train_cpu --data-path $data --split 100,0,0 --num-layers 2 --hidden-size 32 --num-attention-heads 4 \
    --seq-length 16 $common --train-iters 3 --log-interval 1 > $B/train_split.log 2>&1
losses() { grep -o 'lm loss: [^ ]*' "$1"; }
if [ "$(losses $B/train_paths.log | wc -l)" -eq 3 ] && diff <(losses $B/train_paths.log) <(losses $B/train_split.log) > /dev/null &&
   [ -n "$(value_of $B/train_paths.log validation)" ]; then
    ok "--train-data-path P trains as --data-path P --split 100,0,0, and --valid-data-path is evaluated at the end"
else bad "training from per-split paths" "$(diff <(losses $B/train_paths.log) <(losses $B/train_split.log) | head -3; grep -m1 error $B/train_paths.log)"; fi

# ---- the checkpoint's shape is the default; a flag that differs is refused, as always
./train_cpu --data-path $data --load $B/ck --save $B/ft --finetune $common --train-iters 2 --log-interval 1 > $B/finetune.log 2>&1
if [ $? -eq 0 ] && grep -q "weights only: --finetune" $B/finetune.log; then
    ok "--finetune --load with no model flag trains on from the checkpoint's shape"
else bad "--finetune without model flags" "$(grep -m1 error $B/finetune.log)"; fi

# ---- a resumed run's summary counts the steps it made (it once divided by all iterations)
./train_cpu --data-path $data --split 90,8,2 --load $B/ck --save $B/resumed $common --train-iters 16 --log-interval 4 --override-opt-param-scheduler \
    > $B/resumed.log 2>&1
summary=$(grep '^summary: ' $B/resumed.log)
per=$(echo "$summary" | sed -n 's/.*: \([0-9.]*\) tokens\/s, \([0-9.]*\) ms per iteration;.*/\1 \2/p')
# 4 steps of 4 x 16 tokens: ms per iteration = 1000 x 256 tokens / (tokens/s) / 4, to the printed 0.1 ms
if echo "$summary" | grep -q '^summary: 4 iterations (13 to 16, resumed), 16 samples (256 tokens)' &&
   awk -v tps="${per% *}" -v ms="${per#* }" 'BEGIN { d = 64000 / tps - ms; exit !(tps > 0 && d < 0.051 && d > -0.051) }'; then
    ok "a run resumed at iteration 12 for 4 more: 'summary: 4 iterations (13 to 16, resumed)', ms per iteration over those 4"
else bad "the resumed run's summary" "$summary"; fi

# ---- refusals: one line naming the flag, exit status 2
expect_refusal() {  # label needle flags...
    local label=$1 needle=$2; shift 2
    ./train_cpu "$@" > $B/refusal.log 2>&1
    local status=$?
    if [ $status -eq 2 ] && [ "$(grep -c '^error' $B/refusal.log)" -eq 1 ] && grep -q -- "$needle" $B/refusal.log; then
        ok "refused: $label"
    else bad "refusal: $label" "status $status: $(head -c 300 $B/refusal.log)"; fi
}
mkdir -p $B/empty
expect_refusal "a model flag differing from the checkpoint's" "has --hidden-size 32, this run 64" \
    --skip-train --load $B/ck --data-path $data $common --hidden-size 64
expect_refusal "--skip-train without --load" "--skip-train needs --load" --skip-train --data-path $data
expect_refusal "--skip-train with --save" "drop --save" --skip-train --load $B/ck --data-path $data --save $B/x
expect_refusal "--skip-train with nothing to do" "nothing to do" --skip-train --load $B/ck
expect_refusal "--skip-train from a directory without a checkpoint" "no checkpoint there" \
    --skip-train --load $B/empty --data-path $data
expect_refusal "--data-path with --valid-data-path" "not both" --data-path $data --valid-data-path $data --train-iters 1
expect_refusal "training without --train-data-path" "--train-data-path is required" --valid-data-path $data --train-iters 1
expect_refusal "a --valid-data-path blend without weights for every prefix" "--valid-data-path: 3 values" \
    --skip-train --load $B/ck --valid-data-path 0.5 $data $data
expect_refusal "a tokenizer whose vocabulary is not the checkpoint's" "--vocab-file tests/data/gpt2/encoder.json has 50257 tokens, but the model's vocabulary (--load's checkpoint) has 257" \
    --skip-train --load $B/ck --data-path $data --tokenizer-type GPT2BPETokenizer \
    --vocab-file tests/data/gpt2/encoder.json --merge-file tests/data/gpt2/vocab.bpe
[ -z "$(ls $B/empty)" ] && [ ! -e $B/x ] && ok "the refused runs wrote nothing" || bad "refused runs" "$(ls $B/empty $B/x 2>&1)"
