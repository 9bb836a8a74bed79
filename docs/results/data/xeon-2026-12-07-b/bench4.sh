#!/bin/sh
# Quiet Xeon: the sparse step at 32K, binary f5eb37f (quest bounds=q8 by default, spec auto = Q6_K groups here), twice.
set -u
K=${KVSIEVE:?the kvsieve binary}; M=${MODELS:?directory of M.gguf and M-dlm}/M.gguf
echo "=== start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
for w in auto auto; do
  SPEC_WEIGHTS=$w tools/bench_sparse.sh $K $M 3 1 2048 32768 quest,spec "--policy-arg spec.dlm=${MODELS:?directory of M.gguf and M-dlm}/M-dlm"
  echo "--- $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
done
echo "=== end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
