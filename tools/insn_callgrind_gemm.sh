#!/usr/bin/env bash
# insn_callgrind_gemm.sh — instructions of one prefill product (ROWS x COLS weights times N vectors, 1 thread, ks_matmul on the file's rows),
# counted by callgrind: gemm_bench at REPS minus at 1 rep, over REPS-1.  Usage: tools/insn_callgrind_gemm.sh build/gemm_bench TYPE...  (env ROWS 512, COLS 2048, N 64, REPS 3)
# Why: on the shared host wall-clock A/B runs of two tile versions swing by 2x; instruction counts do not
# depend on load (docs/results/quant-types.md, "AVX2 eight-row tiles for IQ4_XS and Q5_K").
set -euo pipefail
BIN=$1; shift
ROWS=${ROWS:-512}; COLS=${COLS:-2048}; N=${N:-64}; REPS=${REPS:-3}
ir() { GEMM_ONLY=rows valgrind --tool=callgrind --callgrind-out-file=/dev/null "$BIN" 1 "$ROWS" "$COLS" "$N" "$1" "$2" 2>&1 |
       sed -n 's/.*Collected : \([0-9]*\).*/\1/p'; }
for t in "$@"; do
  full=$(ir "$t" "$REPS"); base=$(ir "$t" 1)
  awk -v f="$full" -v b="$base" -v r="$REPS" -v t="$t" -v m=$((ROWS * COLS * N)) \
      'BEGIN { p = (f - b) / (r - 1); printf "%-7s %12.0f per product  %7.2f per 256 MACs\n", t, p, p * 256 / m }'
done
