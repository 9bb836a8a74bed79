#!/usr/bin/python3
"""make_dlm_layouts.py — EAGLE-3 draft checkpoints in exactly the layouts users download.

    /usr/bin/python3 tools/make_dlm_layouts.py [--out tests/fixtures/models/dlm-layouts]

Writes small, seeded EAGLE-3 drafts for a tiny llama target (hidden 64,
4 layers, 4 query / 2 KV heads of 16, the 512-token vocabulary of
tests/fixtures/models/aidreams260K.gguf; tests/test_dlm_layouts.c generates
that target from the same numbers), so the loader is tested on the files
the projects publish rather than on files kvsieve writes itself:

  eagle-bin/      as the EAGLE authors release their drafts (e.g. the
                  EAGLE-3 draft for Llama-3.1-8B-Instruct): pytorch_model.bin
                  written by torch.save(state_dict) with fp16 weights and no
                  embed_tokens (fc, midlayer.*, norm, lm_head, d2t, t2d), and
                  the config.json keys of SafeAILab/EAGLE
                  eagle/traineagle3/config.json: no rope_theta (EAGLE's
                  rotary embedding then uses base 10000) and no aux-layer ids
                  (EAGLE-3's default: the residual streams entering layers
                  2, L/2, L-3).
  eagle-st/       the same tensors, bit for bit, as model.safetensors.
  eagle-sharded/  the same tensors split over pytorch_model-0000N-of-00002.bin
                  with pytorch_model.bin.index.json (how transformers shards
                  a torch checkpoint).
  specforge/      as SpecForge's exporter writes a draft under transformers 5
                  (save_pretrained: model.safetensors, bf16): fc_norm.{0,1,2}
                  (config "fc_norm": true), eagle_config.
                  eagle_aux_hidden_state_layer_ids = [0, 1, 2] (SpecForge /
                  SGLang count *outputs*: the streams entering layers 1, 2, 3),
                  rope_parameters {rope_type default, rope_theta 500000} and no
                  legacy rope_theta key (the exporter's legacy mirror switched
                  off, as SPECFORGE_DISABLE_LEGACY_ROPE_SCALING=1 does).
  reference.json  for each layout, q and k of the retrieval head at one
                  position for fixed fused states and embedding, computed here
                  from each project's published forward (fc_norm per chunk,
                  fc, hidden_norm, input_layernorm, cat(embedding, hidden),
                  q/k_proj, rotate_half RoPE), in float64.
  bad-global.bin  a torch.save whose pickle calls posix.system (what a
                  malicious checkpoint does): must be refused.
  bad-oob.bin     a torch.save of a view whose size was patched to reach
                  past its storage: must be refused.
  tiny.bin        a four-tensor state dict (F16, BF16, I64, BOOL): a fuzz seed.
  tiny-zip64.bin  the same archive with its directory fields in zip64 form.

Needs python3-torch (scripts/deps.sh --reference).  The outputs are
committed (a few hundred KB), so the tests do not need torch.
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from safetensors_writer import write_safetensors  # noqa: E402

# the target (tests/test_dlm_layouts.c builds it with these numbers)
T_EMBD, T_LAYERS, N_HEAD, N_KV, HD, VOCAB = 64, 4, 4, 2, 16, 512
H, INTER, DRAFT_VOCAB = 64, 64, 32
EPS = 1e-5
POS = 37  # the reference position


def weights(torch, seed):
    g = torch.Generator().manual_seed(seed)

    def mat(r, c, s=0.08):
        return (torch.randn(r, c, generator=g) * s).half()

    def norm(n):
        return (1.0 + 0.3 * torch.randn(n, generator=g)).half()

    draft_ids = torch.sort(torch.randperm(VOCAB, generator=g)[:DRAFT_VOCAB]).values
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[draft_ids] = True
    sd = {
        "d2t": (draft_ids - torch.arange(DRAFT_VOCAB)).to(torch.int64),
        "t2d": t2d,
        "midlayer.hidden_norm.weight": norm(H),
        "midlayer.input_layernorm.weight": norm(H),
        "midlayer.self_attn.q_proj.weight": mat(N_HEAD * HD, 2 * H),
        "midlayer.self_attn.k_proj.weight": mat(N_KV * HD, 2 * H),
        "midlayer.self_attn.v_proj.weight": mat(N_KV * HD, 2 * H),
        "midlayer.self_attn.o_proj.weight": mat(H, N_HEAD * HD),
        "midlayer.mlp.gate_proj.weight": mat(INTER, H),
        "midlayer.mlp.up_proj.weight": mat(INTER, H),
        "midlayer.mlp.down_proj.weight": mat(H, INTER),
        "midlayer.post_attention_layernorm.weight": norm(H),
        "fc.weight": mat(H, 3 * T_EMBD, 0.05),
        "norm.weight": norm(H),
        "lm_head.weight": mat(DRAFT_VOCAB, H),
    }
    return sd


def eagle_config():
    # the keys of SafeAILab/EAGLE eagle/traineagle3/config.json, at this size
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
        "hidden_size": H, "initializer_range": 0.02, "intermediate_size": INTER,
        "max_position_embeddings": 2048, "model_type": "llama",
        "num_attention_heads": N_HEAD, "num_key_value_heads": N_KV, "num_hidden_layers": 1,
        "pad_token_id": 0, "rms_norm_eps": EPS, "tie_word_embeddings": False,
        "torch_dtype": "float16", "transformers_version": "4.28.1", "use_cache": True,
        "vocab_size": VOCAB, "draft_vocab_size": DRAFT_VOCAB,
    }


def specforge_config():
    # SpecForge configs/*-eagle3.json keys, saved by transformers 5 (dtype,
    # rope_parameters), with the nested aux ids SpecForge / SGLang read
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 1, "eos_token_id": 2,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]},
        "fc_norm": True, "head_dim": HD, "hidden_act": "silu", "hidden_size": H,
        "initializer_range": 0.02, "intermediate_size": INTER, "max_position_embeddings": 2048,
        "model_type": "llama", "num_attention_heads": N_HEAD, "num_hidden_layers": 1,
        "num_key_value_heads": N_KV, "pad_token_id": 0, "rms_norm_eps": EPS,
        "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
        "tie_word_embeddings": False, "dtype": "bfloat16", "transformers_version": "5.0.0",
        "use_cache": True, "vocab_size": VOCAB, "draft_vocab_size": DRAFT_VOCAB,
    }


def np_of(t):
    import torch
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view("<u2"), "BF16"
    if t.dtype == torch.float16:
        return t.numpy().astype("<f2"), "F16"
    if t.dtype == torch.int64:
        return t.numpy().astype("<i8"), "I64"
    if t.dtype == torch.bool:
        return t.numpy().astype(np.uint8), "BOOL"
    return t.numpy().astype("<f4"), "F32"


def rms(x, w):
    return x / np.sqrt(np.mean(x * x) + EPS) * w


def head_qk(sd, h3, emb, pos, theta, fc_norm):
    f = lambda n: sd[n].float().double().numpy()  # noqa: E731
    if fc_norm:
        h3 = np.concatenate([rms(h3[i * T_EMBD:(i + 1) * T_EMBD], f("fc_norm.%d.weight" % i)) for i in range(3)])
    hid = rms(f("fc.weight") @ h3, f("midlayer.hidden_norm.weight"))
    x = np.concatenate([rms(emb, f("midlayer.input_layernorm.weight")), hid])  # embedding first (cnets.py)
    q = f("midlayer.self_attn.q_proj.weight") @ x
    k = f("midlayer.self_attn.k_proj.weight") @ x
    inv = 1.0 / theta ** (np.arange(0, HD, 2, dtype=np.float64) / HD)
    ang = pos * np.concatenate([inv, inv])
    c, s = np.cos(ang), np.sin(ang)

    def rope(v):
        v = v.reshape(-1, HD)
        rot = np.concatenate([-v[:, HD // 2:], v[:, :HD // 2]], axis=1)  # rotate_half
        return (v * c + rot * s).reshape(-1)
    return rope(q).tolist(), rope(k).tolist()


def to_zip64(blob):
    """The same archive with every 32-bit field a zip64 reader must look
    past saturated: each central directory entry's sizes and local header
    offset move to a zip64 extra field, and the end record's counts and
    offsets to the zip64 end record (torch's writer emits one)."""
    import struct
    eocd = blob.rfind(b"PK\x05\x06")
    n, cd_size, cd_off = struct.unpack("<HII", blob[eocd + 10:eocd + 20])
    body, cd, p = blob[:cd_off], b"", cd_off
    for _ in range(n):
        fixed = bytearray(blob[p:p + 46])
        nl, xl, cl = struct.unpack("<HHH", fixed[28:34])
        csize, usize = struct.unpack("<II", fixed[20:28])
        lho = struct.unpack("<I", fixed[42:46])[0]
        name, comment = blob[p + 46:p + 46 + nl], blob[p + 46 + nl + xl:p + 46 + nl + xl + cl]
        extra = struct.pack("<HHQQQ", 1, 24, usize, csize, lho)
        fixed[20:28] = struct.pack("<II", 0xFFFFFFFF, 0xFFFFFFFF)
        fixed[30:32] = struct.pack("<H", len(extra))
        fixed[42:46] = struct.pack("<I", 0xFFFFFFFF)
        cd += bytes(fixed) + name + extra + comment
        p += 46 + nl + xl + cl
    e64_off = len(body) + len(cd)
    e64 = struct.pack("<IQHHIIQQQQ", 0x06064b50, 44, 45, 45, 0, 0, n, n, len(cd), len(body))
    loc = struct.pack("<IIQI", 0x07064b50, 0, e64_off, 1)
    end = struct.pack("<IHHHHIIH", 0x06054b50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return body + cd + e64 + loc + end


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "models", "dlm-layouts"))
    ap.add_argument("--seed", type=int, default=37)
    a = ap.parse_args()
    import torch
    out = a.out
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    sd = weights(torch, a.seed)

    def write_dir(name, cfg):
        d = os.path.join(out, name)
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
        return d

    # EAGLE's release: torch.save of the state dict
    d = write_dir("eagle-bin", eagle_config())
    torch.save(sd, os.path.join(d, "pytorch_model.bin"))
    d = write_dir("eagle-st", eagle_config())
    write_safetensors(os.path.join(d, "model.safetensors"), {k: np_of(v) for k, v in sorted(sd.items())}, {"format": "pt"})
    d = write_dir("eagle-sharded", eagle_config())
    names = list(sd.keys())
    parts = [names[: len(names) // 2], names[len(names) // 2:]]
    wmap = {}
    for i, part in enumerate(parts):
        fn = "pytorch_model-%05d-of-%05d.bin" % (i + 1, len(parts))
        torch.save({k: sd[k] for k in part}, os.path.join(d, fn))
        wmap.update({k: fn for k in part})
    total = sum(v.numel() * v.element_size() for v in sd.values())
    with open(os.path.join(d, "pytorch_model.bin.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2)
        f.write("\n")

    # SpecForge's export: bf16, fc_norm, no embedding
    g = torch.Generator().manual_seed(a.seed + 1)
    sf = {k: (v.bfloat16() if v.is_floating_point() else v) for k, v in sd.items()}
    for i in range(3):
        sf["fc_norm.%d.weight" % i] = (1.0 + 0.5 * torch.randn(T_EMBD, generator=g)).bfloat16()
    d = write_dir("specforge", specforge_config())
    write_safetensors(os.path.join(d, "model.safetensors"), {k: np_of(v) for k, v in sorted(sf.items())}, {"format": "pt"})

    # references: q, k at POS for fixed inputs (the chunks of h3 at different scales)
    rng = np.random.default_rng(a.seed)
    h3 = np.concatenate([rng.standard_normal(T_EMBD) * s for s in (0.5, 2.0, 8.0)])
    emb = rng.standard_normal(H) * 0.1
    ref = {"pos": POS, "h3": h3.tolist(), "emb": emb.tolist()}
    ref["eagle"] = dict(zip(("q", "k"), head_qk(sd, h3, emb, POS, 10000.0, False)))
    ref["specforge"] = dict(zip(("q", "k"), head_qk(sf, h3, emb, POS, 500000.0, True)))
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f)
        f.write("\n")

    # refusals
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo this checkpoint ran code",))
    torch.save({"w": torch.zeros(2, dtype=torch.float16), "x": Evil()}, os.path.join(out, "bad-global.bin"))
    base = torch.arange(10, dtype=torch.float32)
    p = os.path.join(out, "bad-oob.bin")
    torch.save({"v": base[2:6]}, p)  # storage of 10, offset 2, size (4,)
    blob = bytearray(open(p, "rb").read())
    at = blob.find(b"K\x04\x85")  # the size tuple (4,) in data.pkl (stored, uncompressed)
    assert at > 0 and blob.find(b"K\x04\x85", at + 1) < 0
    blob[at + 1] = 9  # offset 2 + 9 elements > the storage's 10
    open(p, "wb").write(bytes(blob))
    torch.save({"a": torch.ones(2, 3, dtype=torch.float16), "b": torch.full((4,), 2.5, dtype=torch.bfloat16),
                "c": torch.arange(3, dtype=torch.int64), "d": torch.tensor([True, False])}, os.path.join(out, "tiny.bin"))
    z64 = to_zip64(open(os.path.join(out, "tiny.bin"), "rb").read())
    open(os.path.join(out, "tiny-zip64.bin"), "wb").write(z64)
    import io
    import zipfile
    with zipfile.ZipFile(io.BytesIO(z64)) as z:  # a reader of its own agrees it is a valid zip64 archive
        assert z.read("tiny/data/2") == zipfile.ZipFile(os.path.join(out, "tiny.bin")).read("tiny/data/2")
    print("wrote", out)


if __name__ == "__main__":
    main()
