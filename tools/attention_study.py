#!/usr/bin/python3
"""attention_study.py — how concentrated, and how low-rank, the bundled model's attention is.

    /usr/bin/python3 tools/attention_study.py [--target models/kvsieve-default.gguf]
        [--length 8192] [--seqs 2] [--queries 16] [--json OUT.json]

Every sparse policy bets on a property of the target's attention: that a few
entries carry most of its mass (all of them), that the next query attends
where the last one did (FreeKV, "FreeKV: Boosting KV Cache Retrieval for
Efficient LLM Inference", Section 3.2), that the scores Q K^T are well
approximated at low rank (LRQK, "Efficient Low Rank Attention for
Long-Context Inference in Large Language Models", Section 3).  Where a policy
falls short on the trained model, these numbers say whether the model or the
method is the limit.  Measured on held-out sequences (the seeds make_dlm.py's
report uses, which the training never saw), at the last `--queries`
positions of each sequence, per layer, averaged over KV heads; attention is
averaged over each KV head's query heads, as the policies' recall is:

  * oracle recall: the mass inside the exact top-B of the query's own
    attention (no selector can cover more with B entries), at B = 2%, 6%, 12%;
  * previous-step recall: the mass inside the previous query's exact top-B
    (speculation's premise; FreeKV, spec and the step-late selections);
  * adjacent overlap: |top-B(q_t) & top-B(q_t-1)| / B, the share of the
    exact set that stays from one step to the next (elastic loading's
    premise: SpeContext, "SpeContext: Enabling Efficient Long-context
    Reasoning with Speculative Context Sparsity in LLMs", Section 5.4, copies
    only what changed);
  * entropy: mean attention entropy in nats, and exp(entropy) as a share of
    the context (the effective number of attended entries);
  * low rank: for r = 8, 16, 32, the share of the keys' energy in their top-r
    principal directions (post-RoPE, per KV head), and the recall at 6% of a
    rank-r proxy that scores q.k inside that subspace (max over the group, as
    kvsieve's lrqk reduces): the best a rank-r factorisation of the keys
    could do, with exact queries.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import train_model as TM  # noqa: E402
import make_dlm as MD  # noqa: E402

FRACS = (0.02, 0.06, 0.12)
RANKS = (8, 16, 32)


def study(torch, tgt, ids, n_q):
    """Per layer, the measures above for one batch of sequences ids [B][T]."""
    B, T = ids.shape
    qpos = list(range(T - n_q - 1, T))          # one extra (earlier) query for the previous-step reference
    G = TM.N_HEAD // TM.N_KV_HEAD
    causal = torch.arange(T)[None, None, None, :] > torch.tensor(qpos)[None, None, :, None]
    att, _ = MD.target_attention(torch, tgt, ids, qpos)
    rows = []
    with torch.no_grad():
        for li, (p, k, qs) in enumerate(att):                                # qs [B][HQ][Q][D]
            kk = k.transpose(1, 2)                                            # [B][HKV][T][D]
            cur, prev = p[:, :, 1:], p[:, :, :-1]
            row = {"layer": li}
            for f in FRACS:
                Bsel = max(1, int(round(f * T)))
                top = cur.topk(Bsel, -1).values.sum(-1)
                idx = prev.topk(Bsel, -1).indices
                row["oracle_%d%%" % round(f * 100)] = float(top.mean())
                row["previous_%d%%" % round(f * 100)] = float(torch.gather(cur, -1, idx).sum(-1).mean())
                prev_set = torch.zeros_like(cur, dtype=torch.bool).scatter_(-1, idx, True)
                cur_idx = cur.topk(Bsel, -1).indices
                row["overlap_%d%%" % round(f * 100)] = float(torch.gather(prev_set, -1, cur_idx).float().mean())
            ent = -(cur * torch.log(cur.clamp_min(1e-30))).sum(-1)           # [B][HKV][Q]
            row["entropy_nats"] = float(ent.mean())
            row["effective_share"] = float((ent.exp() / (torch.tensor(qpos[1:], dtype=torch.float32) + 1)).mean())
            B6 = max(1, int(round(0.06 * T)))
            for r in RANKS:
                energy, rec = [], []
                for hk in range(TM.N_KV_HEAD):
                    K = kk[:, hk].reshape(-1, TM.HEAD_DIM)                     # all keys of the batch
                    _, S, Vh = torch.linalg.svd(K, full_matrices=False)
                    energy.append(float((S[:r] ** 2).sum() / (S ** 2).sum()))
                    Vr = Vh[:r].T                                              # [D][r]
                    qr = qs[:, hk * G:(hk + 1) * G, 1:] @ Vr                   # [B][G][Q][r]
                    kr = kk[:, hk] @ Vr                                        # [B][T][r]
                    sc = (qr @ kr[:, None].transpose(-1, -2)).max(1).values    # [B][Q][T]
                    sc = sc.masked_fill(causal[:, 0, 1:], float("-inf"))
                    idx = sc.topk(B6, -1).indices
                    rec.append(float(torch.gather(cur[:, hk], -1, idx).sum(-1).mean()))
                row["key_energy_r%d" % r] = float(np.mean(energy))
                row["proxy_recall_6%%_r%d" % r] = float(np.mean(rec))
            rows.append(row)
    return rows


def spec_split(torch, tgt, ids, n_q, sink, window, workdir):
    """Per layer: mass covered by sinks + window + the DLM head's top entries, by sinks +
    window + random entries, and by streaming's sinks + wider window, at 6% of the context."""
    B, T = ids.shape
    draft = MD.build_draft(torch, TM.N_VOCAB)
    draft.load_state_dict(torch.load(os.path.join(workdir, "dlm-ckpt.pt"))["draft"])
    draft.eval()
    if T > MD.MAX_POS:
        draft.set_yarn(T / MD.MAX_POS)
    qpos = list(range(T - n_q, T))
    att, hs = MD.target_attention(torch, tgt, ids, qpos)
    h3 = MD.fused_states(torch, hs)
    G = MD.HQ // MD.HKV
    pos = torch.arange(T)
    qp = torch.tensor(qpos)[None, None, :, None]
    causal = pos[None, None, None, :] > qp                                    # [1][1][Q][T]
    with torch.no_grad():
        q, k, _ = draft.qkv(tgt.tok.weight[ids], draft.fc(h3), torch.arange(T, dtype=torch.float64))
        ds = (q[:, qpos].transpose(1, 2) @ k.transpose(1, 2).repeat_interleave(G, 1).transpose(-1, -2)
              / math.sqrt(MD.HD)).view(B, MD.HKV, G, n_q, T)
        ds = torch.softmax(ds.masked_fill(causal[:, :, None], float("-inf")), -1).max(2).values  # as p_spec.c
    budget = int(0.06 * T)
    n_sel = budget - sink - window
    base = ((pos[None, None, None, :] < sink) | ((pos[None, None, None, :] > qp - window) & ~causal)).expand(
        B, MD.HKV, n_q, T)
    stream = (pos[None, None, None, :] < sink) | ((pos[None, None, None, :] > qp - (budget - sink)) & ~causal)
    rnd = torch.rand(B, MD.HKV, n_q, T, generator=torch.Generator().manual_seed(0))
    m_head, m_rand = base.clone(), base.clone()
    m_head.scatter_(-1, ds.masked_fill(base | causal, float("-inf")).topk(n_sel, -1).indices, True)
    head_only = m_head & ~base
    # the head's own entries kept from one query to the next (elastic loading copies the rest)
    head_overlap = float((head_only[:, :, 1:] & head_only[:, :, :-1]).sum(-1).float().mean() / n_sel)
    m_rand.scatter_(-1, rnd.masked_fill(base | causal, -1.0).topk(n_sel, -1).indices, True)
    rows = []
    for li, (p, _, _) in enumerate(att):
        rows.append({"layer": li, "head": float((p * m_head).sum(-1).mean()),
                     "random": float((p * m_rand).sum(-1).mean()),
                     "streaming": float((p * stream).sum(-1).mean()),
                     "sink_window_only": float((p * base).sum(-1).mean())})
    return rows, head_overlap


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=os.path.join(ROOT, "models", "kvsieve-default.gguf"))
    ap.add_argument("--workdir", default=os.path.join(ROOT, "models", "train"), help="the target's tokenizer")
    ap.add_argument("--cache", default=os.path.join(ROOT, "build"))
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--seqs", type=int, default=2)
    ap.add_argument("--queries", type=int, default=16)
    ap.add_argument("--seed", type=int, default=20261126 + 11, help="held-out stream seed (make_dlm's report's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--spec-split", default=None, metavar="SINK,WINDOW")
    a = ap.parse_args(argv)
    import torch
    import sentencepiece as spm
    torch.set_num_threads(a.threads)
    t0 = time.time()
    log = lambda m: print("[%6.1fs] %s" % (time.time() - t0, m), file=sys.stderr, flush=True)  # noqa: E731
    corpus = TM.build_corpus(a.cache, log)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(a.workdir, "tok.model"))
    MD.configure(a.target)  # the target's shape
    tgt = MD.load_target(torch, a.target)
    X, _ = MD.heldout_stream(corpus, sp, a.seed).batch(torch, a.seqs, a.length)
    rows = study(torch, tgt, X[:, :a.length], a.queries)
    cols = ["layer", "entropy_nats", "effective_share"] + \
        ["oracle_%d%%" % round(f * 100) for f in FRACS] + ["previous_%d%%" % round(f * 100) for f in FRACS] + \
        ["overlap_%d%%" % round(f * 100) for f in FRACS] + \
        ["key_energy_r%d" % r for r in RANKS] + ["proxy_recall_6%%_r%d" % r for r in RANKS]
    mean = {c: float(np.mean([r[c] for r in rows])) for c in cols[1:]}
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows + [dict(mean, layer="mean")]:
        print("| " + " | ".join(str(r[c]) if c == "layer" else "%.3f" % r[c] for c in cols) + " |")
    out = {"target": os.path.relpath(a.target, ROOT), "length": a.length, "seqs": a.seqs,
           "queries": a.queries, "seed": a.seed, "layers": rows, "mean": mean}
    if a.spec_split:
        sink, window = (int(x) for x in a.spec_split.split(","))
        sr, head_overlap = spec_split(torch, tgt, X[:, :a.length], a.queries, sink, window, a.workdir)
        print("\nspec's budget at 6%% (%d sinks, %d-entry window, the rest by the DLM's head):\n" % (sink, window))
        print("| layer | sinks + window + head | sinks + window + random | streaming (same budget) | sinks + window only |")
        print("|---|---:|---:|---:|---:|")
        for r in sr:
            print("| %d | %.3f | %.3f | %.3f | %.3f |" % (r["layer"], r["head"], r["random"], r["streaming"],
                                                        r["sink_window_only"]))
        print("\nthe head's own entries kept from one query to the next: %.3f" % head_overlap)
        out["spec_split"] = sr
        out["spec_head_adjacent_overlap"] = head_overlap
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
