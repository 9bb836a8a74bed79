#!/usr/bin/env bash
# openai_node.sh — the official OpenAI Node client (npm package `openai`,
# installed by scripts/deps.sh into tests/server/node/) against
# `kvsieve serve` on the aidreams260K model: see node/test.mjs.
# Usage: bash openai_node.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$1; FIX=$2; TMP=$3
DIR=$(cd "$(dirname "$0")" && pwd)
command -v node >/dev/null 2>&1 || { echo "SKIP: node not found (scripts/deps.sh installs it)"; exit 77; }
[ -f "$DIR/node/node_modules/openai/package.json" ] || {
  echo "SKIP: the openai npm package is not installed (scripts/deps.sh runs npm ci in tests/server/node)"; exit 77; }
command -v curl >/dev/null 2>&1 || { echo "SKIP: curl not found"; exit 77; }
mkdir -p "$TMP"
source "$DIR/common.sh"
MODEL="$FIX/models/aidreams260K.gguf"
expected=$("$KS" run -m "$MODEL" -p "Once upon a time" -n 24 --temp 0 -t 2 2>/dev/null)
start_server node -m "$MODEL" --parallel 2 -t 2 --api-key node-test-key
timeout 120 node "$DIR/node/test.mjs" "$BASE/v1" node-test-key "$expected" || bad "node client checks (above)"
stop_server "$PID" node
finish
