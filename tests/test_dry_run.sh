#!/usr/bin/env bash
# tests/test_dry_run.sh DATA_PREFIX — --dry-run predicts, to the byte, what the trainer allocates.
# For each layout and shape (GPT-2's, BLOOM's, Llama's), one process plans the CPU build's memory (./train_cpu --dry-run
# --dry-run-build cpu --world-size N) and the real trainer runs it for one step under mpirun -np N
# with --log-memory-bytes. Every rank's bytes (parameters, gradients, optimizer state,
# activations, workspaces, total) must equal its stage's planned line, and the total what
# dev_malloc really handed out. (The GPU build's plan, --dry-run-build gpu, is checked against
# the emulated GPU build's in tests/test_emu_train.sh.) Also: the last line's fixed form and
# bubble, the first line's planned build, the dry run's one-line refusals, and the CPU build's
# step priced on this machine within 2x of a real run's, on three shapes. Context parallelism:
# its layouts planned = reported = allocated, CP named in the start-up and dry-run lines, a long
# sequence's activations divided by CP, and a layout above the memory told the smallest CP that fits.
# 8-bit Adam (--use-bnb-optimizer): its layouts planned = reported = allocated, its GPU plan 6/DP.
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

compare() {  # name tp pp dp [flags...] (a --context-parallel-size among the flags multiplies the world)
    local name=$1 tp=$2 pp=$3 dp=$4; shift 4
    local cp=1 previous=
    for flag in "$@"; do [ "$previous" = --context-parallel-size ] && cp=$flag; previous=$flag; done
    local n=$((tp * cp * pp * dp)) layout="--tensor-model-parallel-size $tp --pipeline-model-parallel-size $pp"
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
compare dp4-distributed-optimizer 1 1 4 --global-batch-size 8
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
# context parallelism: T / CP rows a sequence, the attention's log-sum-exp kept (no probabilities),
# its scratch in the workspace (p2p: two blocks of keys and values, three of fp32 gradients;
# all_gather: CP of each), the optimizer's shard over DP x CP
compare cp2-ring 1 1 1 --context-parallel-size 2
compare cp4-ring-recompute 1 1 1 --context-parallel-size 4 --checkpoint-activations
compare cp4-all-gather 1 1 1 --context-parallel-size 4 --cp-comm-type all_gather
compare cp2-dp2-all-gather 1 1 2 --context-parallel-size 2 --cp-comm-type all_gather --global-batch-size 4
compare tp2-cp2-pp2 2 2 1 --context-parallel-size 2 --global-batch-size 4
compare llama-tp2-cp2-sequence-parallel 2 1 1 $llama --context-parallel-size 2 --sequence-parallel
# a mixture of experts with expert parallelism: a rank's experts (E / EP) in a region of the flat
# buffers padded over their expert-data-parallel group, the experts' rows laid out at the dropless
# worst case (EP x N x min(k, E / EP)) and the exchange's buffers
moe="--num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 24"
compare moe-ep2 1 1 2 $moe --expert-model-parallel-size 2
compare moe-ep2-dp4-recompute 1 1 4 $moe --expert-model-parallel-size 2 --recompute-activations --global-batch-size 8
# 8-bit Adam (--use-bnb-optimizer): each shard's moments a byte a parameter and a 4-byte scale a
# block of 2,048, the maps a workspace; each region padded to whole blocks a shard (DP 3: three
# shards of whole blocks), with experts each region's shard over its own group
compare dp3-bnb-8bit 1 1 3 --global-batch-size 6 --use-bnb-optimizer
compare moe-ep2-bnb-8bit 1 1 2 $moe --expert-model-parallel-size 2 --use-bnb-optimizer
# the start-up line and the dry run's name CP next to TP, as Megatron-LM orders the groups
if grep -q '^gridgpt CPU build, fp32, 8 rank(s) as TP 2 x CP 2 x PP 2 x DP 1, ' $B/tp2-cp2-pp2.run &&
   grep -q '^dry run: gridgpt CPU build planned (--dry-run-build), fp32, world 8 as TP 2 x CP 2 x PP 2 x DP 1: ' $B/tp2-cp2-pp2.plan &&
   grep -q '^dry-run: world 8 TP 2 CP 2 PP 2 DP 1 MBS 2 GBS 4: ' $B/tp2-cp2-pp2.plan &&
   grep -q ' rank(s) as TP 1 x PP 1 x DP 1, ' $B/one-rank.run; then
    ok "the start-up line and the dry run's name the grid TP 2 x CP 2 x PP 2 x DP 1 (CP only where there is context parallelism)"
else bad "CP in the start-up and dry-run lines" "$(grep -m1 'rank(s) as' $B/tp2-cp2-pp2.run) / $(grep -m1 '^dry run:' $B/tp2-cp2-pp2.plan)"; fi

# A long sequence (GPT-2 124M's shape at 8192 tokens, world 8): a rank's activations at CP 2 and 4
# are exactly a half and a quarter of CP 1's on the GPU build's plan (every buffer kept is a row's,
# the fused attention keeps a log-sum-exp a row either way, and a rank holds T / CP rows), and on
# the CPU build's far below a quarter (CP 1 keeps the T x T probabilities, CP the log-sum-exp).
long="--vocab-size 50257 --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 8192 --micro-batch-size 1
      --global-batch-size 8 --world-size 8"
activations() { sed -nE 's/^  planned \(stage 0\) in bytes: ([0-9]+) \| ([0-9]+) \| ([0-9]+) \| ([0-9]+) \| .*/\4/p' "$1"; }
for build in gpu cpu; do
    for cp in 1 2 4; do ./train_cpu --dry-run --dry-run-build $build $long --context-parallel-size $cp > $B/long-$build-cp$cp.plan 2>&1; done
done
g1=$(activations $B/long-gpu-cp1.plan) g2=$(activations $B/long-gpu-cp2.plan) g4=$(activations $B/long-gpu-cp4.plan)
c1=$(activations $B/long-cpu-cp1.plan) c4=$(activations $B/long-cpu-cp4.plan)
if [ -n "$g1" ] && [ -n "$c4" ] && [ $((2 * g2)) -eq "$g1" ] && [ $((4 * g4)) -eq "$g1" ] && [ $((4 * c4)) -lt "$c1" ]; then
    ok "8192 tokens: a rank's activations at CP 4 are a quarter of CP 1's on the GPU plan ($g4 against $g1 bytes; CP 2 a half), on the CPU plan $c4 against $c1 (no T x T probabilities)"
else bad "CP's activations" "GPU $g1 / $g2 / $g4, CPU $c1 / $c4"; fi

# Above the memory, the dry run names the smallest context-parallel size of the same world that
# fits: with room between CP 4's total and CP 2's (besides a reserve of 1 GiB), CP 4; with less than
# CP 8's, none.
total_of() { sed -nE 's/^  planned \(stage 0\) in bytes: .* \| ([0-9]+)$/\1/p' "$1"; }
./train_cpu --dry-run --dry-run-build gpu $long --context-parallel-size 8 > $B/long-gpu-cp8.plan 2>&1
room=$(awk -v a="$(total_of $B/long-gpu-cp4.plan)" -v b="$(total_of $B/long-gpu-cp2.plan)" 'BEGIN { printf "%.6f", 1 + (a + b) / 2 / 2^30 }')
tight=$(awk -v a="$(total_of $B/long-gpu-cp8.plan)" 'BEGIN { printf "%.6f", 1 + a / 2 / 2^30 }')
./train_cpu --dry-run --dry-run-build gpu $long --hw-memory-gib $room --hw-reserve-gib 1 > $B/long-fit.plan 2>&1
./train_cpu --dry-run --dry-run-build gpu $long --hw-memory-gib $room --hw-reserve-gib 1 --context-parallel-size 4 > $B/long-fit-cp4.plan 2>&1
./train_cpu --dry-run --dry-run-build gpu $long --hw-memory-gib $tight --hw-reserve-gib 1 > $B/long-none.plan 2>&1
fits=$(grep -m1 '^the smallest context parallelism that fits: ' $B/long-fit.plan)
own=$(tail -1 $B/long-fit-cp4.plan | sed -E 's/.*: peak/peak/; s/, bubble.*//')
if [[ "$fits" == "the smallest context parallelism that fits: --context-parallel-size 4 (TP 1 x CP 4 x PP 1 x DP 2): $own, bubble"* ]] &&
   tail -1 $B/long-fit.plan | grep -q ' OOM$' && ! tail -1 $B/long-fit-cp4.plan | grep -q OOM &&
   grep -q '^context parallelism: no --context-parallel-size above 1 fits world 8 at TP 1 and PP 1 ' $B/long-none.plan; then
    ok "above the memory at CP 1 ($room GiB), the dry run names CP 4 as the smallest that fits (CP 2 does not), with that layout's own plan; none under CP 8's total"
else bad "the smallest CP that fits" "'$fits' (own: '$own'); $(tail -1 $B/long-fit.plan); $(grep -m1 '^context parallelism: no' $B/long-none.plan)"; fi

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
refused "--hw with --dry-run-build cpu, in one line" "--hw names a GPU, but --dry-run-build cpu plans the CPU build" \
    --dry-run --dry-run-build cpu --hw h100-80gb $model

# the first line (below the start-up notes) names the build planned and its precision: train_cpu's
# own build by default, priced on this machine; the GPU build with --hw (or --dry-run-build gpu),
# fp16 with --fp16
first_line() { ./train_cpu --dry-run --world-size 2 $model "$@" 2>&1 | grep -v "^note: " | head -1; }
if first_line | grep -q '^dry run: gridgpt CPU build planned (--dry-run-build), fp32, world 2 ' &&
   first_line --hw a100-80gb | grep -q '^dry run: gridgpt GPU build planned (--dry-run-build), bf16 (fp32 master weights' &&
   first_line --dry-run-build gpu --fp16 | grep -q '^dry run: gridgpt GPU build planned (--dry-run-build), fp16 (fp32 master weights' &&
   first_line --dry-run-build cpu | grep -q '^dry run: gridgpt CPU build planned (--dry-run-build), fp32, world 2 '; then
    ok "the first line names the planned build: train_cpu's CPU fp32 by default, GPU bf16 with --hw, fp16 with --fp16"
else bad "the first line names the planned build" "$(first_line) / $(first_line --hw a100-80gb) / $(first_line --dry-run-build gpu --fp16)"; fi

# The distributed optimizer's model state (Megatron-LM's 6 + 12/DP bytes a parameter with 16-bit
# parameters and fp32 gradients, 8 + 8/DP in fp32): no gradient shard of its own, the DP
# reduce-scatter sums each rank's shard of the gradient buffer in place. At DP 4 the real CPU
# run's optimizer state is Adam's m and v of the shard alone, 8/4 bytes a parameter: half its
# gradients' (the buffer's 4 a parameter), where a gradient shard beside them made it 3/4; every
# rank's bytes add up to what dev_malloc handed out (compare above: planned = reported =
# allocated). The GPU build's plan at DP 4: 2 + 4 + 12/4 bytes a parameter, the master weights,
# m and v, its optimizer state 3/4 of the gradients' (a gradient shard made it 1). Each plan
# and run says so on its "model state:" line.
read -r p4 g4 o4 a4 w4 t4 <<< "$(bytes_by_stage $B/dp4-distributed-optimizer.run | head -1 | sed -E 's/^0: //; s/\|//g')"
allocated4=$(sed -nE 's/.*dev_malloc handed out ([0-9]+) bytes.*/\1/p' $B/dp4-distributed-optimizer.run | sort -u)
./train_cpu --dry-run --world-size 4 $model --global-batch-size 8 --dry-run-build gpu > $B/gpu-dp4.plan 2>&1
read -r q4 h4 r4 _ <<< "$(bytes_by_stage $B/gpu-dp4.plan | sed -E 's/^0: //; s/\|//g')"
state_cpu='model state: 10 bytes a parameter = 4 \(fp32 parameters\) \+ 4 \(fp32 gradients, each rank.s shard summed over DP in place\) \+ 8/4 .*8 \+ 8/DP$'
state_gpu='model state: 9 bytes a parameter = 2 \(16-bit parameters\) \+ 4 \(fp32 gradients, each rank.s shard summed over DP in place\) \+ 12/4 .*6 \+ 12/DP$'
if [ -n "${t4:-}" ] && [ -n "${r4:-}" ] && [ $((2 * o4)) -eq $g4 ] && [ $p4 -eq $g4 ] && [ "$allocated4" = "$t4" ] &&
   [ $((p4 + g4 + o4 + a4 + w4)) -eq $t4 ] && [ $((2 * q4)) -eq $h4 ] && [ $((4 * r4)) -eq $((3 * h4)) ] &&
   grep -qE "$state_cpu" $B/dp4-distributed-optimizer.run && grep -qE "$state_cpu" $B/dp4-distributed-optimizer.plan &&
   grep -qE "$state_gpu" $B/gpu-dp4.plan; then
    ok "DP 4, the distributed optimizer's memory: the CPU run allocates 8 + 8/4 bytes a parameter of model state ($o4 of optimizer state against $g4 of gradients: no gradient shard), the GPU plan 6 + 12/4, each saying so"
else bad "DP 4, the distributed optimizer's memory" "CPU run: $p4 $g4 $o4 $a4 $w4 $t4, allocated $allocated4; GPU plan: $q4 $h4 $r4; $(grep -h '^model state' $B/dp4-distributed-optimizer.run $B/gpu-dp4.plan | head -2)"; fi
# with 8-bit Adam the GPU plan's shard keeps 4 + 1 + 1 bytes a parameter (the master weights, m
# and v) and 8 a block of 2,048: 6/4, where 12/4 before; the flat buffers padded to 4 shards of
# whole blocks (data_parallel.h zero_shard_multiple): 2-byte parameters a multiple of 4 x 2,048,
# fewer than 4 x 2,048 more than 32-bit Adam's
./train_cpu --dry-run --world-size 4 $model --global-batch-size 8 --dry-run-build gpu --use-bnb-optimizer > $B/gpu-dp4-bnb.plan 2>&1
read -r q8 h8 r8 _ <<< "$(bytes_by_stage $B/gpu-dp4-bnb.plan | sed -E 's/^0: //; s/\|//g')"
shard8=$(( ${h8:-0} / 4 / 4 ))
if [ -n "${r8:-}" ] && [ "$r8" -eq $(( 6 * shard8 + 8 * ((shard8 + 2047) / 2048) )) ] &&
   [ $((q8 % (2 * 4 * 2048))) -eq 0 ] && [ "$q8" -ge "$q4" ] && [ "$q8" -lt $((q4 + 2 * 4 * 2048)) ] &&
   grep -qE 'model state: 7.5 bytes a parameter = 2 \(16-bit parameters\) .* \+ 6/4 \(the shard.s fp32 master weights, Adam.s m and v in 8 bits' $B/gpu-dp4-bnb.plan; then
    ok "DP 4 with --use-bnb-optimizer: the GPU plan's optimizer state 6 bytes a parameter of the shard + 8 a 2,048-block ($r8 bytes, 12/4's: $r4), 6 + 6/4 bytes a parameter of model state, saying so; the buffers 4 shards of whole blocks ($q8 bytes of parameters, 32-bit Adam's $q4)"
else bad "DP 4 with --use-bnb-optimizer, the GPU plan" "$q8 $h8 $r8 (shard $shard8); $(grep -h '^model state' $B/gpu-dp4-bnb.plan)"; fi

# the GPU build's plan: 2-byte parameters, the fp32 master copy in the optimizer state (no
# gradient shard at any DP); gradients are fp32 in both builds
./train_cpu --dry-run --world-size 1 $model --dry-run-build gpu > $B/gpu.plan 2>&1
./train_cpu --dry-run --world-size 1 $model --dry-run-build cpu > $B/cpu.plan 2>&1
read -r gp gg go ga gw gt <<< "$(bytes_by_stage $B/gpu.plan | sed -E 's/^0: //; s/\|//g')"
read -r cp cg co ca cw ct <<< "$(bytes_by_stage $B/cpu.plan | sed -E 's/^0: //; s/\|//g')"
if [ -n "${gt:-}" ] && [ -n "${ct:-}" ] && [ $((2 * gp)) -eq $cp ] && [ $gg -eq $cg ] && [ $((go * 2)) -eq $((co * 3)) ] &&
   [ $((gp + gg + go + ga + gw)) -eq $gt ] && [ $((cp + cg + co + ca + cw)) -eq $ct ]; then
    ok "the GPU plan's parameters are half the CPU plan's, its optimizer state 3/2 (the master copy), totals add up"
else bad "the GPU plan against the CPU plan" "gpu: $gp $gg $go $ga $gw $gt / cpu: $cp $cg $co $ca $cw $ct"; fi

# --- train_cpu's --dry-run prices this machine (hardware.h's this_machine): its step within 2x of
# the step a real run measures, on three shapes: the llama3-8B config's --tiny model on one rank
# (rope, RMSNorm, SwiGLU, 2 query groups; 8 micro-batches of 32 tokens), the gpt2-124M config's
# --tiny model on one rank (4 micro-batches of 2 x 32), make bench's small shape (4 layers of
# 256, 4 x 64 tokens). (This file's model, 0.3 ms a step, is left out: a step that short is
# measured between the scheduler's time slices, not through them.) The dry run measures the machine right before the run,
# with the run's one thread (OMP_NUM_THREADS=1 above) and under the same load (make test's other
# lane): each rate is the median of windows of 10-20 ms, preemptions included. The run's step is
# measured alike: the median of its log intervals after the first (which touches the arena
# first), each interval the mean of enough iterations to last 5 ms or more. 2x is the issue's
# bound: the cost model leaves out that the CPU's attention and GELU are C loops (about a tenth
# of the step at the third shape: make bench's kernel table), and the two measurements are a
# second apart, under a load that may change in between: make test's other lane starts and ends
# mpiruns of 8 ranks on the 2 cores. So a pair outside 2x is measured once more, dry run and
# run again, and the second pair decides (a plan that is not this machine's, an A100's at
# 46dfe3f, is 100x off both times).
priced_here() {  # name iterations log-interval flags...
    local first
    first=$(priced_pair "$@")
    case "$first" in
        PASS*) echo "$first" ;;
        *) priced_pair "$@" | sed "/^PASS/ s|\$| (the second pair; the first: ${first#FAIL })|" ;;
    esac
}
priced_pair() {  # name iterations log-interval flags...: one dry run, one run, the verdict
    local name=$1 iters=$2 interval=$3; shift 3
    ./train_cpu --dry-run "$@" > $B/$name.cpu.plan 2>&1
    ./train_cpu --data-path $data "$@" --train-iters $iters --eval-iters 0 --log-interval $interval > $B/$name.cpu.run 2>&1
    local planned measured
    planned=$(tail -1 $B/$name.cpu.plan | sed -nE 's/^dry-run: .*, step ([0-9.]+) s,.*/\1/p')
    measured=$(sed -nE 's/.*elapsed time per iteration \(ms\): ([0-9.]+) .*/\1/p' $B/$name.cpu.run | tail -n +2 | sort -g |
        awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) / 1000 }')
    if ! grep -q '^cost model (this machine, measured now' $B/$name.cpu.plan; then
        bad "$name: train_cpu --dry-run prices this machine" "$(grep -m1 '^cost model' $B/$name.cpu.plan | cut -c1-120)"
    elif [ -z "$planned" ] || [ -z "$measured" ]; then
        bad "$name: a planned and a measured step" "planned '$planned', measured '$measured': $(grep -m1 -i error $B/$name.cpu.run)"
    elif awk -v p="$planned" -v m="$measured" 'BEGIN { exit !(p <= 2 * m && m <= 2 * p) }'; then
        ok "$name: the CPU dry run's step $planned s is within 2x of the measured $measured s (median of $((iters / interval - 1)) intervals)"
    else bad "$name: the CPU dry run's step within 2x of the measured one" "planned $planned s, measured $measured s"; fi
}
priced_here llama-tiny-one-rank 10 2 --vocab-size 257 --num-layers 4 --hidden-size 64 --num-attention-heads 4 \
    --group-query-attention --num-query-groups 2 --ffn-hidden-size 224 --seq-length 32 --max-position-embeddings 32 \
    --position-embedding-type rope --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights \
    --disable-bias-linear --micro-batch-size 1 --global-batch-size 8
priced_here gpt2-tiny-one-rank 10 2 --vocab-size 257 --num-layers 4 --hidden-size 64 --num-attention-heads 4 \
    --ffn-hidden-size 256 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2 --global-batch-size 8
priced_here bench-small 5 1 --vocab-size 257 --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 64 \
    --micro-batch-size 4
