#!/usr/bin/env bash
# constructed.sh — the constructed fixture (tests/fixtures/models/constructed.gguf.gz,
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
. "$(dirname "$0")/lib/check.sh"
. "$SRC/tests/fixtures/constructed.sh"
unpack_constructed "$SRC" "$TMP/fixture" || { echo "FAIL: cannot unpack the constructed fixture"; exit 1; }
MODEL=$CONSTRUCTED
check_bundled_model "$KS" "$MODEL" 8192 32000

PROMPT=$PASSKEY_PROMPT
out=$("$KS" run -m "$MODEL" -p "$PROMPT" -n 8 --temp 0 -t 2 2>"$TMP/err") || bad "run failed: $(cat "$TMP/err")"
want=$(cat "$SRC/tests/golden/bundled_continuation.txt")
[ "$out" = "$want" ] || bad "greedy continuation '$out', want '$want'"
# the needle changes, the answer follows it: retrieval, not memory
out2=$("$KS" run -m "$MODEL" -p "${PROMPT//31415/27182}" -n 8 --temp 0 -t 2 2>/dev/null)
case "$out2" in *27182*) ;; *) bad "changed needle not retrieved: '$out2'";; esac

DLM="$TMP/fixture/constructed-dlm"
check_bundled_dlm "$KS" "$DLM" 512 "0, 1, 1"
SMALL="--budget 8 --sink 1 --window 4 --dense-layers 1"
out4=$("$KS" run -m "$MODEL" -p "$PROMPT" -n 8 --temp 0 -t 2 --policy spec $SMALL 2>"$TMP/err") ||
    bad "spec run failed: $(cat "$TMP/err")"
[ "$out4" = "$want" ] || bad "spec (DLM found beside the model) at 8 entries: '$out4', want '$want'"
out5=$("$KS" run -m "$MODEL" -p "$PROMPT" -n 8 --temp 0 -t 2 --policy streaming $SMALL 2>/dev/null)
case "$out5" in *31415*) bad "streaming at 8 entries still answers: the prompt does not test selection";; esac

finish constructed.sh
