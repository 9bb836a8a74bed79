#!/bin/sh
# Quiet Xeon: the sparse step at 32K with spec's projections packed (c8fcd0e + packing): auto (Q6_K groups here), Q8_0 panels, Q4_K groups.
set -u
K=${KVSIEVE:?the kvsieve binary}; M=${MODELS:?directory of M.gguf and M-dlm}/M.gguf
echo "=== start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
for w in auto q8_0 q4_k auto; do
  SPEC_WEIGHTS=$w tools/bench_sparse.sh $K $M 3 1 2048 32768 quest,spec "--policy-arg spec.dlm=${MODELS:?directory of M.gguf and M-dlm}/M-dlm"
  echo "--- $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
done
echo "=== end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
