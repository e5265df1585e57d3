#!/usr/bin/env bash
# tests/test_configs.sh DATA_PREFIX — the published runs' scripts (scripts/configs/): each
# --tiny variant keeps every option of its run (fp16 and the loss scaler, recomputation,
# ALiBi, the embedding LayerNorm, balanced stages, the ramp-up and schedule) at a small width
# and depth, and trains a few steps on the CPU build at a small grid; the full command
# (--print) names the published layout and binary; --dry-run plans the published layout (and
# --tiny --dry-run the tiny one) with the trainer's planner, one process, no DATA.
set -u
data=${1:?usage: test_configs.sh DATA_PREFIX}
B=tests/build/configs
rm -rf $B && mkdir -p $B
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DATA=$data
ok() { echo "PASS $1"; }
bad() { echo "FAIL $1: $2"; }

# tiny NAME STEPS NEEDLE...: the tiny run exits 0, reaches its last step with a finite loss,
# and its log holds every NEEDLE (options in the model and training lines, the stages)
tiny() {
    local name=$1 steps=$2; shift 2
    timeout 600 scripts/configs/$name.sh --tiny > $B/$name.log 2>&1
    local status=$? missing="" needle
    for needle in "$@"; do grep -qF -- "$needle" $B/$name.log || missing="$missing [$needle]"; done
    if [ $status -eq 0 ] && grep -qE "^ \[[^]]*\] iteration +$steps/ +$steps \| .*lm loss: [0-9]\.[0-9]+E[+-][0-9]+ " $B/$name.log &&
       [ -z "$missing" ]; then ok "$name --tiny trains $steps steps with every option of the run"
    else bad "$name --tiny" "status $status, missing:$missing; $(grep -m1 -E 'error|FAIL' $B/$name.log)"; fi
}
tiny tr1-13B 10 "TP 2 x PP 2" "(ramped up)" "activation recomputation" "loss scale: 65536.0"
tiny tr8-104B 8 "TP 2 x PP 4" "(stage 3, layers 3-3)" "activation recomputation" "loss scale: 65536.0"
tiny tr11-176B-bloom 8 "TP 2 x PP 3" "--embed-layernorm --position-embedding-type alibi" "activation recomputation" \
    "(stage 0, layers 0-1)" "(stage 1, layers 2-4)" "(stage 2, layers 5-6)"

# full_command NAME NEEDLE...: the full run's command line names the published layout
full_command() {
    local name=$1 missing="" needle; shift
    local cmd
    cmd=$(LAUNCHER=srun scripts/configs/$name.sh --print 2>&1)
    for needle in "$@"; do [[ "$cmd" == *"$needle"* ]] || missing="$missing [$needle]"; done
    if [ -z "$missing" ]; then ok "$name: the full command is the published run's"
    else bad "$name --print" "missing:$missing in: $(head -c 300 <<< "$cmd")"; fi
}
full_command tr1-13B "srun ./train_gpu_fp16 " "--num-layers 40 --hidden-size 5120 --num-attention-heads 32" \
    "--global-batch-size 1024 --rampup-batch-size 16 16 5000000" "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4"
full_command tr8-104B "srun ./train_gpu_fp16 " "--num-layers 32 --hidden-size 16384 --num-attention-heads 32" \
    "--vocab-size 50257" "--global-batch-size 2048 --rampup-batch-size 16 16 6000000" \
    "--lr 6e-5 --min-lr 6e-6 --lr-decay-style cosine --lr-decay-samples 126953125 --lr-warmup-samples 216320" \
    "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 32"
full_command tr11-176B-bloom "srun ./train_gpu " "--num-layers 70 --hidden-size 14336 --num-attention-heads 112" \
    "--position-embedding-type alibi --embed-layernorm" "--bf16" "--rampup-batch-size 192 16 9765625" \
    "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 12" "--pp-partition-method type:transformer|embedding"

# dry_run NAME [--tiny] WORLD TP PP DP MBS GBS: `NAME.sh [--tiny] --dry-run` (no DATA, no
# launcher) exits 0 and its last line is the planner's for that layout (a prefix: the line
# may grow more fields)
dry_run() {
    local name=$1 tiny=""; shift
    if [ "$1" = --tiny ]; then tiny=--tiny; shift; fi
    local out status last want
    out=$(env -u DATA timeout 60 scripts/configs/$name.sh $tiny --dry-run 2>&1); status=$?
    last=$(tail -n 1 <<< "$out")
    want="^dry-run: world $1 TP $2 PP $3 DP $4 MBS $5 GBS $6( SP)?: peak memory per GPU [0-9.]+ GiB \(stage [0-9]+\)"
    if [ $status -eq 0 ] && [[ "$last" =~ $want ]]; then ok "$name${tiny:+ $tiny} --dry-run plans world $1 as TP $2 x PP $3 x DP $4"
    else bad "$name${tiny:+ $tiny} --dry-run" "status $status, last line: $last"; fi
}
dry_run tr1-13B 128 2 4 16 1 1024
dry_run tr8-104B 512 4 32 4 1 2048
dry_run tr11-176B-bloom 384 4 12 8 2 2048
dry_run tr1-13B --tiny 4 2 2 1 1 8
# as root without Open MPI's two variables (launch.sh sets them, as scripts/run.sh does: it once
# stopped at mpirun's root check), on bytes; then on GPT-2 tokens, which --tiny once refused
# (its byte vocabulary): it keeps GPT-2's vocabulary and tokenizer, and samples text
env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM bash -c "$(declare -f tiny ok bad); B=$B; tiny gpt2-124M 8 'TP 1 x PP 1 x DP 2' '--vocab-size 257'"
./preprocess --input tests/build/corpus.jsonl --json-keys text --append-eod --output-prefix $B/gpt2 --tokenizer-type GPT2BPETokenizer \
    --vocab-file tests/data/gpt2/encoder.json --merge-file tests/data/gpt2/vocab.bpe > /dev/null
DATA=$B/gpt2_text_document tiny gpt2-124M 8 "TP 1 x PP 1 x DP 2" "--vocab-size 50257" "(vocabulary padded to 50304)" \
    "generation: 8 tokens"
full_command gpt2-124M "srun ./train_gpu " "--num-layers 12 --hidden-size 768 --num-attention-heads 12 --ffn-hidden-size 3072" \
    "--seq-length 1024" "--vocab-size 50257" "--micro-batch-size 64 --global-batch-size 512" "--train-iters 18865" \
    "--lr 6e-4 --lr-decay-style cosine --min-lr 0 --lr-warmup-iters 700" "--weight-decay 0.1" "--adam-beta2 0.95" "--bf16"
dry_run gpt2-124M 8 1 1 8 64 512
dry_run gpt2-124M --tiny 2 1 1 2 2 8
# the one-machine recipe: GPT-2 tokens (made here from the license texts when DATA is not given),
# one process launched on this machine, a sample of text at the end
env -u DATA SAVE=$B/gpt2-cpu.ckpt bash -c "$(declare -f tiny ok bad); B=$B; tiny gpt2-cpu 10 '--vocab-size 50257' \
    '(vocabulary padded to 50304)' 'generation: 8 tokens'"
cmd=$(env -u LAUNCHER scripts/configs/gpt2-cpu.sh --print 2>&1)
if [[ "$cmd" == "scripts/configs/../launch --oversubscribe --bind-to none -np 1 ./train_cpu --num-layers 4 --hidden-size 128 "* &&
      "$cmd" == *"--tokenizer-type GPT2BPETokenizer"* && "$cmd" == *"--save runs/gpt2-cpu --load runs/gpt2-cpu"* ]]; then
    ok "gpt2-cpu: the full command runs one process of train_cpu on this machine through scripts/launch"
else bad "gpt2-cpu --print" "$(head -c 300 <<< "$cmd")"; fi
dry_run gpt2-cpu 1 1 1 1 8 8
tiny llama3-8B 8 "TP 2 x PP 2" "--position-embedding-type rope --rotary-base 500000" "--normalization RMSNorm" "--swiglu" \
    "--group-query-attention --num-query-groups 2 --untie-embeddings-and-output-weights --disable-bias-linear"
full_command llama3-8B "srun ./train_gpu " "--num-layers 32 --hidden-size 4096 --num-attention-heads 32" \
    "--ffn-hidden-size 14336" "--num-query-groups 8" "--vocab-size 128256" "--seq-length 8192" "--rotary-base 500000"
dry_run llama3-8B 8 2 1 4 1 128
dry_run llama3-8B --tiny 4 2 2 1 1 8
