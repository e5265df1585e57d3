/*
hardware.h — the machines a plan is priced on: the Hardware a cost model needs (peaks,
efficiencies, memory, its bandwidths and latencies, the links), --hw's GPU presets with the
source of each number, this machine's CPU measured now (the CPU build's plan: this_machine, with
make bench's FMA loop and matmul, which tests/bench.c calls), and the --hw-* flags that replace
a number (config.h declares them). plan.h, above, prices a step on it; a room of its own because
the figures and their sources are one concern, read and refitted (tests/refit_planner.py) apart
from the model that uses them.
*/
#pragma once

typedef struct {
    double peak_tflops;                             // dense fp16/bf16 tensor-core peak (datasheet)
    double matmul_efficiency;                       // the fraction of it a large GEMM reaches (gemm_seconds)
    double attention_efficiency;                    // the fraction the fused attention's products reach (0: none)
    double memory_efficiency;                       // the fraction of the memory bandwidth a streaming kernel reaches
    double sm_count;                                // streaming multiprocessors: a GEMM's tiles run in waves of these
    double memory_gib, memory_bandwidth;            // GiB; GB/s
    double l2_bandwidth;                            // GB/s a kernel reaches reading what L2 holds (charge_flash_kernel)
    double memory_latency_us;                       // a load's round trip to memory, when nothing hides it (chain_seconds)
    double launch_us;                               // the device idle between two kernels of a stream (charge_launch_gaps)
    double nvlink_bandwidth, internode_bandwidth;   // GB/s per GPU and direction
    double gpus_per_node;
    double latency_us;                              // per message: a ring step or a send
    double reserve_gib;                             // memory left to CUDA, cuBLAS and NCCL: not ours
    double cpu_threads;                             // 0: a GPU; else this machine's CPU, the threads of a rank
} Hardware;

// --hw's presets, in its order. NVIDIA's datasheets for the GPUs (V100 SXM2, A100 SXM4, H100
// SXM5; NVLink's total bandwidth halved: one direction), its architecture whitepapers for the
// SMs (80, 108, 132) and its reference nodes for the network (DGX-1: 4 x 100 Gb/s EDR
// InfiniBand for 8 GPUs; DGX A100: 8 x 200 Gb/s HDR; DGX H100: 8 x 400 Gb/s NDR). The rest:
//  - matmul efficiency: gemm_seconds' large-GEMM asymptote, the one constant per GPU kind
//    fitted to a published run with the whole cost model in place (docs/cluster.md, "Planning
//    a layout"): V100's to BigScience's 104B at TP 4 x PP 32 (696 s per step), A100's to
//    their 200B at TP 8 x PP 10 x DP 4, MBS 1 (221.21 s). H100's: 0.56, a tile's efficiency in
//    the one GPU run we have (docs/measured.md: an H200, which has the H100 SXM's 132 SMs,
//    clocks and 989 TFLOP/s; GPT-2 124M's shape with the byte vocabulary at 4 x 1024): issue 39's
//    reading of that run gave its GEMMs 0.47 of the peak forward and 0.39 backward, FLOPs over
//    time, and through gemm_seconds' waves those are 0.565 and 0.563 a tile
//    (tests/recost.py's fitted_tile_efficiency, issue 52: the re-cost prices its GEMMs by the
//    same shape model), 0.56 in two digits. It was 0.47, the flat figure, until the re-cost
//    priced the GEMMs by shape too; tests/refit_planner.py refits it from tests/gpu_check.sh's
//    measurement on an H100 (and prints the re-cost's constants with it).
//  - attention efficiency: FlashAttention-2's published figures (ATTENTION EFFICIENCY below);
//    V100 none: the fused kernels need sm_80 (cp.async, mma.sync.m16n8k16).
//  - memory efficiency: a copy kernel's measured bandwidth over the datasheet's, from the
//    device pages of GPUInspector.jl (Paderborn's PC2, docs/src/devices): 1220.7 of 1448.4
//    GiB/s on an A100-SXM4-40GB, 0.84; 722.3 of 836.4 GiB/s on a V100-SXM2-32GB, 0.86. H100
//    has no such measurement there and takes A100's.
//  - L2 bandwidth: H100's measured, 5.5 TB/s (Chips and Cheese, "Nvidia's H100: Funny L2, and
//    Tons of Bandwidth", 2023, on an H100 PCIe of 114 SMs: the SXM5's 132 at a higher clock
//    reach more, so a floor). A100 and V100 have no such measurement at hand: their L2 read
//    peaks (7219 and 3133 GB/s: bytes a clock x the boost clock, as Table 3 of the GPU table in
//    Ultrasonics Sonochemistry 99:106546, 2023, doi:10.1016/j.ultsonch.2023.106546, lists V100,
//    A100 and H100, the last at 8986) times the share of its peak H100's measurement reaches,
//    5500 / 8986 = 0.61: 4420 and 1920.
//  - memory latency: 400 core cycles at the clock the same Table 3 gives each (V100 1530, A100
//    1410, H100 1755 MHz), the round trip to device memory it gives for the three alike (and
//    200 to L2: L2_LATENCY_FRACTION), an idle latency: under load it is longer, which a refit
//    on a GPU measures (tests/refit_planner.py).
//  - kernel launch: 1 us of device idle a kernel, with the stream kept full (NVIDIA, "Getting
//    Started with CUDA Graphs", 2019: a 2.9 us kernel launched back to back ran at 3.8 us a
//    kernel). The host stays ahead in the trainer (on the one H200 run the host queued a step's
//    forwards and backwards in 10.5 ms of the device's 35, docs/profiling.md), so the device's
//    own gap is the one paid, not the host's 5-20 us a launch (HolisticTraceAnalysis's
//    documentation, "cuda kernel launch stats").
//  - latency per message and reserve: assumptions (docs/cluster.md).
enum { HW_V100_32GB, HW_A100_40GB, HW_A100_80GB, HW_H100_80GB };
static const Hardware HARDWARE_PRESETS[] = {
    [HW_V100_32GB] = {125.0, 0.42, 0.0, 0.86, 80, 32.0, 900.0, 1920.0, 400 / 1530.0, 1.0, 150.0, 6.25, 8, 5.0, 2.0, 0},
    [HW_A100_40GB] = {312.0, 0.43, 0.50, 0.84, 108, 40.0, 1555.0, 4420.0, 400 / 1410.0, 1.0, 300.0, 25.0, 8, 5.0, 2.0, 0},
    [HW_A100_80GB] = {312.0, 0.43, 0.50, 0.84, 108, 80.0, 2039.0, 4420.0, 400 / 1410.0, 1.0, 300.0, 25.0, 8, 5.0, 2.0, 0},
    [HW_H100_80GB] = {989.0, 0.56, 0.23, 0.84, 132, 80.0, 3350.0, 5500.0, 400 / 1755.0, 1.0, 450.0, 50.0, 8, 5.0, 2.0, 0},
};

// Each --hw-* number and the Hardware field it replaces when given (non-zero): config.h's run
// fields declare the flags (hw_peak_tflops is --hw-peak-tflops), this table says what each
// sets. A name config.h does not declare leaves its field the preset's: adding a flag is one
// line there.
static const struct {
    const char* field;
    size_t offset;
} HARDWARE_FLAGS[] = {
    {"hw_peak_tflops", offsetof(Hardware, peak_tflops)},
    {"hw_matmul_efficiency", offsetof(Hardware, matmul_efficiency)},
    {"hw_attention_efficiency", offsetof(Hardware, attention_efficiency)},
    {"hw_memory_efficiency", offsetof(Hardware, memory_efficiency)},
    {"hw_sm_count", offsetof(Hardware, sm_count)},
    {"hw_memory_gib", offsetof(Hardware, memory_gib)},
    {"hw_memory_bandwidth", offsetof(Hardware, memory_bandwidth)},
    {"hw_l2_bandwidth", offsetof(Hardware, l2_bandwidth)},
    {"hw_memory_latency_us", offsetof(Hardware, memory_latency_us)},
    {"hw_launch_us", offsetof(Hardware, launch_us)},
    {"hw_nvlink_bandwidth", offsetof(Hardware, nvlink_bandwidth)},
    {"hw_internode_bandwidth", offsetof(Hardware, internode_bandwidth)},
    {"hw_gpus_per_node", offsetof(Hardware, gpus_per_node)},
    {"hw_latency_us", offsetof(Hardware, latency_us)},
    {"hw_reserve_gib", offsetof(Hardware, reserve_gib)},
};

// ----------------------------------------------------------------------------
// this machine, measured now: what the CPU build's plan is priced on
//
// The CPU build runs the plain-C kernels and OpenBLAS's sgemm on this machine's cores, so its
// plan is priced on figures measured here, in about a fifth of a second, with the threads a
// rank of the planned world would run (parallel.h's threads_of_local_rank), each the median of
// a few windows under whatever else the machine is running at the time, as the run will be
// (rate_under_load):
//  - the dense peak: make bench's FMA loop, every thread at once (fma_peak_gflops);
//  - the matmul efficiency: the CPU build's matmul_forward (OpenBLAS's sgemm when built with it;
//    train_gpu has the plain-C loops only), forward and backward, at the shapes of the model's
//    own layer, over that peak (linear_gflops, model_linears; this_machine says why). OpenBLAS computes in small register
//    blocks, so there are no waves of 128 x 128 tiles to quantize (gemm_seconds leaves them
//    out when cpu_threads is set);
//  - the memory bandwidth: a triad over 12 MiB, the size of a small model's working set (in
//    the last-level cache, as the shapes a CPU trains are), efficiency 1 (it is measured);
//  - a kernel's launch: an empty OpenMP parallel region, the fork and join every CPU kernel
//    pays at least once;
//  - the column reductions: loops the prefetchers stream, priced by their bytes (no latency);
//  - the ranks: all on this machine (as mpirun -np N runs them here). When they want more
//    threads than it has cores, they take turns: each gets cores / (ranks x threads) of the
//    peaks; an MPI message between two of them is copied twice through shared memory (Open
//    MPI's sm transport): half the streaming bandwidth, and 2 us a message (an assumption).
// What this leaves out: the CPU attention and norms are C loops, not GEMMs and fused kernels,
// priced here as the GPU's (docs/profiling.md, "Against the planner": 1.77x at T 128).

// The widest vectors this build compiles for (-march=native: the machine's own).
#if defined(__AVX512F__)
#define FMA_LANES 16
#elif defined(__AVX__)
#define FMA_LANES 8
#else
#define FMA_LANES 4
#endif
// Independent accumulator chains: an FMA's latency (4 cycles) times the FMA pipes (2) is 8
// in flight; 12 leaves slack and still fits the 16 vector registers of AVX2.
#define FMA_CHAINS 12
typedef float fma_vector __attribute__((vector_size(FMA_LANES * sizeof(float))));

// 2 * FMA_CHAINS * FMA_LANES flops per iteration; the sum keeps the loop from being dropped.
// acc * x + y contracts to one FMA instruction (GCC's default -ffp-contract=fast for GNU C).
static float fma_chains(long iterations, float seed) {
    fma_vector acc[FMA_CHAINS], x, y;
    for (int k = 0; k < FMA_LANES; k++) x[k] = 0.9999999f, y[k] = 1e-7f * seed;
    for (int c = 0; c < FMA_CHAINS; c++)
        for (int k = 0; k < FMA_LANES; k++) acc[c][k] = seed + c + k;
    for (long i = 0; i < iterations; i++)
        for (int c = 0; c < FMA_CHAINS; c++) acc[c] = acc[c] * x + y;
    float sum = 0.0f;
    for (int c = 0; c < FMA_CHAINS; c++)
        for (int k = 0; k < FMA_LANES; k++) sum += acc[c][k];
    return sum;
}

// ---- the measurements: each a rate taken as a run would see it
//
// `work` is done again and again for `windows` windows of about `window` seconds each, long
// enough to hold the time slices that other processes take from it (a scheduler's slice is a
// few milliseconds); a window's rate is its units of work over its seconds, preemptions
// included. The median window's rate is what a run's median step has under the machine's load
// as it is (the planner's); the best one's, the machine's own peak (make bench's).
typedef void (*MeasuredWork)(void* ctx);

static double rate_under_load(MeasuredWork work, void* ctx, double units, double window, int windows, int best) {
    double rate[16];
    windows = windows < 16 ? windows : 16;
    work(ctx);   // untimed: the pages touched, the threads started
    for (int w = 0; w < windows; w++) {
        double t0 = now_seconds(), t = 0.0;
        long calls = 0;
        do work(ctx), calls++;
        while ((t = now_seconds() - t0) < window);
        rate[w] = calls * units / t;
        for (int j = w; j > 0 && rate[j] > rate[j - 1]; j--) {   // kept sorted, fastest first
            double x = rate[j];
            rate[j] = rate[j - 1], rate[j - 1] = x;
        }
    }
    return best ? rate[0] : windows % 2 ? rate[windows / 2] : 0.5 * (rate[windows / 2 - 1] + rate[windows / 2]);
}

#define FMA_ITERATIONS 100000   // a call of the FMA loop: 2 * FMA_CHAINS * FMA_LANES flops an iteration a thread

// every OpenMP thread runs the chains at once
static void fma_work(void* sink) {
    float sum = 0.0f;
#pragma omp parallel reduction(+ : sum)
    sum += fma_chains(FMA_ITERATIONS, 1.0f + omp_get_thread_num());
    volatile float* out = (volatile float*)sink;   // (C++20, the emulated build, refuses += on a volatile)
    *out = *out + sum;
}

static double fma_peak_gflops(double window, int windows, int best) {
    float sink = 0.0f;
    double flops = 2.0 * FMA_CHAINS * FMA_LANES * (double)FMA_ITERATIONS * omp_get_max_threads();
    return rate_under_load(fma_work, &sink, flops / 1e9, window, windows, best);
}

// the linear layers of one transformer layer over N tokens, layer k from C[k] to OC[k]
// features: the CPU build's matmul_forward (and for the planner its matmul_backward too: three
// GEMMs, the weight gradient's over the tokens), all of them one after another, on buffers
// sized for the widest
#define MAX_LINEARS 4
typedef struct {
    int N, count, C[MAX_LINEARS], OC[MAX_LINEARS], backward;
    float *x, *dx, *weight, *dweight, *y, *dy;
} LinearWork;

static void linear_work(void* ctx) {
    LinearWork* l = (LinearWork*)ctx;
    for (int k = 0; k < l->count; k++) {
        matmul_forward_cpu(l->y, l->x, l->weight, NULL, l->N, l->C[k], l->OC[k]);
        if (l->backward) matmul_backward_cpu(l->dx, l->dweight, NULL, l->dy, l->x, l->weight, l->N, l->C[k], l->OC[k]);
    }
}

// their GFLOP/s, forward alone or forward and backward
static double linear_gflops(LinearWork l, double window, int windows, int best) {
    size_t C = 1, OC = 1;
    double flops = 0.0;
    for (int k = 0; k < l.count; k++) {
        C = (size_t)l.C[k] > C ? (size_t)l.C[k] : C, OC = (size_t)l.OC[k] > OC ? (size_t)l.OC[k] : OC;
        flops += (l.backward ? 6.0 : 2.0) * l.N * l.C[k] * (double)l.OC[k];
    }
    size_t in = l.N * C, w = C * OC, out = l.N * OC, all = 2 * (in + w + out);
    float* a = (float*)mallocCheck(all * sizeof(float));
    for (size_t i = 0; i < all; i++) a[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    l.x = a, l.dx = a + in, l.weight = a + 2 * in, l.dweight = l.weight + w, l.y = l.dweight + w, l.dy = l.y + out;
    double gflops = rate_under_load(linear_work, &l, flops / 1e9, window, windows, best);
    free(a);
    return gflops;
}

// a streaming kernel: a triad a = b + s c over 1M floats each, 12 MiB moved
#define TRIAD_FLOATS ((size_t)1 << 20)
static void triad_work(void* ctx) {
    float *a = (float*)ctx, *b = a + TRIAD_FLOATS, *c = b + TRIAD_FLOATS;
#pragma omp parallel for
    for (size_t i = 0; i < TRIAD_FLOATS; i++) a[i] = b[i] + 0.5f * c[i];
}

static double triad_gbps(double window, int windows) {
    float* a = (float*)callocCheck(3 * TRIAD_FLOATS, sizeof(float));
    double gbps = rate_under_load(triad_work, a, 3.0 * TRIAD_FLOATS * sizeof(float) / 1e9, window, windows, 0);
    free(a);
    return gbps;
}

// an empty OpenMP parallel region: its fork and join
static void region_work(void* sink) {
    volatile int* out = (volatile int*)sink;
#pragma omp parallel
    if (omp_get_thread_num() == 0) *out = *out + 1;
}

static double parallel_region_us(double window, int windows) {
    int sink = 0;
    return 1.0 / rate_under_load(region_work, &sink, 1e-6, window, windows, 0);   // regions a microsecond, inverted
}

// the figures measured (before the ranks' sharing), for the dry run's cost-model line
typedef struct {
    int threads, world, cores;
    LinearWork layer;   // the shapes of the matmuls measured
    double fma_gflops, matmul_gflops, triad_gbps, region_us, share;
} MachineFigures;
static MachineFigures machine_figures;

// the four linear layers of one of the model's layers on one tensor rank, a micro-batch's tokens
// (gpt.h's widths: QKV (heads + 2 groups) x the head size, fc1 twice the MLP's with SwiGLU),
// each dimension capped at 1024
static LinearWork model_linears(const Config* a) {
    const GPTConfig* m = &a->model;
    int TP = a->tensor_model_parallel_size, H = m->hidden_size, hs = H / m->num_attention_heads;
    int ffn = m->ffn_hidden_size > 0 ? m->ffn_hidden_size : 4 * H;
    int qkv = (m->num_attention_heads + 2 * query_groups(m)) * hs / TP, fc = (m->swiglu ? 2 : 1) * ffn / TP;
    LinearWork l = {a->micro_batch_size * m->seq_length, 4, {H, H / TP, H, ffn / TP}, {qkv, H, fc, H}, 1,
                    NULL, NULL, NULL, NULL, NULL, NULL};
    l.N = l.N < 1024 ? l.N : 1024;
    for (int k = 0; k < 4; k++) {
        l.C[k] = l.C[k] < 1 ? 1 : l.C[k] < 1024 ? l.C[k] : 1024;
        l.OC[k] = l.OC[k] < 1 ? 1 : l.OC[k] < 1024 ? l.OC[k] : 1024;
    }
    return l;
}

// This machine as a Hardware for the layout of `a`, its ranks all on it, measured once a
// process (about 0.2 s), each rate the median of a few windows (rate_under_load). The matmul is the model's own layer's four linears
// (model_linears): small GEMMs run well below a large one's rate on a CPU, and the shapes a CPU
// trains are small.
static Hardware this_machine(const Config* a) {
    static Hardware h;
    MachineFigures* f = &machine_figures;
    if (h.cpu_threads > 0.0) return h;
    int world = layout_world_size(a);
    f->threads = threads_of_local_rank(world);
    f->world = world;
    f->cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    f->layer = model_linears(a);
    int before = omp_get_max_threads();
    omp_set_num_threads(f->threads);
    f->fma_gflops = fma_peak_gflops(0.02, 3, 0);   // windows of 10-20 ms, 0.2 s in all
    f->matmul_gflops = linear_gflops(f->layer, 0.02, 5, 0);
    f->triad_gbps = triad_gbps(0.01, 3);
    f->region_us = parallel_region_us(0.005, 3);
    omp_set_num_threads(before);
    f->share = fmin(1.0, (double)f->cores / ((double)world * f->threads));   // the ranks taking turns
    double gib = (double)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGE_SIZE) / (1 << 30);
    double stream = f->triad_gbps * f->share;
    double threads = f->threads, ranks = world;
    Hardware measured = {f->fma_gflops * f->share / 1e3, fmin(1.0, f->matmul_gflops / f->fma_gflops), 0.0, 1.0, threads,
                         gib / world, stream, stream, 0.0, f->region_us, stream / 2.0, stream / 2.0, ranks, 2.0, 0.0,
                         threads};
    h = measured;
    return h;
}

#define L2_LATENCY_FRACTION 0.5   // an L2 hit's round trip over a memory one (Table 3 above: 200 of 400 cycles)

// the dry run's cost-model line for this machine
static void print_machine(const Hardware* hw) {
    const MachineFigures* f = &machine_figures;
    printf("cost model (this machine, measured now; --hw names a GPU instead): %d rank(s) of %d thread(s) on %d cores "
           "(each rank gets %.2f of its figures); FMA loop %.1f GFLOP/s a rank x %.2f matmul efficiency (the CPU "
           "build's linear layers of one of the model's layers, forward and backward, %d tokens: %.1f GFLOP/s), no "
           "waves of tiles; %.1f GB/s streaming (a 12 MiB triad); %.2f us a "
           "kernel's launch (an OpenMP parallel region); MPI between ranks %.1f GB/s, %.1f us a message; %.1f GiB a "
           "rank; nothing overlaps\n", f->world, f->threads, f->cores, f->share, 1e3 * hw->peak_tflops,
           hw->matmul_efficiency, f->layer.N, f->matmul_gflops, hw->memory_bandwidth, hw->launch_us, hw->nvlink_bandwidth,
           hw->latency_us, hw->memory_gib);
}

// ----------------------------------------------------------------------------
// what a dry run prices

// the GPU build's --hw preset, or this machine for the CPU build's plan, with each --hw-*
// number given in its place
static Hardware hardware_of(const Config* a) {
    Hardware h = plans_gpu_build(a) ? HARDWARE_PRESETS[a->hw < 0 ? HW_A100_80GB : a->hw]   // -1: --hw not given
                                    : this_machine(a);
    for (size_t f = 0; f < sizeof(HARDWARE_FLAGS) / sizeof(HARDWARE_FLAGS[0]); f++)
        for (int k = 0; k < NUM_RUN_FIELDS; k++) {
            const ConfigField* field = &RUN_FIELDS[k];
            if (strcmp(field->name, HARDWARE_FLAGS[f].field) != 0) continue;
            const char* at = (const char*)a + field->offset;
            double given = field->kind == FIELD_INT ? *(const int*)at : *(const float*)at;
            if (given > 0.0) *(double*)((char*)&h + HARDWARE_FLAGS[f].offset) = given;
        }
    return h;
}

// --hw's preset name
static const char* hw_name(const Config* a, char* out, size_t len) {
    for (int k = 0; k < NUM_RUN_FIELDS; k++)
        if (strcmp(RUN_FIELDS[k].name, "hw") == 0) choice_name(&RUN_FIELDS[k], a->hw < 0 ? HW_A100_80GB : a->hw, out, len);
    return out;
}

// the dry run's cost-model line: the figures the step is priced on
static void print_hardware(const Config* a, const Hardware* hw) {
    char name[32], attention[64] = "no fused attention kernels";
    int reduce = a->overlap_grad_reduce && data_parallel_size(a) > 1, gather = a->overlap_param_gather && data_parallel_size(a) > 1;
    if (hw->cpu_threads > 0.0) {
        print_machine(hw);
        return;
    }
    if (hw->attention_efficiency > 0.0)
        snprintf(attention, sizeof attention, "x %.2f attention efficiency (the fused kernels)", hw->attention_efficiency);
    printf("cost model (--hw %s): %.0f TFLOP/s dense peak x %.2f matmul efficiency (large GEMMs; tiles in waves over "
           "%.0f SMs) or %s, %.0f GB/s memory x %.2f memory efficiency, L2 %.0f GB/s, %.3f us a round trip to memory "
           "(%.3f to L2), %.1f us a kernel launch, %.1f GiB (%.1f left to CUDA, cuBLAS and NCCL), NVLink %.0f GB/s, network "
           "%.2f GB/s per GPU, %.0f GPUs per node, %.1f us per message; %s\n", hw_name(a, name, sizeof(name)),
           hw->peak_tflops, hw->matmul_efficiency, hw->sm_count, attention, hw->memory_bandwidth, hw->memory_efficiency,
           hw->l2_bandwidth, hw->memory_latency_us, L2_LATENCY_FRACTION * hw->memory_latency_us, hw->launch_us,
           hw->memory_gib, hw->reserve_gib, hw->nvlink_bandwidth, hw->internode_bandwidth, hw->gpus_per_node,
           hw->latency_us,
           reduce && gather ? "nothing overlaps but the DP gradient reduce's and parameter all-gather's buckets"
           : reduce         ? "nothing overlaps but the DP gradient reduce's buckets"
           : gather         ? "nothing overlaps but the DP parameter all-gather's buckets"
                            : "nothing overlaps");
}
