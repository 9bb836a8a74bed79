#!/bin/sh
# measure_sparse_followup.sh KVSIEVE MODEL OUTDIR [LENGTHS_K...] — time to the
# first token of a sparse prefill (--prefill-policy quest) and of a follow-up
# that restores it through run --prompt-cache (docs/BENCHMARKS.md, row "128K").
# Each length L (in K tokens, default 16 32): a document of tools/long_prompt.py
# words (~1.1 tokens a word: 14600 words for 16K, 29400 for 32K), then question a
# (the first answer: nothing cached, the file is written) and question b (the
# follow-up: the document's blocks restored from the file).  /usr/bin/time -v
# logs CPU seconds and peak RSS beside each run's own timings; nice 19, so on a
# shared host the wall figures are the host's.  Resume: the same command again,
# with only the lengths still to run: a first answer cut off midway restarts
# from its last checkpoint in the length's cache file (run --prompt-cache-every
# 8192: the prompt's blocks are appended to the file every 8192 tokens), which
# is removed only once both questions of the length are done.
set -u
KS=$1; M=$2; OUT=$3; shift 3
LENS=${*:-16 32}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
for L in $LENS; do
  words=$(( L * 14600 / 16 ))
  [ "$L" = 32 ] && words=29400
  python3 "$HERE/long_prompt.py" "$words" > "$OUT/d$L.txt"
  { cat "$OUT/d$L.txt"; printf '\nQuestion: what does the farmer walk near? Answer:'; } > "$OUT/p${L}a.txt"
  { cat "$OUT/d$L.txt"; printf '\nQuestion: where do the children play? Answer:'; } > "$OUT/p${L}b.txt"
  for q in a b; do
    echo "=== ${L}K $q $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
    nice -n 19 /usr/bin/time -v "$KS" run -m "$M" -f "$OUT/p$L$q.txt" -n 1 -c $(( L * 1024 )) -t 2 \
      --prefill-policy quest --temp 0 --prompt-cache "$OUT/cache$L.kv" --prompt-cache-every 8192 2>&1
  done
  rm -f "$OUT/cache$L.kv"
done
echo "=== done $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
