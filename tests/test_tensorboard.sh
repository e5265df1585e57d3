#!/usr/bin/env bash
# tests/test_tensorboard.sh DATA_PREFIX — --tensorboard-dir (issue 12, item 4).
#   Everywhere: the writer alone (tests/test_tensorboard.c --check: CRC-32C's check value, a
#   round trip, a failing write); then runs of ./train_cpu whose event file our own reader
#   (test_tensorboard --dump: both masked CRC-32Cs of every record, the Event decoded) reads
#   back: every scalar at every logged step must equal the value the log printed, to the
#   printed precision, and nothing else may be in the file. A flipped byte and a cut file are
#   caught; a bad directory is refused (exit 2); a write that fails mid-run is one line and the
#   run goes on.
#   Where Python has the `tensorboard` package: the same comparison on what TensorBoard's own
#   EventAccumulator reads (tests/tensorboard_scalars.py); else one SKIP line (a FAIL with
#   REQUIRE_TENSORBOARD=1, as CI sets).
set -u
data=${1:?usage: test_tensorboard.sh DATA_PREFIX}
cd "$(dirname "$0")/.."
B=tests/build/tensorboard
T=tests/build/test_tensorboard   # built by tests/run.sh
rm -rf $B && mkdir -p $B
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none"
ok() { echo "PASS $1"; }
bad() { echo "FAIL $1: $2"; }

# ---- the writer and the reader by themselves
mkdir -p $B/unit
$T --check $B/unit > $B/unit.log 2> $B/unit.err
status=$?
grep -E '^(PASS|FAIL|SKIP)' $B/unit.log
[ $status -eq 0 ] || grep -q '^FAIL' $B/unit.log || bad "test_tensorboard --check" "exit status $status: $(tail -3 $B/unit.err)"
if [ "$(wc -l < $B/unit.err)" -eq 1 ] && grep -qF "cannot write /dev/full: No space left on device" $B/unit.err; then
    ok "the failed write to /dev/full is said in one line, once"
else bad "the failed write to /dev/full is said in one line, once" "$(head -c 400 $B/unit.err)"; fi

# ---- what the log says, as "TAG<TAB>STEP<TAB>VALUE<TAB>TOLERANCE[<TAB>peak]" lines: each value
# of the log line and the validation block at its iteration and, as "TAG vs samples", at the
# consumed samples; the tolerance is half a unit of the last printed digit. The peak memory is
# printed once, in the summary: each logged value must be at most it, the last one equal.
expected_from_log() {  # LOG FP16(0/1)
    awk -v fp16="$2" '
    function half_unit(s,   parts, d) {
        if (s ~ /E/) { split(s, parts, "E"); d = length(parts[1]) - index(parts[1], "."); return 0.5 * 10 ^ (parts[2] - d) }
        return index(s, ".") ? 0.5 * 10 ^ -(length(s) - index(s, ".")) : 0.5
    }
    function value_of(name,   s) {   # the value after "NAME:" on this line
        if (!match($0, name ": *[^ |]+")) { print "no " name " in: " $0 > "/dev/stderr"; exit 1 }
        s = substr($0, RSTART, RLENGTH); sub(/^.*: */, "", s); return s
    }
    function emit(tag, s, scale) {
        printf "%s\t%d\t%.9g\t%.9g\n", tag, it, s * scale, half_unit(s) * scale
        printf "%s vs samples\t%d\t%.9g\t%.9g\n", tag, samples[it], s * scale, half_unit(s) * scale
    }
    /^ \[[^]]*\] iteration / {
        match($0, /iteration +[0-9]+/); it = substr($0, RSTART + 10, RLENGTH - 10) + 0
        samples[it] = value_of("consumed samples"); logged[++n] = it
        emit("lm loss", value_of("lm loss"), 1)
        emit("learning-rate", value_of("learning rate"), 1)
        emit("batch-size", value_of("global batch size"), 1)
        if (fp16) emit("loss-scale", value_of("loss scale"), 1)
        emit("grad-norm", value_of("grad norm"), 1)
        emit("iteration-time", value_of("elapsed time per iteration \\(ms\\)"), 0.001)   # Megatron writes seconds
        if (index($0, "throughput per GPU")) emit("throughput", value_of("throughput per GPU \\(TFLOP/s/GPU\\)"), 1)   # --log-throughput
        emit("tokens-per-second", value_of("tokens per second"), 1)
    }
    / validation loss at / {
        it = match($0, /at iteration [0-9]+/) ? substr($0, RSTART + 13, RLENGTH - 13) + 0 : logged[n]   # else: the end
        emit("lm loss validation", value_of("lm loss value"), 1)
        emit("lm loss validation ppl", value_of("lm loss PPL"), 1)
    }
    /^summary:/ { match($0, /peak memory [0-9.]+ GiB/); peak = substr($0, RSTART + 12, RLENGTH - 16) }
    END {
        for (i = 1; i <= n; i++) {
            it = logged[i]
            printf "mem-max-rss-bytes\t%d\t%.9g\t%.9g\tpeak\n", it, peak * 2^30, half_unit(peak) * 2^30
            printf "mem-max-rss-bytes vs samples\t%d\t%.9g\t%.9g\tpeak\n", samples[it], peak * 2^30, half_unit(peak) * 2^30
        }
    }' "$1"
}

# EXPECTED DUMP: "ok N" when every expected scalar is in the dump, within its tolerance (and
# float32's rounding, 2^-24 relative), as many times, and nothing else is; else the problems
compare_scalars() {
    awk -F '\t' '
    # a tag at one step may come more than once (the evaluation of the last iteration, then the
    # one at the end, as Megatron-LM HEAD): the Nth in the file is the Nth in the log
    FNR == NR { key = $1 FS $2 FS (++wanted[$1 FS $2]); want[key] = $3; tol[key] = $4; peak[key] = $5 == "peak"; next }
    {
        key = $1 FS $2 FS (++found[$1 FS $2])
        seen[key] = 1
        if (!(key in want)) { if (problems++ < 5) print "not in the log: " $1 " at step " $2 " = " $3; next }
        d = $3 - want[key]; d = d < 0 ? -d : d; a = want[key] < 0 ? -want[key] : want[key]
        if (peak[key]) {   # the peak so far: never above the summary, never falling, the last one equal
            if ($3 > want[key] + tol[key] || $3 < previous[$1]) if (problems++ < 5) print "peak memory " $3 " at step " $2 " (summary: " want[key] ")"
            previous[$1] = $3; last[$1] = $3 " " want[key] " " tol[key]
        } else if (!(d <= tol[key] + a * 2^-24)) {
            if (problems++ < 5) print $1 " at step " $2 ": " $3 " in the file, " want[key] " +- " tol[key] " in the log"
        }
        n++
    }
    END {
        for (key in want) if (!(key in seen)) { split(key, k, FS); if (problems++ < 5) print "missing: " k[1] " at step " k[2] }
        for (tag in last) { split(last[tag], v, " "); if (v[1] < v[2] - v[3]) if (problems++ < 5) print tag " ends at " v[1] ", the summary says " v[2] }
        if (problems == 0) print "ok " n
    }' "$1" "$2"
}

have_tensorboard=no
for PY in python3 /usr/bin/python3; do
    $PY -c "import tensorboard.backend.event_processing.event_accumulator" > /dev/null 2>&1 && { have_tensorboard=yes; break; }
done
if [ $have_tensorboard = no ] && [ "${REQUIRE_TENSORBOARD:-0}" = 1 ]; then
    bad "the tensorboard package is required here (REQUIRE_TENSORBOARD=1, as in CI)" "no python3 with tensorboard"
elif [ $have_tensorboard = no ]; then
    echo "SKIP reading the event files with TensorBoard: python package tensorboard not installed (pip install tensorboard)"
fi

# check_run LABEL DIR LOG FP16: the run's one event file, read by our reader and by TensorBoard
check_run() {
    local label=$1 dir=$2 log=$3 fp16=$4 files result
    files=$(ls $dir | grep -c tfevents)
    if [ "$files" -eq 1 ]; then ok "$label: one event file (one rank writes)"
    else bad "$label: one event file (one rank writes)" "$files in $dir: $(ls $dir)"; return; fi
    expected_from_log $log $fp16 > $B/$label.expected
    if ! $T --dump $dir/events.out.tfevents.* > $B/$label.dump 2> $B/$label.dump.err; then
        bad "$label: our reader reads the event file" "$(cat $B/$label.dump.err)"; return
    fi
    result=$(compare_scalars $B/$label.expected $B/$label.dump)
    if [ "${result%% *}" = ok ]; then
        ok "$label: our reader: every record's CRCs check; each of the ${result#ok } scalars (tag and step) is one the log printed, with its value"
    else bad "$label: our reader: the file's scalars are the log's" "$result"; fi
    [ $have_tensorboard = yes ] || return
    if ! $PY tests/tensorboard_scalars.py $dir > $B/$label.tb 2> $B/$label.tb.err; then
        bad "$label: TensorBoard reads the event file" "$(tail -3 $B/$label.tb.err)"; return
    fi
    result=$(compare_scalars $B/$label.expected $B/$label.tb)
    if [ "${result%% *}" = ok ]; then ok "$label: TensorBoard's EventAccumulator reads the same ${result#ok } scalars, values as logged"
    else bad "$label: TensorBoard's EventAccumulator reads the log's scalars" "$result"; fi
}

small="--data-path $data --vocab-size 257 --num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16
       --micro-batch-size 2 --global-batch-size 4 --train-iters 12 --log-interval 2 --eval-interval 4 --eval-iters 1
       --split 90,10,0 --lr 1e-3 --lr-warmup-iters 2"

# two pipeline stages (the loss lives on the last, rank 0 writes) with the dynamic loss scaler
# (the scale doubles every 2 clean steps: loss-scale changes)
$MPIRUN -np 2 ./train_cpu $small --pipeline-model-parallel-size 2 --fp16 --initial-loss-scale 65536 \
    --loss-scale-window 2 --log-throughput --tensorboard-dir $B/pp2 > $B/pp2.log 2>&1
status=$?
if [ $status -eq 0 ]; then check_run pp2-fp16 $B/pp2 $B/pp2.log 1
else bad "pp2-fp16 run" "exit status $status: $(grep -m1 error $B/pp2.log)"; fi
scales=$(grep -o 'loss scale: [0-9.]*' $B/pp2.log | sort -u | wc -l)
if [ "$scales" -ge 3 ]; then ok "pp2-fp16: the logged loss scale changes ($scales values), so the file's loss-scale is checked on more than one value"
else bad "pp2-fp16: the logged loss scale changes" "$scales distinct value(s)"; fi

# one process, no loss scaler: no loss-scale tag (check_run refuses any scalar the log did not
# print); the directory and its missing parents are created
./train_cpu $small --tensorboard-dir $B/plain/runs/a > $B/plain.log 2>&1
status=$?
if [ $status -eq 0 ]; then check_run plain $B/plain/runs/a $B/plain.log 0
else bad "plain run" "exit status $status: $(grep -m1 error $B/plain.log)"; fi

# ---- damage is caught by our reader: a flipped byte in a record's data, in a record's
# length, and a file cut short (the bytes of record 1: its length at 12 + n0 + 4, data 12 later)
file=$(ls $B/plain/runs/a/events.out.tfevents.*)
n0=$(od -An -t u8 -N8 "$file" | tr -d ' ')
record1=$((12 + n0 + 4))
flip() {  # FILE OFFSET: the byte at OFFSET xor 0x20
    local byte
    byte=$(od -An -t u1 -j $2 -N1 "$1" | tr -d ' ')
    printf "\\$(printf '%03o' $((byte ^ 32)))" | dd of="$1" bs=1 seek=$2 conv=notrunc status=none
}
expect_damage() {  # NAME FILE NEEDLE
    if $T --dump "$2" > /dev/null 2> $B/damage.err; then bad "$1" "read without complaint"
    elif grep -qF -- "$3" $B/damage.err; then ok "$1"
    else bad "$1" "$(cat $B/damage.err)"; fi
}
cp "$file" $B/data_flipped && flip $B/data_flipped $((record1 + 12 + 5))
expect_damage "a flipped byte in a record's data is caught by its data CRC" $B/data_flipped "record 1 (at byte $record1): data CRC mismatch"
cp "$file" $B/length_flipped && flip $B/length_flipped $((record1 + 1))
expect_damage "a flipped byte in a record's length is caught by its length CRC" $B/length_flipped "record 1 (at byte $record1): length CRC mismatch"
head -c $(($(stat -c %s "$file") - 3)) "$file" > $B/cut
expect_damage "a file cut short is caught" $B/cut "truncated"
cp "$file" $B/intact
if $T --dump $B/intact > /dev/null 2>&1; then ok "the undamaged copy reads (the damage checks are not vacuous)"
else bad "the undamaged copy reads" "$(cat $B/damage.err)"; fi

# ---- a directory that cannot be one is bad input: exit 2, one line naming the flag
expect_refusal() {  # NAME NEEDLE ARGS...
    local name=$1 needle=$2 status lines; shift 2
    ./train_cpu $small "$@" > $B/refused.out 2> $B/refused.err
    status=$?; lines=$(wc -l < $B/refused.err)
    if [ $status -eq 2 ] && [ "$lines" -eq 1 ] && grep -qF -- "$needle" $B/refused.err; then ok "$name"
    else bad "$name" "status $status, $lines stderr line(s): $(head -c 300 $B/refused.err)"; fi
}
touch $B/a_file
expect_refusal "--tensorboard-dir that is a file is refused" "--tensorboard-dir $B/a_file: not a directory" --tensorboard-dir $B/a_file
expect_refusal "--tensorboard-dir '' is refused" "--tensorboard-dir expects a directory, got ''" --tensorboard-dir ""

# ---- a write that fails mid-run (a really full disk: a tmpfs of one page, 4 KiB, which the
# events of the first intervals fill) is one line, and training goes on to the end (skipped
# where mounting is not allowed; test_tensorboard --check's /dev/full case runs everywhere)
mkdir -p $B/tmpfs
if mount -t tmpfs -o size=4k tmpfs $B/tmpfs 2> /dev/null; then
    ./train_cpu $small --tensorboard-dir $B/tmpfs/tb > $B/full.log 2> $B/full.err
    status=$?
    cp -r $B/tmpfs/tb $B/full && umount $B/tmpfs
    lines=$(grep -c '^ \[[^]]*\] iteration' $B/full.log)
    if [ $status -eq 0 ] && [ "$lines" -eq 7 ] && [ "$(wc -l < $B/full.err)" -eq 1 ] &&
       grep -qF -- "--tensorboard-dir: cannot write $B/tmpfs/tb/events.out.tfevents." $B/full.err &&
       grep -qF "No space left on device; no more TensorBoard events from this run (training goes on)" $B/full.err; then
        ok "a full disk under the event file: one line naming the file; the run trains to the end and exits 0"
    else bad "a full disk under the event file" "status $status, $lines log lines, stderr: $(head -c 400 $B/full.err)"; fi
    if $T --dump $B/full/events.out.tfevents.* > /dev/null 2> $B/full.dump.err || grep -q "truncated" $B/full.dump.err; then
        ok "the events written before the disk filled read back (at most the last record cut)"
    else bad "the events written before the disk filled read back" "$(cat $B/full.dump.err)"; fi
else echo "SKIP a full disk under the event file: cannot mount a tmpfs here (needs root and a mount namespace)"; fi
