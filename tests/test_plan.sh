#!/usr/bin/env bash
# tests/test_plan.sh DATA_PREFIX — the planner's communication, cost model and --sweep.
# - Each group's bytes per step that --dry-run predicts equal, to the byte, what --log-comm
#   counts in a real run of the same layout under mpirun (the busiest rank of each group), with
#   context parallelism too (the ring, the all-gather; the gradients over DP x CP).
# - The cost model's FLOPs and bytes equal the formulas written out here for GPT-2 124M; its
#   times follow its stated rules (a matmul at peak x efficiency x its waves of 128 x 128
#   tiles, or its bytes; the fused attention's kernels at the attention efficiency or their
#   bytes, the re-read ones from L2; the column reductions at their bytes or their chains of
#   round trips; a kernel at the memory bandwidth x the memory efficiency; the device's gap at
#   each launch; a collective by alpha-beta
#   on NVLink or the network as the grid places the group); --attention-backend auto takes the
#   backend the model prices faster; the planner stays within 0.88-1.17 of BigScience's
#   published tune-up steps and TFLOPs (tests/data/tuneup/).
# - Llama's shape (Llama 3 8B): the model FLOPs = Megatron-LM's count with GQA and SwiGLU, written
#   out here; QKV, fc1, SwiGLU, rope and RMSNorm priced at their widths and bytes; the throughput
#   line's tokens per second and utilization; an untied output layer sends no embedding all-reduce.
# - Context parallelism (GPT-2 124M at CP 1, 2, 4): the context-parallel bytes per step of the
#   ring, the all-gather and the recomputed ring against the formulas written out here; the
#   attention's share; the ring's transfers each beside one ring step's block attention, what
#   they take beyond it exposed, on a slow and a fast link; all_gather's collectives beside nothing.
# - --sweep lists every layout the rules allow (counted here independently, CP's too), sorted,
#   with the same line a single dry run of that layout prints, OOM marked; refusals are one line.
# - A mixture of experts: the model FLOPs = the active parameters' count written out here, the
#   experts priced on their N k rows (the utilization at most 100%), --moe-imbalance's busiest
#   expert, and expert parallelism as planned: the all-to-alls' bytes, the experts' memory at 1/EP,
#   --sweep over EP, the smallest EP that fits; a MoE run's bytes beside CP planned = counted.
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

comm() {  # name tp pp dp [flags...] (a --context-parallel-size among the flags multiplies the world)
    local name=$1 tp=$2 pp=$3 dp=$4; shift 4
    local cp=1 previous=
    for flag in "$@"; do [ "$previous" = --context-parallel-size ] && cp=$flag; previous=$flag; done
    local n=$((tp * cp * pp * dp)) layout="--tensor-model-parallel-size $tp --pipeline-model-parallel-size $pp"
    $PLAN --world-size $n $model $layout "$@" > $B/$name.plan 2>&1
    $MPIRUN -np $n ./train_cpu --data-path $data $model $layout "$@" --train-iters 1 --eval-iters 0 --log-comm \
        --log-interval 1 > $B/$name.run 2>&1
    local planned real
    planned=$(comm_bytes $B/$name.plan)
    real=$(comm_bytes $B/$name.run)
    if [ -z "$real" ]; then bad "$name: the real run logs its communication" "$(grep -m1 -i error $B/$name.run)"
    elif [ "$planned" != "$real" ]; then bad "$name: planned bytes per group = --log-comm's" "planned $planned, real $real"
    else ok "$name (world $n): bytes per step, tp | dp | pp | embedding | cp | ep | expert-dp, planned = counted: $real"; fi
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
comm interleaved-tp2-pp2-v2 2 2 1 --num-layers-per-virtual-pipeline-stage 1 --global-batch-size 8
# sequence parallelism: the all-gathers and reduce-scatters (the backward's gathers again), the
# replicated tensors' gradients summed over TP, the pipeline's 1/TP rows; recomputed, overlapped
comm sp-tp2-pp2-dp2 2 2 2 --sequence-parallel --checkpoint-activations --overlap-grad-reduce --ddp-bucket-size 600 \
    --global-batch-size 8
# Llama's choices: rope, RMSNorm, SwiGLU, 4 heads in 2 query groups, an untied output layer (no
# embedding all-reduce: 0 bytes planned and counted), no linear biases
llama="--position-embedding-type rope --normalization RMSNorm --swiglu --group-query-attention --num-query-groups 2
       --untie-embeddings-and-output-weights --disable-bias-linear"
comm llama-tp2-pp2-dp2 2 2 2 $llama --global-batch-size 8
# context parallelism: the ring's blocks (CP - 1 a layer and micro-batch forward, again backward
# with CP fp32 partial sums), all_gather's gathers and reduce-scatter, the recomputed forward's
# ring again, the gradients and ZeRO over DP x CP (overlapped too), grouped-query attention's G
# key/value heads alone, beside TP with sequence parallelism and PP
comm cp2-ring 1 1 1 --context-parallel-size 2
comm cp4-ring 1 1 1 --context-parallel-size 4
comm cp2-all-gather 1 1 1 --context-parallel-size 2 --cp-comm-type all_gather
comm cp2-recompute 1 1 1 --context-parallel-size 2 --checkpoint-activations
comm cp2-dp2-overlap 1 1 2 --context-parallel-size 2 --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 600 \
    --global-batch-size 4
comm sp-tp2-cp2-pp2-all-gather 2 2 1 --context-parallel-size 2 --cp-comm-type all_gather --sequence-parallel \
    --global-batch-size 4
comm llama-cp2-dp2 1 1 2 $llama --context-parallel-size 2 --global-batch-size 4
# a mixture of experts beside DP and CP: the expert counts' all-reduce over CP each MoE layer's
# forward (the recomputed one's too), the experts' gradients over DP x CP as the rest at EP 1
comm moe-cp2-dp2-recompute 1 1 2 --num-experts 4 --moe-layer-freq 2 --context-parallel-size 2 --checkpoint-activations \
    --global-batch-size 4

# (the cost model's tests below plan the GPU build, --dry-run-build gpu: train_cpu's own default
# prices this machine, tests/test_dry_run.sh's)
# --- the cost model on GPT-2 124M, 16 x 1024 per micro-batch, one GPU, explicit hardware
gpt2="--vocab-size 50257 --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --micro-batch-size 16"
hw="--hw h100-80gb --hw-peak-tflops 1000 --hw-matmul-efficiency 0.5 --hw-memory-bandwidth 2000 --hw-memory-efficiency 0.8
    --hw-attention-efficiency 0.25"
./train_cpu --dry-run --dry-run-build gpu --world-size 1 $gpt2 $hw --attention-backend unfused > $B/gpt2.plan 2>&1
./train_cpu --dry-run --dry-run-build gpu --world-size 1 $gpt2 $hw > $B/gpt2-flash.plan 2>&1
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
# AdamW's bytes at DP 2 (a shard of S elements): the fp32 master weights read and written, the
# gradient read, the bf16 parameter written, and m and v read and written, fp32: S (7 x 4 + 2);
# with --use-bnb-optimizer m and v a byte each and a block's two fp32 scales read and written, 16
# bytes a 2,048: S (3 x 4 + 4 + 2 + 16 / 2048), its shard of the buffers padded to whole blocks
# (the planner once priced 8-bit moments as 32-bit ones)
./train_cpu --dry-run --dry-run-build gpu --world-size 2 $gpt2 --global-batch-size 32 $hw > $B/gpt2-dp2.plan 2>&1
./train_cpu --dry-run --dry-run-build gpu --world-size 2 $gpt2 --global-batch-size 32 $hw --use-bnb-optimizer > $B/gpt2-dp2-bnb.plan 2>&1
shard() { sed -nE 's/.*\(stage 0\) in bytes: [0-9]+ \| ([0-9]+) \|.*/\1/p' "$1" | awk '{ printf "%d", $1 / 4 / 2 }'; }
s32=$(shard $B/gpt2-dp2.plan) s8=$(shard $B/gpt2-dp2-bnb.plan)
adam32=$(awk -v s="$s32" 'BEGIN { printf "%.4f", s * (7 * 4 + 2) / 1e9 }')
adam8=$(awk -v s="$s8" 'BEGIN { printf "%.4f", s * (3 * 4 + 4 + 2 + 16 / 2048) / 1e9 }')
if [ -n "$s8" ] && [ $((s8 % 2048)) -eq 0 ] && near "$(row AdamW 3 gpt2-dp2)" "$adam32" 1e-3 &&
   near "$(row 'AdamW, 8-bit m and v' 3 gpt2-dp2-bnb)" "$adam8" 1e-3 && ! grep -qF '  AdamW ' $B/gpt2-dp2-bnb.plan; then
    ok "124M at DP 2: AdamW moves S (7 x 4 + 2) bytes ($adam32 GB), with 8-bit m and v S (3 x 4 + 4 + 2 + 16/2048) ($adam8 GB: the shard whole blocks, $s8 elements)"
else bad "124M AdamW's bytes at DP 2" "expected $adam32 and $adam8 GB (shards $s32, $s8): $(grep -h 'AdamW' $B/gpt2-dp2.plan $B/gpt2-dp2-bnb.plan | tr '\n' ' ')"; fi
# the fused attention (head size 64; auto takes it, and --attention-backend flash plans the same),
# per head of T = 1024: 136 (64-row query tile, 64-key tile) pairs at and left of the diagonal,
# 2 products of 2 x 64 x 64 x 64 each; backward 272 (key tile, 32-row step) of FlashAttention-2's
# 5 products, each 2 x 64 x 32 x 64 (issue 39: one kernel, where two did 7); bytes: Q, out once, K,
# V a pair, lse; D's dout, out, D, and its 32 counters zeroed; the backward's K, V, dK, dV a tile,
# Q, dO, lse, D a step, and dQ's fp32 sums read and written a step but the first and the last
# (272 - 32 of them), dQ written (bf16, fp32 lse and D). 12 layers x 16 x 12 heads, 3 kernels a layer.
# Each kernel takes the longest of its products at 1000 TFLOP/s x 0.25, what it reads first and
# writes at 2000 GB/s x 0.8 (forward: Q, K, V, out, lse; D: all; backward: K, V, Q, dO, dK, dV,
# dQ, lse, D and the sums once), and all its bytes at L2's 5500 GB/s (--hw h100-80gb's): since
# issue 39 the re-reads come from L2, not memory (before, each kernel's bytes at 1600 GB/s).
read fused fused_gb fused_ms <<< "$(awk 'function max(a, b) { return a > b ? a : b }
    function kernel(flops, bytes, first) { ms += max(flops / 250e12, max(first / 1600e9, bytes / 5500e9)) * 1e3 * 2304
                                           f += flops; b += bytes }
    BEGIN { T = 1024; d = 64; rows = T * d * 2
            kernel(136 * 2 * 2 * 64 * 64 * d, (2 * T * d + 136 * 2 * 64 * d) * 2 + 4 * T, 4 * rows + 4 * T)    # forward
            kernel(0, 2 * rows + 4 * T + 4 * 32, 2 * rows + 4 * T + 4 * 32)                                   # D
            kernel(272 * 5 * 2 * 64 * 32 * d, 16 * 4 * 64 * d * 2 + 272 * (2 * 32 * d * 2 + 2 * 4 * 32) + (272 - 32) * 2 * 32 * d * 4 + rows,
                   7 * rows + 8 * T + 4 * T * d)                                                              # dK, dV, dQ
            printf "%.1f %.3f %.2f\n", 2304 * f / 1e9, 2304 * b / 1e9, ms }')"
fused_row='attention, fused (FlashAttention-2 design)'
./train_cpu --dry-run --dry-run-build gpu --world-size 1 $gpt2 $hw --attention-backend flash > $B/gpt2-flash-forced.plan 2>&1
if [ "$(row "$fused_row" 2 gpt2-flash)" = "$fused" ] && [ "$(row "$fused_row" 1 gpt2-flash)" = 36 ] &&
   [ "$(row "$fused_row" 3 gpt2-flash)" = "$fused_gb" ] && near "$(row "$fused_row" 4 gpt2-flash)" "$fused_ms" 0.002 &&
   ! grep -q 'attention softmax' $B/gpt2-flash.plan &&
   [ "$(tail -1 $B/gpt2-flash.plan)" = "$(tail -1 $B/gpt2-flash-forced.plan)" ]; then
    ok "124M with the fused attention: $fused GFLOP of tile products and $fused_gb GB in 36 launches, $fused_ms ms (each kernel the longest of its products, its first reads and writes, all its bytes from L2); no softmax kernel"
else bad "the fused attention's costs" "expected $fused GFLOP, $fused_gb GB, $fused_ms ms: $(grep -F 'attention' $B/gpt2-flash.plan | tr '\n' ' ')"; fi
# selective recomputation with the fused attention recomputes nothing: its plan is the plan
# without, and the alternatives' line says so instead of repeating it
./train_cpu --dry-run --dry-run-build gpu --world-size 1 $gpt2 $hw --recompute-activations > $B/gpt2-flash-selective.plan 2>&1
if [ "$(tail -1 $B/gpt2-flash-selective.plan)" = "$(tail -1 $B/gpt2-flash.plan)" ] &&
   grep -q '^with the attention core recomputed (--recompute-activations): the same as without recomputation: the fused' $B/gpt2-flash.plan; then
    ok "selective recomputation with the fused attention: the same plan as without, and the alternatives' line says so"
else bad "selective recomputation with the fused attention" "$(tail -1 $B/gpt2-flash-selective.plan) / $(grep '^with the attention core' $B/gpt2-flash.plan)"; fi
# a GEMM of (M x K) by (K x N) in 128 x 128 output tiles over the 132 SMs of --hw h100-80gb: ceil(M/128)
# ceil(N/128) tiles, split along K (keeping 256 a slice, up to the SMs) when fewer than the SMs, run
# in whole waves; its time the FLOPs at 1000 TFLOP/s x 0.5 x (M N splits / (waves x 132 x 128^2)),
# or its bytes (M K + K N + M N) x 2 at 1600 GB/s if longer. The linear layers' backward: dinp
# (N x in over out) and dW (out x in over N) for each of qkv, the projection, fc and fc2, 12 layers.
gemm_model='function ceil(v) { return v == int(v) ? v : int(v) + 1 }
    function gemm(M, N, K) { tiles = ceil(M / 128) * ceil(N / 128); s = 1
        if (tiles < 132) { s = int(132 / tiles); if (int(K / 256) < s) s = int(K / 256); if (s < 1) s = 1 }
        waves = ceil(tiles * s / 132); math = 2 * M * N * K / (1000e12 * 0.5 * M * N * s / (waves * 132 * 128 * 128))
        mem = (M * K + K * N + M * N) * 2 / 1600e9; return 1e3 * (math > mem ? math : mem) }'
expected=$(awk "$gemm_model"' BEGIN { N = 16384; C = 768; F = 3072
    layer = gemm(N, C, 3 * C) + gemm(3 * C, C, N) + gemm(N, C, C) + gemm(C, C, N)   # qkv, the projection
    layer += gemm(N, C, F) + gemm(F, C, N) + gemm(N, F, C) + gemm(C, F, N)          # fc, fc2
    printf "%.4f", 12 * layer }')
ms=$(row 'linear layers backward (cuBLAS)' 4)
# on 12 SMs (every GEMM's tiles a multiple of 12: 768, 3072, 108, 36, 144) all run in whole
# waves: FLOPs / (peak x 0.5)
whole=$(./train_cpu --dry-run --dry-run-build gpu --world-size 1 $gpt2 $hw --attention-backend unfused --hw-sm-count 12 2>&1 |
    grep -F '  linear layers backward' | sed -E 's/^  .{44} //' | awk -F'|' '{ gsub(/ /, "", $4); print $4 }')
if near "$ms" "$expected" 0.002 && near "$whole" "$(awk -v g="$linear_backward" 'BEGIN { print g / 500 }')" 0.002 &&
   awk -v a="$ms" -v b="$whole" 'BEGIN { exit !(a > b) }'; then
    ok "a matmul's time is its FLOPs at peak x efficiency x its waves of 128 x 128 tiles ($ms ms on 132 SMs; $whole ms on 12, whose waves its tiles fill)"
else bad "matmul time" "$ms ms, expected $expected; $whole ms on 12 SMs, expected $linear_backward / 500"; fi
gb=$(row 'attention softmax' 3); ms=$(row 'attention softmax' 4); expected=$(awk -v g="$gb" 'BEGIN { print g / 1.6 }')
if near "$ms" "$expected" 0.002; then ok "another kernel's time is its bytes at the memory bandwidth x the memory efficiency ($gb GB in $ms ms)"
else bad "kernel time" "$gb GB in $ms ms, expected $expected"; fi
# --- the column reductions, latency-bound where they are (issue 39): each kernel the longer of
# its bytes at 2000 GB/s x 0.8 and its chains of dependent round trips to memory (0.2279 us:
# --hw h100-80gb's 400 cycles at 1755 MHz; an L2 trip half of it), wave after wave of the blocks
# an SM holds (64K registers and 2048 threads an SM). A linear layer's bias gradient is summed
# in its weight gradient's GEMM (cuBLASLt's BGRADB epilogue, its cost in the GEMM's), then added
# by column_partials_add: ceil(OC / 32) blocks of 1024 threads (2 an SM), one trip; its bytes
# the sums read and the gradient read and written. With sequence parallelism the row-parallel
# layers' (the two projections') are summed over the residual rows before the reduce-scatter
# by column_sums_kernel over [N / TP, C]: bias_grad_chunks' chunks x ceil(C / 256) blocks of 256
# threads (32 registers: 8 an SM), each thread ceil(chunk rows / 4) trips, then the last block's
# counter and ceil(chunks / 16) trips to L2; its bytes dout, the partials written and read, the
# gradient read and written. LayerNorm's backward (128 registers: 2 blocks an SM): one block per
# 32 rows, a warp's 4 rows' loads of a window of 256 columns in flight together, 2 x ceil(C /
# 256) trips; its bytes dout, the input, dinp read and written, mean and rstd, the weight's and
# bias's partials written; then column_partials_add: ceil(2C / 32) blocks of 1024 threads (2 an
# SM), each warp ceil(chunks / 32) partials 4 a trip from L2, then the warps' sums: one trip
# more; the final norm's dres zeroed first. The column sums' chains are longer than their bytes.
reductions_expected() {  # MBS: without SP the biases' adds and the layernorm backward's ms per step;
                         # at TP 2 with SP the column sums' and the adds' ms per step
    awk -v B="$1" 'function ceil(v) { return v == int(v) ? v : int(v) + 1 }
        function max(a, b) { return a > b ? a : b }
        function chains(blocks, per_sm, trips, l2) { return ceil(blocks / (per_sm * 132)) * (trips + 0.5 * l2) * 400 / 1755e6 }
        function bias(N, OC,   wanted, chunks, rows, b) {
            wanted = ceil(N / 32); if (ceil(1024 / ceil(OC / 256)) < wanted) wanted = ceil(1024 / ceil(OC / 256))
            rows = ceil(N / wanted); chunks = ceil(N / rows); rows = ceil(N / chunks)
            b = N * OC * 2 + 2 * chunks * OC * 4 + 8 * OC
            return max(b / 1600e9, chains(chunks * ceil(OC / 256), 8, ceil(rows / 4), 0) + chains(1, 1, 0, 1 + ceil(chunks / 16))) }
        function added(OC) { return max(12 * OC / 1600e9, chains(ceil(OC / 32), 2, 1, 0)) }
        function ln(N, C,   chunks, partials, kernel) {
            chunks = ceil(N / 32); partials = 2 * 4 * chunks * C
            kernel = max((4 * N * C * 2 + 8 * N + partials) / 1600e9, chains(chunks, 2, 2 * ceil(C / 256), 0))
            return kernel + max(partials / 1600e9, chains(ceil(2 * C / 32), 2, 0, ceil(ceil(chunks / 32) / 4) + 1)) }
        BEGIN { N = B * 1024; C = 768
                printf "%.2f %.2f %.2f %.2f\n", 1e3 * 12 * (2 * added(C) + added(4 * C) + added(3 * C)),
                                                 1e3 * (25 * ln(N, C) + N * C * 2 / 1600e9),
                                                 1e3 * 12 * 2 * bias(N / 2, C), 1e3 * 12 * (added(4 * C / 2) + added(3 * C / 2)) }'
}
./train_cpu --dry-run --dry-run-build gpu --world-size 1 $gpt2 $hw --micro-batch-size 1 > $B/gpt2-mbs1.plan 2>&1
./train_cpu --dry-run --dry-run-build gpu --world-size 2 $gpt2 $hw --tensor-model-parallel-size 2 --sequence-parallel > $B/gpt2-sp.plan 2>&1
read added16 ln16 sums_sp added_sp <<< "$(reductions_expected 16)"
read added1 ln1 _ _ <<< "$(reductions_expected 1)"
epilogue='bias gradients (GEMM epilogue, then added)'
bytes_only=$(awk -v g="$(row 'layernorm backward' 3 gpt2-mbs1)" 'BEGIN { printf "%.2f", g / 1.6 }')
if near "$(row "$epilogue" 4)" "$added16" 0.01 && near "$(row 'layernorm backward' 4)" "$ln16" 0.01 &&
   near "$(row "$epilogue" 4 gpt2-mbs1)" "$added1" 0.01 && near "$(row 'layernorm backward' 4 gpt2-mbs1)" "$ln1" 0.01 &&
   [ "$(row 'layernorm backward' 1)" = 51 ] && [ "$(row "$epilogue" 1)" = 48 ] && ! grep -q 'column sums' $B/gpt2.plan &&
   near "$(row 'bias gradients (column sums)' 4 gpt2-sp)" "$sums_sp" 0.01 && [ "$(row 'bias gradients (column sums)' 1 gpt2-sp)" = 24 ] &&
   near "$(row "$epilogue" 4 gpt2-sp)" "$added_sp" 0.01 && [ "$(row "$epilogue" 1 gpt2-sp)" = 24 ]; then
    ok "the column reductions: the longer of their bytes and their chains of round trips (MBS 16: the biases' adds after their GEMMs $added16 ms, layernorm backward $ln16 ms; MBS 1: $added1 and $ln1 ms, its bytes alone $bytes_only; TP 2 with SP: the projections' column sums $sums_sp ms, the other biases' adds $added_sp)"
else bad "the column reductions' time" "MBS 16: $(row "$epilogue" 4) and $(row 'layernorm backward' 4) ms, expected $added16 and $ln16; MBS 1: $(row "$epilogue" 4 gpt2-mbs1) and $(row 'layernorm backward' 4 gpt2-mbs1), expected $added1 and $ln1; TP 2 SP: $(row 'bias gradients (column sums)' 4 gpt2-sp) and $(row "$epilogue" 4 gpt2-sp), expected $sums_sp and $added_sp"; fi
# --- the launches (issue 39): the device idles 1 us (--hw h100-80gb's) between two kernels;
# the gaps' row counts every kernel launch of the table's other rows (a GEMM, a fused attention
# kernel, a memory-bound kernel; not a message), here all of them, and charges 1 us each
for plan in gpt2 gpt2-flash gpt2-mbs1; do
    gaps=$(row 'kernel launch gaps (the device idle)' 1 $plan) gap_ms=$(row 'kernel launch gaps (the device idle)' 4 $plan)
    others=$(grep -E '^  ' $B/$plan.plan | grep -F '|' | grep -v 'planned\|kernel launch gaps' | sed -E 's/^  .{44} //' |
             awk -F'|' '{ s += $1 } END { print s }')
    if [ -n "$gaps" ] && [ "$gaps" = "$others" ] && near "$gap_ms" "$(awk -v n="$gaps" 'BEGIN { print n / 1000 }')" 0.02; then
        launch_ok="${launch_ok:-}$plan: $gaps launches, $gap_ms ms; "
    else launch_bad="${launch_bad:-}$plan: $gaps gaps against $others launches, $gap_ms ms; "; fi
done
if [ -z "${launch_bad:-}" ]; then ok "the launch gaps: 1 us for each launch of the table's kernels (${launch_ok%; })"
else bad "the launch gaps" "$launch_bad"; fi
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
# the step to more digits than the last line's two: "step = ... = N x SLOT s + OPTIMIZER s"
exact=$(sed -nE 's/^step = .* = ([0-9]+) x ([0-9.e+-]+) s \+ ([0-9.e+-]+) s$/\1 \2 \3/p' $B/gpt2.plan | awk '{ printf "%.9g", $1 * $2 + $3 }')
if [[ "$last" =~ ^dry-run:\ world\ 1\ TP\ 1\ PP\ 1\ DP\ 1\ MBS\ 16\ GBS\ 16:\ peak\ memory\ per\ GPU\ [0-9]+\.[0-9]\ GiB\ \(stage\ 0\),\ step\ [0-9.]+\ s,\ [0-9]+\.[0-9]\ TFLOPs\ per\ GPU,\ bubble\ 0\.0%$ ]] &&
   near "$tflops" "$(awk -v f="$flops" -v s="$exact" 'BEGIN { print f / s / 1e12 }')" 0.002 &&
   near "$exact" "$(awk -v t="$total_ms" 'BEGIN { print t / 1000 }')" 0.002 && near "$step" "$exact" 0.05; then
    ok "the last line: step = the sum of the table's times with one stage ($step s), TFLOPs per GPU = FLOPs / step ($tflops)"
else bad "the last line" "$last (FLOPs $flops, table $total_ms ms)"; fi

# --- Llama's shape: Llama 3 8B on one GPU, one sequence of 8192. The model FLOPs are Megatron-LM's
# num_floating_point_operations (megatron/training/training.py), written out here:
#   12 B s l h^2 ((1 + g/n + s/h) + (F/h) x 3/2 (SwiGLU) + V / (2 l h))
# The cost table prices QKV at (n + 2g) d = (32 + 16) x 128 columns and fc1 at 2F (SwiGLU's gate
# and up); SwiGLU's kernels by their bytes (forward: gate and up read, the product written, 3 N F;
# backward: gate, up and dout read, their gradients written, 5 N F), rope's in-place pass over the
# query and key heads' rotated dims (read and written, forward and backward), RMSNorm's forward (the
# rows read and written, rstd) and backward (dout, the input, dinp read, dinp written, rstd, one
# fp32 partial per 32-row chunk and column written and read; the final norm's also zeroes dres);
# no GELU, LayerNorm or bias-gradient rows. The throughput line: tokens / step, and the model FLOPs
# (no recomputation) / step / the peak; with every layer recomputed too (the last line's TFLOPs then
# count the recomputed forwards, the utilization does not).
llama8b="--vocab-size 128256 --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention
         --num-query-groups 8 --ffn-hidden-size 14336 --seq-length 8192 --max-position-embeddings 8192
         --position-embedding-type rope --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights
         --disable-bias-linear --micro-batch-size 1 --global-batch-size 1"
./train_cpu --dry-run --dry-run-build gpu --world-size 1 $llama8b $hw > $B/llama8b.plan 2>&1
./train_cpu --dry-run --dry-run-build gpu --world-size 1 $llama8b $hw --checkpoint-activations > $B/llama8b-recompute.plan 2>&1
read megatron linear logits swf swb rope rmsf rmsb <<< "$(awk 'BEGIN { B = 1; s = 8192; l = 32; h = 4096; n = 32; g = 8; F = 14336
    V = 128256; N = B * s; d = h / n; x = 2; chunks = N / 32
    printf "%.6g ", 12 * B * s * l * h * h * ((1 + g / n + s / h) + F / h * 3 / 2 + V / (2 * l * h))
    printf "%.1f ", l * 2 * N * h * ((n + 2 * g) * d + h + 2 * F + F) / 1e9
    printf "%.1f ", 3 * 2 * N * h * V / 1e9
    printf "%.3f %.3f ", l * 3 * N * F * x / 1e9, l * 5 * N * F * x / 1e9
    printf "%.3f ", l * 2 * 2 * N * (n + g) * d * x / 1e9
    printf "%.3f ", (2 * l + 1) * (2 * N * h * x + 4 * N) / 1e9
    back = 4 * N * h * x + 4 * N + 8 * chunks * h
    printf "%.3f\n", (2 * l * back + back + N * h * x) / 1e9 }')"
planned=$(sed -nE 's/^model FLOPs per step: ([0-9.e+]+) .*/\1/p' $B/llama8b.plan)
got="$(row 'linear layers forward (cuBLASLt epilogues)' 2 llama8b) $(row 'linear layers backward (cuBLAS)' 2 llama8b) $(row 'logits (cuBLAS)' 2 llama8b)"
want="$linear $(awk -v f="$linear" 'BEGIN { printf "%.1f", 2 * f }') $logits"
if near "$planned" "$megatron" 0.0005 && [ "$got" = "$want" ]; then
    ok "Llama 3 8B: model FLOPs $planned = Megatron-LM's count with GQA and SwiGLU ($megatron); matmul GFLOP forward, backward, logits $got"
else bad "Llama 3 8B's FLOPs" "model FLOPs $planned against $megatron; matmuls $got against $want"; fi
got="$(row 'swiglu forward' 1 llama8b):$(row 'swiglu forward' 3 llama8b) $(row 'swiglu backward' 1 llama8b):$(row 'swiglu backward' 3 llama8b)"
got="$got $(row 'rope (rotary positions, in place)' 1 llama8b):$(row 'rope (rotary positions, in place)' 3 llama8b)"
got="$got $(row 'rmsnorm forward' 1 llama8b):$(row 'rmsnorm forward' 3 llama8b) $(row 'rmsnorm backward' 1 llama8b):$(row 'rmsnorm backward' 3 llama8b)"
want="32:$swf 32:$swb 64:$rope 65:$rmsf 131:$rmsb"
if [ "$got" = "$want" ] && ! grep -qE '^  (GELU|layernorm|residual \+ layernorm|bias gradients)' $B/llama8b.plan; then
    ok "Llama 3 8B: SwiGLU, rope and RMSNorm priced by their launches and bytes ($got); no GELU, LayerNorm or bias-gradient rows"
else bad "Llama 3 8B's kernels" "launches:GB $got against $want; $(grep -cE '^  (GELU|layernorm|bias)' $B/llama8b.plan) GELU/LayerNorm/bias rows"; fi
throughput_ok() {  # PLAN: tokens per second = 8192 / step, utilization = Megatron's FLOPs / step / 1000 TFLOP/s
    local exact line tokens mfu
    exact=$(sed -nE 's/^step = .* = ([0-9]+) x ([0-9.e+-]+) s \+ ([0-9.e+-]+) s$/\1 \2 \3/p' "$1" | awk '{ printf "%.9g", $1 * $2 + $3 }')
    line=$(grep '^throughput: ' "$1")
    [[ "$line" =~ ^throughput:\ ([0-9]+)\ tokens\ per\ second\ \([0-9]+\ per\ GPU\)\;\ model\ FLOPs\ utilization\ ([0-9.]+)%\ of\ 1000\ TFLOP/s ]] ||
        return 1
    tokens=${BASH_REMATCH[1]} mfu=${BASH_REMATCH[2]}
    near "$tokens" "$(awk -v t="$exact" 'BEGIN { print 8192 / t }')" 0.001 &&
        near "$mfu" "$(awk -v f="$megatron" -v t="$exact" 'BEGIN { print 100 * f / t / 1e15 }')" 0.005
}
if throughput_ok $B/llama8b.plan && throughput_ok $B/llama8b-recompute.plan; then
    ok "the throughput line: tokens per second = tokens / step; model FLOPs utilization = the FLOPs without recomputation / step / peak, recomputed or not"
else bad "the throughput line" "$(grep '^throughput' $B/llama8b.plan) / $(grep '^throughput' $B/llama8b-recompute.plan)"; fi
# untied at PP 2: no embedding all-reduce, planned or sent; tied (the same model otherwise): one
# all-reduce of the word embedding's fp32 gradient, on the first and the last stage
./train_cpu --dry-run --dry-run-build gpu --world-size 2 $model $llama --pipeline-model-parallel-size 2 --global-batch-size 4 > $B/untied.plan 2>&1
./train_cpu --dry-run --dry-run-build gpu --world-size 2 $model ${llama/--untie-embeddings-and-output-weights/} --pipeline-model-parallel-size 2 \
    --global-batch-size 4 > $B/tied.plan 2>&1
embedding_bytes() { comm_bytes "$1" | awk -F'|' '{ gsub(/ /, "", $4); print $4 }'; }
if [ "$(embedding_bytes $B/untied.plan)" = 0 ] && ! grep -q 'tied embedding all-reduce' $B/untied.plan &&
   grep -q '^  tied embedding all-reduce ' $B/tied.plan && [ "$(embedding_bytes $B/tied.plan)" -gt 0 ]; then
    ok "untied output layer at PP 2: no embedding all-reduce (0 bytes); tied: its all-reduce ($(embedding_bytes $B/tied.plan) bytes)"
else bad "the embedding all-reduce, untied" "untied $(embedding_bytes $B/untied.plan) bytes, tied $(embedding_bytes $B/tied.plan); $(grep -c 'tied embedding' $B/untied.plan) rows untied"; fi

# --- collectives: TP 4 inside a node of 8 runs on NVLink; with 2 GPUs per node it crosses the
# network: same bytes, alpha-beta time at the network's bandwidth
tp4="$gpt2 --tensor-model-parallel-size 4 --micro-batch-size 1 $hw --hw-nvlink-bandwidth 400 --hw-internode-bandwidth 20 --hw-latency-us 5"
./train_cpu --dry-run --dry-run-build gpu --world-size 4 $tp4 > $B/tp4.plan 2>&1
./train_cpu --dry-run --dry-run-build gpu --world-size 4 $tp4 --hw-gpus-per-node 2 > $B/tp4-two-nodes.plan 2>&1
launches=$(row 'tensor-parallel all-reduce' 1 tp4); gb=$(row 'tensor-parallel all-reduce' 3 tp4)
inside=$(row 'tensor-parallel all-reduce' 4 tp4); across=$(row 'tensor-parallel all-reduce' 4 tp4-two-nodes)
# each all-reduce: 2 (4 - 1) steps of 5 us + its bytes at 400 (or 20) GB/s; 12 layers x 4 + 1 + 3
expect_in=$(awk -v n="$launches" -v g="$gb" 'BEGIN { print n * 6 * 5e-3 + g / 400 * 1e3 }')
expect_across=$(awk -v n="$launches" -v g="$gb" 'BEGIN { print n * 6 * 5e-3 + g / 20 * 1e3 }')
if [ "$launches" = 52 ] && near "$inside" "$expect_in" 0.01 && near "$across" "$expect_across" 0.01; then
    ok "TP 4's 52 all-reduces: alpha-beta on NVLink inside a node ($inside ms), on the network across two ($across ms)"
else bad "TP 4's all-reduces" "$inside / $across ms, expected $expect_in / $expect_across ($launches launches, $gb GB)"; fi

# the bubble: PP 4 with 4 micro-batches is (m + p - 1) = 7 slots of the slowest stage
./train_cpu --dry-run --dry-run-build gpu --world-size 4 $gpt2 --micro-batch-size 1 --global-batch-size 4 --pipeline-model-parallel-size 4 \
    $hw > $B/pp4.plan 2>&1
if grep -qE '^step = \(m \+ p - 1\) x .* = 7 x ' $B/pp4.plan && tail -1 $B/pp4.plan | grep -q 'bubble 42\.9%$'; then
    ok "PP 4, 4 micro-batches: 7 slots of the slowest stage, bubble 3/7"
else bad "the bubble" "$(grep '^step' $B/pp4.plan); $(tail -1 $B/pp4.plan)"; fi

# interleaved: PP 4, v = 2 (24 layers), 4 micro-batches: the bubble (p - 1) / (v m + p - 1) = 3/11,
# the step m + (p - 1) / v = 5.5 slots, the busiest rank's pipeline bytes twice plain 1F1B's (a
# middle stage sends 2 v activations a micro-batch); the plain layout's line is that layout's own
# dry run
vpp4="--world-size 4 $gpt2 --num-layers 24 --micro-batch-size 1 --global-batch-size 4 --pipeline-model-parallel-size 4 $hw"
./train_cpu --dry-run --dry-run-build gpu $vpp4 --num-layers-per-virtual-pipeline-stage 3 > $B/vpp4.plan 2>&1
./train_cpu --dry-run --dry-run-build gpu $vpp4 > $B/vpp4-plain.plan 2>&1
plain_line=$(tail -1 $B/vpp4-plain.plan | sed -E 's/.*: peak/peak/')
from_interleaved=$(grep '^without interleaving (plain 1F1B)' $B/vpp4.plan | sed -E 's/.*: peak/peak/; s/, pipeline .*//')
pp_bytes() { comm_bytes "$1" | awk -F'|' '{ gsub(/ /, "", $3); print $3 }'; }
if grep -qE '^interleaved 1F1B bubble: \(p - 1\) / \(v m \+ p - 1\) = 3 / 11 = 27\.3% ' $B/vpp4.plan &&
   grep -qE '^step = \(m \+ \(p - 1\) / v\) x .* = 5\.5 x ' $B/vpp4.plan && tail -1 $B/vpp4.plan | grep -q ' VPP 2: .*bubble 27\.3%$' &&
   [ "$from_interleaved" = "$plain_line" ] && [ -n "$(pp_bytes $B/vpp4.plan)" ] &&
   [ "$(pp_bytes $B/vpp4.plan)" = "$((2 * $(pp_bytes $B/vpp4-plain.plan)))" ]; then
    ok "PP 4, v = 2, 4 micro-batches: bubble 3/11 of a step of 5.5 slots, twice plain 1F1B's pipeline bytes ($(pp_bytes $B/vpp4.plan)), the plain line its own dry run's"
else bad "the interleaved bubble" "$(grep 'bubble:' $B/vpp4.plan); $(grep '^step' $B/vpp4.plan); bytes $(pp_bytes $B/vpp4.plan) vs $(pp_bytes $B/vpp4-plain.plan); '$from_interleaved' vs '$plain_line'"; fi
# GPipe and ZB-H1 (--pipeline-schedule): GPipe's bubble is 1F1B's, 3/7; ZB-H1's is its walk placed
# with the cost model's forward, backward and W (the weight gradients' GEMMs) of a layer, which
# must equal Qi et al.'s closed form (p - 1)(F + B - W) / (m (F + B + W) + (p - 1)(F + B - W)) (W
# below F here) and be below 1F1B's; --print-schedule draws ZB-H1's walk, each stage F, B and W
# of every micro-batch and (p - 1) / (3 m + p - 1) = 3 / 15 cells idle
pp4="--world-size 4 $gpt2 --micro-batch-size 1 --global-batch-size 4 --pipeline-model-parallel-size 4 $hw"
./train_cpu --dry-run --dry-run-build gpu $pp4 --pipeline-schedule gpipe > $B/gpipe4.plan 2>&1
./train_cpu --dry-run --dry-run-build gpu $pp4 --pipeline-schedule zb-h1 --print-schedule > $B/zb4.plan 2>&1
walked=$(sed -nE 's/^ZB-H1 bubble: .* = ([0-9.]+)% of the step; .*/\1/p' $B/zb4.plan)
closed=$(sed -nE "s/^ZB-H1 bubble: .*; Qi et al.'s .* = ([0-9.]+)%; 1F1B's.*/\1/p" $B/zb4.plan)
cells=$(grep -cE '^stage [0-3]: .*W4' $B/zb4.plan)
if grep -qE '^GPipe bubble: \(p - 1\) / \(m \+ p - 1\) = 3 / 7 = 42\.9% ' $B/gpipe4.plan && [ -n "$walked" ] &&
   [ "$walked" = "$closed" ] && awk -v w="$walked" 'BEGIN { exit !(w < 42.9) }' && tail -1 $B/zb4.plan | grep -q "bubble $walked%$" &&
   [ "$cells" = 4 ] && grep -q 'bubble of each stage, drawn: 3 of 15 cells (20.0%), 3 of 15 cells (20.0%), 3 of 15 cells (20.0%), 3 of 15 cells (20.0%); (p - 1) / (3 m + p - 1) = 3 / 15' $B/zb4.plan; then
    ok "PP 4, 4 micro-batches: GPipe's bubble 3/7 (1F1B's); ZB-H1's walk with the cost model's W $walked%, Qi et al.'s form $closed%; drawn 3 of 15 cells (F, B, W one each)"
else bad "GPipe's and ZB-H1's bubbles" "$(grep 'bubble' $B/gpipe4.plan $B/zb4.plan | head -5)"; fi
# ZB-H1 refuses full recomputation (its W pass reads the layers' inputs): its dry run's recomputed
# alternative says so with the trainer's own reason, where 1F1B's prices it (the line once priced
# what zb-h1 refuses)
./train_cpu --dry-run --dry-run-build gpu $pp4 --pipeline-schedule zb-h1 --checkpoint-activations > $B/zb4-full.out 2>&1
refusal=$(sed -nE 's/^error: //p' $B/zb4-full.out)
./train_cpu --dry-run --dry-run-build gpu $pp4 > $B/1f1b4.plan 2>&1
if [ -n "$refusal" ] && grep -qxF "with every layer recomputed (--checkpoint-activations): refused ($refusal)" $B/zb4.plan &&
   grep -q '^with every layer recomputed (--checkpoint-activations): peak memory per GPU ' $B/1f1b4.plan; then
    ok "ZB-H1's dry run marks its recomputed alternative refused, with the trainer's reason; 1F1B's prices it"
else bad "ZB-H1's recomputed alternative" "refusal '$refusal'; $(grep -h '^with every layer' $B/zb4.plan $B/1f1b4.plan | head -2)"; fi
# --print-schedule draws the order pipeline.h runs: for each (P, v, M, G) below, every stage's
# forwards and backwards (the drawing without its '.' cells) are Megatron-LM's order as
# tests/interleaved_order.py states it from the schedule table, and each stage's drawn bubble
# is the planner's (p - 1) / (v m + p - 1), groups or not (G 0: PP, the default)
drawn_order() { awk '/^stage [0-9]+:/ { printf "%s %s", $1, $2; for (i = 3; i <= NF; i++) if ($i != ".") printf " %s", $i; print "" }' "$1"; }
orders_ok=0 orders_bad=""
# (2 2 5 3, 4 2 9 5, 3 2 11 4: a last group of PP or more but fewer than G, Megatron-LM's docstring's and two more)
for c in "2 2 3 3" "2 2 6 3" "4 2 8 0" "4 2 9 9" "4 2 10 5" "4 3 12 6" "3 2 8 4" "2 4 4 0" "2 2 5 3" "4 2 9 5" "3 2 11 4"; do
    set -- $c
    P=$1 v=$2 M=$3 G=$4 gflag=""
    [ "$G" -gt 0 ] && gflag="--microbatch-group-size-per-virtual-pipeline-stage $G"
    ./train_cpu --dry-run --dry-run-build gpu --world-size $P $model --num-layers $((P * v)) --micro-batch-size 1 --global-batch-size $M \
        --pipeline-model-parallel-size $P --num-virtual-stages-per-pipeline-rank $v $gflag --print-schedule > $B/order-$P-$v-$M-$G.plan 2>&1
    python3 tests/interleaved_order.py $P $v $M $([ "$G" -gt 0 ] && echo $G) --from 1 > $B/order-$P-$v-$M-$G.stated
    bubble=$(awk -v p=$P -v v=$v -v m=$M 'BEGIN { printf "%.1f%%", 100 * (p - 1) / (v * m + p - 1) }')
    if [ "$(drawn_order $B/order-$P-$v-$M-$G.plan)" = "$(cat $B/order-$P-$v-$M-$G.stated)" ] &&
       [ "$(grep '^bubble of each stage, drawn:' $B/order-$P-$v-$M-$G.plan | grep -o "cells ($bubble)" | wc -l)" -eq $P ]; then
        orders_ok=$((orders_ok + 1))
    else orders_bad="$orders_bad P $P v $v M $M G $G;"; fi
done
if [ -z "$orders_bad" ]; then
    ok "--print-schedule: $orders_ok (P, v, M, G) drawn in Megatron-LM's order (tests/interleaved_order.py), each stage's bubble (p - 1) / (v m + p - 1)"
else bad "--print-schedule against Megatron-LM's stated order" "$orders_bad"; fi
# a plain layout's plan names the fastest interleaving it allows, as that layout's own dry run
fastest=$(grep '^with interleaving, the fastest' $B/vpp4-plain.plan)
v=$(sed -nE 's/.*--num-virtual-stages-per-pipeline-rank ([0-9]+).*/\1/p' <<< "$fastest")
own=$(./train_cpu --dry-run --dry-run-build gpu $vpp4 --num-virtual-stages-per-pipeline-rank ${v:-0} 2>&1 | tail -1 | sed -E 's/.*: peak/peak/')
if [ -n "$v" ] && [ "$(sed -E 's/.*\): peak/peak/; s/, pipeline .*//' <<< "$fastest")" = "$own" ]; then
    ok "the plain plan's fastest interleaving (v = $v of 2, 3, 4, 6) is that layout's own dry run"
else bad "the plain plan's interleaving" "'$fastest' vs '$own'"; fi

# the other side of recomputation: the plan's line for it = that layout's own dry run
pp4="$gpt2 --micro-batch-size 1 --global-batch-size 4 --pipeline-model-parallel-size 4 $hw"
alternative=$(grep '^with every layer recomputed' $B/pp4.plan | sed -E 's/.*: peak/peak/; s/, bubble.*//')
own=$(./train_cpu --dry-run --dry-run-build gpu --world-size 4 $pp4 --checkpoint-activations 2>&1 | tail -1 | sed -E 's/.*: peak/peak/; s/, bubble.*//')
back=$(./train_cpu --dry-run --dry-run-build gpu --world-size 4 $pp4 --checkpoint-activations 2>&1 | grep '^without activation recomputation' | sed -E 's/.*: peak/peak/; s/, bubble.*//')
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
./train_cpu --dry-run --dry-run-build gpu --world-size 16 $dp16 > $B/dp16.plan 2>&1
dp_overlap_cost() {  # FLAG ROW WHAT REPLACED-ROW
    local flag=$1 r=$2 what=$3 replaced=$4 name=${1#--}
    ./train_cpu --dry-run --dry-run-build gpu --world-size 16 $dp16 $flag > $B/dp16-$name.plan 2>&1
    ./train_cpu --dry-run --dry-run-build gpu --world-size 16 $dp16 $flag --ddp-bucket-size 1000000000 > $B/dp16-$name-one.plan 2>&1
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

# --- context parallelism on GPT-2 124M over world 4, global batch 64 of 16 x 1024: at CP C, DP 4 / C
# and C micro-batches a pipeline. The context-parallel bytes per step (the busiest rank's, --log-comm's
# fifth group) against the formulas, a block K = 16 x 1024 / C rows x 2 (keys, values) x 12 heads x
# 64 x 2 bytes (bf16), its gradient's partial sums fp32 (2K), 12 layers x C micro-batches:
#   p2p          (C - 1) K forward + (C - 1) K + C 2K backward
#   all_gather   (C - 1) K forward + (C - 1) K + (C - 1) 2K backward (a reduce-scatter of the C blocks' gradients)
#   recomputed   p2p's + (C - 1) K: the recomputed forward's ring again
# The attention's rows at CP 2 and 4 are CP 1's: each rank's share 1/C of the whole sequence's
# attention, over C times the micro-batches.
cp_layout="--world-size 4 $gpt2 --global-batch-size 64 $hw"
cp_bytes() { grep -m1 'communication per step in bytes' "$1" | awk -F'|' '{ gsub(/ /, "", $5); print $5 }'; }
for cp in 1 2 4; do
    ./train_cpu --dry-run --dry-run-build gpu $cp_layout --context-parallel-size $cp > $B/cp$cp.plan 2>&1
    ./train_cpu --dry-run --dry-run-build gpu $cp_layout --context-parallel-size $cp --cp-comm-type all_gather > $B/cp$cp-gather.plan 2>&1
    ./train_cpu --dry-run --dry-run-build gpu $cp_layout --context-parallel-size $cp --checkpoint-activations > $B/cp$cp-recompute.plan 2>&1
    read ring gather recompute <<< "$(awk -v C=$cp 'BEGIN { K = 16 * 1024 / C * 2 * 12 * 64 * 2; n = 12 * C
        printf "%.0f %.0f %.0f\n", n * ((C - 1) * K + (C - 1) * K + C * 2 * K) * (C > 1),
            n * ((C - 1) * K + (C - 1) * K + (C - 1) * 2 * K), n * ((C - 1) * K + (C - 1) * K + C * 2 * K + (C - 1) * K) * (C > 1) }')"
    got="$(cp_bytes $B/cp$cp.plan) $(cp_bytes $B/cp$cp-gather.plan) $(cp_bytes $B/cp$cp-recompute.plan)"
    if [ "$got" = "$ring $gather $recompute" ] && [ "$(row "$fused_row" 2 cp$cp)" = "$(row "$fused_row" 2 cp1)" ] &&
       [ "$(row "$fused_row" 4 cp$cp)" = "$(row "$fused_row" 4 cp1)" ] &&
       tail -1 $B/cp$cp.plan | grep -qE "^dry-run: world 4 TP 1 $( [ $cp -gt 1 ] && echo "CP $cp " )PP 1 DP $((4 / cp)) MBS 16 GBS 64: " &&
       tail -1 $B/cp$cp-gather.plan | grep -qE "^dry-run: world 4 TP 1 $( [ $cp -gt 1 ] && echo "CP $cp all_gather " )PP 1 DP $((4 / cp)) "; then
        ok "CP $cp: context-parallel bytes per step, p2p | all_gather | p2p recomputed = the formulas ($got); the attention's GFLOP and ms = CP 1's; the last line names CP"
    else bad "CP $cp's bytes" "planned '$got', formulas '$ring $gather $recompute'; attention $(row "$fused_row" 2 cp$cp) GFLOP against $(row "$fused_row" 2 cp1); $(tail -1 $B/cp$cp.plan)"; fi
done
# The ring's overlap: each transfer beside one ring step's block attention (a CP-th of the rank's
# share: the line gives the step's forward and backward ms), only what it takes beyond exposed. A
# transfer: 5 us + its bytes at the CP link (--hw-nvlink-bandwidth: the group within a node). The
# forward's C - 1 steps each beside a block K; the backward's step 0 beside K, steps 1 .. C - 2
# beside K and the partial sums 2K (two messages), step C - 1 beside 2K, and the last sums after
# the last step, beside nothing. Per layer and micro-batch, x 12 x C: the total and the hidden
# part on the line, the exposed row = total - hidden, on a slow link (most exposed) and a fast
# one (most hidden); all_gather's collectives beside nothing: their rows' time is their alpha-beta.
for link in 20 4000; do
    for cp in 2 4; do
        plan=$B/cp$cp-link$link.plan
        ./train_cpu --dry-run --dry-run-build gpu $cp_layout --context-parallel-size $cp --hw-nvlink-bandwidth $link \
            --hw-latency-us 5 > $plan 2>&1
        line=$(grep -m1 '^context parallelism, --cp-comm-type p2p' $plan)
        read f b total hidden <<< "$(sed -nE 's/.*block attention \(([0-9.e+-]+) ms forward, ([0-9.e+-]+) ms backward\) on stage 0: the ring takes ([0-9.e+-]+) ms a step, ([0-9.e+-]+) ms of them hidden$/\1 \2 \3 \4/p' <<< "$line")"
        read want_total want_hidden <<< "$(awk -v C=$cp -v f="$f" -v b="$b" -v bw="$link" '
            function t(bytes, n) { return n * 5e-3 + bytes / (bw * 1e9) * 1e3 }   # ms
            function beside(ms, step) { total += ms; hidden += ms < step ? ms : step }
            BEGIN { K = 16 * 1024 / C * 2 * 12 * 64 * 2
                    for (k = 0; k < C - 1; k++) beside(t(K, 1), f)
                    beside(t(K, 1), b); for (k = 1; k < C - 1; k++) beside(t(3 * K, 2), b); beside(t(2 * K, 1), b)
                    total += t(2 * K, 1)
                    printf "%.9g %.9g\n", 12 * C * total, 12 * C * hidden }')"
        exposed=$(row 'context-parallel ring: exposed' 4 cp$cp-link$link)
        if [ -n "$f" ] && near "$total" "$want_total" 1e-5 && near "$hidden" "$want_hidden" 1e-4 &&
           near "$exposed" "$(awk -v a="$total" -v h="$hidden" 'BEGIN { printf "%.2f", a - h }')" 0.001 &&
           near "$(row "$fused_row" 4 cp$cp-link$link)" "$(awk -v C=$cp -v f="$f" -v b="$b" 'BEGIN { print 12 * C * C * (f + b) }')" 0.002; then
            ok "CP $cp at $link GB/s: the ring's transfers $total ms a step, $hidden hidden behind the block steps ($f ms forward, $b backward: the attention row over 12 C^2), $exposed ms exposed, as the formula"
        else bad "CP $cp's ring at $link GB/s" "line '$line'; want total $want_total, hidden $want_hidden; exposed row $exposed"; fi
    done
done
gather_ms=$(row 'context-parallel all-gather' 4 cp4-gather) scatter_ms=$(row 'context-parallel reduce-scatter' 4 cp4-gather)
read want_gather want_scatter <<< "$(awk 'BEGIN { K = 16 * 1024 / 4 * 2 * 12 * 64 * 2; n = 12 * 4
    printf "%.2f %.2f\n", 2 * n * (3 * 5e-3 + 3 * K / 450e9 * 1e3), n * (3 * 5e-3 + 3 * 2 * K / 450e9 * 1e3) }')"
if [ "$gather_ms" = "$want_gather" ] && [ "$scatter_ms" = "$want_scatter" ] && ! grep -q 'ring: exposed' $B/cp4-gather.plan &&
   grep -q '^context parallelism, --cp-comm-type all_gather over CP 4: .* beside no compute$' $B/cp4-gather.plan; then
    ok "CP 4 all_gather: the all-gathers ($gather_ms ms) and the reduce-scatter ($scatter_ms ms) by alpha-beta on NVLink, beside no compute"
else bad "CP 4 all_gather's time" "all-gather $gather_ms (want $want_gather), reduce-scatter $scatter_ms (want $want_scatter)"; fi

# --- tests/fit_matmul_efficiency.sh (bench_gpu.sh's fit of the GEMM constant to the GEMMs' own
# measured time): the plan's "GEMMs only" line is the sum of its cuBLAS rows; given the GEMM time
# the planner prices at efficiency 0.37 on one GPU, the fit finds 0.37 again, and again when the
# fused attention is priced four times slower (the step changes, the GEMMs do not: no other
# constant folds into this one); a GEMM time faster than any efficiency allows is out of reach.
one_gpu="--world-size 1 $gpt2 --global-batch-size 16 $hw"
gemm_line() { sed -nE 's/^GEMMs only \(the cuBLAS rows\): ([0-9.e+-]+) ms .*/\1/p' "$1"; }
./train_cpu --dry-run --dry-run-build gpu $one_gpu --hw-matmul-efficiency 0.37 > $B/at37.plan 2>&1
./train_cpu --dry-run --dry-run-build gpu $one_gpu --hw-matmul-efficiency 0.37 --hw-attention-efficiency 0.0625 > $B/at37-slow-attention.plan 2>&1
at37=$(gemm_line $B/at37.plan)
rows=$(grep -F 'cuBLAS' $B/at37.plan | grep -E '^  ' | sed -E 's/^  .{44} //' | awk -F'|' '{ s += $4 } END { print s }')
fit=$(bash tests/fit_matmul_efficiency.sh "$at37" $one_gpu)
fit_slow=$(bash tests/fit_matmul_efficiency.sh "$at37" $one_gpu --hw-attention-efficiency 0.0625)
beyond=$(bash tests/fit_matmul_efficiency.sh 1 $one_gpu)
if [ -n "$at37" ] && near "$at37" "$rows" 0.002 && [ "$fit" = "0.370" ] && [ "$fit_slow" = "0.370" ] &&
   [ "$(gemm_line $B/at37-slow-attention.plan)" = "$at37" ] && [ "$(tail -1 $B/at37.plan)" != "$(tail -1 $B/at37-slow-attention.plan)" ] &&
   [[ "$beyond" == "no matmul efficiency in [0.01, 1] gives GEMMs of 1 ms"* ]]; then
    ok "fit_matmul_efficiency: the planner's GEMMs at efficiency 0.37 ($at37 ms, the sum of its cuBLAS rows) fit back to $fit, with a 4x slower attention too; 1 ms is out of reach"
else bad "fit_matmul_efficiency" "GEMMs at 0.37: '$at37' ms (rows $rows), fitted '$fit', with a slower attention '$fit_slow'; 1 ms: '$beyond'"; fi

# --- --attention-backend auto takes what the cost model prices faster: the fused kernels for
# 124M (the attention line gives both estimates, and the plan is --attention-backend flash's), the
# unfused path when the fused kernels are priced at 1% of the peak (the plan is unfused's), the
# unfused path where the head size is not the fused kernels' (8); --hw v100-32gb has no fused
# kernels: auto takes the unfused path, flash is refused in one line
attention_line() { ./train_cpu --dry-run --dry-run-build gpu "$@" 2>&1 | grep -m1 '^attention: '; }
./train_cpu --dry-run --dry-run-build gpu $one_gpu --hw-attention-efficiency 0.01 > $B/auto-slow.plan 2>&1
./train_cpu --dry-run --dry-run-build gpu $one_gpu --hw-attention-efficiency 0.01 --attention-backend unfused > $B/unfused-slow.plan 2>&1
fast=$(grep -m1 '^attention: ' $B/gpt2-flash.plan) slow=$(grep -m1 '^attention: ' $B/auto-slow.plan)
small=$(attention_line $one_gpu --hidden-size 96 --num-attention-heads 12) v100=$(attention_line --world-size 1 $gpt2 --hw v100-32gb)
estimates='the planner estimates a layer.s attention, forward and backward, at ([0-9.e-]+) ms (fused|unfused) against ([0-9.e-]+) ms'
if [[ "$fast" =~ ^attention:\ fused,.*auto:\ $estimates\ unfused ]] && [[ "$slow" =~ ^attention:\ unfused,.*auto:\ $estimates\ fused ]] &&
   [ "$(tail -1 $B/auto-slow.plan)" = "$(tail -1 $B/unfused-slow.plan)" ] &&
   [[ "$small" == "attention: unfused,"*"auto: the fused kernels do not take head size 8)" ]] &&
   [[ "$v100" == "attention: unfused,"*"auto: --hw v100-32gb's GPU has no fused kernels"* ]]; then
    ok "--attention-backend auto: fused for 124M, unfused when the fused kernels are priced slower, at head size 8 and on V100, saying why"
else bad "--attention-backend auto" "$fast / $slow / $small / $v100"; fi

# --- next to BigScience's published tune-up (tests/data/tuneup/README.md; docs/cluster.md):
# the planned step and TFLOPs per GPU over the published, within 0.88-1.17, for the 200B on 320
# A100s at MBS 1, 2, 4, 8 (the matmul efficiency of A100 fitted to MBS 1) and the 104B on 128
# V100s (V100's fitted to it)
tuneup() {  # NAME PUBLISHED-S PUBLISHED-TFLOPS SCRIPT FLAGS...
    local name=$1 sec=$2 tf=$3 script=$4; shift 4
    local last step tflops
    last=$(scripts/configs/$script.sh --dry-run "$@" 2>&1 | tail -1)
    step=$(sed -nE 's/.*, step ([0-9.]+) s, ([0-9.]+) TFLOPs per GPU.*/\1/p' <<< "$last")
    tflops=$(sed -nE 's/.*, step ([0-9.]+) s, ([0-9.]+) TFLOPs per GPU.*/\2/p' <<< "$last")
    if [ -n "$step" ] && awk -v a="$step" -v b="$sec" -v c="$tflops" -v d="$tf" \
           'BEGIN { r = a / b; q = c / d; exit !(r >= 0.88 && r <= 1.17 && q >= 0.88 && q <= 1.17) }'; then
        ok "tune-up $name: step $step s against $sec published ($(awk -v a="$step" -v b="$sec" 'BEGIN { printf "%.2f", a / b }')), $tflops TFLOPs against $tf ($(awk -v a="$tflops" -v b="$tf" 'BEGIN { printf "%.2f", a / b }'))"
    else bad "tune-up $name" "planned '$last' against $sec s, $tf TFLOPs published"; fi
}
a200="--hw a100-80gb --world-size 320 --num-layers 80 --hidden-size 14400 --num-attention-heads 96 --vocab-size 250880
      --tensor-model-parallel-size 8 --pipeline-model-parallel-size 10 --rampup-batch-size 0 0 0"
tuneup "200B A100 MBS 1" 221.21 94.39 tr11-176B-bloom $a200 --micro-batch-size 1
tuneup "200B A100 MBS 2" 207.92 100.43 tr11-176B-bloom $a200 --micro-batch-size 2
tuneup "200B A100 MBS 4" 208.18 100.30 tr11-176B-bloom $a200 --micro-batch-size 4
tuneup "200B A100 MBS 8" 229.69 90.91 tr11-176B-bloom $a200 --micro-batch-size 8
tuneup "104B V100" 696 39.17 tr8-104B --hw v100-32gb --hw-gpus-per-node 4 --world-size 128

# --- --sweep: world 8 of a model with 4 heads, FFN 128, 4 layers, global batch 8; where TP > 1
# each layout with --sequence-parallel and without (the sequence of 16 splits over TP 2 and 4);
# context parallelism CP 1, 2, 4, 8 (16 tokens cut into 2 CP chunks); ZeRO-1, 2 and 3 where
# DP x CP > 1
sweep_model="--vocab-size 257 --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --global-batch-size 8"
./train_cpu --dry-run --dry-run-build gpu --sweep --world-size 8 $sweep_model > $B/sweep.out 2>&1
status=$?
# counted here: TP | 4 heads and 128, TP x CP x PP | 8, 2 CP | 16, PP | 4 layers (uniform), MBS |
# 8 / DP; each such layout with and without sequence parallelism where TP > 1 (16 / CP tokens over
# TP); and each interleaved with v >= 2 chunks of a stage's 4 / PP layers when PP > 1 and PP | its
# micro-batches
expected=0 expected_sp=0 expected_cp=0
for tp in 1 2 4 8; do for cp in 1 2 4 8; do for pp in 1 2 4 8; do
    [ $((8 % (tp * cp * pp))) -eq 0 ] && [ $((16 % (2 * cp))) -eq 0 ] || continue
    dp=$((8 / (tp * cp * pp)))
    for mbs in 1 2 3 4 5 6 7 8; do
        [ $((4 % tp)) -eq 0 ] && [ $((128 % tp)) -eq 0 ] && [ $((4 % pp)) -eq 0 ] && [ $((8 % (mbs * dp))) -eq 0 ] || continue
        schedules=1
        for v in 2 3 4; do
            [ $pp -gt 1 ] && [ $(((4 / pp) % v)) -eq 0 ] && [ $((8 / (mbs * dp) % pp)) -eq 0 ] && schedules=$((schedules + 1))
        done
        sp=$(( tp > 1 && (16 / cp) % tp == 0 ))
        stages=$(( dp * cp > 1 ? 3 : 1 ))   # ZeRO-1, 2 and 3 where DP x CP shards (no --zero-stage given)
        expected=$((expected + schedules * (1 + sp) * stages)) expected_sp=$((expected_sp + schedules * sp * stages))
        expected_cp=$((expected_cp + schedules * (1 + sp) * (cp > 1) * stages))
    done
done; done; done
lines=$(grep -c '^dry-run: ' $B/sweep.out) sp_lines=$(grep -cE ' SP( ZeRO-[23])?: ' $B/sweep.out) cp_lines=$(grep -c '^dry-run: world 8 TP [0-9]* CP ' $B/sweep.out)
# (-s: equal times printed to other digits, 0.00100 and 0.0010, are not then compared as text)
sorted=$(grep '^dry-run: ' $B/sweep.out | sed -E 's/.*, step ([0-9.]+) s,.*/\1/' | sort -s -g -c 2>&1 && echo yes)
if [ $status -eq 0 ] && [ "$lines" -eq "$expected" ] && [ "$sorted" = yes ] && grep -q "^sweep: $expected layout(s) of world 8" $B/sweep.out &&
   [ "$sp_lines" -eq "$expected_sp" ] && [ "$cp_lines" -eq "$expected_cp" ] && [ "$expected_cp" -gt 0 ] &&
   grep -q '^dry-run: world 8 TP 1 CP 8 PP 1 DP 1 ' $B/sweep.out; then
    ok "--sweep: all $expected layouts the model and batch allow at world 8 ($sp_lines with --sequence-parallel, $cp_lines with CP 2, 4 or 8), fastest first"
else bad "--sweep" "status $status, $lines lines (expected $expected), $sp_lines SP (expected $expected_sp), $cp_lines CP (expected $expected_cp), sorted: $sorted; $(head -2 $B/sweep.out)"; fi
# a sweep's line is the single dry run's last line of that layout, with and without SP, plain and interleaved
for sp in "" --sequence-parallel; do
    line=$(grep -m1 "TP 2 PP 2 DP 2 MBS 2 GBS 8${sp:+ SP}: " $B/sweep.out)
    single=$(./train_cpu --dry-run --dry-run-build gpu --world-size 8 $sweep_model --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
        --micro-batch-size 2 $sp 2>&1 | tail -1)
    if [ -n "$line" ] && [ "$line" = "$single" ]; then ok "a sweep's line = that layout's own dry run${sp:+ (with $sp)}"
    else bad "a sweep's line${sp:+ with $sp}" "sweep: $line / single: $single"; fi
done
# and with context parallelism
cp_line=$(grep -m1 'TP 2 CP 2 PP 1 DP 2 MBS 2 GBS 8 SP: ' $B/sweep.out)
cp_single=$(./train_cpu --dry-run --dry-run-build gpu --world-size 8 $sweep_model --tensor-model-parallel-size 2 --context-parallel-size 2 \
    --micro-batch-size 2 --sequence-parallel 2>&1 | tail -1)
if [ -n "$cp_line" ] && [ "$cp_line" = "$cp_single" ]; then ok "a sweep's line = that layout's own dry run, with CP 2 (and SP)"
else bad "a sweep's CP line" "sweep: $cp_line / single: $cp_single"; fi
# a ZeRO-3 row is that layout's own dry run with --zero-stage 3; --zero-stage given: that stage's rows alone
zero_line=$(grep -m1 'TP 2 PP 1 DP 4 MBS 1 GBS 8 ZeRO-3: ' $B/sweep.out)
zero_single=$(./train_cpu --dry-run --dry-run-build gpu --world-size 8 $sweep_model --tensor-model-parallel-size 2 \
    --micro-batch-size 1 --zero-stage 3 2>&1 | tail -1)
./train_cpu --dry-run --dry-run-build gpu --sweep --world-size 8 $sweep_model --zero-stage 2 > $B/sweep-z2.out 2>&1
z2_rows=$(grep -c '^dry-run: .* ZeRO-2: ' $B/sweep-z2.out) z2_all=$(grep -c '^dry-run: ' $B/sweep-z2.out)
if [ -n "$zero_line" ] && [ "$zero_line" = "$zero_single" ] && [ "$(grep -c ' ZeRO-3: ' $B/sweep.out)" -ge 1 ] &&
   [ "$z2_all" -gt 0 ] && ! grep '^dry-run: ' $B/sweep-z2.out | grep -q ' ZeRO-3: '; then
    ok "--sweep plans ZeRO-2 and 3 beside ZeRO-1 (a ZeRO-3 row = that layout's own dry run); with --zero-stage 2 given, that stage alone ($z2_rows ZeRO-2 rows of $z2_all)"
else bad "--sweep over ZeRO stages" "sweep: $zero_line / single: $zero_single; with --zero-stage 2: $z2_rows of $z2_all"; fi
interleaved_line=$(grep -m1 'TP 2 PP 2 DP 2 MBS 2 GBS 8 VPP 2:' $B/sweep.out)
interleaved_single=$(./train_cpu --dry-run --dry-run-build gpu --world-size 8 $sweep_model --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
    --micro-batch-size 2 --num-layers-per-virtual-pipeline-stage 1 2>&1 | tail -1)
if [ -n "$interleaved_line" ] && [ "$interleaved_line" = "$interleaved_single" ]; then
    ok "a sweep's line = that layout's own dry run, interleaved (VPP 2)"
else bad "a sweep's interleaved line" "sweep: $interleaved_line / single: $interleaved_single"; fi
# above the memory: OOM marked, after those that fit
./train_cpu --dry-run --dry-run-build gpu --sweep --world-size 8 $sweep_model --hw-memory-gib 0.00001 --hw-reserve-gib 0.0000001 > $B/sweep-oom.out 2>&1
if [ "$(grep -c ' OOM$' $B/sweep-oom.out)" -eq "$expected" ] && grep -q "(0 fit, $expected above memory: OOM)" $B/sweep-oom.out; then
    ok "--sweep marks every layout above --hw-memory-gib OOM"
else bad "--sweep OOM" "$(head -3 $B/sweep-oom.out)"; fi

refused() {  # name needle flags...: exit 2 and one line (besides the start-up notes of checks passed before)
    local name=$1 needle=$2; shift 2
    ./train_cpu "$@" 2>&1 | grep -v '^note: ' > $B/refused.out
    local status=${PIPESTATUS[0]}
    if [ $status -eq 2 ] && [ "$(wc -l < $B/refused.out)" -eq 1 ] && grep -qF -- "$needle" $B/refused.out; then ok "$name"
    else bad "$name" "status $status: $(head -3 $B/refused.out)"; fi
}
refused "--sweep without --dry-run, in one line" "--sweep goes with --dry-run" --sweep --vocab-size 100 --data-path x
refused "--sweep without a global batch, in one line" "--sweep needs --global-batch-size" --dry-run --sweep --vocab-size 100
refused "an unknown --hw, in one line" "--hw must be one of v100-32gb | a100-40gb | a100-80gb | h100-80gb" \
    --dry-run --vocab-size 100 --hw tpu
refused "a negative --hw-latency-us, in one line" "--hw-latency-us must be at least 0" --dry-run --vocab-size 100 --hw-latency-us -1
for flag in --hw-attention-efficiency --hw-memory-efficiency --hw-matmul-efficiency; do
    refused "a negative $flag, in one line" "$flag must be at least 0" --dry-run --vocab-size 100 $flag -0.5
    refused "$flag above 1, in one line" "$flag 1.5: a fraction of the peak, at most 1" --dry-run --vocab-size 100 $flag 1.5
done
refused "a negative --hw-sm-count, in one line" "--hw-sm-count must be at least 0" --dry-run --vocab-size 100 --hw-sm-count -2
refused "--attention-backend flash on --hw v100-32gb, in one line" "--attention-backend flash: --hw v100-32gb's GPU has no fused attention kernels" \
    --dry-run --vocab-size 100 --hw v100-32gb --hidden-size 128 --num-attention-heads 2 --attention-backend flash
refused "--hw without --dry-run, in one line" "--hw and --hw-* describe the cluster a --dry-run prices its step on" \
    --hw v100-32gb --vocab-size 100 --data-path x
refused "an --hw-* number without --dry-run, in one line" "--hw and --hw-* describe the cluster" \
    --hw-gpus-per-node 4 --vocab-size 100 --data-path x

# --- a mixture of experts (issue 50): the model FLOPs count a MoE layer's active parameters (the
# router's h E, k of E experts', the shared expert's and its gate's: config.h mlp_multiply_adds),
# written out here layer by layer; the cost table prices the experts on their N k rows (the same
# FLOPs), so the utilization stays below 100% (it read 144% when one dense MLP's time stood for k
# experts); --moe-imbalance prices the busiest expert; expert parallelism: the all-to-alls'
# bytes, the experts' memory at 1/EP (tests/test_dry_run.sh holds EP's plans to the allocations),
# --sweep over EP, the smallest EP that fits
moe_model="--vocab-size 257 --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --micro-batch-size 4
           --global-batch-size 32 --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 512 --moe-layer-freq 2
           --moe-shared-expert-intermediate-size 256 --swiglu --disable-bias-linear --ffn-hidden-size 1024"
MOE_PLAN="./train_cpu --dry-run --dry-run-build gpu $moe_model $hw"
$MOE_PLAN --world-size 1 --attention-backend unfused > $B/moe.plan 2>&1
# layers 0 and 2 MoE (--moe-layer-freq 2), 1 and 3 dense; 8 micro-batches of N = 512 tokens; bf16
read moe_flops experts_gflop <<< "$(awk 'BEGIN { G = 32; s = 128; h = 256; n = 4; d = 64; V = 384; F = 1024; Fe = 512; Fs = 256
    E = 4; k = 2; N = 4 * s
    for (l = 0; l < 4; l++) {
        mlp = l % 2 ? 3 * h * F : h * E + k * 3 * h * Fe + 3 * h * Fs + h
        flops += 3 * (2 * G * s * (h * 3 * n * d + h * h + mlp) + 4 * G * s * s * h)
    }
    flops += 3 * 2 * G * s * h * V
    printf "%.6g %.1f\n", flops, 8 * 2 * 2 * N * k * 3 * h * Fe / 1e9 }')"
planned=$(sed -nE 's/^model FLOPs per step: ([0-9.e+]+) .*/\1/p' $B/moe.plan)
table=$(grep -E '^  ' $B/moe.plan | grep -F '|' | grep -v planned | sed -E 's/^  .{44} //' | awk -F'|' '{ s += $2 } END { print s * 1e9 }')
if near "$planned" "$moe_flops" 0.0005 && [ "$(row 'MoE experts forward (cuBLAS, per expert)' 2 moe)" = "$experts_gflop" ] &&
   [ "$(row 'MoE experts backward (cuBLAS, per expert)' 2 moe)" = "$(awk -v f="$experts_gflop" 'BEGIN { printf "%.1f", 2 * f }')" ] &&
   near "$table" "$moe_flops" 0.01 && [ "$(row 'MoE experts forward (cuBLAS, per expert)' 1 moe)" = 128 ]; then
    ok "MoE: model FLOPs $planned = the active parameters' count written out ($moe_flops); the experts priced on their N k rows, one GEMM pair an expert (forward $experts_gflop GFLOP in 128 launches); the table's FLOPs add up to the model's"
else bad "MoE FLOPs" "model $planned against $moe_flops; experts forward $(row 'MoE experts forward (cuBLAS, per expert)' 2 moe) GFLOP in $(row 'MoE experts forward (cuBLAS, per expert)' 1 moe) launches against $experts_gflop in 128; table $table"; fi
# the issue's own command (the CPU build, priced on this machine): the utilization was 144%
mfu_of() { sed -nE 's/.*model FLOPs utilization ([0-9.]+)%.*/\1/p' "$1"; }
./train_cpu --vocab-size 257 --num-experts 4 --world-size 2 --dry-run > $B/moe-cpu.plan 2>&1
if [ -n "$(mfu_of $B/moe-cpu.plan)" ] && awk -v u="$(mfu_of $B/moe-cpu.plan)" -v g="$(mfu_of $B/moe.plan)" 'BEGIN { exit !(u > 0 && u <= 100 && g > 0 && g <= 100) }'; then
    ok "MoE: model FLOPs utilization at most 100% ($(mfu_of $B/moe-cpu.plan)% on this CPU, $(mfu_of $B/moe.plan)% planned on the GPU)"
else bad "MoE utilization" "$(grep '^throughput' $B/moe-cpu.plan) / $(grep '^throughput' $B/moe.plan)"; fi
# --moe-imbalance X at EP = E (an expert a rank): the busiest rank's experts compute X times the
# mean's rows; at EP 1 the rank's rows stay N k (the same FLOPs), the GEMMs' shapes alone change
$MOE_PLAN --world-size 4 --expert-model-parallel-size 4 > $B/moe-ep4.plan 2>&1
$MOE_PLAN --world-size 4 --expert-model-parallel-size 4 --moe-imbalance 1.5 > $B/moe-ep4-skewed.plan 2>&1
$MOE_PLAN --world-size 1 --attention-backend unfused --moe-imbalance 2 > $B/moe-skewed.plan 2>&1
ep4=$(row 'MoE experts forward (cuBLAS, per expert)' 2 moe-ep4) ep4_skewed=$(row 'MoE experts forward (cuBLAS, per expert)' 2 moe-ep4-skewed)
if [ -n "$ep4" ] && near "$ep4_skewed" "$(awk -v f="$ep4" 'BEGIN { print 1.5 * f }')" 0.01 &&
   [ "$(row 'MoE experts forward (cuBLAS, per expert)' 2 moe-skewed)" = "$experts_gflop" ]; then
    ok "--moe-imbalance 1.5 at EP 4: the busiest rank's experts priced at 1.5 x the mean's rows ($ep4_skewed GFLOP against $ep4); at EP 1 the same FLOPs"
else bad "--moe-imbalance" "EP 4: $ep4_skewed GFLOP against $ep4; EP 1 skewed: $(row 'MoE experts forward (cuBLAS, per expert)' 2 moe-skewed)"; fi
# expert parallelism at world 4 (DP 4): each MoE layer's micro-batch sends 5 all-to-alls (the
# dispatch, the combine, and in the backward the rows again, the outputs' gradients, the inputs'
# back: layers.h; 7 with every layer recomputed), each (EP - 1) / EP of its N k rows of C in bf16;
# the experts' gradients and ZeRO state over the expert-DP group (4 / EP ranks)
ep_bytes() { comm_bytes "$1" | awk -F'|' '{ gsub(/ /, "", $6); print $6 }'; }
edp_bytes() { comm_bytes "$1" | awk -F'|' '{ gsub(/ /, "", $7); print $7 }'; }
$MOE_PLAN --world-size 4 --expert-model-parallel-size 2 > $B/moe-ep2.plan 2>&1
$MOE_PLAN --world-size 4 --expert-model-parallel-size 2 --checkpoint-activations > $B/moe-ep2-recompute.plan 2>&1
$MOE_PLAN --world-size 4 > $B/moe-ep1.plan 2>&1
a2a() { awk -v ep=$1 -v n=$2 'BEGIN { printf "%.0f", 2 * 2 * n * (ep - 1) / ep * 512 * 2 * 256 * 2 }'; }   # micro-batches x MoE layers x ...
got="$(ep_bytes $B/moe-ep1.plan) $(ep_bytes $B/moe-ep2.plan) $(ep_bytes $B/moe-ep4.plan) $(ep_bytes $B/moe-ep2-recompute.plan)"
want="0 $(a2a 2 5) $(a2a 4 5) $(a2a 2 7)"
if [ "$got" = "$want" ] && [ "$(edp_bytes $B/moe-ep2.plan)" -gt 0 ] && [ "$(edp_bytes $B/moe-ep4.plan)" = 0 ]; then
    ok "expert parallelism: the all-to-alls' bytes per step at EP 1, 2, 4 and 2 recomputed = 2 micro-batches x 2 MoE layers x 5 (7) x (EP - 1) / EP x N k C x 2 bytes ($got); the experts' ZeRO over DP / EP (none at EP 4)"
else bad "the all-to-alls' bytes" "$got against $want; expert-DP $(edp_bytes $B/moe-ep2.plan), $(edp_bytes $B/moe-ep4.plan)"; fi
# the memory at EP: the experts' E x 3 h Fe parameters a MoE layer 1/EP on a rank, in a region of
# the flat buffers padded over the expert-DP group (4 / EP), the rest padded over DP 4; the
# optimizer's 12 bytes of each shard's parameter (the activations: the model's layout, held to
# the allocations in tests/test_dry_run.sh)
params_of() { sed -nE 's/^  planned \(stage 0, [^)]*\): ([0-9]+) parameters:.*/\1/p' "$1"; }
bytes_of() { sed -nE 's/^  planned \(stage 0\) in bytes: (.*)/\1/p' "$1" | tr -d '|'; }
total=$(params_of $B/moe-ep1.plan)
memory_ok="" memory_bad=""
for ep in 2 4; do
    want=$(awk -v P="$total" -v ep=$ep 'function up(n, m) { return int((n + m - 1) / m) * m }
        BEGIN { X = 2 * 4 * 3 * 256 * 512; D = P - X; held = X / ep; z = 4; ez = 4 / ep
                printf "%d %d %d %d", D + held, (up(D, z) + up(held, ez)) * 2, (up(D, z) + up(held, ez)) * 4,
                       12 * (up(D, z) / z + up(held, ez) / ez) }')
    read w_params w_pbytes w_grads w_opt <<< "$want"
    read pbytes grads opt act _ _ <<< "$(bytes_of $B/moe-ep$ep.plan)"
    got="$(params_of $B/moe-ep$ep.plan) $pbytes $grads $opt"
    if [ "$got" = "$w_params $w_pbytes $w_grads $w_opt" ]; then memory_ok="$memory_ok EP $ep: $got;"
    else memory_bad="$memory_bad EP $ep: $got against $w_params $w_pbytes $w_grads $w_opt;"; fi
done
if [ -z "$memory_bad" ] && [ -n "$total" ]; then
    ok "expert parallelism's memory: the experts' parameters, gradients and optimizer state 1/EP (ZeRO over DP / EP) (parameters, their bytes, gradients, optimizer:$memory_ok)"
else bad "expert parallelism's memory" "$memory_bad (EP 1: $total parameters)"; fi
# --sweep with experts: each layout (TP 1: the experts' TP is not built) with EP 1, and again
# with each EP of 2 and 4 that divides DP x CP; a line = that layout's own dry run
$MOE_PLAN --sweep --world-size 4 > $B/moe-sweep.out 2>&1
count_ep() { grep '^dry-run: ' $B/moe-sweep.out | grep -c " EP $1 "; }
# the layouts with DP x CP divisible by EP, among those without EP
divisible() { grep '^dry-run: ' $B/moe-sweep.out | grep -v ' EP ' | sed -E 's/.* TP [0-9]+ (CP ([0-9]+) )?PP [0-9]+ DP ([0-9]+) .*/\2 \3/' |
              awk -v ep=$1 '{ cp = NF == 2 ? $1 : 1; if ((cp * $NF) % ep == 0) n++ } END { print n + 0 }'; }
sweep_line=$(grep -m1 'TP 1 PP 1 DP 4 EP 2 MBS 4 GBS 32:' $B/moe-sweep.out)
sweep_single=$($MOE_PLAN --world-size 4 --expert-model-parallel-size 2 2>&1 | tail -1)
if [ "$(count_ep 2)" -gt 0 ] && [ "$(count_ep 2)" = "$(divisible 2)" ] && [ "$(count_ep 4)" = "$(divisible 4)" ] &&
   [ "$(count_ep 4)" -gt 0 ] && [ -n "$sweep_line" ] && [ "$sweep_line" = "$sweep_single" ]; then
    ok "--sweep with experts: each layout again at EP 2 ($(count_ep 2)) and 4 ($(count_ep 4)) where they divide DP x CP; a line = its own dry run"
else bad "--sweep over EP" "EP 2: $(count_ep 2) lines against $(divisible 2); EP 4: $(count_ep 4) against $(divisible 4); '$sweep_line' / '$sweep_single'"; fi
# above the memory: the smallest EP that fits (0.1160 GiB at EP 1; 0.1190 at EP 2, whose dropless
# expert rows, 2 x 512 x min(2, 2) a layer, double EP 1's 512 x 2 while the experts' state halves;
# 0.1146 at EP 4, the same rows and a quarter of the state)
$MOE_PLAN --world-size 4 --hw-memory-gib 0.1163 --hw-reserve-gib 0.001 > $B/moe-oom.plan 2>&1
fit=$(grep '^the smallest expert parallelism that fits' $B/moe-oom.plan)
if tail -1 $B/moe-oom.plan | grep -q ' OOM$' && [[ "$fit" == *"--expert-model-parallel-size 4: "* ]]; then
    ok "above the memory with experts: the smallest EP that fits is named ($fit)"
else bad "the smallest EP that fits" "$(tail -1 $B/moe-oom.plan) / $fit"; fi
refused "--moe-imbalance without --dry-run, in one line" "--moe-imbalance is the load a --dry-run prices" \
    --moe-imbalance 2 --vocab-size 100 --num-experts 4 --data-path x
refused "--moe-imbalance above E / k, in one line" "--moe-imbalance 3: the busiest expert's tokens over the mean are 1" \
    --dry-run --vocab-size 100 --num-experts 4 --moe-imbalance 3
# Mixtral 8x7B (scripts/configs/mixtral-8x7B.sh, docs/moe-plan.md) on 64 H100s: its layout at EP 8 and CP 2
# fits, the same without EP does not and names EP 2; the page's pasted plan is today's
scripts/configs/mixtral-8x7B.sh --dry-run --hw h100-80gb 2>&1 | grep -v '^note: ' > $B/mixtral.plan
scripts/configs/mixtral-8x7B.sh --dry-run --hw h100-80gb --expert-model-parallel-size 1 > $B/mixtral-ep1.plan 2>&1
pasted=$(sed -n '/^\$ scripts\/configs\/mixtral-8x7B.sh --dry-run --hw h100-80gb$/,/^```$/p' docs/moe-plan.md | sed '1d;$d')
if [[ "$(tail -1 $B/mixtral.plan)" == "dry-run: world 64 TP 1 CP 2 PP 4 DP 8 EP 8 MBS 1 GBS 256: "* ]] &&
   ! tail -1 $B/mixtral.plan | grep -q OOM && tail -1 $B/mixtral-ep1.plan | grep -q ' OOM$' &&
   grep -q '^the smallest expert parallelism that fits: --expert-model-parallel-size 2: ' $B/mixtral-ep1.plan &&
   [ "$pasted" = "$(cat $B/mixtral.plan)" ]; then
    ok "Mixtral 8x7B on 64 H100s: TP 1 x CP 2 x PP 4 x DP 8 with EP 8 fits, EP 1 does not and names EP 2; docs/moe-plan.md's plan is the planner's"
else bad "Mixtral 8x7B's plan" "$(tail -1 $B/mixtral.plan) / $(tail -1 $B/mixtral-ep1.plan); pasted = planned: $([ "$pasted" = "$(cat $B/mixtral.plan)" ] && echo yes || echo no)"; fi
