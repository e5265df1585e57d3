# gridgpt — build, test, benchmark, run.
#   make          the trainer that fits this machine (GPU build if a GPU is visible, else CPU)
#   make cpu      ./train_cpu: C11 + OpenMP + MPI, plain-C kernels, OpenBLAS sgemm if installed
#   make gpu      ./train_gpu (bf16) and ./train_gpu_fp16 (fp16, -DGRIDGPT_FP16): nvcc compiles
#                 train.c as CUDA; cuBLAS, NCCL, MPI. GPU_ARCH="80 90" by default (A100, H100);
#                 with an architecture below 80 (70: V100) the fp16 binary alone
#   make emu      ./train_emu and ./train_emu_fp16: the GPU code path, in each precision, on a
#                 CPU emulation of CUDA (tests/emu/)
#   make test     installs what is missing, then every test; ends with "N passed, M failed"
#   make check    every test, installing nothing; make check T="data cli" only those named
#   make test-gpu on a GPU machine: the kernel checks and a short training against the CPU build,
#                 then the 124M benchmark (tokens/s, MFU) next to the planner's estimate and llm.c's
#   make bench    CPU step time, throughput and memory for GPT-2 124M and a small shape; the
#                 tokenizer, generation, and context parallelism's ring overlap on 2 and 4 ranks
#   make run      the main job: set up, build, make a corpus, train, evaluate, sample

CC       ?= gcc
NVCC     ?= nvcc
MPICC    ?= mpicc
CPU_ARCH ?= native
GPU_ARCH ?= 80 90
WARN     := -Wall -Wextra
# WERROR=1 turns every warning into an error (CI builds this way)
ifeq ($(WERROR),1)
  WARN += -Werror
  NVCC_WERROR := -Werror all-warnings
endif

# OpenBLAS plays cuBLAS's role on the CPU when it is installed. Its OpenMP flavour
# (libopenblas-openmp-dev) shares the trainer's OpenMP threads; the default pthread flavour
# spins threads of its own that fight OpenMP's for the cores (measured: 300x slower steps
# on 2 cores), so the OpenMP one is preferred, and loaded by rpath whatever the
# system's BLAS alternative points to.
OPENBLAS_OPENMP := /usr/lib/$(shell $(CC) -print-multiarch)/openblas-openmp
ifneq ($(wildcard $(OPENBLAS_OPENMP)/pkgconfig/openblas.pc),)
  BLAS_PC := PKG_CONFIG_PATH=$(OPENBLAS_OPENMP)/pkgconfig
  BLAS_RPATH := -Wl,-rpath,$(OPENBLAS_OPENMP)
endif
BLAS_FLAGS := $(shell $(BLAS_PC) pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS  := $(shell $(BLAS_PC) pkg-config --libs openblas 2>/dev/null)
ifneq ($(BLAS_LIBS),)
  BLAS_FLAGS += -DUSE_BLAS
  BLAS_LIBS += $(BLAS_RPATH)
endif

# -fno-math-errno: sqrtf/expf need not set errno, so loops that call them vectorize
# (AdamW's loop ran 5x slower without it); results are unchanged
CFLAGS   := -std=gnu11 -O3 -march=$(CPU_ARCH) -fopenmp -fno-math-errno $(WARN)
LDLIBS   := $(BLAS_LIBS) -lz -lm   # zlib: the checkpoints' CRC-32

MPI_CFLAGS := $(shell $(MPICC) --showme:compile 2>/dev/null)
MPI_LIBS   := $(shell $(MPICC) --showme:link 2>/dev/null)
GENCODE    := $(foreach a,$(GPU_ARCH),-gencode arch=compute_$(a),code=sm_$(a))
# the flags that shape the kernels' machine code (tests/test_sass.py reads this line)
NVCC_DEVICE_FLAGS := -std=c++17 -O3 --use_fast_math
# OMPI_SKIP_MPICXX: Open MPI's C++ bindings do not compile warning-free under nvcc
NVCCFLAGS  := -x cu $(NVCC_DEVICE_FLAGS) $(GENCODE) $(NVCC_WERROR) -Xcompiler -Wall,-Wextra,-fopenmp -DOMPI_SKIP_MPICXX $(MPI_CFLAGS)

HAVE_GPU := $(shell nvidia-smi -L 2>/dev/null | grep -q GPU && echo yes)

# Architectures before sm_80 (70: V100, 75: T4) have no bf16 tensor cores, so a GPU_ARCH that
# lists one builds train_gpu_fp16 alone, and train_gpu or make test-gpu (bf16) are refused.
# CUDA 13 no longer compiles for sm_70 (nor sm_72): such a GPU_ARCH with an nvcc that does not
# list the architecture (nvcc --list-gpu-arch) is refused, in one line naming the nvcc,
# before anything compiles. nvcc is asked only then.
GPU_ARCH_BEFORE_BF16 := $(filter 5% 6% 7%,$(GPU_ARCH))
ifneq ($(GPU_ARCH_BEFORE_BF16),)
  GPU_BINARIES := train_gpu_fp16
  GPU_GOALS := $(if $(MAKECMDGOALS),$(filter gpu train_gpu train_gpu_fp16 test-gpu,$(MAKECMDGOALS)),$(HAVE_GPU))
  ifneq ($(filter train_gpu test-gpu,$(MAKECMDGOALS)),)
    $(error GPU_ARCH="$(GPU_ARCH)": train_gpu computes in bf16, which needs sm_80 or newer; make gpu builds train_gpu_fp16 alone for these architectures)
  endif
  ifneq ($(GPU_GOALS),)
    NVCC_RELEASE := $(shell $(NVCC) --version 2>/dev/null | sed -nE 's/.*release ([0-9.]+).*/\1/p')
    NVCC_CANNOT := $(filter-out $(patsubst compute_%,%,$(shell $(NVCC) --list-gpu-arch 2>/dev/null)),$(GPU_ARCH_BEFORE_BF16))
    ifneq ($(NVCC_RELEASE),)
      ifneq ($(NVCC_CANNOT),)
        $(error GPU_ARCH="$(GPU_ARCH)": $(NVCC) is CUDA $(NVCC_RELEASE), which cannot compile for $(patsubst %,sm_%,$(NVCC_CANNOT)); CUDA 12 is the last that can: make gpu GPU_ARCH="$(GPU_ARCH)" NVCC=/path/to/cuda-12/bin/nvcc)
      endif
    endif
    $(info note: GPU_ARCH="$(GPU_ARCH)" lists an architecture before sm_80, without bf16 tensor cores: make gpu builds train_gpu_fp16 alone (run it with --fp16))
  endif
else
  GPU_BINARIES := train_gpu train_gpu_fp16
endif

SOURCES := files.h tokenizer.h tokenizer_unicode.h train.c megatron_flags.h config.h print_schedule.h hardware.h cost.h plan.h data_setup.h stop_signals.h convert.h gpt.h layers.h parallel.h trace.h context_parallel.h moe.h fields.h data_parallel.h zero.h pipeline.h step.h loader.h generate.h cluster.h checkpoint.h json.h hf.h hf_import.h tensorboard.h kernels.cuh $(wildcard kernels/*.cuh) device.cuh blas_cores.h data.c

ifeq ($(HAVE_GPU),yes)
default: gpu preprocess
else
default: cpu preprocess
endif

cpu: train_cpu
gpu: $(GPU_BINARIES)
emu: train_emu train_emu_fp16

train_cpu: $(SOURCES)
	$(MPICC) $(CFLAGS) $(BLAS_FLAGS) train.c -o $@ $(LDLIBS)

# The GPU build's precision is a compile-time type (floatX in device.cuh): one binary per
# precision, from the same source. bf16 by default; -DGRIDGPT_FP16 makes floatX fp16.
GPU_LIBS := -lcublas -lcublasLt -lnccl $(MPI_LIBS) -lz

train_gpu: $(SOURCES)
	$(NVCC) $(NVCCFLAGS) train.c -o $@ $(GPU_LIBS)

train_gpu_fp16: $(SOURCES)
	$(NVCC) $(NVCCFLAGS) -DGRIDGPT_FP16 train.c -o $@ $(GPU_LIBS)

# the GPU code path (CUDA kernels, cuBLAS, NCCL) compiled by g++ against the CPU emulation
# of CUDA in tests/emu/: runs anywhere, slowly; tests/test_emu_train.sh compares it
EMU_CXX := mpicxx -std=c++20 -O2 -Wall -Wextra -Wno-unused-function $(if $(filter 1,$(WERROR)),-Werror) -fopenmp \
           -x c++ -D__CUDACC__ -DOMPI_SKIP_MPICXX -Itests/emu

train_emu: $(SOURCES) $(wildcard tests/emu/*.h)
	$(EMU_CXX) train.c -o $@ -lz -lm

train_emu_fp16: $(SOURCES) $(wildcard tests/emu/*.h)
	$(EMU_CXX) -DGRIDGPT_FP16 train.c -o $@ -lz -lm

preprocess: preprocess.c data.c tokenizer.h tokenizer_unicode.h
	$(CC) $(CFLAGS) preprocess.c -o $@ -lm

# ----------------------------------------------------------------------------
# tests: tests/run.sh builds and runs every test program and script, and adds up the counts

# `make test` first installs what is missing (scripts/install.sh), then builds and runs in a
# fresh make, so that the BLAS and MPI flags are read after the install
test:
	bash scripts/install.sh
	$(MAKE) --no-print-directory check

# make check T="data cli": only the named tests (tests/run.sh lists the names)
check: train_cpu preprocess
	BLAS="$(BLAS_FLAGS) $(BLAS_LIBS)" bash tests/run.sh $(T)

# on a machine with NVIDIA GPUs: the kernel checks on the GPU and train_gpu against train_cpu
test-gpu: train_gpu train_cpu preprocess
	GENCODE="$(GENCODE)" bash tests/test_gpu.sh
	bash tests/bench_gpu.sh tests/build/corpus_text_document

bench: train_cpu preprocess
	bash tests/bench.sh
	bash tests/bench_tokenizer.sh
	bash tests/bench_generate.sh
	bash tests/bench_context_parallel.sh

run:
	bash scripts/run.sh

# docs/flags.md is ./train_cpu --help-markdown (test_cli fails when they differ)
docs: train_cpu
	./train_cpu --help-markdown > docs/flags.md

clean:
	rm -rf train_cpu train_gpu train_gpu_fp16 train_emu train_emu_fp16 preprocess tests/build

.PHONY: default cpu gpu emu test check test-gpu bench run docs clean
