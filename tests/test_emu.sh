#!/bin/bash
# tests/test_emu.sh — the CUDA path of kernels.cuh (and of the kernels/ files it includes),
# compiled by g++ against the emulation in tests/emu/, in these programs:
#   tests/test_emu_kernels.cpp  every CUDA kernel against its plain-C reference, with each
#                               allocation ending at a guard page (one line per check); then
#                               (the bf16 build) all of it again with allocations beginning at
#                               one (EMU_GUARD=start: an index of -1 faults), in one line; built
#                               twice, as the bf16 build and (-DGRIDGPT_FP16) the fp16 build;
#   tests/test_emu_half.cpp     the emulated fp16's conversions: hand-checked values, and
#                               numpy.float16's conversions on the cases tests/half_cases.py
#                               writes (SKIP when /usr/bin/python3 has no numpy);
#   tests/test_emu_guard.cpp    the guard pages catch a kernel's off-by-one, naming the kernel,
#                               and the rules of the PTX the fused attention uses (ldmatrix,
#                               cp.async, mma.sync) and of dynamic shared memory;
#   planted bugs                kernels.cuh and kernels/ copied, one bug planted by sed in one
#                               family file (no hooks in the source), test_emu_kernels built
#                               against the copy and run on the fused attention's checks alone
#                               (or the split decode's, for its bugs): PASS when they catch the
#                               bug (a check FAILs, or the emulation stops with an error).
# Prints one PASS/FAIL line per check; the exit status is non-zero if anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."
B=tests/build
mkdir -p $B
CXX=${CXX:-g++}
# build PROGRAM SOURCE [FLAGS...]
# -fopenmp: the references keep their pragmas; the emulated kernels run on one OS thread
build() {
    local program=$1 source=$2
    shift 2
    # (no -g: nothing reads the debug information, and it took a third of each build)
    if ! $CXX -std=c++20 -O2 -Wall -Wextra -Wno-unused-function -fopenmp -x c++ -D__CUDACC__ "$@" \
        -I. -Itests -Itests/emu "$source" -o $B/$program -lm > $B/$program.build.log 2>&1; then
        echo "FAIL build $source $*: $(head -20 $B/$program.build.log)"
        return 1
    fi
}
# two builds at a time (each is one core's work); any that failed has said so, and ends the script
rm -f $B/test_emu_kernels $B/test_emu_kernels_fp16 $B/test_emu_half $B/test_emu_guard
build test_emu_kernels tests/test_emu_kernels.cpp &
build test_emu_kernels_fp16 tests/test_emu_kernels.cpp -DGRIDGPT_FP16 &
wait
build test_emu_half tests/test_emu_half.cpp &
build test_emu_guard tests/test_emu_guard.cpp &
wait
for program in test_emu_kernels test_emu_kernels_fp16 test_emu_half test_emu_guard; do
    [ -x $B/$program ] || exit 1
done

status=0
# run_kernels PROGRAM [start]: its checks one per line, then with `start` all of them again under
# EMU_GUARD=start. The bf16 program alone runs the second pass: both precisions instantiate the
# same kernel templates, whose indexing does not depend on floatX, so an index of -1 faults in
# the one as in the other (the second pass of both took about 40 s more of make test).
run_kernels() {
    local program=$1
    $B/$program
    local kernels_status=$?
    # 1: checks failed (their FAIL lines say which); anything else: it stopped, e.g. at an emu error
    if [ $kernels_status -gt 1 ]; then echo "FAIL tests/$program stopped with status $kernels_status (the emu error above says why)"; fi
    [ $kernels_status -eq 0 ] || status=1
    [ "${2:-}" = start ] || return 0
    local label="$program: every emulated kernel check again with allocations beginning at a guard page (EMU_GUARD=start)"
    if EMU_GUARD=start $B/$program > $B/${program}_start.log 2>&1; then
        echo "PASS $label: $(tail -1 $B/${program}_start.log)"
    else
        echo "FAIL $label: $(grep -m3 -E '^FAIL|error' $B/${program}_start.log | tr '\n' ' ')"
        status=1
    fi
}
run_kernels test_emu_kernels start
run_kernels test_emu_kernels_fp16

if /usr/bin/python3 -c 'import numpy' 2> /dev/null; then
    if /usr/bin/python3 tests/half_cases.py $B/half_cases.bin; then
        $B/test_emu_half $B/half_cases.bin || status=1
    else
        echo "FAIL tests/half_cases.py could not write $B/half_cases.bin"
        status=1
    fi
else
    echo "SKIP fp16 emu against numpy.float16: /usr/bin/python3 has no numpy (the hand-checked values still run)"
    $B/test_emu_half || status=1
fi
$B/test_emu_guard || status=1

# plant NAME FILE SED_SCRIPT [CHECKS]: kernels.cuh and kernels/ copied into $B/planted_K/ (first on
# the include path), SED_SCRIPT applied to the copy's FILE (one of kernels/); its CHECKS (flash:
# the fused attention's, the default; decode: the split decode's and its graph's) must fail. The plants are
# queued, then built and run two at a time, each saying PASS or
# FAIL in its turn.
plants=()
plant() { plants+=("$1" "$2" "$3" "${4:-flash}"); }
run_plant() {  # K NAME FILE SED_SCRIPT CHECKS: one line into $B/planted_K/result
    local k=$1 name=$2 file=$3 script=$4 checks=$5 dir=$B/planted_$1
    rm -rf $dir && mkdir -p $dir && cp -r kernels.cuh kernels $dir/
    sed "$script" $file > $dir/$file
    if cmp -s $file $dir/$file; then
        echo "FAIL planted bug ($name): the sed script no longer matches $file" > $dir/result; return
    fi
    # (-DEMU_FLASH_ONLY: the flash tests alone compiled in; -Og: of -O0, -Og and -O1 the quickest
    # build and run; TEST_STOP_AT_FAIL: one failed check is enough, the rest are not run)
    if ! build test_emu_planted_$k tests/test_emu_kernels.cpp -Og -g0 -DEMU_FLASH_ONLY -I$dir > $dir/result; then return; fi
    TEST_STOP_AT_FAIL=1 $B/test_emu_planted_$k $checks > $dir/planted.log 2>&1
    local rc=$? caught
    caught=$(grep -m1 '^emu error' $dir/planted.log)
    [ -n "$caught" ] || caught="a failed check: $(grep -m1 '^FAIL' $dir/planted.log | cut -c6- | cut -d: -f1)"
    if [ $rc -ne 0 ]; then echo "PASS planted bug ($name) is caught: $caught" > $dir/result
    else echo "FAIL planted bug ($name) went unnoticed: $(tail -1 $dir/planted.log)" > $dir/result; fi
}
run_plants() {
    local n=$((${#plants[@]} / 4)) k
    for ((k = 0; k < n; k += 2)); do
        run_plant $k "${plants[@]:4 * k:4}" &
        if ((k + 1 < n)); then run_plant $((k + 1)) "${plants[@]:4 * k + 4:4}" & fi
        wait
    done
    for ((k = 0; k < n; k++)); do
        cat $B/planted_$k/result
        grep -q '^PASS' $B/planted_$k/result || status=1
    done
}
flash=kernels/flash_attention.cuh   # where the fused attention lives
ptx=kernels/flash_ptx.cuh           # ... and its PTX, the dQ turns among it
plant "a wrong tile bound: the forward's causal loop stops one key tile early" $flash \
    's|for (int kt = 0; kt < key_tiles; kt++) {|for (int kt = 0; kt < key_tiles - 1; kt++) {|'
plant "a missing barrier: the forward's __syncthreads between the tile's copies landing and the warps reading them" $flash \
    '\|__syncthreads();      // ... and every thread.s part of them|d'
plant "a missing cp.async wait: the forward reads a key tile whose copies may still be in flight" $flash \
    '\|cp_async_wait<1>();   // all but the newest group: this tile is here|d'
plant "a missing barrier: the forward copies the next key tile into a buffer other warps still read" $flash \
    '0,\|__syncthreads();   // every warp is done with this buffer|{\|__syncthreads();   // every warp is done with this buffer|d}'
plant "grouped-query attention: the backward sums the first head of each group only" $flash \
    's|pairs = per \* (steps_T - first);|pairs = steps_T - first;|'
plant "a missing cp.async wait: the backward reads a step's q, dout, lse and D still in flight" $flash \
    '\|cp_async_wait<1>();   // all but the newest group: this pair is here|d'
plant "a missing barrier: the backward's dQ product reads dS^T before the other warps wrote theirs" $flash \
    '\|__syncthreads();   // the block.s dS^T is whole|d'
plant "dQ out of turn: the backward adds a key tile's part without waiting for the tiles before it" $flash \
    '\|flash_wait_turn(turn, kt);|d'
plant "dQ's turns from blockIdx: a block waits for blocks the GPU may start after it" $flash \
    's|int i = (int)atomicAdd(counters + (size_t)B \* NH \* steps_T, 1u)|int i = (int)blockIdx.x|'
plant "the ticket window hands out a pair's last key tile first: a block waits for tiles with higher tickets" $flash \
    's|ticket\[0\] = j / n,|ticket[0] = tiles - 1 - j / n,|'
plant "a missing barrier: a block passes dQ's turn before all its threads have added their part" $ptx \
    '/^__device__ inline void flash_pass_turn/,/^}/{/__syncthreads();/d}'
plant "a missing barrier: threads add their part of dQ without the barrier after thread 0's acquire" $ptx \
    '/^__device__ inline void flash_wait_turn/,/^}/{/__syncthreads();/d}'
plant "no acquire: thread 0 spins on the turn's counter but never reads it with acquire semantics" $ptx \
    '\|(void)load_acquire_gpu(counter);|d'
plant "dQ's 128-bit sums: the lanes of a pair do not swap halves (each stores its own columns of two rows as one row's)" $flash \
    's|float x\[4\] = {odd ? got0 : d\[0\], odd ? got1 : d\[1\], odd ? d\[2\] : got0, odd ? d\[3\] : got1};|float x[4] = {d[0], d[1], d[2], d[3]};|'
plant "dQ's turn counters never zeroed: the D kernel leaves what the last backward counted" $flash \
    's|        counters\[i\] = 0;|        (void)counters;|'
plant "dropout: the backward draws the mask of (key, query), not (query, key)" $flash \
    's|dropout_factor(head_key, query, key, \&dropout)|dropout_factor(head_key, key, query, \&dropout)|'
plant "dropout: the forward's product weighs V by P without the mask" $flash \
    's|            if (DROPOUT)           // then P V weighs|            if (false)             // then P V weighs|'
attention=kernels/attention.cuh   # where the split decode lives
plant "the split decode's merge drops a split's maximum: each split weighed 1, not exp(m_s - M)" $attention \
    's|float w = part\[0\] == -INFINITY ? 0.0f : expf(part\[0\] - M);|float w = part[0] == -INFINITY ? 0.0f : 1.0f;|' decode
plant "the split decode's runs: a split stops one key before the next one starts" $attention \
    's|end = first + chunk < t + 1 ? first + chunk : t + 1;|end = first + chunk - 1 < t + 1 ? first + chunk - 1 : t + 1;|' decode
plant "a decode step's graph captured with the compute stream left at 0: its kernels would run at once, outside the graph" \
    kernels/common.cuh '/^static void compute_graph_begin/,/^}/{/    compute_stream = g->stream;/d}' decode
plant "cuBLASLt's products queued on stream 0, not the compute stream: outside a captured graph" kernels/linear.cuh \
    's|cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES, compute_stream));|cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES, 0));|' decode
run_plants
exit $status
