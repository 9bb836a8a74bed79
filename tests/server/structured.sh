#!/usr/bin/env bash
# structured.sh — response_format through `kvsieve serve` on loopback: the
# bundled model (tiny: its text is junk) answers under a JSON schema 20
# times with 20 seeds at temperature 1, and every answer must parse and
# validate (a validator of the supported subset below); json_object answers
# must be JSON objects; a budget barely above the schema's shortest
# document still closes it; streaming delivers the same kind of document;
# and a schema keyword the sampler cannot enforce is a 400 naming it.
# Usage: bash structured.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$1; FIX=$2; TMP=$3
DIR=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$DIR/../.." && pwd)
command -v curl >/dev/null 2>&1 || { echo "SKIP: curl not found"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not found (it checks the documents)"; exit 77; }
mkdir -p "$TMP"
source "$DIR/common.sh"

MODEL="$SRC/models/kvsieve-default.gguf"
[ -f "$MODEL" ] || MODEL="$FIX/models/aidreams260K.gguf"
start_server structured -m "$MODEL" --parallel 4 -t 2 -c 512

python3 - "$BASE" <<'PY' || bad "structured answers (above)"
import json, sys, urllib.request, urllib.error
base = sys.argv[1]
schema = {"type": "object",
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                         "color": {"enum": ["red", "green", "blue"]},
                         "tags": {"type": "array", "items": {"type": "string"}},
                         "ok": {"type": "boolean"}, "score": {"type": "number"},
                         "pet": {"type": "object", "properties": {"kind": {"type": "string"}, "legs": {"type": "integer"}},
                                 "required": ["kind"], "additionalProperties": False}},
          "required": ["name", "age", "color"], "additionalProperties": False}

def validate(s, v):
    if "enum" in s:
        return v in s["enum"] and type(v) in (type(e) for e in s["enum"])
    t = s.get("type")
    if t is None:
        return True
    if t == "string": return isinstance(v, str)
    if t == "integer": return isinstance(v, int) and not isinstance(v, bool)
    if t == "number": return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == "boolean": return isinstance(v, bool)
    if t == "null": return v is None
    if t == "array": return isinstance(v, list) and all(validate(s.get("items", {}), x) for x in v)
    if t == "object":
        if not isinstance(v, dict): return False
        props = s.get("properties")
        if any(r not in v for r in s.get("required", [])): return False
        return props is None or all(k in props and validate(props[k], x) for k, x in v.items())
    return False

def post(body, stream=False):
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=120)

msgs = [{"role": "user", "content": "Describe a person as JSON."}]

def one(seed):  # four at a time: the server batches them (--parallel 4)
    body = {"messages": msgs, "max_tokens": 80, "temperature": 1.0, "seed": seed,
            "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}}
    text = json.load(post(body))["choices"][0]["message"]["content"]
    try:
        return seed, text, validate(schema, json.loads(text))
    except ValueError:
        return seed, text, False

from concurrent.futures import ThreadPoolExecutor
with ThreadPoolExecutor(4) as ex:
    results = list(ex.map(one, range(1, 21)))
fails = 0
for seed, text, ok in results:
    if not ok:
        fails += 1
        print("seed %d: not a valid document: %r" % (seed, text))
print("json_schema: %d of 20 valid" % (20 - fails))
assert fails == 0

for seed in range(1, 6):  # json_object: any object
    body = {"messages": msgs, "max_tokens": 40, "temperature": 1.0, "seed": seed,
            "response_format": {"type": "json_object"}}
    text = json.load(post(body))["choices"][0]["message"]["content"]
    assert isinstance(json.loads(text), dict), "json_object seed %d: %r" % (seed, text)

# a budget just above the shortest document ({"age":0,"name":"","color":"red"}: 34 bytes)
for seed in range(1, 4):
    body = {"messages": msgs, "max_tokens": 36, "temperature": 1.0, "seed": seed,
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    text = json.load(post(body))["choices"][0]["message"]["content"]
    assert validate(schema, json.loads(text)), "tight budget, seed %d: %r" % (seed, text)

# streaming
body = {"messages": msgs, "max_tokens": 60, "temperature": 1.0, "seed": 7, "stream": True,
        "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
text = ""
for line in post(body):
    line = line.decode().strip()
    if line.startswith("data: ") and line != "data: [DONE]":
        for ch in json.loads(line[6:]).get("choices", []):
            text += ch.get("delta", {}).get("content") or ""
assert validate(schema, json.loads(text)), "stream: %r" % text

# refusals: 400 naming what is wrong
def expect_400(rf, param, words, extra=None):
    body = {"messages": msgs, "response_format": rf}
    body.update(extra or {})
    try:
        post(body)
    except urllib.error.HTTPError as e:
        d = json.load(e)
        assert e.code == 400 and d["error"]["param"] == param and all(w in d["error"]["message"] for w in words), d
        return
    raise AssertionError("accepted: %r" % rf)
expect_400({"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "^a"}}},
           "response_format.json_schema.schema", ["'pattern'"])
expect_400({"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"anyOf": []}}}}},
           "response_format.json_schema.schema", ["'anyOf'", "/properties/a"])
expect_400({"type": "json_schema", "json_schema": {}}, "response_format.json_schema.schema", ["schema"])
expect_400({"type": "xml"}, "response_format.type", ["json_schema"])
expect_400({"type": "json_schema", "json_schema": {"schema": schema}}, "max_tokens", ["shortest"], {"max_tokens": 10})
print("structured output checks passed")
PY
stop_server "$PID" structured
finish
