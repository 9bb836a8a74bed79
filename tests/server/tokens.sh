#!/usr/bin/env bash
# tokens.sh — POST /tokenize, /detokenize and /apply-template (llama-server's
# shapes) against `kvsieve serve` on loopback: round trips on the bundled
# model, pieces (bytes for a piece that is part of a character), the chat
# rendering of a phi-3-template model equal to the documented template and
# to the prompt /v1/chat/completions counts, the API key, and every bad
# field a 400 naming it; and logprobs in chat and text completions, streamed
# and not.  The checks are tokens.py and logprobs.py.
# Usage: bash tokens.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$1; FIX=$2; TMP=$3
DIR=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$DIR/../.." && pwd)
command -v curl >/dev/null 2>&1 || { echo "SKIP: curl not found"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not found"; exit 77; }
mkdir -p "$TMP"
source "$DIR/common.sh"
MODEL="$SRC/models/kvsieve-default.gguf"
[ -f "$MODEL" ] || MODEL="$FIX/models/aidreams260K.gguf"

start_server tok -m "$MODEL" -t 2 -c 512 --api-key tok-key
python3 "$DIR/tokens.py" "$BASE" tok-key plain || bad "tokens.py plain (above)"
python3 "$DIR/logprobs.py" "$BASE" tok-key || bad "logprobs.py (above)"
stop_server "$PID" tok

# A chat template: the rendering is the documented phi-3 one, and it is
# the prompt a chat completion counts.
PHI="$TMP/tiny-phi3.gguf"
"$KS" gen-model --shape tiny-llama --type q8_0 --layers 1 --ctx 512 \
  --vocab-from "$FIX/tokenizer/ggml-vocab-phi-3.gguf" --out "$PHI" > /dev/null 2>&1 || bad "gen-model (phi-3 vocabulary)"
if [ -f "$PHI" ]; then
  start_server phi3 -m "$PHI" -t 2 -c 512
  python3 "$DIR/tokens.py" "$BASE" "" phi3 || bad "tokens.py phi3 (above)"
  stop_server "$PID" phi3
fi
finish
