/*
tests/test_kernels.c — the plain-C kernels of kernels.cuh against the math.

Every forward op is compared with an independent reference written here in double
precision, straight from the formula; every backward op with central finite differences
of that double reference, for the scalar loss L = sum(out * R) with a fixed random R.
AdamW is compared with torch.optim.AdamW's update written out by hand. Sizes are awkward on
purpose (37 rows, 45 channels, 29 outputs, 11 positions, 3 heads of 7) and the vocabulary
is padded and split as a vocab-parallel run splits it.

Tolerances are relative to the largest magnitude of the expected array (so that entries
that happen to be near zero need no tolerance of their own); each is stated where it is
used, with why. fp32 has unit roundoff u = 2^-24 ~ 6e-8; a sum of K terms is off by at most
~K u of the sum of the terms' magnitudes.

  gcc -std=gnu11 -O2 -fopenmp -Wall -Wextra -Werror tests/test_kernels.c -o test_kernels -lm
  gcc -std=gnu11 -O2 -fopenmp -Wall -Wextra -Werror -DUSE_BLAS tests/test_kernels.c \
      -o test_kernels_blas -lopenblas -lm
  gcc -std=gnu11 -g -O1 -fsanitize=address -fopenmp -Wall -Wextra -Werror tests/test_kernels.c \
      -o test_kernels_asan -lm
Add -DVERBOSE to print every measured error beside its tolerance.
*/
#include "../kernels.cuh"
#include "test.h"

// ----------------------------------------------------------------------------
// random numbers (splitmix64) and buffers

static uint64_t rng_state = 1234;

static uint64_t next_random(void) {   // SplitMix64's stream: kernels/random.cuh's finalizer of a counter
    uint64_t z = splitmix64(rng_state);
    rng_state += 0x9E3779B97F4A7C15ull;
    return z;
}
static float rand_uniform(float lo, float hi) { return lo + (hi - lo) * (float)((next_random() >> 40) / 16777216.0); }
static int rand_int(int n) { return (int)(next_random() % (uint64_t)n); }

// every buffer of a test comes from here and is freed together at the test's end
#define MAX_BUFFERS 128
static void* buffers[MAX_BUFFERS];
static int n_buffers = 0;

static void* new_buffer(size_t bytes) {
    if (n_buffers == MAX_BUFFERS) { fprintf(stderr, "test_kernels: too many buffers\n"); exit(1); }
    return buffers[n_buffers++] = callocCheck(bytes, 1);
}
static float* new_floats(size_t n) { return (float*)new_buffer(n * sizeof(float)); }
static double* new_doubles(size_t n) { return (double*)new_buffer(n * sizeof(double)); }
static void free_buffers(void) { while (n_buffers > 0) free(buffers[--n_buffers]); }

static float* random_floats(size_t n, float lo, float hi) {
    float* x = new_floats(n);
    for (size_t i = 0; i < n; i++) x[i] = rand_uniform(lo, hi);
    return x;
}
static float* filled_floats(size_t n, float value) {
    float* x = new_floats(n);
    for (size_t i = 0; i < n; i++) x[i] = value;
    return x;
}
static double* doubles_of(const float* x, size_t n) {
    double* d = new_doubles(n);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}
static float* copy_floats(const float* x, size_t n) {
    float* y = new_floats(n);
    memcpy(y, x, n * sizeof(float));
    return y;
}
static double dot(const double* a, const double* b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

// ----------------------------------------------------------------------------
// the two shared helpers: compare arrays, finite differences

// got - base (base: the value an accumulating output started from, or NULL) against want.
// The error is max |got - base - want| / max |want|; any non-finite value fails.
static void expect_close(const char* name, const float* got, const float* base, const double* want,
                         size_t n, double tol) {
    double err = 0.0, scale = 0.0;
    size_t worst = 0, nonfinite = 0;
    for (size_t i = 0; i < n; i++) {
        double g = (double)got[i] - (base ? (double)base[i] : 0.0);
        if (fabs(want[i]) > scale) scale = fabs(want[i]);
        if (!isfinite(g)) {
            if (nonfinite++ == 0) worst = i;  // report the first one
            err = INFINITY;
        } else if (nonfinite == 0 && fabs(g - want[i]) > err) {
            err = fabs(g - want[i]);
            worst = i;
        }
    }
    double rel = err / (scale > 0.0 ? scale : 1.0);
    check(rel <= tol, name, "max |error| %.3g at [%zu] (got %.9g, want %.9g) = %.3g of max |want| %.3g, tolerance %.1g"
          " (%zu non-finite)", err, worst, (double)got[worst] - (base ? base[worst] : 0.0f), want[worst], rel,
          scale, tol, nonfinite);
#ifdef VERBOSE
    printf("     relative error %.2g (tolerance %.1g)\n", rel, tol);
#endif
}

// the exact check: two float arrays bit-identical
static void expect_identical(const char* name, const float* a, const float* b, size_t n) {
    check(memcmp(a, b, n * sizeof(float)) == 0, name, "the arrays differ");
}

// Backward checks. The central difference (L(x+h) - L(x-h)) / 2h on the double reference is
// good to ~1e-9 (truncation h^2 L''' / 6, roundoff 1e-16 |L| / h), so what is left is the
// kernel's fp32 arithmetic, 1e-7..1e-6 of the gradient's scale: 1e-4 is two decades of margin
// for reductions of up to a few hundred terms, while a wrong or missing term shows as O(1e-2).
#define FD_H 1e-4
#define FD_TOL 1e-4

typedef double (*loss_fn)(const void* ctx);

// dL/dx[i] for every i; the loss reads x through ctx; x is left as it was
static void finite_diff(double* grad, double* x, size_t n, loss_fn loss, const void* ctx) {
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + FD_H;
        double up = loss(ctx);
        x[i] = x0 - FD_H;
        double down = loss(ctx);
        x[i] = x0;
        grad[i] = (up - down) / (2.0 * FD_H);
    }
}

// ----------------------------------------------------------------------------
// encoder: out[n] = wte[token[n] - vocab_start] (zero outside this rank's rows) + wpe[n % T]

typedef struct { const int* tokens; double *wte, *wpe, *R, *out; int N, T, C, vocab_start, vocab_local; } EncoderCase;

static void ref_encoder(double* out, const int* tokens, const double* wte, const double* wpe,
                        int N, int T, int C, int vocab_start, int vocab_local) {
    for (int n = 0; n < N; n++) {
        int row = tokens[n] - vocab_start;
        int held = row >= 0 && row < vocab_local;
        for (int c = 0; c < C; c++)
            out[n * C + c] = (held ? wte[row * C + c] : 0.0) + (wpe ? wpe[(n % T) * C + c] : 0.0);
    }
}
static double encoder_loss(const void* p) {
    const EncoderCase* e = p;
    ref_encoder(e->out, e->tokens, e->wte, e->wpe, e->N, e->T, e->C, e->vocab_start, e->vocab_local);
    return dot(e->out, e->R, (size_t)e->N * e->C);
}

static void test_encoder(int vocab_start, int vocab_local, int with_wpe) {
    const int N = 37, T = 11, C = 45, V = 56;
    char name[128];
    int tokens[37];
    for (int n = 0; n < N; n++) tokens[n] = rand_int(V);
    // the slice's edges, and the rows just outside it
    tokens[0] = vocab_start; tokens[1] = vocab_start + vocab_local - 1;
    tokens[2] = vocab_start > 0 ? vocab_start - 1 : 0; tokens[3] = (vocab_start + vocab_local) % V;
    float* wte = random_floats((size_t)vocab_local * C, -1, 1);
    float* wpe = with_wpe ? random_floats((size_t)T * C, -1, 1) : NULL;
    float* R = random_floats((size_t)N * C, -1, 1);
    EncoderCase e = {tokens, doubles_of(wte, (size_t)vocab_local * C), wpe ? doubles_of(wpe, (size_t)T * C) : NULL,
                     doubles_of(R, (size_t)N * C), new_doubles((size_t)N * C), N, T, C, vocab_start, vocab_local};
    const char* tag = with_wpe ? "" : ", wpe NULL";

    // one fp32 add per element: off by at most u ~ 6e-8 of the result
    float* out = new_floats((size_t)N * C);
    encoder_forward_cpu(out, tokens, wte, wpe, N, T, C, vocab_start, vocab_local);
    encoder_loss(&e);
    snprintf(name, sizeof name, "encoder_forward (vocab %d+%d of %d%s)", vocab_start, vocab_local, V, tag);
    expect_close(name, out, NULL, e.out, (size_t)N * C, 1e-7);

    float* dwte = new_floats((size_t)vocab_local * C);
    float* dwpe = wpe ? new_floats((size_t)T * C) : NULL;
    encoder_backward_cpu(dwte, dwpe, R, tokens, N, T, C, vocab_start, vocab_local);
    double* fd = new_doubles((size_t)vocab_local * C);
    finite_diff(fd, e.wte, (size_t)vocab_local * C, encoder_loss, &e);
    snprintf(name, sizeof name, "encoder_backward dwte (vocab %d+%d%s)", vocab_start, vocab_local, tag);
    expect_close(name, dwte, NULL, fd, (size_t)vocab_local * C, FD_TOL);
    if (wpe) {
        double* fd_wpe = new_doubles((size_t)T * C);
        finite_diff(fd_wpe, e.wpe, (size_t)T * C, encoder_loss, &e);
        snprintf(name, sizeof name, "encoder_backward dwpe (vocab %d+%d)", vocab_start, vocab_local);
        expect_close(name, dwpe, NULL, fd_wpe, (size_t)T * C, FD_TOL);
    }
    // gradients accumulate: a second call adds the same again. Each element is a sum of at
    // most ceil(N/T) = 4 terms, so doubling it is exact to a few u: 1e-6.
    double* twice = doubles_of(dwte, (size_t)vocab_local * C);
    for (int i = 0; i < vocab_local * C; i++) twice[i] *= 2.0;
    encoder_backward_cpu(dwte, dwpe, R, tokens, N, T, C, vocab_start, vocab_local);
    snprintf(name, sizeof name, "encoder_backward accumulates: second call doubles dwte (vocab %d+%d%s)",
             vocab_start, vocab_local, tag);
    expect_close(name, dwte, NULL, twice, (size_t)vocab_local * C, 1e-6);
    free_buffers();
}

// ----------------------------------------------------------------------------
// residual

static void test_residual(void) {
    const size_t n = 37 * 45;
    float* a = random_floats(n, -1, 1);
    float* b = random_floats(n, -1, 1);
    float* out = new_floats(n);
    double* want = new_doubles(n);
    for (size_t i = 0; i < n; i++) want[i] = (double)a[i] + (double)b[i];
    residual_forward_cpu(out, a, b, n);
    expect_close("residual_forward", out, NULL, want, n, 1e-7);  // one rounding: <= u
    free_buffers();
}

// ----------------------------------------------------------------------------
// rows_add: out[n] += table[(first_row + n) % period] (sequence parallelism's bias and
// position adds on a rank's rows of the residual stream)

typedef struct { double *table, *base, *R, *out; int N, C, first_row, period; } RowsAddCase;

static double rows_add_loss(const void* p) {
    const RowsAddCase* e = p;
    for (int n = 0; n < e->N; n++)
        for (int c = 0; c < e->C; c++)
            e->out[n * e->C + c] = e->base[n * e->C + c] + e->table[((e->first_row + n) % e->period) * e->C + c];
    return dot(e->out, e->R, (size_t)e->N * e->C);
}

// period 1: a bias; period 11 from row 16: positions of the second of three ranks' rows, which
// start mid-sequence and wrap into the next sequence
static void test_rows_add(int first_row, int period) {
    const int N = 37, C = 45;
    char name[128];
    float* table = random_floats((size_t)period * C, -1, 1);
    float* base = random_floats((size_t)N * C, -1, 1);
    float* R = random_floats((size_t)N * C, -1, 1);
    RowsAddCase e = {doubles_of(table, (size_t)period * C), doubles_of(base, (size_t)N * C), doubles_of(R, (size_t)N * C),
                     new_doubles((size_t)N * C), N, C, first_row, period};
    float* out = copy_floats(base, (size_t)N * C);
    rows_add_forward_cpu(out, table, N, C, first_row, period);
    rows_add_loss(&e);
    snprintf(name, sizeof name, "rows_add_forward (rows from %d, period %d)", first_row, period);
    expect_close(name, out, NULL, e.out, (size_t)N * C, 1e-7);   // one fp32 add: <= u
    // the gradient adds onto what is there (gradients accumulate over micro-batches)
    float* dtable = random_floats((size_t)period * C, -1, 1);
    float* before = copy_floats(dtable, (size_t)period * C);
    rows_add_backward_cpu(dtable, R, N, C, first_row, period);
    double* fd = new_doubles((size_t)period * C);
    finite_diff(fd, e.table, (size_t)period * C, rows_add_loss, &e);
    snprintf(name, sizeof name, "rows_add_backward accumulates dtable (rows from %d, period %d)", first_row, period);
    expect_close(name, dtable, before, fd, (size_t)period * C, FD_TOL);
    free_buffers();
}

// ----------------------------------------------------------------------------
// LayerNorm: out = (x - mean) / sqrt(var + 1e-5) * weight + bias, var biased (divides by C)

typedef struct { double *inp, *weight, *bias, *R, *out, *mean, *rstd; int N, C; } LayerNormCase;

static void ref_layernorm(double* out, double* mean, double* rstd, const double* inp, const double* weight,
                          const double* bias, int N, int C) {
    for (int n = 0; n < N; n++) {
        const double* x = inp + n * C;
        double m = 0.0, var = 0.0;
        for (int c = 0; c < C; c++) m += x[c] / C;
        for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m) / C;
        double s = 1.0 / sqrt(var + 1e-5);
        for (int c = 0; c < C; c++) out[n * C + c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[n] = m;
        rstd[n] = s;
    }
}
static double layernorm_loss(const void* p) {
    const LayerNormCase* l = p;
    ref_layernorm(l->out, l->mean, l->rstd, l->inp, l->weight, l->bias, l->N, l->C);
    return dot(l->out, l->R, (size_t)l->N * l->C);
}

static void test_layernorm(void) {
    const int N = 37, C = 45;
    const size_t NC = (size_t)N * C;
    float* inp = random_floats(NC, 1, 4);  // a mean far from 0 and a spread of ~1
    float* weight = random_floats(C, 0.5f, 1.5f);
    float* bias = random_floats(C, -1, 1);
    float* R = random_floats(NC, -1, 1);
    LayerNormCase l = {doubles_of(inp, NC), doubles_of(weight, C), doubles_of(bias, C), doubles_of(R, NC),
                       new_doubles(NC), new_doubles(N), new_doubles(N), N, C};
    float *out = new_floats(NC), *mean = new_floats(N), *rstd = new_floats(N);
    layernorm_forward_cpu(out, mean, rstd, inp, weight, bias, N, C);
    layernorm_loss(&l);
    // mean and rstd: summed in double, rounded once to fp32 (u); out: a handful of fp32
    // operations on |xhat| <= ~2, so ~1e-7 of max |out|; 1e-6 and 1e-5 leave a decade
    expect_close("layernorm_forward mean", mean, NULL, l.mean, N, 1e-6);
    expect_close("layernorm_forward rstd", rstd, NULL, l.rstd, N, 1e-6);
    expect_close("layernorm_forward out", out, NULL, l.out, NC, 1e-5);

    // dinp adds into the residual stream's gradient; dweight and dbias accumulate: pre-fill
    // all three with known values and check what was added
    float* dinp0 = random_floats(NC, -1, 1);
    float* dweight0 = random_floats(C, -1, 1);
    float* dbias0 = random_floats(C, -1, 1);
    float* dinp = copy_floats(dinp0, NC);
    float* dweight = copy_floats(dweight0, C);
    float* dbias = copy_floats(dbias0, C);
    layernorm_backward_cpu(dinp, dweight, dbias, R, inp, weight, mean, rstd, N, C);
    double *fd_inp = new_doubles(NC), *fd_weight = new_doubles(C), *fd_bias = new_doubles(C);
    finite_diff(fd_inp, l.inp, NC, layernorm_loss, &l);
    finite_diff(fd_weight, l.weight, C, layernorm_loss, &l);
    finite_diff(fd_bias, l.bias, C, layernorm_loss, &l);
    expect_close("layernorm_backward dinp (added to what was there)", dinp, dinp0, fd_inp, NC, FD_TOL);
    expect_close("layernorm_backward dweight (accumulated)", dweight, dweight0, fd_weight, C, FD_TOL);
    expect_close("layernorm_backward dbias (accumulated)", dbias, dbias0, fd_bias, C, FD_TOL);
    free_buffers();
}

// ----------------------------------------------------------------------------
// RMSNorm: out = x / sqrt(mean(x^2) + eps) * weight

typedef struct { double *inp, *weight, *R, *out, *rstd; int N, C; double eps; } RMSNormCase;

static double rmsnorm_loss(const void* p) {
    const RMSNormCase* l = p;
    for (int n = 0; n < l->N; n++) {
        const double* x = l->inp + n * l->C;
        double ms = 0.0;
        for (int c = 0; c < l->C; c++) ms += x[c] * x[c] / l->C;
        l->rstd[n] = 1.0 / sqrt(ms + l->eps);
        for (int c = 0; c < l->C; c++) l->out[n * l->C + c] = x[c] * l->rstd[n] * l->weight[c];
    }
    return dot(l->out, l->R, (size_t)l->N * l->C);
}

static void test_rmsnorm(void) {
    const int N = 37, C = 45;
    const size_t NC = (size_t)N * C;
    const float eps = 1e-5f;
    float* inp = random_floats(NC, -2, 3);   // signs mixed, a mean away from 0 (which RMSNorm keeps)
    float* weight = random_floats(C, 0.5f, 1.5f);
    float* R = random_floats(NC, -1, 1);
    RMSNormCase l = {doubles_of(inp, NC), doubles_of(weight, C), doubles_of(R, NC), new_doubles(NC), new_doubles(N),
                     N, C, eps};
    float *out = new_floats(NC), *rstd = new_floats(N);
    rmsnorm_forward_cpu(out, rstd, inp, weight, N, C, eps);
    rmsnorm_loss(&l);
    // as LayerNorm's: rstd summed in double and rounded once (u); out a few fp32 products
    expect_close("rmsnorm_forward rstd", rstd, NULL, l.rstd, N, 1e-6);
    expect_close("rmsnorm_forward out", out, NULL, l.out, NC, 1e-5);

    float *dinp0 = random_floats(NC, -1, 1), *dweight0 = random_floats(C, -1, 1);   // both added into
    float *dinp = copy_floats(dinp0, NC), *dweight = copy_floats(dweight0, C);
    rmsnorm_backward_cpu(dinp, dweight, R, inp, weight, rstd, N, C);
    double *fd_inp = new_doubles(NC), *fd_weight = new_doubles(C);
    finite_diff(fd_inp, l.inp, NC, rmsnorm_loss, &l);
    finite_diff(fd_weight, l.weight, C, rmsnorm_loss, &l);
    expect_close("rmsnorm_backward dinp (added to what was there)", dinp, dinp0, fd_inp, NC, FD_TOL);
    expect_close("rmsnorm_backward dweight (accumulated)", dweight, dweight0, fd_weight, C, FD_TOL);
    free_buffers();
}

// ----------------------------------------------------------------------------
// matmul: out[N, OC] = inp[N, C] @ weight[OC, C]^T + bias[OC]

typedef struct { double *inp, *weight, *bias, *R, *out; int N, C, OC; } MatmulCase;

static void ref_matmul(double* out, const double* inp, const double* weight, const double* bias, int N, int C, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int c = 0; c < C; c++) s += inp[n * C + c] * weight[o * C + c];
            out[n * OC + o] = s;
        }
}
static double matmul_loss(const void* p) {
    const MatmulCase* m = p;
    ref_matmul(m->out, m->inp, m->weight, m->bias, m->N, m->C, m->OC);
    return dot(m->out, m->R, (size_t)m->N * m->OC);
}

typedef void (*matmul_forward_fn)(float*, const float*, const float*, const float*, int, int, int);
typedef void (*matmul_backward_fn)(float*, float*, float*, const float*, const float*, const float*, int, int, int);

// the reference backward whole: its two halves (kernels/linear.cuh keeps them apart for ZB-H1's
// W pass), the input's gradient and then the parameters'
static void matmul_backward_halves_reference(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                             const float* weight, int N, int C, int OC) {
    matmul_backward_dinp_reference(dinp, dout, weight, N, C, OC);
    matmul_backward_params_reference(dweight, dbias, dout, inp, N, C, OC);
}

static void test_matmul(void) {
    const int N = 37, C = 45, OC = 29;
    const size_t NC = (size_t)N * C, NOC = (size_t)N * OC, OCC = (size_t)OC * C;
    float* inp = random_floats(NC, -1, 1);
    float* weight = random_floats(OCC, -1, 1);
    float* bias = random_floats(OC, -1, 1);
    float* R = random_floats(NOC, -1, 1);
    MatmulCase m = {doubles_of(inp, NC), doubles_of(weight, OCC), doubles_of(bias, OC), doubles_of(R, NOC),
                    new_doubles(NOC), N, C, OC};
    double* want_nobias = new_doubles(NOC);
    ref_matmul(want_nobias, m.inp, m.weight, NULL, N, C, OC);
    double *fd_inp = new_doubles(NC), *fd_weight = new_doubles(OCC), *fd_bias = new_doubles(OC);
    finite_diff(fd_inp, m.inp, NC, matmul_loss, &m);
    finite_diff(fd_weight, m.weight, OCC, matmul_loss, &m);
    finite_diff(fd_bias, m.bias, OC, matmul_loss, &m);
    matmul_loss(&m);  // leaves the forward with bias in m.out

    const char* fwd_names[2] = {"matmul_forward_reference", "matmul_forward_cpu"};
    const char* bwd_names[2] = {"matmul_backward_dinp_reference + matmul_backward_params_reference", "matmul_backward_cpu"};
    matmul_forward_fn fwd[2] = {matmul_forward_reference, matmul_forward_cpu};
    matmul_backward_fn bwd[2] = {matmul_backward_halves_reference, matmul_backward_cpu};
    char name[128];
    for (int k = 0; k < 2; k++) {
        for (int with_bias = 1; with_bias >= 0; with_bias--) {
            const char* tag = with_bias ? "with bias" : "bias NULL";
            // dot products of C = 45 terms in fp32 (any order, BLAS too): <= 45 u of the sum
            // of |terms|, which is ~2x max |out| here: ~5e-6 worst case, typically 1e-7
            float* out = filled_floats(NOC, NAN);
            fwd[k](out, inp, weight, with_bias ? bias : NULL, N, C, OC);
            snprintf(name, sizeof name, "%s (%s)", fwd_names[k], tag);
            expect_close(name, out, NULL, with_bias ? m.out : want_nobias, NOC, 1e-5);

            // dinp is overwritten (pre-filled with NaN), dweight and dbias accumulate
            float* dinp = filled_floats(NC, NAN);
            float* dweight0 = random_floats(OCC, -1, 1);
            float* dbias0 = random_floats(OC, -1, 1);
            float* dweight = copy_floats(dweight0, OCC);
            float* dbias = copy_floats(dbias0, OC);
            bwd[k](dinp, dweight, with_bias ? dbias : NULL, R, inp, weight, N, C, OC);
            snprintf(name, sizeof name, "%s dinp (overwritten; %s)", bwd_names[k], tag);
            expect_close(name, dinp, NULL, fd_inp, NC, FD_TOL);
            snprintf(name, sizeof name, "%s dweight (accumulated; %s)", bwd_names[k], tag);
            expect_close(name, dweight, dweight0, fd_weight, OCC, FD_TOL);
            if (with_bias) {
                snprintf(name, sizeof name, "%s dbias (accumulated)", bwd_names[k]);
                expect_close(name, dbias, dbias0, fd_bias, OC, FD_TOL);
            }
        }
    }
    // the helper the BLAS path uses for dbias: column sums of 37 rows added into out
    float* sums = copy_floats(bias, OC);
    double* want = new_doubles(OC);
    for (int o = 0; o < OC; o++)
        for (int n = 0; n < N; n++) want[o] += R[n * OC + o];
    column_sums_add_cpu(sums, R, N, OC);
    expect_close("column_sums_add_cpu (accumulated)", sums, bias, want, OC, 1e-5);  // 37-term fp32 sums
    free_buffers();
}

// ----------------------------------------------------------------------------
// causal self-attention (G = NH first). qkv[b, t] holds the heads one after another, each as [q | k | v];
// out[b, t] the heads side by side; att[b, h, t, t2] the softmax probabilities.

typedef struct { double *qkv, *R, *out, *att; int B, T, NH, HS; Alibi alibi; } AttentionCase;

// BLOOM's ALiBi slopes the way transformers' build_alibi_tensor computes them: the closest
// power of two, a base per set, powers of it (written from the formulas, not from alibi_slope)
static double ref_alibi_slope(int h, int H) {
    double p2 = pow(2.0, floor(log2((double)H)));
    double base = pow(2.0, -pow(2.0, -(log2(p2) - 3.0)));
    if (h < p2) return pow(base, h + 1);
    double extra_base = pow(2.0, -pow(2.0, -(log2(2.0 * p2) - 3.0)));
    return pow(extra_base, 2 * (h - p2) + 1);
}

static size_t qkv_at(int b, int t, int h, int part, int T, int NH, int HS) {
    size_t token = (size_t)b * T + t;
    return token * (3 * NH * HS) + (size_t)h * 3 * HS + (size_t)part * HS;
}

// with ALiBi as BLOOM writes it: slope * t2 added to the score of key t2 (the kernels add
// slope * (t2 - t), equal after the softmax)
static void ref_attention(double* out, double* att, const double* qkv, int B, int T, int NH, int HS, Alibi alibi) {
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double* q = qkv + qkv_at(b, t, h, 0, T, NH, HS);
                double p[T], max = -INFINITY, sum = 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const double* k = qkv + qkv_at(b, t2, h, 1, T, NH, HS);
                    p[t2] = 0.0;
                    for (int i = 0; i < HS; i++) p[t2] += q[i] * k[i] / sqrt((double)HS);
                    if (alibi.heads) p[t2] += ref_alibi_slope(alibi.first_head + h, alibi.heads) * t2;
                    if (p[t2] > max) max = p[t2];
                }
                for (int t2 = 0; t2 <= t; t2++) sum += (p[t2] = exp(p[t2] - max));
                double* a = att + (((size_t)b * NH + h) * T + t) * T;
                for (int t2 = 0; t2 < T; t2++) a[t2] = t2 <= t ? p[t2] / sum : 0.0;
                double* o = out + ((size_t)b * T + t) * NH * HS + (size_t)h * HS;
                for (int i = 0; i < HS; i++) {
                    o[i] = 0.0;
                    for (int t2 = 0; t2 <= t; t2++) o[i] += a[t2] * qkv[qkv_at(b, t2, h, 2, T, NH, HS) + i];
                }
            }
}
static double attention_loss(const void* p) {
    const AttentionCase* a = p;
    ref_attention(a->out, a->att, a->qkv, a->B, a->T, a->NH, a->HS, a->alibi);
    return dot(a->out, a->R, (size_t)a->B * a->T * a->NH * a->HS);
}

// one of q, k, v (part 0, 1, 2) of every token and head, as a dense array
static void gather_part(double* dst, const float* fsrc, const double* dsrc, int part, int B, int T, int NH, int HS) {
    size_t j = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++)
                for (int i = 0; i < HS; i++, j++) {
                    size_t at = qkv_at(b, t, h, part, T, NH, HS) + i;
                    dst[j] = fsrc ? fsrc[at] : dsrc[at];
                }
}

// the slopes the ALiBi paper and BLOOM give: 8 heads, 1/2, 1/4, ..., 1/256; 12 heads, those 8
// and then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 (the odd ones of the 16-head sequence); and the
// transformers-style computation for every head of every count up to 128
static void test_alibi_slopes(void) {
    double worst = 0.0;
    for (int h = 0; h < 8; h++) worst = fmax(worst, fabs(alibi_slope(h, 8) - ldexp(1.0, -(h + 1))));
    for (int h = 0; h < 12; h++) {
        double want = h < 8 ? ldexp(1.0, -(h + 1)) : pow(2.0, -0.5 - (h - 8));
        worst = fmax(worst, fabs(alibi_slope(h, 12) - want) / want);
    }
    check(worst <= 2e-7, "alibi_slope: 8 heads 1/2 ... 1/256, 12 heads then 2^-0.5 ... 2^-3.5", "worst relative error %.3g", worst);
    worst = 0.0;
    for (int H = 1; H <= 128; H++)
        for (int h = 0; h < H; h++) worst = fmax(worst, fabs(alibi_slope(h, H) / ref_alibi_slope(h, H) - 1.0));
    check(worst <= 2e-7, "alibi_slope equals BLOOM's rule for every head of 1..128 heads", "worst relative error %.3g", worst);
}

// alibi: none, or these 3 heads as global heads 2..4 of 5 (a tensor rank's share; 5 is not a
// power of two, so head 4 takes BLOOM's extra rule)
static void test_attention(Alibi alibi) {
    const int B = 2, T = 11, NH = 3, HS = 7;
    const char* with = alibi.heads ? " (ALiBi)" : "";
    char name[128];
    const size_t n_qkv = (size_t)B * T * 3 * NH * HS, n_out = (size_t)B * T * NH * HS, n_att = (size_t)B * NH * T * T;
    float* qkv = random_floats(n_qkv, -1.5f, 1.5f);
    float* R = random_floats(n_out, -1, 1);
    AttentionCase a = {doubles_of(qkv, n_qkv), doubles_of(R, n_out), new_doubles(n_out), new_doubles(n_att),
                       B, T, NH, HS, alibi};
    attention_loss(&a);

    // through the name the trainer calls; the CPU backward keeps one datt row per (b, h)
    size_t n_scratch = attention_scratch_elements(B, T, NH, HS);
    check(n_scratch == (size_t)B * NH * T, "attention_scratch_elements is B*NH*T on the CPU", "it is %zu", n_scratch);
    float* scratch = filled_floats(n_scratch, NAN);
    float* out = filled_floats(n_out, NAN);
    float* att = filled_floats(n_att, NAN);
    attention_forward(out, att, NULL, NULL, qkv, B, T, NH, NH, HS, alibi, NO_DROPOUT);   // no lse, no scratch: the C attention
    // scores: 7-term fp32 dot products; softmax over <= 11 terms; then an 11-term weighted
    // sum: each step a few u, all told ~1e-6 of the scale; 1e-5 leaves a decade
    snprintf(name, sizeof(name), "attention_forward out%s", with);
    expect_close(name, out, NULL, a.out, n_out, 1e-5);
    snprintf(name, sizeof(name), "attention_forward att%s", with);
    expect_close(name, att, NULL, a.att, n_att, 1e-5);
    size_t above = 0;
    double worst_row = 0.0;
    for (int r = 0; r < B * NH * T; r++) {
        int t = r % T;
        double s = 0.0;
        for (int t2 = 0; t2 < T; t2++) {
            s += att[(size_t)r * T + t2];
            above += t2 > t && att[(size_t)r * T + t2] != 0.0f;
        }
        if (fabs(s - 1.0) > worst_row) worst_row = fabs(s - 1.0);
    }
    snprintf(name, sizeof(name), "attention_forward att is exactly 0 above the diagonal%s", with);
    check(above == 0, name, "%zu non-zero entries", above);
    // each probability is rounded once or twice and their sum was divided by an fp32 sum of
    // <= 11 terms: within ~(2T + 2) u ~ 1.5e-6 of 1
    snprintf(name, sizeof(name), "attention_forward att rows sum to 1%s", with);
    check(worst_row <= 2e-6, name, "worst |sum - 1| = %.3g", worst_row);
    // selective recomputation's pass: the forward's probabilities again, to the bit
    float* again = filled_floats(n_att, NAN);
    attention_probabilities(again, NULL, qkv, B, T, NH, NH, HS, alibi);
    snprintf(name, sizeof(name), "attention_probabilities gives attention_forward's att, bit for bit%s", with);
    check(memcmp(again, att, n_att * sizeof(float)) == 0, name, "they differ");

    float* dqkv = filled_floats(n_qkv, NAN);  // overwritten: pre-filled with NaN
    attention_backward(dqkv, scratch, R, qkv, out, att, NULL, B, T, NH, NH, HS, alibi, NO_DROPOUT);
    double* fd = new_doubles(n_qkv);
    finite_diff(fd, a.qkv, n_qkv, attention_loss, &a);
    const char* parts[3] = {"dq", "dk", "dv"};
    double *want = new_doubles(n_out), *got = new_doubles(n_out);
    float* got_f = new_floats(n_out);
    for (int part = 0; part < 3; part++) {
        gather_part(want, NULL, fd, part, B, T, NH, HS);
        gather_part(got, dqkv, NULL, part, B, T, NH, HS);
        for (size_t i = 0; i < n_out; i++) got_f[i] = (float)got[i];
        snprintf(name, sizeof(name), "attention_backward %s (overwritten)%s", parts[part], with);
        expect_close(name, got_f, NULL, want, n_out, FD_TOL);
    }
    free_buffers();
}

// Grouped-query attention (G key/value heads, each shared by NH/G query heads) against an
// independent reference: the same qkv expanded to multi-head attention, each group's k and v
// copied to every head of the group, run through the kernels with G = NH (which the finite
// differences above check). The GQA layout is written here from its description, not from
// qkv_index: per token, G groups one after another, each [NH/G queries | k | v], HS wide each.
static size_t gqa_at(int b, int t, int g, int slot, int T, int NH, int G, int HS) {
    return (((size_t)b * T + t) * (NH + 2 * G) + (size_t)g * (NH / G + 2) + slot) * HS;
}

// the GQA qkv as multi-head attention's [q | k | v] per head (qkv_at's layout)
static float* expand_groups(const float* qkv, int B, int T, int NH, int G, int HS) {
    float* mha = new_floats((size_t)B * T * 3 * NH * HS);
    int per = NH / G;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++)
                for (int part = 0; part < 3; part++)
                    memcpy(mha + qkv_at(b, t, h, part, T, NH, HS),
                           qkv + gqa_at(b, t, h / per, part == 0 ? h % per : per + part - 1, T, NH, G, HS), HS * sizeof(float));
    return mha;
}

// Forward: every score, softmax and sum of the GQA run is the MHA run's operation on the same
// numbers in the same order, so out, att and (its backward) dq are equal bit for bit. dk and dv
// of a group: the GQA backward adds the NH/G heads' terms into one fp32 sum, in head order; the
// MHA backward sums each head apart and the test adds the NH/G head sums in double. The same
// products, added in another order: each fp32 addition rounds by u = 2^-24 of the running
// sum, at most (NH/G) T = 42 of them per element here, so ~42 u ~ 2.5e-6 of the terms'
// magnitudes at worst, ~sqrt(42) u ~ 4e-7 as rounding errors add up at random (measured:
// 1.6e-7): 1e-6 of max |want|, while a missing head or query moves an element by O(1/T).
static void test_attention_gqa(int NH, int G, Alibi alibi) {
    const int B = 2, T = 7, HS = 8, per = NH / G;
    char with[64], name[160];
    snprintf(with, sizeof with, " NH=%d G=%d%s", NH, G, alibi.heads ? " (ALiBi)" : "");
    const size_t n_qkv = (size_t)B * T * (NH + 2 * G) * HS, n_mha = (size_t)B * T * 3 * NH * HS;
    const size_t n_out = (size_t)B * T * NH * HS, n_att = (size_t)B * NH * T * T;
    float* qkv = random_floats(n_qkv, -1.5f, 1.5f);
    float* mha = expand_groups(qkv, B, T, NH, G, HS);
    float *out = filled_floats(n_out, NAN), *att = filled_floats(n_att, NAN);
    float *out_mha = filled_floats(n_out, NAN), *att_mha = filled_floats(n_att, NAN);
    attention_forward(out, att, NULL, NULL, qkv, B, T, NH, G, HS, alibi, NO_DROPOUT);
    attention_forward(out_mha, att_mha, NULL, NULL, mha, B, T, NH, NH, HS, alibi, NO_DROPOUT);
    snprintf(name, sizeof name, "GQA attention_forward out = MHA on the expanded k, v, bit for bit%s", with);
    expect_identical(name, out, out_mha, n_out);
    snprintf(name, sizeof name, "GQA attention_forward att = MHA on the expanded k, v, bit for bit%s", with);
    expect_identical(name, att, att_mha, n_att);
    float* again = filled_floats(n_att, NAN);
    attention_probabilities(again, NULL, qkv, B, T, NH, G, HS, alibi);
    snprintf(name, sizeof name, "GQA attention_probabilities gives attention_forward's att, bit for bit%s", with);
    expect_identical(name, again, att, n_att);

    float* dout = random_floats(n_out, -1, 1);
    float *dqkv = filled_floats(n_qkv, NAN), *dmha = filled_floats(n_mha, NAN);   // overwritten
    float* scratch = filled_floats(attention_scratch_elements(B, T, NH, HS), NAN);
    attention_backward(dqkv, scratch, dout, qkv, out, att, NULL, B, T, NH, G, HS, alibi, NO_DROPOUT);
    attention_backward(dmha, scratch, dout, mha, out_mha, att_mha, NULL, B, T, NH, NH, HS, alibi, NO_DROPOUT);
    float *dq = new_floats(n_out), *dq_mha = new_floats(n_out);   // [b, t, h, i]
    size_t n_kv = (size_t)B * T * G * HS;
    float* dkv[2] = {new_floats(n_kv), new_floats(n_kv)};
    double* dkv_want[2] = {new_doubles(n_kv), new_doubles(n_kv)};   // [b, t, g, i]: the heads' sum
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++)
                for (int i = 0; i < HS; i++) {
                    size_t o = (((size_t)b * T + t) * NH + h) * HS + i, kv = (((size_t)b * T + t) * G + h / per) * HS + i;
                    dq[o] = dqkv[gqa_at(b, t, h / per, h % per, T, NH, G, HS) + i];
                    dq_mha[o] = dmha[qkv_at(b, t, h, 0, T, NH, HS) + i];
                    for (int part = 1; part < 3; part++) {
                        dkv[part - 1][kv] = dqkv[gqa_at(b, t, h / per, per + part - 1, T, NH, G, HS) + i];
                        dkv_want[part - 1][kv] += dmha[qkv_at(b, t, h, part, T, NH, HS) + i];
                    }
                }
    snprintf(name, sizeof name, "GQA attention_backward dq = MHA's, bit for bit%s", with);
    expect_identical(name, dq, dq_mha, n_out);
    for (int part = 0; part < 2; part++) {
        snprintf(name, sizeof name, "GQA attention_backward %s = the sum of the group's heads' in MHA%s", part ? "dv" : "dk", with);
        expect_close(name, dkv[part], NULL, dkv_want[part], n_kv, 1e-6);
    }
    free_buffers();
}

// generation's attention: one sequence (B = 1) decoded in pieces of 1, 3, 2 and 5 rows, each
// piece's keys and values appended to a cache whose rows not yet written hold NaN (a read past
// the causal limit shows), against attention_forward on the whole sequence at once: the same
// scores, softmax and sums in another order, ~1e-6 of the scale like attention_forward itself.
// With G < NH, query heads share their group's cached key and value.
static void test_attention_decode(int NH, int G, Alibi alibi) {
    const int T = 11, HS = 7, pieces[4] = {1, 3, 2, 5}, row = (NH + 2 * G) * HS;
    char with[64], name[160];
    snprintf(with, sizeof with, " NH=%d G=%d%s", NH, G, alibi.heads ? " (ALiBi)" : "");
    float* qkv = random_floats((size_t)T * row, -1.5f, 1.5f);
    float *want = new_floats((size_t)T * NH * HS), *att = new_floats((size_t)NH * T * T);
    attention_forward(want, att, NULL, NULL, qkv, 1, T, NH, G, HS, alibi, NO_DROPOUT);
    float *cache = filled_floats((size_t)T * 2 * G * HS, NAN), *got = filled_floats((size_t)T * NH * HS, NAN);
    for (int k = 0, pos0 = 0; k < 4; pos0 += pieces[k++]) {
        kv_cache_append(cache, qkv + (size_t)pos0 * row, pieces[k], pos0, NH, G, HS);
        attention_decode(got + (size_t)pos0 * NH * HS, cache, qkv + (size_t)pos0 * row, pieces[k], pos0, NH, G, HS, alibi);
    }
    double* want_d = doubles_of(want, (size_t)T * NH * HS);
    snprintf(name, sizeof(name), "attention_decode over a KV cache, in pieces of 1, 3, 2, 5 rows = attention_forward%s", with);
    expect_close(name, got, NULL, want_d, (size_t)T * NH * HS, 1e-5);
    // the cache holds each position's group keys and values as they were in qkv: a row is the
    // G keys side by side, then the G values
    size_t wrong = 0;
    for (int t = 0; t < T; t++)
        for (int g = 0; g < G; g++)
            for (int d = 0; d < HS; d++)
                for (int which = 0; which < 2; which++)
                    wrong += cache[((size_t)t * 2 + which) * G * HS + (size_t)g * HS + d] !=
                             qkv[gqa_at(0, t, g, NH / G + which, T, NH, G, HS) + d];
    snprintf(name, sizeof(name), "kv_cache_append: every position's keys and values, exactly%s", with);
    check(wrong == 0, name, "%zu elements differ", wrong);
    free_buffers();
}

// ----------------------------------------------------------------------------
// rotary position embedding on the grouped qkv rows: per token, G groups of [NH/G queries, k, v]

typedef struct { int B, T, NH, G, HS, r, pos0; float base; } RopeShape;

static size_t rope_row(RopeShape s) { return (size_t)(s.NH + 2 * s.G) * s.HS; }

// the offset of head `slot` of group g of token n, counted here from the layout's description;
// *kind: 0 a query, 1 the group's k, 2 its v
static size_t ref_group_head(RopeShape s, int n, int g, int slot, int* kind) {
    int q_per_group = s.NH / s.G;
    *kind = slot < q_per_group ? 0 : slot - q_per_group + 1;
    return n * rope_row(s) + (size_t)(g * (q_per_group + 2) + slot) * s.HS;
}

// every q and k head of token n (position pos0 + n % T) turned by `sign` times the angle, in double
static void ref_rope(double* x, RopeShape s, int sign) {
    int half = s.r / 2;
    for (int n = 0; n < s.B * s.T; n++)
        for (int g = 0; g < s.G; g++)
            for (int slot = 0; slot < s.NH / s.G + 2; slot++) {
                int kind;
                double* h = x + ref_group_head(s, n, g, slot, &kind);
                if (kind == 2) continue;   // v is not rotated
                for (int i = 0; i < half; i++) {
                    double theta = sign * (s.pos0 + n % s.T) * pow((double)s.base, -2.0 * i / s.r);
                    double x1 = h[i], x2 = h[i + half];
                    h[i] = x1 * cos(theta) - x2 * sin(theta);
                    h[i + half] = x2 * cos(theta) + x1 * sin(theta);
                }
            }
}

static void test_rope(RopeShape s) {
    char label[160], name[320];
    snprintf(label, sizeof label, "B=%d T=%d NH=%d G=%d HS=%d rotary_dims=%d pos0=%d", s.B, s.T, s.NH, s.G, s.HS,
             s.r, s.pos0);
    const size_t n = (size_t)s.B * s.T * rope_row(s);
    // The kernel's angle is fp32: position p times the fp32 inv_freq, each rounded (u = 2^-24
    // relative), so off by up to ~2 p u radians from the exact one; its sines by that, and a
    // few u more from the products: 3 p_max u + 1e-6 of the largest value.
    const double tol = 3.0 * (s.pos0 + s.T) / 16777216.0 + 1e-6;
    float* x = random_floats(n, -1, 1);
    float* y = random_floats(n, -1, 1);
    double* want = doubles_of(x, n);
    ref_rope(want, s, 1);
    float* fx = copy_floats(x, n);
    rope_forward_cpu(fx, s.B, s.T, s.NH, s.G, s.HS, s.r, s.base, s.pos0);
    snprintf(name, sizeof name, "rope_forward %s", label);
    expect_close(name, fx, NULL, want, n, tol);
    double* want_b = doubles_of(y, n);
    ref_rope(want_b, s, -1);
    float* by = copy_floats(y, n);
    rope_backward_cpu(by, s.B, s.T, s.NH, s.G, s.HS, s.r, s.base, s.pos0);
    snprintf(name, sizeof name, "rope_backward %s", label);
    expect_close(name, by, NULL, want_b, n, tol);

    // what is not rotated keeps its bits: v heads, and dims [r, HS) of q and k
    size_t changed = 0;
    for (int t = 0; t < s.B * s.T; t++)
        for (int g = 0; g < s.G; g++)
            for (int slot = 0; slot < s.NH / s.G + 2; slot++) {
                int kind;
                size_t h = ref_group_head(s, t, g, slot, &kind);
                for (int d = kind == 2 ? 0 : s.r; d < s.HS; d++) changed += memcmp(&fx[h + d], &x[h + d], sizeof(float)) != 0;
            }
    snprintf(name, sizeof name, "rope_forward leaves v and dims past rotary_dims alone %s", label);
    check(changed == 0, name, "%zu values changed", changed);

    // the exact adjoint: <rope(x), y> = <x, rope_backward(y)> (both fp32 sums of n products
    // of rotated values: ~1e-6 relative to the sum of |terms|)
    double lhs = 0.0, rhs = 0.0, mag = 0.0;
    for (size_t i = 0; i < n; i++) {
        lhs += (double)fx[i] * y[i];
        rhs += (double)x[i] * by[i];
        mag += fabs((double)x[i] * y[i]);
    }
    snprintf(name, sizeof name, "rope_backward is rope_forward's transpose: <rope(x), y> = <x, rope_backward(y)> %s", label);
    check(fabs(lhs - rhs) <= 1e-6 * mag, name, "%.9g vs %.9g (sum of |terms| %.3g)", lhs, rhs, mag);
    // rotating back gives the input: cos^2 + sin^2 = 1 to a few u in fp32
    float* back = copy_floats(fx, n);
    rope_backward_cpu(back, s.B, s.T, s.NH, s.G, s.HS, s.r, s.base, s.pos0);
    double* xd = doubles_of(x, n);
    snprintf(name, sizeof name, "rope_backward(rope_forward(x)) = x %s", label);
    expect_close(name, back, NULL, xd, n, 1e-6);
    free_buffers();
}

// The property RoPE is for: after rotation, a query at position m and a key at position m2 have
// a dot product that depends on m - m2 alone. Token 0's query heads and token 1's k heads,
// turned at positions (p, p + 1) for p = 0, 5, 29, 100: each head's q.k is the same for every p.
static void test_rope_relative(void) {
    RopeShape s = {1, 2, 4, 2, 16, 16, 0, 10000.0f};
    const size_t n = 2 * rope_row(s);
    float* x = random_floats(n, -1, 1);
    double first[4] = {0}, worst = 0.0, mag = 0.0;
    const int starts[4] = {0, 5, 29, 100};
    for (int k = 0; k < 4; k++) {
        s.pos0 = starts[k];
        float* r = copy_floats(x, n);
        rope_forward_cpu(r, s.B, s.T, s.NH, s.G, s.HS, s.r, s.base, s.pos0);
        for (int h = 0; h < s.NH; h++) {
            int g = h / (s.NH / s.G);
            const float* q = r + qkv_group_index(0, 0, g, h % (s.NH / s.G), s.T, s.NH, s.G, s.HS);
            const float* kk = r + qkv_group_index(0, 1, g, s.NH / s.G, s.T, s.NH, s.G, s.HS);
            double d = 0.0, m = 0.0;
            for (int i = 0; i < s.HS; i++) d += (double)q[i] * kk[i], m += fabs((double)q[i] * kk[i]);
            if (k == 0) first[h] = d;
            if (fabs(d - first[h]) > worst) worst = fabs(d - first[h]);
            if (m > mag) mag = m;
        }
    }
    // the angles at position 101 are fp32 products (3 p u, as above): 1e-5 of the sum of |terms|
    check(worst <= 1e-5 * mag, "rope: q.k of positions (p, p + 1) is the same for p = 0, 5, 29, 100",
          "q.k moved by %.3g (sum of |terms| %.3g)", worst, mag);
    // and it does depend on the distance: a key one position further changes it
    float* r = copy_floats(x, n);
    rope_forward_cpu(r, 1, 1, s.NH, s.G, s.HS, s.r, s.base, 0);   // token 0 at position 0
    rope_forward_cpu(r + rope_row(s), 1, 1, s.NH, s.G, s.HS, s.r, s.base, 2);   // token 1 at 2, not 1
    const float* q = r + qkv_group_index(0, 0, 0, 0, s.T, s.NH, s.G, s.HS);
    const float* kk = r + qkv_group_index(0, 1, 0, s.NH / s.G, s.T, s.NH, s.G, s.HS);
    double d = 0.0;
    for (int i = 0; i < s.HS; i++) d += (double)q[i] * kk[i];
    check(fabs(d - first[0]) > 1e-3 * mag, "rope: q.k changes with the distance", "%.9g vs %.9g", d, first[0]);
    // the indices against the layouts as written here: with G = NH, head h's [q | k | v]
    // (qkv_at); with G < NH, query head h's q and its group's k and v (gqa_at)
    size_t differ = 0;
    for (int h = 0; h < 3; h++)
        for (int which = 0; which < 3; which++)
            differ += qkv_group_index(1, 2, h, which, 5, 3, 3, 7) != qkv_at(1, 2, h, which, 5, 3, 7) ||
                      qkv_index(1, 2, h, which, 5, 3, 3, 7) != qkv_at(1, 2, h, which, 5, 3, 7);
    const int groups[3] = {1, 2, 6};   // of 6 heads
    for (int k = 0; k < 3; k++) {
        int G = groups[k], per = 6 / G;
        for (int h = 0; h < 6; h++)
            for (int which = 0; which < 3; which++)
                differ += qkv_index(1, 2, h, which, 5, 6, G, 7) !=
                          gqa_at(1, 2, h / per, which == 0 ? h % per : per + which - 1, 5, 6, G, 7);
    }
    check(differ == 0, "qkv_group_index and qkv_index: per head [q | k | v] when G = NH, groups of [queries | k | v]",
          "%zu offsets differ", differ);
    free_buffers();
}

// ----------------------------------------------------------------------------
// exp_poly, the exp of the softmaxes, GELU and SwiGLU: against exp in double, in units in the
// last place of the float result (ulp: the spacing of floats at exp(x)). Every 61st float of
// [-87, 88] (35 million, of all orders of magnitude): Cephes's polynomial is good to about 1
// ulp (measured 1.02; glibc's expf 0.50); 1.5 leaves a margin, while a wrong coefficient or a
// k off by one is off by thousands. Then the edges: 0 below -87, +inf above 88, NaN kept.

static void test_exp_poly(void) {
    double worst = 0.0;
    float worst_x = 0.0f;
    uint32_t first, last;
    float lo = -87.0f, hi = 88.0f;
    memcpy(&first, &lo, 4);   // negative floats: the bits grow as the value falls
    memcpy(&last, &hi, 4);
    for (int side = 0; side < 2; side++)
        for (uint32_t b = side ? 0 : 0x80000000u; side ? b <= last : b <= first; b += 61) {
            float x;
            memcpy(&x, &b, 4);
            double want = exp((double)x);
            int e;
            frexp(want, &e);
            double ulps = fabs(exp_poly(x) - want) / ldexp(1.0, e - 24);
            if (ulps > worst) worst = ulps, worst_x = x;
        }
    check(worst <= 1.5, "exp_poly within 1.5 ulp of exp over [-87, 88]", "%.3g ulp at x = %.9g", worst, worst_x);
    check(exp_poly(0.0f) == 1.0f && exp_poly(-87.5f) == 0.0f && exp_poly(-INFINITY) == 0.0f &&
              exp_poly(88.5f) == INFINITY && exp_poly(INFINITY) == INFINITY && isnan(exp_poly(NAN)),
          "exp_poly: exp(0) = 1; 0 below -87, +inf above 88, NaN stays NaN", "an edge differs");
}

// ----------------------------------------------------------------------------
// GELU, both forms, against double precision and finite differences: the tanh approximation
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) and the exact 0.5 x (1 + erf(x / sqrt(2)))

typedef struct { double *inp, *R, *out; size_t n; GeluForm form; } GeluCase;

static double ref_gelu(double x, GeluForm form) {
    if (form == GELU_ERF) return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
static double gelu_loss(const void* p) {
    const GeluCase* g = p;
    for (size_t i = 0; i < g->n; i++) g->out[i] = ref_gelu(g->inp[i], g->form);
    return dot(g->out, g->R, g->n);
}

static void test_gelu(GeluForm form) {
    const size_t n = 37 * 45;
    const char* name[2][3] = {{"gelu_forward", "gelu_backward", "gelu_backward in place (dinp == dout) gives the same bits"},
                              {"gelu_erf_forward", "gelu_erf_backward", "gelu_erf_backward in place (dinp == dout) gives the same bits"}};
    float* inp = random_floats(n, -5, 5);
    float* R = random_floats(n, -1, 1);
    GeluCase g = {doubles_of(inp, n), doubles_of(R, n), new_doubles(n), n, form};
    gelu_loss(&g);
    float* out = new_floats(n);
    (form == GELU_ERF ? gelu_erf_forward_cpu : gelu_forward_cpu)(out, inp, n);
    // tanh (or erf) and a few products: a few u of each value (|out| <= 5): 1e-6 of max |out|
    expect_close(name[form][0], out, NULL, g.out, n, 1e-6);
    // the two forms differ by up to about 5e-4 (near |x| = 2): each test tells them apart
    if (form == GELU_ERF) {
        float* tanh_form = new_floats(n);
        gelu_forward_cpu(tanh_form, inp, n);
        double most = 0.0;
        for (size_t i = 0; i < n; i++) most = fmax(most, fabs((double)tanh_form[i] - out[i]));
        check(most > 1e-4, "gelu_erf_forward is not the tanh form", "they differ by at most %.3g", most);
    }

    void (*backward)(float*, const float*, const float*, size_t) = form == GELU_ERF ? gelu_erf_backward_cpu : gelu_backward_cpu;
    float* dinp = filled_floats(n, NAN);
    backward(dinp, inp, R, n);
    double* fd = new_doubles(n);
    finite_diff(fd, g.inp, n, gelu_loss, &g);
    expect_close(name[form][1], dinp, NULL, fd, n, FD_TOL);
    float* inplace = copy_floats(R, n);  // the trainer's call: dinp is dout's buffer
    backward(inplace, inp, inplace, n);
    expect_identical(name[form][2], inplace, dinp, n);
    free_buffers();
}

// ----------------------------------------------------------------------------
// SwiGLU: out[n, j] = silu(a) * b, a = inp[n, j] (the gate, first F columns), b = inp[n, F + j]

typedef struct { double *inp, *R, *out; int N, F; } SwiGLUCase;

static double swiglu_loss(const void* p) {
    const SwiGLUCase* s = p;
    for (int n = 0; n < s->N; n++)
        for (int j = 0; j < s->F; j++) {
            double a = s->inp[(size_t)n * 2 * s->F + j], b = s->inp[(size_t)n * 2 * s->F + s->F + j];
            s->out[(size_t)n * s->F + j] = a / (1.0 + exp(-a)) * b;
        }
    return dot(s->out, s->R, (size_t)s->N * s->F);
}

static void test_swiglu(void) {
    const int N = 37, F = 29;
    float* inp = random_floats((size_t)N * 2 * F, -6, 6);   // both tails of the sigmoid
    float* R = random_floats((size_t)N * F, -1, 1);
    SwiGLUCase s = {doubles_of(inp, (size_t)N * 2 * F), doubles_of(R, (size_t)N * F), new_doubles((size_t)N * F), N, F};
    swiglu_loss(&s);
    float* out = new_floats((size_t)N * F);
    swiglu_forward_cpu(out, inp, N, F);
    // expf and three fp32 operations: a few u of each value: 1e-6 of max |out|
    expect_close("swiglu_forward", out, NULL, s.out, (size_t)N * F, 1e-6);
    float* dinp = filled_floats((size_t)N * 2 * F, NAN);   // overwritten, every element
    swiglu_backward_cpu(dinp, inp, R, N, F);
    double* fd = new_doubles((size_t)N * 2 * F);
    finite_diff(fd, s.inp, (size_t)N * 2 * F, swiglu_loss, &s);
    expect_close("swiglu_backward d[a|b]", dinp, NULL, fd, (size_t)N * 2 * F, FD_TOL);
    free_buffers();
}

// ----------------------------------------------------------------------------
// the mixture-of-experts layer (kernels/moe.cuh): the router against softmax and a sort of each
// row written here, the counting sort by its properties, gather and combine against the layer's
// sum over (token, slot) with no sort in it, every backward by finite differences of a loss built
// from the forward, the aux and z losses against their formulas (and Hugging Face's form)

// a row's top k by insertion sort of the indices on (logit descending, index ascending)
static void ref_topk(int* chosen, const float* l, int E, int k) {
    int idx[256];
    for (int e = 0; e < E; e++) {
        int b = e;
        for (; b > 0 && (l[idx[b - 1]] < l[e] || (l[idx[b - 1]] == l[e] && idx[b - 1] > e)); b--) idx[b] = idx[b - 1];
        idx[b] = e;
    }
    for (int j = 0; j < k; j++) chosen[j] = idx[j];
}

// token t's probabilities, lse and weights in double, the chosen experts given
static double ref_router_row(double* p, double* w, const double* l, const int* chosen, int E, int k, int pre_softmax) {
    double m = -INFINITY, sum = 0.0, sum_k = 0.0;
    for (int e = 0; e < E; e++) m = fmax(m, l[e]);
    for (int e = 0; e < E; e++) sum += exp(l[e] - m);
    for (int e = 0; e < E; e++) p[e] = exp(l[e] - m) / sum;
    for (int j = 0; j < k; j++) sum_k += exp(l[chosen[j]]);
    for (int j = 0; j < k; j++) w[j] = pre_softmax ? p[chosen[j]] : exp(l[chosen[j]]) / sum_k;
    return m + log(sum);
}

// L = sum_tj w_tj R_tj + aux + z, the top k (chosen) and the counts held fixed
typedef struct {
    double *logits, *R, *p, *w;
    const int *chosen, *counts;
    int N, E, k, pre_softmax, aux_tokens;
    double aux_coeff, z_coeff;
} RouterCase;

static double router_loss(const void* ctx) {
    const RouterCase* r = ctx;
    double L = 0.0, pc = 0.0, l2 = 0.0;
    for (int t = 0; t < r->N; t++) {
        double lse = ref_router_row(r->p, r->w, r->logits + (size_t)t * r->E, r->chosen + (size_t)t * r->k, r->E, r->k,
                                    r->pre_softmax);
        for (int j = 0; j < r->k; j++) L += r->w[j] * r->R[(size_t)t * r->k + j];
        for (int e = 0; e < r->E; e++) pc += r->p[e] * r->counts[e];
        l2 += lse * lse;
    }
    double T = r->aux_tokens;
    return L + r->aux_coeff * r->E / (T * T * r->k) * pc + r->z_coeff / T * l2;
}

static void test_moe_router(int N, int E, int k, int pre_softmax, int ties) {
    char name[192], shape[64];
    snprintf(shape, sizeof shape, " N=%d E=%d k=%d pre_softmax=%d%s", N, E, k, pre_softmax, ties ? " ties" : "");
    float* logits = random_floats((size_t)N * E, -3, 3);
    if (ties)   // logits from {-1, -0.5, 0, 0.5, 1}: many ties; row 0 all the same
        for (size_t i = 0; i < (size_t)N * E; i++) logits[i] = i < (size_t)E ? 0.25f : 0.5f * (float)(rand_int(5) - 2);
    float *probs = filled_floats((size_t)N * E, NAN), *w = filled_floats((size_t)N * k, NAN), *lse = filled_floats(N, NAN);
    int* chosen = new_buffer((size_t)N * k * sizeof(int));
    moe_router_forward_cpu(probs, chosen, w, lse, logits, N, E, k, pre_softmax);

    int* want_chosen = new_buffer((size_t)N * k * sizeof(int));
    double *want_p = new_doubles((size_t)N * E), *want_w = new_doubles((size_t)N * k), *want_lse = new_doubles(N);
    double* l = doubles_of(logits, (size_t)N * E);
    for (int t = 0; t < N; t++) {
        ref_topk(want_chosen + (size_t)t * k, logits + (size_t)t * E, E, k);
        want_lse[t] = ref_router_row(want_p + (size_t)t * E, want_w + (size_t)t * k, l + (size_t)t * E,
                                     want_chosen + (size_t)t * k, E, k, pre_softmax);
    }
    snprintf(name, sizeof name, "moe_router_forward top-k (descending, ties to the lower expert)%s", shape);
    check(memcmp(chosen, want_chosen, (size_t)N * k * sizeof(int)) == 0, name, "the experts differ");
    // expf and a sum of E terms: a few u
    snprintf(name, sizeof name, "moe_router_forward probs%s", shape);
    expect_close(name, probs, NULL, want_p, (size_t)N * E, 1e-6);
    snprintf(name, sizeof name, "moe_router_forward lse%s", shape);
    expect_close(name, lse, NULL, want_lse, N, 1e-6);
    snprintf(name, sizeof name, "moe_router_forward weights%s", shape);
    expect_close(name, w, NULL, want_w, (size_t)N * k, 1e-6);
    if (ties) {   // row 0, all equal: experts 0 .. k-1, weights 1/k (the k chosen) or 1/E (all)
        int first = 1;
        for (int j = 0; j < k; j++)
            first &= chosen[j] == j && fabsf(w[j] - (pre_softmax ? 1.0f / E : 1.0f / k)) < 1e-6f;
        snprintf(name, sizeof name, "moe_router_forward a row of equal logits: experts 0..k-1, equal weights%s", shape);
        check(first, name, "experts %d %d, weight %g", chosen[0], chosen[1], w[0]);
    }

    // the backward: dweight = R, the aux loss and the z loss, each alone and all together; the
    // global token count 3 N once (a caller's --global count)
    int* counts = new_buffer((size_t)E * sizeof(int));
    moe_expert_counts_cpu(counts, chosen, N, k, E);
    float* R = random_floats((size_t)N * k, -1, 1);
    const double mix[4][3] = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}, {1, 0.5, 0.3}};
    for (int m = 0; m < 4; m++) {
        float* Rm = new_floats((size_t)N * k);
        for (size_t i = 0; i < (size_t)N * k; i++) Rm[i] = (float)mix[m][0] * R[i];
        int aux_tokens = m == 3 ? 3 * N : N;
        RouterCase rc = {l, doubles_of(Rm, (size_t)N * k), new_doubles(E), new_doubles(k), chosen, counts, N, E, k,
                         pre_softmax, aux_tokens, mix[m][1], mix[m][2]};
        float* dlogits = filled_floats((size_t)N * E, NAN);
        moe_router_backward_cpu(dlogits, Rm, probs, lse, chosen, w, counts, N, E, k, pre_softmax, (float)mix[m][1],
                                (float)mix[m][2], aux_tokens);
        double* fd = new_doubles((size_t)N * E);
        finite_diff(fd, l, (size_t)N * E, router_loss, &rc);
        snprintf(name, sizeof name, "moe_router_backward (%s)%s",
                 m == 0 ? "dweight" : m == 1 ? "aux loss" : m == 2 ? "z-loss" : "all three, aux_tokens 3N", shape);
        expect_close(name, dlogits, NULL, fd, (size_t)N * E, FD_TOL);
    }

    // the losses' values, added into what *aux and *z held, against the formulas from the double
    // probabilities and counts made here
    int* want_counts = new_buffer((size_t)E * sizeof(int));
    for (size_t i = 0; i < (size_t)N * k; i++) want_counts[want_chosen[i]]++;
    double aux = 0.25, z = 0.5, pc = 0.0, l2 = 0.0, hf = 0.0;
    const float aux_coeff = 0.01f, z_coeff = 0.001f;
    moe_aux_loss_cpu(&aux, &z, probs, lse, counts, N, E, k, aux_coeff, z_coeff, N);
    for (int e = 0; e < E; e++) {
        double P = 0.0;
        for (int t = 0; t < N; t++) P += want_p[(size_t)t * E + e];
        pc += P * want_counts[e];
        // Hugging Face's load_balancing_loss_func: E sum_j sum_e mean_t(one-hot of slot j) mean_t(p)
        for (int j = 0; j < k; j++) {
            double slot = 0.0;
            for (int t = 0; t < N; t++) slot += want_chosen[(size_t)t * k + j] == e;
            hf += E * (slot / N) * (P / N);
        }
    }
    for (int t = 0; t < N; t++) l2 += want_lse[t] * want_lse[t];
    double want_aux = (double)aux_coeff * E / ((double)N * N * k) * pc, want_z = (double)z_coeff / N * l2;
    snprintf(name, sizeof name, "moe_aux_loss aux (+=)%s", shape);
    check(fabs(aux - 0.25 - want_aux) <= 1e-6 * want_aux, name, "got %.9g, want %.9g", aux - 0.25, want_aux);
    snprintf(name, sizeof name, "moe_aux_loss z (+=)%s", shape);
    check(fabs(z - 0.5 - want_z) <= 1e-6 * want_z, name, "got %.9g, want %.9g", z - 0.5, want_z);
    snprintf(name, sizeof name, "Hugging Face's load-balancing loss is k x Megatron's without the coefficient%s", shape);
    check(fabs(hf - k * want_aux / aux_coeff) <= 1e-9 * hf, name, "%.12g vs %.12g", hf, k * want_aux / aux_coeff);
    free_buffers();
}

// the sort by its properties, on choices that leave one expert out (no rows)
static void test_moe_sort(int N, int E, int k) {
    char name[128], shape[48];
    snprintf(shape, sizeof shape, " N=%d E=%d k=%d", N, E, k);
    int *choices = new_buffer((size_t)N * k * sizeof(int)), *counts = new_buffer((size_t)E * sizeof(int));
    int *order = new_buffer((size_t)N * k * sizeof(int)), *position = new_buffer((size_t)N * k * sizeof(int));
    int* offsets = new_buffer((size_t)(E + 1) * sizeof(int));
    for (int t = 0; t < N; t++)   // k distinct experts a token, never expert E - 2
        for (int j = 0; j < k; j++) {
            int e, again;
            do {
                e = rand_int(E - 1);
                e = e == E - 2 ? E - 1 : e;
                again = 0;
                for (int i = 0; i < j; i++) again |= choices[(size_t)t * k + i] == e;
            } while (again);
            choices[(size_t)t * k + j] = e;
        }
    moe_expert_counts_cpu(counts, choices, N, k, E);
    moe_sort_tokens_cpu(order, position, offsets, choices, N, k, E);
    int counts_right = 1, offsets_right = offsets[0] == 0 && offsets[E] == N * k, inverse = 1, grouped = 1, stable = 1;
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int c = 0; c < N * k; c++) n += choices[c] == e;
        counts_right &= counts[e] == n;
        offsets_right &= offsets[e + 1] - offsets[e] == n;
        for (int r = offsets[e]; r < offsets[e + 1] && offsets_right; r++) {
            grouped &= choices[order[r]] == e;
            stable &= r == offsets[e] || order[r] > order[r - 1];
        }
    }
    for (int r = 0; r < N * k; r++) inverse &= order[r] >= 0 && order[r] < N * k && position[order[r]] == r;
    snprintf(name, sizeof name, "moe_expert_counts%s", shape);
    check(counts_right && counts[E - 2] == 0, name, "a count is wrong");
    snprintf(name, sizeof name, "moe_sort_tokens offsets: 0, each expert's count, N k%s", shape);
    check(offsets_right, name, "offsets wrong");
    snprintf(name, sizeof name, "moe_sort_tokens order and position: inverse permutations%s", shape);
    check(inverse, name, "position[order[r]] != r somewhere");
    snprintf(name, sizeof name, "moe_sort_tokens each expert's rows hold its choices, in (t, j) order%s", shape);
    check(grouped && stable, name, "grouped %d, stable %d", grouped, stable);
    free_buffers();
}

// The layer's routed part in double, indexed by (token, slot) with no sort: an "expert" e that
// scales x[t] by a[e] column by column, out[t] = sum_j w[t, j] a[e_tj] * x[t]; L = sum out * R.
typedef struct { double *x, *w, *a, *R, *out; const int* chosen; int N, k, C; } CombineCase;

static double combine_loss(const void* ctx) {
    const CombineCase* s = ctx;
    for (int t = 0; t < s->N; t++)
        for (int c = 0; c < s->C; c++) {
            double o = 0.0;
            for (int j = 0; j < s->k; j++) {
                size_t choice = (size_t)t * s->k + j;
                o += s->w[choice] * s->a[(size_t)s->chosen[choice] * s->C + c] * s->x[(size_t)t * s->C + c];
            }
            s->out[(size_t)t * s->C + c] = o;
        }
    return dot(s->out, s->R, (size_t)s->N * s->C);
}

static void test_moe_combine(int N, int E, int k, int C) {
    char name[128], shape[48];
    snprintf(shape, sizeof shape, " N=%d E=%d k=%d C=%d", N, E, k, C);
    size_t rows = (size_t)N * k;
    float *logits = random_floats((size_t)N * E, -2, 2), *probs = new_floats((size_t)N * E), *lse = new_floats(N);
    float *w = new_floats(rows), *x = random_floats((size_t)N * C, -1, 1), *a = random_floats((size_t)E * C, -2, 2);
    float* R = random_floats((size_t)N * C, -1, 1);
    int *chosen = new_buffer(rows * sizeof(int)), *order = new_buffer(rows * sizeof(int));
    int *position = new_buffer(rows * sizeof(int)), *offsets = new_buffer((size_t)(E + 1) * sizeof(int));
    moe_router_forward_cpu(probs, chosen, w, lse, logits, N, E, k, 0);
    moe_sort_tokens_cpu(order, position, offsets, chosen, N, k, E);
    float *xs = filled_floats(rows * C, NAN), *ys = new_floats(rows * C), *out = filled_floats((size_t)N * C, NAN);
    moe_gather_rows_cpu(xs, x, order, (int)rows, k, C);
    int gathered = 1;
    for (size_t r = 0; r < rows; r++) gathered &= memcmp(xs + r * C, x + (size_t)(order[r] / k) * C, C * sizeof(float)) == 0;
    snprintf(name, sizeof name, "moe_gather_rows: row r is x[order[r] / k]%s", shape);
    check(gathered, name, "a row differs");
    for (size_t r = 0; r < rows; r++)   // the experts: row r through the expert of its choice
        for (int c = 0; c < C; c++) ys[r * C + c] = a[(size_t)chosen[order[r]] * C + c] * xs[r * C + c];
    moe_combine_cpu(out, ys, w, position, N, k, C);
    CombineCase s = {doubles_of(x, (size_t)N * C), doubles_of(w, rows), doubles_of(a, (size_t)E * C),
                     doubles_of(R, (size_t)N * C), new_doubles((size_t)N * C), chosen, N, k, C};
    combine_loss(&s);
    snprintf(name, sizeof name, "moe_combine%s", shape);
    expect_close(name, out, NULL, s.out, (size_t)N * C, 1e-6);

    // backward: combine's, the experts' (dxs = a * dys), the gather's, against the loss's finite
    // differences in x and in the weights
    float *dys = filled_floats(rows * C, NAN), *dweight = filled_floats(rows, NAN), *dxs = new_floats(rows * C);
    moe_combine_backward_cpu(dys, dweight, R, ys, w, position, N, k, C);
    for (size_t r = 0; r < rows; r++)
        for (int c = 0; c < C; c++) dxs[r * C + c] = a[(size_t)chosen[order[r]] * C + c] * dys[r * C + c];
    float *dx = filled_floats((size_t)N * C, NAN), *base = random_floats((size_t)N * C, -1, 1);
    float* dx_acc = copy_floats(base, (size_t)N * C);
    moe_gather_rows_backward_cpu(dx, dxs, position, N, k, C, 0);
    moe_gather_rows_backward_cpu(dx_acc, dxs, position, N, k, C, 1);
    double *fd_x = new_doubles((size_t)N * C), *fd_w = new_doubles(rows);
    finite_diff(fd_x, s.x, (size_t)N * C, combine_loss, &s);
    finite_diff(fd_w, s.w, rows, combine_loss, &s);
    snprintf(name, sizeof name, "moe_combine_backward dweight%s", shape);
    expect_close(name, dweight, NULL, fd_w, rows, FD_TOL);
    snprintf(name, sizeof name, "moe_combine_backward + moe_gather_rows_backward dx%s", shape);
    expect_close(name, dx, NULL, fd_x, (size_t)N * C, FD_TOL);
    snprintf(name, sizeof name, "moe_gather_rows_backward dx (+=)%s", shape);
    expect_close(name, dx_acc, base, fd_x, (size_t)N * C, FD_TOL);
    free_buffers();
}

// out = base + sigmoid(g) y; L = sum out * R
typedef struct { double *y, *g, *R, *out; const float* base; int N, C; } SharedGateCase;

static double shared_gate_loss(const void* ctx) {
    const SharedGateCase* s = ctx;
    for (int t = 0; t < s->N; t++)
        for (int c = 0; c < s->C; c++) {
            size_t i = (size_t)t * s->C + c;
            s->out[i] = s->base[i] + s->y[i] / (1.0 + exp(-s->g[t]));
        }
    return dot(s->out, s->R, (size_t)s->N * s->C);
}

static void test_moe_shared_gate(void) {
    const int N = 11, C = 13;
    float *base = random_floats((size_t)N * C, -1, 1), *y = random_floats((size_t)N * C, -1, 1);
    float *g = random_floats(N, -4, 4), *R = random_floats((size_t)N * C, -1, 1), *out = copy_floats(base, (size_t)N * C);
    SharedGateCase s = {doubles_of(y, (size_t)N * C), doubles_of(g, N), doubles_of(R, (size_t)N * C),
                        new_doubles((size_t)N * C), base, N, C};
    shared_gate_loss(&s);
    moe_shared_gate_forward_cpu(out, y, g, N, C);
    expect_close("moe_shared_gate_forward (+=)", out, NULL, s.out, (size_t)N * C, 1e-6);
    float *dy = filled_floats((size_t)N * C, NAN), *dg = filled_floats(N, NAN);
    moe_shared_gate_backward_cpu(dy, dg, R, y, g, N, C);
    double *fd_y = new_doubles((size_t)N * C), *fd_g = new_doubles(N);
    finite_diff(fd_y, s.y, (size_t)N * C, shared_gate_loss, &s);
    finite_diff(fd_g, s.g, N, shared_gate_loss, &s);
    expect_close("moe_shared_gate_backward dshared_y", dy, NULL, fd_y, (size_t)N * C, FD_TOL);
    expect_close("moe_shared_gate_backward dgate_logit", dg, NULL, fd_g, N, FD_TOL);
    free_buffers();
}

// ----------------------------------------------------------------------------
// cross-entropy: loss[n] = logsumexp over the real vocabulary of logits[n] - logits[n][target]
// The vocabulary has 50 real columns padded to 56 (divisible by 4 x TP for TP = 2); a
// vocab-parallel run gives each of 2 ranks 28 columns, the second rank's last 6 padding.

typedef struct { double* logits; const int* targets; int N, V, valid; double dloss; } CrossEntropyCase;

static double ref_crossentropy(const double* l, int target, int valid) {
    double max = -INFINITY, sum = 0.0;
    for (int v = 0; v < valid; v++) max = l[v] > max ? l[v] : max;
    for (int v = 0; v < valid; v++) sum += exp(l[v] - max);
    return log(sum) + max - l[target];
}
static double crossentropy_loss(const void* p) {  // dloss * sum of the row losses
    const CrossEntropyCase* c = p;
    double s = 0.0;
    for (int n = 0; n < c->N; n++) s += ref_crossentropy(c->logits + (size_t)n * c->V, c->targets[n], c->valid);
    return c->dloss * s;
}

// how many of the padding columns [valid, V) of N rows are not exactly 0
static size_t nonzero_padding(const float* x, int N, int V, int valid) {
    size_t bad = 0;
    for (int n = 0; n < N; n++)
        for (int v = valid; v < V; v++) bad += x[(size_t)n * V + v] != 0.0f;
    return bad;
}

static void test_crossentropy(void) {
    enum { N = 37, VOCAB = 50, V = 56, TP = 2, VL = V / TP };
    const float dloss = 0.37f, huge = 1e30f;
    int targets[N];
    for (int n = 0; n < N; n++) targets[n] = rand_int(VOCAB);
    targets[0] = 0; targets[1] = VOCAB - 1; targets[2] = VL - 1; targets[3] = VL;  // the slices' edges
    float* logits = random_floats((size_t)N * V, -4, 4);  // padding columns hold random values too
    CrossEntropyCase ce = {doubles_of(logits, (size_t)N * V), targets, N, V, VOCAB, dloss};
    double* want = new_doubles(N);
    for (int n = 0; n < N; n++) want[n] = ref_crossentropy(ce.logits + (size_t)n * V, targets[n], VOCAB);
    double* fd = new_doubles((size_t)N * V);  // padding columns: the loss ignores them, so fd is 0 there
    finite_diff(fd, ce.logits, (size_t)N * V, crossentropy_loss, &ce);

    // one rank holding the whole (padded) vocabulary: the rescale is by exp(0), a no-op
    float *row_max = new_floats(N), *local_max = new_floats(N), *sums = new_floats(2 * N), *losses = new_floats(N);
    crossentropy_online_stats_cpu(row_max, local_max, sums, logits, targets, N, V, VOCAB, 0);
    crossentropy_rescale_sums_cpu(sums, local_max, row_max, N);
    crossentropy_forward_cpu(losses, NULL, row_max, sums, targets, 0.0f, N, V, VOCAB, 0);   // no backward follows
    double* want_sums = new_doubles(2 * N);
    int max_ok = 1, target_ok = 1;
    for (int n = 0; n < N; n++) {
        float m = -INFINITY;
        for (int v = 0; v < VOCAB; v++) m = fmaxf(m, logits[n * V + v]);
        max_ok &= row_max[n] == m && local_max[n] == m;
        target_ok &= sums[N + n] == logits[n * V + targets[n]];
        for (int v = 0; v < VOCAB; v++) want_sums[n] += exp((double)logits[n * V + v] - row_max[n]);
    }
    check(max_ok, "crossentropy_online_stats: the max over the real columns", "a row differs");
    check(target_ok, "crossentropy_online_stats holds the target's logit", "a row differs");
    // 50 online steps, each an add and at most one rescale: a few u ~ 1e-7 per step of the sum
    expect_close("crossentropy_online_stats sum of exp (online)", sums, NULL, want_sums, N, 1e-5);
    // log of that sum: ~3e-6 absolute on losses of ~4 (plus their own rounding)
    expect_close("crossentropy_forward loss = logsumexp - target logit", losses, NULL, want, N, 1e-5);

    // padding columns set to huge values change nothing, and get a zero gradient
    float* padded = copy_floats(logits, (size_t)N * V);
    for (int n = 0; n < N; n++)
        for (int v = VOCAB; v < V; v++) padded[n * V + v] = huge;
    float *losses2 = new_floats(N), *row_max2 = new_floats(N), *local_max2 = new_floats(N), *sums2 = new_floats(2 * N);
    crossentropy_online_stats_cpu(row_max2, local_max2, sums2, padded, targets, N, V, VOCAB, 0);
    crossentropy_rescale_sums_cpu(sums2, local_max2, row_max2, N);
    float* padded_fused = copy_floats(padded, (size_t)N * V);
    crossentropy_forward_cpu(losses2, padded, row_max2, sums2, targets, 0.0f, N, V, VOCAB, 0);
    expect_identical("crossentropy_forward ignores padding columns (set to 1e30)", losses2, losses, N);
    crossentropy_backward_cpu(padded, row_max2, sums2, targets, dloss, N, V, VOCAB, 0);
    expect_close("crossentropy_backward dlogits = dloss (softmax - onehot)", padded, NULL, fd, (size_t)N * V, FD_TOL);
    check(nonzero_padding(padded, N, V, VOCAB) == 0, "crossentropy_backward padding columns are exactly 0",
          "%zu are not", nonzero_padding(padded, N, V, VOCAB));
    // with a backward to follow (dloss != 0) the one-rank forward also writes dlogits: the same
    // operations as the statistics, the loss and the backward one after another, bit for bit
    float *losses3 = new_floats(N), *row_max3 = new_floats(N), *sums3 = new_floats(2 * N);
    crossentropy_forward_fused_cpu(losses3, padded_fused, row_max3, sums3, targets, dloss, N, V, VOCAB);
    expect_identical("crossentropy_forward_fused: the loss of forward", losses3, losses, N);
    expect_identical("crossentropy_forward_fused: the dlogits of backward", padded_fused, padded, (size_t)N * V);

    // vocab-parallel over TP = 2 ranks, with the two all-reduces done by hand: online_stats ->
    // max over ranks -> rescale_sums -> sum over ranks -> forward / backward
    float *slice[TP], *rank_max[TP], *rank_local_max[TP], *rank_sums[TP];
    int start[TP], valid[TP];
    float *global_max = filled_floats(N, -INFINITY), *global_sums = new_floats(2 * N);
    for (int r = 0; r < TP; r++) {
        start[r] = r * VL;
        valid[r] = VOCAB - start[r] < VL ? VOCAB - start[r] : VL;
        slice[r] = new_floats((size_t)N * VL);
        for (int n = 0; n < N; n++)
            for (int v = 0; v < VL; v++) slice[r][n * VL + v] = v < valid[r] ? logits[n * V + start[r] + v] : huge;
        rank_max[r] = new_floats(N);
        rank_local_max[r] = new_floats(N);
        rank_sums[r] = new_floats(2 * N);
        crossentropy_online_stats_cpu(rank_max[r], rank_local_max[r], rank_sums[r], slice[r], targets, N, VL,
                                      valid[r], start[r]);
        for (int n = 0; n < N; n++) global_max[n] = fmaxf(global_max[n], rank_max[r][n]);
    }
    check(memcmp(global_max, row_max, N * sizeof(float)) == 0, "crossentropy_online_stats vocab-parallel: max over ranks",
          "differs from one rank's");
    for (int r = 0; r < TP; r++) {
        memcpy(rank_max[r], global_max, N * sizeof(float));   // what the all-reduce leaves on every rank
        crossentropy_rescale_sums_cpu(rank_sums[r], rank_local_max[r], rank_max[r], N);
        for (int i = 0; i < 2 * N; i++) global_sums[i] += rank_sums[r][i];
    }
    expect_close("crossentropy_rescale_sums vocab-parallel: the sum over ranks", global_sums, NULL, want_sums, N, 1e-5);
    // exactly one rank holds each target and the others add 0: the target logit is exact
    check(memcmp(global_sums + N, sums + N, N * sizeof(float)) == 0,
          "crossentropy_online_stats vocab-parallel: target logit from exactly one rank", "differs");
    float* tp_losses = new_floats(N);
    crossentropy_forward_cpu(tp_losses, NULL, global_max, global_sums, targets, 0.0f, N, VL, valid[0], start[0]);
    expect_close("crossentropy_forward vocab-parallel (TP=2)", tp_losses, NULL, want, N, 1e-5);
    char name[128];
    double* want_slice = new_doubles((size_t)N * VL);
    for (int r = 0; r < TP; r++) {
        crossentropy_backward_cpu(slice[r], global_max, global_sums, targets, dloss, N, VL, valid[r], start[r]);
        for (int n = 0; n < N; n++)
            for (int v = 0; v < VL; v++) want_slice[n * VL + v] = fd[n * V + start[r] + v];
        snprintf(name, sizeof name, "crossentropy_backward vocab-parallel rank %d (vocab_start %d, valid %d of %d)",
                 r, start[r], valid[r], VL);
        expect_close(name, slice[r], NULL, want_slice, (size_t)N * VL, FD_TOL);
    }
    check(nonzero_padding(slice[1], N, VL, valid[1]) == 0,
          "crossentropy_backward vocab-parallel padding columns are exactly 0", "%zu are not",
          nonzero_padding(slice[1], N, VL, valid[1]));
    free_buffers();
}

// ----------------------------------------------------------------------------
// AdamW, from the torch.optim.AdamW documentation, one element at a time in double:
//   theta -= lr * wd * theta                      (decoupled weight decay, on the old theta)
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   theta -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)

static void ref_adamw(double* p, double* m, double* v, double grad, double lr, double b1, double b2, double eps,
                      double wd, double grad_scale, int t) {
    double g = grad * grad_scale;
    *p -= lr * wd * *p;
    *m = b1 * *m + (1.0 - b1) * g;
    *v = b2 * *v + (1.0 - b2) * g * g;
    double m_hat = *m / (1.0 - pow(b1, t)), v_hat = *v / (1.0 - pow(b2, t));
    *p -= lr * m_hat / (sqrt(v_hat) + eps);
}

static void test_adamw(float weight_decay, int same_buffer) {
    enum { n = 7 };
    const float lr = 0.1f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, grad_scale = 0.5f;
    float master[n], param_buf[n], grad[n], m[n] = {0}, v[n] = {0};
    double p_want[n], m_want[n], v_want[n];
    for (int i = 0; i < n; i++) {
        master[i] = rand_uniform(-1, 1);
        grad[i] = rand_uniform(-3, 3);
        param_buf[i] = NAN;
        p_want[i] = master[i], m_want[i] = v_want[i] = 0.0;
    }
    // element 0 by hand: g = 2 * 0.5 = 1 at every step, so m_hat = v_hat = 1 and the step is
    // lr * 1/(1 + eps): theta = 1 * (1 - lr wd) - 0.1, then that * (1 - lr wd) - 0.1
    master[0] = 1.0f, grad[0] = 2.0f, p_want[0] = 1.0;
    const double by_hand[2] = {1.0 - 0.1 * weight_decay - 0.1,
                               (1.0 - 0.1 * weight_decay - 0.1) * (1.0 - 0.1 * weight_decay) - 0.1};
    float* param = same_buffer ? master : param_buf;
    char name[128];
    const char* tag = same_buffer ? "master == param" : "separate param";
    for (int step = 1; step <= 2; step++) {
        adamw_update_cpu(master, param, grad, m, v, n, lr, b1, b2, eps, weight_decay, grad_scale, step);
        for (int i = 0; i < n; i++)  // the float hyperparameters, exactly as the kernel got them
            ref_adamw(&p_want[i], &m_want[i], &v_want[i], grad[i], lr, b1, b2, eps, weight_decay, grad_scale, step);
        // m, v: three fp32 roundings; theta (|theta| ~ 1, steps of ~lr): the update is ~8 fp32
        // operations incl. 1 - b^t, then one rounding of theta: all within ~5e-7 of max |theta|
        snprintf(name, sizeof name, "adamw_update step %d wd=%g (%s): m", step, weight_decay, tag);
        expect_close(name, m, NULL, m_want, n, 1e-6);
        snprintf(name, sizeof name, "adamw_update step %d wd=%g (%s): v", step, weight_decay, tag);
        expect_close(name, v, NULL, v_want, n, 1e-6);
        snprintf(name, sizeof name, "adamw_update step %d wd=%g (%s): master", step, weight_decay, tag);
        expect_close(name, master, NULL, p_want, n, 1e-6);
        snprintf(name, sizeof name, "adamw_update step %d wd=%g (%s): by hand %.6g", step, weight_decay, tag,
                 by_hand[step - 1]);
        check(fabs(master[0] - by_hand[step - 1]) <= 1e-6, name, "got %.9g", master[0]);
        snprintf(name, sizeof name, "adamw_update step %d wd=%g (%s): param == master", step, weight_decay, tag);
        expect_identical(name, param, master, n);
    }
}

// ----------------------------------------------------------------------------
// 8-bit optimizer states (kernels/quantize.cuh): the dynamic map, a block's quantization and
// its bound, 8-bit AdamW against the same quantized algorithm in double

// the map's facts, from the formula: 256 values sorted, 0 and 1 in it, the signed one with
// 127 negatives down to -(1 - 0.45/64), the smallest magnitude 1e-6 x the first decade's
// midpoint, and the largest gap the top decade's 0.9/64 (signed) or 0.9/128 (unsigned)
static double largest_gap(const float* map) {
    double gap = 0.0;
    for (int i = 1; i < QUANT_MAP_SIZE; i++) gap = fmax(gap, (double)map[i] - map[i - 1]);
    return gap;
}

static void test_dynamic_map(void) {
    float maps[2 * QUANT_MAP_SIZE];
    dynamic_quant_maps(maps);
    for (int u = 0; u < 2; u++) {
        const float* map = maps + u * QUANT_MAP_SIZE;
        int sorted = 1, negatives = 0, zero = 0, positive_min = -1;
        for (int i = 0; i < QUANT_MAP_SIZE; i++) {
            if (i > 0 && !(map[i] > map[i - 1])) sorted = 0;
            negatives += map[i] < 0.0f, zero += map[i] == 0.0f;
            if (positive_min < 0 && map[i] > 0.0f) positive_min = i;
        }
        double want_gap = u ? 0.9 / 128 : 0.9 / 64, want_small = u ? 1e-6 * (0.1 + 0.9 / 4) : 1e-6 * 0.55;
        char name[256];
        snprintf(name, sizeof name, "dynamic map (%s): 256 increasing values, %d negative, 0 and 1 in it, the smallest "
                 "positive %.3g, the largest gap %.4g", u ? "unsigned, v" : "signed, m", negatives, map[positive_min],
                 largest_gap(map));
        check(sorted && zero == 1 && map[QUANT_MAP_SIZE - 1] == 1.0f && negatives == (u ? 0 : 127) &&
              fabs(map[0] - (u ? 0.0 : -(1.0 - 0.45 / 64))) < 1e-7 && fabs(map[positive_min] - want_small) < 1e-12 &&
              fabs(largest_gap(map) - want_gap) < 1e-6, name, "got min %.9g", map[0]);
    }
}

// half the gap between the map's two values around y (y inside the map's range)
static double half_gap_around(const float* map, double y) {
    int j = 0;
    while (j < QUANT_MAP_SIZE - 2 && map[j + 1] <= y) j++;
    return 0.5 * ((double)map[j + 1] - map[j]);
}

// Values over 7 decades (the moments of a shard: tensors of very different gradients), in 4
// blocks, the last one short (2,048 x 3 + 555): each comes back within half the gap of the map
// around x / scale, times the scale (the nearest value: the whole error is the map's); the
// largest error at most half the largest gap of the scale (0.0070 signed, 0.0035 unsigned),
// and the values of at least a tenth of the scale within 6.6% (3.3%) of themselves. A
// dequantized block quantizes back to the same codes and scale (what a checkpoint round trip
// needs), and each block's extreme, negative ones too, comes back exactly.
static void test_quantize_round_trip(void) {
    enum { n = 3 * QUANT_BLOCK + 555 };
    float maps[2 * QUANT_MAP_SIZE];
    dynamic_quant_maps(maps);
    for (int u = 0; u < 2; u++) {
        const float* map = maps + u * QUANT_MAP_SIZE;
        float* x = new_floats(n);
        float* back = new_floats(n);
        float* again = new_floats(n);
        uint8_t* codes = (uint8_t*)new_buffer(n);
        uint8_t* codes2 = (uint8_t*)new_buffer(n);
        float* scales = new_floats(quant_blocks(n));
        float* scales2 = new_floats(quant_blocks(n));
        for (size_t i = 0; i < n; i++) {
            float magnitude = powf(10.0f, rand_uniform(-7.0f, 0.0f)) * (i / QUANT_BLOCK + 1);
            x[i] = i % 97 == 0 ? 0.0f : u || rand_int(2) ? magnitude : -magnitude;
        }
        if (!u) x[QUANT_BLOCK + 5] = -9.0f;   // block 1's extreme is negative
        quantize_blocks_cpu(x, n, map, codes, scales);
        dequantize_blocks_cpu(codes, scales, n, map, back);
        double worst = 0.0, worst_relative = 0.0;
        int within = 1;
        for (size_t i = 0; i < n; i++) {
            double s = fabs(scales[i / QUANT_BLOCK]), err = fabs((double)back[i] - x[i]);
            if (err > half_gap_around(map, x[i] / (double)scales[i / QUANT_BLOCK]) * s * (1 + 1e-5) + 1e-30) within = 0;
            worst = fmax(worst, err / s);
            if (fabs(x[i]) >= 0.1 * s) worst_relative = fmax(worst_relative, err / fabs(x[i]));
        }
        double bound = largest_gap(map) / 2, bound_relative = u ? 0.033 : 0.066;
        char name[256];
        snprintf(name, sizeof name, "quantize_blocks (%s map, %d values, blocks of 2,048 and a last of 555): each within half "
                 "the map's gap around it; the largest error %.4f of the scale (bound %.4f), %.2f%% of a value >= 0.1 of "
                 "it (bound %.1f%%)", u ? "unsigned" : "signed", n, worst, bound, 100 * worst_relative, 100 * bound_relative);
        check(within && worst <= bound * (1 + 1e-5) && worst_relative <= bound_relative, name, "not every value within");
        quantize_blocks_cpu(back, n, map, codes2, scales2);
        dequantize_blocks_cpu(codes2, scales2, n, map, again);
        snprintf(name, sizeof name, "quantize_blocks (%s): a dequantized shard quantizes back to the same codes and scales%s",
                 u ? "unsigned" : "signed", u ? "" : ", a negative extreme exactly (-9)");
        check(!memcmp(codes, codes2, n) && !memcmp(scales, scales2, quant_blocks(n) * sizeof(float)) &&
              !memcmp(back, again, n * sizeof(float)) && (u || back[QUANT_BLOCK + 5] == -9.0f), name,
              "a code or scale changed (block 1's extreme came back %.9g)", back[QUANT_BLOCK + 5]);
    }
    free_buffers();
}

// the same quantized algorithm in double: dequantize, torch's AdamW (ref_adamw), the block's
// extreme as its scale, the nearest code
static int nearest_code_double(const float* map, double y) {
    int best = 0;
    for (int c = 1; c < QUANT_MAP_SIZE; c++)
        if (fabs(map[c] - y) < fabs(map[best] - y)) best = c;
    return best;
}

static void ref_quantize_block(const double* x, size_t len, const float* map, uint8_t* codes, double* scale) {
    double hi = -INFINITY, lo = INFINITY;
    for (size_t i = 0; i < len; i++) hi = fmax(hi, x[i]), lo = fmin(lo, x[i]);
    *scale = hi >= -lo ? hi : lo;
    for (size_t i = 0; i < len; i++) codes[i] = (uint8_t)nearest_code_double(map, *scale != 0.0 ? x[i] / *scale : 0.0);
}

// A shard of 2 blocks and a short one (2,048 x 2 + 700), five tensors with gradients of
// different sizes (1e-3 to 1), weight decay on some, a padding gap of 10 left alone; five steps
// of adamw8bit_update_ranges_cpu against the double one. A code may fall on the other side of
// a midpoint between two map values in float and in double, after which the two runs differ by
// up to a gap of the map in that moment: so at least 99% of the codes agree, every dequantized
// moment is within one gap of the scale of the double's, the scales within 1e-3 (a block's
// extreme is an updated value) and the weights within 1e-3 of a step (lr).
static void test_adamw8bit(void) {
    enum { n = 2 * QUANT_BLOCK + 700, steps = 5 };
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, grad_scale = 0.5f;
    ShardRange ranges[4] = {{0, 1000, 1, 1}, {1000, 1003, 0, 1}, {1003, 4500, 1, 1}, {4510, n, 0, 1}};
    const float grad_size[4] = {1e-3f, 1.0f, 0.05f, 0.3f};
    float maps[2 * QUANT_MAP_SIZE];
    dynamic_quant_maps(maps);
    size_t blocks = quant_blocks(n);
    float* master = random_floats(n, -1, 1);
    float* master_start = copy_floats(master, n);
    float* grad = new_floats(n);
    double* p_ref = doubles_of(master, n);
    Moments8bit q = {(uint8_t*)new_buffer(n), (uint8_t*)new_buffer(n), new_floats(blocks), new_floats(blocks), maps};
    uint8_t* m_code = (uint8_t*)new_buffer(n);
    uint8_t* v_code = (uint8_t*)new_buffer(n);
    double *m_scale = new_doubles(blocks), *v_scale = new_doubles(blocks), *m = new_doubles(QUANT_BLOCK),
           *v = new_doubles(QUANT_BLOCK);
    int codes_equal = 0, moments_within = 1;
    double scale_err = 0.0;
    for (int step = 1; step <= steps; step++) {
        for (int r = 0; r < 4; r++)
            for (size_t i = ranges[r].start; i < ranges[r].end; i++) grad[i] = grad_size[r] * rand_uniform(-1, 1);
        adamw8bit_update_ranges_cpu(master, master, grad, q, n, ranges, 4, lr, b1, b2, eps, wd, grad_scale, step);
        for (size_t b = 0; b < blocks; b++) {
            size_t a = b * QUANT_BLOCK, len = n - a < QUANT_BLOCK ? n - a : QUANT_BLOCK;
            for (size_t i = 0; i < len; i++)
                m[i] = maps[m_code[a + i]] * m_scale[b], v[i] = maps[QUANT_MAP_SIZE + v_code[a + i]] * v_scale[b];
            for (int r = 0; r < 4; r++)
                for (size_t i = ranges[r].start; i < ranges[r].end; i++)
                    if (i >= a && i < a + len)
                        ref_adamw(&p_ref[i], &m[i - a], &v[i - a], grad[i], lr, b1, b2, eps, ranges[r].decay ? wd : 0.0,
                                  grad_scale, step);
            ref_quantize_block(m, len, maps, m_code + a, &m_scale[b]);
            ref_quantize_block(v, len, maps + QUANT_MAP_SIZE, v_code + a, &v_scale[b]);
            scale_err = fmax(scale_err, fabs(q.m_scale[b] - m_scale[b]) / fabs(m_scale[b]));
            scale_err = fmax(scale_err, fabs(q.v_scale[b] - v_scale[b]) / fabs(v_scale[b]));
        }
        codes_equal = 0;
        for (size_t i = 0; i < n; i++) {
            size_t b = i / QUANT_BLOCK;
            codes_equal += (q.m[i] == m_code[i]) + (q.v[i] == v_code[i]);
            double dm = fabs(maps[q.m[i]] * q.m_scale[b] - maps[m_code[i]] * m_scale[b]);
            double dv = fabs(maps[QUANT_MAP_SIZE + q.v[i]] * q.v_scale[b] - maps[QUANT_MAP_SIZE + v_code[i]] * v_scale[b]);
            if (dm > 0.0141 * fabs(m_scale[b]) * 1.01 || dv > 0.0071 * v_scale[b] * 1.01) moments_within = 0;
        }
    }
    double* p_want = p_ref;
    double p_err = 0.0;
    for (size_t i = 0; i < n; i++) p_err = fmax(p_err, fabs(master[i] - p_want[i]));
    int padding_alone = 1;
    for (size_t i = 4500; i < 4510; i++)
        padding_alone &= master[i] == master_start[i] && maps[q.m[i]] * q.m_scale[i / QUANT_BLOCK] == 0.0f &&
                         maps[QUANT_MAP_SIZE + q.v[i]] * q.v_scale[i / QUANT_BLOCK] == 0.0f;
    char name[320];
    snprintf(name, sizeof name, "adamw8bit_update_ranges (%d values, 4 ranges, 5 steps) against the same quantized "
             "algorithm in double: %.2f%% of the codes equal, the moments within a gap, scales within %.1e, weights within "
             "%.1e of lr", n, 50.0 * codes_equal / n, scale_err, p_err / lr);
    check(codes_equal >= 0.99 * 2 * n && moments_within && scale_err <= 1e-3 && p_err <= 1e-3 * lr, name, "too far");
    check(padding_alone, "adamw8bit_update_ranges: the padding between ranges left alone (weights, m and v 0)", "touched");
    free_buffers();
}

// ----------------------------------------------------------------------------
// sum of squares, for the gradient norm

static void test_sum_squares(void) {
    const size_t n = 3 * SUM_CHUNK + 123;  // several chunks, the last one short
    float* x = random_floats(n, -2, 2);
    double want = 5.0;  // *acc starts from 5: the kernel adds into it
    for (size_t i = 0; i < n; i++) want += (double)x[i] * (double)x[i];
    double acc = 5.0;
    sum_squares_cpu(&acc, x, n);
    // exact squares of floats summed in double, in another order: ~n * 1e-16 relative
    check(fabs(acc - want) <= 1e-12 * want, "sum_squares accumulates into *acc (vs double sum)",
          "got %.17g, want %.17g", acc, want);
#ifdef _OPENMP
    int threads = omp_get_max_threads();
    double one = 0.0, two = 0.0;
    omp_set_num_threads(1);
    sum_squares_cpu(&one, x, n);
    omp_set_num_threads(2);
    sum_squares_cpu(&two, x, n);
    omp_set_num_threads(threads);
    check(memcmp(&one, &two, sizeof(double)) == 0, "sum_squares is bit-identical with 1 and 2 threads",
          "%.17g vs %.17g", one, two);
#endif
    free_buffers();
}

// ZeRO-2/3's accumulation into the shard (zero.h): acc[i] + x[i], each element, in fp32
static void test_floats_add(void) {
    const size_t n = 1001;
    float* acc = random_floats(n, -2, 2);
    float* x = random_floats(n, -2, 2);
    float* want = (float*)malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) want[i] = acc[i] + x[i];
    floats_add_cpu(acc, x, n);
    check(memcmp(acc, want, n * sizeof(float)) == 0, "floats_add adds x into acc element by element (fp32)", "differs");
    free(want);
    free_buffers();
}

// ----------------------------------------------------------------------------
// "device" memory on the CPU build is host memory: a round trip keeps every bit

static void test_device_memory(void) {
    const size_t n = 45;
    kernels_init(0);
    float* host = random_floats(n, -1, 1);
    float* back = filled_floats(n, NAN);
    float* dev = (float*)dev_malloc(n * sizeof(float));
    host_to_dev(dev, host, n * sizeof(float));
    dev_to_host(back, dev, n * sizeof(float));
    int ok = memcmp(back, host, n * sizeof(float)) == 0;
    floats_to_dev_floatX(dev, host, n);
    dev_floatX_to_floats(back, dev, n);
    ok &= memcmp(back, host, n * sizeof(float)) == 0;
    dev_zero(dev, n * sizeof(float));
    dev_to_host(back, dev, n * sizeof(float));
    dev_free(dev);
    check(ok, "dev_* round trips keep every bit", "a round trip changed the data");
    expect_identical("dev_zero zeroes", back, new_floats(n), n);
    free_buffers();
}

// blas_cores.h's decision on a table of (OpenBLAS core, CPU level) cases: only a known core
// narrower than the CPU is replaced, by the core OpenBLAS runs on the first CPUs of that level
static void test_blas_core_choice(void) {
    struct { const char* core; IsaLevel cpu; const char* expect; } cases[] = {
        {"Prescott", ISA_AVX512, "SkylakeX"},     // Debian 12's 0.3.21 on Xeon family 6 model 207
        {"Prescott", ISA_AVX2, "Haswell"},        {"Prescott", ISA_AVX, "Sandybridge"},
        {"Prescott", ISA_SSE, NULL},              {"prescott", ISA_AVX512, "SkylakeX"},   // any case
        {"Nehalem", ISA_AVX2, "Haswell"},         {"Core2", ISA_AVX512, "SkylakeX"},
        {"Barcelona", ISA_AVX2, "Haswell"},       {"Sandybridge", ISA_AVX512, "SkylakeX"},
        {"Sandybridge", ISA_AVX, NULL},           {"Haswell", ISA_AVX512, "SkylakeX"},
        {"Haswell", ISA_AVX2, NULL},              {"Zen", ISA_AVX2, NULL},
        {"Zen", ISA_AVX512, "SkylakeX"},          {"SkylakeX", ISA_AVX512, NULL},
        {"Cooperlake", ISA_AVX512, NULL},         {"SapphireRapids", ISA_AVX512, NULL},
        {"SkylakeX", ISA_AVX2, NULL},             // wider than the CPU (a user's choice): never narrowed
        {"NeoverseN1", ISA_UNKNOWN, NULL},        // another architecture
        {"Prescott", ISA_UNKNOWN, NULL},          // a CPU whose level we cannot read
        {"Emeraldrapids", ISA_AVX512, NULL},      // a name we do not know: left alone
        {NULL, ISA_AVX2, NULL},
    };
    int wrong = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char* got = blas_core_choice(cases[i].core, cases[i].cpu);
        int same = (got == NULL) == (cases[i].expect == NULL) && (!got || strcmp(got, cases[i].expect) == 0);
        if (!same) printf("  core %s on an %s CPU: chose %s, expected %s\n", cases[i].core ? cases[i].core : "(none)",
                          isa_name(cases[i].cpu), got ? got : "nothing", cases[i].expect ? cases[i].expect : "nothing");
        wrong += !same;
    }
    check(wrong == 0, "blas_core_choice on the table of cores and CPUs", "%d case(s) wrong", wrong);
    int levels_right = 1;
    for (IsaLevel cpu = ISA_AVX; cpu <= ISA_AVX512; cpu++)
        levels_right &= blas_core_level(blas_core_choice("Prescott", cpu)) == cpu;
    check(levels_right, "every chosen core is one of OpenBLAS's, of the CPU's level", "a choice is not in BLAS_CORES");
#ifdef USE_BLAS
    // this process, after grid_start's choice: running the right kernels unless a user chose them
    const char* core = openblas_get_corename();
    if (getenv("OPENBLAS_CORETYPE") && !getenv("GRIDGPT_TEST_GENERIC_BLAS"))
        printf("SKIP OpenBLAS kernels fit this CPU: OPENBLAS_CORETYPE=%s is the user's\n", getenv("OPENBLAS_CORETYPE"));
    else
        check(blas_core_choice(core, cpu_isa_level()) == NULL, "this process runs OpenBLAS kernels that fit the CPU",
              "OpenBLAS runs %s on an %s CPU", core, isa_name(cpu_isa_level()));
#endif
}

// ----------------------------------------------------------------------------
// context parallelism's attention block by block (kernels/attention_blocks.cuh), against the
// one-process attention on the whole sequence. C ranks; a sequence of T = 2C S rows in 2C chunks
// of S; rank r holds chunks r and 2C-1-r (local rows [0, S) and [S, 2S) of each sequence).

static int cp_chunk(int r, int C, int local_chunk) { return local_chunk == 0 ? r : 2 * C - 1 - r; }
static int cp_global_row(int r, int C, int S, int l) { return cp_chunk(r, C, l / S) * S + l % S; }

// rank r's rows of a whole [B * T, width] buffer (to_local), or the other way
static void cp_copy_rows(float* local, float* whole, int r, int C, int S, int B, size_t width, int to_local) {
    int T = 2 * C * S;
    for (int b = 0; b < B; b++)
        for (int l = 0; l < 2 * S; l++) {
            float* x = local + ((size_t)b * 2 * S + l) * width;
            float* y = whole + ((size_t)b * T + cp_global_row(r, C, S, l)) * width;
            memcpy(to_local ? x : y, to_local ? y : x, width * sizeof(float));
        }
}

// a block, and whose keys and values it reads: a rank's, or (C) the whole sequence's, gathered
typedef struct {
    AttentionBlock blk;
    int owner;
} CpBlock;

// Rank r's blocks. The ring: the C ranks' key/value chunks in the ring's order (its own first),
// each of its two query chunks against each of their two chunks (S x S blocks, some empty, some
// triangles, some whole; the early query chunk meets its own rank's late key chunk first, an
// empty block merged into an accumulator still at lse -inf). The all-gather way: each query chunk c against the keys 0 .. (c + 1) S
// of the whole gathered sequence, in two blocks split at c S / 2 + 1 (q_count != kv_count,
// q_rows != kv_rows, a key block starting mid-chunk).
static int cp_blocks(CpBlock* list, int r, int C, int S, int B, int all_gather) {
    int n = 0, L = 2 * S, T = 2 * C * S;
    for (int qc = 0; qc < 2; qc++) {
        int c = cp_chunk(r, C, qc);
        if (all_gather) {
            int split = c * S / 2 + 1, end = (c + 1) * S;
            list[n++] = (CpBlock){{B, L, T, qc * S, 0, S, split, c * S, 0}, C};
            list[n++] = (CpBlock){{B, L, T, qc * S, split, S, end - split, c * S, split}, C};
            continue;
        }
        for (int step = 0; step < C; step++) {
            int src = (r - step + C) % C;
            for (int kc = 1; kc >= 0; kc--)   // the later chunk first: an empty block into a clear accumulator
                list[n++] = (CpBlock){{B, L, L, qc * S, kc * S, S, S, c * S, cp_chunk(src, C, kc) * S}, src};
        }
    }
    return n;
}

// log sum_{t2 <= t} exp(q_t . k_t2 / sqrt(HS) + slope (t2 - t)) in double, from the layout's
// description (gqa_at) and the ALiBi rule of BLOOM
static double ref_lse(const float* qkv, int b, int h, int t, int T, int NH, int G, int HS, Alibi alibi) {
    int per = NH / G;
    double s[T], max = -INFINITY, sum = 0.0;
    for (int t2 = 0; t2 <= t; t2++) {
        const float *q = qkv + gqa_at(b, t, h / per, h % per, T, NH, G, HS), *k = qkv + gqa_at(b, t2, h / per, per, T, NH, G, HS);
        s[t2] = 0.0;
        for (int i = 0; i < HS; i++) s[t2] += (double)q[i] * k[i] / sqrt((double)HS);
        if (alibi.heads) s[t2] += ref_alibi_slope(alibi.first_head + h, alibi.heads) * (t2 - t);
        max = fmax(max, s[t2]);
    }
    for (int t2 = 0; t2 <= t; t2++) sum += exp(s[t2] - max);
    return max + log(sum);
}

// Every rank's attention by blocks against attention_forward and attention_backward on the
// whole sequence (the same fp32 products, added in other orders and merged by lse: ~1e-7 of the
// scale measured; 1e-5), its lse against a double log-sum-exp (1e-5). The backward: D, every
// block's attention_block_backward from the merged lse, each rank's dkv for another rank's
// chunks summed by the owner (what the ring sends back; all-gather: summed over ranks, a
// reduce-scatter's sum), attention_block_gradients_into_qkv; against attention_backward's dqkv.
// A missing or doubled block, a wrong position or mask moves elements by O(1/T). C <= 3 (the
// arrays of ranks below).
static void test_attention_blocks(int C, int NH, int G, Alibi alibi, Dropout d, int all_gather) {
    const int B = 2, S = 5, T = 2 * C * S, L = 2 * S, HS = 8;
    const size_t row = (size_t)(NH + 2 * G) * HS, kv_row = (size_t)2 * G * HS, out_row = (size_t)NH * HS;
    char with[128], name[256];
    snprintf(with, sizeof with, " C=%d NH=%d G=%d%s%s%s", C, NH, G, alibi.heads ? " ALiBi" : "",
             d.threshold ? " dropout 0.3" : "", all_gather ? ", all-gathered keys" : ", the ring's blocks");
    float* qkv = random_floats((size_t)B * T * row, -1.5f, 1.5f);
    float *want = new_floats((size_t)B * T * out_row), *att = new_floats((size_t)B * NH * T * T);
    attention_forward(want, att, NULL, NULL, qkv, B, T, NH, G, HS, alibi, d);
    float *dout = random_floats((size_t)B * T * out_row, -1, 1), *dqkv_want = new_floats((size_t)B * T * row);
    attention_backward(dqkv_want, new_floats(attention_scratch_elements(B, T, NH, HS)), dout, qkv, want, att, NULL, B, T,
                       NH, G, HS, alibi, d);

    // each rank's rows; kv[r] its keys and values, kv[C] the whole sequence's
    float *lqkv[3], *kv[4], *acc[3], *lse[3], *out[3];
    for (int r = 0; r < C; r++) {
        cp_copy_rows(lqkv[r] = new_floats((size_t)B * L * row), qkv, r, C, S, B, row, 1);
        kv_cache_append(kv[r] = new_floats((size_t)B * L * kv_row), lqkv[r], B * L, 0, NH, G, HS);
    }
    kv_cache_append(kv[C] = new_floats((size_t)B * T * kv_row), qkv, B * T, 0, NH, G, HS);

    // the forward: blocks merged into each rank's accumulator (a block writes its query rows
    // alone: the partial's other rows stay NaN, and the merge must not read them)
    CpBlock blocks[12];
    float *part = new_floats((size_t)B * L * out_row), *part_lse = new_floats((size_t)B * NH * L);
    float *got = new_floats((size_t)B * T * out_row), *got_lse = new_floats((size_t)B * NH * T);
    for (int r = 0; r < C; r++) {
        attention_accumulator_clear(acc[r] = new_floats((size_t)B * L * out_row), lse[r] = new_floats((size_t)B * NH * L),
                                    B, L, NH, HS);
        int n = cp_blocks(blocks, r, C, S, B, all_gather);
        for (int k = 0; k < n; k++) {
            for (size_t e = 0; e < (size_t)B * L * out_row; e++) part[e] = NAN;
            for (size_t e = 0; e < (size_t)B * NH * L; e++) part_lse[e] = NAN;
            attention_block_forward(part, part_lse, lqkv[r], kv[blocks[k].owner], blocks[k].blk, NH, G, HS, alibi, d);
            attention_merge(acc[r], lse[r], part, part_lse, blocks[k].blk, NH, HS);
        }
        attention_output_rows(out[r] = new_floats((size_t)B * L * out_row), acc[r], (size_t)B * L * out_row);
        cp_copy_rows(out[r], got, r, C, S, B, out_row, 0);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                for (int l = 0; l < L; l++)
                    got_lse[((size_t)b * NH + h) * T + cp_global_row(r, C, S, l)] = lse[r][((size_t)b * NH + h) * L + l];
    }
    snprintf(name, sizeof name, "attention by blocks merged by lse = attention_forward on the whole sequence%s", with);
    expect_close(name, got, NULL, doubles_of(want, (size_t)B * T * out_row), (size_t)B * T * out_row, 1e-5);
    double* lse_want = new_doubles((size_t)B * NH * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) lse_want[((size_t)b * NH + h) * T + t] = ref_lse(qkv, b, h, t, T, NH, G, HS, alibi);
    snprintf(name, sizeof name, "attention by blocks: the merged lse = log-sum-exp in double%s", with);
    expect_close(name, got_lse, NULL, lse_want, (size_t)B * NH * T, 1e-5);

    // the backward: dq[r] rank r's; dkv[r][o] what rank r adds for owner o's keys (C: the whole's)
    float *ldout[3], *D[3], *dq[3], *dkv[3][4], *dkv_own = new_floats((size_t)B * L * kv_row);
    float *ldqkv = new_floats((size_t)B * L * row), *got_dqkv = new_floats((size_t)B * T * row);
    for (int r = 0; r < C; r++) {
        cp_copy_rows(ldout[r] = new_floats((size_t)B * L * out_row), dout, r, C, S, B, out_row, 1);
        attention_rows_dot(D[r] = new_floats((size_t)B * NH * L), ldout[r], out[r], B, L, NH, HS);
        dq[r] = new_floats((size_t)B * L * out_row);
        for (int o = 0; o <= C; o++) dkv[r][o] = new_floats((size_t)B * (o < C ? L : T) * kv_row);
        int n = cp_blocks(blocks, r, C, S, B, all_gather);
        for (int k = 0; k < n; k++)
            attention_block_backward(dq[r], dkv[r][blocks[k].owner], ldout[r], D[r], lse[r], lqkv[r], kv[blocks[k].owner],
                                     blocks[k].blk, NH, G, HS, alibi, d);
    }
    float* dkv_whole = new_floats((size_t)B * T * kv_row);   // the all-gather's: summed over the ranks
    for (int r = 0; r < C; r++)
        for (size_t e = 0; e < (size_t)B * T * kv_row; e++) dkv_whole[e] += dkv[r][C][e];
    for (int o = 0; o < C; o++) {   // the owner's dkv: its own, the others' sent back, and its rows of the whole's
        cp_copy_rows(dkv_own, dkv_whole, o, C, S, B, kv_row, 1);
        for (int r = 0; r < C; r++)
            for (size_t e = 0; e < (size_t)B * L * kv_row; e++) dkv_own[e] += dkv[r][o][e];
        attention_block_gradients_into_qkv(ldqkv, dq[o], dkv_own, B * L, NH, G, HS);
        cp_copy_rows(ldqkv, got_dqkv, o, C, S, B, row, 0);
    }
    snprintf(name, sizeof name, "attention by blocks' backward = attention_backward's dqkv%s", with);
    expect_close(name, got_dqkv, NULL, doubles_of(dqkv_want, (size_t)B * T * row), (size_t)B * T * row, 1e-5);
    free_buffers();
}

int main(int argc, char** argv) {
    (void)argc;
    blas_choose_kernels(argv);   // as grid_start does in every program that starts MPI
#ifdef USE_BLAS
    printf("%s\n", blas_kernels_line);
#endif
    printf("test_kernels: %s kernels%s\n", PRECISION_NAME,
#ifdef USE_BLAS
           ", matmul through BLAS"
#else
           ", matmul as plain loops"
#endif
    );
    test_blas_core_choice();
    test_device_memory();
    test_encoder(0, 56, 1);   // one rank, the whole padded vocabulary
    test_encoder(20, 17, 0);  // a vocab-parallel slice; wpe added by another rank
    test_encoder(20, 17, 1);
    test_residual();
    test_rows_add(0, 1);
    test_rows_add(16, 11);
    test_layernorm();
    test_rmsnorm();
    test_matmul();
    test_alibi_slopes();
    Alibi none = {0, 0}, heads_2_to_4_of_5 = {2, 5};
    test_attention(none);
    test_attention(heads_2_to_4_of_5);
    test_attention_decode(3, 3, none);
    test_attention_decode(3, 3, heads_2_to_4_of_5);
    // grouped-query attention: 6 query heads in 2 groups of 3, and in one group (multi-query);
    // ALiBi: these 6 heads as global heads 1..6 of 7
    Alibi heads_1_to_6_of_7 = {1, 7};
    for (int G = 2; G >= 1; G--) {
        test_attention_gqa(6, G, none);
        test_attention_gqa(6, G, heads_1_to_6_of_7);
        test_attention_decode(6, G, G == 2 ? none : heads_1_to_6_of_7);
    }
    // context parallelism's attention by blocks: 2 and 3 ranks, 4 heads in 4 groups and in 2,
    // ALiBi (heads 1..4 of 7) and the attention dropout on and off; the ring's blocks, and the
    // all-gathered keys in blocks of other sizes and offsets
    Alibi heads_1_to_4_of_7 = {1, 7};
    Dropout attention_dropout = dropout_mask(0.3f, 1234, 7, 1, DROPOUT_ATTENTION_PROBS, 40, 3);
    for (int C = 2; C <= 3; C++)
        for (int G = 4; G >= 2; G -= 2)
            for (int with = 0; with < 4; with++)
                test_attention_blocks(C, 4, G, with & 1 ? heads_1_to_4_of_7 : none, with & 2 ? attention_dropout : NO_DROPOUT, 0);
    test_attention_blocks(3, 4, 2, heads_1_to_4_of_7, attention_dropout, 1);
    test_attention_blocks(2, 4, 4, none, NO_DROPOUT, 1);
    // {B, T, NH, G, HS, rotary_dims, pos0, base}: without GQA (G = NH), one k/v head (G = 1),
    // groups of 3 queries; all of each head rotated, half of it (--rotary-percent 0.5), and a
    // pos0 past a cache of 37 tokens
    const RopeShape rope_shapes[6] = {{2, 11, 3, 3, 8, 8, 0, 10000.0f}, {2, 11, 4, 1, 12, 6, 0, 10000.0f},
                                      {1, 7, 6, 2, 10, 10, 37, 10000.0f}, {2, 5, 6, 2, 12, 6, 37, 500000.0f},
                                      {1, 11, 4, 4, 7, 4, 3, 10000.0f}, {2, 3, 2, 1, 6, 0, 5, 10000.0f}};
    for (int k = 0; k < 6; k++) test_rope(rope_shapes[k]);
    test_rope_relative();
    test_exp_poly();
    test_gelu(GELU_TANH);
    test_gelu(GELU_ERF);
    test_swiglu();
    // the mixture-of-experts layer: Mixtral-like (8 experts, top 2) and Qwen2-MoE-like (60, top
    // 4), both weightings, a router with many ties; the sort with an expert no token chose
    for (int pre_softmax = 0; pre_softmax < 2; pre_softmax++) {
        test_moe_router(23, 8, 2, pre_softmax, 0);
        test_moe_router(13, 60, 4, pre_softmax, 0);
        test_moe_router(17, 8, 3, pre_softmax, 1);
    }
    test_moe_sort(37, 8, 2);
    test_moe_sort(29, 60, 4);
    test_moe_combine(19, 8, 2, 9);
    test_moe_combine(7, 60, 4, 5);
    test_moe_shared_gate();
    test_crossentropy();
    for (int same = 1; same >= 0; same--) {
        test_adamw(0.0f, same);
        test_adamw(0.1f, same);
    }
    test_sum_squares();
    test_floats_add();
    test_dynamic_map();
    test_quantize_round_trip();
    test_adamw8bit();
    return tests_summary();
}
