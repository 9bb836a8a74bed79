#!/usr/bin/env bash
# insn_kernels.sh — instructions per unit of work of kernels that are not
# weight products (tools/microbench/insn_kernels.c says which and what a
# unit is), counted under qemu-user exactly as scripts/insn_per_byte.sh counts
# the decode products: one instruction per translation block with the
# execution log (-singlestep -d nochain,exec), the count at REPS minus the
# count at 0, over REPS x the units.  Columns: the x86 build under
# qemu-x86_64 -cpu max capped at AVX2 and at scalar; the AArch64 build under
# -cpu max (NEON with dotprod and i8mm), cortex-a53 (plain NEON), and forced
# scalar (KS_SIMD=scalar: the portable C as GCC compiles it for AArch64).
#
# Usage: scripts/insn_kernels.sh X86_BUILD ARM_BUILD [kernels...]
#   (defaults: build build-arm64 gram_kao attn_sinks)
set -euo pipefail
X86=${1:-build}
ARM=${2:-build-arm64}
shift 2 || true
KERNELS=${*:-gram_kao attn_sinks}
REPS=${REPS:-2}

# per_unit QEMU CPU SIMD BIN KERNEL: instructions per unit, and the kernel's name
per_unit() {
    local qemu=$1 cpu=$2 simd=$3 bin=$4 k=$5
    local base full line units kern
    base=$(KS_SIMD=$simd $qemu -cpu "$cpu" -singlestep -d nochain,exec -D /dev/stderr "$bin" "$k" 0 \
           2>&1 >/dev/null | grep -c '^Trace' || true)
    full=$(KS_SIMD=$simd $qemu -cpu "$cpu" -singlestep -d nochain,exec -D /dev/stderr "$bin" "$k" "$REPS" \
           2>&1 >/dev/null | grep -c '^Trace' || true)
    line=$(KS_SIMD=$simd $qemu -cpu "$cpu" "$bin" "$k" 0)
    units=$(sed -E 's/.*: ([0-9]+) units.*/\1/' <<<"$line")
    kern=$(sed -E 's/.*kernel ([a-z0-9_]+),.*/\1/' <<<"$line")
    awk -v f="$full" -v b="$base" -v r="$REPS" -v n="$units" -v k="$kern" 'BEGIN { printf "%.3f (%s)", (f - b) / (r * n), k }'
}

echo "| kernel | x86 AVX2 | x86 scalar | AArch64 max (dotprod+i8mm) | AArch64 cortex-a53 (plain NEON) | AArch64 scalar |"
echo "|---|---|---|---|---|---|"
for k in $KERNELS; do
    echo "| $k | $(per_unit qemu-x86_64 max avx2 "$X86/insn_kernels" "$k") | $(per_unit qemu-x86_64 max scalar "$X86/insn_kernels" "$k") |" \
         "$(per_unit qemu-aarch64 max i8mm "$ARM/insn_kernels" "$k") | $(per_unit qemu-aarch64 cortex-a53 neon "$ARM/insn_kernels" "$k") |" \
         "$(per_unit qemu-aarch64 max scalar "$ARM/insn_kernels" "$k") |"
done
