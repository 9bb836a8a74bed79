#!/bin/bash
# train_on_gpu.sh — train the bundled target (gpu recipe) and distil its DLM on one GPU.
#
#   bash tools/train_on_gpu.sh OUT_DIR [BUDGET_MINUTES]
#
# What docs/MODEL.md's "gpu recipe" row ran: tools/train_model.py plans its
# stages to fill BUDGET_MINUTES (default 5) on this machine's GPU, trains, and
# exports the GGUF; tools/make_dlm.py distils the EAGLE-3 draft from that GGUF.
# Both are seeded; the plan the run chose is written to OUT_DIR/schedule.json
# (replay: train_model.py --recipe gpu --schedule schedule.json, on a GPU or a
# CPU).  Needs build/train-corpus.json (made by any train_model.py run on a
# machine with the corpus packages: scripts/deps.sh --train) and
# models/train/tok.model.  Measuring (held-out perplexity, the DLM's report,
# kvsieve eval) runs afterwards on the CPU.
#
# Environment: DEVICE (default cuda), DLM_STEPS (1200), DLM_BATCH (4), DLM_MINUTES
# (1.5), SCHEDULE (a schedule.json to replay instead of planning), STAGES
# (full, or focus: a second pass from INIT_WEIGHTS, a weights file an earlier
# run wrote), SEED (train_model.py's default).
set -euo pipefail
out=${1:?usage: train_on_gpu.sh OUT_DIR [BUDGET_MINUTES]}
budget=${2:-5}
device=${DEVICE:-cuda}
py=${PYTHON:-python3}
work=build/gpu-train
rm -rf "$work"
mkdir -p "$work" "$out/dlm"
cp models/train/tok.model models/train/tok.vocab "$work/"
plan=(--budget-minutes "$budget" --stages "${STAGES:-full}")
[ -n "${SCHEDULE:-}" ] && plan=(--schedule "$SCHEDULE")
[ -n "${INIT_WEIGHTS:-}" ] && plan+=(--init-weights "$INIT_WEIGHTS")
[ -n "${SEED:-}" ] && plan+=(--seed "$SEED")
$py tools/train_model.py --recipe gpu --device "$device" --workdir "$work" --threads 4 \
    "${plan[@]}" --max-minutes "$($py -c "print($budget * 1.15)")"
cp "$work/schedule.json" "$out/"
$py tools/train_model.py --workdir "$work" --export "$out/kvsieve-default.gguf"
# the fp32 weights in bf16 (half the size), in parts small enough to copy back
$py - "$work/ckpt.pt" "$out/weights-bf16.pt" <<'PY'
import sys, torch
st = torch.load(sys.argv[1], map_location="cpu", weights_only=False)
torch.save({"model": {k: v.bfloat16() for k, v in st["model"].items()}, "shape": st["shape"],
            "step": st["step"], "seconds": st["seconds"], "plan": st["plan"]}, sys.argv[2])
PY
split -b 15M "$out/weights-bf16.pt" "$out/weights-bf16.pt.part-" && rm "$out/weights-bf16.pt"
$py tools/make_dlm.py --target "$out/kvsieve-default.gguf" --out "$out/dlm" --workdir "$work" \
    --device "$device" --steps "${DLM_STEPS:-1200}" --batch "${DLM_BATCH:-4}" --max-minutes "${DLM_MINUTES:-1.5}" --skip-report
echo "train_on_gpu: done"
