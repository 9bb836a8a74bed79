#!/usr/bin/python3
"""reference.py — independent float64 torch forward pass for GGUF llama/qwen2/qwen3/qwen3moe.

Written from the public model definitions (Llama / Qwen papers and the GGUF
metadata conventions llama.cpp uses), not from kvsieve's C code; see
docs/REFERENCE.md.  Weights are dequantized exactly (tools/gguf_reader.py) to
float32 and then widened to float64; every activation is computed in float64,
so the result is the "true" forward pass of the stored weights, against which
the float32 C engine is measured.

    reference.py MODEL.gguf --tokens 1,2,3 [--greedy N] [--dump-logits OUT.bin]
    reference.py MODEL.gguf --prompt "Once upon a time" --greedy 40    (SPM vocab)

Prints the greedy continuation ids (and its text when the GGUF carries a
SentencePiece vocabulary).  --dump-logits writes float32 [n_tokens][n_vocab]
(teacher-forced logits of every prompt position), little-endian, no header.

Architecture notes (verified against public llama.cpp sources):
  * arch "llama" (Llama 1/2/3/3.1/3.2, Mistral): llama.cpp's converter permutes
    the HF q/k projection rows so that GGUF stores them for the "normal" RoPE,
    rotating consecutive pairs (x[2i], x[2i+1]); llama.cpp maps LLM_ARCH_LLAMA
    to LLAMA_ROPE_TYPE_NORM.
  * qwen2 / qwen3: no permutation; NEOX RoPE rotating (x[i], x[i + n_rot/2])
    (LLM_ARCH_QWEN2 / LLM_ARCH_QWEN3 -> LLAMA_ROPE_TYPE_NEOX).
  * optional rope_freqs.weight [n_rot/2] (Llama 3.1 long-context scaling):
    the rotation angle of frequency i is divided by rope_freqs[i].
"""
import argparse
import math
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_reader as G  # noqa: E402

DT = torch.float64

NORM_ROPE_ARCHS = {"llama"}
NEOX_ROPE_ARCHS = {"qwen2", "qwen3", "qwen3moe"}


class Config:
    pass


def load_config(r):
    arch = r.kv["general.architecture"]
    if arch not in NORM_ROPE_ARCHS | NEOX_ROPE_ARCHS:
        raise SystemExit("reference.py: unsupported architecture %r" % arch)
    k = lambda name, default=None: r.kv.get("%s.%s" % (arch, name), default)  # noqa: E731
    c = Config()
    c.arch = arch
    c.n_embd = int(k("embedding_length"))
    c.n_layer = int(k("block_count"))
    c.n_head = int(k("attention.head_count"))
    c.n_head_kv = int(k("attention.head_count_kv", c.n_head))
    c.n_ff = int(k("feed_forward_length"))
    c.head_dim = int(k("attention.key_length", c.n_embd // c.n_head))
    c.head_dim_v = int(k("attention.value_length", c.head_dim))
    c.n_rot = int(k("rope.dimension_count", c.head_dim))
    c.freq_base = float(k("rope.freq_base", 10000.0))
    c.eps = float(k("attention.layer_norm_rms_epsilon", 1e-5))
    c.n_ctx_train = int(k("context_length", 2048))
    stype = k("rope.scaling.type", "none")
    c.freq_scale = 1.0
    if stype == "linear":
        c.freq_scale = 1.0 / float(k("rope.scaling.factor", 1.0))
    elif stype not in ("none", None):
        raise SystemExit("reference.py: unsupported rope scaling %r" % stype)
    c.neox = arch in NEOX_ROPE_ARCHS
    # mixture of experts (qwen3moe): softmax router, top expert_used_count,
    # the kept weights renormalised to sum 1 (Qwen3-MoE's norm_topk_prob)
    c.n_expert = int(k("expert_count", 0))
    c.n_expert_used = int(k("expert_used_count", 0))
    return c


class Model:
    def __init__(self, path, emulate=None):
        self.r = G.GGUFReader(path)
        self.c = load_config(self.r)
        self.emulate = emulate  # None, or "engine" (see emulate_matmul)
        self.route_margin = float("inf")  # smallest router-logit gap at a top-k boundary seen (MoE)
        self.moe_norm = True  # renormalise the kept experts' weights (off only in make_goldens --sensitivity)
        self.wtypes = {}
        self.w = {}
        for name, ti in self.r.tensors.items():
            self.w[name] = torch.from_numpy(self.r.dequantize(name).astype(np.float64))
            self.wtypes[name] = ti.type
        if "output.weight" not in self.w:  # tied embeddings
            self.w["output.weight"] = self.w["token_embd.weight"]
            self.wtypes["output.weight"] = self.wtypes["token_embd.weight"]
        self.n_vocab = self.w["token_embd.weight"].shape[0]
        c = self.c
        assert self.w["token_embd.weight"].shape[1] == c.n_embd
        assert c.n_head % c.n_head_kv == 0
        ff = self.w.get("rope_freqs.weight")
        i = torch.arange(c.n_rot // 2, dtype=DT)
        inv = c.freq_base ** (-2.0 * i / c.n_rot) * c.freq_scale
        if ff is not None:
            assert ff.numel() == c.n_rot // 2, "rope_freqs must have n_rot/2 entries"
            inv = inv / ff.reshape(-1)
        self.inv_freq = inv

    # -------------------------------------------------------------- ops --
    def linear(self, x, name, bias=None):
        w = self.w[name]
        if self.emulate:
            x = emulate_activation(x, self.wtypes[name])
        y = x @ w.T
        b = self.w.get(bias) if bias else None
        if b is not None:
            y = y + b
        return y

    def rmsnorm(self, x, name):
        w = self.w[name]
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.c.eps) * w

    def rope(self, x, pos):
        """x: [T, H, D]; rotate the first n_rot dims of each head."""
        c = self.c
        ang = pos.to(DT)[:, None] * self.inv_freq[None, :]  # [T, n_rot/2]
        cos = torch.cos(ang)[:, None, :]
        sin = torch.sin(ang)[:, None, :]
        xr, xp = x[..., :c.n_rot], x[..., c.n_rot:]
        if c.neox:
            a, b = xr[..., :c.n_rot // 2], xr[..., c.n_rot // 2:]
            out = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
        else:
            a, b = xr[..., 0::2], xr[..., 1::2]
            out = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
        return torch.cat([out, xp], dim=-1)

    # ---------------------------------------------------------- forward --
    def forward(self, tokens):
        """Teacher-forced logits [T, n_vocab] (float64) for a token list."""
        c = self.c
        toks = torch.tensor(tokens, dtype=torch.long)
        T = len(tokens)
        if T > c.n_ctx_train:
            print("reference.py: warning: %d tokens exceed the training context %d" %
                  (T, c.n_ctx_train), file=sys.stderr)
        pos = torch.arange(T)
        x = self.w["token_embd.weight"][toks]
        mask = torch.full((T, T), float("-inf"), dtype=DT).triu(1)
        group = c.n_head // c.n_head_kv
        for l in range(c.n_layer):
            p = "blk.%d." % l
            h = self.rmsnorm(x, p + "attn_norm.weight")
            q = self.linear(h, p + "attn_q.weight", p + "attn_q.bias").view(T, c.n_head, c.head_dim)
            k = self.linear(h, p + "attn_k.weight", p + "attn_k.bias").view(T, c.n_head_kv, c.head_dim)
            v = self.linear(h, p + "attn_v.weight", p + "attn_v.bias").view(T, c.n_head_kv, c.head_dim_v)
            if p + "attn_q_norm.weight" in self.w:  # qwen3: per-head RMSNorm before RoPE
                q = self.rmsnorm(q, p + "attn_q_norm.weight")
            if p + "attn_k_norm.weight" in self.w:
                k = self.rmsnorm(k, p + "attn_k_norm.weight")
            q = self.rope(q, pos)
            k = self.rope(k, pos)
            if self.emulate:  # the engine stores K and V in an f16 cache
                k = k.to(torch.float16).to(DT)
                v = v.to(torch.float16).to(DT)
            kh = k.repeat_interleave(group, dim=1)  # query head j uses kv head j // group
            vh = v.repeat_interleave(group, dim=1)
            s = torch.einsum("thd,shd->hts", q, kh) / math.sqrt(c.head_dim) + mask
            a = torch.softmax(s, dim=-1)
            o = torch.einsum("hts,shd->thd", a, vh).reshape(T, c.n_head * c.head_dim_v)
            x = x + self.linear(o, p + "attn_output.weight")
            h = self.rmsnorm(x, p + "ffn_norm.weight")
            if p + "ffn_gate_inp.weight" in self.w:
                x = x + self.moe(h, p)
                continue
            g = self.linear(h, p + "ffn_gate.weight")
            u = self.linear(h, p + "ffn_up.weight")
            x = x + self.linear(torch.nn.functional.silu(g) * u, p + "ffn_down.weight")
        x = self.rmsnorm(x, "output_norm.weight")
        return self.linear(x, "output.weight")

    def moe(self, h, p):
        """Mixture-of-experts FFN of rows h [T, n_embd]: the router's softmax,
        each row's top n_expert_used experts with their probabilities
        renormalised to sum 1, the weighted sum of those experts' SwiGLU
        outputs.  Experts are slices of the stacked [n_expert, rows, cols]
        tensors ffn_{gate,up,down}_exps."""
        c = self.c
        logits = self.linear(h, p + "ffn_gate_inp.weight")
        probs = torch.softmax(logits, dim=-1)  # [T, n_expert]
        w, sel = torch.topk(probs, c.n_expert_used, dim=-1)
        if c.n_expert_used < c.n_expert:  # how close the last kept expert came to the first dropped one
            top = torch.topk(logits, c.n_expert_used + 1, dim=-1).values
            self.route_margin = min(self.route_margin, float((top[:, -2] - top[:, -1]).min()))
        if self.moe_norm:
            w = w / w.sum(-1, keepdim=True)
        gate, up, down = (self.w[p + "ffn_%s_exps.weight" % n] for n in ("gate", "up", "down"))
        out = torch.zeros_like(h)
        for t in range(h.shape[0]):
            for j in range(c.n_expert_used):
                e = int(sel[t, j])
                x = h[t:t + 1]
                if self.emulate:
                    x = emulate_activation(x, self.wtypes[p + "ffn_gate_exps.weight"])
                y = torch.nn.functional.silu(x @ gate[e].T) * (x @ up[e].T)
                if self.emulate:
                    y = emulate_activation(y, self.wtypes[p + "ffn_down_exps.weight"])
                out[t] += w[t, j] * (y @ down[e].T)[0]
        return out

    def greedy(self, prompt, n):
        """Greedy continuation: returns (ids, margins) where margins[i] is the
        top-1 minus top-2 logit at step i."""
        seq = list(prompt)
        out, margins = [], []
        for _ in range(n):
            logits = self.forward(seq)[-1]
            top = torch.topk(logits, 2)
            t = int(top.indices[0])
            margins.append(float(top.values[0] - top.values[1]))
            out.append(t)
            seq.append(t)
        return out, margins


# --------------------------------------------------- engine emulation --
def _round_half_away(x):
    return torch.sign(x) * torch.floor(torch.abs(x) + 0.5)


def emulate_activation(x, wtype):
    """Round activations the way an engine with integer dot products would
    (Q8_0 blocks of 32 for Q8_0/Q4_0 weights, Q8_K blocks of 256 for Q4_K/Q6_K);
    used only to estimate the error budget of the C engine (--emulate)."""
    if wtype in (G.GGML_Q8_0, G.GGML_Q4_0):
        bs = 32
    elif wtype in (G.GGML_Q4_K, G.GGML_Q6_K):
        bs = 256
    else:
        return x.to(torch.float32).to(DT)
    shp = x.shape
    xb = x.to(torch.float32).to(DT).reshape(-1, bs)
    amax = xb.abs().max(dim=1, keepdim=True).values
    d = amax / 127.0
    if bs == 32:
        d = d.to(torch.float16).to(DT)  # Q8_0 stores its scale as f16
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = _round_half_away(xb * inv).clamp(-127, 127)
    return (q * d).reshape(shp)


# ------------------------------------------------------------ tokenizer --
def spm_vocab(r):
    if r.kv.get("tokenizer.ggml.model") != "llama":
        return None
    return r.kv["tokenizer.ggml.tokens"], r.kv.get("tokenizer.ggml.scores")


def spm_encode(r, text, add_bos=True):
    """Minimal SentencePiece-BPE encoder (score-ordered merges, byte fallback):
    only for building test prompts; the C tokenizer is tested elsewhere."""
    tokens, scores = spm_vocab(r)
    index = {t: i for i, t in enumerate(tokens)}
    s = "\u2581" + text.replace(" ", "\u2581")
    syms = list(s)
    while True:
        best, best_i = None, -1
        for i in range(len(syms) - 1):
            m = syms[i] + syms[i + 1]
            if m in index:
                sc = scores[index[m]]
                if best is None or sc > best:
                    best, best_i = sc, i
        if best_i < 0:
            break
        syms[best_i:best_i + 2] = [syms[best_i] + syms[best_i + 1]]
    ids = [int(r.kv.get("tokenizer.ggml.bos_token_id", 1))] if add_bos else []
    for sym in syms:
        if sym in index:
            ids.append(index[sym])
        else:
            for byte in sym.encode("utf-8"):
                ids.append(index["<0x%02X>" % byte])
    return ids


def spm_decode(r, ids):
    tokens, _ = spm_vocab(r)
    out = bytearray()
    for i in ids:
        t = tokens[i]
        if len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            out.append(int(t[3:5], 16))
        elif t in ("<s>", "</s>", "<unk>"):
            continue
        else:
            out += t.replace("\u2581", " ").encode("utf-8")
    return out.decode("utf-8", errors="replace")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", help="comma-separated prompt ids")
    ap.add_argument("--prompt", help="text prompt (SentencePiece vocab only; BOS added)")
    ap.add_argument("--greedy", type=int, default=16, help="continuation length (default 16)")
    ap.add_argument("--dump-logits", help="write f32 [n_tokens][n_vocab] teacher-forced logits")
    ap.add_argument("--emulate", action="store_true",
                    help="round activations/KV like the C engine (error-budget estimation)")
    a = ap.parse_args(argv)
    m = Model(a.model, emulate="engine" if a.emulate else None)
    if a.tokens:
        prompt = [int(t) for t in a.tokens.split(",") if t.strip()]
    elif a.prompt is not None:
        if spm_vocab(m.r) is None:
            raise SystemExit("reference.py: --prompt needs a SentencePiece vocabulary")
        prompt = spm_encode(m.r, a.prompt)
    else:
        raise SystemExit("reference.py: give --tokens or --prompt")
    print("prompt ids:", ",".join(map(str, prompt)))
    if a.dump_logits:
        lg = m.forward(prompt).to(torch.float32).numpy().astype("<f4")
        with open(a.dump_logits, "wb") as f:
            f.write(lg.tobytes())
    ids, margins = m.greedy(prompt, a.greedy)
    print("greedy ids:", ",".join(map(str, ids)))
    print("top-2 margins:", " ".join("%.3g" % x for x in margins))
    if spm_vocab(m.r) is not None:
        print("text: %r" % spm_decode(m.r, prompt + ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
