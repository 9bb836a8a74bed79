#!/usr/bin/env bash
# insn_callgrind.sh — instructions one decode product (a ROWS x COLS weight
# matrix times one vector, ks_matmul, one thread) executes on this host,
# counted by valgrind's callgrind (docs/results/quant-types.md, "AVX2 decode
# kernels: instruction counts").
#
# Why: on the shared host wall-clock A/B runs of two kernel versions swing
# by 2x; instruction counts do not depend on load, so they rank kernel
# versions that do the same work.  tools/microbench/insn_bench runs the
# product REPS times; the count at REPS minus the count at 0 reps (start-up,
# weight set-up, allocation cancel) over REPS is one product, activation
# quantization and the driver included.  (scripts/insn_per_byte.sh counts
# the same program under QEMU, for the NEON kernels.)
#
# Usage: tools/insn_callgrind.sh INSN_BENCH [types...]   (default: q4_k q5_k q6_k iq4_xs q8_0 q4_0)
# Env: ROWS (512), COLS (2048), REPS (10).  Prints per type: instructions per
# product, per 256-weight super-block (per 8 blocks of 32), per weight byte.
set -euo pipefail
BIN=$1; shift
TYPES=${*:-q4_k q5_k q6_k iq4_xs q8_0 q4_0}
ROWS=${ROWS:-512}; COLS=${COLS:-2048}; REPS=${REPS:-10}
ir() { valgrind --tool=callgrind --callgrind-out-file=/dev/null "$BIN" "$1" "$ROWS" "$COLS" "$2" 2>&1 |
       sed -n 's/.*Collected : \([0-9]*\).*/\1/p'; }
for t in $TYPES; do
  full=$(ir "$t" "$REPS"); base=$(ir "$t" 0)
  line=$("$BIN" "$t" "$ROWS" "$COLS" 0)
  bytes=$(sed -E 's/.*: ([0-9]+) bytes.*/\1/' <<<"$line")
  kern=$(sed -E 's/.*kernel ([a-z0-9_?]+),.*/\1/' <<<"$line")
  awk -v f="$full" -v b="$base" -v r="$REPS" -v n="$bytes" -v k="$kern" -v t="$t" -v sb=$((ROWS * COLS / 256)) \
      'BEGIN { p = (f - b) / r; printf "%-7s %-24s %10.0f per product  %6.1f per super-block  %5.3f per byte\n", t, k, p, p / sb, p / n }'
done
