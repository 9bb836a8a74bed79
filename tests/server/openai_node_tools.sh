#!/usr/bin/env bash
# openai_node_tools.sh — a tool-call round trip (plain and streamed) through the
# official OpenAI Node client against `kvsieve serve` on loopback with the
# bundled model: see node/tools.mjs.  The client is the one scripts/deps.sh
# installs from tests/server/node/package-lock.json; when it is not there,
# `npm ci` from the same lock file into the scratch dir (never the source
# tree) is tried once, and without node, npm or a reachable registry the
# test is skipped (77).
# Usage: bash openai_node_tools.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$1; FIX=$2; TMP=$3
DIR=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$DIR/../.." && pwd)
command -v node >/dev/null 2>&1 || { echo "SKIP: node not found (scripts/deps.sh installs it)"; exit 77; }
mkdir -p "$TMP"
SCRIPT="$DIR/node/tools.mjs"
if [ ! -f "$DIR/node/node_modules/openai/package.json" ]; then
  command -v npm >/dev/null 2>&1 || { echo "SKIP: the openai npm package is not installed and npm is missing"; exit 77; }
  mkdir -p "$TMP/node"
  cp "$DIR/node/package.json" "$DIR/node/package-lock.json" "$SCRIPT" "$TMP/node/"
  if [ ! -f "$TMP/node/node_modules/openai/package.json" ]; then
    (cd "$TMP/node" && timeout 60 npm ci --no-audit --no-fund --loglevel=error) > "$TMP/npm.log" 2>&1 ||
      { echo "SKIP: npm ci failed (no registry?): $(tail -3 "$TMP/npm.log")"; exit 77; }
  fi
  SCRIPT="$TMP/node/tools.mjs"
fi
source "$DIR/common.sh"
MODEL="$SRC/models/kvsieve-default.gguf"
[ -f "$MODEL" ] || MODEL="$FIX/models/aidreams260K.gguf"
start_server nodetools -m "$MODEL" --parallel 2 -t 2 -c 1024 --api-key node-tools-key
timeout 90 node "$SCRIPT" "$BASE/v1" node-tools-key || bad "node client tool-call checks (above)"
stop_server "$PID" nodetools
finish
