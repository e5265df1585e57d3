#!/usr/bin/env bash
# tests/test_emu_train.sh [DATA_PREFIX] — the trainer's GPU path (train.c with -D__CUDACC__:
# floatX = bf16, the CUDA kernels, cuBLAS, NCCL) built by mpicxx against the emulation in
# tests/emu/ as tests/build/train_emu, trained for 10 steps of a tiny model on (TP,PP,DP) =
# (1,1,1) and (2,2,2) next to ./train_cpu; the losses must agree within bf16 tolerance. The
# same for the fp16 build (-DGRIDGPT_FP16, tests/build/train_emu_fp16) with --fp16 and a
# static loss scale of 1024 (the CPU build runs the same scaler: a power of two changes no bit
# there), within fp16 tolerance. The bf16 runs train again with activation recomputation,
# which must give the very same bits. Stopped at step 5 and resumed (--exit-interval, --load;
# no emulated run resumed before 51960dc, where every --load crashed): train_emu and
# train_emu_fp16 --loss-scale 1024 at (1,1,1) and (2,2,2), each against its uninterrupted run,
# and train_emu_fp16 with Megatron's dynamic loss scale (2^32, hysteresis 2) at (1,1,1),
# whose first 12 steps overflow and whose hysteresis tracker is below 0 when saved (a
# checkpoint once refused): the restored state byte for byte (loaded and saved again), then the
# uninterrupted run's bits (the emulation's atomics in one order: see resumed()). A checkpoint crosses between train_cpu and the GPU
# path unchanged (loaded and saved again: the same bytes), and training continued across the
# builds stays within the bf16 tolerance below of train_cpu's uninterrupted run. Then
# --check-cluster at (2,2,2) on the GPU path: its tables and bandwidth formulas
# (tests/test_check_cluster.sh --verify); --dry-run at (2,2,2)
# against the bytes the run allocates (tests/test_dry_run.sh on the GPU path), and train_cpu's
# plan of the GPU build (its --dry-run's default) against the GPU path's own dry run, line for
# line, for several layouts and both precisions. Two tiny models: the fused attention's runs
# (--attention-backend flash: mma.sync, ldmatrix, cp.async) take one of head size 64 (hidden
# 128, 2 heads), a size the fused kernels are built for; the cuBLAS path (--attention-backend
# unfused) and everything else take one of head size 16 (hidden 32), a quarter of the emulated
# work. Both attentions are compared at (1,1,1) and (2,2,2), and planned by both binaries
# alike. ZeRO-3 at DP 2 against train_cpu, and ZeRO-2 and 3 at (1,2,2) with the communication stream held
# back (the same bits as run at once). Last, --overlap-grad-reduce on the GPU path (its communication stream run at once and
# held back) against the run without, the held-back run at (2,2,2) also writing --profile's
# trace (its device spans on both streams checked by tests/trace_check.py), and the planted
# stream-ordering bugs.
# Also generation (the split decode, a step of one token as a CUDA graph) against plain launches.
# Prints one PASS/FAIL line per check.
#
# Tolerance: |loss_emu - loss_cpu| <= u * loss_cpu at every step, u the unit roundoff of the
# 16-bit type: 2^-8 for bf16 (8 significant bits), 2^-11 for fp16 (11). The CPU build keeps
# everything in fp32; the GPU build keeps weights (a 16-bit copy of fp32 master weights),
# activations and the communicated gradients/activations in 16 bits. Each 16-bit value is
# rounded once from an fp32 result, and the fp32 master weights and AdamW moments keep the
# roundings of one step from compounding into the next, so the loss (an fp32 mean over B*T
# tokens of -log softmax of 16-bit logits) is allowed to differ by u of itself: what such a
# model can resolve at all (measured: bf16 up to 5.5e-4 of 3.9e-3, either attention; fp16
# up to 5.0e-5 of 4.9e-4). A bug (a missing barrier, a wrong index, a wrong reduction) gives
# O(1) errors or NaN at once, or drifts by more than this within the 10 steps. The learning
# rate moves each tiny model away from its near-uniform start (loss ~ ln 257 whatever the
# activations), so that the loss witnesses the activations: 1e-2 for hidden 32, 5e-3 for hidden
# 128 (from 5.5 to 3.2 in the 10 steps), which at 1e-2 turns unstable by step 7 (loss 4.2, 5.3,
# grad norm 12 on train_cpu alone: the 16-bit and fp32 runs part by 0.3 there, either
# attention). With the TP all-reduce of bf16 activations removed, (2,2,2) differed by 1.3e-2
# (measured on the earlier model of 4 heads of 8 at 1e-2).
#
# Out-of-bounds accesses: the emulation puts every device allocation against a guard page
# (tests/emu/cuda_runtime.h); (1,1,1) runs with each allocation ending at one (EMU_GUARD=end:
# a kernel touching one byte past a buffer's end is stopped and named), (2,2,2) with each
# beginning at one (EMU_GUARD=start: the same for index -1), so both ends are watched at no
# extra cost.
set -u
cd "$(dirname "$0")/.."
data=${1:-tests/build/corpus_text_document}
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ok() { echo "PASS $1"; }
bad() { echo "FAIL $1: $2"; }

mkdir -p tests/build
# GPU_BINARY=./train_gpu (make test-gpu): the same comparison on a real GPU, nothing built here
if [ -n "${GPU_BINARY:-}" ]; then
    BIN=$GPU_BINARY
    [ -x ./train_cpu ] || make -s cpu > /dev/null
else
BIN=tests/build/train_emu
MPICXX=${MPICXX:-mpicxx}
# the emulation headers define every runtime call, used or not: hence -Wno-unused-function;
# the two precisions build at the same time (each build is one core's work)
for precision in bf16 fp16; do
    out=tests/build/train_emu define=""
    [ $precision = fp16 ] && out=tests/build/train_emu_fp16 define=-DGRIDGPT_FP16
    rm -f $out
    $MPICXX -std=c++20 -O2 -Wall -Wextra -Wno-unused-function -Werror -fopenmp -x c++ -D__CUDACC__ -DOMPI_SKIP_MPICXX \
        $define -Itests/emu train.c -o $out -lz -lm > "$tmp/build-$precision" 2>&1 &
done
wait
for precision in bf16 fp16; do
    out=tests/build/train_emu
    [ $precision = fp16 ] && out=tests/build/train_emu_fp16
    if [ -x $out ]; then ok "train.c builds on its GPU path against tests/emu in $precision (warnings as errors)"
    else
        bad "train.c builds on its GPU path against tests/emu in $precision" "$(head -20 "$tmp/build-$precision")"
        exit 1
    fi
done
[ -x ./train_cpu ] || make -s cpu > /dev/null
fi
if [ ! -f "$data.idx" ]; then bad "data" "$data.idx missing (make test builds it)"; exit 1; fi

# two tiny models: `run` (hidden 32, 2 heads of 16) for everything but the fused attention,
# which takes head sizes 64 and 128 only: `flash_run` (hidden 128, 2 heads of 64), four times
# the emulated work a step, used where the fused attention runs
steps="--micro-batch-size 2 --global-batch-size 8 --train-iters 10 --log-interval 1 --eval-iters 0 --split 90,10,0"
run="--data-path $data --vocab-size 257 --num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 $steps --lr 1e-2"
flash_run="--data-path $data --vocab-size 257 --num-layers 2 --hidden-size 128 --num-attention-heads 2 --seq-length 16 $steps --lr 5e-3"
losses() { sed -nE 's/^ \[[^]]*\] iteration +([0-9]+)\/.*\| lm loss: ([0-9.E+-]+) \|.*/\1 \2/p' "$1"; }

# the log lines without their timing fields: losses, grad norms, learning rates, counters
strip_timing() { grep -E '^ \[[^]]*\] iteration' "$1" | sed -E 's/^ \[[^]]*\]//; s/elapsed time per iteration \(ms\): [0-9.]+//; s/tokens per second: [0-9]+//; s/ETA: [0-9:]+//'; }

# within TOLERANCE LOG CPU_LOG: "ok ..." or "bad ...", the losses of LOG against train_cpu's
within() {
    losses "$2" > "$tmp/a.l"; losses "$3" > "$tmp/b.l"
    join "$tmp/a.l" "$tmp/b.l" | awk -v tol="$1" '
        { n++; d = $2 - $3; if (d < 0) d = -d; r = d / $3
          if (!(r <= tol)) { fail = 1 }          # NaN fails too
          if (r > worst || worst == "") { worst = r; at = $1 }
          steps = steps sprintf(" %d:%.1e", $1, r) }
        END { printf "%s %d steps, worst relative difference %.2e at step %s (tolerance %.2e); per step:%s\n",
                     (n == 10 && !fail) ? "ok" : "bad", n, worst, at, tol, steps }'
}

# compare NAME MODEL NP TP PP GUARD BINARY TOLERANCE RECOMPUTE [FLAGS...]: BINARY against
# train_cpu, both with MODEL's flags and FLAGS; then, unless RECOMPUTE is "", BINARY again with the recomputation flags
# RECOMPUTE, which must change no bit of the log lines or of the saved checkpoint under the
# emulation. On a real GPU the word embedding's gradient adds with atomics in no fixed order, so
# no two runs are bit-identical: there the recomputing run is held to the tolerance instead.
compare() {
    local name=$1 model=$2 np=$3 tp=$4 pp=$5 guard=$6 bin=$7 tol=$8 recompute=$9 t0 t1
    shift 9
    local args="$model --tensor-model-parallel-size $tp --pipeline-model-parallel-size $pp $*"
    [ -n "${GPU_BINARY:-}" ] || name="$name, EMU_GUARD=$guard"
    rm -rf "$tmp/emu.ckpt" "$tmp/rc.ckpt"
    t0=$(date +%s.%N)
    $MPIRUN -x EMU_GUARD="$guard" -np "$np" $bin $args --save "$tmp/emu.ckpt" > "$tmp/emu" 2>&1
    local s_emu=$?
    t1=$(date +%s.%N)
    $MPIRUN -np "$np" ./train_cpu $args > "$tmp/cpu" 2>&1
    local s_cpu=$?
    if [ $s_emu -ne 0 ] || [ $s_cpu -ne 0 ]; then
        bad "$name" "exit status emu $s_emu, cpu $s_cpu: $(grep -m2 -i error "$tmp/emu" "$tmp/cpu")"
        return
    fi
    local report secs
    report=$(within "$tol" "$tmp/emu" "$tmp/cpu")
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b - a}')
    if [ "${report%% *}" = ok ]; then ok "$name: ${report#* } (emulated run ${secs} s)"
    else bad "$name" "${report#* }; emu: $(tail -2 "$tmp/emu" | head -c 300)"; fi

    [ -n "$recompute" ] || return 0
    local what="$(basename "$bin") with $recompute at (TP,PP,DP)=($tp,$pp,$((np / (tp * pp))))"
    if ! $MPIRUN -x EMU_GUARD="$guard" -np "$np" $bin $args $recompute --save "$tmp/rc.ckpt" > "$tmp/rc" 2>&1; then
        bad "$what" "$(grep -m2 -i error "$tmp/rc")"
        return
    fi
    if [ -n "${GPU_BINARY:-}" ]; then
        report=$(within "$tol" "$tmp/rc" "$tmp/cpu")
        if [ "${report%% *}" = ok ]; then ok "$what matches train_cpu: ${report#* }"; else bad "$what" "${report#* }"; fi
    elif [ "$(strip_timing "$tmp/emu" | wc -l)" -eq 10 ] && diff <(strip_timing "$tmp/emu") <(strip_timing "$tmp/rc") > /dev/null &&
         cmp -s "$tmp/emu.ckpt/iter_0000010/tensors.bin" "$tmp/rc.ckpt/iter_0000010/tensors.bin"; then
        ok "$what: bit-identical losses, grad norms and checkpoint (weights, moments) to the run without"
    else bad "$what" "differs from the run without: $(diff <(strip_timing "$tmp/emu") <(strip_timing "$tmp/rc") | head -3)"; fi
}

# recomputation: at (1,1,1) one chunk of both layers (the first layer's output in the scratch),
# at (2,2,2) one layer per stage (stage 0 sends its output from the scratch), the fused
# attention's log-sum-exp recomputed with it; the unfused attention's probabilities alone
# (selective) at (2,2,2). The fp16 build's fused attention at (1,1,1), its
# (2,2,2) on the smaller model (the emulated fused attention's runs are the slowest here)
name=$(basename "$BIN") bf16_tol=$(awk 'BEGIN{print 2^-8}') fp16_tol=$(awk 'BEGIN{print 2^-11}')
compare "$name --attention-backend flash matches train_cpu over 10 steps at (TP,PP,DP)=(1,1,1)" "$flash_run" 1 1 1 end "$BIN" "$bf16_tol" \
    "" --attention-backend flash
compare "$name --attention-backend flash matches train_cpu over 10 steps at (TP,PP,DP)=(2,2,2)" "$flash_run" 8 2 2 start "$BIN" "$bf16_tol" \
    "--checkpoint-activations" --attention-backend flash
compare "$name --attention-backend unfused --bias-grad kernel matches train_cpu over 10 steps at (TP,PP,DP)=(1,1,1)" "$run" 1 1 1 end \
    "$BIN" "$bf16_tol" "--recompute-granularity full --recompute-method uniform --recompute-num-layers 2" --attention-backend unfused \
    --bias-grad kernel
compare "$name --attention-backend unfused matches train_cpu over 10 steps at (TP,PP,DP)=(2,2,2)" "$run" 8 2 2 start "$BIN" "$bf16_tol" \
    "--recompute-activations" --attention-backend unfused
# ZeRO-3 (zero.h): each layer gathered from the shards on the communication stream before its forward
# and its backward, the next one queued ahead; each layer's gradients reduced into the shards' fp32
# accumulators in every micro-batch (4 of them at DP 2)
compare "$name --zero-stage 3 matches train_cpu over 10 steps at (TP,PP,DP)=(1,1,2)" "$run" 2 1 1 start "$BIN" "$bf16_tol" \
    "" --zero-stage 3 --attention-backend unfused
# and its streams' order: at (1,2,2) each stage's ZeRO-2 reduces run beside the next layer's backward
# and ZeRO-3's gathers one layer ahead, on the communication stream; run at once and held back
# (EMU_DEFER_STREAMS=1: a layer reading its place before the gather landed, or the accumulator added
# to before the reduce ran, reads old values) they must give the same bits (a planted missing wait
# of either kind was seen to change them: final loss 4.4309 and 4.4003 against 4.4004)
for stage in 2 3; do
    [ -n "${GPU_BINARY:-}" ] && break
    for defer in 0 1; do
        rm -rf "$tmp/zero$defer.ckpt"
        $MPIRUN -x EMU_DEFER_STREAMS=$defer -np 4 $BIN $run --pipeline-model-parallel-size 2 --zero-stage $stage \
            --attention-backend unfused --save "$tmp/zero$defer.ckpt" > "$tmp/zero$defer" 2>&1
    done
    if [ "$(strip_timing "$tmp/zero0" | wc -l)" -eq 10 ] && diff <(strip_timing "$tmp/zero0") <(strip_timing "$tmp/zero1") > /dev/null &&
       cmp -s "$tmp/zero0.ckpt/iter_0000010/tensors.bin" "$tmp/zero1.ckpt/iter_0000010/tensors.bin"; then
        ok "$name --zero-stage $stage at (1,2,2), the stream held back (EMU_DEFER_STREAMS=1): bit-identical log lines and checkpoint to the stream run at once"
    else bad "$name --zero-stage $stage at (1,2,2) held back" "differs: $(diff <(strip_timing "$tmp/zero0") <(strip_timing "$tmp/zero1") | sed -n 2p | head -c 200) $(grep -m1 -i error "$tmp/zero1")"; fi
done
# interleaved 1F1B (4 layers: 2 model chunks of 1 layer a stage; 2 micro-batches = PP): the
# exchanges of both neighbours on the ring, the gradients that arrive ahead in a slot's dout
compare "$name interleaved 1F1B (--num-layers-per-virtual-pipeline-stage 1) matches train_cpu over 10 steps at (TP,PP,DP)=(2,2,2)" \
    "${run/--num-layers 2/--num-layers 4}" 8 2 2 start "$BIN" "$bf16_tol" "" --attention-backend unfused --num-layers-per-virtual-pipeline-stage 1
# sequence parallelism (the bf16 all-gathers and reduce-scatters of the residual rows, the bias
# and position adds on them, the replicated tensors' gradients summed over TP, 1/TP of the rows
# between stages); its memory as planned, to the byte (the run's --log-memory-bytes lines). One
# emulated run (13 to 22 s here, under load), interleaved as the run above (so a chunk's early
# gradient is the rank's rows too): plain 1F1B with it, and recomputed with it, are bit-identical
# to it on the CPU build (test_parallel: (4,1,1), (2,2,2)), whose code it shares; the attention
# sees whole rows either way (the unfused one here: the cheaper model).
sp_run="${run/--num-layers 2/--num-layers 4} --num-layers-per-virtual-pipeline-stage 1"
sp_args="--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --attention-backend unfused --sequence-parallel"
compare "$name --sequence-parallel, interleaved, matches train_cpu over 10 steps at (TP,PP,DP)=(2,2,2)" "$sp_run" 8 2 2 start "$BIN" \
    "$bf16_tol" "" --attention-backend unfused --sequence-parallel --log-memory-bytes
$BIN --dry-run --world-size 8 $sp_run $sp_args > "$tmp/sp.plan" 2>&1
sp_planned=$(sed -nE 's/.*\(stage ([0-9]+)\) in bytes: (.*)/\1: \2/p' "$tmp/sp.plan")
sp_real=$(sed -nE 's/.*\(stage ([0-9]+)\) in bytes: (.*)/\1: \2/p' "$tmp/emu" | sort -n | uniq)
sp_totals=$(sed -nE 's/.*\(stage ([0-9]+)\) in bytes: .*\| ([0-9]+)$/\2/p' "$tmp/emu" | sort -n | uniq)
sp_allocated=$(sed -nE 's/.*dev_malloc handed out ([0-9]+) bytes.*/\1/p' "$tmp/emu" | sort -n | uniq)
if [ "$(echo "$sp_planned" | wc -l)" -eq 2 ] && [ "$sp_planned" = "$sp_real" ] && [ "$sp_totals" = "$sp_allocated" ]; then
    ok "$name --dry-run --sequence-parallel at (2,2,2): each stage's planned bytes = every rank's = what dev_malloc asked cudaMalloc for ($(echo $sp_planned))"
else bad "$name --dry-run --sequence-parallel at (2,2,2)" "planned: $sp_planned / real: $sp_real / totals $sp_totals, allocated $sp_allocated"; fi
if [ -z "${GPU_BINARY:-}" ]; then   # a real GPU's fp16 binary: make test-gpu
    compare "train_emu_fp16 --fp16 --loss-scale 1024 (flash) matches train_cpu over 10 steps at (1,1,1)" "$flash_run" 1 1 1 end \
        tests/build/train_emu_fp16 "$fp16_tol" "" --fp16 --loss-scale 1024 --attention-backend flash
    compare "train_emu_fp16 --fp16 --loss-scale 1024 (unfused) matches train_cpu over 10 steps at (2,2,2)" "$run" 8 2 2 start \
        tests/build/train_emu_fp16 "$fp16_tol" "" --fp16 --loss-scale 1024 --attention-backend unfused
fi

# Llama's shape (rope, RMSNorm, SwiGLU, grouped-query attention, an untied output layer, no
# linear biases): the fused attention at (1,1,1) on 2 heads of 64 sharing one K/V head (its dK/dV
# kernel sums over the group's heads), the cuBLAS path at (2,2,2) on 4 heads of 8 in 2 groups
# (one a tensor rank) with sequence parallelism, recomputed: the same bits. The larger model at
# lr 1e-3: at flash_run's 5e-3 its fp32 run spikes (grad norm 4.6 at step 4 where the bf16 runs
# have 2.2 and 3.3, either attention; rope alone: 88 at step 7 against 1.2) and the losses part
# by 7.6e-3 at step 5 (measured); at 1e-3 they stay within 3.6e-4 (5.56 to 4.39 in 10 steps).
llama="--position-embedding-type rope --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights --disable-bias-linear
       --group-query-attention"
compare "$name Llama-shaped (--attention-backend flash, 2 heads in 1 group) matches train_cpu over 10 steps at (TP,PP,DP)=(1,1,1)" \
    "${flash_run/--lr 5e-3/--lr 1e-3} $llama --num-query-groups 1 --ffn-hidden-size 256" 1 1 1 end "$BIN" "$bf16_tol" "" \
    --attention-backend flash
compare "$name Llama-shaped (--attention-backend unfused, 4 heads in 2 groups, --sequence-parallel) matches train_cpu over 10 steps at (TP,PP,DP)=(2,2,2)" \
    "${run/--num-attention-heads 2/--num-attention-heads 4} $llama --num-query-groups 2 --ffn-hidden-size 64" 8 2 2 start "$BIN" \
    "$bf16_tol" "--checkpoint-activations" --attention-backend unfused --sequence-parallel

# Context parallelism (issue 49) on the GPU path: kernels/attention_blocks.cuh's CUDA kernels (the
# blocks at their global positions, the log-sum-exp merge, the fp32 dQ and dK/dV sums), the ring's
# NCCL sends and receives on the communication stream behind each step's compute, the gathered
# blocks' all-gather and reduce-scatter: p2p at CP 2, recomputed (the same bits); all_gather on
# Llama's shape (rope at the global positions, 4 heads in 2 groups) at (TP 2, CP 2) with
# sequence parallelism; the fp16 build's ring at CP 2
compare "$name context parallelism (p2p) matches train_cpu over 10 steps at (TP,CP,PP,DP)=(1,2,1,1)" "$run" 2 1 1 end "$BIN" \
    "$bf16_tol" "--recompute-granularity full --recompute-method uniform --recompute-num-layers 2" --context-parallel-size 2
compare "$name Llama-shaped context parallelism (all_gather, --sequence-parallel) matches train_cpu over 10 steps at (TP,CP,PP,DP)=(2,2,1,1)" \
    "${run/--num-attention-heads 2/--num-attention-heads 4} $llama --num-query-groups 2 --ffn-hidden-size 64" 4 2 1 start "$BIN" \
    "$bf16_tol" "" --context-parallel-size 2 --cp-comm-type all_gather --sequence-parallel
if [ -z "${GPU_BINARY:-}" ]; then
    compare "train_emu_fp16 --fp16 --loss-scale 1024 context parallelism (p2p) matches train_cpu over 10 steps at CP 2" "$run" 2 1 1 \
        end tests/build/train_emu_fp16 "$fp16_tol" "" --fp16 --loss-scale 1024 --context-parallel-size 2
fi

# A mixture of experts (issue 50) on the GPU path: kernels/moe.cuh's CUDA kernels (the router, the
# counting sort, the gather and combine, their backwards, the MoE losses), the experts' products on
# their rows: Mixtral's router with GELU experts at (1,1,1) with an expert capacity (1.0: choices
# dropped, kernels/moe.cuh's moe_apply_capacity), recomputed (the same bits); Qwen2-MoE's
# (the softmax first, a shared expert, SwiGLU, no biases) at (PP 2, DP 2) with expert parallelism
# (EP 2: the rows between the ranks by NCCL's grouped sends and receives)
moe="--num-experts 4 --moe-router-topk 2 --moe-aux-loss-coeff 0.01 --moe-z-loss-coeff 0.001"
compare "$name a mixture of experts (4, top 2, capacity 1.0) matches train_cpu over 10 steps at (TP,PP,DP)=(1,1,1)" \
    "$run $moe --moe-expert-capacity-factor 1.0" 1 1 1 end "$BIN" \
    "$bf16_tol" "--recompute-granularity full --recompute-method uniform --recompute-num-layers 2" --attention-backend unfused
compare "$name Qwen2-MoE-shaped experts (a shared expert, SwiGLU) match train_cpu over 10 steps at (TP,PP,DP)=(1,2,2), EP 2" \
    "$run $moe --moe-router-pre-softmax --moe-shared-expert-intermediate-size 32 --swiglu --disable-bias-linear" 4 1 2 start \
    "$BIN" "$bf16_tol" "" --attention-backend unfused --expert-model-parallel-size 2

# 8-bit Adam (--use-bnb-optimizer) on the GPU path: kernels/quantize.cuh's adamw8bit_ranges_kernel
# (a CUDA block a quantization block of 2,048, the scales by block_reduce_max) at DP 2 against
# DP 1. Each ZeRO shard is a whole number of blocks on its region's grid (data_parallel.h
# zero_shard_multiple), so both layouts quantize the same values under the same scales, and DP 2
# must follow DP 1 as 32-bit Adam's does: within 1e-4 of its loss at every step (measured:
# 9.7e-6 at worst, fp32 sums in another order; the Q and K rows' v, rounded to 0 under the
# block's scale, make 8-bit Adam amplify them). Blocks counted from each shard's own start (before
# the fix) gave rank 1 other blocks than one process's: 1.2e-4 at step 4, 1.6e-2 at step 7
# (measured). The kernel gave the C reference's codes, scales and master weights bit for bit at
# both DP sizes, every step (measured once, by hand): the GPU path had no bug of its own. Then
# DP 2 against train_cpu's 8-bit DP 2, within the bf16 tolerance. On a real GPU (GPU_BINARY)
# the word embedding's atomics add in no fixed order, which 8-bit Adam amplifies: there DP 2 is
# held to the bf16 tolerance of DP 1.
q8="$run --use-bnb-optimizer --attention-backend unfused"
q8_tol=1e-4
[ -n "${GPU_BINARY:-}" ] && q8_tol=$bf16_tol
$MPIRUN -x EMU_GUARD=end -np 1 $BIN $q8 > "$tmp/q8-dp1" 2>&1
$MPIRUN -x EMU_GUARD=start -np 2 $BIN $q8 > "$tmp/q8-dp2" 2>&1
$MPIRUN -np 2 ./train_cpu $q8 > "$tmp/q8-cpu" 2>&1
report=$(within "$q8_tol" "$tmp/q8-dp2" "$tmp/q8-dp1")
if [ "${report%% *}" = ok ]; then ok "$name --use-bnb-optimizer at DP 2 follows DP 1: ${report#* }"
else bad "$name --use-bnb-optimizer at DP 2 against DP 1" "${report#* }; $(grep -m1 -i error "$tmp/q8-dp1" "$tmp/q8-dp2")"; fi
report=$(within "$bf16_tol" "$tmp/q8-dp2" "$tmp/q8-cpu")
if [ "${report%% *}" = ok ]; then ok "$name --use-bnb-optimizer at DP 2 matches train_cpu's: ${report#* }"
else bad "$name --use-bnb-optimizer at DP 2 against train_cpu" "${report#* }; $(grep -m1 -i error "$tmp/q8-cpu")"; fi

# Generation on the GPU path (generate.h): the KV cache, the split decode (kernels/attention.cuh)
# and each step of one token as a CUDA graph (re-captured a token, updated in place), against the
# same run's plain launches (--no-cuda-graph): the same sampled ids (temperature 1), which the
# tokens' logits decide. BLOOM's positions (ALiBi: no cap) at (1,1,1), 150 tokens after 10 steps
# of `run`: the cache passes 64 and 128 keys, where a step's decode goes from one split to two
# (the merge, a kernel more: a graph instantiated anew) and three (updated in place); learned
# positions at (TP,PP,DP) = (1,1,2), 40 tokens over a context of 16 (the context shifts: a prefill
# of 8 rows, plain, between the graphs); and at (2,1,1) plain launches alone (the graph is for a
# rank that holds the whole model and talks to no other during a step).
generation() {  # NAME NP ARGS...: the run with the graph and without; PASS when the ids agree
    local name=$1 np=$2
    shift 2
    local args="$run $* --generate-ignore-eod --temperature 1 --generate-seed 3 --generate-output ids"
    $MPIRUN -np "$np" $BIN $args > "$tmp/gen_graph" 2>&1; local s1=$?
    $MPIRUN -np "$np" $BIN $args --no-cuda-graph > "$tmp/gen_plain" 2>&1; local s2=$?
    local ids1 ids2 graphs
    ids1=$(grep -m1 '^sample ids:' "$tmp/gen_graph"); ids2=$(grep -m1 '^sample ids:' "$tmp/gen_plain")
    graphs=$(grep -m1 'as a CUDA graph' "$tmp/gen_graph" | sed 's/^generation: //')
    if [ $s1 -ne 0 ] || [ $s2 -ne 0 ] || [ -z "$ids1" ]; then
        bad "$name" "exit status $s1 (graph), $s2 (plain): $(grep -m2 -i error "$tmp/gen_graph" "$tmp/gen_plain")"
    elif [ "$ids1" != "$ids2" ]; then bad "$name" "the ids differ: ${ids1:0:80}... against ${ids2:0:80}..."
    elif [ -n "${want_graphs:-}" ] && [ "$graphs" != "$want_graphs" ]; then bad "$name" "graphs: '$graphs', want '$want_graphs'"
    else ok "$name: the same $(echo "${ids1#sample ids: }" | tr ',' '\n' | wc -l) ids as plain launches (${graphs:-no graph})"; fi
}
want_graphs="149 steps as a CUDA graph (2 instantiated, 147 updated in place)" \
    generation "$name generates with ALiBi, a step of one token as a CUDA graph, at (1,1,1)" 1 \
    --position-embedding-type alibi --generate-tokens 150
want_graphs="36 steps as a CUDA graph (1 instantiated, 35 updated in place)" \
    generation "$name generates with learned positions (context shifts), a CUDA graph a step, at (TP,PP,DP)=(1,1,2)" 2 \
    --generate-tokens 40
want_graphs="" generation "$name generates at (TP,PP,DP)=(2,1,1): plain launches (no graph with tensor parallelism)" 2 \
    --tensor-model-parallel-size 2 --generate-tokens 20
if grep -q 'as a CUDA graph' "$tmp/gen_graph"; then bad "$name at TP 2: no CUDA graph" "$(grep 'as a CUDA graph' "$tmp/gen_graph")"; fi

# Resuming on the GPU path (resumed): BINARY's steps of `run`, once uninterrupted (--save) and
# once stopped at step STOP (--exit-interval STOP --save D) then resumed (--load D --save D), as
# tests/test_checkpoint.sh's first test does on the CPU build. Before 51960dc every --load on the
# GPU path stopped with "illegal memory access" (checkpoint.h's load_params handed its host array
# to host_to_dev as a device one). What must hold:
#  - the restore is exact: iteration STOP loaded and saved again without a step (--train-iters
#    STOP) gives the same tensors.bin (fp32 master weights, both moments) and metadata.txt
#    (counters, the loss scaler's state), byte for byte;
#  - steps 1 to ITERS are the uninterrupted run's bits (log lines, the last iteration's tensors.bin and
#    metadata.txt). One thing would part them without a fault: encoder_backward's word-embedding
#    gradient adds with atomics (kernels/embedding.cuh), and the emulation draws a launch's block and
#    thread order from the kernel's name and launch count, which starts again at 0 in the
#    resumed process (measured at (1,1,1), seeds 1-4: a few bytes of the word embedding's rows
#    at step 10, in bf16 for 1 seed of 4, in fp16 for all 4). So these runs draw the order from
#    the name alone (EMU_ORDERS=name, tests/emu/cuda_runtime.h): every launch of a kernel in one
#    order, in both processes alike, and the bits must be the same.
#  - On a real GPU (GPU_BINARY) the atomics' order varies from the first backward on: there the
#    counters, learning rates and loss scales must be the uninterrupted run's, the losses
#    within 1e-5 of its, each section of tensors.bin
#    within 1e-5 of its (relative L2 norm) and metadata.txt's counters the same: the bound
#    tests/test_checkpoint.sh holds fp32 sums added in another order to.
# A resume that dropped the moments (--no-load-optim on the resumed run) parts by 2.6e-3 from
# step 7 on (measured, bf16 at (1,1,1)), and a restore that dropped them differs byte for byte.
# resumed NAME NP TP PP GUARD BINARY STOP ITERS FLAGS...: keeps the uninterrupted run's log as
# $tmp/full, iteration STOP's checkpoint as $tmp/half.ckpt and the logs of the two halves as
# $tmp/first and $tmp/second
counters() { strip_timing "$1" | sed -E 's/lm loss: [^ ]+/lm loss: _/; s/grad norm: [^ ]+/grad norm: _/'; }
same_ckpt() { cmp -s "$1/tensors.bin" "$2/tensors.bin" && cmp -s "$1/metadata.txt" "$2/metadata.txt"; }
# the losses of two logs, step by step: the same steps, each within 1e-5: "ok|bad STEPS WORST"
same_losses() {
    paste <(losses "$1") <(losses "$2") | awk '{ n++; if ($1 != $3) bad = 1
        d = ($2 - $4) / $2; if (d < 0) d = -d; if (!(d <= 1e-5)) bad = 1; if (d > w) w = d }
        END { printf "%s %d %.1e\n", bad ? "bad" : "ok", n, w }'
}
# the largest relative difference (L2 norm) of a section (weight, exp_avg, exp_avg_sq) of two tensors.bin
section_diff() {
    python3 - "$1" "$2" <<'PY'
import array, math, sys
a, b = (array.array('f', open(p, 'rb').read()) for p in sys.argv[1:3])
n, worst = len(a) // 3, 0.0 if len(a) == len(b) else math.inf
for k in range(3):
    x, y = a[k * n:(k + 1) * n], b[k * n:(k + 1) * n]
    d, r = math.sqrt(sum((p - q) ** 2 for p, q in zip(x, y))), math.sqrt(sum(p * p for p in x))
    worst = max(worst, d / r if r else (0.0 if d == 0 else math.inf))
print("%.1e" % worst)
PY
}
resumed() {
    local name=$1 np=$2 tp=$3 pp=$4 guard=$5 bin=$6 stop=$7 iters=$8
    shift 8
    local args="$run --tensor-model-parallel-size $tp --pipeline-model-parallel-size $pp --train-iters $iters $*"
    local orders="-x EMU_ORDERS=name" full=$tmp/full
    [ -z "${GPU_BINARY:-}" ] || orders=""
    local gpu="$MPIRUN -x EMU_GUARD=$guard $orders -np $np $bin $args" at=$(printf 'iter_%07d' $stop) last=$(printf 'iter_%07d' $iters)
    [ -n "${GPU_BINARY:-}" ] || name="$name, EMU_GUARD=$guard"
    rm -rf "$tmp/full.ckpt" "$tmp/resume.ckpt" "$tmp/half.ckpt" "$tmp/resaved.ckpt"
    $gpu --save "$full.ckpt" > "$full" 2>&1
    local s_full=$?
    $gpu --exit-interval "$stop" --save "$tmp/resume.ckpt" > "$tmp/first" 2>&1
    local s_first=$?
    cp -r "$tmp/resume.ckpt" "$tmp/half.ckpt"
    $gpu --train-iters "$stop" --use-checkpoint-opt-param-scheduler --load "$tmp/half.ckpt" --save "$tmp/resaved.ckpt" > "$tmp/resaved" 2>&1
    local s_resaved=$?
    $gpu --load "$tmp/resume.ckpt" --save "$tmp/resume.ckpt" > "$tmp/second" 2>&1
    local s_second=$?
    if [ $s_full -ne 0 ] || [ $s_first -ne 0 ] || [ $s_resaved -ne 0 ] || [ $s_second -ne 0 ]; then
        bad "$name" "exit status uninterrupted $s_full, stopped $s_first, saved again $s_resaved, resumed $s_second: $(grep -m1 -i error "$full" "$tmp/first" "$tmp/resaved" "$tmp/second" | head -2)"
        return
    fi
    cat "$tmp/first" "$tmp/second" > "$tmp/both"
    if ! same_ckpt "$tmp/half.ckpt/$at" "$tmp/resaved.ckpt/$at"; then
        bad "$name" "iteration $stop loaded and saved again is not the same bytes: $(cmp "$tmp/half.ckpt/$at/tensors.bin" "$tmp/resaved.ckpt/$at/tensors.bin" 2>&1; diff "$tmp/half.ckpt/$at/metadata.txt" "$tmp/resaved.ckpt/$at/metadata.txt" | head -2)"
        return
    fi
    local restored="iteration $stop loaded and saved again: the same bytes"
    if [ "$(strip_timing "$full" | wc -l)" -eq "$iters" ] && diff <(strip_timing "$full") <(strip_timing "$tmp/both") > /dev/null &&
       same_ckpt "$full.ckpt/$last" "$tmp/resume.ckpt/$last"; then
        ok "$name: $restored; steps 1-$iters bit-identical to the uninterrupted run (log lines, $last/tensors.bin and metadata.txt)"
        return
    fi
    if [ -z "${GPU_BINARY:-}" ]; then
        bad "$name" "$restored, but steps 1-$iters are not the uninterrupted run's bits: $(diff <(strip_timing "$full") <(strip_timing "$tmp/both") | sed -n 2p | head -c 200) $(cmp "$full.ckpt/$last/tensors.bin" "$tmp/resume.ckpt/$last/tensors.bin" 2>&1)"
        return
    fi
    local verdict n worst sections
    read verdict n worst <<< "$(same_losses "$full" "$tmp/both")"
    sections=$(section_diff "$full.ckpt/$last/tensors.bin" "$tmp/resume.ckpt/$last/tensors.bin")
    if [ "$verdict" = ok ] && [ "$n" -eq "$iters" ] && diff <(counters "$full") <(counters "$tmp/both") > /dev/null &&
       diff <(grep -vE '^(tensor|crc32) ' "$full.ckpt/$last/metadata.txt") \
            <(grep -vE '^(tensor|crc32) ' "$tmp/resume.ckpt/$last/metadata.txt") > /dev/null &&
       awk -v s="$sections" 'BEGIN { exit !(s <= 1e-5) }'; then
        ok "$name: $restored; steps 1-$iters: counters, learning rates and loss scales the uninterrupted run's, not all bits ($(cmp -l "$full.ckpt/$last/tensors.bin" "$tmp/resume.ckpt/$last/tensors.bin" | wc -l) bytes of $last/tensors.bin: the GPU's atomic adds' order): losses within $worst, tensors.bin's sections within $sections (tolerance 1e-5)"
    else bad "$name" "steps 1-$iters against the uninterrupted run: losses $verdict ($n steps, worst $worst), tensors.bin's sections within $sections; $(diff <(counters "$full") <(counters "$tmp/both") | sed -n 2p | head -c 200)"; fi
}
resumed "$name stopped at step 5 and resumed at (TP,PP,DP)=(1,1,1)" 1 1 1 end "$BIN" 5 10 --attention-backend unfused
resumed "$name stopped at step 5 and resumed at (TP,PP,DP)=(2,2,2)" 8 2 2 start "$BIN" 5 10 --attention-backend unfused

# Between the builds (after the (2,2,2) runs above: $tmp/half.ckpt is train_emu's iteration 5).
# A checkpoint holds fp32 master weights and moments whichever build wrote it (the GPU path's
# bf16 weights are rounded from the master at load), so (a) loaded and saved again without a step
# (--train-iters 5), train_cpu's iteration 5 at (1,1,1) by the GPU path at (2,2,2), and the GPU
# path's at (2,2,2) by train_cpu at (1,1,1), is the same tensors.bin and metadata.txt, byte for
# byte: every tensor and counter crosses unchanged. (b) Trained on across the builds, train_cpu's
# steps 1-5 then the GPU path's 6-10, and the GPU path's 1-5 then train_cpu's 6-10, against
# train_cpu's uninterrupted 10 steps: the same counters, learning rates and loss scales, and the
# losses within the bound the GPU path's own 10 steps are held to above (u = 2^-8 of the loss),
# not a looser one. Neither mixed run can round more than the GPU path's uninterrupted run does:
# the first's steps 1-5 are train_cpu's very bits (deterministic) and its steps 6-10 take bf16
# roundings from the fp32 state train_cpu reached, which (a) shows arrives unchanged; the
# second's steps 1-5 are the GPU path's (within u, above) and its steps 6-10 carry those five
# steps' roundings on in fp32. A resume that lost the data position, the step count or the
# learning rate schedule changes a counter or a learning rate, which must be equal; one that
# dropped the moments (--no-load-optim) parts from train_cpu's losses by 5.3e-3 at step 10.
cross="$run --attention-backend unfused" on222="--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"
rm -rf "$tmp"/cpu_half.ckpt "$tmp"/resaved_*.ckpt
$MPIRUN -np 1 ./train_cpu $cross > "$tmp/cpu_full" 2>&1
$MPIRUN -np 1 ./train_cpu $cross --exit-interval 5 --save "$tmp/cpu_half.ckpt" > "$tmp/cpu_first" 2>&1
$MPIRUN -x EMU_GUARD=start -np 8 $BIN $cross $on222 --train-iters 5 --use-checkpoint-opt-param-scheduler --load "$tmp/cpu_half.ckpt" --save "$tmp/resaved_gpu.ckpt" > "$tmp/resave_gpu" 2>&1
$MPIRUN -np 1 ./train_cpu $cross --train-iters 5 --use-checkpoint-opt-param-scheduler --load "$tmp/half.ckpt" --save "$tmp/resaved_cpu.ckpt" > "$tmp/resave_cpu" 2>&1
if same_ckpt "$tmp/cpu_half.ckpt/iter_0000005" "$tmp/resaved_gpu.ckpt/iter_0000005" &&
   same_ckpt "$tmp/half.ckpt/iter_0000005" "$tmp/resaved_cpu.ckpt/iter_0000005"; then
    ok "train_cpu's checkpoint (1,1,1) loaded by $name at (2,2,2) and saved again without a step, and $name's (2,2,2) by train_cpu (1,1,1): the same tensors.bin and metadata.txt"
else bad "checkpoints between train_cpu and $name" "$(grep -m2 -i error "$tmp/resave_gpu" "$tmp/resave_cpu")$(cmp "$tmp/cpu_half.ckpt/iter_0000005/tensors.bin" "$tmp/resaved_gpu.ckpt/iter_0000005/tensors.bin" 2>&1; cmp "$tmp/half.ckpt/iter_0000005/tensors.bin" "$tmp/resaved_cpu.ckpt/iter_0000005/tensors.bin" 2>&1)"; fi
across() {  # NAME FIRST-HALF-LOG SECOND-HALF-LOG
    cat "$2" "$3" > "$tmp/across"
    local report=$(within "$bf16_tol" "$tmp/across" "$tmp/cpu_full")
    if [ "${report%% *}" = ok ] && diff <(counters "$tmp/cpu_full") <(counters "$tmp/across") > /dev/null; then
        ok "$1: counters, learning rates and loss scales the same as train_cpu's 10 uninterrupted steps, losses: ${report#* }"
    else bad "$1" "${report#* }; $(diff <(counters "$tmp/cpu_full") <(counters "$tmp/across") | sed -n 2p | head -c 200) $(grep -m2 -i error "$3")"; fi
}
$MPIRUN -x EMU_GUARD=start -np 8 $BIN $cross $on222 --load "$tmp/cpu_half.ckpt" > "$tmp/gpu_second" 2>&1
across "train_cpu's steps 1-5 at (1,1,1), resumed by $name at (2,2,2) for steps 6-10" "$tmp/cpu_first" "$tmp/gpu_second"
$MPIRUN -np 1 ./train_cpu $cross --load "$tmp/half.ckpt" > "$tmp/cpu_second" 2>&1
across "$name's steps 1-5 at (2,2,2), resumed by train_cpu at (1,1,1) for steps 6-10" "$tmp/first" "$tmp/cpu_second"

# The fp16 build, with a static loss scale (the scaler's state stays this run's flags), and with
# Megatron's defaults (--fp16 alone: dynamic, from --initial-loss-scale 2^32 with hysteresis 2).
# The latter overflows in this model's first 12 steps: the first spends the hysteresis, each
# further one halves the scale, and the hysteresis tracker goes below 0 as in Megatron's
# DynamicGradScaler (-8 by step 10), which checkpoint.h once refused to load. Stopped at step 10,
# inside the overflows: loaded and saved again, the tracker is the same line of metadata.txt;
# resumed, the run halves at its first overflow as the uninterrupted one does (a tracker
# restored as the hysteresis would not: the loss scale field differs), ends with the same
# tracker in iteration 16's metadata.txt, and trains steps 13-16 as resumed() holds above.
if [ -z "${GPU_BINARY:-}" ]; then
    resumed "train_emu_fp16 --fp16 --loss-scale 1024 stopped at step 5 and resumed at (TP,PP,DP)=(1,1,1)" 1 1 1 end \
        tests/build/train_emu_fp16 5 10 --fp16 --loss-scale 1024 --attention-backend unfused
    resumed "train_emu_fp16 --fp16 --loss-scale 1024 stopped at step 5 and resumed at (TP,PP,DP)=(2,2,2)" 8 2 2 start \
        tests/build/train_emu_fp16 5 10 --fp16 --loss-scale 1024 --attention-backend unfused
    what="train_emu_fp16 --fp16 (dynamic loss scale from 2^32, hysteresis 2) stopped at step 10 of 16 and resumed at (TP,PP,DP)=(1,1,1)"
    resumed "$what" 1 1 1 end tests/build/train_emu_fp16 10 16 --fp16 --attention-backend unfused
    # the uninterrupted run's overflows (skipped steps) before and after step 10, and the tracker saved there
    skipped() { sed -nE 's/^ \[[^]]*\] iteration +([0-9]+)\/.*number of skipped iterations: +([0-9]+) .*/\1 \2/p' "$tmp/full" |
                awk -v lo="$1" -v hi="$2" '$1 >= lo && $1 <= hi { n += $2 } END { print n + 0 }'; }
    before=$(skipped 1 10) after=$(skipped 11 16)
    clean=$((6 - after))
    scaler=$(grep '^loss_scaler ' "$tmp/half.ckpt/iter_0000010/metadata.txt")
    scale_16=$(sed -nE 's/^ \[[^]]*\] iteration +16\/.*loss scale: ([0-9.]+) .*/\1/p' "$tmp/full")
    if [ "$before" -ge 3 ] && [ "$after" -ge 1 ] && [ "$clean" -ge 1 ] && set -- $scaler && [ "${4:-0}" -lt 0 ]; then
        ok "$what: the uninterrupted run skipped $before overflowing steps of 1-10 and $after of 11-16 (loss scale 2^32 -> $scale_16), trained $clean; iteration 10's metadata.txt has '$scaler' (a hysteresis tracker below 0)"
    else bad "$what: overflows" "skipped $before in 1-10, $after in 11-16; iteration 10: '$scaler'"; fi
fi

# --dry-run on the GPU path: the bytes it plans per stage at (2,2,2) with recomputation (bf16
# weights, fp32 gradients, moments and master copies) are every rank's, and what cudaMalloc
# handed out (the emulation's, or a real GPU's with GPU_BINARY)
mem="--vocab-size 257 --num-layers 2 --hidden-size 128 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2
     --global-batch-size 8 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --checkpoint-activations"
in_bytes() { sed -nE 's/.*\(stage ([0-9]+)\) in bytes: (.*)/\1: \2/p' "$1"; }
# (the fused attention's layout, lse per layer; the unfused one's, att per layer, is planned the
# same way by both binaries below)
$BIN --dry-run --world-size 8 $mem --attention-backend flash > "$tmp/plan" 2>&1
$MPIRUN -np 8 $BIN $mem --attention-backend flash --data-path $data --train-iters 1 --eval-iters 0 --log-memory-bytes > "$tmp/real" 2>&1
planned=$(in_bytes "$tmp/plan") real=$(in_bytes "$tmp/real" | sort -n | uniq)
totals=$(in_bytes "$tmp/real" | sed -E 's/.*\| //' | sort -n | uniq)
allocated=$(sed -nE 's/.*dev_malloc handed out ([0-9]+) bytes.*/\1/p' "$tmp/real" | sort -n | uniq)
if [ "$(in_bytes "$tmp/real" | wc -l)" -eq 8 ] && [ "$(echo "$planned" | wc -l)" -eq 2 ] && [ "$planned" = "$real" ] &&
   [ "$totals" = "$allocated" ] && grep -q '^attention: fused' "$tmp/real"; then
    ok "$(basename "$BIN") --dry-run at (2,2,2), fused attention: each stage's planned bytes = every rank's = what dev_malloc asked cudaMalloc for ($(echo $planned))"
else bad "$(basename "$BIN") --dry-run at (2,2,2), fused attention" "planned: $planned / real: $real / totals $totals, allocated $allocated"; fi
# and the distributed optimizer's share of it (Megatron-LM's 6 + 12/DP bytes a parameter): 2 for
# the bf16 parameters, 4 for the fp32 gradients (the DP reduce-scatter sums each rank's shard of
# them in place), 12/2 for the shard's fp32 master weights, m and v: on every rank the
# optimizer state is 3/2 of the gradients' bytes (a gradient shard of its own made it 2)
state_ok=1
while read -r p g o _; do
    [ $((2 * p)) -eq $g ] && [ $((2 * o)) -eq $((3 * g)) ] || state_ok=0
done <<< "$(in_bytes "$tmp/real" | sed -E 's/^[0-9]+: //; s/\|//g')"
if [ $state_ok = 1 ] && [ "$(in_bytes "$tmp/real" | wc -l)" -eq 8 ] &&
   grep -qE '^model state: 12 bytes a parameter = 2 \(16-bit parameters\) \+ 4 .* \+ 12/2 .*6 \+ 12/DP$' "$tmp/real"; then
    ok "$(basename "$BIN") at DP 2: every rank allocates 6 + 12/2 bytes a parameter of model state (no gradient shard), and says so"
else bad "$(basename "$BIN") at DP 2: 6 + 12/2 bytes a parameter of model state" "$(in_bytes "$tmp/real" | head -2 | tr '\n' ' '); $(grep -m1 '^model state' "$tmp/real")"; fi

# train_cpu plans the GPU build (--dry-run-build gpu; train_gpu's default) as the GPU path plans itself:
# the whole dry run, every byte count and the header, the same line for line
same_plan() {  # NAME BINARY FLAGS...
    local name=$1 bin=$2; shift 2
    $bin --dry-run "$@" > "$tmp/gpu.plan" 2>&1
    ./train_cpu --dry-run --dry-run-build gpu "$@" > "$tmp/cpu.plan" 2>&1
    if grep -q ' in bytes: ' "$tmp/gpu.plan" && diff "$tmp/gpu.plan" "$tmp/cpu.plan" > /dev/null; then
        ok "train_cpu --dry-run plans the GPU build as $(basename "$bin") does, byte for byte: $name"
    else bad "train_cpu's GPU plan = $(basename "$bin")'s: $name" "$(diff "$tmp/gpu.plan" "$tmp/cpu.plan" | head -4)"; fi
}
same_plan "(2,2,2) with recomputation, --attention-backend flash" "$BIN" --world-size 8 $mem --attention-backend flash
same_plan "(2,2,2) with recomputation, --attention-backend unfused" "$BIN" --world-size 8 $mem --attention-backend unfused
same_plan "(2,2,2) with selective recomputation, --attention-backend unfused" "$BIN" --world-size 8 \
    ${mem/--checkpoint-activations/--recompute-activations} --attention-backend unfused
small="--vocab-size 257 --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2"
same_plan "TP 4, DP 3 (a padded ZeRO shard), MBS 1, seq 32" "$BIN" --world-size 12 $small \
    --tensor-model-parallel-size 4 --micro-batch-size 1 --seq-length 32 --global-batch-size 6
same_plan "PP 4 type:transformer|embedding, ALiBi, embedding LayerNorm" "$BIN" --world-size 4 $small \
    --pipeline-model-parallel-size 4 --pp-partition-method 'type:transformer|embedding' --global-batch-size 8 \
    --position-embedding-type alibi --embed-layernorm
same_plan "PP 2 x DP 2 recomputing the first layer of each stage (block)" "$BIN" --world-size 4 $small \
    --pipeline-model-parallel-size 2 --recompute-granularity full --recompute-method block --recompute-num-layers 1
same_plan "PP 2 x DP 2 interleaved, 2 model chunks a stage" "$BIN" --world-size 4 $small \
    --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 --global-batch-size 16
[ -n "${GPU_BINARY:-}" ] || same_plan "(2,2,2) with --fp16" tests/build/train_emu_fp16 --world-size 8 $mem --fp16

# --check-cluster on the GPU path (NCCL's collectives and send/recv, cuBLAS's matmul, a device
# synchronisation around each timing) at (2,2,2): the same tables, the same formulas
$MPIRUN -np 8 $BIN --check-cluster --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
    --check-cluster-sizes 0.25 1 --check-cluster-matmul-size 32 > "$tmp/check" 2>&1
status=$?
if [ $status -eq 0 ]; then bash tests/test_check_cluster.sh --verify "$tmp/check" "$(basename "$BIN") --check-cluster at (2,2,2)"
else bad "$(basename "$BIN") --check-cluster at (2,2,2)" "exit status $status: $(grep -m2 error "$tmp/check")"; fi

# --overlap-grad-reduce and --overlap-param-gather on the GPU path: the DP gradients reduced in
# buckets (600 elements: many, some across the ZeRO shards' boundaries) on the communication
# stream during the last backward, the updated parameters broadcast in the same buckets beside
# the next forward, at (2,2,2) and at (1,2,4). The emulated reduces add in rank order whatever the call, so the
# overlapped run must give the bits of the run without, log lines and checkpoint (real NCCL
# adds a reduce-scatter and the reduces in other orders: there, the tolerance against
# train_cpu). Each runs twice: with the communication stream's work run at once (a bucket
# queued before its gradients are final reads them too early) and held back until something
# waits for it (EMU_DEFER_STREAMS=1: the norm reading the shard before the reduces ran reads
# them too early; a forward not waiting for its layer's broadcasts reads old parameters), so a
# missing wait on either side shows; the planted bugs below show that it does.
overlap="--overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 600"
strip_startup() { strip_timing "$1"; grep -E '^gradient reduction' "$1"; }
overlap_iters=10   # the runs' --train-iters (the planted bugs' runs below take fewer)
overlap_run() {  # LAYOUT-ARGS DEFER BINARY: the run with overlap against $tmp/off (its run without)
    local args=$1 defer=$2 bin=$3 last=$(printf 'iter_%07d' $overlap_iters)
    rm -rf "$tmp/on.ckpt"
    $MPIRUN -x EMU_DEFER_STREAMS=$defer -np 8 $bin $args $overlap --save "$tmp/on.ckpt" > "$tmp/on" 2>&1 ||
        { echo "bad exit status $?: $(grep -m2 -i error "$tmp/on")"; return; }
    if [ -n "${GPU_BINARY:-}" ]; then within "$bf16_tol" "$tmp/on" "$tmp/cpu"
    elif [ "$(strip_timing "$tmp/on" | wc -l)" -eq $overlap_iters ] &&
         diff <(strip_timing "$tmp/off") <(strip_timing "$tmp/on") > /dev/null &&
         cmp -s "$tmp/off.ckpt/$last/tensors.bin" "$tmp/on.ckpt/$last/tensors.bin"; then
        echo "ok bit-identical log lines and checkpoint to the run without"
    else echo "bad differs from the run without: $(diff <(strip_timing "$tmp/off") <(strip_timing "$tmp/on") | sed -n 2p | head -c 200)"; fi
}
for layout in "2 2" "1 2"; do
    set -- $layout
    dp=$((8 / ($1 * $2))) args="$run --tensor-model-parallel-size $1 --pipeline-model-parallel-size $2"
    rm -rf "$tmp/off.ckpt"
    $MPIRUN -np 8 $BIN $args --save "$tmp/off.ckpt" > "$tmp/off" 2>&1
    $MPIRUN -np 8 ./train_cpu $args $overlap > "$tmp/cpu" 2>&1
    report=$(within "$bf16_tol" "$tmp/off" "$tmp/cpu")
    [ "${report%% *}" = ok ] || bad "$(basename "$BIN") at ($1,$2,$dp), the run without overlap" "${report#* }"
    for defer in 0 1; do
        [ $defer = 1 ] && [ -n "${GPU_BINARY:-}" ] && continue
        # the last run at (2,2,2) also records --profile's trace: its device spans checked below
        profile=""
        [ "$1 $2" = "2 2" ] && { [ $defer = 1 ] || [ -n "${GPU_BINARY:-}" ]; } &&
            profile="--profile --profile-step-start 2 --profile-step-end 4 --profile-dir $tmp/trace"
        what="$(basename "$BIN") $overlap${profile:+ --profile} at (TP,PP,DP)=($1,$2,$dp)$([ $defer = 1 ] && echo ', the stream held back (EMU_DEFER_STREAMS=1)')"
        report=$(overlap_run "$args $profile" $defer "$BIN")
        if [ "${report%% *}" = ok ] && grep -q '^gradient reduction: [0-9]* bucket' "$tmp/on" &&
           grep -q '^parameter all-gather: [0-9]* bucket' "$tmp/on"; then ok "$what: ${report#* }"
        else bad "$what" "${report#* }"; fi
        # its trace (trace.h): well-formed, 1F1B's order on the compute stream, and device spans on
        # both streams (the exchanges, the gradient reduces and the parameter broadcasts on the
        # communication stream), each beside its host (launch) span
        if [ -n "$profile" ]; then   # (a check that crashed, printing no PASS or FAIL line, fails too)
            checked=$(python3 tests/trace_check.py "$tmp/trace/trace_iterations_3-4.json" --pp 2 --micro-batches 2 \
                --device-streams --expect "forward,backward,send and receive,all-reduce,reduce,broadcast,AdamW" \
                --name "$(basename "$BIN") --profile at (2,2,2)" 2>&1)
            grep -E '^(PASS|FAIL)' <<< "$checked" || bad "tests/trace_check.py on the emulated trace" "$(tail -2 <<< "$checked")"
        fi
    done
done

# Pipeline exchanges on the communication stream (the default on the GPU path) against
# --no-overlap-p2p-communication (the compute stream) at (1,4,2): stage 0 sends its three
# warm-up outputs alone, the middle stages send one output and receive the next input in one
# exchange. 24 samples a step make 6 micro-batches for 4 slots, so the evaluation's forwards
# reuse slots whose outputs may still be on their way. Same data, same kernels: the log lines
# (validation losses among them) and the checkpoint must be the same bits, with the stream run
# at once and held back (EMU_DEFER_STREAMS=1: a receive not waited for before its input is
# read, or a slot rewritten under its own send, sends or reads the wrong numbers; the planted
# bugs below show both caught). Not testable here: a send queued before the kernel writing its
# data (the emulated kernels run when launched).
p2p_args="$run --num-layers 4 --tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 --global-batch-size 24 \
--train-iters 4 --eval-iters 1 --eval-interval 2 --split 80,20,0"
p2p_lines() { strip_timing "$1"; grep 'validation loss' "$1"; }   # (validation: at 2 and 4, then the end's)
p2p_run() {  # DEFER BINARY: the run with the exchanges on their stream against $tmp/p2p_off
    rm -rf "$tmp/p2p_on.ckpt"
    $MPIRUN -x EMU_DEFER_STREAMS=$1 -np 8 $2 $p2p_args --save "$tmp/p2p_on.ckpt" > "$tmp/p2p_on" 2>&1 ||
        { echo "bad exit status $?: $(grep -m2 -i error "$tmp/p2p_on")"; return; }
    if [ "$(strip_timing "$tmp/p2p_on" | wc -l)" -eq 4 ] && [ "$(grep -c 'validation loss' "$tmp/p2p_on")" -eq 3 ] &&
       diff <(p2p_lines "$tmp/p2p_off") <(p2p_lines "$tmp/p2p_on") > /dev/null &&
       cmp -s "$tmp/p2p_off.ckpt/iter_0000004/tensors.bin" "$tmp/p2p_on.ckpt/iter_0000004/tensors.bin"; then
        echo "ok bit-identical log lines, validation losses and checkpoint to the run on the compute stream"
    else echo "bad differs from the run on the compute stream: $(diff <(p2p_lines "$tmp/p2p_off") <(p2p_lines "$tmp/p2p_on") |
        sed -n 2p | head -c 200)"; fi
}
if [ -z "${GPU_BINARY:-}" ]; then
    rm -rf "$tmp/p2p_off.ckpt"
    $MPIRUN -np 8 $BIN $p2p_args --no-overlap-p2p-communication --save "$tmp/p2p_off.ckpt" > "$tmp/p2p_off" 2>&1
    grep -q '^pipeline exchanges: on the compute stream' "$tmp/p2p_off" ||
        bad "$(basename "$BIN") --no-overlap-p2p-communication at (1,4,2)" "no start-up line saying so: $(grep -m2 -i error "$tmp/p2p_off")"
    for defer in 0 1; do
        what="$(basename "$BIN") pipeline exchanges on the communication stream at (1,4,2)$([ $defer = 1 ] && echo ', held back (EMU_DEFER_STREAMS=1)')"
        report=$(p2p_run $defer "$BIN")
        if [ "${report%% *}" = ok ] && grep -q '^pipeline exchanges: on the communication stream' "$tmp/p2p_on"; then ok "$what: ${report#* }"
        else bad "$what" "${report#* }"; fi
    done
fi

# The planted bugs: a copy of data_parallel.h (a) without the compute stream's wait for the
# reduces before the norm, (b) queueing each bucket one layer before its gradients are final,
# (c) without the forward's wait for its layer's broadcast parameters; of parallel.h (d)
# without the compute stream's wait for an exchange that receives; of pipeline.h (e) without
# the wait before a forward rewrites a slot whose output is still being sent. Each must be
# caught: (b) with the stream's work run at once, the others with it held back. Not testable
# here: work queued on the communication stream before the kernels it follows (the emulated
# kernels run when launched).
if [ -z "${GPU_BINARY:-}" ]; then
    overlap_iters=3   # each bug shows in the first steps
    args="$run --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --train-iters $overlap_iters"
    rm -rf "$tmp/off.ckpt"
    $MPIRUN -np 8 $BIN $args --save "$tmp/off.ckpt" > "$tmp/off" 2>&1
    grad_overlap_run() { overlap_run "$args" "$1" "$2"; }
    names=("no wait for the reduces before the norm" "each bucket queued one layer too early"
           "a forward not waiting for its parameters" "no wait for an exchange that receives"
           "a slot rewritten while its output is sent")
    seds=('s/^    compute_waits_for_comm(&r->reduced);$/    \/\/ planted: no wait/'
          's/lowest_layer >= layer)/lowest_layer >= layer - 1)/'
          's/^    compute_waits_for_mark(&g->gathered\[k - 1\]);$/    \/\/ planted: no wait/'
          's/if (l->overlap \&\& recvs) {/if (0) {/'
          's/^    pipeline_before_writing(stage_output(a));.*/    \/\/ planted: no wait/')
    defers=(1 0 1 1 1)
    planted_in=(data_parallel.h data_parallel.h data_parallel.h parallel.h pipeline.h)
    runners=(grad_overlap_run grad_overlap_run grad_overlap_run p2p_run p2p_run)
    # each planted copy of the sources (every one, the bug's file changed) is built into its own
    # folder, two at a time (a build is one core's work), then run one after another
    plant_build() {  # K: build planted bug K into $tmp/plant$K/train_emu; the reason in build.log if not
        local dir="$tmp/plant$1"
        mkdir -p "$dir/tests" && cp ./*.c ./*.h ./*.cuh "$dir/" && cp -r kernels "$dir/" && cp -r tests/emu "$dir/tests/"
        local file=${planted_in[$1]}
        sed -i "${seds[$1]}" "$dir/$file"
        if cmp -s $file "$dir/$file"; then echo "the sed expression no longer matches $file" > "$dir/build.log"; return; fi
        # (-Og: 8 s of compile against -O1's 12 and -O2's 18, for runs of 3 steps)
        $MPICXX -std=c++20 -Og -g0 -fopenmp -x c++ -D__CUDACC__ -DOMPI_SKIP_MPICXX -I"$dir/tests/emu" "$dir/train.c" \
            -o "$dir/train_emu" -lz -lm > "$dir/build.log" 2>&1
    }
    for k in "${!names[@]}"; do
        plant_build $k &
        [ $((k % 2)) -eq 1 ] && wait
    done
    wait
    for k in "${!names[@]}"; do
        if [ ! -x "$tmp/plant$k/train_emu" ]; then bad "planted bug: ${names[$k]}" "$(head -3 "$tmp/plant$k/build.log")"; continue; fi
        report=$(${runners[$k]} ${defers[$k]} "$tmp/plant$k/train_emu")
        if [ "${report%% *}" = bad ]; then ok "planted bug caught: ${names[$k]} (EMU_DEFER_STREAMS=${defers[$k]}: ${report#* })"
        else bad "planted bug not caught: ${names[$k]}" "$report"; fi
    done
fi
