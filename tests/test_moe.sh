#!/usr/bin/env bash
# tests/test_moe.sh DATA_PREFIX — a mixture of experts (issue 50) trains like one process.
# test_parallel.sh's tiny model and 22 steps (ramp-up, accumulation, dropout 0.1 on), its MLPs
# replaced by 4 experts, top 2, the load-balancing and z losses on: Mixtral's router with GELU
# experts and biases, then Qwen2-MoE's (the softmax before the top-k, a shared expert, SwiGLU, no
# biases) every other layer; under DP 2 and 4 (ZeRO-1, the overlapped reduce), PP 2 (interleaved
# too), CP 2 and 4 (the tokens per expert summed over the sequence's ranks), expert parallelism
# (EP 2 and 4 with DP, CP, PP and the overlaps): losses, grad norms and final weights within 1e-5
# of one process (test_parallel --compare); full recomputation the same bits; a checkpoint saved
# at EP 2 resumed at EP 4; sampling at EP 2 one process's tokens; the MoE losses in the log line;
# an expert capacity (Megatron-Core's token dropping, both drop policies) the same under PP 2 and
# DP 2 x EP 2 and with full recomputation, its dropped choices in the log line, and gridgpt's drops
# against Megatron-Core's rule written in torch (tests/moe_capacity.py); the refusals in one line
# each. The GPU path's MoE layer (emulated) is held to train_cpu within bf16's tolerance.
set -u
data=${1:?usage: test_moe.sh DATA_PREFIX}
B=tests/build/moe
source tests/layouts_common.sh   # MPIRUN, REC, ok, bad, the tiny model's flags
flags="$flags --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48 --moe-aux-loss-coeff 0.01 --moe-z-loss-coeff 0.001"

# one process runs without mpirun (parallel.h's start_alone_quickly: mpirun's start is seconds here)
launch() { [ $1 -eq 1 ] && echo "" || echo "$MPIRUN -np $1"; }
record() {  # name cp pp dp [extra flags]
    local name=$1 cp=$2 pp=$3 dp=$4; shift 4
    $(launch $((cp * pp * dp))) $REC $B/$name $flags --context-parallel-size $cp --pipeline-model-parallel-size $pp "$@" \
        > $B/$name.log 2>&1 || bad "$name run" "exit status $?: $(grep -m1 error $B/$name.log)"
    grep -E '^FAIL' $B/$name.log | sed "s/^FAIL /FAIL $name: /"
}
against() {  # ref name label cp pp dp [flags]
    local ref=$1 name=$2 label=$3; shift 3
    record $name "$@"
    $REC --compare $B/$ref $B/$name "$label" $flags | grep -E '^(PASS|FAIL)'
}

# Mixtral's router (the softmax over the k chosen), GELU experts with biases, every layer
record ref 1 1 1
against ref dp2 "MoE (Mixtral's router) DP 2" 1 1 2
against ref dp4-overlap "MoE DP 4, the overlapped reduce and gather" 1 1 4 --overlap-grad-reduce --overlap-param-gather \
    --ddp-bucket-size 600
against ref pp2 "MoE PP 2" 1 2 1
against ref pp2-dp2-interleaved "MoE (PP 2, DP 2) interleaved" 1 2 2 --num-layers-per-virtual-pipeline-stage 1
against ref cp2 "MoE CP 2 (the tokens per expert over the sequence)" 2 1 1
against ref cp2-dp2 "MoE (CP 2, DP 2)" 2 1 2 --cp-comm-type all_gather
record recompute 1 1 1 --recompute-granularity full --recompute-method uniform --recompute-num-layers 2
if cmp -s $B/ref.steps $B/recompute.steps && cmp -s $B/ref.ckpt/iter_0000022/tensors.bin $B/recompute.ckpt/iter_0000022/tensors.bin; then
    ok "MoE with full recomputation: bit-identical losses, norms, weights and optimizer state (the MoE losses counted once)"
else bad "MoE with full recomputation" "the recordings differ"; fi

# Expert parallelism (--expert-model-parallel-size EP): the experts split over EP of the DP x CP
# ranks, each layer's rows sent to their experts' ranks and back; the experts' gradients summed and
# ZeRO-1-sharded over their expert-data-parallel group (DP x CP / EP ranks), the rest over DP x CP
against ref ep2 "MoE EP 2 (DP 2: each expert on one rank of two)" 1 1 2 --expert-model-parallel-size 2
against ref ep2-dp4-overlap "MoE EP 2 at DP 4 (each expert's gradient over 2 ranks), the overlapped reduce and gather" \
    1 1 4 --expert-model-parallel-size 2 --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 600
against ref ep4-cp2-dp2 "MoE EP 4 over (CP 2, DP 2): one expert a rank" 2 1 2 --expert-model-parallel-size 4
against ref ep2-pp2-interleaved "MoE EP 2 (PP 2, DP 2) interleaved" 1 2 2 --expert-model-parallel-size 2 \
    --num-layers-per-virtual-pipeline-stage 1
record ep2-recompute 1 1 2 --expert-model-parallel-size 2 --recompute-granularity full --recompute-method uniform \
    --recompute-num-layers 2
if cmp -s $B/ep2.steps $B/ep2-recompute.steps && cmp -s $B/ep2.ckpt/iter_0000022/tensors.bin $B/ep2-recompute.ckpt/iter_0000022/tensors.bin; then
    ok "MoE EP 2 with full recomputation (the rows exchanged again): bit-identical losses, norms, weights and optimizer state"
else bad "MoE EP 2 with full recomputation" "the recordings differ"; fi
# checkpoints stay layout-free: saved at EP 2, resumed at EP 4 (and the experts' moments with them)
record ep2-save 1 1 2 --expert-model-parallel-size 2 --exit-interval 10
record ep4-resumed 1 1 4 --expert-model-parallel-size 4 --load $B/ep2-save.ckpt
read n w <<< "$(awk 'NR == FNR { l[$1] = $2; g[$1] = $3; next } ($1 in l) { n++
    d = ($2 - l[$1]) / l[$1]; if (d < 0) d = -d; if (d > w) w = d
    d = ($3 - g[$1]) / g[$1]; if (d < 0) d = -d; if (d > w) w = d } END { printf "%d %.3g\n", n, w }' $B/ref.steps $B/ep4-resumed.steps)"
if [ "$n" -ge 10 ] && awk -v w="$w" 'BEGIN { exit !(w <= 1e-5) }'; then
    ok "saved at EP 2, resumed at EP 4: the resumed steps within 1e-5 of one process (worst $w over $n steps)"
else bad "saved at EP 2, resumed at EP 4" "$n steps compared, worst relative difference $w"; fi
# evaluation and sampling from a checkpoint at EP 2: each rank decodes the sequence, its rows
# going to the experts' ranks like a training step's
gen="--skip-train --load $B/ref.ckpt --generate-prompt-ids 7,12,5 --generate-tokens 12 --temperature 0.9 --generate-seed 3"
./train_cpu $flags $gen > $B/gen1.log 2>&1
$MPIRUN -np 2 ./train_cpu $flags $gen --expert-model-parallel-size 2 > $B/gen2.log 2>&1
pick() { grep -E "validation loss|^---------- sample" -A1 "$1" | grep -vE "^--$"; }
if [ -n "$(pick $B/gen1.log)" ] && [ "$(pick $B/gen1.log)" = "$(pick $B/gen2.log)" ]; then
    ok "evaluation and sampling at EP 2: one process's validation loss and tokens"
else bad "evaluation and sampling at EP 2" "$(diff <(pick $B/gen1.log) <(pick $B/gen2.log) | head -4)"; fi

# An expert capacity (--moe-expert-capacity-factor 1.0: 16 of a micro-batch's 64 choices an expert)
# drops choices on this model: with policy probs under PP 2, with position under DP 2 x EP 2 (each
# rank drops among its own tokens, before the rows go to the experts' ranks), each as one
# process, the step's dropped choices in the log line (more than none, the same every step)
dropped() { grep -o 'dropped expert choices: [0-9]*' $B/$1.log | awk '{ print $4 }' | tr '\n' ' '; }
capacity() {  # policy label cp pp dp
    local policy=$1 label=$2; shift 2
    record cap-$policy-ref 1 1 1 --moe-expert-capacity-factor 1.0 --moe-token-drop-policy $policy --log-interval 1
    against cap-$policy-ref cap-$policy "MoE capacity 1.0, drop policy $policy ($label)" "$@" --moe-expert-capacity-factor \
        1.0 --moe-token-drop-policy $policy --log-interval 1
    local want=$(dropped cap-$policy-ref) got=$(dropped cap-$policy)
    if [ "$(wc -w <<< "$want")" -eq 22 ] && [ "$want" = "$got" ] && awk -v d="$want" 'BEGIN { n = split(d, a, " ");
        for (i = 1; i <= n; i++) s += a[i]; exit !(s > 0) }'; then
        ok "MoE capacity, policy $policy: the dropped choices in the log line, the same at every step as one process's ($(cut -d' ' -f1-5 <<< "$want")...)"
    else bad "MoE capacity, policy $policy: the dropped choices in the log line" "one process: '$want', $label: '$got'"; fi
}
capacity probs "PP 2" 1 2 1
capacity position "DP 2, EP 2" 1 1 2 --expert-model-parallel-size 2
record cap-recompute 1 1 1 --moe-expert-capacity-factor 1.0 --log-interval 1 --recompute-granularity full \
    --recompute-method uniform --recompute-num-layers 2
if cmp -s $B/cap-probs-ref.steps $B/cap-recompute.steps && [ "$(dropped cap-probs-ref)" = "$(dropped cap-recompute)" ] &&
    cmp -s $B/cap-probs-ref.ckpt/iter_0000022/tensors.bin $B/cap-recompute.ckpt/iter_0000022/tensors.bin; then
    ok "MoE capacity with full recomputation: the same drops again, bit-identical losses, norms and weights (drops counted once)"
else bad "MoE capacity with full recomputation" "the recordings or the dropped counts differ"; fi
# the choices kept, against Megatron-Core's rule (topk_softmax_with_capacity) written in torch
if /usr/bin/python3 -c 'import torch' 2> /dev/null; then /usr/bin/python3 tests/moe_capacity.py $REC
else echo "SKIP gridgpt's drops against Megatron-Core's rule in torch: /usr/bin/python3 has no torch"; fi

# Qwen2-MoE's: the softmax over every expert before the top-k, a shared expert with its sigmoid
# gate, SwiGLU, no biases; MoE layers 0 and 2 (--moe-layer-freq 2), dense 1 and 3
mixtral=$flags
flags="$mixtral --moe-router-pre-softmax --moe-shared-expert-intermediate-size 32 --moe-layer-freq 2 --swiglu
       --disable-bias-linear --normalization RMSNorm --position-embedding-type rope"
record qwen-ref 1 1 1
against qwen-ref qwen-dp2-pp2 "Qwen2-MoE-shaped (DP 2, PP 2)" 1 2 2
against qwen-ref qwen-cp4 "Qwen2-MoE-shaped CP 4" 4 1 1
against qwen-ref qwen-ep2 "Qwen2-MoE-shaped EP 2 (the shared expert on every rank)" 1 1 2 --expert-model-parallel-size 2
flags=$mixtral

# the log line carries the MoE losses, after the LM loss (Megatron-LM's order); at the start, a
# balanced router's load-balancing loss is near 1 (Switch Transformer's: E x sum f_e P_e)
./train_cpu ${flags/--train-samples 288/--train-samples 48} --log-interval 1 --tensorboard-dir $B/tb > $B/log.out 2>&1
first=$(sed -nE 's/.*iteration +1\/.*\| lm loss: [0-9.E+-]+ \| load_balancing_loss: ([0-9.E+-]+) \| z_loss: ([0-9.E+-]+) \| expert tokens max\/mean: ([0-9.]+) \|.*/\1 \2 \3/p' $B/log.out)
if [ -n "$first" ] && awk -v a="${first%% *}" -v r="${first##* }" 'BEGIN { exit !(a >= 1.0 && a < 1.5 && r >= 1.0) }'; then
    ok "the log line: lm loss, then load_balancing_loss, z_loss and the experts' tokens max/mean ($first at iteration 1)"
else bad "the MoE losses in the log line" "$(grep -m1 'iteration  *1/' $B/log.out | head -c 300)"; fi
# TensorBoard holds every MoE layer's tokens per expert at every step ("expert tokens/layer L/expert
# e"): each layer's add up to the step's tokens x k (dropless), and their worst max/mean is the
# log line's (each step's samples of 16 tokens as the log line says, 4 layers of 4 experts)
if /usr/bin/python3 -c 'import tensorboard' 2> /dev/null; then
    /usr/bin/python3 tests/tensorboard_scalars.py $B/tb > $B/tb.scalars 2> $B/tb.err
    logged=$(sed -nE 's/.*expert tokens max\/mean: ([0-9.]+) \|.*/\1/p' $B/log.out | tr '\n' ' ')
    batches=$(grep -oE "global batch size: +[0-9]+" $B/log.out | awk '{ print $4 }' | tr '\n' ' ')
    report=$(awk -F'\t' -v logged="$logged" -v batches="$batches" 'BEGIN { steps = split(logged, want, " "); split(batches, g, " ") }
        $1 ~ /^expert tokens\/layer / { split($1, p, "/"); layer = p[2]; n[$2]++; sum[$2, layer] += $3
            if ($3 > most[$2, layer]) most[$2, layer] = $3; layers[layer] = 1 }
        END { if (steps < 3) { print "the log has " steps " steps"; exit }
              for (step = 1; step <= steps; step++) {
                  if (n[step] != 16) { print "step " step ": " n[step] " scalars, not 16"; exit }
                  worst = 0
                  for (l in layers) {
                      if (sum[step, l] != g[step] * 16 * 2) { print "step " step " " l ": " sum[step, l] " tokens, not " g[step] * 16 * 2; exit }
                      r = most[step, l] / (sum[step, l] / 4); if (r > worst) worst = r
                  }
                  if (sprintf("%.3f", worst) != want[step]) { print "step " step ": max/mean " worst ", the log " want[step]; exit }
              }
              print "ok" }' $B/tb.scalars)
    if [ "$report" = ok ]; then
        ok "TensorBoard: each MoE layer's tokens per expert at every step, adding up to the step's tokens x k, their worst max/mean the log line's ($logged)"
    else bad "TensorBoard's tokens per expert" "$report $(head -c 200 $B/tb.err)"; fi
else echo "SKIP TensorBoard's tokens per expert: /usr/bin/python3 has no tensorboard package"; fi
# every token to every expert (top 4 of 4): each expert gets the same tokens, max/mean exactly 1
./train_cpu ${flags/--train-samples 288/--train-samples 48} --moe-router-topk 4 --log-interval 1 > $B/even.out 2>&1
if grep -qE "iteration +1/.*expert tokens max/mean: 1\.000 \|" $B/even.out; then
    ok "top 4 of 4 experts: every expert's tokens the mean (max/mean 1.000)"
else bad "the experts' tokens max/mean at top 4 of 4" "$(grep -m1 'iteration  *1/' $B/even.out | head -c 400)"; fi

# one line for each wrong MoE
refused() {  # label np expected-text flags...
    local label=$1 np=$2 want=$3; shift 3
    $(launch $np) ./train_cpu $flags --train-iters 1 "$@" > $B/refused.out 2> $B/refused.err
    local status=$?
    if [ $status -eq 2 ] && [ "$(grep -c '^error' $B/refused.err)" -ge 1 ] && grep -q -- "$want" $B/refused.err; then ok "refused: $label"
    else bad "refused: $label" "status $status: $(head -c 300 $B/refused.err)"; fi
}
refused "experts with tensor parallelism (not built yet)" 2 "experts' tensor parallelism is not built" --tensor-model-parallel-size 2
refused "a top-k above the experts" 1 "each token to at most" --moe-router-topk 5
refused "more experts than the router's kernel takes" 1 "at most 256 experts" --num-experts 300
refused "EP that does not divide DP x CP" 2 "does not divide data-parallel size 2" --expert-model-parallel-size 4
refused "experts that do not split evenly over EP" 2 "is not divisible by --expert-model-parallel-size 2" --num-experts 3 \
    --expert-model-parallel-size 2
refused "EP without experts" 2 "without --num-experts" --num-experts 0 --expert-model-parallel-size 2
refused "a capacity factor at CP 2 (the drops would follow the split)" 2 "depend on the context-parallel split" \
    --moe-expert-capacity-factor 1.0 --context-parallel-size 2
refused "a negative capacity factor" 1 "moe-expert-capacity-factor must be at least 0" --moe-expert-capacity-factor -1
refused "padding to capacity without a capacity factor" 1 "no capacity to pad to" --moe-pad-expert-input-to-capacity
refused "padding to capacity (not built)" 1 "pad-expert-input-to-capacity: not built" --moe-pad-expert-input-to-capacity \
    --moe-expert-capacity-factor 1.0
exit 0
