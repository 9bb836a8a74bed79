#!/bin/sh
# Qwen3-4B-shaped model with YaRN (x4 over 32K), run -c 131072 on a 120,142-token prompt, q8 KV,
# sparse prefill, checkpointed every 8192 tokens. Resume: run again.
set -u
KS=/work/data/final4/kvsieve-q4kz; D=/work/data/q4b
echo "=== start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/time -v $KS run -m $D/qwen3-4b-yarn-q4km.gguf -f $D/p120k.txt -n 8 -c 131072 -t 2 --kv-type q8 \
  --prefill-policy quest:dense=0 --temp 0 --prompt-cache $D/q4b-120k.kv --prompt-cache-every 8192 2>&1
echo "=== end rc=$? $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
