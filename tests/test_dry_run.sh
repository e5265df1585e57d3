#!/usr/bin/env bash
# tests/test_dry_run.sh DATA_PREFIX — --dry-run predicts, to the byte, what the trainer allocates.
# For each layout and shape (GPT-2's, BLOOM's, Llama's), one process plans the CPU build's memory (./train_cpu --dry-run
# --dry-run-build cpu --world-size N) and the real trainer runs it for one step under mpirun -np N
# with --log-memory-bytes. Every rank's bytes (parameters, gradients, optimizer state,
# activations, workspaces, total) must equal its stage's planned line, and the total what
# dev_malloc really handed out. (The GPU build's plan, train_cpu's default, is checked against
# the emulated GPU build's in tests/test_emu_train.sh.) Also: the last line's fixed form and
# bubble, the first line's planned build, and the dry run's one-line refusals.
set -u
data=${1:?usage: test_dry_run.sh DATA_PREFIX}
B=tests/build/dry_run
mkdir -p $B
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none"
ok() { echo "PASS $1"; }
bad() { echo "FAIL $1: $2"; }

model="--vocab-size 257 --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2"

# "stage S: the six byte counts", from lines "  LABEL (stage S) in bytes: a | b | c | d | e | f"
bytes_by_stage() { sed -nE 's/.*\(stage ([0-9]+)\) in bytes: (.*)/\1: \2/p' "$1"; }

compare() {  # name tp pp dp [flags...]
    local name=$1 tp=$2 pp=$3 dp=$4; shift 4
    local n=$((tp * pp * dp)) layout="--tensor-model-parallel-size $tp --pipeline-model-parallel-size $pp"
    ./train_cpu --dry-run --dry-run-build cpu --world-size $n $model $layout "$@" > $B/$name.plan 2>&1
    $MPIRUN -np $n ./train_cpu --data-path $data $model $layout "$@" --train-iters 1 --eval-iters 0 --log-memory-bytes \
        > $B/$name.run 2>&1
    local planned real allocated totals
    planned=$(bytes_by_stage $B/$name.plan)
    # every rank's line, each checked against its stage's planned one
    real=$(bytes_by_stage $B/$name.run | sort -n | uniq)
    allocated=$(sed -nE 's/.*dev_malloc handed out ([0-9]+) bytes.*/\1/p' $B/$name.run | sort -n | uniq)
    totals=$(bytes_by_stage $B/$name.run | sed -E 's/.*\| //' | sort -n | uniq)
    if [ -z "$planned" ] || [ "$(echo "$planned" | wc -l)" -ne $pp ]; then
        bad "$name: the dry run plans $pp stage(s)" "$(tail -3 $B/$name.plan)"
    elif [ "$(bytes_by_stage $B/$name.run | wc -l)" -ne $n ]; then
        bad "$name: the real run prints $n ranks' bytes" "$(grep -m1 -i error $B/$name.run)"
    elif [ "$planned" != "$real" ]; then
        bad "$name: planned bytes per stage = the trainer's" "planned: $planned / real: $real"
    elif [ "$allocated" != "$totals" ]; then
        bad "$name: the totals = what dev_malloc handed out" "totals: $totals / allocated: $allocated"
    else
        ok "$name (world $n): every stage's bytes planned = reported = allocated ($(echo $planned | tr '\n' ' '))"
    fi
}

compare one-rank 1 1 1
compare dp2-optimizer-shard 1 1 2
compare dp3-padded-shard 1 1 3 --global-batch-size 6
compare tp2 2 1 1
compare tp4-mbs1 4 1 1 --micro-batch-size 1 --seq-length 32
compare pp2 1 2 1
compare tp2-pp2-dp2 2 2 2 --global-batch-size 8
compare pp4-uneven-embedding 1 4 1 --pp-partition-method 'type:transformer|embedding' --global-batch-size 8
compare pp3-uneven-transformer 1 3 1 --num-layers 5 --pp-partition-method type:transformer --global-batch-size 6
compare pp2-dp2-recompute 1 2 2 --checkpoint-activations --global-batch-size 8
compare tp2-pp2-recompute-block 2 2 1 --recompute-granularity full --recompute-method block --recompute-num-layers 1
compare tp2-pp2-selective 2 2 1 --recompute-activations
compare bloom-tp2-pp2 2 2 1 --position-embedding-type alibi --embed-layernorm --global-batch-size 8
compare first-last-layers 1 3 1 --num-layers 6 --decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 1
# interleaved 1F1B: each model chunk's slots as the schedule counts them (v = 2 at (2,2,1); an uneven
# split of 6 layers, 2 + 4, in 2 chunks each, recomputed)
compare interleaved-tp2-pp2 2 2 1 --num-layers-per-virtual-pipeline-stage 1 --global-batch-size 16
compare interleaved-uneven-recompute 1 2 1 --num-layers 6 --decoder-first-pipeline-num-layers 2 \
    --num-virtual-stages-per-pipeline-rank 2 --checkpoint-activations --global-batch-size 8

compare tp2-pp2-dp2-sequence-parallel-recompute 2 2 2 --global-batch-size 8 --sequence-parallel --checkpoint-activations
# Llama's choices (gpt.h): rope (no position table), RMSNorm (rstd alone), SwiGLU (fc1 twice as
# wide, the activation a buffer of its own), 4 heads in 2 query groups (QKV (4 + 2 x 2) x 8 wide),
# an untied output layer on the last stage, no linear biases (no bias-gradient partials)
llama="--position-embedding-type rope --normalization RMSNorm --swiglu --group-query-attention --num-query-groups 2
       --untie-embeddings-and-output-weights --disable-bias-linear"
compare llama-one-rank 1 1 1 $llama
compare llama-tp2-pp2-dp2 2 2 2 $llama --global-batch-size 8
compare llama-tp2-pp2-sequence-parallel-recompute 2 2 1 $llama --sequence-parallel --checkpoint-activations

# one layer's activations for one micro-batch, without and with --sequence-parallel, against
# what layout_layer takes, written out: every buffer rounded up to 256 bytes; at TP 2 (CPU
# build: fp32, the probabilities kept) N = 2 x 16 rows, R = N or N / 2 residual rows
layer_bytes() {  # R: the residual rows
    awk -v R=$1 'function take(b) { return int((b + 255) / 256) * 256 }
        BEGIN { N = 32; C = 32; Cl = 16; Fl = 64; x = 4
                s = take(R * C * x) + 2 * take(R * 4) + take(N * 3 * Cl * x) + take(N * Cl * x) + take(2 * 2 * 16 * 16 * x)
                s += take(R * C * x) + take(R * C * x) + 2 * take(R * 4) + 2 * take(N * Fl * x) + take(R * C * x)
                print s }'
}
./train_cpu --dry-run --dry-run-build cpu --world-size 2 $model --tensor-model-parallel-size 2 > $B/layer.plan 2>&1
want="activations of one layer for one micro-batch: $(layer_bytes 32) bytes (0.04 MiB); with --sequence-parallel $(layer_bytes 16) bytes"
if grep -qF "$want" $B/layer.plan; then
    ok "one layer's activations at TP 2: $(layer_bytes 32) bytes, $(layer_bytes 16) with --sequence-parallel (the residual rows halved)"
else bad "one layer's activations" "want '$want': $(grep -m1 '^activations of one layer' $B/layer.plan)"; fi

# the last line's fixed form: 4 micro-batches per pipeline over PP 2: bubble 1/5
./train_cpu --dry-run --world-size 8 $model --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
    --global-batch-size 16 > $B/last.plan 2>&1
if tail -1 $B/last.plan | grep -qE '^dry-run: world 8 TP 2 PP 2 DP 2 MBS 2 GBS 16: peak memory per GPU [0-9]+\.[0-9] GiB \(stage [01]\), step [0-9]+\.[0-9]+ s, [0-9]+\.[0-9] TFLOPs per GPU, bubble 20\.0%$'; then
    ok "the last line: world, layout, batch, peak memory and its stage, step, TFLOPs per GPU, the 1F1B bubble (p-1)/(m+p-1)"
else bad "the dry run's last line" "$(tail -1 $B/last.plan)"; fi

refused() {  # name needle flags...
    local name=$1 needle=$2; shift 2
    ./train_cpu "$@" > $B/refused.out 2>&1
    local status=$?
    if [ $status -eq 2 ] && [ "$(wc -l < $B/refused.out)" -eq 1 ] && grep -qF -- "$needle" $B/refused.out; then ok "$name"
    else bad "$name" "status $status: $(head -3 $B/refused.out)"; fi
}
refused "a dry run without data needs --vocab-size, in one line" "--dry-run reads no data: give --vocab-size" \
    --dry-run --num-layers 4
# with GPT-2's tokenizer the vocabulary is the tokenizer's, as in a run (the dry run once asked for --vocab-size)
./train_cpu --dry-run --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --tokenizer-type GPT2BPETokenizer \
    --vocab-file tests/data/gpt2/encoder.json --merge-file tests/data/gpt2/vocab.bpe > $B/tokenizer.plan 2>&1
if grep -q -- "--vocab-size 50257 " $B/tokenizer.plan && grep -q '^dry-run: world 1 ' $B/tokenizer.plan; then
    ok "a dry run with GPT-2's tokenizer plans its vocabulary, 50257"
else bad "a dry run with a tokenizer" "$(tail -2 $B/tokenizer.plan)"; fi
refused "a world size that TP x PP does not divide, in the trainer's line" \
    "world size 6 is not a multiple of --tensor-model-parallel-size 1 x --pipeline-model-parallel-size 4" \
    --dry-run --world-size 6 --pipeline-model-parallel-size 4 --vocab-size 100
refused "a global batch that MBS x DP does not divide, in the trainer's line" \
    "--global-batch-size 6 is not divisible by --micro-batch-size 2 x data-parallel size 2" \
    --dry-run --world-size 2 $model --global-batch-size 6
refused "--world-size other than the launched size, without --dry-run" "--world-size 4, but the job has 1 rank(s)" \
    --world-size 4 --data-path $data $model --train-iters 1
refused "--dry-run with --check-cluster, in one line" "give --dry-run or --check-cluster, not both" \
    --dry-run --check-cluster $model
refused "--dry-run-build without --dry-run, in one line" "--dry-run-build goes with --dry-run" \
    --dry-run-build cpu --data-path $data $model --train-iters 1
refused "--dry-run-build other than gpu or cpu, in one line" "--dry-run-build must be one of gpu | cpu" \
    --dry-run --dry-run-build tpu $model

# the first line names the build planned and its precision, whichever binary plans it
first_line() { ./train_cpu --dry-run --world-size 2 $model "$@" 2>&1 | head -1; }
if first_line | grep -q '^dry run: gridgpt GPU build planned (--dry-run-build), bf16 (fp32 master weights' &&
   first_line --fp16 | grep -q '^dry run: gridgpt GPU build planned (--dry-run-build), fp16 (fp32 master weights' &&
   first_line --dry-run-build cpu | grep -q '^dry run: gridgpt CPU build planned (--dry-run-build), fp32, world 2 '; then
    ok "the first line names the planned build: GPU bf16 by default, fp16 with --fp16, CPU fp32 with --dry-run-build cpu"
else bad "the first line names the planned build" "$(first_line) / $(first_line --fp16) / $(first_line --dry-run-build cpu)"; fi

# the GPU build's plan: 2-byte parameters, the fp32 master copy in the optimizer state (DP 1: no
# gradient shard); gradients are fp32 in both builds
./train_cpu --dry-run --world-size 1 $model > $B/gpu.plan 2>&1
./train_cpu --dry-run --world-size 1 $model --dry-run-build cpu > $B/cpu.plan 2>&1
read -r gp gg go ga gw gt <<< "$(bytes_by_stage $B/gpu.plan | sed -E 's/^0: //; s/\|//g')"
read -r cp cg co ca cw ct <<< "$(bytes_by_stage $B/cpu.plan | sed -E 's/^0: //; s/\|//g')"
if [ -n "${gt:-}" ] && [ -n "${ct:-}" ] && [ $((2 * gp)) -eq $cp ] && [ $gg -eq $cg ] && [ $((go * 2)) -eq $((co * 3)) ] &&
   [ $((gp + gg + go + ga + gw)) -eq $gt ] && [ $((cp + cg + co + ca + cw)) -eq $ct ]; then
    ok "the GPU plan's parameters are half the CPU plan's, its optimizer state 3/2 (the master copy), totals add up"
else bad "the GPU plan against the CPU plan" "gpu: $gp $gg $go $ga $gw $gt / cpu: $cp $cg $co $ca $cw $ct"; fi
