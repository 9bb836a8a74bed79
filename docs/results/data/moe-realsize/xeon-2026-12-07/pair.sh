#!/bin/bash
# deepseek-v2-lite, gen-model's Q4_K_M mix (10.17 GB, mapped), 2 threads, nothing else running:
# OLD (main e59c378: K-quant experts in the file's rows, the f32 MLA prefill kernel one query at a time)
# against NEW (9e65dad: experts in eight-row groups by --expert-pack auto, 8 queries per K vector),
# then llama.cpp's llama-bench on the same file.
F=${F:-/work/data/moe/dsv2lite-q4km.gguf}
OLD=${OLD:-/work/wt/old/build/kvsieve}
NEW=${NEW:-/work/main/build/kvsieve}
LB=${LB:-/work/llama.cpp/build/bin/llama-bench}
echo "== start $(date -u +%T) $(uptime)"; lscpu | grep 'Model name'
for rep in 1 2; do
  for b in $OLD $NEW; do
    echo "== decode d0 $b $(date -u +%T)"
    $b bench -m $F -t 2 --no-prefill --depth 0 --batch 1 --n-gen 64 2>&1 | grep -v "^test"
  done
done
echo "== llama-bench decode d0 $(date -u +%T)"
$LB -m $F -t 2 -p 0 -n 64 -r 3 2>&1 | grep -v "^$"
for b in $OLD $NEW; do
  echo "== prefill 4096 $b $(date -u +%T)"
  $b bench -m $F -t 2 --n-prompt 4096 --n-gen 1 --depth 0 --batch 1 2>&1 | grep "^prefill"
done
echo "== prefill 4096 KS_ATTN=bf16 $NEW $(date -u +%T)"
KS_ATTN=bf16 $NEW bench -m $F -t 2 --n-prompt 4096 --n-gen 1 --depth 0 --batch 1 2>&1 | grep "^prefill"
echo "== llama-bench prefill 4096 $(date -u +%T)"
$LB -m $F -t 2 -p 4096 -n 0 -r 1 2>&1 | grep -v "^$"
echo "== end $(date -u +%T) $(uptime)"
