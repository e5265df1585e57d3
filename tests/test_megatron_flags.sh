#!/usr/bin/env bash
# tests/test_megatron_flags.sh [DATA_PREFIX] — a Megatron-LM user's command line runs, and trains
# nothing else than it asks for without saying so: the training flags of two of Megatron-LM's own
# example scripts (tests/data/megatron_examples: GPT-3 175B, Llama 3 8B), given whole to
# `./train_cpu --dry-run --dry-run-build gpu` (their paths ours, the world size theirs). Every
# flag is gridgpt's, accepted as what gridgpt does (a start-up note each), or refused; one line
# names every refused flag at once, and the refusals must be exactly the honest ones below, each
# with its reason in docs/flags.md. Without them, the dry run plans the script's run (after the
# few checks of gridgpt's own that the scripts meet, each named here), and every Megatron-LM
# default the script leaves is gridgpt's too or named in a start-up note. Then each of issue 48's
# edge cases: Python's underscores in numbers, --sequence-parallel at TP 1, --zero-stage 0,
# BigScience's rows, the defaults' notes (with DATA_PREFIX: a short training too).
set -u
data=${1:-}
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ok() { echo "PASS $1"; }
bad() { echo "FAIL $1: $2"; }
examples=tests/data/megatron_examples

# flags FILE [DROP...]: the file's flags (its $PATHs ours), without the lines of the flags DROP
flags() {
    local file=$1; shift
    grep -v '^#' "$file" | while read -r flag rest; do
        for d in "$@"; do [ "$flag" = "$d" ] && continue 2; done
        echo "$flag $rest"
    done | sed -e "s|\$CHECKPOINT_PATH|$tmp/checkpoints|g" -e "s|\$TENSORBOARD_LOGS_PATH|$tmp/tensorboard|g" \
               -e "s|\$DATA_CACHE_PATH|$tmp/cache|g" -e "s|\$[A-Z_]*|$tmp/missing|g"
}

# dry WORLD FILE [DROP...] -- EXTRA...: the dry run of the file's flags; its status, stdout, stderr in $tmp
dry() {
    local world=$1 file=$2; shift 2
    local drop=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do drop+=("$1"); shift; done
    shift
    # shellcheck disable=SC2046
    ./train_cpu --dry-run --dry-run-build gpu --world-size "$world" $(flags "$file" "${drop[@]}") "$@" > "$tmp/out" 2> "$tmp/err"
    echo $? > "$tmp/status"
}

# the flags the error line refuses, one a line, in order ("N flags refused: A (why); B (why)" or one's line)
refused() {
    sed -e 's/^error: //' -e 's/^[0-9]* flags refused: //' "$tmp/err" | tr ';' '\n' | sed -e 's/^ *//' |
        grep -E '^--' | sed -E 's/^(--[^ :]*).*/\1/'
}

# in_docs FLAG: the flag has a row in docs/flags.md's Megatron section (its own, or its family's: `--fp8-*`)
in_docs() {
    local section
    section=$(sed -n '/^## Megatron-LM/,$p' docs/flags.md)
    grep -qF "| \`$1\` |" <<< "$section" && return 0
    local family
    for family in $(grep -oE '^\| `--[a-z0-9_-]*\*`' <<< "$section" | tr -d '|`* '); do
        case "$1" in "$family"*) return 0 ;; esac
    done
    return 1
}

# check NAME WORLD FILE EXPECTED-REFUSALS: the refusals of the whole command line are these, each in the docs
check_refusals() {
    local name=$1 world=$2 file=$3 expected=$4
    dry "$world" "$file" -- --vocab-size 50257
    local got missing=""
    got=$(refused | tr '\n' ' ' | sed 's/ $//')
    for f in $got; do in_docs "$f" || missing="$missing $f"; done
    if [ "$(cat "$tmp/status")" = 2 ] && [ "$(wc -l < "$tmp/err")" -eq 1 ] && [ "$got" = "$expected" ] && [ -z "$missing" ]; then
        ok "$name: one line refuses exactly the flags gridgpt lacks ($(wc -w <<< "$got")), each with its reason in docs/flags.md"
    elif [ -n "$missing" ]; then bad "$name" "refused but not in docs/flags.md:$missing"
    else bad "$name" "status $(cat "$tmp/status"), refused [$got], expected [$expected]: $(head -c 600 "$tmp/err")"; fi
}

# --- GPT-3 175B (TP 8 x PP 16; the script's one node of 8 cannot hold it: 8 data-parallel
# replicas, 1024 ranks). Every flag is gridgpt's own. Megatron-LM itself refuses the script as
# written: --rampup-batch-size goes with --train-samples, not --train-iters (its arguments.py
# asserts it for iteration-based training), and gridgpt says the same.
gpt3=$examples/gpt3_175b.flags
dry 1024 "$gpt3" -- --vocab-size 50257
if [ "$(cat "$tmp/status")" = 2 ] && grep -qF -- "--train-iters goes with" "$tmp/err" && grep -qF -- "--rampup-batch-size" "$tmp/err" &&
    [ -z "$(refused | grep -vxF -- --train-iters)" ]; then
    ok "GPT-3 175B: every flag is gridgpt's; the one refusal is Megatron-LM's own (--rampup-batch-size with --train-iters)"
else bad "GPT-3 175B: the flags" "status $(cat "$tmp/status"): $(head -c 400 "$tmp/err")"; fi
# without the ramp-up; --vocab-file and --merge-file name their tokenizer in gridgpt (Megatron-LM's
# GPT2BPETokenizer), and a dry run reads no data, so the vocabulary is GPT-2's 50257
dry 1024 "$gpt3" --rampup-batch-size -- --vocab-size 50257 --tokenizer-type GPT2BPETokenizer
if [ "$(cat "$tmp/status")" = 0 ] && grep -q "TP 8" "$tmp/out" && grep -q "PP 16" "$tmp/out" && [ ! -s "$tmp/err" ]; then
    ok "GPT-3 175B: the dry run plans the script's layout (TP 8, PP 16, DP 8) once the ramp-up is dropped"
else bad "GPT-3 175B: the dry run" "status $(cat "$tmp/status"): $(head -c 400 "$tmp/err") $(head -c 300 "$tmp/out")"; fi

# --- Llama 3 8B on one node of 8 H100s (TP 1, CP 1, PP 1: DP 8), its real-data branch with fp8
llama=$examples/llama3_8b_h100_fp8.flags
# Llama's architecture flags are gridgpt's own (issue 38); Megatron-LM's zero-centred LayerNorm weights are not
llama_architecture="--apply-layernorm-1p"
not_in_gridgpt="--decoupled-lr --decoupled-min-lr --grad-reduce-in-bf16 --fp8-format --fp8-amax-history-len"
not_in_gridgpt="$not_in_gridgpt --fp8-amax-compute-algo --fp8-param-gather --tokenizer-type --tokenizer-model --ckpt-format"
check_refusals "Llama 3 8B (fp8)" 8 "$llama" "$llama_architecture $not_in_gridgpt"
# shellcheck disable=SC2086
dry 8 "$llama" $llama_architecture $not_in_gridgpt --
cp "$tmp/out" "$tmp/llama.out"
notes=$(grep -c "^note: Megatron's .* accepted: " "$tmp/out")
accepted="--use-mcore-models --kv-channels --attention-backend --cross-entropy-loss-fusion"
accepted="$accepted --calculate-per-token-loss --manual-gc --empty-unused-memory-level --use-distributed-optimizer"
# (--context-parallel-size is gridgpt's own flag since context parallelism: no note, as --tensor-model-parallel-size)
accepted="$accepted --no-create-attention-mask-in-dataloader --no-mmap-bin-files --num-workers"
accepted="$accepted --distributed-timeout-minutes"
noted=$(grep "^note: Megatron's " "$tmp/out" | cut -d' ' -f3 | tr '\n' ' ' | sed 's/ $//')
llama_model="--position-embedding-type rope --rotary-base 1000000 --rotary-percent 1 .*--swiglu --gelu tanh --group-query-attention "
llama_model="$llama_model--num-query-groups 8 --untie-embeddings-and-output-weights --disable-bias-linear"
# Megatron-LM HEAD turns --sequence-parallel off at TP 1 with a warning (arguments.py): gridgpt too, with a note
if [ "$noted" = "$accepted" ] && [ "$(cat "$tmp/status")" = 0 ] && [ ! -s "$tmp/err" ] && grep -q "DP 8" "$tmp/out" &&
   grep -q -- "$llama_model" "$tmp/out" &&
   grep -qx "note: --sequence-parallel at --tensor-model-parallel-size 1 turned off: .*(Megatron-LM HEAD turns it off too, with a warning)" "$tmp/out"; then
    ok "Llama 3 8B: without the refused flags, the dry run plans the script's model (rope, SwiGLU, 8 query groups, untied, no biases) and layout (TP 1, PP 1, DP 8); each of the $notes Megatron flags gridgpt does anyway gets its start-up note, and --sequence-parallel at TP 1 one that it is off"
else bad "Llama 3 8B: the dry run and its notes" "noted [$noted], expected [$accepted]; status $(cat "$tmp/status"): $(head -c 300 "$tmp/err") $(grep -m1 -- --sequence-parallel "$tmp/out")"; fi

# --- no silent difference. Each flag of a script is gridgpt's own (docs/flags.md's first
# tables), accepted with a note, or refused; and each Megatron-LM default the script leaves is
# gridgpt's default too (the same value in those tables), a value megatron_flags.h accepts as what
# gridgpt does, or named in a start-up note "note: Megatron-LM's default, FLAG VALUE: ...". The
# defaults, from Megatron-LM HEAD's megatron/training/arguments.py (facts, FLAG VALUE a line):
megatron_defaults="--hidden-dropout 0.1
--attention-dropout 0.1
--weight-decay 0.01
--clip-grad 1.0
--adam-beta1 0.9
--adam-beta2 0.999
--adam-eps 1e-08
--init-method-std 0.02
--seed 1234
--lr-decay-style linear
--min-lr 0.0
--lr-warmup-iters 0
--lr-warmup-samples 0
--lr-warmup-init 0.0
--make-vocab-size-divisible-by 128
--split 969,30,1
--eval-iters 100
--eval-interval 1000
--log-interval 100
--initial-loss-scale 4294967296
--min-loss-scale 1.0
--loss-scale-window 1000
--hysteresis 2
--tensor-model-parallel-size 1
--pipeline-model-parallel-size 1
--context-parallel-size 1
--expert-model-parallel-size 1
--num-distributed-optimizer-instances 1
--position-embedding-type learned_absolute
--normalization LayerNorm
--norm-epsilon 1e-05
--rotary-base 10000
--rotary-percent 1.0
--num-query-groups 1
--attention-backend auto
--transformer-impl transformer_engine
--optimizer adam
--weight-decay-incr-style constant
--dataloader-type single
--distributed-backend nccl
--vocab-extra-ids 0
--cpu-offloading-num-layers 0
--cuda-graph-impl none
--empty-unused-memory-level 0
--timing-log-level 0
--profile-step-start 10
--profile-step-end 12
--ckpt-format torch_dist"
own_tables=$(sed -n "1,/^## Megatron-LM's and/p" docs/flags.md | sed 's/\\|/\//g')
megatron_table=$(sed -n "/^## Megatron-LM's and/,/^## Megatron-LM's defaults/p" docs/flags.md | sed 's/\\|/\//g')
# own_default FLAG: gridgpt's default for its own flag (nothing: not gridgpt's)
own_default() { awk -F' [|] ' -v f="| \`$1\`" '$1 == f { print $3; found = 1; exit } END { if (!found) print "(none)" }' <<< "$own_tables"; }
# the same value: as numbers where both are numbers (1e-05 = 1e-5, 1 = 1.0), else as text
same_value() { awk -v a="$1" -v b="$2" 'BEGIN { n = "^[-+]?[0-9.]+([eE][-+]?[0-9]+)?$"; exit !((a ~ n && b ~ n) ? a + 0 == b + 0 : a == b) }'; }
# megatron_verdict FLAG VALUE: the verdict of the flag's first row in docs/flags.md whose values take VALUE
megatron_verdict() {
    awk -F' [|] ' -v f="| \`$1\`" -v v="$2" '$1 == f {
        n = split($2, alt, "/"); take = $2 == "any" || $2 == "other" || $2 == "switch"
        for (i = 1; i <= n && !take; i++) take = alt[i] == v || (alt[i] ~ /^[0-9.]+$/ && v ~ /^[0-9.]+$/ && alt[i] + 0 == v + 0)
        if (take) { split($3, w, " "); print w[1]; exit } }' <<< "$megatron_table"
}
# accounted FILE OUT ERR [DROPPED...]: into $accounting, how many flags of FILE are refused (named in ERR's
# line, or one of DROPPED, refused by an earlier run), noted as accepted, or taken (gridgpt's own); the
# others, none of these, into $unaccounted
accounted() {
    local file=$1 out=$2 err=$3; shift 3
    local flag own=0 acc=0 ref=0 refusals
    refusals=" $(sed -e 's/^error: //' -e 's/^[0-9]* flags refused: //' "$err" | tr ';' '\n' | sed -e 's/^ *//' |
                 grep -E '^--' | sed -E 's/^(--[^ :]*).*/\1/' | tr '\n' ' ') $* "
    for flag in $(grep -v '^#' "$file" | cut -d' ' -f1); do
        if [[ "$refusals" == *" $flag "* ]]; then ref=$((ref + 1))
        elif grep -q -- "^note: Megatron's $flag .*accepted: \|^note: Megatron's $flag accepted: " "$out"; then acc=$((acc + 1))
        elif [ "$(own_default "$flag")" != "(none)" ]; then own=$((own + 1))
        else unaccounted="$unaccounted $flag"; fi
    done
    accounting="each of its $((own + acc + ref)) flags is taken ($own), accepted with a note ($acc) or refused with its reason ($ref)"
}
# no_silent_difference NAME FILE OUT ERR EXPECTED [DROPPED...]: each flag of FILE is accounted for, each
# Megatron-LM default FILE leaves is gridgpt's, accepted as what gridgpt does, or noted; and the notes of
# Megatron-LM's defaults are exactly EXPECTED's flags
no_silent_difference() {
    local name=$1 file=$2 out=$3 err=$4 expected=$5; shift 5
    local flag value silent="" same=0 named=0 got unaccounted="" accounting
    accounted "$file" "$out" "$err" "$@"
    while read -r flag value; do
        grep -q -- "^$flag\( \|$\)" "$file" && continue
        if same_value "$(own_default "$flag")" "$value" || [ "$(megatron_verdict "$flag" "$value")" = accepted ]; then
            same=$((same + 1))
        elif grep -qF -- "note: Megatron-LM's default, $flag $value: " "$out"; then named=$((named + 1))
        else silent="$silent $flag $value;"; fi
    done <<< "$megatron_defaults"
    got=$(sed -n "s/^note: Megatron-LM's default, \(no \)\?\(--[a-z0-9-]*\).*/\2/p" "$out" | tr '\n' ' ' | sed 's/ $//')
    if [ -z "$silent$unaccounted" ] && [ "$got" = "$expected" ]; then
        ok "$name, no silent difference: $accounting; of Megatron-LM's defaults it leaves, $same are gridgpt's too and $named named at start-up, whose notes name [$got]"
    else bad "$name: a silent difference" "flags not accounted for:$unaccounted; defaults left silent:$silent noted [$got], expected [$expected]"; fi
}
# (--fp16 with the dynamic loss scaler: Megatron-LM turns its NaN check off too)
dry 1024 "$gpt3" --rampup-batch-size -- --vocab-size 50257 --tokenizer-type GPT2BPETokenizer
no_silent_difference "GPT-3 175B" "$gpt3" "$tmp/out" "$tmp/err" \
    "--accumulate-allreduce-grads-in-fp32 --ckpt-format --exit-signal-handler --tensorboard-log-interval" \
    --rampup-batch-size
# (its dropout is given, 0: gridgpt's own flags; its --ckpt-format torch_dist is refused: without it, the default is named)
dry 8 "$llama" -- --vocab-size 128256
no_silent_difference "Llama 3 8B (fp8)" "$llama" "$tmp/llama.out" "$tmp/err" \
    "--no-check-for-nan-in-loss-and-grad --ckpt-format --exit-signal-handler --profile-ranks"

# --- issue 48's edge cases, on a small model's dry run (and with DATA_PREFIX a short training)
small="--dry-run --vocab-size 256 --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16"
# run NAME FLAGS...: ./train_cpu FLAGS, its status, stdout and stderr in $tmp/NAME.{status,out,err}
run() {
    local name=$1; shift
    ./train_cpu "$@" > "$tmp/$name.out" 2> "$tmp/$name.err"
    echo $? > "$tmp/$name.status"
}
# accepted NAME NEEDLE FLAGS...: the dry run goes on (exit 0, nothing on stderr) with NEEDLE on stdout
accepted() {
    local name=$1 needle=$2; shift 2
    run one $small "$@"
    if [ "$(cat "$tmp/one.status")" = 0 ] && [ ! -s "$tmp/one.err" ] && grep -qF -- "$needle" "$tmp/one.out"; then ok "$name"
    else bad "$name" "status $(cat "$tmp/one.status"): $(head -c 300 "$tmp/one.err") $(grep -m1 -- "${needle:0:30}" "$tmp/one.out")"; fi
}
# refused NAME NEEDLE FLAGS...: exit 2 and one line on stderr holding NEEDLE
refused_with() {
    local name=$1 needle=$2; shift 2
    run one "$@"
    if [ "$(cat "$tmp/one.status")" = 2 ] && [ "$(wc -l < "$tmp/one.err")" -eq 1 ] && grep -qF -- "$needle" "$tmp/one.err"; then ok "$name"
    else bad "$name" "status $(cat "$tmp/one.status"): $(head -c 300 "$tmp/one.err")"; fi
}

# Python's integers (and floats) with underscores, as BigScience's scripts write them: read as the
# number (gridgpt's flags, and Megatron's rows); an underscore not between two digits refused, as Python does
# (the GPU build's plan: priced on --hw's figures, not on this machine measured now)
run plain $small --dry-run-build gpu --train-samples 9765625000 --rampup-batch-size 192 16 9765625 --global-batch-size 2048 --lr 1e-4
run underscored $small --dry-run-build gpu --train-samples 9_765_625_000 --rampup-batch-size 192 16 9_765_625 --global-batch-size 2_048 \
    --lr 1_0e-5
if [ "$(cat "$tmp/plain.status")" = 0 ] && [ "$(cat "$tmp/underscored.status")" = 0 ] && [ ! -s "$tmp/underscored.err" ] &&
   cmp -s "$tmp/plain.out" "$tmp/underscored.out"; then
    ok "--train-samples 9_765_625_000 --rampup-batch-size 192 16 9_765_625 --global-batch-size 2_048 --lr 1_0e-5: the plan of the plain numbers, line for line"
else bad "numbers with Python's underscores" "status $(cat "$tmp/underscored.status"): $(head -c 300 "$tmp/underscored.err")"; fi
for malformed in 9__7 _97 97_ 1_.5; do
    refused_with "--train-iters $malformed refused as Python refuses it" \
        "--train-iters $malformed: an underscore in a number goes between two digits (Python's rule" $small --train-iters "$malformed"
done
accepted "a Megatron flag's number with underscores: --distributed-timeout-minutes 1_0 taken as --watchdog-timeout 600" \
    "note: Megatron's --distributed-timeout-minutes 10 accepted: taken as --watchdog-timeout" --distributed-timeout-minutes 1_0
refused_with "a Megatron flag's malformed number refused" "--zero-stage 0_: an underscore in a number goes between two digits" \
    $small --zero-stage 0_

# --zero-stage is gridgpt's own (0 the same step as 1; 2 and 3: zero.h); Megatron-Core's
# --data-parallel-sharding-strategy names the same stages
accepted "--data-parallel-sharding-strategy optim_grads_params taken as --zero-stage 3" \
    "note: Megatron's --data-parallel-sharding-strategy optim_grads_params accepted: taken as --zero-stage 3" \
    --data-parallel-sharding-strategy optim_grads_params
accepted "--moe-token-dispatcher-type alltoall accepted: gridgpt's dispatcher" \
    "note: Megatron's --moe-token-dispatcher-type alltoall accepted: the experts' rows go to their ranks by an all-to-all" \
    --moe-token-dispatcher-type alltoall
refused_with "--moe-token-dispatcher-type allgather refused" "--moe-token-dispatcher-type allgather: not in gridgpt: another token dispatcher" \
    $small --moe-token-dispatcher-type allgather
refused_with "--zero-stage 4 refused: ZeRO has stages 0 to 3" "--zero-stage 4: ZeRO has stages 0 to 3" $small --zero-stage 4

# BigScience's and Megatron-DeepSpeed's flags that had no row, and rows checked against Megatron-LM HEAD
accepted "--valid-num-workers accepted as --num-workers is" "note: Megatron's --valid-num-workers 2 accepted: the loader has no workers" \
    --valid-num-workers 2 --num-workers 2
accepted "--abort-on-unmet-fused-kernel-constraints accepted: nothing falls back" \
    "note: Megatron's --abort-on-unmet-fused-kernel-constraints accepted: nothing to abort" --abort-on-unmet-fused-kernel-constraints
accepted "--pad-vocab-size-to 256 accepted: where gridgpt pads a vocabulary of 256" \
    "note: Megatron's --pad-vocab-size-to 256 accepted: the vocabulary padded to exactly that many rows" --pad-vocab-size-to 256
accepted "BLOOM's --pad-vocab-size-to 250_880 at TP 4 accepted: 250680 padded to a multiple of 128 x 4" \
    "vocabulary padded to 250880" --vocab-size 250680 --hidden-size 32 --num-attention-heads 4 --tensor-model-parallel-size 4 \
    --world-size 4 --pad-vocab-size-to 250_880
refused_with "--pad-vocab-size-to 512 refused, naming gridgpt's padding and the flag that reaches it" \
    "--pad-vocab-size-to 512: not in gridgpt: a vocabulary of 512 rows: gridgpt pads --vocab-size 256 to 256, a multiple of --make-vocab-size-divisible-by 128 x --tensor-model-parallel-size 1 (--make-vocab-size-divisible-by 512 pads it to 512)" \
    $small --pad-vocab-size-to 512
refused_with "--pad-vocab-size-to below the vocabulary refused" "(fewer rows than the vocabulary's 256)" $small --pad-vocab-size-to 200
refused_with "--tokenizer-name-or-path refused: a Hugging Face tokenizer" \
    "--tokenizer-name-or-path bigscience/tokenizer: not in gridgpt: a Hugging Face tokenizer: Megatron-DeepSpeed would load it" \
    $small --tokenizer-name-or-path bigscience/tokenizer
refused_with "--kill-switch-path refused: a kill switch gridgpt does not check" \
    "--kill-switch-path $tmp/kill: not in gridgpt: a kill switch: Megatron-DeepSpeed would exit when this file exists" \
    $small --kill-switch-path "$tmp/kill"
refused_with "--train-weighted-split-paths-path and --valid-weighted-split-paths-path refused, both in one line" \
    "2 flags refused: --train-weighted-split-paths-path $tmp/t (weighted split paths); --valid-weighted-split-paths-path $tmp/v (weighted split paths)" \
    $small --train-weighted-split-paths-path "$tmp/t" --valid-weighted-split-paths-path "$tmp/v"
accepted "--no-async-tensor-model-parallel-allreduce accepted, saying Megatron-LM HEAD no longer has it" \
    "HEAD no longer has it" --no-async-tensor-model-parallel-allreduce
accepted "--no-check-for-nan-in-loss-and-grad accepted: gridgpt skips a NaN step, it does not stop" \
    "note: Megatron's --no-check-for-nan-in-loss-and-grad accepted: gridgpt does not stop at a NaN" --no-check-for-nan-in-loss-and-grad
accepted "--transformer-impl transformer_engine (HEAD's default) accepted: the same layers" \
    "note: Megatron's --transformer-impl transformer_engine accepted: the same layers" --transformer-impl transformer_engine
run none $small --cuda-graph-impl none
run local $small --cuda-graph-impl local
if [ "$(cat "$tmp/none.status")" = 0 ] && grep -q "^note: Megatron's --cuda-graph-impl none accepted: no CUDA graphs" "$tmp/none.out" &&
   [ "$(cat "$tmp/local.status")" = 2 ] && grep -qF -- "--cuda-graph-impl local: not in gridgpt: CUDA graphs" "$tmp/local.err"; then
    ok "--cuda-graph-impl none (HEAD's default) accepted, local still refused"
else bad "--cuda-graph-impl" "none: $(cat "$tmp/none.status") $(head -c 200 "$tmp/none.err"); local: $(head -c 200 "$tmp/local.err")"; fi
accepted "--use-dist-ckpt (no effect in HEAD) accepted" "note: Megatron's --use-dist-ckpt accepted: no effect in Megatron-LM HEAD" --use-dist-ckpt
accepted "--override-opt_param-scheduler (Megatron-LM's spelling) taken as --override-opt-param-scheduler" \
    "note: Megatron's --override-opt_param-scheduler accepted: Megatron-LM's spelling" --override-opt_param-scheduler
accepted "Megatron-DeepSpeed's --use-bnb-optimizer is gridgpt's own: the plan's Adam moments in 8 bits" \
    "m and v in 8 bits" --use-bnb-optimizer

# the notes of Megatron-LM's defaults: each in the runs it is about, once, on stdout; none where a flag
# gives the value, nor with --help, nor in an evaluation alone
defaults_noted() {  # FLAGS...: the flags named by "note: Megatron-LM's default, ..." lines, in order
    ./train_cpu "$@" 2>&1 | sed -n "s/^note: Megatron-LM's default, \(no \)\?\(--[a-z0-9-]*\).*/\2/p" | tr '\n' ' ' | sed 's/ $//'
}
always="--no-check-for-nan-in-loss-and-grad"
gelu_model="--dry-run --vocab-size 256 --num-layers 1 --hidden-size 64 --num-attention-heads 2 --seq-length 16"
cases=(
    "$always|$small"
    "--no-check-for-nan-in-loss-and-grad|$small --hidden-dropout 0"
    "--accumulate-allreduce-grads-in-fp32|$small --fp16"
    "$always --accumulate-allreduce-grads-in-fp32|$small --fp16 --loss-scale 1024"
    "$always --bf16|$small --dry-run-build gpu"
    "$always|$small --dry-run-build gpu --bf16"
    "$always --ckpt-format --exit-signal-handler|$small --save $tmp/ckpt"
    "$always --tensorboard-log-interval|$small --tensorboard-dir $tmp/tb --log-interval 10"
    "$always|$small --tensorboard-dir $tmp/tb --log-interval 1"
    "$always --profile-ranks|$small --profile --train-iters 20"
    "$always|$small --profile --train-iters 20 --profile-ranks 0"
    "$always|$gelu_model --disable-bias-linear"
    "$always|$gelu_model --disable-bias-linear --swiglu"
    "|$small --help"
    "|$small --help-markdown"
)
wrong=""
for c in "${cases[@]}"; do
    want=${c%%|*}
    # shellcheck disable=SC2086
    got=$(defaults_noted ${c#*|})
    [ "$got" = "$want" ] || wrong="$wrong [${c#*|}: noted '$got', expected '$want']"
done
rows=$(grep -c '^    {"--' megatron_flags.h)
documented=$(grep -c "^| \`--" <(sed -n "/^## Megatron-LM's defaults/,\$p" docs/flags.md))
if [ -z "$wrong" ] && [ "$documented" -eq "$rows" ]; then
    ok "Megatron-LM's defaults that differ are noted in the runs they are about (${#cases[@]} command lines): the NaN check always (dropout is gridgpt's own, at Megatron-LM's 0.1; GELU's form is chosen as Megatron-LM chooses), the fp16 gradients, train_gpu's bf16, the checkpoint format and SIGTERM with --save, TensorBoard's interval, the profiled ranks; none with --help; each of the $rows rows in docs/flags.md"
else bad "the notes of Megatron-LM's defaults" "$wrong; $documented of $rows rows in docs/flags.md"; fi

# GELU's form as Megatron-LM chooses it: its fused bias-GELU is the tanh form; with the fusion off
# (--no-bias-gelu-fusion, or --disable-bias-linear without --swiglu) torch's exact erf GELU;
# --openai-gelu keeps OpenAI's tanh one; --gelu says it in gridgpt's words and wins
gelu_of() { ./train_cpu $gelu_model "$@" 2>&1 | sed -n 's/^model: .* --gelu \([a-z]*\) .*/\1/p'; }
wrong=""
for c in "tanh|" "erf|--no-bias-gelu-fusion" "erf|--disable-bias-linear" "tanh|--disable-bias-linear --swiglu" \
         "tanh|--swiglu --no-bias-gelu-fusion" "tanh|--no-bias-gelu-fusion --openai-gelu" "tanh|--disable-bias-linear --gelu tanh" \
         "erf|--gelu erf" "tanh|--openai-gelu"; do
    # shellcheck disable=SC2046
    got=$(gelu_of ${c#*|})
    [ "$got" = "${c%%|*}" ] || wrong="$wrong [${c#*|}: --gelu '$got', expected ${c%%|*}]"
done
if [ -z "$wrong" ]; then ok "GELU's form is Megatron-LM's choice: tanh by default and with --swiglu or --openai-gelu, erf with --no-bias-gelu-fusion or --disable-bias-linear; --gelu wins"
else bad "GELU's form from Megatron-LM's flags" "$wrong"; fi
refused_with "--gelu with --swiglu refused: no GELU to choose the form of" "--gelu goes with a GELU MLP (not --swiglu)" \
    $gelu_model --swiglu --gelu erf
refused_with "--gelu erf with --openai-gelu refused: two forms asked for" "--gelu erf with --openai-gelu" $gelu_model --gelu erf --openai-gelu

# with DATA_PREFIX: --sequence-parallel at TP 1 trains what the run without it trains (noted, turned
# off, the same log lines); the notes come once, on rank 0, with 2 ranks; an evaluation alone has none
if [ -n "$data" ]; then
    export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    steps() { grep -E '^ \[[^]]*\] iteration|lm loss value' "$1" | sed -E 's/^ \[[^]]*\]//; s/elapsed time per iteration \(ms\): [0-9.]+//; s/tokens per second: [0-9]+//; s/ETA: [0-9:]+//'; }
    model="--data-path $data --num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 32 --micro-batch-size 2"
    train="$model --train-iters 4 --log-interval 1 --eval-interval 4 --eval-iters 1 --split 90,10,0"
    ./train_cpu $train --sequence-parallel --save "$tmp/sp.ckpt" > "$tmp/sp.log" 2>&1; sp=$?
    ./train_cpu $train --save "$tmp/plain.ckpt" > "$tmp/nosp.log" 2>&1
    if [ $sp -eq 0 ] && [ "$(steps "$tmp/sp.log" | wc -l)" -ge 5 ] && diff <(steps "$tmp/sp.log") <(steps "$tmp/nosp.log") > /dev/null &&
       [ "$(grep -c '^note: --sequence-parallel at --tensor-model-parallel-size 1 turned off' "$tmp/sp.log")" -eq 1 ] &&
       grep -q '^config sequence_parallel 0$' "$tmp/sp.ckpt/iter_0000004/metadata.txt"; then
        ok "--sequence-parallel at TP 1 is turned off with one note: the same 4 steps and evaluation as without it, and the checkpoint records it off"
    else bad "--sequence-parallel at TP 1" "status $sp: $(grep -m1 -E 'error|note: --seq' "$tmp/sp.log") $(diff <(steps "$tmp/sp.log") <(steps "$tmp/nosp.log") | head -3)"; fi
    if command -v mpirun > /dev/null; then
        mpirun --oversubscribe --bind-to none -np 2 ./train_cpu $train > "$tmp/dp2.log" 2>&1; dp2=$?
        ./train_cpu $model --eval-iters 1 --split 90,10,0 --skip-train --load "$tmp/plain.ckpt" > "$tmp/eval.log" 2>&1
        if [ $dp2 -eq 0 ] && [ "$(grep -c "^note: Megatron-LM's default, " "$tmp/dp2.log")" -eq 1 ] &&
           ! grep -q "^note: Megatron-LM's default" "$tmp/eval.log" && grep -q 'validation loss' "$tmp/eval.log"; then
            ok "Megatron-LM's defaults are noted once by 2 ranks (rank 0: 1 line, the NaN check), not in an evaluation alone (--skip-train)"
        else bad "the defaults' notes with 2 ranks and --skip-train" "status $dp2, $(grep -c "^note: Megatron-LM's default, " "$tmp/dp2.log") notes; $(grep -m1 -E 'error' "$tmp/dp2.log" "$tmp/eval.log")"; fi
    fi
fi
