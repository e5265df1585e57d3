#!/usr/bin/env bash
# tests/test_context_parallel.sh DATA_PREFIX — context parallelism (issue 49) trains like one process.
# Each sequence cut into 2 CP chunks, rank i holding chunks i and 2 CP - 1 - i, the attention's
# keys and values round a ring (--cp-comm-type p2p) or gathered (all_gather): test_parallel.sh's
# tiny model and 22 steps (ramp-up, accumulation, dropout 0.1 on) under CP 2 and 4 alone, with
# TP 2 and sequence parallelism, with the interleaved pipeline, with DP 2 and ZeRO-1 over DP x CP,
# learned positions, ALiBi and Llama's shape (rope, grouped-query attention): losses and grad
# norms at every step and the final weights within 1e-5 of one process (test_parallel --compare).
# Recomputation (full and selective) gives the same bits; a checkpoint saved at CP 2 resumes at
# CP 1 and one saved at CP 1 resumes at CP 4; evaluation and generation on a CP grid give one
# process's loss and tokens; the flags' errors are one line each.
set -u
data=${1:?usage: test_context_parallel.sh DATA_PREFIX}
B=tests/build/context_parallel
source tests/layouts_common.sh   # MPIRUN, REC, ok, bad, the tiny model's flags

record() {  # name tp cp pp dp [extra flags]
    local name=$1 tp=$2 cp=$3 pp=$4 dp=$5; shift 5
    $MPIRUN -np $((tp * cp * pp * dp)) $REC $B/$name $flags --tensor-model-parallel-size $tp --context-parallel-size $cp \
        --pipeline-model-parallel-size $pp "$@" > $B/$name.log 2>&1 || bad "$name run" "exit status $?: $(grep -m1 error $B/$name.log)"
    grep -E '^(PASS|FAIL)' $B/$name.log | sed "s/^\(PASS\|FAIL\) /\1 $name: /"
}
against() {  # ref name label tp cp pp dp [flags]
    local ref=$1 name=$2 label=$3; shift 3
    record $name "$@"
    $REC --compare $B/$ref $B/$name "$label" $flags | grep -E '^(PASS|FAIL)'
}
same_bits() {  # label run recomputed-run
    if cmp -s $B/$2.steps $B/$3.steps && [ "$(wc -l < $B/$2.steps)" -ge 20 ] &&
       cmp -s $B/$2.ckpt/iter_0000022/tensors.bin $B/$3.ckpt/iter_0000022/tensors.bin; then
        ok "$1: bit-identical losses, grad norms, weights and optimizer state"
    else bad "$1" "the recordings differ from the run without recomputation"; fi
}

# learned positions (each rank adds its rows' global positions), the GPT-2 shape
record ref 1 1 1 1
against ref cp2 "CP 2 (p2p)" 1 2 1 1
against ref cp4-ag "CP 4 (all_gather)" 1 4 1 1 --cp-comm-type all_gather
against ref tp2-cp2-sp "(TP 2, CP 2) --sequence-parallel" 2 2 1 1 --sequence-parallel
against ref cp2-pp2-interleaved "(CP 2, PP 2) interleaved" 1 2 2 1 --num-layers-per-virtual-pipeline-stage 1
against ref tp2-cp2-dp2-sp "(TP 2, CP 2, DP 2) --sequence-parallel, ZeRO-1 over DP x CP, overlapped" 2 2 1 2 \
    --sequence-parallel --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 600
# recomputation re-runs the ring (or the gather): the same bits
record cp2-full 1 2 1 1 --recompute-granularity full --recompute-method uniform --recompute-num-layers 2
same_bits "CP 2 with full recomputation" cp2 cp2-full
record cp4-ag-selective 1 4 1 1 --cp-comm-type all_gather --recompute-activations
same_bits "CP 4 (all_gather) with selective recomputation (nothing to recompute: no probabilities kept)" cp4-ag cp4-ag-selective

# ALiBi (the slope times the global distance) and Llama's shape (rope at the global positions,
# RMSNorm, SwiGLU, 8 query heads in 4 groups: only the 4 key/value heads travel)
learned=$flags
flags="${learned/--hidden-size 32 --num-attention-heads 4/--hidden-size 48 --num-attention-heads 12} --position-embedding-type alibi --embed-layernorm"
record bloom-ref 1 1 1 1
against bloom-ref bloom-cp2-ag "ALiBi CP 2 (all_gather)" 1 2 1 1 --cp-comm-type all_gather
flags="${learned/--hidden-size 32 --num-attention-heads 4/--hidden-size 32 --num-attention-heads 8} --group-query-attention
       --num-query-groups 4 --position-embedding-type rope --rotary-percent 0.5 --normalization RMSNorm --norm-epsilon 1e-6
       --swiglu --ffn-hidden-size 48 --untie-embeddings-and-output-weights --disable-bias-linear"
record llama-ref 1 1 1 1
against llama-ref llama-cp4 "Llama CP 4 (p2p)" 1 4 1 1
against llama-ref llama-cp2-ag "Llama CP 2 (all_gather)" 1 2 1 1 --cp-comm-type all_gather
against llama-ref llama-tp2-cp2-dp2 "Llama (TP 2, CP 2, DP 2) --sequence-parallel" 2 2 1 2 --sequence-parallel
flags=$learned

# the bytes the ring sends: per layer and micro-batch, forward CP - 1 blocks of keys and values
# (B 2 x T/CP 8 rows x keys and values of 4 heads of 8 dims, fp32 on this build), backward CP - 1
# again and CP fp32 partial sums of their gradients: at CP 2, 4 layers, 8 micro-batches a step of
# 16 samples (MBS 2), the last step's
sent=$(awk '$1 == "comm_cp" { print $2 }' $B/cp2.info 2>/dev/null)
block=$((2 * 8 * 2 * 4 * 8 * 4))
want=$(( (1 + 1 + 2) * block * 4 * 8 ))
if [ "$sent" = "$want" ]; then ok "CP 2's ring sends $want bytes a step: 4 blocks of $block bytes per layer and micro-batch"
else bad "the ring's bytes" "measured '$sent', expected $want ($(grep -m1 comm $B/cp2.info))"; fi

# checkpoints stay layout-free: saved at CP 2, resumed at CP 1; saved at CP 1, resumed at CP 4
worst() { awk 'NR == FNR { l[$1] = $2; g[$1] = $3; next } ($1 in l) { n++
    d = ($2 - l[$1]) / l[$1]; if (d < 0) d = -d; if (d > w) w = d
    d = ($3 - g[$1]) / g[$1]; if (d < 0) d = -d; if (d > w) w = d } END { printf "%d %.3g\n", n, w }' "$1" "$2"; }
resume() {  # label saved-name saved-cp resumed-cp [flags]
    local label=$1 first=$2 cp_first=$3 cp_then=$4; shift 4
    record $first 1 $cp_first 1 1 --exit-interval 10 "$@"
    record $first-then 1 $cp_then 1 1 --load $B/$first.ckpt "$@"
    read n w <<< "$(worst $B/ref.steps $B/$first-then.steps)"
    if [ "$n" -ge 10 ] && awk -v w="$w" 'BEGIN { exit !(w <= 1e-5) }'; then
        ok "$label: the resumed steps within 1e-5 of one process (worst $w over $n steps)"
    else bad "$label" "$n steps compared, worst relative difference $w"; fi
}
resume "saved at CP 2, resumed at CP 1" save-cp2 2 1
resume "saved at CP 1, resumed at CP 4 (all_gather)" save-cp1 1 4 --cp-comm-type all_gather

# evaluation and generation from a checkpoint on a CP grid: one process's loss and tokens (each
# context-parallel rank decodes the whole sequence: a decode step's rows are too few to split)
gen="--skip-train --load $B/cp2.ckpt --generate-prompt-ids 7,12,5 --generate-tokens 12 --temperature 0.9 --generate-seed 3"
./train_cpu $flags $gen > $B/gen1.log 2>&1
$MPIRUN -np 4 ./train_cpu $flags $gen --context-parallel-size 2 --tensor-model-parallel-size 2 > $B/gen4.log 2>&1
pick() { grep -E "validation loss|^---------- sample" -A1 "$1" | grep -vE "^--$"; }
if [ -n "$(pick $B/gen1.log)" ] && [ "$(pick $B/gen1.log)" = "$(pick $B/gen4.log)" ]; then
    ok "evaluation and sampling at (TP 2, CP 2): one process's validation loss and tokens"
else bad "evaluation and generation on a CP grid" "$(diff <(pick $B/gen1.log) <(pick $B/gen4.log) | head -4)"; fi

# a failure on a context-parallel rank ends the job naming it, its host and its coordinates (CP
# among them); a rank frozen in the middle of the ring is named by the watchdog, the others
# waiting in the ring's transfer of the context-parallel group
host=$(hostname)
timeout 120 $MPIRUN -np 4 $REC --fail-rank 3 $B/failing $flags --tensor-model-parallel-size 2 --context-parallel-size 2 \
    > $B/failing.log 2>&1
status=$?
if [ $status -ne 0 ] && [ $status -ne 124 ] && grep -qF "rank 3 on $host TP(1)-CP(1)-PP(0)-DP(0)-Rank(3)" $B/failing.log; then
    ok "a failing rank of a (TP 2, CP 2) job ends the whole job with its rank, host and coordinates (status $status)"
else bad "a failing context-parallel rank" "status $status (124 = hung): $(grep -m1 error $B/failing.log)"; fi
timeout 120 $MPIRUN -x GRIDGPT_TEST_HANG_RANK=1 -x GRIDGPT_TEST_HANG_ITERATION=3 -np 2 ./train_cpu $flags \
    --context-parallel-size 2 --watchdog-timeout 5 > $B/hang.out 2> $B/hang.err
status=$?
summary=$(grep "^error: watchdog summary:" $B/hang.err)
if [ $status -ne 0 ] && [ $status -ne 124 ] && [[ "$summary" =~ "rank 1 on $host pid "[0-9]+" TP(0)-CP(1)-PP(0)-DP(0)-Rank(1) (iteration 3" ]] &&
   grep -q "rank 0 on $host pid [0-9]* TP(0)-CP(0)-PP(0)-DP(0)-Rank(0)\] watchdog: .*waiting in ring send and receive with rank 1 (context-parallel group)" $B/hang.err; then
    ok "a context-parallel rank frozen at iteration 3: the watchdog ends the job (status $status), rank 0 waiting in the ring's transfer, the summary naming rank 1"
else bad "a frozen context-parallel rank" "status $status: $(head -c 300 <<< "$summary") / $(grep -m1 'rank 0 on' $B/hang.err | head -c 300)"; fi

# --full-validation on a CP grid: each rank's rows counted at their positions in the window
full="--skip-train --load $B/cp2.ckpt --full-validation"
./train_cpu $flags $full > $B/full1.log 2>&1
$MPIRUN -np 4 ./train_cpu $flags $full --context-parallel-size 4 > $B/full4.log 2>&1
pick_full() { grep -E "^full validation|validation loss at" "$1"; }
if [ -n "$(pick_full $B/full1.log)" ] && [ "$(pick_full $B/full1.log)" = "$(pick_full $B/full4.log)" ]; then
    ok "--full-validation at CP 4: one process's token count and loss"
else bad "--full-validation at CP 4" "$(diff <(pick_full $B/full1.log) <(pick_full $B/full4.log) | head -4)"; fi

# A sequence too long for a memory limit at CP 1 trains at CP 4. 4096 tokens of 4 heads: one
# process would keep 0.53 GiB of activations (the attention's probabilities, T^2 a head); at CP 4
# a rank keeps no probabilities and a quarter of the rows. The limit is the address space
# (ulimit -v) the trainer's memory check reads: this machine's baseline (what a process maps
# before the check, found from a refusal's "leaves N GiB") plus 0.25 GiB. One process is refused
# in one line naming the limit and CP; four train, each rank's peak resident memory measured.
long="--data-path $data --vocab-size 257 --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 4096
      --micro-batch-size 1 --global-batch-size 1 --train-iters 2 --lr 1e-3 --split 90,10,0 --eval-iters 0 --log-interval 1"
probe=500000   # KiB
left=$( (ulimit -v $probe; ./train_cpu $long 2>&1) | sed -nE 's/.*address-space limit \(ulimit -v, RLIMIT_AS\) leaves ([0-9.]+) GiB.*/\1/p')
if [ -n "$left" ]; then
    limit=$(awk -v p=$probe -v l="$left" 'BEGIN { printf "%d", p - l * 1048576 + 262144 }')
    (ulimit -v $limit; ./train_cpu $long > $B/long1.out 2> $B/long1.err)
    status1=$?
    # each rank's peak into a file of its own (lines written to one stream by four ranks interleave)
    peak='import os, resource, subprocess, sys; r = subprocess.run(sys.argv[1:]).returncode; open(os.environ["PEAK_DIR"] + "/peak." + os.environ["OMPI_COMM_WORLD_RANK"], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) + "\n"); sys.exit(r)'
    rm -f $B/peak.*
    (ulimit -v $limit; $MPIRUN -x PEAK_DIR=$B -np 4 python3 -c "$peak" ./train_cpu $long --context-parallel-size 4 > $B/long4.out 2> $B/long4.err)
    status4=$?
    peaks=$(cat $B/peak.* 2> /dev/null | sort -n | tr '\n' ' ')
    most=$(echo $peaks | tr ' ' '\n' | tail -1)
    if [ $status1 -eq 2 ] && grep -q "address-space limit (ulimit -v, RLIMIT_AS).*--context-parallel-size divides" $B/long1.err &&
       [ $status4 -eq 0 ] && [ "$(echo $peaks | wc -w)" -eq 4 ] && [ "$most" -lt 262144 ] &&
       grep -q "^summary: 2 iterations" $B/long4.out; then
        ok "4096 tokens under ulimit -v $limit KiB: refused at CP 1 (activations 0.53 GiB), trained at CP 4 (peak resident per rank, KiB: $peaks)"
    else bad "a sequence that fits only with CP" "CP 1 status $status1 ($(head -c 200 $B/long1.err)), CP 4 status $status4, peaks '$peaks': $(grep -m1 -i error $B/long4.err)"; fi
else bad "a sequence that fits only with CP" "no refusal under ulimit -v $probe to measure the baseline from"; fi

# one line for each wrong grid
refused() {  # label np expected-text flags...
    local label=$1 np=$2 want=$3; shift 3
    $MPIRUN -np $np ./train_cpu $flags --train-iters 1 "$@" > $B/refused.out 2> $B/refused.err
    local status=$? lines
    lines=$(grep -c "^error" $B/refused.err)
    if [ $status -eq 2 ] && [ "$lines" -ge 1 ] && grep -q -- "$want" $B/refused.err; then ok "refused: $label"
    else bad "refused: $label" "status $status: $(head -c 300 $B/refused.err)"; fi
}
refused "a sequence that does not cut into 2 CP chunks" 3 "is not divisible by 2 x --context-parallel-size 3" \
    --context-parallel-size 3
refused "a world that CP does not divide" 3 "x --context-parallel-size 2" --context-parallel-size 2
refused "--cp-comm-type a2a" 2 "a2a (Ulysses" --context-parallel-size 2 --cp-comm-type a2a
exit 0
