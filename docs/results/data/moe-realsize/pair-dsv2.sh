#!/bin/bash
# One lock hold (run as: flock /work/bench.lock pair-dsv2.sh): the deepseek-v2-lite
# q4_k_m-mix file, two kvsieve binaries (before / after; BEFORE and AFTER name them),
# then llama.cpp's llama-bench, decode at depth 0 and prefill 512, 2 threads each.
F=${F:-/work/data/moe/dsv2lite-q4km.gguf}
BEFORE=${BEFORE:-/work/data/moe/kvsieve-base}
AFTER=${AFTER:-/work/data/moe/kvsieve-mla1}
LB=/work/llama.cpp/build/bin/llama-bench
echo "== start $(date -u +%T) $(uptime)"
lscpu | grep 'Model name'
for b in $BEFORE $AFTER; do
  echo "== $b decode $(date -u +%T)"
  $b bench -m $F -t 2 --no-prefill --depth 0 --batch 1 --n-gen 32 2>&1 | grep -v "^int8"
done
echo "== llama-bench decode $(date -u +%T) $(uptime)"
$LB -m $F -t 2 -p 0 -n 32 -r 2 2>&1 | grep -v "^$"
echo "== $AFTER prefill 512 $(date -u +%T)"
$AFTER bench -m $F -t 2 --n-prompt 512 --n-gen 8 --depth 0 --batch 1 2>&1
echo "== llama-bench prefill 512 $(date -u +%T)"
$LB -m $F -t 2 -p 512 -n 0 -r 1 2>&1 | grep -v "^$"
echo "== end $(date -u +%T) $(uptime)"
