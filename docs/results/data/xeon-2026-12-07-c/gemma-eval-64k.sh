#!/bin/sh
# Issue 47: Gemma-3-4B shape (gen-model q4_k_m mix) at 64K: eval with quest and spec at 6% of the context
# (global layers; local layers read their window), one passkey instance at depth 0.5, dense as reference.
set -u
D=${GEMMA:?directory of gemma-3-4b-q4km.gguf and its dlm/}; E=${KVSIEVE_DIR:?directory of the kvsieve-164eea7 binary}
echo "=== start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/time -v $E/kvsieve-164eea7 eval -m $D/gemma-3-4b-q4km.gguf --task passkey --lengths 65536 --depths 0.5 \
  --samples 1 -t 2 --policy quest,spec --budget 6% --policy-arg spec.dlm=$D/dlm 2>&1
echo "=== end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
