#!/bin/bash
# tests/test_emu.sh — build tests/test_emu_kernels.cpp (kernels.cuh's CUDA path, compiled by
# g++ against the emulation in tests/emu/) and run it: every CUDA kernel against its
# plain-C reference. Prints one PASS/FAIL line per check and "N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p tests/build
CXX=${CXX:-g++}
# -fopenmp: the references keep their pragmas; the emulated kernels run on one OS thread
$CXX -std=c++20 -O2 -g -Wall -Wextra -Wno-unused-function -fopenmp -x c++ -D__CUDACC__ \
    -I. -Itests -Itests/emu tests/test_emu_kernels.cpp -o tests/build/test_emu_kernels -lm
exec tests/build/test_emu_kernels
