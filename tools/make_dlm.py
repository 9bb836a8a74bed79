#!/usr/bin/python3
"""make_dlm.py — distil the bundled model's EAGLE-3 draft model (DLM) from the trained target.

    /usr/bin/python3 tools/make_dlm.py [--target models/kvsieve-default.gguf]
        [--out models/kvsieve-default-dlm-paper] [--workdir models/train] [--steps N] [--resume]
    /usr/bin/python3 tools/make_dlm.py --report [--lengths 8192] ...
    /usr/bin/python3 tools/make_dlm.py --target ANY.gguf --text FILE... [--out ANY-dlm] [--steps N] [--resume]

--text trains a draft for any llama-architecture GGUF (any quantisation
gguf_reader.py dequantises: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K) on the
user's own text: the files are tokenized by `kvsieve tokenize` with the
GGUF's own vocabulary, the target's shape, RoPE base and norm epsilon come
from its metadata, and the draft takes EAGLE-3's shape for it (the target's
width, heads and MLP; aux layers [2, L/2, L-3]; the most frequent tokens of
the text as its vocabulary, --draft-vocab).  Same objective, checkpoint and
--resume / --max-minutes / --device as below; no report (the held-out
measurements need the bundled corpus).  Ignored there: llama3 RoPE
frequency factors (rope_freqs), which change the target's low frequencies
slightly, and attention biases (llama GGUFs have none).

SpeContext (Section 4) selects each decode step's KV entries with the attention
of a distilled language model (DLM): an EAGLE-3 draft of the target, pruned to
its retrieval head.  Its premise is that a draft trained only to predict the
target's next token comes to attend where the target attends.  To test that
premise nothing here is constructed: every tensor is initialised as EAGLE-3's
draft is (normal(0, 0.02) linear weights, unit norms) and trained only by
EAGLE-3's objective (EAGLE-3: Scaling up Inference Acceleration of Large
Language Models via Training-Time Test, Section 3): next-token distillation
from the target, with training-time test (the draft's own output states fed
back as its input for TTT_STEPS steps).  Only the token embedding is shared
with the target (frozen), as in EAGLE-3.

Shape (EAGLE-3): fc over the concatenated residual streams of three target
layers (low, middle, high: entering layers AUX), hidden_norm on the fused
state, input_layernorm on the token embedding, one decoder layer whose q/k/v
read both ([e(tok_t); hidden_norm(fc(h_{t-1}))], 2H wide), a SwiGLU MLP, a
final norm and an LM head over the DRAFT_VOCAB most frequent target tokens
(d2t / t2d).  Heads: 4 query / 2 KV heads, one draft KV head per target KV
head, so the retrieval head's selection maps one to one.  RoPE: NeoX pairs
(HF llama), base ROPE_THETA; trained at SEQ tokens, longer contexts through
YaRN (training-free; kvsieve composes it at load time, see src/draft/eagle3.c).

--attn-weight W (not the paper's recipe: a documented deviation) adds W x
KL(target attention || the retrieval head's attention) at sampled query
positions, half of them where the target reads furthest back, with the
target's attention reduced over its layers by the element-wise max (spec
selects once for all layers).  It tests whether spec works when its premise
is made to hold rather than hoped for.  --attn-seq trains that term on longer
sequences than the TTT objective (which keeps the first SEQ tokens), so the
head needs no YaRN up to that length.

--report measures, on held-out sequences the training never saw:
  * top-1 agreement of the draft with the target, and the mean accepted
    length of a chain of up to 4 drafted tokens along the target's own greedy
    output (speculative decoding);
  * the retrieval head's attention recall: the share of the target's
    attention mass (per layer and KV head, averaged) that falls inside the
    head's top-B selection, at B = 2%, 6% and 12% of the context, next to
    Quest's page bounds (page 32), the previous step's exact top-B and this
    step's exact top-B (the most any B entries can cover), per layer and
    averaged.
"""
import argparse
import json
import math
import os
import random
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import train_model as TM  # noqa: E402
from safetensors_writer import eagle3_vocab_maps, read_safetensors, write_safetensors  # noqa: E402

H = TM.N_EMBD
HQ, HKV, HD = 4, 2, 64
N_FF = TM.N_FF
AUX = [1, 3, 5]          # residual streams entering target layers 1, L/2, L-1 (low, middle, high); see configure
DRAFT_VOCAB = 2048
ROPE_THETA = TM.ROPE_BASE
SEQ = 2048
TTT_STEPS = 3
MAX_POS = SEQ
ATTN_BLOCK = 512        # query block of the draft's training attention


def configure(target_path):
    """Take the target's shape from its GGUF: the draft's width and MLP follow
    the target's, its aux layers are low, middle and high (1, L/2, L-1)."""
    global H, N_FF, AUX, HQ, HKV
    TM.set_shape_from_gguf(target_path)
    # one draft KV head per target KV head (spec reads the draft's attention per KV head),
    # two query heads each: 4 / 2 for the 2-KV-head targets, 8 / 4 for gpu-large's
    HKV = TM.N_KV_HEAD
    HQ = 2 * HKV
    H, N_FF = TM.N_EMBD, TM.N_FF
    AUX = [1, TM.N_LAYER // 2, TM.N_LAYER - 1]


def configure_any(target_path, draft_vocab_max):
    """Any llama GGUF: the target's shape from its metadata, EAGLE-3's draft
    shape for it.  Returns the GGUF reader (the output matrix, if untied)."""
    global H, N_FF, AUX, HQ, HKV, HD, ROPE_THETA, DRAFT_VOCAB
    import gguf_reader as G
    r = G.GGUFReader(target_path)
    arch = str(r.kv.get("general.architecture", "?"))
    if arch != "llama":
        raise SystemExit("make_dlm.py --text: %s is a '%s' model; only the llama architecture is supported" % (target_path, arch))
    kv = lambda k, d=None: r.kv[k] if k in r.kv else d  # noqa: E731
    n_embd, n_head = int(kv("llama.embedding_length")), int(kv("llama.attention.head_count"))
    TM.set_shape(n_embd, int(kv("llama.block_count")), n_head, int(kv("llama.attention.head_count_kv", n_head)),
                 int(kv("llama.feed_forward_length")))
    TM.N_VOCAB = int(r.tensors["token_embd.weight"].ne[1])  # GGUF lists dims innermost first
    TM.ROPE_BASE = float(kv("llama.rope.freq_base", 10000.0))
    TM.EPS = float(kv("llama.attention.layer_norm_rms_epsilon", 1e-5))
    H, N_FF = TM.N_EMBD, TM.N_FF
    HQ, HKV, HD = TM.N_HEAD, TM.N_KV_HEAD, TM.HEAD_DIM
    L = TM.N_LAYER
    AUX = sorted([2, L // 2, L - 3] if L >= 4 else [0, L // 2, L - 1])
    ROPE_THETA = TM.ROPE_BASE
    DRAFT_VOCAB = min(TM.N_VOCAB, draft_vocab_max)
    return r


class TextStream:
    """Random windows of T + 1 tokens from the user's text (as TM.Stream.batch returns them)."""

    def __init__(self, ids, seed):
        self.ids = np.asarray(ids, dtype=np.int64)
        self.r = random.Random(seed)

    def batch(self, torch, n, T):
        if len(self.ids) < T + 2:
            raise SystemExit("make_dlm.py --text: the text has %d tokens; a training sequence needs %d" % (len(self.ids), T + 2))
        starts = [self.r.randrange(len(self.ids) - T - 1) for _ in range(n)]
        return torch.from_numpy(np.stack([self.ids[s:s + T + 1] for s in starts])), None

    def state(self):
        return self.r.getstate()

    def set_state(self, st):
        self.r.setstate(st)


def tokenize_files(kvsieve, target, files, log):
    import subprocess
    ids = []
    for f in files:
        out = subprocess.run([kvsieve, "tokenize", "-m", target, "-f", f], check=True, capture_output=True, text=True).stdout
        got = [int(x) for x in out.split()]
        log("%s: %d tokens" % (f, len(got)))
        ids += got
    return ids


def build_draft(torch, n_vocab):
    nn, F = torch.nn, torch.nn.functional
    RMSNorm = TM.rmsnorm_class(torch)

    class Draft(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3 * H, H, bias=False)
            self.hidden_norm = RMSNorm(H)
            self.input_layernorm = RMSNorm(H)
            self.q_proj = nn.Linear(2 * H, HQ * HD, bias=False)
            self.k_proj = nn.Linear(2 * H, HKV * HD, bias=False)
            self.v_proj = nn.Linear(2 * H, HKV * HD, bias=False)
            self.o_proj = nn.Linear(HQ * HD, H, bias=False)
            self.post_attention_layernorm = RMSNorm(H)
            self.gate_proj = nn.Linear(H, N_FF, bias=False)
            self.up_proj = nn.Linear(H, N_FF, bias=False)
            self.down_proj = nn.Linear(N_FF, H, bias=False)
            self.norm = RMSNorm(H)
            self.lm_head = nn.Linear(H, DRAFT_VOCAB, bias=False)
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, std=0.02)
            inv = ROPE_THETA ** (-torch.arange(0, HD, 2, dtype=torch.float64) / HD)
            self.register_buffer("inv_freq", inv, persistent=False)
            self.mscale = 1.0
            self.max_pos = MAX_POS   # positions the draft's RoPE was trained to (config's max_position_embeddings)

        def reset_rope(self):
            """Plain RoPE again after set_yarn."""
            self.inv_freq = ROPE_THETA ** (-torch.arange(0, HD, 2, dtype=torch.float64) / HD)
            self.mscale = 1.0

        def set_yarn(self, factor, orig=None, beta_fast=32.0, beta_slow=1.0):
            """HF transformers' YaRN (_compute_yarn_parameters), training-free."""
            orig = orig or self.max_pos
            base = ROPE_THETA
            pos_freq = base ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD)
            inter, extra = 1.0 / (factor * pos_freq), 1.0 / pos_freq

            def dim(rot):
                return (HD * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))
            lo = max(math.floor(dim(beta_fast)), 0)
            hi = min(math.ceil(dim(beta_slow)), HD - 1)
            if lo == hi:
                hi += 0.001
            ramp = ((torch.arange(HD // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
            extra_w = 1 - ramp
            self.inv_freq = inter * (1 - extra_w) + extra * extra_w
            self.mscale = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0

        def rope(self, x, pos):
            """x [B][T][h][HD], NeoX pairs (j, j + HD/2); pos [T] float64 positions."""
            ang = pos[:, None] * self.inv_freq[None, :]
            c = (ang.cos() * self.mscale).float()[None, :, None, :]
            s = (ang.sin() * self.mscale).float()[None, :, None, :]
            a, b = x[..., :HD // 2].float(), x[..., HD // 2:].float()
            return torch.cat([a * c - b * s, b * c + a * s], -1).type_as(x)

        def qkv(self, emb, hid, pos):
            x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hid)], -1)
            B, T, _ = x.shape
            q = self.rope(self.q_proj(x).view(B, T, HQ, HD), pos)
            k = self.rope(self.k_proj(x).view(B, T, HKV, HD), pos)
            v = self.v_proj(x).view(B, T, HKV, HD)
            return q, k, v

        def step(self, emb, hid, pos, cache):
            """One TTT step.  emb, hid [B][T][H]; cache: (k, v) of earlier steps.
            The query at position t attends causally over step 0's keys and to the
            diagonal key (position t) of every later step, as EAGLE-3 trains it.
            Returns (the draft's output state [B][T][H], logits [B][T][DRAFT_VOCAB])."""
            B, T, _ = emb.shape
            q, k, v = self.qkv(emb, hid, pos)
            cache.append((k, v))
            g = HQ // HKV
            scale = 1.0 / math.sqrt(HD)
            qh = q.transpose(1, 2) * scale                                    # [B][HQ][T][HD]
            k0 = cache[0][0].transpose(1, 2).repeat_interleave(g, 1)
            v0 = cache[0][1].transpose(1, 2).repeat_interleave(g, 1)
            kd = [kv[0].transpose(1, 2).repeat_interleave(g, 1) for kv in cache[1:]]
            vd = [kv[1].transpose(1, 2).repeat_interleave(g, 1) for kv in cache[1:]]
            mask = torch.full((T, T), float("-inf"), device=emb.device).triu(1)
            outs = []
            for a in range(0, T, ATTN_BLOCK):   # query blocks: the masked triangle is never computed
                b = min(T, a + ATTN_BLOCK)
                qa = qh[:, :, a:b]
                s0 = qa @ k0[:, :, :b].transpose(-1, -2) + mask[a:b, :b].to(qa.dtype)   # [B][HQ][b-a][b]
                diag = [(qa * kj[:, :, a:b]).sum(-1, keepdim=True) for kj in kd]         # [B][HQ][b-a][1]
                # softmax in the activations' dtype (bf16 under autocast: Debian torch's fast kernel)
                p = torch.softmax(torch.cat([s0] + diag, -1), -1)
                oa = p[..., :b] @ v0[:, :, :b]
                for i, vj in enumerate(vd):
                    oa = oa + p[..., b + i:b + i + 1] * vj[:, :, a:b]
                outs.append(oa)
            o = torch.cat(outs, 2)
            o = o.transpose(1, 2).reshape(B, T, HQ * HD)
            r = hid + self.o_proj(o)
            h2 = self.post_attention_layernorm(r)
            r = r + self.down_proj(F.silu(self.gate_proj(h2)) * self.up_proj(h2))
            return r, self.lm_head(self.norm(r))

    return Draft()


def load_target(torch, path, reader=None):
    tgt = TM.build_model(torch)
    TM.load_gguf_into(torch, tgt, path)
    if reader is not None and "output.weight" in reader.tensors:  # untied output matrix
        out_w = torch.from_numpy(np.asarray(reader.dequantize("output.weight"), dtype=np.float32).copy()).reshape(TM.N_VOCAB, -1)
        tgt.register_buffer("out_w", out_w, persistent=False)
        plain = tgt.forward

        def forward(ids, checkpoint=False, hidden=False):
            _, hs = plain(ids, checkpoint, True)
            logits = hs[-1] @ tgt.out_w.t().to(hs[-1].dtype)
            return (logits, hs) if hidden else logits
        tgt.forward = forward
    tgt = tgt.to(TM.DEVICE)
    tgt.eval()
    for p in tgt.parameters():
        p.requires_grad_(False)
    return tgt


def fused_states(torch, hs):
    """The residual streams entering the AUX layers, concatenated and shifted
    so that position t holds those of t-1 (zeros at t = 0): EAGLE's input."""
    h3 = torch.cat([hs[a].float() for a in AUX], -1)
    return torch.cat([torch.zeros_like(h3[:, :1]), h3[:, :-1]], 1)


def target_pass(torch, tgt, ids, states=False):
    """Teacher: logits [B][T][V] and the fused aux states, shifted so that
    position t holds the states of t-1 (zeros at t = 0): EAGLE's input;
    with states, also every layer's input residual stream."""
    with torch.no_grad(), torch.autocast(TM.DEVICE, dtype=torch.bfloat16):
        logits, hs = tgt(ids, hidden=True)
    h3 = fused_states(torch, hs)
    return (logits.float(), h3, hs) if states else (logits.float(), h3)


def draft_vocab(sp, stream, torch, n_seq=64, T=2048):
    counts = np.zeros(TM.N_VOCAB, dtype=np.int64)
    X, _ = stream.batch(torch, n_seq, T)
    np.add.at(counts, X.numpy().ravel(), 1)
    ids = np.argsort(-counts, kind="stable")[:DRAFT_VOCAB]
    return np.sort(ids)


def ttt_loss(torch, draft, tgt_emb, ids, logits_t, h3, d_ids, steps=TTT_STEPS):
    """EAGLE-3 objective: at TTT step j, position t takes token t+j and (for
    j > 0) the draft's own state of step j-1, and learns the target's
    distribution at t+j restricted to the draft vocabulary."""
    B, T = ids.shape
    teacher = torch.log_softmax(logits_t[..., d_ids], -1)                  # [B][T][Vd]
    fc = draft.fc(h3)
    hid, cache, loss, accs = fc, [], 0.0, []
    for j in range(steps):
        n = T - j
        tok = ids[:, j:]
        emb = tgt_emb[tok]
        pos = torch.arange(j, T, dtype=torch.float64, device=ids.device)
        if j > 0:
            hid = hid[:, :n]
            cache = [(k[:, :n], v[:, :n]) for k, v in cache]
        out, lg = draft.step(emb, hid, pos, cache)
        lp = torch.log_softmax(lg.float(), -1)
        tp = teacher[:, j:]
        loss = loss + (tp.exp() * (tp - lp)).sum(-1).mean()
        accs.append(float((lg.argmax(-1) == tp.argmax(-1)).float().mean()))
        hid = out
    return loss / steps, accs


def layer_attention(torch, tgt, hs, qpos):
    """Per layer, from its input residual stream hs[layer] [B][T][H]: (p, k, q)
    with p the target's attention of the query positions qpos, averaged over
    the query heads of each KV head (rows sum to 1) [B][HKV][Q][T]; k its keys
    after RoPE [B][T][HKV][D]; q its queries after RoPE at qpos [B][HQ][Q][D]
    (query head h belongs to KV head h // group)."""
    B, T, _ = hs[0].shape
    dev = hs[0].device
    qpos = torch.as_tensor(qpos, device=dev)
    pos = torch.arange(T, dtype=torch.float64, device=dev)
    ang = (pos[:, None] * tgt.inv_freq.double()[None, :]).float()
    cos, sin = ang.cos(), ang.sin()
    future = torch.arange(T, device=dev)[None, None, None, :] > qpos[None, None, :, None]
    out = []
    with torch.no_grad():
        for li, b in enumerate(tgt.blocks):
            h = b.attn_norm(hs[li].float())
            q = rope_adj(torch, b.wq(h).view(B, T, TM.N_HEAD, TM.HEAD_DIM), cos, sin)
            k = rope_adj(torch, b.wk(h).view(B, T, TM.N_KV_HEAD, TM.HEAD_DIM), cos, sin)
            qs = q[:, qpos].transpose(1, 2)                                   # [B][H][Q][D]
            kk = k.transpose(1, 2).repeat_interleave(TM.N_HEAD // TM.N_KV_HEAD, 1)
            s = ((qs @ kk.transpose(-1, -2)) / math.sqrt(TM.HEAD_DIM)).masked_fill(future, float("-inf"))
            p = torch.softmax(s, -1).view(B, TM.N_KV_HEAD, TM.N_HEAD // TM.N_KV_HEAD, len(qpos), T).mean(2)
            out.append((p, k, qs))
    return out


def target_probs(torch, tgt, hs, qpos, reduce="max"):
    """The target's attention at query positions qpos [Q], averaged over the
    query heads of each KV head, then the element-wise max (reduce="max") or
    the mean ("mean") over layers, renormalised: [B][HKV][Q][T], rows
    summing to 1 over t <= qpos.  spec selects once per step for all layers,
    so an entry any layer needs must be selected: the max keeps a needle
    that one layer reads (0.4-0.5 of layer 5's mass at a passkey's digits)
    as a peak, where the mean over six layers would flatten it."""
    acc = None
    for p, _, _ in layer_attention(torch, tgt, hs, qpos):
        acc = p if acc is None else (torch.maximum(acc, p) if reduce == "max" else acc + p)
    return acc / acc.sum(-1, keepdim=True)


def attention_loss(torch, draft, tgt_emb, ids, h3, p_tgt, qpos):
    """KL(target attention || the retrieval head's attention) at qpos: the
    head's probabilities are averaged over the query heads of each KV head,
    as the target's are.  The head's q / k are TTT step 0's (what spec runs)."""
    B, T = ids.shape
    q, k, _ = draft.qkv(tgt_emb[ids], draft.fc(h3), torch.arange(T, dtype=torch.float64, device=ids.device))
    qs = q[:, qpos].transpose(1, 2).float()                                   # [B][HQ][Q][HD]
    kk = k.transpose(1, 2).float().repeat_interleave(HQ // HKV, 1)
    s = (qs @ kk.transpose(-1, -2)) / math.sqrt(HD)
    future = torch.arange(T, device=ids.device)[None, None, None, :] > qpos[None, None, :, None]
    p = torch.softmax(s.masked_fill(future, float("-inf")), -1).view(B, HKV, HQ // HKV, len(qpos), T).mean(2)
    lp = torch.log(p.clamp_min(1e-30))
    return (p_tgt * (torch.log(p_tgt.clamp_min(1e-30)) - lp)).sum(-1).mean()


# safetensors name (EAGLE-3's checkpoint layout) -> the Draft's parameter
_ST_NAMES = {"fc.weight": "fc.weight", "midlayer.hidden_norm.weight": "hidden_norm.weight",
             "midlayer.input_layernorm.weight": "input_layernorm.weight",
             "midlayer.self_attn.q_proj.weight": "q_proj.weight", "midlayer.self_attn.k_proj.weight": "k_proj.weight",
             "midlayer.self_attn.v_proj.weight": "v_proj.weight", "midlayer.self_attn.o_proj.weight": "o_proj.weight",
             "midlayer.post_attention_layernorm.weight": "post_attention_layernorm.weight",
             "midlayer.mlp.gate_proj.weight": "gate_proj.weight", "midlayer.mlp.up_proj.weight": "up_proj.weight",
             "midlayer.mlp.down_proj.weight": "down_proj.weight", "norm.weight": "norm.weight",
             "lm_head.weight": "lm_head.weight"}


def save_dlm(out, draft, d_ids, info):
    os.makedirs(out, exist_ok=True)
    f16 = lambda t: (t.detach().float().numpy().astype("<f2"), "F16")  # noqa: E731
    f32 = lambda t: (t.detach().float().numpy().astype("<f4"), "F32")  # noqa: E731
    sd = draft.state_dict()
    tensors = {
        **{st: (f32 if "norm" in st else f16)(sd[attr]) for st, attr in _ST_NAMES.items()},  # norms stay f32
        **eagle3_vocab_maps(d_ids, TM.N_VOCAB),
    }
    write_safetensors(os.path.join(out, "model.safetensors"), dict(sorted(tensors.items())),
                      {"format": "pt", "producer": "kvsieve tools/make_dlm.py"})
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": H, "target_hidden_size": H, "num_attention_heads": HQ, "num_key_value_heads": HKV,
        "head_dim": HD, "intermediate_size": N_FF, "num_hidden_layers": 1, "vocab_size": TM.N_VOCAB,
        "draft_vocab_size": DRAFT_VOCAB, "rms_norm_eps": TM.EPS, "rope_theta": ROPE_THETA,
        "rope_scaling": None, "max_position_embeddings": draft.max_pos,
        "eagle_aux_hidden_state_layer_ids": AUX, "tie_word_embeddings": False, "torch_dtype": "float16",
        "kvsieve": info,
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


def load_dlm(torch, out):
    """The draft as save_dlm wrote it (the f16 weights kvsieve runs) -> (draft, draft vocabulary ids)."""
    t = read_safetensors(os.path.join(out, "model.safetensors"))
    draft = build_draft(torch, TM.N_VOCAB)
    draft.load_state_dict({_ST_NAMES[k]: torch.from_numpy(t[k].astype(np.float32)) for k in _ST_NAMES})
    d_ids = np.nonzero(t["t2d"])[0]
    with open(os.path.join(out, "config.json")) as f:
        draft.max_pos = json.load(f).get("max_position_embeddings", MAX_POS)
    assert np.array_equal(d_ids - np.arange(len(d_ids)), t["d2t"]), "d2t and t2d disagree"
    return draft, d_ids


# ----------------------------------------------------------------- report --
def heldout_stream(corpus, sp, seed):
    """Task and natural-text sequences from the held-out documents, with a seed the training never used."""
    st = TM.Stream(sp, corpus, seed)
    st.src = TM.TextSource(corpus, "heldout", st.r)
    return st


def target_attention(torch, tgt, ids, queries):
    """The target run over ids: (layer_attention's per-layer (p, k, q) at the
    query positions, the residual streams entering each layer)."""
    with torch.no_grad():
        _, hs = tgt(ids, hidden=True)
    return layer_attention(torch, tgt, hs, queries), hs


def rope_adj(torch, x, cos, sin):
    x2 = x.float().view(*x.shape[:-1], x.shape[-1] // 2, 2)
    a, b = x2[..., 0], x2[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)


def recall_of(p, sel_scores, B_sel, qpos):
    """p [B][HKV][Q][T] target mass; sel_scores same shape (higher = selected)."""
    import torch
    T = p.shape[-1]
    valid = torch.arange(T)[None, None, None, :] <= torch.tensor(qpos)[None, None, :, None]
    sc = sel_scores.masked_fill(~valid, float("-inf"))
    top = sc.topk(B_sel, dim=-1).indices
    return float(torch.gather(p, -1, top).sum(-1).mean())


def report(torch, tgt, draft, d_ids, sp, corpus, lengths, seed, log, n_seq=2, n_q=16):
    res = {}
    stream = heldout_stream(corpus, sp, seed)
    for L in lengths:
        factor = max(1.0, L / draft.max_pos)
        draft.set_yarn(factor) if factor > 1 else None
        X, _ = stream.batch(torch, n_seq, L)
        ids = X[:, :L]
        qpos = list(range(L - n_q, L))
        att, hs = target_attention(torch, tgt, ids, qpos + [q - 1 for q in qpos[:1]])
        # the retrieval head: the draft's step-0 attention at the same positions
        h3 = fused_states(torch, hs)
        with torch.no_grad():
            q, k, _ = draft.qkv(tgt.tok.weight[ids], draft.fc(h3), torch.arange(L, dtype=torch.float64))
            qs = q[:, qpos].transpose(1, 2)                                   # [B][HQ][Q][HD]
            kk = k.transpose(1, 2).repeat_interleave(HQ // HKV, 1)
            ds = (qs @ kk.transpose(-1, -2) / math.sqrt(HD)).view(n_seq, HKV, HQ // HKV, n_q, L)
            ds = torch.softmax(ds.masked_fill(torch.arange(L)[None, None, None, None, :] >
                                              torch.tensor(qpos)[None, None, None, :, None], float("-inf")),
                               -1).max(2).values                         # as p_spec.c: max over the group
        row = {}
        for frac in (0.02, 0.06, 0.12):
            Bsel = max(1, int(round(frac * L)))
            r_head, r_quest, r_prev, r_exact = [], [], [], []
            for li, (p, kfull, qfull) in enumerate(att):
                pq = p[:, :, :n_q]
                r_head.append(recall_of(pq, ds, Bsel, qpos))
                # previous step's exact top-B: the target's attention one position earlier
                prev = torch.cat([p[:, :, n_q:n_q + 1], p[:, :, :n_q - 1]], 2)
                r_prev.append(recall_of(pq, prev, Bsel, qpos))
                # this step's exact top-B: no selection of B entries covers more
                r_exact.append(recall_of(pq, pq, Bsel, qpos))
                # Quest: per page of 32, the upper bound sum_d max(q_d k_min_d, q_d k_max_d)
                P = 32
                kp = kfull.view(n_seq, L // P, P, TM.N_KV_HEAD, TM.HEAD_DIM)
                kmin, kmax = kp.min(2).values, kp.max(2).values                # [B][pages][HKV][D]
                qq = qfull[:, :, :n_q].transpose(1, 2).reshape(
                    n_seq, n_q, TM.N_KV_HEAD, TM.N_HEAD // TM.N_KV_HEAD, TM.HEAD_DIM)      # [B][Q][HKV][G][D]
                ub = torch.maximum(qq[:, :, None] * kmin[:, None, :, :, None],
                                   qq[:, :, None] * kmax[:, None, :, :, None]).sum(-1).sum(-1)  # [B][Q][pg][HKV]
                tok_sc = ub.permute(0, 3, 1, 2).repeat_interleave(P, -1)        # [B][HKV][Q][T]
                r_quest.append(recall_of(pq, tok_sc, Bsel, qpos))
            rnd = lambda xs: [round(x, 4) for x in xs]  # noqa: E731
            row["%d%%" % round(frac * 100)] = {"retrieval_head": float(np.mean(r_head)),
                                               "quest_pages": float(np.mean(r_quest)),
                                               "previous_step_top_b": float(np.mean(r_prev)),
                                               "exact_top_b": float(np.mean(r_exact)),
                                               "by_layer": {"retrieval_head": rnd(r_head),
                                                            "quest_pages": rnd(r_quest),
                                                            "previous_step_top_b": rnd(r_prev),
                                                            "exact_top_b": rnd(r_exact)}}
            log("recall at %d tokens, B = %d%% (%d): retrieval head %.3f, Quest page bounds %.3f, "
                "previous step's exact top-B %.3f, this step's exact top-B %.3f" % (
                    L, round(frac * 100), Bsel, np.mean(r_head), np.mean(r_quest), np.mean(r_prev),
                    np.mean(r_exact)))
            log("  by layer: retrieval head %s; Quest %s; previous step %s; exact %s" % (
                rnd(r_head), rnd(r_quest), rnd(r_prev), rnd(r_exact)))
        res[str(L)] = row
    draft.reset_rope()
    return res


def acceptance(torch, tgt, draft, d_ids, sp, corpus, seed, log, n_seq=4, T=640, n_gen=128, k=4):
    """Top-1 agreement and the mean accepted length of chains of k drafted tokens along the
    target's own greedy continuation (teacher-forced sequences whose tokens ARE the target's
    argmax, so every accepted draft extends the chain exactly as in speculative decoding)."""
    stream = heldout_stream(corpus, sp, seed + 7)
    X, _ = stream.batch(torch, n_seq, T)
    ids = X[:, :T]
    # replace the last n_gen tokens by the target's greedy continuation, token by token
    half = T - n_gen
    with torch.no_grad():
        for t in range(half, T):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                lg = tgt(ids[:, :t])
            ids[:, t] = lg[:, -1].float().argmax(-1)
        logits_t, h3 = target_pass(torch, tgt, ids)
        d_ids_t = torch.tensor(d_ids)
        tgt_next = logits_t.argmax(-1)                                      # [B][T]
        fc = draft.fc(h3)
        hid, cache, preds = fc, [], []
        for j in range(k):
            n = T - j
            if j > 0:
                hid = hid[:, :n]
                cache = [(kk[:, :n], vv[:, :n]) for kk, vv in cache]
            out, lg = draft.step(tgt.tok.weight[ids[:, j:]], hid, torch.arange(j, T, dtype=torch.float64), cache)
            preds.append(d_ids_t[lg.argmax(-1)])
            hid = out
    agree = float((preds[0][:, half:] == tgt_next[:, half:]).float().mean())
    lens = []
    for t in range(half, T - k):
        for b in range(n_seq):
            a = 0
            while a < k and int(preds[a][b, t]) == int(tgt_next[b, t + a]):
                a += 1
            lens.append(a + 1)  # + the target's own token per verification
    log("draft vs target on held-out greedy continuations: top-1 agreement %.3f, mean accepted length %.2f "
        "(chains of %d)" % (agree, float(np.mean(lens)), k))
    return agree, float(np.mean(lens))


# ------------------------------------------------------------------- main --
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=os.path.join(ROOT, "models", "kvsieve-default.gguf"))
    ap.add_argument("--out", default=None, help="checkpoint directory (default: TARGET without .gguf + -dlm)")
    ap.add_argument("--workdir", default=os.path.join(ROOT, "models", "train"), help="the target's tokenizer")
    ap.add_argument("--cache", default=os.path.join(ROOT, "build"))
    ap.add_argument("--corpus", default=None, metavar="DIR", help="train on tools/build_corpus.py's pack in DIR "
                    "(the gpu-large recipe's corpus) instead of the first corpus")
    ap.add_argument("--seed", type=int, default=20261126)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--report", action="store_true",
                    help="measure the DLM in OUT (no training) and write the figures into its config.json")
    ap.add_argument("--skip-report", action="store_true", help="train and write the DLM without measuring it")
    ap.add_argument("--lengths", default="8192")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (training; the report runs on the CPU)")
    ap.add_argument("--max-minutes", type=float, default=0, help="stop training (with a checkpoint) after M minutes")
    ap.add_argument("--attn-weight", type=float, default=0.0,
                    help="add W x KL(the target's attention || the retrieval head's) to EAGLE-3's objective "
                         "(0: EAGLE-3's objective alone, the paper's recipe)")
    ap.add_argument("--attn-target", default="max", choices=["max", "mean"],
                    help="the target attention the head learns: the max or the mean over layers")
    ap.add_argument("--attn-seq", type=int, default=SEQ,
                    help="sequence length of the attention term (longer than the TTT objective's %d: its first "
                         "%d tokens feed the TTT objective); the draft's RoPE is then trained to this length" % (SEQ, SEQ))
    ap.add_argument("--attn-queries", type=int, default=128, help="query positions per sequence for --attn-weight")
    ap.add_argument("--attn-sample", default="peak", choices=["far", "peak"],
                    help="how half the query positions are picked from the candidates: the most attention mass "
                         "further back than 256 tokens (far), or the largest single weight there (peak: a "
                         "retrieval, where diffuse layers' spread mass does not count)")
    ap.add_argument("--attn-candidates", type=int, default=4, help="candidates per query position (x attn-queries)")
    ap.add_argument("--init-from", default=None, help="start from this DLM directory's weights (fresh optimizer)")
    ap.add_argument("--ckpt", default=None, help="training checkpoint (default: WORKDIR/dlm-ckpt.pt; with --text OUT/ckpt.pt)")
    ap.add_argument("--text", nargs="+", default=None, metavar="FILE",
                    help="train a draft for any llama GGUF (--target) on these text files (see the top of this file)")
    ap.add_argument("--draft-vocab", type=int, default=8192, help="with --text: the draft vocabulary's size (at most)")
    ap.add_argument("--kvsieve", default=os.path.join(ROOT, "build", "kvsieve"), help="with --text: the binary that tokenizes")
    a = ap.parse_args(argv)
    if a.text:
        a.skip_report = True
        if a.report:
            raise SystemExit("make_dlm.py: --report needs the bundled corpus; it does not run with --text")
    if a.device == "cpu" and os.path.exists(TM.TCMALLOC) and TM.TCMALLOC not in os.environ.get("LD_PRELOAD", ""):
        env = dict(os.environ, LD_PRELOAD=TM.TCMALLOC, TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD="100000000000")
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    import torch
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    out = a.out or (a.target[:-5] if a.target.endswith(".gguf") else a.target) + "-dlm"
    if not a.out and a.attn_weight == 0 and os.path.abspath(a.target) == os.path.join(ROOT, "models", "kvsieve-default.gguf"):
        # the bundled model's default draft (MODEL-dlm/) is the attention-aligned one;
        # the paper's recipe alone writes beside it (docs/DLM.md)
        out += "-paper"
    t0 = time.time()
    log = lambda m: print("[%7.1fs] %s" % (time.time() - t0, m), file=sys.stderr, flush=True)  # noqa: E731

    if a.text:
        reader = configure_any(a.target, a.draft_vocab)
        corpus = sp = None
        TM.DEVICE = a.device
        tgt = load_target(torch, a.target, reader)
        stream = TextStream(tokenize_files(a.kvsieve, a.target, a.text, log), a.seed)
        os.makedirs(out, exist_ok=True)
        ck = a.ckpt or os.path.join(out, "ckpt.pt")
        log("target %s: %d layers, hidden %d, %d / %d heads of %d, vocabulary %d, RoPE base %g; aux layers %s" % (
            a.target, TM.N_LAYER, TM.N_EMBD, TM.N_HEAD, TM.N_KV_HEAD, TM.HEAD_DIM, TM.N_VOCAB, TM.ROPE_BASE, AUX))
    else:
        import sentencepiece as spm
        corpus = (TM.read_pack(a.corpus, log, os.path.join(a.workdir, "tok.model")) if a.corpus
                  else TM.build_corpus(a.cache, log))
        sp = spm.SentencePieceProcessor(model_file=os.path.join(a.workdir, "tok.model"))
        configure(a.target)
        TM.DEVICE = "cpu" if a.report else a.device
        tgt = load_target(torch, a.target)
        stream = TM.Stream(sp, corpus, a.seed)
        ck = a.ckpt or os.path.join(a.workdir, "dlm-ckpt.pt")
    step = 0
    if a.report:
        draft, d_ids = load_dlm(torch, out)
        with open(os.path.join(out, "config.json")) as f:
            step = json.load(f)["kvsieve"]["steps"]
        opt_state = None
    elif a.resume:
        st = TM.torch_load(torch, ck)
        draft = build_draft(torch, TM.N_VOCAB)
        draft.load_state_dict(st["draft"])
        d_ids = st["d_ids"]
        step = st["step"]
        stream.set_state(st["data_rng"])
        opt_state = st["opt"]
    elif a.init_from:
        draft, d_ids = load_dlm(torch, a.init_from)
        opt_state = None
    else:
        draft = build_draft(torch, TM.N_VOCAB)
        if a.text:  # the text's most frequent tokens
            counts = np.bincount(stream.ids, minlength=TM.N_VOCAB)
            d_ids = np.sort(np.argsort(-counts, kind="stable")[:DRAFT_VOCAB])
        else:
            d_ids = draft_vocab(sp, stream, torch)
        opt_state = None
    if not a.report and a.attn_weight > 0:
        draft.max_pos = max(draft.max_pos, a.attn_seq)
    draft = draft.to(TM.DEVICE)
    opt = torch.optim.AdamW(draft.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0)
    if opt_state:
        opt.load_state_dict(opt_state)
    d_ids_t = torch.tensor(d_ids, device=TM.DEVICE)
    emb = tgt.tok.weight.detach()
    if a.report:
        log("target %s; measuring the draft in %s (%d steps of training)" % (a.target, out, step))
    else:
        log("target %s; draft vocabulary %d of %d; %d steps of %d x %d tokens, %d TTT steps%s" % (
            a.target, len(d_ids), TM.N_VOCAB, a.steps, a.batch, SEQ, TTT_STEPS,
            "; attention term x %g (%s over layers) over %d tokens" % (a.attn_weight, a.attn_target, a.attn_seq)
            if a.attn_weight > 0 else ""))
    qgen = torch.Generator().manual_seed(a.seed + step)
    last = t_start = time.time()
    step0 = step
    while not a.report and step < a.steps:
        n_tok = a.attn_seq if a.attn_weight > 0 else SEQ
        X, _ = stream.batch(torch, a.batch, n_tok)
        ids = X[:, :n_tok].to(TM.DEVICE)
        if a.attn_weight > 0:
            logits_t, h3, hs = target_pass(torch, tgt, ids, states=True)
            # half the query positions where the target reads furthest back (a
            # question reaching its needle: where spec's selection matters
            # most), half at random, out of attn_candidates x attn_queries
            # random candidates
            cand = (torch.randperm(n_tok - 64, generator=qgen)[:a.attn_candidates * a.attn_queries] + 64
                    ).sort().values.to(TM.DEVICE)
            p_all = target_probs(torch, tgt, hs, cand, a.attn_target)
            far = torch.arange(n_tok, device=TM.DEVICE)[None, :] < (cand[:, None] - 256)
            if a.attn_sample == "far":
                reach = (p_all * far[None, None]).sum(-1).sum(1).sum(0)                 # [candidates]
            else:
                reach = (p_all * far[None, None]).amax(-1).amax(1).amax(0)
            n_far = a.attn_queries // 2
            top = reach.topk(n_far).indices
            rest = torch.ones(len(cand), dtype=torch.bool, device=TM.DEVICE)
            rest[top] = False
            others = rest.nonzero()[:, 0]
            pick = torch.cat([top, others[torch.randperm(len(others), generator=qgen)[:a.attn_queries - n_far]]]).sort().values
            qpos, p_tgt = cand[pick], p_all[:, :, pick]
        else:
            logits_t, h3 = target_pass(torch, tgt, ids)
        lr = 1e-3 * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / a.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast(TM.DEVICE, dtype=torch.bfloat16):
            loss, accs = ttt_loss(torch, draft, emb, ids[:, :SEQ], logits_t[:, :SEQ], h3[:, :SEQ], d_ids_t)
        if a.attn_weight > 0:
            aloss = attention_loss(torch, draft, emb, ids, h3, p_tgt, qpos)
            loss = loss + a.attn_weight * aloss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 20 == 0 or step == a.steps or (a.text and step <= 3):
            log("step %d/%d (%.1f s a step) loss %.4f%s  top-1 agreement by TTT step %s" % (
                step, a.steps, (time.time() - t_start) / max(1, step - step0), loss.item(), "  attention KL %.4f" % aloss.item() if a.attn_weight > 0 else "",
                " ".join("%.3f" % x for x in accs)))
        over = a.max_minutes and time.time() - t_start >= a.max_minutes * 60
        if time.time() - last > 600 or step == a.steps or over:
            torch.save({"draft": draft.state_dict(), "opt": opt.state_dict(), "d_ids": d_ids, "step": step,
                        "data_rng": stream.state()}, ck + ".tmp")
            os.replace(ck + ".tmp", ck)
            last = time.time()
        if over:
            log("stopped at step %d after %.1f minutes" % (step, a.max_minutes))
            break
    if not a.report:
        save_dlm(out, draft.float().cpu(), d_ids,
                 {"producer": "tools/make_dlm.py", "seed": a.seed, "steps": step, "sequence_length": SEQ,
                  "ttt_steps": TTT_STEPS, **({"attention_weight": a.attn_weight, "attention_target": a.attn_target,
                                     "attention_sample": a.attn_sample} if a.attn_weight > 0 else {}),
                  **({"initialised_from": os.path.relpath(a.init_from, ROOT)} if a.init_from else {})})
        if a.skip_report:
            log("wrote %s (not measured: make_dlm.py --report measures it)" % out)
            return 0
        if TM.DEVICE != "cpu":  # the report runs on the CPU
            TM.DEVICE = "cpu"
            tgt = load_target(torch, a.target)
        draft, d_ids = load_dlm(torch, out)
    draft.eval()
    agree, acc_len = acceptance(torch, tgt, draft, d_ids, sp, corpus, a.seed, log)
    rec = report(torch, tgt, draft, d_ids, sp, corpus, [int(x) for x in a.lengths.split(",")], a.seed + 11, log)
    info = {"producer": "tools/make_dlm.py", "seed": a.seed, "steps": step, "sequence_length": SEQ,
            "ttt_steps": TTT_STEPS, **({"attention_weight": a.attn_weight, "attention_target": a.attn_target,
                                     "attention_sample": a.attn_sample} if a.attn_weight > 0 else {}),
            "heldout_top1_agreement": round(agree, 4),
            "heldout_mean_accepted_length": round(acc_len, 3), "attention_recall": rec}
    save_dlm(out, draft, d_ids, info)
    log("wrote %s" % out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
