#!/usr/bin/env bash
# bench_quant_vs_llama.sh — decode and prefill tok/s of kvsieve and llama.cpp
# side by side, one weight mix per file (docs/results/quant-types.md, "Speed
# against llama.cpp").
#
# Why this shape: on a shared host either engine's throughput drifts by 2x
# within minutes, so a ratio only means something when both engines ran in
# the same minute on the same file.  Each repetition runs `kvsieve bench`
# then `llama-bench` back to back under one lock hold (no other benchmark
# overlaps), prints the load average beside them, and keeps every raw line,
# so the table can cite the best of the repetitions for each engine and
# the spread.
#
# Usage: tools/bench_quant_vs_llama.sh OUT_DIR MODEL.gguf... 
# Env: KVSIEVE (default build/kvsieve), LLAMA_BIN (default /work/llama.cpp/build/bin),
#      REPS (2), T (threads, 2), NP (prompt tokens, 512), NG (decode tokens, 32),
#      LOCK (default /work/bench.lock; empty: no lock), LB_EXTRA (more llama-bench
#      flags, e.g. "-r 1": its default is 5 repetitions of each test).
set -u
OUT=$1; shift
KS=${KVSIEVE:-build/kvsieve}; LB=${LLAMA_BIN:-/work/llama.cpp/build/bin}
REPS=${REPS:-2}; T=${T:-2}; NP=${NP:-512}; NG=${NG:-32}; LOCK=${LOCK-/work/bench.lock}
mkdir -p "$OUT"
one() { # MODEL REP
  local m=$1 r=$2 b; b=$(basename "$m" .gguf)
  {
    echo "# $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "\$ $KS bench -m $m -t $T --n-prompt $NP --n-gen $NG --depth 0"
    "$KS" bench -m "$m" -t "$T" --n-prompt "$NP" --n-gen "$NG" --depth 0 2>&1
    echo "# $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "\$ $LB/llama-bench -m $m -t $T -p $NP -n $NG ${LB_EXTRA:-}"
    "$LB/llama-bench" -m "$m" -t "$T" -p "$NP" -n "$NG" ${LB_EXTRA:-} 2>&1
    echo "# $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)"
  } > "$OUT/$b.rep$r.txt"
}
for r in $(seq 1 "$REPS"); do
  for m in "$@"; do
    if [ -n "$LOCK" ]; then
      export -f one; export KS LB T NP NG OUT LB_EXTRA
      flock "$LOCK" bash -c "one '$m' $r"
    else
      one "$m" "$r"
    fi
    echo "== $(basename "$m") rep $r"
    grep -E '^(prefill|dense) |^\| .*(pp|tg)[0-9]' "$OUT/$(basename "$m" .gguf).rep$r.txt"
  done
done
