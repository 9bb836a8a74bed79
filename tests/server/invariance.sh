#!/usr/bin/env bash
# invariance.sh — batch invariance through the server: requests with
# different prompts, lengths and policies (dense, quest, streaming, snapkv,
# chess), greedy and seeded sampling, completions and chat, plain and
# streamed, are sent with staggered starts to a server with fewer slots than
# requests and a small prefill chunk, so they run at different depths,
# prefill chunks interleave with decodes, some wait and join the batch
# later, and sequences of different policies share decode steps (one
# ks_decode; the metric decode_steps_mixed_total must grow).  Requests with
# page 8 get a context of their own (the KV page belongs to a context).
# Every answer must equal `kvsieve run` alone with the same flags, byte for
# byte.
# Usage: bash invariance.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$1; FIX=$2; TMP=$3
DIR=$(cd "$(dirname "$0")" && pwd)
command -v curl >/dev/null 2>&1 || { echo "SKIP: curl not found"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not found (it parses the JSON)"; exit 77; }
mkdir -p "$TMP"
source "$DIR/common.sh"
MODEL="$FIX/models/aidreams260K.gguf"

# name | prompt | max_tokens | kvsieve object (JSON) | extra sampling JSON | `kvsieve run` flags | mode
CASES=(
  "a|Once upon a time|60|{}||--temp 0|stream"
  "b|The little dog ran to the river and|40|{\"policy\":\"quest\",\"budget\":32,\"page\":8}||--temp 0 --policy quest --budget 32 --page 8|plain"
  "c|In a land far away there lived a king who loved|30|{\"policy\":\"streaming\",\"budget\":40}||--temp 0 --policy streaming --budget 40|stream"
  "d|Hi|70|{}||--temp 0|plain"
  "e|The sun was warm and the birds|50|{\"policy\":\"snapkv\",\"budget\":32}||--temp 0 --policy snapkv --budget 32|plain"
  "f|Lily wanted to play with her|45|{}|,\"temperature\":0.8,\"seed\":11|--temp 0.8 --seed 11|stream"
  "g|Tom and his mom went to the park|50|{\"policy\":\"quest\",\"budget\":32,\"page\":8}||--temp 0 --policy quest --budget 32 --page 8|chat"
  "h|One day, a big bear found a|35|{\"policy\":\"streaming\",\"budget\":40}|,\"temperature\":0.7,\"top_k\":20,\"seed\":5|--temp 0.7 --top-k 20 --seed 5 --policy streaming --budget 40|plain"
  "i|The cat sat on the mat and looked at the little red ball that|55|{}||--temp 0|chatstream"
  "j|The quiet farmer walks near the old bridge and|60|{\"policy\":\"quest\",\"budget\":24,\"window\":8}||--temp 0 --policy quest --budget 24 --window 8|plain"
  "k|A small bird sings by the river today and|60|{\"policy\":\"chess\",\"budget\":24,\"window\":8}||--temp 0 --policy chess --budget 24 --window 8|stream"
  "l|Once upon a time there was a little girl who|50|{\"policy\":\"streaming\",\"budget\":24,\"window\":16}||--temp 0 --policy streaming --budget 24 --window 16|plain"
)

for c in "${CASES[@]}"; do
  IFS='|' read -r name prompt n ext samp flags mode <<< "$c"
  # shellcheck disable=SC2086
  "$KS" run -m "$MODEL" -p "$prompt" -n "$n" -t 1 $flags 2>/dev/null > "$TMP/$name.ref" || bad "kvsieve run for $name failed"
done

start_server inv -m "$MODEL" --parallel 3 -t 2 --batch 4 --max-groups 3

pids=()
for c in "${CASES[@]}"; do
  IFS='|' read -r name prompt n ext samp flags mode <<< "$c"
  common="\"max_tokens\":$n$samp,\"kvsieve\":$ext"
  [ -z "$samp" ] && common="\"max_tokens\":$n,\"temperature\":0,\"kvsieve\":$ext"
  case $mode in
    plain)      curl -s -d "{\"prompt\":\"$prompt\",$common}" "$BASE/v1/completions" > "$TMP/$name.out" & ;;
    stream)     curl -sN -d "{\"prompt\":\"$prompt\",$common,\"stream\":true}" "$BASE/v1/completions" > "$TMP/$name.out" & ;;
    chat)       curl -s -d "{\"messages\":[{\"role\":\"user\",\"content\":\"$prompt\"}],$common}" \
                  "$BASE/v1/chat/completions" > "$TMP/$name.out" & ;;
    chatstream) curl -sN -d "{\"messages\":[{\"role\":\"user\",\"content\":\"$prompt\"}],$common,\"stream\":true}" \
                  "$BASE/v1/chat/completions" > "$TMP/$name.out" & ;;
  esac
  pids+=($!)
  # the first three start together, so a (dense) and c (streaming), which
  # share a context, surely decode in the same steps however fast the host
  # (the mixed-step check below); the rest are staggered: later requests
  # join a batch already decoding
  [ ${#pids[@]} -ge 3 ] && sleep 0.0$((RANDOM % 5))
done
for p in "${pids[@]}"; do wait "$p"; done

for c in "${CASES[@]}"; do
  IFS='|' read -r name prompt n ext samp flags mode <<< "$c"
  want=$(cat "$TMP/$name.ref")
  case $mode in
    plain)  got=$(jget "$TMP/$name.out" 'd["choices"][0]["text"]') ;;
    chat)   got=$(jget "$TMP/$name.out" 'd["choices"][0]["message"]["content"]') ;;
    *)      got=$(sse_text "$TMP/$name.out" | head -n -2)
            sse_text "$TMP/$name.out" | tail -2 | tr '\n' ' ' | grep -q '^DONE no-error' || bad "$name: stream did not end cleanly" ;;
  esac
  [ -n "$want" ] || bad "$name: empty reference"
  [ "$got" = "$want" ] || bad "$name ($flags, $mode) differs from kvsieve run:"$'\n'"  got  '$got'"$'\n'"  want '$want'"
done

curl -s "$BASE/metrics" > "$TMP/metrics.txt"
ctx=$(sed -n 's/^kvsieve_contexts_created_total \([0-9]*\)$/\1/p' "$TMP/metrics.txt")
[ "${ctx:-0}" -ge 1 ] && [ "${ctx:-0}" -le 4 ] || bad "expected a context per page size in use (page 32, page 8), not per policy: got '$ctx'"
mixed=$(sed -n 's/^kvsieve_decode_steps_mixed_total \([0-9]*\)$/\1/p' "$TMP/metrics.txt")
[ "${mixed:-0}" -gt 0 ] || bad "no decode step had sequences of different policies ($mixed)"
chunks=$(sed -n 's/^kvsieve_prefill_chunks_total \([0-9]*\)$/\1/p' "$TMP/metrics.txt")
[ "${chunks:-0}" -gt "${#CASES[@]}" ] || bad "prompts were not prefilled in chunks ($chunks chunks)"
grep -q '^kvsieve_requests_total{outcome="completed"} '"${#CASES[@]}"'$' "$TMP/metrics.txt" || bad "not every request completed"
stop_server "$PID" inv
finish
