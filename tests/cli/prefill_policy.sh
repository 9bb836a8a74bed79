#!/usr/bin/env bash
# prefill_policy.sh — the CLI's --prefill-policy (the opt-in sparse prefill,
# src/infer/prefill_sparse.c): malformed settings are refused with a message
# naming the fault (never a crash, never a silently dense run); a prompt
# shorter than sink + window + one page leaves nothing to drop, so run's
# greedy text under the default quest setting is dense's; bench prints the
# dense and the sparse prefill rows side by side; eval compares dense after
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

"$KS" run -m "$MODEL" -p hi -n 1 --prefill-policy quest --prompt-cache "$TMP/pc.bin" >/dev/null 2>"$TMP/err"
[ $? -eq 2 ] || fail "--prompt-cache with a sparse prefill: not a usage error"
[ -e "$TMP/pc.bin" ] && fail "--prompt-cache with a sparse prefill wrote a cache file"

"$KS" run -m "$MODEL" -p "Once upon a time" -n 12 --temp 0 >"$TMP/dense" 2>/dev/null || fail "dense run"
"$KS" run -m "$MODEL" -p "Once upon a time" -n 12 --temp 0 --prefill-policy quest >"$TMP/quest" 2>/dev/null || fail "quest run"
cmp -s "$TMP/dense" "$TMP/quest" || fail "a short prompt's text differs under --prefill-policy quest"

"$KS" bench -m "$MODEL" -t 1 --n-prompt 96 --depth 0 --n-gen 1 --prefill-policy quest:budget=96,sink=8,window=32 \
  >"$TMP/bench" 2>/dev/null || fail "bench --prefill-policy"
grep -q "^prefill  " "$TMP/bench" || fail "bench: no dense prefill row"
grep -q "^prefill/sparse" "$TMP/bench" || fail "bench: no sparse prefill row"

"$KS" eval -m "$MODEL" --lengths 128 --samples 1 --depths 0.5 -t 1 --task passkey --policy dense --page 8 \
  --prefill-policy quest:budget=40,sink=8,window=16,dense=0 >"$TMP/eval" 2>/dev/null || fail "eval --prefill-policy"
grep -q "^dense/sparse-prefill" "$TMP/eval" || fail "eval: no dense/sparse-prefill configuration beside the reference"

[ "$fails" -eq 0 ] && echo "prefill_policy: all checks passed"
exit $((fails > 0))
