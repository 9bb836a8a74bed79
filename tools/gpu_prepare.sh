#!/bin/bash
# gpu_prepare.sh — before a device call: put the corpus pack where the call carries it, check
# that what travels fits, and print the call.
#
#   bash tools/gpu_prepare.sh [PACK_DIR]      (default /work/corpus/pack; run in the checkout the
#                                             session was started in: the one a call sends)
#
# A device call sends the working tree (tracked files, untracked files git does
# not ignore, shared/) and the carried paths, 64 MiB in all (the device
# README).  The pack (tools/build_corpus.py: pack/train-pack.u16.xz and
# pack/pack.json) is copied into .corpus/, which .git/info/exclude ignores, so
# it travels only when the call names it in carry.  When the total is over
# the limit this says so and by how much; the way out is a smaller pack
# (build_corpus.py --pack-only --pack-mib N), or fewer large files in the tree
# (the committed pairs that are not the default: docs/MODEL.md).
set -euo pipefail
src=${1:-/work/corpus/pack}
cd "$(git rev-parse --show-toplevel)"
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.corpus/' "$exclude" 2>/dev/null || echo '/.corpus/' >> "$exclude"
rm -rf .corpus
mkdir .corpus
cp "$src"/pack.json "$src"/train-pack.* .corpus/
sum() { awk '{s += $1} END {print s + 0}'; }
tracked=$(git ls-files -z | xargs -0 -r stat -L -c %s 2>/dev/null | sum)
untracked=$(git ls-files -z --others --exclude-standard | xargs -0 -r stat -L -c %s 2>/dev/null | sum)
shared=0
[ -d shared ] && shared=$(du -sbL shared | cut -f1)
pack=$(stat -c %s .corpus/* | sum)
total=$((tracked + untracked + shared + pack))
limit=$((64 * 1048576))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "travels: tracked $(mib "$tracked"), untracked $(mib "$untracked"), shared/ $(mib "$shared"), pack $(mib "$pack"): $(mib "$total") of 64 MiB"
python3 -c "import json; d = json.load(open('.corpus/pack.json')); print('pack: %d documents, %.1fM characters, %.2fM tokens' % (d['docs'], d['chars'] / 1e6, d['tokens'] / 1e6))"
if [ "$total" -gt "$limit" ]; then
  echo "gpu_prepare: $(mib $((total - limit))) over the limit: remake a smaller pack or take large files out of the tree" >&2
  exit 1
fi
cat <<CALL
the device call (one; about 8 minutes; a rerun fits if it fails early):
  run(command='bash tools/train_on_gpu.sh "\$OUT" 4.5', carry=[".corpus"], timeout_s=560)
then: bash tools/gpu_unpack.sh FILES_AT DEST   (FILES_AT from the call's reply)
CALL
