/*
kernels/activations.cuh — the MLP's activations: GELU in its two forms (GPT-2's tanh
approximation, and the exact erf one), the GELU with the linear layers on either side of it
(matmul_gelu_forward, gelu_matmul_backward: linear.cuh's cuBLASLt epilogues on the GPU for the
tanh form), and SwiGLU. Each op: its C reference, then its CUDA twin.

Included by kernels.cuh, the index of kernels/: the conventions every kernel keeps are there.
*/
#pragma once

// ----------------------------------------------------------------------------
// GELU, GPT-2's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))

#define GELU_SCALE 0.7978845608028654f  // sqrt(2 / pi)

// tanh(u) = 1 - 2 / (exp(2u) + 1): glibc's tanhf costs several expf calls and took a fifth
// of a small model's step; this form is exact to float rounding and saturates correctly
// (exp overflows to inf -> 1, underflows to 0 -> -1). exp_poly, so that the loops over the
// elements run on vector lanes.
static inline float tanh_by_exp(float u) { return 1.0f - 2.0f / (exp_poly(2.0f * u) + 1.0f); }

static void gelu_forward_cpu(float* out, const float* inp, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanh_by_exp(GELU_SCALE * (x + 0.044715f * x * x * x)));
    }
}

// dinp may be the same buffer as dout
static void gelu_backward_cpu(float* dinp, const float* inp, const float* dout, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float th = tanh_by_exp(u);
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = grad * dout[i];
    }
}

#ifdef __CUDACC__
// one thread per pack of X128 elements (the last one may be short)
__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * X128;
    if (i >= n) return;
    int count = pack_count(i, n);
    x128 px = load_pack(inp + i, count), po;
    for (int k = 0; k < X128; k++) {
        float x = floatX_to_float(px.e[k]);
        po.e[k] = to_floatX(0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x))));
    }
    store_pack(out + i, po, count);
}

// dinp may be dout: each thread reads its pack of dout before writing dinp's
__global__ void gelu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * X128;
    if (i >= n) return;
    int count = pack_count(i, n);
    x128 px = load_pack(inp + i, count), pd = load_pack(dout + i, count), po;
    for (int k = 0; k < X128; k++) {
        float x = floatX_to_float(px.e[k]);
        float th = tanhf(GELU_SCALE * (x + 0.044715f * x * x * x));
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        po.e[k] = to_floatX(grad * floatX_to_float(pd.e[k]));
    }
    store_pack(dinp + i, po, count);
}

static void gelu_forward(floatX* out, const floatX* inp, size_t n) {
    LAUNCH(gelu_forward_kernel, CEIL_DIV(CEIL_DIV(n, X128), ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0, out, inp, n);
}

static void gelu_backward(floatX* dinp, const floatX* inp, const floatX* dout, size_t n) {
    LAUNCH(gelu_backward_kernel, CEIL_DIV(CEIL_DIV(n, X128), ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0, dinp, inp, dout, n);
}
#else
#define gelu_forward gelu_forward_cpu
#define gelu_backward gelu_backward_cpu
#endif

// ----------------------------------------------------------------------------
// GELU, the exact form (Hendrycks and Gimpel 2016): x Phi(x) = 0.5 x (1 + erf(x / sqrt(2))),
// torch's F.gelu: Megatron-LM's GELU where its bias-GELU fusion (the tanh form) is off, and
// Hugging Face's "gelu". Its derivative: Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi).

#define GELU_INV_SQRT2 0.7071067811865476f       // 1 / sqrt(2)
#define GELU_INV_SQRT_2PI 0.3989422804014327f    // 1 / sqrt(2 pi)

// the two forms, in gpt.h's --gelu order: the model says which, the ops below take it
typedef enum { GELU_TANH, GELU_ERF } GeluForm;

static void gelu_erf_forward_cpu(float* out, const float* inp, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = 0.5f * inp[i] * (1.0f + erff(inp[i] * GELU_INV_SQRT2));
}

// dinp may be the same buffer as dout
static void gelu_erf_backward_cpu(float* dinp, const float* inp, const float* dout, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float grad = 0.5f * (1.0f + erff(x * GELU_INV_SQRT2)) + x * GELU_INV_SQRT_2PI * expf(-0.5f * x * x);
        dinp[i] = grad * dout[i];
    }
}

#ifdef __CUDACC__
// as gelu_forward_kernel: one thread per pack of X128 elements
__global__ void gelu_erf_forward_kernel(floatX* out, const floatX* inp, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * X128;
    if (i >= n) return;
    int count = pack_count(i, n);
    x128 px = load_pack(inp + i, count), po;
    for (int k = 0; k < X128; k++) {
        float x = floatX_to_float(px.e[k]);
        po.e[k] = to_floatX(0.5f * x * (1.0f + erff(x * GELU_INV_SQRT2)));
    }
    store_pack(out + i, po, count);
}

__global__ void gelu_erf_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * X128;
    if (i >= n) return;
    int count = pack_count(i, n);
    x128 px = load_pack(inp + i, count), pd = load_pack(dout + i, count), po;
    for (int k = 0; k < X128; k++) {
        float x = floatX_to_float(px.e[k]);
        float grad = 0.5f * (1.0f + erff(x * GELU_INV_SQRT2)) + x * GELU_INV_SQRT_2PI * expf(-0.5f * x * x);
        po.e[k] = to_floatX(grad * floatX_to_float(pd.e[k]));
    }
    store_pack(dinp + i, po, count);
}

static void gelu_erf_forward(floatX* out, const floatX* inp, size_t n) {
    LAUNCH(gelu_erf_forward_kernel, CEIL_DIV(CEIL_DIV(n, X128), ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0, out, inp, n);
}

static void gelu_erf_backward(floatX* dinp, const floatX* inp, const floatX* dout, size_t n) {
    LAUNCH(gelu_erf_backward_kernel, CEIL_DIV(CEIL_DIV(n, X128), ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0, dinp, inp, dout, n);
}
#else
#define gelu_erf_forward gelu_erf_forward_cpu
#define gelu_erf_backward gelu_erf_backward_cpu
#endif

// ----------------------------------------------------------------------------
// the MLP's GELU and the linear layers on either side of it
// Forward, the first linear layer and its GELU (of the form given): pre_gelu = inp @ weight^T +
// bias (kept for the backward), out = GELU(pre_gelu). On the GPU one cuBLASLt call writes both
// (the GELU in the GEMM's epilogue) instead of a GEMM, then a GELU kernel reading pre_gelu back.
// cuBLASLt's epilogues have the tanh form alone (GELU, GELU_AUX, DGELU and their BIAS variants;
// none computes erf), so the erf form is the two steps on the GPU too. Backward, the second
// linear layer and the GELU before it, gelu_matmul_backward: below.

static void matmul_gelu_forward_cpu(float* out, float* pre_gelu, const float* inp, const float* weight,
                                    const float* bias, int N, int C, int OC, GeluForm form) {
    matmul_forward_cpu(pre_gelu, inp, weight, bias, N, C, OC);
    if (form == GELU_ERF) gelu_erf_forward_cpu(out, pre_gelu, (size_t)N * OC);
    else gelu_forward_cpu(out, pre_gelu, (size_t)N * OC);
}

#ifdef __CUDACC__
// cuBLASLt takes pre_gelu (its "aux" output) only with a leading dimension that is a multiple
// of 8 and, we assume, 16-byte aligned, as the bias (see tests/emu/cublasLt.h); otherwise (or
// with no algorithm for it) the two steps of the reference. The GELU is applied to the fp32 sum there, to its floatX
// rounding here: the same within a rounding.
static void matmul_gelu_forward(floatX* out, floatX* pre_gelu, const floatX* inp, const floatX* weight,
                                const floatX* bias, int N, int C, int OC, GeluForm form) {
    if (form == GELU_TANH && OC % 8 == 0 && (uintptr_t)pre_gelu % 16 == 0 &&
        (bias == NULL || (uintptr_t)bias % 16 == 0) && matmul_cublaslt(out, pre_gelu, inp, weight, bias, N, C, OC))
        return;
    matmul_forward(pre_gelu, inp, weight, bias, N, C, OC);
    if (form == GELU_ERF) gelu_erf_forward(out, pre_gelu, (size_t)N * OC);
    else gelu_forward(out, pre_gelu, (size_t)N * OC);
}
#else
#define matmul_gelu_forward matmul_gelu_forward_cpu
#endif

// The backward of out = GELU(pre_gelu) @ weight^T + bias: the MLP's second linear layer and the
// GELU before it. dpre = (dout @ weight) * GELU'(pre_gelu), the gradient at the GELU's input;
// dweight and dbias as matmul_backward's, inp being the layer's input GELU(pre_gelu). On the
// GPU cuBLASLt multiplies by GELU' in the epilogue of the GEMM that computes dout @ weight
// (CUBLASLT_EPILOGUE_DGELU, pre_gelu its aux input) instead of a GELU-backward kernel reading
// pre_gelu and that product back, and writing the product again (the tanh form's: the erf
// form's derivative is no epilogue's, so it is the two steps there too).
// the input's half alone (a zero-bubble schedule runs the parameters' later: matmul_backward_params)
static void gelu_matmul_backward_dinp_cpu(float* dpre, const float* dout, const float* weight, const float* pre_gelu,
                                          int N, int C, int OC, GeluForm form) {
    matmul_backward_dinp_cpu(dpre, dout, weight, N, C, OC);
    if (form == GELU_ERF) gelu_erf_backward_cpu(dpre, pre_gelu, dpre, (size_t)N * C);
    else gelu_backward_cpu(dpre, pre_gelu, dpre, (size_t)N * C);
}

static void gelu_matmul_backward_cpu(float* dpre, float* dweight, float* dbias, const float* dout, const float* inp,
                                     const float* weight, const float* pre_gelu, int N, int C, int OC, GeluForm form) {
    gelu_matmul_backward_dinp_cpu(dpre, dout, weight, pre_gelu, N, C, OC, form);
    matmul_backward_params_cpu(dweight, dbias, dout, inp, N, C, OC);
}

#ifdef __CUDACC__
// The epilogue applies GELU' to the fp32 product, which the two steps round to floatX first:
// one rounding less. pre_gelu as an aux input: the rules matmul_gelu_forward's aux output
// keeps (C a multiple of 8, 16-byte aligned); otherwise, or with no algorithm for it, the two
// steps of the reference.
static void gelu_matmul_backward_dinp(floatX* dpre, const floatX* dout, const floatX* weight, const floatX* pre_gelu,
                                      int N, int C, int OC, GeluForm form) {
    LtEpilogue dgelu = {CUBLASLT_EPILOGUE_DGELU, NULL, pre_gelu};
    // laid out as matmul_backward_dinp's product
    if (!(form == GELU_TANH && C % 8 == 0 && (uintptr_t)pre_gelu % 16 == 0 &&
          gemm_lt(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, weight, C, dout, OC, 0.0f, dpre, CUDA_R_FLOATX, C, dgelu))) {
        matmul_backward_dinp(dpre, dout, weight, N, C, OC);
        if (form == GELU_ERF) gelu_erf_backward(dpre, pre_gelu, dpre, (size_t)N * C);
        else gelu_backward(dpre, pre_gelu, dpre, (size_t)N * C);
    }
}

static void gelu_matmul_backward(floatX* dpre, float* dweight, float* dbias, float* partials, const floatX* dout,
                                 const floatX* inp, const floatX* weight, const floatX* pre_gelu, int N, int C, int OC,
                                 GeluForm form) {
    gelu_matmul_backward_dinp(dpre, dout, weight, pre_gelu, N, C, OC, form);
    matmul_backward_params(dweight, dbias, partials, dout, inp, N, C, OC);
}
#else
#define gelu_matmul_backward(dpre, dweight, dbias, partials, ...) gelu_matmul_backward_cpu(dpre, dweight, dbias, __VA_ARGS__)
#define gelu_matmul_backward_dinp gelu_matmul_backward_dinp_cpu
#endif

// ----------------------------------------------------------------------------
// SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer"; Megatron's --swiglu)
// The MLP's first linear layer yields inp[N, 2F]: per row the gate a (the first F columns),
// then the up projection b (the next F). out[N, F] = silu(a) * b, silu(a) = a * sigmoid(a):
// Megatron's swiglu (megatron/core/fusions/fused_bias_swiglu.py: y_1, y_2 = chunk(y, 2, -1);
// silu(y_1) * y_2), so fc1's weight is [gate rows; up rows]. In Hugging Face Llama terms,
// down_proj(silu(gate_proj(x)) * up_proj(x)): gate_proj's rows are fc1's first F rows, up_proj's
// the next F (with tensor parallelism each rank's fc1 holds [its gate rows; its up rows]).
// Backward (dinp overwritten, [N, 2F]): da = dout * b * sigmoid(a) (1 + a (1 - sigmoid(a))),
// db = dout * silu(a).

static inline float sigmoid_by_exp(float a) { return 1.0f / (1.0f + exp_poly(-a)); }

static void swiglu_forward_cpu(float* out, const float* inp, int N, int F) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* a = inp + (size_t)n * 2 * F;
        const float* b = a + F;
        for (int j = 0; j < F; j++) out[(size_t)n * F + j] = a[j] * sigmoid_by_exp(a[j]) * b[j];
    }
}

static void swiglu_backward_cpu(float* dinp, const float* inp, const float* dout, int N, int F) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* a = inp + (size_t)n * 2 * F;
        const float* b = a + F;
        float* da = dinp + (size_t)n * 2 * F;
        float* db = da + F;
        for (int j = 0; j < F; j++) {
            float d = dout[(size_t)n * F + j], sig = sigmoid_by_exp(a[j]);
            da[j] = d * b[j] * sig * (1.0f + a[j] * (1.0f - sig));
            db[j] = d * a[j] * sig;
        }
    }
}

#ifdef __CUDACC__
// one thread per pack of X128 columns of one row of out (a row's last pack may be short); the
// packs of a and b are whole and aligned when F is a multiple of 8 and the buffers are aligned
// this thread's pack: row *n, columns [*j, *j + *count) of F; 0 past the last row
__device__ static inline int swiglu_pack(int N, int F, size_t* n, int* j, int* count) {
    int packs = CEIL_DIV(F, X128);
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * packs) return 0;
    *n = idx / packs;
    *j = (int)(idx % packs) * X128;
    *count = min_int(X128, F - *j);
    return 1;
}

__global__ void swiglu_forward_kernel(floatX* out, const floatX* inp, int N, int F) {
    size_t n;
    int j, count;
    if (!swiglu_pack(N, F, &n, &j, &count)) return;
    const floatX* a = inp + n * 2 * F + j;
    x128 pa = load_pack(a, count), pb = load_pack(a + F, count), po;
    for (int k = 0; k < X128; k++) {
        float x = floatX_to_float(pa.e[k]);
        po.e[k] = to_floatX(x / (1.0f + expf(-x)) * floatX_to_float(pb.e[k]));
    }
    store_pack(out + n * F + j, po, count);
}

__global__ void swiglu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, int N, int F) {
    size_t n;
    int j, count;
    if (!swiglu_pack(N, F, &n, &j, &count)) return;
    const floatX* a = inp + n * 2 * F + j;
    x128 pa = load_pack(a, count), pb = load_pack(a + F, count), pd = load_pack(dout + n * F + j, count), pda, pdb;
    for (int k = 0; k < X128; k++) {
        float x = floatX_to_float(pa.e[k]), d = floatX_to_float(pd.e[k]);
        float sig = 1.0f / (1.0f + expf(-x));
        pda.e[k] = to_floatX(d * floatX_to_float(pb.e[k]) * sig * (1.0f + x * (1.0f - sig)));
        pdb.e[k] = to_floatX(d * x * sig);
    }
    store_pack(dinp + n * 2 * F + j, pda, count);
    store_pack(dinp + n * 2 * F + F + j, pdb, count);
}

static void swiglu_forward(floatX* out, const floatX* inp, int N, int F) {
    LAUNCH(swiglu_forward_kernel, CEIL_DIV((size_t)N * CEIL_DIV(F, X128), ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0,
           out, inp, N, F);
}

static void swiglu_backward(floatX* dinp, const floatX* inp, const floatX* dout, int N, int F) {
    LAUNCH(swiglu_backward_kernel, CEIL_DIV((size_t)N * CEIL_DIV(F, X128), ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK, 0,
           dinp, inp, dout, N, F);
}
#else
#define swiglu_forward swiglu_forward_cpu
#define swiglu_backward swiglu_backward_cpu
#endif
