#!/usr/bin/env bash
# multiturn.sh — multi-turn chat through `kvsieve serve` on loopback: a four-turn
# conversation (each answer sent back as the assistant's turn) to the bundled
# model, which has no chat template, and a three-turn one to a tiny generated
# model with the phi-3 vocabulary and its template (executed: src/tokenizer/jinja.c).  Every turn must answer;
# its prompt_tokens must be the token count of the conversation rendered as
# the docs say (tokenized by `kvsieve tokenize`), so a client sees exactly
# which prompt ran; and the last turn's greedy text must equal what `kvsieve
# run` prints for that rendered prompt.  tools/bench_serve.py --turns runs a
# small multi-turn benchmark against the same server.  Then every malformed message list a
# client could send gets its 400 with the code and param that name it.
# Usage: bash multiturn.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$1; FIX=$2; TMP=$3
DIR=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$DIR/../.." && pwd)
command -v curl >/dev/null 2>&1 || { echo "SKIP: curl not found"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not found (it drives the conversation)"; exit 77; }
mkdir -p "$TMP"
source "$DIR/common.sh"

# converse NAME TURNS MAXTOK FAMILY: runs the conversation against $BASE,
# writing $TMP/NAME.turnK.{prompt,answer,usage}; exits non-zero on a failed turn.
converse() {
  python3 - "$BASE" "$TMP/$1" "$2" "$3" "$4" <<'PY'
import json, sys, urllib.request
base, out, turns, maxtok, fam = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
questions = ["The pass key is 31415. Remember it.", "What is the pass key?", "Say it again.", "Thanks. Once more?"]
msgs = [{"role": "system", "content": "You are a careful assistant."}]

def render(msgs):
    """The prompt the server must build (docs/SERVER.md, tokenizer_chat.c)."""
    if fam == "none":  # non-empty contents, a blank line between (system runs: a newline)
        text, prev = "", None
        for m in msgs:
            if not m["content"]:
                continue
            if prev:
                text += "\n" if prev == "system" and m["role"] == "system" else "\n\n"
            text += m["content"]
            prev = m["role"]
        return text
    assert fam == "phi3"
    # the GGUF's own template, executed: it writes no system turn, and each
    # user turn carries the generation prompt; the BOS it writes first is
    # the encoder's
    return "".join("<|user|>\n%s<|end|>\n<|assistant|>\n" % m["content"] if m["role"] == "user"
                   else "%s<|end|>\n" % m["content"] if m["role"] == "assistant" else "" for m in msgs)

last = 0
for k in range(turns):
    # content as a plain string and, on the second turn, as text parts
    q = questions[k]
    msgs.append({"role": "user", "content": q if k != 1 else [{"type": "text", "text": q[:8]}, {"type": "text", "text": q[8:]}]})
    body = {"model": "m", "messages": msgs, "max_tokens": maxtok, "temperature": 0}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        d = json.load(urllib.request.urlopen(req, timeout=120))
    except urllib.error.HTTPError as e:
        sys.exit("turn %d: HTTP %d %s" % (k + 1, e.code, e.read().decode()))
    ch = d["choices"][0]
    answer = ch["message"]["content"]
    assert ch["message"]["role"] == "assistant", d
    assert ch["finish_reason"] in ("stop", "length"), d
    pt = d["usage"]["prompt_tokens"]
    assert pt > last, "turn %d: prompt_tokens %d did not grow past %d" % (k + 1, pt, last)
    last = pt
    if k == 1:
        msgs[-1]["content"] = q
    with open("%s.turn%d.prompt" % (out, k + 1), "w") as f:
        f.write(render(msgs))
    with open("%s.turn%d.answer" % (out, k + 1), "w") as f:
        f.write(answer)
    with open("%s.turn%d.usage" % (out, k + 1), "w") as f:
        f.write("%d\n" % pt)
    msgs.append({"role": "assistant", "content": answer})
print("conversation of %d turns done" % turns)
PY
}

# check_turns NAME TURNS MODEL SPECIAL(--special or "")
check_turns() {
  for k in $(seq 1 "$2"); do
    local want got
    want=$("$KS" tokenize -m "$3" -f "$TMP/$1.turn$k.prompt" --bos $4 --json 2>/dev/null |
           python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
    got=$(cat "$TMP/$1.turn$k.usage")
    [ "$want" = "$got" ] || bad "$1 turn $k: prompt_tokens $got, the rendered conversation has $want tokens"
  done
}

# ----- the bundled model: no chat template, four turns
MODEL="$SRC/models/kvsieve-default.gguf"
[ -f "$MODEL" ] || MODEL="$FIX/models/aidreams260K.gguf"
start_server plain -m "$MODEL" --parallel 2 -t 2 -c 512
converse plain 4 12 none || bad "plain conversation (above)"
check_turns plain 4 "$MODEL" ""
ref=$("$KS" run -m "$MODEL" -f "$TMP/plain.turn4.prompt" -n 12 --temp 0 -t 2 -c 512 2>/dev/null)
[ "$ref" = "$(cat "$TMP/plain.turn4.answer")" ] ||
  bad "plain turn 4: served '$(cat "$TMP/plain.turn4.answer")', kvsieve run on the rendered prompt '$ref'"

# ----- tools/bench_serve.py's multi-turn mode: every turn of every conversation completes, prompts grow
timeout 120 python3 "$SRC/tools/bench_serve.py" --url "$BASE" --turns 3 -n 2 -R 2 --input-len 80 --question-len 8 \
  --output-len 4 --json > "$TMP/bench.json" 2> "$TMP/bench.err" || bad "bench_serve --turns: $(cat "$TMP/bench.err")"
python3 - "$TMP/bench.json" <<'PY' || bad "bench_serve multi-turn report: $(cat "$TMP/bench.json")"
import json, sys
r = json.loads(open(sys.argv[1]).readline())
assert r["mode"] == "multi-turn" and r["succeeded"] == 2 and r["failed"] == 0, r
t = r["turns"]
assert [x["turn"] for x in t] == [1, 2, 3] and all(x["completed"] == 2 and x["ttft_p50_ms"] > 0 for x in t), t
assert t[0]["prompt_tokens_p50"] < t[1]["prompt_tokens_p50"] < t[2]["prompt_tokens_p50"], t
PY

# ----- malformed message lists: 400 with the code and param that say why
post() { curl -s -o "$TMP/e.json" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary "$1" "$BASE/v1/chat/completions"; }
expect_err() { # BODY CODE PARAM WHAT
  local st code param
  st=$(post "$1"); code=$(jget "$TMP/e.json" 'd["error"]["code"]'); param=$(jget "$TMP/e.json" 'd["error"]["param"]')
  [ "$st" = 400 ] && [ "$code" = "$2" ] && [ "$param" = "$3" ] || bad "$4: status $st ($(cat "$TMP/e.json"))"
}
U='{"role":"user","content":"hi"}'
expect_err '{"messages":[]}' invalid_value messages "empty list"
expect_err '{"messages":[{"role":"user"}]}' missing_required_parameter 'messages[0].content' "missing content"
expect_err '{"messages":[{"role":"user","content":42}]}' invalid_type 'messages[0].content' "non-string content"
expect_err '{"messages":[{"content":"hi"}]}' missing_required_parameter 'messages[0].role' "missing role"
expect_err "{\"messages\":[$U,{\"role\":\"narrator\",\"content\":\"x\"}]}" invalid_value 'messages[1].role' "unknown role"
expect_err "{\"messages\":[$U,{\"role\":\"tool\",\"content\":\"x\"}]}" missing_required_parameter 'messages[1].tool_call_id' "tool role without its call id"
expect_err "{\"messages\":[$U,{\"role\":\"function\",\"name\":\"f\",\"content\":\"x\"}]}" unsupported 'messages[1].role' "function role"
expect_err "{\"messages\":[$U,{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"1\",\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}]}" \
  invalid_type 'messages[1].tool_calls[0]' "assistant tool call without arguments"
expect_err '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}' unsupported \
  'messages[0].content[0]' "image part"
expect_err '{"messages":[{"role":"system","content":"s"},{"role":"assistant","content":"a"}]}' invalid_value messages "no user turn"
post "{\"messages\":[$U,{\"role\":\"function\",\"content\":\"x\"}]}" >/dev/null
grep -q 'not supported' "$TMP/e.json" || bad "function role message: $(cat "$TMP/e.json")"
stop_server "$PID" plain

# ----- a chat template: a tiny model with the phi-3 vocabulary, three turns
PHI="$TMP/tiny-phi3.gguf"
"$KS" gen-model --shape tiny-llama --type q8_0 --layers 1 --ctx 512 \
  --vocab-from "$FIX/tokenizer/ggml-vocab-phi-3.gguf" --out "$PHI" > /dev/null 2>&1 || bad "gen-model (phi-3 vocabulary)"
if [ -f "$PHI" ]; then
  start_server phi3 -m "$PHI" --parallel 2 -t 2 -c 512
  converse phi3 3 6 phi3 || bad "phi-3 conversation (above)"
  check_turns phi3 3 "$PHI" --special
  stop_server "$PID" phi3
fi
finish
