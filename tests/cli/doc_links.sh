#!/usr/bin/env bash
# doc_links.sh — every relative link and every docs/... path named in the
# repository's Markdown resolves (tools/check_links.py): the docs are split
# into reference pages and results pages with their raw data beside them,
# and a moved file must not leave a dangling reference behind.
# (tools/check_links.py also checks docs/ paths named in sources, tools and tests.)
# Usage: bash doc_links.sh <kvsieve> <fixtures-dir> <scratch-dir>  (only the script's own location is used)
set -u
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not found (tools/check_links.py needs it)"; exit 77; }  # CTest SKIP_RETURN_CODE
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
python3 "$ROOT/tools/check_links.py" "$ROOT"
