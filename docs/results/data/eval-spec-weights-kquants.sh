#!/bin/sh
# spec's projections requantised (q6_k, q5_k, q4_k) against Q8_0 on the bundled pair: 48 instances a task
# (4 seeds x 4 samples x 3 depths), 4K, 6%; a file already there is kept (rerun to resume).  Table: eval-spec-weights-kquants-table.py.
set -u
K=${KVSIEVE:-build/kvsieve}; M=models/kvsieve-default.gguf; O=docs/results/data
for s in 1 7 11 13; do for w in q8_0 q6_k q5_k q4_k; do
  f=$O/eval-spec-weights-$w-seed$s-4k.json
  [ -s $f ] && continue
  $K eval -m $M --task all --lengths 4096 --depths 0.25,0.5,0.75 --samples 4 --seed $s -t 1 \
    --policy spec --budget 6% --policy-arg spec.weights=$w --policy-arg spec.dlm=models/kvsieve-default-dlm --json > $f.tmp && mv $f.tmp $f
  echo "seed $s $w done $(date -u +%H:%M:%S)"
done; done
