#!/usr/bin/env bash
# bench.sh — a smoke run of the serving benchmark (tools/bench_serve.py, what
# `make bench-serve` runs): 8 requests, 4 at once, 16 prompt tokens and 24
# generated each, dense then quest, on the tiny fixture model; every request
# must succeed, generate exactly its tokens and be timed.  No timing is
# checked: this only proves the tool works against the server.
# Usage: bash bench.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$1; FIX=$2; TMP=$3
DIR=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$DIR/../.." && pwd)
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not found (the benchmark client)"; exit 77; }
mkdir -p "$TMP"
source "$DIR/common.sh"
start_server bench -m "$FIX/models/aidreams260K.gguf" --parallel 4 -t 2
timeout 120 python3 "$SRC/tools/bench_serve.py" --url "$BASE" -R 4 -n 8 --input-len 16 --output-len 24 \
  --policy dense,quest --budget 32 --json > "$TMP/bench.json" 2> "$TMP/bench.err" || bad "bench_serve failed: $(cat "$TMP/bench.err")"
cat "$TMP/bench.json"
python3 - "$TMP/bench.json" <<'PY' || bad "bench report"
import json, sys
reps = [json.loads(l) for l in open(sys.argv[1])]
assert [r["policy"] for r in reps] == ["dense", "quest"], reps
for r in reps:
    assert r["succeeded"] == 8 and r["failed"] == 0, r
    assert r["generated_tokens"] == 8 * 24, r
    assert r["tok_per_s"] > 0 and r["ttft_p50_ms"] > 0 and r["itl_p50_ms"] >= 0, r
    assert r["ttft_p99_ms"] >= r["ttft_p50_ms"] and r["itl_p99_ms"] >= r["itl_p50_ms"], r
PY
stop_server "$PID" bench
finish
