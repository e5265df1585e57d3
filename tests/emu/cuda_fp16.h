/*
tests/emu/cuda_fp16.h — the fp16 type of the CUDA emulation (tests only).

__half is IEEE 754 binary16: 1 sign bit, 5 exponent bits (bias 15), 10 fraction bits.
  exponent 1..30   normal numbers (1 + fraction / 2^10) * 2^(exponent - 15): 2^-14 .. 65504
  exponent 0       zero and the subnormals, fraction * 2^-24 (the smallest is 2^-24)
  exponent 31      infinity (fraction 0) and NaN (any other fraction)
Conversions from float round to nearest, ties to even (as __float2half and __float2half_rn
do on the GPU): a value at or above 65520, halfway between 65504 and 2^16, becomes infinity;
one at or below 2^-25, halfway between 0 and 2^-24, becomes zero. NaN stays NaN (quiet).
Conversions to float are exact. As in cuda_bf16.h there are deliberately no implicit
conversions or operators: the kernels convert explicitly, and the emulation keeps them honest.
*/
#pragma once
#include <stdint.h>
#include <string.h>

struct __half {
    uint16_t __x;
};
static_assert(sizeof(__half) == 2, "fp16 is two bytes");

// x / 2^shift rounded to the nearest integer, ties to the even one (1 <= shift <= 31)
static inline uint32_t emu_shift_right_round_even(uint32_t x, int shift) {
    uint32_t quotient = x >> shift, remainder = x & ((1u << shift) - 1), half_way = 1u << (shift - 1);
    if (remainder > half_way || (remainder == half_way && (quotient & 1u))) quotient++;
    return quotient;
}

static inline __half __float2half(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t magnitude = u & 0x7fffffffu, fraction = u & 0x7fffffu;
    int exponent = (int)(magnitude >> 23) - 127;  // of |f| = 1.fraction * 2^exponent (normal floats)
    __half r;
    if (magnitude > 0x7f800000u) {  // NaN: a quiet NaN with the payload's top bits
        r.__x = (uint16_t)(sign | 0x7e00u | (fraction >> 13));
    } else if (exponent > 15) {  // |f| >= 2^16, or infinity
        r.__x = (uint16_t)(sign | 0x7c00u);
    } else if (exponent >= -14) {
        // normal range: keep 10 of the 23 fraction bits; a carry out of the fraction moves
        // on into the exponent (1.11..1 rounds up to the next power of two, 65520 to 0x7c00 = inf)
        r.__x = (uint16_t)(sign | (((uint32_t)(exponent + 15) << 10) + emu_shift_right_round_even(fraction, 13)));
    } else {
        // below 2^-14: a subnormal, |f| / 2^-24 rounded. |f| = (2^23 + fraction) * 2^(exponent - 23),
        // so that is (2^23 + fraction) / 2^(-1 - exponent). A shift of 25 already leaves
        // less than half (so 0); float subnormals (exponent -127) and zero land there too.
        int shift = -1 - exponent < 25 ? -1 - exponent : 25;
        uint32_t significand = magnitude >= 0x800000u ? fraction | 0x800000u : fraction;
        r.__x = (uint16_t)(sign | emu_shift_right_round_even(significand, shift));
    }
    return r;
}

static inline __half __float2half_rn(float f) { return __float2half(f); }

static inline float __half2float(__half h) {
    uint32_t sign = (uint32_t)(h.__x & 0x8000u) << 16, exponent = (h.__x >> 10) & 0x1fu, fraction = h.__x & 0x3ffu;
    if (exponent == 0) {  // zero or subnormal: fraction * 2^-24, exact in float
        float f = (float)fraction * 0x1p-24f;
        return sign ? -f : f;
    }
    uint32_t u = exponent == 31 ? sign | 0x7f800000u | (fraction << 13)             // infinity, NaN
                                : sign | ((exponent - 15 + 127) << 23) | (fraction << 13);  // normal
    float f;
    memcpy(&f, &u, 4);
    return f;
}
