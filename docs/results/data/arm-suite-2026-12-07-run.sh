#!/bin/bash
# s3-run.sh: run each test alone under both emulated CPU modes, shortest native time first; one line per result
cd /work/wt/arm/build-arm64
out=/work/data/arm/s3-results.txt
for t in "$@"; do
  for cpu in cortex-a53 max; do
    case $cpu in max) lv=i8mm;; *) lv=neon;; esac
    s=$(date +%s)
    QEMU_CPU=$cpu KS_EXPECT_SIMD=$lv nice -n 19 ctest -R "^$t\$" --output-on-failure > /work/data/arm/s3-$t-$cpu.log 2>&1
    rc=$?; e=$(date +%s)
    echo "$t $cpu rc=$rc $((e-s))s $(date -u +%H:%M) load=$(cut -d' ' -f1 /proc/loadavg)" >> $out
  done
done
