#!/usr/bin/env bash
# `make test-gpu`, for a machine with NVIDIA GPUs (8 for the (2,2,2) run): the kernel checks
# of tests/test_emu_kernels.cpp built by nvcc and run on the GPU, in bf16 and in fp16
# (-DGRIDGPT_FP16), then ./train_gpu against ./train_cpu over 10 steps at (1,1,1) and
# (2,2,2) with the bf16 tolerance of tests/test_emu_train.sh, with and without activation
# recomputation. Ends with "N passed, M failed".
set -u
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=tests/build
mkdir -p $B
if [ ! -f $B/corpus_text_document.idx ]; then
    scripts/make_corpus.sh $B/corpus.jsonl > /dev/null
    ./preprocess --input $B/corpus.jsonl --json-keys text --append-eod --output-prefix $B/corpus > /dev/null
fi
# kernel_checks PROGRAM [FLAGS...]: tests/test_emu_kernels.cpp built by nvcc, run on the GPU
kernel_checks() {
    local program=$1
    shift
    if ${NVCC:-nvcc} -x cu -std=c++17 -O2 $GENCODE -Xcompiler -fopenmp "$@" -I. -Itests tests/test_emu_kernels.cpp \
        -o $B/$program -lcublas -lcublasLt > $B/$program.build.log 2>&1; then
        $B/$program
    else echo "FAIL build the kernel checks with nvcc $*: $(head -5 $B/$program.build.log)"; fi
}
{
    kernel_checks test_gpu_kernels
    kernel_checks test_gpu_kernels_fp16 -DGRIDGPT_FP16
    GPU_BINARY=./train_gpu bash tests/test_emu_train.sh $B/corpus_text_document
} | tee $B/test_gpu.log | grep -E '^(PASS|FAIL)'
p=$(grep -c '^PASS' $B/test_gpu.log); f=$(grep -c '^FAIL' $B/test_gpu.log)
echo "$p passed, $f failed"
[ "$f" -eq 0 ]
