#!/usr/bin/env bash
# `make test`: builds every test program into tests/build, runs each, and adds up their
# PASS / FAIL lines into one final line "N passed, M failed in <wall time>". A program that
# crashes or exits non-zero without failing a check counts as one failure more.
#   tests/run.sh              every test
#   tests/run.sh NAME...      only the named tests (make check T="NAME..."); names below, in TESTS
set -u
cd "$(dirname "$0")/.."
TESTS="fixtures kernels kernels_blas data model cli parallel scale watchdog configs check_cluster dry_run plan
       checkpoint crash_points hf tensorboard emu_kernels emu_train"
for name in "$@"; do
    case " $(echo $TESTS) " in
        *" $name "*) ;;
        *) echo "error: no test named '$name'; the tests are: $(echo $TESTS)" >&2; exit 2 ;;
    esac
done
NAMED="$*"
wanted() {  # test name: run it? (every test when none is named)
    [ -z "$NAMED" ] && return 0
    case " $NAMED " in *" $1 "*) return 0 ;; esac
    return 1
}
started=$(date +%s)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
B=tests/build
mkdir -p $B
CFLAGS="-std=gnu11 -O2 -march=native -fopenmp -fno-math-errno -Wall -Wextra -Werror"
BLAS=${BLAS:-"$(pkg-config --cflags --libs openblas) -DUSE_BLAS"}   # make test passes the build's choice
FIXTURE=tests/data/megatron/corpus_u16

# a small corpus for the training tests (text every Debian machine ships)
scripts/make_corpus.sh $B/corpus.jsonl > /dev/null
./preprocess --input $B/corpus.jsonl --json-keys text --append-eod --output-prefix $B/corpus > /dev/null

# A test program that does not build counts as a failure, and its old binary is removed
# first, so that nothing runs a stale build.
build_failures=0
build() {  # name, command...
    local name=$1; shift
    rm -f $B/$name
    if ! "$@" > $B/$name.build.log 2>&1; then
        echo "FAIL build $name:"; cat $B/$name.build.log
        build_failures=$((build_failures + 1))
        return 1
    fi
}
wanted kernels && build test_kernels gcc $CFLAGS tests/test_kernels.c -o $B/test_kernels -lm
wanted kernels_blas && build test_kernels_blas gcc $CFLAGS tests/test_kernels.c -o $B/test_kernels_blas $BLAS -lm
wanted data && build test_data gcc $CFLAGS -O1 -g -fsanitize=address tests/test_data.c -o $B/test_data -lm
wanted model && build test_model mpicc $CFLAGS tests/test_model.c -o $B/test_model $BLAS -lz -lm
# test_parallel records every step's loss and norm in full precision, for three of the scripts
{ wanted parallel || wanted checkpoint || wanted scale; } && build test_parallel mpicc $CFLAGS tests/test_parallel.c -o $B/test_parallel $BLAS -lz -lm
wanted tensorboard && build test_tensorboard mpicc $CFLAGS tests/test_tensorboard.c -o $B/test_tensorboard $BLAS -lz -lm

passed=0; failed=$build_failures; times=""
run() {  # label, command...
    local label=$1; shift
    wanted $label || return 0
    echo "== $label"
    local began=$(date +%s)
    "$@" > $B/$label.log 2>&1
    local status=$?
    times="$times $label $(( $(date +%s) - began ))s"
    grep -E '^(PASS|FAIL|SKIP)' $B/$label.log
    local p f
    p=$(grep -c '^PASS' $B/$label.log); f=$(grep -c '^FAIL' $B/$label.log)
    if [ $status -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL $label exited with status $status:"; tail -20 $B/$label.log
        f=1
    fi
    passed=$((passed + p)); failed=$((failed + f))
}
run fixtures bash tests/test_fixtures.sh
run kernels $B/test_kernels
run kernels_blas $B/test_kernels_blas
run data $B/test_data $FIXTURE
run model $B/test_model $B/corpus_text_document
run cli bash tests/test_cli.sh $B/corpus_text_document
run parallel bash tests/test_parallel.sh $B/corpus_text_document
run scale bash tests/test_scale.sh $B/corpus_text_document
run watchdog bash tests/test_watchdog.sh $B/corpus_text_document
run configs bash tests/test_configs.sh $B/corpus_text_document
run check_cluster bash tests/test_check_cluster.sh $B/corpus_text_document
run dry_run bash tests/test_dry_run.sh $B/corpus_text_document
run plan bash tests/test_plan.sh $B/corpus_text_document
run checkpoint bash tests/test_checkpoint.sh $B/corpus_text_document
run crash_points bash tests/test_crash_points.sh $B/corpus_text_document
run hf bash tests/test_hf.sh $B/corpus_text_document
run tensorboard bash tests/test_tensorboard.sh $B/corpus_text_document
run emu_kernels bash tests/test_emu.sh
run emu_train bash tests/test_emu_train.sh $B/corpus_text_document

seconds=$(( $(date +%s) - started ))
echo "seconds per test:$times"
echo "$passed passed, $failed failed in $((seconds / 60))m$((seconds % 60))s"
[ $failed -eq 0 ]
