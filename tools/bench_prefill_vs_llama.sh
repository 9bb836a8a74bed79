#!/usr/bin/env bash
# bench_prefill_vs_llama.sh — prefill tok/s of kvsieve and llama.cpp side by
# side in one run, on the same GGUF, same threads (docs/BENCHMARKS.md).
#
# Why alternating and best-of: on a shared host the throughput of either
# engine drifts by 2-3x within minutes, so each repetition runs kvsieve, then
# llama.cpp with flash attention off and on, back to back, and the best of
# the repetitions is kept for each (the least disturbed run; the better of
# llama.cpp's two attention modes is the one counted).
#
# Usage: tools/bench_prefill_vs_llama.sh MODEL.gguf "512 4096" [reps=2] [threads=2]
# Env: KVSIEVE (default build/kvsieve), LLAMA_BIN (default /work/llama.cpp/build/bin),
#      KS_EXTRA (extra kvsieve bench flags, e.g. --no-repack).
set -u
MODEL=$1; LENS=$2; REPS=${3:-2}; T=${4:-2}
KS=${KVSIEVE:-build/kvsieve}; LB=${LLAMA_BIN:-/work/llama.cpp/build/bin}
for L in $LENS; do
  best_ks=0; best_l0=0; best_l1=0; share=""
  for r in $(seq 1 "$REPS"); do
    out=$("$KS" bench -m "$MODEL" -t "$T" --n-prompt "$L" --n-gen 1 --depth 0 ${KS_EXTRA:-} 2>/dev/null | grep '^prefill')
    v=$(echo "$out" | awk '{print $5}')
    if awk -v a="$v" -v b="$best_ks" 'BEGIN{exit !(a>b)}'; then best_ks=$v; share=$(echo "$out" | sed 's/.*gemm/gemm/'); fi
    for fa in 0 1; do
      flag=""; [ "$fa" = 1 ] && flag="-fa"
      v=$("$LB/llama-batched-bench" -m "$MODEL" -c $((L + 16)) -b 2048 -ub 512 -npp "$L" -ntg 1 -npl 1 -t "$T" $flag 2>/dev/null |
          awk -F'|' -v L="$L" '$2+0==L {gsub(/ /,"",$7); print $7}')
      v=${v:-0}
      if [ "$fa" = 0 ]; then awk -v a="$v" -v b="$best_l0" 'BEGIN{exit !(a>b)}' && best_l0=$v
      else awk -v a="$v" -v b="$best_l1" 'BEGIN{exit !(a>b)}' && best_l1=$v; fi
    done
  done
  best_l=$(awk -v a="$best_l0" -v b="$best_l1" 'BEGIN{print (a>b)?a:b}')
  ratio=$(awk -v a="$best_ks" -v b="$best_l" 'BEGIN{printf "%.2f", (b>0)?a/b:0}')
  echo "$(basename "$MODEL") pp$L: kvsieve $best_ks tok/s ($share) | llama.cpp fa0 $best_l0 fa1 $best_l1 tok/s | ratio ${ratio}x"
done
