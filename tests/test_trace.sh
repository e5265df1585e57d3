#!/usr/bin/env bash
# tests/test_trace.sh DATA_PREFIX — --profile (trace.h): the timeline it writes and what it costs.
# The tiny model of the parallel tests, 4 steps of 8 micro-batches:
#   - (1,4,1) profiling iterations 2-3 (an evaluation and a checkpoint save after iteration 3):
#     the merged file is Chrome trace-event JSON, every event well-formed, every rank and
#     track named, spans of one track nested or apart, one step span per profiled iteration,
#     every kind of span with its arguments, and each stage's forwards and backwards in
#     exactly 1F1B's order (tests/trace_check.py); scripts/trace_schedule.py draws the same
#     order and the bubble next to the planner's, and with --plan the time per kind of work next
#     to the cost model's; scripts/trace_plot.py draws a PNG (needs
#     matplotlib: SKIP without it, FAIL with REQUIRE_MATPLOTLIB=1, as CI sets);
#   - --dry-run --print-schedule draws that schedule (its lines, its bubble = the formula), and
#     the run's trace follows the drawing's order; the same for interleaved 1F1B (PP 4, v = 2:
#     stage 0's order the paper's Fig. 4); the README and docs/parallelism.md show the drawings;
#   - the same run without --profile: bit-identical log lines but the timing fields;
#   - (2,2,2) with --overlap-grad-reduce profiling ranks 0, 3 and 5 only: the tensor- and
#     data-parallel collectives with their groups and bytes, the other ranks silent;
#   - tests/trace_check.py itself catches planted errors (an order that is not 1F1B, spans
#     that overlap on one track, a track without a name);
#   - the refusals, one line and exit status 2 each: --profile-step-end not after the start,
#     beyond the run, before a resumed run, a rank not in the world, not a rank number, an
#     unwritable --profile-dir; --print-schedule without --dry-run, or with --sweep.
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
# tests/trace_check.py's PASS/FAIL lines (only those naming `only`, when given); a check that
# crashed or printed none of them is a FAIL too, not a silence
trace_check() {  # [--only TEXT] ARGS...
    local only="" out status
    [ "$1" = --only ] && { only=$2; shift 2; }
    out=$(python3 tests/trace_check.py "$@" 2>&1)
    status=$?
    out=$(grep -E '^(PASS|FAIL)' <<< "$out" | grep -F -- "$only")
    [ -n "$out" ] && echo "$out"
    if [ -z "$out" ] || { [ $status -ne 0 ] && ! grep -q '^FAIL' <<< "$out"; }; then
        bad "tests/trace_check.py $*" "exit status $status, $(grep -c . <<< "$out") check line(s)"
    fi
}

model="--data-path $data --vocab-size 257 --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16
       --micro-batch-size 1 --global-batch-size 8 --train-iters 4 --log-interval 1 --split 90,10,0 --seed 7"
profile="--profile --profile-step-start 1 --profile-step-end 3 --profile-dir $tmp/trace"
strip_timing() { grep -E '^ (\[[^]]*\] iteration|validation)' "$1" | sed -E 's/^ \[[^]]*\]//; s/elapsed time per iteration \(ms\): [0-9.]+//; s/tokens per second: [0-9]+//; s/ETA: [0-9:]+//'; }

# (1,4,1): 8 micro-batches through 4 stages, an evaluation and a save after iteration 3
$MPIRUN -np 4 ./train_cpu $model --pipeline-model-parallel-size 4 --eval-interval 3 --eval-iters 1 \
    --save "$tmp/ckpt" --save-interval 3 $profile > "$tmp/on" 2>&1
status=$?
trace=$tmp/trace/trace_iterations_2-3.json
if [ $status -eq 0 ] && [ -f "$trace" ] && grep -q "^profile: iterations 2 to 3 of 4 rank(s) written to $trace" "$tmp/on"; then
    ok "(1,4,1) --profile-step-start 1 --profile-step-end 3: rank 0 wrote $(basename "$trace") and said so"
else bad "(1,4,1) --profile" "exit status $status, $(ls "$tmp/trace" 2>&1 | head -2): $(grep -m2 -i error "$tmp/on")"; fi
trace_check "$trace" --name "(1,4,1)" --pp 4 --micro-batches 8 --profiled 0,1,2,3 \
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

# The measured time per kind of work next to the cost model's (scripts/trace_schedule.py --plan,
# on the plan of this layout and build): its planned column is the dry run's slowest stage's
# rows summed by kind (summed here independently), its measured forward-and-backward row is
# that stage's forward and backward self times from the per-kind table above it
./train_cpu --dry-run --dry-run-build cpu --world-size 4 $model --pipeline-model-parallel-size 4 > "$tmp/plan-cpu" 2>&1
python3 scripts/trace_schedule.py "$trace" --plan "$tmp/plan-cpu" > "$tmp/against" 2>&1
slowest=$(sed -nE "s/^stage ([0-9]+)'s step \(the slowest.*/\1/p" "$tmp/plan-cpu")
planned=$(awk '/step \(the slowest/ { on = 1; next } on && !/^  / { on = 0 }
    on { split($0, f, "|"); name = f[1]; sub(/^  /, "", name); sub(/ +[0-9]+ *$/, "", name); ms = f[4] + 0
         if (name ~ /^pipeline/) pipe += ms; else if (name ~ /^(AdamW|gradient norm|zero gradients)$/) opt += ms
         else if (name !~ /(tensor-parallel|sequence-parallel|ZeRO|tied embedding)/) kern += ms }
    END { printf "%.3f %.3f %.3f", kern, pipe, opt }' "$tmp/plan-cpu")
got=$(awk '/^forward and backward kernels/ { k = $(NF - 1) } /^pipeline exchanges/ { p = $(NF - 1) }
    /^optimizer kernels/ { o = $(NF - 1) } END { printf "%.3f %.3f %.3f", k, p, o }' "$tmp/against")
column=$((slowest + 2))
own=$(awk -v c=$column '/^time per kind of work/ { on = 1; next } on && /^(forward|backward) / { s += $c } END { printf "%.3f", s }' "$tmp/schedule")
measured=$(awk '/^forward and backward kernels/ { printf "%.3f", $(NF - 2) }' "$tmp/against")
if [ -n "$slowest" ] && [ "$got" = "$planned" ] && grep -q "^stage $slowest against the cost model" "$tmp/against" &&
   awk -v a="$own" -v b="$measured" 'BEGIN { exit !(a - b < 0.01 && b - a < 0.01) }'; then
    ok "scripts/trace_schedule.py --plan: stage $slowest's measured kinds next to the cost model's (planned kernels, pipeline, optimizer ms: $planned; measured kernels $measured ms = its forwards' and backwards' self time)"
else bad "scripts/trace_schedule.py --plan" "stage '$slowest', planned '$planned' vs '$got', measured '$measured' vs '$own': $(tail -8 "$tmp/against")"; fi

# The planner's drawing of the same schedule (--dry-run --print-schedule): each stage's line, its
# bubble (3 x 2 of 22 cells, (p - 1) / (m + p - 1) = 3 / 11), and the order the run's trace shows
./train_cpu --dry-run --world-size 4 $model --pipeline-model-parallel-size 4 --print-schedule > "$tmp/drawn" 2>&1
drawn_plain="stage 0: F1 F2 F3 F4 .  .  .  B1 F5 B2 F6 B3 F7 B4 F8 B5 .  B6 .  B7 .  B8
stage 1: .  F1 F2 F3 .  .  B1 F4 B2 F5 B3 F6 B4 F7 B5 F8 B6 .  B7 .  B8 .
stage 2: .  .  F1 F2 .  B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 F8 B7 .  B8 .  .
stage 3: .  .  .  F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 F8 B8 .  .  ."
if [ "$(grep -E '^stage [0-9]+: ' "$tmp/drawn")" = "$drawn_plain" ] &&
   grep -q '^bubble of each stage, drawn: 6 of 22 cells (27.3%), 6 of 22 cells (27.3%), 6 of 22 cells (27.3%), 6 of 22 cells (27.3%); (p - 1) / (m + p - 1) = 3 / 11 = 27.3%$' "$tmp/drawn"; then
    ok "--dry-run --print-schedule at PP 4, 8 micro-batches: 1F1B drawn, each stage's bubble 6 of 22 cells = (p - 1) / (m + p - 1)"
else bad "--print-schedule, plain 1F1B" "$(grep -A5 '^the schedule' "$tmp/drawn")"; fi
trace_check --only follow "$trace" --name "(1,4,1) against --print-schedule" --schedule "$tmp/drawn"

# ... and for every P, v and M drawn here (P 2-8, v 1-3, M = P, 2P, 3P; plain also M < P and M
# not a multiple of P): each stage idle 2 (P - 1) cells of 2 v M + 2 (P - 1), i.e. the drawn
# bubble is the formula's (p - 1) / (v m + p - 1) on every stage
wrong=""
for P in 2 3 4 8; do for v in 1 2 3; do for M in $P $((2 * P)) $((3 * P)) $([ $v -eq 1 ] && echo 1 $((P + 1))); do
    drawn=$(./train_cpu --dry-run --world-size $P --vocab-size 257 --num-layers $((2 * P * v)) --hidden-size 32 \
        --num-attention-heads 4 --seq-length 16 --micro-batch-size 1 --global-batch-size $M --pipeline-model-parallel-size $P \
        $([ $v -gt 1 ] && echo --num-virtual-stages-per-pipeline-rank $v) --print-schedule 2>&1 | grep '^bubble of each')
    [ "$(grep -o "$((2 * (P - 1))) of $((2 * v * M + 2 * (P - 1))) cells" <<< "$drawn" | wc -l)" -eq $P ] || wrong+=" P=$P,v=$v,M=$M"
done; done; done
if [ -z "$wrong" ]; then ok "--print-schedule for P 2-8, v 1-3 and M from 1 to 3P: every stage's drawn bubble is 2 (P - 1) cells, (p - 1) / (v m + p - 1)"
else bad "--print-schedule's bubble" "not 2 (P - 1) of 2 v M + 2 (P - 1) cells at$wrong"; fi

# Interleaved 1F1B, PP 4, v = 2 (8 layers, one a chunk), 8 micro-batches: the trace's order is
# the drawing's, stage 0's as Narayanan et al. 2021 draw it (Fig. 4, bottom), bubble 3 / 19
interleaved="${model/--num-layers 4/--num-layers 8} --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 1"
$MPIRUN -np 4 ./train_cpu $interleaved --train-iters 2 --eval-iters 0 --profile --profile-step-start 1 --profile-step-end 2 \
    --profile-dir "$tmp/vpp" > "$tmp/vpp.log" 2>&1 || bad "(1,4,1) interleaved --profile" "$(grep -m2 -i error "$tmp/vpp.log")"
./train_cpu --dry-run --world-size 4 $interleaved --print-schedule > "$tmp/drawn-vpp" 2>&1
fig4="F1a F2a F3a F4a F1b F2b F3b F4b F5a F6a F7a B1b F8a B2b F5b B3b F6b B4b F7b B1a F8b B2a B3a B4a B5b B6b B7b B8b B5a B6a B7a B8a"
if [ "$(grep '^stage 0: ' "$tmp/drawn-vpp" | tr -s ' ' | sed 's/ \.//g; s/^stage 0: //')" = "$fig4" ] &&
   grep -q '^bubble of each stage, drawn: 6 of 38 cells (15.8%), 6 of 38 cells (15.8%), 6 of 38 cells (15.8%), 6 of 38 cells (15.8%); (p - 1) / (v m + p - 1) = 3 / 19 = 15.8%$' "$tmp/drawn-vpp"; then
    ok "--print-schedule, interleaved (v = 2): stage 0's order is the paper's Fig. 4, each stage's bubble 6 of 38 cells = (p - 1) / (v m + p - 1)"
else bad "--print-schedule, interleaved" "$(grep -A5 '^the schedule' "$tmp/drawn-vpp")"; fi
trace_check "$tmp/vpp/trace_iterations_2-2.json" --name "(1,4,1) interleaved, v = 2" --schedule "$tmp/drawn-vpp" \
    --expect "forward,backward,send and receive"
python3 scripts/trace_schedule.py "$tmp/vpp/trace_iterations_2-2.json" > "$tmp/schedule-vpp" 2>&1
if grep -q "^bubble: stage 0 [0-9.]*%, stage 1 [0-9.]*%, stage 2 [0-9.]*%, stage 3 [0-9.]*%; the planner's (p - 1) / (v m + p - 1) = 3 / 19 = 15.8%$" "$tmp/schedule-vpp" &&
   grep -q "^stage 0 (rank 0)   $fig4$" "$tmp/schedule-vpp"; then
    ok "scripts/trace_schedule.py on the interleaved trace: stage 0's order as Fig. 4, its measured bubble next to the planner's 15.8% ($(grep '^bubble: ' "$tmp/schedule-vpp" | cut -d';' -f1))"
else bad "scripts/trace_schedule.py, interleaved" "$(head -c 600 "$tmp/schedule-vpp")"; fi

# the drawings in the README and docs/parallelism.md are the trainer's, line for line
for doc in README.md docs/parallelism.md; do
    missing=$(cat "$tmp/drawn" "$tmp/drawn-vpp" | grep -E '^stage [0-9]+: ' | while IFS= read -r line; do grep -qxF "$line" $doc || echo "$line"; done)
    if [ -z "$missing" ]; then ok "$doc shows --print-schedule's drawings of PP 4, 8 micro-batches, plain and v = 2, line for line"
    else bad "$doc's schedule drawings" "not there: $(echo "$missing" | head -1)"; fi
done

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
trace_check "$tmp/trace/trace_iterations_2-2.json" --name "(2,2,2) --profile-ranks 0 3 5" --pp 2 \
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
    if [ $status -eq 2 ] && [ "$lines" -eq 1 ] && grep -q "^error: .*$text" "$tmp/refused" && ! grep -q '^ \[[^]]*\] iteration' "$tmp/refused"; then
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
refused "--print-schedule without --dry-run" "--print-schedule goes with --dry-run, not --sweep (it draws the one layout planned)" 1 \
    --print-schedule
refused "--print-schedule with --sweep" "--print-schedule goes with --dry-run, not --sweep" 1 --dry-run --sweep --print-schedule
