#!/bin/bash
F=$1; shift
echo "# $(date -u +%FT%TZ) host: $(lscpu | grep 'Model name' | sed 's/  */ /g') load: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in 1 2; do
for b in kvsieve-bench kvsieve-fast; do
  echo "\$ $b bench -m $F -t 2 $*   # load: $(cut -d' ' -f1-3 /proc/loadavg)"
  /work/data/moe-h/$b bench -m $F -t 2 "$@" 2>&1 | grep -E "^dense|^prefill"
done; done
echo "# $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)"
