#!/usr/bin/env bash
# `make bench`: the CPU build's step time, throughput, memory and time breakdown for GPT-2
# 124M and a small shape. Builds tests/build/bench (tests/bench.c) with the flags the
# Makefile gives train_cpu (plus -Werror), measures the machine's peaks (an FMA loop, the best
# OpenBLAS sgemm), then runs each shape in a process of its own with 2 OpenMP threads, so that
# each peak RSS is that shape's alone, and PyTorch on the same shape when `import torch` works
# (tests/bench_torch.py): Debian's /usr/bin/python3 (torch 1.13), and TORCH_PYTHON=PATH adds that
# python's torch (a venv with PyPI's torch 2.x). Every figure it prints is measured in this run.
# About two minutes, one more for each torch.
# BLAS="cflags libs" overrides the detected OpenBLAS (as in tests/run.sh); BLAS=none
# builds with the plain-C matmuls.
set -eu
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=2
B=tests/build
mkdir -p $B

# the Makefile's BLAS detection: OpenBLAS's OpenMP flavour, loaded by rpath
blas_flags() {   # runs in a subshell: the export stays there
    local dir
    dir=/usr/lib/$(${CC:-gcc} -print-multiarch)/openblas-openmp
    if [ -f "$dir/pkgconfig/openblas.pc" ]; then export PKG_CONFIG_PATH=$dir/pkgconfig; else dir=""; fi
    pkg-config --exists openblas 2>/dev/null || return 0
    echo "$(pkg-config --cflags openblas) -DUSE_BLAS $(pkg-config --libs openblas)${dir:+ -Wl,-rpath,$dir}"
}
BLAS=${BLAS:-$(blas_flags)}
[ "$BLAS" = none ] && BLAS=""

CFLAGS="-std=gnu11 -O3 -march=${CPU_ARCH:-native} -fopenmp -fno-math-errno -Wall -Wextra -Werror"   # as the Makefile builds train_cpu
if ! ${MPICC:-mpicc} $CFLAGS tests/bench.c -o $B/bench $BLAS -lz -lm > $B/bench.build.log 2>&1; then
    echo "FAIL build bench:"; cat $B/bench.build.log
    exit 1
fi

echo "gridgpt CPU benchmark — $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; OMP_NUM_THREADS=$OMP_NUM_THREADS"
echo "build:   ${MPICC:-mpicc} $CFLAGS $BLAS"
echo "BLAS:    $(ldd $B/bench | grep -o '/[^ ]*blas[^ ]*' | head -1 || true)"
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15-min load average before; anything else running on these cores shows in the times)"
echo
status=0
$B/bench machine | tee $B/bench_machine.txt || { echo "FAIL bench machine exited with status $?"; status=1; }
peaks=$(sed -n 's/^peaks: //p' $B/bench_machine.txt)
echo

# PyTorch, run as docs/measured.md says a comparison must be: Debian's python3-torch (1.13) on the
# OpenMP OpenBLAS with the kernels the trainer chose for this CPU (its "BLAS:" line), flush-denormal
# on; and when TORCH_PYTHON names another python (a venv with PyPI's torch 2.x, which brings its
# own MKL: the stronger CPU peer), that one too, right after, on the same shape
openblas_openmp=/usr/lib/$(${CC:-gcc} -print-multiarch)/openblas-openmp
kernels=$(sed -n 's/^BLAS: OpenBLAS [0-9.]*, \([A-Za-z0-9_]*\) kernels.*/\1/p' $B/bench_machine.txt)
torch_bench() {  # PYTHON, then the "same shape:" line's settings
    local python=$1; shift
    LD_LIBRARY_PATH=$openblas_openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} OPENBLAS_CORETYPE=$kernels \
        $python tests/bench_torch.py "$@"
}
pythons=""
for python in /usr/bin/python3 ${TORCH_PYTHON:-}; do
    if [ -x $python ] && $python -c "import torch" 2> /dev/null; then pythons="$pythons $python"
    else echo "PyTorch: not measured with $python (no 'import torch' there; Debian's python3-torch gives it)"; echo; fi
done

for shape in 124M small; do
    $B/bench $shape $peaks | tee $B/bench_$shape.txt || { echo "FAIL bench $shape exited with status $?"; status=1; }
    ours=$(sed -n 's/^ *step time *median *\([0-9.]*\) ms.*/\1/p' $B/bench_$shape.txt)
    n=0
    for python in $pythons; do
        n=$((n + 1))
        out=$B/bench_torch_${shape}_$n.txt
        echo "PyTorch on the same shape, measured now (tests/bench_torch.py, $python):"
        torch_bench $python $(sed -n 's/^same shape: //p' $B/bench_$shape.txt) > $out 2>&1 ||
            { echo "FAIL bench_torch $shape:"; tail -5 $out; status=1; }
        grep -v '^torch step ms:' $out
        torch_median="" torch_min=""
        read -r torch_median torch_min < <(sed -n 's/^torch step ms: //p' $out)
        [ -n "${torch_median:-}" ] && [ -n "$ours" ] &&
            awk -v o="$ours" -v t="$torch_median" -v m="$torch_min" 'BEGIN { printf "   step time         median %9.1f ms   min %9.1f ms   -> gridgpt takes %.2fx its time (%.1f vs %.1f ms)\n", t, m, o / t, o, t }'
    done
    echo
done

# ----------------------------------------------------------------------------
# the data pipeline (tests/bench_data.c): sample index build, micro-batch fetch, preprocess
# MB/s. Its corpus (1e8 tokens) and text inputs (2 x 200 MB) are written once into
# $B/bench_data/ and reused: about 30 s on 2 cores, 6 s more the first time.
D=$B/bench_data
mkdir -p $D
if ! { make -s preprocess && ${CC:-gcc} $CFLAGS tests/bench_data.c -o $D/bench_data; } > $D/bench_data.build.log 2>&1; then
    echo "FAIL build bench_data:"; cat $D/bench_data.build.log
    status=1
else
    echo "data pipeline benchmark"
    $D/bench_data $D ./preprocess || { echo "FAIL bench_data exited with status $?"; status=1; }
    echo
fi
# ----------------------------------------------------------------------------
# checkpoints of GPT-2 124M (weights, Adam's two moments: ~1.5 GB), saved and loaded by
# ./train_cpu itself, which prints seconds and GB/s (the save includes reading the file back
# for the checksums, the load verifying them)
K=$B/bench_ckpt
mkdir -p $K
if [ ! -f $K/corpus_text_document.idx ]; then
    scripts/make_corpus.sh $K/corpus.jsonl > /dev/null
    ./preprocess --input $K/corpus.jsonl --json-keys text --append-eod --output-prefix $K/corpus > /dev/null
fi
rm -rf $K/ckpt
gpt2="--data-path $K/corpus_text_document --vocab-size 50304 --num-layers 12 --hidden-size 768 --num-attention-heads 12
      --max-position-embeddings 1024 --seq-length 64 --micro-batch-size 4 --global-batch-size 4 --train-iters 1
      --eval-iters 0 --split 100,0,0 --log-interval 1"
echo "checkpoints, GPT-2 124M (one rank)"
./train_cpu $gpt2 --save $K/ckpt | grep -E "^saved checkpoint" | sed 's/^/    /' || status=1
./train_cpu $gpt2 --load $K/ckpt | grep -E "^loaded checkpoint" | sed 's/^/    /' || status=1
echo "    on disk: $(du -sh $K/ckpt | cut -f1); page cache: a warm read, the load above is not a cold-disk figure"
rm -rf $K/ckpt
echo

echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $status
