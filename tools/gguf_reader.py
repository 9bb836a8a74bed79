#!/usr/bin/python3
"""gguf_reader.py — a small, independent GGUF v3 reader with numpy dequantization.

Written from the public GGUF specification and GGML block-layout definitions
(not from kvsieve's C code) so that it can serve as an independent reference.

    r = GGUFReader("model.gguf")
    r.kv["llama.embedding_length"]          # metadata (python scalars / lists / str)
    t = r.tensors["blk.0.attn_q.weight"]     # TensorInfo(name, ne, type, offset, ...)
    w = r.dequantize("blk.0.attn_q.weight") # float32 ndarray, shape ne reversed

Shape convention: GGUF ne[0] is the innermost (fastest-varying) dimension, so a
tensor with ne=[in, out] is returned as a numpy array of shape (out, in): a
row-major [out][in] matrix, i.e. y = W @ x.

Supported tensor types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K,
Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4.  Dequantization is bit-exact to
GGML's reference dequantize_row_* routines: every product is formed in float32
in the same order as the C reference (`--selftest` checks each vectorised
dequantizer against an element-by-element transcription of the C routine and,
where tests/fixtures/quant/ has them, against gguf-py's values).
"""
import struct
import sys

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, \
    T_ARRAY, T_UINT64, T_INT64, T_FLOAT64 = range(13)

_SCALAR_FMT = {
    T_UINT8: "<B", T_INT8: "<b", T_UINT16: "<H", T_INT16: "<h", T_UINT32: "<I",
    T_INT32: "<i", T_FLOAT32: "<f", T_BOOL: "<?", T_UINT64: "<Q", T_INT64: "<q",
    T_FLOAT64: "<d",
}
_SCALAR_NP = {
    T_UINT8: "<u1", T_INT8: "<i1", T_UINT16: "<u2", T_INT16: "<i2", T_UINT32: "<u4",
    T_INT32: "<i4", T_FLOAT32: "<f4", T_BOOL: "<u1", T_UINT64: "<u8", T_INT64: "<i8",
    T_FLOAT64: "<f8",
}

# GGML tensor types: id -> (name, elements per block, bytes per block)
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0, GGML_Q4_K, GGML_Q6_K, GGML_BF16 = 0, 1, 2, 8, 12, 14, 30
GGML_Q4_1, GGML_Q5_0, GGML_Q5_1, GGML_Q2_K, GGML_Q3_K, GGML_Q5_K = 3, 6, 7, 10, 11, 13
GGML_IQ4_NL, GGML_IQ4_XS = 20, 23
GGML_MXFP4 = 39
QK_K = 256
GGML_TYPES = {
    GGML_F32: ("f32", 1, 4),
    GGML_F16: ("f16", 1, 2),
    GGML_Q4_0: ("q4_0", 32, 2 + 16),
    GGML_Q8_0: ("q8_0", 32, 2 + 32),
    GGML_Q4_K: ("q4_k", QK_K, 2 + 2 + 12 + QK_K // 2),
    GGML_Q6_K: ("q6_k", QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
    GGML_BF16: ("bf16", 1, 2),
    GGML_MXFP4: ("mxfp4", 32, 1 + 16),
    GGML_Q4_1: ("q4_1", 32, 2 + 2 + 16),
    GGML_Q5_0: ("q5_0", 32, 2 + 4 + 16),
    GGML_Q5_1: ("q5_1", 32, 2 + 2 + 4 + 16),
    GGML_Q2_K: ("q2_k", QK_K, QK_K // 16 + QK_K // 4 + 2 + 2),
    GGML_Q3_K: ("q3_k", QK_K, QK_K // 8 + QK_K // 4 + 12 + 2),
    GGML_Q5_K: ("q5_k", QK_K, 2 + 2 + 12 + QK_K // 8 + QK_K // 2),
    GGML_IQ4_NL: ("iq4_nl", 32, 2 + 16),
    GGML_IQ4_XS: ("iq4_xs", QK_K, 2 + 2 + QK_K // 64 + QK_K // 2),
}
# block sizes of types we can parse but not dequantize (so tensor extents still validate)
_OTHER_TYPES = {
    9: ("q8_1", 32, 36), 15: ("q8_k", 256, 292), 24: ("i8", 1, 1), 25: ("i16", 1, 2), 26: ("i32", 1, 4),
    27: ("i64", 1, 8), 28: ("f64", 1, 8),
}


def type_name(t):
    if t in GGML_TYPES:
        return GGML_TYPES[t][0]
    if t in _OTHER_TYPES:
        return _OTHER_TYPES[t][0]
    return "type%d" % t


class GGUFError(Exception):
    pass


class TensorInfo:
    __slots__ = ("name", "ne", "type", "offset", "nbytes", "data_start")

    def __init__(self, name, ne, ttype, offset):
        self.name, self.ne, self.type, self.offset = name, list(ne), ttype, offset
        self.nbytes = 0
        self.data_start = 0

    @property
    def n_elements(self):
        n = 1
        for d in self.ne:
            n *= d
        return n

    @property
    def shape(self):
        """numpy shape: ne reversed (outermost first)."""
        return tuple(reversed(self.ne))

    def __repr__(self):
        return "TensorInfo(%s, ne=%s, %s, off=%d)" % (self.name, self.ne, type_name(self.type),
                                                     self.offset)


class _Cursor:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, n):
        if self.pos + n > len(self.buf):
            raise GGUFError("truncated file at offset %d (need %d bytes)" % (self.pos, n))
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def scalar(self, vtype):
        fmt = _SCALAR_FMT[vtype]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def string(self):
        n = self.u64()
        return bytes(self.take(n)).decode("utf-8", errors="surrogateescape")

    def value(self, vtype):
        if vtype == T_STRING:
            return self.string()
        if vtype == T_ARRAY:
            etype = self.u32()
            n = self.u64()
            if etype == T_STRING:
                return [self.string() for _ in range(n)]
            if etype == T_ARRAY:
                return [self.value(T_ARRAY) for _ in range(n)]
            if etype not in _SCALAR_NP:
                raise GGUFError("bad array element type %d" % etype)
            dt = np.dtype(_SCALAR_NP[etype])
            arr = np.frombuffer(self.take(n * dt.itemsize), dtype=dt).copy()
            if etype == T_BOOL:
                arr = arr.astype(bool)
            return arr.tolist()
        if vtype not in _SCALAR_FMT:
            raise GGUFError("bad value type %d" % vtype)
        return self.scalar(vtype)


class GGUFReader:
    def __init__(self, path):
        self.path = path
        self.mm = np.memmap(path, dtype=np.uint8, mode="r")
        buf = memoryview(self.mm)
        c = _Cursor(buf)
        if bytes(c.take(4)) != GGUF_MAGIC:
            raise GGUFError("not a GGUF file (bad magic)")
        self.version = c.u32()
        if self.version not in (2, 3):
            raise GGUFError("unsupported GGUF version %d" % self.version)
        n_tensors = c.u64()
        n_kv = c.u64()
        self.kv = {}
        self.kv_types = {}
        for _ in range(n_kv):
            key = c.string()
            vtype = c.u32()
            self.kv[key] = c.value(vtype)
            self.kv_types[key] = vtype
        self.tensors = {}
        order = []
        for _ in range(n_tensors):
            name = c.string()
            nd = c.u32()
            if nd > 4:
                raise GGUFError("tensor %s has %d dims" % (name, nd))
            ne = [c.u64() for _ in range(nd)]
            ttype = c.u32()
            off = c.u64()
            ti = TensorInfo(name, ne, ttype, off)
            if name in self.tensors:
                raise GGUFError("duplicate tensor %s" % name)
            self.tensors[name] = ti
            order.append(ti)
        self.tensor_order = order
        self.alignment = int(self.kv.get("general.alignment", DEFAULT_ALIGNMENT))
        if self.alignment <= 0 or (self.alignment & (self.alignment - 1)):
            raise GGUFError("bad alignment %d" % self.alignment)
        a = self.alignment
        self.data_offset = (c.pos + a - 1) // a * a
        for ti in order:
            info = GGML_TYPES.get(ti.type) or _OTHER_TYPES.get(ti.type)
            if info is None:
                raise GGUFError("tensor %s: unknown type %d" % (ti.name, ti.type))
            _, bs, bb = info
            if ti.ne and ti.ne[0] % bs:
                raise GGUFError("tensor %s: row %d not a multiple of block %d" %
                                (ti.name, ti.ne[0], bs))
            ti.nbytes = ti.n_elements // bs * bb
            ti.data_start = self.data_offset + ti.offset
            if ti.offset % a:
                raise GGUFError("tensor %s: misaligned offset" % ti.name)
            if ti.data_start + ti.nbytes > len(self.mm):
                raise GGUFError("tensor %s: data beyond end of file" % ti.name)

    # ------------------------------------------------------------------ access
    def get(self, key, default=None):
        return self.kv.get(key, default)

    def raw(self, name):
        """Raw bytes of a tensor as a uint8 memmap view."""
        ti = self.tensors[name]
        return self.mm[ti.data_start:ti.data_start + ti.nbytes]

    def dequantize(self, name):
        ti = self.tensors[name]
        flat = dequantize(self.raw(name), ti.type, ti.n_elements)
        return flat.reshape(ti.shape)


# ---------------------------------------------------------------- dequant --
def f16_to_f32(u16):
    """IEEE binary16 bits (uint16 array) -> float32 (exact)."""
    return np.asarray(u16, dtype="<u2").view(np.float16).astype(np.float32)


def bf16_to_f32(u16):
    """bfloat16 bits -> float32 (exact: the bits are the high half of an f32)."""
    return (np.asarray(u16, dtype="<u2").astype(np.uint32) << 16).view(np.float32)


def _blocks(raw, n, bs, bb):
    nb = n // bs
    b = np.asarray(raw, dtype=np.uint8)
    if b.size != nb * bb:
        raise GGUFError("size mismatch: %d bytes for %d elements" % (b.size, n))
    return b.reshape(nb, bb)


def _half(col2):
    """[nb, 2] uint8 columns -> float32 from little-endian f16."""
    return f16_to_f32(np.ascontiguousarray(col2).view("<u2")[:, 0])


def dequant_q8_0(raw, n):
    b = _blocks(raw, n, 32, 34)
    d = _half(b[:, 0:2])[:, None]
    q = b[:, 2:34].view(np.int8).astype(np.float32)
    return (q * d).reshape(-1)  # x = q * d


def dequant_q4_0(raw, n):
    b = _blocks(raw, n, 32, 18)
    d = _half(b[:, 0:2])[:, None]
    qs = b[:, 2:18]
    lo = (qs & 0x0F).astype(np.int32) - 8   # elements 0..15
    hi = (qs >> 4).astype(np.int32) - 8     # elements 16..31
    q = np.concatenate([lo, hi], axis=1).astype(np.float32)
    return (q * d).reshape(-1)  # x = (nibble - 8) * d


def _q4k_scale_min(sc):
    """sc: [nb, 12] uint8 -> (scales [nb, 8], mins [nb, 8]) as uint8 6-bit values."""
    sc = sc.astype(np.uint8)
    s = np.empty((sc.shape[0], 8), np.uint8)
    m = np.empty((sc.shape[0], 8), np.uint8)
    # sub-blocks 0..3: low 6 bits of bytes 0..3 (scale) and 4..7 (min)
    s[:, 0:4] = sc[:, 0:4] & 63
    m[:, 0:4] = sc[:, 4:8] & 63
    # sub-blocks 4..7: low nibble / high nibble of bytes 8..11, plus the top two
    # bits of bytes 0..3 (scale) and 4..7 (min) as bits 4..5
    s[:, 4:8] = (sc[:, 8:12] & 0x0F) | ((sc[:, 0:4] >> 6) << 4)
    m[:, 4:8] = (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)
    return s, m


def dequant_q4_k(raw, n):
    b = _blocks(raw, n, QK_K, 144)
    nb = b.shape[0]
    d = _half(b[:, 0:2])
    dmin = _half(b[:, 2:4])
    s, m = _q4k_scale_min(b[:, 4:16])
    qs = b[:, 16:144].reshape(nb, 4, 32)  # 4 groups of 32 bytes, each covers 64 elements
    lo = (qs & 0x0F).astype(np.float32)   # sub-block 2g
    hi = (qs >> 4).astype(np.float32)     # sub-block 2g+1
    q = np.stack([lo, hi], axis=2).reshape(nb, 8, 32)  # [nb, sub-block, 32]
    d_sub = (d[:, None] * s.astype(np.float32))[:, :, None]        # d * sc  (f32)
    m_sub = (dmin[:, None] * m.astype(np.float32))[:, :, None]     # dmin * m (f32)
    return (d_sub * q - m_sub).reshape(-1)


def dequant_q6_k(raw, n):
    b = _blocks(raw, n, QK_K, 210)
    nb = b.shape[0]
    ql = b[:, 0:128].reshape(nb, 2, 64)
    qh = b[:, 128:192].reshape(nb, 2, 32)
    sc = b[:, 192:208].view(np.int8).reshape(nb, 2, 8).astype(np.float32)
    d = _half(b[:, 208:210])
    # per 128-element half: 4 runs of 32 elements
    l0, l1 = ql[:, :, 0:32], ql[:, :, 32:64]
    q = np.empty((nb, 2, 4, 32), np.int32)
    q[:, :, 0] = (l0 & 0x0F) | (((qh >> 0) & 3) << 4)
    q[:, :, 1] = (l1 & 0x0F) | (((qh >> 2) & 3) << 4)
    q[:, :, 2] = (l0 >> 4) | (((qh >> 4) & 3) << 4)
    q[:, :, 3] = (l1 >> 4) | (((qh >> 6) & 3) << 4)
    q = (q - 32).astype(np.float32).reshape(nb, 2, 4, 2, 16)  # 16-element sub-blocks
    # scale index within a half: run r, sub-run h -> 2*r + h
    scale = sc.reshape(nb, 2, 4, 2)[..., None]
    return ((d[:, None, None, None, None] * scale) * q).reshape(-1)  # (d * sc) * q


def dequant_q4_1(raw, n):
    b = _blocks(raw, n, 32, 20)
    d = _half(b[:, 0:2])[:, None]
    m = _half(b[:, 2:4])[:, None]
    qs = b[:, 4:20]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
    return (q * d + m).reshape(-1)  # x = nibble * d + m


def _q5_high(qh4):
    """[nb, 4] uint8 (a little-endian uint32 qh) -> [nb, 32] fifth bits (0 or 16):
    element j < 16 takes bit j, element j + 16 bit j + 16 (GGML's xh_0 / xh_1)."""
    qh = np.ascontiguousarray(qh4).view("<u4")[:, 0].astype(np.uint32)
    bits = (qh[:, None] >> np.arange(32, dtype=np.uint32)[None, :]) & 1
    return (bits << 4).astype(np.int32)


def dequant_q5_0(raw, n):
    b = _blocks(raw, n, 32, 22)
    d = _half(b[:, 0:2])[:, None]
    qs = b[:, 6:22]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32) | _q5_high(b[:, 2:6])
    return ((q - 16).astype(np.float32) * d).reshape(-1)  # x = (q5 - 16) * d


def dequant_q5_1(raw, n):
    b = _blocks(raw, n, 32, 24)
    d = _half(b[:, 0:2])[:, None]
    m = _half(b[:, 2:4])[:, None]
    qs = b[:, 8:24]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32) | _q5_high(b[:, 4:8])
    return (q.astype(np.float32) * d + m).reshape(-1)  # x = q5 * d + m


def dequant_q2_k(raw, n):
    # block_q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin.
    # Per 128-element half: 32 bytes of qs, read 4 times at shifts 0, 2, 4, 6,
    # each pass giving two 16-element sub-blocks (bytes 0..15 and 16..31).
    b = _blocks(raw, n, QK_K, 84)
    nb = b.shape[0]
    sc = b[:, 0:16]
    qs = b[:, 16:80].reshape(nb, 2, 1, 2, 16)               # [half, -, sub, 16]
    d = _half(b[:, 80:82])
    dmin = _half(b[:, 82:84])
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1, 1)
    q = ((qs >> shifts) & 3).astype(np.float32)             # [nb, half, pass, sub, 16]
    dl = (d[:, None] * (sc & 0x0F).astype(np.float32)).reshape(nb, 2, 4, 2, 1)
    ml = (dmin[:, None] * (sc >> 4).astype(np.float32)).reshape(nb, 2, 4, 2, 1)
    return (dl * q - ml).reshape(-1)


def _q3k_scales(sc):
    """[nb, 12] uint8 -> [nb, 16] signed 6-bit scales (GGML's kmask1/kmask2 unpacking)."""
    aux = np.ascontiguousarray(sc).view("<u4").astype(np.uint32)  # [nb, 3]
    k1, k2 = np.uint32(0x03030303), np.uint32(0x0F0F0F0F)
    a0, a1, tmp = aux[:, 0], aux[:, 1], aux[:, 2]
    out = np.stack([(a0 & k2) | (((tmp >> 0) & k1) << 4),
                    (a1 & k2) | (((tmp >> 2) & k1) << 4),
                    ((a0 >> 4) & k2) | (((tmp >> 4) & k1) << 4),
                    ((a1 >> 4) & k2) | (((tmp >> 6) & k1) << 4)], axis=1).astype("<u4")
    return out.view(np.uint8).reshape(-1, 16).astype(np.int32) - 32


def dequant_q3_k(raw, n):
    # block_q3_K: hmask[32], qs[64], scales[12], d.  Like Q2_K's layout; the
    # third bit comes from hmask bit m (m = 0..7 over the 8 passes), and a
    # clear bit subtracts 4.
    b = _blocks(raw, n, QK_K, 110)
    nb = b.shape[0]
    hm = b[:, 0:32].reshape(nb, 1, 1, 2, 16)
    qs = b[:, 32:96].reshape(nb, 2, 1, 2, 16)
    scales = _q3k_scales(b[:, 96:108]).astype(np.float32)
    d = _half(b[:, 108:110])
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1, 1)
    mbit = np.arange(8, dtype=np.uint8).reshape(1, 2, 4, 1, 1)
    low = ((qs >> shifts) & 3).astype(np.int32)
    high = ((hm >> mbit) & 1).astype(np.int32)
    q = (low - 4 * (1 - high)).astype(np.float32)              # [nb, half, pass, sub, 16]
    dl = (d[:, None] * scales).reshape(nb, 2, 4, 2, 1)
    return (dl * q).reshape(-1)


def dequant_q5_k(raw, n):
    b = _blocks(raw, n, QK_K, 176)
    nb = b.shape[0]
    d = _half(b[:, 0:2])
    dmin = _half(b[:, 2:4])
    s, m = _q4k_scale_min(b[:, 4:16])
    qh = b[:, 16:48]                                        # [nb, 32]
    qs = b[:, 48:176].reshape(nb, 4, 32)
    lo = (qs & 0x0F).astype(np.int32)
    hi = (qs >> 4).astype(np.int32)
    g = np.arange(4, dtype=np.uint8).reshape(1, 4, 1)
    lo |= (((qh[:, None, :] >> (2 * g)) & 1) << 4).astype(np.int32)
    hi |= (((qh[:, None, :] >> (2 * g + 1)) & 1) << 4).astype(np.int32)
    q = np.stack([lo, hi], axis=2).reshape(nb, 8, 32).astype(np.float32)
    d_sub = (d[:, None] * s.astype(np.float32))[:, :, None]
    m_sub = (dmin[:, None] * m.astype(np.float32))[:, :, None]
    return (d_sub * q - m_sub).reshape(-1)


# IQ4_NL / IQ4_XS: 4-bit indices into a fixed non-linear table (GGML's kvalues_iq4nl).
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10,
                          1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)


def dequant_iq4_nl(raw, n):
    b = _blocks(raw, n, 32, 18)
    d = _half(b[:, 0:2])[:, None]
    qs = b[:, 2:18]
    q = KVALUES_IQ4NL[np.concatenate([qs & 0x0F, qs >> 4], axis=1)]
    return (d * q).reshape(-1)


def dequant_iq4_xs(raw, n):
    # block_iq4_xs: d, scales_h (u16), scales_l[4], qs[128]; sub-block ib of 32
    # has the 6-bit scale (nibble ib of scales_l) | (bits 2ib..2ib+1 of scales_h) << 4, minus 32.
    b = _blocks(raw, n, QK_K, 136)
    nb = b.shape[0]
    d = _half(b[:, 0:2])
    sh = np.ascontiguousarray(b[:, 2:4]).view("<u2")[:, 0].astype(np.int32)
    sl = b[:, 4:8].astype(np.int32)
    ib = np.arange(8)
    ls = ((sl[:, ib // 2] >> (4 * (ib % 2))) & 0x0F) | (((sh[:, None] >> (2 * ib)) & 3) << 4)
    dl = (d[:, None] * (ls - 32).astype(np.float32))[:, :, None]   # [nb, 8, 1]
    qs = b[:, 8:136].reshape(nb, 8, 16)
    q = KVALUES_IQ4NL[np.concatenate([qs & 0x0F, qs >> 4], axis=2)]  # [nb, 8, 32]
    return (dl * q).reshape(-1)


# MXFP4 (OCP Microscaling Formats v1.0): per 32 values one E8M0 exponent
# byte e (scale 2^(e - 127)) and 16 bytes of E2M1 codes, element j in the low
# nibble of byte j, element j + 16 in the high one (GGML's block_mxfp4).
# E2M1 code c: sign bit 3, then 0, 0.5, 1, 1.5, 2, 3, 4, 6.  Code 8 (negative
# zero in E2M1) is +0.0 here, as in GGML, whose table (kvalues_mxfp4) is int8.
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float64)


def dequant_mxfp4(raw, n):
    nb = n // 32
    b = raw[:nb * 17].reshape(nb, 17)
    scale = np.ldexp(1.0, b[:, 0].astype(np.int64) - 127)  # exact in float64
    qs = b[:, 1:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=1)  # [nb, 32]: low nibbles first
    return (E2M1[codes] * scale[:, None]).astype(np.float32).reshape(-1)


def dequantize(raw, ttype, n):
    raw = np.asarray(raw, dtype=np.uint8)
    if ttype == GGML_F32:
        return np.frombuffer(raw.tobytes() if not raw.flags.c_contiguous else raw,
                             dtype="<f4", count=n).astype(np.float32)
    if ttype == GGML_F16:
        return f16_to_f32(raw.view("<u2")[:n])
    if ttype == GGML_BF16:
        return bf16_to_f32(raw.view("<u2")[:n])
    if ttype == GGML_Q8_0:
        return dequant_q8_0(raw, n)
    if ttype == GGML_Q4_0:
        return dequant_q4_0(raw, n)
    if ttype == GGML_Q4_K:
        return dequant_q4_k(raw, n)
    if ttype == GGML_Q6_K:
        return dequant_q6_k(raw, n)
    if ttype == GGML_MXFP4:
        return dequant_mxfp4(raw, n)
    fn = _MORE_DEQUANT.get(ttype)
    if fn is not None:
        return fn(raw, n)
    raise GGUFError("cannot dequantize type %s" % type_name(ttype))


_MORE_DEQUANT = {
    GGML_Q4_1: dequant_q4_1, GGML_Q5_0: dequant_q5_0, GGML_Q5_1: dequant_q5_1,
    GGML_Q2_K: dequant_q2_k, GGML_Q3_K: dequant_q3_k, GGML_Q5_K: dequant_q5_k,
    GGML_IQ4_NL: dequant_iq4_nl, GGML_IQ4_XS: dequant_iq4_xs,
}


# ------------------------------------------------------------------ misc --
FNV64_OFFSET = 0xCBF29CE484222325
FNV64_PRIME = 0x100000001B3


def fnv1a64_file(path, chunk=1 << 20):
    """FNV-1a 64-bit hash of a file's bytes (pure Python; ~1 s per few MB)."""
    h = FNV64_OFFSET
    mask = (1 << 64) - 1
    p = FNV64_PRIME
    with open(path, "rb") as f:
        while True:
            blk = f.read(chunk)
            if not blk:
                break
            for byte in blk:
                h = ((h ^ byte) * p) & mask
    return h


# -------------------------------------------------------------- self-test --
def _literal_dequant(raw, ttype, n):
    """Element-by-element transcription of GGML's scalar dequantize_row_*
    routines (slow; only to check the vectorised versions bit for bit)."""
    b = bytes(np.asarray(raw, np.uint8))
    f16 = lambda off: np.frombuffer(b[off:off + 2], "<f2")[0].astype(np.float32)  # noqa: E731
    i8 = lambda v: v - 256 if v > 127 else v  # noqa: E731
    y = np.zeros(n, np.float32)
    if ttype == GGML_Q8_0:
        for i in range(n // 32):
            o = i * 34
            d = f16(o)
            for j in range(32):
                y[i * 32 + j] = np.float32(i8(b[o + 2 + j])) * d
    elif ttype == GGML_Q4_0:
        for i in range(n // 32):
            o = i * 18
            d = f16(o)
            for j in range(16):
                x0 = (b[o + 2 + j] & 0x0F) - 8
                x1 = (b[o + 2 + j] >> 4) - 8
                y[i * 32 + j] = np.float32(x0) * d
                y[i * 32 + j + 16] = np.float32(x1) * d
    elif ttype == GGML_Q4_K:
        for i in range(n // 256):
            o = i * 144
            d, dmin = f16(o), f16(o + 2)
            sc = b[o + 4:o + 16]
            q = o + 16
            k = i * 256

            def sm(j):
                if j < 4:
                    return sc[j] & 63, sc[j + 4] & 63
                return ((sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4),
                        (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4))
            for j in range(0, 256, 64):
                is_ = j // 32
                s1, m1 = sm(is_)
                s2, m2 = sm(is_ + 1)
                d1, mm1 = d * np.float32(s1), dmin * np.float32(m1)
                d2, mm2 = d * np.float32(s2), dmin * np.float32(m2)
                for l in range(32):
                    y[k] = d1 * np.float32(b[q + l] & 0xF) - mm1
                    k += 1
                for l in range(32):
                    y[k] = d2 * np.float32(b[q + l] >> 4) - mm2
                    k += 1
                q += 32
    elif ttype == GGML_Q6_K:
        for i in range(n // 256):
            o = i * 210
            d = f16(o + 208)
            ql, qh, sc = o, o + 128, o + 192
            base = i * 256
            for half in range(2):
                for l in range(32):
                    is_ = l // 16
                    h = b[qh + l]
                    q1 = ((b[ql + l] & 0xF) | (((h >> 0) & 3) << 4)) - 32
                    q2 = ((b[ql + l + 32] & 0xF) | (((h >> 2) & 3) << 4)) - 32
                    q3 = ((b[ql + l] >> 4) | (((h >> 4) & 3) << 4)) - 32
                    q4 = ((b[ql + l + 32] >> 4) | (((h >> 6) & 3) << 4)) - 32
                    for r, qq in enumerate((q1, q2, q3, q4)):
                        s = np.float32(i8(b[sc + is_ + 2 * r]))
                        y[base + l + 32 * r] = (d * s) * np.float32(qq)
                base += 128
                ql += 64
                qh += 32
                sc += 8
    elif ttype in (GGML_Q4_1, GGML_Q5_0, GGML_Q5_1, GGML_IQ4_NL):
        bb = GGML_TYPES[ttype][2]
        for i in range(n // 32):
            o = i * bb
            d = f16(o)
            if ttype == GGML_Q4_1:
                m, qh, qs = f16(o + 2), 0, o + 4
            elif ttype == GGML_Q5_0:
                m, qh, qs = None, int.from_bytes(b[o + 2:o + 6], "little"), o + 6
            elif ttype == GGML_Q5_1:
                m, qh, qs = f16(o + 2), int.from_bytes(b[o + 4:o + 8], "little"), o + 8
            else:
                m, qh, qs = None, 0, o + 2
            for j in range(16):
                x0, x1 = b[qs + j] & 0x0F, b[qs + j] >> 4
                if ttype == GGML_IQ4_NL:
                    y[i * 32 + j] = d * KVALUES_IQ4NL[x0]
                    y[i * 32 + j + 16] = d * KVALUES_IQ4NL[x1]
                    continue
                if ttype != GGML_Q4_1:
                    x0 |= ((qh >> j) << 4) & 0x10
                    x1 |= (qh >> (j + 12)) & 0x10
                if ttype == GGML_Q5_0:
                    y[i * 32 + j] = np.float32(x0 - 16) * d
                    y[i * 32 + j + 16] = np.float32(x1 - 16) * d
                else:
                    y[i * 32 + j] = np.float32(x0) * d + m
                    y[i * 32 + j + 16] = np.float32(x1) * d + m
    elif ttype == GGML_Q2_K:
        for i in range(n // 256):
            o = i * 84
            d, dmin = f16(o + 80), f16(o + 82)
            q, is_, k = o + 16, 0, i * 256
            for _ in range(2):
                shift = 0
                for _j in range(4):
                    for half in (0, 16):
                        sc = b[o + is_]
                        is_ += 1
                        dl, ml = d * np.float32(sc & 0xF), dmin * np.float32(sc >> 4)
                        for l in range(16):
                            y[k] = dl * np.float32((b[q + half + l] >> shift) & 3) - ml
                            k += 1
                    shift += 2
                q += 32
    elif ttype == GGML_Q3_K:
        for i in range(n // 256):
            o = i * 110
            d = f16(o + 108)
            aux = [int.from_bytes(b[o + 96 + 4 * t:o + 100 + 4 * t], "little") for t in range(3)]
            k1, k2, tmp = 0x03030303, 0x0F0F0F0F, aux[2]
            aux = [(aux[0] & k2) | (((tmp >> 0) & k1) << 4), (aux[1] & k2) | (((tmp >> 2) & k1) << 4),
                   ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4),
                   ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4)]
            scales = [i8((aux[t // 4] >> (8 * (t % 4))) & 0xFF) for t in range(16)]
            q, is_, m, k = o + 32, 0, 1, i * 256
            for _ in range(2):
                shift = 0
                for _j in range(4):
                    for half in (0, 16):
                        dl = d * np.float32(scales[is_] - 32)
                        is_ += 1
                        for l in range(16):
                            v = ((b[q + half + l] >> shift) & 3) - (0 if b[o + half + l] & m else 4)
                            y[k] = dl * np.float32(v)
                            k += 1
                    shift += 2
                    m <<= 1
                q += 32
    elif ttype == GGML_Q5_K:
        for i in range(n // 256):
            o = i * 176
            d, dmin = f16(o), f16(o + 2)
            sc = b[o + 4:o + 16]
            ql, qh, k, u1, u2 = o + 48, o + 16, i * 256, 1, 2

            def sm(j):
                if j < 4:
                    return sc[j] & 63, sc[j + 4] & 63
                return ((sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4),
                        (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4))
            for is_ in range(0, 8, 2):
                s1, m1 = sm(is_)
                s2, m2 = sm(is_ + 1)
                d1, mm1 = d * np.float32(s1), dmin * np.float32(m1)
                d2, mm2 = d * np.float32(s2), dmin * np.float32(m2)
                for l in range(32):
                    y[k] = d1 * np.float32((b[ql + l] & 0xF) + (16 if b[qh + l] & u1 else 0)) - mm1
                    k += 1
                for l in range(32):
                    y[k] = d2 * np.float32((b[ql + l] >> 4) + (16 if b[qh + l] & u2 else 0)) - mm2
                    k += 1
                ql += 32
                u1 <<= 2
                u2 <<= 2
    elif ttype == GGML_IQ4_XS:
        for i in range(n // 256):
            o = i * 136
            d = f16(o)
            sh = b[o + 2] | (b[o + 3] << 8)
            for ib in range(8):
                ls = ((b[o + 4 + ib // 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4)
                dl = d * np.float32(ls - 32)
                qs = o + 8 + 16 * ib
                for j in range(16):
                    y[i * 256 + 32 * ib + j] = dl * KVALUES_IQ4NL[b[qs + j] & 0xF]
                    y[i * 256 + 32 * ib + j + 16] = dl * KVALUES_IQ4NL[b[qs + j] >> 4]
    else:
        raise ValueError(ttype)
    return y


# byte offsets of each type's f16 scale fields (kept finite in random blocks)
_HALF_FIELDS = {
    GGML_Q8_0: (0,), GGML_Q4_0: (0,), GGML_Q4_1: (0, 2), GGML_Q5_0: (0,), GGML_Q5_1: (0, 2),
    GGML_Q2_K: (80, 82), GGML_Q3_K: (108,), GGML_Q4_K: (0, 2), GGML_Q5_K: (0, 2),
    GGML_Q6_K: (208,), GGML_IQ4_NL: (0,), GGML_IQ4_XS: (0,),
}


def selftest(seed=1, fixtures=None):
    rng = np.random.default_rng(seed)
    ok = True
    for ttype in _HALF_FIELDS:
        _, bs, bb = GGML_TYPES[ttype]
        nb = 40 if bs == 32 else 6
        raw = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
        # keep the f16 scales finite and moderate: random exponent 0x2000..0x43ff
        for off in _HALF_FIELDS[ttype]:
            half = rng.integers(0x2000, 0x4400, size=(nb, 1), dtype=np.uint16)
            half |= (rng.integers(0, 2, size=(nb, 1), dtype=np.uint16) << 15)
            raw[:, off:off + 2] = half.view(np.uint8).reshape(nb, 2)
        n = nb * bs
        a = dequantize(raw.reshape(-1), ttype, n)
        ref = _literal_dequant(raw.reshape(-1), ttype, n)
        same = np.array_equal(a.view(np.uint32), ref.view(np.uint32))
        print("selftest %-6s %5d elements: %s" % (type_name(ttype), n,
                                                  "bit-exact" if same else "MISMATCH"))
        ok &= same
    # gguf-py's values (tests/fixtures/quant/<type>.bin, tools/make_quant_fixtures.py):
    # 1024 elements of blocks, then their 1024 float32 values
    if fixtures is None:
        import os
        fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "quant")
    import os
    for ttype, (name, bs, bb) in sorted(GGML_TYPES.items()):
        path = os.path.join(fixtures, name.lower() + ".bin")
        if not os.path.exists(path):
            continue
        data = np.fromfile(path, np.uint8)
        nraw = 1024 // bs * bb
        want = data[nraw:nraw + 4096].view("<f4")
        got = dequantize(data[:nraw], ttype, 1024)
        same = np.array_equal(got.view(np.uint32), want.view(np.uint32))
        print("selftest %-6s against gguf-py (%s): %s" % (name, os.path.basename(path),
                                                          "bit-exact" if same else "MISMATCH"))
        ok &= same
    # f16 / bf16 conversions: every bit pattern
    allbits = np.arange(65536, dtype=np.uint16)
    f = f16_to_f32(allbits)
    fin = np.isfinite(f)
    same = np.array_equal(f[fin].astype(np.float16).view(np.uint16), allbits[fin])
    bf = bf16_to_f32(allbits)
    same &= np.array_equal((bf.view(np.uint32) >> 16).astype(np.uint16), allbits)
    print("selftest f16/bf16 all 65536 patterns: %s" % ("exact" if same else "MISMATCH"))
    return ok and same


def main(argv):
    if len(argv) >= 2 and argv[1] == "--selftest":
        return 0 if selftest() else 1
    if len(argv) < 2:
        print("usage: gguf_reader.py FILE.gguf [--tensors] | --selftest", file=sys.stderr)
        return 2
    r = GGUFReader(argv[1])
    print("GGUF v%d, %d kv, %d tensors, alignment %d, data at %d" %
          (r.version, len(r.kv), len(r.tensors), r.alignment, r.data_offset))
    for k, v in r.kv.items():
        if isinstance(v, list):
            s = "[%d items] %r" % (len(v), v[:8])
        else:
            s = repr(v)
        print("  %-45s %s" % (k, s[:120]))
    if "--tensors" in argv:
        for ti in r.tensor_order:
            print("  %-32s %-6s ne=%s" % (ti.name, type_name(ti.type), ti.ne))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
