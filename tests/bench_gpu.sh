#!/usr/bin/env bash
# tests/bench_gpu.sh DATA_PREFIX — the GPU step measured, for the first machine with a GPU
# (run by `make test-gpu`). GPT-2 124M (12 x 768, 12 heads, vocabulary 50257) at micro-batch
# 16 x 1024 on one GPU, 30 steps, once with each attention backend (`--attention-backend
# flash`, the fused kernels, and `unfused`, cuBLAS and a softmax kernel): the last log line's
# time per iteration and throughput (--log-throughput: HEAD's TFLOP/s/GPU, causal attention halved) give tokens/s and MFU against the GPU's dense bf16 peak (from
# its name, or BENCH_PEAK_TFLOPS), each printed next to the planner's estimate for the same
# step and backend (`--dry-run --hw ... --attention-backend`), then which backend ran faster and
# which the planner expected to, llm.c's published figures, and, where nsys is installed, the
# GEMMs' own time (cuBLAS's kernels in a profile of the same run) and the matmul efficiency at
# which the planner's GEMM rows equal it (tests/fit_matmul_efficiency.sh). A benchmark, not a
# test: it prints numbers and asserts nothing about them; it exits non-zero if a run did not train.
#   BINARY=./train_gpu (default) | any trainer binary; BENCH_ITERS=30; BENCH_MODEL: other model
#   flags (to try the script on the CPU build with a small model; the labels still say 124M)
set -u
data=${1:?usage: bench_gpu.sh DATA_PREFIX}
binary=${BINARY:-./train_gpu}
iters=${BENCH_ITERS:-30}
B=tests/build
gpt2=${BENCH_MODEL:-"--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024
      --max-position-embeddings 1024 --vocab-size 50257 --micro-batch-size 16 --global-batch-size 16"}

# the GPU's preset and dense bf16 peak (NVIDIA's datasheets, as --hw's presets)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$name" in
    *H100*) hw=h100-80gb; peak=989 ;;
    *A100*80GB*) hw=a100-80gb; peak=312 ;;
    *A100*) hw=a100-40gb; peak=312 ;;
    *V100*) hw=v100-32gb; peak=125 ;;
    *) hw=h100-80gb; peak=989 ;;
esac
peak=${BENCH_PEAK_TFLOPS:-$peak}

failed=0
summary=""
for backend in flash unfused; do
    log=$B/bench_gpu_$backend.log
    $binary --data-path $data $gpt2 --attention-backend $backend --train-iters $iters --log-interval 10 \
        --eval-iters 0 --log-throughput > $log 2>&1
    status=$?
    last=$(grep -E '^ \[[^]]*\] iteration' $log | tail -1)
    ms=$(sed -nE 's/.*elapsed time per iteration \(ms\): ([0-9.]+) .*/\1/p' <<< "$last")
    tflops=$(sed -nE 's|.*throughput per GPU \(TFLOP/s/GPU\): ([0-9.]+) .*|\1|p' <<< "$last")
    if [ $status -ne 0 ] || [ -z "$ms" ]; then
        echo "bench_gpu: $binary --attention-backend $backend did not train (status $status):" \
             "$(grep -m1 -iE 'error|fail' $log)"
        failed=1
        continue
    fi
    plan_flags="--world-size 1 $gpt2 --hw $hw --attention-backend $backend"
    ./train_cpu --dry-run $plan_flags > $B/bench_gpu_plan_$backend.log 2>&1
    plan=$(tail -1 $B/bench_gpu_plan_$backend.log)
    # the planned step in ms from its "step = ... = N x SLOT s + OPT s" line (more digits than the last line's)
    plan_ms=$(sed -nE 's/^step = .* = ([0-9]+) x ([0-9.e+-]+) s \+ ([0-9.e+-]+) s$/\1 \2 \3/p' $B/bench_gpu_plan_$backend.log |
        awk '{ printf "%.3f\n", 1e3 * ($1 * $2 + $3) }')
    awk -v ms="$ms" -v tf="$tflops" -v peak="$peak" -v gpu="${name:-unknown GPU}" -v bin="$binary" -v b="$backend" 'BEGIN {
        printf "gridgpt %s on %s, --attention-backend %s, GPT-2 124M, 16 x 1024 per step (the last 10 steps): %.1f ms, %.0f tokens/s, %.1f TFLOPs, %.1f%% MFU of %g TFLOP/s (measured)\n",
               bin, gpu, b, ms, 16 * 1024 / (ms / 1000), tf, 100 * tf / peak, peak
    }'
    echo "  the planner's estimate for this step (--hw $hw --attention-backend $backend): $plan"
    summary="$summary$backend $ms ${plan_ms:-?}
"
done
# which backend is faster, measured and as the planner expects it
[ $failed -eq 0 ] && awk '{ ms[$1] = $2; plan[$1] = $3 }
    function faster(t,  f, u) { f = t["flash"]; u = t["unfused"]
        return f < u ? sprintf("flash, %.4g ms against unfused %.4g ms (%.0f%% less)", f, u, 100 * (1 - f / u)) \
                     : sprintf("unfused, %.4g ms against flash %.4g ms (%.0f%% less)", u, f, 100 * (1 - u / f)) }
    END { print "faster, measured: " faster(ms)
          print "faster, as the planner estimates: " faster(plan) }' <<< "$summary"
# The large-GEMM constant for this GPU (HARDWARE_PRESETS' matmul efficiency), fitted to the
# GEMMs alone: cuBLAS's kernels (named gemm, xmma, nvjet or cutlass) summed from an nsys profile
# of the same run, per step; the attention and the other kernels have constants of their own.
preset=$(./train_cpu --dry-run --world-size 1 $gpt2 --hw $hw 2>&1 | sed -nE 's/.* x ([0-9.]+) matmul efficiency.*/\1/p')
if command -v nsys > /dev/null; then
    nsys profile --force-overwrite true -o $B/bench_gpu_gemms $binary --data-path $data $gpt2 --attention-backend flash --train-iters $iters \
        --log-interval 10 --eval-iters 0 > $B/bench_gpu_nsys.log 2>&1
    gemm_ms=$(nsys stats --report cuda_gpu_kern_sum --format csv $B/bench_gpu_gemms.nsys-rep 2>/dev/null |
        awk -F'"?,"?' -v steps="$iters" 'tolower($0) ~ /gemm|xmma|nvjet|cutlass/ { ns += $2 }
                                          END { if (ns > 0) printf "%.4f", ns / 1e6 / steps }')
    if [ -n "$gemm_ms" ]; then
        echo "the GEMMs (cuBLAS's kernels in an nsys profile): $gemm_ms ms per step; the planner's, at the preset: $(./train_cpu \
--dry-run --world-size 1 $gpt2 --hw $hw --attention-backend flash 2>&1 | sed -nE 's/^GEMMs only \(the cuBLAS rows\): ([0-9.e+-]+) ms .*/\1/p') ms"
        echo "the matmul efficiency at which the planner's GEMMs equal them: $(bash tests/fit_matmul_efficiency.sh "$gemm_ms" \
--world-size 1 $gpt2 --hw $hw --attention-backend flash) (--hw $hw's preset: $preset)"
    else echo "the GEMMs' time: no cuBLAS kernel found in the nsys profile ($B/bench_gpu_nsys.log)"; fi
else echo "the GEMMs' time and the matmul efficiency fitted to it need nsys (not installed); --hw $hw's preset: $preset"; fi
echo "llm.c, published (not measured here): its GPT-2 124M run on 10B tokens took 90 min on 8 A100 80GB, about 231K"
echo "  tokens/s per GPU, 'up to ~60% model flops utilization' (karpathy/llm.c discussion #481), and 45 min on 8 H100s,"
echo "  about 463K tokens/s per GPU (as modded-nanogpt's README cites it)"
exit $failed
