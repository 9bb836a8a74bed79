#!/bin/bash
# deepseek-v2-lite q4_k_m: decode at depth 0 and 32768 (synthetic KV), dense and quest (B = 2048),
# 2 threads, OLD (46eaddd: the AVX2 decode kernel, four heads a pass, one thread per KV head) and
# NEW (the wide AVX-512 kernel and the split of the 16 heads between the threads), alternated.
F=${F:-/work/data/moe/dsv2lite-q4km.gguf}
OLD=${OLD:-/work/wt/old/build/kvsieve}
NEW=${NEW:-/work/main/build/kvsieve}
echo "== start $(date -u +%T) $(uptime)"; lscpu | grep 'Model name'
for rep in 1 2; do
  for b in OLD NEW; do
    K=${!b}
    echo "== $b rep $rep $(date -u +%T)"
    $K bench -m $F -t 2 --depth 32768 --no-prefill --n-gen 16 --batch 1 --policy dense,quest --budget 2048 2>&1 | grep -E "^(dense|quest) "
    $K bench -m $F -t 2 --depth 0 --no-prefill --n-gen 32 --batch 1 --policy dense 2>&1 | grep -E "^dense "
  done
done
echo "== end $(date -u +%T) $(uptime)"
