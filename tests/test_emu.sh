#!/bin/bash
# tests/test_emu.sh — kernels.cuh's CUDA path, compiled by g++ against the emulation in
# tests/emu/, in two programs:
#   tests/test_emu_kernels.cpp  every CUDA kernel against its plain-C reference, with each
#                               allocation ending at a guard page (one line per check); then
#                               all of it again with allocations beginning at one
#                               (EMU_GUARD=start: an index of -1 faults), in one line;
#   tests/test_emu_guard.cpp    the guard pages catch a kernel's off-by-one, naming the kernel.
# Prints one PASS/FAIL line per check; the exit status is non-zero if anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."
B=tests/build
mkdir -p $B
CXX=${CXX:-g++}
# -fopenmp: the references keep their pragmas; the emulated kernels run on one OS thread
for program in test_emu_kernels test_emu_guard; do
    if ! $CXX -std=c++20 -O2 -g -Wall -Wextra -Wno-unused-function -fopenmp -x c++ -D__CUDACC__ \
        -I. -Itests -Itests/emu tests/$program.cpp -o $B/$program -lm > $B/$program.build.log 2>&1; then
        echo "FAIL build tests/$program.cpp: $(head -20 $B/$program.build.log)"
        exit 1
    fi
done

status=0
$B/test_emu_kernels
kernels_status=$?
# 1: checks failed (their FAIL lines say which); anything else: it stopped, e.g. at an emu error
if [ $kernels_status -gt 1 ]; then echo "FAIL tests/test_emu_kernels stopped with status $kernels_status (the emu error above says why)"; fi
[ $kernels_status -eq 0 ] || status=1
label="every emulated kernel check again with allocations beginning at a guard page (EMU_GUARD=start)"
if EMU_GUARD=start $B/test_emu_kernels > $B/test_emu_kernels_start.log 2>&1; then
    echo "PASS $label: $(tail -1 $B/test_emu_kernels_start.log)"
else
    echo "FAIL $label: $(grep -m3 -E '^FAIL|error' $B/test_emu_kernels_start.log | tr '\n' ' ')"
    status=1
fi
$B/test_emu_guard || status=1
exit $status
