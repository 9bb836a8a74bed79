#!/bin/bash
# arm-suite-2026-12-08-run.sh: the whole CTest suite (emu_slow included) of one
# cross build under QEMU, once per CPU mode, on one commit.
# Usage: arm-suite-2026-12-08-run.sh BUILD_DIR OUT_PREFIX [cpu ...]   (default: max cortex-a53)
# Writes OUT_PREFIX-<cpu>.log (CTest's output) per mode.  Resume: rerun; a mode
# whose log ends in CTest's summary with no failure is skipped, and a cut-off
# mode reruns only the tests its log does not show as passed.
build=$(cd "$1" && pwd) || exit 1; out=$2; shift 2
cpus=${*:-max cortex-a53}
for cpu in $cpus; do
  case $cpu in max) lv=i8mm;; cortex-a76|neoverse-n1) lv=dotprod;; *) lv=neon;; esac
  log=$out-$cpu.log
  if [ -f "$log" ] && grep -q '100% tests passed' "$log"; then echo "$cpu: done already"; continue; fi
  sel=()
  if [ -f "$log" ]; then
    # The tests still to run: every test minus those this log saw pass.
    passed=$(cat "$log" "$log".*.part 2>/dev/null | grep -Eo 'Test +#[0-9]+: [A-Za-z0-9_]+ \.+ +Passed' | awk '{print $3}' | sort -u)
    all=$(cd "$build" && ctest -N | grep -Eo 'Test +#[0-9]+: [A-Za-z0-9_]+' | awk '{print $3}')
    todo=$(comm -23 <(echo "$all" | sort) <(echo "$passed"))
    [ -z "$todo" ] && { echo "$cpu: every test passed already"; continue; }
    sel=(-R "^($(echo $todo | tr ' ' '|'))\$")
    mv "$log" "$log.$(date +%s).part"
  fi
  echo "== QEMU_CPU=$cpu KS_EXPECT_SIMD=$lv $(git -C "$build/.." rev-parse --short HEAD) start $(date -u +%FT%TZ) host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)" > "$log"
  (cd "$build" && QEMU_CPU=$cpu KS_EXPECT_SIMD=$lv nice -n 10 ctest -j2 --output-on-failure "${sel[@]}") >> "$log" 2>&1
  echo "== rc=$? end $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$log"
done
