/*
kernels/lanes.cuh — the plain-C references' inner loops, written so that the compiler runs
them on vector lanes: axpy_lanes, dot_lanes, exp_poly. Every build compiles them (the tests
hold the CUDA kernels against the references).

Included by kernels.cuh, the index of kernels/: the conventions every kernel keeps are there.
*/
#pragma once

// ----------------------------------------------------------------------------
// the references' inner loops, written so that the compiler runs them on vector lanes
// GCC vectorizes a loop only where it can prove it safe: __restrict__ says that the arrays do
// not overlap, and `omp simd` lets a sum be split over the lanes (a split fixed at compile
// time: the same bits every run, whatever the thread count). A loop that updates several
// arrays through pointers it cannot tell apart runs one element at a time.

// y[i] += a * x[i]
static inline void axpy_lanes(float* __restrict__ y, float a, const float* __restrict__ x, int n) {
    #pragma omp simd
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

// the sum of x[i] * y[i]: 8 running sums (element i goes to sum i % 8), which the compiler
// keeps in vector lanes, added pairwise at the end. (`omp simd reduction` adds its lanes one
// after the other at the end, a chain of 16 adds on AVX-512 that took most of a head-size dot
// product.)
static inline float dot_lanes(const float* x, const float* y, int n) {
    float s[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += x[i + j] * y[i + j];
    for (; i < n; i++) s[i % 8] += x[i] * y[i];
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

// exp(x) in arithmetic that vectorizes. glibc's expf is a call, one element at a time (its
// vector versions need -ffast-math), and was most of the time of GELU and the cross-entropy.
// Cephes's expf (Moshier): exp(x) = 2^k exp(r), k = round(x / ln 2), r = x - k ln 2 in
// [-ln2/2, ln2/2] (ln 2 in two parts, the first exact in few bits, so that r is exact), exp(r)
// by a polynomial. Within 1.03 ulp of exp over [-87, 88] (tests/test_kernels.c measures it);
// below -87 it gives 0 (exp(-87) = 1.6e-38, next to nothing beside any sum it joins), above 88
// +inf (exp overflows a float at 88.72), NaN stays NaN. The rounding adds and subtracts
// 1.5 * 2^23 (which leaves the nearest integer), and 2^k is built from its bits: no branch, no
// call, so every lane runs it.
static inline float exp_poly(float x) {
    float c = x >= -87.0f ? (x <= 88.0f ? x : 88.0f) : -87.0f;   // (NaN -> -87: k stays an integer)
    float k = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = (c - k * 0.693359375f) - k * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)k + 127) << 23;   // 2^k, k in [-126, 127]
    float two_k;
    memcpy(&two_k, &bits, sizeof(two_k));
    return x < -87.0f ? 0.0f : x > 88.0f ? INFINITY : x != x ? x : p * two_k;
}
