#!/bin/sh
# 128K first answer with every layer sparse in the prefill (--prefill-policy quest:dense=0: 2048 entries a block of
# 16 rows, sinks 32, window 512), M, quiet Xeon, binary b243961, no prompt cache (the time to the first token alone).
set -u
# p128a.txt: tools/long_prompt.py 116800, then "\nQuestion: what does the farmer walk near? Answer:" (128,421 tokens)
K=${KVSIEVE:?the kvsieve binary}; M=${MODELS:?directory of M.gguf}
echo "=== start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/time -v $K run -m $M/M.gguf -f p128a.txt -n 1 -c 131072 -t 2 --prefill-policy quest:dense=0 --temp 0 2>&1 | grep -v '^	[A-Z].*: 0$'
echo "=== end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
