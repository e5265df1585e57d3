#!/usr/bin/env python3
"""tests/recost.py — GPT-2 124M's training step on one H100 re-costed kernel by kernel from
the code (issue 39), beside the planner's estimate of each kernel.

ESTIMATES, ALL OF THEM: no GPU has run these kernels. The re-cost prices what each kernel
does, read from kernels/ and from the compiled code, not from plan.h's formulas:
  - a GEMM (cuBLAS/cuBLASLt, not our code): its FLOPs / (989 TFLOP/s x a tile's efficiency x its
    shape's wave efficiency: tiles in waves over the SMs, split-K for small outputs, cost.h's
    model), the tile's efficiency fitted through those waves to the one GPU run we have (see GEMM
    EFFICIENCIES);
  - the fused attention: issue-bound (docs/gpu-kernels.md, "Issue 39, in the SASS"): the warp
    instructions of its inner loop, counted in the sm_90 SASS (tests/test_sass.py's functions),
    times the loop's trips, at 651 G warp instructions a second, or its L2 traffic if longer;
  - every other kernel: the bytes its code reads and writes in device memory at the streaming
    bandwidth (what it reads again counted where the L2 model says it is gone from the L2: the
    working set of its blocks in flight against the L2's size, hbm_bytes), or its dependent chains of loads (waves x trips x latency) if longer, or the
    issue of its SASS loops where counted (the cross-entropy), whichever is longest;
  - each launch: the device's idle gap between two kernels.
The planner's figures are parsed from `./train_cpu --dry-run --hw h100-80gb ...` (build it
with `make cpu`). Usage:
  python3 tests/recost.py            the tables at 16 x 1024 and 64 x 1024
  python3 tests/recost.py --check    also fail (exit 1, one line a row) where the planner is
                                     outside [1/1.3, 1.3] of the re-cost on any row, or where the
                                     attention backward's windowed tickets move more than 15 GB a
                                     step at 64 x 1024 by the L2 model (issue 52)
Then, for both shapes, the attention backward's traffic with main memory for the order of its
tickets before issue 52 and the windowed one: a list schedule of its blocks with the dQ turns'
waits, and a simple L2 model over it (print_attention_backward_hbm).
  python3 tests/recost.py --markdown the tables as markdown (docs/gpu-kernels.md's section)
  python3 tests/recost.py --constants  the constants alone (nothing compiled)
  --tile-efficiency E --stream-fraction F --memory-latency-us L --launch-gap-us G --issue-rate-g I: the constants
  tests/refit_planner.py refits from a GPU's measurement, given as its "recost.py:" line prints them
The SASS comes from train.c compiled for sm_90 in bf16 (test_sass.compile_cubin), cached in
tests/build/recost/ under a hash of the sources; nvcc and nvdisasm must be there.
"""
import hashlib
import heapq
import math
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_sass   # noqa: E402  (the cubin, the SASS parser, the inner loop, the occupancy)

ROOT = test_sass.ROOT
CACHE = os.path.join(ROOT, "tests", "build", "recost")
TOLERANCE = 1.3   # issue 39's "Done when": the planner within 1.3x of the re-cost, kernel by kernel

# ----------------------------------------------------------------------------
# the GPU and the inputs, each with its source

PEAK_FLOPS = 989e12            # H100 SXM5 dense bf16 tensor-core peak (NVIDIA's H100 datasheet)
HBM_BANDWIDTH = 3.35e12        # H100 SXM5 HBM3, bytes/s (the same datasheet)
STREAM_FRACTION = 0.84         # a copy kernel's share of the datasheet bandwidth: GPUInspector.jl's A100-SXM4-40GB
                               # page, 1220.7 of 1448.4 GiB/s (no H100 figure there; hardware.h's source too)
L2_BANDWIDTH = 5.5e12          # H100's L2 read bandwidth measured by Chips and Cheese ("Nvidia's H100: Funny L2,
                               # and Tons of Bandwidth", 2023, an H100 PCIe: a floor for the SXM5)
SMS = 132                      # H100 SXM5's SMs (NVIDIA's Hopper whitepaper)
L2_BYTES = 50e6                # H100 SXM5's L2 (NVIDIA, "NVIDIA Hopper Architecture In-Depth", 2022); the L2 model
                               # (hbm_bytes) takes it whole, as LRU: it is two partitions and not LRU, which only a
                               # GPU's DRAM counters (nsys, ncu) can weigh
CLOCK_HZ = 1.755e9             # the clock docs/gpu-kernels.md's issue rate uses (Table 3 of the GPU table cited in hardware.h)
MEMORY_LATENCY_S = 400 / CLOCK_HZ   # a load's round trip to device memory, 400 cycles, idle (the same Table 3)
L2_LATENCY_S = 200 / CLOCK_HZ       # and to L2, 200 cycles (the same)
LAUNCH_GAP_S = 0.9e-6          # device idle between two kernels of a full stream: NVIDIA, "Getting Started with
                               # CUDA Graphs" (2019), a 2.9 us kernel ran back to back at 3.8 us a kernel
ISSUE_RATE = 651e9             # warp instructions a second in an issue-bound loop on an H100: docs/gpu-kernels.md's
                               # fit to FlashAttention-2's forward at 198 TFLOP/s (triton-lang/triton PR 2459)

# GEMM EFFICIENCIES (issue 52 item 3): a GEMM's time by its shape, the model cost.h's gemm_seconds
# prices (NVIDIA, "Matrix Multiplication Background User's Guide", DU-09799-001, ch. 3: tile and
# wave quantization; split-K for an output of fewer tiles than SMs, as CUTLASS's efficient_gemm.md
# describes it), its tile and split-K constants read from cost.h (GEMM_TILE, GEMM_SPLIT_K) so the
# two cannot drift: FLOPs / (peak x a tile's efficiency x the shape's wave efficiency,
# gemm_wave_efficiency). A tile's efficiency is one constant a direction, fitted through those
# waves to the one GPU run we have (docs/measured.md: an H200, which has an H100 SXM's SMs, clocks
# and 989 TFLOP/s; GPT-2 124M's shape with the byte vocabulary, 4 x 1024 a micro-batch: forward
# 2.23 ms and backward 6.44 ms a micro-batch), from issue 39's reading of it: the forward's GEMMs
# took their FLOPs at 0.47 of the peak, the backward's (the old cublasGemmEx path) at 0.39.
# fitted_tile_efficiency gives the tile efficiency at which that run's GEMMs (MEASURED_RUN) take
# the same time through the waves. The fits are the constants; the flat figures are their source.
MEASURED_RUN_TOKENS, MEASURED_RUN_VOCAB = 4 * 1024, 256   # docs/measured.md's H200 run: 4 x 1024, byte vocabulary
FORWARD_FLAT_EFFICIENCY = 0.47              # measured (issue 39's fit, flat): the forward's cuBLASLt GEMMs
BACKWARD_FLAT_EFFICIENCY = 0.39             # measured (issue 39's fit, flat): the backward's, the old cublasGemmEx path
CHECKED_BACKWARD = "measured"               # the one --check holds the planner to: the only one measured
# tests/refit_planner.py refits the tile efficiency from tests/gpu_check.sh's nsys run: it is the
# planner's --hw-matmul-efficiency (gemm_seconds' matmul efficiency is this same tile efficiency),
# and the line it prints, "recost.py: --tile-efficiency E", is given here as that flag.

# the model: GPT-2 124M (Radford et al. 2019), vocabulary padded to a multiple of 128 as the command below asks
LAYERS, C, HEADS, FFN, T, VOCAB, VOCAB_PADDED = 12, 768, 12, 3072, 1024, 50257, 50304
HS = C // HEADS
X = 2   # bytes of a bf16
SHAPES = (16, 64)   # micro-batch sequences of 1024: issue 39's two
LLMC_TOKENS_PER_S = 471e3   # llm.c's GPT-2 124M on 8 H100s, 64 x 1024 a GPU, 139 ms a step (issue 39's figures)


def planner_command(batch):
    return ["./train_cpu", "--dry-run", "--hw", "h100-80gb", "--num-layers", str(LAYERS), "--hidden-size", str(C),
            "--num-attention-heads", str(HEADS), "--seq-length", str(T), "--max-position-embeddings", str(T),
            "--vocab-size", str(VOCAB), "--make-vocab-size-divisible-by", "128", "--micro-batch-size", str(batch),
            "--global-batch-size", str(batch), "--bf16", "--train-iters", "10", "--lr", "6e-4",
            "--attention-backend", "flash"]


def cost_defines():
    """cost.h's GEMM_TILE and GEMM_SPLIT_K: the planner's tile and least split-K slice, the shape model's"""
    with open(os.path.join(ROOT, "cost.h")) as f:
        text = f.read()
    found = {m.group(1): int(m.group(2)) for m in re.finditer(r"^#define\s+(GEMM_TILE|GEMM_SPLIT_K)\s+(\d+)", text, flags=re.M)}
    if len(found) != 2:
        sys.exit("recost: cost.h's GEMM_TILE and GEMM_SPLIT_K not found (update tests/recost.py)")
    return found["GEMM_TILE"], found["GEMM_SPLIT_K"]


GEMM_TILE, GEMM_SPLIT_K = cost_defines()


def gemm_waves(M, N, K, batch=1):
    """(tiles, split-K slices, waves, the fraction of its waves' time the SMs are busy) of batch GEMMs
    of (M x K) by (K x N): M and N padded to whole tiles, the tiles in waves of one an SM; an
    output of fewer tiles than SMs split along K up to the SMs, each slice GEMM_SPLIT_K of K at least"""
    tiles = math.ceil(M / GEMM_TILE) * math.ceil(N / GEMM_TILE) * batch
    splits = max(1, min(SMS // tiles, K // GEMM_SPLIT_K)) if tiles < SMS else 1
    waves = math.ceil(tiles * splits / SMS)
    return tiles, splits, waves, M * N * batch * splits / (waves * SMS * GEMM_TILE * GEMM_TILE)


def layer_gemms(tokens):
    """one layer's GEMMs as cost.h charges them, (row, name, direction, M, N, K): its four linear
    layers, forward tokens x out over in; backward dinp, tokens x in over out, and dW, out x in over
    the tokens"""
    found = []
    for name, i, o in (("qkv", C, 3 * C), ("attention projection", C, C), ("fc", C, FFN), ("fc projection", FFN, C)):
        found.append(("linear layers forward", name, "forward", tokens, o, i))
        found.append(("linear layers backward", name + " dinp", "backward", tokens, i, o))
        found.append(("linear layers backward", name + " dW", "backward", o, i, tokens))
    return found


def logits_gemms(tokens, vocab):
    """the head's: logits, tokens x vocab over C; backward dx, tokens x C over vocab, and dW, vocab x C"""
    return [("logits", "logits", "forward", tokens, vocab, C), ("logits", "logits dx", "backward", tokens, C, vocab),
            ("logits", "logits dW", "backward", vocab, C, tokens)]


def step_gemms(tokens, vocab):
    return layer_gemms(tokens) * LAYERS + logits_gemms(tokens, vocab)


def fitted_tile_efficiency(flat, direction):
    """the tile efficiency at which the measured run's GEMMs of one direction take, through their
    waves, the time they take at the flat efficiency fitted to it: flat x sum(FLOPs / wave
    efficiency) / sum(FLOPs)"""
    gemms = [g for g in step_gemms(MEASURED_RUN_TOKENS, MEASURED_RUN_VOCAB) if g[2] == direction]
    flops = sum(m * n * k for _, _, _, m, n, k in gemms)
    return flat * sum(m * n * k / gemm_waves(m, n, k)[3] for _, _, _, m, n, k in gemms) / flops


FORWARD_TILE_EFFICIENCY = fitted_tile_efficiency(FORWARD_FLAT_EFFICIENCY, "forward")     # measured: fitted
BACKWARD_TILE_EFFICIENCY = fitted_tile_efficiency(BACKWARD_FLAT_EFFICIENCY, "backward")  # measured: fitted
BACKWARD_TILE_EFFICIENCY_ASSUMED = FORWARD_TILE_EFFICIENCY   # assumed: the backward on the forward's cuBLASLt path


# ----------------------------------------------------------------------------
# what the code says: the kernels' and device.cuh's constants, and the compiled kernels

def source_defines():
    """the integer #defines of device.cuh and of the kernels (kernels.cuh and the kernels/ files it
    includes, in its order): block sizes, chunk rows, tiles"""
    defines = {}
    with open(os.path.join(ROOT, "kernels.cuh")) as f:
        families = re.findall(r'^#include "(kernels/\w+\.cuh)"', f.read(), flags=re.M)
    for name in ["device.cuh", "kernels.cuh"] + families:
        with open(os.path.join(ROOT, name)) as f:
            for m in re.finditer(r"^#define\s+(\w+)\s+\(?(\d+)\)?\s*(?://.*)?$", f.read(), flags=re.M):
                defines.setdefault(m.group(1), int(m.group(2)))
    return defines


def sources_hash():
    h = hashlib.sha256()
    names = sorted(os.listdir(ROOT)) + ["kernels/" + n for n in sorted(os.listdir(os.path.join(ROOT, "kernels")))]
    for name in names:
        if name.endswith((".h", ".cuh", ".c")) or name == "Makefile":
            with open(os.path.join(ROOT, name), "rb") as f:
                h.update(name.encode() + f.read())
    return h.hexdigest()[:16]


def compiled_kernels():
    """{short name: (ptxas resources, SASS instructions)} of train.c for sm_90 in bf16, compiled
    once per version of the sources (cached in tests/build/recost/)"""
    os.makedirs(CACHE, exist_ok=True)
    label = f"train_sm90_bf16_{sources_hash()}"
    sass_path, log_path = os.path.join(CACHE, label + ".sass"), os.path.join(CACHE, label + ".ptxas.log")
    if not (os.path.exists(sass_path) and os.path.exists(log_path)):
        nvcc = test_sass.find_nvcc()
        nvdisasm = test_sass.find_nvdisasm(nvcc) if nvcc else None
        if not nvcc or not nvdisasm:
            sys.exit("recost: needs nvcc and nvdisasm to read the compiled kernels (see tests/test_sass.py)")
        for old in os.listdir(CACHE):   # one version kept
            os.remove(os.path.join(CACHE, old))
        test_sass.BUILD = CACHE
        _, _, error = test_sass.compile_cubin(nvcc, nvdisasm, "train.c", 90, [], label)
        if error:
            sys.exit(f"recost: train.c did not compile for sm_90: {error}")
    with open(sass_path) as f:
        sass = test_sass.parse_sass(f.read())
    with open(log_path) as f:
        ptxas = test_sass.parse_ptxas(f.read())
    names = test_sass.demangle(ptxas)
    return {test_sass.short_name(names[m]): (ptxas[m], sass.get(m, [])) for m in ptxas}


def kernel(kernels, name):
    if name not in kernels:
        sys.exit(f"recost: no kernel {name} in the sm_90 build (renamed? update tests/recost.py)")
    return kernels[name]


def loops(instructions):
    """each loop of a kernel (a branch back to a label above it) as its body's (opcode, text), its
    labels inside as ("LABEL", name)"""
    labels, body, found = {}, [], []
    for op, text in instructions:
        if op == "LABEL":
            labels[text] = len(body)
            body.append((op, text))
            continue
        body.append((op, text))
        target = re.search(r"\((\.L_x_\d+)\)", text) if op.startswith("BRA") else None
        if target and target.group(1) in labels:
            found.append(body[labels[target.group(1)]:])
    return found


def count(loop, prefix):
    return sum(op.startswith(prefix) for op, _ in loop)


WIDE = ("LDG.E.128", "STG.E.128")


def whole_pack_path(loop):
    """the instructions of a pack loop that a whole, aligned pack runs: a conditional branch
    forward to a 128-bit access (load_pack's test, `BRA P3, label`) skips the element-by-element
    path up to that label; and a basic block that loads or stores 16-bit elements is that path"""
    next_op = {}   # a label: the first instruction after it
    for i, (op, text) in enumerate(loop):
        if op == "LABEL":
            next_op[text] = next((o for o, _ in loop[i + 1:] if o != "LABEL"), None)
    kept, block, skip_to = [], [], None
    for op, text in loop:
        if skip_to is not None:
            if op == "LABEL" and text == skip_to:
                skip_to = None
            continue
        if op == "LABEL":
            continue
        block.append(op)
        branch = re.match(r"BRA !?U?P\w+, `\((\.L_x_\d+)\)", text)
        if branch and next_op.get(branch.group(1)) in WIDE:
            skip_to = branch.group(1)
        if op.startswith(("BRA", "BSYNC")) or skip_to is not None:
            kept.append(block)
            block = []
    kept.append(block)
    return sum(len(b) for b in kept if not any(re.match(r"(LDG|STG)\.E\.U?16$", op) for op in b))


def loops_with_wide_loads(instructions, wide_loads):
    """the loops holding exactly `wide_loads` 128-bit global loads"""
    return [l for l in loops(instructions) if count(l, "LDG.E.128") == wide_loads]


def loads_ahead(instructions):
    """the most loads from global memory one trip of a kernel's loop issues before it waits:
    the LDG count of its loop with the most of them"""
    return max(count(l, "LDG") for l in loops(instructions))


def blocks_per_sm(resources, threads, dynamic_shared=0):
    return max(1, test_sass.occupancy(90, resources["registers"], threads, resources["shared"] + dynamic_shared)[0])


# ----------------------------------------------------------------------------
# the re-cost of one micro-batch's and one step's kernels

STREAM = HBM_BANDWIDTH * STREAM_FRACTION


def hbm_bytes(first, again, working_set):
    """The L2 model (issue 52 item 3): a kernel's bytes with HBM are what it reads first and writes
    (`first`), and what it reads again (`again`) only where the working set of its blocks in flight
    between the first read and the next does not fit in the L2 (L2_BYTES; LRU over a longer cycle
    than the cache: every line is gone by the time it is read again). Where it fits, the re-reads
    come from L2, priced apart by a kernel's L2 traffic where it has one."""
    return first + (again if working_set > L2_BYTES else 0.0)


def chains_seconds(blocks, per_sm, trips, l2_trips=0.0):
    """blocks in waves of per_sm an SM, each a chain of trips to memory (and to L2) in a row"""
    return math.ceil(blocks / (per_sm * SMS)) * (trips * MEMORY_LATENCY_S + l2_trips * L2_LATENCY_S)


class Recost:
    def __init__(self, kernels, defines, batch, efficiencies):
        self.k, self.d, self.B = kernels, defines, batch
        self.N = batch * T
        self.efficiencies = efficiencies   # a tile's efficiency: {"forward": e, "backward": e}
        self.rows = {}   # planner row: [launches, seconds]
        self.gemms = {}  # (row, name, M, N, K): [GEMMs, seconds, efficiency of the peak]
        self.l2_notes = {}   # kernel: what the L2 model says of it (printed under the table)

    def add(self, row, launches, seconds):
        r = self.rows.setdefault(row, [0, 0.0])
        r[0] += launches
        r[1] += seconds

    def memory(self, row, launches, bytes_, chains=0.0):
        self.add(row, launches, max(bytes_ / STREAM, chains))

    # a GEMM (cuBLAS, cuBLASLt): its FLOPs at a tile's efficiency times its shape's wave efficiency,
    # or both inputs read and the output written, whichever is longer (cost.h's gemm_seconds)
    def gemm(self, row, name, direction, M, N, K):
        waves = gemm_waves(M, N, K)[3]
        efficiency = self.efficiencies[direction] * waves
        seconds = max(2.0 * M * N * K / (PEAK_FLOPS * efficiency), (M * K + K * N + M * N) * X / STREAM)
        self.add(row, 1, seconds)
        g = self.gemms.setdefault((row, name, M, N, K), [0, 0.0, 0.0])
        g[0] += 1
        g[1] += seconds
        g[2] = 2.0 * M * N * K / (PEAK_FLOPS * seconds)

    # the embedding: encoder_forward_kernel (a warp a row: the token's and the position's rows
    # read, the output written; a micro-batch's sequences share the T positions' rows, from L2
    # after the first by the L2 model: 1.5 MB), encoder_backward_wte_kernel (a thread an element: dout read, an fp32
    # atomic add into the token's row of dwte, a read and a write in memory at most) and
    # encoder_backward_wpe_kernel (a thread an element of dwpe adding the B rows t, t + T, ...
    # one load after another: its loop holds one load)
    def embedding(self):
        N, B = self.N, self.B
        self.memory("embedding", 1, hbm_bytes(4 * N + N * C * X + T * C * X + N * C * X, (B - 1) * T * C * X, T * C * X))
        self.memory("embedding", 1, 4 * N + N * C * X + N * C * 8)
        res, sass = kernel(self.k, "encoder_backward_wpe_kernel")
        block = self.d["ELEMENTWISE_BLOCK"]
        chains = chains_seconds(math.ceil(T * C / block), blocks_per_sm(res, block), B / loads_ahead(sass))
        self.memory("embedding", 1, N * C * X + T * C * 8, chains)

    # layernorm_forward_kernel and residual_layernorm_forward_kernel: a warp a row, its packs'
    # loads together; the input(s) read, the output(s) written, mean and rstd (fp32) written. The
    # fused one reads back the residual row it wrote from its own lane's cache lines.
    def layernorm_forward(self):
        self.memory("layernorm forward", 1, 2 * self.N * C * X + 8 * self.N)

    def residual_layernorm(self):
        self.memory("residual + layernorm (fused)", 1, 4 * self.N * C * X + 8 * self.N)

    def residual(self):
        self.memory("residual add", 1, 3 * self.N * C * X)

    # the fused attention forward: B x heads x 16 query tiles of 64 rows, each walking the key
    # tiles at and left of the diagonal (136 pairs a head at T 1024), 4 warps a block, each warp
    # running the inner loop once a pair; its L2 traffic: a pair's K and V tiles
    def attention_forward(self):
        rows, keys = self.d["FLASH_ROWS"], 64 if HS <= 64 else 32
        pairs = sum(math.ceil(min(T, r0 + rows) / keys) for r0 in range(0, T, rows))
        _, sass = kernel(self.k, f"attention_forward_flash_kernel<{HS}, false, false>")
        loop = test_sass.inner_loop(sass)[2]
        warps = rows // 16
        issue = self.B * HEADS * pairs * warps * loop / ISSUE_RATE
        l2 = self.B * HEADS * pairs * 2 * keys * HS * X / L2_BANDWIDTH
        # its bytes with HBM by the L2 model: q, k, v read once, out and lse written; the K and V
        # tiles read again by a head's other query tiles from L2 where the heads in flight hold
        # less than it (a head's 16 blocks adjacent, flash_query_block: slots / 16 + 1 heads)
        res, _ = kernel(self.k, f"attention_forward_flash_kernel<{HS}, false, false>")
        shared = (rows + 4 * keys) * (HS + self.d["FLASH_PAD"]) * X   # q, and k's and v's two buffers
        heads = math.ceil(blocks_per_sm(res, 32 * warps, shared) * SMS / (T // rows)) + 1
        again = self.B * HEADS * (pairs * 2 * keys * HS * X - 2 * T * HS * X)
        bytes_ = hbm_bytes(self.B * HEADS * (4 * T * HS * X + 4 * T), again, heads * 2 * T * HS * X)
        self.add("attention, fused", 1, max(issue, l2, bytes_ / STREAM))
        self.l2_notes["attention forward"] = (
            f"{heads} heads in flight x {2 * T * HS * X / 1e3:.0f} KB of K and V = {heads * 2 * T * HS * X / 1e6:.1f} MB: "
            f"{bytes_ / 1e9:.3f} GB a layer with HBM, {1e3 * bytes_ / STREAM:.3f} ms; its L2 traffic {1e3 * l2:.3f} ms; "
            f"its issue {1e3 * issue:.3f} ms")

    # the backward: the D kernel (dout and out read, D written: memory), then one block per 64-key
    # tile stepping down the 32-row query steps at and below it (272 a head at T 1024), 4 warps
    # running the inner loop once a step; its L2 traffic a step: q and dO (16-bit), the rows' lse
    # and D, and dQ's fp32 part read and written by every key tile after the first; its bytes with
    # HBM by the L2 model over the list schedule of its windowed tickets (attention_backward_hbm,
    # below: what a pair's blocks read again stays in L2 where the pairs touched between two tiles
    # of one fit it: k, v, q, dO, lse and D read once, dq, dk, dv and dQ's sums written once)
    def attention_backward(self):
        rows, step = self.d["FLASH_ROWS"], self.d["FLASH_STEP"]
        steps = sum(math.ceil((T - r0) / step) for r0 in range(0, T, rows))
        first_parts = math.ceil(T / step)
        self.memory("attention, fused", 1, self.B * HEADS * (2 * T * HS * X + 4 * T))
        _, sass = kernel(self.k, f"attention_backward_flash_kernel<{HS}, false, false>")
        loop = test_sass.inner_loop(sass)[2]
        issue = self.B * HEADS * steps * (rows // 16) * loop / ISSUE_RATE
        l2 = self.B * HEADS * (steps * (2 * step * HS * X + 2 * 4 * step) + (steps - first_parts) * 2 * step * HS * 4)
        memory = windowed_backward_hbm(self.k, self.d, self.B) / LAYERS   # the L2 model over the windowed schedule
        self.add("attention, fused", 1, max(issue, l2 / L2_BANDWIDTH, memory / STREAM))
        self.l2_notes["attention backward"] = (
            f"{memory / 1e9:.3f} GB a layer with HBM by the L2 model over its windowed schedule, "
            f"{1e3 * memory / STREAM:.3f} ms; its L2 traffic {1e3 * l2 / L2_BANDWIDTH:.3f} ms; its issue {1e3 * issue:.3f} ms "
            f"(the longest prices it)")

    # a bias gradient (kernels/linear.cuh's matmul_backward_params): the weight gradient's GEMM sums
    # dout's columns in its BGRADB epilogue (inside the GEMMs' fitted efficiency: the GEMM reads
    # dout anyway), then column_partials_add_kernel with one chunk adds the OC sums to the
    # gradient: OC / 32 blocks, one trip each, the sums read and the gradient read and written
    def bias_grad(self, OC):
        res, sass = kernel(self.k, "column_partials_add_kernel")
        blocks = math.ceil(OC / 32)
        chains = chains_seconds(blocks, blocks_per_sm(res, self.d["COLUMN_ADD_BLOCK"]), 1)
        self.memory("bias gradients (GEMM epilogue)", 1, 3 * 4 * OC, chains)

    # LayerNorm's backward: layernorm_backward_kernel, a block of 8 warps a chunk of 32 rows,
    # dout and the input read (step 1 from memory, step 2 from the cache), dinp read and written,
    # the statistics read, the chunk's partials written; its trips: one a window of 256 columns
    # in each step; issue: its two window loops (the whole-pack instance: 9 and 13 128-bit loads);
    # then column_partials_add_kernel, 32 columns a 1024-thread block, each warp a run of the
    # chunks from L2, `loads_ahead` a trip
    def layernorm_backward(self):
        d, N = self.d, self.N
        chunks = math.ceil(N / d["COLUMN_CHUNK_ROWS"])
        res, sass = kernel(self.k, "layernorm_backward_kernel")
        windows = math.ceil(C / (32 * d["X128"]))   # NORM_WINDOW: a pack a lane
        chains = chains_seconds(chunks, blocks_per_sm(res, d["COLUMN_BLOCK"]), 2 * windows)
        rows_per_warp = d["COLUMN_CHUNK_ROWS"] // (d["COLUMN_BLOCK"] // 32)
        step_loops = [loops_with_wide_loads(sass, 2 * rows_per_warp + 1), loops_with_wide_loads(sass, 3 * rows_per_warp + 1)]
        if not all(step_loops):
            sys.exit("recost: layernorm_backward_kernel's two window loops not found in the SASS (update tests/recost.py)")
        per_window = sum(min(whole_pack_path(l) for l in found) for found in step_loops)
        issue = chunks * (d["COLUMN_BLOCK"] // 32) * windows * per_window / ISSUE_RATE
        partials = 2 * chunks * C * 4
        self.add("layernorm backward", 1, max((4 * N * C * X + 8 * N + partials) / STREAM, chains, issue))
        res, sass = kernel(self.k, "column_partials_add_kernel")
        block = d["COLUMN_ADD_BLOCK"]
        run = math.ceil(chunks / (block // 32))
        chains = chains_seconds(math.ceil(2 * C / 32), blocks_per_sm(res, block), 0, run / loads_ahead(sass) + 1)
        self.add("layernorm backward", 1, max(partials / L2_BANDWIDTH, chains))

    # crossentropy_forward_fused_kernel: a block a row, the row's logits read from memory once
    # and dlogits written; the second pass reads the row again, from L2 by the L2 model where
    # the rows of the blocks in flight (ptxas's blocks an SM x the SMs) fit it (as its comment
    # says: 2 blocks an SM hold 26 MB), else from memory; its pack loops (the statistics', the gradient's) issue-bound at the rate above
    # where they take longer than the bytes. Since issue 39 a 16-byte aligned row (GPT-2's
    # 50,304 columns) runs loops of 128-bit accesses alone, and the loops with 16-bit ones take
    # only the row's last pack; before, each loop chose per pack (whole_pack_path)
    def crossentropy(self):
        N = self.N
        res, sass = kernel(self.k, "crossentropy_forward_fused_kernel")
        pack_loops = [l for l in loops(sass) if any(op in WIDE for op, _ in l)]
        whole_only = [l for l in pack_loops if not any(re.match(r"(LDG|STG)\.E\.U?16$", op) for op, _ in l)]
        per_pack = (sum(len(l) for l in whole_only) if whole_only else
                    sum(whole_pack_path(l) for l in pack_loops))
        warp_trips = math.ceil(VOCAB_PADDED / self.d["X128"] / 32)   # a warp's trip: 32 packs of a row
        issue = N * warp_trips * per_pack / ISSUE_RATE
        row = VOCAB_PADDED * X
        in_flight = blocks_per_sm(res, min(self.d["CROSSENTROPY_BLOCK"], math.ceil(VOCAB_PADDED / self.d["X128"] / 32) * 32)) * SMS
        memory = hbm_bytes(2 * N * row, N * row, in_flight * row)   # read, written; the second pass's read again
        self.add("cross-entropy", 1, max(memory / STREAM, issue))
        self.l2_notes["cross-entropy"] = (
            f"{in_flight} rows in flight x {row / 1e3:.1f} KB = {in_flight * row / 1e6:.1f} MB against {L2_BYTES / 1e6:.0f} MB: "
            f"the second pass {'from L2' if in_flight * row <= L2_BYTES else 'from HBM'}; {memory / 1e9:.2f} GB with HBM, "
            f"{1e3 * memory / STREAM:.3f} ms; its issue {1e3 * issue:.3f} ms")

    def gemms_of(self, gemms, direction):
        for row, name, d, M, N, K in gemms:
            if d == direction:
                self.gemm(row, name, d, M, N, K)

    def micro_batch(self):
        N = self.N
        layer, logits = layer_gemms(N), logits_gemms(N, VOCAB_PADDED)
        self.embedding()
        self.layernorm_forward()                                  # layer 0's ln1
        for i in range(LAYERS):
            self.gemms_of(layer, "forward")                        # qkv, proj, fc (+GELU), fcproj
            self.attention_forward()
            self.residual_layernorm()                               # res2 and ln2
            if i + 1 < LAYERS:
                self.residual_layernorm()                           # res3 and the next ln1
            else:
                self.residual()
        self.layernorm_forward()                                  # lnf
        self.gemms_of(logits, "forward")
        self.crossentropy()
        self.add("launches: loss_mean_add (not a planner row: its launch counted)", 1, 0.0)
        self.gemms_of(logits, "backward")                         # dx and dW
        self.memory("layernorm backward", 1, N * C * X)            # dres zeroed (cudaMemset)
        self.layernorm_backward()                                  # lnf's
        for _ in range(LAYERS):
            self.gemms_of(layer, "backward")                      # dinp and dW of each (fcproj's with DGELU)
            for OC in (C, FFN, C, 3 * C):                           # fcproj, fc, proj, qkv
                self.bias_grad(OC)
            self.layernorm_backward()                              # ln2's
            self.attention_backward()
            self.layernorm_backward()                              # ln1's

    # the optimizer, once a step: the fp32 gradients zeroed (cudaMemset), the norm's two kernels
    # (the shard's squares: 1024 blocks, a thread's loop loading `loads_ahead` a trip; the final
    # sum), AdamW (a block a piece of SHARD_PIECE, a thread an element a trip: master, grad, m, v
    # read, master, m, v and the 16-bit parameter written)
    def optimizer(self):
        d = self.d
        P = VOCAB_PADDED * C + T * C + LAYERS * (12 * C * C + 13 * C) + 2 * C
        self.memory("zero gradients", 1, 4 * P)
        res, sass = kernel(self.k, "sum_squares_ranges_partial_kernel")
        blocks, threads = d["SUM_SQUARES_MAX_BLOCKS"], d["SUM_SQUARES_BLOCK"]
        chains = chains_seconds(blocks, blocks_per_sm(res, threads), P / (blocks * threads) / loads_ahead(sass))
        self.memory("gradient norm", 1, 4 * P, chains)
        self.add("gradient norm", 1, chains_seconds(1, 1, 0, 1 + blocks / threads))
        res, _ = kernel(self.k, "adamw_ranges_kernel")
        threads = d["ELEMENTWISE_BLOCK"]
        pieces = math.ceil(P / d["SHARD_PIECE"])
        chains = chains_seconds(pieces, blocks_per_sm(res, threads), d["SHARD_PIECE"] / threads)
        self.memory("AdamW", 1, P * (7 * 4 + X), chains)

    def step(self):
        self.micro_batch()
        self.optimizer()
        launches = sum(r[0] for r in self.rows.values())
        self.add("kernel launch gaps", launches, launches * LAUNCH_GAP_S)
        return self.rows


# ----------------------------------------------------------------------------
# the planner's rows, and the table

# the re-cost's rows and the planner's rows (prefixes of their names) each stands for: a
# GEMM's epilogue is inside its fitted efficiency, so the planner's epilogue rows join the GEMMs'
ROWS = [
    ("embedding", ["embedding"]),
    ("layernorm forward", ["layernorm forward"]),
    ("residual + layernorm (fused)", ["residual + layernorm"]),
    ("linear layers forward", ["linear layers forward", "GELU epilogue's second output"]),
    ("attention, fused", ["attention, fused"]),
    ("linear layers backward", ["linear layers backward", "GELU backward: the DGELU"]),
    ("bias gradients (GEMM epilogue)", ["bias gradients"]),
    ("layernorm backward", ["layernorm backward"]),
    ("residual add", ["residual add"]),
    ("logits", ["logits"]),
    ("cross-entropy", ["cross-entropy"]),
    ("kernel launch gaps", ["kernel launch gaps"]),
    ("zero gradients", ["zero gradients"]),
    ("gradient norm", ["gradient norm"]),
    ("AdamW", ["AdamW"]),
]


def planner_rows(batch):
    """{planner row name: (launches, ms)} and the planner's step in ms, from its dry run"""
    found = subprocess.run(planner_command(batch), cwd=ROOT, capture_output=True, text=True)
    if found.returncode != 0:
        sys.exit(f"recost: the planner's dry run failed ({' '.join(planner_command(batch))}): {found.stderr.strip()[-300:]}")
    rows = {}
    section = found.stdout.split("'s step (the slowest", 1)[-1].split("GEMMs only", 1)[0]
    for m in re.finditer(r"^  (\S.*?)\s+(\d+) \|\s+[\d.]+ \|\s+[\d.]+ \|\s+([\d.]+) \|", section, flags=re.M):
        rows[m.group(1)] = (int(m.group(2)), float(m.group(3)))
    step = re.search(r"step = .* = \d+ x ([\d.]+) s \+ ([\d.]+) s", found.stdout)
    if not rows or not step:
        sys.exit("recost: could not read the planner's table from its dry run")
    return rows, 1e3 * (float(step.group(1)) + float(step.group(2)))


def planner_row(rows, prefixes):
    picked = [(n, v) for n, v in rows.items() if any(n.startswith(p) for p in prefixes)]
    return sum(v[0] for _, v in picked), sum(v[1] for _, v in picked), [n for n, _ in picked]


def table(batch, kernels, defines):
    """the rows [(name, launches, re-cost ms, re-cost ms with the assumed backward, planner ms)] and totals"""
    measured_recost = Recost(kernels, defines, batch, {"forward": FORWARD_TILE_EFFICIENCY, "backward": BACKWARD_TILE_EFFICIENCY})
    measured = measured_recost.step()
    assumed = Recost(kernels, defines, batch, {"forward": FORWARD_TILE_EFFICIENCY,
                                              "backward": BACKWARD_TILE_EFFICIENCY_ASSUMED}).step()
    planner, planner_step = planner_rows(batch)
    rows, claimed = [], set()
    for name, prefixes in ROWS:
        launches, seconds = measured[name]
        p_launches, p_ms, names = planner_row(planner, prefixes)
        claimed.update(names)
        rows.append((name, launches, 1e3 * seconds, 1e3 * assumed[name][1], p_ms, p_launches))
    unclaimed = [n for n in planner if n not in claimed]
    if unclaimed:
        sys.exit(f"recost: the planner has rows the re-cost does not price: {', '.join(unclaimed)}")
    total = {k: 1e3 * sum(v[1] for v in r.values()) for k, r in (("measured", measured), ("assumed", assumed))}
    for name, note in measured_recost.l2_notes.items():
        print(f"L2 model at {batch} x {T}, {name}: {note}")
    return rows, total, planner_step, measured_recost.gemms


def print_gemms(batch, gemms, markdown):
    """each GEMM's shape, waves and the share of the peak it reaches (the measured backward's)"""
    head = ["GEMM", "M x N over K", "tiles", "split-K", "waves", "wave efficiency", "of the peak", "ms a step (all)"]
    lines = []
    for (row, name, M, N, K), (n, seconds, efficiency) in gemms.items():
        tiles, splits, waves, wave = gemm_waves(M, N, K)
        lines.append([name + (f" (x {n})" if n > 1 else ""), f"{M} x {N} over {K}", str(tiles), str(splits), str(waves),
                      f"{wave:.3f}", f"{efficiency:.3f}", f"{1e3 * seconds:.3f}"])
    print(f"\nthe GEMMs at {batch} x {T} (a tile's efficiency {FORWARD_TILE_EFFICIENCY:.3f} forward, "
          f"{BACKWARD_TILE_EFFICIENCY:.3f} backward: the measured run's fit through the waves)")
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("| --- | --- |" + " ---: |" * (len(head) - 2))
        for line in lines:
            print("| " + " | ".join(line) + " |")
        return
    widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(head)]
    for line in [head] + lines:
        print("  ".join(cell.ljust(widths[i]) if i < 2 else cell.rjust(widths[i]) for i, cell in enumerate(line)))


def print_table(batch, rows, total, planner_step, markdown):
    tokens = batch * T
    head = ["kernel (planner's row)", "launches", f"re-cost ms (bwd tiles at {BACKWARD_TILE_EFFICIENCY:.3f}, measured)",
            f"re-cost ms (bwd tiles at {BACKWARD_TILE_EFFICIENCY_ASSUMED:.3f}, assumed)", "planner ms",
            "planner / re-cost"]
    lines = []
    for name, launches, ms, ms_assumed, p_ms, _ in rows:
        ratio = p_ms / ms if ms > 0 else float("inf")
        lines.append([name, str(launches), f"{ms:.3f}", f"{ms_assumed:.3f}", f"{p_ms:.3f}", f"{ratio:.2f}"])
    def rate(ms):
        return f"{tokens / (ms / 1e3) / 1e3:.0f}K tokens/s"
    lines.append(["**step**" if markdown else "step", "", f"{total['measured']:.2f} ({rate(total['measured'])})",
                  f"{total['assumed']:.2f} ({rate(total['assumed'])})", f"{planner_step:.2f} ({rate(planner_step)})",
                  f"{planner_step / total['measured']:.2f}"])
    print(f"\nGPT-2 124M, {batch} x {T} a micro-batch, one micro-batch a step, bf16, fused attention, one H100 SXM "
          f"(ESTIMATES: no GPU ran this; llm.c measured {LLMC_TOKENS_PER_S / 1e3:.0f}K tokens/s at 64 x 1024)")
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for line in lines:
            print("| " + " | ".join(line) + " |")
        return
    widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(head)]
    for line in [head] + lines:
        print("  ".join(cell.ljust(widths[0]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(line)))


def check(batch, rows):
    """the rows where the planner is outside [1/TOLERANCE, TOLERANCE] of the re-cost (the checked one)"""
    bad = []
    for name, _, ms, ms_assumed, p_ms, _ in rows:
        ms_checked = ms if CHECKED_BACKWARD == "measured" else ms_assumed
        if not (ms_checked / TOLERANCE <= p_ms <= ms_checked * TOLERANCE):
            bad.append(f"recost: {batch} x {T}, {name}: planner {p_ms:.3f} ms against the re-cost's {ms_checked:.3f} "
                       f"({p_ms / ms_checked:.2f}x, outside 1/{TOLERANCE} to {TOLERANCE})")
    return bad


# ----------------------------------------------------------------------------
# The attention backward's traffic with main memory by the order of its tickets (issue 52): a list
# schedule of its blocks (as above, with the dQ turns: a tile's step waits for the tile before it
# at that step) and a simple model of the L2 over it.
HBM_TARGET_64 = 15e9             # issue 52's target for the windowed order at 64 x 1024, bytes a step


def window_sizes(pairs, windows):
    """kernels/flash_attention.cuh's windows: the first pairs % windows of one pair more"""
    return [pairs // windows + (w < pairs % windows) for w in range(windows)]


def backward_schedule(pairs, windows, tiles, slots, walk_down):
    """The backward's blocks (one per key tile of each pair) started in ticket order on `slots` as
    slots free: tickets window by window (window_sizes; one window is the order before issue 52),
    in a window tile 0 of each pair, then tile 1, ... Tile kt walks the 2 (tiles - kt)
    query steps from its diagonal's, a step a unit of time, upwards or (walk_down) from the last;
    its part of a step's dQ comes after the part of tile kt - 1 of its pair (the add's own time left
    out). Returns (the end over the work's even share, the share of the blocks' time spent waiting,
    the most pairs whose blocks ran between the starts of two tiles of one pair)."""
    steps_T = 2 * tiles
    sizes = window_sizes(pairs, windows)
    tickets = [(kt, p) for w in range(windows) for kt in range(tiles)
               for p in range(sum(sizes[:w]), sum(sizes[:w + 1]))]
    free = [(0.0, i) for i in range(slots)]
    done, started, spans, waited, work, end = {}, {}, [], 0.0, 0, 0.0
    running = []   # (end, pair) of the blocks started so far that may still run
    for kt, p in tickets:
        start, slot = heapq.heappop(free)
        running = [(e, q) for e, q in running if e > start]
        if kt > 0:   # the pairs touched since this pair's previous tile started: running then or started since
            spans.append(len(started[p] | {q for _, q in running} | {p}))
        for q in started:
            started[q].add(p)
        started[p] = {q for _, q in running}
        t = start
        for s in (reversed(range(2 * kt, steps_T)) if walk_down else range(2 * kt, steps_T)):
            t += 1.0
            if kt > 0 and done[p, kt - 1, s] > t:
                waited += done[p, kt - 1, s] - t
                t = done[p, kt - 1, s]
            done[p, kt, s] = t
        work += steps_T - 2 * kt
        running.append((t, p))
        heapq.heappush(free, (t, slot))
        end = max(end, t)
    return end / (work / slots), waited / work, max(spans, default=1)


def attention_backward_hbm(batch, touched):
    """one step's bytes between the attention backward's main kernel and HBM (all layers), and the
    L2 working set: what a pair's blocks read again (q, dout, the rows' lse and D, dQ's fp32 sums)
    for the `touched` pairs that run between two tiles of one pair. Where it fits the L2, only the
    first read of each and one write of the sums reach memory; where not, every read (LRU over a
    cycle longer than the cache: the lines are gone when the next tile comes back) and every write
    of the sums."""
    tiles, step = T // 64, 32
    visits = sum(s // 2 + 1 for s in range(T // step))         # (query step, key tile) pairs: 272 at T 1024
    rows = step * (2 * HS * X + 2 * 4)                          # a step's q and dout rows, its lse and D
    sums = step * HS * 4                                        # a step's fp32 partial sums of dQ
    pair_bytes = T * (HS * (4 + 2 * X) + 2 * 4)                 # as flash_ticket_window counts them
    working_set = touched * pair_bytes
    compulsory = 2 * T * HS * X + 3 * T * HS * X                # k and v read; dq, dk and dv written
    if working_set <= L2_BYTES:
        per_pair = compulsory + (T // step) * rows + (T // step) * sums
    else:
        per_pair = compulsory + visits * rows + 2 * (visits - T // step) * sums
    return LAYERS * batch * HEADS * per_pair, working_set


def backward_slots(kernels, defines):
    """the attention backward's blocks in flight on the GPU: blocks an SM (ptxas's registers and
    flash_shared_bytes) x the SMs"""
    res, _ = kernel(kernels, f"attention_backward_flash_kernel<{HS}, false, false>")
    rows, step, pad = defines["FLASH_ROWS"], defines["FLASH_STEP"], defines["FLASH_PAD"]
    shared = (2 * rows + 4 * step) * (HS + pad) * X + rows * (step + pad) * X + 4 * step * 4 + 16   # flash_shared_bytes
    return blocks_per_sm(res, 32 * (rows // 16), shared) * SMS


def backward_windows(batch, defines):
    """kernels/flash_attention.cuh's flash_ticket_windows at this batch"""
    pair_bytes = T * (HS * (4 + 2 * X) + 2 * 4)
    return math.ceil(batch * HEADS / max(1, defines["FLASH_WINDOW_L2_BYTES"] // pair_bytes))


WINDOWED_HBM = {}   # batch: the windowed order's bytes a step (the schedule once a shape)


def windowed_backward_hbm(kernels, defines, batch):
    """the windowed order's bytes a step with HBM by the L2 model over its list schedule (the rows'
    figure for the attention backward's main kernel)"""
    if batch not in WINDOWED_HBM:
        _, _, touched = backward_schedule(batch * HEADS, backward_windows(batch, defines), T // 64,
                                          backward_slots(kernels, defines), True)
        WINDOWED_HBM[batch] = attention_backward_hbm(batch, touched)[0]
    return WINDOWED_HBM[batch]


def print_attention_backward_hbm(kernels, defines):
    """the old order and the windowed one at both shapes; the windowed one's bytes at 64 x 1024"""
    slots = backward_slots(kernels, defines)
    found = {}
    for batch in SHAPES:
        pairs = batch * HEADS
        windows = backward_windows(batch, defines)
        sizes = sorted(set(window_sizes(pairs, windows)))
        for name, w, down in (("tile by tile over all pairs (before issue 52)", 1, False),
                              (f"in {windows} windows of {' or '.join(map(str, sizes))} pairs, each tile walking down",
                               windows, True)):
            tail, waiting, touched = backward_schedule(pairs, w, T // 64, slots, down)
            hbm, working_set = attention_backward_hbm(batch, touched)
            found[batch, down] = hbm
            print(f"attention backward at {batch} x {T}, tickets {name}: {hbm / 1e9:.1f} GB a step from HBM "
                  f"(L2 model: {touched} pairs touched between two tiles of one, {working_set / 1e6:.1f} MB against "
                  f"{L2_BYTES / 1e6:.0f} MB of L2); the blocks end {tail:.3f}x the work's even share on {slots} slots, "
                  f"{100 * waiting:.1f}% of their time waiting for a turn")
    return found[64, True]


# the constants tests/refit_planner.py refits from a GPU's measurement, each a flag here (its line
# "recost.py: --tile-efficiency E ..." is given as it prints it): a tile's efficiency (the
# planner's --hw-matmul-efficiency: the same shape model; both directions, the GPU's run being
# on the cuBLASLt path both ways), the streaming share of the datasheet bandwidth (its
# --hw-memory-efficiency), the idle latency to memory (its --hw-memory-latency-us), the
# device's gap between kernels (its launch_us) and the warp instructions a second of an
# issue-bound loop (in proportion to its --hw-attention-efficiency: the fused attention is priced
# by its issue here, by its products there)
OVERRIDES = {"--tile-efficiency": "tile efficiency", "--stream-fraction": "STREAM_FRACTION",
             "--memory-latency-us": "MEMORY_LATENCY_S", "--launch-gap-us": "LAUNCH_GAP_S", "--issue-rate-g": "ISSUE_RATE"}


def apply_overrides(args):
    """set the constants the flags give (the rest of args returned)"""
    global FORWARD_TILE_EFFICIENCY, BACKWARD_TILE_EFFICIENCY, BACKWARD_TILE_EFFICIENCY_ASSUMED
    global STREAM_FRACTION, STREAM, MEMORY_LATENCY_S, L2_LATENCY_S, LAUNCH_GAP_S, ISSUE_RATE, CONSTANTS_SOURCE
    rest, i = [], 0
    while i < len(args):
        if args[i] not in OVERRIDES:
            rest.append(args[i])
            i += 1
            continue
        if i + 1 >= len(args):
            sys.exit(f"recost: {args[i]} takes a number")
        try:
            value = float(args[i + 1])
        except ValueError:
            sys.exit(f"recost: {args[i]} takes a number, not {args[i + 1]}")
        if value <= 0 or (args[i] in ("--tile-efficiency", "--stream-fraction") and value > 1):
            sys.exit(f"recost: {args[i]} {args[i + 1]} is outside its range")
        if args[i] == "--tile-efficiency":
            FORWARD_TILE_EFFICIENCY = BACKWARD_TILE_EFFICIENCY = BACKWARD_TILE_EFFICIENCY_ASSUMED = value
        elif args[i] == "--stream-fraction":
            STREAM_FRACTION = value
            STREAM = HBM_BANDWIDTH * STREAM_FRACTION
        elif args[i] == "--memory-latency-us":
            MEMORY_LATENCY_S, L2_LATENCY_S = value * 1e-6, value * 1e-6 / 2   # L2 at half, as Table 3's 200 of 400
        elif args[i] == "--issue-rate-g":
            ISSUE_RATE = value * 1e9
        else:
            LAUNCH_GAP_S = value * 1e-6
        CONSTANTS_SOURCE = "refitted: given on the command line (tests/refit_planner.py's line)"
        i += 2
    return rest


CONSTANTS_SOURCE = "the sources at the top of tests/recost.py"


def print_constants():
    print(f"recost constants ({CONSTANTS_SOURCE}): tile efficiency forward {FORWARD_TILE_EFFICIENCY:.4g}, backward "
          f"{BACKWARD_TILE_EFFICIENCY:.4g} (assumed {BACKWARD_TILE_EFFICIENCY_ASSUMED:.4g}); stream fraction "
          f"{STREAM_FRACTION:.4g}; memory latency {MEMORY_LATENCY_S * 1e6:.4g} us; launch gap {LAUNCH_GAP_S * 1e6:.4g} us; "
          f"issue rate {ISSUE_RATE / 1e9:.0f} G; L2 {L2_BANDWIDTH / 1e12:.2f} TB/s, {L2_BYTES / 1e6:.0f} MB")


def main():
    args = apply_overrides(sys.argv[1:])
    if "--constants" in args:   # the constants alone, nothing compiled (tests/test_gpu_check.sh)
        print_constants()
        return 0
    kernels, defines = compiled_kernels(), source_defines()
    print("ESTIMATES: every re-cost figure below is computed from the code, the compiled SASS and the constants at "
          "the top of tests/recost.py; none is measured. The planner's are its own estimates (plan.h).")
    print_constants()
    print(f"GEMMs: FLOPs / (989 TFLOP/s x a tile's efficiency x the shape's wave efficiency, cost.h's {GEMM_TILE} x "
          f"{GEMM_TILE} tiles over {SMS} SMs, split-K slices of {GEMM_SPLIT_K} at least); a tile's efficiency fitted "
          f"through the waves to the H200 run at {MEASURED_RUN_TOKENS} tokens: forward {FORWARD_TILE_EFFICIENCY:.3f} "
          f"(its flat {FORWARD_FLAT_EFFICIENCY}, measured), backward {BACKWARD_TILE_EFFICIENCY:.3f} (its flat "
          f"{BACKWARD_FLAT_EFFICIENCY}, measured, the old cublasGemmEx path) or {BACKWARD_TILE_EFFICIENCY_ASSUMED:.3f} "
          f"(assumed: the forward's, cuBLASLt's path); --check holds the planner to the {CHECKED_BACKWARD} one")
    failures = []
    for batch in SHAPES:
        rows, total, planner_step, gemms = table(batch, kernels, defines)
        print_table(batch, rows, total, planner_step, "--markdown" in args)
        print_gemms(batch, gemms, "--markdown" in args)
        failures += check(batch, rows)
    windowed_64 = print_attention_backward_hbm(kernels, defines)
    hbm_ok = windowed_64 <= HBM_TARGET_64
    print(f"attention backward HBM: {'PASS' if hbm_ok else 'FAIL'}: the windowed tickets' {windowed_64 / 1e9:.1f} GB a "
          f"step at 64 x {T} by the L2 model (ESTIMATE), at most issue 52's {HBM_TARGET_64 / 1e9:.0f} GB")
    if "--check" in args:
        for line in failures:
            print(line)
        print("recost: " + ("FAIL" if failures else "PASS") + f": the planner within {TOLERANCE}x of the re-cost on "
              f"every row at {' and '.join(f'{b} x {T}' for b in SHAPES)}")
        return 1 if failures or not hbm_ok else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
