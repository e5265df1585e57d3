#!/usr/bin/env bash
# tests/test_check_cluster.sh DATA_PREFIX — --check-cluster at (TP, PP, DP) = (2,2,2) on 8 ranks.
#   - alone (no --data-path): a table for the TP, DP and PP groups, the world and the pipeline
#     links, each with every operation at every size; in every row the algorithm bandwidth is
#     bytes / time and the bus bandwidth is that times 2(n-1)/n (all-reduce), (n-1)/n
#     (reduce-scatter, all-gather) or 1 (send/recv), recomputed here from the printed bytes and
#     times; the matmul line and the host table; exit status 0, no training;
#   - a rank slowed on purpose (GRIDGPT_TEST_SLOW_RANK=5, GRIDGPT_TEST_SLOW_FACTOR=8: rank 5
#     takes 8 times as long in everything it times) is named with its host and coordinates,
#     for its matmul and in each of its groups (TP 4,5; DP 5,7; PP 1,5; the link 1>5);
#   - an even run names nothing. This machine's 2 cores are shared by 8 ranks and by other
#     jobs, and the check names what it sees: up to 3 runs are tried, and when every one named
#     something the line is a SKIP that says so (tests/test_model.c checks on made-up figures
#     that an even report names nothing);
#   - with --data-path and training flags it checks, then trains; its flags' errors are one line;
#   - its first line names the grid, CP next to TP with context parallelism (TP 2 x CP 2).
# tests/test_check_cluster.sh --verify LOG LABEL: only the tables and formulas of LOG (the
# emulated GPU build's run in tests/test_emu_train.sh uses it).
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none"
ok() { echo "PASS $1"; }
bad() { echo "FAIL $1: $2"; }

# the tables of a (2,2,2) run: "KIND ROWS" per table, and the rows whose bandwidths do not
# follow from their bytes and times (none: the formulas hold)
tables() {  # LOG
    awk '
    function near(printed, want) { d = printed - want; if (d < 0) d = -d; return d <= 0.0006 + 2e-3 * want }
    /^TP groups: /    { kind = "TP" }
    /^DP groups: /    { kind = "DP" }
    /^PP groups: /    { kind = "PP" }
    /^world: /        { kind = "world" }
    /^pipeline links/ { kind = "link" }
    /^[A-Za-z]/ && / of [0-9]+ ranks$/ { n = $(NF - 1); rows[kind] = 0 }
    /^  (all-reduce|reduce-scatter|all-gather|send\/recv) / {
        rows[kind]++
        f = $1 == "all-reduce" ? 2 * (n - 1) / n : $1 == "send/recv" ? 1 : (n - 1) / n
        for (c = 5; c <= 10; c += 5) {   # the median group, the slowest group
            alg = $3 / $c / 1e3          # bytes / (time in us) / 1e3 = GB/s
            if (!near($(c + 1), alg) || !near($(c + 2), alg * f))
                printf "bad %s %s %s: time %s us gives algbw %.4f busbw %.4f, printed %s %s\n", kind, $1, $3, $c, alg, alg * f, $(c + 1), $(c + 2)
        }
    }
    END { for (k in rows) print k, rows[k] }' "$1" | sort
}

verify() {  # LOG LABEL: every table with its 6 rows (2 for the links) and the formulas in each row
    local log=$1 label=$2 got
    got=$(tables "$log" | tr '\n' ' ')
    if [ "$(tables "$log" | grep -v '^bad' | tr '\n' ' ')" = "DP 6 PP 6 TP 6 link 2 world 6 " ]; then
        ok "$label: a table for the TP, DP and PP groups, the world and the pipeline links, every operation at both sizes"
    else bad "$label: the tables" "$got"; fi
    if tables "$log" | grep -q '^bad'; then bad "$label: algbw = bytes / time, busbw = algbw x 2(n-1)/n, (n-1)/n or 1" "$(tables "$log" | grep -m3 '^bad')"
    else ok "$label: in every row algbw = bytes / time and busbw = algbw x 2(n-1)/n (all-reduce), (n-1)/n (reduce-scatter, all-gather), 1 (send/recv)"; fi
    if grep -q '^matmul (matmul_forward, ' "$log" && grep -qE '^  [^ ]+ +8 \| ' "$log" && grep -q '^check-cluster: ' "$log"; then
        ok "$label: the matmul line, the host table and the summary"
    else bad "$label: the matmul line, the host table and the summary" "$(tail -5 "$log")"; fi
}

if [ "${1:-}" = "--verify" ]; then
    verify "$2" "$3"
    exit 0
fi

data=${1:?usage: test_check_cluster.sh DATA_PREFIX}
B=tests/build/check_cluster
mkdir -p $B
[ -x ./train_cpu ] || make -s cpu > /dev/null
grid="--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"
small="--check-cluster-sizes 0.25 1 --check-cluster-matmul-size 256"
check() {  # LOG [mpirun flags...]: the check alone at (2,2,2); its exit status
    local log=$1; shift
    $MPIRUN -np 8 "$@" ./train_cpu --check-cluster $grid $small > "$log" 2>&1
}

check $B/even.log
status=$?
verify $B/even.log "--check-cluster alone at (2,2,2)"
if [ $status -eq 0 ] && grep -q '^check-cluster: no --data-path, so no training' $B/even.log && ! grep -q ' iteration ' $B/even.log; then
    ok "--check-cluster without --data-path checks, trains nothing and exits 0"
else bad "--check-cluster alone" "exit status $status: $(tail -3 $B/even.log)"; fi

# rank 5 = TP(1)-PP(1)-DP(0): tp + TP (dp + DP pp) = 1 + 2 (0 + 2 x 1)
check $B/slow.log -x GRIDGPT_TEST_SLOW_RANK=5 -x GRIDGPT_TEST_SLOW_FACTOR=8
status=$?
host=$(hostname)
missing=""
for want in "slow rank: matmul of rank 5 on $host TP(1)-PP(1)-DP(0)-Rank(5)" "slow TP group 4,5: " "slow DP group 5,7: " \
            "slow PP group 1,5: " "slow pipeline link 1>5: "; do
    grep -qF "$want" $B/slow.log || missing="$missing [$want]"
done
if [ $status -eq 0 ] && [ -z "$missing" ] && grep -qF "rank 5 on $host TP(1)-PP(1)-DP(0)-Rank(5)" <(grep '^slow TP group 4,5' $B/slow.log); then
    ok "a rank slowed 8x is named with its host and coordinates: its matmul, its TP, DP and PP groups and its pipeline link"
else bad "the slowed rank 5 is named" "exit status $status; not found:$missing; $(grep -c '^slow' $B/slow.log) slow line(s)"; fi

tries=1
while grep -q '^slow' $B/even.log && [ $tries -lt 3 ]; do
    check $B/even.log
    tries=$((tries + 1))
done
if ! grep -q '^slow' $B/even.log; then
    ok "an even run names nothing (run $tries of at most 3)"
else
    echo "SKIP an even run names nothing: each of 3 runs named something (load average $(cut -d' ' -f1 /proc/loadavg) on" \
         "$(getconf _NPROCESSORS_ONLN) cores shared with other jobs), e.g. $(grep -m1 '^slow' $B/even.log | cut -c1-160)"
fi

# before a run: the check, then training (--data-path given)
$MPIRUN -np 2 ./train_cpu --check-cluster --pipeline-model-parallel-size 2 --check-cluster-sizes 0.0625 \
    --check-cluster-matmul-size 64 --data-path $data --vocab-size 257 --num-layers 2 --hidden-size 32 \
    --num-attention-heads 4 --seq-length 16 --micro-batch-size 2 --train-iters 2 --log-interval 1 --eval-iters 0 \
    --split 90,10,0 > $B/then_train.log 2>&1
status=$?
check_line=$(grep -n '^check-cluster: ' $B/then_train.log | tail -1 | cut -d: -f1)
first_iteration=$(grep -n ' iteration ' $B/then_train.log | head -1 | cut -d: -f1)
if [ $status -eq 0 ] && [ -n "$check_line" ] && [ -n "$first_iteration" ] && [ "$check_line" -lt "$first_iteration" ] &&
   grep -q '^TP groups: one rank each' $B/then_train.log && grep -q '^pipeline links.*: 1 of 2 ranks' $B/then_train.log &&
   grep -q ' iteration        2/       2 ' $B/then_train.log; then
    ok "--check-cluster with --data-path checks, then trains (PP 2: TP and DP groups of one rank, one pipeline link)"
else bad "--check-cluster before a run" "exit status $status: $(grep -m2 'error\|groups' $B/then_train.log)"; fi

# the check's first line names the grid as the start-up line does: CP next to TP where there is
# context parallelism (TP 2 x CP 2 at 4 ranks), not at all where there is none (the (2,2,2) above)
$MPIRUN -np 4 ./train_cpu --check-cluster --tensor-model-parallel-size 2 --context-parallel-size 2 --check-cluster-sizes 0.0625 \
    --check-cluster-matmul-size 64 > $B/context_parallel.log 2>&1
status=$?
if [ $status -eq 0 ] && grep -q '^check-cluster: 4 rank(s) as TP 2 x CP 2 x PP 1 x DP 1, CPU build; ' $B/context_parallel.log &&
   grep -q '^check-cluster: 8 rank(s) as TP 2 x PP 2 x DP 2, CPU build; ' $B/even.log; then
    ok "the check's first line names the grid: TP 2 x CP 2 x PP 1 x DP 1 with context parallelism, TP 2 x PP 2 x DP 2 without"
else bad "the check's grid line" "exit status $status: $(grep -m1 '^check-cluster: ' $B/context_parallel.log) / $(grep -m1 '^check-cluster: ' $B/even.log)"; fi

# the check's flags: one line each, exit status 2
refused() {  # label, expected text, ranks, flags...
    local label=$1 want=$2 np=$3; shift 3
    $MPIRUN -np $np ./train_cpu "$@" > $B/refused.log 2>&1
    local status=$?
    if [ $status -eq 2 ] && [ "$(grep -c '^error:' $B/refused.log)" -eq 1 ] && grep -q -- "$want" $B/refused.log; then ok "$label"
    else bad "$label" "exit status $status: $(head -3 $B/refused.log)"; fi
}
refused "--check-cluster-sizes 0 is refused in one line" "--check-cluster-sizes expects sizes in MiB" 1 --check-cluster --check-cluster-sizes 0
refused "--check-cluster-sizes must increase" "must increase" 1 --check-cluster --check-cluster-sizes 4 1
refused "--check-cluster-sizes without --check-cluster is refused" "go with --check-cluster" 1 --check-cluster-sizes 1 --data-path $data
refused "--check-cluster on a grid that does not fit the world is refused" "world size 3 is not a multiple" 3 --check-cluster \
    --tensor-model-parallel-size 2
