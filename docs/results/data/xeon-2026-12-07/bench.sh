#!/bin/bash
# quiet-host benchmarks of main (binary copied to /work/data/final4/kvsieve) against llama.cpp d32676d
set -u
NEW=/work/data/final4/kvsieve; LB=/work/llama.cpp/build/bin; O=/work/data/final4
M=/work/data/long/M.gguf
cd /work/main
L() { echo "# $1 $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $O/log.txt; }
L start
KVSIEVE=$NEW REPS=1 LOCK= LB_EXTRA="-r 2" tools/bench_quant_vs_llama.sh $O/quant /work/data/quant/ks-q4_k_m.gguf /work/data/quant/ks-q5_k_m.gguf /work/data/quant/ks-iq4_xs.gguf >> $O/log.txt 2>&1
L quant-done
tools/bench_sparse.sh $NEW $M 3 1 2048 32768 quest,spec "--policy-arg spec.dlm=/work/data/long/M-dlm" > $O/sparse32k.txt 2>&1
L sparse-done
BEFORE=$NEW AFTER=$NEW F=/work/data/moe/dsv2lite-q4km.gguf bash docs/results/data/moe-realsize/pair-dsv2.sh > $O/dsv2.txt 2>&1
L dsv2-done
