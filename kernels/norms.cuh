/*
kernels/norms.cuh — the normalizations: LayerNorm (layernorm_forward, residual_layernorm_forward
with the residual add in front, layernorm_backward) and RMSNorm (rmsnorm_forward,
rmsnorm_backward, on LayerNorm's backward chunks). Each op: its C reference, then its CUDA
twin.

Included by kernels.cuh, the index of kernels/: the conventions every kernel keeps are there.
*/
#pragma once

// ----------------------------------------------------------------------------
// LayerNorm over the last dimension, eps = 1e-5 (Megatron's default)

#define LAYERNORM_EPS 1e-5f

static void layernorm_forward_cpu(float* out, float* mean, float* rstd, const float* inp,
                                  const float* weight, const float* bias, int N, int C) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        double m = 0.0, v = 0.0;   // (the sums on vector lanes: one chain of double adds is slow)
        #pragma omp simd reduction(+ : m)
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        #pragma omp simd reduction(+ : v)
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
        #pragma omp simd reduction(+ : g_mean, gx_mean)
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
    // parameter gradients: columns are independent, each summed over rows in order; 64
    // columns at a time, so that the rows are read along (column_sums_add_cpu's way)
    int chunks = CEIL_DIV(C, 64);
    #pragma omp parallel for
    for (int k = 0; k < chunks; k++) {
        int c0 = k * 64, c1 = c0 + 64 < C ? c0 + 64 : C;
        float dw[64] = {0}, db[64] = {0};
        for (int n = 0; n < N; n++) {
            const float* d = dout + (size_t)n * C;
            const float* x = inp + (size_t)n * C;
            for (int c = c0; c < c1; c++) {
                dw[c - c0] += d[c] * ((x[c] - mean[n]) * rstd[n]);
                db[c - c0] += d[c];
            }
        }
        for (int c = c0; c < c1; c++) {
            dweight[c] += dw[c - c0];
            dbias[c] += db[c - c0];
        }
    }
}

// residual = a + b, then out = LayerNorm(residual) with its mean and rstd: the residual add
// and the LayerNorm that follows it, which the GPU build does in one pass over the rows
static void residual_layernorm_forward_cpu(float* residual, float* out, float* mean, float* rstd,
                                           const float* a, const float* b, const float* weight,
                                           const float* bias, int N, int C) {
    residual_forward_cpu(residual, a, b, (size_t)N * C);
    layernorm_forward_cpu(out, mean, rstd, residual, weight, bias, N, C);
}

#ifdef __CUDACC__
// LayerNorm: the forward one warp per row; the backward one block per chunk of rows

// In the warp-per-row kernels, warp w of block b owns row b * ROWS_PER_BLOCK + w and its
// lanes stride along the row. A warp past the last row leaves as a whole, so the shuffles
// of the other warps still see all 32 lanes.
// LayerNorm of the row x[0 .. C) into o[0 .. C), by the 32 lanes of one warp, lane l taking
// the packs that start at 8l, 8l + 256, ...; writes the row's mean and rstd (lane 0).
__device__ void layernorm_row(floatX* o, float* mean, float* rstd, const floatX* x, const floatX* weight,
                              const floatX* bias, int C, int lane) {
    float sum = 0.0f;
    for (int c = lane * X128; c < C; c += 32 * X128) {
        x128 px = load_pack(x + c, C - c < X128 ? C - c : X128);   // the missing elements are 0
        for (int k = 0; k < X128; k++) sum += floatX_to_float(px.e[k]);
    }
    float m = warp_reduce_sum(sum) / C;
    float var = 0.0f;  // two passes: the variance of (x - m), as the reference
    for (int c = lane * X128; c < C; c += 32 * X128) {
        int count = C - c < X128 ? C - c : X128;
        x128 px = load_pack(x + c, count);
        for (int k = 0; k < count; k++) {
            float d = floatX_to_float(px.e[k]) - m;
            var += d * d;
        }
    }
    float s = 1.0f / sqrtf(warp_reduce_sum(var) / C + LAYERNORM_EPS);
    for (int c = lane * X128; c < C; c += 32 * X128) {
        int count = C - c < X128 ? C - c : X128;
        x128 px = load_pack(x + c, count), pw = load_pack(weight + c, count), pb = load_pack(bias + c, count), po;
        for (int k = 0; k < X128; k++) {
            float xhat = (floatX_to_float(px.e[k]) - m) * s;
            po.e[k] = to_floatX(xhat * floatX_to_float(pw.e[k]) + floatX_to_float(pb.e[k]));
        }
        store_pack(o + c, po, count);
    }
    if (lane == 0) {
        *mean = m;
        *rstd = s;
    }
}

__global__ void layernorm_forward_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                         const floatX* weight, const floatX* bias, int N, int C) {
    int lane = threadIdx.x % 32, n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    layernorm_row(out + (size_t)n * C, mean + n, rstd + n, inp + (size_t)n * C, weight, bias, C, lane);
}

// residual = a + b, then out = LayerNorm(residual): one warp per row. The lane that writes a
// pack of the residual row (rounded to floatX, as residual_forward stores it) is the lane
// that reads it back in layernorm_row, so no barrier is needed; residual may be a or b.
// Saves residual_forward's second pass over the residual stream (one read of N * C).
__global__ void residual_layernorm_forward_kernel(floatX* residual, floatX* out, float* mean, float* rstd,
                                                  const floatX* a, const floatX* b, const floatX* weight,
                                                  const floatX* bias, int N, int C) {
    int lane = threadIdx.x % 32, n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    size_t row = (size_t)n * C;
    for (int c = lane * X128; c < C; c += 32 * X128) {
        int count = C - c < X128 ? C - c : X128;
        x128 pa = load_pack(a + row + c, count), pb = load_pack(b + row + c, count), pr;
        for (int k = 0; k < X128; k++) pr.e[k] = to_floatX(floatX_to_float(pa.e[k]) + floatX_to_float(pb.e[k]));
        store_pack(residual + row + c, pr, count);
    }
    layernorm_row(out + row, mean + n, rstd + n, residual + row, weight, bias, C, lane);
}

// The backward of LayerNorm (layernorm true) and of RMSNorm (false: no mean, no bias), one block
// per chunk of COLUMN_CHUNK_ROWS rows: block k takes the rows [32k, 32k + 32), warp w its
// NORM_WARP_ROWS rows 4w .. 4w + 3 all the way, in two steps:
//   1. the warp's rows' mean(g) and mean(g xhat), g = dout * weight (LayerNorm; RMSNorm's xhat
//      is x rstd and it needs the second alone), in registers: every lane has them after the
//      butterfly sums, so the block needs no barrier for them;
//   2. the columns in windows of NORM_WINDOW, lane l the pack at 8 l: dinp += rstd * (g -
//      mean(g) - xhat * mean(g xhat)) on the warp's rows, and their sums of dout xhat and dout
//      into block_column_partials; after a barrier, warp k adds element k of each lane's pack
//      over the 8 warps, in warp order, and writes the chunk's partials of dweight (dout xhat)
//      and dbias (dout), [2, chunks, C] ([chunks, C] for RMSNorm), for column_partials_add.
// A lane loads the packs of all its rows before it computes and stores any (and the pointers are
// __restrict__), so no row's loads wait for the row before it: where one thread took a pack
// down all 32 rows, each row's loads waited for the previous row's store of dinp, which the
// compiler had to take for the same memory, and at C = 768 only 96 of the 256 threads had a
// pack. A row past N (the last chunk) reads row N - 1 again and stores nothing. Step 2 reads
// again the rows step 1 read, from the cache: dout and inp come from memory once. Both steps
// move floatX in 128-bit packs (load_pack: element by element where a row's pack is not whole
// and aligned, e.g. an odd C), the forward kernels' way.
#define NORM_WARP_ROWS (COLUMN_CHUNK_ROWS / (COLUMN_BLOCK / 32))
static_assert(NORM_WARP_ROWS * (COLUMN_BLOCK / 32) == COLUMN_CHUNK_ROWS && NORM_WINDOW == 32 * X128,
              "a chunk's rows shared evenly by the block's warps; a window is a pack a lane");

// load_pack and store_pack where `whole` says every pack of the rows is whole and aligned
// (count X128, or 0 past the end of the row): straight 128-bit accesses, no element-by-element
// branch, which the compiler would otherwise lay out, with its registers, for each of them
__device__ x128 pack_load(const floatX* p, int count, bool whole) {
    if (whole) return count == X128 ? load128(p) : zero_pack();
    x128 v;
    UNROLL
    for (int k = 0; k < X128; k++) v.e[k] = k < count ? p[k] : to_floatX(0.0f);
    return v;
}
__device__ void pack_store(floatX* p, x128 v, int count, bool whole) {
    if (whole) {
        if (count == X128) store128(p, v);
        return;
    }
    UNROLL
    for (int k = 0; k < X128; k++)
        if (k < count) p[k] = v.e[k];
}

// the offset of row n of an [N, C] array, a row past N read as N - 1 (a chunk's last warp may
// hold rows past the end: it reads the last row again and stores nothing)
__device__ size_t row_at(int n, int N, int C) { return (size_t)min_int(n, N - 1) * C; }

__device__ void norm_backward_chunk(floatX* __restrict__ dinp, float* __restrict__ partials,
                                    const floatX* __restrict__ dout, const floatX* __restrict__ inp,
                                    const floatX* __restrict__ weight, const float* __restrict__ mean,
                                    const float* __restrict__ rstd, int N, int C, bool layernorm, bool whole) {
    constexpr int R = NORM_WARP_ROWS, warps = COLUMN_BLOCK / 32;
    float* sums = block_column_partials();   // [2][warps][X128][32]
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, chunks = gridDim.x;
    int n0 = blockIdx.x * COLUMN_CHUNK_ROWS + warp * R;
    float m[R], s[R], g_mean[R], gx_mean[R];
    for (int r = 0; r < R; r++) {
        m[r] = layernorm ? mean[min_int(n0 + r, N - 1)] : 0.0f;
        s[r] = rstd[min_int(n0 + r, N - 1)];
        g_mean[r] = 0.0f;
        gx_mean[r] = 0.0f;
    }
    // 1. the rows' sums of g and g xhat: each lane its packs, then the warp's butterfly
    for (int c = lane * X128; c < C; c += NORM_WINDOW) {
        int count = min_int(C - c, X128);   // the pack's missing elements are 0
        x128 pw = pack_load(weight + c, count, whole), pd[R], px[R];
        for (int r = 0; r < R; r++) {
            pd[r] = pack_load(dout + row_at(n0 + r, N, C) + c, count, whole);
            px[r] = pack_load(inp + row_at(n0 + r, N, C) + c, count, whole);
        }
        for (int r = 0; r < R; r++)
            for (int k = 0; k < X128; k++) {
                float g = floatX_to_float(pd[r].e[k]) * floatX_to_float(pw.e[k]);
                g_mean[r] += g;
                gx_mean[r] += g * ((floatX_to_float(px[r].e[k]) - m[r]) * s[r]);
            }
    }
    for (int r = 0; r < R; r++) {
        g_mean[r] = layernorm ? warp_reduce_sum(g_mean[r]) / C : 0.0f;
        gx_mean[r] = warp_reduce_sum(gx_mean[r]) / C;
    }
    // 2. dinp, and the columns' sums over the chunk, a window at a time
    for (int c0 = 0; c0 < C; c0 += NORM_WINDOW) {
        int c = c0 + lane * X128, count = c < C ? min_int(C - c, X128) : 0;   // missing elements: 0, not stored
        x128 pw = pack_load(weight + c, count, whole), pd[R], px[R], pi[R];
        for (int r = 0; r < R; r++) {
            pd[r] = pack_load(dout + row_at(n0 + r, N, C) + c, count, whole);
            px[r] = pack_load(inp + row_at(n0 + r, N, C) + c, count, whole);
            pi[r] = pack_load(dinp + row_at(n0 + r, N, C) + c, count, whole);
        }
        x128 po[R];
        for (int k = 0; k < X128; k++) {   // element k of every row, then its sums over the rows
            float dw = 0.0f, db = 0.0f;
            for (int r = 0; r < R; r++) {
                float d = floatX_to_float(pd[r].e[k]), xhat = (floatX_to_float(px[r].e[k]) - m[r]) * s[r];
                float g = d * floatX_to_float(pw.e[k]);
                po[r].e[k] = to_floatX(floatX_to_float(pi[r].e[k]) + s[r] * (g - g_mean[r] - xhat * gx_mean[r]));
                dw += n0 + r < N ? d * xhat : 0.0f;
                db += n0 + r < N ? d : 0.0f;
            }
            sums[(warp * X128 + k) * 32 + lane] = dw;
            if (layernorm) sums[((warps + warp) * X128 + k) * 32 + lane] = db;
        }
        for (int r = 0; r < R; r++)
            if (n0 + r < N) pack_store(dinp + row_at(n0 + r, N, C) + c, po[r], count, whole);
        __syncthreads();
        float dw_sum = 0.0f, db_sum = 0.0f;   // column c0 + 8 lane + warp: element `warp` of lane's pack
        for (int w = 0; w < warps; w++) {
            dw_sum += sums[(w * X128 + warp) * 32 + lane];
            if (layernorm) db_sum += sums[((warps + w) * X128 + warp) * 32 + lane];
        }
        int column = c0 + lane * X128 + warp;
        if (column < C) {
            partials[(size_t)blockIdx.x * C + column] = dw_sum;
            if (layernorm) partials[(size_t)(chunks + blockIdx.x) * C + column] = db_sum;
        }
        __syncthreads();   // every warp has read the sums before the next window's are stored
    }
}

__global__ void __launch_bounds__(COLUMN_BLOCK, 2) layernorm_backward_kernel(floatX* dinp, float* partials, const floatX* dout, const floatX* inp,
                                          const floatX* weight, const float* mean, const float* rstd,
                                          int N, int C) {
    if (C % X128 == 0 && aligned_128(dinp) && aligned_128(dout) && aligned_128(inp) && aligned_128(weight))
        norm_backward_chunk(dinp, partials, dout, inp, weight, mean, rstd, N, C, true, true);
    else
        norm_backward_chunk(dinp, partials, dout, inp, weight, mean, rstd, N, C, true, false);
}

static void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp,
                              const floatX* weight, const floatX* bias, int N, int C) {
    LAUNCH(layernorm_forward_kernel, CEIL_DIV(N, ROWS_PER_BLOCK), ROW_BLOCK, 0,
           out, mean, rstd, inp, weight, bias, N, C);
}

static void residual_layernorm_forward(floatX* residual, floatX* out, float* mean, float* rstd,
                                       const floatX* a, const floatX* b, const floatX* weight,
                                       const floatX* bias, int N, int C) {
    LAUNCH(residual_layernorm_forward_kernel, CEIL_DIV(N, ROWS_PER_BLOCK), ROW_BLOCK, 0,
           residual, out, mean, rstd, a, b, weight, bias, N, C);
}

// partials: layernorm_grad_partials(N, C) floats of workspace
static void layernorm_backward(floatX* dinp, float* dweight, float* dbias, float* partials, const floatX* dout,
                               const floatX* inp, const floatX* weight, const float* mean,
                               const float* rstd, int N, int C) {
    int chunks = layernorm_grad_chunks(N);
    LAUNCH(layernorm_backward_kernel, chunks, COLUMN_BLOCK, 0, dinp, partials, dout, inp, weight, mean, rstd, N, C);
    column_partials_add(dweight, dbias, partials, chunks, C);
}
#else
#define layernorm_forward layernorm_forward_cpu
#define layernorm_backward(dinp, dweight, dbias, partials, ...) layernorm_backward_cpu(dinp, dweight, dbias, __VA_ARGS__)
#define residual_layernorm_forward residual_layernorm_forward_cpu
#endif

// ----------------------------------------------------------------------------
// RMSNorm (Zhang and Sennrich 2019; Megatron's --normalization RMSNorm, --norm-epsilon):
// out = x / sqrt(mean(x^2) + eps) * weight, per row of C; no mean subtracted, no bias.
// The forward keeps each row's rstd = 1 / sqrt(mean(x^2) + eps) for the backward. As LayerNorm's,
// the backward ADDS its dinp into the residual stream's gradient and accumulates dweight; on
// the GPU through the same [chunks, C] column partials (rmsnorm_grad_partials floats).

static void rmsnorm_forward_cpu(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                                float eps) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        float s = (float)(1.0 / sqrt(ss / C + eps));
        float* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] * s) * weight[c];
        rstd[n] = s;
    }
}

// d(inp) += rstd * (g - xhat * mean(g * xhat)), with g = dout * weight and xhat = x * rstd
// (the mean-free half of LayerNorm's formula); dweight += column sums of dout * xhat
static void rmsnorm_backward_cpu(float* dinp, float* dweight, const float* dout, const float* inp,
                                 const float* weight, const float* rstd, int N, int C) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        const float* d = dout + (size_t)n * C;
        float s = rstd[n];
        double gx_mean = 0.0;
        for (int c = 0; c < C; c++) gx_mean += (d[c] * weight[c]) * (x[c] * s);
        gx_mean /= C;
        float* di = dinp + (size_t)n * C;
        for (int c = 0; c < C; c++) di[c] += s * (d[c] * weight[c] - (x[c] * s) * (float)gx_mean);
    }
    #pragma omp parallel for
    for (int c = 0; c < C; c++) {
        float dw = 0.0f;
        for (int n = 0; n < N; n++) dw += dout[(size_t)n * C + c] * (inp[(size_t)n * C + c] * rstd[n]);
        dweight[c] += dw;
    }
}

// the workspace floats of rmsnorm_backward on build b: dweight's [chunks, C] partials
static size_t rmsnorm_grad_partials(BuildTarget b, int N, int C) {
    return b.gpu ? (size_t)layernorm_grad_chunks(N) * C : 0;
}

#ifdef __CUDACC__
// the forward one warp per row (layernorm_forward_kernel's layout); the backward one block per
// chunk of COLUMN_CHUNK_ROWS rows (layernorm_backward_kernel's two steps, without the mean)
__global__ void rmsnorm_forward_kernel(floatX* out, float* rstd, const floatX* inp, const floatX* weight,
                                       int N, int C, float eps) {
    int lane = threadIdx.x % 32, n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    const floatX* x = inp + (size_t)n * C;
    floatX* o = out + (size_t)n * C;
    float ss = 0.0f;
    for (int c = lane * X128; c < C; c += 32 * X128) {
        x128 px = load_pack(x + c, C - c < X128 ? C - c : X128);   // the missing elements are 0
        for (int k = 0; k < X128; k++) ss += floatX_to_float(px.e[k]) * floatX_to_float(px.e[k]);
    }
    float s = 1.0f / sqrtf(warp_reduce_sum(ss) / C + eps);
    for (int c = lane * X128; c < C; c += 32 * X128) {
        int count = C - c < X128 ? C - c : X128;
        x128 px = load_pack(x + c, count), pw = load_pack(weight + c, count), po;
        for (int k = 0; k < X128; k++) po.e[k] = to_floatX(floatX_to_float(px.e[k]) * s * floatX_to_float(pw.e[k]));
        store_pack(o + c, po, count);
    }
    if (lane == 0) rstd[n] = s;
}

// layernorm_backward_kernel's steps without the mean and the bias: dinp += rstd * (g - xhat *
// mean(g xhat)) with xhat = x rstd, g = dout * weight, and the chunk's partial sums of dweight
// (dout xhat) into partials [chunks, C] for column_partials_add
__global__ void __launch_bounds__(COLUMN_BLOCK, 2) rmsnorm_backward_kernel(floatX* dinp, float* partials, const floatX* dout, const floatX* inp,
                                        const floatX* weight, const float* rstd, int N, int C) {
    if (C % X128 == 0 && aligned_128(dinp) && aligned_128(dout) && aligned_128(inp) && aligned_128(weight))
        norm_backward_chunk(dinp, partials, dout, inp, weight, NULL, rstd, N, C, false, true);
    else
        norm_backward_chunk(dinp, partials, dout, inp, weight, NULL, rstd, N, C, false, false);
}

static void rmsnorm_forward(floatX* out, float* rstd, const floatX* inp, const floatX* weight, int N, int C,
                            float eps) {
    LAUNCH(rmsnorm_forward_kernel, CEIL_DIV(N, ROWS_PER_BLOCK), ROW_BLOCK, 0, out, rstd, inp, weight, N, C, eps);
}

// partials: rmsnorm_grad_partials(N, C) floats of workspace
static void rmsnorm_backward(floatX* dinp, float* dweight, float* partials, const floatX* dout, const floatX* inp,
                             const floatX* weight, const float* rstd, int N, int C) {
    int chunks = layernorm_grad_chunks(N);
    LAUNCH(rmsnorm_backward_kernel, chunks, COLUMN_BLOCK, 0, dinp, partials, dout, inp, weight, rstd, N, C);
    column_partials_add(dweight, NULL, partials, chunks, C);
}
#else
#define rmsnorm_forward rmsnorm_forward_cpu
#define rmsnorm_backward(dinp, dweight, partials, ...) rmsnorm_backward_cpu(dinp, dweight, __VA_ARGS__)
#endif
