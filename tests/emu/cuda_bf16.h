/*
tests/emu/cuda_bf16.h — the bf16 type of the CUDA emulation (tests only).

__nv_bfloat16 is 16 bits: the top half of an IEEE float. Conversions from float round to
nearest even (as __float2bfloat16 does on the GPU); NaN stays NaN. There are deliberately no
implicit conversions or operators: the kernels convert explicitly, and the emulation keeps
them honest.
*/
#pragma once
#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
    uint16_t __x;
};
static_assert(sizeof(__nv_bfloat16) == 2, "bf16 is two bytes");

static inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a (quiet) NaN
        r.__x = (uint16_t)((u >> 16) | 0x40);
        return r;
    }
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    r.__x = (uint16_t)(u >> 16);
    return r;
}

static inline float __bfloat162float(__nv_bfloat16 b) {
    uint32_t u = (uint32_t)b.__x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
