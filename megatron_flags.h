/*
megatron_flags.h — Megatron-LM's and Megatron-DeepSpeed's flags that are not gridgpt's own, each
with gridgpt's verdict, in one table: config.h's parser falls back to it, --help-markdown prints
it (docs/flags.md), and the did-you-mean of an unknown flag searches it. Below it, a second
table: Megatron-LM's defaults that differ from what gridgpt does, named at start-up when a
command line leaves them (docs/megatron.md).

  - accepted: the flag (with these values) asks for what gridgpt always does; the trainer
    says so in one start-up line and goes on (a few stand for one of gridgpt's own flags:
    the `as` column);
  - refused: what Megatron would do is not in gridgpt; the error line names it.

Rules it keeps: facts about Megatron's flags (their names, values, defaults and what they do),
never its code; a flag of gridgpt's own is never a row, except for a value of it that gridgpt's
own choices lack (config.h consults the rows only where its own parse refused).
*/
#pragma once

// ----------------------------------------------------------------------------
// the table

typedef enum { MEGATRON_SWITCH, MEGATRON_VALUE, MEGATRON_LIST } MegatronArity;   // LIST: every value up to the next flag
typedef enum { MEGATRON_ACCEPTED, MEGATRON_REFUSED } MegatronVerdict;

typedef struct {
    const char* flag;      // Megatron's spelling; "--moe-*": every flag of that prefix
    MegatronArity arity;
    const char* values;    // the values the row is about, "a|b" (numbers compare as numbers); NULL: any
    MegatronVerdict verdict;
    // accepted: what gridgpt does (the start-up note); refused: "WHAT: what Megatron would do",
    // WHAT alone naming it where several refusals share one line
    const char* text;
    // accepted as one of gridgpt's flags: "--flag" (the same value), "--flag VALUE", "--flag *N" (the value x N)
    const char* as;
} MegatronFlag;

#define ACCEPT(flag, arity, values, text) {flag, MEGATRON_##arity, values, MEGATRON_ACCEPTED, text, NULL},
#define ACCEPT_AS(flag, arity, values, as, text) {flag, MEGATRON_##arity, values, MEGATRON_ACCEPTED, text, as},
#define REFUSE(flag, arity, values, text) {flag, MEGATRON_##arity, values, MEGATRON_REFUSED, text, NULL},

// A flag's rows in order: the first whose values match decides (a row of given values, then the
// row of any other value). Megatron's defaults are in the texts where they matter.
static const MegatronFlag MEGATRON_FLAGS[] = {
    // --- parallelism and the optimizer's distribution
    ACCEPT("--use-distributed-optimizer", SWITCH, NULL, "gridgpt's optimizer is always the distributed one: ZeRO-1, the "
           "fp32 master weights and Adam's moments sharded over the data-parallel ranks")
    ACCEPT("--num-distributed-optimizer-instances", VALUE, "1", "one distributed optimizer over the whole data-parallel "
           "group, gridgpt's")
    REFUSE("--num-distributed-optimizer-instances", VALUE, NULL, "several distributed-optimizer instances: Megatron-LM "
           "would shard the optimizer state within parts of the data-parallel group and replicate it across them")
    ACCEPT_AS("--data-parallel-sharding-strategy", VALUE, "no_shard", "--zero-stage 0", "taken as --zero-stage 0, "
              "the same step as ZeRO-1 (the optimizer state sharded, which changes the memory, not one number)")
    ACCEPT_AS("--data-parallel-sharding-strategy", VALUE, "optim", "--zero-stage 1", "taken as --zero-stage 1 (ZeRO-1: "
              "the optimizer state sharded over the data-parallel ranks)")
    ACCEPT_AS("--data-parallel-sharding-strategy", VALUE, "optim_grads", "--zero-stage 2", "taken as --zero-stage 2 "
              "(ZeRO-2: the gradients sharded too)")
    ACCEPT_AS("--data-parallel-sharding-strategy", VALUE, "optim_grads_params", "--zero-stage 3", "taken as --zero-stage 3 "
              "(ZeRO-3: the parameters sharded too)")
    ACCEPT("--distributed-backend", VALUE, "nccl", "the collectives are NCCL's in the GPU build (MPI only starts the "
           "ranks), MPI's in the CPU build")
    REFUSE("--distributed-backend", VALUE, NULL, "Gloo's collectives: Megatron-LM would communicate through Gloo "
           "(gridgpt: NCCL in the GPU build, MPI in the CPU build)")
    ACCEPT_AS("--distributed-timeout-minutes", VALUE, NULL, "--watchdog-timeout *60", "taken as --watchdog-timeout "
              "(seconds): gridgpt's watchdog ends a job that makes no progress that long, naming where every rank is")
    REFUSE("--hierarchical-context-parallel-sizes", LIST, NULL, "context parallelism: Megatron-LM's levels of "
           "context-parallel groups")
    ACCEPT("--ds-sequence-parallel-size", VALUE, "1", "no DeepSpeed-Ulysses sequence parallelism")
    REFUSE("--ds-sequence-parallel-size", VALUE, NULL, "DeepSpeed-Ulysses sequence parallelism: Megatron-DeepSpeed "
           "would split each sequence over ranks, all-to-all around the attention")
    ACCEPT("--moe-token-dispatcher-type", VALUE, "alltoall", "the experts' rows go to their ranks by an all-to-all "
           "(gridgpt's one dispatcher: moe.h)")
    REFUSE("--moe-token-dispatcher-type", VALUE, NULL, "another token dispatcher: Megatron-LM would gather every "
           "token on every expert rank (allgather) or use DeepEP/HybridEP (flex); gridgpt's is alltoall")
    REFUSE("--expert-tensor-parallel-size", VALUE, NULL, "mixture of experts: Megatron-LM's tensor parallelism inside "
           "each expert")
    REFUSE("--moe-*", LIST, NULL, "mixture of experts: an option of Megatron-LM's MoE that gridgpt does not have (its own: "
           "--moe-router-topk, --moe-ffn-hidden-size, --moe-layer-freq, --moe-router-pre-softmax, "
           "--moe-router-load-balancing-type, --moe-aux-loss-coeff, --moe-z-loss-coeff, "
           "--moe-shared-expert-intermediate-size, --moe-expert-capacity-factor, --moe-token-drop-policy)")
    REFUSE("--model-parallel-size", VALUE, NULL, "the old name of --tensor-model-parallel-size (Megatron-LM refuses "
           "it too)")
    REFUSE("--pipeline-model-parallel-layout", VALUE, NULL, "a pipeline layout string: Megatron-LM would place the "
           "embedding, layers and loss stage by stage as written (gridgpt: --pp-partition-method, "
           "--decoder-first/last-pipeline-num-layers)")
    REFUSE("--account-for-embedding-in-pipeline-split", SWITCH, NULL, "the embedding counted as a layer of the "
           "pipeline split (gridgpt: --pp-partition-method 'type:transformer|embedding')")
    REFUSE("--account-for-loss-in-pipeline-split", SWITCH, NULL, "the loss counted as a layer of the pipeline split "
           "(gridgpt: --pp-partition-method 'type:transformer|embedding')")
    ACCEPT("--no-pipeline-parallel", SWITCH, NULL, "gridgpt pipelines only with --pipeline-model-parallel-size > 1")
    REFUSE("--use-tp-pp-dp-mapping", SWITCH, NULL, "another rank order: Megatron-LM would order the ranks TP, PP, DP "
           "(gridgpt's is Megatron's default: TP fastest, then DP, then PP)")
    REFUSE("--tp-comm-*", LIST, NULL, "tensor-parallel communication overlapped with the matmuls: Transformer Engine's "
           "userbuffers")
    REFUSE("--defer-embedding-wgrad-compute", SWITCH, NULL, "deferred output-layer weight gradients: Megatron-LM would "
           "compute them at the pipeline flush")
    REFUSE("--ddp-num-buckets", VALUE, NULL, "a count of gradient buckets (gridgpt: --ddp-bucket-size)")
    REFUSE("--use-torch-fsdp2", SWITCH, NULL, "PyTorch FSDP2: the parameters sharded too (gridgpt shards the optimizer "
           "state: ZeRO-1)")
    REFUSE("--use-megatron-fsdp", SWITCH, NULL, "Megatron FSDP: the parameters and gradients sharded too (gridgpt "
           "shards the optimizer state: ZeRO-1)")
    ACCEPT("--deepspeed", SWITCH, NULL, "gridgpt is its own engine: ZeRO-1, the 1F1B pipeline and the loss scaler "
           "all run from these flags")
    REFUSE("--deepspeed_config", VALUE, NULL, "a DeepSpeed JSON config: gridgpt reads no config file (give its "
           "batch sizes, precision, clipping and loss scaling as flags)")
    ACCEPT("--deepspeed-activation-checkpointing", SWITCH, NULL, "the recomputation is gridgpt's own "
           "(--checkpoint-activations, --recompute-*)")
    REFUSE("--partition-activations", SWITCH, NULL, "partitioned activations: DeepSpeed would split the saved "
           "activations over the tensor-parallel ranks")
    REFUSE("--distribute-saved-activations", SWITCH, NULL, "distributed saved activations: Megatron-LM would split "
           "each recomputed chunk's input over the tensor-parallel ranks")
    ACCEPT_AS("--checkpoint-num-layers", VALUE, NULL, "--recompute-num-layers", "taken as --recompute-num-layers "
              "(layers a recomputed chunk holds)")
    ACCEPT("--cpu-offloading-num-layers", VALUE, "0", "no activations offloaded, gridgpt's way")
    REFUSE("--cpu-offloading-num-layers", VALUE, NULL, "activation offloading: Megatron-LM would keep layers' "
           "activations in CPU memory")
    REFUSE("--optimizer-cpu-offload", SWITCH, NULL, "optimizer offloading: Megatron-LM would keep the optimizer state "
           "in CPU memory and step there")

    // --- precision
    ACCEPT("--accumulate-allreduce-grads-in-fp32", SWITCH, NULL, "gradients are accumulated and reduced in fp32, always")
    REFUSE("--grad-reduce-in-bf16", SWITCH, NULL, "bf16 gradient reduction: Megatron-LM would send and sum the "
           "data-parallel gradients in bf16 (gridgpt: fp32, always)")
    ACCEPT("--attention-softmax-in-fp32", SWITCH, NULL, "the attention's softmax computes in fp32, always")
    ACCEPT("--apply-query-key-layer-scaling", SWITCH, NULL, "the same attention: Megatron-LM divides the scores by "
           "the layer number and multiplies it back in an fp32 softmax, a guard of fp16's range; gridgpt's scores and "
           "softmax are fp32")
    ACCEPT("--no-query-key-layer-scaling", SWITCH, NULL, "no query-key layer scaling: gridgpt's scores and softmax are "
           "fp32")
    REFUSE("--fp32-residual-connection", SWITCH, NULL, "an fp32 residual stream: Megatron-LM would keep the residuals "
           "in fp32 (gridgpt's are in the compute precision)")
    REFUSE("--fp16-lm-cross-entropy", SWITCH, NULL, "an fp16 cross-entropy: Megatron-LM would compute the loss of "
           "the logits in fp16")
    REFUSE("--fp8-*", LIST, NULL, "fp8: Megatron-LM would run the matmuls in fp8 through Transformer Engine (gridgpt "
           "computes in bf16 or fp16 on GPUs, fp32 on CPUs)")
    REFUSE("--fp4-*", LIST, NULL, "fp4: Megatron-LM would run the matmuls in fp4 through Transformer Engine")
    REFUSE("--first-last-layers-bf16", SWITCH, NULL, "fp8: Megatron-LM's bf16 first and last layers of an fp8 model")
    ACCEPT("--transformer-impl", VALUE, "local", "gridgpt's layers are its own kernels, as Megatron-LM's local ones "
           "(not Transformer Engine's)")
    ACCEPT("--transformer-impl", VALUE, "transformer_engine", "the same layers, computed by gridgpt's own kernels: "
           "Transformer Engine's (Megatron-LM HEAD's default) fuse each LayerNorm into the next linear layer and run "
           "the attention in their own kernels, the same model and math (its fp8 is --fp8-*, refused apart)")

    // --- the model
    ACCEPT("--kv-channels", VALUE, NULL, "the head size, which is --hidden-size / --num-attention-heads in gridgpt "
           "(config.h refuses a --kv-channels that differs)")
    REFUSE("--position-embedding-type", VALUE, NULL, "other position embeddings: Megatron-LM's relative, multimodal "
           "rotary (mrope) or none (gridgpt: learned_absolute, alibi, rope)")
    ACCEPT_AS("--use-rotary-position-embeddings", SWITCH, NULL, "--position-embedding-type rope", "taken as "
              "--position-embedding-type rope (Megatron-LM's old spelling)")
    REFUSE("--rotary-interleaved", SWITCH, NULL, "interleaved rotary pairs: Megatron-LM would turn dims (2i, 2i + 1) "
           "together (gridgpt turns dim i with i + r/2: Megatron-LM's default and Hugging Face Llama's)")
    REFUSE("--use-rope-scaling", SWITCH, NULL, "rotary frequency scaling: Megatron-LM would stretch the low "
           "frequencies as Llama 3.1 (gridgpt: the plain frequencies of Llama 2 and 3)")
    REFUSE("--rope-scaling-factor", VALUE, NULL, "rotary frequency scaling: Llama 3.1's factor (see --use-rope-scaling)")
    ACCEPT("--no-rope-fusion", SWITCH, NULL, "gridgpt's rotary embedding is its own kernel, one pass over q and k")
    REFUSE("--apply-layernorm-1p", SWITCH, NULL, "zero-centred LayerNorm weights: Megatron-LM would store each "
           "LayerNorm weight as 1 + w")
    REFUSE("--apply-residual-connection-post-layernorm", SWITCH, NULL, "post-LayerNorm residuals: Megatron-LM would "
           "take the residual after the LayerNorm, BERT's order (gridgpt's blocks are pre-LayerNorm, GPT-2's)")
    ACCEPT("--openai-gelu", SWITCH, NULL, "GPT-2's tanh approximation is gridgpt's GELU (--gelu tanh), also where "
           "--no-bias-gelu-fusion or --disable-bias-linear would make it the exact one, as in Megatron-LM's legacy model "
           "and Megatron-DeepSpeed")
    REFUSE("--squared-relu", SWITCH, NULL, "squared ReLU: Megatron-LM's MLP activation instead of GELU")
    REFUSE("--quick-geglu", SWITCH, NULL, "quick GeGLU: Megatron-LM's gated MLP activation instead of GELU")
    REFUSE("--no-position-embedding", SWITCH, NULL, "no position embeddings: Megatron-LM would add none")
    REFUSE("--multi-latent-attention", SWITCH, NULL, "multi-latent attention: DeepSeek's compressed keys and values")
    REFUSE("--mtp-*", LIST, NULL, "multi-token prediction: Megatron-LM would add layers predicting further tokens")
    REFUSE("--window-size", VALUE, NULL, "sliding-window attention: Megatron-LM would let each token see only a "
           "window of keys")
    REFUSE("--encoder-num-layers", VALUE, NULL, "an encoder: Megatron-LM's encoder-decoder models (T5's)")
    REFUSE("--retro-*", LIST, NULL, "Retro: retrieval-augmented pretraining")
    REFUSE("--heterogeneous-layers-config-*", LIST, NULL, "heterogeneous layers: a different shape for each layer")
    REFUSE("--spec", LIST, NULL, "a layer spec: Megatron-LM would build the layers from a Python module")
    REFUSE("--init-method-xavier-uniform", SWITCH, NULL, "Xavier's uniform init: Megatron-LM would initialize the "
           "weights uniformly (gridgpt: normal, --init-method-std)")
    REFUSE("--embedding-init-method-std", VALUE, NULL, "a separate init for the embedding: Megatron-LM would draw it "
           "with this std, and not decay it")
    REFUSE("--data-parallel-random-init", SWITCH, NULL, "different initial weights on each data-parallel rank")
    ACCEPT("--use-cpu-initialization", SWITCH, NULL, "gridgpt's initial weights are the same in every layout already: "
           "a pure function of the seed, the tensor and the element")

    // --- kernels, fusions and other ways of computing the same thing
    ACCEPT_AS("--use-flash-attn", SWITCH, NULL, "--attention-backend flash", "taken as --attention-backend flash, "
              "gridgpt's FlashAttention-2-class kernel (GPU build; head size 64 or 128)")
    ACCEPT_AS("--use-flash-attn-v1", SWITCH, NULL, "--attention-backend flash", "taken as --attention-backend flash, "
              "gridgpt's FlashAttention-2-class kernel (GPU build; head size 64 or 128)")
    ACCEPT_AS("--use-flash-attn-v2", SWITCH, NULL, "--attention-backend flash", "taken as --attention-backend flash, "
              "gridgpt's FlashAttention-2-class kernel (GPU build; head size 64 or 128)")
    ACCEPT_AS("--use-flash-attn-triton", SWITCH, NULL, "--attention-backend flash", "taken as --attention-backend "
              "flash, gridgpt's FlashAttention-2-class kernel (GPU build; head size 64 or 128)")
    ACCEPT_AS("--attention-backend", VALUE, "fused", "--attention-backend auto", "taken as auto: gridgpt's own fused "
              "attention (flash) stands in for cuDNN's where the head size allows (64 or 128), unfused elsewhere")
    ACCEPT_AS("--attention-backend", VALUE, "local", "--attention-backend unfused", "taken as unfused: attention "
              "as matmuls and a softmax, as Megatron-LM's local one")
    ACCEPT("--no-masked-softmax-fusion", SWITCH, NULL, "the same math: gridgpt's attention is its own kernels (the "
           "masking and the softmax fused on the GPU)")
    ACCEPT("--no-bias-gelu-fusion", SWITCH, NULL, "the GELU is then the exact (erf) one, as Megatron-LM's unfused "
           "GELU (--gelu erf; its fused bias-GELU, the default, computes the tanh form; nothing to change with --swiglu)")
    ACCEPT("--no-bias-dropout-fusion", SWITCH, NULL, "the same math: gridgpt's own kernels (the bias in the product, "
           "the dropout a pass, the residual add fused with the next LayerNorm)")
    ACCEPT("--no-bias-swiglu-fusion", SWITCH, NULL, "no bias-SwiGLU fusion to turn off: gridgpt's own kernels")
    ACCEPT("--no-persist-layer-norm", SWITCH, NULL, "gridgpt's LayerNorm is its own kernel")
    ACCEPT("--no-gradient-accumulation-fusion", SWITCH, NULL, "gridgpt's own weight-gradient matmuls, accumulating "
           "into the fp32 gradients")
    ACCEPT("--no-async-tensor-model-parallel-allreduce", SWITCH, NULL, "the same math: Megatron-DeepSpeed would stop "
           "overlapping the tensor-parallel all-reduce of the input gradient with the weight-gradient matmul, a question "
           "of speed (Megatron-LM ignored it once deprecated, and HEAD no longer has it: its argparse would stop at it)")
    ACCEPT("--cross-entropy-loss-fusion", SWITCH, NULL, "gridgpt's vocab-parallel cross-entropy is one fused pass of "
           "its own already")
    ACCEPT("--use-mcore-models", SWITCH, NULL, "gridgpt's GPT (Megatron-LM ignores the flag: Megatron Core's models "
           "are its default)")
    ACCEPT("--use-legacy-models", SWITCH, NULL, "the same GPT: gridgpt has one implementation of it")
    ACCEPT("--manual-gc", SWITCH, NULL, "no Python garbage collector: gridgpt is C")
    ACCEPT("--manual-gc-interval", VALUE, NULL, "no Python garbage collector: gridgpt is C")
    ACCEPT("--no-manual-gc-eval", SWITCH, NULL, "no Python garbage collector: gridgpt is C")
    ACCEPT("--empty-unused-memory-level", VALUE, "0|1|2", "gridgpt allocates everything once at start: no cache of "
           "memory to empty")
    ACCEPT("--calculate-per-token-loss", SWITCH, NULL, "each token counts the same: gridgpt's loss masks no token and "
           "each micro-batch holds the same tokens, so its mean is the per-token mean")
    ACCEPT("--no-clone-scatter-output-in-embedding", SWITCH, NULL, "gridgpt's embedding is its own kernel")
    ACCEPT("--abort-on-unmet-fused-kernel-constraints", SWITCH, NULL, "nothing to abort: Megatron-DeepSpeed would stop "
           "rather than fall back to its unfused softmax when its fused one's limits (sequence length, batch, precision) "
           "are not met; gridgpt's attention is its own kernels at every sequence length (and --attention-backend flash "
           "refuses a head size its kernels lack rather than fall back)")
    REFUSE("--enable-cuda-graph", SWITCH, NULL, "CUDA graphs: Megatron-LM would capture and replay the layers' "
           "kernels")
    ACCEPT("--cuda-graph-impl", VALUE, "none", "no CUDA graphs, gridgpt's way (Megatron-LM's default)")
    REFUSE("--cuda-graph-*", LIST, NULL, "CUDA graphs: Megatron-LM would capture and replay the layers' kernels")

    // --- data and tokenizer
    ACCEPT("--num-workers", VALUE, NULL, "the loader has no workers: samples are read from the mmap'd files in the "
           "training thread")
    ACCEPT("--valid-num-workers", VALUE, NULL, "the loader has no workers: the validation samples too are read from the "
           "mmap'd files in the training thread")
    ACCEPT("--num-dataset-builder-threads", VALUE, NULL, "rank 0 builds the sample index (cached) and every rank reads it")
    ACCEPT("--no-mmap-bin-files", SWITCH, NULL, "the same tokens: gridgpt always mmaps the .bin files")
    ACCEPT("--mmap-warmup", SWITCH, NULL, "the same tokens: gridgpt mmaps the .bin files and reads them as needed")
    ACCEPT("--data-impl", VALUE, "mmap|infer", "Megatron's mmap indexed dataset (MMIDIDX) is gridgpt's format")
    REFUSE("--data-impl", VALUE, NULL, "the lazy or cached indexed datasets: older formats (gridgpt reads the mmap one, "
           "MMIDIDX)")
    ACCEPT("--no-create-attention-mask-in-dataloader", SWITCH, NULL, "no attention-mask tensor: the causal mask is in "
           "gridgpt's kernels")
    ACCEPT("--dataloader-type", VALUE, "single", "one pass over the samples in the order of the sample index, "
           "gridgpt's loader")
    REFUSE("--dataloader-type", VALUE, NULL, "another data loader: Megatron-LM's cyclic (random order, again and "
           "again) or external one")
    REFUSE("--mock-data", SWITCH, NULL, "mock data: Megatron-LM would train on generated samples (gridgpt: "
           "./preprocess makes a dataset)")
    REFUSE("--reset-position-ids", SWITCH, NULL, "positions restarting after each end-of-document token")
    REFUSE("--reset-attention-mask", SWITCH, NULL, "attention stopping at end-of-document tokens")
    REFUSE("--eod-mask-loss", SWITCH, NULL, "the end-of-document tokens' loss masked out")
    REFUSE("--data-args-path", VALUE, NULL, "data paths read from a file (give --data-path)")
    REFUSE("--per-split-data-args-path", VALUE, NULL, "per-split data paths read from a file (give "
           "--train-data-path, --valid-data-path, --test-data-path)")
    REFUSE("--multiple-validation-sets", SWITCH, NULL, "a loss for each validation dataset")
    REFUSE("--train-weighted-split-paths", LIST, NULL, "weighted split paths: Megatron-DeepSpeed would train on a group "
           "of datasets, each with its weight and its own document range START:END (gridgpt: --train-data-path with "
           "weights, or --data-path with --split)")
    REFUSE("--valid-weighted-split-paths", LIST, NULL, "weighted split paths: Megatron-DeepSpeed would evaluate each "
           "named group of datasets (weights and document ranges START:END) apart, a loss for each (gridgpt: one "
           "--valid-data-path blend, one loss)")
    REFUSE("--test-weighted-split-paths", LIST, NULL, "weighted split paths: Megatron-DeepSpeed would test each named "
           "group of datasets (weights and document ranges START:END) apart (gridgpt: one --test-data-path blend)")
    REFUSE("--train-weighted-split-paths-path", VALUE, NULL, "weighted split paths: Megatron-DeepSpeed would read the "
           "training group of datasets (weights and document ranges START:END) from this file (gridgpt: "
           "--train-data-path with weights, or --data-path with --split)")
    REFUSE("--valid-weighted-split-paths-path", VALUE, NULL, "weighted split paths: Megatron-DeepSpeed would read named "
           "validation groups (weights and document ranges START:END) from this file and report a loss for each "
           "(gridgpt: one --valid-data-path blend, one loss)")
    REFUSE("--test-weighted-split-paths-path", VALUE, NULL, "weighted split paths: Megatron-DeepSpeed would read named "
           "test groups (weights and document ranges START:END) from this file (gridgpt: one --test-data-path blend)")
    ACCEPT("--tokenizer-type", VALUE, "NullTokenizer", "no tokenizer: the data's token ids as they are, gridgpt's "
           "way without --tokenizer-type (give --vocab-size)")
    REFUSE("--tokenizer-type", VALUE, NULL, "another tokenizer: gridgpt has GPT-2's byte-level BPE (GPT2BPETokenizer), "
           "or none (NullTokenizer)")
    REFUSE("--tokenizer-model", VALUE, NULL, "a SentencePiece, tiktoken or Hugging Face tokenizer model")
    REFUSE("--tokenizer-name-or-path", VALUE, NULL, "a Hugging Face tokenizer: Megatron-DeepSpeed would load it "
           "(PretrainedFromHF) and take the vocabulary's size from it (gridgpt has GPT-2's BPE, or reads the token ids "
           "as they are: give --vocab-size, the tokenizer's length, instead of the tokenizer)")
    REFUSE("--tiktoken-*", LIST, NULL, "tiktoken's tokenizers")
    ACCEPT("--vocab-extra-ids", VALUE, "0", "no extra vocabulary ids")
    REFUSE("--vocab-extra-ids", VALUE, NULL, "extra vocabulary ids: T5's sentinel tokens")
    REFUSE("--padded-vocab-size", VALUE, NULL, "a given padded vocabulary (gridgpt pads --vocab-size by "
           "--make-vocab-size-divisible-by x TP)")
    ACCEPT("--pad-vocab-size-to", VALUE, NULL, "the vocabulary padded to exactly that many rows, when that is where "
           "gridgpt pads it (--vocab-size up to a multiple of --make-vocab-size-divisible-by x TP), checked once the "
           "vocabulary is known (config.h refuses another size)")

    // --- training, the optimizer and the learning rate
    ACCEPT("--optimizer", VALUE, "adam", "Megatron-LM's adam is Adam with decoupled weight decay (AdamW): gridgpt's "
           "optimizer")
    REFUSE("--optimizer", VALUE, NULL, "another optimizer: Megatron-LM's SGD or Muon (gridgpt has AdamW)")
    REFUSE("--muon-*", LIST, NULL, "the Muon optimizer")
    ACCEPT("--weight-decay-incr-style", VALUE, "constant", "a constant weight decay, gridgpt's")
    REFUSE("--weight-decay-incr-style", VALUE, NULL, "a changing weight decay: Megatron-LM would move it from "
           "--start-weight-decay to --end-weight-decay")
    REFUSE("--start-weight-decay", VALUE, NULL, "a changing weight decay: its start")
    REFUSE("--end-weight-decay", VALUE, NULL, "a changing weight decay: its end")
    ACCEPT("--lr-warmup-init", VALUE, "0", "the warm-up starts from a learning rate of 0, gridgpt's")
    REFUSE("--lr-warmup-init", VALUE, NULL, "a warm-up from another learning rate than 0")
    REFUSE("--lr-decay-style", VALUE, "WSD", "the warmup-stable-decay schedule (WSD)")
    REFUSE("--lr-wsd-*", LIST, NULL, "the warmup-stable-decay schedule (WSD)")
    REFUSE("--decoupled-lr", VALUE, NULL, "a decoupled learning rate: Megatron-LM would give the input and output "
           "layers their own")
    REFUSE("--decoupled-min-lr", VALUE, NULL, "a decoupled learning rate: the input and output layers' own minimum")
    ACCEPT_AS("--use-checkpoint-opt_param-scheduler", SWITCH, NULL, "--use-checkpoint-opt-param-scheduler 1", "Megatron-LM's "
              "spelling, taken as --use-checkpoint-opt-param-scheduler: a resume goes on with the checkpoint's schedule")
    ACCEPT_AS("--override-opt_param-scheduler", SWITCH, NULL, "--override-opt-param-scheduler 1", "Megatron-LM's "
              "spelling, taken as --override-opt-param-scheduler: a resume goes on with this run's schedule")
    REFUSE("--train-tokens", VALUE, NULL, "a length in tokens (gridgpt: --train-iters or --train-samples)")
    REFUSE("--lr-decay-tokens", VALUE, NULL, "a length in tokens (gridgpt: --lr-decay-iters or --lr-decay-samples)")
    REFUSE("--lr-warmup-tokens", VALUE, NULL, "a length in tokens (gridgpt: --lr-warmup-iters or --lr-warmup-samples)")
    REFUSE("--decrease-batch-size-if-needed", SWITCH, NULL, "a smaller global batch when fewer data-parallel ranks "
           "come back")
    REFUSE("--iterations-to-skip", LIST, NULL, "skipping the steps of given iterations")
    REFUSE("--curriculum-learning*", LIST, NULL, "curriculum learning: Megatron-DeepSpeed's growing sequence length")
    ACCEPT("--rerun-mode", VALUE, "disabled", "no re-runs: gridgpt counts a step whose gradients are not finite as "
           "skipped (the log line's count)")
    REFUSE("--rerun-mode", VALUE, NULL, "the rerun state machine: Megatron-LM would re-run a step whose loss or "
           "gradients look wrong, to tell a transient fault from a persistent one")
    REFUSE("--error-injection-*", LIST, NULL, "the rerun state machine's fault injection")
    REFUSE("--check-weight-hash-across-dp-replicas-interval", VALUE, NULL, "a check that the data-parallel replicas' "
           "weights agree")
    ACCEPT("--no-check-for-nan-in-loss-and-grad", SWITCH, NULL, "gridgpt does not stop at a NaN or infinite loss or "
           "gradient norm: it skips that step's update and counts it (the log line's skipped and nan iterations), where "
           "Megatron-LM with its check off would apply the step (unless fp16's loss scaler skips it)")

    // --- checkpoints, exit and restart
    ACCEPT("--exit-signal-handler", SWITCH, NULL, "gridgpt always saves and exits on SIGTERM (and SIGUSR1, SIGINT, "
           "SIGHUP)")
    ACCEPT("--use-checkpoint-args", SWITCH, NULL, "the model's shape comes from --load's checkpoint for each model "
           "flag not given (one given that differs is refused)")
    REFUSE("--exit-on-missing-checkpoint", SWITCH, NULL, "exit when --load holds no checkpoint (gridgpt starts from "
           "scratch then, and says so)")
    REFUSE("--kill-switch-path", VALUE, NULL, "a kill switch: Megatron-DeepSpeed would exit when this file exists, at "
           "start-up before any step, and before each iteration once training (saving a checkpoint); gridgpt checks no "
           "file (SIGTERM or SIGUSR1 stop it with a checkpoint, as --exit-duration-in-mins does)")
    REFUSE("--no-save-optim", SWITCH, NULL, "checkpoints without the optimizer state")
    REFUSE("--no-save-rng", SWITCH, NULL, "checkpoints without the RNG state")
    REFUSE("--ckpt-*", LIST, NULL, "Megatron-LM's checkpoint formats and their options: gridgpt writes its own, which "
           "any layout loads (--export-hf writes a Hugging Face model)")
    ACCEPT("--use-dist-ckpt", SWITCH, NULL, "no effect in Megatron-LM HEAD (deprecated: --ckpt-format chooses the "
           "format); gridgpt writes its own checkpoints, which any layout loads")
    REFUSE("--auto-detect-ckpt-format", SWITCH, NULL, "Megatron-LM's checkpoint formats (gridgpt reads its own)")
    REFUSE("--dist-ckpt-*", LIST, NULL, "Megatron-LM's distributed checkpoints (gridgpt writes its own format)")
    REFUSE("--async-save", SWITCH, NULL, "asynchronous checkpoint saves")
    REFUSE("--non-persistent-*", LIST, NULL, "non-persistent checkpoints")
    REFUSE("--save-retain-interval", VALUE, NULL, "a retained checkpoint every N iterations (gridgpt: --keep-last)")
    REFUSE("--pretrained-checkpoint", VALUE, NULL, "a separate pretrained checkpoint (gridgpt: --load with --finetune)")
    REFUSE("--universal-checkpoint", SWITCH, NULL, "DeepSpeed's universal checkpoints (gridgpt's own checkpoints load "
           "in any layout)")
    REFUSE("--adlr-autoresume*", LIST, NULL, "ADLR's auto-resume")
    REFUSE("--inprocess-*", LIST, NULL, "in-process restart")
    REFUSE("--enable-ft-package", SWITCH, NULL, "NVIDIA's fault-tolerance package")

    // --- logging and profiling
    ACCEPT("--log-batch-size-to-tensorboard", SWITCH, NULL, "with --tensorboard-dir gridgpt writes batch-size (and vs "
           "samples)")
    ACCEPT("--log-validation-ppl-to-tensorboard", SWITCH, NULL, "with --tensorboard-dir gridgpt writes lm loss "
           "validation ppl")
    ACCEPT("--log-memory-to-tensorboard", SWITCH, NULL, "with --tensorboard-dir gridgpt writes mem-max-rss-bytes, the "
           "process's peak resident memory (not the CUDA allocator's figures Megatron-LM writes)")
    REFUSE("--no-log-learning-rate-to-tensorboard", SWITCH, NULL, "TensorBoard without the learning rate (gridgpt "
           "writes it)")
    REFUSE("--no-log-loss-scale-to-tensorboard", SWITCH, NULL, "TensorBoard without the loss scale (gridgpt writes it "
           "with --fp16)")
    REFUSE("--log-timers-to-tensorboard", SWITCH, NULL, "timers in TensorBoard: Megatron-LM would write each phase's "
           "time (gridgpt writes iteration-time)")
    REFUSE("--log-world-size-to-tensorboard", SWITCH, NULL, "the world size in TensorBoard")
    REFUSE("--log-optimizer-states-to-tensorboard", SWITCH, NULL, "Adam's moments in TensorBoard")
    REFUSE("--tensorboard-log-interval", VALUE, NULL, "TensorBoard's own interval: Megatron-LM would write the scalars "
           "every N iterations (default 1; gridgpt writes them with each log line, every --log-interval)")
    ACCEPT("--tensorboard-queue-size", VALUE, NULL, "gridgpt's event writer flushes at each log line")
    REFUSE("--log-params-norm", SWITCH, NULL, "the parameters' norm in the log line")
    REFUSE("--log-num-zeros-in-grad", SWITCH, NULL, "the gradient's zeros counted in the log line")
    REFUSE("--log-progress", SWITCH, NULL, "progress.txt: tokens and FLOPs written to the checkpoint directory")
    REFUSE("--log-energy", SWITCH, NULL, "the GPUs' energy in the log line")
    ACCEPT("--log-straggler", SWITCH, NULL, "gridgpt names slow ranks every log interval (--slow-rank-threshold)")
    ACCEPT("--timing-log-level", VALUE, "0", "the iteration's time alone, gridgpt's timing")
    REFUSE("--timing-log-level", VALUE, NULL, "timers of each phase in the log (gridgpt: --profile's trace)")
    REFUSE("--wandb-*", LIST, NULL, "Weights & Biases logging")
    REFUSE("--use-pytorch-profiler", SWITCH, NULL, "PyTorch's profiler (gridgpt: --profile writes a Chrome trace)")
    REFUSE("--record-memory-history", SWITCH, NULL, "PyTorch's memory history")
    REFUSE("--yaml-cfg", VALUE, NULL, "a YAML config: gridgpt reads flags only")
    REFUSE("--inference-*", LIST, NULL, "Megatron-LM's inference engine (gridgpt: --generate-tokens)")
    REFUSE("--rl-*", LIST, NULL, "reinforcement learning (GRPO)")
    REFUSE("--grpo-*", LIST, NULL, "reinforcement learning (GRPO)")
};
#define NUM_MEGATRON_FLAGS ((int)(sizeof(MEGATRON_FLAGS) / sizeof(MEGATRON_FLAGS[0])))

// ----------------------------------------------------------------------------
// Megatron-LM's defaults that gridgpt does not apply

// A Megatron-LM flag left out of a command line leaves its default, and where that default asks
// for something other than what gridgpt does, the start-up says so (config.h's
// print_megatron_defaults, one line a row whose runs this is). gridgpt's own defaults are
// Megatron-LM HEAD's (arguments.py) everywhere else; differences of speed or memory alone (the
// distributed optimizer, Transformer Engine's kernels) are not rows. A row goes when gridgpt
// learns what it names (dropout's two rows went when it landed).
typedef enum {
    DIFFERS_ALWAYS,               // in every run
    DIFFERS_UNLESS_DYNAMIC_FP16,  // unless --fp16 with the dynamic loss scaler
    DIFFERS_WITH_FP16,            // with --fp16
    DIFFERS_ON_GPU_FP32,          // in train_gpu without --fp16 or --bf16
    DIFFERS_WITH_SAVE,            // with --save
    DIFFERS_WITH_SPARSE_TENSORBOARD,   // with --tensorboard-dir and a --log-interval other than 1
    DIFFERS_WITH_PROFILE_ALL_RANKS,    // with --profile and no --profile-ranks
} MegatronDiffers;
static const char* const MEGATRON_DIFFERS_WHEN[] = {"always", "unless --fp16 with the dynamic loss scaler", "with --fp16",
                                                    "train_gpu without --fp16 or --bf16", "with --save",
                                                    "with --tensorboard-dir and a --log-interval other than 1",
                                                    "with --profile and no --profile-ranks"};

typedef struct {
    const char* flag;       // Megatron-LM's flag, left out
    const char* value;      // its default ("0.1"); NULL: a switch, off
    const char* megatron;   // what Megatron-LM does then
    const char* gridgpt;    // what gridgpt does instead
    MegatronDiffers when;   // the runs the difference is about
} MegatronDefault;

static const MegatronDefault MEGATRON_DEFAULTS[] = {
    {"--no-check-for-nan-in-loss-and-grad", NULL, "a NaN loss or gradient norm stops its run (after re-running the step: "
     "--rerun-mode validate_results)", "skips that step's update, counts it (the log line's skipped and nan iterations) "
     "and goes on", DIFFERS_UNLESS_DYNAMIC_FP16},
    {"--accumulate-allreduce-grads-in-fp32", NULL, "with --fp16 it accumulates the gradients over the micro-batches and "
     "all-reduces them in fp16", "accumulates and reduces them in fp32, always", DIFFERS_WITH_FP16},
    {"--bf16", NULL, "it computes in fp32 (without --fp16 either)", "computes in bf16 in this build, train_gpu, with fp32 "
     "master weights and gradients (train_cpu computes in fp32)", DIFFERS_ON_GPU_FP32},
    {"--ckpt-format", "torch_dist", "it writes Megatron's distributed checkpoints", "writes its own format, which any "
     "layout loads (--export-hf writes a Hugging Face model)", DIFFERS_WITH_SAVE},
    {"--exit-signal-handler", NULL, "SIGTERM ends its job without a checkpoint", "saves a checkpoint and exits at SIGTERM "
     "(and SIGUSR1, SIGINT, SIGHUP)", DIFFERS_WITH_SAVE},
    {"--tensorboard-log-interval", "1", "it writes the TensorBoard scalars every iteration", "writes them with each log "
     "line, every --log-interval", DIFFERS_WITH_SPARSE_TENSORBOARD},
    {"--profile-ranks", "0", "it profiles rank 0 alone (for Nsight Systems)", "records every rank into one Chrome trace",
     DIFFERS_WITH_PROFILE_ALL_RANKS},
};
#define NUM_MEGATRON_DEFAULTS ((int)(sizeof(MEGATRON_DEFAULTS) / sizeof(MEGATRON_DEFAULTS[0])))

// ----------------------------------------------------------------------------
// looking a flag up

// whether row r is about the flag (a family row about every flag of its prefix)
static int megatron_names(const MegatronFlag* r, const char* flag) {
    size_t n = strlen(r->flag);
    if (r->flag[n - 1] == '*') return strncmp(flag, r->flag, n - 1) == 0;
    return strcmp(flag, r->flag) == 0;
}

// whether value is one of the "a|b" alternatives (numbers compare as numbers: 0 = 0.0)
static int megatron_value_in(const char* alternatives, const char* value) {
    for (const char* p = alternatives; p; p = strchr(p, '|') ? strchr(p, '|') + 1 : NULL) {
        char one[32], *end1, *end2;
        snprintf(one, sizeof(one), "%.*s", (int)strcspn(p, "|"), p);
        if (strcmp(one, value) == 0) return 1;
        double a = strtod(one, &end1), b = strtod(value, &end2);
        if (end1 != one && !*end1 && end2 != value && !*end2 && a == b) return 1;
    }
    return 0;
}

// The row deciding flag with value (NULL: none, or not yet read): the first of the flag's rows
// whose values match; -1 when the table does not know the flag. With value NULL, the flag's
// first row (it tells how many values to read).
static int megatron_row(const char* flag, const char* value) {
    for (int r = 0; r < NUM_MEGATRON_FLAGS; r++) {
        const MegatronFlag* f = &MEGATRON_FLAGS[r];
        if (megatron_names(f, flag) && (!value || !f->values || megatron_value_in(f->values, value))) return r;
    }
    return -1;
}

// the name of a refusal: its text up to the first ':' ("dropout")
static const char* megatron_what(const MegatronFlag* f, char* out, size_t len) {
    snprintf(out, len, "%.*s", (int)strcspn(f->text, ":"), f->text);
    return out;
}

// Levenshtein's edit distance of a and b (flags are short: at most 95 characters each counted)
static int edit_distance(const char* a, const char* b) {
    int n = (int)strlen(b), row[96];
    if (n > 95) n = 95;
    for (int j = 0; j <= n; j++) row[j] = j;
    for (int i = 1; a[i - 1] && i < 96; i++) {
        int diagonal = row[0];
        row[0] = i;
        for (int j = 1; j <= n; j++) {
            int above = row[j], best = diagonal + (a[i - 1] != b[j - 1]);
            if (above + 1 < best) best = above + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diagonal = above;
            row[j] = best;
        }
    }
    return row[n];
}

// a misspelt flag's likely meaning: `best` if flag is within a typo of it (at most 2 edits, and
// few for the flag's length), closer than *distance; updates *distance
static int closer_flag(const char* flag, const char* candidate, int* distance) {
    int d = edit_distance(flag, candidate);
    if (d > 2 || 4 * d > (int)strlen(flag) || d >= *distance) return 0;
    *distance = d;
    return 1;
}

// the closest Megatron flag to a misspelt one (families left out) into out; its distance
static int megatron_closest(const char* flag, int distance, char* out, size_t len) {
    for (int r = 0; r < NUM_MEGATRON_FLAGS; r++) {
        const char* name = MEGATRON_FLAGS[r].flag;
        if (name[strlen(name) - 1] != '*' && closer_flag(flag, name, &distance)) snprintf(out, len, "%s", name);
    }
    return distance;
}
