#!/usr/bin/env bash
# tests/test_watchdog.sh DATA_PREFIX — bring-up diagnosis on the CPU build:
#   - a rank frozen at iteration 3 of a (2,2,2) job: the job ends within the watchdog's
#     timeout + 30 s, every rank's line names what it waits in, and rank 0's summary names
#     the frozen rank as the one the others wait for;
#   - a rank killed with SIGKILL: the job ends (no hang), and Open MPI names the dead rank;
#   - a rank made 4x slower: the slow-rank line names exactly it; an even job names none.
# The faults are the trainer's test-only switches (GRIDGPT_TEST_* in train.c).
set -u
data=${1:?usage: test_watchdog.sh DATA_PREFIX}
B=tests/build/watchdog
rm -rf $B && mkdir -p $B
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none"
host=$(hostname)
ok() { echo "PASS $1"; }
bad() { echo "FAIL $1: $2"; }
run="--data-path $data --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2
     --global-batch-size 16 --train-iters 8 --eval-iters 0 --split 90,10,0 --log-interval 2"
grid222="--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"

# a frozen rank
timeout=5 t0=$(date +%s)
timeout 120 $MPIRUN -x GRIDGPT_TEST_HANG_RANK=5 -x GRIDGPT_TEST_HANG_ITERATION=3 -np 8 ./train_cpu $run $grid222 \
    --watchdog-timeout $timeout > $B/hang.out 2> $B/hang.err
status=$? seconds=$(( $(date +%s) - t0 ))
lines=$(grep -c "watchdog: no progress for" $B/hang.err)
summary=$(grep "^error: watchdog summary:" $B/hang.err)
if [ $status -ne 0 ] && [ $status -ne 124 ] && [ $seconds -le $((timeout + 30)) ] && [ "$lines" -eq 8 ] &&
   [[ "$summary" =~ "waiting in a collective: ranks 0,1,2,3,4,6,7 | in none, so the others wait for them: rank 5 on $host pid "[0-9]+" TP(1)-PP(1)-DP(0)-Rank(5) (iteration 3" ]]; then
    ok "a rank frozen at iteration 3 of a (2,2,2) job: ended in $seconds s (status $status), 8 lines, the summary names rank 5"
else bad "a frozen rank" "status $status after $seconds s, $lines lines; $(head -c 400 <<< "$summary")"; fi
if grep -q "^error: \[rank 0 on $host pid [0-9]* TP(0)-PP(0)-DP(0)-Rank(0)\] watchdog: no progress for [0-9]* s (--watchdog-timeout 5): iteration 3, micro-batch [0-9]*, [a-z]*: waiting in " $B/hang.err; then
    ok "each stuck rank's line names its coordinates, the iteration, micro-batch, phase and what it waits in"
else bad "the watchdog line's shape" "$(grep -m1 'rank 0 on' $B/hang.err)"; fi

# a rank frozen whole (SIGSTOP: its watchdog thread stops too, so it sends no report): the
# summary names it by host, pid and coordinates, from what rank 0 gathered at the start
timeout 120 $MPIRUN -np 2 ./train_cpu $run --train-iters 100000 --watchdog-timeout 2 > $B/stop.out 2> $B/stop.err &
job=$!
for i in $(seq 600); do grep -qE '^ \[[^]]*\] iteration' $B/stop.out 2> /dev/null && break; sleep 0.1; done
frozen=$(pgrep -f "train_cpu .*--train-iters 100000 --watchdog-timeout 2" | sort -n | tail -1)
kill -STOP $frozen
wait $job
status=$?
kill -KILL $frozen 2> /dev/null
summary=$(grep "^error: watchdog summary:" $B/stop.err)
if [ $status -ne 0 ] && [ $status -ne 124 ] && [[ "$summary" =~ "(dead, frozen or cut off): rank "[01]" on $host pid $frozen TP(0)-PP(0)-DP("[01]")-Rank("[01]")" ]]; then
    ok "a rank stopped with SIGSTOP: the summary names its host, pid ($frozen) and coordinates"
else bad "a rank stopped with SIGSTOP" "status $status: $(head -c 400 <<< "$summary")"; fi

# a slow save is not a hang: rank 0's fsync of tensors.bin made 6 s late (tests/fault_fs.c), with
# --watchdog-timeout 2. Every rank is then under --watchdog-io-timeout (the others wait for rank
# 0's save): the default lets the save finish. An fsync of 12 s under --watchdog-io-timeout 1
# ends the job (the watchdog fires after 1 s and ends it after its 10 s of grace), naming the
# save and that flag.
gcc -shared -fPIC -O1 -Wall -Wextra -Werror tests/fault_fs.c -o $B/fault_fs.so -ldl
slow_save() {  # name, seconds, more flags
    local name=$1 delay=$2; shift 2
    rm -rf $B/$name.ckpt
    timeout 120 $MPIRUN -np 2 -x LD_PRELOAD=$PWD/$B/fault_fs.so -x FAULT_DIR=$PWD/$B/$name.ckpt -x FAULT_RANK=0 \
        -x FAULT_CALLS=fsync -x FAULT_AT=2 -x FAULT_MODE=delay -x FAULT_DELAY=$delay \
        ./train_cpu $run --train-iters 2 --save $B/$name.ckpt --watchdog-timeout 2 "$@" > $B/$name.out 2> $B/$name.err
}
# (the two jobs run at the same time: each mostly waits)
slow_save slow_fsync 6 &
slow=$!
slow_save stuck_fsync 12 --watchdog-io-timeout 1 &
stuck=$!
wait $slow
status=$?
if [ $status -eq 0 ] && ! grep -q watchdog $B/slow_fsync.err && [ "$(cat $B/slow_fsync.ckpt/latest_checkpointed_iteration.txt)" = 2 ]; then
    ok "a save whose fsync takes 6 s under --watchdog-timeout 2 finishes (the save has --watchdog-io-timeout)"
else bad "a slow fsync under a short watchdog timeout" "status $status: $(grep -m2 -E 'watchdog|error' $B/slow_fsync.err)"; fi
wait $stuck
status=$?
if [ $status -ne 0 ] && [ $status -ne 124 ] &&
   grep -q "^error: \[rank 0 on $host pid [0-9]* TP(0)-PP(0)-DP(0)-Rank(0)\] watchdog: no progress for [0-9]* s (--watchdog-io-timeout 1): iteration 2, saving a checkpoint" $B/stuck_fsync.err; then
    ok "an fsync longer than --watchdog-io-timeout 1 ends the job, naming the save and the flag"
else bad "an fsync longer than --watchdog-io-timeout" "status $status: $(grep -m1 'rank 0 on' $B/stuck_fsync.err)"; fi

# a dead rank
t0=$(date +%s)
timeout 120 $MPIRUN -x GRIDGPT_TEST_KILL_RANK=5 -x GRIDGPT_TEST_HANG_ITERATION=3 -np 8 ./train_cpu $run $grid222 \
    --watchdog-timeout $timeout > $B/kill.out 2> $B/kill.err
status=$? seconds=$(( $(date +%s) - t0 ))
if [ $status -ne 0 ] && [ $status -ne 124 ] && grep -q "process rank 5 .* on node $host exited on signal 9" $B/kill.err; then
    ok "a rank killed with SIGKILL ends the job in $seconds s (status $status), Open MPI naming rank 5"
else bad "a killed rank" "status $status after $seconds s: $(grep -m2 -iE 'rank 5|error' $B/kill.err)"; fi

# Slow ranks: DP 3 (the median of a stage is then an unslowed rank), rank 2 eight times slower;
# then an even job. Threshold 2: on a shared 2-core machine 3 ranks' step times wander by more
# than 1.5x (seen: an unslowed rank named at 1.5), far less than 8x.
slow_lines() { grep "^slow rank:" "$1" | sed -E 's/^slow rank: (rank [0-9]+ on [^ ]+ [^ ]+) .*/\1/' | sort -u; }
slow_run="$run --hidden-size 64 --seq-length 64 --micro-batch-size 2 --global-batch-size 6 --log-interval 4 --slow-rank-threshold 2"
$MPIRUN -x GRIDGPT_TEST_SLOW_RANK=2 -x GRIDGPT_TEST_SLOW_FACTOR=8 -np 3 ./train_cpu $slow_run > $B/slow.out 2>&1
named=$(slow_lines $B/slow.out)
if [ "$named" = "rank 2 on $host TP(0)-PP(0)-DP(2)-Rank(2)" ]; then
    ok "a rank computing 8x as long is named, and no other: $(grep -m1 '^slow rank:' $B/slow.out | cut -c1-160)"
else bad "the slowed rank" "named: '$named'"; fi
$MPIRUN -np 2 ./train_cpu $slow_run --global-batch-size 4 > $B/even.out 2>&1
if [ $? -eq 0 ] && [ -z "$(slow_lines $B/even.out)" ] && grep -q "^ \[[^]]*\] iteration        8/" $B/even.out; then
    ok "an even job names no slow rank"
else bad "an even job" "$(grep -m2 -E '^slow rank|error' $B/even.out)"; fi

# a healthy job with a short timeout: training, evaluation, a checkpoint and sampling on rank 0
# (after the watchdog stops) take as long as they take and nothing fires
$MPIRUN -np 8 ./train_cpu $run $grid222 --watchdog-timeout 3 --eval-iters 1 --eval-interval 4 --save $B/healthy \
    > $B/healthy.out 2> $B/healthy.err
status=$?
if [ $status -eq 0 ] && ! grep -q watchdog $B/healthy.err && grep -q "^ \[[^]]*\] iteration        8/" $B/healthy.out; then
    ok "a healthy (2,2,2) job with --watchdog-timeout 3 (evaluation, checkpoint) ends normally, no watchdog line"
else bad "a healthy job with a short watchdog timeout" "status $status: $(grep -m2 -E 'watchdog|error' $B/healthy.err)"; fi
