#!/usr/bin/env python3
"""ttft.py — time to first token of one streamed completion (docs/BENCHMARKS.md, "Prefix cache").

    tools/ttft.py URL PROMPT_FILE [EXTRA_JSON]

Sends PROMPT_FILE's text to URL/v1/completions (greedy, 16 tokens, streamed
with stream_options.include_usage, cache_prompt true unless EXTRA_JSON says
otherwise) and prints one JSON line: ttft_s (from sending the request to the
first chunk with text), total_s, the usage object (kvsieve's carries
prompt_tokens_details.cached_tokens), llama-server's timings when present,
and the text.  Works against kvsieve serve and llama-server alike.
"""
import http.client
import json
import sys
import time
import urllib.parse


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    url = urllib.parse.urlparse(sys.argv[1])
    with open(sys.argv[2], encoding="utf-8") as f:
        prompt = f.read()
    body = {"prompt": prompt, "max_tokens": 16, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "cache_prompt": True}
    if len(sys.argv) > 3:
        body.update(json.loads(sys.argv[3]))
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=3600)
    t0 = time.time()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    ttft, text, usage, timings = None, "", None, None
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        d = json.loads(line[6:])
        for ch in d.get("choices", []):
            t = ch.get("text") or ""
            if t and ttft is None:
                ttft = time.time() - t0
            text += t
        usage = d.get("usage") or usage
        timings = d.get("timings") or timings
    total = time.time() - t0
    print(json.dumps({"ttft_s": round(ttft if ttft is not None else total, 3), "total_s": round(total, 3),
                      "usage": usage, "timings": timings, "text": text}))


if __name__ == "__main__":
    main()
