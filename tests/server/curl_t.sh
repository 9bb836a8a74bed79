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
echo "T $SECONDS L22" >&2
expect_err() { # expect_err PATH BODY STATUS CODE WHAT
echo "T $SECONDS L23" >&2
  local st; st=$(post "$1" "$2" "$TMP/e.json")
  local code; code=$(jget "$TMP/e.json" 'd["error"]["code"]')
  local typ; typ=$(jget "$TMP/e.json" 'd["error"]["type"]')
  [ "$st" = "$3" ] && [ "$code" = "$4" ] && [ -n "$typ" ] || bad "$5: status $st code '$code' ($(cat "$TMP/e.json"))"
}
echo "T $SECONDS L28" >&2

ref=$("$KS" run -m "$MODEL" -p "Once upon a time" -n 24 --temp 0 -t 2 2>/dev/null)
echo "T $SECONDS L30" >&2
[ -n "$ref" ] || bad "kvsieve run gave no reference text"
echo "T $SECONDS L31" >&2

start_server main -m "$MODEL" --parallel 2 -t 2 --api-key "$KEY" --batch 8
echo "T $SECONDS L33" >&2

# ----- health, models, API key
[ "$(curl -s "${AUTH[@]}" "$BASE/health")" = '{"status":"ok"}' ] || bad "health"
echo "T $SECONDS L36" >&2
curl -s "${AUTH[@]}" "$BASE/v1/models" > "$TMP/models.json"
echo "T $SECONDS L37" >&2
[ "$(jget "$TMP/models.json" 'd["data"][0]["id"]')" = "aidreams260K" ] || bad "models: $(cat "$TMP/models.json")"
echo "T $SECONDS L38" >&2
[ "$(jget "$TMP/models.json" 'd["data"][0]["kvsieve"]["n_ctx"]')" = "128" ] || bad "models n_ctx"
echo "T $SECONDS L39" >&2
st=$(curl -s -o "$TMP/e.json" -w '%{http_code}' "$BASE/v1/models")
echo "T $SECONDS L40" >&2
[ "$st" = 401 ] && [ "$(jget "$TMP/e.json" 'd["error"]["code"]')" = invalid_api_key ] || bad "no key: $st"
echo "T $SECONDS L41" >&2
st=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer wrong" -d '{"prompt":"x"}' "$BASE/v1/completions")
echo "T $SECONDS L42" >&2
[ "$st" = 401 ] || bad "wrong key: $st"
echo "T $SECONDS L43" >&2

# ----- completions and chat, plain and streaming, equal to kvsieve run
st=$(post /v1/completions '{"model":"aidreams260K","prompt":"Once upon a time","max_tokens":24,"temperature":0}' "$TMP/c.json")
echo "T $SECONDS L46" >&2
[ "$st" = 200 ] || bad "completion status $st: $(cat "$TMP/c.json")"
echo "T $SECONDS L47" >&2
[ "$(jget "$TMP/c.json" 'd["choices"][0]["text"]')" = "$ref" ] || bad "completion text '$(jget "$TMP/c.json" 'd["choices"][0]["text"]')' != run '$ref'"
echo "T $SECONDS L48" >&2
[ "$(jget "$TMP/c.json" 'd["object"]')" = text_completion ] || bad "completion object"
echo "T $SECONDS L49" >&2
[ "$(jget "$TMP/c.json" 'd["choices"][0]["finish_reason"]')" = length ] || bad "finish_reason"
echo "T $SECONDS L50" >&2
[ "$(jget "$TMP/c.json" 'd["usage"]["completion_tokens"]')" = 24 ] || bad "usage.completion_tokens"
echo "T $SECONDS L51" >&2
[ "$(jget "$TMP/c.json" 'd["usage"]["total_tokens"] == d["usage"]["prompt_tokens"] + 24')" = True ] || bad "usage.total"
echo "T $SECONDS L52" >&2
st=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":24,"temperature":0}' "$TMP/h.json")
echo "T $SECONDS L53" >&2
[ "$st" = 200 ] && [ "$(jget "$TMP/h.json" 'd["choices"][0]["message"]["content"]')" = "$ref" ] || bad "chat: $st $(cat "$TMP/h.json")"
echo "T $SECONDS L54" >&2
[ "$(jget "$TMP/h.json" 'd["object"]')" = chat.completion ] || bad "chat object"
echo "T $SECONDS L55" >&2
curl -sN "${AUTH[@]}" -d '{"prompt":"Once upon a time","max_tokens":24,"temperature":0,"stream":true}' "$BASE/v1/completions" > "$TMP/s.txt"
echo "T $SECONDS L56" >&2
[ "$(sse_text "$TMP/s.txt")" = "$ref"$'\n'DONE$'\n'no-error ] || bad "stream: $(sse_text "$TMP/s.txt")"
echo "T $SECONDS L57" >&2
curl -sN "${AUTH[@]}" -d '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":24,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}' \
  "$BASE/v1/chat/completions" > "$TMP/hs.txt"
[ "$(sse_text "$TMP/hs.txt")" = "$ref"$'\n'DONE$'\n'no-error ] || bad "chat stream: $(sse_text "$TMP/hs.txt")"
echo "T $SECONDS L60" >&2
grep -q '"usage":{"prompt_tokens":[0-9]*,"completion_tokens":24' "$TMP/hs.txt" || bad "chat stream usage chunk"
echo "T $SECONDS L61" >&2
grep -q '"delta":{"role":"assistant"' "$TMP/hs.txt" || bad "chat stream role chunk"
echo "T $SECONDS L62" >&2
curl -s -D - -o /dev/null "${AUTH[@]}" -d '{"prompt":"hi","max_tokens":2,"stream":true}' "$BASE/v1/completions" \
  | grep -qi '^content-type: text/event-stream' || bad "stream content type"
st=$(post /v1/completions '{"prompt":"Once upon a time","max_tokens":60,"temperature":0,"stop":["petals"]}' "$TMP/c.json")
echo "T $SECONDS L65" >&2
[ "$(jget "$TMP/c.json" 'd["choices"][0]["text"]')" = ", pixels unfolding like " ] && \
  [ "$(jget "$TMP/c.json" 'd["choices"][0]["finish_reason"]')" = stop ] || bad "stop string: $(cat "$TMP/c.json")"
st=$(post /v1/completions '{"prompt":"Once upon a time","max_tokens":24,"temperature":0,"kvsieve":{"policy":"quest","budget":64}}' "$TMP/c.json")
echo "T $SECONDS L68" >&2
[ "$st" = 200 ] || bad "quest request: $st $(cat "$TMP/c.json")"
echo "T $SECONDS L69" >&2

# ----- errors: status, OpenAI code
expect_err /v1/completions '{"prompt": "x",' 400 invalid_json "malformed JSON"
echo "T $SECONDS L72" >&2
expect_err /v1/completions '{"prompt":"x","max_tokens":"8"}' 400 invalid_type "max_tokens of the wrong type"
echo "T $SECONDS L73" >&2
expect_err /v1/completions '{"prompt":"x","temperature":[1]}' 400 invalid_type "temperature of the wrong type"
echo "T $SECONDS L74" >&2
expect_err /v1/completions '{"max_tokens":4}' 400 missing_required_parameter "missing prompt"
echo "T $SECONDS L75" >&2
expect_err /v1/chat/completions '{"prompt":"x"}' 400 missing_required_parameter "missing messages"
echo "T $SECONDS L76" >&2
expect_err /v1/completions '{"prompt":"x","kvsieve":{"policy":"nope"}}' 400 unknown_policy "unknown policy"
echo "T $SECONDS L77" >&2
expect_err /v1/completions '{"prompt":"x","kvsieve":{"policy":"quest","policy_args":"bogus=1"}}' 400 invalid_value "unknown policy argument"
echo "T $SECONDS L78" >&2
expect_err /v1/completions '{"prompt":"x","max_tokens":0}' 400 invalid_value "max_tokens 0"
echo "T $SECONDS L79" >&2
expect_err /v1/completions '{"prompt":"x","max_tokens":100000000}' 400 invalid_value "max_tokens huge"
echo "T $SECONDS L80" >&2
expect_err /v1/completions '{"prompt":"Once upon a time","max_tokens":120}' 400 context_length_exceeded "prompt + max_tokens over the context"
echo "T $SECONDS L81" >&2
long=$(printf 'once upon a time %.0s' $(seq 1 60))
echo "T $SECONDS L82" >&2
expect_err /v1/completions "{\"prompt\":\"$long\",\"max_tokens\":1}" 400 context_length_exceeded "prompt over the context"
echo "T $SECONDS L83" >&2
expect_err /v1/completions '{"prompt":"x","n":3}' 400 unsupported "n > 1"
echo "T $SECONDS L84" >&2
expect_err /v1/nothing '{}' 404 unknown_url "unknown URL"
echo "T $SECONDS L85" >&2
st=$(curl -s -o "$TMP/e.json" -w '%{http_code}' "${AUTH[@]}" "$BASE/v1/completions")
echo "T $SECONDS L86" >&2
[ "$st" = 405 ] || bad "GET on completions: $st"
echo "T $SECONDS L87" >&2
head -c 9000000 /dev/zero | tr '\0' 'a' > "$TMP/big.txt"
echo "T $SECONDS L88" >&2
st=$(curl -s -o "$TMP/e.json" -w '%{http_code}' "${AUTH[@]}" --data-binary @"$TMP/big.txt" "$BASE/v1/completions")
echo "T $SECONDS L89" >&2
[ "$st" = 413 ] || bad "9 MB body: $st"
echo "T $SECONDS L90" >&2

# ----- metrics
curl -s "${AUTH[@]}" "$BASE/metrics" > "$TMP/metrics.txt"
echo "T $SECONDS L93" >&2
for m in requests_running requests_waiting tokens_generated_total tokens_per_second kv_bytes_read_total \
         kv_bytes_loaded_total kv_bytes_stored_total selection_seconds_total kv_offload_events_total kv_selection_share; do
  grep -q "^kvsieve_$m " "$TMP/metrics.txt" || bad "metric $m missing"
done
echo "T $SECONDS L97" >&2
grep -q '^kvsieve_http_responses_total{code="400"} [1-9]' "$TMP/metrics.txt" || bad "400s not counted"
echo "T $SECONDS L98" >&2
[ "$(metric requests_running)" = 0 ] || bad "requests still running"
echo "T $SECONDS L99" >&2
stop_server "$PID" main
echo "T $SECONDS L100" >&2

# ----- 429, disconnects, shutdown: the bundled model, one slot, one waiting place
BUNDLED="$SRC/models/kvsieve-default.gguf"
echo "T $SECONDS L103" >&2
start_server busy -m "$BUNDLED" -c 4096 --parallel 1 --max-queue 1 -t 2 --shutdown-grace 1
echo "T $SECONDS L104" >&2
AUTH=()
echo "T $SECONDS L105" >&2
LONG='{"prompt":"The quiet farmer","max_tokens":4000,"temperature":0,"kvsieve":{"ignore_eos":true}'
echo "T $SECONDS L106" >&2
curl -sN -d "$LONG,\"stream\":true}" "$BASE/v1/completions" > "$TMP/a.txt" & CA=$!
echo "T $SECONDS L107" >&2
for _ in $(seq 1 300); do grep -q '^data: ' "$TMP/a.txt" && break; sleep 0.1; done
echo "T $SECONDS L108" >&2
grep -q '^data: ' "$TMP/a.txt" || bad "long stream did not start"
echo "T $SECONDS L109" >&2
curl -s -d "$LONG}" "$BASE/v1/completions" > "$TMP/b.txt" & CB=$!
echo "T $SECONDS L110" >&2
for _ in $(seq 1 100); do [ "$(metric requests_waiting)" = 1 ] && break; sleep 0.1; done
echo "T $SECONDS L111" >&2
[ "$(metric requests_waiting)" = 1 ] || bad "second request not waiting"
echo "T $SECONDS L112" >&2
curl -s -D "$TMP/h429.txt" -o "$TMP/e.json" -d '{"prompt":"x","max_tokens":2}' "$BASE/v1/completions"
echo "T $SECONDS L113" >&2
grep -q '^HTTP/1.1 429' "$TMP/h429.txt" || bad "queue full: $(head -1 "$TMP/h429.txt")"
echo "T $SECONDS L114" >&2
grep -qi '^Retry-After: [0-9]' "$TMP/h429.txt" || bad "429 without Retry-After"
echo "T $SECONDS L115" >&2
[ "$(jget "$TMP/e.json" 'd["error"]["code"]')" = rate_limit_exceeded ] || bad "429 code: $(cat "$TMP/e.json")"
echo "T $SECONDS L116" >&2
kill "$CA"; wait "$CA" 2>/dev/null   # hang up mid-stream: cancelled, the waiting one gets the slot
echo "T $SECONDS L117" >&2
for _ in $(seq 1 100); do [ "$(metric requests_waiting)" = 0 ] && break; sleep 0.1; done
echo "T $SECONDS L118" >&2
[ "$(metric requests_waiting)" = 0 ] && [ "$(metric requests_running)" = 1 ] || bad "slot not freed after disconnect"
echo "T $SECONDS L119" >&2
kill "$CB"; wait "$CB" 2>/dev/null   # hang up while waiting for a non-streamed answer
echo "T $SECONDS L120" >&2
for _ in $(seq 1 100); do [ "$(metric requests_running)" = 0 ] && break; sleep 0.1; done
echo "T $SECONDS L121" >&2
[ "$(metric requests_running)" = 0 ] || bad "non-streaming request not cancelled on disconnect"
echo "T $SECONDS L122" >&2
grep -q '^kvsieve_requests_total{outcome="cancelled"} 2$' <(curl -s "$BASE/metrics") || bad "cancellations not counted"
echo "T $SECONDS L123" >&2
# SIGTERM with a stream running: the client is told, the server exits 0
curl -sN -d "$LONG,\"stream\":true}" "$BASE/v1/completions" > "$TMP/d.txt" & CD=$!
echo "T $SECONDS L125" >&2
for _ in $(seq 1 300); do grep -q '^data: ' "$TMP/d.txt" && break; sleep 0.1; done
echo "T $SECONDS L126" >&2
stop_server "$PID" busy 30
echo "T $SECONDS L127" >&2
wait "$CD" 2>/dev/null
echo "T $SECONDS L128" >&2
out=$(sse_text "$TMP/d.txt")
echo "T $SECONDS L129" >&2
case "$out" in *$'\n'DONE$'\n'server_shutting_down) ;; *) bad "stream at shutdown: $(tail -c 300 "$TMP/d.txt")";; esac
echo "T $SECONDS L130" >&2
finish
echo "T $SECONDS L131" >&2
