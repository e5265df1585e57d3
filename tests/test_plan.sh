#!/usr/bin/env bash
# tests/test_plan.sh DATA_PREFIX — the planner's communication, cost model and --sweep.
# - Each group's bytes per step that --dry-run predicts equal, to the byte, what --log-comm
#   counts in a real run of the same layout under mpirun (the busiest rank of each group).
# - The cost model's FLOPs equal the formulas written out here for GPT-2 124M; its times
#   follow its stated rules (a matmul at peak x efficiency, a kernel at memory bandwidth, a
#   collective by alpha-beta on NVLink or the network as the grid places the group).
# - --sweep lists every layout the rules allow (counted here independently), sorted, with the
#   same line a single dry run of that layout prints, OOM marked; refusals are one line.
set -u
data=${1:?usage: test_plan.sh DATA_PREFIX}
B=tests/build/plan
mkdir -p $B
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none"
ok() { echo "PASS $1"; }
bad() { echo "FAIL $1: $2"; }
# the trainer's CPU build against its own plan
PLAN="./train_cpu --dry-run --dry-run-build cpu"

model="--vocab-size 257 --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2"
comm_bytes() { grep -m1 'communication per step in bytes' "$1" | sed 's/.*bytes: //'; }

comm() {  # name tp pp dp [flags...]
    local name=$1 tp=$2 pp=$3 dp=$4; shift 4
    local n=$((tp * pp * dp)) layout="--tensor-model-parallel-size $tp --pipeline-model-parallel-size $pp"
    $PLAN --world-size $n $model $layout "$@" > $B/$name.plan 2>&1
    $MPIRUN -np $n ./train_cpu --data-path $data $model $layout "$@" --train-iters 1 --eval-iters 0 --log-comm \
        --log-interval 1 > $B/$name.run 2>&1
    local planned real
    planned=$(comm_bytes $B/$name.plan)
    real=$(comm_bytes $B/$name.run)
    if [ -z "$real" ]; then bad "$name: the real run logs its communication" "$(grep -m1 -i error $B/$name.run)"
    elif [ "$planned" != "$real" ]; then bad "$name: planned bytes per group = --log-comm's" "planned $planned, real $real"
    else ok "$name (world $n): bytes per step, tp | dp | pp | embedding, planned = counted: $real"; fi
}

comm tp2-pp2-dp2 2 2 2 --global-batch-size 8
comm tp4-ring-three-quarters 4 1 1 --micro-batch-size 1 --seq-length 32
comm dp3-padded-shard 1 1 3 --global-batch-size 6
comm pp4-uneven-embedding 1 4 1 --pp-partition-method 'type:transformer|embedding' --global-batch-size 8
comm tp2-pp2-recompute 2 2 1 --checkpoint-activations --global-batch-size 8
comm tp2-pp2-block-recompute 2 2 1 --recompute-granularity full --recompute-method block --recompute-num-layers 1 \
    --global-batch-size 12
comm bloom-tp2-pp2-dp2 2 2 2 --position-embedding-type alibi --embed-layernorm --global-batch-size 8
comm overlap-tp2-pp2-dp2 2 2 2 --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 600 --global-batch-size 8
comm overlap-dp3-padded-shard 1 1 3 --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 600 --global-batch-size 6

# --- the cost model on GPT-2 124M, 16 x 1024 per micro-batch, one GPU, explicit hardware
gpt2="--vocab-size 50257 --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --micro-batch-size 16"
hw="--hw h100-80gb --hw-peak-tflops 1000 --hw-matmul-efficiency 0.5 --hw-memory-bandwidth 2000"
./train_cpu --dry-run --world-size 1 $gpt2 $hw --attention-backend unfused > $B/gpt2.plan 2>&1
./train_cpu --dry-run --world-size 1 $gpt2 $hw > $B/gpt2-flash.plan 2>&1
# row NAME COLUMN: the cost table's column (1 launches, 2 GFLOP, 3 GB, 4 ms) of the row NAME
row() { grep -F "  $1 " $B/${3:-gpt2}.plan | head -1 | sed -E 's/^  .{44} //' | awk -F'|' -v c=$2 '{gsub(/[ %]/, "", $c); print $c}'; }
near() {  # a b relative-tolerance: both numbers, |a - b| <= tol x |b|
    [[ "$1" =~ ^[0-9.e+-]+$ && "$2" =~ ^[0-9.e+-]+$ ]] || return 1
    awk -v a="$1" -v b="$2" -v tol="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= tol * (b < 0 ? -b : b) + 1e-12) }'
}
# N = 16384 tokens, C = 768, F = 3072, V = 50304 (padded), T = 1024, 12 layers: forward + 2 x backward
linear=$(awk 'BEGIN { N = 16384; C = 768; F = 3072; printf "%.1f", 12 * 2 * N * C * (4 * C + 2 * F) / 1e9 }')
linear_backward=$(awk 'BEGIN { N = 16384; C = 768; F = 3072; printf "%.1f", 2 * 12 * 2 * N * C * (4 * C + 2 * F) / 1e9 }')
attention=$(awk 'BEGIN { printf "%.1f", 3 * 12 * 2 * 2 * 16 * 12 * 1024 * 1024 * 64 / 1e9 }')
logits=$(awk 'BEGIN { printf "%.1f", 3 * 2 * 16384 * 768 * 50304 / 1e9 }')
if [ "$(row 'linear layers forward (cuBLASLt epilogues)' 2)" = "$linear" ] &&
   [ "$(row 'linear layers backward (cuBLAS)' 2)" = "$linear_backward" ] &&
   [ "$(row 'attention T x T products (cuBLAS, batched)' 2)" = "$attention" ] &&
   [ "$(row 'logits (cuBLAS)' 2)" = "$logits" ]; then
    ok "124M: the matmuls' GFLOP per step = (1 + 2) x 2 N C (4C + 2F) L, 3 x 4 B H T^2 d L, 3 x 2 N C V ($linear + $linear_backward, $attention, $logits)"
else bad "124M matmul FLOPs" "expected $linear $linear_backward $attention $logits: $(grep -F cuBLAS $B/gpt2.plan | tr '\n' ' ')"; fi
# the fused attention (head size 64: auto takes it): 32 x 32 tiles at and below the diagonal,
# 528 pairs a head; 2 x 32^2 x 64 x 2 FLOPs a tile pair forward, 5 products backward; 16 x 12 heads
fused=$(awk 'BEGIN { printf "%.1f", 12 * (4096 + 8192 + 6144) * 64 * 192 * 528 / 1e9 }')
if [ "$(row 'attention, fused (WMMA tiles)' 2 gpt2-flash)" = "$fused" ] && [ "$(row 'attention, fused (WMMA tiles)' 1 gpt2-flash)" = 36 ] &&
   ! grep -q 'attention softmax' $B/gpt2-flash.plan; then
    ok "124M with the fused attention: $fused GFLOP of tile products in 36 launches, no softmax kernel"
else bad "the fused attention's costs" "expected $fused GFLOP: $(grep -F 'attention' $B/gpt2-flash.plan | tr '\n' ' ')"; fi
# a matmul takes FLOPs / (1000 TFLOP/s x 0.5): GFLOP / 500 ms; a kernel GB / 2000 GB/s: GB / 2 ms
ms=$(row 'linear layers backward (cuBLAS)' 4); expected=$(awk -v g="$linear_backward" 'BEGIN { print g / 500 }')
if near "$ms" "$expected" 0.002; then ok "a matmul's time is its FLOPs at peak x efficiency ($ms ms)"
else bad "matmul time" "$ms ms, expected $expected"; fi
gb=$(row 'attention softmax' 3); ms=$(row 'attention softmax' 4); expected=$(awk -v g="$gb" 'BEGIN { print g / 2 }')
if near "$ms" "$expected" 0.002; then ok "another kernel's time is its bytes at the memory bandwidth ($gb GB in $ms ms)"
else bad "kernel time" "$gb GB in $ms ms, expected $expected"; fi
# the softmax's bytes: P fp32 scores written and read 1.5 times forward, P bf16 written; backward
# datt fp32 written and read, att read, dscores written: P = 16 x 12 x 1024^2 per layer
expected=$(awk 'BEGIN { P = 16 * 12 * 1024 * 1024; printf "%.3f", 12 * (P * 4 + 1.5 * P * 4 + P * 2 + P * 4 + P * 2 + P * 4 + P * 2) / 1e9 }')
if [ "$(row 'attention softmax' 3)" = "$expected" ]; then ok "the softmax's bytes on the GPU build: bf16 probabilities, fp32 scores ($expected GB)"
else bad "softmax bytes" "$(row 'attention softmax' 3), expected $expected"; fi
# TFLOPs per GPU = the model FLOPs per step / step time / GPUs
flops=$(sed -nE 's/^model FLOPs per step: ([0-9.e+]+) .*/\1/p' $B/gpt2.plan)
last=$(tail -1 $B/gpt2.plan)
step=$(sed -nE 's/.*, step ([0-9.]+) s, ([0-9.]+) TFLOPs per GPU.*/\1/p' <<< "$last")
tflops=$(sed -nE 's/.*, step ([0-9.]+) s, ([0-9.]+) TFLOPs per GPU.*/\2/p' <<< "$last")
total_ms=$(grep -E '^  ' $B/gpt2.plan | grep -F '|' | grep -v 'planned' | awk -F'|' '{ s += $4 } END { print s }')
if [[ "$last" =~ ^dry-run:\ world\ 1\ TP\ 1\ PP\ 1\ DP\ 1\ MBS\ 16\ GBS\ 16:\ peak\ memory\ per\ GPU\ [0-9]+\.[0-9]\ GiB\ \(stage\ 0\),\ step\ [0-9.]+\ s,\ [0-9]+\.[0-9]\ TFLOPs\ per\ GPU,\ bubble\ 0\.0%$ ]] &&
   near "$tflops" "$(awk -v f="$flops" -v s="$step" 'BEGIN { print f / s / 1e12 }')" 0.02 && near "$step" "$(awk -v t="$total_ms" 'BEGIN { print t / 1000 }')" 0.02; then
    ok "the last line: step = the sum of the table's times with one stage ($step s), TFLOPs per GPU = FLOPs / step ($tflops)"
else bad "the last line" "$last (FLOPs $flops, table $total_ms ms)"; fi

# --- collectives: TP 4 inside a node of 8 runs on NVLink; with 2 GPUs per node it crosses the
# network: same bytes, alpha-beta time at the network's bandwidth
tp4="$gpt2 --tensor-model-parallel-size 4 --micro-batch-size 1 $hw --hw-nvlink-bandwidth 400 --hw-internode-bandwidth 20 --hw-latency-us 5"
./train_cpu --dry-run --world-size 4 $tp4 > $B/tp4.plan 2>&1
./train_cpu --dry-run --world-size 4 $tp4 --hw-gpus-per-node 2 > $B/tp4-two-nodes.plan 2>&1
launches=$(row 'tensor-parallel all-reduce' 1 tp4); gb=$(row 'tensor-parallel all-reduce' 3 tp4)
inside=$(row 'tensor-parallel all-reduce' 4 tp4); across=$(row 'tensor-parallel all-reduce' 4 tp4-two-nodes)
# each all-reduce: 2 (4 - 1) steps of 5 us + its bytes at 400 (or 20) GB/s; 12 layers x 4 + 1 + 3
expect_in=$(awk -v n="$launches" -v g="$gb" 'BEGIN { print n * 6 * 5e-3 + g / 400 * 1e3 }')
expect_across=$(awk -v n="$launches" -v g="$gb" 'BEGIN { print n * 6 * 5e-3 + g / 20 * 1e3 }')
if [ "$launches" = 52 ] && near "$inside" "$expect_in" 0.01 && near "$across" "$expect_across" 0.01; then
    ok "TP 4's 52 all-reduces: alpha-beta on NVLink inside a node ($inside ms), on the network across two ($across ms)"
else bad "TP 4's all-reduces" "$inside / $across ms, expected $expect_in / $expect_across ($launches launches, $gb GB)"; fi

# the bubble: PP 4 with 4 micro-batches is (m + p - 1) = 7 slots of the slowest stage
./train_cpu --dry-run --world-size 4 $gpt2 --micro-batch-size 1 --global-batch-size 4 --pipeline-model-parallel-size 4 \
    $hw > $B/pp4.plan 2>&1
if grep -qE '^step = \(m \+ p - 1\) x .* = 7 x ' $B/pp4.plan && tail -1 $B/pp4.plan | grep -q 'bubble 42\.9%$'; then
    ok "PP 4, 4 micro-batches: 7 slots of the slowest stage, bubble 3/7"
else bad "the bubble" "$(grep '^step' $B/pp4.plan); $(tail -1 $B/pp4.plan)"; fi

# the other side of recomputation: the plan's line for it = that layout's own dry run
pp4="$gpt2 --micro-batch-size 1 --global-batch-size 4 --pipeline-model-parallel-size 4 $hw"
alternative=$(grep '^with every layer recomputed' $B/pp4.plan | sed 's/.*: peak/peak/')
own=$(./train_cpu --dry-run --world-size 4 $pp4 --checkpoint-activations 2>&1 | tail -1 | sed -E 's/.*: peak/peak/; s/, bubble.*//')
back=$(./train_cpu --dry-run --world-size 4 $pp4 --checkpoint-activations 2>&1 | grep '^without activation recomputation' | sed 's/.*: peak/peak/')
plain=$(tail -1 $B/pp4.plan | sed -E 's/.*: peak/peak/; s/, bubble.*//')
if [ -n "$alternative" ] && [ "$alternative" = "$own" ] && [ "$back" = "$plain" ]; then
    ok "recomputation the other way round: the plan's line = that layout's own dry run, both ways ($alternative)"
else bad "recomputation's other side" "'$alternative' vs '$own'; '$back' vs '$plain'"; fi

# --- the two DP overlaps on GPT-2 124M over 2 nodes of 8 (DP 16 over the network at 20 GB/s).
# --overlap-grad-reduce: the buckets' total is one chain reduce per (bucket, shard) part:
# (16 - 1) latencies and its bytes at the DP link, which adds up to the whole fp32 buffer's
# bytes / 20 GB/s and 15 x 5 us per part; one bucket of every layer (a bucket size beyond the
# model) cannot start before the backward ends: nothing hidden. --overlap-param-gather: the
# same buckets, a chain broadcast per part, the whole bf16 buffer / 20 GB/s and the same
# latencies; with one bucket of every layer the next forward waits for it all before its
# first layer: nothing hidden. For both the exposed row and the hidden part add up to the
# total, the bytes are the collective's they replace, and the step shrinks.
dp16="$gpt2 --global-batch-size 256 $hw --hw-internode-bandwidth 20 --hw-latency-us 5"
./train_cpu --dry-run --world-size 16 $dp16 > $B/dp16.plan 2>&1
dp_overlap_cost() {  # FLAG ROW WHAT REPLACED-ROW
    local flag=$1 r=$2 what=$3 replaced=$4 name=${1#--}
    ./train_cpu --dry-run --world-size 16 $dp16 $flag > $B/dp16-$name.plan 2>&1
    ./train_cpu --dry-run --world-size 16 $dp16 $flag --ddp-bucket-size 1000000000 > $B/dp16-$name-one.plan 2>&1
    ms() { sed -nE "s/^$flag on stage 0: its bucketed $what take ([0-9.]+) ms, ([0-9.]+) ms of them hidden.*/\\$2/p" $B/$1.plan; }
    local parts=$(row "$r" 1 dp16-$name) exposed=$(row "$r" 4 dp16-$name) total=$(ms dp16-$name 1) hidden=$(ms dp16-$name 2)
    local gb=$(row "$replaced" 3 dp16)
    local expected=$(awk -v g="$gb" -v n="$parts" 'BEGIN { print g * 16 / 15 / 20 * 1e3 + n * 15 * 5e-3 }')   # the whole buffer
    if [ -n "$total" ] && near "$total" "$expected" 0.01 && near "$(awk -v e="$exposed" -v h="$hidden" 'BEGIN { print e + h }')" "$total" 0.01 &&
       [ "$(row "$r" 3 dp16-$name)" = "$gb" ] && awk -v h="$hidden" 'BEGIN { exit !(h > 0) }' && [ "$(ms dp16-$name-one 2)" = "0.000" ] &&
       awk -v a="$(tail -1 $B/dp16-$name.plan | sed -nE 's/.*step ([0-9.]+) s.*/\1/p')" \
           -v b="$(tail -1 $B/dp16.plan | sed -nE 's/.*step ([0-9.]+) s.*/\1/p')" 'BEGIN { exit !(a < b) }'; then
        ok "$flag on DP 16: $parts $what take $total ms (the buffer at the link + latencies), $hidden ms hidden, $exposed ms exposed; one bucket hides nothing; the step shrinks"
    else bad "$flag's cost" "total $total (expected $expected), hidden $hidden, exposed $exposed, $parts parts; one bucket: $(ms dp16-$name-one 2) hidden"; fi
}
dp_overlap_cost --overlap-grad-reduce 'ZeRO gradient reduce, buckets: exposed' reduces 'ZeRO reduce-scatter'
dp_overlap_cost --overlap-param-gather 'ZeRO all-gather, buckets: exposed' broadcasts 'ZeRO all-gather'

# --- tests/fit_matmul_efficiency.sh (bench_gpu.sh's fit of the one constant to a measured step):
# given the step the planner prices at efficiency 0.37 on one GPU, it finds 0.37 again; a step
# faster than any efficiency could make it is said to be out of reach, not fitted.
one_gpu="--world-size 1 $gpt2 --global-batch-size 16 $hw"
at37=$(./train_cpu --dry-run $one_gpu --hw-matmul-efficiency 0.37 2>&1 |
    sed -nE 's/^step = .* = ([0-9]+) x ([0-9.e+-]+) s \+ ([0-9.e+-]+) s$/\1 \2 \3/p' | awk '{ printf "%.9g\n", 1e3 * ($1 * $2 + $3) }')
fit=$(bash tests/fit_matmul_efficiency.sh "$at37" $one_gpu)
beyond=$(bash tests/fit_matmul_efficiency.sh 1 $one_gpu)
if [ -n "$at37" ] && [ "$fit" = "0.370" ] && [[ "$beyond" == "no matmul efficiency in [0.01, 1] gives 1 ms"* ]]; then
    ok "fit_matmul_efficiency: the planner's step at efficiency 0.37 ($at37 ms) fits back to $fit; 1 ms is out of reach"
else bad "fit_matmul_efficiency" "step at 0.37: '$at37' ms, fitted '$fit'; 1 ms: '$beyond'"; fi

# --- --sweep: world 8 of a model with 4 heads, FFN 128, 4 layers, global batch 8
sweep_model="--vocab-size 257 --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --global-batch-size 8"
./train_cpu --dry-run --sweep --world-size 8 $sweep_model > $B/sweep.out 2>&1
status=$?
# counted here: TP | 4 heads and 128, PP | 4 layers (uniform), MBS | 8 / DP
expected=0
for tp in 1 2 4 8; do for pp in 1 2 4 8; do
    [ $((8 % (tp * pp))) -eq 0 ] || continue
    dp=$((8 / (tp * pp)))
    for mbs in 1 2 3 4 5 6 7 8; do
        [ $((4 % tp)) -eq 0 ] && [ $((128 % tp)) -eq 0 ] && [ $((4 % pp)) -eq 0 ] && [ $((8 % (mbs * dp))) -eq 0 ] &&
            expected=$((expected + 1))
    done
done; done
lines=$(grep -c '^dry-run: ' $B/sweep.out)
sorted=$(grep '^dry-run: ' $B/sweep.out | sed -E 's/.*, step ([0-9.]+) s,.*/\1/' | sort -g -c 2>&1 && echo yes)
if [ $status -eq 0 ] && [ "$lines" -eq "$expected" ] && [ "$sorted" = yes ] && grep -q "^sweep: $expected layout(s) of world 8" $B/sweep.out; then
    ok "--sweep: all $expected layouts the model and batch allow at world 8, fastest first"
else bad "--sweep" "status $status, $lines lines (expected $expected), sorted: $sorted; $(head -2 $B/sweep.out)"; fi
# a sweep's line is the single dry run's last line of that layout
line=$(grep -m1 'TP 2 PP 2 DP 2 MBS 2 ' $B/sweep.out)
single=$(./train_cpu --dry-run --world-size 8 $sweep_model --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
    --micro-batch-size 2 2>&1 | tail -1)
if [ -n "$line" ] && [ "$line" = "$single" ]; then ok "a sweep's line = that layout's own dry run"
else bad "a sweep's line" "sweep: $line / single: $single"; fi
# above the memory: OOM marked, after those that fit
./train_cpu --dry-run --sweep --world-size 8 $sweep_model --hw-memory-gib 0.00001 --hw-reserve-gib 0.0000001 > $B/sweep-oom.out 2>&1
if [ "$(grep -c ' OOM$' $B/sweep-oom.out)" -eq "$expected" ] && grep -q "(0 fit, $expected above memory: OOM)" $B/sweep-oom.out; then
    ok "--sweep marks every layout above --hw-memory-gib OOM"
else bad "--sweep OOM" "$(head -3 $B/sweep-oom.out)"; fi

refused() {  # name needle flags...
    local name=$1 needle=$2; shift 2
    ./train_cpu "$@" > $B/refused.out 2>&1
    local status=$?
    if [ $status -eq 2 ] && [ "$(wc -l < $B/refused.out)" -eq 1 ] && grep -qF -- "$needle" $B/refused.out; then ok "$name"
    else bad "$name" "status $status: $(head -3 $B/refused.out)"; fi
}
refused "--sweep without --dry-run, in one line" "--sweep goes with --dry-run" --sweep --vocab-size 100 --data-path x
refused "--sweep without a global batch, in one line" "--sweep needs --global-batch-size" --dry-run --sweep --vocab-size 100
refused "an unknown --hw, in one line" "--hw must be one of v100-32gb | a100-40gb | a100-80gb | h100-80gb" \
    --dry-run --vocab-size 100 --hw tpu
refused "a negative --hw-latency-us, in one line" "--hw-latency-us must be at least 0" --dry-run --vocab-size 100 --hw-latency-us -1
refused "--hw without --dry-run, in one line" "--hw and --hw-* describe the cluster a --dry-run prices its step on" \
    --hw v100-32gb --vocab-size 100 --data-path x
refused "an --hw-* number without --dry-run, in one line" "--hw and --hw-* describe the cluster" \
    --hw-gpus-per-node 4 --vocab-size 100 --data-path x
