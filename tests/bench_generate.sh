#!/usr/bin/env bash
# tests/bench_generate.sh [NEW_TOKENS] — generation's speed on the CPU: ./train_cpu --skip-train
# (greedy, KV cache) against transformers' GPT2LMHeadModel.generate (greedy, its KV cache) on the
# same model, in the same run, with the same threads (OMP_NUM_THREADS, default: the cores;
# torch.set_num_threads, torch.set_flush_denormal(True)). The model: GPT-2 124M's shape (12
# layers, 768 wide, 12 heads, 1024 positions, vocabulary 50257), its initial weights
# (./train_cpu --train-iters 0 --save), exported with --export-hf. Both generate NEW_TOKENS
# (default 64) after the prompt "The" (GPT-2's tokenizer: one token), never stopping early;
# tokens/s counts the new tokens over the whole call (the prompt's forward included).
# Prints both figures and their ratio. Needs /usr/bin/python3 (or python3) with torch and
# transformers; without them only ours is printed. TORCH_PYTHON=PATH adds that python's torch
# (a venv with PyPI's torch 2.x, the stronger CPU peer).
set -u
cd "$(dirname "$0")/.."
B=tests/build/bench_generate
N=${1:-64}
THREADS=${OMP_NUM_THREADS:-$(nproc)}
export OMP_NUM_THREADS=$THREADS OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
G=tests/data/gpt2
GPT2="--tokenizer-type GPT2BPETokenizer --vocab-file $G/encoder.json --merge-file $G/vocab.bpe"
mkdir -p $B
if [ ! -e $B/model/latest_checkpointed_iteration.txt ]; then
    rm -rf $B/model $B/hf
    scripts/make_corpus.sh $B/corpus.jsonl > /dev/null   # (the trainer asks for data even to train 0 steps)
    ./preprocess --input $B/corpus.jsonl --json-keys text --append-eod --output-prefix $B/corpus > /dev/null
    ./train_cpu --data-path $B/corpus_text_document --data-cache-path $B/cache --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --vocab-size 50257 \
        --micro-batch-size 1 --global-batch-size 1 --train-iters 0 --eval-iters 0 --save $B/model > $B/save.log 2>&1 ||
        { echo "error: could not write the 124M model: $(tail -2 $B/save.log)"; exit 1; }
    ./train_cpu --load $B/model --export-hf $B/hf > $B/export.log 2>&1 ||
        { echo "error: could not export it: $(tail -2 $B/export.log)"; exit 1; }
fi

./train_cpu --skip-train --load $B/model $GPT2 --micro-batch-size 1 --generate-prompt The --generate-tokens $N \
    --temperature 0 --generate-ignore-eod > $B/ours.log 2>&1 || { echo "error: ours failed: $(tail -2 $B/ours.log)"; exit 1; }
ours=$(sed -nE 's/^generation: ([0-9]+) tokens .*: ([0-9.]+) tokens\/s$/\2/p' $B/ours.log)
echo "gridgpt (train_cpu, $THREADS thread(s)): $N new tokens, greedy, KV cache: $ours tokens/s"

# transformers' generate with the python given, in this run: Debian's torch (1.13) and, when
# TORCH_PYTHON names one (a venv with PyPI's torch 2.x, MKL: the stronger CPU peer), that too
measure_transformers() {  # PYTHON
    local PY=$1 theirs version
    theirs=$($PY - "$B/hf" "$N" "$THREADS" <<'PYEOF'
import sys, time
import torch
from transformers import GPT2LMHeadModel
hf_dir, n, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
torch.set_flush_denormal(True)
torch.set_grad_enabled(False)
model = GPT2LMHeadModel.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
ids = torch.tensor([[464]])   # "The"
kwargs = dict(do_sample=False, max_new_tokens=n, min_new_tokens=n, use_cache=True, pad_token_id=50256,
              attention_mask=torch.ones_like(ids))
model.generate(ids, **dict(kwargs, max_new_tokens=4, min_new_tokens=4))   # warm-up
t0 = time.perf_counter()
out = model.generate(ids, **kwargs)
seconds = time.perf_counter() - t0
assert out.shape[1] - ids.shape[1] == n
print(f"{n / seconds:.2f}")
PYEOF
)
    version=$($PY -c "import torch, transformers; print(f'torch {torch.__version__}, transformers {transformers.__version__}')")
    echo "transformers ($version, $THREADS thread(s)): $N new tokens, greedy, KV cache: $theirs tokens/s"
    awk -v a="$ours" -v b="$theirs" 'BEGIN { printf "ratio gridgpt / transformers (%s): %.2f\n", "'"${version%%,*}"'", a / b }'
}
measured=0
for candidate in /usr/bin/python3 python3; do
    $candidate -c "import torch, transformers" > /dev/null 2>&1 && { measure_transformers $candidate; measured=1; break; }
done
if [ -n "${TORCH_PYTHON:-}" ]; then   # (a python without transformers once printed tracebacks and a ratio of inf)
    if why=$("$TORCH_PYTHON" -c "import torch, transformers" 2>&1); then measure_transformers "$TORCH_PYTHON"; measured=1
    else echo "transformers with TORCH_PYTHON=$TORCH_PYTHON: not measured ($(tail -1 <<< "$why"))"; fi
fi
[ $measured = 1 ] || echo "transformers: not measured (no python3 with torch and transformers)"
