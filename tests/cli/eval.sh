#!/usr/bin/env bash
# eval.sh — `kvsieve eval` end to end on the real aidreams260K model (context
# 128): every task runs at length ~100 with 2 samples, the table and the JSON
# agree on the cells, --plot writes SVG that an XML parser accepts, lengths
# over the trained context are skipped (or refused when nothing is left),
# policies run beside dense with their comparison metrics (a full budget
# agrees with dense exactly), and bad flags / unknown policies are usage
# errors (exit 2); --show prints each instance and --dump-prompts writes each prompt.  The tiny model scores ~0 on these tasks; only the harness
# is under test here.
# Usage: bash eval.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$1; FIX=$2; TMP=$3
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not found (it checks the JSON and SVG)"; exit 77; }  # CTest SKIP_RETURN_CODE
mkdir -p "$TMP"
MODEL="$FIX/models/aidreams260K.gguf"
BUNDLED="$(cd "$(dirname "$0")/../.." && pwd)/models/kvsieve-default.gguf"
. "$(dirname "$0")/lib/check.sh"

# table: a header and one row per task x depth
out=$("$KS" eval -m "$MODEL" --lengths 100 --depths 0,0.5,1 --samples 2 -t 2 2>"$TMP/err")
[ $? -eq 0 ] || bad "table run failed: $(cat "$TMP/err")"
echo "$out" | head -1 | grep -q "accuracy" || bad "no table header: $out"
for t in passkey multikey multivalue vartrack longgen; do
  n=$(echo "$out" | grep -c "^dense  *$t ")
  [ "$n" -eq 3 ] || bad "$t: $n rows, want 3"
done
echo "$out" | grep -q "^mean all" || bad "no overall mean"

# --show: every instance's question, expected answer and generated tokens on stderr
"$KS" eval -m "$MODEL" --task multikey,longgen --lengths 100 --depths 0.5 --samples 1 -t 2 --show \
  >/dev/null 2>"$TMP/show" || bad "--show run failed: $(cat "$TMP/show")"
[ "$(grep -c '^\[multikey 100 depth 0.50 #0\]' "$TMP/show")" -eq 1 ] || bad "--show: no multikey instance: $(cat "$TMP/show")"

# --dump-prompts: one file per instance, the prompt whose tail --show printed; an unwritable DIR is an error
rm -rf "$TMP/prompts"; mkdir -p "$TMP/prompts"
"$KS" eval -m "$MODEL" --task multikey --lengths 100 --depths 0.5 --samples 2 -t 2 --dump-prompts "$TMP/prompts" \
  >/dev/null 2>"$TMP/dump" || bad "--dump-prompts run failed: $(cat "$TMP/dump")"
for s in 0 1; do
  f="$TMP/prompts/multikey-100-0.50-$s.txt"
  [ -s "$f" ] && grep -q "magic number" "$f" || bad "--dump-prompts: $f missing or not a multikey prompt"
done
"$KS" eval -m "$MODEL" --task multikey --lengths 100 --depths 0.5 --samples 1 -t 2 --dump-prompts "$TMP/no/such/dir" \
  >/dev/null 2>"$TMP/dump"
[ $? -ne 0 ] && grep -q "cannot write" "$TMP/dump" || bad "--dump-prompts into a missing directory did not fail clearly"
grep -q '^  facts: | *The magic number for' "$TMP/show" || bad "--show: no facts line"
[ "$(grep -c '^  generated: ' "$TMP/show")" -eq 2 ] || bad "--show: want 2 generated lines"

# JSON parses and covers every task; same seed, same accuracies as the table
"$KS" eval -m "$MODEL" --lengths 100,4096 --depths 0,0.5,1 --samples 2 -t 2 --json \
  --plot "$TMP/eval.svg" >"$TMP/eval.json" 2>"$TMP/err" || bad "json run failed: $(cat "$TMP/err")"
grep -q "skipping length 4096" "$TMP/err" || bad "length over the trained context not noted"
python3 - "$TMP/eval.json" "$out" <<'PY' || bad "eval JSON"
import json, sys
d = json.load(open(sys.argv[1]))
rows = d["results"]
assert d["samples"] == 2, d
assert {r["task"] for r in rows} == {"passkey", "multikey", "multivalue", "vartrack", "longgen"}, rows
assert len(rows) == 15 and all(r["length"] == 100 for r in rows), rows
for r in rows:
    assert 0 <= r["accuracy"] <= 1 and r["tok_s"] > 0 and 90 <= r["mean_tokens"] <= 100, r
table = {}
for line in sys.argv[2].splitlines()[1:]:
    f = line.split()
    if len(f) == 11 and f[0] == "dense":
        table[(f[1], float(f[3]))] = float(f[5])
for r in rows:
    assert abs(table[(r["task"], r["depth"])] - r["accuracy"]) < 1e-3, (r, table)
assert 0 <= d["summary"][0]["all"] <= 1 and d["summary"][0]["config"] == "dense"
PY
[ -s "$TMP/eval.svg" ] || bad "no SVG written"
python3 -c 'import xml.dom.minidom,sys; xml.dom.minidom.parse(sys.argv[1])' "$TMP/eval.svg" || bad "SVG is not well-formed XML"
grep -q "evidence depth" "$TMP/eval.svg" || bad "SVG lacks the heat map"
grep -q "KV budget" "$TMP/eval.svg" || bad "SVG lacks the budget chart"

# one task, deterministic across runs
a=$("$KS" eval -m "$MODEL" --task passkey,longgen --lengths 100 --depths 0.5 --samples 1 --seed 9 2>/dev/null)
b=$("$KS" eval -m "$MODEL" --task passkey,longgen --lengths 100 --depths 0.5 --samples 1 --seed 9 2>/dev/null)
[ "$(echo "$a" | awk '{print $6}')" = "$(echo "$b" | awk '{print $6}')" ] || bad "same seed, different accuracies"
[ "$(echo "$a" | grep -c '^dense  *passkey \|^dense  *longgen ')" -eq 2 ] || bad "--task selection: $a"

# policies beside dense: a budget covering the context agrees with dense exactly;
# a small one attends less (recall < 1) and reports every metric
"$KS" eval -m "$MODEL" --task passkey,longgen --lengths 100 --depths 0.5 --samples 1 -t 2 --page 8 --window 8 \
  --policy dense,quest,streaming,h2o,snapkv+quest --budget 100%,25% --json >"$TMP/pol.json" 2>"$TMP/err" \
  || bad "policy eval failed: $(cat "$TMP/err")"
python3 - "$TMP/pol.json" <<'PY' || bad "policy eval JSON"
import json, sys
d = json.load(open(sys.argv[1]))
s = {x["config"]: x for x in d["summary"]}
assert set(s) == {"dense", "quest@100%", "quest@25%", "streaming@100%", "streaming@25%", "h2o@100%", "h2o@25%",
                  "snapkv+quest@100%", "snapkv+quest@25%"}, s.keys()
for name, x in s.items():
    if name == "dense":
        continue
    assert 0 <= x["agreement_forced"] <= 1 and 0 <= x["agreement_free"] <= 1 and x["kl"] >= -1e-9, x
    if name.endswith("@100%"):
        assert x["agreement_forced"] == 1 and x["agreement_free"] == 1 and abs(x["kl"]) < 1e-9, x
        assert x["all"] == s["dense"]["all"], x
        if "attention_recall" in x:
            assert x["attention_recall"] == 1, x
assert s["streaming@25%"]["attention_recall"] < 1, s["streaming@25%"]
assert "attention_recall" not in s["snapkv+quest@25%"], "recall after eviction is not measurable"
PY

# 8-bit KV and other kernels against the f16 reference: dense is then a compared configuration
# (8-bit rows need a head dim of 32 or more: the bundled model's)
"$KS" eval -m "$BUNDLED" --task passkey --lengths 100 --depths 0.5 --samples 1 -t 2 --policy dense,quest --budget 50% \
    --kv-type q8 --json >"$TMP/q8.json" 2>"$TMP/err" || bad "eval --kv-type q8 failed: $(cat "$TMP/err")"
python3 - "$TMP/q8.json" <<'PY' || bad "eval --kv-type q8 JSON"
import json, sys
d = json.load(open(sys.argv[1]))
s = {x["config"]: x for x in d["summary"]}
assert set(s) == {"dense", "dense/q8", "quest@50%/q8"}, sorted(s)
assert 0 <= s["dense/q8"]["agreement_forced"] <= 1 and s["dense/q8"]["kl"] >= 0, s["dense/q8"]
assert all(r["kv_type"] == "q8" for r in d["results"] if r["config"] != "dense")
PY
"$KS" eval -m "$MODEL" --task passkey --lengths 100 --depths 0.5 --samples 1 -t 2 --policy dense --reference-simd scalar \
    >"$TMP/ref.txt" 2>"$TMP/err" || bad "eval --reference-simd failed: $(cat "$TMP/err")"
grep -q "^dense/ref-scalar" "$TMP/ref.txt" || bad "reference label: $(cat "$TMP/ref.txt")"

# --share-prefill: the prompt computed once per prefill setting and restored by the other configurations
# and the teacher-forced runs; every figure but tok/s is the separate prefills' (spec recomputes until its
# own run cached its head's keys, lrqk is never restored), and the restored rows are reported
for sp in "" --share-prefill; do
  "$KS" eval -m "$BUNDLED" --task passkey,longgen --lengths 300 --depths 0.5 --samples 2 -t 2 \
    --policy quest,spec,snapkv,lrqk,dapq --budget 25% --json $sp >"$TMP/share$sp.json" 2>"$TMP/share$sp.err" \
    || bad "eval $sp failed: $(cat "$TMP/share$sp.err")"
done
grep -q "share-prefill restored [1-9][0-9]* of [0-9]* prompt rows" "$TMP/share--share-prefill.err" \
  || bad "--share-prefill: no restored rows reported: $(cat "$TMP/share--share-prefill.err")"
grep -q "share-prefill" "$TMP/share.err" && bad "restored rows reported without --share-prefill"
python3 - "$TMP/share.json" "$TMP/share--share-prefill.json" <<'PY' || bad "--share-prefill changed a figure"
import json, sys
def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if k != "tok_s"}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x
a, b = (strip(json.load(open(f))) for f in sys.argv[1:3])
assert len(a["summary"]) == 6, a["summary"]
assert a == b, (a, b)
PY
# a reference on other kernels caches nothing the compared configurations would restore
for sp in "" --share-prefill; do
  "$KS" eval -m "$BUNDLED" --task passkey --lengths 300 --depths 0.5 --samples 1 -t 2 --policy dense,quest \
    --budget 25% --reference-simd scalar --json $sp >"$TMP/rsimd$sp.json" 2>"$TMP/err" || bad "eval --reference-simd $sp failed"
done
python3 - "$TMP/rsimd.json" "$TMP/rsimd--share-prefill.json" <<'PY' || bad "--share-prefill with --reference-simd changed a figure"
import json, sys
strip = lambda d: [{k: v for k, v in x.items() if k != "tok_s"} for x in d["summary"]]
a, b = (strip(json.load(open(f))) for f in sys.argv[1:3])
assert a == b and a[1]["config"] == "dense", (a, b)
PY

# usage errors exit 2
expect2() { "$KS" eval -m "$MODEL" "$@" >/dev/null 2>"$TMP/err"; rc=$?; [ $rc -eq 2 ] || bad "eval $* exited $rc"; }
expect2 --policy nosuch --budget 64
grep -q "unknown policy 'nosuch'" "$TMP/err" || bad "unknown policy message: $(cat "$TMP/err")"
expect2 --policy quest --budget 101%
expect2 --task nope
expect2 --lengths 100,abc
expect2 --depths 0,1.5
expect2 --depths 0.5,
expect2 --samples 0
expect2 --budget -3
expect2 --frobnicate
expect2 --kv-type q4
expect2 --reference-simd sse
expect2 --lengths 4096
grep -q "trained context" "$TMP/err" || bad "all-lengths-skipped message: $(cat "$TMP/err")"
"$KS" eval --help | grep -q "usage" || bad "--help"

finish eval.sh
