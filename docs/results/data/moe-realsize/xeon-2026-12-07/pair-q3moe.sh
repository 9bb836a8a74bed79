#!/bin/bash
# qwen3-30b-a3b, gen-model's Q4_K_M mix (18.2 GB, 32000-token vocabulary), mapped: kvsieve (experts left in the
# mapping: --expert-pack auto finds their 17.5 GB copy over half the available memory) against llama.cpp's
# llama-bench, 2 threads each, nothing else running; the file read once into the page cache first.
F=${F:-/work/data/moe/q3moe-q4km.gguf}
K=${K:-/work/main/build/kvsieve}
LB=${LB:-/work/llama.cpp/build/bin/llama-bench}
echo "== start $(date -u +%T) $(uptime)"; lscpu | grep 'Model name'; (cd /work/main && git log --oneline -1)
cat $F > /dev/null; grep -E "MemAvailable|^Cached" /proc/meminfo
$K info $F 2>&1 | grep -E "^experts|expert pack|decode bytes"
for rep in 1 2; do
  echo "== kvsieve decode d0 $(date -u +%T)"
  $K bench -m $F -t 2 --no-prefill --depth 0 --batch 1 --n-gen 64 2>&1 | grep -v "^test"
  echo "== llama-bench decode d0 $(date -u +%T)"
  $LB -m $F -t 2 -p 0 -n 64 -r 2 2>&1 | grep -v "^$"
done
echo "== kvsieve prefill 512 $(date -u +%T)"
$K bench -m $F -t 2 --n-prompt 512 --n-gen 1 --depth 0 --batch 1 2>&1 | grep "^prefill"
echo "== llama-bench prefill 512 $(date -u +%T)"
$LB -m $F -t 2 -p 512 -n 0 -r 1 2>&1 | grep -v "^$"
echo "== end $(date -u +%T) $(uptime)"
