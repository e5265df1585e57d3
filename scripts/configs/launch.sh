# scripts/configs/launch.sh — sourced by the model scripts next to it, which set
#   FULL    the published run's flags (model, batch, schedule, precision, layout)
#   TINY    the flags --tiny replaces (width, depth, vocabulary, batch and schedule lengths,
#           layout), keeping every option the full run uses; TINY_RANKS its world size
#   BINARY  train_gpu or train_gpu_fp16, GPUS: the full run's GPU count
# and then call `launch "$@"`:
#   DATA=PREFIX script.sh [--tiny] [--print | --dry-run] [more trainer flags]
#     full:    srun (or $LAUNCHER) $BINARY on GPUS ranks, checkpoints in ${SAVE:-checkpoints}; BINARY
#              train_cpu: scripts/launch on GPUS processes of this machine
#     --tiny:  scripts/launch (mpirun) with the tiny layout's ranks, ./train_cpu, a few steps on a laptop
#              (on GPT-2 tokens with GPT-2's vocabulary and tokenizer; as root, Open MPI told so)
#     --print: print the command instead of running it
#     --dry-run: plan the layout with the trainer's planner instead (no DATA, no launcher, one
#              process): ./train_cpu FULL --dry-run --dry-run-build gpu --world-size GPUS [more
#              trainer flags]: the GPU build on --hw's GPU; with --tiny, the tiny flags on
#              TINY_RANKS, the CPU build priced on this machine (train_cpu's default). train_cpu
#              because it builds anywhere (the GPU binaries need CUDA to build and to load).
# A flag given twice takes its last value, so TINY (and the caller's flags: --world-size,
# --micro-batch-size, the layout's) override FULL.

# --tiny on GPT-2 tokens (the data's largest id past a byte's 256) keeps GPT-2's vocabulary and
# tokenizer, and samples a few tokens of text at the end; on bytes the TINY list's byte
# vocabulary (257) stands
tiny_vocabulary() {
    local largest
    largest=$(./preprocess --inspect "$DATA" 2> /dev/null | sed -nE 's/.*max token id ([0-9]+).*/\1/p')
    [ -n "$largest" ] && [ "$largest" -gt 256 ] || return 0
    echo --vocab-size 50257 --tokenizer-type GPT2BPETokenizer \
         --vocab-file tests/data/gpt2/encoder.json --merge-file tests/data/gpt2/vocab.bpe --generate-tokens 8
}

# $here, the launcher of a run on this machine: scripts/launch, mpirun whose Ctrl-C or SIGTERM
# saves and stops (it forwards SIGUSR1). Open MPI refuses root unless told, as scripts/run.sh
# tells it (a laptop's or a container's root; a cluster's jobs run as users).
on_this_machine() {
    [ "$(id -u)" != 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    here="$(dirname "${BASH_SOURCE[0]}")/../launch --oversubscribe --bind-to none"
}

launch() {
    local tiny=0 print=0 dry=0 default
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
            local build=gpu
            [ "$BINARY" != train_cpu ] || build=cpu   # (the one-machine recipe plans this machine)
            exec ./train_cpu "${FULL[@]}" --dry-run --dry-run-build $build --world-size "$GPUS" "$@"
        fi
    fi
    : "${DATA:?set DATA to a Megatron .bin/.idx prefix (./preprocess makes one)}"
    local cmd
    local here
    on_this_machine
    if [ $tiny = 1 ]; then
        cmd=(${LAUNCHER:-$here} -np "$TINY_RANKS" ./train_cpu "${FULL[@]}" "${TINY[@]}"
             $(tiny_vocabulary) --data-path "$DATA" "$@")
    else   # a GPU run through srun (SLURM), a CPU one on this machine
        [ "$BINARY" = train_cpu ] && default="$here -np $GPUS" || default=srun
        cmd=(${LAUNCHER:-$default} ./"$BINARY" "${FULL[@]}" --data-path "$DATA" --save "${SAVE:-checkpoints}"
             --load "${SAVE:-checkpoints}" "$@")
    fi
    if [ $print = 1 ]; then echo "${cmd[@]}"; else exec "${cmd[@]}"; fi
}
