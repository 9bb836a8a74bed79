"""gguf_writer.py — the GGUF writer of the model-making tools (make_constructed_model.py,
train_model.py); tools/gguf_reader.py reads what it writes, and so do kvsieve and llama.cpp.

Only what those tools emit: F32, F16 and Q8_0 tensors (Q8_0 rounded as ggml's
quantize_row_q8_0 rounds, so files match llama.cpp's byte for byte), GGUF v3
metadata, 32-byte alignment.  The file is written beside its destination and
renamed into place, so a reader never sees half a model.
"""
import os
import struct

import numpy as np

import gguf_reader as G


def q8_0_bytes(a):
    """ggml's Q8_0: per block of 32, d = max|x| / 127 (f16) and q = roundf(x / d)."""
    a = np.asarray(a, dtype=np.float32).reshape(-1, 32)
    d = np.abs(a).max(axis=1) / 127.0
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0.0).astype(np.float32)
    x = a * inv[:, None]
    q = np.clip(np.trunc(x + np.where(x >= 0, 0.5, -0.5)), -127, 127).astype(np.int8)  # roundf: half away from 0
    out = np.zeros(len(a), dtype=[("d", "<f2"), ("q", "i1", 32)])
    out["d"] = d.astype(np.float16)
    out["q"] = q
    return out.tobytes()


def tensor_bytes(a, t):
    if t == G.GGML_F32:
        return np.asarray(a, dtype="<f4").tobytes()
    if t == G.GGML_F16:
        return np.asarray(a, dtype="<f2").tobytes()
    if t == G.GGML_Q8_0:
        return q8_0_bytes(a)
    raise ValueError("gguf_writer: tensor type %d is not written here" % t)


def write_gguf(path, kvs, tensors):
    """kvs: (key, G.T_* type, value[, array element type]); tensors: (name, ndarray [rows][cols], G.GGML_* type)."""
    def s(x):
        b = x.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def val(t, x, et=None):
        if t == G.T_STRING:
            return s(x)
        if t == G.T_ARRAY:
            head = struct.pack("<IQ", et, len(x))
            if et == G.T_STRING:
                return head + b"".join(s(e) for e in x)
            return head + np.asarray(x, dtype=G._SCALAR_NP[et]).tobytes()
        return struct.pack(G._SCALAR_FMT[t], x)

    align = G.DEFAULT_ALIGNMENT
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for kv in kvs:
        head += s(kv[0]) + struct.pack("<I", kv[1]) + val(*kv[1:])
    blobs, off = [], 0
    for name, a, t in tensors:
        data = tensor_bytes(a, t)
        ne = list(reversed(a.shape))
        head += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        head += struct.pack("<IQ", t, off)
        blobs.append(data)
        off += (len(data) + align - 1) // align * align
    head += b"\0" * ((-len(head)) % align)
    with open(path + ".tmp", "wb") as f:
        f.write(head)
        for b in blobs:
            f.write(b + b"\0" * ((-len(b)) % align))
    os.replace(path + ".tmp", path)
