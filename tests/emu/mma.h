/*
tests/emu/mma.h — the WMMA subset of CUDA's <mma.h> that kernels.cuh uses, on the CPU
emulation of tests/emu/cuda_runtime.h (tests only).

nvcuda::wmma with 16 x 16 x 16 tiles: fragment<matrix_a | matrix_b | accumulator>, fill_fragment,
load_matrix_sync, store_matrix_sync (mem_row_major / mem_col_major) and mma_sync, with 16-bit
inputs (bf16 or fp16) and fp32 accumulators. What it keeps of the hardware's rules:
  - Every one of them is warp-collective: each is a warp barrier, as the shuffles are. All 32
    lanes must reach it; a lane that exited, or waits at another barrier, is reported (the
    emulation's deadlock or exited-lanes error, naming the kernel).
  - The pointer of a load or a store must be 256-bit (32-byte) aligned, and ldm a multiple of
    16 bytes (8 elements of a 16-bit type, 4 floats): a violation is an emu error line that
    names the kernel, the block and the thread.
  - An accumulator's elements are spread over the lanes (the hardware's layout is unspecified;
    here lane L holds elements L, L + 32, ..., of the 16 x 16 tile in row-major order). A store
    writes only the calling lane's elements, so reading what another lane stored needs a
    barrier in between, as on the GPU; a load of an accumulator reads only the lane's own.
  - mma_sync multiplies the 16-bit inputs exactly (a bf16 or fp16 product fits in a float) and
    adds in fp32: d = c + sum_k a[i][k] b[k][j], in k order (the hardware's order of the
    additions inside one tile is unspecified, and so is its rounding of them).
matrix_a and matrix_b fragments hold the whole 16 x 16 tile in every lane (each lane needs all
of it to compute its share of the product): an emulation detail no kernel may rely on.
*/
#pragma once
#include "cuda_runtime.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include <type_traits>

#ifndef __align__
#define __align__(n) __attribute__((aligned(n)))
#endif

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

static inline float emu_wmma_float(float x) { return x; }
static inline float emu_wmma_float(__nv_bfloat16 x) { return __bfloat162float(x); }
static inline float emu_wmma_float(__half x) { return __half2float(x); }

// an input tile (matrix_a or matrix_b): element (row, col) at x[row * 16 + col], in every lane
template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulation has the 16 x 16 x 16 shape only");
    enum { num_elements = 256 };
    T x[256];
};

// the fp32 accumulator: lane L holds elements L + 32 i (row-major), i < 8
template <int M, int N, int K>
struct fragment<accumulator, M, N, K, float, void> {
    static_assert(M == 16 && N == 16 && K == 16, "the emulation has the 16 x 16 x 16 shape only");
    enum { num_elements = 8 };
    float x[8];
};

// the warp barrier every WMMA call is, and the CUDA rules on its memory operand
static inline unsigned emu_wmma_enter(const char* op, const void* p, unsigned ldm, size_t element_bytes) {
    if (emu.current < 0) emu_fail("%s called outside a kernel", op);
    char line[320];
    if (p != NULL && (uintptr_t)p % 32 != 0) {
        snprintf(line, sizeof line, "kernel %s (block %u, thread %u): %s: pointer %p is not 256-bit (32-byte) aligned",
                 emu.kernel, blockIdx.x, threadIdx.x, op, p);
        emu_fail("%s", line);
    }
    if (p != NULL && (ldm * element_bytes) % 16 != 0) {
        snprintf(line, sizeof line, "kernel %s (block %u, thread %u): %s: ldm %u is not a multiple of 16 bytes (%zu elements)",
                 emu.kernel, blockIdx.x, threadIdx.x, op, ldm, 16 / element_bytes);
        emu_fail("%s", line);
    }
    emu_wait(EMU_AT_WARP_SYNC);
    return threadIdx.x % 32;   // the lane
}

// element e (row-major) of a tile stored at p with leading dimension ldm
static inline size_t emu_wmma_offset(unsigned e, unsigned ldm, bool row_major_layout) {
    unsigned row = e / 16, col = e % 16;
    return row_major_layout ? (size_t)row * ldm + col : (size_t)col * ldm + row;
}

template <class Use, class T, class Layout>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, T value) {
    emu_wmma_enter("fill_fragment", NULL, 0, 0);
    for (int i = 0; i < (int)f.num_elements; i++) f.x[i] = value;
}
static inline void fill_fragment(fragment<accumulator, 16, 16, 16, float>& f, float value) {
    emu_wmma_enter("fill_fragment", NULL, 0, 0);
    for (int i = 0; i < 8; i++) f.x[i] = value;
}

template <class Use, class T, class Layout>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
    static_assert(sizeof(T) == 2, "matrix_a / matrix_b: 16-bit inputs");
    emu_wmma_enter("load_matrix_sync", p, ldm, sizeof(T));
    for (unsigned e = 0; e < 256; e++) f.x[e] = p[emu_wmma_offset(e, ldm, std::is_same<Layout, row_major>::value)];
}
static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm, layout_t layout) {
    unsigned lane = emu_wmma_enter("load_matrix_sync", p, ldm, sizeof(float));
    for (unsigned i = 0; i < 8; i++) f.x[i] = p[emu_wmma_offset(lane + 32 * i, ldm, layout == mem_row_major)];
}
static inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t layout) {
    unsigned lane = emu_wmma_enter("store_matrix_sync", p, ldm, sizeof(float));
    for (unsigned i = 0; i < 8; i++) p[emu_wmma_offset(lane + 32 * i, ldm, layout == mem_row_major)] = f.x[i];
}

// d = a b + c, this lane's elements of d (d may be c)
template <class T, class LayoutA, class LayoutB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
                            const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
    unsigned lane = emu_wmma_enter("mma_sync", NULL, 0, 0);
    for (unsigned i = 0; i < 8; i++) {
        unsigned e = lane + 32 * i, row = e / 16, col = e % 16;
        float sum = c.x[i];
        for (unsigned k = 0; k < 16; k++) sum += emu_wmma_float(a.x[row * 16 + k]) * emu_wmma_float(b.x[k * 16 + col]);
        d.x[i] = sum;
    }
}

}  // namespace wmma
}  // namespace nvcuda
