#!/usr/bin/env bash
# Mixtral 8x7B (Mistral AI, "Mixtral of Experts", Jiang et al. 2024, arXiv 2401.04088) on 64 H100
# 80 GB, the layout gridgpt's planner prices (docs/moe-plan.md): TP 1, PP 4, DP 16 with expert
# parallelism 8 of the DP ranks. The shape is the paper's Table 1 and the Hugging Face config.json
# of mistralai/Mixtral-8x7B-v0.1 (num_hidden_layers 32, hidden_size 4096, intermediate_size
# 14336, num_attention_heads 32, num_key_value_heads 8, num_local_experts 8,
# num_experts_per_tok 2, vocab_size 32000, max_position_embeddings 32768, rope_theta 1e6,
# rms_norm_eps 1e-05, hidden_act silu, tie_word_embeddings false, no linear biases); the
# training recipe is not published: the batch and schedule below are assumptions, in the
# comments.
#   DATA=PREFIX scripts/configs/mixtral-8x7B.sh [--tiny] [--print | --dry-run] [flags]   (see launch.sh)
# --dry-run plans this layout (docs/moe-plan.md); --tiny trains a small MoE at PP 2 x DP 2, EP 2.
# DATA: Mixtral's token ids (32,000, its SentencePiece vocabulary) in a Megatron .bin/.idx, made by
# Megatron-LM's tools/preprocess_data.py (gridgpt's ./preprocess has GPT-2's BPE alone).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/configs/launch.sh

BINARY=train_gpu   # bf16
GPUS=64            # 8 nodes of 8
FULL=(--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 14336   # Table 1: 32 layers, 4,096, 14,336, 32 heads
      --group-query-attention --num-query-groups 8   # Table 1: 8 key/value heads
      --num-experts 8 --moe-router-topk 2   # Table 1: 8 experts, 2 a token (num_local_experts, num_experts_per_tok)
      --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 0.02   # router_aux_loss_coef 0.02 (config.json)
      --seq-length 4096 --max-position-embeddings 32768   # 4,096 a sample (assumed: the paper trains a 32k context)
      --vocab-size 32000 --make-vocab-size-divisible-by 128   # Table 1: 32,000
      --position-embedding-type rope --rotary-base 1000000   # rope_theta 1e6
      --normalization RMSNorm --norm-epsilon 1e-5 --swiglu   # rms_norm_eps 1e-05, hidden_act silu
      --hidden-dropout 0 --attention-dropout 0   # attention_dropout 0.0
      --untie-embeddings-and-output-weights --disable-bias-linear   # tie_word_embeddings false; no biases
      --micro-batch-size 1 --global-batch-size 256   # assumed: 256 x 4,096 = 1M tokens a step
      --train-iters 250000 --lr-warmup-iters 2000 --lr 1e-4 --min-lr 1e-5 --lr-decay-style cosine   # assumed
      --adam-beta1 0.9 --adam-beta2 0.95 --weight-decay 0.1 --clip-grad 1.0   # assumed (Llama's)
      --bf16
      # the layout: the experts (about 1.4 billion parameters a layer, 45 of the 46.7 billion)
      # split 8 ways over the DP x CP ranks, 4 stages, each sequence over 2 context ranks: the
      # experts' rows are laid out at the dropless worst case (docs/moe-plan.md), which at CP 1
      # does not fit 80 GB; without EP the model state alone does not (EP 2 is the smallest)
      --tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 --context-parallel-size 2
      --expert-model-parallel-size 8
      --log-interval 1 --eval-interval 1000 --eval-iters 32 --save-interval 1000)
# tiny: 4 layers of 64, 4 heads in 2 query groups, 4 experts of 224 (3.5 h) with 2 a token,
# byte-level vocabulary, PP 2 x DP 2 with every rank holding every expert (EP 1: the trainer's)
TINY_RANKS=4
TINY=(--num-layers 4 --hidden-size 64 --num-attention-heads 4 --num-query-groups 2 --ffn-hidden-size 224 --num-experts 4
      --seq-length 32 --max-position-embeddings 32 --vocab-size 257 --micro-batch-size 2
      --global-batch-size 8 --train-iters 8 --lr-warmup-iters 2
      --pipeline-model-parallel-size 2 --expert-model-parallel-size 2
      --log-interval 1 --eval-interval 4 --eval-iters 1 --save-interval 0)
launch "$@"
