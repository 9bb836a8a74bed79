#!/bin/bash
# arm-suite-2026-12-07-b-run.sh: the emulated tests arm-suite-2026-12-07.txt did not reach,
# each alone, shortest native time first, under both emulated CPUs unless the argument
# names one ("test_spec:cortex-a53").  Each run holds /work/data/arm/qemu.lock so that no
# other QEMU process (a kernel's own test) overlaps it.
# Usage: arm-suite-2026-12-07-b-run.sh RESULTS_FILE test[:cpu] ...
# Resume: rerun with the tests not yet listed in RESULTS_FILE.
cd "$(dirname "$0")/../../../build-arm64" || exit 1
out=$1; shift
logs=/work/data/arm/suite-b; mkdir -p $logs
for arg in "$@"; do
  t=${arg%%:*}; cpus=max\ cortex-a53
  [ "$t" != "$arg" ] && cpus=${arg#*:}
  for cpu in $cpus; do
    case $cpu in max) lv=i8mm;; *) lv=neon;; esac
    s=$(date +%s)
    QEMU_CPU=$cpu KS_EXPECT_SIMD=$lv flock /work/data/arm/qemu.lock nice -n 19 ctest -R "^$t\$" --output-on-failure > $logs/$t-$cpu.log 2>&1
    rc=$?; e=$(date +%s)
    res=$(grep -Eo '[0-9]+% tests passed, [0-9]+ tests failed out of [0-9]+' $logs/$t-$cpu.log)
    grep -q 'Skipped\|\*\*\*Not Run' $logs/$t-$cpu.log && res="$res, skipped"
    echo "$t $cpu rc=$rc $((e-s))s $(date -u +%H:%M) load=$(cut -d' ' -f1 /proc/loadavg) ($res)" >> $out
  done
done
echo "# done $(date -u +%H:%M)" >> $out
