#!/usr/bin/env bash
# Llama 3 8B (Meta, "The Llama 3 Herd of Models", Dubey et al. 2024, arXiv 2407.21783) on one node
# of 8 H100 80 GB, as Megatron-LM's own recipe trains it (NVIDIA/Megatron-LM,
# examples/llama/train_llama3_8b_h100_fp8.sh: 1 node of 8 GPUs, MBS 1, GBS 128, its schedule and
# optimizer; its flags in tests/data/megatron_examples/llama3_8b_h100_fp8.flags). The shape is
# Meta's: the paper's Table 3 and the Hugging Face config.json of meta-llama/Meta-Llama-3-8B
# (num_hidden_layers 32, hidden_size 4096, intermediate_size 14336, num_attention_heads 32,
# num_key_value_heads 8, vocab_size 128256, max_position_embeddings 8192, rope_theta 500000.0,
# rms_norm_eps 1e-05, hidden_act silu, tie_word_embeddings false, attention_bias false,
# mlp_bias false, torch_dtype bfloat16). Where Megatron-LM's recipe differs, its value is in the
# comment. The layout is gridgpt's (see below and docs/model.md, "Llama 3 8B, planned").
#   DATA=PREFIX scripts/configs/llama3-8B.sh [--tiny] [--print | --dry-run] [flags]   (see launch.sh)
# DATA: Llama 3's token ids (128,256 of them) in a Megatron .bin/.idx, made by Megatron-LM's
# tools/preprocess_data.py --tokenizer-type HuggingFaceTokenizer (gridgpt's ./preprocess has
# GPT-2's BPE alone; the files are the same format, and the trainer reads ids as they are).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/configs/launch.sh

BINARY=train_gpu   # bf16 (Megatron-LM's recipe: --bf16 with fp8 matmuls, --fp8-format hybrid; gridgpt has no fp8)
GPUS=8             # GPUS_PER_NODE=8, NUM_NODES=1
FULL=(--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 14336   # Table 3: 32 layers, 4,096, FFN 14,336, 32 heads
      --group-query-attention --num-query-groups 8   # Table 3: 8 key/value heads (num_key_value_heads 8)
      --seq-length 8192 --max-position-embeddings 8192   # an 8K context (max_position_embeddings 8192; the recipe's SEQ_LENGTH)
      --vocab-size 128256 --make-vocab-size-divisible-by 128   # Table 3: 128,000; config.json: 128256 (with the reserved special ids)
      --position-embedding-type rope --rotary-base 500000   # Table 3: RoPE, theta 500,000 (Megatron-LM's recipe: --rotary-base 1000000)
      --normalization RMSNorm --norm-epsilon 1e-5   # rms_norm_eps 1e-05 (Megatron-LM's recipe adds --apply-layernorm-1p: gridgpt refuses it)
      --swiglu   # Table 3: SwiGLU (hidden_act silu)
      --hidden-dropout 0 --attention-dropout 0   # Megatron-LM's recipe (attention_dropout 0.0)
      --untie-embeddings-and-output-weights   # tie_word_embeddings false
      --disable-bias-linear   # attention_bias false, mlp_bias false
      --init-method-std 0.0134   # Megatron-LM's recipe (config.json's initializer_range: 0.02)
      --micro-batch-size 1 --global-batch-size 128   # the recipe's: 128 x 8,192 = 1M tokens a step
      --train-samples 1953125000 --lr-warmup-samples 3906252 --lr-decay-samples 1949218748   # the recipe's (16T tokens; Llama 3: over 15T)
      --lr 1.5e-4 --min-lr 1e-5 --lr-decay-style cosine   # the recipe's (Table 3's peak for 8B: 3e-4; the recipe's --decoupled-lr: refused)
      --adam-beta1 0.9 --adam-beta2 0.95 --weight-decay 0.1 --clip-grad 1.0   # the recipe's
      --bf16
      # gridgpt's layout: TP 2 with sequence parallelism, DP 4. The recipe runs TP 1 with fp8
      # and bf16 gradients; gridgpt's fp32 gradients (32 GB at TP 1) leave TP 1 room only with
      # every layer recomputed (--checkpoint-activations), which the planner prices slower
      --tensor-model-parallel-size 2 --sequence-parallel
      --overlap-grad-reduce --overlap-param-gather   # the recipe's DDP_ARGS (with --use-distributed-optimizer: gridgpt's ZeRO-1 always)
      --log-interval 1 --eval-interval 100 --eval-iters 32 --save-interval 1000)   # the recipe's
# tiny: 4 layers of 64 (FFN 3.5 h, as 14,336 / 4,096), 4 heads in 2 query groups (one per
# tensor rank), byte-level vocabulary, TP 2 x PP 2 (the untied output layer on the last stage,
# no tied all-reduce), 8 steps with the warm-up and the cosine decay scaled down
TINY_RANKS=4
TINY=(--num-layers 4 --hidden-size 64 --num-attention-heads 4 --num-query-groups 2 --ffn-hidden-size 224
      --seq-length 32 --max-position-embeddings 32 --vocab-size 257
      --global-batch-size 8 --train-samples 64 --lr-warmup-samples 8 --lr-decay-samples 48
      --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
      --log-interval 1 --eval-interval 4 --eval-iters 1 --save-interval 0)
launch "$@"
