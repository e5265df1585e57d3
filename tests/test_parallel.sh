#!/usr/bin/env bash
# tests/test_parallel.sh DATA_PREFIX — every parallel layout trains exactly like one process.
# A tiny model with gradient accumulation and batch-size ramp-up trains 22 steps under each
# (TP, PP, DP) layout; losses and grad norms at every step and the final weights must match
# the (1,1,1) run within 1e-5 relative (tests/test_parallel.c records and compares), with
# sequence parallelism too (TP 2 and 4, ALiBi with the embedding LayerNorm; Llama's shape: rope,
# RMSNorm, SwiGLU, grouped-query attention, untied, no biases), the interleaved
# schedule's layouts too, bit for bit as plain 1F1B's, in its order. Also:
# the same layout twice is bit-identical, so is each layout with activation recomputation,
# dropout 0.1 (Megatron-LM's default, gridgpt's) is on throughout and differs from dropout 0,
# optimizer state shrinks as 1/DP, the communication counters match the ring formulas, and a
# grid that does not fit is refused; 8-bit Adam (--use-bnb-optimizer) trains within 1% of
# 32-bit Adam's loss, its DP layouts near one process's, its state 2 bytes a parameter.
set -u
data=${1:?usage: test_parallel.sh DATA_PREFIX}
B=tests/build/parallel
mkdir -p $B
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none"
ok() { echo "PASS $1"; }
bad() { echo "FAIL $1: $2"; }

# 4 layers (PP up to 4), 4 heads (TP up to 4); ramp 8 -> 16 over 64 samples: 9 ramp steps,
# then (288 - 80) / 16 = 13 full ones; 1 to 8 micro-batches per step depending on DP. Dropout
# is on, Megatron-LM's 0.1 hidden and attention (gridgpt's default): every layout draws one
# process's masks. (Seed 12: with seed 11 and dropout, step 20's gradient is ~1000x as sensitive
# to the weights' last bits as its neighbours' (measured: a smooth curvature, the same in one
# process for the 4e-7 by which layouts' sums of step 19 differ), and the grad norms of every
# layout, one process's masks and all, part by 3e-4 there and agree to 1e-7 at every other step.)
flags="--data-path $data --vocab-size 257 --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16
       --micro-batch-size 2 --global-batch-size 16 --rampup-batch-size 8 8 64 --train-samples 288
       --lr 3e-3 --lr-warmup-samples 32 --lr-decay-style cosine --min-lr 3e-4 --weight-decay 0.1
       --split 90,10,0 --eval-interval 10 --eval-iters 1 --log-interval 100 --seed 12 --log-comm"

record() {  # name tp pp dp [extra flags]
    local name=$1 tp=$2 pp=$3 dp=$4; shift 4
    rm -rf $B/$name.ckpt
    $MPIRUN -np $((tp * pp * dp)) $B/../test_parallel $B/$name $flags \
        --tensor-model-parallel-size $tp --pipeline-model-parallel-size $pp "$@" > $B/$name.log 2>&1
    local status=$?
    grep -E '^(PASS|FAIL)' $B/$name.log | sed "s/^\(PASS\|FAIL\) /\1 $name: /"
    [ $status -eq 0 ] || bad "$name run" "exit status $status: $(grep -m1 error $B/$name.log)"
}

# Activation recomputation changes no value: each layout runs again with one of its forms
# (every method, chunk lengths that divide a stage's layers and one that does not), and its
# losses, grad norms, weights and optimizer state must be the same bits. A layout marked "sp"
# runs with --sequence-parallel (Korthikanti et al. 2022: the LayerNorm and residual rows split
# over the tensor ranks, whose recomputed chunks keep 1/TP of their input): at (2,2,2) its
# recomputing run also reduces and gathers the DP buckets during the step (at DP 2 the same
# bits), where the replicated tensors' gradients are summed over TP as each layer's turn comes.
same_bits() {  # name run recomputed-run flags
    if cmp -s $B/$2.steps $B/$3.steps && [ "$(wc -l < $B/$2.steps)" -ge 20 ] &&
       cmp -s $B/$2.ckpt/iter_0000022/tensors.bin $B/$3.ckpt/iter_0000022/tensors.bin; then
        ok "$1 with $4: bit-identical losses, grad norms, weights and optimizer state"
    else bad "$1 with $4" "the recordings differ from the run without recomputation"; fi
}

full="--recompute-granularity full --recompute-method"
runs=("1 1 1|--checkpoint-activations"                    # one process: every layer alone
      "2 1 1|$full uniform --recompute-num-layers 3"      # 4 layers: chunks of 3 and 1
      "4 1 1|$full uniform --recompute-num-layers 4"      # one chunk
      "1 2 1|$full uniform --recompute-num-layers 2"      # 2 layers per stage: one chunk each
      "1 4 1|--checkpoint-activations"
      "1 1 2|$full block --recompute-num-layers 2"        # layers 0 and 1 recomputed, 2 and 3 kept
      "1 1 4|"                                            # (no recomputed run: uniform 2 is (1,2,1)'s and (2,2,2)'s)
      "2 2 1|$full block --recompute-num-layers 1"
      "2 1 2|"                                            # (uniform 3 is (2,1,1)'s)
      "1 2 2|--checkpoint-activations --recompute-num-layers 2"
      "2 2 2|$full uniform --recompute-num-layers 2"
      "4 1 1 sp|$full block --recompute-num-layers 2"
      "2 2 2 sp|--checkpoint-activations --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 600")
for run in "${runs[@]}"; do
    recompute=${run#*|}
    set -- ${run%%|*}
    name="tp$1-pp$2-dp$3${4:+-sp}" sp=${4:+--sequence-parallel}
    [ "$name" = tp1-pp1-dp1 ] && name=ref
    record $name $1 $2 $3 $sp
    [ $name = ref ] || $B/../test_parallel --compare $B/ref $B/$name "($1,$2,$3)${sp:+ $sp}" $flags | grep -E '^(PASS|FAIL)'
    [ -n "$recompute" ] || continue
    record $name-recompute $1 $2 $3 $sp $recompute
    same_bits "($1,$2,$3)${sp:+ $sp}" $name $name-recompute "$recompute"
done
# and selective recomputation with sequence parallelism (the probabilities again from the kept
# qkv of every row): the same bits
record tp2-pp2-dp2-sp-selective 2 2 2 --sequence-parallel --recompute-granularity selective
same_bits "(2,2,2) --sequence-parallel" tp2-pp2-dp2-sp tp2-pp2-dp2-sp-selective "--recompute-granularity selective"

# Uneven pipeline stages (4 layers): BigScience's split counting the embedding and the tied
# output layer as one layer each (over 3 stages: 1, 2, 1; over 4: 1, 2, 1, 0, the last stage
# holding only the head), DeepSpeed's type:transformer (over 3: 2, 1, 1) and Megatron-LM's
# first/last-stage counts
uneven() {  # tp pp dp label flags...
    local tp=$1 pp=$2 dp=$3 label=$4; shift 4
    record uneven-$label $tp $pp $dp "$@"
    $B/../test_parallel --compare $B/ref $B/uneven-$label "($tp,$pp,$dp) with $*" $flags | grep -E '^(PASS|FAIL)'
}
uneven 1 3 1 te3 --pp-partition-method 'type:transformer|embedding'
uneven 1 4 1 te4 --pp-partition-method 'type:transformer|embedding'
uneven 2 3 1 t3 --pp-partition-method type:transformer
uneven 2 2 2 first1 --decoder-first-pipeline-num-layers 1
uneven 1 3 2 last2 --decoder-last-pipeline-num-layers 2
# recomputation on uneven stages: block 2 over stages of 1, 2, 1 and 0 layers (a stage that holds
# fewer recomputes all of its own; the last holds only the head), uniform 2 over 1, 1 and 2
record uneven-te4-recompute 1 4 1 --pp-partition-method 'type:transformer|embedding' $full block --recompute-num-layers 2
same_bits "(1,4,1) type:transformer|embedding" uneven-te4 uneven-te4-recompute "$full block --recompute-num-layers 2"
record uneven-last2-recompute 1 3 2 --decoder-last-pipeline-num-layers 2 --checkpoint-activations --recompute-num-layers 2
same_bits "(1,3,2) --decoder-last-pipeline-num-layers 2" uneven-last2 uneven-last2-recompute \
    "--checkpoint-activations --recompute-num-layers 2"
layers_of() {  # "stage:layers " of each stage, from the start-up memory table
    grep -oE 'rank +[0-9]+ \(stage [0-9]+, (layers [0-9]+-[0-9]+|no layers)\)' $B/uneven-$1.log |
        sed -E 's/.*stage ([0-9]+), (.*)\)/\1:\2/' | sort -u | tr '\n' ' '
}
want_te4="0:layers 0-0 1:layers 1-2 2:layers 3-3 3:no layers "
if [ "$(layers_of te4)" = "$want_te4" ] && [ "$(layers_of t3)" = "0:layers 0-1 1:layers 2-2 2:layers 3-3 " ] &&
   [ "$(layers_of last2)" = "0:layers 0-0 1:layers 1-1 2:layers 2-3 " ]; then
    ok "the memory table shows each stage's layers: type:transformer|embedding over 4 stages gives 1, 2, 1, 0"
else bad "stage layers in the memory table" "te4: $(layers_of te4); t3: $(layers_of t3); last2: $(layers_of last2)"; fi

# The same for a BLOOM-style model: ALiBi instead of the position table (each tensor rank adds
# the slopes of its global heads; 12 heads is not a power of two, so BLOOM's extra slopes are
# used) and the embedding LayerNorm. What ALiBi adds depends on the heads a tensor rank holds:
# TP 2 and 4, and (2,2,2) with the pipeline's and the data ranks' split on top (PP and DP alone
# split no heads: the learned model's layouts above hold them)
# against_ref MODEL LABEL TP PP DP [FLAGS...]: MODEL-tpT-ppP-dpD[-sp] recorded and held to MODEL-ref's run
against_ref() {
    local model=$1 label=$2 tp=$3 pp=$4 dp=$5; shift 5
    local name=$model-tp$tp-pp$pp-dp$dp${1:+-sp}
    record $name $tp $pp $dp "$@"
    $B/../test_parallel --compare $B/$model-ref $B/$name "$label ($tp,$pp,$dp)${*:+ $*}" $flags | grep -E '^(PASS|FAIL)'
}
learned_flags=$flags
flags="${learned_flags/--hidden-size 32 --num-attention-heads 4/--hidden-size 48 --num-attention-heads 12} --position-embedding-type alibi --embed-layernorm"
record bloom-ref 1 1 1
for layout in "2 1 1" "4 1 1" "2 2 2"; do against_ref bloom ALiBi $layout; done
# and recomputed (the embedding LayerNorm is kept; each recomputed layer re-runs ALiBi's attention)
record bloom-tp2-pp2-dp2-recompute 2 2 2 --checkpoint-activations
same_bits "ALiBi (2,2,2)" bloom-tp2-pp2-dp2 bloom-tp2-pp2-dp2-recompute --checkpoint-activations
# selective recomputation (Megatron-LM's --recompute-granularity selective): every layer's
# attention probabilities again in its backward, ALiBi's slopes included; the same bits
record bloom-tp2-pp2-dp2-selective 2 2 2 --recompute-granularity selective
same_bits "ALiBi (2,2,2)" bloom-tp2-pp2-dp2 bloom-tp2-pp2-dp2-selective "--recompute-granularity selective"
# and with sequence parallelism: no position table, the embedding LayerNorm on each rank's rows
against_ref bloom ALiBi 2 1 1 --sequence-parallel
# The same for a Llama-shaped model (Megatron-LM's flags): rotary positions (half of each 4-dim
# head, applied after the QKV product on every rank's heads), RMSNorm, SwiGLU (fc1's [gate; up]
# halves each split over the tensor ranks), 8 query heads in 4 groups (the groups split over the
# tensor ranks: TP 4 holds one group each), an output layer of its own (no embedding-group
# all-reduce) and no linear biases. TP 4, PP 4 (the last stage holding a layer and the output
# layer), (2,2,2), sequence parallelism, the interleaved schedule, recomputation (the same bits)
# and the DP overlaps.
flags="${learned_flags/--hidden-size 32 --num-attention-heads 4/--hidden-size 32 --num-attention-heads 8} --group-query-attention
       --num-query-groups 4 --position-embedding-type rope --rotary-percent 0.5 --normalization RMSNorm --norm-epsilon 1e-6
       --swiglu --ffn-hidden-size 48 --untie-embeddings-and-output-weights --disable-bias-linear"
record llama-ref 1 1 1
for layout in "4 1 1" "1 4 1" "2 2 2"; do against_ref llama Llama $layout; done
record llama-tp2-pp2-dp2-recompute 2 2 2 --checkpoint-activations
same_bits "Llama (2,2,2)" llama-tp2-pp2-dp2 llama-tp2-pp2-dp2-recompute --checkpoint-activations
against_ref llama Llama 4 1 1 --sequence-parallel
against_ref llama Llama 2 2 2 --sequence-parallel --num-layers-per-virtual-pipeline-stage 1 --recompute-activations \
    --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 600
flags=$learned_flags
# and on the learned-position model, over uneven stages (the last holding only the head)
record uneven-te4-selective 1 4 1 --pp-partition-method 'type:transformer|embedding' --recompute-activations
same_bits "(1,4,1) type:transformer|embedding" uneven-te4 uneven-te4-selective --recompute-activations

# dropout is on in every run above, and changes the training: one process without it trains
# another model from the first step (the first loss differs), and is held to its (2,2,2) run
record nodrop-ref 1 1 1 --hidden-dropout 0 --attention-dropout 0
record nodrop-tp2-pp2-dp2 2 2 2 --hidden-dropout 0 --attention-dropout 0 --sequence-parallel
$B/../test_parallel --compare $B/nodrop-ref $B/nodrop-tp2-pp2-dp2 "without dropout (2,2,2) --sequence-parallel" $flags |
    grep -E '^(PASS|FAIL)'
if [ -s $B/ref.steps ] && [ -s $B/nodrop-ref.steps ] && [ "$(head -1 $B/ref.steps | cut -d' ' -f2)" != "$(head -1 $B/nodrop-ref.steps | cut -d' ' -f2)" ] &&
   ! cmp -s $B/ref.ckpt/iter_0000022/tensors.bin $B/nodrop-ref.ckpt/iter_0000022/tensors.bin; then
    ok "dropout 0.1 trains another model than dropout 0: the first step's loss and the final weights differ"
else bad "dropout 0.1 against dropout 0" "the same first loss or weights: $(head -1 $B/ref.steps) vs $(head -1 $B/nodrop-ref.steps)"; fi

# the same layout twice: the same bits
record again 2 2 2
if cmp -s $B/tp2-pp2-dp2.steps $B/again.steps && cmp -s $B/tp2-pp2-dp2.ckpt/iter_0000022/tensors.bin $B/again.ckpt/iter_0000022/tensors.bin; then
    ok "(2,2,2) twice with the same seed: bit-identical losses, norms, weights and optimizer state"
else bad "(2,2,2) twice with the same seed" "the recordings differ"; fi

# --overlap-grad-reduce: the DP gradients reduced in buckets (here of 600 elements: many, some
# across the ZeRO shards' boundaries, the padded tail in the top one) during the last backward,
# each part onto its shard's owner. The CPU build runs the same reduces where the GPU build
# queues them on its communication stream. At DP 2 every sum is a + b, whichever algorithm adds:
# the same bits as the reduce-scatter; at DP 4 MPI may add in another order: one process's
# tolerance. With them --overlap-param-gather: the updated parameters broadcast bucket by
# bucket from each part's owner (a copy: the all-gather's bits at any DP). The bytes each rank
# sends are the reduce-scatter's and the all-gather's.
both="--overlap-grad-reduce --overlap-param-gather"
record tp2-pp2-dp2-overlap 2 2 2 $both --ddp-bucket-size 600
same_bits "(2,2,2)" tp2-pp2-dp2 tp2-pp2-dp2-overlap "$both --ddp-bucket-size 600"
record tp1-pp1-dp4-overlap 1 1 4 $both --ddp-bucket-size 600
$B/../test_parallel --compare $B/ref $B/tp1-pp1-dp4-overlap "(1,1,4) $both" $flags | grep -E '^(PASS|FAIL)'
record tp1-pp2-dp2-overlap 1 2 2 $both   # the default bucket: one per stage
same_bits "(1,2,2)" tp1-pp2-dp2 tp1-pp2-dp2-overlap "$both (the default bucket size)"

# GPipe and ZB-H1 (--pipeline-schedule, pipeline.h): the same kernels on the same inputs, every
# gradient added in micro-batch order (ZB-H1's W passes run in order, the last one arming the
# overlapped reduction): the bits of 1F1B's run of the same layout, recorded above (and each
# run's slots and peak in flight held by tests/test_parallel.c to what its walk counts: GPipe all
# M on every stage; ZB-H1 min(PP, M), 1F1B's first stage's, on every stage)
schedule_run() {  # name tp pp dp the-1F1B-run flags...
    local name=$1 tp=$2 pp=$3 dp=$4 same=$5; shift 5
    record $name $tp $pp $dp "$@"
    same_bits "($tp,$pp,$dp), against 1F1B's run," $same $name "$*"
}
schedule_run zb-tp1-pp2-dp1 1 2 1 tp1-pp2-dp1 --pipeline-schedule zb-h1
schedule_run zb-tp2-pp2-dp2 2 2 2 tp2-pp2-dp2 --pipeline-schedule zb-h1
schedule_run zb-tp2-pp2-dp2-overlap 2 2 2 tp2-pp2-dp2-overlap --pipeline-schedule zb-h1 $both --ddp-bucket-size 600
schedule_run gpipe-tp1-pp4-dp1 1 4 1 tp1-pp4-dp1 --pipeline-schedule gpipe
schedule_run zb-tp1-pp4-dp1 1 4 1 tp1-pp4-dp1 --pipeline-schedule zb-h1

# Interleaved 1F1B (Megatron-LM's virtual pipeline stages): each stage holds v model chunks,
# virtual stage c x PP + p holding the c-th round of the layers. The same kernels on the same
# inputs, each chunk's micro-batches backward in order 0..M-1 (so every gradient adds its terms in
# the plain schedule's order), and the head's losses summed in that order too: the very bits of
# plain 1F1B on the same (TP, PP, DP), and so one process's within the tolerance. v = 2 over 4
# layers at (1,2,1) with recomputation (the bits of plain 1F1B without it), at (2,2,2) with
# sequence parallelism and selective recomputation (a chunk's early gradient is the rank's rows;
# the bits of plain 1F1B with neither recomputation) and with the DP overlaps (the ramp's 4 micro-batches at DP 2 are 2 = PP: every stage but the last warms
# up with all its forwards); over 6 layers against a 6-layer one process, v = 3, and an uneven
# split (2 + 4 layers, 2 chunks each) with recomputation, the same bits as v = 3 (at TP 1 and
# DP 1 every PP 2 split and schedule computes the same sums in the same order).
N="--num-layers-per-virtual-pipeline-stage"
interleaved() {  # name tp pp dp same-bits-run flags...: one process's tolerance, another run's bits
    local name=$1 tp=$2 pp=$3 dp=$4 same=$5; shift 5
    record $name $tp $pp $dp "$@"
    $B/../test_parallel --compare $B/$ref $B/$name "$layers layers ($tp,$pp,$dp) $*" $flags | grep -E '^(PASS|FAIL)'
    [ -z "$same" ] || same_bits "$layers layers ($tp,$pp,$dp), against the run $same," $same $name "$*"
}
ref=ref layers=4
interleaved vpp2-tp1-pp2-dp1-recompute 1 2 1 tp1-pp2-dp1 $N 1 $full uniform --recompute-num-layers 1
interleaved vpp2-tp2-pp2-dp2-overlap 2 2 2 tp2-pp2-dp2-overlap $N 1 $both --ddp-bucket-size 600
interleaved vpp2-tp2-pp2-dp2-sp-selective 2 2 2 tp2-pp2-dp2-sp $N 1 --sequence-parallel --recompute-activations
four_layers=$flags
flags=${flags/--num-layers 4/--num-layers 6}
ref=ref6 layers=6
record ref6 1 1 1
interleaved vpp3-tp1-pp2-dp1 1 2 1 "" $N 1
interleaved vpp2-uneven-recompute 1 2 1 vpp3-tp1-pp2-dp1 --decoder-first-pipeline-num-layers 2 \
    --num-virtual-stages-per-pipeline-rank 2 $full block --recompute-num-layers 1
flags=$four_layers
chunk_layers() { grep -oE 'rank +[0-9]+ \(stage [0-9]+, layers [0-9, -]+\)' $B/$1.log | sed -E 's/.*stage ([0-9]+), (.*)\)/\1:\2/' |
    sort -u | tr '\n' ' '; }
if [ "$(chunk_layers vpp2-uneven-recompute)" = "0:layers 0-0, 3-3 1:layers 1-2, 4-5 " ] &&
   [ "$(chunk_layers vpp3-tp1-pp2-dp1)" = "0:layers 0-0, 2-2, 4-4 1:layers 1-1, 3-3, 5-5 " ]; then
    ok "the memory table shows each stage's model chunks: 2 + 4 layers in 2 chunks: 0, 3 | 1-2, 4-5; v = 3 over 6: 0, 2, 4 | 1, 3, 5"
else bad "model chunks in the memory table" "uneven: $(chunk_layers vpp2-uneven-recompute); v = 3: $(chunk_layers vpp3-tp1-pp2-dp1)"; fi

# The order each stage runs its forwards and backwards in: Narayanan et al. 2021's Fig. 4
# (bottom), PP 4, v = 2, 8 micro-batches (8 layers; micro-batches numbered from 0, a and b the
# two model chunks), as docs/parallelism.md draws it: the last step's, as the trainer ran it
order_flags="--data-path $data --vocab-size 257 --num-layers 8 --hidden-size 32 --num-attention-heads 4 --seq-length 16
             --micro-batch-size 2 --global-batch-size 16 --train-iters 2 --eval-iters 0 --split 90,10,0 $N 1"
rm -rf $B/order.ckpt
$MPIRUN -np 4 $B/../test_parallel $B/order $order_flags --pipeline-model-parallel-size 4 > $B/order.log 2>&1
cat > $B/order.want <<'ORDER'
stage 0: F0a F1a F2a F3a F0b F1b F2b F3b F4a F5a F6a B0b F7a B1b F4b B2b F5b B3b F6b B0a F7b B1a B2a B3a B4b B5b B6b B7b B4a B5a B6a B7a
stage 1: F0a F1a F2a F3a F0b F1b F2b F3b F4a B0b F5a B1b F6a B2b F7a B3b F4b B0a F5b B1a F6b B2a F7b B3a B4b B5b B6b B7b B4a B5a B6a B7a
stage 2: F0a F1a F2a F3a F0b F1b F2b B0b F3b B1b F4a B2b F5a B3b F6a B0a F7a B1a F4b B2a F5b B3a F6b B4b F7b B5b B6b B7b B4a B5a B6a B7a
stage 3: F0a F1a F2a F3a F0b B0b F1b B1b F2b B2b F3b B3b F4a B0a F5a B1a F6a B2a F7a B3a F4b B4b F5b B5b F6b B6b F7b B7b B4a B5a B6a B7a
ORDER
if cmp -s $B/order.want $B/order.order; then
    ok "(1,4,1), v = 2, 8 micro-batches: every stage runs the interleaved schedule's order (Narayanan et al.'s Fig. 4)"
else bad "the interleaved order" "$(diff $B/order.want $B/order.order | head -4)"; fi

# Megatron-LM's --microbatch-group-size-per-virtual-pipeline-stage G: micro-batches in groups of G
# per chunk, so M need not be a multiple of PP. At (1,2,1), v = 2, G = 3 over a ramp of 3 then 6
# micro-batches (3 is no multiple of PP 2): one process's losses, norms and weights within 1e-5,
# plain 1F1B's bits on the same layout (each chunk's backwards still run 0..M-1), and the last
# step's order on every stage as tests/interleaved_order.py states Megatron-LM's schedule table
# (the same script gives the Fig. 4 order above: its P 4, v 2, M 8).
group_flags="${flags/--global-batch-size 16 --rampup-batch-size 8 8 64 --train-samples 288/--global-batch-size 12 --rampup-batch-size 6 6 36 --train-samples 228}"
G="--microbatch-group-size-per-virtual-pipeline-stage"
saved_flags=$flags
flags=$group_flags
record ref-groups 1 1 1
record plain-groups 1 2 1
record vpp2-g3-tp1-pp2-dp1 1 2 1 $N 1 $G 3
$B/../test_parallel --compare $B/ref-groups $B/vpp2-g3-tp1-pp2-dp1 "(1,2,1) v = 2, $G 3, 3 then 6 micro-batches" $flags |
    grep -E '^(PASS|FAIL)'
same_bits "(1,2,1), v = 2, against plain 1F1B," plain-groups vpp2-g3-tp1-pp2-dp1 "$N 1 $G 3"
flags=$saved_flags
python3 tests/interleaved_order.py 2 2 6 3 > $B/groups.want
python3 tests/interleaved_order.py 4 2 8 > $B/fig4.stated
if cmp -s $B/groups.want $B/vpp2-g3-tp1-pp2-dp1.order && cmp -s $B/fig4.stated $B/order.want; then
    ok "(1,2,1), v = 2, G = 3, 6 micro-batches: each stage runs Megatron-LM's order as tests/interleaved_order.py states it (which gives Fig. 4's too)"
else bad "the order in groups of 3" "$(diff $B/groups.want $B/vpp2-g3-tp1-pp2-dp1.order | head -4) $(diff $B/fig4.stated $B/order.want | head -2)"; fi
if grep -q "pipeline schedule: interleaved 1F1B, 2 virtual stages per pipeline stage (model chunks), the micro-batches taken 3 at a time per chunk" $B/vpp2-g3-tp1-pp2-dp1.log &&
   grep -q "pipeline schedule: 1F1B, 1 virtual stage per pipeline stage" $B/plain-groups.log; then
    ok "rank 0 names the virtual stages per pipeline stage and the group size at start (Megatron-LM prints the first)"
else bad "the virtual stages at start" "$(grep -h 'pipeline schedule' $B/vpp2-g3-tp1-pp2-dp1.log $B/plain-groups.log)"; fi

# A last group of PP or more but fewer than G, which Megatron-LM runs (its docstring's example: PP 2,
# v = 2, 5 micro-batches in groups of 3, the last of 2): the last stage runs head forwards ahead of
# their backwards (F3b B2a F4b B3b), each micro-batch's logits kept until its backward (two planned).
# Over a ramp of 3 then 5 micro-batches: at (1,2,1) one process's within 1e-5, plain 1F1B's bits and
# Megatron-LM's order on every stage (tests/interleaved_order.py 2 2 5 3); at (2,2,2) with sequence
# parallelism (a micro-batch of 1 at DP 2: the same 3 then 5 micro-batches a pipeline) one process's.
short_flags="${flags/--global-batch-size 16 --rampup-batch-size 8 8 64 --train-samples 288/--global-batch-size 10 --rampup-batch-size 6 4 24 --train-samples 204}"
saved_flags=$flags
flags=$short_flags
record ref-short 1 1 1
record plain-short 1 2 1
record vpp2-g3-short-tp1-pp2-dp1 1 2 1 $N 1 $G 3
$B/../test_parallel --compare $B/ref-short $B/vpp2-g3-short-tp1-pp2-dp1 "(1,2,1) v = 2, $G 3, 3 then 5 micro-batches" $flags |
    grep -E '^(PASS|FAIL)'
same_bits "(1,2,1), v = 2, a last group of 2 of 3, against plain 1F1B," plain-short vpp2-g3-short-tp1-pp2-dp1 "$N 1 $G 3"
record vpp2-g3-short-tp2-pp2-dp2-sp 2 2 2 --micro-batch-size 1 --sequence-parallel $N 1 $G 3
$B/../test_parallel --compare $B/ref-short $B/vpp2-g3-short-tp2-pp2-dp2-sp "(2,2,2) --sequence-parallel v = 2, $G 3, micro-batch 1: 3 then 5 micro-batches" \
    $flags | grep -E '^(PASS|FAIL)'
flags=$saved_flags
python3 tests/interleaved_order.py 2 2 5 3 > $B/short.want
if cmp -s $B/short.want $B/vpp2-g3-short-tp1-pp2-dp1.order && grep -q 'F3b B2a F4b B3b' $B/short.want; then
    ok "(1,2,1), v = 2, G = 3, 5 micro-batches (a last group of 2): each stage runs Megatron-LM's order, head forwards ahead of their backwards"
else bad "the order with a short last group" "$(diff $B/short.want $B/vpp2-g3-short-tp1-pp2-dp1.order | head -4)"; fi

info() { awk -v k="$2" '$1 == k { print $2 }' $B/$1.info; }
# ZeRO-1: the optimizer state of a rank is 1/DP of the (padded) whole
o1=$(info ref optimizer_bytes); o2=$(info tp1-pp1-dp2 optimizer_bytes); o4=$(info tp1-pp1-dp4 optimizer_bytes)
p2=$(info tp1-pp1-dp2 params_padded); p4=$(info tp1-pp1-dp4 params_padded)
if [ "$o2" -eq $((p2 / 2 * 8)) ] && [ "$o4" -eq $((p4 / 4 * 8)) ] && [ "$o2" -lt "$o1" ] && [ "$o4" -lt "$o2" ]; then
    ok "optimizer state per rank shrinks as 1/DP ($o1, $o2, $o4 bytes for DP 1, 2, 4)"
else bad "optimizer state per rank shrinks as 1/DP" "$o1, $o2, $o4 bytes; padded params $p2, $p4"; fi

# 8-bit Adam (--use-bnb-optimizer): the moments quantized in blocks of 2,048, each ZeRO shard a
# whole number of blocks on its region's grid (data_parallel.h zero_shard_multiple), so every DP
# quantizes the same values under the same scales; what is left is fp32 sums in another order,
# which 8-bit Adam amplifies (a moment near a midpoint of the map rounds the other way; the Q and
# K rows' v, rounded to 0 under its block's scale, restart from (1 - b2) g^2). Measured against
# one process: loss 2.4e-5 and 9.4e-6, norm 5.4e-5 and 3.6e-5 relative at the worst step for DP 2
# and 4; with blocks counted from each shard's own start (before), 2e-4 and 3.6e-4 for both (one
# process against 32-bit Adam: 2e-4 and 2e-3). So: DP 2 and 4 within 1e-4 (loss) and 2e-4 (norm)
# of one process at every step, the final loss within 1% of 32-bit Adam's, the same layout twice
# bit-identical, and the optimizer state of the memory table (in bytes) 2 a parameter of the
# shard and 8 a block, what dev_malloc handed out the table's total.
record q8-ref 1 1 1 --use-bnb-optimizer --log-memory-bytes
record q8-again 1 1 1 --use-bnb-optimizer
record q8-tp1-pp1-dp2 1 1 2 --use-bnb-optimizer --log-memory-bytes
record q8-tp1-pp1-dp4 1 1 4 --use-bnb-optimizer
within() {  # REF RUN LOSS_TOL NORM_TOL: steps, worst loss and norm differences; status 0 if within
    awk -v tl="$3" -v tn="$4" 'NR == FNR { l[$1] = $2; g[$1] = $3; next } ($1 in l) { n++
        d = ($2 - l[$1]) / l[$1]; if (d < 0) d = -d; if (d > wl) wl = d
        d = ($3 - g[$1]) / g[$1]; if (d < 0) d = -d; if (d > wn) wn = d }
        END { printf "%d steps, loss %.2g, norm %.2g", n, wl, wn; exit !(n >= 20 && wl <= tl && wn <= tn) }' "$1" "$2"
}
for dp in 2 4; do
    if got=$(within $B/q8-ref.steps $B/q8-tp1-pp1-dp$dp.steps 1e-4 2e-4); then
        ok "--use-bnb-optimizer at (1,1,$dp): loss within 1e-4 and grad norm within 2e-4 of one process's 8-bit run ($got)"
    else bad "--use-bnb-optimizer at (1,1,$dp) against one process" "$got"; fi
done
final=$(awk 'NR == FNR { last = $2; next } { q = $2 } END { d = (q - last) / last; printf "%.4f vs %.4f (%.2g)", q, last, d
             exit !(d < 0.01 && d > -0.01) }' $B/ref.steps $B/q8-ref.steps) &&
    cmp -s $B/q8-ref.steps $B/q8-again.steps && cmp -s $B/q8-ref.ckpt/iter_0000022/tensors.bin $B/q8-again.ckpt/iter_0000022/tensors.bin
if [ $? -eq 0 ]; then ok "--use-bnb-optimizer: the final loss within 1% of 32-bit Adam's ($final); the same run twice bit-identical"
else bad "--use-bnb-optimizer against 32-bit Adam" "$final, or the run twice differs"; fi
q8_bytes() {  # RUN DP: the memory table's optimizer bytes, what they should be, the total, what dev_malloc handed out
    local shard=$(( $(info q8-ref params_padded) / $2 ))
    awk -v want=$(( 2 * shard + 8 * ((shard + 2047) / 2048) )) '/rank +0 \(stage 0\) in bytes:/ { got = $(NF - 6); total = $NF }
        /rank +0: dev_malloc handed out/ { malloc = $(NF - 3) }
        END { printf "%s %s %s %s", got, want, total, malloc }' $B/$1.log
}
read g1 w1 t1 m1 <<< "$(q8_bytes q8-ref 1)"
read g2 w2 t2 m2 <<< "$(q8_bytes q8-tp1-pp1-dp2 2)"
if [ -n "$g1" ] && [ "$g1" = "$w1" ] && [ "$g2" = "$w2" ] && [ "$t1" = "$m1" ] && [ "$t2" = "$m2" ]; then
    ok "--use-bnb-optimizer: the memory table's optimizer state is 2 bytes a parameter of the shard + 8 a 2,048-block ($g1 bytes at DP 1, $g2 at DP 2, of $(info q8-ref params_padded) parameters; fp32's: $(info ref optimizer_bytes)), and dev_malloc handed out the table's total"
else bad "--use-bnb-optimizer's optimizer bytes" "DP 1: $g1 (want $w1), total $t1, allocated $m1; DP 2: $g2 (want $w2), total $t2, allocated $m2"; fi

# data-parallel bytes per step: reduce-scatter of fp32 gradients + all-gather of parameters,
# (DP - 1) / DP of the buffer each on a ring
for dp in 2 4; do
    got=$(info tp1-pp1-dp$dp comm_dp); p=$(info tp1-pp1-dp$dp params_padded)
    want=$(( 2 * (dp - 1) * (p / dp) * 4 ))
    if [ "$got" = "$want" ]; then ok "DP $dp: bytes sent per step = ring reduce-scatter + all-gather ($want)"
    else bad "DP $dp: bytes sent per step" "counted $got, ring formula $want"; fi
done
for run in tp1-pp1-dp4 tp2-pp2-dp2; do
    if [ "$(info $run-overlap comm_dp)" = "$(info $run comm_dp)" ]; then
        ok "$both: ${run}'s ranks send the bytes of the reduce-scatter and all-gather ($(info $run comm_dp))"
    else bad "$both's bytes at $run" "$(info $run-overlap comm_dp), without $(info $run comm_dp)"; fi
done
# pipeline bytes per step on stage 0: one activation per micro-batch (8 in a full step at DP 1)
got=$(info tp1-pp2-dp1 comm_pp); h=$(info tp1-pp2-dp1 hidden_bytes)
if [ "$got" = "$((8 * h))" ]; then ok "PP 2: stage 0 sends micro-batches x activation size per step ($got)"
else bad "PP 2: stage 0 bytes per step" "counted $got, want 8 x $h"; fi
# interleaved, v = 2: stage 0 sends each micro-batch's output of both chunks and chunk b's input
# gradient (chunk a's is the first virtual stage's): 3 where plain 1F1B sends 1
got=$(info vpp2-tp1-pp2-dp1-recompute comm_pp)
if [ "$got" = "$((3 * 8 * h))" ]; then ok "PP 2, v = 2: stage 0 sends 3 activations per micro-batch per step ($got)"
else bad "PP 2, v = 2: stage 0 bytes per step" "counted $got, want 3 x 8 x $h"; fi

# sequence parallelism: what goes between stages is a rank's 1/TP of the rows
sp_pp=$(info tp2-pp2-dp2-sp comm_pp) pp=$(info tp2-pp2-dp2 comm_pp)
if [ -n "$sp_pp" ] && [ -n "$pp" ] && [ $((2 * sp_pp)) -eq "$pp" ]; then
    ok "(2,2,2) --sequence-parallel: the pipeline sends half the bytes, the rank's rows ($sp_pp against $pp)"
else bad "(2,2,2) --sequence-parallel's pipeline bytes" "$sp_pp, without it $pp"; fi

# recomputation runs a layer's forward again, its two tensor-parallel all-reduces too (as
# Megatron does), and --log-comm counts them: at TP 2 each recomputed layer of each micro-batch
# sends 2 x 2 (2 - 1) / 2 activations more (8 micro-batches, 4 layers); the pipeline sends the same
got=$(( $(info tp2-pp1-dp1-recompute comm_tp) - $(info tp2-pp1-dp1 comm_tp) )); h=$(info tp2-pp1-dp1 hidden_bytes)
if [ "$got" = "$((8 * 4 * 2 * h))" ] && [ "$(info tp1-pp2-dp1-recompute comm_pp)" = "$(info tp1-pp2-dp1 comm_pp)" ]; then
    ok "recomputation: TP 2 sends the recomputed layers' all-reduces again ($got bytes more), the pipeline no more"
else bad "recomputation's communication" "TP bytes $got more (want $((8 * 4 * 2 * h))); PP $(info tp1-pp2-dp1-recompute comm_pp) vs $(info tp1-pp2-dp1 comm_pp)"; fi

# a rank that fails ends the whole job, saying where, and nobody hangs
host=$(hostname)
timeout 120 $MPIRUN -np 8 $B/../test_parallel --fail-rank 5 $B/failing $flags \
    --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 > $B/failing.log 2>&1
status=$?
if [ $status -ne 0 ] && [ $status -ne 124 ] && grep -qF "rank 5 on $host TP(1)-PP(1)-DP(0)-Rank(5)" $B/failing.log; then
    ok "a failing rank ends the whole job with its rank, host and coordinates (status $status)"
else bad "a failing rank ends the whole job" "status $status (124 = hung): $(grep -m1 error $B/failing.log)"; fi

# a grid that does not fit is refused before anything is allocated, exit status 2
expect_refusal() {  # name needle np flags...
    local name=$1 needle=$2 np=$3; shift 3
    $MPIRUN -np $np ./train_cpu --data-path $data --train-iters 2 "$@" > $B/refusal.out 2> $B/refusal.err
    local status=$?
    if [ $status -eq 2 ] && grep -qF -- "$needle" $B/refusal.err; then ok "$name"
    else bad "$name" "status $status: $(head -c 300 $B/refusal.err)"; fi
}
expect_refusal "world size not a multiple of TP x PP" "world size 3" 3 --tensor-model-parallel-size 2
expect_refusal "heads not divisible by TP" "--num-attention-heads" 3 --num-attention-heads 4 --tensor-model-parallel-size 3
expect_refusal "layers not divisible by PP" "--num-layers" 3 --num-layers 4 --pipeline-model-parallel-size 3
expect_refusal "global batch not divisible by micro-batch x DP" "--global-batch-size" 4 --micro-batch-size 2 --global-batch-size 12
expect_refusal "uneven layers name the options for uneven stages" "(uneven stages: --pp-partition-method, or --decoder-first/last-pipeline-num-layers)" \
    3 --num-layers 4 --pipeline-model-parallel-size 3
expect_refusal "first/last-stage layers that leave an uneven rest" "leaves 3 layers, which 2 other stage(s) cannot share evenly" \
    3 --num-layers 4 --pipeline-model-parallel-size 3 --decoder-first-pipeline-num-layers 1
expect_refusal "first/last-stage layers with a partition method" "give --pp-partition-method or --decoder-first/last-pipeline-num-layers, not both" \
    2 --num-layers 4 --pipeline-model-parallel-size 2 --decoder-last-pipeline-num-layers 1 --pp-partition-method type:transformer
expect_refusal "first/last-stage layers without a pipeline" "need --pipeline-model-parallel-size > 1" 1 --decoder-first-pipeline-num-layers 2
expect_refusal "more stages than layer slots" "--pp-partition-method type:transformer|embedding: 4 layer slot(s) for 5 pipeline stages" \
    5 --num-layers 2 --pipeline-model-parallel-size 5 --pp-partition-method 'type:transformer|embedding'
expect_refusal "--pipeline-schedule zb-h1 with virtual stages" "--pipeline-schedule zb-h1 with virtual stages (interleaving): not built" \
    2 --num-layers 4 --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 --micro-batch-size 2 --global-batch-size 8 --pipeline-schedule zb-h1
expect_refusal "--pipeline-schedule gpipe with virtual stages" "--pipeline-schedule gpipe with virtual stages (interleaving): not built" \
    2 --num-layers 4 --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 --micro-batch-size 2 --global-batch-size 8 --pipeline-schedule gpipe
expect_refusal "--pipeline-schedule zb-h1 with full recomputation" "--pipeline-schedule zb-h1 with full recomputation: its W pass reads" \
    2 --num-layers 4 --pipeline-model-parallel-size 2 --pipeline-schedule zb-h1 --checkpoint-activations
expect_refusal "--pipeline-schedule zb-h1 with sequence parallelism" "--pipeline-schedule zb-h1 with --sequence-parallel: not built" \
    2 --num-layers 4 --num-attention-heads 4 --tensor-model-parallel-size 2 --sequence-parallel --pipeline-schedule zb-h1
expect_refusal "--recompute-num-layers beyond the stages' layers" "--recompute-num-layers 3 is more layers than any pipeline stage holds (the largest: 2 of" 2 \
    --num-layers 4 --pipeline-model-parallel-size 2 --checkpoint-activations --recompute-num-layers 3

# ranks started with different flags: one line naming the flag and two ranks, exit 2 (it used
# to corrupt the heap and abort with a backtrace)
$MPIRUN -np 3 ./train_cpu --data-path $data --train-iters 2 : -np 1 ./train_cpu --data-path $data --train-iters 2 \
    --hidden-size 64 > $B/mixed.out 2> $B/mixed.err
status=$?
if [ $status -eq 2 ] && [ "$(grep -c '^error:' $B/mixed.err)" -eq 1 ] &&
   grep -qF "ranks were started with different flags: --hidden-size differs between rank 0 and rank 3" $B/mixed.err; then
    ok "ranks started with different flags are refused in one line naming the flag and the ranks (exit 2)"
else bad "ranks started with different flags" "status $status: $(head -c 300 $B/mixed.err)"; fi

# A verdict only some ranks reach ends the job with exit 2, one line from the first of them
# with its host and grid coordinates, and no hang (each used to hang, or abort with exit 1 and
# empty coordinates). tests/fault_write.c's FAULT_HIDE makes one rank's host unable to see a file.
gcc -shared -fPIC -O1 tests/fault_write.c -o $B/fault_write.so -ldl
small="--data-path $data --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --train-iters 2 --eval-iters 1 --split 90,10,0"
hide_on_rank2() { echo env LD_PRELOAD=$PWD/$B/fault_write.so FAULT_HIDE=$1; }
expect_one_rank_error() {  # name needle mpirun-arguments...
    local name=$1 needle=$2; shift 2
    timeout 120 $MPIRUN "$@" > $B/local.out 2> $B/local.err
    local status=$?
    if [ $status -eq 2 ] && [ "$(grep -c '^error:' $B/local.err)" -eq 1 ] && grep -qF -- "$needle" $B/local.err; then ok "$name"
    else bad "$name" "status $status: $(grep -m2 . $B/local.err | head -c 300)"; fi
}
expect_one_rank_error "a bad flag on one rank only: exit 2, that rank and host named" \
    "error: [rank 2 on $(hostname)] --hidden-size expects an integer" -np 2 ./train_cpu $small : -np 1 ./train_cpu $small --hidden-size abc
expect_one_rank_error "--help on one rank only is a flag difference, not a hang" "--help differs between rank 0 and rank 2" \
    -np 2 ./train_cpu $small : -np 1 ./train_cpu $small --help
expect_one_rank_error "a dataset one host cannot see: exit 2, rank and coordinates named" \
    "error: [rank 2 on $(hostname) TP(0)-PP(0)-DP(2)-Rank(2)] $data.idx: No such file" \
    -np 2 ./train_cpu $small : -np 1 $(hide_on_rank2 "$(basename $data).idx") ./train_cpu $small
rm -rf $B/seen.ckpt
./train_cpu $small --save $B/seen.ckpt > /dev/null 2>&1
expect_one_rank_error "a checkpoint one host cannot see: exit 2, rank and coordinates named" \
    "TP(0)-PP(0)-DP(2)-Rank(2)] checkpoint $B/seen.ckpt/iter_0000002/metadata.txt: No such file" \
    -np 2 ./train_cpu $small --load $B/seen.ckpt : -np 1 $(hide_on_rank2 metadata.txt) ./train_cpu $small --load $B/seen.ckpt
# node-local copies of the data: each rank reads a relative --data-path from its own working
# directory (mpirun -wdir), as ranks on different nodes read their own disks; rank 2's copy is
# stale (an older corpus: fewer documents) or has one flipped byte, in a block the check samples
rm -rf $B/node_a $B/node_b $B/node_c && mkdir -p $B/node_a $B/node_b $B/node_c
cp $data.bin $data.idx $B/node_a/ && cp $data.bin $data.idx $B/node_c/
head -n 40 $(dirname $data)/corpus.jsonl > $B/node_b/older.jsonl
./preprocess --input $B/node_b/older.jsonl --json-keys text --append-eod --output-prefix $B/node_b/corpus > /dev/null
printf '\xff' | dd of=$B/node_c/$(basename $data).bin bs=1 seek=100 conv=notrunc status=none
local_data="${small/--data-path $data/--data-path $(basename $data)} --data-cache-path $PWD/$B/node_cache"
expect_one_rank_error "a stale copy of the data on one node: exit 2, the rank, its host and the file named" \
    "error: [rank 2 on $(hostname) TP(0)-PP(0)-DP(2)-Rank(2)] --data-path: this rank's copy differs from rank 0's (on $(hostname)): $(basename $data).bin is" \
    -np 2 -wdir $B/node_a $PWD/train_cpu $local_data : -np 1 -wdir $B/node_b $PWD/train_cpu $local_data
expect_one_rank_error "one flipped byte in a sampled block of one node's copy: exit 2, named" \
    "$(basename $data).bin differs in the blocks sampled" \
    -np 2 -wdir $B/node_a $PWD/train_cpu $local_data : -np 1 -wdir $B/node_c $PWD/train_cpu $local_data
if timeout 120 $MPIRUN -np 2 -wdir $B/node_a $PWD/train_cpu $local_data : -np 1 -wdir $B/node_a $PWD/train_cpu $local_data \
       > $B/local.out 2>&1; then ok "identical node-local copies of the data train"
else bad "identical node-local copies of the data train" "$(grep -m1 error $B/local.out)"; fi
expect_one_rank_error "an index cache one host cannot see: exit 2, naming --data-cache-path" \
    "the index cache must be visible to every rank (see --data-cache-path)" \
    -np 2 ./train_cpu $small : -np 1 $(hide_on_rank2 _doc_idx.npy) ./train_cpu $small

# A --save path of over 300 characters (issue 34): Open MPI 4.1's sharedfp/lockedfile component
# built a name from the checkpoint file's path in 256 bytes and aborted the first save, and any
# --load, with exit 134 (parallel.h now leaves it out). Saved and resumed from, alone (no
# mpirun: MPI started by the trainer itself) and at 2 ranks, with the user's MPI environment
# set aside (OMPI_MCA_sharedfp, which parallel.h honours).
long=$PWD/$B/long
while [ ${#long} -le 300 ]; do long=$long/a_rather_long_directory_name; done
for launch in "" "$MPIRUN -np 2"; do
    rm -rf $B/long
    env -u OMPI_MCA_sharedfp $launch ./train_cpu $small --save $long > $B/long.out 2>&1
    saved=$?
    env -u OMPI_MCA_sharedfp $launch ./train_cpu $small --train-iters 4 --override-opt-param-scheduler --load $long --save $long >> $B/long.out 2>&1
    resumed=$?
    ranks=${launch:+2 ranks}
    if [ $saved -eq 0 ] && [ $resumed -eq 0 ] && [ -f $long/iter_0000002/tensors.bin ] && [ -f $long/iter_0000004/tensors.bin ] &&
       [ "$(cat $long/latest_checkpointed_iteration.txt 2>/dev/null)" = 4 ] && grep -qF "loaded checkpoint $long/iter_0000002 " $B/long.out; then
        ok "a --save path of ${#long} characters saves and resumes (${ranks:-1 rank, no mpirun})"
    else bad "a --save path of ${#long} characters (${ranks:-1 rank, no mpirun})" "exit $saved, then $resumed: $(grep -m1 -E 'error|overflow' $B/long.out | head -c 200)"; fi
done
# The user's own OMPI_MCA_sharedfp is kept: one that lets lockedfile run gets the long path refused
# at start-up, in one line naming the limit (exit 2, nothing made); one that leaves it out trains
rm -rf $B/long
OMPI_MCA_sharedfp=lockedfile ./train_cpu $small --save $long > $B/long.out 2> $B/long.err
status=$?
if [ $status -eq 2 ] && [ "$(grep -c '^error:' $B/long.err)" -eq 1 ] && [ ! -e $B/long ] &&
   grep -qF "characters, at most 215 here (OMPI_MCA_sharedfp lets Open MPI's sharedfp/lockedfile run" $B/long.err; then
    ok "OMPI_MCA_sharedfp=lockedfile, the user's: the long --save is refused at start-up in one line naming the limit (exit 2)"
else bad "OMPI_MCA_sharedfp=lockedfile with a long --save" "status $status: $(head -c 300 $B/long.err)"; fi
if $MPIRUN -np 2 --mca sharedfp individual ./train_cpu $small --save $long > $B/long.out 2>&1; then
    ok "mpirun --mca sharedfp individual, the user's: a --save path of ${#long} characters saves"
else bad "mpirun --mca sharedfp individual with a long --save" "$(grep -m1 error $B/long.out)"; fi

# ---- OpenMP threads per rank: without OMP_NUM_THREADS, each rank takes its host's cores over
# the ranks on the host (at least one); OMP_NUM_THREADS, when set, is the user's word
cores=$(nproc --all)
threads_line() { sed -n 's/.*, \([0-9]* OpenMP thread(s) per rank (.*)\); rank 0 is .*/\1/p' "$1" | head -1; }
for np in 1 4; do
    want=$((cores / np > 0 ? cores / np : 1))
    usable=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)   # (nproc itself reads OMP_NUM_THREADS)
    [ $want -gt $usable ] && want=$usable   # no more than the cores it may run on
    env -u OMP_NUM_THREADS $MPIRUN -np $np ./train_cpu $small > $B/threads$np.log 2>&1
    if [ "$(threads_line $B/threads$np.log)" = "$want OpenMP thread(s) per rank (this host's $cores cores over its $np rank(s))" ]; then
        ok "no OMP_NUM_THREADS, $np rank(s) on a host of $cores cores: $want thread(s) each"
    else bad "OpenMP threads of $np rank(s)" "$(threads_line $B/threads$np.log; grep -m1 error $B/threads$np.log)"; fi
done
OMP_NUM_THREADS=3 $MPIRUN -np 2 -x OMP_NUM_THREADS ./train_cpu $small > $B/threads_set.log 2>&1
if [ "$(threads_line $B/threads_set.log)" = "3 OpenMP thread(s) per rank (OMP_NUM_THREADS)" ]; then
    ok "OMP_NUM_THREADS=3 is kept (the user's word), and the start-up line says where the count came from"
else bad "OMP_NUM_THREADS kept" "$(threads_line $B/threads_set.log)"; fi

# a micro-batch whose global batch (x DP) no int holds: one line, not a division by zero (SIGFPE)
$MPIRUN -np 4 ./train_cpu $small --micro-batch-size 1073741824 > $B/huge_batch.out 2> $B/huge_batch.err
status=$?
if [ $status -eq 2 ] && [ "$(grep -c '^error:' $B/huge_batch.err)" -eq 1 ] &&
   grep -qF "error: --micro-batch-size 1073741824 x data-parallel size 4 is a global batch of 4294967296 samples" $B/huge_batch.err; then
    ok "--micro-batch-size 2^30 at DP 4: the global batch past 2^31 - 1 is one line, exit 2"
else bad "a global batch past 2^31 - 1" "status $status: $(grep -m2 . $B/huge_batch.err | head -c 300)"; fi
