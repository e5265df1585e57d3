# scripts/configs/launch.sh — sourced by the model scripts next to it, which set
#   FULL    the published run's flags (model, batch, schedule, precision, layout)
#   TINY    the flags --tiny replaces (width, depth, vocabulary, batch and schedule lengths,
#           layout), keeping every option the full run uses
#   BINARY  train_gpu or train_gpu_fp16, GPUS: the full run's GPU count
# and then call `launch "$@"`:
#   DATA=PREFIX script.sh [--tiny] [--dry-run] [more trainer flags]
#     full:    srun (or $LAUNCHER) $BINARY on GPUS ranks, checkpoints in ${SAVE:-checkpoints}
#     --tiny:  mpirun with the tiny layout's ranks, ./train_cpu, a few steps on a laptop
#     --dry-run: print the command instead of running it
# A flag given twice takes its last value, so TINY (and the caller's flags) override FULL.

launch() {
    local tiny=0 dry=0
    while [ $# -gt 0 ]; do
        case "$1" in
            --tiny) tiny=1; shift ;;
            --dry-run) dry=1; shift ;;
            *) break ;;
        esac
    done
    : "${DATA:?set DATA to a Megatron .bin/.idx prefix (./preprocess makes one)}"
    local cmd
    if [ $tiny = 1 ]; then
        cmd=(${LAUNCHER:-mpirun --oversubscribe --bind-to none} -np "$TINY_RANKS" ./train_cpu "${FULL[@]}" "${TINY[@]}"
             --data-path "$DATA" "$@")
    else
        cmd=(${LAUNCHER:-srun} ./"$BINARY" "${FULL[@]}" --data-path "$DATA" --save "${SAVE:-checkpoints}"
             --load "${SAVE:-checkpoints}" "$@")
    fi
    if [ $dry = 1 ]; then echo "${cmd[@]}"; else exec "${cmd[@]}"; fi
}
