#!/usr/bin/python3
"""task_probe.py — a model's answers on train_model.py's own task instances (held-out text).

    /usr/bin/python3 tools/task_probe.py MODEL.gguf [--tasks multikey,vartrack] [--n 24] [--chars 3000]

Why: when `kvsieve eval` scores a task low, this tells whether the model
lacks the skill or only the eval's wording.  It draws instances from the
training script's generators (make_task: one question in the eval's format;
make_drill: the first question of a drill, with hard distractors) over the
held-out documents, with a seed of its own, and scores the teacher-forced
answer: 1 when the model's argmax is right at every answer token.  The model
is the exported GGUF (the Q8_0 weights kvsieve runs), in PyTorch on the CPU.
"""
import argparse
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train_model as TM  # noqa: E402


def answer_correct(torch, model, sp, prompt, answer):
    ids = [sp.bos_id()] + sp.encode(prompt)
    full = [sp.bos_id()] + sp.encode(prompt + answer)
    with torch.no_grad():
        pred = model(torch.tensor([full[:-1]]))[0].argmax(-1)
    return all(int(pred[t]) == full[t + 1] for t in range(len(ids) - 1, len(full) - 1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tasks", default="multikey,vartrack")
    ap.add_argument("--n", type=int, default=24, help="instances per task and format")
    ap.add_argument("--chars", type=int, default=3000, help="haystack length in characters (about 800 tokens)")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--workdir", default=os.path.join(TM.ROOT, "models", "train"), help="the tokenizer")
    ap.add_argument("--cache", default=os.path.join(TM.ROOT, "build"))
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    import torch
    import sentencepiece as spm
    torch.set_num_threads(a.threads)
    TM.set_shape_from_gguf(a.model)
    model = TM.load_gguf_into(torch, TM.build_model(torch), a.model).eval()
    sp = spm.SentencePieceProcessor(model_file=os.path.join(a.workdir, "tok.model"))
    corpus = TM.build_corpus(a.cache, lambda m: None)
    r = random.Random(a.seed)
    src = TM.TextSource(corpus, "heldout", r)
    for kind in a.tasks.split(","):
        task = sum(answer_correct(torch, model, sp, *TM.make_task(kind, r, src, a.chars, True))
                   for _ in range(a.n)) / a.n
        drill = 0
        for _ in range(a.n):
            p, ans, _ = TM.make_drill(kind, r, src, a.chars, (kind,))
            drill += answer_correct(torch, model, sp, p, ans)
        print("%s %s: task format %.2f, drill's first question %.2f (%d each)" % (
            os.path.basename(a.model), kind, task, drill / a.n, a.n), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
