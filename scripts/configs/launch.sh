# scripts/configs/launch.sh — sourced by the model scripts next to it, which set
#   FULL    the published run's flags (model, batch, schedule, precision, layout)
#   TINY    the flags --tiny replaces (width, depth, vocabulary, batch and schedule lengths,
#           layout), keeping every option the full run uses; TINY_RANKS its world size
#   BINARY  train_gpu or train_gpu_fp16, GPUS: the full run's GPU count
# and then call `launch "$@"`:
#   DATA=PREFIX script.sh [--tiny] [--print | --dry-run] [more trainer flags]
#     full:    srun (or $LAUNCHER) $BINARY on GPUS ranks, checkpoints in ${SAVE:-checkpoints}
#     --tiny:  scripts/launch (mpirun) with the tiny layout's ranks, ./train_cpu, a few steps on a laptop
#     --print: print the command instead of running it
#     --dry-run: plan the layout with the trainer's planner instead (no DATA, no launcher, one
#              process): ./train_cpu FULL --dry-run --dry-run-build gpu --world-size GPUS [more
#              trainer flags]: the GPU build on --hw's GPU; with --tiny, the tiny flags on
#              TINY_RANKS, the CPU build priced on this machine (train_cpu's default). train_cpu
#              because it builds anywhere (the GPU binaries need CUDA to build and to load).
# A flag given twice takes its last value, so TINY (and the caller's flags: --world-size,
# --micro-batch-size, the layout's) override FULL.

launch() {
    local tiny=0 print=0 dry=0
    while [ $# -gt 0 ]; do
        case "$1" in
            --tiny) tiny=1; shift ;;
            --print) print=1; shift ;;
            --dry-run) dry=1; shift ;;
            *) break ;;
        esac
    done
    if [ $print = 1 ] && [ $dry = 1 ]; then
        echo "launch.sh: give --print or --dry-run, not both (one prints the command, one plans the layout)" >&2
        exit 2
    fi
    if [ $dry = 1 ]; then
        [ -x ./train_cpu ] || { echo "launch.sh: --dry-run runs ./train_cpu: build it with make cpu" >&2; exit 2; }
        if [ $tiny = 1 ]; then
            exec ./train_cpu "${FULL[@]}" "${TINY[@]}" --dry-run --world-size "$TINY_RANKS" "$@"
        else
            exec ./train_cpu "${FULL[@]}" --dry-run --dry-run-build gpu --world-size "$GPUS" "$@"
        fi
    fi
    : "${DATA:?set DATA to a Megatron .bin/.idx prefix (./preprocess makes one)}"
    local cmd
    if [ $tiny = 1 ]; then
        # scripts/launch: mpirun whose Ctrl-C or SIGTERM saves and stops (it forwards SIGUSR1)
        cmd=(${LAUNCHER:-$(dirname "${BASH_SOURCE[0]}")/../launch --oversubscribe --bind-to none} -np "$TINY_RANKS" ./train_cpu "${FULL[@]}" "${TINY[@]}"
             --data-path "$DATA" "$@")
    else
        cmd=(${LAUNCHER:-srun} ./"$BINARY" "${FULL[@]}" --data-path "$DATA" --save "${SAVE:-checkpoints}"
             --load "${SAVE:-checkpoints}" "$@")
    fi
    if [ $print = 1 ]; then echo "${cmd[@]}"; else exec "${cmd[@]}"; fi
}
