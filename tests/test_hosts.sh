#!/usr/bin/env bash
# tests/test_hosts.sh DATA_PREFIX — what only several hosts show, on simulated hosts on this
# one machine (tests/sim_hosts.sh: four network, UTS and mount namespaces node1..node4 on a
# bridge, 10.77.0.0/24; Open MPI launches across them through an rsh agent that enters them,
# and the ranks talk over TCP between them, shared memory within one):
#   - training across hosts equals one process (tests/build/test_parallel's recordings, within
#     1e-5): 4 hosts x 1 rank at (TP, PP, DP) = (2,2,1), TP and PP between hosts; 2 hosts x 2
#     ranks at (2,1,2), TP within a host and DP between them; every host's link carried traffic;
#   - the memory share is per host: 4 ranks get the host's memory / 1, / 2 or / 4 as they are
#     spread 4 x 1, 2 x 2 or 1 x 4 (the refusal line of a run that cannot fit says the share);
#   - a node-local copy of the data that differs on one host (each host's own disk at one path)
#     is named with that host, rank 0's host too;
#   - --check-cluster names, by its hostname, the host whose link tc slows (netem's delay and
#     rate; tbf's rate where the kernel has no netem), and no other host; so does the slow-rank
#     report of a training run (DP 4) while that link is at 20 Mbit/s, and it names no rank;
#   - a host whose link goes down mid-run, rank 0's or another: the watchdog's summary names it
#     and its rank within the timeout + 6 s (rank 0's deputy writes it when rank 0 is lost), the
#     job ends (no hang), and the last checkpoint loads on the three hosts left at DP 3 and
#     training goes on.
# Needs root, ip, unshare, nsenter and tc. Where the hosts cannot be made: SKIP, one line; a
# FAIL with REQUIRE_SIMULATED_HOSTS=1 (.ci/run sets it). Everything the test makes is removed when it ends, however
# it ends (a trap).
set -u
data=${1:?usage: test_hosts.sh DATA_PREFIX}
data=$(realpath "$data")
cd "$(dirname "$0")/.."
B=tests/build/hosts
D=$PWD/$B
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 GRIDGPT_HOSTS_DIR=$D
ok() { echo "PASS $1"; }
bad() { echo "FAIL $1: $2"; }
unavailable() {
    if [ "${REQUIRE_SIMULATED_HOSTS:-0}" = 1 ]; then bad "simulated hosts" "$1 (REQUIRE_SIMULATED_HOSTS=1: the multi-host tests must run)"
    else echo "SKIP simulated hosts (tests/test_hosts.sh): $1"; fi
    exit 0
}
[ "$(id -u)" = 0 ] || unavailable "not root (network namespaces, veths and a bridge need root)"
for tool in ip unshare nsenter tc; do command -v $tool > /dev/null || unavailable "no $tool"; done
[ -x ./train_cpu ] || make -s cpu > /dev/null
P=tests/build/test_parallel   # tests/run.sh builds it

bash tests/sim_hosts.sh down $D   # what a killed run may have left
rm -rf $B && mkdir -p $B
trap 'bash tests/sim_hosts.sh down $D' EXIT
trap 'exit 130' INT TERM
why=$(bash tests/sim_hosts.sh up $D node1 node2 node3 node4 2>&1) || unavailable "cannot make the hosts: $why"
printf 'node1 slots=2\nnode2 slots=2\n' > $D/hosts2x2
printf 'node1 slots=4\n' > $D/hosts1x4
printf 'node1 slots=1\nnode2 slots=1\nnode4 slots=1\n' > $D/hosts3

# mpirun in the launcher's namespace; Open MPI's daemons and the ranks on the hosts
hosts_mpirun() {  # HOSTFILE mpirun-arguments...
    local hostfile=$1; shift
    timeout 150 bash tests/sim_hosts.sh run mpirun --hostfile $hostfile --oversubscribe --bind-to none \
        --mca plm_rsh_agent "$PWD/tests/sim_hosts.sh agent" --mca plm_rsh_no_tree_spawn 1 \
        --mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24 --mca btl tcp,vader,self \
        --mca pml ob1 "$@"
}
link_bytes() {  # NAME: bytes through its link so far, both ways
    echo $(( $(cat /sys/class/net/ggv-$1/statistics/rx_bytes) + $(cat /sys/class/net/ggv-$1/statistics/tx_bytes) ))
}

started=$(hosts_mpirun $D/hostfile -np 4 --map-by node hostname 2> $D/hostname.err | sort | tr '\n' ' ')
if [ "$started" = "node1 node2 node3 node4 " ]; then ok "mpirun starts one rank on each of 4 simulated hosts, each with its own hostname"
else bad "mpirun across the simulated hosts" "$started"; exit 0; fi

# ---- training across hosts equals one process (dropout 0.1 on; seed 12, as tests/test_parallel.sh
# says why)
flags="--data-path $data --vocab-size 257 --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16
       --micro-batch-size 2 --global-batch-size 16 --rampup-batch-size 8 8 64 --train-samples 288
       --lr 3e-3 --lr-warmup-samples 32 --lr-decay-style cosine --min-lr 3e-4 --weight-decay 0.1
       --split 90,10,0 --eval-interval 10 --eval-iters 1 --log-interval 100 --seed 12 --data-cache-path $D/cache"
if [ ! -x $P ]; then bad "training across hosts" "$P is not built (tests/run.sh builds it)"
else
    mpirun --oversubscribe --bind-to none -np 1 $P $D/ref $flags > $D/ref.log 2>&1 || bad "the one-process run" "$(grep -m1 error $D/ref.log)"
    across() {  # label hostfile map tp pp dp hosts-that-must-carry-traffic
        local label=$1 hostfile=$2 map=$3 tp=$4 pp=$5 dp=$6 links=$7 before=() i=0 quiet="" name
        name=tp$4-pp$5-dp$6
        for h in $links; do before+=($(link_bytes $h)); done
        hosts_mpirun $hostfile -np $((tp * pp * dp)) --map-by $map $P $D/$name $flags --tensor-model-parallel-size $tp \
            --pipeline-model-parallel-size $pp > $D/$name.log 2>&1 || bad "$label run" "$(grep -m1 error $D/$name.log)"
        for h in $links; do
            [ $(( $(link_bytes $h) - ${before[$i]} )) -gt 100000 ] || quiet="$quiet $h"
            i=$((i + 1))
        done
        [ -z "$quiet" ] || bad "$label: every host's link carries the run's traffic" "under 100 kB through:$quiet"
        $P --compare $D/ref $D/$name "$label (TP $tp, PP $pp, DP $dp)" $flags | grep -E '^(PASS|FAIL)'
    }
    across "4 hosts x 1 rank" $D/hostfile node 2 2 1 "node1 node2 node3 node4"
    across "2 hosts x 2 ranks" $D/hosts2x2 slot 2 1 2 "node1 node2"
fi

# ---- the memory share is per host: a run that cannot fit says what this rank may take
tiny="--data-path $data --vocab-size 257 --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16
      --train-iters 2 --eval-iters 0 --split 90,10,0 --data-cache-path $D/cache"
host_gib=$(awk -v b=$(( $(getconf _PHYS_PAGES) * $(getconf PAGE_SIZE) )) 'BEGIN { printf "%.4f", b / 1073741824 }')
for layout in "4x1 $D/hostfile node 1" "2x2 $D/hosts2x2 slot 2" "1x4 $D/hosts1x4 slot 4"; do
    set -- $layout
    hosts_mpirun $2 -np 4 --map-by $3 ./train_cpu $tiny --micro-batch-size 1048576 > $D/memory.out 2> $D/memory.err
    status=$?
    share=$(grep -o "its share of the host's memory is [0-9.]* GiB" $D/memory.err | grep -o '[0-9.]* GiB' | cut -d' ' -f1)
    want=$(awk -v h=$host_gib -v n=$4 'BEGIN { printf "%.2f", h / n }')
    if [ $status -eq 2 ] && [ "$share" = "$want" ]; then
        ok "4 ranks on $1 hosts x ranks: each may take its host's memory / $4 ($share of $host_gib GiB): only the ranks on its host share it"
    else bad "the memory share of 4 ranks as $1" "status $status, share '${share}' GiB, expected $want (= $host_gib / $4): $(grep -m1 error $D/memory.err | cut -c1-300)"; fi
done

# ---- node-local data: each host reads its own disk ($D/local), one copy differs
name=$(basename $data)
for h in node1 node2 node3 node4; do cp $data.bin $data.idx $D/disk/$h/; done
local_run() {  # log: 4 ranks, one per host, DP 4, each reading its host's copy
    hosts_mpirun $D/hostfile -np 4 --map-by node ./train_cpu ${tiny/--data-path $data/--data-path $D/local/$name} > $D/$1.out 2> $D/$1.err
}
local_run same
if [ $? -eq 0 ] && grep -q "^ \[[^]]*\] iteration        2/" $D/same.out; then ok "identical node-local copies on 4 hosts train"
else bad "identical node-local copies" "$(grep -m1 error $D/same.err)"; fi
printf '\xff' | dd of=$D/disk/node3/$name.bin bs=1 seek=100 conv=notrunc status=none
local_run stale
status=$?
want="error: [rank 2 on node3 TP(0)-PP(0)-DP(2)-Rank(2)] --data-path: this rank's copy differs from rank 0's (on node1): $D/local/$name.bin differs in the blocks sampled"
if [ $status -eq 2 ] && [ "$(grep -c '^error:' $D/stale.err)" -eq 1 ] && grep -qF "$want" $D/stale.err; then
    ok "a node-local copy that differs on node3: exit 2, one line naming node3 (and rank 0's host)"
else bad "a node-local copy that differs on node3" "status $status: $(grep -m2 error $D/stale.err | cut -c1-300)"; fi
cp $data.bin $D/disk/node3/
# the damaged copy on rank 0's host: named there (held against rank 0's copy alone, it was rank 1
# on node2, whose copy is sound, that was named)
printf '\xff' | dd of=$D/disk/node1/$name.bin bs=1 seek=100 conv=notrunc status=none
local_run stale0
status=$?
want="error: [rank 0 on node1 TP(0)-PP(0)-DP(0)-Rank(0)] --data-path: this rank's copy differs from rank 1's (on node2): $D/local/$name.bin differs in the blocks sampled"
if [ $status -eq 2 ] && [ "$(grep -c '^error:' $D/stale0.err)" -eq 1 ] && grep -qF "$want" $D/stale0.err; then
    ok "a node-local copy that differs on node1, rank 0's host: exit 2, one line naming node1 (against the copy most ranks hold)"
else bad "a node-local copy that differs on rank 0's host" "status $status: $(grep -m2 error $D/stale0.err | cut -c1-300)"; fi
cp $data.bin $D/disk/node1/

# ---- --check-cluster names the host whose link is slow
check() {  # log
    hosts_mpirun $D/hostfile -np 4 --map-by node ./train_cpu --check-cluster --pipeline-model-parallel-size 2 \
        --check-cluster-sizes 0.0625 0.25 --check-cluster-matmul-size 128 > $D/$1.log 2>&1
}
check even
[ $? -eq 0 ] && ! grep -q '^slow host\|on host' $D/even.log || check even   # (the first TCP connections: one retry)
if ! grep -q '^slow host\|on host' $D/even.log; then ok "--check-cluster on 4 even hosts names no host"
else echo "SKIP --check-cluster on 4 even hosts names no host: two runs named one, e.g. $(grep -m1 'slow host\|on host' $D/even.log | cut -c1-160)"; fi
# (a matmul line is about a host's cores, not its link: on 2 shared cores one may come and go)
named_right() {  # log: node3 named, for its link, and no other host for a link
    grep -q '^every slow group has a rank on host node3 ' $1 && grep -q '^slow host node3: .*busbw' $1 &&
        ! grep -qE '^slow host node[124]: .*busbw|on host node[124]' $1
}
qdisc=$(bash tests/sim_hosts.sh slow node3 2ms 200mbit)
for try in 1 2; do   # (a second run where a passing disturbance named another group too)
    check slow
    status=$?
    [ $status -eq 0 ] && named_right $D/slow.log && break
done
named=$(grep -oE '^slow host [^:]+|every slow group has a rank on host [^ ]+' $D/slow.log | awk '{print $NF}' | sort | uniq -c | tr -s ' ' | tr '\n' ';')
if [ $status -eq 0 ] && named_right $D/slow.log; then
    ok "--check-cluster names node3, whose link tc slows ($qdisc), by its hostname, and no other host's link (lines per host:$named run $try)"
else bad "--check-cluster names the host with the slow link" "status $status; lines per host:$named $(grep -m1 '^every slow group' $D/slow.log)"; fi

# ---- a slow link during training: the slow-rank report names its host (DP 4, one rank a host,
# node3's link at 20 Mbit/s: the step goes from about 50 to 450 ms, every rank waiting), and no
# rank for its compute (its millisecond more than the median is noise in such a step)
qdisc=$(bash tests/sim_hosts.sh slow node3 2ms 20mbit)
hosts_mpirun $D/hostfile -np 4 --map-by node ./train_cpu --data-path $data --vocab-size 257 --num-layers 2 --hidden-size 64 \
    --num-attention-heads 4 --seq-length 32 --micro-batch-size 2 --global-batch-size 8 --train-iters 8 --log-interval 4 \
    --eval-iters 0 --split 90,10,0 --data-cache-path $D/cache > $D/slow_link.log 2>&1
status=$?
others=$(grep -E '^slow rank:|^slow link: host node[124] ' $D/slow_link.log | head -2 | cut -c1-200)
if [ $status -eq 0 ] && grep -q '^slow link: host node3 (rank 2 TP(0)-PP(0)-DP(2)-Rank(2)) ' $D/slow_link.log && [ -z "$others" ]; then
    ok "node3's link slowed during training ($qdisc): named, and no other host or rank: $(grep -m1 '^slow link:' $D/slow_link.log | cut -c1-220)"
else bad "a slow link during training" "status $status; $(grep -m1 -E '^slow link: host node3|error' $D/slow_link.log | cut -c1-200) others: $others"; fi
tc qdisc del dev ggv-node3 root 2> /dev/null
nsenter -t "$(cat $D/node3.pid)" -n tc qdisc del dev eth0 root 2> /dev/null

# ---- a host's link goes down mid-run: the watchdog names it within its timeout, whichever rank
# is lost (rank 0's too: its deputy, the lowest rank on another host, writes the summary), the
# job ends, and the hosts left resume. (A host whose link comes back up is not used again: a
# launch right after that hangs at times, in Open MPI's start-up.)
timeout=3 io_timeout=10
run="--data-path $data --vocab-size 257 --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16
     --micro-batch-size 2 --global-batch-size 12 --eval-iters 0 --split 90,10,0 --log-interval 1 --data-cache-path $D/cache
     --save-interval 10 --watchdog-timeout $timeout --watchdog-io-timeout $io_timeout"
since() { awk -v t0=$1 -v t=$(date +%s.%N) 'BEGIN { printf "%.1f", t - t0 }'; }
at_most() { awk -v x=$1 -v most=$2 'BEGIN { exit !(x <= most) }'; }
# link_down NAME HOST HOSTFILE MAP GRID-FLAGS...: 4 ranks until the first save, then HOST's link
# down. Sets status, summary, named (seconds from the link going down to the summary line, or
# to the job's end without one) and ended (to the job's end).
link_down() {
    local name=$1 host=$2 hostfile=$3 map=$4 job t0; shift 4
    hosts_mpirun $hostfile -np 4 --map-by $map ./train_cpu $run --save $D/$name.ckpt --train-iters 100000 "$@" \
        > $D/$name.out 2> $D/$name.err &
    job=$!
    for i in $(seq 600); do   # the first save (at 10; a fast run may be past 20 before the next look)
        [ "$(cat $D/$name.ckpt/latest_checkpointed_iteration.txt 2> /dev/null || echo 0)" -ge 10 ] && break; sleep 0.1
    done
    bash tests/sim_hosts.sh link $host down
    t0=$(date +%s.%N)
    while kill -0 $job 2> /dev/null && ! grep -q "^error: watchdog summary:" $D/$name.err; do sleep 0.1; done
    named=$(since $t0)
    wait $job
    status=$? ended=$(since $t0)
    summary=$(grep "^error: watchdog summary:" $D/$name.err)
    # the limit that applies: --watchdog-io-timeout when the link went down during a save
    limit=$timeout; grep -q -- "--watchdog-io-timeout $io_timeout)" $D/$name.err && limit=$io_timeout
    bash tests/sim_hosts.sh stop $host   # the host is gone: what ran on it ends
}
# Named within the timeout: the summary within the limit + 6 (--watchdog-timeout, or
# --watchdog-io-timeout when the link went down during a save: saves come every 10 iterations,
# a fraction of a second apart here) (its 1 s of grace, a heartbeat,
# the launcher's forwarding, a loaded machine; it took $timeout + 10 before the heartbeats).
# rank 2 on node3, one rank a host, PP 2 x DP 2 (rank 2 = TP(0)-PP(1)-DP(0)): rank 0 writes it
link_down down node3 $D/hostfile node --pipeline-model-parallel-size 2
if [ $status -ne 0 ] && [ $status -ne 124 ] && at_most $named $((limit + 6)) && at_most $ended $((limit + 25)) &&
   [[ "$summary" =~ "(dead, frozen or cut off): rank 2 on node3 pid "[0-9]+" TP(0)-PP(1)-DP(0)-Rank(2) | hosts none of whose ranks is heard from: node3"$ ]]; then
    ok "node3's link down mid-run: the watchdog summary names rank 2 and node3 $named s later (the timeout that applied: $limit s), the job ends after $ended s (status $status)"
else bad "a host whose link goes down" "status $status, summary after $named s (at most $((limit + 6))), end after $ended s: $(head -c 600 <<< "$summary")"; fi
saved=$(cat $D/down.ckpt/latest_checkpointed_iteration.txt)
hosts_mpirun $D/hosts3 -np 3 --map-by node ./train_cpu $run --train-iters $((saved + 2)) --override-opt-param-scheduler --load $D/down.ckpt --save $D/down.ckpt > $D/resume.out 2> $D/resume.err
status=$?
if [ $status -eq 0 ] && grep -q "3 rank(s) as TP 1 x PP 1 x DP 3" $D/resume.out &&
   grep -q "loaded checkpoint $D/down.ckpt/iter_$(printf %07d $saved)" $D/resume.out &&
   grep -qE "^ \[[^]]*\] iteration +$((saved + 2))/ +$((saved + 2)) " $D/resume.out; then
    ok "the last checkpoint (iteration $saved, PP 2 x DP 2 on 4 hosts) loads on the 3 hosts left at DP 3, and training goes on"
else bad "resuming on the hosts left" "status $status: $(grep -m2 error $D/resume.err | cut -c1-300)"; fi
# rank 0's host, node1, on the 3 hosts left (ranks 0 | 1, 2 | 3 on node1 | node2 | node4), TP 2
# x DP 2: rank 1 on node2 is rank 0's deputy and writes it
printf 'node1 slots=1\nnode2 slots=2\nnode4 slots=1\n' > $D/hosts1-2-1
link_down lost0 node1 $D/hosts1-2-1 slot --tensor-model-parallel-size 2
if [ $status -ne 0 ] && [ $status -ne 124 ] && at_most $named $((limit + 6)) && at_most $ended $((limit + 25)) &&
   [[ "$summary" =~ "(dead, frozen or cut off): rank 0 on node1 pid "[0-9]+" TP(0)-PP(0)-DP(0)-Rank(0) | hosts none of whose ranks is heard from: node1 | written by rank 1 on node2, rank 0's deputy" ]]; then
    ok "node1's link down (rank 0's host, TP 2 x DP 2): rank 1 on node2 writes the summary naming rank 0 and node1 $named s later (the timeout that applied: $limit s), the job ends after $ended s (status $status)"
else bad "rank 0's host's link down" "status $status, summary after $named s (at most $((limit + 6))), end after $ended s: $(head -c 600 <<< "$summary")"; fi
