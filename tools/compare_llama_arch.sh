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
set -u
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
