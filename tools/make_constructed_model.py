#!/usr/bin/python3
"""make_constructed_model.py — build kvsieve's constructed test model (seeded, reproducible).

    /usr/bin/python3 tools/make_constructed_model.py --out tests/fixtures/models/constructed.gguf

The model is a standard llama GGUF (GQA, RoPE, SwiGLU, RMSNorm, tied embeddings)
whose weights are *constructed*, not trained: see docs/MODEL.md.  In short:

  residual (n_embd 512) = A[0:64) current-token code (and, from layer 1 on, the copies
  that become logits) | S1..S4 [64:320) codes of the previous 1..4 tokens | E[320:352)
  constant "bias" E0 plus norm-keeping dummies | C0 [352:416) clean current code |
  PREVNUM [416:447) | NAME, HN, NAME2 [447:512).

  token codes: 31 one-hot dims for the tokens the task templates hinge on (digits,
  '▁', '.', '\\n', BOS, "is", "key", "AR", "VAR", ...), a flag dim for upper-case pieces
  (variable names) and a 32-dim block of random unit codes for everything else
  (coherence-reduced for the ~300 tokens the eval prompts use).

  layer 0: four positional heads (RoPE only, q = key rotated by the offset, amplitudes
           over 8 rotary frequencies chosen so no alias exists within 8192 positions)
           copy the codes of tokens t-1..t-4 into S1..S4; the FFN copies the current
           code into C0.
  layer 1: head 0 is an induction head: query = codes of (t, t-1, t-2, t-3), key =
           codes of (j-1, j-2, j-3, j-4); it attends to the token that followed the
           last earlier occurrence of the current 4-gram and copies its code into A.
           BOS is an attention sink at 3.5 "matches", so only a full 4-gram match copies.
           Heads 1-3 are *recency* heads: a RoPE kernel solved as a linear program
           makes the nearest marked key within a window win over every older one and
           over the sink, with no alias in the context.  PREVNUM = last three digits of
           the last number that ended before t (NULL after a line or question break);
           NAME / NAME2 = first / second piece of the last left-hand variable name
           ("VAR X = ...").  The FFN keeps PREVNUM only at digits (and right after one).
  layer 2: VS (at ':' or a number's '.', attends to the first digit of the value
           "is ▁d..." whose PREVNUM is the number just ended: multivalue's values come
           out in order), CONT (continues a number or name with PREVNUM as context),
           LOOK+CHAIN (at "equal to N are:" finds the assignment of N; at a name's last
           piece finds "VAR Y = VAR X."; copies NAME) and SECOND (copies NAME2 after
           the first piece, so names sharing a first piece stay apart).
           The FFN holds a small "prior": after a list label "\\nk." it writes '▁' and a
           five-digit item whose first two digits depend on k and on the last digit of
           the previous item (so items are distinct and can only be repeated by
           attending to them), then a newline.
  Every block's content has a constant norm (dummies stand in for absent copies), so
  RMSNorm scales every position alike and the logit margins hold.
"""
import argparse
import functools
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_reader as G  # noqa: E402
from gguf_writer import write_gguf  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_VOCAB = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "ggml-vocab-llama-spm.gguf")

# ------------------------------------------------------------ shape --
D = 64            # code width of one token
N_ONEHOT = 32     # one-hot part of the code
N_SLOT = 4        # previous tokens kept in the residual
H = 512
E0 = D * (1 + N_SLOT)        # 320: constant bias coordinate
J_IND, J_NAME, J_P = E0 + 1, E0 + 2, E0 + 3  # norm-keeping dummies (see "constant norm" below)
F_SEP = E0 + 4               # "a digit right after ▁ . or :" (layer 1's FFN)
F_SEP2 = E0 + 12             # "a digit, after a digit, after ▁ . or :" (layer 1's FFN)
C0 = E0 + 32                 # 352: clean copy of the current token's code (layer 0's FFN)
P0 = C0 + D                  # 416: PREVNUM, digits of the last number that ended (3 x 10) + NULL
P_NULL = P0 + 30
N0 = P0 + 31                 # 447: NAME, the code (CODE_SUB dims) of the last left-hand name's
N_HN = N0 + 35               #   first piece, then HN ("a name is near"), then NAME2 (its second piece)
J_N2 = E0 + 5
NAME2_DIMS = list(range(N0 + 36, H)) + list(range(E0 + 6, E0 + 12))   # 29 + 6
N_LAYER = 3
N_HEAD = 4
N_KV = 2
N_ROT = 16
HD = N_ROT + 4 * D + 16      # 288: rotary part | 4-gram part | extra (sink)
X_SINK = N_ROT + 4 * D
ROPE_BASE = 10000.0
N_CTX = 8192
N_FF = 352
EPS = 1e-5
BIAS = 1.0                   # value of E0 in every embedding row
UPPER_K = 0.6                # size of the "upper-case piece" flag in a code (dim UPPER_DIM)

U = 24.0          # attention logit per matched token of the 4-gram
SINK = 3.5        # BOS sink score, in matches
POS_T = 105.0     # positional-head score at the target offset (before its min gap 0.19)
COPY = 3.0        # size of the copied code in A
PRIOR = 1.5       # size of the MLP prior in A
OUT_GAIN = 5.6    # output_norm gain on A (sharpens the distribution)
BALLAST = 6.0     # a constant coordinate in every embedding row: it dilutes the norm changes
                  # no construction can avoid (an induction copy split over two tokens),
                  # so RMSNorm rescales a position by a few percent, not ~15%
REC_R = 100.0     # recency heads: logit scale of the kernel (peak amplitude sum 1)
W_P, W_H = 0.6, 0.5          # PREVNUM digit size, NAME flag size (NULL is sqrt(3) W_P)
COPY_VS, COPY_C, COPY_N = 6.0, 4.0, 6.0   # layer 2's copies into A

# the tokens with exact one-hot codes (order = code dim); dim UPPER_DIM is a flag, not a token
ONEHOT_PIECES = ["<s>", "\u2581", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", ".", "<0x0A>", "?",
                 ":", "-", "\u2581is", "\u2581The", "\u2581pass", "\u2581key", "\u2581magic", "\u2581number",
                 "\u2581for", "\u2581V", "AR", "\u2581=", "\u2581One", "\u2581are", "\u2581to", "VAR"]
UPPER_DIM = 31
# the code dims a name piece can use: its random part, the flag, and the one-hots of the
# two upper-case pieces that have one ("▁V" starts names like VXKQR, "AR" continues them)
CODE_SUB = [24, 25, UPPER_DIM] + list(range(N_ONEHOT, D))
assert ONEHOT_PIECES[24] == "\u2581V" and ONEHOT_PIECES[25] == "AR" and len(CODE_SUB) == 35

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
    fixed = set(onehot) | set(upper_tokens(v))  # name pieces: "TH" and "▁TH" must stay apart
    for i, t in enumerate(v.tokens):
        j = v.index.get("\u2581" + t)
        if j is not None and len(t) >= 2 and t.isalpha() and i not in fixed:
            codes[i] = codes[j]
    # upper-case pieces (variable names, "VAR") carry a flag in dim UPPER_DIM, so layer 2
    # can tell "inside a name" from the token itself; codes stay unit vectors
    for i in upper_tokens(v):
        codes[i] *= math.sqrt(1 - UPPER_K ** 2)
        codes[i, UPPER_DIM] = UPPER_K
    return codes, onehot


def upper_tokens(v):
    out = []
    for i, t in enumerate(v.tokens):
        s = t[1:] if t.startswith("\u2581") else t
        if s and s.isascii() and s.isalpha() and s.isupper():
            out.append(i)
    return out


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


@functools.lru_cache(maxsize=None)
def recency_kernel(gap, win):
    """Per-frequency (cos, sin) coefficients of a RoPE score f(d), d = query - key position,
    with sum |coef| <= 1, maximising t such that f(d) - f(d') >= t whenever d <= win and
    d' >= d + gap (d' up to the context): "the nearest marked key within win tokens
    wins over any older one by t", without an alias anywhere in the context.  A linear
    program (scipy's HiGHS), so the result is exact and reproducible."""
    from scipy.optimize import linprog
    w = ROPE_BASE ** (-2.0 * np.arange(N_ROT // 2) / N_ROT)
    d = np.arange(0, N_CTX + 1)
    B = np.concatenate([np.cos(np.outer(d, w)), np.sin(np.outer(d, w))], 1)
    n = B.shape[1]
    rows = []
    for d0 in range(win + 1):
        dd = np.arange(d0 + gap, N_CTX + 1)
        r = np.zeros((len(dd), 2 * n + 1))
        r[:, :n] = B[dd] - B[d0]
        r[:, -1] = 1.0
        rows.append(r)
    eye = np.eye(n)
    rows.append(np.hstack([eye, -eye, np.zeros((n, 1))]))
    rows.append(np.hstack([-eye, -eye, np.zeros((n, 1))]))
    r = np.zeros((1, 2 * n + 1))
    r[0, n:2 * n] = 1.0
    rows.append(r)
    A = np.vstack(rows)
    ub = np.zeros(len(A))
    ub[-1] = 1.0
    c = np.zeros(2 * n + 1)
    c[-1] = -1.0
    res = linprog(c, A_ub=A, b_ub=ub, bounds=[(None, None)] * n + [(0, None)] * n + [(None, None)],
                  method="highs")
    assert res.status == 0, res.message
    x = res.x[:n]
    f = B @ x
    return x[:n // 2], x[n // 2:], float(res.x[-1]), f


def build(v, seed, log):
    rng = np.random.default_rng(seed)
    codes, onehot = make_codes(v, rng, log)
    oh = {p: k for k, p in enumerate(ONEHOT_PIECES)}  # piece -> one-hot dim
    n_vocab = len(v.tokens)
    DIG = [oh[str(d)] for d in range(10)]
    SEP = [oh["\u2581"], oh["."], oh[":"]]
    RU = math.sqrt(1 - UPPER_K ** 2)              # one-hot entry of a flagged token (AR, ▁V, VAR)
    W = {}
    emb = np.zeros((n_vocab, H))
    emb[:, :D] = codes
    emb[:, E0] = BIAS
    emb[:, E0 + 31] = BALLAST
    W["token_embd.weight"] = emb
    # RMSNorm factors: sqrt(H / |x|^2) with every code a unit vector and the norm of
    # each block's content held constant by construction (the dummies J_*)
    B2 = BIAS ** 2 + BALLAST ** 2
    s0 = math.sqrt(H / (1 + B2))                          # layer 0 attention: A, E0, ballast
    sf0 = math.sqrt(H / (1 + N_SLOT + B2))                # layer 0 FFN: + S1..S4
    s1 = math.sqrt(H / (2 + N_SLOT + B2))                 # layer 1: + C0
    n_p, n_n = 3 * W_P ** 2, 1 + W_H ** 2 + 1          # PREVNUM; NAME + HN + NAME2
    sf1 = math.sqrt(H / (2 + N_SLOT + B2 + COPY ** 2 + n_p + n_n))  # layer 1 FFN
    s2 = sf1                                              # layer 2 (the P gate keeps the norm)
    sq = math.sqrt(HD)

    omega, amp, gap = pos_kernel()
    log("positional kernel: min gap %.3f of the peak -> %.1f logits" % (gap, gap * POS_T))

    def positional(wq, wk, wv, wo, heads, kv_heads, offsets, s, out_blocks, gains):
        for kv in kv_heads:
            for f in range(N_ROT // 2):
                wk[kv * HD + 2 * f, E0] = math.sqrt(amp[f] * POS_T * sq) / (s * BIAS)
            for i in range(D):
                wv[kv * HD + i, i] = 1.0 / s
        for h, o, blk, g in zip(heads, offsets, out_blocks, gains):
            for f in range(N_ROT // 2):
                a = math.sqrt(amp[f] * POS_T * sq) / (s * BIAS)
                wq[h * HD + 2 * f, E0] = a * math.cos(o * omega[f])
                wq[h * HD + 2 * f + 1, E0] = -a * math.sin(o * omega[f])
            for i in range(D):
                wo[blk + i, h * HD + i] = g

    def S(m):  # residual block of slot m (0 = the clean current code C0)
        return C0 if m == 0 else D * m

    def recency(wq, wk, h, kv, s, gap_, win, alpha_row, name):
        """RoPE part of a recency head: keys carry 1 per rotary pair, the query the kernel.
        Returns (alpha, sink) in logits: a marked key (content 1 at alpha_row) within win
        tokens beats every unmarked key and every older marked key by >= M.  alpha_row
        None: the caller spreads alpha over several key features itself."""
        ca, cb, t, f = recency_kernel(gap_, win)
        for fr in range(N_ROT // 2):
            wk[kv * HD + 2 * fr, E0] = 1.0 / (s * BIAS)
            wk[kv * HD + 2 * fr, oh["<s>"]] = -1.0 / s   # BOS, the sink, has no position
            wq[h * HD + 2 * fr, E0] = ca[fr] * REC_R * sq / (s * BIAS)
            wq[h * HD + 2 * fr + 1, E0] = -cb[fr] * REC_R * sq / (s * BIAS)
        M = REC_R * t / 2
        alpha = REC_R * (f[0] - f[win]) + 2 * M
        sink = REC_R * f[0] + M
        log("%s kernel: nearest-within-%d wins by %.1f logits (older keys >= %d back), content %.1f"
            % (name, win, REC_R * t, gap_, alpha))
        if alpha_row is not None:
            wq[h * HD + alpha_row, E0] = alpha * sq / (s * BIAS)
        wq[h * HD + X_SINK, E0] = sink * sq / (s * BIAS)
        return alpha, sink

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
            # FFN: copy the current token's code into C0, where layer 2 reads it undisturbed
            # by the copies layer 1 writes into A (silu of a large constant gate is linear)
            GB = 30.0
            for i in range(D):
                gate[i, E0] = GB / (sf0 * BIAS)
                up[i, i] = 1.0 / sf0
                down[C0 + i, i] = 1.0 / (GB / (1 + math.exp(-GB)))
        elif l == 1:
            # head 0: induction head (q head 0 on kv head 0)
            lam = U * sq
            for m in range(4):
                for i in range(D):
                    if i == UPPER_DIM:
                        continue
                    wq[N_ROT + D * m + i, D * m + i] = lam / s1
                    wk[N_ROT + D * m + i, D * (m + 1) + i] = 1.0 / s1
            wk[X_SINK, oh["<s>"]] = 1.0 / s1
            wq[X_SINK, E0] = SINK * lam / (s1 * BIAS)
            for i in range(D):
                if i != oh["<s>"]:
                    wv[i, i] = 1.0 / s1
                wo[i, i] = COPY
            wv[D, oh["<s>"]] = 1.0 / s1           # the sink's value: a dummy of the copy's norm
            wo[J_IND, D] = COPY
            # kv head 1: recency keys for heads 2 (PREVNUM) and 3 (NAME)
            kb = HD
            X_AFTER, X_NAME = N_ROT, N_ROT + 1
            for d in DIG:   # "the previous token ended a number": S2 digit, S1 not
                wk[kb + X_AFTER, S(2) + d] += 1.0 / s1
                wk[kb + X_AFTER, S(1) + d] -= 1.0 / s1
            # ... or was a question mark (value NULL: "...for K? They are:" starts afresh).
            # Not a newline: after a list item it would count twice and outrank the nearer
            # label, whose digit keeps the items' PREVNUM apart
            wk[kb + X_AFTER, S(1) + oh["?"]] += 1.0 / s1
            # left-hand name start: "VAR ▁X" not after "▁=" (1), or a break (1); else <= 0
            wk[kb + X_NAME, S(1) + oh["AR"]] += 1.0 / (RU * s1)
            wk[kb + X_NAME, S(1) + oh["VAR"]] += 2.0 / (RU * s1)
            wk[kb + X_NAME, S(2) + oh["\u2581V"]] += 1.0 / (RU * s1)
            wk[kb + X_NAME, S(3) + oh["\u2581="]] -= 1.0 / s1
            for b in ("<0x0A>", "?"):
                wk[kb + X_NAME, oh[b]] += 2.0 / s1
            wk[kb + X_NAME, E0] -= 1.0 / (s1 * BIAS)
            wk[kb + X_SINK, oh["<s>"]] = 1.0 / s1
            recency(wq, wk, 2, 1, s1, 12, 18, X_AFTER, "PREVNUM")
            recency(wq, wk, 3, 1, s1, 8, 12, X_NAME, "NAME")
            # values: digits of S2..S4 (the number's last three digits), NULL, the token's
            # code, HN (it is a name start) and its complement (keeps the norm)
            for r in range(3):
                for k, d in enumerate(DIG):
                    wv[kb + 10 * r + k, S(r + 2) + d] = 1.0 / s1
                    wv[kb + 30, S(r + 2) + d] = -1.0 / (3 * s1)
            wv[kb + 30, E0] = 1.0 / (s1 * BIAS)
            for i in range(D):
                wv[kb + 31 + i, i] = 1.0 / s1
            for q in ("AR", "VAR"):
                wv[kb + 95, S(1) + oh[q]] = 1.0 / (RU * s1)
                wv[kb + 96, S(1) + oh[q]] = -1.0 / (RU * s1)
            wv[kb + 96, E0] = 1.0 / (s1 * BIAS)
            for k in range(30):
                wo[P0 + k, 2 * HD + k] = W_P
            wo[P_NULL, 2 * HD + 30] = math.sqrt(3) * W_P
            for k, i in enumerate(CODE_SUB):
                wo[N0 + k, 3 * HD + 31 + i] = 1.0
            wo[N_HN, 3 * HD + 95] = W_H
            wo[J_NAME, 3 * HD + 96] = math.sqrt(1 + W_H ** 2)
            # head 1 (on kv head 0, whose values are the token codes): NAME2, the second
            # piece of the last left-hand name ("VAR X1 j" not after "▁=")
            X_NS2 = X_SINK + 1
            wk[X_NS2, E0] = 1.0 / (s1 * BIAS)
            wk[X_NS2, oh["<s>"]] = -1.0 / s1
            alpha, _ = recency(wq, wk, 1, 0, s1, 8, 12, None, "NAME2")
            kq = alpha * sq / s1   # on the induction keys: S2 in block 1, S3 in 2, S4 in 3
            wq[HD + N_ROT + D * 1 + oh["AR"], E0] = kq / (RU * BIAS)
            wq[HD + N_ROT + D * 1 + oh["VAR"], E0] = 2 * kq / (RU * BIAS)
            wq[HD + N_ROT + D * 2 + oh["\u2581V"], E0] = kq / (RU * BIAS)
            wq[HD + N_ROT + D * 3 + oh["\u2581="], E0] = -kq / BIAS
            wq[HD + X_NS2, E0] = -alpha * sq / (s1 * BIAS)
            for k, i in enumerate(CODE_SUB):
                wo[NAME2_DIMS[k], HD + i] = 1.0
            wo[J_N2, HD + D] = 1.0   # the sink's dummy (value 1 at BOS) keeps the norm
            # P is only kept at digits and the token after one (layer 2 compares it between
            # those); a dummy of its norm replaces it elsewhere (units 0..31)
            GP = 20.0
            sg = GP / (1 + math.exp(-GP))
            for u in range(32):
                gate[u, E0] = GP / (sf1 * BIAS)
                for d in DIG:
                    gate[u, C0 + d] = -2 * GP / sf1
                    gate[u, S(1) + d] = -2 * GP / sf1
                if u < 31:
                    up[u, P0 + u] = 1.0 / sf1
                    down[P0 + u, u] = -1.0 / sg
                else:
                    up[u, E0] = 1.0 / (sf1 * BIAS)
                    down[J_P, u] = math.sqrt(n_p) / sg

            def and_unit(u, slots, out):
                """out = 1 where every (slot, piece set) holds, else ~0: CONT's class
                matches, which a linear query cannot gate."""
                GF = 20.0
                for m, pieces in slots:
                    for c in pieces:
                        gate[u, S(m) + c] = GF / sf1
                gate[u, E0] = -(len(slots) - 0.5) * GF / (sf1 * BIAS)
                up[u, E0] = 1.0 / (sf1 * BIAS)
                down[out, u] = 1.0 / (0.5 * GF / (1 + math.exp(-0.5 * GF)))

            # F_SEP: a digit right after a separator; F_SEP2: the same one token further
            # ("32532": the second "32" is not the one after the separator)
            and_unit(32, [(0, DIG), (1, SEP)], F_SEP)
            and_unit(33, [(0, DIG), (1, DIG), (2, SEP)], F_SEP2)
        else:
            layer2(wq, wk, wv, wo, oh, DIG, SEP, RU, s2, sq, S)
            # the list prior lives after layer 2's attention, so its output never changes
            # the norm of what layer 2's heads compare
            prior_mlp(gate, up, down, oh, codes, onehot, rng, s2, log)
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


def layer2(wq, wk, wv, wo, oh, DIG, SEP, RU, s, sq, S):
    """Heads that read layer 1's PREVNUM / NAME features (all scores in logits):
      0 VS    at ':' or at a '.' ending a number, attends to the first digit of a value
              ("is ▁d") whose PREVNUM is the number just ended (or NULL after ':').
      1 CONT  continues a number or a name being copied: 3-gram (separators ▁ . : as one
              class) plus PREVNUM equality at digits; its sink is low only at digits
              and upper-case pieces.
      2 LOOK+CHAIN  at ':' after "... equal to N are", attends to the '.' ending an
              assignment of N that has a left-hand name; at the last piece of a name X
              (2-gram), to the '.' ending "VAR Y = VAR X."; copies NAME (Y's first piece).
      3 SECOND at the first piece just copied, attends to the same '.' again (its NAME
              is the current token) and copies NAME2, the name's second piece."""
    b1 = HD  # kv head 1
    nseg = [i for i in range(D) if i != UPPER_DIM and i not in SEP]
    for m in range(3):
        for i in nseg:
            wk[N_ROT + D * m + i, S(m + 1) + i] = 1.0 / s
    for kb in (0, b1):
        wk[kb + X_SINK, C0 + oh["<s>"]] = 1.0 / s
    # kv head 0 extras: SEP class, PREVNUM, value-start flag
    X_SEP, X_P, X_VSF, X_NS = N_ROT + 3 * D, N_ROT + 3 * D + 3, N_ROT + 3 * D + 34, N_ROT + 3 * D + 35
    # X_NS: j follows the first piece of a left-hand name ("VAR X1 j", not after "▁="):
    # a name piece that also occurs in the text ("▁A") continues as the name
    wk[X_NS, S(2) + oh["AR"]] += 1.0 / (RU * s)
    wk[X_NS, S(2) + oh["VAR"]] += 2.0 / (RU * s)
    wk[X_NS, S(3) + oh["\u2581V"]] += 1.0 / (RU * s)
    wk[X_NS, S(4) + oh["\u2581="]] -= 1.0 / s   # 2 after a left-hand first piece, 1 right-hand
    for c in SEP:
        wk[X_SEP, S(2) + c] = 1.0 / s
        wk[X_SEP + 1, S(3) + c] = 1.0 / s
    for k in range(31):
        wk[X_P + k, P0 + k] = 1.0 / s
    wk[X_VSF, S(1) + oh["\u2581"]] = 1.0 / s
    wk[X_VSF, S(2) + oh["\u2581is"]] = 1.0 / s
    for d in DIG:
        wk[X_VSF, C0 + d] = 1.0 / s
    wk[X_VSF, E0] = -2.0 / (s * BIAS)
    wk[X_VSF, C0 + oh["<s>"]] = 2.0 / s    # 0 at BOS, the sink
    for i in range(D):
        if i != oh["<s>"]:
            wv[i, C0 + i] = 1.0 / s
        wo[i, 0 * HD + i] = COPY_VS
        wo[i, 1 * HD + i] = COPY_C
    WN = math.sqrt(3) * W_P
    # head 0: VS
    G_VS, L_VS, SK_VS = 40.0, 12.0, 58.0
    for c in (":", "."):
        wq[0 * HD + X_VSF, C0 + oh[c]] = G_VS * sq / s
    for r in range(3):
        for k, d in enumerate(DIG):
            wq[0 * HD + X_P + 10 * r + k, S(r + 1) + d] = L_VS * sq / (W_P * s)
    wq[0 * HD + X_P + 30, C0 + oh[":"]] = 3 * L_VS * sq / (WN * s)
    wq[0 * HD + X_SINK, E0] = SK_VS * sq / (s * BIAS)
    # head 1: CONT
    # match weights by slot pair (t, j-1), (t-1, j-2), (t-2, j-3): a name piece continues
    # on the current piece alone, which must outweigh the two older slots together
    U_C, L_C, SK_D, SK_U, SK_X = (40.0, 12.0, 12.0), 16.0, 100.0, 19.0, 200.0
    for m in range(3):
        for i in nseg:
            wq[1 * HD + N_ROT + D * m + i, S(m) + i] = U_C[m] * sq / s
    wq[1 * HD + X_SEP, F_SEP] = 2 * U_C[1] * sq / s   # "the value's first digit" is worth two
    wq[1 * HD + X_SEP + 1, F_SEP2] = U_C[2] * sq / s
    wq[1 * HD + X_NS, E0] = 6.0 * sq / (s * BIAS)
    for k in range(30):
        wq[1 * HD + X_P + k, P0 + k] = L_C * sq / (W_P ** 2 * s)
    wq[1 * HD + X_P + 30, P_NULL] = 3 * L_C * sq / (WN ** 2 * s)
    wq[1 * HD + X_SINK, E0] = SK_X * sq / (s * BIAS)
    for d in DIG:
        wq[1 * HD + X_SINK, C0 + d] += (SK_D - SK_X) * sq / s
    wq[1 * HD + X_SINK, C0 + UPPER_DIM] += (SK_U - SK_X) * sq / (UPPER_K * s)
    # kv head 1: (S1, S2) codes, digits of S1..S3, number end, HN, '.', NAME
    X_DG, X_NE, X_HN, X_DOT, X_N1 = (N_ROT + 2 * D, N_ROT + 2 * D + 30, N_ROT + 2 * D + 31,
                                     N_ROT + 2 * D + 32, N_ROT + 2 * D + 33)
    for m in range(2):
        for i in nseg:
            wk[b1 + N_ROT + D * m + i, S(m + 1) + i] = 1.0 / s
    for r in range(3):
        for k, d in enumerate(DIG):
            wk[b1 + X_DG + 10 * r + k, S(r + 1) + d] = 1.0 / s
    for d in DIG:
        wk[b1 + X_NE, S(1) + d] += 1.0 / s
        wk[b1 + X_NE, C0 + d] -= 1.0 / s
    wk[b1 + X_HN, N_HN] = 1.0 / (W_H * s)
    wk[b1 + X_DOT, C0 + oh["."]] = 1.0 / s
    for k in range(35):
        wk[b1 + X_N1 + k, N0 + k] = 1.0 / s
    for k, i in enumerate(CODE_SUB):   # values: NAME (first piece), NAME2 (second piece)
        wv[b1 + k, N0 + k] = 1.0 / s
        wv[b1 + 35 + k, NAME2_DIMS[k]] = 1.0 / s
        wo[i, 2 * HD + k] = COPY_N
        wo[i, 3 * HD + 35 + k] = COPY_N
    KU = 1 - UPPER_K ** 2       # a name piece matches itself at 1 - K^2 (the flag is left out)
    # head 2: LOOK (at ':' after "equal to N are") and CHAIN (at a name's last piece)
    L_L, G_L, H_L, P_L, M_L, SK_L, B_L = 10.0, 30.0, 40.0, 40.0, 20.0 / KU, 110.0, 200.0
    for r in range(3):
        for k, d in enumerate(DIG):
            wq[2 * HD + X_DG + 10 * r + k, S(r + 2) + d] = L_L * sq / s
    wq[2 * HD + X_NE, C0 + oh[":"]] = G_L * sq / s
    wq[2 * HD + X_HN, E0] = H_L * sq / (s * BIAS)
    wq[2 * HD + X_DOT, E0] = P_L * sq / (s * BIAS)
    for m in range(2):
        for i in nseg:
            wq[2 * HD + N_ROT + D * m + i, S(m) + i] = M_L * sq / s
    wq[2 * HD + X_SINK, E0] = (SK_L + B_L) * sq / (s * BIAS)
    wq[2 * HD + X_SINK, C0 + UPPER_DIM] = -B_L * sq / (UPPER_K * s)
    wq[2 * HD + X_SINK, C0 + oh[":"]] = -B_L * sq / s
    # head 3: SECOND, at the first piece of a name just copied, attends to the same '.'
    # again (its NAME is the current token; the context before it is the previous name's
    # end or the question's number) and copies the name's second piece
    A_2, C_2, L_2, P_2, H_2, SK_2, B_2 = 30.0, 20.0 / KU, 15.0, 20.0, 20.0, 88.0, 200.0
    for k, i in enumerate(CODE_SUB):
        wq[3 * HD + X_N1 + k, C0 + i] = A_2 * sq / s
    for m in range(2):
        for i in nseg:
            wq[3 * HD + N_ROT + D * m + i, S(m + 1) + i] = C_2 * sq / s
    for r in range(2):
        for k, d in enumerate(DIG):
            wq[3 * HD + X_DG + 10 * r + k, S(r + 3) + d] = L_2 * sq / s
    wq[3 * HD + X_DOT, E0] = P_2 * sq / (s * BIAS)
    wq[3 * HD + X_HN, E0] = H_2 * sq / (s * BIAS)
    wq[3 * HD + X_SINK, E0] = (SK_2 + B_2) * sq / (s * BIAS)
    wq[3 * HD + X_SINK, C0 + UPPER_DIM] = -B_2 * sq / (UPPER_K * s)


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
                    gate[u, C0 + oh[pc]] += ALPHA * wgt
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
    return unit[0]


# ------------------------------------------------------------ GGUF --
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
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "models", "constructed.gguf"))
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
        elif name.endswith(("attn_q.weight", "attn_k.weight")):
            t = G.GGML_F16   # the RoPE kernels and match scores want f16's precision
        else:
            t = G.GGML_Q8_0  # copies and gates: exact in Q8_0 (one magnitude per block)
        tensors.append((name, w, t))
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    write_gguf(a.out, gguf_kvs(v), tensors)
    log("wrote %s (%d bytes)" % (a.out, os.path.getsize(a.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
