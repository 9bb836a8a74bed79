#!/bin/sh
# Quiet Xeon: decode at 128K (issue 49: spec / quest >= 10 tok/s), M, batch 1, budget 2048, each policy's own
# dense layers, synthetic KV, binary b243961 (quest's 8-bit page bounds, spec's Q6_K head: the defaults).
set -u
K=${KVSIEVE:?the kvsieve binary}; M=${MODELS:?directory of M.gguf and M-dlm}
echo "=== start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/time -v $K bench -m $M/M.gguf --depth 2048,131072 --batch 1 -t 2 --n-gen 8 --no-prefill \
  --policy dense,quest,spec --budget 2048 --policy-arg spec.dlm=$M/M-dlm 2>&1 | grep -v '^	[A-Z].*: 0$'
echo "=== end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
