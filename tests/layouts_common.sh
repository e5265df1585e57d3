# tests/layouts_common.sh — sourced by the tests that hold a layout's run against one process
# (test_context_parallel.sh, test_moe.sh): the MPI launch, the recorder, the PASS/FAIL lines and
# test_parallel.sh's tiny model, 22 steps with ramp-up, accumulation and dropout 0.1 on.
# The sourcing script sets `data` (the dataset's prefix) and `B` (its build folder) first.
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none"
REC=tests/build/test_parallel   # records every step's loss and norm in full precision
ok() { echo "PASS $1"; }
bad() { echo "FAIL $1: $2"; }
rm -rf "$B" && mkdir -p "$B"

flags="--data-path $data --vocab-size 257 --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16
       --micro-batch-size 2 --global-batch-size 16 --rampup-batch-size 8 8 64 --train-samples 288
       --lr 3e-3 --lr-warmup-samples 32 --lr-decay-style cosine --min-lr 3e-4 --weight-decay 0.1
       --split 90,10,0 --eval-interval 10 --eval-iters 1 --log-interval 100 --seed 12"
