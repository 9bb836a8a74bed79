#!/bin/sh
# Gemma-3-4B shape (Q4_K_M mix, 5 global + 29 local layers) at 64K: dense, quest and spec at 6% of the
# context on the global layers (local layers read their 1024-token window), synthetic KV.
set -u
KS=/work/data/final4/kvsieve-q4kz; D=/work/data/gemma
echo "=== start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/time -v $KS bench -m $D/gemma-3-4b-q4km.gguf --depth 65536 --batch 1 -t 2 --n-gen 8 --no-prefill \
  --policy dense,quest,spec --budget 6% --policy-arg spec.dlm=$D/dlm 2>&1
echo "=== end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
