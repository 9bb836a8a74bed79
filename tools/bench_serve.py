#!/usr/bin/env python3
"""bench_serve.py — load a running `kvsieve serve` with R concurrent requests.

Each request is a streamed /v1/completions call whose prompt is exactly
--input-len token ids (seeded random ids, so no tokenizer is needed) and
which generates exactly --output-len tokens (kvsieve.ignore_eos).  Reported:
aggregate generated tokens per second (all tokens / wall time from the first
send to the last [DONE]), time to first token and inter-token latency
(p50/p99; ITL is the gap between consecutive streamed chunks: the server
sends a chunk per step, so one chunk is one token unless text was held back
for a stop string or an incomplete UTF-8 character), and the server's KV bytes per tier,
layer offloads, pauses and loads/stores from /metrics (peak while running,
and the counters' growth over the run).

    tools/bench_serve.py --url http://127.0.0.1:8080 -R 8 --input-len 1024 --output-len 4096 \\
        [--policy dense,quest,spec --budget 1024] [--policy-arg k=v] [--api-key KEY] [--json]
    tools/bench_serve.py --spawn "build/kvsieve serve -m MODEL.gguf -t 2 --parallel 8 --mem-cap 2G" ...

--policy takes a comma list: the same request mix (same prompts) runs once
per policy, one after the other, on the same server.

--turns T (T >= 1) switches to the multi-turn chat workload that a prefix
cache is for: -n conversations (default R), R at once, each a streamed
/v1/chat/completions conversation of T turns over one shared long document.
Every conversation opens with the same system message holding the document
(--input-len words of seeded English-like text, or --doc FILE), then asks
its own question of --question-len words per turn; each answer
(--output-len tokens, ignore_eos) is sent back as the assistant's turn of
the next request, so turn k+1's prompt extends turn k's.  Reported per turn
index: TTFT p50 and p99, prompt tokens and usage.prompt_tokens_details.
cached_tokens (p50, when the server reports it), and the ratio of each
turn's TTFT p50 to turn 1's.

    tools/bench_serve.py --spawn "build/kvsieve serve -m MODEL.gguf -t 2 -c 20000" \
        --turns 4 -n 4 -R 1 --input-len 16000 --question-len 64 --output-len 32  --spawn starts the
server itself on a free loopback port (--port 0 is added), runs the
benchmark and stops it with SIGTERM.

Standard library only; the HTTP client part (stream_completion) is also
used by tests/server/load.py.
"""
import argparse
import http.client
import json
import random
import shlex
import subprocess
import sys
import threading
import time
import urllib.parse


def connect(url, timeout=600):
    u = urllib.parse.urlparse(url)
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)


def headers(api_key):
    h = {"Content-Type": "application/json"}
    if api_key:
        h["Authorization"] = "Bearer " + api_key
    return h


def get_json(url, path, api_key=None):
    c = connect(url, 30)
    c.request("GET", path, headers=headers(api_key))
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, json.loads(body)


def get_metrics(url, api_key=None):
    """/metrics as {name_with_labels: float}."""
    c = connect(url, 30)
    c.request("GET", "/metrics", headers=headers(api_key))
    text = c.getresponse().read().decode()
    c.close()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            try:
                out[k] = float(v)
            except ValueError:
                pass
    return out


def stream_completion(url, path, body, api_key=None, on_event=None, timeout=600):
    """POST body (a dict, "stream" is set) and read the SSE stream.
    on_event(t, obj) is called for each data object (obj None for [DONE]);
    returning False from it hangs up.  Returns (status, text, events, done,
    error): error is the body's or a streamed error object, or None."""
    body = dict(body, stream=True)
    c = connect(url, timeout)
    c.request("POST", path, body=json.dumps(body), headers=headers(api_key))
    r = c.getresponse()
    if r.status != 200:
        try:
            err = json.loads(r.read()).get("error")
        except ValueError:
            err = {"code": "unparsable"}
        c.close()
        return r.status, "", [], False, err
    text, events, done, err = [], [], False, None
    while True:
        line = r.readline()
        if not line:
            break
        line = line.decode("utf-8").rstrip("\n")
        if not line.startswith("data: "):
            continue
        t = time.monotonic()
        if line[6:] == "[DONE]":
            done = True
            if on_event:
                on_event(t, None)
            break
        obj = json.loads(line[6:])
        if "error" in obj:
            err = obj["error"]
        for ch in obj.get("choices", []):
            piece = ch.get("text") or (ch.get("delta") or {}).get("content") or ""
            text.append(piece)
        events.append((t, obj))
        if on_event and on_event(t, obj) is False:
            break
    c.close()
    return 200, "".join(text), events, done, err


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def run_one(a, policy, prompts, model):
    """One benchmark run of the request mix with one policy; returns the report."""
    n_req = len(prompts)
    ext = {"ignore_eos": True}
    if policy:
        ext["policy"] = policy
    if a.budget is not None:
        ext["budget"] = a.budget
    if a.policy_arg:
        ext["policy_args"] = ",".join(a.policy_arg)
    m0 = get_metrics(a.url, a.api_key)
    peak = {}
    results, lock, stop = [], threading.Lock(), threading.Event()

    def watch():
        keys = ("kvsieve_kv_bytes_fast", "kvsieve_kv_bytes_slow", "kvsieve_kv_layers_offloaded",
                "kvsieve_process_resident_bytes")
        while not stop.wait(0.2):
            try:
                m = get_metrics(a.url, a.api_key)
            except OSError:
                continue
            for k in keys:
                if k in m:
                    peak[k] = max(peak.get(k, 0), m[k])

    def one(i):
        t0 = time.monotonic()
        marks = []  # arrival times of the chunks that carry text

        def ev(t, obj):
            if obj and any((c.get("text") or (c.get("delta") or {}).get("content")) for c in obj.get("choices", [])):
                marks.append(t)
        st, text, events, done, err = stream_completion(
            a.url, "/v1/completions",
            {"model": model, "prompt": prompts[i], "max_tokens": a.output_len, "temperature": 0,
             "stream_options": {"include_usage": True}, "kvsieve": ext},
            a.api_key, ev)
        usage = next((o["usage"] for _, o in reversed(events) if o.get("usage")), None)
        with lock:
            results.append({"status": st, "done": done, "error": err, "t0": t0, "marks": marks,
                            "tokens": usage["completion_tokens"] if usage else 0})

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    sem = threading.Semaphore(a.concurrency)

    def gated(i):
        with sem:
            one(i)
    t_start = time.monotonic()
    threads = [threading.Thread(target=gated, args=(i,)) for i in range(n_req)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t_start
    stop.set()
    m1 = get_metrics(a.url, a.api_key)
    ok = [r for r in results if r["status"] == 200 and r["done"] and not r["error"]]
    for r in results:
        if r not in ok:
            print("  failed: status %s error %s" % (r["status"], r["error"]), file=sys.stderr)
    ttft = [r["marks"][0] - r["t0"] for r in ok if r["marks"]]
    itl = []
    for r in ok:
        mk = r["marks"]
        itl += [mk[j + 1] - mk[j] for j in range(len(mk) - 1)]
    gen = sum(r["tokens"] for r in ok)

    def delta(k):
        return m1.get(k, 0) - m0.get(k, 0)
    return {
        "requests": n_req, "concurrency": a.concurrency, "input_len": a.input_len, "output_len": a.output_len,
        "policy": policy or "(server default)", "budget": a.budget,
        "succeeded": len(ok), "failed": n_req - len(ok),
        "wall_s": round(wall, 3), "generated_tokens": gen, "tok_per_s": round(gen / wall, 2) if wall > 0 else 0,
        "ttft_p50_ms": round(percentile(ttft, 50) * 1e3, 2), "ttft_p99_ms": round(percentile(ttft, 99) * 1e3, 2),
        "itl_p50_ms": round(percentile(itl, 50) * 1e3, 3), "itl_p99_ms": round(percentile(itl, 99) * 1e3, 3),
        "kv_bytes_fast_peak": int(peak.get("kvsieve_kv_bytes_fast", 0)),
        "kv_bytes_slow_peak": int(peak.get("kvsieve_kv_bytes_slow", 0)),
        "kv_bytes_loaded": int(delta("kvsieve_kv_bytes_loaded_total")),
        "kv_bytes_stored": int(delta("kvsieve_kv_bytes_stored_total")),
        "offload_events": int(delta("kvsieve_kv_offload_events_total")),
        "pauses": int(delta("kvsieve_request_pauses_total")),
        "resumes": int(delta("kvsieve_request_resumes_total")),
        "layers_offloaded_peak": int(peak.get("kvsieve_kv_layers_offloaded", 0)),
        "resident_bytes_peak": int(peak.get("kvsieve_process_resident_bytes", 0)),
    }


WORDS = ("the a of and to in is was that for on with as by at from his her it an this which or be are were "
         "river bridge farmer village market morning evening winter summer garden letter window house road "
         "old small quiet long bright cold green early late open heavy simple careful strange "
         "walks carries reads writes opens keeps finds sees hears counts builds paints remembers "
         "sheep bird horse stone tree field cart lamp bell boat coin book table door wall hill "
         "one two three four five six seven eight nine ten many few every each most some").split()


def make_text(rng, n_words):
    """n_words of seeded English-like sentences (a word is one to two tokens)."""
    out, k = [], 0
    while k < n_words:
        m = min(n_words - k, rng.randrange(6, 14))
        sent = [rng.choice(WORDS) for _ in range(m)]
        sent[0] = sent[0].capitalize()
        out.append(" ".join(sent) + ".")
        k += m
    return " ".join(out)


def run_multiturn(a, policy, model, doc):
    """-n conversations of --turns turns over one shared document; returns the report."""
    n_conv = a.requests or a.concurrency
    ext = {"ignore_eos": True}
    if policy:
        ext["policy"] = policy
    if a.budget is not None:
        ext["budget"] = a.budget
    if a.policy_arg:
        ext["policy_args"] = ",".join(a.policy_arg)
    rng = random.Random(a.seed + 1)
    questions = [["Question %d.%d: %s?" % (c + 1, k + 1, make_text(rng, a.question_len).rstrip("."))
                  for k in range(a.turns)] for c in range(n_conv)]
    system = "Answer questions about this document.\n\n" + doc
    per_turn = [[] for _ in range(a.turns)]  # (ttft, prompt_tokens, cached_tokens or None)
    failures, lock = [], threading.Lock()

    def conversation(c):
        msgs = [{"role": "system", "content": system}]
        for k in range(a.turns):
            msgs.append({"role": "user", "content": questions[c][k]})
            t0 = time.monotonic()
            marks = []

            def ev(t, obj):
                if obj and any((ch.get("delta") or {}).get("content") for ch in obj.get("choices", [])):
                    marks.append(t)
            st, text, events, done, err = stream_completion(
                a.url, "/v1/chat/completions",
                {"model": model, "messages": msgs, "max_tokens": a.output_len, "temperature": 0,
                 "stream_options": {"include_usage": True}, "kvsieve": ext},
                a.api_key, ev)
            usage = next((o["usage"] for _, o in reversed(events) if o.get("usage")), None)
            if st != 200 or not done or err or not marks or not usage:
                with lock:
                    failures.append((c, k, st, err))
                return
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            with lock:
                per_turn[k].append((marks[0] - t0, usage["prompt_tokens"], cached))
            msgs.append({"role": "assistant", "content": text})

    sem = threading.Semaphore(a.concurrency)

    def gated(c):
        with sem:
            conversation(c)
    t_start = time.monotonic()
    threads = [threading.Thread(target=gated, args=(c,)) for c in range(n_conv)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t_start
    for c, k, st, err in failures:
        print("  failed: conversation %d turn %d: status %s error %s" % (c + 1, k + 1, st, err), file=sys.stderr)
    turns = []
    for k, rows in enumerate(per_turn):
        ttft = [r[0] for r in rows]
        cached = [r[2] for r in rows if r[2] is not None]
        turns.append({
            "turn": k + 1, "completed": len(rows),
            "ttft_p50_ms": round(percentile(ttft, 50) * 1e3, 2), "ttft_p99_ms": round(percentile(ttft, 99) * 1e3, 2),
            "prompt_tokens_p50": percentile([r[1] for r in rows], 50) if rows else 0,
            "cached_tokens_p50": percentile(cached, 50) if cached else None,
        })
    first = turns[0]["ttft_p50_ms"] if turns else float("nan")
    for t in turns:
        t["ttft_vs_turn1"] = round(t["ttft_p50_ms"] / first, 4) if first and first == first else None
    return {
        "mode": "multi-turn", "conversations": n_conv, "turns_per_conversation": a.turns,
        "concurrency": a.concurrency, "document_words": len(doc.split()), "question_len": a.question_len,
        "output_len": a.output_len, "policy": policy or "(server default)", "budget": a.budget,
        "succeeded": n_conv - len(failures), "failed": len(failures), "wall_s": round(wall, 3), "turns": turns,
    }


def print_multiturn(rep):
    print("bench-serve multi-turn: %d conversations x %d turns (%d at once), document %d words, questions %d words, "
          "%d out tokens, policy %s budget %s" %
          (rep["conversations"], rep["turns_per_conversation"], rep["concurrency"], rep["document_words"],
           rep["question_len"], rep["output_len"], rep["policy"], rep["budget"]))
    print("  conversations succeeded %d, failed %d; %.2f s" % (rep["succeeded"], rep["failed"], rep["wall_s"]))
    print("  turn  done  prompt tok p50  cached tok p50  TTFT p50 ms  TTFT p99 ms  vs turn 1")
    for t in rep["turns"]:
        print("  %4d  %4d  %14s  %14s  %11.1f  %11.1f  %9s" %
              (t["turn"], t["completed"], t["prompt_tokens_p50"],
               "-" if t["cached_tokens_p50"] is None else t["cached_tokens_p50"],
               t["ttft_p50_ms"], t["ttft_p99_ms"], "-" if t["ttft_vs_turn1"] is None else "%.3f" % t["ttft_vs_turn1"]))
    sys.stdout.flush()


def spawn(cmd):
    """Start `kvsieve serve ...` on a free loopback port; returns (process, url)."""
    p = subprocess.Popen(shlex.split(cmd) + ["--port", "0"], stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if "listening on " not in line:
        p.kill()
        sys.exit("bench-serve: the server did not start: %r" % line)
    return p, line.strip().split("listening on ")[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--spawn", metavar="CMD", help="start this `kvsieve serve` command (a free port is added)")
    ap.add_argument("--api-key")
    ap.add_argument("-R", "--concurrency", type=int, default=8, help="requests in flight at once")
    ap.add_argument("-n", "--requests", type=int, default=0, help="requests in all (default: R)")
    ap.add_argument("--input-len", type=int, default=1024, help="prompt tokens per request")
    ap.add_argument("--output-len", type=int, default=256, help="generated tokens per request")
    ap.add_argument("--policy", default="", help="policy, or a comma list run one after the other")
    ap.add_argument("--budget", type=int)
    ap.add_argument("--policy-arg", action="append", default=[], help="K=V (repeatable)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print each report as one JSON line")
    ap.add_argument("--turns", type=int, default=0,
                    help="multi-turn chat mode: turns per conversation over a shared document (0: off)")
    ap.add_argument("--question-len", type=int, default=64, help="multi-turn: words per question")
    ap.add_argument("--doc", metavar="FILE", help="multi-turn: the shared document (default: --input-len words)")
    a = ap.parse_args()
    if a.turns < 0 or a.question_len < 1:
        ap.error("--turns must be >= 0 and --question-len >= 1")
    server = None
    if a.spawn:
        server, a.url = spawn(a.spawn)
    try:
        st, models = get_json(a.url, "/v1/models", a.api_key)
        if st != 200:
            sys.exit("bench-serve: GET /v1/models answered %d: %s" % (st, models))
        n_vocab = models["data"][0]["kvsieve"]["n_vocab"]
        model = models["data"][0]["id"]
        rng = random.Random(a.seed)
        failed = 0
        if a.turns:
            if a.doc:
                with open(a.doc, encoding="utf-8") as f:
                    doc = f.read()
            else:
                doc = make_text(rng, a.input_len)
            for policy in a.policy.split(",") if a.policy else [None]:
                rep = run_multiturn(a, policy, model, doc)
                failed += rep["failed"]
                if a.json:
                    print(json.dumps(rep), flush=True)
                else:
                    print_multiturn(rep)
            return 1 if failed else 0
        prompts = [[rng.randrange(3, n_vocab) for _ in range(a.input_len)]
                   for _ in range(a.requests or a.concurrency)]
        for policy in a.policy.split(",") if a.policy else [None]:
            rep = run_one(a, policy, prompts, model)
            failed += rep["failed"]
            if a.json:
                print(json.dumps(rep), flush=True)
                continue
            print("bench-serve: %d requests (%d at once), %d in / %d out tokens, policy %s budget %s" %
                  (rep["requests"], a.concurrency, a.input_len, a.output_len, rep["policy"], a.budget))
            print("  succeeded %d, failed %d; %.2f s; %d tokens generated = %.2f tok/s aggregate" %
                  (rep["succeeded"], rep["failed"], rep["wall_s"], rep["generated_tokens"], rep["tok_per_s"]))
            print("  TTFT p50 %.1f ms, p99 %.1f ms; inter-token p50 %.2f ms, p99 %.2f ms" %
                  (rep["ttft_p50_ms"], rep["ttft_p99_ms"], rep["itl_p50_ms"], rep["itl_p99_ms"]))
            print("  KV bytes peak: fast %d, slow %d; slow tier: %d loaded, %d stored; layer offloads %d; "
                  "pauses %d, resumes %d" %
                  (rep["kv_bytes_fast_peak"], rep["kv_bytes_slow_peak"], rep["kv_bytes_loaded"],
                   rep["kv_bytes_stored"], rep["offload_events"], rep["pauses"], rep["resumes"]), flush=True)
        return 1 if failed else 0
    finally:
        if server:
            server.terminate()
            server.wait(60)


if __name__ == "__main__":
    sys.exit(main())
