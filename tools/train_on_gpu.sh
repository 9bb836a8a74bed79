#!/bin/bash
# train_on_gpu.sh — train a target and distil its DLM on one GPU, in one command that fits a device call.
#
#   bash tools/train_on_gpu.sh OUT_DIR [BUDGET_MINUTES]        (on the GPU machine: OUT_DIR is $OUT)
#   SMOKE=1 DEVICE=cpu bash tools/train_on_gpu.sh /tmp/smoke 0.3   (here: the same path, tiny, on the CPU)
#
# RECIPE=gpu-large (the default; docs/MODEL.md, "The gpu-large recipe"): the
# 25.7M-parameter model on the Debian corpus of tools/build_corpus.py, whose
# pack (train-pack.u16.xz and pack.json, 11 MiB by default) travels in CORPUS
# (default .corpus, a folder of the checkout that .git/info/exclude ignores,
# named in the call's carry: tools/gpu_prepare.sh puts it there and prints
# the call).  A lent machine has no network and no apt, so nothing is
# rebuilt there: the pack is the corpus.  RECIPE=gpu replays the first GPU
# run's recipe on the first corpus (which then needs build/train-corpus.json
# carried).
#
# What runs, in order, each step bounded so the whole fits one call:
#   1. tools/train_model.py plans its stages to fill BUDGET_MINUTES (default
#      4.5) on this machine's GPU, capped at four passes over the pack's
#      natural text, trains (stopping with a checkpoint at 1.15 x the budget
#      whatever the plan said), and exports the GGUF (Q8_0);
#   2. tools/make_dlm.py distils the EAGLE-3 draft from that GGUF on the same
#      corpus (DLM_STEPS, DLM_BATCH, DLM_MINUTES: 1200, 4, 1.5);
#   3. everything worth bringing back (the GGUF, the draft, schedule.json,
#      both logs) goes into one tar, split into 15 MiB parts, flat in
#      OUT_DIR: a device call brings back at most 8 files of 16 MiB, 64 MiB
#      in all.  train.log and schedule.json are also copied beside the parts
#      so they can be read without unpacking.  tools/gpu_unpack.sh joins the
#      parts here.
# At most about 8 minutes on an H100 or H200 with the default budget; the device
# call's timeout (tools/gpu_prepare.sh prints 560 s) ends it before the
# 10-minute limit.  Every step is seeded: schedule.json replays the run
# (train_model.py --schedule, on a GPU or a CPU).
#
# Environment: DEVICE (default cuda), RECIPE (gpu-large), CORPUS (.corpus),
# SEED (train_model.py's default), SCHEDULE (a schedule.json to replay
# instead of planning), STAGES and INIT_WEIGHTS (the gpu recipe's focus pass),
# DLM_STEPS, DLM_BATCH, DLM_MINUTES, PYTHON (python3), WEIGHTS (1: also bring
# back the weights in bf16; the default for RECIPE=gpu only), SMOKE (1: a 2-layer
# 64-wide model, a few tiny steps; for checking the pipeline on a CPU).
set -euo pipefail
out=${1:?usage: train_on_gpu.sh OUT_DIR [BUDGET_MINUTES]}
budget=${2:-4.5}
device=${DEVICE:-cuda}
recipe=${RECIPE:-gpu-large}
corpus=${CORPUS:-.corpus}
py=${PYTHON:-python3}
smoke=${SMOKE:-0}
work=build/gpu-train
stage=build/gpu-out
t0=$(date +%s)
say() { echo "train_on_gpu [$(( $(date +%s) - t0 ))s]: $*"; }
rm -rf "$work" "$stage"
mkdir -p "$work" "$stage/dlm" "$out"
cp models/train/tok.model models/train/tok.vocab "$work/"
say "$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi; device $device")"

args=(--recipe "$recipe" --device "$device" --workdir "$work" --threads 4)
dlm_args=()
if [ "$recipe" = gpu-large ]; then
  [ -f "$corpus/pack.json" ] || [ -f "$corpus/pack/pack.json" ] || {
    echo "train_on_gpu: no corpus pack in $corpus (tools/gpu_prepare.sh copies it there)" >&2; exit 2; }
  args+=(--corpus "$corpus")
  dlm_args+=(--corpus "$corpus")
fi
plan=(--budget-minutes "$budget")
[ -n "${STAGES:-}" ] && plan+=(--stages "$STAGES")
[ -n "${SCHEDULE:-}" ] && plan=(--schedule "$SCHEDULE")
[ -n "${INIT_WEIGHTS:-}" ] && plan+=(--init-weights "$INIT_WEIGHTS")
[ -n "${SEED:-}" ] && plan+=(--seed "$SEED")
dlm_steps=${DLM_STEPS:-1200}
dlm_batch=${DLM_BATCH:-4}
dlm_minutes=${DLM_MINUTES:-1.5}
if [ "$smoke" = 1 ]; then
  args+=(--smoke --workers 2)
  dlm_steps=3 dlm_batch=1 dlm_minutes=0.5
fi

say "training ($recipe, budget $budget min)"
$py tools/train_model.py "${args[@]}" "${plan[@]}" --max-minutes "$($py -c "print($budget * 1.15)")"
cp "$work/schedule.json" "$stage/"
$py tools/train_model.py --workdir "$work" --export "$stage/target.gguf"
say "distilling the draft"
$py tools/make_dlm.py --target "$stage/target.gguf" --out "$stage/dlm" --workdir "$work" \
    --device "$device" --steps "$dlm_steps" --batch "$dlm_batch" --max-minutes "$dlm_minutes" \
    --skip-report "${dlm_args[@]}" 2>&1 | tee "$stage/dlm.log"
cp "$work/train.log" "$stage/"
if [ "${WEIGHTS:-$([ "$recipe" = gpu ] && echo 1 || echo 0)}" = 1 ]; then
  # the fp32 weights in bf16, for a later pass (INIT_WEIGHTS); the gpu recipe's 14M parameters fit the
  # trip back beside the GGUF, gpu-large's 25.7M do not (51 MB + 27 MB + the draft > 64 MiB)
  $py - "$work/ckpt.pt" "$stage/weights-bf16.pt" <<'PY'
import sys, torch
st = torch.load(sys.argv[1], map_location="cpu", weights_only=False)
torch.save({"model": {k: v.bfloat16() for k, v in st["model"].items()}, "shape": st["shape"],
            "step": st["step"], "seconds": st["seconds"], "plan": st["plan"]}, sys.argv[2])
PY
fi
# the trip back: one tar in 15 MiB parts, flat in OUT_DIR, plus the two small files to read at once
tar -cf - -C "$stage" . | split -b 15M - "$out/artifacts.tar.part-"
cp "$stage/train.log" "$stage/schedule.json" "$out/"
(cd "$out" && sha256sum artifacts.tar.part-* > artifacts.sha256)
n=$(ls "$out" | wc -l)
bytes=$(du -cb "$out"/* | tail -1 | cut -f1)
say "done: $n files, $((bytes / 1048576)) MiB in $out (at most 8 files and 64 MiB come back)"
[ "$n" -le 8 ] && [ "$bytes" -le $((64 * 1048576)) ] || { echo "train_on_gpu: too much to bring back" >&2; exit 3; }
