#!/usr/bin/env bash
# insn_per_byte.sh — instructions per byte of weights of each decode kernel
# (one weight matrix times one vector), NEON against AVX2, counted under
# qemu-user (docs/BENCHMARKS.md, "Vectorisation of the ARM kernels").
#
# How: tools/microbench/insn_bench runs the product reps times; QEMU with one
# instruction per translation block and its execution log (-singlestep -d
# nochain,exec) writes one "Trace" line per instruction executed; the count at
# reps minus the count at 0 reps (start-up, weight set-up and the rest cancel)
# over reps x the matrix's bytes is the kernel's instructions per byte,
# activation quantization included.  Debian's QEMU has no TCG plugins, so no
# libinsn.so; the log is the portable equivalent.  The x86 column runs the
# host build under qemu-x86_64 -cpu max capped at AVX2 (KS_SIMD=avx2), so both
# sides are counted the same way.
#
# Usage: scripts/insn_per_byte.sh X86_BUILD ARM_BUILD [types...]
#   (defaults: build build-arm64; the weight types of kernels with SIMD forms)
# N=4 multiplies by N vectors at once (a batch; the counts are then per
# weight byte and vector); I8MM=1 adds the i8mm column (-cpu max: the
# two-row smmla tiles, which the driver takes for every product of more
# than one vector); X86_BUILD "-" leaves the AVX2 column out.
set -euo pipefail
X86=${1:-build}
ARM=${2:-build-arm64}
shift 2 || true
TYPES=${*:-f16 bf16 q8_0 q4_0 q4_k q6_k q4_1 q5_0 q5_1 iq4_nl q2_k q3_k q5_k iq4_xs}
ROWS=${ROWS:-64}
COLS=${COLS:-4096}
REPS=${REPS:-2}
N=${N:-1}

# per_byte QEMU CPU SIMD BIN TYPE: instructions per byte, and the kernel's name
per_byte() {
    local qemu=$1 cpu=$2 simd=$3 bin=$4 t=$5
    local base full line bytes kern
    base=$(KS_SIMD=$simd $qemu -cpu "$cpu" -singlestep -d nochain,exec -D /dev/stderr "$bin" "$t" "$ROWS" "$COLS" 0 "$N" \
           2>&1 >/dev/null | grep -c '^Trace' || true)
    full=$(KS_SIMD=$simd $qemu -cpu "$cpu" -singlestep -d nochain,exec -D /dev/stderr "$bin" "$t" "$ROWS" "$COLS" "$REPS" "$N" \
           2>&1 >/dev/null | grep -c '^Trace' || true)
    line=$(KS_SIMD=$simd $qemu -cpu "$cpu" "$bin" "$t" "$ROWS" "$COLS" 0 "$N")
    bytes=$(sed -E 's/.*: ([0-9]+) bytes.*/\1/' <<<"$line")
    kern=$(sed -E 's/.*kernel ([a-z0-9_?]+),.*/\1/' <<<"$line")
    awk -v f="$full" -v b="$base" -v r="$REPS" -v n="$bytes" -v k="$kern" -v nv="$N" 'BEGIN { printf "%.2f %s", (f - b) / (r * n * nv), k }'
}

# PLAIN=1 adds the plain-NEON column (a Cortex-A53: no dotprod)
echo "| type | AVX2 insn/B (kernel) | dotprod insn/B (kernel) |${I8MM:+ i8mm insn/B (kernel) |}${PLAIN:+ plain NEON insn/B (kernel) |}"
echo "|---|---|---|${I8MM:+---|}${PLAIN:+---|}"
for t in $TYPES; do
    x="- -"
    [ "$X86" != - ] && x=$(per_byte qemu-x86_64 max avx2 "$X86/insn_bench" "$t")
    d=$(per_byte qemu-aarch64 max dotprod "$ARM/insn_bench" "$t")
    row="| $t | ${x% *} (${x#* }) | ${d% *} (${d#* }) |"
    if [ -n "${I8MM:-}" ]; then
        i=$(per_byte qemu-aarch64 max i8mm "$ARM/insn_bench" "$t")
        row="$row ${i% *} (${i#* }) |"
    fi
    if [ -n "${PLAIN:-}" ]; then
        n=$(per_byte qemu-aarch64 cortex-a53 neon "$ARM/insn_bench" "$t")
        row="$row ${n% *} (${n#* }) |"
    fi
    echo "$row"
done
