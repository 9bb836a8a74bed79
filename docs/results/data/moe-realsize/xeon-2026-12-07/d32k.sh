#!/bin/bash
# deepseek-v2-lite q4_k_m mix: decode at depth 32768 (synthetic KV), dense / quest / spec at B = 2048, 2 threads
F=${F:-/work/data/moe/dsv2lite-q4km.gguf}
K=${K:-/work/main/build/kvsieve}
D=${D:-/work/data/moe/dsv2lite-dlm}
echo "== start $(date -u +%T) $(uptime)"; lscpu | grep 'Model name'; (cd /work/main && git log --oneline -1)
for rep in 1 2; do
  $K bench -m $F -t 2 --depth 32768 --no-prefill --n-gen 16 --batch 1 --policy dense,quest,spec --budget 2048 --policy-arg spec.dlm=$D 2>&1 | grep -v "^int8"
done
echo "== end $(date -u +%T) $(uptime)"
