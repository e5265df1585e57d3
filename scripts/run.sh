#!/usr/bin/env bash
# `make run`: the main job from a fresh clone on a Debian or Ubuntu machine.
#   1. install what is missing (scripts/install.sh: as root; else it prints the command)
#   2. build the trainer that fits the machine (GPU build if a GPU is visible, else CPU)
#   3. build the default corpus offline (scripts/make_corpus.sh) and preprocess it
#   4. train a small byte-level GPT for a few minutes, evaluate, print a sample; TensorBoard
#      event files go to runs/tensorboard (view: tensorboard --logdir runs/tensorboard)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install.sh
make -s default
trainer=./train_cpu
nvidia-smi -L 2>/dev/null | grep -q GPU && trainer=./train_gpu

mkdir -p runs/corpus
if [ ! -f runs/corpus/licenses_text_document.idx ]; then
    scripts/make_corpus.sh runs/corpus/licenses.jsonl
    ./preprocess --input runs/corpus/licenses.jsonl --json-keys text --append-eod \
                 --output-prefix runs/corpus/licenses
fi

# Open MPI refuses root unless told; the trainer runs as one process here
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
$trainer --data-path runs/corpus/licenses_text_document --split 90,10,0 \
    --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 \
    --micro-batch-size 8 --global-batch-size 8 --train-iters 1000 \
    --lr 2e-3 --min-lr 2e-4 --lr-decay-style cosine --lr-warmup-iters 50 --weight-decay 0.1 \
    --adam-beta2 0.95 --clip-grad 1.0 --log-interval 100 --eval-interval 250 --eval-iters 20 \
    --unigram-baseline --generate-tokens 400 --generate-prompt "This License" --temperature 0.8 \
    --tensorboard-dir runs/tensorboard "$@"
