/*
tests/test_emu_half.cpp — the emulation's fp16 conversions (tests/emu/cuda_fp16.h) against
IEEE 754 binary16, which the fp16 build's kernels and the emulated cuBLAS and NCCL rely on.

    test_emu_half          hand-checked values (bit patterns worked out from the format:
                           sign, 5 exponent bits with bias 15, 10 fraction bits), and that
                           every half survives the trip to float and back;
    test_emu_half FILE     the same, then every case in FILE against numpy.float16's own
                           conversions (tests/half_cases.py writes it; tests/test_emu.sh runs
                           both when numpy is there).
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>
#include "cuda_fp16.h"
#include "test.h"

static uint16_t half_bits(float f) { return __float2half(f).__x; }

static float half_value(uint16_t bits) {
    __half h;
    h.__x = bits;
    return __half2float(h);
}

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void check_to_half(float f, uint16_t want, const char* what) {
    char label[160];
    snprintf(label, sizeof label, "fp16 emu: float %.9g -> half 0x%04x (%s)", f, want, what);
    uint16_t got = half_bits(f);
    check(got == want, label, "got 0x%04x", got);
}

static void check_to_float(uint16_t h, float want, const char* what) {
    char label[160];
    snprintf(label, sizeof label, "fp16 emu: half 0x%04x -> float %.9g (%s)", h, want, what);
    float got = half_value(h);
    check(float_bits(got) == float_bits(want), label, "got %.9g (bits 0x%08x)", got, float_bits(got));
}

static void test_hand_checked(void) {
    // normal numbers: (1 + fraction / 2^10) * 2^(exponent - 15)
    check_to_half(1.0f, 0x3c00, "exponent 15, fraction 0");
    check_to_half(-2.0f, 0xc000, "sign, exponent 16");
    check_to_half(0.1f, 0x2e66, "1.6 * 2^-4: fraction 0.6 * 1024 = 614.4 -> 614 = 0x266");
    check_to_half(65504.0f, 0x7bff, "the largest half, exact");
    check_to_half(65519.0f, 0x7bff, "below the halfway point to 2^16");
    // ties to even: at 2048 = 2^11 the spacing is 2
    check_to_half(2049.0f, 0x6800, "tie between 2048 (even) and 2050: 2048");
    check_to_half(2051.0f, 0x6802, "tie between 2050 and 2052 (even): 2052");
    check_to_half(1.0f + 0x1p-11f, 0x3c00, "tie between 1 (even) and 1 + 2^-10: 1");
    check_to_half(1.0f + 3 * 0x1p-11f, 0x3c02, "tie between 1 + 2^-10 and 1 + 2^-9 (even)");
    // overflow: at or above 65520, the tie between 65504 (odd) and 2^16, is infinity
    check_to_half(65520.0f, 0x7c00, "tie rounds up past 65504: +inf");
    check_to_half(-65520.0f, 0xfc00, "-inf");
    check_to_half(1e6f, 0x7c00, "far out of range: +inf");
    check_to_half(INFINITY, 0x7c00, "+inf stays inf");
    check_to_half(-INFINITY, 0xfc00, "-inf stays inf");
    // subnormals: fraction * 2^-24
    check_to_half(0x1p-14f, 0x0400, "the smallest normal");
    check_to_half(0x1p-24f, 0x0001, "the smallest subnormal");
    check_to_half(1023 * 0x1p-24f, 0x03ff, "the largest subnormal");
    check_to_half(1023.5f * 0x1p-24f, 0x0400, "tie between 1023 * 2^-24 and 2^-14 (even): rounds into the normals");
    check_to_half(0x1p-25f, 0x0000, "2^-25, the tie between 0 (even) and 2^-24: 0");
    check_to_half(3 * 0x1p-26f, 0x0001, "3 * 2^-26, above the tie: 2^-24");
    check_to_half(-0x1p-25f, 0x8000, "-2^-25 rounds to negative zero");
    check_to_half(1e-8f, 0x0000, "below 2^-25: 0");
    check_to_half(1e-40f, 0x0000, "a float subnormal: 0");
    check_to_half(0.0f, 0x0000, "zero");
    check_to_half(-0.0f, 0x8000, "negative zero keeps its sign");
    uint16_t nan = half_bits(NAN);
    check((nan & 0x7c00) == 0x7c00 && (nan & 0x03ff) != 0, "fp16 emu: float NaN -> a half NaN (exponent 31, fraction not 0)",
          "got 0x%04x", nan);

    check_to_float(0x3c00, 1.0f, "one");
    check_to_float(0x3555, 0.333251953125f, "(1 + 341/1024) / 4, the half nearest 1/3");
    check_to_float(0x7bff, 65504.0f, "the largest half");
    check_to_float(0x0400, 0x1p-14f, "the smallest normal");
    check_to_float(0x0001, 0x1p-24f, "the smallest subnormal");
    check_to_float(0x03ff, 1023 * 0x1p-24f, "the largest subnormal");
    check_to_float(0x8000, -0.0f, "negative zero");
    check_to_float(0x7c00, INFINITY, "+inf");
    check_to_float(0xfc00, -INFINITY, "-inf");
    check(isnan(half_value(0x7e00)) && isnan(half_value(0x7c01)) && isnan(half_value(0xffff)),
          "fp16 emu: half NaNs (0x7e00, 0x7c01, 0xffff, the poison of fresh device memory) -> float NaN", "not NaN");
}

// every half but the NaNs comes back from float unchanged, and every NaN comes back a NaN
static void test_round_trip(void) {
    int bad = 0, first = -1;
    for (int h = 0; h < 0x10000; h++) {
        float f = half_value((uint16_t)h);
        uint16_t back = half_bits(f);
        bool ok = isnan(f) ? (back & 0x7fff) > 0x7c00 : back == h;
        if (!ok && bad++ == 0) first = h;
    }
    check(bad == 0, "fp16 emu: all 65536 halfs -> float -> half come back (NaNs as NaNs)",
          "%d do not, the first 0x%04x", bad, first);
}

// FILE (little-endian, tests/half_cases.py): uint32 n; float in[n]; uint16 numpy's half of
// each in[n]; float numpy's float of each half bit pattern 0..65535 [65536]
static void test_against_numpy(const char* path) {
    FILE* f = fopen(path, "rb");
    uint32_t n = 0;
    bool ok = f && fread(&n, 4, 1, f) == 1;
    std::vector<float> in(n), widened(0x10000);
    std::vector<uint16_t> want(n);
    ok = ok && fread(in.data(), 4, n, f) == n && fread(want.data(), 2, n, f) == n && fread(widened.data(), 4, 0x10000, f) == 0x10000;
    if (f) fclose(f);
    if (!ok) {
        check(0, "fp16 emu: read the numpy cases", "cannot read %s", path);
        return;
    }

    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t got = half_bits(in[i]);
        bool is_nan = (want[i] & 0x7fff) > 0x7c00;   // NaN: any NaN will do (payloads differ)
        bool same = is_nan ? (got & 0x7fff) > 0x7c00 : got == want[i];
        if (!same && bad++ == 0) first = i;
    }
    char label[200];
    snprintf(label, sizeof label, "fp16 emu: float -> half equals numpy.float16 on %u floats (every tie between "
             "neighbouring halfs and the floats beside it, every half, random bits and values)", n);
    check(bad == 0, label, "%zu differ; the first, float %.9g (0x%08x): got 0x%04x, numpy 0x%04x", bad,
          in[first], float_bits(in[first]), half_bits(in[first]), want[first]);

    bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float got = half_value((uint16_t)h);
        bool same = isnan(widened[h]) ? isnan(got) : float_bits(got) == float_bits(widened[h]);
        if (!same && bad++ == 0) first = h;
    }
    check(bad == 0, "fp16 emu: half -> float equals numpy on all 65536 half bit patterns",
          "%zu differ; the first, half 0x%04zx: got %.9g, numpy %.9g", bad, first, half_value((uint16_t)first), widened[first]);
}

int main(int argc, char** argv) {
    test_hand_checked();
    test_round_trip();
    if (argc > 1) test_against_numpy(argv[1]);
    return tests_summary();
}
