#!/usr/bin/env bash
# tests/test_megatron_flags.sh — a Megatron-LM user's command line runs: the training flags of
# two of Megatron-LM's own example scripts (tests/data/megatron_examples: GPT-3 175B, Llama 3
# 8B), given whole to `./train_cpu --dry-run --dry-run-build gpu` (their paths ours, the world size theirs). Every
# flag is gridgpt's, accepted as what gridgpt does (a start-up note each), or refused; one line
# names every refused flag at once, and the refusals must be exactly the honest ones below, each
# with its reason in docs/flags.md. Without them, the dry run plans the script's run (after the
# few checks of gridgpt's own that the scripts meet, each named here).
set -u
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
notes=$(grep -c "^note: Megatron's .* accepted: " "$tmp/out")
accepted="--use-mcore-models --kv-channels --attention-dropout --hidden-dropout --attention-backend --cross-entropy-loss-fusion"
accepted="$accepted --calculate-per-token-loss --manual-gc --empty-unused-memory-level --use-distributed-optimizer"
accepted="$accepted --context-parallel-size --no-create-attention-mask-in-dataloader --no-mmap-bin-files --num-workers"
accepted="$accepted --distributed-timeout-minutes"
noted=$(grep "^note: Megatron's " "$tmp/out" | cut -d' ' -f3 | tr '\n' ' ' | sed 's/ $//')
# Megatron-LM turns --sequence-parallel off at TP 1 with a warning; gridgpt refuses it (config.h layout_error)
if [ "$noted" = "$accepted" ] && [ "$(cat "$tmp/status")" = 2 ] && grep -qF -- "--sequence-parallel needs --tensor-model-parallel-size > 1" "$tmp/err"; then
    ok "Llama 3 8B: without the refused flags, each of the $notes Megatron flags gridgpt does anyway gets its start-up note"
else bad "Llama 3 8B: the notes" "noted [$noted], expected [$accepted]; status $(cat "$tmp/status"): $(head -c 300 "$tmp/err")"; fi
# shellcheck disable=SC2086
dry 8 "$llama" $llama_architecture $not_in_gridgpt --sequence-parallel --
llama_model="--position-embedding-type rope --rotary-base 1000000 --rotary-percent 1 .*--swiglu --group-query-attention "
llama_model="$llama_model--num-query-groups 8 --untie-embeddings-and-output-weights --disable-bias-linear"
if [ "$(cat "$tmp/status")" = 0 ] && grep -q "DP 8" "$tmp/out" && [ ! -s "$tmp/err" ] && grep -q -- "$llama_model" "$tmp/out"; then
    ok "Llama 3 8B: the dry run plans the script's model (rope, SwiGLU, 8 query groups, untied, no biases) and layout (TP 1, PP 1, DP 8) once --sequence-parallel is dropped at TP 1"
else bad "Llama 3 8B: the dry run" "status $(cat "$tmp/status"): $(head -c 400 "$tmp/err") $(head -c 300 "$tmp/out")"; fi
