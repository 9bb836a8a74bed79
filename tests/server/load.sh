#!/usr/bin/env bash
# load.sh — the bounded load test: 64 requests over 16 concurrent clients on
# loopback (load.py), within 90 s, against a server with 4 slots: good
# requests of several policies (plain and streamed, completions and chat,
# each answer equal to `kvsieve run` alone), clients that hang up mid-stream
# or while waiting, and malformed requests mixed in.  Then: the server is
# alive and healthy, nothing is running or waiting, every good or hung-up
# request is accounted for (completed or cancelled, none failed), the KV it
# held is gone, its resident memory is back near the idle level measured
# after a warm-up, and SIGTERM stops it with exit 0 (under ASan: no leaks).
# Usage: bash load.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$1; FIX=$2; TMP=$3
DIR=$(cd "$(dirname "$0")" && pwd)
command -v curl >/dev/null 2>&1 || { echo "SKIP: curl not found"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not found (the load client)"; exit 77; }
mkdir -p "$TMP"
source "$DIR/common.sh"
MODEL="$FIX/models/aidreams260K.gguf"
SEED=${KVSIEVE_LOAD_SEED:-19}

# prompt | max_tokens | kvsieve object | `kvsieve run` flags | path
CASES=(
  "Once upon a time|40|{}||/v1/completions"
  "The little dog ran to the river and|30|{\"policy\":\"quest\",\"budget\":32,\"page\":8}|--policy quest --budget 32 --page 8|/v1/completions"
  "In a land far away there lived a king|35|{\"policy\":\"streaming\",\"budget\":40}|--policy streaming --budget 40|/v1/chat/completions"
  "Lily wanted to play with her|25|{}||/v1/chat/completions"
  "The sun was warm and the birds|30|{\"policy\":\"snapkv\",\"budget\":32}|--policy snapkv --budget 32|/v1/completions"
)
python3 - > "$TMP/cases.json" <<'PY'
print("[")
PY
first=1
for c in "${CASES[@]}"; do
  IFS='|' read -r prompt n ext flags path <<< "$c"
  # shellcheck disable=SC2086
  ref=$("$KS" run -m "$MODEL" -p "$prompt" -n "$n" --temp 0 -t 1 $flags 2>/dev/null) || bad "kvsieve run: $prompt"
  python3 - "$prompt" "$n" "$ext" "$path" "$ref" "$first" >> "$TMP/cases.json" <<'PY'
import json, sys
prompt, n, ext, path, ref, first = sys.argv[1:]
body = {"max_tokens": int(n), "temperature": 0, "kvsieve": json.loads(ext)}
if "chat" in path:
    body["messages"] = [{"role": "user", "content": prompt}]
else:
    body["prompt"] = prompt
print(("" if first == "1" else ",") + json.dumps({"body": body, "path": path, "ref": ref}))
PY
  first=0
done
echo "]" >> "$TMP/cases.json"

start_server load -m "$MODEL" --parallel 4 -t 2 --batch 8 --max-queue 64 --max-groups 4

rss() { metric process_resident_bytes; }
settle() { # wait until nothing runs or waits and only the default context is alive
  for _ in $(seq 1 150); do
    [ "$(metric requests_running)" = 0 ] && [ "$(metric requests_waiting)" = 0 ] && [ "$(metric contexts)" = 1 ] && return 0
    sleep 0.1
  done
  return 1
}
# warm-up: every case once, so every policy's context and the allocator's pools exist once
python3 "$DIR/load.py" "$BASE" "$TMP/cases.json" 1 10 1 60 good-only > "$TMP/warm.txt" 2>&1 || bad "warm-up: $(cat "$TMP/warm.txt")"
settle || bad "not idle after the warm-up"
idle=$(rss)

timeout 120 python3 "$DIR/load.py" "$BASE" "$TMP/cases.json" "$SEED" 64 16 90 | tee "$TMP/load.txt" | grep '^FAIL' | head -20
[ "${PIPESTATUS[0]}" = 0 ] || bad "load client reported problems (above) or timed out"
summary=$(tail -1 "$TMP/load.txt")
echo "load: $summary"

kill -0 "$PID" 2>/dev/null || bad "the server died under load: $(tail -20 "$TMP/load.err")"
[ "$(curl -s "$BASE/health")" = '{"status":"ok"}' ] || bad "health after the load"
settle || bad "requests still running/waiting or extra contexts alive after the load"
curl -s "$BASE/metrics" > "$TMP/metrics.txt"
failed=$(sed -n 's/^kvsieve_requests_total{outcome="failed"} \([0-9]*\)$/\1/p' "$TMP/metrics.txt")
[ "$failed" = 0 ] || bad "$failed requests failed inside the server"
done_n=$(python3 -c '
import json, re, sys
m = dict(re.findall(r"^kvsieve_requests_total\{outcome=\"(\w+)\"\} (\d+)$", open(sys.argv[1]).read(), re.M))
s = json.loads(sys.argv[2])
# the warm-up ran 10 good requests; a client that hung up before its body was read never submitted
c, x = int(m["completed"]), int(m["cancelled"])
print(c >= s["good"] + 10 and s["good"] + 10 <= c + x <= s["good"] + s["disconnect"] + 10)' "$TMP/metrics.txt" "$summary")
[ "$done_n" = True ] || bad "completed/cancelled do not match the good and hung-up requests ($summary)"
kvf=$(metric kv_bytes_fast); kvs=$(metric kv_bytes_slow)
[ "$kvf" = 0 ] && [ "$kvs" = 0 ] || bad "KV still held after the load: fast $kvf slow $kvs bytes"
after=$(rss)
python3 -c 'import sys; i, a = int(sys.argv[1]), int(sys.argv[2]); sys.exit(0 if a <= i * 1.25 + (24 << 20) else 1)' \
  "$idle" "$after" || bad "resident memory $after bytes after the load, idle level was $idle"
echo "load: resident bytes idle $idle, after $after"
stop_server "$PID" load
finish
