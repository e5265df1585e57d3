#!/usr/bin/env bash
# tests/test_generate.sh [DATA_PREFIX] — generation (issue 36): a mode of its own, with a KV
# cache, at any grid. DATA_PREFIX: a byte-level dataset (./preprocess without a tokenizer); made
# from scripts/make_corpus.sh when not given.
#   - tests/generate_logits.c: the KV cache's decode gives a full forward's logits at every
#     position (GPT-2 and BLOOM models; one process, and two tensor ranks with and without
#     sequence parallelism); the sampler's rules;
#   - three tiny byte-level models are trained a few steps and saved, a GPT-2 (learned positions),
#     a BLOOM (ALiBi, embedding LayerNorm) and a Llama (rope, grouped-query attention, RMSNorm,
#     SwiGLU, untied, no biases); then --skip-train --load generates from them:
#   - the same greedy and seeded-sampled tokens at TP 2 (with and without sequence parallelism),
#     PP 2, interleaved PP 2 (two chunks a stage), TP 2 x PP 2, PP 2 x DP 2 and TP 2 x DP 2 as
#     on one process; a seed again gives the same sample, another seed another;
#   - top-k 1 and a tiny top-p give the greedy tokens;
#   - greedy tokens equal transformers' generate on the exported model (tests/generate_check.py;
#     SKIP without torch and transformers, FAIL with REQUIRE_TRANSFORMERS=1);
#   - the end-of-document token ends a sample unless --generate-ignore-eod; a full context of
#     learned positions goes on from its last half, as a fresh start from it does; SIGTERM ends a long ALiBi generation on two
#     pipeline stages cleanly;
#   - GPT-2's tokenizer: a model of its 50257 ids at TP 2 prints text; refusals in one line, exit
#     2: a prompt that is not UTF-8, and a prompt of bytes for a vocabulary of GPT-2's ids;
#   - the ids (issue 46): --generate-output both prints GPT-2's text and the prompt's and the new
#     ids; a model of preprocess's ids tokenizer (999 ids, end of document 999) starts a
#     prompt-less sample from 999; --generate-prompt-ids 7,12,5; refused: an id outside the
#     vocabulary, ids with --generate-prompt, --eod-id outside the vocabulary or with a tokenizer.
set -u
cd "$(dirname "$0")/.."
B=tests/build/generate
rm -rf $B && mkdir -p $B
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export LC_ALL=C   # samples are bytes, not always UTF-8
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
failed=0
ok() { echo "PASS $1"; }
bad() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
MPI="mpirun --oversubscribe --bind-to none"
G=tests/data/gpt2
GPT2="--tokenizer-type GPT2BPETokenizer --vocab-file $G/encoder.json --merge-file $G/vocab.bpe"

DATA=${1:-}
if [ -z "$DATA" ]; then
    scripts/make_corpus.sh $B/corpus.jsonl > /dev/null
    ./preprocess --input $B/corpus.jsonl --json-keys text --append-eod --output-prefix $B/corpus > /dev/null
    DATA=$B/corpus_text_document
fi

# ---- the KV cache against a full forward; the sampler
CFLAGS="-std=gnu11 -O2 -march=native -fopenmp -fno-math-errno -Wall -Wextra -Werror"
BLAS=${BLAS:-"$(pkg-config --cflags --libs openblas 2>/dev/null) -DUSE_BLAS"}
if mpicc $CFLAGS tests/generate_logits.c -o $B/generate_logits $BLAS -lz -lm > $B/build.log 2>&1; then
    for np in 1 2; do
        $MPI -np $np $B/generate_logits > $B/logits$np.log 2>&1
        status=$?
        sort -u $B/logits$np.log | grep -E '^(PASS|FAIL)' | sed "s/^\(PASS\|FAIL\) /\1 [$np process(es)] /"
        failed=$((failed + $(sort -u $B/logits$np.log | grep -ac '^FAIL')))
        [ $status -eq 0 ] || grep -aq '^FAIL' $B/logits$np.log || bad "generate_logits on $np process(es)" "$(tail -3 $B/logits$np.log)"
    done
else bad "build tests/generate_logits.c" "$(head -20 $B/build.log)"; fi

# ---- two tiny byte-level models, saved after a few steps (a large init: varied greedy text)
TRAIN="--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --micro-batch-size 4 --global-batch-size 8
       --data-path $DATA --split 100,0,0 --data-cache-path $B/cache --eval-iters 0 --lr 1e-3 --train-iters 5
       --init-method-std 0.2"
./train_cpu $TRAIN --save $B/gpt2 > $B/train_gpt2.log 2>&1 || bad "train the GPT-2 model" "$(tail -3 $B/train_gpt2.log)"
./train_cpu $TRAIN --position-embedding-type alibi --embed-layernorm --save $B/bloom > $B/train_bloom.log 2>&1 ||
    bad "train the BLOOM model" "$(tail -3 $B/train_bloom.log)"
./train_cpu $TRAIN --position-embedding-type rope --normalization RMSNorm --swiglu --group-query-attention --num-query-groups 2 \
    --untie-embeddings-and-output-weights --disable-bias-linear --save $B/llama > $B/train_llama.log 2>&1 ||
    bad "train the Llama model" "$(tail -3 $B/train_llama.log)"

GEN="--skip-train --micro-batch-size 2 --global-batch-size 4 --generate-prompt The"
sample_of() { sed -n '/^---------- sample/,/^------------------------------------------------------$/p' "$1" | sed '1d;$d'; }
# generate NAME NP FLAGS...: one run's sample into $B/NAME.sample (its log $B/NAME.log); 1 if it failed
generate() {
    local name=$1 np=$2; shift 2
    $MPI -np $np ./train_cpu $GEN "$@" > $B/$name.log 2>&1 || { bad "$name" "status $?: $(grep -am1 error $B/$name.log)"; return 1; }
    sample_of $B/$name.log > $B/$name.sample
}

# ---- every layout gives one process's tokens, greedy and sampled
LAYOUTS=("2 --tensor-model-parallel-size 2" "2 --tensor-model-parallel-size 2 --sequence-parallel"
         "2 --pipeline-model-parallel-size 2" "2 --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2"
         "4 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2" "4 --pipeline-model-parallel-size 2"
         "4 --tensor-model-parallel-size 2 --sequence-parallel")
for model in gpt2 bloom llama; do
    for mode in greedy sampled; do
        flags="--load $B/$model --generate-tokens 25 --generate-ignore-eod"
        [ $mode = greedy ] && flags="$flags --temperature 0" || flags="$flags --temperature 0.9 --generate-seed 7"
        generate $model-$mode-1 1 $flags || continue
        same=0 differ=""
        for layout in "${LAYOUTS[@]}"; do
            set -- $layout
            np=$1; shift
            if generate $model-$mode-layout $np $flags "$@" && cmp -s $B/$model-$mode-1.sample $B/$model-$mode-layout.sample; then
                same=$((same + 1))
            else differ="$differ [$np ranks $*]"; fi
        done
        n=$(tail -c +4 $B/$model-$mode-1.sample | head -c -1 | wc -c)
        if [ -z "$differ" ] && [ "$n" -eq 25 ]; then
            ok "$model, $mode: the same $n tokens on 1 process and at TP 2 (and SP), PP 2, interleaved PP 2, TP 2 x PP 2, PP 2 x DP 2, TP 2 x DP 2 with SP"
        else bad "$model, $mode: the layouts' tokens" "$n tokens; differ:$differ"; fi
    done
done

# ---- a seed draws the same sample again, another seed another; top-k 1 and a tiny top-p are greedy
flags="--load $B/gpt2 --generate-tokens 25 --generate-ignore-eod"
if generate again 1 $flags --temperature 0.9 --generate-seed 7 && generate other 1 $flags --temperature 0.9 --generate-seed 8; then
    if cmp -s $B/again.sample $B/gpt2-sampled-1.sample && ! cmp -s $B/other.sample $B/gpt2-sampled-1.sample &&
       ! cmp -s $B/again.sample $B/gpt2-greedy-1.sample; then
        ok "a seeded sample is reproducible, another seed gives another, and neither is the greedy text"
    else bad "seeded samples" "seed 7: $(cat $B/again.sample) | seed 8: $(cat $B/other.sample)"; fi
fi
for cut in "--top-k 1" "--top-p 0.000001"; do
    if generate cut 1 $flags --temperature 1.5 --generate-seed 3 $cut && cmp -s $B/cut.sample $B/gpt2-greedy-1.sample; then
        ok "$cut samples the greedy tokens"
    else bad "$cut samples the greedy tokens" "$(cat $B/cut.sample) vs greedy $(cat $B/gpt2-greedy-1.sample)"; fi
done
if generate topk 1 $flags --temperature 1.5 --generate-seed 3 --top-k 5 && generate topp 1 $flags --temperature 1.5 \
       --generate-seed 3 --top-p 0.5 && ! cmp -s $B/topk.sample $B/gpt2-greedy-1.sample && ! cmp -s $B/topp.sample $B/topk.sample; then
    ok "--top-k 5 and --top-p 0.5 sample other tokens than greedy and than each other"
else bad "--top-k 5 and --top-p 0.5" "$(cat $B/topk.sample) | $(cat $B/topp.sample)"; fi

# ---- where a sample ends: the end-of-document token, the context's end, a signal
generate long 1 --load $B/bloom --generate-tokens 300 --generate-ignore-eod --temperature 1 --generate-seed 5
generate eod 1 --load $B/bloom --generate-tokens 300 --temperature 1 --generate-seed 5
at=$(grep -abo '<|endoftext|>' $B/long.sample | head -1 | cut -d: -f1)
if [ -n "$at" ] && cmp -s -n $((at + 13)) $B/long.sample $B/eod.sample && [ "$(stat -c %s $B/eod.sample)" -eq $((at + 15)) ] &&
   grep -aq "^generation: [0-9]* tokens" $B/eod.log && [ "$(grep -ao '^generation: [0-9]*' $B/eod.log | cut -d' ' -f2)" -lt 300 ]; then
    ok "the end-of-document token ends a sample (byte $at of the one --generate-ignore-eod goes on past it)"
else bad "the end-of-document token ends a sample" "at '$at': $(tail -c 60 $B/eod.sample | tr -d '\0')"; fi
# learned positions: a full context goes on from its last half (a context shift), and what
# follows is exactly a fresh generation from that half as the prompt (which shifts at the same
# tokens): the first shift comes when 3 + 29 positions are fed, keeping "The" + 30 tokens' last 16
generate cap 1 --load $B/gpt2 --generate-tokens 100 --generate-ignore-eod --temperature 0
full=$(cat $B/cap.sample)
window=${full:17:16}
GEN_PROMPT=$GEN
GEN="--skip-train --micro-batch-size 2 --global-batch-size 4"
generate shifted 1 --load $B/gpt2 --generate-prompt "$window" --generate-tokens 70 --generate-ignore-eod --temperature 0
GEN=$GEN_PROMPT
if grep -aq "^note: the context of 32 positions (--max-position-embeddings) was full 5 time(s): each time its last 16 tokens" $B/cap.log &&
   grep -aq "^generation: 100 tokens after a prompt of 3 tokens" $B/cap.log && [ ${#window} -eq 16 ] &&
   [ "${full:17}" = "$(cat $B/shifted.sample)" ]; then
    ok "learned positions: a full context of 32 goes on from its last 16 tokens (5 times in 100), as a fresh start from them does"
else bad "learned positions: the context shift" "$(tail -3 $B/cap.log | head -c 300) | ${full:17} vs $(cat $B/shifted.sample)"; fi
# (the signal goes to the last stage's process alone: every rank learns of it and stops there)
$MPI -np 2 ./train_cpu $GEN --load $B/bloom --pipeline-model-parallel-size 2 --generate-tokens 100000000 \
    --generate-ignore-eod > $B/signal.log 2>&1 &
pid=$!
for i in $(seq 200); do grep -aq -- '---------- sample' $B/signal.log 2> /dev/null && break; sleep 0.1; done
sleep 1
last_stage=$(ps --ppid $pid -o pid=,args= | grep train_cpu | tail -1 | awk '{print $1}')
[ -n "$last_stage" ] && kill -TERM $last_stage
wait $pid
status=$?
if [ $status -eq 0 ] && grep -aq "^\[sampling stopped by SIGTERM after [0-9]* of 100000000 tokens\]" $B/signal.log &&
   grep -aq "^generation: [0-9]* tokens" $B/signal.log; then
    ok "SIGTERM to one rank ends an ALiBi generation on two pipeline stages cleanly ($(grep -ao 'after [0-9]* of' $B/signal.log | cut -d' ' -f2) tokens, the cache grown past its first 1027 positions)"
else bad "SIGTERM during generation" "status $status: $(tail -c 300 $B/signal.log | tr -d '\0')"; fi

# ---- transformers' greedy generate on the exported models, token for token
have_transformers=no
for PY in python3 /usr/bin/python3; do
    $PY -c "import torch, transformers" > /dev/null 2>&1 && { have_transformers=yes; break; }
done
if [ $have_transformers = no ] && [ "${REQUIRE_TRANSFORMERS:-0}" = 1 ]; then
    bad "transformers is required here (REQUIRE_TRANSFORMERS=1, as in CI)" "no python3 with torch and transformers"
elif [ $have_transformers = no ]; then
    echo "SKIP greedy tokens against transformers' generate: no python3 with torch and transformers"
else
    for model in gpt2 bloom llama; do
        ./train_cpu --load $B/$model --export-hf $B/hf_$model > $B/export_$model.log 2>&1 ||
            { bad "export $model" "$(tail -2 $B/export_$model.log)"; continue; }
        for prompt in The "Once upon"; do
            name=$model-hf-$(echo $prompt | tr ' ' _)
            GEN="--skip-train --micro-batch-size 2 --global-batch-size 4 --generate-prompt"   # the prompt follows
            generate $name 1 "$prompt" --load $B/$model --generate-tokens 24 --temperature 0 || continue
            $PY tests/generate_check.py "$model from '$prompt'" $B/hf_$model $B/$name.log "$prompt" 24 > $B/$name.py 2>&1
            grep -E '^(PASS|FAIL)' $B/$name.py || bad "tests/generate_check.py $model" "$(tail -3 $B/$name.py)"
            failed=$((failed + $(grep -ac '^FAIL' $B/$name.py)))
        done
    done
    GEN="--skip-train --micro-batch-size 2 --global-batch-size 4 --generate-prompt The"
fi

# ---- GPT-2's tokenizer: text from a model of its ids; refusals
[ -e $B/corpus.jsonl ] || scripts/make_corpus.sh $B/corpus.jsonl > /dev/null
./preprocess --input $B/corpus.jsonl --json-keys text --append-eod --output-prefix $B/bpe $GPT2 > /dev/null
./train_cpu ${TRAIN/--data-path $DATA/--data-path $B/bpe_text_document} $GPT2 --save $B/bpe > $B/train_bpe.log 2>&1 ||
    bad "train a model of GPT-2's ids" "$(tail -3 $B/train_bpe.log)"
if generate bpe 2 --load $B/bpe $GPT2 --tensor-model-parallel-size 2 --generate-tokens 8 --generate-ignore-eod --temperature 0 &&
   [ "$(head -c 3 $B/bpe.sample)" = The ] && ! grep -aqE '^The( [0-9]+)+ ?$' $B/bpe.sample &&
   [ "$(stat -c %s $B/bpe.sample)" -ge 11 ] &&   # (every GPT-2 token is a byte or more)
   grep -aq "^generation: 8 tokens after a prompt of 1 tokens" $B/bpe.log; then
    ok "GPT-2's tokenizer at TP 2: the prompt's 1 token, 8 new ones printed as text, 8 bytes or more ($(head -c 60 $B/bpe.sample | tr '\n' ' '))"
else bad "GPT-2's tokenizer at TP 2" "$(tail -4 $B/bpe.log)"; fi
refused() {  # NAME NEEDLE ARGS...: exit 2, one line on stderr, with NEEDLE
    local name=$1 needle=$2; shift 2
    ./train_cpu "$@" > $B/refused.out 2> $B/refused.err
    local status=$? lines=$(wc -l < $B/refused.err)
    if [ $status -eq 2 ] && [ "$lines" -eq 1 ] && grep -qF -- "$needle" $B/refused.err; then ok "refused in one line: $name"
    else bad "refused in one line: $name" "status $status, $lines line(s): $(head -c 300 $B/refused.err)"; fi
}
refused "a prompt that is not UTF-8, for GPT-2's tokenizer" "--generate-prompt: invalid UTF-8 at byte 1" \
    --skip-train --load $B/bpe $GPT2 --generate-tokens 5 --generate-prompt $'a\xff'
refused "a prompt of bytes for a vocabulary of GPT-2's ids" "--generate-prompt: a vocabulary of 50257 ids is not bytes" \
    --skip-train --load $B/bpe --generate-tokens 5 --generate-prompt The

refused "a prompt of ids outside the vocabulary" "--generate-prompt-ids: id 50257 is outside the vocabulary [0, 50257)" \
    --skip-train --load $B/bpe $GPT2 --generate-tokens 5 --generate-prompt-ids 464,50257
refused "a prompt of ids and of text" "--generate-prompt and --generate-prompt-ids: give the prompt one way" \
    --skip-train --load $B/bpe $GPT2 --generate-tokens 5 --generate-prompt-ids 464 --generate-prompt The

# ---- the ids (issue 46): GPT-2's beside its text; a model of preprocess's ids tokenizer, whose
# end-of-document id N (here 999) starts a prompt-less sample, its vocabulary's last (N + 1 ids)
GEN="--skip-train --micro-batch-size 2 --global-batch-size 4"
if generate bpe-ids 1 --load $B/bpe $GPT2 --generate-prompt The --generate-tokens 8 --generate-ignore-eod --temperature 0 --generate-output both &&
   [ "$(head -c 3 $B/bpe-ids.sample)" = The ] && grep -aqx 'prompt ids: 464' $B/bpe-ids.sample &&
   grep -aqE '^sample ids: [0-9]+(,[0-9]+){7}$' $B/bpe-ids.sample; then
    ok "--generate-output both: GPT-2's text, then the prompt's ids and the 8 new ones ($(grep -a '^sample ids' $B/bpe-ids.sample))"
else bad "--generate-output both" "$(head -c 300 $B/bpe-ids.sample)"; fi
for d in 1 2 3 4; do echo "{\"text\": \"$(seq $((d * 7)) 13 998 | tr '\n' ' ')\"}"; done > $B/ids.jsonl
./preprocess --input $B/ids.jsonl --json-keys text --append-eod --tokenizer-type ids --vocab-size 999 --output-prefix $B/ids > /dev/null
./train_cpu --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2 --train-iters 1 \
    --data-path $B/ids_text_document --split 100,0,0 --data-cache-path $B/cache --eval-iters 0 --save $B/ids > $B/train_ids.log 2>&1 ||
    bad "train a model of 999 ids" "$(tail -3 $B/train_ids.log)"
if generate ids-eod 1 --load $B/ids --generate-tokens 4 --generate-ignore-eod --generate-output ids &&
   [ "$(sed -n 1p $B/ids-eod.sample)" = "" ] && grep -aqx 'prompt ids: 999' $B/ids-eod.sample &&
   generate ids-prompt 1 --load $B/ids --generate-tokens 4 --generate-ignore-eod --generate-output ids --generate-prompt-ids 7,12,5 &&
   grep -aqx 'prompt ids: 7,12,5' $B/ids-prompt.sample && grep -aqE '^sample ids: [0-9]+(,[0-9]+){3}$' $B/ids-prompt.sample; then
    ok "ids data of 999 ids: no prompt starts from its end-of-document id 999; --generate-prompt-ids 7,12,5; no text"
else bad "ids data: end-of-document id and a prompt of ids" "$(cat $B/ids-eod.sample $B/ids-prompt.sample | head -c 300)"; fi
refused "--eod-id outside the vocabulary" "--eod-id 1000: outside the vocabulary of 1000 ids" \
    --skip-train --load $B/ids --generate-tokens 5 --eod-id 1000
refused "--eod-id with a tokenizer" "--eod-id goes without --tokenizer-type" \
    --skip-train --load $B/bpe $GPT2 --generate-tokens 5 --eod-id 3

echo "$failed failed"
[ $failed -eq 0 ]
