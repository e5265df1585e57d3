#!/usr/bin/env bash
# tests/gpu_check.sh — what one GPU can tell this project, in one command and about 8 minutes
# on one H100 (issue 39). Written to be run once, by someone who rented the GPU for 15
# minutes: every step has a time limit, a step that fails says so and the check goes on, and
# everything lands in one folder.
#
#   1. builds train_gpu for this GPU (and train_cpu, preprocess), and beside it the kernel
#      checks (tests/test_emu_kernels.cpp compiled by nvcc, bf16 and fp16);
#   2. runs the kernel checks on the GPU (the fused attention forward and backward, the
#      cross-entropy, LayerNorm, the column sums... against the C reference);
#   3. times GPT-2 124M (vocabulary 50,257) with the fused attention (--attention-backend
#      flash) and the unfused one, at 16 x 1024 and at 64 x 1024 (llm.c's setting; each run
#      first planned by the planner, and not run if the plan says it does not fit), and the
#      shape the one H200 run measured (byte vocabulary, 4 micro-batches of 4 x 1024): each
#      step next to the planner's estimate (`./train_cpu --dry-run ... --hw`, the same flags);
#      --profile's trace of a few steps read by scripts/trace_schedule.py: forward and
#      backward on the compute stream, against the planner's table;
#   4. where nsys is installed, the per-kernel times of the 124M runs (nsys's
#      cuda_gpu_kern_sum), and tests/refit_planner.py: the --hw-* numbers that make the
#      planner match them, and the step it then plans for every run;
#   5. in whatever time is left, tests/test_emu_train.sh's comparison of train_gpu against
#      train_cpu (what `make test-gpu` runs after the kernel checks).
#
#   bash tests/gpu_check.sh                      on the GPU machine, from the repository
#   GPU_CHECK_DRY=1 bash tests/gpu_check.sh      no GPU needed: print every command it would
#       run (lines "command: ..."), and run only the planner, whose lines it prints as on a GPU
#       (tests/test_gpu_check.sh feeds the commands to ./train_cpu --dry-run: every flag parses)
#   GPU_CHECK_BUDGET=480    seconds for the whole check (default 8 minutes); each step gets at
#                           most its own limit and what is left
#   GPU_CHECK_OUT=DIR       the results' folder (default tests/build/gpu_check; emptied first)
#
# Its results go into docs/measured.md, with the card named (the summary's first line).
set -u
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/cuda/bin OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
DRY=${GPU_CHECK_DRY:-0}
BUDGET=${GPU_CHECK_BUDGET:-480}
B=tests/build
O=${GPU_CHECK_OUT:-$B/gpu_check}
DATA=$B/corpus_text_document
SECONDS=0
if [ "$DRY" = 1 ]; then O=${GPU_CHECK_OUT:-$B/gpu_check_dry}; fi
case "$O" in ""|/|.|..|"$HOME") echo "GPU_CHECK_OUT=$O: not a folder to empty" >&2; exit 2 ;; esac
rm -rf "$O"
mkdir -p "$O"

# ----------------------------------------------------------------------------
# helpers: the summary, the time left, and running a step under both

# a line of the summary: on stdout now, and into $O/summary.txt
say() { echo "$*" | tee -a "$O/summary.txt"; }

# seconds left of the budget
left() { echo $((BUDGET - SECONDS)); }

# step NAME LIMIT COMMAND...: COMMAND under a timeout of LIMIT seconds or what is left of the
# budget, whichever is less, its output into $O/NAME.log; returns its status (124: out of time,
# 125: not run, no time left). With GPU_CHECK_DRY=1 it prints the command and runs nothing.
step() {
    local name=$1 limit=$2
    shift 2
    echo "command: $*" >> "$O/commands.txt"
    if [ "$DRY" = 1 ]; then
        echo "command: $*"
        return 0
    fi
    local t=$(left)
    [ "$t" -lt "$limit" ] && limit=$t
    if [ "$limit" -lt 10 ]; then
        echo "(not run, out of time: $*)" > "$O/$name.log"
        return 125
    fi
    timeout "$limit" "$@" > "$O/$name.log" 2>&1
}

# FAILED, or NOT RUN where there was no time left (status 125)
failed() { [ "$1" = 125 ] && echo "NOT RUN" || echo FAILED; }

# why a step failed, in a few words: its status and its log's first error-looking line
why() {  # NAME STATUS
    case $2 in
        124) echo "out of time" ;;
        125) echo "not run: out of time" ;;
        *) echo "status $2: $(grep -m1 -iE 'error|fail|abort|what\(\)|out of memory' "$O/$1.log" 2>/dev/null | cut -c1-160)" ;;
    esac
}

# ----------------------------------------------------------------------------
# the GPU, and the --hw flags the planner describes it with (hardware.h's presets; an H200 is an
# H100 with its own memory: 141 GB = 131 GiB at 4.8 TB/s, NVIDIA's datasheet)

if [ "$DRY" = 1 ]; then
    gpu=${GPU_CHECK_GPU_NAME:-"NVIDIA H100 80GB HBM3 (GPU_CHECK_DRY: assumed)"}
    arch=90
else
    gpu=$(nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader 2>&1 | head -1)
    cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
    [[ "$cap" =~ ^[0-9]+$ ]] || cap=90   # an older driver has no compute_cap: an H100's
    arch=$cap
fi
case "$gpu" in
    *H200*) hw="--hw h100-80gb --hw-memory-bandwidth 4800 --hw-memory-gib 131" ;;
    *H100*) hw="--hw h100-80gb" ;;
    *A100*80GB*) hw="--hw a100-80gb" ;;
    *A100*) hw="--hw a100-40gb" ;;
    *V100*) hw="--hw v100-32gb" ;;
    *) hw="--hw h100-80gb" ;;
esac
echo "$gpu" > "$O/gpu.txt"
echo "$hw" > "$O/hw.txt"
say "gridgpt GPU check: $gpu; sm_$arch; planned as $hw; results in $O"
[ "$DRY" = 1 ] || nvidia-smi > "$O/nvidia-smi.txt" 2>&1

# ----------------------------------------------------------------------------
# 1. build: train_gpu for this GPU only (one architecture compiles faster), train_cpu (the
# planner) and preprocess; the kernel checks' two programs compiled at the same time

step build 300 make -j8 train_gpu train_cpu preprocess GPU_ARCH="$arch" &
build_job=$!
for p in bf16 fp16; do
    define=""
    [ $p = fp16 ] && define=-DGRIDGPT_FP16
    step kernels_build_$p 300 nvcc -x cu -std=c++17 -O2 -gencode arch=compute_$arch,code=sm_$arch -Xcompiler -fopenmp \
        $define -I. -Itests tests/test_emu_kernels.cpp -o $B/gpu_check_kernels_$p -lcublas -lcublasLt &
done
step dweight_build 300 nvcc -x cu -std=c++17 -O2 -gencode arch=compute_$arch,code=sm_$arch -Xcompiler -fopenmp \
    -I. -Itests tests/gpu_dweight.cu -o $B/gpu_dweight -lcublas -lcublasLt &
wait $build_job
status=$?
wait
if [ $status -ne 0 ]; then
    say "build: $(failed $status) ($(why build $status)); the last lines of $O/build.log:"
    tail -15 "$O/build.log" | tee -a "$O/summary.txt"
    [ -x ./train_gpu ] || { say "no train_gpu: nothing more to run"; exit 1; }
    say "(./train_gpu is there and runs below: if the log says it did not build, it is an older one)"
elif [ "$DRY" != 1 ]; then
    say "build: train_gpu, train_cpu, preprocess for sm_$arch in ${SECONDS}s"
fi
# the planner: train_cpu, or train_gpu itself (its --dry-run plans the same GPU build)
planner=./train_cpu
[ -x ./train_cpu ] || planner=./train_gpu

# the corpus every run reads: text Debian ships, made into a byte-level dataset (as tests/run.sh)
if [ "$DRY" != 1 ] && [ ! -f $DATA.idx ]; then
    scripts/make_corpus.sh $B/corpus.jsonl > /dev/null 2>&1
    ./preprocess --input $B/corpus.jsonl --json-keys text --append-eod --output-prefix $B/corpus > "$O/corpus.log" 2>&1 ||
        say "corpus: preprocess failed ($(tail -1 "$O/corpus.log")): the training runs below will fail"
fi

# ----------------------------------------------------------------------------
# 2. the kernel checks on the GPU (each PASS / FAIL line of tests/test_emu_kernels.cpp)

for p in bf16 fp16; do
    if [ "$DRY" != 1 ] && [ ! -x $B/gpu_check_kernels_$p ]; then
        say "kernel checks $p: did not build ($(grep -m1 -i error "$O/kernels_build_$p.log" | cut -c1-160))"
        continue
    fi
    step kernels_$p 120 $B/gpu_check_kernels_$p
    status=$?
    [ "$DRY" = 1 ] && continue
    say "kernel checks $p: $(grep -c '^PASS' "$O/kernels_$p.log") PASS, $(grep -c '^FAIL' "$O/kernels_$p.log") FAIL$(
        [ $status -ne 0 ] && echo " ($(why kernels_$p $status))")"
    grep '^FAIL' "$O/kernels_$p.log" | head -5 | tee -a "$O/summary.txt"
done

# the weight-gradient GEMMs with the bias gradient in cuBLASLt's BGRADB epilogue and by a kernel
# after them (tests/gpu_dweight.cu; issue 52 item 4): the times, the algorithms chosen, and which
# --bias-grad is faster, in the summary
if [ "$DRY" = 1 ] || [ -x $B/gpu_dweight ]; then
    step dweight 60 $B/gpu_dweight
    status=$?
    [ "$DRY" = 1 ] || say "weight gradients (tests/gpu_dweight.cu): $(tail -1 "$O/dweight.log")$(
        [ $status -ne 0 ] && echo " ($(why dweight $status))")"
else
    say "weight gradients: tests/gpu_dweight.cu did not build ($(grep -m1 -i error "$O/dweight_build.log" | cut -c1-160))"
fi

# ----------------------------------------------------------------------------
# 3. the timed runs: each planned first, then run for ITERS steps with --profile recording
# three steps in the middle; the step time is the last log line's (an average over its
# --log-interval, after the profiled steps)

gpt2="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024"
run_flags="--eval-iters 0 --log-interval 5 --log-throughput"

# plan NAME FLAGS...: the planner's dry run of a run's model and batch flags on this GPU, into
# $O/plan_NAME.txt (its command into $O/commands.txt, and on stdout with GPU_CHECK_DRY=1);
# its step in ms into $O/plan_NAME.ms ("?" if none), with " OOM" after it if it does not fit
plan() {
    local name=$1
    shift
    echo "command: $planner --dry-run --world-size 1 $* $hw" >> "$O/commands.txt"
    [ "$DRY" = 1 ] && echo "command: $planner --dry-run --world-size 1 $* $hw"
    if ! $planner --dry-run --world-size 1 "$@" $hw > "$O/plan_$name.txt" 2>&1; then
        echo "?" > "$O/plan_$name.ms"
        return
    fi
    # "step = ... = N x SLOT s + OPTIMIZER s": the step to more digits than the last line's
    sed -nE 's/^step = .* = ([0-9.]+) x ([0-9.e+-]+) s \+ ([0-9.e+-]+) s$/\1 \2 \3/p' "$O/plan_$name.txt" |
        awk '{ printf "%.2f", 1e3 * ($1 * $2 + $3) }' > "$O/plan_$name.ms"
    tail -1 "$O/plan_$name.txt" | grep -q ' OOM$' && echo " OOM" >> "$O/plan_$name.ms"
}

# measured NAME: "MS TFLOPS" from the run's last log line, or nothing
measured() {
    grep '^ \[[^]]*\] iteration' "$O/run_$1.log" 2>/dev/null | tail -1 |
        sed -nE 's|.*elapsed time per iteration \(ms\): ([0-9.]+) .*throughput per GPU \(TFLOP/s/GPU\): ([0-9.]+) .*|\1 \2|p'
}

# micro_batches FLAGS...: the global batch over the micro-batch (one GPU)
micro_batches() {
    local gbs=1 mbs=1
    while [ $# -gt 1 ]; do
        [ "$1" = --global-batch-size ] && gbs=$2
        [ "$1" = --micro-batch-size ] && mbs=$2
        shift
    done
    echo $((gbs / mbs))
}

# timed NAME ITERS LABEL FLAGS...: plan it, run it (unless the plan says OOM), and print the
# measured step beside the planned one; its flags into $O/run_NAME.flags for the refit
timed() {
    local name=$1 iters=$2 label=$3
    shift 3
    plan $name "$@"
    local planned=$(cat "$O/plan_$name.ms")
    local peak=$(tail -1 "$O/plan_$name.txt" | sed -nE 's/.*(peak memory per GPU [0-9.]+ GiB).*/\1/p')
    echo "$*" > "$O/run_$name.flags"
    case "$planned" in
        *OOM*) say "$label: not run, the planner says it does not fit ($(tail -1 "$O/plan_$name.txt"))"; return ;;
    esac
    local s=$((iters * 2 / 5)) e=$((iters * 2 / 5 + 3))   # the profiled steps, before the last log line's
    step run_$name 150 ./train_gpu --data-path $DATA "$@" $run_flags --train-iters $iters \
        --profile --profile-step-start $s --profile-step-end $e --profile-dir "$O/profile_$name"
    local status=$?
    if [ "$DRY" = 1 ]; then
        say "$label: planned $planned ms a step, $peak"
        return
    fi
    local ms tf
    read ms tf <<< "$(measured $name)"
    if [ $status -ne 0 ] || [ -z "$ms" ]; then
        say "$label: $(failed $status) ($(why run_$name $status)); planned $planned ms"
        return
    fi
    say "$label: measured $ms ms a step, $tf TFLOPs; planned $planned ms, $peak ($(awk -v m="$ms" -v p="$planned" \
        'BEGIN { if (p + 0 > 0) printf "measured / planned %.2f", m / p; else printf "no plan" }'))"
    local trace
    trace=$(ls "$O/profile_$name"/*.json 2>/dev/null | head -1)
    if [ -n "$trace" ] && python3 scripts/trace_schedule.py "$trace" --plan "$O/plan_$name.txt" > "$O/schedule_$name.txt" 2>&1; then
        # the compute stream's forwards and backwards (self time, ms a step), and the planner's kernels
        awk -v m="$(micro_batches "$@")" '/^time per kind of work/ { on = 1 } / against the cost model/ { on = 0 }
             on && $1 == "forward" { f = $2 } on && $1 == "backward" { b = $2 }
             $1 == "forward" && $2 == "and" { k = $5; p = $6 }
             END { printf "    the trace: forward %.3f + backward %.3f ms a step (%.3f + %.3f a micro-batch, %d a step): %s ms of kernels against the planner'"'"'s %s\n",
                          f, b, f / m, b / m, m, k, p }' "$O/schedule_$name.txt" | tee -a "$O/summary.txt"
    else say "    the trace: none read ($(tail -1 "$O/schedule_$name.txt" 2>/dev/null | cut -c1-120))"; fi
}

timed b16_flash 20 "GPT-2 124M, 16 x 1024, fused attention" $gpt2 --vocab-size 50257 --micro-batch-size 16 \
    --global-batch-size 16 --attention-backend flash
timed b16_unfused 20 "GPT-2 124M, 16 x 1024, unfused attention" $gpt2 --vocab-size 50257 --micro-batch-size 16 \
    --global-batch-size 16 --attention-backend unfused
timed b64_flash 10 "GPT-2 124M, 64 x 1024 (llm.c's), fused attention" $gpt2 --vocab-size 50257 --micro-batch-size 64 \
    --global-batch-size 64 --attention-backend flash
timed b64_unfused 10 "GPT-2 124M, 64 x 1024 (llm.c's), unfused attention" $gpt2 --vocab-size 50257 --micro-batch-size 64 \
    --global-batch-size 64 --attention-backend unfused
# the shape of the one H200 run (docs/measured.md: 35.6 ms a step there; forward 2.23 ms and
# backward 6.44 ms a micro-batch): the corpus's byte vocabulary (257), 4 micro-batches of 4 x 1024
timed h200_shape 20 "GPT-2 124M's shape, vocabulary 257, 4 x (4 x 1024) (the H200 run's)" $gpt2 --vocab-size 257 \
    --micro-batch-size 4 --global-batch-size 16 --attention-backend flash

# ----------------------------------------------------------------------------
# 4. per-kernel times (nsys), and the planner refitted to them

nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | tail -1)
[ "$DRY" = 1 ] && nsys=${nsys:-nsys}
NSYS_ITERS=10
# kernels NAME: nsys profile of the run's flags for NSYS_ITERS steps (no --profile), its
# kernels' summary as CSV into $O/nsys_NAME.csv, and the top 30 per step into $O/kernels_NAME.txt
kernels() {
    local name=$1
    [ -f "$O/run_$name.flags" ] || return
    [ "$DRY" = 1 ] || [ -n "$(measured $name)" ] || { say "nsys $name: skipped (the run did not train)"; return; }
    step nsys_$name 120 "$nsys" profile --force-overwrite true --trace cuda --sample none --cpuctxsw none \
        --output "$O/nsys_$name" ./train_gpu --data-path $DATA $(cat "$O/run_$name.flags") $run_flags --train-iters $NSYS_ITERS
    local status=$?
    [ "$DRY" = 1 ] && return
    if [ $status -ne 0 ] || [ ! -f "$O/nsys_$name.nsys-rep" ]; then
        say "nsys $name: $(failed $status) ($(why nsys_$name $status))"
        return
    fi
    echo $NSYS_ITERS > "$O/nsys_$name.steps"
    local report
    for report in cuda_gpu_kern_sum gpukernsum; do   # the report's name since nsys 2022.4, and before
        timeout 120 "$nsys" stats --report $report --format csv "$O/nsys_$name.nsys-rep" > "$O/nsys_$name.stats" 2>&1
        grep -q '"Name"\|,Name' "$O/nsys_$name.stats" && break
    done
    # the CSV from its header on (nsys prints notes before it)
    awk '/Time.*Total Time.*Instances/ { on = 1 } on && NF' "$O/nsys_$name.stats" > "$O/nsys_$name.csv"
    python3 tests/refit_planner.py --kernels "$O/nsys_$name.csv" $NSYS_ITERS > "$O/kernels_$name.txt" 2>&1
    say "nsys $name: $(head -1 "$O/kernels_$name.txt")"
}
if [ -n "$nsys" ]; then
    for name in b16_flash b16_unfused b64_flash; do kernels $name; done
    step refit 120 python3 tests/refit_planner.py "$O" --run b16_flash --planner $planner
    status=$?
    if [ "$DRY" != 1 ]; then
        if [ $status -eq 0 ]; then sed 's/^/    /' "$O/refit.log" | tee -a "$O/summary.txt"
        else say "refit: $(failed $status) ($(why refit $status))"; fi
    fi
else say "nsys: not installed here: no per-kernel times, no refit (the step times above stand alone)"; fi

# ----------------------------------------------------------------------------
# 5. the rest of `make test-gpu`, in whatever time is left: train_gpu against train_cpu

if [ "$DRY" = 1 ] || [ "$(left)" -gt 60 ]; then
    step emu_train $(( $(left) - 5 )) env GPU_BINARY=./train_gpu bash tests/test_emu_train.sh $DATA
    status=$?
    [ "$DRY" = 1 ] || say "train_gpu against train_cpu (tests/test_emu_train.sh): $(grep -c '^PASS' "$O/emu_train.log") PASS, $(
        grep -c '^FAIL' "$O/emu_train.log") FAIL$([ $status -ne 0 ] && echo " ($(why emu_train $status))")"
else say "train_gpu against train_cpu: not run ($(left) s left)"; fi

say "done in ${SECONDS}s of a budget of ${BUDGET}s; everything in $O (the summary: $O/summary.txt). The figures go into"
say "docs/measured.md with the card named ($gpu); tests/refit_planner.py's preset line into hardware.h's HARDWARE_PRESETS."
