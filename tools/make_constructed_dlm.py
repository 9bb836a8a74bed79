#!/usr/bin/python3
"""make_constructed_dlm.py — the constructed fixture's EAGLE-3 draft model (DLM), seeded and reproducible.

    /usr/bin/python3 tools/make_constructed_dlm.py [--target tests/fixtures/models/constructed.gguf]
                                       [--out tests/fixtures/models/constructed-dlm]

SpeContext selects each step's KV entries with the attention of a distilled
draft model (an EAGLE-3 "DLM") pruned to its retrieval head.  This script makes
that DLM for kvsieve's constructed test model, in the EAGLE-3 checkpoint layout that
public drafts use (config.json + model.safetensors, layer tensors under
"midlayer.", no embed_tokens: the target's embedding is shared), so one loader
(src/draft/eagle3.c) serves ours and the public ones.  See docs/DLM.md.

Shape (EAGLE-3): x_t = [input_norm(e(tok_t)); hidden_norm(fc([h_lo; h_mid; h_hi]_{t-1}))],
one decoder layer over x (4 query / 2 KV heads, head_dim 272: the KV heads map one
to one onto the target's), a SwiGLU MLP, final norm and an LM head over a reduced
draft vocabulary (d2t / t2d as EAGLE-3).  The fused states are the residual
streams entering target layers [0, 1, 1]: the retrieval head below needs only
the residual entering layer 1 (EAGLE-3's default [2, L/2, L-3] would be [2, 1, 0]
for the 3-layer target; any order works with the loader).

How it is made — constructed retrieval head, distilled remainder:
  * The target (tools/make_constructed_model.py) retrieves with one induction head
    whose query is the codes of tokens (t, t-1, t-2, t-3) and whose key is the
    codes of (j-1 .. j-4).  The DLM sees e(tok_t) and the target's residual at
    t-1, which holds the codes of t-1 .. t-5, so the same match is computable
    exactly: fc passes the layer-1 residual through, q_proj reads
    (e(t), A, S1, S2) and k_proj reads (A, S1, S2, S3) of x (plus a BOS sink);
    each KV head's second query head matches (A, S1, S2, S3) against the same
    keys, i.e. finds the current token, which the layer input lacks.  These tensors
    (fc, hidden_norm, input_layernorm, q_proj, k_proj: the retrieval head) are
    set by construction and frozen.  Position enters the target's induction
    only through its content, so the head's RoPE is made (almost) inert with
    linear scaling (factor 5e5: at most 0.02 rad at 8K positions).
  * Everything after the attention weights (v_proj, o_proj, the norms, the MLP,
    lm_head) is *trained*: KL(target || draft) of next-token distributions
    on seeded sequences built from the eval templates (filler, needles, lists and
    their repetitions), teacher logits from the target's float forward pass.
    v/o/lm_head start from the copy path (v = e(tok_j), o into a free block,
    lm_head = the target's tied embedding rows), the MLP from small noise.
The script prints the draft's top-1 agreement with the target before and after
training on held-out sequences.  About 8-14 minutes on 2 cores (with OpenBLAS:
scripts/deps.sh --reference).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import gguf_reader as G  # noqa: E402
import make_constructed_model as MB  # noqa: E402
from safetensors_writer import eagle3_vocab_maps, write_safetensors  # noqa: E402

D = MB.D                      # token code width
H = MB.H                      # target and draft hidden size (512)
HQ, HKV, HD = 4, 2, 272       # draft heads: query, KV (= target's), head dim (4 code blocks + sink, padded to 16)
X_SINK = 4 * D
OUT_BLK = D * 4               # residual block [256, 320) (slot S4, dropped by fc) holds the draft's output
N_FF = 384
AUX = [0, 1, 1]
ROPE_THETA = 10000.0
ROPE_LINEAR = 5e5
MAX_POS = 8192
U, SINK, COPY, OUT_GAIN = MB.U, MB.SINK, MB.COPY, MB.OUT_GAIN  # the target's match logit, sink, copy and output gains


def rms(x, w, eps=MB.EPS):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


# ------------------------------------------------------------ target --
class Target:
    """Float32 torch forward of the bundled llama GGUF (as tools/reference.py, batched)."""

    def __init__(self, path):
        self.r = G.GGUFReader(path)
        kv = self.r.kv
        self.n_layer = kv["llama.block_count"]
        self.n_head = kv["llama.attention.head_count"]
        self.n_kv = kv["llama.attention.head_count_kv"]
        self.hd = kv["llama.attention.key_length"]
        self.n_rot = kv["llama.rope.dimension_count"]
        self.base = kv["llama.rope.freq_base"]
        self.eps = kv["llama.attention.layer_norm_rms_epsilon"]
        self.w = {n: torch.from_numpy(self.r.dequantize(n).astype(np.float32)) for n in self.r.tensors}
        self.emb = self.w["token_embd.weight"]
        assert self.emb.shape[1] == H and self.n_kv == HKV, "make_constructed_dlm.py expects the constructed model's shape"

    def rms(self, x, w):
        return rms(x, w, self.eps)

    def rope(self, x, T):
        i = torch.arange(self.n_rot // 2, dtype=torch.float64)
        inv = self.base ** (-2.0 * i / self.n_rot)
        ang = (torch.arange(T, dtype=torch.float64)[:, None] * inv[None]).float()
        cos, sin = torch.cos(ang)[None, :, None, :], torch.sin(ang)[None, :, None, :]
        xr, xp = x[..., :self.n_rot], x[..., self.n_rot:]
        a, b = xr[..., 0::2], xr[..., 1::2]  # GGUF llama: adjacent pairs
        out = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
        return torch.cat([out, xp], -1)

    @torch.no_grad()
    def forward(self, toks):
        """toks [B, T] -> (hidden entering each layer [n_layer][B, T, H], final normed x [B, T, H])."""
        B, T = toks.shape
        x = self.emb[toks]
        mask = torch.full((T, T), float("-inf")).triu(1)
        hs = []
        g = self.n_head // self.n_kv
        for l in range(self.n_layer):
            hs.append(x)
            p = "blk.%d." % l
            h = self.rms(x, self.w[p + "attn_norm.weight"])
            q = (h @ self.w[p + "attn_q.weight"].T).view(B, T, self.n_head, self.hd)
            k = (h @ self.w[p + "attn_k.weight"].T).view(B, T, self.n_kv, self.hd)
            v = (h @ self.w[p + "attn_v.weight"].T).view(B, T, self.n_kv, self.hd)
            q, k = self.rope(q, T), self.rope(k, T)
            k = k.repeat_interleave(g, 2)
            v = v.repeat_interleave(g, 2)
            s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(self.hd) + mask
            o = torch.einsum("bhts,bshd->bthd", torch.softmax(s, -1), v).reshape(B, T, -1)
            x = x + o @ self.w[p + "attn_output.weight"].T
            h = self.rms(x, self.w[p + "ffn_norm.weight"])
            gg = h @ self.w[p + "ffn_gate.weight"].T
            u = h @ self.w[p + "ffn_up.weight"].T
            x = x + (torch.nn.functional.silu(gg) * u) @ self.w[p + "ffn_down.weight"].T
        return hs, self.rms(x, self.w["output_norm.weight"])


# --------------------------------------------------------------- data --
class TextGen:
    """Seeded sequences in the eval templates' style (src/eval/eval_tasks.c)."""

    def __init__(self, vocab, seed):
        self.v = vocab
        self.rng = np.random.default_rng(seed)
        w = MB.FILLER
        self.det, self.adj = w[:7], w[7:27]
        self.noun, self.verb = w[27:51], w[51:67]
        self.prep, self.adv = w[67:77], w[77:87]

    def pick(self, xs):
        return xs[int(self.rng.integers(len(xs)))]

    def num(self):
        return str(int(self.rng.integers(10000, 100000)))

    def name(self):
        return "".join(chr(65 + int(c)) for c in self.rng.integers(0, 26, 5))

    def sentence(self):
        shape = self.pick(["DANVPDN", "DNVR", "DANVPDAN", "DNVPDN", "DANVR", "DN&DNVPDAN", "RDANV", "DNVRPDN"])
        m = {"D": self.det, "A": self.adj, "N": self.noun, "V": self.verb, "P": self.prep, "R": self.adv}
        ws = [self.pick(m[c]) if c in m else "and" for c in shape]
        ws[0] = ws[0].capitalize()
        return " ".join(ws) + "."

    def filler(self, n):
        return " ".join(self.sentence() for _ in range(n))

    def needle(self):
        """(statement, question prefix, answer) of one random template."""
        k = int(self.rng.integers(6))
        n = self.num()
        key = "%s-%s" % (self.pick(self.adj), self.pick(self.noun))
        if k == 0:
            return ("The pass key is %s. Remember it. %s is the pass key." % (n, n),
                    "What is the pass key? The pass key is", " " + n + ".")
        if k == 1:
            return ("The magic number for %s is %s." % (key, n),
                    "What is the magic number for %s? The magic number for %s is" % (key, key), " " + n + ".")
        if k == 2:
            m = self.num()
            return ("One magic number for %s is %s. One magic number for %s is %s." % (key, n, key, m),
                    "What are all the magic numbers for %s? They are:" % key, " %s %s." % (n, m))
        if k == 3:
            a, b = self.name(), self.name()
            return ("VAR %s = %s. VAR %s = VAR %s." % (a, n, b, a),
                    "Which variables are equal to %s? Answer: the variables equal to %s are:" % (n, n),
                    " %s %s." % (a, b))
        if k == 4:
            items = [self.num() for _ in range(int(self.rng.integers(2, 6)))]
            lst = "".join("\n%d. %s" % (i + 1, it) for i, it in enumerate(items))
            j = int(self.rng.integers(len(items)))
            return ("Write a list of %d random five-digit numbers, one per line, numbered 1 to %d.%s"
                    % (len(items), len(items), lst),
                    "Repeat item %d of your list exactly.\n%d." % (j + 1, j + 1), " " + items[j])
        return ("The magic number for %s is %s." % (key, n), "The magic number for %s is" % key, " " + n + ".")

    def sequence(self, T):
        """BOS + tokens of one text, cut or padded with filler to exactly T tokens."""
        parts = []
        qs = []
        for _ in range(int(self.rng.integers(1, 4))):
            parts.append(self.filler(int(self.rng.integers(1, 8))))
            st, q, a = self.needle()
            parts.append(st)
            qs.append(q + a)
        parts.append(self.filler(int(self.rng.integers(2, 20))))
        self.rng.shuffle(qs)
        parts += qs
        text = " ".join(parts)
        text = text.replace(" \n", "\n")
        ids = [1] + self.v.encode(text)
        while len(ids) < T:
            ids += self.v.encode(self.filler(4))
        return ids[:T]


# --------------------------------------------------------------- draft --
def rope_neox(x, T, inv):
    """x [B, T, h, hd]: HF rotate_half RoPE, pairs (j, j + hd/2)."""
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cos(ang).float()[None, :, None, :], torch.sin(ang).float()[None, :, None, :]
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


class Draft(torch.nn.Module):
    def __init__(self, tgt, draft_ids, scales, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        s_e, s_h = scales
        self.eps = tgt.eps
        Vd = len(draft_ids)
        # -- retrieval head (constructed, frozen) --
        fc = torch.zeros(H, 3 * H)
        for i in range(H):
            if not (OUT_BLK <= i < OUT_BLK + D):          # S4 is not needed: its block carries the output
                fc[i, H * 1 + i] = 1.0                      # h_mid = residual entering layer 1
        # per KV head g: query head 2g is the induction head, 2g+1 the "self" head
        # (matches the previous 4 codes, so it reads the current token, which the
        # fused states of t-1 do not hold).  Both share the key.
        wq = torch.zeros(HQ * HD, 2 * H)
        wk = torch.zeros(HKV * HD, 2 * H)
        lam = U * math.sqrt(HD)
        bos = MB.ONEHOT_PIECES.index("<s>")
        for h in range(HQ):
            induction = h % 2 == 0
            for i in range(D):
                for m in range(4):
                    if induction and m == 0:
                        wq[h * HD + i, i] = lam / s_e                                  # code of t
                    else:
                        src = m - 1 if induction else m                               # A, S1, S2 | A..S3
                        wq[h * HD + D * m + i, H + D * src + i] = lam / s_h
            if induction:
                wq[h * HD + X_SINK, MB.E0] = SINK * lam / (s_e * MB.BIAS)
        for h in range(HKV):
            for m in range(4):
                for i in range(D):
                    wk[h * HD + D * m + i, H + D * m + i] = 1.0 / s_h        # j-1 .. j-4 (A, S1, S2, S3)
            wk[h * HD + X_SINK, bos] = 1.0 / s_e                            # BOS (embedding half)
        self.register_buffer("fc", fc)
        self.register_buffer("hidden_norm", torch.ones(H))
        self.register_buffer("input_norm", torch.ones(H))
        self.register_buffer("wq", wq)
        self.register_buffer("wk", wk)
        inv = ROPE_THETA ** (-2.0 * torch.arange(HD // 2, dtype=torch.float64) / HD) / ROPE_LINEAR
        self.register_buffer("inv_freq", inv)
        # -- trained part, initialised on the copy path --
        wv = torch.zeros(HKV * HD, 2 * H)
        for h in range(HKV):
            for i in range(D):
                if i != MB.ONEHOT_PIECES.index("<s>"):      # the sink carries no value
                    wv[h * HD + i, i] = 1.0 / s_e
        wo = torch.zeros(H, HQ * HD)
        for h in range(HQ):
            for i in range(D):
                wo[OUT_BLK + i, h * HD + i] = (COPY if h % 2 == 0 else 1.0) / HKV
        self.wv = torch.nn.Parameter(wv)
        self.wo = torch.nn.Parameter(wo)
        self.post_norm = torch.nn.Parameter(torch.ones(H))
        self.gate = torch.nn.Parameter(torch.randn(N_FF, H, generator=g) * 0.02)
        self.up = torch.nn.Parameter(torch.randn(N_FF, H, generator=g) * 0.02)
        self.down = torch.nn.Parameter(torch.zeros(H, N_FF))
        norm = torch.zeros(H)
        norm[OUT_BLK:OUT_BLK + D] = OUT_GAIN
        self.norm = torch.nn.Parameter(norm)
        lm = torch.zeros(Vd, H)
        lm[:, OUT_BLK:OUT_BLK + D] = tgt.emb[draft_ids][:, :D]
        self.lm_head = torch.nn.Parameter(lm)

    def rms(self, x, w):
        return rms(x, w, self.eps)

    def forward(self, emb, h3):
        """emb [B, T, H] embeddings of tok_t; h3 [B, T, 3H] target states of t-1 -> logits [B, T, Vd]."""
        B, T, _ = emb.shape
        f = h3 @ self.fc.T
        x = torch.cat([self.rms(emb, self.input_norm), self.rms(f, self.hidden_norm)], -1)
        q = rope_neox((x @ self.wq.T).view(B, T, HQ, HD), T, self.inv_freq)
        k = rope_neox((x @ self.wk.T).view(B, T, HKV, HD), T, self.inv_freq)
        v = (x @ self.wv.T).view(B, T, HKV, HD)
        k = k.repeat_interleave(HQ // HKV, 2)
        v = v.repeat_interleave(HQ // HKV, 2)
        mask = torch.full((T, T), float("-inf")).triu(1)
        s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(HD) + mask
        o = torch.einsum("bhts,bshd->bthd", torch.softmax(s, -1), v).reshape(B, T, -1)
        r = f + o @ self.wo.T
        hmid = self.rms(r, self.post_norm)
        r = r + (torch.nn.functional.silu(hmid @ self.gate.T) * (hmid @ self.up.T)) @ self.down.T
        return self.rms(r, self.norm) @ self.lm_head.T


def draft_inputs(tgt, toks, hs):
    """EAGLE shift: position t gets e(tok_t) and the target's states at t-1 (zeros at t = 0)."""
    emb = tgt.emb[toks]
    h3 = torch.cat([hs[a] for a in AUX], -1)
    h3 = torch.cat([torch.zeros_like(h3[:, :1]), h3[:, :-1]], 1)
    return emb, h3


# ------------------------------------------------------------- output --
def save(out, model, draft_ids, n_vocab, info):
    os.makedirs(out, exist_ok=True)
    f16 = lambda t: (t.detach().numpy().astype("<f2"), "F16")  # noqa: E731
    f32 = lambda t: (t.detach().numpy().astype("<f4"), "F32")  # noqa: E731
    tensors = {
        "fc.weight": f16(model.fc),
        "midlayer.hidden_norm.weight": f32(model.hidden_norm),
        "midlayer.input_layernorm.weight": f32(model.input_norm),
        "midlayer.self_attn.q_proj.weight": f16(model.wq),
        "midlayer.self_attn.k_proj.weight": f16(model.wk),
        "midlayer.self_attn.v_proj.weight": f16(model.wv),
        "midlayer.self_attn.o_proj.weight": f16(model.wo),
        "midlayer.post_attention_layernorm.weight": f32(model.post_norm),
        "midlayer.mlp.gate_proj.weight": f16(model.gate),
        "midlayer.mlp.up_proj.weight": f16(model.up),
        "midlayer.mlp.down_proj.weight": f16(model.down),
        "norm.weight": f32(model.norm),
        "lm_head.weight": f16(model.lm_head),
        **eagle3_vocab_maps(draft_ids, n_vocab),
    }
    write_safetensors(os.path.join(out, "model.safetensors"), dict(sorted(tensors.items())),
                      {"format": "pt", "producer": "kvsieve tools/make_constructed_dlm.py"})
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": H,
        "target_hidden_size": H,
        "num_attention_heads": HQ,
        "num_key_value_heads": HKV,
        "head_dim": HD,
        "intermediate_size": N_FF,
        "num_hidden_layers": 1,
        "vocab_size": n_vocab,
        "draft_vocab_size": len(draft_ids),
        "rms_norm_eps": MB.EPS,
        "rope_theta": ROPE_THETA,
        "rope_scaling": {"rope_type": "linear", "factor": ROPE_LINEAR},
        "max_position_embeddings": MAX_POS,
        "eagle_aux_hidden_state_layer_ids": AUX,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "kvsieve": info,
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


# --------------------------------------------------------------- main --
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=os.path.join(ROOT, "tests", "fixtures", "models", "constructed.gguf"))
    ap.add_argument("--out", default=None, help="checkpoint directory (default: TARGET without .gguf + -dlm)")
    ap.add_argument("--seed", type=int, default=20261123)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seq", type=int, default=384, help="training sequence length")
    ap.add_argument("--n-train", type=int, default=256)
    ap.add_argument("--n-eval", type=int, default=32)
    a = ap.parse_args(argv)
    out = a.out or (a.target[:-5] if a.target.endswith(".gguf") else a.target) + "-dlm"
    torch.set_num_threads(2)
    torch.manual_seed(a.seed)
    t0 = time.time()
    log = lambda m: print("[%6.1fs] %s" % (time.time() - t0, m), file=sys.stderr)  # noqa: E731

    tgt = Target(a.target)
    vocab = MB.Vocab(a.target)
    n_vocab = tgt.emb.shape[0]
    gen = TextGen(vocab, a.seed)
    seqs = torch.tensor([gen.sequence(a.seq) for _ in range(a.n_train + a.n_eval)], dtype=torch.long)
    used = set(MB.used_tokens(vocab)) | {vocab.index[p] for p in MB.ONEHOT_PIECES} | set(seqs.flatten().tolist())
    draft_ids = sorted(used)
    log("target %s: %d sequences of %d tokens, draft vocabulary %d of %d"
        % (a.target, len(seqs), a.seq, len(draft_ids), n_vocab))

    # teacher: log-probs over the draft vocabulary, and the mass it leaves out
    hs_all, teach, outside, top_full = [], [], [], []
    out_w = tgt.emb[torch.tensor(draft_ids)]
    for i in range(0, len(seqs), 8):
        hs, xn = tgt.forward(seqs[i:i + 8])
        hs_all.append(hs)
        full = xn @ tgt.emb.T                                   # [b, T, V]
        lse = torch.logsumexp(full, -1, keepdim=True)
        sub = xn @ out_w.T
        teach.append(torch.log_softmax(sub, -1))
        outside.append(1 - torch.exp(torch.logsumexp(sub, -1, keepdim=True) - lse).squeeze(-1))
        top_full.append(full.argmax(-1))
    hs_all = [torch.cat([h[l] for h in hs_all]) for l in range(tgt.n_layer)]
    teach = torch.cat(teach)
    outside = torch.cat(outside)
    top_full = torch.cat(top_full)
    log("teacher done: mean probability outside the draft vocabulary %.2e" % float(outside.mean()))

    # residual scales seen by the head's RMSNorms
    emb, h3 = draft_inputs(tgt, seqs[:8], [h[:8] for h in hs_all])
    s_e = float(torch.sqrt(torch.tensor(H) / (emb * emb).sum(-1)).mean())
    f = h3[..., H:2 * H].clone()
    f[..., OUT_BLK:OUT_BLK + D] = 0
    s_h = float(torch.sqrt(torch.tensor(H) / ((f * f).sum(-1) + 1e-9))[:, 1:].mean())
    log("RMSNorm factors: embedding %.3f, fused states %.3f" % (s_e, s_h))
    model = Draft(tgt, draft_ids, (s_e, s_h), a.seed)

    ev = slice(a.n_train, a.n_train + a.n_eval)

    def agreement():
        with torch.no_grad():
            emb, h3 = draft_inputs(tgt, seqs[ev], [h[ev] for h in hs_all])
            logits = model(emb, h3)
            pred = torch.tensor(draft_ids)[logits.argmax(-1)]
            kl = (teach[ev].exp() * (teach[ev] - torch.log_softmax(logits, -1))).sum(-1).mean()
            return float((pred == top_full[ev]).float().mean()), float(kl)

    agree0, kl0 = agreement()
    log("constructed draft, before training: top-1 agreement with the target %.4f, KL %.4f" % (agree0, kl0))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=2e-3)
    g = torch.Generator().manual_seed(a.seed + 1)
    B = 4
    for step in range(a.steps):
        idx = torch.randint(0, a.n_train, (B,), generator=g)
        emb, h3 = draft_inputs(tgt, seqs[idx], [h[idx] for h in hs_all])
        logits = model(emb, h3)
        lp = torch.log_softmax(logits, -1)
        loss = (teach[idx].exp() * (teach[idx] - lp)).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == a.steps - 1:
            log("step %4d  KL %.4f" % (step, float(loss)))
    agree1, kl1 = agreement()
    log("distilled draft: top-1 agreement with the target %.4f, KL %.4f (held-out, %d x %d tokens)"
        % (agree1, kl1, a.n_eval, a.seq))
    info = {"producer": "tools/make_constructed_dlm.py", "seed": a.seed, "steps": a.steps, "train_sequences": a.n_train,
            "sequence_length": a.seq, "heldout_top1_agreement_constructed": round(agree0, 4),
            "heldout_top1_agreement_distilled": round(agree1, 4), "heldout_kl_distilled": round(kl1, 4)}
    save(out, model, draft_ids, n_vocab, info)
    log("wrote %s" % out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
