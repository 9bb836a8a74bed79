#!/bin/bash
# alternate binaries, decode at depth 0 on the 3-layer deepseek-v2-lite slice
F=/work/data/moe/dsv2-3l-q4km.gguf
echo "== start $(date -u +%T) $(uptime)"
for i in 1 2 3; do for b in base mla1 claim; do
  printf "%-6s " $b; /work/data/moe/kvsieve-$b bench -m $F -t 2 --no-prefill --n-gen 64 --depth 0 --batch 1 2>&1 | grep "^dense"
done; done
echo "== end $(date -u +%T) $(uptime)"
