#!/bin/bash
# quiet-host side by side of the q4kz binary (AVX-512 VNNI K-quant / IQ4_XS groups) and main 5a2dc6b against llama.cpp d32676d
set -u
NEW=/work/data/final4/kvsieve-q4kz; OLD=/work/data/final4/kvsieve; O=/work/data/final4
cd /work/main
L() { echo "# $1 $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $O/log2.txt; }
L start
KVSIEVE=$NEW REPS=1 LOCK= LB_EXTRA="-r 2" tools/bench_quant_vs_llama.sh $O/quant2 /work/data/quant/ks-q4_k_m.gguf /work/data/quant/ks-q5_k_m.gguf /work/data/quant/ks-iq4_xs.gguf >> $O/log2.txt 2>&1
L quant-new-done
for f in ks-q4_k_m ks-q5_k_m ks-iq4_xs; do
  for b in $OLD $NEW; do
    echo "== $b $f $(date -u +%T)" >> $O/ab2.txt
    $b bench -m /work/data/quant/$f.gguf -t 2 --n-prompt 512 --n-gen 32 --depth 0 2>&1 | grep -E "^(prefill|dense) " >> $O/ab2.txt
  done
done
L ab-done
