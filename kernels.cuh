/*
kernels.cuh — every numeric kernel of gridgpt.

Each op is written twice, and the two versions sit side by side, op by op:
  - a plain-C reference, `<op>_cpu`, that states the math in the simplest loops we can write
    (a few OpenMP pragmas, no intrinsics, fp32 with fp64 where a sum needs it; the inner
    loops in shapes the compiler puts on vector lanes: the helpers before the first op);
  - right below it, under `#ifdef __CUDACC__`, its CUDA kernels and the launcher `<op>`.
The rest of the trainer calls `<op>` and does not know which one it got: on the CPU build
`<op>` is the reference itself (the `#else` branch of each op's section says so).

Conventions every kernel keeps:
  - Activations and parameters are `floatX` (float on the CPU; bf16 on the GPU, or fp16 when
    built with -DGRIDGPT_FP16); gradients of parameters, LayerNorm statistics, losses and
    optimizer state are always float. Kernels convert with to_floatX / floatX_to_float.
  - Parameter-gradient outputs ACCUMULATE (+=): micro-batches add into one gradient buffer.
    Activation-gradient outputs are overwritten (=), except `layernorm_backward`'s dinp,
    which adds into the residual stream's gradient (that is the residual's backward),
    `attention_block_backward`'s fp32 dq and dkv, which add up the blocks of a sequence, and
    `moe_gather_rows_backward`'s dx when asked to (the MoE layer's input has other paths).
  - Linear weights are stored [out, in] (Megatron/PyTorch), so a linear layer is
    out[N, OC] = inp[N, C] @ W[OC, C]^T + b.
  - Reductions are deterministic: a fixed split of the work, independent of the thread
    count, so two runs with the same seed are bit-identical. One exception on the GPU:
    encoder_backward's word-embedding gradient adds with atomics (repeated tokens collide).
  - Elementwise and row kernels move floatX in 128-bit packs of 8 (x128, load_pack/store_pack)
    where a pack is whole and 16-byte aligned, one element at a time where not, so they take
    any size and any pointer. The linear layers' forward runs through cuBLASLt with the bias
    (and the MLP's GELU, its tanh form) in the GEMM's epilogue, and the GELU's backward in the
    epilogue of the GEMM before it (each shape's cuBLASLt plan made once); the rest of the GEMMs
    through cuBLAS.
  - CUDA kernels are plain `__global__ void` functions (the fused attention's are templates
    on the head size and on ALiBi, on or off), launched only through LAUNCH() (1-D grids, a fixed block size per
    op); shared memory and warp shuffles appear only in the reduction helpers and the fused
    attention's tiles; every CUDA/cuBLAS call goes through a check; all math is fp32 (fp64
    for the gradient norm), 16 bits only in memory, save the tensor cores' products of 16-bit
    inputs (mma.sync, fp32 accumulation) in the fused attention, written as PTX beside its
    emulation. So tests can run the CUDA code on a CPU emulation of CUDA (tests/emu/).

kernels.cuh is the index of kernels/: one family a file, included below in this order, each
using only what the files above it define (calls and types go down the list, as in the
rooms of the trainer):
  kernels/common.cuh           the CUDA build's shared pieces: launch, handles, reductions, packs
  kernels/random.cuh           the counter-based generator, dropout's masks, the hidden dropout
  kernels/lanes.cuh            the references' inner loops on vector lanes
  kernels/embedding.cuh        embedding, residual add, column reductions
  kernels/norms.cuh            LayerNorm, RMSNorm
  kernels/linear.cuh           matmul and cuBLASLt's epilogues, a table's rows added (rows_add)
  kernels/attention.cuh        the unfused attention, the KV cache's decode, rope
  kernels/flash_ptx.cuh        the fused attention's PTX (mma.sync, ldmatrix, cp.async) and the
                               backward's dQ turns (acquire, release, 128-bit partial sums)
  kernels/flash_attention.cuh  the fused attention, and the launchers that choose the path
  kernels/attention_blocks.cuh the attention block by block, merged by log-sum-exp: context
                               parallelism's (ring attention's) kernels
  kernels/moe.cuh              a mixture-of-experts layer's: the router's softmax and top-k, the
                               tokens sorted by expert, gathered and combined, the shared
                               expert's gate, the load-balancing and z losses
  kernels/activations.cuh      GELU, tanh and erf forms (with its linear layers), SwiGLU
  kernels/loss.cuh             the vocab-parallel cross-entropy
  kernels/optimizer.cuh        AdamW, the mean loss, the gradient norm's sum of squares
  kernels/quantize.cuh         8-bit optimizer states: the dynamic map, block-wise quantization,
                               AdamW with 8-bit moments (--use-bnb-optimizer)
*/
#pragma once
#include "device.cuh"     // checks, floatX, device memory, streams: the runtime under the kernels
#include "blas_cores.h"   // the CPU build's sgemm: OpenBLAS, and the right kernels for this CPU

#include "kernels/common.cuh"

// ============================================================================
// the ops: each `<op>_cpu` reference, then its CUDA version
// ============================================================================
// The references are compiled in every build (the tests hold the CUDA kernels against
// them) and called by the CPU build only: a build that does not call one is not a mistake.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#include "kernels/random.cuh"
#include "kernels/lanes.cuh"
#include "kernels/embedding.cuh"
#include "kernels/norms.cuh"
#include "kernels/linear.cuh"
#include "kernels/attention.cuh"
#include "kernels/flash_ptx.cuh"
#include "kernels/flash_attention.cuh"
#include "kernels/attention_blocks.cuh"
#include "kernels/moe.cuh"
#include "kernels/activations.cuh"
#include "kernels/loss.cuh"
#include "kernels/optimizer.cuh"
#include "kernels/quantize.cuh"

#pragma GCC diagnostic pop
