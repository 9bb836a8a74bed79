#!/bin/sh
# (binary of c8fcd0e: its weights=auto probe never took Q6_K, so "auto" here is Q8_0 rows like q8_0)
# Quiet Xeon, nothing else running: the sparse step at 32K (M; quest, spec with its default projections
# and with Q8_0, alternated), then Gemma-3-4B at 64K (dense, quest, spec at 6% on the global layers).
set -u
K=${KVSIEVE:?the kvsieve binary}; M=${MODELS:?directory of M.gguf and M-dlm}/M.gguf; G=${GEMMA:?directory of gemma-3-4b-q4km.gguf and dlm}
echo "=== start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
for i in 1 2; do
  for w in auto q8_0; do
    SPEC_WEIGHTS=$w tools/bench_sparse.sh $K $M 3 1 2048 32768 quest,spec "--policy-arg spec.dlm=${MODELS}/M-dlm"
    echo "--- $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  done
done
for w in auto q8_0; do
  /usr/bin/time -v $K bench -m $G/gemma-3-4b-q4km.gguf --depth 65536 --batch 1 -t 2 --n-gen 8 --no-prefill \
    --policy dense,quest,spec --budget 6% --policy-arg spec.dlm=$G/dlm --policy-arg spec.weights=$w 2>&1 | grep -v '^	[A-Z].*: 0$'
  echo "--- $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
done
echo "=== end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
