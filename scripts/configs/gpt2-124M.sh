#!/usr/bin/env bash
# GPT-2 124M (Radford et al. 2019's smallest model) as the field reproduces it today: llm.c's
# run of 10B FineWeb tokens on one node of 8 A100 80 GB (karpathy/llm.c,
# scripts/run_gpt2_124M.sh: -e d12 -b 64 -t 1024 -d 524288 -l 0.0006 -u 700 -q 0.0 -c 0.1
# -z 1 -r 0 -v 250; AdamW's betas, eps and clipping from train_gpt2.cu's gpt2_update call:
# 0.9, 0.95, 1e-8, clip 1.0), in bf16, no recomputation, ZeRO-1 (gridgpt's always), DP 8.
# nanoGPT's recipe for the same model (karpathy/nanoGPT, config/train_gpt2.py and train.py's
# defaults) shares lr 6e-4, weight decay 0.1, betas 0.9/0.95, clip 1.0 and 1024 tokens a
# sample; where it differs, its value is in the comment: swap it in to run nanoGPT's.
#   DATA=PREFIX scripts/configs/gpt2-124M.sh [--tiny] [--print | --dry-run] [flags]   (see launch.sh)
# DATA: GPT-2 tokens (./preprocess --tokenizer-type GPT2BPETokenizer --vocab-file
# tests/data/gpt2/encoder.json --merge-file tests/data/gpt2/vocab.bpe); llm.c reads FineWeb's
# separate val shard, gridgpt splits one dataset (--split, Megatron's 969,30,1).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/configs/launch.sh

BINARY=train_gpu   # bf16, as llm.c's run (nanoGPT: bf16 autocast where the GPU has it)
GPUS=8             # llm.c: mpirun -np 8, one node of 8 A100 80 GB (nanoGPT: 8 A100 40 GB)
FULL=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --ffn-hidden-size 3072   # -e d12 (nanoGPT: n_layer 12, n_embd 768, n_head 12)
      --seq-length 1024 --max-position-embeddings 1024   # -t 1024 (nanoGPT: block_size 1024)
      --vocab-size 50257 --make-vocab-size-divisible-by 128   # GPT-2's BPE, padded to 50304 as both pad it
      --init-method-std 0.02   # GPT-2's 0.02, output projections / sqrt(2 x layers): both, and gridgpt's own
      --hidden-dropout 0 --attention-dropout 0   # llm.c trains without dropout (nanoGPT: dropout 0.0 for pretraining)
      --micro-batch-size 64 --global-batch-size 512   # -b 64 x 8 GPUs = -d 524288 tokens, no accumulation
                                                      # (nanoGPT: 12 x 5 accumulated x 8 GPUs = 480 samples, 491,520 tokens)
      --train-iters 18865   # one epoch of FineWeb 10B's train shards: DONE_00018865, 9.89B tokens (nanoGPT: max_iters 600000, 300B tokens)
      --lr 6e-4 --lr-decay-style cosine   # -l 0.0006, llm.c's default scheduler cosine (nanoGPT: learning_rate 6e-4, cosine)
      --min-lr 0   # -q 0.0: decay to zero (nanoGPT: min_lr 6e-5)
      --lr-warmup-iters 700   # -u 700 (nanoGPT: warmup_iters 2000)
      --lr-decay-iters 18865   # to the last step (nanoGPT: lr_decay_iters 600000 = max_iters)
      --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8   # gpt2_update(..., 0.9f, 0.95f, 1e-8f, ...) (nanoGPT: beta1 0.9, beta2 0.95, eps torch's 1e-8)
      --weight-decay 0.1   # -c 0.1, 2-d tensors only (nanoGPT: weight_decay 1e-1, dim >= 2 only)
      --clip-grad 1.0   # grad_clip = 1.0f (nanoGPT: grad_clip 1.0)
      --bf16
      --eval-interval 250 --eval-iters 20   # -v 250, -m 20 batches of 64 x 8 GPUs (nanoGPT: eval_interval 1000, eval_iters 200 of 12)
      --save-interval 5000   # -n 5000 (nanoGPT: at every evaluation)
      --log-interval 1 --seed 1234)
# tiny: 4 layers of 64, 4 heads, byte-level vocabulary, DP 2, 8 steps with the warm-up and the
# cosine decay to zero scaled down
TINY_RANKS=2
TINY=(--num-layers 4 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 256
      --seq-length 32 --max-position-embeddings 32 --vocab-size 257
      --micro-batch-size 2 --global-batch-size 8 --train-iters 8 --lr-warmup-iters 2 --lr-decay-iters 8
      --log-interval 1 --eval-interval 4 --eval-iters 1 --save-interval 0)
launch "$@"
