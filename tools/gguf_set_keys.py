#!/usr/bin/python3
"""gguf_set_keys.py — copy a GGUF file with metadata keys set, tensors byte for byte.

The use it was written for: give a checkpoint trained at context C a YaRN
extension to k*C the way a released long-context checkpoint states one
(Qwen2.5/Qwen3 ship YaRN as a config change over weights trained shorter:
"YaRN: Efficient Context Window Extension of Large Language Models",
section 3.2), so that `kvsieve eval` can measure lengths past the bundled
model's trained 16K without retraining it:

    tools/gguf_set_keys.py models/kvsieve-default.gguf OUT.gguf \\
        llama.context_length=u32:65536 llama.rope.scaling.type=str:yarn \\
        llama.rope.scaling.factor=f32:4 llama.rope.scaling.original_context_length=u32:16384

Each KEY=TYPE:VALUE (TYPE: u32, i32, f32, bool, str) replaces the key if the
file has it, else is appended.  The tensor-info records keep their offsets
(relative to the data section), and the data section is copied unchanged
after the new header, padded to the file's alignment; the copy is written
beside OUT and renamed into place.
"""
import os
import struct
import sys

import gguf_reader as G

_TYPES = {
    "u32": (G.T_UINT32, lambda s: struct.pack("<I", int(s))),
    "i32": (G.T_INT32, lambda s: struct.pack("<i", int(s))),
    "f32": (G.T_FLOAT32, lambda s: struct.pack("<f", float(s))),
    "bool": (G.T_BOOL, lambda s: struct.pack("<?", s in ("1", "true"))),
    "str": (G.T_STRING, lambda s: struct.pack("<Q", len(s.encode())) + s.encode()),
}


def _gguf_string(b):
    return struct.pack("<Q", len(b)) + b


def _skip_value(c, vtype):
    """Advance cursor c past one value of vtype (the reader's own parser)."""
    c.value(vtype)


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    src, dst, sets = argv[1], argv[2], argv[3:]
    updates = {}
    for s in sets:
        key, sep, rest = s.partition("=")
        ty, sep2, val = rest.partition(":")
        if not sep or not sep2 or ty not in _TYPES:
            sys.stderr.write("gguf_set_keys: bad setting %r (want KEY=TYPE:VALUE, TYPE one of %s)\n"
                             % (s, ", ".join(_TYPES)))
            return 2
        vt, enc = _TYPES[ty]
        updates[key] = struct.pack("<I", vt) + enc(val)

    r = G.GGUFReader(src)  # validates the whole file first
    buf = memoryview(r.mm)
    c = G._Cursor(buf)
    c.take(4)
    version = c.u32()
    n_tensors = c.u64()
    n_kv = c.u64()
    kv_records = []
    for _ in range(n_kv):
        start = c.pos
        key = c.string()
        vtype = c.u32()
        _skip_value(c, vtype)
        kv_records.append((key, bytes(buf[start:c.pos])))
    t0 = c.pos
    for _ in range(n_tensors):
        c.string()
        nd = c.u32()
        for _ in range(nd):
            c.u64()
        c.u32()
        c.u64()
    tensor_infos = bytes(buf[t0:c.pos])

    out_kv = []
    for key, rec in kv_records:
        if key in updates:
            rec = _gguf_string(key.encode()) + updates.pop(key)
        out_kv.append(rec)
    for key, payload in updates.items():
        out_kv.append(_gguf_string(key.encode()) + payload)

    align = r.alignment
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, len(out_kv)) + b"".join(out_kv) + tensor_infos
    head += b"\0" * ((-len(head)) % align)
    tmp = dst + ".tmp"
    with open(tmp, "wb") as f:
        f.write(head)
        data = buf[r.data_offset:]
        step = 1 << 24
        for i in range(0, len(data), step):
            f.write(data[i:i + step])
    os.replace(tmp, dst)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
