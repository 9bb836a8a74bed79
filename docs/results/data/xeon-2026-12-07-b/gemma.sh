#!/bin/sh
# Quiet Xeon: Gemma-3-4B shape (gen-model q4_k_m mix, 5 global + 29 local layers) at 64K, synthetic KV:
# dense, quest and spec at 6% of the context on the global layers (local layers read their 1024-token window),
# binary f5eb37f (quest bounds=q8 by default; spec's projections Q6_K in eight-row groups on this host).
set -u
K=${KVSIEVE:?the kvsieve binary}; G=${GEMMA:?directory of gemma-3-4b-q4km.gguf and dlm}
echo "=== start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/time -v $K bench -m $G/gemma-3-4b-q4km.gguf --depth 65536 --batch 1 -t 2 --n-gen 8 --no-prefill \
  --policy dense,quest,spec --budget 6% --policy-arg spec.dlm=$G/dlm 2>&1 | grep -v '^	[A-Z].*: 0$'
echo "=== end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
