#!/usr/bin/python3
"""reference.py — independent float64 torch forward pass for GGUF llama/qwen2/qwen3/qwen3moe/phi3/smollm3/mistral3/gemma3/deepseek2/gpt-oss.

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
  * phi3: NEOX over rope.dimension_count dims (may be < head_dim), Q/K/V fused
    in attn_qkv.weight and gate/up fused in ffn_up.weight (gate first);
    LongRoPE: rope_factors_long.weight when the context exceeds
    rope.scaling.original_context_length, else rope_factors_short.weight
    (no rope.scaling.type key), cos/sin scaled by rope.scaling.attn_factor.
  * smollm3: normal RoPE, none on layers l with (l + 1) % 4 == 0 (NoPE).
  * mistral3: normal RoPE, YaRN with rope.scaling.yarn_log_multiplier, and
    q *= 1 + attention.temperature_scale * ln(floor(pos / orig_ctx) + 1)
    after RoPE (Llama 4's attention temperature tuning).
  * rope.scaling.type yarn (any arch): YaRN (Peng et al. 2023), the ramp and
    magnitude described in load_config's rope_tables.
  * gemma3 (Gemma 3 technical report; HF Gemma3ForCausalLM): NEOX RoPE; the
    embedding is multiplied by sqrt(n_embd); RMSNorm weights are stored with
    Gemma's "+1" already added by the converter (so a plain RMSNorm); per-head
    q/k RMSNorm before RoPE; post_attention_norm / post_ffw_norm on each
    sub-block's output before the residual add; FFN gate through GELU (tanh
    approximation).  Local (sliding-window) layers: with
    gemma3.attention.sliding_window = W, layer l is local unless
    l % pattern == pattern - 1 (attention.sliding_window_pattern, default 6;
    as an array, one bool per layer, true for local);
    a local query at position t sees keys at positions (t - W, t] and rotates
    with rope.freq_base_swa (default 10000) without scaling, while global
    layers use rope.freq_base with the file's linear scaling.  The attention
    scale is 1/sqrt(head_dim) except for the 62-layer 27B
    (1/sqrt(n_embd / n_head)); an optional final_logit_softcapping c gives
    logits = c * tanh(logits / c).
  * gpt-oss (OpenAI's gpt-oss model card and the HF GptOssForCausalLM
    modeling code): NEOX RoPE with the file's YaRN on every layer; q/k/v and
    attention output biases; per head a learned sink logit
    (attn_sinks.weight) appended to that head's scores before the softmax
    and dropped after it (so it takes probability mass but has no value);
    layers alternate sliding-window (even l, window attention.sliding_window,
    pattern 2) and full attention; post_attention_norm.weight is the FFN's
    input RMSNorm (HF's post_attention_layernorm); every FFN a mixture of
    experts: router logits with a bias, the top expert_used_count by logit,
    weights softmax(those logits), expert FFN with biases
    gate = min(x W_g + b_g, 7), up = clamp(x W_u + b_u, -7, 7),
    out = ((up + 1) * gate * sigmoid(1.702 gate)) W_d + b_d.  YaRN's
    correction range is rounded to whole dims (floor / ceil) as the GGUF
    convention does; the HF config's "truncate": false is not a GGUF key.
  * deepseek2 (DeepSeek-V2 paper, Section 2; HF modeling_deepseek.py):
    multi-head latent attention computed in the non-absorbed form (keys and
    values decompressed per head from the latent), normal RoPE on the
    decoupled rope parts, YaRN softmax scale, DeepSeekMoE with shared
    experts after leading_dense_block_count dense layers
    (load_config_deepseek2, forward_deepseek2).
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

NORM_ROPE_ARCHS = {"llama", "smollm3", "mistral3", "deepseek2"}
NEOX_ROPE_ARCHS = {"qwen2", "qwen3", "qwen3moe", "phi3", "gemma3", "gpt-oss"}


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
    # RoPE scaling as llama.cpp reads a GGUF: a missing type with a factor
    # means linear; attn_factor multiplies the cos/sin magnitude; YaRN's
    # ramp weight (ext_factor) defaults to 1 for yarn and 0 otherwise
    stype = k("rope.scaling.type")
    c.scale_factor = float(k("rope.scaling.factor", 0.0))
    if stype is None:
        stype = "linear" if c.scale_factor not in (0.0, 1.0) else "none"
    if stype == "llama3":
        stype = "none"  # its scaling is the rope_freqs.weight tensor
    if stype not in ("none", "linear", "yarn", "longrope"):
        raise SystemExit("reference.py: unsupported rope scaling %r" % stype)
    c.scaling = stype
    c.orig_ctx = int(k("rope.scaling.original_context_length", c.n_ctx_train))
    c.attn_factor = float(k("rope.scaling.attn_factor", 1.0))
    c.ext_factor = float(k("rope.scaling.yarn_ext_factor", -1.0))
    if c.ext_factor < 0:
        c.ext_factor = 1.0 if stype == "yarn" else 0.0
    c.beta_fast = float(k("rope.scaling.yarn_beta_fast", 32.0))
    c.beta_slow = float(k("rope.scaling.yarn_beta_slow", 1.0))
    c.log_mul = float(k("rope.scaling.yarn_log_multiplier", 0.0))
    c.freq_scale = 1.0 if stype == "none" or c.scale_factor <= 0 else 1.0 / c.scale_factor
    c.nope_every = 4 if arch == "smollm3" else 0
    c.temp_scale = float(k("attention.temperature_scale", 0.0)) if arch == "mistral3" else 0.0
    c.neox = arch in NEOX_ROPE_ARCHS
    c.gemma = arch == "gemma3"
    c.embd_scale = c.gemma  # x * sqrt(n_embd)
    c.gelu = c.gemma        # GELU (tanh) gate instead of SiLU
    c.gptoss = arch == "gpt-oss"
    c.n_swa = int(k("attention.sliding_window", 0)) if c.gemma or c.gptoss else 0
    # a period, or gguf-py's per-layer form: a list of bools, true for a local layer
    pat = k("attention.sliding_window_pattern", 2 if c.gptoss else 6)
    if isinstance(pat, list):
        if len(pat) != c.n_layer:
            raise SystemExit("reference.py: sliding_window_pattern has %d entries for %d layers" % (len(pat), c.n_layer))
        c.swa_pattern = [bool(v) for v in pat]
    else:
        c.swa_pattern = int(pat)
    c.freq_base_swa = float(k("rope.freq_base_swa", 10000.0))
    c.softcap = float(k("final_logit_softcapping", 0.0)) if c.gemma else 0.0
    c.attn_scale = 1.0 / math.sqrt(c.head_dim)
    if c.gemma and c.n_layer == 62:
        c.attn_scale = 1.0 / math.sqrt(c.n_embd // c.n_head)
    # mixture of experts (qwen3moe): softmax router, top expert_used_count,
    # the kept weights renormalised to sum 1 (Qwen3-MoE's norm_topk_prob)
    c.n_expert = int(k("expert_count", 0))
    c.n_expert_used = int(k("expert_used_count", 0))
    c.yarn_mscale = 1.0  # HF's rope_scaling.mscale (the cos/sin magnitude's numerator)
    if arch == "deepseek2":
        load_config_deepseek2(c, k)
    return c


def load_config_deepseek2(c, k):
    """DeepSeek-V2 (HF modeling_deepseek.py, DeepseekV2Attention / MoE) as a
    GGUF states it.  The latent head sizes: kv_lora_rank (c), rope key
    qk_rope = rope.dimension_count, key_length_mla = qk_nope + qk_rope and
    value_length_mla = v_head_dim per decompressed head.  The converter stores
    0.1 * mscale_all_dim as yarn_log_multiplier; HF's softmax scale is
    qk_head_dim^-0.5 * g(mscale_all_dim)^2 and its cos/sin magnitude
    g(mscale) / g(mscale_all_dim), with mscale not in the file: llama.cpp
    takes mscale = mscale_all_dim (so 1), as every published V2 config has.
    Routing: softmax, top-k, renormalised when expert_weights_norm, times
    expert_weights_scale (HF scales only unnormalised weights; the published
    configs do not normalise, so the two agree); shared experts added."""
    c.kv_lora = int(k("attention.kv_lora_rank"))
    c.q_lora = int(k("attention.q_lora_rank", 0))
    if k("attention.key_length_mla") is not None:
        c.qk_nope = int(k("attention.key_length_mla")) - c.n_rot
        c.v_head = int(k("attention.value_length_mla"))
    else:  # the older converter: fused attn_kv_b, key/value_length of the decompressed heads
        c.qk_nope = c.head_dim - c.n_rot
        c.v_head = c.head_dim_v
    c.n_dense_lead = int(k("leading_dense_block_count", 0))
    c.n_shared = int(k("expert_shared_count", 0))
    c.w_scale = float(k("expert_weights_scale", 0.0))
    c.w_norm = bool(k("expert_weights_norm", False))
    if c.log_mul:
        c.log_mul /= 0.1
        c.yarn_mscale = c.log_mul
    s = 1.0 / c.freq_scale
    g = 1.0 if (s <= 1 or c.ext_factor == 0) else 0.1 * c.log_mul * math.log(s) + 1.0
    c.attn_scale = g * g / math.sqrt(c.qk_nope + c.n_rot)


def is_local(c, l):
    """Whether layer l is a sliding-window layer."""
    if c.n_swa <= 0:
        return False
    if isinstance(c.swa_pattern, list):
        return c.swa_pattern[l]
    return c.swa_pattern == 0 or l % c.swa_pattern < c.swa_pattern - 1


class Model:
    def __init__(self, path, emulate=None, n_ctx=None):
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
        for l in range(c.n_layer):  # fused tensors (phi3) into the separate ones
            p = "blk.%d." % l
            qkv = self.w.pop(p + "attn_qkv.weight", None)
            if qkv is not None:
                qd, kd = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
                assert qkv.shape[0] == qd + 2 * kd, "attn_qkv rows"
                for nm, part in zip(("attn_q", "attn_k", "attn_v"), (qkv[:qd], qkv[qd:qd + kd], qkv[qd + kd:])):
                    self.w[p + nm + ".weight"] = part
                    self.wtypes[p + nm + ".weight"] = self.wtypes[p + "attn_qkv.weight"]
            if p + "ffn_gate.weight" not in self.w and p + "ffn_up.weight" in self.w:  # phi3: ffn_up = [gate; up]
                gu = self.w[p + "ffn_up.weight"]
                assert gu.shape[0] == 2 * c.n_ff, "fused ffn_up must have 2 n_ff rows"
                self.w[p + "ffn_gate.weight"], self.w[p + "ffn_up.weight"] = gu[:c.n_ff], gu[c.n_ff:]
                self.wtypes[p + "ffn_gate.weight"] = self.wtypes[p + "ffn_up.weight"]
        self.set_context(n_ctx if n_ctx else min(c.n_ctx_train, 4096))

    def set_context(self, n_ctx):
        """RoPE tables of a context of n_ctx positions: LongRoPE picks its long
        factors when n_ctx exceeds the original context (by context size, not
        per position), like the engine and llama.cpp."""
        c = self.c
        self.n_ctx = n_ctx
        ff = self.w.get("rope_freqs.weight")
        if ff is None:
            ff = self.w.get("rope_factors_long.weight" if n_ctx > c.orig_ctx else "rope_factors_short.weight")
        i = torch.arange(c.n_rot // 2, dtype=DT)
        theta = c.freq_base ** (-2.0 * i / c.n_rot)
        if ff is not None:
            assert ff.numel() == c.n_rot // 2, "frequency factors must have n_rot/2 entries"
            theta = theta / ff.reshape(-1)
        self.mscale = c.attn_factor
        if c.ext_factor != 0:
            # YaRN: dims j below `low` keep their frequency (extrapolate), above
            # `high` are divided by the factor (interpolate), linear in between;
            # the boundaries are where a dim turns beta_fast / beta_slow times
            # over the original context:  d(r) = n_rot ln(orig / (2 pi r)) / (2 ln base)
            def d(r):
                return c.n_rot * math.log(c.orig_ctx / (r * 2 * math.pi)) / (2 * math.log(c.freq_base))
            low = max(0.0, math.floor(d(c.beta_fast)))
            high = min(c.n_rot - 1.0, math.ceil(d(c.beta_slow)))
            y = ((i - low) / max(0.001, high - low)).clamp(0, 1)
            mix = (1 - y) * c.ext_factor
            inv = theta * c.freq_scale * (1 - mix) + theta * mix
            s = 1.0 / c.freq_scale

            def g(m):  # the YaRN paper's sqrt(1/t) = 0.1 m ln(s) + 1
                return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0
            self.mscale *= g(c.yarn_mscale) / g(c.log_mul) if c.log_mul else g(c.yarn_mscale)
        else:
            inv = theta * c.freq_scale
        self.inv_freq = inv
        # local layers: their own base, neither scaled nor divided by rope_freqs
        self.inv_freq_swa = c.freq_base_swa ** (-2.0 * i / c.n_rot)

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

    def rope(self, x, pos, inv_freq=None):
        """x: [T, H, D]; rotate the first n_rot dims of each head."""
        c = self.c
        local = inv_freq is not None  # local layers: their own base, no scaling, no attn_factor
        inv = self.inv_freq if not local else inv_freq
        ms = 1.0 if local else self.mscale
        ang = pos.to(DT)[:, None] * inv[None, :]  # [T, n_rot/2]
        cos = torch.cos(ang)[:, None, :] * ms
        sin = torch.sin(ang)[:, None, :] * ms
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
        if c.arch == "deepseek2":
            return self.forward_deepseek2(tokens)
        toks = torch.tensor(tokens, dtype=torch.long)
        T = len(tokens)
        if T > c.n_ctx_train:
            print("reference.py: warning: %d tokens exceed the training context %d" %
                  (T, c.n_ctx_train), file=sys.stderr)
        pos = torch.arange(T)
        x = self.w["token_embd.weight"][toks]
        if c.embd_scale:
            x = x * math.sqrt(c.n_embd)
        mask = torch.full((T, T), float("-inf"), dtype=DT).triu(1)
        # local layers: key s is visible to query t iff t - W < s <= t
        mask_swa = mask.clone()
        if c.n_swa > 0:
            mask_swa = mask_swa + torch.full((T, T), float("-inf"), dtype=DT).tril(-c.n_swa)
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
            local = is_local(c, l)
            inv = self.inv_freq_swa if local and not c.gptoss else None  # gpt-oss: one RoPE for all layers
            if not (c.nope_every and (l + 1) % c.nope_every == 0):  # smollm3's NoPE layers
                q = self.rope(q, pos, inv)
                k = self.rope(k, pos, inv)
            if c.temp_scale:  # mistral3: attention temperature, after RoPE, on q
                t = torch.log(torch.floor(pos.to(DT) / c.orig_ctx) + 1.0) * c.temp_scale + 1.0
                q = q * t[:, None, None]
            if self.emulate:  # the engine stores K and V in an f16 cache
                k = k.to(torch.float16).to(DT)
                v = v.to(torch.float16).to(DT)
            kh = k.repeat_interleave(group, dim=1)  # query head j uses kv head j // group
            vh = v.repeat_interleave(group, dim=1)
            s = torch.einsum("thd,shd->hts", q, kh) * c.attn_scale + (mask_swa if local else mask)
            if c.gptoss:  # the sink: one more logit per head in the softmax, no value
                sink = self.w[p + "attn_sinks.weight"].reshape(c.n_head, 1, 1).expand(c.n_head, T, 1)
                a = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :T]
            else:
                a = torch.softmax(s, dim=-1)
            o = torch.einsum("hts,shd->thd", a, vh).reshape(T, c.n_head * c.head_dim_v)
            o = self.linear(o, p + "attn_output.weight", p + "attn_output.bias")
            if c.gptoss:  # post_attention_norm is the FFN's input norm
                x = x + o
                x = x + self.moe_gptoss(self.rmsnorm(x, p + "post_attention_norm.weight"), p)
                continue
            if p + "post_attention_norm.weight" in self.w:  # gemma3
                o = self.rmsnorm(o, p + "post_attention_norm.weight")
            x = x + o
            h = self.rmsnorm(x, p + "ffn_norm.weight")
            if p + "ffn_gate_inp.weight" in self.w:
                x = x + self.moe(h, p)
                continue
            g = self.linear(h, p + "ffn_gate.weight")
            u = self.linear(h, p + "ffn_up.weight")
            act = torch.nn.functional.gelu(g, approximate="tanh") if c.gelu else torch.nn.functional.silu(g)
            f = self.linear(act * u, p + "ffn_down.weight")
            if p + "post_ffw_norm.weight" in self.w:  # gemma3
                f = self.rmsnorm(f, p + "post_ffw_norm.weight")
            x = x + f
        x = self.rmsnorm(x, "output_norm.weight")
        logits = self.linear(x, "output.weight")
        if c.softcap > 0:
            logits = c.softcap * torch.tanh(logits / c.softcap)
        return logits

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

    def forward_deepseek2(self, tokens):
        """DeepSeek-V2 in the paper's (non-absorbed) form: every head's keys
        and values decompressed from the latent with kv_b, as HF's
        DeepseekV2Attention computes them.  attn_k_b holds W_UK per head
        transposed ([n_head, kv_lora, qk_nope] here) and attn_v_b W_UV
        ([n_head, v_head, kv_lora]): the converter's split of kv_b_proj."""
        c = self.c
        toks = torch.tensor(tokens, dtype=torch.long)
        T = len(tokens)
        pos = torch.arange(T)
        x = self.w["token_embd.weight"][toks]
        mask = torch.full((T, T), float("-inf"), dtype=DT).triu(1)
        H, nope, rope, R = c.n_head, c.qk_nope, c.n_rot, c.kv_lora
        for l in range(c.n_layer):
            p = "blk.%d." % l
            h = self.rmsnorm(x, p + "attn_norm.weight")
            if c.q_lora:
                q = self.linear(self.rmsnorm(self.linear(h, p + "attn_q_a.weight"), p + "attn_q_a_norm.weight"),
                                p + "attn_q_b.weight")
            else:
                q = self.linear(h, p + "attn_q.weight")
            q = q.view(T, H, nope + rope)
            q_nope, q_pe = q[..., :nope], q[..., nope:]
            ckv = self.linear(h, p + "attn_kv_a_mqa.weight")  # [T, R + rope]
            lat = self.rmsnorm(ckv[:, :R], p + "attn_kv_a_norm.weight")
            k_pe = self.rope(ckv[:, None, R:], pos)  # one rope key shared by the heads
            q_pe = self.rope(q_pe, pos)
            if self.emulate:  # the engine stores the latent and the rope key in an f16 cache
                lat = lat.to(torch.float16).to(DT)
                k_pe = k_pe.to(torch.float16).to(DT)
            kvb = self.w.get(p + "attn_kv_b.weight")  # the older fused form: per head W_UK_h rows, then W_UV_h
            if kvb is not None:
                kvb = kvb.reshape(H, nope + c.v_head, R)
                wk, wv = kvb[:, :nope, :].transpose(1, 2), kvb[:, nope:, :]
            else:
                wk = self.w[p + "attn_k_b.weight"].reshape(H, R, nope)   # W_UK_h^T
                wv = self.w[p + "attn_v_b.weight"].reshape(H, c.v_head, R)  # W_UV_h
            k_nope = torch.einsum("tr,hrd->thd", lat, wk)          # kv_b: decompressed keys
            v = torch.einsum("tr,hvr->thv", lat, wv)               # and values
            k = torch.cat([k_nope, k_pe.expand(T, H, rope)], dim=-1)
            qf = torch.cat([q_nope, q_pe], dim=-1)
            s = torch.einsum("thd,shd->hts", qf, k) * c.attn_scale + mask
            a = torch.softmax(s, dim=-1)
            o = torch.einsum("hts,shv->thv", a, v).reshape(T, H * c.v_head)
            x = x + self.linear(o, p + "attn_output.weight")
            h = self.rmsnorm(x, p + "ffn_norm.weight")
            if l < c.n_dense_lead:
                g = self.linear(h, p + "ffn_gate.weight")
                u = self.linear(h, p + "ffn_up.weight")
                x = x + self.linear(torch.nn.functional.silu(g) * u, p + "ffn_down.weight")
                continue
            x = x + self.moe_deepseek2(h, p)
        x = self.rmsnorm(x, "output_norm.weight")
        return self.linear(x, "output.weight")

    def moe_deepseek2(self, h, p):
        """DeepseekV2MoE: softmax gate, greedy top-k, (renormalised when the
        file says so,) times the weights scale; plus the shared experts
        (one SwiGLU of n_shared x n_ff_exp) on every row."""
        c = self.c
        logits = self.linear(h, p + "ffn_gate_inp.weight")
        probs = torch.softmax(logits, dim=-1)
        w, sel = torch.topk(probs, c.n_expert_used, dim=-1)
        if c.n_expert_used < c.n_expert:
            top = torch.topk(logits, c.n_expert_used + 1, dim=-1).values
            self.route_margin = min(self.route_margin, float((top[:, -2] - top[:, -1]).min()))
        if c.w_norm and self.moe_norm:
            w = w / w.sum(-1, keepdim=True)
        if c.w_scale:
            w = w * c.w_scale
        gate, up, down = (self.w[p + "ffn_%s_exps.weight" % n] for n in ("gate", "up", "down"))
        out = torch.zeros_like(h)
        for t in range(h.shape[0]):
            for j in range(c.n_expert_used):
                e = int(sel[t, j])
                xr = h[t:t + 1]
                y = torch.nn.functional.silu(xr @ gate[e].T) * (xr @ up[e].T)
                out[t] += w[t, j] * (y @ down[e].T)[0]
        if p + "ffn_gate_shexp.weight" in self.w:
            g = self.linear(h, p + "ffn_gate_shexp.weight")
            u = self.linear(h, p + "ffn_up_shexp.weight")
            out = out + self.linear(torch.nn.functional.silu(g) * u, p + "ffn_down_shexp.weight")
        return out

    def moe_gptoss(self, h, p):
        """gpt-oss's expert FFN of rows h [T, n_embd] (see the notes above)."""
        c = self.c
        logits = self.linear(h, p + "ffn_gate_inp.weight", p + "ffn_gate_inp.bias")
        top, sel = torch.topk(logits, c.n_expert_used, dim=-1)
        if c.n_expert_used < c.n_expert:
            t1 = torch.topk(logits, c.n_expert_used + 1, dim=-1).values
            self.route_margin = min(self.route_margin, float((t1[:, -2] - t1[:, -1]).min()))
        w = torch.softmax(top, dim=-1)
        gate, up, down = (self.w[p + "ffn_%s_exps.weight" % n] for n in ("gate", "up", "down"))
        bg, bu, bd = (self.w[p + "ffn_%s_exps.bias" % n] for n in ("gate", "up", "down"))
        alpha, limit = 1.702, 7.0
        out = torch.zeros_like(h)
        for t in range(h.shape[0]):
            for j in range(c.n_expert_used):
                e = int(sel[t, j])
                x = h[t:t + 1]
                if self.emulate:
                    x = emulate_activation(x, self.wtypes[p + "ffn_gate_exps.weight"])
                g = (x @ gate[e].T + bg[e]).clamp(max=limit)
                u = (x @ up[e].T + bu[e]).clamp(-limit, limit)
                y = (u + 1) * g * torch.sigmoid(alpha * g)
                if self.emulate:
                    y = emulate_activation(y, self.wtypes[p + "ffn_down_exps.weight"])
                out[t] += w[t, j] * (y @ down[e].T + bd[e])[0]
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
    if wtype in (G.GGML_Q8_0, G.GGML_Q4_0, G.GGML_MXFP4):
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
    ap.add_argument("--n-ctx", type=int, default=0,
                    help="context size (LongRoPE's short/long choice; default min(trained, 4096))")
    ap.add_argument("--against", action="append", default=[], metavar="FILE",
                    help="an engine's greedy continuation (text, as kvsieve run or llama-completion print it): "
                         "report the first step where it leaves the reference's, with that step's top-2 margin "
                         "(repeatable)")
    ap.add_argument("--emulate", action="store_true",
                    help="round activations/KV like the C engine (error-budget estimation)")
    a = ap.parse_args(argv)
    m = Model(a.model, emulate="engine" if a.emulate else None, n_ctx=a.n_ctx or None)
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
    # Where an engine's text leaves the reference's: the first step whose
    # decoded continuation is no longer a prefix of the engine's text (both
    # decoded from the same prompt, so the prompt's text cancels).
    for path in a.against:
        if spm_vocab(m.r) is None:
            raise SystemExit("reference.py: --against needs a SentencePiece vocabulary")
        with open(path, encoding="utf-8", errors="replace") as f:
            eng = f.read().rstrip()
        base = spm_decode(m.r, prompt)
        step = None
        for i in range(len(ids)):
            cont = spm_decode(m.r, prompt + ids[:i + 1])[len(base):].rstrip()
            if not eng.startswith(cont):
                step = i
                break
        if step is None:
            print("against %s: agrees for all %d steps" % (path, len(ids)))
        else:
            print("against %s: leaves the reference at step %d (0-based), reference top-2 margin %.4g there" %
                  (path, step, margins[step]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
