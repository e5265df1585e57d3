#!/usr/bin/env bash
# BigScience tr11-176B, BLOOM (2022): 70 layers of hidden 14336 with 112 heads, ALiBi, the
# embedding LayerNorm, a 250,680-token vocabulary padded to 250,880, bf16, activation
# recomputation, TP 4 x PP 12 with the stages balanced by counting the embedding and the
# output layer as layers (5, 6, ..., 6, 5), DP 8 on 48 nodes of 8 A100 80 GB (24 nodes at
# the end). Values from bigscience-workshop/bigscience, train/tr11-176B-ml (the slurm script;
# warm-up 375M tokens = 183105 samples of 2048).
#   DATA=PREFIX scripts/configs/tr11-176B-bloom.sh [--tiny] [--print | --dry-run] [flags]   (see launch.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/configs/launch.sh

BINARY=train_gpu
GPUS=384   # 48 nodes of 8: TP 4 x PP 12 x DP 8
FULL=(--num-layers 70 --hidden-size 14336 --num-attention-heads 112
      --seq-length 2048 --vocab-size 250680 --make-vocab-size-divisible-by 128   # x TP 4: 250880
      --position-embedding-type alibi --embed-layernorm --init-method-std 0.0048
      --micro-batch-size 2 --global-batch-size 2048 --rampup-batch-size 192 16 9765625
      --train-samples 220000000 --lr 6e-5 --min-lr 6e-6 --lr-decay-style cosine
      --lr-decay-samples 200000000 --lr-warmup-samples 183105
      --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 --weight-decay 0.1 --clip-grad 1.0
      --bf16 --checkpoint-activations
      --tensor-model-parallel-size 4 --pipeline-model-parallel-size 12
      --pp-partition-method 'type:transformer|embedding'
      --seed 42 --log-interval 1 --eval-interval 1000 --eval-iters 1 --save-interval 100)
# tiny: 7 layers of 48, 6 heads (not a power of two, as 112 is not), byte-level vocabulary,
# TP 2 x PP 3 balanced as BLOOM was (7 + 2 slots: 2, 3, 2 layers)
TINY_RANKS=6
TINY=(--num-layers 7 --hidden-size 48 --num-attention-heads 6
      --seq-length 32 --vocab-size 257 --init-method-std 0.02
      --micro-batch-size 1 --global-batch-size 6 --rampup-batch-size 2 2 12 --train-samples 36
      --lr-decay-samples 30 --lr-warmup-samples 6
      --tensor-model-parallel-size 2 --pipeline-model-parallel-size 3
      --log-interval 1 --eval-interval 4 --eval-iters 1 --save-interval 0)
launch "$@"
