#!/usr/bin/env python3
"""make_quant_fixtures.py -- golden dequantization fixtures for the weight
types Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS and MXFP4.

Why: kvsieve's dequantizers (src/tensor/quant_types.c) define what every
kernel of those types must compute, so they are checked against an
independent implementation: the numpy dequantizers of llama.cpp's gguf-py
(gguf/quants.py), run once here; the C test (tests/test_quant_types.c)
needs only the files this writes, not llama.cpp.

Each fixture tests/fixtures/quant/<type>.bin is the raw bytes of 1024
elements' worth of blocks (random bytes, with every f16 scale field set to
a random finite value of either sign, so no NaN or inf creeps in; MXFP4's
E8M0 exponent byte set to 2^-20 .. 2^12, never the NaN code 255) followed
by the 1024 float32 values (little-endian) gguf-py dequantizes them to.

Usage: PYTHONPATH=/path/to/llama.cpp/gguf-py /usr/bin/python3 \
           tools/make_quant_fixtures.py tests/fixtures/quant
"""
import os
import sys

import numpy as np
from gguf import quants
from gguf.constants import GGMLQuantizationType as T

N = 1024
# type name -> (GGML type, byte offsets of f16 scale fields in a block)
TYPES = {
    "q4_1": (T.Q4_1, (0, 2)),
    "q5_0": (T.Q5_0, (0,)),
    "q5_1": (T.Q5_1, (0, 2)),
    "iq4_nl": (T.IQ4_NL, (0,)),
    "q2_k": (T.Q2_K, (80, 82)),
    "q3_k": (T.Q3_K, (108,)),
    "q5_k": (T.Q5_K, (0, 2)),
    "iq4_xs": (T.IQ4_XS, (0,)),
    "mxfp4": (T.MXFP4, ()),  # last: the earlier types' random draws stay as they were
}
E8M0_OFFSETS = {"mxfp4": (0,)}


def main(out_dir):
    rng = np.random.default_rng(47)
    os.makedirs(out_dir, exist_ok=True)
    for name, (qt, f16_offsets) in TYPES.items():
        block_size, type_size = quants.GGML_QUANT_SIZES[qt]
        nb = N // block_size
        raw = rng.integers(0, 256, size=(nb, type_size), dtype=np.uint8)
        for off in f16_offsets:
            mag = np.exp(rng.uniform(np.log(1e-3), np.log(1.0), size=nb))
            sign = np.where(rng.random(nb) < 0.5, -1.0, 1.0)
            raw[:, off:off + 2] = (mag * sign).astype(np.float16).view(np.uint8).reshape(nb, 2)
        for off in E8M0_OFFSETS.get(name, ()):
            raw[:, off] = rng.integers(127 - 20, 127 + 13, size=nb, dtype=np.uint8)
        vals = quants.dequantize(raw.reshape(-1), qt).astype("<f4").reshape(-1)
        assert vals.size == N and np.all(np.isfinite(vals))
        with open(os.path.join(out_dir, name + ".bin"), "wb") as f:
            f.write(raw.tobytes())
            f.write(vals.tobytes())
        print(f"{name}: {nb} blocks of {type_size} bytes, {N} values")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/quant")
