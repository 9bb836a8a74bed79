#!/usr/bin/env python3
"""logprobs.py — logprobs in chat and text completions, OpenAI's shapes,
streamed and not (run by tests/server/tokens.sh on its server).

At temperature 0 the chosen token is the most likely one, so it must be the
first of its top_logprobs with the same log-probability; the top lists are
sorted, as long as asked, each a log-probability (<= 0, their exp summing to
at most 1); the tokens' bytes join to the answer's text; a streamed answer
carries the same tokens, chunk by chunk, as the whole one.

Usage: logprobs.py BASE KEY
"""
import json
import math
import sys
import urllib.error
import urllib.request

base, key = sys.argv[1:3]
fails = 0


def bad(msg):
    global fails
    fails += 1
    print("FAIL:", msg)


def req(route, body):
    rq = urllib.request.Request(base + route, data=json.dumps(body).encode(),
                                headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    try:
        with urllib.request.urlopen(rq, timeout=60) as r:
            raw = r.read().decode()
            if body.get("stream"):
                return r.status, [json.loads(l[6:]) for l in raw.split("\n") if l.startswith("data: {")]
            return r.status, json.loads(raw)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


MSGS = [{"role": "user", "content": "The quiet farmer walks near the old bridge. Where does he walk?"}]

# chat, not streamed
st, d = req("/v1/chat/completions", {"messages": MSGS, "max_tokens": 12, "temperature": 0, "logprobs": True,
                                     "top_logprobs": 3})
if st != 200:
    bad(f"chat logprobs: {st} {d}")
    sys.exit(1)
ch = d["choices"][0]
content = ch["logprobs"]["content"]
if len(content) != d["usage"]["completion_tokens"]:
    bad(f"{len(content)} logprobs for {d['usage']['completion_tokens']} tokens")
if bytes(b for t in content for b in t["bytes"]).decode("utf-8", "replace") != ch["message"]["content"]:
    bad(f"the tokens' bytes do not join to the answer: {content} / {ch['message']['content']!r}")
for t in content:
    top = t["top_logprobs"]
    if len(top) != 3:
        bad(f"top_logprobs has {len(top)} entries, asked 3: {t}")
    if any(a["logprob"] < b["logprob"] for a, b in zip(top, top[1:])):
        bad(f"top_logprobs not sorted: {top}")
    if not all(a["logprob"] <= 1e-6 for a in top) or sum(math.exp(a["logprob"]) for a in top) > 1 + 1e-4:
        bad(f"not log-probabilities: {top}")
    if top and (top[0]["bytes"] != t["bytes"] or abs(top[0]["logprob"] - t["logprob"]) > 1e-6):
        bad(f"at temperature 0 the chosen token is not the most likely: {t}")

# chat, streamed: the same tokens, each chunk with its own
st, chunks = req("/v1/chat/completions", {"messages": MSGS, "max_tokens": 12, "temperature": 0, "logprobs": True,
                                          "top_logprobs": 3, "stream": True})
streamed = [t for c in chunks for ch2 in c.get("choices", []) if ch2.get("logprobs")
            for t in ch2["logprobs"]["content"]]
if st != 200 or streamed != content:
    bad(f"streamed logprobs differ: {st} {streamed} vs {content}")
for c in chunks:
    for ch2 in c.get("choices", []):
        text = (ch2.get("delta") or {}).get("content") or ""
        lp = ch2.get("logprobs")
        if lp and bytes(b for t in lp["content"] for b in t["bytes"]).decode("utf-8", "replace") != text and text:
            bad(f"a chunk's logprobs are not its text: {ch2}")

# without logprobs: null, as before
st, d = req("/v1/chat/completions", {"messages": MSGS, "max_tokens": 2, "temperature": 0})
if st != 200 or d["choices"][0]["logprobs"] is not None:
    bad(f"logprobs without asking: {d}")
st, d = req("/v1/chat/completions", {"messages": MSGS, "max_tokens": 2, "temperature": 0, "logprobs": True})
if st != 200 or any(t["top_logprobs"] != [] for t in d["choices"][0]["logprobs"]["content"]):
    bad(f"logprobs without top_logprobs: {d}")

# text completions: tokens, token_logprobs, top_logprobs, text_offset
body = {"prompt": "The quiet farmer", "max_tokens": 10, "temperature": 0, "logprobs": 2}
st, d = req("/v1/completions", body)
c0 = d["choices"][0] if st == 200 else {}
lp = c0.get("logprobs") or {}
if st != 200 or "".join(lp.get("tokens", [])) != c0.get("text"):
    bad(f"completion logprobs tokens do not join to the text: {st} {d}")
else:
    offs = [0]
    for t in lp["tokens"][:-1]:
        offs.append(offs[-1] + len(t.encode()))
    if lp["text_offset"] != offs:
        bad(f"text_offset {lp['text_offset']} != {offs}")
    for t, l, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        if len(top) != 2 or max(top.values()) != l or t not in top:
            bad(f"completion top_logprobs: {t} {l} {top}")
body["stream"] = True
st, chunks = req("/v1/completions", body)
s_tokens = [t for c in chunks for c2 in c.get("choices", []) if c2.get("logprobs") for t in c2["logprobs"]["tokens"]]
s_offs = [o for c in chunks for c2 in c.get("choices", []) if c2.get("logprobs") for o in c2["logprobs"]["text_offset"]]
if st != 200 or s_tokens != lp.get("tokens") or s_offs != lp.get("text_offset"):
    bad(f"streamed completion logprobs differ: {s_tokens} {s_offs} vs {lp}")

# bad values name the field
for route, b, param in [("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs"),
                        ("/v1/chat/completions", {"messages": MSGS, "top_logprobs": 2}, "top_logprobs"),
                        ("/v1/chat/completions", {"messages": MSGS, "logprobs": "yes"}, "logprobs")]:
    st, d = req(route, b)
    if st != 400 or d["error"]["param"] != param:
        bad(f"{route} {b}: {st} {d}")
print(f"logprobs: {'%d failed' % fails if fails else 'all passed'}")
sys.exit(1 if fails else 0)
