#!/usr/bin/env bash
# perplexity.sh — `kvsieve perplexity --score-second-half`, llama-perplexity's
# scoring (whole windows of -c tokens, BOS first, predictions from c/2 on), on
# the real aidreams260K model (context 128): it runs, scores exactly half a
# window less one token per window over whole windows only, gives a finite
# figure different from the default mode's, works with a policy, and bad
# values are usage errors (exit 2).  No Python: awk does the arithmetic.
# Usage: bash perplexity.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$1; FIX=$2; TMP=$3
mkdir -p "$TMP"
MODEL="$FIX/models/aidreams260K.gguf"
. "$(dirname "$0")/lib/check.sh"
# field N of the "perplexity: P +/- E over T tokens in W windows of C" line
ppl() { sed -n 's/^perplexity: \([0-9.]*\) +\/- [0-9.]* over \([0-9]*\) tokens in \([0-9]*\) windows.*/\1 \2 \3/p'; }

# a few hundred tokens of text: the model's own sampled stories
: > "$TMP/a.txt"
for seed in 1 2 3 4; do
  "$KS" run -m "$MODEL" -p "Once upon a time" -n 100 --temp 0.8 --seed $seed -t 2 2>/dev/null >> "$TMP/a.txt"
  echo >> "$TMP/a.txt"
done
n=$("$KS" tokenize -m "$MODEL" -f "$TMP/a.txt" --bos 2>/dev/null | wc -l)  # the scored stream: BOS + text
[ "$n" -ge 257 ] || bad "test text has only $n tokens, want > 256"

full=$("$KS" perplexity -m "$MODEL" -f "$TMP/a.txt" -c 128 -t 2 2>"$TMP/err" | ppl)
[ -n "$full" ] || bad "default perplexity printed nothing: $(cat "$TMP/err")"
half=$("$KS" perplexity -m "$MODEL" -f "$TMP/a.txt" -c 128 -t 2 --score-second-half 2>"$TMP/err" | ppl)
[ -n "$half" ] || bad "--score-second-half printed nothing: $(cat "$TMP/err")"
set -- $half
p=$1 tok=$2 win=$3
# whole windows of 128 from BOS + text; 63 predictions scored in each (64..126 -> 65..127)
want_win=$(( n / 128 ))
[ "$win" = "$want_win" ] || bad "--score-second-half: $win windows, want $want_win (of $n tokens)"
[ "$tok" = $((win * 63)) ] || bad "--score-second-half: $tok tokens scored in $win windows, want $((win * 63))"
awk -v p="$p" -v f="${full%% *}" 'BEGIN { exit !(p == p + 0 && p > 1 && p < 1e6 && p != f) }' \
  || bad "--score-second-half figure '$p' not finite or equal to the default '${full%% *}'"
# the run was deterministic: the same figure again
again=$("$KS" perplexity -m "$MODEL" -f "$TMP/a.txt" -c 128 -t 2 --score-second-half 2>/dev/null | ppl)
[ "$again" = "$half" ] || bad "second run: '$again' vs '$half'"
# --windows caps the windows; a policy runs too (teacher-forced from c/2)
one=$("$KS" perplexity -m "$MODEL" -f "$TMP/a.txt" -c 128 -t 2 --score-second-half --windows 1 2>/dev/null | ppl)
case "$one" in *" 63 1") ;; *) bad "--windows 1: '$one'";; esac
pol=$("$KS" perplexity -m "$MODEL" -f "$TMP/a.txt" -c 128 -t 2 --score-second-half --policy streaming --budget 32 \
  --page 8 2>"$TMP/err" | ppl)
[ -n "$pol" ] || bad "--score-second-half with a policy: $(cat "$TMP/err")"

# bad values: exit 2 with a message
expect2() {
  "$KS" perplexity -m "$MODEL" "$@" >/dev/null 2>"$TMP/err"; rc=$?
  [ $rc -eq 2 ] && [ -s "$TMP/err" ] || bad "perplexity $* exited $rc: $(cat "$TMP/err")"
}
expect2 -f "$TMP/a.txt" -c 2 --score-second-half                  # no token left to score
expect2 -f "$TMP/a.txt" -c 128 --score-second-half --decode-from 100  # decoding starts past the scored half
printf 'Once upon a time' > "$TMP/short.txt"
expect2 -f "$TMP/short.txt" -c 128 --score-second-half            # not one whole window
expect2 -f "$TMP/a.txt" --score-second-half=1                      # a flag takes no value

finish perplexity.sh
