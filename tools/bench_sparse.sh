#!/usr/bin/env bash
# bench_sparse.sh — sparse decode steps against a dense step at the budget's
# depth (the sparse-speed issue's floors), measured N times because a shared
# VM's bandwidth moves by 10-20% between runs minutes apart: each run is one
# `kvsieve bench` with dense at depth B and every policy at the deeper
# depths side by side, so each ratio comes from one run; the medians of the
# per-run ratios and selection shares are printed at the end.
# Every layer is sparse (--dense-layers 0) and spec's projections are in
# the type SPEC_WEIGHTS names (default auto, spec's own default: see
# docs/POLICIES.md; q8_0 for the rows of docs/BENCHMARKS.md before
# weights=q4_k existed).  Each ratio is also given in CPU time (the
# process's CPU seconds per step, `cpu_ms_per_step`), which a host shared
# with other jobs moves far less than wall time.
# Usage: tools/bench_sparse.sh KVSIEVE MODEL.gguf [RUNS=5] [BATCH=1] [BUDGET=2048] [DEPTHS=16384,32768] [POLICIES=quest,spec,streaming] [EXTRA]
# EXTRA: more `kvsieve bench` arguments, one word each, e.g. "--policy-arg spec.kcache=q8_0".
set -euo pipefail
KS=$1; MODEL=$2; RUNS=${3:-5}; BATCH=${4:-1}; B=${5:-2048}; DEPTHS=${6:-16384,32768}; POL=${7:-quest,spec,streaming}
read -r -a EXTRA <<< "${8:-}"
cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//')
echo "host: ${cpu:-unknown CPU}, $(nproc) cpus; batch $BATCH, budget $B, depths $DEPTHS, $RUNS runs, spec.weights=${SPEC_WEIGHTS:-auto}${8:+, $8}"
all=()
for i in $(seq 1 "$RUNS"); do
  json=$("$KS" bench -m "$MODEL" --depth "$B,$DEPTHS" --batch "$BATCH" -t 2 --n-gen 8 --no-prefill \
         --policy "dense,$POL" --budget "$B" --dense-layers 0 --policy-arg spec.weights="${SPEC_WEIGHTS:-auto}" ${EXTRA[@]+"${EXTRA[@]}"} --json 2>/dev/null)
  line=$(/usr/bin/python3 -c '
import json, sys
d = json.loads(sys.argv[1]); B = int(sys.argv[2])
rows = [r for r in d["results"] if r.get("test") == "decode" and "ms_per_step" in r]
dref = [r for r in rows if r["policy"] == "dense" and r["depth"] == B][0]
ref, cref = dref["ms_per_step"], dref["cpu_ms_per_step"]
out = []
for r in rows:
    if r["depth"] == B or r["policy"] == "dense":
        continue
    out.append("%s@%d=%.3f/%.4f/%.2f/%.3f" % (r["policy"], r["depth"], r["ms_per_step"] / ref, r["select_share"],
                                              r["ms_per_step"], r["cpu_ms_per_step"] / cref))
print("%.2f/%.2f " % (ref, cref) + " ".join(out))' "$json" "$B")
  echo "run $i: dense@$B ${line%% *} ms (wall/cpu) | ${line#* }" | sed 's/=/ /g'
  all+=("${line#* }")
done
/usr/bin/python3 - "${all[@]}" <<'PY'
import statistics, sys
ratio, share, cpu = {}, {}, {}
for run in sys.argv[1:]:
    for item in run.split():
        key, vals = item.split("=")
        r, s, _, c = vals.split("/")
        ratio.setdefault(key, []).append(float(r))
        cpu.setdefault(key, []).append(float(c))
        share.setdefault(key, []).append(float(s))
for key in ratio:
    print("median %-18s %.2fx dense@B (range %.2f-%.2f), selection %.1f%% of the step; in CPU time %.2fx (range %.2f-%.2f)"
          % (key, statistics.median(ratio[key]), min(ratio[key]), max(ratio[key]), 100 * statistics.median(share[key]),
             statistics.median(cpu[key]), min(cpu[key]), max(cpu[key])))
PY
