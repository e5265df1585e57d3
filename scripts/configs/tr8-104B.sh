#!/usr/bin/env bash
# BigScience tr8-104B "wide" (2021), its first shape: 32 layers of hidden 16384 with 32 heads
# (MLP 4 x hidden), GPT-2's vocabulary, fp16 with dynamic loss scaling, activation
# recomputation, TP 4 x PP 32 (one layer per stage) x DP 4 on 128 nodes of 4 V100 32 GB.
# Values from bigscience-workshop/bigscience, train/tr8-104B-wide (tr8-104B.slurm and
# chronicles; the loss scaler's from its DeepSpeed config, as tr1-13B's).
#   DATA=PREFIX scripts/configs/tr8-104B.sh [--tiny] [--print | --dry-run] [flags]   (see launch.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/configs/launch.sh

BINARY=train_gpu_fp16
GPUS=512   # 128 nodes of 4: TP 4 x PP 32 x DP 4
FULL=(--num-layers 32 --hidden-size 16384 --num-attention-heads 32
      --seq-length 2048 --max-position-embeddings 2048 --vocab-size 50257   # GPT-2's BPE
      --micro-batch-size 1 --global-batch-size 2048 --rampup-batch-size 16 16 6000000
      --train-samples 300000000 --lr 6e-5 --min-lr 6e-6 --lr-decay-style cosine
      --lr-decay-samples 126953125 --lr-warmup-samples 216320
      --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 --weight-decay 0.1 --clip-grad 1.0
      --fp16 --initial-loss-scale 4096 --loss-scale-window 500 --hysteresis 2 --min-loss-scale 1
      --checkpoint-activations
      --tensor-model-parallel-size 4 --pipeline-model-parallel-size 32
      --seed 42 --log-interval 10 --eval-interval 1000 --eval-iters 5 --save-interval 300)
# tiny: as wide as deep the other way round, still one layer per stage: 4 layers of 64,
# 4 heads, TP 2 x PP 4
TINY_RANKS=8
TINY=(--num-layers 4 --hidden-size 64 --num-attention-heads 4
      --seq-length 32 --max-position-embeddings 32 --vocab-size 257
      --global-batch-size 8 --rampup-batch-size 4 4 16 --train-samples 48
      --lr-decay-samples 40 --lr-warmup-samples 8 --initial-loss-scale 65536 --loss-scale-window 3
      --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4
      --log-interval 1 --eval-interval 4 --eval-iters 1 --save-interval 0)
launch "$@"
