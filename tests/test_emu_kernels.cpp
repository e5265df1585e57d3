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
#include <algorithm>
#include <setjmp.h>
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

// C = 70: rows that are not whole 128-bit packs (load_pack's element-by-element path);
// C = 64: whole, aligned packs
static void test_encoder(int C) {
    const int B = 2, T = 37, N = B * T, vocab_start = 20, vocab_local = 50;
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
        std::string name = std::string(with_wpe ? "encoder_forward" : "encoder_forward (no wpe)") + " C=" + std::to_string(C);
        compare(name.c_str(), from_dev_x(d_out, N * C), want, X_OUT);
    }
    if (C != 70) return;   // the backward is not packed: once is enough
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

// The packed elementwise kernels on: n = 1000, whole packs (the allocations are 16-byte
// aligned under either EMU_GUARD); n = 1001, a tail of one element (and, with allocations
// ending at a guard page, buffers that are only 2-byte aligned: element by element); and a
// buffer one element past an aligned address, whose packs are all misaligned.
static const size_t packed_sizes[3] = {1000, 1001, 1000};
static floatX* offset_copy(const Vec& h, int offset) {   // on the device, `offset` elements in
    floatX* d = (floatX*)dev_malloc((h.size() + offset) * sizeof(floatX)) + offset;
    floats_to_dev_floatX(d, h.data(), h.size());
    return d;
}

// the same floats, bit for bit
static bool same_bits(const Vec& a, const Vec& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

static void test_residual(void) {
    for (int k = 0; k < 3; k++) {
        size_t n = packed_sizes[k];
        int offset = k == 2;
        Vec a = random_vec(n, 1, true), b = random_vec(n, 1, true), want(n);
        residual_forward_cpu(want.data(), a.data(), b.data(), n);
        floatX *d_a = offset_copy(a, offset), *d_b = to_dev_x(b);
        residual_forward(d_a, d_a, d_b, n);  // in place, as the model calls it
        compare(offset ? "residual_forward (in place, misaligned)" : "residual_forward (in place)", from_dev_x(d_a, n), want, X_OUT);
    }
}

// out[n] += table[(first_row + n) % period]: a bias (period 1; its gradient through the column
// sums' chunks) and positions from the middle of a sequence (period T); C = 70 and 64 as the encoder's
static void test_rows_add(int C) {
    const int N = 37, T = 11, first_row = 16;
    for (int period : {1, T}) {
        Vec base = random_vec((size_t)N * C, 1, true), table = random_vec((size_t)period * C, 1, true), want = base;
        rows_add_forward_cpu(want.data(), table.data(), N, C, first_row, period);
        floatX *d_out = to_dev_x(base), *d_table = to_dev_x(table);
        rows_add_forward(d_out, d_table, N, C, first_row, period);
        std::string name = "rows_add_forward period " + std::to_string(period) + " C=" + std::to_string(C);
        compare(name.c_str(), from_dev_x(d_out, (size_t)N * C), want, X_OUT);
        Vec dout = random_vec((size_t)N * C, 1, true), dtable = random_vec(table.size(), 1, false);   // += into dtable
        floatX* d_dout = to_dev_x(dout);
        float *d_dtable = to_dev_f(dtable), *d_partials = (float*)dev_malloc(bias_grad_partials(this_build(), N, C) * sizeof(float));
        rows_add_backward_cpu(dtable.data(), dout.data(), N, C, first_row, period);
        rows_add_backward(d_dtable, d_partials, d_dout, N, C, first_row, period);
        name = "rows_add_backward period " + std::to_string(period) + " C=" + std::to_string(C);
        compare(name.c_str(), from_dev_f(d_dtable, dtable.size()), dtable, FP32_OUT);
    }
}

// residual = a + b and out = LayerNorm(residual) in one kernel, against the two references;
// in place (residual == a), as the model calls it
static void test_residual_layernorm(int C) {
    const int N = 74;
    Vec a = random_vec(N * C, 2, true), b = random_vec(N * C, 1, true), w = random_vec(C, 1, true), bias = random_vec(C, 1, true);
    for (auto& v : a) v = floatX_round(v + 0.5f);  // a mean away from 0
    Vec res(N * C), out(N * C), mean(N), rstd(N);
    residual_layernorm_forward_cpu(res.data(), out.data(), mean.data(), rstd.data(), a.data(), b.data(), w.data(), bias.data(), N, C);
    // the reference normalizes fp32 sums; the kernel its floatX residual: give the reference that
    Vec res_x(N * C);
    for (size_t i = 0; i < res.size(); i++) res_x[i] = floatX_round(res[i]);
    layernorm_forward_cpu(out.data(), mean.data(), rstd.data(), res_x.data(), w.data(), bias.data(), N, C);
    floatX *d_a = to_dev_x(a), *d_b = to_dev_x(b), *d_w = to_dev_x(w), *d_bias = to_dev_x(bias);
    floatX* d_out = (floatX*)dev_malloc(N * C * sizeof(floatX));
    float *d_mean = (float*)dev_malloc(N * sizeof(float)), *d_rstd = (float*)dev_malloc(N * sizeof(float));
    residual_layernorm_forward(d_a, d_out, d_mean, d_rstd, d_a, d_b, d_w, d_bias, N, C);
    std::string c = " C=" + std::to_string(C);
    compare(("residual_layernorm_forward residual" + c).c_str(), from_dev_x(d_a, N * C), res, X_OUT);
    compare(("residual_layernorm_forward out" + c).c_str(), from_dev_x(d_out, N * C), out, X_OUT);
    compare(("residual_layernorm_forward mean" + c).c_str(), from_dev_f(d_mean, N), mean, FP32_OUT);
    compare(("residual_layernorm_forward rstd" + c).c_str(), from_dev_f(d_rstd, N), rstd, FP32_OUT);
}

static void test_layernorm_shape(int N, int C) {
    std::string shape = " N=" + std::to_string(N) + " C=" + std::to_string(C);
    Vec x = random_vec((size_t)N * C, 2, false), w = random_vec(C, 1, true), b = random_vec(C, 1, true);
    for (auto& v : x) v = floatX_round(v + 0.5f);  // a mean away from 0
    Vec out((size_t)N * C), mean(N), rstd(N);
    layernorm_forward_cpu(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    floatX *d_x = to_dev_x(x), *d_w = to_dev_x(w), *d_b = to_dev_x(b), *d_out = (floatX*)dev_malloc((size_t)N * C * sizeof(floatX));
    float *d_mean = (float*)dev_malloc(N * sizeof(float)), *d_rstd = (float*)dev_malloc(N * sizeof(float));
    layernorm_forward(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C);
    compare(("layernorm_forward out" + shape).c_str(), from_dev_x(d_out, (size_t)N * C), out, X_OUT);
    compare(("layernorm_forward mean" + shape).c_str(), from_dev_f(d_mean, N), mean, FP32_OUT);
    compare(("layernorm_forward rstd" + shape).c_str(), from_dev_f(d_rstd, N), rstd, FP32_OUT);

    Vec dout = random_vec((size_t)N * C, 1, true), dinp = random_vec((size_t)N * C, 1, true);  // dinp is added into
    Vec dw = random_vec(C, 1, false), db = random_vec(C, 1, false);
    floatX* d_dout = to_dev_x(dout);
    float* d_partials = (float*)dev_malloc(layernorm_grad_partials(this_build(), N, C) * sizeof(float));
    // both sides use the kernel's statistics (fp32, already checked above)
    Vec gmean = from_dev_f(d_mean, N), grstd = from_dev_f(d_rstd, N), got[2][3];
    for (int run = 0; run < 2; run++) {   // twice from the same inputs: the same bits
        floatX* d_dinp = to_dev_x(dinp);
        float *d_dw = to_dev_f(dw), *d_db = to_dev_f(db);
        layernorm_backward(d_dinp, d_dw, d_db, d_partials, d_dout, d_x, d_w, d_mean, d_rstd, N, C);
        got[run][0] = from_dev_x(d_dinp, (size_t)N * C), got[run][1] = from_dev_f(d_dw, C), got[run][2] = from_dev_f(d_db, C);
        dev_free(d_dinp), dev_free(d_dw), dev_free(d_db);
    }
    layernorm_backward_cpu(dinp.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), gmean.data(), grstd.data(), N, C);
    compare(("layernorm_backward dinp (+=)" + shape).c_str(), got[0][0], dinp, X_OUT);
    compare(("layernorm_backward dweight (+=)" + shape).c_str(), got[0][1], dw, FP32_OUT);
    compare(("layernorm_backward dbias (+=)" + shape).c_str(), got[0][2], db, FP32_OUT);
    check(same_bits(got[0][0], got[1][0]) && same_bits(got[0][1], got[1][1]) && same_bits(got[0][2], got[1][2]),
          (FLOATX_NAME " layernorm_backward twice: the same bits" + shape).c_str(), "the two runs differ");
    for (void* p : {(void*)d_x, (void*)d_w, (void*)d_b, (void*)d_out, (void*)d_mean, (void*)d_rstd, (void*)d_dout, (void*)d_partials})
        dev_free(p);
}

// rows not a multiple of the 32-row chunks (and fewer than one), rows longer than a block
// (and than 32 packs: C = 300, half its rows not 16-byte aligned), odd (C = 77), whole
// aligned packs (C = 264), more packs than the backward's block has threads (C = 2056: 257),
// more chunks (35, of 32 rows) than column_partials_add's block has runs of them (32)
static void test_layernorm(void) {
    const int shapes[9][2] = {{74, 300}, {1, 1}, {33, 7}, {97, 1100}, {32, 64}, {74, 77}, {74, 264}, {40, 2056}, {1100, 24}};
    for (auto& s : shapes) test_layernorm_shape(s[0], s[1]);
}

// bias gradients: column sums added into out, for several chunk counts (the model's is
// bias_grad_chunks(N, OC), the last one here); each twice from the same inputs, the blocks in
// another order each time (the emulation shuffles them per launch): the last block of a tile,
// which adds its partials, is another one, the bits the same
static void test_column_sums(void) {
    const int shapes[4][2] = {{37, 45}, {1, 1}, {300, 1027}, {1000, 3}};
    for (auto& shape : shapes) {
        int N = shape[0], OC = shape[1];
        Vec x = random_vec((size_t)N * OC, 1, true), out0 = random_vec(OC, 1, false), want = out0;
        column_sums_add_cpu(want.data(), x.data(), N, OC);
        floatX* d_x = to_dev_x(x);
        int chunk_counts[4] = {1, 3, 7, bias_grad_chunks(N, OC)};
        for (int chunks : chunk_counts) {
            float* d_partials = (float*)dev_malloc((size_t)chunks * OC * sizeof(float));
            Vec got[2];
            for (int run = 0; run < 2; run++) {
                float* d_out = to_dev_f(out0);
                column_sums_add_chunks(d_out, d_partials, d_x, N, OC, chunks);
                got[run] = from_dev_f(d_out, OC);
                dev_free(d_out);
            }
            char name[96];
            snprintf(name, sizeof name, "column_sums_add N=%d OC=%d chunks=%d", N, OC, chunks);
            compare(name, got[0], want, FP32_OUT);
            check(same_bits(got[0], got[1]), (std::string(FLOATX_NAME " ") + name + " twice: the same bits").c_str(),
                  "the two runs differ");
            dev_free(d_partials);
        }
        dev_free(d_x);
    }
#ifdef EMU_MAX_BLOCK   // the last block of each column tile put its counter back to 0
    std::vector<unsigned int> counters(COLUMN_COUNTERS);
    dev_to_host(counters.data(), column_counters, COLUMN_COUNTERS_BYTES);
    size_t left = 0;
    for (unsigned int c : counters) left += c != 0;
    check(left == 0, FLOATX_NAME " column_sums_add: every tile's counter is 0 again after the sums", "%zu are not", left);
#endif
    // the model's chunking fills the GPU: about COLUMN_REDUCE_BLOCKS blocks for a GPT-2 small
    // bias (N = 8 x 1024, OC = 768: 3 tiles of 256 columns), at least 32 rows a chunk
    int chunks = bias_grad_chunks(8192, 768);
    check(chunks * 3 >= 512 && (8192 + chunks - 1) / chunks >= COLUMN_CHUNK_ROWS,
          FLOATX_NAME " bias_grad_chunks(8192, 768): hundreds of blocks of >= 32 rows", "%d chunks", chunks);
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
    // partials rounded up to 16 bytes and one float more: 16-byte aligned at either end of a
    // guard page, and one float in, not
    size_t partial_floats = (bias_grad_partials(this_build(), N, OC) + 3) / 4 * 4;
    float* d_partials = (float*)dev_malloc((partial_floats + 4) * sizeof(float));
    // the bias gradient: none; in the weight gradient's epilogue (BGRADB); column_sums_add's
    // (partials not 16-byte aligned)
    const char* cases[3] = {" (no bias)", " (BGRADB)", " (column sums)"};
    for (int path = 0; path < 3; path++) {   // 0: no bias, 1: BGRADB, 2: column sums
        bool with_bias = path > 0;
        Vec dinp(N * C), dw = random_vec(OC * C, 1, false), db = random_vec(OC, 1, false);
        float *d_dw = to_dev_f(dw), *d_db = to_dev_f(db);
        floatX* d_dinp = (floatX*)dev_malloc(N * C * sizeof(floatX));
        std::string name = cases[path];
        matmul_backward_cpu(dinp.data(), dw.data(), with_bias ? db.data() : NULL, dout.data(), x.data(), w.data(), N, C, OC);
        long plans = lt_heuristic_calls;
        matmul_backward(d_dinp, d_dw, with_bias ? d_db : NULL, d_partials + (path == 2), d_dout, d_x, d_w, N, C, OC);
#ifdef EMU_MAX_BLOCK   // the emulated heuristic offers an algorithm for every product that follows the rules
        // both products ask cuBLASLt (issue 39): two plans the first time (dinp's, dweight's
        // fp32 one with beta 1), then one for dweight's with the BGRADB epilogue, then none
        // (dinp's and dweight's without the epilogue made already)
        long want = path == 0 ? 2 : path == 1 ? 1 : 0;
        check(lt_heuristic_calls - plans == want, (FLOATX_NAME " matmul_backward: its products are cuBLASLt plans, made once" + name).c_str(),
              "%ld new plans, expected %ld", lt_heuristic_calls - plans, want);
#endif
        compare(("matmul_backward dinp" + name).c_str(), from_dev_x(d_dinp, N * C), dinp, X_OUT);
        compare(("matmul_backward dweight (+=)" + name).c_str(), from_dev_f(d_dw, OC * C), dw, FP32_OUT);
        compare(("matmul_backward dbias (+=)" + name).c_str(), from_dev_f(d_db, OC), db, FP32_OUT);
    }
}

// the plans of a GELU epilogue (forward or backward) made since the plans were last freed
static int lt_gelu_plans(void) {
    int n = 0;
    for (int i = 0; i < lt_plan_count; i++) {
        cublasLtEpilogue_t e = (cublasLtEpilogue_t)lt_plans[i].key.epilogue;
        n += e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX ||
             e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU;   // (the real cuBLASLt's names: nvcc builds this file too)
    }
    return n;
}

// The forward through cuBLASLt's epilogues against the references: matmul_forward_reference
// with the bias, and gelu_forward_cpu of that. OC = 48: the epilogues (GELU_AUX_BIAS takes an
// aux ld that is a multiple of 8); OC = 45: matmul_gelu_forward's two-step fallback (and under
// EMU_GUARD=end the bias, 90 bytes, is only 2-byte aligned: matmul_forward's fill_rows path).
// C = 71: odd rows for the GEMM's inputs. GELU's erf form: the two steps at any OC (cuBLASLt
// has no epilogue of it), against gelu_erf_forward_cpu.
static void test_matmul_epilogues(int OC, GeluForm form) {
    const int N = 74, C = 71;
    Vec x = random_vec(N * C, 1, true), w = random_vec(OC * C, 1, true), b = random_vec(OC, 1, true);
    floatX *d_x = to_dev_x(x), *d_w = to_dev_x(w), *d_b = to_dev_x(b);
    floatX *d_out = (floatX*)dev_malloc(N * OC * sizeof(floatX)), *d_pre = (floatX*)dev_malloc(N * OC * sizeof(floatX));
    std::string oc = " OC=" + std::to_string(OC) + (form == GELU_ERF ? " (erf)" : "");
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        Vec pre(N * OC), out(N * OC);
        matmul_forward_reference(pre.data(), x.data(), w.data(), with_bias ? b.data() : NULL, N, C, OC);
        (form == GELU_ERF ? gelu_erf_forward_cpu : gelu_forward_cpu)(out.data(), pre.data(), pre.size());
        std::string with = (with_bias ? " (bias)" : " (no bias)") + oc;
        matmul_forward(d_out, d_x, d_w, with_bias ? d_b : NULL, N, C, OC);
        compare(("matmul_forward" + with).c_str(), from_dev_x(d_out, N * OC), pre, X_OUT);
        if (form == GELU_ERF) lt_plans_free();   // (the plans below: this call's)
        matmul_gelu_forward(d_out, d_pre, d_x, d_w, with_bias ? d_b : NULL, N, C, OC, form);
        if (form == GELU_ERF)   // cuBLASLt's GELU epilogues are the tanh form
            check(!lt_gelu_plans(), (FLOATX_NAME " matmul_gelu_forward of the erf form takes no GELU epilogue" + with).c_str(),
                  "%d plans of one", lt_gelu_plans());
        compare(("matmul_gelu_forward pre_gelu" + with).c_str(), from_dev_x(d_pre, N * OC), pre, X_OUT);
        // the erf form: the GELU of pre_gelu's rounding (the epilogue's of the fp32 sum)
        compare(("matmul_gelu_forward out" + with).c_str(), from_dev_x(d_out, N * OC), out, X_OUT);
    }
}

// Has cuBLASLt a plan of this epilogue for a product with m rows, with an algorithm?
static bool lt_plan_found(cublasLtEpilogue_t kind, int m) {
    for (int i = 0; i < lt_plan_count; i++)
        if (lt_plans[i].key.epilogue == kind && lt_plans[i].key.m == m && lt_plans[i].found) return true;
    return false;
}

// The MLP's second linear layer and the GELU before it, backward, against matmul_backward_cpu
// then gelu_backward_cpu in fp32. C = 48: the GELU' in cuBLASLt's DGELU epilogue (one
// rounding of dpre: X_OUT); C = 45: an aux ld that is not a multiple of 8, the two-step
// fallback, whose product is rounded to floatX before the GELU' kernel rounds again (X_CHAIN).
// GELU's erf form: that fallback at any C (no epilogue computes its derivative).
static void test_gelu_matmul_backward(int C, GeluForm form) {
    const int N = 74, OC = 37;
    Vec pre = random_vec(N * C, 3, true), w = random_vec(OC * C, 1, true), dout = random_vec(N * OC, 1, true), inp(N * C);
    (form == GELU_ERF ? gelu_erf_forward_cpu : gelu_forward_cpu)(inp.data(), pre.data(), inp.size());
    for (auto& v : inp) v = floatX_round(v);   // the layer's input lives in floatX
    Vec dpre(N * C), dw = random_vec(OC * C, 1, false), db = random_vec(OC, 1, false);
    floatX *d_pre = to_dev_x(pre), *d_w = to_dev_x(w), *d_dout = to_dev_x(dout), *d_inp = to_dev_x(inp);
    floatX* d_dpre = (floatX*)dev_malloc(N * C * sizeof(floatX));
    float *d_dw = to_dev_f(dw), *d_db = to_dev_f(db);
    float* d_partials = (float*)dev_malloc(bias_grad_partials(this_build(), N, OC) * sizeof(float));
    gelu_matmul_backward_cpu(dpre.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), pre.data(), N, C, OC, form);
    if (form == GELU_ERF) lt_plans_free();   // (the plans below: this call's)
    gelu_matmul_backward(d_dpre, d_dw, d_db, d_partials, d_dout, d_inp, d_w, d_pre, N, C, OC, form);
    bool epilogue = form == GELU_TANH && lt_plan_found(CUBLASLT_EPILOGUE_DGELU, C);
    std::string c = " C=" + std::to_string(C) + (epilogue ? " (DGELU epilogue)" : form == GELU_ERF ? " (GEMM, then erf GELU')" :
                                                 " (GEMM, then GELU')");
#ifdef EMU_MAX_BLOCK   // the emulated heuristic offers an algorithm for every aux that follows the rules
    if (form == GELU_TANH)
        check(epilogue == (C % 8 == 0), (FLOATX_NAME " gelu_matmul_backward takes cuBLASLt's DGELU exactly when C % 8 == 0" + c).c_str(),
              "it did%s", epilogue ? "" : " not");
#endif
    if (form == GELU_ERF)   // cuBLASLt's DGELU is the tanh form's derivative
        check(!lt_gelu_plans(), (FLOATX_NAME " gelu_matmul_backward of the erf form takes no GELU epilogue" + c).c_str(),
              "%d plans of one", lt_gelu_plans());
    compare(("gelu_matmul_backward dpre" + c).c_str(), from_dev_x(d_dpre, N * C), dpre, epilogue ? X_OUT : X_CHAIN);
    compare(("gelu_matmul_backward dweight (+=)" + c).c_str(), from_dev_f(d_dw, OC * C), dw, FP32_OUT);
    compare(("gelu_matmul_backward dbias (+=)" + c).c_str(), from_dev_f(d_db, OC), db, FP32_OUT);
    for (void* p : {(void*)d_pre, (void*)d_w, (void*)d_dout, (void*)d_inp, (void*)d_dpre, (void*)d_dw, (void*)d_db, (void*)d_partials})
        dev_free(p);
}

// cuBLASLt's plans are made once per shape and alignment (kernels/linear.cuh's lt_plan): the same
// call again makes none, and still takes this call's pointers (a second bias and output of
// the same alignment give their own results, not the first call's); a less aligned input is
// another plan.
static void test_cublaslt_plan_cache(void) {
    const int N = 40, C = 24, OC = 32;
    Vec x = random_vec(N * C, 1, true), w = random_vec(OC * C, 1, true), b1 = random_vec(OC, 1, true), b2 = random_vec(OC, 1, true);
    floatX *d_x = to_dev_x(x), *d_w = to_dev_x(w), *d_b1 = to_dev_x(b1), *d_b2 = to_dev_x(b2);
    floatX *d_out1 = (floatX*)dev_malloc(N * OC * sizeof(floatX)), *d_out2 = (floatX*)dev_malloc(N * OC * sizeof(floatX));
    Vec want1(N * OC), want2(N * OC);
    matmul_forward_reference(want1.data(), x.data(), w.data(), b1.data(), N, C, OC);
    matmul_forward_reference(want2.data(), x.data(), w.data(), b2.data(), N, C, OC);
    matmul_forward(d_out1, d_x, d_w, d_b1, N, C, OC);
    long plans = lt_heuristic_calls;
    matmul_forward(d_out2, d_x, d_w, d_b2, N, C, OC);
    long again = lt_heuristic_calls - plans;
    compare("cuBLASLt plan: first call", from_dev_x(d_out1, N * OC), want1, X_OUT);
    compare("cuBLASLt plan: again, another bias and out", from_dev_x(d_out2, N * OC), want2, X_OUT);
    check(again == 0, FLOATX_NAME " cuBLASLt plan: the same shape and alignments again runs the heuristic 0 times",
          "%ld times", again);
    // one element into a buffer of N C + 8: 2-byte aligned at either end of a guard page, a plan of its own
    floatX* d_x2 = (floatX*)dev_malloc((N * C + 8) * sizeof(floatX)) + 1;
    floats_to_dev_floatX(d_x2, x.data(), x.size());
    plans = lt_heuristic_calls;
    matmul_forward(d_out2, d_x2, d_w, d_b1, N, C, OC);
    compare("cuBLASLt plan: a less aligned input", from_dev_x(d_out2, N * OC), want1, X_OUT);
    check(lt_heuristic_calls - plans == 1, FLOATX_NAME " cuBLASLt plan: a less aligned input makes one new plan",
          "%ld", lt_heuristic_calls - plans);
    for (void* p : {(void*)d_x, (void*)d_w, (void*)d_b1, (void*)d_b2, (void*)d_out1, (void*)d_out2, (void*)(d_x2 - 1)}) dev_free(p);
}

// the cuBLASLt emulation rejects what cuBLASLt rejects (and what we assume it does not take:
// so these run under the emulation only, not in make test-gpu)
static void test_cublaslt_checks(void) {
#ifdef EMU_MAX_BLOCK
    const int M = 16, K = 8, NN = 4;   // D [16, 4] = A [16, 8] @ B [8, 4]
    floatX *a = (floatX*)dev_malloc(M * K * sizeof(floatX)), *bm = (floatX*)dev_malloc(K * NN * sizeof(floatX));
    floatX *d = (floatX*)dev_malloc(M * NN * sizeof(floatX)), *aux = (floatX*)dev_malloc((M + 8) * NN * sizeof(floatX));
    floatX* bias = (floatX*)dev_malloc(2 * M * sizeof(floatX));   // 64 bytes: 64-byte aligned at least
    dev_zero(a, M * K * sizeof(floatX));
    dev_zero(bm, K * NN * sizeof(floatX));
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_FLOATX, M, K, M);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_FLOATX, K, NN, K);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_FLOATX, M, NN, M);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    uint32_t align16 = 16;   // B, C and D are 64 to 128 bytes: as aligned as that under EMU_GUARD=end
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align16, sizeof align16);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align16, sizeof align16);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align16, sizeof align16);
    const float one = 1.0f, zero = 0.0f;
    // epilogue, bias, aux, aux ld -> the status cublasLtMatmul answers
    struct { cublasLtEpilogue_t e; const floatX* bias; floatX* aux; int64_t aux_ld; cublasStatus_t want; const char* what; } cases[] = {
        {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias, aux, M, CUBLAS_STATUS_SUCCESS, "GELU_AUX_BIAS with aux ld = m runs"},
        {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias, aux, M + 8, CUBLAS_STATUS_SUCCESS, "GELU_AUX_BIAS with aux ld = m + 8 runs"},
        {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias, aux, M + 2, CUBLAS_STATUS_INVALID_VALUE, "an aux ld not a multiple of 8 is INVALID_VALUE"},
        {CUBLASLT_EPILOGUE_GELU_AUX, NULL, aux, M - 8, CUBLAS_STATUS_INVALID_VALUE, "an aux ld below m is INVALID_VALUE"},
        {CUBLASLT_EPILOGUE_GELU_AUX, NULL, NULL, M, CUBLAS_STATUS_INVALID_VALUE, "GELU_AUX without an aux pointer is INVALID_VALUE"},
        {CUBLASLT_EPILOGUE_BIAS, NULL, NULL, 0, CUBLAS_STATUS_INVALID_VALUE, "BIAS without a bias pointer is INVALID_VALUE"},
        {CUBLASLT_EPILOGUE_BIAS, bias + 1, NULL, 0, CUBLAS_STATUS_NOT_SUPPORTED, "a bias not 16-byte aligned is NOT_SUPPORTED"},
    };
    for (const auto& c : cases) {
        cublasLtMatmulDesc_t desc;
        cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &c.e, sizeof c.e);
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias, sizeof c.bias);
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &c.aux, sizeof c.aux);
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &c.aux_ld, sizeof c.aux_ld);
        cublasLtMatmulHeuristicResult_t h = {};
        int found = 0;
        cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(cublaslt_handle, desc, la, lb, ld, ld, pref, 1, &h, &found);
        if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmul(cublaslt_handle, desc, &one, a, la, bm, lb, &zero, d, ld, d, ld, &h.algo, NULL, 0, 0);
        check(s == c.want, (std::string(FLOATX_NAME " emu cuBLASLt: ") + c.what).c_str(), "status %d", (int)s);
        cublasLtMatmulDescDestroy(desc);
    }
    // a matrix less aligned than the heuristic was told (by default 256 bytes) is NOT_SUPPORTED;
    // told its alignment, the heuristic gives an algorithm that takes it. A 16 bytes into a
    // buffer of 2 * (M K + 16) bytes: 16-byte aligned, not 32 (under either EMU_GUARD)
    floatX* a16 = (floatX*)dev_malloc((M * K + 16) * sizeof(floatX)) + 8;
    dev_zero(a16, M * K * sizeof(floatX));
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulHeuristicResult_t h = {};
    int found = 0;
    cublasLtMatmulAlgoGetHeuristic(cublaslt_handle, desc, la, lb, ld, ld, pref, 1, &h, &found);
    cublasStatus_t s = cublasLtMatmul(cublaslt_handle, desc, &one, a16, la, bm, lb, &zero, d, ld, d, ld, &h.algo, NULL, 0, 0);
    check(s == CUBLAS_STATUS_NOT_SUPPORTED, FLOATX_NAME " emu cuBLASLt: A 16-byte aligned under the default 256-byte preference is NOT_SUPPORTED", "status %d", (int)s);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align16, sizeof align16);
    cublasLtMatmulAlgoGetHeuristic(cublaslt_handle, desc, la, lb, ld, ld, pref, 1, &h, &found);
    s = cublasLtMatmul(cublaslt_handle, desc, &one, a16, la, bm, lb, &zero, d, ld, d, ld, &h.algo, NULL, 0, 0);
    check(s == CUBLAS_STATUS_SUCCESS && found == 1, FLOATX_NAME " emu cuBLASLt: the same A runs once the preference says 16 bytes", "status %d", (int)s);
    dev_free(a16 - 8);
    cublasLtMatmulDescDestroy(desc);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    dev_free(a), dev_free(bm), dev_free(d), dev_free(aux), dev_free(bias);
#endif
}

// dqkv [N, (NH + 2G) * HS] split into its dq, dk and dv elements (each in qkv's order)
static void split_qkv(Vec parts[3], const Vec& dqkv, int NH, int G, int HS) {
    int per = NH / G, slot_count = per + 2;
    for (size_t i = 0; i < dqkv.size(); i++) {
        int slot = (int)(i / HS % (NH + 2 * G)) % slot_count;   // of its group: per queries, k, v
        parts[slot < per ? 0 : slot - per + 1].push_back(dqkv[i]);
    }
}

// The cuBLAS path with NH query heads in G groups (G = NH: multi-head attention). alibi: none,
// or these heads as global heads first_head.. of a count that is not a power of two (a tensor
// rank's share). d: the attention dropout (NO_DROPOUT: none), the same mask on both sides (dv
// then comes from the probabilities times the mask's factor, rounded again: X_CHAIN).
static void test_attention(int NH, int G, Alibi alibi, Dropout d) {
    const int B = 2, T = 37, HS = 10, N = B * T;  // T > 32: a softmax row spans lanes twice
    std::string with = (G < NH ? " NH=" + std::to_string(NH) + " G=" + std::to_string(G) : std::string()) +
                       (alibi.heads ? " (ALiBi)" : "") + (d.threshold ? " (dropout 0.3)" : "");
    const size_t n_qkv = (size_t)N * (NH + 2 * G) * HS, n_out = (size_t)N * NH * HS, n_att = (size_t)B * NH * T * T;
    Vec qkv = random_vec(n_qkv, 2, true), out(n_out), att(n_att);
    attention_forward_cpu(out.data(), att.data(), qkv.data(), B, T, NH, G, HS, alibi, d);
    floatX *d_qkv = to_dev_x(qkv), *d_out = (floatX*)dev_malloc(n_out * sizeof(floatX)), *d_att = (floatX*)dev_malloc(n_att * sizeof(floatX));
    // scratch one element past an aligned address: the regions must align themselves
    floatX* scratch_base = (floatX*)dev_malloc((attention_scratch_elements(B, T, NH, HS) + 1) * sizeof(floatX));
    floatX* d_scratch = scratch_base + 1;
    attention_forward(d_out, d_att, NULL, d_scratch, d_qkv, B, T, NH, G, HS, alibi, d);  // no lse: the cuBLAS path
    Vec got_att = from_dev_x(d_att, n_att);
    compare(("attention_forward att" + with).c_str(), got_att, att, X_OUT);
    compare(("attention_forward out" + with).c_str(), from_dev_x(d_out, n_out), out, X_CHAIN);
    bool masked_zero = true;
    for (size_t r = 0; r < (size_t)B * NH * T; r++)
        for (int t2 = (int)(r % T) + 1; t2 < T; t2++) masked_zero = masked_zero && got_att[r * T + t2] == 0.0f;
    check(masked_zero, (FLOATX_NAME " attention_forward att is exactly 0 above the diagonal" + with).c_str(), "a masked probability is not 0");
    floatX* d_again = (floatX*)dev_malloc(n_att * sizeof(floatX));
    attention_probabilities(d_again, d_scratch, d_qkv, B, T, NH, G, HS, alibi);
    check(same_bits(from_dev_x(d_again, n_att), got_att),
          (FLOATX_NAME " attention_probabilities gives attention_forward's att: the same bits" + with).c_str(), "they differ");

    // the backward reads att: both sides get the kernel's floatX probabilities. A group's dk
    // and dv sum over its heads in one product: one rounding, as with G = NH
    Vec dout = random_vec(n_out, 1, true), dqkv(n_qkv), cpu_scratch((size_t)B * NH * T);
    attention_backward_cpu(dqkv.data(), cpu_scratch.data(), dout.data(), qkv.data(), got_att.data(), B, T, NH, G, HS, d);
    floatX *d_dout = to_dev_x(dout), *d_dqkv = (floatX*)dev_malloc(n_qkv * sizeof(floatX));
    attention_backward(d_dqkv, d_scratch, d_dout, d_qkv, d_out, d_att, NULL, B, T, NH, G, HS, alibi, d);
    Vec parts_got[3], parts_want[3];
    split_qkv(parts_got, from_dev_x(d_dqkv, n_qkv), NH, G, HS);
    split_qkv(parts_want, dqkv, NH, G, HS);
    compare(("attention_backward dq" + with).c_str(), parts_got[0], parts_want[0], X_CHAIN);
    compare(("attention_backward dk" + with).c_str(), parts_got[1], parts_want[1], X_CHAIN);
    compare(("attention_backward dv" + with).c_str(), parts_got[2], parts_want[2], d.threshold ? X_CHAIN : X_OUT);
    dev_free(d_qkv), dev_free(d_out), dev_free(d_att), dev_free(scratch_base), dev_free(d_again), dev_free(d_dout), dev_free(d_dqkv);
}

// the log-sum-exp of each row's scaled, biased scores, in double: what the fused forward keeps
static Vec reference_lse(const Vec& qkv, int B, int T, int NH, int G, int HS, Alibi alibi) {
    Vec lse((size_t)B * NH * T);
    double scale = 1.0 / sqrt((double)HS);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                std::vector<double> x(t + 1);
                double mx = -INFINITY, sum = 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *q = &qkv[qkv_index(b, t, h, 0, T, NH, G, HS)], *k = &qkv[qkv_index(b, t2, h, 1, T, NH, G, HS)];
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
// also carries D's rounding through the cancellation in dp - D). With G < NH a group's dk and
// dv sum over its heads in the same fp32 registers, still rounded once.
// lse is fp32 on exact inputs: the summation order only (1e-5). Twice the same backward must
// give the same bits: no atomics, whatever order the blocks run in and however many ticket windows
// (flash_ticket_windows gives one, of all B G pairs, at these sizes; the second run takes more).
// d: the attention dropout (NO_DROPOUT: none), the same mask drawn on both sides.
static void test_flash_attention(int B, int T, int NH, int G, int HS, Alibi alibi, Dropout d) {
    const int N = B * T;
    char with[96];
    snprintf(with, sizeof with, " B=%d T=%d NH=%d G=%d HS=%d%s%s", B, T, NH, G, HS, alibi.heads ? " ALiBi" : "",
             d.threshold ? " dropout 0.3" : "");
    const size_t n_qkv = (size_t)N * (NH + 2 * G) * HS, n_out = (size_t)N * NH * HS, rows = (size_t)B * NH * T;
    Vec qkv = random_vec(n_qkv, 2, true), out(n_out), att(rows * T);
    attention_forward_cpu(out.data(), att.data(), qkv.data(), B, T, NH, G, HS, alibi, d);
    floatX *d_qkv = to_dev_x(qkv), *d_out = (floatX*)dev_malloc(n_out * sizeof(floatX));
    // the scratch: the backward's D, dQ's fp32 sums and its counters (also what attention_forward gets)
    float *d_lse = (float*)dev_malloc(rows * sizeof(float)),
          *d_D = (float*)dev_malloc(flash_backward_scratch_floats(B, T, NH, HS) * sizeof(float));
    attention_forward(d_out, NULL, d_lse, (floatX*)d_D, d_qkv, B, T, NH, G, HS, alibi, d);
    compare((std::string("flash attention_forward out") + with).c_str(), from_dev_x(d_out, n_out), out, X_CHAIN);
    compare((std::string("flash attention_forward lse") + with).c_str(), from_dev_f(d_lse, rows),
            reference_lse(qkv, B, T, NH, G, HS, alibi), FP32_OUT);

    Vec dout = random_vec(n_out, 1, true), dqkv(n_qkv), cpu_scratch(rows);
    attention_backward_cpu(dqkv.data(), cpu_scratch.data(), dout.data(), qkv.data(), att.data(), B, T, NH, G, HS, d);
    floatX *d_dout = to_dev_x(dout), *d_dqkv = (floatX*)dev_malloc(n_qkv * sizeof(floatX));
    attention_backward(d_dqkv, (floatX*)d_D, d_dout, d_qkv, d_out, NULL, d_lse, B, T, NH, G, HS, alibi, d);
    Vec got = from_dev_x(d_dqkv, n_qkv), parts_got[3], parts_want[3];
    split_qkv(parts_got, got, NH, G, HS);
    split_qkv(parts_want, dqkv, NH, G, HS);
    compare((std::string("flash attention_backward dq") + with).c_str(), parts_got[0], parts_want[0], X_CHAIN);
    compare((std::string("flash attention_backward dk") + with).c_str(), parts_got[1], parts_want[1], X_CHAIN);
    compare((std::string("flash attention_backward dv") + with).c_str(), parts_got[2], parts_want[2], X_CHAIN);
    // again, in B G - 1 windows (2 where B G is 2: of one pair each), some of one pair more than the
    // others, where the run above had one window of all B G pairs: another order of the tickets (and
    // of the blocks), the same sums
    int windows = B * G > 2 ? B * G - 1 : B * G;
    attention_backward_flash_windowed(d_dqkv, d_D, d_dout, d_qkv, d_out, d_lse, B, T, NH, G, HS, alibi, d, windows);
    Vec again = from_dev_x(d_dqkv, n_qkv);
    check(flash_ticket_windows(B, T, NH, G, HS) == 1 && memcmp(again.data(), got.data(), n_qkv * sizeof(float)) == 0,
          (std::string(FLOATX_NAME " flash attention_backward twice, the second in ") + std::to_string(windows) +
           " ticket window(s): the same bits" + with).c_str(), "the two runs differ");
    dev_free(d_qkv), dev_free(d_out), dev_free(d_lse), dev_free(d_D), dev_free(d_dout), dev_free(d_dqkv);
}

// GELU's two forms, each kernel against its reference (the erf form's: erff on both sides)
static void test_gelu(GeluForm form) {
    std::string what = form == GELU_ERF ? "gelu_erf" : "gelu";
    for (int k = 0; k < 3; k++) {   // see test_residual
        size_t n = packed_sizes[k];
        int offset = k == 2;
        Vec x = random_vec(n, 4, true), dout = random_vec(n, 1, true), out(n), dinp(n);
        (form == GELU_ERF ? gelu_erf_forward_cpu : gelu_forward_cpu)(out.data(), x.data(), n);
        (form == GELU_ERF ? gelu_erf_backward_cpu : gelu_backward_cpu)(dinp.data(), x.data(), dout.data(), n);
        floatX *d_x = offset_copy(x, offset), *d_dout = to_dev_x(dout), *d_out = (floatX*)dev_malloc(n * sizeof(floatX));
        (form == GELU_ERF ? gelu_erf_forward : gelu_forward)(d_out, d_x, n);
        compare((what + (offset ? "_forward (misaligned input)" : "_forward")).c_str(), from_dev_x(d_out, n), out, X_OUT);
        (form == GELU_ERF ? gelu_erf_backward : gelu_backward)(d_dout, d_x, d_dout, n);  // in place, as the model calls it
        compare((what + (offset ? "_backward (in place, misaligned input)" : "_backward (in place)")).c_str(),
                from_dev_x(d_dout, n), dinp, X_OUT);
    }
}

// RMSNorm on layernorm's shapes: the forward against the reference; the backward twice from the
// same inputs (the same bits), from the kernel's rstd
static void test_rmsnorm_shape(int N, int C) {
    std::string shape = " N=" + std::to_string(N) + " C=" + std::to_string(C);
    const float eps = 1e-5f;
    Vec x = random_vec((size_t)N * C, 2, true), w = random_vec(C, 1, true);
    Vec out((size_t)N * C), rstd(N);
    rmsnorm_forward_cpu(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    floatX *d_x = to_dev_x(x), *d_w = to_dev_x(w), *d_out = (floatX*)dev_malloc((size_t)N * C * sizeof(floatX));
    float* d_rstd = (float*)dev_malloc(N * sizeof(float));
    rmsnorm_forward(d_out, d_rstd, d_x, d_w, N, C, eps);
    compare(("rmsnorm_forward out" + shape).c_str(), from_dev_x(d_out, (size_t)N * C), out, X_OUT);
    compare(("rmsnorm_forward rstd" + shape).c_str(), from_dev_f(d_rstd, N), rstd, FP32_OUT);

    Vec dout = random_vec((size_t)N * C, 1, true), dinp = random_vec((size_t)N * C, 1, true), dw = random_vec(C, 1, false);
    floatX* d_dout = to_dev_x(dout);
    float* d_partials = (float*)dev_malloc(rmsnorm_grad_partials(this_build(), N, C) * sizeof(float));
    Vec grstd = from_dev_f(d_rstd, N), got[2][2];
    for (int run = 0; run < 2; run++) {
        floatX* d_dinp = to_dev_x(dinp);
        float* d_dw = to_dev_f(dw);
        rmsnorm_backward(d_dinp, d_dw, d_partials, d_dout, d_x, d_w, d_rstd, N, C);
        got[run][0] = from_dev_x(d_dinp, (size_t)N * C), got[run][1] = from_dev_f(d_dw, C);
        dev_free(d_dinp), dev_free(d_dw);
    }
    rmsnorm_backward_cpu(dinp.data(), dw.data(), dout.data(), x.data(), w.data(), grstd.data(), N, C);
    compare(("rmsnorm_backward dinp (+=)" + shape).c_str(), got[0][0], dinp, X_OUT);
    compare(("rmsnorm_backward dweight (+=)" + shape).c_str(), got[0][1], dw, FP32_OUT);
    check(same_bits(got[0][0], got[1][0]) && same_bits(got[0][1], got[1][1]),
          (FLOATX_NAME " rmsnorm_backward twice: the same bits" + shape).c_str(), "the two runs differ");
    for (void* p : {(void*)d_x, (void*)d_w, (void*)d_out, (void*)d_rstd, (void*)d_dout, (void*)d_partials}) dev_free(p);
}

static void test_rmsnorm(void) {   // layernorm's shapes
    const int shapes[9][2] = {{74, 300}, {1, 1}, {33, 7}, {97, 1100}, {32, 64}, {74, 77}, {74, 264}, {40, 2056}, {1100, 24}};
    for (auto& s : shapes) test_rmsnorm_shape(s[0], s[1]);
}

// RoPE in place on the grouped qkv rows, forward and backward, against the references: without
// GQA, one k/v head, groups between; half the head rotated; a pos0 past a cache, and positions
// in the thousands (the kernel reduces the angle before its sine)
static void test_rope(int B, int T, int NH, int G, int HS, int rotary_dims, int pos0) {
    char shape[128];
    snprintf(shape, sizeof shape, " NH=%d G=%d HS=%d r=%d pos0=%d", NH, G, HS, rotary_dims, pos0);
    size_t n = (size_t)B * T * (NH + 2 * G) * HS;
    Vec x = random_vec(n, 1, true);
    for (int backward = 0; backward < 2; backward++) {
        Vec want = x;
        floatX* d_x = to_dev_x(x);
        if (backward) {
            rope_backward_cpu(want.data(), B, T, NH, G, HS, rotary_dims, 10000.0f, pos0);
            rope_backward(d_x, B, T, NH, G, HS, rotary_dims, 10000.0f, pos0);
        } else {
            rope_forward_cpu(want.data(), B, T, NH, G, HS, rotary_dims, 10000.0f, pos0);
            rope_forward(d_x, B, T, NH, G, HS, rotary_dims, 10000.0f, pos0);
        }
        compare(((backward ? "rope_backward (in place)" : "rope_forward (in place)") + std::string(shape)).c_str(),
                from_dev_x(d_x, n), want, X_OUT);
        dev_free(d_x);
    }
}

// SwiGLU: rows of F = 1000 (whole packs), 1001 (a short last pack, and every other row's
// packs misaligned) and 64 from a buffer one element past an aligned address (all misaligned)
static void test_swiglu(void) {
    const int shapes[3][2] = {{7, 1000}, {5, 1001}, {9, 64}};
    for (int k = 0; k < 3; k++) {
        int N = shapes[k][0], F = shapes[k][1], offset = k == 2;
        size_t n = (size_t)N * F;
        Vec x = random_vec(2 * n, 6, true), dout = random_vec(n, 1, true), out(n), dinp(2 * n);
        swiglu_forward_cpu(out.data(), x.data(), N, F);
        swiglu_backward_cpu(dinp.data(), x.data(), dout.data(), N, F);
        floatX *d_x = offset_copy(x, offset), *d_dout = to_dev_x(dout), *d_out = (floatX*)dev_malloc(n * sizeof(floatX));
        floatX* d_dinp = (floatX*)dev_malloc(2 * n * sizeof(floatX));
        swiglu_forward(d_out, d_x, N, F);
        swiglu_backward(d_dinp, d_x, d_dout, N, F);
        std::string shape = " N=" + std::to_string(N) + " F=" + std::to_string(F) + (offset ? " (misaligned)" : "");
        compare(("swiglu_forward" + shape).c_str(), from_dev_x(d_out, n), out, X_OUT);
        compare(("swiglu_backward d[a|b]" + shape).c_str(), from_dev_x(d_dinp, 2 * n), dinp, X_OUT);
    }
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
    float *d_max = (float*)dev_malloc(N * sizeof(float)), *d_local_max = (float*)dev_malloc(N * sizeof(float));
    float *d_sums = (float*)dev_malloc(2 * N * sizeof(float)), *d_losses = (float*)dev_malloc(N * sizeof(float));
    Vec row_max(N), local_max(N), sums(2 * N), losses(N);
    crossentropy_online_stats_cpu(row_max.data(), local_max.data(), sums.data(), logits.data(), targets.data(), N, V,
                                  valid, vocab_start);
    crossentropy_online_stats(d_max, d_local_max, d_sums, d_logits, d_targets, N, V, valid, vocab_start);
    compare("crossentropy_online_stats row_max", from_dev_f(d_max, N), row_max, FP32_OUT);
    compare("crossentropy_online_stats local_max", from_dev_f(d_local_max, N), local_max, FP32_OUT);
    compare("crossentropy_online_stats sums", from_dev_f(d_sums, 2 * N), sums, FP32_OUT);
    // as if another rank held larger logits: the global max is 1.5 above this rank's
    for (int n = 0; n < N; n++) row_max[n] += 1.5f;
    host_to_dev(d_max, row_max.data(), N * sizeof(float));
    crossentropy_rescale_sums_cpu(sums.data(), local_max.data(), row_max.data(), N);
    crossentropy_rescale_sums(d_sums, d_local_max, d_max, N);
    compare("crossentropy_rescale_sums", from_dev_f(d_sums, 2 * N), sums, FP32_OUT);
    // no backward to follow (dloss 0): the losses, and the logits stay as they were
    crossentropy_forward_cpu(losses.data(), NULL, row_max.data(), sums.data(), targets.data(), 0.0f, N, V, valid, vocab_start);
    crossentropy_forward(d_losses, d_logits, d_max, d_sums, d_targets, 0.0f, N, V, valid, vocab_start);
    compare("crossentropy_forward, dloss 0: losses", from_dev_f(d_losses, N), losses, FP32_OUT);
    check(same_bits(from_dev_x(d_logits, (size_t)N * V), logits), FLOATX_NAME " crossentropy_forward, dloss 0: the logits stay",
          "they changed");
    // a backward to follow: the losses, and dlogits over the logits in the same pass
    crossentropy_forward_cpu(losses.data(), logits.data(), row_max.data(), sums.data(), targets.data(), 0.25f, N, V, valid,
                             vocab_start);
    crossentropy_forward(d_losses, d_logits, d_max, d_sums, d_targets, 0.25f, N, V, valid, vocab_start);
    compare("crossentropy_forward, dloss 0.25: losses", from_dev_f(d_losses, N), losses, FP32_OUT);
    compare("crossentropy_forward, dloss 0.25: dlogits", from_dev_x(d_logits, (size_t)N * V), logits, X_OUT);
    // a rank whose slice is all padding: max -inf, sum 0, and 0 again after the rescale
    crossentropy_online_stats(d_max, d_local_max, d_sums, d_logits, d_targets, N, V, 0, vocab_start);
    Vec empty_max = from_dev_f(d_local_max, N);
    host_to_dev(d_max, row_max.data(), N * sizeof(float));
    crossentropy_rescale_sums(d_sums, d_local_max, d_max, N);
    Vec empty_sums = from_dev_f(d_sums, 2 * N);
    bool empty_ok = true;
    for (int n = 0; n < N; n++) empty_ok = empty_ok && empty_max[n] == -INFINITY && empty_sums[n] == 0.0f && empty_sums[N + n] == 0.0f;
    check(empty_ok, FLOATX_NAME " crossentropy_online_stats + rescale_sums, no valid columns: max -inf, sums 0", "a row differs");
}

// Cross-entropy over the whole vocabulary on one rank (no tensor parallelism): statistics, loss
// and dlogits in one kernel, against crossentropy_forward_fused_cpu (the statistics, then the
// forward). V = 300: rows whose packs are not 16-byte aligned, 10 columns of padding; V = 9000:
// rows longer than one pass of the block (1024 threads x 8); V = 304: whole, aligned packs.
static void test_crossentropy_fused(int N, int V, int valid) {
    char shape[64];
    snprintf(shape, sizeof shape, " N=%d V=%d valid=%d", N, V, valid);
    Vec logits = random_vec((size_t)N * V, 5, true);
    for (int n = 0; n < N; n++)
        for (int v = valid; v < V; v++) logits[(size_t)n * V + v] = 100.0f;  // padding: must be masked
    std::vector<int> targets(N);
    for (auto& t : targets) t = (int)(urand() * valid);
    targets[0] = 0, targets[N - 1] = valid - 1;
    int* d_targets = to_dev_i(targets);
    float *d_max = (float*)dev_malloc(N * sizeof(float)), *d_sums = (float*)dev_malloc(2 * N * sizeof(float));
    float* d_losses = (float*)dev_malloc(N * sizeof(float));
    for (float dloss : {0.0f, 0.125f}) {
        Vec l = logits, row_max(N), sums(2 * N), losses(N);
        crossentropy_forward_fused_cpu(losses.data(), l.data(), row_max.data(), sums.data(), targets.data(), dloss, N, V, valid);
        floatX* d_logits = to_dev_x(logits);
        crossentropy_forward_fused(d_losses, d_logits, d_max, d_sums, d_targets, dloss, N, V, valid);
        std::string with = std::string(dloss != 0.0f ? ", dloss 1/8" : ", dloss 0") + shape;
        compare(("crossentropy_forward_fused losses" + with).c_str(), from_dev_f(d_losses, N), losses, FP32_OUT);
        compare(("crossentropy_forward_fused row_max" + with).c_str(), from_dev_f(d_max, N), row_max, FP32_OUT);
        compare(("crossentropy_forward_fused sums" + with).c_str(), from_dev_f(d_sums, 2 * N), sums, FP32_OUT);
        Vec got = from_dev_x(d_logits, (size_t)N * V);
        if (dloss != 0.0f) {
            compare(("crossentropy_forward_fused dlogits" + with).c_str(), got, l, X_OUT);
            size_t nonzero = 0;
            for (int n = 0; n < N; n++)
                for (int v = valid; v < V; v++) nonzero += got[(size_t)n * V + v] != 0.0f;
            check(nonzero == 0, (FLOATX_NAME " crossentropy_forward_fused: padding columns' dlogits exactly 0" + with).c_str(),
                  "%zu are not", nonzero);
        } else {
            check(same_bits(got, logits), (FLOATX_NAME " crossentropy_forward_fused: the logits stay" + with).c_str(), "they changed");
        }
        dev_free(d_logits);
    }
    for (void* p : {(void*)d_targets, (void*)d_max, (void*)d_sums, (void*)d_losses}) dev_free(p);
}

// the ranges cut into pieces of at most `piece` elements (shard_pieces), on the device
static ShardRange* dev_pieces(const ShardRange* ranges, int count, size_t n, size_t piece, int* pieces_count) {
    std::vector<ShardRange> pieces(count + n / piece + 1);
    *pieces_count = shard_pieces(ranges, count, piece, pieces.data());
    ShardRange* d = (ShardRange*)dev_malloc(*pieces_count * sizeof(ShardRange));
    host_to_dev(d, pieces.data(), *pieces_count * sizeof(ShardRange));
    return d;
}

static void test_adamw(void) {
    const size_t n = 777;
    Vec master = random_vec(n, 1, false), grad = random_vec(n, 1, false), m = random_vec(n, 0.1f, false), v = random_vec(n, 0.1f, false);
    for (auto& x : v) x = fabsf(x);
    float *d_master = to_dev_f(master), *d_grad = to_dev_f(grad), *d_m = to_dev_f(m), *d_v = to_dev_f(v);
    floatX* d_param = (floatX*)dev_malloc(n * sizeof(floatX));
    Vec param(n);
    adamw_update_cpu(master.data(), param.data(), grad.data(), m.data(), v.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 3);
    const ShardRange whole = {0, n, 1, 1};   // the whole shard, decayed
    int count;
    ShardRange* d_whole = dev_pieces(&whole, 1, n, SHARD_PIECE, &count);
    adamw_update_ranges(d_master, d_param, d_grad, d_m, d_v, n, d_whole, count, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 3);
    compare("adamw_update master", from_dev_f(d_master, n), master, FP32_OUT);
    compare("adamw_update m", from_dev_f(d_m, n), m, FP32_OUT);
    compare("adamw_update v", from_dev_f(d_v, n), v, FP32_OUT);
    compare("adamw_update param (floatX)", from_dev_x(d_param, n), param, X_OUT);
    dev_free(d_whole);
}

// The whole shard in one launch against the CPU build's walk over the same ranges: gaps
// (padding, other tensors' parts) untouched, decay and the norm per range. The kernels walk
// the ranges cut into pieces: the model's size (SHARD_PIECE: here one piece a range), and 100
// (a range of many pieces, and the last piece of a range shorter).
static void test_shard_ranges(size_t piece) {
    const size_t n = 2000;
    const ShardRange ranges[4] = {{0, 300, 1, 1}, {300, 301, 0, 1}, {512, 1500, 0, 0}, {1500, 1990, 1, 1}};
    Vec master = random_vec(n, 1, false), grad = random_vec(n, 1, false), m = random_vec(n, 0.1f, false);
    Vec v = random_vec(n, 0.1f, false), param(master);
    for (auto& x : v) x = fabsf(x);
    float *d_master = to_dev_f(master), *d_grad = to_dev_f(grad), *d_m = to_dev_f(m), *d_v = to_dev_f(v);
    floatX* d_param = (floatX*)dev_malloc(n * sizeof(floatX));
    floats_to_dev_floatX(d_param, param.data(), n);
    int count;
    ShardRange* d_pieces = dev_pieces(ranges, 4, n, piece, &count);
    adamw_update_ranges_cpu(master.data(), param.data(), grad.data(), m.data(), v.data(), n, ranges, 4, 1e-2f, 0.9f,
                            0.95f, 1e-8f, 0.1f, 0.5f, 3);
    adamw_update_ranges(d_master, d_param, d_grad, d_m, d_v, n, d_pieces, count, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 3);
    char with[48];
    snprintf(with, sizeof with, " (%d pieces of <= %zu)", count, piece);
    compare((std::string("adamw_update_ranges master, gaps untouched") + with).c_str(), from_dev_f(d_master, n), master, FP32_OUT);
    compare((std::string("adamw_update_ranges m") + with).c_str(), from_dev_f(d_m, n), m, FP32_OUT);
    compare((std::string("adamw_update_ranges v") + with).c_str(), from_dev_f(d_v, n), v, FP32_OUT);
    compare((std::string("adamw_update_ranges param (floatX)") + with).c_str(), from_dev_x(d_param, n), param, X_OUT);
    double want = 0.0, got = 0.0;
    sum_squares_ranges_cpu(&want, grad.data(), n, ranges, 4);
    double* d_acc = (double*)dev_malloc(sizeof(double));
    dev_zero(d_acc, sizeof(double));
    sum_squares_ranges(d_acc, d_grad, n, d_pieces, count);
    dev_to_host(&got, d_acc, sizeof(double));
    double by_hand = 0.0;   // ranges 0, 1 and 3 count in the norm
    for (size_t i = 0; i < n; i++)
        if (i < 301 || (i >= 1500 && i < 1990)) by_hand += (double)grad[i] * grad[i];
    double rel = fabs(got - want) / want, rel_hand = fabs(want - by_hand) / by_hand;
    char label[160];
    snprintf(label, sizeof label, FLOATX_NAME " sum_squares_ranges%s: err %.2e against the CPU walk, %.2e against the "
             "sum written out (tol 1e-12)", with, rel, rel_hand);
    check(rel <= 1e-12 && rel_hand <= 1e-12, label, "got %.17g, want %.17g, by hand %.17g", got, want, by_hand);
    dev_free(d_acc);
    dev_free(d_pieces);
}

// 8-bit AdamW (kernels/quantize.cuh): a CUDA block per quantization block, against the
// reference over the same ranges, three steps from zero moments: a shard of two blocks and a
// short one, ranges across block edges, a padding gap, pieces of the model's size and of 100.
// The scales are block maxima (any order gives the same bits), so the codes agree but where a
// value lands within rounding of a midpoint between two codes: at least 99.9% equal, the
// dequantized moments and the weights within FP32_OUT.
static void test_adamw8bit_ranges(size_t piece) {
    const size_t n = 2 * QUANT_BLOCK + 700, blocks = quant_blocks(n);
    const ShardRange ranges[4] = {{0, 1000, 1, 1}, {1000, 1003, 0, 1}, {1003, 4500, 1, 1}, {4510, n, 0, 1}};
    float maps[2 * QUANT_MAP_SIZE];
    dynamic_quant_maps(maps);
    Vec master = random_vec(n, 1, false), param(master);
    std::vector<uint8_t> m(n, 0), v(n, 0);
    Vec m_scale(blocks, 0.0f), v_scale(blocks, 0.0f);
    Moments8bit host = {m.data(), v.data(), m_scale.data(), v_scale.data(), maps};
    float* d_maps = (float*)dev_malloc(sizeof(maps));
    host_to_dev(d_maps, maps, sizeof(maps));
    Moments8bit dev = {(uint8_t*)dev_malloc(n), (uint8_t*)dev_malloc(n), to_dev_f(m_scale), to_dev_f(v_scale), d_maps};
    dev_zero(dev.m, n);
    dev_zero(dev.v, n);
    float* d_master = to_dev_f(master);
    floatX* d_param = (floatX*)dev_malloc(n * sizeof(floatX));
    floats_to_dev_floatX(d_param, param.data(), n);
    int count;
    ShardRange* d_pieces = dev_pieces(ranges, 4, n, piece, &count);
    for (int step = 1; step <= 3; step++) {
        Vec grad = random_vec(n, 1, false);
        float* d_grad = to_dev_f(grad);
        adamw8bit_update_ranges_cpu(master.data(), param.data(), grad.data(), host, n, ranges, 4, 1e-2f, 0.9f, 0.95f,
                                    1e-8f, 0.1f, 0.5f, step);
        adamw8bit_update_ranges(d_master, d_param, d_grad, dev, n, d_pieces, count, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f,
                                0.5f, step);
        dev_free(d_grad);
    }
    std::vector<uint8_t> got_m(n), got_v(n);
    dev_to_host(got_m.data(), dev.m, n);
    dev_to_host(got_v.data(), dev.v, n);
    Vec got_ms = from_dev_f(dev.m_scale, blocks), got_vs = from_dev_f(dev.v_scale, blocks);
    Vec want_mv(2 * n), got_mv(2 * n);
    size_t equal = 0;
    for (size_t i = 0; i < n; i++) {
        size_t b = i / QUANT_BLOCK;
        equal += (got_m[i] == m[i]) + (got_v[i] == v[i]);
        want_mv[i] = maps[m[i]] * m_scale[b], got_mv[i] = maps[got_m[i]] * got_ms[b];
        want_mv[n + i] = maps[QUANT_MAP_SIZE + v[i]] * v_scale[b], got_mv[n + i] = maps[QUANT_MAP_SIZE + got_v[i]] * got_vs[b];
    }
    char with[160];
    snprintf(with, sizeof with, " (%d pieces of <= %zu, 3 steps; %.3f%% of the codes equal)", count, piece,
             50.0 * equal / n);
    check(equal >= 0.999 * 2 * n, (std::string(FLOATX_NAME " adamw8bit_update_ranges codes") + with).c_str(),
          "%zu of %zu differ", 2 * n - equal, 2 * n);
    compare((std::string("adamw8bit_update_ranges m and v, dequantized") + with).c_str(), got_mv, want_mv, FP32_OUT);
    compare((std::string("adamw8bit_update_ranges master, gaps untouched") + with).c_str(), from_dev_f(d_master, n), master, FP32_OUT);
    compare((std::string("adamw8bit_update_ranges param (floatX)") + with).c_str(), from_dev_x(d_param, n), param, X_OUT);
    for (void* p : {(void*)dev.m, (void*)dev.v, (void*)dev.m_scale, (void*)dev.v_scale, (void*)d_maps, (void*)d_master,
                    (void*)d_param, (void*)d_pieces})
        dev_free(p);
}

// shard_pieces: every piece inside its range, none longer than the piece size, together
// exactly the ranges in order, and no more of them than shard_pieces_max plans room for
static void test_shard_pieces(void) {
    const size_t n = 20000, piece = 4096;
    const ShardRange ranges[4] = {{0, 4096, 1, 1}, {4096, 4097, 0, 1}, {5000, 13193, 0, 0}, {13193, 19999, 1, 1}};
    std::vector<ShardRange> pieces(4 + n / piece);
    BuildTarget gpu = {1, 2, 0, 0};
    bool ok = shard_pieces_max(gpu, 4, n) == pieces.size();
    int count = shard_pieces(ranges, 4, piece, pieces.data()), r = 0;
    size_t next = ranges[0].start;
    for (int k = 0; k < count && ok; k++) {
        const ShardRange& p = pieces[k];
        if (next == ranges[r].end) next = ranges[++r].start;
        ok = p.start == next && p.end > p.start && p.end - p.start <= piece && p.end <= ranges[r].end &&
             p.decay == ranges[r].decay && p.in_norm == ranges[r].in_norm;
        next = p.end;
    }
    ok = ok && r == 3 && next == ranges[3].end && count == 1 + 1 + 3 + 2;
    check(ok, FLOATX_NAME " shard_pieces: 4 ranges of 4096, 1, 8193 and 6806 elements in 7 pieces of <= 4096, in order",
          "%d pieces, the last checked in range %d", count, r);
}

// the micro-batch's mean loss added on the device: against the CPU build's sum in token order
static void test_loss_mean_add(void) {
    const int sizes[3] = {1, 255, 4097};
    for (int N : sizes) {
        Vec losses = random_vec(N, 5, false);
        for (auto& x : losses) x = fabsf(x);
        double want = 0.25, got = 0.25;   // it adds into *acc
        loss_mean_add_cpu(&want, losses.data(), N);
        float* d_losses = to_dev_f(losses);
        double* d_acc = (double*)dev_malloc(sizeof(double));
        host_to_dev(d_acc, &got, sizeof(double));
        loss_mean_add(d_acc, d_losses, N);
        dev_to_host(&got, d_acc, sizeof(double));
        char label[96];
        double rel = fabs(got - want) / want;
        snprintf(label, sizeof label, FLOATX_NAME " loss_mean_add (+=) N=%-5d err %.2e (tol 1e-12)", N, rel);
        check(rel <= 1e-12, label, "got %.17g, want %.17g", got, want);
        dev_free(d_losses);
        dev_free(d_acc);
    }
}

// ZeRO-2/3's accumulation of a layer's summed gradients into the shard (zero.h): exactly the
// reference's sums, at lengths below, not at and past a multiple of the block
static void test_floats_add(void) {
    const int sizes[3] = {1, 256, 1000};
    for (int n : sizes) {
        Vec acc = random_vec(n, 11, false), x = random_vec(n, 12, false), want = acc, got(n);
        floats_add_cpu(want.data(), x.data(), n);
        float* d_acc = to_dev_f(acc);
        float* d_x = to_dev_f(x);
        floats_add(d_acc, d_x, n);
        dev_to_host(got.data(), d_acc, n * sizeof(float));
        char label[96];
        snprintf(label, sizeof label, FLOATX_NAME " floats_add (+=) n=%d: the reference's bits", n);
        check(got == want, label, "differs");
        dev_free(d_acc);
        dev_free(d_x);
    }
}

// ----------------------------------------------------------------------------
// the mixture-of-experts layer (kernels/moe.cuh): each kernel against its reference on the same
// inputs. Shapes: N not a multiple of the 8 rows of a block, E = 8 k = 2 (Mixtral), E = 60 k = 4
// (Qwen2-MoE), the most experts and slots the GPU router takes (256, 8), rows of C = 70 (packs
// not whole, rows not 16-byte aligned) and 64 (whole packs), logits with many ties.

static bool same_ints(const int* d, const std::vector<int>& want) {
    std::vector<int> got(want.size());
    dev_to_host(got.data(), d, want.size() * sizeof(int));
    return got == want;
}

static void test_moe(int N, int E, int k, int C, bool ties) {
    char shape[96];
    snprintf(shape, sizeof shape, " N=%d E=%d k=%d C=%d%s", N, E, k, C, ties ? " ties" : "");
    std::string s = shape;
    size_t rows = (size_t)N * k;
    Vec logits = random_vec((size_t)N * E, 3, true);
    if (ties)
        for (auto& l : logits) l = 0.5f * (float)((int)(urand() * 5) - 2);   // -1, -0.5, 0, 0.5, 1
    floatX* d_logits = to_dev_x(logits);
    float *d_probs = (float*)dev_malloc((size_t)N * E * sizeof(float)), *d_lse = (float*)dev_malloc(N * sizeof(float));
    float* d_w = (float*)dev_malloc(rows * sizeof(float));
    int *d_chosen = (int*)dev_malloc(rows * sizeof(int)), *d_counts = (int*)dev_malloc(E * sizeof(int));
    int *d_order = (int*)dev_malloc(rows * sizeof(int)), *d_position = (int*)dev_malloc(rows * sizeof(int));
    int* d_offsets = (int*)dev_malloc((E + 1) * sizeof(int));
    Vec probs((size_t)N * E), lse(N), w(rows);
    std::vector<int> chosen(rows), counts(E), order(rows), position(rows), offsets(E + 1);
    for (int pre_softmax = 0; pre_softmax < 2; pre_softmax++) {
        std::string p = s + " pre_softmax=" + std::to_string(pre_softmax);
        moe_router_forward_cpu(probs.data(), chosen.data(), w.data(), lse.data(), logits.data(), N, E, k, pre_softmax);
        moe_router_forward(d_probs, d_chosen, d_w, d_lse, d_logits, N, E, k, pre_softmax);
        check(same_ints(d_chosen, chosen), (FLOATX_NAME " moe_router_forward top-k: the reference's" + p).c_str(),
              "the experts differ");
        compare(("moe_router_forward probs" + p).c_str(), from_dev_f(d_probs, (size_t)N * E), probs, FP32_OUT);
        compare(("moe_router_forward lse" + p).c_str(), from_dev_f(d_lse, N), lse, FP32_OUT);
        compare(("moe_router_forward weights" + p).c_str(), from_dev_f(d_w, rows), w, FP32_OUT);
    }
    // the rest from the reference's router outputs (pre_softmax 1), given to both sides
    host_to_dev(d_probs, probs.data(), probs.size() * sizeof(float));
    host_to_dev(d_lse, lse.data(), N * sizeof(float));
    host_to_dev(d_w, w.data(), rows * sizeof(float));
    moe_expert_counts_cpu(counts.data(), chosen.data(), N, k, E);
    moe_expert_counts(d_counts, d_chosen, N, k, E);
    check(same_ints(d_counts, counts), (FLOATX_NAME " moe_expert_counts" + s).c_str(), "the counts differ");
    moe_sort_tokens_cpu(order.data(), position.data(), offsets.data(), chosen.data(), N, k, E);
    moe_sort_tokens(d_order, d_position, d_offsets, d_chosen, N, k, E);
    check(same_ints(d_order, order) && same_ints(d_position, position) && same_ints(d_offsets, offsets),
          (FLOATX_NAME " moe_sort_tokens order, position, offsets: the reference's" + s).c_str(), "they differ");

    float aux_coeff = 0.01f, z_coeff = 0.001f;
    for (int pre_softmax = 0; pre_softmax < 2; pre_softmax++) {
        Vec dweight = random_vec(rows, 1, false), dlogits((size_t)N * E);
        float* d_dweight = to_dev_f(dweight);
        floatX* d_dlogits = (floatX*)dev_malloc((size_t)N * E * sizeof(floatX));
        // dlogits's terms are of a few 0.1 and of 1e-4 (the losses'): coefficients that make
        // the losses' terms count, and the global token count 2 N
        moe_router_backward_cpu(dlogits.data(), dweight.data(), probs.data(), lse.data(), chosen.data(), w.data(),
                                counts.data(), N, E, k, pre_softmax, 10.0f, 1.0f, 2 * N);
        moe_router_backward(d_dlogits, d_dweight, d_probs, d_lse, d_chosen, d_w, d_counts, N, E, k, pre_softmax, 10.0f,
                            1.0f, 2 * N);
        compare(("moe_router_backward pre_softmax=" + std::to_string(pre_softmax) + s).c_str(),
                from_dev_x(d_dlogits, (size_t)N * E), dlogits, X_OUT);
        dev_free(d_dweight), dev_free(d_dlogits);
    }
    double want[2] = {0.25, 0.5}, got[2] = {0.25, 0.5};   // added into
    double* d_losses = (double*)dev_malloc(2 * sizeof(double));
    host_to_dev(d_losses, got, sizeof got);
    moe_aux_loss_cpu(&want[0], &want[1], probs.data(), lse.data(), counts.data(), N, E, k, aux_coeff, z_coeff, N);
    moe_aux_loss(d_losses, d_losses + 1, d_probs, d_lse, d_counts, N, E, k, aux_coeff, z_coeff, N);
    dev_to_host(got, d_losses, sizeof got);
    for (int i = 0; i < 2; i++) {
        double rel = fabs(got[i] - want[i]) / fabs(want[i]);
        char label[160];
        snprintf(label, sizeof label, FLOATX_NAME " moe_aux_loss %s (+=)%s err %.2e (tol 1e-12)", i ? "z" : "aux", shape, rel);
        check(rel <= 1e-12, label, "got %.17g, want %.17g", got[i], want[i]);
    }

    // the rows: gathered (a copy: the same bits), combined, and back
    Vec x = random_vec((size_t)N * C, 1, true), ys = random_vec(rows * C, 1, true), dout = random_vec((size_t)N * C, 1, true);
    Vec xs(rows * C), out((size_t)N * C), dys(rows * C), dweight(rows);
    floatX *d_x = to_dev_x(x), *d_ys = to_dev_x(ys), *d_dout = to_dev_x(dout), *d_xs = (floatX*)dev_malloc(rows * C * sizeof(floatX));
    floatX *d_out = (floatX*)dev_malloc((size_t)N * C * sizeof(floatX)), *d_dys = (floatX*)dev_malloc(rows * C * sizeof(floatX));
    float* d_dweight = (float*)dev_malloc(rows * sizeof(float));
    moe_gather_rows_cpu(xs.data(), x.data(), order.data(), (int)rows, k, C);
    moe_gather_rows(d_xs, d_x, d_order, (int)rows, k, C);
    check(same_bits(from_dev_x(d_xs, rows * C), xs), (FLOATX_NAME " moe_gather_rows: the same bits" + s).c_str(), "they differ");
    moe_combine_cpu(out.data(), ys.data(), w.data(), position.data(), N, k, C);
    moe_combine(d_out, d_ys, d_w, d_position, N, k, C);
    compare(("moe_combine" + s).c_str(), from_dev_x(d_out, (size_t)N * C), out, X_OUT);
    moe_combine_backward_cpu(dys.data(), dweight.data(), dout.data(), ys.data(), w.data(), position.data(), N, k, C);
    moe_combine_backward(d_dys, d_dweight, d_dout, d_ys, d_w, d_position, N, k, C);
    compare(("moe_combine_backward dys" + s).c_str(), from_dev_x(d_dys, rows * C), dys, X_OUT);
    compare(("moe_combine_backward dweight" + s).c_str(), from_dev_f(d_dweight, rows), dweight, FP32_OUT);
    for (int accumulate = 0; accumulate < 2; accumulate++) {
        Vec dx = random_vec((size_t)N * C, 1, true);
        floatX* d_dx = to_dev_x(dx);
        moe_gather_rows_backward_cpu(dx.data(), dys.data(), position.data(), N, k, C, accumulate);
        moe_gather_rows_backward(d_dx, d_dys, d_position, N, k, C, accumulate);   // dys: the same floatX values
        compare((std::string(accumulate ? "moe_gather_rows_backward (+=)" : "moe_gather_rows_backward") + s).c_str(),
                from_dev_x(d_dx, (size_t)N * C), dx, X_OUT);
        dev_free(d_dx);
    }
    if (k == 2) {   // the shared expert's gate, once a row length
        Vec gate = random_vec(N, 4, true), y = random_vec((size_t)N * C, 1, true), o = random_vec((size_t)N * C, 1, true);
        Vec dy((size_t)N * C), dgate(N);
        floatX *d_gate = to_dev_x(gate), *d_y = to_dev_x(y), *d_o = to_dev_x(o), *d_dgate = (floatX*)dev_malloc(N * sizeof(floatX));
        floatX* d_dy = (floatX*)dev_malloc((size_t)N * C * sizeof(floatX));
        moe_shared_gate_forward_cpu(o.data(), y.data(), gate.data(), N, C);
        moe_shared_gate_forward(d_o, d_y, d_gate, N, C);
        compare(("moe_shared_gate_forward (+=)" + s).c_str(), from_dev_x(d_o, (size_t)N * C), o, X_OUT);
        moe_shared_gate_backward_cpu(dy.data(), dgate.data(), dout.data(), y.data(), gate.data(), N, C);
        moe_shared_gate_backward(d_dy, d_dgate, d_dout, d_y, d_gate, N, C);
        compare(("moe_shared_gate_backward dshared_y" + s).c_str(), from_dev_x(d_dy, (size_t)N * C), dy, X_OUT);
        compare(("moe_shared_gate_backward dgate_logit" + s).c_str(), from_dev_x(d_dgate, N), dgate, X_OUT);
        for (void* q : {(void*)d_gate, (void*)d_y, (void*)d_o, (void*)d_dgate, (void*)d_dy}) dev_free(q);
    }
    for (void* q : {(void*)d_logits, (void*)d_probs, (void*)d_lse, (void*)d_w, (void*)d_chosen, (void*)d_counts,
                    (void*)d_order, (void*)d_position, (void*)d_offsets, (void*)d_losses, (void*)d_x, (void*)d_ys,
                    (void*)d_dout, (void*)d_xs, (void*)d_out, (void*)d_dys, (void*)d_dweight})
        dev_free(q);
}

// The expert capacity (moe_apply_capacity), each policy: the choices kept, the same as the
// reference's (some dropped: the capacity is half an expert's mean), then what the dropped change
// downstream, each kernel on the reference's routing: the sort without them (position -1, the rows
// ending at offsets[E]), and the gather, the combine and their backwards skipping them.
static void test_moe_capacity(int N, int E, int k, int C, bool ties) {
    char shape[96];
    snprintf(shape, sizeof shape, " N=%d E=%d k=%d C=%d%s", N, E, k, C, ties ? " ties" : "");
    size_t choices = (size_t)N * k;
    Vec logits = random_vec((size_t)N * E, 3, true), probs((size_t)N * E), lse(N), w(choices);
    if (ties)   // equal weights at an expert's capacity: the lower token first
        for (auto& l : logits) l = 0.5f * (float)((int)(urand() * 5) - 2);
    std::vector<int> chosen(choices), routed(choices), order(choices), position(choices), offsets(E + 1);
    moe_router_forward_cpu(probs.data(), chosen.data(), w.data(), lse.data(), logits.data(), N, E, k, 0);
    int *d_chosen = to_dev_i(chosen), *d_routed = (int*)dev_malloc(choices * sizeof(int));
    int *d_order = (int*)dev_malloc(choices * sizeof(int)), *d_position = (int*)dev_malloc(choices * sizeof(int));
    int* d_offsets = (int*)dev_malloc((E + 1) * sizeof(int));
    float* d_w = to_dev_f(w);
    int capacity = std::max(1, N * k / E / 2);
    for (int policy = MOE_DROP_PROBS; policy <= MOE_DROP_POSITION; policy++) {
        std::string s = std::string(shape) + " capacity " + std::to_string(capacity) +
                        (policy == MOE_DROP_PROBS ? " probs" : " position");
        moe_apply_capacity_cpu(routed.data(), chosen.data(), w.data(), N, k, capacity, policy);
        moe_apply_capacity(d_routed, d_chosen, d_w, N, k, capacity, policy);
        int dropped = (int)std::count(routed.begin(), routed.end(), -1);
        check(same_ints(d_routed, routed) && dropped > 0,
              (FLOATX_NAME " moe_apply_capacity: the reference's choices kept, " + std::to_string(dropped) + " dropped" + s).c_str(),
              "they differ, or none dropped");
        moe_sort_tokens_cpu(order.data(), position.data(), offsets.data(), routed.data(), N, k, E);
        moe_sort_tokens(d_order, d_position, d_offsets, d_routed, N, k, E);
        int rows = offsets[E];
        check(rows == (int)choices - dropped && same_ints(d_offsets, offsets) && same_ints(d_position, position) &&
              same_ints(d_order, std::vector<int>(order.begin(), order.begin() + rows)),
              (FLOATX_NAME " moe_sort_tokens without the dropped: order, position -1, offsets" + s).c_str(), "they differ");
        Vec x = random_vec((size_t)N * C, 1, true), ys = random_vec((size_t)rows * C, 1, true);
        Vec dout = random_vec((size_t)N * C, 1, true), xs((size_t)rows * C), out((size_t)N * C);
        Vec dys((size_t)rows * C), dweight(choices), dx((size_t)N * C);
        floatX *d_x = to_dev_x(x), *d_ys = to_dev_x(ys), *d_dout = to_dev_x(dout);
        floatX *d_xs = (floatX*)dev_malloc((size_t)rows * C * sizeof(floatX)), *d_out = (floatX*)dev_malloc(N * C * sizeof(floatX));
        floatX *d_dys = (floatX*)dev_malloc((size_t)rows * C * sizeof(floatX)), *d_dx = (floatX*)dev_malloc(N * C * sizeof(floatX));
        float* d_dweight = (float*)dev_malloc(choices * sizeof(float));
        moe_gather_rows_cpu(xs.data(), x.data(), order.data(), rows, k, C);
        moe_gather_rows(d_xs, d_x, d_order, rows, k, C);
        check(same_bits(from_dev_x(d_xs, (size_t)rows * C), xs), (FLOATX_NAME " moe_gather_rows, the kept rows" + s).c_str(),
              "they differ");
        moe_combine_cpu(out.data(), ys.data(), w.data(), position.data(), N, k, C);
        moe_combine(d_out, d_ys, d_w, d_position, N, k, C);
        compare(("moe_combine, dropped skipped" + s).c_str(), from_dev_x(d_out, (size_t)N * C), out, X_OUT);
        moe_combine_backward_cpu(dys.data(), dweight.data(), dout.data(), ys.data(), w.data(), position.data(), N, k, C);
        moe_combine_backward(d_dys, d_dweight, d_dout, d_ys, d_w, d_position, N, k, C);
        compare(("moe_combine_backward dys, kept rows" + s).c_str(), from_dev_x(d_dys, (size_t)rows * C), dys, X_OUT);
        compare(("moe_combine_backward dweight, 0 dropped" + s).c_str(), from_dev_f(d_dweight, choices), dweight, FP32_OUT);
        moe_gather_rows_backward_cpu(dx.data(), dys.data(), position.data(), N, k, C, 0);
        moe_gather_rows_backward(d_dx, d_dys, d_position, N, k, C, 0);
        compare(("moe_gather_rows_backward, dropped skipped" + s).c_str(), from_dev_x(d_dx, (size_t)N * C), dx, X_OUT);
        for (void* q : {(void*)d_x, (void*)d_ys, (void*)d_dout, (void*)d_xs, (void*)d_out, (void*)d_dys, (void*)d_dx,
                        (void*)d_dweight})
            dev_free(q);
    }
    for (void* q : {(void*)d_chosen, (void*)d_routed, (void*)d_order, (void*)d_position, (void*)d_offsets, (void*)d_w})
        dev_free(q);
}

// the GPU router's limits: more experts or slots than a warp holds are refused, naming the limit
static jmp_buf moe_refused;
static char moe_refusal[160];
static void moe_refuse(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(moe_refusal, sizeof moe_refusal, fmt, ap);
    va_end(ap);
    longjmp(moe_refused, 1);
}

static void test_moe_limits(void) {
    const int shapes[2][2] = {{MOE_MAX_EXPERTS + 1, 2}, {64, MOE_MAX_TOPK + 1}};
    for (auto& shape : shapes) {
        int E = shape[0], k = shape[1];
        void (*was)(const char*, ...) = fail;
        fail = moe_refuse;
        moe_refusal[0] = 0;
        if (setjmp(moe_refused) == 0) moe_router_forward(NULL, NULL, NULL, NULL, NULL, 1, E, k, 0);
        fail = was;
        std::string limit = std::to_string(E > MOE_MAX_EXPERTS ? MOE_MAX_EXPERTS : MOE_MAX_TOPK);
        std::string name = std::string(FLOATX_NAME " moe_router_forward refuses ") + (E > MOE_MAX_EXPERTS ? "E=" : "k=")
                           + std::to_string(E > MOE_MAX_EXPERTS ? E : k) + ", naming " + limit;
        check(strstr(moe_refusal, ("above " + limit).c_str()) != NULL, name.c_str(), "said: '%s'", moe_refusal);
    }
}

static void test_sum_squares(void) {
    // 1 element, less than one block, and more pieces than SUM_SQUARES_MAX_BLOCKS blocks (each
    // block takes several: pieces of 256 here, SHARD_PIECE for the others)
    const size_t sizes[3] = {1, 1000, (size_t)SUM_SQUARES_MAX_BLOCKS * SUM_SQUARES_BLOCK + 777};
    for (size_t n : sizes) {
        size_t piece = n > 1000 ? 256 : SHARD_PIECE;
        Vec x = random_vec(n, 1, false);
        double want = 1.5, got = 1.5;  // it adds into *acc
        sum_squares_cpu(&want, x.data(), n);
        float* d_x = to_dev_f(x);
        double* d_acc = (double*)dev_malloc(sizeof(double));
        host_to_dev(d_acc, &got, sizeof(double));
        const ShardRange whole = {0, n, 0, 1};   // every element counted
        int count;
        ShardRange* d_whole = dev_pieces(&whole, 1, n, piece, &count);
        sum_squares_ranges(d_acc, d_x, n, d_whole, count);
        dev_free(d_whole);
        dev_to_host(&got, d_acc, sizeof(double));
        char label[96];
        double rel = fabs(got - want) / want;
        snprintf(label, sizeof label, FLOATX_NAME " sum_squares (+=) n=%-7zu pieces of <= %-4zu err %.2e (tol 1e-12)", n,
                 piece, rel);
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

// ---- the PTX subset (tests/emu/ptx.h, kernels/flash_attention.cuh's wrappers) against the PTX
// ISA's layouts, written here from the ISA's element formulas (not from the emulation's code),
// on random tiles

// mma.m16n8k16: every lane builds its registers from A [16][16] and B [16][8] (row-major, in
// global memory) by the ISA's formulas for element i of its fragment, multiplies, and writes
// its part of D by the accumulator's formula
__global__ void mma_layout_kernel(float* d_out, const floatX* A, const floatX* B, const float* C) {
    int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    floatX a[8], b[4];
    for (int i = 0; i < 8; i++) {   // a_i: row g (a0, a1, a4, a5) or g + 8; column 2t + (i & 1), + 8 for i >= 4
        int row = g + ((i / 2) % 2 ? 8 : 0), col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
        a[i] = A[row * 16 + col];
    }
    for (int i = 0; i < 4; i++) {   // b_i: row 2t + (i & 1), + 8 for i >= 2; column g
        int row = 2 * t + (i & 1) + (i >= 2 ? 8 : 0);
        b[i] = B[row * 8 + g];
    }
    uint32_t ra[4], rb[2];
    memcpy(ra, a, sizeof ra);   // two elements a register, the lower index in the low half
    memcpy(rb, b, sizeof rb);
    float d[4];
    for (int i = 0; i < 4; i++) d[i] = C[(g + (i >= 2 ? 8 : 0)) * 8 + 2 * t + (i & 1)];   // c_i: row g (+ 8), column 2t + (i & 1)
    mma_16816(d, ra, rb[0], rb[1]);
    for (int i = 0; i < 4; i++) d_out[(g + (i >= 2 ? 8 : 0)) * 8 + 2 * t + (i & 1)] = d[i];
}

// cp.async of a [16][24] tile (rows padded to 24 elements) into shared memory, then
// ldmatrix.x4 (trans or not) of the four 8 x 8 matrices at rows 8 (m % 2), columns 8 (m / 2):
// out[lane][j][e] = register j's element e
__global__ void ldmatrix_layout_kernel(floatX* out, const floatX* tile, int trans) {
    __shared__ __align__(16) floatX s[16 * 24];
    int lane = threadIdx.x;
    for (int i = lane; i < 16 * 3; i += 32) cp_async_16(s + 8 * i, tile + 8 * i, true);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    int m = lane / 8, r = lane % 8;
    uint32_t reg[4];
    ldmatrix_x4(reg, s + (8 * (m % 2) + r) * 24 + 8 * (m / 2), trans);
    memcpy(out + lane * 8, reg, sizeof reg);
}

static void test_ptx_layouts(void) {
    Vec A = random_vec(16 * 16, 2, true), B = random_vec(16 * 8, 2, true), C = random_vec(16 * 8, 1, false), want(16 * 8);
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++) {
            double sum = C[i * 8 + j];
            for (int k = 0; k < 16; k++) sum += (double)A[i * 16 + k] * B[k * 8 + j];
            want[i * 8 + j] = (float)sum;
        }
    floatX *dA = to_dev_x(A), *dB = to_dev_x(B);
    float *dC = to_dev_f(C), *dD = (float*)dev_malloc(16 * 8 * sizeof(float));
    LAUNCH(mma_layout_kernel, 1, 32, 0, dD, dA, dB, dC);
    compare(FLOATX_NAME " mma.m16n8k16: D = A B + C, fragments by the PTX ISA's layout, against a double product", from_dev_f(dD, 16 * 8),
            want, FP32_OUT);
    Vec tile = random_vec(16 * 24, 2, true);
    floatX *dtile = to_dev_x(tile), *dout = (floatX*)dev_malloc(32 * 8 * sizeof(floatX));
    for (int trans = 0; trans < 2; trans++) {
        LAUNCH(ldmatrix_layout_kernel, 1, 32, 0, dout, dtile, trans);
        Vec got = from_dev_x(dout, 32 * 8);
        int wrong = 0;
        for (int lane = 0; lane < 32; lane++)
            for (int j = 0; j < 4; j++)
                for (int e = 0; e < 2; e++) {
                    // matrix j's (row, column): without .trans row lane / 4, column 2 (lane % 4) + e;
                    // with .trans the transpose's, row 2 (lane % 4) + e of column lane / 4
                    int row = trans ? 2 * (lane % 4) + e : lane / 4, col = trans ? lane / 4 : 2 * (lane % 4) + e;
                    wrong += got[lane * 8 + 2 * j + e] != tile[(8 * (j % 2) + row) * 24 + 8 * (j / 2) + col];
                }
        check(wrong == 0, trans ? FLOATX_NAME " ldmatrix.x4.trans after cp.async: every lane's registers as the PTX ISA lays them out"
                                : FLOATX_NAME " ldmatrix.x4 after cp.async: every lane's registers as the PTX ISA lays them out",
              "%d of 256 elements differ", wrong);
    }
    dev_free(dA), dev_free(dB), dev_free(dC), dev_free(dD), dev_free(dtile), dev_free(dout);
}

// generation's attention: one sequence in pieces of `pieces` rows through kv_cache_append and
// attention_decode, against the C references on the same floatX values. The cache is a copy:
// the same bits. The output is fp32 math rounded once (X_OUT). T = 21 keys: more than the
// block's 8 warps, so warps take several keys and some none at the first rows; HS = 64 (2
// dimensions a lane), 7 and 80 (lanes without a dimension, a lane's third one partly there).
// G < NH: query heads read their group's cached key and value.
static void test_attention_decode(int NH, int G, int HS, Alibi alibi) {
    const int T = 21, pieces[3] = {1, 4, 16}, row = (NH + 2 * G) * HS;
    const size_t n_cache = (size_t)T * 2 * G * HS, n_out = (size_t)T * NH * HS;
    Vec qkv = random_vec((size_t)T * row, 1.5f, true), cache(n_cache, 0.0f), out(n_out, 0.0f);
    floatX *d_qkv = to_dev_x(qkv), *d_cache = to_dev_x(cache), *d_out = to_dev_x(out);
    for (int k = 0, pos0 = 0; k < 3; pos0 += pieces[k++]) {
        kv_cache_append_cpu(cache.data(), qkv.data() + (size_t)pos0 * row, pieces[k], pos0, NH, G, HS);
        attention_decode_cpu(out.data() + (size_t)pos0 * NH * HS, cache.data(), qkv.data() + (size_t)pos0 * row, pieces[k],
                             pos0, NH, G, HS, alibi);
        kv_cache_append(d_cache, d_qkv + (size_t)pos0 * row, pieces[k], pos0, NH, G, HS);
        attention_decode(d_out + (size_t)pos0 * NH * HS, d_cache, d_qkv + (size_t)pos0 * row, pieces[k], pos0, NH, G, HS, alibi);
    }
    std::string with = (G < NH ? " NH=" + std::to_string(NH) + " G=" + std::to_string(G) : std::string()) +
                       " HS=" + std::to_string(HS) + (alibi.heads ? " (ALiBi)" : "");
    check(same_bits(from_dev_x(d_cache, n_cache), cache), (FLOATX_NAME " kv_cache_append: the same bits" + with).c_str(),
          "the caches differ");
    compare(("attention_decode out" + with).c_str(), from_dev_x(d_out, n_out), out, X_OUT);
}

// The split decode (flash-decoding's split-K): n rows at positions [pos0, pos0 + n) over a cache
// of random keys and values, against attention_decode_cpu, with the splits the rule gives
// (splits 0) or forced; and twice: the same bits. The cases: a cache of one key (one split), 64
// keys (one split, the rule's boundary) and 65 (two), a long cache (700 keys: 11 splits of 64),
// prompt chunks of n > 1 rows whose first rows' last splits are empty, a split a key.
static void test_attention_decode_split(int NH, int G, int HS, Alibi alibi, int pos0, int n, int splits) {
    const int row = (NH + 2 * G) * HS, len = pos0 + n;
    const size_t n_cache = (size_t)len * 2 * G * HS, n_out = (size_t)n * NH * HS;
    Vec qkv = random_vec((size_t)n * row, 1.5f, true), cache = random_vec(n_cache, 1.5f, true), want(n_out, 0.0f);
    floatX *d_qkv = to_dev_x(qkv), *d_cache = to_dev_x(cache), *d_out = to_dev_x(want);
    kv_cache_append_cpu(cache.data(), qkv.data(), n, pos0, NH, G, HS);
    attention_decode_cpu(want.data(), cache.data(), qkv.data(), n, pos0, NH, G, HS, alibi);
    kv_cache_append(d_cache, d_qkv, n, pos0, NH, G, HS);
    Vec got[2];
    for (int k = 0; k < 2; k++) {
        if (splits) attention_decode_split(d_out, d_cache, d_qkv, n, pos0, NH, G, HS, alibi, splits);
        else attention_decode(d_out, d_cache, d_qkv, n, pos0, NH, G, HS, alibi);
        got[k] = from_dev_x(d_out, n_out);
    }
    int used = splits ? splits : decode_splits(len, n * NH, decode_sms);
    std::string with = " NH=" + std::to_string(NH) + " G=" + std::to_string(G) + " HS=" + std::to_string(HS) +
                       (alibi.heads ? " (ALiBi)" : "") + " keys " + std::to_string(len) + ", " + std::to_string(n) +
                       " row(s), " + std::to_string(used) + " split(s)" + (splits ? " (forced)" : "");
    compare(("attention_decode split" + with).c_str(), got[0], want, X_OUT);
    check(same_bits(got[0], got[1]), (FLOATX_NAME " attention_decode split twice: the same bits" + with).c_str(),
          "the two runs differ");
    dev_free(d_qkv), dev_free(d_cache), dev_free(d_out);
}

// the rule: the splits for a cache length and the (row, head) pairs, on the emulated H100's 132 SMs
static void test_decode_split_rule(void) {
    decode_partials_init();
    struct { int keys, pairs, want; } cases[] = {
        {1, 12, 1},      {64, 12, 1},      {65, 12, 2},  {1024, 12, 16}, {4096, 12, 22},   // GPT-2: 12 heads, 2 x 132 / 12
        {100000, 1, 64}, {700, 3, 11},     {140, 80, 3}, {134, 128, 3},  {5000, 264, 1},   // at most 64; n x NH >= 2 x SMs: 1
    };
    int wrong = 0;
    for (auto& c : cases) wrong += decode_splits(c.keys, c.pairs, decode_sms) != c.want;
    check(decode_sms == 132 && wrong == 0, FLOATX_NAME " attention_decode's split rule: CEIL_DIV(2 x SMs, pairs), >= 64 keys a split, <= 64",
          "%d of %zu cases differ (SMs %d)", wrong, sizeof cases / sizeof cases[0], decode_sms);
}

static void test_attention_decode_splits(void) {
    Alibi none = {0, 0}, heads_2_to_4_of_5 = {2, 5}, heads_1_to_6_of_7 = {1, 7};
    test_decode_split_rule();
    test_attention_decode_split(3, 3, 64, none, 0, 1, 0);                  // one key
    test_attention_decode_split(3, 3, 64, heads_2_to_4_of_5, 63, 1, 0);    // 64 keys: one split
    test_attention_decode_split(3, 3, 64, heads_2_to_4_of_5, 64, 1, 0);    // 65: two
    test_attention_decode_split(6, 2, 80, heads_1_to_6_of_7, 699, 1, 0);   // long, grouped-query
    test_attention_decode_split(4, 1, 7, none, 699, 1, 0);                 // multi-query, a small head
    test_attention_decode_split(2, 2, 64, heads_2_to_4_of_5, 100, 40, 0);  // a prompt chunk: 3 splits
    test_attention_decode_split(2, 1, 64, none, 70, 64, 0);                // rows whose last split is empty
    test_attention_decode_split(2, 2, 64, heads_2_to_4_of_5, 20, 5, 25);   // a split a key
}

// CUDA graphs (kernels/common.cuh's compute_graph_begin and compute_graph_end, on the emulation's
// capture): one layer's decode step of one row (the cache's append, the split decode, and the
// projection after it through cuBLASLt) at positions 0 .. 199, captured a position and launched as
// a graph, against the same step as plain launches on buffers of their own: the same bits at every
// position. The first capture is instantiated, and so is the one where the split count first
// passes 1 (65 keys: the merge is a kernel more); the other 198 update the graph in place (the
// position, the split count from 2 to 4). Inside a capture a copy from the host is refused.
static void test_decode_graph(void) {
    const int NH = 3, G = 3, HS = 64, C = NH * HS, T = 200, row = (NH + 2 * G) * HS;
    Alibi alibi = {2, 5};
    Vec qkv = random_vec((size_t)T * row, 1.5f, true), w = random_vec((size_t)C * C, 0.1f, true), zero((size_t)T * 2 * G * HS, 0.0f);
    floatX *d_qkv = to_dev_x(qkv), *d_w = to_dev_x(w), *cache[2], *att[2], *proj[2];
    for (int k = 0; k < 2; k++)
        cache[k] = to_dev_x(zero), att[k] = to_dev_x(Vec(C, 0.0f)), proj[k] = to_dev_x(Vec(C, 0.0f));
    ComputeGraph graph;
    memset(&graph, 0, sizeof graph);
    int wrong = 0, first_wrong = -1;
    for (int pos = 0; pos < T; pos++) {
        for (int k = 0; k < 2; k++) {   // k = 0 plain, 1 as a graph
            if (k) compute_graph_begin(&graph);
            kv_cache_append(cache[k], d_qkv + (size_t)pos * row, 1, pos, NH, G, HS);
            attention_decode(att[k], cache[k], d_qkv + (size_t)pos * row, 1, pos, NH, G, HS, alibi);
            matmul_forward(proj[k], att[k], d_w, NULL, 1, C, C);
            if (k) compute_graph_end(&graph);
        }
        bool same = same_bits(from_dev_x(proj[0], C), from_dev_x(proj[1], C)) && same_bits(from_dev_x(att[0], C), from_dev_x(att[1], C));
        if (!same && first_wrong < 0) first_wrong = pos;
        wrong += !same;
    }
    wrong += !same_bits(from_dev_x(cache[0], zero.size()), from_dev_x(cache[1], zero.size()));
    check(wrong == 0 && graph.launches == T && graph.instantiated == 2,
          FLOATX_NAME " a decode step as a CUDA graph, captured and updated a position (200): the same bits as plain launches",
          "%d positions differ (the first %d); %ld graphs launched, %ld instantiated (want 200, 2)", wrong, first_wrong,
          graph.launches, graph.instantiated);
    compute_graph_begin(&graph);
    int ids[1] = {7};
    cudaError_t refused = cudaMemcpy(d_qkv, ids, sizeof ids, cudaMemcpyHostToDevice);
    compute_graph_end(&graph);
    check(refused == cudaErrorStreamCaptureUnsupported, FLOATX_NAME " a copy from the host inside a capture is refused, as CUDA refuses it",
          "cudaMemcpy returned %d", (int)refused);
    compute_graph_free(&graph);
    for (int k = 0; k < 2; k++) dev_free(cache[k]), dev_free(att[k]), dev_free(proj[k]);
    dev_free(d_qkv), dev_free(d_w);
}

// The hidden dropout's kernel zeroes exactly what the C reference zeroes (rows from global row 9
// of samples of T = 7, as a sequence-parallel rank holds them; C = 70 and 13, a pack of 8 a
// thread and one element a thread), and scales the rest by 1 / (1 - p), rounded once
static void test_hidden_dropout(int C) {
    const int rows = 50, T = 7, first_row = 9;
    size_t n = (size_t)rows * C;
    Dropout d = dropout_mask(0.3f, 1234, 5, 2, DROPOUT_MLP_OUTPUT, 40, 0);
    Vec x = random_vec(n, 2, true), want(n);
    for (auto& v : x) v = v == 0.0f ? 1.0f : v;   // none zero before the mask
    dropout_forward_cpu(want.data(), x.data(), rows, C, T, first_row, d);
    floatX* d_x = to_dev_x(x);
    dropout_forward(d_x, d_x, rows, C, T, first_row, d);   // in place, as the model calls it
    Vec got = from_dev_x(d_x, n);
    size_t differ = 0, dropped = 0;
    for (size_t i = 0; i < n; i++) differ += (got[i] == 0.0f) != (want[i] == 0.0f), dropped += want[i] == 0.0f;
    std::string with = " C=" + std::to_string(C);
    check(differ == 0 && dropped > 0, (FLOATX_NAME " dropout_forward: the C reference's mask, bit for bit" + with).c_str(),
          "%zu of %zu elements differ (%zu dropped)", differ, n, dropped);
    compare(("dropout_forward" + with).c_str(), got, want, X_OUT);
    dev_free(d_x);
}

// The attention dropout's masks, the unfused path's and the fused kernels', are the C
// reference's bit for bit. Made visible: value t2 is the unit vector e_t2 (HS >= T), so out's row
// t of head h is that row's probabilities times the mask's factor, zero exactly where a key is
// dropped (or past the diagonal); and dout's row t is e_t, so dV's row t2 (one head a group) is
// column t2 of the same, the mask the backward drew again. Two tiles of queries and four of keys
// (T = 100, HS = 128), heads global heads 2 and 3 (tensor rank 1's).
static void test_dropout_masks(void) {
    const int B = 2, T = 100, NH = 2, G = 2, HS = 128, N = B * T;
    const size_t n_qkv = (size_t)N * (NH + 2 * G) * HS, n_out = (size_t)N * NH * HS, rows = (size_t)B * NH * T;
    Dropout d = dropout_mask(0.3f, 1234, 7, 1, DROPOUT_ATTENTION_PROBS, 40, 2);
    Alibi none = {0, 0};
    Vec qkv = random_vec(n_qkv, 0.5f, true), dout(n_out, 0.0f);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                float* v = &qkv[qkv_index(b, t, h, 2, T, NH, G, HS)];
                for (int i = 0; i < HS; i++) v[i] = i == t ? 1.0f : 0.0f;
                dout[((size_t)(b * T + t) * NH + h) * HS + t] = 1.0f;
            }
    Vec out(n_out), att(rows * T), dqkv(n_qkv), scratch(rows);
    attention_forward_cpu(out.data(), att.data(), qkv.data(), B, T, NH, G, HS, none, d);
    attention_backward_cpu(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, NH, G, HS, d);
    Vec want_dv[3];
    split_qkv(want_dv, dqkv, NH, G, HS);
    floatX *d_qkv = to_dev_x(qkv), *d_dout = to_dev_x(dout), *d_out = (floatX*)dev_malloc(n_out * sizeof(floatX));
    floatX *d_att = (floatX*)dev_malloc(rows * T * sizeof(floatX)), *d_dqkv = (floatX*)dev_malloc(n_qkv * sizeof(floatX));
    floatX* d_scratch = (floatX*)dev_malloc(attention_scratch_elements(B, T, NH, HS) * sizeof(floatX));
    float *d_lse = (float*)dev_malloc(rows * sizeof(float)),
          *d_flash = (float*)dev_malloc(flash_backward_scratch_floats(B, T, NH, HS) * sizeof(float));
    for (int fused = 0; fused <= 1; fused++) {
        if (fused) attention_forward(d_out, NULL, d_lse, (floatX*)d_flash, d_qkv, B, T, NH, G, HS, none, d);
        else attention_forward(d_out, d_att, NULL, d_scratch, d_qkv, B, T, NH, G, HS, none, d);
        if (fused) attention_backward(d_dqkv, (floatX*)d_flash, d_dout, d_qkv, d_out, NULL, d_lse, B, T, NH, G, HS, none, d);
        else attention_backward(d_dqkv, d_scratch, d_dout, d_qkv, d_out, d_att, NULL, B, T, NH, G, HS, none, d);
        Vec got = from_dev_x(d_out, n_out), got_dv[3];
        split_qkv(got_dv, from_dev_x(d_dqkv, n_qkv), NH, G, HS);
        size_t differ = 0, dv_differ = 0, dropped = 0;
        for (size_t i = 0; i < n_out; i++) differ += (got[i] == 0.0f) != (out[i] == 0.0f), dropped += out[i] == 0.0f;
        for (size_t i = 0; i < want_dv[2].size(); i++) dv_differ += (got_dv[2][i] == 0.0f) != (want_dv[2][i] == 0.0f);
        std::string name = std::string(FLOATX_NAME) + (fused ? " flash" : " unfused") +
                           " attention dropout: the C reference's mask, bit for bit, in the forward and drawn again in the backward";
        check(differ == 0 && dv_differ == 0 && dropped > 0, name.c_str(), "%zu of %zu of out's elements differ, %zu of dV's",
              differ, n_out, dv_differ);
    }
    dev_free(d_qkv), dev_free(d_dout), dev_free(d_out), dev_free(d_att), dev_free(d_dqkv), dev_free(d_scratch);
    dev_free(d_lse), dev_free(d_flash);
}

// Context parallelism's attention by blocks (kernels/attention_blocks.cuh): each CUDA kernel
// against its C reference on the same floatX inputs. Two blocks at offsets in buffers of
// different rows a sequence (13 query rows, 11 key rows): one with q_count != kv_count whose
// positions give rows that see all of its keys, part of them, and none (out 0, lse -inf), one
// whole. Every output but two is fp32 computed from the same floatX values: only the order of
// the fp32 additions (a warp's butterfly against dot_lanes; an online softmax against two
// passes) differs, FP32_OUT; the rounding of the accumulated output and of the gradients into
// dqkv is one rounding, X_OUT. The outputs' rows outside the block must keep their values (both
// sides start from the same ones), and the backward run twice gives the same bits.
// HS = 64 (2 dims a lane), 80 (lanes with a part of a third), 7 (lanes with none).

// lse arrays: the same rows -inf (no key seen), the others within tol
static void compare_lse(const char* name, Vec got, Vec want, double tol) {
    size_t differ = 0;
    for (size_t i = 0; i < want.size(); i++) {
        differ += (got[i] == -INFINITY) != (want[i] == -INFINITY);
        if (want[i] == -INFINITY) got[i] = want[i] = 0.0f;
    }
    check(differ == 0, (std::string(FLOATX_NAME " ") + name + ": -inf in the same rows").c_str(), "%zu rows differ", differ);
    compare(name, got, want, tol);
}

static void test_attention_blocks(int NH, int G, int HS, Alibi alibi, Dropout d) {
    const int B = 2, q_rows = 13, kv_rows = 11, row = (NH + 2 * G) * HS;
    const AttentionBlock blocks[2] = {{B, q_rows, kv_rows, 3, 2, 8, 7, 20, 22}, {B, q_rows, kv_rows, 0, 0, 13, 11, 50, 0}};
    const size_t n_qkv = (size_t)B * q_rows * row, n_kv = (size_t)B * kv_rows * 2 * G * HS;
    const size_t n_out = (size_t)B * q_rows * NH * HS, n_lse = (size_t)B * NH * q_rows;
    Vec qkv = random_vec(n_qkv, 1.5f, true), kv = random_vec(n_kv, 1.5f, true), dout = random_vec(n_out, 1, true);
    floatX *d_qkv = to_dev_x(qkv), *d_kv = to_dev_x(kv), *d_dout = to_dev_x(dout);
    for (int k = 0; k < 2; k++) {
        AttentionBlock blk = blocks[k];
        char with[128];
        snprintf(with, sizeof with, " block %d NH=%d G=%d HS=%d%s%s", k, NH, G, HS, alibi.heads ? " ALiBi" : "",
                 d.threshold ? " dropout 0.3" : "");
        std::string w = with;
        // the forward, into outputs that hold other values in the rows outside the block
        Vec out = random_vec(n_out, 1, false), lse = random_vec(n_lse, 1, false);
        float *d_out = to_dev_f(out), *d_lse = to_dev_f(lse);
        attention_block_forward_cpu(out.data(), lse.data(), qkv.data(), kv.data(), blk, NH, G, HS, alibi, d);
        attention_block_forward(d_out, d_lse, d_qkv, d_kv, blk, NH, G, HS, alibi, d);
        compare(("attention_block_forward out" + w).c_str(), from_dev_f(d_out, n_out), out, FP32_OUT);
        compare_lse(("attention_block_forward lse" + w).c_str(), from_dev_f(d_lse, n_lse), lse, FP32_OUT);

        // the merge of that block into an accumulator, some of whose rows are still clear (-inf)
        Vec acc = random_vec(n_out, 1, false), acc_lse = random_vec(n_lse, 3, false);
        for (size_t i = 0; i < n_lse; i += 3) acc_lse[i] = -INFINITY;
        float *d_acc = to_dev_f(acc), *d_acc_lse = to_dev_f(acc_lse);
        attention_merge_cpu(acc.data(), acc_lse.data(), out.data(), lse.data(), blk, NH, HS);
        attention_merge(d_acc, d_acc_lse, d_out, d_lse, blk, NH, HS);
        compare(("attention_merge out" + w).c_str(), from_dev_f(d_acc, n_out), acc, FP32_OUT);
        compare_lse(("attention_merge lse" + w).c_str(), from_dev_f(d_acc_lse, n_lse), acc_lse, FP32_OUT);

        // the backward from this block's lse (P <= 1), adding into gradients that hold values
        Vec D = random_vec(n_lse, 1, false), dq = random_vec(n_out, 1, false), dkv = random_vec(n_kv, 1, false);
        float *d_D = to_dev_f(D), *d_dq = to_dev_f(dq), *d_dkv = to_dev_f(dkv);
        attention_block_backward_cpu(dq.data(), dkv.data(), dout.data(), D.data(), lse.data(), qkv.data(), kv.data(), blk,
                                     NH, G, HS, alibi, d);
        attention_block_backward(d_dq, d_dkv, d_dout, d_D, d_lse, d_qkv, d_kv, blk, NH, G, HS, alibi, d);
        Vec got_dq = from_dev_f(d_dq, n_out), got_dkv = from_dev_f(d_dkv, n_kv);
        compare(("attention_block_backward dq" + w).c_str(), got_dq, dq, FP32_OUT);
        compare(("attention_block_backward dkv" + w).c_str(), got_dkv, dkv, FP32_OUT);
        // again from the same starting values: the same bits
        Vec start_dq = random_vec(n_out, 1, false), start_dkv = random_vec(n_kv, 1, false), again[2][2];
        for (int run = 0; run < 2; run++) {
            host_to_dev(d_dq, start_dq.data(), n_out * sizeof(float));
            host_to_dev(d_dkv, start_dkv.data(), n_kv * sizeof(float));
            attention_block_backward(d_dq, d_dkv, d_dout, d_D, d_lse, d_qkv, d_kv, blk, NH, G, HS, alibi, d);
            again[run][0] = from_dev_f(d_dq, n_out), again[run][1] = from_dev_f(d_dkv, n_kv);
        }
        check(same_bits(again[0][0], again[1][0]) && same_bits(again[0][1], again[1][1]),
              (FLOATX_NAME " attention_block_backward twice: the same bits" + w).c_str(), "the two runs differ");
        dev_free(d_out), dev_free(d_lse), dev_free(d_acc), dev_free(d_acc_lse), dev_free(d_D), dev_free(d_dq), dev_free(d_dkv);
    }
    std::string w = " NH=" + std::to_string(NH) + " G=" + std::to_string(G) + " HS=" + std::to_string(HS);

    // D = rowsum(dout * out), out the final floatX output
    Vec out = random_vec(n_out, 1, true), D(n_lse);
    floatX* d_outx = to_dev_x(out);
    float* d_D = (float*)dev_malloc(n_lse * sizeof(float));
    attention_rows_dot_cpu(D.data(), dout.data(), out.data(), B, q_rows, NH, HS);
    attention_rows_dot(d_D, d_dout, d_outx, B, q_rows, NH, HS);
    compare(("attention_rows_dot" + w).c_str(), from_dev_f(d_D, n_lse), D, FP32_OUT);

    // the accumulated output to floatX: n not a multiple of 8, from an address that is not 16-byte aligned
    Vec acc = random_vec(n_out, 2, false), rounded(n_out - 1);
    float* d_acc = to_dev_f(acc);
    attention_output_rows_cpu(rounded.data(), acc.data() + 1, n_out - 1);
    attention_output_rows(d_outx + 1, d_acc + 1, n_out - 1);
    compare(("attention_output_rows" + w).c_str(), from_dev_x(d_outx + 1, n_out - 1), rounded, X_OUT);

    // the accumulator cleared: out 0, lse -inf, exactly
    float* d_lse = (float*)dev_malloc(n_lse * sizeof(float));
    attention_accumulator_clear(d_acc, d_lse, B, q_rows, NH, HS);
    Vec cleared = from_dev_f(d_acc, n_out), cleared_lse = from_dev_f(d_lse, n_lse);
    size_t wrong = 0;
    for (float x : cleared) wrong += x != 0.0f;
    for (float x : cleared_lse) wrong += x != -INFINITY;
    check(wrong == 0, (FLOATX_NAME " attention_accumulator_clear: out 0, lse -inf" + w).c_str(), "%zu elements wrong", wrong);

    // dq and dkv (fp32) into dqkv's layout, rounded once
    const int n = B * q_rows;
    Vec dq = random_vec((size_t)n * NH * HS, 1, false), dkv = random_vec((size_t)n * 2 * G * HS, 1, false), dqkv(n_qkv);
    float *d_dq = to_dev_f(dq), *d_dkv = to_dev_f(dkv);
    floatX* d_dqkv = (floatX*)dev_malloc(n_qkv * sizeof(floatX));
    attention_block_gradients_into_qkv_cpu(dqkv.data(), dq.data(), dkv.data(), n, NH, G, HS);
    attention_block_gradients_into_qkv(d_dqkv, d_dq, d_dkv, n, NH, G, HS);
    compare(("attention_block_gradients_into_qkv" + w).c_str(), from_dev_x(d_dqkv, n_qkv), dqkv, X_OUT);
    dev_free(d_qkv), dev_free(d_kv), dev_free(d_dout), dev_free(d_outx), dev_free(d_D), dev_free(d_acc), dev_free(d_lse);
    dev_free(d_dq), dev_free(d_dkv), dev_free(d_dqkv);
}

// the fused attention's checks alone: tests/test_emu.sh's planted bugs run these
static void test_flash_attention_shapes(void) {
    Alibi none = {0, 0}, heads_2_to_4_of_5 = {2, 5}, heads_1_to_6_of_7 = {1, 7};
    // the attention dropout 0.3 of a step, these heads global heads 2.. (a tensor rank's)
    Dropout d = dropout_mask(0.3f, 1234, 7, 1, DROPOUT_ATTENTION_PROBS, 40, 2), none_d = NO_DROPOUT;
    // the two head sizes; T of a few rows (5), under one tile (37), one tile exactly (64), a partial
    // last tile (70: the backward's 32-row steps past T too), three tiles (130); B and NH
    // above 1; ALiBi on and off
    test_flash_attention(1, 5, 2, 2, 64, none, none_d);
    test_flash_attention(2, 37, 3, 3, 64, heads_2_to_4_of_5, none_d);
    test_flash_attention(1, 64, 2, 2, 64, none, none_d);
    test_flash_attention(2, 70, 2, 2, 64, none, none_d);
    test_flash_attention(1, 130, 2, 2, 64, heads_2_to_4_of_5, none_d);
    test_flash_attention(1, 70, 2, 2, 128, heads_2_to_4_of_5, none_d);
    test_flash_attention(2, 130, 1, 1, 128, none, none_d);
    // three tiles of 6 pairs, in 5 ticket windows the second time (one of 2 pairs, four of 1)
    test_flash_attention(3, 130, 2, 2, 64, none, none_d);
    // grouped-query attention: groups of 2 and 3 heads, one group of 3 (multi-query); odd T
    // (a partial tile, a few rows, two and three tiles), both head sizes, ALiBi on and off
    test_flash_attention(2, 37, 4, 2, 64, none, none_d);
    test_flash_attention(1, 71, 6, 2, 64, heads_1_to_6_of_7, none_d);
    test_flash_attention(1, 71, 3, 1, 64, heads_2_to_4_of_5, none_d);
    test_flash_attention(1, 5, 3, 1, 128, none, none_d);
    test_flash_attention(1, 71, 4, 2, 128, heads_1_to_6_of_7, none_d);
    // with dropout: both head sizes, partial tiles, grouped-query attention, ALiBi on and off
    test_flash_attention(2, 37, 3, 3, 64, heads_2_to_4_of_5, d);
    test_flash_attention(1, 130, 4, 2, 64, none, d);
    test_flash_attention(1, 71, 4, 2, 128, heads_1_to_6_of_7, d);
    test_dropout_masks();
}

static void test_moe_shapes(void) {
    test_moe(37, 8, 2, 70, false);
    test_moe(37, 8, 2, 64, true);
    test_moe(29, 60, 4, 64, false);
    test_moe(13, 60, 4, 70, true);
    test_moe(5, MOE_MAX_EXPERTS, MOE_MAX_TOPK, 9, false);
    test_moe_capacity(37, 8, 2, 70, false);
    test_moe_capacity(301, 4, 2, 64, true);   // (choices in more than one block of threads)
    test_moe_limits();
}

// argument "flash": only the fused attention's checks; "decode": only the split decode's; "moe": only the MoE layer's
int main(int argc, char** argv) {
    kernels_init(0);
    if (argc > 1 && strcmp(argv[1], "flash") == 0) {
        test_ptx_layouts();
        test_flash_attention_shapes();
        return tests_summary();
    }
    if (argc > 1 && strcmp(argv[1], "decode") == 0) {
        test_attention_decode_splits();
        test_decode_graph();
        return tests_summary();
    }
#ifdef EMU_FLASH_ONLY   // tests/test_emu.sh's planted builds run the flash or decode tests alone: the rest is not compiled
    return 2;
#else
    if (argc > 1 && strcmp(argv[1], "moe") == 0) {
        test_moe_shapes();
        return tests_summary();
    }
    test_cublas_checks();
    test_cublaslt_checks();
    test_encoder(70);
    test_encoder(64);
    test_residual();
    test_rows_add(70);
    test_rows_add(64);
    test_layernorm();
    test_residual_layernorm(77);
    test_residual_layernorm(264);
    test_matmul();
    test_column_sums();
    test_matmul_epilogues(48, GELU_TANH);
    test_matmul_epilogues(45, GELU_TANH);
    test_matmul_epilogues(48, GELU_ERF);
    test_cublaslt_plan_cache();
    test_gelu_matmul_backward(48, GELU_TANH);
    test_gelu_matmul_backward(45, GELU_TANH);
    test_gelu_matmul_backward(48, GELU_ERF);
    Alibi none = {0, 0}, heads_2_to_4_of_5 = {2, 5};
    Alibi heads_1_to_6_of_7 = {1, 7};
    test_attention(3, 3, none, NO_DROPOUT);
    test_attention(3, 3, heads_2_to_4_of_5, NO_DROPOUT);
    test_attention(6, 2, heads_1_to_6_of_7, NO_DROPOUT);   // grouped-query attention: 2 groups of 3 heads
    test_attention(4, 1, none, NO_DROPOUT);                // multi-query: one group
    Dropout attention_dropout = dropout_mask(0.3f, 1234, 7, 1, DROPOUT_ATTENTION_PROBS, 40, 3);
    test_attention(3, 3, heads_2_to_4_of_5, attention_dropout);
    test_attention(6, 2, none, attention_dropout);
    test_hidden_dropout(70);
    test_hidden_dropout(13);
    test_attention_decode(3, 3, 64, none);
    test_attention_decode(2, 2, 7, heads_2_to_4_of_5);
    test_attention_decode(2, 2, 80, heads_2_to_4_of_5);
    test_attention_decode(6, 2, 64, heads_1_to_6_of_7);
    test_attention_decode(4, 1, 80, none);
    test_attention_decode_splits();
    test_decode_graph();
    test_ptx_layouts();
    test_flash_attention_shapes();
    test_attention_blocks(4, 4, 64, none, NO_DROPOUT);
    test_attention_blocks(4, 2, 80, heads_1_to_6_of_7, attention_dropout);   // grouped-query: 2 groups of 2
    test_attention_blocks(3, 1, 7, heads_2_to_4_of_5, NO_DROPOUT);          // multi-query
    test_attention_blocks(6, 2, 64, none, attention_dropout);
    test_gelu(GELU_TANH);
    test_gelu(GELU_ERF);
    test_rmsnorm();
    test_rope(2, 37, 4, 4, 64, 64, 0);
    test_rope(2, 37, 4, 1, 64, 32, 100);
    test_rope(1, 9, 6, 2, 12, 6, 5);
    test_rope(1, 5, 3, 3, 7, 6, 4000);
    test_swiglu();
    test_crossentropy();
    test_crossentropy_fused(37, 300, 290);
    test_crossentropy_fused(5, 9000, 9000);
    test_crossentropy_fused(16, 304, 304);
    test_adamw();
    test_sum_squares();
    test_shard_pieces();
    test_shard_ranges(SHARD_PIECE);
    test_shard_ranges(100);
    test_adamw8bit_ranges(SHARD_PIECE);
    test_adamw8bit_ranges(100);
    test_loss_mean_add();
    test_floats_add();
    test_moe_shapes();
#ifdef EMU_MAX_BLOCK   // under the emulation (tests/emu); nvcc builds this file for make test-gpu too
    printf("(%ld emulated kernel launches, %ld 128-bit loads and stores)\n", emu.launches, emu_accesses_128);
#endif
    return tests_summary();
#endif
}
