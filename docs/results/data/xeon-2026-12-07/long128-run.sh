#!/bin/sh
# 128K first answer with --prefill-policy quest and its follow-up through --prompt-cache
# (tools/measure_sparse_followup.sh's steps for L=128, at normal priority). Resume: run again.
set -u
KS=/work/data/final4/kvsieve; M=/work/data/long/M.gguf; OUT=/work/data/long128; L=128
words=$(( L * 14600 / 16 ))
python3 /work/main/tools/long_prompt.py "$words" > "$OUT/d$L.txt"
{ cat "$OUT/d$L.txt"; printf '\nQuestion: what does the farmer walk near? Answer:'; } > "$OUT/p${L}a.txt"
{ cat "$OUT/d$L.txt"; printf '\nQuestion: where do the children play? Answer:'; } > "$OUT/p${L}b.txt"
for q in a b; do
  [ -f "$OUT/done-$q" ] && continue
  echo "=== ${L}K $q $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  /usr/bin/time -v "$KS" run -m "$M" -f "$OUT/p$L$q.txt" -n 1 -c 131072 -t 2 \
    --prefill-policy quest --temp 0 --prompt-cache "$OUT/cache$L.kv" --prompt-cache-every 8192 2>&1 && touch "$OUT/done-$q"
done
echo "=== done $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
