/*
hardware.h — the GPUs a plan is priced on: the Hardware a cost model needs (peaks, efficiencies,
memory, its bandwidths and latencies, the links), --hw's presets with the source of each number,
and the --hw-* flags that replace a preset's numbers (config.h declares them). plan.h, above,
prices a step on it; a room of its own because the figures and their sources are one concern,
read and refitted (tests/refit_planner.py) apart from the model that uses them.
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
} Hardware;

// --hw's presets, in its order. NVIDIA's datasheets for the GPUs (V100 SXM2, A100 SXM4, H100
// SXM5; NVLink's total bandwidth halved: one direction), its architecture whitepapers for the
// SMs (80, 108, 132) and its reference nodes for the network (DGX-1: 4 x 100 Gb/s EDR
// InfiniBand for 8 GPUs; DGX A100: 8 x 200 Gb/s HDR; DGX H100: 8 x 400 Gb/s NDR). The rest:
//  - matmul efficiency: gemm_seconds' large-GEMM asymptote, the one constant per GPU kind
//    fitted to a published run with the whole cost model in place (docs/cluster.md, "Planning
//    a layout"): V100's to BigScience's 104B at TP 4 x PP 32 (696 s per step), A100's to
//    their 200B at TP 8 x PP 10 x DP 4, MBS 1 (221.21 s). H100's: 0.47, the forward GEMMs'
//    share of the peak in the one GPU run we have (docs/measured.md: an H200, which has the
//    H100 SXM's 132 SMs, clocks and 989 TFLOP/s; GPT-2 124M's shape at 4 x 1024), as issue 39's
//    reading of that run fitted it, FLOPs over time (the backward's 0.39 there is close to what
//    this model's waves give at 0.47). Fitted through gemm_seconds' waves instead, the run would
//    give about 0.58 (tests/recost.py's section in docs/gpu-kernels.md says why 0.47 is kept);
//    tests/refit_planner.py refits it from tests/gpu_check.sh's measurement on an H100.
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
    [HW_V100_32GB] = {125.0, 0.42, 0.0, 0.86, 80, 32.0, 900.0, 1920.0, 400 / 1530.0, 1.0, 150.0, 6.25, 8, 5.0, 2.0},
    [HW_A100_40GB] = {312.0, 0.43, 0.50, 0.84, 108, 40.0, 1555.0, 4420.0, 400 / 1410.0, 1.0, 300.0, 25.0, 8, 5.0, 2.0},
    [HW_A100_80GB] = {312.0, 0.43, 0.50, 0.84, 108, 80.0, 2039.0, 4420.0, 400 / 1410.0, 1.0, 300.0, 25.0, 8, 5.0, 2.0},
    [HW_H100_80GB] = {989.0, 0.47, 0.23, 0.84, 132, 80.0, 3350.0, 5500.0, 400 / 1755.0, 1.0, 450.0, 50.0, 8, 5.0, 2.0},
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

// --hw's preset with each --hw-* number given in its place
static Hardware hardware_of(const Config* a) {
    Hardware h = HARDWARE_PRESETS[a->hw < 0 ? HW_A100_80GB : a->hw];   // -1: --hw not given
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
