/*
kernels.cuh — every numeric kernel of gridgpt.

Each op is written twice, side by side in spirit and in name:
  - a plain-C reference, `<op>_cpu`, that states the math in the simplest loops we can write
    (a few OpenMP pragmas, no intrinsics, fp32 with fp64 where a sum needs it);
  - a CUDA version, `<op>` on the GPU build, in the CUDA section at the end of this file.
The rest of the trainer calls `<op>` and does not know which one it got: on the CPU build
`<op>` is the reference itself (see "the CPU build's kernels" below).

Conventions every kernel keeps:
  - Activations and parameters are `floatX` (float on the CPU, bf16 on the GPU); gradients of
    parameters, LayerNorm statistics, losses and optimizer state are always float.
  - Parameter-gradient outputs ACCUMULATE (+=): micro-batches add into one gradient buffer.
    Activation-gradient outputs are overwritten (=), except `layernorm_backward`'s dinp,
    which adds into the residual stream's gradient (that is the residual's backward).
  - Linear weights are stored [out, in] (Megatron/PyTorch), so a linear layer is
    out[N, OC] = inp[N, C] @ W[OC, C]^T + b.
  - Reductions are deterministic: a fixed split of the work, independent of the thread
    count, so two runs with the same seed are bit-identical.
  - CUDA kernels are launched only through LAUNCH(); shared memory and warp shuffles only
    through the helpers of the CUDA section; every CUDA/cuBLAS call goes through a check.
*/
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef USE_BLAS
#include <cblas.h>
#endif

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

// ----------------------------------------------------------------------------
// checking helpers: print file:line and the library's own message, then stop

static void malloc_check_failed(size_t bytes, const char* file, int line) {
    fprintf(stderr, "error: out of host memory allocating %zu bytes at %s:%d\n", bytes, file, line);
    exit(1);
}
static void* malloc_check_(size_t bytes, const char* file, int line) {
    void* p = malloc(bytes ? bytes : 1);
    if (p == NULL) malloc_check_failed(bytes, file, line);
    return p;
}
static void* calloc_check_(size_t count, size_t size, const char* file, int line) {
    void* p = calloc(count ? count : 1, size ? size : 1);
    if (p == NULL) malloc_check_failed(count * size, file, line);
    return p;
}
#define mallocCheck(bytes) malloc_check_((bytes), __FILE__, __LINE__)
#define callocCheck(count, size) calloc_check_((count), (size), __FILE__, __LINE__)

// ----------------------------------------------------------------------------
// precision and device memory
// `floatX` is what activations and parameters are stored in. The dev_* functions are the
// only place that knows whether "device memory" is GPU memory or plain host memory.

#ifdef __CUDACC__
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublas_v2.h>
typedef __nv_bfloat16 floatX;
#define PRECISION_NAME "bf16 (fp32 master weights, fp32 grads)"
#else
typedef float floatX;
#define PRECISION_NAME "fp32"
#endif

static void* dev_malloc(size_t bytes);
static void dev_free(void* p);
static void dev_zero(void* p, size_t bytes);
static void dev_to_host(void* host_dst, const void* dev_src, size_t bytes);
static void host_to_dev(void* dev_dst, const void* host_src, size_t bytes);
// float <-> floatX conversions between host float arrays and device floatX arrays
static void floats_to_dev_floatX(floatX* dev_dst, const float* host_src, size_t n);
static void dev_floatX_to_floats(float* host_dst, const floatX* dev_src, size_t n);

#ifndef __CUDACC__
static void* dev_malloc(size_t bytes) { return mallocCheck(bytes); }
static void dev_free(void* p) { free(p); }
static void dev_zero(void* p, size_t bytes) { memset(p, 0, bytes); }
static void dev_to_host(void* host_dst, const void* dev_src, size_t bytes) { memcpy(host_dst, dev_src, bytes); }
static void host_to_dev(void* dev_dst, const void* host_src, size_t bytes) { memcpy(dev_dst, host_src, bytes); }
static void floats_to_dev_floatX(floatX* dev_dst, const float* host_src, size_t n) { memcpy(dev_dst, host_src, n * sizeof(float)); }
static void dev_floatX_to_floats(float* host_dst, const floatX* dev_src, size_t n) { memcpy(host_dst, dev_src, n * sizeof(float)); }
static void kernels_init(int local_device) { (void)local_device; }
#endif

// Deterministic parallel sums: work is cut into chunks of this many elements (rows or
// columns), whatever the thread count, and the chunks' partial sums are added in order.
#define SUM_CHUNK 4096

// ============================================================================
// plain-C references
// ============================================================================
// Compiled in every build (the tests hold the CUDA kernels against them), called by the
// CPU build only: a build that does not call one is not a mistake.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

// ----------------------------------------------------------------------------
// embedding: out[n] = wte[token[n]] + wpe[n % T]
// Vocab-parallel (Megatron): this rank holds rows [vocab_start, vocab_start + vocab_local)
// of the word embedding; a token outside that range contributes zeros here and the rows
// are summed over the tensor-parallel group. wpe is NULL where position embeddings are
// added elsewhere (only one tensor-parallel rank adds them before that sum).

static void encoder_forward_cpu(float* out, const int* tokens, const float* wte, const float* wpe,
                                int N, int T, int C, int vocab_start, int vocab_local) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        int local = tokens[n] - vocab_start;
        const float* w = local >= 0 && local < vocab_local ? wte + (size_t)local * C : NULL;
        const float* p = wpe ? wpe + (size_t)(n % T) * C : NULL;
        float* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) {
            o[c] = (w ? w[c] : 0.0f) + (p ? p[c] : 0.0f);
        }
    }
}

static void encoder_backward_cpu(float* dwte, float* dwpe, const float* dout, const int* tokens,
                                 int N, int T, int C, int vocab_start, int vocab_local) {
    // parallel over column chunks: each thread owns some columns of every row, so no two
    // threads add into the same element and the order of the adds is fixed
    int chunks = CEIL_DIV(C, 64);
    #pragma omp parallel for
    for (int k = 0; k < chunks; k++) {
        int c0 = k * 64, c1 = c0 + 64 < C ? c0 + 64 : C;
        for (int n = 0; n < N; n++) {
            int local = tokens[n] - vocab_start;
            const float* d = dout + (size_t)n * C;
            if (local >= 0 && local < vocab_local) {
                float* w = dwte + (size_t)local * C;
                for (int c = c0; c < c1; c++) w[c] += d[c];
            }
            if (dwpe) {
                float* p = dwpe + (size_t)(n % T) * C;
                for (int c = c0; c < c1; c++) p[c] += d[c];
            }
        }
    }
}

// ----------------------------------------------------------------------------
// residual add: out = a + b. Its backward is the identity on both inputs, which the model
// gets for free by letting one gradient buffer (the residual stream's) flow through.

static void residual_forward_cpu(float* out, const float* a, const float* b, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

// ----------------------------------------------------------------------------
// LayerNorm over the last dimension, eps = 1e-5 (Megatron's default)

#define LAYERNORM_EPS 1e-5f

static void layernorm_forward_cpu(float* out, float* mean, float* rstd, const float* inp,
                                  const float* weight, const float* bias, int N, int C) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        double m = 0.0, v = 0.0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= C;
        float s = (float)(1.0 / sqrt(v + LAYERNORM_EPS));
        float* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = ((x[c] - (float)m) * s) * weight[c] + bias[c];
        mean[n] = (float)m;
        rstd[n] = s;
    }
}

// d(inp) += rstd * (g - mean(g) - xhat * mean(g * xhat)), with g = dout * weight
static void layernorm_backward_cpu(float* dinp, float* dweight, float* dbias, const float* dout,
                                   const float* inp, const float* weight, const float* mean,
                                   const float* rstd, int N, int C) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        const float* d = dout + (size_t)n * C;
        float m = mean[n], s = rstd[n];
        double g_mean = 0.0, gx_mean = 0.0;
        for (int c = 0; c < C; c++) {
            float g = d[c] * weight[c];
            g_mean += g;
            gx_mean += g * ((x[c] - m) * s);
        }
        g_mean /= C;
        gx_mean /= C;
        float* di = dinp + (size_t)n * C;
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - m) * s;
            di[c] += s * (d[c] * weight[c] - (float)g_mean - xhat * (float)gx_mean);
        }
    }
    // parameter gradients: columns are independent, each summed over rows in order
    #pragma omp parallel for
    for (int c = 0; c < C; c++) {
        float dw = 0.0f, db = 0.0f;
        for (int n = 0; n < N; n++) {
            float d = dout[(size_t)n * C + c];
            dw += d * ((inp[(size_t)n * C + c] - mean[n]) * rstd[n]);
            db += d;
        }
        dweight[c] += dw;
        dbias[c] += db;
    }
}

// ----------------------------------------------------------------------------
// linear layer: out[N, OC] = inp[N, C] @ weight[OC, C]^T + bias[OC]   (bias may be NULL)
// The plain loops are the reference; with USE_BLAS the CPU build hands the same products
// to sgemm, as the GPU build hands them to cuBLAS.

static void matmul_forward_reference(float* out, const float* inp, const float* weight,
                                     const float* bias, int N, int C, int OC) {
    #pragma omp parallel for collapse(2)
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            const float* x = inp + (size_t)n * C;
            const float* w = weight + (size_t)o * C;
            float acc = bias ? bias[o] : 0.0f;
            for (int c = 0; c < C; c++) acc += x[c] * w[c];
            out[(size_t)n * OC + o] = acc;
        }
    }
}

// dinp = dout @ weight;  dweight += dout^T @ inp;  dbias += column sums of dout
static void matmul_backward_reference(float* dinp, float* dweight, float* dbias, const float* dout,
                                      const float* inp, const float* weight, int N, int C, int OC) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float* di = dinp + (size_t)n * C;
        for (int c = 0; c < C; c++) di[c] = 0.0f;
        for (int o = 0; o < OC; o++) {
            float d = dout[(size_t)n * OC + o];
            const float* w = weight + (size_t)o * C;
            for (int c = 0; c < C; c++) di[c] += d * w[c];
        }
    }
    #pragma omp parallel for
    for (int o = 0; o < OC; o++) {
        float* dw = dweight + (size_t)o * C;
        float db = 0.0f;
        for (int n = 0; n < N; n++) {
            float d = dout[(size_t)n * OC + o];
            const float* x = inp + (size_t)n * C;
            for (int c = 0; c < C; c++) dw[c] += d * x[c];
            db += d;
        }
        if (dbias) dbias[o] += db;
    }
}

// column sums of a [N, OC] matrix added into out[OC]
static void column_sums_add_cpu(float* out, const float* x, int N, int OC) {
    #pragma omp parallel for
    for (int o = 0; o < OC; o++) {
        float s = 0.0f;
        for (int n = 0; n < N; n++) s += x[(size_t)n * OC + o];
        out[o] += s;
    }
}

static void matmul_forward_cpu(float* out, const float* inp, const float* weight, const float* bias,
                               int N, int C, int OC) {
#ifdef USE_BLAS
    // start from the bias rows and let sgemm add the product (beta = 1)
    float beta = 0.0f;
    if (bias) {
        #pragma omp parallel for
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, OC * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, beta, out, OC);
#else
    matmul_forward_reference(out, inp, weight, bias, N, C, OC);
#endif
}

static void matmul_backward_cpu(float* dinp, float* dweight, float* dbias, const float* dout,
                                const float* inp, const float* weight, int N, int C, int OC) {
#ifdef USE_BLAS
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias) column_sums_add_cpu(dbias, dout, N, OC);
#else
    matmul_backward_reference(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
#endif
}

// ----------------------------------------------------------------------------
// causal self-attention
// qkv[N, 3*NH*HS] holds, for each token, the heads one after another and within a head
// [q | k | v] (Megatron's layout: splitting the rows of the QKV weight into contiguous
// blocks gives each tensor-parallel rank whole heads). out[N, NH*HS], heads side by side.
// att[B, NH, T, T] keeps the softmax probabilities for the backward pass.

static size_t qkv_index(int b, int t, int h, int which, int T, int NH, int HS) {
    return ((size_t)(b * T + t) * NH + h) * 3 * HS + (size_t)which * HS;
}

static void attention_forward_cpu(float* out, float* att, const float* qkv, int B, int T, int NH, int HS) {
    const float scale = 1.0f / sqrtf((float)HS);
    #pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < NH; h++) {
                const float* q = qkv + qkv_index(b, t, h, 0, T, NH, HS);
                float* a = att + (((size_t)b * NH + h) * T + t) * T;
                // scores of the keys at or before t, and their maximum for a stable softmax
                float maxval = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* k = qkv + qkv_index(b, t2, h, 1, T, NH, HS);
                    float s = 0.0f;
                    for (int i = 0; i < HS; i++) s += q[i] * k[i];
                    a[t2] = s * scale;
                    if (a[t2] > maxval) maxval = a[t2];
                }
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    a[t2] = expf(a[t2] - maxval);
                    sum += a[t2];
                }
                for (int t2 = 0; t2 < T; t2++) a[t2] = t2 <= t ? a[t2] / sum : 0.0f;
                // weighted sum of the values
                float* o = out + ((size_t)(b * T + t) * NH + h) * HS;
                for (int i = 0; i < HS; i++) o[i] = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* v = qkv + qkv_index(b, t2, h, 2, T, NH, HS);
                    for (int i = 0; i < HS; i++) o[i] += a[t2] * v[i];
                }
            }
        }
    }
}

// Backward of out = softmax(q k^T * scale) v. For one query row with probabilities p and
// datt[t2] = dout . v[t2]:  dscore[t2] = p[t2] * (datt[t2] - sum_j p[j] datt[j]).
static void attention_backward_cpu(float* dqkv, const float* dout, const float* qkv, const float* att,
                                   int B, int T, int NH, int HS) {
    const float scale = 1.0f / sqrtf((float)HS);
    // one (b, h) pair per iteration: dk and dv of a key gather from every later query
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                float* d = dqkv + qkv_index(b, t, h, 0, T, NH, HS);
                for (int i = 0; i < 3 * HS; i++) d[i] = 0.0f;
            }
            for (int t = 0; t < T; t++) {
                const float* a = att + (((size_t)b * NH + h) * T + t) * T;
                const float* dout_row = dout + ((size_t)(b * T + t) * NH + h) * HS;
                const float* q = qkv + qkv_index(b, t, h, 0, T, NH, HS);
                float* dq = dqkv + qkv_index(b, t, h, 0, T, NH, HS);
                float p_dot_datt = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* v = qkv + qkv_index(b, t2, h, 2, T, NH, HS);
                    float datt = 0.0f;
                    for (int i = 0; i < HS; i++) datt += dout_row[i] * v[i];
                    p_dot_datt += a[t2] * datt;
                }
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* k = qkv + qkv_index(b, t2, h, 1, T, NH, HS);
                    const float* v = qkv + qkv_index(b, t2, h, 2, T, NH, HS);
                    float* dk = dqkv + qkv_index(b, t2, h, 1, T, NH, HS);
                    float* dv = dqkv + qkv_index(b, t2, h, 2, T, NH, HS);
                    float datt = 0.0f;
                    for (int i = 0; i < HS; i++) datt += dout_row[i] * v[i];
                    float dscore = a[t2] * (datt - p_dot_datt) * scale;
                    for (int i = 0; i < HS; i++) {
                        dq[i] += dscore * k[i];
                        dk[i] += dscore * q[i];
                        dv[i] += a[t2] * dout_row[i];
                    }
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------
// GELU, GPT-2's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))

#define GELU_SCALE 0.7978845608028654f  // sqrt(2 / pi)

static void gelu_forward_cpu(float* out, const float* inp, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x)));
    }
}

// dinp may be the same buffer as dout
static void gelu_backward_cpu(float* dinp, const float* inp, const float* dout, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = grad * dout[i];
    }
}

// ----------------------------------------------------------------------------
// cross-entropy fused with the softmax, vocab-parallel (Megatron, Shoeybi et al. 2019 §3)
// Each rank holds the logits of V columns, of which the first `valid` are real vocabulary
// (the rest is padding: masked out of the softmax, zero gradient). A row's loss needs the
// maximum, the sum of exponentials and the target's logit over the whole vocabulary, so the
// work is cut into three steps with a tensor-parallel reduction between them:
//   row_max -> all-reduce(max) -> row_sums -> all-reduce(sum) -> forward / backward.
// The softmax itself is never stored: the backward writes dlogits over the logits.

static void crossentropy_row_max_cpu(float* row_max, const float* logits, int N, int V, int valid) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* l = logits + (size_t)n * V;
        float m = -INFINITY;
        for (int v = 0; v < valid; v++) m = l[v] > m ? l[v] : m;
        row_max[n] = m;
    }
}

// sums[n] = sum over this rank's valid columns of exp(logit - row_max);
// sums[N + n] = the target's logit if this rank holds the target's column, else 0
static void crossentropy_row_sums_cpu(float* sums, const float* logits, const float* row_max,
                                      const int* targets, int N, int V, int valid, int vocab_start) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* l = logits + (size_t)n * V;
        float s = 0.0f;
        for (int v = 0; v < valid; v++) s += expf(l[v] - row_max[n]);
        int local = targets[n] - vocab_start;
        sums[n] = s;
        sums[N + n] = (local >= 0 && local < valid) ? l[local] : 0.0f;
    }
}

// loss = log(sum exp(l - max)) + max - l[target]
static void crossentropy_forward_cpu(float* losses, const float* row_max, const float* sums, int N) {
    for (int n = 0; n < N; n++) losses[n] = logf(sums[n]) + row_max[n] - sums[N + n];
}

// dlogits = dloss * (softmax - onehot(target)), written over the logits
static void crossentropy_backward_cpu(float* logits, const float* row_max, const float* sums,
                                      const int* targets, float dloss, int N, int V, int valid, int vocab_start) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float* l = logits + (size_t)n * V;
        int local = targets[n] - vocab_start;
        float inv_sum = 1.0f / sums[n];
        for (int v = 0; v < V; v++) {
            float p = v < valid ? expf(l[v] - row_max[n]) * inv_sum : 0.0f;
            l[v] = (p - (v == local ? 1.0f : 0.0f)) * dloss;
        }
    }
}

// ----------------------------------------------------------------------------
// AdamW (Loshchilov & Hutter 2019), as torch.optim.AdamW and Megatron apply it:
//   g = grad * grad_scale                (grad_scale carries gradient clipping)
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = p - lr * ( (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * p )
// master is the fp32 copy that is updated; param gets the new value in floatX (on the CPU
// build they are the same buffer).

static void adamw_update_cpu(float* master, float* param, const float* grad, float* m, float* v,
                             size_t n, float lr, float beta1, float beta2, float eps,
                             float weight_decay, float grad_scale, int step) {
    // in double, as PyTorch: 1 - 0.999^t loses digits in float
    float bias_correction1 = (float)(1.0 - pow(beta1, step));
    float bias_correction2 = (float)(1.0 - pow(beta2, step));
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float update = (mi / bias_correction1) / (sqrtf(vi / bias_correction2) + eps);
        float p = master[i] - lr * (update + weight_decay * master[i]);
        master[i] = p;
        param[i] = p;
    }
}

// ----------------------------------------------------------------------------
// sum of squares, for the global gradient norm: *acc += sum x[i]^2, in double, in fixed
// chunks added in order (so the result does not depend on the number of threads)

static void sum_squares_cpu(double* acc, const float* x, size_t n) {
    size_t chunks = CEIL_DIV(n, (size_t)SUM_CHUNK);
    double* partial = (double*)mallocCheck(chunks * sizeof(double));
    #pragma omp parallel for
    for (size_t k = 0; k < chunks; k++) {
        size_t i1 = (k + 1) * SUM_CHUNK < n ? (k + 1) * SUM_CHUNK : n;
        double s = 0.0;
        for (size_t i = k * SUM_CHUNK; i < i1; i++) s += (double)x[i] * x[i];
        partial[k] = s;
    }
    double total = 0.0;
    for (size_t k = 0; k < chunks; k++) total += partial[k];
    free(partial);
    *acc += total;
}

#pragma GCC diagnostic pop

// ----------------------------------------------------------------------------
// the CPU build's kernels are the references

#ifndef __CUDACC__
#define encoder_forward encoder_forward_cpu
#define encoder_backward encoder_backward_cpu
#define residual_forward residual_forward_cpu
#define layernorm_forward layernorm_forward_cpu
#define layernorm_backward layernorm_backward_cpu
#define matmul_forward matmul_forward_cpu
#define matmul_backward matmul_backward_cpu
#define attention_forward(out, att, scratch, qkv, B, T, NH, HS) attention_forward_cpu(out, att, qkv, B, T, NH, HS)
#define attention_backward(dqkv, scratch, dout, qkv, att, B, T, NH, HS) attention_backward_cpu(dqkv, dout, qkv, att, B, T, NH, HS)
#define gelu_forward gelu_forward_cpu
#define gelu_backward gelu_backward_cpu
#define crossentropy_row_max crossentropy_row_max_cpu
#define crossentropy_row_sums crossentropy_row_sums_cpu
#define crossentropy_forward crossentropy_forward_cpu
#define crossentropy_backward crossentropy_backward_cpu
#define adamw_update adamw_update_cpu
#define sum_squares sum_squares_cpu
// attention needs no scratch memory on the CPU (the GPU path stages q, k, v for cuBLAS)
static size_t attention_scratch_elements(int B, int T, int NH, int HS) {
    (void)B; (void)T; (void)NH; (void)HS;
    return 0;
}
#endif

// ============================================================================
// CUDA versions
// ============================================================================
#ifdef __CUDACC__
#include "kernels_gpu_draft.cuh"
#endif
