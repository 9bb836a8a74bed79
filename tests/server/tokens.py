#!/usr/bin/env python3
"""tokens.py — the checks of tests/server/tokens.sh, in one process (one
interpreter start instead of one per request).

Usage: tokens.py BASE KEY plain|phi3
"""
import json
import sys
import urllib.error
import urllib.request

base, key, which = sys.argv[1:4]
fails = 0


def post(route, body, auth=True, method="POST"):
    data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    rq = urllib.request.Request(base + route, data=data if method == "POST" else None, method=method,
                                headers={"Content-Type": "application/json"})
    if auth and key:
        rq.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(rq, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def bad(msg):
    global fails
    fails += 1
    print("FAIL:", msg)


def check(route, body, pred, what):
    st, d = post(route, body)
    if st != 200 or not pred(d):
        bad(f"{what}: {st} {d}")
    return d


def expect_err(route, body, code, param):
    st, d = post(route, body)
    got = (d or {}).get("error", {})
    if st != 400 or got.get("code") != code or got.get("param") != param:
        bad(f"{route} {body}: want 400 {code} {param}, got {st} {d}")


if which == "plain":
    st, _ = post("/tokenize", {"content": "x"}, auth=False)
    if st != 401:
        bad(f"/tokenize without the key: {st}")
    text = "The quiet farmer walks near the old bridge. Caf\u00e9 \u2603"
    ids = check("/tokenize", {"content": text}, lambda d: len(d["tokens"]) > 5 and
                all(isinstance(t, int) for t in d["tokens"]), "tokenize")["tokens"]
    check("/tokenize", {"content": text, "add_special": True}, lambda d: d["tokens"] == [1] + ids,
          "add_special prepends BOS")
    check("/detokenize", {"tokens": ids}, lambda d: d["content"].strip() == text, "detokenize(tokenize(text)) == text")
    d = check("/tokenize", {"content": text, "with_pieces": True},
              lambda d: [p["id"] for p in d["tokens"]] == ids, "with_pieces: the same ids")
    pieces = [p["piece"] for p in d["tokens"]]
    if not any(isinstance(p, list) for p in pieces):
        bad(f"with_pieces: no byte piece for a part of a character: {pieces}")
    joined = bytes(b for p in pieces for b in (p.encode() if isinstance(p, str) else p)).decode()
    if joined.strip() != text:
        bad(f"pieces do not join to the text: {joined!r}")
    check("/tokenize", {"content": ""}, lambda d: d["tokens"] == [], "empty content")
    check("/detokenize", {"tokens": []}, lambda d: d["content"] == "", "no tokens")
    check("/apply-template", {"messages": [{"role": "system", "content": "Doc"}, {"role": "user", "content": "Hi"}]},
          lambda d: d["prompt"] == "Doc\n\nHi", "apply-template without a template joins the contents")
    for route, body, code, param in [
        ("/tokenize", "nope", "invalid_json", None),
        ("/tokenize", "[1]", "invalid_json", None),
        ("/tokenize", "{}", "missing_required_parameter", "content"),
        ("/tokenize", '{"content":5}', "invalid_type", "content"),
        ("/tokenize", '{"content":"a","add_special":1}', "invalid_type", "add_special"),
        ("/tokenize", '{"content":"a","with_pieces":"yes"}', "invalid_type", "with_pieces"),
        ("/tokenize", '{"content":"a","parse_special":null,"with_pieces":[]}', "invalid_type", "with_pieces"),
        ("/detokenize", "{}", "missing_required_parameter", "tokens"),
        ("/detokenize", '{"tokens":"1 2"}', "invalid_type", "tokens"),
        ("/detokenize", '{"tokens":[1,2.5]}', "invalid_type", "tokens[1]"),
        ("/detokenize", '{"tokens":[1,"2"]}', "invalid_type", "tokens[1]"),
        ("/detokenize", '{"tokens":[-1]}', "invalid_value", "tokens[0]"),
        ("/detokenize", '{"tokens":[1,2,99999999]}', "invalid_value", "tokens[2]"),
        ("/detokenize", '{"tokens":[1e300]}', "invalid_value", "tokens[0]"),
        ("/apply-template", "{}", "missing_required_parameter", "messages"),
        ("/apply-template", '{"messages":[]}', "invalid_value", "messages"),
        ("/apply-template", '{"messages":[{"role":"bot","content":"x"}]}', "invalid_value", "messages[0].role"),
        ("/apply-template", '{"messages":[{"role":"user"}]}', "missing_required_parameter", "messages[0].content"),
        ("/tokenize", '{"content":"a","add_specials":true}', "unknown_parameter", "add_specials"),
        ("/detokenize", '{"tokens":[1],"pieces":true}', "unknown_parameter", "pieces"),
        ("/apply-template", '{"messages":[{"role":"user","content":"x"}],"add_generation":true}', "unknown_parameter",
         "add_generation"),
    ]:
        expect_err(route, body, code, param)
    st, _ = post("/detokenize", "", method="GET")
    if st != 405:
        bad(f"GET /detokenize: {st}")
else:
    # the rendering of the phi-3 vocabulary's own chat template (the GGUF's
    # template comes first; this one drops system messages, as the published
    # Phi-3 template does), and the prompt a chat completion counts
    msgs = [{"role": "system", "content": "Doc"}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Yes"}, {"role": "user", "content": "Why?"}]
    want = "<|user|>\nHi<|end|>\n<|assistant|>\nYes<|end|>\n<|user|>\nWhy?<|end|>\n<|assistant|>\n"
    prompt = check("/apply-template", {"messages": msgs}, lambda d: d["prompt"] == want, "phi-3 rendering")["prompt"]
    n = len(check("/tokenize", {"content": prompt, "add_special": True}, lambda d: len(d["tokens"]) > 10,
                  "tokenize the rendering")["tokens"])
    check("/v1/chat/completions", {"messages": msgs, "max_tokens": 1},
          lambda d: d["usage"]["prompt_tokens"] == n, f"the chat prompt is the rendering tokenized ({n} tokens)")
    check("/tokenize", {"content": "<|end|>", "with_pieces": True},
          lambda d: len(d["tokens"]) == 1 and d["tokens"][0]["piece"] == "<|end|>", "parse_special: one special token")
    check("/tokenize", {"content": "<|end|>", "parse_special": False}, lambda d: len(d["tokens"]) > 1,
          "parse_special false: its text")
print(f"{which}: {'%d failed' % fails if fails else 'all passed'}")
sys.exit(1 if fails else 0)
