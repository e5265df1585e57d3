#!/usr/bin/env bash
# tests/test_scale.sh DATA_PREFIX — proof at scale on one machine:
#   - a 64-rank run (TP 2 x PP 4 x DP 8) of a tiny model matches one process: losses and
#     grad norms at every one of 20 steps and the final weights within 1e-5 relative;
#   - the parallel layouts of tests/test_parallel.sh again, with Open MPI restricted to TCP
#     between ranks (--mca pml ob1 --mca btl tcp,self: the transport used between hosts; pml ob1
#     because the UCX pml, where installed, would ignore the btl list), so that no code
#     path depends on shared memory.
set -u
data=${1:?usage: test_scale.sh DATA_PREFIX}
B=tests/build/scale
rm -rf $B && mkdir -p $B
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none"
REC=tests/build/test_parallel   # records every step's loss and norm in full precision
fail() { echo "FAIL $1: $2"; }

# 4 layers (PP 4), 4 heads (TP 2), micro-batch 2 x DP 8 = 16 samples per round, 2 rounds a step
flags="--data-path $data --vocab-size 257 --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16
       --micro-batch-size 2 --global-batch-size 32 --train-iters 20 --lr 3e-3 --lr-warmup-iters 4
       --lr-decay-style cosine --min-lr 3e-4 --weight-decay 0.1 --split 90,10,0 --eval-interval 10
       --eval-iters 1 --log-interval 100 --seed 7"
record() {  # name np mpirun-options -- trainer flags
    local name=$1 np=$2; shift 2
    local options=()
    while [ "$1" != "--" ]; do options+=("$1"); shift; done
    shift
    $MPIRUN "${options[@]}" -np $np $REC $B/$name $flags "$@" > $B/$name.log 2>&1 ||
        fail "$name run" "exit status $?: $(grep -m1 -E 'error|FAIL' $B/$name.log)"
    grep -E '^(PASS|FAIL)' $B/$name.log | sed "s/^\(PASS\|FAIL\) /\1 $name: /"
}
compare() {  # ref run label
    $REC --compare $B/$1 $B/$2 "$3" $flags | grep -E '^(PASS|FAIL)'
}

record ref 1 --
record world64 64 -- --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4
compare ref world64 "64 ranks as (TP,PP,DP)=(2,4,8)"

for layout in "2 1 1" "1 2 1" "1 1 2" "2 2 2" "1 4 2"; do
    set -- $layout
    record tcp-tp$1-pp$2-dp$3 $(($1 * $2 * $3)) --mca pml ob1 --mca btl tcp,self -- \
        --tensor-model-parallel-size $1 --pipeline-model-parallel-size $2
    compare ref tcp-tp$1-pp$2-dp$3 "($1,$2,$3) over TCP only (--mca pml ob1 --mca btl tcp,self)"
done
