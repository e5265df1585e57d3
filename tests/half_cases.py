"""tests/half_cases.py FILE — the cases tests/test_emu_half.cpp holds the emulation's fp16
against, converted by numpy.float16 (IEEE binary16, round to nearest even).

The floats: every half; for every two neighbouring non-negative halfs (65504 and 2^16
included, where rounding up means infinity) the float halfway between them, which must tie
to the even one, and the floats just below and above it; all of those negated; then 2^19
random float bit patterns (NaN, infinities, float subnormals, everything) and 2^19 random
values spread evenly over the exponents around fp16's range (2^-27 .. 2^17).
FILE (little-endian): uint32 n; float32 in[n]; uint16 numpy's half of each; float32
numpy's float of each half bit pattern 0 .. 65535.
"""
import sys

import numpy as np

rng = np.random.default_rng(11)
every_half = np.arange(0x10000, dtype=np.uint32).astype(np.uint16).view(np.float16)
finite = np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)  # 0 .. 65504
above = np.append(finite[1:], 65536.0)                                           # each one's next
halfway = ((finite + above) / 2).astype(np.float32)  # exact: 12 significant bits
beside = [np.nextafter(halfway, np.float32(0)), np.nextafter(halfway, np.float32(np.inf))]
near = np.concatenate([finite.astype(np.float32), halfway] + beside)
random_bits = rng.integers(0, 2**32, size=1 << 19, dtype=np.uint64).astype(np.uint32).view(np.float32)
random_values = np.exp2(rng.uniform(-27, 17, size=1 << 19)) * rng.choice([-1.0, 1.0], size=1 << 19)
inputs = np.concatenate([near, -near, random_bits, random_values.astype(np.float32)]).astype(np.float32)

with np.errstate(all="ignore"):  # overflow to infinity is one of the cases
    halfs = inputs.astype(np.float16)
with open(sys.argv[1], "wb") as f:
    f.write(np.uint32(len(inputs)).astype("<u4").tobytes())
    f.write(inputs.astype("<f4").tobytes())
    f.write(halfs.view(np.uint16).astype("<u2").tobytes())
    f.write(every_half.astype("<f4").tobytes())
