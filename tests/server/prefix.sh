#!/usr/bin/env bash
# prefix.sh — the prefix cache through the server (docs/SERVER.md, "Prefix
# cache"): follow-up requests that share a long document with an earlier one
# report usage.prompt_tokens_details.cached_tokens > 0 (plain and streamed)
# and answer byte for byte what `kvsieve run` answers without any cache;
# cache_prompt:false turns it off for one request; /metrics counts the hits;
# a request's kvsieve.prefill_policy keeps its KV apart from dense KV, and a
# server-wide --prefill-policy too small for a request's own page leaves that
# request dense rather than refused.
# A second replica on the same --cache-dir hits the blocks the first wrote,
# and so does the first after a restart; a directory whose block files were
# truncated, bit-flipped or written for another model is served correctly,
# every bad file skipped and counted.  `kvsieve run --prompt-cache` reuses
# its file the same way.
# Usage: bash prefix.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$1; FIX=$2; TMP=$3
DIR=$(cd "$(dirname "$0")" && pwd)
command -v curl >/dev/null 2>&1 || { echo "SKIP: curl not found"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not found (it parses the JSON)"; exit 77; }
rm -rf "$TMP"; mkdir -p "$TMP"
source "$DIR/common.sh"
MODEL="$FIX/models/aidreams260K.gguf"
CDIR="$TMP/cache"
DOC="Once upon a time there was a little girl named Lily who loved to play in the park with her friends and her dog Max. One day they found a big red ball under a tree and they played with it all day long until the sun went down and the stars came out."
Q1="Lily said"; Q2="Max barked"; Q3="The ball rolled"
FLAGS=(-c 512 --batch 32 -t 2)
for i in 1 2 3; do
  eval "q=\$Q$i"
  "$KS" run -m "$MODEL" "${FLAGS[@]}" -p "$DOC $q" -n 24 --temp 0 2>/dev/null > "$TMP/ref$i" || bad "kvsieve run $i failed"
done
req() { echo "{\"prompt\":\"$DOC $1\",\"max_tokens\":24,\"temperature\":0$2}"; }
# ask NAME QUESTION [EXTRA_JSON]: plain completion; prints "cached_tokens<TAB>text"
ask() {
  curl -s -d "$(req "$2" "${3:-}")" "$BASE/v1/completions" > "$TMP/$1.json"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%d\t%s" % (d["usage"]["prompt_tokens_details"]["cached_tokens"], d["choices"][0]["text"]))' "$TMP/$1.json" 2>/dev/null \
    || echo "ERR	$(head -c 300 "$TMP/$1.json")"
}
check() { # NAME GOT WANT_REF CACHED_CMP(gt0|eq0)
  local got=$2 ref; ref=$(cat "$TMP/$3")
  local ct=${got%%$'\t'*} text=${got#*$'\t'}
  [ "$text" = "$ref" ] || bad "$1: text differs from kvsieve run: '$text' vs '$ref'"
  case $4 in
    gt0) [ "$ct" -gt 0 ] 2>/dev/null || bad "$1: cached_tokens $ct, expected > 0" ;;
    eq0) [ "$ct" = 0 ] || bad "$1: cached_tokens $ct, expected 0" ;;
  esac
}

start_server a -m "$MODEL" "${FLAGS[@]}" --parallel 2 --cache-dir "$CDIR"
PID_A=$PID; BASE_A=$BASE
check first "$(ask r1 "$Q1")" ref1 eq0
check follow "$(ask r2 "$Q2")" ref2 gt0
check nocache "$(ask r2n "$Q2" ',"cache_prompt":false')" ref2 eq0
# a sparse prefill's KV is cached under its own setting: the document's dense
# blocks do not serve it, a second request of the same setting hits its own
SPS="quest:budget=96,sink=8,window=16,dense=0"; Q4="The dog ran"
"$KS" run -m "$MODEL" "${FLAGS[@]}" -p "$DOC $Q4" -n 24 --temp 0 --prefill-policy "$SPS" 2>/dev/null > "$TMP/ref4s" \
  || bad "kvsieve run --prefill-policy failed"
check sparse_first "$(ask s1 "$Q4" ",\"kvsieve\":{\"prefill_policy\":\"$SPS\"}")" ref4s eq0
check sparse_follow "$(ask s2 "$Q4" ",\"kvsieve\":{\"prefill_policy\":\"$SPS\"}")" ref4s gt0
code=$(curl -s -o "$TMP/bad.json" -w '%{http_code}' -d "$(req "$Q4" ',"kvsieve":{"prefill_policy":"quest:budget=abc"}')" "$BASE/v1/completions")
[ "$code" = 400 ] && grep -q '"kvsieve.prefill_policy"' "$TMP/bad.json" || bad "a malformed prefill_policy: HTTP $code $(head -c 200 "$TMP/bad.json")"
# two requests arriving together with the same new document: it is prefilled once (the second restores it)
DOC2="Tom had a big red truck. He liked to push it up the hill and let it roll down fast. One day the truck hit a rock and a wheel fell off, so his dad helped him fix it with a little screw and some glue before dinner."
for i in 1 2; do
  eval "q=\$Q$i"
  "$KS" run -m "$MODEL" "${FLAGS[@]}" -p "$DOC2 $q" -n 24 --temp 0 2>/dev/null > "$TMP/ref2_$i" || bad "kvsieve run doc2 $i failed"
done
curl -s -d "{\"prompt\":\"$DOC2 $Q1\",\"max_tokens\":24,\"temperature\":0}" "$BASE/v1/completions" > "$TMP/t1.json" & T1=$!
curl -s -d "{\"prompt\":\"$DOC2 $Q2\",\"max_tokens\":24,\"temperature\":0}" "$BASE/v1/completions" > "$TMP/t2.json" & T2=$!
wait $T1 $T2
tog=$(python3 -c '
import json, sys
ds = [json.load(open(p)) for p in sys.argv[1:3]]
refs = [open(p).read().rstrip("\n") for p in sys.argv[3:5]]
ok = all(d["choices"][0]["text"] == r for d, r in zip(ds, refs))
print(sorted(d["usage"]["prompt_tokens_details"]["cached_tokens"] for d in ds), ok)' \
  "$TMP/t1.json" "$TMP/t2.json" "$TMP/ref2_1" "$TMP/ref2_2" 2>&1)
case "$tog" in "[0, "[1-9]*"] True") ;; *) bad "two requests together: cached tokens and exactness $tog" ;; esac
# streamed, with usage
curl -sN -d "$(req "$Q3" ',"stream":true,"stream_options":{"include_usage":true}')" "$BASE/v1/completions" > "$TMP/s3.txt"
got=$(sse_text "$TMP/s3.txt")
[ "$got" = "$(cat "$TMP/ref3")"$'\n'DONE$'\n'no-error ] || bad "streamed follow-up differs: $got"
ct=$(python3 -c '
import json,sys
for l in open(sys.argv[1]):
    if l.startswith("data: {") and "usage" in l:
        u = json.loads(l[6:]).get("usage")
        if u: print(u["prompt_tokens_details"]["cached_tokens"])' "$TMP/s3.txt")
[ "${ct:-0}" -gt 0 ] 2>/dev/null || bad "streamed follow-up: cached_tokens '${ct:-}'"
hits=$(metric prefix_cache_hit_tokens_total)
[ "${hits:-0}" -gt 0 ] 2>/dev/null || bad "no hit tokens in /metrics: ${hits:-none}"
for _ in $(seq 1 100); do [ "$(metric prefix_cache_spills_total)" -ge 1 ] 2>/dev/null && break; sleep 0.1; done
[ "$(metric prefix_cache_spills_total)" -ge 1 ] 2>/dev/null || bad "no block written to --cache-dir"

# a second replica on the same directory: the follow-up it never saw hits A's files
start_server b -m "$MODEL" "${FLAGS[@]}" --parallel 2 --cache-dir "$CDIR"
PID_B=$PID
check replica "$(ask b2 "$Q2")" ref2 gt0
[ "$(metric prefix_cache_loads_total)" -ge 1 ] 2>/dev/null || bad "replica b loaded no block from the directory"
stop_server "$PID_B" b
BASE=$BASE_A
stop_server "$PID_A" a

# a restart on the same directory
start_server a2 -m "$MODEL" "${FLAGS[@]}" --cache-dir "$CDIR"
check restart "$(ask a3 "$Q3")" ref3 gt0
stop_server "$PID" a2

# bad files: truncated, bit-flipped, another model's fingerprint
n=0
for f in "$CDIR"/*.kvb; do
  case $((n % 3)) in
    0) python3 -c 'import sys; p=sys.argv[1]; b=open(p,"rb").read(); open(p,"wb").write(b[:len(b)//2])' "$f" ;;
    1) python3 -c 'import sys; p=sys.argv[1]; b=bytearray(open(p,"rb").read()); b[-9]^=4; open(p,"wb").write(b)' "$f" ;;
    2) python3 -c 'import sys; p=sys.argv[1]; b=bytearray(open(p,"rb").read()); b[40]^=1; open(p,"wb").write(b)' "$f" ;;
  esac
  n=$((n + 1))
done
[ $n -ge 3 ] || bad "expected several block files, found $n"
start_server c -m "$MODEL" "${FLAGS[@]}" --cache-dir "$CDIR"
check corrupt1 "$(ask c1 "$Q1")" ref1 any
check corrupt2 "$(ask c2 "$Q2")" ref2 any
sk=$(metric prefix_cache_skipped_corrupt_total)
[ "${sk:-0}" -ge 1 ] 2>/dev/null || bad "no corrupt block counted (${sk:-none})"
# the recomputed blocks replace the bad files (write-behind: wait for the writer)
for _ in $(seq 1 100); do [ "$(metric prefix_cache_healed_total)" -ge 1 ] 2>/dev/null && break; sleep 0.1; done
[ "$(metric prefix_cache_healed_total)" -ge 1 ] 2>/dev/null || bad "no bad block file healed"
stop_server "$PID" c
grep -q "prefix cache: skipped" "$TMP/c.err" || bad "no warning for the skipped blocks"

# a server-wide --prefill-policy that leaves no page to select at a request's own, larger page
# (kvsieve.page 64: 64 + 16 + 64 > 96) does not make that request invalid: it prefills dense and
# answers what a dense run at that page does; a request naming that setting itself is refused
"$KS" run -m "$MODEL" "${FLAGS[@]}" --page 64 -p "$DOC $Q1" -n 24 --temp 0 2>/dev/null > "$TMP/ref1p64" || bad "run --page 64"
start_server d -m "$MODEL" "${FLAGS[@]}" --prefill-policy "quest:budget=96,sink=8,window=16,dense=0"
check server_policy_page "$(ask d1 "$Q1" ',"kvsieve":{"page":64}')" ref1p64 eq0
code=$(curl -s -o "$TMP/bad2.json" -w '%{http_code}' \
  -d "$(req "$Q1" ',"kvsieve":{"page":64,"prefill_policy":"quest:budget=96,sink=8,window=16,dense=0"}')" "$BASE/v1/completions")
[ "$code" = 400 ] && grep -q '"kvsieve.prefill_policy"' "$TMP/bad2.json" || bad "a request's own prefill_policy too small for its page: HTTP $code"
stop_server "$PID" d
grep -q "does not fit the request's page" "$TMP/d.err" || bad "no log line for the server's prefill policy falling back to dense"

# kvsieve run --prompt-cache FILE
rm -f "$TMP/prompt.cache"
"$KS" run -m "$MODEL" "${FLAGS[@]}" -p "$DOC $Q1" -n 24 --temp 0 --prompt-cache "$TMP/prompt.cache" > "$TMP/p1" 2> "$TMP/p1.err"
"$KS" run -m "$MODEL" "${FLAGS[@]}" -p "$DOC $Q2" -n 24 --temp 0 --prompt-cache "$TMP/prompt.cache" > "$TMP/p2" 2> "$TMP/p2.err"
cmp -s "$TMP/p1" "$TMP/ref1" && cmp -s "$TMP/p2" "$TMP/ref2" || bad "--prompt-cache changed the output"
grep -q "  cache:   0 prompt tokens cached" "$TMP/p1.err" || bad "first --prompt-cache run: $(grep cache: "$TMP/p1.err")"
grep -Eq "  cache:   [1-9][0-9]* prompt tokens cached" "$TMP/p2.err" || bad "second --prompt-cache run: $(grep cache: "$TMP/p2.err")"
finish
