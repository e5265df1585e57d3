#!/usr/bin/env bash
# tests/fit_matmul_efficiency.sh MEASURED_MS PLANNER-FLAGS... — the matmul efficiency at which
# the planner's cost model prices a step at MEASURED_MS (milliseconds): the constant that
# --hw's preset would need for that GPU, fitted to a measured step the way HARDWARE_PRESETS'
# V100 and A100 constants were fitted to published runs (train.c). PLANNER-FLAGS are the
# model, batch, layout and --hw flags of the measured run, given to ./train_cpu --dry-run.
# The estimated step falls as the efficiency E rises, so E is found by bisection in (0, 1].
# Prints E to three decimals, or a line saying that no E reproduces the measurement (a step
# slower than E = 0.01 gives, or faster than E = 1: the rest of the model is off, not E).
# Used by tests/bench_gpu.sh; tests/test_plan.sh checks it finds the E a plan was made with.
set -u
measured_ms=${1:?usage: fit_matmul_efficiency.sh MEASURED_MS PLANNER-FLAGS...}
shift

# the planner's step in ms at efficiency $1, from its "step = ... = N x SLOT s + OPT s" line
# (more digits than the summary line's)
planned_ms() {
    ./train_cpu --dry-run "$@" 2>&1 | sed -nE 's/^step = .* = ([0-9]+) x ([0-9.e+-]+) s \+ ([0-9.e+-]+) s$/\1 \2 \3/p' |
        awk '{ printf "%.9g\n", 1e3 * ($1 * $2 + $3) }'
}
step_at() { planned_ms "$@" --hw-matmul-efficiency "$E"; }

E=1;    fastest=$(step_at "$@")
E=0.01; slowest=$(step_at "$@")
if [ -z "$fastest" ] || [ -z "$slowest" ]; then
    echo "fit_matmul_efficiency: the planner gave no step for: $*" >&2
    exit 2
fi
if awk -v m="$measured_ms" -v f="$fastest" -v s="$slowest" 'BEGIN { exit !(m < f || m > s) }'; then
    echo "no matmul efficiency in [0.01, 1] gives ${measured_ms} ms: the planner says ${fastest} ms at 1, ${slowest} ms at 0.01"
    exit 0
fi
lo=0.01 hi=1
for _ in $(seq 1 20); do   # the interval halves each time: 2^-20 of it is far below the printed digits
    E=$(awk -v a="$lo" -v b="$hi" 'BEGIN { printf "%.9f", (a + b) / 2 }')
    if awk -v p="$(step_at "$@")" -v m="$measured_ms" 'BEGIN { exit !(p > m) }'; then lo=$E; else hi=$E; fi
done
awk -v a="$lo" -v b="$hi" 'BEGIN { printf "%.3f\n", (a + b) / 2 }'
