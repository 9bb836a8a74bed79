#!/usr/bin/env bash
# prefill_policy.sh — the CLI's --prefill-policy (the opt-in sparse prefill,
# src/infer/prefill_sparse.c): malformed settings are refused with a message
# naming the fault (never a crash, never a silently dense run); a prompt
# cache file keeps a sparse prefill's KV for runs of the same setting only, and
# a checkpointed prefill (--prompt-cache-every) killed midway resumes to the
# same text, dense and sparse; a prompt
# shorter than sink + window + one page leaves nothing to drop, so run's
# greedy text under the default quest setting is dense's; bench prints the
# dense and the sparse prefill rows side by side (also at --prefill-depth); eval compares dense after
# a sparse prefill with the dense reference.
# Usage: bash prefill_policy.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$1; FIX=$2; TMP=$3
rm -rf "$TMP"; mkdir -p "$TMP"
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
MODEL=$FIX/models/aidreams260K.gguf

for spec in sparse quest: quest:budget=abc quest:nokey=1 quest:budget=64, quest:budget=40,sink=8,window=8; do
  timeout 60 "$KS" run -m "$MODEL" -p "Once upon a time" -n 4 --prefill-policy "$spec" >"$TMP/out" 2>"$TMP/err" </dev/null
  rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ]; then fail "--prefill-policy $spec: exit $rc"; continue; fi
  grep -q "prefill policy" "$TMP/err" || fail "--prefill-policy $spec: message does not name it: $(cat "$TMP/err")"
done

# --prompt-cache keeps a sparse prefill's KV under its setting: the same
# setting hits it (same text as without the file), dense never does
LONGP="$(for i in $(seq 1 4); do printf 'the quiet farmer walks near the old bridge. '; done)"
QS=quest:budget=96,sink=8,window=32,dense=0
"$KS" run -m "$MODEL" -p "$LONGP" -n 6 --temp 0 --page 16 --prefill-policy $QS >"$TMP/nocache" 2>/dev/null || fail "sparse run"
"$KS" run -m "$MODEL" -p "$LONGP" -n 6 --temp 0 --page 16 --prefill-policy $QS --prompt-cache "$TMP/pc.bin" \
  >/dev/null 2>"$TMP/err" || fail "--prompt-cache with a sparse prefill: $(cat "$TMP/err")"
[ -s "$TMP/pc.bin" ] || fail "--prompt-cache with a sparse prefill wrote no cache file"
"$KS" run -m "$MODEL" -p "$LONGP" -n 6 --temp 0 --page 16 --prefill-policy $QS --prompt-cache "$TMP/pc.bin" \
  >"$TMP/hit" 2>"$TMP/err" || fail "sparse follow-up"
grep -q "cache: *[1-9][0-9]* prompt tokens cached" "$TMP/err" || fail "sparse follow-up: no hit: $(grep cache: "$TMP/err")"
cmp -s "$TMP/nocache" "$TMP/hit" || fail "sparse follow-up: text differs from the run without the file"
cp "$TMP/pc.bin" "$TMP/pc2.bin"
"$KS" run -m "$MODEL" -p "$LONGP" -n 6 --temp 0 --page 16 --prompt-cache "$TMP/pc2.bin" >/dev/null 2>"$TMP/err" || fail "dense run with a sparse file"
grep -q "cache: *0 prompt tokens cached" "$TMP/err" || fail "a dense run restored sparse KV: $(grep cache: "$TMP/err")"

# --prompt-cache-every: a run killed after its second checkpoint (the test
# hook ends the process as a kill would), with a torn record after them, is
# resumed by the same command from 32 saved tokens, and its text is the
# uninterrupted run's, dense and sparse; a bad interval is refused
for PP in dense $QS; do
  rm -f "$TMP/ck.bin"
  "$KS" run -m "$MODEL" -p "$LONGP" -n 12 --temp 0 --page 16 --prefill-policy $PP >"$TMP/ckref" 2>/dev/null || fail "run $PP"
  KS_TEST_EXIT_AFTER_CHECKPOINTS=2 "$KS" run -m "$MODEL" -p "$LONGP" -n 12 --temp 0 --page 16 --prefill-policy $PP \
    --prompt-cache "$TMP/ck.bin" --prompt-cache-every 16 >/dev/null 2>"$TMP/err"
  [ $? -eq 3 ] || fail "checkpoint hook $PP: $(cat "$TMP/err")"
  head -c 1000 "$TMP/ck.bin" >>"$TMP/ck.bin"
  "$KS" run -m "$MODEL" -p "$LONGP" -n 12 --temp 0 --page 16 --prefill-policy $PP --prompt-cache "$TMP/ck.bin" \
    --prompt-cache-every 16 >"$TMP/ckgot" 2>"$TMP/err" || fail "resumed run $PP: $(cat "$TMP/err")"
  grep -q "cache: *32 prompt tokens cached" "$TMP/err" || fail "resume $PP: $(grep cache: "$TMP/err")"
  cmp -s "$TMP/ckref" "$TMP/ckgot" || fail "resume $PP: text differs from the uninterrupted run"
done
"$KS" run -m "$MODEL" -p "x" -n 1 --prompt-cache "$TMP/ck.bin" --prompt-cache-every -2 >/dev/null 2>"$TMP/err"
[ $? -eq 2 ] && grep -q "prompt-cache-every" "$TMP/err" || fail "--prompt-cache-every -2: $(cat "$TMP/err")"

"$KS" run -m "$MODEL" -p "Once upon a time" -n 12 --temp 0 >"$TMP/dense" 2>/dev/null || fail "dense run"
"$KS" run -m "$MODEL" -p "Once upon a time" -n 12 --temp 0 --prefill-policy quest >"$TMP/quest" 2>/dev/null || fail "quest run"
cmp -s "$TMP/dense" "$TMP/quest" || fail "a short prompt's text differs under --prefill-policy quest"

"$KS" bench -m "$MODEL" -t 1 --n-prompt 96 --depth 0 --n-gen 1 --prefill-policy quest:budget=96,sink=8,window=32 \
  >"$TMP/bench" 2>/dev/null || fail "bench --prefill-policy"
grep -q "^prefill  " "$TMP/bench" || fail "bench: no dense prefill row"
grep -q "^prefill/sparse" "$TMP/bench" || fail "bench: no sparse prefill row"

# --prefill-depth: a follow-up's prefill after synthetic cached rows, dense and sparse rows
"$KS" bench -m "$MODEL" -t 1 --n-prompt 16 --prefill-depth 96 --depth 0 --n-gen 1 \
  --prefill-policy quest:budget=80,sink=8,window=16,dense=0 >"$TMP/bench" 2>/dev/null || fail "bench --prefill-depth"
grep -q "^prefill@96 " "$TMP/bench" && grep -q "^sparse@96 " "$TMP/bench" || fail "bench --prefill-depth: rows missing"

"$KS" eval -m "$MODEL" --lengths 128 --samples 1 --depths 0.5 -t 1 --task passkey --policy dense --page 8 \
  --prefill-policy quest:budget=40,sink=8,window=16,dense=0 >"$TMP/eval" 2>/dev/null || fail "eval --prefill-policy"
grep -q "^dense/sparse-prefill" "$TMP/eval" || fail "eval: no dense/sparse-prefill configuration beside the reference"

[ "$fails" -eq 0 ] && echo "prefill_policy: all checks passed"
exit $((fails > 0))
