#!/usr/bin/env bash
# chat_page.sh — the chat page (GET /) in a real browser: Debian's chromium,
# headless, driven by puppeteer-core (browser/chat_page.mjs) against
# `kvsieve serve` on loopback with the bundled model and an API key.  The
# driver is the one scripts/deps.sh installs from
# tests/server/browser/package-lock.json; when it is not there, `npm ci` from
# the same lock file into the scratch dir (never the source tree) is tried
# once.  Skipped (77) only without node, chromium or the npm package.  The
# screenshot is left in the scratch dir (build/server_chat_page/chat-page.png).
# Usage: bash chat_page.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$1; FIX=$2; TMP=$3
DIR=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$DIR/../.." && pwd)
command -v node >/dev/null 2>&1 || { echo "SKIP: node not found (scripts/deps.sh installs it)"; exit 77; }
CHROMIUM=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
[ -n "$CHROMIUM" ] || { echo "SKIP: chromium not found (scripts/deps.sh installs it)"; exit 77; }
export CHROMIUM
mkdir -p "$TMP"
SCRIPT="$DIR/browser/chat_page.mjs"
if [ ! -f "$DIR/browser/node_modules/puppeteer-core/package.json" ]; then
  command -v npm >/dev/null 2>&1 || { echo "SKIP: puppeteer-core is not installed and npm is missing"; exit 77; }
  mkdir -p "$TMP/browser"
  cp "$DIR/browser/package.json" "$DIR/browser/package-lock.json" "$SCRIPT" "$TMP/browser/"
  if [ ! -f "$TMP/browser/node_modules/puppeteer-core/package.json" ]; then
    (cd "$TMP/browser" && timeout 120 npm ci --no-audit --no-fund --loglevel=error) > "$TMP/npm.log" 2>&1 ||
      { echo "SKIP: npm ci failed (no registry?): $(tail -3 "$TMP/npm.log")"; exit 77; }
  fi
  SCRIPT="$TMP/browser/chat_page.mjs"
fi
source "$DIR/common.sh"
MODEL="$SRC/models/kvsieve-default.gguf"
[ -f "$MODEL" ] || MODEL="$FIX/models/aidreams260K.gguf"
printf 'An uploaded document.\nIt has two lines.\n' > "$TMP/doc.txt"
rm -f "$TMP/chat-page.png"
# the browser keeps its profile (localStorage) in a fresh temporary directory
start_server page -m "$MODEL" --parallel 2 -t 2 -c 4096 --api-key page-key
timeout 150 node "$SCRIPT" "$BASE" page-key "$TMP/chat-page.png" "$TMP/doc.txt" || bad "chat page checks (above)"
[ -s "$TMP/chat-page.png" ] || bad "no screenshot"
stop_server "$PID" page
finish
