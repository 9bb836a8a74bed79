#!/bin/sh
# Issue 49 item 2: sparse against dense prefill at 32K and 64K on the bundled model's YaRN x4 copy
# (kd-yarn64k.gguf: docs/results/EVAL.md, "Past the bundled model's 16K"), every task at depths
# 0.25/0.5/0.75, one instance each, held-out seed 3601.  One JSON per (length, task), skipped when
# it exists, so a killed run resumes where it stopped: run the same command again.
# Usage: KVSIEVE=build/kvsieve MODEL=kd-yarn64k.gguf OUT=dir [LENGTHS="32768 65536"] [TASKS=...] docs/results/data/eval-sparse-prefill-grid/run.sh
set -u
K=${KVSIEVE:?kvsieve binary}; M=${MODEL:?kd-yarn64k.gguf}; O=${OUT:?output directory}
mkdir -p "$O"
for L in ${LENGTHS:-32768 65536}; do
  for T in ${TASKS:-passkey multikey multivalue vartrack longgen}; do
    f="$O/eval-sparse-prefill-$L-$T-seed3601.json"
    [ -s "$f" ] && continue
    echo "=== $L $T start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
    if "$K" eval -m "$M" --task "$T" --lengths "$L" --depths 0.25,0.5,0.75 --samples 1 --seed 3601 -t 2 \
         --policy dense --prefill-policy quest --share-prefill --json > "$f.tmp" 2> "$O/$L-$T.err"; then
      mv "$f.tmp" "$f"
    else
      echo "failed: $(tail -3 "$O/$L-$T.err")"
    fi
    echo "=== $L $T end $(date -u +%H:%M:%S)"
  done
done
