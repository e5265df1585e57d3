/*
tests/gpu_dweight.cu — the linear layers' weight-gradient GEMMs, timed both ways a bias gradient
can go (issue 52 item 4): tests/gpu_check.sh runs it on a GPU, tests/test_emu.sh under the CPU
emulation (where the times mean nothing: it checks that the program runs and both ways agree).

  gpu_dweight [N] [REPEATS] [DIVIDE]   N rows (default 65536: GPT-2 124M at llm.c's 64 x 1024),
                               the median of REPEATS timed runs (default 9) after two warm-ups,
                               the layers' widths divided by DIVIDE (default 1; the emulation's
                               test: 8)

For each of GPT-2 124M's linear layers (C -> OC: the QKV 768 -> 2304, the attention projection
768 -> 768, the MLP's 768 -> 3072 and 3072 -> 768), dweight += inp^T dout with its bias gradient:
  epilogue  cuBLASLt's BGRADB epilogue sums dout's columns inside the GEMM (--bias-grad epilogue,
            the default), then column_partials_add adds them (kernels/linear.cuh)
  kernel    the GEMM alone, then column_sums_add reads dout again (--bias-grad kernel, llm.c's way)
each with the fp32 weight gradient the trainer keeps (beta 1) and with a bf16 one (llm.c's), and
the algorithm cuBLASLt's heuristic chose for each (tile, split-K count, stages: the weight-gradient
GEMMs have 36 to 144 output tiles of 128 x 128 and fill an H100's 132 SMs only by splitting K).
The last line sums the four fp32 layers and names the faster --bias-grad.
*/
#include "kernels.cuh"
#include <vector>
#include <algorithm>

typedef struct { int C, OC; const char* name; } LinearShape;
static const LinearShape GPT2_LINEARS[] = {
    {768, 2304, "qkv"}, {768, 768, "attention projection"}, {768, 3072, "fc"}, {3072, 768, "fc projection"}};

// the algorithm of the cached plan for this product (gemm_lt made it on its first call)
static void describe_algo(int m, int n, int k, int epilogue, int d_type, char* out, size_t len) {
    for (int i = 0; i < lt_plan_count; i++) {
        const LtKey* key = &lt_plans[i].key;
        if (key->m != m || key->n != n || key->k != k || key->epilogue != epilogue || key->d_type != d_type) continue;
        if (!lt_plans[i].found) { snprintf(out, len, "no cuBLASLt algorithm: cuBLAS"); return; }
        const cublasLtMatmulAlgo_t* algo = &lt_plans[i].heuristic.algo;
        uint32_t tile = 0, stages = 0, split = 0;
        size_t written = 0;
        cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &written);
        cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &written);
        cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof split, &written);
        snprintf(out, len, "tile id %u, stages id %u, split-K %u, waves %.2f", tile, stages, split,
                 lt_plans[i].heuristic.wavesCount);
        return;
    }
    snprintf(out, len, "(no plan)");
}

// one weight gradient with its bias gradient, one of the two ways, into dweight (fp32 or floatX)
static void weight_gradient(int in_epilogue, void* dweight, cudaDataType_t d_type, float* dbias, float* partials,
                            const floatX* dout, const floatX* inp, int N, int C, int OC) {
    if (in_epilogue) {
        LtEpilogue bgrad = {CUBLASLT_EPILOGUE_BGRADB, partials, NULL};
        if (!gemm_lt(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp, C, dout, OC, 1.0f, dweight, d_type, C, bgrad))
            fail("cuBLASLt offers no BGRADB algorithm for C %d, OC %d, N %d", C, OC, N);
        column_partials_add(dbias, NULL, partials, 1, OC);
        return;
    }
    if (!gemm_lt(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp, C, dout, OC, 1.0f, dweight, d_type, C, LT_PLAIN))
        gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp, C, dout, OC, 1.0f, dweight, d_type, C);
    column_sums_add(dbias, partials, dout, N, OC);
}

// the median milliseconds of `repeats` runs after two warm-ups
static float time_weight_gradient(int in_epilogue, void* dweight, cudaDataType_t d_type, float* dbias, float* partials,
                                  const floatX* dout, const floatX* inp, int N, int C, int OC, int repeats) {
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreateWithFlags(&start, cudaEventDefault));
    cudaCheck(cudaEventCreateWithFlags(&stop, cudaEventDefault));
    std::vector<float> ms;
    for (int r = -2; r < repeats; r++) {
        cudaCheck(cudaEventRecord(start, 0));
        weight_gradient(in_epilogue, dweight, d_type, dbias, partials, dout, inp, N, C, OC);
        cudaCheck(cudaEventRecord(stop, 0));
        cudaCheck(cudaEventSynchronize(stop));
        float t = 0.0f;
        cudaCheck(cudaEventElapsedTime(&t, start, stop));
        if (r >= 0) ms.push_back(t);
    }
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

static float* fetch(const float* d, size_t n, std::vector<float>& host) {
    host.resize(n);
    cudaCheck(cudaMemcpy(host.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return host.data();
}

// the bias gradient both ways from zero, once: the largest difference relative to the largest sum
static double ways_differ(float* dweight, float* dbias, float* partials, const floatX* dout, const floatX* inp,
                          int N, int C, int OC) {
    std::vector<float> a, b;
    dev_zero(dbias, OC * sizeof(float));
    weight_gradient(1, dweight, CUDA_R_32F, dbias, partials, dout, inp, N, C, OC);
    fetch(dbias, OC, a);
    dev_zero(dbias, OC * sizeof(float));
    weight_gradient(0, dweight, CUDA_R_32F, dbias, partials, dout, inp, N, C, OC);
    fetch(dbias, OC, b);
    double worst = 0.0, largest = 1e-30;
    for (int j = 0; j < OC; j++) worst = fmax(worst, fabs(a[j] - b[j])), largest = fmax(largest, fabs(b[j]));
    return worst / largest;
}

static floatX* random_floatX(size_t n, uint64_t seed) {
    std::vector<float> host(n);
    for (size_t i = 0; i < n; i++) host[i] = (float)((splitmix64(seed + i) >> 40) / (double)(1 << 24) - 0.5);
    floatX* d = (floatX*)dev_malloc(n * sizeof(floatX));
    floats_to_dev_floatX(d, host.data(), n);
    return d;
}

int main(int argc, char** argv) {
    int N = argc > 1 ? atoi(argv[1]) : 65536, repeats = argc > 2 ? atoi(argv[2]) : 9, divide = argc > 3 ? atoi(argv[3]) : 1;
    if (N < 1 || repeats < 1 || divide < 1 || 768 % divide) {
        fprintf(stderr, "usage: gpu_dweight [N >= 1] [REPEATS >= 1] [DIVIDE, a divisor of 768]\n");
        return 2;
    }
    kernels_init(0);
    printf("weight gradients of GPT-2 124M's linear layers at N = %d rows, widths / %d (median of %d, ms)\n", N, divide,
           repeats);
    printf("%-34s %-5s %10s %10s   %s\n", "layer (C -> OC)", "dW", "epilogue", "kernel", "cuBLASLt's choice: epilogue | plain");
    double total[2] = {0.0, 0.0}, worst = 0.0;
    for (LinearShape s : GPT2_LINEARS) {
        s.C /= divide, s.OC /= divide;
        floatX* inp = random_floatX((size_t)N * s.C, 1);
        floatX* dout = random_floatX((size_t)N * s.OC, 2);
        float* dweight = (float*)dev_malloc((size_t)s.C * s.OC * sizeof(float));
        floatX* dweight_x = (floatX*)dev_malloc((size_t)s.C * s.OC * sizeof(floatX));
        float* dbias = (float*)dev_malloc(s.OC * sizeof(float));
        float* partials = (float*)dev_malloc(bias_grad_partials(this_build(), N, s.OC) * sizeof(float) + 16);
        dev_zero(dweight, (size_t)s.C * s.OC * sizeof(float));
        dev_zero(dweight_x, (size_t)s.C * s.OC * sizeof(floatX));
        worst = fmax(worst, ways_differ(dweight, dbias, partials, dout, inp, N, s.C, s.OC));
        for (int fp32 = 1; fp32 >= 0; fp32--) {
            void* dw = fp32 ? (void*)dweight : (void*)dweight_x;
            cudaDataType_t type = fp32 ? CUDA_R_32F : CUDA_R_FLOATX;
            float ms[2];
            for (int way = 0; way < 2; way++)
                ms[way] = time_weight_gradient(way == 0, dw, type, dbias, partials, dout, inp, N, s.C, s.OC, repeats);
            if (fp32) total[0] += ms[0], total[1] += ms[1];
            char with[160], plain[160], name[64];
            describe_algo(s.C, s.OC, N, CUBLASLT_EPILOGUE_BGRADB, type, with, sizeof with);
            describe_algo(s.C, s.OC, N, CUBLASLT_EPILOGUE_DEFAULT, type, plain, sizeof plain);
            snprintf(name, sizeof name, "%s (%d -> %d)", s.name, s.C, s.OC);
            printf("%-34s %-5s %10.3f %10.3f   %s | %s\n", name, fp32 ? "fp32" : FLOATX_NAME, ms[0], ms[1], with, plain);
        }
        dev_free(inp), dev_free(dout), dev_free(dweight), dev_free(dweight_x), dev_free(dbias), dev_free(partials);
    }
    printf("bias gradients both ways: largest difference %.2e of the largest sum\n", worst);
    printf("fp32 weight gradients, the four layers: epilogue %.3f ms, kernel %.3f ms: --bias-grad %s is faster\n",
           total[0], total[1], total[0] <= total[1] ? "epilogue" : "kernel");
    kernels_free();
    return worst < 1e-3 ? 0 : 1;
}
