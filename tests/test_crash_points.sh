#!/usr/bin/env bash
# tests/test_crash_points.sh DATA_PREFIX — a crash, or a failed call, at every file-system call
# of a run that saves, and nothing is lost (the method of SQLite's crash tests and of Pillai et
# al., "All File Systems Are Not Created Equal", OSDI 2014).
#
# A run loads the checkpoint of iteration 2 and saves iteration 3 into the same --save
# directory. tests/fault_fs.c counts its calls under that directory (N of them: the start-up
# probe and lock, MPI-IO's writes of tensors.bin, metadata.txt, the renames, the marker,
# every fsync). Then, for every k in 1..N, on a fresh copy of the directory: the run is killed
# at its k-th call (SIGKILL: what reached the disk stays), and separately the k-th call fails
# with EIO (on one process; on the grid the kill alone: a failed write on a grid is
# tests/test_checkpoint.sh's fault_write case). After each, a fresh run with --load must load a checkpoint whose CRCs verify:
# iteration 3 if the faulty run said it saved it (nothing silently lost), else 2 or 3; the
# marker never names a missing or partial checkpoint. On one process and on (TP, PP, DP) =
# (2,1,2), where the faults hit rank 0 (which writes its part of tensors.bin, metadata.txt and
# the marker); each check is one line per layout and mode, naming every point that failed.
set -u
data=${1:?usage: test_crash_points.sh DATA_PREFIX}
B=tests/build/crash_points
rm -rf $B && mkdir -p $B
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if ! gcc -shared -fPIC -O1 -Wall -Wextra -Werror tests/fault_fs.c -o $B/fault_fs.so -ldl > $B/build.log 2>&1; then
    echo "FAIL build tests/fault_fs.c: $(head -3 $B/build.log)"; exit 1
fi
flags="--data-path $data --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --split 90,10,0
       --eval-iters 0 --log-interval 100 --micro-batch-size 1 --global-batch-size 4 --lr-decay-iters 10"

# one fault point: LAYOUT-LAUNCHER MODE K -> "k: what went wrong" on stdout, nothing if it held
point() {
    local launch=$1 mode=$2 k=$3 work=$B/$2-$3
    rm -rf $work && cp -r $B/base$4 $work
    env LD_PRELOAD=$PWD/$B/fault_fs.so FAULT_DIR=$PWD/$work FAULT_AT=$k FAULT_MODE=$mode FAULT_RANK=0 \
        $launch ./train_cpu $flags $5 --train-iters 3 --load $work --save $work > $work.run 2>&1
    local status=$?
    ./train_cpu $flags --train-iters 3 --load $work > $work.load 2>&1
    local loaded
    loaded=$(sed -n "s|^loaded checkpoint $work/iter_000000\([0-9]\) .*|\1|p" $work.load)
    if [ -z "$loaded" ]; then echo "$k: no checkpoint loads after it ($(grep -m1 error $work.load))"
    elif grep -q "^saved checkpoint $work/iter_0000003" $work.run && [ "$loaded" != 3 ]; then
        echo "$k: the run said it saved iteration 3, the marker names $loaded"
    elif [ $mode = fail ] && [ $status -eq 0 ] && ! grep -q "^saved checkpoint $work/iter_0000003" $work.run &&
         ! grep -q "^checkpoint .* not saved\|cannot" $work.run; then
        echo "$k: the call failed, the run ended with status 0 and said nothing"
    fi
}
export -f point
export B flags

sweep() {  # label (a file name) launcher grid-flags modes
    local label=$1 launch=$2 grid=$3 modes=$4
    rm -rf $B/base$label
    $launch ./train_cpu $flags $grid --train-iters 2 --save $B/base$label > $B/base$label.log 2>&1
    rm -f $B/base$label/gridgpt.lock
    rm -rf $B/count && cp -r $B/base$label $B/count
    env LD_PRELOAD=$PWD/$B/fault_fs.so FAULT_DIR=$PWD/$B/count FAULT_COUNT=$PWD/$B/count$label.n FAULT_RANK=0 \
        $launch ./train_cpu $flags $grid --train-iters 3 --load $B/count --save $B/count > $B/count$label.log 2>&1
    local n
    n=$(cat $B/count$label.n 2>/dev/null || echo 0)
    if [ "$n" -lt 20 ] || ! grep -q "^saved checkpoint $B/count/iter_0000003" $B/count$label.log; then
        echo "FAIL crash points $label: the counting run saw $n calls ($(grep -m1 -E 'error|saved' $B/count$label.log))"
        return
    fi
    for mode in $modes; do
        # 4 at a time: a point's two runs mostly wait (process start, fsync), 2 cores keep up
        seq 1 $n | xargs -P 4 -I K bash -c "point '$launch' $mode K '$label' '$grid'" > $B/$mode$label.failures
        if [ -s $B/$mode$label.failures ]; then
            echo "FAIL crash points $label, $mode at each of $n calls: $(head -3 $B/$mode$label.failures | tr '\n' ';')"
        else
            echo "PASS crash points $label: $mode at each of the $n file-system calls of a run that saves; a checkpoint loads after every one, the one said to be saved when it was"
        fi
    done
}

sweep one-process "" "" "kill fail"
sweep tp2-pp1-dp2 "mpirun --oversubscribe --bind-to none -np 4" "--tensor-model-parallel-size 2" kill

# EIO on each call of the tensors.bin save is reported with the system's reason, in one line: on
# the write it once read "Invalid argument" (this shim's own path checks changed errno while Open
# MPI handled the error), on ftruncate and fsync there was no reason at all
for call in pwrite,pwritev,write ftruncate fsync; do
    work=$PWD/$B/eio-${call%%,*}
    rm -rf $work && cp -r $B/baseone-process $work
    env LD_PRELOAD=$PWD/$B/fault_fs.so FAULT_DIR=$work/iter_0000003.tmp/tensors.bin FAULT_CALLS=$call FAULT_AT=1 \
        FAULT_MODE=fail ./train_cpu $flags --train-iters 3 --load $work --save $work > $work.run 2> $work.err
    status=$?
    if [ $status -eq 1 ] && [ "$(grep -c 'checkpoint not saved' $work.err)" -eq 1 ] &&
       grep -q "checkpoint not saved: .*$work/iter_0000003.tmp/tensors.bin.*: Input/output error$" $work.err; then
        echo "PASS EIO on the tensors.bin save's ${call%%,*}: the save is refused in one line naming the reason (Input/output error)"
    else echo "FAIL EIO on the tensors.bin save's ${call%%,*}: status $status: $(grep -m1 'not saved' $work.err)"; fi
done
