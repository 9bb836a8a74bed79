#!/usr/bin/env bash
# install.sh — `make install`'s tree: cmake --install into a scratch prefix
# (through DESTDIR, as packagers do, then moved: the .pc file must follow),
# then a program (hello.c) built with only pkg-config's flags, run on the
# fixture model; the installed binary must run too.
# Usage: bash install.sh <build-dir> <fixtures-dir> <scratch-dir> <cc>
# KS_TEST_EMULATOR (set by a cross build, cmake/install.cmake) runs the
# target's programs: the host kernel cannot run them itself.
set -u
EMU=${KS_TEST_EMULATOR:-}
BUILD=$1; FIX=$2; TMP=$3; CC=$4
DIR=$(cd "$(dirname "$0")" && pwd)
command -v pkg-config >/dev/null 2>&1 || { echo "SKIP: pkg-config not found"; exit 77; }
rm -rf "$TMP"; mkdir -p "$TMP"
DESTDIR="$TMP/stage" cmake --install "$BUILD" --prefix /opt/kvsieve > "$TMP/install.log" 2>&1 ||
  { echo "FAIL: cmake --install: $(tail -5 "$TMP/install.log")"; exit 1; }
mv "$TMP/stage/opt/kvsieve" "$TMP/moved"
P="$TMP/moved"
fail=0
for f in bin/kvsieve include/kvsieve.h include/kvsieve_server.h; do
  [ -e "$P/$f" ] || { echo "FAIL: $f not installed"; fail=1; }
done
PC=$(find "$P" -name kvsieve.pc | head -1)
[ -n "$PC" ] || { echo "FAIL: no kvsieve.pc installed"; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$PC")
FLAGS=$(pkg-config --cflags --libs kvsieve) || { echo "FAIL: pkg-config kvsieve"; exit 1; }
echo "pkg-config: $FLAGS"
"$CC" -std=c11 -o "$TMP/hello" "$DIR/hello.c" $FLAGS ${KS_CONSUMER_LDFLAGS:-} > "$TMP/cc.log" 2>&1 ||
  { echo "FAIL: building against the installed tree: $(head -20 "$TMP/cc.log")"; exit 1; }
$EMU "$TMP/hello" "$FIX/models/aidreams260K.gguf" || { echo "FAIL: hello"; fail=1; }
$EMU "$P/bin/kvsieve" info -m "$FIX/models/aidreams260K.gguf" > /dev/null 2>&1 || { echo "FAIL: the installed kvsieve"; fail=1; }
[ $fail -eq 0 ] && echo PASS
exit $fail
