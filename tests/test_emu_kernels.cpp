/*
tests/test_emu_kernels.cpp — every CUDA kernel of kernels.cuh, run by the CPU emulation in
tests/emu/, against its plain-C reference `<op>_cpu` from the same file.

Build and run: bash tests/test_emu.sh (g++ -std=c++20 -x c++ -D__CUDACC__ -Itests/emu), once
as the bf16 build and once with -DGRIDGPT_FP16 as the fp16 build; every check's name starts
with its precision.

Inputs are random, of sizes that are not multiples of any block size, with rows longer than
a warp (and than a block), a vocab-parallel slice with padding, repeated tokens. Values that
live in floatX are rounded to floatX before the reference sees them, so both sides start
from the same numbers. They stay well inside fp16's range (|x| <= 100, and nothing the
kernels compute from them comes near 65504). Each check reports max |got - want| / max |want|
over the tensor. The tolerances are multiples of floatX's unit roundoff u, the largest
relative error of one rounding to nearest (half an ulp at 1): u = 2^-8 for bf16 (8
significant bits), u = 2^-11 for fp16 (11 significant bits).
  X_OUT 2u        outputs the kernel computes in fp32 and rounds once to floatX: that
  (bf16 2^-7,     rounding is at most u relative; one ulp (2u) leaves room for fp32
   fp16 2^-10)    differences (summation order, tanhf vs the reference's exp form) that move
                  a value across a rounding boundary.
  X_CHAIN 4u      outputs computed from a floatX intermediate the kernel rounds on the way
  (bf16 2^-6,     (attention: probabilities, dscores, y): two roundings, plus cancellation in
   fp16 2^-9)     the sums that follow.
  FP32_OUT 1e-5   fp32 outputs (parameter gradients, LayerNorm statistics, losses, AdamW
                  state): same inputs, only the order of fp32 additions differs, ~sqrt(n)
                  2^-24 relative for the few hundred terms summed here.
  sum_squares is fp64 on both sides: 1e-12.
*/
#include "kernels.cuh"
#include "test.h"
#include <string>
#include <vector>

#ifdef GRIDGPT_FP16
#define FLOATX_NAME "fp16"
#define FLOATX_U (1.0 / 2048)  // 2^-11
#else
#define FLOATX_NAME "bf16"
#define FLOATX_U (1.0 / 256)   // 2^-8
#endif
#define X_OUT (2 * FLOATX_U)
#define X_CHAIN (4 * FLOATX_U)
#define FP32_OUT 1e-5

typedef std::vector<float> Vec;

static uint64_t rng_state = 12345;
static float urand(void) {  // uniform in [0, 1)
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / 16777216.0f;
}
static float floatX_round(float x) { return floatX_to_float(to_floatX(x)); }
// n values uniform in [-scale, scale); floatX-exact when `in_floatX` (they will live in floatX)
static Vec random_vec(size_t n, float scale, bool in_floatX) {
    Vec v(n);
    for (auto& x : v) x = (urand() * 2 - 1) * scale, x = in_floatX ? floatX_round(x) : x;
    return v;
}

// device copies: floatX or float
static floatX* to_dev_x(const Vec& h) {
    floatX* d = (floatX*)dev_malloc(h.size() * sizeof(floatX));
    floats_to_dev_floatX(d, h.data(), h.size());
    return d;
}
static float* to_dev_f(const Vec& h) {
    float* d = (float*)dev_malloc(h.size() * sizeof(float));
    host_to_dev(d, h.data(), h.size() * sizeof(float));
    return d;
}
static Vec from_dev_x(const floatX* d, size_t n) {
    Vec h(n);
    dev_floatX_to_floats(h.data(), d, n);
    return h;
}
static Vec from_dev_f(const float* d, size_t n) {
    Vec h(n);
    dev_to_host(h.data(), d, n * sizeof(float));
    return h;
}
static int* to_dev_i(const std::vector<int>& h) {
    int* d = (int*)dev_malloc(h.size() * sizeof(int));
    host_to_dev(d, h.data(), h.size() * sizeof(int));
    return d;
}

// one check: max |got - want| / max |want| <= tol (a NaN anywhere fails)
static void compare(const char* name, const Vec& got, const Vec& want, double tol) {
    double max_want = 1e-30, max_err = 0.0;
    size_t at = 0;
    bool nan = got.size() != want.size();
    for (size_t i = 0; i < want.size() && !nan; i++) {
        if (isnan(got[i]) || isnan(want[i])) nan = true, at = i;
        if (fabs(want[i]) > max_want) max_want = fabs(want[i]);
        double e = fabs((double)got[i] - want[i]);
        if (e > max_err) max_err = e, at = i;
    }
    double rel = nan ? NAN : max_err / max_want;
    char label[160];
    snprintf(label, sizeof label, FLOATX_NAME " %-34s n=%-6zu err %.2e (tol %.1e)", name, want.size(), rel, tol);
    check(!nan && rel <= tol, label, "element %zu: got %.7g, want %.7g", at, at < got.size() ? got[at] : NAN, want[at]);
}

// ----------------------------------------------------------------------------

static void test_encoder(void) {
    const int B = 2, T = 37, C = 70, N = B * T, vocab_start = 20, vocab_local = 50;
    std::vector<int> tokens(N);
    for (auto& t : tokens) t = (int)(urand() * 90);  // some fall outside [20, 70)
    tokens[3] = tokens[7] = tokens[40] = 25;          // repeats: atomics in the wte gradient
    int* d_tokens = to_dev_i(tokens);
    Vec wte = random_vec((size_t)vocab_local * C, 1, true), wpe = random_vec((size_t)T * C, 1, true);
    floatX *d_wte = to_dev_x(wte), *d_wpe = to_dev_x(wpe), *d_out = (floatX*)dev_malloc(N * C * sizeof(floatX));
    for (int with_wpe = 0; with_wpe < 2; with_wpe++) {
        Vec want(N * C);
        encoder_forward_cpu(want.data(), tokens.data(), wte.data(), with_wpe ? wpe.data() : NULL, N, T, C, vocab_start, vocab_local);
        encoder_forward(d_out, d_tokens, d_wte, with_wpe ? d_wpe : NULL, N, T, C, vocab_start, vocab_local);
        compare(with_wpe ? "encoder_forward" : "encoder_forward (no wpe)", from_dev_x(d_out, N * C), want, X_OUT);
    }
    Vec dout = random_vec(N * C, 1, true);
    floatX* d_dout = to_dev_x(dout);
    for (int with_wpe = 0; with_wpe < 2; with_wpe++) {
        Vec dwte = random_vec(wte.size(), 1, false), dwpe = random_vec(wpe.size(), 1, false);  // += into these
        float *d_dwte = to_dev_f(dwte), *d_dwpe = to_dev_f(dwpe);
        encoder_backward_cpu(dwte.data(), with_wpe ? dwpe.data() : NULL, dout.data(), tokens.data(), N, T, C, vocab_start, vocab_local);
        encoder_backward(d_dwte, with_wpe ? d_dwpe : NULL, d_dout, d_tokens, N, T, C, vocab_start, vocab_local);
        compare(with_wpe ? "encoder_backward dwte" : "encoder_backward dwte (no wpe)", from_dev_f(d_dwte, dwte.size()), dwte, FP32_OUT);
        compare(with_wpe ? "encoder_backward dwpe" : "encoder_backward dwpe untouched", from_dev_f(d_dwpe, dwpe.size()), dwpe, FP32_OUT);
    }
}

static void test_residual(void) {
    const size_t n = 1001;
    Vec a = random_vec(n, 1, true), b = random_vec(n, 1, true), want(n);
    residual_forward_cpu(want.data(), a.data(), b.data(), n);
    floatX *d_a = to_dev_x(a), *d_b = to_dev_x(b);
    residual_forward(d_a, d_a, d_b, n);  // in place, as the model calls it
    compare("residual_forward (in place)", from_dev_x(d_a, n), want, X_OUT);
}

static void test_layernorm(void) {
    const int N = 74, C = 300;  // rows longer than a block
    Vec x = random_vec(N * C, 2, false), w = random_vec(C, 1, true), b = random_vec(C, 1, true);
    for (auto& v : x) v = floatX_round(v + 0.5f);  // a mean away from 0
    Vec out(N * C), mean(N), rstd(N);
    layernorm_forward_cpu(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    floatX *d_x = to_dev_x(x), *d_w = to_dev_x(w), *d_b = to_dev_x(b), *d_out = (floatX*)dev_malloc(N * C * sizeof(floatX));
    float *d_mean = (float*)dev_malloc(N * sizeof(float)), *d_rstd = (float*)dev_malloc(N * sizeof(float));
    layernorm_forward(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C);
    compare("layernorm_forward out", from_dev_x(d_out, N * C), out, X_OUT);
    compare("layernorm_forward mean", from_dev_f(d_mean, N), mean, FP32_OUT);
    compare("layernorm_forward rstd", from_dev_f(d_rstd, N), rstd, FP32_OUT);

    Vec dout = random_vec(N * C, 1, true), dinp = random_vec(N * C, 1, true);  // dinp is added into
    Vec dw = random_vec(C, 1, false), db = random_vec(C, 1, false);
    floatX *d_dout = to_dev_x(dout), *d_dinp = to_dev_x(dinp);
    float *d_dw = to_dev_f(dw), *d_db = to_dev_f(db);
    // both sides use the kernel's statistics (fp32, already checked above)
    Vec gmean = from_dev_f(d_mean, N), grstd = from_dev_f(d_rstd, N);
    layernorm_backward_cpu(dinp.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), gmean.data(), grstd.data(), N, C);
    layernorm_backward(d_dinp, d_dw, d_db, d_dout, d_x, d_w, d_mean, d_rstd, N, C);
    compare("layernorm_backward dinp (+=)", from_dev_x(d_dinp, N * C), dinp, X_OUT);
    compare("layernorm_backward dweight (+=)", from_dev_f(d_dw, C), dw, FP32_OUT);
    compare("layernorm_backward dbias (+=)", from_dev_f(d_db, C), db, FP32_OUT);
}

static void test_matmul(void) {
    const int N = 74, C = 70, OC = 45;
    Vec x = random_vec(N * C, 1, true), w = random_vec(OC * C, 1, true), b = random_vec(OC, 1, true);
    floatX *d_x = to_dev_x(x), *d_w = to_dev_x(w), *d_b = to_dev_x(b), *d_out = (floatX*)dev_malloc(N * OC * sizeof(floatX));
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        Vec want(N * OC);
        matmul_forward_cpu(want.data(), x.data(), w.data(), with_bias ? b.data() : NULL, N, C, OC);
        matmul_forward(d_out, d_x, d_w, with_bias ? d_b : NULL, N, C, OC);
        compare(with_bias ? "matmul_forward" : "matmul_forward (no bias)", from_dev_x(d_out, N * OC), want, X_OUT);
    }
    Vec dout = random_vec(N * OC, 1, true);
    floatX* d_dout = to_dev_x(dout);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        Vec dinp(N * C), dw = random_vec(OC * C, 1, false), db = random_vec(OC, 1, false);
        float *d_dw = to_dev_f(dw), *d_db = to_dev_f(db);
        floatX* d_dinp = (floatX*)dev_malloc(N * C * sizeof(floatX));
        matmul_backward_cpu(dinp.data(), dw.data(), with_bias ? db.data() : NULL, dout.data(), x.data(), w.data(), N, C, OC);
        matmul_backward(d_dinp, d_dw, with_bias ? d_db : NULL, d_dout, d_x, d_w, N, C, OC);
        compare(with_bias ? "matmul_backward dinp" : "matmul_backward dinp (no bias)", from_dev_x(d_dinp, N * C), dinp, X_OUT);
        compare(with_bias ? "matmul_backward dweight (+=)" : "matmul_backward dweight (no bias)", from_dev_f(d_dw, OC * C), dw, FP32_OUT);
        compare(with_bias ? "matmul_backward dbias (+=)" : "matmul_backward dbias untouched", from_dev_f(d_db, OC), db, FP32_OUT);
    }
}

// alibi: none, or these 3 heads as global heads 2..4 of 5 (a tensor rank's share of a head
// count that is not a power of two)
static void test_attention(Alibi alibi) {
    const int B = 2, T = 37, NH = 3, HS = 10, N = B * T;  // T > 32: a softmax row spans lanes twice
    std::string with = alibi.heads ? " (ALiBi)" : "";
    const size_t n_qkv = (size_t)N * 3 * NH * HS, n_out = (size_t)N * NH * HS, n_att = (size_t)B * NH * T * T;
    Vec qkv = random_vec(n_qkv, 2, true), out(n_out), att(n_att);
    attention_forward_cpu(out.data(), att.data(), qkv.data(), B, T, NH, HS, alibi);
    floatX *d_qkv = to_dev_x(qkv), *d_out = (floatX*)dev_malloc(n_out * sizeof(floatX)), *d_att = (floatX*)dev_malloc(n_att * sizeof(floatX));
    // scratch one element past an aligned address: the regions must align themselves
    floatX* scratch_base = (floatX*)dev_malloc((attention_scratch_elements(B, T, NH, HS) + 1) * sizeof(floatX));
    floatX* d_scratch = scratch_base + 1;
    attention_forward(d_out, d_att, NULL, d_scratch, d_qkv, B, T, NH, HS, alibi);  // no lse: the cuBLAS path
    Vec got_att = from_dev_x(d_att, n_att);
    compare(("attention_forward att" + with).c_str(), got_att, att, X_OUT);
    compare(("attention_forward out" + with).c_str(), from_dev_x(d_out, n_out), out, X_CHAIN);
    bool masked_zero = true;
    for (size_t r = 0; r < (size_t)B * NH * T; r++)
        for (int t2 = (int)(r % T) + 1; t2 < T; t2++) masked_zero = masked_zero && got_att[r * T + t2] == 0.0f;
    check(masked_zero, (FLOATX_NAME " attention_forward att is exactly 0 above the diagonal" + with).c_str(), "a masked probability is not 0");

    // the backward reads att: both sides get the kernel's floatX probabilities
    Vec dout = random_vec(n_out, 1, true), dqkv(n_qkv), cpu_scratch((size_t)B * NH * T);
    attention_backward_cpu(dqkv.data(), cpu_scratch.data(), dout.data(), qkv.data(), got_att.data(), B, T, NH, HS);
    floatX *d_dout = to_dev_x(dout), *d_dqkv = (floatX*)dev_malloc(n_qkv * sizeof(floatX));
    attention_backward(d_dqkv, d_scratch, d_dout, d_qkv, d_out, d_att, NULL, B, T, NH, HS, alibi);
    Vec got = from_dev_x(d_dqkv, n_qkv), parts_got[3], parts_want[3];  // split into dq, dk, dv
    for (size_t i = 0; i < n_qkv; i++) {
        parts_got[(i / HS) % 3].push_back(got[i]);
        parts_want[(i / HS) % 3].push_back(dqkv[i]);
    }
    compare(("attention_backward dq" + with).c_str(), parts_got[0], parts_want[0], X_CHAIN);
    compare(("attention_backward dk" + with).c_str(), parts_got[1], parts_want[1], X_CHAIN);
    compare(("attention_backward dv" + with).c_str(), parts_got[2], parts_want[2], X_OUT);
}

// the log-sum-exp of each row's scaled, biased scores, in double: what the fused forward keeps
static Vec reference_lse(const Vec& qkv, int B, int T, int NH, int HS, Alibi alibi) {
    Vec lse((size_t)B * NH * T);
    double scale = 1.0 / sqrt((double)HS);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                std::vector<double> x(t + 1);
                double mx = -INFINITY, sum = 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *q = &qkv[qkv_index(b, t, h, 0, T, NH, HS)], *k = &qkv[qkv_index(b, t2, h, 1, T, NH, HS)];
                    double dot = 0.0;
                    for (int i = 0; i < HS; i++) dot += (double)q[i] * k[i];
                    x[t2] = dot * scale + alibi_bias(alibi, h, t, t2), mx = fmax(mx, x[t2]);
                }
                for (int t2 = 0; t2 <= t; t2++) sum += exp(x[t2] - mx);
                lse[((size_t)b * NH + h) * T + t] = (float)(mx + log(sum));
            }
    return lse;
}

// The fused attention (the flash layout: lse, no att) against the C references, which keep
// fp32 probabilities. Tolerances: out rounds p to floatX before the product with v and rounds
// once at the end, as the unfused path does: X_CHAIN. The backward recomputes p from the
// scores and lse, and reads D = rowsum(dout * out) from the floatX out; p and ds are rounded
// to floatX before their products, each output rounded once more: two roundings, X_CHAIN, as the
// unfused path's dq and dk (measured: about 1u each, dq and dk included, whose ds = p (dp - D)
// also carries D's rounding through the cancellation in dp - D).
// lse is fp32 on exact inputs: the summation order only (1e-5). Twice the same backward must
// give the same bits: no atomics, whatever order the blocks run in.
static void test_flash_attention(int B, int T, int NH, int HS, Alibi alibi) {
    const int N = B * T;
    char with[96];
    snprintf(with, sizeof with, " B=%d T=%d NH=%d HS=%d%s", B, T, NH, HS, alibi.heads ? " ALiBi" : "");
    const size_t n_qkv = (size_t)N * 3 * NH * HS, n_out = (size_t)N * NH * HS, rows = (size_t)B * NH * T;
    Vec qkv = random_vec(n_qkv, 2, true), out(n_out), att(rows * T);
    attention_forward_cpu(out.data(), att.data(), qkv.data(), B, T, NH, HS, alibi);
    floatX *d_qkv = to_dev_x(qkv), *d_out = (floatX*)dev_malloc(n_out * sizeof(floatX));
    float *d_lse = (float*)dev_malloc(rows * sizeof(float)), *d_D = (float*)dev_malloc(rows * sizeof(float));
    attention_forward(d_out, NULL, d_lse, (floatX*)d_D, d_qkv, B, T, NH, HS, alibi);
    compare((std::string("flash attention_forward out") + with).c_str(), from_dev_x(d_out, n_out), out, X_CHAIN);
    compare((std::string("flash attention_forward lse") + with).c_str(), from_dev_f(d_lse, rows),
            reference_lse(qkv, B, T, NH, HS, alibi), FP32_OUT);

    Vec dout = random_vec(n_out, 1, true), dqkv(n_qkv), cpu_scratch(rows);
    attention_backward_cpu(dqkv.data(), cpu_scratch.data(), dout.data(), qkv.data(), att.data(), B, T, NH, HS);
    floatX *d_dout = to_dev_x(dout), *d_dqkv = (floatX*)dev_malloc(n_qkv * sizeof(floatX));
    attention_backward(d_dqkv, (floatX*)d_D, d_dout, d_qkv, d_out, NULL, d_lse, B, T, NH, HS, alibi);
    Vec got = from_dev_x(d_dqkv, n_qkv), parts_got[3], parts_want[3];  // split into dq, dk, dv
    for (size_t i = 0; i < n_qkv; i++) {
        parts_got[(i / HS) % 3].push_back(got[i]);
        parts_want[(i / HS) % 3].push_back(dqkv[i]);
    }
    compare((std::string("flash attention_backward dq") + with).c_str(), parts_got[0], parts_want[0], X_CHAIN);
    compare((std::string("flash attention_backward dk") + with).c_str(), parts_got[1], parts_want[1], X_CHAIN);
    compare((std::string("flash attention_backward dv") + with).c_str(), parts_got[2], parts_want[2], X_CHAIN);
    attention_backward(d_dqkv, (floatX*)d_D, d_dout, d_qkv, d_out, NULL, d_lse, B, T, NH, HS, alibi);
    Vec again = from_dev_x(d_dqkv, n_qkv);
    check(memcmp(again.data(), got.data(), n_qkv * sizeof(float)) == 0,
          (std::string(FLOATX_NAME " flash attention_backward twice: the same bits") + with).c_str(), "the two runs differ");
    dev_free(d_qkv), dev_free(d_out), dev_free(d_lse), dev_free(d_D), dev_free(d_dout), dev_free(d_dqkv);
}

static void test_gelu(void) {
    const size_t n = 999;
    Vec x = random_vec(n, 4, true), dout = random_vec(n, 1, true), out(n), dinp(n);
    gelu_forward_cpu(out.data(), x.data(), n);
    gelu_backward_cpu(dinp.data(), x.data(), dout.data(), n);
    floatX *d_x = to_dev_x(x), *d_dout = to_dev_x(dout), *d_out = (floatX*)dev_malloc(n * sizeof(floatX));
    gelu_forward(d_out, d_x, n);
    compare("gelu_forward", from_dev_x(d_out, n), out, X_OUT);
    gelu_backward(d_dout, d_x, d_dout, n);  // in place, as the model calls it
    compare("gelu_backward (in place)", from_dev_x(d_dout, n), dinp, X_OUT);
}

static void test_crossentropy(void) {
    const int N = 74, V = 300, valid = 290, vocab_start = 300;  // rank 1 of a vocab-parallel split
    Vec logits = random_vec((size_t)N * V, 5, true);
    for (int n = 0; n < N; n++)
        for (int v = valid; v < V; v++) logits[(size_t)n * V + v] = 100.0f;  // padding: must be masked
    std::vector<int> targets(N);
    for (auto& t : targets) t = (int)(urand() * 3 * V);  // mostly on other ranks
    targets[0] = vocab_start, targets[1] = vocab_start + valid - 1, targets[2] = vocab_start + valid;  // edges
    int* d_targets = to_dev_i(targets);
    floatX* d_logits = to_dev_x(logits);
    float *d_max = (float*)dev_malloc(N * sizeof(float)), *d_sums = (float*)dev_malloc(2 * N * sizeof(float));
    float* d_losses = (float*)dev_malloc(N * sizeof(float));
    Vec row_max(N), sums(2 * N), losses(N);
    crossentropy_row_max_cpu(row_max.data(), logits.data(), N, V, valid);
    crossentropy_row_max(d_max, d_logits, N, V, valid);
    compare("crossentropy_row_max", from_dev_f(d_max, N), row_max, FP32_OUT);
    crossentropy_row_sums_cpu(sums.data(), logits.data(), row_max.data(), targets.data(), N, V, valid, vocab_start);
    crossentropy_row_sums(d_sums, d_logits, d_max, d_targets, N, V, valid, vocab_start);
    compare("crossentropy_row_sums", from_dev_f(d_sums, 2 * N), sums, FP32_OUT);
    crossentropy_forward_cpu(losses.data(), row_max.data(), sums.data(), N);
    crossentropy_forward(d_losses, d_max, d_sums, N);
    compare("crossentropy_forward", from_dev_f(d_losses, N), losses, FP32_OUT);
    crossentropy_backward_cpu(logits.data(), row_max.data(), sums.data(), targets.data(), 0.25f, N, V, valid, vocab_start);
    crossentropy_backward(d_logits, d_max, d_sums, d_targets, 0.25f, N, V, valid, vocab_start);
    compare("crossentropy_backward (in place)", from_dev_x(d_logits, (size_t)N * V), logits, X_OUT);
}

static void test_adamw(void) {
    const size_t n = 777;
    Vec master = random_vec(n, 1, false), grad = random_vec(n, 1, false), m = random_vec(n, 0.1f, false), v = random_vec(n, 0.1f, false);
    for (auto& x : v) x = fabsf(x);
    float *d_master = to_dev_f(master), *d_grad = to_dev_f(grad), *d_m = to_dev_f(m), *d_v = to_dev_f(v);
    floatX* d_param = (floatX*)dev_malloc(n * sizeof(floatX));
    Vec param(n);
    adamw_update_cpu(master.data(), param.data(), grad.data(), m.data(), v.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 3);
    adamw_update(d_master, d_param, d_grad, d_m, d_v, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 3);
    compare("adamw_update master", from_dev_f(d_master, n), master, FP32_OUT);
    compare("adamw_update m", from_dev_f(d_m, n), m, FP32_OUT);
    compare("adamw_update v", from_dev_f(d_v, n), v, FP32_OUT);
    compare("adamw_update param (floatX)", from_dev_x(d_param, n), param, X_OUT);
}

static void test_sum_squares(void) {
    // 1 element, less than one block, and more than SUM_SQUARES_MAX_BLOCKS blocks (grid-stride)
    const size_t sizes[3] = {1, 1000, (size_t)SUM_SQUARES_MAX_BLOCKS * SUM_SQUARES_BLOCK + 777};
    for (size_t n : sizes) {
        Vec x = random_vec(n, 1, false);
        double want = 1.5, got = 1.5;  // it adds into *acc
        sum_squares_cpu(&want, x.data(), n);
        float* d_x = to_dev_f(x);
        double* d_acc = (double*)dev_malloc(sizeof(double));
        host_to_dev(d_acc, &got, sizeof(double));
        sum_squares(d_acc, d_x, n);
        dev_to_host(&got, d_acc, sizeof(double));
        char label[96];
        double rel = fabs(got - want) / want;
        snprintf(label, sizeof label, FLOATX_NAME " sum_squares (+=) n=%-7zu err %.2e (tol 1e-12)", n, rel);
        check(rel <= 1e-12, label, "got %.17g, want %.17g", got, want);
        dev_free(d_x);
        dev_free(d_acc);
    }
}

// the cuBLAS emulation rejects what cuBLAS rejects
static void test_cublas_checks(void) {
    floatX* a = (floatX*)dev_malloc(64 * sizeof(floatX));
    float* c = (float*)dev_malloc(64 * sizeof(float));
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasGemmEx(cublas_handle, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, a, CUDA_R_FLOATX, 7,
                                    a, CUDA_R_FLOATX, 8, &zero, c, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    check(s == CUBLAS_STATUS_INVALID_VALUE, FLOATX_NAME " emu cuBLAS: lda < m with OP_N is INVALID_VALUE", "status %d", (int)s);
    s = cublasGemmEx(cublas_handle, CUBLAS_OP_T, CUBLAS_OP_N, 4, 8, 8, &one, a, CUDA_R_FLOATX, 4,
                     a, CUDA_R_FLOATX, 8, &zero, c, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    check(s == CUBLAS_STATUS_INVALID_VALUE, FLOATX_NAME " emu cuBLAS: lda < k with OP_T is INVALID_VALUE", "status %d", (int)s);
    dev_free(a);
    dev_free(c);
}

// the fused attention's checks alone: tests/test_emu.sh's planted bugs run these
static void test_flash_attention_shapes(void) {
    Alibi none = {0, 0}, heads_2_to_4_of_5 = {2, 5};
    // T past a tile boundary (37, 70: a partial last tile), T below one tile (20), head sizes
    // 16, 32, 64, B and NH above 1, ALiBi on and off
    test_flash_attention(2, 37, 3, 16, none);
    test_flash_attention(2, 37, 3, 16, heads_2_to_4_of_5);
    test_flash_attention(1, 20, 2, 32, none);
    test_flash_attention(2, 70, 2, 64, heads_2_to_4_of_5);
}

// argument "flash": only the fused attention's checks
int main(int argc, char** argv) {
    kernels_init(0);
    if (argc > 1 && strcmp(argv[1], "flash") == 0) {
        test_flash_attention_shapes();
        return tests_summary();
    }
    test_cublas_checks();
    test_encoder();
    test_residual();
    test_layernorm();
    test_matmul();
    Alibi none = {0, 0}, heads_2_to_4_of_5 = {2, 5};
    test_attention(none);
    test_attention(heads_2_to_4_of_5);
    test_flash_attention_shapes();
    test_gelu();
    test_crossentropy();
    test_adamw();
    test_sum_squares();
#ifdef EMU_MAX_BLOCK   // under the emulation (tests/emu); nvcc builds this file for make test-gpu too
    printf("(%ld emulated kernel launches)\n", emu.launches);
#endif
    return tests_summary();
}
