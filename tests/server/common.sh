# common.sh — helpers the server test drivers source: start `kvsieve serve`
# on a free loopback port (--port 0; the port is read from its first stdout
# line), stop it with SIGTERM and check it exits cleanly, and fail/summary.
# The server is always killed when the driver exits, whatever happened.
# Needs: KS (the kvsieve binary), TMP (scratch dir).
fail=0
bad() { echo "FAIL: $*"; fail=1; }
SERVERS=()
cleanup_servers() { for p in "${SERVERS[@]}"; do kill -KILL "$p" 2>/dev/null; done; }
trap cleanup_servers EXIT

# start_server NAME ARGS... : sets PID and PORT (and BASE); logs in $TMP/NAME.{out,err}
start_server() {
  local name=$1; shift
  : > "$TMP/$name.out"
  "$KS" serve --port 0 "$@" > "$TMP/$name.out" 2> "$TMP/$name.err" &
  PID=$!
  SERVERS+=("$PID")
  PORT=""
  for _ in $(seq 1 600); do   # up to 60 s (slow under ASan)
    PORT=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9][0-9]*\)$/\1/p' "$TMP/$name.out")
    [ -n "$PORT" ] && break
    kill -0 "$PID" 2>/dev/null || { echo "FAIL: server $name exited at start: $(cat "$TMP/$name.err")"; exit 1; }
    sleep 0.1
  done
  [ -n "$PORT" ] || { echo "FAIL: server $name did not start"; exit 1; }
  BASE="http://127.0.0.1:$PORT"
}

# stop_server PID NAME [MAX_SECONDS]: SIGTERM; must exit 0 in time
stop_server() {
  local pid=$1 name=$2 max=${3:-30}
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 $((max * 10))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    bad "server $name still running ${max}s after SIGTERM"; kill -KILL "$pid"; return
  fi
  wait "$pid"; local rc=$?
  [ $rc -eq 0 ] || bad "server $name exited with $rc after SIGTERM: $(tail -20 "$TMP/$name.err")"
}

# metric NAME : value of an unlabelled metric from /metrics
metric() { curl -s "${AUTH[@]}" "$BASE/metrics" | sed -n "s/^kvsieve_$1 \([0-9.e+-]*\)$/\1/p"; }
AUTH=()

finish() {
  if [ $fail -eq 0 ]; then echo "PASS"; exit 0; fi
  exit 1
}

# jget FILE PYEXPR : evaluate PYEXPR on the JSON in FILE as d (prints it)
jget() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2" 2>/dev/null; }
# sse_text FILE : the text of an SSE stream (completions or chat), then a line DONE if it ended with [DONE]
sse_text() {
  python3 - "$1" <<'PY'
import json, sys
text, done, err = "", False, None
for line in open(sys.argv[1], encoding="utf-8"):
    line = line.rstrip("\n")
    if not line.startswith("data: "):
        continue
    body = line[6:]
    if body == "[DONE]":
        done = True
        continue
    d = json.loads(body)
    if "error" in d:
        err = d["error"].get("code")
        continue
    for c in d.get("choices", []):
        text += c.get("text") or (c.get("delta") or {}).get("content") or ""
sys.stdout.write(text + "\n" + ("DONE" if done else "NOT-DONE") + "\n" + (err or "no-error") + "\n")
PY
}
