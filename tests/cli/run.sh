#!/usr/bin/env bash
# run.sh — the user-facing subcommands end to end on the real pretrained
# aidreams260K model: greedy text, stop strings, streaming to stdout with
# stats on stderr, the prompt/context contract, tokenize (lines and JSON),
# perplexity, info, and a tiny bench with --json parsed by Python.
# Usage: bash run.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$1; FIX=$2; TMP=$3
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not found (it checks perplexity and the bench JSON)"; exit 77; }  # CTest SKIP_RETURN_CODE
mkdir -p "$TMP"
MODEL="$FIX/models/aidreams260K.gguf"
. "$(dirname "$0")/lib/check.sh"

# greedy text is the fixture's documented continuation; stats go to stderr only
out=$("$KS" run -m "$MODEL" -p "Once upon a time" -n 24 --temp 0 -t 2 2>"$TMP/err")
[ $? -eq 0 ] || bad "run exited non-zero: $(cat "$TMP/err")"
case "$out" in ", pixels unfolding like petals."*) ;; *) bad "greedy text: '$out'";; esac
grep -q "tok/s" "$TMP/err" || bad "no throughput on stderr"
grep -q "GB/s" "$TMP/err" || bad "no bandwidth on stderr"

# a stop string ends generation and is never printed
out=$("$KS" run -m "$MODEL" -p "Once upon a time" -n 60 --temp 0 --stop "petals" 2>"$TMP/err")
[ "$out" = ", pixels unfolding like " ] || bad "stop string: '$out'"
grep -q "stopped by stop string" "$TMP/err" || bad "stop reason not reported"

# seeded sampling is reproducible; different seeds differ
a=$("$KS" run -m "$MODEL" -p "Once upon a time" -n 40 --temp 1.0 --seed 7 2>/dev/null)
b=$("$KS" run -m "$MODEL" -p "Once upon a time" -n 40 --temp 1.0 --seed 7 2>/dev/null)
c=$("$KS" run -m "$MODEL" -p "Once upon a time" -n 40 --temp 1.0 --seed 8 2>/dev/null)
[ "$a" = "$b" ] || bad "same seed, different text"
[ "$a" != "$c" ] || bad "different seeds gave identical text"

# DapQ's pseudo tokens: the context run sizes itself has room for all 32;
# a -c without that room runs fewer and says so
P="Once upon a time there was a little girl who lived in a village"
"$KS" run -m "$MODEL" -p "$P" -n 4 --temp 0 --policy dapq --budget 12 >/dev/null 2>"$TMP/err" || bad "dapq run failed"
grep -q "pseudo tokens fit" "$TMP/err" && bad "dapq lacked room in a context run sized: $(cat "$TMP/err")"
"$KS" run -m "$MODEL" -p "$P" -n 4 --temp 0 --policy dapq --budget 12 -c 50 >/dev/null 2>"$TMP/err" || bad "dapq -c 50 failed"
grep -q "9 of 32 pseudo tokens fit after a 41-token prompt (context 50; 73 would fit them all)" "$TMP/err" ||
    bad "dapq's shortfall note: $(cat "$TMP/err")"

# prompt from a file; -n 0 generates nothing
printf 'Once upon a time' > "$TMP/prompt.txt"
out=$("$KS" run -m "$MODEL" -f "$TMP/prompt.txt" -n 8 --temp 0 2>/dev/null)
case "$out" in ", pixels"*) ;; *) bad "-f prompt: '$out'";; esac
"$KS" run -m "$MODEL" -p "hi" -n 0 >/dev/null 2>&1 || bad "-n 0 failed"

# the context contract: clear errors, exit 2
"$KS" run -m "$MODEL" -p "" -n 4 >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] && grep -q "empty" "$TMP/err" || bad "empty prompt: rc $rc $(cat "$TMP/err")"
long=$(for i in $(seq 1 200); do printf 'once upon a time '; done)
"$KS" run -m "$MODEL" -p "$long" -n 4 >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] && grep -q "exceed the context" "$TMP/err" || bad "prompt over context: rc $rc $(cat "$TMP/err")"
"$KS" run -m "$MODEL" -p "hi" -n 4 -c 100000 >/dev/null 2>"$TMP/err" || bad "-c beyond the trained context should warn, not fail"
"$KS" run -m "$MODEL" -p "hi" --temp -1 >/dev/null 2>&1; [ $? -eq 2 ] || bad "negative temperature accepted"
"$KS" run -m "$MODEL" -p "hi" -f x >/dev/null 2>&1; [ $? -eq 2 ] || bad "-p and -f together accepted"

# tokenize: one id per line, JSON, and on a vocabulary-only file
ids=$("$KS" tokenize -m "$MODEL" -p "Once upon a time" | tr '\n' ' ')
json=$("$KS" tokenize -m "$MODEL" -p "Once upon a time" --json)
[ -n "$ids" ] || bad "tokenize printed nothing"
[ "$json" = "[$(echo $ids | sed 's/ /, /g')]" ] || bad "tokenize json '$json' vs lines '$ids'"
v=$("$KS" tokenize -m "$FIX/tokenizer/ggml-vocab-gpt-2.gguf" -p "Hello world" --json)
[ "$v" = "[15496, 995]" ] || bad "gpt-2 vocab-only tokenize: $v"

# perplexity of the model's own greedy text is low; of shuffled text higher
"$KS" run -m "$MODEL" -p "Once upon a time" -n 100 --temp 0 2>/dev/null > "$TMP/own.txt"
p=$("$KS" perplexity -m "$MODEL" -f "$TMP/own.txt" -c 128 2>/dev/null | sed -n 's/^perplexity: \([0-9.]*\).*/\1/p')
[ -n "$p" ] || bad "perplexity printed nothing"
python3 -c "import sys; sys.exit(0 if float('$p') < 3.0 else 1)" || bad "perplexity of greedy text $p >= 3"

# info and a tiny bench with parseable JSON
"$KS" info "$MODEL" | grep -q "n_embd 64" || bad "info shape"
"$KS" bench -m "$MODEL" --depth 0,64 --batch 1,2 --n-gen 2 --n-prompt 16 -t 2 --json 2>/dev/null > "$TMP/bench.json" || bad "bench failed"
python3 - "$TMP/bench.json" <<'PY' || bad "bench JSON"
import json, sys
d = json.load(open(sys.argv[1]))
rows = [r for r in d["results"] if r["test"] == "decode"]
assert len(rows) == 4 and all(r["tok_s"] > 0 and r["gb_s"] > 0 for r in rows), rows
# the per-policy cost breakdown (docs/DESIGN.md, "Measuring")
for k in ("select_share", "gather_share", "kv_gb_per_step", "select_gb_per_step", "gather_mb_per_step",
          "mb_moved_per_step", "wait_ms_per_step"):
    assert all(k in r and r[k] >= 0 for r in rows), k
assert d["bandwidth"]["best_gbs"] > 0
PY
# --prefill-reps: every repetition's row, then their median and range
"$KS" bench -m "$MODEL" --no-prefill --depth 0 --n-gen 1 -t 1 --json >/dev/null 2>&1 || bad "bench --no-prefill"
"$KS" bench -m "$MODEL" --depth 0 --n-gen 1 --n-prompt 16,24 --prefill-reps 3 -t 1 --json 2>/dev/null > "$TMP/reps.json" || bad "bench --prefill-reps"
python3 - "$TMP/reps.json" <<'PY' || bad "bench --prefill-reps JSON"
import json, sys
d = json.load(open(sys.argv[1]))
rows = [r for r in d["results"] if r["test"] == "prefill"]
sums = [r for r in d["results"] if r["test"] == "prefill_summary"]
assert [(r["tokens"], r["rep"]) for r in rows] == [(16, 0), (16, 1), (16, 2), (24, 0), (24, 1), (24, 2)], rows
assert [s["tokens"] for s in sums] == [16, 24] and all(s["reps"] == 3 for s in sums), sums
for s in sums:
    toks = sorted(r["tok_s"] for r in rows if r["tokens"] == s["tokens"])
    assert s["tok_s_min"] <= s["tok_s_median"] <= s["tok_s_max"] and abs(s["tok_s_median"] - toks[1]) < 1e-2 * toks[1], s
PY
"$KS" bench -m "$MODEL" --n-prompt 16 --prefill-reps 0 >/dev/null 2>&1 && bad "--prefill-reps 0 accepted"

# --chat: a model whose vocabulary carries a template (phi-3) formats the turn
# with its special tokens parsed; one without a template is a clear error
"$KS" gen-model --shape tiny-llama --type q8_0 --vocab-from "$FIX/tokenizer/ggml-vocab-phi-3.gguf" --out "$TMP/phi3.gguf" >/dev/null 2>&1 || bad "gen-model phi-3 vocab"
"$KS" run -m "$TMP/phi3.gguf" --chat --system "Be brief." -p "Hello" -n 4 --temp 0 >/dev/null 2>"$TMP/err" || bad "--chat on a templated model: $(cat "$TMP/err")"
grep -q "prompt:  *[0-9]* tokens" "$TMP/err" || bad "--chat prompt stats missing"
"$KS" run -m "$MODEL" --chat -p "Hello" -n 4 >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 1 ] && grep -q "chat template" "$TMP/err" || bad "--chat without a template: rc $rc $(cat "$TMP/err")"

finish run.sh
