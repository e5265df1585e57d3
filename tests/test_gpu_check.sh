#!/usr/bin/env bash
# tests/test_gpu_check.sh [DATA_PREFIX] — tests/gpu_check.sh and tests/refit_planner.py where
# there is no GPU (issue 39). The GPU check is run once, on rented time, so what can be checked
# without a GPU is checked here:
# - it parses (bash -n);
# - GPU_CHECK_DRY=1 runs it through without a GPU: it prints every command it would run, and
#   runs only the planner. Every train_gpu command it prints (the timed runs, the nsys runs) is
#   given to ./train_cpu --dry-run, which parses and checks the same flags with the same table
#   (config.h) and refuses an unknown one: each must plan. The make targets are asked of make -n,
#   the nvcc commands (the kernel checks, gpu_dweight) of nvcc --dryrun (where nvcc is installed); the planner's
#   lines it prints are there, one per run, with a step and a peak memory, llm.c's 64 x 1024
#   planned below 80 GiB;
# - tests/refit_planner.py on tests/data/gpu_check_sample (made-up numbers in the form
#   gpu_check.sh writes): the kernels' sums by kind are the CSV's, summed here by name; the
#   flags it prints plan (./train_cpu --dry-run takes them); its preset line has the 16 numbers
#   of a Hardware; the refitted step is nearer the measured one than the preset's; its line of
#   tests/recost.py's constants (issue 52) is taken by recost.py, the tile efficiency the matmul one.
set -u
cd "$(dirname "$0")/.."
B=tests/build/gpu_check_test
rm -rf $B
mkdir -p $B
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ok() { echo "PASS $1"; }
bad() { echo "FAIL $1: $2"; }

if bash -n tests/gpu_check.sh 2> $B/syntax.log; then ok "tests/gpu_check.sh parses (bash -n)"
else bad "tests/gpu_check.sh's syntax" "$(head -3 $B/syntax.log)"; fi

GPU_CHECK_DRY=1 GPU_CHECK_OUT=$B/dry bash tests/gpu_check.sh > $B/dry.out 2>&1
status=$?
commands=$(grep -c '^command: ' $B/dry.out)
if [ $status -eq 0 ] && [ "$commands" -ge 16 ] && grep -q '^done in ' $B/dry.out; then
    ok "GPU_CHECK_DRY=1: runs through without a GPU and prints its $commands commands"
else bad "GPU_CHECK_DRY=1" "status $status, $commands commands: $(tail -3 $B/dry.out)"; fi

# every train_gpu command (alone, or under nsys) planned by ./train_cpu --dry-run with the same flags
grep -E '^command: ([^ ]*nsys .* )?\./train_gpu ' $B/dry.out | grep -o '\./train_gpu .*' | sed 's|^\./train_gpu ||' > $B/train_gpu.commands
runs=0 refused=""
while read -r flags; do
    runs=$((runs + 1))
    ./train_cpu --dry-run --dry-run-build gpu --world-size 1 $flags > $B/run_$runs.plan 2>&1
    if [ $? -ne 0 ] || ! tail -1 $B/run_$runs.plan | grep -q '^dry-run: world 1 '; then
        refused="$refused [$flags: $(head -c 300 $B/run_$runs.plan)]"
    fi
done < $B/train_gpu.commands
# and the last step's: tests/test_emu_train.sh against GPU_BINARY, which it reads
emu=$(grep -c '^command: env GPU_BINARY=./train_gpu bash tests/test_emu_train.sh ' $B/dry.out)
if [ $runs -eq 8 ] && [ -z "$refused" ] && [ "$emu" -eq 1 ] && grep -q 'BIN=$GPU_BINARY' tests/test_emu_train.sh; then
    ok "every train_gpu command it would run ($runs: 5 timed with --profile, 3 under nsys) plans with ./train_cpu --dry-run: every flag parses; test_emu_train.sh takes GPU_BINARY"
else bad "its train_gpu commands" "$runs commands, $emu test_emu_train;$refused"; fi

# the build and the kernel checks' compile
make_command=$(grep -m1 '^command: make ' $B/dry.out | sed 's/^command: make //')
nvcc_commands=$(grep -c '^command: nvcc ' $B/dry.out)
if ! make -n $make_command > $B/make.out 2>&1; then bad "the build command" "make -n $make_command: $(tail -2 $B/make.out)"
elif ! command -v nvcc > /dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    ok "the build command's targets (make -n $make_command); no nvcc here to ask about the kernel checks' $nvcc_commands"
else
    nvcc_bad=""
    while read -r line; do
        PATH=$PATH:/usr/local/cuda/bin ${line#command: } --dryrun > $B/nvcc.out 2>&1 || nvcc_bad="$nvcc_bad [$(head -2 $B/nvcc.out)]"
    done < <(grep '^command: nvcc ' $B/dry.out)
    if [ "$nvcc_commands" -eq 3 ] && [ -z "$nvcc_bad" ]; then
        ok "the build command's targets (make -n $make_command) and the 3 nvcc commands, the kernel checks' and gpu_dweight's (nvcc --dryrun)"
    else bad "the kernel checks' nvcc commands" "$nvcc_commands commands;$nvcc_bad"; fi
fi

# the planner's lines: one per timed run, a step and a peak; 64 x 1024 below 80 GiB (its runs are not skipped)
planned=$(grep -cE ': planned [0-9.]+ ms a step, peak memory per GPU [0-9.]+ GiB$' $B/dry.out)
peak64=$(grep -m1 '64 x 1024 (llm.c.s), unfused' $B/dry.out | sed -nE 's/.*peak memory per GPU ([0-9.]+) GiB$/\1/p')
if [ "$planned" -eq 5 ] && [ -n "$peak64" ] && awk -v p="$peak64" 'BEGIN { exit !(p + 2 < 80) }' && ! grep -q 'not run, the planner' $B/dry.out; then
    ok "the planner's 5 lines, a step and a peak each; 64 x 1024 fits 80 GiB (unfused $peak64 GiB + the reserve)"
else bad "the planner's lines" "$planned lines; 64 x 1024 unfused: '$peak64' GiB: $(grep planned $B/dry.out | head -5)"; fi

# --- tests/refit_planner.py on the made-up folder
sample=tests/data/gpu_check_sample
python3 tests/refit_planner.py $sample > $B/refit.out 2>&1
status=$?
# the kinds' sums, by name here: ms a step of the CSV's rows (10 steps)
read gemms flash reductions other <<< "$(python3 -c '
import csv, re, sys
rows = list(csv.reader(open(sys.argv[1])))[2:]
sums = [0.0] * 4
for r in rows:
    n, ms = r[8], float(r[1]) / 1e7
    k = 1 if "flash" in n else 2 if re.search("layernorm_backward|column_", n) else 0 if re.search("gemm|xmma|nvjet|splitK", n) else 3
    sums[k] += ms
print(" ".join("%.3f" % s for s in sums))' $sample/nsys_b16_flash.csv)"
got=$(awk '$1 == "GEMMs" { g = $2 } $1 == "fused" { f = $3 } $1 == "column" { c = $3 } $1 == "other" { o = $3 } END { print g, f, c, o }' $B/refit.out)
flags=$(sed -n 's/^flags: //p' $B/refit.out)
numbers=$(sed -nE 's/^preset line: \[HW_H100_80GB\] = \{(.*)\},$/\1/p' $B/refit.out | tr ',' '\n' | grep -cE '^ ?[0-9.e+-]+$')
read measured preset refitted <<< "$(awk '$1 == "the" && $2 == "step" { print $3, $4, $5 }' $B/refit.out)"
./train_cpu --dry-run --world-size 1 $(cat $sample/run_b16_flash.flags) $flags > $B/refit.plan 2>&1
plan_status=$?
if [ $status -eq 0 ] && [ "$got" = "$gemms $flash $reductions $other" ] && [ $plan_status -eq 0 ] &&
   [[ "$flags" == "--hw h100-80gb --hw-memory-efficiency "*" --hw-matmul-efficiency "*" --hw-attention-efficiency "* ]] &&
   [ "$numbers" -eq 16 ] && [ -n "$refitted" ] &&
   awk -v m="$measured" -v p="$preset" -v r="$refitted" 'BEGIN { d = r - m; e = p - m; exit !(d * d < e * e) }'; then
    ok "refit_planner.py on the made-up folder: kinds' sums $got ms a step (summed here alike); flags that plan ($flags); a preset line of 16; the step $measured ms measured, $preset planned at the preset, $refitted refitted"
else bad "refit_planner.py" "status $status, plan $plan_status; sums '$got' against '$gemms $flash $reductions $other'; flags '$flags'; $numbers numbers; step $measured / $preset / $refitted: $(tail -5 $B/refit.out)"; fi
# issue 52 item 3: the same refit as tests/recost.py's constants, one line of its flags, which it takes
# (--constants: its constants alone, nothing compiled) and echoes; the tile efficiency is the matmul one
recost_flags=$(sed -n 's/^recost.py: //p' $B/refit.out)
matmul=$(echo "$flags" | sed -nE 's/.*--hw-matmul-efficiency ([0-9.e+-]+).*/\1/p')
tile=$(echo "$recost_flags" | sed -nE 's/.*--tile-efficiency ([0-9.e+-]+).*/\1/p')
python3 tests/recost.py $recost_flags --constants > $B/recost_constants.out 2>&1
rc_status=$?
if [[ "$recost_flags" =~ ^--tile-efficiency\ [0-9.]+\ --stream-fraction\ [0-9.]+\ --memory-latency-us\ [0-9.]+\ --launch-gap-us\ [0-9.]+\ --issue-rate-g\ [0-9.]+$ ]] &&
   [ $rc_status -eq 0 ] && grep -q "^recost constants (refitted: .*tile efficiency forward $tile, backward $tile" $B/recost_constants.out &&
   awk -v a="$matmul" -v b="$tile" 'BEGIN { d = a - b; exit !(d * d < 1e-6) }'; then
    ok "refit_planner.py's line for tests/recost.py ($recost_flags): recost.py takes it; a tile's efficiency is the matmul efficiency ($matmul)"
else bad "refit_planner.py's recost.py line" "status $rc_status; '$recost_flags' (matmul '$matmul'): $(head -2 $B/recost_constants.out)"; fi
# --kernels: the per-kernel table gpu_check.sh writes beside each nsys run
python3 tests/refit_planner.py --kernels $sample/nsys_b16_flash.csv 10 > $B/kernels.out 2>&1
first=$(head -1 $B/kernels.out)
if [[ "$first" =~ ^39\.346\ ms\ of\ kernels\ a\ step\ in\ 326\ launches:\ GEMMs\ $gemms, ]] && [ "$(wc -l < $B/kernels.out)" -eq 21 ]; then
    ok "refit_planner.py --kernels: $first"
else bad "refit_planner.py --kernels" "$(head -3 $B/kernels.out)"; fi

# tests/gpu_dweight.cu (the weight-gradient GEMMs, the bias gradient in cuBLASLt's BGRADB epilogue
# and by column_sums_add after the product) under the emulation, at widths / 8 and 64 rows: it
# runs, times both ways for both dW types, and the two ways' bias gradients agree
if g++ -std=c++20 -O2 -Wall -Wextra -Werror -Wno-unused-function -fopenmp -x c++ -D__CUDACC__ -I. -Itests -Itests/emu \
       tests/gpu_dweight.cu -o $B/gpu_dweight -lm > $B/dweight.build 2>&1; then
    $B/gpu_dweight 64 1 8 > $B/dweight.out 2>&1
    status=$?
    rows=$(grep -cE '^[a-z].*\((96|384) -> (96|288|384)\) +(fp32|bf16) +[0-9.]+ +[0-9.]+ ' $B/dweight.out)
    if [ $status -eq 0 ] && [ "$rows" -eq 8 ] && grep -q '^bias gradients both ways: largest difference 0.00e+00' $B/dweight.out &&
       grep -qE '^fp32 weight gradients, the four layers: .* --bias-grad (epilogue|kernel) is faster$' $B/dweight.out; then
        ok "tests/gpu_dweight.cu emulated: 8 timed rows (4 layers x fp32/bf16 dW), both ways' bias gradients equal, the faster --bias-grad named"
    else bad "tests/gpu_dweight.cu emulated" "status $status, $rows rows: $(tail -3 $B/dweight.out)"; fi
else bad "tests/gpu_dweight.cu builds under the emulation" "$(head -5 $B/dweight.build)"; fi
# --bias-grad kernel: the planner prices column sums in place of the epilogue's add
gpt2="--num-layers 2 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --micro-batch-size 4 --vocab-size 50257"
for way in epilogue kernel; do
    ./train_cpu --dry-run --dry-run-build gpu --world-size 1 $gpt2 --bias-grad $way > $B/bias_grad_$way.plan 2>&1
done
if grep -q '^  bias gradients (GEMM epilogue, then added) ' $B/bias_grad_epilogue.plan &&
   ! grep -q '^  bias gradients (column sums) ' $B/bias_grad_epilogue.plan &&
   grep -q '^  bias gradients (column sums) ' $B/bias_grad_kernel.plan &&
   ! grep -q 'GEMM epilogue, then added' $B/bias_grad_kernel.plan; then
    ok "--bias-grad kernel: the dry run prices the bias gradients' column sums, epilogue (the default) the epilogue's add"
else bad "--bias-grad in the dry run" "$(grep 'bias gradients' $B/bias_grad_*.plan)"; fi
