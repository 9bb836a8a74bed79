# check.sh — what the CLI test scripts share, sourced (not a test itself:
# CTest runs tests/cli/*.sh, not this folder).  A script records failures with
# `bad` and keeps going, so one run lists every broken check; `finish NAME`
# prints the verdict and exits with it.
fail=0
bad() { echo "FAIL: $*"; fail=1; }
# has TEXT PATTERN WHAT: TEXT contains PATTERN (grep -e), else a failure naming WHAT
has() { echo "$1" | grep -q -e "$2" || bad "$3: $1"; }
finish() {
  [ $fail -eq 0 ] && echo "$1: all checks passed"
  exit $fail
}

# check_bundled_model KS MODEL N_CTX N_VOCAB: a model this project ships exists,
# fits in 30 MB, and `kvsieve info` reads it as a GQA llama with that trained
# context and a llama tokenizer of that size.  A missing file ends the script.
check_bundled_model() {
  local ks=$1 model=$2 n_ctx=$3 n_vocab=$4 size info
  [ -f "$model" ] || { echo "FAIL: $model missing"; exit 1; }
  size=$(stat -c %s "$model")
  [ "$size" -le $((30 * 1024 * 1024)) ] || bad "$model is $size bytes (> 30 MB)"
  info=$("$ks" info "$model" 2>&1) || bad "info failed: $info"
  has "$info" "architecture:  llama" "architecture"
  has "$info" "$n_ctx trained" "context length"
  has "$info" "GQA" "not GQA"
  has "$info" "tokenizer:     llama, $n_vocab tokens" "tokenizer"
}

# A passkey prompt in the eval's wording, short enough for any bundled model.
PASSKEY_PROMPT="A pass key is hidden in the text below. Remember it. The pass key is 31415. 31415 is the pass key. The quiet farmer walks near the old bridge. A small bird sings by the river today. What is the pass key? The pass key is"

# check_bundled_dlm KS DLM HIDDEN AUX: an EAGLE-3 draft this project ships has
# its config and weights, fits in 10 MB, and `kvsieve info` reads it as a draft
# of that hidden size (the target's too) over those target layers ("1, 3, 5").
check_bundled_dlm() {
  local ks=$1 dlm=$2 hidden=$3 aux=$4 dsize dinfo
  [ -f "$dlm/config.json" ] && [ -f "$dlm/model.safetensors" ] || bad "DLM missing in $dlm"
  dsize=$(du -sb "$dlm" | cut -f1)
  [ "$dsize" -le $((10 * 1024 * 1024)) ] || bad "DLM is $dsize bytes (> 10 MB)"
  dinfo=$("$ks" info "$dlm" 2>&1) || bad "info DLM failed: $dinfo"
  has "$dinfo" "EAGLE-3 draft model" "DLM info"
  has "$dinfo" "hidden $hidden (target $hidden)" "DLM hidden size"
  has "$dinfo" "kv 2 x" "DLM KV heads"
  has "$dinfo" "aux layers \[$aux\]" "DLM aux layers"
}
