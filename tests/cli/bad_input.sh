#!/usr/bin/env bash
# bad_input.sh — the CLI on hostile or mistaken input.
#
# Why at the shell level: the library tests prove the parser rejects bad
# files, but users meet the CLI.  Every failure here must be a clean exit
# (non-zero, below 128 — a signal such as SIGSEGV/SIGABRT shows up as 128+n)
# with a message on stderr, and usage mistakes must be exit code 2 so scripts
# can tell "you called me wrong" from "the input is bad".
# Usage: bash bad_input.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$1; FIX=$2; TMP=$3
rm -rf "$TMP"; mkdir -p "$TMP"
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
MODEL=$FIX/models/aidreams260K.gguf
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
command -v "$PY" >/dev/null 2>&1 || { echo "SKIP: python3 not found (it writes the corrupt model files)"; exit 77; }  # CTest SKIP_RETURN_CODE

# Under -DKVSIEVE_SANITIZE=ON a sanitizer report exits 1 like a clean error:
# look for it in stderr.
sanitized() { grep -qE 'ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer' "$1"; }

# expect_fail WANT_CODE|any DESCRIPTION -- command...
expect_fail() {
  local want=$1 what=$2; shift 3
  timeout 60 "$@" >"$TMP/out" 2>"$TMP/err" </dev/null
  local rc=$?
  if [ "$rc" -eq 0 ]; then fail "$what: exit 0"; return; fi
  if [ "$rc" -eq 124 ]; then fail "$what: timed out"; return; fi
  if [ "$rc" -ge 128 ]; then fail "$what: crashed (exit $rc): $(tail -3 "$TMP/err")"; return; fi
  if sanitized "$TMP/err"; then fail "$what: sanitizer report: $(grep -m1 -E 'ERROR|runtime error' "$TMP/err")"; return; fi
  if [ "$want" != any ] && [ "$rc" -ne "$want" ]; then fail "$what: exit $rc, want $want"; fi
  [ -s "$TMP/err" ] || fail "$what: no message on stderr"
}

# ---- corrupt model files --------------------------------------------------
"$PY" - "$MODEL" "$TMP" <<'PYEOF'
import sys, random
src, out = sys.argv[1], sys.argv[2]
d = bytearray(open(src, 'rb').read())
hdr = 13648  # header + tensor infos of this fixture
w = lambda n, b: open(f'{out}/{n}.gguf', 'wb').write(bytes(b))
for cut in (3, 4, 8, 16, 24, 100, 1000, 5000, hdr - 1, hdr + 10, len(d) // 2, len(d) - 1):
    w(f'trunc{cut}', d[:cut])
rng = random.Random(1234)
for i in range(24):
    m = bytearray(d)
    for _ in range(1 + i % 4):
        p = rng.randrange(hdr)
        m[p] ^= 1 << rng.randrange(8)
    w(f'flip{i}', m)
m = bytearray(d); m[16:24] = (1 << 62).to_bytes(8, 'little'); w('hugekv', m)
m = bytearray(d); m[8:16] = (1 << 62).to_bytes(8, 'little'); w('hugetensors', m)
m = bytearray(d); m[4:8] = (1).to_bytes(4, 'little'); w('version1', m)
w('garbage', bytes(rng.randrange(256) for _ in range(65536)))
w('garbage_magic', b'GGUF' + bytes(rng.randrange(256) for _ in range(4096)))
w('empty', b'')
w('text', b'this is not a model\n' * 100)
PYEOF
[ -f "$TMP/empty.gguf" ] || fail "could not create the corrupt files"

# Bit flips may leave a valid file (a flipped byte in a string): such a file
# may load; we only demand no crash there.  Everything else must fail.
for f in "$TMP"/*.gguf; do
  b=$(basename "$f" .gguf)
  for cmd in info run; do
    if [ "$cmd" = run ]; then args=(run -m "$f" -p "Once upon a time" -n 4 --temp 0); else args=(info "$f"); fi
    if [[ $b == flip* ]]; then
      timeout 60 "$KS" "${args[@]}" >/dev/null 2>"$TMP/err" </dev/null
      rc=$?
      { [ "$rc" -ge 128 ] || [ "$rc" -eq 124 ]; } && fail "$cmd $b: crashed or hung (exit $rc): $(tail -3 "$TMP/err")"
      [ "$rc" -ne 0 ] && [ ! -s "$TMP/err" ] && fail "$cmd $b: exit $rc without a message"
      sanitized "$TMP/err" && fail "$cmd $b: sanitizer report: $(grep -m1 -E 'ERROR|runtime error' "$TMP/err")"
    else
      expect_fail 1 "$cmd $b" -- "$KS" "${args[@]}"
    fi
  done
done
# Well-formed files with extreme metadata values: `info --kv` prints every
# value, so it must cope with u64 above INT64_MAX, NaN/inf floats, bools,
# empty strings and arrays.  Any exit code but a crash.
"$PY" - "$TMP" <<'PYEOF'
import struct, sys
out = sys.argv[1]
def kvfile(name, entries):
    b = struct.pack('<IIQQ', 0x46554747, 3, 0, len(entries))
    for key, t, payload in entries:
        b += struct.pack('<Q', len(key)) + key.encode() + struct.pack('<I', t) + payload
    open(f'{out}/{name}.kvfile', 'wb').write(b)
u64max = struct.pack('<Q', 2**64 - 1)
kvfile('u64_scalar', [('a.u64', 10, u64max)])
kvfile('i64_min', [('a.i64', 11, struct.pack('<q', -2**63))])
kvfile('u64_array', [('a.arr', 9, struct.pack('<IQ', 10, 2) + u64max + u64max)])
kvfile('float_specials', [('a.nan', 6, struct.pack('<I', 0x7fc00000)), ('a.inf', 12, struct.pack('<d', float('inf'))),
                          ('a.big', 6, struct.pack('<f', 3e38)),
                          ('a.arr', 9, struct.pack('<IQ', 6, 3) + struct.pack('<I', 0x7fc00000) + struct.pack('<ff', 1e30, -1e30))])
kvfile('empties', [('a.s', 8, struct.pack('<Q', 0)), ('a.arr', 9, struct.pack('<IQ', 8, 0)), ('a.b', 7, b'\x01')])
PYEOF
for f in "$TMP"/*.kvfile; do
  for opt in --kv --tensors ""; do
    timeout 60 "$KS" info $opt "$f" >/dev/null 2>"$TMP/err" </dev/null
    rc=$?
    { [ "$rc" -ge 128 ] || [ "$rc" -eq 124 ]; } && fail "info $opt $(basename "$f"): crashed or hung (exit $rc): $(tail -2 "$TMP/err")"
    sanitized "$TMP/err" && fail "info $opt $(basename "$f"): sanitizer report: $(grep -m1 -E 'ERROR|runtime error' "$TMP/err")"
  done
done
expect_fail 1 "info nonexistent" -- "$KS" info "$TMP/does-not-exist.gguf"
expect_fail 1 "run nonexistent" -- "$KS" run -m "$TMP/does-not-exist.gguf" -p hi -n 1
expect_fail 1 "info on a directory" -- "$KS" info "$TMP"
expect_fail any "info /dev/null" -- "$KS" info /dev/null

# ---- usage errors: exit 2 --------------------------------------------------
expect_fail 2 "no command" -- "$KS"
expect_fail 2 "unknown command" -- "$KS" frobnicate
expect_fail 2 "info unknown flag" -- "$KS" info --bogus "$MODEL"
expect_fail 2 "info without file" -- "$KS" info
expect_fail 2 "run unknown flag" -- "$KS" run -m "$MODEL" -p hi --bogus
expect_fail 2 "run bad number" -- "$KS" run -m "$MODEL" -p hi -n twelve
expect_fail 2 "run missing value" -- "$KS" run -m "$MODEL" -p
expect_fail 2 "gen-model unknown flag" -- "$KS" gen-model --bogus
expect_fail 2 "gen-model missing args" -- "$KS" gen-model --shape tiny-llama
expect_fail 2 "gen-model unknown shape" -- "$KS" gen-model --shape gpt-17 --type q8_0 --vocab-from "$MODEL" --out "$TMP/x.gguf"
expect_fail 2 "gen-model unknown type" -- "$KS" gen-model --shape tiny-llama --type iq2_xxs --vocab-from "$MODEL" --out "$TMP/x.gguf"
expect_fail 2 "gen-model q8_K is not a weight type" -- "$KS" gen-model --shape tiny-llama --type q8_k --vocab-from "$MODEL" --out "$TMP/x.gguf"
expect_fail 2 "gen-model bad seed" -- "$KS" gen-model --shape tiny-llama --type q8_0 --vocab-from "$MODEL" --out "$TMP/x.gguf" --seed -1
expect_fail 2 "gen-model zero layers" -- "$KS" gen-model --shape tiny-llama --type q8_0 --vocab-from "$MODEL" --out "$TMP/x.gguf" --layers 0
[ -e "$TMP/x.gguf" ] && fail "a usage error still wrote a file"

# ---- gen-model runtime failures: exit 1 -------------------------------------
expect_fail 1 "gen-model unwritable --out" -- "$KS" gen-model --shape tiny-llama --type q8_0 --vocab-from "$MODEL" --out /nonexistent-dir-kvsieve/x.gguf
expect_fail 1 "gen-model corrupt vocab" -- "$KS" gen-model --shape tiny-llama --type q8_0 --vocab-from "$TMP/garbage.gguf" --out "$TMP/y.gguf"
expect_fail 1 "gen-model missing vocab" -- "$KS" gen-model --shape tiny-llama --type q8_0 --vocab-from "$TMP/nope.gguf" --out "$TMP/y.gguf"
if [ -w /dev/full ]; then
  expect_fail 1 "gen-model disk full" -- "$KS" gen-model --shape tiny-llama --type q8_0 --vocab-from "$MODEL" --out /dev/full
  [ -e /dev/full ] || fail "gen-model removed /dev/full"
fi
[ -e "$TMP/y.gguf" ] && fail "a failed gen-model left a file behind"

# ---- policies and tiers ------------------------------------------------------
expect_fail 2 "unknown policy" -- "$KS" run -m "$MODEL" -p hi --policy nosuch
expect_fail 2 "bad budget" -- "$KS" run -m "$MODEL" -p hi --policy quest --budget 12q
expect_fail 2 "budget over 100%" -- "$KS" run -m "$MODEL" -p hi --policy quest --budget 150%
expect_fail 2 "two policies for run" -- "$KS" run -m "$MODEL" -p hi --policy quest,h2o
expect_fail 2 "policy-arg without =" -- "$KS" run -m "$MODEL" -p hi --policy quest --policy-arg group
expect_fail 2 "bad mem-cap" -- "$KS" run -m "$MODEL" -p hi --mem-cap lots
expect_fail any "unknown policy-arg key" -- "$KS" run -m "$MODEL" -p hi --policy quest --policy-arg nokey=1
expect_fail any "spec without a draft model" -- "$KS" run -m "$MODEL" -p hi -n 4 --policy spec --budget 32
grep -q "MODEL-dlm/" "$TMP/err" && grep -q "make_dlm.py --target" "$TMP/err" || fail "spec without a draft: no hint ($(cat "$TMP/err"))"
# a pytorch_model.bin that calls code is refused, naming what it calls
mkdir -p "$TMP/evil-dlm"
cp "$FIX/models/dlm-layouts/bad-global.bin" "$TMP/evil-dlm/pytorch_model.bin"
cp "$FIX/models/dlm-layouts/eagle-bin/config.json" "$TMP/evil-dlm/"
expect_fail any "pickled code in a draft" -- "$KS" run -m "$MODEL" -p hi -n 4 --policy spec --budget 32 --policy-arg "spec.dlm=$TMP/evil-dlm"
grep -q "posix.system" "$TMP/err" || fail "pickled code in a draft: message does not name posix.system ($(cat "$TMP/err"))"
expect_fail 1 "offload dir missing" -- "$KS" run -m "$MODEL" -p hi -n 4 --kv-offload-layers 2 --kv-offload-dir /nonexistent-kvsieve-dir
expect_fail any "offload more layers than the model has" -- "$KS" run -m "$MODEL" -p hi --kv-offload-layers 99
expect_fail any "mem-cap below the weights" -- "$KS" run -m "$MODEL" -p hi --policy quest --budget 32 --mem-cap 1000
grep -q "cannot create" "$TMP/err" 2>/dev/null || true
"$KS" run -m "$MODEL" -p hi -n 4 --kv-offload-layers 2 --kv-offload-dir /nonexistent-kvsieve-dir 2>&1 | grep -q "cannot create" \
  || fail "offload dir error message"

[ "$fails" -eq 0 ] && echo "bad_input: all checks passed"
exit $((fails > 0))
