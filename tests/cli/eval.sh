#!/usr/bin/env bash
# eval.sh — `kvsieve eval` end to end on the real aidreams260K model (context
# 128): every task runs at length ~100 with 2 samples, the table and the JSON
# agree on the cells, --plot writes SVG that an XML parser accepts, lengths
# over the trained context are skipped (or refused when nothing is left), and
# bad flags / unknown policies are usage errors (exit 2).  The tiny model
# scores ~0 on these tasks; only the harness is under test here.
# Usage: bash eval.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$1; FIX=$2; TMP=$3
mkdir -p "$TMP"
MODEL="$FIX/models/aidreams260K.gguf"
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# table: a header and one row per task x depth
out=$("$KS" eval -m "$MODEL" --lengths 100 --depths 0,0.5,1 --samples 2 -t 2 2>"$TMP/err")
[ $? -eq 0 ] || bad "table run failed: $(cat "$TMP/err")"
echo "$out" | head -1 | grep -q "accuracy" || bad "no table header: $out"
for t in passkey multikey multivalue vartrack longgen; do
  n=$(echo "$out" | grep -c "^$t ")
  [ "$n" -eq 3 ] || bad "$t: $n rows, want 3"
done
echo "$out" | grep -q "^mean all" || bad "no overall mean"

# JSON parses and covers every task; same seed, same accuracies as the table
"$KS" eval -m "$MODEL" --lengths 100,4096 --depths 0,0.5,1 --samples 2 -t 2 --json \
  --plot "$TMP/eval.svg" >"$TMP/eval.json" 2>"$TMP/err" || bad "json run failed: $(cat "$TMP/err")"
grep -q "skipping length 4096" "$TMP/err" || bad "length over the trained context not noted"
python3 - "$TMP/eval.json" "$out" <<'PY' || bad "eval JSON"
import json, sys
d = json.load(open(sys.argv[1]))
rows = d["results"]
assert d["policy"] == "dense" and d["samples"] == 2, d
assert {r["task"] for r in rows} == {"passkey", "multikey", "multivalue", "vartrack", "longgen"}, rows
assert len(rows) == 15 and all(r["length"] == 100 for r in rows), rows
for r in rows:
    assert 0 <= r["accuracy"] <= 1 and r["tok_s"] > 0 and 90 <= r["mean_tokens"] <= 100, r
table = {}
for line in sys.argv[2].splitlines()[1:]:
    f = line.split()
    if len(f) == 6:
        table[(f[0], float(f[2]))] = float(f[4])
for r in rows:
    assert abs(table[(r["task"], r["depth"])] - r["accuracy"]) < 1e-3, (r, table)
assert 0 <= d["summary"]["all"] <= 1
PY
[ -s "$TMP/eval.svg" ] || bad "no SVG written"
python3 -c 'import xml.dom.minidom,sys; xml.dom.minidom.parse(sys.argv[1])' "$TMP/eval.svg" || bad "SVG is not well-formed XML"
grep -q "evidence depth" "$TMP/eval.svg" || bad "SVG lacks the heat map"
grep -q "KV budget" "$TMP/eval.svg" || bad "SVG lacks the budget chart"

# one task, deterministic across runs
a=$("$KS" eval -m "$MODEL" --task passkey,longgen --lengths 100 --depths 0.5 --samples 1 --seed 9 2>/dev/null)
b=$("$KS" eval -m "$MODEL" --task passkey,longgen --lengths 100 --depths 0.5 --samples 1 --seed 9 2>/dev/null)
[ "$(echo "$a" | awk '{print $5}')" = "$(echo "$b" | awk '{print $5}')" ] || bad "same seed, different accuracies"
[ "$(echo "$a" | grep -c '^passkey \|^longgen ')" -eq 2 ] || bad "--task selection: $a"

# usage errors exit 2
expect2() { "$KS" eval -m "$MODEL" "$@" >/dev/null 2>"$TMP/err"; rc=$?; [ $rc -eq 2 ] || bad "eval $* exited $rc"; }
expect2 --policy quest --budget 64
grep -q "KV-store issue" "$TMP/err" || bad "unknown policy message: $(cat "$TMP/err")"
expect2 --task nope
expect2 --lengths 100,abc
expect2 --depths 0,1.5
expect2 --depths 0.5,
expect2 --samples 0
expect2 --budget -3
expect2 --frobnicate
expect2 --lengths 4096
grep -q "trained context" "$TMP/err" || bad "all-lengths-skipped message: $(cat "$TMP/err")"
"$KS" eval --help | grep -q "usage" || bad "--help"

[ $fail -eq 0 ] && echo "eval.sh: all checks passed"
exit $fail
