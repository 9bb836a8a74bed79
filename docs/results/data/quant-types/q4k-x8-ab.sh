#!/usr/bin/env bash
# q4k-x8-ab.sh — the Q4_K eight-row groups (KS_WEIGHT_Q4_K_X8) against main,
# old and new binaries alternated around llama-bench in one lock hold
# (docs/results/quant-types.md, "Q4_K in eight-row groups").
# Usage: q4k-x8-ab.sh OLD_KVSIEVE NEW_KVSIEVE [files...]  (run under flock /work/bench.lock)
set -u
OLD=$1 NEW=$2; shift 2
FILES=${*:-/work/data/quant/ks-q4_k_m.gguf /work/data/long/M.gguf /work/data/quant/ks-q5_k_m.gguf /work/data/quant/ks-iq4_xs.gguf}
LB=/work/llama.cpp/build/bin/llama-bench
lscpu | grep 'Model name'
echo "old: $OLD  new: $NEW  $(date -u)"
for f in $FILES; do
  echo "=== $f"; uptime
  for b in "$OLD" "$NEW" "$NEW" "$OLD"; do
    echo "--- decode $b"; "$b" bench -m "$f" -t 2 --no-prefill --depth 0 --n-gen 64 2>&1 | tail -3
    echo "--- prefill $b"; "$b" bench -m "$f" -t 2 --n-prompt 512 --n-gen 1 --depth 0 2>&1 | tail -4
    if [ "$b" = "$NEW" ] && [ -z "${LB_DONE:-}" ]; then
      uptime; echo "--- llama-bench"; "$LB" -m "$f" -t 2 -p 512 -n 64 -r 2 2>&1 | grep -E "^\|"; LB_DONE=1
    fi
  done
  unset LB_DONE
  uptime
done
