#!/usr/bin/env bash
# model.sh — the bundled model (models/kvsieve-default.gguf, trained by
# tools/train_model.py) and its distilled EAGLE-3 draft
# (models/kvsieve-default-dlm, the one spec finds beside the model, and the
# paper's recipe, models/kvsieve-default-dlm-paper; tools/make_dlm.py).  The model loads with valid
# metadata (llama, GQA, 16K context, its own 4096-token SentencePiece
# vocabulary) and fits in 30 MB; the default model path finds it; on a natural
# prompt it writes English words, and exactly the committed greedy
# continuation (tests/golden/trained_continuation.txt; the scalar kernels'
# trained_continuation_scalar.txt); greedy output on a
# passkey prompt retrieves the needle and follows it when it changes
# (retrieval, not memory); its tokenizer gives SentencePiece's ids
# (tests/golden/trained_tokens.txt) and decodes them back to the text.  The
# draft loads as an EAGLE-3 checkpoint shaped for this target, and `spec`
# finds it beside the model.
# Usage: bash model.sh <kvsieve> <fixtures-dir> <scratch-dir>
set -u
KS=$(readlink -f "$1"); TMP=$3
mkdir -p "$TMP"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
MODEL="$SRC/models/kvsieve-default.gguf"
. "$(dirname "$0")/lib/check.sh"
check_bundled_model "$KS" "$MODEL" 16384 4096

# a language model: natural text in, English words out (at least 6 distinct
# lower-case words of 3+ letters among its first 30 tokens, no '?' runs)
nat=$("$KS" run -m "$MODEL" -p "And God said unto Moses," -n 30 --temp 0 -t 2 2>"$TMP/err") ||
    bad "natural run failed: $(cat "$TMP/err")"
words=$(echo "$nat" | grep -oE '\b[a-z]{3,}\b' | sort -u | wc -l)
[ "$words" -ge 6 ] || bad "natural continuation is not English: '$nat'"
case "$nat" in *'???'*) bad "natural continuation has '???': '$nat'";; esac
# byte for byte against the committed greedy continuations (40 tokens).  There
# is a near-tie at step 5.  Every SIMD configuration breaks it the same way,
# into trained_continuation.txt: the file-layout kernels (AVX2, AVX-512, any
# thread count), the transposed Q8_0 panels that AVX-512 VNNI hosts repack the
# weights into (power-of-two activation scales, blocks summed one after
# another), and with either attention kernel of the prefill (bf16 where the
# CPU has AVX-512 BF16, or KS_ATTN=f32).  The scalar fallback breaks it the
# other way, into trained_continuation_scalar.txt.  tests/golden/
# kvsieve-default.bin, checked by test_golden against the independent
# reference, tolerates either.
C="$SRC/tests/golden/trained_continuation.txt"
run40() { env "$@" "$KS" run -m "$MODEL" -p "And God said unto Moses," -n 40 --temp 0 -t 2 2>/dev/null; }
# /proc/cpuinfo describes the CLI's CPU only when it runs natively on x86-64:
# under QEMU (a cross build sets KS_TEST_TARGET) or on ARM the SIMD levels
# are NEON's, which break the tie as the x86 kernels do
x86=0
[ -z "${KS_TEST_TARGET:-}" ] && [ "$(uname -m)" = x86_64 ] && x86=1
if { [ $x86 = 0 ] || { grep -qw avx2 /proc/cpuinfo 2>/dev/null && grep -qw fma /proc/cpuinfo; }; } &&
    [ "${KS_SIMD:-}" != scalar ]; then
    gold=$(run40)
    [ "$gold" = "$(cat "$C")" ] || bad "greedy continuation drifted: '$gold'"
    if [ $x86 = 1 ] && grep -qw avx512_vnni /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo && [ -z "${KS_SIMD:-}" ]; then
        flat=$(run40 KS_SIMD=avx2)
        [ "$flat" = "$(cat "$C")" ] || bad "greedy continuation (file layout, AVX2) drifted: '$flat'"
        f32=$(run40 KS_ATTN=f32)
        [ "$f32" = "$(cat "$C")" ] || bad "greedy continuation (packed, f32 attention) drifted: '$f32'"
    fi
fi
scalar=$(run40 KS_SIMD=scalar)
[ "$scalar" = "$(cat "$SRC/tests/golden/trained_continuation_scalar.txt")" ] ||
    bad "greedy continuation (scalar kernels) drifted: '$scalar'"

PROMPT=$PASSKEY_PROMPT
out=$("$KS" run -m "$MODEL" -p "$PROMPT" -n 8 --temp 0 -t 2 2>"$TMP/err") || bad "run failed: $(cat "$TMP/err")"
case "$out" in *31415*) ;; *) bad "needle not retrieved: '$out'";; esac
out2=$("$KS" run -m "$MODEL" -p "${PROMPT//31415/27182}" -n 8 --temp 0 -t 2 2>/dev/null)
case "$out2" in *27182*) ;; *) bad "changed needle not retrieved: '$out2'";; esac
# with no -m and KVSIEVE_MODEL unset the binary finds the bundled model (build/kvsieve -> ../models)
out3=$(cd "$TMP" && env -u KVSIEVE_MODEL "$KS" run -p "$PROMPT" -n 8 --temp 0 -t 2 2>/dev/null)
[ "$out3" = "$out" ] || bad "default model run: '$out3', want '$out'"

DLM="$SRC/models/kvsieve-default-dlm"
check_bundled_dlm "$KS" "$DLM" 256 "1, 3, 5"
check_bundled_dlm "$KS" "$SRC/models/kvsieve-default-dlm-paper" 256 "1, 3, 5"
# spec finds the DLM beside the model and runs with it; at a budget covering
# the whole prompt it reproduces dense exactly.  (At 16-32 entries the
# distilled head does not yet keep this needle: docs/DLM.md has its recall.)
out4=$("$KS" run -m "$MODEL" -p "$PROMPT" -n 8 --temp 0 -t 2 --policy spec --budget 16 --sink 4 --window 4 2>"$TMP/err") ||
    bad "spec run failed: $(cat "$TMP/err")"
[ -n "$out4" ] || bad "spec at 16 entries wrote nothing"
out5=$("$KS" run -m "$MODEL" -p "$PROMPT" -n 8 --temp 0 -t 2 --policy spec --budget 4096 2>"$TMP/err") ||
    bad "spec run failed: $(cat "$TMP/err")"
[ "$out5" = "$out" ] || bad "spec at full budget: '$out5', want dense '$out'"

# The second trained pair (models/kvsieve-gpu.gguf and its draft: the gpu
# recipe, docs/MODEL.md): the same checks of shape and retrieval, and spec at
# full budget reproduces dense.
GPU_MODEL="$SRC/models/kvsieve-gpu.gguf"
check_bundled_model "$KS" "$GPU_MODEL" 16384 4096
# (in the eval's exact layout, needle and question on its own line: this
# model does not generalise from it as the first one does, and answers
# PASSKEY_PROMPT with another number)
GPROMPT="A pass key is hidden in the text below. Remember it.
The quiet farmer walks near the old bridge. The pass key is 31415. Remember it. 31415 is the pass key. A small bird sings by the river today.
What is the pass key? The pass key is"
g1=$("$KS" run -m "$GPU_MODEL" -p "$GPROMPT" -n 8 --temp 0 -t 2 2>"$TMP/err") || bad "gpu pair run failed: $(cat "$TMP/err")"
case "$g1" in *31415*) ;; *) bad "gpu pair: needle not retrieved: '$g1'";; esac
check_bundled_dlm "$KS" "$SRC/models/kvsieve-gpu-dlm" 384 "1, 4, 7"
g2=$("$KS" run -m "$GPU_MODEL" -p "$GPROMPT" -n 8 --temp 0 -t 2 --policy spec --budget 4096 2>"$TMP/err") ||
    bad "gpu pair spec run failed: $(cat "$TMP/err")"
[ "$g2" = "$g1" ] || bad "gpu pair spec at full budget: '$g2', want dense '$g1'"

finish model.sh
