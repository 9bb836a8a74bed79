#!/bin/bash
# gpu_unpack.sh — after a device call of tools/train_on_gpu.sh: check and join the parts it
# brought back and unpack them.
#
#   bash tools/gpu_unpack.sh FILES_AT DEST
#
# DEST gets target.gguf, dlm/ (config.json, model.safetensors), schedule.json,
# train.log and dlm.log; docs/MODEL.md says what to measure on them.
set -euo pipefail
from=${1:?usage: gpu_unpack.sh FILES_AT DEST}
dest=${2:?usage: gpu_unpack.sh FILES_AT DEST}
mkdir -p "$dest"
(cd "$from" && sha256sum -c --quiet artifacts.sha256)
cat "$from"/artifacts.tar.part-* | tar -xf - -C "$dest"
ls -la "$dest" "$dest/dlm"
