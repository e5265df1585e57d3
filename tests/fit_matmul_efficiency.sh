#!/usr/bin/env bash
# tests/fit_matmul_efficiency.sh MEASURED_GEMM_MS PLANNER-FLAGS... — the matmul efficiency at
# which the planner's cost model prices the step's GEMMs (its cuBLAS rows: the line "GEMMs only
# (the cuBLAS rows): N ms" of --dry-run) at MEASURED_GEMM_MS, the time the same GEMMs took on a
# GPU (the cuBLAS kernels' sum in a profile of one step, e.g. nsys's; tests/bench_gpu.sh): the
# large-GEMM constant that --hw's preset would need for that GPU. Fitted to the GEMMs alone, so
# that the attention, the memory-bound kernels and the communication, each priced by its own
# constant, do not fold into it. PLANNER-FLAGS are the model, batch, layout and --hw flags of
# the measured run, given to ./train_cpu --dry-run. The GEMMs' time falls as the efficiency E
# rises (until their bytes bound them: plan.h's gemm_seconds), so E is found by bisection in
# (0, 1]. Prints E to three decimals, or a line saying that no E reproduces the measurement
# (GEMMs slower than E = 0.01 gives, or faster than E = 1 or than their bytes allow: the shape
# model is off, not E). tests/test_plan.sh checks that it finds the E a plan was made with.
set -u
measured_ms=${1:?usage: fit_matmul_efficiency.sh MEASURED_GEMM_MS PLANNER-FLAGS...}
shift

# the planner's GEMM-only ms at efficiency E
gemm_ms_at() { ./train_cpu --dry-run "$@" --hw-matmul-efficiency "$E" 2>&1 | sed -nE 's/^GEMMs only \(the cuBLAS rows\): ([0-9.e+-]+) ms .*/\1/p'; }

E=1;    fastest=$(gemm_ms_at "$@")
E=0.01; slowest=$(gemm_ms_at "$@")
if [ -z "$fastest" ] || [ -z "$slowest" ]; then
    echo "fit_matmul_efficiency: the planner gave no GEMM time for: $*" >&2
    exit 2
fi
if awk -v m="$measured_ms" -v f="$fastest" -v s="$slowest" 'BEGIN { exit !(m < f || m > s) }'; then
    echo "no matmul efficiency in [0.01, 1] gives GEMMs of ${measured_ms} ms: the planner says ${fastest} ms at 1, ${slowest} ms at 0.01"
    exit 0
fi
lo=0.01 hi=1
for _ in $(seq 1 20); do   # the interval halves each time: 2^-20 of it is far below the printed digits
    E=$(awk -v a="$lo" -v b="$hi" 'BEGIN { printf "%.9f", (a + b) / 2 }')
    if awk -v p="$(gemm_ms_at "$@")" -v m="$measured_ms" 'BEGIN { exit !(p > m) }'; then lo=$E; else hi=$E; fi
done
awk -v a="$lo" -v b="$hi" 'BEGIN { printf "%.3f\n", (a + b) / 2 }'
