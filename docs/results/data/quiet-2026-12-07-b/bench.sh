#!/bin/bash
# quiet-host benchmarks of main 2d81ac7 (binary kvsieve-new) against llama.cpp d32676d and main e5a9618 (kvsieve old)
set -u
NEW=/work/data/final/kvsieve-new; OLD=/work/data/final/kvsieve; LB=/work/llama.cpp/build/bin; O=/work/data/final3
M=/work/data/long/M.gguf
cd /work/wt/integ
L() { echo "# $1 $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $O/log.txt; }
L start
KVSIEVE=$NEW REPS=1 LOCK= LB_EXTRA="-r 2" tools/bench_quant_vs_llama.sh $O/quant /work/data/quant/ks-q4_k_m.gguf /work/data/quant/ks-q5_k_m.gguf /work/data/quant/ks-iq4_xs.gguf >> $O/log.txt 2>&1
L quant-done
tools/bench_sparse.sh $NEW $M 3 1 2048 32768 quest,spec "--policy-arg spec.dlm=/work/data/long/M-dlm" > $O/sparse32k-new.txt 2>&1
L sparse-new-done
tools/bench_sparse.sh $OLD $M 2 1 2048 32768 spec "--policy-arg spec.dlm=/work/data/long/M-dlm" > $O/sparse32k-old.txt 2>&1
L sparse-old-done
/usr/bin/time -v $NEW bench -m $M -t 2 --n-prompt 32 --prefill-depth 131072 --prefill-reps 2 --depth 0 --n-gen 1 --prefill-policy quest > $O/followup128k.txt 2>&1
L followup-done
BEFORE=$OLD AFTER=$NEW bash docs/results/data/moe-realsize/pair-dsv2.sh > $O/dsv2.txt 2>&1
L dsv2-done
