#!/usr/bin/env bash
# tests/bench_context_parallel.sh [SEQ...] — `make bench`'s part for context parallelism: how much
# of the p2p ring's transfer (MPI_Isend / MPI_Irecv on the CPU build) hides behind the block
# attention, on 2 and 4 ranks of this machine (mpirun --oversubscribe: more ranks than cores
# share them), one thread each, Open MPI's ob1 over shared memory. Builds
# tests/build/bench_context_parallel (tests/bench_context_parallel.c, which says what each
# column is) with the flags the Makefile gives train_cpu, then runs it for each rank count and
# sequence length (default 512 1024 2048; B 1, 8 heads of 64, GPT-2's attention) and prints one
# table. About a minute and a half on 2 idle cores; everything else running on them shows in the
# times (the load average is printed before and after).
set -u
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}   # as tests/run.sh: the plain point-to-point layer, named
export OMP_NUM_THREADS=1                   # one thread a rank: the ranks are what share the cores
B=tests/build
mkdir -p $B
SEQS=${*:-512 1024 2048}
REPS=${REPS:-5}

# the Makefile's BLAS detection (tests/bench.sh's), and its flags for train_cpu
blas_flags() {   # runs in a subshell: the export stays there
    local dir
    dir=/usr/lib/$(${CC:-gcc} -print-multiarch)/openblas-openmp
    if [ -f "$dir/pkgconfig/openblas.pc" ]; then export PKG_CONFIG_PATH=$dir/pkgconfig; else dir=""; fi
    pkg-config --exists openblas 2>/dev/null || return 0
    echo "$(pkg-config --cflags openblas) -DUSE_BLAS $(pkg-config --libs openblas)${dir:+ -Wl,-rpath,$dir}"
}
BLAS=${BLAS:-$(blas_flags)}
[ "$BLAS" = none ] && BLAS=""
CFLAGS="-std=gnu11 -O3 -march=${CPU_ARCH:-native} -fopenmp -fno-math-errno -Wall -Wextra -Werror"
if ! ${MPICC:-mpicc} $CFLAGS tests/bench_context_parallel.c -o $B/bench_context_parallel $BLAS -lz -lm \
        > $B/bench_context_parallel.build.log 2>&1; then
    echo "FAIL build bench_context_parallel:"; cat $B/bench_context_parallel.build.log
    exit 1
fi

mpi_version=$(ompi_info --version 2>/dev/null | sed -n 's/^Open MPI \(v[0-9.]*\).*/\1/p')
single_copy=$(ompi_info --param btl vader --level 9 2>/dev/null |
              sed -n 's/.*btl_vader_single_copy_mechanism" (current value: "\([a-z]*\)".*/\1/p')
echo "context parallelism's ring (p2p), CPU build — $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores; one thread a rank;" \
     "Open MPI ${mpi_version:-?}, pml ${OMPI_MCA_pml}, shared memory's single copy: ${single_copy:-?}"
echo "layer:   B 1, 8 heads of 64 (keys and values of all 8), each rank's block 2 chunks of SEQ / (2 x ranks) tokens;" \
     "median of $REPS after a warm-up"
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15-min load average before)"
echo
status=0
for ranks in 2 4; do
    for seq in $SEQS; do
        header=""
        [ "$ranks $seq" = "2 ${SEQS%% *}" ] && header=--header
        mpirun --oversubscribe --bind-to none -np $ranks $B/bench_context_parallel $seq --reps $REPS $header ||
            { echo "FAIL bench_context_parallel: $ranks ranks, seq $seq, exited with status $?"; status=1; }
    done
done
cat <<'EOF'

  transfer  the ring's transfers alone (start, then finish)   compute  the attention without them
  together  context_attention_forward / _backward as the trainer runs them (transfer posted, compute, finish)
  overlap   (transfer + compute - together) / transfer: the share of the transfer hidden
            (clamped to 0..100%; the raw value beside it)
  spread    the repetitions' median deviation of transfer + compute - together: the least of the noise (an
            overlap within it is noise; the medians of separate pieces move more than a repetition shows)
  poked     together with MPI_Testall on the transfers after each block of a step (a progress poke);
            in pokes: its time inside them
  wait      time inside ring_transfer_finish: together's, poked's, and after 20 ms idle outside MPI (idle wait
            ~ 0: MPI moved the message by itself; ~ the transfer's copy: it moves only inside an MPI call)
EOF
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $status
