#!/usr/bin/env python3
"""eval_table.py — the Markdown tables of docs/results/EVAL.md from `kvsieve eval --json` output.

    python3 tools/eval_table.py EVAL.json [EVAL2.json ...] [--keep-share 0.95]

Several files (e.g. one per length) are read as one run: each instance is
keyed by (config, task, length, depth), and dense is the reference of its
own file.  Prints, for each length: accuracy per task and config, mean
accuracy, top-1 agreement with dense teacher-forced and free-running, KL,
attention recall and the policy counters; then, per length, each config's
share of dense accuracy per task (dense 0 counted as kept when the config
is 0 too) with the configs that keep at least --keep-share on every task,
and the free-running agreement on long generation.
Standard library only.
"""
import argparse
import json
import sys
from collections import defaultdict

TASKS = ["passkey", "multikey", "multivalue", "vartrack", "longgen"]


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def fmt(x, nd=2):
    return "-" if x is None else ("%.*f" % (nd, x))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--keep-share", type=float, default=0.95)
    a = ap.parse_args(argv)
    rows, configs, counters = [], [], {}
    for fn in a.files:
        with open(fn) as f:
            d = json.load(f)
        for r in d["results"]:
            rows.append(r)
            if r["config"] not in configs:
                configs.append(r["config"])
        for s in d["summary"]:
            if "policy_counters" in s:
                c = counters.setdefault(s["config"], defaultdict(int))
                for k, v in s["policy_counters"].items():
                    c[k] += v
    lengths = sorted({r["length"] for r in rows})
    cell = defaultdict(list)                     # (config, length, task) -> [row]
    for r in rows:
        cell[(r["config"], r["length"], r["task"])].append(r)

    def acc(cfg, L, t):
        return mean([r["accuracy"] for r in cell[(cfg, L, t)]]) if cell[(cfg, L, t)] else None

    def metric(cfg, L, key, tasks=TASKS):
        return mean([r.get(key) for t in tasks for r in cell[(cfg, L, t)]])

    for L in lengths:
        print("\n#### %d tokens\n" % L)
        print("| config | " + " | ".join(TASKS) + " | all | agree (forced) | agree (free) | KL | recall | counters |")
        print("|---|" + "---:|" * (len(TASKS) + 5) + "---|")
        for cfg in configs:
            accs = [acc(cfg, L, t) for t in TASKS]
            c = counters.get(cfg, {})
            ctr = []
            if c.get("selections"):
                if c.get("hits", 0) + c.get("misses", 0):
                    ctr.append("miss rate %.2f" % (c["misses"] / (c["hits"] + c["misses"])))
                if c.get("corrections"):
                    ctr.append("corrections %.2f" % (c["corrections"] / c["selections"]))
                if c.get("rebuilds"):
                    ctr.append("rebuilds %d/%d" % (c["rebuilds"], c["selections"]))
            print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                cfg, " | ".join(fmt(x) for x in accs), fmt(mean(accs), 3),
                fmt(metric(cfg, L, "agreement_forced"), 3), fmt(metric(cfg, L, "agreement_free"), 3),
                fmt(metric(cfg, L, "kl"), 3), fmt(metric(cfg, L, "attention_recall"), 3), ", ".join(ctr)))
    for L in lengths:
        print("\n#### Share of dense accuracy, %d tokens (>= %.2f on every task: **bold**)\n" % (L, a.keep_share))
        print("| config | " + " | ".join(TASKS) + " | longgen agree (free) |")
        print("|---|" + "---:|" * (len(TASKS) + 1))
        for cfg in configs:
            if cfg == "dense":
                continue
            shares = []
            for t in TASKS:
                d, p = acc("dense", L, t), acc(cfg, L, t)
                shares.append(None if d is None or p is None else (1.0 if d == 0 and p == 0 else
                                                                   (p / d if d > 0 else 0.0)))
            ok = all(s is not None and s >= a.keep_share for s in shares)
            name = "**%s**" % cfg if ok else cfg
            print("| %s | %s | %s |" % (name, " | ".join(fmt(s) for s in shares),
                                        fmt(metric(cfg, L, "agreement_free", ["longgen"]), 3)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
