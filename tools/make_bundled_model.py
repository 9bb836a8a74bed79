#!/usr/bin/python3
"""make_bundled_model.py — build kvsieve's bundled long-context model (seeded, reproducible).

    /usr/bin/python3 tools/make_bundled_model.py --out models/kvsieve-default.gguf

The model is a standard llama GGUF (GQA, RoPE, SwiGLU, RMSNorm, tied embeddings)
whose weights are *constructed*, not trained: see docs/MODEL.md.  In short:

  residual (n_embd 352) = A[0:64) current-token code | S1..S4 [64:320) codes of the
  previous 1..4 tokens | E[320:352) constant "bias" coordinate (E0).

  token codes: 32 one-hot dims for the tokens the task templates hinge on (digits,
  '▁', '.', '\\n', BOS, "is", "key", ...) and a 32-dim block of random unit codes
  for everything else (coherence-reduced for the ~300 tokens the eval prompts use).

  layer 0: four positional heads (RoPE only, q = key rotated by the offset, amplitudes
           over 8 rotary frequencies chosen so no alias exists within 8192 positions)
           copy the codes of tokens t-1..t-4 into S1..S4.
  layer 1: head 0 is an induction head: query = codes of (t, t-1, t-2, t-3), key =
           codes of (j-1, j-2, j-3, j-4); it attends to the token that followed the
           last earlier occurrence of the current 4-gram and copies its code into A
           (tied embeddings turn that into its logit).  BOS is an attention sink at
           3.5 "matches", so only a full 4-gram match copies.
           The SwiGLU MLP holds a small "prior": after a list label "\\nk." it writes
           '▁' and a five-digit item whose first two digits depend on k and on the last
           digit of the previous item (so items are distinct and can only be repeated
           by attending to them), then a newline.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_reader as G  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_VOCAB = os.path.join(ROOT, "..", "shared", "fixtures", "tokenizer", "ggml-vocab-llama-spm.gguf")

# ------------------------------------------------------------ shape --
D = 64            # code width of one token
N_ONEHOT = 32     # one-hot part of the code
N_SLOT = 4        # previous tokens kept in the residual
H = D * (1 + N_SLOT) + 32
E0 = D * (1 + N_SLOT)        # constant bias coordinate
N_LAYER = 2
N_HEAD = 4
N_KV = 2
N_ROT = 16
HD = N_ROT + 4 * D + 16      # 288: rotary part | 4-gram part | extra (sink)
X_SINK = N_ROT + 4 * D
ROPE_BASE = 10000.0
N_CTX = 8192
N_FF = 320
EPS = 1e-5
EPS_COPY = 0.3              # size of the current token's one-hot copy in E
BIAS = 1.0                   # value of E0 in every embedding row

U = 24.0          # attention logit per matched token of the 4-gram
SINK = 3.5        # BOS sink score, in matches
POS_T = 105.0     # positional-head score at the target offset (before its min gap 0.19)
COPY = 3.0        # size of the copied code in A
PRIOR = 1.5       # size of the MLP prior in A
OUT_GAIN = 4.0    # output_norm gain on A (sharpens the distribution)

# the tokens with exact one-hot codes (order = code dim)
ONEHOT_PIECES = ["<s>", "\u2581", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", ".", "<0x0A>", "?",
                 ":", "-", "\u2581is", "\u2581The", "\u2581pass", "\u2581key", "\u2581magic", "\u2581number",
                 "\u2581for", "\u2581V", "AR", "\u2581=", "\u2581One", "\u2581are", "\u2581to", "\u2581equal",
                 "\u2581numbers"]

# eval_tasks.c word lists and templates (to find the tokens prompts use)
FILLER = """the a one every that this some quiet green old bright small warm cold tall busy gentle brown soft
early late happy calm wide dark clever little river garden farmer window teacher road bird village boat
tree market child house hill letter lamp friend baker cloud field dog bridge song kitchen walks waits sings
looks rests turns moves stays plays shines works sleeps runs listens grows stops near under over behind
beside past along across around by slowly today again quietly often still softly later always there and""".split()
TEMPLATE = """A pass key is hidden in the text below. Remember it. The pass key is 12345. 12345 is the pass key.
What is the pass key? Some magic numbers are hidden in the text below. Remember them. The magic number for
What is the magic number for One magic number for What are all the magic numbers for They are: All numbers for
VAR = Which variables are equal to Answer: the variables equal to are: Which variables equal Track the variables
assigned in the text below. Read the text and follow the instructions in it. Write a list of random five-digit
numbers, one per line, numbered 1 to Write random numbers. Repeat item of your list exactly. Repeat item""".split()


class Vocab:
    def __init__(self, path):
        self.r = G.GGUFReader(path)
        self.tokens = self.r.kv["tokenizer.ggml.tokens"]
        self.scores = self.r.kv["tokenizer.ggml.scores"]
        self.index = {t: i for i, t in enumerate(self.tokens)}

    def encode(self, text):
        """SentencePiece-BPE as tools/reference.py (no BOS), leading space added."""
        syms = list("\u2581" + text.replace(" ", "\u2581"))
        while True:
            best, bi = None, -1
            for i in range(len(syms) - 1):
                m = syms[i] + syms[i + 1]
                j = self.index.get(m)
                if j is not None and (best is None or self.scores[j] > best):
                    best, bi = self.scores[j], i
            if bi < 0:
                break
            syms[bi:bi + 2] = [syms[bi] + syms[bi + 1]]
        out = []
        for s in syms:
            if s in self.index:
                out.append(self.index[s])
            else:
                out += [self.index["<0x%02X>" % b] for b in s.encode()]
        return out


def used_tokens(v):
    """Ids the eval prompts can contain (filler, templates, names' pieces)."""
    ids = set()
    words = set(FILLER) | set(TEMPLATE)
    words |= {w.capitalize() for w in FILLER}
    for a in ["quiet", "cold"]:
        for n in FILLER:
            words.add("%s-%s" % (a, n))
    for w in sorted(words):
        ids.update(v.encode(w))
        ids.update(v.encode(w + "."))
    for i, t in enumerate(v.tokens):  # upper-case pieces of variable names
        s = t[1:] if t.startswith("\u2581") else t
        if s and len(s) <= 5 and s.isascii() and s.isalpha() and s.isupper():
            ids.add(i)
    return sorted(ids)


def make_codes(v, rng, log):
    n_vocab = len(v.tokens)
    onehot = [v.index[p] for p in ONEHOT_PIECES]
    codes = np.zeros((n_vocab, D))
    rnd = rng.standard_normal((n_vocab, D - N_ONEHOT))
    rnd /= np.linalg.norm(rnd, axis=1, keepdims=True)
    used = [i for i in used_tokens(v) if i not in set(onehot)]
    # reduce the coherence of the codes the prompts use (filler words first)
    import torch
    torch.manual_seed(int(rng.integers(1 << 30)))
    core = [i for i in used if not v.tokens[i].lstrip("\u2581").isupper()][:400]
    x = torch.tensor(rnd[core], requires_grad=True)
    opt = torch.optim.Adam([x], lr=0.01)
    for _ in range(300):
        y = x / x.norm(dim=1, keepdim=True)
        g = y @ y.T - torch.eye(len(core), dtype=y.dtype)
        loss = (g.abs() ** 6).sum() ** (1 / 6)
        opt.zero_grad()
        loss.backward()
        opt.step()
    y = (x / x.norm(dim=1, keepdim=True)).detach().numpy()
    rnd[core] = y
    g = y @ y.T - np.eye(len(core))
    log("codes: %d one-hot, %d used tokens, max coherence among %d filler/template codes %.3f"
        % (len(onehot), len(used), len(core), np.abs(g).max()))
    codes[:, N_ONEHOT:] = rnd
    for k, i in enumerate(onehot):
        codes[i] = 0
        codes[i, k] = 1.0
    # a word and its space-prefixed form share a code ("\nThe" starts with "The", not "▁The")
    for i, t in enumerate(v.tokens):
        j = v.index.get("\u2581" + t)
        if j is not None and len(t) >= 2 and t.isalpha():
            codes[i] = codes[j]
    return codes, onehot


def pos_kernel():
    """Per-frequency amplitudes A_f (sum 1) maximising the positional heads' min gap."""
    import torch
    w = ROPE_BASE ** (-2.0 * np.arange(N_ROT // 2) / N_ROT)
    d = np.arange(-8, N_CTX + 8)
    d = d[d != 0]
    C = torch.tensor(np.cos(np.outer(d, w)))
    a = torch.zeros(N_ROT // 2, requires_grad=True, dtype=torch.float64)
    opt = torch.optim.Adam([a], lr=0.05)
    for _ in range(600):
        A = torch.softmax(a, 0)
        gap = 1 - C @ A
        loss = torch.logsumexp(-gap * 200, 0) / 200
        opt.zero_grad()
        loss.backward()
        opt.step()
    A = torch.softmax(a, 0).detach().numpy()
    return w, A, float((1 - C.numpy() @ A).min())


def build(v, seed, log):
    rng = np.random.default_rng(seed)
    codes, onehot = make_codes(v, rng, log)
    oh = {p: k for k, p in enumerate(ONEHOT_PIECES)}  # piece -> one-hot dim
    n_vocab = len(v.tokens)
    W = {}
    emb = np.zeros((n_vocab, H))
    emb[:, :D] = codes
    emb[:, E0] = BIAS
    W["token_embd.weight"] = emb
    s0 = math.sqrt(H / (1 + BIAS ** 2))          # RMSNorm factor at layer 0
    s1 = math.sqrt(H / (1 + N_SLOT + BIAS ** 2))  # at layer 1 (slots filled)
    sq = math.sqrt(HD)

    omega, amp, gap = pos_kernel()
    log("positional kernel: min gap %.3f of the peak -> %.1f logits" % (gap, gap * POS_T))

    def positional(wq, wk, wv, wo, heads, kv_heads, offsets, s, out_blocks, gains):
        for kv in kv_heads:
            for f in range(N_ROT // 2):
                wk[kv * HD + 2 * f, E0] = math.sqrt(amp[f] * POS_T * sq) / (s * BIAS)
            for i in range(D):
                if i != oh["<s>"] or True:
                    wv[kv * HD + i, i] = 1.0 / s
        for h, o, blk, g in zip(heads, offsets, out_blocks, gains):
            for f in range(N_ROT // 2):
                a = math.sqrt(amp[f] * POS_T * sq) / (s * BIAS)
                wq[h * HD + 2 * f, E0] = a * math.cos(o * omega[f])
                wq[h * HD + 2 * f + 1, E0] = -a * math.sin(o * omega[f])
            for i in range(D):
                wo[blk + i, h * HD + i] = g

    for l in range(N_LAYER):
        p = "blk.%d." % l
        wq = np.zeros((N_HEAD * HD, H))
        wk = np.zeros((N_KV * HD, H))
        wv = np.zeros((N_KV * HD, H))
        wo = np.zeros((H, N_HEAD * HD))
        gate = np.zeros((N_FF, H))
        up = np.zeros((N_FF, H))
        down = np.zeros((H, N_FF))
        if l == 0:
            positional(wq, wk, wv, wo, [0, 1, 2, 3], [0, 1], [1, 2, 3, 4], s0,
                       [D * (m + 1) for m in range(4)], [1.0] * 4)
            # FFN: copy the one-hot part of the current token's code (small, EPS_COPY) into
            # E[1:32), where layer 1's MLP reads it undisturbed by the copy written into A
            GB = 30.0
            for k in range(1, N_ONEHOT):
                gate[k, E0] = GB / (s1 * BIAS)
                up[k, k] = 1.0 / s1
                down[E0 + k, k] = EPS_COPY / (GB / (1 + math.exp(-GB)))
        else:
            # induction head: q head 0 on kv head 0
            lam = U * sq
            for m in range(4):
                for i in range(D):
                    wq[N_ROT + D * m + i, D * m + i] = lam / s1
                    wk[N_ROT + D * m + i, D * (m + 1) + i] = 1.0 / s1
            wk[X_SINK, oh["<s>"]] = 1.0 / s1
            wq[X_SINK, E0] = SINK * lam / (s1 * BIAS)
            for i in range(D):
                if i != oh["<s>"]:
                    wv[i, i] = 1.0 / s1
                wo[i, i] = COPY
            prior_mlp(gate, up, down, oh, codes, onehot, rng, s1, log)
        W[p + "attn_norm.weight"] = np.ones(H)
        W[p + "ffn_norm.weight"] = np.ones(H)
        W[p + "attn_q.weight"] = wq
        W[p + "attn_k.weight"] = wk
        W[p + "attn_v.weight"] = wv
        W[p + "attn_output.weight"] = wo
        W[p + "ffn_gate.weight"] = gate
        W[p + "ffn_up.weight"] = up
        W[p + "ffn_down.weight"] = down
    on = np.zeros(H)
    on[:D] = OUT_GAIN
    W["output_norm.weight"] = on
    return W


def prior_mlp(gate, up, down, oh, codes, onehot, rng, s, log):
    """Units fire when a sum of one-hot slot features exceeds a threshold; the
    threshold is taken from E0, so the test is invariant to the RMSNorm scale."""
    ALPHA = 4.0
    DIG = [str(d) for d in range(10)]
    blk = {m: D * m for m in range(5)}  # 0 = current token, 1..4 = slots
    unit = [0]
    # silu(ALPHA * s * 0.5) * s * BIAS * x = PRIOR  (s as in the copy-free case)
    on_val = ALPHA * s * 0.5
    scale = PRIOR / (on_val / (1 + math.exp(-on_val)) * s * BIAS)

    def add(feats, thresh, out_piece, strength=1.0):
        u = unit[0]
        unit[0] += 1
        for m, piece, wgt in feats:
            pieces = DIG if piece == "DIGIT" else [piece]
            for pc in pieces:
                if m == 0:
                    gate[u, E0 + oh[pc]] += ALPHA * wgt / EPS_COPY
                else:
                    gate[u, blk[m] + oh[pc]] += ALPHA * wgt
        gate[u, E0] += -ALPHA * thresh / BIAS
        up[u, E0] = 1.0
        down[:D, u] = codes[onehot[oh[out_piece]]] * scale * strength

    perm = rng.permutation(10)
    first = rng.integers(0, 10, size=(10, 11))   # [k][s4 digit or 10] -> d1
    offs = rng.permutation(np.arange(1, 10))     # k -> d2 - d1 (distinct, non-zero)
    nxt = rng.integers(0, 10, size=(10, 10))     # [prev][cur] -> next digit
    # (a) "\n k ." -> '▁'
    add([(0, ".", 1), (1, "DIGIT", 1), (2, "<0x0A>", 1)], 2.5, "\u2581")
    # (b) "\n k . ▁" -> first digit, from k and the previous item's last digit
    for k in range(1, 10):
        for d in range(10):
            add([(0, "\u2581", 1), (1, ".", 1), (2, str(k), 1), (3, "<0x0A>", 1), (4, str(d), 1)], 4.5,
                str(first[k][d]))
        add([(0, "\u2581", 1), (1, ".", 1), (2, str(k), 1), (3, "<0x0A>", 1), (4, "DIGIT", -1)], 3.5,
            str(first[k][10]))
    # (c) "\n k . ▁ d1" -> d2 = d1 + offs[k]
    for k in range(1, 10):
        for d in range(10):
            add([(0, str(d), 1), (1, "\u2581", 1), (2, ".", 1), (3, str(k), 1), (4, "<0x0A>", 1)], 4.5,
                str((d + offs[k - 1]) % 10))
    # (d) digit pairs inside an item -> next digit (needs a '▁' at most 3 back, i.e. item digits 2..4)
    for a in range(10):
        for b in range(10):
            add([(0, str(b), 1), (1, str(a), 1)], 1.5, str(nxt[a][b]))
    # (e) five digits -> newline (beats (d))
    add([(m, "DIGIT", 1) for m in range(5)], 4.5, "<0x0A>", 2.5)
    assert unit[0] <= N_FF, unit[0]
    log("prior MLP: %d units" % unit[0])
    del perm


# ------------------------------------------------------------ GGUF --
def f16_bytes(a):
    return np.asarray(a, dtype="<f2").tobytes()


def q8_0_bytes(a):
    a = np.asarray(a, dtype=np.float32).reshape(-1, 32)
    amax = np.abs(a).max(axis=1)
    d = amax / 127.0
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0.0).astype(np.float32)
    q = np.clip(np.round(a * inv[:, None]), -127, 127).astype(np.int8)  # round half to even is close enough
    x = a * inv[:, None]
    q = np.clip(np.trunc(x + np.where(x >= 0, 0.5, -0.5)), -127, 127).astype(np.int8)  # ggml: roundf
    out = np.zeros(len(a), dtype=[("d", "<f2"), ("q", "i1", 32)])
    out["d"] = d.astype(np.float16)
    out["q"] = q
    return out.tobytes()


def write_gguf(path, kvs, tensors):
    """kvs: list of (key, gguf type, value[, array element type]); tensors: (name, ndarray, ggml type)."""
    def s(x):
        b = x.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def val(t, x, et=None):
        if t == G.T_STRING:
            return s(x)
        if t == G.T_ARRAY:
            out = struct.pack("<IQ", et, len(x))
            if et == G.T_STRING:
                return out + b"".join(s(e) for e in x)
            return out + np.asarray(x, dtype=G._SCALAR_NP[et]).tobytes()
        return struct.pack(G._SCALAR_FMT[t], x)

    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for kv in kvs:
        head += s(kv[0]) + struct.pack("<I", kv[1]) + val(*kv[1:])
    blobs, off = [], 0
    for name, a, t in tensors:
        data = a.astype("<f4").tobytes() if t == G.GGML_F32 else f16_bytes(a) if t == G.GGML_F16 else q8_0_bytes(a)
        ne = list(reversed(a.shape))
        head += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        head += struct.pack("<IQ", t, off)
        blobs.append(data)
        off += (len(data) + 31) // 32 * 32
    head += b"\0" * ((-len(head)) % 32)
    with open(path, "wb") as f:
        f.write(head)
        for b in blobs:
            f.write(b + b"\0" * ((-len(b)) % 32))


def gguf_kvs(v):
    r = v.r
    kvs = [("general.architecture", G.T_STRING, "llama"),
           ("general.name", G.T_STRING, "kvsieve-default"),
           ("general.description", G.T_STRING,
            "constructed long-context model (tools/make_bundled_model.py, docs/MODEL.md)"),
           ("llama.context_length", G.T_UINT32, N_CTX),
           ("llama.embedding_length", G.T_UINT32, H),
           ("llama.block_count", G.T_UINT32, N_LAYER),
           ("llama.feed_forward_length", G.T_UINT32, N_FF),
           ("llama.attention.head_count", G.T_UINT32, N_HEAD),
           ("llama.attention.head_count_kv", G.T_UINT32, N_KV),
           ("llama.attention.key_length", G.T_UINT32, HD),
           ("llama.attention.value_length", G.T_UINT32, HD),
           ("llama.rope.dimension_count", G.T_UINT32, N_ROT),
           ("llama.rope.freq_base", G.T_FLOAT32, ROPE_BASE),
           ("llama.attention.layer_norm_rms_epsilon", G.T_FLOAT32, EPS),
           ("llama.vocab_size", G.T_UINT32, len(v.tokens))]
    for k in r.kv:
        if not k.startswith("tokenizer."):
            continue
        t = r.kv_types[k]
        if t == G.T_ARRAY:
            et = {"tokenizer.ggml.tokens": G.T_STRING, "tokenizer.ggml.scores": G.T_FLOAT32,
                  "tokenizer.ggml.token_type": G.T_INT32}[k]
            kvs.append((k, t, r.kv[k], et))
        else:
            kvs.append((k, t, r.kv[k]))
    return kvs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "models", "kvsieve-default.gguf"))
    ap.add_argument("--vocab", default=DEFAULT_VOCAB, help="GGUF whose tokenizer.* metadata is reused")
    ap.add_argument("--seed", type=int, default=20261122)
    ap.add_argument("--embd-type", choices=["q8_0", "f16"], default="q8_0")
    a = ap.parse_args(argv)
    import torch
    torch.set_num_threads(2)
    t0 = time.time()
    log = lambda m: print("[%6.1fs] %s" % (time.time() - t0, m), file=sys.stderr)  # noqa: E731
    v = Vocab(a.vocab)
    W = build(v, a.seed, log)
    tensors = []
    for name, w in W.items():
        if name == "token_embd.weight":
            t = G.GGML_Q8_0 if a.embd_type == "q8_0" else G.GGML_F16
        elif w.ndim == 1:
            t = G.GGML_F32
        else:
            t = G.GGML_F16
        tensors.append((name, w, t))
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    write_gguf(a.out, gguf_kvs(v), tensors)
    log("wrote %s (%d bytes)" % (a.out, os.path.getsize(a.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
