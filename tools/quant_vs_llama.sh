#!/usr/bin/env bash
# quant_vs_llama.sh — kvsieve against llama.cpp on the same files, one per
# weight type, made by llama.cpp's own llama-quantize (docs/results/quant-types.md).
#
# Why this shape: the golden fixtures pin kvsieve's dequantizers to gguf-py
# and test_matmul its kernels to its own reference, but only llama.cpp's
# quantizer writes the mixes users have (Q4_K_M's Q6_K output, Q5_0/Q5_1
# fallbacks for rows that are no multiple of 256, ...).  So the bundled
# model (Q8_0; n_ff 704 is such a row) is turned into F16 and then into each
# type by llama-quantize, and both engines score it: perplexity on the same
# text (second halves of each window, as llama-perplexity does) and the
# greedy continuation of a prompt.
#
# Usage: tools/quant_vs_llama.sh OUT_DIR [SRC.gguf] [threads=2]
# Env: KVSIEVE (default build/kvsieve), LLAMA_BIN (default /work/llama.cpp/build/bin),
#      TYPES (llama-quantize type names), TEXT (default /usr/share/common-licenses/GPL-3),
#      CTX (512), WINDOWS (8), PROMPT, NGEN (24).
set -u
OUT=$1; SRC=${2:-models/kvsieve-default.gguf}; T=${3:-2}
KS=${KVSIEVE:-build/kvsieve}; LB=${LLAMA_BIN:-/work/llama.cpp/build/bin}
TEXT=${TEXT:-/usr/share/common-licenses/GPL-3}; CTX=${CTX:-512}; WIN=${WINDOWS:-8}
PROMPT=${PROMPT:-"Once upon a time"}; NGEN=${NGEN:-24}
TYPES=${TYPES:-"F16 Q8_0 Q6_K Q5_K_M Q5_K_S Q5_1 Q5_0 Q4_K_M Q4_K_S Q4_1 Q4_0 IQ4_XS IQ4_NL Q3_K_L Q3_K_M Q3_K_S Q2_K"}
mkdir -p "$OUT"
"$LB/llama-quantize" --allow-requantize "$SRC" "$OUT/F16.gguf" F16 > "$OUT/quantize-F16.log" 2>&1 || { echo "F16 conversion failed"; exit 1; }
printf '| llama-quantize type | tensor types (kvsieve info) | kvsieve ppl | llama.cpp ppl | greedy %s tokens |\n|---|---|---|---|---|\n' "$NGEN"
for ty in $TYPES; do
  f="$OUT/$ty.gguf"
  if [ "$ty" != F16 ]; then
    "$LB/llama-quantize" "$OUT/F16.gguf" "$f" "$ty" > "$OUT/quantize-$ty.log" 2>&1 || { echo "| $ty | llama-quantize failed | | | |"; continue; }
  fi
  types=$("$KS" info -m "$f" 2>&1 | sed -n 's/^types: *//p')
  kp=$("$KS" perplexity -m "$f" -f "$TEXT" -c "$CTX" -t "$T" --windows "$WIN" --score-second-half 2>&1 | tee "$OUT/ks-ppl-$ty.log" | sed -n 's/^perplexity: \([0-9.]*\).*/\1/p')
  lp=$("$LB/llama-perplexity" -m "$f" -f "$TEXT" -c "$CTX" -b "$CTX" --chunks "$WIN" -t "$T" 2>&1 | tee "$OUT/llama-ppl-$ty.log" | sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p')
  "$KS" run -m "$f" -p "$PROMPT" -n "$NGEN" --temp 0 -t "$T" 2>/dev/null > "$OUT/ks-gen-$ty.txt"
  "$LB/llama-completion" -m "$f" -p "$PROMPT" -n "$NGEN" --temp 0 -t "$T" -no-cnv --no-display-prompt 2>/dev/null < /dev/null > "$OUT/llama-gen-$ty.txt"
  if cmp -s <(tr -d '\n' < "$OUT/ks-gen-$ty.txt" | sed 's/ *$//') <(tr -d '\n' < "$OUT/llama-gen-$ty.txt" | sed 's/ *$//'); then g="identical"
  else g="differ: kvsieve \`$(tr '\n' ' ' < "$OUT/ks-gen-$ty.txt" | cut -c1-60)\` llama.cpp \`$(tr '\n' ' ' < "$OUT/llama-gen-$ty.txt" | cut -c1-60)\`"; fi
  echo "| $ty | ${types:-?} | ${kp:-fail} | ${lp:-fail} | $g |"
done
