#!/usr/bin/env bash
# tests/test_cli.sh DATA_PREFIX — the trainer as a user runs it: bad input ends with one
# clear line naming the flag or file and exit status 2 before anything is allocated; two
# runs with the same seed print the same log lines (timings aside).
set -u
data=${1:?usage: test_cli.sh DATA_PREFIX}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ok() { echo "PASS $1"; }
bad() { echo "FAIL $1: $2"; }

base="--data-path $data --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --train-iters 2 --eval-iters 1 --split 90,10,0"

# expect_error NAME NEEDLE ARGS...: exit 2, exactly one line on stderr, containing NEEDLE
expect_error() {
    local name=$1 needle=$2; shift 2
    ./train_cpu "$@" > "$tmp/out" 2> "$tmp/err"
    local status=$? lines
    lines=$(wc -l < "$tmp/err")
    if [ $status -eq 2 ] && [ "$lines" -eq 1 ] && grep -qF -- "$needle" "$tmp/err"; then ok "$name"
    else bad "$name" "status $status, $lines stderr line(s): $(head -c 300 "$tmp/err")"; fi
}

expect_error "unknown flag" "--bogus" $base --bogus 3
expect_error "missing value at the end" "--lr" $base --lr
expect_error "flag where a value belongs" "--lr" $base --lr --seed 3
expect_error "value that is not a number" "--hidden-size" $base --hidden-size wide
expect_error "hidden size not divisible by heads" "--num-attention-heads" $base --hidden-size 30 --num-attention-heads 4
expect_error "global batch not divisible by micro batch" "--global-batch-size" $base --micro-batch-size 4 --global-batch-size 10
expect_error "seq-length above max-position-embeddings" "--max-position-embeddings" $base --max-position-embeddings 8
# the padded vocabulary once wrapped to 0 ("vocabulary padded to 0", NaN losses, exit 0)
expect_error "a padded vocabulary past 2^31 - 1" "--make-vocab-size-divisible-by 2 x --tensor-model-parallel-size 1 pads the vocabulary of 2147483647 to 2147483648" \
    $base --vocab-size 2147483647 --make-vocab-size-divisible-by 2
expect_error "a padded vocabulary past 2^31 - 1 (the dry run of TP 2)" "--make-vocab-size-divisible-by 1073741824 x --tensor-model-parallel-size 2 pads the vocabulary of 257 to 2147483648" \
    $base --vocab-size 257 --make-vocab-size-divisible-by 1073741824 --tensor-model-parallel-size 2 --world-size 2 --dry-run
expect_error "neither --train-iters nor --train-samples" "--train-samples" --data-path "$data"
expect_error "both --train-iters and --train-samples" "--train-samples" $base --train-samples 100
expect_error "--train-iters 0 without --save has its own message" "the length of training is 0" \
    --data-path "$data" --train-iters 0
expect_error "unknown lr decay style" "--lr-decay-style" $base --lr-decay-style exponential
expect_error "--attention-backend flash at a head size the fused kernels do not take (8)" "--attention-backend flash" \
    $base --attention-backend flash
expect_error "unknown attention backend" "--attention-backend" $base --attention-backend fast
expect_error "a negative bucket size" "--ddp-bucket-size must be at least 0, got -5" $base --ddp-bucket-size -5
# issue 45, item 12: a warm-up fraction past 1 overflowed the warm-up's step count (lr 0 on every
# step, exit 0); a loss scale below the least float became 0, the dynamic scaler's value
expect_error "--lr-warmup-fraction past 1" "--lr-warmup-fraction 9.22337e+18: a fraction of the decay length, expected 0 to 1" \
    $base --lr-warmup-fraction 9223372036854775808
expect_error "--loss-scale below the least float" "--loss-scale 1e-320: too small for a float" $base --fp16 --loss-scale 1e-320

# argparse's --flag=value form (Megatron-LM's scripts may type it): the same run as --flag value
timing='s/^ \[[^]]*\]/ [_]/; s/(elapsed time per iteration \(ms\)|tokens per second|ETA): [0-9.:]+/\1: _/g'
./train_cpu $base --lr 2e-4 --seed 5 --log-interval 1 2>&1 | grep ' iteration ' | sed -E "$timing" > "$tmp/spaced"
./train_cpu $base --lr=2e-4 --seed=5 --log-interval=1 2>&1 | grep ' iteration ' | sed -E "$timing" > "$tmp/equals"
if [ "$(grep -c 'learning rate' "$tmp/spaced")" -eq 2 ] && cmp -s "$tmp/spaced" "$tmp/equals"; then
    ok "--lr=2e-4 --seed=5 --log-interval=1: the log lines of --lr 2e-4 --seed 5 --log-interval 1"
else bad "--flag=value" "$(diff "$tmp/spaced" "$tmp/equals" | head -4)"; fi
expect_error "--flag=value of an unknown flag: did you mean" "unknown flag '--lrr', did you mean --lr?" $base --lrr=1e-4

# a step the loss scaler skips (its gradients overflow at scale 3e38: the first two) has no grad
# norm: the field is left out, as Megatron-LM does (it printed 'grad norm: -nan')
./train_cpu $base --train-iters 6 --fp16 --initial-loss-scale 3e38 --log-interval 1 > "$tmp/skip" 2>&1
if grep -q 'number of skipped iterations:   1' "$tmp/skip" && ! grep -qi 'nan |' "$tmp/skip" &&
        [ "$(grep -c 'grad norm' "$tmp/skip")" -eq "$(grep -c 'number of skipped iterations:   0' "$tmp/skip")" ]; then
    ok "a skipped fp16 step's log line has no grad norm field ($(grep -c 'grad norm' "$tmp/skip") lines with one)"
else bad "skipped step's grad norm" "$(grep -o 'loss scale.*nan iterations: *[0-9]*' "$tmp/skip" | head -3)"; fi

# Megatron's flags that gridgpt lacks (megatron_flags.h): one asking for what gridgpt always does is
# accepted with a start-up note; with a value asking for more it is refused, naming what Megatron
# would do; a flag of theirs gridgpt lacks is refused as not in gridgpt; a typo of any flag gets
# the flag it is close to; anything else stays a plain unknown flag
megatron_note() {  # NAME FLAG...: the dry run goes on, with "note: Megatron's FLAG ... accepted" on stdout
    local name=$1; shift
    ./train_cpu --dry-run --vocab-size 256 --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 "$@" \
        > "$tmp/out" 2> "$tmp/err"
    local status=$?
    if [ $status -eq 0 ] && grep -qF -- "note: Megatron's $* accepted: " "$tmp/out"; then ok "$name"
    else bad "$name" "status $status: $(grep -m1 note "$tmp/out") $(head -c 300 "$tmp/err")"; fi
}
megatron_note "--use-distributed-optimizer accepted: gridgpt is always ZeRO-1" --use-distributed-optimizer
megatron_note "--distributed-backend nccl accepted (the CPU build's collectives are MPI's)" --distributed-backend nccl
megatron_note "--no-masked-softmax-fusion accepted" --no-masked-softmax-fusion
megatron_note "--no-bias-gelu-fusion accepted" --no-bias-gelu-fusion
megatron_note "--use-mcore-models accepted" --use-mcore-models
megatron_note "--num-workers 4 accepted: the loader has no workers" --num-workers 4
megatron_note "--log-validation-ppl-to-tensorboard accepted" --log-validation-ppl-to-tensorboard
megatron_note "--exit-signal-handler accepted: gridgpt saves and exits on SIGTERM" --exit-signal-handler
megatron_note "--kv-channels 8 accepted: the head size hidden / heads" --kv-channels 8
megatron_note "--attention-backend fused (Megatron's choice) accepted as auto" --attention-backend fused
megatron_note "--tokenizer-type NullTokenizer accepted: the data's ids as they are" --tokenizer-type NullTokenizer
grep -q "^note: Megatron's --distributed-timeout-minutes 3 accepted: taken as --watchdog-timeout" \
    <(./train_cpu --dry-run --vocab-size 256 --distributed-timeout-minutes 3 2>&1) && ok "--distributed-timeout-minutes accepted as --watchdog-timeout" ||
    bad "--distributed-timeout-minutes" "no note"
expect_error "--attention-dropout 1 refused: dropout keeps a fraction below 1" \
    "--attention-dropout 1: a fraction below 1" $base --attention-dropout 1
expect_error "--hidden-dropout -0.1 refused" "--hidden-dropout must be at least 0, got -0.1" $base --hidden-dropout -0.1
expect_error "--distributed-backend gloo refused" "--distributed-backend gloo: not in gridgpt: Gloo" $base --distributed-backend gloo
expect_error "--expert-model-parallel-size 2 of a dense model refused: no experts to split" \
    "--expert-model-parallel-size 2 without --num-experts: a dense model has no experts to split" $base --expert-model-parallel-size 2
expect_error "a family of Megatron flags (--moe-*) refused as not in gridgpt" \
    "--moe-grouped-gemm: not in gridgpt: mixture of experts: an option of Megatron-LM's MoE" $base --moe-grouped-gemm
expect_error "--rotary-interleaved refused, naming the convention gridgpt has" \
    "--rotary-interleaved: not in gridgpt: interleaved rotary pairs: Megatron-LM would turn dims (2i, 2i + 1) together" $base --rotary-interleaved
# Llama's architecture flags: Megatron-LM's refusals, and a qualifier without what it qualifies
expect_error "query groups that do not divide the heads" "--num-attention-heads 2 is not divisible by --num-query-groups 3" \
    $base --group-query-attention --num-query-groups 3
expect_error "query groups that the tensor-parallel size does not divide" \
    "--num-query-groups 1 is not divisible by --tensor-model-parallel-size 2" --dry-run --world-size 2 --vocab-size 256 \
    --num-layers 2 --hidden-size 16 --num-attention-heads 2 --group-query-attention --num-query-groups 1 --tensor-model-parallel-size 2
expect_error "--num-query-groups without --group-query-attention" "--num-query-groups goes with --group-query-attention" \
    $base --num-query-groups 1
expect_error "--rotary-base without rope" "--rotary-base goes with --position-embedding-type rope" $base --rotary-base 500000
expect_error "rotary dims that are not even" "--rotary-percent 0.2 of a head of 8 dims rotates 1 of them" $base \
    --position-embedding-type rope --rotary-percent 0.2
expect_error "another epsilon for LayerNorm" "--norm-epsilon 1e-06 with LayerNorm: gridgpt's LayerNorm adds 1e-5" $base \
    --norm-epsilon 1e-6
expect_error "--swiglu on a model too narrow for Megatron-LM's default width" "--swiglu at --hidden-size 16: Megatron-LM's MLP width" \
    $base --swiglu
expect_error "--add-qkv-bias without --disable-bias-linear (every linear layer has its bias)" \
    "--add-qkv-bias goes with --disable-bias-linear (without it, it would change nothing)" $base --add-qkv-bias
# --disable-bias-linear --add-qkv-bias (Qwen's attention): the QKV's bias alone, [3 x 16] in each of the 2 layers
./train_cpu --dry-run --vocab-size 256 --num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 16 \
    --disable-bias-linear > "$tmp/nobias" 2>&1
./train_cpu --dry-run --vocab-size 256 --num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 16 \
    --disable-bias-linear --add-qkv-bias > "$tmp/qkvbias" 2>&1
params() { grep -o '[0-9][0-9]* parameters' "$1" | head -1 | cut -d' ' -f1; }
if [ -n "$(params "$tmp/qkvbias")" ] && [ $(( $(params "$tmp/qkvbias") - $(params "$tmp/nobias") )) -eq 96 ]; then
    ok "--disable-bias-linear --add-qkv-bias: 96 parameters more than --disable-bias-linear alone, the QKV biases of 2 layers"
else bad "--add-qkv-bias" "$(params "$tmp/nobias") vs $(params "$tmp/qkvbias"): $(tail -2 "$tmp/qkvbias")"; fi
megatron_note "--use-rotary-position-embeddings accepted as --position-embedding-type rope" --use-rotary-position-embeddings
expect_error "--kv-channels other than hidden / heads refused" "--kv-channels 16: not in gridgpt: a head size other than --hidden-size 16 / --num-attention-heads 2" \
    $base --kv-channels 16
expect_error "every refused flag in one line" "3 flags refused: --use-rope-scaling (rotary frequency scaling); --moe-grouped-gemm (mixture of experts); unknown flag '--bogus-flag-here'" \
    $base --use-rope-scaling --moe-grouped-gemm --bogus-flag-here
expect_error "a typo of gridgpt's flag: did you mean" "unknown flag '--hiden-size', did you mean --hidden-size?" $base --hiden-size 16
expect_error "a typo of a Megatron flag: did you mean" "unknown flag '--use-distributed-optimiser', did you mean --use-distributed-optimizer?" \
    $base --use-distributed-optimiser
expect_error "a far-off unknown flag is a plain unknown flag" "unknown flag '--frobnicate' (see --help)" $base --frobnicate 3

# how the DP gradients are reduced is said at start-up: nothing at DP 1, one reduce-scatter, or
# the overlap's buckets (here one of the layers and the embedding's)
startup_words() {  # LINE-START RANKS FLAGS...: the two words after the start-up line's first two
    mpirun --oversubscribe --bind-to none -np $2 ./train_cpu $base --train-iters 1 --eval-iters 0 "${@:3}" 2>&1 |
        grep -m1 "^$1: " | cut -d' ' -f3-4; }
reduce_line() { startup_words 'gradient reduction' "$@"; }
lines="$(reduce_line 1 --overlap-grad-reduce)|$(reduce_line 2)|$(reduce_line 2 --overlap-grad-reduce)"
if [ "$lines" = "none at|one reduce-scatter|2 bucket(s)" ]; then
    ok "the gradient-reduction line: none at DP 1, the reduce-scatter at DP 2, the overlap's 2 buckets with --overlap-grad-reduce"
else bad "the gradient-reduction line" "$lines"; fi

# and how the updated parameters are gathered: nothing at DP 1, one all-gather, or the buckets
gather_line() { startup_words 'parameter all-gather' "$@"; }
lines="$(gather_line 1 --overlap-param-gather)|$(gather_line 2)|$(gather_line 2 --overlap-param-gather)"
if [ "$lines" = "none at|one all-gather|2 bucket(s)" ]; then
    ok "the parameter all-gather line: none at DP 1, the all-gather at DP 2, the 2 buckets with --overlap-param-gather"
else bad "the parameter all-gather line" "$lines"; fi

# where the pipeline's exchanges run is said at start-up when there is a pipeline: on the CPU
# build MPI waits for each, with --no-overlap-p2p-communication or without (the GPU build's
# two lines: tests/test_emu_train.sh)
exchange_line() { mpirun --oversubscribe --bind-to none -np $1 ./train_cpu $base --train-iters 1 --eval-iters 0 \
    --num-layers 2 "${@:2}" 2>&1 | grep -c '^pipeline exchanges: MPI, each waited for'; }
lines="$(exchange_line 1)|$(exchange_line 2 --pipeline-model-parallel-size 2)|\
$(exchange_line 2 --pipeline-model-parallel-size 2 --no-overlap-p2p-communication)"
if [ "$lines" = "0|1|1" ]; then ok "the pipeline-exchange line: none at PP 1; at PP 2 MPI's, with or without --no-overlap-p2p-communication"
else bad "the pipeline-exchange line" "$lines"; fi

# which attention runs is said at start-up: the CPU build has one (the C reference); its dry
# run of the GPU build says which of the GPU's the flag, the head size and (auto) the cost
# model's estimates choose (tests/test_plan.sh: auto's choices)
attention_line() { ./train_cpu "$@" 2>&1 | grep -m1 '^attention: ' | cut -d' ' -f2-3; }
plan="--num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --vocab-size 257 --dry-run --dry-run-build gpu"
lines="$(attention_line $base --train-iters 1 --eval-iters 0 --attention-backend flash --hidden-size 128)|\
$(attention_line $plan)|$(attention_line $plan --hidden-size 128)|$(attention_line $plan --hidden-size 128 --attention-backend unfused)"
if [ "$lines" = "the C|unfused, cuBLAS|fused, flash|unfused, cuBLAS" ]; then
    ok "the attention line: the C reference on the CPU build (any backend); the GPU plan: auto is unfused at head size 8, fused at 64, unless unfused is asked"
else bad "the attention line" "$lines"; fi
expect_error "missing --data-path" "--data-path" --train-iters 2
expect_error "data file missing" "$tmp/nothing" $base --data-path "$tmp/nothing"
printf 'not an index at all' > "$tmp/junk.idx"; printf 'xx' > "$tmp/junk.bin"
expect_error "data file that is not a Megatron index" "$tmp/junk.idx" $base --data-path "$tmp/junk"
expect_error "token ids above --vocab-size, named with file and document" "corpus_text_document.bin: document 0, token 34: id 112 is outside the vocabulary [0, 100) (--vocab-size 100)" $base --vocab-size 100
expect_error "ramp-up not divisible by micro batch" "--rampup-batch-size" --data-path "$data" --train-samples 64 \
    --micro-batch-size 4 --global-batch-size 16 --rampup-batch-size 6 2 32

# activation recomputation: Megatron-LM's combinations that make no sense, one line naming the flags
full="--recompute-granularity full"
expect_error "--recompute-method without --recompute-granularity" "--recompute-method needs --recompute-granularity full" \
    $base --recompute-method uniform
expect_error "--recompute-num-layers without --recompute-granularity" "--recompute-num-layers needs --recompute-granularity full" \
    $base --recompute-num-layers 1
expect_error "--recompute-granularity full without a method" "--recompute-granularity full needs --recompute-method" $base $full
expect_error "selective with a recompute method (Megatron-LM's refusal)" \
    "--recompute-method is not supported with --recompute-granularity selective" \
    $base --recompute-granularity selective --recompute-method uniform
expect_error "selective with --recompute-num-layers" "--recompute-num-layers needs --recompute-granularity full" \
    $base --recompute-activations --recompute-num-layers 1
expect_error "--recompute-activations (selective) with --recompute-granularity full, where Megatron-LM overrides quietly" \
    "--recompute-activations is --recompute-granularity selective: it cannot go with --recompute-granularity full" \
    $base --recompute-activations $full --recompute-method uniform
expect_error "--checkpoint-activations (full) with --recompute-activations (selective)" \
    "--checkpoint-activations is --recompute-granularity full --recompute-method uniform: it cannot go" \
    $base --checkpoint-activations --recompute-activations
expect_error "a recompute method that does not exist" "--recompute-method must be one of none | uniform | block" \
    $base $full --recompute-method chunked
expect_error "--recompute-num-layers below 1" "--recompute-num-layers must be at least 1" $base --checkpoint-activations --recompute-num-layers 0
expect_error "--recompute-num-layers beyond the stage's layers" "--recompute-num-layers 2 is more layers than any pipeline stage holds (the largest: 1 of" \
    $base $full --recompute-method block --recompute-num-layers 2

# sequence parallelism: without tensor parallelism there is nothing to split over, and Megatron-LM
# HEAD turns it off with a warning: gridgpt too, with a note, and trains the same steps as without
# it (tests/test_megatron_flags.sh); a sequence the tensor ranks do not divide is refused in one
# line, planned for 2 ranks by --dry-run, which refuses a layout with the trainer's own line
expect_error "--sequence-parallel with a sequence TP does not divide" \
    "--seq-length 15 is not divisible by --tensor-model-parallel-size 2: --sequence-parallel splits each sequence" \
    --dry-run --world-size 2 --vocab-size 257 --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 15 \
    --tensor-model-parallel-size 2 --sequence-parallel
expect_error "--checkpoint-activations with the block method" "--checkpoint-activations is --recompute-granularity full --recompute-method uniform" \
    $base --checkpoint-activations --recompute-method block

# interleaved 1F1B: Megatron-LM's refusals, one line each (a dry run of 2 ranks at PP 2: the flags
# are checked as the trainer checks them, and no ranks are needed)
pp2="--dry-run --world-size 2 --vocab-size 257 --num-layers 4 --hidden-size 16 --num-attention-heads 2 --seq-length 16
     --pipeline-model-parallel-size 2 --micro-batch-size 1 --global-batch-size 4"
N="--num-layers-per-virtual-pipeline-stage"
expect_error "interleaving: both of its flags" "give --num-layers-per-virtual-pipeline-stage or --num-virtual-stages-per-pipeline-rank, not both" \
    $pp2 $N 1 --num-virtual-stages-per-pipeline-rank 2
expect_error "interleaving without a pipeline" "--num-layers-per-virtual-pipeline-stage: the interleaved schedule needs --pipeline-model-parallel-size > 1" \
    $pp2 $N 1 --pipeline-model-parallel-size 1 --world-size 1
expect_error "interleaving: N that does not divide a stage's layers" "--num-layers-per-virtual-pipeline-stage 3 does not divide the 4 layers of each pipeline stage (--num-layers 8 over --pipeline-model-parallel-size 2)" \
    $pp2 --num-layers 8 $N 3
expect_error "interleaving: N with uneven stages names the flag for them" "--num-layers-per-virtual-pipeline-stage needs stages of equal layers, but stage 1 holds 4 and stage 0 2: uneven stages take --num-virtual-stages-per-pipeline-rank" \
    $pp2 --num-layers 6 --decoder-first-pipeline-num-layers 2 $N 1
expect_error "interleaving: v that does not divide an uneven stage's layers" "--num-virtual-stages-per-pipeline-rank 2: stage 0's 3 layer(s) do not split into 2 model chunks" \
    $pp2 --num-layers 6 --decoder-first-pipeline-num-layers 3 --num-virtual-stages-per-pipeline-rank 2
expect_error "interleaving: a stage with no layers" "--num-virtual-stages-per-pipeline-rank 2: stage 1's 0 layer(s) do not split" \
    $pp2 --pipeline-model-parallel-size 3 --world-size 3 --decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 2 \
    --num-virtual-stages-per-pipeline-rank 2
expect_error "interleaving: a last group of micro-batches smaller than PP (Megatron-LM's refusal)" "--global-batch-size 6 makes 3 micro-batches per pipeline (micro-batch 2 x data-parallel size 1): taken 2 at a time per model chunk (--microbatch-group-size-per-virtual-pipeline-stage, PP by default), the last group holds 1, fewer than --pipeline-model-parallel-size 2, which Megatron-LM refuses (the first stage would wait for its own output); group sizes that take 3: 3" \
    $pp2 --micro-batch-size 2 --global-batch-size 6 $N 1
# --microbatch-group-size-per-virtual-pipeline-stage G (Megatron-LM's): PP <= G <= M, a last group of PP or more
G="--microbatch-group-size-per-virtual-pipeline-stage"
pp4="${pp2/--world-size 2/--world-size 4} --num-layers 8 --pipeline-model-parallel-size 4"
expect_error "interleaving: 9 micro-batches at PP 4 in groups of PP (Megatron-LM refuses it too)" "--global-batch-size 9 makes 9 micro-batches per pipeline (micro-batch 1 x data-parallel size 1): taken 4 at a time per model chunk ($G, PP by default), the last group holds 1, fewer than --pipeline-model-parallel-size 4" \
    $pp4 --global-batch-size 9 $N 1
if ./train_cpu $pp4 --global-batch-size 9 $N 1 $G 9 > "$tmp/out" 2>&1 && grep -q "^dry-run: world 4 TP 1 PP 4 DP 1 MBS 1 GBS 9 VPP 2" "$tmp/out"; then
    ok "interleaving: 9 micro-batches at PP 4 run with $G 9"
else bad "9 micro-batches at PP 4 with $G 9" "$(tail -2 "$tmp/out")"; fi
expect_error "$G below PP" "$G 3 is less than --pipeline-model-parallel-size 4" $pp4 --global-batch-size 8 $N 1 $G 3
expect_error "$G above the micro-batches" "--global-batch-size 4 makes 4 micro-batches per pipeline (micro-batch 1 x data-parallel size 1), fewer than $G 5" \
    $pp2 $N 1 $G 5
expect_error "$G on a ramp batch it does not take" "--rampup-batch-size: batch size 3 on the ramp makes 3 micro-batches per pipeline" \
    $pp2 --global-batch-size 8 --rampup-batch-size 3 5 100 --train-samples 1000 $N 1 $G 4
expect_error "$G without interleaving" "$G goes with the interleaved schedule" $pp2 $G 2
# a last group of PP or more but fewer than G runs, as in Megatron-LM (9 micro-batches in groups of 5:
# a last group of 4 at PP 4); the last stage plans the head's logits twice (its forwards run ahead)
if ./train_cpu $pp4 --global-batch-size 9 $N 1 $G 5 > "$tmp/out" 2>&1 && grep -q "^dry-run: world 4 TP 1 PP 4 DP 1 MBS 1 GBS 9 VPP 2" "$tmp/out"; then
    ok "interleaving: 9 micro-batches at PP 4 run with $G 5 (a last group of 4, as Megatron-LM runs it)"
else bad "a last group of PP or more but fewer than G" "$(tail -2 "$tmp/out")"; fi
# --recompute-modules (Megatron-LM's): core_attn is gridgpt's selective recomputation; the rest refused by name
expect_error "--recompute-modules without selective" "--recompute-modules goes with --recompute-granularity selective" \
    $pp2 --recompute-modules core_attn
expect_error "--recompute-modules: a Megatron-LM module gridgpt does not have" "--recompute-modules mlp: not in gridgpt, whose selective recomputation is the attention core alone" \
    $pp2 --recompute-granularity selective --recompute-modules core_attn mlp
expect_error "--recompute-modules: a name Megatron-LM does not know" "--recompute-modules attention: not a module Megatron-LM recomputes (its choices: core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts, mhc, gdn, gdn_norm_out)" \
    $pp2 --recompute-activations --recompute-modules attention
for m in moe_act layernorm mla_up_proj moe shared_experts mhc gdn gdn_norm_out; do
    ./train_cpu $pp2 --recompute-granularity selective --recompute-modules $m > /dev/null 2> "$tmp/err"
    grep -qF -- "--recompute-modules $m: not in gridgpt" "$tmp/err" || bad "--recompute-modules $m refused by name" "$(head -c 200 "$tmp/err")"
done
ok "--recompute-modules: each other module Megatron-LM recomputes refused by name (moe_act ... gdn_norm_out)"
plan_of() { ./train_cpu $pp2 --dry-run-build gpu "$@" 2>&1 | grep -E '^ *planned|^dry-run:'; }
if [ "$(plan_of --recompute-granularity selective --recompute-modules core_attn)" = "$(plan_of --recompute-granularity selective)" ] &&
   [ "$(plan_of --recompute-granularity selective --recompute-modules core_attn)" != "$(plan_of)" ]; then
    ok "--recompute-modules core_attn plans what --recompute-granularity selective plans (and not what no recomputation does)"
else bad "--recompute-modules core_attn's plan" "$(plan_of --recompute-modules core_attn --recompute-granularity selective | head -2)"; fi
expect_error "interleaving: a ramp-up batch whose micro-batches are not a multiple of PP" "--rampup-batch-size: batch size 5 on the ramp makes 5 micro-batches per pipeline" \
    $pp2 --global-batch-size 8 --rampup-batch-size 2 3 100 --train-samples 1000 $N 1
expect_error "interleaving: --recompute-num-layers counts a model chunk's layers" "--recompute-num-layers 2 is more layers than any pipeline stage holds (the largest: 1 of --num-layers 4 over --pipeline-model-parallel-size 2, in 2 model chunks a stage)" \
    $pp2 --checkpoint-activations --recompute-num-layers 2 $N 1

if ./train_cpu --help > "$tmp/help" 2>&1 && grep -q -- "--num-layers" "$tmp/help"; then ok "--help lists the flags"
else bad "--help lists the flags" "$(head -3 "$tmp/help")"; fi

# --recompute-modules core_attn trains as --recompute-granularity selective does, bit for bit
rm_run="--data-path $data --num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 32 --micro-batch-size 2 --global-batch-size 4 --train-iters 6 --log-interval 1 --eval-iters 0 --split 90,10,0 --lr 1e-3 --recompute-granularity selective"
./train_cpu $rm_run > "$tmp/selective" 2>&1; ./train_cpu $rm_run --recompute-modules core_attn > "$tmp/modules" 2>&1
if [ "$(grep -c 'lm loss' "$tmp/selective")" -ge 6 ] && [ "$(grep -oE '(lm loss|grad norm): [^|]*' "$tmp/selective")" = "$(grep -oE '(lm loss|grad norm): [^|]*' "$tmp/modules")" ] &&
   grep -q "activation recomputation: selective, each layer's attention probabilities again" "$tmp/modules"; then
    ok "--recompute-modules core_attn: the losses and grad norms of --recompute-granularity selective, bit for bit"
else bad "--recompute-modules core_attn's run" "$(grep -m2 'lm loss' "$tmp/modules") vs $(grep -m2 'lm loss' "$tmp/selective")"; fi

# same seed, same log lines (everything but the timing fields)
strip_timing() { grep -E '^ \[[^]]*\] iteration|lm loss value' "$1" | sed -E 's/^ \[[^]]*\]//; s/elapsed time per iteration \(ms\): [0-9.]+//; s/ throughput per GPU \(TFLOP\/s\/GPU\): [0-9.]+ \|//; s/tokens per second: [0-9]+//; s/ETA: [0-9:]+//'; }
run="--data-path $data --num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 32 --micro-batch-size 2 --global-batch-size 4 --train-iters 8 --log-interval 1 --eval-interval 4 --eval-iters 2 --split 90,10,0 --lr 1e-3"
./train_cpu $run > "$tmp/a" 2>&1; ./train_cpu $run --log-throughput > "$tmp/b" 2>&1
if [ "$(strip_timing "$tmp/a" | wc -l)" -ge 8 ] && diff <(strip_timing "$tmp/a") <(strip_timing "$tmp/b") > /dev/null; then
    ok "two runs with the same seed print identical losses"
else bad "two runs with the same seed print identical losses" "$(diff <(strip_timing "$tmp/a") <(strip_timing "$tmp/b") | head -5; tail -3 "$tmp/a")"; fi
# Megatron-LM HEAD's log line (training.py's training_log), from its format strings: " [%Y-%m-%d
# %H:%M:%S] iteration {:8d}/{:8d} | consumed samples: {:12d} | elapsed time per iteration (ms):
# {:.1f} |", with --log-throughput " throughput per GPU (TFLOP/s/GPU): {:.1f} |", then " learning
# rate: {:.6E} | global batch size: {:5d} | lm loss: {:.6E} | loss scale: {:.1f} | grad norm:
# {:.3f} | number of skipped iterations: {:3d} | number of nan iterations: {:3d} |"; then
# gridgpt's own " tokens per second: N | ETA: H:MM:SS |"
E6='[0-9]\.[0-9]{6}E[+-][0-9]{2}'
head_line() {  # THROUGHPUT_FIELD: HEAD's line at iteration 8 of 8, 32 samples, batch 4
    echo "^ \[[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\] iteration ( {7}8)/( {7}8) \| consumed samples: ( {10}32) \|"\
"( elapsed time per iteration \(ms\): [0-9]+\.[0-9] \|)$1( learning rate: $E6 \| global batch size: ( {4}4) \|)"\
"( lm loss: $E6 \| loss scale: 1\.0 \| grad norm: [0-9]+\.[0-9]{3} \|)( number of skipped iterations: ( {2}0) \|)"\
"( number of nan iterations: ( {2}0) \|)( tokens per second: [0-9]+ \| ETA: [0-9]+:[0-9]{2}:[0-9]{2} \|)$"
}
if grep -qE "$(head_line '')" "$tmp/a" && grep -qE "$(head_line '( throughput per GPU \(TFLOP/s/GPU\): [0-9]+\.[0-9] \|)')" "$tmp/b"; then
    ok "the log line of Megatron-LM HEAD, field for field (the throughput with --log-throughput), then tokens per second and the ETA"
else bad "the log line of Megatron-LM HEAD" "$(grep iteration "$tmp/a" | tail -1; grep iteration "$tmp/b" | tail -1)"; fi
# HEAD evaluates at the last iteration in the loop, then at the end; it logs iteration 1 whatever
# --log-interval (here the run of the --flag=value check above, 2 iterations at interval 100)
if grep -qF " validation loss at iteration 8 | " "$tmp/a" && grep -qF " validation loss at iteration 8 on validation set | " "$tmp/a" &&
   grep -qE "^ \[[^]]*\] iteration +1/ +2 \|" "$tmp/spaced"; then
    ok "the last iteration's evaluation in the loop, then the end's; iteration 1 logged"
else bad "the last iteration's evaluation, iteration 1 logged" "$(grep 'validation loss' "$tmp/a"; head -2 "$tmp/spaced")"; fi

# sampling after training prints the prompt and the requested number of new tokens
./train_cpu $base --generate-tokens 40 --generate-prompt "The" --max-position-embeddings 64 --generate-ignore-eod > "$tmp/gen" 2>&1
sample=$(sed -n '/^---------- sample/,/^-------------------/p' "$tmp/gen" | sed '1d;$d')
if [ "${sample:0:3}" = "The" ] && [ "$(printf '%s' "$sample" | wc -c)" -ge 40 ]; then ok "sampling prints the prompt and new tokens"
else bad "sampling prints the prompt and new tokens" "$(tail -5 "$tmp/gen")"; fi

# blending: two weighted prefixes (the same corpus twice) train through Megatron's blending path
if ./train_cpu $base --data-path 0.3 "$data" 0.7 "$data" > "$tmp/blend" 2>&1 && grep -q "weight 0.3000" "$tmp/blend" && grep -qE '^ \[[^]]*\] iteration +2/' "$tmp/blend"; then
    ok "training on a weighted blend of two datasets"
else bad "training on a weighted blend of two datasets" "$(grep -m1 error "$tmp/blend")"; fi

# a pthread OpenBLAS under several OpenMP threads is named in one warning line; the OpenMP
# OpenBLAS that make links is silent
pthread_blas=$(ls /usr/lib/*/openblas-pthread/libopenblas.so.0 2>/dev/null | head -1)
if [ -z "$pthread_blas" ]; then echo "SKIP pthread OpenBLAS warning: no pthread OpenBLAS installed"
elif ! mpicc -std=gnu11 -O0 -fopenmp $(pkg-config --cflags openblas) -DUSE_BLAS train.c -o "$tmp/train_pthread" \
        "$pthread_blas" -lz -lm > "$tmp/build" 2>&1; then bad "pthread OpenBLAS warning" "build: $(head -3 "$tmp/build")"
else
    OMP_NUM_THREADS=2 "$tmp/train_pthread" $base > /dev/null 2> "$tmp/pthread.err"
    OMP_NUM_THREADS=2 ./train_cpu $base > /dev/null 2> "$tmp/openmp.err"
    if [ "$(grep -c 'warning: linked to the pthread OpenBLAS' "$tmp/pthread.err")" -eq 1 ] && [ ! -s "$tmp/openmp.err" ]; then
        ok "a pthread OpenBLAS with several OpenMP threads is named in one warning line (not the OpenMP one)"
    else bad "pthread OpenBLAS warning" "pthread: $(head -c 200 "$tmp/pthread.err") / openmp: $(head -c 200 "$tmp/openmp.err")"; fi
fi

# the right OpenBLAS kernels (blas_cores.h). The kernels this CPU should run, from /proc/cpuinfo
# (not from the trainer's __builtin_cpu_supports): the core OpenBLAS runs on the first CPUs of
# its widest vectors. GRIDGPT_TEST_GENERIC_BLAS=1 with OPENBLAS_CORETYPE=Prescott plays an
# OpenBLAS that fell back to its generic Prescott kernels by itself.
cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { [[ $cpu_flags == *" $1 "* ]]; }
if has avx512f && has avx512bw && has avx512vl && has avx512dq; then right=SkylakeX
elif has avx2 && has fma; then right=Haswell
elif has avx; then right=Sandybridge
else right=""; fi
if ! ldd ./train_cpu | grep -q libopenblas; then echo "SKIP OpenBLAS kernel choice: train_cpu is not linked to OpenBLAS"
else
    ./train_cpu $base > "$tmp/blas_plain" 2>&1
    if [ "$(grep -c '^BLAS: OpenBLAS' "$tmp/blas_plain")" -eq 1 ] && ! grep -q "restarted" "$tmp/blas_plain"; then
        ok "OpenBLAS's own choice of kernels is said in one line, with no restart ($(grep -m1 '^BLAS' "$tmp/blas_plain" | cut -d, -f2))"
    else bad "OpenBLAS's own choice in one line" "$(grep -E '^BLAS|warning' "$tmp/blas_plain" | head -3)"; fi
    GRIDGPT_TEST_GENERIC_BLAS=1 OPENBLAS_CORETYPE=Prescott ./train_cpu $base > "$tmp/blas_generic" 2>&1
    if [ -z "$right" ]; then
        expected="^BLAS: OpenBLAS [0-9.]*, Prescott kernels"
    else expected="^BLAS: OpenBLAS [0-9.]*, $right kernels: it found Prescott, .* OPENBLAS_CORETYPE=$right and restarted once"; fi
    if [ "$(grep -c '^BLAS' "$tmp/blas_generic")" -eq 1 ] && grep -qE "$expected" "$tmp/blas_generic" &&
       grep -qE '^ \[[^]]*\] iteration +2/' "$tmp/blas_generic"; then
        ok "generic Prescott kernels on this CPU: ${right:-kept (an SSE CPU)} chosen, the trainer restarted once and trained"
    else bad "generic Prescott kernels replaced" "expected $expected: $(grep -E '^BLAS|warning|error' "$tmp/blas_generic" | head -3)"; fi
    OPENBLAS_CORETYPE=Prescott ./train_cpu $base > "$tmp/blas_user" 2>&1
    if grep -q "^BLAS: OpenBLAS [0-9.]*, Prescott kernels, as OPENBLAS_CORETYPE=Prescott asks" "$tmp/blas_user" &&
       ! grep -q "restarted" "$tmp/blas_user"; then ok "a user's own OPENBLAS_CORETYPE is respected and said"
    else bad "a user's own OPENBLAS_CORETYPE is respected" "$(grep -E '^BLAS|warning' "$tmp/blas_user" | head -3)"; fi
    # under mpirun each rank restarts alone, before MPI starts; rank 0's line counts them
    mpirun --oversubscribe --bind-to none -np 2 -x GRIDGPT_TEST_GENERIC_BLAS=1 -x OPENBLAS_CORETYPE=Prescott \
        ./train_cpu $base > "$tmp/blas_mpi" 2>&1
    status=$?
    restarted=" \(the same on all 2 ranks, 2 of them restarted\)"
    [ -z "$right" ] && restarted=" \(the same on all 2 ranks, 0 of them restarted\)"
    if [ $status -eq 0 ] && [ "$(grep -c '^BLAS' "$tmp/blas_mpi")" -eq 1 ] && grep -qE "$expected.*$restarted\$" "$tmp/blas_mpi" &&
       grep -qE '^ \[[^]]*\] iteration +2/' "$tmp/blas_mpi"; then
        ok "under mpirun each of 2 ranks chose ${right:-its kernels} before MPI started, and the job trained"
    else bad "the kernel choice under mpirun" "status $status: $(grep -E '^BLAS|warning|error' "$tmp/blas_mpi" | head -4)"; fi
fi

# a rank whose kernels differ from rank 0's (a node of another CPU) is named in rank 0's line
if ldd ./train_cpu | grep -q libopenblas; then
    mpirun --oversubscribe --bind-to none -np 1 -x OPENBLAS_CORETYPE=Haswell ./train_cpu $base : \
        -np 1 -x OPENBLAS_CORETYPE=Prescott ./train_cpu $base > "$tmp/blas_mixed" 2>&1
    if grep -qE "^BLAS: OpenBLAS [0-9.]*, Haswell kernels, as OPENBLAS_CORETYPE=Haswell asks .*; rank 1 on $(hostname) runs Prescott kernels\$" "$tmp/blas_mixed"; then
        ok "a rank running other kernels than rank 0 is named in the BLAS line"
    else bad "a rank running other kernels" "$(grep -m1 -E '^BLAS|error' "$tmp/blas_mixed")"; fi
fi

# an empty valid split: no evaluation and one note (as Megatron), not an error
if ./train_cpu $base --split 100,0,0 > "$tmp/noval" 2>&1 && grep -q "^note: --split 100,0,0 leaves no validation documents" "$tmp/noval" &&
   ! grep -q "validation loss" "$tmp/noval"; then ok "an empty valid split skips evaluation with one note"
else bad "an empty valid split skips evaluation" "$(grep -m1 -E 'error|note' "$tmp/noval")"; fi

# docs/flags.md is generated from the field lists: the committed file must be what the
# trainer prints (make docs rewrites it)
if ./train_cpu --help-markdown 2>&1 | diff -q - docs/flags.md > /dev/null; then
    ok "docs/flags.md is ./train_cpu --help-markdown (every flag, its value, default, minimum and help)"
else bad "docs/flags.md differs from ./train_cpu --help-markdown (run make docs)" \
    "$(./train_cpu --help-markdown 2>&1 | diff - docs/flags.md | head -4 | tr '\n' ' ')"; fi

# numbers are read as numbers: beyond int, below a field's minimum
expect_error "an integer beyond int" "--hidden-size expects an integer up to 2147483647" $base --hidden-size 4294967328
expect_error "a value below the field's minimum" "--weight-decay must be at least 0" $base --weight-decay -1
expect_error "a list flag with too many values" "--data-path takes at most 512 values" $base --data-path $(seq 1 513)
expect_error "--train-samples whose iterations overflow int names that flag" \
    "--train-samples 9223372036854775807 at a global batch of 4 is 2305843009213693951 iterations" \
    --data-path "$data" --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --train-samples 9223372036854775807

# what a rank would allocate is checked against the memory before anything large is allocated
expect_error "activations beyond the memory, named before allocating" "the largest part, activations, grows with --micro-batch-size" \
    $base --seq-length 1000000
expect_error "parameters beyond the memory, named before allocating" "grows with --num-layers" $base --seq-length 4000 \
    --max-position-embeddings 99999999 --micro-batch-size 1
expect_error "a tensor table beyond the memory" "--num-layers 1000000000: the tensor table alone" $base --num-layers 1000000000
# ... and so is the sample index, before it is built: neither refusal leaves an index behind
expect_error "a micro-batch beyond the memory names --micro-batch-size, before any index is built" \
    "grows with --micro-batch-size" $base --micro-batch-size 1073741824 --data-cache-path "$tmp/index_cache"
expect_error "a sample index beyond the memory, named before it is built" \
    "the sample index would take 386.87 GiB of host memory" $base --train-iters 400000000 --global-batch-size 64 \
    --data-cache-path "$tmp/index_cache"
if [ -n "$(ls "$tmp/index_cache" 2>/dev/null)" ]; then bad "the refused runs built no sample index" "$(ls "$tmp/index_cache" | head -3)"
else ok "the refused runs built no sample index"; fi

# the memory a rank may take is the least of its share of the host's, the process limits
# (ulimit -v, ulimit -d) and the cgroup's limit (v1 or v2): a 6 GiB model under 1.5 GiB
big="$base --num-layers 8 --hidden-size 2048 --num-attention-heads 8"
(ulimit -v 1500000; expect_error "an address-space limit (ulimit -v) is the memory there is" \
    "but its address-space limit (ulimit -v, RLIMIT_AS) leaves" $big)
(ulimit -d 1500000; expect_error "a data limit (ulimit -d) is the memory there is" \
    "but its data limit (ulimit -d, RLIMIT_DATA) leaves" $big)
# a child of this shell's memory cgroup (v1's memory hierarchy or v2), limited to 1 GiB
cgroup_dir=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print "/sys/fs/cgroup/memory" $3; exit} $1 == "0" && $2 == "" {v2 = "/sys/fs/cgroup" $3}
                     END {if (v2) print v2}' /proc/self/cgroup | head -1)
cgroup_dir=${cgroup_dir%/}/gridgpt_test.$$
if mkdir "$cgroup_dir" 2>/dev/null; then
    limit_file=memory.limit_in_bytes; [ -e "$cgroup_dir/$limit_file" ] || limit_file=memory.max
    if echo 1073741824 > "$cgroup_dir/$limit_file" 2>/dev/null; then
        (echo $BASHPID > "$cgroup_dir/cgroup.procs" &&
         expect_error "the cgroup's memory limit is the memory there is" "but its share of the cgroup's memory limit leaves" $big)
    else echo "SKIP the cgroup's memory limit: $cgroup_dir/$limit_file cannot be written here"; fi
    for i in 1 2 3 4 5; do rmdir "$cgroup_dir" 2>/dev/null && break; sleep 0.2; done
else echo "SKIP the cgroup's memory limit: no memory cgroup can be made here (needs root and a writable cgroup file system)"; fi

# ---- fp16's loss scaler, run on fp32 by the CPU build
expect_error "--fp16 with --bf16" "give one of --fp16 and --bf16" $base --fp16 --bf16
expect_error "--loss-scale without --fp16" "--loss-scale 1024 goes with --fp16" $base --loss-scale 1024
# a static power-of-two scale changes no bit: every rounding scales with it
./train_cpu $run --save "$tmp/unscaled" > "$tmp/u" 2>&1; ./train_cpu $run --fp16 --loss-scale 1024 --save "$tmp/scaled" > "$tmp/s" 2>&1
without_scale() { strip_timing "$1" | sed -E 's/loss scale: [0-9.]+//'; }
if [ "$(grep -c 'loss scale: 1024.0 |' "$tmp/s")" -ge 8 ] && diff <(without_scale "$tmp/u") <(without_scale "$tmp/s") > /dev/null &&
   cmp -s "$tmp/unscaled/iter_0000008/tensors.bin" "$tmp/scaled/iter_0000008/tensors.bin"; then
    ok "--fp16 --loss-scale 1024 trains bit for bit as no scaling (losses, grad norms, weights, moments)"
else bad "--fp16 --loss-scale 1024 against no scaling" "$(diff <(without_scale "$tmp/u") <(without_scale "$tmp/s") | head -3)"; fi
# A forced overflow: a start of 2^127 overflows fp32 in the backward. Each step's (skipped,
# scale) must follow Megatron's rules (hysteresis 2, window 4) given which steps overflowed,
# and the run must show all three moves: a skip that keeps the scale, a halving, a doubling.
./train_cpu $run --train-iters 14 --fp16 --initial-loss-scale 170141183460469231731687303715884105728 \
    --hysteresis 2 --loss-scale-window 4 > "$tmp/of" 2>&1
verdict=$(grep -E '^ \[[^]]*\] iteration' "$tmp/of" | sed -E 's/.*loss scale: ([0-9.]+) .* skipped iterations: +([0-9]+) .*/\2 \1/' | awk '
    BEGIN { scale = 2^127; hyst = 2; growth = 0; kept = 0; halved = 0; doubled = 0 }
    { overflow = $1; before = scale
      if (overflow) { growth = 0; hyst--; if (hyst <= 0) scale = (scale / 2 > 1 ? scale / 2 : 1) }
      else if (++growth == 4) { growth = 0; hyst = 2; if (scale < 2^127) scale *= 2 }
      if ($2 + 0 != scale) { print "step " NR ": logged " $2 ", the rules give " scale; bad = 1; exit }
      kept += overflow && scale == before; halved += scale < before; doubled += scale > before }
    END { if (!bad) print (NR == 14 && kept && halved && doubled) ? "ok" : "steps " NR ", kept " kept ", halved " halved ", doubled " doubled }')
if [ "$verdict" = ok ]; then ok "a forced overflow: skipped steps, hysteresis, halving and doubling as Megatron's rules say"
else bad "the dynamic loss scale after a forced overflow" "$verdict"; fi
# the scaler's state is in the checkpoint: stopped at step 6 and resumed, steps 7-14 are the same bits
dyn="--fp16 --initial-loss-scale 65536 --hysteresis 1 --loss-scale-window 3"
./train_cpu $run --train-iters 14 $dyn > "$tmp/whole" 2>&1
./train_cpu $run --train-iters 14 $dyn --exit-interval 6 --save "$tmp/dyn" > /dev/null 2>&1
./train_cpu $run --train-iters 14 $dyn --load "$tmp/dyn" > "$tmp/resumed" 2>&1
after6() { strip_timing "$1" | awk '$2 + 0 > 6 || $2 ~ /^[0-9]+\/$/ && substr($2, 1, length($2) - 1) + 0 > 6'; }
# (65536 doubles at steps 3 and 6: the checkpoint holds 262144, not the flag's value)
if grep -q "^loss_scaler 262144 0 1$" "$tmp/dyn/iter_0000006/metadata.txt" && [ "$(after6 "$tmp/whole" | wc -l)" -eq 8 ] &&
   diff <(after6 "$tmp/whole") <(after6 "$tmp/resumed") > /dev/null; then
    ok "the dynamic loss scale is saved and restored: a resumed run continues bit for bit"
else bad "loss scaler state across a resume" "$(grep loss_scaler "$tmp/dyn/iter_0000006/metadata.txt"; diff <(after6 "$tmp/whole") <(after6 "$tmp/resumed") | head -3)"; fi
