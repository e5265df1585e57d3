#!/usr/bin/env bash
# BigScience tr1-13B (2021): a 13B GPT-2-style model on 32 GB V100s, fp16 with dynamic loss
# scaling, activation recomputation, TP 2 x PP 4 (one replica = 8 GPUs), DP 8 to 64 over the
# run (16 to 128 nodes of 4 GPUs). Values from bigscience-workshop/bigscience,
# train/tr1-13B-base (README and chronicles; the loss scaler's from its DeepSpeed config:
# initial_scale_power 12, loss_scale_window 500, hysteresis 2, min_loss_scale 1).
#   DATA=PREFIX scripts/configs/tr1-13B.sh [--tiny] [--print | --dry-run] [flags]   (see launch.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/configs/launch.sh

BINARY=train_gpu_fp16
GPUS=128   # 32 nodes of 4: DP 16, the widest DP whose micro-batch x DP divides the ramp-up's first batch of 16
FULL=(--num-layers 40 --hidden-size 5120 --num-attention-heads 32 --ffn-hidden-size 20480
      --seq-length 2048 --max-position-embeddings 2048 --vocab-size 50257   # GPT-2's BPE
      --micro-batch-size 1 --global-batch-size 1024 --rampup-batch-size 16 16 5000000
      --train-samples 300000000 --lr 1e-4 --min-lr 1e-5 --lr-decay-style cosine
      --lr-decay-samples 126953125 --lr-warmup-samples 216320
      --adam-beta1 0.9 --adam-beta2 0.999 --adam-eps 1e-8 --weight-decay 0.1 --clip-grad 1.0
      --fp16 --initial-loss-scale 4096 --loss-scale-window 500 --hysteresis 2 --min-loss-scale 1
      --checkpoint-activations
      --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4
      --seed 42 --log-interval 10 --eval-interval 1000 --eval-iters 5 --save-interval 1500)
# tiny: 4 layers of 64 (ffn 4h), 4 heads, byte-level vocabulary, TP 2 x PP 2, 8 steps with
# the ramp-up, warm-up and cosine decay scaled down
TINY_RANKS=4
TINY=(--num-layers 4 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 256
      --seq-length 32 --max-position-embeddings 32 --vocab-size 257
      --global-batch-size 8 --rampup-batch-size 2 2 16 --train-samples 56
      --lr-decay-samples 48 --lr-warmup-samples 8 --initial-loss-scale 65536 --loss-scale-window 3
      --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
      --log-interval 1 --eval-interval 4 --eval-iters 1 --save-interval 0)
launch "$@"
