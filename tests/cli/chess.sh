#!/usr/bin/env bash
# chess.sh — CHESS's calibration round trip on the real aidreams260K model
# (context 128): `kvsieve eval --calibrate` writes MODEL.gguf.chess.json
# beside the model (a copy in the scratch dir) with the 99th percentiles it
# prints; eval / run / bench then pass those thresholds to chess (and say so
# on stderr), explicit --policy-arg thresholds win, a malformed file is a
# usage error, and chess reports its selections and rebuilds.
# Usage: bash chess.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$1; FIX=$2; TMP=$3
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not found (it checks the JSON)"; exit 77; }  # CTest SKIP_RETURN_CODE
rm -rf "$TMP"; mkdir -p "$TMP"
cp "$FIX/models/aidreams260K.gguf" "$TMP/model.gguf"
MODEL="$TMP/model.gguf"
CAL="$MODEL.chess.json"
. "$(dirname "$0")/lib/check.sh"

# before calibration: chess runs and notes the missing file
"$KS" eval -m "$MODEL" --task passkey,longgen --lengths 128 --depths 0.5 --samples 1 -t 2 --page 8 --window 8 \
  --policy dense,chess --budget 50% >/dev/null 2>"$TMP/err0" || bad "uncalibrated chess eval failed: $(cat "$TMP/err0")"
grep -q "no chess calibration" "$TMP/err0" || bad "missing-calibration note: $(cat "$TMP/err0")"

# calibrate: the JSON lands beside the model, with the printed values
"$KS" eval -m "$MODEL" --lengths 128 --samples 2 -t 2 --calibrate --json >"$TMP/cal.json" 2>"$TMP/err" \
  || bad "calibration run failed: $(cat "$TMP/err")"
[ -s "$CAL" ] || bad "no calibration file at $CAL"
line=$(grep "chess calibration" "$TMP/err")
[ -n "$line" ] || bad "calibration not printed: $(cat "$TMP/err")"
python3 - "$CAL" "$line" "$TMP/cal.json" <<'PY' || bad "calibration JSON"
import json, re, sys
c = json.load(open(sys.argv[1]))
assert c["policy"] == "chess" and c["percentile"] == 99 and c["tokens"] > 10, c
assert 0 < c["h_max"] < 20 and 0 < c["v_max"] < 100, c
m = re.search(r"h_max=(\S+) v_max=(\S+)", sys.argv[2])
assert m and abs(float(m.group(1)) - c["h_max"]) < 1e-6 and abs(float(m.group(2)) - c["v_max"]) < 1e-6, (m, c)
json.load(open(sys.argv[3]))  # --json output stays parseable
PY

# eval reads it by default and reports the counters
"$KS" eval -m "$MODEL" --task passkey,longgen --lengths 128 --depths 0.5 --samples 1 -t 2 --page 8 --window 8 \
  --policy dense,quest,chess --budget 25%,100% --json >"$TMP/pol.json" 2>"$TMP/err" \
  || bad "calibrated chess eval failed: $(cat "$TMP/err")"
grep -q "chess thresholds from $CAL: h_max=.*,v_max=" "$TMP/err" || bad "thresholds not read: $(cat "$TMP/err")"
grep -q "chess@25% .*selections, .*rebuilds" "$TMP/err" || bad "no counters: $(cat "$TMP/err")"
python3 - "$TMP/pol.json" <<'PY' || bad "chess eval JSON"
import json, sys
s = {x["config"]: x for x in json.load(open(sys.argv[1]))["summary"]}
full = s["chess@100%"]
assert full["agreement_forced"] == 1 and full["agreement_free"] == 1 and abs(full["kl"]) < 1e-9, full
assert s["chess@25%"]["selections"] > 0 and 0 <= s["chess@25%"]["rebuilds"] <= s["chess@25%"]["selections"], s
assert s["chess@25%"]["attention_recall"] < 1, s["chess@25%"]
PY

# explicit thresholds win (nothing read); run and bench read the file too
"$KS" eval -m "$MODEL" --task passkey --lengths 128 --depths 0.5 --samples 1 -t 2 --page 8 --window 8 \
  --policy dense,chess --budget 50% --policy-arg h_max=1 --policy-arg v_max=1 >/dev/null 2>"$TMP/err" \
  || bad "explicit thresholds failed: $(cat "$TMP/err")"
grep -q "chess thresholds from" "$TMP/err" && bad "file read despite explicit thresholds"
"$KS" run -m "$MODEL" -p "Once upon a time" -n 24 --temp 0 --page 8 --window 8 --policy chess --budget 16 \
  >/dev/null 2>"$TMP/err" || bad "run with chess failed: $(cat "$TMP/err")"
grep -q "chess thresholds from" "$TMP/err" || bad "run did not read the calibration: $(cat "$TMP/err")"
"$KS" run -m "$MODEL" -p "Once upon a time" -n 8 --temp 0 --policy quest --budget 16 >/dev/null 2>"$TMP/err" \
  || bad "run with quest failed: $(cat "$TMP/err")"
grep -q "chess" "$TMP/err" && bad "calibration note for a policy without chess: $(cat "$TMP/err")"

# a malformed file is refused with a message
echo '{"h_max": "high"}' >"$CAL"
"$KS" run -m "$MODEL" -p "Once" -n 4 --policy chess --budget 16 >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] || bad "malformed calibration exited $rc"
grep -q "not a chess calibration" "$TMP/err" || bad "malformed calibration message: $(cat "$TMP/err")"
# bad policy arguments are usage errors
"$KS" run -m "$FIX/models/aidreams260K.gguf" -p "Once" -n 4 --policy chess --budget 16 --policy-arg preset=wild \
  >/dev/null 2>"$TMP/err" && bad "preset=wild accepted"
grep -q "preset 'wild'" "$TMP/err" || bad "bad preset message: $(cat "$TMP/err")"

finish chess.sh
