#!/usr/bin/env bash
# compare_llama_arch.sh — kvsieve against llama.cpp on the same generated GGUF,
# one tiny model per architecture / RoPE scaling (docs/results/architectures.md).
#
#   tools/compare_llama_arch.sh [LLAMA_BIN_DIR] [OUT_DIR]
#
# For each model: the greedy 64-token continuation of one prompt from
# llama-completion and from `kvsieve run` (both --temp 0, the same context
# size -c), compared as text, and the perplexity of a fixed text from
# llama-perplexity and from `kvsieve perplexity --score-second-half` (both
# score the second half of each window of -c tokens).  Prints one Markdown
# table row per check; raw outputs stay in OUT_DIR.
#
#   tools/compare_llama_arch.sh --grid [LLAMA_BIN_DIR] [OUT_DIR]
#
# The architecture x weight-type grid (issue 47 item 5): every shape in
# SHAPES times every type in TYPES, each file written by `gen-model --type`
# (one type for every 2-D tensor, so each cell checks that type's kernels on
# every matrix of that architecture), the same greedy and perplexity checks
# at -c GRID_CTX, and besides the final perplexities the largest difference of
# the running perplexity after each window (llama-perplexity's [i] values,
# kvsieve's "[i] running ppl"): a per-window check of the scored
# log-probabilities.  Prints one row per cell, then the shapes x types grid.
set -u
GRID=0
if [ "${1:-}" = "--grid" ]; then GRID=1; shift; fi
LLAMA=${1:-/work/llama.cpp/build/bin}
OUT=${2:-/tmp/kvsieve-arch-check}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
KS=${KS:-$ROOT/build/kvsieve}
VOCAB=$ROOT/tests/fixtures/tokenizer/ggml-vocab-llama-spm.gguf
# phi3: llama.cpp's vocabulary loader, for a general.name containing "phi3",
# sets attributes of <|endoftext|> and fails (unordered_map::at) on a
# vocabulary without it, so phi3 files take the phi-3 vocabulary
PHI3_VOCAB=$ROOT/tests/fixtures/tokenizer/ggml-vocab-phi-3.gguf
TEXT=${TEXT:-/work/llama.cpp/README.md}
PROMPT="The quick brown fox jumps over the lazy dog. Once upon a time"
PPL_CTX=128
PPL_WINDOWS=8
mkdir -p "$OUT"

# name shape type ctx (CASES in the environment replaces the list, e.g. the
# gpt-oss rows of docs/results/moe.md:
#   CASES="tiny-gptoss-f32:tiny-gptoss:f32:4096 tiny-gptoss-mxfp4:tiny-gptoss:mxfp4:4096")
CASES=${CASES:-"tiny-phi3-f16:tiny-phi3:f16:4096
tiny-phi3-long-f16:tiny-phi3:f16:8192
tiny-qwen3-yarn-f16:tiny-qwen3-yarn:f16:4096
tiny-smollm3-f16:tiny-smollm3:f16:4096
tiny-mistral3-f16:tiny-mistral3:f16:4096
tiny-phi3-q8_0:tiny-phi3:q8_0:4096
tiny-qwen3-yarn-q8_0:tiny-qwen3-yarn:q8_0:4096
tiny-smollm3-q8_0:tiny-smollm3:q8_0:4096
tiny-mistral3-q8_0:tiny-mistral3:q8_0:4096"}

# greedy_cmp NAME: "identical", or "differ at token K" (K counted in kvsieve's
# tokens of the common text prefix; llama-completion's text ends with a newline)
greedy_cmp() {
  local a b
  a=$(sed -z 's/[[:space:]]*$//' "$OUT/$1.llama.txt"); b=$(sed -z 's/[[:space:]]*$//' "$OUT/$1.ks.txt")
  if [ -s "$OUT/$1.ks.txt" ] && [ "$a" = "$b" ]; then echo "identical"; return; fi
  [ -s "$OUT/$1.ks.txt" ] && [ -s "$OUT/$1.llama.txt" ] || { echo "FAIL (no output)"; return; }
  python3 - "$OUT/$1.llama.txt" "$OUT/$1.ks.txt" <<'PY'
import sys
a, b = (open(f, encoding="utf-8", errors="replace").read() for f in sys.argv[1:3])
n = 0
while n < min(len(a), len(b)) and a[n] == b[n]:
    n += 1
print("differ after %d chars" % n)
PY
}

# running perplexity after each window: llama-perplexity's "[i]v," list, kvsieve's "[i] running ppl v"
window_diff() {
  python3 - "$OUT/$1.llama.ppl" "$OUT/$1.ks.ppl" <<'PY'
import re, sys
l = [float(v) for v in re.findall(r"\[(?:\d+)\]([0-9.]+),", open(sys.argv[1], errors="replace").read())]
k = [float(v) for v in re.findall(r"\[\d+\] running ppl ([0-9.]+)", open(sys.argv[2], errors="replace").read())]
n = min(len(l), len(k))
print("%.3f%%" % (100 * max(abs(k[i] / l[i] - 1) for i in range(n))) if n else "?")
PY
}

if [ "$GRID" = 1 ]; then
  SHAPES=${SHAPES:-"tiny-llama tiny-qwen2 tiny-qwen3 tiny-qwen3-yarn tiny-phi3 tiny-smollm3 tiny-mistral3 tiny-gemma3"}
  TYPES=${TYPES:-"f16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k q3_k q2_k iq4_nl iq4_xs"}
  GRID_CTX=${GRID_CTX:-512}
  # -t of both engines (results do not depend on it; 1 is far faster on a
  # crowded host, where a second thread waits at every barrier)
  T=${GRID_THREADS:-2}
  ROWS=${ROWS:-$OUT/grid-rows.txt}; : >"$ROWS"
  echo "| shape | type | greedy 64 tokens | kvsieve PPL | llama.cpp PPL | difference | max per-window difference |"
  echo "|---|---|---|---|---|---|---|"
  for shape in $SHAPES; do
    v=$VOCAB; case $shape in *phi3*) v=$PHI3_VOCAB;; esac
    for type in $TYPES; do
      name=$shape-$type; f=$OUT/$name.gguf
      [ -f "$f" ] || { "$KS" gen-model --shape "$shape" --type "$type" --vocab-from "$v" --out "$f.part" >/dev/null 2>"$OUT/$name.gen.err" \
        && mv "$f.part" "$f"; } || { echo "| $shape | $type | gen-model failed | | | | |"; echo "$shape $type FAIL - -" >>"$ROWS"; continue; }
      # kvsieve's outputs are kept from an earlier run (KS_ONLY=1 makes only them,
      # e.g. while llama.cpp still builds); the files are byte-reproducible
      grep -q '^perplexity: ' "$OUT/$name.ks.ppl" 2>/dev/null || {
        "$KS" run -m "$f" -p "$PROMPT" -n 64 --temp 0 -c "$GRID_CTX" -t "$T" >"$OUT/$name.ks.txt" 2>"$OUT/$name.ks.err"
        "$KS" perplexity -m "$f" -f "$TEXT" -c "$PPL_CTX" --windows "$PPL_WINDOWS" --score-second-half -t "$T" \
          >"$OUT/$name.ks.ppl" 2>&1; }
      [ "${KS_ONLY:-0}" = 1 ] && { echo "| $shape | $type | (kvsieve only) | $(sed -n 's/^perplexity: \([0-9.]*\).*/\1/p' "$OUT/$name.ks.ppl") | | | |"; continue; }
      # llama.cpp's outputs are kept too once complete (a rerun fills the gaps)
      [ -s "$OUT/$name.llama.txt" ] ||
        "$LLAMA/llama-completion" -m "$f" -p "$PROMPT" -n 64 --temp 0 -c "$GRID_CTX" -t "$T" -no-cnv --no-display-prompt \
          >"$OUT/$name.llama.txt" 2>"$OUT/$name.llama.err" </dev/null
      same=$(greedy_cmp "$name")
      # LLAMA_CHECK: tools/llama_check.c built against libllama, for a llama.cpp
      # build whose tools are not done (the same scoring as llama-perplexity)
      if grep -q 'Final estimate' "$OUT/$name.llama.ppl" 2>/dev/null; then :
      elif [ -n "${LLAMA_CHECK:-}" ] && [ ! -x "$LLAMA/llama-perplexity" ]; then
        "$LLAMA_CHECK" "$f" "$PROMPT" 1 "$GRID_CTX" "$TEXT" "$PPL_CTX" "$PPL_WINDOWS" >"$OUT/$name.llama.ppl" 2>/dev/null </dev/null
      else
        "$LLAMA/llama-perplexity" -m "$f" -f "$TEXT" -c "$PPL_CTX" -b "$PPL_CTX" --chunks "$PPL_WINDOWS" -t "$T" \
          >"$OUT/$name.llama.ppl" 2>&1 </dev/null
      fi
      lp=$(grep -o 'Final estimate: PPL = [0-9.]*' "$OUT/$name.llama.ppl" | grep -o '[0-9.]*$')
      kp=$(sed -n 's/^perplexity: \([0-9.]*\).*/\1/p' "$OUT/$name.ks.ppl")
      d=$(python3 -c "print('%+.3f%%' % (100*($kp/$lp-1)))" 2>/dev/null || echo "?")
      wd=$(window_diff "$name")
      echo "| $shape | $type | $same | ${kp:-fail} | ${lp:-fail} | $d | $wd |"
      echo "$shape $type ${same// /_} $d" >>"$ROWS"
    done
  done
  # the grid: one row per shape, one column per type; = identical greedy, ~ differs, then the PPL difference
  echo
  printf '| shape |'; for type in $TYPES; do printf ' %s |' "$type"; done; echo
  printf '|---|'; for type in $TYPES; do printf -- '---|'; done; echo
  for shape in $SHAPES; do
    printf '| %s |' "$shape"
    for type in $TYPES; do
      read -r _ _ g d < <(grep "^$shape $type " "$ROWS" || echo "x x FAIL ?")
      case $g in identical) m="="; ;; FAIL*) m="FAIL"; ;; *) m="~"; ;; esac
      printf ' %s %s |' "$m" "$d"
    done
    echo
  done
  exit 0
fi

echo "| model | -c | greedy 64 tokens | kvsieve PPL | llama.cpp PPL | difference |"
echo "|---|---|---|---|---|---|"
for c in $CASES; do
  IFS=: read -r name shape type ctx <<<"$c"
  f=$OUT/$shape-$type.gguf
  v=$VOCAB; case $shape in *phi3*) v=$PHI3_VOCAB;; esac
  [ -f "$f" ] || "$KS" gen-model --shape "$shape" --type "$type" --vocab-from "$v" --out "$f" >/dev/null
  "$LLAMA/llama-completion" -m "$f" -p "$PROMPT" -n 64 --temp 0 -c "$ctx" -t 2 -no-cnv --no-display-prompt \
    >"$OUT/$name.llama.txt" 2>"$OUT/$name.llama.err" </dev/null
  "$KS" run -m "$f" -p "$PROMPT" -n 64 --temp 0 -c "$ctx" -t 2 >"$OUT/$name.ks.txt" 2>"$OUT/$name.ks.err"
  # the texts up to trailing whitespace (llama-completion ends with a newline of its own)
  if [ "$(sed -z 's/[[:space:]]*$//' "$OUT/$name.llama.txt")" = "$(sed -z 's/[[:space:]]*$//' "$OUT/$name.ks.txt")" ] \
     && [ -s "$OUT/$name.ks.txt" ]; then same="identical"; else same="DIFFER"; fi
  "$LLAMA/llama-perplexity" -m "$f" -f "$TEXT" -c "$PPL_CTX" --chunks "$PPL_WINDOWS" -t 2 \
    >"$OUT/$name.llama.ppl" 2>&1 </dev/null
  "$KS" perplexity -m "$f" -f "$TEXT" -c "$PPL_CTX" --windows "$PPL_WINDOWS" --score-second-half -t 2 \
    >"$OUT/$name.ks.ppl" 2>&1
  lp=$(grep -o 'Final estimate: PPL = [0-9.]*' "$OUT/$name.llama.ppl" | grep -o '[0-9.]*$')
  kp=$(grep -io 'perplexity[^0-9]*[0-9.]*' "$OUT/$name.ks.ppl" | tail -1 | grep -o '[0-9.]*$')
  d=$(python3 -c "print('%+.3f%%' % (100*($kp/$lp-1)))" 2>/dev/null || echo "?")
  echo "| $name | $ctx | $same | $kp | $lp | $d |"
done
