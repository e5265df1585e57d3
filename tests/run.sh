#!/usr/bin/env bash
# `make test`: builds every test program into tests/build, runs each, and adds up their
# PASS / FAIL lines into one final line "N passed, M failed in <wall time>". A program that
# crashes or exits non-zero without failing a check counts as one failure more.
#   tests/run.sh              every test
#   tests/run.sh NAME...      only the named tests (make check T="NAME..."); names below, in TESTS
set -u
cd "$(dirname "$0")/.."
TESTS="rooms unicode_table fixtures kernels kernels_blas data hostile preprocess_gpt2 tokenizer model cli megatron_flags parallel zero context_parallel moe scale watchdog configs
       check_cluster hosts dry_run plan gpu_check checkpoint crash_points eval hf generate tensorboard trace emu_kernels emu_train sass recost"
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
# Open MPI picks its plain point-to-point layer (pml ob1) on a host like this one, but only after
# opening the fabric libraries' layers (cm and its mtl probes), 0.2 s at every mpirun's start, a few
# hundred times here: named at once, the same layer runs without the probes. (A process started
# alone skips them by itself: parallel.h's start_alone_quickly.) And a rank waiting in MPI yields
# its core (mpi_yield_when_idle; Open MPI does it by itself only when a job has more ranks than the
# host's cores): two tests run at once here, and a 2-rank job's waiting ranks spinning took the
# cores the other lane's work needed (measured, the whole of make test: 11m34s became 10m52s; the
# parallel and context-parallel tests alone, nothing beside them: 258 s became 80 s).
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1} OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
# And a job one of whose ranks exits non-zero (every refusal the tests ask for) is ended by
# Open MPI's daemon with SIGCONT, a wait of odls_base_sigkill_timeout (1 s), SIGTERM, the same
# wait, SIGKILL, even when every rank has exited already: 1 to 2 s a refused mpirun, a few
# hundred of them (measured, test_parallel alone: 75 s became 45 s). The tests that stop a job
# by a signal send it to the ranks or through scripts/launch's SIGUSR1, which this wait does not
# concern; a user's mpirun keeps Open MPI's default.
export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-0}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
B=tests/build
mkdir -p $B
CFLAGS="-std=gnu11 -O2 -march=native -fopenmp -fno-math-errno -Wall -Wextra -Werror"
BLAS=${BLAS:-"$(pkg-config --cflags --libs openblas) -DUSE_BLAS"}   # make test passes the build's choice
FIXTURE=tests/data/megatron/corpus_u16

# A test program that does not build counts as a failure, and its old binary is removed
# first, so that nothing runs a stale build. The programs build in two streams, one a core,
# beside the corpus (a failure leaves NAME.build_failed, counted once both are done).
build() {  # name, command...
    local name=$1; shift
    rm -f $B/$name $B/$name.build_failed
    "$@" > $B/$name.build.log 2>&1 || touch $B/$name.build_failed
}
rm -f $B/*.build_failed
{
    wanted model && build test_model mpicc $CFLAGS tests/test_model.c -o $B/test_model $BLAS -lz -lm
    wanted kernels && build test_kernels gcc $CFLAGS tests/test_kernels.c -o $B/test_kernels -lm
    wanted tensorboard && build test_tensorboard gcc $CFLAGS tests/test_tensorboard.c -o $B/test_tensorboard
    # make bench's programs, which only a hand's run builds, still compile (checked, not built:
    # tests/bench.c once went stale unnoticed)
    for bench in bench bench_context_parallel; do
        wanted kernels && build $bench mpicc $CFLAGS -fsyntax-only $(pkg-config --cflags openblas) -DUSE_BLAS tests/$bench.c
    done
} &
{
    # test_parallel records every step's loss and norm in full precision, for several of the scripts
    { wanted parallel || wanted zero || wanted context_parallel || wanted moe || wanted checkpoint || wanted scale || wanted hosts; } &&
        build test_parallel mpicc $CFLAGS tests/test_parallel.c -o $B/test_parallel $BLAS -lz -lm
    wanted kernels_blas && build test_kernels_blas gcc $CFLAGS tests/test_kernels.c -o $B/test_kernels_blas $BLAS -lm
    wanted data && build test_data gcc $CFLAGS -O1 -g -fsanitize=address tests/test_data.c -o $B/test_data -lm
} &
# a small corpus for the training tests (text every Debian machine ships)
scripts/make_corpus.sh $B/corpus.jsonl > /dev/null
./preprocess --input $B/corpus.jsonl --json-keys text --append-eod --output-prefix $B/corpus > /dev/null
wait
build_failures=0
for failed in $B/*.build_failed; do
    [ -e "$failed" ] || continue
    name=$(basename "$failed" .build_failed)
    echo "FAIL build $name:"; cat $B/$name.build.log
    build_failures=$((build_failures + 1))
done

# each test's command (its output goes to $B/NAME.log)
test_command() {
    local d=$B/corpus_text_document
    case $1 in
        rooms) echo python3 tests/test_rooms.py ;;
        # (Debian's python3 first: CI installs transformers, and with it regex, there)
        unicode_table) echo "$( [ -x /usr/bin/python3 ] && echo /usr/bin/python3 || echo python3)" tests/test_unicode_table.py ;;
        sass) echo python3 tests/test_sass.py ;;
        fixtures) echo bash tests/test_fixtures.sh ;;
        kernels) echo $B/test_kernels ;;
        kernels_blas) echo $B/test_kernels_blas ;;
        data) echo $B/test_data $FIXTURE ;;
        model) echo $B/test_model $d ;;
        emu_kernels) echo bash tests/test_emu.sh ;;
        *) echo bash tests/test_$1.sh $d ;;
    esac
}

# The emulation's tests keep a core busy for minutes and wait for nothing; the others' MPI ranks
# wait on each other many times a second, and each wait that finds its core taken lasts a
# scheduler's slice: so the emulation runs at a lower priority (nice), on whatever the other
# lane leaves idle, and takes both cores once that lane is done.
BACKGROUND_TESTS="emu_kernels emu_train"

# one test, quietly: its log, exit status and seconds into $B/NAME.{log,status,seconds}
run_quietly() {
    wanted $1 || return 0
    local began=$(date +%s) TIMEFORMAT="%U %S"   # (the processor seconds, user and system, of all its processes)
    local priority=""
    case " $BACKGROUND_TESTS " in *" $1 "*) priority="nice -n 10" ;; esac
    { time { $priority $(test_command $1) > $B/$1.log 2>&1; echo $? > $B/$1.status; }; } 2> $B/$1.cpu
    echo $(( $(date +%s) - began )) > $B/$1.seconds
}

# Most tests leave the two cores half idle (process start-up, MPI's launch, waits for a
# signal or a timeout), so two lanes run them at once. The emulation's two (which keep a core
# busy for minutes) start in one lane; every other test waits in one queue, the longest first
# (by the report's "seconds per test" of a whole run), and each lane takes the next one whenever
# it is free: the other lane from the start, the emulation's once its two are done. So neither
# core waits for the other lane's tail (two fixed lists once left one core idle for three
# minutes). The cluster check and the simulated hosts' test compare ranks' speeds and run
# alone, last. Each test has its own folder under $B; the report comes afterwards, in the
# order of TESTS.
EMULATION="emu_kernels emu_train"
LONGEST_FIRST="parallel checkpoint hf context_parallel sass generate dry_run plan zero tokenizer cli hostile
               watchdog trace configs scale moe megatron_flags crash_points preprocess_gpt2 gpu_check recost eval"
rm -f $B/*.status $B/*.seconds $B/*.cpu
queue=$B/test_queue
rm -f $queue.new
for name in $LONGEST_FIRST $TESTS; do   # (then any test the list above has not placed)
    case " $EMULATION check_cluster hosts " in *" $name "*) continue ;; esac
    grep -qx "$name" $queue.new 2> /dev/null || echo $name >> $queue.new
done
mv $queue.new $queue
next_test() {  # the queue's first name, taken off it (empty when none is left)
    flock $queue.lock sh -c 'head -1 "$1"; sed -i 1d "$1"' sh $queue
}
take_tests() {
    local name
    while name=$(next_test) && [ -n "$name" ]; do run_quietly $name; done
}
# (each lane a subshell of its own: a lane that ends while a test of the other is timed would
# otherwise add its processes' seconds to that test's)
( for name in $EMULATION; do run_quietly $name; done; take_tests ) &
( take_tests ) &
wait
run_quietly check_cluster
run_quietly hosts

passed=0; failed=$build_failures; times=""; cpu=""
for label in $TESTS; do
    wanted $label || continue
    echo "== $label"
    grep -E '^(PASS|FAIL|SKIP)' $B/$label.log
    p=$(grep -c '^PASS' $B/$label.log); f=$(grep -c '^FAIL' $B/$label.log)
    status=$(cat $B/$label.status)
    if [ "$status" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL $label exited with status $status:"; tail -20 $B/$label.log
        f=1
    fi
    passed=$((passed + p)); failed=$((failed + f))
    times="$times $label $(cat $B/$label.seconds)s"
    cpu="$cpu $label $(awk '{ printf "%.0f", $1 + $2 }' $B/$label.cpu)s"
done

seconds=$(( $(date +%s) - started ))
echo "seconds per test:$times"
echo "processor seconds per test (two cores: the wall time's floor is half their sum):$cpu"
echo "$passed passed, $failed failed in $((seconds / 60))m$((seconds % 60))s"
[ $failed -eq 0 ]
