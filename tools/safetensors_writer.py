"""safetensors_writer.py — the safetensors writer of the DLM-making tools
(make_dlm.py, make_constructed_dlm.py); kvsieve's src/checkpoint/safetensors.c
reads what it writes, and so does the Hugging Face library.  read_safetensors
reads it back (make_dlm.py --report measures the file the engine runs).

The format: an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range (plus a free-form "__metadata__" map),
padded with spaces to a multiple of 8, then the raw tensor bytes in header
order.  Also the two vocabulary maps an EAGLE-3 checkpoint carries.
"""
import json
import struct

import numpy as np


def write_safetensors(path, tensors, metadata):
    """tensors: name -> (numpy array already in its little-endian dtype, dtype name
    such as "F16", "F32", "I64", "BOOL"), written in the dict's order."""
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name, (arr, dtype) in tensors.items():
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def eagle3_vocab_maps(draft_ids, n_vocab):
    """EAGLE-3's maps between the draft vocabulary (draft_ids: target ids, ascending)
    and the target's: d2t[i] = target id - i (an offset, as EAGLE-3 stores it) and
    t2d[target id] = whether the draft vocabulary has it."""
    ids = np.asarray(draft_ids, dtype=np.int64)
    t2d = np.zeros(n_vocab, dtype=np.uint8)
    t2d[ids] = 1
    return {"d2t": ((ids - np.arange(len(ids))).astype("<i8"), "I64"), "t2d": (t2d, "BOOL")}


_NP_DTYPES = {"F16": "<f2", "F32": "<f4", "I64": "<i8", "BOOL": "u1"}


def read_safetensors(path):
    """name -> numpy array (F16, F32, I64 and BOOL: what write_safetensors writes)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        dt = _NP_DTYPES.get(t["dtype"])
        if dt is None:
            raise ValueError("read_safetensors: %s has dtype %s, which is not read here" % (name, t["dtype"]))
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=dt).reshape(t["shape"])
    return out
