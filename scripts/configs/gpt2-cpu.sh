#!/usr/bin/env bash
# A small GPT-2 on GPT-2 tokens, trained on this machine's CPU in minutes: the one-machine recipe.
# GPT-2's architecture and tokenizer at a width a laptop trains (4 layers of 128, 4 heads, 128
# tokens a sample, 7.2M parameters of which 6.4M are the embedding of GPT-2's 50,257 tokens),
# nanoGPT's optimizer settings (betas 0.9/0.95, weight decay 0.1, clip 1.0, cosine to a tenth)
# at a small model's learning rate; it ends with the validation loss and a sample of text.
#   scripts/configs/gpt2-cpu.sh [--tiny] [--print | --dry-run] [flags]      (see launch.sh)
# DATA: GPT-2 tokens; without it, the license texts every Debian machine ships, as running text
# (scripts/make_corpus.sh --prose: 792 paragraphs), made once into runs/corpus/.
# Checkpoints go to ${SAVE:-runs/gpt2-cpu} (a second run there resumes: --train-iters 1200 goes on).
# Time: see "Measured" below the flags (one process, OMP_NUM_THREADS = the cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/configs/launch.sh

BINARY=train_cpu
GPUS=1   # one process: on a few cores its OpenMP threads beat ranks of one thread each
T=(--tokenizer-type GPT2BPETokenizer --vocab-file tests/data/gpt2/encoder.json --merge-file tests/data/gpt2/vocab.bpe)
FULL=(--num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128
      --vocab-size 50257 "${T[@]}"
      --micro-batch-size 8 --global-batch-size 8 --train-iters 600
      --lr 2e-3 --min-lr 2e-4 --lr-decay-style cosine --lr-warmup-iters 50
      --adam-beta1 0.9 --adam-beta2 0.95 --weight-decay 0.1 --clip-grad 1.0
      --hidden-dropout 0 --attention-dropout 0   # nanoGPT's pretraining (dropout 0.0); the measurement below had none
      --split 90,10,0 --log-interval 100 --eval-interval 200 --eval-iters 5 --save-interval 200
      --generate-tokens 80 --generate-prompt "You may" --temperature 0.8 --top-k 40)
# Measured on this project's 2-core machine (an AMD EPYC, OpenBLAS, idle), 2026-12-07: 277 ms an
# iteration (the dry run planned 230), 170 s in all with the corpus made (on the license texts as
# laid out; the prose corpus has the same shapes a step). On the prose corpus (make_corpus.sh
# --prose, 792 paragraphs): validation loss 4.02 nats (PPL 56), and the sample reads as license
# prose: "You may add a fee for a free software which the Program to the Program or otherwise,
# you distribute the terms of the Library, and modification of this License, ..."
TINY_RANKS=1
TINY=(--train-iters 10 --lr-warmup-iters 2 --log-interval 5 --eval-interval 5 --eval-iters 1 --save-interval 0
      --generate-tokens 8)

SAVE=${SAVE:-runs/gpt2-cpu}
if [ -z "${DATA:-}" ]; then   # (made when the run needs it, not for --print or --dry-run)
    DATA=runs/corpus/licenses_prose_gpt2_text_document
    if [ ! -f $DATA.idx ] && [[ " $* " != *" --print "* && " $* " != *" --dry-run "* ]]; then
        mkdir -p runs/corpus
        scripts/make_corpus.sh --prose runs/corpus/licenses_prose.jsonl
        ./preprocess --input runs/corpus/licenses_prose.jsonl --json-keys text --append-eod \
            --output-prefix runs/corpus/licenses_prose_gpt2 "${T[@]}"
    fi
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
launch "$@"
