#!/usr/bin/env bash
# curl.sh — `kvsieve serve` end to end with curl on loopback: health, models,
# completions and chat (non-streaming and SSE) against `kvsieve run --temp 0`,
# usage counts, metrics, the API key, every error status (400s with their
# codes, 401, 404, 405, 413, 429 with Retry-After), a client that hangs up
# mid-stream or while waiting (its request is cancelled and its slot freed),
# and SIGTERM with a request running (it is told, the server exits 0).
# Usage: bash curl.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$1; FIX=$2; TMP=$3
DIR=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$DIR/../.." && pwd)
command -v curl >/dev/null 2>&1 || { echo "SKIP: curl not found"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not found (it parses the JSON)"; exit 77; }
mkdir -p "$TMP"
source "$DIR/common.sh"
MODEL="$FIX/models/aidreams260K.gguf"
KEY=curl-test-key
AUTH=(-H "Authorization: Bearer $KEY")
post() { # post PATH BODY OUTFILE -> prints the status
  curl -s -o "$3" -w '%{http_code}' "${AUTH[@]}" -H 'Content-Type: application/json' --data-binary "$2" "$BASE$1"
}
expect_err() { # expect_err PATH BODY STATUS CODE WHAT
  local st; st=$(post "$1" "$2" "$TMP/e.json")
  local code; code=$(jget "$TMP/e.json" 'd["error"]["code"]')
  local typ; typ=$(jget "$TMP/e.json" 'd["error"]["type"]')
  [ "$st" = "$3" ] && [ "$code" = "$4" ] && [ -n "$typ" ] || bad "$5: status $st code '$code' ($(cat "$TMP/e.json"))"
}

ref=$("$KS" run -m "$MODEL" -p "Once upon a time" -n 24 --temp 0 -t 2 2>/dev/null)
[ -n "$ref" ] || bad "kvsieve run gave no reference text"

start_server main -m "$MODEL" --parallel 2 -t 2 --api-key "$KEY" --batch 8

# ----- health, models, API key
[ "$(curl -s "${AUTH[@]}" "$BASE/health")" = '{"status":"ok"}' ] || bad "health"
curl -s "${AUTH[@]}" "$BASE/v1/models" > "$TMP/models.json"
[ "$(jget "$TMP/models.json" 'd["data"][0]["id"]')" = "aidreams260K" ] || bad "models: $(cat "$TMP/models.json")"
[ "$(jget "$TMP/models.json" 'd["data"][0]["kvsieve"]["n_ctx"]')" = "128" ] || bad "models n_ctx"
st=$(curl -s -o "$TMP/e.json" -w '%{http_code}' "$BASE/v1/models")
[ "$st" = 401 ] && [ "$(jget "$TMP/e.json" 'd["error"]["code"]')" = invalid_api_key ] || bad "no key: $st"
st=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer wrong" -d '{"prompt":"x"}' "$BASE/v1/completions")
[ "$st" = 401 ] || bad "wrong key: $st"

# ----- completions and chat, plain and streaming, equal to kvsieve run
st=$(post /v1/completions '{"model":"aidreams260K","prompt":"Once upon a time","max_tokens":24,"temperature":0}' "$TMP/c.json")
[ "$st" = 200 ] || bad "completion status $st: $(cat "$TMP/c.json")"
[ "$(jget "$TMP/c.json" 'd["choices"][0]["text"]')" = "$ref" ] || bad "completion text '$(jget "$TMP/c.json" 'd["choices"][0]["text"]')' != run '$ref'"
[ "$(jget "$TMP/c.json" 'd["object"]')" = text_completion ] || bad "completion object"
[ "$(jget "$TMP/c.json" 'd["choices"][0]["finish_reason"]')" = length ] || bad "finish_reason"
[ "$(jget "$TMP/c.json" 'd["usage"]["completion_tokens"]')" = 24 ] || bad "usage.completion_tokens"
[ "$(jget "$TMP/c.json" 'd["usage"]["total_tokens"] == d["usage"]["prompt_tokens"] + 24')" = True ] || bad "usage.total"
st=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":24,"temperature":0}' "$TMP/h.json")
[ "$st" = 200 ] && [ "$(jget "$TMP/h.json" 'd["choices"][0]["message"]["content"]')" = "$ref" ] || bad "chat: $st $(cat "$TMP/h.json")"
[ "$(jget "$TMP/h.json" 'd["object"]')" = chat.completion ] || bad "chat object"
curl -sN "${AUTH[@]}" -d '{"prompt":"Once upon a time","max_tokens":24,"temperature":0,"stream":true}' "$BASE/v1/completions" > "$TMP/s.txt"
[ "$(sse_text "$TMP/s.txt")" = "$ref"$'\n'DONE$'\n'no-error ] || bad "stream: $(sse_text "$TMP/s.txt")"
curl -sN "${AUTH[@]}" -d '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":24,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}' \
  "$BASE/v1/chat/completions" > "$TMP/hs.txt"
[ "$(sse_text "$TMP/hs.txt")" = "$ref"$'\n'DONE$'\n'no-error ] || bad "chat stream: $(sse_text "$TMP/hs.txt")"
grep -q '"usage":{"prompt_tokens":[0-9]*,"completion_tokens":24' "$TMP/hs.txt" || bad "chat stream usage chunk"
grep -q '"delta":{"role":"assistant"' "$TMP/hs.txt" || bad "chat stream role chunk"
curl -s -D - -o /dev/null "${AUTH[@]}" -d '{"prompt":"hi","max_tokens":2,"stream":true}' "$BASE/v1/completions" \
  | grep -qi '^content-type: text/event-stream' || bad "stream content type"
st=$(post /v1/completions '{"prompt":"Once upon a time","max_tokens":60,"temperature":0,"stop":["petals"]}' "$TMP/c.json")
[ "$(jget "$TMP/c.json" 'd["choices"][0]["text"]')" = ", pixels unfolding like " ] && \
  [ "$(jget "$TMP/c.json" 'd["choices"][0]["finish_reason"]')" = stop ] || bad "stop string: $(cat "$TMP/c.json")"
st=$(post /v1/completions '{"prompt":"Once upon a time","max_tokens":24,"temperature":0,"kvsieve":{"policy":"quest","budget":64}}' "$TMP/c.json")
[ "$st" = 200 ] || bad "quest request: $st $(cat "$TMP/c.json")"

# ----- errors: status, OpenAI code
expect_err /v1/completions '{"prompt": "x",' 400 invalid_json "malformed JSON"
expect_err /v1/completions '{"prompt":"x","max_tokens":"8"}' 400 invalid_type "max_tokens of the wrong type"
expect_err /v1/completions '{"prompt":"x","temperature":[1]}' 400 invalid_type "temperature of the wrong type"
expect_err /v1/completions '{"max_tokens":4}' 400 missing_required_parameter "missing prompt"
expect_err /v1/chat/completions '{"prompt":"x"}' 400 missing_required_parameter "missing messages"
expect_err /v1/completions '{"prompt":"x","kvsieve":{"policy":"nope"}}' 400 unknown_policy "unknown policy"
expect_err /v1/completions '{"prompt":"x","kvsieve":{"policy":"quest","policy_args":"bogus=1"}}' 400 invalid_value "unknown policy argument"
expect_err /v1/completions '{"prompt":"x","max_tokens":0}' 400 invalid_value "max_tokens 0"
expect_err /v1/completions '{"prompt":"x","max_tokens":100000000}' 400 invalid_value "max_tokens huge"
expect_err /v1/completions '{"prompt":"Once upon a time","max_tokens":120}' 400 context_length_exceeded "prompt + max_tokens over the context"
long=$(printf 'once upon a time %.0s' $(seq 1 60))
expect_err /v1/completions "{\"prompt\":\"$long\",\"max_tokens\":1}" 400 context_length_exceeded "prompt over the context"
expect_err /v1/completions '{"prompt":"x","n":3}' 400 unsupported "n > 1"
expect_err /v1/completions '{"prompt":"x","temprature":0}' 400 unknown_parameter "a misspelt field"
expect_err /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"kvsieve":{"polcy":"quest"}}' 400 unknown_parameter "a misspelt kvsieve field"
expect_err /v1/nothing '{}' 404 unknown_url "unknown URL"
st=$(curl -s -o "$TMP/e.json" -w '%{http_code}' "${AUTH[@]}" "$BASE/v1/completions")
[ "$st" = 405 ] || bad "GET on completions: $st"
head -c 9000000 /dev/zero | tr '\0' 'a' > "$TMP/big.txt"
st=$(curl -s -o "$TMP/e.json" -w '%{http_code}' "${AUTH[@]}" --data-binary @"$TMP/big.txt" "$BASE/v1/completions")
[ "$st" = 413 ] || bad "9 MB body: $st"

# ----- metrics
curl -s "${AUTH[@]}" "$BASE/metrics" > "$TMP/metrics.txt"
for m in requests_running requests_waiting tokens_generated_total tokens_per_second kv_bytes_read_total \
         kv_bytes_loaded_total kv_bytes_stored_total selection_seconds_total kv_offload_events_total kv_selection_share; do
  grep -q "^kvsieve_$m " "$TMP/metrics.txt" || bad "metric $m missing"
done
grep -q '^kvsieve_http_responses_total{code="400"} [1-9]' "$TMP/metrics.txt" || bad "400s not counted"
[ "$(metric requests_running)" = 0 ] || bad "requests still running"
stop_server "$PID" main

# ----- 429, disconnects, shutdown: the constructed fixture, one slot, one waiting place
source "$SRC/tests/fixtures/constructed.sh"
unpack_constructed "$SRC" "$TMP/fixture" || { echo "FAIL: cannot unpack the constructed fixture"; exit 1; }
BUNDLED=$CONSTRUCTED   # the constructed fixture: the pace these checks were sized for
start_server busy -m "$BUNDLED" -c 4096 --parallel 1 --max-queue 1 -t 2 --shutdown-grace 1
AUTH=()
LONG='{"prompt":"The quiet farmer","max_tokens":4000,"temperature":0,"kvsieve":{"ignore_eos":true}'
curl -sN -d "$LONG,\"stream\":true}" "$BASE/v1/completions" > "$TMP/a.txt" & CA=$!
for _ in $(seq 1 300); do grep -q '^data: ' "$TMP/a.txt" && break; sleep 0.1; done
grep -q '^data: ' "$TMP/a.txt" || bad "long stream did not start"
curl -s -d "$LONG}" "$BASE/v1/completions" > "$TMP/b.txt" & CB=$!
for _ in $(seq 1 100); do [ "$(metric requests_waiting)" = 1 ] && break; sleep 0.1; done
[ "$(metric requests_waiting)" = 1 ] || bad "second request not waiting"
curl -s -D "$TMP/h429.txt" -o "$TMP/e.json" -d '{"prompt":"x","max_tokens":2}' "$BASE/v1/completions"
grep -q '^HTTP/1.1 429' "$TMP/h429.txt" || bad "queue full: $(head -1 "$TMP/h429.txt")"
grep -qi '^Retry-After: [0-9]' "$TMP/h429.txt" || bad "429 without Retry-After"
[ "$(jget "$TMP/e.json" 'd["error"]["code"]')" = rate_limit_exceeded ] || bad "429 code: $(cat "$TMP/e.json")"
kill "$CA"; wait "$CA" 2>/dev/null   # hang up mid-stream: cancelled, the waiting one gets the slot
for _ in $(seq 1 100); do [ "$(metric requests_waiting)" = 0 ] && break; sleep 0.1; done
[ "$(metric requests_waiting)" = 0 ] && [ "$(metric requests_running)" = 1 ] || bad "slot not freed after disconnect"
kill "$CB"; wait "$CB" 2>/dev/null   # hang up while waiting for a non-streamed answer
for _ in $(seq 1 100); do [ "$(metric requests_running)" = 0 ] && break; sleep 0.1; done
[ "$(metric requests_running)" = 0 ] || bad "non-streaming request not cancelled on disconnect"
grep -q '^kvsieve_requests_total{outcome="cancelled"} 2$' <(curl -s "$BASE/metrics") || bad "cancellations not counted"
# SIGTERM with a stream running: the client is told, the server exits 0
curl -sN -d "$LONG,\"stream\":true}" "$BASE/v1/completions" > "$TMP/d.txt" & CD=$!
for _ in $(seq 1 300); do grep -q '^data: ' "$TMP/d.txt" && break; sleep 0.1; done
stop_server "$PID" busy 30
wait "$CD" 2>/dev/null
out=$(sse_text "$TMP/d.txt")
case "$out" in *$'\n'DONE$'\n'server_shutting_down) ;; *) bad "stream at shutdown: $(tail -c 300 "$TMP/d.txt")";; esac
finish
