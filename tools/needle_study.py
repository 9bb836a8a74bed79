#!/usr/bin/python3
"""needle_study.py — where selectors rank a passkey's needle at the answer's digits.

    /usr/bin/python3 tools/needle_study.py [--length 4096] [--instances 4]
        [--target models/kvsieve-default.gguf] [--dlm DIR ...] [--evictors]
        [--prompt FILE ...] [--per-digit]

Average attention recall (tools/attention_study.py, make_dlm.py --report)
weighs every query position alike; a retrieval task is decided at the few
positions where the answer is copied from its needle.  This script builds
passkey prompts from held-out text with the training script's generator,
appends the answer, and at each position whose next token is one of the
answer's digits (the answer's leading space piece comes first: the last
prompt position predicts it and is left out) finds the (layer, KV head)
pairs that put at least 0.1 of their mass on the needle's sentence.  For
each it prints the worst rank (0 = top) over the digits, under each
selector, of the needle entry that (layer, head) attends most (the digit
the answer copies):

  * a rank-r proxy: the exact queries against the keys projected on their
    top-r principal directions (uncentred SVD of the head's post-RoPE keys),
    for r = 16, 32, 48 and 64: the best any rank-r factorisation of the keys
    (LRQK's A_K B_K) can rank it;
  * each --dlm retrieval head: the draft's step-0 attention, log-softmax per
    query head and the max over the group (as `spec` ranks), with YaRN past
    the draft's trained length (as kvsieve loads it).

  * with --evictors, the prefill evictors' one-shot scores over the
    prompt: DapQ's (its 32 pseudo tokens, the prompt's first 4 and last 28,
    run at the positions after the prompt; their attention summed over the
    pseudo queries, the prompt columns of a softmax that has the pseudo
    keys in scope) and SnapKV's (the attention of the prompt's last 32
    queries, summed, then an average pool of width 5); H2O's seed (the
    prompt's last 64 queries, summed, no pool: what h2o selects from at the
    first decode step); and CHESS's page
    scores at the first decode step (each 32-token page's mean key,
    flattened over layers and KV heads, dotted with the mean of the recent
    window's pages), ranked by page ("p" ranks: pages, not entries).  It
    also prints, per
    layer, DapQ's premise (its Table 1): the mean cosine between the
    answer's real queries and the pseudo queries, against that between the
    real queries and SnapKV's window of prompt queries (post-RoPE).

A selector keeps the needle when its rank is below the budget printed with
each instance (6% of the prompt, the eval's middle budget, before spec's and
the framework's sinks and window are taken out).
"""
import argparse
import math
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import make_dlm as MD  # noqa: E402
import train_model as TM  # noqa: E402

PER_DIGIT = False
NEEDLE = "The pass key is %s. Remember it. %s is the pass key."


def with_answer(sp, prompt, ids, key):
    """(ids of the prompt with the answer " KEY." appended, prompt length, the
    needle's [lo, hi) token range, a token of margin each side: pieces may
    straddle its edges)."""
    n_prompt = len(ids)
    ids = ids + sp.encode(prompt + " %s." % key)[n_prompt - 1:]
    at = prompt.find(NEEDLE % (key, key))
    lo = len(sp.encode(prompt[:at])) - 1
    hi = len(sp.encode(prompt[:at + len(NEEDLE % (key, key))])) + 2
    return ids, n_prompt, lo, hi


def passkey_instance(r, src, sp, length):
    """(token ids with the answer appended, prompt length, needle's [lo, hi) token range)."""
    n_chars = length * 4
    while True:
        prompt, ans = TM.make_task("passkey", r, src, n_chars)[:2]
        ids = [sp.bos_id()] + sp.encode(prompt)
        if len(ids) <= length:
            break
        n_chars = int(n_chars * 0.9)
    return with_answer(sp, prompt, ids, ans.strip(" ."))


def passkey_from_file(path, sp):
    """A passkey prompt from a file (e.g. one of kvsieve eval's): the same triple as passkey_instance."""
    import re
    with open(path) as f:
        prompt = f.read()
    key = re.search(r"The pass key is (\d+)\.", prompt).group(1)
    return with_answer(sp, prompt, [sp.bos_id()] + sp.encode(prompt), key)


def worst_rank(scores, p, qpos, lo, hi):
    """scores [Q][T] of a selector; p [Q][T] the target's attention of one
    (layer, KV head): the worst over the queries of the rank (0 = top, among
    causal entries) of the needle entry the target attends most, the one
    the answer is copied from."""
    ranks = []
    for qi, qp in enumerate(qpos):
        s = scores[qi, :qp + 1]
        want = lo + int(p[qi, lo:hi].argmax())
        ranks.append(int((s > s[want]).sum()))
    return "%d" % max(ranks) if not PER_DIGIT else "/".join(str(x) for x in ranks)


def evictor_scores(torch, tgt, ids, n_prompt, hs, att, n_pseudo=32, n_head=4, window=32, pool=5, h2o_obs=64,
                   page=32):
    """(per layer: (DapQ's scores [HKV][n_prompt], SnapKV's, H2O's seed,
    DapQ's and SnapKV's query cosine with the answer's queries), CHESS's page
    scores [n_pages]), with the defaults of kvsieve's dapq, snapkv, h2o and chess."""
    pseudo = ids[:n_head] + ids[n_prompt - (n_pseudo - n_head):n_prompt]
    att_p, _ = MD.target_attention(torch, tgt, torch.tensor([ids[:n_prompt] + pseudo]),
                                   list(range(n_prompt, n_prompt + n_pseudo)))
    att_w = MD.layer_attention(torch, tgt, hs, list(range(n_prompt - window, n_prompt)))
    att_h = MD.layer_attention(torch, tgt, hs, list(range(n_prompt - h2o_obs, n_prompt)))

    def cos(a, b):  # mean cosine between the rows of a and b, per query head: [HQ][Qa][D], [HQ][Qb][D]
        a, b = torch.nn.functional.normalize(a, dim=-1), torch.nn.functional.normalize(b, dim=-1)
        return float((a @ b.transpose(-1, -2)).mean())

    # CHESS: page vectors over all layers, the anchor from the pages the window overlaps
    keys = torch.cat([k[0, :n_prompt].reshape(n_prompt, -1) for _, k, _ in att], -1).double()
    n_pages = (n_prompt + page - 1) // page
    pages = torch.stack([keys[i * page:(i + 1) * page].mean(0) for i in range(n_pages)])
    anchor = pages[(n_prompt - 64) // page:].mean(0)
    chess = pages @ anchor
    out = []
    for (_, _, q_real), (p_p, _, q_p), (p_w, _, q_w), (p_h, _, _) in zip(att, att_p, att_w, att_h):
        dapq = p_p[0, :, :, :n_prompt].sum(1)
        snap = torch.nn.functional.avg_pool1d(p_w[0, :, :, :n_prompt].sum(1)[:, None], pool, 1, pool // 2)[:, 0]
        h2o = p_h[0, :, :, :n_prompt].sum(1)
        out.append((dapq, snap, h2o, cos(q_real[0], q_p[0]), cos(q_real[0], q_w[0])))
    return out, chess


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=os.path.join(ROOT, "models", "kvsieve-default.gguf"))
    ap.add_argument("--workdir", default=os.path.join(ROOT, "models", "train"), help="the target's tokenizer")
    ap.add_argument("--cache", default=os.path.join(ROOT, "build"))
    ap.add_argument("--dlm", action="append", default=[], help="a retrieval head to rank with (repeatable)")
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--yarn", default="auto", choices=["auto", "off"],
                    help="the draft's RoPE past its trained length: YaRN (spec's yarn=auto) or plain (yarn=off)")
    ap.add_argument("--prompt", action="append", default=[],
                    help="a passkey prompt file to study instead of generated ones (repeatable)")
    ap.add_argument("--per-digit", action="store_true", help="every digit's rank, not the worst")
    ap.add_argument("--evictors", action="store_true", help="also rank under DapQ's and SnapKV's prefill scores")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    global PER_DIGIT
    PER_DIGIT = a.per_digit
    import torch
    import sentencepiece as spm
    torch.set_num_threads(a.threads)
    MD.configure(a.target)
    corpus = TM.build_corpus(a.cache, lambda m: None)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(a.workdir, "tok.model"))
    tgt = MD.load_target(torch, a.target)
    drafts = []
    for d in a.dlm:
        draft, _ = MD.load_dlm(torch, d)
        drafts.append((os.path.basename(os.path.normpath(d)), draft.eval()))
    r = random.Random(a.seed)
    src = TM.TextSource(corpus, "heldout", r)
    G = TM.N_HEAD // TM.N_KV_HEAD
    ranks = (16, 32, 48, 64)
    for inst in range(len(a.prompt) or a.instances):
        ids, n_prompt, lo, hi = (passkey_from_file(a.prompt[inst], sp) if a.prompt else
                                 passkey_instance(r, src, sp, a.length))
        T = len(ids)
        qpos = list(range(n_prompt, T - 2))        # positions whose next token is a digit of the answer
        x = torch.tensor([ids])
        att, hs = MD.target_attention(torch, tgt, x, qpos)
        heads = []
        for name, draft in drafts:
            if T > draft.max_pos and a.yarn == "auto":
                draft.set_yarn(T / draft.max_pos)
            h3 = MD.fused_states(torch, hs)
            with torch.no_grad():
                q, k, _ = draft.qkv(tgt.tok.weight[x], draft.fc(h3), torch.arange(T, dtype=torch.float64))
                qs = q[:, qpos].transpose(1, 2)
                kr = k.transpose(1, 2).repeat_interleave(MD.HQ // MD.HKV, 1)
                lp = torch.log_softmax(qs @ kr.transpose(-1, -2) / math.sqrt(MD.HD) + torch.where(
                    torch.arange(T)[None, :] > torch.tensor(qpos)[:, None], float("-inf"), 0.0), -1)
                heads.append((name, lp.view(MD.HKV, MD.HQ // MD.HKV, len(qpos), T).max(1).values))
            draft.reset_rope()
        evict, chess = evictor_scores(torch, tgt, ids, n_prompt, hs, att) if a.evictors else (None, None)
        print("instance %d: %d tokens, needle at [%d, %d), budget 6%% = %d" % (inst, T, lo, hi, int(0.06 * T)))
        if evict:
            print("  DapQ's premise, cos(answer's queries, pseudo queries) / cos(answer's, SnapKV's window) by layer: " +
                  ", ".join("%d: %.2f / %.2f" % (li, e[3], e[4]) for li, e in enumerate(evict)))
        for li, (p, k, q) in enumerate(att):
            for kv in range(TM.N_KV_HEAD):
                mass = float(p[0, kv, :, lo:hi].sum(-1).mean())
                if mass < 0.1:
                    continue
                K = k[0, :, kv].double()
                _, _, Vh = torch.linalg.svd(K, full_matrices=False)
                Qg = q[0, kv * G:(kv + 1) * G].double()
                cells = []
                for rank in ranks:
                    P = Vh[:rank].T @ Vh[:rank]
                    cells.append("r%d %s" % (rank, worst_rank((Qg @ P @ K.T).max(0).values, p[0, kv], qpos, lo, hi)))
                for name, lp in heads:
                    cells.append("%s %s" % (name, worst_rank(lp[kv], p[0, kv], qpos, lo, hi)))
                if evict:
                    for name, sc in zip(("dapq", "snapkv", "h2o"), evict[li][:3]):
                        cells.append("%s %s" % (name, worst_rank(sc[kv].expand(len(qpos), -1), p[0, kv], qpos, lo, hi)))
                    pr = [int((chess > chess[(lo + int(p[0, kv, qi, lo:hi].argmax())) // 32]).sum())
                          for qi in range(len(qpos))]
                    cells.append("chess p%s of %d" % (max(pr) if not PER_DIGIT else "/".join(map(str, pr)), len(chess)))
                print("  layer %d KV head %d: needle mass %.2f; worst needle rank: %s" % (
                    li, kv, mass, ", ".join(cells)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
