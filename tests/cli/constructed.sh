#!/usr/bin/env bash
# constructed.sh — the constructed fixture (tests/fixtures/models/constructed.gguf,
# tools/make_constructed_model.py: weights solved by construction, not trained):
# it loads with valid metadata (llama architecture, GQA, 8K context, its
# tokenizer), and greedy output on a fixed retrieval prompt
# matches the committed golden continuation (tests/golden/bundled_continuation.txt)
# — the needle's digits, retrieved by attention, not memorised.  Its DLM
# (tests/fixtures/models/constructed-dlm, tools/make_constructed_dlm.py) loads as an EAGLE-3 checkpoint
# and, as the `spec` retrieval head, finds the needle with 8 selected entries
# where StreamingLLM with the same budget cannot.
# Usage: bash constructed.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$(readlink -f "$1"); FIX=$2; TMP=$3
mkdir -p "$TMP"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
MODEL="$SRC/tests/fixtures/models/constructed.gguf"
fail=0
bad() { echo "FAIL: $*"; fail=1; }
# has TEXT PATTERN WHAT: TEXT contains PATTERN (grep -e), else a failure naming WHAT
has() { echo "$1" | grep -q -e "$2" || bad "$3: $1"; }
[ -f "$MODEL" ] || { echo "FAIL: $MODEL missing"; exit 1; }
size=$(stat -c %s "$MODEL")
[ "$size" -le $((30 * 1024 * 1024)) ] || bad "constructed model is $size bytes (> 30 MB)"

info=$("$KS" info "$MODEL" 2>&1) || bad "info failed: $info"
has "$info" "architecture:  llama" "architecture"
has "$info" "8192 trained" "context length"
has "$info" "GQA" "not GQA"
has "$info" "tokenizer:     llama, 32000 tokens" "tokenizer"

PROMPT="A pass key is hidden in the text below. Remember it. The pass key is 31415. 31415 is the pass key. The quiet farmer walks near the old bridge. A small bird sings by the river today. What is the pass key? The pass key is"
out=$("$KS" run -m "$MODEL" -p "$PROMPT" -n 8 --temp 0 -t 2 2>"$TMP/err") || bad "run failed: $(cat "$TMP/err")"
want=$(cat "$SRC/tests/golden/bundled_continuation.txt")
[ "$out" = "$want" ] || bad "greedy continuation '$out', want '$want'"
# the needle changes, the answer follows it: retrieval, not memory
out2=$("$KS" run -m "$MODEL" -p "${PROMPT//31415/27182}" -n 8 --temp 0 -t 2 2>/dev/null)
case "$out2" in *27182*) ;; *) bad "changed needle not retrieved: '$out2'";; esac

DLM="$SRC/tests/fixtures/models/constructed-dlm"
[ -f "$DLM/config.json" ] && [ -f "$DLM/model.safetensors" ] || bad "DLM missing in $DLM"
dsize=$(du -sb "$DLM" | cut -f1)
[ "$dsize" -le $((10 * 1024 * 1024)) ] || bad "DLM is $dsize bytes (> 10 MB)"
dinfo=$("$KS" info "$DLM" 2>&1) || bad "info DLM failed: $dinfo"
has "$dinfo" "EAGLE-3 draft model" "DLM info"
has "$dinfo" "hidden 512 (target 512)" "DLM hidden size"
has "$dinfo" "kv 2 x" "DLM KV heads"
has "$dinfo" "aux layers \[0, 1, 1\]" "DLM aux layers"
SMALL="--budget 8 --sink 1 --window 4 --dense-layers 1"
out4=$("$KS" run -m "$MODEL" -p "$PROMPT" -n 8 --temp 0 -t 2 --policy spec $SMALL 2>"$TMP/err") ||
    bad "spec run failed: $(cat "$TMP/err")"
[ "$out4" = "$want" ] || bad "spec (DLM found beside the model) at 8 entries: '$out4', want '$want'"
out5=$("$KS" run -m "$MODEL" -p "$PROMPT" -n 8 --temp 0 -t 2 --policy streaming $SMALL 2>/dev/null)
case "$out5" in *31415*) bad "streaming at 8 entries still answers: the prompt does not test selection";; esac

[ $fail -eq 0 ] && echo "constructed.sh: all checks passed"
exit $fail
