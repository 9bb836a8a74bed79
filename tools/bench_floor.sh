#!/usr/bin/env bash
# bench_floor.sh — the engine's two performance floors, measured N times
# because a shared VM's bandwidth moves by 2x between runs: decode at depth 0
# (share of measured bandwidth) and at depth 32K (step time / roofline time),
# batch 1, 2 threads.  Prints every run and the median of each figure.
# Usage: tools/bench_floor.sh KVSIEVE MODEL.gguf [RUNS=5] [KV_TYPE=f16|q8]
set -euo pipefail
KS=$1; MODEL=$2; RUNS=${3:-5}; KVT=${4:-f16}
frac0=(); ratio32=()
# the floors depend on the host: say which one (CPU model, the kernels' SIMD level)
cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//')
for i in $(seq 1 "$RUNS"); do
  json=$("$KS" bench -m "$MODEL" --depth 0,32768 --batch 1 -t 2 --n-gen 16 --no-prefill --kv-type "$KVT" --json 2>/dev/null)
  if [ "$i" = 1 ]; then
    simd=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])["simd"])' "$json")
    echo "host: ${cpu:-unknown CPU}, $(nproc) cpus, kernels: $simd, KV $KVT"
  fi
  line=$(/usr/bin/python3 -c '
import json,sys
d=json.loads(sys.argv[1]); r={x["depth"]:x for x in d["results"]}
a,b=r[0],r[32768]
print("%.3f %.3f %.2f %.2f %.2f %.2f %.2f" % (a["frac_bw"], b["ms_per_step"]/b["roofline_ms"], a["bw_gbs"],
      a["gb_s"], a["ms_per_step"], b["gb_s"], b["ms_per_step"]))' "$json")
  read -r f r bw g0 ms0 g32 ms32 <<<"$line"
  printf 'run %d: bandwidth %6.2f GB/s | depth 0: %5.2f GB/s %6.2f ms = %4.1f%% | depth 32K: %5.2f GB/s %6.2f ms = %.2fx roofline\n' \
    "$i" "$bw" "$g0" "$ms0" "$(/usr/bin/python3 -c "print($f*100)")" "$g32" "$ms32" "$r"
  frac0+=("$f"); ratio32+=("$r")
done
/usr/bin/python3 - "${frac0[*]}" "${ratio32[*]}" <<'PY'
import statistics, sys
f=[float(x) for x in sys.argv[1].split()]; r=[float(x) for x in sys.argv[2].split()]
print("median: depth 0 at %.1f%% of measured bandwidth (best %.1f%%); depth 32K at %.2fx roofline (best %.2fx)"
      % (100*statistics.median(f), 100*max(f), statistics.median(r), min(r)))
PY
