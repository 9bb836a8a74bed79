#!/usr/bin/env python3
"""load.py — the bounded load test's client (run by load.sh).

    load.py URL CASES_JSON SEED N_REQUESTS N_CLIENTS DEADLINE_S [good-only]

CASES_JSON is a list of {"body": {...}, "path": "/v1/...", "ref": TEXT}:
requests whose answers `kvsieve run` computed alone.  N_REQUESTS jobs,
drawn with SEED, are run by N_CLIENTS threads: good requests (plain or
streamed; each answer must equal its reference), clients that hang up
mid-stream or while waiting for a plain answer, and malformed requests
(each must get its 4xx status and OpenAI error code).  Prints one line per
problem and a summary JSON line; exits 1 on any problem.
"""
import json
import os
import queue
import random
import socket
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from bench_serve import connect, stream_completion  # noqa: E402

MALFORMED = [  # (path, raw body, status, code)
    ("/v1/completions", b'{"prompt": "x",', 400, "invalid_json"),
    ("/v1/completions", b'{"prompt":"x","max_tokens":"8"}', 400, "invalid_type"),
    ("/v1/completions", b'{"prompt":"x","kvsieve":{"policy":"nope"}}', 400, "unknown_policy"),
    ("/v1/completions", b'{"prompt":"x","max_tokens":0}', 400, "invalid_value"),
    ("/v1/chat/completions", b'{"messages":"hello"}', 400, "invalid_type"),
    ("/v1/completions", b'{"prompt":"' + b"once upon a time " * 60 + b'","max_tokens":1}', 400,
     "context_length_exceeded"),
    ("/v1/completions", b'\xff\xfe\x00garbage', 400, "invalid_json"),
    ("/v1/completions", b'[1,2,3]', 400, None),
    ("/v1/completions", b'{"prompt":"x","kvsieve":{"budget":-5}}', 400, None),
]


def post_raw(url, path, raw, timeout=60):
    c = connect(url, timeout)
    c.request("POST", path, body=raw, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, body


def hang_up_waiting(url, path, body, delay):
    """Send a plain request and close the socket before the answer."""
    u = urllib.parse.urlparse(url)
    data = json.dumps(body).encode()
    s = socket.create_connection((u.hostname, u.port), timeout=30)
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % (path.encode(), len(data)) + data)
    time.sleep(delay)
    s.close()


def main():
    url, cases_path, seed, n_req, n_clients, deadline = sys.argv[1:7]
    good_only = sys.argv[7:] == ["good-only"]
    cases = json.load(open(cases_path))
    rng = random.Random(int(seed))
    jobs = queue.Queue()
    kinds = {"good": 0, "disconnect": 0, "malformed": 0}
    for i in range(int(n_req)):
        x = rng.random()
        kind = "good" if x < 0.6 or good_only else "disconnect" if x < 0.8 else "malformed"
        kinds[kind] += 1
        jobs.put((i, kind, rng.randrange(1 << 30)))
    problems, lock = [], threading.Lock()
    t_end = time.monotonic() + float(deadline)

    def problem(msg):
        with lock:
            problems.append(msg)
            print("FAIL: " + msg, flush=True)

    def work():
        while time.monotonic() < t_end:
            try:
                i, kind, r = jobs.get_nowait()
            except queue.Empty:
                return
            jr = random.Random(r)
            try:
                if kind == "malformed":
                    path, raw, status, code = MALFORMED[jr.randrange(len(MALFORMED))]
                    st, body = post_raw(url, path, raw)
                    err = json.loads(body).get("error", {})
                    if st != status or not err.get("message") or (code and err.get("code") != code):
                        problem("job %d: malformed %r: status %d body %r" % (i, raw[:40], st, body[:200]))
                    continue
                case = cases[jr.randrange(len(cases))]
                body, path = dict(case["body"]), case["path"]
                if kind == "disconnect":
                    if jr.random() < 0.5:
                        hang_up_waiting(url, path, body, jr.uniform(0.0, 0.3))
                    else:
                        n_chunks = jr.randrange(1, 6)
                        stream_completion(url, path, body, on_event=lambda t, o, c=[0]: (
                            c.__setitem__(0, c[0] + 1) or c[0] < n_chunks))
                    continue
                if jr.random() < 0.5:
                    st, text, _, done, err = stream_completion(url, path, body, timeout=120)
                    if st != 200 or not done or err:
                        problem("job %d: stream status %d done %s error %s" % (i, st, done, err))
                else:
                    st, raw = post_raw(url, path, json.dumps(body).encode(), timeout=120)
                    d = json.loads(raw)
                    if st != 200:
                        problem("job %d: status %d: %s" % (i, st, raw[:300]))
                        continue
                    ch = d["choices"][0]
                    text = ch["message"]["content"] if "message" in ch else ch["text"]
                if text != case["ref"]:
                    problem("job %d: %s differs:\n  got  %r\n  want %r" % (i, path, text, case["ref"]))
            except Exception as e:  # a refused connection means the server died
                problem("job %d (%s): %s: %s" % (i, kind, type(e).__name__, e))

    threads = [threading.Thread(target=work) for _ in range(int(n_clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not jobs.empty():
        problem("%d jobs not run within %s s" % (jobs.qsize(), deadline))
    print(json.dumps(dict(kinds, problems=len(problems))), flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
