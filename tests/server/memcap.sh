#!/usr/bin/env bash
# memcap.sh — the server under --mem-cap (the engine's memory plan, R = the
# slots of a context): two quest requests grow their sequences past the
# plan's thresholds, so whole layers move to the slow tier while they decode
# (offload events, KV bytes in the slow tier, loads and stores), and their
# text still equals `kvsieve run` without any cap (nothing lost); a third
# request of another policy must wait (both slots taken, and one context at
# a time under a cap) and runs when they are done, also exact; a request
# whose worst case does not fit the cap even with every layer offloaded is
# refused with context_length_exceeded (never truncated), even alone; the idle context
# with offloaded layers is recycled, so later requests start all-fast.
# Usage: bash memcap.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$1; FIX=$2; TMP=$3
DIR=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$DIR/../.." && pwd)
command -v curl >/dev/null 2>&1 || { echo "SKIP: curl not found"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not found (it parses the JSON)"; exit 77; }
mkdir -p "$TMP"
source "$DIR/common.sh"
source "$SRC/tests/fixtures/constructed.sh"
unpack_constructed "$SRC" "$TMP/fixture" || { echo "FAIL: cannot unpack the constructed fixture"; exit 1; }
MODEL=$CONSTRUCTED   # the constructed fixture: the caps below are sized for its KV (6.8 KiB a token)
N=300
Q='"policy":"quest","budget":64'
ref1=$("$KS" run -m "$MODEL" -c 2048 -p "The quiet farmer" -n $N --temp 0 --ignore-eos -t 2 --policy quest --budget 64 2>/dev/null)
ref2=$("$KS" run -m "$MODEL" -c 2048 -p "A long road" -n $N --temp 0 --ignore-eos -t 2 --policy quest --budget 64 2>/dev/null)
ref3=$("$KS" run -m "$MODEL" -c 2048 -p "In the morning" -n 40 --temp 0 --ignore-eos -t 2 --policy streaming --budget 64 2>/dev/null)

# 39 MB: 2 sequences of this model stay all-fast up to ~218 tokens each (the plan counts the sum of their
# lengths); one fits with every layer offloaded up to ~1200 tokens
start_server cap -m "$MODEL" -c 2048 --parallel 2 -t 2 --mem-cap 39M --policy quest --budget 64
grep -q 'memory plan: cap' "$TMP/cap.err" || bad "no memory plan at start: $(cat "$TMP/cap.err")"
body() { echo "{\"prompt\":\"$1\",\"max_tokens\":$2,\"temperature\":0,\"stream\":true,\"kvsieve\":{\"ignore_eos\":true$3}}"; }
# the three requests and the watch over /metrics (memcap_watch.py: one process sampling as fast as the
# server answers; a curl-and-sed loop missed the slow-tier window on a busy host)
read -r _ waited _ slow _ offl < <(python3 "$DIR/memcap_watch.py" "$BASE" "$TMP" "$(body "The quiet farmer" $N ",$Q")" \
  "$(body "A long road" $N ",$Q")" "$(body "In the morning" 40 ',"policy":"streaming","budget":64')")
[ "${waited:-0}" = 1 ] || bad "the third request never waited"
[ "${slow:-0}" -gt 0 ] && [ "${offl:-0}" -gt 0 ] || bad "no KV in the slow tier while the sequences grew (slow bytes $slow, layers $offl)"
for i in 1 2 3; do
  eval "want=\$ref$i"
  got=$(sse_text "$TMP/r$i.txt")
  [ "$got" = "$want"$'\n'DONE$'\n'no-error ] || bad "request $i under the cap differs from kvsieve run:"$'\n'"$(echo "$got" | head -c 300)"$'\n'"want: $(echo "$want" | head -c 300)"
done
curl -s "$BASE/metrics" > "$TMP/m.txt"
ev=$(sed -n 's/^kvsieve_kv_offload_events_total \([0-9]*\)$/\1/p' "$TMP/m.txt")
st=$(sed -n 's/^kvsieve_kv_bytes_stored_total \([0-9]*\)$/\1/p' "$TMP/m.txt")
ld=$(sed -n 's/^kvsieve_kv_bytes_loaded_total \([0-9]*\)$/\1/p' "$TMP/m.txt")
[ "${ev:-0}" -gt 0 ] && [ "${st:-0}" -gt 0 ] && [ "${ld:-0}" -gt 0 ] || bad "offload events $ev, stored $st, loaded $ld"
echo "memcap: peak slow-tier KV $slow bytes, $offl layers offloaded, $ev offload events, $st bytes stored, $ld loaded"
# a worst case (prompt + max_tokens) beyond what fits with every layer offloaded: refused, not truncated
code=$(curl -s -d '{"prompt":"The quiet farmer","max_tokens":2000,"kvsieve":{"ignore_eos":true}}' "$BASE/v1/completions" \
  -o "$TMP/e.json" -w '%{http_code}')
[ "$code" = 400 ] && [ "$(jget "$TMP/e.json" 'd["error"]["code"]')" = context_length_exceeded ] && \
  grep -q 'memory cap' "$TMP/e.json" || bad "over the cap: $code $(cat "$TMP/e.json")"
# the context whose layers were offloaded is recreated once idle
for _ in $(seq 1 600); do [ "$(metric contexts_recycled_total)" -ge 1 ] 2>/dev/null && break; sleep 0.1; done  # up to 60 s (a busy host)
[ "$(metric contexts_recycled_total)" -ge 1 ] 2>/dev/null || bad "the offloaded context was not recycled"
[ "$(metric kv_bytes_fast)" = 0 ] && [ "$(metric kv_bytes_slow)" = 0 ] || bad "KV held after every request ended"
# pausing is exported (tests/server/test_sched.c forces pauses; these two requests fit side by side)
[ "$(metric requests_paused)" = 0 ] && [ -n "$(metric request_pauses_total)" ] && \
  [ "$(metric request_resumes_total)" = "$(metric request_pauses_total)" ] || bad "pause metrics: $(grep pause "$TMP/m.txt")"
stop_server "$PID" cap
finish
