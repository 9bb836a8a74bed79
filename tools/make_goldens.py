#!/usr/bin/python3
"""make_goldens.py — write tests/golden/<name>.bin from the independent reference.

    /usr/bin/python3 tools/make_goldens.py [--cli build-ref/kvsieve] [--only NAME,...]
                                           [--estimate] [--list]
    /usr/bin/python3 tools/make_goldens.py --bundled-tokens

Each golden holds a prompt, the reference's teacher-forced logits for the last
n_logit_rows prompt positions, and its greedy continuation with the top-2
margin of every step (format: docs/REFERENCE.md).  Models come from either the
test fixtures (real models) or `kvsieve gen-model` (random weights of a real
model's shape; byte-reproducible, so the FNV-1a hash in each golden detects
drift in the generator).

--estimate also runs the reference with the engine's roundings emulated
(8-bit activations for quantized weights, f16 KV cache) and prints the errors
that emulation causes: the basis of the tolerances in tests/test_golden.c.
"""
import argparse
import os
import struct
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import gguf_reader as G  # noqa: E402
import reference as R  # noqa: E402

FIXTURES = os.path.join(ROOT, "tests", "fixtures")
GOLDEN_DIR = os.path.join(ROOT, "tests", "golden")
SPM_VOCAB = "tokenizer/ggml-vocab-llama-spm.gguf"
# "The quick brown fox jumps" with BOS, in the llama SPM vocabulary
PROMPT_HEAD = [1, 450, 4996, 17354, 1701, 29916, 432, 17204]
GEN_TOKENS = 64      # prompt length of generated models
LLAMA3_TOKENS = 128  # longer for tiny-llama3: rope_freqs only matter at larger positions
GEN_GREEDY = 16
# For weight types the engine computes without rounding activations (f32, f16,
# bf16; and for real models), the greedy continuation is compared token for
# token, so the prompt is chosen such that every greedy step's top-2 margin
# exceeds EXACT_MARGIN = 3 x the max-abs logit tolerance of those types in
# tests/test_golden.c (2e-2).
EXACT_TYPES = ("f32", "f16", "bf16")
EXACT_MARGIN = 0.06
# MoE models route each row to its top-k experts: a discontinuity.  The
# engine's own roundings (bf16 prefill attention on AVX-512 BF16 hosts moves
# router logits by ~1e-3) flip a route whose k-th and (k+1)-th router logits
# are closer than that, and a flipped route moves that row's output by O(1).
# So for MoE models the prompt is also chosen such that every route of the
# prompt and of the greedy continuation has a gap above ROUTE_MARGIN (4x
# the 0.0018 gap the bf16 attention flipped on the first prompt tried; with
# 128 routes in 64 tokens of tiny-qwen3moe the smallest gap of a random
# prompt is rarely above 0.01).
ROUTE_MARGIN = 0.008

SHAPES = ["tiny-llama", "tiny-llama3", "tiny-qwen2", "tiny-qwen3", "tiny-qwen3moe", "tiny-mistral", "tiny-mha",
          "tiny-mqa", "tiny-phi3", "tiny-qwen3-yarn", "tiny-smollm3", "tiny-mistral3", "tiny-gemma3",
          "tiny-deepseek2", "tiny-deepseek2-qlora"]
TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q6_k"]


def gen_prompt(n, candidate=0):
    """PROMPT_HEAD followed by deterministic pseudo-random ids in [500, 31500)."""
    ids = list(PROMPT_HEAD)
    k = 0
    while len(ids) < n:
        ids.append((7919 * k + 104729 * candidate + 17) % 31000 + 500)
        k += 1
    return ids[:n]


def matrix():
    """(name, source dict, prompt spec, n_greedy, n_logit_rows or None for all)."""
    out = [("aidreams260K", {"fixture": "models/aidreams260K.gguf", "type": "f32"},
            ("text", "Once upon a time"), 40, None),
           # the bundled trained model (repository path, not a fixture), on a natural prompt
           ("kvsieve-default", {"bundled": "models/kvsieve-default.gguf", "type": "q8_0"},
            ("text", "And God said unto Moses,"), 40, None)]
    # every architecture in f16 (tight tolerance, so that architectural details
    # such as rope mode, biases, q/k norm and rope_freqs are resolved) ...
    for shape in SHAPES:
        n = LLAMA3_TOKENS if shape == "tiny-llama3" else GEN_TOKENS
        out.append(("%s-f16" % shape, {"shape": shape, "type": "f16", "vocab": SPM_VOCAB},
                    ("gen", n), GEN_GREEDY, 2))
    # ... and tiny-llama in every other weight type (one logit row suffices
    # for the kernels; f32 keeps two)
    for t in TYPES:
        if t == "f16":
            continue
        out.append(("tiny-llama-%s" % t, {"shape": "tiny-llama", "type": t, "vocab": SPM_VOCAB},
                    ("gen", GEN_TOKENS), GEN_GREEDY, 2 if t == "f32" else 1))
    # latent attention in a quantized type too (its per-head k_b / v_b views
    # and the 576-dim latent head through the 8-bit activation path)
    out.append(("tiny-deepseek2-f32", {"shape": "tiny-deepseek2", "type": "f32", "vocab": SPM_VOCAB},
                ("gen", GEN_TOKENS), GEN_GREEDY, 2))
    out.append(("tiny-deepseek2-q8_0", {"shape": "tiny-deepseek2", "type": "q8_0", "vocab": SPM_VOCAB},
                ("gen", GEN_TOKENS), GEN_GREEDY, 1))
    # gpt-oss: f32 (its sinks, biases, clamped SwiGLU and routing alone) and the
    # published files' weight layout (experts MXFP4, the other matrices Q8_0);
    # 32 prompt tokens (twice the window) and 8 greedy steps: 4 of 8 experts in
    # each of 4 layers give so many top-k boundaries that longer runs never
    # kept every route ROUTE_MARGIN clear in 20 candidates
    for t in ("f32", "mxfp4"):
        out.append(("tiny-gptoss-%s" % t, {"shape": "tiny-gptoss", "type": t, "vocab": SPM_VOCAB},
                    ("gen", 32), 8, 2))
    return out


def source_string(src):
    keys = ["fixture", "bundled", "shape", "type", "vocab"]
    return " ".join("%s=%s" % (k, src[k]) for k in keys if k in src)


def default_cli():
    for p in ("build-ref/kvsieve", "build-gguf/kvsieve", "build/kvsieve"):
        q = os.path.join(ROOT, p)
        if os.path.exists(q):
            return q
    return os.path.join(ROOT, "build-ref", "kvsieve")


def model_path(name, src, cli, scratch):
    if "fixture" in src:
        return os.path.join(FIXTURES, src["fixture"])
    if "bundled" in src:
        return os.path.join(ROOT, src["bundled"])
    os.makedirs(scratch, exist_ok=True)
    out = os.path.join(scratch, name + ".gguf")
    cmd = [cli, "gen-model", "--shape", src["shape"], "--type", src["type"],
           "--vocab-from", os.path.join(FIXTURES, src["vocab"]), "--out", out]
    print("  $", " ".join(cmd))
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


def write_golden(path, tokens, n_vocab, model_hash, source, rows, greedy, margins):
    src = source.encode("ascii")
    with open(path, "wb") as f:
        f.write(b"KSGL")
        f.write(struct.pack("<IIIIQII", 1, len(tokens), n_vocab, len(greedy), model_hash,
                            rows.shape[0], len(src)))
        f.write(src)
        f.write(np.asarray(tokens, "<i4").tobytes())
        f.write(np.ascontiguousarray(rows, "<f4").tobytes())
        f.write(np.asarray(greedy, "<i4").tobytes())
        f.write(np.asarray(margins, "<f4").tobytes())


def read_golden(path):
    with open(path, "rb") as f:
        b = f.read()
    if b[:4] != b"KSGL":
        raise ValueError("bad magic")
    ver, nt, nv, ng, h, nr, ns = struct.unpack_from("<IIIIQII", b, 4)
    o = 4 + struct.calcsize("<IIIIQII")
    src = b[o:o + ns].decode()
    o += ns
    toks = np.frombuffer(b, "<i4", nt, o); o += 4 * nt
    rows = np.frombuffer(b, "<f4", nr * nv, o).reshape(nr, nv); o += 4 * nr * nv
    greedy = np.frombuffer(b, "<i4", ng, o); o += 4 * ng
    marg = np.frombuffer(b, "<f4", ng, o); o += 4 * ng
    assert o == len(b), "trailing bytes"
    return dict(version=ver, hash=h, source=src, tokens=toks, rows=rows, greedy=greedy,
                margins=marg, n_vocab=nv)


def nerr(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b)), float(np.abs(a - b).max())


def sensitivity(m, tokens, rows):
    """nerr of deliberately broken variants of the reference vs the reference:
    a golden can only catch a bug whose nerr is well above its tolerance."""
    n = rows.shape[0]
    res = []

    def run():
        return nerr(m.forward(tokens).to(torch.float32).numpy()[-n:], rows)[0]
    m.c.neox = not m.c.neox
    res.append(("wrong-rope-mode", run()))
    m.c.neox = not m.c.neox
    if "rope_freqs.weight" in m.w:
        inv = m.inv_freq
        i = torch.arange(m.c.n_rot // 2, dtype=torch.float64)
        m.inv_freq = m.c.freq_base ** (-2.0 * i / m.c.n_rot)
        res.append(("no-rope_freqs", run()))
        m.inv_freq = inv
    for key in ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_q_norm.weight",
                "attn_k_norm.weight"):
        saved = {k: v for k, v in m.w.items() if k.endswith(key)}
        if saved:
            for k in saved:
                del m.w[k]
            res.append(("no-" + key, run()))
            m.w.update(saved)
    if m.c.gemma:  # gemma3: each feature off in turn
        c = m.c
        for name, attr, off in (("no-sliding-window", "n_swa", 0), ("silu-for-gelu", "gelu", False),
                                ("no-embedding-scale", "embd_scale", False)):
            saved = getattr(c, attr)
            setattr(c, attr, off)
            res.append((name, run()))
            setattr(c, attr, saved)
        inv, inv_swa = m.inv_freq, m.inv_freq_swa
        m.inv_freq_swa = inv
        res.append(("local-rope-base-global", run()))
        m.inv_freq_swa = inv_swa
        m.inv_freq = inv * c.freq_scale ** -1
        res.append(("no-linear-scaling", run()))
        m.inv_freq = inv
        for key in ("post_attention_norm.weight", "post_ffw_norm.weight"):
            saved = {k: v for k, v in m.w.items() if k.endswith(key)}
            for k in saved:
                del m.w[k]
            res.append(("no-" + key, run()))
            m.w.update(saved)
    if m.c.n_expert:  # MoE: the kept experts' softmax weights not renormalised
        m.moe_norm = False
        res.append(("moe-no-renorm", run()))
        m.moe_norm = True
    if m.c.n_head_kv != m.c.n_head:  # GQA: wrong head grouping (kv head j % n_kv)
        orig = torch.Tensor.repeat_interleave

        def wrong(t, r, dim=None):
            return t.repeat(1, r, 1) if dim == 1 else orig(t, r, dim=dim)
        torch.Tensor.repeat_interleave = wrong
        try:
            res.append(("gqa-modulo-grouping", run()))
        finally:
            torch.Tensor.repeat_interleave = orig
    print("  sensitivity (nerr of broken variants): " +
          "  ".join("%s %.3g" % r for r in res))


def write_bundled_tokens(out_dir):
    """Reference ids of the bundled model's tokenizer (SentencePiece itself, from the
    model's training workdir) for every llama-spm test input, one line of ids per
    input as in llama.cpp's test-tokenizer-0 .out files; tests/test_tokenizer.c
    checks kvsieve's encoding of the GGUF vocabulary against them."""
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=os.path.join(ROOT, "models", "train", "tok.model"))
    with open(os.path.join(FIXTURES, SPM_VOCAB + ".inp"), encoding="utf-8") as f:
        texts = f.read().split("\n__ggml_vocab_test__\n")[:-1]
    out = os.path.join(out_dir, "kvsieve-default.tokens.out")
    with open(out, "w") as f:
        for t in texts:
            f.write(" ".join(str(i) for i in sp.encode(t)) + "\n")
    print("wrote %s: %d inputs" % (out, len(texts)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cli", default=default_cli(), help="kvsieve CLI with gen-model")
    ap.add_argument("--scratch", default=os.path.join(ROOT, "build-ref", "golden_models"))
    ap.add_argument("--out-dir", default=GOLDEN_DIR)
    ap.add_argument("--only", help="comma-separated golden names")
    ap.add_argument("--estimate", action="store_true", help="print emulated engine errors")
    ap.add_argument("--sensitivity", action="store_true",
                    help="print how far deliberately wrong variants (rope mode, rope_freqs, "
                         "biases, q/k norm) land from the reference")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--bundled-tokens", action="store_true",
                    help="write the bundled tokenizer's reference ids (tests/golden/kvsieve-default.tokens.out)")
    a = ap.parse_args()
    only = set(a.only.split(",")) if a.only else None
    os.makedirs(a.out_dir, exist_ok=True)
    if a.bundled_tokens:
        write_bundled_tokens(a.out_dir)
        return 0
    total = 0
    for name, src, prompt_spec, n_greedy, n_rows in matrix():
        if a.list:
            print(name, source_string(src))
            continue
        if only and name not in only:
            continue
        print("[%s] %s" % (name, source_string(src)))
        path = model_path(name, src, a.cli, a.scratch)
        h = G.fnv1a64_file(path)
        m = R.Model(path)
        exact = src["type"] in EXACT_TYPES
        for cand in range(20):
            if prompt_spec[0] == "text":
                tokens = R.spm_encode(m.r, prompt_spec[1])
            else:
                tokens = gen_prompt(prompt_spec[1], cand)
            m.route_margin = float("inf")
            if m.c.n_expert and prompt_spec[0] != "text":
                m.forward(tokens)  # the prompt's routes first: cheaper than the greedy run
                if m.route_margin <= ROUTE_MARGIN:
                    print("  prompt candidate %d: route margin %.3g too small, next" % (cand, m.route_margin))
                    continue
            greedy, margins = m.greedy(tokens, n_greedy)
            if m.route_margin <= ROUTE_MARGIN and prompt_spec[0] != "text":
                print("  prompt candidate %d: route margin %.3g too small, next" % (cand, m.route_margin))
                continue
            if not exact or min(margins) > EXACT_MARGIN or prompt_spec[0] == "text":
                break
            print("  prompt candidate %d: min margin %.3g too small, next" % (cand, min(margins)))
        else:
            if m.c.n_expert and m.route_margin <= ROUTE_MARGIN:
                raise SystemExit("%s: no prompt candidate keeps its routes clear of ties" % name)
        if exact and min(margins) <= EXACT_MARGIN:
            print("  WARNING: greedy margin %.3g <= %.3g: token-for-token check may be flaky"
                  % (min(margins), EXACT_MARGIN))
        logits = m.forward(tokens).numpy()
        rows = logits if n_rows is None else logits[-n_rows:]
        assert greedy[0] == int(np.argmax(logits[-1]))
        out = os.path.join(a.out_dir, name + ".bin")
        write_golden(out, tokens, m.n_vocab, h, source_string(src), rows.astype(np.float32),
                     greedy, margins)
        g = read_golden(out)  # round-trip check
        assert np.array_equal(g["rows"], rows.astype(np.float32)) and list(g["greedy"]) == greedy
        size = os.path.getsize(out)
        total += size
        print("  hash %016x  %d tokens, %d logit rows x %d, greedy %d, min margin %.3g, %d bytes"
              % (h, len(tokens), rows.shape[0], m.n_vocab, n_greedy, min(margins), size))
        if m.c.n_expert:
            print("  min route margin %.3g" % m.route_margin)
        print("  greedy:", ",".join(map(str, greedy)))
        if R.spm_vocab(m.r) is not None and ("fixture" in src or "bundled" in src):
            print("  text: %r" % R.spm_decode(m.r, tokens + greedy))
        if a.estimate:
            e = R.Model(path, emulate="engine")
            el = e.forward(tokens).to(torch.float32).numpy()
            er = el if n_rows is None else el[-n_rows:]
            nm, mx = nerr(er, rows)
            eg, _ = e.greedy(tokens, n_greedy)
            agree = sum(1 for x, y in zip(eg, greedy) if x == y)
            first = next((i for i, (x, y) in enumerate(zip(eg, greedy)) if x != y), None)
            print("  emulated engine: nerr %.3g  max abs %.3g  logit std %.3g  greedy agree %d/%d"
                  " (first diff %s)" % (nm, mx, float(rows.std()), agree, n_greedy, first))
        if a.sensitivity:
            sensitivity(m, tokens, rows)
    if not a.list:
        print("total golden bytes written: %d" % total)
    return 0


if __name__ == "__main__":
    sys.exit(main())
