#!/usr/bin/env bash
# check_app.sh — the CLI's shape, checked on its sources (CTest: app_layout).
#
# Two rules of issue 38 that a compiler does not see by itself:
#   1. app/ includes only the public API: every #include "..." in app/ names
#      a header of app/ itself or of include/ (the build also compiles app/
#      without the engine's include roots, so a violation fails there too;
#      this test names the file and line);
#   2. no function in app/ is over 120 lines (a command is its option rows in
#      app/opts.c plus short steps, not one loop of strcmp chains).
# A function is counted from the line that opens it at column 0 ("name(...)
# {" or a definition whose "{" closes its signature) to its closing "}" at
# column 0, the house style (clang-format) of every file in app/.
# Usage: bash check_app.sh <source-dir>
set -u
SRC=${1:-$(cd "$(dirname "$0")/.." && pwd)}
MAX=120
fails=0
for f in "$SRC"/app/*.c "$SRC"/app/*.h; do
  while IFS=: read -r line hdr; do
    [ -e "$SRC/app/$hdr" ] || [ -e "$SRC/include/$hdr" ] || {
      echo "FAIL: ${f#$SRC/}:$line includes \"$hdr\", which is not a public header (include/) nor one of app/" >&2
      fails=$((fails + 1))
    }
  done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" | sed 's/^\([0-9]*\):.*"\([^"]*\)".*/\1:\2/')
done
for f in "$SRC"/app/*.c; do
  out=$(awk -v max=$MAX -v file="${f#$SRC/}" '
    # a definition opens at column 0 with an identifier and has "(" on its first line
    !infn && /^[A-Za-z_][A-Za-z0-9_ \*]*\(/ && !/;[[:space:]]*$/ { start = NR; name = $0; sig = 1 }
    sig && /\{[[:space:]]*$/ { infn = 1; sig = 0 }
    sig && /;[[:space:]]*$/ { sig = 0 }
    infn && /^\}/ {
      n = NR - start + 1
      sub(/\(.*/, "", name)
      if (n > max) printf "FAIL: %s:%d: %s is %d lines (at most %d)\n", file, start, name, n, max
      infn = 0
    }' "$f")
  if [ -n "$out" ]; then echo "$out" >&2; fails=$((fails + $(echo "$out" | wc -l))); fi
done
n_fn=$(cat "$SRC"/app/*.c | grep -c '^[A-Za-z_][A-Za-z0-9_ \*]*(.*{[[:space:]]*$')
echo "check_app: $(ls "$SRC"/app/*.c "$SRC"/app/*.h | wc -l) files, $n_fn one-line signatures seen, $fails problem(s)"
[ "$fails" -eq 0 ]
