#!/usr/bin/env bash
# tests/test_trace.sh DATA_PREFIX — --profile (trace.h): the timeline it writes and what it costs.
# The tiny model of the parallel tests, 4 steps of 8 micro-batches:
#   - (1,4,1) profiling iterations 2-3 (an evaluation and a checkpoint save after iteration 3):
#     the merged file is Chrome trace-event JSON, every event well-formed, every rank and
#     track named, spans of one track nested or apart, one step span per profiled iteration,
#     every kind of span with its arguments, and each stage's forwards and backwards in
#     exactly 1F1B's order (tests/trace_check.py); scripts/trace_schedule.py draws the same
#     order and the bubble next to the planner's; scripts/trace_plot.py draws a PNG (needs
#     matplotlib: SKIP without it, FAIL with REQUIRE_MATPLOTLIB=1, as CI sets);
#   - the same run without --profile: bit-identical log lines but the timing fields;
#   - (2,2,2) with --overlap-grad-reduce profiling ranks 0, 3 and 5 only: the tensor- and
#     data-parallel collectives with their groups and bytes, the other ranks silent;
#   - tests/trace_check.py itself catches planted errors (an order that is not 1F1B, spans
#     that overlap on one track, a track without a name);
#   - the refusals, one line and exit status 2 each: --profile-step-end not after the start,
#     beyond the run, before a resumed run, a rank not in the world, not a rank number, an
#     unwritable --profile-dir.
# The GPU path's trace (device spans on both streams, under the emulation): tests/test_emu_train.sh.
# Prints one PASS/FAIL line per check.
set -u
data=${1:?usage: test_trace.sh DATA_PREFIX}
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ok() { echo "PASS $1"; }
bad() { echo "FAIL $1: $2"; }
[ -x ./train_cpu ] || make -s cpu > /dev/null

model="--data-path $data --vocab-size 257 --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16
       --micro-batch-size 1 --global-batch-size 8 --train-iters 4 --log-interval 1 --split 90,10,0 --seed 7"
profile="--profile --profile-step-start 1 --profile-step-end 3 --profile-dir $tmp/trace"
strip_timing() { grep -E '^ (iteration|validation)' "$1" | sed -E 's/elapsed time per iteration \(ms\): [0-9.]+//; s/samples per second: [0-9.]+//; s/TFLOPs: [0-9.]+//'; }

# (1,4,1): 8 micro-batches through 4 stages, an evaluation and a save after iteration 3
$MPIRUN -np 4 ./train_cpu $model --pipeline-model-parallel-size 4 --eval-interval 3 --eval-iters 1 \
    --save "$tmp/ckpt" --save-interval 3 $profile > "$tmp/on" 2>&1
status=$?
trace=$tmp/trace/trace_iterations_2-3.json
if [ $status -eq 0 ] && [ -f "$trace" ] && grep -q "^profile: iterations 2 to 3 of 4 rank(s) written to $trace" "$tmp/on"; then
    ok "(1,4,1) --profile-step-start 1 --profile-step-end 3: rank 0 wrote $(basename "$trace") and said so"
else bad "(1,4,1) --profile" "exit status $status, $(ls "$tmp/trace" 2>&1 | head -2): $(grep -m2 -i error "$tmp/on")"; fi
python3 tests/trace_check.py "$trace" --name "(1,4,1)" --pp 4 --micro-batches 8 --profiled 0,1,2,3 \
    --expect "forward,backward,send,receive,send and receive,all-reduce,all-reduce (host values),gradient norm,AdamW,optimizer step,load micro-batch,evaluation,checkpoint save"

# the text drawing: each stage's order as 1F1B's (warm-up P - p - 1 forwards), the bubble beside the planner's
python3 scripts/trace_schedule.py "$trace" > "$tmp/schedule" 2>&1
want="stage 0 (rank 0)   F1 F2 F3 F4 B1 F5 B2 F6 B3 F7 B4 F8 B5 B6 B7 B8
stage 1 (rank 1)   F1 F2 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 F8 B6 B7 B8
stage 2 (rank 2)   F1 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 F8 B7 B8
stage 3 (rank 3)   F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 F8 B8"
orders=$(grep -A4 '^order of work:' "$tmp/schedule" | grep '^stage' | sort -u)
bubbles=$(grep -c "^bubble: stage 0 [0-9.]*%, stage 1 [0-9.]*%, stage 2 [0-9.]*%, stage 3 [0-9.]*%; the planner's (p - 1) / (m + p - 1) = 3 / 11 = 27.3%$" "$tmp/schedule")
drawn=$(grep -B4 '^order of work:' "$tmp/schedule" | grep -cE '^stage [0-3] \(rank [0-3]\) +[.]*F1 ')   # the lines drawn
if [ "$orders" = "$want" ] && [ "$bubbles" -eq 2 ] && [ "$drawn" -eq 8 ] && grep -q '^forward  ' "$tmp/schedule"; then
    ok "scripts/trace_schedule.py: each stage's line and order as 1F1B's, the measured bubble next to the planner's 27.3%, time per kind of work ($(grep '^bubble, mean' "$tmp/schedule"))"
else bad "scripts/trace_schedule.py" "$(head -c 600 "$tmp/schedule")"; fi

# the picture (Debian's matplotlib, /usr/bin/python3: the one python3-matplotlib installs into)
if /usr/bin/python3 -c "import matplotlib" 2> /dev/null; then
    /usr/bin/python3 scripts/trace_plot.py "$trace" "$tmp/step.png" --iteration 3 > "$tmp/plot" 2>&1
    if [ "$(head -c 8 "$tmp/step.png" 2> /dev/null | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]; then
        ok "scripts/trace_plot.py draws iteration 3 as a PNG ($(cat "$tmp/plot"))"
    else bad "scripts/trace_plot.py" "$(tail -3 "$tmp/plot")"; fi
elif [ "${REQUIRE_MATPLOTLIB:-0}" = 1 ]; then bad "scripts/trace_plot.py" "no matplotlib in /usr/bin/python3 (apt-get install python3-matplotlib)"
else echo "SKIP scripts/trace_plot.py: no matplotlib in /usr/bin/python3 (apt-get install python3-matplotlib)"; fi

# profiling changes nothing the run computes
$MPIRUN -np 4 ./train_cpu $model --pipeline-model-parallel-size 4 --eval-interval 3 --eval-iters 1 > "$tmp/off" 2>&1
if [ "$(strip_timing "$tmp/off" | wc -l)" -eq 6 ] && diff <(strip_timing "$tmp/off") <(strip_timing "$tmp/on") > /dev/null; then
    ok "(1,4,1) with --profile: bit-identical log lines (losses, grad norms, validation) to the run without, but the timing"
else bad "(1,4,1) with --profile against without" "$(diff <(strip_timing "$tmp/off") <(strip_timing "$tmp/on") | head -3)"; fi

# (2,2,2): tensor- and data-parallel collectives (the DP gradients reduced in buckets), 3 ranks of 8 profiled
$MPIRUN -np 8 ./train_cpu $model --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --eval-iters 0 \
    --overlap-grad-reduce --ddp-bucket-size 600 $profile --profile-ranks 0 3 5 --profile-step-end 2 > "$tmp/grid" 2>&1 ||
    bad "(2,2,2) --profile-ranks 0 3 5" "exit status $?: $(grep -m2 -i error "$tmp/grid")"
python3 tests/trace_check.py "$tmp/trace/trace_iterations_2-2.json" --name "(2,2,2) --profile-ranks 0 3 5" --pp 2 \
    --micro-batches 4 --profiled 0,3,5 --expect "all-reduce,reduce,all-gather,send and receive"

# the checks catch what they look for: three planted errors, each failing its check alone
python3 - "$trace" "$tmp" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
X = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
def planted(name, change):
    d = json.loads(json.dumps(doc))
    change(d, [e for e in d["traceEvents"] if e.get("ph") == "X"])
    json.dump(d, open("%s/%s.json" % (sys.argv[2], name), "w"))
def swap(d, x):   # stage 0's first two forwards of iteration 2 trade micro-batches
    f = [e for e in x if e["pid"] == 0 and e["name"] == "forward" and e["args"]["iteration"] == 2]
    f[0]["args"]["micro_batch"], f[1]["args"]["micro_batch"] = f[1]["args"]["micro_batch"], f[0]["args"]["micro_batch"]
def overlap(d, x):   # rank 1's first backward runs on into the span after it
    b = next(e for e in x if e["pid"] == 1 and e["name"] == "backward")
    after = min((e for e in x if e["pid"] == 1 and e["ts"] >= b["ts"] + b["dur"]), key=lambda e: e["ts"])
    b["dur"] = after["ts"] + after["dur"] / 2 - b["ts"] if after["dur"] > 0 else b["dur"] + 1.0
    after["dur"] = max(after["dur"], 1.0)
def unnamed(d, x):   # rank 2's host track loses its name
    d["traceEvents"] = [e for e in d["traceEvents"] if not (e.get("name") == "thread_name" and e["pid"] == 2)]
for name, change in (("swapped", swap), ("overlapping", overlap), ("unnamed", unnamed)):
    planted(name, change)
EOF
for planted in swapped:"follow 1F1B" overlapping:"never overlap" unnamed:"is named"; do
    file=${planted%%:*} check=${planted#*:}
    fails=$(python3 tests/trace_check.py "$tmp/$file.json" --pp 4 --micro-batches 8 | grep '^FAIL')
    if [ "$(echo "$fails" | grep -c .)" -eq 1 ] && echo "$fails" | grep -q "$check"; then
        ok "tests/trace_check.py catches a planted error ($file): $(echo "$fails" | cut -c1-160)"
    else bad "tests/trace_check.py on a planted error ($file)" "expected one FAIL of '$check', got: $fails"; fi
done

# refusals: one line naming the flag, exit status 2, before any training
refused() {  # NAME EXPECTED-TEXT NP FLAGS...
    local name=$1 text=$2 np=$3; shift 3
    if [ "$np" -eq 1 ]; then ./train_cpu $model "$@" > "$tmp/refused" 2>&1   # (a singleton: no launcher to wait for)
    else $MPIRUN -np "$np" ./train_cpu $model "$@" > "$tmp/refused" 2>&1; fi
    local status=$? lines
    lines=$(grep -c '^error: ' "$tmp/refused")
    if [ $status -eq 2 ] && [ "$lines" -eq 1 ] && grep -q "^error: .*$text" "$tmp/refused" && ! grep -q '^ iteration' "$tmp/refused"; then
        ok "refused, exit status 2: $(grep '^error: ' "$tmp/refused")"
    else bad "refusal: $name" "exit status $status, $lines error line(s): $(head -c 300 "$tmp/refused")"; fi
}
refused "end not after start" "--profile-step-end 3 must be greater than --profile-step-start 3" 1 \
    --profile --profile-step-start 3 --profile-step-end 3 --profile-dir "$tmp/r"
refused "beyond the run" "--profile-step-end 12 is beyond the run, which ends at iteration 4" 1 --profile --profile-dir "$tmp/r"
refused "before a resumed run" "--profile-step-start 1 is before the run, which resumes after iteration 4" 1 \
    --load "$tmp/ckpt" --train-iters 6 --profile --profile-step-start 1 --profile-step-end 5 --profile-dir "$tmp/r"
refused "a rank not in the world" "--profile-ranks 1: no such rank in a world of 1 (ranks 0 to 0)" 1 \
    --profile --profile-step-start 1 --profile-step-end 2 --profile-ranks 0 1 --profile-dir "$tmp/r"
refused "not a rank number" "--profile-ranks expects rank numbers, got 'one'" 1 \
    --profile --profile-step-start 1 --profile-step-end 2 --profile-ranks one --profile-dir "$tmp/r"
refused "an unwritable directory" "--profile-dir /proc: cannot create /proc/.gridgpt-probe-.*, so no trace could be saved there" 1 \
    --profile --profile-step-start 1 --profile-step-end 2 --profile-dir /proc
