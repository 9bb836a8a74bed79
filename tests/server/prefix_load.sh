#!/usr/bin/env bash
# prefix_load.sh — the prefix cache under load (bounded, loopback only): 64
# requests over 16 concurrent clients (load.py) on 4 shared documents with
# random follow-up questions and policies, plain and streamed, with clients
# that hang up and malformed requests mixed in, against a server whose
# prefix cache is squeezed by a --mem-cap (it gives RAM back to the running
# requests: trims and evictions, blocks spilled to --cache-dir and loaded
# back, a --cache-disk cap that removes files; layers are offloaded too).  Every good answer must equal
# `kvsieve run` without any cache, no request may fail, and afterwards the
# cache's RAM is within --cache-ram and nothing else is held.
# Memory, measured: the server's peak resident set (VmHWM, and VmRSS sampled
# while the load runs) must stay within --mem-cap plus a fixed allowance for
# what the cap's memory model does not govern.  The allowance is derived,
# not guessed: the resident set after one small warm-up request (weights,
# code, libraries, a context with its scratch: everything that exists with
# no KV and no cache to speak of), plus 12 MiB for the serving machinery
# (the threads of up to 16 connections with their malloc arenas, about 4 MiB
# here; request and response buffers of 64 queued requests; contexts the
# scheduler recycles after offloading; what the allocator keeps after
# frees).  On the development host (2026-11-27) the peak was the warm-up's
# resident set plus about 9 MiB, of which ~4 MiB go away with
# MALLOC_ARENA_MAX=1; a KV pool or prefix cache that ignored the cap at
# this scale would not show (1.6 MB), so the check guards against leaks and
# unbounded growth under load, not against the cap's own accounting, which
# the metrics below check.
# Usage: bash prefix_load.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$1; FIX=$2; TMP=$3
DIR=$(cd "$(dirname "$0")" && pwd)
command -v curl >/dev/null 2>&1 || { echo "SKIP: curl not found"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not found (the load client)"; exit 77; }
rm -rf "$TMP"; mkdir -p "$TMP"
source "$DIR/common.sh"
MODEL="$FIX/models/aidreams260K.gguf"
SEED=${KVSIEVE_LOAD_SEED:-23}
FLAGS=(-c 256 --batch 8 -t 2)
POL=(--policy quest --budget 32 --page 8)

DOCS=(
  "Once upon a time there was a little girl named Lily who loved to play in the park with her friends and her dog Max every day after school."
  "Tom had a big red truck. He liked to push it up the hill and let it roll down fast. One day the truck hit a rock and a wheel fell off."
  "In a small town by the sea lived an old fisherman. Every morning he took his boat out before the sun came up and sang to the fish."
  "The bird built a nest in the tall tree behind the house. She brought twigs and soft leaves, and soon there were three blue eggs in it."
)
QS=("Then" "One day" "She said")
EXTS=('{}' '{"policy":"snapkv","budget":32}' '{"policy":"streaming","budget":40}')
EXTF=('' '--policy snapkv --budget 32' '--policy streaming --budget 40')

echo "[" > "$TMP/cases.json"
first=1
for d in 0 1 2 3; do
  for q in 0 1 2; do
    k=$(( (d + q) % 3 ))
    prompt="${DOCS[$d]} ${QS[$q]}"
    # shellcheck disable=SC2086
    ref=$("$KS" run -m "$MODEL" "${FLAGS[@]}" "${POL[@]}" ${EXTF[$k]} -p "$prompt" -n 20 --temp 0 2>/dev/null) \
      || bad "kvsieve run: $prompt"
    python3 - "$prompt" "${EXTS[$k]}" "$ref" "$first" >> "$TMP/cases.json" <<'PY'
import json, sys
prompt, ext, ref, first = sys.argv[1:]
body = {"prompt": prompt, "max_tokens": 20, "temperature": 0, "kvsieve": json.loads(ext)}
print(("" if first == "1" else ",") + json.dumps({"body": body, "path": "/v1/completions", "ref": ref}))
PY
    first=0
  done
done
echo "]" >> "$TMP/cases.json"

# the documents' blocks are ~390 KB; --cache-ram 2M would hold them all, but the 1.6 MB cap leaves the
# cache only what the running requests do not need (it is trimmed, and layers are offloaded too); 120 KB of files
start_server pl -m "$MODEL" "${FLAGS[@]}" "${POL[@]}" --parallel 4 --max-queue 64 --mem-cap 1.6M \
  --cache-ram 2M --cache-dir "$TMP/cache" --cache-disk 120K
# the allowance: the resident set once one request has run, plus 12 MiB (above)
curl -s "$BASE/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":4,"temperature":0}' > /dev/null \
  || bad "warm-up request failed"
rss_kb() { sed -n "s/^$1:[[:space:]]*\([0-9]*\) kB$/\1/p" "/proc/$PID/status"; }
warm_kb=$(rss_kb VmRSS)
cap_kb=$(( 1600000 / 1024 ))
limit_kb=$(( cap_kb + warm_kb + 12 * 1024 ))
( peak=0; while kill -0 "$PID" 2>/dev/null; do
    r=$(rss_kb VmRSS); [ -n "$r" ] && [ "$r" -gt "$peak" ] && peak=$r && echo "$peak" > "$TMP/rss_peak"
    sleep 0.2
  done ) &
SAMPLER=$!
timeout 150 python3 "$DIR/load.py" "$BASE" "$TMP/cases.json" "$SEED" 64 16 120 | tee "$TMP/load.txt" | grep '^FAIL' | head -20
[ "${PIPESTATUS[0]}" = 0 ] || bad "load client reported problems (above) or timed out"
echo "prefix_load: $(tail -1 "$TMP/load.txt")"
kill -0 "$PID" 2>/dev/null || bad "the server died under load: $(tail -20 "$TMP/pl.err")"
for _ in $(seq 1 150); do
  [ "$(metric requests_running)" = 0 ] && [ "$(metric requests_waiting)" = 0 ] && break
  sleep 0.1
done
hwm_kb=$(rss_kb VmHWM)
kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null
echo "prefix_load: resident set: warm-up ${warm_kb} kB, sampled peak $(cat "$TMP/rss_peak" 2>/dev/null) kB, VmHWM ${hwm_kb} kB; limit ${limit_kb} kB (cap ${cap_kb} + warm-up + 12 MiB)"
# a sanitizer's shadow memory and quarantine are not the server's: no bound under one
if grep -qE 'libasan|libtsan|libmsan' "/proc/$PID/maps" 2>/dev/null || nm "$KS" 2>/dev/null | grep -q '__asan_init'; then
  echo "prefix_load: resident-set bound skipped (sanitizer build)"
else
  [ -n "$hwm_kb" ] && [ "$hwm_kb" -le "$limit_kb" ] || bad "peak resident set ${hwm_kb} kB exceeds the cap plus the allowance (${limit_kb} kB)"
fi
curl -s "$BASE/metrics" > "$TMP/metrics.txt"
m() { sed -n "s/^kvsieve_$1 \([0-9]*\)$/\1/p" "$TMP/metrics.txt"; }
failed=$(sed -n 's/^kvsieve_requests_total{outcome="failed"} \([0-9]*\)$/\1/p' "$TMP/metrics.txt")
[ "$failed" = 0 ] || bad "$failed requests failed inside the server"
ram=$(sed -n 's/^kvsieve_prefix_cache_bytes{tier="ram"} \([0-9]*\)$/\1/p' "$TMP/metrics.txt")
[ "${ram:-1}" -le 2000000 ] || bad "the cache holds $ram bytes of RAM, over --cache-ram"
for k in prefix_cache_hit_tokens_total prefix_cache_evictions_total prefix_cache_spills_total \
         prefix_cache_loads_total prefix_cache_disk_evictions_total prefix_cache_trims_total kv_offload_events_total; do
  [ "$(m $k)" -gt 0 ] 2>/dev/null || bad "$k is $(m $k), expected > 0"
done
[ "$(m prefix_cache_skipped_corrupt_total)" = 0 ] || bad "blocks skipped as corrupt under load"
[ "$(m kv_bytes_fast)" = 0 ] && [ "$(m kv_bytes_slow)" = 0 ] || bad "KV still held after the load"
grep -E '^kvsieve_prefix_cache_(hit|miss|evictions|spills|loads|disk_evictions|trims)' "$TMP/metrics.txt" | tr '\n' ' '; echo
stop_server "$PID" pl
finish
